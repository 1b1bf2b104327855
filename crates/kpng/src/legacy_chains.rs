//! Legacy iptables' (x_tables) drops for the "other tables' chains" of `kpng status` and
//! `kpng trace` ([`kpng_runner::admin::ForeignChain`]): built-in chains whose policy is
//! `DROP` and `DROP`/`REJECT` rules reached from a built-in chain.
//!
//! Why: legacy tables are not nf_tables tables, so the netlink chain dump of
//! [`crate::foreign_chains`] never sees them, yet a legacy `iptables -P FORWARD DROP` (Docker
//! on a legacy host) or a RHEL-style `-A INPUT -j REJECT` drops Service traffic whatever
//! kpng's tables accept: exactly what "is it kpng or my firewall?" must show.
//!
//! Read-only and only when a status or a trace asks: for each family whose legacy tables
//! exist (`/proc/net/ip_tables_names`, readable without touching them), one
//! `iptables-legacy-save` (which saves only the tables that exist: it never instantiates one
//! and its hooks). Never in the sync loop.

use std::collections::{BTreeMap, BTreeSet};

use kpng_backend_iptables::names::is_service_chain;
use kpng_backend_iptables::rules::{
    CANARY, EXTERNAL_SERVICES, FORWARD, KUBELET_FIREWALL, MARK_MASQ, NODEPORTS, POSTROUTING,
    PROXY_FIREWALL, SERVICES,
};
use kpng_model::Family;
use kpng_runner::admin::ForeignChain;

/// At most this many rule lines per family and table: fail2ban's chains hold one `REJECT` per
/// banned address, and the status line must stay readable; the rest are counted.
const MAX_RULES: usize = 8;

/// The save tool of `family`'s legacy variant.
fn save_tool(family: Family) -> &'static str {
    match family {
        Family::V4 => "iptables-legacy-save",
        Family::V6 => "ip6tables-legacy-save",
    }
}

/// Where the kernel lists `family`'s legacy tables that exist.
fn names_file(family: Family) -> &'static str {
    match family {
        Family::V4 => "/proc/net/ip_tables_names",
        Family::V6 => "/proc/net/ip6_tables_names",
    }
}

/// The legacy drops of every family whose legacy tables exist, read now. `kpng_legacy`: kpng's
/// own iptables rules are in the legacy tables (its `KUBE-*` chains are then kpng's, and a
/// rule's place is told relative to kpng's jump). A family whose tables exist but cannot be
/// read (tool missing, no `CAP_NET_RAW`) gets one line saying so, never a silent nothing.
pub fn list(kpng_legacy: bool) -> Vec<ForeignChain> {
    let mut out = Vec::new();
    for family in Family::ALL {
        let exists =
            std::fs::read_to_string(names_file(family)).is_ok_and(|names| !names.trim().is_empty());
        if !exists {
            continue;
        }
        let tool = save_tool(family);
        match kpng_backend_kit::exec::run_tool(tool, &[], None) {
            Ok(text) => out.extend(drops(&text, family, kpng_legacy)),
            Err(e) => out.push(ForeignChain {
                line: format!(
                    "{} tables exist but cannot be read ({e}): their drops are not shown",
                    prefix(family)
                ),
                families: vec![family],
                policy_drop: false,
                rule_in: None,
            }),
        }
    }
    out
}

/// `iptables-legacy` or `ip6tables-legacy`: what the lines are prefixed with.
fn prefix(family: Family) -> &'static str {
    match family {
        Family::V4 => "iptables-legacy",
        Family::V6 => "ip6tables-legacy",
    }
}

/// Whether `chain` is one of the chains kpng's iptables backend writes.
pub fn is_kpng_chain(chain: &str) -> bool {
    [
        SERVICES,
        EXTERNAL_SERVICES,
        NODEPORTS,
        PROXY_FIREWALL,
        FORWARD,
        MARK_MASQ,
        POSTROUTING,
        KUBELET_FIREWALL,
        CANARY,
    ]
    .contains(&chain)
        || is_service_chain(chain)
}

/// One table's chains, whatever wrote them: legacy iptables' save text, or an nf_tables
/// table's rules as the kernel lists them ([`crate::foreign_chains`]). One walk
/// ([`table_drops`]) finds the drops of both.
#[derive(Default, Clone)]
pub struct Table {
    /// Built-in (base) chains in order, with their policy (`ACCEPT`, `DROP`): walked from.
    pub builtin: Vec<(String, String)>,
    /// Every rule per chain, in order.
    pub rules: BTreeMap<String, Vec<Rule>>,
}

