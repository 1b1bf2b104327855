//! The sync loop every kpng sink and backend shares, and what runs beside it.
//!
//! - [`runner::Runner`]: feeds source inputs into a [`kpng_backend::NodeModel`] (the in-process
//!   [`kpng_model::Model`], or a remote brain's state received over the API), accumulates
//!   diffs, honours `--min-sync-period`, retries failures with a full resync, runs the periodic
//!   syncs, and keeps [`health::ProxyHealth`] and [`metrics::ProxyMetrics`] current.
//! - [`admin`]: answers `kpng status` and `kpng trace` from the loop's model.
//! - [`repair_backoff`]: how long a repair of changes someone else made waits when they keep
//!   coming.
//! - [`open_files`]: the advice added to errors that say kpng ran out of file descriptors.
//! - [`host_check`]: the node's kernel settings Services need (IP forwarding, bridge
//!   netfilter), warned of and shown in `kpng status`.
//! - [`service_health`]: the `healthCheckNodePort` servers of eTP Local LoadBalancer Services.
//! - [`rejection_log`]: rejected objects in the log, and the end of each rejection.
//! - [`sync_log`]: which syncs are logged at info level (a node's log volume under churn).
//! - `conntrack_cleanup` (Linux): stale UDP conntrack entries after syncs that can strand them.
//! - `address_watch` (Linux): the node's interface addresses, so that a change moves node ports
//!   and health checks at once rather than at the next periodic sync.
//!
//! The contract a backend implements lives in `kpng-backend`; this crate is the machinery
//! around it, so that the contract stays small and builds on every platform.

pub mod address_change;
#[cfg(target_os = "linux")]
pub mod address_watch;
pub mod admin;
#[cfg(target_os = "linux")]
pub mod conntrack_cleanup;
pub mod guarded_http;
pub mod health;
pub mod host_check;
pub mod metrics;
pub mod node_config_check;
pub mod open_files;
pub mod rejection_log;
pub mod repair_backoff;
pub mod runner;
pub mod service_health;
pub mod sync_log;
pub mod warning_budget;

use std::time::Duration;

/// Timing of the sync loop, kube-proxy's semantics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncTiming {
    /// Minimum time from a sync that wrote to the data plane to the next sync
    /// (`--min-sync-period`, default 1 s; 0 = sync at once). A sync that changed nothing (an
    /// idle periodic one) does not delay the next: the period limits the kernel's churn.
    pub min_sync_period: Duration,
    /// Periodic sync and retry ceiling (`--sync-period`, default 30 s). Also sets the health
    /// timeout: a change queued for longer than twice this without a sync makes `/healthz` fail.
    pub sync_period: Duration,
    /// Periodic *full* resync (`--full-sync-period`, default 1 h; 0 disables).
    pub full_sync_period: Duration,
}

impl Default for SyncTiming {
    fn default() -> Self {
        SyncTiming {
            min_sync_period: Duration::from_secs(1),
            sync_period: Duration::from_secs(30),
            full_sync_period: Duration::from_secs(3600),
        }
    }
}
