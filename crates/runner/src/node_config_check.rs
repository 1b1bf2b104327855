//! Two misconfigurations of a node that nothing else reports, checked from the node's view and
//! worded for `kpng status` and one warning per change:
//!
//! - none of the Node's addresses is on this host: `--node-name`/`--hostname-override` names
//!   another node (a second kpng started as `node2` on node3), so this host serves another
//!   node's local endpoints and its NodePorts on addresses it does not have;
//! - the Node's podCIDRs are outside `--cluster-cidr`: masquerade decisions then take this
//!   node's pods for outside traffic. Upstream kube-proxy says nothing of either;
//!
//! and two facts of a dual-stack node that kube-proxy logs once and kpng also shows:
//!
//! - NodePorts on the primary node IPs (`--nodeport-addresses primary`) and no node IP of one
//!   family: that family's NodePorts answer on every local address of it, as kube-proxy's;
//! - `--detect-local-mode ClusterCIDR` and no `--cluster-cidr` of a family the Node uses: no
//!   traffic of that family is taken for a pod's;
//! - `--detect-local-mode NodeCIDR` and a Node with pod CIDRs of one family only, though it
//!   has addresses of the other: likewise for the other (kube-proxy logs "Detect-local-mode
//!   set to NodeCIDR, but no PodCIDR defined at node for family").

use std::net::IpAddr;

use ipnet::IpNet;
use kpng_model::{Family, NodeState};

/// What the checks need beyond the node: the host's addresses (when the backend serves
/// NodePorts on the node IPs or inside CIDRs, so they matter) and `--cluster-cidr`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeConfigCheck {
    /// The host's addresses, `None` when not checked (a sink, a backend that serves NodePorts
    /// on every address, a platform without the address watch).
    pub host_addresses: Option<Vec<IpAddr>>,
    /// Whether the Node's addresses must be among the host's (NodePorts on the node IPs): a
    /// wrong `--node-name` otherwise goes unnoticed.
    pub node_ips_on_host: bool,
    /// `--nodeport-addresses` as CIDRs (empty otherwise): a family of
    /// [`NodeConfigCheck::node_port_cidr_families`] they restrict, none of whose host
    /// addresses (loopback aside: no backend but iptables' `--iptables-localhost-nodeports`
    /// serves it) is inside them, serves its NodePorts on no address at all.
    pub node_port_cidrs: Vec<IpNet>,
    /// The backend's families, when [`NodeConfigCheck::node_port_cidrs`] are given.
    pub node_port_cidr_families: Vec<Family>,
    /// `--cluster-cidr`.
    pub cluster_cidrs: Vec<IpNet>,
    /// `--cluster-cidr` tells pods apart (`--detect-local-mode ClusterCIDR`, without
    /// `--masquerade-all`): a family the Node uses without one has no pod detection.
    pub cluster_cidrs_detect_pods: bool,
    /// The families whose NodePorts are served on the node's primary IP (`--nodeport-addresses
    /// primary`, the backend's families): one without a node IP serves them on every local
    /// address of that family instead.
    pub primary_node_port_families: Vec<Family>,
    /// The families whose missing `--cluster-cidr` was already warned about at start (from
    /// `--node-ip` and `--service-cidr`, before the Node is known): the Node's check of the
    /// same family still shows in `kpng status`, but is not logged a second time
    /// ([`NodeConfigCheck::problems_to_warn`]).
    pub cluster_cidr_warned_at_start: Vec<Family>,
    /// The backend's families when pods are told by the Node's pod CIDRs (`--detect-local-mode
    /// NodeCIDR`): one the Node has addresses of but no pod CIDR of has no pod detection.
    pub node_cidr_families: Vec<Family>,
}

/// One problem the checks found, and the family whose `--cluster-cidr` it says is missing.
struct Found {
    text: String,
    no_cluster_cidr_of: Option<Family>,
}

