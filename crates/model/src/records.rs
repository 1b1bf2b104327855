//! The records sources hand to the model: Kubernetes objects reduced, once and at the source,
//! to what proxying needs (`kpng-k8s` converts them). Nothing here knows a Kubernetes type, so
//! the model, the contract and every backend build without `k8s-openapi`.
//!
//! Two kinds of problems are distinguished, as kube-proxy does:
//! - a [`ConversionError`] makes the whole object unusable (no name, a port out of range, an
//!   unknown protocol). The source sends it as [`crate::Object::Rejected`] and the model keeps
//!   the object's previous good version, so a broken update never tears down working rules.
//! - a [`Warning`] drops one bad value (an unparseable external IP, source range or endpoint
//!   address) and keeps the rest, exactly as upstream ignores such values with a log line; the
//!   source logs it.
//!
//! Both name the object and the field, so an operator can find the problem in one look.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::event::ObjectRef;
use crate::key::{Family, Name, Protocol, ServiceKey};
use crate::service_port::SessionAffinity;

/// An object that cannot be used at all; the model keeps its previous version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{object}{}: field {field}: {message}", location_suffix(location))]
pub struct ConversionError {
    /// The object at fault.
    pub object: ObjectRef,
    /// The field path at fault (`spec.ports[0].port`).
    pub field: String,
    /// What is wrong with it.
    pub message: String,
    /// Where the source found the object, when that says more than its name (a manifest's
    /// file, document and line: `cluster.yaml: document 3 (line 41)`), so the operator can go
    /// straight to it.
    pub location: Option<String>,
    /// The Service the object concerns, when it names one validly: a Service's own key, an
    /// EndpointSlice's owner (its `kubernetes.io/service-name` label). Carried from where the
    /// error is made, as the record that would say it is not there: `kpng status NS/NAME`
    /// shows the rejection of the Service's own slices under it, where an operator debugging
    /// that Service looks (a slice rejection named only the slice, and was left out). Boxed:
    /// every conversion returns this error type, and it stays small (clippy's
    /// `result_large_err`).
    pub service: Option<Box<ServiceKey>>,
}

/// A rejected object as the model answered it: whether it still uses a last good version or
/// has none (an object that never converted, such as a new manifest entry with a typo), so the
/// operator reads which one is the case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// What made the object unusable.
    pub error: ConversionError,
    /// Whether the model holds an earlier version of the object, which stays in use.
    pub kept: bool,
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.kept {
            write!(f, "{}; keeping its last good version", self.error)
        } else {
            write!(
                f,
                "{}; not used (there is no earlier version of it to keep)",
                self.error
            )
        }
    }
}

fn location_suffix(location: &Option<String>) -> String {
    location
        .as_ref()
        .map(|at| format!(" ({at})"))
        .unwrap_or_default()
}

/// A value that was ignored; the rest of the object is used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// The object holding the value.
    pub object: ObjectRef,
    /// The field path of the value.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: field {}: {} (ignored)",
            self.object, self.field, self.message
        )
    }
}

/// Why a Service gets no rules at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ignored {
    /// `clusterIP` is empty or `None`.
    Headless,
    /// `type: ExternalName`.
    ExternalName,
}

/// The Service annotation that asks for Windows preserve-DIP (kube-proxy winkernel's
/// `preserve-destination`; only the value `"true"` enables it). Named here because two
/// crates read it: `kpng-k8s` (from the Service) and `kpng-api` (from KPNG's `Annotations`).
pub const ANNOTATION_PRESERVE_DESTINATION: &str = "preserve-destination";

/// One entry of `spec.ports`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// The port's name; endpoints match by name and protocol.
    pub name: Name,
    /// The protocol.
    pub protocol: Protocol,
    /// The Service port number.
    pub port: u16,
    /// The node port, if allocated.
    pub node_port: Option<u16>,
    /// `targetPort` (unset: the Service port, as the API server defaults it).
    pub target_port: crate::TargetPort,
}

