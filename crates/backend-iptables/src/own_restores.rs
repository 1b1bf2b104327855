//! Counting kpng's own restores (iptables-nft), so that someone else's commit during a sync of
//! kpng's can be told apart by the kernel's generation id (see
//! `kpng_netfilter::generation`), and recording which chains they changed.
//!
//! Why: while kpng restores, the notification monitor has left its group, so a foreign change
//! landing then is not notified. `iptables-nft-restore` commits each table section (`*nat` …
//! `COMMIT`) as one nf_tables transaction, which moves the generation id by one; a section that
//! only declares existing empty chains commits nothing and moves nothing (measured with 1.8.9).
//! So only sections that add, insert, delete or replace a rule, or delete a chain, are
//! counted: counting too few only makes kpng read its rules and compare them (a difference in
//! the chains it did not change is then someone else's), while counting too many could hide
//! someone else's commit. A refused restore counts nothing, but what it names is still
//! recorded as changed (an earlier section may have committed).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use kpng_model::Family;

use crate::exec::{ExecError, Iptables};
use crate::rules::Table;

/// The count of kpng's own committed table sections, and the chains its restores named,
/// shared by the wrapper ([`OwnRestores::wrap`]) and the backend.
#[derive(Debug, Clone, Default)]
pub struct OwnRestores {
    count: Arc<AtomicU64>,
    touched: Arc<Mutex<TouchedChains>>,
}

/// The chains kpng's restores changed: declared (created or flushed), deleted, or given or
/// relieved of rules, by family and table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TouchedChains {
    chains: BTreeSet<(Family, &'static str, String)>,
}

impl TouchedChains {
    /// Notes what restore input `script` (iptables-restore syntax) changes in `family`, and
    /// returns how many of its table sections surely commit a transaction.
    fn record(&mut self, family: Family, script: &str) -> u64 {
        let mut table: Option<&'static str> = None;
        let mut changing = false;
        let mut commits = 0;
        for line in script.lines() {
            let line = line.trim();
            if let Some(name) = line.strip_prefix('*') {
                table = Table::ALL
                    .iter()
                    .find(|t| t.name() == name.trim())
                    .map(|t| t.name());
                changing = false;
                continue;
            }
            if line == "COMMIT" {
                commits += u64::from(changing);
                changing = false;
                continue;
            }
            let Some(table) = table else { continue };
            let mut words = line.split_whitespace();
            let (chain, changes) = match words.next() {
                Some(decl) if decl.starts_with(':') => (Some(&decl[1..]), false),
                Some(
                    "-A" | "--append" | "-I" | "--insert" | "-D" | "--delete" | "-R" | "--replace"
                    | "-X" | "--delete-chain",
                ) => (words.next(), true),
                Some("-F" | "--flush" | "-N" | "--new-chain") => (words.next(), false),
                _ => (None, false),
            };
            if let Some(chain) = chain {
                self.chains.insert((family, table, chain.to_string()));
                changing |= changes;
            }
        }
        commits
    }

    /// Whether kpng's restores changed `chain` of `table` in `family`.
    pub fn chain(&self, family: Family, table: &str, chain: &str) -> bool {
        self.chains
            .iter()
            .any(|(f, t, c)| *f == family && *t == table && c == chain)
    }

    /// Whether they changed nothing.
    pub fn is_empty(&self) -> bool {
        self.chains.is_empty()
    }

    /// Adds what `other` records.
    pub fn merge(&mut self, other: TouchedChains) {
        self.chains.extend(other.chains);
    }
}

