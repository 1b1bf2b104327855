//! Our own backoff around each kube-runtime watcher.
//!
//! Why not kube-runtime's `default_backoff()`: it resets its delay on every successful item, and
//! a watcher yields a successful `Init` before every list attempt. A list that always fails
//! (403, 404, a 500 from a broken aggregated API, an object that does not decode) therefore
//! retried every 0.8 s forever. Here the delay (0.8 s doubling to 30 s, each drawn from [d/2, d]
//! so nodes do not retry in lockstep) is only reset by real progress: a completed list
//! (`InitDone`) or a watch event (`Apply`/`Delete`).
//!
//! A request cancelled because the outage it was sent into ended
//! ([`crate::reachability::Superseded`]) is made again at once: the server is back, and the
//! point of cancelling it was not to wait.
//!
//! A watcher waiting out its delay when the API server is reachable again (an answer ends
//! the outage, see [`crate::reachability`]) retries within [`RECOVERY_JITTER`] instead: after
//! an outage of a minute the delay had grown to 15–30 s, and convergence waited for it while
//! everything said the server was back. The jitter keeps a cluster's nodes from retrying all
//! at once. A delay is never shorter than the `Retry-After` the server last asked for.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use futures::future::BoxFuture;
use kube::runtime::watcher;

use crate::reachability::Reachability;

/// First delay after an error.
pub const MIN: Duration = Duration::from_millis(800);
/// Longest delay.
pub const MAX: Duration = Duration::from_secs(30);
/// The longest wait, once the API server is reachable again, of a watcher that was waiting
/// out its delay (drawn from [0, this]).
pub const RECOVERY_JITTER: Duration = Duration::from_millis(500);

/// Exponential delays with jitter (xorshift: no dependency, and the spread, not its quality,
/// is what matters).
#[derive(Debug)]
pub struct Delays {
    current: Duration,
    rng: u64,
    min: Duration,
    max: Duration,
}

impl Delays {
    /// Delays from [`MIN`] to [`MAX`], seeded with `seed` (any value).
    pub fn new(seed: u64) -> Delays {
        Delays::between(MIN, MAX, seed)
    }

    /// Delays from `min` doubling to `max` (the liveness probe's, which must notice a
    /// server that is back within seconds).
    pub fn between(min: Duration, max: Duration, seed: u64) -> Delays {
        Delays {
            current: min,
            rng: seed | 1,
            min,
            max,
        }
    }

    /// The next delay: drawn from [d/2, d], then d doubles up to [`MAX`].
    pub fn next_delay(&mut self) -> Duration {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let d = self.current;
        self.current = (self.current * 2).min(self.max);
        let half = d / 2;
        let spread = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX).max(1);
        half + Duration::from_nanos(self.rng % spread)
    }

    /// A delay drawn from [0, `max`] (the wait after a recovery).
    pub fn jitter(&mut self, max: Duration) -> Duration {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let spread = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX).max(1);
        Duration::from_nanos(self.rng % spread)
    }

    /// After real progress: start again from [`MIN`].
    pub fn reset(&mut self) {
        self.current = self.min;
    }
}

/// Whether an item shows real progress (resets the delay).
pub fn progress<K>(item: &Result<watcher::Event<K>, watcher::Error>) -> bool {
    matches!(
        item,
        Ok(watcher::Event::InitDone | watcher::Event::Apply(_) | watcher::Event::Delete(_))
    )
}

/// Whether an error is a request cancelled because the API server is reachable again (made
/// again at once, without a delay): a request still waiting for its answer, or a watch
/// stream silent since the outage began (kube passes its body's error on inside an I/O
/// error, `ReadEvents`).
pub fn superseded(error: &watcher::Error) -> bool {
    let client = match error {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => e,
        _ => return false,
    };
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(client);
    // Bounded: a cause chain that loops must not hang the watcher.
    for _ in 0..16 {
        let Some(c) = cause else { return false };
        if c.is::<crate::reachability::Superseded>() {
            return true;
        }
        // `io::Error::source` skips the error it wraps: look at that one too.
        if let Some(inner) = c
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            cause = Some(inner);
            continue;
        }
        cause = c.source();
    }
    false
}

/// A watcher stream with [`Delays`] after each error: the error is yielded at once, and the
/// watcher is polled again only after the delay (cut short when the API server is reachable
/// again).
pub struct Backoff<S> {
    inner: S,
    delays: Delays,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The client's reachability: its recoveries cut a delay short, its `Retry-After`
    /// lengthens one (`None`: neither).
    reachability: Option<Reachability>,
    /// Resolves when an outage ends during the current delay.
    recovered: Option<BoxFuture<'static, ()>>,
}

