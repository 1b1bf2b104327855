//! Which Service port owns which data-plane object, diffed into minimal operations.
//!
//! Several Service ports may want the same object (every port of a Service puts its ClusterIP
//! in a set; two Services may claim one external IP and port). The store keeps, per object,
//! which owners want it and with what payload; the object's effective payload is that of its
//! lowest-numbered owner ([`crate::owners`]). Changing one owner's claims yields exactly the
//! additions, deletions and replacements that change what the data plane holds, and a departing
//! owner hands a shared object to the next one.
//!
//! It stores hashes, not the objects: 16 bytes per object in the common case of one owner (the
//! nftables backend holds ~300k elements at 30k Services). Objects themselves are always
//! recomputed from the model by the caller (a full sync generates them all; a partial sync, those
//! of the changed ports); in the rare case where a shared object passes to another owner, the
//! caller's resolver recomputes that owner's copy.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use crate::owners::{OwnerId, RESERVED};

/// An object a backend puts in its data plane on behalf of an owner.
pub trait Claim: Clone {
    /// The object's identity in the data plane (a set and key, a match): two claims with the
    /// same identity are the same object.
    fn identity_hash(&self) -> u64;
    /// What the owner wants for it (a map value, an action, a comment): claims of one identity
    /// with different payloads replace each other.
    fn payload_hash(&self) -> Payload;
}

/// What an owner wants for an object: a 32-bit hash of its payload. (A collision would hide one
/// payload change until the next full sync; at 2^-32 per change that is accepted for halving
/// the store.)
pub type Payload = u32;

/// Folds a 64-bit hash into a [`Payload`].
pub fn payload(hash: u64) -> Payload {
    (hash ^ (hash >> 32)) as Payload
}

/// A change to send to the data plane.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum ClaimOp<C> {
    /// Remove the object with this claim's identity (the claim is what was there).
    Delete(C),
    /// Add this object (after any delete of the same identity).
    Add(C),
}

/// What one claim means while a store is built from empty ([`ClaimStore::build_one`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Built {
    /// A new identity: send it.
    Emit,
    /// Already sent with the payload that stays effective.
    Skip,
    /// This owner's different payload now wins over the one already sent (two owners want one
    /// identity with different payloads, and the lower-numbered came later).
    Supersede,
}

/// Recomputes `owner`'s copy of an object (same identity), when it becomes the effective one.
pub type Resolve<'a, C> = &'a dyn Fn(OwnerId, &C) -> Option<C>;

/// The one owner of an object and its payload; `owner == RESERVED` means several owners,
/// listed in [`ClaimStore::shared`].
#[derive(Debug, Clone, Copy)]
struct Slot {
    owner: OwnerId,
    payload: Payload,
}

/// The effective owner of an object and its payload, if anyone wants it.
type Effective = Option<(OwnerId, Payload)>;

/// Wanted objects (as hashes) with their owners.
#[derive(Debug, Default)]
pub struct ClaimStore {
    objects: HashMap<u64, Slot>,
    /// Objects with several owners, with the payload each wants, sorted by owner; the lowest
    /// owner's payload is effective.
    shared: HashMap<u64, Vec<(OwnerId, Payload)>>,
}

impl ClaimStore {
    /// An empty store.
    pub fn new() -> ClaimStore {
        ClaimStore::default()
    }

    /// Number of distinct objects.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// Whether the store holds no object.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Full-sync step: records that `owner` wants `claim` in a store being built from empty,
    /// and says what that means for the objects already emitted. Owners may come in any order;
    /// the lowest-numbered one's payload wins.
    pub fn build_one<C: Claim>(&mut self, owner: OwnerId, claim: &C) -> Built {
        let (before, after) = self.set(claim.identity_hash(), owner, Some(claim.payload_hash()));
        match before {
            None => Built::Emit,
            Some((_, p)) if after.map(|(_, q)| q) == Some(p) => Built::Skip,
            Some(_) => Built::Supersede,
        }
    }

    /// Full-sync step for all of one owner's claims: appends the ones to send to `out`
    /// (replacing, through `index`, one already there that this owner's supersedes).
    pub fn build<C: Claim>(
        &mut self,
        owner: OwnerId,
        claims: Vec<C>,
        out: &mut Vec<C>,
        index: &mut HashMap<u64, usize>,
    ) {
        for claim in claims {
            match self.build_one(owner, &claim) {
                Built::Emit => {
                    index.insert(claim.identity_hash(), out.len());
                    out.push(claim);
                }
                Built::Skip => {}
                Built::Supersede => {
                    if let Some(i) = index.get(&claim.identity_hash()) {
                        out[*i] = claim;
                    }
                }
            }
        }
    }

