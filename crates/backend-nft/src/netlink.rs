//! Writing set and map elements straight over netlink (`NETLINK_NETFILTER`), without the nft
//! language.
//!
//! Why: all per-Service state lives in elements of a fixed set of named sets and maps
//! ([`crate::sets`]), and sending them as nft text makes nft parse, evaluate and linearise
//! every element: at 300k elements the parse alone dominates a full load. Elements are just
//! bytes to the kernel, and the layout of every set is fixed by its declaration, so this module
//! encodes the typed elements that [`crate::elements`] produces ([`crate::value`]) into
//! `NFT_MSG_NEWSETELEM` / `NFT_MSG_DELSETELEM` messages itself. No text is parsed: the bytes
//! come from the typed fields, laid out by the same [`crate::sets::SetDecl`] that renders the
//! skeleton's declaration. The kernel checks key and value lengths against the set, so a
//! declaration that disagreed with the kernel's set would fail loudly (`EINVAL`).
//!
//! How, by concern:
//! - [`ElementWriter`]: what the backend needs, one atomic transaction per call. Implemented by
//!   [`NetlinkWriter`] (the kernel) and by [`RecordingWriter`] (a fake for tests, which
//!   encodes and frames exactly the same bytes and needs no privilege);
//! - `kpng_netfilter::attr`: netlink message and attribute encoding, ACK parsing;
//! - `encode`: typed value → bytes (byte orders, padding, interval start/end);
//! - `batch`: [`ElementBatch`], elements packed into messages framed in place, one datagram
//!   (`NFNL_MSG_BATCH_BEGIN` … `END`, hence one kernel transaction);
//! - `kernel`: sending it and reading one ACK per message (extended ACKs name the element);
//! - [`monitor`]: watching our tables for changes made by others (nf_tables notifications);
//!   like the raw `AF_NETLINK` socket and the attribute framing, it lives in `kpng-netfilter`,
//!   below the backends, where the unsafe code is;
//! - `error`: [`NetlinkError`], [`EncodeError`].
//!
//! Why not `netlink-packet-netfilter` (already used by `kpng-conntrack`): its nftables types
//! build an owned attribute tree per element (several `Vec`s each) and emit whole messages,
//! while this path frames 300k elements in place into 1 MB buffers, one Service port at a time,
//! and must know each element's byte offset to map an extended ACK back to it.

mod batch;
pub mod content;
pub mod decode;
mod encode;
mod error;
mod fake;
mod kernel;

use kpng_model::Family;

use crate::sets::Set;
use crate::store::Element;
use crate::value::Key;

pub use batch::{ElementBatch, Framed, MsgInfo, Operation};
pub use error::{EncodeError, NetlinkError};
pub use fake::{HeldExtra, RecordedBatch, RecordingWriter, SetKeys};
pub use kernel::NetlinkWriter;
/// The table monitor lives in `kpng-netfilter`, shared with the userspace capture.
pub use kpng_netfilter::monitor;

/// What a start-up probe found of our table in the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbedTable {
    /// No such table.
    Absent,
    /// A table whose skeleton marker ([`crate::ruleset::MARKER_CHAIN`]'s comment) is this;
    /// empty when it has none or it could not be read.
    Present(String),
}

/// Writes set and map elements of our tables, one atomic transaction per call.
///
/// Why a trait: the backend's netlink path (streamed full syncs, adoption of an existing
/// table, partial syncs) is then testable without root, against [`RecordingWriter`].
pub trait ElementWriter: Send {
    /// Sends `batch` as one transaction. `describe(operation, index)` names the element the
    /// kernel rejected (the index counts the batch's deletes or adds in the order they were
    /// given), for the error message. On any error nothing of the batch was applied.
    fn commit(
        &mut self,
        batch: ElementBatch,
        describe: &dyn Fn(Operation, usize) -> Option<String>,
    ) -> Result<(), NetlinkError>;

    /// Applies one atomic transaction to table `table` of `family`: first flushes every set in
    /// `flush`, then deletes `deletes`, then adds `adds`. Deleting and re-adding a key in one
    /// call replaces its value atomically. Adding an element that exists with the same value is
    /// not an error (nft's `add element`); with another value it is (`EEXIST`); deleting a
    /// missing one is (`ENOENT`). On any error the kernel applied nothing, and the error names
    /// the first failing set and, when the kernel points at one, the element.
    fn apply(
        &mut self,
        family: Family,
        table: &str,
        flush: &[Set],
        deletes: &[(Set, Key)],
        adds: &[Element],
    ) -> Result<(), NetlinkError> {
        let batch = ElementBatch::of(family, table, flush, deletes, adds)?;
        self.commit(batch, &|op, i| match op {
            Operation::Delete => deletes.get(i).map(|(_, key)| key.to_string()),
            _ => adds
                .get(i)
                .map(|e| batch::describe(&e.key, e.value.as_ref())),
        })
    }

    /// Reads our table's skeleton marker (start-up only), to know whether the table can be
    /// adopted by replacing elements only. By default over netlink: one table dump and one
    /// chain, under a millisecond whatever the table holds.
    fn probe_table(&mut self, family: Family, table: &str) -> ProbedTable {
        probe_with_netlink(family, table)
    }

    /// Reads our table's skeleton marker again after kpng committed it, to confirm that it is
    /// still there (after a repair, and at every periodic sync): `None` when this writer cannot
    /// tell (fakes that do not model the kernel), which confirms nothing and repairs nothing.
    ///
    /// Why a second method beside [`ElementWriter::probe_table`]: the steady-state loop must
    /// stay cheap, so this is a single chain request (`NFT_MSG_GETCHAIN` of the marker chain:
    /// a missing table and a missing chain both answer `ENOENT`), never a table dump.
    fn check_marker(&mut self, _family: Family, _table: &str) -> Option<ProbedTable> {
        None
    }

