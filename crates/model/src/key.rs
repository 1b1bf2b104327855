//! Identities: which Service, which port, which protocol, which IP family.

use std::fmt;

use serde::Serialize;

/// An IP family. kube-proxy runs one proxier per family; kpng keeps every Service port once per
/// family so that backends can program `ip` and `ip6` tables independently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Family {
    /// IPv4.
    #[serde(rename = "IPv4")]
    V4,
    /// IPv6.
    #[serde(rename = "IPv6")]
    V6,
}

impl Family {
    /// Both families, IPv4 first (the order used in every output).
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    /// The family of an address.
    pub fn of(ip: &std::net::IpAddr) -> Family {
        if ip.is_ipv4() { Family::V4 } else { Family::V6 }
    }

    /// The label kube-proxy uses in metrics and health bodies (`IPv4` / `IPv6`).
    pub fn label(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// A layer-4 protocol a Service port can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Protocol {
    /// TCP (the Kubernetes default).
    #[serde(rename = "TCP")]
    Tcp,
    /// UDP: also needs conntrack clean-up when endpoints go away.
    #[serde(rename = "UDP")]
    Udp,
    /// SCTP.
    #[serde(rename = "SCTP")]
    Sctp,
}

impl Protocol {
    /// Parses the Kubernetes spelling (`TCP`, `UDP`, `SCTP`); `None` when unknown.
    pub fn parse(s: &str) -> Option<Protocol> {
        match s {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }

    /// The lower-case spelling used by nftables and iptables (`tcp`, `udp`, `sctp`).
    pub fn lower(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Service's identity: namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ServiceKey {
    /// The Service's namespace.
    pub namespace: Name,
    /// The Service's name.
    pub name: Name,
}

/// A shared, immutable name. Keys are cloned into every index, diff and backend map; sharing
/// the text makes a clone a reference-count increment instead of an allocation (at 30k
/// Services that is tens of MB).
pub type Name = std::sync::Arc<str>;

impl ServiceKey {
    /// Builds a key from its parts.
    pub fn new(namespace: impl Into<Name>, name: impl Into<Name>) -> Self {
        ServiceKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A Service port in one IP family: the unit every backend programs.
///
/// Ordered by Service first, so all ports of one Service are adjacent in a `BTreeMap`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct PortKey {
    /// The Service this port belongs to.
    pub service: ServiceKey,
    /// The port's name (`""` for the single unnamed port). Endpoints match by this name.
    pub port_name: Name,
    /// The port's protocol; TCP and UDP on the same number are different ports.
    pub protocol: Protocol,
    /// The IP family this entry programs.
    pub family: Family,
}

impl fmt::Display for PortKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}/{} ({})",
            self.service, self.port_name, self.protocol, self.family
        )
    }
}
