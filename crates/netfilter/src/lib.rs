//! Linux nf_tables netlink plumbing that more than one backend needs: the raw
//! `NETLINK_NETFILTER` socket ([`socket`]), message and attribute framing ([`attr`]), and the
//! nf_tables notification monitor ([`monitor`]) that tells a backend, within milliseconds,
//! that someone else changed or removed its table (a firewall reload, `nft flush ruleset`).
//!
//! It is a library below the backends, not a backend: the nftables backend writes its set
//! elements through [`socket`] and [`attr`]; the nftables backend and the userspace proxy's
//! capture both watch their tables with [`monitor`]; the nftables backend's start-up probe and
//! the binary's leftover sweep list tables with [`tables`] (a table dump: no set element is
//! read); the binary reads kube-proxy's `service-ips` map with [`elements`] (one map's
//! elements, no other table's); the nftables backend tells someone else's commits during its
//! own from kpng's with [`generation`], and so does the iptables backend in its nft variant (in
//! the shared tables, its own chains and the jumps to them only). Backends never depend on
//! each other. Both hold an [`anchor`] while they run: a table bound to kpng's process that
//! keeps established connections NATed while someone else flushes every other table.
//!
//! Unsafe code is confined to [`socket`] (std has no netlink sockets), each call with its SAFETY
//! argument.

pub mod anchor;
pub mod attr;
pub mod dump;
pub mod elements;
pub mod generation;
pub mod monitor;
pub mod rules;
pub mod socket;
pub mod tables;

use std::io;

/// Why the monitor could not start.
#[derive(Debug, thiserror::Error)]
#[error("{context}: {source}")]
pub struct MonitorError {
    /// What was being done.
    pub context: String,
    /// The system's answer.
    #[source]
    pub source: io::Error,
}

/// Wraps an I/O error with what was being done.
pub fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> MonitorError {
    let context = context.into();
    move |source| MonitorError { context, source }
}
