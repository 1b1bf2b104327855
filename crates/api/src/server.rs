//! The gRPC server of a brain: `localv1.Sets/Watch` over TCP or a Unix socket, optionally TLS.
//!
//! Each Watch stream is its response body, polled by the connection: it reads the requests,
//! waits on the watcher's slot in the hub and encodes small change sets itself; a large one (a
//! replay) gets a task of its own with a bounded channel, so a client that reads slowly holds
//! back only its own stream, and its changes keep coalescing in its [`crate::hub::Pending`].

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use prost::bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Sleep;
use tokio_stream::Stream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::body::Body;
use tonic::transport::Server;
use tonic::transport::server::{Connected, Router};
use tonic::{Status, Streaming};
use tracing::{debug, info, warn};

mod admission;
mod authority;
mod conn;
mod delegate;
pub(crate) mod refusal_log;
mod request_wake;
mod tls;
#[cfg(unix)]
mod unix_socket;

pub use admission::{FIRST_REQUEST_TIMEOUT, MAX_WATCHES, MAX_WATCHES_PER_PEER};
use conn::limit;
pub use conn::{ConnInfo, ConnLimits, DEFAULT_MAX_CONNECTIONS, Limited, PeerIp};
pub use tls::TlsError;

use crate::addr::{ApiAddr, TlsFiles};
use crate::hub::{Hub, Pending, Registration};
use crate::proto;
use refusal_log::Refusal;

