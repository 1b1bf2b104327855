//! Linux capture: one small, constant nftables table per family (`kpng-userspace`) whose maps
//! send Service traffic to the proxy's listeners.
//!
//! - `nat-prerouting` (traffic from pods and other hosts): `redirect` to the listener port from
//!   `vip-listeners` (VIP . protocol . port) or `nodeport-listeners` (protocol . port, on the
//!   node-port addresses). `redirect` rewrites the destination to the receiving interface's
//!   address, so the proxy's wildcard listener gets it and its replies leave from that address.
//! - `nat-output` (traffic from the node itself): `dnat` to the client's *own* address and the
//!   listener port. A UDP reply from a wildcard socket to a local client takes the client's
//!   address as source, which is exactly the address conntrack expects back (`redirect` would
//!   pick 127.0.0.1 and the reply would not match).
//! - Filters as kube-proxy's nftables mode: `firewall-check` before NAT drops sources outside
//!   `loadBalancerSourceRanges`; after NAT, `vip-verdicts` / `nodeport-verdicts` refuse or drop
//!   traffic to Services without usable endpoints, `cluster-ips` refuses wrong ports and
//!   `service-cidrs` drops unallocated IPs.
//! - `listener-ports`: a new connection to a listener port that was *not* redirected is dropped,
//!   so the listeners are reachable only through a Service address.
//!
//! Every change is one `nft -f -` transaction: atomic, and on error nothing of it applies.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use kpng_backend::TamperAlarm;
use kpng_backend::settings::DetectLocal;
use kpng_model::Family;
use kpng_netfilter::monitor::{TableMonitor, Watched};

use crate::capture::{Capture, CaptureError};
use crate::entries::{Action, Entry, EntryKey};
use crate::store::Op;

/// The default table name (one per family: `ip kpng-userspace`, `ip6 kpng-userspace`).
pub const TABLE: &str = "kpng-userspace";

/// How the capture recognises this node's pods (`--detect-local-mode`): their traffic to an
/// externalTrafficPolicy Local port goes to the short-circuit listener. The node's own traffic
/// always does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodMatch {
    /// No pod detection.
    None,
    /// Sources in the `pod-cidrs` set (filled from the entries: cluster or node pod CIDRs).
    Cidrs,
    /// Traffic entering from this interface (a bridge).
    Interface(String),
    /// Traffic entering from interfaces whose name starts with this.
    InterfacePrefix(String),
}

impl From<&DetectLocal> for PodMatch {
    fn from(d: &DetectLocal) -> PodMatch {
        match d {
            DetectLocal::None => PodMatch::None,
            DetectLocal::ClusterCidr(_) | DetectLocal::NodeCidr => PodMatch::Cidrs,
            DetectLocal::BridgeInterface(name) => PodMatch::Interface(name.clone()),
            DetectLocal::InterfaceNamePrefix(prefix) => PodMatch::InterfacePrefix(prefix.clone()),
        }
    }
}

impl PodMatch {
    /// The nft match, `None` when pods are not recognised.
    fn rule(&self, f: &str) -> Option<String> {
        match self {
            PodMatch::None => None,
            PodMatch::Cidrs => Some(format!("{f} saddr @pod-cidrs")),
            PodMatch::Interface(name) => Some(format!("iifname \"{name}\"")),
            PodMatch::InterfacePrefix(prefix) => Some(format!("iifname \"{prefix}*\"")),
        }
    }
}

/// How scripts are committed.
#[derive(Debug, Clone)]
enum Runner {
    /// `BINARY -f -`.
    Command(PathBuf),
    /// Print to standard output, apply nothing.
    DryRun,
    /// Keep the scripts (tests).
    Record(Arc<Mutex<Vec<String>>>),
}

/// The nftables capture.
#[derive(Debug, Clone)]
pub struct NftCapture {
    /// Watches our tables for others' changes, once [`Capture::watch`] started it; our own
    /// scripts run between its `begin_own` and `end_own`.
    monitor: Option<Arc<TableMonitor>>,
    /// kpng's anchor tables ([`kpng_netfilter::anchor`]), held once [`Capture::watch`] ran (a
    /// real run): an outside client's NodePort connection is a `redirect` in conntrack, and a
    /// foreign `nft flush ruleset` took every NAT hook with the capture table, so its packets
    /// reached the node un-NATed and were reset until the repair.
    anchor: Option<Arc<kpng_netfilter::anchor::Anchor>>,
    table: String,
    families: Vec<Family>,
    pods: PodMatch,
    runner: Runner,
}

