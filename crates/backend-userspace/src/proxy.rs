//! The proxy itself: one listener per Service port and way in ([`Scope`]), each served by a
//! tokio task the backend owns. Portable: nothing here knows how traffic is captured.
//!
//! - TCP ([`tcp`]): every accepted connection is a task of its own that picks an endpoint,
//!   connects (trying the next endpoint when that fails) and relays with
//!   `tokio::io::copy_bidirectional`. Connection tasks are not tied to their listener: when an
//!   endpoint or the whole Service goes away, established connections run until either side
//!   closes (graceful drain) while new ones go elsewhere.
//! - UDP ([`udp`]): one session per client address, with its own connected upstream socket and a
//!   task relaying replies; sessions end after an idle timeout, or at once when their endpoint
//!   leaves (as kube-proxy clears stale UDP conntrack entries).
//! - Stopping ([`ProxyTasks`]): a listener that is dropped, or every listener when kpng is
//!   asked to stop, first accepts what the kernel already completed, then closes, so no client
//!   whose handshake succeeded is reset. When kpng stops, the connections it accepted are
//!   given a bounded grace to finish ([`ProxyTasks::drain`]).

pub mod pktinfo;
pub mod tcp;
pub mod udp;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kpng_model::{Family, PortKey, Protocol, ServicePort};
use socket2::{Domain, Socket, Type};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::metrics::ProxyMetrics;
use crate::routing::{Routing, Scope};

/// Timeouts of the data path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxySettings {
    /// How long one connection attempt to an endpoint may take before the next is tried.
    pub connect_timeout: Duration,
    /// How long a UDP session lives without a datagram in either direction.
    pub udp_idle_timeout: Duration,
}

impl Default for ProxySettings {
    fn default() -> Self {
        ProxySettings {
            connect_timeout: Duration::from_secs(2),
            udp_idle_timeout: Duration::from_secs(30),
        }
    }
}

/// What every listener of one Service port shares with the backend.
#[derive(Debug)]
pub struct PortShared {
    /// `namespace/name:port/PROTO (family)`, for logs.
    pub name: String,
    routing: Mutex<Routing>,
    /// Bumped on every update, so UDP listeners re-check their sessions' endpoints.
    generation: AtomicU64,
    metrics: ProxyMetrics,
}

impl PortShared {
    /// Shared state for one Service port.
    pub fn new(sp: &ServicePort, metrics: ProxyMetrics) -> PortShared {
        let shared = PortShared {
            name: sp.key.to_string(),
            routing: Mutex::new(Routing::default()),
            generation: AtomicU64::new(0),
            metrics,
        };
        shared.update(sp);
        shared
    }

