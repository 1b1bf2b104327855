//! The incremental model: objects in, per-Service-port diffs out.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use crate::build::service_ports;
use crate::convert::{self, ConversionError, NodeInfo, ServiceInfo, SliceInfo, Warning};
use crate::diff::Diff;
use crate::event::{Event, Kind, Object, ObjectRef};
use crate::key::{Family, Name, PortKey, Protocol, ServiceKey};
use crate::node::NodeState;
use crate::service_port::ServicePort;

/// How this node identifies itself and which Services it owns.
#[derive(Debug, Clone, Default)]
pub struct ModelConfig {
    /// This node's name (`--node-name` / `--hostname-override`): decides which endpoints are local.
    pub node_name: String,
    /// `--service-proxy-name`: Services labelled `service.kubernetes.io/service-proxy-name` with
    /// this value are ours; any other value means another proxy owns them.
    pub service_proxy_name: Option<String>,
    /// `--node-ip` / `--bind-address`: when set, these are the node's IPs whatever the Node says.
    pub node_ips: Vec<IpAddr>,
}

/// The complete node-local state: what a new subscriber or a full resync starts from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// This node.
    pub node: NodeState,
    /// Every Service port of every family, ordered by key.
    pub ports: BTreeMap<PortKey, Arc<ServicePort>>,
}

impl Snapshot {
    /// The ports of one family, in key order.
    pub fn family(&self, family: Family) -> impl Iterator<Item = &Arc<ServicePort>> {
        self.ports.values().filter(move |p| p.key.family == family)
    }
}

/// What applying one event produced.
#[derive(Debug, Default)]
pub struct ApplyOutcome {
    /// The Service ports that changed.
    pub diff: Diff,
    /// Values that were ignored (the rest of their object was used).
    pub warnings: Vec<Warning>,
    /// Objects that could not be used; their previous version (if any) was kept.
    pub errors: Vec<ConversionError>,
    /// Objects accepted into the model.
    pub applied: usize,
}

/// The node-local model. Feed it [`Event`]s; read [`Model::snapshot`].
///
/// Every event recomputes only the Services it touches (a Node zone change touches all of them)
/// and returns the diff of their ports.
#[derive(Debug, Default)]
pub struct Model {
    config: ModelConfig,
    services: HashMap<ServiceKey, ServiceInfo>,
    /// Every known slice (namespace, name) → the Service it belongs to (if any).
    slice_owners: HashMap<(Name, Name), Option<ServiceKey>>,
    /// Slices of each Service: slice name → slice (each slice stored once, here).
    slices_by_service: HashMap<ServiceKey, Vec<SliceInfo>>,
    node: Option<NodeInfo>,
    snapshot: Snapshot,
    /// A streamed list in progress.
    listing: Option<Listing>,
}

/// A streamed list ([`Event::ListStart`] … [`Event::ListDone`]) in progress.
#[derive(Debug, Default)]
struct Listing {
    kinds: Vec<Kind>,
    seen: HashSet<ObjectRef>,
    dirty: BTreeSet<ServiceKey>,
    node_dirty: bool,
}

impl Model {
    /// An empty model for this node.
    pub fn new(config: ModelConfig) -> Model {
        let mut model = Model {
            config,
            ..Model::default()
        };
        model.snapshot.node = model.node_state();
        model
    }

    /// The current node-local state.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// Applies one event and returns what changed.
    pub fn apply(&mut self, event: Event) -> ApplyOutcome {
        let mut out = ApplyOutcome::default();
        let mut dirty = BTreeSet::new();
        let mut node_dirty = false;
        match event {
            Event::Apply(object) => {
                self.apply_object(object, &mut out, &mut dirty, &mut node_dirty);
            }
            Event::Delete(reference) => self.delete(&reference, &mut dirty, &mut node_dirty),
            Event::Replace { kinds, objects } => {
                let mut listing = Listing {
                    kinds,
                    ..Listing::default()
                };
                for object in objects {
                    self.list_item(&mut listing, object, &mut out);
                }
                self.finish_listing(listing, &mut dirty, &mut node_dirty);
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
                None => self.apply_object(object, &mut out, &mut dirty, &mut node_dirty),
            },
            Event::ListDone => {
                if let Some(listing) = self.listing.take() {
                    self.finish_listing(listing, &mut dirty, &mut node_dirty);
                }
            }
        }
        self.refresh(dirty, node_dirty, &mut out.diff);
        out
    }

