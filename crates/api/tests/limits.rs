//! The brain's connection limits: connections over `max_connections` are closed at once,
//! connections that never open a Watch stream are closed after the idle timeout, and a node
//! that watches is served throughout.

mod common;

use std::time::{Duration, Instant};

use common::{Watcher, manifest, service};
use kpng_api::server::ConnLimits;
use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;

/// How long from `start` (taken before `conn` was opened, so before the server's idle timer
/// for it started) until the server closes `conn` (EOF or reset), at most `within`.
async fn closed_after(start: Instant, mut conn: UnixStream, within: Duration) -> Duration {
    let mut buf = [0u8; 64];
    loop {
        match tokio::time::timeout(within, conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return start.elapsed(),
            // The server never writes first on a plaintext HTTP/2 connection… but tolerate it.
            Ok(Ok(_)) => continue,
            Err(_) => panic!("the connection is still open after {within:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_and_idle_ones_are_closed_and_a_node_is_still_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("brain.sock");
    let (hub, mut state) = common::hub_with_one_service();
    const CAP: usize = 4;
    let idle = Duration::from_millis(1500);
    let limits = ConnLimits {
        max_connections: CAP,
        idle_timeout: idle,
    };
    common::serve(hub.clone(), &socket, limits).await;

    // A node watches: one connection.
    let mut node = Watcher::connect(&socket).await;
    assert_eq!(node.next().await, ["default/a"]);

    // Ten connections that never ask anything: three fit under the cap, seven do not.
    // Timed from before the first connect: a connection's idle timer starts when the server
    // accepts it, which may be well before the test gets to read it on a loaded machine.
    let start = Instant::now();
    let mut raw = Vec::new();
    for _ in 0..10 {
        raw.push(UnixStream::connect(&socket).await.expect("connect"));
    }
    let closes: Vec<_> = raw
        .into_iter()
        .map(|c| tokio::spawn(closed_after(start, c, Duration::from_secs(10))))
        .collect();

    // The node is served while the cap is full.
    state.push_str(&service("b", "10.96.0.2"));
    hub.apply(manifest(&state));
    assert_eq!(node.next().await, ["default/b"]);

    let mut times = Vec::new();
    for close in closes {
        times.push(close.await.expect("join"));
    }
    let refused = times
        .iter()
        .filter(|t| **t < Duration::from_millis(500))
        .count();
    let idled = times
        .iter()
        .filter(|t| **t >= idle - Duration::from_millis(100))
        .count();
    assert_eq!(
        (refused, idled),
        (10 - (CAP - 1), CAP - 1),
        "times to close: {times:?}"
    );

    // The node's connection outlived the idle timeout (it has a stream) and is still served;
    // a new node fits again now that the idle connections are gone.
    state.push_str(&service("c", "10.96.0.3"));
    hub.apply(manifest(&state));
    assert_eq!(node.next().await, ["default/c"]);
    let mut second = Watcher::connect(&socket).await;
    let mut all = second.next().await;
    all.sort();
    assert_eq!(all, ["default/a", "default/b", "default/c"]);
}
