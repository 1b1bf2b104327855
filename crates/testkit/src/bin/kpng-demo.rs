//! `kpng-demo`: the README's demo. Builds a two-node sandbox out of network namespaces, runs
//! echo pods, starts `kpng file --input examples/cluster.yaml … to-local nft` on node1, and
//! shows where real connections to the example Services go. Everything is removed at the end.
//!
//! ```text
//! kpng-demo --kpng target/debug/kpng --input examples/cluster.yaml
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

fn show(title: &str, counts: &BTreeMap<String, usize>) {
    let parts: Vec<String> = counts.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    println!("  {title:<58} {}", parts.join(", "));
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

fn run(kpng: &str, input: &str) -> kpng_testkit::Result<()> {
    println!("== building the sandbox: nodes node1, node2, an external client, three pods");
    let cluster = Cluster::create("demo")?;
    let _echo: Vec<_> = ["pod1a", "pod1b", "pod2a"]
        .iter()
        .map(|p| cluster.pod(p).start_echo(8080))
        .collect::<kpng_testkit::Result<_>>()?;
    let node1 = &cluster.node1.ns;
    println!(
        "== starting kpng on node1: kpng file --input {input} --node-name node1 … to-local nft"
    );
    let admin = std::env::temp_dir().join(format!("kpng-demo-{}.sock", std::process::id()));
    let admin = admin.display().to_string();
    let _kpng = node1.spawn([
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
        "nft",
    ])?;
    let pod1a = &cluster.pod("pod1a").ns;
    let started = Instant::now();
    pod1a.wait_until_ok(Proto::Tcp, "10.96.0.10:80", Duration::from_secs(10))?;
    println!(
        "   rules programmed and answering after {:?}\n",
        started.elapsed()
    );

    let ext = &cluster.ext.ns;
    println!("== default/web ClusterIP 10.96.0.10:80 (pods pod1a, pod1b on node1; pod2a on node2)");
    show(
        "from pod1a, 30 TCP connections:",
        &spread_with_source(pod1a, Proto::Tcp, "10.96.0.10:80", 30)?,
    );
    show(
        "from node1 itself, 30 TCP connections:",
        &spread_with_source(node1, Proto::Tcp, "10.96.0.10:80", 30)?,
    );
    show(
        "from the external client (masqueraded), 30:",
        &spread_with_source(ext, Proto::Tcp, "10.96.0.10:80", 30)?,
    );
    show(
        "UDP 10.96.0.10:5353 from pod1b, 30 datagrams:",
        &spread_with_source(&cluster.pod("pod1b").ns, Proto::Udp, "10.96.0.10:5353", 30)?,
    );
    show(
        "IPv6 [fd00:96::10]:80 from pod1a, 30:",
        &spread_with_source(pod1a, Proto::Tcp, "[fd00:96::10]:80", 30)?,
    );

    println!("\n== shop/cart: NodePort 30080 and external IP 198.51.100.30, ClientIP affinity");
    show(
        "NodePort 192.168.100.1:30080 from ext, 10:",
        &spread_with_source(ext, Proto::Tcp, "192.168.100.1:30080", 10)?,
    );
    show(
        "external IP 198.51.100.30:80 from ext, 10:",
        &spread_with_source(ext, Proto::Tcp, "198.51.100.30:80", 10)?,
    );

    println!("\n== shop/storefront: LoadBalancer 198.51.100.20:443, externalTrafficPolicy Local");
    show(
        "from ext: local pod only, client IP kept:",
        &spread_with_source(ext, Proto::Tcp, "198.51.100.20:443", 10)?,
    );
    show(
        "from pod1a: dropped (loadBalancerSourceRanges):",
        &spread_with_source(pod1a, Proto::Tcp, "198.51.100.20:443", 20)?,
    );

    println!("\n== more Service semantics");
    show(
        "monitoring/node-agent (internalTrafficPolicy Local):",
        &spread_with_source(pod1a, Proto::Tcp, "10.96.2.10:9100", 10)?,
    );
    show(
        "default/zonal (zone hints, node1 is in zone-a):",
        &spread_with_source(pod1a, Proto::Tcp, "10.96.0.40:80", 10)?,
    );
    show(
        "default/draining (only a terminating endpoint):",
        &spread_with_source(pod1a, Proto::Tcp, "10.96.0.50:80", 5)?,
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
    show(
        "default/empty (no endpoints) → REJECT:",
        &refused("10.96.0.60:80")?,
    );
    show(
        "wrong port on an active ClusterIP → REJECT:",
        &refused("10.96.0.10:81")?,
    );
    show(
        "unallocated IP in the Service CIDR → DROP:",
        &refused("10.96.9.9:80")?,
    );

    let ruleset = node1.run_ok(["nft", "list", "table", "ip", "kpng"])?;
    let chains = ruleset
        .lines()
        .filter(|l| l.trim_start().starts_with("chain "))
        .count();
    let rules = ruleset
        .lines()
        .filter(|l| {
            l.starts_with("\t\t")
                && !l.contains("type ")
                && !l.contains("elements")
                && !l.trim_start().starts_with(|c: char| c.is_ascii_digit())
        })
        .count();
    println!(
        "\n== node1's IPv4 table: {chains} chains whatever the number of Services (per-Service state is in map elements)"
    );
    println!(
        "   inspect it yourself: ip netns exec {} nft list table ip kpng",
        node1.name()
    );
    let _ = rules;
    // Ask the running kpng what it programmed and what a packet meets.
    let ask = |what: &str, args: &[&str]| {
        println!("\n== {what}: kpng {} --admin-socket …", args.join(" "));
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
    if let Some(secs) = std::env::var("KPNG_DEMO_PAUSE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        println!("\n== pausing {secs} s (KPNG_DEMO_PAUSE_SECS) so you can look around");
        std::thread::sleep(Duration::from_secs(secs));
    }
    println!("\n== done; removing the sandbox");
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if !is_root() {
        eprintln!(
            "kpng-demo needs root (it creates network namespaces and programs nftables in them)"
        );
        return ExitCode::FAILURE;
    }
    let kpng = arg(&args, "--kpng").unwrap_or_else(|| "target/debug/kpng".into());
    let input = arg(&args, "--input").unwrap_or_else(|| "examples/cluster.yaml".into());
    let input = std::fs::canonicalize(&input)
        .map(|p| p.display().to_string())
        .unwrap_or(input);
    let kpng = std::fs::canonicalize(&kpng)
        .map(|p| p.display().to_string())
        .unwrap_or(kpng);
    match run(&kpng, &input) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kpng-demo: {e}");
            ExitCode::FAILURE
        }
    }
}
