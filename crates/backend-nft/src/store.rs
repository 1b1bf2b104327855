//! Which Service port owns which set/map element, diffed into minimal operations.
//!
//! Several Service ports may want the same element (every port of a Service puts its ClusterIP
//! in `cluster-ips`; two Services may hairpin the same pod). The store keeps, per element, which
//! ports want it and with what value; the element's effective value is that of its
//! lowest-numbered owner. Changing one port's elements yields exactly the additions, deletions
//! and value replacements that change the kernel's view.
//!
//! It stores 64-bit hashes, not the elements: at 30k Services that is ≈40 bytes per element
//! (with the map's overhead) instead of an 80-byte [`Element`]. Elements themselves are always
//! recomputed from the model (a full sync generates them all; a partial sync, those of the
//! changed ports); in the rare case where a shared element passes to another owner, the
//! caller's resolver recomputes that owner's copy.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

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

impl Element {
    /// The element's identity: its set and key.
    fn key_hash(&self) -> u64 {
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
        let h = h.finish();
        (h ^ (h >> 32)) as Payload
    }
}

/// An element change to send to the kernel.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum ElementOp {
    /// Remove the element with this key.
    Delete {
        /// The set or map.
        set: Set,
        /// The key.
        key: Key,
    },
    /// Add this element (after any delete of the same key).
    Add(Element),
}

/// An owner of elements: an interned Service-port id (the kit's).
pub use kpng_backend_kit::owners::OwnerId;

/// What an owner wants for an element: a 32-bit hash of value and comment. (A collision would
/// hide one value change until the next full sync; at 2^-32 per change that is accepted for
/// halving the store, which at 30k Services holds ~300k elements.)
pub type Payload = u32;

/// The one owner of an element and its payload; `owner == SHARED` means several owners,
/// listed in [`ElementStore::shared`].
#[derive(Debug, Clone, Copy)]
struct Slot {
    owner: OwnerId,
    payload: Payload,
}

/// The effective owner of an element and its payload, if anyone wants it.
type Effective = Option<(OwnerId, Payload)>;

/// The owner id that marks a shared element (never handed out to a Service port).
pub const SHARED: OwnerId = kpng_backend_kit::owners::RESERVED;

/// What one element means while a store is built from empty ([`ElementStore::build_one`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Built {
    /// A new identity: send it.
    Emit,
    /// Already sent with the value that stays effective.
    Skip,
    /// This owner's different value now wins over the one already sent (two Service ports
    /// want one key with different values, and the lower-numbered came later).
    Supersede,
}

/// Recomputes `owner`'s copy of an element (same set and key), when it becomes the effective one.
pub type Resolve<'a> = &'a dyn Fn(OwnerId, &Element) -> Option<Element>;

/// Desired elements (as hashes) with their owners: 16 bytes per element in the common case
/// of one owner.
#[derive(Debug, Default)]
pub struct ElementStore {
    elements: HashMap<u64, Slot>,
    /// Elements with several owners (a Service's ClusterIP wanted by each of its ports, …),
    /// with the payload each wants, sorted by owner; the lowest owner's payload is effective.
    shared: HashMap<u64, Vec<(OwnerId, Payload)>>,
}

impl ElementStore {
    /// An empty store.
    pub fn new() -> ElementStore {
        ElementStore::default()
    }

    /// Number of distinct elements.
    pub fn len(&self) -> usize {
        self.elements.len()
    }

    /// Whether the store holds no element.
    pub fn is_empty(&self) -> bool {
        self.elements.is_empty()
    }

    /// Full-sync step: records that `owner` wants `e` in a store being built from empty, and
    /// says what that means for the elements already emitted. Owners may come in any order;
    /// the lowest-numbered one's value wins.
    pub fn build_one(&mut self, owner: OwnerId, e: &Element) -> Built {
        let (before, after) = self.set(e.key_hash(), owner, Some(e.payload_hash()));
        match before {
            None => Built::Emit,
            Some((_, p)) if after.map(|(_, q)| q) == Some(p) => Built::Skip,
            Some(_) => Built::Supersede,
        }
    }

    /// Sets (`Some`) or clears (`None`) `owner`'s wish for the element `kh`; returns the
    /// effective (owner, payload) before and after.
    fn set(&mut self, kh: u64, owner: OwnerId, payload: Option<Payload>) -> (Effective, Effective) {
        let mut slot = match self.elements.entry(kh) {
            Entry::Vacant(v) => {
                return match payload {
                    None => (None, None),
                    Some(payload) => {
                        v.insert(Slot { owner, payload });
                        (None, Some((owner, payload)))
                    }
                };
            }
            Entry::Occupied(o) => o,
        };
        let current = *slot.get();
        if current.owner != SHARED {
            let before = Some((current.owner, current.payload));
            return match payload {
                _ if current.owner != owner && payload.is_none() => (before, before),
                None => {
                    slot.remove();
                    (before, None)
                }
                Some(payload) if current.owner == owner => {
                    slot.get_mut().payload = payload;
                    (before, Some((owner, payload)))
                }
                Some(payload) => {
                    let mut owners = vec![(current.owner, current.payload), (owner, payload)];
                    owners.sort_unstable_by_key(|(o, _)| *o);
                    let after = owners.first().copied();
                    *slot.get_mut() = Slot {
                        owner: SHARED,
                        payload: 0,
                    };
                    self.shared.insert(kh, owners);
                    (before, after)
                }
            };
        }
        let owners = self.shared.entry(kh).or_default();
        let before = owners.first().copied();
        match (owners.binary_search_by_key(&owner, |(o, _)| *o), payload) {
            (Ok(i), Some(p)) => owners[i].1 = p,
            (Ok(i), None) => {
                owners.remove(i);
            }
            (Err(i), Some(p)) => owners.insert(i, (owner, p)),
            (Err(_), None) => {}
        }
        let after = owners.first().copied();
        match owners.as_slice() {
            [] => {
                self.shared.remove(&kh);
                slot.remove();
            }
            [(owner, payload)] => {
                *slot.get_mut() = Slot {
                    owner: *owner,
                    payload: *payload,
                };
                self.shared.remove(&kh);
            }
            _ => {}
        }
        (before, after)
    }

