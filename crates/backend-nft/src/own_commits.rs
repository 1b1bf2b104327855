//! Counting kpng's own committed transactions, so that someone else's commit during a sync of
//! kpng's can be told apart by the kernel's generation id (see
//! `kpng_netfilter::generation`).
//!
//! Why wrappers: kpng commits through nft text ([`NftExec`]: libnftables or an `nft -f -`
//! child) and netlink element batches ([`ElementWriter`], the fill thread's included). Each
//! successful call is one committed transaction, which moves the generation id by one; a refused
//! one moves nothing and is not counted. Counting a transaction that changed nothing (which does
//! not move the id) can only hide someone else's commit, never invent one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kpng_model::Family;

use crate::exec::{ExecError, NftExec};
use crate::netlink::{ElementBatch, ElementWriter, NetlinkError, Operation, ProbedTable};

/// The counts of kpng's own commits, shared by the wrappers.
#[derive(Debug, Clone, Default)]
pub struct OwnCommits {
    /// Text transactions (they change rules and chains).
    text: Arc<AtomicU64>,
    /// Element batches.
    elements: Arc<AtomicU64>,
}

/// The counts at one moment ([`OwnCommits::now`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counted {
    /// Text transactions.
    pub text: u64,
    /// Element batches.
    pub elements: u64,
}

impl Counted {
    /// The commits since `before`.
    pub fn since(self, before: Counted) -> Counted {
        Counted {
            text: self.text.wrapping_sub(before.text),
            elements: self.elements.wrapping_sub(before.elements),
        }
    }

    /// All of them.
    pub fn total(self) -> u64 {
        self.text.wrapping_add(self.elements)
    }
}

impl OwnCommits {
    /// The counts now.
    pub fn now(&self) -> Counted {
        Counted {
            text: self.text.load(Ordering::SeqCst),
            elements: self.elements.load(Ordering::SeqCst),
        }
    }

    /// Wraps `exec` so that its commits are counted.
    pub fn exec(&self, exec: Box<dyn NftExec>) -> Box<dyn NftExec> {
        Box::new(CountingExec {
            inner: exec,
            count: self.text.clone(),
        })
    }

    /// Wraps `writer` so that its commits are counted.
    pub fn writer(&self, writer: Box<dyn ElementWriter>) -> Box<dyn ElementWriter> {
        Box::new(CountingWriter {
            inner: writer,
            count: self.elements.clone(),
        })
    }
}

struct CountingExec {
    inner: Box<dyn NftExec>,
    count: Arc<AtomicU64>,
}

impl NftExec for CountingExec {
    fn run(&mut self, script: &str) -> Result<(), ExecError> {
        self.inner.run(script)?;
        self.count.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn run_full(&mut self, script: &str) -> Result<(), ExecError> {
        self.inner.run_full(script)?;
        self.count.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

struct CountingWriter {
    inner: Box<dyn ElementWriter>,
    count: Arc<AtomicU64>,
}

impl ElementWriter for CountingWriter {
    fn commit(
        &mut self,
        batch: ElementBatch,
        describe: &dyn Fn(Operation, usize) -> Option<String>,
    ) -> Result<(), NetlinkError> {
        // An empty batch is not sent: no transaction.
        let counts = !batch.is_empty();
        self.inner.commit(batch, describe)?;
        if counts {
            self.count.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }

    fn probe_table(&mut self, family: Family, table: &str) -> ProbedTable {
        self.inner.probe_table(family, table)
    }

    fn check_marker(&mut self, family: Family, table: &str) -> Option<ProbedTable> {
        self.inner.check_marker(family, table)
    }

    fn chain_names(&mut self, family: Family, table: &str) -> Option<Vec<String>> {
        self.inner.chain_names(family, table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::Recorder;

    #[test]
    fn successful_commits_are_counted_by_kind() {
        let own = OwnCommits::default();
        let before = own.now();
        let mut exec = own.exec(Box::new(Recorder::default()));
        exec.run("add table ip kpng").expect("run");
        exec.run_full("add table ip kpng").expect("run");
        assert_eq!(
            own.now().since(before),
            Counted {
                text: 2,
                elements: 0
            }
        );
        assert_eq!(own.now().since(before).total(), 2);
    }
}
