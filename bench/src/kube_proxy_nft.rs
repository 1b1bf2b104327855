//! The kube-proxy-shaped nftables ruleset: what users of kube-proxy's nftables mode run today,
//! rendered by the bench from the same workload and loaded with `nft -f`, so that kpng's figures
//! stand next to it, measured in the same run on the same machine.
//!
//! The shape is kube-proxy's nftables mode as released in v1.31–v1.35 (table `ip kube-proxy`):
//! `services` looks the destination up in the `service-ips` / `service-nodeports` verdict maps,
//! which `goto` a chain per Service port (`service-…`, `external-…`, `local-…`); that chain picks
//! an endpoint with its own anonymous map, `numgen random mod N vmap { 0 : goto endpoint-…, … }`,
//! and every endpoint has its own chain ending in `dnat`. The transaction is written the way
//! kube-proxy writes it (one command per line: every chain added and flushed, then its rules,
//! then the map elements that point at it). Only the IPv4 table is rendered: kube-proxy runs one
//! proxier per family, and the IPv4 one carries every Service of the workload.
//!
//! Chain names carry an 8-character hash like kube-proxy's; ours is FNV-1a rather than
//! SHA-256, which changes the letters, not the length or the cost of loading.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use kpng_model::{Endpoint, Event, Family, Model, ModelConfig, ServicePort, Snapshot};
use kpng_testkit::Netns;

use crate::control::Scratch;
use crate::workload::{self, Endpoints, NODE_IP};

/// How the ruleset is named in reports.
pub const LABEL: &str = "kube-proxy-shaped nft";
/// The longest the data-plane benchmark waits for the ruleset to load (minutes at 30k).
pub const DATA_PLANE_CAP: Duration = Duration::from_secs(150);
/// The longest a control-plane cold load may take before it is reported as "> cap".
pub const CONTROL_CAP: Duration = Duration::from_secs(150);

/// The pod network of the benchmark's cluster (kpng runs with the same `--cluster-cidr`).
pub const CLUSTER_CIDR: &str = "10.128.0.0/9";

/// The workload's objects streamed into a model, the way kpng's file source feeds it.
pub fn snapshot_of(manifests: &Path) -> Result<Model, String> {
    let mut model = Model::new(ModelConfig {
        node_name: "node1".into(),
        ..ModelConfig::default()
    });
    for path in crate::manifest_paths(&manifests.display().to_string())? {
        for object in crate::objects_of(&path)? {
            model.apply(Event::Apply(object));
        }
    }
    Ok(model)
}

/// kube-proxy's short hash of a name: 8 base32 characters.
fn hash8(s: &str) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (0..8)
        .map(|i| char::from(ALPHABET[((h >> (i * 5)) & 31) as usize]))
        .collect()
}

/// The base name of a Service port's chains: `HASH-ns/name/proto/port`.
fn port_base(sp: &ServicePort) -> String {
    let k = &sp.key;
    let id = format!(
        "{}/{}/{}/{}",
        k.service.namespace,
        k.service.name,
        k.protocol.lower(),
        k.port_name
    );
    format!("{}-{id}", hash8(&id))
}

/// The base name of an endpoint's chain: `HASH-ns/name/proto/port__IP/port`.
fn endpoint_base(sp: &ServicePort, ep: &Endpoint) -> String {
    let k = &sp.key;
    let id = format!(
        "{}/{}/{}/{}__{}/{}",
        k.service.namespace,
        k.service.name,
        k.protocol.lower(),
        k.port_name,
        ep.ip,
        ep.port
    );
    format!("{}-{id}", hash8(&id))
}