/// Streams one connection may open (a node needs one).
const STREAMS_PER_CONNECTION: u32 = 8;
/// HTTP/2 pings find peers that vanished without closing (a node powered off).
pub(crate) const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// Generous: a node busy decoding a replay (162k ops at 30k Services) may answer late, and
/// dropping it makes it reconnect and replay everything again.
pub(crate) const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address cannot be listened on.
    #[error("listening on {addr}: {source}")]
    Listen {
        /// The address.
        addr: ApiAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A TLS file is missing, unreadable or invalid (at start; later changes that do not load
    /// are logged, and the previous material stays served).
    #[error(transparent)]
    TlsFile(#[from] TlsError),
    /// The listening address is not an IP address and port.
    #[error(transparent)]
    Address(#[from] crate::addr::AddrError),
    /// An incomplete TLS configuration.
    #[error("{0}")]
    Tls(String),
    /// The gRPC transport failed.
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// The `Sets` service, answering `Watch` with frames encoded once and shared (see
/// [`crate::frames`]).
///
/// It is a plain HTTP/2 service rather than tonic's generated server, because the generated
/// server encodes every `OpItem` for every stream itself; this one writes the bytes each
/// change set already has. The requests are decoded by tonic's own decoder, and the stream
/// ends with the usual `grpc-status` trailers: to a client it is the same `Watch`.
#[derive(Debug, Clone)]
pub struct SetsService {
    hub: Arc<Hub>,
    /// The places of the Watch streams being served.
    admission: Arc<admission::Admission>,
    /// Where refusals are logged, a line per peer and kind then a summary a minute.
    refusals: Arc<refusal_log::RefusalLog>,
    /// Cancelled when the server shuts down: every Watch stream then ends with
    /// [`SHUTTING_DOWN`], so nodes reconnect at once and say why.
    stopping: CancellationToken,
    /// The node versions whose mismatch with this brain's was warned about (once each).
    versions: Arc<crate::version::Warned>,
    /// This brain's build, as its response headers name it (the hub's).
    version: http::HeaderValue,
}

/// The status a Watch stream ends with when the brain shuts down (a restart, a rollout):
/// nodes tell it from a failure by its code and these words.
pub const SHUTTING_DOWN: &str = "the kpng brain is shutting down";

impl SetsService {
    /// Serves this hub.
    pub fn new(hub: Arc<Hub>) -> SetsService {
        // A build identity is visible ASCII; anything else falls back to the bare version.
        let version = http::HeaderValue::from_str(hub.version())
            .unwrap_or_else(|_| http::HeaderValue::from_static(crate::version::VERSION));
        SetsService {
            version,
            hub,
            admission: Arc::new(admission::Admission::new(MAX_WATCHES, MAX_WATCHES_PER_PEER)),
            refusals: Arc::default(),
            stopping: CancellationToken::new(),
            versions: Arc::default(),
        }
    }

    /// Ends every Watch stream when `stopping` is cancelled.
    fn stopping_with(mut self, stopping: CancellationToken) -> SetsService {
        self.stopping = stopping;
        self
    }

    /// Logs refusals in `refusals` (shared with the server's connection cap).
    fn with_refusal_log(mut self, refusals: Arc<refusal_log::RefusalLog>) -> SetsService {
        self.refusals = refusals;
        self
    }

    fn handle(&self, request: http::Request<Body>) -> http::Response<Body> {
        if request.uri().path() != WATCH_PATH {
            return Status::unimplemented(no_method(request.uri().path())).into_http();
        }
        let from = connection(request.extensions());
        // The node's kpng version (`kpng-version` metadata; KPNG's clients send none).
        let version = request
            .headers()
            .get(crate::version::HEADER)
            .and_then(|v| crate::version::from_header(v.as_bytes()));
        // With mTLS, the node names the client's certificate allows.
        let allowed = peer_certs(request.extensions()).map(|certs| {
            certs
                .first()
                .map(|leaf| crate::identity::node_names(leaf))
                .unwrap_or_default()
        });
        let requests = Streaming::<proto::WatchReq>::new_request(
            tonic_prost::ProstDecoder::<proto::WatchReq>::default(),
            request.into_body(),
            None,
            Some(MAX_REQUEST_BYTES),
        );
        let mut response = http::Response::new(Body::new(WatchBody {
            hub: self.hub.clone(),
            admission: self.admission.clone(),
            refusals: self.refusals.clone(),
            requests,
            client: Client {
                peer: from.peer,
                ip: from.ip,
                conn: from.state,
                allowed,
                admitted: None,
                version,
            },
            versions: self.versions.clone(),
            first_request: Box::pin(tokio::time::sleep(FIRST_REQUEST_TIMEOUT)),
            registration: None,
            continuous: false,
            requests_ended: false,
            request_wake: request_wake::RequestWake::default(),
            bundles: false,
            step: Step::Request,
            queue: VecDeque::new(),
            stopping: Box::pin(self.stopping.clone().cancelled_owned()),
            watching_since: None,
            why: None,
        }));
        let headers = response.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/grpc"),
        );
        // Tells a kpng client that asking once is enough (`WatchReq.Continuous`).
        headers.insert(CONTINUOUS_HEADER, http::HeaderValue::from_static("1"));
        // This brain's version, for the node's status and its mismatch warning.
        headers.insert(crate::version::HEADER, self.version.clone());
        response
    }
}

/// The message of a call to a method this server does not have: a client of KPNG's older
/// `localnetv1` API (`/localnetv1.Endpoints/Watch`) learns which API is served instead of an
/// empty UNIMPLEMENTED.
fn no_method(path: &str) -> String {
    let shown = escaped_prefix(path);
    let older = if path.starts_with("/localnetv1.") {
        "; KPNG's older localnetv1 API is not served: use a client of KPNG's localv1 API \
         (KPNG's own since it replaced localnetv1)"
    } else {
        ""
    };
    format!("no method {shown}: kpng serves {WATCH_PATH} (KPNG's localv1 API){older}")
}

/// How many characters of a client's text a refusal or a log line repeats.
const SHOWN_CHARS: usize = 80;

/// `text` quoted and escaped (no control characters reach a log or a terminal), cut after
/// [`SHOWN_CHARS`] characters (`…` after the quote says so).
fn escaped_prefix(text: &str) -> String {
    let cut: String = text.chars().take(SHOWN_CHARS).collect();
    let more = if cut.len() < text.len() { "…" } else { "" };
    format!("{cut:?}{more}")
}

/// Ends a refusal's full line: the peer's next ones are summarised.
const SUMMARISED: &str = "; further refusals from this address are summarised once a minute";

/// The one method this service has: its HTTP/2 path, also for clients that call it with a
/// codec of their own (the benchmark's simulated nodes).
pub const WATCH_PATH: &str = "/localv1.Sets/Watch";
/// The response header by which a server says it honours `WatchReq.Continuous`: a client that
/// asked for it and sees the header sends no request per change set; without it (KPNG's
/// server, an older kpng) the client keeps asking, as the protocol always had it.
pub const CONTINUOUS_HEADER: &str = "kpng-watch-continuous";
/// A `WatchReq` is a node name (at most 253 bytes) and two flags: anything larger is not one,
/// and is not buffered.
const MAX_REQUEST_BYTES: usize = 1024;
/// Batches (of about [`BATCH_BYTES`]) a large change set's task buffers before it waits for
/// the client to read.
const CHUNKS_BUFFER: usize = 1;
/// A change set of at most this many Services (and no replay) is encoded where the response
/// body is polled, without a task of its own: the common case of one Service changing costs
/// no task switch and no channel per stream.
const INLINE_SERVICES: usize = 32;

/// KPNG's older API, `localnetv1.Endpoints` (`/localnetv1.Endpoints/Watch`): every call gets
/// UNIMPLEMENTED saying what is served instead, where tonic's router would answer an unknown
/// service with an empty message.
#[derive(Debug, Clone, Copy, Default)]
struct OlderApi;

impl tonic::server::NamedService for OlderApi {
    const NAME: &'static str = "localnetv1.Endpoints";
}

impl tower::Service<http::Request<Body>> for OlderApi {
    type Response = http::Response<Body>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        std::future::ready(Ok(
            Status::unimplemented(no_method(request.uri().path())).into_http()
        ))
    }
}

impl tonic::server::NamedService for SetsService {
    const NAME: &'static str = "localv1.Sets";
}

impl tower::Service<http::Request<Body>> for SetsService {
    type Response = http::Response<Body>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        std::future::ready(Ok(self.handle(request)))
    }
}

/// A large change set's chunks are handed to the response body in batches of about this many
/// bytes: fewer task switches per stream than one chunk at a time.
const BATCH_BYTES: usize = 256 * 1024;

/// The client's certificate chain, over TCP or a Unix socket (tonic's own accessor only
/// knows its own connection types, not [`Limited`] ones).
fn peer_certs(
    ext: &http::Extensions,
) -> Option<Arc<Vec<tonic::transport::CertificateDer<'static>>>> {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    if let Some(info) = ext.get::<TlsConnectInfo<ConnInfo<TcpConnectInfo>>>() {
        return info.peer_certs();
    }
    #[cfg(unix)]
    {
        use tonic::transport::server::UdsConnectInfo;
        if let Some(info) = ext.get::<TlsConnectInfo<ConnInfo<UdsConnectInfo>>>() {
            return info.peer_certs();
        }
    }
    None
}

