//! Data plane: TCP connect latency and connection rate to a Service VIP, for kpng's ruleset at N
//! Services against the floor (one static DNAT rule) and no NAT at all, in identical namespaces,
//! alternating rounds so that machine noise hits every case alike. "No NAT" is measured twice:
//! in the floor's namespace, and in each kpng's own namespace (its ruleset, conntrack and socket
//! programs in place), so that a kpng case against the latter is what translating costs there.
//!
//! The userspace backend completes the client's handshake itself and connects to the endpoint
//! afterwards, so its connect time alone would flatter it: its cases measure until the
//! endpoint's close arrives through the proxy (the endpoint server closes every connection at
//! once), against the floor measured the same way.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kpng_testkit::Netns;

use crate::control::{BackendKind, Kpng, Scratch};
use crate::stats::percentile;
use crate::workload::{self, Endpoints, NODE_IP, TARGET_PORT};

/// What one connection attempt waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Until {
    /// The handshake.
    Connected,
    /// The endpoint's close, relayed back (a full round trip through any proxy).
    Closed,
}

impl Until {
    fn flag(self) -> &'static [&'static str] {
        match self {
            Until::Connected => &[],
            Until::Closed => &["--until-close"],
        }
    }
}

/// The largest workload the userspace backend is measured at: it holds one or more sockets
/// per Service port (30k Services would need ~45k file descriptors).
pub const USERSPACE_MAX_SERVICES: usize = 5000;

/// Rounds of measurement; every round measures every case once, back to back.
const ROUNDS: usize = 15;
/// Connections made and not recorded before each measurement.
const WARM_UP_CONNECTIONS: usize = 20;
/// How long one connection-rate run lasts.
const RATE_RUN_MS: &str = "200";
/// The client's address: a pod on this node that is none of the endpoints (10.244.0.1–4), so
/// that no connection is a hairpin (which kpng, like kube-proxy, masquerades and the floor
/// does not).
const CLIENT_IP: &str = "10.244.0.100";

const FLOOR: &str = "floor: one static DNAT rule";
const FLOOR_CLOSE: &str = "floor: one static DNAT rule → close";

/// The label of the case that connects to the endpoint directly in the namespace where kpng
/// `backend` runs.
fn same_node_label(backend: &str) -> String {
    format!("no NAT, same node with kpng {backend} running")
}

/// One measured case.
#[derive(Debug)]
struct Case {
    label: String,
    /// The label of the case its ratios are against.
    reference: &'static str,
    /// Every connect latency, pooled over the rounds (for the absolute p50 and p99).
    latencies_us: Vec<f64>,
    /// The p50 of each round, paired with the reference's p50 of the same round.
    round_p50_us: Vec<f64>,
    /// The connections/s of each round, paired likewise.
    round_rates: Vec<f64>,
    /// Connections that failed (timed out or were refused); reported, not fatal, except
    /// beyond a small share under `--check` ([`DataResult::failures`]): on a busy 2-vCPU
    /// machine a SYN is occasionally lost.
    failed: u64,
    /// Connections tried (measured and rate runs; warm-up excluded).
    attempted: u64,
}

/// Figures of one data-plane run.
#[derive(Debug)]
pub struct DataResult {
    /// Services.
    pub n: usize,
    cases: Vec<Case>,
    /// How loading the kube-proxy-shaped ruleset went ("0.52 s", "> 150 s").
    pub kube_proxy_load: String,
}

impl Case {
    /// The median connections/s over the rounds.
    fn rate(&self) -> f64 {
        percentile(&mut self.round_rates.clone(), 50.0)
    }
}

/// The median over rounds of `case[r] / reference[r]`: each round measures every case back to
/// back, so pairing them cancels the machine's drift between rounds (on these 2-vCPU VMs a
/// round can be 20% slower than the next for every case alike).
fn paired_ratio(case: &[f64], reference: &[f64]) -> f64 {
    let mut ratios: Vec<f64> = case
        .iter()
        .zip(reference)
        .map(|(c, r)| c / r)
        .filter(|r| r.is_finite())
        .collect();
    percentile(&mut ratios, 50.0)
}

impl DataResult {
    /// (p50 µs, p99 µs, connections/s) of the first case whose label starts with `prefix`.
    pub fn figures(&self, prefix: &str) -> Option<(f64, f64, f64)> {
        let c = self.cases.iter().find(|c| c.label.starts_with(prefix))?;
        let mut l = c.latencies_us.clone();
        Some((percentile(&mut l, 50.0), percentile(&mut l, 99.0), c.rate()))
    }

