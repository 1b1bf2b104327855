//! Service health-check servers: what cloud load balancers probe on each node.
//!
//! For every LoadBalancer Service with `externalTrafficPolicy: Local` and a
//! `healthCheckNodePort`, kube-proxy serves HTTP on that port on the node-port addresses and
//! answers, for any path, 200 when this node has local *ready* endpoints for the Service and the
//! proxy is healthy, 503 otherwise, with the endpoint count in a JSON body and in the
//! `X-Load-Balancing-Endpoint-Weight` header. Load balancers then send external traffic only to
//! nodes that can serve it locally. Servers open and close with the Services after each sync;
//! a port already in use is reported and retried at the next sync, never fatal.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kpng_model::{ServiceKey, Snapshot};
use prometheus_client::metrics::counter::Counter;
use tokio::task::JoinHandle;
use tracing::{info, warn};

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
        let Some(port) = sp.health_check_node_port else {
            continue;
        };
        let entry = out.entry(sp.key.service.clone()).or_insert(HealthCheck {
            port,
            local_endpoints: 0,
        });
        // kube-proxy reports the Service's local ready endpoints; ports of one Service share
        // them, so the largest per-port count is the Service's.
        entry.local_endpoints = entry.local_endpoints.max(sp.local_ready_endpoints);
    }
    out
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
    let status = if count > 0 && healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
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
    addresses: Vec<IpAddr>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The health-check servers of this node.
pub struct ServiceHealthServers {
    shared: Shared,
    running: HashMap<ServiceKey, Running>,
    failures: Counter,
}

impl ServiceHealthServers {
    /// Servers that report `health` as `serviceProxyHealthy`. `failures` counts servers that
    /// could not be started (port in use, address not available).
    pub fn new(health: Arc<ProxyHealth>, failures: Counter) -> ServiceHealthServers {
        ServiceHealthServers {
            shared: Shared {
                counts: Arc::new(RwLock::new(HashMap::new())),
                health,
            },
            running: HashMap::new(),
            failures,
        }
    }

    /// The Services with a running server, and their ports.
    pub fn serving(&self) -> BTreeMap<ServiceKey, u16> {
        self.running
            .iter()
            .map(|(k, r)| (k.clone(), r.port))
            .collect()
    }

    /// Opens, moves and closes servers so that exactly `wanted` are served on `addresses`
    /// (an empty list means all addresses, `0.0.0.0` and `[::]`), and updates the counts.
    pub async fn sync(&mut self, wanted: &BTreeMap<ServiceKey, HealthCheck>, addresses: &[IpAddr]) {
        {
            let mut counts = self
                .shared
                .counts
                .write()
                .unwrap_or_else(|e| e.into_inner());
            counts.clear();
            counts.extend(wanted.iter().map(|(k, h)| (k.clone(), h.local_endpoints)));
        }
        let addresses: Vec<IpAddr> = if addresses.is_empty() {
            vec![IpAddr::from([0u8; 4]), IpAddr::from([0u16; 8])]
        } else {
            addresses.to_vec()
        };
        self.running.retain(|key, r| {
            let keep =
                wanted.get(key).is_some_and(|h| h.port == r.port) && r.addresses == addresses;
            if !keep {
                info!(service = %key, port = r.port, "closing health check");
            }
            keep
        });
        for (key, check) in wanted {
            if self.running.contains_key(key) {
                continue;
            }
            match self.start(key, check.port, &addresses).await {
                Ok(running) => {
                    info!(service = %key, port = check.port, "serving health check");
                    self.running.insert(key.clone(), running);
                }
                Err(e) => {
                    self.failures.inc();
                    warn!(service = %key, port = check.port, "cannot start the health check (retried at the next sync): {e}");
                }
            }
        }
    }

    async fn start(
        &self,
        key: &ServiceKey,
        port: u16,
        addresses: &[IpAddr],
    ) -> std::io::Result<Running> {
        let mut running = Running {
            port,
            addresses: addresses.to_vec(),
            tasks: Vec::new(),
        };
        for ip in addresses {
            let listener = bind(SocketAddr::new(*ip, port))?;
            let app = Router::new().fallback(answer).with_state(Handler {
                service: key.clone(),
                shared: self.shared.clone(),
            });
            running.tasks.push(tokio::spawn(async move {
                let _ = axum::serve(listener, app).await;
            }));
        }
        Ok(running)
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
