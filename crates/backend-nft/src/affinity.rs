//! ClientIP-affinity ids and the part of the conntrack mark that carries them.
//!
//! Why a mask: the conntrack mark is shared. CNIs and meshes keep their own bits in it (see
//! `docs/deploy.md`), so kpng owns only the bits of `--conntrack-mark-mask` and keeps every
//! other bit of a connection's mark as it found it. An affinity id is a small number, allocated
//! densely per endpoint list of a Service port with ClientIP affinity, and *deposited* into the
//! mask's bits (the mask need not be contiguous). The rules clear the masked bits with a
//! constant and then set the id one bit at a time (nft 1.0.6 cannot OR a looked-up value into
//! the mark), and every read is `ct mark & MASK`.
//!
//! Ids are reused last: a freed id goes to the back of the queue, so the stale affinity
//! entries of a removed Service (which `affinity-valid` forgets anyway) have expired long
//! before another Service gets its id.
//!
//! Across a restart over the earlier run's table, [`AffinityIds::seed`] gives each port back the
//! id the table shows for it and counts the others it shows as freed ([`crate::affinity_seed`]).

use std::collections::{HashMap, HashSet, VecDeque};

use crate::store::OwnerId;

/// The default `--conntrack-mark-mask`: bits 12–15 and 24–31 (4095 ids, 2047 affinity
/// Service ports). The common CNIs' conntrack-mark bits are elsewhere: Istio ambient's
/// `0xfff`, Antrea's OVS `ct_mark` bits 0–7 and its AWS `0x80`, the AWS VPC CNI's `0x80`,
/// Tailscale's `0xff0000`, Calico's connection-mark features inside the low half of its
/// `0xffff0000` mark mask (see `docs/deploy.md`).
pub const DEFAULT_CONNTRACK_MARK_MASK: u32 = 0xff00_f000;

/// A `--conntrack-mark-mask` that cannot hold one Service port's two ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "--conntrack-mark-mask {0:#010x}: needs at least 2 bits (one Service port with ClientIP \
     affinity takes two ids); the default is {DEFAULT_CONNTRACK_MARK_MASK:#010x}"
)]
pub struct MaskTooNarrow(pub u32);

/// Checks a `--conntrack-mark-mask`.
pub fn check_mask(mask: u32) -> Result<u32, MaskTooNarrow> {
    if mask.count_ones() < 2 {
        return Err(MaskTooNarrow(mask));
    }
    Ok(mask)
}

/// Spreads the low bits of `n` over the set bits of `mask`, lowest first (the x86 `pdep`):
/// the mark value of id `n`.
pub fn deposit(mut n: u32, mask: u32) -> u32 {
    let mut out = 0;
    let mut m = mask;
    while m != 0 && n != 0 {
        let lowest = m & m.wrapping_neg();
        if n & 1 == 1 {
            out |= lowest;
        }
        n >>= 1;
        m &= m - 1;
    }
    out
}

/// Gathers the bits of `mark` at the set bits of `mask` into the low bits, lowest first (the
/// x86 `pext`): the id whose mark value is `mark`, the inverse of [`deposit`] for a mark inside
/// the mask. Used to read back the ids an adopted table holds.
pub fn extract(mark: u32, mask: u32) -> u32 {
    let mut out = 0;
    let mut m = mask;
    let mut i = 0;
    while m != 0 {
        let lowest = m & m.wrapping_neg();
        if mark & lowest != 0 {
            out |= 1 << i;
        }
        i += 1;
        m &= m - 1;
    }
    out
}

/// The single-bit values of `mark`, lowest first: the `affinity-bits-*` elements of an id.
pub fn bits(mark: u32) -> impl Iterator<Item = u32> {
    (0..32).map(|i| 1u32 << i).filter(move |b| mark & b != 0)
}

/// The conntrack-mark values of one Service port's two endpoint lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Marks {
    /// The cluster list's id, deposited into the mask.
    pub cluster: u32,
    /// The local list's id, deposited into the mask.
    pub local: u32,
}

/// The first slot [`AffinityIds::seed`] ignores: 65,536 Service ports (the default mask has
/// room for 2,047).
pub const MAX_SEEDED_SLOT: u32 = 1 << 16;