    /// Applies a new state of the port; new connections see it at once.
    pub fn update(&self, sp: &ServicePort) {
        if let Ok(mut r) = self.routing.lock() {
            r.update(sp);
        }
        self.generation.fetch_add(1, Ordering::Release);
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn candidates(&self, scope: Scope) -> usize {
        self.routing
            .lock()
            .map(|r| r.candidates(scope))
            .unwrap_or(0)
    }

    fn pick(&self, scope: Scope, client: IpAddr) -> Option<SocketAddr> {
        let now = Instant::now();
        self.routing.lock().ok()?.pick(scope, client, now)
    }

    fn failed(&self, scope: Scope, client: IpAddr, endpoint: SocketAddr) {
        self.metrics.connect_failures.inc();
        if let Ok(mut r) = self.routing.lock() {
            r.failed(scope, client, endpoint);
        }
    }

    /// The endpoints a new connection of `client` through `scope` may go to (the conformance
    /// harness reads where a listener sends traffic).
    #[cfg(test)]
    pub fn endpoints(&self, scope: Scope, client: IpAddr) -> Vec<SocketAddr> {
        self.routing
            .lock()
            .map(|r| r.endpoints(scope, client, Instant::now()))
            .unwrap_or_default()
    }

    /// The endpoint a new connection of `client` through `scope` goes to, picked as a
    /// listener picks it (the conformance harness makes connections one after the other).
    #[cfg(test)]
    pub fn connect(&self, scope: Scope, client: IpAddr) -> Option<SocketAddr> {
        self.pick(scope, client)
    }

    fn serves(&self, scope: Scope, endpoint: SocketAddr) -> bool {
        self.routing
            .lock()
            .map(|r| r.serves(scope, endpoint))
            .unwrap_or(false)
    }
}

/// A task that is aborted when this is dropped.
#[derive(Debug)]
pub struct TaskGuard(JoinHandle<()>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Every task of the proxy, so that they can be stopped together and awaited: the listeners
/// (each stops on a child of `stop`) and the TCP connections they accepted.
#[derive(Debug, Clone, Default)]
pub struct ProxyTasks {
    stop: CancellationToken,
    listeners: TaskTracker,
    connections: TaskTracker,
}

impl ProxyTasks {
    /// Stops every listener (each accepts what the kernel already completed, then closes) and
    /// waits, at most `grace` in all, for the connections accepted until then to end: idle ones
    /// end at once, ones awaiting an answer when they get it (`tcp::relay`). What is still
    /// open after `grace` is cut when the process exits; the log says how many.
    pub fn drain(&self, grace: Duration) -> impl Future<Output = ()> + Send + 'static {
        let tasks = self.clone();
        async move {
            let deadline = Instant::now() + grace;
            tasks.stop.cancel();
            if grace.is_zero() {
                // `--drain-on-exit 0`: everything is cut at the exit, as asked.
                return;
            }
            tasks.listeners.close();
            tasks.connections.close();
            // Listeners only take their accept queue before they end: quick.
            if tokio::time::timeout_at(deadline, tasks.listeners.wait())
                .await
                .is_err()
            {
                warn!("the proxy's listeners did not stop within {grace:?}");
            }
            let open = tasks.connections.len();
            if open == 0 {
                return;
            }
            info!(
                connections = open,
                "waiting up to {grace:?} for accepted connections to end"
            );
            match tokio::time::timeout_at(deadline, tasks.connections.wait()).await {
                Ok(()) => info!("every accepted connection ended"),
                Err(_) => warn!(
                    connections = tasks.connections.len(),
                    "cutting the connections still open after {grace:?}"
                ),
            }
        }
    }

    /// Cancelled when kpng stops (not when one listener closes): what a connection watches to
    /// end once it is idle.
    fn stopping(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Spawns one accepted connection's task, awaited by [`ProxyTasks::drain`].
    fn spawn_connection(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.connections.spawn(task);
    }
}

/// A bound listener and the task serving it; dropping it stops the task, which accepts what
/// the kernel already completed and closes the socket (established TCP connections continue).
#[derive(Debug)]
pub struct Listener {
    /// The port the OS gave the listener: what the capture redirects to.
    pub port: u16,
    /// Stops the task when dropped; `None` for a [`Listener::planned`] one.
    _stop: Option<DropGuard>,
}

impl Listener {
    /// A listener that is not opened: a dry run shows the capture that would redirect to
    /// `port` without binding anything on the node.
    pub fn planned(port: u16) -> Listener {
        Listener { port, _stop: None }
    }
}

/// Binds a listener for one Service port (`key`) and way in, on every address of its family,
/// and starts serving it on `runtime`. It takes the `preferred` port when that is free (the
/// port a previous run used), else one the OS chooses.
pub fn listen(
    runtime: &Handle,
    tasks: &ProxyTasks,
    key: &PortKey,
    scope: Scope,
    shared: Arc<PortShared>,
    settings: ProxySettings,
    preferred: Option<u16>,
) -> std::io::Result<Listener> {
    let (family, protocol) = (key.family, key.protocol);
    let socket = match preferred {
        Some(port) => bind(family, protocol, port).or_else(|_| bind(family, protocol, 0))?,
        None => bind(family, protocol, 0)?,
    };
    let _entered = runtime.enter();
    let stop = tasks.stop.child_token();
    let port = match protocol {
        Protocol::Udp => {
            let udp = tokio::net::UdpSocket::from_std(socket.into())?;
            let port = udp.local_addr()?.port();
            let serve = udp::serve(udp, shared, scope, settings, stop.clone());
            tasks.listeners.spawn_on(serve, runtime);
            port
        }
        _ => {
            socket.listen(1024)?;
            let tcp = tokio::net::TcpListener::from_std(socket.into())?;
            let port = tcp.local_addr()?.port();
            let serve = tcp::serve(tcp, shared, scope, settings, stop.clone(), tasks.clone());
            tasks.listeners.spawn_on(serve, runtime);
            port
        }
    };
    Ok(Listener {
        port,
        _stop: Some(stop.drop_guard()),
    })
}

/// A non-blocking socket bound to every address of `family` on `port` (0: the OS chooses).
fn bind(family: Family, protocol: Protocol, port: u16) -> std::io::Result<Socket> {
    let (domain, any) = match family {
        Family::V4 => (Domain::IPV4, IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        Family::V6 => (Domain::IPV6, IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
    };
    let ty = match protocol {
        Protocol::Udp => Type::DGRAM,
        _ => Type::STREAM,
    };
    let socket = Socket::new(domain, ty, None)?;
    if family == Family::V6 {
        socket.set_only_v6(true)?;
    }
    if ty == Type::STREAM {
        // A port the previous run used may still have connections in TIME_WAIT. (Never for
        // UDP, where it would let two sockets share a port.)
        socket.set_reuse_address(true)?;
    } else {
        // Replies leave from the address each datagram was redirected to (see `pktinfo`).
        pktinfo::enable(&socket, family == Family::V6)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&SocketAddr::new(any, port).into())?;
    Ok(socket)
}
