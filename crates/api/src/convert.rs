//! The model ↔ localv1 conversion: one Service's node-local ports ↔ its `Service` and
//! `Endpoint` messages.
//!
//! KPNG's messages describe a Service once (all ports, both families) and each backend once
//! (one per IP, its ports by name). The `Kpng*` fields carry the rest of
//! [`kpng_model::ServicePort`], so that [`decode_service`] rebuilds exactly the ports
//! [`encode_service`] was given:
//! - per port and family (`Service.KpngPorts`): whether any endpoint exists, the local ready
//!   count, the serving endpoints (`IP:port`) that are not sent as endpoints (so that an endpoint change leaves
//!   the Service value as it is);
//! - per endpoint and port (`Endpoint.Kpng.Ports`): the DNAT port, which lists (cluster / local
//!   policy) hold it, locality and conditions.
//!
//! An endpoint is sent when some port may use it from this node (it is in a cluster- or
//! local-policy list), as KPNG sends only usable endpoints; its `Scopes` say which traffic may.
//! The path key of an endpoint is its IP.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use kpng_model::records::ANNOTATION_PRESERVE_DESTINATION;
use kpng_model::{
    Endpoint, Family, Name, NodeState, PortKey, Protocol, ServiceKey, ServicePort, SessionAffinity,
    TargetPort, ip::parse_ip_sloppy, sort_endpoints,
};
use prost::Message;
use prost::bytes::Bytes;

use crate::proto;

/// The messages of one Service as one node sees it: what a brain sends and compares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceMessages {
    /// The encoded `Service`.
    pub service: Bytes,
    /// Encoded `Endpoint`s by key (the endpoint IP), sorted by key.
    pub endpoints: Vec<(String, Bytes)>,
}

/// A message that cannot be turned back into model types.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: field {field}: {message}")]
pub struct DecodeError {
    /// The value at fault (its path).
    pub what: String,
    /// The field at fault.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

fn error(what: &str, field: &str, message: impl Into<String>) -> DecodeError {
    DecodeError {
        what: what.to_string(),
        field: field.to_string(),
        message: message.into(),
    }
}

/// The wire value of a protocol.
pub fn protocol_to_wire(p: Protocol) -> proto::Protocol {
    match p {
        Protocol::Tcp => proto::Protocol::Tcp,
        Protocol::Udp => proto::Protocol::Udp,
        Protocol::Sctp => proto::Protocol::Sctp,
    }
}

fn protocol_from_wire(value: i32) -> Option<Protocol> {
    match proto::Protocol::try_from(value).ok()? {
        proto::Protocol::Tcp => Some(Protocol::Tcp),
        proto::Protocol::Udp => Some(Protocol::Udp),
        proto::Protocol::Sctp => Some(Protocol::Sctp),
        proto::Protocol::UnknownProtocol => None,
    }
}

fn family_to_wire(f: Family) -> proto::KpngFamily {
    match f {
        Family::V4 => proto::KpngFamily::IPv4,
        Family::V6 => proto::KpngFamily::IPv6,
    }
}

fn port_i32(port: u16) -> i32 {
    i32::from(port)
}

/// Adds addresses to an `IPSet`, by family.
fn ip_set<'a>(ips: impl IntoIterator<Item = &'a IpAddr>) -> proto::IpSet {
    let mut set = proto::IpSet::default();
    for ip in ips {
        let list = if ip.is_ipv4() {
            &mut set.v4
        } else {
            &mut set.v6
        };
        let s = ip.to_string();
        if !list.contains(&s) {
            list.push(s);
        }
    }
    set
}

/// Whether a localv1 Service asks for preserve-DIP: its `preserve-destination` annotation is
/// `"true"` (what KPNG's Windows proxier checked).
fn preserve_destination(service: &proto::Service) -> bool {
    service
        .annotations
        .get(ANNOTATION_PRESERVE_DESTINATION)
        .is_some_and(|v| v == "true")
}

/// KPNG's `PortMapping.TargetPort` and `TargetPortName`, as KPNG's brain set them from
/// `spec.ports[].targetPort`: the number, or the name (and 0). The endpoints' own ports travel
/// in `Endpoint.PortOverrides` and `Endpoint.Kpng`.
fn target_port_to_wire(target: &TargetPort) -> (i32, String) {
    match target {
        TargetPort::Number(n) => (port_i32(*n), String::new()),
        TargetPort::Name(name) => (0, name.to_string()),
    }
}

