//! The brain's state: one cluster, any number of watching nodes, each with its own coalesced
//! change set.
//!
//! - The [`ClusterModel`] holds every object once. After each event, every touched Service
//!   gets a new [`Entry`]: its inputs (shared with the model, copy-on-write) and the messages an
//!   *anonymous* node would receive, encoded once.
//! - Each watcher has a [`Pending`] change set: per touched Service, the entry it last received
//!   and the newest one (a change and its undo cancel, as [`kpng_model::Diff`] does). An
//!   event's changes are one shared [`Batch`]: a watcher with nothing else pending holds an
//!   `Arc` of it, any other folds it into its map. Recording never waits for a watcher, so a
//!   slow client never blocks the brain or the other clients; it just receives one bigger
//!   change set later.
//! - When a watcher asks for its next change set, only the Services in it are evaluated for its
//!   node: the anonymous messages when the Service does not depend on that node (no endpoint on
//!   it, no topology hints), else a view computed for it. Old and new messages are compared, so
//!   only real differences become ops. Nothing is ever recomputed for every node on a change.
//! - The first request (and a node rename or zone change) re-evaluates every Service from a
//!   shared snapshot of the entries, not a per-watcher copy.
//! - The cluster's ServiceCIDR ranges (one shared list) go to every watcher after its `Reset`
//!   and whenever they change.
//! - So does the brain's report on its own input ([`Hub::reporting`]): the objects it rejects
//!   and its source's problems, which its nodes never see otherwise. It is the same for every
//!   node, encoded once, and sent only when it changed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime};

use ipnet::IpNet;

use kpng_model::input::InputHealth;
use kpng_model::{
    ClusterModel, ClusterOutcome, Event, Kind, NodeState, ServiceKey, ServicePort, ServiceSource,
    node_state,
};
use prost::bytes::Bytes;

use crate::convert::{
    ServiceMessages, brain_report, encode_node, encode_service, encode_service_cidrs,
};
use crate::frames::{ChunkRun, FrameWriter, ReplayCache, frames_of};
use crate::metrics::ApiMetrics;
use crate::proto;
use crate::proto::op_item::Op;

mod batch;
mod unknown_node;

pub use batch::{Batch, BatchChange};

/// The kinds that must be listed before anything is served (as KPNG's `AllSynced`).
const REQUIRED_KINDS: [Kind; 3] = [Kind::Service, Kind::EndpointSlice, Kind::Node];

/// One version of one Service: its inputs and the anonymous node's messages, plus the
/// frames every node that does not depend on it receives (encoded once, on first use).
#[derive(Debug)]
pub struct Entry {
    key: ServiceKey,
    source: Arc<ServiceSource>,
    anonymous: Option<Arc<ServiceMessages>>,
    /// The nodes that receive other messages than an anonymous node (`None`: every node may,
    /// topology hints).
    dependent_nodes: Option<Box<[String]>>,
    /// The ops that set this version from nothing, as gRPC frames, and how many.
    anonymous_frames: OnceLock<(Bytes, u64)>,
    /// The ops from a previous version to this one, as gRPC frames (the one change every
    /// watcher holding that version receives).
    change_frames: Mutex<Option<(Weak<Entry>, Bytes, u64)>>,
}

impl Entry {
    fn new(key: ServiceKey, source: Arc<ServiceSource>) -> Entry {
        let ports = source.ports_for(&NodeState::default());
        let anonymous = encode(&ports);
        let dependent_nodes = source.dependent_nodes().map(Vec::into_boxed_slice);
        Entry {
            key,
            source,
            anonymous,
            dependent_nodes,
            anonymous_frames: OnceLock::new(),
            change_frames: Mutex::new(None),
        }
    }

    /// Whether `node_name` receives other messages than an anonymous node (an endpoint runs
    /// there, or topology hints).
    pub fn depends_on_node(&self, node_name: &str) -> bool {
        match &self.dependent_nodes {
            None => true,
            Some(nodes) => {
                !node_name.is_empty()
                    && nodes
                        .binary_search_by(|n| n.as_str().cmp(node_name))
                        .is_ok()
            }
        }
    }

    /// See [`Entry::depends_on_node`]: `None` when every node may depend on it.
    pub fn dependent_nodes(&self) -> Option<&[String]> {
        self.dependent_nodes.as_deref()
    }

    /// The frames that set this version on a node holding none of the Service, for a node
    /// that does not depend on it.
    pub fn anonymous_frames(&self) -> (Bytes, u64) {
        self.anonymous_frames
            .get_or_init(|| {
                let ops = service_ops(&self.key, None, self.anonymous.as_deref());
                (frames_of(&ops), ops.len() as u64)
            })
            .clone()
    }

    /// The frames that turn `old` into this version, for a node that depends on neither.
    /// Every watcher holding `old` receives the same: encoded for the first, shared after.
    pub fn change_frames_from(&self, old: &Arc<Entry>) -> (Bytes, u64) {
        let mut cache = self
            .change_frames
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((from, frames, ops)) = cache.as_ref()
            && std::ptr::eq(from.as_ptr(), Arc::as_ptr(old))
        {
            return (frames.clone(), *ops);
        }
        let ops = service_ops(
            &self.key,
            old.anonymous.as_deref(),
            self.anonymous.as_deref(),
        );
        let frames = frames_of(&ops);
        let ops = ops.len() as u64;
        *cache = Some((Arc::downgrade(old), frames.clone(), ops));
        (frames, ops)
    }

    /// The messages `node` receives for this version of the Service (`None`: no value).
    pub fn messages_for(&self, node: &NodeState) -> Option<Arc<ServiceMessages>> {
        if self.depends_on_node(&node.name) {
            encode(&self.source.ports_for(node))
        } else {
            self.anonymous.clone()
        }
    }
}

fn encode(ports: &[ServicePort]) -> Option<Arc<ServiceMessages>> {
    let refs: Vec<&ServicePort> = ports.iter().collect();
    encode_service(&refs).map(Arc::new)
}

/// Every current entry, by Service: shared by the watchers that replay it.
pub type Entries = BTreeMap<ServiceKey, Arc<Entry>>;

/// One Service's change since a watcher's last change set.
#[derive(Debug, Clone)]
pub struct Change {
    /// The version the watcher holds (`None`: it has none).
    pub old: Option<Arc<Entry>>,
    /// The newest version (`None`: the Service is gone).
    pub new: Option<Arc<Entry>>,
}

/// What a watcher must be sent next.
#[derive(Debug, Default)]
pub struct Pending {
    /// The watcher holds nothing (its first request): send `Reset` and everything.
    pub replay: bool,
    /// Re-evaluate every Service of this snapshot (first request, node rename or zone change);
    /// Services in `changes` take their versions from there.
    pub base: Option<Arc<Entries>>,
    /// Services changed since the last change set.
    pub changes: BTreeMap<ServiceKey, Change>,
    /// The one event since the last change set, when nothing else is pending: shared with
    /// every other watcher it reached, not yet folded into `changes` (see [`Batch`]).
    pub batch: Option<Arc<Batch>>,
    /// The node state the watcher's views were computed with (`None` before the first);
    /// shared, so taking a change set copies none of it.
    pub old_node: Option<Arc<NodeState>>,
    /// The node state to compute views with now.
    pub node: Arc<NodeState>,
    /// The cluster's ServiceCIDR ranges, when they must be sent (a change, or a replay while
    /// there are some).
    pub service_cidrs: Option<Arc<Vec<IpNet>>>,
    /// The brain's report on its input, when it must be sent (a change, or a replay).
    pub brain_report: Option<Arc<SharedReport>>,
    /// The watcher is not served: its node is not one of the brain's cluster's
    /// (the `unknown_node` module); the stream ends with this message instead of a change set.
    pub refused: Option<String>,
}

/// The brain's report on its own input as one op, encoded once and passed to every watcher by
/// reference (see [`Hub::reporting`]).
#[derive(Debug)]
pub struct SharedReport {
    value: proto::KpngBrainReport,
    op: proto::OpItem,
    frames: Bytes,
}

impl SharedReport {
    fn new(value: proto::KpngBrainReport) -> SharedReport {
        let op = set(
            proto::Set::KpngBrainReportSet,
            "brain".to_string(),
            Bytes::from(prost::Message::encode_to_vec(&value)),
        );
        let frames = frames_of(std::slice::from_ref(&op));
        SharedReport { value, op, frames }
    }

    /// The report.
    pub fn value(&self) -> &proto::KpngBrainReport {
        &self.value
    }
}

