//! How many routine syncs reach the log at info level.
//!
//! Why: one `synced` line per sync is ~220 bytes; at 10 changes/s that is a line a second on
//! every node, 19 MB a day per node and terabytes across a fleet, for syncs nobody reads
//! one by one. kube-proxy logs its sync lines at `-v=2` (kubeadm's default verbosity, 0,
//! shows none). kpng keeps at info level what an operator needs to follow a node: the first
//! sync, full syncs, repairs, failures, slow syncs ([`SLOW`]) and the first
//! [`SHOWN_PER_MINUTE`] routine syncs of each minute, so that a quiet cluster's every change
//! still shows. The routine syncs beyond those are logged at debug level and summed up in one
//! info line once the minute is over ([`Held`]): how many, the Services they changed, the
//! operations and the longest.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Routine syncs logged at info level in one minute; the rest go to debug.
pub const SHOWN_PER_MINUTE: usize = 10;

/// The interval of the budget and of the summary.
pub const WINDOW: Duration = Duration::from_secs(60);

/// A sync at least this long is always logged at info level: a planner and an operator want to
/// see it (it delays every change behind it).
pub const SLOW: Duration = Duration::from_secs(1);

/// A duration in milliseconds rounded down to the microsecond, for a log field: seconds as
/// `f64` times 1000 logged binary noise (`duration_ms=0.40885200000000005` for 408.852 µs); a
/// whole number of microseconds divided by 1000 prints as its decimal (`0.408`).
pub fn log_millis(d: Duration) -> f64 {
    // u128 → f64 is exact below 2^53 µs (285 years).
    d.as_micros() as f64 / 1000.0
}

/// How many Service names the summary line shows.
const NAMED: usize = 3;

/// The routine syncs a window logged at debug level only.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Held {
    /// How many.
    pub syncs: usize,
    /// The Services they changed (`namespace/name`), each once.
    pub services: BTreeSet<String>,
    /// The data-plane operations they sent.
    pub operations: usize,
    /// The longest of them.
    pub longest: Duration,
}

impl Held {
    /// The summary line's text (without the backend, which the line carries as a field).
    pub fn describe(&self) -> String {
        let mut names: Vec<&str> = self
            .services
            .iter()
            .take(NAMED)
            .map(String::as_str)
            .collect();
        if self.services.len() > NAMED {
            names.push("…");
        }
        let services = if names.is_empty() {
            String::new()
        } else {
            format!(" ({})", names.join(", "))
        };
        format!(
            "{} more routine syncs in the last minute were logged at debug level only: {} \
             Services changed{services}, {} operations, the longest {:?} (`--log-level debug` \
             shows each)",
            self.syncs,
            self.services.len(),
            self.operations,
            self.longest
        )
    }
}

/// The budget of the current window.
#[derive(Debug, Default)]
pub struct SyncLog {
    /// When the current window started (at its first routine sync).
    started: Option<Instant>,
    shown: usize,
    held: Held,
}

impl SyncLog {
    /// Ends the window if it is over at `now`, returning what it held back (if anything) for
    /// one summary line. Called at every sync, so the summary comes at most `--sync-period`
    /// after the minute ended.
    pub fn roll(&mut self, now: Instant) -> Option<Held> {
        let started = self.started?;
        if now.duration_since(started) < WINDOW {
            return None;
        }
        let held = std::mem::take(&mut self.held);
        self.started = None;
        self.shown = 0;
        (held.syncs > 0).then_some(held)
    }

    /// Whether a routine sync at `now` is logged at info level; one that is not is counted
    /// with its `duration`, `operations` and changed `services` for the summary.
    pub fn admit(
        &mut self,
        now: Instant,
        duration: Duration,
        operations: usize,
        services: impl Iterator<Item = String>,
    ) -> bool {
        self.started.get_or_insert(now);
        if self.shown < SHOWN_PER_MINUTE {
            self.shown += 1;
            return true;
        }
        let held = &mut self.held;
        held.syncs += 1;
        held.operations += operations;
        held.longest = held.longest.max(duration);
        held.services.extend(services);
        false
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn log_millis_prints_the_microseconds_without_noise() {
        for (d, shown) in [
            (Duration::from_nanos(408_852), "0.408"),
            (Duration::from_nanos(408_999), "0.408"),
            (Duration::from_nanos(408_852_000), "408.852"),
            (Duration::from_micros(1_500), "1.5"),
            (Duration::from_secs(2), "2000"),
            (Duration::ZERO, "0"),
        ] {
            assert_eq!(log_millis(d).to_string(), shown, "{d:?}");
        }
        // What the sync line logged before, for the same 408.852 µs.
        assert_eq!(
            (Duration::from_nanos(408_852).as_secs_f64() * 1000.0).to_string(),
            "0.40885200000000005"
        );
    }
    use super::*;

    /// (seconds since the start, whether the sync is admitted at info level, a summary
    /// expected before it: (syncs, services))
    type Step = (u64, bool, Option<(usize, usize)>);

    #[test]
    fn the_first_routine_syncs_of_a_minute_are_shown_and_the_rest_summed_up_after_it() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // 10 changes a second for 2 minutes would be 1,200 lines; here one sync a second.
        let mut steps: Vec<Step> = Vec::new();
        for s in 0..SHOWN_PER_MINUTE as u64 {
            steps.push((s, true, None));
        }
        for s in SHOWN_PER_MINUTE as u64..60 {
            steps.push((s, false, None));
        }
        // The minute is over: its 50 held-back syncs (of 2 Services) are summed up, and the
        // next minute's first syncs are shown again.
        steps.push((60, true, Some((60 - SHOWN_PER_MINUTE, 2))));
        steps.push((61, true, None));
        // A quiet hour: a sync now and then is always shown, and nothing is summed up.
        steps.push((4000, true, None));
        steps.push((8000, true, None));
        let mut log = SyncLog::default();
        for (s, shown, summary) in steps {
            let held = log.roll(at(s));
            assert_eq!(
                held.as_ref().map(|h| (h.syncs, h.services.len())),
                summary,
                "summary before the sync at {s} s"
            );
            let services = if s % 2 == 0 { "ns/a" } else { "ns/b" };
            let admitted = log.admit(
                at(s),
                Duration::from_millis(s),
                2,
                std::iter::once(services.to_string()),
            );
            assert_eq!(admitted, shown, "sync at {s} s");
        }
    }

    #[test]
    fn the_summary_names_a_few_services_and_the_longest_sync() {
        let held = Held {
            syncs: 50,
            services: ["ns/a", "ns/b", "ns/c", "ns/d"]
                .map(String::from)
                .into_iter()
                .collect(),
            operations: 200,
            longest: Duration::from_millis(12),
        };
        let line = held.describe();
        assert!(
            line.starts_with("50 more routine syncs in the last minute")
                && line.contains("4 Services changed (ns/a, ns/b, ns/c, …), 200 operations")
                && line.contains("the longest 12ms"),
            "{line}"
        );
        // Read as a sync line by nothing that counts them (" synced").
        assert!(!line.contains(" synced"), "{line}");
    }
}
