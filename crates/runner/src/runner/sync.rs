//! One sync of the backend, in named steps: what it carries ([`SyncPlan`]), the backend call,
//! what every attempt records, then a success's or a failure's bookkeeping and log, and what
//! follows a successful one (health checks, conntrack).
//!
//! Why its own module: the sync was one function of ~300 lines; each step here says what it
//! keeps and why, and the loop ([`super::LoopState::run`]) only calls [`LoopState::sync`].

use std::time::{Duration, SystemTime};

use kpng_backend::{BackendError, NodeModel, SyncRequest, SyncStats};
use kpng_model::{Diff, DiffSummary, Family};
use tokio::time::Instant;
use tracing::{debug, error, info};

use super::{
    LARGE_FIRST_SYNC, LoopState, SyncReport, adoption_changes, changed_services, count_changes,
    count_model, repair_changes, unix_seconds,
};
use crate::admin::{self, RepairStatus, SyncStatus};
use crate::metrics::{BackendLabel, FamilyLabel};

/// Syncs failing in a row: when it began and how many failed, for the line that says it is
/// over (an error line each time, and without this nothing said when they succeeded again).
#[derive(Debug, Clone)]
pub(super) struct Failing {
    /// When the first failed sync ended.
    pub(super) since: SystemTime,
    /// How many syncs failed since.
    pub(super) failures: u32,
}

impl Failing {
    /// The line the first successful sync after them logs.
    pub(super) fn over(&self, now: SystemTime) -> String {
        let syncs = if self.failures == 1 {
            "1 failure".to_string()
        } else {
            format!("{} failures", self.failures)
        };
        format!(
            "syncs succeed again after {syncs} (failing for {}), the problem is over",
            kpng_model::input::lasted(self.since, now)
        )
    }
}

/// What one sync carries, decided before the backend is called ([`LoopState::plan_sync`]).
struct SyncPlan {
    /// When the sync started (the loop's clock).
    now: Instant,
    /// No sync ran before this one: always logged at info level.
    first: bool,
    /// A full sync: the backend reprograms everything.
    full: bool,
    /// What the backend gets: the pending changes, or every port on a full sync.
    diff: Diff,
    /// On a full sync, the changes it takes (with those of failed syncs), kept in case it
    /// fails: the sync that programs them names them. `None` while no sync succeeded (then
    /// every port is a change, and the full diff says so).
    taken: Option<Diff>,
    /// The counts of the changes taken, for the log line.
    summary: DiffSummary,
    /// The log line's and the history's text of what changed.
    changes: String,
    /// What someone else changed that this full sync repairs (reported before the sync).
    repairing: Option<String>,
    /// The node's own addresses or status changed: the sync is logged at info level.
    node_changed: bool,
    /// The Services the changes touched, for the debug line that names them.
    changed_names: Vec<String>,
    /// The model's Service ports, for the log line.
    ports_total: usize,
}

impl<M: NodeModel> LoopState<M> {
    /// Syncs the backend once, as the loop's deadline says: plans the sync, calls the
    /// backend, records the attempt and its outcome, then serves what follows a success.
    pub(super) async fn sync(&mut self) {
        let now = Instant::now();
        self.end_backoff_if_quiet(now);
        crate::warning_budget::held_back(self.warnings.next_interval());
        self.log_held_syncs(now);
        let mut plan = self.plan_sync(now);
        let (result, duration) = self.call_backend(&plan);
        // The families whose rules stayed in place through this sync (the first one after a
        // restart that adopted the last run's table).
        #[cfg(target_os = "linux")]
        let kept_rules = result
            .as_ref()
            .map(crate::conntrack_cleanup::KeptRules::of)
            .unwrap_or_default();
        let wall = self.record_attempt(&plan, duration, &result);
        let (report, repaired) = match result {
            Ok(stats) => self.sync_succeeded(&mut plan, stats, duration, wall),
            Err(e) => (self.sync_failed(&mut plan, &e, duration), false),
        };
        let ok = report.ok;
        self.record_status(&report, plan.changes, repaired);
        self.runner.reports.send_replace(Some(report));
        if ok {
            self.sync_service_health(&plan.diff, plan.full).await;
            // Once the data plane has changed: a client's next packet follows the new rules.
            #[cfg(target_os = "linux")]
            if let Some(conntrack) = &mut self.runner.conntrack {
                if repaired {
                    conntrack.rules_were_missing();
                }
                conntrack.after_sync(
                    &self.families,
                    &plan.diff,
                    self.runner.model.snapshot(),
                    plan.full,
                    &kept_rules,
                );
            }
        }
    }

