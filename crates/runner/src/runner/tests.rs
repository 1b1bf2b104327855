//! Sync-loop behaviour with a fake backend and paused time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use kpng_model::{Event, ModelConfig, Object};
use prometheus_client::registry::Registry;
use serde_json::json;

use super::*;
use kpng_backend::{BackendError, SyncRequest, SyncStats};

#[derive(Default)]
struct Calls {
    /// (full, number of changed ports, ports in snapshot)
    log: Mutex<Vec<(bool, usize, usize)>>,
    fail: AtomicBool,
    /// The alarm the runner handed over (`watch_tampering`).
    alarm: Mutex<Option<kpng_backend::TamperAlarm>>,
    /// Whether the fake backend shows the node's status (`Backend::shows_node_status`).
    shows_node_status: AtomicBool,
    /// What the next sync says it found changed and repaired itself (`SyncStats::repaired`).
    found: Mutex<Option<String>>,
    /// What syncs say of the rules they found: `None`, not kept; `Some(None)`, kept
    /// (`SyncStats::kept_rules`); `Some(Some(frontends))`, kept for these UDP frontends only
    /// (`SyncStats::kept_udp_frontends`).
    kept_rules: Mutex<Kept>,
    /// Whether the fake backend programs IPv6 too (`Backend::families`).
    dual_stack: AtomicBool,
    /// The only family whose sync fails while `fail` is set (as `sync_each` reports it);
    /// `None`: the sync fails as a whole.
    fail_family: Mutex<Option<Family>>,
    /// What a failing sync says (default "injected failure").
    error_text: Mutex<Option<String>>,
}

/// What the fake backend says of the rules it found (see [`Calls::kept_rules`]).
type Kept = Option<Option<kpng_backend::UdpFrontends>>;

struct FakeBackend(Arc<Calls>);

impl Backend for FakeBackend {
    fn name(&self) -> &'static str {
        "fake"
    }
    fn families(&self) -> Vec<Family> {
        if self.0.dual_stack.load(Ordering::SeqCst) {
            vec![Family::V4, Family::V6]
        } else {
            vec![Family::V4]
        }
    }
    fn watch_tampering(&mut self, alarm: kpng_backend::TamperAlarm) -> Result<bool, BackendError> {
        *self.0.alarm.lock().expect("lock") = Some(alarm);
        Ok(true)
    }
    fn shows_node_status(&self) -> bool {
        self.0.shows_node_status.load(Ordering::SeqCst)
    }
    fn sync(&mut self, r: &SyncRequest<'_>) -> Result<SyncStats, BackendError> {
        self.0.log.lock().expect("lock").push((
            r.full,
            r.diff.changes.len(),
            r.snapshot.ports.len(),
        ));
        if self.0.fail.load(Ordering::SeqCst) {
            let text = self.0.error_text.lock().expect("lock").clone();
            let error = BackendError::Other(text.unwrap_or_else(|| "injected failure".into()));
            return Err(match *self.0.fail_family.lock().expect("lock") {
                Some(family) => BackendError::InFamilies {
                    failed: vec![family],
                    error: Box::new(error),
                },
                None => error,
            });
        }
        let kept = self.0.kept_rules.lock().expect("lock").clone();
        Ok(SyncStats {
            operations: r.diff.changes.len(),
            repaired: self.0.found.lock().expect("lock").take(),
            kept_rules: kept.iter().map(|_| Family::V4).collect(),
            kept_udp_frontends: kept.flatten(),
        })
    }
}

fn service(name: &str, ip: &str) -> Object {
    kpng_k8s::from_json::<k8s_openapi::api::core::v1::Service>(
        json!({"metadata": {"namespace": "ns", "name": name},
            "spec": {"clusterIP": ip, "ports": [{"name": "p", "port": 80}]}}),
    )
    .expect("service")
    .object
}

fn all_kinds(objects: Vec<Object>) -> Event {
    Event::Replace {
        kinds: vec![Kind::Service, Kind::EndpointSlice, Kind::Node],
        objects,
    }
}

struct Harness {
    calls: Arc<Calls>,
    tx: mpsc::Sender<Event>,
    reports: watch::Receiver<Option<SyncReport>>,
    metrics: ProxyMetrics,
    registry: Registry,
    health: Arc<ProxyHealth>,
    admin: AdminHandle,
    _task: tokio::task::JoinHandle<()>,
}

fn start(timing: SyncTiming) -> Harness {
    start_with(timing, None)
}

fn start_with(timing: SyncTiming, conntrack: Option<kpng_conntrack::Reconciler>) -> Harness {
    start_remembering(timing, conntrack, None, None, None)
}

/// [`start_with`], the conntrack cleanup keeping its memory in `memory` and taking
/// `inherited` checks, and the fake backend saying what `kept_rules` says of its rules.
fn start_remembering(
    timing: SyncTiming,
    conntrack: Option<kpng_conntrack::Reconciler>,
    memory: Option<kpng_conntrack::memory::MemoryFile>,
    kept_rules: Kept,
    inherited: Option<crate::conntrack_cleanup::StartRead>,
) -> Harness {
    start_full(timing, conntrack, memory, kept_rules, inherited, |r| r)
}

/// [`start_remembering`] with `customize` applied to the runner last.
fn start_full(
    timing: SyncTiming,
    conntrack: Option<kpng_conntrack::Reconciler>,
    memory: Option<kpng_conntrack::memory::MemoryFile>,
    kept_rules: Kept,
    inherited: Option<crate::conntrack_cleanup::StartRead>,
    customize: impl FnOnce(Runner<Model>) -> Runner<Model>,
) -> Harness {
    let calls = Arc::new(Calls::default());
    *calls.kept_rules.lock().expect("lock") = kept_rules;
    start_calls(calls, timing, conntrack, memory, inherited, customize)
}

/// [`start_full`] with the fake backend's `calls` made by the caller (a dual-stack one).
fn start_calls(
    calls: Arc<Calls>,
    timing: SyncTiming,
    conntrack: Option<kpng_conntrack::Reconciler>,
    memory: Option<kpng_conntrack::memory::MemoryFile>,
    inherited: Option<crate::conntrack_cleanup::StartRead>,
    customize: impl FnOnce(Runner<Model>) -> Runner<Model>,
) -> Harness {
    let mut registry = Registry::default();
    let metrics = ProxyMetrics::new(&mut registry);
    let families = FakeBackend(calls.clone()).families();
    let health = Arc::new(ProxyHealth::new(&families, timing.sync_period * 2));
    let model = Model::new(ModelConfig {
        node_name: "n".into(),
        ..ModelConfig::default()
    });
    let mut runner = Runner::new(
        model,
        Box::new(FakeBackend(calls.clone())),
        timing,
        metrics.clone(),
        health.clone(),
    );
    if let Some(reconciler) = conntrack {
        runner = runner.with_conntrack_cleanup(reconciler);
    }
    if let Some(mut file) = memory {
        let loaded = file.load();
        runner = runner.with_conntrack_memory(file, loaded);
    }
    if let Some(inherited) = inherited {
        runner = runner.with_conntrack_inherited(inherited);
    }
    let runner = customize(runner);
    let reports = runner.subscribe();
    let (runner, admin) = runner.with_admin(Box::new(|_: &kpng_model::Snapshot| {
        kpng_model::trace::NodeFacts::default()
    }));
    let (tx, rx) = mpsc::channel(16);
    let task = tokio::spawn(runner.run(rx));
    Harness {
        calls,
        tx,
        reports,
        metrics,
        registry,
        health,
        admin,
        _task: task,
    }
}

fn log(h: &Harness) -> Vec<(bool, usize, usize)> {
    h.calls.log.lock().expect("lock").clone()
}

/// What `kpng status` would show now.
async fn status_of(h: &Harness) -> admin::Status {
    h.admin
        .status(admin::StatusQuery::default())
        .await
        .expect("status")
}

/// The fake backend's tampering reports counted so far.
fn tampering_detected(h: &Harness) -> u64 {
    let label = BackendLabel {
        backend: "fake".into(),
    };
    h.metrics.tampering_detected.get_or_create(&label).get()
}

/// Timing where every change syncs at once and the periodic sync is 10 s away.
fn prompt_timing() -> SyncTiming {
    SyncTiming {
        min_sync_period: Duration::ZERO,
        sync_period: Duration::from_secs(10),
        ..SyncTiming::default()
    }
}

/// Sends the first full state, one Service `a` at 10.96.0.1, and lets its sync run.
async fn first_state_with_one_service(h: &Harness) {
    h.tx.send(all_kinds(vec![service("a", "10.96.0.1")]))
        .await
        .expect("send");
    settle().await;
}

/// [`first_state_with_one_service`], then every sync fails from now on and a second Service
/// `b` at 10.96.0.2 arrives: its (failing) sync runs.
///
/// Why: the start of the tests of what failed syncs leave behind.
async fn first_state_then_a_failing_change(h: &Harness) {
    first_state_with_one_service(h).await;
    h.calls.fail.store(true, Ordering::SeqCst);
    h.tx.send(Event::Apply(service("b", "10.96.0.2")))
        .await
        .expect("send");
    settle().await;
}

async fn settle() {
    // Let the runner task process what is queued (time is paused; this only yields).
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn nothing_is_programmed_before_every_kind_is_listed() {
    let h = start(SyncTiming::default());
    h.tx.send(Event::Apply(service("a", "10.96.0.1")))
        .await
        .expect("send");
    h.tx.send(Event::Replace {
        kinds: vec![Kind::Service],
        objects: vec![service("a", "10.96.0.1")],
    })
    .await
    .expect("send");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        log(&h).is_empty(),
        "synced before EndpointSlices and Nodes were listed"
    );
    first_state_with_one_service(&h).await;
    assert_eq!(
        log(&h),
        vec![(true, 1, 1)],
        "one full sync once everything is listed"
    );
}

#[tokio::test(start_paused = true)]
async fn changes_within_min_sync_period_are_merged_into_one_partial_sync() {
    let h = start(SyncTiming {
        min_sync_period: Duration::from_secs(1),
        ..SyncTiming::default()
    });
    h.tx.send(all_kinds(vec![])).await.expect("send");
    settle().await;
    h.tx.send(Event::Apply(service("a", "10.96.0.1")))
        .await
        .expect("send");
    tokio::time::sleep(Duration::from_millis(100)).await;
    h.tx.send(Event::Apply(service("b", "10.96.0.2")))
        .await
        .expect("send");
    settle().await;
    assert_eq!(log(&h).len(), 1, "still rate limited");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(log(&h), vec![(true, 0, 0), (false, 2, 2)]);
    assert_eq!(h.metrics.service_changes_total.get(), 2);
}