    fn apply_object(
        &mut self,
        object: Object,
        out: &mut ApplyOutcome,
        dirty: &mut BTreeSet<ServiceKey>,
        node_dirty: &mut bool,
    ) {
        match object {
            Object::Service(svc) => match convert::service(&svc, &mut out.warnings) {
                Ok(info) => {
                    out.applied += 1;
                    if self.services.get(&info.key) != Some(&info) {
                        dirty.insert(info.key.clone());
                        self.services.insert(info.key.clone(), info);
                    }
                }
                Err(e) => out.errors.push(e),
            },
            Object::EndpointSlice(slice) => {
                match convert::endpoint_slice(&slice, &mut out.warnings) {
                    Ok(mut info) => {
                        out.applied += 1;
                        // Only locality matters: keep a node name only when it is ours (saves a
                        // string per endpoint, most of them remote).
                        for ep in &mut info.endpoints {
                            if ep.node_name.as_deref() != Some(self.config.node_name.as_str()) {
                                ep.node_name = None;
                            }
                        }
                        // The owning Service's key already holds the namespace: share it.
                        let namespace = match &info.service {
                            Some(service) => service.namespace.clone(),
                            None => slice
                                .metadata
                                .namespace
                                .as_deref()
                                .unwrap_or_default()
                                .into(),
                        };
                        self.insert_slice(namespace, info, dirty);
                    }
                    Err(e) => out.errors.push(e),
                }
            }
            Object::Node(node) => match convert::node(&node, &mut out.warnings) {
                Ok(info) => {
                    out.applied += 1;
                    if info.name == self.config.node_name && self.node.as_ref() != Some(&info) {
                        self.node = Some(info);
                        *node_dirty = true;
                    }
                }
                Err(e) => out.errors.push(e),
            },
        }
    }

    fn insert_slice(&mut self, namespace: Name, info: SliceInfo, dirty: &mut BTreeSet<ServiceKey>) {
        let id = (namespace, info.name.clone());
        let unchanged = match self.slice_owners.get(&id) {
            Some(Some(owner)) => {
                self.slices_by_service
                    .get(owner)
                    .and_then(|s| s.iter().find(|x| x.name == info.name))
                    == Some(&info)
            }
            Some(None) => info.service.is_none(),
            None => false,
        };
        if unchanged {
            return;
        }
        self.remove_slice(&id, dirty);
        if let Some(service) = &info.service {
            dirty.insert(service.clone());
            // Sorted by name: the order slices are merged in (first copy of an endpoint wins).
            let slices = self.slices_by_service.entry(service.clone()).or_default();
            let at = slices.partition_point(|x| x.name < info.name);
            slices.insert(at, info.clone());
        }
        self.slice_owners.insert(id, info.service);
    }

    fn remove_slice(&mut self, id: &(Name, Name), dirty: &mut BTreeSet<ServiceKey>) {
        let Some(owner) = self.slice_owners.remove(id) else {
            return;
        };
        let Some(service) = owner else { return };
        dirty.insert(service.clone());
        if let Some(by_name) = self.slices_by_service.get_mut(&service) {
            by_name.retain(|x| x.name != id.1);
            if by_name.is_empty() {
                self.slices_by_service.remove(&service);
            }
        }
    }

    fn delete(
        &mut self,
        reference: &ObjectRef,
        dirty: &mut BTreeSet<ServiceKey>,
        node_dirty: &mut bool,
    ) {
        match reference.kind {
            Kind::Service => {
                let key = ServiceKey::new(reference.namespace.clone(), reference.name.clone());
                if self.services.remove(&key).is_some() {
                    dirty.insert(key);
                }
            }
            Kind::EndpointSlice => {
                self.remove_slice(
                    &(reference.namespace.clone(), reference.name.clone()),
                    dirty,
                );
            }
            Kind::Node => {
                if *reference.name == *self.config.node_name && self.node.take().is_some() {
                    *node_dirty = true;
                }
            }
        }
    }

    /// Swaps in a complete list of objects of the given kinds. Objects that fail conversion keep
    /// their previous version, so a relist with one broken object changes nothing about it.
    fn list_item(&mut self, listing: &mut Listing, object: Object, out: &mut ApplyOutcome) {
        if !listing.kinds.contains(&object.kind()) {
            return;
        }
        listing.seen.insert(object.reference());
        self.apply_object(object, out, &mut listing.dirty, &mut listing.node_dirty);
    }

