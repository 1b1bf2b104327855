//! The source's own metrics, so that a source that went stale is visible, not just quiet.
//!
//! The binary owns the registry; it hands the source a [`SourceMetrics`] (clones share their
//! values) and registers it with [`SourceMetrics::register`].

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Why a load failed.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// `read` (the file could not be read) or `parse` (it did not parse or convert).
    pub reason: String,
}

/// `kpng_source_errors_total{reason}` and `kpng_source_last_good_load_timestamp_seconds`.
#[derive(Debug, Clone, Default)]
pub struct SourceMetrics {
    /// Failed loads, by reason.
    pub errors: Family<ReasonLabel, Counter>,
    /// When the input last loaded without error (Unix seconds).
    pub last_good_load: Gauge<f64, AtomicU64>,
}

impl SourceMetrics {
    /// Registers the metrics.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kpng_source_errors",
            "Loads of the file source that failed, by reason (read, parse)",
            self.errors.clone(),
        );
        registry.register(
            "kpng_source_last_good_load_timestamp_seconds",
            "When the file source last loaded its input without error",
            self.last_good_load.clone(),
        );
    }

    /// Counts a failed load.
    pub fn error(&self, reason: &str) {
        self.errors
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc();
    }

    /// Records a good load now.
    pub fn good_load(&self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        self.last_good_load.set(now);
    }
}
