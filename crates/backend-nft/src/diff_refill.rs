//! A full sync over a table with kpng's own skeleton: read what the table's sets hold, once,
//! and send only what differs, in one transaction.
//!
//! Why: the refill such a full sync meant before (flush every set, add every element, in one
//! transaction) is ~344k operations at 30k Services × 4 endpoints, though after a plain
//! restart almost nothing differs, and after a repair only what someone else changed. The
//! kernel runs that transaction inside one `sendmsg` (0.2–0.5 s on a `PREEMPT_NONE` kernel),
//! and when any process on the host listens for nftables notifications it builds one per
//! element: ~6.5 s of kernel CPU, which a 100m CPU limit stretches to over a minute of
//! throttling (`docs/deploy.md`, "Sizing").
//!
//! When ([`Why`]): the first full sync of a process that adopts its earlier table
//! ([`Why::Adopting`]), a repair of someone else's change to a table that still carries this
//! skeleton's marker ([`Why::Repairing`]: an element added or deleted, a set flushed, a rule
//! changed; the rules are put back by text first, the set and map elements are diffed), and
//! every other full sync over it (`--full-sync-period`, a retry: [`Why::FullSync`]), one dump
//! per set each time, never in the sync loop. A table that is gone, or whose marker is not
//! this skeleton's, is created or replaced as before; a set that is gone fails its dump, and
//! the refill's text declares it again.
//!
//! How, without holding every element twice: the wanted elements are generated once to build
//! the store and remember each one's content hash (16 bytes apiece,
//! [`crate::netlink::content`]); each owned set is dumped once, a held element whose hash is
//! wanted is crossed off and any other is deleted by its key as it streams by; the elements
//! are generated a second time and those not crossed off are added. The interval sets
//! (`service-cidrs`, `firewall-allow`), whose ranges a dump returns in pieces, are compared
//! whole: one that differs at all is flushed and refilled in the same transaction.
//!
//! Falls back to the flush and refill (`Err` with the reason, which the caller logs) when a
//! dump fails, a held element cannot be decoded (a catch-all, a protocol kpng never writes),
//! two owners disagree about an element, or the difference is more than half the wanted
//! elements (then the refill costs about as much); and the full sync after one whose
//! difference the kernel refused flushes and refills without reading (it names the element).

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

/// Which full sync reads the table's sets, for its log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    /// The first full sync of a process, over the table an earlier run left.
    Adopting,
    /// The repair of someone else's change to the table.
    Repairing,
    /// Any other full sync over the table this process committed (`--full-sync-period`, a
    /// retry, a node change).
    FullSync,
}

impl Why {
    /// How the log lines begin: `adopting table ip kpng`.
    pub(crate) fn verb(self) -> &'static str {
        match self {
            Why::Adopting => "adopting",
            Why::Repairing => "repairing",
            Why::FullSync => "full sync of",
        }
    }
}

/// A full sync's outcome through [`NftBackend::diffed_refill`]: the result of its
/// transactions, the store it built, and the operations sent.
pub(crate) type Diffed = (Result<(), String>, ElementStore, usize);

impl NftBackend {
    /// [`crate::NftBackend::streamed_full`]'s path for a full sync over a table with this
    /// skeleton (`adopt`: [`Adopt::Sets`], or [`Adopt::RulesAndSets`] for a repair whose rules
    /// are put back first): `Err` with the reason to fall back to the flush and refill.
    pub(crate) fn diffed_refill(
        &mut self,
        index: usize,
        snapshot: &Snapshot,
        cfg: &crate::ruleset::StaticConfig,
        adopt: Adopt,
        why: Why,
    ) -> Result<Diffed, &'static str> {
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
        if superseded {
            // The refill sorts conflicts out.
            return Err("two Services want the same element");
        }
        if unencodable {
            // The refill names an element that does not encode.
            return Err("an element cannot be encoded");
        }
        let desired = wanted.len();
        let generated = started.elapsed();

        // The kernel's elements, each set once.
        let mut batch =
            ElementBatch::new(fam.0, &table).map_err(|_| "the table's name cannot be encoded")?;
        let mut read = Read {
            bound: desired / 2,
            ..Read::default()
        };
        let mut refilled: Vec<Set> = Vec::new();
        for set in Set::owned(fam.0) {
            if !self.read_set(fam, set, &contents, &mut wanted, &mut batch, &mut read) {
                debug!(family = %fam.0, set = %set, "reading the set failed: refilling");
                return Err("a set could not be read (gone, or not readable)");
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
                "{} table {} {}: its sets differ too much from what is wanted (or hold \
                 elements kpng cannot read)",
                why.verb(),
                fam.table_family(),
                table
            );
            return Err("its sets differ too much from what is wanted");
        }

        // What is missing, generated again and added; after a plain restart or in a quiet
        // hour nothing is, and the second pass (as long as the first) is skipped.
        let mut failed = None;
        let mut added_ranges: HashSet<u128> = HashSet::new();
        let nothing_missing = wanted.is_empty() && refilled.is_empty();
        if !nothing_missing {
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
        }
        let (deletes, adds) = (batch.deletes(), batch.adds());
        if let Some(message) = failed {
            return Ok((Err(message), store, adds));
        }
        info!(
            family = %fam.0,
            // `kept` is a rejection's boolean elsewhere: one name, one type in a JSON log.
            kept_count = read.kept,
            deleted = deletes,
            added = adds,
            refilled_count = refilled.len(),
            refilled_sets = %refilled.iter().map(|s| s.name()).collect::<Vec<_>>().join(","),
            generate_ms = generated.as_millis() as u64,
            read_ms = read_took.as_millis() as u64,
            "{} table {} {}: its sets read once; only what differs is sent, in one \
             transaction",
            why.verb(),
            fam.table_family(),
            table
        );
        self.states[index].chains.clear();
        self.states[index].chain_refs = refs;
        let result = self
            .adopt_rules(index, cfg, adopt, chains)
            .and_then(|()| self.commit_diff(batch));
        Ok((result, store, deletes + adds))
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