    /// Replaces `owner`'s claims `old` with `new`, appending the operations that take the data
    /// plane from the previous effective state to the new one. `resolve` recomputes another
    /// owner's copy of an object: the one that takes over, or the one a delete removes.
    pub fn change_owner<C: Claim + PartialEq>(
        &mut self,
        owner: OwnerId,
        old: &[C],
        new: &[C],
        ops: &mut Vec<ClaimOp<C>>,
        resolve: Resolve<'_, C>,
    ) {
        if old == new {
            return;
        }
        let old_by_id: HashMap<u64, &C> = old.iter().map(|c| (c.identity_hash(), c)).collect();
        let new_ids: HashMap<u64, Payload> = new
            .iter()
            .map(|c| (c.identity_hash(), c.payload_hash()))
            .collect();
        for claim in old {
            if !new_ids.contains_key(&claim.identity_hash()) {
                self.update(claim, owner, Some(claim), None, ops, resolve);
            }
        }
        for claim in new {
            let previous = old_by_id.get(&claim.identity_hash()).copied();
            if previous.map(Claim::payload_hash) != Some(claim.payload_hash()) {
                self.update(claim, owner, previous, Some(claim), ops, resolve);
            }
        }
    }

    /// Sets (or, with `wanted: None`, drops) `owner`'s claim to `claim`'s identity and records
    /// the resulting change of the effective object. `previous` is this owner's claim before.
    fn update<C: Claim>(
        &mut self,
        claim: &C,
        owner: OwnerId,
        previous: Option<&C>,
        wanted: Option<&C>,
        ops: &mut Vec<ClaimOp<C>>,
        resolve: Resolve<'_, C>,
    ) {
        let (before, after) = self.set(
            claim.identity_hash(),
            owner,
            wanted.map(Claim::payload_hash),
        );
        if before.map(|(_, p)| p) == after.map(|(_, p)| p) {
            return;
        }
        if let Some((was, _)) = before {
            // What the data plane holds: this owner's previous claim, or the previous winner's.
            let removed = match previous {
                Some(p) if was == owner => Some(p.clone()),
                _ => resolve(was, claim),
            };
            ops.push(ClaimOp::Delete(removed.unwrap_or_else(|| claim.clone())));
        }
        if let Some((winner, _)) = after {
            let object = if winner == owner {
                wanted.cloned()
            } else {
                resolve(winner, claim)
            };
            match object {
                Some(object) => ops.push(ClaimOp::Add(object)),
                None => tracing::warn!(
                    "owner {winner} of a shared object no longer produces it; the next full sync \
                     settles it"
                ),
            }
        }
    }

    /// Sets `owner`'s payload for identity `id` (`None`: drops the claim); returns the effective
    /// (owner, payload) before and after.
    fn set(&mut self, id: u64, owner: OwnerId, payload: Option<Payload>) -> (Effective, Effective) {
        let mut slot = match self.objects.entry(id) {
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
        if current.owner != RESERVED {
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
                        owner: RESERVED,
                        payload: 0,
                    };
                    self.shared.insert(id, owners);
                    (before, after)
                }
            };
        }
        let owners = self.shared.entry(id).or_default();
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
                self.shared.remove(&id);
                slot.remove();
            }
            [(owner, payload)] => {
                *slot.get_mut() = Slot {
                    owner: *owner,
                    payload: *payload,
                };
                self.shared.remove(&id);
            }
            _ => {}
        }
        (before, after)
    }
}

