//! How kube-proxy's HTTP servers (health and metrics) bind their address, as kube-proxy's Go
//! code binds it, so that a node configured for kube-proxy gets the same reachability:
//!
//! - an unspecified address (`0.0.0.0`, the health server's default, or `[::]`) is one IPv6
//!   socket that also accepts IPv4 (`IPV6_V6ONLY` off), as Go's `net.Listen("tcp", …)` makes
//!   it: the default `0.0.0.0:10256` then answers on an IPv6-only node too. Without IPv6 it
//!   is an IPv4 socket;
//! - an address this node does not have (yet: a node IP that DHCP has not given, `127.0.0.1`
//!   on a node without it) is not fatal: kube-proxy logs the failure and tries again every 5 s,
//!   and so does kpng. A port another process holds stays fatal at start: on a node that is
//!   almost always a second proxy (kube-proxy not stopped yet), and two proxies fight.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};

/// How often an address the node does not have is tried again (kube-proxy's `wait.Until`
/// period for its servers).
const RETRY: Duration = Duration::from_secs(5);

/// A server's listener: bound at start, or still waiting for its address to appear.
pub enum Listener {
    /// Bound.
    Bound(TcpListener),
    /// The address is not on this node yet; [`Listener::ready`] binds it once it is.
    Waiting {
        /// The address to bind.
        addr: SocketAddr,
        /// What the server is, for the log (`the health server (--healthz-bind-address)`).
        what: &'static str,
    },
}

impl Listener {
    /// Binds `addr` for `what` (a server and its flag, for messages). Errors other than an
    /// address this node does not have fail the start.
    pub fn bind(addr: SocketAddr, what: &'static str) -> anyhow::Result<Listener> {
        match bind_like_go(addr) {
            Ok(listener) => Ok(Listener::Bound(listener)),
            Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable => {
                tracing::error!(
                    "cannot bind {what} to {addr}: {e}; this node does not have that address \
                     (yet): trying again every {}s, as kube-proxy does",
                    RETRY.as_secs()
                );
                Ok(Listener::Waiting { addr, what })
            }
            Err(e) => Err(anyhow::Error::new(e).context(format!("binding {what} to {addr}"))),
        }
    }

    /// The bound listener: at once, or once its address appears on the node. Other errors
    /// while waiting end the wait (and the server) with that error.
    pub async fn ready(self) -> io::Result<TcpListener> {
        let (addr, what) = match self {
            Listener::Bound(listener) => return Ok(listener),
            Listener::Waiting { addr, what } => (addr, what),
        };
        loop {
            tokio::time::sleep(RETRY).await;
            match bind_like_go(addr) {
                Ok(listener) => {
                    tracing::info!("{addr} is on this node now: {what} is bound");
                    return Ok(listener);
                }
                Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Binds `addr` as Go's `net.Listen("tcp", addr)` does (module docs): an unspecified address is
/// a dual-stack IPv6 socket when the system has IPv6, else IPv4.
fn bind_like_go(addr: SocketAddr) -> io::Result<TcpListener> {
    if addr.ip().is_unspecified() {
        let any6 = SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), addr.port());
        match listen(any6, true) {
            Ok(listener) => return Ok(listener),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => return Err(e),
            // No IPv6 on this system (not in the kernel, or disabled): IPv4 alone.
            Err(_) => {
                let any4 = SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), addr.port());
                return listen(any4, false);
            }
        }
    }
    listen(addr, false)
}

/// A listening socket on `addr` with `SO_REUSEADDR` (as Go's listeners), accepting IPv4 as
/// well when `dual_stack` (an IPv6 `addr` only).
fn listen(addr: SocketAddr, dual_stack: bool) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    if dual_stack {
        socket2::SockRef::from(&socket).set_only_v6(false)?;
    }
    socket.bind(addr)?;
    socket.listen(1024)
}