/// The model's target port of a `PortMapping`: its name, else its number; neither (or a number
/// out of range): the Service port, as the API server defaults it.
fn target_port_from_wire(mapping: &proto::PortMapping, port: u16) -> TargetPort {
    if !mapping.target_port_name.is_empty() {
        return TargetPort::Name(mapping.target_port_name.as_str().into());
    }
    u16::try_from(mapping.target_port)
        .ok()
        .filter(|n| *n > 0)
        .map_or(TargetPort::Number(port), TargetPort::Number)
}

/// KPNG's Service type, derived from what the ports need (the model does not keep `spec.type`).
fn service_type(ports: &[&ServicePort]) -> &'static str {
    if ports
        .iter()
        .any(|p| !p.load_balancer_ips.is_empty() || p.health_check_node_port.is_some())
    {
        "LoadBalancer"
    } else if ports.iter().any(|p| p.node_port.is_some()) {
        "NodePort"
    } else {
        "ClusterIP"
    }
}

/// One endpoint's messages under construction: its ports by (name, protocol).
#[derive(Default)]
struct EndpointBuild {
    ports: BTreeMap<(Name, Protocol), proto::KpngEndpointPort>,
    internal: bool,
    external: bool,
}

/// Encodes the ports of one Service (any order; all of the same Service) for one node.
/// `None` when there are no ports: the Service has no value to send.
pub fn encode_service(ports: &[&ServicePort]) -> Option<ServiceMessages> {
    let mut ports: Vec<&ServicePort> = ports.to_vec();
    ports.sort_by(|a, b| a.key.cmp(&b.key));
    let first = *ports.first()?;
    // The per-Service fields, from the first port; the per-port ones are read (every field
    // named) in the loop below.
    let ServicePort {
        key: PortKey { service: key, .. },
        session_affinity,
        external_policy_local,
        internal_policy_local,
        health_check_node_port,
        preserve_destination,
        ..
    } = first;
    let mut service = proto::Service {
        namespace: key.namespace.to_string(),
        name: key.name.to_string(),
        r#type: service_type(&ports).to_string(),
        external_traffic_to_local: *external_policy_local,
        internal_traffic_to_local: *internal_policy_local,
        health_check_node_port: health_check_node_port.map_or(0, port_i32),
        session_affinity: session_affinity.map(|a| {
            proto::service::SessionAffinity::ClientIp(proto::ClientIpAffinity {
                timeout_seconds: i32::try_from(a.timeout_seconds).unwrap_or(i32::MAX),
            })
        }),
        ..proto::Service::default()
    };
    // localv1 has no field for preserve-DIP; KPNG's Windows proxier read the Service's
    // annotation from `Annotations`, so it travels there.
    if *preserve_destination {
        service.annotations.insert(
            ANNOTATION_PRESERVE_DESTINATION.to_string(),
            "true".to_string(),
        );
    }
    let mut cluster_ips = Vec::new();
    let mut external_ips = Vec::new();
    let mut lb_ips = Vec::new();
    let mut ranges: Vec<IpNet> = Vec::new();
    let mut mappings: BTreeMap<(Name, Protocol), proto::PortMapping> = BTreeMap::new();
    let mut endpoints: BTreeMap<IpAddr, (Endpoint, EndpointBuild)> = BTreeMap::new();
    for sp in &ports {
        // Every field is named (no `..`): a field added to the model does not build until it
        // is sent here (and decoded in `decode_service`) or said not to need to be.
        let ServicePort {
            key: port_key,
            cluster_ip,
            port,
            node_port,
            target_port,
            external_ips: port_external_ips,
            load_balancer_ips,
            source_ranges,
            // Per Service (the API server's spec): sent once, from the first port, above.
            session_affinity: _,
            external_policy_local,
            internal_policy_local,
            // Per Service, sent from the first port above.
            health_check_node_port: _,
            // Per Service (an annotation), sent from the first port above.
            preserve_destination: _,
            cluster_endpoints,
            local_endpoints,
            has_any_endpoints,
            local_ready_endpoints,
            serving_endpoints,
        } = *sp;
        if !cluster_ips.contains(cluster_ip) {
            cluster_ips.push(*cluster_ip);
            external_ips.extend(port_external_ips.iter().copied());
            lb_ips.extend(load_balancer_ips.iter().copied());
            ranges.extend(source_ranges.iter().copied());
        }
        let pk = (port_key.port_name.clone(), port_key.protocol);
        mappings.entry(pk.clone()).or_insert_with(|| {
            let (target_port, target_port_name) = target_port_to_wire(target_port);
            proto::PortMapping {
                name: port_key.port_name.to_string(),
                protocol: protocol_to_wire(port_key.protocol) as i32,
                port: port_i32(*port),
                node_port: node_port.map_or(0, port_i32),
                target_port,
                target_port_name,
            }
        });
        service.kpng_ports.push(proto::KpngPortStatus {
            name: port_key.port_name.to_string(),
            protocol: protocol_to_wire(port_key.protocol) as i32,
            family: family_to_wire(port_key.family) as i32,
            has_any_endpoints: *has_any_endpoints,
            local_ready_endpoints: *local_ready_endpoints,
            serving_only_endpoints: serving_endpoints
                .iter()
                .filter(|addr| {
                    !cluster_endpoints
                        .iter()
                        .chain(local_endpoints.iter())
                        .any(|e| e.serving && e.addr() == **addr)
                })
                .map(|a| a.to_string())
                .collect(),
        });
        for (list, in_cluster) in [(cluster_endpoints, true), (local_endpoints, false)] {
            // Which traffic uses this list (ServicePort::internal_endpoints / external_endpoints).
            let internal = *internal_policy_local != in_cluster;
            let external = *external_policy_local != in_cluster;
            for ep in list {
                // Every field named, as for the port above.
                let Endpoint {
                    ip,
                    port: ep_port,
                    is_local,
                    ready,
                    serving,
                    terminating,
                } = ep;
                let (_, build) = endpoints
                    .entry(*ip)
                    .or_insert_with(|| (ep.clone(), EndpointBuild::default()));
                build.internal |= internal;
                build.external |= external;
                let port =
                    build
                        .ports
                        .entry(pk.clone())
                        .or_insert_with(|| proto::KpngEndpointPort {
                            name: port_key.port_name.to_string(),
                            protocol: protocol_to_wire(port_key.protocol) as i32,
                            port: port_i32(*ep_port),
                            is_local: *is_local,
                            ready: *ready,
                            serving: *serving,
                            terminating: *terminating,
                            cluster: false,
                            local_policy: false,
                        });
                if in_cluster {
                    port.cluster = true;
                } else {
                    port.local_policy = true;
                }
            }
        }
    }
    service.ports = mappings.into_values().collect();
    service.i_ps = Some(proto::ServiceIPs {
        cluster_i_ps: Some(ip_set(&cluster_ips)),
        external_i_ps: Some(ip_set(&external_ips)),
        load_balancer_i_ps: Some(ip_set(&lb_ips)),
        headless: false,
    });
    if !ranges.is_empty() {
        service.ip_filters.push(proto::IpFilter {
            target_i_ps: Some(ip_set(&lb_ips)),
            source_ranges: ranges.iter().map(|n| n.to_string()).collect(),
        });
    }
    // An unnamed port (a Service's only one) whose targetPort is a name: KPNG's newer client
    // helper looks the endpoint's port up under that name, its older one under the port's
    // (empty) name, so the override goes under both.
    let unnamed_target_name = service
        .ports
        .iter()
        .find(|m| m.name.is_empty() && !m.target_port_name.is_empty())
        .map(|m| m.target_port_name.clone());
    let mut encoded: Vec<(String, Bytes)> = endpoints
        .into_iter()
        .map(|(ip, (ep, build))| {
            let mut overrides: Vec<proto::PortName> = Vec::new();
            for port in build.ports.values() {
                if !overrides.iter().any(|o| o.name == port.name) {
                    overrides.push(proto::PortName {
                        name: port.name.clone(),
                        port: port.port,
                    });
                }
            }
            if let Some(name) = &unnamed_target_name
                && let Some(port) = overrides.iter().find(|o| o.name.is_empty()).map(|o| o.port)
            {
                overrides.push(proto::PortName {
                    name: name.clone(),
                    port,
                });
            }
            let message = proto::Endpoint {
                hostname: String::new(),
                i_ps: Some(ip_set([&ip])),
                local: ep.is_local,
                port_overrides: overrides,
                scopes: Some(proto::EndpointScopes {
                    internal: build.internal,
                    external: build.external,
                }),
                kpng: Some(proto::KpngEndpointDetail {
                    ports: build.ports.into_values().collect(),
                }),
            };
            (ip.to_string(), Bytes::from(message.encode_to_vec()))
        })
        .collect();
    encoded.sort_by(|a, b| a.0.cmp(&b.0));
    Some(ServiceMessages {
        service: Bytes::from(service.encode_to_vec()),
        endpoints: encoded,
    })
}