/// Where a stream comes from.
struct From {
    /// `IP:port` over TCP, `unix, pid N` over a Unix socket (where the peer has no address but
    /// the kernel names its process): what tells two kpngs that claim one node name apart in
    /// the brain's status.
    peer: Option<String>,
    /// The remote IP address (TCP).
    ip: Option<std::net::IpAddr>,
    /// The connection's shared state.
    state: Option<Arc<conn::ConnState>>,
}

/// Where a stream comes from, with or without TLS.
fn connection(ext: &http::Extensions) -> From {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    let tcp = ext.get::<ConnInfo<TcpConnectInfo>>().or_else(|| {
        ext.get::<TlsConnectInfo<ConnInfo<TcpConnectInfo>>>()
            .map(TlsConnectInfo::get_ref)
    });
    if let Some(info) = tcp {
        let remote = info.inner.remote_addr();
        return From {
            peer: remote.map(|a| a.to_string()),
            ip: remote.map(|a| a.ip()),
            state: Some(info.state.clone()),
        };
    }
    #[cfg(unix)]
    {
        use tonic::transport::server::UdsConnectInfo;
        let uds = ext.get::<ConnInfo<UdsConnectInfo>>().or_else(|| {
            ext.get::<TlsConnectInfo<ConnInfo<UdsConnectInfo>>>()
                .map(TlsConnectInfo::get_ref)
        });
        if let Some(info) = uds {
            let peer = match info.inner.peer_cred.and_then(|cred| cred.pid()) {
                Some(pid) => format!("unix, pid {pid}"),
                None => "unix".to_string(),
            };
            return From {
                peer: Some(peer),
                ip: None,
                state: Some(info.state.clone()),
            };
        }
    }
    From {
        peer: None,
        ip: None,
        state: None,
    }
}

/// Who is watching.
struct Client {
    /// Where the connection comes from (see [`From`]).
    peer: Option<String>,
    /// The remote IP address (TCP): whose share of the streams this one takes without mTLS.
    ip: Option<std::net::IpAddr>,
    /// The connection's shared state, marked as watching once the stream is admitted.
    conn: Option<Arc<conn::ConnState>>,
    /// With mTLS: the node names its certificate allows; `None` without client certificates.
    allowed: Option<Vec<String>>,
    /// From the first request on: the stream's place, and the mark that keeps the connection
    /// from being closed as idle. A stream that has not asked holds neither (see
    /// [`admission`]).
    admitted: Option<(admission::Admitted, Option<conn::WatchGuard>)>,
    /// The kpng version its request named (see [`crate::version`]).
    version: Option<String>,
}

/// What a large change set's task hands the response body.
enum Produced {
    /// The next chunks of frames.
    Frames(Vec<Bytes>),
    /// The change set is complete; `synced`: it ended with `Sync` (else nothing changed for
    /// this node, and the stream waits for the next change set, not the next request).
    End { synced: bool },
}

