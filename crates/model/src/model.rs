//! The incremental model: objects in, per-Service-port diffs out.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

use ipnet::IpNet;

use crate::build::service_ports;
use crate::convert::{
    self, ConversionError, NodeInfo, ServiceCidrInfo, ServiceInfo, SliceInfo, Warning,
};
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
    /// `--service-proxy-name`: when set, only Services labelled
    /// `service.kubernetes.io/service-proxy-name` with this value are ours; when unset, only
    /// Services without that label are (the label names the proxy that owns a Service).
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
    /// The ranges of every ServiceCIDR object, sorted, without duplicates: traffic to an IP
    /// inside them that no Service owns is dropped (kube-proxy's "unallocated ClusterIP" rule).
    pub service_cidrs: Vec<IpNet>,
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
    /// Services whose object changed, appeared or disappeared (what kube-proxy counts as
    /// pending Service changes), in the order seen.
    pub services_changed: Vec<ServiceKey>,
    /// EndpointSlices whose content changed, appeared or disappeared (kube-proxy's pending
    /// endpoint changes).
    pub slices_changed: usize,
    /// The last-change trigger times of the changed (not deleted) slices that carry one: network
    /// programming latency is measured from them once the change is programmed.
    pub trigger_times: Vec<TriggerTime>,
}

