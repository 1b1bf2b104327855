//! The anchor: a tiny nf_tables table, bound to kpng's process, that keeps the kernel NAT-ing
//! established connections while someone else flushes every other table.
//!
//! Why: the kernel applies the NAT a conntrack entry remembers only while the namespace has a
//! NAT base chain (the NAT hooks) and a conntrack user (the conntrack hooks). `nft flush
//! ruleset`, `nft -f` of a file starting with `flush ruleset`, `iptables-restore` or
//! `iptables -F; -X; -t nat -F` remove kpng's rules and with them, on most nodes, every such
//! chain and user. Until kpng's repair (≈100 ms) the packets of established Service
//! connections then pass un-NATed: a client's packet to a NodePort reaches the node itself,
//! which answers with a reset, and the connection is lost.
//!
//! The anchor is one table per family (`ip kpng-anchor`, `ip6 kpng-anchor`) with the owner flag
//! (`NFT_TABLE_F_OWNER`, Linux 5.12): it belongs to the netlink socket that created it, which
//! kpng holds open for its whole life. Another process can neither delete it (`EPERM`) nor
//! flush it (`nft flush ruleset` skips it), and it vanishes with the socket when kpng exits,
//! whichever way: nothing to clean up, nothing left behind. It holds four NAT base chains
//! (prerouting, input, output, postrouting: the NAT hooks) and one rule that loads the
//! conntrack state (a conntrack user). It has no verdict and no statement: it changes no
//! packet. Its cost is nil for established traffic (NAT chains are only evaluated for a
//! connection's first packet) and one chain of at most one rule per hook for a new one.

use std::io;

use kpng_model::Family;

use crate::attr::{
    self, NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END, NFNL_SUBSYS_NFTABLES, NFTA_DATA_VALUE,
    NFTA_LIST_ELEM, NLM_F_ACK, NLM_F_CREATE, NLM_F_REQUEST, NLMSG_ERROR,
};
use crate::socket::Socket;

/// The anchor table's name in each family; a second process holding it makes the next one
/// take `kpng-anchor-<pid>-<random>` ([`Anchor::hold`], [`fallback_name`]).
pub const TABLE: &str = "kpng-anchor";

/// How many fallback names [`Anchor::hold`] tries before giving up (each taken name is
/// another live kpng's; four collisions of 32 random bits do not happen).
const FALLBACK_TRIES: usize = 4;

/// The fallback name of process `pid` with random `suffix`: `kpng-anchor-<pid>-<8 hex>`.
///
/// Why the suffix: the pid alone (`kpng-anchor-<pid>`, until 2026-12-07) is the same for two
/// kpngs that are each pid 1 of their own container and share one network namespace (two
/// host-network containers, or the old and the new one of an upgrade): the third of them
/// found the fallback taken and ran without an anchor.
pub fn fallback_name(pid: u32, suffix: u32) -> String {
    format!("{TABLE}-{pid}-{suffix:08x}")
}

