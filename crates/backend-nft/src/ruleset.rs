//! The constant part of the ruleset: one table per family, named sets and maps, and a fixed set
//! of chains. Nothing here grows with Services or endpoints: those live in set/map elements
//! (see [`crate::elements`]). The only chains added at run time are one random-selection chain
//! per *distinct endpoint count* (`cluster-n3` …) and one affinity-recording chain per distinct
//! affinity timeout.

use std::fmt::{self, Write as _};

use ipnet::IpNet;
use kpng_model::{Family, NodeState, Protocol};

use crate::sets::Set;

/// The L4 protocols a Service port can use, in rule order.
const PROTOCOLS: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

/// Family-specific nft spellings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fam(pub Family);

impl Fam {
    /// The table family (`ip` / `ip6`).
    pub fn table_family(self) -> &'static str {
        match self.0 {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        }
    }
    /// The address type (`ipv4_addr` / `ipv6_addr`).
    pub fn addr_type(self) -> &'static str {
        match self.0 {
            Family::V4 => "ipv4_addr",
            Family::V6 => "ipv6_addr",
        }
    }
    /// The header keyword for addresses (`ip` / `ip6`), as in `ip daddr`.
    pub fn l3(self) -> &'static str {
        self.table_family()
    }
    /// The DNAT that follows an affinity entry, the rule that forgets an entry whose endpoint
    /// is gone (prefix; `drop` follows) and the rule that records one with `timeout`. The maps
    /// themselves are declared in [`crate::sets`]. The affinity id is `ct mark & mask`: kpng
    /// reads only its own bits of the conntrack mark ([`crate::affinity`]).
    ///
    /// IPv4: one map `client . affinity id → endpoint . port`. IPv6 needs another shape because
    /// nft 1.0.6 mis-encodes packet-path map updates whose key is longer than 16 bytes (the
    /// key's tail is overwritten) or has an IPv6 address before its last field (nft aborts):
    /// the key is `affinity id . jhash(client)` (8 bytes; an explicit seed, or the lookup and
    /// the update would hash differently) and the endpoint's address and port are two maps
    /// (`affinity-addr`, `affinity-port`). Two clients whose 32-bit hashes collide share one
    /// entry, which only makes them stick to the same endpoint.
    pub fn affinity(self, mask: u32) -> AffinityRules {
        let id = affinity_id(mask);
        match self.0 {
            Family::V4 => AffinityRules {
                // nft 1.0.6 parses a bitwise key in `dnat … to` only in parentheses.
                dnat: format!("dnat ip to ip saddr . ({id}) map @affinity"),
                forget: format!("delete @affinity {{ ip saddr . {id} : ip daddr . th dport }}"),
                record: Box::new(move |t| {
                    format!(
                        "update @affinity {{ ip saddr . {id} timeout {t}s : ip daddr . th dport }}"
                    )
                }),
            },
            Family::V6 => {
                let key = format!("{id} . jhash ip6 saddr mod 4294967295 seed 0x6b706e67");
                AffinityRules {
                    dnat: format!(
                        "dnat ip6 to {key} map @affinity-addr : {key} map @affinity-port"
                    ),
                    forget: format!(
                        "delete @affinity-addr {{ {key} : ip6 daddr }} delete @affinity-port {{ {key} : th dport }}"
                    ),
                    record: Box::new(move |t| {
                        format!(
                            "update @affinity-addr {{ {key} timeout {t}s : ip6 daddr }} update @affinity-port {{ {key} timeout {t}s : th dport }}"
                        )
                    }),
                }
            }
        }
    }

    /// Loopback, which never takes NodePort traffic in nftables mode.
    pub fn loopback(self) -> &'static str {
        match self.0 {
            Family::V4 => "127.0.0.0/8",
            Family::V6 => "::1",
        }
    }
}

pub use kpng_backend::settings::DetectLocal;

/// The affinity id of a connection: kpng's bits of its conntrack mark (`ct mark & MASK`).
pub fn affinity_id(mask: u32) -> String {
    format!("ct mark & {mask:#010x}")
}

