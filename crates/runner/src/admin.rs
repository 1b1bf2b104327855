//! Questions a running kpng answers about itself: `kpng status` and `kpng trace`.
//!
//! The sync loop owns the model, so questions are sent to it over a channel and answered
//! between two inputs: nothing is copied or locked on the hot path, and an answer costs only
//! when someone asks. The binary serves an [`AdminHandle`] on its admin socket.

use std::net::IpAddr;
use std::time::SystemTime;

use ipnet::IpNet;
use kpng_model::inspect::EndpointStatus;
use kpng_model::trace::{BackendTraits, NodeFacts, Trace, TraceQuery};
use kpng_model::{Family, ServicePort, Snapshot};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

/// Computes the node facts a trace needs from the current snapshot (node port addresses and
/// the pod detector depend on the Node object and the host's addresses).
pub type FactsFn = Box<dyn Fn(&Snapshot) -> NodeFacts + Send>;

/// A question for the loop.
#[derive(Debug)]
pub(crate) enum Query {
    Status(StatusQuery, oneshot::Sender<Status>),
    Trace(TraceQuery, oneshot::Sender<TraceAnswer>),
}

/// Looks at what the model does not hold about the data plane (the eBPF backend's programs
/// and maps, the HNS network, the iptables variant), when a status is asked for: on a
/// blocking thread, never on the sync loop.
pub type DataPlaneProbe = std::sync::Arc<dyn Fn() -> Vec<DataPlaneDetail> + Send + Sync>;

/// One base chain of another program's table on a hook kpng uses, that sees packets before
/// kpng's chain there or drops what it does not accept (read by the binary from the kernel).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignChain {
    /// `inet filter forward: hook forward, type filter, priority 0, policy drop (after kpng's
    /// chain, priority -100)`.
    pub line: String,
    /// The families whose packets it sees (`inet`: both).
    pub families: Vec<kpng_model::Family>,
    /// Whether it drops whatever its rules do not accept: a drop policy, or a legacy iptables
    /// built-in chain's `DROP`/`REJECT` rule that matches every packet (RHEL's final
    /// `-A INPUT -j REJECT`), which is the same thing written as a rule.
    pub policy_drop: bool,
    /// For a drop or reject rule: its table (`inet tenantpolicy`, `iptables-legacy filter`)
    /// and chain, which `kpng trace` names ("a rule in table X chain Y may drop this"): the
    /// rule's matches are not compared with the packet, so it may or may not match.
    pub rule_in: Option<(String, String)>,
}

impl ForeignChain {
    /// How `kpng trace` lists it: a drop rule says that it may drop the packet.
    pub fn trace_line(&self) -> String {
        match &self.rule_in {
            Some((table, chain)) => format!(
                "a rule in table {table} chain {chain} may drop this: {}",
                self.line
            ),
            None => self.line.clone(),
        }
    }
}

/// Lists the [`ForeignChain`]s now, when a status or a trace is asked for: one netlink dump on
/// a blocking thread, never in the sync loop. `Err`: the dump failed, in words.
pub type ForeignChainsProbe =
    std::sync::Arc<dyn Fn() -> Result<Vec<ForeignChain>, String> + Send + Sync>;

/// Asks the running loop; cheap to clone.
#[derive(Clone)]
pub struct AdminHandle {
    pub(crate) queries: mpsc::Sender<Query>,
    probe: Option<DataPlaneProbe>,
    previous_run: Option<String>,
    foreign_chains: Option<ForeignChainsProbe>,
}

impl std::fmt::Debug for AdminHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminHandle")
            .field("probe", &self.probe.is_some())
            .finish_non_exhaustive()
    }
}

impl AdminHandle {
    pub(crate) fn new(queries: mpsc::Sender<Query>) -> AdminHandle {
        AdminHandle {
            queries,
            probe: None,
            previous_run: None,
            foreign_chains: None,
        }
    }

    /// Adds the other programs' chains on kpng's hooks ([`ForeignChain`]) to every status
    /// answer (an `other tables' chains` line of [`Status::data_plane`]) and, for the packet's
    /// family, to every trace ([`TraceAnswer::other_chains`]): `kpng trace` follows kpng's
    /// rules only, and a firewall that drops the packet first is the other half of "is it
    /// kpng or the firewall?".
    pub fn with_foreign_chains_probe(mut self, probe: ForeignChainsProbe) -> AdminHandle {
        self.foreign_chains = Some(probe);
        self
    }

    /// Adds `note` (how the previous run of kpng ended uncleanly) to every status answer
    /// ([`Status::previous_run`]), for the life of the process.
    pub fn with_previous_run(mut self, note: String) -> AdminHandle {
        self.previous_run = Some(note);
        self
    }

    /// Adds `probe`'s lines to every status answer ([`Status::data_plane`]).
    pub fn with_data_plane_probe(mut self, probe: DataPlaneProbe) -> AdminHandle {
        self.probe = Some(probe);
        self
    }

    /// What is programmed now, for the Service ports `query` selects; `None` once the loop
    /// has ended.
    pub async fn status(&self, query: StatusQuery) -> Option<Status> {
        // `kpng status` reads a large answer page by page and keeps the first page's header:
        // the probe (a dump of every map, for the eBPF backend) runs for that page only.
        let first_page = query.offset.unwrap_or_default() == 0;
        let (tx, rx) = oneshot::channel();
        self.queries.send(Query::Status(query, tx)).await.ok()?;
        let mut status = rx.await.ok()?;
        status.previous_run.clone_from(&self.previous_run);
        if let Some(probe) = self.probe.clone().filter(|_| first_page) {
            // After the loop's own lines (its node checks).
            let lines = tokio::task::spawn_blocking(move || probe())
                .await
                .unwrap_or_default();
            status.data_plane.extend(lines);
        }
        if let Some(probe) = self.foreign_chains.clone().filter(|_| first_page) {
            let found = tokio::task::spawn_blocking(move || probe())
                .await
                .unwrap_or_else(|e| Err(e.to_string()));
            status.data_plane.push(foreign_chains_detail(found));
        }
        Some(status)
    }

    /// The decision for one packet; `None` once the loop has ended.
    pub async fn trace(&self, query: TraceQuery) -> Option<TraceAnswer> {
        let family = kpng_model::Family::of(&query.to.ip());
        let (tx, rx) = oneshot::channel();
        self.queries.send(Query::Trace(query, tx)).await.ok()?;
        let mut answer = rx.await.ok()?;
        if let Some(probe) = self.foreign_chains.clone() {
            let found = tokio::task::spawn_blocking(move || probe())
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default();
            answer.other_chains = found
                .into_iter()
                .filter(|c| c.families.contains(&family))
                .map(|c| c.trace_line())
                .collect();
        }
        Some(answer)
    }
}

