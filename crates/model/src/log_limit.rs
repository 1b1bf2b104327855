//! How often one peer's refusals reach the log: the first of each kind at once, then at most
//! one summary per peer and interval.
//!
//! Why: a client stuck in a retry loop (a node whose name is wrong, one over its share of
//! connections) or a hostile one is refused hundreds of times a second, and a line per refusal
//! buries everything else in the log and costs disk on every node or brain it hits. What an
//! operator needs is the first refusal of each kind, with its details, and then how many more
//! there were. The table is bounded ([`PeerLogLimiter::new`]'s `max_peers`), so a flood from
//! many addresses cannot grow it either.
//!
//! This type decides and counts only; the caller logs, and passes the time in (`now`), so the
//! rule is tested without waiting.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// What to do with one refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The first of its kind from this peer in the interval: log it in full.
    Log,
    /// Counted, and told in the peer's next summary.
    Hold,
}

/// The refusals held back from one peer in one interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary<P, R> {
    /// The peer; `None` for the refusals of peers the table had no room for.
    pub peer: Option<P>,
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

/// Counts held-back refusals into `held`.
fn hold<R: PartialEq>(held: &mut Vec<(R, u64)>, reason: R) {
    match held.iter_mut().find(|(r, _)| *r == reason) {
        Some((_, n)) => *n += 1,
        None => held.push((reason, 1)),
    }
}

/// The first refusal of each (peer, kind) is logged; the others are counted and summarised
/// once per `interval` per peer ([`PeerLogLimiter::flush`]). A peer quiet for a whole interval
/// is forgotten, so its next refusal is logged in full again.
#[derive(Debug)]
pub struct PeerLogLimiter<P, R> {
    interval: Duration,
    max_peers: usize,
    peers: HashMap<P, Entry<R>>,
    /// Refusals of peers that found the table full, held for one summary.
    overflow: Option<Entry<R>>,
}

impl<P: Hash + Eq + Clone, R: Copy + PartialEq> PeerLogLimiter<P, R> {
    /// At most one summary per peer and `interval`, and at most `max_peers` peers tracked: the
    /// refusals of others are summarised together.
    pub fn new(interval: Duration, max_peers: usize) -> PeerLogLimiter<P, R> {
        PeerLogLimiter {
            interval,
            max_peers,
            peers: HashMap::new(),
            overflow: None,
        }
    }

    /// How many peers are tracked now.
    pub fn tracked(&self) -> usize {
        self.peers.len()
    }

    /// Records a refusal of kind `reason` from `peer` at `now`: whether to log it in full.
    pub fn record(&mut self, peer: &P, reason: R, now: Instant) -> Verdict {
        if !self.peers.contains_key(peer) && self.peers.len() >= self.max_peers {
            self.forget_quiet(now);
        }
        if let Some(entry) = self.peers.get_mut(peer) {
            if entry.logged.contains(&reason) {
                hold(&mut entry.held, reason);
                return Verdict::Hold;
            }
            entry.logged.push(reason);
            return Verdict::Log;
        }
        if self.peers.len() >= self.max_peers {
            let entry = self.overflow.get_or_insert_with(|| Entry {
                since: now,
                logged: Vec::new(),
                held: Vec::new(),
            });
            hold(&mut entry.held, reason);
            return Verdict::Hold;
        }
        self.peers.insert(
            peer.clone(),
            Entry {
                since: now,
                logged: vec![reason],
                held: Vec::new(),
            },
        );
        Verdict::Log
    }

    /// The summaries due at `now`: every peer whose interval has ended with refusals held back
    /// (its next interval starts), and the peers the table had no room for. A peer whose
    /// interval ended with nothing held back is forgotten. Call it at least once per interval.
    pub fn flush(&mut self, now: Instant) -> Vec<Summary<P, R>> {
        let interval = self.interval;
        let mut out = Vec::new();
        self.peers.retain(|peer, entry| {
            let over = now.saturating_duration_since(entry.since);
            if over < interval {
                return true;
            }
            if entry.held.is_empty() {
                return false;
            }
            out.push(Summary {
                peer: Some(peer.clone()),
                held: std::mem::take(&mut entry.held),
                over,
            });
            entry.since = now;
            true
        });
        if let Some(entry) = self
            .overflow
            .take_if(|e| now.saturating_duration_since(e.since) >= interval)
        {
            out.push(Summary {
                peer: None,
                over: now.saturating_duration_since(entry.since),
                held: entry.held,
            });
        }
        out
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
    /// flush (`None`, expecting `summaries` as (peer, [(why, n)])).
    type Step = (u64, Option<(u8, Why, Verdict)>, Vec<Held>);
    /// A summary: its peer and what it held back.
    type Held = (Option<u8>, Vec<(Why, u64)>);

    fn run(max_peers: usize, steps: &[Step]) {
        let start = Instant::now();
        let mut limiter = PeerLogLimiter::<u8, Why>::new(MINUTE, max_peers);
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
                        .map(|s| (s.peer, s.held))
                        .collect();
                    got.sort_by_key(|(p, _)| *p);
                    assert_eq!(&got, summaries, "step {i}");
                }
            }
            assert!(limiter.tracked() <= max_peers, "step {i}");
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
                    (60, None, vec![(Some(1), vec![(Cap, 3)])]),
                    // The next minute goes on summarising, without a full line.
                    (61, Some((1, Cap, Hold)), vec![]),
                    (120, None, vec![(Some(1), vec![(Cap, 1)])]),
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
                    (60, None, vec![(Some(1), vec![(Name, 2), (Cap, 1)])]),
                ],
            ),
            (
                "peers are counted apart",
                8,
                vec![
                    (0, Some((1, Cap, Log)), vec![]),
                    (0, Some((2, Cap, Log)), vec![]),
                    (1, Some((2, Cap, Hold)), vec![]),
                    (60, None, vec![(Some(2), vec![(Cap, 1)])]),
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
                    (61, None, vec![(None, vec![(Cap, 1), (Name, 2)])]),
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
                    (121, None, vec![(None, vec![(Cap, 1)])]),
                ],
            ),
        ];
        for (name, max_peers, steps) in cases {
            eprintln!("case: {name}");
            run(max_peers, &steps);
        }
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
