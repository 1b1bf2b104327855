//! How the brain's refusals (of Watches and of connections) reach its log: the first of each
//! kind from a peer address in full (at most [`kpng_model::log_limit::FULL_LINES_PER_INTERVAL`]
//! a minute), then at most one summary line a minute per peer and one for the others.
//!
//! Why: a node stuck in a retry loop (a wrong node name, a certificate for another node, a
//! peer over its share) or a hostile client is refused many times a second, and a warning
//! each would flood the brain's log. The rule and its bounded table are
//! [`kpng_model::log_limit`]'s; this module words the lines.

use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use kpng_model::log_limit::{PeerLogLimiter, Summary, Verdict};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::metrics::RefusedLabel;
use tracing::warn;

/// How long a peer's refusals are summarised over.
pub(crate) const INTERVAL: Duration = Duration::from_secs(60);

/// Peers tracked at once: the refusals of more are summarised together.
const MAX_PEERS: usize = 4096;

/// Why something was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A Watch for a name that is not a Node's.
    NotANodeName,
    /// A Watch for a node the client certificate does not name.
    OtherNode,
    /// A Watch for a node the brain's cluster does not have (`crate::hub::Hub::refusal`).
    UnknownNode,
    /// A Watch over [`super::MAX_WATCHES`].
    TooManyWatches,
    /// A Watch over [`super::MAX_WATCHES_PER_PEER`] from one peer.
    TooManyWatchesFromPeer,
    /// A connection over `--max-connections`.
    TooManyConnections,
    /// A connection whose TLS handshake failed (counted in
    /// `kpng_api_tls_handshake_failures_total`, not in `kpng_api_refused_total`).
    TlsHandshake,
}

impl Refusal {
    /// The refusals `kpng_api_refused_total` counts, each a `reason`.
    pub(crate) const COUNTED: [Refusal; 6] = [
        Refusal::NotANodeName,
        Refusal::OtherNode,
        Refusal::UnknownNode,
        Refusal::TooManyWatches,
        Refusal::TooManyWatchesFromPeer,
        Refusal::TooManyConnections,
    ];

    /// Whether a connection, not a Watch, was refused.
    fn is_connection(self) -> bool {
        matches!(self, Refusal::TooManyConnections | Refusal::TlsHandshake)
    }

    /// The reason, as `kpng_api_refused_total`'s label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Refusal::NotANodeName => "not_a_node_name",
            Refusal::OtherNode => "other_node",
            Refusal::UnknownNode => "unknown_node",
            Refusal::TooManyWatches => "too_many_watches",
            Refusal::TooManyWatchesFromPeer => "too_many_watches_from_peer",
            Refusal::TooManyConnections => "too_many_connections",
            Refusal::TlsHandshake => "tls_handshake",
        }
    }

    /// The reason, in a summary.
    fn words(self) -> &'static str {
        match self {
            Refusal::NotANodeName => "not a Node's name",
            Refusal::OtherNode => "a node the client certificate does not name",
            Refusal::UnknownNode => "a node this brain's cluster does not have",
            Refusal::TooManyWatches => "too many Watch streams",
            Refusal::TooManyWatchesFromPeer => "too many Watch streams from this client",
            Refusal::TooManyConnections => "too many connections (--max-connections)",
            Refusal::TlsHandshake => "failed TLS handshakes",
        }
    }
}

/// The peer a refusal is counted for: its IP address, or `None` over a Unix socket.
pub(crate) type Peer = Option<IpAddr>;

/// The server's refusal log, shared by its connections and streams.
#[derive(Debug)]
pub(crate) struct RefusalLog {
    limiter: Mutex<PeerLogLimiter<Peer, Refusal>>,
    /// Every refusal, by reason (`kpng_api_refused_total`).
    counted: Family<RefusedLabel, Counter>,
}

impl Default for RefusalLog {
    fn default() -> RefusalLog {
        RefusalLog::counting_in(Family::default())
    }
}

impl RefusalLog {
    /// A log that also counts every refusal in `counted` (the brain's registered family).
    pub(crate) fn counting_in(counted: Family<RefusedLabel, Counter>) -> RefusalLog {
        RefusalLog {
            limiter: Mutex::new(PeerLogLimiter::new(INTERVAL, MAX_PEERS)),
            counted,
        }
    }

