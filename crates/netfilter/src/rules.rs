//! What each rule of another program's table does in the end (drop, reject, accept, jump),
//! read straight from the kernel, for the "other tables' chains" of `kpng status` and
//! `kpng trace`.
//!
//! Why: a multi-tenant CNI's `inet tenantpolicy input` chain at priority 0 with policy accept
//! and `tcp dport { 32010, 30000-32767 } drop` drops every health check and node port, and
//! neither its priority nor its policy tells it: only its rules do. One rule dump of one table
//! (`NFT_MSG_GETRULE` with `NLM_F_DUMP`; no set element is read), when a status or a trace is
//! asked for, never in the sync loop. The matches are named, not decoded: what a rule matches
//! on is for `nft -a list chain` to show; what it does is what says that it may drop kpng's
//! traffic.

use std::io;

use crate::attr::{self, NFNL_SUBSYS_NFTABLES, string_attr};
use crate::dump;

/// `NFT_MSG_NEWRULE`: what each rule of a dump arrives as.
const NFT_MSG_NEWRULE: u16 = 6;
/// `NFT_MSG_GETRULE`.
const NFT_MSG_GETRULE: u16 = 7;
/// `NFTA_RULE_TABLE`.
const NFTA_RULE_TABLE: u16 = 1;
/// `NFTA_RULE_CHAIN`.
const NFTA_RULE_CHAIN: u16 = 2;
/// `NFTA_RULE_HANDLE`.
const NFTA_RULE_HANDLE: u16 = 3;
/// `NFTA_RULE_EXPRESSIONS`: the list of the rule's expressions.
const NFTA_RULE_EXPRESSIONS: u16 = 4;
/// `NFTA_RULE_USERDATA`: nft's TLVs, among them the rule's comment (type 0).
const NFTA_RULE_USERDATA: u16 = 7;
/// `NFTA_LIST_ELEM`.
const NFTA_LIST_ELEM: u16 = 1;
/// `NFTA_EXPR_NAME`.
const NFTA_EXPR_NAME: u16 = 1;
/// `NFTA_EXPR_DATA`.
const NFTA_EXPR_DATA: u16 = 2;
/// `NFTA_IMMEDIATE_DREG`: 0 is the verdict register.
const NFTA_IMMEDIATE_DREG: u16 = 1;
/// `NFTA_IMMEDIATE_DATA`.
const NFTA_IMMEDIATE_DATA: u16 = 2;
/// `NFTA_DATA_VERDICT`.
const NFTA_DATA_VERDICT: u16 = 2;
/// `NFTA_VERDICT_CODE`.
const NFTA_VERDICT_CODE: u16 = 1;
/// `NFTA_VERDICT_CHAIN`.
const NFTA_VERDICT_CHAIN: u16 = 2;
/// `NFTA_MATCH_NAME` / `NFTA_TARGET_NAME`: an iptables-nft rule's x_tables match or target.
const NFTA_XT_NAME: u16 = 1;

/// What a rule does when it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleVerdict {
    /// `drop`.
    Drop,
    /// `reject` (or iptables-nft's `-j REJECT`).
    Reject,
    /// `accept`.
    Accept,
    /// `jump CHAIN`.
    Jump(String),
    /// `goto CHAIN`.
    Goto(String),
    /// `return`.
    Return,
    /// No final verdict (counters, marks, NAT, another x_tables target): the packet goes on.
    Continue,
}

/// One rule as the kernel lists it, summarised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSummary {
    /// Its chain.
    pub chain: String,
    /// Its handle (`nft -a list chain …` shows it).
    pub handle: u64,
    /// What it does when it matches.
    pub verdict: RuleVerdict,
    /// The names of its matching expressions in order (`meta`, `payload`, `cmp`, `lookup`;
    /// an iptables-nft rule's x_tables matches as `xt tcp`), counters, logs and comments
    /// left out: empty when it matches every packet.
    pub matches: Vec<String>,
    /// Its comment, when it has one.
    pub comment: Option<String>,
}

/// Every rule of table `table` of `family` (`ip`, `ip6`, `inet`), in the kernel's order: empty
/// when there is no such table. One rule dump; no set element is read.
///
/// # Errors
/// The socket fails or the kernel refuses the dump.
pub fn rules(family: &str, table: &str) -> io::Result<Vec<RuleSummary>> {
    let request = dump::table_request(NFT_MSG_GETRULE, family, &[(NFTA_RULE_TABLE, table)])?;
    let mut out = Vec::new();
    let kind = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWRULE;
    match dump::run(request, kind, |msg| out.extend(parse_rule(msg, table))) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(Vec::new()),
        other => other.map(|()| out),
    }
}

