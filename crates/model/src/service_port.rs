//! The node-local view of one Service port in one family: what a backend programs.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use serde::Serialize;

use crate::key::{Name, PortKey};

/// serde's `skip_serializing_if` for flags that are usually off.
fn is_false(b: &bool) -> bool {
    !*b
}

/// One endpoint (a backend address) of a Service port, as seen from this node.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Endpoint {
    /// The endpoint's IP (`addresses[0]` of the EndpointSlice endpoint).
    pub ip: IpAddr,
    /// The DNAT target port: the EndpointSlice port number, not the Service's `targetPort`.
    pub port: u16,
    /// Whether the endpoint runs on this node (`nodeName` equals our node name).
    pub is_local: bool,
    /// `conditions.ready` (nil means true).
    pub ready: bool,
    /// `conditions.serving` (nil means true).
    pub serving: bool,
    /// `conditions.terminating` (nil means false).
    pub terminating: bool,
}

impl Endpoint {
    /// The endpoint as a socket address (what a DNAT rule targets).
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.port)
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.addr())
    }
}

/// A Service port's `spec.ports[].targetPort`: where its Pods listen, by number or by the
/// name of a container port (each Pod resolves the name itself).
///
/// Why it is kept: the DNAT target is each endpoint's own port ([`Endpoint::port`]), so no
/// backend of kpng reads it; KPNG's API (`PortMapping.TargetPort` / `TargetPortName`) sends
/// it, and an out-of-process backend written against KPNG's client helpers maps endpoints
/// with it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub enum TargetPort {
    /// A port number (an unset `targetPort` is the Service port, as the API server defaults it).
    Number(u16),
    /// The name of a container port.
    Name(Name),
}

/// ClientIP session affinity: keep a client on one endpoint for `timeout_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct SessionAffinity {
    /// `sessionAffinityConfig.clientIP.timeoutSeconds` (API default 10800).
    pub timeout_seconds: u32,
}

