//! How often refusals reach the log: the first of each kind from a peer at once, then at most
//! one summary per peer and interval, and in all at most a fixed number of full lines per
//! interval, past which peers are only counted and summarised together.
//!
//! Why: a client stuck in a retry loop (a node whose name is wrong, one over its share of
//! connections) or a hostile one is refused hundreds of times a second, and a line per refusal
//! buries everything else in the log and costs disk on every node or brain it hits. What an
//! operator needs is the first refusal of each kind, with its details, and then how many more
//! there were. A flood from many addresses (a thousand, each refused once) would still write a
//! full line per address, so full lines share a budget per interval
//! ([`FULL_LINES_PER_INTERVAL`]), and so do per-peer summaries: the rest are counted in one
//! "N more from M other addresses" summary. The tables are bounded ([`PeerLogLimiter::new`]'s
//! `max_peers`), so a flood from many addresses cannot grow them either.
//!
//! This type decides and counts only; the caller logs, and passes the time in (`now`), so the
//! rule is tested without waiting.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Full lines (first refusals) one limiter lets through per interval, and per-peer summaries
/// per flush: a flood from many addresses writes at most this many lines of each, plus one
/// summary of the others.
pub const FULL_LINES_PER_INTERVAL: usize = 10;

/// What to do with one refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The first of its kind from this peer in the interval, within the interval's budget of
    /// full lines: log it in full.
    Log,
    /// Counted, and told in a summary.
    Hold,
}

/// The refusals held back from one peer, or from the others, in one interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary<P, R> {
    /// The peer; `None` for the refusals of the peers counted together (past the budget of
    /// full lines, the table's room, or the budget of summaries).
    pub peer: Option<P>,
    /// How many peers the summary counts: 1 for a peer's own.
    pub peers: usize,
    /// Whether more peers than `peers` were counted (too many to tell apart).
    pub peers_at_least: bool,
    /// How many refusals of each kind were held back, in the order first seen.
    pub held: Vec<(R, u64)>,
    /// How long the interval lasted.
    pub over: Duration,
}

impl<P, R> Summary<P, R> {
    /// How many refusals were held back in all.
    pub fn total(&self) -> u64 {
        self.held.iter().map(|(_, n)| n).sum()
    }
}

/// One peer's interval.
#[derive(Debug)]
struct Entry<R> {
    since: Instant,
    /// Kinds already logged in full (a summary tells about the rest).
    logged: Vec<R>,
    held: Vec<(R, u64)>,
}

/// The refusals of the peers counted together, and which peers (at most `max_peers` told
/// apart).
#[derive(Debug)]
struct Others<P, R> {
    since: Instant,
    held: Vec<(R, u64)>,
    peers: HashSet<P>,
    peers_at_least: bool,
}

/// Counts `n` held-back refusals of kind `reason` into `held`.
fn hold<R: PartialEq>(held: &mut Vec<(R, u64)>, reason: R, n: u64) {
    match held.iter_mut().find(|(r, _)| *r == reason) {
        Some((_, count)) => *count += n,
        None => held.push((reason, n)),
    }
}

/// The first refusal of each (peer, kind) is logged, within a budget of full lines per
/// interval; the others are counted and summarised once per `interval` per peer
/// ([`PeerLogLimiter::flush`]), and past the budgets together. A peer quiet for a whole
/// interval is forgotten, so its next refusal is logged in full again.
#[derive(Debug)]
pub struct PeerLogLimiter<P, R> {
    interval: Duration,
    max_peers: usize,
    lines_per_interval: usize,
    peers: HashMap<P, Entry<R>>,
    /// When the budget's interval started, and how many full lines it let through.
    budget_since: Option<Instant>,
    lines_used: usize,
    /// Refusals of the peers counted together, held for one summary.
    others: Option<Others<P, R>>,
}

impl<P: Hash + Eq + Clone, R: Clone + PartialEq> PeerLogLimiter<P, R> {
    /// At most one summary per peer and `interval`, at most [`FULL_LINES_PER_INTERVAL`] full
    /// lines and as many per-peer summaries per interval, and at most `max_peers` peers
    /// tracked: the refusals of others are summarised together.
    pub fn new(interval: Duration, max_peers: usize) -> PeerLogLimiter<P, R> {
        PeerLogLimiter {
            interval,
            max_peers,
            lines_per_interval: FULL_LINES_PER_INTERVAL,
            peers: HashMap::new(),
            budget_since: None,
            lines_used: 0,
            others: None,
        }
    }

