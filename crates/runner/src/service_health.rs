//! Service health-check servers: what cloud load balancers probe on each node.
//!
//! For every LoadBalancer Service with `externalTrafficPolicy: Local` and a
//! `healthCheckNodePort`, kube-proxy serves HTTP on that port on the node-port addresses and
//! answers, for any path, 200 when this node has local *ready* endpoints for the Service and the
//! proxy is healthy, 503 otherwise, with the endpoint count in a JSON body and in the
//! `X-Load-Balancing-Endpoint-Weight` header. Load balancers then send external traffic only to
//! nodes that can serve it locally. Servers open and close with the Services after each sync;
//! a port already in use is reported and retried at the next sync, never fatal.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kpng_model::{ServiceKey, ServicePort, Snapshot};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::health::ProxyHealth;

/// What one Service's health check must answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthCheck {
    /// The `healthCheckNodePort`.
    pub port: u16,
    /// Local ready endpoints (terminating ones excluded), over all ports and families.
    pub local_endpoints: u32,
}

/// The health checks a snapshot calls for, per Service.
pub fn wanted(snapshot: &Snapshot) -> BTreeMap<ServiceKey, HealthCheck> {
    let mut out: BTreeMap<ServiceKey, HealthCheck> = BTreeMap::new();
    for sp in snapshot.ports.values() {
        if let Some(check) = port_check(sp) {
            out.entry(sp.key.service.clone())
                .and_modify(|c| *c = merge(*c, check))
                .or_insert(check);
        }
    }
    out
}

/// The health check of one Service, read from its ports only: what a change to that Service
/// needs, without walking every port of the cluster.
pub fn wanted_for(snapshot: &Snapshot, service: &ServiceKey) -> Option<HealthCheck> {
    snapshot
        .service_ports(service)
        .filter_map(|sp| port_check(sp))
        .reduce(merge)
}

/// What one port says about its Service's health check.
fn port_check(sp: &ServicePort) -> Option<HealthCheck> {
    sp.health_check_node_port.map(|port| HealthCheck {
        port,
        local_endpoints: sp.local_ready_endpoints,
    })
}

/// Two ports' views of one Service's check. kube-proxy reports the Service's local ready
/// endpoints; ports of one Service share them, so the largest per-port count is the Service's.
/// The port is the first port's (all ports of a Service carry the same one).
fn merge(first: HealthCheck, other: HealthCheck) -> HealthCheck {
    HealthCheck {
        port: first.port,
        local_endpoints: first.local_endpoints.max(other.local_endpoints),
    }
}

/// kube-proxy's response body: tab-indented JSON without a trailing newline.
pub fn body(service: &ServiceKey, local_endpoints: u32, proxy_healthy: bool) -> String {
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""));
    format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\t\"localEndpoints\": {local_endpoints},\n\t\"serviceProxyHealthy\": {proxy_healthy}\n}}",
        quote(&service.namespace),
        quote(&service.name)
    )
}

#[derive(Clone)]
struct Shared {
    counts: Arc<RwLock<HashMap<ServiceKey, u32>>>,
    health: Arc<ProxyHealth>,
}

#[derive(Clone)]
struct Handler {
    service: ServiceKey,
    shared: Shared,
}

/// kube-proxy's rule: 200 when the node has local ready endpoints and the proxy is healthy
/// (load balancers send it the Service's traffic), else 503. The servers answer with it and
/// `kpng status` reports it.
fn answer_status(local_endpoints: u32, healthy: bool) -> StatusCode {
    if local_endpoints > 0 && healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn answer(State(h): State<Handler>) -> Response {
    let count = h
        .shared
        .counts
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&h.service)
        .copied()
        .unwrap_or(0);
    let healthy = h.shared.health.is_healthy(SystemTime::now());
    let status = answer_status(count, healthy);
    let mut response = (status, body(&h.service, count, healthy)).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if let Ok(v) = HeaderValue::from_str(&count.to_string()) {
        headers.insert("X-Load-Balancing-Endpoint-Weight", v);
    }
    response
}

