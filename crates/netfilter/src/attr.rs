//! Netlink message and attribute encoding: headers, attributes, nests, and the `NLMSG_ERROR`
//! payload the kernel answers with.
//!
//! Why by hand: the nftables backend frames set-element messages in place, element by element,
//! and maps the kernel's extended ACKs back to byte offsets, which generic netlink crates do not
//! (see `kpng-backend-nft`'s `netlink` module docs).
// The protocol constants keep the kernel headers' names and meanings; the headers document them.
#![allow(missing_docs)]

use std::fmt::{self, Write as _};

// Protocol constants (linux/netlink.h, linux/netfilter/nfnetlink.h, linux/netfilter/nf_tables.h).

pub const NLMSG_HDRLEN: usize = 16;
pub const NLMSG_ERROR: u16 = 2;
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_CREATE: u16 = 0x400;
/// In an ACK: the original request is not echoed (`NETLINK_CAP_ACK`).
pub const NLM_F_CAPPED: u16 = 0x100;
/// In an ACK: extended-ACK TLVs follow.
pub const NLM_F_ACK_TLVS: u16 = 0x200;
pub const NLMSGERR_ATTR_MSG: u16 = 1;
pub const NLMSGERR_ATTR_OFFS: u16 = 2;
pub const NLA_F_NESTED: u16 = 0x8000;

pub const NFNL_SUBSYS_NFTABLES: u16 = 10;
pub const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
pub const NFNL_MSG_BATCH_END: u16 = 0x11;
pub const NFT_MSG_NEWSETELEM: u16 = 12;
pub const NFT_MSG_DELSETELEM: u16 = 14;

pub const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
pub const NFTA_SET_ELEM_LIST_SET: u16 = 2;
pub const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
pub const NFTA_LIST_ELEM: u16 = 1;
pub const NFTA_SET_ELEM_KEY: u16 = 1;
pub const NFTA_SET_ELEM_DATA: u16 = 2;
pub const NFTA_SET_ELEM_FLAGS: u16 = 3;
pub const NFTA_SET_ELEM_USERDATA: u16 = 6;
pub const NFTA_SET_ELEM_KEY_END: u16 = 10;
pub const NFTA_DATA_VALUE: u16 = 1;
pub const NFTA_DATA_VERDICT: u16 = 2;
pub const NFTA_VERDICT_CODE: u16 = 1;
pub const NFTA_VERDICT_CHAIN: u16 = 2;
pub const NFT_SET_ELEM_INTERVAL_END: u32 = 1;

pub const NF_DROP: i32 = 0;
pub const NF_ACCEPT: i32 = 1;
pub const NFT_CONTINUE: i32 = -1;
pub const NFT_JUMP: i32 = -3;
pub const NFT_GOTO: i32 = -4;
pub const NFT_RETURN: i32 = -5;

/// libnftnl's element user data TLVs (`NFTNL_UDATA_SET_ELEM_*`).
pub const UDATA_ELEM_COMMENT: u8 = 0;
pub const UDATA_ELEM_FLAGS: u8 = 1;
/// `NFTNL_SET_ELEM_F_INTERVAL_OPEN`: a range that runs to the end of the key space.
pub const UDATA_ELEM_F_INTERVAL_OPEN: u32 = 1;
/// nft refuses longer comments ("comment too long, 128 characters maximum allowed").
pub const COMMENT_MAX: usize = 128;

/// Table, set and chain names are at most this long, NUL included (`NFT_NAME_MAXLEN`).
pub const NAME_MAX: usize = 256;

/// Appends an attribute.
pub fn put_attr(buf: &mut Vec<u8>, ty: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len().next_multiple_of(4), 0);
}

/// Appends a NUL-terminated string attribute.
pub fn put_str(buf: &mut Vec<u8>, ty: u16, s: &str) {
    let len = 4 + s.len() + 1;
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(s.as_bytes());
    buf.push(0);
    buf.resize(buf.len().next_multiple_of(4), 0);
}

/// Writes `Display` output straight into a byte buffer (no intermediate `String`).
struct ByteWriter<'a>(&'a mut Vec<u8>);

impl fmt::Write for ByteWriter<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// Appends a NUL-terminated string attribute holding `value`'s text, without allocating;
/// returns the text's length (NUL excluded).
pub fn put_display(buf: &mut Vec<u8>, ty: u16, value: &dyn fmt::Display) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&[0, 0]);
    buf.extend_from_slice(&ty.to_ne_bytes());
    let _ = write!(ByteWriter(buf), "{value}");
    let text = buf.len() - start - 4;
    buf.push(0);
    let len = (buf.len() - start) as u16;
    buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    buf.resize(buf.len().next_multiple_of(4), 0);
    text
}

/// Starts a nested attribute; returns its offset (for [`nest_end`]).
pub fn nest_start(buf: &mut Vec<u8>, ty: u16) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&[0, 0]);
    buf.extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
    start
}

/// Closes the nested attribute that starts at `start`.
pub fn nest_end(buf: &mut [u8], start: usize) {
    let len = (buf.len() - start) as u16;
    buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
}

/// Starts a netlink message with its `nfgenmsg`; returns its offset (for [`msg_end`]).
pub fn msg_start(
    buf: &mut Vec<u8>,
    ty: u16,
    flags: u16,
    seq: u32,
    family: u8,
    res_id: u16,
) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_len, set by msg_end
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid: the kernel fills in ours
    // struct nfgenmsg
    buf.push(family);
    buf.push(0); // NFNETLINK_V0
    buf.extend_from_slice(&res_id.to_be_bytes());
    start
}

/// Closes the message that starts at `start` (writes its length).
pub fn msg_end(buf: &mut [u8], start: usize) {
    let len = (buf.len() - start) as u32;
    buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
}

