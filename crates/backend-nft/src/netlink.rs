//! Writing set and map elements straight over netlink (`NETLINK_NETFILTER`), without the nft
//! language.
//!
//! Why: all per-Service state lives in elements of a fixed set of named sets and maps
//! ([`crate::ruleset`]), and sending them as nft text makes nft parse, evaluate and linearise
//! every element: at 300k elements the parse alone dominates a full load. Elements are just
//! bytes to the kernel, and the layout of every set is fixed by our own skeleton, so this module
//! turns the element text that [`crate::elements`] produces (`10.96.0.10 . tcp . 80 . 0`,
//! `goto cluster-n3`, …) into `NFT_MSG_NEWSETELEM` / `NFT_MSG_DELSETELEM` messages itself.
//!
//! How:
//! - [`layout`] mirrors the set declarations of [`crate::ruleset::skeleton`]: the fields of
//!   each key and value, whether the set is an interval set, whether values are verdicts. The
//!   kernel checks key and value lengths against the set, so a layout that drifted from the
//!   skeleton fails loudly (`EINVAL`), it does not write garbage.
//! - Byte orders are nft's: addresses and ports in network order, `inet_proto` one byte, marks
//!   and the `numgen` slot in host order; in a concatenation every field is zero-padded to a
//!   4-byte register. CIDRs in the `flags interval` sets become a start and an end element
//!   (`service-cidrs`, one field: end = last address + 1 flagged `NFT_SET_ELEM_INTERVAL_END`,
//!   or an "open" start when that overflows) or one element with `NFTA_SET_ELEM_KEY_END`
//!   (`firewall-allow`, a concatenation: end = last address), exactly what nft 1.0.6 sends.
//! - One [`NetlinkWriter::apply`] is one nfnetlink batch (`NFNL_MSG_BATCH_BEGIN` … `END`), hence
//!   one atomic kernel transaction. Elements are packed into as many messages as needed (an
//!   attribute length is 16 bits, so one message carries at most ~64 KiB of elements), and the
//!   whole batch goes out in ONE `send`: the kernel processes a batch per datagram, so a batch
//!   cannot span several sends. The socket send buffer is grown to fit (`SO_SNDBUFFORCE`).
//! - Every message asks for an ACK and has its own sequence number; with `NETLINK_EXT_ACK` the
//!   kernel also says which attribute (that is, which element) it rejected, so an error names
//!   the set and the element.
//!
//! Unsafe code: the socket is a raw `AF_NETLINK` socket driven through `libc` (std has no
//! netlink sockets); the five system calls are in the `sys` submodule, each with its SAFETY
//! argument.
#![allow(unsafe_code)]

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};

use kpng_model::Family;

use crate::store::Element;

// ---------------------------------------------------------------------------------------------
// Protocol constants (linux/netlink.h, linux/netfilter/nfnetlink.h, linux/netfilter/nf_tables.h)
// ---------------------------------------------------------------------------------------------

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
/// In an ACK: the original request is not echoed (`NETLINK_CAP_ACK`).
const NLM_F_CAPPED: u16 = 0x100;
/// In an ACK: extended-ACK TLVs follow.
const NLM_F_ACK_TLVS: u16 = 0x200;
const NLMSGERR_ATTR_MSG: u16 = 1;
const NLMSGERR_ATTR_OFFS: u16 = 2;
const NLA_F_NESTED: u16 = 0x8000;

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;

const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_FLAGS: u16 = 3;
const NFTA_SET_ELEM_USERDATA: u16 = 6;
const NFTA_SET_ELEM_KEY_END: u16 = 10;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NFT_SET_ELEM_INTERVAL_END: u32 = 1;

const NF_DROP: i32 = 0;
const NF_ACCEPT: i32 = 1;
const NFT_CONTINUE: i32 = -1;
const NFT_JUMP: i32 = -3;
const NFT_GOTO: i32 = -4;
const NFT_RETURN: i32 = -5;

/// libnftnl's element user data TLVs (`NFTNL_UDATA_SET_ELEM_*`).
const UDATA_ELEM_COMMENT: u8 = 0;
const UDATA_ELEM_FLAGS: u8 = 1;
/// `NFTNL_SET_ELEM_F_INTERVAL_OPEN`: a range that runs to the end of the key space.
const UDATA_ELEM_F_INTERVAL_OPEN: u32 = 1;
/// nft refuses longer comments ("comment too long, 128 characters maximum allowed").
const COMMENT_MAX: usize = 128;

/// Table, set and chain names are at most this long, NUL included (`NFT_NAME_MAXLEN`).
const NAME_MAX: usize = 256;
/// Largest `NFTA_SET_ELEM_LIST_ELEMENTS` nest we build: its length field is 16 bits.
const MAX_ELEMENTS_NEST: usize = 64 * 1024 - 1024;
/// Largest key or value: `NFT_DATA_VALUE_MAXLEN`.
const DATA_MAX: usize = 64;
/// Receive buffer for ACKs; with `NETLINK_CAP_ACK` each is well under 1 KiB.
const RECV_BUF: usize = 256 * 1024;
/// A reply the kernel owes us arrives while `send` runs (nfnetlink processes a batch in the
/// sender's context); this only guards against waiting forever on a bug.
const RECV_TIMEOUT_SECS: u32 = 30;

// ---------------------------------------------------------------------------------------------
// Layouts
// ---------------------------------------------------------------------------------------------

/// One field of a key or value, as nft's datatypes lay it out in a register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// `ipv4_addr` (4 bytes) or `ipv6_addr` (16 bytes) by the table's family, network order.
    Addr,
    /// `inet_proto` (`meta l4proto`): 1 byte; names `tcp`, `udp`, `sctp`, … or a number.
    Proto,
    /// `inet_service` (`th dport`): 2 bytes, network order.
    Port,
    /// `mark` (`ct mark`): 4 bytes, host order; text `0x6b70000e` or decimal.
    Mark,
    /// The `numgen random mod 1` slot of the endpoint maps: a 4-byte integer in host order.
    Slot,
}

impl Field {
    fn len(self, family: Family) -> usize {
        match (self, family) {
            (Field::Addr, Family::V4) => 4,
            (Field::Addr, Family::V6) => 16,
            (Field::Proto, _) => 1,
            (Field::Port, _) => 2,
            (Field::Mark | Field::Slot, _) => 4,
        }
    }
}

/// How an interval set stores a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interval {
    /// Not an interval set: one exact key per element.
    None,
    /// A one-field interval set (the kernel's rbtree): a start element and an end element whose
    /// key is the last value + 1, flagged `NFT_SET_ELEM_INTERVAL_END`.
    Single,
    /// An interval set with a concatenated key (the kernel's pipapo): one element with
    /// `NFTA_SET_ELEM_KEY` (first values) and `NFTA_SET_ELEM_KEY_END` (last values).
    Concat,
}

/// What a map stores per element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Data {
    /// A set: no value.
    None,
    /// A verdict map: `drop`, `accept`, `return`, `continue`, `goto CHAIN`, `jump CHAIN`.
    Verdict,
    /// A data map: these fields (concatenated and padded like a key when more than one).
    Value(&'static [Field]),
}

/// The byte layout of one named set or map: what [`crate::ruleset::skeleton`] declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The key's fields, in order (`type a . b . c`).
    pub key: &'static [Field],
    /// Whether and how the set holds ranges (`flags interval`).
    pub interval: Interval,
    /// The map's value.
    pub data: Data,
}

use Field::{Addr, Mark, Port, Proto, Slot};

const VIP: &[Field] = &[Addr, Proto, Port];
const NODE_PORT: &[Field] = &[Proto, Port];
const ENDPOINT: &[Field] = &[Addr, Port];

const fn set(key: &'static [Field]) -> Layout {
    Layout {
        key,
        interval: Interval::None,
        data: Data::None,
    }
}

const fn vmap(key: &'static [Field]) -> Layout {
    Layout {
        key,
        interval: Interval::None,
        data: Data::Verdict,
    }
}

const fn map(key: &'static [Field], value: &'static [Field]) -> Layout {
    Layout {
        key,
        interval: Interval::None,
        data: Data::Value(value),
    }
}

