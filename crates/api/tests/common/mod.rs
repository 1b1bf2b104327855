//! What the API tests share: a Watch client over a Unix socket, Watch streams over TCP, the
//! wait for the hub's watchers, a log capture and small manifests.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use kpng_api::hub::Hub;
use kpng_api::proto;
use kpng_api::server::ConnLimits;
use kpng_model::{Event, Kind};
use tokio::net::UnixStream;

mod lines;
// Not every test binary captures logs.
#[allow(unused_imports)]
pub use lines::Lines;

/// The objects of `text` (YAML manifests), as one listing of every kind.
pub fn manifest(text: &str) -> Event {
    Event::Replace {
        kinds: vec![Kind::Service, Kind::EndpointSlice, Kind::Node],
        objects: kpng_source_file::parse_manifests(text)
            .expect("manifest")
            .objects,
    }
}

/// A Watch client on `socket`: sends one request per change set (or, continuous, one in
/// all) and returns the Service paths set in each.
pub struct Watcher {
    pub requests: tokio::sync::mpsc::Sender<proto::WatchReq>,
    pub stream: tonic::Streaming<proto::OpItem>,
    /// Asked for every change set with its first request.
    pub continuous: bool,
    /// The server answered with `kpng-watch-continuous`.
    pub server_continuous: bool,
}

impl Watcher {
    /// A client that asks for each change set.
    pub async fn connect(socket: &std::path::Path) -> Watcher {
        Watcher::open(socket, false).await
    }

    /// A client that asks once (`WatchReq.continuous`).
    pub async fn connect_continuous(socket: &std::path::Path) -> Watcher {
        Watcher::open(socket, true).await
    }

    async fn open(socket: &std::path::Path, continuous: bool) -> Watcher {
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
        if continuous {
            requests
                .send(proto::WatchReq {
                    node_name: "n1".into(),
                    continuous: true,
                    accept_zstd: false,
                })
                .await
                .expect("request");
        }
        let mut client = proto::sets_client::SetsClient::new(channel);
        let response = client
            .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .expect("watch");
        let server_continuous = response
            .metadata()
            .get(kpng_api::server::CONTINUOUS_HEADER)
            .is_some();
        Watcher {
            requests,
            stream: response.into_inner(),
            continuous,
            server_continuous,
        }
    }

    /// The next change set: the paths of the Services it sets.
    pub async fn next(&mut self) -> Vec<String> {
        if !self.continuous {
            self.requests
                .send(proto::WatchReq {
                    node_name: "n1".into(),
                    continuous: false,
                    accept_zstd: false,
                })
                .await
                .expect("request");
        }
        next_change_set(&mut self.stream).await
    }
}

/// The next change set on `stream`: the paths of the Services it sets.
pub async fn next_change_set(stream: &mut tonic::Streaming<proto::OpItem>) -> Vec<String> {
    let mut services = Vec::new();
    loop {
        let item = tokio::time::timeout(Duration::from_secs(10), stream.message())
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

/// A ClusterIP Service `default/<name>` with one port.
pub fn service(name: &str, ip: &str) -> String {
    format!(
        "---\nkind: Service\nmetadata: {{namespace: default, name: {name}}}\n\
         spec: {{clusterIP: {ip}, ports: [{{name: http, port: 80}}]}}\n"
    )
}

/// Serves `hub` on the Unix socket `socket` (in a task) within `limits`.
pub async fn serve(hub: Arc<Hub>, socket: &std::path::Path, limits: ConnLimits) {
    let addr: kpng_api::addr::ApiAddr = format!("unix://{}", socket.display())
        .parse()
        .expect("addr");
    let server = kpng_api::server::serve(
        hub,
        &addr,
        &Default::default(),
        limits,
        std::future::pending(),
    )
    .await
    .expect("listen");
    tokio::spawn(server);
}

/// Serves `hub` on a free loopback TCP port (in a task) with the default limits; returns the
/// address to connect to. The port is bound and released first, and the server binds it
/// again at once; another test of this binary may take it meanwhile (a port-0 bind or a
/// connection's local port), and then another port is tried.
pub async fn serve_tcp(hub: Arc<Hub>) -> std::net::SocketAddr {
    let mut attempts = 0;
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let addr: kpng_api::addr::ApiAddr =
            format!("tcp://127.0.0.1:{port}").parse().expect("addr");
        match kpng_api::server::serve(
            hub.clone(),
            &addr,
            &Default::default(),
            Default::default(),
            std::future::pending(),
        )
        .await
        {
            Ok(server) => {
                tokio::spawn(server);
                return std::net::SocketAddr::from(([127, 0, 0, 1], port));
            }
            Err(e) if attempts < 10 => {
                attempts += 1;
                eprintln!("port {port} taken meanwhile ({e}); another");
            }
            Err(e) => panic!("listen: {e}"),
        }
    }
}

/// A brain holding nodes `n1` and `n2` and Service `default/a`: the manifest text, to append
/// to. (A brain whose input has Nodes serves only those.)
pub fn hub_with_one_service() -> (Arc<Hub>, String) {
    let hub = Arc::new(Hub::new(
        kpng_model::ClusterModel::new(kpng_model::ClusterConfig::default()),
        kpng_api::metrics::ApiMetrics::default(),
    ));
    let state = format!(
        "kind: Node\nmetadata: {{name: n1}}\n---\nkind: Node\nmetadata: {{name: n2}}\n{}",
        service("a", "10.96.0.1")
    );
    hub.apply(manifest(&state));
    (hub, state)
}

/// A connection to the brain at `brain` over TCP, from the loopback address `local` when
/// given (a test telling peers apart by address), else from the system's choice.
pub async fn channel_to(
    brain: std::net::SocketAddr,
    local: Option<[u8; 4]>,
) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{brain}"))
        .expect("uri")
        .local_address(local.map(Into::into))
        .connect()
        .await
        .expect("connect")
}

/// The request stream of a Watch of `node` that asks once (`continuous`): the sender keeps
/// the stream open while it lives.
pub async fn watch_request(
    node: &str,
) -> (
    tokio::sync::mpsc::Sender<proto::WatchReq>,
    tokio_stream::wrappers::ReceiverStream<proto::WatchReq>,
) {
    let (requests, rx) = tokio::sync::mpsc::channel(4);
    requests
        .send(proto::WatchReq {
            node_name: node.into(),
            continuous: true,
            accept_zstd: false,
        })
        .await
        .expect("request");
    (requests, tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// A Watch of `node` on `channel`, asked once ([`watch_request`]): its request sender (the
/// stream stays open while it lives) and its stream, or the brain's refusal.
pub async fn watch_as(
    channel: tonic::transport::Channel,
    node: &str,
) -> Result<
    (
        tokio::sync::mpsc::Sender<proto::WatchReq>,
        tonic::Streaming<proto::OpItem>,
    ),
    tonic::Status,
> {
    let (requests, rx) = watch_request(node).await;
    let stream = proto::sets_client::SetsClient::new(channel)
        .watch(rx)
        .await?
        .into_inner();
    Ok((requests, stream))
}

/// Waits until the hub has `n` watchers (20 s at most).
pub async fn watchers(hub: &Hub, n: usize) {
    let start = Instant::now();
    while hub.watchers().len() != n {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{} watchers after 20 s, not {n}",
            hub.watchers().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
