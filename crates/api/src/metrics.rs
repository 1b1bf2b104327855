//! The brain's own metrics, in a registry the binary owns (no globals).

use std::collections::BTreeSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// What the API server counts.
#[derive(Clone, Debug, Default)]
pub struct ApiMetrics {
    /// `kpng_api_clients_connected`: watchers with an open Watch stream.
    pub clients_connected: Gauge,
    /// `kpng_api_change_sets_total`: change sets sent (each ends with `Sync`).
    pub change_sets: Counter,
    /// `kpng_api_ops_total`: Set and Delete ops sent (those inside bundles included).
    pub ops: Counter,
    /// `kpng_api_sent_bytes_total`: bytes of the Watch streams handed to HTTP/2 (gRPC
    /// messages; bundles compressed): what the brain costs the network.
    pub sent_bytes: Counter,
    /// `kpng_api_refused_total{reason}`: Watches and connections refused, by reason. The log
    /// tells the first of each kind per peer and then summarises; this counts every one, for
    /// an alert on a node stuck in a retry loop.
    pub refused: Family<RefusedLabel, Counter>,
    /// `kpng_api_tls_certificate_expiry_timestamp_seconds{file}`: the served certificate's notAfter as
    /// a Unix time (node_exporter's and cert-manager's convention), so that an alert is
    /// `kpng_api_tls_certificate_expiry_timestamp_seconds - time() < 7*86400`. No series without TLS,
    /// so a plaintext brain does not look expired.
    pub tls_certificate_expiry: Family<TlsFileLabel, Gauge>,
    /// `kpng_api_tls_reload_failures_total`: changed TLS files the brain could not take (it
    /// keeps serving the previous ones), one per change of the files.
    pub tls_reload_failures: Counter,
    /// `kpng_api_tls_handshake_failures_total`: connections whose TLS handshake failed (a
    /// client certificate refused, a plaintext client, no handshake in time); the log names
    /// the first of each address and then summarises, this counts every one.
    pub tls_handshake_failures: Counter,
    /// What the brain serves over TLS, for `kpng status`.
    pub tls: ServedTls,
    /// `kpng_object_errors_total{kind}`: objects rejected (their last good version kept), as
    /// a node's kpng counts them: in split mode the brain is where objects are rejected.
    pub object_errors: Family<KindLabel, Counter>,
    /// `kpng_rejected_objects`: objects whose latest version is rejected now, as a node's
    /// kpng reports it (the alert docs/observability.md recommends).
    pub rejected_objects: Gauge,
    /// `kpng_dropped_values`: values dropped now from objects in use, as a node's kpng
    /// reports it (the brain is where they are dropped in split mode).
    pub dropped_values: Gauge,
    /// `kpng_api_nodes_not_connected`: the cluster's Nodes with no kpng connected to *this*
    /// brain. True for a lone brain; with several behind one Service each counts the nodes
    /// connected to the others, so an alert adds [`ApiMetrics::node_connected`] up instead.
    pub nodes_not_connected: Gauge,
    /// `kpng_api_nodes`: the cluster's Nodes this brain knows (the same on every brain of a
    /// cluster, once listed).
    pub nodes: Gauge,
    /// `kpng_api_node_connected{node}`: 1 for each of the cluster's Nodes with a kpng
    /// connected to this brain, no series for the others. Summed over several brains it says
    /// which Nodes follow some brain (a Node may follow only one at a time): the alert on
    /// Nodes following none is `kpng_api_nodes` minus the Nodes with a series.
    pub node_connected: Family<NodeLabel, Gauge>,
    /// The nodes [`ApiMetrics::node_connected`] has a series for, to remove those that left.
    connected_shown: Arc<Mutex<BTreeSet<String>>>,
    /// `kpng_api_node_lag_seconds{node}`: for each of the cluster's Nodes with a kpng
    /// connected to this brain (the series of [`ApiMetrics::node_connected`], no others), how
    /// long the oldest change not yet sent to it has waited (0: it has everything). A node
    /// that stops reading its stream (hung, stopped, overloaded) shows here long before the
    /// keepalive drops it; until 2026-12-07 only the brain's `kpng status` showed it.
    pub node_lag_seconds: Family<NodeLabel, Gauge<f64, AtomicU64>>,
    /// The nodes [`ApiMetrics::node_lag_seconds`] has a series for.
    lag_shown: Arc<Mutex<BTreeSet<String>>>,
    /// `kpng_api_duplicate_node_names`: node names more than one connected kpng asks for.
    pub duplicate_node_names: Gauge,
    /// `kpng_api_unknown_node_names`: node names connected kpngs ask for that no Node has
    /// (never had, or deleted).
    pub unknown_node_names: Gauge,
    /// `kpng_api_connected_node_versions{version}`: connected nodes per kpng build
    /// (`0.1.0+COMMIT`; `unknown` for a client that sends none): a rollout's progress per
    /// brain, summed over brains for the cluster's.
    pub connected_node_versions: Family<VersionLabel, Gauge>,
    /// The versions [`ApiMetrics::connected_node_versions`] has a series for.
    versions_shown: Arc<Mutex<BTreeSet<String>>>,
}

