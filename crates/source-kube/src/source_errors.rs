//! `kpng_source_errors_total{reason}` for the `kube` source: lists the API server answered
//! (a 200) whose answer could then not be read or decoded. Why: such a list is retried with
//! backoff and nothing else counts it (the request metrics saw a 200, the reachability layer
//! an answer), so a proxy cutting answers short looked like a quiet cluster.
//!
//! The same family as the `file` source's (one source runs per process), with the kube
//! source's reasons.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Why a list failed after its answer began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListFailure {
    /// The body could not be read: cut short, the connection reset, or nothing received for
    /// the idle timeout in the middle of it.
    Read,
    /// The body was read whole but is not a list (JSON that does not decode, not UTF-8).
    Decode,
}

impl ListFailure {
    /// The `reason` label.
    pub fn reason(self) -> &'static str {
        match self {
            ListFailure::Read => "list_read",
            ListFailure::Decode => "list_decode",
        }
    }
}

/// The reasons, each exported from the start.
pub const REASONS: [ListFailure; 2] = [ListFailure::Read, ListFailure::Decode];

/// The `reason` label of `kpng_source_errors_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// `list_read` or `list_decode`.
    pub reason: &'static str,
}

/// Failed lists, by reason; cheap to clone (clones share their values).
#[derive(Debug, Clone, Default)]
pub struct SourceErrors {
    errors: Family<ReasonLabel, Counter>,
}

impl SourceErrors {
    /// Registers the counters, each reason at 0 from the start (so that the first failure
    /// shows in `increase()`).
    pub fn register(&self, registry: &mut Registry) {
        for failure in REASONS {
            let _ = self.errors.get_or_create(&ReasonLabel {
                reason: failure.reason(),
            });
        }
        registry.register(
            "kpng_source_errors",
            "Lists of the kube source answered by the API server whose answer could not be read \
             (list_read: cut short, connection reset, silent mid-answer) or decoded (list_decode)",
            self.errors.clone(),
        );
    }

    /// Counts one failed list.
    pub fn count(&self, failure: ListFailure) {
        self.errors
            .get_or_create(&ReasonLabel {
                reason: failure.reason(),
            })
            .inc();
    }

    /// How many lists failed for `failure` so far.
    pub fn get(&self, failure: ListFailure) -> u64 {
        self.errors
            .get_or_create(&ReasonLabel {
                reason: failure.reason(),
            })
            .get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reason_is_exported_from_the_start_and_counts() {
        let errors = SourceErrors::default();
        let mut registry = Registry::default();
        errors.register(&mut registry);
        errors.count(ListFailure::Read);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        for line in [
            "kpng_source_errors_total{reason=\"list_read\"} 1",
            "kpng_source_errors_total{reason=\"list_decode\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
    }
}