/// The layout of a set or map of our table, by name; `None` for a name the skeleton does not
/// declare. Keep in step with [`crate::ruleset::skeleton`] (the netns tests compare `nft list`
/// output of both paths for every set).
pub fn layout(set_name: &str) -> Option<Layout> {
    Some(match set_name {
        "cluster-ips" | "nodeport-ips" => set(&[Addr]),
        "service-cidrs" => Layout {
            key: &[Addr],
            interval: Interval::Single,
            data: Data::None,
        },
        "firewall-ips" => set(VIP),
        "firewall-allow" => Layout {
            key: &[Addr, Proto, Port, Addr],
            interval: Interval::Concat,
            data: Data::None,
        },
        "hairpin-connections" => set(&[Addr, Addr, Proto, Port]),
        "affinity-valid" => set(&[Mark, Addr, Port]),
        "service-ips" | "no-endpoint-services" | "cluster-pick" | "local-pick" => vmap(VIP),
        "service-nodeports"
        | "no-endpoint-nodeports"
        | "nodeport-cluster-pick"
        | "nodeport-local-pick" => vmap(NODE_PORT),
        "affinity-timeouts" => vmap(&[Mark]),
        // Endpoint slots, one map per protocol (`typeof ip daddr . tcp dport . numgen random
        // mod 1 : ip daddr . tcp dport`; node ports without the address).
        "cluster-endpoints-tcp"
        | "cluster-endpoints-udp"
        | "cluster-endpoints-sctp"
        | "local-endpoints-tcp"
        | "local-endpoints-udp"
        | "local-endpoints-sctp" => map(&[Addr, Port, Slot], ENDPOINT),
        "nodeport-cluster-endpoints-tcp"
        | "nodeport-cluster-endpoints-udp"
        | "nodeport-cluster-endpoints-sctp"
        | "nodeport-local-endpoints-tcp"
        | "nodeport-local-endpoints-udp"
        | "nodeport-local-endpoints-sctp" => map(&[Port, Slot], ENDPOINT),
        "affinity-ids-cluster" | "affinity-ids-local" => map(VIP, &[Mark]),
        "nodeport-affinity-ids-cluster" | "nodeport-affinity-ids-local" => map(NODE_PORT, &[Mark]),
        "affinity" => map(&[Addr, Mark], ENDPOINT),
        "affinity-addr" => map(&[Mark, Slot], &[Addr]),
        "affinity-port" => map(&[Mark, Slot], &[Port]),
        _ => return None,
    })
}

// ---------------------------------------------------------------------------------------------
// Text → bytes
// ---------------------------------------------------------------------------------------------

/// A key or value: up to `NFT_DATA_VALUE_MAXLEN` bytes, without allocating.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Bytes {
    buf: [u8; DATA_MAX],
    len: usize,
}

impl Bytes {
    const EMPTY: Bytes = Bytes {
        buf: [0; DATA_MAX],
        len: 0,
    };

    fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    fn push(&mut self, bytes: &[u8], pad_to: usize) -> Result<(), String> {
        let end = self.len + pad_to.max(bytes.len());
        if end > DATA_MAX {
            return Err(format!("longer than {DATA_MAX} bytes"));
        }
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        // Padding bytes are already zero (buffers start zeroed and only grow).
        self.len = end;
        Ok(())
    }

    /// Adds one to the value read as a big-endian number; `false` when it wraps to zero.
    fn increment(&mut self) -> bool {
        for b in self.buf[..self.len].iter_mut().rev() {
            let (v, carry) = b.overflowing_add(1);
            *b = v;
            if !carry {
                return true;
            }
        }
        false
    }
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.as_slice() {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// One field value, or a range of them (`lo` = `hi` for a single value).
struct FieldValue {
    lo: [u8; 16],
    hi: [u8; 16],
    len: usize,
}

impl FieldValue {
    fn single(bytes: &[u8]) -> FieldValue {
        let mut lo = [0; 16];
        lo[..bytes.len()].copy_from_slice(bytes);
        FieldValue {
            lo,
            hi: lo,
            len: bytes.len(),
        }
    }

    fn range(lo_bytes: &[u8], hi_bytes: &[u8]) -> Result<FieldValue, String> {
        if lo_bytes > hi_bytes {
            return Err("range runs backwards".into());
        }
        let mut v = FieldValue::single(lo_bytes);
        v.hi[..hi_bytes.len()].copy_from_slice(hi_bytes);
        Ok(v)
    }

    fn is_single(&self) -> bool {
        self.lo == self.hi
    }
}

fn parse_u32(text: &str) -> Result<u32, String> {
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.map_err(|_| format!("`{text}` is not a 32-bit number"))
}

fn parse_port(text: &str) -> Result<u16, String> {
    text.parse()
        .map_err(|_| format!("`{text}` is not a port number"))
}

fn parse_proto(text: &str) -> Result<u8, String> {
    Ok(match text {
        "icmp" => 1,
        "igmp" => 2,
        "tcp" => 6,
        "udp" => 17,
        "gre" => 47,
        "esp" => 50,
        "ah" => 51,
        "icmpv6" | "ipv6-icmp" => 58,
        "sctp" => 132,
        "udplite" => 136,
        "dccp" => 33,
        _ => text
            .parse()
            .map_err(|_| format!("`{text}` is not a protocol"))?,
    })
}

fn parse_addr(family: Family, text: &str, ranged: bool) -> Result<FieldValue, String> {
    if let Some((a, b)) = text.split_once('-') {
        if !ranged {
            return Err(format!("range `{text}` in a set without `flags interval`"));
        }
        return match family {
            Family::V4 => FieldValue::range(&v4(a)?.octets(), &v4(b)?.octets()),
            Family::V6 => FieldValue::range(&v6(a)?.octets(), &v6(b)?.octets()),
        };
    }
    let Some((addr, prefix)) = text.split_once('/') else {
        return Ok(match family {
            Family::V4 => FieldValue::single(&v4(text)?.octets()),
            Family::V6 => FieldValue::single(&v6(text)?.octets()),
        });
    };
    let prefix: u32 = prefix
        .parse()
        .map_err(|_| format!("`{text}`: bad prefix length"))?;
    let value = match family {
        Family::V4 => {
            let a = u32::from(v4(addr)?);
            if prefix > 32 {
                return Err(format!("`{text}`: prefix longer than 32"));
            }
            let host = u32::MAX.checked_shr(prefix).unwrap_or(0);
            FieldValue::range(&(a & !host).to_be_bytes(), &(a | host).to_be_bytes())?
        }
        Family::V6 => {
            let a = u128::from(v6(addr)?);
            if prefix > 128 {
                return Err(format!("`{text}`: prefix longer than 128"));
            }
            let host = u128::MAX.checked_shr(prefix).unwrap_or(0);
            FieldValue::range(&(a & !host).to_be_bytes(), &(a | host).to_be_bytes())?
        }
    };
    if !ranged && !value.is_single() {
        return Err(format!("prefix `{text}` in a set without `flags interval`"));
    }
    Ok(value)
}

fn v4(text: &str) -> Result<Ipv4Addr, String> {
    text.parse()
        .map_err(|_| format!("`{text}` is not an IPv4 address"))
}

fn v6(text: &str) -> Result<Ipv6Addr, String> {
    text.parse()
        .map_err(|_| format!("`{text}` is not an IPv6 address"))
}

fn parse_field(
    field: Field,
    family: Family,
    text: &str,
    ranged: bool,
) -> Result<FieldValue, String> {
    match field {
        Field::Addr => parse_addr(family, text, ranged),
        Field::Proto => Ok(FieldValue::single(&[parse_proto(text)?])),
        Field::Port => match text.split_once('-') {
            Some((a, b)) if ranged => {
                FieldValue::range(&parse_port(a)?.to_be_bytes(), &parse_port(b)?.to_be_bytes())
            }
            Some(_) => Err(format!("range `{text}` in a set without `flags interval`")),
            None => Ok(FieldValue::single(&parse_port(text)?.to_be_bytes())),
        },
        // Host order: nft's `mark` and integer types (`numgen`) are host-endian.
        Field::Mark | Field::Slot => Ok(FieldValue::single(&parse_u32(text)?.to_ne_bytes())),
    }
}

/// Encodes `text` (fields joined by ` . `) with `fields`: the first and last values (equal
/// unless a field is a range or prefix, which only `ranged` allows).
fn encode_fields(
    fields: &[Field],
    family: Family,
    text: &str,
    ranged: bool,
) -> Result<(Bytes, Bytes), String> {
    let concat = fields.len() > 1;
    let (mut lo, mut hi) = (Bytes::EMPTY, Bytes::EMPTY);
    let mut parts = text.split(" . ");
    for (i, field) in fields.iter().enumerate() {
        let part = parts
            .next()
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .ok_or_else(|| format!("{} fields expected, found {i}", fields.len()))?;
        let v = parse_field(*field, family, part, ranged)?;
        debug_assert_eq!(v.len, field.len(family));
        // Concatenated fields each take a whole 4-byte register.
        let pad = if concat { v.len.next_multiple_of(4) } else { 0 };
        lo.push(&v.lo[..v.len], pad)?;
        hi.push(&v.hi[..v.len], pad)?;
    }
    if parts.next().is_some() {
        return Err(format!("more than {} fields", fields.len()));
    }
    Ok((lo, hi))
}

/// A verdict: its code and, for `goto`/`jump`, the chain.
fn parse_verdict(text: &str) -> Result<(i32, Option<&str>), String> {
    let text = text.trim();
    let (word, chain) = match text.split_once(' ') {
        Some((w, c)) => (w, Some(c.trim())),
        None => (text, None),
    };
    let code = match (word, chain) {
        ("drop", None) => NF_DROP,
        ("accept", None) => NF_ACCEPT,
        ("continue", None) => NFT_CONTINUE,
        ("return", None) => NFT_RETURN,
        ("goto", Some(_)) => NFT_GOTO,
        ("jump", Some(_)) => NFT_JUMP,
        _ => return Err(format!("`{text}` is not a verdict")),
    };
    if let Some(c) = chain {
        check_name(c).map_err(|e| format!("chain {e}"))?;
    }
    Ok((code, chain))
}

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() >= NAME_MAX || name.contains('\0') {
        Err(format!("name `{name}` is empty, too long or contains NUL"))
    } else {
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Netlink message building
// ---------------------------------------------------------------------------------------------

fn put_attr(buf: &mut Vec<u8>, ty: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len().next_multiple_of(4), 0);
}

fn put_str(buf: &mut Vec<u8>, ty: u16, s: &str) {
    let len = 4 + s.len() + 1;
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(s.as_bytes());
    buf.push(0);
    buf.resize(buf.len().next_multiple_of(4), 0);
}

fn nest_start(buf: &mut Vec<u8>, ty: u16) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&[0, 0]);
    buf.extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
    start
}