/// Whether `name` is one of kpng's anchor tables: [`TABLE`], a fallback of today
/// (`kpng-anchor-<pid>-<hex>`) or of earlier versions (`kpng-anchor-<pid>`). `kpng status`
/// and `kpng trace` count them as kpng's (not another program's chains); `kpng cleanup`
/// leaves them alone (each goes with its process, and the kernel refuses anyone else).
pub fn is_anchor_table(name: &str) -> bool {
    if name == TABLE {
        return true;
    }
    let Some(rest) = name.strip_prefix(TABLE).and_then(|r| r.strip_prefix('-')) else {
        return false;
    };
    let (pid, suffix) = match rest.split_once('-') {
        Some((pid, suffix)) => (pid, Some(suffix)),
        None => (rest, None),
    };
    !pid.is_empty()
        && pid.bytes().all(|b| b.is_ascii_digit())
        && suffix.is_none_or(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// 32 random bits: std's `RandomState` keys come from the OS's randomness (`getrandom`), and
/// hashing the time and pid into them keeps two calls of one process apart too.
fn random_suffix() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    hasher.write_u128(now);
    hasher.write_u32(std::process::id());
    let h = hasher.finish();
    (h ^ (h >> 32)) as u32
}

/// What the table's comment says to an admin reading `nft list ruleset`.
pub const COMMENT: &str =
    "kpng: keeps established Service connections NATed while other tables are flushed";

const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
/// `NLM_F_EXCL`: fail with `EEXIST` instead of updating a table of that name.
const NLM_F_EXCL: u16 = 0x200;

const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_FLAGS: u16 = 2;
const NFTA_TABLE_USERDATA: u16 = 6;
/// `NFT_TABLE_F_OWNER`: the table belongs to the socket that created it.
pub const NFT_TABLE_F_OWNER: u32 = 0x2;

const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;

const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_RULE_USERDATA: u16 = 7;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;

const NFTA_CT_DREG: u16 = 1;
const NFTA_CT_KEY: u16 = 2;
const NFT_CT_STATE: u32 = 0;
const NFTA_BITWISE_SREG: u16 = 1;
const NFTA_BITWISE_DREG: u16 = 2;
const NFTA_BITWISE_LEN: u16 = 3;
const NFTA_BITWISE_MASK: u16 = 4;
const NFTA_BITWISE_XOR: u16 = 5;
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
const NFT_CMP_NEQ: u32 = 1;
/// `NFT_REG_1`: the first 16-byte register.
const NFT_REG_1: u32 = 1;
/// `ct state established,related` (`NF_CT_STATE_BIT`s, host byte order as nft writes them).
const CT_ESTABLISHED_RELATED: u32 = 0x2 | 0x4;
/// `NFTNL_UDATA_RULE_COMMENT` / `NFTNL_UDATA_TABLE_COMMENT`.
const UDATA_COMMENT: u8 = 0;

/// The rule's comment.
const RULE_COMMENT: &str = "conntrack user: keeps the conntrack hooks (no verdict)";

/// The NAT base chains: name, hook (`NF_INET_*`), priority (`dstnat` -100, `srcnat` 100).
pub const CHAINS: [(&str, u32, i32); 4] = [
    ("prerouting", 0, -100),
    ("input", 1, 100),
    ("output", 3, -100),
    ("postrouting", 4, 100),
];

/// Why an anchor could not be held.
#[derive(Debug, thiserror::Error)]
pub enum AnchorError {
    /// The kernel has no owner flag (before 5.12): the anchor would outlive kpng.
    #[error(
        "this kernel cannot bind a table to its process (the nf_tables owner flag needs Linux 5.12)"
    )]
    Unsupported,
    /// The table exists: another live process holds it (`EPERM`), or someone made one of that
    /// name without the owner flag (`EEXIST`).
    #[error("table {0} exists and is not ours")]
    Taken(String),
    /// The socket failed, or the kernel refused the batch for another reason.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The system's answer.
        #[source]
        source: io::Error,
    },
}

/// The anchor tables of kpng's process, held as long as this value lives (its socket is their
/// owner: dropping it makes the kernel delete them).
#[derive(Debug)]
pub struct Anchor {
    _socket: Socket,
    tables: Vec<String>,
}