/// Orders one transaction's operations: every delete first (each identity once), then the
/// adds; an add followed by a delete of the same identity cancels, and of several adds of one
/// identity the last wins. Returns (deletes, adds), each in identity order of first appearance.
pub fn order<C: Claim>(ops: Vec<ClaimOp<C>>) -> (Vec<C>, Vec<C>) {
    let mut deletes: Vec<C> = Vec::new();
    let mut deleted: HashMap<u64, ()> = HashMap::new();
    let mut adds: Vec<Option<C>> = Vec::new();
    let mut added: HashMap<u64, usize> = HashMap::new();
    for op in ops {
        match op {
            ClaimOp::Delete(c) => {
                let id = c.identity_hash();
                match added.remove(&id) {
                    Some(i) => adds[i] = None,
                    None => {
                        if deleted.insert(id, ()).is_none() {
                            deletes.push(c);
                        }
                    }
                }
            }
            ClaimOp::Add(c) => {
                let id = c.identity_hash();
                match added.get(&id) {
                    Some(i) => adds[*i] = Some(c),
                    None => {
                        added.insert(id, adds.len());
                        adds.push(Some(c));
                    }
                }
            }
        }
    }
    (deletes, adds.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use std::hash::{DefaultHasher, Hash, Hasher};

    use super::*;

    /// A claim: (key, value).
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct C(u32, u32);

    impl Claim for C {
        fn identity_hash(&self) -> u64 {
            let mut h = DefaultHasher::new();
            self.0.hash(&mut h);
            h.finish()
        }
        fn payload_hash(&self) -> Payload {
            self.1
        }
    }

    /// A store with each owner's claims, resolving from them.
    #[derive(Default)]
    struct Tracked {
        store: ClaimStore,
        given: HashMap<OwnerId, Vec<C>>,
    }

    impl Tracked {
        fn set(&mut self, owner: OwnerId, new: Vec<C>) -> Vec<ClaimOp<C>> {
            let old = self.given.remove(&owner).unwrap_or_default();
            let given = self.given.clone();
            let resolve = move |o: OwnerId, c: &C| {
                given
                    .get(&o)
                    .and_then(|v| v.iter().find(|x| x.0 == c.0).cloned())
            };
            let mut ops = Vec::new();
            self.store
                .change_owner(owner, &old, &new, &mut ops, &resolve);
            self.given.insert(owner, new);
            ops
        }
    }

    #[test]
    fn shared_objects_are_added_once_and_removed_with_their_last_owner() {
        let mut t = Tracked::default();
        assert_eq!(t.set(1, vec![C(7, 0)]), [ClaimOp::Add(C(7, 0))]);
        assert_eq!(t.set(2, vec![C(7, 0)]), []);
        assert_eq!(t.set(1, vec![]), []);
        assert_eq!(t.set(2, vec![]), [ClaimOp::Delete(C(7, 0))]);
        assert!(t.store.is_empty());
    }

    #[test]
    fn the_lowest_owner_wins_and_the_next_takes_over() {
        let mut t = Tracked::default();
        t.set(5, vec![C(1, 50)]);
        assert_eq!(
            t.set(3, vec![C(1, 30)]),
            [ClaimOp::Delete(C(1, 50)), ClaimOp::Add(C(1, 30))],
            "a delete names what was there"
        );
        assert_eq!(
            t.set(3, vec![]),
            [ClaimOp::Delete(C(1, 30)), ClaimOp::Add(C(1, 50))]
        );
    }

    #[test]
    fn a_payload_change_is_delete_then_add_and_no_change_is_nothing() {
        let mut t = Tracked::default();
        t.set(1, vec![C(1, 1), C(2, 2)]);
        assert_eq!(t.set(1, vec![C(1, 1), C(2, 2)]), []);
        assert_eq!(
            t.set(1, vec![C(1, 1), C(2, 3)]),
            [ClaimOp::Delete(C(2, 2)), ClaimOp::Add(C(2, 3))]
        );
    }

    #[test]
    fn building_from_empty_deduplicates_with_the_lowest_owner_winning() {
        let mut store = ClaimStore::new();
        let (mut out, mut index) = (Vec::new(), HashMap::new());
        store.build(4, vec![C(1, 40), C(2, 40)], &mut out, &mut index);
        store.build(2, vec![C(1, 20)], &mut out, &mut index);
        store.build(9, vec![C(2, 90)], &mut out, &mut index);
        assert_eq!(out, [C(1, 20), C(2, 40)]);
        assert_eq!(store.len(), 2);
    }

    #[test]
    fn ordering_puts_deletes_first_and_cancels_add_then_delete() {
        let ops = vec![
            ClaimOp::Add(C(1, 1)),
            ClaimOp::Delete(C(2, 0)),
            ClaimOp::Delete(C(1, 1)),
            ClaimOp::Add(C(3, 1)),
            ClaimOp::Add(C(3, 2)),
            ClaimOp::Delete(C(2, 0)),
        ];
        let (deletes, adds) = order(ops);
        assert_eq!(deletes, [C(2, 0)]);
        assert_eq!(adds, [C(3, 2)]);
    }
}