    /// Ends a list: objects of its kinds that were not listed (and not kept because of an
    /// error) are gone.
    fn finish_listing(
        &mut self,
        listing: Listing,
        dirty: &mut BTreeSet<ServiceKey>,
        node_dirty: &mut bool,
    ) {
        let Listing {
            kinds,
            seen,
            dirty: listed_dirty,
            node_dirty: listed_node_dirty,
        } = listing;
        dirty.extend(listed_dirty);
        *node_dirty |= listed_node_dirty;
        let kinds = &kinds[..];
        // Anything of these kinds not listed (and not kept because of an error) is gone.
        let kept = |r: &ObjectRef| seen.contains(r);
        if kinds.contains(&Kind::Service) {
            let gone: Vec<ServiceKey> = self
                .services
                .keys()
                .filter(|k| {
                    !kept(&ObjectRef {
                        kind: Kind::Service,
                        namespace: k.namespace.clone(),
                        name: k.name.clone(),
                    })
                })
                .cloned()
                .collect();
            for key in gone {
                self.services.remove(&key);
                dirty.insert(key);
            }
        }
        if kinds.contains(&Kind::EndpointSlice) {
            let gone: Vec<(Name, Name)> = self
                .slice_owners
                .keys()
                .filter(|(ns, name)| {
                    !kept(&ObjectRef {
                        kind: Kind::EndpointSlice,
                        namespace: ns.clone(),
                        name: name.clone(),
                    })
                })
                .cloned()
                .collect();
            for id in gone {
                self.remove_slice(&id, dirty);
            }
        }
        if kinds.contains(&Kind::Node) {
            let ours = ObjectRef {
                kind: Kind::Node,
                namespace: "".into(),
                name: self.config.node_name.as_str().into(),
            };
            if !kept(&ours) && self.node.take().is_some() {
                *node_dirty = true;
            }
        }
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

    fn node_state(&self) -> NodeState {
        let mut state = NodeState {
            name: self.config.node_name.clone(),
            ..NodeState::default()
        };
        if let Some(node) = &self.node {
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
        if !self.config.node_ips.is_empty() {
            state.ips = self.config.node_ips.clone();
        }
        state
    }

    /// Recomputes the dirty Services (all of them when the node's zone changed) into the
    /// snapshot and records the transitions in `diff`.
    fn refresh(&mut self, mut dirty: BTreeSet<ServiceKey>, node_dirty: bool, diff: &mut Diff) {
        if node_dirty {
            let state = self.node_state();
            if state != self.snapshot.node {
                if state.zone != self.snapshot.node.zone {
                    dirty.extend(self.services.keys().cloned());
                }
                self.snapshot.node = state;
                diff.node_changed = true;
            }
        }
        let no_slices = Vec::new();
        for key in dirty {
            let new_ports = match self.services.get(&key) {
                Some(svc) if self.owns(svc) => {
                    let slices = self.slices_by_service.get(&key).unwrap_or(&no_slices);
                    service_ports(svc, slices, &self.snapshot.node)
                }
                _ => Vec::new(),
            };
            self.replace_service_ports(&key, new_ports, diff);
        }
    }

    fn replace_service_ports(
        &mut self,
        key: &ServiceKey,
        new_ports: Vec<ServicePort>,
        diff: &mut Diff,
    ) {
        let first = PortKey {
            service: key.clone(),
            port_name: "".into(),
            protocol: Protocol::Tcp,
            family: Family::V4,
        };
        let old_keys: Vec<PortKey> = self
            .snapshot
            .ports
            .range(first..)
            .take_while(|(k, _)| &k.service == key)
            .map(|(k, _)| k.clone())
            .collect();
        let mut new_by_key: BTreeMap<PortKey, ServicePort> =
            new_ports.into_iter().map(|p| (p.key.clone(), p)).collect();
        for old_key in old_keys {
            let replacement = new_by_key.remove(&old_key);
            let old = self.snapshot.ports.get(&old_key).cloned();
            match replacement {
                Some(port) if old.as_deref() == Some(&port) => {}
                Some(port) => {
                    let port = Arc::new(port);
                    self.snapshot.ports.insert(old_key.clone(), port.clone());
                    diff.record(old_key, old, Some(port));
                }
                None => {
                    self.snapshot.ports.remove(&old_key);
                    diff.record(old_key, old, None);
                }
            }
        }
        for (k, port) in new_by_key {
            let port = Arc::new(port);
            self.snapshot.ports.insert(k.clone(), port.clone());
            diff.record(k, None, Some(port));
        }
    }
}

#[cfg(test)]
mod tests;
