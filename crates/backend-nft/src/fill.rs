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
//! So a cold fill is cut, at Service-port boundaries, into transactions that at most double what
//! the table holds and hold at most [`MAX_FILL_ELEMENTS`] ([`FillBatches`]): about twelve at
//! 30k × 4, each adding whole Service ports. The cap is for memory: the encoded transactions alive at
//! once (one committing, one queued, one being encoded) are part of the first sync's peak RSS, and
//! doubling alone let the last ones reach 131k elements (5.8 MB encoded) beside the next (2.8 MB).
//! The table has no base chain meanwhile: the skeleton goes in two parts
//! ([`crate::ruleset::skeleton_in_two`]), the base chains last, once every element is in. So no
//! packet meets a half-filled table (every Service appears at once), and the kernel, which
//! validates a table from its base chains at each commit that adds a `goto` element, has nothing to
//! validate until the last one. If a transaction fails, the table is left marked as filling,
//! unhooked, and the runner's retry fills it again from scratch.
//!
//! The transactions are committed by a second thread while the sync's thread builds and
//! encodes the next ([`NftBackend::cold_fill`]): the kernel's inserts take about two thirds of
//! a cold sync and the encoding one third, so on two CPUs they overlap. Each transaction's new
//! per-count chains are created (as text) before it is handed over.
//!
//! Not the set's `size` declaration, which would presize the table: the kernel then picks the
//! fixed hash (`nft_set_hash`), whose bucket array for the largest expected size is allocated
//! for every set, empty ones included, and whose size is a hard limit.

use std::cell::Cell;
use std::collections::BTreeSet;
use std::sync::mpsc::{Receiver, sync_channel};

use kpng_backend_kit::owners::NODE_OWNER;
use kpng_model::{Family, Snapshot};
use tracing::debug;

use crate::netlink::{ElementBatch, ElementWriter, NetlinkError, Operation};
use crate::ruleset::{DynamicChain, Fam, StaticConfig};
use crate::store::{self, ElementStore};
use crate::{NftBackend, script};

/// The first transaction of a cold fill holds at least this many elements: below it each
/// commit's fixed costs dominate.
const FIRST_FILL_ELEMENTS: usize = 16 * 1024;

/// The most elements a cold fill's transaction holds (≈ 1.5 MB encoded), past the first port
/// that reaches it. Without a cap the doubling made the last transactions of a 30k × 4 fill
/// 64k and 131k elements, ≈ 8.6 MB alive together at the first sync's peak; at this size the
/// per-transaction costs (`BATCH_BEGIN`/`END`, one commit of an unhooked table) stay noise
/// (docs/benchmarks.md, "The first sync's peak RSS").
pub(crate) const MAX_FILL_ELEMENTS: usize = 32 * 1024;

/// Transactions encoded ahead of the one the kernel is committing. One is enough to keep both
/// sides busy; each holds at most [`MAX_FILL_ELEMENTS`], so no more.
const ENCODED_AHEAD: usize = 1;

/// The transactions of a cold fill, cut as the module says.
#[derive(Debug)]
pub struct FillBatches {
    /// The batch elements go to now.
    pub current: ElementBatch,
    /// Elements in the batches already cut.
    sent: usize,
}

impl FillBatches {
    /// An empty fill of `table` of `family`.
    pub fn new(family: Family, table: &str) -> Result<FillBatches, NetlinkError> {
        Ok(FillBatches {
            current: ElementBatch::new(family, table)?,
            sent: 0,
        })
    }

    /// Called after each Service port's elements (and the node's): the transaction to commit
    /// now, when the current one would at least double what the earlier ones put in the table,
    /// or holds [`MAX_FILL_ELEMENTS`].
    pub fn owner_done(
        &mut self,
        family: Family,
        table: &str,
    ) -> Result<Option<ElementBatch>, NetlinkError> {
        let adds = self.current.adds();
        if adds < FIRST_FILL_ELEMENTS.max(self.sent).min(MAX_FILL_ELEMENTS) {
            return Ok(None);
        }
        let next = ElementBatch::new(family, table)?;
        self.sent += adds;
        Ok(Some(std::mem::replace(&mut self.current, next)))
    }

    /// Elements added over all batches.
    pub fn adds(&self) -> usize {
        self.sent + self.current.adds()
    }

    /// The last batch: `None` when it is empty and earlier ones were cut.
    pub fn finish(self) -> Option<ElementBatch> {
        (!self.current.is_empty() || self.sent == 0).then_some(self.current)
    }
}

/// A cut transaction on its way to the thread that commits it.
struct Queued {
    batch: ElementBatch,
    /// How many elements the fill emitted before this batch (to name a rejected element).
    first: usize,
}