impl Anchor {
    /// Creates the anchor table of every family of `families` in the calling thread's network
    /// namespace. The name is [`TABLE`], or [`fallback_name`] (`kpng-anchor-<pid>-<random>`)
    /// when a table of that name exists already (a second kpng in the namespace, or the one
    /// being replaced while it still runs: each holds its own, and each vanishes with its
    /// process); a fallback taken too is tried again with another random suffix.
    ///
    /// # Errors
    /// [`AnchorError::Unsupported`] on kernels without the owner flag; any other refusal of the
    /// kernel for the first family that fails (the anchors made before it are dropped).
    pub fn hold(families: &[Family]) -> Result<Anchor, AnchorError> {
        let socket = Socket::open().map_err(|source| AnchorError::Io {
            context: "opening a NETLINK_NETFILTER socket".into(),
            source,
        })?;
        let mut tables = Vec::new();
        let mut seq = 1;
        for &family in families {
            let word = family_word(family);
            let mut name = TABLE.to_string();
            let mut tries = 0;
            loop {
                match create(&socket, family, &name, &mut seq) {
                    Err(AnchorError::Taken(_)) if tries < FALLBACK_TRIES => {
                        tries += 1;
                        name = fallback_name(std::process::id(), random_suffix());
                    }
                    other => break other?,
                }
            }
            tables.push(format!("{word} {name}"));
        }
        Ok(Anchor {
            _socket: socket,
            tables,
        })
    }

    /// The tables held, as `family name` (`ip kpng-anchor`).
    pub fn tables(&self) -> &[String] {
        &self.tables
    }
}

/// [`Anchor::hold`] for a backend at its start, with the outcome logged: one info line naming
/// the tables, or one line saying why there is none (kpng works without it; only established
/// connections through a foreign flush are at stake). `None` when there is none.
pub fn hold_logged(families: &[Family]) -> Option<Anchor> {
    match Anchor::hold(families) {
        Ok(anchor) => {
            tracing::info!(
                "holding {} (NAT of established connections survives a foreign flush)",
                anchor.tables().join(" and ")
            );
            Some(anchor)
        }
        Err(AnchorError::Unsupported) => {
            tracing::info!(
                "no anchor table: {}; a foreign `nft flush ruleset` or `iptables-restore` may \
                 reset established NodePort connections until kpng's repair",
                AnchorError::Unsupported
            );
            None
        }
        Err(e) => {
            tracing::warn!(
                "no anchor table ({e}); a foreign `nft flush ruleset` or `iptables-restore` may \
                 reset established NodePort connections until kpng's repair"
            );
            None
        }
    }
}

/// nft's word for a family's tables.
fn family_word(family: Family) -> &'static str {
    match family {
        Family::V4 => "ip",
        Family::V6 => "ip6",
    }
}

fn nfproto(family: Family) -> u8 {
    match family {
        Family::V4 => libc::NFPROTO_IPV4 as u8,
        Family::V6 => libc::NFPROTO_IPV6 as u8,
    }
}

/// Sends the batch creating table `name` of `family` and reads the kernel's answers.
fn create(socket: &Socket, family: Family, name: &str, seq: &mut u32) -> Result<(), AnchorError> {
    let first = *seq;
    let (batch, messages) = batch(nfproto(family), name, first);
    *seq = first.wrapping_add(messages as u32 + 2);
    let what = format!("creating table {} {name}", family_word(family));
    let io = |source: io::Error| AnchorError::Io {
        context: what.clone(),
        source,
    };
    socket.send(&[batch]).map_err(io)?;
    // nfnetlink handles a batch in the sender's context: every answer is queued once `send`
    // returned, so reading without waiting sees them all.
    let mut buf = vec![0u8; 16 * 1024];
    let mut acked = 0;
    let mut refusal: Option<(u32, i32)> = None;
    loop {
        let n = match socket.recv(&mut buf, true) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(io(e)),
        };
        for msg in attr::messages(&buf[..n]) {
            if attr::u16_at(msg, 4) != Some(NLMSG_ERROR) {
                continue;
            }
            let at = attr::u32_at(msg, 8).unwrap_or(0).wrapping_sub(first);
            match crate::dump::errno_of(msg) {
                0 => acked += 1,
                errno => {
                    if refusal.is_none() {
                        refusal = Some((at, errno));
                    }
                }
            }
        }
    }
    match refusal {
        None if acked >= messages => Ok(()),
        None => Err(io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("{acked} of {messages} answers"),
        ))),
        // Message 1 is the table: its flags, or the name someone else holds.
        Some((1, libc::EOPNOTSUPP | libc::EINVAL)) => Err(AnchorError::Unsupported),
        Some((1, libc::EPERM | libc::EEXIST)) => Err(AnchorError::Taken(format!(
            "{} {name}",
            family_word(family)
        ))),
        Some((_, errno)) => Err(io(io::Error::from_raw_os_error(errno))),
    }
}

