//! The rules that do not belong to any Service: the top-level chains, their fixed rules, the
//! jumps from the built-in chains, and the NodePort tail of `KUBE-SERVICES`. Everything here is
//! derived from the flags and the node ([`StaticConfig`]); when it changes, the backend does a
//! full sync.

use std::net::IpAddr;

use ipnet::IpNet;
use kpng_backend::settings::{DetectLocal, NodePortAddresses, NodePortScope};
use kpng_model::{Family, NodeState};

use crate::rules::{
    CANARY, EXTERNAL_SERVICES, FORWARD, KUBELET_FIREWALL, LocalMatch, MARK_MASQ, NODEPORTS,
    POSTROUTING, PROXY_FIREWALL, RenderContext, SERVICES, Table,
};

/// Where `KUBE-SERVICES` sends traffic on to `KUBE-NODEPORTS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodePortDestinations {
    /// Every local address; `exclude` is the loopback range that may not take node ports.
    AllLocal {
        /// `127.0.0.0/8` (IPv4 without localhost node ports) or `::1/128` (IPv6).
        exclude: Option<&'static str>,
    },
    /// These addresses only.
    Ips(Vec<IpAddr>),
}

/// A jump from a built-in chain into one of ours, ensured at every full sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jump {
    /// The table.
    pub table: Table,
    /// The built-in chain (`PREROUTING`, `INPUT`, …).
    pub from: &'static str,
    /// Our chain.
    pub to: &'static str,
    /// The rule's comment (how an existing jump is recognised); empty for kubelet's.
    pub comment: &'static str,
    /// Only for new connections.
    pub new_only: bool,
}

impl Jump {
    /// The rule after `-I FROM 1 `.
    pub fn spec(&self) -> String {
        let mut s = String::new();
        if self.new_only {
            s.push_str("-m conntrack --ctstate NEW ");
        }
        if !self.comment.is_empty() {
            s.push_str(&format!("-m comment --comment \"{}\" ", self.comment));
        }
        s.push_str(&format!("-j {}", self.to));
        s
    }
}

/// Everything that shapes the rules of one family apart from the Services.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticConfig {
    /// The family.
    pub family: Family,
    /// `1 << --masquerade-bit`, as `0x4000`.
    pub mark: String,
    /// What every port's rules depend on.
    pub render: RenderContext,
    /// The NodePort tail of `KUBE-SERVICES`.
    pub node_ports: NodePortDestinations,
    /// IPv4 node ports on 127.0.0.1 (needs `route_localnet`, and KUBE-FIREWALL's martian drop).
    pub localhost_node_ports: bool,
    /// Drop forwarded packets conntrack finds invalid (unless `tcp_be_liberal`).
    pub drop_invalid: bool,
}

/// The flags a [`StaticConfig`] is made from.
#[derive(Debug, Clone)]
pub struct StaticInputs<'a> {
    /// `--masquerade-all`.
    pub masquerade_all: bool,
    /// `--masquerade-bit`.
    pub masquerade_bit: u8,
    /// `--detect-local-mode` and its parameters.
    pub detect_local: &'a DetectLocal,
    /// `--nodeport-addresses`.
    pub nodeport_addresses: &'a NodePortAddresses,
    /// `--iptables-localhost-nodeports`.
    pub localhost_node_ports: bool,
    /// conntrack's `tcp_be_liberal` is (or will be) set.
    pub tcp_be_liberal: bool,
}