fn parse_ips(what: &str, field: &str, values: &[String]) -> Result<Vec<IpAddr>, DecodeError> {
    values
        .iter()
        .map(|v| {
            parse_ip_sloppy(v)
                .ok_or_else(|| error(what, field, format!("{v:?} is not an IP address")))
        })
        .collect()
}

fn parse_endpoints(
    what: &str,
    field: &str,
    values: &[String],
) -> Result<Vec<SocketAddr>, DecodeError> {
    values
        .iter()
        .map(|v| {
            v.parse()
                .map_err(|_| error(what, field, format!("{v:?} is not an IP:port")))
        })
        .collect()
}

fn sorted_endpoints(mut v: Vec<SocketAddr>) -> Vec<SocketAddr> {
    v.sort();
    v.dedup();
    v
}

fn family_ips(set: Option<&proto::IpSet>, family: Family) -> &[String] {
    match (set, family) {
        (Some(s), Family::V4) => &s.v4,
        (Some(s), Family::V6) => &s.v6,
        (None, _) => &[],
    }
}

fn sorted(mut v: Vec<IpAddr>) -> Vec<IpAddr> {
    v.sort();
    v.dedup();
    v
}

fn port_u16(what: &str, field: &str, value: i32) -> Result<Option<u16>, DecodeError> {
    match value {
        0 => Ok(None),
        v => u16::try_from(v)
            .map(Some)
            .map_err(|_| error(what, field, format!("port {v} is not in 1-65535"))),
    }
}

