//! The pure planner: a Service port of the model, plus what HCN says about the network, → the
//! load balancers the port needs (kube-proxy winkernel's objects and flags); and the model's
//! diff plus what kpng knows HCN holds → the HCN operations of one sync.
//!
//! No I/O and no platform code: the whole Windows data model is decided here and tested on any
//! OS. Endpoint selection (topology, terminating fallback, traffic policies) is the model's
//! ([`ServicePort::internal_endpoints`], [`ServicePort::external_endpoints`]); the planner
//! never recomputes it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use kpng_model::{Family, NodeState, PortKey, Protocol, ServicePort};

use crate::schema::{
    LoadBalancer, Network, PortMapping, SchemaVersion, distribution, lb_flags, port_flags, protocol,
};

/// What the backend is configured with (the Windows flags).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HnsConfig {
    /// `--network-name`: the CNI's HNS network (kube-proxy's `KUBE_NETWORK`).
    pub network_name: String,
    /// `--enable-dsr`: direct server return for ClusterIPs and for externalTrafficPolicy Local
    /// frontends.
    pub enable_dsr: bool,
    /// `--source-vip`: the SNAT source of load-balanced traffic on an overlay network (an
    /// address the CNI reserved on this node); one per family at most.
    pub source_vips: Vec<IpAddr>,
    /// `--forward-healthcheck-vip`: per load-balancer ingress IP, also a load balancer from
    /// the ingress IP's health-check port to the host (the root HNS endpoint), so that a
    /// pass-through cloud load balancer probing the VIP reaches kpng's health server.
    pub forward_health_check_vip: bool,
    /// `--root-hnsendpoint-name`: the name of the CNI's HNS endpoint of the host's network
    /// namespace on the network (kube-proxy's default `cbr0`).
    pub root_hns_endpoint_name: String,
    /// The port of kpng's health server (`--healthz-bind-address`; 0: none): the health-check
    /// port of a Service without `healthCheckNodePort`.
    pub healthz_port: u16,
}

/// A configuration that cannot work on the network HNS has: the backend refuses to start with
/// it (as kube-proxy's winkernel does) instead of programming load balancers that do not work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// An Overlay network and no source VIP: load-balanced traffic leaving the node needs a
    /// SNAT source the CNI reserved on it; the node IP (L2Bridge's) is not one.
    #[error(
        "HNS network {network:?} is an Overlay network, whose load balancers need a source VIP \
         (the SNAT source of load-balanced traffic, an address the CNI reserved on this node): \
         set --source-vip or the configuration file's winkernel.sourceVip (kube-proxy refuses \
         to start likewise: \"source-vip flag not set\")"
    )]
    NoSourceVip {
        /// The network's name.
        network: String,
    },
}

impl HnsConfig {
    /// Checks this configuration against the network found (`view`): on Overlay a source VIP
    /// is required, as upstream winkernel's NewProxier requires `--source-vip` there.
    pub fn check(&self, network: &str, view: &NetworkView) -> Result<(), ConfigError> {
        if view.network_type == NetworkType::Overlay && self.source_vips.is_empty() {
            return Err(ConfigError::NoSourceVip {
                network: network.to_string(),
            });
        }
        Ok(())
    }
}

/// The HNS network type, as far as the proxy cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetworkType {
    /// VXLAN: remote endpoints carry their node's provider address.
    Overlay,
    /// L2Bridge (host-gw style): remote endpoints are plain addresses.
    L2Bridge,
    /// Anything else (NAT, Transparent, …): treated as L2Bridge.
    Other(String),
}

/// What the planner needs from HCN about the network: its type, the CNI's routes to other
/// nodes' pod subnets, and the CNI's local endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkView {
    /// The network's GUID.
    pub id: String,
    /// Its type.
    pub network_type: NetworkType,
    /// `RemoteSubnetRoute` policies: pod subnet → the node's provider address.
    pub routes: Vec<(IpNet, IpAddr)>,
    /// The CNI's endpoints on the network (not flagged remote), by IP.
    pub local: BTreeMap<IpAddr, String>,
    /// The root HNS endpoint (`--root-hnsendpoint-name`, found by name among the network's
    /// endpoints): its IP and ID.
    pub root: Option<(IpAddr, String)>,
    /// The network's pod subnets (`Ipams[].Subnets[].IpAddressPrefix`): which IP families
    /// the network carries; empty when HCN does not say.
    pub subnets: Vec<IpNet>,
}

