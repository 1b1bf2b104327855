//! What the kpng holding the instance lock ([`crate::instance_lock`]) says about those who ask
//! for it: a second kpng refused its start, a `kpng cleanup` refused.
//!
//! Why: the refused side says so on its own standard error, which often goes nowhere an
//! operator of the running proxy looks (a crash-looping second unit, someone's shell). An
//! incident reconstructed from the running kpng's logs could not tell that a second proxy had
//! been started beside it. Each asker sends why it asks (`start <backend>`, `cleanup`), and the
//! holder logs one WARN line per asker, with its pid from the socket's credentials, at most
//! one line per [`WINDOW`]: a second instance restarted in a loop cannot flood the log; the
//! next line counts those not logged.

use std::time::{Duration, Instant};

/// At most one line per this long; the others are counted into the next one.
pub const WINDOW: Duration = Duration::from_secs(60);

/// Why someone asks who holds the lock: sent as the first line of the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asking {
    /// A kpng starting `to-local <backend>`, refused since this one runs.
    Start(String),
    /// `kpng cleanup`, refused since this one runs (a dry run only says so).
    Cleanup {
        /// `--dry-run`: nothing was refused, cleanup only reported.
        dry_run: bool,
    },
}

impl Asking {
    /// The line an asker sends.
    pub fn line(&self) -> String {
        match self {
            Asking::Start(backend) => format!("start {backend}\n"),
            Asking::Cleanup { dry_run: false } => "cleanup\n".to_string(),
            Asking::Cleanup { dry_run: true } => "cleanup-dry-run\n".to_string(),
        }
    }

    /// Reads an asker's line; `None` for an older kpng (which sends nothing) or garbage.
    pub fn parse(line: &str) -> Option<Asking> {
        let line = line.trim();
        match line.split_once(' ') {
            Some(("start", backend))
                if !backend.is_empty()
                    && backend.len() <= 32
                    && backend
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-') =>
            {
                Some(Asking::Start(backend.to_string()))
            }
            None if line == "cleanup" => Some(Asking::Cleanup { dry_run: false }),
            None if line == "cleanup-dry-run" => Some(Asking::Cleanup { dry_run: true }),
            _ => None,
        }
    }

    /// The holder's line about asker `pid` (`None`: unknown), this kpng running `backend`.
    pub fn said(&self, pid: Option<u32>, backend: &str) -> String {
        let pid = pid.map_or_else(String::new, |p| format!(" (pid {p})"));
        match self {
            Asking::Start(theirs) if theirs == backend => {
                format!("a second kpng{pid} tried to start here and was refused")
            }
            Asking::Start(theirs) => format!(
                "a second kpng{pid} tried to start `to-local {theirs}` here and was refused \
                 (this kpng runs `to-local {backend}`)"
            ),
            Asking::Cleanup { dry_run: false } => {
                format!("`kpng cleanup`{pid} found this kpng running and was refused")
            }
            Asking::Cleanup { dry_run: true } => {
                format!("`kpng cleanup --dry-run`{pid} found this kpng running")
            }
        }
    }
}

/// The rate limit of the holder's lines.
#[derive(Debug, Default)]
pub struct Limit {
    /// When the last line was logged.
    last: Option<Instant>,
    /// Askers not logged since.
    quiet: u32,
}

impl Limit {
    /// Whether to log an asker seen at `now`: `Some(n)` with the askers not logged since the
    /// last line, `None` to count it quietly.
    pub fn admit(&mut self, now: Instant) -> Option<u32> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < WINDOW => {
                self.quiet = self.quiet.saturating_add(1);
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.quiet))
            }
        }
    }
}

/// The holder's WARN line (`quiet`: askers not logged since the last one).
pub fn line(said: &str, quiet: u32) -> String {
    match quiet {
        0 => said.to_string(),
        n => format!("{said} ({n} more asked since the last such line, not logged)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_askers_line_is_read_back_and_said() {
        let cases = [
            (
                Asking::Start("nft".into()),
                "a second kpng (pid 42) tried to start here and was refused",
            ),
            (
                Asking::Start("ebpf".into()),
                "a second kpng (pid 42) tried to start `to-local ebpf` here and was refused \
                 (this kpng runs `to-local nft`)",
            ),
            (
                Asking::Cleanup { dry_run: false },
                "`kpng cleanup` (pid 42) found this kpng running and was refused",
            ),
            (
                Asking::Cleanup { dry_run: true },
                "`kpng cleanup --dry-run` (pid 42) found this kpng running",
            ),
        ];
        for (asking, want) in cases {
            assert_eq!(Asking::parse(&asking.line()), Some(asking.clone()));
            assert_eq!(asking.said(Some(42), "nft"), want);
        }
        for garbage in [
            "",
            "start",
            "start ",
            "start a b",
            "start \u{1b}[31m",
            "who",
        ] {
            assert_eq!(Asking::parse(garbage), None, "{garbage:?}");
        }
    }

    #[test]
    fn a_crash_looping_second_kpng_is_one_line_a_minute() {
        let mut limit = Limit::default();
        let t0 = Instant::now();
        let s = Duration::from_secs;
        // (seconds after t0, what is logged)
        let cases = [
            (0, Some(0)),
            (1, None),
            (2, None),
            (59, None),
            (60, Some(3)),
            (61, None),
            (200, Some(1)),
            (201, None),
        ];
        for (at, want) in cases {
            assert_eq!(limit.admit(t0 + s(at)), want, "at {at} s");
        }
        assert_eq!(
            line(
                "a second kpng (pid 7) tried to start here and was refused",
                3
            ),
            "a second kpng (pid 7) tried to start here and was refused (3 more asked since \
             the last such line, not logged)"
        );
    }
}
