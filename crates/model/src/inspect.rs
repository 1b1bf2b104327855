//! Why each endpoint of a Service port is used or not: the answer `kpng status` gives an
//! operator asking "is my Service programmed, and why does it skip that pod?".
//!
//! The decision itself is made by [`crate::categorize_endpoints`] when the port is built; this module
//! replays it per endpoint and words the outcome (topology hints, another node under a Local
//! policy, terminating, not serving).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::categorize::{EndpointCandidate, TopologyMode, topology_mode};
use crate::node::NodeState;
use crate::service_port::ServicePort;

/// One endpoint of a Service port, its state and whether this node uses it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointStatus {
    /// `IP:port`, the DNAT target.
    pub address: SocketAddr,
    /// `conditions.ready`.
    pub ready: bool,
    /// `conditions.serving`.
    pub serving: bool,
    /// `conditions.terminating`.
    pub terminating: bool,
    /// Runs on this node.
    pub local: bool,
    /// Topology hints: zones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zone_hints: Vec<String>,
    /// Topology hints: nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_hints: Vec<String>,
    /// The endpoint lists that hold it: `cluster` (ClusterIP traffic, and external traffic
    /// under policy Cluster) and/or `local` (traffic under a Local policy).
    pub used_by: Vec<String>,
    /// Why it is not used, when it is in no list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When other slices of the Service hold the same `IP:port` with other conditions (or on
    /// another node): those copies, and whose conditions the fields above are (one copy is
    /// used, as upstream), e.g. `also in slice dup-1 (ready); dup-2's conditions used`.
    /// Otherwise the other copy's conditions would be invisible.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other_copies: Option<String>,
}

/// An endpoint's conditions in one word, as `kpng status` shows them: `ready`,
/// `terminating` (serving while terminating), `serving` (neither ready nor terminating) or
/// `not serving`.
pub fn condition_word(ready: bool, serving: bool, terminating: bool) -> &'static str {
    if ready {
        "ready"
    } else if serving && terminating {
        "terminating"
    } else if serving {
        "serving"
    } else {
        "not serving"
    }
}

/// The endpoints of `port` with their use: `candidates` are every endpoint of the port's slices
/// for this node (as the port was built from), `node` this node.
pub fn explain_endpoints(
    port: &ServicePort,
    candidates: &[EndpointCandidate],
    node: &NodeState,
) -> Vec<EndpointStatus> {
    let in_list =
        |list: &[crate::Endpoint], addr: SocketAddr| list.iter().any(|e| e.addr() == addr);
    let any_ready = candidates.iter().any(|c| c.endpoint.ready);
    let any_local_ready = candidates
        .iter()
        .any(|c| c.endpoint.ready && c.endpoint.is_local);
    let mode = topology_mode(candidates, &node.name, node.zone.as_deref());
    candidates
        .iter()
        .map(|c| {
            let e = &c.endpoint;
            let addr = e.addr();
            let mut used_by = Vec::new();
            if port.uses_cluster_endpoints() && in_list(&port.cluster_endpoints, addr) {
                used_by.push("cluster".to_string());
            }
            if port.uses_local_endpoints() && in_list(&port.local_endpoints, addr) {
                used_by.push("local".to_string());
            }
            let reason = used_by
                .is_empty()
                .then(|| unused_reason(port, c, node, mode, any_ready, any_local_ready));
            EndpointStatus {
                address: addr,
                ready: e.ready,
                serving: e.serving,
                terminating: e.terminating,
                local: e.is_local,
                zone_hints: c.zone_hints.clone(),
                node_hints: c.node_hints.clone(),
                used_by,
                reason,
                other_copies: None,
            }
        })
        .collect()
}

