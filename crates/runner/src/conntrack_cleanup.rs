//! UDP conntrack cleanup after each successful sync, for backends that program the node.
//!
//! The decision of *what* is stale and *how* to read the table lives in `kpng-conntrack`;
//! this step decides *when* to run a pass (after a sync that [`pass_needed`], and again after
//! any failed pass), keeps kube-proxy's metrics and logs. Errors never stop the sync loop.

use std::collections::BTreeSet;

use kpng_conntrack::memory::{Checked, MemoryError, MemoryFile};
use kpng_conntrack::{Frontend, Reconciler, pass_needed};
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
    /// Where the checked frontends are kept across restarts; `None`: nowhere.
    memory: Option<MemoryFile>,
    /// What the last run remembered, until the first sync says which families' rules
    /// stayed in place ([`kpng_backend::SyncStats::kept_rules`]).
    remembered: Option<Checked>,
    /// Writing the memory failed once (said once, then only at debug level).
    memory_failed: bool,
    /// The reconciler's `checked_version` the memory file holds: nothing is encoded or
    /// written in a sync that changed no check.
    saved_version: Option<u64>,
    /// What another proxy's rules on the node had already checked: read before the first
    /// sync commits, taken as checked after the first successful one.
    inherited: Option<StartRead>,
    /// What `inherited` gave, until the first successful sync.
    inherited_checked: Option<Checked>,
    /// The UDP frontends kpng's own rules had when it started, for a backend whose rules
    /// another writer may have changed meanwhile although it does not say which frontends it
    /// found ([`ConntrackCleanup::with_rules_in_place`]).
    in_place: Option<StartRead>,
    /// What `in_place` gave, until the first successful sync.
    in_place_found: Option<Checked>,
}

/// What a sync's backend said of the rules it found (see [`kpng_backend::SyncStats`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeptRules {
    /// The families whose rules stayed in place throughout the sync (`kept_rules`).
    pub families: Vec<Family>,
    /// Among them, the UDP frontends whose rule was there before it, when the backend knows
    /// (`kept_udp_frontends`); `None`: every one of the families' frontends.
    pub udp_frontends: Option<Checked>,
}

impl KeptRules {
    /// From a successful sync's statistics.
    pub fn of(stats: &kpng_backend::SyncStats) -> KeptRules {
        let udp_frontends = stats.kept_udp_frontends.as_ref().map(|found| {
            let mut frontends = Checked::new();
            for addr in &found.service_ips {
                let family = Family::of(&addr.ip());
                frontends
                    .entry(family)
                    .or_default()
                    .insert(Frontend::Ip(*addr));
            }
            for (family, port) in &found.node_ports {
                frontends
                    .entry(*family)
                    .or_default()
                    .insert(Frontend::NodePort(*port));
            }
            frontends
        });
        KeptRules {
            families: stats.kept_rules.clone(),
            udp_frontends,
        }
    }
}

/// Gives, once, UDP frontends read from the rules on the node as kpng started, before kpng's
/// first sync commits (which may wait for it: it is read while kpng loads), so that it reads
/// the rules as they were, never what kpng's first commit put there. Two reads use it:
/// - [`ConntrackCleanup::with_inherited`]: the frontends another proxy's rules were DNATing
///   and whose never-DNATed entries that proxy deletes itself (kube-proxy's, read by the
///   binary; kpng's iptables backend writes kube-proxy's chains, hence before the commit);
///   that proxy's rules must stay in place until kpng's first successful sync;
/// - [`ConntrackCleanup::with_rules_in_place`]: the frontends kpng's own table had, which
///   narrow what the last run's memory is trusted for.
pub struct StartRead(Box<dyn FnOnce() -> Checked + Send>);

impl StartRead {
    /// Wraps the function that gives them.
    pub fn new(give: impl FnOnce() -> Checked + Send + 'static) -> StartRead {
        StartRead(Box::new(give))
    }
}

impl std::fmt::Debug for StartRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StartRead")
    }
}

