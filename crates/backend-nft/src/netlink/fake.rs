//! A fake [`ElementWriter`] that records what it would send.
//!
//! Why: the backend's netlink path must be testable without root. The fake encodes and frames
//! every batch exactly as [`super::NetlinkWriter`] does (so encoding errors surface the same
//! way) and keeps the result instead of sending it.

use std::sync::{Arc, Mutex};

use kpng_model::Family;

use crate::sets::Set;
use crate::store::Element;
use crate::value::Key;

use super::batch::{ElementBatch, MsgInfo, Operation};
use super::encode::encode_fields;
use super::error::NetlinkError;
use super::{ElementWriter, ProbedTable};

/// The chain names a [`RecordingWriter`] answers, per family.
pub type ChainsPerFamily = Vec<(Family, Vec<String>)>;

/// The elements a [`RecordingWriter`] says a set holds: family, set, keys.
pub type SetKeys = Vec<(Family, Set, Vec<Key>)>;

/// One transaction the fake writer received.
#[derive(Debug, Clone)]
pub struct RecordedBatch {
    /// The table's family.
    pub family: Family,
    /// The table.
    pub table: String,
    /// Elements deleted.
    pub deletes: usize,
    /// Elements added.
    pub adds: usize,
    /// The messages between `BATCH_BEGIN` and `BATCH_END`, in order.
    pub messages: Vec<MsgInfo>,
    /// The whole datagram, as it would be sent.
    pub datagram: Vec<u8>,
}

impl RecordedBatch {
    /// The sets the transaction flushes, in order.
    pub fn flushed(&self) -> Vec<Set> {
        self.messages
            .iter()
            .filter(|m| m.op == Operation::Flush)
            .map(|m| m.set)
            .collect()
    }
}

/// A recorder for tests: keeps every batch, can be told to fail, and answers the table probe
/// with a scripted table. Clones share their state, so a test keeps one to inspect.
#[derive(Debug, Clone, Default)]
pub struct RecordingWriter {
    /// Every transaction committed, in order (failed ones included).
    pub batches: Arc<Mutex<Vec<RecordedBatch>>>,
    /// When set, the next commits fail with this message.
    pub fail_with: Arc<Mutex<Option<String>>>,
    /// What [`ElementWriter::probe_table`] answers per family ([`ProbedTable::Absent`] for a
    /// family not listed).
    pub tables: Arc<Mutex<Vec<(Family, ProbedTable)>>>,
    /// What [`ElementWriter::chain_names`] answers per family (`None` for a family not
    /// listed: the fake cannot tell).
    pub chains: Arc<Mutex<ChainsPerFamily>>,
    /// How many times [`ElementWriter::chain_names`] was asked (the table's chains listed).
    pub chain_listings: Arc<Mutex<usize>>,
    /// What [`ElementWriter::set_keys`] answers, encoded as the kernel would hold the keys
    /// (`None` for a set not listed: missing).
    pub sets: Arc<Mutex<SetKeys>>,
    /// How many times [`ElementWriter::set_keys`] was asked.
    pub set_listings: Arc<Mutex<usize>>,
    /// What [`ElementWriter::set_elements`] answers: every element of a family's table, in
    /// the form a dump reads back ([`super::content::kernel_form`]); a family not listed:
    /// cannot tell (`false`).
    pub contents: Arc<Mutex<Contents>>,
    /// Elements [`ElementWriter::set_elements`] answers besides `contents`, as a dump reads
    /// them (a catch-all, a protocol kpng never writes): family, set, element.
    pub held_extra: Arc<Mutex<HeldExtra>>,
    /// How many times [`ElementWriter::set_elements`] was asked.
    pub element_listings: Arc<Mutex<usize>>,
}

/// The typed elements a [`RecordingWriter`]'s table holds, per family.
pub type Contents = Vec<(Family, Vec<Element>)>;

/// Raw elements a [`RecordingWriter`]'s sets hold: family, set, the element as dumped.
pub type HeldExtra = Vec<(Family, Set, kpng_netfilter::elements::Element)>;

impl RecordingWriter {
    /// A copy of the recorded batches.
    pub fn recorded(&self) -> Vec<RecordedBatch> {
        self.batches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl ElementWriter for RecordingWriter {
    fn commit(
        &mut self,
        batch: ElementBatch,
        _describe: &dyn Fn(Operation, usize) -> Option<String>,
    ) -> Result<(), NetlinkError> {
        if batch.is_empty() {
            return Ok(());
        }
        let (family, table) = (batch.family(), batch.table().to_string());
        let (deletes, adds) = (batch.deletes(), batch.adds());
        let framed = batch.frame(1);
        self.batches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(RecordedBatch {
                family,
                table,
                deletes,
                adds,
                messages: framed.msgs,
                datagram: framed.parts.concat(),
            });
        match self
            .fail_with
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            Some(message) => Err(NetlinkError::Injected(message)),
            None => Ok(()),
        }
    }

    fn probe_table(&mut self, family: Family, _table: &str) -> ProbedTable {
        self.tables
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(f, _)| *f == family)
            .map_or(ProbedTable::Absent, |(_, t)| t.clone())
    }

    fn chain_names(&mut self, family: Family, _table: &str) -> Option<Vec<String>> {
        *self
            .chain_listings
            .lock()
            .unwrap_or_else(|e| e.into_inner()) += 1;
        self.chains
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(f, _)| *f == family)
            .map(|(_, names)| names.clone())
    }

    fn set_elements(
        &mut self,
        family: Family,
        _table: &str,
        set: Set,
        each: &mut dyn FnMut(&kpng_netfilter::elements::Element),
    ) -> bool {
        *self
            .element_listings
            .lock()
            .unwrap_or_else(|e| e.into_inner()) += 1;
        let contents = self.contents.lock().unwrap_or_else(|e| e.into_inner());
        let Some((_, elements)) = contents.iter().find(|(f, _)| *f == family) else {
            return false;
        };
        let mut held = kpng_netfilter::elements::Element::default();
        for e in elements.iter().filter(|e| e.set == set) {
            let Ok(end) = super::content::kernel_form(family, e, &mut held) else {
                return false;
            };
            each(&held);
            if let Some(end) = end {
                each(&end);
            }
        }
        let extra = self.held_extra.lock().unwrap_or_else(|e| e.into_inner());
        for (_, _, e) in extra.iter().filter(|(f, s, _)| *f == family && *s == set) {
            each(e);
        }
        true
    }

    fn set_keys(
        &mut self,
        family: Family,
        _table: &str,
        set: Set,
        each: &mut dyn FnMut(&[u8]),
    ) -> bool {
        *self.set_listings.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        let decl = set.decl();
        let sets = self.sets.lock().unwrap_or_else(|e| e.into_inner());
        let Some((_, _, keys)) = sets.iter().find(|(f, s, _)| *f == family && *s == set) else {
            return false;
        };
        for key in keys {
            match encode_fields(decl.key, &key.fields(), family, false) {
                Ok((bytes, _)) => each(bytes.as_slice()),
                Err(_) => return false,
            }
        }
        true
    }
}
