//! The userspace proxy's own metrics: what is being proxied right now, and what failed.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Counters and gauges shared by every listener (clones share the values).
#[derive(Debug, Clone, Default)]
pub struct ProxyMetrics {
    /// TCP connections accepted by a listener.
    pub tcp_accepted: Counter,
    /// TCP connections being proxied now (draining ones included).
    pub tcp_active: Gauge,
    /// UDP sessions alive now.
    pub udp_sessions: Gauge,
    /// Connections to an endpoint that failed (each is retried on another endpoint).
    pub connect_failures: Counter,
    /// Connections or datagrams that no endpoint could serve (reset or dropped by the proxy).
    pub unserved: Counter,
    /// Service ports proxied now (each has its listener), set after every successful sync.
    pub ports: Gauge,
}

impl ProxyMetrics {
    /// Registers every metric under `kpng_userspace_…`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kpng_userspace_service_ports",
            "Service ports the userspace proxy serves now (one listener each)",
            self.ports.clone(),
        );
        registry.register(
            "kpng_userspace_tcp_connections_accepted",
            "TCP connections accepted by the userspace proxy",
            self.tcp_accepted.clone(),
        );
        registry.register(
            "kpng_userspace_tcp_connections",
            "TCP connections the userspace proxy is relaying now",
            self.tcp_active.clone(),
        );
        registry.register(
            "kpng_userspace_udp_sessions",
            "UDP sessions the userspace proxy holds now",
            self.udp_sessions.clone(),
        );
        registry.register(
            "kpng_userspace_endpoint_connect_failures",
            "Connections from the userspace proxy to an endpoint that failed",
            self.connect_failures.clone(),
        );
        registry.register(
            "kpng_userspace_unserved",
            "Connections and datagrams the userspace proxy had no endpoint for",
            self.unserved.clone(),
        );
    }
}