    /// (p50 ratio, rate ratio) of `case` against its reference, paired by round.
    fn ratios(&self, case: &Case) -> (f64, f64) {
        match self.cases.iter().find(|f| f.label == case.reference) {
            Some(reference) => (
                paired_ratio(&case.round_p50_us, &reference.round_p50_us),
                paired_ratio(&case.round_rates, &reference.round_rates),
            ),
            None => (f64::NAN, f64::NAN),
        }
    }

    /// The case of `backend` (a label such as "nft") to the `target` ("first" or "last") Service.
    fn kpng_case(&self, backend: &str, target: &str) -> Option<&Case> {
        let (prefix, suffix) = (format!("kpng {backend},"), format!("{target} Service"));
        self.cases
            .iter()
            .find(|c| c.label.starts_with(&prefix) && c.label.ends_with(&suffix))
    }

    /// (p50 ratio, rate ratio) of kpng nft's connections to the `target` ("first" or "last")
    /// Service against the floor.
    pub fn nft_vs_floor(&self, target: &str) -> (f64, f64) {
        self.kpng_case("nft", target)
            .map_or((f64::NAN, f64::NAN), |c| self.ratios(c))
    }

    /// How many times kpng nft's connection rate to the last Service is `backend`'s (paired by
    /// round), or `None` when `backend` was not measured.
    pub fn nft_rate_over(&self, backend: &str) -> Option<f64> {
        let nft = self.kpng_case("nft", "last")?;
        let other = self.kpng_case(backend, "last")?;
        Some(paired_ratio(&nft.round_rates, &other.round_rates))
    }

    /// (p50 ratio, rate ratio) of kpng `backend`'s connections to the last Service against
    /// the endpoint reached directly on the same node ([`same_node_label`]), paired by round;
    /// `None` when `backend` was not measured.
    pub fn vs_same_node_no_nat(&self, backend: &str) -> Option<(f64, f64)> {
        let kpng = self.kpng_case(backend, "last")?;
        let label = same_node_label(backend);
        let direct = self.cases.iter().find(|c| c.label == label)?;
        Some((
            paired_ratio(&kpng.round_p50_us, &direct.round_p50_us),
            paired_ratio(&kpng.round_rates, &direct.round_rates),
        ))
    }

    /// Each case's failed and attempted connections, for `--check`.
    pub fn failures(&self) -> Vec<(&str, u64, u64)> {
        self.cases
            .iter()
            .map(|c| (c.label.as_str(), c.failed, c.attempted))
            .collect()
    }

    /// Each case's figures by name (p50, p99, connections/s), for `--check`.
    pub fn checked_figures(&self) -> Vec<(String, f64)> {
        self.cases
            .iter()
            .flat_map(|c| {
                let mut l = c.latencies_us.clone();
                [
                    (format!("{}: p50", c.label), percentile(&mut l, 50.0)),
                    (format!("{}: p99", c.label), percentile(&mut l, 99.0)),
                    (format!("{}: connections/s", c.label), c.rate()),
                ]
            })
            .collect()
    }

    /// A markdown table, ratios against the floor first.
    pub fn markdown(&self) -> String {
        let mut s = format!(
            "{} Services, {ROUNDS} rounds (target: the last-added ClusterIP Service; the client is a pod on the node that is not an endpoint; \"→ close\" cases wait for the endpoint's close through the path, and compare with the floor measured so; a ratio is the median of the rounds' ratios, each round measuring every case back to back)\n\n| case | p50 | p99 | p50 vs floor | connections/s | rate vs floor |\n|---|---|---|---|---|---|\n",
            self.n
        );
        for c in &self.cases {
            let (p50_ratio, rate_ratio) = self.ratios(c);
            let mut l = c.latencies_us.clone();
            let p50 = percentile(&mut l, 50.0);
            let p99 = percentile(&mut l, 99.0);
            s.push_str(&format!(
                "| {} | {p50:.1} µs | {p99:.0} µs | {p50_ratio:.2}× | {:.0} | {rate_ratio:.2}× |\n",
                c.label,
                c.rate(),
            ));
        }
        for c in &self.cases {
            let Some(backend) = c
                .label
                .strip_prefix("kpng ")
                .and_then(|l| l.split(',').next())
                .filter(|_| c.label.ends_with("last Service"))
            else {
                continue;
            };
            if let Some((p50, rate)) = self.vs_same_node_no_nat(backend) {
                s.push_str(&format!(
                    "\nkpng {backend} against the endpoint directly on the same node (its rules and hooks in place): p50 {p50:.2}×, connections/s {rate:.2}×.\n"
                ));
            }
        }
        for c in self.cases.iter().filter(|c| c.failed > 0) {
            s.push_str(&format!(
                "\n{}: {} connection(s) failed (timed out or refused).\n",
                c.label, c.failed
            ));
        }
        s.push_str(&format!(
            "\n(kube-proxy-shaped nftables ruleset for these Services loaded with `nft -f` in {})\n",
            self.kube_proxy_load
        ));
        s
    }
}