/// A sync that changed nothing (an idle periodic one) does not hold the next change back by
/// `min_sync_period`; one that wrote (a change's, a periodic full one's) does.
#[tokio::test(start_paused = true)]
async fn only_a_sync_that_wrote_delays_the_next_change_by_min_sync_period() {
    let h = start(SyncTiming {
        min_sync_period: Duration::from_secs(1),
        sync_period: Duration::from_secs(30),
        full_sync_period: Duration::from_secs(60),
    });
    first_state_with_one_service(&h).await;
    assert_eq!(log(&h), vec![(true, 1, 1)]);
    // The idle periodic sync at 30 s, then a change 10 ms later: synced at once.
    tokio::time::sleep(Duration::from_millis(30_010)).await;
    assert_eq!(log(&h), vec![(true, 1, 1), (false, 0, 1)]);
    h.tx.send(Event::Apply(service("b", "10.96.0.2")))
        .await
        .expect("send");
    settle().await;
    assert_eq!(
        log(&h),
        vec![(true, 1, 1), (false, 0, 1), (false, 1, 2)],
        "a change after a sync that changed nothing waits for nothing"
    );
    // That sync wrote: the next change waits for min_sync_period from it.
    h.tx.send(Event::Apply(service("c", "10.96.0.3")))
        .await
        .expect("send");
    settle().await;
    assert_eq!(log(&h).len(), 3, "rate limited after a sync that wrote");
    tokio::time::sleep(Duration::from_millis(1001)).await;
    assert_eq!(log(&h).last(), Some(&(false, 1, 3)));
    // The periodic full sync at 60 s writes every port: it still counts.
    tokio::time::sleep(Duration::from_millis(60_010 - 31_011)).await;
    assert_eq!(log(&h).last(), Some(&(true, 3, 3)), "{:?}", log(&h));
    let synced = log(&h).len();
    h.tx.send(Event::Apply(service("d", "10.96.0.4")))
        .await
        .expect("send");
    settle().await;
    assert_eq!(
        log(&h).len(),
        synced,
        "rate limited after a full sync that wrote"
    );
    tokio::time::sleep(Duration::from_millis(1001)).await;
    assert_eq!(log(&h).last(), Some(&(false, 1, 4)));
}

/// A sync that failed for want of file descriptors (a low `ulimit -n`: the eBPF backend's
/// `bpf_link_create`) says what to raise, in the log and in `kpng status`.
#[tokio::test(start_paused = true)]
async fn a_sync_out_of_file_descriptors_says_to_raise_the_limit() {
    let h = start(SyncTiming {
        min_sync_period: Duration::ZERO,
        ..SyncTiming::default()
    });
    *h.calls.error_text.lock().expect("lock") =
        Some("attaching kpng_connect4: bpf_link_create failed: Too many open files".into());
    h.calls.fail.store(true, Ordering::SeqCst);
    h.tx.send(all_kinds(vec![])).await.expect("send");
    settle().await;
    let want = "attaching kpng_connect4: bpf_link_create failed: Too many open files; raise the \
                open-files limit (ulimit -n; the eBPF backend needs about 50 descriptors)";
    let report = h.reports.borrow().clone().expect("report");
    assert_eq!(report.error.as_deref(), Some(want));
    assert_eq!(status_of(&h).await.last_error.as_deref(), Some(want));
}

#[tokio::test(start_paused = true)]
async fn a_failed_sync_is_retried_as_a_full_sync_and_health_turns_bad_then_good() {
    let timing = prompt_timing();
    let mut h = start(timing);
    h.tx.send(all_kinds(vec![])).await.expect("send");
    settle().await;
    h.calls.fail.store(true, Ordering::SeqCst);
    h.tx.send(Event::Apply(service("a", "10.96.0.1")))
        .await
        .expect("send");
    settle().await;
    assert_eq!(log(&h).last(), Some(&(false, 1, 1)));
    assert!(!h.reports.borrow_and_update().as_ref().expect("report").ok);
    // Retries back off (0.5 s, 1 s, 2 s, …, capped at the sync period) and are full syncs.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(log(&h).last(), Some(&(true, 1, 1)));
    assert_eq!(
        h.metrics
            .sync_failures
            .get_or_create(&BackendLabel {
                backend: "fake".into()
            })
            .get(),
        2
    );
    // Still failing after 2 × sync period: unhealthy.
    tokio::time::sleep(Duration::from_secs(21)).await;
    assert!(
        !h.health
            .is_healthy(SystemTime::now() + Duration::from_secs(21))
    );
    h.calls.fail.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert!(h.reports.borrow().as_ref().expect("report").ok);
    assert!(h.health.is_healthy(SystemTime::now()));
}

/// The changes failed syncs took are not programmed: they stay pending (status and gauges)
/// until a sync succeeds, and that sync's `changes=` names them (it read "no Service port
/// changed" although it programmed the new Service first).
#[tokio::test(start_paused = true)]
async fn a_failed_syncs_changes_stay_pending_and_the_recovery_sync_names_them() {
    let timing = prompt_timing();
    let h = start(timing);
    first_state_then_a_failing_change(&h).await;
    // Two retries fail too.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(log(&h).len(), 4, "{:?}", log(&h));
    let status = status_of(&h).await;
    assert_eq!(status.pending_port_changes, 1, "ns/b is not programmed");
    assert_eq!(h.metrics.service_changes_pending.get(), 1);
    h.tx.send(Event::Apply(service("c", "10.96.0.3")))
        .await
        .expect("send");
    settle().await;
    assert_eq!(status_of(&h).await.pending_port_changes, 2);
    h.calls.fail.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let status = status_of(&h).await;
    let last = status.last_sync.expect("a sync");
    assert!(last.ok, "{last:?}");
    assert_eq!(
        last.changes,
        "Service ports: 2 added (ns/b, ns/c) (including the changes of the 3 failed syncs \
         before it)"
    );
    assert_eq!(status.pending_port_changes, 0);
    assert_eq!(h.metrics.service_changes_pending.get(), 0);
    // The next failure starts a new count.
    h.calls.fail.store(true, Ordering::SeqCst);
    h.tx.send(Event::Apply(service("d", "10.96.0.4")))
        .await
        .expect("send");
    settle().await;
    h.calls.fail.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let last = status_of(&h).await.last_sync.expect("a sync");
    assert_eq!(
        last.changes,
        "Service ports: 1 added (ns/d) (including the changes of the failed sync before it)"
    );
}

/// A first sync that fails: the retry that succeeds programs every port, and says so.
#[tokio::test(start_paused = true)]
async fn a_failed_first_syncs_retry_names_every_port() {
    let h = start(SyncTiming {
        min_sync_period: Duration::ZERO,
        ..SyncTiming::default()
    });
    h.calls.fail.store(true, Ordering::SeqCst);
    first_state_with_one_service(&h).await;
    assert_eq!(status_of(&h).await.pending_port_changes, 1);
    h.calls.fail.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let last = status_of(&h).await.last_sync.expect("a sync");
    assert!(last.ok);
    assert_eq!(
        last.changes,
        "Service ports: 1 added (ns/a); node or Service CIDRs changed (including the changes of \
         the failed sync before it)"
    );
}

/// The line that ends a run of failed syncs: how many, and for how long.
#[test]
fn the_end_of_failing_syncs_says_how_many_and_how_long() {
    let t = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
    for (failures, since, now, want) in [
        (
            1,
            0,
            2,
            "syncs succeed again after 1 failure (failing for 2s), the problem is over",
        ),
        (
            7,
            10,
            100,
            "syncs succeed again after 7 failures (failing for 1m 30s), the problem is over",
        ),
    ] {
        let failing = sync::Failing {
            since: t(since),
            failures,
        };
        assert_eq!(failing.over(t(now)), want);
    }
}

/// A sync that fails with nothing pending (a periodic one, or the repair after a change by
/// someone else) leaves the data plane unlike the model as much as a failed change's sync:
/// `/healthz` and `/livez` fail once it lasts 2 × the sync period, as the docs promise, and
/// are good again after the next successful sync.
#[tokio::test(start_paused = true)]
async fn failed_repairs_and_periodic_syncs_make_health_fail_after_two_sync_periods() {
    let timing = prompt_timing();
    let h = start(timing);
    first_state_with_one_service(&h).await;
    let livez_in = |h: &Harness, secs: u64| {
        h.health
            .report(SystemTime::now() + Duration::from_secs(secs), false)
            .status
    };
    assert_eq!(livez_in(&h, 25), 200, "synced");

    // Someone else's change, whose repairs fail (another process owns the table).
    h.calls.fail.store(true, Ordering::SeqCst);
    let alarm = h.calls.alarm.lock().expect("lock").clone().expect("alarm");
    alarm.raise("ip kpng: table deleted");
    settle().await;
    tokio::time::sleep(TAMPER_DEBOUNCE + Duration::from_millis(1)).await;
    assert_eq!(log(&h).len(), 2, "the repair was tried");
    assert!(!h.reports.borrow().as_ref().expect("report").ok);
    assert_eq!(livez_in(&h, 19), 200, "within 2 × sync period");
    assert_eq!(
        livez_in(&h, 21),
        503,
        "a repair failing for 2 × sync period"
    );
    assert_eq!(
        h.health
            .report(SystemTime::now() + Duration::from_secs(21), true)
            .status,
        503
    );
    // Good again once a sync succeeds.
    h.calls.fail.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert!(h.reports.borrow().as_ref().expect("report").ok);
    assert_eq!(livez_in(&h, 25), 200, "repaired");

    // A periodic sync (nothing pending) that fails.
    h.calls.fail.store(true, Ordering::SeqCst);
    let before = log(&h).len();
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert!(log(&h).len() > before, "the periodic sync ran");
    assert!(!h.reports.borrow().as_ref().expect("report").ok);
    assert_eq!(livez_in(&h, 21), 503, "a failing periodic sync");
}

/// Every sync attempt is in the duration histograms, a failed one too (kube-proxy observes
/// them in a defer): a backend whose syncs fail for minutes shows in them.
#[tokio::test(start_paused = true)]
async fn every_sync_attempt_is_timed_a_failed_one_too() {
    let h = start(SyncTiming {
        min_sync_period: Duration::ZERO,
        ..SyncTiming::default()
    });
    first_state_then_a_failing_change(&h).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    // The first full sync, the failed partial one, the failed full retry.
    assert_eq!(log(&h), vec![(true, 1, 1), (false, 1, 2), (true, 2, 2)]);
    let text = encoded(&h);
    for line in [
        "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 3",
        "kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 2",
        "kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 1",
    ] {
        assert!(text.contains(line), "{line} missing:\n{text}");
    }
}