impl Pending {
    fn is_ready(&self) -> bool {
        // Before its first change set (`old_node: None`) a watcher waits for the replay.
        self.refused.is_some()
            || self.replay
            || self.old_node.as_ref().is_some_and(|old| {
                self.base.is_some()
                    || !self.changes.is_empty()
                    || self.batch.is_some()
                    || *old != self.node
                    || self.service_cidrs.is_some()
                    || self.brain_report.is_some()
            })
    }

    /// Records one event's changes: kept shared while nothing else is pending, else folded
    /// into the coalesced map.
    fn record_batch(&mut self, batch: &Arc<Batch>) {
        if self.batch.is_none() && self.changes.is_empty() && self.base.is_none() && !self.replay {
            self.batch = Some(batch.clone());
        } else {
            self.fold();
            self.fold_batch(batch);
        }
    }

    /// Folds the shared batch, if any, into the coalesced map (it is newer than the map).
    fn fold(&mut self) {
        if let Some(batch) = self.batch.take() {
            self.fold_batch(&batch);
        }
    }

    fn fold_batch(&mut self, batch: &Batch) {
        for c in batch.changes() {
            self.record(&c.key, c.old.clone(), c.new.clone());
        }
    }

    /// Once taken: keeps the shared batch only when it is the whole change set and the node
    /// depends on none of its Services (then [`Pending::frames`] passes the batch's one
    /// encoding on); else folds it, and the change set is assembled per Service.
    fn settle(&mut self) {
        let shared = self.batch.as_ref().is_some_and(|batch| {
            self.changes.is_empty()
                && self.base.is_none()
                && !self.replay
                && self.service_cidrs.is_none()
                && self.brain_report.is_none()
                && self.old_node.as_ref() == Some(&self.node)
                && !batch.depends_on_node(&self.node.name)
        });
        if !shared {
            self.fold();
        }
    }

    fn record(&mut self, key: &ServiceKey, old: Option<Arc<Entry>>, new: Option<Arc<Entry>>) {
        match self.changes.get_mut(key) {
            Some(change) => {
                change.new = new;
                let undone = match (&change.old, &change.new) {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    (None, None) => true,
                    _ => false,
                };
                if undone {
                    // The base (if any) holds the same version, or none.
                    self.changes.remove(key);
                }
            }
            None => {
                self.changes.insert(key.clone(), Change { old, new });
            }
        }
    }

    /// Every Service to evaluate, in key order, as (key, what the watcher holds, newest). A
    /// taken change set holds a shared batch only when nothing else is pending (see
    /// `Pending::settle`).
    pub fn services(
        &self,
    ) -> impl Iterator<Item = (&ServiceKey, Option<&Arc<Entry>>, Option<&Arc<Entry>>)> {
        let base = self.base.as_deref().into_iter().flat_map(|b| b.iter());
        let batch = self
            .batch
            .iter()
            .flat_map(|b| b.changes())
            .map(|c| (&c.key, c.old.as_ref(), c.new.as_ref()));
        merge_by_key(base, self.changes.iter())
            .map(|(key, based, changed)| match (changed, based) {
                (Some(c), _) => (key, c.old.as_ref(), c.new.as_ref()),
                (None, Some(b)) => (key, Some(b), Some(b)),
                (None, None) => (key, None, None),
            })
            .chain(batch)
            .map(move |(key, old, new)| (key, if self.replay { None } else { old }, new))
    }
}

impl Pending {
    /// The ops of this change set, in protocol order: `Reset` (first request), the ServiceCIDR
    /// ranges (first request or when they changed), the node's properties (when they changed;
    /// after a rename, the old name's value is deleted first),
    /// then per Service its `Service` Set, its `Endpoint` Sets
    /// and Deletes, and its `Service` Delete last, so an endpoint never exists without its
    /// Service. Ends with `Sync` unless nothing at all changed for this watcher.
    pub fn ops(&self) -> impl Iterator<Item = proto::OpItem> + '_ {
        let old_node = self.old_node.as_ref().unwrap_or(&self.node);
        let services = self.services().flat_map(move |(key, old, new)| {
            let old = old.and_then(|e| e.messages_for(old_node));
            let new = new.and_then(|e| e.messages_for(&self.node));
            service_ops(key, old.as_deref(), new.as_deref())
        });
        let mut any = false;
        let mut synced = false;
        self.ops_head()
            .chain(services)
            .map(Some)
            .chain(std::iter::once(None))
            .filter_map(move |item| match item {
                Some(op) => {
                    any = true;
                    Some(op)
                }
                None if (any || self.replay) && !synced => {
                    synced = true;
                    Some(op(Op::Sync(proto::EmptyOp {})))
                }
                None => None,
            })
    }
}

/// One piece of a change set's frames.
enum Piece {
    /// An op encoded for this watcher alone.
    Op(proto::OpItem),
    /// Frames encoded once and shared.
    Shared(Bytes, u64),
    /// A replay's frames encoded once and shared: their span of a buffer of consecutive
    /// chunks (consecutive spans leave as one slice, a small one alone is copied), and their
    /// ops.
    SharedSpan(Bytes, std::ops::Range<usize>, u64),
    /// A replay's bundles compressed once and shared: their span of a buffer of consecutive
    /// bundles (always passed by reference, consecutive spans as one slice), and their ops.
    BundleSpan(Bytes, std::ops::Range<usize>, u64),
    /// A whole change set encoded once and shared, `Sync` included, and its ops (`Sync` not
    /// counted): passed on by reference.
    Whole(Bytes, u64),
}

impl Pending {
    /// The pieces of one Service's change for this watcher: shared frames when neither
    /// version depends on its node, else ops encoded for it.
    fn service_pieces(
        &self,
        key: &ServiceKey,
        old: Option<&Arc<Entry>>,
        new: Option<&Arc<Entry>>,
    ) -> Vec<Piece> {
        let old_node = self.old_node.as_ref().unwrap_or(&self.node);
        let old_dep = old.is_some_and(|e| e.depends_on_node(&old_node.name));
        let new_dep = new.is_some_and(|e| e.depends_on_node(&self.node.name));
        if !old_dep && !new_dep {
            match (old, new) {
                (None, Some(new)) => {
                    let (frames, ops) = new.anonymous_frames();
                    return vec![Piece::Shared(frames, ops)];
                }
                (Some(old), Some(new)) => {
                    let (frames, ops) = new.change_frames_from(old);
                    return vec![Piece::Shared(frames, ops)];
                }
                _ => {}
            }
        }
        let old = old.and_then(|e| e.messages_for(old_node));
        let new = new.and_then(|e| e.messages_for(&self.node));
        service_ops(key, old.as_deref(), new.as_deref())
            .into_iter()
            .map(Piece::Op)
            .collect()
    }

