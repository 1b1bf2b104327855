//! The contract between kpng's model and everything that consumes it. Small and platform-free:
//! a Windows or eBPF backend links exactly this (plus the model and, if it likes, the kit).
//!
//! - [`Backend`]: one small synchronous trait. `to-file`, `to-local nft` and every later backend
//!   implement it; the in-process path and the gRPC client drive the same trait.
//! - [`NodeModel`]: where a runner's node-local state comes from (the in-process
//!   [`kpng_model::Model`], or a remote brain's state received over the API).
//! - [`settings`]: what every node backend is configured with, whatever the backend
//!   (`--nodeport-addresses`, masquerading, `--detect-local-mode`).
//! - [`metrics::FamilyLabel`]: the label a backend's own metrics share with the runner's.
//! - [`TamperAlarm`]: how a backend that watches its data plane asks the runner for a prompt
//!   full sync when someone else changed it.
//!
//! The sync loop that drives a backend is `kpng-runner`; what backends share beyond this
//! contract is `kpng-backend-kit`. A backend therefore only answers one question: "make the node
//! match this snapshot, given that this diff is what changed since your last successful sync".

#[cfg(target_os = "linux")]
pub mod host;
pub mod metrics;
mod node_model;
pub mod settings;
mod tamper;

pub use node_model::{InputInfo, NodeModel};
pub use tamper::{TamperAlarm, Tampering};

use std::future::Future;
use std::pin::Pin;

use kpng_model::{Diff, Family, Snapshot};
use prometheus_client::registry::Registry;

/// What a backend still has to finish when kpng is asked to stop, awaited before the process
/// exits. Only a backend that carries traffic in kpng's own process (the userspace proxy) has
/// anything: the kernel's data planes outlive the process by design. The future bounds its
/// own wait (the backend's configured grace), so a stuck connection cannot hold kpng forever.
pub type ExitDrain = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// What a backend is asked to do on one sync.
#[derive(Debug, Clone, Copy)]
pub struct SyncRequest<'a> {
    /// What changed since the last *successful* sync. On a full sync it lists every port as new.
    pub diff: &'a Diff,
    /// The complete desired state, for lookups beyond the diff.
    pub snapshot: &'a Snapshot,
    /// A full sync: the first one, the one after a failure, and the periodic full resync. The
    /// backend must converge from any state of its own objects, not just apply the diff.
    pub full: bool,
}

/// What a sync did, for logs and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncStats {
    /// Number of operations sent to the data plane (rules, elements, writes); 0 means nothing
    /// needed to change.
    pub operations: usize,
    /// What the backend found changed by someone else and put back in this sync, when it
    /// found it itself rather than through a [`TamperAlarm`] (the iptables backend's check
    /// for flushed tables in a periodic sync). The runner counts it as a repair, as it does
    /// one it scheduled after an alarm, so `kpng status` shows every repair.
    pub repaired: Option<String>,
    /// The families whose rules from before this sync stayed in place throughout it: a
    /// table this backend left in an earlier run, adopted and refilled in one transaction (or
    /// the same table refilled again by a periodic full sync), or chains replaced atomically
    /// by one restore. A frontend those rules covered never went without a rule, which lets
    /// the UDP conntrack cleanup trust, after a restart, what the earlier run had checked.
    /// Empty when not known: always safe.
    pub kept_rules: Vec<kpng_model::Family>,
    /// Which UDP frontends of the families in `kept_rules` had a rule before this sync, when
    /// the backend knows it from what it read, and someone else may have rewritten its rules
    /// while kpng was down (kube-proxy's iptables mode writes the iptables backend's chains):
    /// only these keep the earlier run's checks. `None`: every frontend of a kept family kept
    /// its rule (a table no one else writes).
    pub kept_udp_frontends: Option<UdpFrontends>,
}

/// UDP frontends whose rules a backend found in place ([`SyncStats::kept_udp_frontends`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UdpFrontends {
    /// Service IP:ports: ClusterIPs, external and load-balancer IPs.
    pub service_ips: Vec<std::net::SocketAddr>,
    /// Node ports (on the node's addresses), with the family of the rules that had them.
    pub node_ports: Vec<(kpng_model::Family, u16)>,
}

