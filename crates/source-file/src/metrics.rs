//! The source's own metrics and health record, so that a source that went stale is visible,
//! not just quiet.
//!
//! The binary owns the registry; it hands the source a [`SourceMetrics`] (clones share their
//! values) and registers it with [`SourceMetrics::register`]. The same handle carries the
//! input's [`InputHealth`], which `kpng status` shows: which file cannot be used, since when,
//! and when the input last loaded.

use std::sync::atomic::AtomicU64;
use std::time::SystemTime;

use kpng_model::input::InputHealth;

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
    /// What is wrong with the input now, and its last good load (for `kpng status`).
    pub health: InputHealth,
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

    /// Counts a failed load of `file` (`reason`: `read` or `parse`) and records it as the
    /// file's problem until the file loads.
    pub fn failed(&self, reason: &str, file: &std::path::Path, message: &str) {
        self.errors
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc();
        self.health
            .failing(&file.to_string_lossy(), message, SystemTime::now());
    }

    /// Records a good load of `file` now: its problem, if any, is over.
    pub fn good_load(&self, file: &std::path::Path) {
        let now = SystemTime::now();
        let seconds = now
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        self.last_good_load.set(seconds);
        // Borrowed, not allocated, for a UTF-8 path: this runs per file of a large directory.
        self.health.recovered(&file.to_string_lossy());
    }
}