impl NetworkView {
    /// The view of an HCN network (its endpoints are added by the caller).
    pub fn of(network: &Network) -> NetworkView {
        let network_type = match network.network_type.to_ascii_lowercase().as_str() {
            "overlay" => NetworkType::Overlay,
            "l2bridge" => NetworkType::L2Bridge,
            _ => NetworkType::Other(network.network_type.clone()),
        };
        let routes = network
            .policies
            .iter()
            .filter(|p| p.policy_type.eq_ignore_ascii_case("RemoteSubnetRoute"))
            .filter_map(|p| {
                let prefix = p
                    .settings
                    .get("DestinationPrefix")?
                    .as_str()?
                    .parse()
                    .ok()?;
                let pa = p.settings.get("ProviderAddress")?.as_str()?.parse().ok()?;
                Some((prefix, pa))
            })
            .collect();
        let subnets = network
            .extra
            .get("Ipams")
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
            .filter_map(|ipam| ipam.get("Subnets")?.as_array())
            .flatten()
            .filter_map(|subnet| subnet.get("IpAddressPrefix")?.as_str()?.parse().ok())
            .collect();
        NetworkView {
            id: crate::schema::normalize_id(&network.id),
            network_type,
            routes,
            local: BTreeMap::new(),
            root: None,
            subnets,
        }
    }

    /// The provider address (the remote node's IP) of a pod IP, from the CNI's routes; `None`
    /// for an address outside every pod subnet (kube-proxy: "assuming it is a public IP").
    pub fn provider_address(&self, ip: IpAddr) -> Option<IpAddr> {
        self.routes
            .iter()
            .filter(|(net, _)| net.contains(&ip))
            .max_by_key(|(net, _)| net.prefix_len())
            .map(|(_, pa)| *pa)
    }
}

/// The IP families the backend programs on a network, and the one it leaves out and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedFamilies {
    /// The families whose Service ports get load balancers.
    pub served: Vec<Family>,
    /// The family left out, with the reason in words (logged once, shown by `kpng status`).
    pub skipped: Option<(Family, String)>,
}

impl ServedFamilies {
    /// Whether ports of `family` get load balancers.
    pub fn serves(&self, family: Family) -> bool {
        self.served.contains(&family)
    }
}

/// Which IP families to program on the network `name` (`view`), as kube-proxy's winkernel
/// decides between dual-stack and single-stack (its `DualStackCompatible`): an Overlay
/// network is served single-stack ("Winoverlay does not support dual-stack, falling back to
/// single-stack"), in the node's primary family (its first IP's, as kube-proxy's
/// `PrimaryIPFamily`; without one, the family of the network's subnets, else IPv4). Beyond
/// upstream, a network whose subnets (`Ipams`) are all of one family is served in that family
/// only: HNS could not place the other family's endpoints on it, and load balancers for them
/// would only fail or serve nothing. A network whose subnets HCN does not list is served in
/// both, as before. (Upstream's other reason for single-stack, a Windows version without
/// dual-stack support, is not probed, as kpng does not probe HNS's version for DSR either.)
pub fn served_families(name: &str, view: &NetworkView, node_ips: &[IpAddr]) -> ServedFamilies {
    let has = |family: Family| view.subnets.iter().any(|s| Family::of(&s.addr()) == family);
    let word = |family: Family| match family {
        Family::V4 => "IPv4",
        Family::V6 => "IPv6",
    };
    let only = |keep: Family, skip: Family, why: String| ServedFamilies {
        served: vec![keep],
        skipped: Some((skip, why)),
    };
    let other = |f: Family| match f {
        Family::V4 => Family::V6,
        Family::V6 => Family::V4,
    };
    if view.network_type == NetworkType::Overlay {
        let primary = node_ips
            .first()
            .map(Family::of)
            .or_else(|| Family::ALL.into_iter().find(|f| has(*f) && !has(other(*f))))
            .unwrap_or(Family::V4);
        let skipped = other(primary);
        return only(
            primary,
            skipped,
            format!(
                "HNS network {name} is an Overlay network, which kube-proxy's winkernel serves \
                 single-stack (\"Winoverlay does not support dual-stack\"): {} Services \
                 only, the node's primary family; {} Service ports get no load balancer",
                word(primary),
                word(skipped)
            ),
        );
    }
    for family in Family::ALL {
        if !view.subnets.is_empty() && !has(family) {
            let subnets: Vec<String> = view.subnets.iter().map(|s| s.to_string()).collect();
            return only(
                other(family),
                family,
                format!(
                    "HNS network {name} has no {} subnet (its subnets: {}): {} Service ports \
                     get no load balancer",
                    word(family),
                    subnets.join(", "),
                    word(family)
                ),
            );
        }
    }
    ServedFamilies {
        served: Family::ALL.to_vec(),
        skipped: None,
    }
}

