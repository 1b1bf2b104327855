//! Other programs' base chains on the hooks kpng uses, for `kpng status` and `kpng trace`
//! ([`kpng_runner::admin::ForeignChain`]): those that see a packet before kpng's chain on
//! the same hook (a lower priority number), those whose policy drops what their rules do
//! not accept, and filter chains holding drop or reject rules (in the chain or in a chain it
//! jumps to), each such rule listed. A filter chain's drop drops whatever its priority: a
//! multi-tenant CNI's `inet tenantpolicy input` at priority 0, policy accept, with
//! `tcp dport { 32010, 30000-32767 } drop` dropped every health check and node port while
//! status said nothing (until 2026-12-07 only chains before kpng's or with a drop policy were
//! listed). The rules are read with one rule dump per such table
//! ([`kpng_netfilter::rules::rules`]) and walked as legacy iptables' are
//! ([`crate::legacy_chains::table_drops`]); their matches are named, not compared with
//! kpng's ports and addresses, so a listed rule "may" drop kpng's traffic. Why: `kpng trace` replays kpng's model only and status says "ok" while a host
//! firewall (`inet filter forward … policy drop`) drops the Service's traffic first; at 3 a.m.
//! "is it kpng or my firewall?" needs both halves on one screen.
//!
//! Read with one netlink chain dump ([`kpng_netfilter::tables::base_chains`]) when a status
//! or a trace is asked for, never in the sync loop. iptables rules of the legacy variant are
//! not nftables chains: their drop policies and `DROP`/`REJECT` rules are read with
//! `iptables-legacy-save` at the same time, when legacy tables exist ([`crate::legacy_chains`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use kpng_model::Family;
use kpng_netfilter::rules::{RuleSummary, RuleVerdict};
use kpng_netfilter::tables::BaseChain;
use kpng_runner::admin::{ForeignChain, ForeignChainsProbe};

use crate::legacy_chains::{Rule, Table};

/// Which chains are kpng's, to tell the others apart and to know kpng's priority per hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Own {
    /// The nftables backend's table of this name in `ip` and `ip6` (`kpng`).
    NftTable(String),
    /// The iptables backend: its jumps are in the iptables tables' built-in chains, at their
    /// fixed priorities (nat -100 before, 100 after routing; filter 0). `legacy`: in the
    /// legacy (x_tables) variant, whose `KUBE-*` chains are then kpng's.
    Iptables {
        /// Whether kpng's iptables rules are legacy ones.
        legacy: bool,
    },
}

/// The hooks kpng uses: prerouting, input, forward, output, postrouting.
const HOOKS: std::ops::RangeInclusive<u32> = 0..=4;

/// The iptables tables' built-in chains kpng's iptables rules jump from: (hook, priority).
const IPTABLES_HOOKS: [(u32, i32); 6] = [(0, -100), (1, 0), (2, 0), (3, -100), (3, 0), (4, 100)];

/// The probe for a backend whose chains are `own`.
pub fn probe(own: Own) -> ForeignChainsProbe {
    Arc::new(move || {
        let read = |family: &str, table: &str| {
            kpng_netfilter::rules::rules(family, table).map_err(|e| e.to_string())
        };
        let mut found = kpng_netfilter::tables::base_chains()
            .map(|chains| foreign(&chains, &own, &read))
            .map_err(|e| e.to_string())?;
        found.extend(crate::legacy_chains::list(matches!(
            own,
            Own::Iptables { legacy: true }
        )));
        Ok(found)
    })
}

/// The families an nft family word covers.
fn families(word: &str) -> &'static [Family] {
    match word {
        "ip" => &[Family::V4],
        "ip6" => &[Family::V6],
        "inet" => &[Family::V4, Family::V6],
        _ => &[],
    }
}

/// How the rules of one table read (`read(family, table)`), for the walk.
pub type ReadRules<'a> = &'a dyn Fn(&str, &str) -> Result<Vec<RuleSummary>, String>;

