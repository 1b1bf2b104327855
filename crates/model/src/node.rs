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
    /// The `topology.kubernetes.io/zone` label: selects zone-hinted endpoints.
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
}