    /// This change set as gRPC frames, in large chunks, produced as they are taken: exactly
    /// the bytes of [`Pending::ops`] encoded one by one, but with every Service that does not
    /// depend on the watcher's node encoded once for all watchers (a replay of an unchanged
    /// snapshot takes whole [`crate::frames::SharedChunk`]s from `cache`, each as one
    /// compressed bundle when `bundles`: the watcher asked for them, `WatchReq.AcceptZstd`; a
    /// shared batch as the batch's one encoding, by reference).
    pub fn frames<'a>(&'a self, cache: &ReplayCache, bundles: bool) -> ChangeSetFrames<'a> {
        // As `ops_head`, with the report's shared frames.
        let head = self
            .reset_op()
            .into_iter()
            .chain(self.cidrs_op())
            .map(Piece::Op)
            .chain(
                self.brain_report
                    .as_ref()
                    .map(|r| Piece::Shared(r.frames.clone(), 1)),
            )
            .chain(self.old_node_delete().map(Piece::Op))
            .chain(self.node_op().map(Piece::Op))
            .collect::<Vec<_>>()
            .into_iter();
        let services: Box<dyn Iterator<Item = Piece> + Send + 'a> = match (
            &self.batch,
            &self.base,
            self.replay && self.changes.is_empty(),
        ) {
            (Some(batch), _, _) => {
                let (frames, ops) = batch.shared_change_set();
                Box::new((ops > 0).then_some(Piece::Whole(frames, ops)).into_iter())
            }
            (None, Some(base), true) => {
                let replay = cache.replay(base);
                let node = self.node.name.clone();
                Box::new((0..replay.chunks.len()).flat_map(move |i| {
                    let mut pieces = Vec::new();
                    for run in replay.runs_for(i, &node, bundles) {
                        match run {
                            ChunkRun::Shared { buffer, span, ops } => {
                                pieces.push(Piece::SharedSpan(buffer, span, ops));
                            }
                            ChunkRun::Bundle { buffer, span, ops } => {
                                pieces.push(Piece::BundleSpan(buffer, span, ops));
                            }
                            ChunkRun::Own(e) => {
                                pieces.extend(self.service_pieces(&e.key, None, Some(e)));
                            }
                        }
                    }
                    pieces
                }))
            }
            _ => Box::new(
                self.services()
                    .flat_map(move |(key, old, new)| self.service_pieces(key, old, new)),
            ),
        };
        ChangeSetFrames {
            pieces: Box::new(head.chain(services)),
            writer: FrameWriter::default(),
            replay: self.replay,
            ops: 0,
            finished: false,
        }
    }

    /// The ops before the Services: `Reset`, the ServiceCIDR ranges, the brain's report, the
    /// node (after a rename, the old name's value deleted first).
    fn ops_head(&self) -> impl Iterator<Item = proto::OpItem> + '_ {
        let report = self.brain_report.as_ref().map(|r| r.op.clone());
        self.reset_op()
            .into_iter()
            .chain(self.cidrs_op())
            .chain(report)
            .chain(self.old_node_delete())
            .chain(self.node_op())
    }

    fn reset_op(&self) -> Option<proto::OpItem> {
        self.replay.then(|| op(Op::Reset(proto::EmptyOp {})))
    }

    fn cidrs_op(&self) -> Option<proto::OpItem> {
        self.service_cidrs.as_ref().map(|cidrs| {
            set(
                proto::Set::KpngServiceCidRsSet,
                "cluster".to_string(),
                encode_service_cidrs(cidrs),
            )
        })
    }

    /// After a rename (a `WatchReq` with another `NodeName`), the value at the old name's path:
    /// a client that keeps every value by set and path would otherwise hold two nodes.
    fn old_node_delete(&self) -> Option<proto::OpItem> {
        let old = self.old_node.as_ref()?;
        (!self.replay && old.name != self.node.name)
            .then(|| delete(proto::Set::KpngNodeSet, old.name.clone()))
    }

    fn node_op(&self) -> Option<proto::OpItem> {
        (self.replay || self.old_node.as_ref() != Some(&self.node)).then(|| {
            set(
                proto::Set::KpngNodeSet,
                self.node.name.clone(),
                encode_node(&self.node),
            )
        })
    }
}

/// One change set as chunks of gRPC frames (see [`Pending::frames`]).
pub struct ChangeSetFrames<'a> {
    pieces: Box<dyn Iterator<Item = Piece> + Send + 'a>,
    writer: FrameWriter,
    replay: bool,
    ops: u64,
    finished: bool,
}

impl ChangeSetFrames<'_> {
    /// Ops produced so far, `Sync` not counted.
    pub fn ops(&self) -> u64 {
        self.ops
    }

    /// Whether the change set ended with `Sync` (false: nothing at all changed).
    pub fn synced(&self) -> bool {
        self.finished && (self.ops > 0 || self.replay)
    }
}

impl Iterator for ChangeSetFrames<'_> {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        loop {
            if let Some(chunk) = self.writer.pop_ready() {
                return Some(chunk);
            }
            if self.finished {
                return None;
            }
            match self.pieces.next() {
                Some(Piece::Op(item)) => {
                    self.ops += 1;
                    self.writer.op(&item);
                }
                Some(Piece::Shared(frames, ops)) => {
                    self.ops += ops;
                    self.writer.shared(&frames);
                }
                Some(Piece::SharedSpan(buffer, span, ops)) => {
                    self.ops += ops;
                    self.writer.span_or_copy(&buffer, span);
                }
                Some(Piece::BundleSpan(buffer, span, ops)) => {
                    self.ops += ops;
                    self.writer.span(&buffer, span);
                }
                Some(Piece::Whole(frames, ops)) => {
                    self.ops += ops;
                    self.finished = true;
                    self.writer.by_reference(&frames);
                }
                None => {
                    self.finished = true;
                    if self.ops > 0 || self.replay {
                        self.writer.op(&op(Op::Sync(proto::EmptyOp {})));
                    }
                    self.writer.flush();
                }
            }
        }
    }
}

fn op(op: Op) -> proto::OpItem {
    proto::OpItem { op: Some(op) }
}

fn set(set: proto::Set, path: String, bytes: prost::bytes::Bytes) -> proto::OpItem {
    op(Op::Set(proto::Value {
        r#ref: Some(proto::Ref {
            set: set as i32,
            path,
        }),
        bytes,
    }))
}

fn delete(set: proto::Set, path: String) -> proto::OpItem {
    op(Op::Delete(proto::Ref {
        set: set as i32,
        path,
    }))
}

/// The ops that turn one Service's `old` messages into `new` (KPNG's paths: `ns/name` and
/// `ns/name/key`).
pub fn service_ops(
    key: &ServiceKey,
    old: Option<&ServiceMessages>,
    new: Option<&ServiceMessages>,
) -> Vec<proto::OpItem> {
    let mut ops = Vec::new();
    if old == new {
        return ops;
    }
    let path = key.to_string();
    let empty = ServiceMessages::default();
    if let Some(new) = new
        && old.is_none_or(|o| o.service != new.service)
    {
        ops.push(set(
            proto::Set::ServicesSet,
            path.clone(),
            new.service.clone(),
        ));
    }
    let old_eps = old.unwrap_or(&empty).endpoints.iter().map(|(k, v)| (k, v));
    let new_eps = new.unwrap_or(&empty).endpoints.iter().map(|(k, v)| (k, v));
    let mut deletes = Vec::new();
    for (k, before, after) in merge_sorted(old_eps, new_eps) {
        match (before, after) {
            (_, Some(after)) if before != Some(after) => ops.push(set(
                proto::Set::EndpointsSet,
                format!("{path}/{k}"),
                after.clone(),
            )),
            (Some(_), None) => {
                deletes.push(delete(proto::Set::EndpointsSet, format!("{path}/{k}")))
            }
            _ => {}
        }
    }
    ops.extend(deletes);
    if old.is_some() && new.is_none() {
        ops.push(delete(proto::Set::ServicesSet, path));
    }
    ops
}

/// Joins two iterators sorted by string key.
fn merge_sorted<'a, V: 'a>(
    a: impl Iterator<Item = (&'a String, V)>,
    b: impl Iterator<Item = (&'a String, V)>,
) -> impl Iterator<Item = (&'a String, Option<V>, Option<V>)> {
    let mut a = a.peekable();
    let mut b = b.peekable();
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (None, None) => None,
        (Some(_), None) => a.next().map(|(k, x)| (k, Some(x), None)),
        (None, Some(_)) => b.next().map(|(k, y)| (k, None, Some(y))),
        (Some((ka, _)), Some((kb, _))) => match ka.cmp(kb) {
            std::cmp::Ordering::Less => a.next().map(|(k, x)| (k, Some(x), None)),
            std::cmp::Ordering::Greater => b.next().map(|(k, y)| (k, None, Some(y))),
            std::cmp::Ordering::Equal => {
                let (k, x) = a.next()?;
                let (_, y) = b.next()?;
                Some((k, Some(x), Some(y)))
            }
        },
    })
}

/// Joins two key-sorted iterators.
fn merge_by_key<'a, A: 'a, B: 'a>(
    a: impl Iterator<Item = (&'a ServiceKey, A)>,
    b: impl Iterator<Item = (&'a ServiceKey, B)>,
) -> impl Iterator<Item = (&'a ServiceKey, Option<A>, Option<B>)> {
    let mut a = a.peekable();
    let mut b = b.peekable();
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (None, None) => None,
        (Some(_), None) => a.next().map(|(k, x)| (k, Some(x), None)),
        (None, Some(_)) => b.next().map(|(k, y)| (k, None, Some(y))),
        (Some((ka, _)), Some((kb, _))) => match ka.cmp(kb) {
            std::cmp::Ordering::Less => a.next().map(|(k, x)| (k, Some(x), None)),
            std::cmp::Ordering::Greater => b.next().map(|(k, y)| (k, None, Some(y))),
            std::cmp::Ordering::Equal => {
                let (k, x) = a.next()?;
                let (_, y) = b.next()?;
                Some((k, Some(x), Some(y)))
            }
        },
    })
}

/// Wakes every watcher: something was queued for all of them.
fn wake_all(state: &State) {
    let now = SystemTime::now();
    for w in state.watchers.values() {
        w.slot.queued(now);
        w.slot.wake();
    }
}

/// A connection's address in words, `unknown` when the server could not tell.
fn peer_or_unknown(peer: &Option<String>) -> &str {
    peer.as_deref().unwrap_or("unknown")
}

/// How long two connections may claim one node name before the brain warns: the brain's
/// keepalive (interval and timeout) closes the half-open connection of a node that reconnected
/// within this time.
const CLAIM_GRACE: Duration =
    crate::server::KEEPALIVE_INTERVAL.saturating_add(crate::server::KEEPALIVE_TIMEOUT);

