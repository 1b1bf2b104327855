//! kube-proxy's HTTP endpoints.
//!
//! - health server (`--healthz-bind-address`, default `0.0.0.0:10256`): `/healthz`, `/livez`
//!   with kube-proxy's JSON body and status rules, and kpng's `/readyz` (503 until this run's
//!   first sync has programmed the node: the startup probe's signal, which `/healthz`, 200 from
//!   the start as kube-proxy's, is not);
//! - metrics server (`--metrics-bind-address`, default `127.0.0.1:10249`): `/metrics`
//!   (Prometheus/OpenMetrics text), `/proxyMode`, and on a node the health server's own
//!   `/healthz`, `/livez` and `/readyz` (kube-proxy's is a plain `ok` whatever the proxy's
//!   state: a probe pointed at the wrong port read healthy forever); on a brain its readiness.
//!
//! Both are served within `kpng_runner::guarded_http`'s connection caps and timeouts, so
//! that one client flooding or holding connections cannot take them from the kubelet's probes
//! and Prometheus (kube-proxy's Go servers have none: docs/reliability.md).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use kpng_runner::guarded_http::{
    self, ConnectionLimits, Guard, OpenConnections, RefusedConnections,
};
use kpng_runner::health::ProxyHealth;
use kpng_runner::metrics::{CodeLabel, ProxyMetrics};
use prometheus_client::registry::Registry;

use crate::listen::{BindTo, Listener};

#[derive(Clone)]
struct HealthState {
    health: Arc<ProxyHealth>,
    metrics: ProxyMetrics,
}

fn health_answer(state: &HealthState, healthz: bool) -> Response {
    let report = state.health.report(SystemTime::now(), healthz);
    let code = CodeLabel {
        code: report.status.to_string(),
    };
    let counter = if healthz {
        &state.metrics.healthz_total
    } else {
        &state.metrics.livez_total
    };
    counter.get_or_create(&code).inc();
    json_answer(report.status, report.body)
}