/// The batch creating the anchor table `name` of `nfproto`, its sequence numbers starting at
/// `first_seq` (`BATCH_BEGIN`), and how many messages between `BATCH_BEGIN` and `BATCH_END`
/// (each asks for an ACK).
pub fn batch(nfproto: u8, name: &str, first_seq: u32) -> (Vec<u8>, usize) {
    let mut buf = Vec::with_capacity(1024);
    let mut seq = first_seq;
    let subsys = NFNL_SUBSYS_NFTABLES;
    let begin = attr::msg_start(
        &mut buf,
        NFNL_MSG_BATCH_BEGIN,
        NLM_F_REQUEST,
        seq,
        libc::AF_UNSPEC as u8,
        subsys,
    );
    attr::msg_end(&mut buf, begin);
    let mut messages = 0;
    let mut next = |buf: &mut Vec<u8>, ty: u16, flags: u16| {
        seq = seq.wrapping_add(1);
        messages += 1;
        attr::msg_start(
            buf,
            (subsys << 8) | ty,
            NLM_F_REQUEST | NLM_F_ACK | flags,
            seq,
            nfproto,
            0,
        )
    };

    let m = next(&mut buf, NFT_MSG_NEWTABLE, NLM_F_CREATE | NLM_F_EXCL);
    attr::put_str(&mut buf, NFTA_TABLE_NAME, name);
    attr::put_attr(&mut buf, NFTA_TABLE_FLAGS, &NFT_TABLE_F_OWNER.to_be_bytes());
    attr::put_attr(&mut buf, NFTA_TABLE_USERDATA, &comment_tlv(COMMENT));
    attr::msg_end(&mut buf, m);

    for (chain, hook, priority) in CHAINS {
        let m = next(&mut buf, NFT_MSG_NEWCHAIN, NLM_F_CREATE);
        attr::put_str(&mut buf, NFTA_CHAIN_TABLE, name);
        attr::put_str(&mut buf, NFTA_CHAIN_NAME, chain);
        let h = attr::nest_start(&mut buf, NFTA_CHAIN_HOOK);
        attr::put_attr(&mut buf, NFTA_HOOK_HOOKNUM, &hook.to_be_bytes());
        attr::put_attr(&mut buf, NFTA_HOOK_PRIORITY, &priority.to_be_bytes());
        attr::nest_end(&mut buf, h);
        attr::put_attr(
            &mut buf,
            NFTA_CHAIN_POLICY,
            &(attr::NF_ACCEPT as u32).to_be_bytes(),
        );
        attr::put_str(&mut buf, NFTA_CHAIN_TYPE, "nat");
        attr::msg_end(&mut buf, m);
    }

    // `ct state established,related` in prerouting, without a statement: what matters is
    // the `ct` expression, a conntrack user for as long as the rule exists.
    let m = next(&mut buf, NFT_MSG_NEWRULE, NLM_F_CREATE);
    attr::put_str(&mut buf, NFTA_RULE_TABLE, name);
    attr::put_str(&mut buf, NFTA_RULE_CHAIN, CHAINS[0].0);
    let exprs = attr::nest_start(&mut buf, NFTA_RULE_EXPRESSIONS);
    expr(&mut buf, "ct", |b| {
        attr::put_attr(b, NFTA_CT_KEY, &NFT_CT_STATE.to_be_bytes());
        attr::put_attr(b, NFTA_CT_DREG, &NFT_REG_1.to_be_bytes());
    });
    expr(&mut buf, "bitwise", |b| {
        attr::put_attr(b, NFTA_BITWISE_SREG, &NFT_REG_1.to_be_bytes());
        attr::put_attr(b, NFTA_BITWISE_DREG, &NFT_REG_1.to_be_bytes());
        attr::put_attr(b, NFTA_BITWISE_LEN, &4u32.to_be_bytes());
        data(b, NFTA_BITWISE_MASK, &CT_ESTABLISHED_RELATED.to_ne_bytes());
        data(b, NFTA_BITWISE_XOR, &0u32.to_ne_bytes());
    });
    expr(&mut buf, "cmp", |b| {
        attr::put_attr(b, NFTA_CMP_SREG, &NFT_REG_1.to_be_bytes());
        attr::put_attr(b, NFTA_CMP_OP, &NFT_CMP_NEQ.to_be_bytes());
        data(b, NFTA_CMP_DATA, &0u32.to_ne_bytes());
    });
    attr::nest_end(&mut buf, exprs);
    attr::put_attr(&mut buf, NFTA_RULE_USERDATA, &comment_tlv(RULE_COMMENT));
    attr::msg_end(&mut buf, m);

    let end = attr::msg_start(
        &mut buf,
        NFNL_MSG_BATCH_END,
        NLM_F_REQUEST,
        seq.wrapping_add(1),
        libc::AF_UNSPEC as u8,
        subsys,
    );
    attr::msg_end(&mut buf, end);
    (buf, messages)
}

