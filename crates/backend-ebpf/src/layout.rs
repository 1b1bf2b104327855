//! The byte layouts of the BPF maps' keys and values, mirrored from `bpf/sock_lb.c` (the C
//! structs there are the source of truth; a change to one side must change the other).
//!
//! Every address is 16 bytes, IPv4 as IPv4-mapped IPv6 (`::ffff:a.b.c.d`), so one map serves
//! both families; ports are in network byte order. The structs are encoded by hand into byte
//! arrays: the maps are typed `[u8; N]` on the Rust side, which needs no `unsafe` `Pod` impl.

use std::net::{IpAddr, SocketAddr};

use kpng_model::Protocol;

/// The layout's version: it names the directory the maps are pinned in (`<pin dir>/v3`), so a
/// kpng whose maps differ from the pinned ones (an upgrade, a downgrade) creates its own instead
/// of adopting maps whose elements it would misread. Bump it with any change to a map below.
pub const VERSION: &str = "v3";

/// `INLINE`: the endpoints a frontend's value holds itself; a longer list continues in
/// `kpng_slots`. Eight keeps the value at 176 bytes (about 250 per element with the kernel's
/// element header and the key) and covers most Services.
pub const INLINE: usize = 8;
/// `struct frontend_key`: address, port, protocol, padding.
pub const FRONTEND_KEY: usize = 20;
/// `struct service`: id, count, affinity seconds, flags, then [`INLINE`] endpoints.
pub const SERVICE: usize = 16 + INLINE * ENDPOINT;
/// `struct slot_key`: service id, slot.
pub const SLOT_KEY: usize = 8;
/// `struct endpoint`: address, port, padding.
pub const ENDPOINT: usize = 20;
/// `struct member_key`: service id, endpoint.
pub const MEMBER_KEY: usize = 24;
/// A member's value (`__u8`).
pub const MEMBER: usize = 1;
/// `struct reverse_key`: socket cookie (`__u64`), endpoint, 4 bytes of tail padding.
pub const REVERSE_KEY: usize = 32;

/// `SVC_REFUSE`: no endpoint anywhere, `connect()` fails with ECONNREFUSED (TCP only: a UDP
/// port without endpoints has no frontend, [`crate::plan::groups`]).
pub const FLAG_REFUSE: u32 = 1;

/// The protocol numbers the kernel puts in `bpf_sock_addr.protocol`; `None` for protocols the
/// socket programs leave to the nftables rules.
pub fn ip_proto(protocol: Protocol) -> Option<u8> {
    match protocol {
        Protocol::Tcp => Some(6),
        Protocol::Udp => Some(17),
        Protocol::Sctp => None,
    }
}

/// An address as the maps hold it (IPv4-mapped for IPv4).
pub fn addr16(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The address back from its 16 bytes.
pub fn ip_of(bytes: [u8; 16]) -> IpAddr {
    let v6 = std::net::Ipv6Addr::from(bytes);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// `struct frontend_key`.
pub fn frontend_key(ip: IpAddr, port: u16, proto: u8) -> [u8; FRONTEND_KEY] {
    let mut k = [0u8; FRONTEND_KEY];
    k[..16].copy_from_slice(&addr16(ip));
    k[16..18].copy_from_slice(&port.to_be_bytes());
    k[18] = proto;
    k
}

/// The service id of a `struct service` (or of a key that starts with one).
pub fn service_id_of(bytes: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(..4)?.try_into().ok()?))
}

/// `struct service`: `count` is the whole list's length, `endpoints` its first [`INLINE`]
/// (more are ignored: they go to `kpng_slots`).
pub fn service(
    id: u32,
    count: u32,
    affinity_seconds: u32,
    flags: u32,
    endpoints: &[SocketAddr],
) -> [u8; SERVICE] {
    let mut v = [0u8; SERVICE];
    v[0..4].copy_from_slice(&id.to_ne_bytes());
    v[4..8].copy_from_slice(&count.to_ne_bytes());
    v[8..12].copy_from_slice(&affinity_seconds.to_ne_bytes());
    v[12..16].copy_from_slice(&flags.to_ne_bytes());
    for (i, ep) in endpoints.iter().take(INLINE).enumerate() {
        let at = 16 + i * ENDPOINT;
        v[at..at + ENDPOINT].copy_from_slice(&endpoint(*ep));
    }
    v
}

/// The endpoints a `struct service` holds inline (at most [`INLINE`] of its count).
pub fn service_endpoints(bytes: &[u8]) -> Vec<SocketAddr> {
    let count = bytes
        .get(4..8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_ne_bytes) as usize;
    (0..count.min(INLINE))
        .filter_map(|i| endpoint_of(bytes.get(16 + i * ENDPOINT..)?))
        .collect()
}

