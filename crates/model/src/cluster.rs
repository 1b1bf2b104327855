//! The node-independent layer: every converted object, for any number of nodes.
//!
//! [`ClusterModel`] stores Services, EndpointSlices and Nodes once, converted, and reports which
//! Services and Nodes an event touched. It does not compute anything node-specific: the
//! node-local [`crate::Model`] and the API server's per-node views both evaluate
//! [`ServiceSource::ports_for`] for the node they serve, so one cluster state can serve one node
//! (in process) or a thousand (a brain).
//!
//! Each Service's inputs (the Service and its slices) live in one [`Arc<ServiceSource>`], changed
//! copy-on-write: whoever still holds an old version (a client that has not yet received the
//! change) keeps it alive, and nobody else pays for it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use crate::build::service_ports;
use crate::convert::{self, ConversionError, NodeInfo, ServiceInfo, SliceInfo, Warning};
use crate::event::{Event, Kind, Object, ObjectRef};
use crate::key::ServiceKey;
use crate::node::NodeState;
use crate::service_port::ServicePort;

/// Configuration that is the same for every node.
#[derive(Debug, Clone, Default)]
pub struct ClusterConfig {
    /// `--service-proxy-name`: Services labelled `service.kubernetes.io/service-proxy-name` with
    /// this value are ours; any other value means another proxy owns them.
    pub service_proxy_name: Option<String>,
    /// Serve only this node: endpoint node names other than it are dropped at conversion and
    /// other Nodes are not stored (a node-local model's memory saving). `None` keeps everything
    /// (a brain serving every node).
    pub only_node: Option<String>,
}

/// The inputs of one Service: the Service (once seen) and its EndpointSlices, sorted by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceSource {
    info: Option<ServiceInfo>,
    slices: Vec<SliceInfo>,
    owned: bool,
}

impl ServiceSource {
    /// Every Service port (per port and family) as `node` must program it; empty when the
    /// Service is unknown, not ours, headless or ExternalName.
    pub fn ports_for(&self, node: &NodeState) -> Vec<ServicePort> {
        match &self.info {
            Some(info) if self.owned => service_ports(info, &self.slices, node),
            _ => Vec::new(),
        }
    }

    /// Whether the view of this Service depends on which node looks at it: an endpoint runs on
    /// `node_name`, or some endpoint carries topology hints. Otherwise every node sees what an
    /// anonymous node sees ([`NodeState::default`]), so a brain computes that view once.
    pub fn depends_on_node(&self, node_name: &str) -> bool {
        self.slices
            .iter()
            .flat_map(|s| s.endpoints.iter())
            .any(|e| {
                !e.zone_hints.is_empty()
                    || !e.node_hints.is_empty()
                    || (!node_name.is_empty() && e.node_name.as_deref() == Some(node_name))
            })
    }

    fn is_empty(&self) -> bool {
        self.info.is_none() && self.slices.is_empty()
    }
}

/// What applying one event to a [`ClusterModel`] touched.
#[derive(Debug, Default)]
pub struct ClusterOutcome {
    /// Services whose inputs changed (their views must be recomputed).
    pub services: BTreeSet<ServiceKey>,
    /// Nodes whose object changed or disappeared.
    pub nodes: BTreeSet<String>,
    /// Values that were ignored (the rest of their object was used).
    pub warnings: Vec<Warning>,
    /// Objects that could not be used; their previous version (if any) was kept.
    pub errors: Vec<ConversionError>,
    /// Objects accepted.
    pub applied: usize,
    /// Kinds whose complete list this event finished ([`Event::Replace`], [`Event::ListDone`]).
    pub listed: Vec<Kind>,
}

/// A streamed list ([`Event::ListStart`] … [`Event::ListDone`]) in progress.
#[derive(Debug, Default)]
struct Listing {
    kinds: Vec<Kind>,
    seen: HashSet<ObjectRef>,
    services: BTreeSet<ServiceKey>,
    nodes: BTreeSet<String>,
}

/// Every converted object of the cluster, with no node-specific computation.
#[derive(Debug, Default)]
pub struct ClusterModel {
    config: ClusterConfig,
    sources: HashMap<ServiceKey, Arc<ServiceSource>>,
    /// Every known slice (namespace, name) → the Service it belongs to (if any).
    slice_owners: HashMap<(String, String), Option<ServiceKey>>,
    nodes: HashMap<String, Arc<NodeInfo>>,
    listing: Option<Listing>,
}

impl ClusterModel {
    /// An empty cluster.
    pub fn new(config: ClusterConfig) -> ClusterModel {
        ClusterModel {
            config,
            ..ClusterModel::default()
        }
    }

    /// The inputs of one Service, if any object of it is known.
    pub fn source(&self, key: &ServiceKey) -> Option<&Arc<ServiceSource>> {
        self.sources.get(key)
    }

