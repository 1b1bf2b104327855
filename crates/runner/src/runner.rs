//! The sync loop shared by every sink and backend.
//!
//! It owns a [`NodeModel`] (the in-process [`Model`], or a remote brain's state) and one
//! [`Backend`]. Source inputs are applied to the model as they arrive and their diffs are merged
//! into one pending diff; the backend is synced:
//! - not before Services, EndpointSlices and Nodes have all been listed once (a source signals a
//!   complete list with [`Event::Replace`](kpng_model::Event::Replace) or
//!   [`Event::ListDone`](kpng_model::Event::ListDone); a brain's first change set
//!   counts as all of them), so a half-known cluster is never programmed;
//! - at most once per `min_sync_period` after a sync that wrote to the data plane (a full one,
//!   one with operations, a failed one); a sync that changed nothing, such as an idle periodic
//!   one, does not delay the next change: the period protects the kernel from churn, and such
//!   a sync made none;
//! - with a full sync first, after any failure (retried with backoff up to `sync_period`), and
//!   every `full_sync_period`;
//! - with an empty partial sync every `sync_period`, so backends can re-check cheap things;
//! - with a full sync [`TAMPER_DEBOUNCE`] after the backend reports that someone else changed
//!   its data plane ([`kpng_backend::Backend::watch_tampering`]), whatever `min_sync_period`;
//!   when such changes keep coming, later (see [`crate::repair_backoff`]).
//!
//! After a successful sync, backends that program the node also get their Service health
//! checks served and stale UDP conntrack entries deleted.
//! It also keeps kube-proxy's change metrics: every Service or EndpointSlice event counts in
//! `…_changes_total`; the ones that changed the model count as pending until the next sync; and
//! the EndpointSlices' last-change trigger times become `network_programming_duration_seconds`
//! once a sync has programmed them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kpng_model::input::InputHealth;
use kpng_model::{Diff, DiffSummary, Family, Kind, Model, ServiceKey, TriggerTime};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::SyncTiming;
use crate::address_change::AddressChange;
use crate::admin::{
    self, AdminHandle, BrainReportStatus, ConntrackStatus, DataPlaneDetail, DroppedStatus, FactsFn,
    HealthCheckStatus, InputStatus, NotProgrammed, PortStatus, Query, RejectedStatus, RepairStatus,
    Status, SyncStatus, TraceAnswer,
};
#[cfg(target_os = "linux")]
use crate::conntrack_cleanup::ConntrackCleanup;
use crate::health::ProxyHealth;
use crate::metrics::ProxyMetrics;
use crate::metrics::{BackendLabel, KindLabel, NoLocalLabel};
use crate::repair_backoff::RepairBackoff;
use crate::service_health::{ListenAddresses, ServiceHealthServers, wanted, wanted_for};
use kpng_backend::{Backend, InputInfo, NodeModel, TamperAlarm, Tampering};

/// Logs a sync's `synced` line at info level when `$shown`, at debug level otherwise (the
/// routine syncs beyond the minute's budget, see [`crate::sync_log`]). One macro keeps the two
/// lines' fields the same: tracing fixes an event's level per callsite, so a function could not
/// choose it at run time.
macro_rules! synced_line {
    ($shown:expr, $($field:tt)+) => {
        if $shown {
            info!($($field)+ "synced");
        } else {
            debug!($($field)+ "synced");
        }
    };
}

/// The kinds a source must list before anything is programmed.
const REQUIRED_KINDS: [Kind; 3] = [Kind::Service, Kind::EndpointSlice, Kind::Node];

/// How long after a tampering report the repairing full sync starts: a `nft flush ruleset`
/// or `iptables -F` arrives as a burst of notifications, and one sync repairs them all.
pub const TAMPER_DEBOUNCE: Duration = Duration::from_millis(20);

pub use crate::service_health::HealthCheckAddresses;

/// The outcome of one sync, published for tests, benchmarks and the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncReport {
    /// Counts syncs since start (successful or not).
    pub generation: u64,
    /// Whether the backend accepted it.
    pub ok: bool,
    /// Whether it was a full sync.
    pub full: bool,
    /// Operations sent to the data plane.
    pub operations: usize,
    /// How long the backend took.
    pub duration: Duration,
    /// Why it failed.
    pub error: Option<String>,
}

/// Everything the loop needs.
pub struct Runner<M: NodeModel = Model> {
    service_health: Option<(ServiceHealthServers, ListenAddresses)>,
    #[cfg(target_os = "linux")]
    conntrack: Option<ConntrackCleanup>,
    model: M,
    backend: Box<dyn Backend>,
    timing: SyncTiming,
    metrics: ProxyMetrics,
    health: Arc<ProxyHealth>,
    reports: watch::Sender<Option<SyncReport>>,
    admin: Option<(mpsc::Receiver<Query>, FactsFn)>,
    /// How the source is doing, for the status answers.
    input: Option<InputHealth>,
    /// What the configuration needs from the Node ([`Runner::with_node_ips_wait`],
    /// [`Runner::requiring_pod_cidrs`]).
    node_needs: admin::NodeNeeds,
    /// The backend's rules from an earlier run were found at start ([`Runner::with_earlier_rules`]).
    earlier_rules_found: bool,
    /// Set for a sink that programs nothing (`to-file`, a dry run): `kpng trace` says so.
    programs_nothing: Option<String>,
    /// Checks of the node's configuration ([`Runner::checking_node_config`]).
    node_check: crate::node_config_check::NodeConfigCheck,
    /// Whether the host's addresses are compared with the Node's.
    node_ips_on_host: bool,
    /// Repairs within a minute made at once ([`Runner::with_free_repairs`]).
    free_repairs: usize,
    /// The node's kernel settings Services need ([`Runner::checking_host`]).
    host_check: Option<(crate::host_check::HostProbe, crate::host_check::HostNeeds)>,
}

impl<M: NodeModel> Runner<M> {
    /// Assembles a runner. `health` must cover the backend's families.
    pub fn new(
        model: M,
        backend: Box<dyn Backend>,
        timing: SyncTiming,
        metrics: ProxyMetrics,
        health: Arc<ProxyHealth>,
    ) -> Runner<M> {
        let (reports, _) = watch::channel(None);
        Runner {
            service_health: None,
            #[cfg(target_os = "linux")]
            conntrack: None,
            model,
            backend,
            timing,
            metrics,
            health,
            reports,
            admin: None,
            input: None,
            node_needs: admin::NodeNeeds::default(),
            earlier_rules_found: false,
            programs_nothing: None,
            node_check: Default::default(),
            node_ips_on_host: false,
            free_repairs: crate::repair_backoff::FREE_REPAIRS,
            host_check: None,
        }
    }

    /// Reads the node's kernel settings with `probe` at the first sync and at every full or
    /// periodic one, warns once of each that breaks Services for a backend needing `needs`
    /// ([`crate::host_check`]), and shows them as the `node checks` line of `kpng status`.
    pub fn checking_host(
        mut self,
        probe: crate::host_check::HostProbe,
        needs: crate::host_check::HostNeeds,
    ) -> Runner<M> {
        self.host_check = Some((probe, needs));
        self
    }

    /// Repairs of changes someone else made that are made at once within a minute, before
    /// later ones back off ([`crate::repair_backoff`]; default
    /// [`crate::repair_backoff::FREE_REPAIRS`]): tests that repeat such a change on purpose
    /// raise it.
    pub fn with_free_repairs(mut self, free: usize) -> Runner<M> {
        self.free_repairs = free;
        self
    }

    /// The backend's rules from an earlier run of kpng were found at start (its table, chains or
    /// pinned maps in the kernel): until the first sync replaces them they still route traffic, which `kpng
    /// status` and `kpng trace` say while the first sync is held, instead of only "nothing is
    /// programmed".
    pub fn with_earlier_rules(mut self, found: bool) -> Runner<M> {
        self.earlier_rules_found = found;
        self
    }

    /// The sink programs nothing (`to-file`, a dry run): every `kpng trace` answer carries
    /// `note`, so that its verdict is not read as what the kernel does (until 2026-12-07 a
    /// trace of a `to-file` kpng read as if its rules were in place).
    pub fn programming_nothing(mut self, note: String) -> Runner<M> {
        self.programs_nothing = Some(note);
        self
    }

    /// Warns (once per change) and shows in `kpng status` a Node whose pod CIDRs are outside
    /// `cluster_cidrs` (`--cluster-cidr`) and, with `node_ips_on_host` (a backend serving
    /// NodePorts on the node IPs, on Linux where the host's addresses are watched), a Node
    /// none of whose addresses is on this host: a wrong `--node-name`.
    pub fn checking_node_config(
        mut self,
        cluster_cidrs: Vec<ipnet::IpNet>,
        node_ips_on_host: bool,
    ) -> Runner<M> {
        self.node_check.cluster_cidrs = cluster_cidrs;
        self.node_ips_on_host = node_ips_on_host;
        self
    }

