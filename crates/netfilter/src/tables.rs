//! Which nf_tables tables exist, and their comments, read straight from the kernel.
//!
//! Why not `nft list tables`: nft 1.0.6 (Debian 12) fills its whole cache before it prints
//! anything, set elements included, even for `list tables` and with `-t`. Next to kpng's own
//! table at 30k Services × 4 that is 2.5–2.9 s of CPU and ≈ 450 MB of memory per call, on a
//! node that has just started. A table dump (`NFT_MSG_GETTABLE` with `NLM_F_DUMP`) carries
//! names, families and user data only: well under a millisecond.

use std::io;

use crate::attr::{
    self, NFNL_SUBSYS_NFTABLES, NLM_F_REQUEST, NLMSG_ERROR, NLMSG_HDRLEN, string_attr, u16_at,
};
use crate::dump;
use crate::socket::Socket;

/// `NFT_MSG_GETTABLE`.
const NFT_MSG_GETTABLE: u16 = 1;
/// `NFT_MSG_NEWTABLE`: what each table of the dump arrives as.
const NFT_MSG_NEWTABLE: u16 = 0;
/// `NFT_MSG_NEWCHAIN`: a chain, as the kernel answers a request for it.
const NFT_MSG_NEWCHAIN: u16 = 3;
/// `NFT_MSG_GETCHAIN`.
const NFT_MSG_GETCHAIN: u16 = 4;
/// `NFTA_CHAIN_TABLE`.
const NFTA_CHAIN_TABLE: u16 = 1;
/// `NFTA_CHAIN_NAME`.
const NFTA_CHAIN_NAME: u16 = 3;
/// `NFTA_CHAIN_USERDATA`: nft's TLVs, among them the chain's comment (type 0, as a table's).
const NFTA_CHAIN_USERDATA: u16 = 12;
/// `NFTA_TABLE_NAME`.
const NFTA_TABLE_NAME: u16 = 1;
/// `NFTA_TABLE_USERDATA`: nft's TLVs, among them the table's comment.
const NFTA_TABLE_USERDATA: u16 = 6;
/// `NFTNL_UDATA_TABLE_COMMENT`: the comment's TLV type in a table's user data.
const UDATA_TABLE_COMMENT: u8 = 0;

/// One table as the kernel lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableInfo {
    /// Its family as `nft` spells it (`ip`, `ip6`, `inet`, `arp`, `bridge`, `netdev`).
    pub family: &'static str,
    /// Its name.
    pub name: String,
    /// Its comment (`comment "…"`), when it has one.
    pub comment: Option<String>,
}

/// nft's word for an `NFPROTO_*` value.
fn family_word(nfproto: u8) -> &'static str {
    match i32::from(nfproto) {
        libc::NFPROTO_IPV4 => "ip",
        libc::NFPROTO_IPV6 => "ip6",
        libc::NFPROTO_INET => "inet",
        libc::NFPROTO_ARP => "arp",
        libc::NFPROTO_BRIDGE => "bridge",
        libc::NFPROTO_NETDEV => "netdev",
        _ => "unknown",
    }
}

/// Every table of the calling thread's network namespace, in the kernel's order.
pub fn list_tables() -> io::Result<Vec<TableInfo>> {
    let request = dump::request(NFT_MSG_GETTABLE, libc::NFPROTO_UNSPEC as u8, &[]);
    let mut tables = Vec::new();
    let kind = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWTABLE;
    dump::run(request, kind, |msg| tables.extend(parse_table(msg)))?;
    Ok(tables)
}

/// The table `name` of `family` (`ip`, `ip6`, …): `Ok(None)` when it does not exist.
pub fn find_table(family: &str, name: &str) -> io::Result<Option<TableInfo>> {
    Ok(list_tables()?
        .into_iter()
        .find(|t| t.family == family && t.name == name))
}

