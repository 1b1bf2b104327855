//! Serving kpng's small HTTP servers (the health server, the metrics server, the Service
//! health checks) so that one misbehaving or hostile client cannot take them from the others.
//!
//! Why: these servers listen on every node, the health checks on the node's public addresses,
//! and a cloud load balancer marks the node unhealthy when its probes go unanswered. Served as
//! `axum::serve` serves (and as kube-proxy's Go servers do), a connection is kept for as long
//! as the client likes: one client opening thousands of idle connections holds as many file
//! descriptors and buffers, and one sending half a request header (slowloris) holds its
//! connection forever. Here each listener has:
//!
//! - a cap on the connections of one peer address ([`ConnectionLimits::per_peer`]), so that a
//!   flooding source takes only its own share and probes from other addresses are answered;
//! - a cap on all its connections ([`ConnectionLimits::total`]), which bounds its file
//!   descriptors and memory whatever the number of sources. At that cap a new connection is
//!   still served: the oldest connection of the source holding the most is closed for it
//!   (an IPv6 source is its /64, which one host can fill with addresses; an IPv4 source its
//!   address), so a flood from many addresses of one host or prefix cannot shut a load
//!   balancer's prober out; only a newcomer whose own source holds the most is refused;
//! - a header timeout ([`ConnectionLimits::header_timeout`]): a connection that has not sent a
//!   complete request header this long after it opened, or after its previous answer, is
//!   closed (hyper's own timer, which runs from when it waits for a request: slowloris and
//!   idle kept-alive connections alike);
//! - an idle timeout ([`ConnectionLimits::idle_timeout`]): a connection on which nothing is
//!   read or written for this long is closed (a client that stops reading a `/metrics` answer).
//!
//! A connection over a cap is closed as soon as it is accepted (with a reset: nothing stays in
//! the kernel's backlog or in `TIME_WAIT`), counted in `kpng_http_connections_refused_total`
//! (as is each connection closed for a newcomer, `reason="evicted"`), and logged once per
//! peer, kind and listener, then summarised at most once a minute per peer, within a budget
//! of lines per minute ([`kpng_model::log_limit`]).
//!
//! Connections are HTTP/1 only (as kube-proxy's Go servers, which do not serve HTTP/2 prior
//! knowledge either), with `half_close`: a client that shuts its sending side after its
//! request still gets the answer.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use kpng_model::log_limit::{PeerLogLimiter, Summary, Verdict};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as MetricFamily;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tower::Service;
use tracing::{debug, error, warn};

/// How many connections a listener keeps, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections open at once from one IP address (an IPv4-mapped IPv6 address counts as
    /// its IPv4 address).
    pub per_peer: usize,
    /// Connections open at once on the listener.
    pub total: usize,
    /// A connection must send a complete request header within this long of opening, or of
    /// its previous answer.
    pub header_timeout: Duration,
    /// A connection on which nothing is read or written for this long is closed.
    pub idle_timeout: Duration,
}

impl ConnectionLimits {
    /// 32 connections per address, 512 per listener, 10 s to send a request header (and to
    /// send the next one on a kept-alive connection), 60 s without progress. A load balancer's
    /// prober opens one connection per probe, sends its request at once and is answered in
    /// milliseconds: it holds one or two connections at a time, never waits seconds between
    /// connecting and asking, and a prober that keeps connections alive sees them closed
    /// cleanly between probes and opens a new one. Prometheus and the kubelet are one client
    /// each.
    pub const DEFAULT: ConnectionLimits = ConnectionLimits {
        per_peer: 32,
        total: 512,
        header_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(60),
    };
}

impl Default for ConnectionLimits {
    /// [`ConnectionLimits::DEFAULT`].
    fn default() -> ConnectionLimits {
        ConnectionLimits::DEFAULT
    }
}