/// The `other tables' chains` line of `kpng status`: listed in its state (`-o wide`, JSON),
/// and a problem (shown without being asked) when one of them drops by policy.
pub fn foreign_chains_detail(found: Result<Vec<ForeignChain>, String>) -> DataPlaneDetail {
    let what = "other tables' chains".to_string();
    let chains = match found {
        Ok(chains) => chains,
        Err(e) => {
            return DataPlaneDetail {
                what,
                state: format!("cannot list the node's nftables chains: {e}"),
                problem: None,
            };
        }
    };
    let lines = |drop_only: bool| {
        chains
            .iter()
            .filter(|c| !drop_only || c.policy_drop)
            .map(|c| c.line.as_str())
            .collect::<Vec<_>>()
            .join("; ")
    };
    let state = if chains.is_empty() {
        "no other table's base chain runs before kpng's, drops by policy or holds drop rules \
         on its hooks"
            .into()
    } else {
        format!(
            "base chains of other tables on kpng's hooks that run before kpng's, drop by \
             policy or hold drop rules (which drop whatever their priority): {}",
            lines(false)
        )
    };
    let problem = chains.iter().any(|c| c.policy_drop).then(|| {
        format!(
            "another table drops by policy what its rules do not accept, whatever kpng does \
             (check that Service traffic is accepted there): {}",
            lines(true)
        )
    });
    DataPlaneDetail {
        what,
        state,
        problem,
    }
}

/// Which Service ports a status answer holds.
///
/// Why: every port with every endpoint is tens of MB of JSON at 30k Services × 4, built in the
/// node agent's memory for each request (peak RSS 139 → 204 MB for one `kpng status NAME`,
/// and the status page asked every 5 s). The selection is made before any port is explained,
/// and at most [`StatusQuery::limit`] ports are kept, from [`StatusQuery::offset`] on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct StatusQuery {
    /// `NAME` (any namespace), `NAMESPACE/NAME`, `NAMESPACE/NAME:PORT` or `NAMESPACE/` (every
    /// Service of the namespace, as `kpng status -n NAMESPACE`): what `kpng status SERVICE`
    /// asks for.
    #[serde(default)]
    pub service: Option<String>,
    /// Text the port's row must contain, case-insensitively: its Service, port, protocol,
    /// family, addresses, policies or an endpoint's address (the status page's filter).
    #[serde(default, rename = "q")]
    pub text: Option<String>,
    /// At most this many ports, the first in key order after `offset`.
    #[serde(default)]
    pub limit: Option<usize>,
    /// Matching ports to skip first: `kpng status` reads a large answer page by page, so the
    /// node agent never builds all of it at once.
    #[serde(default)]
    pub offset: Option<usize>,
}

impl StatusQuery {
    /// Whether port `port_name` (number `port`) of Service `namespace`/`name` is asked for by
    /// [`StatusQuery::service`]. The port is asked for by name or by number: an engineer types
    /// the number they connect to, and a port name always has a letter (IANA_SVC_NAME), so
    /// the two cannot be mistaken for each other.
    pub fn wants_service(&self, namespace: &str, name: &str, port_name: &str, port: u16) -> bool {
        let Some(filter) = self.service.as_deref().filter(|f| !f.is_empty()) else {
            return true;
        };
        let want_port = filter.rsplit_once(':').map(|(_, p)| p);
        self.names_service(namespace, name)
            && want_port.is_none_or(|p| p == port_name || p.parse::<u16>() == Ok(port))
    }

    /// Whether [`StatusQuery::service`] names Service `namespace`/`name`, whatever port it
    /// asks for.
    pub fn names_service(&self, namespace: &str, name: &str) -> bool {
        let Some(filter) = self.service.as_deref().filter(|f| !f.is_empty()) else {
            return true;
        };
        let svc = filter.rsplit_once(':').map_or(filter, |(s, _)| s);
        match svc.split_once('/') {
            // `NAMESPACE/` (or `NAMESPACE/*`): every Service of the namespace.
            Some((ns, n)) => ns == namespace && (n.is_empty() || n == "*" || n == name),
            None => svc == name,
        }
    }

    /// The text filter, lowercased, when there is one ([`StatusQuery::text`], blanks ignored):
    /// computed once per answer, then matched with [`PortStatus::row_contains`].
    pub fn text_filter(&self) -> Option<String> {
        self.text
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_lowercase)
    }
}

/// A trace and the state it was computed from.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TraceAnswer {
    /// The decision.
    #[serde(flatten)]
    pub trace: Trace,
    /// Syncs made so far: two answers with the same generation saw the same programmed state.
    pub generation: u64,
    /// Whether the data plane holds exactly the model the trace used (no change waiting for a
    /// sync, the last sync succeeded). When false, the trace tells what kpng is about to
    /// program, not what the kernel does now.
    pub in_sync: bool,
    /// The rejection of the matched Service's latest version, when it is rejected: the trace
    /// then follows its last good version, not what the input says now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejected: Option<RejectedStatus>,
    /// The matched Service's health check, when this node does not serve it: load balancers
    /// then see the node as unhealthy for the Service and send its traffic elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check_not_served: Option<HealthCheckStatus>,
    /// Why nothing is programmed yet, while the first sync is held (for the complete lists,
    /// a brain's first state, or in NodeCIDR mode the Node's podCIDRs): no packet meets any of
    /// the trace meanwhile, and its answer, from what kpng knows now, may change when what is
    /// missing arrives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_sync_held: Option<String>,
    /// The input's problem now, in one line ([`InputStatus::stale_note`]): the trace follows
    /// the last good input, which may be out of date (a Service added while the brain or the
    /// API server is out of reach is not there yet). Separate from `in_sync`, which compares
    /// the data plane with kpng's model, not the model with the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_problem: Option<String>,
    /// Rules an earlier run of kpng left are still in place and serving while the first sync
    /// is held ([`Status::earlier_rules_in_place`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub earlier_rules_in_place: bool,
    /// For a sink that programs nothing (`to-file`, a dry run): says so, and that the verdict
    /// is kpng's model's, not what any kernel does with the packet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub programs_nothing: Option<String>,
    /// On a node fed by a brain, when the matched Service port uses no endpoint here: the
    /// brain's command that explains the endpoints this node does not receive ([`brain_explains`]),
    /// as `kpng status` points at it for such a port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brain_explains: Option<String>,
    /// When the packet matched a load-balancer IP whose family none of the Service's
    /// `loadBalancerSourceRanges` is of: those ranges, which let every source of this family
    /// in (kube-proxy applies them per family).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source_ranges_of_other_families_only: Vec<IpNet>,
    /// Other tables' base chains on kpng's hooks, of the packet's family, that see it before
    /// kpng's or drop by policy ([`AdminHandle::with_foreign_chains_probe`]): the trace
    /// follows kpng's rules only, and one of these may drop the packet first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_chains: Vec<String>,
}

/// The key of the Service port a trace matched (`trace.service`, `namespace/name:port`, in the
/// family and protocol of the query), if the snapshot holds it.
pub fn matched_port<'a>(
    snapshot: &'a Snapshot,
    trace: &Trace,
    q: &TraceQuery,
) -> Option<&'a kpng_model::PortKey> {
    let matched = trace.service.as_deref()?;
    let family = kpng_model::Family::of(&q.to.ip());
    snapshot
        .family(family)
        .find(|p| {
            p.key.protocol == q.protocol
                && format!("{}:{}", p.key.service, p.key.port_name) == matched
        })
        .map(|p| &p.key)
}

/// For a trace on a node fed by a brain whose matched Service port (`trace.service`,
/// `namespace/name:port`) uses no endpoint in this node's view: `kpng status --node NODE
/// namespace/name`, the brain's command that says why. Such a node receives only the
/// endpoints it uses, so "no endpoints" here may be endpoints the brain gave this node none
/// of (another node's, with a Local traffic policy), which the node cannot tell.
pub fn brain_explains(snapshot: &Snapshot, trace: &Trace, q: &TraceQuery) -> Option<String> {
    let port = snapshot.ports.get(matched_port(snapshot, trace, q)?)?;
    if !(port.cluster_endpoints.is_empty() && port.local_endpoints.is_empty()) {
        return None;
    }
    Some(format!(
        "kpng status --node {} {}",
        snapshot.node.name, port.key.service
    ))
}

