//! The node's own addresses (`RTM_GETADDR` over `NETLINK_ROUTE`): node-port entries are only
//! the ones whose original destination is one of them.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kpng_model::Family;
use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, NetlinkBuffer, NlasIterator,
};
use netlink_sys::protocols::NETLINK_ROUTE;
use netlink_sys::{Socket, SocketAddr};

use crate::Error;

const RTM_NEWADDR: u16 = 20;
const RTM_GETADDR: u16 = 22;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
/// `struct ifaddrmsg`: family, prefix length, flags, scope, interface index.
const IFADDRMSG_LEN: usize = 8;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// Every address of `family` configured on an interface of this network namespace.
///
/// # Errors
/// When the route socket cannot be opened or the dump fails.
pub fn local_addresses(family: Family) -> Result<Vec<IpAddr>, Error> {
    const OP: &str = "listing local addresses";
    let io_err = |source| Error::Io { op: OP, source };
    let mut socket = Socket::new(NETLINK_ROUTE).map_err(io_err)?;
    socket.bind_auto().map_err(io_err)?;
    socket.connect(&SocketAddr::new(0, 0)).map_err(io_err)?;
    let mut request = vec![0u8; 16 + IFADDRMSG_LEN];
    {
        let mut header = NetlinkBuffer::new(&mut request[..]);
        header.set_length(16 + IFADDRMSG_LEN as u32);
        header.set_message_type(RTM_GETADDR);
        header.set_flags(NLM_F_REQUEST | NLM_F_DUMP);
        header.set_sequence_number(1);
    }
    request[16] = match family {
        Family::V4 => AF_INET,
        Family::V6 => AF_INET6,
    };
    socket.send(&request, 0).map_err(io_err)?;
    let mut buffer = vec![0u8; 64 * 1024];
    let mut out = Vec::new();
    loop {
        let n = socket.recv(&mut &mut buffer[..], 0).map_err(io_err)?;
        let mut at = 0;
        while let Some(rest) = buffer.get(at..n).filter(|r| !r.is_empty()) {
            let message = NetlinkBuffer::new_checked(rest).map_err(|e| Error::Malformed {
                op: OP,
                detail: e.to_string(),
            })?;
            let length = message.length() as usize;
            at += length.next_multiple_of(4).max(16);
            let payload = rest.get(16..length).unwrap_or_default();
            match message.message_type() {
                NLMSG_DONE => return Ok(out),
                NLMSG_ERROR => {
                    let code = payload
                        .get(..4)
                        .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
                        .unwrap_or(0);
                    if code != 0 {
                        return Err(io_err(io::Error::from_raw_os_error(-code)));
                    }
                }
                RTM_NEWADDR => {
                    if let Some(ip) = address_of(payload)
                        && Family::of(&ip) == family
                        && !out.contains(&ip)
                    {
                        out.push(ip);
                    }
                }
                _ => {}
            }
        }
    }
}

/// The local address of one `RTM_NEWADDR` payload: `IFA_LOCAL` (IPv4 point-to-point links put
/// the peer in `IFA_ADDRESS`), else `IFA_ADDRESS`.
fn address_of(payload: &[u8]) -> Option<IpAddr> {
    let mut address = None;
    let mut local = None;
    for attribute in NlasIterator::new(payload.get(IFADDRMSG_LEN..)?) {
        let attribute = attribute.ok()?;
        let v = attribute.value();
        let ip = match v.len() {
            4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(v).ok()?)),
            16 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(v).ok()?)),
            _ => continue,
        };
        match attribute.kind() {
            IFA_LOCAL => local = Some(ip),
            IFA_ADDRESS => address = Some(ip),
            _ => {}
        }
    }
    local.or(address)
}