/// `kpng-bench serve --listen ADDR`: accepts and closes connections, with a deep accept queue
/// and two acceptors so that the server is never what limits the connection rate.
pub fn serve(listen: &str) -> Result<(), String> {
    let addr: SocketAddr = listen
        .parse()
        .map_err(|e| format!("--listen {listen}: {e}"))?;
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )
    .map_err(|e| format!("socket: {e}"))?;
    socket
        .set_reuse_address(true)
        .map_err(|e| format!("SO_REUSEADDR: {e}"))?;
    socket
        .bind(&addr.into())
        .map_err(|e| format!("binding {listen}: {e}"))?;
    socket.listen(4096).map_err(|e| format!("listen: {e}"))?;
    let listener: TcpListener = socket.into();
    let second = listener
        .try_clone()
        .map_err(|e| format!("cloning the listener: {e}"))?;
    let acceptor = std::thread::spawn(move || {
        for stream in second.incoming() {
            drop(stream);
        }
    });
    for stream in listener.incoming() {
        drop(stream);
    }
    let _ = acceptor.join();
    Ok(())
}

/// One connection: returns how long the handshake (with `until_close`, the handshake and the
/// server's close) took, or `None` when it failed.
///
/// The client then closes with a reset (`SO_LINGER` 0), outside the timed part: a normal close
/// would leave one TIME_WAIT socket per connection, and tens of thousands of them slow down
/// the choice of a source port, so whichever case ran later in a namespace would look slower.
fn one_connection(target: &SocketAddr, timeout: Duration, until_close: bool) -> Option<Duration> {
    let started = Instant::now();
    let mut stream = TcpStream::connect_timeout(target, timeout).ok()?;
    if until_close {
        let _ = stream.set_read_timeout(Some(timeout));
        let mut buf = [0u8; 64];
        // A close is a clean EOF; a reset (the proxy found no endpoint) is a failure.
        if !matches!(std::io::Read::read(&mut stream, &mut buf), Ok(0)) {
            return None;
        }
    }
    let took = started.elapsed();
    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    Some(took)
}

/// `kpng-bench connect --target ADDR (--count N | --duration-ms D) [--until-close]`: prints
/// one JSON line with the connect latencies (µs) or the number of connections made.
pub fn connect_cmd(args: &[String]) -> Result<(), String> {
    let get = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let target: SocketAddr = get("--target")
        .ok_or("--target needed")?
        .parse()
        .map_err(|e| format!("--target: {e}"))?;
    let timeout = Duration::from_secs(1);
    let until_close = args.iter().any(|a| a == "--until-close");
    // Unrecorded connections first: the first ones after a switch of process and namespace
    // find cold caches, which would bias whichever case a round measures first.
    for _ in 0..WARM_UP_CONNECTIONS {
        let _ = one_connection(&target, timeout, until_close);
    }
    if let Some(ms) = get("--duration-ms").and_then(|v| v.parse::<u64>().ok()) {
        let end = Instant::now() + Duration::from_millis(ms);
        let (mut ok, mut failed) = (0u64, 0u64);
        let started = Instant::now();
        while Instant::now() < end {
            if one_connection(&target, timeout, until_close).is_some() {
                ok += 1;
            } else {
                failed += 1;
            }
        }
        println!(
            "{}",
            serde_json::json!({"ok": ok, "failed": failed, "secs": started.elapsed().as_secs_f64()})
        );
        return Ok(());
    }
    let count: usize = get("--count").and_then(|v| v.parse().ok()).unwrap_or(100);
    let mut lat = Vec::with_capacity(count);
    let mut failed = 0;
    for _ in 0..count {
        match one_connection(&target, timeout, until_close) {
            Some(took) => lat.push(took.as_secs_f64() * 1e6),
            None => failed += 1,
        }
    }
    println!("{}", serde_json::json!({"lat_us": lat, "failed": failed}));
    Ok(())
}

