//! client-go's request metrics for the API client: `rest_client_requests_total{code, host,
//! method}` and `rest_client_request_duration_seconds{verb, host}`. Why: an operator tells a
//! slow or refusing API server from a quiet cluster with the same dashboards as for
//! kube-proxy.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use futures::future::BoxFuture;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of `rest_client_requests_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The HTTP status code, or `<error>` when no answer came.
    pub code: String,
    /// The API server (scheme, host and port).
    pub host: String,
    /// The HTTP method.
    pub method: String,
}

/// Labels of `rest_client_request_duration_seconds`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LatencyLabels {
    /// The HTTP method.
    pub verb: String,
    /// The API server.
    pub host: String,
}

fn latency_histogram() -> Histogram {
    // client-go's buckets.
    Histogram::new([
        0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
    ])
}

/// The API client's request metrics; cheap to clone, registered once.
#[derive(Debug, Clone)]
pub struct ClientMetrics {
    requests: Family<RequestLabels, Counter>,
    latency: Family<LatencyLabels, Histogram>,
}

impl Default for ClientMetrics {
    fn default() -> Self {
        ClientMetrics {
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
        }
    }
}

impl ClientMetrics {
    /// Registers both families with client-go's names.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "rest_client_requests",
            "Number of HTTP requests to the API server, by status code, method and host.",
            self.requests.clone(),
        );
        registry.register(
            "rest_client_request_duration_seconds",
            "Request latency in seconds (to the response headers), by verb and host.",
            self.latency.clone(),
        );
    }

    fn record(&self, host: &str, method: &str, code: String, elapsed: f64) {
        self.requests
            .get_or_create(&RequestLabels {
                code,
                host: host.to_string(),
                method: method.to_string(),
            })
            .inc();
        self.latency
            .get_or_create(&LatencyLabels {
                verb: method.to_string(),
                host: host.to_string(),
            })
            .observe(elapsed);
    }
}

/// Records every request of the client in [`ClientMetrics`].
#[derive(Debug, Clone)]
pub struct ClientMetricsLayer {
    /// Where to record.
    pub metrics: ClientMetrics,
    /// The API server, as the `host` label.
    pub host: Arc<str>,
}

impl<S> tower::Layer<S> for ClientMetricsLayer {
    type Service = Measured<S>;

    fn layer(&self, inner: S) -> Measured<S> {
        Measured {
            inner,
            layer: self.clone(),
        }
    }
}

/// A service whose requests are measured.
#[derive(Debug, Clone)]
pub struct Measured<S> {
    inner: S,
    layer: ClientMetricsLayer,
}

impl<S, ReqBody, B> tower::Service<http::Request<ReqBody>> for Measured<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let method = request.method().to_string();
        let layer = self.layer.clone();
        let started = Instant::now();
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            let code = match &result {
                Ok(r) => r.status().as_u16().to_string(),
                Err(_) => "<error>".to_string(),
            };
            layer
                .metrics
                .record(&layer.host, &method, code, started.elapsed().as_secs_f64());
            result
        })
    }
}
