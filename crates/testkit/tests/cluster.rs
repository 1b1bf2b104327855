//! Real-packet tests of the harness itself: the topology routes, the echo server
//! answers, the probe classifies refused / dropped traffic, and nothing is left
//! behind. Root only (skipped otherwise, failing under `CI`).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kpng_testkit::{
    Cluster, Netns, NodeId, Outcome, Probe, ProbeResult, Proto, bin_path, require_root,
};

const T: Duration = Duration::from_secs(2);
const PORT: u16 = 8080;

fn namespaces() -> BTreeSet<String> {
    let out = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[track_caller]
fn assert_answer(
    r: &ProbeResult,
    server: &str,
    server_addr: SocketAddr,
    client_ip: std::net::IpAddr,
) {
    assert_eq!(r.outcome, Outcome::Ok, "{r}");
    assert_eq!(r.server_name.as_deref(), Some(server), "{r}");
    assert_eq!(r.server_addr, Some(server_addr), "{r}");
    let seen = r
        .client_addr_seen_by_server
        .expect("client address in reply");
    assert_eq!(seen.ip(), client_ip, "no NAT expected: {r}");
    assert_eq!(Some(seen), r.client_addr, "{r}");
}

#[test]
fn ext_reaches_pod_over_tcp_and_udp_v4_and_v6() {
    require_root!();
    let started = Instant::now();
    let c = Cluster::create("tk-ext").expect("cluster");
    eprintln!("Cluster::create took {:?}", started.elapsed());
    let pod = c.pod("pod1a");
    let _echo = pod.start_echo(PORT).expect("echo");
    for v6 in [false, true] {
        let target = SocketAddr::new(pod.ip(v6), PORT);
        let ext_ip = if v6 {
            c.ext.ipv6.into()
        } else {
            c.ext.ipv4.into()
        };
        let r = c.ext.ns.probe_tcp(target, T).expect("tcp probe");
        assert_answer(&r, "pod1a", target, ext_ip);
        let r = c.ext.ns.probe_udp(target, T).expect("udp probe");
        assert_answer(&r, "pod1a", target, ext_ip);
    }
}

#[test]
fn pods_reach_each_other_across_nodes_and_on_one_node() {
    require_root!();
    let c = Cluster::create("tk-x").expect("cluster");
    let server = c.pod("pod1a");
    let _echo = server.start_echo(PORT).expect("echo");
    for client in ["pod2a", "pod1b"] {
        let client = c.pod(client);
        for v6 in [false, true] {
            let target = SocketAddr::new(server.ip(v6), PORT);
            for proto in [Proto::Tcp, Proto::Udp] {
                let r = client
                    .ns
                    .probe_one(&Probe::new(proto, target).timeout(T))
                    .expect("probe");
                assert_answer(&r, "pod1a", target, client.ip(v6));
            }
        }
    }
    // Wildcard listeners: the UDP reply still names the pod address it arrived on.
    let any = [
        SocketAddr::from(([0, 0, 0, 0], 8081)),
        "[::]:8081".parse().expect("addr"),
    ];
    let _any = c
        .pod("pod1b")
        .ns
        .spawn_echo("pod1b", &any, &any)
        .expect("wildcard echo");
    for v6 in [false, true] {
        let target = SocketAddr::new(c.pod("pod1b").ip(v6), 8081);
        for proto in [Proto::Tcp, Proto::Udp] {
            let r = c
                .ext
                .ns
                .probe_one(&Probe::new(proto, target).timeout(T))
                .expect("probe");
            let ext_ip = if v6 {
                c.ext.ipv6.into()
            } else {
                c.ext.ipv4.into()
            };
            assert_answer(&r, "pod1b", target, ext_ip);
        }
    }
    // Nodes reach pods too (the host network of a node).
    let r = c
        .node2
        .ns
        .probe_tcp(server.addr_v4(PORT), T)
        .expect("probe");
    assert_answer(&r, "pod1a", server.addr_v4(PORT), c.node2.lan_ipv4.into());
}

#[test]
fn closed_port_is_refused_and_dropped_port_times_out() {
    require_root!();
    let c = Cluster::create("tk-rd").expect("cluster");
    let pod = c.pod("pod1a");
    let _echo = pod.start_echo(PORT).expect("echo");
    for v6 in [false, true] {
        let closed = SocketAddr::new(pod.ip(v6), 9);
        for proto in [Proto::Tcp, Proto::Udp] {
            let r = c
                .ext
                .ns
                .probe_one(&Probe::new(proto, closed).timeout(T))
                .expect("probe");
            assert_eq!(r.outcome, Outcome::Refused, "{proto} {closed}: {r}");
        }
    }

    for cmd in [
        "nft add table ip t",
        "nft add chain ip t c { type filter hook input priority 0 ; }",
        "nft add rule ip t c tcp dport 9999 drop",
    ] {
        pod.ns
            .run_ok(cmd.split_whitespace())
            .expect("nft in pod namespace");
    }
    let short = Duration::from_millis(300);
    let r = c.ext.ns.probe_tcp(pod.addr_v4(9999), short).expect("probe");
    assert_eq!(r.outcome, Outcome::Timeout, "{r}");
    assert!(r.elapsed >= short * 9 / 10, "{r} after {:?}", r.elapsed);
    // The rule is IPv4 only: the same port over IPv6 is merely closed.
    let r = c.ext.ns.probe_tcp(pod.addr_v6(9999), short).expect("probe");
    assert_eq!(r.outcome, Outcome::Refused, "{r}");
}

#[test]
fn service_ips_escape_to_ext_and_are_dropped_without_a_proxy() {
    require_root!();
    let c = Cluster::create("tk-svc").expect("cluster");
    let short = Duration::from_millis(300);
    for (ns, what) in [
        (&c.ext.ns, "ext"),
        (&c.pod("pod2a").ns, "pod2a"),
        (&c.node1.ns, "node1"),
    ] {
        for target in ["10.96.0.10:80", "[fd00:96::10]:80"] {
            let r = ns.probe_tcp(target, short).expect("probe");
            assert_eq!(r.outcome, Outcome::Timeout, "{what} -> {target}: {r}");
        }
    }
}

#[test]
fn udp_count_reuses_one_flow_and_fresh_changes_it() {
    require_root!();
    let c = Cluster::builder("tk-udp")
        .ext_gateway(NodeId::Node2)
        .create()
        .expect("cluster");
    let pod = c.pod("pod1b");
    let _echo = pod.start_echo(5353).expect("echo");
    let probe = Probe::udp(pod.addr_v6(5353))
        .count(3)
        .interval(Duration::from_millis(20))
        .timeout(T);
    let rs = c.ext.ns.probe(&probe).expect("probe");
    assert_eq!(rs.len(), 3);
    assert!(rs.iter().all(ProbeResult::is_ok), "{rs:?}");
    let ports: BTreeSet<_> = rs
        .iter()
        .filter_map(|r| r.client_addr_seen_by_server)
        .collect();
    assert_eq!(ports.len(), 1, "one socket, one source port: {rs:?}");

    let rs = c.ext.ns.probe(&probe.fresh_socket(true)).expect("probe");
    let ports: BTreeSet<_> = rs
        .iter()
        .filter_map(|r| r.client_addr_seen_by_server)
        .collect();
    assert_eq!(ports.len(), 3, "a new socket per attempt: {rs:?}");

    // Via node2 (ext's gateway here): still routed to node1's pod.
    let spread = c
        .ext
        .ns
        .spread(Proto::Tcp, pod.addr_v4(5353), 5)
        .expect("spread");
    assert_eq!(spread.get("pod1b"), Some(&5), "{spread:?}");
    let spread = kpng_testkit::spread(&c.ext.ns, Proto::Udp, pod.addr_v4(5353), 5).expect("spread");
    assert_eq!(spread.get("pod1b"), Some(&5), "{spread:?}");
    let spread = c
        .ext
        .ns
        .spread(Proto::Tcp, pod.addr_v4(1), 2)
        .expect("spread");
    assert_eq!(spread.get("!refused"), Some(&2), "{spread:?}");
}

#[test]
fn namespaces_are_deleted_on_drop_even_after_a_panic() {
    require_root!();
    let c = Cluster::create("tk-drop").expect("cluster");
    let names = c.namespace_names();
    assert_eq!(names.len(), 7);
    let echo = c.pod("pod2a").start_echo(PORT).expect("echo");
    let pid = echo.id();
    // Echo still running when the cluster goes: the namespace drop kills it.
    std::mem::forget(echo);
    let before = namespaces();
    assert!(
        names.iter().all(|n| before.contains(n)),
        "{names:?} vs {before:?}"
    );
    let started = Instant::now();
    drop(c);
    eprintln!("Cluster drop took {:?}", started.elapsed());
    let after = namespaces();
    assert!(
        names.iter().all(|n| !after.contains(n)),
        "left behind: {after:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(2);
    while std::path::Path::new(&format!("/proc/{pid}/status")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .contains("State:\tZ")
    {
        assert!(
            Instant::now() < deadline,
            "echo {pid} survived its namespace"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let mut created = Vec::new();
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let c = Cluster::create("tk-panic").expect("cluster");
        created = c.namespace_names();
        panic!("test failure inside a cluster");
    }));
    assert!(res.is_err());
    assert_eq!(created.len(), 7);
    let after = namespaces();
    assert!(
        created.iter().all(|n| !after.contains(n)),
        "left behind: {after:?}"
    );
}

#[test]
fn netns_exec_run_ok_spawn_and_sysctl() {
    require_root!();
    let ns = Netns::new("tk-ns").expect("netns");
    assert!(
        ns.name()
            .starts_with(&format!("tk-ns-{}-", std::process::id()))
    );
    let out = ns.exec(["ip", "-o", "link", "show", "lo"]).expect("exec");
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("UP"),
        "lo is up"
    );

    let err = ns
        .run_ok(["sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 3"])
        .expect_err("exit 3 is an error");
    let msg = err.to_string();
    assert!(
        msg.contains("to-stdout") && msg.contains("to-stderr"),
        "{msg}"
    );

    ns.sysctl("net.ipv4.ip_forward", "1").expect("sysctl");
    assert_eq!(
        ns.run_ok(["cat", "/proc/sys/net/ipv4/ip_forward"])
            .expect("cat")
            .trim(),
        "1"
    );

    let mut sleeper = ns
        .spawn(["sh", "-c", "echo started; exec sleep 60"])
        .expect("spawn");
    sleeper
        .wait_for_line(|l| l == "started", T)
        .expect("started line");
    let pid = sleeper.id();
    assert_eq!(ns.pids().expect("pids"), vec![pid]);
    drop(sleeper);
    assert!(ns.pids().expect("pids").is_empty(), "Spawned drop kills");

    let mut failing = ns
        .spawn(["sh", "-c", "echo oops >&2; exit 1"])
        .expect("spawn");
    let err = failing
        .wait_for_line(|_| true, T)
        .expect_err("no stdout line");
    assert!(err.to_string().contains("oops"), "{err}");

    let script = "table inet t {\n  chain c {\n    type filter hook input priority 0;\n  }\n}\n";
    ns.nft(script).expect("nft -f -");
    assert!(
        ns.run_ok(["nft", "list", "ruleset"])
            .expect("list")
            .contains("table inet t")
    );
    assert!(ns.nft("this is not nft").is_err());
}

#[test]
fn binaries_are_found_and_echo_rejects_bad_arguments() {
    require_root!();
    let echo = bin_path("kpng-echo").expect("kpng-echo");
    let probe = bin_path("kpng-probe").expect("kpng-probe");
    assert!(echo.is_file() && probe.is_file());
    let ns = Netns::new("tk-bin").expect("netns");
    let err = ns
        .spawn_echo(
            "two words",
            &[SocketAddr::from(([127, 0, 0, 1], 7000))],
            &[],
        )
        .expect_err("name with a space");
    assert!(err.to_string().contains("one word"), "{err}");
    // Address not in this namespace: bind fails, and the error says so.
    let err = ns
        .spawn_echo("x", &[SocketAddr::from(([10, 0, 0, 1], 7000))], &[])
        .expect_err("foreign address");
    assert!(err.to_string().contains("10.0.0.1:7000"), "{err}");
    // Loopback in a fresh namespace works, v4 and v6 side by side on one port.
    let v4 = SocketAddr::from(([127, 0, 0, 1], 7000));
    let v6: SocketAddr = "[::1]:7000".parse().expect("addr");
    let _e = ns
        .spawn_echo("lo", &[v4, v6], &[v4, v6])
        .expect("echo on lo");
    for t in [v4, v6] {
        assert!(ns.probe_tcp(t, T).expect("probe").is_ok());
        assert!(ns.probe_udp(t, T).expect("probe").is_ok());
    }
    let r = ns
        .probe_one(&Probe::tcp(v4).bind("127.0.0.2"))
        .expect("probe");
    assert_eq!(
        r.client_addr_seen_by_server.map(|a| a.ip()),
        Some("127.0.0.2".parse().expect("ip")),
        "{r}"
    );
    // No route at all: unreachable (from the prober's own stack).
    let r = ns.probe_tcp("192.0.2.1:80", T).expect("probe");
    assert_eq!(r.outcome, Outcome::Unreachable, "{r}");
}