/// The state of the proxy: what `kpng status` prints.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// This node's name.
    pub node: String,
    /// Set when a brain computed this view for node `node` (`kpng status --node` on the
    /// brain), saying what it cannot know there: none of the sync fields are then the node's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brain_view: Option<String>,
    /// The backend's name.
    pub backend: String,
    /// Whether every list has been received and a first sync made.
    pub programmed: bool,
    /// Syncs made so far.
    #[serde(default)]
    pub generation: u64,
    /// Whether the data plane holds exactly the model (nothing waiting, last sync succeeded).
    #[serde(default)]
    pub in_sync: bool,
    /// Changes received and not yet synced: Service ports, plus whether the node changed.
    pub pending_port_changes: usize,
    /// The last sync, successful or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync: Option<SyncStatus>,
    /// The last successful sync's time (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_successful_sync: Option<String>,
    /// The last failure's message, if the last sync failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// The most recent syncs that did something (or failed), newest first.
    #[serde(default)]
    pub recent_syncs: Vec<SyncStatus>,
    /// The Service ports asked for ([`StatusQuery`]), in key order.
    pub services: Vec<PortStatus>,
    /// How many Service ports the model holds.
    #[serde(default)]
    pub total_ports: usize,
    /// How many of them matched the query (more than `services` holds when it hit the limit).
    #[serde(default)]
    pub matching_ports: usize,
    /// Objects whose latest version was rejected: what is still wrong in the input, and
    /// whether an earlier version of each is in use.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<RejectedStatus>,
    /// Values the conversion dropped from objects in use (the rest of each is used: an
    /// `fe80::1%eth0` external IP, an IPv4-mapped endpoint in an IPv6 slice): problems of
    /// the input the log warned about once, shown for as long as they last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<DroppedStatus>,
    /// When a Service was asked for and no port of it matched: the Services of that name
    /// the model holds but programs nothing for, and why (headless, another proxy's, its
    /// frontends another Service's, …).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_programmed: Vec<NotProgrammed>,
    /// Before the first sync: the kinds whose first complete list has not arrived yet
    /// (nothing is programmed until every one has).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_for: Vec<String>,
    /// This node is fed by a brain (`kpng api`/`kpng local`): the first sync waits for the
    /// brain's first state, not for lists of its own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fed_by_brain: bool,
    /// Before the first successful sync: the backend found rules an earlier run of kpng left
    /// (its table, chains or pinned maps, adopted at start), which still route traffic as they
    /// were until a sync replaces them (a failed one did not). `false` also when the backend
    /// cannot tell.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub earlier_rules_in_place: bool,
    /// How the source is doing: what it reads, its problems now, its last good load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<InputStatus>,
    /// On a node fed by a brain: what the brain reports about its own input (the objects it
    /// rejects, its source's problems), which this node never sees itself; absent when the
    /// brain reports nothing. It does not make `/healthz` fail (another object's rejection
    /// does not make this node unhealthy, as with kube-proxy), but says why a Service looks
    /// wrong here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brain_reports: Option<BrainReportStatus>,
    /// What is wrong with this node's own Node object once the cluster is listed ([`node_problem`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_problem: Option<String>,
    /// The node IPs in use (`--node-ip`, or the Node's, or kept from it): where NodePorts are
    /// served with `--nodeport-addresses primary`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_ips: Vec<String>,
    /// The pod CIDRs in use (the NodeCIDR local-traffic detector's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_cidrs: Vec<String>,
    /// Where NodePorts are served now, and the `--nodeport-addresses` that decided it
    /// ([`NodeFacts::node_ports_on`]; none where the binary gave no node facts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_ports_on: Option<String>,
    /// The addresses NodePorts are served on now, one by one (`node_ports_on` without its
    /// words, for scripts; 127.0.0.1 included when iptables mode serves it); present when
    /// `node_ports_on` is, possibly empty (since 2026-12-07).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_port_ips: Option<Vec<IpAddr>>,
    /// The node's zone (selects zone-hinted endpoints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// The repairs of the data plane after changes someone else made (a firewall reload, an
    /// `nft flush ruleset`): none so far when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repairs: Option<RepairStatus>,
    /// Health checks of eTP Local LoadBalancer Services whose server could not start (a port
    /// taken by another process): a load balancer probing one sees this node as unhealthy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub health_checks_not_served: Vec<HealthCheckStatus>,
    /// The node's conntrack table (backends that program a Linux node): when it is full the
    /// kernel evicts unreplied entries and, when it finds none, drops new connections'
    /// packets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conntrack: Option<ConntrackStatus>,
    /// The previous kpng of this network namespace ended without a clean shutdown (killed,
    /// OOM): who it was and where to look. Information, not a problem of this run; shown for
    /// the life of the process, so a crash loop is not read as normal restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_run: Option<String>,
    /// What the backend holds beyond the model's rules, looked at when asked (the eBPF
    /// backend: its programs attached, its maps' fill; the HNS network; the iptables variant),
    /// in the first page of an answer read page by page: empty otherwise, and for the
    /// backends without such lines.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data_plane: Vec<DataPlaneDetail>,
}

/// What the node's configuration needs from its Node object, for [`node_problem`]: which
/// missing values stop something from being served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeNeeds {
    /// NodePorts are served on the node's primary IPs (`--nodeport-addresses primary`), and
    /// how long after the initial lists they fall back to every local address when none is
    /// known.
    pub primary_node_ports: Option<std::time::Duration>,
    /// `--detect-local-mode NodeCIDR`: nothing is programmed before the Node has podCIDRs.
    pub pod_cidrs: bool,
}

/// What is wrong with the node's Node object, in words, for `kpng status`, each cause
/// saying what it really does: a node name no Node has (a typo, a short hostname where the
/// Node is an FQDN) and a deleted Node turn `/healthz` to 503 (endpoints stay local: their
/// `nodeName` is compared with the configured name, not with a Node); a Node being deleted or
/// tainted by the cluster autoscaler too, as kube-proxy's; no node IP stops the NodePorts on
/// the primary addresses; no podCIDR in NodeCIDR mode holds the first sync.
pub fn node_problem(node: &kpng_model::NodeState, needs: NodeNeeds) -> Option<String> {
    let mut problems: Vec<String> = Vec::new();
    if !node.known && node.ever_known {
        problems.push(format!(
            "the Node {:?} was deleted: /healthz answers 503; kpng keeps its last node IPs \
             ({}) and pod CIDRs ({}) until it is back",
            node.name,
            list_or_none(&node.ips),
            list_or_none(&node.pod_cidrs)
        ));
    } else if !node.known {
        problems.push(format!(
            "no Node named {:?} in the cluster: /healthz answers 503 and topology hints are \
             ignored (check --hostname-override / --node-name against `kubectl get nodes`)",
            node.name
        ));
    } else if node.deleting {
        problems.push("the Node is being deleted: /healthz answers 503, as kube-proxy's".into());
    } else if node.to_be_deleted {
        problems.push(
            "the Node is tainted ToBeDeletedByClusterAutoscaler: /healthz answers 503, as \
             kube-proxy's"
                .into(),
        );
    }
    if let Some(wait) = needs.primary_node_ports
        && node.ips.is_empty()
    {
        let why = if node.known {
            "the Node lists no InternalIP or ExternalIP and there is no --node-ip"
        } else {
            "no node IP is known (no Node, no --node-ip)"
        };
        problems.push(if node.nodeports_on_all_local {
            format!(
                "{why}: NodePorts are served on every local address, as kube-proxy's \
                 (on the node IPs once known)"
            )
        } else {
            format!(
                "{why}: NodePorts are not served yet ({}s after the initial lists they are \
                 served on every local address, as kube-proxy's)",
                wait.as_secs()
            )
        });
    } else if node.known && node.ips_kept {
        problems.push(format!(
            "the Node lists no InternalIP or ExternalIP any more: kpng keeps its last node IPs \
             ({})",
            list_or_none(&node.ips)
        ));
    }
    if needs.pod_cidrs && node.pod_cidrs.is_empty() {
        problems.push(
            "--detect-local-mode NodeCIDR and the Node has no spec.podCIDRs: the first sync is \
             held until it has them, so nothing is programmed yet (kube-proxy waits for them \
             too, then refuses to start)"
                .into(),
        );
    }
    (!problems.is_empty()).then(|| problems.join("; "))
}

