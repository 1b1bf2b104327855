//! Two backends programming the node together, as one: `to-local ebpf` is the socket
//! programs (local sockets) beside the nftables ruleset (every packet that does not come from
//! a local socket). Composed here, in the binary, so that neither backend crate depends on the
//! other (docs/backends.md, "eBPF").

use kpng_backend::{Backend, BackendError, SyncRequest, SyncStats, TamperAlarm};
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
            rules_ms = rules_s.as_secs_f64() * 1e3,
            sockets_ms = sockets_s.as_secs_f64() * 1e3,
            total_ms = started.elapsed().as_secs_f64() * 1e3,
            rules_ops = rules.operations,
            sockets_ops = sockets.operations,
            "synced both halves"
        );
        Ok(SyncStats {
            operations: rules.operations + sockets.operations,
        })
    }

    fn watch_tampering(&mut self, alarm: TamperAlarm) -> Result<bool, BackendError> {
        self.rules.watch_tampering(alarm)
    }

    /// Both; the programs first (they translate before the rules would).
    fn cleanup(&mut self) -> Result<(), BackendError> {
        let sockets = self.sockets.cleanup();
        self.rules.cleanup()?;
        sockets
    }
}