/// The largest read buffer of a connection: a request to these servers is a line and a few
/// headers, so 16 KiB is plenty, and [`ConnectionLimits::total`] connections hold at most
/// 8 MiB of buffers (hyper's default, ~400 KiB each, would be 200 MiB).
const MAX_BUF_SIZE: usize = 16 * 1024;

/// How long a peer's refusals are summarised over, and how many peers are tracked for it.
const LOG_INTERVAL: Duration = Duration::from_secs(60);
const LOG_PEERS: usize = 1024;

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its address holds [`ConnectionLimits::per_peer`] connections.
    PeerCap,
    /// The listener holds [`ConnectionLimits::total`] connections and the new connection's
    /// source holds the most of them.
    TotalCap,
    /// An open connection closed for a new one from another source: the listener held
    /// [`ConnectionLimits::total`] connections, and its source the most of them.
    Evicted,
}

impl Refusal {
    /// Every reason, for the series created at 0 when a server starts.
    pub const ALL: [Refusal; 3] = [Refusal::PeerCap, Refusal::TotalCap, Refusal::Evicted];

    /// The metric label.
    fn label(self) -> &'static str {
        match self {
            Refusal::PeerCap => "per_peer",
            Refusal::TotalCap => "total",
            Refusal::Evicted => "evicted",
        }
    }

    /// In words, for the log.
    fn words(self) -> &'static str {
        match self {
            Refusal::PeerCap => "its address holds as many connections as one address may",
            Refusal::TotalCap => {
                "the server holds as many connections as it may, its source (address, or IPv6 \
                 /64) the most"
            }
            Refusal::Evicted => {
                "the server held as many connections as it may, its source (address, or IPv6 \
                 /64) the most: its oldest was closed for a new one from another source"
            }
        }
    }
}

/// A label set of `kpng_http_connections_refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabel {
    /// `healthz`, `metrics` or `service_health_check`.
    pub server: String,
    /// `per_peer`, `total` or `evicted`.
    pub reason: String,
}

/// `kpng_http_connections_refused_total`: connections closed at once for a cap. Cheap to
/// clone; an unregistered one counts for nobody.
#[derive(Clone, Debug, Default)]
pub struct RefusedConnections(MetricFamily<RefusedLabel, Counter>);

impl RefusedConnections {
    /// Registers the counter in `registry`.
    pub fn register_in(&self, registry: &mut Registry) {
        registry.register(
            "kpng_http_connections_refused",
            "Connections to kpng's health, metrics and Service health-check servers closed at once because their address or the server held as many as it may (reason per_peer, total), or closed for a new connection from another source while the server held as many as it may (reason evicted)",
            self.0.clone(),
        );
    }

    /// How many connections `server` refused for `reason`.
    pub fn get(&self, server: &str, reason: Refusal) -> u64 {
        self.0
            .get_or_create(&RefusedLabel {
                server: server.to_string(),
                reason: reason.label().to_string(),
            })
            .get()
    }

    /// Creates `server`'s series of every reason at 0: an alerting counter exists from the
    /// start (docs/observability.md), so that the first refusal shows in `increase()`.
    fn start(&self, server: &str) {
        for reason in Refusal::ALL {
            let _ = self.get(server, reason);
        }
    }

    fn inc(&self, server: &str, reason: Refusal) {
        self.0
            .get_or_create(&RefusedLabel {
                server: server.to_string(),
                reason: reason.label().to_string(),
            })
            .inc();
    }
}

/// What a refusal is logged and summarised as: why, and on which listener.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cause {
    refusal: Refusal,
    /// The listening address, and the Service when there is one.
    on: Arc<str>,
}

/// What the listeners of one server share: its name, limits, refusal counter and the log
/// limiter (so that a peer flooding every health-check port is summarised once, not once per
/// port). Cheap to clone.
#[derive(Clone, Debug)]
pub struct Guard {
    server: &'static str,
    /// What the log calls the server.
    what: &'static str,
    /// The Service a Service health-check listener answers for (`namespace/name`), for the log.
    service: Option<Arc<str>>,
    /// That Service's refusals, for `kpng status`.
    tally: Option<RefusalTally>,
    limits: ConnectionLimits,
    refused: RefusedConnections,
    log: Arc<Mutex<PeerLogLimiter<IpAddr, Cause>>>,
}