    /// Every Service with known inputs, in no particular order.
    pub fn sources(&self) -> impl Iterator<Item = (&ServiceKey, &Arc<ServiceSource>)> {
        self.sources.iter()
    }

    /// The Node object of this name, if known.
    pub fn node(&self, name: &str) -> Option<&Arc<NodeInfo>> {
        self.nodes.get(name)
    }

    /// Applies one event and reports what it touched.
    pub fn apply(&mut self, event: Event) -> ClusterOutcome {
        let mut out = ClusterOutcome::default();
        match event {
            Event::Apply(object) => {
                let (mut services, mut nodes) = (BTreeSet::new(), BTreeSet::new());
                self.apply_object(object, &mut out, &mut services, &mut nodes);
                out.services = services;
                out.nodes = nodes;
            }
            Event::Delete(reference) => self.delete(&reference, &mut out),
            Event::Replace { kinds, objects } => {
                let mut listing = Listing {
                    kinds,
                    ..Listing::default()
                };
                for object in objects {
                    self.list_item(&mut listing, object, &mut out);
                }
                self.finish_listing(listing, &mut out);
            }
            Event::ListStart { kinds } => {
                self.listing = Some(Listing {
                    kinds,
                    ..Listing::default()
                });
            }
            Event::ListItem(object) => match self.listing.take() {
                Some(mut listing) => {
                    self.list_item(&mut listing, object, &mut out);
                    self.listing = Some(listing);
                }
                // An item outside a list: treat it as an update.
                None => {
                    let (mut services, mut nodes) = (BTreeSet::new(), BTreeSet::new());
                    self.apply_object(object, &mut out, &mut services, &mut nodes);
                    out.services = services;
                    out.nodes = nodes;
                }
            },
            Event::ListDone => {
                if let Some(listing) = self.listing.take() {
                    self.finish_listing(listing, &mut out);
                }
            }
        }
        out
    }

    /// Whether this proxy must program a Service at all.
    fn owns(&self, svc: &ServiceInfo) -> bool {
        if svc.ignored.is_some() || svc.headless_label {
            return false;
        }
        match &svc.proxy_name_label {
            None => true,
            Some(name) => self.config.service_proxy_name.as_deref() == Some(name.as_str()),
        }
    }

    fn keeps_node(&self, name: &str) -> bool {
        self.config
            .only_node
            .as_deref()
            .is_none_or(|only| only == name)
    }

    fn apply_object(
        &mut self,
        object: Object,
        out: &mut ClusterOutcome,
        services: &mut BTreeSet<ServiceKey>,
        nodes: &mut BTreeSet<String>,
    ) {
        match object {
            Object::Service(svc) => match convert::service(&svc, &mut out.warnings) {
                Ok(info) => {
                    out.applied += 1;
                    let owned = self.owns(&info);
                    let source = self.sources.entry(info.key.clone()).or_default();
                    if source.info.as_ref() != Some(&info) || source.owned != owned {
                        services.insert(info.key.clone());
                        let source = Arc::make_mut(source);
                        source.owned = owned;
                        source.info = Some(info);
                    }
                }
                Err(e) => out.errors.push(e),
            },
            Object::EndpointSlice(slice) => {
                match convert::endpoint_slice(&slice, &mut out.warnings) {
                    Ok(mut info) => {
                        out.applied += 1;
                        if let Some(only) = &self.config.only_node {
                            // Only locality matters: keep a node name only when it is ours
                            // (saves a string per endpoint, most of them remote).
                            for ep in &mut info.endpoints {
                                if ep.node_name.as_deref() != Some(only.as_str()) {
                                    ep.node_name = None;
                                }
                            }
                        }
                        let namespace = slice.metadata.namespace.clone().unwrap_or_default();
                        self.insert_slice(namespace, info, services);
                    }
                    Err(e) => out.errors.push(e),
                }
            }
            Object::Node(node) => match convert::node(&node, &mut out.warnings) {
                Ok(info) => {
                    out.applied += 1;
                    if self.keeps_node(&info.name)
                        && self.nodes.get(&info.name).map(|n| n.as_ref()) != Some(&info)
                    {
                        nodes.insert(info.name.clone());
                        self.nodes.insert(info.name.clone(), Arc::new(info));
                    }
                }
                Err(e) => out.errors.push(e),
            },
        }
    }

    fn insert_slice(
        &mut self,
        namespace: String,
        info: SliceInfo,
        services: &mut BTreeSet<ServiceKey>,
    ) {
        let id = (namespace, info.name.clone());
        let unchanged = match self.slice_owners.get(&id) {
            Some(Some(owner)) => {
                self.sources
                    .get(owner)
                    .and_then(|s| s.slices.iter().find(|x| x.name == info.name))
                    == Some(&info)
            }
            Some(None) => info.service.is_none(),
            None => false,
        };
        if unchanged {
            return;
        }
        self.remove_slice(&id, services);
        if let Some(service) = &info.service {
            services.insert(service.clone());
            // Sorted by name: the order slices are merged in (first copy of an endpoint wins).
            let source = Arc::make_mut(self.sources.entry(service.clone()).or_default());
            let at = source.slices.partition_point(|x| x.name < info.name);
            source.slices.insert(at, info.clone());
        }
        self.slice_owners.insert(id, info.service);
    }