/// The label of `kpng_api_connected_node_versions`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabel {
    /// A node's kpng build, as it sent it.
    pub version: String,
}

/// The label of `kpng_api_tls_certificate_expiry_timestamp_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TlsFileLabel {
    /// The certificate file (`--listen-tls-cert`).
    pub file: String,
}

/// The certificate a brain serves and whether its files' last change could be taken: shared
/// by the server, which sets it at start and at each reload, and `kpng status`.
#[derive(Clone, Debug, Default)]
pub struct ServedTls(Arc<Mutex<Option<TlsStatus>>>);

impl ServedTls {
    /// What is served; `None` without TLS.
    pub fn get(&self) -> Option<TlsStatus> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn set(&self, status: TlsStatus) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(status);
    }
}

/// The certificate a brain serves, as `kpng status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsStatus {
    /// The certificate file (`--listen-tls-cert`).
    pub file: String,
    /// The served certificate's subject (`CN=…`).
    pub subject: String,
    /// Its notAfter, RFC 3339.
    pub not_after: String,
    /// Its notAfter, Unix time (what the status compares with the clock).
    pub not_after_unix: i64,
    /// Why the files' last change could not be taken (the previous material is still
    /// served); `None` when the files are what is served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reload_failure: Option<String>,
}

/// The label of `kpng_api_node_connected`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabel {
    /// The Node's name.
    pub node: String,
}

/// The label of `kpng_object_errors_total` (the same as a node's kpng's).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// `Service`, `EndpointSlice`, `Node` or `ServiceCIDR`.
    pub kind: String,
}

/// The label of `kpng_api_refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabel {
    /// `not_a_node_name`, `other_node`, `unknown_node`, `too_many_watches`,
    /// `too_many_watches_from_peer` or `too_many_connections`; each exists at 0 from the start.
    pub reason: String,
}

impl ApiMetrics {
    /// Makes `kpng_api_node_connected` hold a series for exactly the nodes in `connected`:
    /// the new ones are added and those that left removed (never all cleared at once, so a
    /// scrape never sees a connected node missing).
    pub fn set_connected_nodes(&self, connected: BTreeSet<String>) {
        let mut shown = self
            .connected_shown
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for gone in shown.difference(&connected) {
            self.node_connected
                .remove(&NodeLabel { node: gone.clone() });
        }
        for node in &connected {
            self.node_connected
                .get_or_create(&NodeLabel { node: node.clone() })
                .set(1);
        }
        *shown = connected;
    }

    /// Sets `kpng_api_node_lag_seconds` to `lags` (a node's largest lag over its watchers),
    /// for the nodes [`ApiMetrics::set_connected_nodes`] has a series for: the others' series
    /// are removed, so it is bounded as `kpng_api_node_connected` is (the cluster's Nodes
    /// with a kpng connected, not every name a client asks for).
    pub fn set_node_lags(&self, lags: &std::collections::BTreeMap<String, f64>) {
        let connected = self
            .connected_shown
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let mut shown = self
            .lag_shown
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for gone in shown.difference(&connected) {
            self.node_lag_seconds
                .remove(&NodeLabel { node: gone.clone() });
        }
        for node in &connected {
            self.node_lag_seconds
                .get_or_create(&NodeLabel { node: node.clone() })
                .set(lags.get(node).copied().unwrap_or(0.0));
        }
        *shown = connected;
    }

    /// Makes `kpng_api_connected_node_versions` hold a series for exactly the builds in
    /// `counts`, with their counts: a build no node runs any more has no series (a rollout's
    /// old build disappears), and none is cleared before it is set again.
    pub fn set_node_versions(&self, counts: std::collections::BTreeMap<String, i64>) {
        let mut shown = self
            .versions_shown
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for gone in shown.iter().filter(|v| !counts.contains_key(*v)) {
            self.connected_node_versions.remove(&VersionLabel {
                version: gone.clone(),
            });
        }
        for (version, n) in &counts {
            self.connected_node_versions
                .get_or_create(&VersionLabel {
                    version: version.clone(),
                })
                .set(*n);
        }
        *shown = counts.into_keys().collect();
    }