/// Everything that shapes the constant rules of one family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticConfig {
    /// `--masquerade-all`.
    pub masquerade_all: bool,
    /// `1 << --masquerade-bit`: the only bit of the packet mark kpng sets or clears.
    pub mark: u32,
    /// `--conntrack-mark-mask`: the only bits of the conntrack mark kpng uses (affinity ids).
    pub affinity_mask: u32,
    /// Match for "this packet comes from a pod", e.g. `ip saddr 10.244.0.0/16`; `None` when the
    /// family has no detector.
    pub local_match: Option<String>,
    /// The negation of `local_match`.
    pub non_local_match: Option<String>,
    /// Node ports on every local address of the family (kube-proxy's match-all
    /// `--nodeport-addresses`): matched by `fib daddr type local`, loopback excepted, instead
    /// of the `nodeport-ips` set, so an address the node gains serves them at once.
    pub nodeports_on_local_addresses: bool,
}

impl StaticConfig {
    /// What differs from `other`, in words, for the log line of a full sync that replaces
    /// this configuration's rules with `other`'s (the pod-traffic match follows the node's
    /// pod CIDRs in NodeCIDR mode).
    pub fn change_to(&self, other: &StaticConfig) -> String {
        let mut out = Vec::new();
        if self.local_match != other.local_match {
            out.push(format!(
                "pod traffic match {} → {}",
                self.local_match.as_deref().unwrap_or("none"),
                other.local_match.as_deref().unwrap_or("none")
            ));
        }
        if self.nodeports_on_local_addresses != other.nodeports_on_local_addresses {
            let on = |all: bool| {
                if all {
                    "every local address"
                } else {
                    "the listed addresses"
                }
            };
            out.push(format!(
                "node ports on {} → {}",
                on(self.nodeports_on_local_addresses),
                on(other.nodeports_on_local_addresses)
            ));
        }
        if self.masquerade_all != other.masquerade_all
            || self.mark != other.mark
            || self.affinity_mask != other.affinity_mask
        {
            out.push("masquerade or mark settings".into());
        }
        if out.is_empty() {
            out.push("rules".into());
        }
        out.join(", ")
    }

    /// Derives the per-family configuration from the flags and the node;
    /// `nodeports_on_local_addresses` is whether the family's `--nodeport-addresses` scope on
    /// this node is every local address.
    pub fn new(
        fam: Fam,
        masquerade_all: bool,
        masquerade_bit: u8,
        affinity_mask: u32,
        detect: &DetectLocal,
        node: &NodeState,
        nodeports_on_local_addresses: bool,
    ) -> Self {
        let cidr_match = |cidrs: Vec<IpNet>| -> (Option<String>, Option<String>) {
            let mine: Vec<String> = cidrs
                .iter()
                .filter(|c| Family::of(&c.addr()) == fam.0)
                .map(|c| c.to_string())
                .collect();
            match mine.len() {
                0 => (None, None),
                1 => (
                    Some(format!("{} saddr {}", fam.l3(), mine[0])),
                    Some(format!("{} saddr != {}", fam.l3(), mine[0])),
                ),
                _ => {
                    let set = mine.join(", ");
                    (
                        Some(format!("{} saddr {{ {set} }}", fam.l3())),
                        Some(format!("{} saddr != {{ {set} }}", fam.l3())),
                    )
                }
            }
        };
        let (local_match, non_local_match) = match detect {
            DetectLocal::None => (None, None),
            DetectLocal::ClusterCidr(c) => cidr_match(c.clone()),
            DetectLocal::NodeCidr => cidr_match(node.pod_cidrs.clone()),
            DetectLocal::BridgeInterface(b) => (
                Some(format!("iifname \"{b}\"")),
                Some(format!("iifname != \"{b}\"")),
            ),
            DetectLocal::InterfaceNamePrefix(p) => (
                Some(format!("iifname \"{p}*\"")),
                Some(format!("iifname != \"{p}*\"")),
            ),
        };
        StaticConfig {
            masquerade_all,
            mark: 1u32 << masquerade_bit.min(31),
            affinity_mask,
            local_match,
            non_local_match,
            nodeports_on_local_addresses,
        }
    }

    /// The match for "a node-port address" in `fam`'s rules.
    fn nodeport_destination(&self, fam: Fam) -> String {
        if self.nodeports_on_local_addresses {
            format!(
                "fib daddr type local {} daddr != {}",
                fam.l3(),
                fam.loopback()
            )
        } else {
            format!("{} daddr @nodeport-ips", fam.l3())
        }
    }
}

