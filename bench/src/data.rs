//! Data plane: TCP connect latency and connection rate to a Service VIP, for kpng's ruleset at N
//! Services against the floor (one static DNAT rule) and no NAT at all, in identical namespaces,
//! alternating rounds so that machine noise hits every case alike.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kpng_testkit::Netns;

use crate::control::{BackendKind, Kpng, Scratch};
use crate::stats::percentile;
use crate::workload::{self, Endpoints, NODE_IP, TARGET_PORT};

/// One measured case.
#[derive(Debug)]
struct Case {
    label: String,
    latencies_us: Vec<f64>,
    rate: f64,
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

impl DataResult {
    /// (p50 µs, p99 µs, connections/s) of the first case whose label starts with `prefix`.
    pub fn figures(&self, prefix: &str) -> Option<(f64, f64, f64)> {
        let c = self.cases.iter().find(|c| c.label.starts_with(prefix))?;
        let mut l = c.latencies_us.clone();
        Some((percentile(&mut l, 50.0), percentile(&mut l, 99.0), c.rate))
    }

    /// (p50 ratio, rate ratio) of kpng's last Service against the floor.
    pub fn last_vs_floor(&self) -> (f64, f64) {
        let p50 = |c: &Case| percentile(&mut c.latencies_us.clone(), 50.0);
        let floor = self.cases.iter().find(|c| c.label.starts_with("floor"));
        let last = self
            .cases
            .iter()
            .find(|c| c.label.starts_with("kpng nft,") && c.label.ends_with("last Service"));
        match (floor, last) {
            (Some(f), Some(l)) => (p50(l) / p50(f), l.rate / f.rate),
            _ => (f64::NAN, f64::NAN),
        }
    }

    /// A markdown table, ratios against the floor first.
    pub fn markdown(&self) -> String {
        let mut s = format!(
            "{} Services (target: the last-added ClusterIP Service)\n\n| case | p50 | p99 | p50 vs floor | connections/s | rate vs floor |\n|---|---|---|---|---|---|\n",
            self.n
        );
        let floor = self.cases.iter().find(|c| c.label.starts_with("floor"));
        let mut floor_lat = floor.map(|c| c.latencies_us.clone()).unwrap_or_default();
        let floor_p50 = percentile(&mut floor_lat, 50.0);
        let floor_rate = floor.map(|c| c.rate).unwrap_or(f64::NAN);
        for c in &self.cases {
            let mut l = c.latencies_us.clone();
            let p50 = percentile(&mut l, 50.0);
            let p99 = percentile(&mut l, 99.0);
            s.push_str(&format!(
                "| {} | {:.0} µs | {:.0} µs | {:.2}× | {:.0} | {:.2}× |\n",
                c.label,
                p50,
                p99,
                p50 / floor_p50,
                c.rate,
                c.rate / floor_rate
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

/// `kpng-bench connect --target ADDR (--count N | --duration-ms D)`: prints one JSON line with
/// the connect latencies (µs) or the number of connections made.
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
    if let Some(ms) = get("--duration-ms").and_then(|v| v.parse::<u64>().ok()) {
        let end = Instant::now() + Duration::from_millis(ms);
        let (mut ok, mut failed) = (0u64, 0u64);
        let started = Instant::now();
        while Instant::now() < end {
            match TcpStream::connect_timeout(&target, timeout) {
                Ok(_) => ok += 1,
                Err(_) => failed += 1,
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
        let t = Instant::now();
        match TcpStream::connect_timeout(&target, timeout) {
            Ok(s) => {
                lat.push(t.elapsed().as_secs_f64() * 1e6);
                drop(s);
            }
            Err(_) => failed += 1,
        }
    }
    println!("{}", serde_json::json!({"lat_us": lat, "failed": failed}));
    Ok(())
}

fn prepare(ns: &Netns, me: &str) -> Result<kpng_testkit::Spawned, String> {
    let e = |e: kpng_testkit::Error| e.to_string();
    ns.ip_batch(&format!(
        "addr add 10.244.0.1/32 dev lo\naddr add 10.244.0.2/32 dev lo\naddr add 10.244.0.3/32 dev lo\naddr add 10.244.0.4/32 dev lo\naddr add {NODE_IP}/32 dev lo\nroute add default dev lo\n"
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
pub fn run(
    kpng: &str,
    backends: &[BackendKind],
    n: usize,
    connects: usize,
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

    let mut cases: Vec<(String, &Netns, String)> = Vec::new();
    for (backend, ns, _, _) in &with_kpng {
        let label = backend.label();
        cases.push((
            format!("kpng {label}, {n} Services, last Service"),
            ns,
            format!("{last}:80"),
        ));
        cases.push((
            format!("kpng {label}, {n} Services, first Service"),
            ns,
            format!("{first}:80"),
        ));
    }
    cases.extend([
        (
            "floor: one static DNAT rule".to_string(),
            &floor,
            format!("{last}:80"),
        ),
        (
            "no NAT (endpoint directly)".to_string(),
            &floor,
            format!("10.244.0.1:{TARGET_PORT}"),
        ),
    ]);
    if kube_proxy_load.loaded() {
        cases.push((
            format!(
                "{}, {n} Services, last Service",
                crate::kube_proxy_nft::LABEL
            ),
            &kube_proxy,
            format!("{last}:80"),
        ));
    }
    let rounds = 5;
    let mut results: Vec<Case> = cases
        .iter()
        .map(|(l, _, _)| Case {
            label: l.clone(),
            latencies_us: Vec::new(),
            rate: 0.0,
        })
        .collect();
    // Warm up every path once.
    for (_, ns, target) in &cases {
        run_json(
            ns,
            &[
                me.clone(),
                "connect".into(),
                "--target".into(),
                target.clone(),
                "--count".into(),
                "50".into(),
            ],
        )?;
    }
    let mut rates = vec![Vec::new(); cases.len()];
    for _ in 0..rounds {
        for (i, (_, ns, target)) in cases.iter().enumerate() {
            let v = run_json(
                ns,
                &[
                    me.clone(),
                    "connect".into(),
                    "--target".into(),
                    target.clone(),
                    "--count".into(),
                    (connects / rounds).to_string(),
                ],
            )?;
            if v["failed"].as_u64().unwrap_or(0) > 0 {
                return Err(format!(
                    "{}: {} connections failed",
                    results[i].label, v["failed"]
                ));
            }
            results[i].latencies_us.extend(
                v["lat_us"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|x| x.as_f64()),
            );
            let r = run_json(
                ns,
                &[
                    me.clone(),
                    "connect".into(),
                    "--target".into(),
                    target.clone(),
                    "--duration-ms".into(),
                    "300".into(),
                ],
            )?;
            if r["failed"].as_u64().unwrap_or(0) > 0 {
                eprintln!(
                    "warning: {}: {} connections failed during the rate run",
                    results[i].label, r["failed"]
                );
            }
            let ok = r["ok"].as_f64().unwrap_or(0.0);
            rates[i].push(ok / r["secs"].as_f64().unwrap_or(1.0));
        }
    }
    for (i, r) in rates.iter_mut().enumerate() {
        results[i].rate = percentile(r, 50.0);
    }
    Ok(DataResult {
        n,
        cases: results,
        kube_proxy_load: kube_proxy_load.label(),
    })
}
