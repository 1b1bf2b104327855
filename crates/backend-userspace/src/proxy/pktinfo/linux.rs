//! `IP_PKTINFO` / `IPV6_PKTINFO` on Linux: the only unsafe code of the backend.
//!
//! Why unsafe: neither std, tokio nor socket2 exposes these options or control messages, so
//! `setsockopt`, `recvmsg` and `sendmsg` go through `libc`, each with its SAFETY argument.
//! Every buffer lives on the stack: one system call per datagram, as with `recv_from` and
//! `send_to`, and no allocation.
#![allow(unsafe_code)]

use std::io;
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, RawFd};

use tokio::io::Interest;
use tokio::net::UdpSocket;

use super::Arrival;

/// Room for one `in6_pktinfo` or `in_pktinfo` control message (`CMSG_SPACE(20)` is 40 on
/// 64-bit Linux), with margin.
const CONTROL_LEN: usize = 64;

/// A control-message buffer, aligned as `struct cmsghdr` requires.
#[repr(C, align(8))]
struct Control([u8; CONTROL_LEN]);

/// `CMSG_SPACE(len)`.
fn cmsg_space(len: usize) -> usize {
    // SAFETY: pure arithmetic on its argument (libc marks it unsafe only for uniformity).
    unsafe { libc::CMSG_SPACE(len as libc::c_uint) as usize }
}

/// `CMSG_LEN(len)`.
fn cmsg_len(len: usize) -> usize {
    // SAFETY: pure arithmetic on its argument.
    unsafe { libc::CMSG_LEN(len as libc::c_uint) as usize }
}

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

pub(super) fn enable(socket: &socket2::Socket, v6: bool) -> io::Result<()> {
    let (level, name) = if v6 {
        (libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO)
    } else {
        (libc::IPPROTO_IP, libc::IP_PKTINFO)
    };
    let on: libc::c_int = 1;
    // SAFETY: the value pointer is to `on`, a live c_int, and the length is its size.
    check(unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (&raw const on).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
}

pub(super) async fn recv(
    socket: &UdpSocket,
    buf: &mut [u8],
) -> io::Result<(usize, SocketAddr, Option<Arrival>)> {
    let fd = socket.as_raw_fd();
    socket
        .async_io(Interest::READABLE, || recv_now(fd, buf))
        .await
}

pub(super) async fn send(
    socket: &UdpSocket,
    data: &[u8],
    to: SocketAddr,
    from: Arrival,
) -> io::Result<usize> {
    let fd = socket.as_raw_fd();
    socket
        .async_io(Interest::WRITABLE, || send_now(fd, data, to, from))
        .await
}

/// One non-blocking `recvmsg` (`WouldBlock` when nothing is queued).
fn recv_now(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, SocketAddr, Option<Arrival>)> {
    // SAFETY: all-zero is a valid sockaddr_storage, msghdr (null pointers, zero lengths).
    let mut peer: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut control = Control([0; CONTROL_LEN]);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: as above.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&raw mut peer).cast();
    msg.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = CONTROL_LEN as _;
    // SAFETY: every pointer in `msg` is to a live local (`peer`, `iov` → `buf`, `control`)
    // that is writable for the length stated beside it.
    let n = unsafe { libc::recvmsg(fd, &raw mut msg, libc::MSG_DONTWAIT) };
    let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
    let peer = peer_address(&peer)?;
    Ok((n, peer, arrival(&msg)))
}