/// Writes the sequence number of the message starting at `start`.
pub fn set_seq(buf: &mut [u8], start: usize, seq: u32) {
    buf[start + 8..start + 12].copy_from_slice(&seq.to_ne_bytes());
}

/// The length of `struct nfgenmsg`, which follows every nfnetlink message's header.
pub const NFGENMSG_LEN: usize = 4;

/// The native-endian `u16` at `at`, if the bytes are there.
pub fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

/// The native-endian `u32` at `at`, if the bytes are there.
pub fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The text of a string attribute, up to its NUL.
pub fn string_attr(payload: &[u8]) -> String {
    let end = payload
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(payload.len());
    String::from_utf8_lossy(&payload[..end]).into_owned()
}

/// The netlink messages of one received datagram, in order; a truncated one ends the walk.
pub fn messages(datagram: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let len = u32_at(datagram, at)? as usize;
        if len < NLMSG_HDRLEN || at + len > datagram.len() {
            return None;
        }
        let msg = &datagram[at..at + len];
        at += len.next_multiple_of(4);
        Some(msg)
    })
}

/// The top-level attributes of an nfnetlink message (after its header and `nfgenmsg`), as
/// (type without the nested and byte-order flags, payload); a truncated one ends the walk.
pub fn nf_attrs(msg: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    attrs(msg.get(NLMSG_HDRLEN + NFGENMSG_LEN..).unwrap_or(&[]))
}

/// The attributes inside a nested attribute's payload, as (type without the nested and
/// byte-order flags, payload); a truncated one ends the walk.
pub fn attrs(payload: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut a = 0;
    std::iter::from_fn(move || {
        let (len, ty) = (u16_at(payload, a)? as usize, u16_at(payload, a + 2)?);
        if len < 4 || a + len > payload.len() {
            return None;
        }
        let value = &payload[a + 4..a + len];
        a += len.next_multiple_of(4);
        Some((ty & 0x3fff, value))
    })
}

/// What an `NLMSG_ERROR` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    /// 0 for success, else a negative errno.
    pub error: i32,
    /// `NLMSGERR_ATTR_OFFS`: offset of the rejected attribute from the message start.
    pub offset: Option<u32>,
    /// `NLMSGERR_ATTR_MSG`.
    pub message: Option<String>,
}

/// Parses the payload of an `NLMSG_ERROR` with the message's `flags`.
pub fn parse_ack(payload: &[u8], flags: u16) -> Option<Ack> {
    let error = i32::from_ne_bytes(payload.get(..4)?.try_into().ok()?);
    let orig = payload.get(4..4 + NLMSG_HDRLEN)?;
    let orig_len = u32::from_ne_bytes(orig[..4].try_into().ok()?) as usize;
    let (mut offset, mut message) = (None, None);
    if flags & NLM_F_ACK_TLVS != 0 {
        // Without NLM_F_CAPPED the whole request is echoed before the TLVs.
        let echoed = if flags & NLM_F_CAPPED != 0 {
            NLMSG_HDRLEN
        } else {
            orig_len.next_multiple_of(4)
        };
        let mut tlvs = payload.get(4 + echoed..).unwrap_or(&[]);
        while tlvs.len() >= 4 {
            let len = u16::from_ne_bytes([tlvs[0], tlvs[1]]) as usize;
            let ty = u16::from_ne_bytes([tlvs[2], tlvs[3]]) & !NLA_F_NESTED;
            if len < 4 || len > tlvs.len() {
                break;
            }
            let value = &tlvs[4..len];
            match ty {
                NLMSGERR_ATTR_OFFS if value.len() >= 4 => {
                    offset = Some(u32::from_ne_bytes(value[..4].try_into().ok()?));
                }
                NLMSGERR_ATTR_MSG => {
                    let text = value.split(|b| *b == 0).next().unwrap_or(&[]);
                    message = Some(String::from_utf8_lossy(text).into_owned());
                }
                _ => {}
            }
            tlvs = tlvs.get(len.next_multiple_of(4)..).unwrap_or(&[]);
        }
    }
    Some(Ack {
        error,
        offset,
        message,
    })
}

/// Whether `bytes` (a message's attributes) hold `name` as a NUL-terminated string (netlink
/// strings are; a longer name that starts with `name` does not match): how a rule's
/// expressions are searched for the chain it jumps to without decoding them.
pub fn names(bytes: &[u8], name: &str) -> bool {
    let mut needle = name.as_bytes().to_vec();
    needle.push(0);
    bytes.windows(needle.len()).any(|w| w == needle.as_slice())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_are_parsed_with_and_without_tlvs() {
        // error -2, capped, with OFFS 40 and a message.
        let mut p = Vec::new();
        p.extend_from_slice(&(-2i32).to_ne_bytes());
        p.extend_from_slice(&[0; NLMSG_HDRLEN]);
        put_attr(&mut p, NLMSGERR_ATTR_MSG, b"nope\0");
        put_attr(&mut p, NLMSGERR_ATTR_OFFS, &40u32.to_ne_bytes());
        let ack = parse_ack(&p, NLM_F_CAPPED | NLM_F_ACK_TLVS).expect("parses");
        assert_eq!(
            (ack.error, ack.offset, ack.message.as_deref()),
            (-2, Some(40), Some("nope"))
        );
        let ack = parse_ack(&p[..4 + NLMSG_HDRLEN], NLM_F_CAPPED).expect("parses");
        assert_eq!((ack.error, ack.offset, ack.message), (-2, None, None));
    }

    #[test]
    fn display_attributes_match_string_attributes() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        put_str(&mut a, 2, "cluster-n3");
        let len = put_display(&mut b, 2, &"cluster-n3");
        assert_eq!(a, b);
        assert_eq!(len, 10);
    }
}
