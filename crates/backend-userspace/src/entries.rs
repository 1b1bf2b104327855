//! What the capture mechanism must do, as a flat list of keyed entries: "send TCP to VIP:80 to
//! listener port 41234", "refuse UDP to VIP:53", "only these sources may reach this LB IP".
//!
//! The vocabulary is portable (no nftables in it): Linux renders it as set and map elements
//! (see `capture::nft`), another OS would render it as its own redirect rules. Every entry is a
//! pure function of one Service port and its listener ports, or of the node configuration.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
pub use kpng_backend::settings::NodePortAddresses;
use kpng_backend::settings::NodePortScope;
use kpng_model::{Family, NodeState, Protocol, ServicePort};

/// What an entry is about. Each key holds at most one [`Action`] at a time.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EntryKey {
    /// Traffic to a Service VIP (ClusterIP, external IP or load-balancer IP) and port.
    Vip {
        /// The VIP.
        ip: IpAddr,
        /// The L4 protocol.
        protocol: Protocol,
        /// The Service port.
        port: u16,
    },
    /// Traffic to a node port on the node's NodePort addresses of one family.
    NodePort {
        /// The family of the addresses.
        family: Family,
        /// The L4 protocol.
        protocol: Protocol,
        /// The node port.
        port: u16,
    },
    /// Traffic to an external VIP (external IP, load-balancer IP) of an externalTrafficPolicy
    /// Local port, from this node or one of its pods.
    VipShortCircuit {
        /// The VIP.
        ip: IpAddr,
        /// The L4 protocol.
        protocol: Protocol,
        /// The Service port.
        port: u16,
    },
    /// Traffic to the node port of an externalTrafficPolicy Local port, from this node or one
    /// of its pods.
    NodePortShortCircuit {
        /// The family of the addresses.
        family: Family,
        /// The L4 protocol.
        protocol: Protocol,
        /// The node port.
        port: u16,
    },
    /// A ClusterIP: traffic to it on a port no Service port uses is refused.
    ClusterIp(IpAddr),
    /// A load-balancer IP and port with `loadBalancerSourceRanges`: other sources are dropped.
    FirewallVip {
        /// The load-balancer IP.
        ip: IpAddr,
        /// The L4 protocol.
        protocol: Protocol,
        /// The Service port.
        port: u16,
    },
    /// One allowed source range of a [`EntryKey::FirewallVip`].
    FirewallAllow {
        /// The load-balancer IP.
        ip: IpAddr,
        /// The L4 protocol.
        protocol: Protocol,
        /// The Service port.
        port: u16,
        /// The allowed sources.
        source: IpNet,
    },
    /// A proxy listener: reachable only through the capture, never directly.
    Listener {
        /// The listener's family.
        family: Family,
        /// Its protocol.
        protocol: Protocol,
        /// Its port.
        port: u16,
    },
    /// Node addresses (or networks) that accept node-port traffic.
    NodePortAddresses(IpNet),
    /// A Service CIDR: traffic to an unallocated IP in it is dropped.
    ServiceCidr(IpNet),
    /// Pod addresses (`--detect-local-mode ClusterCIDR` or `NodeCIDR`): their traffic to an
    /// externalTrafficPolicy Local port is short-circuited.
    PodCidr(IpNet),
}

impl EntryKey {
    /// The family the entry belongs to.
    pub fn family(&self) -> Family {
        match self {
            EntryKey::Vip { ip, .. }
            | EntryKey::VipShortCircuit { ip, .. }
            | EntryKey::ClusterIp(ip)
            | EntryKey::FirewallVip { ip, .. }
            | EntryKey::FirewallAllow { ip, .. } => Family::of(ip),
            EntryKey::NodePort { family, .. }
            | EntryKey::NodePortShortCircuit { family, .. }
            | EntryKey::Listener { family, .. } => *family,
            EntryKey::NodePortAddresses(net)
            | EntryKey::ServiceCidr(net)
            | EntryKey::PodCidr(net) => Family::of(&net.addr()),
        }
    }
}

/// What to do with traffic that matches a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    /// Hand it to the proxy listener on this port (same family, same protocol).
    Redirect(u16),
    /// Refuse it: TCP reset, ICMP port unreachable (no endpoints at all).
    Refuse,
    /// Drop it silently (endpoints exist, but none this traffic may use).
    Drop,
    /// The key is a member of its set (firewall, listener and address keys carry no action).
    Member,
}

/// One capture entry.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Entry {
    /// What it matches.
    pub key: EntryKey,
    /// What it does.
    pub action: Action,
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} → {:?}", self.key, self.action)
    }
}

fn member(key: EntryKey) -> Entry {
    Entry {
        key,
        action: Action::Member,
    }
}

/// The listener ports of one Service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerPorts {
    /// The ClusterIP's listener.
    pub internal: u16,
    /// The listener of the node port, external IPs and load-balancer IPs (when the port has
    /// any of them).
    pub external: Option<u16>,
    /// The listener for this node's and its pods' traffic to those addresses, when
    /// externalTrafficPolicy is Local (they may use every endpoint).
    pub short_circuit: Option<u16>,
}