    /// The summary of the routine syncs the last minute logged at debug level only, once that
    /// minute is over ([`crate::sync_log`]): the info log still counts what it did not show.
    fn log_held_syncs(&mut self, now: Instant) {
        if let Some(held) = self.sync_log.roll(now.into_std()) {
            info!(
                backend = %self.runner.backend.name(),
                syncs = held.syncs,
                "{}",
                held.describe()
            );
        }
    }

    /// Decides what this sync carries: full or not, the diff (taking every pending change,
    /// and those failed syncs took and did not program) and the text that says what changed. Reads
    /// the host's settings when the sync is full or periodic, the syncs that look again.
    fn plan_sync(&mut self, now: Instant) -> SyncPlan {
        let timing = self.runner.timing;
        let first = self.last_sync.is_none();
        let full_due = self.last_full.is_some_and(|t| {
            !timing.full_sync_period.is_zero() && now >= t + timing.full_sync_period
        });
        let full = self.need_full || full_due;
        if full || self.pending.is_empty() {
            self.check_host();
        }
        let snapshot = self.runner.model.snapshot();
        // What this sync carries, for its log line: the changes since the last successful
        // sync (a full sync reprograms everything, but the operator asks what changed), those
        // failed syncs took included: they are not programmed yet either, and this sync is the
        // one that programs them. A full sync keeps them beside its diff of every port only
        // once a sync succeeded: before, both are as large as the cluster (~3 MB at 30k
        // Services), the full diff says the same (every port added), and only one need be
        // alive at the peak.
        let mut pending = std::mem::take(&mut self.pending);
        let carried = self.failing.as_ref().map_or(0, |f| f.failures);
        if let Some(mut unsynced) = self.unsynced.take() {
            unsynced.merge(pending);
            pending = unsynced;
        }
        let changed_names = changed_services(&pending);
        // The families the node programmed ports of at the last sync: on a node serving both,
        // the line names each change's family once both are in use (a migration under way).
        let programmed: Vec<Family> = self
            .model_counts
            .iter()
            .filter(|(_, c)| c.ports > 0)
            .map(|(family, _)| *family)
            .collect();
        let (diff, taken, summary) = if full {
            let full_diff = Diff::full(snapshot);
            if self.last_ok_at.is_some() {
                let summary = DiffSummary::of_node(&pending, &self.families, &programmed);
                (full_diff, Some(pending), summary)
            } else if carried > 0 {
                // Nothing programmed yet after a failed sync: every port is a change.
                drop(pending);
                let summary = DiffSummary::of_node(&full_diff, &self.families, &programmed);
                (full_diff, None, summary)
            } else {
                let summary = DiffSummary::of_node(&pending, &self.families, &programmed);
                drop(pending);
                (full_diff, None, summary)
            }
        } else {
            let summary = DiffSummary::of_node(&pending, &self.families, &programmed);
            (pending, None, summary)
        };
        // A full sync repairs what someone else changed; the sync says so (its changes alone
        // would read "no Service port changed").
        let repairing = if full { self.repair_for.clone() } else { None };
        let mut changes = match &repairing {
            Some(what) => repair_changes(what, &summary),
            // The model started empty: its diff would read "no Service port changed" for a
            // sync that emptied a table of thousands, and "N added" for ports already there.
            None if self.earlier_rules_in_place() => adoption_changes(snapshot, carried),
            None => summary.to_string(),
        };
        // The adoption's text says what the rules hold now, and the failed attempts already.
        if carried > 0 && !(repairing.is_none() && self.earlier_rules_in_place()) {
            let syncs = if carried == 1 {
                "the failed sync".to_string()
            } else {
                format!("the {carried} failed syncs")
            };
            changes.push_str(&format!(" (including the changes of {syncs} before it)"));
        }
        // A change of the node's own is always logged at info level.
        let mut node_changed = false;
        if let Some(addresses) = self.addresses_changed.take() {
            changes.push_str(&format!("; the node's addresses changed ({addresses})"));
            node_changed = true;
        }
        if std::mem::take(&mut self.node_status_changed) {
            changes.push_str("; the node's status changed");
            node_changed = true;
        }
        let ports_total = snapshot.ports.len();
        SyncPlan {
            now,
            first,
            full,
            diff,
            taken,
            summary,
            changes,
            repairing,
            node_changed,
            changed_names,
            ports_total,
        }
    }