    /// `--nodeport-addresses` as CIDRs (`cidrs`): a family of the backend they restrict and
    /// no address of the host is in serves its NodePorts nowhere, which is warned (once per
    /// change, the host's addresses followed) and shown in `kpng status`; and a change of
    /// the host's addresses that only touches such a family's addresses outside them changes
    /// nothing, and is logged at debug level only.
    pub fn checking_node_port_cidrs(mut self, cidrs: Vec<ipnet::IpNet>) -> Runner<M> {
        self.node_check.node_port_cidrs = cidrs;
        self
    }

    /// `--detect-local-mode ClusterCIDR` (without `--masquerade-all`): a family the Node uses
    /// that `--cluster-cidr` has no CIDR of gets no pod detection rule, which the node's
    /// checks then name (once in the log, and in `kpng status`), as kube-proxy logs it.
    /// `warned_at_start`: the families whose missing cluster CIDR the start already logged
    /// (from `--node-ip` and `--service-cidr`): shown in `kpng status`, not logged again.
    pub fn detecting_pods_by_cluster_cidr(
        mut self,
        warned_at_start: Vec<kpng_model::Family>,
    ) -> Runner<M> {
        self.node_check.cluster_cidrs_detect_pods = true;
        self.node_check.cluster_cidr_warned_at_start = warned_at_start;
        self
    }

    /// NodePorts are served on the node's primary IPs (`--nodeport-addresses primary`): when
    /// no node IP is known `wait` after the initial lists, they are served on every local
    /// address instead (as kube-proxy, whose start-up wait for the Node's IPs ends after 30 s
    /// and leaves `primary` with no address, which means all), with a warning; once node IPs
    /// are known, on those only. Without this, a model with no node IPs serves no NodePort.
    pub fn with_node_ips_wait(mut self, wait: Duration) -> Runner<M> {
        self.node_needs.primary_node_ports = Some(wait);
        self
    }

    /// `--detect-local-mode NodeCIDR`: the first sync waits for the Node's podCIDRs, as
    /// kube-proxy never programs rules without them (without them nothing tells pod traffic
    /// apart: external clients are not masqueraded and pods lose the eTP Local
    /// short-circuit). After the first sync the model keeps the last pod CIDRs it had. A
    /// family of the backend the Node has addresses of but no pod CIDR of is named by the
    /// node's checks (once in the log, and in `kpng status`), as kube-proxy logs it.
    pub fn requiring_pod_cidrs(mut self) -> Runner<M> {
        self.node_needs.pod_cidrs = true;
        self
    }

    /// Answers `kpng status` and `kpng trace` through the returned handle; `facts` tells a
    /// trace what the model does not know (node port addresses, the pod detector).
    pub fn with_admin(mut self, facts: FactsFn) -> (Runner<M>, AdminHandle) {
        let (tx, rx) = mpsc::channel(16);
        self.admin = Some((rx, facts));
        (self, AdminHandle::new(tx))
    }

    /// Shows the source's record of its input's health in the status answers: why nothing is
    /// programmed yet, or why an edit did not take effect.
    pub fn with_input_health(mut self, input: InputHealth) -> Runner<M> {
        self.input = Some(input);
        self
    }

    /// Serves the Service health checks (`healthCheckNodePort`) after every successful sync:
    /// part of every backend that programs the node.
    pub fn with_service_health(mut self, addresses: HealthCheckAddresses) -> Runner<M> {
        let servers = ServiceHealthServers::new(
            self.health.clone(),
            self.metrics.healthcheck_failures.clone(),
            self.metrics.healthchecks_not_served.clone(),
        )
        .with_connection_limits(
            crate::guarded_http::ConnectionLimits::DEFAULT,
            self.metrics.http_connections_refused.clone(),
        );
        self.service_health = Some((servers, ListenAddresses::new(addresses)));
        self
    }

    /// Deletes stale UDP conntrack entries after every successful sync that can leave some
    /// (see `kpng_conntrack::pass_needed`): part of every backend that programs the node.
    #[cfg(target_os = "linux")]
    pub fn with_conntrack_cleanup(mut self, reconciler: kpng_conntrack::Reconciler) -> Runner<M> {
        self.conntrack = Some(ConntrackCleanup::new(reconciler, self.metrics.clone()));
        self
    }

    /// Keeps the conntrack cleanup's checked frontends in `file` across restarts, so that the
    /// first pass after a restart whose backend kept its rules in place reads only the DNATed
    /// entries (see `kpng_conntrack::memory`); `loaded` is what `file.load()` read at start-up.
    /// Without [`Runner::with_conntrack_cleanup`] first, nothing.
    #[cfg(target_os = "linux")]
    pub fn with_conntrack_memory(
        mut self,
        file: kpng_conntrack::memory::MemoryFile,
        loaded: Result<
            Option<kpng_conntrack::memory::Checked>,
            kpng_conntrack::memory::MemoryError,
        >,
    ) -> Runner<M> {
        self.conntrack = self.conntrack.map(|c| c.with_memory(file, loaded));
        self
    }

    /// Frontends another proxy's rules (kube-proxy's) had DNATed and cleaned when kpng
    /// started: the conntrack cleanup takes them as checked after the first sync (see
    /// [`crate::conntrack_cleanup::StartRead`]). Without
    /// [`Runner::with_conntrack_cleanup`] first, nothing.
    #[cfg(target_os = "linux")]
    pub fn with_conntrack_inherited(
        mut self,
        inherited: crate::conntrack_cleanup::StartRead,
    ) -> Runner<M> {
        self.conntrack = self.conntrack.map(|c| c.with_inherited(inherited));
        self
    }

    /// The UDP frontends kpng's own rules had when it started, read before the first commit:
    /// the conntrack cleanup trusts the last run's memory for those only (see
    /// [`crate::conntrack_cleanup::ConntrackCleanup::with_rules_in_place`]). Without
    /// [`Runner::with_conntrack_cleanup`] first, nothing.
    #[cfg(target_os = "linux")]
    pub fn with_conntrack_rules_in_place(
        mut self,
        in_place: crate::conntrack_cleanup::StartRead,
    ) -> Runner<M> {
        self.conntrack = self.conntrack.map(|c| c.with_rules_in_place(in_place));
        self
    }

    /// A receiver of the latest [`SyncReport`].
    pub fn subscribe(&self) -> watch::Receiver<Option<SyncReport>> {
        self.reports.subscribe()
    }

    /// Each new failure to start a Service's health-check server (a first one, or a new
    /// reason), for kube-proxy's Event on the Service; `None` without health checks
    /// ([`Runner::with_service_health`] first).
    pub fn health_check_failures(
        &mut self,
    ) -> Option<tokio::sync::mpsc::UnboundedReceiver<crate::service_health::NotServed>> {
        self.service_health
            .as_mut()
            .map(|(servers, _)| servers.report_failures())
    }

    /// Runs until the event channel closes. Rules stay as they are when it returns.
    pub async fn run(mut self, events: mpsc::Receiver<M::Input>) {
        let families = self.backend.families();
        if self.node_needs.primary_node_ports.is_some() {
            self.node_check.primary_node_port_families = families.clone();
        }
        if self.node_needs.pod_cidrs {
            self.node_check.node_cidr_families = families.clone();
        }
        if !self.node_check.node_port_cidrs.is_empty() {
            self.node_check.node_port_cidr_families = families.clone();
        }
        self.node_check.node_ips_on_host = self.node_ips_on_host;
        self.metrics
            .export_from_start(self.backend.name(), &families);
        #[cfg(target_os = "linux")]
        if self.conntrack.is_some() {
            self.metrics.export_conntrack_from_start(&families);
        }
        let (tamper_tx, tampering) = mpsc::unbounded_channel();
        let alarm = TamperAlarm::new(move |t| {
            // The loop has ended when the receiver is gone: nothing left to repair.
            let _ = tamper_tx.send(t);
        });
        let (queries, facts) = match self.admin.take() {
            Some((rx, facts)) => (Some(rx), Some(facts)),
            None => (None, None),
        };
        let (address_tx, address_changes) = mpsc::unbounded_channel::<AddressChange>();
        #[cfg(target_os = "linux")]
        if let Err(e) = crate::address_watch::watch(
            move |change| address_tx.send(change).is_ok(),
            kpng_backend::host::local_addresses,
        ) {
            warn!(
                "cannot watch the node's addresses ({e}): a change reaches node ports and \
                 health checks at the next periodic sync"
            );
        }
        #[cfg(not(target_os = "linux"))]
        drop(address_tx);
        #[cfg(target_os = "linux")]
        if self.node_ips_on_host || !self.node_check.node_port_cidrs.is_empty() {
            self.node_check.host_addresses = Some(kpng_backend::host::local_addresses());
        }
        match self.backend.watch_tampering(alarm) {
            Ok(true) => debug!("the backend reports changes made by others to its data plane"),
            Ok(false) => {}
            Err(e) => warn!("cannot watch the data plane for changes made by others: {e}"),
        }
        if let Err(e) = self.backend.prepare() {
            warn!(
                "cannot prepare the data plane before the first sync (the sync tries again): {e}"
            );
        }
        let repair_backoff = RepairBackoff::new(self.timing.sync_period, self.free_repairs);
        let mut state = LoopState {
            runner: self,
            families,
            pending: Diff::default(),
            need_full: true,
            listed: BTreeSet::new(),
            reported_missing: Vec::new(),
            last_sync: None,
            last_write: None,
            last_full: None,
            retry_at: None,
            retry_delay: Duration::ZERO,
            generation: 0,
            pending_services: BTreeSet::new(),
            pending_endpoints: 0,
            pending_triggers: Vec::new(),
            started: SystemTime::now(),
            facts,
            last_sync_status: None,
            model_counts: BTreeMap::new(),
            sync_history: std::collections::VecDeque::new(),
            loading_report_at: Instant::now(),
            last_ok_at: None,
            last_error: None,
            warnings: crate::warning_budget::WarningBudget::default(),
            rejections: crate::rejection_log::RejectionLog::default(),
            sync_log: crate::sync_log::SyncLog::default(),
            repair_for: None,
            repair_since: None,
            repairs: None,
            repair_backoff,
            node_ips_deadline: None,
            logged_node: None,
            held_for_pod_cidrs: false,
            addresses_changed: None,
            node_status_changed: false,
            warned_node_config: Vec::new(),
            host_checked: None,
            unsynced: None,
            failing: None,
        };
        // As kube-proxy's sync loop, which calls `Updated` as it starts: `/healthz` reports
        // the loop's start as each family's `lastUpdated` rather than the zero time, and a
        // change queued from now on is late 2 × `--sync-period` after it was queued.
        let started = SystemTime::now();
        for family in &state.families {
            state.runner.health.updated(*family, started);
        }
        state.update_eligibility();
        state.run(events, tampering, address_changes, queries).await;
    }
}

