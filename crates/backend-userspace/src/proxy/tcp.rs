//! TCP: accept, pick an endpoint, connect, relay.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::{PortShared, ProxySettings, ProxyTasks};
use crate::routing::Scope;

/// At most this many endpoints are tried for one connection.
const MAX_ATTEMPTS: usize = 3;

/// When kpng stops, a connection that is not awaiting an answer (its endpoint spoke last, or
/// nobody has spoken yet) and has moved nothing for this long is between exchanges (an idle
/// keep-alive, a held session, a pooled connection not used yet): it ends at once instead of
/// holding the stop for its whole grace. Long enough for the gaps inside one answer, and for a
/// client that just connected to send its request.
const QUIET_AT_STOP: Duration = Duration::from_millis(100);

/// Pause after a failed `accept` (e.g. out of file descriptors), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Accepts connections until `stop`; then takes what the kernel already accepted and closes
/// the listener (see `take_accepted`). Each connection is a task of `tasks`.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<PortShared>,
    scope: Scope,
    settings: ProxySettings,
    stop: CancellationToken,
    tasks: ProxyTasks,
) {
    let accepted = |stream: TcpStream, peer: SocketAddr| {
        shared.metrics.tcp_accepted.inc();
        let stopping = tasks.stopping();
        tasks.spawn_connection(relay(
            stream,
            peer,
            shared.clone(),
            scope,
            settings,
            stopping,
        ));
    };
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            next = listener.accept() => match next {
                Ok((stream, peer)) => accepted(stream, peer),
                Err(e) => {
                    warn!(port = %shared.name, "accept failed: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
        }
    }
    let taken = take_accepted(listener, accepted);
    if taken > 0 {
        debug!(port = %shared.name, connections = taken, "took the accept queue before closing");
    }
}

/// Accepts, without waiting, every connection whose handshake the kernel already completed,
/// hands each to `serve`, and closes the listener; returns how many there were. Closing a
/// listening socket resets what is still in its queue, and those clients had been told
/// the connection was open; a SYN that arrives after the close is refused, which a client
/// retries or reports plainly. Only a handshake completing between the last accept and the
/// close (a few microseconds) is still reset.
fn take_accepted(listener: TcpListener, mut serve: impl FnMut(TcpStream, SocketAddr)) -> usize {
    let listener = match listener.into_std() {
        Ok(l) => l,
        Err(e) => {
            debug!("closing a listener without taking its queue: {e}");
            return 0;
        }
    };
    let mut taken = 0;
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                // Accepted sockets do not inherit the listener's non-blocking mode.
                let stream = stream
                    .set_nonblocking(true)
                    .and_then(|()| TcpStream::from_std(stream));
                match stream {
                    Ok(stream) => {
                        serve(stream, peer);
                        taken += 1;
                    }
                    Err(e) => debug!(%peer, "dropping a queued connection: {e}"),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return taken,
            // The client already gave up (ECONNABORTED): the next one may be fine.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionAborted => {}
            Err(e) => {
                debug!("taking the accept queue: {e}");
                return taken;
            }
        }
    }
}

/// Counts one relayed connection for as long as it lives.
struct Active(Gauge);

impl Active {
    fn new(gauge: &Gauge) -> Active {
        gauge.inc();
        Active(gauge.clone())
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// One client connection: connects to an endpoint and copies both ways until both sides are
/// done. Not tied to the listener: it outlives endpoint and Service removals (drain). When kpng
/// stops (`stopping`), it still runs while an answer may be on its way (its client spoke last),
/// and ends once it is quiet otherwise ([`QUIET_AT_STOP`]).
async fn relay(
    client: TcpStream,
    peer: SocketAddr,
    shared: Arc<PortShared>,
    scope: Scope,
    settings: ProxySettings,
    stopping: CancellationToken,
) {
    let Some(mut upstream) = connect(&shared, scope, peer.ip(), settings).await else {
        shared.metrics.unserved.inc();
        // Reset rather than close: the client learns at once that nothing serves it.
        let _ = client.set_zero_linger();
        return;
    };
    let _active = Active::new(&shared.metrics.tcp_active);
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let activity = Activity::new();
    let mut client = Watched {
        stream: client,
        activity: &activity,
    };
    tokio::select! {
        copied = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {
            if let Err(e) = copied {
                debug!(port = %shared.name, %peer, "connection ended: {e}");
            }
        }
        () = between_exchanges_after(&stopping, &activity) => {
            debug!(port = %shared.name, %peer, "ended an idle connection: kpng is stopping");
        }
    }
}

/// Resolves once `stopping` is cancelled and the connection is between exchanges.
async fn between_exchanges_after(stopping: &CancellationToken, activity: &Activity) {
    stopping.cancelled().await;
    loop {
        match activity.quiet_unless_awaiting_an_answer() {
            Some(quiet) if quiet >= QUIET_AT_STOP => return,
            Some(quiet) => tokio::time::sleep(QUIET_AT_STOP - quiet).await,
            None => tokio::time::sleep(QUIET_AT_STOP).await,
        }
    }
}

/// Who moved bytes last on a relayed connection, and when.
struct Activity {
    epoch: Instant,
    /// Milliseconds from `epoch` to the last byte either way.
    last_ms: AtomicU64,
    /// Whether the client sent the last bytes (it awaits an answer).
    client_last: AtomicBool,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            epoch: Instant::now(),
            last_ms: AtomicU64::new(0),
            client_last: AtomicBool::new(false),
        }
    }

    fn moved(&self, by_endpoint: bool) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
        self.client_last.store(!by_endpoint, Ordering::Relaxed);
    }

    /// How long nothing moved (since the connection was made, if nothing ever did); `None`
    /// while the client awaits an answer (it spoke last).
    fn quiet_unless_awaiting_an_answer(&self) -> Option<Duration> {
        if self.client_last.load(Ordering::Relaxed) {
            return None;
        }
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        Some(self.epoch.elapsed().saturating_sub(last))
    }
}

/// The client side of a relay, noting in `activity` each read (the client spoke) and write
/// (the endpoint's bytes reached the client).
struct Watched<'a> {
    stream: TcpStream,
    activity: &'a Activity,
}

impl AsyncRead for Watched<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.moved(false);
        }
        polled
    }
}

impl AsyncWrite for Watched<'_> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.moved(true);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Connects to an endpoint, trying the next one when a connect fails or times out.
async fn connect(
    shared: &PortShared,
    scope: Scope,
    who: IpAddr,
    settings: ProxySettings,
) -> Option<TcpStream> {
    let attempts = shared.candidates(scope).min(MAX_ATTEMPTS);
    for _ in 0..attempts {
        let endpoint = shared.pick(scope, who)?;
        match tokio::time::timeout(settings.connect_timeout, TcpStream::connect(endpoint)).await {
            Ok(Ok(stream)) => return Some(stream),
            Ok(Err(e)) => debug!(port = %shared.name, %endpoint, "connect failed: {e}"),
            Err(_) => debug!(port = %shared.name, %endpoint, "connect timed out"),
        }
        shared.failed(scope, who, endpoint);
    }
    None
}
