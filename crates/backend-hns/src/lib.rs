//! kpng's Windows backend: Service load balancers in the Host Networking Service (HNS), through
//! its HCN API, with kube-proxy's winkernel semantics.
//!
//! - [`schema`]: the HCN JSON schema v2 (network, endpoint, load balancer, flag values).
//! - [`plan`]: the pure planner (Service port → load balancers; diff + known state → HCN
//!   operations). Platform-free, so the Windows data model is tested on Linux.
//! - [`hcn`]: the HCN calls as a trait; [`sim`]: a simulator of HCN's observable rules with
//!   fault injection (`to-local hns --hcn-simulator FILE`); `system` (Windows only): the real
//!   `computenetwork.dll`; `service` (Windows only): running under the Service Control
//!   Manager (kpng's `--windows-service`), here because this crate is the one allowed FFI.
//! - [`dry_run`]: `--dry-run`, the HCN calls a sync would make, printed against HCN's
//!   state as read once, none made.
//! - [`HnsBackend`]: reconciliation that survives HNS (docs/windows.md lists the upstream bugs
//!   it is tested against).
//!
//! Like every backend it sees only the model, never a Kubernetes type.

mod backend;
pub mod dry_run;
pub mod hcn;
pub mod metrics;
pub mod plan;
pub mod schema;
#[cfg(windows)]
pub mod service;
pub mod sim;
pub mod summary;
#[cfg(windows)]
pub mod system;

pub use backend::{CleanupReport, HnsBackend, conjure_mac};
pub use plan::{ConfigError, HnsConfig};

#[cfg(test)]
mod tests;