/// Every entry of one Service port, given its listeners. `node_ips` are the node's own
/// addresses: when a source range contains one, the load-balancer IPs themselves may connect
/// (hairpin through the LB), as kube-proxy allows.
pub fn port_entries(sp: &ServicePort, listeners: ListenerPorts, node_ips: &[IpAddr]) -> Vec<Entry> {
    let (protocol, port) = (sp.key.protocol, sp.port);
    let vip = |ip: IpAddr| EntryKey::Vip { ip, protocol, port };
    let unserved = if sp.has_any_endpoints {
        Action::Drop
    } else {
        Action::Refuse
    };
    let family = sp.key.family;
    let mut out = vec![member(EntryKey::ClusterIp(sp.cluster_ip))];

    let internal = if !sp.internal_endpoints().is_empty() {
        Action::Redirect(listeners.internal)
    } else if sp.internal_policy_local {
        unserved
    } else {
        Action::Refuse
    };
    out.push(Entry {
        key: vip(sp.cluster_ip),
        action: internal,
    });
    out.push(member(EntryKey::Listener {
        family,
        protocol,
        port: listeners.internal,
    }));

    if let Some(external_port) = listeners.external {
        let external = if sp.external_endpoints().is_empty() {
            unserved
        } else {
            Action::Redirect(external_port)
        };
        for ip in sp.external_ips.iter().chain(&sp.load_balancer_ips) {
            out.push(Entry {
                key: vip(*ip),
                action: external,
            });
        }
        if let Some(node_port) = sp.node_port {
            out.push(Entry {
                key: EntryKey::NodePort {
                    family,
                    protocol,
                    port: node_port,
                },
                action: external,
            });
        }
        out.push(member(EntryKey::Listener {
            family,
            protocol,
            port: external_port,
        }));
    }

    // externalTrafficPolicy Local: this node and its pods reach every endpoint, whether or
    // not any is local (kube-proxy's short-circuit).
    if let Some(short_circuit) = listeners.short_circuit
        && sp.external_policy_local
        && !sp.cluster_endpoints.is_empty()
    {
        let action = Action::Redirect(short_circuit);
        for ip in sp.external_ips.iter().chain(&sp.load_balancer_ips) {
            out.push(Entry {
                key: EntryKey::VipShortCircuit {
                    ip: *ip,
                    protocol,
                    port,
                },
                action,
            });
        }
        if let Some(node_port) = sp.node_port {
            out.push(Entry {
                key: EntryKey::NodePortShortCircuit {
                    family,
                    protocol,
                    port: node_port,
                },
                action,
            });
        }
        out.push(member(EntryKey::Listener {
            family,
            protocol,
            port: short_circuit,
        }));
    }

    // Disjoint prefixes (the model's one normalisation): `firewall-allow` is an interval set,
    // which refuses overlapping elements.
    if !sp.source_ranges.is_empty() {
        let allowed = sp.load_balancer_allowed_sources(node_ips);
        for lb in &sp.load_balancer_ips {
            let ip = *lb;
            out.push(member(EntryKey::FirewallVip { ip, protocol, port }));
            for source in allowed.iter().copied() {
                out.push(member(EntryKey::FirewallAllow {
                    ip,
                    protocol,
                    port,
                    source,
                }));
            }
        }
    }
    out
}

/// The node-level entries: where node ports are served (loopback never is, as in nftables
/// mode), the Service CIDRs and the pod CIDRs whose traffic is short-circuited.
pub fn node_entries(
    nodeport_addresses: &NodePortAddresses,
    node: &NodeState,
    service_cidrs: &[IpNet],
    pod_cidrs: &[IpNet],
    families: &[Family],
) -> Vec<Entry> {
    // The capture matches local destinations only, never loopback, so "every local address
    // of the family" is the family's whole range.
    let mut nets: Vec<IpNet> = Vec::new();
    for family in families {
        // `primary` for a family the node has no IP of (or none at all after the wait) is
        // every local address of it, as in the other backends.
        match nodeport_addresses.scope_on(*family, node) {
            NodePortScope::AllLocal => nets.push(match family {
                Family::V4 => IpNet::V4(ipnet::Ipv4Net::default()),
                Family::V6 => IpNet::V6(ipnet::Ipv6Net::default()),
            }),
            NodePortScope::Primary => nets.extend(
                node.ips
                    .iter()
                    .filter(|ip| !ip.is_loopback() && Family::of(ip) == *family)
                    .map(|ip| IpNet::from(*ip)),
            ),
            NodePortScope::Cidrs(cidrs) => nets.extend(IpNet::aggregate(&cidrs)),
        }
    }
    // Aggregated as the other interval sets: `nodeport-addresses` refuses overlapping
    // elements (a node listing one address twice, or inside a CIDR also listed).
    let mut out: Vec<Entry> = IpNet::aggregate(&nets)
        .into_iter()
        .map(|n| member(EntryKey::NodePortAddresses(n)))
        .collect();
    out.extend(
        IpNet::aggregate(&service_cidrs.to_vec())
            .into_iter()
            .map(|n| member(EntryKey::ServiceCidr(n))),
    );
    out.extend(
        IpNet::aggregate(&pod_cidrs.to_vec())
            .into_iter()
            .map(|n| member(EntryKey::PodCidr(n))),
    );
    out.retain(|e| families.contains(&e.key.family()));
    out
}

#[cfg(test)]
mod tests;