/// One rule, as far as the walk needs it.
#[derive(Clone)]
pub struct Rule {
    /// How the line shows it (`-A INPUT -p tcp … -j DROP`, `rule handle 7 matching …: drop`).
    pub text: String,
    /// Its target or verdict: `DROP`, `REJECT`, or the chain it jumps or goes to.
    pub target: Option<String>,
    /// Whether it matches every packet that reaches it.
    pub unconditional: bool,
}

impl Rule {
    /// The rule of a save text's `-A CHAIN spec` line.
    fn of_spec(chain: &str, spec: &str) -> Rule {
        let w = words(spec);
        Rule {
            text: format!("-A {chain} {spec}"),
            target: target(&w).map(|(t, _)| t.to_string()),
            unconditional: unconditional(&w),
        }
    }
}

/// The words of a rule spec, double-quoted words (comments) kept whole, quotes removed.
fn words(spec: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let (mut quoted, mut escaped, mut any) = (false, false, false);
    for ch in spec.chars() {
        if escaped {
            word.push(ch);
            escaped = false;
        } else if ch == '\\' && quoted {
            escaped = true;
        } else if ch == '"' {
            quoted = !quoted;
            any = true;
        } else if ch.is_whitespace() && !quoted {
            if any || !word.is_empty() {
                out.push(std::mem::take(&mut word));
            }
            any = false;
        } else {
            word.push(ch);
        }
    }
    if any || !word.is_empty() {
        out.push(word);
    }
    out
}

/// The rule's target (`-j` or `-g`) and whether it is a goto.
fn target(words: &[String]) -> Option<(&str, bool)> {
    words
        .windows(2)
        .find(|w| w[0] == "-j" || w[0] == "-g")
        .map(|w| (w[1].as_str(), w[0] == "-g"))
}

/// Whether the rule matches every packet: nothing but a comment besides its target and the
/// target's options (`-j REJECT --reject-with …`).
fn unconditional(words: &[String]) -> bool {
    let mut i = 0;
    while i < words.len() {
        match words[i].as_str() {
            "-m" if words.get(i + 1).is_some_and(|w| w == "comment") => i += 2,
            "--comment" => i += 2,
            "-j" | "-g" => return true,
            _ => return false,
        }
    }
    false
}

/// Parses `iptables-save` text into its tables, in order.
fn parse(text: &str) -> Vec<(String, Table)> {
    let mut tables: Vec<(String, Table)> = Vec::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix('*') {
            tables.push((name.trim().to_string(), Table::default()));
        } else if let Some(decl) = line.strip_prefix(':') {
            let mut parts = decl.split_whitespace();
            if let (Some((_, table)), Some(chain), Some(policy)) =
                (tables.last_mut(), parts.next(), parts.next())
                && policy != "-"
            {
                table.builtin.push((chain.to_string(), policy.to_string()));
            }
        } else if let Some(rule) = line.strip_prefix("-A ")
            && let Some((_, table)) = tables.last_mut()
        {
            let (chain, spec) = rule.split_once(' ').unwrap_or((rule, ""));
            table
                .rules
                .entry(chain.to_string())
                .or_default()
                .push(Rule::of_spec(chain, spec));
        }
    }
    tables
}

/// The drops of one family's save text: each built-in chain with policy `DROP`, and each
/// `DROP`/`REJECT` rule in a built-in chain or in a chain it jumps to ([`table_drops`]). When
/// `kpng_legacy`, kpng's own chains are skipped and a rule in a built-in chain says whether it
/// comes before or after kpng's jump there.
pub fn drops(text: &str, family: Family, kpng_legacy: bool) -> Vec<ForeignChain> {
    let mut out = Vec::new();
    for (table_name, table) in parse(text) {
        let label = format!("{} {table_name}", prefix(family));
        let see = format!("{} -t {table_name}", save_tool(family));
        let is_kpng = |chain: &str| kpng_legacy && is_kpng_chain(chain);
        out.extend(table_drops(&label, &table, &[family], &is_kpng, &see));
    }
    out
}