/// The big-endian `u32` a payload starts with.
fn be_u32(p: &[u8]) -> Option<u32> {
    p.get(..4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_be_bytes)
}

/// One `NFT_MSG_NEWRULE` message, when it belongs to `table` (older kernels dump every table's
/// rules whatever the request says).
fn parse_rule(msg: &[u8], table: &str) -> Option<RuleSummary> {
    let (mut of_table, mut chain, mut handle, mut comment) = (None, None, None, None);
    let mut verdict = RuleVerdict::Continue;
    let mut matches = Vec::new();
    for (ty, payload) in attr::nf_attrs(msg) {
        match ty {
            NFTA_RULE_TABLE => of_table = Some(string_attr(payload)),
            NFTA_RULE_CHAIN => chain = Some(string_attr(payload)),
            NFTA_RULE_HANDLE => {
                handle = payload
                    .get(..8)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(u64::from_be_bytes)
            }
            NFTA_RULE_USERDATA => comment = udata_comment(payload),
            NFTA_RULE_EXPRESSIONS => {
                for (_, elem) in attr::attrs(payload).filter(|(t, _)| *t == NFTA_LIST_ELEM) {
                    expression(elem, &mut verdict, &mut matches);
                }
            }
            _ => {}
        }
    }
    (of_table? == table).then_some(RuleSummary {
        chain: chain?,
        handle: handle?,
        verdict,
        matches,
        comment,
    })
}

/// Reads one expression: a verdict it sets, or the name of what it matches on.
fn expression(elem: &[u8], verdict: &mut RuleVerdict, matches: &mut Vec<String>) {
    let (mut name, mut data) = (String::new(), &[][..]);
    for (ty, payload) in attr::attrs(elem) {
        match ty {
            NFTA_EXPR_NAME => name = string_attr(payload),
            NFTA_EXPR_DATA => data = payload,
            _ => {}
        }
    }
    let xt_name = || {
        attr::attrs(data)
            .find(|(t, _)| *t == NFTA_XT_NAME)
            .map(|(_, p)| string_attr(p))
            .unwrap_or_default()
    };
    match name.as_str() {
        "immediate" => {
            if let Some(v) = immediate_verdict(data) {
                *verdict = v;
            }
        }
        "reject" => *verdict = RuleVerdict::Reject,
        "target" => {
            if matches!(xt_name().as_str(), "REJECT" | "DROP") {
                *verdict = RuleVerdict::Reject;
            }
        }
        "match" => {
            let m = xt_name();
            if m != "comment" {
                matches.push(format!("xt {m}"));
            }
        }
        // They count, log or set: they match nothing.
        "counter" | "log" | "notrack" | "" => {}
        other => matches.push(other.to_string()),
    }
}

/// The verdict an `immediate` expression writes to the verdict register.
fn immediate_verdict(data: &[u8]) -> Option<RuleVerdict> {
    let mut dreg = None;
    let mut verdict = None;
    for (ty, payload) in attr::attrs(data) {
        match ty {
            NFTA_IMMEDIATE_DREG => dreg = be_u32(payload),
            NFTA_IMMEDIATE_DATA => {
                let v = attr::attrs(payload)
                    .find(|(t, _)| *t == NFTA_DATA_VERDICT)?
                    .1;
                let (mut code, mut chain) = (None, String::new());
                for (ty, p) in attr::attrs(v) {
                    match ty {
                        NFTA_VERDICT_CODE => code = be_u32(p).map(|c| c as i32),
                        NFTA_VERDICT_CHAIN => chain = string_attr(p),
                        _ => {}
                    }
                }
                verdict = Some(match code? {
                    0 => RuleVerdict::Drop,
                    1 => RuleVerdict::Accept,
                    -3 => RuleVerdict::Jump(chain),
                    -4 => RuleVerdict::Goto(chain),
                    -5 => RuleVerdict::Return,
                    _ => RuleVerdict::Continue,
                });
            }
            _ => {}
        }
    }
    (dreg == Some(0)).then_some(verdict?)
}

