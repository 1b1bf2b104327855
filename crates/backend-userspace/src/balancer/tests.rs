#![allow(clippy::unwrap_used)]

use super::*;

fn ep(n: u8) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, n], 8080))
}

fn client(n: u8) -> IpAddr {
    IpAddr::from([192, 168, 0, n])
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn round_robin_cycles_through_the_list_in_order() {
    let t0 = Instant::now();
    let mut b = Balancer::new();
    b.update(vec![ep(1), ep(2), ep(3)], None);
    let picks: Vec<_> = (0..7).map(|_| b.pick(client(1), t0).unwrap()).collect();
    assert_eq!(picks, [ep(1), ep(2), ep(3), ep(1), ep(2), ep(3), ep(1)]);
    assert_eq!(b.affinity_entries(), 0, "no affinity, nothing remembered");
}

#[test]
fn an_empty_list_serves_nobody() {
    let mut b = Balancer::new();
    assert_eq!(b.pick(client(1), Instant::now()), None);
    b.update(vec![ep(1)], Some(secs(10)));
    b.update(vec![], Some(secs(10)));
    assert_eq!(b.pick(client(1), Instant::now()), None);
}

#[test]
fn an_update_keeps_the_position_and_new_picks_use_the_new_list() {
    let t0 = Instant::now();
    // Two picks were made from [1, 2, 3] (the next position is 2) before the update.
    let cases: [(&[SocketAddr], [SocketAddr; 3]); 3] = [
        // A shorter list wraps the position.
        (&[ep(1), ep(2)], [ep(1), ep(2), ep(1)]),
        // A longer list continues from the same position.
        (&[ep(1), ep(2), ep(3), ep(4)], [ep(3), ep(4), ep(1)]),
        // A replaced list: only new endpoints are picked.
        (&[ep(7), ep(8)], [ep(7), ep(8), ep(7)]),
    ];
    for (i, (list, want)) in cases.iter().enumerate() {
        let mut b = Balancer::new();
        b.update(vec![ep(1), ep(2), ep(3)], None);
        b.pick(client(1), t0);
        b.pick(client(1), t0);
        b.update(list.to_vec(), None);
        let got: Vec<_> = (0..3).map(|_| b.pick(client(1), t0).unwrap()).collect();
        assert_eq!(got, want, "case {i}");
    }
}

#[test]
fn affinity_keeps_a_client_on_its_endpoint_until_it_is_idle_for_the_timeout() {
    let t0 = Instant::now();
    let mut b = Balancer::new();
    b.update(vec![ep(1), ep(2), ep(3)], Some(secs(10)));
    // (client, seconds after t0, expected endpoint)
    let steps: [(u8, u64, SocketAddr); 8] = [
        (1, 0, ep(1)),  // new: round robin
        (2, 0, ep(2)),  // another client: next endpoint
        (1, 5, ep(1)),  // sticky
        (1, 15, ep(1)), // 10 s after its last use: still sticky (sliding)
        (2, 11, ep(3)), // 11 s idle: expired, balanced afresh
        (2, 12, ep(3)), // and sticky to the new one
        (3, 12, ep(1)), // a third client continues the round robin
        (1, 26, ep(2)), // 11 s idle: expired
    ];
    for (i, (c, at, want)) in steps.iter().enumerate() {
        assert_eq!(
            b.pick(client(*c), t0 + secs(*at)),
            Some(*want),
            "step {i}: client {c} at +{at}s"
        );
    }
}

#[test]
fn affinity_to_an_endpoint_that_left_is_forgotten() {
    let t0 = Instant::now();
    let mut b = Balancer::new();
    b.update(vec![ep(1), ep(2)], Some(secs(100)));
    assert_eq!(b.pick(client(1), t0), Some(ep(1)));
    assert_eq!(b.pick(client(2), t0), Some(ep(2)));
    b.update(vec![ep(2), ep(3)], Some(secs(100)));
    assert_eq!(b.affinity_entries(), 1, "only client 2's entry survives");
    assert_eq!(b.pick(client(2), t0), Some(ep(2)), "client 2 keeps ep 2");
    let again = b.pick(client(1), t0).unwrap();
    assert_ne!(again, ep(1), "client 1 moved off the endpoint that left");
    assert_eq!(
        b.pick(client(1), t0),
        Some(again),
        "and sticks to the new one"
    );
}

#[test]
fn a_failed_connection_resets_the_clients_affinity() {
    let t0 = Instant::now();
    let mut b = Balancer::new();
    b.update(vec![ep(1), ep(2)], Some(secs(100)));
    assert_eq!(b.pick(client(1), t0), Some(ep(1)));
    b.failed(client(1), ep(2)); // not its endpoint: no effect
    assert_eq!(b.pick(client(1), t0), Some(ep(1)));
    b.failed(client(1), ep(1));
    assert_eq!(b.pick(client(1), t0), Some(ep(2)), "balanced afresh");
    assert_eq!(b.pick(client(1), t0), Some(ep(2)), "sticky again");
}

#[test]
fn turning_affinity_off_forgets_every_client() {
    let t0 = Instant::now();
    let mut b = Balancer::new();
    b.update(vec![ep(1), ep(2)], Some(secs(100)));
    b.pick(client(1), t0);
    b.update(vec![ep(1), ep(2)], None);
    assert_eq!(b.affinity_entries(), 0);
    assert_eq!(b.pick(client(1), t0), Some(ep(2)), "plain round robin");
    assert_eq!(b.pick(client(1), t0), Some(ep(1)));
}

#[test]
fn expired_entries_are_swept_as_picks_go_on() {
    let t0 = Instant::now();
    let mut b = Balancer::new();
    b.update(vec![ep(1), ep(2)], Some(secs(10)));
    for c in 0..100u8 {
        b.pick(client(c), t0);
    }
    assert_eq!(b.affinity_entries(), 100);
    // Later, one client keeps connecting: the 99 idle entries go at a sweep.
    for _ in 0..(2 * MIN_SWEEP_INTERVAL.max(100)) {
        b.pick(client(0), t0 + secs(60));
    }
    assert_eq!(b.affinity_entries(), 1);
}