/// `a, b` or `none`.
fn list_or_none<T: std::fmt::Display>(items: &[T]) -> String {
    if items.is_empty() {
        return "none".into();
    }
    items
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A Service the model holds that gets no rule, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NotProgrammed {
    /// `namespace/name`.
    pub service: String,
    /// Why, in words.
    pub why: String,
}

/// One line about the data plane: what, its state, and what is wrong with it, if anything.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DataPlaneDetail {
    /// What is looked at (`eBPF socket programs`).
    pub what: String,
    /// Its state, in words.
    pub state: String,
    /// What is wrong and what happens about it; shown without being asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// How full the conntrack table is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConntrackStatus {
    /// Entries now (`nf_conntrack_count`).
    pub entries: u64,
    /// The limit (`nf_conntrack_max`).
    pub max: u64,
    /// kpng cannot change the limit here (not the host network namespace, or `/proc/sys`
    /// read-only): raising its flags would not help, the host's setting must change.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub max_read_only: bool,
}

impl ConntrackStatus {
    /// Why kpng cannot change `nf_conntrack_max` where it is read-only, and what to do
    /// instead: said by the warning of a failed write and by `kpng status`.
    pub const MAX_READ_ONLY: &'static str = "nf_conntrack_max is read-only here: not the host \
        network namespace, or /proc/sys mounted read-only (an unprivileged container); set \
        net.netfilter.nf_conntrack_max on the host (sysctl), or run kpng privileged in the \
        host network namespace (hostNetwork: true)";

    /// Whether the table is close enough to full (90 %) to say so without being asked: past
    /// it, bursts of new connections start being dropped.
    pub fn nearly_full(&self) -> bool {
        self.max > 0 && self.entries.saturating_mul(10) >= self.max.saturating_mul(9)
    }
}

/// A Service's health check that is not served now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheckStatus {
    /// `namespace/name`.
    pub service: String,
    /// Its `healthCheckNodePort`.
    pub port: u16,
    /// Why its server could not start.
    pub message: String,
    /// When it first failed (RFC 3339).
    pub since: String,
}

impl HealthCheckStatus {
    /// The status of one check that is not served.
    pub fn of(n: &crate::service_health::NotServed) -> HealthCheckStatus {
        HealthCheckStatus {
            service: n.service.to_string(),
            port: n.port,
            message: n.error.clone(),
            since: rfc3339(n.since),
        }
    }
}

/// Repairs after someone else changed what the backend programmed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RepairStatus {
    /// Repairing syncs that succeeded.
    pub count: u64,
    /// When the last one ended (RFC 3339).
    pub last_at: String,
    /// What the backend saw changed before it (`ip kpng: table deleted`).
    pub last_change: String,
    /// Someone else keeps changing the data plane and repairs are delayed
    /// ([`crate::repair_backoff`]): how often, the likely causes, the delay. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// A change by someone else reported and not repaired yet (during the repairs' backoff,
    /// or while a repair fails): what, since when, when the repair is due. Until then the
    /// last sync still reads "ok" though the node may serve no Service. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unrepaired: Option<String>,
}

/// The source's input as the status reports it (see [`kpng_model::input`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InputStatus {
    /// What is read: `file PATH`, `kube URL`, `brain ADDRESS`.
    pub source: String,
    /// `source`'s kind, for scripts: `file`, `directory`, `kube` or `brain` (empty when
    /// kpng has not said yet what it reads, or a kpng before 2026-12-07 answered).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// `source` without its kind: the path, the API server's URL, the brain's address.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub location: String,
    /// The input's state in one word, for scripts: `ok` (no problem now) or `problem` (see
    /// `problems`; what is shown is from the last good input). Empty from a kpng before
    /// 2026-12-07.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub state: String,
    /// The problems now, by what they concern; empty when the input is fine.
    #[serde(default)]
    pub problems: Vec<InputProblemStatus>,
    /// When it last loaded, or a list last completed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_good: Option<String>,
    /// What that load held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// How many objects that load held (a file's or a directory's whole load), beside
    /// `detail`'s words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_good_objects: Option<usize>,
    /// From how many files (a directory's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_good_files: Option<usize>,
    /// The file whose change was that load (a directory's manifest re-read alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_change_from: Option<String>,
    /// On a node fed by a brain: the kpng version the brain sent at the last connection
    /// (absent: not connected yet, or KPNG's brain or a kpng before 2026-12-07).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brain_version: Option<String>,
}

/// One problem of the input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InputProblemStatus {
    /// What it concerns: a file, `API server`, `Service watch`, `brain`.
    pub what: String,
    /// What is wrong.
    pub message: String,
    /// When it began (RFC 3339).
    pub since: String,
}

impl InputStatus {
    /// One line for answers about one Service or one packet (`kpng status NAME`, `kpng
    /// trace`) while the input has a problem: what they show is the last good input, which
    /// may be out of date (a Service added meanwhile is missing, a deleted one still there).
    /// `None` when the input is fine.
    pub fn stale_note(&self) -> Option<String> {
        let first = self.problems.first()?;
        let more = match self.problems.len() - 1 {
            0 => String::new(),
            1 => " (and 1 more problem)".to_string(),
            n => format!(" (and {n} more problems)"),
        };
        Some(format!(
            "this node's input ({}) has a problem since {}: {}: {}{more}; what is shown is \
             from its last good input, and may be out of date",
            self.source, first.since, first.what, first.message
        ))
    }

    /// The status of an input's record.
    pub fn of(state: &kpng_model::input::InputState) -> InputStatus {
        let (kind, location) = source_parts(&state.source);
        InputStatus {
            source: state.source.clone(),
            kind: kind.to_string(),
            location: location.to_string(),
            state: if state.problems.is_empty() {
                "ok"
            } else {
                "problem"
            }
            .to_string(),
            problems: state
                .problems
                .iter()
                .map(|(what, p)| InputProblemStatus {
                    what: what.clone(),
                    message: p.message.clone(),
                    since: rfc3339(p.since),
                })
                .collect(),
            last_good: state.last_good.map(rfc3339),
            detail: state.detail.clone(),
            last_good_objects: state.load.objects,
            last_good_files: state.load.files,
            last_change_from: state.load.changed_file.clone(),
            brain_version: state.brain_version.clone(),
        }
    }
}

