//! Endpoint selection for one endpoint list: round robin, with optional ClientIP affinity.
//!
//! Pure and clock-free: every call that needs the time takes `now`, so tests step time by hand
//! and the proxy passes tokio's clock.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::time::Instant;

/// How many picks may pass between two sweeps of expired affinity entries, at least: sweeping
/// costs O(entries), so it runs once per that many picks (amortised O(1) per pick).
const MIN_SWEEP_INTERVAL: usize = 64;

/// One client's sticky endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sticky {
    endpoint: SocketAddr,
    /// The last time a new connection or session of this client used it.
    last_used: Instant,
}

/// Round robin over one endpoint list, with optional ClientIP session affinity.
///
/// Affinity follows kube-proxy: a client keeps its endpoint while it opens a new connection at
/// least every `timeout`; an entry expires `timeout` after its client's last new connection, and
/// is forgotten at once when its endpoint leaves the list or a connection to it fails.
#[derive(Debug, Default)]
pub struct Balancer {
    endpoints: Vec<SocketAddr>,
    next: usize,
    timeout: Option<Duration>,
    sticky: HashMap<IpAddr, Sticky>,
    picks_since_sweep: usize,
}

impl Balancer {
    /// An empty balancer: every pick fails until endpoints are set.
    pub fn new() -> Balancer {
        Balancer::default()
    }

    /// Replaces the endpoint list and the affinity timeout (`None`: no affinity).
    ///
    /// The round-robin position is kept (modulo the new length), affinity entries of endpoints
    /// that left are dropped, and the others keep their last use under the new timeout.
    pub fn update(&mut self, endpoints: Vec<SocketAddr>, timeout: Option<Duration>) {
        self.next = if endpoints.is_empty() {
            0
        } else {
            self.next % endpoints.len()
        };
        self.endpoints = endpoints;
        self.timeout = timeout;
        if self.timeout.is_none() {
            self.sticky.clear();
        } else {
            let live = &self.endpoints;
            self.sticky.retain(|_, s| live.contains(&s.endpoint));
        }
    }

    /// The endpoints, in selection order.
    pub fn endpoints(&self) -> &[SocketAddr] {
        &self.endpoints
    }

    /// Chooses the endpoint for a new connection (or UDP session) from `client`; `None` when the
    /// list is empty.
    pub fn pick(&mut self, client: IpAddr, now: Instant) -> Option<SocketAddr> {
        if self.endpoints.is_empty() {
            return None;
        }
        if let Some(timeout) = self.timeout {
            self.maybe_sweep(timeout, now);
            if let Some(s) = self.sticky.get_mut(&client)
                && now.saturating_duration_since(s.last_used) <= timeout
            {
                s.last_used = now;
                return Some(s.endpoint);
            }
        }
        let endpoint = self.endpoints[self.next % self.endpoints.len()];
        self.next = (self.next + 1) % self.endpoints.len();
        if self.timeout.is_some() {
            self.sticky.insert(
                client,
                Sticky {
                    endpoint,
                    last_used: now,
                },
            );
        }
        Some(endpoint)
    }

    /// A connection from `client` to `endpoint` failed: the client is not kept on it (its next
    /// attempt is balanced afresh), as kube-proxy's userspace mode reset affinity on dial errors.
    pub fn failed(&mut self, client: IpAddr, endpoint: SocketAddr) {
        if self
            .sticky
            .get(&client)
            .is_some_and(|s| s.endpoint == endpoint)
        {
            self.sticky.remove(&client);
        }
    }

    /// The endpoint `client` sticks to at `now`, if any (the conformance harness reads where
    /// the next connection of a client goes).
    #[cfg(test)]
    pub fn sticky(&self, client: IpAddr, now: Instant) -> Option<SocketAddr> {
        let timeout = self.timeout?;
        self.sticky
            .get(&client)
            .filter(|s| now.saturating_duration_since(s.last_used) <= timeout)
            .map(|s| s.endpoint)
    }

    /// Number of affinity entries held (expired ones included until the next sweep).
    pub fn affinity_entries(&self) -> usize {
        self.sticky.len()
    }

    fn maybe_sweep(&mut self, timeout: Duration, now: Instant) {
        self.picks_since_sweep += 1;
        if self.picks_since_sweep < MIN_SWEEP_INTERVAL.max(self.sticky.len()) {
            return;
        }
        self.picks_since_sweep = 0;
        self.sticky
            .retain(|_, s| now.saturating_duration_since(s.last_used) <= timeout);
    }
}

#[cfg(test)]
mod tests;