impl StaticConfig {
    /// The configuration of `family` on `node`; `local_addresses` are the node's interface
    /// addresses (used with CIDR node-port addresses only).
    pub fn new(
        inputs: &StaticInputs<'_>,
        family: Family,
        node: &NodeState,
        local_addresses: &[IpAddr],
    ) -> StaticConfig {
        let of_family = |ip: &IpAddr| Family::of(ip) == family;
        let v4 = family == Family::V4;
        let scope = inputs.nodeport_addresses.scope_on(family, node);
        let scope_is_all = matches!(scope, NodePortScope::AllLocal);
        let localhost_node_ports =
            inputs.localhost_node_ports && v4 && scope.takes_ipv4_localhost();
        let node_ports = if scope_is_all {
            NodePortDestinations::AllLocal {
                exclude: match (v4, localhost_node_ports) {
                    (false, _) => Some("::1/128"),
                    (true, false) => Some("127.0.0.0/8"),
                    (true, true) => None,
                },
            }
        } else {
            let ips: Vec<IpAddr> = scope
                .addresses(family, &node.ips, || local_addresses.to_vec())
                .into_iter()
                .filter(|ip| !ip.is_loopback() || localhost_node_ports)
                .collect();
            NodePortDestinations::Ips(ips)
        };
        StaticConfig {
            family,
            mark: format!("{:#x}", 1u32 << inputs.masquerade_bit.min(31)),
            render: RenderContext {
                masquerade_all: inputs.masquerade_all,
                local: local_match(inputs.detect_local, family, node),
                node_ip: node.ips.iter().copied().find(of_family),
            },
            node_ports,
            localhost_node_ports,
            drop_invalid: !inputs.tcp_be_liberal,
        }
    }

    /// Our top-level chains of `table` (declared, hence flushed, at every full sync).
    pub fn chains(&self, table: Table) -> Vec<&'static str> {
        match table {
            Table::Mangle => vec![CANARY],
            Table::Filter => {
                let mut c = vec![
                    SERVICES,
                    EXTERNAL_SERVICES,
                    FORWARD,
                    NODEPORTS,
                    PROXY_FIREWALL,
                ];
                if self.localhost_node_ports {
                    c.push(KUBELET_FIREWALL);
                }
                c
            }
            Table::Nat => vec![SERVICES, NODEPORTS, POSTROUTING, MARK_MASQ],
        }
    }

    /// The fixed rules of `table` as `(chain, spec)`, before any Service's.
    pub fn rules(&self, table: Table) -> Vec<(&'static str, String)> {
        let mark = &self.mark;
        match table {
            Table::Mangle => Vec::new(),
            Table::Filter => {
                let mut r = Vec::new();
                if self.localhost_node_ports {
                    r.push((
                        KUBELET_FIREWALL,
                        "-m comment --comment \"block incoming localnet connections\" \
                         -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack \
                         ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"
                            .to_owned(),
                    ));
                }
                if self.drop_invalid {
                    r.push((FORWARD, "-m conntrack --ctstate INVALID -j DROP".to_owned()));
                }
                r.push((
                    FORWARD,
                    format!(
                        "-m comment --comment \"kubernetes forwarding rules\" \
                         -m mark --mark {mark}/{mark} -j ACCEPT"
                    ),
                ));
                r.push((
                    FORWARD,
                    "-m comment --comment \"kubernetes forwarding conntrack rule\" \
                     -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
                        .to_owned(),
                ));
                r
            }
            Table::Nat => vec![
                (
                    POSTROUTING,
                    format!("-m mark ! --mark {mark}/{mark} -j RETURN"),
                ),
                (POSTROUTING, format!("-j MARK --xor-mark {mark}")),
                (
                    POSTROUTING,
                    "-m comment --comment \"kubernetes service traffic requiring SNAT\" \
                     -j MASQUERADE --random-fully"
                        .to_owned(),
                ),
                (MARK_MASQ, format!("-j MARK --or-mark {mark}")),
            ],
        }
    }

    /// The rules that must stay last in nat `KUBE-SERVICES`: the hand-over to `KUBE-NODEPORTS`.
    pub fn node_port_tail(&self) -> Vec<String> {
        let c = "-m comment --comment \"kubernetes service nodeports; NOTE: this must be the \
                 last rule in this chain\"";
        match &self.node_ports {
            NodePortDestinations::AllLocal { exclude } => {
                let not = exclude.map(|e| format!(" ! -d {e}")).unwrap_or_default();
                vec![format!(
                    "{c} -m addrtype --dst-type LOCAL{not} -j {NODEPORTS}"
                )]
            }
            NodePortDestinations::Ips(ips) => ips
                .iter()
                .map(|ip| format!("{c} -d {ip} -j {NODEPORTS}"))
                .collect(),
        }
    }

    /// Jumps from the built-in chains, in the order kube-proxy prepends them.
    pub fn jumps(&self) -> Vec<Jump> {
        let j = |table, from, to, comment, new_only| Jump {
            table,
            from,
            to,
            comment,
            new_only,
        };
        let external = "kubernetes externally-visible service portals";
        let portals = "kubernetes service portals";
        let firewall = "kubernetes load balancer firewall";
        let mut v = vec![
            j(Table::Filter, "INPUT", EXTERNAL_SERVICES, external, true),
            j(Table::Filter, "FORWARD", EXTERNAL_SERVICES, external, true),
            j(
                Table::Filter,
                "INPUT",
                NODEPORTS,
                "kubernetes health check service ports",
                false,
            ),
            j(Table::Filter, "FORWARD", SERVICES, portals, true),
            j(Table::Filter, "OUTPUT", SERVICES, portals, true),
            j(
                Table::Filter,
                "FORWARD",
                FORWARD,
                "kubernetes forwarding rules",
                false,
            ),
            j(Table::Filter, "INPUT", PROXY_FIREWALL, firewall, true),
            j(Table::Filter, "OUTPUT", PROXY_FIREWALL, firewall, true),
            j(Table::Filter, "FORWARD", PROXY_FIREWALL, firewall, true),
            j(Table::Nat, "OUTPUT", SERVICES, portals, false),
            j(Table::Nat, "PREROUTING", SERVICES, portals, false),
            j(
                Table::Nat,
                "POSTROUTING",
                POSTROUTING,
                "kubernetes postrouting rules",
                false,
            ),
        ];
        if self.localhost_node_ports {
            v.push(j(Table::Filter, "INPUT", KUBELET_FIREWALL, "", false));
            v.push(j(Table::Filter, "OUTPUT", KUBELET_FIREWALL, "", false));
        }
        v
    }
}