/// An input's `source` (`file /etc/kpng/cluster.yaml`) as its kind and location (`file`,
/// `/etc/kpng/cluster.yaml`): the kinds are the words the sources write first. Anything else
/// (nothing said yet) is no kind, and the whole as its location.
fn source_parts(source: &str) -> (&str, &str) {
    match source.split_once(' ') {
        Some((kind @ ("file" | "directory" | "kube" | "brain"), location)) => (kind, location),
        _ => ("", source),
    }
}

/// What a node's brain reports about its own input, as `kpng status` on the node shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BrainReportStatus {
    /// What the brain reads: `kube URL`, `file PATH`.
    pub source: String,
    /// Whether the brain's source has no problem now.
    pub healthy: bool,
    /// The brain's input problems now.
    #[serde(default)]
    pub problems: Vec<InputProblemStatus>,
    /// Objects the brain rejects, as far as it listed them (a Node object only when it is
    /// this node's).
    #[serde(default)]
    pub rejected: Vec<RejectedStatus>,
    /// How many objects the brain rejects (the brain lists at most 100; other nodes' Node
    /// objects among them not counted).
    #[serde(default)]
    pub rejected_total: u64,
    /// Values the brain dropped from objects it uses (the rest of each came to this node), as
    /// far as it listed them; none from a brain older than 2026-12-07.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<DroppedStatus>,
    /// How many values the brain dropped (it lists at most 100).
    #[serde(default)]
    pub dropped_total: u64,
    /// The report came on an earlier connection to the brain: the brain connected now (a
    /// restarted one, still listing its input) has sent no state yet, so it may be out of
    /// date.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_earlier_connection: bool,
}

impl BrainReportStatus {
    /// The status of a brain's report as node `node` sees it: another node's rejected Node
    /// object is that node's concern, and is left out.
    pub fn of(report: &kpng_model::input::BrainReport, node: &str) -> BrainReportStatus {
        let mine = |r: &&kpng_model::input::ReportedRejection| r.kind != "Node" || r.name == node;
        let others = report.rejected.iter().filter(|r| !mine(r)).count() as u64;
        BrainReportStatus {
            source: report.source.clone(),
            healthy: report.problems.is_empty(),
            problems: report
                .problems
                .iter()
                .map(|(what, p)| InputProblemStatus {
                    what: what.clone(),
                    message: p.message.clone(),
                    since: rfc3339(p.since),
                })
                .collect(),
            rejected: report
                .rejected
                .iter()
                .filter(mine)
                .map(RejectedStatus::of_reported)
                .collect(),
            rejected_total: report.rejected_total.saturating_sub(others),
            // Only Services' and EndpointSlices' dropped values are kept (a Node's are not).
            dropped: report
                .dropped
                .iter()
                .map(DroppedStatus::of_reported)
                .collect(),
            dropped_total: report.dropped_total,
            from_earlier_connection: false,
        }
    }
}

/// An object whose latest version could not be used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RejectedStatus {
    /// `Kind namespace/name`: the object in words, as before `kind`, `namespace` and `name`
    /// were added (kept for the readers of that JSON).
    pub object: String,
    /// The object's kind (`Service`, `EndpointSlice`, `Node`, `ServiceCIDR`), as the log line's
    /// `kind` field: a script filters on it without parsing `object`.
    #[serde(default)]
    pub kind: String,
    /// The object's namespace (empty for a cluster-scoped kind), as the log line's field.
    #[serde(default)]
    pub namespace: String,
    /// The object's name, as the log line's field.
    #[serde(default)]
    pub name: String,
    /// The Service it concerns (`namespace/name`: a Service's own, an EndpointSlice's owner
    /// by its `kubernetes.io/service-name` label), as [`DroppedStatus::service`]: `kpng status
    /// NS/NAME` shows the rejections of the Service's own slices under it. Absent when the
    /// object names no Service validly, or a brain older than the field reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The field at fault.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
    /// Where the source found it (a manifest's file, document and line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// Whether an earlier version of the object is in use (otherwise nothing of it is).
    pub kept: bool,
}

/// A value the conversion dropped from an object in use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DroppedStatus {
    /// `Kind namespace/name`.
    pub object: String,
    /// The Service it concerns (`namespace/name`: a Service's own, an EndpointSlice's owner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The field of the dropped value.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl DroppedStatus {
    /// The status of one dropped value of an object concerning `service`.
    pub fn of(service: Option<&kpng_model::ServiceKey>, w: &kpng_model::Warning) -> DroppedStatus {
        DroppedStatus {
            object: w.object.to_string(),
            service: service.map(ToString::to_string),
            field: w.field.clone(),
            message: w.message.clone(),
        }
    }
}

/// `Kind namespace/name` (`Kind name` for a cluster-scoped object) of an object a node's brain
/// reports by its parts, written as [`kpng_model::event::ObjectRef`] writes a local one, so
/// that the status reads the same whichever converted it.
fn reported_object(kind: &str, namespace: &str, name: &str) -> String {
    if namespace.is_empty() {
        format!("{kind} {name}")
    } else {
        format!("{kind} {namespace}/{name}")
    }
}

impl DroppedStatus {
    /// The status of one value a brain reported it dropped.
    pub fn of_reported(d: &kpng_model::input::ReportedDropped) -> DroppedStatus {
        DroppedStatus {
            object: reported_object(&d.kind, &d.namespace, &d.name),
            service: d.service.clone(),
            field: d.field.clone(),
            message: d.message.clone(),
        }
    }
}

impl RejectedStatus {
    /// The status of one rejection.
    pub fn of(r: &kpng_model::records::Rejection) -> RejectedStatus {
        RejectedStatus {
            object: r.error.object.to_string(),
            kind: r.error.object.kind.as_str().to_string(),
            namespace: r.error.object.namespace.to_string(),
            name: r.error.object.name.to_string(),
            service: r.error.service.as_ref().map(ToString::to_string),
            field: r.error.field.clone(),
            message: r.error.message.clone(),
            location: r.error.location.clone(),
            kept: r.kept,
        }
    }

    /// The Service the rejection concerns, as `(namespace, name)`: the one it carries
    /// ([`RejectedStatus::service`]), else a Service's own (a status from a kpng older than
    /// that field names only the object, by `kind`, `namespace` and `name` or, older still,
    /// by `object` alone).
    pub fn concerned_service(&self) -> Option<(&str, &str)> {
        if let Some(service) = &self.service {
            return service.split_once('/');
        }
        if self.kind == "Service" {
            return Some((&self.namespace, &self.name));
        }
        if self.kind.is_empty() {
            return self.object.strip_prefix("Service ")?.split_once('/');
        }
        None
    }

    /// The status of a rejection a node's brain reports.
    pub fn of_reported(r: &kpng_model::input::ReportedRejection) -> RejectedStatus {
        RejectedStatus {
            object: reported_object(&r.kind, &r.namespace, &r.name),
            kind: r.kind.clone(),
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            service: r.service.clone(),
            field: r.field.clone(),
            message: r.message.clone(),
            location: r.location.clone(),
            kept: r.kept,
        }
    }
}