/// Why the committing thread stopped.
struct CommitFailure {
    error: NetlinkError,
    /// The rejected element's position in the fill's sequence, when the kernel named one.
    element: Option<usize>,
}

/// What the encoding side of a cold fill ended with.
#[derive(Default)]
struct Produced {
    store: ElementStore,
    ops: usize,
    /// An element could not be encoded, or a chain not created: the first such error.
    failed: Option<String>,
    /// Two Service ports claim an element differently: only the collected path resolves it.
    superseded: bool,
}

/// Commits the queued transactions in order until the queue closes or one fails; returning
/// drops the receiver, which stops the encoding side at its next send.
fn commit_queued(
    writer: &mut dyn ElementWriter,
    queue: Receiver<Queued>,
) -> Result<(), CommitFailure> {
    for Queued { batch, first } in queue {
        let rejected = Cell::new(None);
        let describe = |op: Operation, n: usize| {
            if op == Operation::Add {
                rejected.set(Some(first + n));
            }
            None
        };
        writer
            .commit(batch, &describe)
            .map_err(|error| CommitFailure {
                error,
                element: rejected.get(),
            })?;
    }
    Ok(())
}

impl NftBackend {
    /// Fills a table that was just created: the skeleton first, then the elements in the
    /// transactions [`FillBatches`] cuts, committed by a second thread while this one encodes
    /// the next. The kernel's inserts are about two thirds of a cold sync and building and
    /// encoding the elements one third, so on two CPUs the two overlap instead of adding up.
    /// `None` as [`NftBackend::streamed_full`]: conflicting elements; the table is then
    /// replaced whole by the collected path, whatever was committed of it.
    pub(crate) fn cold_fill(
        &mut self,
        index: usize,
        snapshot: &Snapshot,
        cfg: &StaticConfig,
    ) -> Option<(Result<(), String>, ElementStore, usize)> {
        let fam = self.states[index].fam;
        let (without_hooks, hooks) = script::replace_in_two(fam, &self.config.table, cfg);
        if let Err(e) = self.exec.run_full(&without_hooks) {
            return Some((Err(e.to_string()), ElementStore::new(), 0));
        }
        self.states[index].chains.clear();
        let Some(mut writer) = self.netlink.take() else {
            return Some((Err("no netlink writer".into()), ElementStore::new(), 0));
        };
        let (produced, committed) = std::thread::scope(|scope| {
            // Made inside the scope: if the encoding side panicked, unwinding drops the sender
            // before the scope waits for the committer, which then stops instead of waiting.
            let (queue, received) = sync_channel::<Queued>(ENCODED_AHEAD);
            let committing = std::thread::Builder::new()
                .name("kpng-nft-fill".into())
                .spawn_scoped(scope, || commit_queued(writer.as_mut(), received));
            match committing {
                Ok(handle) => {
                    let produced = self.produce_cold(index, snapshot, |q| queue.send(q).is_ok());
                    drop(queue);
                    let committed = handle.join().unwrap_or_else(|_| {
                        Err(CommitFailure {
                            error: NetlinkError::Protocol("the fill thread panicked".into()),
                            element: None,
                        })
                    });
                    (Some(produced), committed)
                }
                // Nothing was sent: the retry finds the skeleton and refills it in one
                // transaction, on this thread.
                Err(e) => (
                    None,
                    Err(CommitFailure {
                        error: NetlinkError::Io {
                            context: "starting the fill thread".into(),
                            source: e,
                        },
                        element: None,
                    }),
                ),
            }
        });
        self.netlink = Some(writer);
        let produced = produced.unwrap_or_default();
        if produced.superseded && committed.is_ok() {
            debug!("conflicting elements: full sync through the collected path");
            return None;
        }
        let result = match (committed, produced.failed) {
            (Err(failure), _) => Err(self.describe_failure(fam, snapshot, failure)),
            (Ok(()), Some(message)) => Err(message),
            // Complete: hook it in (one validation of the table), with its final marker.
            (Ok(()), None) => self.exec.run(&hooks).map_err(|e| e.to_string()),
        };
        Some((result, produced.store, produced.ops))
    }

