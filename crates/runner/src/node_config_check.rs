//! Two misconfigurations of a node that nothing else reports, checked from the node's view and
//! worded for `kpng status` and one warning per change:
//!
//! - none of the Node's addresses is on this host: `--node-name`/`--hostname-override` names
//!   another node (a second kpng started as `node2` on node3), so this host serves another
//!   node's local endpoints and its NodePorts on addresses it does not have;
//! - the Node's podCIDRs are outside `--cluster-cidr`: masquerade decisions then take this
//!   node's pods for outside traffic. Upstream kube-proxy says nothing of either.

use std::net::IpAddr;

use ipnet::IpNet;
use kpng_model::NodeState;

/// What the checks need beyond the node: the host's addresses (when the backend serves
/// NodePorts on the node IPs, so they matter) and `--cluster-cidr`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeConfigCheck {
    /// The host's addresses, `None` when not checked (a sink, a backend that does not serve
    /// NodePorts on the node IPs, a platform without the address watch).
    pub host_addresses: Option<Vec<IpAddr>>,
    /// `--cluster-cidr`.
    pub cluster_cidrs: Vec<IpNet>,
}

impl NodeConfigCheck {
    /// What is wrong, in words, one string per problem; empty when nothing is, or before the
    /// Node is known (its absence is reported on its own).
    pub fn problems(&self, node: &NodeState) -> Vec<String> {
        let mut out = Vec::new();
        if !node.known {
            return out;
        }
        if let Some(host) = &self.host_addresses
            && !node.ips.is_empty()
            && !node.ips.iter().any(|ip| host.contains(ip))
        {
            out.push(format!(
                "none of Node {}'s addresses ({}) is on this host: is --node-name/\
                 --hostname-override right? (this host then serves that node's local \
                 endpoints, and its NodePorts on addresses it does not have)",
                node.name,
                join(&node.ips)
            ));
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
                out.push(format!(
                    "Node {}'s pod CIDR {} is outside --cluster-cidr {}: its pods' traffic is \
                     taken for traffic from outside the cluster when deciding what to \
                     masquerade",
                    node.name,
                    join(&outside),
                    join(&self.cluster_cidrs)
                ));
            }
        }
        out
    }
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

    #[test]
    fn a_node_whose_addresses_are_elsewhere_or_whose_pods_are_outside_the_cluster_is_named() {
        let node = |ips: &[&str], pods: &[&str]| NodeState {
            name: "node2".into(),
            known: true,
            ips: ips.iter().map(|i| i.parse().expect("ip")).collect(),
            pod_cidrs: pods.iter().map(|c| c.parse().expect("cidr")).collect(),
            ..NodeState::default()
        };
        let check = |host: Option<&[&str]>, cluster: &[&str]| NodeConfigCheck {
            host_addresses: host.map(|h| h.iter().map(|i| i.parse().expect("ip")).collect()),
            cluster_cidrs: cluster.iter().map(|c| c.parse().expect("cidr")).collect(),
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
            let got = check.problems(&node);
            assert_eq!(got.len(), want.len(), "{what}: {got:?}");
            for (g, w) in got.iter().zip(want) {
                assert!(g.contains(w), "{what}: {g:?} lacks {w:?}");
            }
        }
    }
}