/// Where one Watch stream is.
enum Step {
    /// Waiting for the client's next request (each asks for the next change set).
    Request,
    /// Waiting for something to send to the client's node.
    ChangeSet,
    /// Taking a large change set from the task that encodes it.
    Large(mpsc::Receiver<Produced>),
    /// The stream ends with this status (sent as trailers).
    End(Status),
    /// Trailers sent.
    Done,
}

/// One Watch stream, as its response body: for every request, the next non-empty change set.
///
/// The body itself reads the requests and waits on the watcher's [`crate::hub::Slot`], so a
/// change reaches a node through one task (the connection's stream, woken by the hub) instead
/// of a task per stream handing bytes over a channel: at thousands of nodes that hand-over was
/// a large part of what one change cost the brain. Only a large change set (a replay) is
/// encoded by a task of its own, which waits whenever the client reads slowly; its changes
/// meanwhile keep coalescing in its [`crate::hub::Pending`].
struct WatchBody {
    hub: Arc<Hub>,
    admission: Arc<admission::Admission>,
    refusals: Arc<refusal_log::RefusalLog>,
    requests: Streaming<proto::WatchReq>,
    client: Client,
    /// Shared by the service's streams: the node versions already warned about.
    versions: Arc<crate::version::Warned>,
    /// Until the first request: when the stream is closed without one
    /// ([`FIRST_REQUEST_TIMEOUT`]).
    first_request: Pin<Box<Sleep>>,
    registration: Option<Registration>,
    /// The client asked (in its first request) for every change set without a request each:
    /// half the system calls and wake-ups per change and node, on both sides.
    continuous: bool,
    /// A continuous client closed its side of the stream (it sends nothing more).
    requests_ended: bool,
    /// Whether the request stream woke the body (a continuous stream polls it only then).
    request_wake: request_wake::RequestWake,
    /// The client reads bundles (`WatchReq.AcceptZstd`): a replay's shared chunks go to it
    /// compressed.
    bundles: bool,
    step: Step,
    /// Chunks of frames ready to hand to the connection.
    queue: VecDeque<Bytes>,
    /// Completes when the server shuts down: the stream then ends with [`SHUTTING_DOWN`].
    stopping: Pin<Box<WaitForCancellationFutureOwned>>,
    /// Since when the client watches (registered): how long it stayed, when it leaves.
    watching_since: Option<std::time::Instant>,
    /// Why the stream ended, when known: said when the client leaves.
    why: Option<String>,
}

/// A client's address as the log shows it: `10.77.0.3:42690`, `unix, pid 12`, or `unknown`
/// (not `Some("10.77.0.3:42690")`, as until 2026-12-07).
fn shown_peer(peer: &Option<String>) -> &str {
    peer.as_deref().unwrap_or("unknown")
}

impl WatchBody {
    /// Records a refusal of this stream's peer: whether to log it in full.
    fn refused(&self, refusal: Refusal) -> bool {
        self.refusals.record(self.client.ip, refusal)
    }