impl Guard {
    /// A guard for server `server` (the metric label), `what` in the log, with `limits`.
    pub fn new(
        server: &'static str,
        what: &'static str,
        limits: ConnectionLimits,
        refused: RefusedConnections,
    ) -> Guard {
        refused.start(server);
        Guard {
            server,
            what,
            service: None,
            tally: None,
            limits,
            refused,
            log: Arc::new(Mutex::new(PeerLogLimiter::new(LOG_INTERVAL, LOG_PEERS))),
        }
    }

    /// The same guard (sharing its counter and log) for a listener answering for `service`
    /// (`namespace/name`), which its log lines name; its refusals are also told in `tally`.
    pub fn for_service(&self, service: &str, tally: RefusalTally) -> Guard {
        Guard {
            service: Some(Arc::from(service)),
            tally: Some(tally),
            ..self.clone()
        }
    }

    /// The limits.
    pub fn limits(&self) -> ConnectionLimits {
        self.limits
    }

    /// What the log calls a listener on `local`.
    fn listener_name(&self, local: Option<SocketAddr>) -> Arc<str> {
        let addr = local.map_or_else(|| "an unknown address".to_string(), |a| a.to_string());
        match &self.service {
            Some(service) => Arc::from(format!("{addr} (Service {service})")),
            None => Arc::from(addr),
        }
    }

    /// Counts and (within the log budget) logs a refused or evicted connection of `peer`
    /// (`newcomer`: the peer an evicted connection was closed for).
    fn refuse(&self, peer: IpAddr, on: &Arc<str>, refusal: Refusal, newcomer: Option<IpAddr>) {
        self.refused.inc(self.server, refusal);
        if let Some(tally) = &self.tally {
            tally.add(Instant::now());
        }
        let cause = Cause {
            refusal,
            on: on.clone(),
        };
        let verdict = self
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(&peer, cause, Instant::now());
        if verdict == Verdict::Log {
            let cap = match refusal {
                Refusal::PeerCap => self.limits.per_peer,
                Refusal::TotalCap | Refusal::Evicted => self.limits.total,
            };
            let (what, newcomer) = match newcomer {
                Some(n) => ("an open", format!(" for a new one from {n}")),
                None => ("a new", String::new()),
            };
            warn!(
                "closing {what} connection to the {} on {on} from {peer}{newcomer}: {} ({cap}); \
                 further ones from {peer} are summarised once a minute",
                self.what,
                refusal.words()
            );
        }
    }

    /// Logs the summaries due.
    fn flush_log(&self) {
        let due = self
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .flush(Instant::now());
        for summary in due {
            warn!("{}", self.summary_line(&summary));
        }
    }

    fn summary_line(&self, summary: &Summary<IpAddr, Cause>) -> String {
        /// Listeners named in one line; the rest are counted.
        const NAMED: usize = 4;
        let from = match summary.peer {
            Some(peer) => peer.to_string(),
            None if summary.peers_at_least => format!("{} or more other addresses", summary.peers),
            None => format!("{} other addresses", summary.peers),
        };
        let mut why: Vec<String> = summary
            .held
            .iter()
            .take(NAMED)
            .map(|(c, n)| format!("{n} on {} because {}", c.on, c.refusal.words()))
            .collect();
        if summary.held.len() > NAMED {
            let rest: u64 = summary.held.iter().skip(NAMED).map(|(_, n)| n).sum();
            why.push(format!("{rest} on or for other listeners"));
        }
        let why = why.join(", ");
        format!(
            "closed {} more connections to the {} from {from} in the last {} s: {why}",
            summary.total(),
            self.what,
            summary.over.as_secs()
        )
    }
}