fn nest_end(buf: &mut [u8], start: usize) {
    let len = (buf.len() - start) as u16;
    buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
}

fn put_data_value(buf: &mut Vec<u8>, ty: u16, value: &Bytes) {
    let nest = nest_start(buf, ty);
    put_attr(buf, NFTA_DATA_VALUE, value.as_slice());
    nest_end(buf, nest);
}

/// Starts a netlink message; returns its offset (for [`msg_end`]).
fn msg_start(buf: &mut Vec<u8>, ty: u16, flags: u16, seq: u32, family: u8, res_id: u16) -> usize {
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

fn msg_end(buf: &mut [u8], start: usize) {
    let len = (buf.len() - start) as u32;
    buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
}

/// What a message of a batch does, for error reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `flush set`: a `NFT_MSG_DELSETELEM` without elements.
    Flush,
    /// `delete element`.
    Delete,
    /// `add element`.
    Add,
    /// The batch as a whole: an error the kernel reports against `BATCH_BEGIN`, such as a
    /// failed commit, or `EPERM` (no `CAP_NET_ADMIN` in the namespace's user namespace) before
    /// any message is looked at.
    Batch,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operation::Flush => "flush of set",
            Operation::Delete => "delete from set",
            Operation::Add => "add to set",
            Operation::Batch => "the batch as a whole",
        })
    }
}

/// One message of a batch: what it does and where each of its elements starts.
#[derive(Debug)]
struct MsgInfo {
    op: Operation,
    set: String,
    /// (offset of the element's `NFTA_LIST_ELEM` from the message start, index of the element
    /// in the caller's `deletes` or `adds`), in offset order.
    elems: Vec<(u32, u32)>,
}

/// A whole transaction, ready to send: its messages lie in several buffers (`parts`), sent
/// together as one datagram with `sendmsg`, so the elements are never copied into one buffer.
#[derive(Debug)]
struct Batch {
    parts: Vec<Vec<u8>>,
    /// Sequence number of `BATCH_BEGIN`; message `i` has `first_seq + 1 + i`.
    first_seq: u32,
    msgs: Vec<MsgInfo>,
}

impl Batch {
    /// Total size of the datagram.
    fn len(&self) -> usize {
        self.parts.iter().map(Vec::len).sum()
    }
}

/// Size of the buffers messages are framed into. A message is at most ~64 KiB, so a buffer
/// wastes at most that; pages not yet written cost no memory.
const SEGMENT: usize = 1 << 20;

/// Room a new message needs in its buffer: headers, table and set names, a full nest.
const MESSAGE_ROOM: usize = MAX_ELEMENTS_NEST + 1024;

/// One message of a run, framed in place in the run's buffers.
#[derive(Debug)]
struct RunMsg {
    /// Which buffer of the run, and where in it the message starts.
    segment: usize,
    start: usize,
    /// (offset of the element from the message start, the caller's index for it).
    elems: Vec<(u32, u32)>,
}

/// The messages of one operation on one set, framed as elements arrive. Sequence numbers are
/// written when the whole batch is put in order ([`ElementBatch::frame`]).
#[derive(Debug)]
struct SetRun {
    op: Operation,
    set: String,
    layout: Layout,
    segments: Vec<Vec<u8>>,
    msgs: Vec<RunMsg>,
    /// The elements nest of the last message, while it is open.
    open_nest: Option<usize>,
}

impl SetRun {
    fn push(&mut self, family: u8, table: &str, elem: &[u8], index: u32) {
        if let Some(nest) = self.open_nest
            && self.segments.last().map_or(0, Vec::len) - nest + elem.len() > MAX_ELEMENTS_NEST
        {
            self.close();
        }
        if self.open_nest.is_none() {
            self.open(family, table);
        }
        let (Some(buf), Some(msg)) = (self.segments.last_mut(), self.msgs.last_mut()) else {
            return;
        };
        msg.elems.push(((buf.len() - msg.start) as u32, index));
        buf.extend_from_slice(elem);
    }

    fn open(&mut self, family: u8, table: &str) {
        let room = self
            .segments
            .last()
            .is_some_and(|b| b.capacity() - b.len() >= MESSAGE_ROOM);
        if !room {
            self.segments.push(Vec::with_capacity(SEGMENT));
        }
        let segment = self.segments.len() - 1;
        let buf = &mut self.segments[segment];
        let start = open_element_msg(buf, family, table, &self.set, self.op);
        self.open_nest =
            (self.op != Operation::Flush).then(|| nest_start(buf, NFTA_SET_ELEM_LIST_ELEMENTS));
        self.msgs.push(RunMsg {
            segment,
            start,
            elems: Vec::new(),
        });
    }

    fn close(&mut self) {
        if let (Some(nest), Some(msg), Some(buf)) = (
            self.open_nest.take(),
            self.msgs.last(),
            self.segments.last_mut(),
        ) {
            nest_end(buf, nest);
            msg_end(buf, msg.start);
        }
    }
}

/// Starts an element message (`NEWSETELEM` to add, `DELSETELEM` to delete or flush) on `set`,
/// sequence number still 0; returns where it starts.
fn open_element_msg(buf: &mut Vec<u8>, family: u8, table: &str, set: &str, op: Operation) -> usize {
    let (ty, flags) = match op {
        Operation::Add => (NFT_MSG_NEWSETELEM, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE),
        _ => (NFT_MSG_DELSETELEM, NLM_F_REQUEST | NLM_F_ACK),
    };
    let msg = msg_start(buf, (NFNL_SUBSYS_NFTABLES << 8) | ty, flags, 0, family, 0);
    put_str(buf, NFTA_SET_ELEM_LIST_TABLE, table);
    put_str(buf, NFTA_SET_ELEM_LIST_SET, set);
    msg
}

/// Writes the sequence number of the message starting at `start`.
fn set_seq(buf: &mut [u8], start: usize, seq: u32) {
    buf[start + 8..start + 12].copy_from_slice(&seq.to_ne_bytes());
}

/// One transaction being assembled element by element: flushes, deletes and adds are encoded
/// and framed into messages as they come, grouped per set.
///
/// Why not a list of elements: a full sync at 30k Services has ~300k elements, whose text
/// would be ~60 MB held at once; framed, they are ~14 MB, and the caller can generate them
/// one Service at a time. Each element gets an index per operation (0, 1, … in the order
/// given) so an error the kernel reports can be traced back to it ([`NetlinkWriter::commit`]).
#[derive(Debug)]
pub struct ElementBatch {
    family: Family,
    table: String,
    flushes: Vec<String>,
    runs: Vec<SetRun>,
    deletes: u32,
    adds: u32,
    scratch: Vec<u8>,
}

impl ElementBatch {
    /// An empty transaction on one family's table.
    pub fn new(family: Family, table: &str) -> Result<ElementBatch, NetlinkError> {
        check_name(table).map_err(|reason| NetlinkError::Encode {
            set: table.to_string(),
            element: String::new(),
            reason: format!("table {reason}"),
        })?;
        Ok(ElementBatch {
            family,
            table: table.to_string(),
            flushes: Vec::new(),
            runs: Vec::new(),
            deletes: 0,
            adds: 0,
            scratch: Vec::with_capacity(512),
        })
    }

