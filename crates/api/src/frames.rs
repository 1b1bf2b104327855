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
//! `localv1` client reads them. A client that asks for bundles (`WatchReq.AcceptZstd`) gets
//! each chunk it takes whole as one compressed bundle instead ([`crate::bundle`]), which opens
//! to those same bytes. The frames of [`CHUNKS_PER_BUFFER`] consecutive chunks are kept in one
//! buffer, and so are their bundles, so a node that takes several chunks whole (or a slice of
//! one and the next ones) receives them as one slice: at most a few HTTP/2 DATA frames per
//! thousand Services instead of one per chunk (~17 kB, or ~1.7 kB as a bundle).

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use prost::Message;
use prost::bytes::{BufMut, Bytes, BytesMut};

use crate::hub::{Entries, Entry};
use crate::proto;

/// A chunk of the stream is handed on once it holds this much: large enough that per-chunk
/// costs vanish, small enough that a few thousand streams in flight stay within memory.
pub const CHUNK_BYTES: usize = 64 * 1024;

/// Services per shared replay chunk: with endpoints spread over many nodes each node depends
/// on few Services, so most chunks are shared as they are, and a chunk that is not is still
/// passed on in slices around the Services that differ ([`SharedChunk::runs_for`]).
const SERVICES_PER_CHUNK: usize = 32;

/// Frames encoded elsewhere are passed on by reference from this size: below it a copy costs
/// less than one more buffer on the stream. A replay chunk (tens of Services, ~10 kB) is
/// above it: at a thousand nodes, copying every chunk into every node's stream (and faulting
/// in the fresh buffers it filled) was a fifth of the brain's CPU.
pub const BY_REFERENCE_BYTES: usize = 2 * 1024;

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
    /// Consecutive spans of one shared buffer ([`FrameWriter::span`]), passed on as one
    /// slice once anything else comes.
    span: Option<(Bytes, Range<usize>)>,
    done: VecDeque<Bytes>,
    /// Whether a chunk was completed: only then is the change set large enough to be worth
    /// a chunk-sized buffer up front.
    flushed: bool,
}

impl FrameWriter {
    /// Appends one op.
    pub fn op(&mut self, op: &proto::OpItem) {
        self.end_span();
        self.make_room();
        frame_into(op, &mut self.current);
        self.complete_if_full();
    }

    /// Appends frames encoded elsewhere: copied when small, passed on by reference from
    /// [`BY_REFERENCE_BYTES`].
    pub fn shared(&mut self, frames: &Bytes) {
        if frames.len() >= BY_REFERENCE_BYTES {
            self.by_reference(frames);
        } else {
            self.copy(frames);
        }
    }

    /// Appends a copy of `frames`.
    fn copy(&mut self, frames: &[u8]) {
        self.end_span();
        self.make_room();
        self.current.extend_from_slice(frames);
        self.complete_if_full();
    }

    /// Completes the chunk once it holds [`CHUNK_BYTES`].
    fn complete_if_full(&mut self) {
        if self.current.len() >= CHUNK_BYTES {
            self.flush();
        }
    }

    /// Appends frames encoded elsewhere by reference, whatever their size.
    pub fn by_reference(&mut self, frames: &Bytes) {
        self.flush();
        self.done.push_back(frames.clone());
    }

    /// Appends `buffer[span]`, a replay's bundles that many nodes receive, by reference
    /// whatever their size; a span that continues the previous one in the same buffer extends
    /// it, so consecutive bundles leave as one slice. Copied, the ~1.7 kB bundles were a copy
    /// of the compressed replay per node in flight (773 MB of brain peak RSS at 1,000 nodes,
    /// against 293 MB without bundles); each as a frame of its own, they kept ~44 kB per
    /// stream in HTTP/2's send queue after a replay (h2's slab of queued frames never
    /// shrinks), and cost CPU per frame.
    pub fn span(&mut self, buffer: &Bytes, span: Range<usize>) {
        if !self.extend_span(buffer, &span) {
            self.flush();
            self.span = Some((buffer.clone(), span));
        }
    }