/// One watcher's place in the hub.
#[derive(Debug)]
pub struct Slot {
    pending: Mutex<Pending>,
    /// The task to wake when something is queued: the stream's response body, polled by the
    /// connection (no task of its own). Set only while `pending` is locked and found empty,
    /// so a change recorded in between is never missed.
    waker: Mutex<Option<Waker>>,
    stats: Mutex<SlotStats>,
}

/// What `kpng status` on a brain says of one watcher.
#[derive(Debug, Clone, Copy)]
struct SlotStats {
    connected_at: SystemTime,
    change_sets_sent: u64,
    last_sent_at: Option<SystemTime>,
    /// When the oldest change not yet sent to it arrived.
    pending_since: Option<SystemTime>,
    /// While it is warned about as behind ([`Hub::refresh_node_gauges`]): since when it was
    /// behind, for the INFO line when it caught up.
    behind_since: Option<SystemTime>,
}

/// One connected node as the brain sees it: for `kpng status` on a brain.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatcherStatus {
    /// The node name it watches for.
    pub node: String,
    /// Where its connection comes from: `IP:port` over TCP, `unix, pid N` over a Unix socket
    /// (absent: not known). Two kpngs that claim the same node name (a copied DaemonSet, a
    /// wrong `--hostname-override`) are told apart only by this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// When it connected (RFC 3339).
    pub connected_at: String,
    /// Change sets it took: a client that asks for each acknowledges the previous with its
    /// request; one that asked once (`WatchReq.continuous`) takes them as HTTP/2 flow control
    /// lets it.
    pub change_sets_sent: u64,
    /// When it last took one (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sent_at: Option<String>,
    /// Services changed since its last change set, waiting for its next request (or, asked
    /// once, for room in its stream's flow-control window).
    pub pending_service_changes: usize,
    /// How long the oldest of those has waited: the node's lag behind the brain.
    pub lag_seconds: f64,
    /// The kpng version its Watch request named (`kpng-version` metadata; absent: KPNG's
    /// client, a kpng before 2026-12-07, or a backend of one's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn stats(&self) -> MutexGuard<'_, SlotStats> {
        self.stats
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Something was queued for this watcher now.
    fn queued(&self, now: SystemTime) {
        self.stats().pending_since.get_or_insert(now);
    }

    /// Services changed since the watcher's last change set.
    fn pending_changes(&self) -> usize {
        let pending = self.lock();
        pending.changes.len() + pending.batch.as_ref().map_or(0, |b| b.changes().len())
    }

    /// How long the oldest change not yet sent to this watcher has waited at `now` (zero when
    /// it has everything).
    fn lag_at(&self, now: SystemTime) -> Duration {
        self.stats()
            .pending_since
            .and_then(|since| now.duration_since(since).ok())
            .unwrap_or_default()
    }

    /// How far behind the watcher is now: how long its oldest unsent change has waited, and
    /// how many Services changed since its last change set. What the server says when it
    /// loses a watcher that was behind: a node that stopped reading its stream, whose
    /// connection the keepalive then closed, is named as such rather than as a connection
    /// that just closed.
    pub fn behind(&self) -> (Duration, usize) {
        (self.lag_at(SystemTime::now()), self.pending_changes())
    }

    /// Wakes whoever waits in [`Slot::poll_next`].
    fn wake(&self) {
        let waker = self
            .waker
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Takes what is to be sent, if anything (the watcher now holds the newest versions and
    /// node state); else `cx` is woken when something is queued.
    pub fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Pending> {
        let mut pending = self.lock();
        if !pending.is_ready() {
            let mut waker = self
                .waker
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            match waker.as_mut() {
                Some(w) => w.clone_from(cx.waker()),
                None => *waker = Some(cx.waker().clone()),
            }
            return Poll::Pending;
        }
        {
            let mut stats = self.stats();
            stats.change_sets_sent += 1;
            stats.last_sent_at = Some(SystemTime::now());
            stats.pending_since = None;
        }
        let mut taken = take_pending(&mut pending);
        drop(pending);
        taken.settle();
        Poll::Ready(taken)
    }

    /// Waits until something is to be sent, then takes it (see [`Slot::poll_next`]): the
    /// protocol tests' way in; the server polls.
    #[cfg(test)]
    pub(crate) async fn next(&self) -> Pending {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }
}

/// Takes what `pending` holds, leaving it empty with the node state the watcher now holds:
/// field by field, so nothing is allocated and the node state is shared, not copied.
fn take_pending(pending: &mut Pending) -> Pending {
    Pending {
        replay: std::mem::take(&mut pending.replay),
        base: pending.base.take(),
        changes: std::mem::take(&mut pending.changes),
        batch: pending.batch.take(),
        old_node: pending.old_node.replace(pending.node.clone()),
        node: pending.node.clone(),
        service_cidrs: pending.service_cidrs.take(),
        brain_report: pending.brain_report.take(),
        refused: pending.refused.take(),
    }
}

#[derive(Debug)]
struct Watcher {
    node_name: String,
    /// Where its connection comes from (see [`WatcherStatus::peer`]).
    peer: Option<String>,
    /// Its kpng version (see [`WatcherStatus::version`]).
    version: Option<String>,
    slot: Arc<Slot>,
}

/// A node name that more than one connected watcher asks for: two kpngs program the same
/// node's view (a copied DaemonSet, a wrong `--hostname-override`), so one of them programs a
/// host with another node's local endpoints and health checks. The brain's `kpng status` names
/// it as a problem with every connection's address.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DuplicateNode {
    /// The node name claimed more than once.
    pub node: String,
    /// The address of each connection that claims it (`unknown` when not known), sorted.
    pub peers: Vec<String>,
}

/// What applying events changed for the watchers, recorded and woken once at the end
/// ([`Hub::apply_all`]).
#[derive(Default)]
struct Applied {
    /// Each Service changed, once: its version before the first event, after the last.
    changes: BTreeMap<ServiceKey, BatchChange>,
    /// Every watcher is concerned.
    touched_all: bool,
    /// These watchers are concerned.
    touched: BTreeSet<u64>,
    /// The brain's report changed (every watcher is sent it).
    report_changed: bool,
}

impl Applied {
    /// Takes note that Service `key` went from `old` to `new`.
    fn record(&mut self, key: &ServiceKey, old: Option<Arc<Entry>>, new: Option<Arc<Entry>>) {
        match self.changes.entry(key.clone()) {
            std::collections::btree_map::Entry::Occupied(mut seen) => seen.get_mut().new = new,
            std::collections::btree_map::Entry::Vacant(slot) => {
                slot.insert(BatchChange {
                    key: key.clone(),
                    old,
                    new,
                });
            }
        }
        // Created and gone again within the events: nothing to tell.
        if self
            .changes
            .get(key)
            .is_some_and(|c| c.old.is_none() && c.new.is_none())
        {
            self.changes.remove(key);
        }
    }
}

#[derive(Debug, Default)]
struct State {
    cluster: ClusterModel,
    entries: Arc<Entries>,
    service_cidrs: Arc<Vec<IpNet>>,
    listed: BTreeSet<Kind>,
    synced: bool,
    watchers: HashMap<u64, Watcher>,
    next_id: u64,
    /// The brain's input, when its report goes to the nodes ([`Hub::reporting`]).
    input: Option<InputHealth>,
    /// The newest report (`None` before the first, or without [`Hub::reporting`]).
    report: Option<Arc<SharedReport>>,
    /// How many objects the model rejected when the report was made: a fixed or deleted
    /// object changes the count without an error.
    report_rejected: usize,
    /// The model's [`ClusterModel::dropped_changes`] when the report was made.
    report_dropped: u64,
    /// Every Node name the cluster has had since the brain started, with the zone label its
    /// Node had last: a watcher asking for one that is gone now asks for a deleted Node, not a
    /// typo, and its endpoints are still chosen by that zone (`State::node`), as the node's
    /// own `NodeMemory` keeps it and upstream's `NodeTopologyConfig` ignores a Node's deletion.
    nodes_seen: std::collections::HashMap<String, Option<String>>,
    /// The node names refused lately as not the cluster's (the `unknown_node` module).
    refused_names: unknown_node::RefusedNames,
    /// Node names whose last watcher went away, with when and how long it had been
    /// connected: the brain's status says since when a Node is not connected. One entry per
    /// name a watcher had (removed when one watches it again); only names of the cluster's
    /// Nodes are shown.
    disconnected: HashMap<String, Left>,
}