/// The walk's view of an nf_tables table's rules.
fn table_of(rules: &[RuleSummary]) -> Table {
    let mut table = Table::default();
    for r in rules {
        let target = match &r.verdict {
            RuleVerdict::Drop => Some("DROP".to_string()),
            RuleVerdict::Reject => Some("REJECT".to_string()),
            RuleVerdict::Jump(c) | RuleVerdict::Goto(c) => Some(c.clone()),
            RuleVerdict::Accept => Some("ACCEPT".to_string()),
            RuleVerdict::Return | RuleVerdict::Continue => None,
        };
        let verdict = match &r.verdict {
            RuleVerdict::Drop => "drop".to_string(),
            RuleVerdict::Reject => "reject".to_string(),
            other => format!("{other:?}").to_lowercase(),
        };
        let comment = r
            .comment
            .as_deref()
            .map(|c| format!(" \"{c}\""))
            .unwrap_or_default();
        let matching = if r.matches.is_empty() {
            "matching every packet".to_string()
        } else {
            format!("matching on {}", r.matches.join(", "))
        };
        table.rules.entry(r.chain.clone()).or_default().push(Rule {
            text: format!("rule handle {}{comment} {matching}: {verdict}", r.handle),
            target,
            unconditional: r.matches.is_empty(),
        });
    }
    table
}