/// The kinds of random-selection chains, one per distinct endpoint count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PickKind {
    /// VIP traffic to cluster-policy endpoints (`cluster-n<k>`).
    Cluster,
    /// VIP traffic to local-policy endpoints (`local-n<k>`).
    Local,
    /// NodePort traffic to cluster-policy endpoints (`nodeport-cluster-n<k>`).
    NodePortCluster,
    /// NodePort traffic to local-policy endpoints (`nodeport-local-n<k>`).
    NodePortLocal,
}

impl PickKind {
    /// The chain's name prefix.
    pub fn prefix(self) -> &'static str {
        match self {
            PickKind::Cluster => "cluster-n",
            PickKind::Local => "local-n",
            PickKind::NodePortCluster => "nodeport-cluster-n",
            PickKind::NodePortLocal => "nodeport-local-n",
        }
    }
    /// Every kind, in declaration order.
    pub const ALL: [PickKind; 4] = [
        PickKind::Cluster,
        PickKind::Local,
        PickKind::NodePortCluster,
        PickKind::NodePortLocal,
    ];

    /// The kind for an entry point (a node port or a VIP) and an endpoint list.
    pub fn of(node_port: bool, local: bool) -> PickKind {
        match (node_port, local) {
            (false, false) => PickKind::Cluster,
            (false, true) => PickKind::Local,
            (true, false) => PickKind::NodePortCluster,
            (true, true) => PickKind::NodePortLocal,
        }
    }

    /// The verdict map from an entry point to its `*-n<k>` chain.
    pub fn pick_map(self) -> Set {
        Set::Pick(self)
    }

    /// The set of an entry point's affinity-id bits.
    pub fn affinity_bits_set(self) -> Set {
        Set::AffinityBits(self)
    }

    /// Whether the slots are keyed by VIP (else by node port only).
    pub const fn keyed_by_vip(self) -> bool {
        matches!(self, PickKind::Cluster | PickKind::Local)
    }

    /// The slot map the chain selects from, for one L4 protocol.
    pub fn slot_map(self, protocol: Protocol) -> Set {
        Set::Endpoints(self, protocol)
    }
    /// The chain for `n` endpoints.
    pub fn chain(self, n: u32) -> DynamicChain {
        DynamicChain::Pick(self, n)
    }
}

/// A chain created on demand (its name and its single rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DynamicChain {
    /// Random selection among `n` endpoint slots.
    Pick(PickKind, u32),
    /// Record ClientIP affinity with this timeout (seconds).
    AffinityTimeout(u32),
}

impl fmt::Display for DynamicChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DynamicChain::Pick(kind, n) => write!(f, "{}{n}", kind.prefix()),
            DynamicChain::AffinityTimeout(t) => write!(f, "affinity-t{t}"),
        }
    }
}

impl DynamicChain {
    /// The chain's name.
    pub fn name(&self) -> String {
        self.to_string()
    }

    /// The dynamic chain named `name` (the inverse of [`DynamicChain::name`]); `None` for any
    /// other chain, so that a chain listing of the table yields the dynamic ones only.
    pub fn from_name(name: &str) -> Option<DynamicChain> {
        let number = |rest: &str| rest.parse::<u32>().ok();
        let chain = match name.strip_prefix("affinity-t") {
            Some(rest) => DynamicChain::AffinityTimeout(number(rest)?),
            None => PickKind::ALL.iter().find_map(|kind| {
                let n = number(name.strip_prefix(kind.prefix())?)?;
                Some(DynamicChain::Pick(*kind, n))
            })?,
        };
        // `cluster-n03` or `cluster-n+3` is not a name kpng writes.
        (chain.name() == name).then_some(chain)
    }

    /// The chain's rules; `mask` is `--conntrack-mark-mask` (affinity ids).
    pub fn rules(&self, fam: Fam, mask: u32) -> Vec<String> {
        let l3 = fam.l3();
        match self {
            DynamicChain::Pick(kind, n) => PROTOCOLS
                .iter()
                .map(|proto| {
                    let p = proto.lower();
                    let daddr = if kind.keyed_by_vip() { format!("{l3} daddr . ") } else { String::new() };
                    format!(
                        "meta l4proto {p} dnat {l3} to {daddr}{p} dport . numgen random mod {n} map @{}",
                        kind.slot_map(*proto).name()
                    )
                })
                .collect(),
            DynamicChain::AffinityTimeout(t) => vec![
                // An entry that points at an endpoint which is gone: forget it. The packet is
                // dropped once; the client's retransmission is balanced afresh.
                format!(
                    "{} . {l3} daddr . th dport != @affinity-valid {} drop",
                    affinity_id(mask),
                    fam.affinity(mask).forget
                ),
                (fam.affinity(mask).record)(*t),
            ],
        }
    }
}