    /// A request for `node_name`: registers the watcher (or renames it), or refuses a name
    /// that is not a Node's, a node the client certificate does not name, or a client that
    /// holds its share of the streams. The first request says whether the stream is
    /// continuous.
    fn requested(&mut self, request: proto::WatchReq) -> Step {
        let node_name = request.node_name;
        if self.registration.is_none() {
            self.continuous = request.continuous;
            self.bundles = request.accept_zstd;
        }
        let peer = shown_peer(&self.client.peer);
        if !crate::identity::is_node_name(&node_name) {
            // The name goes to the log and the client escaped and cut short, never raw.
            let shown = escaped_prefix(&node_name);
            if self.refused(Refusal::NotANodeName) {
                warn!(
                    %peer,
                    name_bytes = node_name.len(),
                    "refusing a Watch: {shown} is not a Node's name{SUMMARISED}"
                );
            }
            return Step::End(Status::invalid_argument(format!(
                "WatchReq.NodeName {shown} is not {}",
                crate::identity::NODE_NAME_RULE
            )));
        }
        if let Some(allowed) = &self.client.allowed
            && !crate::identity::may_watch(allowed, &node_name)
        {
            if self.refused(Refusal::OtherNode) {
                warn!(
                    %peer,
                    node = %node_name,
                    "refusing a Watch: the client certificate names {}, not this \
                     node{SUMMARISED}",
                    allowed.join(", ")
                );
            }
            return Step::End(Status::permission_denied(format!(
                "the client certificate does not name node {node_name:?}"
            )));
        }
        if self
            .registration
            .as_ref()
            .is_none_or(|reg| reg.node_name() != node_name)
            && let Some(why) = self.hub.refusal(&node_name)
        {
            return self.refuse_unknown_node(why);
        }
        match &mut self.registration {
            Some(reg) => {
                if reg.node_name() != node_name {
                    reg.rename(&node_name);
                }
            }
            None => {
                let key = match (&self.client.allowed, self.client.ip) {
                    (Some(_), _) => Some(admission::PeerKey::Node(node_name.clone())),
                    (None, Some(ip)) => Some(admission::PeerKey::ip(ip)),
                    (None, None) => None,
                };
                let admitted = match self.admission.admit(key) {
                    Ok(admitted) => admitted,
                    Err(refused) => {
                        let kind = match refused {
                            admission::Refused::Total => Refusal::TooManyWatches,
                            admission::Refused::Peer => Refusal::TooManyWatchesFromPeer,
                        };
                        if self.refused(kind) {
                            warn!(
                                %peer,
                                node = %node_name,
                                "refusing a Watch: {refused}{SUMMARISED}"
                            );
                        }
                        return Step::End(Status::resource_exhausted(refused.to_string()));
                    }
                };
                let watching = self.client.conn.as_ref().map(|state| state.watching());
                self.client.admitted = Some((admitted, watching));
                let version = self.client.version.as_deref().unwrap_or("unknown");
                info!(%peer, node = %node_name, %version, "API client watching");
                let ours = self.hub.version();
                if let Some(theirs) = &self.client.version
                    && self.versions.first_mismatch(ours, theirs)
                {
                    warn!(
                        %peer,
                        node = %node_name,
                        "a node runs kpng {theirs}, this brain {}: their major.minor versions \
                         differ (a rollout in progress?); finish it so that both sides mean \
                         the same by the protocol (said once per version; `kpng status` lists \
                         every node's)",
                        ours
                    );
                }
                self.watching_since = Some(std::time::Instant::now());
                let registration = self.hub.register_from(&node_name, self.client.peer.clone());
                registration.set_version(self.client.version.clone());
                self.registration = Some(registration);
            }
        }
        Step::ChangeSet
    }

    /// Ends the stream of a node the brain's cluster does not have ([`crate::hub::Hub::refusal`]): the
    /// hub warned once for the name; counted here, and summarised per peer.
    fn refuse_unknown_node(&self, why: String) -> Step {
        // The hub's warning is the full line: only the summaries are the refusal log's.
        let _ = self.refused(Refusal::UnknownNode);
        Step::End(Status::failed_precondition(why))
    }

    /// Starts sending `pending`: encoded here when small, else by a task of its own.
    fn send(&mut self, mut pending: Pending) -> Step {
        if let Some(why) = pending.refused.take() {
            return self.refuse_unknown_node(why);
        }
        let small =
            !pending.replay && pending.base.is_none() && pending.changes.len() <= INLINE_SERVICES;
        if !small {
            let (tx, rx) = mpsc::channel(CHUNKS_BUFFER);
            tokio::spawn(produce(self.hub.clone(), pending, self.bundles, tx));
            return Step::Large(rx);
        }
        let mut frames = pending.frames(self.hub.replay_cache(), self.bundles);
        self.queue.extend(frames.by_ref());
        count_sent(&self.hub, frames.ops(), frames.synced());
        self.after_change_set(frames.synced())
    }

    /// After a change set: the next request when it ended with `Sync` and the client asks for
    /// each change set; else (a continuous client, or nothing changed for this node) the next
    /// change set.
    fn after_change_set(&self, synced: bool) -> Step {
        if synced && !self.continuous {
            Step::Request
        } else {
            Step::ChangeSet
        }
    }

    /// For a continuous stream waiting on its next change set: a request (a rename) or a
    /// broken request stream, if either came; `None` when neither did (the waker is
    /// registered). A client that half-closes its side has nothing more to ask, and keeps
    /// receiving.
    fn poll_request_meanwhile(&mut self, cx: &mut Context<'_>) -> Option<Step> {
        if self.requests_ended {
            return None;
        }
        let waker = self.request_wake.take(cx)?;
        let mut requests_cx = Context::from_waker(waker);
        match Pin::new(&mut self.requests).poll_next(&mut requests_cx) {
            Poll::Pending => None,
            Poll::Ready(Some(Ok(request))) => match self.requested(request) {
                Step::ChangeSet => None,
                other => Some(other),
            },
            Poll::Ready(None) => {
                self.requests_ended = true;
                None
            }
            Poll::Ready(Some(Err(status))) => {
                debug!(peer = %shown_peer(&self.client.peer), "watch stream ended: {status}");
                self.why
                    .get_or_insert_with(|| format!("its requests failed: {status}"));
                Some(Step::End(Status::ok("")))
            }
        }
    }
}

