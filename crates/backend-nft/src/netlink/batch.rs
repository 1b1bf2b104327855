//! One transaction: elements encoded as they come, packed into messages, framed into one
//! datagram (`NFNL_MSG_BATCH_BEGIN` … `END`).
//!
//! Elements are packed into as many messages as needed (an attribute length is 16 bits, so one
//! message carries at most ~64 KiB of elements); each message asks for an ACK and has its own
//! sequence number, and remembers where each of its elements starts, so that the attribute
//! offset of an extended ACK names the element the kernel rejected.

use std::fmt;

use kpng_model::Family;

use crate::sets::{Set, SetDecl};
use crate::store::Element;
use crate::value::{Key, Value};

use super::encode::{check_name, encode_element};
use super::error::{EncodeError, NetlinkError};
use kpng_netfilter::attr::*;

/// Largest `NFTA_SET_ELEM_LIST_ELEMENTS` nest we build: its length field is 16 bits.
const MAX_ELEMENTS_NEST: usize = 64 * 1024 - 1024;

/// Size of the buffers messages are framed into. A message is at most ~64 KiB, so a buffer
/// wastes at most that; pages not yet written cost no memory.
const SEGMENT: usize = 1 << 20;

/// Room a new message needs in its buffer: headers, table and set names, a full nest.
const MESSAGE_ROOM: usize = MAX_ELEMENTS_NEST + 1024;

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

/// One message of a framed batch: what it does and where each of its elements starts.
#[derive(Debug, Clone)]
pub struct MsgInfo {
    /// What the message does.
    pub op: Operation,
    /// Its set.
    pub set: Set,
    /// (offset of the element's `NFTA_LIST_ELEM` from the message start, index of the element
    /// in the caller's deletes or adds), in offset order.
    pub elems: Vec<(u32, u32)>,
}

/// A whole transaction, ready to send: its messages lie in several buffers (`parts`), sent
/// together as one datagram with `sendmsg`, so the elements are never copied into one buffer.
#[derive(Debug)]
pub struct Framed {
    /// The datagram, in pieces.
    pub parts: Vec<Vec<u8>>,
    /// Sequence number of `BATCH_BEGIN`; message `i` has `first_seq + 1 + i`.
    pub first_seq: u32,
    /// The messages between `BATCH_BEGIN` and `BATCH_END`.
    pub msgs: Vec<MsgInfo>,
}

impl Framed {
    /// Total size of the datagram.
    pub fn len(&self) -> usize {
        self.parts.iter().map(Vec::len).sum()
    }

    /// Whether the datagram is empty (never, once framed).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sequence number after this batch's `BATCH_END`.
    pub fn next_seq(&self) -> u32 {
        self.first_seq
            .wrapping_add(2)
            .wrapping_add(self.msgs.len() as u32)
    }
}

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
    set: Set,
    decl: SetDecl,
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
        let start = open_element_msg(buf, family, table, self.decl.name, self.op);
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

/// The `nfgenmsg` family of a table family.
fn nfproto(family: Family) -> u8 {
    match family {
        Family::V4 => libc::NFPROTO_IPV4 as u8,
        Family::V6 => libc::NFPROTO_IPV6 as u8,
    }
}

/// `key : value` or `key`, for error messages.
pub(super) fn describe(key: &Key, value: Option<&Value>) -> String {
    match value {
        Some(v) => format!("{key} : {v}"),
        None => key.to_string(),
    }
}

