//! Asking for and reading an nf_tables dump (`NLM_F_DUMP`): the request, then the datagrams
//! the kernel sends until `NLMSG_DONE`; shared by the table and chain dumps
//! ([`crate::tables`]), the element dump ([`crate::elements`]) and the rule dump
//! ([`crate::generation`]).

use std::io;

use crate::attr::{self, NFNL_SUBSYS_NFTABLES, NLM_F_REQUEST, NLMSG_ERROR, NLMSG_HDRLEN, u16_at};
use crate::socket::Socket;

/// `NLM_F_DUMP` (`NLM_F_ROOT | NLM_F_MATCH`).
pub const NLM_F_DUMP: u16 = 0x300;
/// `NLMSG_DONE`: the end of a dump.
pub const NLMSG_DONE: u16 = 3;

/// Where a dump stands after one datagram.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// More datagrams follow.
    More,
    /// `NLMSG_DONE` arrived.
    Done,
    /// The kernel refused the dump with this errno.
    Failed(i32),
}

/// The `NFPROTO_*` value of an nft family word (`ip`, `ip6`, `inet`).
///
/// # Errors
/// Another family: nothing here reads those.
pub fn nfproto(family: &str) -> io::Result<u8> {
    let value = match family {
        "ip" => libc::NFPROTO_IPV4,
        "ip6" => libc::NFPROTO_IPV6,
        "inet" => libc::NFPROTO_INET,
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no lookup for family {other}"),
            ));
        }
    };
    Ok(value as u8)
}

/// A dump request for nf_tables message `get` (an `NFT_MSG_GET…`) over every object of
/// `family` (`ip`, `ip6`, `inet`) that the string attributes `filters` (type, value) name:
/// the table, and for elements the set.
///
/// Why one place: the rule, chain and element dumps ask the kernel with the same header
/// (`NLM_F_REQUEST | NLM_F_DUMP`, sequence 1, the family's `NFPROTO_*`); only the message and
/// the attributes naming the table differ.
///
/// # Errors
/// A family other than `ip`, `ip6`, `inet` (see [`nfproto`]).
pub fn table_request(get: u16, family: &str, filters: &[(u16, &str)]) -> io::Result<Vec<u8>> {
    Ok(request(get, nfproto(family)?, filters))
}

/// [`table_request`] for an `NFPROTO_*` value itself (`NFPROTO_UNSPEC`: every family's tables
/// or chains).
pub fn request(get: u16, nfproto: u8, filters: &[(u16, &str)]) -> Vec<u8> {
    let mut request = Vec::with_capacity(64);
    let start = attr::msg_start(
        &mut request,
        (NFNL_SUBSYS_NFTABLES << 8) | get,
        NLM_F_REQUEST | NLM_F_DUMP,
        1,
        nfproto,
        0,
    );
    for (ty, value) in filters {
        attr::put_str(&mut request, *ty, value);
    }
    attr::msg_end(&mut request, start);
    request
}

/// The errno an `NLMSG_ERROR` message carries (0 for an acknowledgement).
pub fn errno_of(msg: &[u8]) -> i32 {
    let error = msg
        .get(NLMSG_HDRLEN..NLMSG_HDRLEN + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(-libc::EPROTO, i32::from_ne_bytes);
    -error
}

/// Hands each message of type `kind` in one dump datagram to `each`.
pub fn walk(datagram: &[u8], kind: u16, mut each: impl FnMut(&[u8])) -> Step {
    for msg in attr::messages(datagram) {
        let Some(ty) = u16_at(msg, 4) else { break };
        match ty {
            NLMSG_DONE => return Step::Done,
            NLMSG_ERROR => {
                return match errno_of(msg) {
                    0 => Step::Done,
                    errno => Step::Failed(errno),
                };
            }
            t if t == kind => each(msg),
            _ => {}
        }
    }
    Step::More
}

/// Sends the dump `request` and hands each answer of type `kind` to `each`, until the end.
///
/// # Errors
/// The socket fails, or the kernel refuses the dump (`ENOENT`: no such object).
pub fn run(request: Vec<u8>, kind: u16, each: impl FnMut(&[u8])) -> io::Result<()> {
    run_on(&Socket::open()?, request, kind, each)
}

/// [`run`] over `socket`, which the caller keeps open for its next request.
///
/// Why: closing a netfilter socket that has sent something makes nf_tables finish its
/// deferred destroy work, which waits for an RCU grace period (milliseconds) when a recent
/// transaction deleted something; a reader that runs after every sync keeps its socket.
/// The socket is left with nothing queued when this returns `Ok` or the kernel refused the
/// dump (its error ends the dump); after any other error, replies may still be queued.
///
/// # Errors
/// The socket fails, or the kernel refuses the dump (`ENOENT`: no such object).
pub fn run_on(
    socket: &Socket,
    request: Vec<u8>,
    kind: u16,
    mut each: impl FnMut(&[u8]),
) -> io::Result<()> {
    socket.send(&[request])?;
    // A dump datagram is at most a page or the receive buffer, whichever is larger.
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = socket.recv(&mut buf, false)?;
        match walk(&buf[..n], kind, &mut each) {
            Step::More => {}
            Step::Done => return Ok(()),
            Step::Failed(errno) => return Err(io::Error::from_raw_os_error(errno)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(errno: i32) -> Vec<u8> {
        let mut buf = Vec::new();
        let start = attr::msg_start(&mut buf, NLMSG_ERROR, 0, 1, 0, 0);
        buf.truncate(start + NLMSG_HDRLEN);
        buf.extend_from_slice(&(-errno).to_ne_bytes());
        buf.extend_from_slice(&[0; NLMSG_HDRLEN]);
        attr::msg_end(&mut buf, start);
        buf
    }

    #[test]
    fn a_table_request_asks_for_a_dump_of_the_named_objects() {
        let request = table_request(13, "ip6", &[(1, "kpng"), (2, "svc")]).expect("ip6 is known");
        let mut header = Vec::new();
        let start = attr::msg_start(
            &mut header,
            (NFNL_SUBSYS_NFTABLES << 8) | 13,
            NLM_F_REQUEST | NLM_F_DUMP,
            1,
            libc::NFPROTO_IPV6 as u8,
            0,
        );
        let mut expected = header.clone();
        attr::put_str(&mut expected, 1, "kpng");
        attr::put_str(&mut expected, 2, "svc");
        attr::msg_end(&mut expected, start);
        assert_eq!(request, expected);
        let attrs: Vec<_> = attr::nf_attrs(&request)
            .map(|(ty, p)| (ty, attr::string_attr(p)))
            .collect();
        assert_eq!(attrs, [(1, "kpng".to_string()), (2, "svc".to_string())]);
        assert_eq!(
            table_request(13, "arp", &[]).map_err(|e| e.kind()),
            Err(io::ErrorKind::InvalidInput)
        );
    }

    #[test]
    fn a_refusal_ends_the_dump_with_its_errno() {
        for errno in [libc::ENOENT, libc::EPERM] {
            assert_eq!(walk(&error(errno), 0, |_| {}), Step::Failed(errno));
        }
        assert_eq!(walk(&error(0), 0, |_| {}), Step::Done);
    }
}