/// Counts a change set of `ops` ops as sent; `synced`: it ended with `Sync`.
fn count_sent(hub: &Hub, ops: u64, synced: bool) {
    hub.metrics().ops.inc_by(ops);
    if synced {
        hub.metrics().change_sets.inc();
    }
}

/// Encodes a large change set in batches of about [`BATCH_BYTES`], each sent when the
/// stream has taken the previous one; stops when the stream is gone.
async fn produce(hub: Arc<Hub>, pending: Pending, bundles: bool, tx: mpsc::Sender<Produced>) {
    let mut frames = pending.frames(hub.replay_cache(), bundles);
    let mut batch = Vec::new();
    let mut batched = 0;
    for chunk in frames.by_ref() {
        batched += chunk.len();
        batch.push(chunk);
        if batched >= BATCH_BYTES {
            batched = 0;
            if tx
                .send(Produced::Frames(std::mem::take(&mut batch)))
                .await
                .is_err()
            {
                return;
            }
        }
    }
    if !batch.is_empty() && tx.send(Produced::Frames(batch)).await.is_err() {
        return;
    }
    let synced = frames.synced();
    count_sent(&hub, frames.ops(), synced);
    let _ = tx.send(Produced::End { synced }).await;
}

impl http_body::Body for WatchBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        loop {
            if let Some(bytes) = this.queue.pop_front() {
                this.hub.metrics().sent_bytes.inc_by(bytes.len() as u64);
                return Poll::Ready(Some(Ok(http_body::Frame::data(bytes))));
            }
            if !matches!(this.step, Step::End(_) | Step::Done)
                && this.stopping.as_mut().poll(cx).is_ready()
            {
                // A change set being sent is cut short; the client applies none without its
                // Sync.
                this.step = Step::End(Status::unavailable(SHUTTING_DOWN));
            }
            let next = match &mut this.step {
                Step::Request => match Pin::new(&mut this.requests).poll_next(cx) {
                    Poll::Pending
                        if this.registration.is_none()
                            && this.first_request.as_mut().poll(cx).is_ready() =>
                    {
                        debug!(
                            peer = %shown_peer(&this.client.peer),
                            "closing a Watch stream that sent no request within \
                             {FIRST_REQUEST_TIMEOUT:?}"
                        );
                        Step::End(Status::deadline_exceeded(format!(
                            "no WatchReq within {FIRST_REQUEST_TIMEOUT:?} of opening the stream"
                        )))
                    }
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Some(Ok(request))) => this.requested(request),
                    Poll::Ready(None) => {
                        this.why
                            .get_or_insert_with(|| "it closed its stream".to_string());
                        Step::End(Status::ok(""))
                    }
                    Poll::Ready(Some(Err(status))) => {
                        debug!(
                            peer = %shown_peer(&this.client.peer),
                            "watch stream ended: {status}"
                        );
                        this.why
                            .get_or_insert_with(|| format!("its requests failed: {status}"));
                        Step::End(Status::ok(""))
                    }
                },
                Step::ChangeSet => {
                    if this.continuous
                        && let Some(step) = this.poll_request_meanwhile(cx)
                    {
                        this.step = step;
                        continue;
                    }
                    let Some(reg) = &this.registration else {
                        // Unreachable: a change set is awaited only once registered.
                        return Poll::Ready(None);
                    };
                    match reg.slot.poll_next(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(pending) => this.send(pending),
                    }
                }
                Step::Large(rx) => match rx.poll_recv(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Some(Produced::Frames(batch))) => {
                        this.queue.extend(batch);
                        continue;
                    }
                    Poll::Ready(Some(Produced::End { synced })) => this.after_change_set(synced),
                    Poll::Ready(None) => {
                        Step::End(Status::internal("the change set's encoder stopped"))
                    }
                },
                Step::End(status) => {
                    let status = std::mem::replace(status, Status::ok(""));
                    if status.code() != tonic::Code::Ok {
                        this.why
                            .get_or_insert_with(|| format!("ended with: {}", status.message()));
                    }
                    this.step = Step::Done;
                    let mut trailers = status.into_http::<()>().into_parts().0.headers;
                    trailers.remove(http::header::CONTENT_TYPE);
                    return Poll::Ready(Some(Ok(http_body::Frame::trailers(trailers))));
                }
                Step::Done => return Poll::Ready(None),
            };
            this.step = next;
        }
    }
}

