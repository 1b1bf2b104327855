//! Replacing a running kube-proxy (root, real packets): node1 carries kube-proxy's nftables
//! ruleset for the cluster's Services (its v1.31–v1.35 layout), an established connection
//! goes through it and a prober keeps opening new ones while kpng starts with kube-proxy's own
//! command line (`kpng --config FILE --hostname-override=node1`, `mode: nftables`) against an
//! API server. Once kpng's rules are in place it removes kube-proxy's tables; no new
//! connection fails during the switch, the established one keeps working, and the
//! `kube-proxy` tables are gone.

// Only the harness and a few scenario helpers; not the shared suite.
#[allow(unused_macros, unused_imports)]
mod e2e;

use std::time::{Duration, Instant};

use e2e::harness::{
    Cond, EP_PORT, FakeServer, OK_T, SVC_PORT, cip, manifest, names, sa, set, start_line_server,
    svc,
};
use e2e::scenarios::HeldConnection;
use kpng_testkit::{
    Cluster, Netns, Outcome, Probe, ProbeResult, Proto, Spawned, addr, bin_path, describe_output,
    require_root, tally,
};

/// kube-proxy's nftables ruleset (v1.31–v1.35 layout) for Service `mig` (ClusterIP
/// 10.96.0.120, node port 30120, endpoints pod1a and pod1b) and Service `hold`
/// (ClusterIP 10.96.0.121, endpoint pod2a), TCP port 80 → 8080, as kube-proxy programs it
/// on node1; plus its (empty) IPv6 table.
fn kube_proxy_ruleset() -> String {
    let t = "ip kube-proxy";
    let mut s = format!(
        "add table {t} {{ comment \"rules for kube-proxy\" ; }}\n\
         add chain {t} nat-prerouting {{ type nat hook prerouting priority -100 ; }}\n\
         add chain {t} nat-output {{ type nat hook output priority -100 ; }}\n\
         add chain {t} nat-postrouting {{ type nat hook postrouting priority 100 ; }}\n\
         add chain {t} mark-for-masquerade\n\
         add chain {t} masquerading\n\
         add chain {t} services\n\
         add rule {t} mark-for-masquerade mark set mark or 0x4000\n\
         add rule {t} masquerading mark and 0x4000 == 0 return\n\
         add rule {t} masquerading mark set mark xor 0x4000\n\
         add rule {t} masquerading masquerade fully-random\n\
         add rule {t} nat-prerouting jump services\n\
         add rule {t} nat-output jump services\n\
         add rule {t} nat-postrouting jump masquerading\n\
         add set {t} nodeport-ips {{ type ipv4_addr ; comment \"IPs that accept NodePort traffic\" ; }}\n\
         add element {t} nodeport-ips {{ {node} }}\n\
         add map {t} service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; }}\n\
         add map {t} service-nodeports {{ type inet_proto . inet_service : verdict ; }}\n\
         add rule {t} services ip daddr . meta l4proto . th dport vmap @service-ips\n\
         add rule {t} services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports\n",
        node = addr::NODE1_LAN_V4,
    );
    let services: [(&str, &str, u8, &[&str]); 2] = [
        ("ZQK3HTCA", "mig", 120, &["10.244.1.2", "10.244.1.3"]),
        ("B6O2MGUQ", "hold", 121, &["10.244.2.2"]),
    ];
    for (hash, name, n, endpoints) in services {
        let base = format!("{hash}-default/{name}/tcp/tcp");
        let service = format!("service-{base}");
        let ip = cip(n, false);
        s.push_str(&format!(
            "add chain {t} {service}\n\
             add rule {t} {service} ip daddr {ip} tcp dport {SVC_PORT} ip saddr != {cidr} jump mark-for-masquerade\n",
            cidr = addr::CLUSTER_CIDR_V4,
        ));
        let mut vmap = Vec::new();
        for (i, ep) in endpoints.iter().enumerate() {
            let chain = format!("endpoint-{hash}-default/{name}/tcp/tcp__{ep}/{EP_PORT}");
            s.push_str(&format!(
                "add chain {t} {chain}\n\
                 add rule {t} {chain} ip saddr {ep} jump mark-for-masquerade\n\
                 add rule {t} {chain} meta l4proto tcp dnat to {ep}:{EP_PORT}\n"
            ));
            vmap.push(format!("{i} : goto {chain}"));
        }
        s.push_str(&format!(
            "add rule {t} {service} numgen random mod {} vmap {{ {} }}\n\
             add element {t} service-ips {{ {ip} . tcp . {SVC_PORT} : goto {service} }}\n",
            endpoints.len(),
            vmap.join(" , ")
        ));
        if name == "mig" {
            let external = format!("external-{base}");
            s.push_str(&format!(
                "add chain {t} {external}\n\
                 add rule {t} {external} jump mark-for-masquerade\n\
                 add rule {t} {external} goto {service}\n\
                 add element {t} service-nodeports {{ tcp . {} : goto {external} }}\n",
                30000 + u16::from(n)
            ));
        }
    }
    s.push_str(
        "add table ip6 kube-proxy { comment \"rules for kube-proxy\" ; }\n\
         add chain ip6 kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }\n",
    );
    s
}

