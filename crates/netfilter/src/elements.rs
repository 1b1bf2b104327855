//! One set's or map's elements, read straight from the kernel (an `NFT_MSG_GETSETELEM` dump).
//!
//! Why not `nft list map`: nft 1.0.6 (Debian 12) fills its whole cache first, every table's
//! elements included, so reading another proxy's map next to kpng's own table at 30k Services
//! costs seconds of CPU and hundreds of MB (see [`crate::tables`]). The dump carries the one
//! map's keys and verdicts only.

use std::io;

use crate::attr::{
    self, NFNL_SUBSYS_NFTABLES, NFT_MSG_NEWSETELEM, NFTA_DATA_VALUE, NFTA_DATA_VERDICT,
    NFTA_LIST_ELEM, NFTA_SET_ELEM_DATA, NFTA_SET_ELEM_FLAGS, NFTA_SET_ELEM_KEY,
    NFTA_SET_ELEM_KEY_END, NFTA_SET_ELEM_LIST_ELEMENTS, NFTA_SET_ELEM_LIST_SET,
    NFTA_SET_ELEM_LIST_TABLE, NFTA_SET_ELEM_USERDATA, NFTA_VERDICT_CHAIN, NFTA_VERDICT_CODE,
    string_attr,
};
use crate::dump;

/// `NFT_MSG_GETSETELEM`.
const NFT_MSG_GETSETELEM: u16 = 13;

/// A verdict map element's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// `NF_DROP`, `NF_ACCEPT`, `NFT_JUMP`, `NFT_GOTO`, … (see [`crate::attr`]).
    pub code: i32,
    /// The chain of a jump or goto.
    pub chain: Option<String>,
}

/// One element as the kernel holds it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Element {
    /// The key's bytes (a concatenation's fields each padded to 4 bytes, in network order
    /// where the type is); empty for a catch-all element (`*`), which has no key.
    pub key: Vec<u8>,
    /// The last values of a range in a set with a concatenated interval key
    /// (`NFTA_SET_ELEM_KEY_END`); `None` elsewhere.
    pub key_end: Option<Vec<u8>>,
    /// The verdict of a verdict map's element; `None` for a set's or a data map's.
    pub verdict: Option<Verdict>,
    /// The value of a data map's element (`NFTA_DATA_VALUE`); `None` for a set's or a verdict
    /// map's. Read so that a restart can compare the kernel's elements with the ones it wants
    /// (nftables backend) instead of flushing and refilling every set.
    pub data: Option<Vec<u8>>,
    /// The element's user data (`NFTA_SET_ELEM_USERDATA`: nft's comment and flags TLVs), as
    /// stored; `None` without.
    pub userdata: Option<Vec<u8>>,
    /// `NFTA_SET_ELEM_FLAGS` (`NFT_SET_ELEM_INTERVAL_END`, `NFT_SET_ELEM_CATCHALL`, …); 0 without.
    pub flags: u32,
}

/// The elements of set or map `set` in table `table` of `family` (`ip`, `ip6`, `inet`):
/// `Ok(None)` when there is no such table or set.
///
/// # Errors
/// The socket fails, or the kernel refuses the dump for another reason.
pub fn set_elements(family: &str, table: &str, set: &str) -> io::Result<Option<Vec<Element>>> {
    let mut elements = Vec::new();
    let found = each_set_element(family, table, set, |e| elements.push(e))?;
    Ok(found.then_some(elements))
}