struct Running {
    port: u16,
    /// Where the check is wanted.
    addresses: Vec<IpAddr>,
    /// Of those, where it could not be bound yet (retried at every sync): one family's
    /// address missing from the host must not take the other family's check down, as with
    /// kube-proxy's proxier per family.
    unbound: Vec<IpAddr>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Stops the server and waits until its sockets are closed, so that its port can be
    /// bound again at once (dropping only asks the runtime to stop the tasks).
    async fn close(mut self) {
        for task in std::mem::take(&mut self.tasks) {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A wanted health check whose server could not start: retried at every sync, logged once
/// (and again only when the reason changes), listed by `kpng status` until it starts.
#[derive(Debug, Clone)]
struct NotStarted {
    check: HealthCheck,
    error: String,
    since: SystemTime,
    attempts: u32,
}

impl NotStarted {
    /// What `kpng status` and the Event report of it.
    fn not_served(&self, service: &ServiceKey) -> NotServed {
        NotServed {
            service: service.clone(),
            port: self.check.port,
            error: self.error.clone(),
            since: self.since,
        }
    }
}

/// A Service's health check that is not served now, for `kpng status`: a load balancer
/// probing it sees this node as unhealthy for that Service, whatever its endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotServed {
    /// The Service.
    pub service: ServiceKey,
    /// Its `healthCheckNodePort`.
    pub port: u16,
    /// Why the server could not start (the address and the system's error).
    pub error: String,
    /// When it first failed.
    pub since: SystemTime,
}

/// What a Service's health check answers on this node now (see
/// [`ServiceHealthServers::answer`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheckAnswer {
    /// The `healthCheckNodePort`.
    pub port: u16,
    /// The HTTP status a probe gets (200: the node takes the traffic; 503: it has no local
    /// ready endpoint, or the proxy is not healthy); `None` when nothing answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The local ready endpoints it reports (`X-Load-Balancing-Endpoint-Weight`).
    pub local_endpoints: u32,
    /// Why nothing answers, when the server could not start; with a `status`, where it could
    /// not start while it answers on the node's other addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_served: Option<String>,
}

/// The health-check servers of this node.
pub struct ServiceHealthServers {
    shared: Shared,
    running: HashMap<ServiceKey, Running>,
    /// Wanted checks whose server could not start: retried at every sync.
    not_started: BTreeMap<ServiceKey, NotStarted>,
    failures: Counter,
    /// How many wanted checks are not served now (`not_started`'s size), for alerts.
    not_served: Gauge,
    /// Where each new failure (a first one, or a new reason) is reported, for kube-proxy's
    /// `FailedToStartServiceHealthcheck` Event on the Service.
    failure_reports: Option<tokio::sync::mpsc::UnboundedSender<NotServed>>,
}

impl ServiceHealthServers {
    /// Servers that report `health` as `serviceProxyHealthy`. `failures` counts servers that
    /// could not be started (port in use, address not available); `not_served` is how many
    /// wanted checks are not served now.
    pub fn new(
        health: Arc<ProxyHealth>,
        failures: Counter,
        not_served: Gauge,
    ) -> ServiceHealthServers {
        ServiceHealthServers {
            shared: Shared {
                counts: Arc::new(RwLock::new(HashMap::new())),
                health,
            },
            running: HashMap::new(),
            not_started: BTreeMap::new(),
            failures,
            not_served,
            failure_reports: None,
        }
    }

    /// Reports each new failure to start a server (the ones logged as warnings) on the
    /// returned channel.
    pub fn report_failures(&mut self) -> tokio::sync::mpsc::UnboundedReceiver<NotServed> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.failure_reports = Some(tx);
        rx
    }

    /// The Services with a running server, and their ports.
    pub fn serving(&self) -> BTreeMap<ServiceKey, u16> {
        self.running
            .iter()
            .map(|(k, r)| (k.clone(), r.port))
            .collect()
    }

