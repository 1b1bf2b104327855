//! This node's identity and properties, as far as Service proxying cares.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::Serialize;

/// What the model knows about the node it runs on.
///
/// The node name always comes from configuration; the rest comes from the Node object of that
/// name when the source has one, with `--node-ip`/`--bind-address` taking precedence for IPs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NodeState {
    /// The node name: endpoints whose `nodeName` equals it are local.
    pub name: String,
    /// Whether the Node object has been seen (kube-proxy's `/healthz` requires it).
    pub known: bool,
    /// The node's primary IPs: InternalIP, then ExternalIP, one per family at most, unless
    /// overridden by configuration. Used for `--nodeport-addresses primary`.
    pub ips: Vec<IpAddr>,
    /// The `topology.kubernetes.io/zone` label: selects zone-hinted endpoints. While the Node is
    /// deleted, the last one it had ([`NodeMemory`]).
    pub zone: Option<String>,
    /// `spec.podCIDRs`: the local-traffic detector in NodeCIDR mode.
    pub pod_cidrs: Vec<IpNet>,
    /// The Node has a deletion timestamp.
    pub deleting: bool,
    /// The Node carries the cluster autoscaler's `ToBeDeletedByClusterAutoscaler` taint.
    pub to_be_deleted: bool,
    /// A Node of this name has been seen since start. With `known` false it was deleted
    /// (rather than never there: a wrong `--hostname-override`), which `kpng status` tells apart.
    pub ever_known: bool,
    /// `ips` are the last ones the Node had: it has been deleted, or lists no address any more.
    /// kube-proxy fixes its node IPs at start; dropping them would stop the NodePorts on them
    /// while the health-check node ports still answer, so a load balancer keeps sending
    /// traffic that is dropped.
    pub ips_kept: bool,
    /// `pod_cidrs` are the last ones the Node had (it has been deleted or lists none): the
    /// NodeCIDR local-traffic detector keeps working, as kube-proxy's start-up values do.
    pub pod_cidrs_kept: bool,
    /// No node IP is known a while after the initial lists ([`crate::Model::give_up_waiting_for_node_ips`]):
    /// `--nodeport-addresses primary` then means every local address, as kube-proxy does once
    /// its start-up wait for the Node's addresses times out. Cleared when an IP appears.
    pub nodeports_on_all_local: bool,
}

impl NodeState {
    /// kube-proxy's node eligibility for `/healthz`: Node known, not being deleted, not tainted
    /// for deletion by the cluster autoscaler.
    pub fn eligible(&self) -> bool {
        self.known && !self.deleting && !self.to_be_deleted
    }

    /// Whether `other` gives the backends the same values to program as this view: the node
    /// IPs, the pod CIDRs, the zone (topology-aware routing chooses endpoints by it) and whether
    /// NodePorts go to every local address. The rest (whether the Node exists or is being
    /// deleted, whether values are kept) is the node's status, for `/healthz`, `kpng status`
    /// and the log: a deleted Node whose values are kept changes nothing in the kernel.
    pub fn programs_as(&self, other: &NodeState) -> bool {
        self.ips == other.ips
            && self.pod_cidrs == other.pod_cidrs
            && self.zone == other.zone
            && self.nodeports_on_all_local == other.nodeports_on_all_local
    }

    /// Replaces this view with `new` and says what that changed ([`NodeChange`]): the one
    /// place that decides whether a new view of the node is work for the backends, for the
    /// in-process model and a brain-fed node's.
    pub fn replace(&mut self, new: NodeState) -> NodeChange {
        if *self == new {
            return NodeChange::None;
        }
        let change = if self.programs_as(&new) {
            NodeChange::Status
        } else {
            NodeChange::Programmed
        };
        *self = new;
        change
    }
}

/// Which values the backends program a new view of the node changed, and the cluster's
/// Service CIDRs: what the sync line names ("node IPs changed"), so that an operator reads
/// which one moved rather than a catch-all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeChanges {
    /// The node IPs.
    pub ips: bool,
    /// The pod CIDRs.
    pub pod_cidrs: bool,
    /// The zone.
    pub zone: bool,
    /// Whether NodePorts go to every local address, when that changed: its new value.
    pub nodeports_on_all_local: Option<bool>,
    /// The cluster's Service CIDRs.
    pub service_cidrs: bool,
}

impl NodeChanges {
    /// What the backends program differently in `new` than in `old`.
    pub fn between(old: &NodeState, new: &NodeState) -> NodeChanges {
        NodeChanges {
            ips: old.ips != new.ips,
            pod_cidrs: old.pod_cidrs != new.pod_cidrs,
            zone: old.zone != new.zone,
            nodeports_on_all_local: (old.nodeports_on_all_local != new.nodeports_on_all_local)
                .then_some(new.nodeports_on_all_local),
            service_cidrs: false,
        }
    }

    /// Folds a later change into this one (the later value of `nodeports_on_all_local` wins).
    pub fn merge(&mut self, later: NodeChanges) {
        self.ips |= later.ips;
        self.pod_cidrs |= later.pod_cidrs;
        self.zone |= later.zone;
        self.service_cidrs |= later.service_cidrs;
        self.nodeports_on_all_local = later.nodeports_on_all_local.or(self.nodeports_on_all_local);
    }
}