/// A load balancer's frontend: what HNS refuses twice ("port already exists"), so kpng keeps
/// at most one load balancer per frontend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Frontend {
    /// The VIP; `None` for a node port (every node address).
    pub vip: Option<IpAddr>,
    /// HCN protocol number.
    pub protocol: u32,
    /// The external port.
    pub port: u16,
    /// IPv6 (a node port exists once per family).
    pub ipv6: bool,
}

impl Frontend {
    /// The frontend of an HCN load balancer (its first VIP and port mapping).
    pub fn of(lb: &LoadBalancer) -> Option<Frontend> {
        let pm = lb.port_mappings.first()?;
        let vip = match lb.frontend_vips.first() {
            Some(v) => Some(v.parse().ok()?),
            None => None,
        };
        Some(Frontend {
            vip,
            protocol: pm.protocol,
            port: pm.external_port,
            ipv6: lb.flags & lb_flags::IPV6 != 0,
        })
    }
}

impl std::fmt::Display for Frontend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let proto = match self.protocol {
            protocol::TCP => "TCP",
            protocol::UDP => "UDP",
            protocol::SCTP => "SCTP",
            _ => "?",
        };
        match self.vip {
            Some(IpAddr::V6(v)) => write!(f, "[{v}]:{}/{proto}", self.port),
            Some(v) => write!(f, "{v}:{}/{proto}", self.port),
            None => write!(f, "node port {}/{proto}", self.port),
        }
    }
}

/// An endpoint a load balancer needs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum EndpointRef {
    /// One of the CNI's endpoints, found by IP.
    Local {
        /// Its IP.
        ip: IpAddr,
        /// Its HCN ID.
        id: String,
    },
    /// A pod on another node: a remote endpoint the proxy creates (once, shared by every load
    /// balancer that uses it).
    Remote {
        /// Its IP.
        ip: IpAddr,
        /// On overlay, the remote node's address (`ProviderAddress` policy).
        provider: Option<IpAddr>,
    },
}

impl EndpointRef {
    /// The endpoint's IP.
    pub fn ip(&self) -> IpAddr {
        match self {
            EndpointRef::Local { ip, .. } | EndpointRef::Remote { ip, .. } => *ip,
        }
    }
}

/// One load balancer a Service port needs, with its endpoints named by IP (remote endpoints
/// may not exist yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LbPlan {
    /// The port it serves.
    pub port_key: PortKey,
    /// Its frontend.
    pub frontend: Frontend,
    /// `SourceVIP`.
    pub source_vip: String,
    /// The endpoints' port.
    pub internal_port: u16,
    /// [`distribution`].
    pub distribution: u32,
    /// [`port_flags`].
    pub port_flags: u32,
    /// [`lb_flags`].
    pub lb_flags: u32,
    /// Its endpoints, sorted by IP.
    pub endpoints: Vec<EndpointRef>,
}