    /// A transaction of whole lists: flushes, then deletes, then adds.
    pub fn of(
        family: Family,
        table: &str,
        flush: &[&str],
        deletes: &[(&str, &str)],
        adds: &[Element],
    ) -> Result<ElementBatch, NetlinkError> {
        let mut batch = ElementBatch::new(family, table)?;
        for set in flush {
            batch.flush(set)?;
        }
        for (set, key) in deletes {
            batch.delete(set, key)?;
        }
        for e in adds {
            batch.add(e)?;
        }
        Ok(batch)
    }

    /// Whether the transaction would do nothing.
    pub fn is_empty(&self) -> bool {
        self.flushes.is_empty() && self.runs.is_empty()
    }

    /// Number of elements added so far.
    pub fn adds(&self) -> usize {
        self.adds as usize
    }

    /// Empties `set` first (flushes go before every delete and add).
    pub fn flush(&mut self, set: &str) -> Result<(), NetlinkError> {
        check_name(set).map_err(|reason| NetlinkError::Encode {
            set: set.to_string(),
            element: String::new(),
            reason: format!("set {reason}"),
        })?;
        self.flushes.push(set.to_string());
        Ok(())
    }

    /// Removes the element with `key` from `set` (deletes go before every add, so a delete and
    /// an add of the same key replace its value).
    pub fn delete(&mut self, set: &str, key: &str) -> Result<(), NetlinkError> {
        let index = self.deletes;
        self.encode(Operation::Delete, set, key, None, None, index)?;
        self.deletes += 1;
        Ok(())
    }

    /// Adds `e` to its set.
    pub fn add(&mut self, e: &Element) -> Result<(), NetlinkError> {
        let index = self.adds;
        self.encode(
            Operation::Add,
            e.set,
            &e.key,
            e.value.as_deref(),
            e.comment.as_deref(),
            index,
        )?;
        self.adds += 1;
        Ok(())
    }

    fn encode(
        &mut self,
        op: Operation,
        set: &str,
        key: &str,
        value: Option<&str>,
        comment: Option<&str>,
        index: u32,
    ) -> Result<(), NetlinkError> {
        let (family, fam) = (self.family, nfproto(self.family));
        let run = self.run(op, set, key)?;
        // A delete names the element by its key only (and, for ranges, both ends).
        let layout = match op {
            Operation::Add => run.layout,
            _ => Layout {
                data: Data::None,
                ..run.layout
            },
        };
        let scratch = &mut self.scratch;
        scratch.clear();
        encode_element(scratch, &layout, family, key, value, comment).map_err(|reason| {
            NetlinkError::Encode {
                set: set.to_string(),
                element: describe(key, value),
                reason,
            }
        })?;
        let i = self.runs.iter().rposition(|r| r.op == op && r.set == set);
        if let Some(run) = i.and_then(|i| self.runs.get_mut(i)) {
            run.push(fam, &self.table, &self.scratch, index);
        }
        Ok(())
    }

    /// The run of `op` on `set`, created (with the set's layout) on first use.
    fn run(&mut self, op: Operation, set: &str, example: &str) -> Result<&SetRun, NetlinkError> {
        let i = match self.runs.iter().rposition(|r| r.op == op && r.set == set) {
            Some(i) => i,
            None => {
                check_name(set).map_err(|reason| NetlinkError::Encode {
                    set: set.to_string(),
                    element: example.to_string(),
                    reason: format!("set {reason}"),
                })?;
                self.runs.push(SetRun {
                    op,
                    set: set.to_string(),
                    layout: layout_or_err(set, example)?,
                    segments: Vec::new(),
                    msgs: Vec::new(),
                    open_nest: None,
                });
                self.runs.len() - 1
            }
        };
        Ok(&self.runs[i])
    }

    /// Puts the transaction in order: `BATCH_BEGIN`, flushes, deletes, adds, `BATCH_END`,
    /// numbering the messages from `first_seq`.
    fn frame(self, first_seq: u32) -> Batch {
        let fam = nfproto(self.family);
        let mut head = Vec::new();
        let begin = msg_start(
            &mut head,
            NFNL_MSG_BATCH_BEGIN,
            NLM_F_REQUEST,
            first_seq,
            libc::AF_UNSPEC as u8,
            NFNL_SUBSYS_NFTABLES,
        );
        msg_end(&mut head, begin);
        let mut msgs = Vec::new();
        let mut seq = first_seq;
        for set in &self.flushes {
            seq = seq.wrapping_add(1);
            let msg = open_element_msg(&mut head, fam, &self.table, set, Operation::Flush);
            msg_end(&mut head, msg);
            set_seq(&mut head, msg, seq);
            msgs.push(MsgInfo {
                op: Operation::Flush,
                set: set.clone(),
                elems: Vec::new(),
            });
        }
        let mut parts = vec![head];
        let (mut runs, adds): (Vec<SetRun>, Vec<SetRun>) = self
            .runs
            .into_iter()
            .partition(|r| r.op == Operation::Delete);
        runs.extend(adds);
        for mut run in runs {
            run.close();
            for msg in run.msgs {
                seq = seq.wrapping_add(1);
                if let Some(buf) = run.segments.get_mut(msg.segment) {
                    set_seq(buf, msg.start, seq);
                }
                msgs.push(MsgInfo {
                    op: run.op,
                    set: run.set.clone(),
                    elems: msg.elems,
                });
            }
            parts.extend(run.segments);
        }
        let mut tail = Vec::new();
        let end = msg_start(
            &mut tail,
            NFNL_MSG_BATCH_END,
            NLM_F_REQUEST,
            seq.wrapping_add(1),
            libc::AF_UNSPEC as u8,
            NFNL_SUBSYS_NFTABLES,
        );
        msg_end(&mut tail, end);
        parts.push(tail);
        Batch {
            parts,
            first_seq,
            msgs,
        }
    }
}

/// A map element's value, encoded.
enum ElemData<'a> {
    /// Value bytes (`NFTA_DATA_VALUE`).
    Value(Bytes),
    /// Verdict code and chain (`NFTA_DATA_VERDICT`).
    Verdict(i32, Option<&'a str>),
}

/// Encodes one element (or, for a one-field interval set, its start and end elements) into
/// `out` as `NFTA_LIST_ELEM` attributes.
fn encode_element(
    out: &mut Vec<u8>,
    layout: &Layout,
    family: Family,
    key: &str,
    value: Option<&str>,
    comment: Option<&str>,
) -> Result<(), String> {
    let ranged = layout.interval != Interval::None;
    let (lo, hi) = encode_fields(layout.key, family, key, ranged)?;
    let data = match (value, layout.data) {
        (None, Data::None) => None,
        (None, _) => return Err("a map element needs a value".into()),
        (Some(_), Data::None) => return Err("a set element has no value".into()),
        (Some(v), Data::Verdict) => {
            let (code, chain) = parse_verdict(v)?;
            Some(ElemData::Verdict(code, chain))
        }
        (Some(v), Data::Value(fields)) => {
            Some(ElemData::Value(encode_fields(fields, family, v, false)?.0))
        }
    };
    // The end element of a one-field range: last + 1; none when that wraps ("open" interval).
    let mut end = None;
    if layout.interval == Interval::Single {
        let mut e = hi;
        if e.increment() {
            end = Some(e);
        }
    }
    let open = layout.interval == Interval::Single && end.is_none();

    let elem = nest_start(out, NFTA_LIST_ELEM);
    put_data_value(out, NFTA_SET_ELEM_KEY, &lo);
    if layout.interval == Interval::Concat {
        put_data_value(out, NFTA_SET_ELEM_KEY_END, &hi);
    }
    match data {
        None => {}
        Some(ElemData::Value(bytes)) => put_data_value(out, NFTA_SET_ELEM_DATA, &bytes),
        Some(ElemData::Verdict(code, chain)) => {
            let d = nest_start(out, NFTA_SET_ELEM_DATA);
            let v = nest_start(out, NFTA_DATA_VERDICT);
            put_attr(out, NFTA_VERDICT_CODE, &code.to_be_bytes());
            if let Some(chain) = chain {
                put_str(out, NFTA_VERDICT_CHAIN, chain);
            }
            nest_end(out, v);
            nest_end(out, d);
        }
    }
    let mut udata = Vec::new();
    if let Some(c) = comment {
        // As the text path does: nft's syntax has no escape for `"`.
        let c = c.replace('"', "'");
        let mut cut = c.len().min(COMMENT_MAX);
        while !c.is_char_boundary(cut) {
            cut -= 1;
        }
        udata.push(UDATA_ELEM_COMMENT);
        udata.push((cut + 1) as u8);
        udata.extend_from_slice(&c.as_bytes()[..cut]);
        udata.push(0);
    }
    if open {
        udata.push(UDATA_ELEM_FLAGS);
        udata.push(4);
        udata.extend_from_slice(&UDATA_ELEM_F_INTERVAL_OPEN.to_ne_bytes());
    }
    if !udata.is_empty() {
        put_attr(out, NFTA_SET_ELEM_USERDATA, &udata);
    }
    nest_end(out, elem);

    if let Some(end) = end {
        let elem = nest_start(out, NFTA_LIST_ELEM);
        put_attr(
            out,
            NFTA_SET_ELEM_FLAGS,
            &NFT_SET_ELEM_INTERVAL_END.to_be_bytes(),
        );
        put_data_value(out, NFTA_SET_ELEM_KEY, &end);
        nest_end(out, elem);
    }
    Ok(())
}

