//! Which user owns the socket at the other end of a loopback TCP connection, so that the status
//! page (`http.rs`) answers only whom the admin socket (mode 0600) answers: root and kpng's own
//! user. Any local user can reach 127.0.0.1; the kernel knows whose socket it is.
//!
//! Asked with one sock_diag (`INET_DIAG`) exact lookup of the connection's 4-tuple, seen from
//! the client's side, in kpng's network namespace (the one its listener and every connection
//! to it live in). Chosen over reading `/proc/net/tcp{,6}` for the line whose local address is
//! the peer's: the kernel finds the one socket by hash instead of kpng formatting and scanning
//! every TCP socket of the node as text at each request (tens of megabytes on a busy node), and
//! the answer cannot be a socket of the same local address and port with another remote end.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use netlink_packet_core::{NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_sock_diag::SockDiagMessage;
use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_TCP};
use netlink_packet_sock_diag::inet::{
    ExtensionFlags, InetRequest, InetResponseHeader, SocketId, StateFlags,
};
use netlink_sys::protocols::NETLINK_SOCK_DIAG;

/// The uid owning the client's socket of the TCP connection from `peer` to `local` (both as
/// the server sees them). A peer seen as an IPv4-mapped address by a dual-stack listener is an
/// IPv4 socket, or an IPv6 one that connected to a mapped address: both are asked.
pub fn uid_of_peer(peer: SocketAddr, local: SocketAddr) -> Result<u32, String> {
    let mut why = Vec::new();
    for (family, peer_ip, local_ip) in candidates(peer.ip(), local.ip()) {
        let id = SocketId {
            source_port: peer.port(),
            destination_port: local.port(),
            source_address: peer_ip,
            destination_address: local_ip,
            interface_id: 0,
            // INET_DIAG_NOCOOKIE: any socket of this 4-tuple.
            cookie: [0xff; 8],
        };
        match lookup(family, id) {
            Ok(uid) => return Ok(uid),
            Err(e) => why.push(e),
        }
    }
    Err(format!(
        "the kernel (sock_diag) does not say who owns the connection {peer} → {local}: {}",
        why.join("; ")
    ))
}

/// The (family, client address, server address) lookups to try for a connection.
fn candidates(peer: IpAddr, local: IpAddr) -> Vec<(u8, IpAddr, IpAddr)> {
    let mapped = |ip: IpAddr| match ip {
        IpAddr::V4(v4) => IpAddr::V6(v4.to_ipv6_mapped()),
        v6 => v6,
    };
    match (peer.to_canonical(), local.to_canonical()) {
        (p @ IpAddr::V4(_), l @ IpAddr::V4(_)) => {
            vec![(AF_INET, p, l), (AF_INET6, mapped(p), mapped(l))]
        }
        (p, l) => vec![(AF_INET6, v6(p), v6(l))],
    }
}

fn v6(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V6(v4.to_ipv6_mapped()),
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(v6.octets())),
    }
}

/// One exact sock_diag lookup: the owner's uid, or why there is none.
fn lookup(family: u8, id: SocketId) -> Result<u32, String> {
    let asked = id.clone();
    let io = |e: std::io::Error| format!("netlink: {e}");
    let mut socket = netlink_sys::Socket::new(NETLINK_SOCK_DIAG).map_err(io)?;
    socket.bind_auto().map_err(io)?;
    socket
        .connect(&netlink_sys::SocketAddr::new(0, 0))
        .map_err(io)?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST;
    let mut request = NetlinkMessage::new(
        header,
        SockDiagMessage::InetRequest(InetRequest {
            family,
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::empty(),
            states: StateFlags::all(),
            socket_id: id,
        })
        .into(),
    );
    request.finalize();
    let mut out = vec![0; request.buffer_len()];
    request.serialize(&mut out);
    socket.send(&out, 0).map_err(io)?;
    let mut buf = vec![0u8; 8192];
    let n = socket.recv(&mut &mut buf[..], 0).map_err(io)?;
    let answer = NetlinkMessage::<SockDiagMessage>::deserialize(buf.get(..n).unwrap_or(&[]))
        .map_err(|e| format!("unreadable answer: {e}"))?;
    match answer.payload {
        NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(response)) => {
            owner(&response.header, &asked).map_err(str::to_string)
        }
        NetlinkPayload::Error(e) => Err(e.to_io().to_string()),
        other => Err(format!("unexpected answer {other:?}")),
    }
}

/// The uid of the socket the kernel found, if it is the client's end of this connection and
/// still belongs to a process. The lookup falls back to a listener on the client's address
/// (another socket); a socket closed by its process (a `TIME_WAIT` or orphaned `FIN_WAIT2`
/// entry, inode 0) is reported with uid 0, and no one can read an answer from it anyway.
fn owner(found: &InetResponseHeader, asked: &SocketId) -> Result<u32, &'static str> {
    let same_connection = found.socket_id.source_port == asked.source_port
        && found.socket_id.destination_port == asked.destination_port
        && found.socket_id.source_address == asked.source_address
        && found.socket_id.destination_address == asked.destination_address;
    if !same_connection {
        return Err("the kernel found another socket (a listener on the client's address)");
    }
    if found.inode == 0 {
        return Err("the client's socket is closed");
    }
    Ok(found.uid)
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};

    use super::*;

    #[test]
    fn the_lookups_cover_plain_and_mapped_ipv4() {
        let v4: IpAddr = "127.0.0.1".parse().expect("ip");
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().expect("ip");
        let v6: IpAddr = "::1".parse().expect("ip");
        for (peer, local, want) in [
            (v4, v4, vec![(AF_INET, v4, v4), (AF_INET6, mapped, mapped)]),
            (
                mapped,
                mapped,
                vec![(AF_INET, v4, v4), (AF_INET6, mapped, mapped)],
            ),
            (v6, v6, vec![(AF_INET6, v6, v6)]),
        ] {
            assert_eq!(candidates(peer, local), want, "{peer} → {local}");
        }
    }

    /// The test's own connection is owned by the test's user; a 4-tuple with no socket is
    /// not found (never taken for someone's).
    #[test]
    fn the_owner_of_a_loopback_connection_is_the_clients_user() {
        for addr in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(listener) = TcpListener::bind(addr) else {
                continue; // no IPv6 loopback here
            };
            let client = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
            let (_server, peer) = listener.accept().expect("accept");
            let local = listener.local_addr().expect("addr");
            assert_eq!(client.local_addr().expect("addr"), peer);
            let uid = uid_of_peer(peer, local).expect("owner");
            assert_eq!(uid, rustix::process::geteuid().as_raw(), "{addr}");
            let gone = SocketAddr::new(peer.ip(), local.port());
            assert!(uid_of_peer(gone, local).is_err(), "{addr}");
        }
    }
}