/// Why a sync failed. The runner logs it, counts it and retries with a full sync.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// A kernel or data-plane transaction was refused.
    #[error("{backend} transaction of {operations} operations failed: {message}")]
    Transaction {
        /// Which backend.
        backend: &'static str,
        /// How many operations the refused transaction held.
        operations: usize,
        /// What the data plane said.
        message: String,
    },
    /// An I/O error talking to the data plane or writing output.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Anything else, described.
    #[error("{0}")]
    Other(String),
    /// Some of the backend's families failed and the others synced (each family is synced on
    /// its own, as kube-proxy runs one proxier per family): the runner then marks only the
    /// failed ones unsynced, so the others' `/healthz` and last-sync timestamp move on.
    #[error("{error}")]
    InFamilies {
        /// The families whose sync failed.
        failed: Vec<Family>,
        /// The first family's error.
        error: Box<BackendError>,
    },
}

impl BackendError {
    /// The families this error is about, when the backend knows that the others synced;
    /// `None`: every family is to be taken as unsynced.
    pub fn failed_families(&self) -> Option<&[Family]> {
        match self {
            BackendError::InFamilies { failed, .. } => Some(failed),
            _ => None,
        }
    }
}

/// A consumer of the node-local model: a sink that writes it somewhere, or a backend that
/// programs the node.
///
/// Contract:
/// - `sync` MUST be idempotent: the same request twice leaves the same state.
/// - After `sync` returns `Ok`, the data plane MUST match `snapshot` for every family the backend
///   handles. After `Err`, the runner calls again with `full: true` and the backend must
///   converge without relying on what the failed call did.
/// - A backend MUST NOT remove working state because of bad input: the model never hands it
///   invalid objects, and an empty snapshot is only sent when the cluster really is empty.
/// - Leaving the process (SIGTERM) MUST leave the data plane as it is; only [`Backend::cleanup`]
///   removes it.
///
/// Writing one: `docs/backends.md`, "How to write a new backend in ~200 lines" walks through
/// the crate, the `sync` pattern, the shared scenarios every backend passes
/// (`kpng_backend_kit::conformance_tests!`), registering it in the CLI (`crates/kpng/src/cli.rs`,
/// `backends.rs`) and its entry in `Leftover::ALL` (`crates/kpng/src/leftovers.rs`) so that
/// kpng can clean up after it. The smallest complete one is
/// `crates/kpng/examples/remote_backend.rs`.
pub trait Backend: Send {
    /// Short name, used in logs, metrics and `/proxyMode` (`file`, `nftables`, …).
    fn name(&self) -> &'static str;

    /// The IP families this backend programs (health and metrics are reported per family).
    fn families(&self) -> Vec<Family> {
        Family::ALL.to_vec()
    }

    /// Registers the backend's own metrics (e.g. `…_nftables_sync_failures_total`).
    fn register_metrics(&self, _registry: &mut Registry) {}

    /// Work that needs no cluster state (loading programs, creating or adopting maps), done
    /// once before the first sync, while the source is still listing the cluster: the first
    /// programming then does not wait for it, and a missing privilege shows at start. On an
    /// error the runner logs it and the first sync tries again (and fails as loudly as any
    /// sync). The default does nothing.
    fn prepare(&mut self) -> Result<(), BackendError> {
        Ok(())
    }

    /// Makes the data plane match the request.
    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncStats, BackendError>;

    /// Whether the output shows the node's status (whether its Node exists, is being deleted,
    /// is eligible), not only what is programmed: a change of the status alone (a deleted Node
    /// whose IPs are kept) is then a sync for this backend, with an empty diff. `false` (the
    /// default): a backend that programs the data plane has nothing to do for it.
    fn shows_node_status(&self) -> bool {
        false
    }

    /// Starts watching the data plane for changes made by someone else, raising `alarm` (from
    /// any thread) for each; the runner answers with a full sync. Called once, before the
    /// first sync; changes the backend makes itself must not raise it. Returns whether the
    /// backend watches at all (`false`, the default: tampering is only repaired by the
    /// periodic full sync).
    fn watch_tampering(&mut self, _alarm: TamperAlarm) -> Result<bool, BackendError> {
        Ok(false)
    }

    /// What to await when kpng is asked to stop (SIGTERM), taken once before the runner owns
    /// the backend, and only polled at the stop. It runs while the backend is being dropped,
    /// so it must not need the backend itself. `None` (the default): nothing to finish.
    fn exit_drain(&mut self) -> Option<ExitDrain> {
        None
    }

    /// Removes everything this backend ever installed.
    fn cleanup(&mut self) -> Result<(), BackendError> {
        Ok(())
    }
}