/// When the last watcher of a node name went away ([`State::disconnected`]).
#[derive(Debug, Clone, Copy)]
struct Left {
    at: SystemTime,
    connected_for: Duration,
}

/// One of the cluster's Nodes whose kpng was connected to this brain and went away: when,
/// and after how long. `kpng status` on the brain says "disconnected since …" with it, so a
/// node that flapped a minute ago is told from one gone all day without the logs.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DisconnectedNode {
    /// The Node's name.
    pub node: String,
    /// When its last connection to this brain ended (RFC 3339).
    pub since: String,
    /// The same, as a Unix time (what the status compares with the clock).
    pub since_unix: i64,
    /// How long that connection had lasted, in seconds.
    pub connected_for_seconds: u64,
}

impl State {
    /// Applies one event to the cluster, collecting in `applied` what it changed for the
    /// watchers ([`State::finish`] records and wakes).
    fn apply_one(&mut self, event: Event, applied: &mut Applied) -> ClusterOutcome {
        let out = self.cluster.apply(event);
        self.listed.extend(out.listed.iter().copied());
        // The rejections changed: an error, or one fewer (fixed, deleted, relisted without).
        // Or the values dropped from objects in use.
        if (!out.errors.is_empty()
            || self.cluster.rejected().len() != self.report_rejected
            || self.cluster.dropped_changes() != self.report_dropped)
            && self.refresh_report()
        {
            applied.report_changed = true;
        }
        for key in &out.services {
            let new = self
                .cluster
                .source(key)
                .map(|source| Arc::new(Entry::new(key.clone(), source.clone())));
            let entries = Arc::make_mut(&mut self.entries);
            let old = match &new {
                Some(entry) => entries.insert(key.clone(), entry.clone()),
                None => entries.remove(key),
            };
            if self.synced {
                applied.record(key, old, new);
            }
        }
        if out.service_cidrs_changed {
            let cidrs = self.cluster.service_cidrs();
            if cidrs != *self.service_cidrs {
                self.service_cidrs = Arc::new(cidrs);
                if self.synced {
                    for w in self.watchers.values() {
                        w.slot.lock().service_cidrs = Some(self.service_cidrs.clone());
                    }
                    applied.touched_all = true;
                }
            }
        }
        if !out.nodes.is_empty() {
            // A node's new zone makes its watchers start again from the entries as they are
            // now: the changes before it go in first, as they came.
            self.record_changes(applied);
        }
        for name in &out.nodes {
            if let Some(info) = self.cluster.node(name)
                && self
                    .nodes_seen
                    .insert(name.clone(), info.zone.clone())
                    .is_none()
            {
                self.refused_names.forget(name);
            }
            let node = Arc::new(self.node(name));
            for (id, w) in self.watchers.iter().filter(|(_, w)| &w.node_name == name) {
                let mut pending = w.slot.lock();
                if self.synced && pending.node.zone != node.zone && pending.base.is_none() {
                    // Zone hints may select other endpoints everywhere.
                    pending.base = Some(self.entries.clone());
                }
                pending.node = node.clone();
                applied.touched.insert(*id);
            }
        }
        if !self.synced && REQUIRED_KINDS.iter().all(|k| self.listed.contains(k)) {
            self.synced = true;
            // The replay starts from the entries as they are: nothing before it is sent apart.
            applied.changes.clear();
            if self.cluster.node_names().next().is_none() {
                tracing::info!(
                    "the source has no Node objects: nodes are served without checking that \
                     they belong to this cluster"
                );
            }
            let names: Vec<(u64, String)> = self
                .watchers
                .iter()
                .map(|(id, w)| (*id, w.node_name.clone()))
                .collect();
            for (id, name) in names {
                if let Some(why) = self.refusal(&name)
                    && let Some(w) = self.watchers.get(&id)
                {
                    w.slot.lock().refused = Some(why);
                }
            }
            for (id, w) in &self.watchers {
                let mut pending = w.slot.lock();
                pending.replay = true;
                pending.base = Some(self.entries.clone());
                pending.service_cidrs = self.replay_cidrs();
                pending.brain_report = self.replay_report();
                pending.changes.clear();
                pending.batch = None;
                applied.touched.insert(*id);
            }
        }
        out
    }

    /// Records the Service changes collected in `applied` for every watcher, as one batch.
    fn record_changes(&mut self, applied: &mut Applied) {
        if applied.changes.is_empty() {
            return;
        }
        let changes = std::mem::take(&mut applied.changes).into_values().collect();
        let batch = Arc::new(Batch::new(changes));
        if !batch.is_empty() {
            for w in self.watchers.values() {
                w.slot.lock().record_batch(&batch);
            }
            applied.touched_all = true;
        }
    }

    /// Records what `applied` collected and wakes the watchers it concerns.
    fn finish(&mut self, mut applied: Applied) {
        self.record_changes(&mut applied);
        let now = SystemTime::now();
        let wake = |w: &Watcher| {
            w.slot.queued(now);
            w.slot.wake();
        };
        if applied.touched_all || applied.report_changed {
            self.watchers.values().for_each(wake);
        } else {
            applied
                .touched
                .iter()
                .filter_map(|id| self.watchers.get(id))
                .for_each(wake);
        }
    }

    /// Warns when watcher `id` is the second to ask for its node name and both connections are
    /// still open [`CLAIM_GRACE`] later: the start of a duplicate claim, logged once (not again
    /// for a third, nor while it lasts; again only after it ended and began anew). Not at once:
    /// a node that reconnects over a half-open connection (a brain that hung for a minute, a
    /// network that dropped) is the second claim until the brain's keepalive closes the old
    /// one; that is said at INFO. `kpng status` on the brain shows a duplicate for as long as
    /// it lasts ([`Hub::duplicate_nodes`]). `hub` is this state's hub, looked at again then.
    fn warn_if_claimed_twice(&self, id: u64, hub: Weak<Hub>) {
        let Some(me) = self.watchers.get(&id) else {
            return;
        };
        let others: Vec<(u64, &Watcher)> = self
            .watchers
            .iter()
            .filter(|(other, w)| **other != id && w.node_name == me.node_name)
            .map(|(other, w)| (*other, w))
            .collect();
        let [(other_id, other)] = others[..] else {
            return;
        };
        let node = me.node_name.clone();
        let (old_peer, new_peer) = (
            peer_or_unknown(&other.peer).to_string(),
            peer_or_unknown(&me.peer).to_string(),
        );
        let warn = move || {
            tracing::warn!(
                node = %node,
                "two kpngs claim node {node:?}: connections from {old_peer} and {new_peer} (a \
                 copied DaemonSet or a wrong --hostname-override/--node-name?); each gets that \
                 node's view, so one of them programs its host with another node's local \
                 endpoints",
            );
        };
        // Without a runtime (a synchronous caller) nothing can wait: warn at once.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            warn();
            return;
        };
        tracing::info!(
            node = %me.node_name,
            "node {:?} reconnected from {}; replacing the older connection from {} when it \
             closes (if both are still open in {} s, two kpngs claim it)",
            me.node_name,
            peer_or_unknown(&me.peer),
            peer_or_unknown(&other.peer),
            CLAIM_GRACE.as_secs(),
        );
        let name = me.node_name.clone();
        runtime.spawn(async move {
            tokio::time::sleep(CLAIM_GRACE).await;
            let Some(hub) = hub.upgrade() else {
                return;
            };
            let both = {
                let state = hub.lock();
                [id, other_id]
                    .iter()
                    .all(|i| state.watchers.get(i).is_some_and(|w| w.node_name == name))
            };
            if both {
                warn();
            }
        });
    }

    /// The ServiceCIDR ranges a replay sends: none when there are none (`Reset` already means
    /// "no ranges") or before the cluster is listed.
    fn replay_cidrs(&self) -> Option<Arc<Vec<IpNet>>> {
        (self.synced && !self.service_cidrs.is_empty()).then(|| self.service_cidrs.clone())
    }

    /// Node `name` as its endpoints are chosen: the Node as it is now, with the last zone
    /// while it is deleted (topology hints keep applying until it is back, as on the node).
    fn node(&self, name: &str) -> NodeState {
        let mut node = node_state(name, self.cluster.node(name).map(|n| n.as_ref()), &[]);
        if !node.known {
            node.zone = self.nodes_seen.get(name).cloned().flatten();
        }
        node
    }

    /// Why a watcher for node `name` is not served, when it is not (the `unknown_node` module): the
    /// cluster is listed, has Nodes, and has never had one of that name since the brain
    /// started. A refusal is recorded for the status, and warned about once per name.
    fn refusal(&mut self, name: &str) -> Option<String> {
        if !self.synced || self.cluster.node(name).is_some() || self.nodes_seen.contains_key(name) {
            return None;
        }
        let nodes = self.cluster.node_names().count();
        if nodes == 0 {
            return None;
        }
        let why = unknown_node::refusal(name, nodes);
        if self.refused_names.record(name, std::time::Instant::now()) {
            tracing::warn!(
                node = %name,
                "not serving node {name:?}: {why} (refused again at every retry: counted in \
                 kpng_api_refused_total{{reason=\"unknown_node\"}}, logged again only after it \
                 stopped for {:?})",
                unknown_node::SHOWN_FOR
            );
        }
        Some(why)
    }

    /// The node names watchers ask for that no Node has now, sorted, split into those the
    /// cluster had before (deleted Nodes) and those it never had (once it is listed).
    fn missing_nodes(&self) -> (Vec<String>, Vec<String>) {
        if !self.synced {
            return (Vec::new(), Vec::new());
        }
        let mut names: Vec<&str> = self
            .watchers
            .values()
            .map(|w| w.node_name.as_str())
            .chain(self.refused_names.recent(std::time::Instant::now()))
            .filter(|n| self.cluster.node(n).is_none())
            .collect();
        names.sort_unstable();
        names.dedup();
        let (deleted, unknown): (Vec<&str>, Vec<&str>) = names
            .into_iter()
            .partition(|n| self.nodes_seen.contains_key(*n));
        let owned = |v: Vec<&str>| v.into_iter().map(str::to_string).collect();
        (owned(deleted), owned(unknown))
    }

    /// The report a replay sends: none before the cluster is listed (nothing is sent then).
    fn replay_report(&self) -> Option<Arc<SharedReport>> {
        self.report.clone().filter(|_| self.synced)
    }

    /// Makes the report again from the input's record and the model's rejections; when it
    /// changed, records it for every watcher (once the cluster is listed) and says so.
    fn refresh_report(&mut self) -> bool {
        let Some(input) = &self.input else {
            return false;
        };
        let value = brain_report(
            &input.state(),
            self.cluster.rejected(),
            self.cluster.dropped(),
        );
        self.report_rejected = self.cluster.rejected().len();
        self.report_dropped = self.cluster.dropped_changes();
        if self.report.as_ref().is_some_and(|r| r.value == value) {
            return false;
        }
        let report = Arc::new(SharedReport::new(value));
        self.report = Some(report.clone());
        if self.synced {
            for w in self.watchers.values() {
                w.slot.lock().brain_report = Some(report.clone());
            }
        }
        self.synced
    }
}

