//! The Watch stream as bytes: gRPC frames (a 5-byte header, then one encoded `OpItem`),
//! encoded once and shared among every node that receives the same ops.
//!
//! At a thousand nodes the brain's cost was encoding the same ops again for every node (162k
//! ops per node at 30k Services × 4 endpoints), and sending them one message at a time. Here:
//! - an [`crate::hub::Entry`] keeps the frames of its Service as an anonymous node receives it
//!   (encoded on first use) and of its change from the previous version;
//! - a replay of a whole snapshot is cut into [`SharedChunk`]s of consecutive Services, each
//!   encoded once for every node that none of its Services depends on; a node gets those
//!   chunks by reference and re-encodes only the chunks holding a Service that depends on it
//!   (one of its endpoints runs there, or topology hints);
//! - a [`FrameWriter`] gathers what one change set sends into large chunks (small pieces are
//!   copied, shared chunks are passed along as they are), so the stream is written in large
//!   frames, never one op at a time.
//!
//! The bytes on the wire are exactly what encoding the `OpItem`s one by one gives: any
//! `localv1` client reads them.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, Weak};

use prost::Message;
use prost::bytes::{BufMut, Bytes, BytesMut};

use crate::hub::{Entries, Entry};
use crate::proto;

/// A chunk of the stream is handed on once it holds this much: large enough that per-chunk
/// costs vanish, small enough that a few thousand streams in flight stay within memory.
pub const CHUNK_BYTES: usize = 64 * 1024;

/// Services per shared replay chunk: with endpoints spread over many nodes each node depends
/// on few Services, so most chunks are shared as they are.
const SERVICES_PER_CHUNK: usize = 32;

/// Appends `op` as one gRPC message (uncompressed flag, big-endian length, protobuf).
pub fn frame_into(op: &proto::OpItem, out: &mut BytesMut) {
    let len = op.encoded_len();
    out.reserve(5 + len);
    out.put_u8(0);
    out.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    // Cannot fail: the capacity was reserved above.
    let _ = op.encode(out);
}

/// `ops` as consecutive gRPC messages.
pub fn frames_of(ops: &[proto::OpItem]) -> Bytes {
    let mut out = BytesMut::new();
    for op in ops {
        frame_into(op, &mut out);
    }
    out.freeze()
}

/// Gathers one change set's frames into chunks of at least [`CHUNK_BYTES`] (but the last).
#[derive(Debug, Default)]
pub struct FrameWriter {
    current: BytesMut,
    done: VecDeque<Bytes>,
}

impl FrameWriter {
    /// Appends one op.
    pub fn op(&mut self, op: &proto::OpItem) {
        frame_into(op, &mut self.current);
        if self.current.len() >= CHUNK_BYTES {
            self.flush();
        }
    }

    /// Appends frames encoded elsewhere: copied when small, passed on by reference when large.
    pub fn shared(&mut self, frames: &Bytes) {
        if frames.len() >= CHUNK_BYTES / 4 {
            self.flush();
            self.done.push_back(frames.clone());
        } else {
            self.current.extend_from_slice(frames);
            if self.current.len() >= CHUNK_BYTES {
                self.flush();
            }
        }
    }

    /// Completes the unfinished chunk.
    pub fn flush(&mut self) {
        if !self.current.is_empty() {
            self.done.push_back(self.current.split().freeze());
            self.current.reserve(CHUNK_BYTES + CHUNK_BYTES / 4);
        }
    }

    /// The oldest complete chunk.
    pub fn pop_ready(&mut self) -> Option<Bytes> {
        self.done.pop_front()
    }
}

/// How many gRPC messages `frames` holds (walking their headers).
pub fn count_frames(frames: &[u8]) -> u64 {
    let mut at = 0usize;
    let mut n = 0;
    while let Some(header) = frames.get(at..at + 5) {
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        at += 5 + len;
        n += 1;
    }
    n
}

/// Consecutive Services of a snapshot, encoded once for every node none of them depends on.
#[derive(Debug)]
pub struct SharedChunk {
    /// The Services, in key order (their anonymous frames make `frames`).
    pub entries: Vec<Arc<Entry>>,
    /// Their frames as an anonymous node receives them.
    pub frames: Bytes,
    /// How many ops `frames` holds.
    pub ops: u64,
    /// The nodes some of the Services depend on (`None`: every node may).
    dependent_nodes: Option<HashSet<String>>,
}

impl SharedChunk {
    /// Whether `node_name` receives exactly [`SharedChunk::frames`].
    pub fn shared_with(&self, node_name: &str) -> bool {
        self.dependent_nodes
            .as_ref()
            .is_some_and(|nodes| node_name.is_empty() || !nodes.contains(node_name))
    }
}

/// A snapshot (weakly held: the cache never keeps one alive) and its chunks.
type CachedReplay = (Weak<Entries>, Arc<Vec<SharedChunk>>);

/// The replay of the newest snapshot, cut into shared chunks: built by the first watcher that
/// replays the snapshot, used by every other one.
#[derive(Debug, Default)]
pub struct ReplayCache {
    inner: Mutex<Option<CachedReplay>>,
}

impl ReplayCache {
    /// The chunks of `entries` (built now unless the cache holds this very snapshot).
    pub fn chunks(&self, entries: &Arc<Entries>) -> Arc<Vec<SharedChunk>> {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((snapshot, chunks)) = inner.as_ref()
            && std::ptr::eq(snapshot.as_ptr(), Arc::as_ptr(entries))
        {
            return chunks.clone();
        }
        let chunks = Arc::new(build_chunks(entries));
        *inner = Some((Arc::downgrade(entries), chunks.clone()));
        chunks
    }
}

fn build_chunks(entries: &Entries) -> Vec<SharedChunk> {
    let all: Vec<&Arc<Entry>> = entries.values().collect();
    all.chunks(SERVICES_PER_CHUNK)
        .map(|group| {
            let mut out = BytesMut::new();
            let mut ops = 0;
            let mut dependent_nodes = Some(HashSet::new());
            for entry in group {
                let (frames, n) = entry.anonymous_frames();
                out.extend_from_slice(&frames);
                ops += n;
                dependent_nodes = match (dependent_nodes, entry.dependent_nodes()) {
                    (Some(mut all), Some(nodes)) => {
                        all.extend(nodes.iter().cloned());
                        Some(all)
                    }
                    _ => None,
                };
            }
            SharedChunk {
                entries: group.iter().map(|e| Arc::clone(e)).collect(),
                frames: out.freeze(),
                ops,
                dependent_nodes,
            }
        })
        .collect()
}