impl NodeConfigCheck {
    /// What is wrong, in words, one string per problem; empty when nothing is, or before the
    /// Node is known (its absence is reported on its own). `node_port_families` are the
    /// families some Service port with a node port is of ([`node_port_families`]): a family
    /// without a node IP matters only when it has NodePorts or the Node has pod CIDRs of it
    /// (an IPv4 cluster on an IPv6-capable host is not told about IPv6).
    pub fn problems(&self, node: &NodeState, node_port_families: &[Family]) -> Vec<String> {
        self.found(node, node_port_families)
            .into_iter()
            .map(|f| f.text)
            .collect()
    }

    /// The [`problems`](NodeConfigCheck::problems) to log: all but a family's missing
    /// `--cluster-cidr` that the start already warned about (one notice per fact, where an
    /// IPv6 `--node-ip` or `--service-cidr` made it two).
    pub fn problems_to_warn(&self, node: &NodeState, node_port_families: &[Family]) -> Vec<String> {
        self.found(node, node_port_families)
            .into_iter()
            .filter(|f| {
                !f.no_cluster_cidr_of
                    .is_some_and(|family| self.cluster_cidr_warned_at_start.contains(&family))
            })
            .map(|f| f.text)
            .collect()
    }

    fn found(&self, node: &NodeState, node_port_families: &[Family]) -> Vec<Found> {
        let mut out = Vec::new();
        // The CIDRs do not depend on the Node object.
        out.extend(self.node_ports_nowhere().into_iter().map(Found::other));
        if !node.known {
            return out;
        }
        if let Some(host) = &self.host_addresses
            && self.node_ips_on_host
            && !node.ips.is_empty()
            && !node.ips.iter().any(|ip| host.contains(ip))
        {
            out.push(Found::other(format!(
                "none of Node {}'s addresses ({}) is on this host: is --node-name/\
                 --hostname-override right? (this host then serves that node's local \
                 endpoints, and its NodePorts on addresses it does not have)",
                node.name,
                join(&node.ips)
            )));
        }
        // No node IP at all is reported on its own (`admin::node_problem`).
        if !node.ips.is_empty() {
            for family in &self.primary_node_port_families {
                let in_use = node_port_families.contains(family)
                    || node
                        .pod_cidrs
                        .iter()
                        .any(|c| Family::of(&c.addr()) == *family);
                if in_use && !node.ips.iter().any(|ip| Family::of(ip) == *family) {
                    out.push(Found::other(format!(
                        "{family}: no node IP in the Node object; {family} NodePorts answer on \
                         every local {family} address (as kube-proxy)"
                    )));
                }
            }
        }
        if self.cluster_cidrs_detect_pods && !self.cluster_cidrs.is_empty() {
            for family in Family::ALL {
                let used = node.ips.iter().any(|ip| Family::of(ip) == family)
                    || node
                        .pod_cidrs
                        .iter()
                        .any(|c| Family::of(&c.addr()) == family);
                let detected = self
                    .cluster_cidrs
                    .iter()
                    .any(|c| Family::of(&c.addr()) == family);
                if used && !detected {
                    out.push(Found {
                        text: format!(
                            "{family}: --cluster-cidr ({}) has no {family} CIDR though the Node \
                             has {family} addresses or pod CIDRs: no {family} pod detection rule, \
                             so {family} ClusterIP traffic from outside the cluster is not \
                             masqueraded (as kube-proxy)",
                            join(&self.cluster_cidrs)
                        ),
                        no_cluster_cidr_of: Some(family),
                    });
                }
            }
        }
        // No pod CIDR at all holds the first sync, and is reported on its own
        // (`admin::node_problem`).
        if !node.pod_cidrs.is_empty() {
            for family in &self.node_cidr_families {
                let has_ip = node.ips.iter().any(|ip| Family::of(ip) == *family);
                let has_cidr = node
                    .pod_cidrs
                    .iter()
                    .any(|c| Family::of(&c.addr()) == *family);
                if has_ip && !has_cidr {
                    out.push(Found {
                        text: format!(
                        "{family}: --detect-local-mode NodeCIDR, but Node {} has no {family} pod \
                         CIDR (spec.podCIDRs: {}) though it has {family} addresses: no \
                         {family} pod detection rule, so {family} ClusterIP traffic from \
                         outside the cluster is not masqueraded and {family} pods get no \
                         externalTrafficPolicy Local short-circuit (as kube-proxy, which logs \
                         \"no PodCIDR defined at node for family\")",
                        node.name,
                        join(&node.pod_cidrs)
                    ),
                        no_cluster_cidr_of: None,
                    });
                }
            }
        }
        if !self.cluster_cidrs.is_empty() {
            let outside: Vec<&IpNet> = node
                .pod_cidrs
                .iter()
                .filter(|pod| {
                    // A family without a cluster CIDR is warned about at start (its pods
                    // are never taken for pods then): only a CIDR of a family that has
                    // one is checked.
                    let family = |n: &IpNet| n.addr().is_ipv4();
                    self.cluster_cidrs.iter().any(|c| family(c) == family(pod))
                        && !self.cluster_cidrs.iter().any(|c| {
                            c.contains(&pod.network()) && c.prefix_len() <= pod.prefix_len()
                        })
                })
                .collect();
            if !outside.is_empty() {
                out.push(Found::other(format!(
                    "Node {}'s pod CIDR {} is outside --cluster-cidr {}: its pods' traffic is \
                     taken for traffic from outside the cluster when deciding what to \
                     masquerade",
                    node.name,
                    join(&outside),
                    join(&self.cluster_cidrs)
                )));
            }
        }
        out
    }
}

