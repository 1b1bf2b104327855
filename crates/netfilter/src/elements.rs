//! One set's or map's elements, read straight from the kernel (an `NFT_MSG_GETSETELEM` dump).
//!
//! Why not `nft list map`: nft 1.0.6 (Debian 12) fills its whole cache first, every table's
//! elements included, so reading another proxy's map next to kpng's own table at 30k Services
//! costs seconds of CPU and hundreds of MB (see [`crate::tables`]). The dump carries the one
//! map's keys and verdicts only.

use std::io;

use crate::attr::{
    self, NFNL_SUBSYS_NFTABLES, NFT_MSG_NEWSETELEM, NFTA_DATA_VALUE, NFTA_DATA_VERDICT,
    NFTA_LIST_ELEM, NFTA_SET_ELEM_DATA, NFTA_SET_ELEM_KEY, NFTA_SET_ELEM_LIST_ELEMENTS,
    NFTA_SET_ELEM_LIST_SET, NFTA_SET_ELEM_LIST_TABLE, NFTA_VERDICT_CHAIN, NFTA_VERDICT_CODE,
    NLM_F_REQUEST, NLMSG_ERROR, NLMSG_HDRLEN, string_attr, u16_at,
};
use crate::socket::Socket;

/// `NFT_MSG_GETSETELEM`.
const NFT_MSG_GETSETELEM: u16 = 13;
/// `NLM_F_DUMP` (`NLM_F_ROOT | NLM_F_MATCH`).
const NLM_F_DUMP: u16 = 0x300;
/// `NLMSG_DONE`: the end of a dump.
const NLMSG_DONE: u16 = 3;

/// A verdict map element's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// `NF_DROP`, `NF_ACCEPT`, `NFT_JUMP`, `NFT_GOTO`, … (see [`crate::attr`]).
    pub code: i32,
    /// The chain of a jump or goto.
    pub chain: Option<String>,
}

/// One element as the kernel holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element {
    /// The key's bytes (a concatenation's fields each padded to 4 bytes, in network order
    /// where the type is).
    pub key: Vec<u8>,
    /// The verdict of a verdict map's element; `None` for a set's or a data map's.
    pub verdict: Option<Verdict>,
}

/// The elements of set or map `set` in table `table` of `family` (`ip`, `ip6`, `inet`):
/// `Ok(None)` when there is no such table or set.
///
/// # Errors
/// The socket fails, or the kernel refuses the dump for another reason.
pub fn set_elements(family: &str, table: &str, set: &str) -> io::Result<Option<Vec<Element>>> {
    let nfproto = match family {
        "ip" => libc::NFPROTO_IPV4,
        "ip6" => libc::NFPROTO_IPV6,
        "inet" => libc::NFPROTO_INET,
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no element dump for family {other}"),
            ));
        }
    };
    let socket = Socket::open()?;
    let mut request = Vec::with_capacity(96);
    let start = attr::msg_start(
        &mut request,
        (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETSETELEM,
        NLM_F_REQUEST | NLM_F_DUMP,
        1,
        nfproto as u8,
        0,
    );
    attr::put_str(&mut request, NFTA_SET_ELEM_LIST_TABLE, table);
    attr::put_str(&mut request, NFTA_SET_ELEM_LIST_SET, set);
    attr::msg_end(&mut request, start);
    socket.send(&[request])?;
    let mut elements = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = socket.recv(&mut buf, false)?;
        match parse_datagram(&buf[..n], &mut elements) {
            Step::More => {}
            Step::Done => return Ok(Some(elements)),
            Step::Missing => return Ok(None),
            Step::Failed(errno) => return Err(io::Error::from_raw_os_error(errno)),
        }
    }
}

/// Where a dump stands after one datagram.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    More,
    Done,
    /// `ENOENT`: no such table or set.
    Missing,
    Failed(i32),
}

/// Adds the elements of one dump datagram to `out`.
fn parse_datagram(datagram: &[u8], out: &mut Vec<Element>) -> Step {
    for msg in attr::messages(datagram) {
        let Some(kind) = u16_at(msg, 4) else { break };
        match kind {
            NLMSG_DONE => return Step::Done,
            NLMSG_ERROR => {
                let error = msg
                    .get(NLMSG_HDRLEN..NLMSG_HDRLEN + 4)
                    .and_then(|b| b.try_into().ok())
                    .map_or(-libc::EPROTO, i32::from_ne_bytes);
                return match -error {
                    0 => Step::Done,
                    libc::ENOENT => Step::Missing,
                    errno => Step::Failed(errno),
                };
            }
            k if k == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWSETELEM => {
                let lists =
                    attr::nf_attrs(msg).filter(|(ty, _)| *ty == NFTA_SET_ELEM_LIST_ELEMENTS);
                for (_, list) in lists {
                    out.extend(
                        attr::attrs(list)
                            .filter(|(ty, _)| *ty == NFTA_LIST_ELEM)
                            .filter_map(|(_, elem)| parse_element(elem)),
                    );
                }
            }
            _ => {}
        }
    }
    Step::More
}

