//! Two backends programming the node together, as one: `to-local ebpf` is the socket
//! programs (local sockets) beside the nftables ruleset (every packet that does not come from
//! a local socket). Composed here, in the binary, so that neither backend crate depends on the
//! other (docs/backends.md, "eBPF").

use kpng_backend::{Backend, BackendError, ExitDrain, SyncRequest, SyncStats, TamperAlarm};
use kpng_model::Family;
use prometheus_client::registry::Registry;

/// `rules` (the nftables backend: its name, metrics, families and tamper watch are the
/// composite's) and `sockets` (the eBPF backend); see [`Beside::sync`] for the order.
pub struct Beside {
    rules: Box<dyn Backend>,
    sockets: Box<dyn Backend>,
}

impl Beside {
    /// The composite of the two.
    pub fn new(rules: Box<dyn Backend>, sockets: Box<dyn Backend>) -> Beside {
        Beside { rules, sockets }
    }
}

impl Backend for Beside {
    fn name(&self) -> &'static str {
        self.sockets.name()
    }

    fn families(&self) -> Vec<Family> {
        self.rules.families()
    }

    fn register_metrics(&self, registry: &mut Registry) {
        self.rules.register_metrics(registry);
        self.sockets.register_metrics(registry);
    }

    /// Both halves; the second is prepared even when the first fails.
    fn prepare(&mut self) -> Result<(), BackendError> {
        let rules = self.rules.prepare();
        let sockets = self.sockets.prepare();
        rules.and(sockets)
    }

    /// A full sync programs both halves at once, the socket maps on a second thread: they are
    /// independent (the rules never see a translated socket's packets, and the programs never
    /// see the rules'), and a cold start at 30k Services spends comparable times in each (the
    /// nftables transaction, the map batches), so the node is programmed in the longer of the
    /// two rather than their sum. An incremental sync is a few operations on each side:
    /// sequential, ruleset first, which costs less than a thread.
    ///
    /// When one half fails, the other's work stands and the runner retries both in full; while
    /// only the maps are behind, local sockets still reach the Service through the rules' DNAT.
    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncStats, BackendError> {
        let started = std::time::Instant::now();
        let (rules, sockets, rules_s, sockets_s) = if request.full || request.diff.node_changed {
            let sockets_half = &mut self.sockets;
            std::thread::scope(|scope| {
                let other = std::thread::Builder::new()
                    .name("kpng-ebpf-sync".into())
                    .spawn_scoped(scope, move || {
                        yield_to_the_rules();
                        let t = std::time::Instant::now();
                        (sockets_half.sync(request), t.elapsed())
                    });
                let rules = self.rules.sync(request);
                let rules_s = started.elapsed();
                let (sockets, sockets_s) = match other {
                    Ok(handle) => handle.join().unwrap_or_else(|_| {
                        (
                            Err(BackendError::Other(
                                "the eBPF half's sync thread panicked".into(),
                            )),
                            std::time::Duration::ZERO,
                        )
                    }),
                    // The runner retries the full sync.
                    Err(e) => (
                        Err(BackendError::Other(format!(
                            "cannot start the eBPF half's sync thread: {e}"
                        ))),
                        std::time::Duration::ZERO,
                    ),
                };
                (rules, sockets, rules_s, sockets_s)
            })
        } else {
            let rules = self.rules.sync(request);
            let rules_s = started.elapsed();
            let between = std::time::Instant::now();
            let sockets = match &rules {
                Ok(_) => self.sockets.sync(request),
                Err(_) => Ok(SyncStats::default()),
            };
            (rules, sockets, rules_s, between.elapsed())
        };
        let (rules, sockets) = (rules?, sockets?);
        tracing::debug!(
            rules_ms = kpng_runner::sync_log::log_millis(rules_s),
            sockets_ms = kpng_runner::sync_log::log_millis(sockets_s),
            total_ms = kpng_runner::sync_log::log_millis(started.elapsed()),
            rules_ops = rules.operations,
            sockets_ops = sockets.operations,
            "synced both halves"
        );
        Ok(SyncStats {
            operations: rules.operations + sockets.operations,
            repaired: rules.repaired.or(sockets.repaired),
            // The sockets' translations keep no conntrack entry: what counts is the rules'.
            kept_rules: rules.kept_rules,
            kept_udp_frontends: rules.kept_udp_frontends,
        })
    }

    fn watch_tampering(&mut self, alarm: TamperAlarm) -> Result<bool, BackendError> {
        self.rules.watch_tampering(alarm)
    }

    /// Both halves', together.
    fn exit_drain(&mut self) -> Option<ExitDrain> {
        match (self.rules.exit_drain(), self.sockets.exit_drain()) {
            (Some(a), Some(b)) => Some(Box::pin(async move {
                futures::join!(a, b);
            })),
            (a, b) => a.or(b),
        }
    }

    /// Both; the programs first (they translate before the rules would).
    fn cleanup(&mut self) -> Result<(), BackendError> {
        let sockets = self.sockets.cleanup();
        self.rules.cleanup()?;
        sockets
    }
}