/// A Service reduced to what proxying needs (all families together).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceInfo {
    /// Namespace and name.
    pub key: ServiceKey,
    /// Set when the Service gets no rules (headless, ExternalName).
    pub ignored: Option<Ignored>,
    /// The `service.kubernetes.io/service-proxy-name` label, if any.
    pub proxy_name_label: Option<String>,
    /// Whether the `service.kubernetes.io/headless` label is present.
    pub headless_label: bool,
    /// `spec.clusterIPs` (or `spec.clusterIP`), at most one per family.
    pub cluster_ips: Vec<IpAddr>,
    /// `spec.ports`.
    pub ports: Vec<PortInfo>,
    /// `spec.externalIPs`.
    pub external_ips: Vec<IpAddr>,
    /// Load-balancer ingress IPs with `ipMode` unset or `VIP`.
    pub load_balancer_ips: Vec<IpAddr>,
    /// `spec.loadBalancerSourceRanges`, canonical.
    pub source_ranges: Vec<IpNet>,
    /// ClientIP affinity.
    pub session_affinity: Option<SessionAffinity>,
    /// externalTrafficPolicy Local on a NodePort or LoadBalancer Service.
    pub external_policy_local: bool,
    /// internalTrafficPolicy Local.
    pub internal_policy_local: bool,
    /// `spec.healthCheckNodePort`, only when the Service needs a health check.
    pub health_check_node_port: Option<u16>,
    /// The `preserve-destination: "true"` annotation (Windows preserve-DIP: traffic to the
    /// load-balancer IPs reaches the pod with the VIP as destination). Only the HNS backend
    /// reads it.
    pub preserve_destination: bool,
    /// `metadata.creationTimestamp`: when two Services claim the same ClusterIP port or node
    /// port, the oldest keeps it (`None`, as in a hand-written manifest, counts as the newest).
    pub created: Option<std::time::SystemTime>,
    /// Addresses the Service shows that get no rules on purpose, as in kube-proxy: an
    /// ExternalName Service's `clusterIP(s)` (the API server refuses them; a hand-written
    /// manifest may have one) and load-balancer ingress IPs with `ipMode: Proxy` (the load
    /// balancer delivers to the nodes' own addresses). Only `kpng trace` reads them, to name
    /// the Service instead of "not a Service address". Boxed: almost every Service has none.
    pub not_proxied_ips: Option<Box<[IpAddr]>>,
    /// Values the conversion dropped from the Service, the rest being used (an `fe80::1%eth0`
    /// external IP): the model keeps them apart ([`crate::cluster::ClusterModel::dropped`])
    /// for `kpng status`, which otherwise said the input was fine while the log warned.
    pub dropped: Dropped,
}

/// Values a conversion dropped from an object, with the field and why (`None`: nothing).
/// Boxed, as almost every object has none.
pub type Dropped = Option<Box<[Warning]>>;

/// The [`Dropped`] of these warnings.
pub fn dropped(warnings: &[Warning]) -> Dropped {
    (!warnings.is_empty()).then(|| warnings.to_vec().into_boxed_slice())
}

impl ServiceInfo {
    /// Gives back the spare capacity of its lists. A list built by pushing keeps room for
    /// four entries (a 17-byte `IpAddr` list of one takes 80 bytes instead of 32); the model
    /// keeps every Service for its lifetime, so it stores them exact (docs/benchmarks.md,
    /// "Memory at 30k × 4").
    pub fn shrink_to_fit(&mut self) {
        self.cluster_ips.shrink_to_fit();
        self.ports.shrink_to_fit();
        self.external_ips.shrink_to_fit();
        self.load_balancer_ips.shrink_to_fit();
        self.source_ranges.shrink_to_fit();
    }
}

/// One port of an EndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlicePort {
    /// The port name (matches a Service port name).
    pub name: Name,
    /// The protocol.
    pub protocol: Protocol,
    /// The endpoint port number (the DNAT target).
    pub port: u16,
}

/// One endpoint of an EndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceEndpoint {
    /// `addresses[0]`.
    pub ip: IpAddr,
    /// `nodeName`.
    pub node_name: Option<Name>,
    /// `conditions.ready`, nil = true.
    pub ready: bool,
    /// `conditions.serving`, nil = true.
    pub serving: bool,
    /// `conditions.terminating`, nil = false.
    pub terminating: bool,
    /// Its topology hints; `None` when it has none, as almost every endpoint. Boxed: two
    /// empty `Vec`s inline cost 48 bytes per endpoint, a third of the model at 30k Services
    /// × 4 endpoints (docs/benchmarks.md, "Memory at 30k × 4").
    pub hints: Option<Box<TopologyHints>>,
}

