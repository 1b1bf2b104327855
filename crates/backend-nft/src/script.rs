//! Rendering transactions as nft scripts.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use kpng_model::Family;

use crate::ruleset::{DynamicChain, Fam, StaticConfig, skeleton};
use crate::store::{Element, ElementOp, order_ops};

/// An element after its key (which the caller writes): comment and value.
fn element_rest(out: &mut String, e: &Element) {
    if let Some(c) = &e.comment {
        let _ = write!(out, " comment \"{}\"", c.replace('"', "'"));
    }
    if let Some(v) = &e.value {
        let _ = write!(out, " : {v}");
    }
}

/// The dynamic chain an element's verdict goes to, if any (read from the typed verdict).
pub fn referenced_chain(e: &Element) -> Option<DynamicChain> {
    e.value.as_ref().and_then(|v| v.dynamic_chain())
}

/// `items` grouped by set name, each group sorted by its key's text: the order in which the
/// text path writes elements (stable scripts and golden files).
fn by_set_in_text_order<T>(
    items: impl Iterator<Item = (&'static str, String, T)>,
) -> BTreeMap<&'static str, Vec<(String, T)>> {
    let mut by_set: BTreeMap<&'static str, Vec<(String, T)>> = BTreeMap::new();
    for (set, key, item) in items {
        by_set.entry(set).or_default().push((key, item));
    }
    for items in by_set.values_mut() {
        items.sort_by(|a, b| a.0.cmp(&b.0));
    }
    by_set
}

fn add_chain(out: &mut String, fam: Fam, table: &str, mask: u32, chain: &DynamicChain) {
    let f = fam.table_family();
    let name = chain.name();
    let _ = writeln!(out, "add chain {f} {table} {name}");
    for rule in chain.rules(fam, mask) {
        let _ = writeln!(out, "add rule {f} {table} {name} {rule}");
    }
}

fn add_elements<'a>(
    out: &mut String,
    fam: Fam,
    table: &str,
    elements: impl Iterator<Item = &'a Element>,
) {
    let by_set = by_set_in_text_order(elements.map(|e| (e.set.name(), e.key.to_string(), e)));
    for (set, elems) in by_set {
        let _ = writeln!(out, "add element {} {table} {set} {{", fam.table_family());
        for (key, e) in elems {
            let _ = write!(out, "\t{key}");
            element_rest(out, e);
            out.push_str(",\n");
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
    let chains: BTreeSet<DynamicChain> = elements.iter().filter_map(referenced_chain).collect();
    for chain in &chains {
        add_chain(&mut out, fam, table, cfg.affinity_mask, chain);
    }
    add_elements(&mut out, fam, table, elements.iter());
    (out, chains.iter().map(DynamicChain::name).collect())
}

/// A new table in two transactions ([`crate::ruleset::skeleton_in_two`]): the first replaces
/// any table of that name with the skeleton but its base chains; the second, once the fill is
/// in, adds them.
pub fn replace_in_two(fam: Fam, table: &str, cfg: &StaticConfig) -> (String, String) {
    let f = fam.table_family();
    let (without_hooks, hooks) = crate::ruleset::skeleton_in_two(fam, table, cfg);
    (
        format!("add table {f} {table}\ndelete table {f} {table}\n{without_hooks}"),
        hooks,
    )
}

/// A partial sync: the element changes, preceded by any dynamic chain they newly need.
/// Chains that fall out of use are deleted after it, in a transaction of their own
/// ([`delete_chains`]). Returns the script and the new chains.
pub fn partial(
    fam: Fam,
    table: &str,
    mask: u32,
    existing: &BTreeSet<String>,
    ops: Vec<ElementOp>,
) -> (String, BTreeSet<String>) {
    let f = fam.table_family();
    let (deletes, adds) = order_ops(ops);
    let mut out = String::new();
    let new_chains: BTreeSet<DynamicChain> = adds
        .iter()
        .filter_map(referenced_chain)
        .filter(|c| !existing.contains(&c.name()))
        .collect();
    for chain in &new_chains {
        add_chain(&mut out, fam, table, mask, chain);
    }
    let by_set = by_set_in_text_order(
        deletes
            .iter()
            .map(|(set, key)| (set.name(), key.to_string(), ())),
    );
    for (set, keys) in by_set {
        let _ = writeln!(out, "delete element {f} {table} {set} {{");
        for (k, ()) in keys {
            let _ = writeln!(out, "\t{k},");
        }
        let _ = writeln!(out, "}}");
    }
    add_elements(&mut out, fam, table, adds.iter());
    (out, new_chains.iter().map(DynamicChain::name).collect())
}

/// Deletes the dynamic chains `chains` (no element refers to them any more).
pub fn delete_chains(fam: Fam, table: &str, chains: &[String]) -> String {
    let mut out = String::new();
    for chain in chains {
        let _ = writeln!(out, "delete chain {} {table} {chain}", fam.table_family());
    }
    out
}

/// Creates (or resets) dynamic chains: `add` + `flush` + rules is idempotent. `mask` is
/// `--conntrack-mark-mask` (the affinity chains read the id through it).
pub fn ensure_chains<'c>(
    fam: Fam,
    table: &str,
    mask: u32,
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
        for rule in chain.rules(fam, mask) {
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

/// Puts back every rule of a table of our layout whose rules are not (or no longer) ours (someone
/// else changed them, or an earlier run had another configuration), in one transaction that
/// leaves the set elements alone: every chain is flushed, the skeleton marker chain is replaced
/// (its comment names the skeleton), then the skeleton is declared again (re-adding its rules,
/// and any set, map or chain that was deleted) and the dynamic chains `chains` get their rules
/// back. The elements are refilled by the netlink transaction that follows.
///
/// Why not replace the table whole: as text that is every element through `nft -f`, seconds
/// and hundreds of MB at 30k Services, while the old rules keep running. A declaration that no
/// longer fits what is there (a set recreated with another type) fails the whole transaction,
/// and the caller replaces the table whole after all.
pub fn restore_rules<'c>(
    fam: Fam,
    table: &str,
    cfg: &StaticConfig,
    chains: impl Iterator<Item = &'c DynamicChain>,
) -> String {
    let (f, marker) = (fam.table_family(), crate::ruleset::MARKER_CHAIN);
    let mut out = format!(
        "flush table {f} {table}\nadd chain {f} {table} {marker}\ndelete chain {f} {table} {marker}\n"
    );
    out.push_str(&skeleton(fam, table, cfg));
    out.push_str(&ensure_chains(fam, table, cfg.affinity_mask, chains));
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