/// The ClientIP-affinity pieces of one family's table ([`Fam::affinity`]).
pub struct AffinityRules {
    /// The DNAT to the recorded endpoint.
    pub dnat: String,
    /// Deletes the client's entry.
    pub forget: String,
    /// Records the entry with a timeout in seconds.
    pub record: Box<dyn Fn(u32) -> String>,
}

/// Renders the whole constant part of one family's table, as one `table … { … }` block.
///
/// An empty chain, [`MARKER_CHAIN`], carries the skeleton's id (a hash of everything else in
/// the block) in its comment, so that a later run can tell, reading one chain and no element,
/// whether the table in the kernel has exactly this skeleton (adopt it by replacing elements
/// only) or another of the same [`LAYOUT`] (put the rules back in place, then the elements).
/// Not the table's comment: the kernel keeps a table's first comment for good, while a chain
/// can be deleted and added again in the transaction that changes the rules.
pub fn skeleton(fam: Fam, table: &str, cfg: &StaticConfig) -> String {
    let s = render(fam, table, cfg, Part::Whole);
    s.replace(MARKER_MARK, &marker(skeleton_id(&s)))
}

/// A new table's skeleton in two transactions (`fill.rs`): everything but the base chains,
/// with the marker saying the table is still being filled, then the base chains and the
/// marker of the whole [`skeleton`].
///
/// Why: at every commit that adds a `goto` element the kernel validates the table from each of
/// its base chains, walking every verdict-map element reachable from them (at 30k × 4 about
/// 72k elements, again at each of the fill's transactions). A table without base chains has
/// nothing to validate, so the fill costs no validation and the base chains' transaction one.
/// And no packet meets the table before it is complete: every Service appears at once.
pub fn skeleton_in_two(fam: Fam, table: &str, cfg: &StaticConfig) -> (String, String) {
    let f = fam.table_family();
    let id = skeleton_id(&render(fam, table, cfg, Part::Whole));
    let without = render(fam, table, cfg, Part::WithoutHooks).replace(MARKER_MARK, FILLING);
    let mut hooks = format!("delete chain {f} {table} {MARKER_CHAIN}\n");
    hooks.push_str(&render(fam, table, cfg, Part::HooksOnly).replace(MARKER_MARK, &marker(id)));
    (without, hooks)
}

/// Which chains a rendering of the skeleton holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// All of it.
    Whole,
    /// The table, its sets and every chain but the base chains.
    WithoutHooks,
    /// The base chains (hooked to netfilter) and the marker chain.
    HooksOnly,
}

/// The skeleton's id: a hash of its text with the marker left out.
fn skeleton_id(rendered: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    rendered.hash(&mut h);
    h.finish()
}