/// Allocates affinity ids to Service ports (owners) with ClientIP affinity.
#[derive(Debug)]
pub struct AffinityIds {
    mask: u32,
    /// Slot of each owner that has ids; slot `s` holds ids `2s + 1` and `2s + 2`.
    slots: HashMap<OwnerId, u32>,
    /// Freed slots, oldest first: reused only once every never-used slot is taken.
    free: VecDeque<u32>,
    /// The next never-used slot.
    next: u32,
    /// Owners already warned about exhaustion (warned once until they get ids or go).
    warned: HashSet<OwnerId>,
}

impl AffinityIds {
    /// An allocator for `mask` (checked with [`check_mask`]).
    pub fn new(mask: u32) -> AffinityIds {
        AffinityIds {
            mask,
            slots: HashMap::new(),
            free: VecDeque::new(),
            next: 0,
            warned: HashSet::new(),
        }
    }

    /// The mask.
    pub fn mask(&self) -> u32 {
        self.mask
    }

    /// How many Service ports can have ids at once: ids `1 ..= 2^w - 1` in pairs.
    pub fn capacity(&self) -> u32 {
        let ids = if self.mask.count_ones() >= 32 {
            u32::MAX
        } else {
            (1u32 << self.mask.count_ones()) - 1
        };
        ids / 2
    }

    fn marks(&self, slot: u32) -> Marks {
        Marks {
            cluster: deposit(2 * slot + 1, self.mask),
            local: deposit(2 * slot + 2, self.mask),
        }
    }

    /// The owner's marks, if it has ids.
    pub fn get(&self, owner: OwnerId) -> Option<Marks> {
        self.slots.get(&owner).map(|s| self.marks(*s))
    }

    /// The owner's marks, allocating them if needed. `Err(true)` when the mask is full and
    /// this is the first time for this owner (warn then), `Err(false)` when already said.
    pub fn ensure(&mut self, owner: OwnerId) -> Result<Marks, bool> {
        if let Some(m) = self.get(owner) {
            return Ok(m);
        }
        let slot = if self.next < self.capacity() {
            self.next += 1;
            self.next - 1
        } else if let Some(s) = self.free.pop_front() {
            s
        } else {
            return Err(self.warned.insert(owner));
        };
        self.warned.remove(&owner);
        self.slots.insert(owner, slot);
        Ok(self.marks(slot))
    }

    /// The slot a mark read from an adopted table belongs to, if it is one this allocator could
    /// have given: inside the mask, not 0, within capacity, and (when `local` says which list
    /// the mark is of) odd for a cluster list, even for a local one.
    pub fn slot_of(&self, mark: u32, local: Option<bool>) -> Option<u32> {
        if mark == 0 || mark & !self.mask != 0 {
            return None;
        }
        let id = extract(mark, self.mask);
        let is_local = id.is_multiple_of(2);
        if local.is_some_and(|l| l != is_local) {
            return None;
        }
        let slot = (id - 1) / 2;
        (slot < self.capacity()).then_some(slot)
    }

    /// Seeds an allocator that has given nothing yet from what the kernel's table held at
    /// start-up (see `docs/nftables.md`, "Session affinity"): each owner of `claims` keeps its
    /// slot, and every other slot up to the highest one `seen` (in use or with live affinity
    /// entries) counts as freed, so that new ports take never-used slots first, as they would
    /// have in the earlier run. The freed slots go to the back of the queue in two groups:
    /// those the table said nothing of (freed long ago, or never used), then those it showed
    /// (a removed port's, whose clients may still have affinity entries). Claims of a slot
    /// already claimed, or out of capacity, are ignored; so is a seed of a used allocator. Slots
    /// from [`MAX_SEEDED_SLOT`] on are ignored too (a wide mask's: the freed slots below the
    /// highest are held in a queue, whose size a forged element must not choose).
    pub fn seed(
        &mut self,
        claims: impl IntoIterator<Item = (OwnerId, u32)>,
        seen: &std::collections::BTreeSet<u32>,
    ) {
        if self.next != 0 || !self.slots.is_empty() {
            return;
        }
        let capacity = self.capacity().min(MAX_SEEDED_SLOT);
        let mut taken = HashSet::new();
        for (owner, slot) in claims {
            if slot < capacity && !self.slots.contains_key(&owner) && taken.insert(slot) {
                self.slots.insert(owner, slot);
            }
        }
        let top = seen
            .iter()
            .chain(taken.iter())
            .copied()
            .filter(|s| *s < capacity)
            .max();
        self.next = top.map_or(0, |t| t + 1);
        let unclaimed = (0..self.next).filter(|s| !taken.contains(s));
        let (shown, unknown): (Vec<u32>, Vec<u32>) = unclaimed.partition(|s| seen.contains(s));
        self.free = unknown.into_iter().chain(shown).collect();
    }

