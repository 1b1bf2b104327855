//! Identical warnings and errors, rate-limited with a count.
//!
//! Why: a fault that persists (an API server away, a refused transaction retried, a port in
//! use) would otherwise print the same line at every retry, burying everything else. The first
//! occurrence of a warning or error is shown; identical ones (same level, target and fields)
//! within [`WINDOW`] are counted, not shown; the first one after the window is shown with how
//! many were not. Info and debug lines pass untouched.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// How long identical lines are held back after one was shown.
pub const WINDOW: Duration = Duration::from_secs(30);

/// More distinct lines than this make old entries be forgotten.
const MAX_KEYS: usize = 1024;

#[derive(Debug, Clone, Copy)]
struct Seen {
    shown_at: Instant,
    suppressed: u64,
}

/// The pure decision: `None` to hold the line back, `Some(n)` to show it, `n` identical ones
/// having been held back since the last one shown.
fn decide(
    seen: &mut HashMap<String, Seen>,
    key: String,
    now: Instant,
    window: Duration,
) -> Option<u64> {
    if seen.len() > MAX_KEYS {
        seen.retain(|_, s| now.duration_since(s.shown_at) < window);
        // Still full (a burst of distinct lines, such as one warning per object of a large
        // load): forget them all, or every further line would walk the whole map again.
        if seen.len() > MAX_KEYS / 2 {
            seen.clear();
        }
    }
    match seen.get_mut(&key) {
        Some(s) if now.duration_since(s.shown_at) < window => {
            s.suppressed += 1;
            None
        }
        Some(s) => {
            let n = s.suppressed;
            *s = Seen {
                shown_at: now,
                suppressed: 0,
            };
            Some(n)
        }
        None => {
            seen.insert(
                key,
                Seen {
                    shown_at: now,
                    suppressed: 0,
                },
            );
            Some(0)
        }
    }
}

/// Collects an event's fields as text (the identity of a line).
struct Key(String);

impl Visit for Key {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        use fmt::Write as _;
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
}

/// Wraps an event formatter with the rate limit.
pub struct Dedup<F> {
    inner: F,
    window: Duration,
    seen: Mutex<HashMap<String, Seen>>,
}

impl<F> Dedup<F> {
    /// `inner` formats the lines that are shown.
    pub fn new(inner: F, window: Duration) -> Dedup<F> {
        Dedup {
            inner,
            window,
            seen: Mutex::new(HashMap::new()),
        }
    }
}

impl<S, N, F> FormatEvent<S, N> for Dedup<F>
where
    F: FormatEvent<S, N>,
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        if *meta.level() > Level::WARN {
            return self.inner.format_event(ctx, writer, event);
        }
        let mut key = Key(format!("{} {}", meta.level(), meta.target()));
        event.record(&mut key);
        let decision = {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            decide(&mut seen, key.0, Instant::now(), self.window)
        };
        match decision {
            // Nothing written: the line is held back.
            None => Ok(()),
            Some(0) => self.inner.format_event(ctx, writer, event),
            Some(n) => {
                let mut line = String::new();
                self.inner
                    .format_event(ctx, Writer::new(&mut line), event)?;
                writeln!(
                    writer,
                    "{}",
                    with_count(line.trim_end_matches('\n'), n, self.window)
                )
            }
        }
    }
}

/// A shown line with how many identical ones were held back: a sentence after a text line, two
/// fields inside a JSON object (so that the line stays one valid object).
fn with_count(line: &str, held_back: u64, window: Duration) -> String {
    let secs = window.as_secs();
    match line.strip_suffix('}') {
        Some(open) if line.starts_with('{') => format!(
            "{open},\"identical_not_shown\":{held_back},\"identical_window_seconds\":{secs}}}"
        ),
        _ => format!("{line} ({held_back} identical in the last {secs}s not shown)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_keeps_a_json_line_one_object() {
        let w = Duration::from_secs(30);
        assert_eq!(
            with_count("WARN kpng: gone", 3, w),
            "WARN kpng: gone (3 identical in the last 30s not shown)"
        );
        let json = with_count(r#"{"level":"WARN","message":"gone"}"#, 3, w);
        let parsed: serde_json::Value = serde_json::from_str(&json).expect("one JSON object");
        assert_eq!(parsed["identical_not_shown"], 3);
        assert_eq!(parsed["message"], "gone");
    }

    #[test]
    fn a_burst_of_distinct_lines_is_shown_and_keeps_the_map_bounded() {
        let mut seen = HashMap::new();
        let now = Instant::now();
        let w = Duration::from_secs(30);
        for i in 0..5 * MAX_KEYS {
            assert_eq!(decide(&mut seen, format!("line {i}"), now, w), Some(0));
            assert!(seen.len() <= MAX_KEYS + 1, "{} keys", seen.len());
        }
    }

    #[test]
    fn identical_lines_within_the_window_are_counted_then_reported() {
        let mut seen = HashMap::new();
        let t0 = Instant::now();
        let w = Duration::from_secs(30);
        let s = |secs| t0 + Duration::from_secs(secs);
        let steps: &[(&str, u64, Option<u64>)] = &[
            ("a", 0, Some(0)),
            ("a", 1, None),
            ("b", 2, Some(0)),
            ("a", 10, None),
            ("a", 29, None),
            ("a", 31, Some(3)),
            ("a", 32, None),
            ("a", 70, Some(1)),
            ("a", 101, Some(0)),
        ];
        for (key, at, want) in steps {
            assert_eq!(
                decide(&mut seen, (*key).into(), s(*at), w),
                *want,
                "{key} at {at}s"
            );
        }
    }
}
