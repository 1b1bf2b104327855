//! UDP conntrack cleanup after each successful sync, for backends that program the node.
//!
//! The decision of *what* is stale and *how* to read the table lives in `kpng-conntrack`;
//! this step decides *when* to run a pass (after a sync that [`pass_needed`], and again after
//! any failed pass), keeps kube-proxy's metrics and logs. Errors never stop the sync loop.

use std::collections::BTreeSet;

use kpng_conntrack::{Reconciler, pass_needed};
use kpng_model::{Diff, Family, Snapshot};
use tracing::{debug, info, warn};

use crate::metrics::{FamilyLabel, ProxyMetrics};

/// The post-sync step around a [`Reconciler`].
#[derive(Debug)]
pub struct ConntrackCleanup {
    reconciler: Reconciler,
    /// Families whose last pass failed: their next pass runs after the next sync, whatever
    /// that sync changed.
    retry: BTreeSet<Family>,
    metrics: ProxyMetrics,
}

impl ConntrackCleanup {
    /// Wraps a reconciler; results go to `metrics`.
    pub fn new(reconciler: Reconciler, metrics: ProxyMetrics) -> ConntrackCleanup {
        ConntrackCleanup {
            reconciler,
            retry: BTreeSet::new(),
            metrics,
        }
    }

    /// After a sync that repaired what someone else changed (a table flushed or deleted by a
    /// firewall reload, say): until the repair, the node may have had no rule for any
    /// frontend, and clients' packets to them went un-DNATed. Every frontend is read whole
    /// by the repair's pass (a full sync always runs one), as after a start-up.
    pub fn rules_were_missing(&mut self) {
        self.reconciler.forget_checked();
    }

    /// Runs the passes a successful sync calls for: per family, when the sync was full, when
    /// it changed a UDP port in a way that can strand entries, or when the last pass failed.
    /// Each pass sees every Service port of its family in `snapshot`. Before that, whatever
    /// the sync, the frontends it took out of the rules are forgotten as checked
    /// ([`Reconciler::forget_gone`]), so that they are read whole if they come back.
    pub fn after_sync(
        &mut self,
        families: &[Family],
        diff: &Diff,
        snapshot: &Snapshot,
        full: bool,
    ) {
        for &family in families {
            self.reconciler.forget_gone(family, diff);
            if !self.retry.contains(&family) && !pass_needed(family, diff, full) {
                continue;
            }
            let label = FamilyLabel::from(family);
            let ports = snapshot.family(family).map(|p| &**p);
            match self.reconciler.reconcile(family, ports) {
                Ok(pass) => {
                    self.metrics
                        .conntrack_reconciler_duration
                        .get_or_create(&label)
                        .observe(pass.duration.as_secs_f64());
                    let outcome = &pass.outcome;
                    self.metrics
                        .conntrack_reconciler_deleted
                        .get_or_create(&label)
                        .inc_by(outcome.deleted as u64);
                    if outcome.failed > 0 {
                        self.retry.insert(family);
                        self.metrics
                            .conntrack_reconciler_failures
                            .get_or_create(&label)
                            .inc();
                        let why = outcome
                            .first_error
                            .as_ref()
                            .map(ToString::to_string)
                            .unwrap_or_default();
                        warn!(
                            %family,
                            refused = outcome.failed,
                            "the kernel refused to delete stale UDP conntrack entries, \
                             will retry after the next sync: {why}"
                        );
                    } else {
                        self.retry.remove(&family);
                    }
                    if outcome.deleted > 0 {
                        info!(
                            %family,
                            deleted = outcome.deleted,
                            scanned = pass.scanned,
                            duration = ?pass.duration,
                            "deleted stale UDP conntrack entries"
                        );
                    } else {
                        debug!(
                            %family,
                            scanned = pass.scanned,
                            dumps = pass.dumps.len(),
                            duration = ?pass.duration,
                            "no stale UDP conntrack entries"
                        );
                    }
                }
                Err(e) => {
                    self.retry.insert(family);
                    self.metrics
                        .conntrack_reconciler_failures
                        .get_or_create(&label)
                        .inc();
                    warn!(
                        %family,
                        "UDP conntrack cleanup failed, will retry after the next sync: {e}"
                    );
                }
            }
        }
    }
}