impl ConntrackCleanup {
    /// Wraps a reconciler; results go to `metrics`.
    pub fn new(reconciler: Reconciler, metrics: ProxyMetrics) -> ConntrackCleanup {
        ConntrackCleanup {
            reconciler,
            retry: BTreeSet::new(),
            metrics,
            memory: None,
            remembered: None,
            memory_failed: false,
            saved_version: None,
            inherited: None,
            inherited_checked: None,
            in_place: None,
            in_place_found: None,
        }
    }

    /// Takes what `inherited` gives (before the first sync commits) as checked after the first
    /// successful sync, in every family: those frontends' first pass then reads their DNATed
    /// entries only, as in steady state.
    pub fn with_inherited(mut self, inherited: StartRead) -> ConntrackCleanup {
        self.inherited = Some(inherited);
        self
    }

    /// Trusts the last run's memory only for the UDP frontends `in_place` finds in kpng's own
    /// rules before the first commit, when the backend keeps its rules but does not say which
    /// frontends they had (`kept_udp_frontends` is `None`: nftables). kpng's table is its own,
    /// but another kpng build adopts it too (a rollback, then the upgrade again): a Service it
    /// deleted meanwhile had no rule for a while, and its clients' never-DNATed entries must be
    /// read whole, although this build's memory still lists the frontend as checked.
    pub fn with_rules_in_place(mut self, in_place: StartRead) -> ConntrackCleanup {
        self.in_place = Some(in_place);
        self
    }

    /// Keeps the checked frontends in `file` across restarts; `loaded` is what
    /// [`MemoryFile::load`] read there, what the last run of this boot left (see
    /// [`kpng_conntrack::memory`]). The caller loads it, once, because it also tells whether
    /// kpng ran here before.
    pub fn with_memory(
        mut self,
        file: MemoryFile,
        loaded: Result<Option<Checked>, MemoryError>,
    ) -> ConntrackCleanup {
        match loaded {
            Ok(remembered) => self.remembered = remembered,
            Err(e) => warn!("{e}; every UDP frontend will be read whole at start-up"),
        }
        self.memory = Some(file);
        self
    }

    /// Before a sync is committed: forgets, in memory and in the file, the frontends it takes
    /// out of the rules or leaves without serving endpoints ([`Reconciler::forget_gone`]), so
    /// that a crash right after the commit cannot leave them remembered as checked.
    /// A full sync's diff names no removal: what it does not keep is forgotten instead.
    pub fn before_sync(
        &mut self,
        families: &[Family],
        diff: &Diff,
        snapshot: &Snapshot,
        full: bool,
    ) {
        if let Some(inherited) = self.inherited.take() {
            self.inherited_checked = Some((inherited.0)());
        }
        if let Some(in_place) = self.in_place.take() {
            self.in_place_found = Some((in_place.0)());
        }
        for &family in families {
            if full {
                let ports = snapshot.family(family).map(|p| &**p);
                self.reconciler.keep_only(family, ports);
            } else {
                self.reconciler.forget_gone(family, diff);
            }
        }
        self.save();
    }

    /// Writes the checked frontends to the memory file when they changed.
    fn save(&mut self) {
        let Some(file) = &mut self.memory else {
            return;
        };
        let version = self.reconciler.checked_version();
        if self.saved_version == Some(version) {
            return;
        }
        match file.save(self.reconciler.checked()) {
            Ok(()) => self.saved_version = Some(version),
            Err(e) => self.warn_unsaved(e),
        }
    }

    /// Says once that the memory cannot be written, then only at debug level.
    fn warn_unsaved(&mut self, e: MemoryError) {
        if self.memory_failed {
            debug!("{e}");
        } else {
            warn!("{e}; a restart will read every UDP frontend whole");
            self.memory_failed = true;
        }
    }

    /// After a sync that repaired what someone else changed (a table flushed or deleted by a
    /// firewall reload, say): until the repair, the node may have had no rule for any
    /// frontend, and clients' packets to them went un-DNATed. Every frontend is read whole
    /// by the repair's pass (a full sync always runs one), as after a start-up. The runner
    /// calls it when an alarm reports the change (so that the memory file forgets at once,
    /// not after the repair), and after every repairing sync (a backend may find the change
    /// itself, during the sync).
    pub fn rules_were_missing(&mut self) {
        self.reconciler.forget_checked();
        self.inherited_checked = None;
        self.save();
    }