    /// What this node tells a load balancer probing `service`'s health check now: the status
    /// code and the local endpoint count its server answers with, or why it is not served.
    /// `None` when the Service has no health check here.
    pub fn answer(&self, service: &ServiceKey) -> Option<HealthCheckAnswer> {
        let failed = self.not_started.get(service);
        let Some(running) = self.running.get(service) else {
            return failed.map(|failed| HealthCheckAnswer {
                port: failed.check.port,
                status: None,
                local_endpoints: failed.check.local_endpoints,
                not_served: Some(failed.error.clone()),
            });
        };
        let local_endpoints = self.counts().get(service).copied().unwrap_or(0);
        let healthy = self.shared.health.is_healthy(SystemTime::now());
        Some(HealthCheckAnswer {
            port: running.port,
            status: Some(answer_status(local_endpoints, healthy).as_u16()),
            local_endpoints,
            not_served: failed.map(|f| f.error.clone()),
        })
    }

    /// The wanted checks that are not served, in Service order.
    pub fn not_served(&self) -> Vec<NotServed> {
        self.not_started
            .iter()
            .map(|(service, n)| n.not_served(service))
            .collect()
    }

    /// `service`'s check, when it is wanted and served on none of the node's addresses (a
    /// check served on some answers the load balancers that probe those).
    pub fn not_served_for(&self, service: &ServiceKey) -> Option<NotServed> {
        if self.running.contains_key(service) {
            return None;
        }
        self.not_started.get(service).map(|n| n.not_served(service))
    }

    /// Opens, moves and closes servers so that exactly `wanted` are served on `addresses`
    /// (an empty list means all addresses, `0.0.0.0` and `[::]`), and updates the counts.
    pub async fn sync(&mut self, wanted: &BTreeMap<ServiceKey, HealthCheck>, addresses: &[IpAddr]) {
        let mut services: BTreeSet<ServiceKey> = self.running.keys().cloned().collect();
        services.extend(self.counts().keys().cloned());
        services.extend(wanted.keys().cloned());
        let changes = services
            .into_iter()
            .map(|k| {
                let check = wanted.get(&k).copied();
                (k, check)
            })
            .collect();
        self.update(changes, addresses).await;
    }

    /// Brings the given Services (and any whose server could not start before) to their
    /// wanted check: `None` closes a Service's server. Other servers are left as they are, so
    /// a change to one Service costs one Service's work, not the cluster's.
    pub async fn update(
        &mut self,
        mut changes: BTreeMap<ServiceKey, Option<HealthCheck>>,
        addresses: &[IpAddr],
    ) {
        let failed_before = std::mem::take(&mut self.not_started);
        for (key, failed) in &failed_before {
            changes.entry(key.clone()).or_insert(Some(failed.check));
        }
        let addresses: Vec<IpAddr> = if addresses.is_empty() {
            vec![IpAddr::from([0u8; 4]), IpAddr::from([0u16; 8])]
        } else {
            addresses.to_vec()
        };
        // Every server that goes is closed before any opens: two Services that trade ports
        // both get theirs in the same sync.
        let mut to_start = Vec::new();
        for (key, check) in changes {
            self.set_count(&key, check);
            let unchanged = match (self.running.get(&key), check) {
                (Some(r), Some(c)) => r.port == c.port && r.addresses == addresses,
                _ => false,
            };
            if unchanged {
                // Served where it could be: the addresses it could not bind are tried again
                // without closing the others.
                if let Some(check) = check
                    && self
                        .running
                        .get(&key)
                        .is_some_and(|r| !r.unbound.is_empty())
                {
                    to_start.push((key, check));
                }
                continue;
            }
            if let Some(r) = self.running.remove(&key) {
                info!(service = %key, port = r.port, "closing health check");
                r.close().await;
            }
            if let Some(check) = check {
                to_start.push((key, check));
            }
        }
        for (key, check) in to_start {
            // The same port failing again continues the earlier failure.
            let before = failed_before
                .get(&key)
                .filter(|f| f.check.port == check.port);
            let mut running = self.running.remove(&key).unwrap_or_else(|| Running {
                port: check.port,
                addresses: addresses.clone(),
                unbound: addresses.clone(),
                tasks: Vec::new(),
            });
            let bound = self.bind_unbound(&key, &mut running);
            if !running.tasks.is_empty() {
                self.running.insert(key.clone(), running);
            }
            match bound {
                Ok(()) => match before {
                    Some(f) => info!(
                        service = %key,
                        port = check.port,
                        "serving health check, after {} failed attempts",
                        f.attempts
                    ),
                    None => info!(service = %key, port = check.port, "serving health check"),
                },
                Err(error) => {
                    self.failures.inc();
                    // A first failure, or a new reason: logged and reported once.
                    let new_failure = before.is_none_or(|f| f.error != error);
                    if new_failure {
                        warn!(
                            service = %key,
                            port = check.port,
                            "cannot start the health check: {error}; retried at every sync, \
                             listed by `kpng status` until it starts"
                        );
                    } else {
                        debug!(service = %key, port = check.port, "health check still not served: {error}");
                    }
                    let failed = NotStarted {
                        check,
                        error,
                        since: before.map_or_else(SystemTime::now, |f| f.since),
                        attempts: before.map_or(1, |f| f.attempts + 1),
                    };
                    if new_failure && let Some(reports) = &self.failure_reports {
                        let _ = reports.send(failed.not_served(&key));
                    }
                    self.not_started.insert(key, failed);
                }
            }
        }
        self.not_served
            .set(i64::try_from(self.not_started.len()).unwrap_or(i64::MAX));
    }