/// Each family is synced on its own: when only IPv6 fails, IPv4's health and last-sync
/// timestamp move on (kube-proxy's IPv4 proxier would not know of the IPv6 one's failure).
#[tokio::test(start_paused = true)]
async fn a_failure_of_one_family_leaves_the_other_healthy_and_current() {
    let timing = prompt_timing();
    let calls = Arc::new(Calls::default());
    calls.dual_stack.store(true, Ordering::SeqCst);
    *calls.fail_family.lock().expect("lock") = Some(Family::V6);
    let h = start_calls(calls, timing, None, None, None, |r| r);
    first_state_with_one_service(&h).await;
    let last_sync = |h: &Harness, family: Family| {
        h.metrics
            .last_sync_timestamp
            .get_or_create(&family.into())
            .get()
    };
    let (v4, v6) = (last_sync(&h, Family::V4), last_sync(&h, Family::V6));
    assert!(v4 > 0.0 && v6 > 0.0);
    h.calls.fail.store(true, Ordering::SeqCst);
    // (The timestamps are wall-clock: let some pass.)
    std::thread::sleep(Duration::from_millis(5));
    h.tx.send(Event::Apply(service("b", "10.96.0.2")))
        .await
        .expect("send");
    settle().await;
    assert!(!h.reports.borrow().as_ref().expect("report").ok);
    assert!(last_sync(&h, Family::V4) > v4, "IPv4 synced");
    assert_eq!(last_sync(&h, Family::V6), v6, "IPv6 did not");
    let report = h
        .health
        .report(SystemTime::now() + Duration::from_secs(21), false);
    let body: serde_json::Value = serde_json::from_str(&report.body).expect("JSON");
    assert_eq!(report.status, 503, "{}", report.body);
    assert_eq!(body["status"]["IPv4"]["healthy"], true, "{}", report.body);
    assert_eq!(body["status"]["IPv6"]["healthy"], false, "{}", report.body);
}

#[tokio::test(start_paused = true)]
async fn periodic_and_full_resyncs() {
    let timing = SyncTiming {
        min_sync_period: Duration::ZERO,
        sync_period: Duration::from_secs(30),
        full_sync_period: Duration::from_secs(90),
    };
    let h = start(timing);
    first_state_with_one_service(&h).await;
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(
        log(&h),
        vec![(true, 1, 1), (false, 0, 1)],
        "periodic sync carries an empty diff"
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    let l = log(&h);
    assert_eq!(
        l.last(),
        Some(&(true, 1, 1)),
        "full resync after full_sync_period: {l:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn tampering_forces_one_prompt_full_sync_whatever_min_sync_period() {
    let h = start(SyncTiming {
        min_sync_period: Duration::from_secs(10),
        ..SyncTiming::default()
    });
    first_state_with_one_service(&h).await;
    assert_eq!(log(&h), vec![(true, 1, 1)]);
    let alarm = h.calls.alarm.lock().expect("lock").clone().expect("alarm");
    // A burst (`nft flush ruleset`: many notifications) is one repair.
    for _ in 0..5 {
        alarm.raise("ip kpng: table deleted");
    }
    settle().await;
    tokio::time::sleep(TAMPER_DEBOUNCE + Duration::from_millis(1)).await;
    assert_eq!(log(&h), vec![(true, 1, 1), (true, 1, 1)]);
    assert_eq!(tampering_detected(&h), 5);
    let status = status_of(&h).await;
    let repairs = status.repairs.expect("the repair is shown");
    assert_eq!(
        (repairs.count, repairs.last_change.as_str()),
        (1, "ip kpng: table deleted")
    );
    assert!(
        status.recent_syncs[0]
            .changes
            .starts_with("repair after a change by someone else (ip kpng: table deleted); "),
        "{:?}",
        status.recent_syncs
    );
    // Later changes are rate limited as usual again.
    h.tx.send(Event::Apply(service("b", "10.96.0.2")))
        .await
        .expect("send");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        log(&h).len(),
        2,
        "min_sync_period applies to ordinary changes"
    );
}

/// The repair delay's gauge now.
fn repair_delay(h: &Harness) -> f64 {
    let label = BackendLabel {
        backend: "fake".into(),
    };
    h.metrics.repair_delay.get_or_create(&label).get()
}

/// A neighbour that undoes every repair (a flush every 100 ms for 2 s): the first five repairs
/// are made at once, then they wait 1 s, 2 s, …; `kpng status` says why and the gauge how
/// long; a quiet minute makes repairs immediate again.
#[tokio::test(start_paused = true)]
async fn repairs_that_keep_coming_back_off_and_reset_once_quiet() {
    let h = start(SyncTiming::default());
    first_state_with_one_service(&h).await;
    let alarm = h.calls.alarm.lock().expect("lock").clone().expect("alarm");
    let started = Instant::now();
    // When each repair (a full sync after the first) was made, in ms from the first flush.
    let mut repairs_at = Vec::new();
    let mut seen = 1;
    let mut note = |repairs_at: &mut Vec<u64>| {
        for _ in seen..log(&h).len() {
            repairs_at.push(started.elapsed().as_millis() as u64);
        }
        seen = log(&h).len();
    };
    for _ in 0..20 {
        alarm.raise("ip kpng: table deleted");
        settle().await;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(1)).await;
            note(&mut repairs_at);
        }
    }
    assert_eq!(
        repairs_at,
        vec![21, 121, 221, 321, 421, 1521],
        "five at once, then 1 s after the sixth flush"
    );
    let status = status_of(&h).await;
    let problem = status.repairs.and_then(|r| r.problem).expect("a problem");
    assert!(
        problem.starts_with("someone else changed kpng's rules 7 times in the last 1s (the last: ")
            && problem.contains("firewalld or ufw reloading")
            && problem.contains("a second kpng or kube-proxy")
            && problem.ends_with(
                "repairs are delayed (the last by 2s, at most 30s) until none comes for 60s"
            ),
        "{problem}"
    );
    assert_eq!(repair_delay(&h), 2.0);
    // The flushes stopped: the delayed repairs are made (1 s after the 6th flush, 2 s after
    // the 7th), then nothing more.
    for _ in 0..3000 {
        tokio::time::sleep(Duration::from_millis(1)).await;
        note(&mut repairs_at);
    }
    assert_eq!(repairs_at, vec![21, 121, 221, 321, 421, 1521, 3621]);
    assert!(log(&h).iter().all(|(full, _, _)| *full));
    assert_eq!(status_of(&h).await.repairs.map(|r| r.count), Some(7));
    // A quiet minute (and the periodic sync that looks): immediate again, no problem shown.
    tokio::time::sleep(Duration::from_secs(62)).await;
    settle().await;
    assert_eq!(repair_delay(&h), 0.0);
    let status = status_of(&h).await;
    assert_eq!(status.repairs.and_then(|r| r.problem), None);
    let before = log(&h).len();
    alarm.raise("ip kpng: table deleted");
    settle().await;
    tokio::time::sleep(TAMPER_DEBOUNCE + Duration::from_millis(1)).await;
    assert_eq!(log(&h).len(), before + 1, "repaired at once again");
}

/// While a change by someone else waits for its delayed repair, `kpng status` said "last sync
/// ok, pending changes 0" and nothing else: it now names the change, since when, and when the
/// repair is due. `/healthz` follows kube-proxy's rule for a queued update not applied: the
/// known-absent rules count from their report, so a repair late by the health timeout (2 ×
/// sync period) fails it, and the repair makes it good again.
#[tokio::test(start_paused = true)]
async fn a_repair_waiting_in_the_backoff_is_shown_and_counts_for_healthz() {
    let sync_period = SyncTiming::default().sync_period;
    let h = start(SyncTiming::default());
    first_state_with_one_service(&h).await;
    h.health.set_node_eligible(true);
    let alarm = h.calls.alarm.lock().expect("lock").clone().expect("alarm");
    // Five repairs at once, then the sixth waits 1 s.
    for _ in 0..5 {
        alarm.raise("ip kpng: table deleted");
        settle().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status_of(&h).await.repairs.and_then(|r| r.unrepaired), None);
    let reported = SystemTime::now();
    alarm.raise("ip kpng: table deleted");
    settle().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let repairs = status_of(&h).await.repairs.expect("repairs");
    let line = repairs.unrepaired.expect("the waiting repair is shown");
    assert!(
        line.starts_with("ip kpng: table deleted (reported at ")
            && line.contains("): not repaired yet, repair due at ")
            && line.ends_with(
                "; until then Services whose rules it removed are not served on this node"
            ),
        "{line}"
    );
    assert!(repairs.problem.is_some(), "the backoff's own line stays");
    let healthz_at = |after: Duration| h.health.report(reported + after, true).status;
    assert_eq!(
        healthz_at(Duration::from_secs(1)),
        200,
        "within the timeout"
    );
    assert_eq!(
        healthz_at(2 * sync_period + Duration::from_secs(1)),
        503,
        "not repaired within the health timeout"
    );
    // The repair (1 s after the report) ends both.
    tokio::time::sleep(Duration::from_secs(1)).await;
    settle().await;
    let repairs = status_of(&h).await.repairs.expect("repairs");
    assert_eq!(repairs.unrepaired, None);
    assert_eq!(repairs.count, 6);
    assert_eq!(healthz_at(2 * sync_period + Duration::from_secs(1)), 200);
}

/// A repair the backend found itself in a periodic sync (no alarm) is counted and shown as
/// one reported by an alarm is.
#[tokio::test(start_paused = true)]
async fn a_repair_the_backend_found_itself_is_counted_and_shown() {
    let h = start(SyncTiming::default());
    first_state_with_one_service(&h).await;
    let found = "IPv4 iptables flushed: the KUBE-PROXY-CANARY chain in mangle was gone";
    *h.calls.found.lock().expect("lock") = Some(found.to_string());
    tokio::time::sleep(SyncTiming::default().sync_period + Duration::from_millis(1)).await;
    settle().await;
    assert_eq!(
        log(&h),
        vec![(true, 1, 1), (false, 0, 1)],
        "a periodic sync"
    );
    let status = status_of(&h).await;
    let repairs = status.repairs.expect("the repair is shown");
    assert_eq!((repairs.count, repairs.last_change.as_str()), (1, found));
    assert_eq!(
        status.recent_syncs[0].changes,
        format!("repair after a change by someone else ({found}); no Service port changed")
    );
    assert_eq!(tampering_detected(&h), 1);
    // The next periodic sync finds nothing: still one repair.
    tokio::time::sleep(SyncTiming::default().sync_period + Duration::from_millis(1)).await;
    settle().await;
    assert_eq!(status_of(&h).await.repairs.map(|r| r.count), Some(1));
}

