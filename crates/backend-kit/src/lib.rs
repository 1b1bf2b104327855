//! The backend kit: what every backend that programs a node needs and the contract
//! (`kpng-backend`) deliberately leaves out, written once.
//!
//! - [`families`]: one sync, per IP family, every family attempted, the first error reported.
//! - [`owners`]: stable small ids for Service ports, so that data-plane objects several ports
//!   want (a shared ClusterIP, a hairpin pair) can be owned and handed over.
//! - [`claims`]: the owner-keyed store of those objects (hashes only), diffed into minimal
//!   operations, the lowest owner winning.
//! - [`exec`]: text transactions through a tool (`nft -f -`, `iptables-restore`), a dry run
//!   that prints them, and a recorder for tests, with one error type.
//! - [`conformance`]: the contract checked at the fake level for any backend, scenario by
//!   scenario beside the real-packet suite (`crates/kpng/tests/e2e`), so a new backend runs
//!   both.
//!
//! Platform-free: a Windows or eBPF backend uses the same kit.

pub mod claims;
pub mod conformance;
pub mod exec;
pub mod families;
pub mod owners;
