//! `--kube-api-qps` / `--kube-api-burst`: client-go's token bucket, as a layer of kube's client
//! stack, so every request the watchers make (lists, watch starts, discovery) takes a token.

use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;

/// A token bucket: `burst` tokens, refilled at `qps` per second. Requests beyond it wait for
/// their token instead of failing, as client-go's rate limiter does.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Arc<Mutex<Bucket>>,
}

#[derive(Debug)]
struct Bucket {
    /// May go negative: tokens already promised to waiting requests.
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket; `None` (no limit) when `qps` is not positive.
    pub fn new(qps: f32, burst: u32) -> Option<TokenBucket> {
        (qps > 0.0).then(|| TokenBucket {
            qps: f64::from(qps),
            burst: f64::from(burst.max(1)),
            state: Arc::new(Mutex::new(Bucket {
                tokens: f64::from(burst.max(1)),
                last: Instant::now(),
            })),
        })
    }

    /// Takes a token and returns how long to wait before it may be used.
    pub fn reserve(&self) -> Duration {
        let now = Instant::now();
        let mut b = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let refill = now.duration_since(b.last).as_secs_f64() * self.qps;
        b.tokens = (b.tokens + refill).min(self.burst);
        b.last = now;
        b.tokens -= 1.0;
        if b.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-b.tokens / self.qps)
        }
    }
}

/// Adds a [`TokenBucket`] in front of a service.
#[derive(Debug, Clone)]
pub struct RateLimitLayer(pub Option<TokenBucket>);

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited {
            inner,
            bucket: self.0.clone(),
        }
    }
}

/// A service whose requests wait for a token.
#[derive(Debug, Clone)]
pub struct RateLimited<S> {
    inner: S,
    bucket: Option<TokenBucket>,
}

impl<S, Req> tower::Service<Req> for RateLimited<S>
where
    S: tower::Service<Req>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let wait = self
            .bucket
            .as_ref()
            .map_or(Duration::ZERO, TokenBucket::reserve);
        // The inner future does nothing until polled: the request leaves after the wait.
        let response = self.inner.call(request);
        Box::pin(async move {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            response.await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn burst_then_qps() {
        let bucket = TokenBucket::new(2.0, 3).expect("limited");
        let waits: Vec<Duration> = (0..5).map(|_| bucket.reserve()).collect();
        assert_eq!(
            waits,
            [
                Duration::ZERO,
                Duration::ZERO,
                Duration::ZERO,
                Duration::from_millis(500),
                Duration::from_millis(1000),
            ]
        );
        // Idle long enough and the bucket is full again, never fuller.
        tokio::time::advance(Duration::from_secs(60)).await;
        let waits: Vec<Duration> = (0..4).map(|_| bucket.reserve()).collect();
        assert_eq!(waits[..3], [Duration::ZERO; 3]);
        assert_eq!(waits[3], Duration::from_millis(500));
    }

    #[test]
    fn no_limit_when_qps_is_not_positive() {
        assert!(TokenBucket::new(0.0, 10).is_none());
        assert!(TokenBucket::new(-1.0, 10).is_none());
    }
}