/// The source a connection is counted in when the listener is full: its IPv4 address, or
/// its IPv6 address's /64 (one host is commonly given a whole /64, so counting addresses
/// would let it hold a listener with a few of them).
fn source_of(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V4(_) => peer,
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & !u128::from(u64::MAX))),
    }
}

/// One open connection: its peer, and what closes it when dropped.
#[derive(Debug)]
struct Held {
    peer: IpAddr,
    _close: oneshot::Sender<()>,
}

/// The connections one listener holds, per peer address, per source (by age) and in all.
#[derive(Debug, Default)]
struct Open {
    per_peer: HashMap<IpAddr, usize>,
    /// Per [`source_of`], its connections by id (ids grow: the first is the oldest).
    per_source: HashMap<IpAddr, BTreeMap<u64, Held>>,
    next_id: u64,
    total: usize,
}

impl Open {
    /// Forgets connection `id` of `peer`; false when it was not held (already evicted).
    fn release(&mut self, peer: IpAddr, id: u64) -> bool {
        let source = source_of(peer);
        let Some(held) = self.per_source.get_mut(&source) else {
            return false;
        };
        if held.remove(&id).is_none() {
            return false;
        }
        if held.is_empty() {
            self.per_source.remove(&source);
        }
        self.total = self.total.saturating_sub(1);
        if let Some(n) = self.per_peer.get_mut(&peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_peer.remove(&peer);
            }
        }
        true
    }

    /// Closes the oldest connection of the source holding the most, unless `newcomer`'s
    /// source holds as many: the evicted connection's peer.
    fn evict_for(&mut self, newcomer: IpAddr) -> Option<IpAddr> {
        let own = self
            .per_source
            .get(&source_of(newcomer))
            .map_or(0, BTreeMap::len);
        let (&source, held) = self.per_source.iter().max_by_key(|(_, h)| h.len())?;
        if held.len() <= own {
            return None;
        }
        let (&id, oldest) = held.first_key_value()?;
        let peer = oldest.peer;
        debug_assert_eq!(source_of(peer), source);
        // Dropping its `Held` (its sender) tells its task to close it.
        self.release(peer, id).then_some(peer)
    }
}

/// One listener's count of open connections (for tests and `Permit`).
#[derive(Clone, Debug, Default)]
pub struct OpenConnections(Arc<Mutex<Open>>);

/// A connection admitted: its place, what tells it to close, and the peer whose connection
/// was closed to make room, if any.
struct Admitted {
    permit: Permit,
    closed: oneshot::Receiver<()>,
    evicted: Option<IpAddr>,
}

impl OpenConnections {
    /// Connections open now, in all.
    pub fn total(&self) -> usize {
        self.lock().total
    }