/// The sender's address from what `recvmsg` wrote.
fn peer_address(peer: &libc::sockaddr_storage) -> io::Result<SocketAddr> {
    match i32::from(peer.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage (large and aligned enough for any
            // address) holds a sockaddr_in.
            let a: libc::sockaddr_in = unsafe { *(&raw const *peer).cast() };
            Ok(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, a sockaddr_in6.
            let a: libc::sockaddr_in6 = unsafe { *(&raw const *peer).cast() };
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        family => Err(io::Error::other(format!(
            "a datagram from an address of family {family}"
        ))),
    }
}

/// The `IPV6_PKTINFO` or `IP_PKTINFO` message among what `recvmsg` wrote to `msg`'s control
/// buffer, if any (the kernel adds one to every datagram once the option is on).
fn arrival(msg: &libc::msghdr) -> Option<Arrival> {
    // SAFETY: `msg` was filled by recvmsg; CMSG_FIRSTHDR/CMSG_NXTHDR only return headers that
    // lie within `msg_control[..msg_controllen]` (or null), which is still alive.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(msg) };
    while !cmsg.is_null() {
        // SAFETY: non-null, so a complete header inside the control buffer.
        let header = unsafe { &*cmsg };
        let fits = |len: usize| header.cmsg_len as usize >= cmsg_len(len);
        // SAFETY: CMSG_DATA of a header inside the buffer is inside the buffer.
        let data = unsafe { libc::CMSG_DATA(cmsg) };
        match (header.cmsg_level, header.cmsg_type) {
            (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) if fits(size_of::<libc::in6_pktinfo>()) => {
                // SAFETY: the message is long enough for an in6_pktinfo (checked), which the
                // kernel wrote there; read unaligned as data need not be aligned for it.
                let info: libc::in6_pktinfo =
                    unsafe { data.cast::<libc::in6_pktinfo>().read_unaligned() };
                return Some(Arrival {
                    local: IpAddr::V6(Ipv6Addr::from(info.ipi6_addr.s6_addr)),
                    ifindex: info.ipi6_ifindex,
                });
            }
            (libc::IPPROTO_IP, libc::IP_PKTINFO) if fits(size_of::<libc::in_pktinfo>()) => {
                // SAFETY: as above, an in_pktinfo.
                let info: libc::in_pktinfo =
                    unsafe { data.cast::<libc::in_pktinfo>().read_unaligned() };
                return Some(Arrival {
                    // The header's destination (after the redirect), not `ipi_spec_dst`.
                    local: IpAddr::V4(Ipv4Addr::from(u32::from_be(info.ipi_addr.s_addr))),
                    ifindex: u32::try_from(info.ipi_ifindex).unwrap_or(0),
                });
            }
            _ => {}
        }
        // SAFETY: `cmsg` is a header inside `msg`'s control buffer (see above).
        cmsg = unsafe { libc::CMSG_NXTHDR(msg, cmsg) };
    }
    None
}

/// A destination address as `sendmsg` takes it.
enum RawAddr {
    V4(libc::sockaddr_in),
    V6(libc::sockaddr_in6),
}

impl RawAddr {
    fn new(addr: SocketAddr) -> RawAddr {
        match addr {
            SocketAddr::V4(a) => RawAddr::V4(libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*a.ip()).to_be(),
                },
                sin_zero: [0; 8],
            }),
            SocketAddr::V6(a) => RawAddr::V6(libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            }),
        }
    }

    /// Pointer and length for `msg_name`.
    fn as_name(&mut self) -> (*mut libc::c_void, libc::socklen_t) {
        match self {
            RawAddr::V4(a) => (
                (&raw mut *a).cast(),
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            ),
            RawAddr::V6(a) => (
                (&raw mut *a).cast(),
                size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            ),
        }
    }
}