/// The table, its base chains, static chains, sets and maps: kube-proxy's `setupNFTables`.
fn render_setup(out: &mut String) {
    let t = "ip kube-proxy";
    let _ = writeln!(
        out,
        "add table {t} {{ comment \"rules for kube-proxy\" ; }}"
    );
    let base = [
        ("filter-prerouting", "filter", "prerouting", "-110"),
        ("filter-input", "filter", "input", "-110"),
        ("filter-forward", "filter", "forward", "-110"),
        ("filter-output", "filter", "output", "-110"),
        ("filter-output-post-dnat", "filter", "output", "-90"),
        ("nat-prerouting", "nat", "prerouting", "-100"),
        ("nat-output", "nat", "output", "-100"),
        ("nat-postrouting", "nat", "postrouting", "100"),
    ];
    for (name, kind, hook, prio) in base {
        let _ = writeln!(
            out,
            "add chain {t} {name} {{ type {kind} hook {hook} priority {prio} ; }}"
        );
        let _ = writeln!(out, "flush chain {t} {name}");
    }
    let statics = [
        "mark-for-masquerade",
        "masquerading",
        "services",
        "service-endpoints-check",
        "nodeport-endpoints-check",
        "firewall-check",
        "reject-chain",
        "cluster-ips-check",
    ];
    for name in statics {
        let _ = writeln!(out, "add chain {t} {name}");
        let _ = writeln!(out, "flush chain {t} {name}");
    }
    let sets = [
        ("set", "cluster-ips", "ipv4_addr", "Active ClusterIPs"),
        (
            "set",
            "nodeport-ips",
            "ipv4_addr",
            "IPs that accept NodePort traffic",
        ),
        (
            "map",
            "service-ips",
            "ipv4_addr . inet_proto . inet_service : verdict",
            "ClusterIP, ExternalIP and LoadBalancer IP traffic",
        ),
        (
            "map",
            "service-nodeports",
            "inet_proto . inet_service : verdict",
            "NodePort traffic",
        ),
        (
            "map",
            "firewall-ips",
            "ipv4_addr . inet_proto . inet_service : verdict",
            "destinations that are subject to LoadBalancerSourceRanges",
        ),
        (
            "map",
            "no-endpoint-services",
            "ipv4_addr . inet_proto . inet_service : verdict",
            "vmap to drop or reject packets to services with no endpoints",
        ),
        (
            "map",
            "no-endpoint-nodeports",
            "inet_proto . inet_service : verdict",
            "vmap to drop or reject packets to service nodeports with no endpoints",
        ),
    ];
    for (what, name, ty, comment) in sets {
        let _ = writeln!(
            out,
            "add {what} {t} {name} {{ type {ty} ; comment \"{comment}\" ; }}"
        );
        let _ = writeln!(out, "flush {what} {t} {name}");
    }
    let rules = [
        ("filter-prerouting", "ct state new jump firewall-check"),
        ("filter-input", "ct state new jump nodeport-endpoints-check"),
        ("filter-input", "ct state new jump service-endpoints-check"),
        (
            "filter-forward",
            "ct state new jump service-endpoints-check",
        ),
        ("filter-forward", "ct state new jump cluster-ips-check"),
        ("filter-output", "ct state new jump service-endpoints-check"),
        ("filter-output", "ct state new jump firewall-check"),
        (
            "filter-output-post-dnat",
            "ct state new jump cluster-ips-check",
        ),
        ("nat-prerouting", "jump services"),
        ("nat-output", "jump services"),
        ("nat-postrouting", "jump masquerading"),
        ("mark-for-masquerade", "mark set mark or 0x4000"),
        ("masquerading", "mark and 0x4000 == 0 return"),
        ("masquerading", "mark set mark xor 0x4000"),
        ("masquerading", "masquerade fully-random"),
        (
            "services",
            "ip daddr . meta l4proto . th dport vmap @service-ips",
        ),
        (
            "services",
            "ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports",
        ),
        (
            "service-endpoints-check",
            "ip daddr . meta l4proto . th dport vmap @no-endpoint-services",
        ),
        (
            "nodeport-endpoints-check",
            "ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports",
        ),
        (
            "firewall-check",
            "ip daddr . meta l4proto . th dport vmap @firewall-ips",
        ),
        ("reject-chain", "reject"),
        ("cluster-ips-check", "ip daddr @cluster-ips reject"),
        ("cluster-ips-check", "ip daddr { 10.96.0.0/12 } drop"),
    ];
    for (chain, rule) in rules {
        let _ = writeln!(out, "add rule {t} {chain} {rule}");
    }
    let _ = writeln!(out, "add element {t} nodeport-ips {{ {NODE_IP} }}");
}