/// The IP of an `Endpoint` value (its first address).
fn endpoint_ip(what: &str, ep: &proto::Endpoint) -> Result<IpAddr, DecodeError> {
    let set = ep.i_ps.as_ref();
    let raw = set
        .and_then(|s| s.v4.first().or(s.v6.first()))
        .ok_or_else(|| error(what, "IPs", "no address"))?;
    parse_ip_sloppy(raw).ok_or_else(|| error(what, "IPs", format!("{raw:?} is not an IP address")))
}

/// Rebuilds the ports of Service `key` from its `Service` value and its `Endpoint` values (by
/// key). A Service from a KPNG brain (no `Kpng*` fields) is read as KPNG means it: every
/// endpoint is ready and usable by both policies where its scopes allow.
pub fn decode_service(
    key: &ServiceKey,
    service: &proto::Service,
    endpoints: &BTreeMap<String, proto::Endpoint>,
) -> Result<Vec<ServicePort>, DecodeError> {
    let what = format!("Service {key}");
    let ips = service.i_ps.as_ref();
    let mut decoded_eps = Vec::with_capacity(endpoints.len());
    for (ep_key, ep) in endpoints {
        let ep_what = format!("Endpoint {key}/{ep_key}");
        decoded_eps.push((endpoint_ip(&ep_what, ep)?, ep, ep_what));
    }
    let mut ranges = Vec::new();
    for filter in &service.ip_filters {
        for raw in &filter.source_ranges {
            let net: IpNet = raw.parse().map_err(|_| {
                error(
                    &what,
                    "IPFilters.SourceRanges",
                    format!("{raw:?} is not a CIDR"),
                )
            })?;
            ranges.push(net);
        }
    }
    let affinity = match &service.session_affinity {
        Some(proto::service::SessionAffinity::ClientIp(a)) => Some(SessionAffinity {
            timeout_seconds: u32::try_from(a.timeout_seconds).map_err(|_| {
                error(
                    &what,
                    "ClientIP.TimeoutSeconds",
                    format!("{} is negative", a.timeout_seconds),
                )
            })?,
        }),
        None => None,
    };
    let mut out = Vec::new();
    for family in Family::ALL {
        let cluster_ips = parse_ips(
            &what,
            "IPs.ClusterIPs",
            family_ips(ips.and_then(|i| i.cluster_i_ps.as_ref()), family),
        )?;
        let Some(cluster_ip) = cluster_ips.first().copied() else {
            continue;
        };
        let external_ips = sorted(parse_ips(
            &what,
            "IPs.ExternalIPs",
            family_ips(ips.and_then(|i| i.external_i_ps.as_ref()), family),
        )?);
        let load_balancer_ips = sorted(parse_ips(
            &what,
            "IPs.LoadBalancerIPs",
            family_ips(ips.and_then(|i| i.load_balancer_i_ps.as_ref()), family),
        )?);
        let mut source_ranges: Vec<IpNet> = ranges
            .iter()
            .copied()
            .filter(|n| Family::of(&n.addr()) == family)
            .collect();
        source_ranges.sort();
        source_ranges.dedup();
        for mapping in &service.ports {
            let protocol = protocol_from_wire(mapping.protocol).ok_or_else(|| {
                error(
                    &what,
                    "Ports.Protocol",
                    format!("unknown protocol {}", mapping.protocol),
                )
            })?;
            let port = port_u16(&what, "Ports.Port", mapping.port)?
                .ok_or_else(|| error(&what, "Ports.Port", "port 0"))?;
            let status = service.kpng_ports.iter().find(|s| {
                s.name == mapping.name
                    && s.protocol == mapping.protocol
                    && s.family == family_to_wire(family) as i32
            });
            let mut sp = ServicePort {
                key: PortKey {
                    service: key.clone(),
                    port_name: mapping.name.as_str().into(),
                    protocol,
                    family,
                },
                cluster_ip,
                port,
                node_port: port_u16(&what, "Ports.NodePort", mapping.node_port)?,
                target_port: target_port_from_wire(mapping, port),
                external_ips: external_ips.clone(),
                load_balancer_ips: load_balancer_ips.clone(),
                source_ranges: source_ranges.clone(),
                session_affinity: affinity,
                external_policy_local: service.external_traffic_to_local,
                internal_policy_local: service.internal_traffic_to_local,
                health_check_node_port: port_u16(
                    &what,
                    "HealthCheckNodePort",
                    service.health_check_node_port,
                )?,
                preserve_destination: preserve_destination(service),
                cluster_endpoints: Vec::new(),
                local_endpoints: Vec::new(),
                has_any_endpoints: false,
                local_ready_endpoints: 0,
                serving_endpoints: Vec::new(),
            };
            for (ip, ep, ep_what) in &decoded_eps {
                if Family::of(ip) != family {
                    continue;
                }
                match &ep.kpng {
                    Some(detail) => {
                        for p in detail
                            .ports
                            .iter()
                            .filter(|p| p.name == mapping.name && p.protocol == mapping.protocol)
                        {
                            let endpoint = Endpoint {
                                ip: *ip,
                                port: port_u16(ep_what, "Kpng.Ports.Port", p.port)?
                                    .ok_or_else(|| error(ep_what, "Kpng.Ports.Port", "port 0"))?,
                                is_local: p.is_local,
                                ready: p.ready,
                                serving: p.serving,
                                terminating: p.terminating,
                            };
                            if p.cluster {
                                sp.cluster_endpoints.push(endpoint.clone());
                            }
                            if p.local_policy {
                                sp.local_endpoints.push(endpoint);
                            }
                        }
                    }
                    None => legacy_endpoint(&mut sp, mapping, *ip, ep),
                }
            }
            sort_endpoints(&mut sp.cluster_endpoints);
            sort_endpoints(&mut sp.local_endpoints);
            match status {
                Some(s) => {
                    sp.has_any_endpoints = s.has_any_endpoints;
                    sp.local_ready_endpoints = s.local_ready_endpoints;
                    let mut serving = parse_endpoints(
                        &what,
                        "KpngPorts.ServingOnlyEndpoints",
                        &s.serving_only_endpoints,
                    )?;
                    serving.extend(
                        sp.cluster_endpoints
                            .iter()
                            .chain(sp.local_endpoints.iter())
                            .filter(|e| e.serving)
                            .map(|e| e.addr()),
                    );
                    sp.serving_endpoints = sorted_endpoints(serving);
                }
                None => {
                    let all = sp.all_reachable_endpoints();
                    sp.has_any_endpoints = !all.is_empty();
                    sp.local_ready_endpoints =
                        u32::try_from(sp.local_endpoints.len()).unwrap_or(u32::MAX);
                    sp.serving_endpoints = sorted_endpoints(all.iter().map(|e| e.addr()).collect());
                }
            }
            out.push(sp);
        }
    }
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(out)
}

