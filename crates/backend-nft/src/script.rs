//! Rendering transactions as nft scripts.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use kpng_model::Family;

use crate::ruleset::{DynamicChain, Fam, StaticConfig, skeleton};
use crate::store::{Element, ElementOp, SetName, order_ops};

fn element_text(e: &Element) -> String {
    let mut s = e.key.clone();
    if let Some(c) = &e.comment {
        let _ = write!(s, " comment \"{}\"", c.replace('"', "'"));
    }
    if let Some(v) = &e.value {
        let _ = write!(s, " : {v}");
    }
    s
}

/// Dynamic chains a verdict refers to.
pub fn referenced_chain(value: &Option<String>) -> Option<DynamicChain> {
    value
        .as_deref()
        .and_then(|v| v.strip_prefix("goto "))
        .and_then(DynamicChain::parse)
}

fn add_chain(out: &mut String, fam: Fam, table: &str, chain: &DynamicChain) {
    let f = fam.table_family();
    let name = chain.name();
    let _ = writeln!(out, "add chain {f} {table} {name}");
    for rule in chain.rules(fam) {
        let _ = writeln!(out, "add rule {f} {table} {name} {rule}");
    }
}

fn add_elements<'a>(
    out: &mut String,
    fam: Fam,
    table: &str,
    elements: impl Iterator<Item = &'a Element>,
) {
    let mut by_set: BTreeMap<SetName, Vec<&Element>> = BTreeMap::new();
    for e in elements {
        by_set.entry(e.set).or_default().push(e);
    }
    for (set, elems) in by_set {
        let _ = writeln!(out, "add element {} {table} {set} {{", fam.table_family());
        for e in elems {
            let _ = writeln!(out, "\t{},", element_text(e));
        }
        let _ = writeln!(out, "}}");
    }
}

/// A full sync: atomically replace the table with the skeleton, the dynamic chains the elements
/// need, and every element. Returns the script and the dynamic chains it creates.
pub fn replace(
    fam: Fam,
    table: &str,
    cfg: &StaticConfig,
    elements: &[Element],
) -> (String, BTreeSet<String>) {
    let f = fam.table_family();
    let mut out = String::new();
    // `add` then `delete` works whether or not the table exists; all of it is one commit.
    let _ = writeln!(out, "add table {f} {table}\ndelete table {f} {table}");
    out.push_str(&skeleton(fam, table, cfg));
    let chains: BTreeSet<DynamicChain> = elements
        .iter()
        .filter_map(|e| referenced_chain(&e.value))
        .collect();
    for chain in &chains {
        add_chain(&mut out, fam, table, chain);
    }
    add_elements(&mut out, fam, table, elements.iter());
    (out, chains.iter().map(DynamicChain::name).collect())
}

/// A partial sync: the element changes, preceded by any dynamic chain they newly need.
/// Chains that fall out of use stay until the next full sync (their number is bounded by the
/// distinct endpoint counts and affinity timeouts). Returns the script and the new chains.
pub fn partial(
    fam: Fam,
    table: &str,
    existing: &BTreeSet<String>,
    ops: Vec<ElementOp>,
) -> (String, BTreeSet<String>) {
    let f = fam.table_family();
    let (deletes, adds) = order_ops(ops);
    let mut out = String::new();
    let new_chains: BTreeSet<DynamicChain> = adds
        .iter()
        .filter_map(|e| referenced_chain(&e.value))
        .filter(|c| !existing.contains(&c.name()))
        .collect();
    for chain in &new_chains {
        add_chain(&mut out, fam, table, chain);
    }
    let mut by_set: BTreeMap<SetName, Vec<String>> = BTreeMap::new();
    for (set, key) in deletes {
        by_set.entry(set).or_default().push(key);
    }
    for (set, keys) in by_set {
        let _ = writeln!(out, "delete element {f} {table} {set} {{");
        for k in keys {
            let _ = writeln!(out, "\t{k},");
        }
        let _ = writeln!(out, "}}");
    }
    add_elements(&mut out, fam, table, adds.iter());
    (out, new_chains.iter().map(DynamicChain::name).collect())
}

/// Creates (or resets) dynamic chains: `add` + `flush` + rules is idempotent.
pub fn ensure_chains<'c>(
    fam: Fam,
    table: &str,
    chains: impl Iterator<Item = &'c DynamicChain>,
) -> String {
    let mut out = String::new();
    for chain in chains {
        let _ = writeln!(
            out,
            "add chain {} {table} {}\nflush chain {} {table} {}",
            fam.table_family(),
            chain.name(),
            fam.table_family(),
            chain.name()
        );
        for rule in chain.rules(fam) {
            let _ = writeln!(
                out,
                "add rule {} {table} {} {rule}",
                fam.table_family(),
                chain.name()
            );
        }
    }
    out
}

/// Removes our tables (whether or not they exist).
pub fn cleanup(table: &str, families: &[Family]) -> String {
    let mut out = String::new();
    for family in families {
        let f = Fam(*family).table_family();
        let _ = writeln!(out, "add table {f} {table}\ndelete table {f} {table}");
    }
    out
}