    /// The names of every chain of our table (one chain dump: no rule or element is read), for
    /// the full syncs that adopt a table, which then delete the dynamic chains it holds that no
    /// element refers to (a previous run's, a refused delete's, someone's). Never called by
    /// partial or periodic syncs. `None` when this writer cannot tell (fakes that do not model
    /// the kernel, a failed dump): the chains kpng knows of are then all it deletes.
    fn chain_names(&mut self, _family: Family, _table: &str) -> Option<Vec<String>> {
        None
    }

    /// Calls `each` with the key of every element of one set of our table, as the kernel holds
    /// it (one element dump, not collected: the dynamic affinity map may hold a million
    /// entries), read once at start-up to learn the affinity ids of the table kpng adopts (the
    /// `affinity-bits-*` sets and the affinity map). Never called by the sync loop. `false`
    /// when the set is missing, the dump failed (`each` may have seen part of it), or this
    /// writer cannot tell (fakes that do not model the kernel): the ids are then allocated
    /// afresh.
    fn set_keys(
        &mut self,
        _family: Family,
        _table: &str,
        _set: Set,
        _each: &mut dyn FnMut(&[u8]),
    ) -> bool {
        false
    }

    /// Calls `each` with every element of one set of our table as the kernel holds it (key,
    /// verdict or value, comment; one element dump, not collected), read once at the first
    /// full sync of a process that adopts a table with its own skeleton, to send only what
    /// differs instead of flushing and refilling every set. Never called by the sync loop.
    /// `false` when the set is missing, the dump failed (`each` may have seen part of it), or
    /// this writer cannot tell: that sync then flushes and refills.
    fn set_elements(
        &mut self,
        _family: Family,
        _table: &str,
        _set: Set,
        _each: &mut dyn FnMut(&kpng_netfilter::elements::Element),
    ) -> bool {
        false
    }
}

/// [`ElementWriter::set_keys`] over netlink: one `NFT_MSG_GETSETELEM` dump of the set. A
/// missing set or a failed dump is `false`.
pub fn set_keys_with_netlink(
    family: Family,
    table: &str,
    set: Set,
    each: &mut dyn FnMut(&[u8]),
) -> bool {
    let f = crate::ruleset::Fam(family).table_family();
    match kpng_netfilter::elements::each_set_element(f, table, set.name(), |e| each(&e.key)) {
        Ok(found) => found,
        Err(e) => {
            tracing::debug!("cannot list the set {f} {table} {}: {e}", set.name());
            false
        }
    }
}

/// [`ElementWriter::set_elements`] over netlink: one `NFT_MSG_GETSETELEM` dump of the set. A
/// missing set or a failed dump is `false`.
pub fn set_elements_with_netlink(
    family: Family,
    table: &str,
    set: Set,
    each: &mut dyn FnMut(&kpng_netfilter::elements::Element),
) -> bool {
    let f = crate::ruleset::Fam(family).table_family();
    match kpng_netfilter::elements::each_set_element(f, table, set.name(), |e| each(&e)) {
        Ok(found) => found,
        Err(e) => {
            tracing::debug!("cannot list the set {f} {table} {}: {e}", set.name());
            false
        }
    }
}

/// [`ElementWriter::chain_names`] over netlink: one chain dump of the table. A failed dump is
/// `None` (nothing is deleted on its account).
pub fn chain_names_with_netlink(family: Family, table: &str) -> Option<Vec<String>> {
    let f = crate::ruleset::Fam(family).table_family();
    match kpng_netfilter::tables::chain_names(f, table) {
        Ok(names) => Some(names),
        Err(e) => {
            tracing::debug!("cannot list the chains of nftables table {f} {table}: {e}");
            None
        }
    }
}

/// [`ElementWriter::check_marker`] over netlink: one `NFT_MSG_GETCHAIN` of the marker chain.
/// An unreadable answer is `None` (nothing is concluded from it).
pub fn check_with_netlink(family: Family, table: &str) -> Option<ProbedTable> {
    let f = crate::ruleset::Fam(family).table_family();
    match kpng_netfilter::tables::chain_comment(f, table, crate::ruleset::MARKER_CHAIN) {
        Ok(Some(marker)) => Some(ProbedTable::Present(marker)),
        Ok(None) => Some(ProbedTable::Absent),
        Err(e) => {
            tracing::debug!("cannot read the nftables chain {f} {table} skeleton: {e}");
            None
        }
    }
}

/// [`ElementWriter::probe_table`] through a netlink table dump and a chain request
/// (`kpng_netfilter::tables`).
///
/// Not `nft -t list table`: nft 1.0.6 reads every set element before it prints even an
/// element-less listing, 2.5 s and ≈ 440 MB at 30k Services × 4, on every restart.
pub fn probe_with_netlink(family: Family, table: &str) -> ProbedTable {
    let f = crate::ruleset::Fam(family).table_family();
    let marker = kpng_netfilter::tables::find_table(f, table).and_then(|found| match found {
        None => Ok(None),
        Some(_) => kpng_netfilter::tables::chain_comment(f, table, crate::ruleset::MARKER_CHAIN)
            .map(|c| Some(c.unwrap_or_default())),
    });
    match marker {
        Ok(Some(marker)) => ProbedTable::Present(marker),
        Ok(None) => ProbedTable::Absent,
        Err(e) => {
            tracing::warn!("cannot read the nftables table {f} {table}: {e}; replacing it");
            ProbedTable::Present(String::new())
        }
    }
}