    /// Calls the backend with the plan, timed. A large first sync is announced first (it may
    /// take seconds), and the conntrack cleanup notes what the rules held before they change.
    fn call_backend(&mut self, plan: &SyncPlan) -> (Result<SyncStats, BackendError>, Duration) {
        let snapshot = self.runner.model.snapshot();
        if plan.first && plan.ports_total >= LARGE_FIRST_SYNC {
            info!("first sync: programming {} Service ports", plan.ports_total);
        }
        #[cfg(target_os = "linux")]
        if let Some(conntrack) = &mut self.runner.conntrack {
            conntrack.before_sync(&self.families, &plan.diff, snapshot, plan.full);
        }
        let started = std::time::Instant::now();
        let result = self.runner.backend.sync(&SyncRequest {
            diff: &plan.diff,
            snapshot,
            full: plan.full,
        });
        (result, started.elapsed())
    }

    /// The backend's label for the sync metrics.
    fn backend_label(&self) -> BackendLabel {
        BackendLabel {
            backend: self.runner.backend.name().to_string(),
        }
    }

    /// What every attempt records, failed or not (kube-proxy observes in a defer): the
    /// pending changes are taken, the duration observed, each family programmed or still
    /// queued for `/healthz`, and a sync that wrote holds the next one back
    /// (`min_sync_period`). Returns the wall-clock time the families were marked with.
    fn record_attempt(
        &mut self,
        plan: &SyncPlan,
        duration: Duration,
        result: &Result<SyncStats, BackendError>,
    ) -> SystemTime {
        self.generation += 1;
        self.last_sync = Some(plan.now);
        let m = &self.runner.metrics;
        // The pending changes are taken by a successful sync only: a failed one leaves them
        // pending, so that `kubeproxy_sync_proxy_rules_*_changes_pending` and `kpng status`
        // say that they are not programmed (kube-proxy zeroes them at every attempt).
        if result.is_ok() {
            self.pending_services.clear();
            self.pending_endpoints = 0;
            m.service_changes_pending.set(0);
            m.endpoint_changes_pending.set(0);
        }
        // Every attempt is timed, a failed one too (kube-proxy observes in a defer).
        for family in &self.families {
            let label: FamilyLabel = (*family).into();
            m.sync_duration
                .get_or_create(&label)
                .observe(duration.as_secs_f64());
            let by_kind = if plan.full {
                &m.full_sync_duration
            } else {
                &m.partial_sync_duration
            };
            by_kind
                .get_or_create(&label)
                .observe(duration.as_secs_f64());
        }
        let wall = SystemTime::now();
        // The families this sync programmed: all of them, or those a failure did not name
        // (each family is synced on its own, as kube-proxy's proxiers are).
        let failed: Vec<Family> = match result {
            Ok(_) => Vec::new(),
            Err(e) => e
                .failed_families()
                .map(<[Family]>::to_vec)
                .unwrap_or_else(|| self.families.clone()),
        };
        for family in &self.families {
            if failed.contains(family) {
                // Not programmed: as a change kube-proxy queued and could not apply, `/healthz`
                // and `/livez` fail if no sync succeeds within the health timeout.
                self.runner.health.queued(*family, wall);
            } else {
                m.last_sync_timestamp
                    .get_or_create(&(*family).into())
                    .set(unix_seconds(wall));
                self.runner.health.programmed(*family, wall);
            }
        }
        // A full sync rewrites the backend's tables whatever it counts (nftables counts the
        // elements, not the skeleton it commits), and a failed one may have written part.
        let wrote = match result {
            Ok(stats) => plan.full || stats.operations > 0,
            Err(_) => true,
        };
        if wrote {
            self.last_write = Some(plan.now);
        }
        wall
    }

