//! Streams that went silent when the API server hung: found, and resumed once it answers.
//!
//! A watch already streaming when the API server hung (or a middlebox lost the connection)
//! gets nothing more, and nothing tells it apart from a quiet watch: a healthy one gets a
//! bookmark only about once a minute (the API server's watch cache sends one roughly every
//! minute and 2 s before the watch's `timeoutSeconds`), so the idle timeout
//! (`--kube-api-idle-timeout`, 90 s) is the only bound on its silence. Changes made after the
//! server is back waited for it. Two rules end that within seconds of the server's return:
//!
//! - **A stream silent since an outage began is resumed when the outage ends.** Every
//!   response body of a read ([`Watched`]) notes when it last received bytes; when an answer
//!   ends an outage (see [`crate::reachability`]), each body that received nothing since the
//!   outage began ends with [`Superseded`], and kube-runtime's watcher watches again from its
//!   last resourceVersion at once: no relist, and the server replays every event after that
//!   version, so none is lost. A stream that received anything meanwhile (its connection
//!   survived) is left alone.
//! - **An outage that only silent streams would sit through is probed for**
//!   ([`Reachability::keep_alive`]): while a read is outstanding (waiting for its answer's
//!   headers, or its body open) and nothing at all came from
//!   the server for a third of the idle timeout (30 s by default), the client asks for
//!   `GET /version`. No answer within 5 s (at most the idle timeout) begins an outage; then
//!   the probe is repeated every 1 to 4 s (doubling, with jitter), and the first answer ends
//!   it. This is client-go's HTTP/2 health check (a ping after 30 s without a frame, 15 s for
//!   its answer) for kpng's HTTP/1.1 connections, which carry no ping.
//!
//! In the normal case nothing changes: bookmarks and events keep the client from going
//! silent, a quiet one costs one small request per third of the idle timeout, and no stream
//! is ended without an outage.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::debug;

use crate::backoff::Delays;
use crate::reachability::{Reachability, Superseded};

/// How long the client may hear nothing (with a read's body open) before it probes, when
/// no idle timeout is set: client-go's HTTP/2 `ReadIdleTimeout`.
pub const PROBE_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// How often a streaming read moves "last good input" at most (a watch's every event would
/// take the input record's lock).
pub const GOOD_MARKED_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// The first delay between probes during an outage (doubling, with jitter).
const PROBE_RETRY_MIN: std::time::Duration = std::time::Duration::from_secs(1);

/// The longest delay between probes during an outage: a server that is back is noticed
/// within this.
const PROBE_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(4);

/// How often the probe looks at the client's silence.
const PROBE_TICK: std::time::Duration = std::time::Duration::from_millis(250);

/// A probe that got no answer while every open stream was silent.
#[derive(Debug, thiserror::Error)]
#[error(
    "no answer within {limit:?} to GET /version, asked after nothing came from the server for \
     {silence:?} (a hung API server or a dropped connection)"
)]
pub struct ProbeUnanswered {
    silence: std::time::Duration,
    limit: std::time::Duration,
}

/// Waits for the next outage to end; yields the receiver back and when that outage began.
type Recovery = BoxFuture<'static, (watch::Receiver<Option<Instant>>, Option<Instant>)>;

fn next_recovery(mut rx: watch::Receiver<Option<Instant>>) -> Recovery {
    Box::pin(async move {
        if rx.changed().await.is_err() {
            // The client is gone: no outage will end.
            return std::future::pending().await;
        }
        let began = *rx.borrow_and_update();
        (rx, began)
    })
}

/// Counts an outstanding read (a GET waiting for its answer, or its body being read) until
/// dropped: what [`Reachability::keep_alive`] probes on. A read still waiting for its headers
/// counts too: a server that hangs while the watchers make their requests (at start, or as
/// they resume after an outage) would otherwise be found only by the idle timeout.
#[derive(Debug)]
pub(crate) struct Open(Reachability);