/// Lowers this thread's scheduling priority (nice 10; on Linux a nice value is per thread).
///
/// A cold sync's longest path is the rules half's kernel transactions, which a second thread
/// of the nftables backend commits while its first encodes the next; with the socket maps'
/// thread beside them, three threads share two CPUs and the longest path waits. At nice 10 the
/// maps' thread mostly runs when a CPU is free, which it is once the rules' encoding is done:
/// the node is programmed sooner, and the maps, about a third as long, still finish before the
/// rules do. Failing to lower it only costs that gain.
fn yield_to_the_rules() {
    if let Err(e) = rustix::process::setpriority_process(None, 10) {
        tracing::debug!("cannot lower the eBPF sync thread's priority: {e}");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::thread::ThreadId;

    use kpng_model::{Diff, Snapshot};

    use super::*;

    /// A half that records which thread synced it and answers as told.
    struct Half {
        name: &'static str,
        log: Arc<Mutex<Vec<(&'static str, ThreadId)>>>,
        fail: bool,
    }

    impl Backend for Half {
        fn name(&self) -> &'static str {
            self.name
        }
        fn sync(&mut self, _: &SyncRequest<'_>) -> Result<SyncStats, BackendError> {
            self.log
                .lock()
                .expect("log")
                .push((self.name, std::thread::current().id()));
            if self.fail {
                return Err(BackendError::Other(format!("{} failed", self.name)));
            }
            Ok(SyncStats {
                operations: 1,
                ..SyncStats::default()
            })
        }
        fn cleanup(&mut self) -> Result<(), BackendError> {
            Ok(())
        }
    }

    type Log = Arc<Mutex<Vec<(&'static str, ThreadId)>>>;

    fn pair(rules_fail: bool, sockets_fail: bool) -> (Beside, Log) {
        let log: Log = Arc::default();
        let half = |name, fail| {
            Box::new(Half {
                name,
                log: log.clone(),
                fail,
            }) as Box<dyn Backend>
        };
        (
            Beside::new(half("rules", rules_fail), half("sockets", sockets_fail)),
            log,
        )
    }

    #[test]
    fn a_full_sync_runs_both_halves_on_two_threads_an_incremental_one_in_turn() {
        let (snapshot, diff) = (Snapshot::default(), Diff::default());
        let full = SyncRequest {
            diff: &diff,
            snapshot: &snapshot,
            full: true,
        };
        let (mut b, log) = pair(false, false);
        assert_eq!(b.sync(&full).map(|s| s.operations).ok(), Some(2));
        let seen = std::mem::take(&mut *log.lock().expect("log"));
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert_ne!(seen[0].1, seen[1].1, "the halves ran on different threads");

        let incremental = SyncRequest {
            full: false,
            ..full
        };
        assert!(b.sync(&incremental).is_ok());
        let seen = std::mem::take(&mut *log.lock().expect("log"));
        let names: Vec<_> = seen.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["rules", "sockets"]);
        assert!(seen.iter().all(|(_, t)| *t == std::thread::current().id()));
    }

    #[test]
    fn either_half_failing_fails_the_sync() {
        let (snapshot, diff) = (Snapshot::default(), Diff::default());
        for (rules_fail, sockets_fail, full) in [
            (true, false, true),
            (false, true, true),
            (true, false, false),
            (false, true, false),
        ] {
            let (mut b, log) = pair(rules_fail, sockets_fail);
            let request = SyncRequest {
                diff: &diff,
                snapshot: &snapshot,
                full,
            };
            assert!(
                b.sync(&request).is_err(),
                "rules fail {rules_fail}, sockets fail {sockets_fail}, full {full}"
            );
            let names: Vec<_> = log.lock().expect("log").iter().map(|(n, _)| *n).collect();
            // An incremental sync leaves the maps alone when the rules failed (the runner
            // retries both in full).
            let want: &[&str] = if rules_fail && !full {
                &["rules"]
            } else {
                &["rules", "sockets"]
            };
            let mut names = names;
            names.sort_unstable();
            let mut want = want.to_vec();
            want.sort_unstable();
            assert_eq!(names, want, "full {full}");
        }
    }
}