/// The chains of `chains` that are not kpng's and, on a hook kpng uses, run before kpng's
/// chain there, drop by policy, or (filter chains) hold drop or reject rules, read with
/// `read`; each with its relation to kpng's chain, followed by its drop rules.
pub fn foreign(chains: &[BaseChain], own: &Own, read: ReadRules<'_>) -> Vec<ForeignChain> {
    // kpng's anchor tables (`kpng-anchor`, `kpng-anchor-<pid>-<random>`) are kpng's whatever
    // the backend: verdict-free NAT chains that keep the kernel NAT-ing through a foreign flush.
    let is_anchor = |c: &BaseChain| {
        matches!(c.family, "ip" | "ip6") && kpng_netfilter::anchor::is_anchor_table(&c.table)
    };
    // kpng's rules: its table's chains (the anchor's are not: they translate nothing).
    let is_rules = |c: &BaseChain| match own {
        Own::NftTable(table) => c.table == *table && matches!(c.family, "ip" | "ip6"),
        Own::Iptables { .. } => false,
    };
    let is_own = |c: &BaseChain| is_anchor(c) || is_rules(c);
    // kpng's earliest priority on (family, hook). Not the anchor's: its verdict-free NAT
    // chains (input and postrouting at 100) made a foreign `input` chain at priority 10 read
    // "before kpng's" where kpng has no input chain at all.
    let kpng_priority = |family: Family, hook: u32| -> Option<i32> {
        match own {
            Own::NftTable(_) => chains
                .iter()
                .filter(|c| is_rules(c) && c.hook == hook && families(c.family).contains(&family))
                .map(|c| c.priority)
                .min(),
            Own::Iptables { .. } => IPTABLES_HOOKS
                .iter()
                .filter(|(h, _)| *h == hook)
                .map(|(_, p)| *p)
                .min(),
        }
    };
    // In the iptables backend's nft variant, its `KUBE-*` chains in iptables-nft's tables are
    // kpng's: never walked into, and a drop's place is told relative to the jump to them.
    let kpng_chain = |family: &str, chain: &str| {
        matches!(own, Own::Iptables { legacy: false })
            && matches!(family, "ip" | "ip6")
            && crate::legacy_chains::is_kpng_chain(chain)
    };
    let mut tables: BTreeMap<(&str, &str), Result<Table, String>> = BTreeMap::new();
    let mut out = Vec::new();
    for c in chains {
        let fams = families(c.family);
        if is_own(c) || fams.is_empty() || !HOOKS.contains(&c.hook) {
            continue;
        }
        let kpng = fams.iter().filter_map(|f| kpng_priority(*f, c.hook)).min();
        let before = kpng.is_some_and(|k| c.priority < k);
        let label = format!("{} {}", c.family, c.table);
        // A filter chain's drop rules drop whatever its priority.
        let drops = if c.kind == "filter" {
            let table = tables
                .entry((c.family, c.table.as_str()))
                .or_insert_with(|| read(c.family, &c.table).map(|r| table_of(&r)));
            match table {
                Ok(table) => {
                    let walked = Table {
                        builtin: vec![(c.name.clone(), "ACCEPT".into())],
                        rules: table.rules.clone(),
                    };
                    let is_kpng = |chain: &str| kpng_chain(c.family, chain);
                    let see = format!("nft -a list table {label}");
                    crate::legacy_chains::table_drops(&label, &walked, fams, &is_kpng, &see)
                }
                Err(e) => vec![ForeignChain {
                    line: format!("{label} {}: its rules cannot be read ({e})", c.name),
                    families: fams.to_vec(),
                    policy_drop: false,
                    rule_in: None,
                }],
            }
        } else {
            Vec::new()
        };
        if !before && !c.policy_drop && drops.is_empty() {
            continue;
        }
        let relation = match kpng {
            None => "kpng has no chain on this hook".to_string(),
            Some(k) if c.priority < k => format!("before kpng's, priority {k}"),
            Some(k) if c.priority == k => format!("same priority as kpng's, {k}"),
            Some(k) => format!("after kpng's, priority {k}"),
        };
        out.push(ForeignChain {
            line: format!(
                "{} {} {}: hook {}, type {}, priority {}, policy {} ({relation})",
                c.family,
                c.table,
                c.name,
                c.hook_name(),
                if c.kind.is_empty() {
                    "?"
                } else {
                    c.kind.as_str()
                },
                c.priority,
                if c.policy_drop { "drop" } else { "accept" },
            ),
            families: fams.to_vec(),
            policy_drop: c.policy_drop,
            rule_in: None,
        });
        out.extend(drops);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tables without rules.
    fn no_rules(_: &str, _: &str) -> Result<Vec<RuleSummary>, String> {
        Ok(Vec::new())
    }

    fn chain(
        family: &'static str,
        table: &str,
        name: &str,
        hook: u32,
        prio: i32,
        drop: bool,
    ) -> BaseChain {
        BaseChain {
            family,
            table: table.into(),
            name: name.into(),
            hook,
            priority: prio,
            kind: "filter".into(),
            policy_drop: drop,
        }
    }

    /// A host firewall's drop policy and a chain before kpng's are named with their relation
    /// to kpng's chain on the hook; kpng's own chains, accepting chains after kpng's, other
    /// hooks, other families (bridge, netdev) and kpng's anchor tables are not.
    #[test]
    fn chains_before_kpng_or_dropping_by_policy_are_named() {
        let chains = [
            chain("ip", "kpng", "nat-prerouting", 0, -100, false),
            chain("ip", "kpng", "filter-forward", 2, -110, false),
            chain("ip6", "kpng", "filter-forward", 2, -110, false),
            chain("inet", "filter", "forward", 2, 0, true),
            chain("inet", "filter", "input", 1, 0, false),
            chain("ip", "raw", "pre", 0, -300, false),
            chain("ip", "mangle", "pre", 0, -150, false),
            chain("ip", "late", "pre", 0, 10, false),
            chain("bridge", "filter", "forward", 2, -200, true),
            chain("netdev", "x", "ingress", 5, -500, true),
            chain("ip6", "fw", "output", 3, 0, true),
            // The anchor's chains are not where kpng's rules are: a foreign accepting input
            // chain is neither before nor after a kpng chain there.
            chain("ip", "kpng-anchor", "input", 1, 100, false),
            chain("ip", "late", "in", 1, 10, false),
        ];
        let got = foreign(&chains, &Own::NftTable("kpng".into()), &no_rules);
        let lines: Vec<&str> = got.iter().map(|c| c.line.as_str()).collect();
        assert_eq!(
            lines,
            [
                "inet filter forward: hook forward, type filter, priority 0, policy drop (after \
                 kpng's, priority -110)",
                "ip raw pre: hook prerouting, type filter, priority -300, policy accept (before \
                 kpng's, priority -100)",
                "ip mangle pre: hook prerouting, type filter, priority -150, policy accept \
                 (before kpng's, priority -100)",
                "ip6 fw output: hook output, type filter, priority 0, policy drop (kpng has no \
                 chain on this hook)",
            ]
        );
        assert_eq!(got[0].families, [Family::V4, Family::V6]);
        assert!(got[0].policy_drop && !got[1].policy_drop);
        // The iptables backend: its jumps sit in the built-in chains at the fixed priorities.
        let got = foreign(
            &[
                chain("ip", "filter", "FORWARD", 2, 0, true),
                chain("inet", "fw", "forward", 2, -10, false),
                // kpng's anchor tables are kpng's whatever the backend.
                chain("ip", "kpng-anchor", "prerouting", 0, -200, false),
                chain("ip6", "kpng-anchor-42", "output", 3, -200, false),
                chain("ip", "kpng-anchor-1-0a1b2c3d", "input", 1, 100, false),
            ],
            &Own::Iptables { legacy: false },
            &no_rules,
        );
        let lines: Vec<&str> = got.iter().map(|c| c.line.as_str()).collect();
        assert_eq!(
            lines,
            [
                "ip filter FORWARD: hook forward, type filter, priority 0, policy drop (same \
                 priority as kpng's, 0)",
                "inet fw forward: hook forward, type filter, priority -10, policy accept (before \
                 kpng's, priority 0)",
            ]
        );
    }

    fn rule(chain: &str, handle: u64, verdict: RuleVerdict, matches: &[&str]) -> RuleSummary {
        RuleSummary {
            chain: chain.into(),
            handle,
            verdict,
            matches: matches.iter().map(|m| m.to_string()).collect(),
            comment: None,
        }
    }

    /// Filter chains after kpng's with policy accept are listed when they hold drop or reject
    /// rules (followed through jumps, iptables-nft's included), each rule with its table and
    /// chain for the trace; chains that only accept, NAT chains and kpng's own chains in
    /// iptables-nft's tables are not; a rule matching every packet is a drop policy.
    #[test]
    fn filter_chains_with_drop_rules_are_listed_whatever_their_priority() {
        use RuleVerdict::{Accept, Drop, Jump, Reject};
        struct Case {
            what: &'static str,
            chains: Vec<BaseChain>,
            own: Own,
            rules: fn(&str, &str) -> Result<Vec<RuleSummary>, String>,
            lines: &'static [&'static str],
            rule_in: &'static [Option<(&'static str, &'static str)>],
            drop_all: &'static [bool],
        }
        let nft = || Own::NftTable("kpng".into());
        let mut nat = chain("ip", "nat", "PREROUTING", 0, -100, false);
        nat.kind = "nat".into();
        let cases = [
            Case {
                what: "a tenant's port drop at priority 0, policy accept",
                chains: vec![
                    chain("ip", "kpng", "filter-input", 1, -110, false),
                    chain("inet", "tenantpolicy", "input", 1, 0, false),
                ],
                own: nft(),
                rules: |_, table| {
                    Ok(if table == "tenantpolicy" {
                        vec![rule(
                            "input",
                            3,
                            Drop,
                            &["meta", "cmp", "payload", "lookup"],
                        )]
                    } else {
                        Vec::new()
                    })
                },
                lines: &[
                    "inet tenantpolicy input: hook input, type filter, priority 0, policy accept \
                     (after kpng's, priority -110)",
                    "inet tenantpolicy input: rule handle 3 matching on meta, cmp, payload, \
                     lookup: drop",
                ],
                rule_in: &[None, Some(("inet tenantpolicy", "input"))],
                drop_all: &[false, false],
            },
            Case {
                what: "accepting rules only, and a NAT chain: nothing",
                chains: vec![
                    chain("ip", "kpng", "nat-prerouting", 0, -100, false),
                    chain("inet", "quiet", "input", 1, 10, false),
                    nat.clone(),
                ],
                own: nft(),
                rules: |_, _| {
                    Ok(vec![
                        rule("input", 1, Accept, &["ct"]),
                        rule("PREROUTING", 2, Drop, &[]),
                    ])
                },
                lines: &[],
                rule_in: &[],
                drop_all: &[],
            },
            Case {
                what: "Calico's iptables-nft chain, reached by a jump",
                chains: vec![chain("ip", "filter", "INPUT", 1, 0, false)],
                own: nft(),
                rules: |_, _| {
                    Ok(vec![
                        rule("INPUT", 4, Jump("cali-INPUT".into()), &[]),
                        rule("cali-INPUT", 9, Reject, &["xt tcp"]),
                    ])
                },
                lines: &[
                    "ip filter INPUT: hook input, type filter, priority 0, policy accept (kpng \
                     has no chain on this hook)",
                    "ip filter INPUT → cali-INPUT: rule handle 9 matching on xt tcp: reject",
                ],
                rule_in: &[None, Some(("ip filter", "cali-INPUT"))],
                drop_all: &[false, false],
            },
            Case {
                what: "a final unconditional drop is a drop policy",
                chains: vec![chain("inet", "deny", "output", 3, 0, false)],
                own: nft(),
                rules: |_, _| Ok(vec![rule("output", 2, Drop, &[])]),
                lines: &[
                    "inet deny output: hook output, type filter, priority 0, policy accept \
                     (kpng has no chain on this hook)",
                    "inet deny output: rule handle 2 matching every packet: drop (every packet \
                     that reaches it: a drop policy)",
                ],
                rule_in: &[None, Some(("inet deny", "output"))],
                drop_all: &[false, true],
            },
            Case {
                what: "the iptables backend's nft variant: its chains are kpng's, a drop's place is told",
                chains: vec![chain("ip", "filter", "FORWARD", 2, 0, false)],
                own: Own::Iptables { legacy: false },
                rules: |_, _| {
                    Ok(vec![
                        rule("FORWARD", 1, Jump("KUBE-FORWARD".into()), &[]),
                        rule("FORWARD", 2, Drop, &["payload", "cmp"]),
                        rule("KUBE-FORWARD", 3, Drop, &["ct"]),
                    ])
                },
                lines: &[
                    "ip filter FORWARD: hook forward, type filter, priority 0, policy accept \
                     (same priority as kpng's, 0)",
                    "ip filter FORWARD: rule handle 2 matching on payload, cmp: drop (after \
                     kpng's jump)",
                ],
                rule_in: &[None, Some(("ip filter", "FORWARD"))],
                drop_all: &[false, false],
            },
            Case {
                what: "rules that cannot be read are said",
                chains: vec![chain("inet", "t", "input", 1, 0, false)],
                own: nft(),
                rules: |_, _| Err("EPERM".into()),
                lines: &[
                    "inet t input: hook input, type filter, priority 0, policy accept (kpng has \
                     no chain on this hook)",
                    "inet t input: its rules cannot be read (EPERM)",
                ],
                rule_in: &[None, None],
                drop_all: &[false, false],
            },
        ];
        for case in cases {
            let got = foreign(&case.chains, &case.own, &case.rules);
            let lines: Vec<&str> = got.iter().map(|c| c.line.as_str()).collect();
            assert_eq!(lines, case.lines, "{}", case.what);
            let rule_in: Vec<Option<(&str, &str)>> = got
                .iter()
                .map(|c| c.rule_in.as_ref().map(|(t, c)| (t.as_str(), c.as_str())))
                .collect();
            assert_eq!(rule_in, case.rule_in, "{}", case.what);
            let all: Vec<bool> = got.iter().map(|c| c.policy_drop).collect();
            assert_eq!(all, case.drop_all, "{}", case.what);
        }
    }
}
