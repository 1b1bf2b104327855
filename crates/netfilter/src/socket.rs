//! The raw `AF_NETLINK` socket: the only unsafe code of the crate's netlink path.
//!
//! Why unsafe: std has no netlink sockets, so the five system calls go through `libc`, each
//! with its SAFETY argument. Everything else of the netlink path is safe code.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// How many buffers one datagram may be gathered from (`UIO_MAXIOV` is 1024).
pub const MAX_PARTS: usize = 1000;

/// An eventfd that wakes a thread waiting in [`Socket::wait_readable_or_woken`] (to stop it),
/// closed on drop.
#[derive(Debug)]
pub struct Waker {
    fd: OwnedFd,
}

impl Waker {
    /// A new, unwoken waker.
    pub fn new() -> io::Result<Waker> {
        // SAFETY: eventfd(2) takes no pointers; it returns a new descriptor or -1.
        let fd = check(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
        // SAFETY: `fd` was just returned by eventfd(2), is open, and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Waker { fd })
    }

    /// Wakes the waiting thread, now and at every later wait (the count is never read back).
    pub fn wake(&self) -> io::Result<()> {
        let one = 1u64.to_ne_bytes();
        // SAFETY: the pointer is to `one`, 8 live bytes, and the length is 8, as eventfd
        // requires.
        let n = unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        check(n as libc::c_int).map(drop)
    }
}

/// A `NETLINK_NETFILTER` socket, closed on drop.
#[derive(Debug)]
pub struct Socket {
    fd: OwnedFd,
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

impl Socket {
    /// Opens the socket in the calling thread's network namespace. It is bound implicitly
    /// (the kernel picks our port id) on the first send.
    pub fn open() -> io::Result<Socket> {
        // SAFETY: socket(2) takes no pointers; it returns a new descriptor or -1.
        let fd = check(unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_NETFILTER,
            )
        })?;
        // SAFETY: `fd` was just returned by socket(2), is open, and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        #[cfg(feature = "test-hooks")]
        OPENED.with(|n| n.set(n.get() + 1));
        Ok(Socket { fd })
    }

    /// How many sockets [`Socket::open`] opened on the calling thread so far.
    ///
    /// Why: a test hook (feature `test-hooks`, enabled only by the backends' tests) that lets
    /// a test check that a sync opens no socket of its own, without timing anything: a socket
    /// opened and closed per sync costs an RCU grace period at its close (see
    /// [`crate::generation::KernelReader`]). Per thread, so that tests running in parallel
    /// in one process do not count each other's.
    #[cfg(feature = "test-hooks")]
    pub fn opened_on_this_thread() -> u64 {
        OPENED.with(std::cell::Cell::get)
    }