impl Open {
    /// Counts one more outstanding read of `tracker`'s server.
    pub(crate) fn new(tracker: &Reachability) -> Open {
        tracker.streams().open += 1;
        Open(tracker.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let mut streams = self.0.streams();
        streams.open = streams.open.saturating_sub(1);
    }
}

/// A response body followed for the client's liveness: every frame counts as hearing from
/// the server, and a read's body silent since an outage began ends with [`Superseded`] when
/// the outage ends.
pub struct Watched<B> {
    inner: B,
    tracker: Reachability,
    /// When this body last received a frame (at first: when its headers came).
    last: Instant,
    /// A read's wait for the end of an outage (`None` for other requests, or once ended).
    recovery: Option<Recovery>,
    /// Counted among the open reads while it is.
    open: Option<Open>,
    /// Ended by a recovery: nothing more is read.
    ended: bool,
}

impl<B> Watched<B> {
    /// Follows `inner`, the body of an answer to a request tracked by `tracker`; only a read
    /// (`get`) is ended by a recovery and counts as an open stream.
    pub(crate) fn new(inner: B, tracker: &Reachability, get: bool) -> Watched<B> {
        let (recovery, open) = if get {
            (
                Some(next_recovery(tracker.recoveries.subscribe())),
                Some(Open::new(tracker)),
            )
        } else {
            (None, None)
        };
        Watched {
            inner,
            tracker: tracker.clone(),
            last: Instant::now(),
            recovery,
            open,
            ended: false,
        }
    }
}

impl<B> Body for Watched<B>
where
    B: Body + Unpin,
    B::Error: Into<tower::BoxError>,
{
    type Data = B::Data;
    type Error = tower::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, tower::BoxError>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.last = Instant::now();
                this.tracker.heard();
                if this.open.is_some() {
                    this.tracker.read_progressed();
                }
                return Poll::Ready(Some(Ok(frame)));
            }
            Poll::Ready(Some(Err(e))) => {
                let e: tower::BoxError = e.into();
                if this.open.is_some() {
                    // kube's client turns a watch cut mid-stream into the watch's end (and
                    // warns "eof in poll", a line kpng's filter leaves out): the watcher
                    // resumes from its resourceVersion, and only a reconnect that fails is
                    // an outage, warned about once.
                    debug!(
                        server = %this.tracker.server,
                        "a read's answer was cut: {e}; its watch resumes from its \
                         resourceVersion (a list is made again)"
                    );
                }
                return Poll::Ready(Some(Err(e)));
            }
            Poll::Ready(None) => {
                this.open = None;
                return Poll::Ready(None);
            }
            Poll::Pending => {}
        }
        // Nothing to read: did an outage end that this body stayed silent through?
        while let Some(recovery) = this.recovery.as_mut() {
            let Poll::Ready((rx, began)) = recovery.as_mut().poll(cx) else {
                break;
            };
            if began.is_some_and(|began| this.last < began) {
                this.ended = true;
                this.recovery = None;
                this.open = None;
                debug!(
                    server = %this.tracker.server,
                    "a stream silent since the outage began is ended: {Superseded}"
                );
                return Poll::Ready(Some(Err(Box::new(Superseded))));
            }
            this.recovery = Some(next_recovery(rx));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Reachability {
    pub(crate) fn streams(&self) -> std::sync::MutexGuard<'_, crate::reachability::Streams> {
        self.streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Something (an answer's headers, a body's bytes) came from the server now.
    pub(crate) fn heard(&self) {
        self.streams().heard = Instant::now();
    }

    /// A read's body received bytes (a watch event, a bookmark, a list page): while the
    /// server is reachable, the input is current, so "last good input"
    /// (`kpng_input_last_good_timestamp_seconds`) moves, at most every
    /// [`GOOD_MARKED_EVERY`]. It moved only on a completed list, so a healthy node that
    /// kept watching showed its start time, and an alert on its age fired on healthy nodes.
    pub(crate) fn read_progressed(&self) {
        let now = Instant::now();
        {
            let mut streams = self.streams();
            if streams
                .good_marked
                .is_some_and(|at| now.duration_since(at) < GOOD_MARKED_EVERY)
            {
                return;
            }
            streams.good_marked = Some(now);
        }
        if !self.is_down() {
            self.health.still_good(std::time::SystemTime::now());
        }
    }

    /// How long the client may hear nothing before it probes: a third of the idle timeout
    /// (a hang is noticed well before a silent connection runs into it), [`PROBE_AFTER`]
    /// without one.
    fn probe_after(&self) -> std::time::Duration {
        self.idle_timeout.map_or(PROBE_AFTER, |t| t / 3)
    }

    /// Probes the server through `client` for as long as it runs (see the module): while a
    /// read is outstanding and nothing came from the server for `Self::probe_after`, and
    /// during an outage, so that its end is noticed and silent streams are resumed. Runs
    /// until dropped.
    pub async fn keep_alive(self, client: kube::Client) {
        let silence = self.probe_after();
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::from(d.subsec_nanos()))
            .unwrap_or(1);
        let mut delays = Delays::between(PROBE_RETRY_MIN, PROBE_RETRY_MAX, seed);
        let mut probes = FuturesUnordered::new();
        let mut next_retry = Instant::now();
        let mut tick = tokio::time::interval(
            PROBE_TICK
                .min(silence / 2)
                .max(std::time::Duration::from_millis(10)),
        );
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let now = Instant::now();
                    let (open, heard) = {
                        let streams = self.streams();
                        (streams.open, streams.heard)
                    };
                    let down = self.is_down();
                    // During an outage even without an open read (every watch failed, each
                    // waiting out its backoff): the probe's answer ends it, and they retry.
                    if open == 0 && !down {
                        continue;
                    }
                    if down {
                        if now >= next_retry {
                            probes.push(self.probe(client.clone(), silence));
                            next_retry = now + delays.next_delay();
                        }
                    } else if probes.is_empty() && now >= heard + silence {
                        delays.reset();
                        probes.push(self.probe(client.clone(), silence));
                        next_retry = now + delays.next_delay();
                    }
                }
                Some(()) = probes.next(), if !probes.is_empty() => {}
            }
        }
    }

    /// One `GET /version`: its answer or failure is recorded by the client's reachability
    /// layer; no answer within the outage header timeout begins an outage here.
    fn probe(&self, client: kube::Client, silence: std::time::Duration) -> BoxFuture<'static, ()> {
        let tracker = self.clone();
        Box::pin(async move {
            let was_down = tracker.is_down();
            let limit = tracker.outage_header_timeout();
            let answer = tokio::time::timeout(limit, client.apiserver_version()).await;
            debug!(server = %tracker.server, ?answer, "liveness probe");
            if answer.is_err() && !was_down {
                tracker.failed(&ProbeUnanswered { silence, limit });
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpng_model::input::InputHealth;
    use std::time::Duration;

    /// A streaming read moves "last good input" while the server is reachable, at most every
    /// [`GOOD_MARKED_EVERY`]; during an outage it does not.
    #[tokio::test(start_paused = true)]
    async fn a_streaming_read_moves_the_last_good_time_rate_limited() {
        let health = InputHealth::default();
        let r = Reachability::new("http://127.0.0.1:1").with_health(health.clone());
        let listed = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        health.loaded(listed, None);
        let last = || health.state().last_good.expect("loaded");
        r.read_progressed();
        let first = last();
        assert!(first > listed, "moved by the watch");
        // Within the interval: not moved (the clock it writes is the system's).
        health.loaded(listed, None);
        tokio::time::advance(GOOD_MARKED_EVERY / 2).await;
        r.read_progressed();
        assert_eq!(last(), listed, "rate limited");
        tokio::time::advance(GOOD_MARKED_EVERY).await;
        assert!(r.failed(&"refused"));
        r.read_progressed();
        assert_eq!(last(), listed, "not during an outage");
        assert!(r.answered().is_some());
        assert!(last() > listed, "reachable again moves it");
        health.loaded(listed, None);
        tokio::time::advance(GOOD_MARKED_EVERY).await;
        r.read_progressed();
        assert!(last() > listed, "moved again after the interval");
    }

    /// A body fed by the test, one frame per message.
    struct Fed(tokio::sync::mpsc::UnboundedReceiver<&'static str>);

    impl Body for Fed {
        type Data = std::io::Cursor<&'static str>;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
            self.0
                .poll_recv(cx)
                .map(|m| m.map(|m| Ok(Frame::data(std::io::Cursor::new(m)))))
        }
    }

    fn superseded(result: Option<&Result<Frame<std::io::Cursor<&str>>, tower::BoxError>>) -> bool {
        matches!(result, Some(Err(e)) if e.is::<Superseded>())
    }

    /// Which bodies an outage's end ends: only a read's that received nothing since the
    /// outage began; the open reads are counted until they end.
    #[tokio::test(start_paused = true)]
    async fn a_read_silent_since_the_outage_began_is_ended_when_it_ends() {
        // (case, a read?, a frame after the outage began?, ended?)
        let cases = [
            ("silent read", true, false, true),
            ("read that heard something", true, true, false),
            ("silent post", false, false, false),
        ];
        for (case, get, frame_after, want) in cases {
            let r = Reachability::new("http://127.0.0.1:1");
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let mut body = Watched::new(Fed(rx), &r, get);
            assert_eq!(r.streams().open, usize::from(get), "{case}");
            tx.send("before").expect("send");
            let first = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
            assert!(matches!(first, Some(Ok(_))), "{case}");
            tokio::time::advance(Duration::from_secs(1)).await;
            assert!(r.failed(&"hung"), "{case}");
            tokio::time::advance(Duration::from_secs(1)).await;
            if frame_after {
                tx.send("during").expect("send");
                let next = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
                assert!(matches!(next, Some(Ok(_))), "{case}");
            }
            assert!(r.answered().is_some(), "{case}: the outage ends");
            let polled =
                futures::poll!(std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)));
            let ended = matches!(&polled, Poll::Ready(r) if superseded(r.as_ref()));
            assert_eq!(ended, want, "{case}: {polled:?}");
            if want {
                assert_eq!(r.streams().open, 0, "{case}: no longer open");
                assert!(body.is_end_stream(), "{case}");
            }
            drop(body);
            assert_eq!(r.streams().open, 0, "{case}: dropped");
        }
    }
}