fn prepare(ns: &Netns, me: &str) -> Result<kpng_testkit::Spawned, String> {
    let e = |e: kpng_testkit::Error| e.to_string();
    ns.ip_batch(&format!(
        "addr add 10.244.0.1/32 dev lo\naddr add 10.244.0.2/32 dev lo\naddr add 10.244.0.3/32 dev lo\naddr add 10.244.0.4/32 dev lo\naddr add {CLIENT_IP}/32 dev lo\naddr add {NODE_IP}/32 dev lo\nroute add default dev lo src {CLIENT_IP}\n"
    ))
    .map_err(e)?;
    ns.sysctls(&[
        ("net.ipv4.tcp_tw_reuse", "1"),
        ("net.ipv4.ip_local_port_range", "1024 65000"),
        ("net.core.somaxconn", "4096"),
    ])
    .map_err(e)?;
    let mut server = ns
        .spawn([me, "serve", "--listen", &format!("0.0.0.0:{TARGET_PORT}")])
        .map_err(e)?;
    std::thread::sleep(Duration::from_millis(100));
    if let Ok(Some(status)) = server.try_wait() {
        return Err(format!("server exited: {status}"));
    }
    Ok(server)
}

fn run_json(ns: &Netns, args: &[String]) -> Result<serde_json::Value, String> {
    let out = ns.run_ok(args).map_err(|e| e.to_string())?;
    serde_json::from_str(out.trim()).map_err(|e| format!("bad output {out:?}: {e}"))
}

