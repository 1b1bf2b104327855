#![allow(clippy::unwrap_used)]

use std::cell::Cell;

use super::*;

fn client(n: u16) -> SocketAddr {
    SocketAddr::from(([192, 168, 0, 10], 40000 + n))
}

fn ep(n: u8) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, n], 53))
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// A session value that records when it last saw a reply.
#[derive(Debug, Default)]
struct Replies(Cell<Option<Instant>>);

#[test]
fn a_client_keeps_its_session_and_endpoint() {
    let t0 = Instant::now();
    let mut t: SessionTable<u32> = SessionTable::new(secs(30));
    assert!(t.touch(client(1), t0).is_none());
    assert!(t.insert(client(1), ep(1), 7, t0).is_none());
    let s = t.touch(client(1), t0 + secs(1)).unwrap();
    assert_eq!((s.endpoint, s.value), (ep(1), 7));
    assert!(
        t.touch(client(2), t0).is_none(),
        "another port is another client"
    );
    assert_eq!(t.len(), 1);
}

#[test]
fn sessions_end_after_the_idle_timeout_in_both_directions() {
    let t0 = Instant::now();
    let mut t: SessionTable<Replies> = SessionTable::new(secs(30));
    // (client, seconds of its last datagram, seconds of its last reply)
    let sessions: [(u16, u64, Option<u64>); 4] = [
        (1, 0, None),     // silent since t0
        (2, 20, None),    // spoke recently
        (3, 0, Some(25)), // the endpoint replied recently
        (4, 0, Some(5)),  // replies stopped long ago
    ];
    for (c, spoke, replied) in sessions {
        t.insert(client(c), ep(1), Replies::default(), t0);
        t.touch(client(c), t0 + secs(spoke));
        if let Some(r) = replied {
            t.touch(client(c), t0 + secs(spoke))
                .unwrap()
                .value
                .0
                .set(Some(t0 + secs(r)));
        }
    }
    let ended = t.expire(t0 + secs(40), |r| r.0.get());
    assert_eq!(ended.len(), 2);
    assert_eq!(t.len(), 2);
    assert!(t.touch(client(2), t0 + secs(40)).is_some());
    assert!(t.touch(client(3), t0 + secs(40)).is_some());
    assert!(t.touch(client(1), t0 + secs(40)).is_none());
    assert!(t.touch(client(4), t0 + secs(40)).is_none());
}

#[test]
fn a_session_exactly_at_the_timeout_is_still_alive() {
    let t0 = Instant::now();
    let mut t: SessionTable<()> = SessionTable::new(secs(30));
    t.insert(client(1), ep(1), (), t0);
    assert!(t.expire(t0 + secs(30), |_| None).is_empty());
    assert_eq!(t.expire(t0 + secs(31), |_| None).len(), 1);
    assert!(t.is_empty());
}

#[test]
fn sessions_of_endpoints_that_left_end_and_others_stay() {
    let t0 = Instant::now();
    let mut t: SessionTable<u16> = SessionTable::new(secs(30));
    for c in 0..6u16 {
        t.insert(client(c), ep((c % 3) as u8 + 1), c, t0);
    }
    let gone = t.retain_endpoints(|e| e != ep(2));
    let mut values: Vec<u16> = gone.iter().map(|s| s.value).collect();
    values.sort();
    assert_eq!(values, [1, 4]);
    assert_eq!(t.len(), 4);
    assert!(
        t.touch(client(1), t0).is_none(),
        "its next datagram starts over"
    );
}

#[test]
fn a_new_session_replaces_the_old_one_of_that_client() {
    let t0 = Instant::now();
    let mut t: SessionTable<u8> = SessionTable::new(secs(30));
    t.insert(client(1), ep(1), 1, t0);
    let old = t.insert(client(1), ep(2), 2, t0).unwrap();
    assert_eq!((old.endpoint, old.value), (ep(1), 1));
    assert_eq!(t.touch(client(1), t0).unwrap().endpoint, ep(2));
}