/// One expression of a rule: `NFTA_LIST_ELEM { NFTA_EXPR_NAME, NFTA_EXPR_DATA { … } }`.
fn expr(buf: &mut Vec<u8>, name: &str, body: impl FnOnce(&mut Vec<u8>)) {
    let elem = attr::nest_start(buf, NFTA_LIST_ELEM);
    attr::put_str(buf, NFTA_EXPR_NAME, name);
    let data = attr::nest_start(buf, NFTA_EXPR_DATA);
    body(buf);
    attr::nest_end(buf, data);
    attr::nest_end(buf, elem);
}

/// A data attribute: `ty { NFTA_DATA_VALUE bytes }`.
fn data(buf: &mut Vec<u8>, ty: u16, bytes: &[u8]) {
    let nest = attr::nest_start(buf, ty);
    attr::put_attr(buf, NFTA_DATA_VALUE, bytes);
    attr::nest_end(buf, nest);
}

/// nft's user data TLV of a comment (type 0, length, text and its NUL).
fn comment_tlv(text: &str) -> Vec<u8> {
    let mut tlv = vec![UDATA_COMMENT, (text.len() + 1) as u8];
    tlv.extend_from_slice(text.as_bytes());
    tlv.push(0);
    tlv
}

/// The (type, flags) of each message of a batch, for tests.
#[cfg(test)]
fn message_types(batch: &[u8]) -> Vec<(u16, u16)> {
    attr::messages(batch)
        .filter_map(|m| Some((attr::u16_at(m, 4)?, attr::u16_at(m, 6)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(payload: &[u8]) -> Vec<(u16, Vec<u8>)> {
        attr::attrs(payload).map(|(t, p)| (t, p.to_vec())).collect()
    }

    #[test]
    fn the_batch_makes_an_owned_table_of_nat_chains_and_a_conntrack_user_without_verdicts() {
        let (batch, messages) = batch(libc::NFPROTO_IPV4 as u8, TABLE, 7);
        let types = message_types(&batch);
        let sub = NFNL_SUBSYS_NFTABLES << 8;
        assert_eq!(
            types.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
            [
                NFNL_MSG_BATCH_BEGIN,
                sub | NFT_MSG_NEWTABLE,
                sub | NFT_MSG_NEWCHAIN,
                sub | NFT_MSG_NEWCHAIN,
                sub | NFT_MSG_NEWCHAIN,
                sub | NFT_MSG_NEWCHAIN,
                sub | NFT_MSG_NEWRULE,
                NFNL_MSG_BATCH_END,
            ]
        );
        assert_eq!(messages, 6);
        // Every message between BEGIN and END asks for an ACK; the table is exclusive.
        assert!(types[1..7].iter().all(|(_, f)| f & NLM_F_ACK != 0));
        assert_ne!(types[1].1 & NLM_F_EXCL, 0);
        let msgs: Vec<&[u8]> = attr::messages(&batch).collect();
        // Sequence numbers follow each other from the first.
        let seqs: Vec<u32> = msgs.iter().filter_map(|m| attr::u32_at(m, 8)).collect();
        assert_eq!(seqs, (7..15).collect::<Vec<_>>());

        // The table: its name and the owner flag.
        let table: Vec<_> = attr::nf_attrs(msgs[1]).collect();
        assert!(table.contains(&(NFTA_TABLE_NAME, b"kpng-anchor\0".as_slice())));
        assert!(table.contains(&(NFTA_TABLE_FLAGS, NFT_TABLE_F_OWNER.to_be_bytes().as_slice())));

        // Four NAT base chains, one per hook, policy accept.
        let mut hooks = Vec::new();
        for chain in &msgs[2..6] {
            let a: Vec<_> = attr::nf_attrs(chain).collect();
            assert!(a.contains(&(NFTA_CHAIN_TYPE, b"nat\0".as_slice())));
            assert!(a.contains(&(NFTA_CHAIN_POLICY, 1u32.to_be_bytes().as_slice())));
            let hook = a.iter().find(|(t, _)| *t == NFTA_CHAIN_HOOK).expect("hook");
            let hook = nested(hook.1);
            hooks.push(u32::from_be_bytes(hook[0].1[..4].try_into().expect("4")));
        }
        assert_eq!(hooks, [0, 1, 3, 4]);

        // One rule whose expressions load the conntrack state and compare: no `immediate`
        // (a verdict), no statement.
        let rule: Vec<_> = attr::nf_attrs(msgs[6]).collect();
        let exprs = rule
            .iter()
            .find(|(t, _)| *t == NFTA_RULE_EXPRESSIONS)
            .expect("expressions");
        let names: Vec<String> = nested(exprs.1)
            .iter()
            .map(|(_, e)| attr::string_attr(&nested(e)[0].1))
            .collect();
        assert_eq!(names, ["ct", "bitwise", "cmp"]);
    }

    /// Every anchor name is recognised, the fallbacks of two pid-1 kpngs differ, and kpng's
    /// other tables or look-alikes are not anchors.
    #[test]
    fn anchor_names_are_unique_per_process_and_recognised() {
        let cases = [
            (TABLE.to_string(), true),
            (fallback_name(1, 0xdead_beef), true),
            (fallback_name(4_194_304, 0), true),
            // What kpng before 2026-12-07 named its fallback.
            ("kpng-anchor-1".to_string(), true),
            ("kpng".to_string(), false),
            ("kpng-userspace".to_string(), false),
            ("kpng-anchors".to_string(), false),
            ("kpng-anchor-".to_string(), false),
            ("kpng-anchor-x1".to_string(), false),
            ("kpng-anchor-1-".to_string(), false),
            ("kpng-anchor-1-zz".to_string(), false),
        ];
        for (name, want) in cases {
            assert_eq!(is_anchor_table(&name), want, "{name}");
        }
        assert_eq!(fallback_name(1, 0xab), "kpng-anchor-1-000000ab");
        // Two pid-1 processes in one namespace: the kernel's random bits tell them apart.
        let (a, b) = (random_suffix(), random_suffix());
        assert_ne!(fallback_name(1, a), fallback_name(1, b));
        // Within nft's 256-byte name limit.
        assert!(fallback_name(u32::MAX, u32::MAX).len() < 256);
    }

    #[test]
    fn the_comments_fit_nfts_limit() {
        assert!(COMMENT.len() < attr::COMMENT_MAX);
        assert!(RULE_COMMENT.len() < attr::COMMENT_MAX);
    }
}
