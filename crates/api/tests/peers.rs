//! Who is watching: the brain's status names each connection's address, so that two kpngs
//! claiming one node name (a copied DaemonSet, a wrong `--hostname-override`) can be told
//! apart, and it names such a node name as claimed twice.

mod common;

use common::{Watcher, channel_to, watch_as, watch_request, watchers};
use kpng_api::hub::DuplicateNode;
use kpng_api::proto;

/// A Watch of `node` over TCP to `brain`, asked once (kept open while returned).
async fn watch_tcp(
    brain: std::net::SocketAddr,
    node: &str,
) -> (
    tokio::sync::mpsc::Sender<proto::WatchReq>,
    tonic::Streaming<proto::OpItem>,
) {
    watch_as(channel_to(brain, None).await, node)
        .await
        .expect("watch")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tcp_connections_claiming_one_node_are_named_with_their_addresses() {
    let (hub, _) = common::hub_with_one_service();
    let brain = common::serve_tcp(hub.clone()).await;

    let first = watch_tcp(brain, "n1").await;
    let other = watch_tcp(brain, "n2").await;
    watchers(&hub, 2).await;
    assert!(hub.duplicate_nodes().is_empty(), "one kpng per node name");
    let status = hub.watchers();
    for w in &status {
        let peer: std::net::SocketAddr = w
            .peer
            .as_deref()
            .unwrap_or_else(|| panic!("{w:?} has its address"))
            .parse()
            .unwrap_or_else(|e| panic!("{w:?}: IP:port: {e}"));
        assert_eq!(peer.ip(), brain.ip(), "{w:?}");
        assert_ne!(
            peer.port(),
            brain.port(),
            "the client's port, not the brain's: {w:?}"
        );
    }
    assert_ne!(
        status[0].peer, status[1].peer,
        "two connections: {status:?}"
    );

    // A second kpng claims n1.
    let second = watch_tcp(brain, "n1").await;
    watchers(&hub, 3).await;
    let mut n1_peers: Vec<String> = hub
        .watchers()
        .into_iter()
        .filter(|w| w.node == "n1")
        .filter_map(|w| w.peer)
        .collect();
    n1_peers.sort();
    assert_eq!(n1_peers.len(), 2);
    assert_eq!(
        hub.duplicate_nodes(),
        [DuplicateNode {
            node: "n1".into(),
            peers: n1_peers,
        }]
    );
    // It goes: n1 is claimed once again.
    drop(second);
    watchers(&hub, 2).await;
    assert!(hub.duplicate_nodes().is_empty());
    drop((first, other));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_unix_socket_the_address_is_the_peers_process() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("brain.sock");
    let (hub, _) = common::hub_with_one_service();
    common::serve(hub.clone(), &socket, Default::default()).await;
    // Both watch n1 (the shared client's node).
    let _a = Watcher::connect_continuous(&socket).await;
    let _b = Watcher::connect_continuous(&socket).await;
    watchers(&hub, 2).await;
    let me = format!("unix, pid {}", std::process::id());
    for w in hub.watchers() {
        assert_eq!(w.peer.as_deref(), Some(me.as_str()), "{w:?}");
    }
    assert_eq!(
        hub.duplicate_nodes(),
        [DuplicateNode {
            node: "n1".into(),
            peers: vec![me.clone(), me],
        }]
    );
}

/// The version exchange: a client's `kpng-version` metadata is shown with its watcher (a
/// client without it, KPNG's, shows none), and the brain answers with its own in the response
/// headers, which KPNG's clients ignore.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_side_tells_the_other_its_version() {
    let (hub, _) = common::hub_with_one_service();
    let brain = common::serve_tcp(hub.clone()).await;
    let watch = |version: Option<&'static str>, node: &'static str| async move {
        let channel = channel_to(brain, None).await;
        let (requests, rx) = watch_request(node).await;
        let mut request = tonic::Request::new(rx);
        if let Some(v) = version {
            request.metadata_mut().insert(
                kpng_api::version::HEADER,
                tonic::metadata::MetadataValue::from_static(v),
            );
        }
        let response = proto::sets_client::SetsClient::new(channel)
            .watch(request)
            .await
            .expect("watch");
        let brains = response
            .metadata()
            .get(kpng_api::version::HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        (requests, response.into_inner(), brains)
    };
    let (_a, _sa, brains) = watch(Some("99.1.0"), "n1").await;
    assert_eq!(brains.as_deref(), Some(kpng_api::version::VERSION));
    let (_b, _sb, _) = watch(None, "n2").await;
    watchers(&hub, 2).await;
    let versions: Vec<(String, Option<String>)> = hub
        .watchers()
        .into_iter()
        .map(|w| (w.node, w.version))
        .collect();
    assert_eq!(
        versions,
        [
            ("n1".to_string(), Some("99.1.0".to_string())),
            ("n2".to_string(), None)
        ]
    );
}