impl std::fmt::Display for NodeChanges {
    /// `node IPs and pod CIDRs changed`, `NodePorts on every local address`; empty when
    /// nothing is named.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = [
            (self.ips, "node IPs"),
            (self.pod_cidrs, "pod CIDRs"),
            (self.zone, "zone"),
            (self.service_cidrs, "Service CIDRs"),
        ]
        .into_iter()
        .filter_map(|(changed, name)| changed.then_some(name))
        .collect();
        if let Some((last, first)) = names.split_last() {
            if first.is_empty() {
                write!(f, "{last} changed")?;
            } else {
                write!(f, "{} and {last} changed", first.join(", "))?;
            }
        }
        if let Some(all) = self.nodeports_on_all_local {
            if !names.is_empty() {
                f.write_str("; ")?;
            }
            f.write_str(if all {
                "NodePorts on every local address (no node IP)"
            } else {
                "NodePorts back on the node IPs"
            })?;
        }
        Ok(())
    }
}

/// What a new view of the node changed ([`NodeState::replace`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeChange {
    /// Nothing.
    None,
    /// Only the node's status (the Node's existence, deletion, eligibility, kept values):
    /// `/healthz` and the node log follow it, the backends have nothing to program.
    Status,
    /// A value the backends program ([`NodeState::programs_as`]), and maybe the status too.
    Programmed,
}

/// What this node's own Node said last, and whether the wait for its IPs is over: the one
/// place that turns the Node's current values into the [`NodeState`] a runner uses, for the
/// in-process [`crate::Model`] (values from the Node object) and a brain-fed node's model
/// (values from the brain, which sends the Node as it is now).
///
/// kube-proxy fixes its node IPs and pod CIDRs at start and never drops them while it runs;
/// dropping them would stop the NodePorts on them while the health-check node ports still
/// answer. So a Node that is deleted, or stops listing addresses or podCIDRs, leaves the last
/// values in place (`ips_kept`, `pod_cidrs_kept`); a new value replaces them. The zone is kept
/// while the Node is gone, as upstream's `NodeTopologyConfig` ignores a Node's deletion:
/// dropping it would turn topology hints off and send Services across zones until the Node is
/// back; a live Node that drops its zone label does clear it. The memory is
/// the running process's, as kube-proxy's: a kpng restarted while its Node is deleted knows no
/// node IP, whichever source feeds it.
#[derive(Debug, Clone, Default)]
pub struct NodeMemory {
    /// The Node's primary IPs (before `--node-ip`), last non-empty value.
    ips: Vec<IpAddr>,
    /// `spec.podCIDRs`, last non-empty value.
    pod_cidrs: Vec<IpNet>,
    /// The `topology.kubernetes.io/zone` label of the last Node seen (`None` when it had none).
    zone: Option<String>,
    /// Whether the Node has been seen at all.
    seen: bool,
    /// The wait for node IPs is over ([`NodeMemory::give_up_waiting_for_ips`]).
    ips_wait_over: bool,
}

impl NodeMemory {
    /// The node as the runner uses it, from `current` (the Node's values now, without
    /// `--node-ip`: `known` false when there is no Node): what it no longer says is taken from
    /// what it said before, then `override_ips` (`--node-ip`) replace the IPs of their family.
    /// Remembers what `current` says.
    pub fn view(&mut self, current: &NodeState, override_ips: &[IpAddr]) -> NodeState {
        if !current.ips.is_empty() {
            self.ips = current.ips.clone();
        }
        if !current.pod_cidrs.is_empty() {
            self.pod_cidrs = current.pod_cidrs.clone();
        }
        if current.known {
            self.zone = current.zone.clone();
        }
        self.seen |= current.known;
        let mut state = NodeState {
            ips_kept: false,
            pod_cidrs_kept: false,
            ..current.clone()
        };
        if state.ips.is_empty() && !self.ips.is_empty() {
            state.ips = self.ips.clone();
            // Kept only matters where `--node-ip` does not name the family.
            state.ips_kept = crate::cluster::override_node_ips(&state.ips, override_ips)
                != crate::cluster::override_node_ips(&[], override_ips);
        }
        if state.pod_cidrs.is_empty() && !self.pod_cidrs.is_empty() {
            state.pod_cidrs = self.pod_cidrs.clone();
            state.pod_cidrs_kept = true;
        }
        if !state.known {
            state.zone = self.zone.clone();
        }
        state.ips = crate::cluster::override_node_ips(&state.ips, override_ips);
        state.ever_known = state.known || self.seen;
        state.nodeports_on_all_local = self.ips_wait_over && state.ips.is_empty();
        state
    }

    /// The runner's wait for node IPs is over: from now on, while no node IP is known, the
    /// view says NodePorts go to every local address ([`NodeState::nodeports_on_all_local`]),
    /// as kube-proxy's `primary` node-port addresses do once its start-up wait times out.
    pub fn give_up_waiting_for_ips(&mut self) {
        self.ips_wait_over = true;
    }
}
