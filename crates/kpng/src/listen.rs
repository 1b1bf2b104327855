//! How kube-proxy's HTTP servers (health and metrics) bind their address, as kube-proxy's Go
//! code binds it, so that a node configured for kube-proxy gets the same reachability:
//!
//! - an unspecified address (`0.0.0.0`, the health server's default, or `[::]`) is one IPv6
//!   socket that also accepts IPv4 (`IPV6_V6ONLY` off), as Go's `net.Listen("tcp", …)` makes
//!   it: the default `0.0.0.0:10256` then answers on an IPv6-only node too. Without IPv6 it
//!   is an IPv4 socket;
//! - a failure to bind (a port another process holds, an address this node does not have yet:
//!   a node IP that DHCP has not given, `127.0.0.1` on a node without it) is decided by
//!   kube-proxy's `bindAddressHardFail` (`--bind-address-hard-fail`), as kube-proxy decides it:
//!   `true` ends kpng at start, whatever the cause; `false` (kube-proxy's default) logs the
//!   failure and tries again every 5 s while kpng runs on, whatever the cause, so a port that
//!   a stopping proxy still holds is taken once it lets go. Until 2026-12-07 kpng ignored the
//!   setting and decided by the cause (a held port ended kpng, a missing address was retried).

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};

/// How often a server that could not bind tries again (kube-proxy's `wait.Until` period for
/// its servers).
const RETRY: Duration = Duration::from_secs(5);

/// Where a server listens, and what a failure to bind it does.
#[derive(Debug, Clone, Copy)]
pub struct BindTo {
    /// The address to listen on.
    pub addr: SocketAddr,
    /// `bindAddressHardFail`: a failure ends kpng at start, instead of being tried again.
    pub hard_fail: bool,
}

/// A server's listener: bound at start, or still trying to bind.
pub enum Listener {
    /// Bound.
    Bound(TcpListener),
    /// Binding failed (without `bindAddressHardFail`); [`Listener::ready`] tries again.
    Waiting {
        /// The address to bind.
        addr: SocketAddr,
        /// What the server is, for the log (`the health server (--healthz-bind-address)`).
        what: &'static str,
        /// Why the first bind failed, as logged (for the Node Event kube-proxy posts).
        failure: String,
    },
}

impl Listener {
    /// Binds `to.addr` for `what` (a server and its flag, for messages). With `to.hard_fail`
    /// (`bindAddressHardFail`) any failure fails the start; without it the failure is logged
    /// and [`Listener::ready`] tries again.
    pub fn bind(to: BindTo, what: &'static str) -> anyhow::Result<Listener> {
        let BindTo { addr, hard_fail } = to;
        match bind_like_go(addr) {
            Ok(listener) => Ok(Listener::Bound(listener)),
            Err(e) if hard_fail => Err(anyhow::Error::new(e).context(format!(
                "binding {what} to {addr} (bindAddressHardFail, --bind-address-hard-fail: a \
                 server that cannot bind ends kpng, as it ends kube-proxy)"
            ))),
            Err(e) => {
                let failure = format!("cannot bind {what} to {addr}: {e}{}", cause(&e));
                tracing::error!(
                    "{failure}: trying again every {}s while kpng runs on, as kube-proxy does \
                     with bindAddressHardFail false (--bind-address-hard-fail=true ends kpng \
                     instead)",
                    RETRY.as_secs()
                );
                Ok(Listener::Waiting {
                    addr,
                    what,
                    failure,
                })
            }
        }
    }

    /// Why binding failed at start (`None`: bound), as the log said it.
    pub fn failure(&self) -> Option<&str> {
        match self {
            Listener::Bound(_) => None,
            Listener::Waiting { failure, .. } => Some(failure),
        }
    }

    /// The bound listener: at once, or once binding succeeds (tried every [`RETRY`]; a
    /// failure that changes is logged again).
    pub async fn ready(self) -> TcpListener {
        let (addr, what) = match self {
            Listener::Bound(listener) => return listener,
            Listener::Waiting { addr, what, .. } => (addr, what),
        };
        let mut last: Option<io::ErrorKind> = None;
        loop {
            tokio::time::sleep(RETRY).await;
            match bind_like_go(addr) {
                Ok(listener) => {
                    tracing::info!("{what} is bound to {addr} now");
                    return listener;
                }
                Err(e) => {
                    if last.is_some_and(|k| k != e.kind()) {
                        tracing::error!(
                            "cannot bind {what} to {addr}: {e}{}: trying again every {}s",
                            cause(&e),
                            RETRY.as_secs()
                        );
                    }
                    last = Some(e.kind());
                }
            }
        }
    }
}

/// What a bind failure usually means on a node, for the log.
fn cause(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::AddrInUse => {
            " (another process holds the port: often a proxy not stopped yet, and two proxies \
             on one node fight)"
        }
        io::ErrorKind::AddrNotAvailable => " (this node does not have that address yet)",
        _ => "",
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