    /// Runs the passes a successful sync calls for: per family, when the sync was full, when
    /// it changed a UDP port in a way that can strand entries, or when the last pass failed.
    /// Each pass sees every Service port of its family in `snapshot`. After the first sync,
    /// the frontends the last run checked count as checked in the families whose rules the
    /// backend kept in place (`kept`, narrowed to the UDP frontends whose rules it found, when
    /// it says which): the first pass then reads their DNATed entries only, as in steady state.
    pub fn after_sync(
        &mut self,
        families: &[Family],
        diff: &Diff,
        snapshot: &Snapshot,
        full: bool,
        kept: &KeptRules,
    ) {
        let found_at_start = self.in_place_found.take();
        if let Some(mut remembered) = self.remembered.take() {
            for family in &kept.families {
                let Some(mut frontends) = remembered.remove(family) else {
                    continue;
                };
                let remembered_count = frontends.len();
                // Only those whose rule was in place: as the backend found them, or as read
                // from kpng's own rules before the first commit.
                if let Some(in_place) = kept.udp_frontends.as_ref().or(found_at_start.as_ref()) {
                    let in_place = in_place.get(family);
                    frontends.retain(|f| in_place.is_some_and(|p| p.contains(f)));
                }
                let missing = remembered_count - frontends.len();
                if missing == 0 {
                    info!(
                        %family,
                        frontends = frontends.len(),
                        "kpng's rules were in place at start: the UDP conntrack cleanup \
                         trusts the last run's checks (one walk of the table, not one per \
                         frontend)"
                    );
                } else {
                    info!(
                        %family,
                        frontends = frontends.len(),
                        missing,
                        "kpng's rules were in place at start: the UDP conntrack cleanup \
                         trusts the last run's checks of the frontends still in them; \
                         {missing} it had checked were not found in the rules in place \
                         (another writer took them out meanwhile, such as an earlier kpng \
                         build) and are read whole"
                    );
                }
                self.reconciler.assume_checked(*family, frontends);
            }
        }
        if let Some(inherited) = self.inherited_checked.take() {
            for (family, frontends) in inherited {
                debug!(%family, frontends = frontends.len(), "inherited UDP conntrack checks");
                self.reconciler.assume_checked(family, frontends);
            }
        }
        for &family in families {
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
                    // Each dump is a walk of the kernel's whole table: what a pass cost.
                    let read = pass
                        .dumps
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ");
                    if outcome.deleted > 0 {
                        let services = capped_list(&pass.services);
                        info!(
                            %family,
                            deleted = outcome.deleted,
                            %services,
                            scanned = pass.scanned,
                            %read,
                            duration = ?pass.duration,
                            "deleted stale UDP conntrack entries"
                        );
                    } else {
                        debug!(
                            %family,
                            scanned = pass.scanned,
                            %read,
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
        self.save();
    }
}

/// At most this many Service ports are named in a deletion log line; the rest are counted.
const MAX_NAMED_SERVICES: usize = 5;

/// `ns/a:dns, ns/b:dns and 3 more`: the Service ports a deletion log line names, capped so
/// that a pass over a thousand Services stays one readable line.
fn capped_list(services: &[String]) -> String {
    let mut out = services
        .iter()
        .take(MAX_NAMED_SERVICES)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    let more = services.len().saturating_sub(MAX_NAMED_SERVICES);
    if more > 0 {
        out.push_str(&format!(" and {more} more"));
    }
    out
}

#[cfg(test)]
mod capped_list_tests {
    use super::*;

    #[test]
    fn the_services_of_a_deletion_are_listed_up_to_a_cap() {
        let names = |n: usize| (0..n).map(|i| format!("ns/s{i}:dns")).collect::<Vec<_>>();
        assert_eq!(capped_list(&[]), "");
        assert_eq!(capped_list(&names(2)), "ns/s0:dns, ns/s1:dns");
        assert_eq!(
            capped_list(&names(7)),
            "ns/s0:dns, ns/s1:dns, ns/s2:dns, ns/s3:dns, ns/s4:dns and 2 more"
        );
    }
}