/// One shape for every probe's answer: a status code (an unknown one is a 503, never a 200)
/// and a JSON body that browsers must not sniff as something else.
fn json_answer(code: u16, body: String) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    (
        status,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

async fn healthz(State(state): State<HealthState>) -> Response {
    health_answer(&state, true)
}

async fn livez(State(state): State<HealthState>) -> Response {
    health_answer(&state, false)
}

/// `/readyz`: whether this run's first sync has programmed the node, for the startup probe.
async fn readyz(State(state): State<HealthState>) -> Response {
    let report = state.health.readiness(SystemTime::now());
    json_answer(report.status, report.body)
}

/// Binds the health server now and returns its future, and why the bind failed if it did
/// (for kube-proxy's `FailedToStartProxierHealthcheck` Event). A failure to bind fails
/// start-up with `to.hard_fail` (`bindAddressHardFail`), and is tried again every 5 s without
/// (`listen.rs`).
pub async fn health_server(
    to: BindTo,
    health: Arc<ProxyHealth>,
    metrics: ProxyMetrics,
) -> anyhow::Result<(impl Future<Output = std::io::Result<()>>, Option<String>)> {
    let guard = Guard::new(
        "healthz",
        "health server",
        ConnectionLimits::DEFAULT,
        metrics.http_connections_refused.clone(),
    );
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .with_state(HealthState { health, metrics });
    let addr = to.addr;
    let listener = Listener::bind(to, "the health server (--healthz-bind-address)")?;
    let bind_failure = listener.failure().map(str::to_string);
    let serve = async move {
        let listener = listener.ready().await;
        tracing::info!(
            "serving /healthz and /livez on http://{}",
            listener.local_addr().unwrap_or(addr)
        );
        guarded_http::serve(listener, app, guard, OpenConnections::default()).await
    };
    Ok((serve, bind_failure))
}

#[derive(Clone)]
struct MetricsState {
    registry: Arc<Registry>,
    proxy_mode: &'static str,
    z: Arc<crate::zpages::ZPages>,
    admin: Option<kpng_runner::admin::AdminHandle>,
    probes: MetricsProbes,
    /// The status page's problem count, kept from one refresh to the next.
    counts: crate::status_web::CountCache,
}

/// What the metrics server's `/healthz`, `/livez` and `/readyz` answer.
#[derive(Clone)]
pub enum MetricsProbes {
    /// A node's: the health server's answers, from the same state and handler, so a probe
    /// pointed at either port reads the proxy's health.
    Node {
        /// The proxy's health, as the health server reads it.
        health: Arc<ProxyHealth>,
        /// Where the probes are counted (`kubeproxy_proxy_healthz_total`, …); boxed, as the
        /// brain's variant is much smaller.
        metrics: Box<ProxyMetrics>,
    },
    /// A brain's readiness and liveness (it has no health server).
    Brain(BrainHealth),
}

/// What a brain's `/healthz` and `/livez` (on its metrics server: it has no health server)
/// read, so that a brain Deployment has probes that mean something: ready once the cluster is
/// listed (nodes get their state only then), alive while it answers.
#[derive(Clone)]
pub struct BrainHealth {
    /// The brain's hub: listed yet, and how many nodes it serves.
    pub hub: Arc<kpng_api::hub::Hub>,
    /// The source's problems (the brain keeps serving its last good state meanwhile).
    pub input: kpng_model::input::InputHealth,
}

impl BrainHealth {
    /// The status and JSON body: 503 until the cluster has been listed (`/healthz` only).
    fn answer(&self, healthz: bool) -> Response {
        let synced = self.hub.synced();
        let body = serde_json::json!({
            "synced": synced,
            "nodesConnected": self.hub.metrics().clients_connected.get(),
            "inputProblems": self.input.state().problems.len(),
        });
        let status = if synced || !healthz {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response()
    }
}

async fn metrics_healthz(State(state): State<MetricsState>) -> Response {
    match state.probes {
        MetricsProbes::Brain(brain) => brain.answer(true),
        MetricsProbes::Node { health, metrics } => health_answer(
            &HealthState {
                health,
                metrics: *metrics,
            },
            true,
        ),
    }
}

async fn metrics_livez(State(state): State<MetricsState>) -> Response {
    match state.probes {
        MetricsProbes::Brain(brain) => brain.answer(false),
        MetricsProbes::Node { health, metrics } => health_answer(
            &HealthState {
                health,
                metrics: *metrics,
            },
            false,
        ),
    }
}

/// A node's `/readyz` (a brain has none: its `/healthz` is its readiness).
async fn metrics_readyz(State(state): State<MetricsState>) -> Response {
    match state.probes {
        MetricsProbes::Brain(_) => StatusCode::NOT_FOUND.into_response(),
        MetricsProbes::Node { health, metrics } => {
            readyz(State(HealthState {
                health,
                metrics: *metrics,
            }))
            .await
        }
    }
}

/// The status page: plain HTML and a little JavaScript, embedded, no external assets. It
/// reads the two JSON answers below, as `kpng status` and `kpng trace` do.
async fn status_page() -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("status_page.html"),
    )
        .into_response()
}

/// The status page's script, a file of its own so that the page's policy allows no inline
/// script (`PAGE_POLICY`).
async fn status_script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("status_page.js"),
    )
        .into_response()
}

/// The status page's style sheet, a file of its own for the same reason.
async fn status_style() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("status_page.css"),
    )
        .into_response()
}

/// The page's status: `kpng status`'s, with its POLICY cells, legend and problem count
/// (`status_web.rs`).
async fn status_json(State(state): State<MetricsState>, uri: axum::http::Uri) -> Response {
    let query = match crate::status_web::PageQuery::from_uri(&uri) {
        Ok(query) => query,
        Err(rejection) => return rejection.into_response(),
    };
    match &state.admin {
        Some(admin) => match crate::status_web::answer(admin, &state.counts, query).await {
            Some(value) => axum::Json(value).into_response(),
            None => crate::admin::not_answering(),
        },
        None => crate::admin::not_answering(),
    }
}