/// An endpoint from a KPNG brain: ready, in the lists its scopes allow, on the port its
/// overrides (by Service port name) or the Service's target port name.
fn legacy_endpoint(
    sp: &mut ServicePort,
    mapping: &proto::PortMapping,
    ip: IpAddr,
    ep: &proto::Endpoint,
) {
    let name = if mapping.name.is_empty() {
        &mapping.target_port_name
    } else {
        &mapping.name
    };
    let port = if name.is_empty() {
        Some(mapping.target_port)
    } else {
        ep.port_overrides
            .iter()
            .find(|o| &o.name == name)
            .map(|o| o.port)
    };
    let Some(port) = port.and_then(|p| u16::try_from(p).ok()).filter(|p| *p > 0) else {
        return;
    };
    let scopes = ep.scopes.unwrap_or(proto::EndpointScopes {
        internal: true,
        external: true,
    });
    let endpoint = Endpoint {
        ip,
        port,
        is_local: ep.local,
        ready: true,
        serving: true,
        terminating: false,
    };
    if scopes.internal || scopes.external {
        sp.cluster_endpoints.push(endpoint.clone());
    }
    if ep.local {
        sp.local_endpoints.push(endpoint);
    }
}

/// Encodes the cluster's ServiceCIDR ranges.
pub fn encode_service_cidrs(cidrs: &[IpNet]) -> Bytes {
    Bytes::from(
        proto::KpngServiceCidRs {
            cid_rs: cidrs.iter().map(|n| n.to_string()).collect(),
        }
        .encode_to_vec(),
    )
}

