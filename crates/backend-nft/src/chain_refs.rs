//! Which dynamic chains (`cluster-n3`, `affinity-t600`) the table's elements refer to, counted
//! from the elements kpng committed, never by listing the kernel.
//!
//! Why: a chain no element refers to any more (a Service scaled from 3 endpoints to 1 was the
//! last with 3) would otherwise stay in the table until the next full sync. It is deleted
//! after the sync that removed its last reference, in a transaction of its own: nft refuses to
//! delete a chain something still jumps to, and a refused delete must never fail a sync.

use std::collections::{BTreeMap, BTreeSet};

use crate::ruleset::DynamicChain;
use crate::script::referenced_chain;
use crate::store::{Element, ElementOp};

/// The number of committed elements that refer to each dynamic chain.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ChainRefs {
    /// Chain → elements referring to it (never 0).
    refs: BTreeMap<DynamicChain, usize>,
    /// Unreferenced chains whose delete was refused ([`ChainRefs::keep`]).
    kept: BTreeSet<String>,
}

impl ChainRefs {
    /// Counts `e`, an element now in the table.
    pub fn add(&mut self, e: &Element) {
        if let Some(chain) = referenced_chain(e) {
            *self.refs.entry(chain).or_default() += 1;
        }
    }

    /// Follows a committed partial transaction: each add refers, each delete (the element that
    /// was there) no longer does.
    pub fn apply(&mut self, ops: &[ElementOp]) {
        for op in ops {
            match op {
                ElementOp::Add(e) => self.add(e),
                ElementOp::Delete(e) => {
                    if let Some(chain) = referenced_chain(e)
                        && let Some(n) = self.refs.get_mut(&chain)
                    {
                        *n = n.saturating_sub(1);
                        if *n == 0 {
                            self.refs.remove(&chain);
                        }
                    }
                }
            }
        }
    }

    /// The chains of `existing` (names of the dynamic chains in the kernel) that no element
    /// refers to, except those [`ChainRefs::keep`] holds.
    pub fn unreferenced(&self, existing: &BTreeSet<String>) -> Vec<String> {
        let referenced: BTreeSet<String> = self.refs.keys().map(DynamicChain::name).collect();
        existing
            .iter()
            .filter(|c| !referenced.contains(*c) && !self.kept.contains(*c))
            .cloned()
            .collect()
    }

    /// Chains whose delete nft refused: not tried again until the counts are rebuilt by the
    /// next full sync, so that a refused delete costs one transaction, not one per sync.
    pub fn keep(&mut self, chains: impl IntoIterator<Item = String>) {
        self.kept.extend(chains);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ruleset::PickKind;
    use crate::sets::Set;
    use crate::value::{Chain, Key, Value, Verdict};

    /// A pick-map element for a port (`key`) that goes to the chain for `n` endpoints.
    fn pick(key: u32, n: u32) -> Element {
        Element {
            set: Set::Pick(PickKind::Cluster),
            key: Key::Mark(key),
            value: Some(Value::Verdict(Verdict::Goto(Chain::Dynamic(
                DynamicChain::Pick(PickKind::Cluster, n),
            )))),
            comment: None,
        }
    }

    #[test]
    fn only_the_names_kpng_writes_are_dynamic_chains() {
        let cases = [
            ("cluster-n3", Some(DynamicChain::Pick(PickKind::Cluster, 3))),
            ("local-n12", Some(DynamicChain::Pick(PickKind::Local, 12))),
            (
                "nodeport-cluster-n3",
                Some(DynamicChain::Pick(PickKind::NodePortCluster, 3)),
            ),
            (
                "nodeport-local-n1",
                Some(DynamicChain::Pick(PickKind::NodePortLocal, 1)),
            ),
            ("affinity-t600", Some(DynamicChain::AffinityTimeout(600))),
            ("cluster-n03", None),
            ("cluster-n+3", None),
            ("cluster-n", None),
            ("affinity-t", None),
            ("services", None),
            ("skeleton", None),
            ("my-cluster-n3", None),
        ];
        for (name, want) in cases {
            assert_eq!(DynamicChain::from_name(name), want, "{name}");
        }
    }

    #[test]
    fn a_chain_is_unreferenced_once_its_last_element_goes() {
        let existing: BTreeSet<String> = ["cluster-n1", "cluster-n3"].map(String::from).into();
        let mut refs = ChainRefs::default();
        refs.add(&pick(1, 3));
        refs.add(&pick(2, 3));
        refs.add(&pick(3, 1));
        assert!(refs.unreferenced(&existing).is_empty());
        // One Service scaled from 3 endpoints to 1: another still refers to cluster-n3.
        refs.apply(&[ElementOp::Delete(pick(1, 3)), ElementOp::Add(pick(1, 1))]);
        assert!(refs.unreferenced(&existing).is_empty());
        // The last one too.
        refs.apply(&[ElementOp::Delete(pick(2, 3)), ElementOp::Add(pick(2, 1))]);
        assert_eq!(refs.unreferenced(&existing), ["cluster-n3"]);
        // Added and deleted in one transaction: no reference left behind.
        refs.apply(&[ElementOp::Add(pick(9, 5)), ElementOp::Delete(pick(9, 5))]);
        assert_eq!(refs, {
            let mut want = ChainRefs::default();
            for k in [1, 2, 3] {
                want.add(&pick(k, 1));
            }
            want
        });
    }
}