    /// The owner no longer needs ids (its port went away or lost affinity).
    pub fn release(&mut self, owner: OwnerId) {
        self.warned.remove(&owner);
        if let Some(slot) = self.slots.remove(&owner) {
            self.free.push_back(slot);
        }
    }

    /// Releases the ids of every owner for which `keep` is false.
    pub fn retain(&mut self, mut keep: impl FnMut(OwnerId) -> bool) {
        let gone: Vec<OwnerId> = self.slots.keys().copied().filter(|o| !keep(*o)).collect();
        for owner in gone {
            self.release(owner);
        }
    }

    /// How many owners have ids.
    pub fn in_use(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deposit_spreads_an_id_over_the_mask() {
        let cases: [(u32, u32, u32); 7] = [
            (0, 0xff00_f000, 0),
            (1, 0xff00_f000, 0x1000),
            (2, 0xff00_f000, 0x2000),
            (0xf, 0xff00_f000, 0xf000),
            (0x10, 0xff00_f000, 0x0100_0000),
            (0xfff, 0xff00_f000, 0xff00_f000),
            (0b101, 0b1010_1000, 0b1000_1000),
        ];
        for (n, mask, want) in cases {
            assert_eq!(deposit(n, mask), want, "deposit({n:#x}, {mask:#x})");
            assert_eq!(deposit(n, mask) & !mask, 0);
        }
        assert_eq!(bits(0xff00_f000).count(), 12);
        assert_eq!(
            bits(0x0100_3000).collect::<Vec<_>>(),
            vec![0x1000, 0x2000, 0x0100_0000]
        );
    }

    #[test]
    fn masks_narrower_than_two_bits_are_refused() {
        for (mask, ok) in [
            (0, false),
            (0x1000, false),
            (0x3000, true),
            (u32::MAX, true),
        ] {
            assert_eq!(check_mask(mask).is_ok(), ok, "{mask:#x}");
        }
        let message = check_mask(0x10).expect_err("narrow").to_string();
        assert!(
            message.contains("--conntrack-mark-mask 0x00000010"),
            "{message}"
        );
    }

    #[test]
    fn ids_are_dense_distinct_inside_the_mask_and_reused_last() {
        // 3 bits: ids 1..=7, three owners of two ids each.
        let mut ids = AffinityIds::new(0b1_0110_0000);
        assert_eq!(ids.capacity(), 3);
        let a = ids.ensure(10).expect("a");
        let b = ids.ensure(11).expect("b");
        let c = ids.ensure(12).expect("c");
        let all = [a.cluster, a.local, b.cluster, b.local, c.cluster, c.local];
        for m in all {
            assert_ne!(m, 0);
            assert_eq!(m & !0b1_0110_0000, 0, "{m:#x} outside the mask");
        }
        let mut distinct = all.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 6);
        assert_eq!(ids.ensure(10), Ok(a), "stable");
        // Full: the first refusal for an owner says to warn, the next does not.
        assert_eq!(ids.ensure(13), Err(true));
        assert_eq!(ids.ensure(13), Err(false));
        ids.release(11);
        assert_eq!(ids.ensure(13), Ok(b), "the freed slot");
        assert_eq!(ids.in_use(), 3);
        assert_eq!(ids.get(11), None);
    }

    #[test]
    fn extract_undoes_deposit_inside_the_mask() {
        for mask in [0xff00_f000, 0b1010_1000, u32::MAX, 0x8000_0001] {
            for n in [0u32, 1, 2, 5, 0x7f, 0xfff] {
                let n = n & deposit_limit(mask);
                assert_eq!(extract(deposit(n, mask), mask), n, "{n:#x} in {mask:#x}");
            }
        }
        // Bits outside the mask are dropped.
        assert_eq!(extract(0x0000_1001, 0xff00_f000), 1);
    }