/// One sync as the status reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SyncStatus {
    /// When it ended (RFC 3339).
    pub at: String,
    /// Whether the backend accepted it.
    pub ok: bool,
    /// Full or partial.
    pub full: bool,
    /// Data-plane operations sent.
    pub operations: usize,
    /// How long the backend took.
    pub duration_seconds: f64,
    /// What it carried, in words (`Service ports: 1 added`).
    #[serde(default)]
    pub changes: String,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How many syncs `recent_syncs` keeps.
pub const SYNC_HISTORY: usize = 20;

/// One Service port in one family.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortStatus {
    /// `namespace/name`.
    pub service: String,
    /// The port's name (empty for a single unnamed port).
    pub port_name: String,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// `IPv4` or `IPv6`.
    pub family: String,
    /// The ClusterIP.
    pub cluster_ip: IpAddr,
    /// The Service port.
    pub port: u16,
    /// The node port, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_port: Option<u16>,
    /// External IPs of this family.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external_ips: Vec<IpAddr>,
    /// Load-balancer IPs of this family.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub load_balancer_ips: Vec<IpAddr>,
    /// `loadBalancerSourceRanges` of this family.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source_ranges: Vec<IpNet>,
    /// The Service's `loadBalancerSourceRanges` when none is of this family, for a port with
    /// load-balancer IPs: they do not restrict this family's, which accept every source (as
    /// in kube-proxy, which applies the ranges per family). Unknown (empty) on a brain's node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source_ranges_of_other_families_only: Vec<IpNet>,
    /// `Cluster` or `Local`.
    pub external_traffic_policy: String,
    /// `Cluster` or `Local`.
    pub internal_traffic_policy: String,
    /// ClientIP affinity's timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity_timeout_seconds: Option<u32>,
    /// The health-check node port of an eTP Local LoadBalancer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check_node_port: Option<u16>,
    /// What this node's server for that port answers a load balancer now (backends that
    /// program the node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<crate::service_health::HealthCheckAnswer>,
    /// When an endpoint list the port needs is empty: what traffic meets, in words, for the
    /// running backend (Linux: rejected when the Service has no endpoint at all, dropped when
    /// none suits the policy; HNS: not answered, as there is no load balancer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub without_endpoints: Option<String>,
    /// `without_endpoints` as stable words for scripts: which list is empty, which traffic
    /// meets it and what it meets (since 2026-12-07).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub without_endpoints_detail: Option<WithoutEndpoints>,
    /// Every endpoint, used or not, and why.
    pub endpoints: Vec<EndpointStatus>,
    /// Only the used endpoints are known, not the others nor why they are unused: a node fed
    /// by a brain receives the endpoints it uses only (`kpng status --node` on the brain
    /// explains the rest).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub only_used_known: bool,
}

impl PortStatus {
    /// Whether the empty list `without_endpoints` names is only the local one (eTP or iTP Local
    /// with no endpoint on this node while the Service has usable endpoints elsewhere): `kpng
    /// status` counts such a port apart from one without endpoints, which an operator would
    /// otherwise look for in the EndpointSlices.
    pub fn without_local_endpoint_only(&self) -> bool {
        self.without_endpoints_detail
            .as_ref()
            .is_some_and(|d| d.reason == "noLocalEndpoint")
    }

    /// The status of `port`; `explained` lists every endpoint with reasons when the model
    /// can tell (an in-process model), else the used ones are listed from the port itself;
    /// `traits` (the backend's) say what traffic meets when an endpoint list is empty.
    pub fn of(
        port: &ServicePort,
        explained: Option<Vec<EndpointStatus>>,
        traits: &BackendTraits,
    ) -> PortStatus {
        let policy = |local: bool| if local { "Local" } else { "Cluster" }.to_string();
        let only_used_known = explained.is_none();
        let endpoints = explained.unwrap_or_else(|| used_endpoints(port));
        let without = without_endpoints(port, traits);
        PortStatus {
            service: port.key.service.to_string(),
            port_name: port.key.port_name.to_string(),
            protocol: port.key.protocol.to_string(),
            family: port.key.family.to_string(),
            cluster_ip: port.cluster_ip,
            port: port.port,
            node_port: port.node_port,
            external_ips: port.external_ips.clone(),
            load_balancer_ips: port.load_balancer_ips.clone(),
            source_ranges: port.source_ranges.clone(),
            source_ranges_of_other_families_only: Vec::new(),
            external_traffic_policy: policy(port.external_policy_local),
            internal_traffic_policy: policy(port.internal_policy_local),
            affinity_timeout_seconds: port.session_affinity.map(|a| a.timeout_seconds),
            health_check_node_port: port.health_check_node_port,
            health_check: None,
            without_endpoints: without.as_ref().map(|(text, _)| text.clone()),
            without_endpoints_detail: without.map(|(_, detail)| detail),
            endpoints,
            only_used_known,
        }
    }

    /// Adds to the "no endpoints" sentence the Service's EndpointSlices of a family it has no
    /// cluster IP of (`unserved`: family, slices, endpoints; see
    /// `kpng_model::Model::slices_of_unserved_families`): ignored, as kube-proxy ignores
    /// them, but "no endpoints" alone sends the operator to the pods, while the endpoints are
    /// there, in a slice of the wrong family (a Service made IPv4-only while its IPv6 slice
    /// lingers, an endpoints controller writing the wrong family).
    pub fn note_slices_of_unserved_families(&mut self, unserved: &[(Family, usize, usize)]) {
        let Some(text) = &mut self.without_endpoints else {
            return;
        };
        for (family, slices, endpoints) in unserved {
            let family = family.label();
            let endpoints = match endpoints {
                1 => "1 endpoint".to_string(),
                n => format!("{n} endpoints"),
            };
            let slices = match slices {
                1 => format!("its {family} EndpointSlice ({endpoints}) is"),
                n => format!("its {n} {family} EndpointSlices ({endpoints}) are"),
            };
            text.push_str(&format!(
                "; {slices} ignored: the Service has no {family} cluster IP (as kube-proxy)"
            ));
        }
    }

    /// Whether the row, as the status page shows it (Service, port, protocol, family,
    /// frontends, policies, endpoint addresses), contains `lowercase_text`.
    pub fn row_contains(&self, lowercase_text: &str) -> bool {
        use std::fmt::Write as _;
        let mut s = format!(
            "{} {}/{} {} {}:{}",
            self.service, self.port_name, self.protocol, self.family, self.cluster_ip, self.port
        );
        if let Some(np) = self.node_port {
            let _ = write!(s, " node port {np}");
        }
        for ip in &self.external_ips {
            let _ = write!(s, " external {ip}");
        }
        for ip in &self.load_balancer_ips {
            let _ = write!(s, " load balancer {ip}");
        }
        let _ = write!(
            s,
            " external {}, internal {}",
            self.external_traffic_policy, self.internal_traffic_policy
        );
        for e in &self.endpoints {
            let _ = write!(s, " {}", e.address);
        }
        s.to_lowercase().contains(lowercase_text)
    }
}

