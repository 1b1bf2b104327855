//! iptables-restore input, built in the order the tool needs it: per table, the chain
//! declarations (which create or flush), then the rule edits, then the chain deletions.
//! Applied with `--noflush`, so that only what is named here changes.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::rules::Table;

/// One table's part of the input.
#[derive(Debug, Default, Clone)]
struct Section {
    declare: Vec<String>,
    edits: Vec<String>,
    delete: Vec<String>,
    rule_lines: usize,
}

/// Restore input under construction.
#[derive(Debug, Default, Clone)]
pub struct Script {
    tables: BTreeMap<Table, Section>,
}

impl Script {
    fn section(&mut self, table: Table) -> &mut Section {
        self.tables.entry(table).or_default()
    }

    /// Creates `chain`, or flushes it when it exists.
    pub fn declare(&mut self, table: Table, chain: &str) {
        self.section(table)
            .declare
            .push(format!(":{chain} - [0:0]"));
    }

    /// Appends a rule to `chain`.
    pub fn append(&mut self, table: Table, chain: &str, spec: &str) {
        let s = self.section(table);
        s.edits.push(format!("-A {chain} {spec}"));
        s.rule_lines += 1;
    }

    /// Inserts a rule at the top of `chain` (keeps a chain's last rule last).
    pub fn insert_first(&mut self, table: Table, chain: &str, spec: &str) {
        let s = self.section(table);
        s.edits.push(format!("-I {chain} 1 {spec}"));
        s.rule_lines += 1;
    }

    /// Inserts a jump at the top of a built-in chain (not counted as one of our rules).
    pub fn insert_jump(&mut self, table: Table, builtin: &str, spec: &str) {
        self.section(table)
            .edits
            .push(format!("-I {builtin} 1 {spec}"));
    }

    /// Deletes the rule of `chain` equal to `spec`.
    pub fn delete_rule(&mut self, table: Table, chain: &str, spec: &str) {
        self.section(table).edits.push(format!("-D {chain} {spec}"));
    }

    /// Flushes and deletes `chain` (after every edit, so that references are gone first).
    pub fn delete_chain(&mut self, table: Table, chain: &str) {
        let s = self.section(table);
        s.declare.push(format!(":{chain} - [0:0]"));
        s.delete.push(format!("-X {chain}"));
    }

    /// Appends everything of `other` (its declarations, edits and deletions keep their place in
    /// the rendered order).
    pub fn extend(&mut self, other: Script) {
        for (table, theirs) in other.tables {
            let mine = self.section(table);
            mine.declare.extend(theirs.declare);
            mine.edits.extend(theirs.edits);
            mine.delete.extend(theirs.delete);
            mine.rule_lines += theirs.rule_lines;
        }
    }

    /// Chain declarations (creations or flushes) in every table.
    pub fn declarations(&self) -> usize {
        self.tables.values().map(|s| s.declare.len()).sum()
    }

    /// Whether there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.tables
            .values()
            .all(|s| s.declare.is_empty() && s.edits.is_empty() && s.delete.is_empty())
    }

    /// Lines that change the ruleset (chain declarations, rule edits, deletions).
    pub fn operations(&self) -> usize {
        self.tables
            .values()
            .map(|s| s.declare.len() + s.edits.len() + s.delete.len())
            .sum()
    }

    /// Rules written (appended or inserted) into our chains of `table`.
    pub fn rules_written(&self, table: Table) -> usize {
        self.tables.get(&table).map_or(0, |s| s.rule_lines)
    }

    /// The restore input: one `*table … COMMIT` block per table that has something.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (table, s) in &self.tables {
            if s.declare.is_empty() && s.edits.is_empty() && s.delete.is_empty() {
                continue;
            }
            let _ = writeln!(out, "*{}", table.name());
            for line in s.declare.iter().chain(&s.edits).chain(&s.delete) {
                out.push_str(line);
                out.push('\n');
            }
            out.push_str("COMMIT\n");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_in_table_order_with_deletions_last() {
        let mut s = Script::default();
        s.delete_chain(Table::Nat, "KUBE-SVC-OLD");
        s.insert_first(Table::Nat, "KUBE-SERVICES", "-j KUBE-SVC-NEW");
        s.declare(Table::Nat, "KUBE-SVC-NEW");
        s.delete_rule(Table::Filter, "KUBE-SERVICES", "-j REJECT");
        s.declare(Table::Mangle, "KUBE-PROXY-CANARY");
        assert_eq!(
            s.render(),
            "*mangle\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n\
             *filter\n-D KUBE-SERVICES -j REJECT\nCOMMIT\n\
             *nat\n:KUBE-SVC-OLD - [0:0]\n:KUBE-SVC-NEW - [0:0]\n\
             -I KUBE-SERVICES 1 -j KUBE-SVC-NEW\n-X KUBE-SVC-OLD\nCOMMIT\n"
        );
        assert_eq!(s.operations(), 6);
        assert_eq!(s.rules_written(Table::Nat), 1);
        assert_eq!(s.rules_written(Table::Filter), 0);
    }

    #[test]
    fn extend_keeps_declarations_first_and_deletions_last() {
        let mut a = Script::default();
        a.append(Table::Nat, "KUBE-SERVICES", "-j KUBE-SVC-A");
        a.delete_chain(Table::Nat, "KUBE-SVC-OLD");
        let mut b = Script::default();
        b.declare(Table::Nat, "KUBE-SVC-A");
        b.append(Table::Nat, "KUBE-SVC-A", "-j KUBE-SEP-A");
        a.extend(b);
        assert_eq!(
            a.render(),
            "*nat\n:KUBE-SVC-OLD - [0:0]\n:KUBE-SVC-A - [0:0]\n-A KUBE-SERVICES -j KUBE-SVC-A\n\
             -A KUBE-SVC-A -j KUBE-SEP-A\n-X KUBE-SVC-OLD\nCOMMIT\n"
        );
        assert_eq!(a.declarations(), 2);
        assert_eq!(a.rules_written(Table::Nat), 2);
    }

    #[test]
    fn empty_script_renders_nothing() {
        let s = Script::default();
        assert!(s.is_empty());
        assert_eq!(s.render(), "");
    }
}