fn udp_service(ip: &str) -> Object {
    kpng_k8s::from_json::<k8s_openapi::api::core::v1::Service>(
        json!({"metadata": {"namespace": "ns", "name": "dns"},
            "spec": {"clusterIP": ip, "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}}),
    )
    .expect("service")
    .object
}

fn udp_slice(endpoint: &str) -> Object {
    kpng_k8s::from_json::<k8s_openapi::api::discovery::v1::EndpointSlice>(json!({
            "metadata": {"namespace": "ns", "name": "dns-1",
                "labels": {"kubernetes.io/service-name": "dns"}},
            "addressType": "IPv4",
            "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}],
            "endpoints": [{"addresses": [endpoint]}]}))
    .expect("slice")
    .object
}

fn slice(name: &str, ip: &str, trigger: Option<SystemTime>) -> Object {
    let mut annotations = serde_json::Map::new();
    if let Some(at) = trigger {
        let secs = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs();
        let stamp = k8s_openapi::jiff::Timestamp::from_second(i64::try_from(secs).expect("i64"))
            .expect("timestamp");
        annotations.insert(
            "endpoints.kubernetes.io/last-change-trigger-time".into(),
            stamp.to_string().into(),
        );
    }
    kpng_k8s::from_json::<k8s_openapi::api::discovery::v1::EndpointSlice>(json!({
        "metadata": {"namespace": "ns", "name": name,
            "labels": {"kubernetes.io/service-name": "a"}, "annotations": annotations},
        "addressType": "IPv4",
        "ports": [{"name": "p", "port": 8080}],
        "endpoints": [{"addresses": [ip]}]
    }))
    .expect("slice")
    .object
}

/// The conntrack cleanup tests' timing: every change synced at once, a periodic sync every
/// 30 s, no periodic full sync (a full sync always runs a pass).
fn cleanup_timing() -> SyncTiming {
    SyncTiming {
        min_sync_period: Duration::ZERO,
        sync_period: Duration::from_secs(30),
        full_sync_period: Duration::ZERO,
    }
}

fn udp_flow(client: &str, dst: &str, reply_src: &str) -> kpng_conntrack::Flow {
    let sa = |s: &str| s.parse().expect("socket address");
    kpng_conntrack::Flow::udp(
        kpng_conntrack::Tuple::new(sa(client), sa(dst)),
        kpng_conntrack::Tuple::new(sa(reply_src), sa(client)),
    )
}

/// The conntrack cleanup's failure counter exists at 0 from the start where the cleanup runs
/// (the first failure then shows in `increase()`), and not where it does not.
#[tokio::test(start_paused = true)]
async fn conntrack_failures_are_exported_from_the_start_where_the_cleanup_runs() {
    let line = "kpng_conntrack_reconciler_failures_total{ip_family=\"IPv4\"} 0";
    let fake = kpng_conntrack::fake::FakeTable::new(vec![], vec![]);
    let reconciler = kpng_conntrack::Reconciler::new(Box::new(fake));
    let h = start_with(cleanup_timing(), Some(reconciler));
    settle().await;
    let text = encoded(&h);
    assert!(text.contains(line), "{line} missing:\n{text}");
    let without = start(cleanup_timing());
    settle().await;
    assert!(!encoded(&without).contains("kpng_conntrack_reconciler_failures_total"));
}

#[tokio::test(start_paused = true)]
async fn stale_udp_entries_are_deleted_after_syncs_that_can_strand_them() {
    use kpng_conntrack::fake::FakeTable;
    let unrelated = udp_flow("10.244.1.9:4000", "8.8.8.8:53", "8.8.8.8:53");
    let before_start = udp_flow("10.244.1.9:4001", "10.96.0.10:53", "10.244.2.9:53");
    let fake = FakeTable::new(vec![unrelated, before_start], vec![]);
    let timing = cleanup_timing();
    let reconciler = kpng_conntrack::Reconciler::new(Box::new(fake.clone()));
    let h = start_with(timing, Some(reconciler));
    let deleted = || {
        h.metrics
            .conntrack_reconciler_deleted
            .get_or_create(&Family::V4.into())
            .get()
    };
    let failures = || {
        h.metrics
            .conntrack_reconciler_failures
            .get_or_create(&Family::V4.into())
            .get()
    };
    // The first (full) sync: the entry pinned to an endpoint that is gone by now goes.
    h.tx.send(all_kinds(vec![
        udp_service("10.96.0.10"),
        udp_slice("10.244.2.7"),
    ]))
    .await
    .expect("send");
    settle().await;
    assert_eq!(fake.flows(), [unrelated]);
    assert_eq!(deleted(), 1);

    // The endpoint is replaced: the entry pinned to the old one goes.
    let pinned = udp_flow("10.244.1.9:4002", "10.96.0.10:53", "10.244.2.7:53");
    fake.state().flows.push(pinned);
    h.tx.send(Event::Apply(udp_slice("10.244.2.8")))
        .await
        .expect("send");
    settle().await;
    assert_eq!(fake.flows(), [unrelated]);
    assert_eq!(deleted(), 2);

    // Syncs that cannot strand an entry read nothing: a TCP Service, a periodic sync.
    let dumps = fake.state().dumps.len();
    h.tx.send(Event::Apply(service("web", "10.96.0.1")))
        .await
        .expect("send");
    settle().await;
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(log(&h).len(), 4, "{:?}", log(&h));
    assert_eq!(fake.state().dumps.len(), dumps);

    // A failed pass is counted, never fatal, and retried after the next (periodic) sync.
    fake.state().failing = true;
    let pinned = udp_flow("10.244.1.9:4003", "10.96.0.10:53", "10.244.2.8:53");
    fake.state().flows.push(pinned);
    h.tx.send(Event::Apply(udp_slice("10.244.2.6")))
        .await
        .expect("send");
    settle().await;
    assert_eq!(failures(), 1);
    assert!(h.reports.borrow().as_ref().expect("report").ok);
    fake.state().failing = false;
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(fake.flows(), [unrelated]);
    assert_eq!((deleted(), failures()), (3, 1));

    // The Service deleted (no pass: nothing can be stranded) and re-created with its
    // ClusterIP, as kube-dns often is: an entry a client created while the IP had no rule
    // was never DNATed, and goes when the IP is programmed again.
    let dumps = fake.state().dumps.len();
    h.tx.send(Event::Delete(kpng_model::ObjectRef {
        kind: Kind::Service,
        namespace: "ns".into(),
        name: "dns".into(),
    }))
    .await
    .expect("send");
    settle().await;
    assert_eq!(fake.state().dumps.len(), dumps);
    let meanwhile = udp_flow("10.244.1.9:4004", "10.96.0.10:53", "10.96.0.10:53");
    fake.state().flows.push(meanwhile);
    h.tx.send(Event::Apply(udp_service("10.96.0.10")))
        .await
        .expect("send");
    settle().await;
    assert_eq!(fake.flows(), [unrelated]);
    assert_eq!(deleted(), 4);

    // A failed backend sync runs no pass.
    h.calls.fail.store(true, Ordering::SeqCst);
    let dumps = fake.state().dumps.len();
    h.tx.send(Event::Apply(udp_slice("10.244.2.5")))
        .await
        .expect("send");
    settle().await;
    assert_eq!(fake.state().dumps.len(), dumps);
}

#[tokio::test(start_paused = true)]
async fn a_repair_reads_every_udp_frontend_whole() {
    use kpng_conntrack::DumpFilter;
    use kpng_conntrack::fake::FakeTable;
    let fake = FakeTable::new(vec![], vec![]);
    let timing = cleanup_timing();
    let reconciler = kpng_conntrack::Reconciler::new(Box::new(fake.clone()));
    let h = start_with(timing, Some(reconciler));
    h.tx.send(all_kinds(vec![
        udp_service("10.96.0.10"),
        udp_slice("10.244.2.7"),
    ]))
    .await
    .expect("send");
    settle().await;
    assert_eq!(log(&h).len(), 1);
    // Someone deletes the table; until the repair, a client's packets to the ClusterIP are
    // not DNATed, and its entry would keep them from the endpoint afterwards.
    let during_the_gap = udp_flow("10.244.1.9:4000", "10.96.0.10:53", "10.96.0.10:53");
    fake.state().flows.push(during_the_gap);
    fake.state().dumps.clear();
    let alarm = h.calls.alarm.lock().expect("lock").clone().expect("alarm");
    alarm.raise("ip kpng: table deleted");
    settle().await;
    tokio::time::sleep(TAMPER_DEBOUNCE + Duration::from_millis(1)).await;
    assert_eq!(log(&h).len(), 2, "the repair");
    assert_eq!(
        fake.state().dumps,
        [(
            Family::V4,
            DumpFilter::UdpTo("10.96.0.10:53".parse().expect("addr"))
        )],
        "the ClusterIP is read whole, as at a start-up"
    );
    assert!(fake.flows().is_empty());
}

/// Frontends another proxy's rules had checked (kube-proxy's, when kpng replaces it) need
/// no walk of their own in the first pass, whatever the backend says of its rules; others do.
#[tokio::test(start_paused = true)]
async fn inherited_checks_spare_the_first_pass_its_walks() {
    use kpng_conntrack::fake::FakeTable;
    use kpng_conntrack::memory::Checked;
    use kpng_conntrack::{DumpFilter, Frontend};
    let timing = cleanup_timing();
    let objects = || all_kinds(vec![udp_service("10.96.0.10"), udp_slice("10.244.2.7")]);
    let cluster_ip = DumpFilter::UdpTo("10.96.0.10:53".parse().expect("addr"));
    let of = |frontends: &[&str]| -> Checked {
        let set = frontends
            .iter()
            .map(|f| Frontend::Ip(f.parse().expect("addr")))
            .collect();
        [(Family::V4, set)].into()
    };
    // (what kube-proxy's rules covered, the first pass's dumps)
    let cases = [
        (of(&[]), vec![cluster_ip]),
        (of(&["10.96.0.10:53"]), vec![DumpFilter::UdpDnat]),
        (of(&["10.96.0.99:53"]), vec![cluster_ip]),
    ];
    for (inherited, dumps) in cases {
        let fake = FakeTable::new(vec![], vec![]);
        let pinned = udp_flow("10.244.1.9:4000", "10.96.0.10:53", "10.244.2.6:53");
        fake.state().flows.push(pinned);
        let reconciler = kpng_conntrack::Reconciler::new(Box::new(fake.clone()));
        let given = crate::conntrack_cleanup::StartRead::new({
            let inherited = inherited.clone();
            move || inherited
        });
        let h = start_remembering(timing, Some(reconciler), None, None, Some(given));
        h.tx.send(objects()).await.expect("send");
        settle().await;
        let done: Vec<DumpFilter> = fake.state().dumps.iter().map(|(_, d)| *d).collect();
        assert_eq!(done, dumps, "inherited {inherited:?}");
        assert!(fake.flows().is_empty(), "the pinned entry goes");
    }
}

#[tokio::test(start_paused = true)]
async fn a_restart_that_kept_the_rules_reads_only_the_dnated_udp_entries() {
    use kpng_conntrack::DumpFilter;
    use kpng_conntrack::fake::FakeTable;
    use kpng_conntrack::memory::MemoryFile;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("conntrack.checked");
    let fake = FakeTable::new(vec![], vec![]);
    let timing = cleanup_timing();
    let objects = || all_kinds(vec![udp_service("10.96.0.10"), udp_slice("10.244.2.7")]);
    let cluster_ip = DumpFilter::UdpTo("10.96.0.10:53".parse().expect("addr"));
    let only = |ip: &str| {
        Some(Some(kpng_backend::UdpFrontends {
            service_ips: vec![ip.parse().expect("addr")],
            node_ports: Vec::new(),
        }))
    };
    // (the run's boot, what its backend said of the last run's rules, the first pass's dumps)
    let runs = [
        ("b1", None, vec![cluster_ip]),
        ("b1", Some(None), vec![DumpFilter::UdpDnat]),
        ("b1", None, vec![cluster_ip]),
        ("b1", only("10.96.0.10:53"), vec![DumpFilter::UdpDnat]),
        // Kept, but the ClusterIP's rule was not among those found (someone else's writes).
        ("b1", only("10.96.0.99:53"), vec![cluster_ip]),
        ("b2", Some(None), vec![cluster_ip]),
    ];
    for (boot, kept_rules, dumps) in runs {
        fake.state().dumps.clear();
        // An entry pinned to an endpoint that went away while kpng was down.
        let pinned = udp_flow("10.244.1.9:4000", "10.96.0.10:53", "10.244.2.6:53");
        fake.state().flows.push(pinned);
        let reconciler = kpng_conntrack::Reconciler::new(Box::new(fake.clone()));
        let memory = MemoryFile::new(path.clone(), boot.into());
        let h = start_remembering(
            timing,
            Some(reconciler),
            Some(memory),
            kept_rules.clone(),
            None,
        );
        h.tx.send(objects()).await.expect("send");
        settle().await;
        assert_eq!(log(&h).len(), 1);
        let done: Vec<DumpFilter> = fake.state().dumps.iter().map(|(_, d)| *d).collect();
        assert_eq!(done, dumps, "boot {boot}, rules kept: {kept_rules:?}");
        assert!(
            fake.flows().is_empty(),
            "boot {boot}: the pinned entry goes"
        );
        let written = std::fs::read_to_string(&path).expect("memory written");
        assert!(written.ends_with("\nIPv4 ip 10.96.0.10:53\n"), "{written}");
    }
}

fn encoded(h: &Harness) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &h.registry).expect("encode");
    text
}

#[tokio::test(start_paused = true)]
async fn change_counters_count_events_and_pending_counts_changes_until_a_sync() {
    let h = start(SyncTiming {
        min_sync_period: Duration::from_secs(1),
        ..SyncTiming::default()
    });
    h.tx.send(all_kinds(vec![])).await.expect("send");
    settle().await;
    for event in [
        Event::Apply(service("a", "10.96.0.1")),
        // The same object again: an event kube-proxy counts, but no pending change.
        Event::Apply(service("a", "10.96.0.1")),
        Event::Apply(service("b", "10.96.0.2")),
        Event::Apply(slice("a-1", "10.0.0.1", None)),
        Event::Apply(slice("a-1", "10.0.0.1", None)),
        Event::Delete(kpng_model::ObjectRef {
            kind: Kind::EndpointSlice,
            namespace: "ns".into(),
            name: "a-1".into(),
        }),
    ] {
        h.tx.send(event).await.expect("send");
    }
    settle().await;
    let m = &h.metrics;
    assert_eq!(m.service_changes_total.get(), 3);
    assert_eq!(m.service_changes_pending.get(), 2, "Services a and b");
    assert_eq!(m.endpoint_changes_total.get(), 3);
    assert_eq!(m.endpoint_changes_pending.get(), 2, "added, then deleted");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(log(&h).len(), 2, "the pending changes were synced");
    assert_eq!(m.service_changes_pending.get(), 0);
    assert_eq!(m.endpoint_changes_pending.get(), 0);
    assert_eq!(
        m.service_changes_total.get(),
        3,
        "totals only grow with events"
    );
}

/// A batch (a reloaded file: `Replace`; a directory's changed file: `Changes`) moves the change
/// counters by the objects that differ from what the model had, not by every object it
/// repeats; a single watch event still counts as one, as kube-proxy counts every event.
#[tokio::test(start_paused = true)]
async fn a_reloaded_batch_counts_only_the_objects_that_changed() {
    let reference = |kind: Kind, name: &str| kpng_model::ObjectRef {
        kind,
        namespace: "ns".into(),
        name: name.into(),
    };
    let file = |b_ip: &str, slice_ip: &str, with_c: bool| {
        let mut objects = vec![
            service("a", "10.96.0.1"),
            service("b", b_ip),
            slice("a-1", slice_ip, None),
            slice("a-2", "10.0.0.9", None),
        ];
        if with_c {
            objects.push(service("c", "10.96.0.3"));
        }
        objects
    };
    let replace = |objects: Vec<Object>| all_kinds(objects);
    // (what, the input, Service changes, endpoint changes)
    let cases: Vec<(&str, Event, u64, u64)> = vec![
        (
            "the same file again",
            replace(file("10.96.0.2", "10.0.0.1", true)),
            0,
            0,
        ),
        (
            "one EndpointSlice edited",
            replace(file("10.96.0.2", "10.0.0.7", true)),
            0,
            1,
        ),
        (
            "one Service edited",
            replace(file("10.96.0.20", "10.0.0.7", true)),
            1,
            0,
        ),
        (
            "one Service gone from the file",
            replace(file("10.96.0.20", "10.0.0.7", false)),
            1,
            0,
        ),
        (
            "a directory's file: one slice deleted, the rest repeated",
            Event::Changes {
                deleted: vec![reference(Kind::EndpointSlice, "a-2")],
                applied: vec![service("a", "10.96.0.1"), slice("a-1", "10.0.0.7", None)],
            },
            0,
            1,
        ),
        (
            "a watch event repeating an object: one event, as kube-proxy",
            Event::Apply(service("a", "10.96.0.1")),
            1,
            0,
        ),
    ];
    let h = start(SyncTiming::default());
    h.tx.send(replace(file("10.96.0.2", "10.0.0.1", true)))
        .await
        .expect("send");
    settle().await;
    let m = &h.metrics;
    assert_eq!(
        (
            m.service_changes_total.get(),
            m.endpoint_changes_total.get()
        ),
        (3, 2),
        "the first load: every object is new"
    );
    for (what, event, services, endpoints) in cases {
        let before = (
            m.service_changes_total.get(),
            m.endpoint_changes_total.get(),
        );
        h.tx.send(event).await.expect("send");
        settle().await;
        let after = (
            m.service_changes_total.get(),
            m.endpoint_changes_total.get(),
        );
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            (services, endpoints),
            "{what}"
        );
    }
}

