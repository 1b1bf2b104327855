//! The kernel's conntrack table over one long-lived `NETLINK_NETFILTER` socket.

use std::io;
use std::time::Duration;

use kpng_model::Family;
use netlink_sys::protocols::NETLINK_NETFILTER;
use netlink_sys::{Socket, SocketAddr};

use crate::Error;
use crate::flow::Flow;
use crate::wire::{self, DumpFilter, Reply};

/// Requests sent in one `send()`. Only failures and the last request are answered, and
/// every answer is one socket buffer in the kernel's accounting (~1 KiB), so even a batch
/// that fails entirely fits the default receive buffer.
const BATCH: usize = 128;

/// Largest datagram the kernel sends (dump pages are at most 32 KiB).
const RECV_BUFFER: usize = 128 * 1024;

/// What a batch of deletes did.
#[derive(Debug, Default)]
pub struct DeleteOutcome {
    /// Entries deleted.
    pub deleted: usize,
    /// Entries already gone (expired, or replaced by a newer entry with the same tuple).
    pub gone: usize,
    /// Entries the kernel refused to delete.
    pub failed: usize,
    /// The first refusal, for the log.
    pub first_error: Option<io::Error>,
}

/// A `NETLINK_NETFILTER` socket speaking ctnetlink: dumps, deletes, creates.
///
/// One socket serves every pass (no process per entry, no socket per pass). Deletes and
/// creates go out in batches of many requests per `send()`; only failures and the last
/// request of a batch are acknowledged, so a batch costs one round trip.
pub struct ConntrackSocket {
    socket: Socket,
    seq: u32,
    buffer: Vec<u8>,
    requests: Vec<u8>,
}

impl std::fmt::Debug for ConntrackSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConntrackSocket")
            .field("seq", &self.seq)
            .finish()
    }
}

impl ConntrackSocket {
    /// Opens and connects the socket. Using it needs `CAP_NET_ADMIN` in the network namespace.
    pub fn open() -> Result<ConntrackSocket, Error> {
        let io = |op| move |source| Error::Io { op, source };
        let mut socket =
            Socket::new(NETLINK_NETFILTER).map_err(io("opening a netfilter socket"))?;
        socket
            .bind_auto()
            .map_err(io("binding the netfilter socket"))?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(io("connecting the netfilter socket"))?;
        // Error answers without a copy of the request: smaller, and all we need is the seq.
        // Kernels without the option still work (answers are just larger).
        let _ = socket.set_cap_ack(true);
        Ok(ConntrackSocket {
            socket,
            seq: 1,
            buffer: vec![0; RECV_BUFFER],
            requests: Vec::new(),
        })
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn send_requests(&mut self, op: &'static str) -> Result<(), Error> {
        let sent = self
            .socket
            .send(&self.requests, 0)
            .map_err(|source| Error::Io { op, source })?;
        if sent != self.requests.len() {
            return Err(Error::Io {
                op,
                source: io::Error::other(format!("sent {sent} of {} bytes", self.requests.len())),
            });
        }
        Ok(())
    }

    fn recv(&mut self, op: &'static str) -> Result<usize, Error> {
        loop {
            match self.socket.recv(&mut &mut self.buffer[..], 0) {
                Ok(n) => return Ok(n.min(self.buffer.len())),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => return Err(Error::Io { op, source }),
            }
        }
    }

    /// Calls `each` for every entry of `family` that passes `filter` (filtered in the
    /// kernel); returns how many there were.
    ///
    /// # Errors
    /// A refused dump (no `CAP_NET_ADMIN`: `EPERM`) or a broken socket. After an error the
    /// socket may still be inside the dump: drop it and open a new one.
    pub fn dump(
        &mut self,
        family: Family,
        filter: &DumpFilter,
        each: &mut dyn FnMut(&Flow),
    ) -> Result<usize, Error> {
        const OP: &str = "dumping conntrack entries";
        let seq = self.next_seq();
        self.requests.clear();
        wire::dump_request(&mut self.requests, seq, family, filter);
        self.send_requests(OP)?;
        let mut count = 0;
        loop {
            let n = self.recv(OP)?;
            for reply in wire::replies(&self.buffer[..n]) {
                match reply.map_err(|e| Error::Malformed {
                    op: OP,
                    detail: e.0,
                })? {
                    Reply::Flow { seq: s, flow } if s == seq => {
                        count += 1;
                        each(&flow);
                    }
                    Reply::Done { seq: s } if s == seq => return Ok(count),
                    Reply::Status { seq: s, errno } if s == seq && errno != 0 => {
                        return Err(Error::Io {
                            op: OP,
                            source: io::Error::from_raw_os_error(errno),
                        });
                    }
                    _ => {}
                }
            }
        }
    }

    /// Sends `items` in batches; returns the errno of each (0 for success).
    fn transact<T>(
        &mut self,
        op: &'static str,
        items: &[T],
        encode: impl Fn(&mut Vec<u8>, u32, &T, bool),
    ) -> Result<Vec<i32>, Error> {
        let mut results = vec![0; items.len()];
        for (chunk_index, chunk) in items.chunks(BATCH).enumerate() {
            self.requests.clear();
            let first = self.seq.wrapping_add(1);
            for (i, item) in chunk.iter().enumerate() {
                let seq = self.next_seq();
                encode(&mut self.requests, seq, item, i + 1 == chunk.len());
            }
            let last = self.seq;
            self.send_requests(op)?;
            let offset = chunk_index * BATCH;
            'chunk: loop {
                let n = self.recv(op)?;
                for reply in wire::replies(&self.buffer[..n]) {
                    let reply = reply.map_err(|e| Error::Malformed { op, detail: e.0 })?;
                    let Reply::Status { seq, errno } = reply else {
                        continue;
                    };
                    let index = seq.wrapping_sub(first) as usize;
                    if index >= chunk.len() {
                        continue;
                    }
                    if let Some(slot) = results.get_mut(offset + index) {
                        *slot = errno;
                    }
                    if seq == last {
                        break 'chunk;
                    }
                }
            }
        }
        Ok(results)
    }

