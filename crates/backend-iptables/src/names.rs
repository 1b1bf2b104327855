//! kube-proxy's iptables chain names: `KUBE-SVC-` and friends plus 16 base32 characters of a
//! SHA-256, so that an admin (or a kube-proxy started after kpng) finds the same chains.

use kpng_model::{Endpoint, PortKey};
use sha2::{Digest, Sha256};

/// Cluster-policy chain of a Service port (random choice among cluster endpoints).
pub const SVC_PREFIX: &str = "KUBE-SVC-";
/// Local-policy chain of a Service port (random choice among local endpoints).
pub const SVL_PREFIX: &str = "KUBE-SVL-";
/// External-destination chain (masquerade, short-circuits, then the policy chain).
pub const EXT_PREFIX: &str = "KUBE-EXT-";
/// Load-balancer source-range chain.
pub const FW_PREFIX: &str = "KUBE-FW-";
/// Per-endpoint chain (hairpin masquerade, affinity update, DNAT).
pub const SEP_PREFIX: &str = "KUBE-SEP-";

/// Whether a chain is one of the per-Service chains (ours to delete when unused).
pub fn is_service_chain(chain: &str) -> bool {
    [SVC_PREFIX, SVL_PREFIX, EXT_PREFIX, FW_PREFIX, SEP_PREFIX]
        .iter()
        .any(|p| chain.starts_with(p))
}

/// kube-proxy's `ServicePortName.String()`: `ns/name:port`, or `ns/name` for an unnamed port.
pub fn service_port_name(key: &PortKey) -> String {
    if key.port_name.is_empty() {
        format!("{}/{}", key.service.namespace, key.service.name)
    } else {
        format!(
            "{}/{}:{}",
            key.service.namespace, key.service.name, key.port_name
        )
    }
}

/// The chains of one Service port: `KUBE-SVC-`, `KUBE-SVL-`, `KUBE-EXT-`, `KUBE-FW-` with the
/// same hash of name and protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortChains {
    /// `KUBE-SVC-…`.
    pub cluster: String,
    /// `KUBE-SVL-…`.
    pub local: String,
    /// `KUBE-EXT-…`.
    pub external: String,
    /// `KUBE-FW-…`.
    pub firewall: String,
}

impl PortChains {
    /// The chain names of the port `name` (see [`service_port_name`]) with protocol `proto`
    /// (lower case).
    pub fn new(name: &str, proto: &str) -> PortChains {
        let hash = hash16(&[name, proto]);
        PortChains {
            cluster: format!("{SVC_PREFIX}{hash}"),
            local: format!("{SVL_PREFIX}{hash}"),
            external: format!("{EXT_PREFIX}{hash}"),
            firewall: format!("{FW_PREFIX}{hash}"),
        }
    }
}

/// `KUBE-SEP-…` of endpoint `ep` of the port `name` with protocol `proto`. The endpoint is
/// hashed as `IP:port` (`[IPv6]:port`).
pub fn endpoint_chain(name: &str, proto: &str, ep: &Endpoint) -> String {
    format!(
        "{SEP_PREFIX}{}",
        hash16(&[name, proto, &ep.addr().to_string()])
    )
}

/// The first 16 characters of the standard base32 encoding of SHA-256(parts concatenated).
fn hash16(parts: &[&str]) -> String {
    let mut sha = Sha256::new();
    for p in parts {
        sha.update(p.as_bytes());
    }
    let digest = sha.finalize();
    base32_prefix(&digest[..10])
}

/// RFC 4648 base32 (upper case) of whole 5-byte groups: 10 bytes give 16 characters.
fn base32_prefix(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::with_capacity(bytes.len() * 8 / 5);
    for group in bytes.chunks_exact(5) {
        let bits = group.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
        for i in (0..8).rev() {
            let index = ((bits >> (i * 5)) & 0x1f) as usize;
            out.push(char::from(ALPHABET[index]));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpng_model::{Family, Protocol, ServiceKey};

    fn key(ns: &str, name: &str, port: &str) -> PortKey {
        PortKey {
            service: ServiceKey::new(ns, name),
            port_name: port.into(),
            protocol: Protocol::Tcp,
            family: Family::V4,
        }
    }

    fn ep(addr: &str) -> Endpoint {
        let sa: std::net::SocketAddr = addr.parse().expect("socket address");
        Endpoint {
            ip: sa.ip(),
            port: sa.port(),
            is_local: false,
            ready: true,
            serving: true,
            terminating: false,
        }
    }

    /// Names pinned by upstream's `pkg/proxy/iptables/proxier_test.go`.
    #[test]
    fn names_match_kube_proxy() {
        for (ns, svc, port, want) in [
            ("ns1", "svc1", "p80", "KUBE-SVC-XPGD46QRK7WJZT7O"),
            ("ns2", "svc2", "p80", "KUBE-SVC-GNZBNJ2PO5MGZ6GT"),
            ("ns3", "svc3", "p80", "KUBE-SVC-X27LE4BHSL4DOUIK"),
        ] {
            let name = service_port_name(&key(ns, svc, port));
            assert_eq!(PortChains::new(&name, "tcp").cluster, want, "{name}");
        }
        let c = PortChains::new("ns2/svc2:p80", "tcp");
        assert_eq!(c.local, "KUBE-SVL-GNZBNJ2PO5MGZ6GT");
        assert_eq!(c.external, "KUBE-EXT-GNZBNJ2PO5MGZ6GT");
        assert_eq!(c.firewall, "KUBE-FW-GNZBNJ2PO5MGZ6GT");
        for (name, addr, want) in [
            ("ns1/svc1:p80", "10.180.0.1:80", "KUBE-SEP-SXIVWICOYRO3J4NJ"),
            ("ns3/svc3:p80", "10.180.0.3:80", "KUBE-SEP-OYPFS5VJICHGATKP"),
        ] {
            assert_eq!(endpoint_chain(name, "tcp", &ep(addr)), want);
        }
    }

    #[test]
    fn unnamed_port_has_no_colon() {
        assert_eq!(service_port_name(&key("default", "web", "")), "default/web");
        assert_eq!(
            service_port_name(&key("default", "web", "http")),
            "default/web:http"
        );
    }

    #[test]
    fn base32_of_known_bytes() {
        // RFC 4648 test vector: "fooba" → "MZXW6YTB".
        assert_eq!(base32_prefix(b"fooba"), "MZXW6YTB");
        assert_eq!(base32_prefix(&[0; 10]), "AAAAAAAAAAAAAAAA");
    }

    #[test]
    fn service_chain_prefixes() {
        for (chain, ours) in [
            ("KUBE-SVC-XPGD46QRK7WJZT7O", true),
            ("KUBE-SEP-SXIVWICOYRO3J4NJ", true),
            ("KUBE-FW-GNZBNJ2PO5MGZ6GT", true),
            ("KUBE-SERVICES", false),
            ("KUBE-MARK-MASQ", false),
            ("DOCKER", false),
        ] {
            assert_eq!(is_service_chain(chain), ours, "{chain}");
        }
    }
}