    /// Records a refusal from `peer`: whether to log it in full (the caller does, with its
    /// details); the others are told in [`RefusalLog::flush`]'s summaries.
    pub(crate) fn record(&self, peer: Peer, refusal: Refusal) -> bool {
        if refusal != Refusal::TlsHandshake {
            self.counted
                .get_or_create(&RefusedLabel {
                    reason: refusal.label().to_string(),
                })
                .inc();
        }
        let peer = peer.map(|ip| ip.to_canonical());
        self.limiter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(&peer, refusal, Instant::now())
            == Verdict::Log
    }

    /// Logs the summaries due.
    pub(crate) fn flush(&self) {
        let due = self
            .limiter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .flush(Instant::now());
        for summary in &due {
            warn!("{}", summary_line(summary));
        }
    }

    /// Logs the summaries due, forever (a quarter of [`INTERVAL`] apart): run beside the
    /// server.
    pub(crate) async fn flush_every_interval(&self) {
        let mut tick = tokio::time::interval(INTERVAL / 4);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.flush();
        }
    }
}

/// `refused 512 more Watches from 10.0.0.7 in the last 60 s: 512 too many Watch streams from
/// this client`.
fn summary_line(summary: &Summary<Peer, Refusal>) -> String {
    let connections = summary.held.iter().any(|(r, _)| r.is_connection());
    let watches = summary.held.iter().any(|(r, _)| !r.is_connection());
    let what = match (watches, connections) {
        (true, true) => "Watches and connections",
        (false, true) => "connections",
        _ => "Watches",
    };
    let from = match summary.peer {
        Some(Some(ip)) => ip.to_string(),
        Some(None) => "Unix-socket clients".to_string(),
        None if summary.peers_at_least => format!("{} or more other peers", summary.peers),
        None => format!("{} other peers", summary.peers),
    };
    let why = summary
        .held
        .iter()
        .map(|(r, n)| format!("{n} {}", r.words()))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "refused {} more {what} from {from} in the last {} s: {why}",
        summary.total(),
        summary.over.as_secs()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_says_how_many_more_were_refused_from_whom_and_why() {
        let ip: IpAddr = "10.0.0.7".parse().expect("an address");
        let minute = Duration::from_secs(60);
        let cases = [
            (
                Some(Some(ip)),
                vec![(Refusal::TooManyWatchesFromPeer, 512)],
                "refused 512 more Watches from 10.0.0.7 in the last 60 s: 512 too many Watch \
                 streams from this client",
            ),
            (
                Some(Some(ip)),
                vec![(Refusal::NotANodeName, 3), (Refusal::TooManyConnections, 2)],
                "refused 5 more Watches and connections from 10.0.0.7 in the last 60 s: 3 not \
                 a Node's name, 2 too many connections (--max-connections)",
            ),
            (
                Some(None),
                vec![(Refusal::TooManyConnections, 9)],
                "refused 9 more connections from Unix-socket clients in the last 60 s: 9 too \
                 many connections (--max-connections)",
            ),
            (
                None,
                vec![(Refusal::OtherNode, 1)],
                "refused 1 more Watches from 1 other peers in the last 60 s: 1 a node the client \
                 certificate does not name",
            ),
        ];
        for (peer, held, line) in cases {
            let summary = Summary {
                peers: usize::from(peer.is_none()),
                peers_at_least: false,
                peer,
                held,
                over: minute,
            };
            assert_eq!(summary_line(&summary), line);
        }
    }

    #[test]
    fn a_refusal_loop_logs_one_line_per_kind_then_counts() {
        let log = RefusalLog::default();
        let node: IpAddr = "10.0.0.7".parse().expect("an address");
        let mapped: IpAddr = "::ffff:10.0.0.7".parse().expect("an address");
        let other: IpAddr = "10.0.0.8".parse().expect("an address");
        let shown = (0..500)
            .filter(|_| log.record(Some(node), Refusal::NotANodeName))
            .count();
        assert_eq!(shown, 1, "one line for a loop of 500");
        assert!(
            !log.record(Some(mapped), Refusal::NotANodeName),
            "the same peer, IPv4-mapped"
        );
        assert!(
            log.record(Some(node), Refusal::TooManyConnections),
            "a new kind"
        );
        assert!(
            log.record(Some(other), Refusal::NotANodeName),
            "another peer"
        );
        // The metric counts every refusal, logged or not.
        let counted = |reason: &str| {
            log.counted
                .get_or_create(&RefusedLabel {
                    reason: reason.into(),
                })
                .get()
        };
        assert_eq!(counted("not_a_node_name"), 502);
        assert_eq!(counted("too_many_connections"), 1);
    }
}
