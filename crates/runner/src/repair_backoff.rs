//! How long a repair of someone else's change waits, when such changes keep coming.
//!
//! A repair is a full sync (at 30k Services about 1 s of CPU, and a read of the table or one
//! large kernel transaction, by backend). One change by someone else (a firewall reload, `nft flush ruleset`) is
//! repaired at once: that is the 1 s restore target of `docs/reliability.md`. But a
//! misconfigured node undoes kpng's rules in a loop (a firewall manager reloading every few
//! seconds, a cron job flushing the ruleset, a second kpng or kube-proxy fighting for the same
//! table), and repairing each at once costs a full sync every time, for ever, with nothing but
//! log lines to show for it. So: more than [`FREE_REPAIRS`] repairs within [`WINDOW`] start a
//! backoff (the next repair waits [`FIRST_DELAY`], each one after it twice as long, up to the
//! cap: `--sync-period`, at most 30 s, the longest kpng already leaves a change it did not hear
//! of unrepaired, since the periodic sync is what finds those); no change by someone else for
//! [`quiet`] ends it. Time is passed in, so the policy is tested without a clock.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// Repairs within [`WINDOW`] that are made at once: `systemctl restart nftables` (two
/// flushes 30–70 ms apart) or a firewall reload now and then stays well under it.
pub const FREE_REPAIRS: usize = 5;
/// The window [`FREE_REPAIRS`] counts in.
pub const WINDOW: Duration = Duration::from_secs(60);
/// The first delay once backing off; each further repair doubles it.
pub const FIRST_DELAY: Duration = Duration::from_secs(1);
/// The longest delay whatever `--sync-period`.
pub const MAX_DELAY: Duration = Duration::from_secs(30);

/// The longest a repair waits with this `sync_period` (`--sync-period`, at most
/// [`MAX_DELAY`], at least [`FIRST_DELAY`]).
pub fn cap(sync_period: Duration) -> Duration {
    sync_period.clamp(FIRST_DELAY, MAX_DELAY)
}

/// How long without a change by someone else ends a backoff capped at `cap`: twice the cap
/// (at least [`WINDOW`]), since a loop that undoes every repair is heard of once per repair.
pub fn quiet(cap: Duration) -> Duration {
    (cap * 2).max(WINDOW)
}

/// What [`RepairBackoff::changed`] decided for one change by someone else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// How long the repair waits (beyond the usual debounce); zero: at once.
    pub delay: Duration,
    /// This change started a backoff: warn, once.
    pub started: bool,
}

/// The backoff of repairs, fed with each change by someone else that asks for one.
#[derive(Debug, Clone)]
pub struct RepairBackoff {
    /// Repairs within [`WINDOW`] made at once.
    free: usize,
    cap: Duration,
    /// When the repairs of the last [`WINDOW`] were asked for, oldest first.
    recent: VecDeque<Instant>,
    /// The last change by someone else.
    last: Option<Instant>,
    /// The delay of the last repair while backing off; zero when not backing off.
    delay: Duration,
    /// Changes by someone else since the backoff started (the warning's count included).
    during: u64,
    /// When the backoff started.
    since: Option<Instant>,
}

impl RepairBackoff {
    /// A backoff whose longest delay is [`cap`]`(sync_period)`, and that starts after
    /// `free` repairs within [`WINDOW`] ([`FREE_REPAIRS`] but in tests that repeat a fault on
    /// purpose).
    pub fn new(sync_period: Duration, free: usize) -> RepairBackoff {
        RepairBackoff {
            free,
            cap: cap(sync_period),
            recent: VecDeque::new(),
            last: None,
            delay: Duration::ZERO,
            during: 0,
            since: None,
        }
    }