impl LbPlan {
    /// The HCN load balancer, given the IDs of its endpoints; `None` while one lacks an ID.
    pub fn to_hcn(&self, id_of: impl Fn(&EndpointRef) -> Option<String>) -> Option<LoadBalancer> {
        let ids = self
            .endpoints
            .iter()
            .map(id_of)
            .collect::<Option<Vec<_>>>()?;
        Some(
            LoadBalancer {
                id: String::new(),
                host_compute_endpoints: ids,
                source_vip: self.source_vip.clone(),
                frontend_vips: self.frontend.vip.iter().map(|v| v.to_string()).collect(),
                port_mappings: vec![PortMapping {
                    protocol: self.frontend.protocol,
                    internal_port: self.internal_port,
                    external_port: self.frontend.port,
                    distribution_type: self.distribution,
                    flags: self.port_flags,
                }],
                flags: self.lb_flags,
                schema_version: SchemaVersion::default(),
            }
            .content(),
        )
    }
}

/// HCN's protocol number.
pub fn hcn_protocol(p: Protocol) -> u32 {
    match p {
        Protocol::Tcp => protocol::TCP,
        Protocol::Udp => protocol::UDP,
        Protocol::Sctp => protocol::SCTP,
    }
}

/// Why (part of) a port gets no load balancer: logged by the backend, naming the port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanWarning {
    /// The port.
    pub port: PortKey,
    /// What happened.
    pub message: String,
}

