//! Building the node-local [`ServicePort`]s of one Service from its converted objects.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use crate::addr_text::AddrText;
use crate::categorize::{EndpointCandidate, categorize_endpoints, sort_endpoints};
use crate::claims::{Frontend, Lost};
use crate::key::{Family, PortKey, Protocol};
use crate::node::NodeState;
use crate::records::{PortInfo, ServiceInfo, SliceInfo};
use crate::service_port::{Endpoint, ServicePort};

/// Every copy of the endpoints of one Service port (matched by name and protocol) of one family
/// in `slices`, in slice order, with the name of the slice holding it.
fn copies<'a>(
    port: &'a PortInfo,
    family: Family,
    slices: impl Iterator<Item = &'a SliceInfo> + 'a,
    node_name: &'a str,
) -> impl Iterator<Item = (&'a str, AddrText, EndpointCandidate)> + 'a {
    slices.flat_map(move |slice| {
        slice
            .ports
            .iter()
            .filter(move |p| p.name == port.name && p.protocol == port.protocol)
            .flat_map(move |slice_port| {
                slice
                    .endpoints
                    .iter()
                    .filter(move |e| Family::of(&e.ip) == family)
                    .map(move |ep| {
                        let is_local =
                            !node_name.is_empty() && ep.node_name.as_deref() == Some(node_name);
                        let candidate = EndpointCandidate {
                            endpoint: Endpoint {
                                ip: ep.ip,
                                port: slice_port.port,
                                is_local,
                                ready: ep.ready,
                                serving: ep.serving,
                                terminating: ep.terminating,
                            },
                            zone_hints: ep.zone_hints().to_vec(),
                            node_hints: ep.node_hints().to_vec(),
                        };
                        (
                            &*slice.name,
                            AddrText::of(ep.ip, slice_port.port),
                            candidate,
                        )
                    })
            })
    })
}

/// Whether `candidate`, a later copy of an endpoint, replaces the one kept so far: a local
/// copy wins, else the first (upstream's endpointslicecache).
fn replaces(candidate: &EndpointCandidate, kept: Option<&EndpointCandidate>) -> bool {
    candidate.endpoint.is_local || kept.is_none()
}

/// Collects the endpoints of one Service port (matched by name and protocol) of one family,
/// de-duplicated by `IP:port` (a local copy wins, as upstream) and sorted by `IP:port`.
pub(crate) fn candidates<'a>(
    port: &'a PortInfo,
    family: Family,
    slices: impl Iterator<Item = &'a SliceInfo> + 'a,
    node_name: &'a str,
) -> Vec<EndpointCandidate> {
    let mut by_addr: BTreeMap<AddrText, EndpointCandidate> = BTreeMap::new();
    for (_, key, candidate) in copies(port, family, slices, node_name) {
        if replaces(&candidate, by_addr.get(&key)) {
            by_addr.insert(key, candidate);
        }
    }
    // BTreeMap over the "IP:port" string is already upstream's sort order.
    by_addr.into_values().collect()
}

/// For each endpoint that more than one slice of the port holds with different conditions
/// (or on another node), a note for `kpng status`: the other copies and which slice's
/// conditions [`candidates`] kept (`also in slice dup-1 (ready); dup-2's conditions used`).
/// Asked on demand only: the sync path never builds it.
pub(crate) fn copy_notes<'a>(
    port: &'a PortInfo,
    family: Family,
    slices: impl Iterator<Item = &'a SliceInfo> + 'a,
    node_name: &'a str,
) -> BTreeMap<SocketAddr, String> {
    // Per address: every copy with its slice, and which one is kept.
    type Copies<'s> = (Vec<(&'s str, EndpointCandidate)>, usize);
    let mut by_addr: BTreeMap<AddrText, Copies<'_>> = BTreeMap::new();
    for (slice, key, candidate) in copies(port, family, slices, node_name) {
        let (all, kept) = by_addr.entry(key).or_default();
        if replaces(&candidate, all.get(*kept).map(|(_, c)| c)) {
            *kept = all.len();
        }
        all.push((slice, candidate));
    }
    let facts = |c: &EndpointCandidate| {
        let e = &c.endpoint;
        (e.ready, e.serving, e.terminating, e.is_local)
    };
    let mut out = BTreeMap::new();
    for (all, kept) in by_addr.into_values() {
        let Some((kept_slice, kept)) = all.get(kept) else {
            continue;
        };
        let others: Vec<String> = all
            .iter()
            .filter(|(_, c)| facts(c) != facts(kept))
            .map(|(slice, c)| {
                let e = &c.endpoint;
                let state = crate::inspect::condition_word(e.ready, e.serving, e.terminating);
                if e.is_local == kept.endpoint.is_local {
                    format!("{slice} ({state})")
                } else if e.is_local {
                    format!("{slice} ({state}, on this node)")
                } else {
                    format!("{slice} ({state}, on another node)")
                }
            })
            .collect();
        if !others.is_empty() {
            out.insert(
                kept.endpoint.addr(),
                format!(
                    "also in slice {}; {kept_slice}'s conditions used",
                    others.join(", ")
                ),
            );
        }
    }
    out
}