/// One `NFTA_LIST_ELEM`'s key and verdict.
fn parse_element(elem: &[u8]) -> Option<Element> {
    let (mut key, mut verdict) = (None, None);
    for (ty, payload) in attr::attrs(elem) {
        match ty {
            NFTA_SET_ELEM_KEY => {
                key = attr::attrs(payload)
                    .find(|(t, _)| *t == NFTA_DATA_VALUE)
                    .map(|(_, value)| value.to_vec());
            }
            NFTA_SET_ELEM_DATA => {
                verdict = attr::attrs(payload)
                    .find(|(t, _)| *t == NFTA_DATA_VERDICT)
                    .and_then(|(_, v)| parse_verdict(v));
            }
            _ => {}
        }
    }
    Some(Element { key: key?, verdict })
}

fn parse_verdict(payload: &[u8]) -> Option<Verdict> {
    let (mut code, mut chain) = (None, None);
    for (ty, value) in attr::attrs(payload) {
        match ty {
            NFTA_VERDICT_CODE => code = Some(i32::from_be_bytes(value.get(..4)?.try_into().ok()?)),
            NFTA_VERDICT_CHAIN => chain = Some(string_attr(value)),
            _ => {}
        }
    }
    Some(Verdict { code: code?, chain })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::{NF_DROP, NFT_GOTO, nest_end, nest_start, put_attr, put_str};

    /// A `NEWSETELEM` message as the kernel sends it, holding `elements`, then the dump's end.
    fn datagram(elements: &[Element]) -> Vec<u8> {
        let mut buf = Vec::new();
        let start = attr::msg_start(
            &mut buf,
            (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWSETELEM,
            0x2,
            1,
            libc::NFPROTO_IPV4 as u8,
            0,
        );
        put_str(&mut buf, NFTA_SET_ELEM_LIST_TABLE, "kube-proxy");
        put_str(&mut buf, NFTA_SET_ELEM_LIST_SET, "service-ips");
        let list = nest_start(&mut buf, NFTA_SET_ELEM_LIST_ELEMENTS);
        for e in elements {
            let elem = nest_start(&mut buf, NFTA_LIST_ELEM);
            let k = nest_start(&mut buf, NFTA_SET_ELEM_KEY);
            put_attr(&mut buf, NFTA_DATA_VALUE, &e.key);
            nest_end(&mut buf, k);
            if let Some(verdict) = &e.verdict {
                let data = nest_start(&mut buf, NFTA_SET_ELEM_DATA);
                let v = nest_start(&mut buf, NFTA_DATA_VERDICT);
                put_attr(&mut buf, NFTA_VERDICT_CODE, &verdict.code.to_be_bytes());
                if let Some(chain) = &verdict.chain {
                    put_str(&mut buf, NFTA_VERDICT_CHAIN, chain);
                }
                nest_end(&mut buf, v);
                nest_end(&mut buf, data);
            }
            nest_end(&mut buf, elem);
        }
        nest_end(&mut buf, list);
        attr::msg_end(&mut buf, start);
        let done = attr::msg_start(&mut buf, NLMSG_DONE, 0x2, 1, 0, 0);
        attr::msg_end(&mut buf, done);
        buf
    }

    #[test]
    fn keys_and_verdicts_are_read_from_a_dump() {
        let key = vec![10, 96, 0, 10, 17, 0, 0, 0, 0, 53, 0, 0];
        let elements = [
            Element {
                key: key.clone(),
                verdict: Some(Verdict {
                    code: NFT_GOTO,
                    chain: Some("service-AAA".into()),
                }),
            },
            Element {
                key: key[..4].to_vec(),
                verdict: Some(Verdict {
                    code: NF_DROP,
                    chain: None,
                }),
            },
            Element {
                key: key[..4].to_vec(),
                verdict: None,
            },
        ];
        let mut out = Vec::new();
        assert_eq!(parse_datagram(&datagram(&elements), &mut out), Step::Done);
        assert_eq!(out, elements);
    }

    #[test]
    fn a_missing_set_and_a_refusal_are_told_apart() {
        let error = |errno: i32| {
            let mut buf = Vec::new();
            let start = attr::msg_start(&mut buf, NLMSG_ERROR, 0, 1, 0, 0);
            buf.truncate(start + NLMSG_HDRLEN);
            buf.extend_from_slice(&(-errno).to_ne_bytes());
            buf.extend_from_slice(&[0; NLMSG_HDRLEN]);
            attr::msg_end(&mut buf, start);
            buf
        };
        let mut out = Vec::new();
        assert_eq!(
            parse_datagram(&error(libc::ENOENT), &mut out),
            Step::Missing
        );
        assert_eq!(
            parse_datagram(&error(libc::EPERM), &mut out),
            Step::Failed(libc::EPERM)
        );
    }
}
