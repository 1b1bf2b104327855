//! Node and proxy settings every node-programming backend shares.
//!
//! kube-proxy's `--nodeport-addresses`, `--masquerade-all`/`--masquerade-bit` and
//! `--detect-local-mode` mean the same thing whichever backend implements them, so they are
//! parsed once (in the binary) into these types and each backend only decides how to express
//! them in its data plane.

use std::net::IpAddr;

use ipnet::IpNet;
use kpng_model::{Family, NodeState};

/// Where node ports are served (`--nodeport-addresses`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodePortAddresses {
    /// Every local address (iptables mode's default when the flag is unset).
    AllLocal,
    /// The node's primary IPs, from the Node object or `--node-ip` (nftables mode's default,
    /// and `--nodeport-addresses primary`).
    Primary,
    /// Every local address inside these CIDRs. A family none of them belongs to, or one of
    /// whose CIDRs is the whole family (`0.0.0.0/0`, `::/0`), is served on all its local
    /// addresses, as upstream does.
    Cidrs(Vec<IpNet>),
}

/// Where node ports are served in one family, once the "no CIDR of this family" rule applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodePortScope {
    /// Every local address of the family.
    AllLocal,
    /// The node's primary IPs of the family.
    Primary,
    /// Local addresses of the family inside these CIDRs (never empty).
    Cidrs(Vec<IpNet>),
}

impl NodePortAddresses {
    /// The scope for one family: a CIDR list without a CIDR of `family`, or with the whole
    /// family among them, means every local address of that family (upstream's rule and its
    /// `MatchAll`), so backends need not repeat it, and can match "a local address" in the
    /// kernel (`fib daddr type local`, `addrtype LOCAL`) rather than list the addresses: an
    /// address added to the node then serves node ports at once, not at the next sync.
    pub fn scope(&self, family: Family) -> NodePortScope {
        match self {
            NodePortAddresses::AllLocal => NodePortScope::AllLocal,
            NodePortAddresses::Primary => NodePortScope::Primary,
            NodePortAddresses::Cidrs(all) => {
                let mine: Vec<IpNet> = all
                    .iter()
                    .filter(|c| Family::of(&c.addr()) == family)
                    .copied()
                    .collect();
                if mine.is_empty() || mine.iter().any(|c| c.prefix_len() == 0) {
                    NodePortScope::AllLocal
                } else {
                    NodePortScope::Cidrs(mine)
                }
            }
        }
    }

    /// The scope for one family on `node`: [`NodePortAddresses::scope`], except that
    /// `primary` is every local address of the family when the node has no IP of it: once
    /// the wait for node IPs gave up with none at all
    /// ([`NodeState::nodeports_on_all_local`]), or when the node has IPs of the other family
    /// only (a dual-stack cluster whose Node lists one family). kube-proxy resolves `primary`
    /// to a CIDR per family it has a node IP of, and a family without a CIDR matches all of
    /// its addresses (`NewNodePortAddresses`).
    pub fn scope_on(&self, family: Family, node: &NodeState) -> NodePortScope {
        let lacks_family =
            !node.ips.is_empty() && !node.ips.iter().any(|ip| Family::of(ip) == family);
        match self.scope(family) {
            NodePortScope::Primary if node.nodeports_on_all_local || lacks_family => {
                NodePortScope::AllLocal
            }
            scope => scope,
        }
    }
}

impl NodePortScope {
    /// Whether node ports on 127.0.0.1 (iptables mode's `--iptables-localhost-nodeports`,
    /// with `route_localnet`) apply in this IPv4 scope: every local address, or a CIDR that
    /// holds 127.0.0.1. As in kube-proxy, which serves them only where node ports are on
    /// loopback at all (never with `primary`). One rule for the backend that programs them
    /// and for `kpng status`, which says where node ports are.
    pub fn takes_ipv4_localhost(&self) -> bool {
        let loopback: IpAddr = std::net::Ipv4Addr::LOCALHOST.into();
        match self {
            NodePortScope::AllLocal => true,
            NodePortScope::Primary => false,
            NodePortScope::Cidrs(cidrs) => cidrs.iter().any(|c| c.contains(&loopback)),
        }
    }

    /// The addresses of `family` this scope selects, from the node's primary IPs and its
    /// interface addresses (`local_addresses` is only called when needed: it reads the
    /// kernel). Sorted, without duplicates; loopback is the caller's decision.
    pub fn addresses(
        &self,
        family: Family,
        node_ips: &[IpAddr],
        local_addresses: impl FnOnce() -> Vec<IpAddr>,
    ) -> Vec<IpAddr> {
        let of_family = |ip: &IpAddr| Family::of(ip) == family;
        let mut ips: Vec<IpAddr> = match self {
            NodePortScope::Primary => node_ips.iter().copied().filter(of_family).collect(),
            NodePortScope::AllLocal => local_addresses().into_iter().filter(of_family).collect(),
            NodePortScope::Cidrs(cidrs) => local_addresses()
                .into_iter()
                .filter(|ip| of_family(ip) && cidrs.iter().any(|c| c.contains(ip)))
                .collect(),
        };
        ips.sort();
        ips.dedup();
        ips
    }
}