/// What traffic meets when an endpoint list a port needs is empty, for scripts
/// ([`PortStatus::without_endpoints_detail`]): [`PortStatus::without_endpoints`]'s sentence
/// as three stable camelCase words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WithoutEndpoints {
    /// Which list is empty: `noEndpoints` (the Service has none at all), `noUsableEndpoint`
    /// (none serving), `noLocalEndpoint` (none on this node, under a Local policy).
    pub reason: String,
    /// Which traffic meets it: `all`, `clusterIP` (internalTrafficPolicy Local) or
    /// `external` (node ports, external and load-balancer IPs: externalTrafficPolicy Local).
    pub traffic: String,
    /// What it meets: `reject` (refused at once), `drop` (silently dropped), `noAnswer` (HNS:
    /// no load balancer, the client times out).
    pub verdict: String,
}

/// What happens to traffic whose endpoint list is empty, on a backend with `traits` (the
/// Linux backends reject a Service without endpoints and drop what no endpoint suits; HNS has
/// no load balancer for an empty list, so nothing answers): in words, and as
/// [`WithoutEndpoints`]; `None` when every list it needs has endpoints.
fn without_endpoints(
    port: &ServicePort,
    traits: &BackendTraits,
) -> Option<(String, WithoutEndpoints)> {
    let cluster_empty = port.uses_cluster_endpoints() && port.cluster_endpoints.is_empty();
    let local_empty = port.uses_local_endpoints() && port.local_endpoints.is_empty();
    let hns = !traits.rejects_without_endpoints;
    let (text, reason, traffic) = if !port.has_any_endpoints {
        if hns {
            (
                "no endpoints: no HNS load balancer (HNS refuses one without endpoints), so \
                 connections are not answered: they time out",
                "noEndpoints",
                "all",
            )
        } else {
            (
                "no endpoints: connections are rejected",
                "noEndpoints",
                "all",
            )
        }
    } else if hns {
        // HNS: an empty list is a load balancer that does not exist, not a drop rule.
        if cluster_empty {
            (
                "no usable endpoint: no HNS load balancer, so connections are not answered",
                "noUsableEndpoint",
                "all",
            )
        } else if local_empty && port.internal_policy_local {
            (
                "no local endpoint: no ClusterIP load balancer, so ClusterIP connections are not \
                 answered (internalTrafficPolicy Local)",
                "noLocalEndpoint",
                "clusterIP",
            )
        } else if local_empty {
            (
                "no local endpoint: no external load balancers, so external connections are not \
                 answered (externalTrafficPolicy Local)",
                "noLocalEndpoint",
                "external",
            )
        } else {
            return None;
        }
    } else if cluster_empty {
        (
            "no usable endpoint: connections are dropped",
            "noUsableEndpoint",
            "all",
        )
    } else if local_empty && port.internal_policy_local {
        (
            "no local endpoint: ClusterIP connections are dropped (internalTrafficPolicy Local)",
            "noLocalEndpoint",
            "clusterIP",
        )
    } else if local_empty {
        (
            "no local endpoint: external connections are dropped (externalTrafficPolicy Local)",
            "noLocalEndpoint",
            "external",
        )
    } else {
        return None;
    };
    let verdict = match (hns, reason) {
        (true, _) => "noAnswer",
        (false, "noEndpoints") => "reject",
        (false, _) => "drop",
    };
    Some((
        text.to_string(),
        WithoutEndpoints {
            reason: reason.to_string(),
            traffic: traffic.to_string(),
            verdict: verdict.to_string(),
        },
    ))
}

/// The endpoints a port uses, when nothing more is known (a brain's view).
fn used_endpoints(port: &ServicePort) -> Vec<EndpointStatus> {
    let mut out: Vec<EndpointStatus> = Vec::new();
    for (list, endpoints) in [
        ("cluster", &port.cluster_endpoints),
        ("local", &port.local_endpoints),
    ] {
        for e in endpoints {
            match out.iter_mut().find(|s| s.address == e.addr()) {
                Some(s) => s.used_by.push(list.to_string()),
                None => out.push(EndpointStatus {
                    address: e.addr(),
                    ready: e.ready,
                    serving: e.serving,
                    terminating: e.terminating,
                    local: e.is_local,
                    zone_hints: Vec::new(),
                    node_hints: Vec::new(),
                    used_by: vec![list.to_string()],
                    reason: None,
                    other_copies: None,
                }),
            }
        }
    }
    out
}

