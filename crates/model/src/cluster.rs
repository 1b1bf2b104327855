//! The node-independent layer: every converted object, for any number of nodes.
//!
//! [`ClusterModel`] stores Services, EndpointSlices, Nodes and ServiceCIDRs once, converted, and
//! reports which Services and Nodes an event touched (and kube-proxy's change counters). It does not compute anything node-specific: the
//! node-local [`crate::Model`] and the API server's per-node views both evaluate
//! [`ServiceSource::ports_for`] for the node they serve, so one cluster state can serve one node
//! (in process) or a thousand (a brain).
//!
//! Each Service's inputs (the Service and its slices) live in one [`Arc<ServiceSource>`], changed
//! copy-on-write: whoever still holds an old version (a client that has not yet received the
//! change) keeps it alive, and nobody else pays for it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::SystemTime;

use ipnet::IpNet;

use crate::build::service_ports;
use crate::cidr_warnings::external_ips_in_service_cidrs;
use crate::claims::{Claims, Lost, Seen, conflict_warnings};
use crate::event::{AppliedCounts, Event, Kind, Object, ObjectRef};
use crate::key::{Family, Name, ServiceKey};
use crate::node::NodeState;
use crate::port_range::{NodePortRange, drop_out_of_range};
use crate::records::{NodeInfo, Rejection, ServiceCidrInfo, ServiceInfo, SliceInfo, Warning};
use crate::service_port::ServicePort;
use crate::source_ranges::open_family_warnings;

/// Configuration that is the same for every node.
#[derive(Debug, Clone, Default)]
pub struct ClusterConfig {
    /// `--service-proxy-name`: when set, only Services labelled
    /// `service.kubernetes.io/service-proxy-name` with this value are ours; when unset, only
    /// Services without that label are (the label names the proxy that owns a Service).
    pub service_proxy_name: Option<String>,
    /// Serve only this node: endpoint node names other than it are dropped at conversion and
    /// other Nodes are not stored (a node-local model's memory saving). `None` keeps everything
    /// (a brain serving every node).
    pub only_node: Option<String>,
    /// `--service-node-port-range`: node ports outside it are dropped with a warning (the API
    /// server never allocates them, so they come from a hand-written manifest and could take a
    /// port the node itself serves). `None` accepts every node port.
    pub node_port_range: Option<NodePortRange>,
    /// `--service-cidr`: with the ServiceCIDR objects, the ranges an external IP is warned
    /// about in (`cidr_warnings`).
    pub service_cidrs: Vec<IpNet>,
}

/// The inputs of one Service: the Service (once seen) and its EndpointSlices, sorted by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceSource {
    info: Option<ServiceInfo>,
    slices: Vec<SliceInfo>,
    owned: bool,
    /// Frontends an older Service owns (see `claims`): not programmed for this one.
    lost: Lost,
    /// When the model first had the Service object (see `claims`): of two Services without
    /// creation times claiming one frontend, the one had first keeps it.
    seen: Seen,
}

impl ServiceSource {
    /// Every Service port (per port and family) as `node` must program it; empty when the
    /// Service is unknown, not ours, headless or ExternalName.
    pub fn ports_for(&self, node: &NodeState) -> Vec<ServicePort> {
        match &self.info {
            Some(info) if self.owned => service_ports(info, &self.slices, node, &self.lost),
            _ => Vec::new(),
        }
    }

    /// The endpoints of the Service's EndpointSlices of a family it has no cluster IP of,
    /// per family: (family, slices, endpoints). They are ignored, as kube-proxy's proxier per
    /// family ignores them; `kpng status` says so beside "no endpoints", which would otherwise
    /// send the operator to the pods (a Service made IPv4-only while its IPv6 slice lingers).
    pub fn slices_of_unserved_families(&self) -> Vec<(Family, usize, usize)> {
        let Some(info) = &self.info else {
            return Vec::new();
        };
        let mut out: Vec<(Family, usize, usize)> = Vec::new();
        for slice in &self.slices {
            let Some(family) = slice.family else {
                continue;
            };
            if info.cluster_ips.iter().any(|ip| Family::of(ip) == family) {
                continue;
            }
            match out.iter_mut().find(|(f, _, _)| *f == family) {
                Some((_, slices, endpoints)) => {
                    *slices += 1;
                    *endpoints += slice.endpoints.len();
                }
                None => out.push((family, 1, slice.endpoints.len())),
            }
        }
        out
    }

    /// The Service's `loadBalancerSourceRanges` when none is of `family`: they do not
    /// restrict that family's load-balancer IPs (kube-proxy applies them per family), which
    /// `kpng status` and `kpng trace` say. Empty when it has a range of `family`, or none.
    pub fn source_ranges_of_other_families_only(&self, family: Family) -> Vec<IpNet> {
        self.info
            .as_ref()
            .map(|info| crate::source_ranges::of_other_families_only(info, family))
            .unwrap_or_default()
    }