    /// A successful sync: counts what it programmed, ends any retry, books a repair and logs
    /// it. Returns its report and whether it put back what someone else changed.
    fn sync_succeeded(
        &mut self,
        plan: &mut SyncPlan,
        mut stats: SyncStats,
        duration: Duration,
        wall: SystemTime,
    ) -> (SyncReport, bool) {
        self.record_programmed(plan, &stats, wall);
        if plan.full {
            self.pending = Diff::default();
            self.last_full = Some(plan.now);
        }
        self.need_full = false;
        self.retry_at = None;
        self.retry_delay = Duration::ZERO;
        self.unsynced = None;
        if let Some(failing) = self.failing.take() {
            info!(
                backend = %self.runner.backend.name(),
                failures = failing.failures,
                "{}",
                failing.over(wall)
            );
        }
        let repaired = self.note_repair(plan, stats.repaired.take(), wall);
        self.log_synced(plan, stats.operations, duration, repaired);
        let report = SyncReport {
            generation: self.generation,
            ok: true,
            full: plan.full,
            operations: stats.operations,
            duration,
            error: None,
        };
        (report, repaired)
    }

    /// The metrics of what a successful sync programmed: its operations, how long each
    /// endpoint change took to reach the data plane, and the model gauges.
    fn record_programmed(&mut self, plan: &SyncPlan, stats: &SyncStats, wall: SystemTime) {
        let backend = self.backend_label();
        let m = &self.runner.metrics;
        m.sync_operations
            .get_or_create(&backend)
            .inc_by(stats.operations as u64);
        // Programmed now: how long since each endpoint change was triggered.
        for trigger in std::mem::take(&mut self.pending_triggers) {
            if self.families.contains(&trigger.family) {
                let latency = wall.duration_since(trigger.at).unwrap_or_default();
                m.network_programming_duration
                    .get_or_create(&trigger.family.into())
                    .observe(latency.as_secs_f64());
            }
        }
        // Counted over every Service port at full and periodic syncs; a change's sync
        // moves them by what it changed, so they never lag (kube-proxy sets them at
        // every sync).
        if plan.full || plan.diff.is_empty() {
            self.model_counts = count_model(self.runner.model.snapshot(), &self.families);
        } else {
            count_changes(&mut self.model_counts, &plan.diff);
        }
        self.record_model_gauges();
    }

    /// Books the repair a successful sync made, if any: the one scheduled after a tampering
    /// report, or one the backend found itself (no alarm before the sync), which counts as
    /// tampering detected and renames the sync's changes. Returns whether it repaired.
    fn note_repair(
        &mut self,
        plan: &mut SyncPlan,
        found: Option<String>,
        wall: SystemTime,
    ) -> bool {
        let repairing = match (plan.repairing.take(), found) {
            (Some(what), _) => Some(what),
            (None, Some(found)) => {
                let backend = self.backend_label();
                self.runner
                    .metrics
                    .tampering_detected
                    .get_or_create(&backend)
                    .inc();
                plan.changes = repair_changes(&found, &plan.summary);
                Some(found)
            }
            (None, None) => None,
        };
        let Some(what) = repairing else {
            return false;
        };
        self.repair_for = None;
        self.repair_since = None;
        let repairs = self.repairs.get_or_insert_with(RepairStatus::default);
        repairs.count += 1;
        repairs.last_at = admin::rfc3339(wall);
        repairs.last_change = what;
        true
    }