struct LoopState<M: NodeModel> {
    runner: Runner<M>,
    families: Vec<Family>,
    pending: Diff,
    need_full: bool,
    listed: BTreeSet<Kind>,
    /// The kinds still unlisted when the gate was last reported (each new set is logged
    /// once, so an operator sees why nothing is programmed yet).
    reported_missing: Vec<Kind>,
    last_sync: Option<Instant>,
    /// When the last sync that wrote to the data plane (a full one, one with operations, or a
    /// failed one, which may have written part) started: the next sync waits `min_sync_period` from it. A sync
    /// that changed nothing does not count, so a change arriving just after an idle periodic
    /// sync is not held back by it.
    last_write: Option<Instant>,
    last_full: Option<Instant>,
    retry_at: Option<Instant>,
    retry_delay: Duration,
    generation: u64,
    /// Services whose object changed since the last sync (kube-proxy's pending Service changes).
    pending_services: BTreeSet<ServiceKey>,
    /// EndpointSlice changes since the last sync.
    pending_endpoints: i64,
    /// Trigger times of the endpoint changes not programmed yet.
    pending_triggers: Vec<TriggerTime>,
    /// When the loop started: earlier trigger times are not measured (as upstream, which
    /// ignores changes from before the proxy started).
    started: SystemTime,
    /// What a trace needs beyond the model (set with the admin handle).
    facts: Option<FactsFn>,
    /// The last sync, for `kpng status`.
    last_sync_status: Option<SyncStatus>,
    /// What the model gauges count per family, as of the last successful sync.
    model_counts: BTreeMap<Family, ModelCounts>,
    /// When the loading progress was last reported (before the first sync).
    loading_report_at: Instant,
    /// The last syncs that did something or failed, newest first ([`admin::SYNC_HISTORY`]).
    sync_history: std::collections::VecDeque<SyncStatus>,
    /// When the last successful sync ended.
    last_ok_at: Option<SystemTime>,
    /// The last failure, cleared by the next success.
    last_error: Option<String>,
    /// Warnings about objects shown since the last sync (the rest go to debug).
    warnings: crate::warning_budget::WarningBudget,
    /// When each rejected object was first rejected, for the line that ends it.
    rejections: crate::rejection_log::RejectionLog,
    /// Which routine syncs are logged at info level, and the summary of the others.
    sync_log: crate::sync_log::SyncLog,
    /// What someone else changed, when the next full sync repairs it (the first report of a
    /// burst).
    repair_for: Option<String>,
    /// When [`Self::repair_for`] was first reported (wall clock, for `kpng status`): from then
    /// until the repair the data plane lacks (part of) the rules, which status says.
    repair_since: Option<SystemTime>,
    /// The repairs made so far, for `kpng status`.
    repairs: Option<RepairStatus>,
    /// How long the next repair waits when someone else's changes keep coming.
    repair_backoff: RepairBackoff,
    /// When the wait for node IPs ends ([`Runner::with_node_ips_wait`]): set when the initial
    /// lists are complete, taken when it has ended.
    node_ips_deadline: Option<NodeIpsWait>,
    /// The node as last logged: each change of it is logged once, old → new; `None` before
    /// the initial lists (the first complete view is logged whole).
    logged_node: Option<kpng_model::NodeState>,
    /// The first sync was held for the Node's podCIDRs and that was logged.
    held_for_pod_cidrs: bool,
    /// The node's address changes not yet synced, net (the sync names them).
    addresses_changed: Option<AddressChange>,
    /// The node's status changed alone and the backend shows it
    /// ([`kpng_backend::Backend::shows_node_status`]): an empty sync soon.
    node_status_changed: bool,
    /// The node configuration problems last warned about: each is warned once, again only
    /// after it went away and came back.
    warned_node_config: Vec<String>,
    /// The node's kernel settings as last read and their problems ([`Runner::checking_host`]),
    /// each problem warned once, again only after it went away and came back.
    host_checked: Option<(String, Vec<crate::host_check::HostProblem>)>,
    /// The changes that failed syncs took and did not program: they stay pending (in `kpng
    /// status` and the pending gauges) until a sync succeeds, and its `changes=` names them,
    /// since that sync is what programs them. `None` when nothing failed, or when no sync
    /// succeeded yet (the retry's full diff then is every change).
    unsynced: Option<Diff>,
    /// The syncs failing now, if they are: the success that ends it logs that it is over.
    failing: Option<sync::Failing>,
}

/// The wait for node IPs ([`Runner::with_node_ips_wait`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NodeIpsWait {
    /// Ends at this time.
    Until(Instant),
    /// Has ended.
    Over,
}

impl<M: NodeModel> LoopState<M> {
    async fn run(
        &mut self,
        mut events: mpsc::Receiver<M::Input>,
        mut tampering: mpsc::UnboundedReceiver<Tampering>,
        mut address_changes: mpsc::UnboundedReceiver<AddressChange>,
        mut queries: Option<mpsc::Receiver<Query>>,
    ) {
        loop {
            let deadline = self.next_deadline(Instant::now());
            tokio::select! {
                biased;
                event = events.recv() => match event {
                    Some(event) => {
                        self.handle(event);
                        // Apply everything already queued before syncing once.
                        while let Ok(event) = events.try_recv() {
                            self.handle(event);
                        }
                        self.report_gate();
                    }
                    None => {
                        info!("source closed; leaving the data plane as it is");
                        return;
                    }
                },
                Some(t) = tampering.recv() => self.tampered(t),
                Some(c) = address_changes.recv() => self.addresses_changed(c),
                Some(q) = next_query(&mut queries) => self.answer(q),
                _ = sleep_until(self.node_ips_timer()) => self.stop_waiting_for_node_ips(),
                _ = sleep_until(deadline) => self.sync().await,
            }
        }
    }

