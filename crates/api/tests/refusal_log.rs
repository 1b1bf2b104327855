//! A node stuck in a refusal loop costs the brain's log one line, not one per attempt: the
//! first refusal of each kind from a peer address is logged in full, the rest are summarised
//! once a minute (the summary's wording and timing: the unit tests of `refusal_log` and
//! `kpng_model::log_limit`).

mod common;

use std::time::Duration;

use common::{Lines, channel_to, watch_as};

/// Asks for a Watch of `node` from loopback address `local` and waits for its refusal.
async fn refused_watch(brain: std::net::SocketAddr, local: [u8; 4], node: &str) -> tonic::Code {
    let status = match watch_as(channel_to(brain, Some(local)).await, node).await {
        Err(status) => status,
        Ok((_requests, mut stream)) => {
            tokio::time::timeout(Duration::from_secs(10), stream.message())
                .await
                .expect("an answer")
                .expect_err("refused")
        }
    };
    status.code()
}

#[tokio::test]
async fn a_refusal_loop_logs_one_line_per_peer_and_kind() {
    let lines = Lines::default();
    let _log = tracing::subscriber::set_default(lines.subscriber(tracing::Level::INFO));
    let (hub, _) = common::hub_with_one_service();
    let brain = common::serve_tcp(hub).await;

    let attempts = 40;
    for _ in 0..attempts {
        for peer in [[127, 0, 0, 1], [127, 0, 0, 2]] {
            let code = refused_watch(brain, peer, "Not_A_Node").await;
            assert_eq!(code, tonic::Code::InvalidArgument);
        }
    }
    let full = lines.matching("refusing a Watch");
    assert_eq!(
        full.len(),
        2,
        "{} attempts from each of two addresses: one full line each\n{}",
        attempts,
        full.join("\n")
    );
    for line in &full {
        assert!(line.contains("summarised once a minute"), "{line}");
    }
}

/// A watcher's lines name its address plainly (`peer=127.0.0.1:40000`, not
/// `peer=Some("127.0.0.1:40000")` as until 2026-12-07), and when it leaves, how long it
/// watched and why.
#[tokio::test]
async fn a_watcher_is_logged_by_its_address_and_its_leaving_says_how_long_and_why() {
    let lines = Lines::default();
    let _log = tracing::subscriber::set_default(lines.subscriber(tracing::Level::INFO));
    let (hub, _) = common::hub_with_one_service();
    let brain = common::serve_tcp(hub).await;
    let (requests, mut stream) = watch_as(channel_to(brain, None).await, "n1")
        .await
        .expect("watching");
    stream.message().await.expect("the state").expect("an item");
    // The node says it is done: it closes its requests and goes.
    drop(requests);
    drop(stream);
    let gone = async {
        loop {
            let gone = lines.matching("API client gone");
            if !gone.is_empty() {
                return gone;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let gone = tokio::time::timeout(Duration::from_secs(10), gone)
        .await
        .expect("the client's leaving logged");
    let watching = lines.matching("API client watching");
    assert_eq!(watching.len(), 1, "{watching:?}");
    for line in [&watching[0], &gone[0]] {
        assert!(
            line.contains(" peer=127.0.0.1:") && !line.contains("Some("),
            "{line}"
        );
    }
    assert!(
        gone[0].contains("connected_for=0s") && gone[0].contains("API client gone: "),
        "{}",
        gone[0]
    );
}