    /// Full-sync path that keeps the elements: adds what `owner` wants to a store being built
    /// from empty, and collects the effective elements (deduplicated, lowest owner winning)
    /// into `out`. `index` maps element identities to their place in `out`.
    pub fn build(
        &mut self,
        owner: OwnerId,
        elements: Vec<Element>,
        out: &mut Vec<Element>,
        index: &mut HashMap<u64, usize>,
    ) {
        for e in elements {
            match self.build_one(owner, &e) {
                Built::Emit => {
                    index.insert(e.key_hash(), out.len());
                    out.push(e);
                }
                Built::Skip => {}
                Built::Supersede => {
                    if let Some(i) = index.get(&e.key_hash()) {
                        out[*i] = e;
                    }
                }
            }
        }
    }

    /// Moves `owner` from wanting `old` to wanting `new`, appending the resulting kernel
    /// operations to `ops`. `old` must be exactly what the owner was last given (the backend
    /// recomputes it from the previous state of the Service port).
    pub fn change_owner(
        &mut self,
        owner: OwnerId,
        old: &[Element],
        new: &[Element],
        ops: &mut Vec<ElementOp>,
        resolve: Resolve<'_>,
    ) {
        if old == new {
            return;
        }
        let old_ids: HashMap<u64, Payload> = old
            .iter()
            .map(|e| (e.key_hash(), e.payload_hash()))
            .collect();
        let new_ids: HashMap<u64, Payload> = new
            .iter()
            .map(|e| (e.key_hash(), e.payload_hash()))
            .collect();
        for e in old {
            let kh = e.key_hash();
            // Gone altogether; a changed value is handled below as a new wish.
            if !new_ids.contains_key(&kh) {
                self.update(e, owner, None, ops, resolve);
            }
        }
        for e in new {
            if old_ids.get(&e.key_hash()) != Some(&e.payload_hash()) {
                self.update(e, owner, Some(e), ops, resolve);
            }
        }
    }

    /// Sets (`Some`) or clears (`None`) one owner's wish for the element with `e`'s identity.
    fn update(
        &mut self,
        e: &Element,
        owner: OwnerId,
        wanted: Option<&Element>,
        ops: &mut Vec<ElementOp>,
        resolve: Resolve<'_>,
    ) {
        let (before, after) = self.set(e.key_hash(), owner, wanted.map(Element::payload_hash));
        if before.map(|(_, p)| p) == after.map(|(_, p)| p) {
            return;
        }
        if before.is_some() {
            ops.push(ElementOp::Delete {
                set: e.set,
                key: e.key,
            });
        }
        if let Some((winner, _)) = after {
            let element = if winner == owner {
                wanted.cloned()
            } else {
                resolve(winner, e)
            };
            match element {
                Some(element) => ops.push(ElementOp::Add(element)),
                None => {
                    tracing::warn!(set = e.set.name(), key = %e.key, "owner {winner} of a shared element no longer produces it")
                }
            }
        }
    }
}

/// Orders a batch of operations the way a transaction needs them: all deletes, then all adds.
/// A delete and an add of the same key (a value change) thus become "replace" in one commit.
pub fn order_ops(ops: Vec<ElementOp>) -> (Vec<(Set, Key)>, Vec<Element>) {
    let mut deletes = Vec::new();
    let mut adds: std::collections::BTreeMap<(Set, Key), Element> =
        std::collections::BTreeMap::new();
    for op in ops {
        match op {
            ElementOp::Delete { set, key } => {
                // A delete that cancels an add earlier in this batch: the kernel never saw it.
                if adds.remove(&(set, key)).is_none() {
                    deletes.push((set, key));
                }
            }
            ElementOp::Add(e) => {
                adds.insert((e.set, e.key), e);
            }
        }
    }
    deletes.sort();
    deletes.dedup();
    (deletes, adds.into_values().collect())
}

#[cfg(test)]
mod tests {
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

    const M: Set = Set::AffinityIds(crate::ruleset::PickKind::Cluster);

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
        assert_eq!(
            ops,
            vec![ElementOp::Delete {
                set: Set::ClusterIps,
                key: Key::Mark(1)
            }]
        );
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
