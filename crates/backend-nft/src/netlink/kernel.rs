//! The kernel's side of [`ElementWriter`]: [`NetlinkWriter`] sends a framed batch over one
//! long-lived `NETLINK_NETFILTER` socket and reads one ACK per message.
//!
//! Every message asks for an ACK and has its own sequence number; with `NETLINK_EXT_ACK` the
//! kernel also says which attribute (that is, which element) it rejected, so an error names
//! the set and the element. The whole batch goes out in ONE `send`: the kernel processes a
//! batch per datagram, so a batch cannot span several sends. The socket send buffer is grown
//! to fit (`SO_SNDBUFFORCE`).

use std::io;

use super::ElementWriter;
use super::batch::{ElementBatch, Framed, Operation};
use super::error::{NetlinkError, io_err};
use kpng_netfilter::attr::*;
use kpng_netfilter::socket::{MAX_PARTS, Socket};

/// Receive buffer for ACKs; with `NETLINK_CAP_ACK` each is well under 1 KiB.
const RECV_BUF: usize = 256 * 1024;
/// A reply the kernel owes us arrives while `send` runs (nfnetlink processes a batch in the
/// sender's context); this only guards against waiting forever on a bug.
const RECV_TIMEOUT_SECS: u32 = 30;

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
    sock: Socket,
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
        let sock = Socket::open().map_err(io_err("opening a NETLINK_NETFILTER socket"))?;
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
    fn read_acks(&mut self, batch: &Framed) -> Result<Vec<AckError>, NetlinkError> {
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
                if ack.error != 0 {
                    errors.push(AckError {
                        index,
                        errno: -ack.error,
                        offset: ack.offset,
                        message: ack.message,
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

impl ElementWriter for NetlinkWriter {
    /// Sends `batch` as one datagram and waits for the kernel's answer (one ACK per message).
    ///
    /// The whole transaction is one datagram, so its size is bounded by the socket send
    /// buffer: it is grown as needed with `SO_SNDBUFFORCE` (root / `CAP_NET_ADMIN`), else with
    /// `SO_SNDBUF`, which `net.core.wmem_max` caps.
    fn commit(
        &mut self,
        batch: ElementBatch,
        describe: &dyn Fn(Operation, usize) -> Option<String>,
    ) -> Result<(), NetlinkError> {
        if batch.is_empty() {
            return Ok(());
        }
        let (flushes, deletes, adds) = (batch.flushes(), batch.deletes(), batch.adds());
        let table = batch.table().to_string();
        let table = table.as_str();
        let mut batch = batch.frame(self.seq);
        self.seq = batch.next_seq();
        if batch.parts.len() > MAX_PARTS {
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

    /// One chain request: cheap enough for every periodic sync and every repair.
    fn check_marker(
        &mut self,
        family: kpng_model::Family,
        table: &str,
    ) -> Option<super::ProbedTable> {
        super::check_with_netlink(family, table)
    }

    /// One chain dump, at the full syncs that adopt the table only.
    fn chain_names(&mut self, family: kpng_model::Family, table: &str) -> Option<Vec<String>> {
        super::chain_names_with_netlink(family, table)
    }

    /// One element dump of the set, at start-up only.
    fn set_keys(
        &mut self,
        family: kpng_model::Family,
        table: &str,
        set: crate::sets::Set,
        each: &mut dyn FnMut(&[u8]),
    ) -> bool {
        super::set_keys_with_netlink(family, table, set, each)
    }

    /// One element dump of the set, at the first full sync of a process only.
    fn set_elements(
        &mut self,
        family: kpng_model::Family,
        table: &str,
        set: crate::sets::Set,
        each: &mut dyn FnMut(&kpng_netfilter::elements::Element),
    ) -> bool {
        super::set_elements_with_netlink(family, table, set, each)
    }
}

/// The error for the first failing message of `batch`, with its set and element.
fn rejected(
    batch: &Framed,
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
            (info.op, Some(info.set.name().to_string()), element)
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