    /// The `synced` line of a successful sync. A change is logged even when the backend
    /// counted no operation for it (a sync that empties the node rebuilds the table with
    /// nothing in it); the first sync, full ones, repairs, node changes and slow syncs always
    /// at info level, routine ones within the minute's budget ([`crate::sync_log`]).
    fn log_synced(
        &mut self,
        plan: &SyncPlan,
        operations: usize,
        duration: Duration,
        repaired: bool,
    ) {
        let backend = self.runner.backend.name();
        if operations == 0 && !plan.full && plan.diff.is_empty() && !repaired {
            debug!(backend = %backend, ?duration, "periodic sync, nothing to change");
            return;
        }
        let routine = !plan.first
            && !plan.full
            && !repaired
            && !plan.node_changed
            && duration < crate::sync_log::SLOW;
        let shown = !routine
            || self.sync_log.admit(
                plan.now.into_std(),
                duration,
                operations,
                plan.diff.changes.keys().map(|k| k.service.to_string()),
            );
        synced_line!(
            shown,
            backend = %backend,
            full = plan.full,
            ports = plan.ports_total,
            operations,
            ?duration,
            duration_ms = crate::sync_log::log_millis(duration),
            changes = %plan.changes,
        );
        if !plan.changed_names.is_empty() {
            debug!("synced Services: {}", plan.changed_names.join(", "));
        }
    }

    /// A failed sync: the next one is full, after a backoff that doubles up to
    /// `sync_period`, and the error (with advice when it is out of descriptors) is kept for
    /// `kpng status`.
    fn sync_failed(
        &mut self,
        plan: &mut SyncPlan,
        e: &BackendError,
        duration: Duration,
    ) -> SyncReport {
        let timing = self.runner.timing;
        let backend = self.backend_label();
        self.runner
            .metrics
            .sync_failures
            .get_or_create(&backend)
            .inc();
        self.need_full = true;
        // What it took is still to program: the next sync carries it (and names it).
        self.unsynced = if plan.full {
            plan.taken.take()
        } else {
            Some(std::mem::take(&mut plan.diff))
        };
        let failing = self.failing.get_or_insert(Failing {
            since: SystemTime::now(),
            failures: 0,
        });
        failing.failures += 1;
        self.retry_delay = if self.retry_delay.is_zero() {
            timing.min_sync_period.max(Duration::from_millis(500))
        } else {
            (self.retry_delay * 2).min(timing.sync_period)
        };
        self.retry_at = Some(plan.now + self.retry_delay);
        // Out of descriptors (a low `ulimit -n`): the message says what to raise.
        let message = crate::open_files::with_advice(e.to_string());
        error!(backend = %backend.backend, retry_in = ?self.retry_delay, "sync failed, will retry with a full sync: {message}");
        self.last_error = Some(message);
        SyncReport {
            generation: self.generation,
            ok: false,
            full: plan.full,
            operations: 0,
            duration,
            error: self.last_error.clone(),
        }
    }

    /// The sync as `kpng status` shows it: the last one always, and in the history those
    /// that did something, failed or repaired.
    fn record_status(&mut self, report: &SyncReport, changes: String, repaired: bool) {
        let ended = SystemTime::now();
        let status = SyncStatus {
            at: admin::rfc3339(ended),
            ok: report.ok,
            full: report.full,
            operations: report.operations,
            duration_seconds: report.duration.as_secs_f64(),
            changes,
            error: (!report.ok).then(|| self.last_error.clone()).flatten(),
        };
        if !report.ok || report.full || report.operations > 0 || repaired {
            self.sync_history.push_front(status.clone());
            self.sync_history.truncate(admin::SYNC_HISTORY);
        }
        self.last_sync_status = Some(status);
        if report.ok {
            self.last_ok_at = Some(ended);
            self.last_error = None;
        }
    }
}