impl Drop for WatchBody {
    fn drop(&mut self) {
        if let Some(reg) = &self.registration {
            let connected_for = self
                .watching_since
                .map(|since| std::time::Duration::from_secs(since.elapsed().as_secs()))
                .unwrap_or_default();
            let (lag, pending) = reg.slot.behind();
            let (behind, why) = gone_reason(
                self.why.as_deref(),
                reg.node_name(),
                (lag, pending),
                self.hub.lag_warning(),
            );
            if behind {
                warn!(
                    peer = %shown_peer(&self.client.peer),
                    node = %reg.node_name(),
                    connected_for = %humantime::format_duration(connected_for),
                    "API client gone: {why}"
                );
            } else {
                info!(
                    peer = %shown_peer(&self.client.peer),
                    node = %reg.node_name(),
                    connected_for = %humantime::format_duration(connected_for),
                    "API client gone: {why}"
                );
            }
        }
    }
}

/// Why a Watch stream of node `node` ended, and whether it is a warning: the reason the
/// stream recorded (`why`); else, when the node was `behind` (its oldest unsent change's
/// wait, and the Services changed) by at least `threshold` (the hub's lag warning), a node
/// that fell behind ([`fell_behind`]); else a connection that closed.
fn gone_reason(
    why: Option<&str>,
    node: &str,
    behind: (Duration, usize),
    threshold: Duration,
) -> (bool, String) {
    match why {
        Some(why) => (false, why.to_string()),
        None if !threshold.is_zero() && behind.0 >= threshold => {
            (true, fell_behind(node, behind.0, behind.1))
        }
        None => (
            false,
            "its connection closed or the brain dropped it".to_string(),
        ),
    }
}

/// Why a stream ended whose node was `lag` behind with `pending` Services changed: it stopped
/// reading (stopped, hung, overloaded) and its connection closed, most often the keepalive's
/// doing. The connection is gone, so the node cannot be told; it replays everything when it
/// watches again. Until 2026-12-07 this read "its connection closed or the brain dropped it".
fn fell_behind(node: &str, lag: Duration, pending: usize) -> String {
    format!(
        "node {node:?} fell behind: {pending} Service changes pending for {} when its \
         connection ended (it stopped reading its stream; the brain ends a connection whose \
         keepalive pings go unanswered for {}); it will get the full state when it watches again",
        humantime::format_duration(Duration::from_secs(lag.as_secs())),
        humantime::format_duration(KEEPALIVE_TIMEOUT),
    )
}

/// Serves `hub` on `addr` until `shutdown` completes, within `limits`. Binds before returning
/// the future, so a bad address fails start-up.
pub async fn serve(
    hub: Arc<Hub>,
    addr: &ApiAddr,
    tls: &TlsFiles,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Pin<Box<dyn Future<Output = Result<(), ServeError>> + Send>>, ServeError> {
    let mut builder = Server::builder()
        .max_concurrent_streams(STREAMS_PER_CONNECTION)
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT));
    // TLS is done here rather than by tonic, which reads its files once: each new connection
    // is handed the files' current material (`server/tls.rs`).
    let tls_files = tls;
    if let Some(key) = &tls_files.key
        && let Some(w) = crate::exposure::of_key_file("--listen-tls-key", key)
    {
        warn!("{w}");
    }
    let tls = match tls::Paths::of(tls).map_err(ServeError::Tls)? {
        Some(paths) => Some(tls::ServerTls::start(paths, hub.metrics())?),
        None => None,
    };
    let secure = tls.is_some();
    let refusals = Arc::new(refusal_log::RefusalLog::counting_in(
        hub.metrics().refused.clone(),
    ));
    // Shutting down ends every Watch stream with a status saying so (hyper's graceful
    // shutdown then finds no stream open), instead of connections dropped mid-stream.
    let stopping = CancellationToken::new();
    let stop_streams = stopping.clone();
    let shutdown = async move {
        shutdown.await;
        stop_streams.cancel();
    };
    let router = builder
        .add_service(
            SetsService::new(hub)
                .with_refusal_log(refusals.clone())
                .stopping_with(stopping),
        )
        .add_service(OlderApi);
    let listen_err = |source| ServeError::Listen {
        addr: addr.clone(),
        source,
    };
    match addr {
        ApiAddr::Tcp(_) => {
            let socket = addr
                .socket_addr()?
                .ok_or_else(|| ServeError::Tls("no TCP address".into()))?;
            let listener = tokio::net::TcpListener::bind(socket)
                .await
                .map_err(listen_err)?;
            info!(addr = %addr, "API listening");
            match crate::exposure::of_listener(socket.ip(), secure, tls_files.ca.is_some()) {
                Some(e) if e.warn => warn!(addr = %addr, "{}", e.message),
                Some(e) => info!(addr = %addr, "{}", e.message),
                None => {}
            }
            let incoming = limit(conn::tcp_incoming(listener), limits, refusals.clone());
            Ok(serve_on(router, incoming, tls, false, shutdown, refusals))
        }
        #[cfg(not(unix))]
        ApiAddr::Unix(_) => Err(listen_err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "unix:// addresses need a Unix system; listen on tcp:// instead",
        ))),
        #[cfg(unix)]
        ApiAddr::Unix(path) => {
            let listener = unix_socket::bind(path).map_err(listen_err)?;
            info!(addr = %addr, "API listening");
            let accepted = tokio_stream::wrappers::UnixListenerStream::new(listener);
            let incoming = limit(accepted, limits, refusals.clone());
            // grpc-core clients send the socket path as `:authority`, which h2 refuses: read
            // as `localhost`, after the TLS handshake when there is one.
            Ok(serve_on(router, incoming, tls, true, shutdown, refusals))
        }
    }
}

