//! Metrics with kube-proxy's names, types, labels and buckets, plus kpng's own.
//!
//! Every metric lives in one [`ProxyMetrics`] value registered into a caller-owned
//! [`Registry`] (no globals), so tests can build as many as they like.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as MetricFamily;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

pub use kpng_backend::metrics::FamilyLabel;

/// Labels of `kubeproxy_sync_proxy_rules_no_local_endpoints_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NoLocalLabel {
    /// `internal` or `external`.
    pub traffic_policy: String,
    /// `IPv4` or `IPv6`.
    pub ip_family: String,
}

/// An HTTP status code label (`proxy_healthz_total{code="200"}`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    /// The status code.
    pub code: String,
}

/// An object kind label for kpng's own input counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// `Service`, `EndpointSlice` or `Node`.
    pub kind: String,
}

/// The node check of `kpng_node_check_problems{check}`: the kernel setting as `sysctl` names
/// it (`net.ipv4.ip_forward`) or `br_netfilter` (the module not loaded).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CheckLabel {
    /// The setting checked.
    pub check: String,
}

/// A backend label for kpng's own sync counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabel {
    /// The backend's name.
    pub backend: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;
type DurationHistograms = MetricFamily<FamilyLabel, Histogram, fn() -> Histogram>;

/// kube-proxy's sync buckets, 1 ms doubling 15 times (up to 16.384 s), and three more (32.768,
/// 65.536 and 131.072 s): a first sync or restart of 30k Services on a loaded or CPU-limited
/// node takes 30 s to minutes, which kube-proxy's buckets put in `+Inf` only. Its bucket
/// boundaries are all kept, so its dashboards' queries read the same series.
pub fn sync_duration_buckets() -> Vec<f64> {
    exponential_buckets(0.001, 2.0, 18).collect()
}

fn sync_duration_histogram() -> Histogram {
    Histogram::new(sync_duration_buckets())
}

/// kube-proxy's conntrack reconciler buckets as they are: 1 ms doubling 15 times.
fn conntrack_duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// kube-proxy's network-programming buckets: 0 (its bucket merge starts with a zero), 0.25 s,
/// 0.5 s, every second up to 59 s, every 5 s up to 115 s, every 30 s up to 5 min.
pub fn network_programming_buckets() -> Vec<f64> {
    let mut buckets = vec![0.0, 0.25, 0.5];
    buckets.extend((1..=59).map(f64::from));
    buckets.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    buckets.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    buckets
}

fn network_programming_histogram() -> Histogram {
    Histogram::new(network_programming_buckets())
}