impl OwnRestores {
    /// Table sections committed so far.
    pub fn now(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// What kpng's restores changed since the last call (and forgets it).
    pub fn take_touched(&self) -> TouchedChains {
        std::mem::take(&mut *self.touched.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Wraps `ipt` so that its restores are counted and what they change recorded.
    pub fn wrap(&self, ipt: Box<dyn Iptables>) -> Box<dyn Iptables> {
        Box::new(Counting {
            inner: ipt,
            own: self.clone(),
        })
    }
}

struct Counting {
    inner: Box<dyn Iptables>,
    own: OwnRestores,
}

impl Iptables for Counting {
    fn restore(&mut self, family: Family, input: &str) -> Result<(), ExecError> {
        let result = self.inner.restore(family, input);
        let commits = self
            .own
            .touched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(family, input);
        if result.is_ok() {
            self.own.count.fetch_add(commits, Ordering::SeqCst);
        }
        result
    }

    fn save(&mut self, family: Family, table: Table) -> Result<String, ExecError> {
        self.inner.save(family, table)
    }

    fn enable_route_localnet(&mut self) -> Result<(), ExecError> {
        self.inner.enable_route_localnet()
    }

    fn restore_route_localnet(&mut self) -> Result<(), ExecError> {
        self.inner.restore_route_localnet()
    }

    fn list_chain(
        &mut self,
        family: Family,
        table: Table,
        chain: &str,
    ) -> Result<Option<String>, ExecError> {
        self.inner.list_chain(family, table, chain)
    }

    fn watcher(&self) -> Option<Box<dyn Iptables>> {
        self.inner.watcher()
    }

    fn notifies(&self) -> bool {
        self.inner.notifies()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn reads_kernel(&self) -> bool {
        self.inner.reads_kernel()
    }

    fn nats_in_kernel(&self) -> bool {
        self.inner.nats_in_kernel()
    }

    fn chains_per_restore(&self) -> Option<usize> {
        self.inner.chains_per_restore()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::Recorder;

    #[test]
    fn changing_sections_are_counted_and_named_chains_recorded() {
        // (script, commits, touched (table chain), untouched)
        type Case<'a> = (&'a str, u64, &'a [&'a str], &'a [&'a str]);
        let cases: &[Case] = &[
            (
                "*nat\n:KUBE-SVC-A - [0:0]\n-A KUBE-SVC-A -j KUBE-SEP-B\nCOMMIT\n\
                 *filter\n:KUBE-FORWARD - [0:0]\nCOMMIT\n*mangle\nCOMMIT\n",
                1,
                &["nat KUBE-SVC-A", "filter KUBE-FORWARD"],
                &["nat KUBE-SERVICES", "filter KUBE-SVC-A", "nat KUBE-FORWARD"],
            ),
            (
                "*nat\n-I PREROUTING -m comment --comment x -j KUBE-SERVICES\nCOMMIT\n\
                 *filter\n-X KUBE-OLD\nCOMMIT\n",
                2,
                &["nat PREROUTING", "filter KUBE-OLD"],
                &["nat OUTPUT", "filter PREROUTING"],
            ),
            (
                "*nat\n-D KUBE-SERVICES -d 10.0.0.1/32 -j KUBE-SVC-A\n-R KUBE-X 1 -j RETURN\n\
                 -F KUBE-Y\n-N KUBE-Z\nCOMMIT\n",
                1,
                &[
                    "nat KUBE-SERVICES",
                    "nat KUBE-X",
                    "nat KUBE-Y",
                    "nat KUBE-Z",
                ],
                &["nat KUBE-SVC-A"],
            ),
            (
                "*nat\n:KUBE-A - [0:0]\n-F KUBE-A\nCOMMIT\n",
                0,
                &["nat KUBE-A"],
                &[],
            ),
        ];
        for (script, commits, touched, untouched) in cases {
            let mut t = TouchedChains::default();
            assert_eq!(t.record(Family::V4, script), *commits, "{script:?}");
            for c in *touched {
                let (table, chain) = c.split_once(' ').expect("table chain");
                assert!(t.chain(Family::V4, table, chain), "{script:?}: {c} touched");
                assert!(!t.chain(Family::V6, table, chain), "{script:?}: {c} v6");
            }
            for c in *untouched {
                let (table, chain) = c.split_once(' ').expect("table chain");
                assert!(
                    !t.chain(Family::V4, table, chain),
                    "{script:?}: {c} untouched"
                );
            }
        }
    }

    #[test]
    fn only_successful_restores_count_and_touched_is_taken_once() {
        let own = OwnRestores::default();
        let recorder = Recorder::default();
        let mut ipt = own.wrap(Box::new(recorder.clone()));
        let script = "*nat\n-A KUBE-X -j RETURN\nCOMMIT\n*filter\n-A KUBE-Y -j RETURN\nCOMMIT\n";
        ipt.restore(Family::V4, script).expect("restore");
        assert_eq!(own.now(), 2);
        let touched = own.take_touched();
        assert!(touched.chain(Family::V4, "filter", "KUBE-Y"));
        assert!(own.take_touched().is_empty());
        // A refused restore: nothing counted, what it names still recorded.
        recorder.0.lock().expect("lock").fail_restores = 1;
        assert!(ipt.restore(Family::V6, script).is_err());
        assert_eq!(own.now(), 2);
        assert!(own.take_touched().chain(Family::V6, "nat", "KUBE-X"));
    }
}