/// A chain that load-balances over `endpoints`: the affinity checks, then one anonymous
/// `numgen … vmap` jumping to the endpoint chains.
fn render_balancer(out: &mut String, sp: &ServicePort, chain: &str, endpoints: &[Endpoint]) {
    let t = "ip kube-proxy";
    if sp.session_affinity.is_some() {
        for ep in endpoints {
            let base = endpoint_base(sp, ep);
            let _ = writeln!(
                out,
                "add rule {t} {chain} ip saddr @affinity-{base} goto endpoint-{base}"
            );
        }
    }
    let mut vmap = String::new();
    for (i, ep) in endpoints.iter().enumerate() {
        if i > 0 {
            vmap.push_str(" , ");
        }
        let _ = write!(vmap, "{i} : goto endpoint-{}", endpoint_base(sp, ep));
    }
    let _ = writeln!(
        out,
        "add rule {t} {chain} numgen random mod {} vmap {{ {vmap} }}",
        endpoints.len()
    );
}

/// One IPv4 Service port: its chains and rules, then the set and map elements that lead to them,
/// as kube-proxy's sync writes them for a Service port it has not programmed before.
pub fn render_port(out: &mut String, sp: &ServicePort) {
    let t = "ip kube-proxy";
    let IpAddr::V4(cluster_ip) = sp.cluster_ip else {
        return;
    };
    let base = port_base(sp);
    let proto = sp.key.protocol.lower();
    let port = sp.port;
    let comment = format!(
        "{}/{}:{}",
        sp.key.service.namespace, sp.key.service.name, sp.key.port_name
    );
    let service_chain = format!("service-{base}");
    let local_chain = format!("local-{base}");
    let external_chain = format!("external-{base}");
    let internal = sp.internal_endpoints();
    let internal_chain = if sp.internal_policy_local {
        &local_chain
    } else {
        &service_chain
    };

    // Endpoint chains: every endpoint reachable by either policy.
    let mut all: Vec<&Endpoint> = sp
        .cluster_endpoints
        .iter()
        .chain(sp.local_endpoints.iter())
        .collect();
    all.sort_by_key(|e| (e.ip, e.port));
    all.dedup();
    for ep in &all {
        let eb = endpoint_base(sp, ep);
        let chain = format!("endpoint-{eb}");
        let _ = writeln!(out, "add chain {t} {chain}");
        let _ = writeln!(out, "flush chain {t} {chain}");
        let _ = writeln!(
            out,
            "add rule {t} {chain} ip saddr {} jump mark-for-masquerade",
            ep.ip
        );
        if let Some(a) = sp.session_affinity {
            let _ = writeln!(
                out,
                "add set {t} affinity-{eb} {{ type ipv4_addr ; flags dynamic,timeout ; timeout {}s ; }}",
                a.timeout_seconds
            );
            let _ = writeln!(
                out,
                "add rule {t} {chain} update @affinity-{eb} {{ ip saddr }}"
            );
        }
        let _ = writeln!(
            out,
            "add rule {t} {chain} meta l4proto {proto} dnat to {}:{}",
            ep.ip, ep.port
        );
    }
    if sp.uses_cluster_endpoints() && !sp.cluster_endpoints.is_empty() {
        let _ = writeln!(out, "add chain {t} {service_chain}");
        let _ = writeln!(out, "flush chain {t} {service_chain}");
        let _ = writeln!(
            out,
            "add rule {t} {service_chain} ip daddr {cluster_ip} {proto} dport {port} ip saddr != {CLUSTER_CIDR} jump mark-for-masquerade"
        );
        render_balancer(out, sp, &service_chain, &sp.cluster_endpoints);
    }
    if sp.uses_local_endpoints() && !sp.local_endpoints.is_empty() {
        let _ = writeln!(out, "add chain {t} {local_chain}");
        let _ = writeln!(out, "flush chain {t} {local_chain}");
        render_balancer(out, sp, &local_chain, &sp.local_endpoints);
    }
    let external = sp.externally_accessible() && sp.has_any_endpoints;
    if external {
        let _ = writeln!(out, "add chain {t} {external_chain}");
        let _ = writeln!(out, "flush chain {t} {external_chain}");
        if sp.external_policy_local {
            let _ = writeln!(
                out,
                "add rule {t} {external_chain} ip saddr {CLUSTER_CIDR} goto {service_chain}"
            );
            let _ = writeln!(
                out,
                "add rule {t} {external_chain} fib saddr type local jump mark-for-masquerade"
            );
            let _ = writeln!(
                out,
                "add rule {t} {external_chain} fib saddr type local goto {service_chain}"
            );
            if !sp.local_endpoints.is_empty() {
                let _ = writeln!(out, "add rule {t} {external_chain} goto {local_chain}");
            }
        } else {
            let _ = writeln!(
                out,
                "add rule {t} {external_chain} jump mark-for-masquerade"
            );
            let _ = writeln!(out, "add rule {t} {external_chain} goto {service_chain}");
        }
    }

    // Elements.
    let _ = writeln!(out, "add element {t} cluster-ips {{ {cluster_ip} }}");
    if !internal.is_empty() {
        let _ = writeln!(
            out,
            "add element {t} service-ips {{ {cluster_ip} . {proto} . {port} comment \"{comment}\" : goto {internal_chain} }}"
        );
    } else {
        let verdict = if sp.has_any_endpoints {
            "drop"
        } else {
            "goto reject-chain"
        };
        let _ = writeln!(
            out,
            "add element {t} no-endpoint-services {{ {cluster_ip} . {proto} . {port} comment \"{comment}\" : {verdict} }}"
        );
    }
    let vips = sp.external_ips.iter().chain(sp.load_balancer_ips.iter());
    for vip in vips.filter(|ip| ip.is_ipv4()) {
        if external {
            let _ = writeln!(
                out,
                "add element {t} service-ips {{ {vip} . {proto} . {port} comment \"{comment}\" : goto {external_chain} }}"
            );
        } else {
            let _ = writeln!(
                out,
                "add element {t} no-endpoint-services {{ {vip} . {proto} . {port} comment \"{comment}\" : goto reject-chain }}"
            );
        }
    }
    if let Some(np) = sp.node_port {
        if external {
            let _ = writeln!(
                out,
                "add element {t} service-nodeports {{ {proto} . {np} comment \"{comment}\" : goto {external_chain} }}"
            );
        } else {
            let _ = writeln!(
                out,
                "add element {t} no-endpoint-nodeports {{ {proto} . {np} comment \"{comment}\" : goto reject-chain }}"
            );
        }
    }
}

