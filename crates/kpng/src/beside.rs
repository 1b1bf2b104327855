//! Two backends programming the node together, as one: `to-local ebpf` is the socket
//! programs (local sockets) beside the nftables ruleset (every packet that does not come from
//! a local socket). Composed here, in the binary, so that neither backend crate depends on the
//! other (docs/backends.md, "eBPF").

use kpng_backend::{Backend, BackendError, SyncRequest, SyncStats, TamperAlarm};
use kpng_model::Family;
use prometheus_client::registry::Registry;

/// `rules` (the nftables backend: its name, metrics, families and tamper watch are the
/// composite's) and `sockets` (the eBPF backend), synced in that order on every request.
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

    /// The ruleset first: when the sockets' maps then fail, traffic from local sockets still
    /// reaches the Service through the rules (DNAT), and the runner retries both in full.
    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncStats, BackendError> {
        let started = std::time::Instant::now();
        let rules = self.rules.sync(request)?;
        let between = std::time::Instant::now();
        let sockets = self.sockets.sync(request)?;
        tracing::debug!(
            rules_ms = (between - started).as_secs_f64() * 1e3,
            sockets_ms = between.elapsed().as_secs_f64() * 1e3,
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
