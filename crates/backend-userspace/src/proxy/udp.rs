//! UDP: sessions by client address, one connected upstream socket each.
//!
//! Client datagrams arrive on the listener socket and go out on the session's upstream socket
//! (connected to the endpoint, so the kernel filters what comes back); a task per session
//! relays the endpoint's replies to the client from the listener socket. The listener is bound
//! to every address, so each reply names its source explicitly: the address the client's
//! datagrams were redirected to (their [`Arrival`], on Linux), which conntrack maps back to
//! the VIP. The kernel's own choice of source need not be that address (a node-side pod
//! interface with only an IPv6 link-local address: the reply left from a global node address
//! and never reached the client as the VIP's).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::net::UdpSocket;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::pktinfo::{self, Arrival};
use super::{PortShared, ProxySettings, TaskGuard};
use crate::routing::Scope;
use crate::sessions::SessionTable;

/// The largest UDP payload.
const MAX_DATAGRAM: usize = 65_536;

/// What the reply task of a session tells the listener.
#[derive(Debug)]
struct ReplyState {
    /// The clock origin of `last_reply_ms`.
    origin: Instant,
    /// Milliseconds after `origin` of the last reply (0: none yet).
    last_reply_ms: AtomicU64,
    /// The endpoint refused (ICMP port unreachable) or the socket failed: start over.
    closed: AtomicBool,
    /// Where the client's latest datagram arrived: where replies leave from (`None`: where
    /// the kernel chooses, off Linux).
    arrival: Mutex<Option<Arrival>>,
}

impl ReplyState {
    /// Where replies leave from.
    fn arrival(&self) -> Option<Arrival> {
        self.arrival.lock().map(|a| *a).unwrap_or(None)
    }

    /// Notes where the client's datagram arrived (a lock only when it changed).
    fn arrived(&self, arrival: Option<Arrival>) {
        if self.arrival() != arrival
            && let Ok(mut a) = self.arrival.lock()
        {
            *a = arrival;
        }
    }

    fn replied_at(&self) -> Option<Instant> {
        match self.last_reply_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(self.origin + Duration::from_millis(ms)),
        }
    }
}

/// One session's upstream.
#[derive(Debug)]
struct Upstream {
    socket: Arc<UdpSocket>,
    state: Arc<ReplyState>,
    _replies: TaskGuard,
}

/// This listener's share of the session gauge, given back when the listener goes.
struct Counted {
    gauge: Gauge,
    n: i64,
}

impl Counted {
    fn set(&mut self, live: usize) {
        let live = i64::try_from(live).unwrap_or(i64::MAX);
        self.gauge.inc_by(live - self.n);
        self.n = live;
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.gauge.dec_by(self.n);
    }
}

/// How often idle sessions are looked for: a fraction of the timeout, within bounds.
fn sweep_period(idle: Duration) -> Duration {
    (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(5))
}

/// Serves one UDP listener until `stop`; its sessions end with it.
pub async fn serve(
    listener: UdpSocket,
    shared: Arc<PortShared>,
    scope: Scope,
    settings: ProxySettings,
    stop: CancellationToken,
) {
    let listener = Arc::new(listener);
    let mut table: SessionTable<Upstream> = SessionTable::new(settings.udp_idle_timeout);
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut generation = shared.generation();
    let mut sweep = tokio::time::interval(sweep_period(settings.udp_idle_timeout));
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut counted = Counted {
        gauge: shared.metrics.udp_sessions.clone(),
        n: 0,
    };
    loop {
        tokio::select! {
            // Its sessions end with it: a datagram has no connection to finish.
            () = stop.cancelled() => break,
            received = pktinfo::recv(&listener, &mut buf) => {
                let (n, client, arrival) = match received {
                    Ok(r) => r,
                    Err(e) => {
                        debug!(port = %shared.name, "receive failed: {e}");
                        continue;
                    }
                };
                let current = shared.generation();
                if current != generation {
                    generation = current;
                    let gone = table.retain_endpoints(|ep| shared.serves(scope, ep));
                    if !gone.is_empty() {
                        debug!(port = %shared.name, sessions = gone.len(), "ended sessions of endpoints that left");
                    }
                }
                if let Some(upstream) = session(&mut table, &listener, &shared, scope, client, arrival).await
                    && let Err(e) = upstream.send(&buf[..n]).await
                {
                    debug!(port = %shared.name, %client, "forwarding a datagram failed: {e}");
                }
            }
            _ = sweep.tick() => {
                table.expire(Instant::now(), |u| u.state.replied_at());
            }
        }
        counted.set(table.len());
    }
}

/// The upstream socket of `client`'s session, starting one when there is none (or the last
/// one's endpoint refused); `None` when no endpoint serves the client.
async fn session(
    table: &mut SessionTable<Upstream>,
    listener: &Arc<UdpSocket>,
    shared: &Arc<PortShared>,
    scope: Scope,
    client: SocketAddr,
    arrival: Option<Arrival>,
) -> Option<Arc<UdpSocket>> {
    let now = Instant::now();
    let who = client.ip();
    if let Some(s) = table.touch(client, now) {
        if !s.value.state.closed.load(Ordering::Relaxed) {
            s.value.state.arrived(arrival);
            return Some(s.value.socket.clone());
        }
        shared.failed(scope, who, s.endpoint);
    }
    let Some(endpoint) = shared.pick(scope, who) else {
        shared.metrics.unserved.inc();
        return None;
    };
    let socket = match upstream_socket(endpoint).await {
        Ok(s) => Arc::new(s),
        Err(e) => {
            debug!(port = %shared.name, %endpoint, "cannot open an upstream socket: {e}");
            shared.failed(scope, who, endpoint);
            return None;
        }
    };
    let state = Arc::new(ReplyState {
        origin: now,
        last_reply_ms: AtomicU64::new(0),
        closed: AtomicBool::new(false),
        arrival: Mutex::new(arrival),
    });
    let replies = tokio::spawn(relay_replies(
        socket.clone(),
        listener.clone(),
        client,
        state.clone(),
    ));
    table.insert(
        client,
        endpoint,
        Upstream {
            socket: socket.clone(),
            state,
            _replies: TaskGuard(replies),
        },
        now,
    );
    Some(socket)
}

async fn upstream_socket(endpoint: SocketAddr) -> std::io::Result<UdpSocket> {
    let any = match endpoint.ip() {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    let socket = UdpSocket::bind(SocketAddr::new(any, 0)).await?;
    socket.connect(endpoint).await?;
    Ok(socket)
}

/// Relays the endpoint's datagrams to the client until the session ends (the task is aborted)
/// or the endpoint refuses.
async fn relay_replies(
    upstream: Arc<UdpSocket>,
    listener: Arc<UdpSocket>,
    client: SocketAddr,
    state: Arc<ReplyState>,
) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        match upstream.recv(&mut buf).await {
            Ok(n) => {
                let ms = state.origin.elapsed().as_millis().max(1);
                state
                    .last_reply_ms
                    .store(u64::try_from(ms).unwrap_or(u64::MAX), Ordering::Relaxed);
                let from = state.arrival();
                if let Err(e) = pktinfo::send(&listener, &buf[..n], client, from).await {
                    debug!(%client, "relaying a reply failed: {e}");
                }
            }
            Err(e) => {
                debug!(%client, "upstream socket failed: {e}");
                state.closed.store(true, Ordering::Relaxed);
                return;
            }
        }
    }
}