    /// Binds the socket to a kernel-chosen port id, subscribed to no group. Needed before
    /// joining a multicast group: the kernel skips, in a broadcast, a socket whose port id
    /// equals the sender's, and an unbound socket's is 0, like the kernel's own.
    pub fn bind_auto(&self) -> io::Result<()> {
        // SAFETY: an all-zero sockaddr_nl is valid; we set the family only.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: the pointer is to `addr`, a live sockaddr_nl, and the length is its size.
        check(unsafe {
            libc::bind(
                self.fd.as_raw_fd(),
                (&raw const addr).cast(),
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        })
        .map(drop)
    }

    /// Waits until a datagram can be read, at most `timeout_ms`; `false` on timeout.
    pub fn wait_readable(&self, timeout_ms: i32) -> io::Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            // SAFETY: the pointer is to one live pollfd, and we pass a count of 1.
            let n = unsafe { libc::poll(&raw mut pfd, 1, timeout_ms) };
            if n >= 0 {
                return Ok(n > 0);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Waits until a datagram can be read or `waker` is woken ([`Waker::wake`]), with no
    /// timeout: a thread that only waits for notifications then sleeps until there is work
    /// or it must stop, instead of waking periodically to look at a flag. Returns whether
    /// the socket is readable and whether the waker was woken (both may be).
    pub fn wait_readable_or_woken(&self, waker: &Waker) -> io::Result<(bool, bool)> {
        let mut pfds = [
            libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: waker.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        loop {
            // SAFETY: the pointer is to two live pollfds, and we pass a count of 2.
            let n = unsafe { libc::poll(pfds.as_mut_ptr(), 2, -1) };
            if n >= 0 {
                let ready = |p: &libc::pollfd| p.revents != 0;
                return Ok((ready(&pfds[0]), ready(&pfds[1])));
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// setsockopt(2) with a plain-data option value.
    pub fn set_opt<T: Copy>(
        &self,
        level: libc::c_int,
        name: libc::c_int,
        value: T,
    ) -> io::Result<()> {
        // SAFETY: the pointer is to `value`, a live, initialised `T` on our stack, and the
        // length passed is exactly its size; the kernel only reads it during the call.
        check(unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                level,
                name,
                (&raw const value).cast(),
                size_of::<T>() as libc::socklen_t,
            )
        })
        .map(drop)
    }

    /// getsockopt(2) of an `int` option.
    pub fn get_int(&self, level: libc::c_int, name: libc::c_int) -> io::Result<i32> {
        let mut value: libc::c_int = 0;
        let mut len = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: both pointers are to live locals of the sizes the kernel is told.
        check(unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                level,
                name,
                (&raw mut value).cast(),
                &raw mut len,
            )
        })?;
        Ok(value)
    }

    /// Sends one datagram, gathered from `parts`, to the kernel (port id 0: an unconnected
    /// netlink socket's default destination). Netlink datagrams go out whole or not at
    /// all. At most [`MAX_PARTS`] parts.
    pub fn send(&self, parts: &[Vec<u8>]) -> io::Result<usize> {
        let mut iov: Vec<libc::iovec> = parts
            .iter()
            .map(|p| libc::iovec {
                iov_base: p.as_ptr() as *mut libc::c_void,
                iov_len: p.len(),
            })
            .collect();
        // SAFETY: an all-zero msghdr is a valid empty one (null name, no control data).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len() as _;
        loop {
            // SAFETY: `msg` points at `iov`, which points at the live buffers of `parts`,
            // each with its true length; the kernel only reads them. Both outlive the call.
            let n = unsafe { libc::sendmsg(self.fd.as_raw_fd(), &msg, 0) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Receives one datagram into `buf` (blocking unless `dont_wait`); returns its length.
    pub fn recv(&self, buf: &mut [u8], dont_wait: bool) -> io::Result<usize> {
        let flags = if dont_wait { libc::MSG_DONTWAIT } else { 0 };
        loop {
            // SAFETY: `buf` is a live, writable slice; the kernel writes at most
            // `buf.len()` bytes into it.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    flags,
                )
            };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

#[cfg(feature = "test-hooks")]
thread_local! {
    /// The count [`Socket::opened_on_this_thread`] reads (test builds only).
    static OPENED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// `SO_NETNS_COOKIE` (Linux 5.14) where its value is asm-generic's (`libc` does not name it);
/// `None` on the architectures whose value differs, where [`netns_cookie`] answers `None`.
/// The one place the list of architectures is written.
const SO_NETNS_COOKIE: Option<libc::c_int> = if cfg!(any(
    target_arch = "x86",
    target_arch = "x86_64",
    target_arch = "arm",
    target_arch = "aarch64",
    target_arch = "riscv64",
    target_arch = "loongarch64"
)) {
    Some(71)
} else {
    None
};

/// The cookie of the calling thread's network namespace (`SO_NETNS_COOKIE`): unlike the
/// namespace's inode, which the kernel soon gives to a new namespace once one is gone, it is
/// never reused within a boot, so a record kept per namespace can tell its own namespace from
/// a later one with the same inode. `None` on kernels before 5.14 and other architectures.
pub fn netns_cookie() -> Option<u64> {
    let option = SO_NETNS_COOKIE?;
    let socket = std::os::unix::net::UnixDatagram::unbound().ok()?;
    let mut cookie: u64 = 0;
    let mut len = size_of::<u64>() as libc::socklen_t;
    // SAFETY: the fd is the live socket above; the pointers are to `cookie` and `len`, and
    // `len` says how many bytes `cookie` holds; the kernel writes at most that many.
    let ret = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            (&raw mut cookie).cast(),
            &raw mut len,
        )
    };
    (ret == 0 && len as usize == size_of::<u64>()).then_some(cookie)
}

#[cfg(test)]
mod cookie_tests {
    #[test]
    fn the_namespace_cookie_is_the_same_for_every_socket_of_it() {
        // Kernels before 5.14 have none.
        if let Some(first) = super::netns_cookie() {
            assert_eq!(super::netns_cookie(), Some(first));
        }
    }
}
