//! Replying to a UDP client from the address its datagram was sent to.
//!
//! The capture redirects a client's datagram to a listener bound to every address of its
//! family; the redirect rewrites the destination to an address of the interface the datagram
//! came in on (`127.0.0.1`/`::1` for the node's own sockets). Conntrack maps the proxy's reply
//! back to the Service address only if the reply comes *from that address*. A plain `send_to`
//! on a wildcard socket lets the kernel choose the source by route, which is another address
//! whenever the incoming interface's own address is not the preferred source towards the
//! client: typically a routed (Calico-style) pod whose node-side interface holds only an IPv6
//! link-local address, where the reply left from a global node address, was never translated,
//! and the pod answered it with an ICMPv6 port unreachable.
//!
//! So on Linux the listener asks for each datagram's destination and interface
//! (`IP_PKTINFO`, `IPV6_RECVPKTINFO`) and sends each reply with that source ([`Arrival`]).
//! Elsewhere replies leave as before (plain `send_to`), and [`Arrival`]s are never seen.

use std::net::{IpAddr, SocketAddr};

use tokio::net::UdpSocket;

#[cfg(target_os = "linux")]
mod linux;

/// Where a client's datagram arrived: the address it was sent to (after the capture's
/// redirect) and the interface it came in on. Replies to that client leave from here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    /// The datagram's destination address as the listener received it.
    pub local: IpAddr,
    /// The index of the interface it came in on.
    pub ifindex: u32,
}

impl Arrival {
    /// The interface a reply from [`Arrival::local`] must be pinned to: the incoming one
    /// when the address is an IPv6 link-local one (it means nothing without its interface),
    /// else none, so the reply is routed like any other (as a TCP connection's replies are,
    /// and without assuming the client is on-link, which an IPv4 output interface would).
    pub fn reply_ifindex(&self) -> u32 {
        match self.local {
            IpAddr::V6(ip) if ip.is_unicast_link_local() => self.ifindex,
            _ => 0,
        }
    }
}

/// Asks the kernel to report each datagram's [`Arrival`] on `socket` (a UDP socket of one
/// family, before it is bound). Does nothing where [`Arrival`]s are not supported.
pub fn enable(socket: &socket2::Socket, v6: bool) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    return linux::enable(socket, v6);
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (socket, v6);
        Ok(())
    }
}

/// Receives one datagram into `buf`: its length, its sender, and where it arrived when the
/// kernel said so ([`enable`]).
pub async fn recv(
    socket: &UdpSocket,
    buf: &mut [u8],
) -> std::io::Result<(usize, SocketAddr, Option<Arrival>)> {
    #[cfg(target_os = "linux")]
    return linux::recv(socket, buf).await;
    #[cfg(not(target_os = "linux"))]
    {
        let (n, peer) = socket.recv_from(buf).await?;
        Ok((n, peer, None))
    }
}

/// Sends `data` to `to`, from `from` when known (the client's [`Arrival`]); otherwise the
/// kernel chooses the source.
pub async fn send(
    socket: &UdpSocket,
    data: &[u8],
    to: SocketAddr,
    from: Option<Arrival>,
) -> std::io::Result<usize> {
    #[cfg(target_os = "linux")]
    if let Some(from) = from {
        return linux::send(socket, data, to, from).await;
    }
    #[cfg(not(target_os = "linux"))]
    let _ = from;
    socket.send_to(data, to).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_pinned_to_the_interface_only_for_ipv6_link_local_sources() {
        let cases: [(&str, u32); 6] = [
            ("fe80::ee", 7),
            ("fd00:1::5", 0),
            ("::1", 0),
            ("169.254.1.1", 0),
            ("10.0.0.1", 0),
            ("127.0.0.1", 0),
        ];
        for (local, want) in cases {
            let a = Arrival {
                local: local.parse().expect("address"),
                ifindex: 7,
            };
            assert_eq!(a.reply_ifindex(), want, "{local}");
        }
    }
}
