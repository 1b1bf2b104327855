//! How a streamed full sync cuts its elements into transactions.
//!
//! Refilling a table that holds elements (a restart adopting it, a repair) is one transaction:
//! anything else would let packets meet half the old state and half the new. Filling a table
//! that was just created is different: nothing runs on it yet, so nothing can be interrupted,
//! and one transaction is slow there for a reason of the kernel's: every set of ours is a
//! resizable hash table (`nft_set_rhash`) that starts with room for a few elements and doubles
//! in a worker thread. That worker is queued on the CPU of the thread that inserts, which does
//! not leave the kernel until the whole transaction is in, so the tables stay undersized and
//! every insert takes the slow path past them (`rhashtable_insert_slow`: about half of the
//! kernel's time at 30k Services × 4, measured with `perf`). Returning to user space between
//! transactions lets each doubling finish.
//!
//! So a cold fill is cut, at Service-port boundaries, into transactions that at most double
//! what the table holds ([`FillBatches`]): about six at 30k × 4. Each commit adds whole
//! Service ports (a port's dispatch element and its endpoints arrive together), so a
//! Service is either absent or complete. If one fails, those before it stand and the runner's
//! retry adopts the table (our skeleton) and refills it in one transaction.
//!
//! Not the set's `size` declaration, which would presize the table: the kernel then picks the
//! fixed hash (`nft_set_hash`), whose bucket array for the largest expected size is allocated
//! for every set, empty ones included, and whose size is a hard limit.

use kpng_model::Family;

use crate::netlink::{ElementBatch, NetlinkError};

/// The first transaction of a cold fill holds at least this many elements: below it the
/// per-transaction costs (the commit, the validation of the table's jumps) dominate.
const FIRST_FILL_ELEMENTS: usize = 16 * 1024;

/// The batches of one streamed full sync: a single one when the table is adopted (flushed and
/// refilled atomically), or a cold fill cut as the module says.
#[derive(Debug)]
pub struct FillBatches {
    /// The batch elements go to now.
    pub current: ElementBatch,
    done: Vec<ElementBatch>,
    /// Whether the table was just created (the fill may be cut).
    cold: bool,
    /// Elements in `done`.
    sent: usize,
}

impl FillBatches {
    /// An empty fill of `table` of `family`; `cold`: the table was just created.
    pub fn new(family: Family, table: &str, cold: bool) -> Result<FillBatches, NetlinkError> {
        Ok(FillBatches {
            current: ElementBatch::new(family, table)?,
            done: Vec::new(),
            cold,
            sent: 0,
        })
    }

    /// Called after each Service port's elements (and the node's): starts a new transaction
    /// when the current one would now at least double what the earlier ones put in the table.
    pub fn owner_done(&mut self, family: Family, table: &str) -> Result<(), NetlinkError> {
        let adds = self.current.adds();
        if self.cold && adds >= FIRST_FILL_ELEMENTS.max(self.sent) {
            let next = ElementBatch::new(family, table)?;
            self.done.push(std::mem::replace(&mut self.current, next));
            self.sent += adds;
        }
        Ok(())
    }

    /// Elements added over all batches.
    pub fn adds(&self) -> usize {
        self.sent + self.current.adds()
    }

    /// The batches, in the order they must be committed.
    pub fn finish(mut self) -> Vec<ElementBatch> {
        if !self.current.is_empty() || self.done.is_empty() {
            self.done.push(self.current);
        }
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sets::Set;
    use crate::store::Element;
    use crate::value::Key;

    fn element(i: u32) -> Element {
        Element {
            set: Set::ClusterIps,
            key: Key::Addr(std::net::IpAddr::V4(i.into())),
            value: None,
            comment: None,
        }
    }

    /// Feeds `owners` Service ports of `per_owner` elements each; the sizes of the batches.
    fn cut(cold: bool, owners: u32, per_owner: u32) -> Vec<usize> {
        let mut fill = FillBatches::new(Family::V4, "kpng", cold).expect("batch");
        for o in 0..owners {
            for e in 0..per_owner {
                fill.current.add(&element(o * per_owner + e)).expect("add");
            }
            fill.owner_done(Family::V4, "kpng").expect("cut");
        }
        assert_eq!(fill.adds(), (owners * per_owner) as usize);
        fill.finish().iter().map(ElementBatch::adds).collect()
    }

    #[test]
    fn a_cold_fill_is_cut_at_port_boundaries_each_at_most_doubling_the_table() {
        let sizes = cut(true, 30_000, 11);
        assert_eq!(sizes.iter().sum::<usize>(), 330_000);
        assert!(sizes.len() >= 4 && sizes.len() <= 8, "{sizes:?}");
        let mut before = 0;
        for (i, n) in sizes.iter().enumerate() {
            assert_eq!(n % 11, 0, "batch {i} splits a port: {sizes:?}");
            if i > 0 {
                // At most one port's worth over doubling.
                assert!(*n <= before + 11, "batch {i} more than doubles: {sizes:?}");
            }
            before += n;
        }
    }

    #[test]
    fn an_adopted_table_and_a_small_cold_fill_are_one_transaction() {
        assert_eq!(cut(false, 30_000, 11), vec![330_000]);
        assert_eq!(cut(true, 100, 11), vec![1_100]);
        assert_eq!(cut(true, 0, 11), vec![0]);
    }
}