    /// The local endpoint count a Service's server answers with (`None`: no longer wanted).
    fn set_count(&self, key: &ServiceKey, check: Option<HealthCheck>) {
        let mut counts = self
            .shared
            .counts
            .write()
            .unwrap_or_else(|e| e.into_inner());
        match check {
            Some(c) => counts.insert(key.clone(), c.local_endpoints),
            None => counts.remove(key),
        };
    }

    /// The local endpoint counts the servers answer with.
    fn counts(&self) -> std::sync::RwLockReadGuard<'_, HashMap<ServiceKey, u32>> {
        self.shared.counts.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Serves `key`'s check on each of `running`'s addresses not bound yet, independently:
    /// one that fails leaves the others served. The error names every address still unbound
    /// (and, when some are served, where).
    fn bind_unbound(&self, key: &ServiceKey, running: &mut Running) -> Result<(), String> {
        let mut errors = Vec::new();
        for ip in std::mem::take(&mut running.unbound) {
            let addr = SocketAddr::new(ip, running.port);
            match bind(addr) {
                Ok(listener) => {
                    let app = Router::new().fallback(answer).with_state(Handler {
                        service: key.clone(),
                        shared: self.shared.clone(),
                    });
                    running.tasks.push(tokio::spawn(async move {
                        let _ = axum::serve(listener, app).await;
                    }));
                }
                Err(e) => {
                    errors.push(format!("{addr}: {e}"));
                    running.unbound.push(ip);
                }
            }
        }
        if errors.is_empty() {
            return Ok(());
        }
        let mut error = errors.join("; ");
        if running.unbound.len() < running.addresses.len() {
            let served: Vec<String> = running
                .addresses
                .iter()
                .filter(|ip| !running.unbound.contains(ip))
                .map(|ip| SocketAddr::new(*ip, running.port).to_string())
                .collect();
            error.push_str(&format!(" (served on {})", served.join(", ")));
        }
        Err(error)
    }
}

/// Binds a listener; IPv6 wildcard sockets are v6-only so that `0.0.0.0` and `[::]` can both be
/// bound on the same port.
fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    if addr.is_ipv6() {
        socket2::SockRef::from(&socket).set_only_v6(true)?;
    }
    socket.bind(addr)?;
    socket.listen(128)
}

#[cfg(test)]
mod tests;