    /// Every endpoint of one port of this Service as `node` sees it (before categorisation):
    /// what `kpng status` explains. `None` when the Service has no such port.
    pub fn candidates_for(
        &self,
        key: &crate::key::PortKey,
        node: &NodeState,
    ) -> Option<Vec<crate::categorize::EndpointCandidate>> {
        let info = self.info.as_ref()?;
        let port = info
            .ports
            .iter()
            .find(|p| p.name == key.port_name && p.protocol == key.protocol)?;
        Some(crate::build::candidates(
            port,
            key.family,
            self.slices.iter(),
            &node.name,
        ))
    }

    /// Every Service port as `node` programs it ([`ServiceSource::ports_for`]), each with every
    /// endpoint and whether `node` uses it, and if not why ([`crate::inspect`]): what `kpng
    /// status` says on that node, computed wherever the Service's inputs are, so a brain
    /// explains a node's view that the node itself cannot (it receives only the endpoints it
    /// uses).
    pub fn explained_ports_for(
        &self,
        node: &NodeState,
    ) -> Vec<(ServicePort, Vec<crate::inspect::EndpointStatus>)> {
        self.ports_for(node)
            .into_iter()
            .map(|port| {
                let explained = self.explain(&port, node).unwrap_or_default();
                (port, explained)
            })
            .collect()
    }

    /// Every endpoint of `port` (a port of this Service as `node` programs it) with whether
    /// `node` uses it, and if not why, and the other copies of an endpoint that several slices
    /// hold ([`crate::inspect`]); `None` when the Service has no such port.
    pub fn explain(
        &self,
        port: &ServicePort,
        node: &NodeState,
    ) -> Option<Vec<crate::inspect::EndpointStatus>> {
        let key = &port.key;
        let info = self.info.as_ref()?;
        let port_info = info
            .ports
            .iter()
            .find(|p| p.name == key.port_name && p.protocol == key.protocol)?;
        let candidates = self.candidates_for(key, node)?;
        let mut explained = crate::inspect::explain_endpoints(port, &candidates, node);
        let mut notes =
            crate::build::copy_notes(port_info, key.family, self.slices.iter(), &node.name);
        if !notes.is_empty() {
            for e in &mut explained {
                e.other_copies = notes.remove(&e.address);
            }
        }
        Some(explained)
    }

    /// The nodes [`ServiceSource::depends_on_node`] is true for, sorted and without
    /// duplicates; `None` when every node's view may differ (topology hints). Lets a brain
    /// decide for thousands of nodes with one lookup each.
    pub fn dependent_nodes(&self) -> Option<Vec<String>> {
        let mut nodes = Vec::new();
        for e in self.slices.iter().flat_map(|s| s.endpoints.iter()) {
            if e.has_hints() {
                return None;
            }
            if let Some(name) = e.node_name.as_deref().filter(|n| !n.is_empty()) {
                nodes.push(name.to_string());
            }
        }
        nodes.sort_unstable();
        nodes.dedup();
        Some(nodes)
    }

    /// Whether the view of this Service depends on which node looks at it: an endpoint runs on
    /// `node_name`, or some endpoint carries topology hints. Otherwise every node sees what an
    /// anonymous node sees ([`NodeState::default`]), so a brain computes that view once.
    pub fn depends_on_node(&self, node_name: &str) -> bool {
        self.slices
            .iter()
            .flat_map(|s| s.endpoints.iter())
            .any(|e| {
                e.has_hints()
                    || (!node_name.is_empty() && e.node_name.as_deref() == Some(node_name))
            })
    }