/// The drops of one table: each built-in chain with policy `DROP`, and each `DROP`/`REJECT`
/// rule in a built-in chain or in a chain it jumps to (followed depth-first, each chain once,
/// never into a chain `is_kpng` says is kpng's). A rule that drops every packet reaching a
/// built-in chain counts as a drop policy (`policy_drop`), as RHEL's `-A INPUT -j REJECT` does.
/// A rule in a built-in chain that also jumps to kpng's says whether it comes before or after
/// kpng's jump. At most [`MAX_RULES`] rule lines, then a count pointing at `see`.
///
/// Why one walk for legacy save text and nf_tables rules: a CNI's drop in an iptables-nft
/// `cali-*` chain or in its own `inet` table drops kpng's traffic as surely as a legacy one.
pub fn table_drops(
    label: &str,
    table: &Table,
    families: &[Family],
    is_kpng: &dyn Fn(&str) -> bool,
    see: &str,
) -> Vec<ForeignChain> {
    let mut out = Vec::new();
    let chain_of = |line: String, policy_drop: bool, rule_in: Option<String>| ForeignChain {
        line,
        families: families.to_vec(),
        policy_drop,
        rule_in: rule_in.map(|chain| (label.to_string(), chain)),
    };
    let mut rules = Vec::new();
    for (builtin, policy) in &table.builtin {
        if policy == "DROP" {
            out.push(chain_of(
                format!("{label} {builtin}: policy DROP"),
                true,
                None,
            ));
        }
        let none = Vec::new();
        let specs = table.rules.get(builtin).unwrap_or(&none);
        // kpng's first jump in this built-in chain.
        let kpng_jump = specs
            .iter()
            .position(|r| r.target.as_deref().is_some_and(is_kpng));
        let mut seen = BTreeSet::from([builtin.clone()]);
        // (path to the chain, chain, index in the built-in chain of the rule leading here)
        let mut stack: Vec<(String, String, Option<usize>)> =
            vec![(builtin.clone(), builtin.clone(), None)];
        while let Some((path, chain, from)) = stack.pop() {
            let specs = table.rules.get(&chain).unwrap_or(&none);
            let mut deeper = Vec::new();
            for (i, rule) in specs.iter().enumerate() {
                let Some(t) = rule.target.as_deref() else {
                    continue;
                };
                let at = from.or((chain == *builtin).then_some(i));
                if t == "DROP" || t == "REJECT" {
                    let relation = match (kpng_jump, at) {
                        (Some(k), Some(at)) if at < k => " (before kpng's jump)",
                        (Some(_), Some(_)) => " (after kpng's jump)",
                        _ => "",
                    };
                    let all = chain == *builtin && rule.unconditional;
                    let what = if all {
                        " (every packet that reaches it: a drop policy)"
                    } else {
                        ""
                    };
                    rules.push(chain_of(
                        format!("{label} {path}: {}{what}{relation}", rule.text),
                        all,
                        Some(chain.clone()),
                    ));
                } else if table.rules.contains_key(t) && !is_kpng(t) && seen.insert(t.to_string()) {
                    deeper.push((format!("{path} → {t}"), t.to_string(), at));
                }
            }
            // Depth-first in rule order.
            stack.extend(deeper.into_iter().rev());
        }
    }
    let more = rules.len().saturating_sub(MAX_RULES);
    // Whole-chain drops first: they are the ones that stop everything.
    rules.sort_by_key(|c| !c.policy_drop);
    out.extend(rules.into_iter().take(MAX_RULES));
    if more > 0 {
        out.push(chain_of(
            format!("{label}: {more} more DROP/REJECT rules (see {see})"),
            false,
            None,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a host-firewall admin's legacy tables look like, and the lines they give.
    #[test]
    fn legacy_drop_policies_and_drop_rules_are_listed() {
        // (what, save text, kpng's rules legacy, lines, which lines drop all)
        struct Case {
            what: &'static str,
            save: &'static str,
            kpng_legacy: bool,
            lines: &'static [&'static str],
            drop_all: &'static [bool],
        }
        let cases = [
            Case {
                what: "nothing of note",
                save: "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n\
                       -A INPUT -p tcp -j ACCEPT\nCOMMIT\n",
                kpng_legacy: false,
                lines: &[],
                drop_all: &[],
            },
            Case {
                what: "Docker's FORWARD policy and a port drop in INPUT",
                save: "# Generated by iptables-save\n*filter\n:INPUT ACCEPT [0:0]\n\
                       :FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n:DOCKER-USER - [0:0]\n\
                       -A INPUT -p tcp -m tcp --dport 30080 -m comment --comment \"no np\" \
                       -j DROP\n-A FORWARD -j DOCKER-USER\n-A DOCKER-USER -j RETURN\nCOMMIT\n",
                kpng_legacy: false,
                lines: &[
                    "iptables-legacy filter FORWARD: policy DROP",
                    "iptables-legacy filter INPUT: -A INPUT -p tcp -m tcp --dport 30080 -m \
                     comment --comment \"no np\" -j DROP",
                ],
                drop_all: &[true, false],
            },
            Case {
                what: "RHEL's final REJECT, and fail2ban's chain followed",
                save: "*filter\n:INPUT ACCEPT [0:0]\n:f2b-sshd - [0:0]\n\
                       -A INPUT -p tcp -m multiport --dports 22 -j f2b-sshd\n\
                       -A INPUT -m state --state RELATED,ESTABLISHED -j ACCEPT\n\
                       -A INPUT -m comment --comment \"the end\" -j REJECT --reject-with \
                       icmp-host-prohibited\n\
                       -A f2b-sshd -s 192.0.2.7/32 -j REJECT --reject-with icmp-port-unreachable\n\
                       -A f2b-sshd -j RETURN\nCOMMIT\n",
                kpng_legacy: false,
                lines: &[
                    "iptables-legacy filter INPUT: -A INPUT -m comment --comment \"the end\" \
                     -j REJECT --reject-with icmp-host-prohibited (every packet that reaches \
                     it: a drop policy)",
                    "iptables-legacy filter INPUT → f2b-sshd: -A f2b-sshd -s 192.0.2.7/32 -j \
                     REJECT --reject-with icmp-port-unreachable",
                ],
                drop_all: &[true, false],
            },
            Case {
                what: "kpng's own legacy chains are kpng's; the place of a drop is told",
                save: "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n\
                       :KUBE-FORWARD - [0:0]\n:KUBE-PROXY-FIREWALL - [0:0]\n\
                       -A FORWARD -s 10.0.0.0/8 -j DROP\n\
                       -A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j \
                       KUBE-FORWARD\n-A FORWARD -d 10.0.0.0/8 -j DROP\n\
                       -A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n\
                       -A INPUT -j KUBE-PROXY-FIREWALL\n\
                       -A KUBE-PROXY-FIREWALL -s 1.2.3.4 -j DROP\nCOMMIT\n",
                kpng_legacy: true,
                lines: &[
                    "iptables-legacy filter FORWARD: -A FORWARD -s 10.0.0.0/8 -j DROP \
                     (before kpng's jump)",
                    "iptables-legacy filter FORWARD: -A FORWARD -d 10.0.0.0/8 -j DROP (after \
                     kpng's jump)",
                ],
                drop_all: &[false, false],
            },
            Case {
                what: "a stale kube-proxy's legacy chains are another program's",
                save: "*filter\n:FORWARD ACCEPT [0:0]\n:KUBE-FORWARD - [0:0]\n\
                       -A FORWARD -j KUBE-FORWARD\n\
                       -A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\nCOMMIT\n",
                kpng_legacy: false,
                lines: &[
                    "iptables-legacy filter FORWARD → KUBE-FORWARD: -A KUBE-FORWARD -m \
                          conntrack --ctstate INVALID -j DROP",
                ],
                drop_all: &[false],
            },
            Case {
                what: "jump loops are followed once; other tables too",
                save: "*raw\n:PREROUTING ACCEPT [0:0]\n:a - [0:0]\n:b - [0:0]\n\
                       -A PREROUTING -j a\n-A a -j b\n-A b -j a\n-A b -p udp -j DROP\nCOMMIT\n",
                kpng_legacy: false,
                lines: &["iptables-legacy raw PREROUTING → a → b: -A b -p udp -j DROP"],
                drop_all: &[false],
            },
        ];
        for case in cases {
            let got = drops(case.save, Family::V4, case.kpng_legacy);
            let lines: Vec<&str> = got.iter().map(|c| c.line.as_str()).collect();
            assert_eq!(lines, case.lines, "{}", case.what);
            let all: Vec<bool> = got.iter().map(|c| c.policy_drop).collect();
            assert_eq!(all, case.drop_all, "{}", case.what);
            assert!(
                got.iter().all(|c| c.families == [Family::V4]),
                "{}",
                case.what
            );
        }
    }

    /// fail2ban with many bans: the first rules, then a count, and the IPv6 tool's name.
    #[test]
    fn many_drop_rules_are_capped_and_counted() {
        let mut save = String::from("*filter\n:INPUT ACCEPT [0:0]\n");
        for i in 0..20 {
            save.push_str(&format!("-A INPUT -s 2001:db8::{i}/128 -j DROP\n"));
        }
        save.push_str("COMMIT\n");
        let got = drops(&save, Family::V6, false);
        assert_eq!(got.len(), MAX_RULES + 1);
        assert_eq!(
            got[0].line,
            "ip6tables-legacy filter INPUT: -A INPUT -s 2001:db8::0/128 -j DROP"
        );
        assert_eq!(
            got[MAX_RULES].line,
            "ip6tables-legacy filter: 12 more DROP/REJECT rules (see ip6tables-legacy-save -t \
             filter)"
        );
    }

    #[test]
    fn words_keep_quoted_comments_whole() {
        assert_eq!(
            words(r#"-m comment --comment "a \"b\" c" -j DROP"#),
            ["-m", "comment", "--comment", "a \"b\" c", "-j", "DROP"]
        );
        assert_eq!(words(r#"--comment "" -j X"#), ["--comment", "", "-j", "X"]);
    }
}
