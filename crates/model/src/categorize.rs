//! Which endpoints this node may use for a Service port: upstream `CategorizeEndpoints`.
//!
//! Rules (kube-proxy `pkg/proxy/topology.go`):
//! - Cluster policy uses Ready endpoints, filtered by topology hints; when none are Ready anywhere
//!   it falls back to endpoints that are Serving and Terminating.
//! - Topology: if every Ready endpoint has a node hint and one names this node, keep only those
//!   (PreferSameNode). Else if every Ready endpoint has a zone hint and one names this node's zone,
//!   keep only those (PreferSameZone). Otherwise hints are ignored.
//! - Local policy uses local Ready endpoints, else local Serving+Terminating ones. It ignores
//!   topology.
//! - "Has any endpoint" is true when any endpoint anywhere is usable; it separates REJECT (no
//!   endpoints at all) from DROP (endpoints exist, but none for this policy).

use crate::addr_text::AddrText;
use crate::service_port::Endpoint;

/// An endpoint with the topology hints that decide whether this node may use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointCandidate {
    /// The endpoint itself.
    pub endpoint: Endpoint,
    /// Zones this endpoint is hinted for.
    pub zone_hints: Vec<String>,
    /// Nodes this endpoint is hinted for.
    pub node_hints: Vec<String>,
}

/// The outcome of [`categorize_endpoints`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CategorizedEndpoints {
    /// Endpoints for cluster-policy traffic (empty when the port never uses cluster policy).
    pub cluster: Vec<Endpoint>,
    /// Endpoints for local-policy traffic (empty when the port never uses local policy).
    pub local: Vec<Endpoint>,
    /// Whether any usable endpoint exists anywhere.
    pub has_any: bool,
}

/// Which hints decide for this node: the same choice serves the lists and `kpng status`'s
/// explanation of an unused endpoint ([`crate::inspect`]), which must name what decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TopologyMode {
    None,
    PreferSameNode,
    PreferSameZone,
}

pub(crate) fn topology_mode(
    candidates: &[EndpointCandidate],
    node_name: &str,
    zone: Option<&str>,
) -> TopologyMode {
    let ready: Vec<&EndpointCandidate> = candidates.iter().filter(|c| c.endpoint.ready).collect();
    if ready.is_empty() {
        return TopologyMode::None;
    }
    let all_node_hints = ready.iter().all(|c| !c.node_hints.is_empty());
    if all_node_hints
        && ready
            .iter()
            .any(|c| c.node_hints.iter().any(|n| n == node_name))
    {
        return TopologyMode::PreferSameNode;
    }
    let all_zone_hints = ready.iter().all(|c| !c.zone_hints.is_empty());
    if let Some(zone) = zone
        && all_zone_hints
        && ready.iter().any(|c| c.zone_hints.iter().any(|z| z == zone))
    {
        return TopologyMode::PreferSameZone;
    }
    TopologyMode::None
}

fn available(
    c: &EndpointCandidate,
    mode: TopologyMode,
    node_name: &str,
    zone: Option<&str>,
) -> bool {
    match mode {
        TopologyMode::None => true,
        TopologyMode::PreferSameNode => c.node_hints.iter().any(|n| n == node_name),
        TopologyMode::PreferSameZone => {
            zone.is_some_and(|zone| c.zone_hints.iter().any(|z| z == zone))
        }
    }
}

fn pick(
    candidates: &[EndpointCandidate],
    keep: impl Fn(&EndpointCandidate) -> bool,
) -> Vec<Endpoint> {
    candidates
        .iter()
        .filter(|c| keep(c))
        .map(|c| c.endpoint.clone())
        .collect()
}

/// Selects the cluster- and local-policy endpoint lists for one Service port.
///
/// `uses_cluster` / `uses_local` come from [`crate::ServicePort::uses_cluster_endpoints`] and
/// [`crate::ServicePort::uses_local_endpoints`]. The input order is kept.
pub fn categorize_endpoints(
    candidates: &[EndpointCandidate],
    uses_cluster: bool,
    uses_local: bool,
    node_name: &str,
    zone: Option<&str>,
) -> CategorizedEndpoints {
    let mut out = CategorizedEndpoints::default();
    if candidates.is_empty() {
        return out;
    }
    if uses_cluster {
        let mode = topology_mode(candidates, node_name, zone);
        out.cluster = pick(candidates, |c| {
            c.endpoint.ready && available(c, mode, node_name, zone)
        });
        if out.cluster.is_empty() {
            out.cluster = pick(candidates, |c| c.endpoint.serving && c.endpoint.terminating);
        }
        out.has_any = !out.cluster.is_empty();
    }
    if uses_local {
        let usable = |c: &EndpointCandidate| {
            c.endpoint.ready || (c.endpoint.serving && c.endpoint.terminating)
        };
        out.has_any |= candidates.iter().any(usable);
        out.local = pick(candidates, |c| c.endpoint.is_local && c.endpoint.ready);
        if out.local.is_empty() {
            out.local = pick(candidates, |c| {
                c.endpoint.is_local && c.endpoint.serving && c.endpoint.terminating
            });
        }
    }
    out
}

/// Sorts endpoints as upstream does: by their `IP:port` string (every endpoint list of a
/// [`crate::ServicePort`] is in this order).
pub fn sort_endpoints(endpoints: &mut [Endpoint]) {
    endpoints.sort_by_cached_key(|e| AddrText::of(e.ip, e.port));
}

#[cfg(test)]
mod tests;