/// The load balancers one Service port needs, as kube-proxy's winkernel mode builds them: one
/// for the ClusterIP, one for the node port (no frontend VIP), one per external IP and one per
/// load-balancer ingress IP. A frontend whose endpoint list is empty gets none (HNS refuses a
/// load balancer without endpoints: upstream PR #106936). The Service's preserve-DIP
/// (`ServicePort::preserve_destination`) restricts the node port and ingress IPs to local
/// endpoints and flags the ingress IPs (DSR, UseMux, PreserveDIP); with
/// `--forward-healthcheck-vip` each ingress IP also gets its health-check load balancer.
pub fn plan_port(
    port: &ServicePort,
    node: &NodeState,
    view: &NetworkView,
    config: &HnsConfig,
    warnings: &mut Vec<PlanWarning>,
) -> Vec<LbPlan> {
    let family = port.key.family;
    let ipv6 = family == Family::V6;
    let proto = hcn_protocol(port.key.protocol);
    let node_ip = node.ips.iter().copied().find(|ip| Family::of(ip) == family);
    let base_lb_flags = if ipv6 { lb_flags::IPV6 } else { lb_flags::NONE };
    let affinity = if port.session_affinity.is_some() {
        distribution::SOURCE_IP
    } else {
        distribution::NONE
    };
    // DSR for the frontends reached from outside with externalTrafficPolicy Local
    // (kube-proxy's `localTrafficDSR`).
    let local_dsr = config.enable_dsr && port.external_policy_local;
    let mut out = Vec::new();
    let mut add = |vip: Option<IpAddr>,
                   ext_port: u16,
                   eps: &[kpng_model::Endpoint],
                   lb_flags_extra: u32,
                   pm_flags: u32,
                   warnings: &mut Vec<PlanWarning>| {
        let mut refs = Vec::new();
        for ep in eps {
            if let Some(id) = view.local.get(&ep.ip) {
                refs.push(EndpointRef::Local {
                    ip: ep.ip,
                    id: id.clone(),
                });
            } else if ep.is_local {
                warnings.push(PlanWarning {
                    port: port.key.clone(),
                    message: format!(
                        "local endpoint {} has no HNS endpoint on the network (not created by \
                         the CNI yet); left out",
                        ep.ip
                    ),
                });
            } else {
                let provider = match view.network_type {
                    NetworkType::Overlay => view.provider_address(ep.ip).or(node_ip),
                    _ => None,
                };
                refs.push(EndpointRef::Remote {
                    ip: ep.ip,
                    provider,
                });
            }
        }
        refs.sort();
        refs.dedup_by(|a, b| a.ip() == b.ip());
        if refs.is_empty() {
            return;
        }
        // An HCN port mapping has one internal port: the first endpoint's (as upstream).
        let internal_port = eps.first().map(|e| e.port).unwrap_or(port.port);
        if eps.iter().any(|e| e.port != internal_port) {
            warnings.push(PlanWarning {
                port: port.key.clone(),
                message: format!(
                    "endpoints listen on different ports; HNS load balancers have one, using \
                     {internal_port}"
                ),
            });
        }
        let source = source_vip(view, config, node_ip, family, eps);
        out.push(LbPlan {
            port_key: port.key.clone(),
            frontend: Frontend {
                vip,
                protocol: proto,
                port: ext_port,
                ipv6,
            },
            source_vip: source,
            internal_port,
            distribution: affinity,
            port_flags: pm_flags,
            lb_flags: base_lb_flags | lb_flags_extra,
            endpoints: refs,
        });
    };
    let cluster_dsr = if config.enable_dsr {
        lb_flags::DSR
    } else {
        lb_flags::NONE
    };
    add(
        Some(port.cluster_ip),
        port.port,
        port.internal_endpoints(),
        cluster_dsr,
        port_flags::NONE,
        warnings,
    );
    let external_dsr = if local_dsr {
        lb_flags::DSR
    } else {
        lb_flags::NONE
    };
    // preserve-DIP (the `preserve-destination` annotation) turns off the routing mesh of the
    // node port and of the load-balancer IPs: only this node's endpoints (winkernel's
    // `hnsLocalEndpoints`), so that a health check through them answers for this node.
    let preserve_dip = port.preserve_destination;
    let local_external: Vec<kpng_model::Endpoint> = port
        .external_endpoints()
        .iter()
        .filter(|e| e.is_local)
        .cloned()
        .collect();
    let mesh_off = preserve_dip || local_dsr;
    let external_or_local = if mesh_off {
        &local_external[..]
    } else {
        port.external_endpoints()
    };
    if let Some(node_port) = port.node_port {
        add(
            None,
            node_port,
            external_or_local,
            external_dsr,
            port_flags::LOCAL_ROUTED_VIP | port_flags::VIP_EXTERNAL_IP,
            warnings,
        );
    }
    for ip in &port.external_ips {
        add(
            Some(*ip),
            port.port,
            port.external_endpoints(),
            external_dsr,
            port_flags::VIP_EXTERNAL_IP,
            warnings,
        );
    }
    // Load-balancer ingress IPs: DSR with preserve-DIP or local-traffic DSR; preserve-DIP
    // also sets the port mapping's UseMux and PreserveDIP flags (as winkernel).
    let (ingress_dsr, ingress_pm) = if preserve_dip {
        (
            lb_flags::DSR,
            port_flags::VIP_EXTERNAL_IP | port_flags::USE_MUX | port_flags::PRESERVE_DIP,
        )
    } else {
        (external_dsr, port_flags::VIP_EXTERNAL_IP)
    };
    for ip in &port.load_balancer_ips {
        add(
            Some(*ip),
            port.port,
            external_or_local,
            ingress_dsr,
            ingress_pm,
            warnings,
        );
    }
    out.extend(plan_health_checks(port, node, view, config, warnings));
    out
}

/// A load balancer's `SourceVIP`: `--source-vip`, except on overlay when an endpoint is
/// outside every pod subnet or is a node's own address (kube-proxy's rule): then the node IP.
fn source_vip(
    view: &NetworkView,
    config: &HnsConfig,
    node_ip: Option<IpAddr>,
    family: Family,
    eps: &[kpng_model::Endpoint],
) -> String {
    let configured = config
        .source_vips
        .iter()
        .copied()
        .find(|ip| Family::of(ip) == family);
    let needs_node_ip = view.network_type == NetworkType::Overlay
        && eps.iter().any(|e| {
            !e.is_local
                && match view.provider_address(e.ip) {
                    None => true,
                    Some(pa) => pa == e.ip,
                }
        });
    let source = if needs_node_ip {
        node_ip.or(configured)
    } else {
        configured.or(node_ip)
    };
    source.map(|s| s.to_string()).unwrap_or_default()
}

