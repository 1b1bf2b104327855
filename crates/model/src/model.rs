//! The incremental model: objects in, per-Service-port diffs out.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use crate::cluster::{ClusterConfig, ClusterModel, TriggerTime, node_state};
use crate::diff::Diff;
use crate::event::{Event, Kind};
use crate::key::{Family, PortKey, Protocol, ServiceKey};
use crate::node::{NodeChange, NodeMemory, NodeState};
use crate::port_range::NodePortRange;
use crate::records::{Rejection, Warning};
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
    /// `--service-node-port-range`: node ports outside it are not programmed (warned about).
    /// `None` accepts any node port.
    pub node_port_range: Option<NodePortRange>,
    /// `--service-cidr`: an external IP inside it (or inside a ServiceCIDR object) is warned
    /// about, since it names a ClusterIP the API server allocates.
    pub service_cidrs: Vec<IpNet>,
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

    /// The ports of one Service, in key order: a range of the map (ports are ordered by
    /// Service first), so per-Service work after a change does not walk every port.
    pub fn service_ports<'a>(
        &'a self,
        key: &'a ServiceKey,
    ) -> impl Iterator<Item = &'a Arc<ServicePort>> + 'a {
        let first = PortKey {
            service: key.clone(),
            port_name: "".into(),
            protocol: Protocol::Tcp,
            family: Family::V4,
        };
        self.ports
            .range(first..)
            .take_while(move |(k, _)| &k.service == key)
            .map(|(_, p)| p)
    }

    /// Replaces every port of Service `key` with `new_ports` (all of them: a port left out is
    /// gone) and records in `diff` only the ports that really changed. Equal ports keep their
    /// `Arc`, so an unchanged Service costs nothing downstream.
    pub fn replace_service(
        &mut self,
        key: &ServiceKey,
        new_ports: Vec<ServicePort>,
        diff: &mut Diff,
    ) {
        let old_keys: Vec<PortKey> = self.service_ports(key).map(|p| p.key.clone()).collect();
        if old_keys.is_empty() {
            // A Service new to the snapshot (every one at start-up): its ports go straight in,
            // without the by-key map that matches them against old ones. A repeated key ends
            // as the map would leave it: the last one wins, in the snapshot and in the diff.
            for port in new_ports {
                let key = port.key.clone();
                let port = Arc::new(port);
                self.ports.insert(key.clone(), port.clone());
                diff.record(key, None, Some(port));
            }
            return;
        }
        let mut new_by_key: BTreeMap<PortKey, ServicePort> =
            new_ports.into_iter().map(|p| (p.key.clone(), p)).collect();
        for old_key in old_keys {
            let replacement = new_by_key.remove(&old_key);
            let old = self.ports.get(&old_key).cloned();
            match replacement {
                Some(port) if old.as_deref() == Some(&port) => {}
                Some(port) => {
                    let port = Arc::new(port);
                    self.ports.insert(old_key.clone(), port.clone());
                    diff.record(old_key, old, Some(port));
                }
                None => {
                    self.ports.remove(&old_key);
                    diff.record(old_key, old, None);
                }
            }
        }
        for (k, port) in new_by_key {
            let port = Arc::new(port);
            self.ports.insert(k.clone(), port.clone());
            diff.record(k, None, Some(port));
        }
    }
}

/// What applying one event produced.
#[derive(Debug, Default)]
pub struct ApplyOutcome {
    /// The Service ports that changed, and whether anything the backends program from the node
    /// or the Service CIDRs did ([`Diff::node_changed`]).
    pub diff: Diff,
    /// The node's view changed in its status only ([`crate::NodeChange::Status`]: the Node
    /// deleted or re-created with the same values, being deleted, tainted): `/healthz` and the
    /// node log follow it, and there is nothing to program (the diff says nothing of it).
    pub node_status_changed: bool,
    /// Objects that could not be used; their previous version (if any) was kept.
    pub errors: Vec<Rejection>,
    /// Objects rejected until now that a usable version replaces (see
    /// [`crate::ClusterOutcome::accepted_again`]).
    pub accepted_again: Vec<Rejection>,
    /// Values refused in objects otherwise used (see [`crate::ClusterOutcome::warnings`]).
    pub warnings: Vec<Warning>,
    /// Objects accepted into the model, per kind.
    pub applied: crate::AppliedCounts,
    /// Kinds whose complete list this event finished (the runner programs nothing before
    /// Services, EndpointSlices and Nodes have all been listed once).
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
}

/// The node-local model. Feed it [`Event`]s; read [`Model::snapshot`].
///
/// A [`ClusterModel`] restricted to this node holds the objects; every event recomputes only
/// the Services it touches (a Node zone change touches all of them) and returns the diff of
/// their ports.
#[derive(Debug, Default)]
pub struct Model {
    config: ModelConfig,
    cluster: ClusterModel,
    snapshot: Snapshot,
    /// What the Node last said, kept when it is deleted or stops saying it, and whether the
    /// wait for node IPs is over (shared with a brain-fed node's model).
    memory: NodeMemory,
}