    /// Appends `buffer[span]`, a replay's frames that many nodes receive: as
    /// [`FrameWriter::span`], but a span under [`BY_REFERENCE_BYTES`] that does not continue
    /// the previous one is copied (cheaper than a frame of its own).
    pub fn span_or_copy(&mut self, buffer: &Bytes, span: Range<usize>) {
        if self.extend_span(buffer, &span) {
            return;
        }
        match buffer.get(span.clone()) {
            Some(frames) if frames.len() < BY_REFERENCE_BYTES => self.copy(frames),
            _ => self.span(buffer, span),
        }
    }

    /// Extends the pending span with `span` of `buffer` if it continues it.
    fn extend_span(&mut self, buffer: &Bytes, span: &Range<usize>) -> bool {
        match &mut self.span {
            Some((current, range))
                if current.as_ptr() == buffer.as_ptr()
                    && current.len() == buffer.len()
                    && range.end == span.start =>
            {
                range.end = span.end;
                true
            }
            _ => false,
        }
    }

    /// Completes the unfinished chunk. The rest of its buffer stays for the next one, so a
    /// stream that mostly passes frames by reference does not take a fresh buffer per piece.
    pub fn flush(&mut self) {
        if !self.current.is_empty() {
            self.done.push_back(self.current.split().freeze());
            self.flushed = true;
        }
        self.end_span();
    }

    /// Passes the pending span on (the buffer holds nothing meanwhile: anything appended
    /// ends the span first).
    fn end_span(&mut self) {
        if let Some((buffer, range)) = self.span.take()
            && range.end <= buffer.len()
            && range.start < range.end
        {
            self.done.push_back(buffer.slice(range));
        }
    }

    /// Before appending: once a chunk was completed and what is left of its buffer is small,
    /// a fresh chunk-sized one. Taken here rather than in [`FrameWriter::flush`]: a change set
    /// ends with a flush, and a buffer reserved then was freed unused, a large allocation per
    /// stream per change (at a thousand nodes, a tenth of the brain's CPU while changes were
    /// sent went to allocating and returning them). A small change set grows its one buffer
    /// as needed.
    fn make_room(&mut self) {
        if self.flushed && self.current.capacity() < BY_REFERENCE_BYTES {
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
    /// The Services, in key order (their anonymous frames are the chunk's part of `buffer`).
    pub entries: Vec<Arc<Entry>>,
    /// How many ops the chunk's frames hold.
    pub ops: u64,
    /// The frames of this chunk and of its [`CHUNKS_PER_BUFFER`] neighbours, one after the
    /// other.
    buffer: Bytes,
    /// Where each entry's frames start in `buffer`, and how many ops of the chunk come before
    /// them; one more mark for the end.
    marks: Vec<(usize, u64)>,
    /// For each node some of the Services depend on, the indexes of those Services.
    dependents: HashMap<String, Vec<usize>>,
    /// The Services every node may depend on (no list of nodes): the chunk is shared with no
    /// node.
    everyones: Vec<usize>,
}

/// What a node receives of one [`SharedChunk`], in order.
#[derive(Debug)]
pub enum ChunkRun<'a> {
    /// Consecutive Services' anonymous frames: `buffer[span]`, where the frames of the chunks
    /// around them are too (so consecutive runs can leave as one slice), and their ops.
    Shared {
        /// The frames of this chunk's [`CHUNKS_PER_BUFFER`] neighbours.
        buffer: Bytes,
        /// These Services' frames in it.
        span: Range<usize>,
        /// The ops they hold.
        ops: u64,
    },
    /// The whole chunk as one bundle message: `buffer[span]`, where the bundles of the
    /// chunks around it are too (so consecutive ones can leave as one slice), and its ops.
    Bundle {
        /// The bundles of this chunk's [`CHUNKS_PER_BUFFER`] neighbours.
        buffer: Bytes,
        /// This chunk's bundle in it.
        span: Range<usize>,
        /// The ops it holds.
        ops: u64,
    },
    /// A Service that depends on the node: its ops are the node's own.
    Own(&'a Arc<Entry>),
}

impl SharedChunk {
    /// Whether `node_name` receives the chunk's frames exactly as an anonymous node does.
    pub fn shared_with(&self, node_name: &str) -> bool {
        self.everyones.is_empty()
            && (node_name.is_empty() || !self.dependents.contains_key(node_name))
    }

    /// The Services of this chunk that depend on `node_name`, in order (both lists are
    /// ascending).
    fn own_for(&self, node_name: &str) -> Vec<usize> {
        let mut own = self.everyones.clone();
        if !node_name.is_empty()
            && let Some(mine) = self.dependents.get(node_name)
        {
            own.extend(mine);
            own.sort_unstable();
        }
        own
    }

    /// Entries `from..to` as a node whose own Services are `own` receives them: slices of the
    /// chunk's frames around those Services.
    fn slices_for(&self, own: &[usize], from: usize, to: usize) -> Vec<ChunkRun<'_>> {
        let mut runs = Vec::new();
        let mut start = from;
        for &i in own.iter().filter(|&&i| from <= i && i < to) {
            if let Some(entry) = self.entries.get(i) {
                self.push_slice(&mut runs, start, i);
                runs.push(ChunkRun::Own(entry));
                start = i + 1;
            }
        }
        self.push_slice(&mut runs, start, to);
        runs
    }

    /// The anonymous frames of entries `from..to` and their ops.
    fn part(&self, from: usize, to: usize) -> Option<(&[u8], u64)> {
        let (&(a, ops_a), &(b, ops_b)) = (self.marks.get(from)?, self.marks.get(to)?);
        Some((self.buffer.get(a..b)?, ops_b.checked_sub(ops_a)?))
    }

    /// The anonymous frames of entries `from..to`, unless that is empty.
    fn push_slice<'a>(&'a self, runs: &mut Vec<ChunkRun<'a>>, from: usize, to: usize) {
        if let (Some(&(a, ops_a)), Some(&(b, ops_b))) = (self.marks.get(from), self.marks.get(to))
            && b > a
        {
            runs.push(ChunkRun::Shared {
                buffer: self.buffer.clone(),
                span: a..b,
                ops: ops_b - ops_a,
            });
        }
    }
}

