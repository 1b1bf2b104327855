//! The node's interface addresses, watched: an address the node gains or loses (a VIP that
//! keepalived moves in, a DHCP lease, a second NIC) changes where CIDR `--nodeport-addresses`
//! and "every local address" node ports are served, and where their health checks listen.
//! Backends read the addresses at full and periodic syncs; without this watch such a change
//! took effect only at the next periodic sync (up to `--sync-period`, 30 s by default).
//!
//! A thread listens on a `NETLINK_ROUTE` socket to the kernel's address groups, lets a burst
//! settle, reads the addresses again (with the reader the backends use, so both agree on what
//! "changed" means) and reports only a real change: the kernel also announces an address whose
//! lifetimes were refreshed (every IPv6 router advertisement), which changes nothing.

use std::io;
use std::net::IpAddr;
use std::time::Duration;

use netlink_sys::protocols::NETLINK_ROUTE;
use netlink_sys::{Socket, SocketAddr};
use tracing::{debug, warn};

/// `RTMGRP_IPV4_IFADDR`: the kernel's IPv4 address notifications.
const RTMGRP_IPV4_IFADDR: u32 = 0x10;
/// `RTMGRP_IPV6_IFADDR`: the kernel's IPv6 address notifications.
const RTMGRP_IPV6_IFADDR: u32 = 0x100;
/// `ENOBUFS`: the socket's queue overflowed and notifications were dropped.
const ENOBUFS: i32 = 105;
/// How long a burst of notifications (`ip addr flush`, an interface coming up with several
/// addresses) may last and still be one change.
const SETTLE: Duration = Duration::from_millis(100);

/// Addresses the node gained and lost, as one report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressChange {
    /// New addresses, sorted.
    pub added: Vec<IpAddr>,
    /// Addresses gone, sorted.
    pub removed: Vec<IpAddr>,
}

impl AddressChange {
    /// The difference from `was` to `now` (both sorted); `None` when they are the same.
    pub fn between(was: &[IpAddr], now: &[IpAddr]) -> Option<AddressChange> {
        let added: Vec<IpAddr> = now.iter().filter(|a| !was.contains(a)).copied().collect();
        let removed: Vec<IpAddr> = was.iter().filter(|a| !now.contains(a)).copied().collect();
        (!added.is_empty() || !removed.is_empty()).then_some(AddressChange { added, removed })
    }
}

impl std::fmt::Display for AddressChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |ips: &[IpAddr]| {
            ips.iter()
                .map(IpAddr::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        match (self.added.is_empty(), self.removed.is_empty()) {
            (false, true) => write!(f, "gained {}", list(&self.added)),
            (true, false) => write!(f, "lost {}", list(&self.removed)),
            _ => write!(
                f,
                "gained {}, lost {}",
                list(&self.added),
                list(&self.removed)
            ),
        }
    }
}

/// Starts the watch on a thread of its own, which calls `on_change` with each change; the
/// thread ends at the first change `on_change` answers `false` to (its receiver is gone).
///
/// # Errors
/// When the route socket cannot be opened or joined to the address groups (the caller then
/// relies on periodic syncs, as before).
pub fn watch(
    on_change: impl Fn(AddressChange) -> bool + Send + 'static,
    mut read: impl FnMut() -> Vec<IpAddr> + Send + 'static,
) -> io::Result<()> {
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind(&SocketAddr::new(0, RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR))?;
    // Joined before the first read: a change between the two is seen, not lost.
    let mut last = sorted(read());
    std::thread::Builder::new()
        .name("kpng-addresses".into())
        .spawn(move || {
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                match socket.recv(&mut &mut buffer[..], 0) {
                    Ok(_) => {}
                    // ENOBUFS: notifications were dropped; the read below covers them.
                    Err(e) if e.raw_os_error() == Some(ENOBUFS) => {}
                    Err(e) => {
                        warn!(
                            "watching the node's addresses stopped ({e}); a change is seen at \
                             the next periodic sync"
                        );
                        return;
                    }
                }
                std::thread::sleep(SETTLE);
                drain(&mut socket, &mut buffer);
                let now = sorted(read());
                if let Some(change) = AddressChange::between(&last, &now) {
                    if !on_change(change) {
                        return;
                    }
                    last = now;
                } else {
                    debug!("an address notification that changed no address");
                }
            }
        })?;
    Ok(())
}

/// Discards the notifications that queued up while the burst settled.
fn drain(socket: &mut Socket, buffer: &mut [u8]) {
    if socket.set_non_blocking(true).is_err() {
        return;
    }
    while let Ok(n) = socket.recv(&mut &mut buffer[..], 0) {
        if n == 0 {
            break;
        }
    }
    let _ = socket.set_non_blocking(false);
}

fn sorted(mut ips: Vec<IpAddr>) -> Vec<IpAddr> {
    ips.sort();
    ips.dedup();
    ips
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|s| s.parse().expect("ip")).collect()
    }

    #[test]
    fn a_change_is_what_came_and_what_went() {
        let table = [
            ("same", ips(&["10.0.0.1"]), ips(&["10.0.0.1"]), None),
            (
                "gained",
                ips(&["10.0.0.1"]),
                ips(&["10.0.0.1", "10.0.0.9"]),
                Some("gained 10.0.0.9"),
            ),
            (
                "lost",
                ips(&["10.0.0.1", "fd00::1"]),
                ips(&["10.0.0.1"]),
                Some("lost fd00::1"),
            ),
            (
                "moved",
                ips(&["10.0.0.1"]),
                ips(&["10.0.0.2"]),
                Some("gained 10.0.0.2, lost 10.0.0.1"),
            ),
        ];
        for (what, was, now, want) in table {
            let got = AddressChange::between(&was, &now).map(|c| c.to_string());
            assert_eq!(got.as_deref(), want, "{what}");
        }
    }
}
