//! `kpng-demo`: the README's demo. Builds a two-node sandbox out of network namespaces, runs
//! echo pods, starts `kpng file --input examples/cluster.yaml … to-local BACKEND` on node1,
//! and shows where real connections to the example Services go. Everything is removed at the
//! end; `KPNG_DEMO_PAUSE_SECS=N` keeps it N seconds first, for the `ip netns exec …`,
//! `kpng status` and `kpng trace` lines it prints.
//!
//! Each line is also checked against what the Service asks for (spread over several pods,
//! one pod, refused, dropped…); a line that does not hold is marked and the demo exits 1, so
//! the README's command is a test too (`crates/kpng/tests/demo.rs` runs it).
//!
//! ```text
//! kpng-demo [--kpng PATH] --input examples/cluster.yaml [--backend nft|iptables|userspace|ebpf]
//! ```

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use kpng_testkit::{Cluster, Netns, Outcome, Probe, Proto, is_root, tally};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// The backend the demo runs kpng with, and what tells it apart in the demo's lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Nft,
    Iptables,
    Userspace,
    Ebpf,
}

impl Backend {
    fn parse(name: &str) -> Option<Backend> {
        match name {
            "nft" | "nftables" => Some(Backend::Nft),
            "iptables" => Some(Backend::Iptables),
            "userspace" => Some(Backend::Userspace),
            "ebpf" => Some(Backend::Ebpf),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Backend::Nft => "nft",
            Backend::Iptables => "iptables",
            Backend::Userspace => "userspace",
            Backend::Ebpf => "ebpf",
        }
    }

    /// Whether endpoints see the client's own address where nothing masquerades (a proxy is
    /// always the client of its endpoints: docs/backends.md).
    fn keeps_client_address(self) -> bool {
        self != Backend::Userspace
    }

    /// Whether a port no Service uses on an active ClusterIP is rejected (kube-proxy's
    /// iptables mode leaves it alone: docs/backends.md).
    fn rejects_wrong_port(self) -> bool {
        self != Backend::Iptables
    }
}