fn tables(ns: &Netns) -> String {
    ns.run_ok(["nft", "list", "tables"])
        .expect("nft list tables")
}

/// Whether `nft list tables` lists exactly `table` (a line of its own): kpng's anchor table
/// (`kpng-anchor`) shares the prefix of `table ip kpng`.
fn has_table(listing: &str, table: &str) -> bool {
    listing.lines().any(|line| line.trim() == table)
}

/// `kpng ARGS…` run in `ns` to its end: its standard output. A non-zero exit panics with the
/// exit status, standard output and standard error (testkit's message for a failed command).
fn kpng_ok(ns: &Netns, args: &[&str]) -> String {
    let what = format!("kpng {}", args.join(" "));
    ns.run_ok(std::iter::once(env!("CARGO_BIN_EXE_kpng")).chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// `kpng ARGS…` run in `ns` to its end, whatever its exit: a test that expects a refusal reads
/// it, and names all of it with [`describe_output`] when it is not the one expected.
fn kpng_run(ns: &Netns, args: &[&str]) -> std::process::Output {
    ns.exec(std::iter::once(env!("CARGO_BIN_EXE_kpng")).chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("kpng {}: {e}", args.join(" ")))
}

#[test]
fn kpng_replaces_a_running_kube_proxy_without_failing_a_connection() {
    require_root!();
    let c = Cluster::create("mig").expect("cluster");
    // pod1a and pod1b serve `mig`; pod2a holds a connection of `hold`.
    let _echo: Vec<Spawned> = ["pod1a", "pod1b"]
        .iter()
        .map(|p| c.pod(p).start_echo(EP_PORT).expect("echo"))
        .collect();
    let _line_server = start_line_server(&c, "pod2a");

    // kube-proxy's rules serve both Services.
    c.node1
        .ns
        .nft(&kube_proxy_ruleset())
        .expect("load kube-proxy's ruleset");
    let client = &c.ext.ns;
    let mig = sa(cip(120, false), SVC_PORT);
    let mig_np = sa(addr::NODE1_LAN_V4.into(), 30120);
    let all = set(&["pod1a", "pod1b"]);
    assert_eq!(
        names(&e2e::harness::spread(client, Proto::Tcp, mig, 30)),
        all
    );

    // A connection established through kube-proxy's DNAT.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut held = HeldConnection::open(&c.pod("pod1b").ns, cip(121, false), "pod2a");

    // The same Services in the API server, and kube-proxy's configuration for kpng.
    let objects = manifest(&[
        svc(
            "mig",
            120,
            "NodePort",
            "",
            &[("pod1a", Cond::Ready), ("pod1b", Cond::Ready)],
        ),
        svc("hold", 121, "ClusterIP", "", &[("pod2a", Cond::Ready)]),
    ]);
    let input = dir.path().join("cluster.yaml");
    std::fs::write(&input, objects).expect("write manifest");
    let kubeconfig = dir.path().join("kubeconfig");
    let server = FakeServer::start(&c.node1.ns, &input, &kubeconfig);
    let config = dir.path().join("config.conf");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
             mode: nftables\nclientConnection:\n  kubeconfig: {}\n\
             clusterCIDR: {},{}\nhealthzBindAddress: 127.0.0.1:10256\n\
             metricsBindAddress: 127.0.0.1:10249\nnftables:\n  minSyncPeriod: 100ms\n",
            kubeconfig.display(),
            addr::CLUSTER_CIDR_V4,
            addr::CLUSTER_CIDR_V6
        ),
    )
    .expect("write config");

    // New connections every 25 ms while kpng starts and takes over, for as long as that
    // takes (kpng-probe prints each result as it goes; it is stopped once kpng took over).
    let probing = Probe::tcp(mig)
        .count(100_000)
        .interval(Duration::from_millis(25))
        .fresh_socket(true)
        .timeout(OK_T);
    let mut prober_args = vec![
        bin_path("kpng-probe")
            .expect("kpng-probe")
            .display()
            .to_string(),
    ];
    prober_args.extend(probing.args());
    let mut prober = client.spawn(&prober_args).expect("start kpng-probe");
    let next_result = |prober: &mut Spawned| {
        let line = prober
            .wait_for_line(|l| !l.trim().is_empty(), Duration::from_secs(10))
            .expect("a probe result");
        ProbeResult::from_json_line(&line).expect("a probe result")
    };
    // Probing runs (its first answer came back) before kpng starts.
    let mut results = vec![next_result(&mut prober)];
    // Its own admin socket: it is killed (SIGKILL) at the end, which would leave the default,
    // /run/kpng/kpng.sock, on the host.
    let admin = dir.path().join("admin.sock");
    let kpng = c
        .node1
        .ns
        .spawn([
            env!("CARGO_BIN_EXE_kpng"),
            "--config",
            config.to_str().expect("utf-8"),
            "--hostname-override=node1",
            "--oom-score-adj=-999",
            "--v=2",
            "--admin-socket",
            admin.to_str().expect("utf-8"),
        ])
        .expect("start kpng");
    let deadline = Instant::now() + Duration::from_secs(60);
    while tables(&c.node1.ns).contains("kube-proxy") {
        assert!(
            Instant::now() < deadline,
            "kube-proxy's tables still there; kpng said:\n{}",
            kpng.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let gone = Instant::now();
    // Every result so far, then a second's more: the prober still runs after kube-proxy's
    // rules went (what it has printed before is read at once, in well under a second).
    loop {
        results.push(next_result(&mut prober));
        if Instant::now() >= gone + Duration::from_secs(1) {
            break;
        }
    }
    prober.kill().expect("stop kpng-probe");
    let log = kpng.stderr_text();
    let m = tally(&results);
    assert_eq!(
        names(&m),
        all,
        "no new connection failed over the switch: {m:?}\n{log}"
    );
    assert!(results.iter().all(|r| r.outcome == Outcome::Ok), "{m:?}");

    // The established connection still works, now that kube-proxy's rules are gone.
    held.second("pod2a")
        .expect("second line over the connection established through kube-proxy");

    let listed = tables(&c.node1.ns);
    assert!(
        has_table(&listed, "table ip kpng") && has_table(&listed, "table ip6 kpng"),
        "{listed}"
    );
    assert!(!listed.contains("kube-proxy"), "{listed}");
    assert!(
        log.contains("running as kube-proxy, `kpng kube … to-local nft` (mode \"nftables\"")
            && log.contains("removed kube-proxy's nftables tables"),
        "{log}"
    );
    // kpng serves both Services on its own: every endpoint, also on the node port.
    assert_eq!(
        names(&e2e::harness::spread(client, Proto::Tcp, mig, 30)),
        all
    );
    assert_eq!(
        names(&e2e::harness::spread(client, Proto::Tcp, mig_np, 30)),
        all
    );

    kpng.kill().expect("stop kpng");
    drop(server);
}

/// `kpng --cleanup` removes kube-proxy's rules of every mode (and kpng's), in both iptables
/// variants, and leaves kubelet's chains alone; it prints only what it removed.
#[test]
fn cleanup_removes_every_proxys_rules_and_only_those() {
    require_root!();
    let ns = Netns::node("kpclean").expect("netns");
    ns.nft(&kube_proxy_ruleset())
        .expect("kube-proxy's nftables ruleset");
    let iptables_rules = "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-POSTROUTING - [0:0]\n\
         :KUBE-MARK-MASQ - [0:0]\n:KUBE-SVC-ABCDEFGH - [0:0]\n:KUBE-SEP-ABCDEFGH - [0:0]\n\
         :KUBE-XLB-ABCDEFGH - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\n\
         -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
         -A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 443 -j KUBE-SVC-ABCDEFGH\n\
         -A KUBE-SVC-ABCDEFGH -j KUBE-SEP-ABCDEFGH\n\
         -A KUBE-SEP-ABCDEFGH -p tcp -m tcp -j DNAT --to-destination 10.244.1.2:6443\n\
         COMMIT\n*filter\n:KUBE-FIREWALL - [0:0]\n:KUBE-FORWARD - [0:0]\n\
         :KUBE-PROXY-FIREWALL - [0:0]\n-A INPUT -j KUBE-FIREWALL\n-A FORWARD -j KUBE-FORWARD\n\
         -A INPUT -m conntrack --ctstate NEW -j KUBE-PROXY-FIREWALL\nCOMMIT\n";
    for restore in ["iptables-legacy-restore", "iptables-nft-restore"] {
        ns.run_with_stdin([restore, "--noflush"], iptables_rules)
            .unwrap_or_else(|e| panic!("{restore}: {e}"));
    }
    // A dry run says what it would remove and removes nothing.
    let out = kpng_ok(&ns, &["--cleanup", "--dry-run"]);
    for would in [
        "kpng: would remove kube-proxy's iptables chains in iptables-legacy",
        "kpng: would remove kube-proxy's iptables chains in iptables-nft",
        "kpng: would remove kube-proxy's nftables tables (nftables mode)",
    ] {
        assert!(out.contains(would), "{would:?} in:\n{out}");
    }
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(
        tables(&ns).contains("kube-proxy"),
        "a dry run removes nothing"
    );
    let out = kpng_ok(&ns, &["--cleanup"]);
    for removed in [
        "kpng: removed kube-proxy's iptables chains in iptables-legacy",
        "kpng: removed kube-proxy's iptables chains in iptables-nft",
        "kpng: removed kube-proxy's nftables tables (nftables mode)",
    ] {
        assert!(out.contains(removed), "{removed:?} in:\n{out}");
    }
    assert_eq!(out.lines().count(), 3, "only what was removed:\n{out}");
    assert!(!tables(&ns).contains("kube-proxy"));
    for save in ["iptables-legacy-save", "iptables-nft-save"] {
        let saved = ns.run_ok([save]).expect("save");
        let chains: Vec<&str> = saved
            .lines()
            .filter(|l| l.starts_with(":KUBE-") || l.contains("-j KUBE-"))
            .collect();
        assert_eq!(
            chains.iter().filter(|l| l.starts_with(':')).count(),
            2,
            "{save}: kubelet's two chains stay, nothing else:\n{saved}"
        );
        assert!(
            saved.contains(":KUBE-FIREWALL") && saved.contains("-A INPUT -j KUBE-FIREWALL"),
            "{save}:\n{saved}"
        );
        assert!(saved.contains(":KUBE-KUBELET-CANARY"), "{save}:\n{saved}");
    }
    let again = kpng_ok(&ns, &["--cleanup"]);
    assert_eq!(again.trim(), "kpng: nothing to remove");
}

/// Going back to a kube-proxy that runs again: `kpng cleanup --kpng-only` removes kpng's own
/// tables and leaves that kube-proxy's rules (its nftables table, the iptables chains it shares
/// by name with kpng's iptables backend) in place.
#[test]
fn cleanup_kpng_only_leaves_kube_proxys_rules() {
    require_root!();
    let ns = Netns::node("kpcleanown").expect("netns");
    ns.nft(&kube_proxy_ruleset())
        .expect("kube-proxy's nftables ruleset");
    ns.nft("add table ip kpng\nadd table ip6 kpng\n")
        .expect("kpng's tables");
    ns.run_with_stdin(
        ["iptables-nft-restore", "--noflush"],
        "*nat\n:KUBE-SERVICES - [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n",
    )
    .expect("kube-proxy's iptables chains");
    let dry = kpng_ok(&ns, &["--dry-run", "cleanup", "--kpng-only"]);
    assert_eq!(
        dry.trim(),
        "kpng: would remove kpng's nftables tables (`to-local nft`)"
    );
    // Written after the subcommand, as most people would, it says the same.
    let after = kpng_ok(&ns, &["cleanup", "--kpng-only", "--dry-run"]);
    assert_eq!(after, dry);
    // And beside kube-proxy's --cleanup, which an operator used to kube-proxy types.
    let beside = kpng_ok(&ns, &["--cleanup", "--dry-run", "--kpng-only"]);
    assert_eq!(beside, dry);
    let out = kpng_ok(&ns, &["cleanup", "--kpng-only"]);
    assert_eq!(
        out.trim(),
        "kpng: removed kpng's nftables tables (`to-local nft`)"
    );
    let left = tables(&ns);
    assert!(
        !has_table(&left, "table ip kpng") && !has_table(&left, "table ip6 kpng"),
        "{left}"
    );
    assert!(
        left.contains("table ip kube-proxy"),
        "kube-proxy's table stays: {left}"
    );
    let saved = ns.run_ok(["iptables-nft-save", "-t", "nat"]).expect("save");
    assert!(
        saved.contains(":KUBE-SERVICES"),
        "kube-proxy's chains stay: {saved}"
    );
}

/// kube-proxy's health and metrics in `ns` on 127.0.0.1:`port`: `/healthz` answers 503 and
/// `/metrics` a last-sync timestamp of 0 until the file `healthy` exists, then 200 and a
/// timestamp (kube-proxy before and after its first sync).
fn start_health_server(ns: &Netns, port: u16, healthy: &std::path::Path) -> Spawned {
    const SERVER: &str = "\
import http.server, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        up = os.path.exists(sys.argv[2])
        if self.path == '/metrics':
            code, body = 200, 'kubeproxy_sync_proxy_rules_last_timestamp_seconds %s\\n' % ('1.7966e+09' if up else '0')
        else:
            code, body = (200 if up else 503), '{}'
        self.send_response(code)
        self.end_headers()
        self.wfile.write(body.encode())
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H)
print('listening', flush=True)
s.serve_forever()
";
    let port = port.to_string();
    let healthy = healthy.to_str().expect("a UTF-8 path");
    let mut server = ns
        .spawn(["python3", "-c", SERVER, &port, healthy])
        .expect("health server");
    server
        .wait_for_line(|l| l == "listening", Duration::from_secs(10))
        .expect("health server listening");
    server
}

/// Going back to kube-proxy: `kpng cleanup --kpng-only --after-healthy ADDR` keeps kpng's
/// tables while kube-proxy's `/healthz` answers 503 (removing them then would leave no Service
/// rules at all) and removes them once it answers 200 (until then they win over kube-proxy's).
#[test]
fn cleanup_after_healthy_waits_for_the_returning_proxy() {
    cleanup_waits_then_removes("kpcleanhz", "--after-healthy", "answered HTTP 503; waiting");
}

/// `--after-synced ADDR`: the same, waiting for kube-proxy's metrics to show a first sync
/// (its `/healthz` answers 200 before it).
#[test]
fn cleanup_after_synced_waits_for_the_first_sync() {
    cleanup_waits_then_removes("kpcleansy", "--after-synced", "(no sync yet); waiting");
}

/// `kpng cleanup --kpng-only FLAG 127.0.0.1:10256` in a fresh node namespace holding kpng's
/// tables: it says `waiting` (a line containing it), the tables stay, and once the
/// proxy is up they are removed and cleanup ends 0.
fn cleanup_waits_then_removes(prefix: &str, flag: &str, waiting: &str) {
    require_root!();
    let ns = Netns::node(prefix).expect("netns");
    ns.ip(["link", "set", "lo", "up"]).expect("lo up");
    let dir = tempfile::tempdir().expect("tempdir");
    let healthy = dir.path().join("healthy");
    let _server = start_health_server(&ns, 10256, &healthy);
    ns.nft("add table ip kpng\nadd table ip6 kpng\n")
        .expect("kpng's tables");
    let mut cleanup = ns
        .spawn([
            env!("CARGO_BIN_EXE_kpng"),
            "cleanup",
            "--kpng-only",
            flag,
            "127.0.0.1:10256",
            "--timeout",
            "2m",
        ])
        .expect("kpng cleanup");
    cleanup
        .wait_for_line(|l| l.contains(waiting), Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e}: {}", cleanup.stderr_text()));
    // Asked again at least once more meanwhile: the tables are still there.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(cleanup.try_wait().expect("try_wait"), None, "still waiting");
    let left = tables(&ns);
    assert!(
        has_table(&left, "table ip kpng") && has_table(&left, "table ip6 kpng"),
        "kpng's tables stay while the proxy is not ready: {left}"
    );
    std::fs::write(&healthy, "").expect("healthy");
    cleanup
        .wait_for_line(
            |l| l == "kpng: removed kpng's nftables tables (`to-local nft`)",
            Duration::from_secs(20),
        )
        .unwrap_or_else(|e| panic!("{e}: {}", cleanup.stderr_text()));
    let status = cleanup
        .wait_exit(Duration::from_secs(20))
        .expect("cleanup ended");
    assert!(status.success(), "{status:?}: {}", cleanup.stderr_text());
    let left = tables(&ns);
    assert!(
        !has_table(&left, "table ip kpng") && !has_table(&left, "table ip6 kpng"),
        "{left}"
    );
}

/// `--after-healthy` gives up after `--timeout`: exit status 1, a message naming the address
/// and the last answer, and nothing removed.
#[test]
fn cleanup_after_healthy_times_out_and_removes_nothing() {
    require_root!();
    let ns = Netns::node("kpcleanto").expect("netns");
    ns.ip(["link", "set", "lo", "up"]).expect("lo up");
    let dir = tempfile::tempdir().expect("tempdir");
    let _server = start_health_server(&ns, 10256, &dir.path().join("never"));
    ns.nft("add table ip kpng\n").expect("kpng's table");
    let out = kpng_run(
        &ns,
        &[
            "cleanup",
            "--kpng-only",
            "--after-healthy",
            "127.0.0.1:10256",
            "--timeout",
            "2s",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    assert!(
        stderr.contains("http://127.0.0.1:10256/healthz did not answer 200 within 2s")
            && stderr.contains("last: answered HTTP 503")
            && stderr.contains("removed nothing"),
        "{}",
        describe_output(&out)
    );
    assert!(has_table(&tables(&ns), "table ip kpng"), "the table stays");
    // Nobody listening at all is "not yet" too.
    let out = kpng_run(
        &ns,
        &[
            "cleanup",
            "--kpng-only",
            "--after-healthy",
            "127.0.0.1:10257",
            "--timeout",
            "1s",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", describe_output(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("last: could not be reached"),
        "{}",
        describe_output(&out)
    );
    assert!(has_table(&tables(&ns), "table ip kpng"), "the table stays");
}

/// `kpng cleanup` while a kpng still programs the namespace would report success and change
/// nothing (the running kpng repairs it within 100 ms): it refuses, naming that kpng, and
/// removes everything once it has stopped.
#[test]
fn cleanup_refuses_while_a_kpng_programs_the_namespace() {
    require_root!();
    let ns = Netns::node("kpcleanrun").expect("netns");
    let dir = tempfile::tempdir().expect("tempdir");
    let admin = dir.path().join("admin.sock");
    let input = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/cluster.yaml");
    let kpng = ns
        .spawn([
            env!("CARGO_BIN_EXE_kpng"),
            "file",
            "--input",
            input,
            "--node-name",
            "node1",
            "to-local",
            "nft",
            "--admin-socket",
            admin.to_str().expect("utf-8"),
        ])
        .expect("kpng");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !has_table(&tables(&ns), "table ip kpng") {
        assert!(
            Instant::now() < deadline,
            "kpng programmed nothing: {}",
            kpng.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let refused = kpng_run(&ns, &["cleanup"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{}", describe_output(&refused));
    assert!(
        stderr.contains(&format!(
            "another kpng (pid {}) runs `to-local nft` in this network namespace: it would put \
             back at once what cleanup removes",
            kpng.id()
        )),
        "{}",
        describe_output(&refused)
    );
    assert!(has_table(&tables(&ns), "table ip kpng"), "nothing removed");
    // The dry run lists what it would remove, and ends as the real run would: refused.
    let dry_run = kpng_run(&ns, &["--cleanup", "--dry-run"]);
    assert_eq!(
        dry_run.status.code(),
        refused.status.code(),
        "{}",
        describe_output(&dry_run)
    );
    let dry = String::from_utf8_lossy(&dry_run.stdout).into_owned();
    assert!(dry.contains("cleanup would refuse until it stops"), "{dry}");
    assert!(
        dry.contains("kpng: would remove kpng's nftables tables"),
        "{dry}"
    );

    kpng.terminate(Duration::from_secs(5)).expect("stop kpng");
    let out = kpng_ok(&ns, &["cleanup"]);
    assert!(
        out.contains("kpng: removed kpng's nftables tables"),
        "{out}"
    );
    assert!(!tables(&ns).contains("kpng"), "{}", tables(&ns));
}

/// `kpng --init-only` does the privileged set-up (the conntrack sysctls, the backend's node
/// checks) and exits, as kube-proxy's: run in a namespace, whose conntrack timeouts are its own.
#[test]
fn init_only_sets_the_sysctls_and_exits() {
    require_root!();
    let ns = Netns::node("kpinit").expect("netns");
    // Conntrack's per-namespace sysctls exist once the module is loaded.
    ns.nft("add table ip t\nadd chain ip t c\nadd rule ip t c ct state new accept\n")
        .expect("load conntrack");
    let key = "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established";
    // A dry run checks and prints, and writes nothing.
    let before = ns.run_ok(["cat", key]).expect("read sysctl");
    assert_ne!(before.trim(), "7200");
    let out = kpng_run(
        &ns,
        &[
            "--init-only",
            "--dry-run",
            "--proxy-mode=nftables",
            "--conntrack-tcp-timeout-established=2h",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", describe_output(&out));
    assert!(
        stdout.contains(&format!("# would write 7200 to {key}")),
        "{}",
        describe_output(&out)
    );
    assert_eq!(ns.run_ok(["cat", key]).expect("read sysctl"), before);
    let out = kpng_run(
        &ns,
        &[
            "--init-only",
            "--proxy-mode=nftables",
            "--conntrack-tcp-timeout-established=2h",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}", describe_output(&out));
    assert!(
        stderr.contains("--init-only: done"),
        "{}",
        describe_output(&out)
    );
    let value = ns.run_ok(["cat", key]).expect("read sysctl");
    assert_eq!(value.trim(), "7200", "{}", describe_output(&out));
    assert!(
        !tables(&ns).contains("kpng"),
        "--init-only programs no rules"
    );
}

/// SIGTERM must end kpng within its grace period even while the sweep of other proxies'
/// leftovers is still running (it can run `iptables-save` over a large kube-proxy ruleset, or
/// here an `ipset` that hangs): the sweep is best effort and the next start redoes it. Before,
/// the runtime waited for the sweep's blocking task, and a 30k-Service node took 20 s or more
/// to exit after SIGTERM.
#[test]
fn sigterm_does_not_wait_for_the_leftover_sweep() {
    require_root!();
    let ns = Netns::node("kpsweep").expect("netns");
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).expect("mkdir");
    let ipset = bin.join("ipset");
    let started = dir.path().join("ipset.pid");
    std::fs::write(
        &ipset,
        format!(
            "#!/bin/sh\necho $$ > {}\nexec sleep 120\n",
            started.display()
        ),
    )
    .expect("write");
    let chmod = std::process::Command::new("chmod")
        .args(["+x", &ipset.display().to_string()])
        .status()
        .expect("chmod");
    assert!(chmod.success());
    let input = dir.path().join("cluster.yaml");
    std::fs::write(
        &input,
        manifest(&[svc("slow", 120, "ClusterIP", "", &[("pod1a", Cond::Ready)])]),
    )
    .expect("write");
    let path = format!(
        "PATH={}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let kpng = env!("CARGO_BIN_EXE_kpng");
    let admin = dir.path().join("admin.sock").display().to_string();
    let input = input.display().to_string();
    let proc = ns
        .spawn([
            "env",
            &path,
            kpng,
            "file",
            "--input",
            &input,
            "--node-name",
            "node1",
            "--healthz-bind-address",
            "127.0.0.1:10256",
            "--metrics-bind-address",
            "",
            "--admin-socket",
            &admin,
            "to-local",
            "nft",
        ])
        .expect("start kpng");
    // The sweep starts after the first sync and reaches the hanging `ipset`.
    let deadline = Instant::now() + Duration::from_secs(20);
    let hanging = loop {
        if let Some(pid) = std::fs::read_to_string(&started)
            .ok()
            .filter(|p| !p.trim().is_empty())
        {
            break pid.trim().to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "the sweep never ran `ipset`:\n{}",
            proc.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let asked = Instant::now();
    let status = proc
        .terminate(Duration::from_secs(10))
        .expect("SIGTERM")
        .expect("kpng exits within 10 s of SIGTERM");
    let took = asked.elapsed();
    println!("exit {status} {took:?} after SIGTERM, the sweep still running");
    let _ = std::process::Command::new("kill").arg(&hanging).status();
    assert!(status.success(), "{status}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

/// In a hardened Pod (capabilities instead of `privileged`), cleanup without CAP_NET_ADMIN
/// could not list the tables, took them for absent and reported success; without CAP_NET_RAW
/// it could not read legacy iptables tables, and said "nothing to remove" beside kube-proxy's
/// legacy chains. Both now refuse, naming the capability, and remove nothing.
#[test]
fn cleanup_without_the_capabilities_it_needs_refuses_and_says_which() {
    require_root!();
    let ns = Netns::node("kpcleancap").expect("netns");
    ns.nft("add table ip kpng\n").expect("a kpng table");
    ns.run_ok(["iptables-legacy", "-t", "nat", "-N", "KUBE-SERVICES"])
        .expect("a legacy chain");
    // `setpriv` drops the capability from the bounding set: root's exec then lacks it.
    let cleanup_without = |cap: &str| {
        ns.exec([
            "setpriv",
            &format!("--bounding-set=-{cap}"),
            "--",
            env!("CARGO_BIN_EXE_kpng"),
            "cleanup",
        ])
        .expect("kpng cleanup")
    };
    for (cap, named) in [("net_admin", "CAP_NET_ADMIN"), ("net_raw", "CAP_NET_RAW")] {
        let out = cleanup_without(cap);
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let all = describe_output(&out);
        assert!(!out.status.success(), "without {cap}: {all}");
        assert!(said.contains(named), "without {cap}: {all}");
        assert!(
            has_table(&tables(&ns), "table ip kpng"),
            "without {cap}: {all}"
        );
    }
    let saved = ns
        .run_ok(["iptables-legacy-save", "-t", "nat"])
        .expect("iptables-legacy-save");
    assert!(saved.contains(":KUBE-SERVICES"), "{saved}");
    // `to-local` says so at start too, instead of retrying transactions that fail.
    let input = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/cluster.yaml");
    let out = ns
        .exec([
            "timeout",
            "20",
            "setpriv",
            "--bounding-set=-net_admin",
            "--",
            env!("CARGO_BIN_EXE_kpng"),
            "file",
            "--input",
            input,
            "--node-name",
            "node1",
            "--metrics-bind-address=",
            "--healthz-bind-address=127.0.0.1:0",
            "--admin-socket=",
            "to-local",
            "nft",
        ])
        .expect("kpng");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("`to-local nft` needs CAP_NET_ADMIN"),
        "{}",
        describe_output(&out)
    );
    // With both, it removes both.
    kpng_ok(&ns, &["cleanup"]);
    assert!(!has_table(&tables(&ns), "table ip kpng"));
}

/// kpng's iptables backend sets `route_localnet` (node ports on 127.0.0.1) and records the
/// value it found; `kpng cleanup` said it put it back and did not (the record stayed, the
/// setting stayed 1).
#[test]
fn cleanup_puts_route_localnet_back_as_it_was() {
    require_root!();
    let ns = Netns::node("kpcleanrl").expect("netns");
    let sysctl = "net.ipv4.conf.all.route_localnet";
    let value = || {
        ns.run_ok(["sysctl", "-n", sysctl])
            .expect("sysctl")
            .trim()
            .to_string()
    };
    ns.run_ok(["sysctl", "-w", &format!("{sysctl}=0")])
        .expect("route_localnet=0");
    let input = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/cluster.yaml");
    let kpng = ns
        .spawn([
            env!("CARGO_BIN_EXE_kpng"),
            "file",
            "--input",
            input,
            "--node-name",
            "node1",
            "--metrics-bind-address=",
            "--healthz-bind-address=127.0.0.1:0",
            "--admin-socket=",
            "to-local",
            "iptables",
            "--iptables-mode",
            "nft",
        ])
        .expect("kpng");
    let deadline = Instant::now() + Duration::from_secs(20);
    while value() != "1" {
        assert!(
            Instant::now() < deadline,
            "kpng did not set route_localnet: {}",
            kpng.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(kpng);
    let said = kpng_ok(&ns, &["cleanup"]);
    assert!(
        said.contains("put net.ipv4.conf.all.route_localnet back to 0"),
        "{said}"
    );
    assert_eq!(value(), "0");
}

/// `to-local iptables --iptables-mode legacy` without CAP_NET_RAW (a Pod given NET_ADMIN
/// only) said "iptables-legacy-save does not work here" and "works for neither IPv4 nor
/// IPv6", naming no capability and dropping the tool's own "Permission denied (you must be
/// root)". It now names CAP_NET_RAW, as `to-local nft` names CAP_NET_ADMIN, and keeps the
/// tool's words.
#[test]
fn iptables_legacy_without_net_raw_names_the_capability_and_the_tools_words() {
    require_root!();
    let ns = Netns::node("kplegraw").expect("netns");
    let input = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/cluster.yaml");
    let out = ns
        .exec([
            "timeout",
            "20",
            "setpriv",
            "--bounding-set=-all,+net_admin",
            "--inh-caps=-all",
            "--",
            env!("CARGO_BIN_EXE_kpng"),
            "file",
            "--input",
            input,
            "--node-name",
            "node1",
            "--metrics-bind-address=",
            "--healthz-bind-address=127.0.0.1:0",
            "--admin-socket=",
            "to-local",
            "iptables",
            "--iptables-mode",
            "legacy",
        ])
        .expect("kpng");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && said.contains("`to-local iptables` with iptables-legacy needs CAP_NET_RAW")
            && said.contains("Permission denied (you must be root)"),
        "{}",
        describe_output(&out)
    );
}