impl SliceEndpoint {
    /// `hints.forZones[].name` (empty without hints).
    pub fn zone_hints(&self) -> &[String] {
        self.hints.as_deref().map_or(&[], |h| &h.zones)
    }

    /// `hints.forNodes[].name` (empty without hints).
    pub fn node_hints(&self) -> &[String] {
        self.hints.as_deref().map_or(&[], |h| &h.nodes)
    }

    /// Whether the endpoint carries any topology hint.
    pub fn has_hints(&self) -> bool {
        self.hints.is_some()
    }
}

/// The topology hints of one endpoint. Never both empty inside a [`SliceEndpoint`]: an
/// endpoint without hints has `hints: None` ([`TopologyHints::boxed`] keeps it so).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TopologyHints {
    /// `hints.forZones[].name`.
    pub zones: Vec<String>,
    /// `hints.forNodes[].name`.
    pub nodes: Vec<String>,
}

impl TopologyHints {
    /// The hints as a [`SliceEndpoint`] holds them: `None` when both lists are empty.
    pub fn boxed(mut zones: Vec<String>, mut nodes: Vec<String>) -> Option<Box<TopologyHints>> {
        if zones.is_empty() && nodes.is_empty() {
            return None;
        }
        zones.shrink_to_fit();
        nodes.shrink_to_fit();
        Some(Box::new(TopologyHints { zones, nodes }))
    }
}

/// An EndpointSlice reduced to what proxying needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceInfo {
    /// The slice's namespace.
    pub namespace: Name,
    /// The slice's own name (unique within the namespace).
    pub name: Name,
    /// `addressType` as a family; `None` for `FQDN` slices, which carry no usable endpoint.
    pub family: Option<Family>,
    /// The Service it belongs to (`kubernetes.io/service-name` label); `None` for slices no
    /// Service owns, which are ignored.
    pub service: Option<ServiceKey>,
    /// Usable ports (nil names and nil/0 ports are dropped, as upstream does).
    pub ports: Vec<SlicePort>,
    /// Endpoints with a parseable first address.
    pub endpoints: Vec<SliceEndpoint>,
    /// Values the conversion dropped (an endpoint address of the wrong family), the rest
    /// being used; see [`ServiceInfo::dropped`].
    pub dropped: Dropped,
}

impl SliceInfo {
    /// Gives back the spare capacity of its lists (see [`ServiceInfo::shrink_to_fit`]).
    pub fn shrink_to_fit(&mut self) {
        self.ports.shrink_to_fit();
        self.endpoints.shrink_to_fit();
    }
}

/// A Node reduced to what proxying needs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeInfo {
    /// The Node's name.
    pub name: String,
    /// InternalIP addresses, in status order.
    pub internal_ips: Vec<IpAddr>,
    /// ExternalIP addresses, in status order.
    pub external_ips: Vec<IpAddr>,
    /// The `topology.kubernetes.io/zone` label.
    pub zone: Option<String>,
    /// `spec.podCIDRs` (or `spec.podCIDR`).
    pub pod_cidrs: Vec<IpNet>,
    /// Whether `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// Whether the autoscaler's to-be-deleted taint is present.
    pub to_be_deleted: bool,
}

/// A ServiceCIDR reduced to its ranges.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServiceCidrInfo {
    /// The object's name (ServiceCIDRs are cluster-scoped).
    pub name: String,
    /// `spec.cidrs`, canonical.
    pub cidrs: Vec<IpNet>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_are_boxed_only_when_there_are_some() {
        assert_eq!(TopologyHints::boxed(Vec::new(), Vec::new()), None);
        let ep = SliceEndpoint {
            ip: std::net::IpAddr::from([10, 0, 0, 1]),
            node_name: None,
            ready: true,
            serving: true,
            terminating: false,
            hints: TopologyHints::boxed(vec!["zone-a".into()], Vec::new()),
        };
        assert!(ep.has_hints());
        assert_eq!(ep.zone_hints(), ["zone-a".to_string()]);
        assert!(ep.node_hints().is_empty());
        let bare = SliceEndpoint { hints: None, ..ep };
        assert!(!bare.has_hints());
        assert!(bare.zone_hints().is_empty());
    }
}
