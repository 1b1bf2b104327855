//! Whether the API server answers, logged once per outage rather than once per attempt.
//!
//! Every request of the client passes through [`ReachabilityLayer`]: a connection error, a
//! 5xx or a 429 answer while the server was reachable logs one warning (and is the input's
//! `API server` problem in `kpng status`); further failures are debug lines; the first good
//! answer after that logs how long the outage lasted. The words say which it is
//! ([`Failure`]): `unreachable` (no answer: a refused or reset connection, TLS, a timeout),
//! `unavailable` (a 5xx: the server or a proxy in front of it answers but cannot serve) or
//! `throttled` (a 429: the server is up and sheds kpng's requests, API Priority and Fairness);
//! each calls for a different look, and a 429 read "unreachable" sent operators after the
//! network. Watchers retry on their own with
//! backoff and jitter (at least the `Retry-After` a 429 or 503 asked for), and a watcher
//! waiting out its backoff retries soon after the outage ends; the programmed rules stay
//! untouched meanwhile.
//!
//! A request still waiting for its answer's headers when the outage ends is one sent to the
//! hung or dead server (a stall, a connection that went silent): it would wait for the idle
//! timeout (90 s by default) while everything says the server is back. So:
//!
//! - when an answer ends an outage, every GET sent before it that has no headers yet is
//!   cancelled ([`Superseded`]) and the watcher makes it again at once;
//! - a GET sent during an outage gets [`OUTAGE_HEADER_TIMEOUT`] (at most the idle timeout)
//!   for its headers: without that, if every watcher's request hung, none would ever succeed
//!   to end the outage before the idle timeout. Only while the server does not answer at all
//!   (`unreachable`): a server answering 429 or 5xx is up, and its slow answers are waited
//!   for;
//! - when an answer ends an outage, every response body of a GET (a streaming watch, a list
//!   being read) that has received nothing since the outage began is ended
//!   ([`crate::liveness`]): the watcher resumes from its last resourceVersion at once;
//! - an outage that only silent streams would sit through is found by a probe
//!   ([`Reachability::keep_alive`]).
//!
//! client-go has no list timeout of its own (`rest.Config.Timeout` is 0 for kube-proxy); a
//! dead connection is found by its HTTP/2 health check (a ping after 30 s without frames,
//! 15 s for its answer), which a server that is up but hung answers. kpng speaks HTTP/1.1 to
//! the API server, so the idle timeout plays that part, and the two rules above end what a
//! hang left behind as soon as the server answers again.

use std::fmt::Display;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::SystemTime;

use futures::future::BoxFuture;
use kpng_model::input::InputHealth;

use crate::liveness::{Open, Watched};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// The shared up/down state of one API server.
#[derive(Debug, Clone)]
pub struct Reachability {
    pub(crate) server: Arc<str>,
    state: Arc<Mutex<State>>,
    /// Where an outage is recorded for `kpng status`, as it begins and ends.
    pub(crate) health: InputHealth,
    /// The client's idle timeout (`--kube-api-idle-timeout`), named when a request ran into
    /// it: "timed out" alone does not tell a hung server from a slow network.
    pub(crate) idle_timeout: Option<std::time::Duration>,
    /// The start of the last outage that ended, sent as it ends: a request waiting for its
    /// headers then was sent to the hung server and is cancelled, and a response body that
    /// received nothing since that start is ended.
    pub(crate) recoveries: Arc<watch::Sender<Option<Instant>>>,
    /// Open response bodies of reads, and when anything last came from the server: what
    /// [`Reachability::keep_alive`] probes on.
    pub(crate) streams: Arc<Mutex<Streams>>,
}

/// Response bodies of reads and when the server was last heard from.
#[derive(Debug)]
pub(crate) struct Streams {
    /// Outstanding GETs (watches, lists): waiting for their answer or reading its body.
    pub(crate) open: usize,
    /// When the last answer's headers or body bytes arrived, from any request.
    pub(crate) heard: Instant,
    /// When a read's bytes last moved "last good input" (see `Reachability::read_progressed`).
    pub(crate) good_marked: Option<Instant>,
}

/// How long a GET sent while the API server is unreachable waits for its answer's headers
/// (at most `--kube-api-idle-timeout`). An API server sends a list's headers once it has the
/// page, a watch's at once; one that is back answers well within this, one that is not
/// leaves the request to be made again with backoff.
pub const OUTAGE_HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// What a failed request says about the API server: how an outage is worded in the log and in
/// `kpng status`, since each calls for a different look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No answer: a connection refused or reset, a TLS failure, a timeout, a hung server.
    Unreachable,
    /// A 5xx answer: the server, or a proxy in front of it, answers but cannot serve.
    Unavailable,
    /// A 429 answer: the server is up and throttling kpng (API Priority and Fairness, the
    /// max-in-flight limit); the `Retry-After` it sends is honoured.
    Throttled,
}