/// Words why an endpoint is in no list, in the order the rules apply.
fn unused_reason(
    port: &ServicePort,
    c: &EndpointCandidate,
    node: &NodeState,
    mode: TopologyMode,
    any_ready: bool,
    any_local_ready: bool,
) -> String {
    let e = &c.endpoint;
    if !e.serving {
        return "not serving (conditions.serving is false)".into();
    }
    if !e.ready && !e.terminating {
        return "not ready (serving but neither ready nor terminating)".into();
    }
    if !e.ready {
        let others = if port.uses_cluster_endpoints() {
            any_ready
        } else {
            any_local_ready
        };
        return if others {
            "terminating: used only while no endpoint is ready".into()
        } else {
            "terminating".into()
        };
    }
    if !port.uses_cluster_endpoints() && !e.is_local {
        return "on another node, and internalTrafficPolicy is Local".into();
    }
    let this_node = if node.name.is_empty() {
        "this node".to_string()
    } else {
        format!("this node ({})", node.name)
    };
    // The hints that decided (node hints, else zone hints), as categorize chose them.
    match mode {
        TopologyMode::PreferSameNode if !c.node_hints.contains(&node.name) => {
            return format!(
                "topology: hinted for node {}, not {this_node}",
                c.node_hints.join(", ")
            );
        }
        TopologyMode::PreferSameZone
            if !c
                .zone_hints
                .iter()
                .any(|z| Some(z.as_str()) == node.zone.as_deref()) =>
        {
            let zone = node.zone.as_deref().unwrap_or("(no zone label)");
            return format!(
                "topology: hinted for zone {}, {this_node} is in {zone}",
                c.zone_hints.join(", ")
            );
        }
        _ => {}
    }
    "not selected".into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{Family, PortKey, Protocol, ServiceKey};
    use crate::service_port::Endpoint;

    fn cand(
        ip: &str,
        local: bool,
        ready: bool,
        serving: bool,
        terminating: bool,
    ) -> EndpointCandidate {
        EndpointCandidate {
            endpoint: Endpoint {
                ip: ip.parse().expect("ip"),
                port: 8080,
                is_local: local,
                ready,
                serving,
                terminating,
            },
            zone_hints: Vec::new(),
            node_hints: Vec::new(),
        }
    }

    fn port() -> ServicePort {
        ServicePort::new(
            PortKey {
                service: ServiceKey::new("ns", "web"),
                port_name: "http".into(),
                protocol: Protocol::Tcp,
                family: Family::V4,
            },
            "10.96.0.1".parse().expect("ip"),
            80,
        )
    }

    fn node() -> NodeState {
        NodeState {
            name: "n1".into(),
            zone: Some("a".into()),
            ..NodeState::default()
        }
    }

    #[test]
    fn every_unused_endpoint_says_why() {
        let mut hinted = cand("10.0.0.6", false, true, true, false);
        hinted.zone_hints = vec!["b".into()];
        let mut node_hinted = cand("10.0.0.7", false, true, true, false);
        node_hinted.node_hints = vec!["n2".into()];
        // PreferSameZone decides (the used endpoint has no node hint): the zone excluded it,
        // whatever its node hint says.
        let mut zone_decided = cand("10.0.0.8", false, true, true, false);
        zone_decided.node_hints = vec!["n2".into()];
        zone_decided.zone_hints = vec!["b".into()];
        // The endpoint in use: hinted for this node and its zone, so that every case's hints
        // are the ones that decide.
        let mut ready = cand("10.0.0.1", false, true, true, false);
        ready.node_hints = vec!["n1".into()];
        ready.zone_hints = vec!["a".into()];
        let mut ready_zone_only = ready.clone();
        ready_zone_only.node_hints.clear();
        let cases: Vec<(&str, EndpointCandidate, bool, Option<&str>)> = vec![
            ("used", ready_zone_only.clone(), false, None),
            (
                "not serving",
                cand("10.0.0.2", false, false, false, true),
                false,
                Some("not serving"),
            ),
            (
                "not ready",
                cand("10.0.0.3", false, false, true, false),
                false,
                Some("not ready"),
            ),
            (
                "terminating",
                cand("10.0.0.4", false, false, true, true),
                false,
                Some("terminating: used only while no endpoint is ready"),
            ),
            (
                "remote under iTP Local",
                cand("10.0.0.5", false, true, true, false),
                true,
                Some("on another node, and internalTrafficPolicy is Local"),
            ),
            (
                "zone hint",
                hinted,
                false,
                Some("topology: hinted for zone b, this node (n1) is in a"),
            ),
            (
                "node hint",
                node_hinted,
                false,
                Some("topology: hinted for node n2, not this node (n1)"),
            ),
            (
                "zone hint decides, a node hint too",
                zone_decided,
                false,
                Some("topology: hinted for zone b, this node (n1) is in a"),
            ),
        ];
        for (what, c, itp_local, want) in cases {
            let mut p = port();
            p.internal_policy_local = itp_local;
            // Only the plain ready endpoint is in the list, as categorize would leave it.
            if want.is_none() {
                p.cluster_endpoints = vec![c.endpoint.clone()];
            }
            let used = if what.starts_with("zone hint decides") {
                ready_zone_only.clone()
            } else {
                ready.clone()
            };
            let all = [used, c.clone()];
            let got = explain_endpoints(&p, &all, &node());
            let status = got
                .iter()
                .find(|s| s.address == c.endpoint.addr())
                .expect("listed");
            match (status.reason.as_deref(), want) {
                (None, None) => {}
                (Some(got), Some(want)) => assert!(got.starts_with(want), "{what}: {got}"),
                (got, want) => panic!("{what}: {got:?}, want {want:?}"),
            }
            assert_eq!(status.used_by.is_empty(), want.is_some(), "{what}");
        }
    }
}