impl<S> Backoff<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, seed: u64) -> Backoff<S> {
        Backoff {
            inner,
            delays: Delays::new(seed),
            sleep: None,
            reachability: None,
            recovered: None,
        }
    }

    /// Delays from `first` doubling to `longest` instead of [`MIN`] to [`MAX`].
    pub fn with_delays(mut self, first: Duration, longest: Duration) -> Backoff<S> {
        self.delays = Delays::between(first, longest, self.delays.rng);
        self
    }

    /// Follows `reachability` (the client's): a delay ends soon after the server is
    /// reachable again, and lasts at least the `Retry-After` it asked for.
    pub fn with_reachability(mut self, reachability: Option<Reachability>) -> Backoff<S> {
        self.reachability = reachability;
        self
    }

    /// Starts the delay after an error.
    fn start_delay(&mut self) {
        let mut delay = self.delays.next_delay();
        if let Some(r) = &self.reachability {
            if let Some(asked) = r.retry_after() {
                delay = delay.max(asked);
            }
            // Subscribed now: only an outage that ends from here on cuts this delay short.
            let mut rx = r.recoveries.subscribe();
            self.recovered = Some(Box::pin(async move {
                if rx.changed().await.is_err() {
                    // The client is gone: no outage will end.
                    std::future::pending::<()>().await;
                }
            }));
        }
        self.sleep = Some(Box::pin(tokio::time::sleep(delay)));
    }
}

impl<S, K> Stream for Backoff<S>
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Unpin,
{
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        if self.sleep.is_some() {
            if let Some(recovered) = self.recovered.as_mut()
                && recovered.as_mut().poll(cx).is_ready()
            {
                // Reachable again: retry soon, not at the end of a delay grown long.
                self.recovered = None;
                let soon = self.delays.jitter(RECOVERY_JITTER);
                let deadline = tokio::time::Instant::now() + soon;
                if let Some(sleep) = self.sleep.as_mut()
                    && sleep.deadline() > deadline
                {
                    sleep.as_mut().reset(deadline);
                }
            }
            if let Some(sleep) = self.sleep.as_mut()
                && sleep.as_mut().poll(cx).is_pending()
            {
                return Poll::Pending;
            }
            self.sleep = None;
            self.recovered = None;
        }
        let item = match Pin::new(&mut self.inner).poll_next(cx) {
            Poll::Ready(Some(item)) => item,
            other => return other,
        };
        if let Err(e) = &item
            && !superseded(e)
        {
            self.start_delay();
        } else if progress(&item) {
            self.delays.reset();
        }
        Poll::Ready(Some(item))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_with_jitter_up_to_the_cap_and_reset() {
        let mut d = Delays::new(42);
        let mut ceiling = MIN;
        for _ in 0..12 {
            let delay = d.next_delay();
            assert!(
                delay >= ceiling / 2 && delay <= ceiling,
                "{delay:?} for {ceiling:?}"
            );
            ceiling = (ceiling * 2).min(MAX);
        }
        assert_eq!(ceiling, MAX);
        d.reset();
        assert!(d.next_delay() <= MIN);
    }

    #[test]
    fn only_a_request_cancelled_by_a_recovery_is_made_again_at_once() {
        let service = |e: Box<dyn std::error::Error + Send + Sync>| kube::Error::Service(e);
        let cases: Vec<(&str, watcher::Error, bool)> = vec![
            (
                "list superseded",
                watcher::Error::InitialListFailed(service(Box::new(
                    crate::reachability::Superseded,
                ))),
                true,
            ),
            (
                "watch superseded",
                watcher::Error::WatchStartFailed(service(Box::new(
                    crate::reachability::Superseded,
                ))),
                true,
            ),
            (
                "silent stream ended",
                watcher::Error::WatchFailed(kube::Error::ReadEvents(std::io::Error::other(
                    service(Box::new(crate::reachability::Superseded)),
                ))),
                true,
            ),
            (
                "stream cut",
                watcher::Error::WatchFailed(kube::Error::ReadEvents(std::io::Error::other(
                    "connection reset",
                ))),
                false,
            ),
            (
                "refused",
                watcher::Error::InitialListFailed(service("connection refused".into())),
                false,
            ),
            (
                "no resourceVersion",
                watcher::Error::NoResourceVersion,
                false,
            ),
        ];
        for (name, error, want) in cases {
            assert_eq!(superseded(&error), want, "{name}");
        }
    }

    #[test]
    fn only_a_completed_list_or_a_watch_event_is_progress() {
        type E = watcher::Event<k8s_openapi::api::core::v1::Node>;
        let node = k8s_openapi::api::core::v1::Node::default;
        let cases: Vec<(&str, Result<E, watcher::Error>, bool)> = vec![
            ("Init", Ok(watcher::Event::Init), false),
            ("InitApply", Ok(watcher::Event::InitApply(node())), false),
            ("InitDone", Ok(watcher::Event::InitDone), true),
            ("Apply", Ok(watcher::Event::Apply(node())), true),
            ("Delete", Ok(watcher::Event::Delete(node())), true),
            ("error", Err(watcher::Error::NoResourceVersion), false),
        ];
        for (name, item, want) in cases {
            assert_eq!(progress(&item), want, "{name}");
        }
    }
}
