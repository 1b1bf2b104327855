//! Which node a client certificate speaks for (mTLS brains).
//!
//! Why: with mTLS every node holds a certificate the brain trusts, and without this check any
//! of them could watch as any other node (and read what only that node should see). A node may
//! watch the name its certificate names: the subject's CN, bare or as kubelet's
//! `system:node:<name>`, or a DNS subject alternative name.

use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// The node names a DER certificate allows, each once (a certificate usually repeats its CN
/// as a DNS SAN, and the brain's log said `["n1", "n1"]`); empty when it cannot be parsed.
pub fn node_names(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = X509Certificate::from_der(der) else {
        return Vec::new();
    };
    let mut names: Vec<String> = Vec::new();
    let mut add = |name: &str| {
        if !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
    };
    for cn in cert.subject().iter_common_name() {
        if let Ok(cn) = cn.as_str() {
            add(cn.strip_prefix("system:node:").unwrap_or(cn));
        }
    }
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let GeneralName::DNSName(dns) = name {
                add(dns);
            }
        }
    }
    names
}

/// What a Kubernetes Node's name is, as the brain's refusal names it.
pub const NODE_NAME_RULE: &str = "a Kubernetes Node's name: a DNS-1123 subdomain of at most 253 \
     characters, dot-separated labels of lower-case letters, digits and '-' (at most 63 each, \
     starting and ending with a letter or digit)";

/// Whether `name` can be a Kubernetes Node's name (an RFC 1123 subdomain, at most 253 bytes).
///
/// Why: anything else can never match a Node, so a node that watches with it would miss its
/// local endpoints in silence; and a brain that took any bytes as a node's name would keep up
/// to a request's size per watcher and write control characters raw into its status and log.
/// The kpng client refuses such a name at start-up, and the brain refuses a Watch naming one.
pub fn is_node_name(name: &str) -> bool {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    name.len() <= 253 && name.split('.').all(label_ok)
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
            ("CN repeated as a SAN", "n1", &["n1"], &["n1"]),
            (
                "kubelet CN and its name as a SAN",
                "system:node:n2",
                &["n2", "n2.example"],
                &["n2", "n2.example"],
            ),
        ];
        for (name, cn, sans, want) in cases {
            assert_eq!(node_names(&cert(cn, sans)), *want, "{name}");
        }
        assert!(node_names(b"not a certificate").is_empty());
    }

    #[test]
    fn node_names_are_dns_1123_subdomains() {
        let long_label = "a".repeat(64);
        // 253 bytes, the longest; one more is too long.
        let longest = [
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(61),
        ]
        .join(".");
        let too_long = format!("{longest}d");
        for ok in ["n1", "node-1.example", "a", &longest] {
            assert!(is_node_name(ok), "{ok:?}");
        }
        for bad in [
            "",
            "Node1",
            "node_1",
            "-node",
            "node-",
            "node..1",
            "node\x1b[31m",
            "node\nforged",
            &long_label,
            &too_long,
        ] {
            assert!(!is_node_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_node_may_watch_only_its_names() {
        let allowed = vec!["node1".to_string()];
        assert!(may_watch(&allowed, "node1"));
        assert!(!may_watch(&allowed, "node2"));
        assert!(!may_watch(&[], "node1"));
    }
}