/// The whole IPv4 transaction of a first (full) sync of `snapshot`.
pub fn render(snapshot: &Snapshot) -> String {
    let mut out = String::with_capacity(snapshot.ports.len() * 2048);
    render_setup(&mut out);
    for sp in snapshot.ports.values() {
        if sp.key.family == Family::V4 {
            render_port(&mut out, sp);
        }
    }
    out
}

/// Why a load did not give a time.
#[derive(Debug)]
pub enum LoadOutcome {
    /// Committed, in this long.
    Loaded(Duration),
    /// Not committed within the cap (`nft` was killed).
    TimedOut(Duration),
}

impl LoadOutcome {
    /// "0.42 s" or "> 150 s".
    pub fn label(&self) -> String {
        match self {
            LoadOutcome::Loaded(d) => format!("{:.2} s", d.as_secs_f64()),
            LoadOutcome::TimedOut(d) => format!("> {:.0} s", d.as_secs_f64()),
        }
    }

    /// The time, or the cap (a lower bound) when it timed out.
    pub fn secs(&self) -> f64 {
        match self {
            LoadOutcome::Loaded(d) | LoadOutcome::TimedOut(d) => d.as_secs_f64(),
        }
    }

    /// Whether the ruleset is in the kernel.
    pub fn loaded(&self) -> bool {
        matches!(self, LoadOutcome::Loaded(_))
    }
}