    /// Builds and encodes a cold fill's elements port by port, creating the chains each
    /// transaction refers to before handing it to `deliver` (false: the committer stopped).
    fn produce_cold(
        &mut self,
        index: usize,
        snapshot: &Snapshot,
        mut deliver: impl FnMut(Queued) -> bool,
    ) -> Produced {
        let fam = self.states[index].fam;
        let table = self.config.table.clone();
        let mut produced = Produced::default();
        let mut fill = match FillBatches::new(fam.0, &table) {
            Ok(fill) => fill,
            Err(e) => {
                produced.failed = Some(e.to_string());
                return produced;
            }
        };
        let node_ips = snapshot.node.ips.clone();
        let mut chains = BTreeSet::new();
        self.states[index].chain_refs = Default::default();
        let mut first = 0;
        let mut ports = snapshot.family(fam.0);
        let (mut going, mut node_done) = (true, false);
        while going && !node_done {
            let (owner, elements) = match ports.next() {
                Some(port) => self.owner_with_elements(port, &node_ips),
                None => {
                    node_done = true;
                    (NODE_OWNER, self.node_elements(fam, snapshot))
                }
            };
            for e in elements {
                match produced.store.build_one(owner, &e) {
                    store::Built::Emit => {
                        chains.extend(script::referenced_chain(&e));
                        self.states[index].chain_refs.add(&e);
                        if let Err(err) = fill.current.add(&e) {
                            produced.failed.get_or_insert(err.to_string());
                        }
                    }
                    store::Built::Skip => {}
                    store::Built::Supersede => produced.superseded = true,
                }
            }
            going = produced.failed.is_none() && !produced.superseded;
            match fill.owner_done(fam.0, &table) {
                _ if !going => {}
                Ok(None) => {}
                Ok(Some(batch)) => {
                    let handed =
                        self.hand_over(index, batch, &mut chains, &mut first, &mut deliver);
                    going = handed.unwrap_or_else(|e| {
                        produced.failed = Some(e);
                        false
                    });
                }
                Err(err) => {
                    produced.failed = Some(err.to_string());
                    going = false;
                }
            }
        }
        produced.ops = fill.adds();
        if going
            && let Some(batch) = fill.finish()
            && let Err(e) = self.hand_over(index, batch, &mut chains, &mut first, &mut deliver)
        {
            produced.failed = Some(e);
        }
        produced
    }

    /// Creates the chains `batch` refers to (`chains`, emptied) that do not exist yet, then
    /// hands it to `deliver`: `Ok(false)` when the committer has stopped (it says why).
    fn hand_over(
        &mut self,
        index: usize,
        batch: ElementBatch,
        chains: &mut BTreeSet<DynamicChain>,
        first: &mut usize,
        deliver: &mut impl FnMut(Queued) -> bool,
    ) -> Result<bool, String> {
        self.ensure_chains(index, std::mem::take(chains).into_iter())?;
        let adds = batch.adds();
        let delivered = deliver(Queued {
            batch,
            first: *first,
        });
        *first += adds;
        Ok(delivered)
    }

    /// The error of a failed cold-fill transaction, naming the element the kernel rejected.
    fn describe_failure(&self, fam: Fam, snapshot: &Snapshot, failure: CommitFailure) -> String {
        let mut error = failure.error;
        if let NetlinkError::Rejected { element, .. } = &mut error
            && element.is_none()
            && let Some(n) = failure.element
        {
            *element = self.nth_full_element(fam, snapshot, n);
        }
        error.to_string()
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
    fn cut(owners: u32, per_owner: u32) -> Vec<usize> {
        let mut fill = FillBatches::new(Family::V4, "kpng").expect("batch");
        let mut sizes = Vec::new();
        for o in 0..owners {
            for e in 0..per_owner {
                fill.current.add(&element(o * per_owner + e)).expect("add");
            }
            if let Some(batch) = fill.owner_done(Family::V4, "kpng").expect("cut") {
                sizes.push(batch.adds());
            }
        }
        assert_eq!(fill.adds(), (owners * per_owner) as usize);
        sizes.extend(fill.finish().as_ref().map(ElementBatch::adds));
        sizes
    }

    #[test]
    fn a_cold_fill_is_cut_at_port_boundaries_each_at_most_doubling_the_table() {
        let sizes = cut(30_000, 11);
        assert_eq!(sizes.iter().sum::<usize>(), 330_000);
        assert!(sizes.len() >= 4 && sizes.len() <= 12, "{sizes:?}");
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

    /// The transactions alive at once are part of the first sync's peak RSS: none may grow
    /// with the table past the cap (plus the port that reached it).
    #[test]
    fn no_cold_fill_transaction_holds_more_than_the_cap() {
        for (owners, per_owner) in [(30_000, 11), (100_000, 6), (5_000, 200)] {
            let sizes = cut(owners, per_owner);
            let largest = sizes.iter().copied().max().unwrap_or(0);
            assert!(
                largest < MAX_FILL_ELEMENTS + per_owner as usize,
                "{owners} × {per_owner}: {sizes:?}"
            );
        }
    }

    #[test]
    fn a_small_cold_fill_is_one_transaction() {
        assert_eq!(cut(100, 11), vec![1_100]);
        assert_eq!(cut(0, 11), vec![0]);
    }
}