/// Shared chunks whose frames are kept in one buffer (~550 kB at 4 endpoints a Service), and
/// their bundles in another (~50 kB): a node that takes consecutive chunks whole gets them as
/// one slice of it.
pub const CHUNKS_PER_BUFFER: usize = 32;

/// Services per part of a chunk that is bundled on its own, for a node that depends on
/// another part of the chunk. With a few hundred nodes most chunks of 32 hold a Service of
/// each node's own (at 200 nodes, 4 endpoints a Service: 48 %), and went whole as single ops.
const SERVICES_PER_PART: usize = 8;

/// A snapshot's replay: its shared chunks, and their bundles (compressed on first use).
#[derive(Debug)]
pub struct Replay {
    /// The chunks, in key order.
    pub chunks: Vec<SharedChunk>,
    /// For every [`CHUNKS_PER_BUFFER`] chunks, their bundles in one buffer.
    bundles: Vec<OnceLock<BundleBuffer>>,
    /// For the same chunks, the bundles of their parts of [`SERVICES_PER_PART`] Services.
    part_bundles: Vec<OnceLock<BundleBuffer>>,
}

/// The bundles of consecutive chunks, one after the other.
#[derive(Debug)]
struct BundleBuffer {
    bytes: Bytes,
    /// Each chunk's (or part's) bundle in `bytes`; `None` for one that compressing does not
    /// shrink.
    spans: Vec<Option<Range<usize>>>,
}

impl Replay {
    fn new(chunks: Vec<SharedChunk>) -> Replay {
        let buffers = chunks.len().div_ceil(CHUNKS_PER_BUFFER);
        Replay {
            chunks,
            bundles: (0..buffers).map(|_| OnceLock::new()).collect(),
            part_bundles: (0..buffers).map(|_| OnceLock::new()).collect(),
        }
    }

