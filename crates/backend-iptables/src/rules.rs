//! One Service port → its iptables rules, as kube-proxy's iptables mode writes them: rules in
//! the shared top-level chains (`KUBE-SERVICES`, `KUBE-NODEPORTS`, …) and the chains only this
//! port uses (`KUBE-SVC-`, `KUBE-SVL-`, `KUBE-EXT-`, `KUBE-FW-`, `KUBE-SEP-`). Pure: no I/O.

use std::net::IpAddr;

use kpng_model::Protocol;

mod render;

pub use render::render;

/// A table of the ruleset, in the order sections appear in restore input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Table {
    /// `mangle`: only the flush-detection canary chain.
    Mangle,
    /// `filter`: REJECT/DROP for unserved Services, source ranges, forwarding.
    Filter,
    /// `nat`: DNAT to endpoints and masquerade marks.
    Nat,
}

impl Table {
    /// Every table, in restore order.
    pub const ALL: [Table; 3] = [Table::Mangle, Table::Filter, Table::Nat];

    /// The table's name (`*nat` in restore input).
    pub fn name(self) -> &'static str {
        match self {
            Table::Mangle => "mangle",
            Table::Filter => "filter",
            Table::Nat => "nat",
        }
    }
}

/// `KUBE-SERVICES`: ClusterIP/external/LB capture (nat), no-endpoint REJECT/DROP (filter).
pub const SERVICES: &str = "KUBE-SERVICES";
/// `KUBE-EXTERNAL-SERVICES` (filter): REJECT/DROP of external destinations without endpoints.
pub const EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
/// `KUBE-NODEPORTS`: node-port capture (nat), health-check port ACCEPT (filter).
pub const NODEPORTS: &str = "KUBE-NODEPORTS";
/// `KUBE-PROXY-FIREWALL` (filter): drops what the load-balancer source ranges refuse.
pub const PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
/// `KUBE-FORWARD` (filter): invalid-state drop, forwarding of marked and established traffic.
pub const FORWARD: &str = "KUBE-FORWARD";
/// `KUBE-MARK-MASQ` (nat): sets the masquerade mark.
pub const MARK_MASQ: &str = "KUBE-MARK-MASQ";
/// `KUBE-POSTROUTING` (nat): masquerades marked traffic.
pub const POSTROUTING: &str = "KUBE-POSTROUTING";
/// `KUBE-FIREWALL` (filter, shared with kubelet): drops martian traffic to 127.0.0.0/8.
pub const KUBELET_FIREWALL: &str = "KUBE-FIREWALL";
/// `KUBE-PROXY-CANARY` (mangle): disappears when someone flushes the tables.
pub const CANARY: &str = "KUBE-PROXY-CANARY";

/// A rule in a chain every Service shares.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SharedRule {
    /// The table of the chain.
    pub table: Table,
    /// The shared chain.
    pub chain: &'static str,
    /// Everything after `-A CHAIN `.
    pub spec: String,
}

/// A nat chain only one Service port uses, with its rules (each after `-A CHAIN `).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnChain {
    /// `KUBE-SVC-…`, `KUBE-SEP-…`, ….
    pub name: String,
    /// The rules, in order.
    pub rules: Vec<String>,
}

/// Everything one Service port puts into the ruleset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortRules {
    /// Rules in the shared chains.
    pub shared: Vec<SharedRule>,
    /// Chains of its own, in creation order (a chain before the chains it jumps to is fine:
    /// restore input declares every chain before any rule).
    pub chains: Vec<OwnChain>,
}

impl PortRules {
    /// Number of rules in `table` (kube-proxy's `sync_proxy_rules_iptables_total`).
    pub fn rule_count(&self, table: Table) -> usize {
        let shared = self.shared.iter().filter(|r| r.table == table).count();
        let own = if table == Table::Nat {
            self.chains.iter().map(|c| c.rules.len()).sum()
        } else {
            0
        };
        shared + own
    }
}

/// How pod traffic is matched, as iptables arguments (`-s 10.244.0.0/16`, `-i cbr0`, …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalMatch {
    /// Matches traffic from pods.
    pub if_local: String,
    /// Matches traffic not from pods.
    pub if_not_local: String,
}

/// The node-level settings a port's rules depend on (per family).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderContext {
    /// `--masquerade-all`.
    pub masquerade_all: bool,
    /// The pod-traffic detector; `None` when not implemented for this family.
    pub local: Option<LocalMatch>,
    /// The node's IP of this family: a load-balancer source range containing it also admits
    /// traffic the node sends from a load-balancer IP.
    pub node_ip: Option<IpAddr>,
}

/// The comment match takes at most this many bytes (`XT_MAX_COMMENT_LEN`, 256 with the NUL):
/// a longer one makes iptables-restore refuse the whole input.
const MAX_COMMENT: usize = 255;

/// A comment argument: quoted when it has spaces, as kube-proxy writes it.
///
/// The text holds names from the input (`ns/name:port`). The conversion refuses names the
/// API server would (`kpng_k8s::validate`), so none of what follows changes a comment kpng
/// writes; it is defence in depth, for whatever reaches here anyway. iptables-restore reads
/// one rule per line, so a newline in a comment would end the rule and start one of the
/// input's choosing; a `"` ends the quoted argument and a `\` escapes the next character
/// inside it, so either breaks the restore of every Service. They are **replaced** by `_`,
/// with every other control character (not escaped: a newline cannot be escaped in
/// restore input at all, and a replaced character reads back from iptables-save as written,
/// so nothing has to be unescaped). The text is cut to [`MAX_COMMENT`] bytes.
fn comment(text: &str) -> String {
    let unsafe_char = |c: char| c.is_control() || c == '"' || c == '\\';
    let mut safe = std::borrow::Cow::Borrowed(text);
    if text.contains(unsafe_char) {
        safe = text
            .chars()
            .map(|c| if unsafe_char(c) { '_' } else { c })
            .collect::<String>()
            .into();
    }
    if safe.len() > MAX_COMMENT {
        let mut end = MAX_COMMENT;
        while !safe.is_char_boundary(end) {
            end -= 1;
        }
        safe = safe[..end].to_string().into();
    }
    if safe.contains(' ') {
        format!("-m comment --comment \"{safe}\"")
    } else {
        format!("-m comment --comment {safe}")
    }
}

/// kube-proxy's probability of rule `i` of `n`: `1/(n-i)` with ten decimals.
pub fn probability(remaining: usize) -> String {
    format!("{:.10}", 1.0 / remaining as f64)
}

/// How a port without endpoints is refused: TCP with a reset, the rest with an ICMP port
/// unreachable (kube-proxy: the ICMP error for TCP too). As the nftables backend's
/// `reject-chain`: a client's kernel drops an ICMPv6 error that arrives while its `connect()`
/// holds the socket lock, and its connection is refused only at the SYN retransmission, 1 s
/// later; a reset is always taken.
pub fn reject_target(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Tcp => "REJECT --reject-with tcp-reset",
        _ => "REJECT",
    }
}