fn nfproto(family: Family) -> u8 {
    match family {
        Family::V4 => libc::NFPROTO_IPV4 as u8,
        Family::V6 => libc::NFPROTO_IPV6 as u8,
    }
}

impl Batch {
    /// The sequence number after this batch's `BATCH_END`.
    fn next_seq(&self) -> u32 {
        self.first_seq
            .wrapping_add(2)
            .wrapping_add(self.msgs.len() as u32)
    }
}

fn layout_or_err(set: &str, example: &str) -> Result<Layout, NetlinkError> {
    layout(set).ok_or_else(|| NetlinkError::Encode {
        set: set.to_string(),
        element: example.to_string(),
        reason: "no known layout for this set (see netlink::layout)".into(),
    })
}

fn describe(key: &str, value: Option<&str>) -> String {
    match value {
        Some(v) => format!("{key} : {v}"),
        None => key.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// Why [`NetlinkWriter`] failed. Whatever the variant, a transaction is all or nothing: after an
/// error the kernel holds none of it.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// A socket call failed (opening, sizing buffers, sending, receiving).
    #[error("netlink {context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The system error.
        #[source]
        source: io::Error,
    },
    /// An element's text does not fit its set's layout; nothing was sent.
    #[error("set {set}: cannot encode `{element}`: {reason}")]
    Encode {
        /// The set or map (or the table, for a bad table name).
        set: String,
        /// The element as given (`key : value`).
        element: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The kernel rejected the transaction, which it then aborted as a whole.
    #[error("{}", rejected_text(*.operation, .set, .element, *.errno, .message, *.more))]
    Rejected {
        /// What the first failing message did.
        operation: Operation,
        /// Its set (`None` for an error of the batch as a whole).
        set: Option<String>,
        /// The element the kernel pointed at (`key : value`), when it did.
        element: Option<String>,
        /// The kernel's error number (`ENOENT`, `EEXIST`, …).
        errno: i32,
        /// The kernel's extended-ACK message, when it gave one.
        message: Option<String>,
        /// How many further messages of the batch failed too.
        more: usize,
    },
    /// The kernel answered something we did not ask for, or not at all.
    #[error("netlink protocol: {0}")]
    Protocol(String),
}

fn rejected_text(
    operation: Operation,
    set: &Option<String>,
    element: &Option<String>,
    errno: i32,
    message: &Option<String>,
    more: usize,
) -> String {
    let mut s = format!("kernel rejected the transaction: {operation}");
    if let Some(set) = set {
        s.push_str(&format!(" {set}"));
    }
    if let Some(e) = element {
        s.push_str(&format!(", element `{e}`"));
    }
    s.push_str(&format!(": {}", io::Error::from_raw_os_error(errno)));
    if let Some(m) = message {
        s.push_str(&format!(" ({m})"));
    }
    if more > 0 {
        s.push_str(&format!("; {more} more message(s) of the batch failed too"));
    }
    s
}

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> NetlinkError {
    let context = context.into();
    move |source| NetlinkError::Io { context, source }
}

// ---------------------------------------------------------------------------------------------
// The socket
// ---------------------------------------------------------------------------------------------

/// The raw `AF_NETLINK` socket: the only unsafe code of this module.
mod sys {
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    /// How many buffers one datagram may be gathered from (`UIO_MAXIOV` is 1024).
    pub(super) const MAX_PARTS: usize = 1000;

    /// A `NETLINK_NETFILTER` socket, closed on drop.
    #[derive(Debug)]
    pub(super) struct Socket {
        fd: OwnedFd,
    }

    fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
        if ret < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(ret)
        }
    }

    impl Socket {
        /// Opens the socket in the calling thread's network namespace. It is bound implicitly
        /// (the kernel picks our port id) on the first send.
        pub(super) fn open() -> io::Result<Socket> {
            // SAFETY: socket(2) takes no pointers; it returns a new descriptor or -1.
            let fd = check(unsafe {
                libc::socket(
                    libc::AF_NETLINK,
                    libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                    libc::NETLINK_NETFILTER,
                )
            })?;
            // SAFETY: `fd` was just returned by socket(2), is open, and nothing else owns it.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            Ok(Socket { fd })
        }

        /// setsockopt(2) with a plain-data option value.
        pub(super) fn set_opt<T: Copy>(
            &self,
            level: libc::c_int,
            name: libc::c_int,
            value: T,
        ) -> io::Result<()> {
            // SAFETY: the pointer is to `value`, a live, initialised `T` on our stack, and the
            // length passed is exactly its size; the kernel only reads it during the call.
            check(unsafe {
                libc::setsockopt(
                    self.fd.as_raw_fd(),
                    level,
                    name,
                    (&raw const value).cast(),
                    size_of::<T>() as libc::socklen_t,
                )
            })
            .map(drop)
        }

        /// getsockopt(2) of an `int` option.
        pub(super) fn get_int(&self, level: libc::c_int, name: libc::c_int) -> io::Result<i32> {
            let mut value: libc::c_int = 0;
            let mut len = size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: both pointers are to live locals of the sizes the kernel is told.
            check(unsafe {
                libc::getsockopt(
                    self.fd.as_raw_fd(),
                    level,
                    name,
                    (&raw mut value).cast(),
                    &raw mut len,
                )
            })?;
            Ok(value)
        }

        /// Sends one datagram, gathered from `parts`, to the kernel (port id 0: an unconnected
        /// netlink socket's default destination). Netlink datagrams go out whole or not at
        /// all. At most [`MAX_PARTS`] parts.
        pub(super) fn send(&self, parts: &[Vec<u8>]) -> io::Result<usize> {
            let mut iov: Vec<libc::iovec> = parts
                .iter()
                .map(|p| libc::iovec {
                    iov_base: p.as_ptr() as *mut libc::c_void,
                    iov_len: p.len(),
                })
                .collect();
            // SAFETY: an all-zero msghdr is a valid empty one (null name, no control data).
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = iov.as_mut_ptr();
            msg.msg_iovlen = iov.len() as _;
            loop {
                // SAFETY: `msg` points at `iov`, which points at the live buffers of `parts`,
                // each with its true length; the kernel only reads them. Both outlive the call.
                let n = unsafe { libc::sendmsg(self.fd.as_raw_fd(), &msg, 0) };
                if n >= 0 {
                    return Ok(n as usize);
                }
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }

        /// Receives one datagram into `buf` (blocking unless `dont_wait`); returns its length.
        pub(super) fn recv(&self, buf: &mut [u8], dont_wait: bool) -> io::Result<usize> {
            let flags = if dont_wait { libc::MSG_DONTWAIT } else { 0 };
            loop {
                // SAFETY: `buf` is a live, writable slice; the kernel writes at most
                // `buf.len()` bytes into it.
                let n = unsafe {
                    libc::recv(
                        self.fd.as_raw_fd(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        flags,
                    )
                };
                if n >= 0 {
                    return Ok(n as usize);
                }
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The writer
// ---------------------------------------------------------------------------------------------

/// A kernel error for one message of a batch.
#[derive(Debug)]
struct AckError {
    /// 0 = the batch itself (`BATCH_BEGIN`), `i + 1` = message `i`.
    index: usize,
    errno: i32,
    /// `NLMSGERR_ATTR_OFFS`: offset of the rejected attribute from the message start.
    offset: Option<u32>,
    message: Option<String>,
}

/// Writes set and map elements of our tables over one long-lived `NETLINK_NETFILTER` socket.
///
/// Why long-lived: closing a netlink socket after a transaction that deleted elements makes the
/// kernel wait for an RCU grace period (10–20 ms), and opening one per sync is wasted work. The
/// socket belongs to the network namespace of the thread that called [`NetlinkWriter::open`].
#[derive(Debug)]
pub struct NetlinkWriter {
    sock: sys::Socket,
    /// The next sequence number.
    seq: u32,
    /// Send buffer size we asked for (grown on demand, never shrunk).
    sndbuf: usize,
    /// Receive buffer size we asked for (room for one ACK per message).
    rcvbuf: usize,
    /// Reused receive buffer.
    recv_buf: Vec<u8>,
    /// An earlier transaction stopped reading its replies early (timeout, bad reply): some may
    /// still be queued.
    maybe_stale: bool,
}

impl NetlinkWriter {
    /// Opens the socket and enables extended and capped ACKs (so errors point at the element
    /// without echoing whole requests back). Needs `CAP_NET_ADMIN` only to apply, not to open.
    pub fn open() -> Result<Self, NetlinkError> {
        let sock = sys::Socket::open().map_err(io_err("opening a NETLINK_NETFILTER socket"))?;
        // Both are best effort: kernels before 4.3 / 4.12 lack them, and errors then still name
        // the set, just not the element.
        let _ = sock.set_opt(libc::SOL_NETLINK, libc::NETLINK_CAP_ACK, 1 as libc::c_int);
        let _ = sock.set_opt(libc::SOL_NETLINK, libc::NETLINK_EXT_ACK, 1 as libc::c_int);
        let timeout = libc::timeval {
            tv_sec: RECV_TIMEOUT_SECS as libc::time_t,
            tv_usec: 0,
        };
        sock.set_opt(libc::SOL_SOCKET, libc::SO_RCVTIMEO, timeout)
            .map_err(io_err("setting SO_RCVTIMEO"))?;
        let seq = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as u32)
            .unwrap_or(1);
        Ok(NetlinkWriter {
            sock,
            seq,
            sndbuf: 0,
            rcvbuf: 0,
            recv_buf: vec![0; RECV_BUF],
            maybe_stale: false,
        })
    }

    /// Applies one atomic transaction to table `table` of `family`: first flushes every set in
    /// `flush` (a `NFT_MSG_DELSETELEM` without elements), then deletes `deletes` (set, key
    /// text), then adds `adds`. Deleting and re-adding a key in one call replaces its value
    /// atomically. Adding an element that exists with the same value is not an error (nft's
    /// `add element`); with another value it is (`EEXIST`); deleting a missing one is
    /// (`ENOENT`). On any error the kernel applied nothing, and the error names the first
    /// failing set and, when the kernel points at one, the element.
    ///
    /// The whole transaction is one datagram, so its size is bounded by the socket send buffer:
    /// it is grown as needed with `SO_SNDBUFFORCE` (root / `CAP_NET_ADMIN`), else with
    /// `SO_SNDBUF`, which `net.core.wmem_max` caps.
    pub fn apply(
        &mut self,
        family: Family,
        table: &str,
        flush: &[&str],
        deletes: &[(&str, &str)],
        adds: &[Element],
    ) -> Result<(), NetlinkError> {
        let batch = ElementBatch::of(family, table, flush, deletes, adds)?;
        self.commit(batch, &|op, i| match op {
            Operation::Delete => deletes.get(i).map(|(_, key)| key.to_string()),
            _ => adds.get(i).map(|e| describe(&e.key, e.value.as_deref())),
        })
    }

    /// Sends `batch` as one transaction and waits for the kernel's answer.
    /// `describe(operation, index)` names the element the kernel rejected (the index counts
    /// the batch's deletes or adds in the order they were given), for the error message.
    pub fn commit(
        &mut self,
        batch: ElementBatch,
        describe: &dyn Fn(Operation, usize) -> Option<String>,
    ) -> Result<(), NetlinkError> {
        if batch.is_empty() {
            return Ok(());
        }
        let (flushes, deletes, adds) = (batch.flushes.len(), batch.deletes, batch.adds);
        let table = batch.table.clone();
        let table = table.as_str();
        let mut batch = batch.frame(self.seq);
        self.seq = batch.next_seq();
        if batch.parts.len() > sys::MAX_PARTS {
            batch.parts = vec![batch.parts.concat()];
        }
        let bytes = batch.len();
        tracing::debug!(
            bytes,
            messages = batch.msgs.len(),
            flushes,
            deletes,
            adds,
            "netlink element batch"
        );
        self.size_buffers(bytes, batch.msgs.len())?;
        if self.maybe_stale {
            self.drain_stale();
        }
        self.maybe_stale = true;

        let sent = self.sock.send(&batch.parts).map_err(|e| {
            let hint = if e.raw_os_error() == Some(libc::EMSGSIZE) {
                " (larger than the socket send buffer: SO_SNDBUFFORCE needs CAP_NET_ADMIN)"
            } else {
                ""
            };
            io_err(format!(
                "sending a batch of {bytes} bytes in {} messages{hint}",
                batch.msgs.len()
            ))(e)
        })?;
        if sent != bytes {
            return Err(NetlinkError::Protocol(format!(
                "sent {sent} of {bytes} bytes"
            )));
        }
        let errors = self.read_acks(&batch)?;
        self.maybe_stale = false;
        match errors.first() {
            None => Ok(()),
            Some(first) => Err(rejected(&batch, table, first, errors.len() - 1, describe)),
        }
    }

    /// Makes room for the batch in the send buffer and for one ACK per message in the receive
    /// buffer. The kernel doubles what it is given; a datagram must fit in `sndbuf - 32`.
    /// Sets a socket buffer with the `*FORCE` option (root / `CAP_NET_ADMIN`), else with the plain
    /// one, which `net.core.{w,r}mem_max` caps.
    fn grow_buffer(
        &self,
        force: libc::c_int,
        plain: libc::c_int,
        bytes: usize,
        what: &'static str,
    ) -> Result<(), NetlinkError> {
        let v = bytes.min(i32::MAX as usize / 2) as libc::c_int;
        if self.sock.set_opt(libc::SOL_SOCKET, force, v).is_err() {
            self.sock
                .set_opt(libc::SOL_SOCKET, plain, v)
                .map_err(io_err(what))?;
        }
        Ok(())
    }

    fn size_buffers(&mut self, bytes: usize, messages: usize) -> Result<(), NetlinkError> {
        let want_snd = bytes + 64 * 1024;
        if want_snd > self.sndbuf {
            let current = self
                .sock
                .get_int(libc::SOL_SOCKET, libc::SO_SNDBUF)
                .map_or(0, |v| v.max(0) as usize);
            if current < want_snd + 32 {
                self.grow_buffer(
                    libc::SO_SNDBUFFORCE,
                    libc::SO_SNDBUF,
                    want_snd,
                    "setting SO_SNDBUF",
                )?;
            }
            self.sndbuf = want_snd;
        }
        // An ACK skb costs well under 2 KiB of receive buffer (truesize) with capped ACKs.
        let want_rcv = (messages + 16) * 2048 + 256 * 1024;
        if want_rcv > self.rcvbuf {
            self.grow_buffer(
                libc::SO_RCVBUFFORCE,
                libc::SO_RCVBUF,
                want_rcv,
                "setting SO_RCVBUF",
            )?;
            self.rcvbuf = want_rcv;
        }
        Ok(())
    }

    /// Discards replies left over from an earlier transaction that ended in an error.
    fn drain_stale(&mut self) {
        while let Ok(n) = self.sock.recv(&mut self.recv_buf, true) {
            if n == 0 {
                break;
            }
        }
    }

    /// Reads one ACK per message of `batch`; returns the errors, in batch order.
    fn read_acks(&mut self, batch: &Batch) -> Result<Vec<AckError>, NetlinkError> {
        let total = batch.msgs.len();
        let mut acked = vec![false; total];
        let mut pending = total;
        let mut errors: Vec<AckError> = Vec::new();
        // An error against the batch itself (commit failure, EPERM, ENOMEM…) may come with or
        // without the per-message ACKs: after it, only read what is already queued. Once every
        // message is acknowledged, what is queued is read too, so that a batch error queued
        // after the ACKs is not missed (the kernel queues every reply before `send` returns).
        let mut batch_failed = false;
        loop {
            let dont_wait = batch_failed || pending == 0;
            let n = match self.sock.recv(&mut self.recv_buf, dont_wait) {
                Ok(n) => n,
                Err(e) if dont_wait && e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(NetlinkError::Protocol(format!(
                        "no answer for {pending} of {total} messages within {RECV_TIMEOUT_SECS}s"
                    )));
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    return Err(io_err(
                        "receiving ACKs (receive buffer overflowed: the transaction's outcome is unknown)",
                    )(e));
                }
                Err(e) => return Err(io_err("receiving ACKs")(e)),
            };
            let mut data = &self.recv_buf[..n];
            while data.len() >= NLMSG_HDRLEN {
                let len = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]) as usize;
                if len < NLMSG_HDRLEN || len > data.len() {
                    return Err(NetlinkError::Protocol(format!(
                        "reply of length {len} in a datagram of {}",
                        data.len()
                    )));
                }
                let msg = &data[..len];
                data = &data[len.next_multiple_of(4).min(data.len())..];
                let ty = u16::from_ne_bytes([msg[4], msg[5]]);
                let flags = u16::from_ne_bytes([msg[6], msg[7]]);
                let seq = u32::from_ne_bytes([msg[8], msg[9], msg[10], msg[11]]);
                if ty != NLMSG_ERROR {
                    continue; // nothing else is expected; ignore
                }
                let index = seq.wrapping_sub(batch.first_seq) as usize;
                if index > total {
                    continue; // a stale reply of an earlier transaction
                }
                let Some(ack) = parse_ack(&msg[NLMSG_HDRLEN..], flags) else {
                    return Err(NetlinkError::Protocol("truncated NLMSG_ERROR".into()));
                };
                if index == 0 {
                    batch_failed = true;
                } else if !acked[index - 1] {
                    acked[index - 1] = true;
                    pending -= 1;
                }
                if ack.0 != 0 {
                    errors.push(AckError {
                        index,
                        errno: -ack.0,
                        offset: ack.1,
                        message: ack.2,
                    });
                }
            }
        }
        // Message errors first, in batch order; a batch-level error (index 0) only matters when
        // no message failed.
        errors.sort_by_key(|e| if e.index == 0 { usize::MAX } else { e.index });
        Ok(errors)
    }
}

/// The error for the first failing message of `batch`, with its set and element.
fn rejected(
    batch: &Batch,
    table: &str,
    first: &AckError,
    more: usize,
    describe: &dyn Fn(Operation, usize) -> Option<String>,
) -> NetlinkError {
    let (operation, set, element) = match first.index.checked_sub(1) {
        None => (Operation::Batch, None, None),
        Some(i) => {
            let info = &batch.msgs[i];
            let element = first.offset.and_then(|off| {
                // The element whose attribute starts at or before the offset; an offset
                // before the first element points at the table or set attribute.
                let pos = info.elems.partition_point(|(o, _)| *o <= off);
                let (_, index) = *info.elems.get(pos.checked_sub(1)?)?;
                describe(info.op, index as usize)
            });
            (info.op, Some(info.set.clone()), element)
        }
    };
    // The table attribute comes first after the headers: a missing table.
    let table_offset = (NLMSG_HDRLEN + 4) as u32;
    let message = first.message.clone().or_else(|| {
        (first.index > 0 && first.offset == Some(table_offset))
            .then(|| format!("the kernel points at table `{table}`"))
    });
    NetlinkError::Rejected {
        operation,
        set,
        element,
        errno: first.errno,
        message,
        more,
    }
}

/// Parses the payload of an `NLMSG_ERROR`: (error, `NLMSGERR_ATTR_OFFS`, `NLMSGERR_ATTR_MSG`).
fn parse_ack(payload: &[u8], flags: u16) -> Option<(i32, Option<u32>, Option<String>)> {
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
    Some((error, offset, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(set: &str, family: Family, text: &str) -> (Bytes, Bytes) {
        let l = layout(set).expect("known set");
        encode_fields(l.key, family, text, l.interval != Interval::None).expect("encodes")
    }

    /// Formats like `nft --debug=netlink`: 32-bit words in host order, space-separated.
    fn words(b: &Bytes) -> String {
        b.as_slice()
            .chunks(4)
            .map(|c| {
                let mut w = [0u8; 4];
                w[..c.len()].copy_from_slice(c);
                format!("{:08x}", u32::from_ne_bytes(w))
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    // The expected words below are what `nft --debug=netlink` (nft 1.0.6, x86_64) printed for
    // the same elements, so these tests pin our bytes to nft's.
    #[cfg(target_endian = "little")]
    #[test]
    fn keys_and_values_match_nft_bytes() {
        let (k, _) = key("cluster-endpoints-tcp", Family::V4, "10.96.0.11 . 80 . 3");
        assert_eq!(words(&k), "0b00600a 00005000 00000003");
        let (k, _) = key("nodeport-cluster-endpoints-udp", Family::V4, "30080 . 1");
        assert_eq!(words(&k), "00008075 00000001");
        let l = layout("cluster-endpoints-tcp").expect("known");
        let Data::Value(v) = l.data else {
            panic!("data map")
        };
        let (val, _) =
            encode_fields(v, Family::V4, "10.244.1.2 . 8080", false).expect("value encodes");
        assert_eq!(words(&val), "0201f40a 0000901f");

        let (k, _) = key(
            "affinity-valid",
            Family::V4,
            "0x6b70000e . 10.244.1.9 . 8080",
        );
        assert_eq!(words(&k), "6b70000e 0901f40a 0000901f");
        let (k, _) = key("affinity-ids-cluster", Family::V4, "10.96.1.31 . sctp . 80");
        assert_eq!(words(&k), "1f01600a 00000084 00005000");
        let (k, _) = key("service-nodeports", Family::V4, "udp . 30081");
        assert_eq!(words(&k), "00000011 00008175");
        let (k, _) = key("cluster-ips", Family::V4, "10.96.9.9");
        assert_eq!(words(&k), "0909600a");
        let (k, _) = key("affinity-timeouts", Family::V4, "0x6b700010");
        assert_eq!(words(&k), "6b700010");

        let (lo, hi) = key(
            "firewall-allow",
            Family::V4,
            "198.51.100.21 . tcp . 443 . 192.168.100.0/24",
        );
        assert_eq!(words(&lo), "156433c6 00000006 0000bb01 0064a8c0");
        assert_eq!(words(&hi), "156433c6 00000006 0000bb01 ff64a8c0");

        let (k, _) = key("local-endpoints-sctp", Family::V6, "fd00::1 . 9 . 2");
        assert_eq!(
            words(&k),
            "000000fd 00000000 00000000 01000000 00000900 00000002"
        );
        let (lo, hi) = key(
            "firewall-allow",
            Family::V6,
            "2001:db8::1 . tcp . 443 . 2001:db8:1::/48",
        );
        assert_eq!(
            words(&lo),
            "b80d0120 00000000 00000000 01000000 00000006 0000bb01 b80d0120 00000100 00000000 00000000"
        );
        assert_eq!(
            words(&hi),
            "b80d0120 00000000 00000000 01000000 00000006 0000bb01 b80d0120 ffff0100 ffffffff ffffffff"
        );
    }

    /// Parses the set and map declarations of the skeleton into layouts, the way nft reads
    /// them, so that the hand-written table cannot drift from `ruleset.rs` unnoticed.
    fn declared_layouts(skeleton: &str) -> Vec<(String, Layout)> {
        fn field(word: &str) -> Field {
            match word {
                "ipv4_addr" | "ipv6_addr" | "ip daddr" | "ip saddr" | "ip6 daddr" | "ip6 saddr" => {
                    Addr
                }
                "inet_proto" | "meta l4proto" => Proto,
                "inet_service" | "th dport" | "tcp dport" | "udp dport" | "sctp dport" => Port,
                "mark" | "ct mark" | "meta mark" => Mark,
                w if w.starts_with("numgen ") => Slot,
                other => panic!("unknown type or expression `{other}`"),
            }
        }
        fn fields(text: &str) -> &'static [Field] {
            let v: Vec<Field> = text.split(" . ").map(|w| field(w.trim())).collect();
            Box::leak(v.into_boxed_slice())
        }
        let mut out = Vec::new();
        for line in skeleton.lines() {
            let line = line.trim();
            let Some(rest) = line
                .strip_prefix("set ")
                .or_else(|| line.strip_prefix("map "))
            else {
                continue;
            };
            let (name, body) = rest.split_once(" { ").expect("a declaration");
            let mut l = Layout {
                key: &[],
                interval: Interval::None,
                data: Data::None,
            };
            for part in body.trim_end_matches('}').split(';').map(str::trim) {
                let decl = part
                    .strip_prefix("typeof ")
                    .or_else(|| part.strip_prefix("type "));
                if let Some(decl) = decl {
                    let (key, data) = match decl.split_once(" : ") {
                        Some((k, d)) => (k, Some(d)),
                        None => (decl, None),
                    };
                    l.key = fields(key);
                    l.data = match data {
                        None => Data::None,
                        Some("verdict") => Data::Verdict,
                        Some(d) => Data::Value(fields(d)),
                    };
                } else if part.starts_with("flags ") && part.contains("interval") {
                    l.interval = Interval::Single;
                }
            }
            if l.interval == Interval::Single && l.key.len() > 1 {
                l.interval = Interval::Concat;
            }
            out.push((name.to_string(), l));
        }
        out
    }

    #[test]
    fn layouts_mirror_the_skeleton() {
        use crate::ruleset::{Fam, StaticConfig, skeleton};
        let cfg = StaticConfig {
            masquerade_all: false,
            mark: 0x4000,
            local_match: None,
            non_local_match: None,
        };
        for family in Family::ALL {
            let declared = declared_layouts(&skeleton(Fam(family), "kpng", &cfg));
            assert!(
                declared.len() > 20,
                "parsed {} declarations",
                declared.len()
            );
            for (name, parsed) in declared {
                assert_eq!(layout(&name), Some(parsed), "layout of {name} ({family:?})");
            }
        }
    }

    #[test]
    fn single_field_interval_is_start_and_end_or_open() {
        let l = layout("service-cidrs").expect("known");
        let mut out = Vec::new();
        encode_element(&mut out, &l, Family::V4, "10.100.0.0/16", None, None).expect("ok");
        // Two NFTA_LIST_ELEM: start 10.100.0.0, end 10.101.0.0 flagged INTERVAL_END.
        let elems = list_elems(&out);
        assert_eq!(elems.len(), 2);
        assert!(contains(elems[0], &[10, 100, 0, 0]));
        assert!(contains(elems[1], &[10, 101, 0, 0]));
        assert!(contains(elems[1], &NFT_SET_ELEM_INTERVAL_END.to_be_bytes()));

        out.clear();
        encode_element(&mut out, &l, Family::V4, "240.0.0.0/4", None, None).expect("ok");
        let elems = list_elems(&out);
        assert_eq!(elems.len(), 1, "no end element past the last address");
        // The "open interval" user data nft writes: type 1, length 4, flag 1 (host order).
        let mut udata = vec![UDATA_ELEM_FLAGS, 4];
        udata.extend_from_slice(&1u32.to_ne_bytes());
        assert!(contains(elems[0], &udata));

        out.clear();
        encode_element(&mut out, &l, Family::V4, "10.200.0.1", None, None).expect("ok");
        let elems = list_elems(&out);
        assert!(contains(elems[1], &[10, 200, 0, 2]));
    }

    fn list_elems(buf: &[u8]) -> Vec<&[u8]> {
        let mut out = Vec::new();
        let mut rest = buf;
        while rest.len() >= 4 {
            let len = u16::from_ne_bytes([rest[0], rest[1]]) as usize;
            out.push(&rest[..len]);
            rest = &rest[len.next_multiple_of(4)..];
        }
        out
    }

    fn contains(hay: &[u8], needle: &[u8]) -> bool {
        hay.windows(needle.len()).any(|w| w == needle)
    }

    #[test]
    fn verdicts_and_comments() {
        let l = layout("service-ips").expect("known");
        let mut out = Vec::new();
        encode_element(
            &mut out,
            &l,
            Family::V4,
            "10.96.0.10 . tcp . 80",
            Some("goto cluster-n3"),
            Some("default/web:http"),
        )
        .expect("ok");
        assert!(contains(&out, &NFT_GOTO.to_be_bytes()));
        assert!(contains(&out, b"cluster-n3\0"));
        assert!(contains(&out, b"\x00\x11default/web:http\0"));

        out.clear();
        encode_element(
            &mut out,
            &l,
            Family::V4,
            "10.96.0.10 . tcp . 80",
            Some("drop"),
            None,
        )
        .expect("ok");
        assert!(contains(&out, &NF_DROP.to_be_bytes()));

        let long = "x".repeat(300);
        out.clear();
        encode_element(
            &mut out,
            &l,
            Family::V4,
            "10.96.0.10 . tcp . 80",
            Some("drop"),
            Some(&long),
        )
        .expect("long comments are cut to nft's maximum");
        assert!(contains(
            &out,
            &[UDATA_ELEM_COMMENT, (COMMENT_MAX + 1) as u8]
        ));
    }

    /// The whole encoding path of [`NetlinkWriter::apply`], without a socket.
    fn build_batch(
        first_seq: u32,
        family: Family,
        table: &str,
        flush: &[&str],
        deletes: &[(&str, &str)],
        adds: &[Element],
    ) -> Result<Batch, NetlinkError> {
        Ok(ElementBatch::of(family, table, flush, deletes, adds)?.frame(first_seq))
    }

    #[test]
    fn bad_text_is_an_error_naming_the_element() {
        let bad = |set: &'static str, key: &str, value: Option<&str>| {
            let e = Element {
                set,
                key: key.into(),
                value: value.map(str::to_string),
                comment: None,
            };
            build_batch(1, Family::V4, "kpng", &[], &[], &[e]).expect_err("must fail")
        };
        let e = bad("cluster-ips", "10.96.0.300", None);
        assert!(e.to_string().contains("cluster-ips"), "{e}");
        assert!(e.to_string().contains("10.96.0.300"), "{e}");
        bad("cluster-ips", "fd00::1", None);
        bad("cluster-ips", "10.0.0.0/8", None);
        bad("service-ips", "10.96.0.10 . tcp", Some("drop"));
        bad("service-ips", "10.96.0.10 . tcp . 80 . 1", Some("drop"));
        bad("service-ips", "10.96.0.10 . tcp . 80", Some("goto"));
        bad("service-ips", "10.96.0.10 . tcp . 80", None);
        bad("service-ips", "10.96.0.10 . bogus . 80", Some("drop"));
        bad(
            "cluster-endpoints-tcp",
            "10.96.0.10 . 80 . 0",
            Some("10.0.0.1"),
        );
        bad(
            "cluster-endpoints-tcp",
            "10.96.0.10 . tcp . 80 . 0",
            Some("10.0.0.1 . 1"),
        );
        bad("cluster-ips", "10.96.0.1", Some("drop"));
        bad("no-such-set", "10.96.0.1", None);
        let deletes = [("service-cidrs", "10.0.0.0/33")];
        assert!(build_batch(1, Family::V4, "kpng", &[], &deletes, &[]).is_err());
    }

    #[test]
    fn large_batches_are_split_into_messages_under_the_attribute_limit() {
        let adds: Vec<Element> = (0..20_000u32)
            .map(|i| Element {
                set: "cluster-endpoints-tcp",
                key: format!("{} . 80 . 0", Ipv4Addr::from(0x0a60_0000 + i)),
                value: Some("10.244.1.2 . 8080".into()),
                comment: None,
            })
            .collect();
        let deletes = [("service-ips", "10.96.0.1 . tcp . 80")];
        let b = build_batch(100, Family::V4, "kpng", &["cluster-ips"], &deletes, &adds)
            .expect("builds");
        assert!(b.msgs.len() > 3, "{} messages", b.msgs.len());
        assert_eq!(b.msgs[0].op, Operation::Flush);
        assert_eq!(b.msgs[1].op, Operation::Delete);
        // Walk the datagram: BEGIN, the messages with consecutive sequence numbers, END.
        let whole = b.parts.concat();
        let mut rest = &whole[..];
        let mut seqs = Vec::new();
        let mut elements = 0;
        while !rest.is_empty() {
            let len = u32::from_ne_bytes(rest[..4].try_into().expect("4")) as usize;
            seqs.push(u32::from_ne_bytes(rest[8..12].try_into().expect("4")));
            assert!(len <= 64 * 1024 + 512, "message of {len} bytes");
            rest = &rest[len..];
        }
        for m in &b.msgs {
            elements += m.elems.len();
        }
        assert_eq!(elements, 20_001);
        assert_eq!(seqs.len(), b.msgs.len() + 2);
        assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1));
        assert_eq!(seqs[0], 100);
        assert_eq!(b.next_seq(), 100 + b.msgs.len() as u32 + 2);
        // Each message's element index is in order and starts after the set attributes.
        for m in &b.msgs[1..] {
            assert!(m.elems.windows(2).all(|w| w[0].0 < w[1].0));
        }
    }

    #[test]
    fn acks_are_parsed_with_and_without_tlvs() {
        // error -2, capped, with OFFS 40 and a message.
        let mut p = Vec::new();
        p.extend_from_slice(&(-2i32).to_ne_bytes());
        p.extend_from_slice(&[0; NLMSG_HDRLEN]);
        put_attr(&mut p, NLMSGERR_ATTR_MSG, b"nope\0");
        put_attr(&mut p, NLMSGERR_ATTR_OFFS, &40u32.to_ne_bytes());
        let (e, off, msg) = parse_ack(&p, NLM_F_CAPPED | NLM_F_ACK_TLVS).expect("parses");
        assert_eq!((e, off, msg.as_deref()), (-2, Some(40), Some("nope")));
        let (e, off, msg) = parse_ack(&p[..4 + NLMSG_HDRLEN], NLM_F_CAPPED).expect("parses");
        assert_eq!((e, off, msg), (-2, None, None));
    }
}