/// One non-blocking `sendmsg` of `data` to `to` with source `from` (`WouldBlock` when the
/// send buffer is full). A `from` of the other family than `to` is ignored.
fn send_now(fd: RawFd, data: &[u8], to: SocketAddr, from: Arrival) -> io::Result<usize> {
    let mut name = RawAddr::new(to);
    let (name_ptr, name_len) = name.as_name();
    let mut control = Control([0; CONTROL_LEN]);
    let mut iov = libc::iovec {
        iov_base: data.as_ptr().cast_mut().cast(),
        iov_len: data.len(),
    };
    // SAFETY: all-zero is a valid msghdr (null pointers, zero lengths).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = name_ptr;
    msg.msg_namelen = name_len;
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    let ifindex = from.reply_ifindex();
    match (from.local, to) {
        (IpAddr::V6(local), SocketAddr::V6(_)) => {
            let info = libc::in6_pktinfo {
                ipi6_addr: libc::in6_addr {
                    s6_addr: local.octets(),
                },
                ipi6_ifindex: ifindex,
            };
            put_control(
                &mut msg,
                &mut control,
                libc::IPPROTO_IPV6,
                libc::IPV6_PKTINFO,
                info,
            );
        }
        (IpAddr::V4(local), SocketAddr::V4(_)) => {
            let info = libc::in_pktinfo {
                ipi_ifindex: i32::try_from(ifindex).unwrap_or(0),
                // The source to use; `ipi_addr` is ignored on send.
                ipi_spec_dst: libc::in_addr {
                    s_addr: u32::from(local).to_be(),
                },
                ipi_addr: libc::in_addr { s_addr: 0 },
            };
            put_control(
                &mut msg,
                &mut control,
                libc::IPPROTO_IP,
                libc::IP_PKTINFO,
                info,
            );
        }
        _ => {}
    }
    // SAFETY: every pointer in `msg` is to a live local (`name`, `iov` → `data`, `control`)
    // readable for the length stated beside it; sendmsg does not write through them.
    let n = unsafe { libc::sendmsg(fd, &raw const msg, libc::MSG_DONTWAIT) };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// Makes `control` hold one control message (`level`, `kind`, `value`) and points `msg` at it.
fn put_control<T: Copy>(
    msg: &mut libc::msghdr,
    control: &mut Control,
    level: libc::c_int,
    kind: libc::c_int,
    value: T,
) {
    let space = cmsg_space(size_of::<T>());
    if space > CONTROL_LEN {
        return;
    }
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg_control` points to `control`, aligned for cmsghdr and at least
    // `msg_controllen` (= CMSG_SPACE of the value) long, so the first header and its data fit.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(msg);
        if cmsg.is_null() {
            return;
        }
        (*cmsg).cmsg_level = level;
        (*cmsg).cmsg_type = kind;
        (*cmsg).cmsg_len = cmsg_len(size_of::<T>()) as _;
        libc::CMSG_DATA(cmsg).cast::<T>().write_unaligned(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A datagram sent to an address of the listener's is received with that address as its
    /// arrival, and a reply sent from it leaves from that address.
    #[tokio::test]
    async fn arrival_is_the_destination_and_replies_leave_from_it() {
        for (any, lo) in [("0.0.0.0:0", "127.0.0.1"), ("[::]:0", "::1")] {
            let any: SocketAddr = any.parse().expect("address");
            let lo: IpAddr = lo.parse().expect("address");
            let domain = socket2::Domain::for_address(any);
            let raw = socket2::Socket::new(domain, socket2::Type::DGRAM, None).expect("socket");
            if any.is_ipv6() {
                raw.set_only_v6(true).expect("v6 only");
            }
            enable(&raw, any.is_ipv6()).expect("enable");
            raw.set_nonblocking(true).expect("nonblocking");
            raw.bind(&any.into()).expect("bind");
            let listener = UdpSocket::from_std(raw.into()).expect("tokio socket");
            let port = listener.local_addr().expect("port").port();
            let client = UdpSocket::bind(SocketAddr::new(lo, 0))
                .await
                .expect("client");
            client.send_to(b"ping", (lo, port)).await.expect("send");
            let mut buf = [0u8; 16];
            let (n, peer, arrival) = recv(&listener, &mut buf).await.expect("recv");
            assert_eq!(
                (&buf[..n], peer),
                (&b"ping"[..], client.local_addr().expect("addr"))
            );
            let arrival = arrival.expect("an arrival");
            assert_eq!(arrival.local, lo);
            assert_ne!(arrival.ifindex, 0);
            send(&listener, b"pong", peer, arrival)
                .await
                .expect("reply");
            let (n, from) = client.recv_from(&mut buf).await.expect("reply");
            assert_eq!((&buf[..n], from), (&b"pong"[..], SocketAddr::new(lo, port)));
        }
    }
}
