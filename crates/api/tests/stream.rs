//! One Watch stream through every step the server takes: the replay (encoded by a task of its
//! own), small change sets (encoded where the stream is polled), a large one, a change set
//! that coalesces while the client is busy, a change that wakes a waiting stream, and the two
//! ways a stream ends (the client closes its requests, or goes away).

mod common;

use std::time::Duration;

use common::{Watcher, manifest, service, watchers};

/// Appends `n` Services `bulkNN` to the manifest `state` (more than are encoded inline);
/// returns their paths.
fn add_bulk(state: &mut String, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let name = format!("bulk{i:02}");
            state.push_str(&service(&name, &format!("10.96.1.{i}")));
            format!("default/{name}")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stream_takes_every_kind_of_change_set_in_order_and_ends_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("brain.sock");
    let (hub, mut state) = common::hub_with_one_service();
    common::serve(hub.clone(), &socket, Default::default()).await;

    let mut node = Watcher::connect(&socket).await;
    assert_eq!(node.next().await, ["default/a"], "the replay");

    state.push_str(&service("b", "10.96.0.2"));
    hub.apply(manifest(&state));
    assert_eq!(node.next().await, ["default/b"], "one Service");

    // More Services in one change set than are encoded inline.
    let bulk = add_bulk(&mut state, 40);
    hub.apply(manifest(&state));
    assert_eq!(node.next().await, bulk, "40 Services at once");

    // Three changes before the client asks again: one change set.
    for (name, ip) in [("c", "10.96.0.3"), ("d", "10.96.0.4"), ("e", "10.96.0.5")] {
        state.push_str(&service(name, ip));
        hub.apply(manifest(&state));
    }
    assert_eq!(
        node.next().await,
        ["default/c", "default/d", "default/e"],
        "coalesced"
    );

    // The client asks first; the change comes later and wakes the waiting stream.
    state.push_str(&service("f", "10.96.0.6"));
    let later = manifest(&state);
    let (got, ()) = tokio::join!(node.next(), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        hub.apply(later);
    });
    assert_eq!(got, ["default/f"], "after waiting");
    assert_eq!(hub.metrics().change_sets.get(), 5);
    // The replay's ops: Reset, the node, Service a.
    assert_eq!(hub.metrics().ops.get(), 3 + 1 + 40 + 3 + 1);
    // What `kpng status` on the brain says of the node: five taken, nothing waiting.
    let status = &hub.watchers()[0];
    assert_eq!((status.node.as_str(), status.change_sets_sent), ("n1", 5));
    assert_eq!(status.pending_service_changes, 0);
    assert!(status.last_sent_at.is_some());

    // A second node that goes away while its stream waits: unregistered.
    let mut gone = Watcher::connect(&socket).await;
    assert_eq!(gone.next().await.len(), 46, "the second node's replay");
    watchers(&hub, 2).await;
    drop(gone);
    watchers(&hub, 1).await;

    // The first closes its requests: the stream ends with status OK, and it is unregistered.
    drop(node.requests);
    let end = tokio::time::timeout(Duration::from_secs(10), node.stream.message())
        .await
        .expect("the stream ends within 10 s");
    assert!(matches!(end, Ok(None)), "ended with {end:?}");
    watchers(&hub, 0).await;
}

/// A kpng client asks once (`WatchReq.continuous`): every change set then comes as it
/// happens, small or large, with no request per change set; closing its side of the stream
/// does not end it (it has nothing more to ask); going away unregisters it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuous_stream_takes_every_change_set_after_one_request() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("brain.sock");
    let (hub, mut state) = common::hub_with_one_service();
    common::serve(hub.clone(), &socket, Default::default()).await;

    let mut node = Watcher::connect_continuous(&socket).await;
    assert!(node.server_continuous, "the server says it honours it");
    assert_eq!(node.next().await, ["default/a"], "the replay");

    state.push_str(&service("b", "10.96.0.2"));
    hub.apply(manifest(&state));
    assert_eq!(node.next().await, ["default/b"], "one Service, unasked");

    let bulk = add_bulk(&mut state, 40);
    hub.apply(manifest(&state));
    assert_eq!(
        node.next().await,
        bulk,
        "40 Services at once (its own task)"
    );

    // Two changes while the client reads nothing: both arrive, in one change set or two.
    for (name, ip) in [("c", "10.96.0.3"), ("d", "10.96.0.4")] {
        state.push_str(&service(name, ip));
        hub.apply(manifest(&state));
    }
    let mut got = node.next().await;
    if got.len() < 2 {
        got.extend(node.next().await);
    }
    assert_eq!(got, ["default/c", "default/d"]);

    // A rename asked on the open stream is seen with nothing else pending: the node's views
    // are re-evaluated (no Service set again) and it now watches as n2.
    node.requests
        .send(kpng_api::proto::WatchReq {
            node_name: "n2".into(),
            continuous: true,
            accept_zstd: false,
        })
        .await
        .expect("request");
    assert_eq!(
        node.next().await,
        Vec::<String>::new(),
        "the rename's change set"
    );
    assert_eq!(hub.watchers()[0].node, "n2");

    // The client closes its side: the changes keep coming.
    let common::Watcher {
        requests,
        mut stream,
        ..
    } = node;
    drop(requests);
    state.push_str(&service("e", "10.96.0.5"));
    hub.apply(manifest(&state));
    assert_eq!(
        common::next_change_set(&mut stream).await,
        ["default/e"],
        "after the client closed its side"
    );
    let status = &hub.watchers()[0];
    assert_eq!(status.node, "n2");
    assert!(status.change_sets_sent >= 6, "{}", status.change_sets_sent);

    drop(stream);
    watchers(&hub, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brain_that_shuts_down_ends_every_stream_saying_so_and_its_server_ends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("brain.sock");
    let (hub, _state) = common::hub_with_one_service();
    let addr: kpng_api::addr::ApiAddr = format!("unix://{}", socket.display())
        .parse()
        .expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = kpng_api::server::serve(
        hub.clone(),
        &addr,
        &Default::default(),
        Default::default(),
        async move {
            let _ = stopped.await;
        },
    )
    .await
    .expect("listen");
    let server = tokio::spawn(server);
    let mut waiting = Watcher::connect(&socket).await;
    assert_eq!(waiting.next().await, ["default/a"], "the replay");
    let mut continuous = Watcher::connect_continuous(&socket).await;
    assert_eq!(continuous.next().await, ["default/a"], "the replay");

    stop.send(()).expect("the server is running");
    // Both streams, one waiting for its client's next request and one for the next change,
    // end with UNAVAILABLE and the words nodes look for. The request may find the waiting
    // stream already ended by the shutdown (its request channel closed, a `SendError`, seen
    // once in CI): either way the stream must end with the status checked below.
    let _ = waiting
        .requests
        .send(kpng_api::proto::WatchReq {
            node_name: "n1".into(),
            continuous: false,
            accept_zstd: false,
        })
        .await;
    for node in [&mut waiting, &mut continuous] {
        let status = tokio::time::timeout(Duration::from_secs(10), node.stream.message())
            .await
            .expect("the stream ends within 10 s")
            .expect_err("a status, not an op or a clean end");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert!(
            status.message().contains(kpng_api::server::SHUTTING_DOWN),
            "{status:?}"
        );
    }
    // No stream is left open, so the server's graceful shutdown completes.
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the server ends within 10 s")
        .expect("the server's task")
        .expect("the server");
}