/// As kube-proxy's: while starting, `/healthz` takes the node as eligible until the Node list
/// says otherwise, and reports the sync loop's start as each family's `lastUpdated` (not the
/// zero time); once the list has no such Node, 503.
#[tokio::test(start_paused = true)]
async fn healthz_while_starting_is_as_kube_proxys() {
    let h = start(SyncTiming::default());
    settle().await;
    let report = h.health.report(SystemTime::now(), true);
    assert_eq!(report.status, 200, "{}", report.body);
    assert!(
        report.body.contains("\"nodeEligible\":true"),
        "{}",
        report.body
    );
    assert!(!report.body.contains("0001-01-01"), "{}", report.body);
    // The lists end without a Node named "n".
    first_state_with_one_service(&h).await;
    let report = h.health.report(SystemTime::now(), true);
    assert_eq!(report.status, 503, "{}", report.body);
    assert!(
        report.body.contains("\"nodeEligible\":false"),
        "{}",
        report.body
    );
    // The Node appears.
    h.tx.send(Event::Apply(node_object(
        json!({"metadata": {"name": "n"}}),
    )))
    .await
    .expect("send");
    settle().await;
    assert_eq!(h.health.report(SystemTime::now(), true).status, 200);
}

#[tokio::test(start_paused = true)]
async fn a_node_name_no_node_has_is_a_status_problem_once_listed() {
    let h = start(SyncTiming::default());
    assert_eq!(status_of(&h).await.node_problem, None, "not listed yet");
    h.tx.send(all_kinds(vec![])).await.expect("send");
    settle().await;
    let problem = status_of(&h).await.node_problem.unwrap_or_default();
    assert!(
        problem.starts_with("no Node named \"n\" in the cluster"),
        "{problem}"
    );
    let node =
        kpng_k8s::from_json::<k8s_openapi::api::core::v1::Node>(json!({"metadata": {"name": "n"}}))
            .expect("node")
            .object;
    h.tx.send(Event::Apply(node)).await.expect("send");
    settle().await;
    assert_eq!(status_of(&h).await.node_problem, None);
}

#[tokio::test(start_paused = true)]
async fn a_list_counts_applied_objects_under_their_own_kinds() {
    let h = start(SyncTiming::default());
    h.tx.send(all_kinds(vec![
        service("a", "10.96.0.1"),
        service("b", "10.96.0.2"),
        slice("a-1", "10.0.0.1", None),
    ]))
    .await
    .expect("send");
    h.tx.send(Event::Apply(service("c", "10.96.0.3")))
        .await
        .expect("send");
    settle().await;
    let text = encoded(&h);
    for line in [
        "kpng_objects_applied_total{kind=\"Service\"} 3",
        "kpng_objects_applied_total{kind=\"EndpointSlice\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line}:\n{text}");
    }
    assert!(!text.contains("kind=\"List\""), "{text}");
}