/// One node's view as the brain computes it ([`Hub::node_view`]).
#[derive(Debug, Clone)]
pub struct NodeView {
    /// The node as the brain sees it (its Node object; not the node's `--node-ip`, nor what
    /// it kept of a deleted Node's addresses).
    pub node: NodeState,
    /// Whether a kpng watching as that node is connected now.
    pub connected: bool,
    /// The selected Service ports, each with every endpoint explained, in key order.
    pub ports: Vec<(ServicePort, Vec<kpng_model::inspect::EndpointStatus>)>,
    /// The selected Services that give the node no port, with why.
    pub not_programmed: Vec<(ServiceKey, String)>,
}

/// One Service as the brain holds it, whatever the node ([`Hub::service_summaries`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSummary {
    /// `namespace/name`.
    pub service: String,
    /// Its ports (per port and family) in a node's view; 0 when it gives none.
    pub ports: usize,
    /// Why it gives no node a port (headless, another proxy's, no Service object yet, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_programmed: Option<String>,
    /// The nodes its endpoints run on, sorted (their views differ from the others'); `None`
    /// when topology hints make every node's view its own.
    #[serde(default)]
    pub endpoint_nodes: Option<Vec<String>>,
}

/// The brain: cluster state plus every watcher's pending change set.
#[derive(Debug)]
pub struct Hub {
    state: Mutex<State>,
    metrics: ApiMetrics,
    /// This brain's build, as sent to its nodes ([`crate::version::build`]).
    version: String,
    /// The newest snapshot's replay, encoded once for every watcher that replays it.
    replay_cache: ReplayCache,
    /// How long a watcher may be behind before it is warned about ([`DEFAULT_LAG_WARNING`]).
    lag_warning: Duration,
}

/// How long a node may be behind (its oldest unsent change waiting) before the brain warns:
/// longer than a node takes to decode a large replay, shorter than the keepalive that drops a
/// node that stopped reading (its interval and timeout, a minute).
pub const DEFAULT_LAG_WARNING: Duration = Duration::from_secs(10);

/// The most nodes named per look for falling behind (and, apart, for catching up); the rest
/// are one line with their number.
const LAG_LINES_PER_CHECK: usize = 5;

/// A registered watcher; unregisters when dropped.
#[derive(Debug)]
pub struct Registration {
    hub: Arc<Hub>,
    id: u64,
    /// Where its change sets appear.
    pub slot: Arc<Slot>,
    node_name: String,
}

impl Registration {
    /// The node name the watcher asked for.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Records the kpng version the watcher's client sent (shown in the brain's status).
    pub fn set_version(&self, version: Option<String>) {
        if let Some(w) = self.hub.lock().watchers.get_mut(&self.id) {
            w.version = version;
        }
    }

    /// The watcher now watches as another node: everything is re-evaluated for it.
    pub fn rename(&mut self, node_name: &str) {
        let mut state = self.hub.lock();
        let node = Arc::new(state.node(node_name));
        let entries = state.entries.clone();
        let synced = state.synced;
        let refused = state.refusal(node_name);
        state.disconnected.remove(node_name);
        if let Some(w) = state.watchers.get_mut(&self.id) {
            w.node_name = node_name.to_string();
            let mut pending = w.slot.lock();
            pending.refused = refused;
            pending.node = node;
            if synced {
                pending.base = Some(entries);
            }
        }
        state.warn_if_claimed_twice(self.id, Arc::downgrade(&self.hub));
        self.node_name = node_name.to_string();
        self.slot.wake();
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut state = self.hub.lock();
        if let Some(gone) = state.watchers.remove(&self.id) {
            self.hub.metrics.clients_connected.dec();
            let name = gone.node_name;
            // Only the cluster's Nodes: names no Node ever had (a typo retried) are not kept.
            if state.nodes_seen.contains_key(&name)
                && !state.watchers.values().any(|w| w.node_name == name)
            {
                let now = SystemTime::now();
                let connected_for = now
                    .duration_since(self.slot.stats().connected_at)
                    .unwrap_or_default();
                state.disconnected.insert(
                    name,
                    Left {
                        at: now,
                        connected_for,
                    },
                );
            }
        }
    }
}

impl Hub {
    /// An empty brain.
    pub fn new(cluster: ClusterModel, metrics: ApiMetrics) -> Hub {
        Hub {
            state: Mutex::new(State {
                cluster,
                ..State::default()
            }),
            metrics,
            version: crate::version::VERSION.to_string(),
            replay_cache: ReplayCache::default(),
            lag_warning: DEFAULT_LAG_WARNING,
        }
    }

    /// How long a node may be behind before it is warned about ([`Hub::with_lag_warning`]).
    pub fn lag_warning(&self) -> Duration {
        self.lag_warning
    }

    /// Warns about a node once it has been behind for `after` ([`DEFAULT_LAG_WARNING`]
    /// unless set): tests set a short one.
    pub fn with_lag_warning(mut self, after: Duration) -> Hub {
        self.lag_warning = after;
        self
    }

    /// Names this brain's build (`0.1.0+COMMIT`, [`crate::version::build`]) to its nodes and
    /// in its status, instead of the bare version: the binary knows its git commit, this crate
    /// does not, and without it two builds of one release looked the same mid-rollout.
    pub fn with_version(mut self, version: String) -> Hub {
        self.version = version;
        self
    }

    /// This brain's build, as its nodes are told it.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Sends the brain's report on its own input to every node: the objects it rejects and
    /// `input`'s problems (its source's), which a node shows in its `kpng status` since it
    /// never sees the objects. Sent after each `Reset` and when it changed: on an event that
    /// changed the rejections, and when [`Hub::refresh_report`] finds the input changed.
    pub fn reporting(self, input: InputHealth) -> Hub {
        {
            let mut state = self.lock();
            state.input = Some(input);
            state.refresh_report();
        }
        self
    }

    /// Looks at the input's record again (its problems change without an event: an API
    /// server out of reach) and sends the report to every watcher if it changed. The brain
    /// calls it every second; it costs a few small copies when nothing changed.
    pub fn refresh_report(&self) {
        let mut state = self.lock();
        if state.refresh_report() {
            wake_all(&state);
        }
    }

