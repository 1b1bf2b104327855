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
    fn freed_ids_wait_behind_never_used_ones() {
        let mut ids = AffinityIds::new(0xff00_f000);
        let a = ids.ensure(1).expect("a");
        ids.release(1);
        let b = ids.ensure(2).expect("b");
        assert_ne!(a, b, "a never-used id first");
        assert_eq!(ids.capacity(), 2047);
    }
}
