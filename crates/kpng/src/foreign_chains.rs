//! Other programs' base chains on the hooks kpng uses, for `kpng status` and `kpng trace`
//! ([`kpng_runner::admin::ForeignChain`]): those that see a packet before kpng's chain on
//! the same hook (a lower priority number) and those whose policy drops what their rules do
//! not accept. Why: `kpng trace` replays kpng's model only and status says "ok" while a host
//! firewall (`inet filter forward … policy drop`) drops the Service's traffic first; at 3 a.m.
//! "is it kpng or my firewall?" needs both halves on one screen.
//!
//! Read with one netlink chain dump ([`kpng_netfilter::tables::base_chains`]) when a status
//! or a trace is asked for, never in the sync loop. iptables rules of the legacy variant are
//! not nftables chains: their drop policies and `DROP`/`REJECT` rules are read with
//! `iptables-legacy-save` at the same time, when legacy tables exist ([`crate::legacy_chains`]).

use std::sync::Arc;

use kpng_model::Family;
use kpng_netfilter::tables::BaseChain;
use kpng_runner::admin::{ForeignChain, ForeignChainsProbe};

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
        let mut found = kpng_netfilter::tables::base_chains()
            .map(|chains| foreign(&chains, &own))
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

/// The chains of `chains` that are not kpng's and, on a hook kpng uses, run before kpng's
/// chain there or drop by policy; each with its relation to kpng's chain.
pub fn foreign(chains: &[BaseChain], own: &Own) -> Vec<ForeignChain> {
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
    let mut out = Vec::new();
    for c in chains {
        let fams = families(c.family);
        if is_own(c) || fams.is_empty() || !HOOKS.contains(&c.hook) {
            continue;
        }
        let kpng = fams.iter().filter_map(|f| kpng_priority(*f, c.hook)).min();
        let before = kpng.is_some_and(|k| c.priority < k);
        if !before && !c.policy_drop {
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
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let got = foreign(&chains, &Own::NftTable("kpng".into()));
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
}
