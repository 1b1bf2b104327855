//! Whether the API server answers, logged once per outage rather than once per attempt.
//!
//! Every request of the client passes through [`ReachabilityLayer`]: a connection error or a
//! 5xx answer while the server was reachable logs one warning; further failures are debug
//! lines; the first good answer after that logs how long the outage lasted. Watchers retry
//! on their own with backoff and jitter; the programmed rules stay untouched meanwhile.

use std::fmt::Display;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::SystemTime;

use futures::future::BoxFuture;
use kpng_model::input::InputHealth;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// The shared up/down state of one API server.
#[derive(Debug, Clone)]
pub struct Reachability {
    server: Arc<str>,
    state: Arc<Mutex<State>>,
    /// Where an outage is recorded for `kpng status`, as it begins and ends.
    health: InputHealth,
    /// The client's idle timeout (`--kube-api-idle-timeout`), named when a request ran into
    /// it: "timed out" alone does not tell a hung server from a slow network.
    idle_timeout: Option<std::time::Duration>,
}

#[derive(Debug, Default)]
struct State {
    down_since: Option<Instant>,
    failures: u64,
}

impl Reachability {
    /// Tracks the server at `server` (named in the log lines).
    pub fn new(server: &str) -> Reachability {
        Reachability {
            server: server.into(),
            state: Arc::default(),
            health: InputHealth::default(),
            idle_timeout: None,
        }
    }

    /// Names `timeout` (`--kube-api-idle-timeout`) when a request runs into it.
    pub fn with_idle_timeout(mut self, timeout: std::time::Duration) -> Reachability {
        self.idle_timeout = Some(timeout);
        self
    }

    /// Also records outages in `health`, which is named after the server.
    pub fn with_health(mut self, health: InputHealth) -> Reachability {
        health.set_source(format!("kube {}", self.server));
        self.health = health;
        self
    }

    /// Whether the last request failed to reach the server.
    pub fn is_down(&self) -> bool {
        self.lock().down_since.is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A request failed to reach the server (or the server failed it). Returns whether this
    /// failure began an outage (and was therefore logged as a warning).
    pub fn failed(&self, why: &dyn Display) -> bool {
        let mut s = self.lock();
        s.failures += 1;
        // Recorded before it is logged: whoever reads the warning and then asks `kpng status`
        // finds the problem there. The latest reason (a refused connection may become a
        // timeout).
        self.record(why);
        if s.down_since.is_none() {
            s.down_since = Some(Instant::now());
            warn!(
                server = %self.server,
                "API server unreachable: {why}; keeping the programmed rules, retrying with backoff"
            );
            true
        } else {
            debug!(server = %self.server, failures = s.failures, "API server still unreachable: {why}");
            false
        }
    }

    /// A request got an answer. Returns how long the outage it ends lasted, if it ends one.
    pub fn answered(&self) -> Option<std::time::Duration> {
        self.answered_to(None)
    }

    /// A request sent at `sent` got an answer. An answer to a request sent before the outage
    /// began (a watch whose headers arrive late, under load) says nothing about the server
    /// now: it neither ends the outage nor starts a second warning later.
    pub fn answered_to(&self, sent: Option<Instant>) -> Option<std::time::Duration> {
        let mut s = self.lock();
        if let (Some(sent), Some(since)) = (sent, s.down_since)
            && sent < since
        {
            return None;
        }
        let outage = s.down_since.take().map(|since| since.elapsed());
        if let Some(outage) = outage {
            self.health.recovered(API_SERVER);
            info!(
                server = %self.server,
                failed_requests = s.failures,
                ?outage,
                "API server reachable again"
            );
        }
        s.failures = 0;
        outage
    }
}

/// An error with its causes: hyper's own text is only "client error (Connect)", and the
/// operator needs the "Connection refused" or the TLS failure underneath.
struct WithCauses<'a>(&'a (dyn std::error::Error + Send + Sync));

impl Display for WithCauses<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(c) = cause {
            write!(f, ": {c}")?;
            cause = c.source();
        }
        Ok(())
    }
}

/// Whether `error` or one of its causes is an I/O timeout (the client's idle timeout).
fn timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(c) = cause {
        if c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        cause = c.source();
    }
    false
}

/// What an outage concerns, in `kpng status`.
const API_SERVER: &str = "API server";

impl Reachability {
    fn record(&self, why: &dyn Display) {
        self.health.failing(
            API_SERVER,
            &format!("unreachable: {why}; keeping the programmed rules, retrying with backoff"),
            SystemTime::now(),
        );
    }
}

/// Reports every request's outcome to a [`Reachability`].
#[derive(Debug, Clone)]
pub struct ReachabilityLayer(pub Reachability);

impl<S> tower::Layer<S> for ReachabilityLayer {
    type Service = Tracked<S>;

    fn layer(&self, inner: S) -> Tracked<S> {
        Tracked {
            inner,
            tracker: self.0.clone(),
        }
    }
}

/// A service whose outcomes are tracked.
#[derive(Debug, Clone)]
pub struct Tracked<S> {
    inner: S,
    tracker: Reachability,
}

impl<S, Req, B> tower::Service<Req> for Tracked<S>
where
    S: tower::Service<Req, Response = http::Response<B>>,
    S::Future: Send + 'static,
    S::Error: AsRef<dyn std::error::Error + Send + Sync>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let sent = Instant::now();
        let response = self.inner.call(request);
        let tracker = self.tracker.clone();
        Box::pin(async move {
            let result = response.await;
            match &result {
                Ok(r) if r.status().is_server_error() => {
                    tracker.failed(&r.status());
                }
                Ok(_) => {
                    tracker.answered_to(Some(sent));
                }
                Err(e) => {
                    let _ = match tracker.idle_timeout.filter(|_| timed_out(e.as_ref())) {
                        Some(timeout) => tracker.failed(&format!(
                        "nothing received for {timeout:?} (--kube-api-idle-timeout): a hung API \
                         server or a dropped connection ({})",
                        WithCauses(e.as_ref())
                    )),
                        None => tracker.failed(&WithCauses(e.as_ref())),
                    };
                }
            }
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_warning_per_outage() {
        let r = Reachability::new("http://127.0.0.1:1");
        assert_eq!(r.answered(), None, "no outage to end");
        // (attempt, begins an outage): only the first failure of each outage is a warning.
        let first = [r.failed(&"refused"), r.failed(&"refused"), r.failed(&"503")];
        assert_eq!(first, [true, false, false]);
        assert!(r.is_down());
        tokio::time::advance(std::time::Duration::from_secs(7)).await;
        assert_eq!(r.answered(), Some(std::time::Duration::from_secs(7)));
        assert!(!r.is_down());
        assert!(r.failed(&"refused"), "a new outage warns again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_answer_to_a_request_sent_before_the_outage_does_not_end_it() {
        let r = Reachability::new("http://127.0.0.1:1");
        let sent_before = Instant::now();
        tokio::time::advance(std::time::Duration::from_millis(10)).await;
        assert!(r.failed(&"refused"));
        assert_eq!(r.answered_to(Some(sent_before)), None);
        assert!(r.is_down(), "still down");
        assert!(!r.failed(&"refused"), "the same outage: no second warning");
        tokio::time::advance(std::time::Duration::from_secs(1)).await;
        let sent_after = Instant::now();
        assert!(
            r.answered_to(Some(sent_after)).is_some(),
            "a fresh answer ends it"
        );
    }
}