/// The server's future on the connections of `incoming`, after a TLS handshake with `tls`;
/// `fix_authority`: a Unix socket's, whose grpc-core clients' `:authority` is read as
/// `localhost` ([`authority::AuthorityFix`]) in the plaintext HTTP/2 bytes, decrypted when
/// TLS is on (until 2026-12-06 it was not applied under TLS, and such clients had to set
/// their authority themselves).
fn serve_on<S, IO>(
    router: Router,
    incoming: S,
    tls: Option<Arc<tls::ServerTls>>,
    fix_authority: bool,
    shutdown: impl Future<Output = ()> + Send + 'static,
    refusals: Arc<refusal_log::RefusalLog>,
) -> Pin<Box<dyn Future<Output = Result<(), ServeError>> + Send>>
where
    S: Stream<Item = std::io::Result<Limited<IO>>> + Send + 'static,
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Connected + PeerIp + Unpin + Send + 'static,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
{
    use tokio_stream::StreamExt;
    match tls {
        None => Box::pin(serve_and_summarise(
            router.serve_with_incoming_shutdown(
                incoming.map(move |conn| {
                    conn.map(|io| authority::AuthorityFix::new(io, fix_authority))
                }),
                shutdown,
            ),
            refusals,
            None,
        )),
        Some(tls) => Box::pin(serve_and_summarise(
            router.serve_with_incoming_shutdown(
                tls::accept(incoming, tls.clone(), refusals.clone()).map(move |conn| {
                    conn.map(|io| authority::AuthorityFix::new(io, fix_authority))
                }),
                shutdown,
            ),
            refusals,
            Some(tls),
        )),
    }
}

/// Runs `server` and, beside it, the summaries of its refusals and the look at its TLS files
/// every [`tls::RELOAD_INTERVAL`], until the server ends.
async fn serve_and_summarise(
    server: impl Future<Output = Result<(), tonic::transport::Error>>,
    refusals: Arc<refusal_log::RefusalLog>,
    tls: Option<Arc<tls::ServerTls>>,
) -> Result<(), ServeError> {
    let watch_tls = async move {
        match tls {
            Some(tls) => tls.watch().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        result = server => result.map_err(ServeError::from),
        () = refusals.flush_every_interval() => Ok(()),
        () = watch_tls => Ok(()),
    }
}

#[cfg(test)]
mod gone_tests {
    use super::*;

    /// A stream that ends while its node is behind by the lag threshold is a node that fell
    /// behind, warned with its lag and pending changes (until 2026-12-07 it read "its
    /// connection closed or the brain dropped it", at INFO); a reason the stream recorded
    /// wins, and a node that was not behind closed its connection.
    #[test]
    fn a_stream_lost_while_its_node_is_behind_says_it_fell_behind() {
        let ten = Duration::from_secs(10);
        // (the stream's own reason, how far behind, warned, words of the line)
        type Case<'a> = (Option<&'a str>, (Duration, usize), bool, &'a str);
        let cases: [Case; 4] = [
            (
                None,
                (Duration::from_secs(44), 179),
                true,
                "node \"n4\" fell behind: 179 Service changes pending for 44s when its connection \
                 ended",
            ),
            (None, (Duration::from_secs(44), 179), true, "full state"),
            (
                None,
                (Duration::from_secs(2), 3),
                false,
                "its connection closed or the brain dropped it",
            ),
            (
                Some("it closed its stream"),
                (Duration::from_secs(44), 1),
                false,
                "it closed its stream",
            ),
        ];
        for (why, behind, warned, words) in cases {
            let (warn, text) = gone_reason(why, "n4", behind, ten);
            assert_eq!(warn, warned, "{text}");
            assert!(text.contains(words), "{words:?} in {text}");
        }
    }
}