    /// Connections open now from `peer`.
    pub fn from(&self, peer: IpAddr) -> usize {
        self.lock()
            .per_peer
            .get(&peer.to_canonical())
            .copied()
            .unwrap_or(0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a connection from `peer` (making room by closing another source's oldest
    /// connection when the listener is full), or why there is none.
    fn admit(&self, peer: IpAddr, limits: &ConnectionLimits) -> Result<Admitted, Refusal> {
        let mut open = self.lock();
        let of_peer = open.per_peer.get(&peer).copied().unwrap_or(0);
        if of_peer >= limits.per_peer {
            return Err(Refusal::PeerCap);
        }
        let mut evicted = None;
        if open.total >= limits.total {
            evicted = Some(open.evict_for(peer).ok_or(Refusal::TotalCap)?);
        }
        let (close, closed) = oneshot::channel();
        let id = open.next_id;
        open.next_id += 1;
        open.per_source.entry(source_of(peer)).or_default().insert(
            id,
            Held {
                peer,
                _close: close,
            },
        );
        *open.per_peer.entry(peer).or_insert(0) += 1;
        open.total += 1;
        Ok(Admitted {
            permit: Permit {
                open: self.clone(),
                peer,
                id,
            },
            closed,
            evicted,
        })
    }
}

/// One connection's place, given back when dropped.
struct Permit {
    open: OpenConnections,
    peer: IpAddr,
    id: u64,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.open.lock().release(self.peer, self.id);
    }
}

/// The connections one Service's health-check listeners refused or closed over a cap, for
/// `kpng status`: the engineer asking why a load balancer marks the node down sees the flood
/// there, not only in the log and a metric.
#[derive(Clone, Debug, Default)]
pub struct RefusalTally(Arc<Mutex<Tally>>);

#[derive(Debug, Default)]
struct Tally {
    total: u64,
    last: Option<Instant>,
}

impl RefusalTally {
    fn add(&self, now: Instant) {
        let mut t = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        t.total += 1;
        t.last = Some(now);
    }

    /// How many connections were refused or closed since the listeners started, and how long
    /// ago the last one was, when that is within `within` of `now` (else `None`: no recent
    /// flood).
    pub fn recent(&self, now: Instant, within: Duration) -> Option<(u64, Duration)> {
        let t = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let ago = now.saturating_duration_since(t.last?);
        (ago <= within).then_some((t.total, ago))
    }
}

/// This server's address and port of a request's connection (a request extension, beside
/// `ConnectInfo`'s peer address), so that a handler can name the connection exactly: the
/// status page asks the kernel who owns the client's end of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalAddr(pub SocketAddr);

/// Serves `app` on `listener` within `guard`'s limits until the listener fails; `open` counts
/// its connections. Accept errors (out of file descriptors) are logged and retried after a
/// second, as `axum::serve` does.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    guard: Guard,
    open: OpenConnections,
) -> io::Result<()> {
    serve_inner(listener, app, guard, open, None::<()>).await
}

/// Serves as [`serve`] does, every request of this listener carrying `tag` as an extension
/// (for axum's `Extension` extractor).
///
/// Why: many listeners can then share one `app` and still tell which listener a request came
/// through. The Service health checks were a `Router` each, built with the Service in its
/// state: at 30k Services, 1,500 routers of ~3.5 KiB, which set kpng's peak RSS after the first
/// sync (docs/benchmarks.md, "the health checks' routers").
pub async fn serve_tagged<T: Clone + Send + Sync + 'static>(
    listener: TcpListener,
    app: Router,
    guard: Guard,
    open: OpenConnections,
    tag: T,
) -> io::Result<()> {
    serve_inner(listener, app, guard, open, Some(tag)).await
}

/// [`serve`], with `tag` in every request's extensions when there is one.
async fn serve_inner<T: Clone + Send + Sync + 'static>(
    listener: TcpListener,
    app: Router,
    guard: Guard,
    open: OpenConnections,
    tag: Option<T>,
) -> io::Result<()> {
    let on = guard.listener_name(listener.local_addr().ok());
    let mut log_tick = tokio::time::interval(LOG_INTERVAL / 4);
    log_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = log_tick.tick() => {
                guard.flush_log();
                continue;
            }
        };
        let (stream, remote) = match accepted {
            Ok(a) => a,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                error!(
                    "{}: accepting a connection: {}",
                    guard.what,
                    crate::open_files::with_advice(e.to_string())
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let peer = remote.ip().to_canonical();
        match open.admit(peer, &guard.limits) {
            Ok(admitted) => {
                if let Some(evicted) = admitted.evicted {
                    guard.refuse(evicted, &on, Refusal::Evicted, Some(peer));
                }
                tokio::spawn(serve_connection(
                    stream,
                    remote,
                    app.clone(),
                    tag.clone(),
                    guard.limits,
                    admitted.permit,
                    admitted.closed,
                ));
            }
            Err(reason) => {
                close_at_once(stream);
                guard.refuse(peer, &on, reason, None);
            }
        }
    }
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Closes with a reset: the socket is freed at once, with no `TIME_WAIT` or `FIN_WAIT` state
/// left for a flood to fill the kernel's tables with.
fn close_at_once(stream: TcpStream) {
    reset_when_closed(&stream);
    drop(stream);
}

/// Makes closing `stream` send a reset (SO_LINGER 0) rather than a FIN.
fn reset_when_closed(stream: &TcpStream) {
    if let Err(e) = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO)) {
        debug!("SO_LINGER on a connection closed at once: {e}");
    }
}