impl Failure {
    /// The failure an answer with `status` is, if it is one: a 5xx, or a 429.
    pub fn of_status(status: http::StatusCode) -> Option<Failure> {
        if status == http::StatusCode::TOO_MANY_REQUESTS {
            Some(Failure::Throttled)
        } else if status.is_server_error() {
            Some(Failure::Unavailable)
        } else {
            None
        }
    }

    /// The word for it: `unreachable`, `unavailable` or `throttled`.
    pub fn word(self) -> &'static str {
        match self {
            Failure::Unreachable => "unreachable",
            Failure::Unavailable => "unavailable",
            Failure::Throttled => "throttled",
        }
    }

    /// What kpng does meanwhile (and, for a 429, what it means).
    fn meanwhile(self) -> &'static str {
        match self {
            Failure::Unreachable | Failure::Unavailable => {
                "keeping the programmed rules, retrying with backoff"
            }
            Failure::Throttled => {
                "the server is up and sheds kpng's requests (API Priority and Fairness); \
                 keeping the programmed rules, retrying with backoff, no sooner than its \
                 Retry-After"
            }
        }
    }

    /// The INFO line that ends an outage whose last failure was this.
    fn over(self) -> &'static str {
        match self {
            Failure::Unreachable => "API server reachable again",
            Failure::Unavailable => "API server available again",
            Failure::Throttled => "API server no longer throttling",
        }
    }
}

/// A request cancelled because the outage it was sent into ended while it still had no
/// answer: the watcher makes it again at once (no backoff, see `crate::backoff`).
#[derive(Debug, thiserror::Error)]
#[error(
    "cancelled: sent before the API server was reachable again and still unanswered; \
     making it again"
)]
pub struct Superseded;

/// A GET sent during an outage that got no headers within [`OUTAGE_HEADER_TIMEOUT`].
#[derive(Debug, thiserror::Error)]
#[error("no answer within {0:?} while the API server is unreachable")]
pub struct NoAnswerDuringOutage(std::time::Duration);

#[derive(Debug, Default)]
struct State {
    down_since: Option<Instant>,
    /// When the server was last heard from before the outage began (an outage is detected
    /// only after a hang's probe or idle timeout): named when it ends.
    silent_since: Option<Instant>,
    failures: u64,
    /// What the last failure of the outage was (the status shows its words).
    last_failure: Option<Failure>,
    /// Until when the server asked not to be asked again (`Retry-After` of a 429 or 503).
    retry_after: Option<Instant>,
}

impl Reachability {
    /// Tracks the server at `server` (named in the log lines).
    pub fn new(server: &str) -> Reachability {
        Reachability {
            server: server.into(),
            state: Arc::default(),
            health: InputHealth::default(),
            idle_timeout: None,
            recoveries: Arc::new(watch::Sender::new(None)),
            streams: Arc::new(Mutex::new(Streams {
                open: 0,
                heard: Instant::now(),
                good_marked: None,
            })),
        }
    }