/// Source NAT of proxied traffic (`--masquerade-all`, `--masquerade-bit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Masquerade {
    /// `--masquerade-all`: masquerade every proxied connection, not only the ones that need it.
    pub all: bool,
    /// `--masquerade-bit`: the packet-mark bit that flags a connection for masquerading
    /// (kube-proxy's 14, mark `0x4000`).
    pub bit: u8,
}

impl Default for Masquerade {
    fn default() -> Self {
        Masquerade {
            all: false,
            bit: 14,
        }
    }
}

impl Masquerade {
    /// The packet mark the bit stands for (`1 << bit`; bit 14 → `0x4000`).
    pub fn mark(self) -> u32 {
        1u32 << (self.bit.min(31))
    }
}

/// How kpng tells pod traffic from other traffic (`--detect-local-mode`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DetectLocal {
    /// No detection: every source counts as "not a pod".
    None,
    /// Sources inside the cluster's pod CIDRs (`--cluster-cidr`).
    ClusterCidr(Vec<IpNet>),
    /// Sources inside this node's pod CIDRs (from the Node object).
    NodeCidr,
    /// Traffic entering from this bridge (`--pod-bridge-interface`).
    BridgeInterface(String),
    /// Traffic entering from interfaces with this prefix (`--pod-interface-name-prefix`).
    InterfaceNamePrefix(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn a_family_without_a_cidr_or_with_its_whole_range_is_served_on_all_local_addresses() {
        let cidrs = |list: &[&str]| {
            NodePortAddresses::Cidrs(list.iter().map(|c| c.parse().expect("cidr")).collect())
        };
        let table = [
            ("no IPv6 CIDR", cidrs(&["10.0.0.0/8"]), Family::V6, true),
            ("an IPv4 CIDR", cidrs(&["10.0.0.0/8"]), Family::V4, false),
            ("0.0.0.0/0", cidrs(&["0.0.0.0/0"]), Family::V4, true),
            (
                "0.0.0.0/0 beside a narrower one",
                cidrs(&["10.0.0.0/8", "0.0.0.0/0"]),
                Family::V4,
                true,
            ),
            ("::/0", cidrs(&["0.0.0.0/0", "::/0"]), Family::V6, true),
            (
                "::/0 is not IPv4's",
                cidrs(&["::/0", "10.0.0.0/8"]),
                Family::V4,
                false,
            ),
        ];
        for (what, setting, family, all) in table {
            let scope = setting.scope(family);
            assert_eq!(scope == NodePortScope::AllLocal, all, "{what}: {scope:?}");
        }
    }

    #[test]
    fn scopes_select_their_addresses() {
        let local = || {
            vec![
                ip("10.1.2.3"),
                ip("192.168.1.1"),
                ip("fd00::1"),
                ip("10.1.2.3"),
            ]
        };
        let node = [ip("192.168.1.1"), ip("fd00::9")];
        let table = [
            (NodePortScope::Primary, Family::V4, vec![ip("192.168.1.1")]),
            (NodePortScope::Primary, Family::V6, vec![ip("fd00::9")]),
            (
                NodePortScope::AllLocal,
                Family::V4,
                vec![ip("10.1.2.3"), ip("192.168.1.1")],
            ),
            (
                NodePortScope::Cidrs(vec!["10.0.0.0/8".parse().expect("cidr")]),
                Family::V4,
                vec![ip("10.1.2.3")],
            ),
        ];
        for (scope, family, want) in table {
            assert_eq!(
                scope.addresses(family, &node, local),
                want,
                "{scope:?} {family:?}"
            );
        }
    }

    #[test]
    fn primary_is_every_local_address_of_a_family_the_node_has_no_ip_of() {
        let node = |ips: &[&str], all_local: bool| NodeState {
            ips: ips.iter().map(|s| ip(s)).collect(),
            nodeports_on_all_local: all_local,
            ..NodeState::default()
        };
        let table = [
            (
                "both families",
                node(&["10.0.0.1", "fd00::1"], false),
                Family::V6,
                NodePortScope::Primary,
            ),
            (
                "IPv4 only: IPv4",
                node(&["10.0.0.1"], false),
                Family::V4,
                NodePortScope::Primary,
            ),
            (
                "IPv4 only: IPv6",
                node(&["10.0.0.1"], false),
                Family::V6,
                NodePortScope::AllLocal,
            ),
            (
                "none yet (waiting)",
                node(&[], false),
                Family::V4,
                NodePortScope::Primary,
            ),
            (
                "none after the wait",
                node(&[], true),
                Family::V4,
                NodePortScope::AllLocal,
            ),
        ];
        for (what, n, family, want) in table {
            assert_eq!(
                NodePortAddresses::Primary.scope_on(family, &n),
                want,
                "{what}"
            );
        }
    }

    #[test]
    fn masquerade_bit_is_a_mark() {
        assert_eq!(Masquerade::default().mark(), 0x4000);
    }
}