/// Every metric the sync loop and the HTTP endpoints maintain.
#[derive(Clone, Debug)]
pub struct ProxyMetrics {
    /// `kubeproxy_sync_proxy_rules_duration_seconds`.
    pub sync_duration: DurationHistograms,
    /// `kubeproxy_sync_full_proxy_rules_duration_seconds`.
    pub full_sync_duration: DurationHistograms,
    /// `kubeproxy_sync_partial_proxy_rules_duration_seconds`.
    pub partial_sync_duration: DurationHistograms,
    /// `kubeproxy_sync_proxy_rules_last_timestamp_seconds`: set after every successful sync.
    pub last_sync_timestamp: MetricFamily<FamilyLabel, FloatGauge>,
    /// `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds`: set when a change is queued.
    pub last_queued_timestamp: MetricFamily<FamilyLabel, FloatGauge>,
    /// `kubeproxy_network_programming_duration_seconds`: from an EndpointSlice's
    /// last-change trigger time to the sync that programmed the change.
    pub network_programming_duration: DurationHistograms,
    /// `kubeproxy_sync_proxy_rules_endpoint_changes_total`.
    pub endpoint_changes_total: Counter,
    /// `kubeproxy_sync_proxy_rules_endpoint_changes_pending`.
    pub endpoint_changes_pending: Gauge,
    /// `kubeproxy_sync_proxy_rules_service_changes_total`.
    pub service_changes_total: Counter,
    /// `kubeproxy_sync_proxy_rules_service_changes_pending`.
    pub service_changes_pending: Gauge,
    /// `kubeproxy_sync_proxy_rules_no_local_endpoints_total`.
    pub no_local_endpoints: MetricFamily<NoLocalLabel, Gauge>,
    /// `kubeproxy_proxy_healthz_total`.
    pub healthz_total: MetricFamily<CodeLabel, Counter>,
    /// `kubeproxy_proxy_livez_total`.
    pub livez_total: MetricFamily<CodeLabel, Counter>,
    /// `kpng_objects_seen_total`: objects received from the source.
    pub objects_seen: MetricFamily<KindLabel, Counter>,
    /// `kpng_objects_applied_total`: objects accepted into the model.
    pub objects_applied: MetricFamily<KindLabel, Counter>,
    /// `kpng_object_errors_total`: objects rejected (their last good version kept).
    pub object_errors: MetricFamily<KindLabel, Counter>,
    /// `kpng_rejected_objects`: objects whose latest version is rejected now (a counter of
    /// errors cannot tell a problem fixed since from one still there; alert on this).
    pub rejected_objects: Gauge,
    /// `kpng_dropped_values`: values dropped now from objects in use (a value out of
    /// `--service-node-port-range`, a frontend another Service holds, an external IP that is
    /// not an IP), this kpng's and, on a node fed by a brain, those its brain reports. The
    /// rest of each object is used, so nothing else says a Service lacks a frontend.
    pub dropped_values: Gauge,
    /// `kpng_node_check_problems{check}`: 1 while a kernel setting Services need is wrong
    /// (`kpng status`' `node checks` line), every check the backend needs exported from the
    /// first reading (0 when fine); none where the node is not checked.
    pub node_check_problems: MetricFamily<CheckLabel, Gauge>,
    /// `kpng_sync_failures_total`: failed syncs of any backend.
    pub sync_failures: MetricFamily<BackendLabel, Counter>,
    /// `kpng_sync_operations_total`: data-plane operations sent.
    pub sync_operations: MetricFamily<BackendLabel, Counter>,
    /// `kpng_tampering_detected_total`: changes someone else made to what the backend
    /// programmed, each answered with a full sync.
    pub tampering_detected: MetricFamily<BackendLabel, Counter>,
    /// `kpng_repair_delay_seconds`: how long the repairs of someone else's changes wait now
    /// (0: at once; above 0 while they keep coming, see [`crate::repair_backoff`]). The gauge
    /// to alert on a neighbour that undoes kpng's rules in a loop.
    pub repair_delay: MetricFamily<BackendLabel, FloatGauge>,
    /// `kpng_model_service_ports`: Service ports in the model, per family.
    pub model_service_ports: MetricFamily<FamilyLabel, Gauge>,
    /// `kpng_model_endpoints`: the serving endpoints of those Service ports (an endpoint of
    /// two ports counts twice), per family: with the ports, what memory and sync time grow
    /// with (docs/deploy.md, "Sizing").
    pub model_endpoints: MetricFamily<FamilyLabel, Gauge>,
    /// `kpng_service_healthcheck_failures_total`: health-check servers that could not start.
    pub healthcheck_failures: Counter,
    /// `kpng_service_healthchecks_not_served`: wanted health checks whose server is not
    /// running now (`kpng status` names them): above 0, a load balancer sees this node as
    /// unhealthy for those Services. The gauge to alert on; the counter above counts attempts.
    pub healthchecks_not_served: Gauge,
    /// `kpng_http_connections_refused_total`: connections to the health, metrics and Service
    /// health-check servers closed at once for a cap (`guarded_http`).
    pub http_connections_refused: crate::guarded_http::RefusedConnections,
    /// `kubeproxy_conntrack_reconciler_sync_duration_seconds`: one UDP conntrack cleanup pass.
    pub conntrack_reconciler_duration: DurationHistograms,
    /// `kubeproxy_conntrack_reconciler_deleted_entries_total`: stale UDP entries deleted.
    pub conntrack_reconciler_deleted: MetricFamily<FamilyLabel, Counter>,
    /// `kpng_conntrack_reconciler_failures_total`: cleanup passes that failed (retried after
    /// the next sync).
    pub conntrack_reconciler_failures: MetricFamily<FamilyLabel, Counter>,
}