/// Loads `file` with `nft -f` inside `ns`, killing `nft` after `cap`.
pub fn load(ns: &Netns, file: &Path, cap: Duration) -> Result<LoadOutcome, String> {
    let path = file.display().to_string();
    let started = Instant::now();
    let mut child = ns
        .command(["nft", "-f", &path])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting nft -f {path}: {e}"))?;
    loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            let took = started.elapsed();
            if status.success() {
                return Ok(LoadOutcome::Loaded(took));
            }
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            let err: String = err.lines().take(10).collect::<Vec<_>>().join("\n");
            return Err(format!("nft -f {path} failed ({status}):\n{err}"));
        }
        if started.elapsed() > cap {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(LoadOutcome::TimedOut(cap));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Control-plane figures of the kube-proxy-shaped ruleset at one size.
#[derive(Debug)]
pub struct KubeProxyNftControl {
    /// Services.
    pub n: usize,
    /// Endpoints per Service.
    pub m: usize,
    /// Lines of the cold transaction (commands).
    pub commands: usize,
    /// The cold `nft -f`.
    pub cold: LoadOutcome,
    /// Adding one more Service once the N are loaded (`None` when the cold load timed out).
    pub add_one: Option<Duration>,
}

impl KubeProxyNftControl {
    /// The table header matching [`KubeProxyNftControl::markdown_row`].
    pub fn markdown_header() -> &'static str {
        "| Services × endpoints | commands in the transaction | cold: `nft -f` | add one Service: `nft -f` |\n|---|---|---|---|\n"
    }

    /// One table row.
    pub fn markdown_row(&self) -> String {
        format!(
            "| {} × {} | {} | {} | {} |",
            self.n,
            self.m,
            self.commands,
            self.cold.label(),
            self.add_one
                .map(|d| format!("{:.0} ms", d.as_secs_f64() * 1000.0))
                .unwrap_or_else(|| "—".into())
        )
    }
}

/// Renders the workload of `n` × `m` the kube-proxy way, loads it cold into a fresh namespace
/// (capped at `cap`), then adds one more Service in a second transaction.
pub fn run_control(n: usize, m: usize, cap: Duration) -> Result<KubeProxyNftControl, String> {
    let scratch = Scratch::new(&format!("kpn{n}"))?;
    let manifests = scratch.0.join("manifests");
    workload::generate(&manifests, n, m, Endpoints::Unique)
        .map_err(|e| format!("generating: {e}"))?;
    let mut model = snapshot_of(&manifests)?;
    let cold_text = render(model.snapshot());
    let cold_file = scratch.0.join("cold.nft");
    std::fs::write(&cold_file, &cold_text)
        .map_err(|e| format!("writing {}: {e}", cold_file.display()))?;

    // The extra Service, as kube-proxy's partial sync writes it.
    let extra = workload::service_manifest(n, m, Endpoints::Unique, 0);
    let objects = kpng_source_file::parse_manifests(&extra)
        .map_err(|e| e.to_string())?
        .objects;
    for o in objects {
        model.apply(Event::Apply(o));
    }
    let mut add_text = String::new();
    let extra_name = format!("s{n}");
    for sp in model.snapshot().ports.values() {
        if sp.key.family == Family::V4 && *sp.key.service.name == *extra_name {
            render_port(&mut add_text, sp);
        }
    }
    drop(model);
    let add_file = scratch.0.join("add.nft");
    std::fs::write(&add_file, &add_text)
        .map_err(|e| format!("writing {}: {e}", add_file.display()))?;

    let ns = Netns::new("kbp").map_err(|e| e.to_string())?;
    let cold = load(&ns, &cold_file, cap)?;
    let add_one = if cold.loaded() {
        match load(&ns, &add_file, cap)? {
            LoadOutcome::Loaded(d) => Some(d),
            LoadOutcome::TimedOut(_) => None,
        }
    } else {
        None
    };
    Ok(KubeProxyNftControl {
        n,
        m,
        commands: cold_text.lines().count(),
        cold,
        add_one,
    })
}