/// With `--forward-healthcheck-vip`, per load-balancer ingress IP: a load balancer from the
/// ingress IP's health-check port (the Service's `healthCheckNodePort`, else kpng's health
/// server port) to the root HNS endpoint, as winkernel: the Service's protocol, no DSR, no
/// affinity; preserve-DIP adds UseMux and PreserveDIP. Only while the Service has endpoints
/// somewhere (winkernel's `endpointsAvailableForLB`), and never for a port of 0.
fn plan_health_checks(
    port: &ServicePort,
    node: &NodeState,
    view: &NetworkView,
    config: &HnsConfig,
    warnings: &mut Vec<PlanWarning>,
) -> Vec<LbPlan> {
    if !config.forward_health_check_vip
        || port.load_balancer_ips.is_empty()
        || !port.has_any_endpoints
    {
        return Vec::new();
    }
    let health_port = port.health_check_node_port.unwrap_or(config.healthz_port);
    if health_port == 0 {
        return Vec::new();
    }
    let Some((root_ip, root_id)) = view.root.clone() else {
        warnings.push(PlanWarning {
            port: port.key.clone(),
            message: format!(
                "--forward-healthcheck-vip: no HNS endpoint named {:?}                  (--root-hnsendpoint-name) on the network; health checks of the ingress IPs                  are not forwarded",
                config.root_hns_endpoint_name
            ),
        });
        return Vec::new();
    };
    let family = port.key.family;
    let ipv6 = family == Family::V6;
    let node_ip = node.ips.iter().copied().find(|ip| Family::of(ip) == family);
    let source = source_vip(view, config, node_ip, family, port.external_endpoints());
    let port_flags = if port.preserve_destination {
        port_flags::USE_MUX | port_flags::PRESERVE_DIP
    } else {
        port_flags::NONE
    };
    port.load_balancer_ips
        .iter()
        .map(|ip| LbPlan {
            port_key: port.key.clone(),
            frontend: Frontend {
                vip: Some(*ip),
                protocol: hcn_protocol(port.key.protocol),
                port: health_port,
                ipv6,
            },
            source_vip: source.clone(),
            internal_port: health_port,
            distribution: distribution::NONE,
            port_flags,
            lb_flags: if ipv6 { lb_flags::IPV6 } else { lb_flags::NONE },
            endpoints: vec![EndpointRef::Local {
                ip: root_ip,
                id: root_id.clone(),
            }],
        })
        .collect()
}

/// A load balancer kpng knows HCN holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownLb {
    /// Its ID.
    pub id: String,
    /// Its content ([`LoadBalancer::content`]).
    pub content: LoadBalancer,
}

/// What kpng knows HCN holds, rebuilt from one enumerate of each kind on every full sync and
/// kept up to date by the backend's own calls in between.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Known {
    /// The network and the CNI's endpoints.
    pub view: Option<NetworkView>,
    /// Remote endpoints (created by kpng, or adopted), by IP.
    pub remote: BTreeMap<IpAddr, String>,
    /// Load balancers on the network, by frontend.
    pub lbs: BTreeMap<Frontend, KnownLb>,
    /// Load balancers on the network that have no place (a second one on a frontend, or an
    /// unreadable one): deleted by the next full sync.
    pub strays: BTreeSet<String>,
    /// The frontends each Service port had at the last sync.
    pub by_port: BTreeMap<PortKey, Vec<Frontend>>,
    /// How many known load balancers reference each endpoint ID.
    pub refs: BTreeMap<String, usize>,
}

impl Known {
    /// Records a load balancer (replacing whatever was at its frontend).
    pub fn insert_lb(&mut self, frontend: Frontend, lb: KnownLb) {
        self.remove_lb(&frontend);
        for id in &lb.content.host_compute_endpoints {
            *self.refs.entry(id.clone()).or_default() += 1;
        }
        self.lbs.insert(frontend, lb);
    }

