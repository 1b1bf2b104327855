//! Where a runner's node-local state comes from.
//!
//! The runner (crate `kpng-runner`) is generic over [`NodeModel`], so the same sync loop drives
//! a backend from the in-process [`Model`] (fed with converted objects by a source) and from a
//! remote brain's state received over the gRPC API (`kpng-api`'s `RemoteModel`). The trait lives
//! in the contract crate so that the API client does not depend on the runner.

use kpng_model::{ApplyOutcome, Event, Kind, Model, Object, Snapshot};

/// Where the runner's node-local state comes from: the in-process [`Model`] fed with
/// Kubernetes objects, or a remote brain's state received over the API. Both drive the same
/// backend through the same loop.
pub trait NodeModel: Send + 'static {
    /// What the source sends.
    type Input: Send + 'static;
    /// What one input carries, for the input metrics (before it is applied).
    fn describe(input: &Self::Input) -> InputInfo;
    /// Applies one input: the diff of the snapshot, problems, kinds now completely listed and
    /// kube-proxy's change counters.
    fn apply(&mut self, input: Self::Input) -> ApplyOutcome;
    /// The current node-local state.
    fn snapshot(&self) -> &Snapshot;
    /// Stops waiting for the node's IPs (see [`Model::give_up_waiting_for_node_ips`]): the
    /// runner calls it a while after the initial lists. The diff says whether the node
    /// changed. Both models keep the node through [`kpng_model::NodeMemory`], so a brain-fed
    /// node keeps its last node IPs and falls back as an in-process one does.
    fn give_up_waiting_for_node_ips(&mut self) -> kpng_model::Diff;
    /// Whether this node's state comes from a brain (`kpng api …`): its first sync then waits
    /// for the brain's first state, not for lists of objects, and `kpng trace` says so.
    fn fed_by_brain(&self) -> bool {
        false
    }
    /// Every endpoint of one port with why it is used or not, for `kpng status`; `None` when
    /// this model cannot tell (a brain's view carries only the endpoints in use).
    fn explain(
        &self,
        _key: &kpng_model::PortKey,
    ) -> Option<Vec<kpng_model::inspect::EndpointStatus>> {
        None
    }
    /// The `loadBalancerSourceRanges` of the port's Service when none is of the port's family
    /// (its load-balancer IPs then accept every source, as in kube-proxy), for `kpng status`
    /// and `kpng trace`; empty otherwise, or when this model cannot tell (a brain's node
    /// receives only the ranges of each port's family; the brain logs the warning).
    fn source_ranges_of_other_families_only(
        &self,
        _key: &kpng_model::PortKey,
    ) -> Vec<ipnet::IpNet> {
        Vec::new()
    }
    /// For a port without any endpoint, its Service's EndpointSlices of a family the Service
    /// has no cluster IP of, as (family, slices, endpoints): ignored as kube-proxy ignores
    /// them, which `kpng status` says beside "no endpoints"; empty otherwise, or when this
    /// model does not see slices (a brain's node).
    fn slices_of_unserved_families(
        &self,
        _key: &kpng_model::PortKey,
    ) -> Vec<(kpng_model::Family, usize, usize)> {
        Vec::new()
    }
    /// The Service that shows `ip` as an address that gets no rules on purpose (an
    /// ExternalName Service's clusterIP, an `ipMode: Proxy` ingress IP), for `kpng trace` to
    /// name it; `None` when no Service does, or when this model does not see Services (a
    /// brain's node gets only what is programmed).
    fn not_proxied(&self, _ip: std::net::IpAddr) -> Option<kpng_model::trace::NotProxied> {
        None
    }
    /// The objects whose latest version was rejected, for `kpng status`; empty when this model
    /// does not see objects (a brain's node gets views; the brain's own status names them).
    fn rejected(&self) -> Vec<kpng_model::records::Rejection> {
        Vec::new()
    }
    /// The values the conversion dropped from the objects in use (the rest of each object
    /// is used), for `kpng status`; empty when this model does not see objects.
    fn dropped(&self) -> Vec<(Option<kpng_model::ServiceKey>, kpng_model::Warning)> {
        Vec::new()
    }
    /// How many objects [`NodeModel::rejected`] would list (cheap: read after every input).
    fn rejected_count(&self) -> usize {
        0
    }
    /// The Services matching `wanted` (namespace, name) that this model holds but programs no
    /// port of, with why, for `kpng status NAME`; empty when this model cannot tell (a
    /// brain's node receives only what it programs).
    fn not_programmed(
        &self,
        _wanted: &dyn Fn(&str, &str) -> bool,
    ) -> Vec<(kpng_model::ServiceKey, String)> {
        Vec::new()
    }
}

