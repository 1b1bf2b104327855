//! The first full sync of a process over a table it adopts with its own skeleton: read what
//! the table's sets hold, once, and send only what differs, in one transaction.
//!
//! Why: the refill that adopting a table meant before (flush every set, add every element, in
//! one transaction) is ~344k operations at 30k Services × 4 endpoints, though after a plain
//! restart almost nothing differs. The kernel runs that transaction inside one `sendmsg`
//! (0.2–0.5 s on a `PREEMPT_NONE` kernel), and when any process on the host listens for
//! nftables notifications it builds one per element: ~6.5 s of kernel CPU, which a 100m CPU
//! limit stretches to over a minute of throttling (`docs/deploy.md`, "Sizing").
//!
//! How, without holding every element twice: the wanted elements are generated once to build
//! the store and remember each one's content hash (16 bytes apiece,
//! [`crate::netlink::content`]); each owned set is dumped once, a held element whose hash is
//! wanted is crossed off and any other is deleted by its key as it streams by; the elements
//! are generated a second time and those not crossed off are added. The interval sets
//! (`service-cidrs`, `firewall-allow`), whose ranges a dump returns in pieces, are compared
//! whole: one that differs at all is flushed and refilled in the same transaction.
//!
//! Falls back to the flush and refill (`None`) when a dump fails, a held element cannot be
//! decoded (a catch-all, a protocol kpng never writes), two owners disagree about an element,
//! or the difference is more than half the wanted elements (then the refill costs about as
//! much). Never used after the first full sync: the sync loop does not read elements.

use std::collections::{BTreeSet, HashSet};
use std::time::Instant;

use tracing::{debug, info};

use crate::netlink::content::{self, Contents};
use crate::netlink::{self, ElementBatch};
use crate::ruleset::Fam;
use crate::sets::{Interval, Set};
use crate::store::{self, ElementStore};
use crate::value::Key;
use crate::{Adopt, NftBackend, chain_refs, script};
use kpng_model::Snapshot;

/// What the start-up read found, for the log line and the fallback decision.
#[derive(Debug, Default)]
struct Read {
    /// Held elements that are wanted as they are.
    kept: usize,
    /// Held elements that cannot be decoded (nothing is decided on a table that has them).
    odd: usize,
    /// Matches in the range set being read.
    kept_in_range: usize,
    /// The range set being read holds an element that is not wanted.
    range_differs: bool,
    /// Most deletes worth sending (half the wanted elements).
    bound: usize,
    /// The deletes passed the bound.
    over: bool,
}