    /// Sets the gauges of what the brain's `kpng status` calls problems with its nodes (Nodes
    /// without a kpng, names claimed twice, names no Node has), for an alert, and the Nodes
    /// it knows and those with a kpng connected to it: with several brains behind one
    /// Service, only these add up across brains (docs/observability.md). The brain calls it
    /// every second with [`Hub::refresh_report`]: it walks the watchers and the Nodes.
    pub fn refresh_node_gauges(&self) {
        let as_gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.metrics
            .nodes_not_connected
            .set(as_gauge(self.not_connected().len()));
        let (nodes, connected) = self.connected_nodes();
        self.metrics.nodes.set(as_gauge(nodes));
        self.metrics.set_connected_nodes(connected);
        self.metrics.set_node_lags(&self.check_lags());
        self.metrics.set_node_versions(self.node_versions());
        self.metrics
            .duplicate_node_names
            .set(as_gauge(self.duplicate_nodes().len()));
        let (deleted, unknown) = self.lock().missing_nodes();
        self.metrics
            .unknown_node_names
            .set(as_gauge(deleted.len() + unknown.len()));
    }

    /// Each watched node name's largest lag, in seconds; and a watcher behind for longer
    /// than [`Hub::with_lag_warning`] is warned about once, with an INFO line when it caught
    /// up (until 2026-12-07 a node that stopped reading its stream showed only in the brain's
    /// `kpng status`, and the brain said nothing until the keepalive dropped it).
    fn check_lags(&self) -> BTreeMap<String, f64> {
        let state = self.lock();
        let now = SystemTime::now();
        let mut lags: BTreeMap<String, f64> = BTreeMap::new();
        // A stall of the brain itself puts every node behind at once: the first few are
        // named, the rest summed up in one line (5,000 nodes were 5,000 lines, then as many
        // again as they caught up).
        let (mut fell_behind, mut caught_up) = (0usize, 0usize);
        for w in state.watchers.values() {
            if w.slot.lock().refused.is_some() {
                // Refused (a name no Node has): its stream ends, it is not behind.
                continue;
            }
            let lag = w.slot.lag_at(now);
            let seconds = lags.entry(w.node_name.clone()).or_default();
            *seconds = seconds.max(lag.as_secs_f64());
            let mut stats = w.slot.stats();
            match stats.behind_since {
                None if lag >= self.lag_warning && !self.lag_warning.is_zero() => {
                    stats.behind_since = stats.pending_since;
                    drop(stats);
                    fell_behind += 1;
                    if fell_behind > LAG_LINES_PER_CHECK {
                        continue;
                    }
                    tracing::warn!(
                        node = %w.node_name,
                        peer = %peer_or_unknown(&w.peer),
                        "node {:?} is falling behind: {} Service changes pending for {} (it \
                         does not read its stream: stopped, overloaded, or a slow network); \
                         the brain keeps coalescing its changes, and ends its connection if \
                         its keepalive pings go unanswered for {}",
                        w.node_name,
                        w.slot.pending_changes(),
                        humantime::format_duration(Duration::from_secs(lag.as_secs())),
                        humantime::format_duration(crate::server::KEEPALIVE_TIMEOUT),
                    );
                }
                Some(since) if lag < self.lag_warning => {
                    stats.behind_since = None;
                    caught_up += 1;
                    if caught_up > LAG_LINES_PER_CHECK {
                        continue;
                    }
                    let behind = now.duration_since(since).unwrap_or_default();
                    tracing::info!(
                        node = %w.node_name,
                        peer = %peer_or_unknown(&w.peer),
                        "node {:?} caught up: it took its pending changes after about {} behind",
                        w.node_name,
                        humantime::format_duration(Duration::from_secs(behind.as_secs())),
                    );
                }
                _ => {}
            }
        }
        if let Some(more) = fell_behind
            .checked_sub(LAG_LINES_PER_CHECK)
            .filter(|&n| n > 0)
        {
            tracing::warn!(
                "{more} more nodes are falling behind (behind for {} or more; `kpng status` \
                 lists them, kpng_api_node_lag_seconds has each)",
                humantime::format_duration(self.lag_warning)
            );
        }
        if let Some(more) = caught_up
            .checked_sub(LAG_LINES_PER_CHECK)
            .filter(|&n| n > 0)
        {
            tracing::info!("{more} more nodes caught up");
        }
        lags
    }