async fn trace_json(
    State(state): State<MetricsState>,
    axum::extract::Query(p): axum::extract::Query<crate::admin::TraceParams>,
) -> Response {
    crate::admin::trace_answer(state.admin.as_ref(), p).await
}

async fn configz(State(state): State<MetricsState>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        state.z.configz.clone(),
    )
        .into_response()
}

async fn flagz(State(state): State<MetricsState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        state.z.flagz.clone(),
    )
        .into_response()
}

async fn statusz(State(state): State<MetricsState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        state.z.statusz(),
    )
        .into_response()
}

async fn metrics(State(state): State<MetricsState>) -> Response {
    let mut body = String::new();
    // The text format, as kube-proxy serves it whatever the scraper accepts (metrics_text.rs).
    match prometheus_client::encoding::text::encode(&mut body, &state.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, crate::metrics_text::CONTENT_TYPE)],
            crate::metrics_text::to_text(&body),
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {e}"),
        )
            .into_response(),
    }
}

async fn proxy_mode_text(State(state): State<MetricsState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        state.proxy_mode,
    )
        .into_response()
}

/// Whether a `Host` header names an IP address or `localhost` (with or without a port).
fn host_is_an_address(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok()
}

/// Binds the metrics server now and returns its future (a failure to bind as for
/// [`health_server`], by `to.hard_fail`). `/healthz`, `/livez` and `/readyz` there answer as
/// `probes` says. Connections it closes for a cap are counted in `refused`.
pub async fn metrics_server(
    to: BindTo,
    registry: Arc<Registry>,
    proxy_mode: &'static str,
    z: crate::zpages::ZPages,
    admin: Option<kpng_runner::admin::AdminHandle>,
    probes: MetricsProbes,
    refused: RefusedConnections,
) -> anyhow::Result<impl Future<Output = std::io::Result<()>>> {
    let app = Router::new()
        .route("/status", get(status_page))
        .route("/status/status.json", get(status_json))
        .route("/status/trace.json", get(trace_json))
        .route("/status/page.js", get(status_script))
        .route("/status/page.css", get(status_style))
        .route_layer(axum::middleware::from_fn(this_node_only))
        .route("/metrics", get(metrics))
        .route("/healthz", get(metrics_healthz))
        .route("/livez", get(metrics_livez))
        .route("/readyz", get(metrics_readyz))
        .route("/proxyMode", get(proxy_mode_text))
        .route("/configz", get(configz))
        .route("/flagz", get(flagz))
        .route("/statusz", get(statusz))
        .with_state(MetricsState {
            registry,
            proxy_mode,
            z: Arc::new(z),
            admin,
            probes,
            counts: crate::status_web::CountCache::default(),
        });
    let addr = to.addr;
    let listener = Listener::bind(to, "the metrics server (--metrics-bind-address)")?;
    Ok(async move {
        let listener = listener.ready().await;
        tracing::info!(
            "serving /metrics on http://{}",
            listener.local_addr().unwrap_or(addr)
        );
        // Each request carries its peer's address (`ConnectInfo`) for `this_node_only`.
        let guard = Guard::new(
            "metrics",
            "metrics server",
            ConnectionLimits::DEFAULT,
            refused,
        );
        guarded_http::serve(listener, app, guard, OpenConnections::default()).await
    })
}

