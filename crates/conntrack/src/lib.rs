//! Deletes stale UDP conntrack entries of Services: kube-proxy's conntrack reconciler.
//!
//! UDP has no connections, so conntrack keeps an entry alive as long as a client keeps
//! sending, and every packet of an entry follows the DNAT decision of its first packet. When
//! the endpoint behind it goes away, or when the first packet arrived before the Service had
//! endpoints (so it was never DNATed at all), the client is stuck until it stops sending for
//! the whole UDP timeout: the decade-old "DNS/statsd blackholed after a rollout or a
//! scale-to-zero" bug. After every successful sync the runner calls [`Reconciler::reconcile`],
//! which deletes exactly those entries (rule: [`StaleFilter`]) so the next packet is
//! load-balanced again.
//!
//! How it scales: entries are read with dumps filtered in the kernel (family, UDP and
//! `IPS_DST_NAT` in steady state; by destination for frontends seen for the first time; see
//! [`Reconciler`]), decided in memory without allocating per entry, and deleted by exact
//! tuple and id in batches of many requests per `send()` on one long-lived netlink socket
//! ([`ConntrackSocket`]). No process is started, nothing else is flushed.
//!
//! Start with [`Reconciler`] and [`pass_needed`]. The crate depends only on the model.

mod flow;
mod local_addrs;
pub mod memory;
mod reconciler;
mod socket;
mod stale;
mod wire;

#[cfg(test)]
mod test_support;

#[cfg(any(test, feature = "fake"))]
pub mod fake;

pub use flow::{Flow, IPPROTO_TCP, IPPROTO_UDP, Tuple};
pub use local_addrs::local_addresses;
pub use reconciler::{
    FALLBACK_MAX_NARROW_DUMPS, FlowTable, KernelTable, Pass, Reconciler, TableSize, TableUsage,
    pass_needed, table_usage,
};
pub use socket::{ConntrackSocket, DeleteOutcome};
pub use stale::{Frontend, StaleFilter};
pub use wire::DumpFilter;

/// Why talking to the kernel's conntrack table failed. The reconciler's caller logs it,
/// counts it and retries later; it is never fatal.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A socket operation failed, or the kernel refused a request (e.g. `EPERM` without
    /// `CAP_NET_ADMIN`).
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The kernel sent something that is not a netlink message.
    #[error("{op}: malformed netlink message: {detail}")]
    Malformed {
        /// What was being done.
        op: &'static str,
        /// What was wrong.
        detail: String,
    },
}