impl Model {
    /// An empty model for this node.
    pub fn new(config: ModelConfig) -> Model {
        let cluster = ClusterModel::new(ClusterConfig {
            service_proxy_name: config.service_proxy_name.clone(),
            only_node: Some(config.node_name.clone()),
            node_port_range: config.node_port_range,
            service_cidrs: config.service_cidrs.clone(),
        });
        let mut model = Model {
            config,
            cluster,
            snapshot: Snapshot::default(),
            memory: NodeMemory::default(),
        };
        model.snapshot.node = model.node_state();
        model
    }

    /// The current node-local state.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// The values the conversion dropped from the objects in use (see
    /// [`ClusterModel::dropped`]).
    pub fn dropped(&self) -> impl Iterator<Item = (Option<&ServiceKey>, &Warning)> {
        self.cluster.dropped()
    }

    /// The objects whose latest version was rejected (see [`ClusterModel::rejected`]).
    pub fn rejected(&self) -> impl ExactSizeIterator<Item = &Rejection> {
        self.cluster.rejected()
    }

    /// The Service that shows `ip` as an address that gets no rules on purpose
    /// ([`ClusterModel::not_proxied`]), for [`crate::trace::trace_noting`].
    pub fn not_proxied(&self, ip: IpAddr) -> Option<crate::trace::NotProxied> {
        self.cluster.not_proxied(ip)
    }

    /// Every Service the model holds that has no port on this node and matches `wanted`
    /// (namespace, name), with why ([`ClusterModel::why_not_programmed`]): what `kpng status
    /// NAME` says instead of "no such Service". Walks every Service: asked on demand only.
    pub fn not_programmed(&self, wanted: &dyn Fn(&str, &str) -> bool) -> Vec<(ServiceKey, String)> {
        let programmed = |key: &ServiceKey| self.snapshot.ports.keys().any(|k| &k.service == key);
        let mut out: Vec<(ServiceKey, String)> = self
            .cluster
            .sources()
            .filter(|(key, _)| wanted(&key.namespace, &key.name) && !programmed(key))
            .filter_map(|(key, _)| Some((key.clone(), self.cluster.why_not_programmed(key)?)))
            .collect();
        out.sort();
        out
    }

    /// Every endpoint of one Service port with whether this node uses it and, if not, why;
    /// `None` for a port the snapshot does not hold.
    pub fn explain(&self, key: &PortKey) -> Option<Vec<crate::inspect::EndpointStatus>> {
        let port = self.snapshot.ports.get(key)?;
        self.cluster
            .source(&key.service)?
            .explain(port, &self.snapshot.node)
    }

    /// For a port of `key`'s Service without any endpoint: the Service's EndpointSlices of a
    /// family it has no cluster IP of, as (family, slices, endpoints), ignored as kube-proxy
    /// ignores them ([`crate::ServiceSource::slices_of_unserved_families`]). Empty when the port has
    /// endpoints or the Service no such slice.
    pub fn slices_of_unserved_families(&self, key: &PortKey) -> Vec<(Family, usize, usize)> {
        let without = self
            .snapshot
            .ports
            .get(key)
            .is_some_and(|p| !p.has_any_endpoints);
        if !without {
            return Vec::new();
        }
        self.cluster
            .source(&key.service)
            .map(|s| s.slices_of_unserved_families())
            .unwrap_or_default()
    }

    /// The `loadBalancerSourceRanges` of the Service of `key` when none is of the port's
    /// family, for a port that has load-balancer IPs: they then let every source in (as in
    /// kube-proxy), which `kpng status` and `kpng trace` say. Empty otherwise.
    pub fn source_ranges_of_other_families_only(&self, key: &PortKey) -> Vec<IpNet> {
        let has_lb = self
            .snapshot
            .ports
            .get(key)
            .is_some_and(|p| !p.load_balancer_ips.is_empty());
        if !has_lb {
            return Vec::new();
        }
        self.cluster
            .source(&key.service)
            .map(|s| s.source_ranges_of_other_families_only(key.family))
            .unwrap_or_default()
    }

    /// Applies one event and returns what changed.
    pub fn apply(&mut self, event: Event) -> ApplyOutcome {
        let touched = self.cluster.apply(event);
        let mut out = ApplyOutcome {
            errors: touched.errors,
            accepted_again: touched.accepted_again,
            warnings: touched.warnings,
            applied: touched.applied,
            listed: touched.listed,
            services_changed: touched.services_changed,
            slices_changed: touched.slices_changed,
            trigger_times: touched.trigger_times,
            diff: Diff::default(),
            node_status_changed: false,
        };
        if touched.service_cidrs_changed {
            let cidrs = self.cluster.service_cidrs();
            if cidrs != self.snapshot.service_cidrs {
                self.snapshot.service_cidrs = cidrs;
                out.diff.node_changed = true;
                out.diff.node_changes.service_cidrs = true;
            }
        }
        let node_dirty = touched.nodes.contains(&self.config.node_name);
        out.node_status_changed = self.refresh(touched.services, node_dirty, &mut out.diff);
        out
    }

