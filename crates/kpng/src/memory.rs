//! When freed memory goes back to the kernel.
//!
//! kpng is built to return freed pages at once (`.cargo/config.toml`): a large start frees much
//! more than it keeps, and pages kept through the first full sync raise peak RSS by 50-55 MB at
//! 30k Services. Returning them one free at a time while the cluster is read costs a quarter
//! of a `kube` start's CPU, though, because the next object re-faults what the last one gave
//! back. So while the source loads, freed pages are kept for a short while ([`HOLD_DECAY_MS`])
//! for reuse, and just before the first sync (the peak) they all go back; from then on pages
//! are returned at once again.
//!
//! The hold is for sources that read the cluster over the network (`kube`, a brain): a `file`
//! source reads its manifests in one pass, and there the hold saved 0-5 % of a start's CPU but
//! set the peak of a restart over kpng's own rules, 148 against 138 MiB at 30k x 4
//! (docs/benchmarks.md, "Where the peak of a restart over its own rules is set"): a `file`
//! start returns pages at once throughout ([`WhileLoading::ReturnAtOnce`]).
//!
//! An operator who sets `_RJEM_MALLOC_CONF` chose the allocator's behaviour: it is left alone.

use kpng_backend::{Backend, BackendError, ExitDrain, SyncRequest, SyncStats, TamperAlarm};
use kpng_model::Family;
use prometheus_client::registry::Registry;

/// How long freed pages are kept while the cluster loads. Measured at 30k x 4 (`kube` source,
/// docs/benchmarks.md "Memory against start-up time", 2026-12-02 09:50): 100 ms keeps most of
/// the reuse (start CPU -20 to -35 %) for +13-15 MB of peak RSS, under the 150 MB target;
/// keeping them until the first sync (-1) gains no more and peaks at 152-154 MB, the freed
/// pages of the whole load being resident at once.
const HOLD_DECAY_MS: isize = 100;

/// What happens to freed pages while the source loads the cluster, chosen by source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WhileLoading {
    /// Kept [`HOLD_DECAY_MS`] for reuse (the `kube` source and a brain's nodes: each object
    /// arrives and is decoded on its own, and re-faulting what the last one gave back costs).
    #[default]
    Hold,
    /// Returned at once, as after the first sync (the `file` source: the hold raised a
    /// restart's peak by 10 MiB and saved next to no CPU).
    ReturnAtOnce,
}

/// Whether the operator configured jemalloc, in which case kpng does not retune it.
fn operator_configured() -> bool {
    std::env::var_os("_RJEM_MALLOC_CONF").is_some()
}

/// Sets how long (ms; -1 never, 0 at once) every arena keeps freed pages, and the default for
/// arenas made later. Setting 0 also returns what an arena holds.
#[cfg(all(target_os = "linux", not(target_env = "msvc")))]
fn set_decay(ms: isize) {
    use tikv_jemalloc_ctl::{Access, AsName};
    use tracing::debug;
    let arenas: u32 = tikv_jemalloc_ctl::arenas::narenas::read().unwrap_or(0);
    for kind in ["dirty", "muzzy"] {
        let default = format!("arenas.{kind}_decay_ms\0");
        if let Err(e) = default.as_str().name().write(ms) {
            debug!(
                "jemalloc: cannot set {}: {e}",
                default.trim_end_matches('\0')
            );
        }
        for arena in 0..arenas {
            // Arenas not in use yet are not initialised and refuse the write: they take the
            // default when they are.
            let _ = format!("arena.{arena}.{kind}_decay_ms\0")
                .as_str()
                .name()
                .write(ms);
        }
    }
}

#[cfg(not(all(target_os = "linux", not(target_env = "msvc"))))]
fn set_decay(_ms: isize) {}

/// Keeps freed pages for reuse until the wrapped backend's first sync, then returns them and
/// goes back to returning pages at once.
pub struct ReleaseBeforeFirstSync {
    inner: Box<dyn Backend>,
    holding: bool,
}

impl ReleaseBeforeFirstSync {
    /// Starts keeping freed pages if `while_loading` asks for it (unless the operator
    /// configured jemalloc) and wraps `inner`.
    pub fn hold(inner: Box<dyn Backend>, while_loading: WhileLoading) -> ReleaseBeforeFirstSync {
        let holding = while_loading == WhileLoading::Hold && !operator_configured();
        if holding {
            set_decay(HOLD_DECAY_MS);
        }
        ReleaseBeforeFirstSync { inner, holding }
    }
}

impl Backend for ReleaseBeforeFirstSync {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn families(&self) -> Vec<Family> {
        self.inner.families()
    }

    fn register_metrics(&self, registry: &mut Registry) {
        self.inner.register_metrics(registry);
    }

    fn prepare(&mut self) -> Result<(), BackendError> {
        self.inner.prepare()
    }

    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncStats, BackendError> {
        if std::mem::take(&mut self.holding) {
            let started = std::time::Instant::now();
            set_decay(0);
            tracing::debug!(took = ?started.elapsed(), "freed memory of the load returned before the first sync");
        }
        self.inner.sync(request)
    }

    fn shows_node_status(&self) -> bool {
        self.inner.shows_node_status()
    }

    fn watch_tampering(&mut self, alarm: TamperAlarm) -> Result<bool, BackendError> {
        self.inner.watch_tampering(alarm)
    }

    fn exit_drain(&mut self) -> Option<ExitDrain> {
        self.inner.exit_drain()
    }

    fn cleanup(&mut self) -> Result<(), BackendError> {
        self.inner.cleanup()
    }
}

#[cfg(all(test, target_os = "linux", not(target_env = "msvc")))]
mod tests {
    use kpng_model::{Diff, Snapshot};
    use tikv_jemalloc_ctl::{Access, AsName};

    use super::*;

    /// A backend whose syncs succeed with one operation.
    struct OneOperation;

    impl Backend for OneOperation {
        fn name(&self) -> &'static str {
            "one-operation"
        }

        fn sync(&mut self, _request: &SyncRequest<'_>) -> Result<SyncStats, BackendError> {
            Ok(SyncStats {
                operations: 1,
                ..SyncStats::default()
            })
        }
    }

    fn default_decay() -> isize {
        "arenas.dirty_decay_ms\0"
            .name()
            .read()
            .expect("jemalloc answers")
    }

    #[test]
    fn pages_are_kept_while_a_kube_source_loads_and_returned_from_the_first_sync_on() {
        if operator_configured() {
            eprintln!("skipped: _RJEM_MALLOC_CONF is set, so kpng leaves jemalloc alone");
            return;
        }
        // A `file` source's load: nothing held (the build's default, pages returned at once).
        let _file =
            ReleaseBeforeFirstSync::hold(Box::new(OneOperation), WhileLoading::ReturnAtOnce);
        assert_eq!(
            default_decay(),
            0,
            "a file source's load returns pages at once"
        );
        let mut backend = ReleaseBeforeFirstSync::hold(Box::new(OneOperation), WhileLoading::Hold);
        assert_eq!(default_decay(), HOLD_DECAY_MS, "while loading");
        let (snapshot, diff) = (Snapshot::default(), Diff::default());
        let request = SyncRequest {
            diff: &diff,
            snapshot: &snapshot,
            full: true,
        };
        for _ in 0..2 {
            assert_eq!(backend.sync(&request).map(|s| s.operations).ok(), Some(1));
            assert_eq!(default_decay(), 0, "after the first sync");
        }
        assert_eq!(backend.name(), "one-operation", "the inner backend answers");
    }
}