    fn remove_slice(&mut self, id: &(String, String), services: &mut BTreeSet<ServiceKey>) {
        let Some(Some(service)) = self.slice_owners.remove(id) else {
            return;
        };
        services.insert(service.clone());
        if let Some(source) = self.sources.get_mut(&service) {
            Arc::make_mut(source).slices.retain(|x| x.name != id.1);
            if source.is_empty() {
                self.sources.remove(&service);
            }
        }
    }

    fn remove_service(&mut self, key: &ServiceKey, services: &mut BTreeSet<ServiceKey>) {
        let Some(source) = self.sources.get_mut(key) else {
            return;
        };
        if source.info.is_none() {
            return;
        }
        services.insert(key.clone());
        let source = Arc::make_mut(source);
        source.info = None;
        source.owned = false;
        if source.is_empty() {
            self.sources.remove(key);
        }
    }

    fn delete(&mut self, reference: &ObjectRef, out: &mut ClusterOutcome) {
        match reference.kind {
            Kind::Service => {
                let key = ServiceKey::new(reference.namespace.clone(), reference.name.clone());
                self.remove_service(&key, &mut out.services);
            }
            Kind::EndpointSlice => {
                let id = (reference.namespace.clone(), reference.name.clone());
                self.remove_slice(&id, &mut out.services);
            }
            Kind::Node => {
                if self.nodes.remove(&reference.name).is_some() {
                    out.nodes.insert(reference.name.clone());
                }
            }
        }
    }

    /// One object of a complete list. Objects that fail conversion keep their previous version,
    /// so a relist with one broken object changes nothing about it.
    fn list_item(&mut self, listing: &mut Listing, object: Object, out: &mut ClusterOutcome) {
        if !listing.kinds.contains(&object.kind()) {
            return;
        }
        listing.seen.insert(object.reference());
        self.apply_object(object, out, &mut listing.services, &mut listing.nodes);
    }

    /// Ends a list: objects of its kinds that were not listed (and not kept because of an
    /// error) are gone.
    fn finish_listing(&mut self, listing: Listing, out: &mut ClusterOutcome) {
        let Listing {
            kinds,
            seen,
            services,
            nodes,
        } = listing;
        out.services.extend(services);
        out.nodes.extend(nodes);
        let kept = |kind: Kind, namespace: &str, name: &str| {
            seen.contains(&ObjectRef {
                kind,
                namespace: namespace.to_string(),
                name: name.to_string(),
            })
        };
        if kinds.contains(&Kind::Service) {
            let gone: Vec<ServiceKey> = self
                .sources
                .iter()
                .filter(|(k, s)| s.info.is_some() && !kept(Kind::Service, &k.namespace, &k.name))
                .map(|(k, _)| k.clone())
                .collect();
            for key in gone {
                self.remove_service(&key, &mut out.services);
            }
        }
        if kinds.contains(&Kind::EndpointSlice) {
            let gone: Vec<(String, String)> = self
                .slice_owners
                .keys()
                .filter(|(ns, name)| !kept(Kind::EndpointSlice, ns, name))
                .cloned()
                .collect();
            for id in gone {
                self.remove_slice(&id, &mut out.services);
            }
        }
        if kinds.contains(&Kind::Node) {
            let gone: Vec<String> = self
                .nodes
                .keys()
                .filter(|name| !kept(Kind::Node, "", name))
                .cloned()
                .collect();
            for name in gone {
                self.nodes.remove(&name);
                out.nodes.insert(name);
            }
        }
        out.listed = kinds;
    }
}

/// The node as the model sees it: `name` (from configuration), the Node object's properties
/// when known, and `override_ips` (`--node-ip`) in place of its addresses when given.
pub fn node_state(
    name: &str,
    node: Option<&NodeInfo>,
    override_ips: &[std::net::IpAddr],
) -> NodeState {
    let mut state = NodeState {
        name: name.to_string(),
        ..NodeState::default()
    };
    if let Some(node) = node {
        state.known = true;
        state.zone = node.zone.clone();
        state.pod_cidrs = node.pod_cidrs.clone();
        state.deleting = node.deleting;
        state.to_be_deleted = node.to_be_deleted;
        // kube-proxy's node IPs: InternalIPs first, then ExternalIPs, one per family.
        for ip in node.internal_ips.iter().chain(node.external_ips.iter()) {
            if !state.ips.iter().any(|have| have.is_ipv4() == ip.is_ipv4()) {
                state.ips.push(*ip);
            }
        }
    }
    if !override_ips.is_empty() {
        state.ips = override_ips.to_vec();
    }
    state
}

#[cfg(test)]
mod tests;