/// Everything a backend needs to program one Service port in one IP family.
///
/// All addresses are of [`PortKey::family`]; lists are sorted and de-duplicated so that two
/// equal states compare equal and render identically.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServicePort {
    /// Which Service port, protocol and family this is.
    pub key: PortKey,
    /// The ClusterIP of this family.
    pub cluster_ip: IpAddr,
    /// The Service port number clients connect to.
    pub port: u16,
    /// The node port, when the Service has one.
    pub node_port: Option<u16>,
    /// `spec.ports[].targetPort`, for the API only (see [`TargetPort`]). Left out of the
    /// serialized form: no backend's output depends on it.
    #[serde(skip)]
    pub target_port: TargetPort,
    /// `spec.externalIPs` of this family.
    pub external_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress[].ip` of this family whose `ipMode` is unset or `VIP`.
    pub load_balancer_ips: Vec<IpAddr>,
    /// `spec.loadBalancerSourceRanges` of this family (canonical networks). They apply to the
    /// load-balancer IPs only.
    pub source_ranges: Vec<IpNet>,
    /// ClientIP affinity, when enabled.
    pub session_affinity: Option<SessionAffinity>,
    /// externalTrafficPolicy Local on a NodePort/LoadBalancer Service.
    pub external_policy_local: bool,
    /// internalTrafficPolicy Local.
    pub internal_policy_local: bool,
    /// The health-check node port (LoadBalancer with externalTrafficPolicy Local only).
    pub health_check_node_port: Option<u16>,
    /// The Service's `preserve-destination: "true"` annotation: on Windows (HNS) the
    /// load-balancer IPs' load balancers deliver with the VIP as destination (preserve-DIP,
    /// with DSR) and to local endpoints only. Other backends ignore it. Left out of the
    /// serialized form when false, so outputs of Services without it do not change.
    #[serde(skip_serializing_if = "is_false")]
    pub preserve_destination: bool,
    /// Endpoints for cluster-policy traffic (topology and terminating fallback applied). Empty when
    /// the port never uses cluster policy.
    pub cluster_endpoints: Vec<Endpoint>,
    /// Endpoints for local-policy traffic. Empty when the port never uses local policy.
    pub local_endpoints: Vec<Endpoint>,
    /// Whether any usable endpoint exists anywhere in the cluster: decides REJECT (no) vs DROP
    /// (yes, but none usable for this policy).
    pub has_any_endpoints: bool,
    /// Number of local endpoints that are ready (terminating excluded): the health-check answer.
    pub local_ready_endpoints: u32,
    /// Every *serving* endpoint (`IP:port`, the DNAT target), whatever its policy, topology hints,
    /// locality or terminating state; sorted. UDP conntrack entries to this port whose reply
    /// source is none of these are stale (kube-proxy's conntrack reconciler).
    pub serving_endpoints: Vec<SocketAddr>,
}

impl ServicePort {
    /// Whether two states of a port differ only in their endpoints: the frontend (IPs, ports,
    /// policies, affinity) is the same. Used to tell an endpoint change from a Service change
    /// in the sync log.
    pub fn same_frontend(&self, other: &ServicePort) -> bool {
        // Field by field, without copying the endpoint lists (a sync may carry thousands of
        // changed ports); destructured so that a new field must be sorted into one side.
        let ServicePort {
            key,
            cluster_ip,
            port,
            node_port,
            target_port,
            external_ips,
            load_balancer_ips,
            source_ranges,
            session_affinity,
            external_policy_local,
            internal_policy_local,
            health_check_node_port,
            preserve_destination,
            cluster_endpoints: _,
            local_endpoints: _,
            has_any_endpoints: _,
            local_ready_endpoints: _,
            serving_endpoints: _,
        } = self;
        *key == other.key
            && *cluster_ip == other.cluster_ip
            && *port == other.port
            && *node_port == other.node_port
            && *target_port == other.target_port
            && *external_ips == other.external_ips
            && *load_balancer_ips == other.load_balancer_ips
            && *source_ranges == other.source_ranges
            && *session_affinity == other.session_affinity
            && *external_policy_local == other.external_policy_local
            && *internal_policy_local == other.internal_policy_local
            && *health_check_node_port == other.health_check_node_port
            && *preserve_destination == other.preserve_destination
    }

    /// A port of `key` on `cluster_ip:port` with nothing else: no node port, external or
    /// load-balancer IPs, policies, affinity or endpoints, and `port` as its target port. Tests
    /// and tools fill in the rest with struct update syntax.
    pub fn new(key: PortKey, cluster_ip: std::net::IpAddr, port: u16) -> ServicePort {
        ServicePort {
            key,
            cluster_ip,
            port,
            node_port: None,
            target_port: TargetPort::Number(port),
            external_ips: Vec::new(),
            load_balancer_ips: Vec::new(),
            source_ranges: Vec::new(),
            session_affinity: None,
            external_policy_local: false,
            internal_policy_local: false,
            health_check_node_port: None,
            preserve_destination: false,
            cluster_endpoints: Vec::new(),
            local_endpoints: Vec::new(),
            has_any_endpoints: false,
            local_ready_endpoints: 0,
            serving_endpoints: Vec::new(),
        }
    }

    /// Whether traffic can reach this port from outside the cluster network (node port,
    /// external IPs or load-balancer IPs): upstream's `ExternallyAccessible`.
    pub fn externally_accessible(&self) -> bool {
        self.node_port.is_some()
            || !self.external_ips.is_empty()
            || !self.load_balancer_ips.is_empty()
    }

    /// Whether cluster-policy endpoints are ever used: upstream's `UsesClusterEndpoints`.
    pub fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_policy_local || self.externally_accessible()
    }

    /// Whether local-policy endpoints are ever used: upstream's `UsesLocalEndpoints`.
    pub fn uses_local_endpoints(&self) -> bool {
        self.internal_policy_local || (self.external_policy_local && self.externally_accessible())
    }

    /// The endpoints ClusterIP traffic goes to (local ones under internalTrafficPolicy Local).
    pub fn internal_endpoints(&self) -> &[Endpoint] {
        if self.internal_policy_local {
            &self.local_endpoints
        } else {
            &self.cluster_endpoints
        }
    }

    /// The endpoints external traffic (node port, external and LB IPs) goes to.
    pub fn external_endpoints(&self) -> &[Endpoint] {
        if self.external_policy_local {
            &self.local_endpoints
        } else {
            &self.cluster_endpoints
        }
    }

    /// The union of cluster and local endpoints, sorted: what this node can ever DNAT to.
    pub fn all_reachable_endpoints(&self) -> Vec<Endpoint> {
        let mut all: Vec<Endpoint> = self
            .cluster_endpoints
            .iter()
            .chain(self.local_endpoints.iter())
            .cloned()
            .collect();
        crate::categorize::sort_endpoints(&mut all);
        all.dedup_by(|a, b| a.addr() == b.addr());
        all
    }
}