impl NodeConfigCheck {
    /// A family whose `--nodeport-addresses` CIDRs no address of the host is in: its
    /// NodePorts are served on no address (a typo or a wrong VLAN's CIDR turns them all off
    /// silently otherwise; the health checks' own warning named only them). kube-proxy says
    /// nothing of it.
    fn node_ports_nowhere(&self) -> Vec<String> {
        let Some(host) = &self.host_addresses else {
            return Vec::new();
        };
        if self.node_port_cidrs.is_empty() {
            return Vec::new();
        }
        let setting =
            kpng_backend::settings::NodePortAddresses::Cidrs(self.node_port_cidrs.clone());
        let mut out = Vec::new();
        for &family in &self.node_port_cidr_families {
            let kpng_backend::settings::NodePortScope::Cidrs(cidrs) = setting.scope(family) else {
                // No CIDR of the family, or its whole range: every local address.
                continue;
            };
            let matched = host.iter().any(|ip| {
                Family::of(ip) == family
                    && !ip.is_loopback()
                    && cidrs.iter().any(|c| c.contains(ip))
            });
            if !matched {
                out.push(format!(
                    "{family}: no {family} address of this host is inside --nodeport-addresses \
                     {}: {family} NodePorts are served on no address (is a CIDR wrong?)",
                    join(&cidrs)
                ));
            }
        }
        out
    }
}

impl Found {
    fn other(text: String) -> Found {
        Found {
            text,
            no_cluster_cidr_of: None,
        }
    }
}

/// The families some Service port with a node port is of, for [`NodeConfigCheck::problems`].
pub fn node_port_families(snapshot: &kpng_model::Snapshot) -> Vec<Family> {
    Family::ALL
        .into_iter()
        .filter(|f| snapshot.family(*f).any(|p| p.node_port.is_some()))
        .collect()
}