/// Renders the data-plane workload in `manifests` and loads it into `ns` (capped at `cap`).
pub fn load_for_data_plane(
    ns: &Netns,
    manifests: &Path,
    scratch: &Path,
    cap: Duration,
) -> Result<LoadOutcome, String> {
    let model = snapshot_of(manifests)?;
    let file = scratch.join("kube-proxy-data.nft");
    std::fs::write(&file, render(model.snapshot()))
        .map_err(|e| format!("writing {}: {e}", file.display()))?;
    drop(model);
    load(ns, &file, cap)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn one_service(i: usize, m: usize) -> String {
        let dir = std::env::temp_dir().join(format!(
            "kpng-bench-test-kpn-{}-{i}-{m}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("s.yaml"),
            workload::service_manifest(i, m, Endpoints::Unique, 0),
        )
        .unwrap();
        let model = snapshot_of(&dir).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let mut out = String::new();
        for sp in model.snapshot().ports.values() {
            if sp.key.family == Family::V4 {
                render_port(&mut out, sp);
            }
        }
        out
    }

    #[test]
    fn hash_is_eight_base32_characters_and_stable() {
        let h = hash8("bench/s1/tcp/http");
        assert_eq!(h.len(), 8);
        assert!(
            h.chars()
                .all(|c| c.is_ascii_uppercase() || ('2'..='7').contains(&c))
        );
        assert_eq!(h, hash8("bench/s1/tcp/http"));
        assert_ne!(h, hash8("bench/s2/tcp/http"));
    }

    /// Table: (Service index, what its rendering must contain, how often).
    #[test]
    fn renders_kube_proxy_shape_per_service_type() {
        let cases: &[(usize, &str, usize)] = &[
            // ClusterIP, 3 endpoints: one service chain, 3 endpoint chains, one anonymous vmap.
            (0, "add chain ip kube-proxy endpoint-", 3),
            (0, "numgen random mod 3 vmap { 0 : goto endpoint-", 1),
            (0, "dnat to 10.128.0.", 3),
            (
                0,
                "add element ip kube-proxy service-ips { 10.96.0.1 . tcp . 80",
                1,
            ),
            (0, "add chain ip kube-proxy external-", 0),
            // NodePort: an external chain, reached from service-nodeports.
            (
                6,
                "add element ip kube-proxy service-nodeports { tcp . 20006",
                1,
            ),
            (6, "add rule ip kube-proxy external-", 2),
            // LoadBalancer with eTP Local: local chain over the node's endpoints, VIP element.
            (
                9,
                "add element ip kube-proxy service-ips { 198.18.0.10 . tcp . 80",
                1,
            ),
            (9, "fib saddr type local goto service-", 1),
            // ClientIP affinity: a dynamic set and an update per endpoint.
            (1, "flags dynamic,timeout", 3),
            (1, "update @affinity-", 3),
        ];
        for (i, needle, count) in cases {
            let text = one_service(*i, 3);
            assert_eq!(
                text.matches(needle).count(),
                *count,
                "Service {i}: {needle:?} in\n{text}"
            );
        }
    }

    #[test]
    fn setup_has_the_dispatch_maps_and_hooks() {
        let mut out = String::new();
        render_setup(&mut out);
        for needle in [
            "add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict",
            "add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips",
            "add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }",
        ] {
            assert!(out.contains(needle), "{needle:?} missing in\n{out}");
        }
    }
}
