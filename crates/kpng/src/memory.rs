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
    /// Starts keeping freed pages (unless the operator configured jemalloc) and wraps `inner`.
    pub fn hold(inner: Box<dyn Backend>) -> ReleaseBeforeFirstSync {
        let holding = !operator_configured();
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
    fn pages_are_kept_while_loading_and_returned_from_the_first_sync_on() {
        if operator_configured() {
            eprintln!("skipped: _RJEM_MALLOC_CONF is set, so kpng leaves jemalloc alone");
            return;
        }
        let mut backend = ReleaseBeforeFirstSync::hold(Box::new(OneOperation));
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