    fn is_empty(&self) -> bool {
        self.info.is_none() && self.slices.is_empty()
    }
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

/// What applying one event to a [`ClusterModel`] touched.
#[derive(Debug, Default)]
pub struct ClusterOutcome {
    /// Services whose inputs changed (their views must be recomputed).
    pub services: BTreeSet<ServiceKey>,
    /// Nodes whose object changed or disappeared.
    pub nodes: BTreeSet<String>,
    /// Objects that could not be used; their previous version (if any) was kept.
    pub errors: Vec<Rejection>,
    /// Objects whose latest version was rejected and that a usable version now replaces, with
    /// the rejection that ends: the caller logs that the problem is over (an error line with
    /// no end leaves an operator unable to tell when it was fixed, and a good version equal to
    /// the one kept changes no rule, so no sync line says it either).
    pub accepted_again: Vec<Rejection>,
    /// Objects accepted, per kind.
    pub applied: AppliedCounts,
    /// Kinds whose complete list this event finished ([`Event::Replace`], [`Event::ListDone`]).
    pub listed: Vec<Kind>,
    /// Services whose object changed, appeared or disappeared (what kube-proxy counts as
    /// pending Service changes), in the order seen.
    pub services_changed: Vec<ServiceKey>,
    /// EndpointSlices whose content changed, appeared or disappeared (kube-proxy's pending
    /// endpoint changes).
    pub slices_changed: usize,
    /// The last-change trigger times of the changed (not deleted) slices that carry one: network
    /// programming latency is measured from them once the change is programmed.
    pub trigger_times: Vec<TriggerTime>,
    /// The union of the ServiceCIDRs' ranges may have changed ([`ClusterModel::service_cidrs`]).
    pub service_cidrs_changed: bool,
    /// Values the model refused in objects it otherwise uses (a node port outside
    /// `--service-node-port-range`, a frontend an older Service owns), reported once per change
    /// of the object; the caller logs them.
    pub warnings: Vec<Warning>,
}

/// A streamed list ([`Event::ListStart`] … [`Event::ListDone`]) in progress.
#[derive(Debug, Default)]
struct Listing {
    kinds: Vec<Kind>,
    seen: HashSet<ObjectRef>,
    services: BTreeSet<ServiceKey>,
    nodes: BTreeSet<String>,
    service_cidrs_changed: bool,
}

/// What one object change touched (the event's own, or a list's until it ends).
#[derive(Debug, Default)]
struct Touched {
    services: BTreeSet<ServiceKey>,
    nodes: BTreeSet<String>,
    service_cidrs_changed: bool,
}

/// Every converted object of the cluster, with no node-specific computation.
#[derive(Debug, Default)]
pub struct ClusterModel {
    config: ClusterConfig,
    sources: HashMap<ServiceKey, Arc<ServiceSource>>,
    /// Every known slice (namespace, name) → the Service it belongs to (if any).
    slice_owners: HashMap<(Name, Name), Option<ServiceKey>>,
    nodes: HashMap<String, Arc<NodeInfo>>,
    /// ServiceCIDR name → its ranges.
    service_cidrs: BTreeMap<String, Vec<IpNet>>,
    /// Streamed lists in progress, at most one per kind.
    listings: Vec<Listing>,
    /// Who claims each IP port (ClusterIP, external, load-balancer) and node port (conflicts
    /// resolved oldest first).
    claims: Claims,
    /// Moves on after every event but a streamed list's start and items: what a Service first
    /// had now is stamped with (`ServiceSource::seen`).
    clock: Seen,
    /// Objects whose latest version was rejected, until a usable version replaces it or the
    /// object goes: what `kpng status` shows as still wrong (an error line alone scrolls away).
    rejected: BTreeMap<ObjectRef, Rejection>,
    /// Values the conversion dropped from the latest version of each object (`records::Dropped`),
    /// until a version without them arrives or the object goes: `kpng status` shows them.
    dropped: BTreeMap<ObjectRef, Box<[Warning]>>,
    /// The frontends each Service lost to another one (`ServiceSource::lost`), as dropped
    /// values naming the field, the value and the Service that keeps it: `kpng status` and
    /// the brain's report show them beside `dropped` (a warning alone scrolls away, and a
    /// tenant whose value another tenant's Service holds must see why it is not programmed).
    conflicts: BTreeMap<ServiceKey, Box<[Warning]>>,
    /// Changes of `dropped` so far ([`ClusterModel::dropped_changes`]).
    dropped_changes: u64,
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

    /// The Service that shows `ip` as an address that gets no rules on purpose (an
    /// ExternalName Service's clusterIP, an `ipMode: Proxy` ingress IP, the clusterIP of a
    /// Service labelled headless or another proxy's), the first by namespace/name if several
    /// do; what `kpng trace` names. Walks every Service: asked on demand only.
    pub fn not_proxied(&self, ip: std::net::IpAddr) -> Option<crate::trace::NotProxied> {
        use crate::trace::{NotProxied, NotProxiedKind};
        self.sources
            .iter()
            .filter_map(|(key, source)| {
                let info = source.info.as_ref()?;
                let kind = if info
                    .not_proxied_ips
                    .as_deref()
                    .is_some_and(|ips| ips.contains(&ip))
                {
                    if info.ignored == Some(crate::records::Ignored::ExternalName) {
                        NotProxiedKind::ExternalNameClusterIp
                    } else {
                        NotProxiedKind::ProxyModeIngress
                    }
                } else if source.owned || info.ignored.is_some() || !info.cluster_ips.contains(&ip)
                {
                    return None;
                } else if info.headless_label {
                    NotProxiedKind::HeadlessLabelClusterIp
                } else {
                    NotProxiedKind::OtherProxyClusterIp(info.proxy_name_label.clone())
                };
                Some(NotProxied {
                    service: key.clone(),
                    kind,
                })
            })
            .min_by(|a, b| a.service.cmp(&b.service))
    }

