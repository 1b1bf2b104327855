//! The source's own metrics and health record, so that a source that went stale is visible,
//! not just quiet.
//!
//! The binary owns the registry; it hands the source a [`SourceMetrics`] (clones share their
//! values) and registers it with [`SourceMetrics::register`]. The same handle carries the
//! input's [`InputHealth`], which `kpng status` shows: which file cannot be used, since when,
//! and when the input last loaded.

use std::time::SystemTime;

use kpng_model::input::InputHealth;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Why a load failed.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// `read` (the file could not be read) or `parse` (it did not parse or convert).
    pub reason: String,
}

/// The reasons of `kpng_source_errors_total`, each exported from the start.
pub const REASONS: [&str; 2] = ["read", "parse"];

/// `kpng_source_errors_total{reason}`: every failed load, counted (a problem fixed between two
/// scrapes still shows in `increase()`, which `kpng_input_problems`, a gauge of the problems
/// now, misses). When the input last loaded is `kpng_input_last_good_timestamp_seconds`, from
/// [`InputHealth`], for every source.
#[derive(Debug, Clone, Default)]
pub struct SourceMetrics {
    /// Failed loads, by reason.
    pub errors: Family<ReasonLabel, Counter>,
    /// What is wrong with the input now, and its last good load (for `kpng status`).
    pub health: InputHealth,
}

impl SourceMetrics {
    /// Registers the metrics, each reason's series at 0 from the start (so that the first
    /// failure shows in `increase()`).
    pub fn register(&self, registry: &mut Registry) {
        for reason in REASONS {
            let _ = self.errors.get_or_create(&ReasonLabel {
                reason: reason.into(),
            });
        }
        registry.register(
            "kpng_source_errors",
            "Loads of the file source that failed, by reason (read, parse)",
            self.errors.clone(),
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

    /// Records a good load of `file`: its problem, if any, is over. Returns when that problem
    /// began (its log line says how long the problem lasted).
    pub fn good_load(&self, file: &std::path::Path) -> Option<SystemTime> {
        // Borrowed, not allocated, for a UTF-8 path: this runs per file of a large directory.
        self.health.recovered(&file.to_string_lossy())
    }
}

/// Logs [`problem_over`] at info level, with how long the problem lasted as a number
/// (`lasted_seconds`) and the file (`file`), for a log pipeline that cannot parse `9m 2s`.
pub(crate) fn log_problem_over(file: &std::path::Path, since: SystemTime, now: SystemTime) {
    tracing::info!(
        file = %file.display(),
        lasted_seconds = kpng_model::input::lasted_seconds(since, now),
        "{}",
        problem_over(file, since, now)
    );
}

/// The line that ends a problem of `file` that began at `since`: the error line said it began
/// and what is kept meanwhile, and without this one nothing says when it was fixed.
pub(crate) fn problem_over(file: &std::path::Path, since: SystemTime, now: SystemTime) -> String {
    format!(
        "{}: loaded again, the problem is over (it lasted {})",
        file.display(),
        kpng_model::input::lasted(since, now)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each reason's counter is exported at 0 from the start; the last good load's time is
    /// `kpng_input_last_good_timestamp_seconds` only (no duplicate of it).
    #[test]
    fn the_error_counters_exist_from_the_start() {
        let metrics = SourceMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        for reason in REASONS {
            let line = format!("kpng_source_errors_total{{reason=\"{reason}\"}} 0");
            assert!(text.contains(&line), "{line} missing:\n{text}");
        }
        assert!(!text.contains("last_good_load"), "{text}");
    }
}