impl ProxyMetrics {
    /// Creates, at 0, the series whose labels are known at start (this backend, its families,
    /// the object kinds): a series that appears only with its first event makes that event
    /// invisible to `increase()` and `rate()`, which an alert on tampering or sync failures
    /// relies on, and a histogram that appears only after the first EndpointSlice change
    /// leaves the node out of a dashboard's node picker after a restart.
    pub fn export_from_start(&self, backend: &str, families: &[kpng_model::Family]) {
        let backend = BackendLabel {
            backend: backend.to_string(),
        };
        let _ = self.sync_failures.get_or_create(&backend);
        let _ = self.tampering_detected.get_or_create(&backend);
        let _ = self.repair_delay.get_or_create(&backend);
        for kind in kpng_model::Kind::ALL {
            let _ = self.object_errors.get_or_create(&KindLabel {
                kind: kind.as_str().into(),
            });
        }
        for family in families {
            let _ = self
                .network_programming_duration
                .get_or_create(&(*family).into());
        }
    }

    /// Creates, at 0, the UDP conntrack cleanup's failure counter of each family, on a node
    /// that runs the cleanup (a series that appears with the first failure is invisible to
    /// `increase()`; a node without the cleanup exports none).
    pub fn export_conntrack_from_start(&self, families: &[kpng_model::Family]) {
        for family in families {
            let _ = self
                .conntrack_reconciler_failures
                .get_or_create(&(*family).into());
        }
    }