    /// Deletes exactly these entries (by original tuple, id and zone).
    ///
    /// # Errors
    /// Only a broken socket; refusals of single entries are counted in the outcome.
    pub fn delete(&mut self, flows: &[Flow]) -> Result<DeleteOutcome, Error> {
        let results = self.transact("deleting conntrack entries", flows, |out, seq, f, ack| {
            wire::delete_request(out, seq, f, ack)
        })?;
        let mut outcome = DeleteOutcome::default();
        for errno in results {
            match errno {
                0 => outcome.deleted += 1,
                e if e == ENOENT => outcome.gone += 1,
                other => {
                    outcome.failed += 1;
                    outcome
                        .first_error
                        .get_or_insert_with(|| io::Error::from_raw_os_error(other));
                }
            }
        }
        Ok(outcome)
    }

    /// Creates these entries, each expiring after `timeout` (whole seconds, at least 1);
    /// returns how many were created (an existing entry with the same tuple is left alone).
    /// For tests and benchmarks: the proxy itself never creates entries.
    ///
    /// # Errors
    /// A broken socket, or the first refusal other than "exists" (e.g. the table is full:
    /// raise `nf_conntrack_max`).
    pub fn create(&mut self, flows: &[Flow], timeout: Duration) -> Result<usize, Error> {
        const OP: &str = "creating conntrack entries";
        let seconds = u32::try_from(timeout.as_secs()).unwrap_or(u32::MAX).max(1);
        let results = self.transact(OP, flows, |out, seq, f, ack| {
            wire::create_request(out, seq, f, seconds, ack)
        })?;
        let mut created = 0;
        for errno in results {
            match errno {
                0 => created += 1,
                e if e == EEXIST => {}
                other => {
                    return Err(Error::Io {
                        op: OP,
                        source: io::Error::from_raw_os_error(other),
                    });
                }
            }
        }
        Ok(created)
    }
}

/// `ENOENT`: the entry to delete is not there (any more).
const ENOENT: i32 = 2;
/// `EEXIST`: an entry with this tuple already exists.
const EEXIST: i32 = 17;