    /// Chunk `i` as `node_name` receives it: the whole chunk when it is
    /// [shared with](SharedChunk::shared_with) the node (as one bundle when the node reads
    /// bundles and compressing pays), else slices of it around the Services that depend on
    /// the node (to a node that reads bundles, the parts of `SERVICES_PER_PART` Services
    /// without one of those as bundles).
    pub fn runs_for(&self, i: usize, node_name: &str, bundles: bool) -> Vec<ChunkRun<'_>> {
        let Some(chunk) = self.chunks.get(i) else {
            return Vec::new();
        };
        let len = chunk.entries.len();
        if chunk.shared_with(node_name) {
            if bundles && let Some((buffer, span)) = self.bundle(i) {
                return vec![ChunkRun::Bundle {
                    buffer,
                    span,
                    ops: chunk.ops,
                }];
            }
            return chunk.slices_for(&[], 0, len);
        }
        let own = chunk.own_for(node_name);
        if !bundles {
            return chunk.slices_for(&own, 0, len);
        }
        let mut runs = Vec::new();
        for part in 0..len.div_ceil(SERVICES_PER_PART) {
            let from = part * SERVICES_PER_PART;
            let to = (from + SERVICES_PER_PART).min(len);
            let bundle = (!own.iter().any(|o| (from..to).contains(o)))
                .then(|| self.part_bundle(i, part))
                .flatten();
            match (bundle, chunk.part(from, to)) {
                (Some((buffer, span)), Some((_, ops))) => {
                    runs.push(ChunkRun::Bundle { buffer, span, ops });
                }
                _ => runs.extend(chunk.slices_for(&own, from, to)),
            }
        }
        runs
    }

    /// Chunk `i`'s bundle: its buffer and where in it. The buffer is compressed by the first
    /// node that takes one of its chunks whole and reads bundles (~1 ms), for every node.
    fn bundle(&self, i: usize) -> Option<(Bytes, Range<usize>)> {
        let n = i / CHUNKS_PER_BUFFER;
        let buffer = self.bundles.get(n)?.get_or_init(|| {
            bundle_buffer(
                self.neighbours(n)
                    .iter()
                    .map(|c| c.part(0, c.entries.len())),
            )
        });
        let span = buffer.spans.get(i % CHUNKS_PER_BUFFER)?.clone()?;
        Some((buffer.bytes.clone(), span))
    }

    /// The bundle of part `part` of chunk `i`, as [`Replay::bundle`].
    fn part_bundle(&self, i: usize, part: usize) -> Option<(Bytes, Range<usize>)> {
        let n = i / CHUNKS_PER_BUFFER;
        let parts_per_chunk = SERVICES_PER_CHUNK.div_ceil(SERVICES_PER_PART);
        let buffer = self.part_bundles.get(n)?.get_or_init(|| {
            bundle_buffer(self.neighbours(n).iter().flat_map(|c| {
                (0..parts_per_chunk).map(|p| {
                    let from = p * SERVICES_PER_PART;
                    let to = (from + SERVICES_PER_PART).min(c.entries.len());
                    c.part(from, to).filter(|_| from < to)
                })
            }))
        });
        let span = buffer
            .spans
            .get((i % CHUNKS_PER_BUFFER) * parts_per_chunk + part)?
            .clone()?;
        Some((buffer.bytes.clone(), span))
    }

    /// The chunks of buffer `n`.
    fn neighbours(&self, n: usize) -> &[SharedChunk] {
        let first = n * CHUNKS_PER_BUFFER;
        let last = (first + CHUNKS_PER_BUFFER).min(self.chunks.len());
        self.chunks.get(first..last).unwrap_or_default()
    }
}

/// The bundles of `parts` (frames and their ops; `None`: nothing to bundle) in one buffer.
fn bundle_buffer<'a>(parts: impl Iterator<Item = Option<(&'a [u8], u64)>>) -> BundleBuffer {
    let mut out = BytesMut::new();
    let spans = parts
        .map(|part| {
            let (frames, ops) = part?;
            let bundle = crate::bundle::bundle_frame(frames, ops)?;
            let start = out.len();
            out.extend_from_slice(&bundle);
            Some(start..out.len())
        })
        .collect();
    BundleBuffer {
        bytes: out.freeze(),
        spans,
    }
}

/// A snapshot (weakly held: the cache never keeps one alive) and its replay.
type CachedReplay = (Weak<Entries>, Arc<Replay>);

/// The replay of the newest snapshot, cut into shared chunks: built by the first watcher that
/// replays the snapshot, used by every other one.
#[derive(Debug, Default)]
pub struct ReplayCache {
    inner: Mutex<Option<CachedReplay>>,
}