/// Decodes the cluster's ServiceCIDR ranges (sorted, without duplicates).
pub fn decode_service_cidrs(value: &proto::KpngServiceCidRs) -> Result<Vec<IpNet>, DecodeError> {
    let mut cidrs = value
        .cid_rs
        .iter()
        .map(|raw| {
            raw.parse::<IpNet>()
                .map_err(|_| error("ServiceCIDRs", "CIDRs", format!("{raw:?} is not a CIDR")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    cidrs.sort();
    cidrs.dedup();
    Ok(cidrs)
}

/// Encodes the watching node's properties.
///
/// Every field of [`NodeState`] is named (no `..`): a field added to it does not build until it
/// is sent here (and decoded in [`decode_node`]) or said not to need to be.
pub fn encode_node(node: &NodeState) -> Bytes {
    let NodeState {
        name,
        known,
        ips,
        zone,
        pod_cidrs,
        deleting,
        to_be_deleted,
        // The rest is the watching node's own memory ([`kpng_model::NodeMemory`] on its side
        // recomputes each from what it was sent before and its wait for node IPs): the brain
        // sends the Node as it is now, so that a brain restart does not change them.
        ever_known: _,
        ips_kept: _,
        pod_cidrs_kept: _,
        nodeports_on_all_local: _,
    } = node;
    Bytes::from(
        proto::KpngNode {
            name: name.clone(),
            known: *known,
            i_ps: Some(ip_set(ips)),
            zone: zone.clone(),
            pod_cid_rs: pod_cidrs.iter().map(|n| n.to_string()).collect(),
            deleting: *deleting,
            to_be_deleted: *to_be_deleted,
        }
        .encode_to_vec(),
    )
}

/// Decodes the watching node's properties.
pub fn decode_node(node: &proto::KpngNode) -> Result<NodeState, DecodeError> {
    let what = format!("Node {}", node.name);
    let set = node.i_ps.as_ref();
    let mut ips = parse_ips(&what, "IPs", set.map_or(&[], |s| &s.v4))?;
    ips.extend(parse_ips(&what, "IPs", set.map_or(&[], |s| &s.v6))?);
    let pod_cidrs = node
        .pod_cid_rs
        .iter()
        .map(|raw| {
            raw.parse::<IpNet>()
                .map_err(|_| error(&what, "PodCIDRs", format!("{raw:?} is not a CIDR")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(NodeState {
        name: node.name.clone(),
        known: node.known,
        ips,
        zone: node.zone.clone(),
        pod_cidrs,
        deleting: node.deleting,
        to_be_deleted: node.to_be_deleted,
        // Not sent ([`encode_node`]): this node's [`kpng_model::NodeMemory`] sets them.
        ever_known: false,
        ips_kept: false,
        pod_cidrs_kept: false,
        nodeports_on_all_local: false,
    })
}

#[cfg(test)]
mod tests;

/// How many rejected objects a brain's report names (its total counts them all): the report
/// goes to every node, so a cluster full of broken objects must not make it large.
pub const REPORTED_REJECTIONS: usize = 100;

/// How many dropped values a brain's report names (its total counts them all), for the same
/// reason as [`REPORTED_REJECTIONS`].
pub const REPORTED_DROPPED: usize = 100;

/// A brain's report on its own input for its nodes: what it reads, its problems now, the
/// first [`REPORTED_REJECTIONS`] of the objects it rejects (in the model's order: by kind,
/// namespace and name) and the first [`REPORTED_DROPPED`] of the values it dropped from objects
/// it uses, each with how many there are.
pub fn brain_report<'a>(
    input: &kpng_model::input::InputState,
    rejected: impl ExactSizeIterator<Item = &'a kpng_model::records::Rejection>,
    dropped: impl Iterator<Item = (Option<&'a ServiceKey>, &'a kpng_model::Warning)>,
) -> proto::KpngBrainReport {
    let millis = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    };
    let total = rejected.len() as u64;
    let mut report = proto::KpngBrainReport {
        source: input.source.clone(),
        problems: input
            .problems
            .iter()
            .map(|(what, p)| proto::KpngInputProblem {
                what: what.clone(),
                message: p.message.clone(),
                since_unix_millis: millis(p.since),
            })
            .collect(),
        rejected: rejected
            .take(REPORTED_REJECTIONS)
            .map(|r| proto::KpngRejectedObject {
                kind: r.error.object.kind.as_str().to_string(),
                namespace: r.error.object.namespace.to_string(),
                name: r.error.object.name.to_string(),
                field: r.error.field.clone(),
                message: r.error.message.clone(),
                location: r.error.location.clone(),
                kept: r.kept,
                service: r.error.service.as_ref().map(ToString::to_string),
            })
            .collect(),
        rejected_total: total,
        dropped: Vec::new(),
        dropped_total: 0,
    };
    for (service, w) in dropped {
        report.dropped_total += 1;
        if report.dropped.len() < REPORTED_DROPPED {
            report.dropped.push(proto::KpngDroppedValue {
                kind: w.object.kind.as_str().to_string(),
                namespace: w.object.namespace.to_string(),
                name: w.object.name.to_string(),
                field: w.field.clone(),
                message: w.message.clone(),
                service: service.map(ToString::to_string),
            });
        }
    }
    report
}

/// A brain's report as a node keeps it (times before the epoch read as the epoch).
pub fn decode_brain_report(value: &proto::KpngBrainReport) -> kpng_model::input::BrainReport {
    use kpng_model::input::{BrainReport, InputProblem, ReportedDropped, ReportedRejection};
    let since = |ms: i64| {
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0))
    };
    BrainReport {
        source: value.source.clone(),
        problems: value
            .problems
            .iter()
            .map(|p| {
                (
                    p.what.clone(),
                    InputProblem {
                        message: p.message.clone(),
                        since: since(p.since_unix_millis),
                    },
                )
            })
            .collect(),
        rejected: value
            .rejected
            .iter()
            .map(|r| ReportedRejection {
                kind: r.kind.clone(),
                namespace: r.namespace.clone(),
                name: r.name.clone(),
                service: r.service.clone(),
                field: r.field.clone(),
                message: r.message.clone(),
                location: r.location.clone(),
                kept: r.kept,
            })
            .collect(),
        rejected_total: value.rejected_total.max(value.rejected.len() as u64),
        dropped: value
            .dropped
            .iter()
            .map(|d| ReportedDropped {
                kind: d.kind.clone(),
                namespace: d.namespace.clone(),
                name: d.name.clone(),
                service: d.service.clone(),
                field: d.field.clone(),
                message: d.message.clone(),
            })
            .collect(),
        dropped_total: value.dropped_total.max(value.dropped.len() as u64),
    }
}