#[tokio::test(start_paused = true)]
async fn interleaved_lists_of_each_kind_gate_the_first_sync() {
    let h = start(SyncTiming::default());
    for kind in [Kind::Service, Kind::EndpointSlice, Kind::Node] {
        h.tx.send(Event::ListStart { kinds: vec![kind] })
            .await
            .expect("send");
    }
    h.tx.send(Event::ListItem(service("a", "10.96.0.1")))
        .await
        .expect("send");
    for kind in [Kind::Service, Kind::EndpointSlice] {
        h.tx.send(Event::ListDone { kinds: vec![kind] })
            .await
            .expect("send");
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(log(&h).is_empty(), "synced before the Node list was done");
    h.tx.send(Event::ListDone {
        kinds: vec![Kind::Node],
    })
    .await
    .expect("send");
    settle().await;
    assert_eq!(log(&h), vec![(true, 1, 1)]);
    assert_eq!(h.metrics.service_changes_total.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn network_programming_latency_is_observed_once_the_change_is_programmed() {
    let timing = SyncTiming {
        min_sync_period: Duration::ZERO,
        ..SyncTiming::default()
    };
    let h = start(timing);
    first_state_with_one_service(&h).await;
    // A change from before kpng started is not measured.
    let old = SystemTime::UNIX_EPOCH + Duration::from_secs(946_684_800);
    h.tx.send(Event::Apply(slice("a-1", "10.0.0.1", Some(old))))
        .await
        .expect("send");
    settle().await;
    let count = "kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv4\"}";
    // (The histogram is there from the start, at 0: see `export_from_start`.)
    assert!(
        encoded(&h).contains(&format!("{count} 0")),
        "{}",
        encoded(&h)
    );
    // A change triggered after the start (a second ahead, so whole-second RFC 3339 keeps it
    // after the start): not observed while the sync fails, observed once it succeeds.
    h.calls.fail.store(true, Ordering::SeqCst);
    let recent = SystemTime::now() + Duration::from_secs(1);
    h.tx.send(Event::Apply(slice("a-1", "10.0.0.2", Some(recent))))
        .await
        .expect("send");
    settle().await;
    assert_eq!(log(&h).last(), Some(&(false, 1, 1)));
    assert!(encoded(&h).contains(&format!("{count} 0")));
    h.calls.fail.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(log(&h).last(), Some(&(true, 1, 1)), "the retry succeeded");
    let text = encoded(&h);
    assert!(text.contains(&format!("{count} 1")), "{text}");
    // Observed once only.
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert!(encoded(&h).contains(&format!("{count} 1")));
}

/// `kpng status NAME` and the status page's filter are answered by the loop itself: only the
/// ports asked for are explained and sent, at most `limit` of them, with the counts.
#[tokio::test(start_paused = true)]
async fn a_status_query_selects_ports_before_they_are_explained() {
    let calls = Arc::new(Calls::default());
    let mut registry = Registry::default();
    let metrics = ProxyMetrics::new(&mut registry);
    let timing = SyncTiming::default();
    let health = Arc::new(ProxyHealth::new(&[Family::V4], timing.sync_period * 2));
    let model = Model::new(ModelConfig {
        node_name: "n".into(),
        ..ModelConfig::default()
    });
    let runner = Runner::new(model, Box::new(FakeBackend(calls)), timing, metrics, health);
    let (runner, admin) = runner.with_admin(Box::new(|_: &kpng_model::Snapshot| {
        kpng_model::trace::NodeFacts::default()
    }));
    let (tx, rx) = mpsc::channel(16);
    let _task = tokio::spawn(runner.run(rx));
    let services = (0..30)
        .map(|i| service(&format!("s{i}"), &format!("10.96.0.{}", i + 1)))
        .collect();
    tx.send(all_kinds(services)).await.expect("send");
    settle().await;

    let ask = |service: Option<&str>, text: Option<&str>, limit: Option<usize>| {
        let admin = admin.clone();
        let query = admin::StatusQuery {
            service: service.map(String::from),
            text: text.map(String::from),
            limit,
            offset: None,
        };
        async move { admin.status(query).await.expect("an answer") }
    };
    let names = |s: &admin::Status| -> Vec<String> {
        s.services.iter().map(|p| p.service.clone()).collect()
    };
    let all = ask(None, None, None).await;
    assert_eq!(
        (all.services.len(), all.total_ports, all.matching_ports),
        (30, 30, 30)
    );
    let one = ask(Some("s7"), None, None).await;
    assert_eq!(names(&one), ["ns/s7"]);
    assert_eq!((one.total_ports, one.matching_ports), (30, 1));
    assert_eq!(names(&ask(Some("ns/s7:p"), None, None).await), ["ns/s7"]);
    assert!(ask(Some("ns/s7:q"), None, None).await.services.is_empty());
    // The page's filter: any text of the row, here a ClusterIP.
    assert_eq!(
        names(&ask(None, Some("10.96.0.12:80"), None).await),
        ["ns/s11"]
    );
    let capped = ask(None, Some("NS/S1"), Some(3)).await;
    // s1 and s10…s19 match; the first three in key order are sent.
    assert_eq!(names(&capped), ["ns/s1", "ns/s10", "ns/s11"]);
    assert_eq!(capped.matching_ports, 11);
    // Page by page, with and without a text filter.
    for text in [None, Some("ns/s")] {
        let mut paged = Vec::new();
        loop {
            let page = admin
                .status(admin::StatusQuery {
                    text: text.map(String::from),
                    limit: Some(7),
                    offset: Some(paged.len()),
                    ..admin::StatusQuery::default()
                })
                .await
                .expect("a page");
            assert_eq!(page.matching_ports, 30);
            let done = page.services.len() < 7;
            paged.extend(names(&page));
            if done {
                break;
            }
        }
        assert_eq!(paged, names(&all), "{text:?}");
    }
}

/// A data-plane probe's lines are in the status, computed when asked and for the first page of
/// a paged answer only (the eBPF backend's probe dumps every map).
#[tokio::test]
async fn the_data_plane_probe_answers_the_first_page_only() {
    let h = start(SyncTiming::default());
    let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = asked.clone();
    let admin = h.admin.clone().with_data_plane_probe(Arc::new(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        vec![admin::DataPlaneDetail {
            what: "probe".into(),
            state: "fine".into(),
            problem: None,
        }]
    }));
    let page = |offset: Option<usize>| {
        let admin = admin.clone();
        async move {
            admin
                .status(admin::StatusQuery {
                    offset,
                    ..admin::StatusQuery::default()
                })
                .await
                .expect("an answer")
        }
    };
    assert_eq!(page(None).await.data_plane.len(), 1);
    assert_eq!(page(Some(0)).await.data_plane[0].state, "fine");
    assert!(page(Some(2000)).await.data_plane.is_empty());
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 2);
    // The handle without a probe answers without lines.
    assert!(status_of(&h).await.data_plane.is_empty());
}

/// The model gauges follow a change's sync at once (kube-proxy sets them at every sync), not
/// only the next periodic one; the alerting counters exist at 0 from the start, so that the
/// first failure or tampering shows in `increase()`.
#[tokio::test(start_paused = true)]
async fn model_gauges_follow_each_sync_and_alert_counters_start_at_zero() {
    let h = start(SyncTiming {
        min_sync_period: Duration::from_secs(1),
        ..SyncTiming::default()
    });
    settle().await;
    let text = encoded(&h);
    for line in [
        "kpng_sync_failures_total{backend=\"fake\"} 0",
        "kpng_tampering_detected_total{backend=\"fake\"} 0",
        "kpng_repair_delay_seconds{backend=\"fake\"} 0.0",
        "kpng_object_errors_total{kind=\"Service\"} 0",
        "kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv4\"} 0",
    ] {
        assert!(text.contains(line), "{line} missing:\n{text}");
    }
    h.tx.send(all_kinds(vec![
        service("a", "10.96.0.1"),
        service("b", "10.96.0.2"),
        slice("a-1", "10.0.0.1", None),
    ]))
    .await
    .expect("send");
    settle().await;
    let ports = |h: &Harness| {
        h.metrics
            .model_service_ports
            .get_or_create(&Family::V4.into())
            .get()
    };
    let endpoints = |h: &Harness| {
        h.metrics
            .model_endpoints
            .get_or_create(&Family::V4.into())
            .get()
    };
    assert_eq!(ports(&h), 2);
    assert_eq!(endpoints(&h), 1, "a's one endpoint");
    assert!(
        encoded(&h).contains("kpng_model_endpoints{ip_family=\"IPv4\"} 1"),
        "{}",
        encoded(&h)
    );
    h.tx.send(Event::Delete(kpng_model::ObjectRef {
        kind: Kind::Service,
        namespace: "ns".into(),
        name: "b".into(),
    }))
    .await
    .expect("send");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        log(&h).len(),
        2,
        "a partial sync, well before the periodic one"
    );
    assert_eq!(ports(&h), 1, "the gauge followed the partial sync");
    assert_eq!(endpoints(&h), 1, "b had none");
    // An endpoint change moves the endpoints, not the ports.
    h.tx.send(Event::Apply(slice("a-2", "10.0.0.2", None)))
        .await
        .expect("send");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!((ports(&h), endpoints(&h)), (1, 2));
}

fn node_state(known: bool, ips: &[&str], cidrs: &[&str]) -> kpng_model::NodeState {
    kpng_model::NodeState {
        name: "n".into(),
        known,
        ever_known: known,
        ips: ips.iter().map(|s| s.parse().expect("ip")).collect(),
        pod_cidrs: cidrs.iter().map(|s| s.parse().expect("cidr")).collect(),
        ..kpng_model::NodeState::default()
    }
}