    /// Creates the metrics and registers them.
    pub fn new(registry: &mut Registry) -> ProxyMetrics {
        let m = ProxyMetrics {
            sync_duration: MetricFamily::new_with_constructor(sync_duration_histogram),
            full_sync_duration: MetricFamily::new_with_constructor(sync_duration_histogram),
            partial_sync_duration: MetricFamily::new_with_constructor(sync_duration_histogram),
            last_sync_timestamp: MetricFamily::default(),
            last_queued_timestamp: MetricFamily::default(),
            network_programming_duration: MetricFamily::new_with_constructor(
                network_programming_histogram,
            ),
            endpoint_changes_total: Counter::default(),
            endpoint_changes_pending: Gauge::default(),
            service_changes_total: Counter::default(),
            service_changes_pending: Gauge::default(),
            no_local_endpoints: MetricFamily::default(),
            healthz_total: MetricFamily::default(),
            livez_total: MetricFamily::default(),
            objects_seen: MetricFamily::default(),
            objects_applied: MetricFamily::default(),
            object_errors: MetricFamily::default(),
            rejected_objects: Gauge::default(),
            dropped_values: Gauge::default(),
            node_check_problems: MetricFamily::default(),
            sync_failures: MetricFamily::default(),
            sync_operations: MetricFamily::default(),
            tampering_detected: MetricFamily::default(),
            repair_delay: MetricFamily::default(),
            model_service_ports: MetricFamily::default(),
            model_endpoints: MetricFamily::default(),
            healthcheck_failures: Counter::default(),
            healthchecks_not_served: Gauge::default(),
            http_connections_refused: crate::guarded_http::RefusedConnections::default(),
            conntrack_reconciler_duration: MetricFamily::new_with_constructor(
                conntrack_duration_histogram,
            ),
            conntrack_reconciler_deleted: MetricFamily::default(),
            conntrack_reconciler_failures: MetricFamily::default(),
        };
        let r = registry;
        r.register(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            m.sync_duration.clone(),
        );
        r.register(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
            m.full_sync_duration.clone(),
        );
        r.register(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
            m.partial_sync_duration.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            m.last_sync_timestamp.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            m.last_queued_timestamp.clone(),
        );
        r.register(
            "kubeproxy_network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            m.network_programming_duration.clone(),
        );
        // prometheus-client appends `_total` to counter names.
        r.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            "Cumulative proxy rules Endpoint changes",
            m.endpoint_changes_total.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            "Pending proxy rules Endpoint changes",
            m.endpoint_changes_pending.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_service_changes",
            "Cumulative proxy rules Service changes",
            m.service_changes_total.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "Pending proxy rules Service changes",
            m.service_changes_pending.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints",
            m.no_local_endpoints.clone(),
        );
        r.register(
            "kubeproxy_proxy_healthz",
            "Cumulative proxy healthz HTTP status",
            m.healthz_total.clone(),
        );
        r.register(
            "kubeproxy_proxy_livez",
            "Cumulative proxy livez HTTP status",
            m.livez_total.clone(),
        );
        r.register(
            "kpng_objects_seen",
            "Objects received from the source",
            m.objects_seen.clone(),
        );
        r.register(
            "kpng_objects_applied",
            "Objects accepted into the model",
            m.objects_applied.clone(),
        );
        r.register(
            "kpng_object_errors",
            "Objects rejected as invalid (their last good version is kept)",
            m.object_errors.clone(),
        );
        r.register(
            "kpng_rejected_objects",
            "Objects whose latest version is rejected as invalid (an earlier version, if any, is in use; `kpng status` names them)",
            m.rejected_objects.clone(),
        );
        r.register(
            "kpng_dropped_values",
            "Values dropped from objects in use (the rest of each object is used: a node port out of range or held by another Service, an external IP that is not an IP); `kpng status` names them",
            m.dropped_values.clone(),
        );
        r.register(
            "kpng_node_check_problems",
            "1 while the node's kernel setting `check` breaks Services (IP forwarding off, bridge netfilter off where pods are bridged); `kpng status` shows it under node checks",
            m.node_check_problems.clone(),
        );
        r.register(
            "kpng_sync_failures",
            "Failed syncs, by backend",
            m.sync_failures.clone(),
        );
        r.register(
            "kpng_sync_operations",
            "Data-plane operations sent, by backend",
            m.sync_operations.clone(),
        );
        r.register(
            "kpng_tampering_detected",
            "Changes someone else made to the backend's data plane, each repaired by a full sync",
            m.tampering_detected.clone(),
        );
        r.register(
            "kpng_repair_delay_seconds",
            "How long repairs of changes someone else made wait now: 0 at once, above 0 while such changes keep coming",
            m.repair_delay.clone(),
        );
        r.register(
            "kpng_model_service_ports",
            "Service ports in the node-local model",
            m.model_service_ports.clone(),
        );
        r.register(
            "kpng_model_endpoints",
            "Serving endpoints of the Service ports in the node-local model (one per port they serve)",
            m.model_endpoints.clone(),
        );
        r.register(
            "kpng_service_healthcheck_failures",
            "Service health-check servers that could not be started (retried at the next sync)",
            m.healthcheck_failures.clone(),
        );
        r.register(
            "kpng_service_healthchecks_not_served",
            "Service health checks whose server is not running now (kpng status names them)",
            m.healthchecks_not_served.clone(),
        );
        m.http_connections_refused.register_in(r);
        r.register(
            "kubeproxy_conntrack_reconciler_sync_duration_seconds",
            "ReconcileConntrackFlowsLatency latency in seconds",
            m.conntrack_reconciler_duration.clone(),
        );
        r.register(
            "kubeproxy_conntrack_reconciler_deleted_entries",
            "Cumulative conntrack flows deleted by conntrack reconciler",
            m.conntrack_reconciler_deleted.clone(),
        );
        r.register(
            "kpng_conntrack_reconciler_failures",
            "UDP conntrack cleanup passes that failed (retried after the next sync)",
            m.conntrack_reconciler_failures.clone(),
        );
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpng_model::Family;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn network_programming_buckets_are_kube_proxys() {
        let b = network_programming_buckets();
        // 1 + 2 + 59 + 12 + 7 boundaries.
        assert_eq!(b.len(), 81);
        assert_eq!(&b[..5], &[0.0, 0.25, 0.5, 1.0, 2.0]);
        assert_eq!(b[61], 59.0);
        assert_eq!(&b[62..64], &[60.0, 65.0]);
        assert_eq!(b[73], 115.0);
        assert_eq!(&b[74..], &[120.0, 150.0, 180.0, 210.0, 240.0, 270.0, 300.0]);
        assert!(b.windows(2).all(|w| w[0] < w[1]), "strictly increasing");
    }

