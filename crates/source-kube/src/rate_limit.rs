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

/// Whether a request continues a paged list (`continue=TOKEN`): the list's first page took the
/// token, and its later pages are the same list. kube-proxy's informers list from the API
/// server's watch cache (`resourceVersion=0`), which answers in one response whatever the
/// page size; kube-runtime's watcher reads consistent lists in pages of 500, so a 30k-Service
/// cluster is 60 pages per kind. Charging each page would make the start-up list wait for
/// `--kube-api-qps` (5 per second by default: 25 s for 130 pages) while the API server's work
/// is the same as for one list.
fn continues_a_list<B>(request: &http::Request<B>) -> bool {
    request.uri().query().is_some_and(|q| {
        q.split('&')
            .any(|p| p.strip_prefix("continue=").is_some_and(|t| !t.is_empty()))
    })
}

impl<S, B> tower::Service<http::Request<B>> for RateLimited<S>
where
    S: tower::Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let wait = match &self.bucket {
            Some(bucket) if !continues_a_list(&request) => bucket.reserve(),
            _ => Duration::ZERO,
        };
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

    /// Only a list's first page takes a token; its continuations, watches and other
    /// requests are told apart by the query.
    #[test]
    fn continued_list_pages_take_no_token() {
        let request = |uri: &str| http::Request::get(uri).body(()).expect("request");
        for (uri, continues) in [
            ("/api/v1/services?limit=500", false),
            ("/api/v1/services?limit=500&continue=", false),
            ("/api/v1/services?limit=500&continue=MTAwNS9ucy9z", true),
            ("/api/v1/services?continue=abc&limit=500", true),
            ("/api/v1/services?watch=true&resourceVersion=7", false),
            ("/api/v1/services", false),
        ] {
            assert_eq!(continues_a_list(&request(uri)), continues, "{uri}");
        }
    }

    /// Through the layer: with a bucket of one token, a first page waits its turn and its
    /// continuations pass at once.
    #[tokio::test(start_paused = true)]
    async fn the_layer_charges_first_pages_only() {
        use tower::{Service, ServiceExt};
        let bucket = TokenBucket::new(1.0, 1);
        let mut service = tower::Layer::layer(
            &RateLimitLayer(bucket),
            tower::service_fn(|_: http::Request<()>| async {
                Ok::<_, std::convert::Infallible>(tokio::time::Instant::now())
            }),
        );
        let start = tokio::time::Instant::now();
        let mut call = async |uri: &str| {
            let request = http::Request::get(uri).body(()).expect("request");
            let ready = service.ready().await.expect("ready");
            ready.call(request).await.expect("call") - start
        };
        assert_eq!(call("/api/v1/services?limit=500").await, Duration::ZERO);
        for _ in 0..5 {
            let page = call("/api/v1/services?limit=500&continue=t").await;
            assert_eq!(page, Duration::ZERO, "continuations take no token");
        }
        let next = call("/api/v1/endpointslices?limit=500").await;
        assert_eq!(next, Duration::from_secs(1), "a new list waits for a token");
    }

    #[test]
    fn no_limit_when_qps_is_not_positive() {
        assert!(TokenBucket::new(0.0, 10).is_none());
        assert!(TokenBucket::new(-1.0, 10).is_none());
    }
}
