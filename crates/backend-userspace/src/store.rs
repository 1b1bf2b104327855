//! The capture's entries as claims in the backend kit's owner-keyed store
//! ([`kpng_backend_kit::claims`]).
//!
//! Two owners can want the same key (two Services claiming one external IP and port, or one
//! node-port network listed twice): the lowest owner id wins, and when it lets go the next
//! owner's entry takes over, so a conflict never leaves a hole.

use std::hash::{DefaultHasher, Hash, Hasher};

use kpng_backend_kit::claims::{self, Claim, ClaimOp, ClaimStore, Payload, Resolve};

pub use kpng_backend_kit::owners::{NODE_OWNER, OwnerId};

use crate::entries::Entry;

/// One change to the capture: a delete names the entry exactly as it was added.
pub type Op = ClaimOp<Entry>;

/// Every wanted entry, with its owners (hashes only; the entries live with their owners).
pub type EntryStore = ClaimStore;

impl Claim for Entry {
    fn identity_hash(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.key.hash(&mut h);
        h.finish()
    }

    fn payload_hash(&self) -> Payload {
        let mut h = DefaultHasher::new();
        self.action.hash(&mut h);
        claims::payload(h.finish())
    }
}

/// Replaces `owner`'s entries `old` with `new` and appends the operations that take the
/// capture from the previous effective state to the new one: deletes first, then adds, so that
/// applying them in order never holds two actions for one key. `resolve` gives another owner's
/// entry for a key (the one that takes over, or the one a delete removes).
pub fn change(
    store: &mut EntryStore,
    owner: OwnerId,
    old: &[Entry],
    new: &[Entry],
    ops: &mut Vec<Op>,
    resolve: Resolve<'_, Entry>,
) {
    let mut mine = Vec::new();
    store.change_owner(owner, old, new, &mut mine, resolve);
    let (deletes, adds) = claims::order(mine);
    ops.extend(deletes.into_iter().map(Op::Delete));
    ops.extend(adds.into_iter().map(Op::Add));
}

#[cfg(test)]
mod tests;
