//! What the backend last found and made in HCN, for `kpng status`: the CNI's network it
//! programs, the load balancers and remote endpoints it keeps there, and the planner's
//! warnings that still hold (a local endpoint HNS does not have, a missing root endpoint).
//!
//! Why: on a Windows node the first questions are "which HNS network is kpng using?" (the
//! `KUBE_NETWORK` mistakes of upstream's history) and "why is this endpoint not in the load
//! balancer?"; the answers live in the backend, which the sync loop owns, so the backend
//! publishes them here after each sync and the status reads this copy.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// The network the backend programs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkSummary {
    /// Its name (`--network-name`).
    pub name: String,
    /// Its GUID.
    pub id: String,
    /// Its type, as HCN says it (`L2Bridge`, `Overlay`, …).
    pub network_type: String,
    /// The CNI's endpoints on it (this node's pods).
    pub local_endpoints: usize,
    /// The root endpoint's address (`--root-hnsendpoint-name`), when found.
    pub root_endpoint: Option<IpAddr>,
}

/// The backend's last picture of HCN.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HnsSummary {
    /// The network, once discovered.
    pub network: Option<NetworkSummary>,
    /// Load balancers kpng keeps.
    pub load_balancers: usize,
    /// Remote endpoints kpng created (other nodes' pods).
    pub remote_endpoints: usize,
    /// Planner warnings that still hold.
    pub warnings: Vec<String>,
    /// The IP family the network is not served in, and why (an Overlay network is served
    /// single-stack, as winkernel; a network without a subnet of the family).
    pub skipped_family: Option<String>,
}

/// The summary shared between the backend (which writes it after each sync) and the status.
pub type SharedSummary = Arc<Mutex<HnsSummary>>;