/// What one input carries: counted in `kpng_objects_seen_total` and kube-proxy's
/// `…_changes_total` before it is applied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InputInfo {
    /// The kinds of the Kubernetes objects it carries, one entry per object.
    pub objects: Vec<Kind>,
    /// Service changes it carries (`kubeproxy_sync_proxy_rules_service_changes_total`).
    pub service_changes: u64,
    /// Endpoint changes it carries (`kubeproxy_sync_proxy_rules_endpoint_changes_total`).
    pub endpoint_changes: u64,
    /// Whether the change counters move by what the model found changed (the applied
    /// outcome's changed Services and EndpointSlices) rather than by `service_changes` and
    /// `endpoint_changes`: a batch (a file reloaded, a re-list) repeats every object it
    /// still has, changed or not, and counting them all would make `rate()` show churn that
    /// is not there (editing one EndpointSlice in a file of 9 Services counted 9 Service
    /// changes).
    pub changes_from_outcome: bool,
}

impl InputInfo {
    /// An input carrying these Kubernetes objects: each Service and EndpointSlice is one change.
    pub fn objects(objects: Vec<Kind>) -> InputInfo {
        let count = |k: Kind| objects.iter().filter(|o| **o == k).count() as u64;
        InputInfo {
            service_changes: count(Kind::Service),
            endpoint_changes: count(Kind::EndpointSlice),
            objects,
            changes_from_outcome: false,
        }
    }

    /// A batch carrying these objects (a whole file, a list): seen as carried, counted as
    /// changes only where they differ from what the model had ([`InputInfo::changes_from_outcome`]).
    pub fn batch(objects: Vec<Kind>) -> InputInfo {
        InputInfo {
            objects,
            service_changes: 0,
            endpoint_changes: 0,
            changes_from_outcome: true,
        }
    }
}

impl NodeModel for Model {
    type Input = Event;

    fn describe(event: &Event) -> InputInfo {
        match event {
            Event::Apply(o) | Event::ListItem(o) => InputInfo::objects(vec![o.kind()]),
            Event::Delete(r) => InputInfo::objects(vec![r.kind]),
            // A single watch event counts as one change, as kube-proxy counts every event.
            // A batch (a reloaded file, a re-list) repeats what did not change: only what the
            // model finds changed counts.
            Event::Changes { deleted, applied } => InputInfo::batch(
                deleted
                    .iter()
                    .map(|r| r.kind)
                    .chain(applied.iter().map(Object::kind))
                    .collect(),
            ),
            Event::Replace { objects, .. } => {
                InputInfo::batch(objects.iter().map(|o| o.kind()).collect())
            }
            Event::ListStart { .. } | Event::ListDone { .. } => InputInfo::default(),
        }
    }

    fn apply(&mut self, event: Event) -> ApplyOutcome {
        Model::apply(self, event)
    }

    fn snapshot(&self) -> &Snapshot {
        Model::snapshot(self)
    }

    fn give_up_waiting_for_node_ips(&mut self) -> kpng_model::Diff {
        Model::give_up_waiting_for_node_ips(self)
    }

    fn explain(
        &self,
        key: &kpng_model::PortKey,
    ) -> Option<Vec<kpng_model::inspect::EndpointStatus>> {
        Model::explain(self, key)
    }

    fn source_ranges_of_other_families_only(&self, key: &kpng_model::PortKey) -> Vec<ipnet::IpNet> {
        Model::source_ranges_of_other_families_only(self, key)
    }

    fn slices_of_unserved_families(
        &self,
        key: &kpng_model::PortKey,
    ) -> Vec<(kpng_model::Family, usize, usize)> {
        Model::slices_of_unserved_families(self, key)
    }

    fn not_proxied(&self, ip: std::net::IpAddr) -> Option<kpng_model::trace::NotProxied> {
        Model::not_proxied(self, ip)
    }

    fn rejected(&self) -> Vec<kpng_model::records::Rejection> {
        Model::rejected(self).cloned().collect()
    }

    fn rejected_count(&self) -> usize {
        Model::rejected(self).len()
    }

    fn dropped(&self) -> Vec<(Option<kpng_model::ServiceKey>, kpng_model::Warning)> {
        Model::dropped(self)
            .map(|(service, w)| (service.cloned(), w.clone()))
            .collect()
    }

    fn not_programmed(
        &self,
        wanted: &dyn Fn(&str, &str) -> bool,
    ) -> Vec<(kpng_model::ServiceKey, String)> {
        Model::not_programmed(self, wanted)
    }
}