    /// The largest id `mask` holds.
    fn deposit_limit(mask: u32) -> u32 {
        if mask.count_ones() >= 32 {
            u32::MAX
        } else {
            (1 << mask.count_ones()) - 1
        }
    }

    /// A seeded allocator: the claimed owners keep their slots, and new owners take never-used
    /// slots first, then the holes the table showed nothing of, then the slots it showed
    /// (a removed port's, or live entries), oldest first.
    #[test]
    fn a_seeded_allocator_keeps_claims_and_gives_seen_slots_last() {
        struct Case {
            what: &'static str,
            claims: Vec<(OwnerId, u32)>,
            seen: Vec<u32>,
            /// Slots the next owners get, in order, on a 3-bit mask (3 slots) or the default.
            narrow: bool,
            next: Vec<Option<u32>>,
        }
        let cases = [
            Case {
                what: "nothing seen: a fresh start",
                claims: vec![],
                seen: vec![],
                narrow: false,
                next: vec![Some(0), Some(1)],
            },
            Case {
                what: "a removed port's slot 0 and live entries under 2 wait behind slot 3",
                claims: vec![(1, 1)],
                seen: vec![0, 1, 2],
                narrow: false,
                next: vec![Some(3), Some(4)],
            },
            Case {
                what: "full: the unknown hole first, then the seen slots",
                claims: vec![(1, 1)],
                seen: vec![0, 2],
                narrow: true,
                next: vec![Some(0), Some(2), None],
            },
            Case {
                what: "a hole the table showed nothing of comes before a seen slot",
                claims: vec![(1, 2)],
                seen: vec![0, 2],
                narrow: true,
                next: vec![Some(1), Some(0), None],
            },
            Case {
                what: "a slot claimed twice goes to the first; out of capacity is ignored",
                claims: vec![(1, 0), (2, 0), (3, 9)],
                seen: vec![0, 9],
                narrow: true,
                next: vec![Some(1), Some(2), None],
            },
        ];
        for case in cases {
            let mask = if case.narrow {
                0b1_0110_0000
            } else {
                DEFAULT_CONNTRACK_MARK_MASK
            };
            let mut ids = AffinityIds::new(mask);
            let slot = |m: Marks| (extract(m.cluster, mask) - 1) / 2;
            let seen = case.seen.iter().copied().collect();
            ids.seed(case.claims.clone(), &seen);
            for (owner, s) in &case.claims {
                if let Some(m) = ids.get(*owner) {
                    assert_eq!(slot(m), *s, "{}: owner {owner}", case.what);
                }
            }
            let got: Vec<Option<u32>> = (100..100 + case.next.len() as OwnerId)
                .map(|o| ids.ensure(o).ok().map(slot))
                .collect();
            assert_eq!(got, case.next, "{}", case.what);
        }
        // Only an allocator that has given nothing is seeded.
        let mut ids = AffinityIds::new(DEFAULT_CONNTRACK_MARK_MASK);
        let a = ids.ensure(1).expect("a");
        ids.seed([(2, 0)], &[0].into_iter().collect());
        assert_eq!(ids.get(2), None);
        assert_eq!(ids.get(1), Some(a));
    }

    #[test]
    fn marks_map_back_to_the_slot_of_their_list() {
        let ids = AffinityIds::new(DEFAULT_CONNTRACK_MARK_MASK);
        let m = DEFAULT_CONNTRACK_MARK_MASK;
        for (mark, local, want) in [
            (deposit(1, m), Some(false), Some(0)),
            (deposit(2, m), Some(true), Some(0)),
            (deposit(2, m), Some(false), None),
            (deposit(7, m), None, Some(3)),
            (deposit(8, m), None, Some(3)),
            (0, None, None),
            (0x1, None, None),
            // Id 4095 would be slot 2047, one past the capacity.
            (deposit(4095, m), Some(false), None),
        ] {
            assert_eq!(ids.slot_of(mark, local), want, "{mark:#x} {local:?}");
        }
    }

    #[test]
    fn freed_ids_wait_behind_never_used_ones() {
        let mut ids = AffinityIds::new(0xff00_f000);
        let a = ids.ensure(1).expect("a");
        ids.release(1);
        let b = ids.ensure(2).expect("b");
        assert_ne!(a, b, "a never-used id first");
        assert_eq!(ids.capacity(), 2047);
    }
}