/// RFC 3339 (UTC, milliseconds).
pub(crate) fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// Answers from the node facts function, when the binary gave one.
pub(crate) fn facts_or_default(facts: Option<&FactsFn>, snapshot: &Snapshot) -> NodeFacts {
    facts.map(|f| f(snapshot)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A brain's rejected and dropped objects read as a local one's (`ObjectRef`'s display).
    #[test]
    fn a_reported_object_is_named_kind_namespace_name() {
        let cases = [
            ("Service", "default", "web", "Service default/web"),
            ("Node", "", "node1", "Node node1"),
        ];
        for (kind, namespace, name, want) in cases {
            assert_eq!(reported_object(kind, namespace, name), want);
        }
    }

    #[test]
    fn a_stale_input_is_one_line_naming_the_first_problem_and_counting_the_others() {
        let problem = |what: &str| InputProblemStatus {
            what: what.into(),
            message: "unreachable: refused".into(),
            since: "T0".into(),
        };
        let input = |problems: Vec<InputProblemStatus>| InputStatus {
            source: "brain tcp://b:1".into(),
            problems,
            last_good: None,
            detail: None,
            brain_version: None,
            ..Default::default()
        };
        let cases = [
            (vec![], None),
            (
                vec![problem("brain")],
                Some(
                    "this node's input (brain tcp://b:1) has a problem since T0: brain: \
                     unreachable: refused; what is shown is from its last good input, and may \
                     be out of date",
                ),
            ),
            (
                vec![problem("a"), problem("b"), problem("c")],
                Some(
                    "this node's input (brain tcp://b:1) has a problem since T0: a: \
                     unreachable: refused (and 2 more problems); what is shown is from its last \
                     good input, and may be out of date",
                ),
            ),
        ];
        for (problems, want) in cases {
            assert_eq!(input(problems).stale_note().as_deref(), want);
        }
    }

    #[test]
    fn services_are_asked_for_by_name_namespace_and_port() {
        for (filter, want) in [
            (None, true),
            (Some(""), true),
            (Some("web"), true),
            (Some("default/web"), true),
            (Some("default/web:http"), true),
            (Some("web:http"), true),
            (Some("default/web:grpc"), false),
            (Some("default/web:80"), true),
            (Some("web:80"), true),
            (Some("default/web:8080"), false),
            (Some("default/web:080x"), false),
            (Some("other/web"), false),
            (Some("we"), false),
        ] {
            let q = StatusQuery {
                service: filter.map(String::from),
                ..StatusQuery::default()
            };
            assert_eq!(
                q.wants_service("default", "web", "http", 80),
                want,
                "{filter:?}"
            );
        }
    }

    /// What `kpng status` says of an empty endpoint list is the backend's truth: the Linux
    /// backends reject a Service without endpoints and drop what no endpoint suits; HNS has no
    /// load balancer then (winkernel: "not applying any policy"), so nothing answers.
    #[test]
    fn an_empty_endpoint_list_is_worded_per_backend() {
        use kpng_model::{Endpoint, Family, PortKey, Protocol, ServiceKey};
        let port = |endpoints: &[(&str, bool)], etp_local: bool, itp_local: bool| {
            let mut p = ServicePort::new(
                PortKey {
                    service: ServiceKey::new("ns", "web"),
                    port_name: "http".into(),
                    protocol: Protocol::Tcp,
                    family: Family::V4,
                },
                "10.96.0.10".parse().expect("ip"),
                80,
            );
            p.node_port = Some(30080);
            p.external_policy_local = etp_local;
            p.internal_policy_local = itp_local;
            let eps: Vec<Endpoint> = endpoints
                .iter()
                .map(|(ip, local)| Endpoint {
                    ip: ip.parse().expect("ip"),
                    port: 8080,
                    is_local: *local,
                    ready: true,
                    serving: true,
                    terminating: false,
                })
                .collect();
            p.has_any_endpoints = !eps.is_empty();
            p.local_endpoints = eps.iter().filter(|e| e.is_local).cloned().collect();
            p.cluster_endpoints = eps;
            p
        };
        let linux = BackendTraits::default();
        let hns = BackendTraits {
            rejects_without_endpoints: false,
            ..BackendTraits::default()
        };
        let remote_only = [("10.244.2.5", false)];
        let cases: [(&str, ServicePort, &BackendTraits, Option<&str>); 8] = [
            (
                "none, Linux",
                port(&[], false, false),
                &linux,
                Some("no endpoints: connections are rejected"),
            ),
            (
                "none, HNS",
                port(&[], false, false),
                &hns,
                Some(
                    "no endpoints: no HNS load balancer (HNS refuses one without endpoints), \
                     so connections are not answered: they time out",
                ),
            ),
            (
                "eTP Local, none here, Linux",
                port(&remote_only, true, false),
                &linux,
                Some(
                    "no local endpoint: external connections are dropped \
                     (externalTrafficPolicy Local)",
                ),
            ),
            (
                "eTP Local, none here, HNS",
                port(&remote_only, true, false),
                &hns,
                Some(
                    "no local endpoint: no external load balancers, so external connections \
                     are not answered (externalTrafficPolicy Local)",
                ),
            ),
            (
                "iTP Local, none here, Linux",
                port(&remote_only, false, true),
                &linux,
                Some(
                    "no local endpoint: ClusterIP connections are dropped \
                     (internalTrafficPolicy Local)",
                ),
            ),
            (
                "iTP Local, none here, HNS",
                port(&remote_only, false, true),
                &hns,
                Some(
                    "no local endpoint: no ClusterIP load balancer, so ClusterIP connections \
                     are not answered (internalTrafficPolicy Local)",
                ),
            ),
            (
                "served, Linux",
                port(&remote_only, false, false),
                &linux,
                None,
            ),
            ("served, HNS", port(&remote_only, false, false), &hns, None),
        ];
        // The same, as words for scripts (`withoutEndpointsDetail`): reason, traffic, verdict.
        let details = [
            Some(("noEndpoints", "all", "reject")),
            Some(("noEndpoints", "all", "noAnswer")),
            Some(("noLocalEndpoint", "external", "drop")),
            Some(("noLocalEndpoint", "external", "noAnswer")),
            Some(("noLocalEndpoint", "clusterIP", "drop")),
            Some(("noLocalEndpoint", "clusterIP", "noAnswer")),
            None,
            None,
        ];
        for ((what, port, traits, want), detail) in cases.into_iter().zip(details) {
            let status = PortStatus::of(&port, None, traits);
            assert_eq!(status.without_endpoints.as_deref(), want, "{what}");
            // Only the local list empty: `kpng status` counts it apart from "no endpoints".
            let local_only = want.is_some_and(|w| w.starts_with("no local endpoint"));
            assert_eq!(status.without_local_endpoint_only(), local_only, "{what}");
            assert_eq!(
                status.without_endpoints_detail,
                detail.map(|(reason, traffic, verdict)| WithoutEndpoints {
                    reason: reason.into(),
                    traffic: traffic.into(),
                    verdict: verdict.into(),
                }),
                "{what}"
            );
        }
        // Every endpoint not serving: no usable endpoint, dropped.
        let mut unusable = port(&remote_only, false, false);
        unusable.cluster_endpoints.clear();
        let status = PortStatus::of(&unusable, None, &linux);
        assert_eq!(
            status
                .without_endpoints_detail
                .map(|d| (d.reason, d.traffic, d.verdict)),
            Some(("noUsableEndpoint".into(), "all".into(), "drop".into()))
        );
        // Endpoints, none usable: the cluster list is empty, not only the local one.
        let status = PortStatus::of(&unusable, None, &linux);
        assert!(!status.without_local_endpoint_only());

        // The Service's slices of a family it does not serve are named beside "no endpoints";
        // a port with endpoints has no such sentence to add to.
        type Unserved = &'static [(Family, usize, usize)];
        let note_cases: [(&str, ServicePort, Unserved, Option<&str>); 4] = [
            (
                "one IPv6 slice",
                port(&[], false, false),
                &[(Family::V6, 1, 1)],
                Some(
                    "no endpoints: connections are rejected; its IPv6 EndpointSlice (1 endpoint) \
                     is ignored: the Service has no IPv6 cluster IP (as kube-proxy)",
                ),
            ),
            (
                "two IPv4 slices",
                port(&[], false, false),
                &[(Family::V4, 2, 3)],
                Some(
                    "no endpoints: connections are rejected; its 2 IPv4 EndpointSlices (3 \
                     endpoints) are ignored: the Service has no IPv4 cluster IP (as kube-proxy)",
                ),
            ),
            (
                "none",
                port(&[], false, false),
                &[],
                Some("no endpoints: connections are rejected"),
            ),
            (
                "endpoints: nothing to add to",
                port(&remote_only, false, false),
                &[(Family::V6, 1, 1)],
                None,
            ),
        ];
        for (what, port, unserved, want) in note_cases {
            let mut status = PortStatus::of(&port, None, &linux);
            status.note_slices_of_unserved_families(unserved);
            assert_eq!(status.without_endpoints.as_deref(), want, "{what}");
        }
    }

    /// The input's prose has words for scripts beside it: its kind and location, its state,
    /// and what the last load held as numbers and a path.
    #[test]
    fn the_input_is_said_in_words_for_scripts_too() {
        use kpng_model::input::{InputHealth, LoadFacts};
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        let health = InputHealth::new("directory /etc/kpng/manifests");
        health.loaded_with(
            at,
            Some("18 objects from 3 files".into()),
            LoadFacts {
                objects: Some(18),
                files: Some(3),
                changed_file: None,
            },
        );
        let status = InputStatus::of(&health.state());
        assert_eq!(
            (status.kind.as_str(), status.location.as_str()),
            ("directory", "/etc/kpng/manifests")
        );
        assert_eq!(status.state, "ok");
        assert_eq!(
            (status.last_good_objects, status.last_good_files),
            (Some(18), Some(3))
        );
        assert_eq!(
            status.last_good.as_deref(),
            Some("2027-01-15T08:00:00.000Z")
        );
        health.failing("/etc/kpng/manifests/a.yaml", "not YAML", at);
        assert_eq!(InputStatus::of(&health.state()).state, "problem");
        for (source, kind, location) in [
            ("file /c.yaml", "file", "/c.yaml"),
            (
                "kube https://10.0.0.1:6443/",
                "kube",
                "https://10.0.0.1:6443/",
            ),
            ("brain tcp://b:1", "brain", "tcp://b:1"),
            ("", "", ""),
        ] {
            assert_eq!(source_parts(source), (kind, location), "{source}");
        }
    }
}