/// Calls `each` with every element of set or map `set` in table `table` of `family`, as the
/// dump delivers them, without collecting them (a dynamic map may hold a million entries):
/// `Ok(false)` when there is no such table or set.
///
/// # Errors
/// The socket fails, or the kernel refuses the dump for another reason (`each` may have seen
/// part of the elements).
pub fn each_set_element(
    family: &str,
    table: &str,
    set: &str,
    mut each: impl FnMut(Element),
) -> io::Result<bool> {
    let request = dump::table_request(
        NFT_MSG_GETSETELEM,
        family,
        &[
            (NFTA_SET_ELEM_LIST_TABLE, table),
            (NFTA_SET_ELEM_LIST_SET, set),
        ],
    )?;
    let kind = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWSETELEM;
    match dump::run(request, kind, |msg| parse_message(msg, &mut each)) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Hands the elements of one `NFT_MSG_NEWSETELEM` message to `each`.
fn parse_message(msg: &[u8], each: &mut impl FnMut(Element)) {
    let lists = attr::nf_attrs(msg).filter(|(ty, _)| *ty == NFTA_SET_ELEM_LIST_ELEMENTS);
    for (_, list) in lists {
        attr::attrs(list)
            .filter(|(ty, _)| *ty == NFTA_LIST_ELEM)
            .filter_map(|(_, elem)| parse_element(elem))
            .for_each(&mut *each);
    }
}

/// One `NFTA_LIST_ELEM`: key, verdict or data, user data and flags. An element without a key
/// (a catch-all) is handed on with an empty one, so that a reader never misses it.
fn parse_element(elem: &[u8]) -> Option<Element> {
    let mut out = Element::default();
    for (ty, payload) in attr::attrs(elem) {
        match ty {
            NFTA_SET_ELEM_KEY => {
                out.key = attr::attrs(payload)
                    .find(|(t, _)| *t == NFTA_DATA_VALUE)
                    .map(|(_, value)| value.to_vec())
                    .unwrap_or_default();
            }
            NFTA_SET_ELEM_KEY_END => {
                out.key_end = attr::attrs(payload)
                    .find(|(t, _)| *t == NFTA_DATA_VALUE)
                    .map(|(_, value)| value.to_vec());
            }
            NFTA_SET_ELEM_DATA => {
                for (t, value) in attr::attrs(payload) {
                    match t {
                        NFTA_DATA_VERDICT => out.verdict = parse_verdict(value),
                        NFTA_DATA_VALUE => out.data = Some(value.to_vec()),
                        _ => {}
                    }
                }
            }
            NFTA_SET_ELEM_USERDATA => out.userdata = Some(payload.to_vec()),
            NFTA_SET_ELEM_FLAGS => {
                out.flags = u32::from_be_bytes(payload.get(..4)?.try_into().ok()?);
            }
            _ => {}
        }
    }
    Some(out)
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
            if e.flags != 0 {
                put_attr(&mut buf, NFTA_SET_ELEM_FLAGS, &e.flags.to_be_bytes());
            }
            if !e.key.is_empty() {
                let k = nest_start(&mut buf, NFTA_SET_ELEM_KEY);
                put_attr(&mut buf, NFTA_DATA_VALUE, &e.key);
                nest_end(&mut buf, k);
            }
            if let Some(end) = &e.key_end {
                let k = nest_start(&mut buf, NFTA_SET_ELEM_KEY_END);
                put_attr(&mut buf, NFTA_DATA_VALUE, end);
                nest_end(&mut buf, k);
            }
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
            if let Some(value) = &e.data {
                let data = nest_start(&mut buf, NFTA_SET_ELEM_DATA);
                put_attr(&mut buf, NFTA_DATA_VALUE, value);
                nest_end(&mut buf, data);
            }
            if let Some(udata) = &e.userdata {
                put_attr(&mut buf, NFTA_SET_ELEM_USERDATA, udata);
            }
            nest_end(&mut buf, elem);
        }
        nest_end(&mut buf, list);
        attr::msg_end(&mut buf, start);
        let done = attr::msg_start(&mut buf, dump::NLMSG_DONE, 0x2, 1, 0, 0);
        attr::msg_end(&mut buf, done);
        buf
    }

    /// Keys, verdicts, data values, user data (comments) and flags come back as the kernel
    /// sent them; a catch-all element (no key) is handed on with an empty key, not dropped.
    #[test]
    fn elements_are_read_from_a_dump_with_their_values_and_comments() {
        let key = vec![10, 96, 0, 10, 17, 0, 0, 0, 0, 53, 0, 0];
        let elements = [
            Element {
                key: key.clone(),
                verdict: Some(Verdict {
                    code: NFT_GOTO,
                    chain: Some("service-AAA".into()),
                }),
                ..Element::default()
            },
            Element {
                key: key[..4].to_vec(),
                verdict: Some(Verdict {
                    code: NF_DROP,
                    chain: None,
                }),
                userdata: Some(vec![0, 4, b'a', b'/', b'b', 0]),
                ..Element::default()
            },
            Element {
                key: key[..4].to_vec(),
                ..Element::default()
            },
            Element {
                key: key[..8].to_vec(),
                key_end: Some(key[4..].to_vec()),
                ..Element::default()
            },
            Element {
                key: key[..8].to_vec(),
                data: Some(vec![10, 244, 1, 2, 0x1f, 0x90, 0, 0]),
                ..Element::default()
            },
            Element {
                verdict: Some(Verdict {
                    code: NF_DROP,
                    chain: None,
                }),
                flags: 4,
                ..Element::default()
            },
        ];
        let mut out = Vec::new();
        let kind = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWSETELEM;
        let step = dump::walk(&datagram(&elements), kind, |m| {
            parse_message(m, &mut |e| out.push(e))
        });
        assert_eq!(step, dump::Step::Done);
        assert_eq!(out, elements);
    }
}