    /// Forgets the load balancer at a frontend.
    pub fn remove_lb(&mut self, frontend: &Frontend) -> Option<KnownLb> {
        let lb = self.lbs.remove(frontend)?;
        for id in &lb.content.host_compute_endpoints {
            if let Some(n) = self.refs.get_mut(id) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.refs.remove(id);
                }
            }
        }
        Some(lb)
    }

    /// The ID of an endpoint, if HCN has it.
    pub fn endpoint_id(&self, ep: &EndpointRef) -> Option<String> {
        match ep {
            EndpointRef::Local { id, .. } => Some(id.clone()),
            EndpointRef::Remote { ip, .. } => self
                .remote
                .get(ip)
                .cloned()
                .or_else(|| self.view.as_ref()?.local.get(ip).cloned()),
        }
    }
}

/// One HCN operation of a sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Create a remote endpoint.
    CreateRemoteEndpoint {
        /// Its IP.
        ip: IpAddr,
        /// On overlay, its node's address.
        provider: Option<IpAddr>,
    },
    /// Delete a load balancer kpng no longer wants there.
    DeleteLoadBalancer {
        /// Its ID.
        id: String,
        /// Its frontend, when it had a place.
        frontend: Option<Frontend>,
    },
    /// Replace a load balancer whose content changed (HCN has no in-place update of a load
    /// balancer's endpoints: hcsshim's `AddEndpoint` also deletes and re-creates).
    ReplaceLoadBalancer {
        /// The old one's ID.
        old_id: String,
        /// The new one.
        plan: LbPlan,
    },
    /// Create a load balancer.
    CreateLoadBalancer {
        /// It.
        plan: LbPlan,
    },
    /// Delete a remote endpoint no load balancer uses any more.
    DeleteEndpoint {
        /// Its ID.
        id: String,
        /// Its IP.
        ip: IpAddr,
    },
}