/// Each change of the node is one line saying old → new; deletion, re-creation and the first
/// sighting are one line each, saying what they keep or bring.
#[test]
fn node_changes_say_what_changed_from_what_to_what() {
    let present = node_state(true, &["10.1.1.1"], &["10.244.1.0/24"]);
    let deleted = kpng_model::NodeState {
        known: false,
        ever_known: true,
        ips_kept: true,
        pod_cidrs_kept: true,
        ..present.clone()
    };
    let recreated = kpng_model::NodeState {
        ever_known: true,
        ..node_state(true, &["10.1.1.2"], &["10.244.1.0/24"])
    };
    let no_address = kpng_model::NodeState {
        ips_kept: true,
        ..present.clone()
    };
    let deleting = kpng_model::NodeState {
        deleting: true,
        ..present.clone()
    };
    let zoned = kpng_model::NodeState {
        zone: Some("z1".into()),
        ..present.clone()
    };
    let deleted_zoned = kpng_model::NodeState {
        zone: Some("z1".into()),
        ..deleted.clone()
    };
    let tainted = kpng_model::NodeState {
        to_be_deleted: true,
        ..present.clone()
    };
    let absent = node_state(false, &[], &[]);
    let cases: [(
        &str,
        &kpng_model::NodeState,
        &kpng_model::NodeState,
        &[&str],
    ); 12] = [
        ("nothing", &present, &present, &[]),
        (
            "deleted",
            &present,
            &deleted,
            &[
                "Node \"n\" was deleted; keeping node IPs [10.1.1.1] and pod CIDRs [10.244.1.0/24] (as kube-proxy keeps its start-up ones)",
            ],
        ),
        (
            "re-created with another IP",
            &deleted,
            &recreated,
            &[
                "Node \"n\" was re-created: node IPs [10.1.1.1] → [10.1.1.2], pod CIDRs [10.244.1.0/24], zone none",
            ],
        ),
        (
            "first sighting after the initial lists",
            &absent,
            &zoned,
            &["Node \"n\" appeared: node IPs [10.1.1.1], pod CIDRs [10.244.1.0/24], zone z1"],
        ),
        (
            "deleted with its zone",
            &zoned,
            &deleted_zoned,
            &[
                "Node \"n\" was deleted; keeping node IPs [10.1.1.1] and pod CIDRs [10.244.1.0/24] (as kube-proxy keeps its start-up ones); keeping zone z1 (topology hints still apply)",
            ],
        ),
        (
            "addresses emptied",
            &present,
            &no_address,
            &["Node \"n\" lists no InternalIP or ExternalIP any more; keeping node IPs [10.1.1.1]"],
        ),
        (
            "being deleted",
            &present,
            &deleting,
            &["Node \"n\" is being deleted; keeping node IPs [10.1.1.1] (/healthz answers 503)"],
        ),
        (
            "no longer being deleted",
            &deleting,
            &present,
            &["Node \"n\" is no longer being deleted (its deletion timestamp is gone)"],
        ),
        (
            "tainted by the autoscaler",
            &present,
            &tainted,
            &[
                "Node \"n\" has the cluster autoscaler's ToBeDeletedByClusterAutoscaler taint (/healthz answers 503, so load balancers drain it)",
            ],
        ),
        (
            "taint removed",
            &tainted,
            &present,
            &["Node \"n\" no longer has the ToBeDeletedByClusterAutoscaler taint"],
        ),
        (
            "pod CIDRs assigned",
            &node_state(true, &["10.1.1.1"], &[]),
            &present,
            &["pod CIDRs changed: [] → [10.244.1.0/24]"],
        ),
        ("zone", &present, &zoned, &["zone changed: none → z1"]),
    ];
    for (what, was, now, want) in cases {
        assert_eq!(node_changes(was, now), want, "{what}");
    }
}

/// `kpng status` names each cause of a Node problem with what it really does.
#[test]
fn node_problem_names_each_cause() {
    let wait = admin::NodeNeeds {
        primary_node_ports: Some(Duration::from_secs(30)),
        pod_cidrs: false,
    };
    let cidrs = admin::NodeNeeds {
        primary_node_ports: None,
        pod_cidrs: true,
    };
    let present = node_state(true, &["10.1.1.1"], &["10.244.1.0/24"]);
    let never = node_state(false, &[], &[]);
    let deleted = kpng_model::NodeState {
        known: false,
        ever_known: true,
        ips_kept: true,
        ..present.clone()
    };
    let all_local = kpng_model::NodeState {
        nodeports_on_all_local: true,
        ..never.clone()
    };
    let no_address = node_state(true, &[], &[]);
    let cases: [(&str, &kpng_model::NodeState, admin::NodeNeeds, Option<&str>); 7] = [
        ("fine", &present, wait, None),
        (
            "deleted: IPs kept",
            &deleted,
            wait,
            Some(
                "the Node \"n\" was deleted: /healthz answers 503; kpng keeps its last node IPs (10.1.1.1) and pod CIDRs (10.244.1.0/24) until it is back",
            ),
        ),
        (
            "misnamed, during the wait",
            &never,
            wait,
            Some(
                "no Node named \"n\" in the cluster: /healthz answers 503 and topology hints are ignored (check --hostname-override / --node-name against `kubectl get nodes`); no node IP is known (no Node, no --node-ip): NodePorts are not served yet (30s after the initial lists they are served on every local address, as kube-proxy's)",
            ),
        ),
        (
            "misnamed, node ports not on node IPs",
            &never,
            admin::NodeNeeds::default(),
            Some(
                "no Node named \"n\" in the cluster: /healthz answers 503 and topology hints are ignored (check --hostname-override / --node-name against `kubectl get nodes`)",
            ),
        ),
        (
            "misnamed, after the wait",
            &all_local,
            wait,
            Some(
                "no Node named \"n\" in the cluster: /healthz answers 503 and topology hints are ignored (check --hostname-override / --node-name against `kubectl get nodes`); no node IP is known (no Node, no --node-ip): NodePorts are served on every local address, as kube-proxy's (on the node IPs once known)",
            ),
        ),
        (
            "no addresses",
            &no_address,
            wait,
            Some(
                "the Node lists no InternalIP or ExternalIP and there is no --node-ip: NodePorts are not served yet (30s after the initial lists they are served on every local address, as kube-proxy's)",
            ),
        ),
        (
            "NodeCIDR without podCIDRs",
            &no_address,
            cidrs,
            Some(
                "--detect-local-mode NodeCIDR and the Node has no spec.podCIDRs: the first sync is held until it has them, so nothing is programmed yet (kube-proxy waits for them too, then refuses to start)",
            ),
        ),
    ];
    for (what, node, needs, want) in cases {
        assert_eq!(admin::node_problem(node, needs).as_deref(), want, "{what}");
    }
}

/// Health checks on the node IPs are never served while the NodePorts are not (no node IP,
/// before the wait ends): a 200 would draw traffic the node drops.
#[test]
fn health_checks_are_not_served_where_node_ports_are_not() {
    let ip = |s: &str| -> std::net::IpAddr { s.parse().expect("ip") };
    let with_ip = node_state(true, &["10.1.1.1"], &[]);
    let without = node_state(false, &[], &[]);
    let all_local = kpng_model::NodeState {
        nodeports_on_all_local: true,
        ..without.clone()
    };
    let every = vec![ip("0.0.0.0"), ip("::")];
    let cases = [
        (
            "node IPs (IPv4 only: IPv6 on every address, as its node ports)",
            HealthCheckAddresses::NodeIps,
            &with_ip,
            Some(vec![ip("10.1.1.1"), ip("::")]),
        ),
        (
            "no node IP: none",
            HealthCheckAddresses::NodeIps,
            &without,
            None,
        ),
        (
            "no node IP after the wait: all",
            HealthCheckAddresses::NodeIps,
            &all_local,
            Some(every.clone()),
        ),
        (
            "all addresses",
            HealthCheckAddresses::All,
            &without,
            Some(every.clone()),
        ),
    ];
    for (what, addresses, node, want) in cases {
        let mut listen = crate::service_health::ListenAddresses::new(addresses)
            .with_local_addresses(Box::new(Vec::new));
        let got =
            (!listen.serves_nothing(node)).then(|| listen.at_sync(&Family::ALL, &node.ips, true).0);
        assert_eq!(got, want, "{what}");
    }
}

/// [`start`] with `customize` applied to the runner (node needs).
fn start_customized(customize: impl FnOnce(Runner<Model>) -> Runner<Model>) -> Harness {
    start_full(
        SyncTiming::default(),
        None,
        None,
        Kept::default(),
        None,
        customize,
    )
}

fn node_object(value: serde_json::Value) -> Object {
    kpng_k8s::from_json::<k8s_openapi::api::core::v1::Node>(value)
        .expect("node")
        .object
}

/// With no node IP, the wait ends 30 s after the initial lists: NodePorts then go to every
/// local address (a node sync), and once an IP appears, to it only.
#[tokio::test(start_paused = true)]
async fn the_wait_for_node_ips_ends_with_node_ports_on_every_local_address() {
    let h = start_customized(|r| r.with_node_ips_wait(Duration::from_secs(30)));
    h.tx.send(all_kinds(vec![node_object(
        json!({"metadata": {"name": "n"}, "status": {"addresses": [{"type": "Hostname", "address": "n"}]}}),
    )]))
    .await
    .expect("send");
    settle().await;
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert!(
        status_of(&h)
            .await
            .node_problem
            .unwrap_or_default()
            .contains("NodePorts are not served yet"),
    );
    let syncs = log(&h).len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let status = status_of(&h).await;
    assert!(
        status
            .node_problem
            .unwrap_or_default()
            .contains("NodePorts are served on every local address"),
    );
    assert_eq!(log(&h).len(), syncs + 1, "the node change is synced");
    h.tx.send(Event::Apply(node_object(
        json!({"metadata": {"name": "n"}, "status": {"addresses": [{"type": "InternalIP", "address": "10.1.1.1"}]}}),
    )))
    .await
    .expect("send");
    settle().await;
    let status = status_of(&h).await;
    assert_eq!(status.node_problem, None);
    assert_eq!(status.node_ips, ["10.1.1.1"]);
}

/// In NodeCIDR mode nothing is programmed before the Node has podCIDRs (as kube-proxy).
#[tokio::test(start_paused = true)]
async fn node_cidr_mode_holds_the_first_sync_until_the_node_has_pod_cidrs() {
    let h = start_customized(|r| r.requiring_pod_cidrs());
    h.tx.send(all_kinds(vec![
        service("a", "10.96.0.1"),
        node_object(json!({"metadata": {"name": "n"}})),
    ]))
    .await
    .expect("send");
    settle().await;
    // Nothing is programmed: /healthz says so at once, not after the health timeout.
    let healthz = |h: &Harness| h.health.report(SystemTime::now(), true).status;
    assert_eq!(healthz(&h), 503, "/healthz while held for pod CIDRs");
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(log(&h).is_empty(), "synced without pod CIDRs");
    let problem = status_of(&h).await.node_problem.unwrap_or_default();
    assert!(
        problem.contains("no spec.podCIDRs: the first sync is held until it has them"),
        "{problem}"
    );
    // A trace says that none of it is in the kernel yet, and that the answer may change
    // with the podCIDRs (not that it is what kpng will program).
    let traced = h
        .admin
        .trace(kpng_model::trace::TraceQuery {
            from: "10.0.0.1".parse().expect("ip"),
            to: "10.96.0.1:80".parse().expect("addr"),
            protocol: kpng_model::Protocol::Tcp,
            in_interface: None,
        })
        .await
        .expect("trace");
    assert_eq!(
        traced.first_sync_held.as_deref(),
        Some(
            "nothing is programmed yet: the first sync is held until Node \"n\" has \
             spec.podCIDRs (--detect-local-mode NodeCIDR; kube-proxy waits for them too); this \
             answer is from what kpng knows now and may change when they arrive (which clients \
             are local to this node, hence masqueraded, follows them)"
        )
    );
    h.tx.send(Event::Apply(node_object(
        json!({"metadata": {"name": "n"}, "spec": {"podCIDRs": ["10.244.1.0/24"]}}),
    )))
    .await
    .expect("send");
    settle().await;
    assert_eq!(
        log(&h).len(),
        1,
        "the first sync, once the pod CIDRs are known"
    );
    let status = status_of(&h).await;
    assert_eq!(status.node_problem, None);
    assert_eq!(status.pod_cidrs, ["10.244.1.0/24"]);
    assert_eq!(healthz(&h), 200, "/healthz once synced");
    let traced = h
        .admin
        .trace(kpng_model::trace::TraceQuery {
            from: "10.0.0.1".parse().expect("ip"),
            to: "10.96.0.1:80".parse().expect("addr"),
            protocol: kpng_model::Protocol::Tcp,
            in_interface: None,
        })
        .await
        .expect("trace");
    assert_eq!(traced.first_sync_held, None, "synced");
}