/// What one demo line must show.
enum Expect {
    /// Every attempt answered, by at least two different pods.
    Spread,
    /// Every attempt answered by one pod, whichever (session affinity).
    OnePod,
    /// Every attempt answered by this pod.
    Only(&'static str),
    /// Every attempt answered by this pod, which saw this client address.
    OnlySeeing(&'static str, &'static str),
    /// Every attempt ended this way (`refused`, `timeout`).
    All(&'static str),
    /// Nothing to check (a documented difference of this backend).
    Anything,
}

impl Expect {
    /// Why `counts` does not meet the expectation, if it does not.
    fn unmet(&self, counts: &BTreeMap<String, usize>) -> Option<String> {
        let pod_of = |label: &str| label.split(' ').next().unwrap_or("").to_owned();
        let answered = |label: &String| label.starts_with("pod");
        match self {
            Expect::Spread => {
                let pods: std::collections::BTreeSet<String> = counts
                    .keys()
                    .filter(|l| answered(l))
                    .map(|l| pod_of(l))
                    .collect();
                if counts.keys().any(|l| !answered(l)) {
                    Some("every attempt should be answered".into())
                } else if pods.len() < 2 {
                    Some("connections should spread over several pods".into())
                } else {
                    None
                }
            }
            Expect::OnePod => {
                let pods: std::collections::BTreeSet<String> =
                    counts.keys().map(|l| pod_of(l)).collect();
                (pods.len() != 1 || counts.keys().any(|l| !answered(l)))
                    .then(|| "one pod should answer every attempt (ClientIP affinity)".into())
            }
            Expect::Only(pod) => (counts.keys().any(|l| pod_of(l) != *pod))
                .then(|| format!("only {pod} should answer")),
            Expect::OnlySeeing(pod, client) => {
                let want = format!("{pod} (saw {client})");
                (counts.keys().any(|l| *l != want))
                    .then(|| format!("only {pod} should answer, seeing the client {client}"))
            }
            Expect::All(outcome) => (counts.keys().any(|l| l.trim_start_matches('!') != *outcome))
                .then(|| format!("every attempt should be {outcome}")),
            Expect::Anything => None,
        }
    }
}

/// Prints one demo line and checks it; counts the lines that do not hold.
struct Report {
    unmet: usize,
}

impl Report {
    fn line(&mut self, title: &str, counts: &BTreeMap<String, usize>, expect: Expect) {
        let parts: Vec<String> = counts.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        println!("  {title:<58} {}", parts.join(", "));
        if let Some(why) = expect.unmet(counts) {
            self.unmet += 1;
            println!("  {:<58} ^ UNEXPECTED: {why}", "");
        }
    }
}

/// Runs `n` fresh connections and reports which pod answered and which source it saw.
fn spread_with_source(
    ns: &Netns,
    proto: Proto,
    target: &str,
    n: usize,
) -> kpng_testkit::Result<BTreeMap<String, usize>> {
    let results = ns.probe(
        &Probe::new(proto, target)
            .count(n)
            .fresh_socket(true)
            .timeout(Duration::from_millis(700)),
    )?;
    let mut out = BTreeMap::new();
    for r in &results {
        let label = match (&r.server_name, &r.client_addr_seen_by_server) {
            (Some(name), Some(seen)) => format!("{name} (saw {})", seen.ip()),
            _ => format!("{:?}", r.outcome).to_lowercase(),
        };
        *out.entry(label).or_insert(0) += 1;
    }
    Ok(out)
}

fn run(kpng: &str, input: &str, backend: Backend) -> kpng_testkit::Result<usize> {
    println!("== building the sandbox: nodes node1, node2, an external client, three pods");
    let cluster = Cluster::create("demo")?;
    let _echo: Vec<_> = ["pod1a", "pod1b", "pod2a"]
        .iter()
        .map(|p| cluster.pod(p).start_echo(8080))
        .collect::<kpng_testkit::Result<_>>()?;
    let node1 = &cluster.node1.ns;
    println!(
        "== starting kpng on node1: kpng file --input {input} --node-name node1 … to-local {}",
        backend.name()
    );
    let admin = std::env::temp_dir().join(format!("kpng-demo-{}.sock", std::process::id()));
    let admin = admin.display().to_string();
    let mut args: Vec<String> = [
        kpng,
        "--admin-socket",
        &admin,
        "file",
        "--input",
        input,
        "--node-name",
        "node1",
        "--cluster-cidr",
        "10.244.0.0/16,fd00:244::/32",
        "--service-cidr",
        "10.96.0.0/16,fd00:96::/112",
        "--min-sync-period",
        "0",
        "--healthz-bind-address",
        "127.0.0.1:10256",
        "to-local",
        backend.name(),
    ]
    .map(String::from)
    .into();
    // The eBPF backend translates the sockets of one cgroup: node1 and its pods are "this
    // node", the other namespaces stand for elsewhere (they share this machine's cgroups).
    let pins = if backend == Backend::Ebpf {
        let (cgroup, pins) = kpng_testkit::cgroups::socket_scope(node1.name())?;
        args.extend([
            "--cgroup-path".into(),
            cgroup.display().to_string(),
            "--bpf-pin-path".into(),
            pins.display().to_string(),
        ]);
        Some(pins)
    } else {
        None
    };
    let kpng_proc = node1.spawn(&args)?;
    let pod1a = &cluster.pod("pod1a").ns;
    let started = Instant::now();
    pod1a.wait_until_ok(Proto::Tcp, "10.96.0.10:80", Duration::from_secs(10))?;
    println!(
        "   rules programmed and answering after {:?}\n",
        started.elapsed()
    );

    let mut report = Report { unmet: 0 };
    let ext = &cluster.ext.ns;
    println!("== default/web ClusterIP 10.96.0.10:80 (pods pod1a, pod1b on node1; pod2a on node2)");
    report.line(
        "from pod1a, 30 TCP connections:",
        &spread_with_source(pod1a, Proto::Tcp, "10.96.0.10:80", 30)?,
        Expect::Spread,
    );
    report.line(
        "from node1 itself, 30 TCP connections:",
        &spread_with_source(node1, Proto::Tcp, "10.96.0.10:80", 30)?,
        Expect::Spread,
    );
    report.line(
        "from the external client (masqueraded), 30:",
        &spread_with_source(ext, Proto::Tcp, "10.96.0.10:80", 30)?,
        Expect::Spread,
    );
    report.line(
        "UDP 10.96.0.10:5353 from pod1b, 30 datagrams:",
        &spread_with_source(&cluster.pod("pod1b").ns, Proto::Udp, "10.96.0.10:5353", 30)?,
        Expect::Spread,
    );
    report.line(
        "IPv6 [fd00:96::10]:80 from pod1a, 30:",
        &spread_with_source(pod1a, Proto::Tcp, "[fd00:96::10]:80", 30)?,
        Expect::Spread,
    );

    println!("\n== shop/cart: NodePort 30080 and external IP 198.51.100.30, ClientIP affinity");
    report.line(
        "NodePort 192.168.100.1:30080 from ext, 10:",
        &spread_with_source(ext, Proto::Tcp, "192.168.100.1:30080", 10)?,
        Expect::OnePod,
    );
    report.line(
        "external IP 198.51.100.30:80 from ext, 10:",
        &spread_with_source(ext, Proto::Tcp, "198.51.100.30:80", 10)?,
        Expect::OnePod,
    );

    println!("\n== shop/storefront: LoadBalancer 198.51.100.20:443, externalTrafficPolicy Local");
    let (title, expect) = if backend.keeps_client_address() {
        (
            "from ext: local pod only, client IP kept:",
            Expect::OnlySeeing("pod1a", "192.168.100.10"),
        )
    } else {
        (
            "from ext: local pod only (the proxy is the client):",
            Expect::Only("pod1a"),
        )
    };
    report.line(
        title,
        &spread_with_source(ext, Proto::Tcp, "198.51.100.20:443", 10)?,
        expect,
    );
    report.line(
        "from pod1a: dropped (loadBalancerSourceRanges):",
        &spread_with_source(pod1a, Proto::Tcp, "198.51.100.20:443", 20)?,
        Expect::All("timeout"),
    );

    println!("\n== more Service semantics");
    report.line(
        "monitoring/node-agent (internalTrafficPolicy Local):",
        &spread_with_source(pod1a, Proto::Tcp, "10.96.2.10:9100", 10)?,
        Expect::Only("pod1b"),
    );
    report.line(
        "default/zonal (zone hints, node1 is in zone-a):",
        &spread_with_source(pod1a, Proto::Tcp, "10.96.0.40:80", 10)?,
        Expect::Only("pod1a"),
    );
    report.line(
        "default/draining (only a terminating endpoint):",
        &spread_with_source(pod1a, Proto::Tcp, "10.96.0.50:80", 5)?,
        Expect::Only("pod2a"),
    );
    let refused = |target: &str| -> kpng_testkit::Result<BTreeMap<String, usize>> {
        Ok(tally(
            &pod1a.probe(
                &Probe::tcp(target)
                    .count(3)
                    .timeout(Duration::from_millis(500)),
            )?,
        ))
    };
    report.line(
        "default/empty (no endpoints) → REJECT:",
        &refused("10.96.0.60:80")?,
        Expect::All("refused"),
    );
    let (title, expect) = if backend.rejects_wrong_port() {
        (
            "wrong port on an active ClusterIP → REJECT:",
            Expect::All("refused"),
        )
    } else {
        (
            "wrong port on an active ClusterIP → left alone:",
            Expect::Anything,
        )
    };
    report.line(title, &refused("10.96.0.10:81")?, expect);
    report.line(
        "unallocated IP in the Service CIDR → DROP:",
        &refused("10.96.9.9:80")?,
        Expect::All("timeout"),
    );

    show_kernel_state(node1, backend, pins.as_deref())?;
    // Ask the running kpng what it programmed and what a packet meets.
    let ask = |what: &str, args: &[&str]| {
        // The socket's real path: the line runs as it is while the demo pauses.
        println!(
            "\n== {what}: kpng {} --admin-socket {admin}",
            args.join(" ")
        );
        match std::process::Command::new(kpng)
            .args(args)
            .args(["--admin-socket", &admin])
            .output()
        {
            Ok(out) => print!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => println!("   could not run kpng: {e}"),
        }
    };
    ask(
        "why one endpoint of default/zonal is left out",
        &["status", "default/zonal", "-o", "wide"],
    );
    ask(
        "what a client outside meets at the LoadBalancer IP",
        &[
            "trace",
            "--from",
            "192.168.100.10",
            "--to",
            "198.51.100.20:443",
        ],
    );
    ask(
        "and pod1a, outside its loadBalancerSourceRanges",
        &["trace", "--from", "10.244.1.2", "--to", "198.51.100.20:443"],
    );
    let r = pod1a.probe_tcp("10.96.0.10:80", Duration::from_secs(1))?;
    if r.outcome != Outcome::Ok {
        return Err(kpng_testkit::Error::Other(format!(
            "final check failed: {r:?}"
        )));
    }
    match pause_secs() {
        Some(secs) => {
            println!(
                "\n== pausing {secs} s (KPNG_DEMO_PAUSE_SECS) so you can look around: the \
                 `ip netns exec …` and `kpng … --admin-socket …` lines above work until then"
            );
            std::thread::sleep(Duration::from_secs(secs));
        }
        None => println!(
            "\n== the sandbox goes now; to run the lines above yourself, keep it a while: \
             KPNG_DEMO_PAUSE_SECS=600 ./scripts/demo.sh"
        ),
    }
    println!("\n== done; removing the sandbox");
    // SIGTERM, as a node's shutdown would: kpng leaves its rules in place and removes its admin
    // socket (a kill would leave the socket file behind).
    if let Err(e) = kpng_proc.terminate(Duration::from_secs(5)) {
        println!("   stopping kpng: {e}");
    }
    let _ = std::fs::remove_file(&admin);
    if let Some(pins) = pins {
        // kpng leaves its pins for the next kpng (a restart keeps sockets translated).
        let _ = std::fs::remove_dir_all(pins);
    }
    Ok(report.unmet)
}

/// `KPNG_DEMO_PAUSE_SECS`: how long to keep the sandbox before removing it, if set.
fn pause_secs() -> Option<u64> {
    std::env::var("KPNG_DEMO_PAUSE_SECS")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .filter(|s| *s > 0)
}

/// What kpng put in node1's kernel, and how to look at it.
fn show_kernel_state(
    node1: &Netns,
    backend: Backend,
    pins: Option<&std::path::Path>,
) -> kpng_testkit::Result<()> {
    let chains_of = |family: &str, table: &str| -> kpng_testkit::Result<usize> {
        let ruleset = node1.run_ok(["nft", "list", "table", family, table])?;
        Ok(ruleset
            .lines()
            .filter(|l| l.trim_start().starts_with("chain "))
            .count())
    };
    let look = |cmd: &str| {
        println!(
            "   inspect it yourself (with KPNG_DEMO_PAUSE_SECS set, before the sandbox goes): \
             ip netns exec {} {cmd}",
            node1.name()
        )
    };
    match backend {
        Backend::Nft => {
            println!(
                "\n== node1's IPv4 table: {} chains whatever the number of Services (per-Service state is in map elements)",
                chains_of("ip", "kpng")?
            );
            look("nft list table ip kpng");
        }
        Backend::Ebpf => {
            println!(
                "\n== node1's sockets are translated at connect()/sendmsg() by cgroup programs (maps pinned in {}); \
                 the IPv4 nftables table ({} chains) serves traffic from outside",
                pins.map_or_else(|| "?".into(), |p| p.display().to_string()),
                chains_of("ip", "kpng")?
            );
            look("nft list table ip kpng");
            println!("   and: bpftool map show; bpftool cgroup tree");
        }
        Backend::Iptables => {
            let saved = node1.run_ok(["iptables-save"])?;
            let chains = saved.lines().filter(|l| l.starts_with(":KUBE-")).count();
            let rules = saved.lines().filter(|l| l.starts_with("-A KUBE-")).count();
            println!(
                "\n== node1's IPv4 iptables: {chains} KUBE-* chains and {rules} rules, as kube-proxy's iptables mode (they grow with Services and endpoints)"
            );
            look("iptables-save");
        }
        Backend::Userspace => {
            println!(
                "\n== node1's IPv4 table `kpng-userspace` ({} chains) steers Service addresses to kpng's own listeners, which connect to the endpoints",
                chains_of("ip", "kpng-userspace")?
            );
            look("nft list table ip kpng-userspace");
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!(
            "kpng-demo --kpng KPNG --input MANIFEST [--backend nft|iptables|userspace|ebpf]\n\n\
             Builds a two-node sandbox of network namespaces, runs kpng on node1 and shows (and\n\
             checks) where connections to the manifest's Services go. Needs root."
        );
        return ExitCode::SUCCESS;
    }
    if !is_root() {
        eprintln!(
            "kpng-demo needs root (it creates network namespaces and programs nftables in them)"
        );
        return ExitCode::FAILURE;
    }
    // Default: the kpng of this build (same target dir and profile), never a guessed target/.
    let kpng = arg(&args, "--kpng")
        .or_else(|| kpng_testkit::sibling_bin("kpng").map(|p| p.display().to_string()))
        .unwrap_or_else(|| "kpng".into());
    let input = arg(&args, "--input").unwrap_or_else(|| "examples/cluster.yaml".into());
    let backend_name = arg(&args, "--backend").unwrap_or_else(|| "nft".into());
    let Some(backend) = Backend::parse(&backend_name) else {
        eprintln!("kpng-demo: --backend {backend_name:?}: one of nft, iptables, userspace, ebpf");
        return ExitCode::FAILURE;
    };
    let input = std::fs::canonicalize(&input)
        .map(|p| p.display().to_string())
        .unwrap_or(input);
    let kpng = std::fs::canonicalize(&kpng)
        .map(|p| p.display().to_string())
        .unwrap_or(kpng);
    match run(&kpng, &input, backend) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(unmet) => {
            eprintln!("kpng-demo: {unmet} line(s) above are UNEXPECTED");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("kpng-demo: {e}");
            ExitCode::FAILURE
        }
    }
}