/// Runs the data-plane benchmark for `n` Services, with kpng on each of `backends`.
/// Runs the data-plane benchmark for `n` Services, for each of `backends` (and the userspace
/// backend, measured to the endpoint's close, when `userspace`).
pub fn run(
    kpng: &str,
    backends: &[BackendKind],
    n: usize,
    connects: usize,
    userspace: bool,
) -> Result<DataResult, String> {
    let me: PathBuf = std::env::current_exe().map_err(|e| e.to_string())?;
    let me = me.display().to_string();
    let scratch = Scratch::new(&format!("dp{n}"))?;
    let manifests = scratch.0.join("manifests");
    workload::generate(&manifests, n, 4, Endpoints::Local4)
        .map_err(|e| format!("generating: {e}"))?;

    // One namespace with its own kpng per backend.
    let mut with_kpng = Vec::new();
    for backend in backends {
        let ns = Netns::new("kbk").map_err(|e| e.to_string())?;
        let server = prepare(&ns, &me)?;
        let log = scratch.0.join(format!("kpng-{}.log", backend.label()));
        let mut kp = Kpng::start(&ns, kpng, *backend, &manifests, &log)?;
        kp.wait_for_syncs(1, Duration::from_secs(600))?;
        with_kpng.push((*backend, ns, server, kp));
    }
    let with_userspace = if userspace {
        let ns = Netns::new("kbu").map_err(|e| e.to_string())?;
        let server = prepare(&ns, &me)?;
        let log = scratch.0.join("kpng-userspace.log");
        let mut kp = Kpng::start(&ns, kpng, BackendKind::Userspace, &manifests, &log)?;
        kp.wait_for_syncs(1, Duration::from_secs(600))?;
        Some((ns, server, kp))
    } else {
        None
    };

    let last = workload::cluster_ip(workload::last_plain_service(n));
    let first = workload::cluster_ip(0);
    let floor = Netns::new("kbf").map_err(|e| e.to_string())?;
    let _server_f = prepare(&floor, &me)?;
    floor
        .nft(&format!(
            "table ip floor {{\n\tchain out {{\n\t\ttype nat hook output priority -100; policy accept;\n\t\tip daddr {last} tcp dport 80 dnat to 10.244.0.1:{TARGET_PORT}\n\t}}\n}}\n"
        ))
        .map_err(|e| e.to_string())?;

    // The kube-proxy-shaped nftables ruleset of the same Services, when it loads in time.
    let kube_proxy = Netns::new("kbq").map_err(|e| e.to_string())?;
    let _server_q = prepare(&kube_proxy, &me)?;
    let kube_proxy_load = crate::kube_proxy_nft::load_for_data_plane(
        &kube_proxy,
        &manifests,
        &scratch.0,
        crate::kube_proxy_nft::DATA_PLANE_CAP,
    )?;

    // (label, reference, namespace, target, what a connection waits for)
    let mut cases: Vec<(String, &'static str, &Netns, String, Until)> = Vec::new();
    for (backend, ns, _, _) in &with_kpng {
        let label = backend.label();
        cases.push((
            format!("kpng {label}, {n} Services, last Service"),
            FLOOR,
            ns,
            format!("{last}:80"),
            Until::Connected,
        ));
        cases.push((
            format!("kpng {label}, {n} Services, first Service"),
            FLOOR,
            ns,
            format!("{first}:80"),
            Until::Connected,
        ));
    }
    cases.extend([
        (
            FLOOR.to_string(),
            FLOOR,
            &floor,
            format!("{last}:80"),
            Until::Connected,
        ),
        (
            "no NAT (endpoint directly)".to_string(),
            FLOOR,
            &floor,
            format!("10.244.0.1:{TARGET_PORT}"),
            Until::Connected,
        ),
    ]);
    // The endpoint directly on each kpng's node: the same ruleset, conntrack hooks and (for
    // ebpf) socket programs in the path, no translation. Against it, a kpng case's ratio is
    // what translating costs on that node, separate from what merely having the rules costs.
    for (backend, ns, _, _) in &with_kpng {
        cases.push((
            same_node_label(backend.label()),
            FLOOR,
            ns,
            format!("10.244.0.1:{TARGET_PORT}"),
            Until::Connected,
        ));
    }
    if kube_proxy_load.loaded() {
        cases.push((
            format!(
                "{}, {n} Services, last Service",
                crate::kube_proxy_nft::LABEL
            ),
            FLOOR,
            &kube_proxy,
            format!("{last}:80"),
            Until::Connected,
        ));
    }
    if let Some((ns, _, _)) = &with_userspace {
        cases.push((
            format!("kpng userspace, {n} Services, last Service → close"),
            FLOOR_CLOSE,
            ns,
            format!("{last}:80"),
            Until::Closed,
        ));
        cases.push((
            FLOOR_CLOSE.to_string(),
            FLOOR_CLOSE,
            &floor,
            format!("{last}:80"),
            Until::Closed,
        ));
    }
    let mut results: Vec<Case> = cases
        .iter()
        .map(|(l, reference, _, _, _)| Case {
            label: l.clone(),
            reference,
            latencies_us: Vec::new(),
            round_p50_us: Vec::new(),
            round_rates: Vec::new(),
            failed: 0,
            attempted: 0,
        })
        .collect();
    let command = |target: &str, until: Until, what: [&str; 2]| -> Vec<String> {
        let mut v = vec![
            me.clone(),
            "connect".into(),
            "--target".into(),
            target.to_string(),
            what[0].into(),
            what[1].into(),
        ];
        v.extend(until.flag().iter().map(|s| s.to_string()));
        v
    };
    let per_round = (connects / ROUNDS).to_string();
    // Every measurement starts from an empty conntrack table, so that no case pays for the
    // entries an earlier one left in the same namespace.
    let flush = |ns: &Netns| {
        ns.run_ok(["conntrack", "-F"])
            .map(drop)
            .map_err(|e| format!("flushing conntrack: {e}"))
    };
    for round in 0..ROUNDS {
        // Each round starts at another case, so that no case is always measured first.
        for i in (0..cases.len()).map(|k| (k + round) % cases.len()) {
            let (_, _, ns, target, until) = &cases[i];
            flush(ns)?;
            let v = run_json(ns, &command(target, *until, ["--count", &per_round]))?;
            let failed = v["failed"].as_u64().unwrap_or(0);
            if failed > 0 {
                eprintln!("warning: {}: {failed} connections failed", results[i].label);
                results[i].failed += failed;
            }
            let mut latencies: Vec<f64> = v["lat_us"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|x| x.as_f64())
                .collect();
            results[i].attempted += failed + latencies.len() as u64;
            results[i]
                .round_p50_us
                .push(percentile(&mut latencies, 50.0));
            results[i].latencies_us.extend(latencies);
            flush(ns)?;
            let r = run_json(ns, &command(target, *until, ["--duration-ms", RATE_RUN_MS]))?;
            let failed = r["failed"].as_u64().unwrap_or(0);
            if failed > 0 {
                eprintln!(
                    "warning: {}: {failed} connections failed during the rate run",
                    results[i].label
                );
                results[i].failed += failed;
            }
            let ok = r["ok"].as_f64().unwrap_or(0.0);
            results[i].attempted += failed + r["ok"].as_u64().unwrap_or(0);
            results[i]
                .round_rates
                .push(ok / r["secs"].as_f64().unwrap_or(1.0));
        }
    }
    Ok(DataResult {
        n,
        cases: results,
        kube_proxy_load: kube_proxy_load.label(),
    })
}