    /// How long a GET sent during an outage waits for its headers.
    pub(crate) fn outage_header_timeout(&self) -> std::time::Duration {
        self.idle_timeout
            .map_or(OUTAGE_HEADER_TIMEOUT, |t| t.min(OUTAGE_HEADER_TIMEOUT))
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

    /// Whether the server is down because it does not answer (not because it answers 5xx or
    /// 429): only then is a read without headers after [`OUTAGE_HEADER_TIMEOUT`] hung rather
    /// than slow. A throttled or overloaded server answers late; cutting its lists at 5 s
    /// made every attempt fail again and added to its load.
    pub fn is_unreachable(&self) -> bool {
        let s = self.lock();
        s.down_since.is_some() && s.last_failure == Some(Failure::Unreachable)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A request failed to reach the server. Returns whether this failure began an outage
    /// (and was therefore logged as a warning).
    pub fn failed(&self, why: &dyn Display) -> bool {
        self.failed_as(Failure::Unreachable, why)
    }

    /// A request failed as `failure` says (no answer, a 5xx, a 429). Returns whether this
    /// failure began an outage (and was therefore logged as a warning): one warning per
    /// outage whatever its failures are, worded after the first; the status has the latest.
    pub fn failed_as(&self, failure: Failure, why: &dyn Display) -> bool {
        // Read before the state is locked (`heard` locks them in the other order).
        let heard = self.streams().heard;
        let mut s = self.lock();
        s.failures += 1;
        s.last_failure = Some(failure);
        // Recorded before it is logged: whoever reads the warning and then asks `kpng status`
        // finds the problem there. The latest reason (a refused connection may become a
        // timeout, a 429 a 503).
        self.record(failure, why);
        let word = failure.word();
        if s.down_since.is_none() {
            s.down_since = Some(Instant::now());
            s.silent_since = Some(heard);
            warn!(
                server = %self.server,
                "API server {word}: {why}; {}", failure.meanwhile()
            );
            true
        } else {
            debug!(server = %self.server, failures = s.failures, "API server still {word}: {why}");
            false
        }
    }

    /// The server answered with `Retry-After` (seconds, as the API server sends it):
    /// watchers wait at least that long before their next attempt.
    pub(crate) fn asked_to_wait(&self, wait: std::time::Duration) {
        // Bounded: a bogus header must not park the watchers for hours.
        let wait = wait.min(crate::backoff::MAX);
        self.lock().retry_after = Some(Instant::now() + wait);
    }

    /// How much longer the server asked not to be asked again, if it did.
    pub(crate) fn retry_after(&self) -> Option<std::time::Duration> {
        let until = self.lock().retry_after?;
        let left = until.saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left)
    }

    /// A request got an answer. Returns how long the outage it ends lasted, if it ends one.
    pub fn answered(&self) -> Option<std::time::Duration> {
        self.answered_to(None)
    }

    /// A request sent at `sent` got an answer. An answer to a request sent before the outage
    /// began (a watch whose headers arrive late, under load) says nothing about the server
    /// now: it neither ends the outage nor starts a second warning later.
    pub fn answered_to(&self, sent: Option<Instant>) -> Option<std::time::Duration> {
        self.end_outage(sent).map(|(outage, _)| outage)
    }

    /// [`Reachability::answered_to`]; returns, for an outage it ends, how long ago it was
    /// detected and how long nothing had come from the server (since before it was detected:
    /// a hang is found only after a probe's silence or the idle timeout).
    fn end_outage(
        &self,
        sent: Option<Instant>,
    ) -> Option<(std::time::Duration, std::time::Duration)> {
        let mut s = self.lock();
        if let (Some(sent), Some(since)) = (sent, s.down_since)
            && sent < since
        {
            return None;
        }
        let began = s.down_since.take();
        let silent_since = s.silent_since.take();
        let last_failure = s.last_failure.take().unwrap_or(Failure::Unreachable);
        s.retry_after = None;
        let outage = began.map(|since| since.elapsed());
        let mut ended = None;
        if let Some(outage) = outage {
            self.health.recovered(API_SERVER);
            // "Last good input" says when the input was last known current: now (if it
            // loaded before and nothing else is wrong).
            self.health.still_good(SystemTime::now());
            // Requests still waiting on the hung server are cancelled and made again, and
            // streams silent since the outage began are ended and resumed.
            self.recoveries.send_replace(began);
            // Detected is not begun: a hang is found only after a probe's silence (30 s by
            // default) or the idle timeout, so both are named.
            let silent = silent_since.map_or(outage, |heard| heard.elapsed().max(outage));
            info!(
                server = %self.server,
                failed_requests = s.failures,
                outage_since_detected = ?outage,
                nothing_heard_for = ?silent,
                "{}",
                last_failure.over()
            );
            ended = Some((outage, silent));
        }
        s.failures = 0;
        ended
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
    fn record(&self, failure: Failure, why: &dyn Display) {
        self.health.failing(
            API_SERVER,
            &format!("{}: {why}; {}", failure.word(), failure.meanwhile()),
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

impl<S, ReqBody, B> tower::Service<http::Request<ReqBody>> for Tracked<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<B>>,
    S::Future: Send + 'static,
    S::Error:
        AsRef<dyn std::error::Error + Send + Sync> + From<Superseded> + From<NoAnswerDuringOutage>,
    B: http_body::Body + Unpin + Send + 'static,
    B::Error: Into<tower::BoxError>,
{
    type Response = http::Response<Watched<B>>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let sent = Instant::now();
        // Only reads are cancelled and made again: an Event posted twice would be two.
        let get = request.method() == http::Method::GET;
        let response = self.inner.call(request);
        let tracker = self.tracker.clone();
        // Subscribed now: an outage that ends from here on supersedes this request.
        let mut recovered = tracker.recoveries.subscribe();
        let header_timeout = tracker.outage_header_timeout();
        // A read waiting for its answer is outstanding: a hang now is probed for.
        let waiting = get.then(|| Open::new(&tracker));
        Box::pin(async move {
            let mut response = std::pin::pin!(response);
            let mut check = tokio::time::interval_at(sent + header_timeout, header_timeout);
            let mut watching = get;
            let result = loop {
                tokio::select! {
                    biased;
                    result = &mut response => break result,
                    changed = recovered.changed(), if watching => {
                        if changed.is_err() {
                            watching = false;
                            continue;
                        }
                        debug!(server = %tracker.server, "{Superseded}");
                        return Err(Superseded.into());
                    }
                    _ = check.tick(), if get => {
                        if tracker.is_unreachable() {
                            let error = NoAnswerDuringOutage(header_timeout);
                            tracker.failed(&error);
                            return Err(error.into());
                        }
                    }
                }
            };
            if result.is_ok() {
                tracker.heard();
            }
            match &result {
                Ok(r) if let Some(failure) = Failure::of_status(r.status()) => {
                    let retry_after = r
                        .headers()
                        .get(http::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .map(std::time::Duration::from_secs);
                    if let Some(wait) = retry_after {
                        tracker.asked_to_wait(wait);
                    }
                    let asked =
                        retry_after.map_or(String::new(), |w| format!(" (Retry-After {w:?})"));
                    tracker.failed_as(failure, &format_args!("it answers {}{asked}", r.status()));
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
            // A read's body is followed: ended if it stays silent across an outage's end.
            let followed = result.map(|r| r.map(|body| Watched::new(body, &tracker, get)));
            drop(waiting);
            followed
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

    /// Each failure is worded for what it says about the server, in the record `kpng status`
    /// shows: a 429 is the server throttling kpng (it read "unreachable", which sent operators
    /// after the network), a 5xx the server unable to serve, no answer unreachable. One
    /// warning per outage still: a 429 then a 503 is one outage, the record has the latest.
    #[tokio::test(start_paused = true)]
    async fn each_failure_is_worded_for_what_it_says_about_the_server() {
        let cases = [
            (
                http::StatusCode::TOO_MANY_REQUESTS,
                Some(Failure::Throttled),
            ),
            (
                http::StatusCode::SERVICE_UNAVAILABLE,
                Some(Failure::Unavailable),
            ),
            (
                http::StatusCode::GATEWAY_TIMEOUT,
                Some(Failure::Unavailable),
            ),
            (
                http::StatusCode::INTERNAL_SERVER_ERROR,
                Some(Failure::Unavailable),
            ),
            (http::StatusCode::FORBIDDEN, None),
            (http::StatusCode::OK, None),
        ];
        for (status, want) in cases {
            assert_eq!(Failure::of_status(status), want, "{status}");
        }
        let health = InputHealth::default();
        let r = Reachability::new("http://127.0.0.1:1").with_health(health.clone());
        let shown = || health.state().problems[API_SERVER].message.clone();
        let words = [
            (
                Failure::Throttled,
                "it answers 429 Too Many Requests (Retry-After 2s)",
                true,
            ),
            (
                Failure::Unavailable,
                "it answers 503 Service Unavailable",
                false,
            ),
            (Failure::Unreachable, "Connection refused", false),
        ];
        for (failure, why, warns) in words {
            assert_eq!(r.failed_as(failure, &why), warns, "{failure:?}");
            let message = shown();
            assert!(
                message.starts_with(&format!("{}: {why}; ", failure.word())),
                "{message}"
            );
        }
        assert!(!r.failed_as(Failure::Throttled, &"x"), "the same outage");
        assert!(
            shown().starts_with("throttled: x; the server is up"),
            "{}",
            shown()
        );
        assert!(r.answered().is_some());
        assert!(health.state().problems.is_empty());
    }

    /// A hang is detected only after a silence: the end of the outage names both how long
    /// ago it was detected and how long nothing came (the 61 s hang read "outage=28.8s").
    #[tokio::test(start_paused = true)]
    async fn the_end_of_an_outage_names_the_silence_before_it_was_detected() {
        let s = std::time::Duration::from_secs;
        let r = Reachability::new("http://127.0.0.1:1");
        r.heard();
        tokio::time::advance(s(35)).await;
        assert!(r.failed(&"no answer to the probe"));
        tokio::time::advance(s(26)).await;
        assert_eq!(r.end_outage(None), Some((s(26), s(61))));
        // A failure with no silence before it (a 503): both the same.
        r.heard();
        assert!(r.failed(&"it answers 503"));
        tokio::time::advance(s(4)).await;
        assert_eq!(r.end_outage(None), Some((s(4), s(4))));
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