impl NftCapture {
    /// Commits through `nft` (looked up in `PATH`).
    pub fn new(families: Vec<Family>) -> NftCapture {
        NftCapture::with_binary(families, "nft")
    }

    /// Commits through a specific `nft` binary.
    pub fn with_binary(families: Vec<Family>, binary: impl Into<PathBuf>) -> NftCapture {
        NftCapture {
            monitor: None,
            anchor: None,
            table: TABLE.into(),
            families,
            pods: PodMatch::None,
            runner: Runner::Command(binary.into()),
        }
    }

    /// Recognises pods as `pods` says (default: not at all).
    pub fn with_pods(mut self, pods: PodMatch) -> NftCapture {
        self.pods = pods;
        self
    }

    /// Prints every script instead of applying it (`--dry-run`; no root needed).
    pub fn dry_run(families: Vec<Family>) -> NftCapture {
        NftCapture {
            monitor: None,
            anchor: None,
            table: TABLE.into(),
            families,
            pods: PodMatch::None,
            runner: Runner::DryRun,
        }
    }

    /// Records every script into `scripts` instead of applying it (tests).
    pub fn recording(families: Vec<Family>, scripts: Arc<Mutex<Vec<String>>>) -> NftCapture {
        NftCapture {
            monitor: None,
            anchor: None,
            table: TABLE.into(),
            families,
            pods: PodMatch::None,
            runner: Runner::Record(scripts),
        }
    }

    fn run(&self, script: &str) -> Result<(), CaptureError> {
        match &self.runner {
            Runner::DryRun => {
                println!("{script}");
                Ok(())
            }
            Runner::Record(scripts) => {
                if let Ok(mut s) = scripts.lock() {
                    s.push(script.to_string());
                }
                Ok(())
            }
            Runner::Command(binary) => {
                // What this script changes is ours, not tampering (a foreign change found
                // pending here has already raised the alarm).
                let _ = self.monitor.as_ref().map(|m| m.begin_own());
                let result = run_nft(binary, script);
                if let Some(m) = &self.monitor {
                    m.end_own();
                }
                result
            }
        }
    }

    /// The full script: both tables replaced atomically, with their elements.
    pub fn replace_script(&self, entries: &[Entry]) -> String {
        let mut s = String::new();
        for family in &self.families {
            let f = family_word(*family);
            let _ = writeln!(s, "add table {f} {}", self.table);
            let _ = writeln!(s, "delete table {f} {}", self.table);
            s.push_str(&skeleton(*family, &self.table, &self.pods));
        }
        let adds: Vec<&Entry> = entries
            .iter()
            .filter(|e| self.families.contains(&e.key.family()))
            .collect();
        write_elements(&mut s, &self.table, "add", adds.iter().copied(), true);
        s
    }

    /// The script of one update: deletes, then adds.
    pub fn update_script(&self, ops: &[Op]) -> String {
        let mine = |e: &&Entry| self.families.contains(&e.key.family());
        let deletes = ops.iter().filter_map(|op| match op {
            Op::Delete(e) => Some(e),
            Op::Add(_) => None,
        });
        let adds = ops.iter().filter_map(|op| match op {
            Op::Add(e) => Some(e),
            Op::Delete(_) => None,
        });
        let mut s = String::new();
        write_elements(&mut s, &self.table, "delete", deletes.filter(mine), false);
        write_elements(&mut s, &self.table, "add", adds.filter(mine), true);
        s
    }

    /// The cleanup script: both tables gone (no error when absent).
    pub fn cleanup_script(&self) -> String {
        let mut s = String::new();
        for family in Family::ALL {
            let f = family_word(family);
            let _ = writeln!(s, "add table {f} {}", self.table);
            let _ = writeln!(s, "delete table {f} {}", self.table);
        }
        s
    }
}

impl Capture for NftCapture {
    fn replace(&mut self, entries: &[Entry]) -> Result<usize, CaptureError> {
        self.run(&self.replace_script(entries))?;
        Ok(entries.len())
    }

    fn update(&mut self, ops: &[Op]) -> Result<usize, CaptureError> {
        if ops.is_empty() {
            return Ok(0);
        }
        self.run(&self.update_script(ops))?;
        Ok(ops.len())
    }

    fn cleanup(&mut self) -> Result<(), CaptureError> {
        self.run(&self.cleanup_script())
    }