    /// The longest a repair waits.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// Someone else changed the data plane at `now` and a repair is to be scheduled: how long
    /// it waits.
    pub fn changed(&mut self, now: Instant) -> Decision {
        self.end_if_quiet(now);
        self.last = Some(now);
        while self
            .recent
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= WINDOW)
        {
            self.recent.pop_front();
        }
        self.recent.push_back(now);
        if self.since.is_none() && self.recent.len() <= self.free {
            return Decision {
                delay: Duration::ZERO,
                started: false,
            };
        }
        let started = self.since.is_none();
        if started {
            self.since = Some(now);
            // The changes that made it start count too.
            self.during = self.recent.len() as u64;
        } else {
            self.during += 1;
        }
        self.delay = if self.delay.is_zero() {
            FIRST_DELAY.min(self.cap)
        } else {
            (self.delay * 2).min(self.cap)
        };
        Decision {
            delay: self.delay,
            started,
        }
    }

    /// Ends the backoff when nothing changed for [`quiet`]; returns, when it ended now, how
    /// many changes by someone else it saw (for the line that says so).
    pub fn end_if_quiet(&mut self, now: Instant) -> Option<u64> {
        self.since?;
        let last = self.last?;
        if now.saturating_duration_since(last) < quiet(self.cap) {
            return None;
        }
        let during = self.during;
        self.since = None;
        self.delay = Duration::ZERO;
        self.during = 0;
        self.recent.clear();
        Some(during)
    }

    /// The delay of the last repair while backing off, as of `now` (zero: repairs are made
    /// at once).
    pub fn current_delay(&self, now: Instant) -> Duration {
        match (self.since, self.last) {
            (Some(_), Some(last)) if now.saturating_duration_since(last) < quiet(self.cap) => {
                self.delay
            }
            _ => Duration::ZERO,
        }
    }

    /// Whether repairs are backing off now.
    pub fn active(&self, now: Instant) -> bool {
        !self.current_delay(now).is_zero()
    }

    /// Changes by someone else since the backoff started, and how long ago it started.
    pub fn during(&self, now: Instant) -> Option<(u64, Duration)> {
        let since = self.since.filter(|_| self.active(now))?;
        Some((self.during, now.saturating_duration_since(since)))
    }

    /// Changes by someone else within the last [`WINDOW`] (for the warning).
    pub fn in_window(&self) -> usize {
        self.recent.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds changes at the given offsets (ms from a start) and returns each decision.
    fn run(sync_period: Duration, at_ms: &[u64]) -> Vec<Decision> {
        let start = Instant::now();
        let mut b = RepairBackoff::new(sync_period, FREE_REPAIRS);
        at_ms
            .iter()
            .map(|ms| b.changed(start + Duration::from_millis(*ms)))
            .collect()
    }

    fn delays(d: &[Decision]) -> Vec<u64> {
        d.iter().map(|d| d.delay.as_millis() as u64).collect()
    }

    #[test]
    fn delays_by_pattern_of_changes() {
        let secs = Duration::from_secs;
        let every = |n: u64, ms: u64| (0..n).map(|i| i * ms).collect::<Vec<_>>();
        for (what, sync_period, at, want) in [
            ("a single change: at once", secs(30), vec![0], vec![0]),
            (
                "systemctl restart nftables: two flushes, both at once",
                secs(30),
                vec![0, 50],
                vec![0, 0],
            ),
            (
                "five in a minute: all at once",
                secs(30),
                every(5, 10_000),
                vec![0; 5],
            ),
            (
                "a flush every 100 ms: five at once, then 1 s doubling",
                secs(30),
                every(10, 100),
                vec![0, 0, 0, 0, 0, 1000, 2000, 4000, 8000, 16000],
            ),
            (
                "capped at 30 s",
                secs(30),
                every(12, 100),
                vec![0, 0, 0, 0, 0, 1000, 2000, 4000, 8000, 16000, 30000, 30000],
            ),
            (
                "capped at the sync period when shorter",
                secs(3),
                every(9, 100),
                vec![0, 0, 0, 0, 0, 1000, 2000, 3000, 3000],
            ),
            (
                "a sync period under a second caps at the first delay",
                Duration::from_millis(200),
                every(7, 100),
                vec![0, 0, 0, 0, 0, 1000, 1000],
            ),
            (
                "one a minute for ever: never delayed",
                secs(30),
                every(10, 61_000),
                vec![0; 10],
            ),
        ] {
            assert_eq!(delays(&run(sync_period, &at)), want, "{what}");
        }
    }

    #[test]
    fn the_cap_holds_and_the_warning_is_once() {
        let start = Instant::now();
        let mut b = RepairBackoff::new(Duration::from_secs(30), FREE_REPAIRS);
        let mut t = start;
        let mut started = 0;
        let mut last = Duration::ZERO;
        for _ in 0..20 {
            let d = b.changed(t);
            started += usize::from(d.started);
            last = d.delay;
            // A loop that undoes every repair a second after it.
            t += d.delay + Duration::from_secs(1);
        }
        assert_eq!(last, MAX_DELAY);
        assert_eq!(started, 1, "the backoff starts once");
        assert!(b.active(t));
        assert_eq!(b.during(t).map(|(n, _)| n), Some(20));
    }

    #[test]
    fn quiet_ends_the_backoff_and_the_next_change_is_repaired_at_once() {
        let start = Instant::now();
        let mut b = RepairBackoff::new(Duration::from_secs(30), FREE_REPAIRS);
        for i in 0..7 {
            b.changed(start + Duration::from_millis(i * 100));
        }
        let last = start + Duration::from_millis(600);
        assert_eq!(b.current_delay(last), Duration::from_secs(2));
        // Not quiet long enough yet.
        let almost = last + quiet(b.cap()) - Duration::from_millis(1);
        assert_eq!(b.end_if_quiet(almost), None);
        assert!(b.active(almost));
        let after = last + quiet(b.cap());
        assert!(!b.active(after), "shown as over once quiet");
        assert_eq!(b.current_delay(after), Duration::ZERO);
        assert_eq!(b.end_if_quiet(after), Some(7));
        assert_eq!(b.end_if_quiet(after), None, "said once");
        let d = b.changed(after + Duration::from_secs(1));
        assert_eq!(
            d,
            Decision {
                delay: Duration::ZERO,
                started: false
            }
        );
    }

    #[test]
    fn a_change_after_a_quiet_spell_resets_without_being_asked() {
        let start = Instant::now();
        let mut b = RepairBackoff::new(Duration::from_secs(30), FREE_REPAIRS);
        for i in 0..6 {
            b.changed(start + Duration::from_millis(i * 100));
        }
        let later = start + Duration::from_secs(200);
        assert_eq!(b.changed(later).delay, Duration::ZERO);
        assert_eq!(b.in_window(), 1);
    }
}