/// The comment TLV (type 0) of a rule's user data.
fn udata_comment(mut udata: &[u8]) -> Option<String> {
    while let [ty, len, rest @ ..] = udata {
        let value = rest.get(..usize::from(*len))?;
        if *ty == 0 {
            return Some(string_attr(value));
        }
        udata = &rest[usize::from(*len)..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One attribute: its type and payload.
    type Attr = (u16, Vec<u8>);

    fn nested(ty: u16, attrs: &[(u16, Vec<u8>)]) -> (u16, Vec<u8>) {
        let mut buf = Vec::new();
        for (t, p) in attrs {
            attr::put_attr(&mut buf, *t, p);
        }
        (ty | attr::NLA_F_NESTED, buf)
    }

    fn expr(name: &str, data: &[(u16, Vec<u8>)]) -> (u16, Vec<u8>) {
        nested(
            NFTA_LIST_ELEM,
            &[
                (NFTA_EXPR_NAME, [name.as_bytes(), &[0]].concat()),
                nested(NFTA_EXPR_DATA, data),
            ],
        )
    }

    fn verdict(code: i32, chain: Option<&str>) -> (u16, Vec<u8>) {
        let mut v = vec![(NFTA_VERDICT_CODE, code.to_be_bytes().to_vec())];
        if let Some(c) = chain {
            v.push((NFTA_VERDICT_CHAIN, [c.as_bytes(), &[0]].concat()));
        }
        expr(
            "immediate",
            &[
                (NFTA_IMMEDIATE_DREG, 0u32.to_be_bytes().to_vec()),
                nested(NFTA_IMMEDIATE_DATA, &[nested(NFTA_DATA_VERDICT, &v)]),
            ],
        )
    }

    fn rule(table: &str, exprs: &[(u16, Vec<u8>)], comment: Option<&str>) -> Vec<u8> {
        let mut m = Vec::new();
        let start = attr::msg_start(
            &mut m,
            (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWRULE,
            0,
            1,
            libc::NFPROTO_INET as u8,
            0,
        );
        attr::put_str(&mut m, NFTA_RULE_TABLE, table);
        attr::put_str(&mut m, NFTA_RULE_CHAIN, "input");
        attr::put_attr(&mut m, NFTA_RULE_HANDLE, &7u64.to_be_bytes());
        let (ty, list) = nested(NFTA_RULE_EXPRESSIONS, exprs);
        attr::put_attr(&mut m, ty, &list);
        if let Some(c) = comment {
            let mut u = vec![0, (c.len() + 1) as u8];
            u.extend_from_slice(c.as_bytes());
            u.push(0);
            attr::put_attr(&mut m, NFTA_RULE_USERDATA, &u);
        }
        attr::msg_end(&mut m, start);
        m
    }

    /// What each kind of rule reads as: its verdict, its matches by name (counters and
    /// iptables-nft comments left out), its comment; another table's rule is skipped.
    #[test]
    fn rules_are_read_with_their_verdict_and_matches() {
        let xt = |kind: &str, name: &str| {
            expr(kind, &[(NFTA_XT_NAME, [name.as_bytes(), &[0]].concat())])
        };
        // (what, expressions, verdict, matches)
        type Case<'a> = (&'a str, Vec<Attr>, RuleVerdict, &'a [&'a str]);
        let cases: [Case; 6] = [
            (
                "tcp dport { … } drop",
                vec![
                    expr("meta", &[]),
                    expr("cmp", &[]),
                    expr("payload", &[]),
                    expr("lookup", &[]),
                    expr("counter", &[]),
                    verdict(0, None),
                ],
                RuleVerdict::Drop,
                &["meta", "cmp", "payload", "lookup"],
            ),
            (
                "reject",
                vec![expr("reject", &[])],
                RuleVerdict::Reject,
                &[],
            ),
            (
                "jump cali-INPUT (iptables-nft, with a comment match)",
                vec![xt("match", "comment"), verdict(-3, Some("cali-INPUT"))],
                RuleVerdict::Jump("cali-INPUT".into()),
                &[],
            ),
            (
                "iptables-nft -m tcp --dport 32010 -j REJECT",
                vec![xt("match", "tcp"), xt("target", "REJECT")],
                RuleVerdict::Reject,
                &["xt tcp"],
            ),
            (
                "ct state established accept",
                vec![expr("ct", &[]), expr("bitwise", &[]), verdict(1, None)],
                RuleVerdict::Accept,
                &["ct", "bitwise"],
            ),
            (
                "a mark set: no verdict",
                vec![expr("meta", &[])],
                RuleVerdict::Continue,
                &["meta"],
            ),
        ];
        for (what, exprs, want, matches) in cases {
            let got = parse_rule(&rule("tp", &exprs, Some("tenant a")), "tp").expect(what);
            assert_eq!(got.verdict, want, "{what}");
            assert_eq!(got.matches, matches, "{what}");
            assert_eq!(
                (got.chain.as_str(), got.handle, got.comment.as_deref()),
                ("input", 7, Some("tenant a")),
                "{what}"
            );
        }
        assert_eq!(parse_rule(&rule("other", &[], None), "tp"), None);
        assert_eq!(
            parse_rule(&rule("tp", &[], None), "tp").map(|r| r.comment),
            Some(None)
        );
    }
}
