//! Which node a client certificate speaks for (mTLS brains).
//!
//! Why: with mTLS every node holds a certificate the brain trusts, and without this check any
//! of them could watch as any other node (and read what only that node should see). A node may
//! watch the name its certificate names: the subject's CN, bare or as kubelet's
//! `system:node:<name>`, or a DNS subject alternative name.

use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// The node names a DER certificate allows; empty when it cannot be parsed.
pub fn node_names(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = X509Certificate::from_der(der) else {
        return Vec::new();
    };
    let mut names = Vec::new();
    for cn in cert.subject().iter_common_name() {
        if let Ok(cn) = cn.as_str() {
            names.push(cn.strip_prefix("system:node:").unwrap_or(cn).to_string());
        }
    }
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let GeneralName::DNSName(dns) = name {
                names.push((*dns).to_string());
            }
        }
    }
    names
}

/// Whether a client whose certificate allows `allowed` may watch as `node`.
pub fn may_watch(allowed: &[String], node: &str) -> bool {
    allowed.iter().any(|a| a == node)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(cn: &str, sans: &[&str]) -> Vec<u8> {
        let mut params =
            rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().expect("key");
        params.self_signed(&key).expect("cert").der().to_vec()
    }

    #[test]
    fn names_from_cn_kubelet_cn_and_dns_sans() {
        let cases: &[(&str, &str, &[&str], &[&str])] = &[
            ("plain CN", "node1", &[], &["node1"]),
            ("kubelet CN", "system:node:node2", &[], &["node2"]),
            (
                "SANs too",
                "kpng",
                &["node3", "node3.example"],
                &["kpng", "node3", "node3.example"],
            ),
        ];
        for (name, cn, sans, want) in cases {
            assert_eq!(node_names(&cert(cn, sans)), *want, "{name}");
        }
        assert!(node_names(b"not a certificate").is_empty());
    }

    #[test]
    fn a_node_may_watch_only_its_names() {
        let allowed = vec!["node1".to_string()];
        assert!(may_watch(&allowed, "node1"));
        assert!(!may_watch(&allowed, "node2"));
        assert!(!may_watch(&[], "node1"));
    }
}