/// The detector's matches for `family`; `None` when the mode has nothing for this family.
fn local_match(detect: &DetectLocal, family: Family, node: &NodeState) -> Option<LocalMatch> {
    let by_cidr = |cidrs: &[IpNet]| {
        cidrs
            .iter()
            .find(|c| Family::of(&c.addr()) == family)
            .map(|c| LocalMatch {
                if_local: format!("-s {c}"),
                if_not_local: format!("! -s {c}"),
            })
    };
    match detect {
        DetectLocal::None => None,
        DetectLocal::ClusterCidr(cidrs) => by_cidr(cidrs),
        DetectLocal::NodeCidr => by_cidr(&node.pod_cidrs),
        DetectLocal::BridgeInterface(name) => Some(LocalMatch {
            if_local: format!("-i {name}"),
            if_not_local: format!("! -i {name}"),
        }),
        DetectLocal::InterfaceNamePrefix(prefix) => Some(LocalMatch {
            if_local: format!("-i {prefix}+"),
            if_not_local: format!("! -i {prefix}+"),
        }),
    }
}

/// Total fixed rules of `table` (for the rule-count gauges).
pub fn fixed_rule_count(cfg: &StaticConfig, table: Table) -> usize {
    let tail = if table == Table::Nat {
        cfg.node_port_tail().len()
    } else {
        0
    };
    cfg.rules(table).len() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> NodeState {
        NodeState {
            name: "node1".into(),
            known: true,
            ips: vec![
                "192.168.100.1".parse().expect("ip"),
                "fd00:100::1".parse().expect("ip"),
            ],
            zone: None,
            pod_cidrs: vec!["10.244.1.0/24".parse().expect("cidr")],
            deleting: false,
            to_be_deleted: false,
            ..NodeState::default()
        }
    }

    fn cfg(addresses: NodePortAddresses, localhost: bool, family: Family) -> StaticConfig {
        let detect = DetectLocal::NodeCidr;
        let inputs = StaticInputs {
            masquerade_all: false,
            masquerade_bit: 14,
            detect_local: &detect,
            nodeport_addresses: &addresses,
            localhost_node_ports: localhost,
            tcp_be_liberal: false,
        };
        let locals: Vec<IpAddr> = ["127.0.0.1", "::1", "192.168.100.1", "10.244.1.1"]
            .iter()
            .map(|s| s.parse().expect("ip"))
            .collect();
        StaticConfig::new(&inputs, family, &node(), &locals)
    }

    #[test]
    fn node_port_destinations_by_setting() {
        use NodePortDestinations as D;
        let cidr = |s: &str| NodePortAddresses::Cidrs(vec![s.parse().expect("cidr")]);
        let ips = |v: &[&str]| D::Ips(v.iter().map(|s| s.parse().expect("ip")).collect());
        for (what, addresses, localhost, family, want, want_localhost) in [
            (
                "default v4",
                NodePortAddresses::AllLocal,
                true,
                Family::V4,
                D::AllLocal { exclude: None },
                true,
            ),
            (
                "default v4, no localhost",
                NodePortAddresses::AllLocal,
                false,
                Family::V4,
                D::AllLocal {
                    exclude: Some("127.0.0.0/8"),
                },
                false,
            ),
            (
                "default v6",
                NodePortAddresses::AllLocal,
                true,
                Family::V6,
                D::AllLocal {
                    exclude: Some("::1/128"),
                },
                false,
            ),
            (
                "primary",
                NodePortAddresses::Primary,
                true,
                Family::V4,
                ips(&["192.168.100.1"]),
                false,
            ),
            (
                "v4 CIDR",
                cidr("10.0.0.0/8"),
                true,
                Family::V4,
                ips(&["10.244.1.1"]),
                false,
            ),
            (
                "v4 CIDR seen from v6",
                cidr("10.0.0.0/8"),
                true,
                Family::V6,
                D::AllLocal {
                    exclude: Some("::1/128"),
                },
                false,
            ),
            (
                "loopback CIDR",
                cidr("127.0.0.0/8"),
                true,
                Family::V4,
                ips(&["127.0.0.1"]),
                true,
            ),
            (
                "loopback CIDR without localhost node ports",
                cidr("127.0.0.0/8"),
                false,
                Family::V4,
                ips(&[]),
                false,
            ),
        ] {
            let c = cfg(addresses, localhost, family);
            assert_eq!(c.node_ports, want, "{what}");
            assert_eq!(c.localhost_node_ports, want_localhost, "{what}");
        }
    }

    #[test]
    fn detectors_by_mode() {
        let n = node();
        let m = |d: DetectLocal, f| local_match(&d, f, &n).map(|l| l.if_not_local);
        let cidrs = vec!["10.244.0.0/16".parse().expect("cidr")];
        for (mode, family, want) in [
            (
                DetectLocal::ClusterCidr(cidrs.clone()),
                Family::V4,
                Some("! -s 10.244.0.0/16"),
            ),
            (DetectLocal::ClusterCidr(cidrs), Family::V6, None),
            (
                DetectLocal::NodeCidr,
                Family::V4,
                Some("! -s 10.244.1.0/24"),
            ),
            (
                DetectLocal::BridgeInterface("cbr0".into()),
                Family::V6,
                Some("! -i cbr0"),
            ),
            (
                DetectLocal::InterfaceNamePrefix("veth".into()),
                Family::V4,
                Some("! -i veth+"),
            ),
            (DetectLocal::None, Family::V4, None),
        ] {
            assert_eq!(
                m(mode.clone(), family).as_deref(),
                want,
                "{mode:?} {family}"
            );
        }
    }

    #[test]
    fn kubelet_firewall_only_with_localhost_node_ports() {
        let with = cfg(NodePortAddresses::AllLocal, true, Family::V4);
        assert!(with.chains(Table::Filter).contains(&KUBELET_FIREWALL));
        assert!(with.jumps().iter().any(|j| j.to == KUBELET_FIREWALL));
        let without = cfg(NodePortAddresses::AllLocal, true, Family::V6);
        assert!(!without.chains(Table::Filter).contains(&KUBELET_FIREWALL));
        assert!(!without.jumps().iter().any(|j| j.to == KUBELET_FIREWALL));
    }

    #[test]
    fn probability_has_ten_decimals() {
        assert_eq!(crate::rules::probability(3), "0.3333333333");
        assert_eq!(crate::rules::probability(2), "0.5000000000");
    }
}
