//! kpng's gRPC API, wire-compatible with KPNG's `localv1` (`service Sets { rpc Watch }`).
//!
//! - [`convert`]: one Service's node-local ports ↔ its `Service` and `Endpoint` messages.
//! - [`hub`]: the brain's state: one node-independent cluster, per-watcher coalesced change
//!   sets, per-node views computed only for the Services that changed.
//! - [`server`]: `to-api`, the gRPC server (TCP or Unix socket, optional TLS/mTLS).
//! - [`client`]: `local` / `api`, a remote brain as the runner's source.
//! - [`version`]: the `kpng-version` header each side sends, and the mismatch warning.
//! - [`proto`]: the generated messages, server and client.
//!
//! Sources and backends never depend on this crate; the binary wires it.

pub mod addr;
pub mod bundle;
pub mod client;
pub mod convert;
pub mod exposure;
#[cfg(test)]
mod fixtures;
pub mod frames;
pub mod hub;
pub mod identity;
pub mod metrics;
pub mod server;
pub mod version;

/// The generated `localv1` messages, `Sets` server and client.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    tonic::include_proto!("localv1");
}