/// One transaction being assembled element by element: flushes, deletes and adds are encoded
/// and framed into messages as they come, grouped per set.
///
/// Why not a list of elements: a full sync at 30k Services has ~300k elements; framed, they
/// are ~14 MB, and the caller can generate them one Service at a time. Each element gets an
/// index per operation (0, 1, … in the order given) so an error the kernel reports can be
/// traced back to it ([`super::ElementWriter::commit`]).
#[derive(Debug)]
pub struct ElementBatch {
    family: Family,
    table: String,
    flushes: Vec<Set>,
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
            reason,
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
        flush: &[Set],
        deletes: &[(Set, Key)],
        adds: &[Element],
    ) -> Result<ElementBatch, NetlinkError> {
        let mut batch = ElementBatch::new(family, table)?;
        for set in flush {
            batch.flush(*set);
        }
        for (set, key) in deletes {
            batch.delete(*set, key)?;
        }
        for e in adds {
            batch.add(e)?;
        }
        Ok(batch)
    }

    /// The table's family.
    pub fn family(&self) -> Family {
        self.family
    }

    /// The table.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Whether the transaction would do nothing.
    pub fn is_empty(&self) -> bool {
        self.flushes.is_empty() && self.runs.is_empty()
    }

    /// Number of sets flushed.
    pub fn flushes(&self) -> usize {
        self.flushes.len()
    }

    /// Number of elements deleted so far.
    pub fn deletes(&self) -> usize {
        self.deletes as usize
    }

    /// Number of elements added so far.
    pub fn adds(&self) -> usize {
        self.adds as usize
    }

    /// Empties `set` first (flushes go before every delete and add).
    pub fn flush(&mut self, set: Set) {
        self.flushes.push(set);
    }

    /// Removes the element with `key` from `set` (deletes go before every add, so a delete and
    /// an add of the same key replace its value).
    pub fn delete(&mut self, set: Set, key: &Key) -> Result<(), NetlinkError> {
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
            e.value.as_ref(),
            e.comment.as_deref(),
            index,
        )?;
        self.adds += 1;
        Ok(())
    }

    fn encode(
        &mut self,
        op: Operation,
        set: Set,
        key: &Key,
        value: Option<&Value>,
        comment: Option<&str>,
        index: u32,
    ) -> Result<(), NetlinkError> {
        let family = self.family;
        let i = self.run(op, set);
        let Some(run) = self.runs.get_mut(i) else {
            return Ok(());
        };
        let scratch = &mut self.scratch;
        scratch.clear();
        let result = if set.in_family(family) {
            encode_element(scratch, &run.decl, family, key, value, comment)
        } else {
            Err(EncodeError::Family(format!(
                "set {} (of the other family)",
                run.decl.name
            )))
        };
        result.map_err(|reason| NetlinkError::Encode {
            set: set.name().to_string(),
            element: describe(key, value),
            reason,
        })?;
        run.push(nfproto(family), &self.table, scratch, index);
        Ok(())
    }

    /// The index of the run of `op` on `set`, created on first use.
    fn run(&mut self, op: Operation, set: Set) -> usize {
        match self.runs.iter().rposition(|r| r.op == op && r.set == set) {
            Some(i) => i,
            None => {
                self.runs.push(SetRun {
                    op,
                    set,
                    decl: set.decl(),
                    segments: Vec::new(),
                    msgs: Vec::new(),
                    open_nest: None,
                });
                self.runs.len() - 1
            }
        }
    }

    /// Puts the transaction in order: `BATCH_BEGIN`, flushes, deletes, adds, `BATCH_END`,
    /// numbering the messages from `first_seq`.
    pub fn frame(self, first_seq: u32) -> Framed {
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
            let msg = open_element_msg(&mut head, fam, &self.table, set.name(), Operation::Flush);
            msg_end(&mut head, msg);
            set_seq(&mut head, msg, seq);
            msgs.push(MsgInfo {
                op: Operation::Flush,
                set: *set,
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
                    set: run.set,
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
        Framed {
            parts,
            first_seq,
            msgs,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use kpng_model::Protocol;

    use super::*;
    use crate::ruleset::PickKind;

    #[test]
    fn large_batches_are_split_into_messages_under_the_attribute_limit() {
        let adds: Vec<Element> = (0..20_000u32)
            .map(|i| Element {
                set: Set::Endpoints(PickKind::Cluster, Protocol::Tcp),
                key: Key::VipSlot(IpAddr::V4(Ipv4Addr::from(0x0a60_0000 + i)), 80, 0),
                value: Some(Value::Endpoint("10.244.1.2".parse().expect("ip"), 8080)),
                comment: None,
            })
            .collect();
        let deletes = [(
            Set::ServiceIps,
            Key::Vip("10.96.0.1".parse().expect("ip"), Protocol::Tcp, 80),
        )];
        let b = ElementBatch::of(Family::V4, "kpng", &[Set::ClusterIps], &deletes, &adds)
            .expect("builds")
            .frame(100);
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
    fn encode_errors_name_the_set_and_the_element() {
        let e = Element {
            set: Set::ClusterIps,
            key: Key::Addr("fd00::1".parse().expect("ip")),
            value: None,
            comment: None,
        };
        let err = ElementBatch::of(Family::V4, "kpng", &[], &[], &[e]).expect_err("v6 in v4");
        let text = err.to_string();
        assert!(
            text.contains("cluster-ips") && text.contains("fd00::1"),
            "{text}"
        );

        let e = Element {
            set: Set::Affinity,
            key: Key::ClientMark("fd00::1".parse().expect("ip"), 1),
            value: None,
            comment: None,
        };
        let err = ElementBatch::of(Family::V6, "kpng", &[], &[], &[e]).expect_err("v4 only");
        assert!(err.to_string().contains("other family"), "{err}");
        assert!(ElementBatch::new(Family::V4, "").is_err());
    }
}