    /// Creates the metrics and registers them.
    pub fn new(registry: &mut Registry) -> ApiMetrics {
        let m = ApiMetrics::default();
        registry.register(
            "kpng_api_clients_connected",
            "API clients with an open Watch stream",
            m.clients_connected.clone(),
        );
        // prometheus-client appends `_total` to counter names.
        registry.register(
            "kpng_api_change_sets",
            "Change sets sent to API clients (each ends with Sync)",
            m.change_sets.clone(),
        );
        registry.register(
            "kpng_api_ops",
            "Set and Delete ops sent to API clients",
            m.ops.clone(),
        );
        registry.register(
            "kpng_api_sent_bytes",
            "Bytes of gRPC messages sent to API clients (bundles compressed)",
            m.sent_bytes.clone(),
        );
        // Each reason at 0 from the start (an alerting counter, docs/observability.md): the
        // first refusal shows in `increase()`.
        for refusal in crate::server::refusal_log::Refusal::COUNTED {
            let _ = m.refused.get_or_create(&RefusedLabel {
                reason: refusal.label().into(),
            });
        }
        registry.register(
            "kpng_api_refused",
            "Watches and connections the API server refused, by reason",
            m.refused.clone(),
        );
        registry.register(
            "kpng_api_tls_certificate_expiry_timestamp_seconds",
            "The notAfter of the certificate the API server serves, as a Unix time",
            m.tls_certificate_expiry.clone(),
        );
        registry.register(
            "kpng_api_tls_reload_failures",
            "Changes of the API server's TLS files that could not be taken (the previous \
             certificate is still served)",
            m.tls_reload_failures.clone(),
        );
        registry.register(
            "kpng_api_tls_handshake_failures",
            "Connections to the API server whose TLS handshake failed",
            m.tls_handshake_failures.clone(),
        );
        // Each kind at 0 from the start, as on a node: the first rejection shows in
        // `increase()`.
        for kind in kpng_model::Kind::ALL {
            let _ = m.object_errors.get_or_create(&KindLabel {
                kind: kind.as_str().into(),
            });
        }
        registry.register(
            "kpng_object_errors",
            "Objects rejected as invalid (their last good version is kept)",
            m.object_errors.clone(),
        );
        registry.register(
            "kpng_rejected_objects",
            "Objects whose latest version is rejected as invalid (an earlier version, if any, is in use; `kpng status` names them)",
            m.rejected_objects.clone(),
        );
        registry.register(
            "kpng_dropped_values",
            "Values dropped from objects in use (the rest of each object is used: a node port out of range or held by another Service, an external IP that is not an IP); `kpng status` names them",
            m.dropped_values.clone(),
        );
        registry.register(
            "kpng_api_nodes_not_connected",
            "The cluster's Nodes with no kpng connected to this brain (`kpng status` on the brain names them); with several brains behind one Service a node connected to another brain counts too: alert on kpng_api_nodes and kpng_api_node_connected instead",
            m.nodes_not_connected.clone(),
        );
        registry.register(
            "kpng_api_nodes",
            "The cluster's Nodes this brain knows",
            m.nodes.clone(),
        );
        registry.register(
            "kpng_api_node_connected",
            "1 for each of the cluster's Nodes with a kpng connected to this brain (summed over brains: the Nodes that follow one)",
            m.node_connected.clone(),
        );
        registry.register(
            "kpng_api_node_lag_seconds",
            "For each Node with a kpng connected to this brain, how long the oldest change not yet sent to it has waited (0: it has everything); a node that stopped reading its stream grows here until the keepalive drops it",
            m.node_lag_seconds.clone(),
        );
        registry.register(
            "kpng_api_duplicate_node_names",
            "Node names more than one connected kpng asks for (a copied DaemonSet or a wrong --hostname-override)",
            m.duplicate_node_names.clone(),
        );
        registry.register(
            "kpng_api_unknown_node_names",
            "Node names connected kpngs ask for that no Node has now (a typo, a short hostname, or a deleted Node)",
            m.unknown_node_names.clone(),
        );
        registry.register(
            "kpng_api_connected_node_versions",
            "Connected kpngs per build (version+git commit; unknown: one that sends none): a rollout's progress",
            m.connected_node_versions.clone(),
        );
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An alerting counter exists at 0 from the start, every reason of it (it had no series
    /// until the first refusal, so `increase()` missed that one).
    #[test]
    fn every_refusal_reason_is_exported_at_0_from_the_start() {
        let mut registry = Registry::default();
        let _metrics = ApiMetrics::new(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        for reason in [
            "not_a_node_name",
            "other_node",
            "unknown_node",
            "too_many_watches",
            "too_many_watches_from_peer",
            "too_many_connections",
        ] {
            let line = format!("\nkpng_api_refused_total{{reason=\"{reason}\"}} 0\n");
            assert!(text.contains(&line), "{line}{text}");
        }
    }

    /// The certificate's expiry is a Unix time: Prometheus' convention names it `…_timestamp_seconds`.
    #[test]
    fn the_certificate_expiry_is_named_as_a_timestamp() {
        let mut registry = Registry::default();
        let metrics = ApiMetrics::new(&mut registry);
        metrics
            .tls_certificate_expiry
            .get_or_create(&TlsFileLabel {
                file: "/tls/tls.crt".into(),
            })
            .set(1_900_000_000);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        let line =
            "kpng_api_tls_certificate_expiry_timestamp_seconds{file=\"/tls/tls.crt\"} 1900000000";
        assert!(text.contains(line), "{line} missing:\n{text}");
    }

    /// A brain's alerting counters exist at 0 from the start, as a node's.
    #[test]
    fn object_errors_are_exported_from_the_start() {
        let mut registry = Registry::default();
        let _metrics = ApiMetrics::new(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        for kind in kpng_model::Kind::ALL {
            let line = format!("kpng_object_errors_total{{kind=\"{}\"}} 0", kind.as_str());
            assert!(text.contains(&line), "{line} missing:\n{text}");
        }
    }
}
