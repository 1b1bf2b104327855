//! Which Watch streams the brain serves: at most [`MAX_WATCHES`] in all and
//! [`MAX_WATCHES_PER_PEER`] per peer, each counted only once it has asked for a node.
//!
//! Why: a stream that takes a place before it asks for anything lets any client that can
//! connect (with mTLS too, since the certificate's node is checked against the first request)
//! hold every place with streams that never ask, and shut out every node. Counting a stream
//! from its first request, and per peer, means one peer can take only its own share.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Watch streams served at once: a brain serves a few thousand nodes; beyond this a client is
/// refused (`RESOURCE_EXHAUSTED`) instead of exhausting the brain.
pub const MAX_WATCHES: usize = 20_000;

/// Watch streams one peer may hold at once: with mTLS, per node name its certificate proves;
/// else per remote IP address (over a Unix socket, whose peers are local and share no
/// address, only the per-connection limit applies).
///
/// A node opens one stream, and for a while two when it reconnects before the brain notices
/// the old connection is gone; 64 leaves room for a few dozen nodes behind one address (NAT,
/// several kpngs on one test host) while a single client needs more than 300 addresses to
/// take all of [`MAX_WATCHES`].
pub const MAX_WATCHES_PER_PEER: usize = 64;

/// A Watch stream whose first `WatchReq` has not come this long after it opened is closed
/// (`DEADLINE_EXCEEDED`).
///
/// Why: a node sends its first request with the stream (kpng's client and KPNG's alike), so a
/// stream that says nothing is not a node; kept open, it would hold one of its connection's
/// streams, and keep the connection from ever being closed as idle. A few seconds leave room
/// for a brain busy with thousands of nodes connecting at once.
pub const FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Who a per-peer count is for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum PeerKey {
    /// With mTLS: the node name the client certificate proves (checked before admission).
    Node(String),
    /// Without: the remote IP address (an IPv4-mapped IPv6 address as IPv4).
    Ip(IpAddr),
}

impl PeerKey {
    /// The key for an IP address, mapped IPv6 addresses as IPv4 so one peer has one key.
    pub(crate) fn ip(ip: IpAddr) -> PeerKey {
        PeerKey::Ip(ip.to_canonical())
    }
}

/// Why a stream was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    /// [`MAX_WATCHES`] streams are served.
    #[error("too many Watch streams")]
    Total,
    /// This peer holds [`MAX_WATCHES_PER_PEER`] streams.
    #[error("too many Watch streams from this client")]
    Peer,
}

type Counts = Arc<Mutex<HashMap<PeerKey, usize>>>;

/// The places: one shared by every connection of a server.
#[derive(Debug)]
pub(crate) struct Admission {
    total: Arc<Semaphore>,
    per_peer: usize,
    peers: Counts,
}

/// A stream's place, given back when dropped.
#[derive(Debug)]
pub(crate) struct Admitted {
    _permit: OwnedSemaphorePermit,
    _peer: Option<PeerGuard>,
}

/// One count of a peer's, taken back when dropped.
#[derive(Debug)]
struct PeerGuard {
    peers: Counts,
    key: PeerKey,
}

impl Drop for PeerGuard {
    fn drop(&mut self) {
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = peers.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                peers.remove(&self.key);
            }
        }
    }
}

impl Admission {
    /// `total` streams in all, `per_peer` for one peer.
    pub(crate) fn new(total: usize, per_peer: usize) -> Admission {
        Admission {
            total: Arc::new(Semaphore::new(total)),
            per_peer,
            peers: Arc::default(),
        }
    }

    /// A place for a stream of `peer` (`None`: counted in the total only).
    pub(crate) fn admit(&self, peer: Option<PeerKey>) -> Result<Admitted, Refused> {
        let guard = match peer {
            Some(key) => {
                let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
                let n = peers.entry(key.clone()).or_insert(0);
                if *n >= self.per_peer {
                    return Err(Refused::Peer);
                }
                *n += 1;
                Some(PeerGuard {
                    peers: self.peers.clone(),
                    key,
                })
            }
            None => None,
        };
        // On refusal the guard gives the peer's count back.
        let permit = self
            .total
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refused::Total)?;
        Ok(Admitted {
            _permit: permit,
            _peer: guard,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_gets_its_share_and_the_total_is_capped() {
        let admission = Admission::new(4, 2);
        let a = || Some(PeerKey::ip([10, 0, 0, 1].into()));
        let a1 = admission.admit(a()).expect("first");
        let _a2 = admission.admit(a()).expect("second");
        assert_eq!(admission.admit(a()).err(), Some(Refused::Peer));
        // The same peer as an IPv4-mapped IPv6 address.
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().expect("ip");
        assert_eq!(
            admission.admit(Some(PeerKey::ip(mapped))).err(),
            Some(Refused::Peer)
        );
        drop(a1);
        let _a3 = admission.admit(a()).expect("a place given back");
        let _b = admission
            .admit(Some(PeerKey::Node("n2".into())))
            .expect("b");
        let _c = admission.admit(None).expect("c");
        assert_eq!(
            admission.admit(Some(PeerKey::Node("n3".into()))).err(),
            Some(Refused::Total)
        );
        // Refused by the total, n3 holds nothing.
        assert!(
            !admission
                .peers
                .lock()
                .expect("lock")
                .contains_key(&PeerKey::Node("n3".into()))
        );
    }
}
