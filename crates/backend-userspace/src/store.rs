//! The entries the capture holds, with the owners that want them, diffed into minimal
//! operations.
//!
//! Two owners can want the same key (two Services claiming one external IP and port, or one
//! node-port network listed twice): the lowest owner id wins, and when it lets go the next
//! owner's entry takes over, so a conflict never leaves a hole.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::entries::{Action, Entry, EntryKey};

/// Who wants an entry: a Service port (by id) or the node ([`NODE_OWNER`]).
pub type OwnerId = u32;

/// The owner of the node-level entries.
pub const NODE_OWNER: OwnerId = 0;

/// One change to the capture.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Op {
    /// Remove this entry (exactly as it was added).
    Delete(Entry),
    /// Add this entry.
    Add(Entry),
}

/// Every wanted entry, with its owners.
#[derive(Debug, Default)]
pub struct EntryStore {
    claims: HashMap<EntryKey, BTreeMap<OwnerId, Action>>,
}

impl EntryStore {
    /// An empty store.
    pub fn new() -> EntryStore {
        EntryStore::default()
    }

    fn effective(&self, key: &EntryKey) -> Option<Entry> {
        let (_, action) = self.claims.get(key)?.iter().next()?;
        Some(Entry {
            key: key.clone(),
            action: *action,
        })
    }

    /// Replaces `owner`'s entries `old` with `new` and appends the operations that take the
    /// capture from the previous effective state to the new one: deletes first, then adds, so
    /// that applying them in order never holds two actions for one key.
    pub fn change(&mut self, owner: OwnerId, old: &[Entry], new: &[Entry], ops: &mut Vec<Op>) {
        let touched: BTreeSet<&EntryKey> = old.iter().chain(new).map(|e| &e.key).collect();
        let before: Vec<Option<Entry>> = touched.iter().map(|k| self.effective(k)).collect();
        for e in old {
            if let Some(claims) = self.claims.get_mut(&e.key) {
                claims.remove(&owner);
                if claims.is_empty() {
                    self.claims.remove(&e.key);
                }
            }
        }
        for e in new {
            self.claims
                .entry(e.key.clone())
                .or_default()
                .insert(owner, e.action);
        }
        let mut adds = Vec::new();
        for (key, before) in touched.iter().zip(before) {
            let after = self.effective(key);
            if before == after {
                continue;
            }
            if let Some(b) = before {
                ops.push(Op::Delete(b));
            }
            if let Some(a) = after {
                adds.push(Op::Add(a));
            }
        }
        ops.extend(adds);
    }

    /// Every effective entry, sorted (what a full replace writes).
    pub fn entries(&self) -> Vec<Entry> {
        let mut all: Vec<Entry> = self
            .claims
            .keys()
            .filter_map(|k| self.effective(k))
            .collect();
        all.sort();
        all
    }

    /// Number of keys held.
    pub fn len(&self) -> usize {
        self.claims.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }
}

#[cfg(test)]
mod tests;
