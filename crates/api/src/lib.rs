//! kpng's gRPC API, wire-compatible with KPNG's `localv1` (`service Sets { rpc Watch }`).
//!
//! - [`convert`]: one Service's node-local ports ↔ its `Service` and `Endpoint` messages.
//! - [`proto`]: the generated messages, server and client.

pub mod convert;
#[cfg(test)]
mod fixtures;
pub mod hub;
pub mod metrics;

/// The generated `localv1` messages, `Sets` server and client.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    tonic::include_proto!("localv1");
}