impl ReplayCache {
    /// The replay of `entries` (built now unless the cache holds this very snapshot).
    pub fn replay(&self, entries: &Arc<Entries>) -> Arc<Replay> {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((snapshot, replay)) = inner.as_ref()
            && std::ptr::eq(snapshot.as_ptr(), Arc::as_ptr(entries))
        {
            return replay.clone();
        }
        let replay = Arc::new(Replay::new(build_chunks(entries)));
        *inner = Some((Arc::downgrade(entries), replay.clone()));
        replay
    }
}

fn build_chunks(entries: &Entries) -> Vec<SharedChunk> {
    let all: Vec<&Arc<Entry>> = entries.values().collect();
    let mut chunks = Vec::with_capacity(all.len().div_ceil(SERVICES_PER_CHUNK));
    for neighbours in all.chunks(SERVICES_PER_CHUNK * CHUNKS_PER_BUFFER) {
        let mut out = BytesMut::new();
        let built: Vec<_> = neighbours
            .chunks(SERVICES_PER_CHUNK)
            .map(|group| encode_chunk(group, &mut out))
            .collect();
        let buffer = out.freeze();
        chunks.extend(built.into_iter().map(|chunk| chunk.into_shared(&buffer)));
    }
    chunks
}

/// A chunk encoded into its neighbours' buffer, before the buffer is complete.
struct EncodedChunk {
    entries: Vec<Arc<Entry>>,
    ops: u64,
    marks: Vec<(usize, u64)>,
    dependents: HashMap<String, Vec<usize>>,
    everyones: Vec<usize>,
}

/// Appends the anonymous frames of `group` to `out`.
fn encode_chunk(group: &[&Arc<Entry>], out: &mut BytesMut) -> EncodedChunk {
    let mut ops = 0;
    let mut marks = Vec::with_capacity(group.len() + 1);
    let mut dependents: HashMap<String, Vec<usize>> = HashMap::new();
    let mut everyones = Vec::new();
    for (i, entry) in group.iter().enumerate() {
        let (frames, n) = entry.anonymous_frames();
        marks.push((out.len(), ops));
        out.extend_from_slice(&frames);
        ops += n;
        match entry.dependent_nodes() {
            Some(nodes) => {
                for node in nodes {
                    dependents.entry(node.clone()).or_default().push(i);
                }
            }
            None => everyones.push(i),
        }
    }
    marks.push((out.len(), ops));
    EncodedChunk {
        entries: group.iter().map(|e| Arc::clone(e)).collect(),
        ops,
        marks,
        dependents,
        everyones,
    }
}

impl EncodedChunk {
    fn into_shared(self, buffer: &Bytes) -> SharedChunk {
        SharedChunk {
            entries: self.entries,
            ops: self.ops,
            buffer: buffer.clone(),
            marks: self.marks,
            dependents: self.dependents,
            everyones: self.everyones,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::op_item::Op;

    fn value_op(bytes: usize) -> proto::OpItem {
        proto::OpItem {
            op: Some(Op::Set(proto::Value {
                r#ref: Some(proto::Ref {
                    set: proto::Set::ServicesSet as i32,
                    path: "default/web".to_string(),
                }),
                bytes: Bytes::from(vec![7u8; bytes]),
            })),
        }
    }

    /// Three frames of the same small size in one buffer, and the size of one.
    fn three_small_frames() -> (Bytes, usize) {
        let frames = frames_of(&[value_op(100), value_op(100), value_op(100)]);
        let one = frames.len() / 3;
        (frames, one)
    }

    fn drain(writer: &mut FrameWriter) -> Vec<Bytes> {
        std::iter::from_fn(|| writer.pop_ready()).collect()
    }

    #[test]
    fn a_small_change_set_keeps_no_chunk_sized_buffer_after_its_last_flush() {
        let mut writer = FrameWriter::default();
        writer.op(&value_op(100));
        writer.shared(&frames_of(&[value_op(200)]));
        writer.flush();
        let chunks = drain(&mut writer);
        assert_eq!(chunks.len(), 1);
        assert_eq!(count_frames(&chunks[0]), 2);
        assert!(
            writer.current.capacity() < BY_REFERENCE_BYTES,
            "{} bytes left reserved",
            writer.current.capacity()
        );
    }