/// The IPs of `family`, without the ones `lost` to another Service, sorted and unique.
fn of_family(ips: &[IpAddr], family: Family, lost: impl Fn(IpAddr) -> bool) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = ips
        .iter()
        .copied()
        .filter(|ip| Family::of(ip) == family && !lost(*ip))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Computes every [`ServicePort`] (per port, per family) of one Service, leaving out the
/// frontends it `lost` to older Services: a lost ClusterIP port drops that port of that family
/// (a Service port is keyed by its ClusterIP), a lost external or load-balancer IP only that IP
/// of that port, a lost node port (or health check node port) only that port.
pub(crate) fn service_ports(
    svc: &ServiceInfo,
    slices: &[SliceInfo],
    node: &NodeState,
    lost: &Lost,
) -> Vec<ServicePort> {
    let mut out = Vec::new();
    for cluster_ip in &svc.cluster_ips {
        let family = Family::of(cluster_ip);
        for port in &svc.ports {
            if lost.contains_key(&Frontend::Cluster(*cluster_ip, port.port, port.protocol)) {
                continue;
            }
            let node_port = port
                .node_port
                .filter(|np| !lost.contains_key(&Frontend::NodePort(*np, port.protocol)));
            let mut sp = ServicePort {
                key: PortKey {
                    service: svc.key.clone(),
                    port_name: port.name.clone(),
                    protocol: port.protocol,
                    family,
                },
                cluster_ip: *cluster_ip,
                port: port.port,
                node_port,
                target_port: port.target_port.clone(),
                external_ips: of_family(&svc.external_ips, family, |ip| {
                    lost.contains_key(&Frontend::External(ip, port.port, port.protocol))
                }),
                load_balancer_ips: of_family(&svc.load_balancer_ips, family, |ip| {
                    lost.contains_key(&Frontend::LoadBalancer(ip, port.port, port.protocol))
                }),
                source_ranges: {
                    let mut r: Vec<_> = svc
                        .source_ranges
                        .iter()
                        .copied()
                        .filter(|n| Family::of(&n.addr()) == family)
                        .collect();
                    r.sort();
                    r.dedup();
                    r
                },
                session_affinity: svc.session_affinity,
                external_policy_local: svc.external_policy_local,
                internal_policy_local: svc.internal_policy_local,
                health_check_node_port: svc
                    .health_check_node_port
                    .filter(|hc| !lost.contains_key(&Frontend::NodePort(*hc, Protocol::Tcp))),
                preserve_destination: svc.preserve_destination,
                cluster_endpoints: Vec::new(),
                local_endpoints: Vec::new(),
                has_any_endpoints: false,
                local_ready_endpoints: 0,
                serving_endpoints: Vec::new(),
            };
            let cands = candidates(port, family, slices.iter(), &node.name);
            let cat = categorize_endpoints(
                &cands,
                sp.uses_cluster_endpoints(),
                sp.uses_local_endpoints(),
                &node.name,
                node.zone.as_deref(),
            );
            sp.cluster_endpoints = cat.cluster;
            sp.local_endpoints = cat.local;
            sort_endpoints(&mut sp.cluster_endpoints);
            sort_endpoints(&mut sp.local_endpoints);
            sp.has_any_endpoints = cat.has_any;
            let mut local_ready: Vec<IpAddr> = cands
                .iter()
                .filter(|c| c.endpoint.is_local && c.endpoint.ready)
                .map(|c| c.endpoint.ip)
                .collect();
            local_ready.sort();
            local_ready.dedup();
            sp.local_ready_endpoints = u32::try_from(local_ready.len()).unwrap_or(u32::MAX);
            let mut serving: Vec<SocketAddr> = cands
                .iter()
                .filter(|c| c.endpoint.serving)
                .map(|c| c.endpoint.addr())
                .collect();
            serving.sort();
            serving.dedup();
            sp.serving_endpoints = serving;
            out.push(sp);
        }
    }
    out
}
