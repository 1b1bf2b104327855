//! The cookie of kpng's own network namespace, for `--socket-lb-host-netns-only`: the
//! programs translate only sockets whose `bpf_get_netns_cookie()` is this one (kpng runs in
//! the node's namespace: `hostNetwork`), and leave pods' sockets to the nftables rules.
//!
//! Why unsafe: the kernel gives a namespace's cookie to userspace only through
//! `getsockopt(SO_NETNS_COOKIE)` (Linux 5.14), which neither std nor the crates kpng uses
//! wrap.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;

/// The network namespace cookie of the calling thread's namespace, as `bpf_get_netns_cookie`
/// gives it to a program for a socket of that namespace. An unbound Unix socket asks: no
/// address or port taken. Fails on kernels before 5.14 (`ENOPROTOOPT`).
pub fn own_cookie() -> io::Result<u64> {
    let socket = UnixDatagram::unbound()?;
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: the fd is open for the call; the kernel writes at most `len` bytes into
    // `cookie`, a u64 of exactly `len` bytes, and the new length into `len`.
    let r = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&raw mut cookie).cast(),
            &raw mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != std::mem::size_of::<u64>() {
        return Err(io::Error::other(format!(
            "SO_NETNS_COOKIE answered {len} bytes, not 8"
        )));
    }
    Ok(cookie)
}

/// Why `--socket-lb-host-netns-only` cannot work here, from [`own_cookie`]'s error.
pub fn unsupported(e: &io::Error) -> String {
    if e.raw_os_error() == Some(libc::ENOPROTOOPT) {
        format!(
            "--socket-lb-host-netns-only needs the network namespace's cookie \
             (getsockopt SO_NETNS_COOKIE, Linux 5.14 or later): {e}"
        )
    } else {
        format!("--socket-lb-host-netns-only: reading this network namespace's cookie: {e}")
    }
}

#[cfg(test)]
mod tests {
    /// The cookie is read and is stable (the same namespace, the same cookie); the kernel
    /// numbers namespaces from 1, so 0 (the programs' "every socket") never is one.
    #[test]
    fn own_cookie_is_stable_and_never_zero() {
        let Ok(first) = super::own_cookie() else {
            return; // a kernel before 5.14: nothing to check
        };
        assert_ne!(first, 0);
        assert_eq!(super::own_cookie().ok(), Some(first));
    }
}