    #[test]
    fn a_large_change_set_is_cut_into_chunks_with_every_frame_intact() {
        let mut writer = FrameWriter::default();
        let ops: Vec<_> = (0..1000).map(|i| value_op(100 + i % 300)).collect();
        for op in &ops {
            writer.op(op);
        }
        writer.flush();
        let chunks = drain(&mut writer);
        assert!(chunks.len() > 2, "{} chunks", chunks.len());
        for chunk in &chunks[..chunks.len() - 1] {
            assert!(
                chunk.len() >= CHUNK_BYTES,
                "a chunk of {} bytes",
                chunk.len()
            );
        }
        let joined: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        assert_eq!(joined, frames_of(&ops).to_vec());
    }

    #[test]
    fn consecutive_spans_of_one_buffer_leave_as_one_slice_and_a_small_one_alone_is_copied() {
        // Frames of 3 kB (passed by reference) but the fourth (copied when alone).
        let sizes = [3000, 3000, 3000, 100, 3000, 3000];
        let ops: Vec<_> = sizes.iter().map(|&n| value_op(n)).collect();
        let buffer = frames_of(&ops);
        let mut marks = vec![0];
        for op in &ops {
            marks.push(marks[marks.len() - 1] + 5 + op.encoded_len());
        }
        let other = frames_of(&[value_op(3000)]);
        let mut writer = FrameWriter::default();
        writer.span_or_copy(&buffer, marks[0]..marks[1]);
        writer.span_or_copy(&buffer, marks[1]..marks[2]);
        writer.span_or_copy(&buffer, marks[2]..marks[3]);
        // Small, but it continues the span: joined.
        writer.span_or_copy(&buffer, marks[3]..marks[4]);
        // Another buffer: a slice of its own.
        writer.span_or_copy(&other, 0..other.len());
        // Small and alone: copied, with the op after it.
        writer.span_or_copy(&buffer, marks[3]..marks[4]);
        writer.op(&value_op(20));
        writer.span_or_copy(&buffer, marks[4]..marks[5]);
        writer.span_or_copy(&buffer, marks[5]..marks[6]);
        writer.flush();
        let chunks = drain(&mut writer);
        let lens: Vec<usize> = chunks.iter().map(Bytes::len).collect();
        assert_eq!(
            lens,
            vec![
                marks[4],
                other.len(),
                marks[4] - marks[3] + 5 + value_op(20).encoded_len(),
                marks[6] - marks[4],
            ]
        );
        // Slices of the buffers, not copies.
        assert_eq!(chunks[0].as_ptr(), buffer.as_ptr());
        assert_eq!(chunks[1].as_ptr(), other.as_ptr());
        assert_eq!(chunks[3].as_ptr(), buffer[marks[4]..].as_ptr());
        let joined: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        let mut expected = buffer[..marks[4]].to_vec();
        expected.extend_from_slice(&other);
        expected.extend_from_slice(&buffer[marks[3]..marks[4]]);
        expected.extend_from_slice(&frames_of(&[value_op(20)]));
        expected.extend_from_slice(&buffer[marks[4]..]);
        assert_eq!(joined, expected);
    }

    #[test]
    fn bundles_are_passed_by_reference_however_small() {
        let (bundles, third) = three_small_frames();
        let mut writer = FrameWriter::default();
        writer.span(&bundles, 0..third);
        writer.op(&value_op(20));
        writer.span(&bundles, third..2 * third);
        writer.span(&bundles, 2 * third..bundles.len());
        writer.flush();
        let chunks = drain(&mut writer);
        assert_eq!(chunks.len(), 3);
        assert_eq!(chunks[0].as_ptr(), bundles.as_ptr());
        assert_eq!(chunks[2].as_ptr(), bundles[third..].as_ptr());
        assert_eq!(chunks[2].len(), bundles.len() - third);
    }

    #[test]
    fn a_span_that_skips_part_of_the_buffer_is_a_slice_of_its_own() {
        let (bundles, third) = three_small_frames();
        let mut writer = FrameWriter::default();
        writer.span(&bundles, 0..third);
        writer.span(&bundles, 2 * third..bundles.len());
        writer.flush();
        let chunks = drain(&mut writer);
        let joined: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        let mut expected = bundles[..third].to_vec();
        expected.extend_from_slice(&bundles[2 * third..]);
        assert_eq!(joined, expected);
        assert_eq!(chunks.len(), 2);
    }
}