    /// Stops waiting for the node's IPs: while none is known (no Node, or one without
    /// InternalIP/ExternalIP, and no `--node-ip`), `--nodeport-addresses primary` means every
    /// local address from now on ([`NodeState::nodeports_on_all_local`]), as kube-proxy does
    /// when its start-up wait for the Node's addresses times out. The caller decides when
    /// (the model knows no time). Returns the diff: `node_changed` when that changed the node.
    pub fn give_up_waiting_for_node_ips(&mut self) -> Diff {
        let mut diff = Diff::default();
        self.memory.give_up_waiting_for_ips();
        // Only `nodeports_on_all_local` can change, a programmed value: no status change.
        self.refresh(BTreeSet::new(), true, &mut diff);
        diff
    }

    /// The node from the Node object, with what it no longer says taken from what it said
    /// before ([`NodeMemory`]), then `--node-ip` applied.
    fn node_state(&mut self) -> NodeState {
        let node = self
            .cluster
            .node(&self.config.node_name)
            .map(|n| n.as_ref());
        let current = node_state(&self.config.node_name, node, &[]);
        self.memory.view(&current, &self.config.node_ips)
    }

    /// Recomputes the dirty Services (all of them when the node's zone changed) into the
    /// snapshot and records the transitions in `diff`: `node_changed` only when the node
    /// changed in what the backends program. Returns whether it changed in its status only.
    fn refresh(
        &mut self,
        mut dirty: BTreeSet<ServiceKey>,
        node_dirty: bool,
        diff: &mut Diff,
    ) -> bool {
        let mut status_changed = false;
        if node_dirty {
            let state = self.node_state();
            let zone_changed = state.zone != self.snapshot.node.zone;
            let changes = crate::NodeChanges::between(&self.snapshot.node, &state);
            match self.snapshot.node.replace(state) {
                NodeChange::None => {}
                NodeChange::Status => status_changed = true,
                NodeChange::Programmed => {
                    if zone_changed {
                        dirty.extend(self.cluster.sources().map(|(k, _)| k.clone()));
                        dirty.extend(self.snapshot.ports.keys().map(|k| k.service.clone()));
                    }
                    diff.node_changed = true;
                    diff.node_changes.merge(changes);
                }
            }
        }
        let computed = compute_ports(&self.cluster, &dirty, &self.snapshot.node);
        for (key, new_ports) in dirty.iter().zip(computed) {
            self.snapshot.replace_service(key, new_ports, diff);
        }
        status_changed
    }
}

/// Below this many dirty Services one thread computes them all (threads cost more than they
/// save on a single change).
const SERVICES_PER_THREAD_AT_LEAST: usize = 2048;

/// The ports of every `dirty` Service as `node` sees them, in `dirty`'s order. The end of a
/// large list (a start-up: every Service dirty at once) computes them on every CPU: each
/// Service's ports depend only on its own inputs and the node, so the work splits freely.
fn compute_ports(
    cluster: &ClusterModel,
    dirty: &BTreeSet<ServiceKey>,
    node: &NodeState,
) -> Vec<Vec<ServicePort>> {
    let one = |key: &ServiceKey| match cluster.source(key) {
        Some(source) => source.ports_for(node),
        None => Vec::new(),
    };
    // Most events dirty a Service or none: decided before asking for the CPU count, which
    // reads cgroup files on Linux (a dozen system calls per event, a measured 2 CPU-seconds
    // over a 60k-object start-up).
    if dirty.len() < 2 * SERVICES_PER_THREAD_AT_LEAST {
        return dirty.iter().map(one).collect();
    }
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(dirty.len() / SERVICES_PER_THREAD_AT_LEAST)
        .max(1);
    if threads == 1 {
        return dirty.iter().map(one).collect();
    }
    let keys: Vec<&ServiceKey> = dirty.iter().collect();
    let share = keys.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = keys
            .chunks(share)
            .skip(1)
            .map(|part| scope.spawn(move || part.iter().map(|k| one(k)).collect::<Vec<_>>()))
            .collect();
        let mut out: Vec<Vec<ServicePort>> = keys
            .get(..share.min(keys.len()))
            .unwrap_or_default()
            .iter()
            .map(|k| one(k))
            .collect();
        for handle in handles {
            match handle.join() {
                Ok(part) => out.extend(part),
                // A panic in the computation is a bug; re-raise it where it belongs.
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        out
    })
}