    /// Why Service `key`, which the model holds, gets no rules at all (headless, another
    /// proxy's, every frontend another Service's, …), in words for `kpng status NAME`; `None`
    /// for a Service the model does not hold, or one whose ports depend on the node only.
    pub fn why_not_programmed(&self, key: &ServiceKey) -> Option<String> {
        let source = self.sources.get(key)?;
        let Some(info) = &source.info else {
            return Some("no Service object yet, only EndpointSlices that name it".into());
        };
        let label = "service.kubernetes.io/service-proxy-name";
        Some(match (&info.ignored, &self.config.service_proxy_name) {
            (Some(crate::records::Ignored::Headless), _) => {
                "no ClusterIP (spec.clusterIP None or empty: headless): DNS names its endpoints, \
                 no proxy rule, as kube-proxy"
                    .into()
            }
            (Some(crate::records::Ignored::ExternalName), _) => {
                "type ExternalName: a DNS alias, no proxy rule, as kube-proxy".into()
            }
            _ if info.headless_label => {
                "labelled service.kubernetes.io/headless: not proxied, as kube-proxy".into()
            }
            (None, None) if !source.owned => format!(
                "labelled {label}={}: another proxy's (kpng serves the Services without that \
                 label, unless --service-proxy-name names it)",
                info.proxy_name_label.as_deref().unwrap_or_default()
            ),
            (None, Some(mine)) if !source.owned => format!(
                "kpng runs with --service-proxy-name {mine} and serves only the Services \
                 labelled {label}={mine}; this one is {}",
                info.proxy_name_label
                    .as_deref()
                    .map_or_else(|| "not labelled".to_string(), |l| format!("labelled {l}"))
            ),
            _ if !source.lost.is_empty() => {
                let lost: Vec<String> = source
                    .lost
                    .iter()
                    .map(|(frontend, owner)| {
                        let how = if owner.as_cluster_ip {
                            " ClusterIP"
                        } else {
                            ""
                        };
                        format!("{frontend} is Service {owner}'s{how}")
                    })
                    .collect();
                format!(
                    "its frontends are other Services' ({}); see the warning logged when it \
                     lost them",
                    lost.join(", ")
                )
            }
            _ if info.ports.is_empty() => "no spec.ports".into(),
            _ => return None,
        })
    }

    /// The names of every Node the model holds: a brain compares them with the nodes
    /// connected to it, to name the ones that are not.
    pub fn node_names(&self) -> impl Iterator<Item = &str> {
        self.nodes.keys().map(String::as_str)
    }

    /// The Node object of this name, if known.
    pub fn node(&self, name: &str) -> Option<&Arc<NodeInfo>> {
        self.nodes.get(name)
    }

    /// The ranges of every ServiceCIDR, sorted, without duplicates: traffic to an IP inside
    /// them that no Service owns is dropped (kube-proxy's "unallocated ClusterIP" rule).
    pub fn service_cidrs(&self) -> Vec<IpNet> {
        let all: BTreeSet<IpNet> = self.service_cidrs.values().flatten().copied().collect();
        all.into_iter().collect()
    }

    /// `--service-cidr` and the ServiceCIDR objects' ranges together.
    fn all_service_cidrs(&self) -> Vec<IpNet> {
        let mut all = self.config.service_cidrs.clone();
        all.extend(self.service_cidrs.values().flatten().copied());
        all
    }

