//! The UDP session table of one listener: client address → endpoint (and whatever the proxy
//! keeps per session), ended after an idle timeout.
//!
//! Pure and clock-free: the caller passes `now` and reports activity. The proxy keeps one table
//! per UDP listener, owned by that listener's task, so no lock is needed.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

/// One client's session.
#[derive(Debug)]
pub struct Session<S> {
    /// The endpoint every datagram of this client goes to.
    pub endpoint: SocketAddr,
    /// The last datagram from the client.
    pub last_active: Instant,
    /// What the proxy keeps per session (its upstream socket and reply task).
    pub value: S,
}

/// Sessions by client address.
#[derive(Debug)]
pub struct SessionTable<S> {
    idle_timeout: Duration,
    sessions: HashMap<SocketAddr, Session<S>>,
}

impl<S> SessionTable<S> {
    /// An empty table whose sessions end after `idle_timeout` without traffic.
    pub fn new(idle_timeout: Duration) -> SessionTable<S> {
        SessionTable {
            idle_timeout,
            sessions: HashMap::new(),
        }
    }

    /// The idle timeout.
    pub fn idle_timeout(&self) -> Duration {
        self.idle_timeout
    }

    /// The live session of `client`, marked active at `now`.
    pub fn touch(&mut self, client: SocketAddr, now: Instant) -> Option<&Session<S>> {
        let s = self.sessions.get_mut(&client)?;
        s.last_active = now;
        Some(s)
    }

    /// Starts a session (replacing any previous one of that client, which is returned).
    pub fn insert(
        &mut self,
        client: SocketAddr,
        endpoint: SocketAddr,
        value: S,
        now: Instant,
    ) -> Option<Session<S>> {
        self.sessions.insert(
            client,
            Session {
                endpoint,
                last_active: now,
                value,
            },
        )
    }

    /// Ends the sessions idle for longer than the timeout at `now`. `replied_at` tells when a
    /// session last carried a reply: a session is idle only when neither direction moved.
    pub fn expire(
        &mut self,
        now: Instant,
        replied_at: impl Fn(&S) -> Option<Instant>,
    ) -> Vec<Session<S>> {
        let timeout = self.idle_timeout;
        self.remove_where(|s| {
            let last = replied_at(&s.value).map_or(s.last_active, |r| r.max(s.last_active));
            now.saturating_duration_since(last) > timeout
        })
    }

    /// Ends the sessions whose endpoint no longer `serves`: the client's next datagram starts a
    /// new session on a current endpoint.
    pub fn retain_endpoints(&mut self, serves: impl Fn(SocketAddr) -> bool) -> Vec<Session<S>> {
        self.remove_where(|s| !serves(s.endpoint))
    }

    fn remove_where(&mut self, gone: impl Fn(&Session<S>) -> bool) -> Vec<Session<S>> {
        let keys: Vec<SocketAddr> = self
            .sessions
            .iter()
            .filter(|(_, s)| gone(s))
            .map(|(k, _)| *k)
            .collect();
        keys.iter()
            .filter_map(|k| self.sessions.remove(k))
            .collect()
    }

    /// Number of live sessions.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Whether no session is live.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }
}

#[cfg(test)]
mod tests;
