//! The nftables elements kpng owns, as claims in the backend kit's owner-keyed store
//! ([`kpng_backend_kit::claims`]): several Service ports may want the same element (every port
//! of a Service puts its ClusterIP in `cluster-ips`; two Services may hairpin the same pod); the
//! lowest-numbered owner's value is effective, and changing one port's elements yields exactly
//! the additions, deletions and value replacements that change the kernel's view.
//!
//! The store keeps hashes, not elements: at 30k Services that is ≈40 bytes per element (with the
//! map's overhead) instead of an 80-byte [`Element`].

use std::hash::{Hash, Hasher};
use std::sync::Arc;

pub use kpng_backend_kit::claims::Built;
use kpng_backend_kit::claims::{self, Claim, ClaimOp, ClaimStore, Payload};

use crate::sets::Set;
use crate::value::{Key, Value};

/// One element: its set, its typed key, the value for maps, and a comment.
///
/// Typed rather than text so that the netlink writer encodes it without parsing, and small:
/// nothing in it allocates but the comment, which is shared by every element of a Service port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Element {
    /// The set or map.
    pub set: Set,
    /// The key, e.g. `10.96.0.10 . tcp . 80`.
    pub key: Key,
    /// The value for maps (`goto cluster-n3`, `10.244.1.2 . 8080`), `None` for sets.
    pub value: Option<Value>,
    /// A comment shown by `nft list` (which Service this is); not part of the identity.
    pub comment: Option<Arc<str>>,
}

impl Claim for Element {
    /// The element's identity: its set and key.
    fn identity_hash(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.set.hash(&mut h);
        self.key.hash(&mut h);
        h.finish()
    }

    /// What an owner wants for it: value and comment.
    fn payload_hash(&self) -> Payload {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.value.hash(&mut h);
        self.comment.hash(&mut h);
        claims::payload(h.finish())
    }
}

/// An element change to send to the kernel (a delete names the element that was there).
pub type ElementOp = ClaimOp<Element>;

/// Desired elements with their owners (the kit's store).
pub type ElementStore = ClaimStore;

/// An owner of elements: an interned Service-port id (the kit's).
pub use kpng_backend_kit::owners::OwnerId;