fn join<T: std::fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Node `name`, known, with InternalIPs `ips` and pod CIDRs `pods`: the fixture of every
    /// case below.
    fn node_state(name: &str, ips: &[&str], pods: &[&str]) -> NodeState {
        NodeState {
            name: name.into(),
            known: true,
            ips: ips.iter().map(|i| i.parse().expect("ip")).collect(),
            pod_cidrs: pods.iter().map(|c| c.parse().expect("cidr")).collect(),
            ..NodeState::default()
        }
    }

    #[test]
    fn a_node_whose_addresses_are_elsewhere_or_whose_pods_are_outside_the_cluster_is_named() {
        let node = |ips: &[&str], pods: &[&str]| node_state("node2", ips, pods);
        let check = |host: Option<&[&str]>, cluster: &[&str]| NodeConfigCheck {
            host_addresses: host.map(|h| h.iter().map(|i| i.parse().expect("ip")).collect()),
            node_ips_on_host: true,
            cluster_cidrs: cluster.iter().map(|c| c.parse().expect("cidr")).collect(),
            ..NodeConfigCheck::default()
        };
        let here = ["192.168.100.3", "10.0.0.1"];
        let cases: [(&str, NodeConfigCheck, NodeState, &[&str]); 8] = [
            (
                "fine",
                check(Some(&here), &["10.244.0.0/16"]),
                node(&["192.168.100.3"], &["10.244.3.0/24"]),
                &[],
            ),
            (
                "another node's name",
                check(Some(&here), &[]),
                node(&["192.168.100.2"], &[]),
                &["none of Node node2's addresses (192.168.100.2) is on this host"],
            ),
            (
                "not checked (a sink)",
                check(None, &[]),
                node(&["192.168.100.2"], &[]),
                &[],
            ),
            (
                "no node IP: reported elsewhere",
                check(Some(&here), &[]),
                node(&[], &[]),
                &[],
            ),
            (
                "pods outside",
                check(None, &["10.244.0.0/16"]),
                node(&[], &["10.245.1.0/24"]),
                &["pod CIDR 10.245.1.0/24 is outside --cluster-cidr 10.244.0.0/16"],
            ),
            (
                "pods wider than the cluster",
                check(None, &["10.244.0.0/16"]),
                node(&[], &["10.0.0.0/8"]),
                &["pod CIDR 10.0.0.0/8 is outside"],
            ),
            (
                "an IPv6 pod CIDR, no IPv6 cluster CIDR: not this check's",
                check(None, &["10.0.0.0/16"]),
                node(&[], &["10.0.2.0/24", "fd00:244:2::/64"]),
                &[],
            ),
            (
                "dual-stack, each inside its family's",
                check(None, &["10.244.0.0/16", "fd00:10::/56"]),
                node(&[], &["10.244.1.0/24", "fd00:10:0:1::/64"]),
                &[],
            ),
        ];
        for (what, check, node, want) in cases {
            let got = check.problems(&node, &[]);
            assert_eq!(got.len(), want.len(), "{what}: {got:?}");
            for (g, w) in got.iter().zip(want) {
                assert!(g.contains(w), "{what}: {g:?} lacks {w:?}");
            }
        }
    }

    /// A dual-stack node (the backend programs both families) whose Node lists one family's
    /// InternalIP only, or whose --cluster-cidr has one family only: one line per family, as
    /// kube-proxy logs, shown in `kpng status` and warned once.
    #[test]
    fn a_family_without_node_ip_or_cluster_cidr_is_named() {
        let node = |ips: &[&str], pods: &[&str]| node_state("node1", ips, pods);
        let check = |primary: &[Family], cluster: &[&str], detect: bool| NodeConfigCheck {
            host_addresses: None,
            node_ips_on_host: false,
            node_port_cidrs: Vec::new(),
            node_port_cidr_families: Vec::new(),
            cluster_cidrs: cluster.iter().map(|c| c.parse().expect("cidr")).collect(),
            cluster_cidrs_detect_pods: detect,
            primary_node_port_families: primary.to_vec(),
            cluster_cidr_warned_at_start: Vec::new(),
            node_cidr_families: Vec::new(),
        };
        let both = [Family::V4, Family::V6];
        let v6_node_ips = "IPv6: no node IP in the Node object; IPv6 NodePorts answer on every \
                           local IPv6 address (as kube-proxy)";
        let cases: [(&str, NodeConfigCheck, NodeState, &[&str]); 7] = [
            (
                "dual-stack, an IPv4 InternalIP only",
                check(&both, &[], false),
                node(&["192.168.77.1"], &[]),
                &[v6_node_ips],
            ),
            (
                "dual-stack, both node IPs",
                check(&both, &[], false),
                node(&["192.168.77.1", "fd00:77::1"], &[]),
                &[],
            ),
            (
                "IPv4-only backend",
                check(&[Family::V4], &[], false),
                node(&["192.168.77.1"], &[]),
                &[],
            ),
            (
                "no node IP at all: reported elsewhere",
                check(&both, &[], false),
                node(&[], &[]),
                &[],
            ),
            (
                "--cluster-cidr IPv4 only on a node with IPv6 pod CIDRs",
                check(&[], &["10.77.0.0/24"], true),
                node(&["192.168.77.1"], &["10.77.0.0/25", "fd00:77::/64"]),
                &[
                    "IPv6: --cluster-cidr (10.77.0.0/24) has no IPv6 CIDR though the Node has IPv6 \
                   addresses or pod CIDRs: no IPv6 pod detection rule",
                ],
            ),
            (
                "--cluster-cidr IPv4 only, not the detector",
                check(&[], &["10.77.0.0/24"], false),
                node(&["192.168.77.1", "fd00:77::1"], &["10.77.0.0/25"]),
                &[],
            ),
            (
                "--cluster-cidr IPv4 only on an IPv4 node",
                check(&[], &["10.77.0.0/24"], true),
                node(&["192.168.77.1"], &["10.77.0.0/25"]),
                &[],
            ),
        ];
        for (what, check, node, want) in cases {
            let got = check.problems(&node, &both);
            assert_eq!(got.len(), want.len(), "{what}: {got:?}");
            for (g, w) in got.iter().zip(want) {
                assert!(g.starts_with(w), "{what}: {g:?} is not {w:?}…");
            }
        }
        // No IPv6 NodePort and no IPv6 pod CIDR: an IPv4 cluster on an IPv6-capable host.
        let got = check(&both, &[], false).problems(&node(&["192.168.77.1"], &[]), &[Family::V4]);
        assert!(got.is_empty(), "{got:?}");
        let got = check(&both, &[], false)
            .problems(&node(&["192.168.77.1"], &["fd00:77::/64"]), &[Family::V4]);
        assert_eq!(got, [v6_node_ips]);
    }

    /// `--detect-local-mode NodeCIDR` on a dual-stack node whose Node has one family's pod
    /// CIDR only: the other family has no pod detection, one line for it (as kube-proxy logs).
    #[test]
    fn node_cidr_detection_names_a_family_without_a_pod_cidr() {
        let node = |ips: &[&str], pods: &[&str]| node_state("node1", ips, pods);
        let both = [Family::V4, Family::V6];
        let check = |families: &[Family]| NodeConfigCheck {
            node_cidr_families: families.to_vec(),
            ..NodeConfigCheck::default()
        };
        let dual = ["192.168.77.1", "fd00:77::1"];
        let cases: [(&str, NodeConfigCheck, NodeState, &[&str]); 6] = [
            (
                "dual-stack, an IPv4 pod CIDR only",
                check(&both),
                node(&dual, &["10.244.1.0/24"]),
                &[
                    "IPv6: --detect-local-mode NodeCIDR, but Node node1 has no IPv6 pod CIDR \
                   (spec.podCIDRs: 10.244.1.0/24) though it has IPv6 addresses: no IPv6 pod \
                   detection rule",
                ],
            ),
            (
                "dual-stack, an IPv6 pod CIDR only",
                check(&both),
                node(&dual, &["fd00:244:1::/64"]),
                &["IPv4: --detect-local-mode NodeCIDR, but Node node1 has no IPv4 pod CIDR"],
            ),
            (
                "dual-stack, both",
                check(&both),
                node(&dual, &["10.244.1.0/24", "fd00:244:1::/64"]),
                &[],
            ),
            (
                "an IPv4 node on a dual-stack backend",
                check(&both),
                node(&["192.168.77.1"], &["10.244.1.0/24"]),
                &[],
            ),
            (
                "no pod CIDR at all: reported elsewhere",
                check(&both),
                node(&dual, &[]),
                &[],
            ),
            (
                "another mode",
                check(&[]),
                node(&dual, &["10.244.1.0/24"]),
                &[],
            ),
        ];
        for (what, check, node, want) in cases {
            let got = check.problems(&node, &[]);
            assert_eq!(got.len(), want.len(), "{what}: {got:?}");
            for (g, w) in got.iter().zip(want) {
                assert!(g.starts_with(w), "{what}: {g:?} is not {w:?}…");
            }
        }
    }

    /// `--nodeport-addresses` CIDRs no address of the host is in, for a family: its NodePorts
    /// are served nowhere, a line per family (warned once, shown in `kpng status`), whether
    /// or not the Node is known; loopback does not count (no backend serves it but iptables
    /// mode's IPv4 with `--iptables-localhost-nodeports`).
    #[test]
    fn node_port_cidrs_matching_no_address_of_a_family_are_named() {
        let both = [Family::V4, Family::V6];
        let check = |host: &[&str], cidrs: &[&str], families: &[Family]| NodeConfigCheck {
            host_addresses: Some(host.iter().map(|i| i.parse().expect("ip")).collect()),
            node_port_cidrs: cidrs.iter().map(|c| c.parse().expect("cidr")).collect(),
            node_port_cidr_families: families.to_vec(),
            ..NodeConfigCheck::default()
        };
        let host = ["127.0.0.1", "::1", "10.45.2.1", "10.45.9.1", "fd45:2::1"];
        let v6_nowhere = "IPv6: no IPv6 address of this host is inside --nodeport-addresses \
                          fd45:9::/64: IPv6 NodePorts are served on no address";
        let cases: [(&str, NodeConfigCheck, &[&str]); 7] = [
            (
                "both matched",
                check(&host, &["10.45.2.0/24", "fd45:2::/64"], &both),
                &[],
            ),
            (
                "IPv6 matches nothing",
                check(&host, &["10.45.9.0/24", "fd45:9::/64"], &both),
                &[v6_nowhere],
            ),
            (
                "neither matches",
                check(&host, &["10.45.7.0/24", "fd45:9::/64"], &both),
                &[
                    "IPv4: no IPv4 address of this host is inside --nodeport-addresses \
                     10.45.7.0/24",
                    v6_nowhere,
                ],
            ),
            (
                "loopback only",
                check(&host, &["127.0.0.0/8"], &both),
                &["IPv4: no IPv4 address of this host is inside --nodeport-addresses 127.0.0.0/8"],
            ),
            (
                "no IPv6 CIDR: every IPv6 address",
                check(&host, &["10.45.2.0/24"], &both),
                &[],
            ),
            (
                "an IPv4-only backend",
                check(&host, &["10.45.2.0/24", "fd45:9::/64"], &[Family::V4]),
                &[],
            ),
            ("not CIDRs", check(&host, &[], &both), &[]),
        ];
        for (what, check, want) in cases {
            for node in [
                NodeState::default(),
                node_state("node1", &["10.45.2.1"], &[]),
            ] {
                let got = check.problems(&node, &[]);
                assert_eq!(got.len(), want.len(), "{what}: {got:?}");
                for (g, w) in got.iter().zip(want) {
                    assert!(g.starts_with(w), "{what}: {g:?} is not {w:?}…");
                }
            }
        }
    }
}
