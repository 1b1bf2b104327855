//! One event's Service changes, recorded once and shared by every watcher that was up to date
//! before it.
//!
//! At 5,000 nodes an endpoint change was 5,000 map inserts (each with a copy of the Service's
//! key), 5,000 change sets assembled from the same shared frames plus a `Sync` encoded per
//! node, and 5,000 maps dropped. A watcher that holds nothing else pending now takes an `Arc`
//! of the event's [`Batch`], and, when none of the batch's Services depends on its node, the
//! batch's one encoding of the whole change set, `Sync` included, by reference. Any other
//! watcher folds the batch into its coalesced map, as every watcher did before.

use std::sync::{Arc, OnceLock};

use kpng_model::ServiceKey;
use prost::bytes::{Bytes, BytesMut};

use super::{Entry, op, service_ops};
use crate::frames::frame_into;
use crate::proto;
use crate::proto::op_item::Op;

/// One Service's change in a batch: what a watcher up to date before the event holds, and the
/// newest version (`None`: none, or gone).
#[derive(Debug)]
pub struct BatchChange {
    /// The Service.
    pub key: ServiceKey,
    /// The version before the event.
    pub old: Option<Arc<Entry>>,
    /// The version after it.
    pub new: Option<Arc<Entry>>,
}

/// The Services one event changed, in key order, with their shared change set.
#[derive(Debug, Default)]
pub struct Batch {
    changes: Vec<BatchChange>,
    /// The change set of a watcher that depends on none of the Services, `Sync` included
    /// (empty when nothing changes for it), and its ops without `Sync`: encoded by the first
    /// watcher that takes it.
    shared: OnceLock<(Bytes, u64)>,
}

impl Batch {
    /// A batch of `changes` (in key order, each Service once).
    pub fn new(changes: Vec<BatchChange>) -> Batch {
        Batch {
            changes,
            shared: OnceLock::new(),
        }
    }

    /// The changes, in key order.
    pub fn changes(&self) -> &[BatchChange] {
        &self.changes
    }

    /// Whether the batch changes nothing.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// Whether node `node_name` receives, for some Service of the batch, other messages than
    /// an anonymous node (in the version before or after): it then needs its own view.
    pub fn depends_on_node(&self, node_name: &str) -> bool {
        self.changes.iter().any(|c| {
            c.old.as_ref().is_some_and(|e| e.depends_on_node(node_name))
                || c.new.as_ref().is_some_and(|e| e.depends_on_node(node_name))
        })
    }

    /// The change set of a watcher that held the versions before the event and depends on
    /// none of the Services: frames with `Sync` last (empty when nothing changes for such a
    /// watcher) and its ops, `Sync` not counted.
    pub fn shared_change_set(&self) -> (Bytes, u64) {
        self.shared
            .get_or_init(|| {
                let mut out = BytesMut::new();
                let mut ops = 0;
                for change in &self.changes {
                    let (frames, n) = anonymous_change(change);
                    out.extend_from_slice(&frames);
                    ops += n;
                }
                if ops > 0 {
                    frame_into(&op(Op::Sync(proto::EmptyOp {})), &mut out);
                }
                (out.freeze(), ops)
            })
            .clone()
    }
}

/// One Service's change as an anonymous node sees it, from the entries' shared encodings.
fn anonymous_change(change: &BatchChange) -> (Bytes, u64) {
    match (&change.old, &change.new) {
        (None, Some(new)) => new.anonymous_frames(),
        (Some(old), Some(new)) => new.change_frames_from(old),
        (Some(old), None) => {
            let ops = service_ops(&change.key, old.anonymous.as_deref(), None);
            (crate::frames::frames_of(&ops), ops.len() as u64)
        }
        (None, None) => (Bytes::new(), 0),
    }
}