    /// Answers a question from the admin socket from the current model.
    fn answer(&self, query: Query) {
        let snapshot = self.runner.model.snapshot();
        match query {
            Query::Status(query, reply) => {
                let (limit, offset) = (
                    query.limit.unwrap_or(usize::MAX),
                    query.offset.unwrap_or_default(),
                );
                let text = query.text_filter();
                // What an empty endpoint list means depends on the backend (HNS: no load
                // balancer, nothing answers; Linux: reject or drop).
                let traits = admin::facts_or_default(self.facts.as_ref(), snapshot).backend;
                let (mut services, mut matching) = (Vec::new(), 0);
                for (key, port) in &snapshot.ports {
                    let svc = &key.service;
                    if !query.wants_service(&svc.namespace, &svc.name, &key.port_name, port.port) {
                        continue;
                    }
                    // Without a text filter, ports outside the page are only counted.
                    let in_page = |matching: usize| matching >= offset && services.len() < limit;
                    if text.is_none() && !in_page(matching) {
                        matching += 1;
                        continue;
                    }
                    let mut status = PortStatus::of(port, self.runner.model.explain(key), &traits);
                    status.source_ranges_of_other_families_only =
                        self.runner.model.source_ranges_of_other_families_only(key);
                    status.note_slices_of_unserved_families(
                        &self.runner.model.slices_of_unserved_families(key),
                    );
                    if port.health_check_node_port.is_some()
                        && let Some((servers, _)) = &self.runner.service_health
                    {
                        status.health_check = servers.answer(svc, key.family);
                    }
                    if text.as_deref().is_none_or(|t| status.row_contains(t)) {
                        if in_page(matching) {
                            services.push(status);
                        }
                        matching += 1;
                    }
                }
                let not_programmed = if matching == 0 && query.service.is_some() {
                    self.runner
                        .model
                        .not_programmed(&|namespace, name| query.names_service(namespace, name))
                        .into_iter()
                        .map(|(key, why)| NotProgrammed {
                            service: key.to_string(),
                            why,
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                let unlisted = self.unlisted();
                let input = self.runner.input.as_ref().map(|h| h.state());
                // Where NodePorts are served, in words and as addresses; none where the
                // binary gave no node facts, or its sink serves no node port (no words).
                let node_facts = self
                    .facts
                    .as_ref()
                    .map(|f| f(snapshot))
                    .filter(|f| !f.node_ports_on.is_empty());
                let _ = reply.send(Status {
                    node: snapshot.node.name.clone(),
                    brain_view: None,
                    not_programmed,
                    backend: self.runner.backend.name().to_string(),
                    programmed: self.last_ok_at.is_some(),
                    generation: self.generation,
                    in_sync: self.in_sync(),
                    pending_port_changes: self.pending_port_changes(),
                    last_sync: self.last_sync_status.clone(),
                    last_successful_sync: self.last_ok_at.map(admin::rfc3339),
                    last_error: self.last_error.clone(),
                    recent_syncs: self.sync_history.iter().cloned().collect(),
                    services,
                    total_ports: snapshot.ports.len(),
                    matching_ports: matching,
                    rejected: self
                        .runner
                        .model
                        .rejected()
                        .iter()
                        .map(RejectedStatus::of)
                        .collect(),
                    dropped: self
                        .runner
                        .model
                        .dropped()
                        .iter()
                        .map(|(service, w)| DroppedStatus::of(service.as_ref(), w))
                        .collect(),
                    node_problem: if unlisted.is_empty() {
                        let mut problems: Vec<String> =
                            admin::node_problem(&snapshot.node, self.runner.node_needs)
                                .into_iter()
                                .collect();
                        problems.extend(self.runner.node_check.problems(
                            &snapshot.node,
                            &crate::node_config_check::node_port_families(snapshot),
                        ));
                        (!problems.is_empty()).then(|| problems.join("; "))
                    } else {
                        None
                    },
                    node_ips: snapshot.node.ips.iter().map(|ip| ip.to_string()).collect(),
                    pod_cidrs: snapshot
                        .node
                        .pod_cidrs
                        .iter()
                        .map(|c| c.to_string())
                        .collect(),
                    zone: snapshot.node.zone.clone(),
                    node_ports_on: node_facts.as_ref().map(|f| f.node_ports_on.clone()),
                    node_port_ips: node_facts.map(|f| f.nodeport_ips),
                    waiting_for: unlisted.iter().map(|k| k.as_str().into()).collect(),
                    repairs: self.repair_status(),
                    health_checks_not_served: self
                        .runner
                        .service_health
                        .as_ref()
                        .map(|(servers, _)| {
                            servers
                                .not_served()
                                .iter()
                                .map(HealthCheckStatus::of)
                                .collect()
                        })
                        .unwrap_or_default(),
                    conntrack: self.conntrack_status(),
                    previous_run: None,
                    data_plane: self.host_status().into_iter().collect(),
                    input: input.as_ref().map(InputStatus::of),
                    brain_reports: input.as_ref().and_then(|i| {
                        let report = i.brain_report.as_deref()?;
                        Some(BrainReportStatus {
                            from_earlier_connection: i.brain_report_from_earlier_connection,
                            ..BrainReportStatus::of(report, &snapshot.node.name)
                        })
                    }),
                    fed_by_brain: self.runner.model.fed_by_brain(),
                    earlier_rules_in_place: self.earlier_rules_in_place(),
                });
            }
            Query::Trace(q, reply) => {
                let facts = admin::facts_or_default(self.facts.as_ref(), snapshot);
                let not_proxied = self.runner.model.not_proxied(q.to.ip());
                let trace =
                    kpng_model::trace::trace_noting(snapshot, &facts, &q, not_proxied.as_ref());
                let rejected = trace
                    .service
                    .as_deref()
                    .and_then(|matched| self.rejected_service(matched));
                let health_check_not_served = trace
                    .service
                    .as_deref()
                    .and_then(|matched| self.health_check_not_served(matched));
                let input_problem = self
                    .runner
                    .input
                    .as_ref()
                    .and_then(|h| InputStatus::of(&h.state()).stale_note());
                let brain_explains = if self.runner.model.fed_by_brain() {
                    admin::brain_explains(snapshot, &trace, &q)
                } else {
                    None
                };
                let source_ranges_of_other_families_only =
                    admin::matched_port(snapshot, &trace, &q)
                        .filter(|_| {
                            trace.frontend == Some(kpng_model::trace::Frontend::LoadBalancer)
                        })
                        .map(|key| self.runner.model.source_ranges_of_other_families_only(key))
                        .unwrap_or_default();
                let _ = reply.send(TraceAnswer {
                    source_ranges_of_other_families_only,
                    // The admin handle's, added after the loop answered.
                    other_chains: Vec::new(),
                    brain_explains,
                    trace,
                    generation: self.generation,
                    in_sync: self.in_sync(),
                    rejected,
                    health_check_not_served,
                    first_sync_held: self.first_sync_held(),
                    input_problem,
                    earlier_rules_in_place: self.earlier_rules_in_place(),
                    programs_nothing: self.runner.programs_nothing.clone(),
                });
            }
        }
    }

    /// The conntrack table's usage, for a runner that cleans it (a backend that programs a
    /// Linux node); read when asked, never on the sync path.
    fn conntrack_status(&self) -> Option<ConntrackStatus> {
        #[cfg(target_os = "linux")]
        if self.runner.conntrack.is_some() {
            return kpng_conntrack::table_usage().map(|u| ConntrackStatus {
                entries: u.entries as u64,
                max: u.max as u64,
                max_read_only: !u.max_writable,
            });
        }
        None
    }

    /// The health check of the Service of a traced port, when this node does not serve it:
    /// load balancers then send that Service's traffic elsewhere, whatever the rules say.
    fn health_check_not_served(&self, port: &str) -> Option<HealthCheckStatus> {
        let (namespace, name) = service_of(port)?;
        let (servers, _) = self.runner.service_health.as_ref()?;
        servers
            .not_served_for(&ServiceKey::new(namespace, name))
            .as_ref()
            .map(HealthCheckStatus::of)
    }

    /// The rejection of the Service of a traced port (`namespace/name:port`), if its latest
    /// version is rejected: by this kpng's own input, or on a node fed by a brain, as the
    /// brain reports it.
    fn rejected_service(&self, port: &str) -> Option<RejectedStatus> {
        let (namespace, name) = service_of(port)?;
        let own = self
            .runner
            .model
            .rejected()
            .iter()
            .find(|r| {
                let o = &r.error.object;
                o.kind == Kind::Service && *o.namespace == *namespace && *o.name == *name
            })
            .map(RejectedStatus::of);
        own.or_else(|| {
            let state = self.runner.input.as_ref()?.state();
            let report = state.brain_report.as_deref()?;
            report
                .rejected
                .iter()
                .find(|r| r.kind == "Service" && r.namespace == namespace && r.name == name)
                .map(RejectedStatus::of_reported)
        })
    }

    /// Whether rules an earlier run left are still in place and serving: only before the
    /// first successful sync, and only when the backend found its table at start. A first
    /// sync that failed did not replace them (the retry is still the sync that adopts them:
    /// until 2026-12-07 it read as a plain full sync, "N added", and the status and traces
    /// stopped saying the earlier rules route traffic).
    fn earlier_rules_in_place(&self) -> bool {
        self.last_ok_at.is_none() && self.runner.earlier_rules_found
    }

    /// The Service port changes not programmed yet: those waiting for a sync, those failed
    /// syncs took (counted once), and every port while no sync succeeded after a failure.
    fn pending_port_changes(&self) -> usize {
        if self.last_ok_at.is_none() && self.failing.is_some() {
            return self.runner.model.snapshot().ports.len();
        }
        match &self.unsynced {
            Some(unsynced) => {
                let new = self
                    .pending
                    .changes
                    .keys()
                    .filter(|k| !unsynced.changes.contains_key(*k))
                    .count();
                unsynced.changes.len() + new
            }
            None => self.pending.changes.len(),
        }
    }

    /// Whether the data plane holds exactly the model: synced at least once, nothing waiting,
    /// no failure since.
    fn in_sync(&self) -> bool {
        self.last_ok_at.is_some()
            && self.pending.is_empty()
            && !self.need_full
            && self.last_error.is_none()
    }

    /// The node gained or lost an address: an empty sync soon (as a change's, after
    /// `min_sync_period`), at which the backends and the health checks read the addresses
    /// again, as at a periodic one.
    fn addresses_changed(&mut self, change: AddressChange) {
        if let Some(host) = &mut self.runner.node_check.host_addresses {
            host.retain(|a| !change.removed.contains(a));
            host.extend(change.added.iter().copied());
            self.warn_node_config();
        }
        // With CIDR `--nodeport-addresses`, an address of a family they restrict and outside
        // them matters to nothing: no line saying something follows, and no sync.
        let cidrs = &self.runner.node_check.node_port_cidrs;
        let Some(change) = crate::address_change::outside_cidrs(change, cidrs, |outside| {
            debug!(
                "the node's addresses changed ({outside}), outside --nodeport-addresses: \
                 nothing depends on them"
            )
        }) else {
            return;
        };
        info!(
            "the node's addresses changed ({change}): node ports and health checks that \
             depend on them follow at the next sync"
        );
        // Several changes before one sync: the sync names their net effect.
        self.addresses_changed = match self.addresses_changed.take() {
            Some(earlier) => earlier.then(change),
            None => Some(change),
        };
    }

    /// Someone else changed the data plane: a full sync soon, whatever `min_sync_period` (a
    /// burst of reports schedules one sync, [`TAMPER_DEBOUNCE`] after the first).
    fn tampered(&mut self, t: Tampering) {
        let backend = BackendLabel {
            backend: self.runner.backend.name().to_string(),
        };
        self.runner
            .metrics
            .tampering_detected
            .get_or_create(&backend)
            .inc();
        self.need_full = true;
        if self.last_sync.is_none() {
            // Nothing programmed yet: the first sync is a full one anyway.
            return;
        }
        // The data plane no longer holds the model: a change waiting for its sync, for
        // `/healthz` (which fails if the repair does not succeed within the health timeout).
        let now_wall = SystemTime::now();
        for family in &self.families {
            self.runner.health.queued(*family, now_wall);
        }
        if self.repair_for.is_some() {
            // Its repair is scheduled already (perhaps delayed: not brought forward).
            debug!(backend = %backend.backend, "changed by someone else ({}); repair already scheduled", t.what);
            return;
        }
        self.repair_for = Some(t.what.clone());
        self.repair_since = Some(now_wall);
        let now = Instant::now();
        let delay = self.backoff_changed(now, &t.what);
        // The rules may be gone now: what the conntrack cleanup checked is forgotten at once
        // (in its memory file too), not at the repair, so that a crash meanwhile cannot
        // leave it remembered.
        #[cfg(target_os = "linux")]
        if let Some(conntrack) = &mut self.runner.conntrack {
            conntrack.rules_were_missing();
        }
        let at = now + TAMPER_DEBOUNCE + delay;
        if self.retry_at.is_none_or(|r| r > at) {
            if delay.is_zero() {
                warn!(backend = %backend.backend, "changed by someone else ({}); repairing with a full sync", t.what);
            } else {
                // Said once, when the backoff started; `kpng status` shows it meanwhile.
                debug!(backend = %backend.backend, "changed by someone else ({}); repairing in {delay:?}", t.what);
            }
            self.retry_at = Some(at);
        } else {
            debug!(backend = %backend.backend, "changed by someone else ({}); repair already scheduled", t.what);
        }
    }

    /// Feeds a change by someone else that asks for a repair to the backoff: returns how long
    /// the repair waits, and warns once when the backoff starts.
    fn backoff_changed(&mut self, now: Instant, what: &str) -> Duration {
        self.end_backoff_if_quiet(now);
        let decision = self.repair_backoff.changed(now);
        if decision.started {
            warn!(
                backend = %self.runner.backend.name(),
                "{}; repairs now wait {:?}, doubling up to {:?}, until none comes for {:?}",
                repeated_changes(self.repair_backoff.in_window(), what),
                decision.delay,
                self.repair_backoff.cap(),
                crate::repair_backoff::quiet(self.repair_backoff.cap()),
            );
        }
        self.set_repair_delay_gauge(now);
        decision.delay
    }

    /// Ends the repairs' backoff once nobody changed the data plane for a while, and says so.
    fn end_backoff_if_quiet(&mut self, now: Instant) {
        if let Some(changes) = self.repair_backoff.end_if_quiet(now) {
            info!(
                backend = %self.runner.backend.name(),
                "no change by someone else for {:?}: repairs are made at once again ({changes} \
                 changes by someone else while they were delayed)",
                crate::repair_backoff::quiet(self.repair_backoff.cap())
            );
        }
        self.set_repair_delay_gauge(now);
    }

    /// `kpng_repair_delay_seconds`: how long repairs wait now.
    fn set_repair_delay_gauge(&self, now: Instant) {
        let label = BackendLabel {
            backend: self.runner.backend.name().to_string(),
        };
        self.runner
            .metrics
            .repair_delay
            .get_or_create(&label)
            .set(self.repair_backoff.current_delay(now).as_secs_f64());
    }

    /// The repairs for `kpng status`, with the backoff as their problem while it lasts.
    fn repair_status(&self) -> Option<RepairStatus> {
        let now = Instant::now();
        let unrepaired = self.unrepaired(now, SystemTime::now());
        let Some((changes, over)) = self.repair_backoff.during(now) else {
            return match unrepaired {
                Some(line) => {
                    let mut status = self.repairs.clone().unwrap_or_default();
                    status.unrepaired = Some(line);
                    Some(status)
                }
                None => self.repairs.clone(),
            };
        };
        let mut status = self.repairs.clone().unwrap_or_default();
        status.unrepaired = unrepaired;
        status.problem = Some(format!(
            "{}; repairs are delayed (the last by {:?}, at most {:?}) until none comes for {:?}",
            repeated_changes_over(changes, over, &status.last_change),
            self.repair_backoff.current_delay(now),
            self.repair_backoff.cap(),
            crate::repair_backoff::quiet(self.repair_backoff.cap()),
        ));
        Some(status)
    }

    /// While a change by someone else waits for its repair: what, since when, and when the
    /// repair is due, for `kpng status` (which otherwise showed the last sync "ok" and no
    /// pending change while the node served no Service).
    fn unrepaired(&self, now: Instant, wall: SystemTime) -> Option<String> {
        let what = self.repair_for.as_deref()?;
        let since = self.repair_since?;
        let due = self
            .retry_at
            .map(|at| wall + at.saturating_duration_since(now));
        Some(unrepaired_line(what, since, due))
    }

    fn ready(&self) -> bool {
        self.listed_all() && !self.held_for_pod_cidrs()
    }

    /// Whether every required kind has been listed once.
    fn listed_all(&self) -> bool {
        REQUIRED_KINDS.iter().all(|k| self.listed.contains(k))
    }

    /// Tells `/healthz` whether the node may receive load-balancer traffic: the Node's own
    /// eligibility, and not while the first sync is held for its podCIDRs (nothing is
    /// programmed; kube-proxy serves no health check before it has them).
    ///
    /// As kube-proxy's, the node counts as eligible while starting, until the Node list says
    /// otherwise (kube-proxy's health server starts eligible and only a Node event changes
    /// that): `/healthz` did answer 503 (`nodeEligible: false`) while a Node that exists was
    /// still being listed.
    fn update_eligibility(&self) {
        let node = &self.runner.model.snapshot().node;
        let starting = !node.known && !self.listed.contains(&Kind::Node);
        let eligible = (node.eligible() || starting) && !self.held_for_pod_cidrs();
        self.runner.health.set_node_eligible(eligible);
    }

    /// Whether the first sync waits for the Node's podCIDRs ([`Runner::requiring_pod_cidrs`]).
    fn held_for_pod_cidrs(&self) -> bool {
        self.runner.node_needs.pod_cidrs
            && self.last_sync.is_none()
            && self.runner.model.snapshot().node.pod_cidrs.is_empty()
    }

    /// Why the first sync has not been made, while it is held: for `kpng trace`, whose answer
    /// otherwise reads as if its rules were in the kernel.
    fn first_sync_held(&self) -> Option<String> {
        let node = &self.runner.model.snapshot().node.name;
        let note = first_sync_held_note(
            &self.unlisted(),
            self.runner.model.fed_by_brain(),
            self.held_for_pod_cidrs().then_some(node.as_str()),
        )?;
        Some(if self.earlier_rules_in_place() {
            earlier_rules_note(&note)
        } else {
            note
        })
    }

    /// When the wait for node IPs ends, while it runs.
    fn node_ips_timer(&self) -> Option<Instant> {
        match self.node_ips_deadline {
            Some(NodeIpsWait::Until(at)) => Some(at),
            _ => None,
        }
    }

    /// The wait for node IPs has ended: with none known, NodePorts go to every local address.
    fn stop_waiting_for_node_ips(&mut self) {
        self.node_ips_deadline = Some(NodeIpsWait::Over);
        let diff = self.runner.model.give_up_waiting_for_node_ips();
        let node = &self.runner.model.snapshot().node;
        if node.nodeports_on_all_local {
            warn!(
                "no node IP known {}s after the initial lists (no Node named {:?} with an \
                 InternalIP or ExternalIP, and no --node-ip): serving NodePorts on every local \
                 address, as kube-proxy does; on the node IPs once they are known",
                self.runner
                    .node_needs
                    .primary_node_ports
                    .unwrap_or_default()
                    .as_secs(),
                node.name
            );
        }
        self.take_diff(diff);
    }

    /// Logs what changed in the node since it was last logged, one line per change.
    fn log_node_changes(&mut self) {
        if !self.listed_all() {
            return;
        }
        let now = &self.runner.model.snapshot().node;
        match &self.logged_node {
            None => info!("{}", describe_node(now)),
            Some(was) => {
                for line in node_changes(was, now) {
                    info!("{line}");
                }
            }
        }
        self.logged_node = Some(now.clone());
        self.warn_node_config();
    }

    /// Warns of each node configuration problem new since the last call (see
    /// [`Runner::checking_node_config`]); `kpng status` shows them for as long as they last.
    fn warn_node_config(&mut self) {
        if !self.listed_all() {
            return;
        }
        let problems = self.runner.node_check.problems_to_warn(
            &self.runner.model.snapshot().node,
            &crate::node_config_check::node_port_families(self.runner.model.snapshot()),
        );
        for p in problems
            .iter()
            .filter(|p| !self.warned_node_config.contains(p))
        {
            warn!("{p}");
        }
        self.warned_node_config = problems;
    }

    /// Reads the node's kernel settings ([`Runner::checking_host`]) for the families that have
    /// Services, warns of each problem new since the last reading, and says when one is gone.
    fn check_host(&mut self) {
        let Some((probe, needs)) = &self.runner.host_check else {
            return;
        };
        let facts = probe();
        let snapshot = self.runner.model.snapshot();
        let families: Vec<Family> = self
            .families
            .iter()
            .copied()
            .filter(|f| snapshot.family(*f).next().is_some())
            .collect();
        // Which bridges carry pods: only when bridge netfilter may be off (the bridges'
        // addresses were read), the endpoints walked once for the whole check.
        let pod_bridges = if !facts.bridges_with_ports.is_empty()
            && crate::host_check::bridge_netfilter_may_be_off(
                facts.br_netfilter_loaded,
                &facts.bridge_nf_call,
                &families,
            ) {
            let mut cidrs = self.runner.node_check.cluster_cidrs.clone();
            cidrs.extend(snapshot.node.pod_cidrs.iter().copied());
            let endpoints: std::collections::BTreeSet<std::net::IpAddr> = snapshot
                .ports
                .values()
                .flat_map(|p| p.cluster_endpoints.iter().chain(&p.local_endpoints))
                .map(|e| e.ip)
                .collect();
            let endpoints: Vec<std::net::IpAddr> = endpoints.into_iter().collect();
            crate::host_check::pod_bridges(&facts, &cidrs, &endpoints)
        } else {
            Vec::new()
        };
        let problems = crate::host_check::problems(&facts, *needs, &families, &pod_bridges);
        for check in crate::host_check::checks(*needs) {
            let count = problems.iter().filter(|p| p.check == check).count();
            self.runner
                .metrics
                .node_check_problems
                .get_or_create(&crate::metrics::CheckLabel {
                    check: check.into(),
                })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        let before = self.host_checked.take().map(|(_, p)| p).unwrap_or_default();
        for p in &problems {
            if !before.iter().any(|b| b.key == p.key) {
                warn!("node check: {}", p.message);
            }
        }
        for b in &before {
            if !problems.iter().any(|p| p.key == b.key) {
                info!("node check: fixed now ({})", b.key);
            }
        }
        let state = crate::host_check::describe(&facts, &families, &pod_bridges);
        self.host_checked = Some((state, problems));
    }

    /// The `node checks` line of `kpng status`, once the settings were read.
    fn host_status(&self) -> Option<DataPlaneDetail> {
        let (state, problems) = self.host_checked.as_ref()?;
        Some(DataPlaneDetail {
            what: "node checks".into(),
            state: state.clone(),
            problem: (!problems.is_empty()).then(|| {
                problems
                    .iter()
                    .map(|p| p.message.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            }),
        })
    }

    /// The kinds whose first complete list has not arrived (the first sync waits for them).
    fn unlisted(&self) -> Vec<Kind> {
        if self.last_sync.is_some() {
            return Vec::new();
        }
        REQUIRED_KINDS
            .into_iter()
            .filter(|k| !self.listed.contains(k))
            .collect()
    }

    /// Says, once per change, which lists the first sync still waits for: after the inputs
    /// that are queued have been applied, so the line also tells tests that kpng decided not
    /// to sync yet.
    fn report_gate(&mut self) {
        if self.last_sync.is_some() {
            return;
        }
        if self.listed_all() && self.held_for_pod_cidrs() && !self.held_for_pod_cidrs {
            warn!(
                "--detect-local-mode NodeCIDR and Node {:?} has no spec.podCIDRs: holding the \
                 first sync until it has (kube-proxy waits for them too); nothing is programmed \
                 meanwhile",
                self.runner.model.snapshot().node.name
            );
            self.held_for_pod_cidrs = true;
            self.update_eligibility();
        }
        let missing = self.unlisted();
        if missing != self.reported_missing && !missing.is_empty() {
            let names: Vec<&str> = missing.iter().map(|k| k.as_str()).collect();
            info!(
                "holding the first sync until these lists are complete: {}",
                names.join(", ")
            );
        } else if !missing.is_empty() && self.loading_report_at.elapsed() >= LOADING_PROGRESS_EVERY
        {
            // A large cluster takes a while to list: say how far along it is.
            let names: Vec<&str> = missing.iter().map(|k| k.as_str()).collect();
            info!(
                "still loading: {} Service ports so far; waiting for the complete lists of {}",
                self.runner.model.snapshot().ports.len(),
                names.join(", ")
            );
        }
        if self.loading_report_at.elapsed() >= LOADING_PROGRESS_EVERY {
            self.loading_report_at = Instant::now();
        }
        self.reported_missing = missing;
    }

    fn next_deadline(&self, now: Instant) -> Option<Instant> {
        if !self.ready() {
            return None;
        }
        if let Some(at) = self.retry_at {
            return Some(at);
        }
        let Some(last) = self.last_sync else {
            return Some(now);
        };
        if self.need_full
            || !self.pending.is_empty()
            || self.addresses_changed.is_some()
            || self.node_status_changed
        {
            return Some(
                self.last_write
                    .map_or(now, |w| (w + self.runner.timing.min_sync_period).max(now)),
            );
        }
        let periodic = last + self.runner.timing.sync_period;
        let full = self
            .last_full
            .filter(|_| !self.runner.timing.full_sync_period.is_zero())
            .map(|t| t + self.runner.timing.full_sync_period);
        Some(full.map_or(periodic, |f| f.min(periodic)))
    }

    /// Counts what one input carries in kube-proxy's and kpng's input metrics.
    fn count_seen(&self, info: &InputInfo) {
        let m = &self.runner.metrics;
        for kind in &info.objects {
            m.objects_seen
                .get_or_create(&KindLabel {
                    kind: kind.as_str().into(),
                })
                .inc();
        }
        m.service_changes_total.inc_by(info.service_changes);
        m.endpoint_changes_total.inc_by(info.endpoint_changes);
    }

    fn handle(&mut self, input: M::Input) {
        let info = M::describe(&input);
        self.count_seen(&info);
        let outcome = self.runner.model.apply(input);
        let m = &self.runner.metrics;
        for w in &outcome.warnings {
            // The object and field as fields, as rejection lines carry them: a JSON log is
            // searched by them, not by the message.
            let (kind, namespace, name, field) = (
                w.object.kind.as_str(),
                &*w.object.namespace,
                &*w.object.name,
                w.field.as_str(),
            );
            if self.warnings.admit() {
                warn!(kind, namespace, name, field, "{w}");
            } else {
                debug!(kind, namespace, name, field, "{w}");
            }
        }
        // On a node fed by a brain, the brain rejects the objects: its count, as it reports it
        // to this node (other nodes' Node objects left out), so the alert on this gauge works
        // per node in split mode too.
        let (brain_rejected, brain_dropped) = self
            .runner
            .input
            .as_ref()
            .and_then(|h| h.state().brain_report)
            .map_or((0, 0), |r| {
                let report =
                    admin::BrainReportStatus::of(&r, &self.runner.model.snapshot().node.name);
                (report.rejected_total, report.dropped_total)
            });
        let rejected_count = self.runner.model.rejected_count();
        m.rejected_objects
            .set(i64::try_from(rejected_count as u64 + brain_rejected).unwrap_or(i64::MAX));
        // The same for values dropped from objects in use (a node port another Service holds):
        // only a warning and `kpng status` said so.
        let dropped_count = self.runner.model.dropped().len() as u64;
        m.dropped_values
            .set(i64::try_from(dropped_count + brain_dropped).unwrap_or(i64::MAX));
        let now = SystemTime::now();
        for ended in &outcome.accepted_again {
            self.rejections.accepted_again(ended, now);
        }
        for e in &outcome.errors {
            self.rejections.rejected(e, now);
            m.object_errors
                .get_or_create(&KindLabel {
                    kind: e.error.object.kind.as_str().into(),
                })
                .inc();
        }
        if self.rejections.len() > rejected_count {
            // Some went without a usable version (deleted, or gone from a list).
            let still = self
                .runner
                .model
                .rejected()
                .into_iter()
                .map(|r| r.error.object);
            self.rejections.keep_only(&still.collect());
        }
        for (kind, count) in outcome.applied.iter() {
            let label = KindLabel {
                kind: kind.as_str().into(),
            };
            m.objects_applied.get_or_create(&label).inc_by(count as u64);
        }
        if info.changes_from_outcome {
            m.service_changes_total
                .inc_by(outcome.services_changed.len() as u64);
            m.endpoint_changes_total
                .inc_by(outcome.slices_changed as u64);
        }
        let was_listed = self.listed_all();
        let node_was_listed = self.listed.contains(&Kind::Node);
        self.listed.extend(outcome.listed.iter().copied());
        if !node_was_listed && self.listed.contains(&Kind::Node) {
            // The start-up's eligibility ends: the Node list says whether the Node exists.
            self.update_eligibility();
        }
        self.pending_services.extend(outcome.services_changed);
        self.pending_endpoints += outcome.slices_changed as i64;
        let m = &self.runner.metrics;
        m.service_changes_pending
            .set(self.pending_services.len() as i64);
        m.endpoint_changes_pending.set(self.pending_endpoints);
        let started = self.started;
        self.pending_triggers
            .extend(outcome.trigger_times.into_iter().filter(|t| t.at > started));
        if !was_listed && self.listed_all() {
            if let Some(wait) = self.runner.node_needs.primary_node_ports {
                self.node_ips_deadline = Some(NodeIpsWait::Until(Instant::now() + wait));
            }
            self.log_node_changes();
        }
        if outcome.node_status_changed {
            // Nothing to program (the diff says nothing of it): /healthz and the log, and a
            // sink that shows the status (`to-file`'s `node:` block) at an empty sync.
            self.node_view_changed();
            // (Before the first sync there is nothing to update: it shows the status anyway.)
            self.node_status_changed |=
                self.last_sync.is_some() && self.runner.backend.shows_node_status();
        }
        self.take_diff(outcome.diff);
    }

    /// The node's view changed: `/healthz` follows its eligibility, and the log says what
    /// changed, once per change.
    fn node_view_changed(&mut self) {
        self.update_eligibility();
        self.log_node_changes();
    }

    /// Queues a diff of the model for the next sync.
    fn take_diff(&mut self, diff: Diff) {
        if diff.is_empty() {
            return;
        }
        if diff.node_changed {
            self.node_view_changed();
        }
        let m = &self.runner.metrics;
        let now = SystemTime::now();
        let touched: BTreeSet<Family> = if diff.node_changed {
            self.families.iter().copied().collect()
        } else {
            diff.changes.keys().map(|k| k.family).collect()
        };
        for family in touched.into_iter().filter(|f| self.families.contains(f)) {
            self.runner.health.queued(family, now);
            m.last_queued_timestamp
                .get_or_create(&family.into())
                .set(unix_seconds(now));
        }
        self.pending.merge(diff);
    }

    /// Health-check servers after a sync. A full sync, a change of the node (its IPs may be
    /// the servers' addresses) or a move of the addresses they listen on reconciles every
    /// Service; otherwise only the Services the diff touched are looked at: walking every
    /// port after each change cost more than the change. With CIDR `--nodeport-addresses`,
    /// the node's addresses are read again when the backends read them (full, node and
    /// periodic syncs), so that the checks follow an address added or removed.
    async fn sync_service_health(&mut self, diff: &Diff, full: bool) {
        let snapshot = self.runner.model.snapshot();
        let Some((servers, listen)) = &mut self.runner.service_health else {
            return;
        };
        if listen.serves_nothing(&snapshot.node) {
            // The NodePorts are not served: neither are their health checks.
            servers.sync(&BTreeMap::new(), &[]).await;
            return;
        }
        let reread = full || diff.node_changed || diff.is_empty();
        let (addresses, moved) = listen.at_sync(&self.families, &snapshot.node.ips, reread);
        if full || diff.node_changed || moved {
            servers
                .sync(&wanted(snapshot, &self.families), &addresses)
                .await;
        } else {
            let mut changes = BTreeMap::new();
            for key in diff.changes.keys() {
                if !changes.contains_key(&key.service) {
                    let check = wanted_for(snapshot, &key.service, &self.families);
                    changes.insert(key.service.clone(), check);
                }
            }
            servers.update(changes, &addresses).await;
        }
        // A family listening nowhere, once a check needs it (the checks are walked only then).
        listen.warn_unserved(|| servers.families_in_use());
    }

    fn record_model_gauges(&self) {
        let m = &self.runner.metrics;
        for family in &self.families {
            let c = self.model_counts.get(family).copied().unwrap_or_default();
            m.model_service_ports
                .get_or_create(&(*family).into())
                .set(c.ports);
            m.model_endpoints
                .get_or_create(&(*family).into())
                .set(c.endpoints);
            for (policy, n) in [("internal", c.internal), ("external", c.external)] {
                let label = NoLocalLabel {
                    traffic_policy: policy.into(),
                    ip_family: family.label().into(),
                };
                m.no_local_endpoints.get_or_create(&label).set(n);
            }
        }
    }
}

/// Counts the model gauges over every Service port of `families`.
fn count_model(
    snapshot: &kpng_model::Snapshot,
    families: &[Family],
) -> BTreeMap<Family, ModelCounts> {
    let mut counts = BTreeMap::new();
    for family in families {
        let mut c = ModelCounts::default();
        for sp in snapshot.family(*family) {
            c.add(sp, 1);
        }
        counts.insert(*family, c);
    }
    counts
}

/// Moves the model gauges' counts by what `diff` changed since the last sync.
fn count_changes(counts: &mut BTreeMap<Family, ModelCounts>, diff: &Diff) {
    for (key, change) in &diff.changes {
        let c = counts.entry(key.family).or_default();
        if let Some(old) = &change.old {
            c.add(old, -1);
        }
        if let Some(new) = &change.new {
            c.add(new, 1);
        }
    }
}

/// What the model gauges count in one family: Service ports, their serving endpoints, and
/// the ports of each traffic policy Local that have endpoints but none on this node
/// (`kubeproxy_sync_proxy_rules_no_local_endpoints_total`).
#[derive(Debug, Clone, Copy, Default)]
struct ModelCounts {
    ports: i64,
    endpoints: i64,
    internal: i64,
    external: i64,
}

impl ModelCounts {
    /// Counts `sp` `n` times (-1 takes it away).
    fn add(&mut self, sp: &kpng_model::ServicePort, n: i64) {
        self.ports += n;
        self.endpoints += n * i64::try_from(sp.serving_endpoints.len()).unwrap_or(i64::MAX);
        let no_local = sp.has_any_endpoints && sp.local_endpoints.is_empty();
        if sp.internal_policy_local && no_local {
            self.internal += n;
        }
        if sp.external_policy_local && sp.externally_accessible() && no_local {
            self.external += n;
        }
    }
}

/// How often the loading progress is reported before the first sync.
const LOADING_PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// A first sync of at least this many Service ports is announced before it starts (it may
/// take a second or more).
const LARGE_FIRST_SYNC: usize = 5000;

/// The next admin question; pending forever without an admin handle.
async fn next_query(queries: &mut Option<mpsc::Receiver<Query>>) -> Option<Query> {
    match queries {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Waits for the next sync's deadline. A deadline already due returns at once: a timer, even
/// one for "now", fires on the timer wheel's next millisecond tick, which would add 1-2 ms to
/// every change (half of the "file event → programmed" budget).
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) if at <= Instant::now() => {}
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// The note of a trace made while the first sync is held (`firstSyncHeld`): that nothing is
/// programmed yet, what the sync waits for (`missing` lists, or the brain's first state on a
/// brain-fed node; else the podCIDRs of Node `pod_cidrs_of`), and that the answer is from
/// what kpng knows now.
///
/// Why not "this is what kpng will program": the verdict may depend on what is missing. In
/// NodeCIDR mode without podCIDRs no client counts as local (`masquerade: no`), which the
/// podCIDRs, once they arrive, can turn into `masquerade: yes`.
pub(crate) fn first_sync_held_note(
    missing: &[Kind],
    fed_by_brain: bool,
    pod_cidrs_of: Option<&str>,
) -> Option<String> {
    let (waits_for, when) = if !missing.is_empty() && fed_by_brain {
        ("the brain's first state arrives".to_string(), "it does")
    } else if !missing.is_empty() {
        let names: Vec<&str> = missing.iter().map(|k| k.as_str()).collect();
        (
            format!("the lists of {} are complete", names.join(", ")),
            "they are",
        )
    } else {
        let node = pod_cidrs_of?;
        (
            format!(
                "Node {node:?} has spec.podCIDRs (--detect-local-mode NodeCIDR; kube-proxy \
                 waits for them too)"
            ),
            "they arrive (which clients are local to this node, hence masqueraded, follows \
             them)",
        )
    };
    Some(format!(
        "nothing is programmed yet: the first sync is held until {waits_for}; this answer is \
         from what kpng knows now and may change when {when}"
    ))
}

/// [`first_sync_held_note`] when the rules an earlier run of kpng left are still in place:
/// packets meet those, as they were, not "nothing".
pub(crate) fn earlier_rules_note(note: &str) -> String {
    let rest = note
        .strip_prefix("nothing is programmed yet: ")
        .unwrap_or(note);
    format!(
        "kpng has programmed nothing yet, but the rules an earlier run of kpng left are still in \
         place and route traffic as they did (this answer does not show them): {rest}"
    )
}

mod sync;
#[cfg(test)]
mod tests;

/// The namespace and name of a traced port (`namespace/name:port`).
fn service_of(port: &str) -> Option<(&str, &str)> {
    let service = port.rsplit_once(':').map_or(port, |(s, _)| s);
    service.split_once('/')
}

/// The history's text for the first sync after the backend adopted an earlier run's rules:
/// what the data plane holds now, since what the earlier rules held is not known here (the
/// model started empty, so its diff says nothing true about them). `failed`: the attempts
/// that failed before it (a retry still adopts the earlier rules).
fn adoption_changes(snapshot: &kpng_model::Snapshot, failed: u32) -> String {
    // The backend only tells whether earlier rules were there, not what they held: say that,
    // rather than "any other Service's were removed", which reads as if some were.
    let services: BTreeSet<&ServiceKey> = snapshot.ports.keys().map(|k| &k.service).collect();
    let now = if services.is_empty() {
        "they now hold no Service port".to_string()
    } else {
        let plural = |n: usize, noun: &str| {
            if n == 1 {
                format!("1 {noun}")
            } else {
                format!("{n} {noun}s")
            }
        };
        format!(
            "they now hold {} of {} and no other Service's",
            plural(snapshot.ports.len(), "Service port"),
            plural(services.len(), "Service")
        )
    };
    let retry = match failed {
        0 => String::new(),
        1 => " (a retry: the first attempt failed)".to_string(),
        n => format!(" (a retry: the {n} attempts before it failed)"),
    };
    format!(
        "first sync after adopting the rules an earlier kpng left{retry}: {now} (how many \
         Services the earlier rules held is not known: they were adopted without being read)"
    )
}

/// The history's text for a repairing sync: what was repaired, then the Service changes it
/// carried (alone they would read "no Service port changed").
/// The warning's account of changes by someone else that keep coming: how often, and who
/// usually makes them.
fn repeated_changes(in_window: usize, last: &str) -> String {
    format!(
        "someone else changed kpng's rules {in_window} times within {}s (the last: {last}){}",
        crate::repair_backoff::WINDOW.as_secs(),
        LIKELY_CAUSES
    )
}

/// [`repeated_changes`] for `kpng status`: since the backoff started.
fn repeated_changes_over(changes: u64, over: Duration, last: &str) -> String {
    format!(
        "someone else changed kpng's rules {changes} times in the last {}s (the last: {last}){}",
        over.as_secs().max(1),
        LIKELY_CAUSES
    )
}

/// Who undoes kpng's rules in a loop, as seen so far.
const LIKELY_CAUSES: &str = ": something keeps removing them, usually another program \
     flushing the ruleset or restoring the table (firewalld or ufw reloading, iptables-restore, \
     nft -f of a file with `flush ruleset`, a cron job) or a second kpng or kube-proxy on this node";

/// `kpng status`'s line for a change by someone else not repaired yet: `what` (`ip kpng: table
/// deleted`) reported at `since`, its repair due at `due` (`None`: at the next sync).
fn unrepaired_line(what: &str, since: SystemTime, due: Option<SystemTime>) -> String {
    let due = due.map_or_else(
        || "at the next sync".to_string(),
        |d| format!("at {}", admin::rfc3339(d)),
    );
    format!(
        "{what} (reported at {}): not repaired yet, repair due {due}; until then Services whose \
         rules it removed are not served on this node",
        admin::rfc3339(since)
    )
}

fn repair_changes(what: &str, summary: &DiffSummary) -> String {
    format!("repair after a change by someone else ({what}); {summary}")
}

/// The Services a diff touches (`namespace/name`, each once, sorted), for the debug log; empty
/// unless debug logging is on, so the INFO path never walks a large diff twice.
fn changed_services(diff: &Diff) -> Vec<String> {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return Vec::new();
    }
    let names: BTreeSet<String> = diff.changes.keys().map(|k| k.service.to_string()).collect();
    names.into_iter().collect()
}

/// The node's values, for the first log line about it.
fn describe_node(node: &kpng_model::NodeState) -> String {
    if !node.known {
        return format!("no Node named {:?} in the cluster", node.name);
    }
    format!(
        "Node {:?}: node IPs {}, pod CIDRs {}, zone {}",
        node.name,
        list(&node.ips),
        list(&node.pod_cidrs),
        node.zone.as_deref().unwrap_or("none")
    )
}

/// The lines about a change between two views of the node: one line for the Node's deletion,
/// appearance or re-creation, with everything it changed on that line; otherwise one line
/// per change, old → new (the sync line only says "node … changed").
fn node_changes(was: &kpng_model::NodeState, now: &kpng_model::NodeState) -> Vec<String> {
    let name = &now.name;
    if was.known && !now.known {
        // The zone is kept too (`NodeMemory`): topology hints keep applying.
        let zone = match &now.zone {
            _ if was.zone != now.zone => {
                format!("; zone {}", change(&zone_name(was), &zone_name(now)))
            }
            Some(zone) => format!("; keeping zone {zone} (topology hints still apply)"),
            None => String::new(),
        };
        return vec![format!(
            "Node {name:?} was deleted; keeping node IPs {} and pod CIDRs {} (as kube-proxy \
             keeps its start-up ones){zone}",
            list(&now.ips),
            list(&now.pod_cidrs)
        )];
    }
    if !was.known && now.known {
        return vec![node_arrival(was, now)];
    }
    let mut lines = Vec::new();
    if now.known && now.deleting && !was.deleting {
        lines.push(format!(
            "Node {name:?} is being deleted; keeping node IPs {} (/healthz answers 503)",
            list(&now.ips)
        ));
    }
    if now.known && was.known && was.deleting && !now.deleting {
        lines.push(format!(
            "Node {name:?} is no longer being deleted (its deletion timestamp is gone)"
        ));
    }
    if now.known && now.to_be_deleted && !(was.known && was.to_be_deleted) {
        lines.push(format!(
            "Node {name:?} has the cluster autoscaler's ToBeDeletedByClusterAutoscaler taint \
             (/healthz answers 503, so load balancers drain it)"
        ));
    }
    if now.known && was.known && was.to_be_deleted && !now.to_be_deleted {
        lines.push(format!(
            "Node {name:?} no longer has the ToBeDeletedByClusterAutoscaler taint"
        ));
    }
    if now.known && now.ips_kept && !(was.known && was.ips_kept) {
        lines.push(format!(
            "Node {name:?} lists no InternalIP or ExternalIP any more; keeping node IPs {}",
            list(&now.ips)
        ));
    }
    if was.ips != now.ips {
        lines.push(format!(
            "node IPs changed: {} → {}",
            list(&was.ips),
            list(&now.ips)
        ));
    }
    if now.known && now.pod_cidrs_kept && !(was.known && was.pod_cidrs_kept) {
        lines.push(format!(
            "Node {name:?} lists no podCIDRs any more; keeping pod CIDRs {}",
            list(&now.pod_cidrs)
        ));
    }
    if was.pod_cidrs != now.pod_cidrs {
        lines.push(format!(
            "pod CIDRs changed: {} → {}",
            list(&was.pod_cidrs),
            list(&now.pod_cidrs)
        ));
    }
    if was.zone != now.zone {
        lines.push(format!(
            "zone changed: {} → {}",
            was.zone.as_deref().unwrap_or("none"),
            now.zone.as_deref().unwrap_or("none")
        ));
    }
    lines
}

/// The one line for a Node that appeared or was re-created: its whole view, each value that
/// differs from the last view (a re-created Node's) as old → new, and what the new Node
/// lacks that kpng keeps or that it is being deleted.
fn node_arrival(was: &kpng_model::NodeState, now: &kpng_model::NodeState) -> String {
    let (event, ips, pod_cidrs, zone) = if was.ever_known {
        (
            "was re-created",
            change(&list(&was.ips), &list(&now.ips)),
            change(&list(&was.pod_cidrs), &list(&now.pod_cidrs)),
            change(&zone_name(was), &zone_name(now)),
        )
    } else {
        // First sighting: what kpng had before is only the lack of a Node, not a value.
        (
            "appeared",
            list(&now.ips),
            list(&now.pod_cidrs),
            zone_name(now),
        )
    };
    let mut line = format!(
        "Node {:?} {event}: node IPs {ips}, pod CIDRs {pod_cidrs}, zone {zone}",
        now.name
    );
    if now.ips_kept {
        line.push_str("; it lists no InternalIP or ExternalIP: keeping the node IPs");
    }
    if now.pod_cidrs_kept {
        line.push_str("; it lists no podCIDRs: keeping the pod CIDRs");
    }
    if now.deleting {
        line.push_str("; it is being deleted (/healthz answers 503)");
    }
    line
}

/// `old → new`, or just the value when it did not change.
fn change(was: &str, now: &str) -> String {
    if was == now {
        now.to_string()
    } else {
        format!("{was} → {now}")
    }
}

/// The zone for a log line: `none` when the Node has no zone label.
fn zone_name(node: &kpng_model::NodeState) -> String {
    node.zone.as_deref().unwrap_or("none").to_string()
}

/// `[a, b]`, `[]` when empty.
fn list<T: std::fmt::Display>(items: &[T]) -> String {
    let items: Vec<String> = items.iter().map(|i| i.to_string()).collect();
    format!("[{}]", items.join(", "))
}