/// Splits one transaction's operations into the keys to delete and the elements to add, each
/// sorted by set and key (so the text path writes a stable script); an element added and then
/// deleted in the same transaction is neither.
pub fn order_ops(ops: Vec<ElementOp>) -> (Vec<(Set, Key)>, Vec<Element>) {
    let (deletes, mut adds) = claims::order(ops);
    let mut deletes: Vec<(Set, Key)> = deletes.into_iter().map(|e| (e.set, e.key)).collect();
    deletes.sort();
    deletes.dedup();
    adds.sort_by(|a, b| (&a.set, &a.key).cmp(&(&b.set, &b.key)));
    (deletes, adds)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Test helper keeping what each owner was given, as the backend does through the model.
    #[derive(Default)]
    struct Tracked {
        store: ElementStore,
        given: HashMap<OwnerId, Vec<Element>>,
    }

    impl Tracked {
        fn set_owner(&mut self, owner: OwnerId, new: Vec<Element>, ops: &mut Vec<ElementOp>) {
            let old = self.given.remove(&owner).unwrap_or_default();
            let given = self.given.clone();
            let resolve = move |o: OwnerId, e: &Element| {
                given
                    .get(&o)
                    .and_then(|v| v.iter().find(|x| x.set == e.set && x.key == e.key).cloned())
            };
            self.store.change_owner(owner, &old, &new, ops, &resolve);
            self.given.insert(owner, new);
        }
    }

    const M: Set = Set::AffinityTimeouts;

    /// An element of `set` with key `key` (a mark) and value `value` (a mark).
    fn el(set: Set, key: u32, value: Option<u32>) -> Element {
        Element {
            set,
            key: Key::Mark(key),
            value: value.map(Value::Mark),
            comment: None,
        }
    }

    /// Elements are generated per Service port and, on the text path, collected for a whole
    /// family: they must stay small (the text version was 88 bytes plus three allocations;
    /// the typed one is 80, its only allocation the comment shared by a port's elements).
    #[test]
    fn an_element_is_small() {
        println!(
            "size_of: Element {}, Key {}, Option<Value> {}",
            size_of::<Element>(),
            size_of::<Key>(),
            size_of::<Option<Value>>()
        );
        assert!(size_of::<Element>() <= 80, "{}", size_of::<Element>());
    }

    #[test]
    fn shared_elements_are_added_once_and_removed_with_their_last_owner() {
        let mut s = Tracked::default();
        let mut ops = Vec::new();
        s.set_owner(1, vec![el(Set::ClusterIps, 1, None)], &mut ops);
        s.set_owner(2, vec![el(Set::ClusterIps, 1, None)], &mut ops);
        assert_eq!(ops, vec![ElementOp::Add(el(Set::ClusterIps, 1, None))]);
        ops.clear();
        s.set_owner(1, vec![], &mut ops);
        assert!(ops.is_empty(), "still owned by 2");
        s.set_owner(2, vec![], &mut ops);
        assert_eq!(ops, vec![ElementOp::Delete(el(Set::ClusterIps, 1, None))]);
        assert!(s.store.is_empty());
    }

    #[test]
    fn value_change_is_delete_then_add_and_unchanged_is_nothing() {
        let mut s = Tracked::default();
        let mut ops = Vec::new();
        s.set_owner(1, vec![el(M, 1, Some(1)), el(M, 2, Some(3))], &mut ops);
        ops.clear();
        s.set_owner(1, vec![el(M, 1, Some(2)), el(M, 2, Some(3))], &mut ops);
        let (deletes, adds) = order_ops(ops);
        assert_eq!(deletes, vec![(M, Key::Mark(1))]);
        assert_eq!(adds, vec![el(M, 1, Some(2))]);
        let mut ops = Vec::new();
        s.set_owner(1, vec![el(M, 1, Some(2)), el(M, 2, Some(3))], &mut ops);
        assert!(ops.is_empty());
    }

    #[test]
    fn lowest_owner_wins_conflicts_and_the_next_takes_over() {
        let mut s = Tracked::default();
        let mut ops = Vec::new();
        s.set_owner(5, vec![el(M, 1, Some(5))], &mut ops);
        ops.clear(); // committed
        s.set_owner(3, vec![el(M, 1, Some(3))], &mut ops);
        let (deletes, adds) = order_ops(std::mem::take(&mut ops));
        assert_eq!(deletes, vec![(M, Key::Mark(1))]);
        assert_eq!(adds, vec![el(M, 1, Some(3))]);
        // Owner 3 goes away: owner 5's value comes back (recomputed through the resolver).
        s.set_owner(3, vec![], &mut ops);
        let (deletes, adds) = order_ops(ops);
        assert_eq!(deletes, vec![(M, Key::Mark(1))]);
        assert_eq!(adds, vec![el(M, 1, Some(5))]);
    }

    #[test]
    fn add_then_delete_in_one_batch_cancels() {
        let mut s = Tracked::default();
        let mut ops = Vec::new();
        s.set_owner(1, vec![el(M, 1, Some(9))], &mut ops);
        s.set_owner(1, vec![], &mut ops);
        let (deletes, adds) = order_ops(ops);
        assert!(deletes.is_empty() && adds.is_empty());
    }

    #[test]
    fn building_from_empty_deduplicates_with_the_lowest_owner_winning() {
        let mut store = ElementStore::new();
        let (mut out, mut index) = (Vec::new(), HashMap::new());
        store.build(
            7,
            vec![el(M, 1, Some(7)), el(Set::ClusterIps, 3, None)],
            &mut out,
            &mut index,
        );
        store.build(
            2,
            vec![el(M, 1, Some(2)), el(Set::ClusterIps, 3, None)],
            &mut out,
            &mut index,
        );
        store.build(9, vec![el(M, 1, Some(9))], &mut out, &mut index);
        assert_eq!(out, vec![el(M, 1, Some(2)), el(Set::ClusterIps, 3, None)]);
        assert_eq!(store.len(), 2);
    }
}