/// The comment of chain `chain` in table `table` of `family` (`ip`, `ip6`): `Ok(None)` when
/// there is no such chain (or table), `Some("")` for a chain without a comment. One
/// `NFT_MSG_GETCHAIN` request: no rule or element is read.
pub fn chain_comment(family: &str, table: &str, chain: &str) -> io::Result<Option<String>> {
    let nfproto = dump::nfproto(family)?;
    let socket = Socket::open()?;
    let mut request = Vec::with_capacity(64);
    let start = attr::msg_start(
        &mut request,
        (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETCHAIN,
        NLM_F_REQUEST,
        1,
        nfproto,
        0,
    );
    attr::put_str(&mut request, NFTA_CHAIN_TABLE, table);
    attr::put_str(&mut request, NFTA_CHAIN_NAME, chain);
    attr::msg_end(&mut request, start);
    socket.send(&[request])?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = socket.recv(&mut buf, false)?;
        if let Some(answer) = parse_chain_answer(&buf[..n]) {
            return answer;
        }
    }
}

/// The names of every chain of table `table` of `family` (`ip`, `ip6`), in the kernel's order:
/// empty when there is no such table. One chain dump (`NFT_MSG_GETCHAIN` with `NLM_F_DUMP`):
/// names and hooks only, no rule or element is read.
///
/// Why: a table kpng adopts may hold chains it did not create (a previous run's, or someone's),
/// which only a listing reveals; kpng reads it at full syncs, never in the steady-state loop.
pub fn chain_names(family: &str, table: &str) -> io::Result<Vec<String>> {
    // Older kernels dump every table's chains whatever this says: filtered below as well.
    let request = dump::table_request(NFT_MSG_GETCHAIN, family, &[(NFTA_CHAIN_TABLE, table)])?;
    let mut names = Vec::new();
    let kind = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWCHAIN;
    dump::run(request, kind, |msg| {
        names.extend(chain_of_table(msg, table))
    })?;
    Ok(names)
}

/// `NFTA_CHAIN_HOOK` (nested: `NFTA_HOOK_HOOKNUM`, `NFTA_HOOK_PRIORITY`).
const NFTA_CHAIN_HOOK: u16 = 4;
/// `NFTA_CHAIN_POLICY` (big-endian `u32`: `NF_DROP` 0, `NF_ACCEPT` 1).
const NFTA_CHAIN_POLICY: u16 = 5;
/// `NFTA_CHAIN_TYPE` (`filter`, `nat`, `route`).
const NFTA_CHAIN_TYPE: u16 = 7;
/// `NFTA_HOOK_HOOKNUM` (big-endian `u32`).
const NFTA_HOOK_HOOKNUM: u16 = 1;
/// `NFTA_HOOK_PRIORITY` (big-endian `i32`).
const NFTA_HOOK_PRIORITY: u16 = 2;

/// One base chain (a chain attached to a hook) of any table, as the kernel lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseChain {
    /// Its table's family as `nft` spells it (`ip`, `ip6`, `inet`, …).
    pub family: &'static str,
    /// Its table.
    pub table: String,
    /// Its name.
    pub name: String,
    /// The hook's number (`NF_INET_PRE_ROUTING` 0 … `NF_INET_POST_ROUTING` 4, ingress 5).
    pub hook: u32,
    /// Its priority: lower runs first on the hook.
    pub priority: i32,
    /// Its type (`filter`, `nat`, `route`).
    pub kind: String,
    /// Whether its policy drops what no rule accepted.
    pub policy_drop: bool,
}

impl BaseChain {
    /// nft's word for the hook of a chain of an IP family (`prerouting`, …).
    pub fn hook_name(&self) -> &'static str {
        match self.hook {
            0 => "prerouting",
            1 => "input",
            2 => "forward",
            3 => "output",
            4 => "postrouting",
            5 => "ingress",
            _ => "unknown",
        }
    }
}

/// Every base chain of every table of the calling thread's network namespace: one chain
/// dump (`NFT_MSG_GETCHAIN` with `NLM_F_DUMP`, names, hooks and policies only; no rule or
/// element is read). Regular chains are left out.
///
/// Why: `kpng status` shows the other tables' chains that see a packet before kpng's, or drop
/// what they do not accept, so that "is it kpng or the firewall?" has an answer on the node;
/// read when the status is asked for, never in the sync loop.
pub fn base_chains() -> io::Result<Vec<BaseChain>> {
    let request = dump::request(NFT_MSG_GETCHAIN, libc::NFPROTO_UNSPEC as u8, &[]);
    let mut chains = Vec::new();
    let kind = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWCHAIN;
    dump::run(request, kind, |msg| chains.extend(parse_base_chain(msg)))?;
    Ok(chains)
}