/// The operations of one sync: make the load balancers of the `ports` named match the
/// snapshot (all of them, and everything else on the network, when `full`).
pub fn plan_ops(
    known: &Known,
    view: &NetworkView,
    snapshot: &kpng_model::Snapshot,
    ports: &BTreeSet<PortKey>,
    full: bool,
    config: &HnsConfig,
    warnings: &mut Vec<PlanWarning>,
) -> (Vec<Op>, BTreeMap<PortKey, Vec<Frontend>>) {
    let mut desired: BTreeMap<Frontend, LbPlan> = BTreeMap::new();
    let mut by_port: BTreeMap<PortKey, Vec<Frontend>> = BTreeMap::new();
    for key in ports {
        let Some(port) = snapshot.ports.get(key) else {
            by_port.insert(key.clone(), Vec::new());
            continue;
        };
        let plans = plan_port(port, &snapshot.node, view, config, warnings);
        by_port.insert(key.clone(), plans.iter().map(|p| p.frontend).collect());
        for plan in plans {
            if let Some(other) = desired.get(&plan.frontend) {
                let same = LbPlan {
                    port_key: other.port_key.clone(),
                    ..plan.clone()
                } == *other;
                if same {
                    // The same load balancer (the health check of an ingress IP shared by
                    // two ports of a Service): one is enough.
                    continue;
                }
                // The model's claims keep frontends unique; never program two.
                warnings.push(PlanWarning {
                    port: key.clone(),
                    message: format!(
                        "frontend {} is also {}'s; left to it",
                        plan.frontend, other.port_key
                    ),
                });
                continue;
            }
            desired.insert(plan.frontend, plan);
        }
    }
    // The frontends these ports had: everything on the network for a full sync.
    let previous: BTreeSet<Frontend> = if full {
        known.lbs.keys().copied().collect()
    } else {
        ports
            .iter()
            .filter_map(|k| known.by_port.get(k))
            .flatten()
            .copied()
            .collect()
    };
    let mut ops = Vec::new();
    let mut refs = known.refs.clone();
    let unref = |refs: &mut BTreeMap<String, usize>, lb: &KnownLb| {
        for id in &lb.content.host_compute_endpoints {
            if let Some(n) = refs.get_mut(id) {
                *n = n.saturating_sub(1);
            }
        }
    };
    // Remote endpoints to create, once each.
    let mut creating = BTreeSet::new();
    for plan in desired.values() {
        for ep in &plan.endpoints {
            if let EndpointRef::Remote { ip, provider } = ep
                && known.endpoint_id(ep).is_none()
                && creating.insert(*ip)
            {
                ops.push(Op::CreateRemoteEndpoint {
                    ip: *ip,
                    provider: *provider,
                });
            }
        }
    }
    // On overlay, every ClusterIP is a remote endpoint of its own on the node's provider
    // address (as winkernel does, so that the VIP is routable in the overlay), referenced by no
    // load balancer and kept while a Service port has that ClusterIP.
    let overlay = view.network_type == NetworkType::Overlay;
    let all_vips: BTreeSet<IpAddr> = if overlay {
        snapshot.ports.values().map(|p| p.cluster_ip).collect()
    } else {
        BTreeSet::new()
    };
    if overlay {
        for key in ports {
            let Some(port) = snapshot.ports.get(key) else {
                continue;
            };
            let vip = port.cluster_ip;
            let node_ip = snapshot
                .node
                .ips
                .iter()
                .copied()
                .find(|ip| Family::of(ip) == Family::of(&vip));
            let exists = known.remote.contains_key(&vip) || view.local.contains_key(&vip);
            if !exists && creating.insert(vip) {
                ops.push(Op::CreateRemoteEndpoint {
                    ip: vip,
                    provider: node_ip,
                });
            }
        }
    }
    // Frontends that ports outside this sync still want (a shared health check).
    let kept: BTreeSet<Frontend> = if full {
        BTreeSet::new()
    } else {
        known
            .by_port
            .iter()
            .filter(|(k, _)| !ports.contains(*k))
            .flat_map(|(_, f)| f.iter().copied())
            .collect()
    };
    // Load balancers that go.
    for frontend in &previous {
        if desired.contains_key(frontend) || kept.contains(frontend) {
            continue;
        }
        if let Some(lb) = known.lbs.get(frontend) {
            unref(&mut refs, lb);
            ops.push(Op::DeleteLoadBalancer {
                id: lb.id.clone(),
                frontend: Some(*frontend),
            });
        }
    }
    if full {
        for id in &known.strays {
            ops.push(Op::DeleteLoadBalancer {
                id: id.clone(),
                frontend: None,
            });
        }
    }
    // Load balancers that change or come.
    let mut creates = Vec::new();
    for (frontend, plan) in desired {
        let content = plan.to_hcn(|ep| known.endpoint_id(ep));
        // Every endpoint that exists and stays in use, even while the load balancer waits
        // for a new remote endpoint.
        for id in plan.endpoints.iter().filter_map(|ep| known.endpoint_id(ep)) {
            *refs.entry(id).or_default() += 1;
        }
        match known.lbs.get(&frontend) {
            Some(lb) if content.as_ref() == Some(&lb.content) => {
                // Unchanged: the refs it holds stay, not counted twice.
                for id in &lb.content.host_compute_endpoints {
                    if let Some(n) = refs.get_mut(id) {
                        *n = n.saturating_sub(1);
                    }
                }
            }
            Some(lb) => {
                unref(&mut refs, lb);
                ops.push(Op::ReplaceLoadBalancer {
                    old_id: lb.id.clone(),
                    plan,
                });
            }
            None => creates.push(Op::CreateLoadBalancer { plan }),
        }
    }
    ops.extend(creates);
    // Remote endpoints nothing uses any more (only those this sync touched, unless full).
    for (ip, id) in &known.remote {
        let used = refs.get(id).copied().unwrap_or(0) > 0;
        let touched = full || known.refs.get(id).copied().unwrap_or(0) > 0;
        if !used && touched && !creating.contains(ip) && !all_vips.contains(ip) {
            ops.push(Op::DeleteEndpoint {
                id: id.clone(),
                ip: *ip,
            });
        }
    }
    (ops, by_port)
}