/// When a change of a Service's endpoints was triggered, from the EndpointSlice annotation
/// `endpoints.kubernetes.io/last-change-trigger-time`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriggerTime {
    /// The Service the slice belongs to.
    pub service: ServiceKey,
    /// The slice's address family (the metric is per family).
    pub family: Family,
    /// When the change was triggered (the API server's clock).
    pub at: SystemTime,
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
    /// ServiceCIDR name → its ranges.
    service_cidrs: BTreeMap<String, Vec<IpNet>>,
    snapshot: Snapshot,
    /// Streamed lists in progress, at most one per kind.
    listings: Vec<Listing>,
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
            Event::Delete(reference) => {
                self.delete(&reference, &mut out, &mut dirty, &mut node_dirty);
            }
            Event::Replace { kinds, objects } => {
                let mut listing = Listing {
                    kinds,
                    ..Listing::default()
                };
                for object in objects {
                    self.list_item(&mut listing, object, &mut out);
                }
                self.finish_listing(listing, &mut out, &mut dirty, &mut node_dirty);
            }
            Event::ListStart { kinds } => self.start_listing(kinds),
            Event::ListItem(object) => {
                let kind = object.kind();
                match self.listings.iter().position(|l| l.kinds.contains(&kind)) {
                    Some(at) => {
                        let mut listing = self.listings.swap_remove(at);
                        self.list_item(&mut listing, object, &mut out);
                        self.listings.push(listing);
                    }
                    // An item outside a list: treat it as an update.
                    None => self.apply_object(object, &mut out, &mut dirty, &mut node_dirty),
                }
            }
            Event::ListDone { kinds } => {
                if let Some(at) = self.listings.iter().position(|l| l.kinds == kinds) {
                    let listing = self.listings.swap_remove(at);
                    self.finish_listing(listing, &mut out, &mut dirty, &mut node_dirty);
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
                        out.services_changed.push(info.key.clone());
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
                        let service = info.service.clone();
                        if self.insert_slice(namespace, info, dirty) {
                            out.slices_changed += 1;
                            let family = match slice.address_type.as_str() {
                                "IPv4" => Some(Family::V4),
                                "IPv6" => Some(Family::V6),
                                _ => None,
                            };
                            let at = convert::last_change_trigger_time(&slice);
                            if let (Some(service), Some(family), Some(at)) = (service, family, at) {
                                out.trigger_times.push(TriggerTime {
                                    service,
                                    family,
                                    at,
                                });
                            }
                        }
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
            Object::ServiceCidr(object) => {
                match convert::service_cidr(&object, &mut out.warnings) {
                    Ok(ServiceCidrInfo { name, cidrs }) => {
                        out.applied += 1;
                        if self.service_cidrs.get(&name) != Some(&cidrs) {
                            self.service_cidrs.insert(name, cidrs);
                            *node_dirty = true;
                        }
                    }
                    Err(e) => out.errors.push(e),
                }
            }
        }
    }

    /// Stores a slice; returns whether it differs from the stored version.
    fn insert_slice(
        &mut self,
        namespace: Name,
        info: SliceInfo,
        dirty: &mut BTreeSet<ServiceKey>,
    ) -> bool {
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
            return false;
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
        true
    }

    /// Forgets a slice; returns whether it was known.
    fn remove_slice(&mut self, id: &(Name, Name), dirty: &mut BTreeSet<ServiceKey>) -> bool {
        let Some(owner) = self.slice_owners.remove(id) else {
            return false;
        };
        let Some(service) = owner else { return true };
        dirty.insert(service.clone());
        if let Some(by_name) = self.slices_by_service.get_mut(&service) {
            by_name.retain(|x| x.name != id.1);
            if by_name.is_empty() {
                self.slices_by_service.remove(&service);
            }
        }
        true
    }

    fn delete(
        &mut self,
        reference: &ObjectRef,
        out: &mut ApplyOutcome,
        dirty: &mut BTreeSet<ServiceKey>,
        node_dirty: &mut bool,
    ) {
        match reference.kind {
            Kind::Service => {
                let key = ServiceKey::new(reference.namespace.clone(), reference.name.clone());
                if self.services.remove(&key).is_some() {
                    out.services_changed.push(key.clone());
                    dirty.insert(key);
                }
            }
            Kind::EndpointSlice => {
                let id = (reference.namespace.clone(), reference.name.clone());
                if self.remove_slice(&id, dirty) {
                    out.slices_changed += 1;
                }
            }
            Kind::Node => {
                if *reference.name == *self.config.node_name && self.node.take().is_some() {
                    *node_dirty = true;
                }
            }
            Kind::ServiceCidr => {
                if self.service_cidrs.remove(&*reference.name).is_some() {
                    *node_dirty = true;
                }
            }
        }
    }

    /// Starts a streamed list. A list still in progress for any of these kinds is abandoned:
    /// what it applied stays (the new list removes what it does not repeat) and the Services it
    /// touched are recomputed when the new list ends.
    fn start_listing(&mut self, kinds: Vec<Kind>) {
        let mut listing = Listing::default();
        let (abandoned, kept): (Vec<Listing>, Vec<Listing>) = std::mem::take(&mut self.listings)
            .into_iter()
            .partition(|l| l.kinds.iter().any(|k| kinds.contains(k)));
        self.listings = kept;
        for old in abandoned {
            listing.dirty.extend(old.dirty);
            listing.node_dirty |= old.node_dirty;
        }
        listing.kinds = kinds;
        self.listings.push(listing);
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
        out: &mut ApplyOutcome,
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
                out.services_changed.push(key.clone());
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
                if self.remove_slice(&id, dirty) {
                    out.slices_changed += 1;
                }
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
        if kinds.contains(&Kind::ServiceCidr) {
            let before = self.service_cidrs.len();
            self.service_cidrs.retain(|name, _| {
                kept(&ObjectRef {
                    kind: Kind::ServiceCidr,
                    namespace: "".into(),
                    name: name.as_str().into(),
                })
            });
            *node_dirty |= self.service_cidrs.len() != before;
        }
    }

    /// Whether this proxy must program a Service at all.
    fn owns(&self, svc: &ServiceInfo) -> bool {
        if svc.ignored.is_some() || svc.headless_label {
            return false;
        }
        svc.proxy_name_label.as_deref() == self.config.service_proxy_name.as_deref()
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

    /// The ranges of every ServiceCIDR, sorted, without duplicates.
    fn all_service_cidrs(&self) -> Vec<IpNet> {
        let all: BTreeSet<IpNet> = self.service_cidrs.values().flatten().copied().collect();
        all.into_iter().collect()
    }

    /// Recomputes the dirty Services (all of them when the node's zone changed) into the
    /// snapshot and records the transitions in `diff`. `node_dirty`: the node or the Service
    /// CIDRs may have changed.
    fn refresh(&mut self, mut dirty: BTreeSet<ServiceKey>, node_dirty: bool, diff: &mut Diff) {
        if node_dirty {
            let cidrs = self.all_service_cidrs();
            if cidrs != self.snapshot.service_cidrs {
                self.snapshot.service_cidrs = cidrs;
                diff.node_changed = true;
            }
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
