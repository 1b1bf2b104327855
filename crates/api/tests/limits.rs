//! The brain's connection limits: connections over `max_connections` are closed at once,
//! connections that never open a Watch stream are closed after the idle timeout, and a node
//! that watches is served throughout.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use kpng_api::hub::Hub;
use kpng_api::metrics::ApiMetrics;
use kpng_api::proto;
use kpng_api::server::ConnLimits;
use kpng_model::{ClusterConfig, ClusterModel, Event, Kind};
use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;

fn manifest(text: &str) -> Event {
    Event::Replace {
        kinds: vec![Kind::Service, Kind::EndpointSlice, Kind::Node],
        objects: kpng_source_file::parse_manifests(text)
            .expect("manifest")
            .objects,
    }
}

/// A Watch client on `socket`: sends one request per change set and returns the Service
/// paths set in each.
struct Watcher {
    requests: tokio::sync::mpsc::Sender<proto::WatchReq>,
    stream: tonic::Streaming<proto::OpItem>,
}

impl Watcher {
    async fn connect(socket: &std::path::Path) -> Watcher {
        let path = socket.to_path_buf();
        let channel =
            tonic::transport::Endpoint::from_static("http://localhost")
                .connect_with_connector(tower::service_fn(move |_| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?))
                    }
                }))
                .await
                .expect("connect");
        let (requests, rx) = tokio::sync::mpsc::channel(4);
        let mut client = proto::sets_client::SetsClient::new(channel);
        let stream = client
            .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .expect("watch")
            .into_inner();
        Watcher { requests, stream }
    }

    /// The next change set: the paths of the Services it sets.
    async fn next(&mut self) -> Vec<String> {
        self.requests
            .send(proto::WatchReq {
                node_name: "n1".into(),
            })
            .await
            .expect("request");
        let mut services = Vec::new();
        loop {
            let item = tokio::time::timeout(Duration::from_secs(10), self.stream.message())
                .await
                .expect("a change set within 10 s")
                .expect("stream")
                .expect("an op");
            match item.op.expect("op") {
                proto::op_item::Op::Sync(_) => return services,
                proto::op_item::Op::Set(v) => {
                    let r = v.r#ref.expect("ref");
                    if r.set == proto::Set::ServicesSet as i32 {
                        services.push(r.path);
                    }
                }
                _ => {}
            }
        }
    }
}

fn service(name: &str, ip: &str) -> String {
    format!(
        "---\nkind: Service\nmetadata: {{namespace: default, name: {name}}}\n\
         spec: {{clusterIP: {ip}, ports: [{{name: http, port: 80}}]}}\n"
    )
}

/// How long until the server closes `conn` (EOF or reset), at most `within`.
async fn closed_after(mut conn: UnixStream, within: Duration) -> Duration {
    let start = Instant::now();
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
    let hub = Arc::new(Hub::new(
        ClusterModel::new(ClusterConfig::default()),
        ApiMetrics::default(),
    ));
    let mut state = format!(
        "kind: Node\nmetadata: {{name: n1}}\n{}",
        service("a", "10.96.0.1")
    );
    hub.apply(manifest(&state));
    let addr: kpng_api::addr::ApiAddr = format!("unix://{}", socket.display())
        .parse()
        .expect("addr");
    const CAP: usize = 4;
    let idle = Duration::from_millis(1500);
    let limits = ConnLimits {
        max_connections: CAP,
        idle_timeout: idle,
    };
    let server = kpng_api::server::serve(
        hub.clone(),
        &addr,
        &Default::default(),
        limits,
        std::future::pending(),
    )
    .await
    .expect("listen");
    tokio::spawn(server);

    // A node watches: one connection.
    let mut node = Watcher::connect(&socket).await;
    assert_eq!(node.next().await, ["default/a"]);

    // Ten connections that never ask anything: three fit under the cap, seven do not.
    let mut raw = Vec::new();
    for _ in 0..10 {
        raw.push(UnixStream::connect(&socket).await.expect("connect"));
    }
    let closes: Vec<_> = raw
        .into_iter()
        .map(|c| tokio::spawn(closed_after(c, Duration::from_secs(10))))
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