fn render(fam: Fam, table: &str, cfg: &StaticConfig, part: Part) -> String {
    let (f, l3) = (fam.table_family(), fam.l3());
    let mark = format!("{:#x}", cfg.mark);
    let mut s = String::new();
    let _ = writeln!(s, "table {f} {table} {{");
    if part != Part::HooksOnly {
        let _ = writeln!(s, "\tcomment \"{TABLE_COMMENT}\"");
    }
    let _ = writeln!(
        s,
        "\tchain {MARKER_CHAIN} {{\n\t\tcomment \"{MARKER_MARK}\"\n\t}}"
    );
    if part != Part::HooksOnly {
        for set in Set::of_family(fam.0) {
            let _ = writeln!(s, "\t{}", set.decl().render(fam));
        }
    }

    let chain = |s: &mut String, name: &str, base: Option<&str>, rules: &[String]| {
        let wanted = match part {
            Part::Whole => true,
            Part::WithoutHooks => base.is_none(),
            Part::HooksOnly => base.is_some(),
        };
        if !wanted {
            return;
        }
        let _ = writeln!(s, "\tchain {name} {{");
        if let Some(base) = base {
            let _ = writeln!(s, "\t\t{base}; policy accept;");
        }
        for r in rules {
            let _ = writeln!(s, "\t\t{r}");
        }
        let _ = writeln!(s, "\t}}");
    };
    let r = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let vipkey = format!("{l3} daddr . meta l4proto . th dport");
    let masq = format!("meta mark set meta mark or {mark}");
    let nodeport_destination = cfg.nodeport_destination(fam);

    // Filter, after DNAT: no-endpoint and wrong-port checks, and the recording of ClientIP
    // affinity (the packet now carries the chosen endpoint, and every packet reaches one of
    // these chains: input or forward coming in, output going out). The firewall of
    // loadBalancerSourceRanges must see the packet before DNAT: it runs first in the NAT chains
    // below. No other base chains: each one costs every packet a hook traversal.
    let id = affinity_id(cfg.affinity_mask);
    let record_affinity = format!("ct state new ct status dnat {id} vmap @affinity-timeouts");
    let record_affinity = record_affinity.as_str();
    chain(
        &mut s,
        "filter-input",
        Some("type filter hook input priority 0"),
        &r(&[
            record_affinity,
            "ct state new jump nodeport-endpoints-check",
            "ct state new jump service-endpoints-check",
        ]),
    );
    for hook in ["forward", "output"] {
        chain(
            &mut s,
            &format!("filter-{hook}"),
            Some(&format!("type filter hook {hook} priority 0")),
            &r(&[
                record_affinity,
                "ct state new jump service-endpoints-check",
                "ct state new jump cluster-ips-check",
            ]),
        );
    }
    chain(
        &mut s,
        "firewall-check",
        None,
        &[format!(
            "{vipkey} @firewall-ips {vipkey} . {l3} saddr != @firewall-allow drop"
        )],
    );
    chain(
        &mut s,
        "service-endpoints-check",
        None,
        &[format!("{vipkey} vmap @no-endpoint-services")],
    );
    chain(
        &mut s,
        "nodeport-endpoints-check",
        None,
        &[format!(
            "{nodeport_destination} meta l4proto . th dport vmap @no-endpoint-nodeports"
        )],
    );
    // A wrong port of an active ClusterIP is refused like a Service without endpoints:
    // through `reject-chain`.
    chain(
        &mut s,
        "cluster-ips-check",
        None,
        &[
            format!("{l3} daddr @cluster-ips goto reject-chain"),
            format!("{l3} daddr @service-cidrs drop"),
        ],
    );
    // Every reject of kpng's: a TCP reset where TCP is concerned, an ICMP port unreachable
    // otherwise (kube-proxy: an ICMP error for both). A client's kernel drops an ICMPv6 error
    // that arrives while its connect() holds the socket lock (`TcpExtLockDroppedIcmps`), and
    // only the SYN retransmission 1 s later is refused; a reset is always taken.
    chain(
        &mut s,
        "reject-chain",
        None,
        &r(&["meta l4proto tcp reject with tcp reset", "reject"]),
    );

    // NAT: the firewall, then dispatch. NAT chains see exactly the first packet of each
    // connection, before DNAT: what kube-proxy's `filter-*-pre-dnat` chains (priority −110,
    // `ct state new`) select, without two more base chains that every packet of every
    // connection would traverse (each costs a few per cent of a loopback connect).
    chain(
        &mut s,
        "nat-prerouting",
        Some("type nat hook prerouting priority dstnat"),
        &r(&["jump firewall-check", "jump services"]),
    );
    chain(
        &mut s,
        "nat-output",
        Some("type nat hook output priority -100"),
        &r(&["jump firewall-check", "jump services"]),
    );
    chain(
        &mut s,
        "nat-postrouting",
        Some("type nat hook postrouting priority srcnat"),
        &r(&["jump masquerading"]),
    );
    let mut services = Vec::new();
    if cfg.masquerade_all {
        services.push(format!("{l3} daddr @cluster-ips {masq}"));
    } else if let Some(non_local) = &cfg.non_local_match {
        services.push(format!("{l3} daddr @cluster-ips {non_local} {masq}"));
    }
    services.push(format!("{vipkey} vmap @service-ips"));
    services.push(format!(
        "{nodeport_destination} meta l4proto . th dport vmap @service-nodeports"
    ));
    chain(&mut s, "services", None, &services);
    chain(
        &mut s,
        "masquerading",
        None,
        &[
            format!(
                "meta mark and {mark} != 0 meta mark set meta mark xor {mark} masquerade fully-random"
            ),
            format!(
                "ct status dnat {l3} saddr . {l3} daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random"
            ),
        ],
    );

    // Entry chains of external traffic (node ports, external IPs, load-balancer IPs) and of
    // affinity Services. Each exists for VIPs (keyed by daddr) and for node ports (keyed by port).
    for (prefix, key) in [
        ("", vipkey.clone()),
        ("nodeport-", "meta l4proto . th dport".to_string()),
    ] {
        let pick = |list: &str| format!("{key} vmap @{prefix}{list}-pick");
        // The list's affinity id into kpng's bits of the conntrack mark, every other bit kept:
        // clear them, then set them one by one from `affinity-bits-*` (a constant per rule:
        // nft 1.0.6 cannot OR a looked-up value into the mark). `ct mark & 0x0 | BIT` is the
        // constant BIT as a `mark` field of the set's key (`nft list` prints it as
        // `ct mark & BIT | BIT`, the same value).
        let set_id = |list: &str| {
            let mask = cfg.affinity_mask;
            let mut rules = vec![format!("ct mark set ct mark & {:#010x}", !mask)];
            for bit in crate::affinity::bits(mask) {
                rules.push(format!(
                    "{key} . ct mark & 0x0 | {bit:#010x} @{prefix}affinity-bits-{list} ct mark set ct mark | {bit:#010x}"
                ));
            }
            rules
        };
        for list in ["cluster", "local"] {
            let mut rules = set_id(list);
            rules.push(format!(
                "meta l4proto {{ tcp, udp, sctp }} {}",
                fam.affinity(cfg.affinity_mask).dnat
            ));
            rules.push(pick(list));
            chain(&mut s, &format!("{prefix}affinity-{list}"), None, &rules);
        }
        for affinity in [false, true] {
            let suffix = if affinity { "-affinity" } else { "" };
            let to = |list: &str| {
                if affinity {
                    format!("goto {prefix}affinity-{list}")
                } else {
                    pick(list)
                }
            };
            let to_cluster = if affinity {
                to("cluster")
            } else {
                pick("cluster")
            };
            chain(
                &mut s,
                &format!("{prefix}external-cluster{suffix}"),
                None,
                &[masq.clone(), to_cluster.clone()],
            );
            let mut local = Vec::new();
            if let Some(pod) = &cfg.local_match {
                // Pods reach every endpoint, unmasqueraded (kube-proxy's short-circuit).
                local.push(format!("{pod} {}", to("cluster")));
            }
            local.push(format!("fib saddr type local {masq}"));
            local.push(format!("fib saddr type local {}", to("cluster")));
            local.push(to("local"));
            chain(
                &mut s,
                &format!("{prefix}external-local{suffix}"),
                None,
                &local,
            );
        }
    }

    let _ = writeln!(s, "}}");
    s
}