    /// With a budget of `lines` full lines (and per-peer summaries) per interval instead of
    /// [`FULL_LINES_PER_INTERVAL`].
    pub fn with_line_budget(mut self, lines: usize) -> PeerLogLimiter<P, R> {
        self.lines_per_interval = lines;
        self
    }

    /// How many peers are tracked apart now.
    pub fn tracked(&self) -> usize {
        self.peers.len()
    }

    /// Takes one full line from the budget, if any is left at `now`.
    fn take_line(&mut self, now: Instant) -> bool {
        let since = self.budget_since.get_or_insert(now);
        if now.saturating_duration_since(*since) >= self.interval {
            *since = now;
            self.lines_used = 0;
        }
        if self.lines_used >= self.lines_per_interval {
            return false;
        }
        self.lines_used += 1;
        true
    }

    /// Records a refusal of kind `reason` from `peer` at `now`: whether to log it in full.
    pub fn record(&mut self, peer: &P, reason: R, now: Instant) -> Verdict {
        if self.peers.contains_key(peer) {
            let logged = self
                .peers
                .get(peer)
                .is_some_and(|e| e.logged.contains(&reason));
            let verdict = if !logged && self.take_line(now) {
                Verdict::Log
            } else {
                Verdict::Hold
            };
            if let Some(entry) = self.peers.get_mut(peer) {
                match verdict {
                    Verdict::Log => entry.logged.push(reason),
                    Verdict::Hold => hold(&mut entry.held, reason, 1),
                }
            }
            return verdict;
        }
        if self.peers.len() >= self.max_peers {
            self.forget_quiet(now);
        }
        if self.peers.len() < self.max_peers && self.take_line(now) {
            self.peers.insert(
                peer.clone(),
                Entry {
                    since: now,
                    logged: vec![reason],
                    held: Vec::new(),
                },
            );
            return Verdict::Log;
        }
        self.hold_for_others(Some(peer), reason, 1, now);
        Verdict::Hold
    }

    /// Counts `n` refusals of `peer` (if told) among the others'.
    fn hold_for_others(&mut self, peer: Option<&P>, reason: R, n: u64, since: Instant) {
        let max_peers = self.max_peers;
        let others = self.others.get_or_insert_with(|| Others {
            since,
            held: Vec::new(),
            peers: HashSet::new(),
            peers_at_least: false,
        });
        others.since = others.since.min(since);
        hold(&mut others.held, reason, n);
        if let Some(peer) = peer
            && !others.peers.contains(peer)
        {
            if others.peers.len() < max_peers {
                others.peers.insert(peer.clone());
            } else {
                others.peers_at_least = true;
            }
        }
    }

    /// The summaries due at `now`: every peer whose interval has ended with refusals held back
    /// (its next interval starts), at most the budget of them, the most refused first; and the
    /// others together (the peers past the budget among them). A peer whose interval ended
    /// with nothing held back is forgotten. Call it at least once per interval.
    pub fn flush(&mut self, now: Instant) -> Vec<Summary<P, R>> {
        let interval = self.interval;
        let mut due = Vec::new();
        self.peers.retain(|peer, entry| {
            let over = now.saturating_duration_since(entry.since);
            if over < interval {
                return true;
            }
            if entry.held.is_empty() {
                return false;
            }
            due.push(Summary {
                peer: Some(peer.clone()),
                peers: 1,
                peers_at_least: false,
                held: std::mem::take(&mut entry.held),
                over,
            });
            entry.since = now;
            true
        });
        due.sort_by_key(|s| std::cmp::Reverse(s.total()));
        let past_budget = due.split_off(due.len().min(self.lines_per_interval));
        for summary in past_budget {
            let since = now.checked_sub(summary.over).unwrap_or(now);
            let peer = summary.peer.clone();
            for (reason, n) in summary.held {
                self.hold_for_others(peer.as_ref(), reason, n, since);
            }
        }
        if let Some(others) = self
            .others
            .take_if(|o| now.saturating_duration_since(o.since) >= interval)
        {
            due.push(Summary {
                peer: None,
                peers: others.peers.len(),
                peers_at_least: others.peers_at_least,
                over: now.saturating_duration_since(others.since),
                held: others.held,
            });
        }
        due
    }