    fn watch(&mut self, alarm: TamperAlarm) -> Result<bool, CaptureError> {
        if !matches!(self.runner, Runner::Command(_)) {
            return Ok(false);
        }
        self.anchor = kpng_netfilter::anchor::hold_logged(&self.families).map(Arc::new);
        let watched = Watched {
            tables: self
                .families
                .iter()
                .map(|f| (*f, self.table.clone()))
                .collect(),
            dynamic_sets: Vec::new(),
            chains: None,
        };
        let monitor = TableMonitor::start(watched, alarm).map_err(|e| CaptureError::Io {
            what: "watching the capture tables".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
        self.monitor = Some(Arc::new(monitor));
        Ok(true)
    }

    fn previous_redirects(&mut self) -> Vec<Entry> {
        let Runner::Command(binary) = &self.runner else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for family in &self.families {
            let tool = binary.display().to_string();
            let args = ["-j", "list", "table", family_word(*family), &self.table];
            match kpng_backend_kit::exec::run_tool(&tool, &args, None) {
                Ok(json) => out.extend(parse_redirects(*family, &json)),
                // No table: a first start.
                Err(CaptureError::Refused { .. }) => {}
                Err(e) => tracing::debug!("cannot list the previous capture: {e}"),
            }
        }
        out
    }
}

/// The redirect entries in a `nft -j list table` of our table: the four listener maps.
pub fn parse_redirects(family: Family, json: &str) -> Vec<Entry> {
    let Ok(doc) = serde_json::from_str::<serde_json::Value>(json) else {
        return Vec::new();
    };
    let objects = doc["nftables"].as_array().cloned().unwrap_or_default();
    let mut out = Vec::new();
    for map in objects.iter().filter_map(|o| o.get("map")) {
        let name = map["name"].as_str().unwrap_or_default();
        for elem in map["elem"].as_array().into_iter().flatten() {
            let (Some(key), Some(to)) = (elem[0]["concat"].as_array(), elem[1].as_u64()) else {
                continue;
            };
            let Ok(to) = u16::try_from(to) else {
                continue;
            };
            if let Some(key) = redirect_key(family, name, key) {
                out.push(Entry {
                    key,
                    action: Action::Redirect(to),
                });
            }
        }
    }
    out
}

/// The entry key of one element of a listener map (`[ip, proto, port]` or `[proto, port]`).
fn redirect_key(family: Family, map: &str, key: &[serde_json::Value]) -> Option<EntryKey> {
    let protocol = |v: &serde_json::Value| match v.as_str()? {
        "tcp" => Some(kpng_model::Protocol::Tcp),
        "udp" => Some(kpng_model::Protocol::Udp),
        _ => None,
    };
    let port = |v: &serde_json::Value| u16::try_from(v.as_u64()?).ok();
    match (map, key) {
        ("vip-listeners" | "vip-short-circuit", [ip, proto, p]) => {
            let ip = ip.as_str()?.parse().ok()?;
            let (protocol, port) = (protocol(proto)?, port(p)?);
            Some(if map == "vip-listeners" {
                EntryKey::Vip { ip, protocol, port }
            } else {
                EntryKey::VipShortCircuit { ip, protocol, port }
            })
        }
        ("nodeport-listeners" | "nodeport-short-circuit", [proto, p]) => {
            let (protocol, port) = (protocol(proto)?, port(p)?);
            Some(if map == "nodeport-listeners" {
                EntryKey::NodePort {
                    family,
                    protocol,
                    port,
                }
            } else {
                EntryKey::NodePortShortCircuit {
                    family,
                    protocol,
                    port,
                }
            })
        }
        _ => None,
    }
}

fn run_nft(binary: &std::path::Path, script: &str) -> Result<(), CaptureError> {
    let tool = binary.display().to_string();
    kpng_backend_kit::exec::run_tool(&tool, &["-f", "-"], Some(script)).map(|_| ())
}

fn family_word(family: Family) -> &'static str {
    match family {
        Family::V4 => "ip",
        Family::V6 => "ip6",
    }
}

/// Where an entry lives: (set or map, key, value).
fn element(e: &Entry) -> Option<(&'static str, String, Option<String>)> {
    let verdict = |a: Action| match a {
        Action::Refuse => Some("goto reject-chain".to_string()),
        Action::Drop => Some("drop".to_string()),
        Action::Redirect(_) | Action::Member => None,
    };
    Some(match (&e.key, e.action) {
        (EntryKey::Vip { ip, protocol, port }, Action::Redirect(to)) => (
            "vip-listeners",
            format!("{ip} . {} . {port}", protocol.lower()),
            Some(to.to_string()),
        ),
        (EntryKey::Vip { ip, protocol, port }, a) => (
            "vip-verdicts",
            format!("{ip} . {} . {port}", protocol.lower()),
            Some(verdict(a)?),
        ),
        (EntryKey::NodePort { protocol, port, .. }, Action::Redirect(to)) => (
            "nodeport-listeners",
            format!("{} . {port}", protocol.lower()),
            Some(to.to_string()),
        ),
        (EntryKey::NodePort { protocol, port, .. }, a) => (
            "nodeport-verdicts",
            format!("{} . {port}", protocol.lower()),
            Some(verdict(a)?),
        ),
        (EntryKey::VipShortCircuit { ip, protocol, port }, Action::Redirect(to)) => (
            "vip-short-circuit",
            format!("{ip} . {} . {port}", protocol.lower()),
            Some(to.to_string()),
        ),
        (EntryKey::NodePortShortCircuit { protocol, port, .. }, Action::Redirect(to)) => (
            "nodeport-short-circuit",
            format!("{} . {port}", protocol.lower()),
            Some(to.to_string()),
        ),
        (EntryKey::VipShortCircuit { .. } | EntryKey::NodePortShortCircuit { .. }, _) => {
            return None;
        }
        (EntryKey::ClusterIp(ip), _) => ("cluster-ips", ip.to_string(), None),
        (EntryKey::FirewallVip { ip, protocol, port }, _) => (
            "firewall-ips",
            format!("{ip} . {} . {port}", protocol.lower()),
            None,
        ),
        (
            EntryKey::FirewallAllow {
                ip,
                protocol,
                port,
                source,
            },
            _,
        ) => (
            "firewall-allow",
            format!("{ip} . {} . {port} . {source}", protocol.lower()),
            None,
        ),
        (EntryKey::Listener { protocol, port, .. }, _) => (
            "listener-ports",
            format!("{} . {port}", protocol.lower()),
            None,
        ),
        (EntryKey::NodePortAddresses(net), _) => ("nodeport-addresses", net.to_string(), None),
        (EntryKey::ServiceCidr(net), _) => ("service-cidrs", net.to_string(), None),
        (EntryKey::PodCidr(net), _) => ("pod-cidrs", net.to_string(), None),
    })
}

/// Writes `verb element` lines, one per (family, set), elements in the given order.
fn write_elements<'a>(
    s: &mut String,
    table: &str,
    verb: &str,
    entries: impl Iterator<Item = &'a Entry>,
    with_values: bool,
) {
    let mut groups: Vec<((Family, &'static str), Vec<String>)> = Vec::new();
    for e in entries {
        let Some((set, key, value)) = element(e) else {
            continue;
        };
        let item = match (value, with_values) {
            (Some(v), true) => format!("{key} : {v}"),
            _ => key,
        };
        let group = (e.key.family(), set);
        match groups.iter_mut().find(|(g, _)| *g == group) {
            Some((_, items)) => items.push(item),
            None => groups.push((group, vec![item])),
        }
    }
    for ((family, set), items) in groups {
        let _ = writeln!(
            s,
            "{verb} element {} {table} {set} {{ {} }}",
            family_word(family),
            items.join(", ")
        );
    }
}

/// The constant table of one family (its rules depend on the flags only, never on Services).
pub fn skeleton(family: Family, table: &str, pods: &PodMatch) -> String {
    let (f, a, lo) = match family {
        Family::V4 => ("ip", "ipv4_addr", "127.0.0.0/8"),
        Family::V6 => ("ip6", "ipv6_addr", "::1"),
    };
    let vip = format!("{a} . inet_proto . inet_service");
    let vipkey = format!("{f} daddr . meta l4proto . th dport");
    let nodeport = format!("fib daddr type local {f} daddr != {lo} {f} daddr @nodeport-addresses");
    let sets: [(&str, String); 13] = [
        ("vip-listeners", format!("type {vip} : inet_service")),
        (
            "nodeport-listeners",
            "type inet_proto . inet_service : inet_service".into(),
        ),
        ("vip-short-circuit", format!("type {vip} : inet_service")),
        (
            "nodeport-short-circuit",
            "type inet_proto . inet_service : inet_service".into(),
        ),
        ("pod-cidrs", format!("type {a}; flags interval")),
        ("vip-verdicts", format!("type {vip} : verdict")),
        (
            "nodeport-verdicts",
            "type inet_proto . inet_service : verdict".into(),
        ),
        ("nodeport-addresses", format!("type {a}; flags interval")),
        ("cluster-ips", format!("type {a}")),
        ("service-cidrs", format!("type {a}; flags interval")),
        ("firewall-ips", format!("type {vip}")),
        (
            "firewall-allow",
            format!("type {vip} . {a}; flags interval"),
        ),
        ("listener-ports", "type inet_proto . inet_service".into()),
    ];
    let mut s = format!(
        "table {f} {table} {{\n\tcomment \"Kubernetes Services for kpng's userspace proxy: do not edit\"\n"
    );
    for (name, decl) in &sets {
        let kind = if decl.contains(" : ") { "map" } else { "set" };
        let _ = writeln!(s, "\t{kind} {name} {{ {decl}; }}");
    }
    let mut prerouting = Vec::new();
    if let Some(pod) = pods.rule(f) {
        // Pods' traffic to an externalTrafficPolicy Local port: every endpoint.
        prerouting.push(format!(
            "{pod} meta l4proto {{ tcp, udp }} redirect to : {vipkey} map @vip-short-circuit"
        ));
        prerouting.push(format!(
            "{pod} {nodeport} meta l4proto {{ tcp, udp }} redirect to : meta l4proto . th dport map @nodeport-short-circuit"
        ));
    }
    prerouting.push(format!(
        "meta l4proto {{ tcp, udp }} redirect to : {vipkey} map @vip-listeners"
    ));
    prerouting.push(format!(
        "{nodeport} meta l4proto {{ tcp, udp }} redirect to : meta l4proto . th dport map @nodeport-listeners"
    ));
    let chains: [(&str, &str, Vec<String>); 10] = [
        (
            "filter-prerouting-pre-nat",
            "type filter hook prerouting priority -110",
            vec!["ct state new jump firewall-check".into()],
        ),
        (
            "filter-output-pre-nat",
            "type filter hook output priority -110",
            vec!["ct state new jump firewall-check".into()],
        ),
        (
            "filter-input",
            "type filter hook input priority 0",
            vec![
                "ct state new ct status ! dnat meta l4proto . th dport @listener-ports drop".into(),
                format!(
                    "ct state new ct status ! dnat {nodeport} meta l4proto . th dport vmap @nodeport-verdicts"
                ),
                format!("ct state new ct status ! dnat {vipkey} vmap @vip-verdicts"),
            ],
        ),
        (
            "filter-forward",
            "type filter hook forward priority 0",
            vec![
                format!("ct state new {vipkey} vmap @vip-verdicts"),
                "ct state new jump cluster-ips-check".into(),
            ],
        ),
        (
            "filter-output",
            "type filter hook output priority 0",
            vec![
                format!("ct state new ct status ! dnat {vipkey} vmap @vip-verdicts"),
                "ct state new ct status ! dnat jump cluster-ips-check".into(),
            ],
        ),
        (
            "firewall-check",
            "",
            vec![format!(
                "{vipkey} @firewall-ips {vipkey} . {f} saddr != @firewall-allow drop"
            )],
        ),
        (
            "cluster-ips-check",
            "",
            vec![
                // As a Service without endpoints: a TCP reset for TCP (on IPv6 an ICMPv6
                // error can reach a client's connect() too early and wait for a retransmit).
                format!("{f} daddr @cluster-ips goto reject-chain"),
                format!("{f} daddr @service-cidrs drop"),
            ],
        ),
        (
            "reject-chain",
            "",
            vec![
                "meta l4proto tcp reject with tcp reset".into(),
                "reject".into(),
            ],
        ),
        (
            "nat-prerouting",
            "type nat hook prerouting priority dstnat",
            prerouting,
        ),
        (
            "nat-output",
            "type nat hook output priority -100",
            vec![
                // The node's own traffic to an externalTrafficPolicy Local port: every endpoint.
                format!(
                    "meta l4proto {{ tcp, udp }} dnat {f} to {f} saddr : {vipkey} map @vip-short-circuit"
                ),
                format!(
                    "{nodeport} meta l4proto {{ tcp, udp }} dnat {f} to {f} saddr : meta l4proto . th dport map @nodeport-short-circuit"
                ),
                format!(
                    "meta l4proto {{ tcp, udp }} dnat {f} to {f} saddr : {vipkey} map @vip-listeners"
                ),
                format!(
                    "{nodeport} meta l4proto {{ tcp, udp }} dnat {f} to {f} saddr : meta l4proto . th dport map @nodeport-listeners"
                ),
            ],
        ),
    ];
    for (name, base, rules) in chains {
        let _ = writeln!(s, "\tchain {name} {{");
        if !base.is_empty() {
            let _ = writeln!(s, "\t\t{base}; policy accept;");
        }
        for r in rules {
            let _ = writeln!(s, "\t\t{r}");
        }
        let _ = writeln!(s, "\t}}");
    }
    s.push_str("}\n");
    s
}

#[cfg(test)]
mod tests;
