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

/// Whether kpng's network namespace is the host's, as `--socket-lb-host-netns-only` assumes:
/// it loads kpng's *own* namespace's cookie. A DaemonSet without `hostNetwork: true` (or a
/// test's namespace standing for a node) makes the option mean "kpng's namespace only": the
/// node's processes and hostNetwork pods then go through the nftables rules like the pods,
/// and nothing failed to say so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// kpng runs in the host's network namespace (that of /proc/1, the host's init).
    Host,
    /// kpng runs in another one: `own` and `host` are the namespaces' inodes (`net:[N]`).
    Other {
        /// kpng's network namespace inode.
        own: u64,
        /// The host's network namespace inode (init's, or kthreadd's).
        host: u64,
    },
    /// It cannot be told, and why.
    Unknown(String),
}

impl Placement {
    /// Looks at `/proc/self/ns/net` and `/proc/1/ns/net`, or `/proc/2/ns/net` (kthreadd, a
    /// kernel thread, always in the host's namespace) when init's cannot be read (a process
    /// with fewer capabilities than init may not look at its namespaces; a kernel thread's it
    /// may). In a PID namespace of its own, /proc/1 is the container's first process, not the
    /// host's init: unknown.
    pub fn find() -> Placement {
        use std::os::unix::fs::MetadataExt;
        let inode = |p: &str| std::fs::metadata(p).map(|m| m.ino());
        compare(
            inode("/proc/self/ns/net"),
            inode("/proc/1/ns/net").or_else(|_| inode("/proc/2/ns/net")),
            crate::host::in_private_pid_namespace(),
        )
    }

    /// What the option means here when it is not what it says (kpng not in the host's
    /// namespace), for a warning and `kpng status`; `None` when it is, or cannot be told.
    pub fn not_host(&self) -> Option<String> {
        match self {
            Placement::Other { own, host } => Some(format!(
                "kpng runs in network namespace net:[{own}], not the host's (net:[{host}]): \
                 --socket-lb-host-netns-only translates the sockets of kpng's own network \
                 namespace only; the node's processes and hostNetwork pods go through the \
                 nftables rules like the pods (run kpng with hostNetwork: true; where a \
                 namespace stands for a node, as in tests, that namespace is meant)"
            )),
            Placement::Host | Placement::Unknown(_) => None,
        }
    }
}

/// [`Placement`] from the two namespaces' inodes and whether /proc/1 is another PID
/// namespace's first process.
fn compare(own: io::Result<u64>, init: io::Result<u64>, private_pid: bool) -> Placement {
    if private_pid {
        return Placement::Unknown(
            "kpng runs in a PID namespace of its own: /proc/1 is not the host's init".into(),
        );
    }
    match (own, init) {
        (Ok(own), Ok(host)) if own == host => Placement::Host,
        (Ok(own), Ok(host)) => Placement::Other { own, host },
        (Err(e), _) => Placement::Unknown(format!("/proc/self/ns/net: {e}")),
        (_, Err(e)) => Placement::Unknown(format!("/proc/1/ns/net and /proc/2/ns/net: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::{Placement, compare};

    /// The same inode is the host's namespace; another is not, named with both; an unreadable
    /// one or another PID namespace's /proc/1 cannot tell.
    #[test]
    fn the_host_namespace_is_told_by_comparing_with_init() {
        type Inode = std::io::Result<u64>;
        let err = || -> Inode { Err(std::io::Error::from_raw_os_error(libc::EACCES)) };
        let ok = |inode: u64| -> Inode { Ok(inode) };
        let cases = [
            ("same", ok(7), ok(7), false, Placement::Host),
            (
                "other",
                ok(8),
                ok(7),
                false,
                Placement::Other { own: 8, host: 7 },
            ),
            (
                "private pid",
                ok(8),
                ok(8),
                true,
                Placement::Unknown(
                    "kpng runs in a PID namespace of its own: /proc/1 is not the host's init"
                        .into(),
                ),
            ),
            (
                "own unreadable",
                err(),
                ok(7),
                false,
                Placement::Unknown("/proc/self/ns/net: Permission denied (os error 13)".into()),
            ),
            (
                "init unreadable",
                ok(7),
                err(),
                false,
                Placement::Unknown(
                    "/proc/1/ns/net and /proc/2/ns/net: Permission denied (os error 13)".into(),
                ),
            ),
        ];
        for (what, own, init, private, want) in cases {
            let got = compare(own, init, private);
            assert_eq!(got, want, "{what}");
            assert_eq!(
                got.not_host().is_some(),
                matches!(want, Placement::Other { .. }),
                "{what}"
            );
        }
        let words = Placement::Other { own: 8, host: 7 }
            .not_host()
            .unwrap_or_default();
        assert!(
            words.contains("net:[8], not the host's (net:[7]):"),
            "{words}"
        );
    }

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