impl NftBackend {
    /// [`crate::NftBackend::streamed_full`]'s path for the first full sync of a table adopted
    /// as it is ([`Adopt::Sets`]): `None` to fall back to the flush and refill.
    pub(crate) fn diffed_refill(
        &mut self,
        index: usize,
        snapshot: &Snapshot,
        cfg: &crate::ruleset::StaticConfig,
    ) -> Option<(Result<(), String>, ElementStore, usize)> {
        let fam = self.states[index].fam;
        let table = self.config.table.clone();
        let started = Instant::now();
        // What is wanted: the store, the chains, each element's content hash.
        let mut store = ElementStore::new();
        let mut contents = Contents::new(fam.0);
        let mut wanted: HashSet<u128> = HashSet::new();
        let mut ranges: Vec<(Set, usize)> = Vec::new();
        let mut chains = BTreeSet::new();
        let mut refs = chain_refs::ChainRefs::default();
        let (mut superseded, mut unencodable) = (false, false);
        self.each_owner(fam, snapshot, |owner, elements| {
            for e in elements {
                match store.build_one(owner, &e) {
                    store::Built::Emit => {}
                    store::Built::Skip => continue,
                    store::Built::Supersede => {
                        superseded = true;
                        continue;
                    }
                }
                chains.extend(script::referenced_chain(&e));
                refs.add(&e);
                let Ok((start, end)) = contents.wanted(&e) else {
                    unencodable = true;
                    continue;
                };
                wanted.insert(start);
                wanted.extend(end);
                if e.set.decl().interval() != Interval::None {
                    let n = 1 + usize::from(end.is_some());
                    match ranges.iter_mut().find(|(s, _)| *s == e.set) {
                        Some((_, count)) => *count += n,
                        None => ranges.push((e.set, n)),
                    }
                }
            }
        });
        if superseded || unencodable {
            // The refill sorts conflicts out, and names an element that does not encode.
            return None;
        }
        let desired = wanted.len();
        let generated = started.elapsed();

        // The kernel's elements, each set once.
        let mut batch = ElementBatch::new(fam.0, &table).ok()?;
        let mut read = Read {
            bound: desired / 2,
            ..Read::default()
        };
        let mut refilled: Vec<Set> = Vec::new();
        for set in Set::owned(fam.0) {
            if !self.read_set(fam, set, &contents, &mut wanted, &mut batch, &mut read) {
                debug!(family = %fam.0, set = %set, "the start-up read of the set failed: refilling");
                return None;
            }
            if let Some(&(_, count)) = ranges.iter().find(|(s, _)| *s == set) {
                let matched = std::mem::take(&mut read.kept_in_range);
                if read.range_differs || matched != count {
                    batch.flush(set);
                    refilled.push(set);
                }
                read.range_differs = false;
            } else if set.decl().interval() != Interval::None {
                // Nothing of it is wanted: it must hold nothing.
                if read.range_differs || std::mem::take(&mut read.kept_in_range) > 0 {
                    batch.flush(set);
                }
                read.range_differs = false;
            }
            if read.odd > 0 || read.over {
                break;
            }
        }
        let read_took = started.elapsed() - generated;
        let missing = wanted.len();
        if read.odd > 0 || read.over || batch.deletes() + missing > desired / 2 {
            info!(
                family = %fam.0,
                undecodable = read.odd,
                deletes = batch.deletes(),
                missing,
                wanted = desired,
                "adopting the table: its sets differ too much from what is wanted (or hold \
                 elements kpng cannot read); flushing and refilling them"
            );
            return None;
        }

        // What is missing, generated again and added.
        let mut failed = None;
        let mut added_ranges: HashSet<u128> = HashSet::new();
        self.each_owner(fam, snapshot, |_, elements| {
            for e in elements {
                let Ok((start, _)) = contents.wanted(&e) else {
                    continue;
                };
                let add = if refilled.contains(&e.set) {
                    added_ranges.insert(start)
                } else {
                    wanted.remove(&start)
                };
                if add && let Err(err) = batch.add(&e) {
                    failed.get_or_insert(err.to_string());
                }
            }
        });
        let (deletes, adds) = (batch.deletes(), batch.adds());
        if let Some(message) = failed {
            return Some((Err(message), store, adds));
        }
        info!(
            family = %fam.0,
            kept = read.kept,
            deleted = deletes,
            added = adds,
            refilled = ?refilled.iter().map(|s| s.name()).collect::<Vec<_>>(),
            generate_ms = generated.as_millis() as u64,
            read_ms = read_took.as_millis() as u64,
            "adopting table {} {}: its sets read once; only what differs is sent, in one \
             transaction",
            fam.table_family(),
            table
        );
        self.states[index].chains.clear();
        self.states[index].chain_refs = refs;
        let result = self
            .adopt_rules(index, cfg, Adopt::Sets, chains)
            .and_then(|()| self.commit_diff(batch));
        Some((result, store, deletes + adds))
    }

    /// Dumps one owned set: a held element that is wanted is crossed off `wanted`; any other
    /// is deleted by its key (a range set's is only noted: the set is then refilled whole).
    /// `false` when the dump failed.
    fn read_set(
        &mut self,
        fam: Fam,
        set: Set,
        contents: &Contents,
        wanted: &mut HashSet<u128>,
        batch: &mut ElementBatch,
        read: &mut Read,
    ) -> bool {
        let Some(writer) = self.netlink.as_mut() else {
            return false;
        };
        let decl = set.decl();
        let range = decl.interval() != Interval::None;
        writer.set_elements(fam.0, &self.config.table, set, &mut |held| {
            if read.odd > 0 || read.over || range && content::is_zero_end(held) {
                return;
            }
            if wanted.remove(&contents.held(set, held)) {
                if range {
                    read.kept_in_range += 1;
                } else {
                    read.kept += 1;
                }
                return;
            }
            if range {
                read.range_differs = true;
                return;
            }
            let key = (held.flags == 0)
                .then(|| netlink::decode::key_fields(&decl, fam.0, &held.key))
                .flatten()
                .and_then(|fields| Key::from_fields(&fields));
            match key {
                Some(key) if batch.delete(set, &key).is_ok() => {
                    read.over = batch.deletes() > read.bound;
                }
                _ => read.odd += 1,
            }
        })
    }

    /// Sends the difference (one transaction). An element the kernel rejects is named by its
    /// set only: the retry, a flush and refill, names it.
    fn commit_diff(&mut self, batch: ElementBatch) -> Result<(), String> {
        let Some(writer) = self.netlink.as_mut() else {
            return Err("no netlink writer".into());
        };
        writer
            .commit(batch, &|_, _| None)
            .map_err(|e| e.to_string())
    }
}