/// The status page and its JSON answer this node only (a loopback client: the node itself,
/// `kubectl port-forward`, an SSH tunnel), and there root and kpng's own user only
/// (`peer_allowed`). They show every Service, endpoint, node and zone
/// of the cluster and answer traces, which `kpng status` gives root only (the admin socket is
/// mode 0600); a metrics address opened for Prometheus (`metricsBindAddress 0.0.0.0:10249`,
/// as for kube-proxy) must not publish them to every pod. kube-proxy serves no such page.
/// The request must also name the server by an address or `localhost`: a browser on the node
/// sent there by a web page through a name that resolves to 127.0.0.1 (DNS rebinding) names
/// the page's own host, and is refused.
async fn this_node_only(
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<SocketAddr>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let named_by_address = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .is_none_or(host_is_an_address);
    if !named_by_address {
        return (
            StatusCode::FORBIDDEN,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "kpng's status page answers requests that name it by address or localhost only\n",
        )
            .into_response();
    }
    if peer.ip().to_canonical().is_loopback() {
        let local = request
            .extensions()
            .get::<guarded_http::LocalAddr>()
            .map(|l| l.0);
        return match peer_allowed(peer, local) {
            Ok(()) => with_page_headers(next.run(request).await),
            Err(why) => (
                StatusCode::FORBIDDEN,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                format!(
                    "kpng's status page answers root and kpng's own user only, as its admin \
                     socket does: {why}. Run `kpng status` (or `kpng trace`) as root on this \
                     node, or reach the page through `kubectl port-forward` or a tunnel as \
                     root\n"
                ),
            )
                .into_response(),
        };
    }
    (
        StatusCode::FORBIDDEN,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!(
            "kpng's status page answers this node only, not {}: open it on the node \
             (http://127.0.0.1:PORT/status), through `kubectl port-forward` or an SSH tunnel, \
             or run `kpng status` there\n",
            peer.ip().to_canonical()
        ),
    )
        .into_response()
}

/// Whether the loopback client at `peer` (to kpng's `local`) may read the status page: its
/// socket belongs to root or to kpng's own user, whom the admin socket (0600) answers too.
/// Another local user could otherwise read every Service, endpoint and node, and trace, which
/// `kpng status` refuses them.
#[cfg(target_os = "linux")]
fn peer_allowed(peer: SocketAddr, local: Option<SocketAddr>) -> Result<(), String> {
    let local = local.ok_or("kpng does not know its own end of the connection")?;
    let uid = crate::peer_owner::uid_of_peer(peer, local)?;
    let own = rustix::process::geteuid().as_raw();
    if uid == 0 || uid == own {
        Ok(())
    } else {
        Err(format!("the connection from {peer} belongs to uid {uid}"))
    }
}

/// Elsewhere (Windows) kpng cannot tell which account owns a loopback connection (the TCP
/// table names a process, whose account takes a token kpng may not open): the page is
/// refused to everyone there, and `kpng status` on the admin pipe (administrators only)
/// answers instead (docs/observability.md).
#[cfg(not(target_os = "linux"))]
fn peer_allowed(_peer: SocketAddr, _local: Option<SocketAddr>) -> Result<(), String> {
    Err("kpng cannot tell which account a local connection belongs to on this system".into())
}

/// The status page's security headers: its script and style are its own files (no inline
/// code, nothing from elsewhere), it reads its JSON from this server only, no other site may
/// frame it (clickjacking the trace form) and no browser guesses another content type.
const PAGE_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self'; form-action 'none'; base-uri 'none'; \
    frame-ancestors 'none'";

/// Adds the security headers (`PAGE_POLICY`) to a status page answer, and keeps it out of
/// caches: it shows the cluster's state at one moment.
fn with_page_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, PAGE_POLICY),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, header::HeaderValue::from_static(value));
    }
    response
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_host_header_names_an_address_or_localhost() {
        for (host, ok) in [
            ("127.0.0.1:10249", true),
            ("127.0.0.1", true),
            ("[::1]:10249", true),
            ("localhost:10249", true),
            ("LOCALHOST", true),
            ("10.0.0.5:10249", true),
            ("rebound.example:10249", false),
            ("rebound.example", false),
            ("127.0.0.1.nip.io:10249", false),
        ] {
            assert_eq!(super::host_is_an_address(host), ok, "{host}");
        }
    }
}
