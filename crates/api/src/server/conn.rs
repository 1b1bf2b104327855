//! Connection limits of the brain's server: a cap on open connections and an idle timeout.
//!
//! Without them a peer can hold thousands of connections that never ask for anything (each a
//! file descriptor, buffers and, with TLS, a session) until the brain runs out. A connection
//! over the cap is closed as soon as it is accepted; a connection with no Watch stream for the
//! idle timeout (from its start or from the end of its last stream) is closed. A node's Watch
//! stream lasts as long as the node runs, so a working node is never idle.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::{Connected, TcpIncoming};
use tracing::{debug, warn};

use super::refusal_log::{Refusal, RefusalLog};

/// The default of `--max-connections`: a node holds one connection and a brain serves a few
/// thousand nodes, so this leaves room while bounding what idle peers can take.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 10_000;

/// How many connections the server keeps and for how long an idle one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Connections open at once; more are closed at once (`--max-connections`).
    pub max_connections: usize,
    /// A connection without a Watch stream for this long is closed
    /// (`--connection-idle-timeout`).
    pub idle_timeout: Duration,
}

impl Default for ConnLimits {
    /// 10,000 connections (a node holds one; a brain serves a few thousand nodes) and 20 s.
    fn default() -> ConnLimits {
        ConnLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS as usize,
            idle_timeout: Duration::from_secs(20),
        }
    }
}

/// What the server and the connection share: how many Watch streams run on it and since when
/// it has none.
#[derive(Debug)]
pub(crate) struct ConnState {
    watches: AtomicUsize,
    idle_since: Mutex<Instant>,
}

impl ConnState {
    fn new() -> ConnState {
        ConnState {
            watches: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
        }
    }

    /// Marks a Watch stream as running on this connection until the guard is dropped.
    pub(crate) fn watching(self: &Arc<ConnState>) -> WatchGuard {
        self.watches.fetch_add(1, Ordering::SeqCst);
        WatchGuard(self.clone())
    }

    fn idle_since(&self) -> Instant {
        *self
            .idle_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A Watch stream running on a connection (see [`ConnState::watching`]).
#[derive(Debug)]
pub(crate) struct WatchGuard(Arc<ConnState>);

impl Drop for WatchGuard {
    fn drop(&mut self) {
        *self
            .0
            .idle_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
        self.0.watches.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The connection info tonic puts in each request: the transport's own, plus the shared state.
#[derive(Debug, Clone)]
pub struct ConnInfo<T> {
    /// The transport's connection info (`TcpConnectInfo`, `UdsConnectInfo`).
    pub inner: T,
    pub(crate) state: Arc<ConnState>,
}

/// An accepted connection that counts against the cap while open and closes itself when idle.
#[derive(Debug)]
pub struct Limited<IO> {
    io: IO,
    state: Arc<ConnState>,
    idle_timeout: Duration,
    timer: Pin<Box<Sleep>>,
    _permit: OwnedSemaphorePermit,
}

impl<IO> Limited<IO> {
    /// Whether the connection has been idle too long; registers the timer otherwise.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.state.watches.load(Ordering::SeqCst) > 0 {
            return false;
        }
        let deadline = self.state.idle_since() + self.idle_timeout;
        if self.timer.deadline() != deadline {
            self.timer.as_mut().reset(deadline);
        }
        self.timer.as_mut().poll(cx).is_ready()
    }

    fn idle_error(&self) -> io::Error {
        debug!(
            "closing an API connection idle for {:?} (no Watch stream)",
            self.idle_timeout
        );
        io::Error::new(io::ErrorKind::TimedOut, "idle API connection")
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Limited<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.expired(cx) {
            return Poll::Ready(Err(self.idle_error()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

super::delegate::delegate_async_write!(Limited);

impl<IO: Connected> Connected for Limited<IO> {
    type ConnectInfo = ConnInfo<IO::ConnectInfo>;

    fn connect_info(&self) -> Self::ConnectInfo {
        ConnInfo {
            inner: self.io.connect_info(),
            state: self.state.clone(),
        }
    }
}

/// An accepted connection's peer address, for the refusal log.
pub trait PeerIp {
    /// The remote address; `None` over a Unix socket.
    fn peer_socket_addr(&self) -> Option<SocketAddr>;

    /// The remote IP address; `None` over a Unix socket.
    fn peer_ip(&self) -> Option<IpAddr> {
        self.peer_socket_addr().map(|a| a.ip())
    }
}

impl PeerIp for tokio::net::TcpStream {
    fn peer_socket_addr(&self) -> Option<SocketAddr> {
        self.peer_addr().ok()
    }
}

#[cfg(unix)]
impl PeerIp for tokio::net::UnixStream {
    fn peer_socket_addr(&self) -> Option<SocketAddr> {
        None
    }
}

/// A limited connection's peer is its connection's (the TLS handshake's log names it).
impl<IO: PeerIp> PeerIp for Limited<IO> {
    fn peer_socket_addr(&self) -> Option<SocketAddr> {
        self.io.peer_socket_addr()
    }
}

/// Applies `limits` to a stream of accepted connections: over the cap, a connection is
/// dropped (closed) at once, with a warning the first time for its peer (later ones are
/// summarised in `refusals`); the others are wrapped in [`Limited`].
pub(crate) fn limit<S, IO>(
    incoming: S,
    limits: ConnLimits,
    refusals: Arc<RefusalLog>,
) -> impl Stream<Item = io::Result<Limited<IO>>> + Send + 'static
where
    S: Stream<Item = io::Result<IO>> + Send + 'static,
    IO: PeerIp + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    incoming.filter_map(move |accepted| match accepted {
        Err(e) => Some(Err(e)),
        Ok(io) => match slots.clone().try_acquire_owned() {
            Ok(permit) => Some(Ok(Limited {
                io,
                state: Arc::new(ConnState::new()),
                idle_timeout: limits.idle_timeout,
                timer: Box::pin(tokio::time::sleep(limits.idle_timeout)),
                _permit: permit,
            })),
            Err(_) => {
                let peer = io.peer_ip();
                if refusals.record(peer, Refusal::TooManyConnections) {
                    let from =
                        peer.map_or_else(|| "a Unix-socket client".into(), |ip| ip.to_string());
                    warn!(
                        "closing a new API connection from {from}: {} are open \
                         (--max-connections); further ones from this address are summarised \
                         once a minute",
                        limits.max_connections
                    );
                }
                drop(io);
                None
            }
        },
    })
}

/// The accepted TCP connections of `listener`, with Nagle's algorithm off (`TCP_NODELAY`).
///
/// Why: a change set is one small write that should leave at once. With Nagle on, a small write
/// that follows one the node has not acknowledged yet waits for that acknowledgement, and a node
/// that has just sent something (a window update, the answer to a keepalive ping) delays its
/// acknowledgements, up to 40 ms on Linux. tonic's own listener turns Nagle off by default; ours
/// has to say so because it brings its own listener (for [`limit`]).
pub fn tcp_incoming(listener: tokio::net::TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepted_tcp_connections_send_small_writes_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind on loopback");
        let addr = listener.local_addr().expect("bound address");
        let mut incoming = tcp_incoming(listener);
        let client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let accepted = incoming
            .next()
            .await
            .expect("one connection")
            .expect("accepted");
        assert!(
            accepted.nodelay().expect("read TCP_NODELAY"),
            "the brain's side of a connection must have Nagle off"
        );
        // A plain TCP socket has it on: the test would notice if the option stopped being set.
        assert!(!client.nodelay().expect("read TCP_NODELAY"));
    }
}