/// Completes when the connection is told to close for a newcomer, first marking it to be
/// reset: an evicted client is most likely part of a flood, and a reset leaves no
/// `FIN_WAIT`/`TIME_WAIT` socket behind for each connection closed, as a refusal does not.
async fn told_to_close(closed: oneshot::Receiver<()>, reset: Arc<AtomicBool>) {
    let _ = closed.await;
    reset.store(true, Ordering::Relaxed);
}

/// Serves one connection: HTTP/1.1 with the header timeout, closed when idle too long or
/// when `closed` completes (evicted for a newcomer). Each request carries `tag`, if any.
async fn serve_connection<T: Clone + Send + Sync + 'static>(
    stream: TcpStream,
    remote: SocketAddr,
    app: Router,
    tag: Option<T>,
    limits: ConnectionLimits,
    permit: Permit,
    closed: oneshot::Receiver<()>,
) {
    let _permit = permit;
    let _ = stream.set_nodelay(true);
    let local = stream.local_addr().ok().map(LocalAddr);
    let progress = Arc::new(AtomicU64::new(0));
    let reset = Arc::new(AtomicBool::new(false));
    let started = tokio::time::Instant::now();
    let io = TokioIo::new(Watched {
        io: stream,
        started,
        progress: progress.clone(),
        reset_on_drop: reset.clone(),
    });
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        request.extensions_mut().insert(ConnectInfo(remote));
        if let Some(local) = local {
            request.extensions_mut().insert(local);
        }
        if let Some(tag) = &tag {
            request.extensions_mut().insert(tag.clone());
        }
        let mut app = app.clone();
        app.call(request.map(axum::body::Body::new))
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_BUF_SIZE)
        // A client may shut its sending side after its request and wait for the answer
        // (curl's and some probers' way); without this hyper may close before answering.
        .half_close(true);
    let connection = builder.serve_connection(io, service);
    tokio::select! {
        result = connection => {
            if let Err(e) = result {
                debug!(peer = %remote, "HTTP connection closed: {e}");
            }
        }
        () = told_to_close(closed, reset) => {
            debug!(peer = %remote, "closing an HTTP connection for a new one from another source");
        }
        () = stalled(started, progress, limits.idle_timeout) => {
            debug!(peer = %remote, "closing an HTTP connection idle for {:?}", limits.idle_timeout);
        }
    }
}

/// Completes once nothing has been read or written for `idle` (`progress`: the last time,
/// in milliseconds after `started`).
async fn stalled(started: tokio::time::Instant, progress: Arc<AtomicU64>, idle: Duration) {
    loop {
        let last = started + Duration::from_millis(progress.load(Ordering::Relaxed));
        let deadline = last + idle;
        if tokio::time::Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline).await;
    }
}

/// A connection that records when it last read or wrote something.
struct Watched {
    io: TcpStream,
    started: tokio::time::Instant,
    progress: Arc<AtomicU64>,
    /// Set when the connection is evicted: closing it then sends a reset.
    reset_on_drop: Arc<AtomicBool>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        if self.reset_on_drop.load(Ordering::Relaxed) {
            reset_when_closed(&self.io);
        }
    }
}

impl Watched {
    fn moved(&self) {
        let millis = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.progress.store(millis, Ordering::Relaxed);
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.moved();
        }
        poll
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(poll, Poll::Ready(Ok(n)) if n > 0) {
            self.moved();
        }
        poll
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(poll, Poll::Ready(Ok(n)) if n > 0) {
            self.moved();
        }
        poll
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
