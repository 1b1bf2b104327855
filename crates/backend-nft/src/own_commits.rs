//! Counting kpng's own committed transactions, so that someone else's commit during a sync of
//! kpng's can be told apart by the kernel's generation id (see
//! `kpng_netfilter::generation`).
//!
//! Why wrappers: kpng commits through nft text ([`NftExec`]: libnftables or an `nft -f -`
//! child) and netlink element batches ([`ElementWriter`], the fill thread's included). Each
//! successful call is one committed transaction, which moves the generation id by one; a refused
//! one moves nothing and is not counted. Counting a transaction that changed nothing (which does
//! not move the id) can only hide someone else's commit, never invent one.
//!
//! The text wrapper also records which chains kpng's own text changed ([`TouchedRules`]):
//! when someone else committed in the same window, only the other chains' rules are evidence
//! (kpng's own change moved the handles of the chains it wrote).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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
    /// What the text transactions changed since [`OwnCommits::take_touched`].
    touched: Arc<Mutex<TouchedRules>>,
}

/// The rules kpng's own text transactions changed: whole tables (replaced, flushed, deleted or
/// declared as a block) and single chains (added, flushed, deleted, or given rules).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TouchedRules {
    /// (family, table) whose every chain may have changed.
    tables: BTreeSet<(String, String)>,
    /// (family, table, chain) whose rules changed.
    chains: BTreeSet<(String, String, String)>,
}

impl TouchedRules {
    /// Notes what `script` (nft's text syntax, one command per line, as kpng writes it)
    /// changes. A table block (`table ip kpng {`) or `flush`/`delete table` touches the whole
    /// table; `add`/`create`/`flush`/`delete chain` and `add`/`insert`/`replace`/`delete rule`
    /// touch their chain; sets, maps and elements hold no rule.
    fn record(&mut self, script: &str) {
        for line in script.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["table", family, table, ..] | ["flush" | "delete", "table", family, table, ..] => {
                    self.tables.insert((family.to_string(), table.to_string()));
                }
                [
                    "add" | "create" | "flush" | "delete",
                    "chain",
                    family,
                    table,
                    chain,
                    ..,
                ]
                | [
                    "add" | "insert" | "replace" | "delete",
                    "rule",
                    family,
                    table,
                    chain,
                    ..,
                ] => {
                    self.chains
                        .insert((family.to_string(), table.to_string(), chain.to_string()));
                }
                _ => {}
            }
        }
    }

    /// Whether kpng's text may have changed every chain of `family` `table`.
    pub fn whole(&self, family: &str, table: &str) -> bool {
        self.tables
            .contains(&(family.to_string(), table.to_string()))
    }

    /// Whether kpng's text changed the rules of `chain` in `family` `table`.
    pub fn chain(&self, family: &str, table: &str, chain: &str) -> bool {
        self.whole(family, table)
            || self
                .chains
                .contains(&(family.to_string(), table.to_string(), chain.to_string()))
    }
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

    /// What kpng's text transactions changed since the last call (and forgets it).
    pub fn take_touched(&self) -> TouchedRules {
        std::mem::take(&mut *self.touched.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Wraps `exec` so that its commits are counted and what they change recorded.
    pub fn exec(&self, exec: Box<dyn NftExec>) -> Box<dyn NftExec> {
        Box::new(CountingExec {
            inner: exec,
            count: self.text.clone(),
            touched: self.touched.clone(),
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
    touched: Arc<Mutex<TouchedRules>>,
}

impl CountingExec {
    /// One committed transaction of `script`.
    fn committed(&self, script: &str) {
        self.count.fetch_add(1, Ordering::SeqCst);
        self.touched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(script);
    }
}

impl NftExec for CountingExec {
    fn run(&mut self, script: &str) -> Result<(), ExecError> {
        self.inner.run(script)?;
        self.committed(script);
        Ok(())
    }

    fn run_full(&mut self, script: &str) -> Result<(), ExecError> {
        self.inner.run_full(script)?;
        self.committed(script);
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

    fn set_keys(
        &mut self,
        family: Family,
        table: &str,
        set: crate::sets::Set,
        each: &mut dyn FnMut(&[u8]),
    ) -> bool {
        self.inner.set_keys(family, table, set, each)
    }

    fn set_elements(
        &mut self,
        family: Family,
        table: &str,
        set: crate::sets::Set,
        each: &mut dyn FnMut(&kpng_netfilter::elements::Element),
    ) -> bool {
        self.inner.set_elements(family, table, set, each)
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

    #[test]
    fn the_chains_a_script_changes_are_recorded() {
        // (script, whole tables, chains touched, chains not touched)
        type Case<'a> = (&'a str, &'a [&'a str], &'a [&'a str], &'a [&'a str]);
        let cases: &[Case] = &[
            (
                "add chain ip kpng cluster-n2\nflush chain ip kpng cluster-n2\n\
                 add rule ip kpng cluster-n2 numgen random mod 2 vmap @x\n",
                &[],
                &["ip kpng cluster-n2"],
                &["ip kpng services", "ip6 kpng cluster-n2"],
            ),
            (
                "add element ip kpng service-ips { 10.96.0.1 . tcp . 80 : goto x }\n\
                 add map ip kpng m { type mark : verdict; }\ndelete element ip kpng s { 1 }\n",
                &[],
                &[],
                &["ip kpng services", "ip kpng x"],
            ),
            (
                "add table ip kpng\ndelete table ip kpng\ntable ip kpng {\n\tchain a {\n\t}\n}\n",
                &["ip kpng"],
                &["ip kpng services"],
                &["ip6 kpng services", "ip other services"],
            ),
            (
                "flush table ip6 kpng\ndelete chain ip kpng affinity-10800\n",
                &["ip6 kpng"],
                &["ip6 kpng x", "ip kpng affinity-10800"],
                &["ip kpng services"],
            ),
            (
                "insert rule ip kpng services drop\nreplace rule ip kpng prerouting handle 4 drop\n",
                &[],
                &["ip kpng services", "ip kpng prerouting"],
                &["ip kpng nat-output"],
            ),
        ];
        for (script, whole, touched, untouched) in cases {
            let mut t = TouchedRules::default();
            t.record(script);
            for w in *whole {
                let (f, table) = w.split_once(' ').expect("family table");
                assert!(t.whole(f, table), "{script:?}: {w} whole");
            }
            let chain = |c: &str| {
                let w: Vec<&str> = c.split(' ').collect();
                t.chain(w[0], w[1], w[2])
            };
            for c in *touched {
                assert!(chain(c), "{script:?}: {c} touched");
            }
            for c in *untouched {
                assert!(!chain(c), "{script:?}: {c} not touched");
            }
        }
    }

    #[test]
    fn what_was_touched_is_taken_once() {
        let own = OwnCommits::default();
        let mut exec = own.exec(Box::new(Recorder::default()));
        exec.run("add chain ip kpng cluster-n2").expect("run");
        let touched = own.take_touched();
        assert!(touched.chain("ip", "kpng", "cluster-n2"));
        assert_eq!(own.take_touched(), TouchedRules::default());
    }
}