/// What the table's comment says (constant: see [`skeleton`]).
const TABLE_COMMENT: &str = "Kubernetes Services, managed by kpng: do not edit";

/// The empty chain whose comment names the skeleton.
pub const MARKER_CHAIN: &str = "skeleton";

/// The generation of the table's layout: the names and types of its sets, maps and chains.
/// Bump it when a change renames or removes any of them (or changes a set's type): a table of
/// another layout is replaced whole, one of the same layout gets its rules put back in place.
pub const LAYOUT: u32 = 1;

const MARKER_MARK: &str = "@@KPNG-SKELETON@@";

fn marker(id: u64) -> String {
    format!("kpng layout {LAYOUT} skeleton {id:016x}")
}

/// The marker of a table [`skeleton_in_two`] has not finished: no base chain yet, so nothing
/// runs through it, and a later run fills it again from scratch.
const FILLING: &str = "kpng filling";

/// Whether a marker read from the kernel is that of a table whose fill did not finish.
pub fn is_filling(marker: &str) -> bool {
    marker == FILLING
}

/// The marker of a skeleton rendered by [`skeleton`]: its [`MARKER_CHAIN`]'s comment.
pub fn skeleton_marker(skeleton: &str) -> Option<&str> {
    skeleton.lines().find_map(|l| {
        let comment = l.trim().strip_prefix("comment \"")?.strip_suffix('"')?;
        comment.starts_with("kpng layout ").then_some(comment)
    })
}

/// Whether a marker read from the kernel is of this build's [`LAYOUT`].
pub fn same_layout(marker: &str) -> bool {
    marker
        .strip_prefix("kpng layout ")
        .and_then(|rest| rest.split(' ').next())
        .is_some_and(|layout| layout.parse() == Ok(LAYOUT))
}