    /// The cluster's Nodes not connected now whose kpng was connected to this brain before,
    /// sorted: when it went away and after how long ([`DisconnectedNode`]). A Node never
    /// connected since the brain started is not among them.
    pub fn disconnected_nodes(&self) -> Vec<DisconnectedNode> {
        let state = self.lock();
        let mut out: Vec<DisconnectedNode> = state
            .disconnected
            .iter()
            // A name is taken out of `disconnected` when it registers again.
            .filter(|(name, _)| state.cluster.node(name).is_some())
            .map(|(name, left)| DisconnectedNode {
                node: name.clone(),
                since: humantime::format_rfc3339_millis(left.at).to_string(),
                since_unix: left
                    .at
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX)),
                connected_for_seconds: left.connected_for.as_secs(),
            })
            .collect();
        out.sort_by(|a, b| a.node.cmp(&b.node));
        out
    }

    /// Where replays of the newest snapshot are encoded once for all watchers.
    pub fn replay_cache(&self) -> &ReplayCache {
        &self.replay_cache
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether Services, EndpointSlices and Nodes have all been listed (watchers are served).
    pub fn synced(&self) -> bool {
        self.lock().synced
    }

    /// The brain's metrics.
    pub fn metrics(&self) -> &ApiMetrics {
        &self.metrics
    }

    /// Adds a watcher for `node_name` whose connection's address is not known (see
    /// [`Hub::register_from`]).
    pub fn register(self: &Arc<Hub>, node_name: &str) -> Registration {
        self.register_from(node_name, None)
    }

    /// Adds a watcher for `node_name`, connected from `peer` (`IP:port`, `unix, pid N`: shown
    /// in the brain's status, where it tells apart two kpngs that claim the same node). Its
    /// first change set is a replay of everything, ready as soon as the cluster has been
    /// listed.
    pub fn register_from(self: &Arc<Hub>, node_name: &str, peer: Option<String>) -> Registration {
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        let refused = state.refusal(node_name);
        let slot = Arc::new(Slot {
            pending: Mutex::new(Pending {
                replay: state.synced,
                base: state.synced.then(|| state.entries.clone()),
                service_cidrs: state.replay_cidrs(),
                brain_report: state.replay_report(),
                node: Arc::new(state.node(node_name)),
                refused,
                ..Pending::default()
            }),
            waker: Mutex::new(None),
            stats: Mutex::new(SlotStats {
                connected_at: SystemTime::now(),
                change_sets_sent: 0,
                last_sent_at: None,
                pending_since: None,
                behind_since: None,
            }),
        });
        state.disconnected.remove(node_name);
        state.watchers.insert(
            id,
            Watcher {
                node_name: node_name.to_string(),
                peer,
                version: None,
                slot: slot.clone(),
            },
        );
        state.warn_if_claimed_twice(id, Arc::downgrade(self));
        self.metrics.clients_connected.inc();
        Registration {
            hub: self.clone(),
            id,
            slot,
            node_name: node_name.to_string(),
        }
    }

    /// Why a Watch for node `node_name` is refused, when it is: the brain's cluster has Nodes
    /// and never had one of that name (a node of another cluster, or a Node not registered
    /// yet: see the `unknown_node` module). `None` too before the cluster is listed: a watcher
    /// registered then is refused when it is ([`Pending::refused`]).
    pub fn refusal(&self, node_name: &str) -> Option<String> {
        self.lock().refusal(node_name)
    }

    /// Applies one event to the cluster and records what it changed for every watcher.
    pub fn apply(&self, event: Event) -> ClusterOutcome {
        let mut state = self.lock();
        let mut applied = Applied::default();
        let out = state.apply_one(event, &mut applied);
        state.finish(applied);
        self.count_rejections(&state, std::slice::from_ref(&out));
        out
    }

    /// Counts the objects `outcomes` refused and sets the gauge of those refused now, as a
    /// non-split kpng does (`kpng_object_errors_total`, `kpng_rejected_objects`), and the
    /// values dropped from objects in use (`kpng_dropped_values`).
    fn count_rejections(&self, state: &State, outcomes: &[ClusterOutcome]) {
        for e in outcomes.iter().flat_map(|out| &out.errors) {
            self.metrics
                .object_errors
                .get_or_create(&crate::metrics::KindLabel {
                    kind: e.error.object.kind.as_str().into(),
                })
                .inc();
        }
        self.metrics
            .rejected_objects
            .set(i64::try_from(state.cluster.rejected().len()).unwrap_or(i64::MAX));
        self.metrics
            .dropped_values
            .set(i64::try_from(state.cluster.dropped().count()).unwrap_or(i64::MAX));
    }

    /// Applies `events` as one change: what they change together reaches each watcher in one
    /// change set (a file holding a Service and its EndpointSlice never shows a node the
    /// Service without its endpoints, a moment of REJECT), encoded once for all the nodes
    /// that share a view. Returns each event's outcome, in order.
    pub fn apply_all(&self, events: Vec<Event>) -> Vec<ClusterOutcome> {
        let mut state = self.lock();
        let mut applied = Applied::default();
        let outcomes: Vec<ClusterOutcome> = events
            .into_iter()
            .map(|event| state.apply_one(event, &mut applied))
            .collect();
        state.finish(applied);
        self.count_rejections(&state, &outcomes);
        outcomes
    }

    /// Every connected watcher, by node name.
    pub fn watchers(&self) -> Vec<WatcherStatus> {
        let state = self.lock();
        let now = SystemTime::now();
        let rfc3339 = |t: SystemTime| humantime::format_rfc3339_millis(t).to_string();
        let mut out: Vec<WatcherStatus> = state
            .watchers
            .values()
            .map(|w| {
                let stats = *w.slot.stats();
                let pending = {
                    let pending = w.slot.lock();
                    pending.changes.len() + pending.batch.as_ref().map_or(0, |b| b.changes().len())
                };
                WatcherStatus {
                    node: w.node_name.clone(),
                    peer: w.peer.clone(),
                    connected_at: rfc3339(stats.connected_at),
                    change_sets_sent: stats.change_sets_sent,
                    last_sent_at: stats.last_sent_at.map(rfc3339),
                    pending_service_changes: pending,
                    lag_seconds: stats
                        .pending_since
                        .and_then(|since| now.duration_since(since).ok())
                        .map_or(0.0, |d| d.as_secs_f64()),
                    version: w.version.clone(),
                }
            })
            .collect();
        out.sort_by(|a, b| a.node.cmp(&b.node).then(a.peer.cmp(&b.peer)));
        out
    }

    /// How many connected watchers run each build (`unknown`: a client that sent none, KPNG's
    /// or a kpng before 2026-12-07): a rollout's progress, as
    /// `kpng_api_connected_node_versions`.
    pub fn node_versions(&self) -> BTreeMap<String, i64> {
        let state = self.lock();
        let mut out: BTreeMap<String, i64> = BTreeMap::new();
        for w in state.watchers.values() {
            let version = w.version.as_deref().unwrap_or("unknown");
            *out.entry(version.to_string()).or_default() += 1;
        }
        out
    }

    /// The node names more than one connected watcher asks for, sorted, with each
    /// connection's address: a misconfiguration (see [`DuplicateNode`]).
    pub fn duplicate_nodes(&self) -> Vec<DuplicateNode> {
        let state = self.lock();
        let mut by_node: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for w in state.watchers.values() {
            by_node
                .entry(w.node_name.as_str())
                .or_default()
                .push(peer_or_unknown(&w.peer).to_string());
        }
        by_node
            .into_iter()
            .filter(|(_, peers)| peers.len() > 1)
            .map(|(node, mut peers)| {
                peers.sort();
                DuplicateNode {
                    node: node.to_string(),
                    peers,
                }
            })
            .collect()
    }

    /// The cluster's Nodes that no connected watcher asks for, sorted: nodes whose kpng is
    /// down, or cannot reach the brain, and so do not follow the cluster.
    pub fn not_connected(&self) -> Vec<String> {
        let state = self.lock();
        let watched: std::collections::HashSet<&str> = state
            .watchers
            .values()
            .map(|w| w.node_name.as_str())
            .collect();
        let mut out: Vec<String> = state
            .cluster
            .node_names()
            .filter(|n| !watched.contains(n))
            .map(str::to_string)
            .collect();
        out.sort();
        out
    }

    /// How many Nodes the cluster has, and those of them with a kpng connected to this brain
    /// (names no Node has are left out: they are counted apart).
    fn connected_nodes(&self) -> (usize, BTreeSet<String>) {
        let state = self.lock();
        let watched: std::collections::HashSet<&str> = state
            .watchers
            .values()
            .map(|w| w.node_name.as_str())
            .collect();
        let mut nodes = 0;
        let mut connected = BTreeSet::new();
        for name in state.cluster.node_names() {
            nodes += 1;
            if watched.contains(name) {
                connected.insert(name.to_string());
            }
        }
        (nodes, connected)
    }

    /// The names of the cluster's Nodes, sorted: what `kpng status --node` on the brain
    /// suggests when asked for a node it has no Node object for.
    pub fn node_names(&self) -> Vec<String> {
        let state = self.lock();
        let mut out: Vec<String> = state.cluster.node_names().map(str::to_string).collect();
        out.sort();
        out
    }

    /// The node names watchers ask for that no Node of the cluster has ever had since the
    /// brain started (once it is listed): a typo or a short hostname where the Node is an
    /// FQDN, whose kpng gets no local endpoint and cannot see why itself.
    pub fn unknown_watchers(&self) -> Vec<String> {
        self.lock().missing_nodes().1
    }

    /// The node names watchers ask for whose Node the brain saw and is gone now: deleted
    /// Nodes (a scale-down whose kpng still runs, or a Node re-created under another name).
    pub fn deleted_node_watchers(&self) -> Vec<String> {
        self.lock().missing_nodes().0
    }

    /// Node `node_name`'s view of the Services `wanted` selects (namespace, name), as the
    /// brain computes it for a kpng watching as that node, with every endpoint explained
    /// ([`ServiceSource::explained_ports_for`]), in key order; and the selected Services that
    /// give that node no port, with why. The node receives only the endpoints it uses: this
    /// is where an operator learns why it does not use the others. Walks the selected
    /// Services: asked on demand only.
    pub fn node_view(&self, node_name: &str, wanted: &dyn Fn(&str, &str) -> bool) -> NodeView {
        let state = self.lock();
        let mut node = state.node(node_name);
        node.ever_known = node.known || state.nodes_seen.contains_key(node_name);
        let mut ports = Vec::new();
        let mut not_programmed = Vec::new();
        for (key, source) in state.cluster.sources() {
            if !wanted(&key.namespace, &key.name) {
                continue;
            }
            let explained = source.explained_ports_for(&node);
            if explained.is_empty() {
                if let Some(why) = state.cluster.why_not_programmed(key) {
                    not_programmed.push((key.clone(), why));
                }
            } else {
                ports.extend(explained);
            }
        }
        ports.sort_by(|a, b| a.0.key.cmp(&b.0.key));
        not_programmed.sort();
        NodeView {
            connected: state.watchers.values().any(|w| w.node_name == node_name),
            node,
            ports,
            not_programmed,
        }
    }

    /// What the brain can say of the Services `wanted` selects without a node: each one's
    /// ports, or why it gives no node a port, and the nodes its endpoints run on (whose views
    /// differ from the others').
    pub fn service_summaries(&self, wanted: &dyn Fn(&str, &str) -> bool) -> Vec<ServiceSummary> {
        let state = self.lock();
        let anonymous = NodeState::default();
        let mut out: Vec<ServiceSummary> = state
            .cluster
            .sources()
            .filter(|(key, _)| wanted(&key.namespace, &key.name))
            .map(|(key, source)| ServiceSummary {
                service: key.to_string(),
                ports: source.ports_for(&anonymous).len(),
                not_programmed: source
                    .ports_for(&anonymous)
                    .is_empty()
                    .then(|| state.cluster.why_not_programmed(key))
                    .flatten(),
                endpoint_nodes: source.dependent_nodes(),
            })
            .collect();
        out.sort_by(|a, b| a.service.cmp(&b.service));
        out
    }

    /// Service entries the brain holds.
    pub fn service_count(&self) -> usize {
        self.lock().entries.len()
    }

    /// The objects whose latest version the brain rejected (its nodes get the last good
    /// version, or nothing of a new one): the brain's `kpng status` lists them, since its
    /// nodes never see the objects.
    pub fn rejected(&self) -> Vec<kpng_model::records::Rejection> {
        self.lock().cluster.rejected().cloned().collect()
    }

    /// The values the conversion dropped from objects in use, each with the Service it
    /// concerns: the brain logged them once, and its `kpng status` lists them (its nodes get
    /// the rest of each object, and are not told).
    pub fn dropped(&self) -> Vec<(Option<ServiceKey>, kpng_model::Warning)> {
        self.lock()
            .cluster
            .dropped()
            .map(|(service, w)| (service.cloned(), w.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests;
