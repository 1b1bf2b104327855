//! The node's interface addresses, watched: an address the node gains or loses (a VIP that
//! keepalived moves in, a DHCP lease, a second NIC) changes where CIDR `--nodeport-addresses`
//! and "every local address" node ports are served, and where their health checks listen.
//! Backends read the addresses at full and periodic syncs; without this watch such a change
//! took effect only at the next periodic sync (up to `--sync-period`, 30 s by default).
//!
//! A thread listens on a `NETLINK_ROUTE` socket to the kernel's address groups, lets a burst
//! settle, reads the addresses again (with the reader the backends use, so both agree on what
//! "changed" means) and reports only a real change: the kernel also announces an address whose
//! lifetimes were refreshed (every IPv6 router advertisement), which changes nothing, and
//! link-local addresses are left out ([`without_link_local`]: every pod's veth brings one).

use std::io;
use std::net::IpAddr;
use std::time::Duration;

use netlink_sys::protocols::NETLINK_ROUTE;
use netlink_sys::{Socket, SocketAddr};
use tracing::{debug, warn};

use crate::address_change::{AddressChange, without_link_local};

/// `RTMGRP_IPV4_IFADDR`: the kernel's IPv4 address notifications.
const RTMGRP_IPV4_IFADDR: u32 = 0x10;
/// `RTMGRP_IPV6_IFADDR`: the kernel's IPv6 address notifications.
const RTMGRP_IPV6_IFADDR: u32 = 0x100;
/// `ENOBUFS`: the socket's queue overflowed and notifications were dropped.
const ENOBUFS: i32 = 105;
/// How long a burst of notifications (`ip addr flush`, an interface coming up with several
/// addresses) may last and still be one change.
const SETTLE: Duration = Duration::from_millis(100);

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
    let mut last = without_link_local(read());
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
                let now = without_link_local(read());
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