/// `struct slot_key`.
pub fn slot_key(id: u32, slot: u32) -> [u8; SLOT_KEY] {
    let mut k = [0u8; SLOT_KEY];
    k[0..4].copy_from_slice(&id.to_ne_bytes());
    k[4..8].copy_from_slice(&slot.to_ne_bytes());
    k
}

/// `struct endpoint`.
pub fn endpoint(addr: SocketAddr) -> [u8; ENDPOINT] {
    let mut v = [0u8; ENDPOINT];
    v[..16].copy_from_slice(&addr16(addr.ip()));
    v[16..18].copy_from_slice(&addr.port().to_be_bytes());
    v
}

/// The endpoint back from its bytes.
pub fn endpoint_of(bytes: &[u8]) -> Option<SocketAddr> {
    let ip: [u8; 16] = bytes.get(..16)?.try_into().ok()?;
    let port = u16::from_be_bytes(bytes.get(16..18)?.try_into().ok()?);
    Some(SocketAddr::new(ip_of(ip), port))
}

/// `struct member_key`.
pub fn member_key(id: u32, addr: SocketAddr) -> [u8; MEMBER_KEY] {
    let mut k = [0u8; MEMBER_KEY];
    k[0..4].copy_from_slice(&id.to_ne_bytes());
    k[4..].copy_from_slice(&endpoint(addr));
    k
}

/// `REVERSE_DATAGRAM`: in a `kpng_reverse` value's padding, the entry was written for a
/// datagram of an unconnected socket (`sendmsg`), not by a `connect()`: no connected socket to
/// destroy when its endpoint leaves. Entries of programs before 2026-12-07 have 0.
pub const REVERSE_DATAGRAM: u16 = 1;

/// Whether a `kpng_reverse` value is a datagram's ([`REVERSE_DATAGRAM`]).
pub fn reverse_is_datagram(value: &[u8]) -> bool {
    value
        .get(18..20)
        .and_then(|b| b.try_into().ok())
        .map(u16::from_ne_bytes)
        == Some(REVERSE_DATAGRAM)
}

/// A `struct reverse_key`: the socket's cookie (as `bpf_get_socket_cookie` and sock_diag give
/// it) and the endpoint it was translated to.
pub fn reverse_key(bytes: &[u8]) -> Option<(u64, SocketAddr)> {
    let cookie = u64::from_ne_bytes(bytes.get(..8)?.try_into().ok()?);
    Some((cookie, endpoint_of(bytes.get(8..)?)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_is_mapped_and_round_trips() {
        let ip: IpAddr = "10.96.0.10".parse().expect("ip");
        let k = frontend_key(ip, 80, 6);
        assert_eq!(
            &k[..16],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 96, 0, 10]
        );
        assert_eq!(&k[16..], &[0, 80, 6, 0]);
        assert_eq!(ip_of(addr16(ip)), ip);
        let v6: IpAddr = "fd00:96::a".parse().expect("ip");
        assert_eq!(ip_of(addr16(v6)), v6);
        let ep: SocketAddr = "10.244.1.2:8080".parse().expect("sa");
        assert_eq!(endpoint_of(&endpoint(ep)), Some(ep));
        assert_eq!(endpoint_of(&member_key(3, ep)[4..]), Some(ep));
        let mut rk = [0u8; REVERSE_KEY];
        rk[..8].copy_from_slice(&0x6546bu64.to_ne_bytes());
        rk[8..8 + ENDPOINT].copy_from_slice(&endpoint(ep));
        assert_eq!(reverse_key(&rk), Some((0x6546b, ep)));
        // A value written by sendmsg says so in its padding; a connect's does not.
        let mut value = endpoint(ep);
        assert!(!reverse_is_datagram(&value));
        value[18..20].copy_from_slice(&REVERSE_DATAGRAM.to_ne_bytes());
        assert!(reverse_is_datagram(&value));
        assert_eq!(endpoint_of(&value), Some(ep));
        // A service holds its id and its first INLINE endpoints.
        let eps: Vec<SocketAddr> = (0..10u16).map(|i| SocketAddr::new(ip, 8000 + i)).collect();
        let v = service(7, 10, 0, 0, &eps);
        assert_eq!(service_id_of(&v), Some(7));
        assert_eq!(service_endpoints(&v), eps[..INLINE]);
        assert_eq!(service_endpoints(&service(7, 2, 0, 0, &eps[..2])), eps[..2]);
    }
}