/// One `NFT_MSG_NEWCHAIN` message, when its chain is a base chain.
fn parse_base_chain(msg: &[u8]) -> Option<BaseChain> {
    let family = family_word(*msg.get(NLMSG_HDRLEN)?);
    let be_u32 = |p: &[u8]| {
        p.get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_be_bytes)
    };
    let (mut table, mut name, mut hook, mut priority, mut kind, mut policy_drop) =
        (None, None, None, None, String::new(), false);
    for (ty, payload) in attr::nf_attrs(msg) {
        match ty {
            NFTA_CHAIN_TABLE => table = Some(string_attr(payload)),
            NFTA_CHAIN_NAME => name = Some(string_attr(payload)),
            NFTA_CHAIN_TYPE => kind = string_attr(payload),
            NFTA_CHAIN_POLICY => policy_drop = be_u32(payload) == Some(0),
            NFTA_CHAIN_HOOK => {
                for (ty, value) in attr::attrs(payload) {
                    match ty {
                        NFTA_HOOK_HOOKNUM => hook = be_u32(value),
                        NFTA_HOOK_PRIORITY => {
                            priority = be_u32(value).map(|v| i32::from_be_bytes(v.to_be_bytes()))
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some(BaseChain {
        family,
        table: table?,
        name: name?,
        hook: hook?,
        priority: priority?,
        kind,
        policy_drop,
    })
}

/// The name of the chain of one `NFT_MSG_NEWCHAIN` message, when it belongs to `table`.
fn chain_of_table(msg: &[u8], table: &str) -> Option<String> {
    let (mut of_table, mut name) = (None, None);
    for (ty, payload) in attr::nf_attrs(msg) {
        match ty {
            NFTA_CHAIN_TABLE => of_table = Some(string_attr(payload)),
            NFTA_CHAIN_NAME => name = Some(string_attr(payload)),
            _ => {}
        }
    }
    (of_table? == table).then_some(name?)
}

/// The answer to a chain request, once a datagram holds it.
fn parse_chain_answer(datagram: &[u8]) -> Option<io::Result<Option<String>>> {
    for msg in attr::messages(datagram) {
        match u16_at(msg, 4)? {
            NLMSG_ERROR => {
                return Some(match dump::errno_of(msg) {
                    0 => Ok(None),
                    libc::ENOENT => Ok(None),
                    errno => Err(io::Error::from_raw_os_error(errno)),
                });
            }
            k if k == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWCHAIN => {
                let comment = attr::nf_attrs(msg)
                    .find(|(ty, _)| *ty == NFTA_CHAIN_USERDATA)
                    .and_then(|(_, udata)| udata_comment(udata));
                return Some(Ok(Some(comment.unwrap_or_default())));
            }
            _ => {}
        }
    }
    None
}

/// One `NFT_MSG_NEWTABLE` message.
fn parse_table(msg: &[u8]) -> Option<TableInfo> {
    let family = family_word(*msg.get(NLMSG_HDRLEN)?);
    let (mut name, mut comment) = (None, None);
    for (ty, payload) in attr::nf_attrs(msg) {
        match ty {
            NFTA_TABLE_NAME => name = Some(string_attr(payload)),
            NFTA_TABLE_USERDATA => comment = udata_comment(payload),
            _ => {}
        }
    }
    Some(TableInfo {
        family,
        name: name?,
        comment,
    })
}

/// The comment TLV of nft's user data (type, length, value; the value NUL-terminated), for
/// tables and chains alike.
fn udata_comment(mut udata: &[u8]) -> Option<String> {
    while let [ty, len, rest @ ..] = udata {
        let len = usize::from(*len);
        let value = rest.get(..len)?;
        if *ty == UDATA_TABLE_COMMENT {
            return Some(string_attr(value));
        }
        udata = &rest[len..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dump message as the kernel frames it: header, nfgenmsg, attributes.
    fn message(kind: u16, nfproto: u8, attrs: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut m = Vec::new();
        let start = attr::msg_start(&mut m, kind, 0, 1, nfproto, 0);
        for (ty, payload) in attrs {
            attr::put_attr(&mut m, *ty, payload);
        }
        attr::msg_end(&mut m, start);
        m
    }

    fn table(nfproto: u8, name: &str, udata: Option<Vec<u8>>) -> Vec<u8> {
        let mut attrs = vec![(NFTA_TABLE_NAME, [name.as_bytes(), &[0]].concat())];
        attrs.push((2, 0u32.to_be_bytes().to_vec())); // NFTA_TABLE_FLAGS
        if let Some(u) = udata {
            attrs.push((NFTA_TABLE_USERDATA, u));
        }
        message(
            (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWTABLE,
            nfproto,
            &attrs,
        )
    }

    fn comment_tlv(text: &str) -> Vec<u8> {
        let mut v = vec![UDATA_TABLE_COMMENT, (text.len() + 1) as u8];
        v.extend_from_slice(text.as_bytes());
        v.push(0);
        v
    }

    fn walk_tables(datagram: &[u8], out: &mut Vec<TableInfo>) -> dump::Step {
        let kind = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWTABLE;
        dump::walk(datagram, kind, |msg| out.extend(parse_table(msg)))
    }

    /// A base chain's hook, priority (negative too), type and policy are read; a regular
    /// chain (no hook) is not a base chain.
    #[test]
    fn base_chains_are_read_with_hook_priority_and_policy() {
        let chain = |name: &str, hook: Option<(u32, i32)>, policy: u32| {
            let mut attrs = vec![
                (NFTA_CHAIN_TABLE, b"filter\0".to_vec()),
                (NFTA_CHAIN_NAME, [name.as_bytes(), &[0]].concat()),
            ];
            if let Some((num, prio)) = hook {
                let mut nest = Vec::new();
                attr::put_attr(&mut nest, NFTA_HOOK_HOOKNUM, &num.to_be_bytes());
                attr::put_attr(&mut nest, NFTA_HOOK_PRIORITY, &prio.to_be_bytes());
                attrs.push((NFTA_CHAIN_HOOK | attr::NLA_F_NESTED, nest));
                attrs.push((NFTA_CHAIN_POLICY, policy.to_be_bytes().to_vec()));
                attrs.push((NFTA_CHAIN_TYPE, b"filter\0".to_vec()));
            }
            message(
                (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWCHAIN,
                libc::NFPROTO_INET as u8,
                &attrs,
            )
        };
        assert_eq!(
            parse_base_chain(&chain("forward", Some((2, -150)), 0)),
            Some(BaseChain {
                family: "inet",
                table: "filter".into(),
                name: "forward".into(),
                hook: 2,
                priority: -150,
                kind: "filter".into(),
                policy_drop: true,
            })
        );
        let input = parse_base_chain(&chain("input", Some((1, 0)), 1)).expect("a base chain");
        assert!(!input.policy_drop && input.hook_name() == "input");
        assert_eq!(parse_base_chain(&chain("mine", None, 1)), None);
    }

    #[test]
    fn a_dump_lists_families_names_and_comments_until_done() {
        let ip = libc::NFPROTO_IPV4 as u8;
        let ip6 = libc::NFPROTO_IPV6 as u8;
        let inet = libc::NFPROTO_INET as u8;
        // Another TLV before the comment (a future nft's) is skipped.
        let mut udata = vec![7, 2, 1, 2];
        udata.extend(comment_tlv("managed by kpng (skeleton 1)"));
        let first = [table(ip, "kpng", Some(udata)), table(ip6, "kpng", None)].concat();
        let second = [
            table(inet, "filter", Some(vec![9, 1, 0])),
            message(dump::NLMSG_DONE, 0, &[]),
        ]
        .concat();
        let mut out = Vec::new();
        assert_eq!(walk_tables(&first, &mut out), dump::Step::More);
        assert_eq!(walk_tables(&second, &mut out), dump::Step::Done);
        let seen: Vec<_> = out
            .iter()
            .map(|t| (t.family, t.name.as_str(), t.comment.as_deref()))
            .collect();
        assert_eq!(
            seen,
            [
                ("ip", "kpng", Some("managed by kpng (skeleton 1)")),
                ("ip6", "kpng", None),
                ("inet", "filter", None),
            ]
        );
    }

    #[test]
    fn a_chain_answer_is_its_comment_and_a_missing_chain_is_none() {
        let chain = |udata: Option<Vec<u8>>| {
            let mut attrs = vec![
                (NFTA_CHAIN_TABLE, b"kpng\0".to_vec()),
                (NFTA_CHAIN_NAME, b"skeleton\0".to_vec()),
            ];
            if let Some(u) = udata {
                attrs.push((NFTA_CHAIN_USERDATA, u));
            }
            message((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWCHAIN, 2, &attrs)
        };
        let answer = |d: &[u8]| parse_chain_answer(d).map(|r| r.map_err(|e| e.raw_os_error()));
        assert_eq!(
            answer(&chain(Some(comment_tlv("kpng layout 1")))),
            Some(Ok(Some("kpng layout 1".into())))
        );
        assert_eq!(answer(&chain(None)), Some(Ok(Some(String::new()))));
        let error = |errno: i32| {
            let mut m = Vec::new();
            let start = attr::msg_start(&mut m, NLMSG_ERROR, 0, 1, 0, 0);
            m.truncate(start + NLMSG_HDRLEN);
            m.extend_from_slice(&(-errno).to_ne_bytes());
            m.extend_from_slice(&[0; NLMSG_HDRLEN]);
            attr::msg_end(&mut m, start);
            m
        };
        assert_eq!(answer(&error(libc::ENOENT)), Some(Ok(None)));
        assert_eq!(answer(&error(libc::EPERM)), Some(Err(Some(libc::EPERM))));
        assert_eq!(
            answer(&message(dump::NLMSG_DONE, 0, &[])),
            None,
            "not an answer yet"
        );
    }

    #[test]
    fn a_chain_dump_names_the_chains_of_the_table_asked_for() {
        let chain = |table: &str, name: Option<&str>| {
            let mut attrs = vec![(NFTA_CHAIN_TABLE, [table.as_bytes(), &[0]].concat())];
            if let Some(n) = name {
                attrs.push((NFTA_CHAIN_NAME, [n.as_bytes(), &[0]].concat()));
            }
            message((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWCHAIN, 2, &attrs)
        };
        let datagram = [
            chain("kpng", Some("cluster-n3")),
            chain("filter", Some("INPUT")),
            chain("kpng", None),
            chain("kpng", Some("affinity-t600")),
            message(dump::NLMSG_DONE, 0, &[]),
        ]
        .concat();
        let mut names = Vec::new();
        let kind = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWCHAIN;
        let step = dump::walk(&datagram, kind, |msg| {
            names.extend(chain_of_table(msg, "kpng"))
        });
        assert_eq!(step, dump::Step::Done);
        assert_eq!(names, ["cluster-n3", "affinity-t600"]);
    }

    #[test]
    fn a_refused_dump_is_an_error_and_truncated_data_is_not_a_table() {
        let mut error = Vec::new();
        let start = attr::msg_start(&mut error, NLMSG_ERROR, 0, 1, 0, 0);
        error.truncate(start + NLMSG_HDRLEN);
        error.extend_from_slice(&(-libc::EPERM).to_ne_bytes());
        error.extend_from_slice(&[0; NLMSG_HDRLEN]);
        attr::msg_end(&mut error, start);
        assert_eq!(
            walk_tables(&error, &mut Vec::new()),
            dump::Step::Failed(libc::EPERM)
        );
        // A comment TLV whose length runs past the data, and a table without a name.
        let bad = [
            table(2, "t", Some(vec![UDATA_TABLE_COMMENT, 40, b'x'])),
            message((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWTABLE, 2, &[]),
        ]
        .concat();
        let mut out = Vec::new();
        assert_eq!(walk_tables(&bad, &mut out), dump::Step::More);
        assert_eq!(out.len(), 1);
        assert_eq!(
            (out[0].name.as_str(), out[0].comment.as_deref()),
            ("t", None)
        );
    }
}
