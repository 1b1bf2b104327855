//! One Service port → its iptables rules, as kube-proxy's iptables mode writes them: rules in
//! the shared top-level chains (`KUBE-SERVICES`, `KUBE-NODEPORTS`, …) and the chains only this
//! port uses (`KUBE-SVC-`, `KUBE-SVL-`, `KUBE-EXT-`, `KUBE-FW-`, `KUBE-SEP-`). Pure: no I/O.

use std::net::IpAddr;

use kpng_model::{Endpoint, Protocol, ServicePort};

use crate::names::{self, PortChains};

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

/// The rules of one Service port.
pub fn render(port: &ServicePort, ctx: &RenderContext) -> PortRules {
    let name = names::service_port_name(&port.key);
    let proto = port.key.protocol.lower();
    let chains = PortChains::new(&name, proto);
    let mut out = PortRules::default();

    let has_endpoints = port.has_any_endpoints;
    let uses_cluster_chain = !port.cluster_endpoints.is_empty() && port.uses_cluster_endpoints();
    let uses_local_chain = !port.local_endpoints.is_empty() && port.uses_local_endpoints();
    let (internal_chain, has_internal) = if port.internal_policy_local {
        (
            &chains.local,
            has_endpoints && !port.local_endpoints.is_empty(),
        )
    } else {
        (&chains.cluster, has_endpoints)
    };
    let (external_policy_chain, has_external) = if port.external_policy_local {
        (
            &chains.local,
            has_endpoints && !port.local_endpoints.is_empty(),
        )
    } else {
        (&chains.cluster, has_endpoints)
    };
    let uses_external_chain = has_endpoints && port.externally_accessible();
    let uses_firewall =
        has_endpoints && !port.load_balancer_ips.is_empty() && !port.source_ranges.is_empty();
    let lb_chain = if uses_firewall {
        &chains.firewall
    } else {
        &chains.external
    };

    // What the filter table does with traffic that reaches no endpoint.
    let no_endpoints = comment(&format!("{name} has no endpoints"));
    let no_local = comment(&format!("{name} has no local endpoints"));
    let (filter_target, filter_why) = if has_endpoints {
        ("DROP", &no_local)
    } else {
        (reject_target(port.key.protocol), &no_endpoints)
    };

    let l4 = format!("-m {proto} -p {proto}");
    let to = |ip: &IpAddr, port: u16| format!("{l4} -d {ip} --dport {port}");
    let mut shared = |table: Table, chain: &'static str, spec: String| {
        out.shared.push(SharedRule { table, chain, spec });
    };

    // ClusterIP.
    if has_internal {
        shared(
            Table::Nat,
            SERVICES,
            format!(
                "{} {} -j {internal_chain}",
                comment(&format!("{name} cluster IP")),
                to(&port.cluster_ip, port.port)
            ),
        );
    } else {
        shared(
            Table::Filter,
            SERVICES,
            format!(
                "{filter_why} {} -j {filter_target}",
                to(&port.cluster_ip, port.port)
            ),
        );
    }

    // External IPs.
    let (ext_target, ext_why) = (filter_target, filter_why);
    for ip in &port.external_ips {
        if has_endpoints {
            shared(
                Table::Nat,
                SERVICES,
                format!(
                    "{} {} -j {}",
                    comment(&format!("{name} external IP")),
                    to(ip, port.port),
                    chains.external
                ),
            );
        }
        if !has_external {
            shared(
                Table::Filter,
                EXTERNAL_SERVICES,
                format!("{ext_why} {} -j {ext_target}", to(ip, port.port)),
            );
        }
    }

    // Load-balancer IPs.
    for ip in &port.load_balancer_ips {
        if has_endpoints {
            shared(
                Table::Nat,
                SERVICES,
                format!(
                    "{} {} -j {lb_chain}",
                    comment(&format!("{name} loadbalancer IP")),
                    to(ip, port.port)
                ),
            );
        }
        if uses_firewall {
            shared(
                Table::Filter,
                PROXY_FIREWALL,
                format!(
                    "{} {} -j DROP",
                    comment(&format!(
                        "{name} traffic not accepted by {}",
                        chains.firewall
                    )),
                    to(ip, port.port)
                ),
            );
        }
    }
    if !has_external {
        for ip in &port.load_balancer_ips {
            shared(
                Table::Filter,
                EXTERNAL_SERVICES,
                format!("{ext_why} {} -j {ext_target}", to(ip, port.port)),
            );
        }
    }

    // Node port. (Loopback node ports need no rule of their own: the KUBE-SERVICES tail rule
    // lets 127.0.0.0/8 into KUBE-NODEPORTS when they are enabled.)
    if let Some(node_port) = port.node_port {
        if has_endpoints {
            shared(
                Table::Nat,
                NODEPORTS,
                format!(
                    "{} {l4} --dport {node_port} -j {}",
                    comment(&name),
                    chains.external
                ),
            );
        }
        if !has_external {
            shared(
                Table::Filter,
                EXTERNAL_SERVICES,
                format!(
                    "{ext_why} -m addrtype --dst-type LOCAL {l4} --dport {node_port} -j {ext_target}"
                ),
            );
        }
    }

    // Health-check node port: accepted whether or not there are local endpoints.
    if let Some(hc) = port.health_check_node_port {
        shared(
            Table::Filter,
            NODEPORTS,
            format!(
                "{} -m tcp -p tcp --dport {hc} -j ACCEPT",
                comment(&format!("{name} health check node port"))
            ),
        );
    }

    // Masquerade off-cluster (or all) ClusterIP traffic, first thing in the internal chain.
    let mut own: Vec<OwnChain> = Vec::new();
    let mut internal_masq = Vec::new();
    if has_internal {
        let matched = format!(
            "{} {}",
            comment(&format!("{name} cluster IP")),
            to(&port.cluster_ip, port.port)
        );
        if ctx.masquerade_all {
            internal_masq.push(format!("{matched} -j {MARK_MASQ}"));
        } else if let Some(local) = &ctx.local {
            internal_masq.push(format!("{matched} {} -j {MARK_MASQ}", local.if_not_local));
        }
    }

    // External destinations.
    if uses_external_chain {
        let mut rules = Vec::new();
        if !port.external_policy_local {
            rules.push(format!(
                "{} -j {MARK_MASQ}",
                comment(&format!(
                    "masquerade traffic for {name} external destinations"
                ))
            ));
        } else {
            if let Some(local) = &ctx.local {
                rules.push(format!(
                    "{} {} -j {}",
                    comment(&format!("pod traffic for {name} external destinations")),
                    local.if_local,
                    chains.cluster
                ));
            }
            rules.push(format!(
                "{} -m addrtype --src-type LOCAL -j {MARK_MASQ}",
                comment(&format!(
                    "masquerade LOCAL traffic for {name} external destinations"
                ))
            ));
            rules.push(format!(
                "{} -m addrtype --src-type LOCAL -j {}",
                comment(&format!(
                    "route LOCAL traffic for {name} external destinations"
                )),
                chains.cluster
            ));
        }
        if has_external {
            rules.push(format!("-j {external_policy_chain}"));
        }
        own.push(OwnChain {
            name: chains.external.clone(),
            rules,
        });
    }

    // Load-balancer source ranges.
    if uses_firewall {
        let lb_comment = comment(&format!("{name} loadbalancer IP"));
        let mut rules = Vec::new();
        let mut allow_from_node = false;
        for cidr in &port.source_ranges {
            rules.push(format!("{lb_comment} -s {cidr} -j {}", chains.external));
            if ctx.node_ip.is_some_and(|ip| cidr.contains(&ip)) {
                allow_from_node = true;
            }
        }
        if allow_from_node {
            for ip in &port.load_balancer_ips {
                rules.push(format!("{lb_comment} -s {ip} -j {}", chains.external));
            }
        }
        rules.push(comment(&format!(
            "other traffic to {name} will be dropped by KUBE-PROXY-FIREWALL"
        )));
        own.push(OwnChain {
            name: chains.firewall.clone(),
            rules,
        });
    }

    // Policy chains: random choice among their endpoints.
    let sep = |ep: &Endpoint| names::endpoint_chain(&name, proto, ep);
    let affinity = port.session_affinity;
    let policy_chain = |chain: &str, endpoints: &[Endpoint], prefix: Vec<String>| {
        let mut rules = prefix;
        if let Some(a) = affinity {
            for ep in endpoints {
                let sep = sep(ep);
                rules.push(format!(
                    "{} -m recent --name {sep} --rcheck --seconds {} --reap -j {sep}",
                    comment(&format!("{name} -> {ep}")),
                    a.timeout_seconds
                ));
            }
        }
        let n = endpoints.len();
        for (i, ep) in endpoints.iter().enumerate() {
            let statistic = if i + 1 < n {
                format!(
                    " -m statistic --mode random --probability {}",
                    probability(n - i)
                )
            } else {
                String::new()
            };
            rules.push(format!(
                "{}{statistic} -j {}",
                comment(&format!("{name} -> {ep}")),
                sep(ep)
            ));
        }
        OwnChain {
            name: chain.to_owned(),
            rules,
        }
    };
    let mut masq_for = |chain: &str| {
        if chain == internal_chain.as_str() {
            std::mem::take(&mut internal_masq)
        } else {
            Vec::new()
        }
    };
    if uses_cluster_chain {
        let prefix = masq_for(&chains.cluster);
        own.push(policy_chain(
            &chains.cluster,
            &port.cluster_endpoints,
            prefix,
        ));
    }
    if uses_local_chain {
        let prefix = masq_for(&chains.local);
        own.push(policy_chain(&chains.local, &port.local_endpoints, prefix));
    }

    // Endpoint chains: hairpin masquerade, affinity record, DNAT.
    for ep in port.all_reachable_endpoints() {
        let chain = sep(&ep);
        let c = comment(&name);
        let recent = if affinity.is_some() {
            format!(" -m recent --name {chain} --set")
        } else {
            String::new()
        };
        own.push(OwnChain {
            rules: vec![
                format!("{c} -s {} -j {MARK_MASQ}", ep.ip),
                format!("{c}{recent} {l4} -j DNAT --to-destination {}", ep.addr()),
            ],
            name: chain,
        });
    }
    out.chains = own;
    out
}