    /// Applies one event and reports what it touched.
    pub fn apply(&mut self, event: Event) -> ClusterOutcome {
        let mut out = ClusterOutcome::default();
        // A streamed list's start and items share one moment (see `clock`).
        let part_of_a_list = matches!(event, Event::ListStart { .. } | Event::ListItem(_));
        match event {
            Event::Apply(object) => self.apply_single(object, &mut out),
            Event::Delete(reference) => self.delete(&reference, &mut out),
            Event::Changes { deleted, applied } => {
                for reference in &deleted {
                    self.delete(reference, &mut out);
                }
                for object in applied {
                    self.apply_single(object, &mut out);
                }
            }
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
                    None => self.apply_single(object, &mut out),
                }
            }
            Event::ListDone { kinds } => {
                if let Some(at) = self.listings.iter().position(|l| l.kinds == kinds) {
                    let listing = self.listings.swap_remove(at);
                    self.finish_listing(listing, &mut out);
                }
            }
        }
        if !part_of_a_list {
            self.clock += 1;
        }
        out
    }

    /// One object outside any list: what it touches is added to this event's outcome (an
    /// [`Event::Changes`] applies several into one).
    fn apply_single(&mut self, object: Object, out: &mut ClusterOutcome) {
        let mut touched = Touched::default();
        self.apply_object(object, out, &mut touched);
        out.services.extend(touched.services);
        out.nodes.extend(touched.nodes);
        out.service_cidrs_changed |= touched.service_cidrs_changed;
    }

    /// Starts a streamed list. A list still in progress for any of these kinds is abandoned:
    /// what it applied stays (the new list removes what it does not repeat) and what it touched
    /// is reported when the new list ends.
    fn start_listing(&mut self, kinds: Vec<Kind>) {
        let mut listing = Listing::default();
        let (abandoned, kept): (Vec<Listing>, Vec<Listing>) = std::mem::take(&mut self.listings)
            .into_iter()
            .partition(|l| l.kinds.iter().any(|k| kinds.contains(k)));
        self.listings = kept;
        for old in abandoned {
            listing.services.extend(old.services);
            listing.nodes.extend(old.nodes);
            listing.service_cidrs_changed |= old.service_cidrs_changed;
        }
        listing.kinds = kinds;
        self.listings.push(listing);
    }

    /// Whether this proxy must program a Service at all.
    fn owns(&self, svc: &ServiceInfo) -> bool {
        if svc.ignored.is_some() || svc.headless_label {
            return false;
        }
        svc.proxy_name_label.as_deref() == self.config.service_proxy_name.as_deref()
    }

    fn keeps_node(&self, name: &str) -> bool {
        self.config
            .only_node
            .as_deref()
            .is_none_or(|only| only == name)
    }

    fn apply_object(&mut self, object: Object, out: &mut ClusterOutcome, touched: &mut Touched) {
        if !self.rejected.is_empty()
            && !matches!(object, Object::Rejected(_))
            && let Some(ended) = self.rejected.remove(&object.reference())
        {
            out.accepted_again.push(ended);
        }
        let mut object = object;
        let range_warnings = self.drop_out_of_range(&mut object);
        self.keep_dropped(&mut object);
        match object {
            Object::Service(info) => {
                let mut info = *info;
                info.shrink_to_fit();
                out.applied.add(Kind::Service);
                let owned = self.owns(&info);
                let cidrs = if owned && !info.external_ips.is_empty() {
                    self.all_service_cidrs()
                } else {
                    Vec::new()
                };
                let source = self.sources.entry(info.key.clone()).or_default();
                if source.info.is_none() {
                    Arc::make_mut(source).seen = self.clock;
                }
                if source.info.as_ref() != Some(&info) || source.owned != owned {
                    if source.info.as_ref() != Some(&info) {
                        out.services_changed.push(info.key.clone());
                    }
                    if owned {
                        out.warnings.extend(range_warnings);
                        out.warnings.extend(open_family_warnings(&info));
                        out.warnings
                            .extend(external_ips_in_service_cidrs(&info, &cidrs, &[]));
                    }
                    touched.services.insert(info.key.clone());
                    let old_claim = source.info.clone().filter(|_| source.owned);
                    let new_claim = owned.then(|| info.clone());
                    let source = Arc::make_mut(source);
                    source.owned = owned;
                    source.info = Some(info);
                    let seen = source.seen;
                    self.reclaim(
                        old_claim.as_ref(),
                        new_claim.as_ref(),
                        seen,
                        &mut touched.services,
                        &mut out.warnings,
                    );
                }
            }
            Object::EndpointSlice {
                slice,
                trigger_time,
            } => {
                let mut info = *slice;
                info.shrink_to_fit();
                out.applied.add(Kind::EndpointSlice);
                if let Some(only) = &self.config.only_node {
                    // Only locality matters: keep a node name only when it is ours (saves a
                    // string per endpoint, most of them remote).
                    for ep in &mut info.endpoints {
                        if ep.node_name.as_deref() != Some(only.as_str()) {
                            ep.node_name = None;
                        }
                    }
                }
                // The owning Service's key already holds the namespace: share it.
                let namespace = match &info.service {
                    Some(service) => service.namespace.clone(),
                    None => info.namespace.clone(),
                };
                info.namespace = namespace.clone();
                let service = info.service.clone();
                let family = info.family;
                if self.insert_slice(namespace, info, &mut touched.services) {
                    out.slices_changed += 1;
                    if let (Some(service), Some(family), Some(at)) = (service, family, trigger_time)
                    {
                        out.trigger_times.push(TriggerTime {
                            service,
                            family,
                            at,
                        });
                    }
                }
            }
            Object::Node(info) => {
                out.applied.add(Kind::Node);
                if self.keeps_node(&info.name)
                    && self.nodes.get(&info.name).map(|n| n.as_ref()) != Some(&*info)
                {
                    touched.nodes.insert(info.name.clone());
                    self.nodes.insert(info.name.clone(), Arc::new(*info));
                }
            }
            Object::ServiceCidr(info) => {
                let ServiceCidrInfo { name, cidrs } = *info;
                out.applied.add(Kind::ServiceCidr);
                if self.service_cidrs.get(&name) != Some(&cidrs) {
                    let before = self.all_service_cidrs();
                    self.service_cidrs.insert(name, cidrs);
                    touched.service_cidrs_changed = true;
                    let after = self.all_service_cidrs();
                    out.warnings.extend(
                        self.sources
                            .values()
                            .filter(|source| source.owned)
                            .filter_map(|source| source.info.as_ref())
                            .filter_map(|info| {
                                external_ips_in_service_cidrs(info, &after, &before)
                            }),
                    );
                }
            }
            Object::Rejected(error) => {
                let rejection = Rejection {
                    kept: self.holds(&error.object),
                    error: *error,
                };
                self.rejected
                    .insert(rejection.error.object.clone(), rejection.clone());
                out.errors.push(rejection);
            }
        }
    }

    /// Stores a slice; returns whether it differs from the stored version.
    fn insert_slice(
        &mut self,
        namespace: Name,
        info: SliceInfo,
        services: &mut BTreeSet<ServiceKey>,
    ) -> bool {
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
            return false;
        }
        self.remove_slice(&id, services);
        if let Some(service) = &info.service {
            services.insert(service.clone());
            // Sorted by name: the order slices are merged in (first copy of an endpoint wins).
            let source = Arc::make_mut(self.sources.entry(service.clone()).or_default());
            // Almost every Service has one slice: room for exactly one (a first `insert`
            // makes room for four, 360 bytes more per Service); more grow as usual.
            if source.slices.capacity() == 0 {
                source.slices.reserve_exact(1);
            }
            let at = source.slices.partition_point(|x| x.name < info.name);
            source.slices.insert(at, info.clone());
        }
        self.slice_owners.insert(id, info.service);
        true
    }

    /// Forgets a slice; returns whether it was known.
    fn remove_slice(&mut self, id: &(Name, Name), services: &mut BTreeSet<ServiceKey>) -> bool {
        let Some(owner) = self.slice_owners.remove(id) else {
            return false;
        };
        let Some(service) = owner else { return true };
        services.insert(service.clone());
        if let Some(source) = self.sources.get_mut(&service) {
            Arc::make_mut(source).slices.retain(|x| x.name != id.1);
            if source.is_empty() {
                self.sources.remove(&service);
            }
        }
        true
    }

    fn remove_service(&mut self, key: &ServiceKey, out: &mut ClusterOutcome) {
        let Some(source) = self.sources.get_mut(key) else {
            return;
        };
        if source.info.is_none() {
            return;
        }
        out.services.insert(key.clone());
        out.services_changed.push(key.clone());
        let source = Arc::make_mut(source);
        let old_claim = source.info.take().filter(|_| source.owned);
        source.owned = false;
        source.lost = Lost::new();
        let seen = source.seen;
        if source.is_empty() {
            self.sources.remove(key);
        }
        self.reclaim(
            old_claim.as_ref(),
            None,
            seen,
            &mut out.services,
            &mut out.warnings,
        );
    }

    /// Moves one Service's frontend claims from `old` to `new` (each `None` when it claims
    /// nothing) and recomputes what every Service sharing one of those frontends lost: the
    /// ones whose lost set changed are added to `services` (their views change), and a warning
    /// names each newly lost frontend (or one whose owner changed) and its owner.
    fn reclaim(
        &mut self,
        old: Option<&ServiceInfo>,
        new: Option<&ServiceInfo>,
        seen: Seen,
        services: &mut BTreeSet<ServiceKey>,
        warnings: &mut Vec<Warning>,
    ) {
        for key in self.claims.update(old, new, seen) {
            let Some(source) = self.sources.get_mut(&key) else {
                self.set_conflicts(&key, Vec::new());
                continue;
            };
            let lost = match &source.info {
                Some(info) if source.owned => self.claims.lost(info),
                _ => Lost::new(),
            };
            let conflicts = match &source.info {
                Some(info) => lost
                    .iter()
                    .flat_map(|(frontend, owner)| conflict_warnings(info, *frontend, owner))
                    .collect(),
                None => Vec::new(),
            };
            if lost == source.lost {
                self.set_conflicts(&key, conflicts);
                continue;
            }
            if let Some(info) = &source.info {
                for (frontend, owner) in &lost {
                    if source.lost.get(frontend) != Some(owner) {
                        warnings.extend(conflict_warnings(info, *frontend, owner));
                    }
                }
            }
            Arc::make_mut(source).lost = lost;
            self.set_conflicts(&key, conflicts);
            services.insert(key);
        }
    }

    /// Records the frontends `key` lost as its dropped values (`conflicts`), counting a change.
    fn set_conflicts(&mut self, key: &ServiceKey, conflicts: Vec<Warning>) {
        let changed = if conflicts.is_empty() {
            self.conflicts.remove(key).is_some()
        } else if self.conflicts.get(key).map(|c| &c[..]) == Some(&conflicts[..]) {
            false
        } else {
            self.conflicts.insert(key.clone(), conflicts.into());
            true
        };
        self.dropped_changes += u64::from(changed);
    }

    /// Drops the node ports of a Service this proxy programs that are outside
    /// `--service-node-port-range`, adding each to the Service's dropped values (so that
    /// `kpng status` shows them while they last, not only a warning that scrolls away), and
    /// returns the warnings, logged when the Service changes.
    fn drop_out_of_range(&self, object: &mut Object) -> Vec<Warning> {
        let (Object::Service(info), Some(range)) = (object, self.config.node_port_range) else {
            return Vec::new();
        };
        if !self.owns(info) {
            return Vec::new();
        }
        let warnings = drop_out_of_range(info, range);
        if !warnings.is_empty() {
            let mut all = info.dropped.take().map(Vec::from).unwrap_or_default();
            all.extend(warnings.iter().cloned());
            info.dropped = crate::records::dropped(&all);
        }
        warnings
    }

    /// Moves the values the conversion dropped from `object` (a Service or EndpointSlice)
    /// into `dropped`, replacing what its previous version had; a rejected object keeps its
    /// last good version's.
    fn keep_dropped(&mut self, object: &mut Object) {
        let taken = match object {
            Object::Service(info) => info.dropped.take(),
            Object::EndpointSlice { slice, .. } => slice.dropped.take(),
            Object::Rejected(_) => return,
            Object::Node(_) | Object::ServiceCidr(_) => None,
        };
        let changed = match taken {
            Some(warnings) => {
                let reference = object.reference();
                if self.dropped.get(&reference) == Some(&warnings) {
                    false
                } else {
                    self.dropped.insert(reference, warnings);
                    true
                }
            }
            None if !self.dropped.is_empty() => self.dropped.remove(&object.reference()).is_some(),
            None => false,
        };
        self.dropped_changes += u64::from(changed);
    }

    /// How many times the dropped values ([`ClusterModel::dropped`]) changed: a brain makes
    /// the report it sends its nodes again when this moves, without comparing the values.
    pub fn dropped_changes(&self) -> u64 {
        self.dropped_changes
    }

    /// The values the conversion dropped from the objects in use (the rest of each object is
    /// used), and the frontends a Service lost to another Service that keeps them, in kind and
    /// name order, each with the Service it concerns (a Service's own, an EndpointSlice's
    /// owner): shown by `kpng status` beside the input's health.
    pub fn dropped(&self) -> impl Iterator<Item = (Option<&ServiceKey>, &Warning)> {
        let mut all: Vec<(Option<&ServiceKey>, &Warning)> = self.converted_dropped().collect();
        if !self.conflicts.is_empty() {
            all.extend(
                self.conflicts
                    .iter()
                    .flat_map(|(key, warnings)| warnings.iter().map(move |w| (Some(key), w))),
            );
            // Stable: each object's values stay in field order, conversion's first.
            all.sort_by(|a, b| a.1.object.cmp(&b.1.object));
        }
        all.into_iter()
    }

    /// The values the conversion dropped (`dropped`), each with the Service it concerns.
    fn converted_dropped(&self) -> impl Iterator<Item = (Option<&ServiceKey>, &Warning)> {
        self.dropped.iter().flat_map(|(object, warnings)| {
            let service = match object.kind {
                Kind::EndpointSlice => self
                    .slice_owners
                    .get(&(object.namespace.clone(), object.name.clone()))
                    .and_then(Option::as_ref),
                Kind::Service => self
                    .sources
                    .get_key_value(&ServiceKey::new(
                        object.namespace.clone(),
                        object.name.clone(),
                    ))
                    .map(|(key, _)| key),
                Kind::Node | Kind::ServiceCidr => None,
            };
            warnings.iter().map(move |w| (service, w))
        })
    }

    fn delete(&mut self, reference: &ObjectRef, out: &mut ClusterOutcome) {
        self.rejected.remove(reference);
        if self.dropped.remove(reference).is_some() {
            self.dropped_changes += 1;
        }
        match reference.kind {
            Kind::Service => {
                let key = ServiceKey::new(reference.namespace.clone(), reference.name.clone());
                self.remove_service(&key, out);
            }
            Kind::EndpointSlice => {
                let id = (reference.namespace.clone(), reference.name.clone());
                if self.remove_slice(&id, &mut out.services) {
                    out.slices_changed += 1;
                }
            }
            Kind::Node => {
                if self.nodes.remove(&*reference.name).is_some() {
                    out.nodes.insert(reference.name.to_string());
                }
            }
            Kind::ServiceCidr => {
                if self.service_cidrs.remove(&*reference.name).is_some() {
                    out.service_cidrs_changed = true;
                }
            }
        }
    }

    /// The objects whose latest version was rejected, in kind and name order.
    pub fn rejected(&self) -> impl ExactSizeIterator<Item = &Rejection> {
        self.rejected.values()
    }

    /// Whether the model holds a version of this object.
    fn holds(&self, object: &ObjectRef) -> bool {
        match object.kind {
            Kind::Service => self
                .sources
                .get(&ServiceKey::new(
                    object.namespace.clone(),
                    object.name.clone(),
                ))
                .is_some_and(|s| s.info.is_some()),
            Kind::EndpointSlice => self
                .slice_owners
                .contains_key(&(object.namespace.clone(), object.name.clone())),
            Kind::Node => self.nodes.contains_key(&*object.name),
            Kind::ServiceCidr => self.service_cidrs.contains_key(&*object.name),
        }
    }

    /// One object of a complete list. Objects that fail conversion keep their previous version,
    /// so a relist with one broken object changes nothing about it.
    fn list_item(&mut self, listing: &mut Listing, object: Object, out: &mut ClusterOutcome) {
        if !listing.kinds.contains(&object.kind()) {
            return;
        }
        listing.seen.insert(object.reference());
        let mut touched = Touched {
            services: std::mem::take(&mut listing.services),
            nodes: std::mem::take(&mut listing.nodes),
            service_cidrs_changed: listing.service_cidrs_changed,
        };
        self.apply_object(object, out, &mut touched);
        listing.services = touched.services;
        listing.nodes = touched.nodes;
        listing.service_cidrs_changed = touched.service_cidrs_changed;
    }

    /// Ends a list: objects of its kinds that were not listed (and not kept because of an
    /// error) are gone.
    fn finish_listing(&mut self, listing: Listing, out: &mut ClusterOutcome) {
        let Listing {
            kinds,
            seen,
            services,
            nodes,
            service_cidrs_changed,
        } = listing;
        out.services.extend(services);
        out.nodes.extend(nodes);
        out.service_cidrs_changed |= service_cidrs_changed;
        self.rejected
            .retain(|r, _| !kinds.contains(&r.kind) || seen.contains(r));
        let before = self.dropped.len();
        self.dropped
            .retain(|r, _| !kinds.contains(&r.kind) || seen.contains(r));
        if self.dropped.len() != before {
            self.dropped_changes += 1;
        }
        let kept = |kind: Kind, namespace: &Name, name: &Name| {
            seen.contains(&ObjectRef {
                kind,
                namespace: namespace.clone(),
                name: name.clone(),
            })
        };
        let cluster_scoped = |kind: Kind, name: &str| {
            seen.contains(&ObjectRef {
                kind,
                namespace: "".into(),
                name: name.into(),
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
                self.remove_service(&key, out);
            }
        }
        if kinds.contains(&Kind::EndpointSlice) {
            let gone: Vec<(Name, Name)> = self
                .slice_owners
                .keys()
                .filter(|(ns, name)| !kept(Kind::EndpointSlice, ns, name))
                .cloned()
                .collect();
            for id in gone {
                if self.remove_slice(&id, &mut out.services) {
                    out.slices_changed += 1;
                }
            }
        }
        if kinds.contains(&Kind::Node) {
            let gone: Vec<String> = self
                .nodes
                .keys()
                .filter(|name| !cluster_scoped(Kind::Node, name))
                .cloned()
                .collect();
            for name in gone {
                self.nodes.remove(&name);
                out.nodes.insert(name);
            }
        }
        if kinds.contains(&Kind::ServiceCidr) {
            let before = self.service_cidrs.len();
            self.service_cidrs
                .retain(|name, _| cluster_scoped(Kind::ServiceCidr, name));
            out.service_cidrs_changed |= self.service_cidrs.len() != before;
        }
        out.listed = kinds;
    }
}

/// The node as the model sees it: `name` (from configuration), the Node object's properties
/// when known, and `override_ips` (`--node-ip`) in place of its addresses of the same family
/// ([`override_node_ips`]).
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
    state.ips = override_node_ips(&state.ips, override_ips);
    state
}

/// The node IPs with `overrides` (`--node-ip`, `--bind-address`) applied as kube-proxy applies
/// its bind address (`detectNodeIPs`): each replaces the node IP of its own family and
/// becomes primary (first); a family it does not name keeps the Node object's IP. So an IPv6
/// `--bind-address` on a dual-stack node does not take the IPv4 node IP (and the IPv4 node
/// ports with it) away.
pub fn override_node_ips(
    node_ips: &[std::net::IpAddr],
    overrides: &[std::net::IpAddr],
) -> Vec<std::net::IpAddr> {
    let mut ips: Vec<std::net::IpAddr> = Vec::with_capacity(2);
    for ip in overrides.iter().chain(node_ips) {
        if !ips.iter().any(|have| have.is_ipv4() == ip.is_ipv4()) {
            ips.push(*ip);
        }
    }
    ips
}