    #[test]
    fn sync_buckets_are_kube_proxys_and_reach_two_minutes() {
        let b = sync_duration_buckets();
        // kube-proxy's 15 (1 ms … 16.384 s), unchanged, then up to 131.072 s.
        assert_eq!(b.len(), 18);
        let upstream: Vec<f64> = exponential_buckets(0.001, 2.0, 15).collect();
        assert_eq!(&b[..15], upstream.as_slice());
        assert!((b[14] - 16.384).abs() < 1e-9);
        assert!((b[17] - 131.072).abs() < 1e-9);
        // A 30 s, 60 s and 120 s sync each land in a bucket of their own, not in +Inf.
        for (secs, le) in [(30.0, 32.768), (60.0, 65.536), (120.0, 131.072)] {
            let first = b.iter().find(|&&x| x >= secs).copied();
            assert!(
                first.is_some_and(|x| (x - le).abs() < 1e-9),
                "{secs}: {first:?}"
            );
        }
    }

    #[test]
    fn names_match_kube_proxy() {
        let mut registry = Registry::default();
        let m = ProxyMetrics::new(&mut registry);
        m.sync_duration
            .get_or_create(&Family::V4.into())
            .observe(0.002);
        m.last_sync_timestamp
            .get_or_create(&Family::V4.into())
            .set(1.5);
        m.endpoint_changes_total.inc();
        m.network_programming_duration
            .get_or_create(&Family::V6.into())
            .observe(0.3);
        m.healthz_total
            .get_or_create(&CodeLabel { code: "200".into() })
            .inc();
        m.conntrack_reconciler_duration
            .get_or_create(&Family::V6.into())
            .observe(0.3);
        m.conntrack_reconciler_deleted
            .get_or_create(&Family::V4.into())
            .inc_by(3);
        let mut text = String::new();
        encode(&mut text, &registry).expect("encode");
        for needle in [
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.001\",ip_family=\"IPv4\"} 0",
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"16.384\",ip_family=\"IPv4\"} 1",
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"131.072\",ip_family=\"IPv4\"} 1",
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} 1.5",
            "kubeproxy_sync_proxy_rules_endpoint_changes_total 1",
            "kubeproxy_network_programming_duration_seconds_bucket{le=\"0.0\",ip_family=\"IPv6\"} 0",
            "kubeproxy_network_programming_duration_seconds_bucket{le=\"0.5\",ip_family=\"IPv6\"} 1",
            "kubeproxy_network_programming_duration_seconds_bucket{le=\"300.0\",ip_family=\"IPv6\"} 1",
            "kubeproxy_proxy_healthz_total{code=\"200\"} 1",
            "# TYPE kubeproxy_conntrack_reconciler_sync_duration_seconds histogram",
            "kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket{le=\"0.256\",ip_family=\"IPv6\"} 0",
            "kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket{le=\"0.512\",ip_family=\"IPv6\"} 1",
            "# TYPE kubeproxy_conntrack_reconciler_deleted_entries counter",
            "kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv4\"} 3",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
    }
}