    /// Drops the peers whose interval has ended with nothing held back (room for new ones).
    fn forget_quiet(&mut self, now: Instant) {
        let interval = self.interval;
        self.peers.retain(|_, entry| {
            now.saturating_duration_since(entry.since) < interval || !entry.held.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Why {
        Cap,
        Name,
    }

    const MINUTE: Duration = Duration::from_secs(60);

    /// One step: at `at` seconds, a refusal (`Some((peer, why))`, expecting `verdict`) or a
    /// flush (`None`, expecting `summaries`).
    type Step = (u64, Option<(u8, Why, Verdict)>, Vec<Held>);
    /// A summary: its peer, how many peers it counts (and whether at least), what it held back.
    type Held = (Option<u8>, usize, bool, Vec<(Why, u64)>);

    /// Runs `steps` on a limiter of `max_peers` and `lines` full lines per minute.
    fn run(max_peers: usize, lines: usize, steps: &[Step]) {
        let start = Instant::now();
        let mut limiter = PeerLogLimiter::<u8, Why>::new(MINUTE, max_peers).with_line_budget(lines);
        for (i, (at, refusal, summaries)) in steps.iter().enumerate() {
            let now = start + Duration::from_secs(*at);
            match refusal {
                Some((peer, why, verdict)) => {
                    assert_eq!(limiter.record(peer, *why, now), *verdict, "step {i}");
                }
                None => {
                    let mut got: Vec<Held> = limiter
                        .flush(now)
                        .into_iter()
                        .map(|s| (s.peer, s.peers, s.peers_at_least, s.held))
                        .collect();
                    got.sort_by_key(|(p, ..)| *p);
                    assert_eq!(&got, summaries, "step {i}");
                }
            }
            assert!(limiter.tracked() <= max_peers, "step {i}");
            let others = limiter.others.as_ref().map_or(0, |o| o.peers.len());
            assert!(others <= max_peers, "step {i}");
        }
    }

    use Verdict::{Hold, Log};
    use Why::{Cap, Name};

    #[test]
    fn the_first_refusal_of_each_kind_is_logged_and_the_rest_summarised_per_minute() {
        let cases: Vec<(&str, usize, Vec<Step>)> = vec![
            (
                "a retry loop: one line, then one summary a minute",
                8,
                vec![
                    (0, Some((1, Cap, Log)), vec![]),
                    (1, Some((1, Cap, Hold)), vec![]),
                    (2, Some((1, Cap, Hold)), vec![]),
                    (30, None, vec![]),
                    (59, Some((1, Cap, Hold)), vec![]),
                    (60, None, vec![(Some(1), 1, false, vec![(Cap, 3)])]),
                    // The next minute goes on summarising, without a full line.
                    (61, Some((1, Cap, Hold)), vec![]),
                    (120, None, vec![(Some(1), 1, false, vec![(Cap, 1)])]),
                    // A quiet minute: forgotten, so the next refusal is logged in full.
                    (180, None, vec![]),
                    (181, Some((1, Cap, Log)), vec![]),
                ],
            ),
            (
                "a new kind from the same peer is logged once too",
                8,
                vec![
                    (0, Some((1, Cap, Log)), vec![]),
                    (1, Some((1, Name, Log)), vec![]),
                    (2, Some((1, Name, Hold)), vec![]),
                    (3, Some((1, Cap, Hold)), vec![]),
                    (4, Some((1, Name, Hold)), vec![]),
                    (
                        60,
                        None,
                        vec![(Some(1), 1, false, vec![(Name, 2), (Cap, 1)])],
                    ),
                ],
            ),
            (
                "peers are counted apart",
                8,
                vec![
                    (0, Some((1, Cap, Log)), vec![]),
                    (0, Some((2, Cap, Log)), vec![]),
                    (1, Some((2, Cap, Hold)), vec![]),
                    (60, None, vec![(Some(2), 1, false, vec![(Cap, 1)])]),
                ],
            ),
            (
                "a full table summarises the others together",
                2,
                vec![
                    (0, Some((1, Cap, Log)), vec![]),
                    (0, Some((2, Cap, Log)), vec![]),
                    (1, Some((3, Cap, Hold)), vec![]),
                    (2, Some((4, Name, Hold)), vec![]),
                    (3, Some((4, Name, Hold)), vec![]),
                    (61, None, vec![(None, 2, false, vec![(Cap, 1), (Name, 2)])]),
                    // Peers 1 and 2 were quiet and are forgotten: room again.
                    (62, Some((3, Cap, Log)), vec![]),
                ],
            ),
            (
                "a full table makes room by forgetting quiet peers",
                1,
                vec![
                    (0, Some((1, Cap, Log)), vec![]),
                    (60, Some((2, Cap, Log)), vec![]),
                    // Peer 2 is not quiet yet: peer 1 waits for room, counted with the others.
                    (61, Some((1, Cap, Hold)), vec![]),
                    (121, None, vec![(None, 1, false, vec![(Cap, 1)])]),
                ],
            ),
        ];
        for (name, max_peers, steps) in cases {
            eprintln!("case: {name}");
            run(max_peers, FULL_LINES_PER_INTERVAL, &steps);
        }
    }

    #[test]
    fn full_lines_and_summaries_share_a_budget_per_interval() {
        // (name, max_peers, full lines per minute, steps)
        let cases: Vec<(&str, usize, usize, Vec<Step>)> = vec![
            (
                "a flood from many addresses: the budget's lines, then one summary of the rest",
                8,
                3,
                vec![
                    (0, Some((1, Cap, Log)), vec![]),
                    (0, Some((2, Cap, Log)), vec![]),
                    (0, Some((3, Cap, Log)), vec![]),
                    (0, Some((4, Cap, Hold)), vec![]),
                    (1, Some((5, Cap, Hold)), vec![]),
                    (2, Some((4, Cap, Hold)), vec![]),
                    (60, None, vec![(None, 2, false, vec![(Cap, 3)])]),
                    // A new interval, a new budget.
                    (61, Some((6, Cap, Log)), vec![]),
                ],
            ),
            (
                "a new kind past the budget is summarised",
                8,
                1,
                vec![
                    (0, Some((1, Cap, Log)), vec![]),
                    (1, Some((1, Name, Hold)), vec![]),
                    (60, None, vec![(Some(1), 1, false, vec![(Name, 1)])]),
                ],
            ),
            (
                "per-peer summaries past the budget are counted with the others",
                8,
                2,
                vec![
                    (0, Some((1, Cap, Log)), vec![]),
                    (0, Some((2, Cap, Log)), vec![]),
                    (60, Some((3, Cap, Log)), vec![]),
                    (61, Some((1, Cap, Hold)), vec![]),
                    (61, Some((1, Cap, Hold)), vec![]),
                    (61, Some((1, Cap, Hold)), vec![]),
                    (61, Some((2, Cap, Hold)), vec![]),
                    (61, Some((3, Cap, Hold)), vec![]),
                    (61, Some((3, Cap, Hold)), vec![]),
                    (
                        120,
                        None,
                        vec![
                            (None, 1, false, vec![(Cap, 1)]),
                            (Some(1), 1, false, vec![(Cap, 3)]),
                            (Some(3), 1, false, vec![(Cap, 2)]),
                        ],
                    ),
                ],
            ),
            (
                "the others' addresses are told apart up to the table's size",
                2,
                1,
                vec![
                    (0, Some((1, Cap, Log)), vec![]),
                    (0, Some((2, Cap, Hold)), vec![]),
                    (0, Some((3, Cap, Hold)), vec![]),
                    (0, Some((4, Cap, Hold)), vec![]),
                    (0, Some((2, Cap, Hold)), vec![]),
                    (60, None, vec![(None, 2, true, vec![(Cap, 4)])]),
                ],
            ),
        ];
        for (name, max_peers, lines, steps) in cases {
            eprintln!("case: {name}");
            run(max_peers, lines, &steps);
        }
    }

    #[test]
    fn a_thousand_addresses_write_the_budget_and_one_summary() {
        let start = Instant::now();
        let mut limiter = PeerLogLimiter::<u16, Why>::new(MINUTE, 1024);
        let logged = (0..1300u16)
            .filter(|peer| limiter.record(peer, Cap, start) == Log)
            .count();
        assert_eq!(logged, FULL_LINES_PER_INTERVAL);
        let summaries = limiter.flush(start + MINUTE);
        assert_eq!(summaries.len(), 1);
        assert_eq!(summaries[0].peer, None);
        assert_eq!(summaries[0].total(), 1290);
        assert_eq!(
            (summaries[0].peers, summaries[0].peers_at_least),
            (1024, true)
        );
    }

    #[test]
    fn a_summary_tells_its_total_and_interval() {
        let start = Instant::now();
        let mut limiter = PeerLogLimiter::<u8, Why>::new(MINUTE, 4);
        limiter.record(&7, Cap, start);
        for _ in 0..512 {
            limiter.record(&7, Cap, start);
        }
        let summaries = limiter.flush(start + Duration::from_secs(75));
        assert_eq!(summaries.len(), 1);
        assert_eq!(summaries[0].total(), 512);
        assert_eq!(summaries[0].over, Duration::from_secs(75));
    }
}