/// The note of a trace while the first sync is held names what is missing (the lists, the
/// brain's first state on a brain-fed node, or the Node's podCIDRs) and says the answer may
/// change when it arrives; nothing once nothing holds the sync.
#[test]
fn a_held_first_syncs_trace_note_names_what_is_missing() {
    let lists = [Kind::Service, Kind::EndpointSlice, Kind::Node];
    /// Missing lists, fed by a brain, held for this Node's podCIDRs, the note.
    type Case<'a> = (&'a [Kind], bool, Option<&'a str>, Option<&'a str>);
    let cases: [Case<'_>; 5] = [
        (
            &lists,
            false,
            None,
            Some(
                "nothing is programmed yet: the first sync is held until the lists of Service, \
                 EndpointSlice, Node are complete; this answer is from what kpng knows now and \
                 may change when they are",
            ),
        ),
        (
            &lists,
            true,
            None,
            Some(
                "nothing is programmed yet: the first sync is held until the brain's first \
                 state arrives; this answer is from what kpng knows now and may change when it \
                 does",
            ),
        ),
        (
            &[],
            false,
            Some("n"),
            Some(
                "nothing is programmed yet: the first sync is held until Node \"n\" has \
                 spec.podCIDRs (--detect-local-mode NodeCIDR; kube-proxy waits for them too); \
                 this answer is from what kpng knows now and may change when they arrive (which \
                 clients are local to this node, hence masqueraded, follows them)",
            ),
        ),
        // A brain-fed node that has its state waits for the podCIDRs as any other.
        (
            &[],
            true,
            Some("n"),
            Some(
                "nothing is programmed yet: the first sync is held until Node \"n\" has \
                 spec.podCIDRs (--detect-local-mode NodeCIDR; kube-proxy waits for them too); \
                 this answer is from what kpng knows now and may change when they arrive (which \
                 clients are local to this node, hence masqueraded, follows them)",
            ),
        ),
        (&[], false, None, None),
    ];
    for (missing, brain, pod_cidrs_of, want) in cases {
        assert_eq!(
            first_sync_held_note(missing, brain, pod_cidrs_of).as_deref(),
            want,
            "{missing:?} brain={brain} {pod_cidrs_of:?}"
        );
    }
}

#[test]
fn a_held_first_syncs_note_says_when_an_earlier_runs_rules_still_route() {
    let note = first_sync_held_note(&[Kind::Service], true, None).expect("a note");
    assert_eq!(
        earlier_rules_note(&note),
        "kpng has programmed nothing yet, but the rules an earlier run of kpng left are still \
         in place and route traffic as they did (this answer does not show them): the first \
         sync is held until the brain's first state arrives; this answer is from what kpng \
         knows now and may change when it does"
    );
}

/// A Node deleted while its IPs are kept changes nothing programmed: no sync for a backend
/// that programs the data plane, and an empty one, soon, for a sink that shows the node's
/// status (`to-file`'s `node:` block), whose dump would otherwise say the Node exists until
/// the periodic sync.
#[tokio::test(start_paused = true)]
async fn a_status_only_node_change_is_synced_only_where_the_status_is_shown() {
    for shows in [false, true] {
        let h = start(SyncTiming::default());
        h.calls.shows_node_status.store(shows, Ordering::SeqCst);
        h.tx.send(all_kinds(vec![
            service("a", "10.96.0.1"),
            node_object(json!({"metadata": {"name": "n"},
                "status": {"addresses": [{"type": "InternalIP", "address": "10.1.1.1"}]}})),
        ]))
        .await
        .expect("send");
        settle().await;
        assert_eq!(log(&h).len(), 1, "the first sync (shows status: {shows})");
        h.tx.send(Event::Delete(kpng_model::ObjectRef {
            kind: Kind::Node,
            namespace: "".into(),
            name: "n".into(),
        }))
        .await
        .expect("send");
        // Well past min-sync-period, well before the periodic sync.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let syncs = log(&h);
        if shows {
            assert_eq!(syncs.len(), 2, "an empty sync shows the deleted Node");
            assert_eq!(syncs[1], (false, 0, 1), "nothing changed but the status");
        } else {
            assert_eq!(syncs.len(), 1, "nothing to program: no sync");
        }
        assert_eq!(
            h.health.report(SystemTime::now(), true).status,
            503,
            "/healthz follows the deletion either way"
        );
    }
}

/// The first sync after the backend adopted an earlier run's rules says what the rules hold
/// now and that the others went, not the empty model's diff ("no Service port changed" for a
/// sync that emptied the table, "N added" for ports already there).
#[tokio::test(start_paused = true)]
async fn the_first_sync_after_adopting_earlier_rules_says_what_it_did() {
    for (objects, want) in [
        (
            Vec::new(),
            "first sync after adopting the rules an earlier kpng left: they now hold no Service \
             port (how many Services the earlier rules held is not known: they were adopted \
             without being read)",
        ),
        (
            vec![service("a", "10.96.0.1"), service("b", "10.96.0.2")],
            "first sync after adopting the rules an earlier kpng left: they now hold 2 Service \
             ports of 2 Services and no other Service's (how many Services the earlier rules \
             held is not known: they were adopted without being read)",
        ),
    ] {
        let h = start_full(SyncTiming::default(), None, None, None, None, |r| {
            r.with_earlier_rules(true)
        });
        h.tx.send(all_kinds(objects)).await.expect("send");
        settle().await;
        let status = status_of(&h).await;
        assert_eq!(status.recent_syncs[0].changes, want);
    }
}

/// A first sync that fails after the backend found an earlier kpng's rules leaves them in
/// place: the status keeps saying so, and the retry that succeeds is still the sync that
/// adopts them, and says so (it read as a plain full sync, "1 added", before).
#[tokio::test(start_paused = true)]
async fn a_failed_first_sync_over_earlier_rules_is_retried_as_their_adoption() {
    let h = start_full(
        SyncTiming {
            min_sync_period: Duration::ZERO,
            ..SyncTiming::default()
        },
        None,
        None,
        None,
        None,
        |r| r.with_earlier_rules(true),
    );
    h.calls.fail.store(true, Ordering::SeqCst);
    first_state_with_one_service(&h).await;
    let failed = status_of(&h).await;
    assert!(!failed.last_sync.expect("a sync").ok);
    assert!(
        failed.earlier_rules_in_place,
        "the failed sync replaced nothing"
    );
    h.calls.fail.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let status = status_of(&h).await;
    let last = status.last_sync.expect("a sync");
    assert!(last.ok);
    assert_eq!(
        last.changes,
        "first sync after adopting the rules an earlier kpng left (a retry: the first attempt \
         failed): they now hold 1 Service port of 1 Service and no other Service's (how many \
         Services the earlier rules held is not known: they were adopted without being read)"
    );
    assert!(!status.earlier_rules_in_place, "replaced now");
}

/// A NodePort Service `name` at `ip` with node port `node_port`.
fn node_port_service(name: &str, ip: &str, node_port: u16) -> Object {
    kpng_k8s::from_json::<k8s_openapi::api::core::v1::Service>(json!({
        "metadata": {"namespace": "ns", "name": name},
        "spec": {"type": "NodePort", "clusterIP": ip,
            "ports": [{"name": "p", "port": 80, "nodePort": node_port}]}}))
    .expect("service")
    .object
}

/// The value of the sample `series` (`name{labels}`) in `text`, if exported.
fn sample(text: &str, series: &str) -> Option<i64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// A value dropped from an object in use (a node port another Service holds) and a node check
/// that fails (IP forwarding off) are gauges an alert can use: until 2026-12-07 only a warning
/// and `kpng status` said so (`kpng_input_problems` stayed 0, no metric for either).
#[tokio::test(start_paused = true)]
async fn dropped_values_and_node_check_problems_are_gauges() {
    use crate::host_check::{HostFacts, HostNeeds, HostProbe};
    let facts = HostFacts {
        forwarding: [(Family::V4, false), (Family::V6, true)].into(),
        br_netfilter_loaded: true,
        bridge_nf_call: [(Family::V4, true), (Family::V6, true)].into(),
        ..HostFacts::default()
    };
    let probe: HostProbe = Arc::new(move || facts.clone());
    let needs = HostNeeds {
        forwarding: true,
        bridge_netfilter: true,
    };
    let h = start_full(prompt_timing(), None, None, None, None, |r| {
        r.checking_host(probe, needs)
    });
    h.tx.send(all_kinds(vec![
        node_port_service("a", "10.96.0.1", 30080),
        node_port_service("b", "10.96.0.2", 30080),
    ]))
    .await
    .expect("send");
    settle().await;
    let text = encoded(&h);
    assert_eq!(sample(&text, "kpng_dropped_values"), Some(1), "{text}");
    let check = |name: &str| format!("kpng_node_check_problems{{check=\"{name}\"}}");
    let checks: Vec<(&str, Option<i64>)> = [
        "net.ipv4.ip_forward",
        "net.ipv6.conf.all.forwarding",
        "br_netfilter",
        "net.bridge.bridge-nf-call-iptables",
        "net.bridge.bridge-nf-call-ip6tables",
    ]
    .into_iter()
    .map(|c| (c, sample(&text, &check(c))))
    .collect();
    assert_eq!(
        checks,
        [
            ("net.ipv4.ip_forward", Some(1)),
            ("net.ipv6.conf.all.forwarding", Some(0)),
            ("br_netfilter", Some(0)),
            ("net.bridge.bridge-nf-call-iptables", Some(0)),
            ("net.bridge.bridge-nf-call-ip6tables", Some(0)),
        ],
        "{text}"
    );
    // The Service holding the port goes: the other one has it, nothing is dropped.
    h.tx.send(Event::Delete(kpng_model::ObjectRef {
        kind: Kind::Service,
        namespace: "ns".into(),
        name: "a".into(),
    }))
    .await
    .expect("send");
    settle().await;
    let text = encoded(&h);
    assert_eq!(sample(&text, "kpng_dropped_values"), Some(0), "{text}");
}
