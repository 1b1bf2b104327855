//! Real-packet end-to-end tests of `kpng … to-local ebpf`: the shared suite in `e2e/` (node1
//! and its pods are in the programs' cgroup, every other namespace outside it), plus what only
//! socket-level load balancing does.

mod e2e;

e2e::suite!(e2e::Backend::Ebpf);

use std::time::Duration;

use e2e::Backend;
use e2e::harness::*;
use e2e::scenarios::HeldConnection;
use e2e::sockets::*;
use kpng_testkit::{Cluster, Outcome, Proto, Spawned, require_root};

const B: Backend = Backend::Ebpf;

/// The programs attached to the node's cgroup (`bpftool cgroup show`), by name.
fn attached(c: &Cluster) -> Vec<String> {
    let (cgroup, _) = ebpf_scope(&c.node1.ns);
    let out = std::process::Command::new("bpftool")
        .args(["cgroup", "show"])
        .arg(&cgroup)
        .output()
        .expect("bpftool");
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().last().map(String::from))
        .collect();
    names.sort();
    names
}

#[test]
fn external_ip_on_a_node_address_wins_over_a_node_port() {
    e2e::scenarios::external_ip_on_a_node_address_wins_over_a_node_port(B);
}

#[test]
fn one_instance_per_namespace() {
    e2e::faults::one_instance_per_namespace(e2e::Backend::Ebpf);
}

/// An external client's connection held through a node port survives `nft flush ruleset`:
/// outside clients are served by the nftables half, whose anchor table keeps the NAT hooks
/// until the repair (docs/reliability.md).
#[test]
fn fault_ruleset_flushed_keeps_a_node_port_connection() {
    e2e::faults::nft_ruleset_flushed_node_port(e2e::Backend::Ebpf);
}

#[test]
fn a_pod_connection_to_a_cluster_ip_has_no_conntrack_nat_entry() {
    require_root!();
    let c = Cluster::create(&B.prefix("nonat")).expect("cluster");
    let _line_server = start_line_server(&c, "pod2a");
    let _k = Kpng::start(
        B,
        &c.node1.ns,
        &manifest(&[svc("web", 10, "ClusterIP", "", &[("pod2a", Cond::Ready)])]),
        &[],
    );
    // A connection from pod1a held open: it crosses node1 (forwarded, conntracked).
    let mut held = HeldConnection::open(&c.pod("pod1a").ns, cip(10, false), "pod2a");
    let conntrack = |args: &[&str]| -> String {
        let mut all = vec!["conntrack", "-L", "-p", "tcp"];
        all.extend(args);
        c.node1
            .ns
            .exec(all)
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    let to_endpoint = conntrack(&["--orig-dst", "10.244.2.2", "--dport", "8080"]);
    assert!(
        to_endpoint.contains("ESTABLISHED"),
        "node1 tracks the connection to the endpoint itself: {to_endpoint:?}"
    );
    // Not NATed: the reply comes from where the original went, and nothing was addressed to
    // the ClusterIP.
    assert!(
        to_endpoint.contains("src=10.244.2.2 dst=10.244.1.2 sport=8080"),
        "no translation in the entry: {to_endpoint:?}"
    );
    let to_service = conntrack(&["--orig-dst", &cip(10, false).to_string()]);
    assert!(
        !to_service.contains("dport=80 "),
        "no entry addressed to the ClusterIP: {to_service:?}"
    );
    held.second("pod2a").expect("the connection works");
    // The application still sees the Service as its peer (the programs translate getpeername
    // back).
    let out = python(
        &c,
        "pod1a",
        "import socket, sys\n\
         s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)\n\
         print('%s %d' % s.getpeername()[:2])",
        &[cip(10, false).to_string(), SVC_PORT.to_string()],
    );
    assert_eq!(
        out.trim(),
        format!("{} {SVC_PORT}", cip(10, false)),
        "getpeername shows the ClusterIP"
    );
}

/// A service mesh's sidecar in pod1a: accepts what the pod's own REDIRECT rule sends to port
/// argv[1] and answers each line with `sidecar-IP:PORT LINE`, the connection's original
/// destination (`SO_ORIGINAL_DST`), as Envoy reads it to route by Service.
const SIDECAR: &str = r#"
import socket, struct, sys, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(16)
print("ready", flush=True)
def serve(c):
    port, ip = struct.unpack_from("!2xH4s", c.getsockopt(socket.SOL_IP, 80, 16))
    who = ("sidecar-%s:%d" % (socket.inet_ntoa(ip), port)).encode()
    for line in c.makefile("rb"):
        c.sendall(who + b" " + line)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// Connects to argv[1]:argv[2], sends one line and prints the answer.
const ONE_LINE: &str = "import socket, sys\n\
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)\n\
    c.sendall(b'one\\n'); print(c.makefile('rb').readline().decode().strip())";

/// `--socket-lb-host-netns-only` (Cilium's bpf-lb-sock-hostns-only) for service meshes: a
/// pod's connection to a ClusterIP keeps the ClusterIP as its destination, so the sidecar's
/// REDIRECT in the pod catches it and reads the Service as its original destination, and the
/// node's rules DNAT it when it leaves the pod (a conntrack NAT entry on node1); the node's
/// own sockets are still translated at connect() (no NAT entry). Without the option the
/// programs translate the pod's connect() to the endpoint: the sidecar's rule, written for the
/// ClusterIP, never matches, and the connection reaches the endpoint in plaintext past it.
#[test]
fn host_netns_only_leaves_pods_to_the_rules_so_a_sidecar_sees_the_service() {
    require_root!();
    let c = Cluster::create(&B.prefix("mesh")).expect("cluster");
    let _line_server = start_line_server(&c, "pod2a");
    let manifest = manifest(&[svc("web", 10, "ClusterIP", "", &[("pod2a", Cond::Ready)])]);
    let ip = cip(10, false);
    let pod = &c.pod("pod1a").ns;
    pod.nft(&format!(
        "table ip mesh {{\n chain out {{\n type nat hook output priority -100;\n \
         ip daddr {ip} tcp dport {SVC_PORT} redirect to :15001\n }}\n}}\n"
    ))
    .expect("the sidecar's REDIRECT rule");
    let mut sidecar = pod
        .spawn(["python3", "-c", SIDECAR, "15001"])
        .expect("python3 sidecar");
    sidecar
        .wait_for_line(|l| l == "ready", Duration::from_secs(10))
        .expect("sidecar ready");
    let through = |what: &str| -> String {
        let out = python(
            &c,
            "pod1a",
            ONE_LINE,
            &[ip.to_string(), SVC_PORT.to_string()],
        );
        eprintln!("{what}: {out}");
        out.trim().to_owned()
    };

    // Without the option: translated at connect(), past the sidecar.
    let mut k = Kpng::start(B, &c.node1.ns, &manifest, &[]);
    assert_eq!(
        through("every socket translated"),
        "pod2a one",
        "without the option the pod's connect() goes to the endpoint, past the sidecar"
    );
    k.terminate();

    // With it (the restarted kpng's programs replace the previous ones): the sidecar sees
    // the Service.
    let k = Kpng::start_with(
        B,
        &c.node1.ns,
        &manifest,
        None,
        &[],
        &["--socket-lb-host-netns-only"],
    );
    assert_eq!(
        through("host netns only"),
        format!("sidecar-{ip}:{SVC_PORT} one"),
        "the sidecar's REDIRECT caught the pod's connection, original destination the Service"
    );
    // Without the sidecar the node's rules serve the pod's ClusterIP traffic (DNAT), and the
    // node's own socket is still translated at connect().
    pod.nft("delete table ip mesh\n")
        .expect("remove the REDIRECT");
    let mut from_pod = HeldConnection::open(pod, ip, "pod2a");
    let mut from_node = HeldConnection::open(&c.node1.ns, ip, "pod2a");
    let conntrack = |args: &[&str]| -> String {
        let mut all = vec!["conntrack", "-L", "-p", "tcp"];
        all.extend(args);
        c.node1
            .ns
            .exec(all)
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    let (pod_v4, _, _) = pod_ips("pod1a");
    let to_service: Vec<String> = conntrack(&["--orig-dst", &ip.to_string()])
        .lines()
        .filter(|l| l.contains("ESTABLISHED"))
        .map(String::from)
        .collect();
    assert!(
        to_service.len() == 1
            && to_service[0].contains(&format!("src={pod_v4} dst={ip} "))
            && to_service[0].contains("src=10.244.2.2 "),
        "one NAT entry, the pod's, DNATed by the rules: {to_service:?}"
    );
    let direct: Vec<String> = conntrack(&["--orig-dst", "10.244.2.2", "--dport", "8080"])
        .lines()
        .filter(|l| l.contains("ESTABLISHED") && !l.contains(&format!("src={pod_v4} ")))
        .map(String::from)
        .collect();
    assert_eq!(
        direct.len(),
        1,
        "the node's connection went to the endpoint itself (translated at connect()): {direct:?}"
    );
    from_pod
        .second("pod2a")
        .expect("the pod's connection works");
    from_node
        .second("pod2a")
        .expect("the node's connection works");
    // kpng status and kpng trace say so. kpng runs in node1's namespace, not the host's: the
    // option means node1's namespace, which the start's warning and the
    // status name (until 2026-12-07 they said "the node's network namespace" in any case).
    let status = k.status_json();
    assert!(
        status["dataPlane"]
            .as_array()
            .is_some_and(|lines| lines.iter().any(|l| l["state"]
                .as_str()
                .is_some_and(|s| s.contains("--socket-lb-host-netns-only")
                    && s.contains("kpng's own network namespace only, which is not the host's"))
                && l["problem"]
                    .as_str()
                    .is_some_and(|p| p.contains("not the host's (net:[")))),
        "{status}"
    );
    assert!(
        k.stderr().contains("WARN")
            && k.stderr()
                .contains("--socket-lb-host-netns-only translates the sockets of kpng's own"),
        "{}",
        k.stderr()
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kpng"))
        .args(["status", "--admin-socket"])
        .arg(k.admin_socket())
        .output()
        .expect("kpng status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("PROBLEM: kpng runs in network namespace net:["),
        "{text}"
    );
    let trace = |from: &str| -> serde_json::Value {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kpng"))
            .args([
                "trace",
                "--from",
                from,
                "--to",
                &format!("{ip}:{SVC_PORT}"),
                "-o",
                "json",
            ])
            .arg("--admin-socket")
            .arg(k.admin_socket())
            .output()
            .expect("kpng trace");
        serde_json::from_slice(&out.stdout).expect("trace JSON")
    };
    let t = trace(&pod_v4.to_string());
    assert!(
        t["translatedAtSocket"] != true
            && t["atSocketIfInCgroup"].is_null()
            && t["reason"]
                .as_str()
                .is_some_and(|r| r.contains("--socket-lb-host-netns-only")),
        "a pod's source: the rules: {t}"
    );
    // The node's own address: kpng's namespace is node1's, not the host's, so the trace says
    // both outcomes, as the status's PROBLEM (until 2026-12-07: "at the socket").
    let t = trace(&c.node1.lan_ipv4.to_string());
    assert!(
        t["translatedAtSocket"] != true
            && t["atSocketIfInNetns"]
                .as_str()
                .is_some_and(|n| n.starts_with("net:["))
            && t["reason"].as_str().is_some_and(|r| {
                r.contains("in kpng's own network namespace net:[")
                    && r.contains("otherwise through the rules")
            }),
        "the node's source: both outcomes: {t}"
    );
}

/// Sends a datagram every 50 ms and prints `got NAME` or `miss`, through an unconnected socket
/// (`sendto`, argv[3] == "sendto") or a connected one that is re-made when the kernel aborts
/// it (`ECONNABORTED`: its endpoint left); prints `mark` once file argv[4] exists, stops when
/// file argv[5] exists. An IPv6 address (`::ffff:10.96.0.10`) makes an AF_INET6 socket (a
/// dual-stack one, as Java's DatagramChannel opens).
const UDP_CLIENT: &str = r#"
import os, socket, sys, errno, time
dst = (sys.argv[1], int(sys.argv[2])); connected = sys.argv[3] != "sendto"
family = socket.AF_INET6 if ":" in dst[0] else socket.AF_INET
def make():
    s = socket.socket(family, socket.SOCK_DGRAM); s.settimeout(0.2)
    if connected: s.connect(dst)
    return s
s = make(); marked = False
while not os.path.exists(sys.argv[5]):
    if not marked and os.path.exists(sys.argv[4]):
        marked = True; print("mark", flush=True)
    try:
        if connected: s.send(b"x"); d = s.recv(200)
        else: s.sendto(b"x", dst); d, a = s.recvfrom(200); assert a[:2] == dst, a
        print("got", d.decode().split()[0], flush=True)
    except OSError as e:
        if e.errno in (errno.ECONNABORTED, errno.EDESTADDRREQ):
            print("aborted", flush=True); s = make()
        else:
            print("miss", flush=True)
    time.sleep(0.05)
"#;

#[test]
fn udp_clients_keep_working_across_an_endpoint_change() {
    require_root!();
    let c = Cluster::create(&B.prefix("udpchg")).expect("cluster");
    let _echo = echo_in(&c, &["pod1b", "pod2a"]);
    // `other` keeps pod1b: sockets translated for it are not the change's.
    let other = svc("other", 11, "ClusterIP", "", &[("pod1b", Cond::Ready)]);
    let mut k = Kpng::start(
        B,
        &c.node1.ns,
        &manifest(&[
            svc("dns", 10, "ClusterIP", "", &[("pod1b", Cond::Ready)]),
            other.clone(),
        ]),
        &[],
    );
    let signals = Signals::new();
    let pod1b = c.pod("pod1b").addr_v4(EP_PORT);
    let mapped = v4_mapped(cip(10, false));
    // (what, destination, how): the three through the changed Service (one of them a
    // dual-stack AF_INET6 socket connected to the IPv4-mapped ClusterIP, which `ss` shows as
    // `[::ffff:…]`), then two connected to pod1b that must be left alone: directly, and
    // through `other`.
    let cases = [
        ("sendto", (cip(10, false), SVC_PORT), "sendto"),
        ("connect", (cip(10, false), SVC_PORT), "connect"),
        ("mapped", (mapped, SVC_PORT), "connect"),
        ("direct", (pod1b.ip(), pod1b.port()), "connect"),
        ("other", (cip(11, false), SVC_PORT), "connect"),
    ];
    let mut clients: Vec<Spawned> = cases
        .iter()
        .map(|(_, (ip, port), how)| {
            let mut client = spawn_python(
                &c,
                "pod1a",
                UDP_CLIENT,
                &[
                    ip.to_string(),
                    port.to_string(),
                    (*how).to_owned(),
                    signals.path("mark"),
                    signals.path("stop"),
                ],
            );
            client
                .wait_for_line(|l| l == "got pod1b", Duration::from_secs(5))
                .expect("an answer from pod1b before the change");
            client
        })
        .collect();

    // pod1b leaves dns, pod2a comes.
    k.apply(&manifest(&[
        svc("dns", 10, "ClusterIP", "", &[("pod2a", Cond::Ready)]),
        other,
    ]));
    signals.raise("mark");
    for ((what, _, _), client) in cases.iter().zip(clients.iter_mut()) {
        let seen = client
            .wait_for_line(|l| l == "mark" || l == "aborted", Duration::from_secs(5))
            .expect("the client saw the mark");
        if matches!(*what, "direct" | "other") {
            // Ten answers from pod1b, and no abort before or among them.
            assert_eq!(seen, "mark", "{what}: its socket was destroyed");
            let answers = std::cell::Cell::new(0);
            let last = client
                .wait_for_line(
                    |l| {
                        answers.set(answers.get() + usize::from(l == "got pod1b"));
                        l == "aborted" || answers.get() == 10
                    },
                    Duration::from_secs(5),
                )
                .unwrap_or_else(|e| panic!("{what}: answers from pod1b after the change: {e}"));
            assert_eq!(last, "got pod1b", "{what}: its socket was destroyed");
        } else {
            client
                .wait_for_line(|l| l == "got pod2a", Duration::from_secs(5))
                .unwrap_or_else(|e| {
                    panic!(
                        "{what}: answers from pod2a after the change: {e}\nkpng:\n{}",
                        k.stderr()
                    )
                });
        }
    }
    // The destroys are logged naming the Service, its frontend and the endpoint that left:
    // what an operator whose application says EDESTADDRREQ can find.
    let frontend = format!("{}:{SVC_PORT}/UDP: 2 to {pod1b}", cip(10, false));
    k.wait_logged("the destroyed sockets' Service", |log| {
        log.lines().any(|l| {
            l.contains("destroyed 2 UDP sockets")
                && l.contains(&format!("default/dns 2 ({frontend})"))
                && l.contains("EDESTADDRREQ")
        })
    });
    // Every translated connected socket was found and destroyed; the unconnected socket's
    // translations are no socket to destroy (nor a failure to find one).
    let metrics = scrape_metrics(&c);
    assert_eq!(
        sample(&metrics, "kpng_ebpf_udp_socket_destroy_failures_total"),
        Some(0.0),
        "{metrics}"
    );
    signals.raise("stop");
}

/// Two rounds of 20 datagrams through one unconnected socket (`sendto`) to argv[1]:argv[2],
/// each round printed as the answering pods' names; the second round waits for file argv[3].
const UDP_ROUNDS: &str = r#"
import os, socket, sys, time
dst = (sys.argv[1], int(sys.argv[2]))
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1)
def round():
    names = []
    for _ in range(20):
        s.sendto(b"x", dst); d, a = s.recvfrom(200); assert a == dst, a
        names.append(d.decode().split()[0])
    print(" ".join(names), flush=True)
round()
while not os.path.exists(sys.argv[3]): time.sleep(0.05)
round()
"#;

#[test]
fn an_unconnected_udp_socket_keeps_its_endpoint_while_it_serves() {
    require_root!();
    let c = Cluster::create(&B.prefix("udpflow")).expect("cluster");
    let _echo = echo_in(&c, &["pod1a", "pod1b", "pod2a"]);
    let both = [("pod1b", Cond::Ready), ("pod2a", Cond::Ready)];
    let mut k = Kpng::start(
        B,
        &c.node1.ns,
        &manifest(&[svc("dns", 10, "ClusterIP", "", &both)]),
        &[],
    );
    let signals = Signals::new();
    let mut client = spawn_python(
        &c,
        "pod1a",
        UDP_ROUNDS,
        &[
            cip(10, false).to_string(),
            SVC_PORT.to_string(),
            signals.path("next"),
        ],
    );
    let names = |line: &str| -> std::collections::BTreeSet<String> {
        line.split_whitespace().map(String::from).collect()
    };
    // As kube-proxy's conntrack entry does: one flow, one endpoint.
    let first = client
        .wait_for_line(|l| !l.is_empty(), Duration::from_secs(10))
        .expect("the first round");
    let chosen = names(&first);
    assert_eq!(chosen.len(), 1, "one endpoint for the flow: {first}");
    // Its endpoint leaves: the flow moves to one of the others, and stays there.
    let gone = chosen.first().cloned().unwrap_or_default();
    let stays = if gone == "pod1b" { "pod2a" } else { "pod1b" };
    k.apply(&manifest(&[svc(
        "dns",
        10,
        "ClusterIP",
        "",
        &[(stays, Cond::Ready), ("pod1a", Cond::Ready)],
    )]));
    signals.raise("next");
    let second = client
        .wait_for_line(|l| !l.is_empty(), Duration::from_secs(10))
        .expect("the second round");
    let now = names(&second);
    assert_eq!(now.len(), 1, "one endpoint for the flow: {second}");
    assert!(!now.contains(&gone), "{gone} left the Service: {second}");
}

#[test]
fn a_restart_adopts_the_pinned_programs_and_maps() {
    require_root!();
    let c = Cluster::create(&B.prefix("adopt")).expect("cluster");
    let _line_server = start_line_server(&c, "pod2a");
    let mut k = Kpng::start(
        B,
        &c.node1.ns,
        &manifest(&[svc("web", 10, "ClusterIP", "", &[("pod2a", Cond::Ready)])]),
        &[],
    );
    let before = attached(&c);
    assert_eq!(before.len(), 9, "nine programs attached: {before:?}");
    // Every map's kernel memory is reported, the affinity map's too.
    let metrics = scrape_metrics(&c);
    for map in kpng_backend_ebpf::kernel::MAP_NAMES {
        let line = format!("kpng_ebpf_map_memory_bytes{{map=\"{map}\"}} ");
        assert!(metrics.contains(&line), "{line}in:\n{metrics}");
    }
    let mut held = HeldConnection::open(&c.pod("pod1a").ns, cip(10, false), "pod2a");
    let translated = "kpng_ebpf_translations_total{hook=\"connect4\"}";
    let counted = sample(&scrape_metrics(&c), translated).expect("the translation counter");
    assert!(counted >= 1.0, "the held connection was translated");
    k.restart();
    assert_eq!(
        attached(&c),
        before,
        "the new programs replaced the old ones, no duplicates"
    );
    // The counters map is pinned too: the restarted kpng's counts go on from there.
    let after = sample(&scrape_metrics(&c), translated).expect("the translation counter");
    assert!(after >= counted, "{translated}: {counted}, then {after}");
    held.second("pod2a")
        .expect("the established connection outlives the restart");
    // The restarted kpng's programs translate (the adopted maps hold the Service).
    let mut again = HeldConnection::open(&c.pod("pod1b").ns, cip(10, false), "pod2a");
    again
        .second("pod2a")
        .expect("a new connection after the restart");
}

#[test]
fn a_second_kpng_of_the_host_with_the_same_pins_is_refused() {
    require_root!();
    let c = Cluster::create(&B.prefix("pinlock")).expect("cluster");
    let _k = Kpng::start(
        B,
        &c.node1.ns,
        &manifest(&[svc("web", 10, "ClusterIP", "", &[("pod2a", Cond::Ready)])]),
        &[],
    );
    let (cgroup, pins) = ebpf_scope(&c.node1.ns);
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("cluster.yaml");
    std::fs::write(
        &input,
        manifest(&[svc("web", 10, "ClusterIP", "", &[("pod2a", Cond::Ready)])]),
    )
    .expect("write");
    // node2's kpng, given node1's pins (a copied DaemonSet on a host with two nodes). It must
    // stop at once; `timeout` ends one that runs (the regression) so that the test fails.
    let out = c
        .node2
        .ns
        .command([
            "timeout",
            "20",
            env!("CARGO_BIN_EXE_kpng"),
            "file",
            "--input",
        ])
        .arg(&input)
        .args([
            "--node-name",
            "node2",
            "--metrics-bind-address=",
            "--healthz-bind-address=127.0.0.1:0",
            "--admin-socket=",
            "to-local",
            "ebpf",
            "--bpf-pin-path",
        ])
        .arg(&pins)
        .arg("--cgroup-path")
        .arg(&cgroup)
        .output()
        .expect("kpng");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("another kpng (pid ") && said.contains("uses the eBPF pins under"),
        "{said}"
    );
    assert_eq!(attached(&c).len(), 9, "node1's programs only: {said}");
}

#[test]
fn cleanup_removes_the_pins_and_detaches_the_programs() {
    require_root!();
    let c = Cluster::create(&B.prefix("clean")).expect("cluster");
    let mut k = Kpng::start(
        B,
        &c.node1.ns,
        &manifest(&[svc("web", 10, "ClusterIP", "", &[("pod2a", Cond::Ready)])]),
        &[],
    );
    let pins = ebpf_pins(&c.node1.ns);
    assert!(pins.join("v3/kpng_frontends").exists(), "maps pinned");
    // Pins are the host's: while node1's kpng runs, a cleanup in another network namespace
    // (node2's: its own instance check sees no kpng) keeps them, and says who uses them.
    let out = c
        .node2
        .ns
        .command([env!("CARGO_BIN_EXE_kpng"), "cleanup", "--bpf-pin-path"])
        .arg(&pins)
        .output()
        .expect("kpng cleanup");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("in use by a running kpng (pid ") && said.contains("stop that kpng first"),
        "{said}"
    );
    assert!(pins.join("v3/kpng_frontends").exists(), "maps kept: {said}");
    k.stop();
    assert_eq!(
        attached(&c).len(),
        9,
        "the programs stay attached after kpng left"
    );
    // `--bpf-pin-path`, as `to-local ebpf` had it (not only `$KPNG_BPF_PIN_PATH`).
    let out = c
        .node1
        .ns
        .command([env!("CARGO_BIN_EXE_kpng"), "cleanup", "--bpf-pin-path"])
        .arg(&pins)
        .output()
        .expect("kpng cleanup");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    assert!(!pins.exists(), "pins removed: {said}");
    assert!(
        said.contains(&format!(
            "removed the eBPF backend's pinned programs and maps under {}",
            pins.display()
        )),
        "the message names the pins it removed: {said}"
    );
    // The kernel releases an unpinned link (and detaches its program) from a work queue,
    // after the unlink returned: one run in about ten saw a program still attached at once.
    // (10 s: the work queue waits its turn on a loaded machine.)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !attached(&c).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        attached(&c).is_empty(),
        "programs detached within 10 s: {:?}",
        attached(&c)
    );
}

/// An upgrade from a kpng whose maps had another layout (pinned in the pin directory itself,
/// before layout versions): the new kpng creates its own maps, translates with them, and
/// removes the old pins instead of adopting maps it would misread.
#[test]
fn an_upgrade_replaces_maps_of_another_layout() {
    require_root!();
    let c = Cluster::create(&B.prefix("upgrade")).expect("cluster");
    let _line_server = start_line_server(&c, "pod2a");
    kpng_testkit::cgroups::bpffs().expect("test bpffs");
    let pins = ebpf_pins(&c.node1.ns);
    std::fs::create_dir_all(&pins).expect("pin dir");
    let legacy = pins.join("kpng_frontends");
    // The first layout's frontend map: (address, port, protocol) → a 4-byte service id.
    let made = std::process::Command::new("bpftool")
        .args(["map", "create"])
        .arg(&legacy)
        .args(["type", "hash", "key", "20", "value", "4", "entries", "16"])
        .args(["name", "kpng_frontends", "flags", "1"])
        .output()
        .expect("bpftool map create");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let _k = Kpng::start(
        B,
        &c.node1.ns,
        &manifest(&[svc("web", 10, "ClusterIP", "", &[("pod2a", Cond::Ready)])]),
        &[],
    );
    assert!(!legacy.exists(), "the old layout's pin is gone");
    assert!(pins.join("v3/kpng_frontends").exists(), "new maps pinned");
    assert_eq!(attached(&c).len(), 9, "programs attached");
    let mut held = HeldConnection::open(&c.pod("pod1a").ns, cip(10, false), "pod2a");
    held.second("pod2a")
        .expect("connections work after the upgrade");
}

/// An upgrade across a layout change that leaves `kpng_reverse` as it was carries its elements
/// over: the sockets the previous programs translated keep seeing the Service address
/// (getpeername, connected UDP replies) and keep being destroyed when their endpoint leaves.
/// Before, the whole previous layout went, and with it what every open socket had been
/// translated to. The previous layout is stood in for by this build's own maps, their
/// directory renamed to `v2`.
#[test]
fn an_upgrade_carries_the_reverse_map_over() {
    require_root!();
    let c = Cluster::create(&B.prefix("carry")).expect("cluster");
    let _line_server = start_line_server(&c, "pod2a");
    let mut k = Kpng::start(
        B,
        &c.node1.ns,
        &manifest(&[svc("web", 10, "ClusterIP", "", &[("pod2a", Cond::Ready)])]),
        &[],
    );
    let mut held = HeldConnection::open(&c.pod("pod1a").ns, cip(10, false), "pod2a");
    let before = reverse_entries(&c);
    assert!(before >= 1, "the held connection's translation");
    k.terminate();
    let pins = ebpf_pins(&c.node1.ns);
    std::fs::rename(pins.join("v3"), pins.join("v2")).expect("stand in for another layout");
    k.spawn();
    k.wait_logged("the carry-over", |log| {
        log.contains("carried over") && log.contains("elements of kpng_reverse from layout v2")
    });
    assert!(
        !pins.join("v2").exists(),
        "the other layout's pins are gone"
    );
    assert!(
        reverse_entries(&c) >= before,
        "the translations of open sockets were carried over"
    );
    held.second("pod2a")
        .expect("the established connection outlives the upgrade");
}

/// A rollback from a newer build with a program this one lacks: that program's link stays
/// pinned (and attached) when the newer kpng stops. The older kpng removes the pin, which
/// detaches it, instead of leaving a hook it knows nothing about beside its own. The newer
/// program is stood in for by one of this build's, its pin renamed to a name no build has.
#[test]
fn a_rollback_detaches_the_programs_this_build_does_not_have() {
    require_root!();
    let c = Cluster::create(&B.prefix("rollback")).expect("cluster");
    let _line_server = start_line_server(&c, "pod2a");
    let mut k = Kpng::start(
        B,
        &c.node1.ns,
        &manifest(&[svc("web", 10, "ClusterIP", "", &[("pod2a", Cond::Ready)])]),
        &[],
    );
    k.terminate();
    let links = ebpf_pins(&c.node1.ns).join("links");
    let newer = links.join("kpng_newer_hook");
    std::fs::rename(links.join("kpng_sock_release"), &newer).expect("rename a link pin");
    assert_eq!(attached(&c).len(), 9, "the renamed link stays attached");
    k.spawn();
    k.wait_logged("the unknown link's removal", |log| {
        log.contains("kpng_newer_hook") && log.contains("does not have")
    });
    assert!(!newer.exists(), "the unknown link's pin is gone");
    assert_eq!(
        attached(&c).len(),
        9,
        "only this build's programs stay attached: {:?}",
        attached(&c)
    );
    let mut held = HeldConnection::open(&c.pod("pod1a").ns, cip(10, false), "pod2a");
    held.second("pod2a")
        .expect("connections work after the rollback");
}

/// Accepts TCP on port 8080 and answers each connection with the local address it reached.
const ADDR_SERVER: &str = r#"
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8080)); s.listen(256); print("ready", flush=True)
while True:
    c, _ = s.accept(); c.sendall(c.getsockname()[0].encode() + b"\n"); c.close()
"#;

/// Connects argv[3] times to argv[1]:argv[2], each from a new socket, and prints every
/// distinct answer (sorted).
const ADDR_CLIENT: &str = r#"
import socket, sys
seen = set()
for _ in range(int(sys.argv[3])):
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
    seen.add(s.makefile().readline().strip()); s.close()
print(" ".join(sorted(seen)))
"#;

/// A Service with more endpoints than the frontend's value holds inline (8): the rest come
/// from the slots map, and every endpoint must be chosen. The 12 endpoints are addresses of
/// the client pod's own loopback, so the test needs no extra namespaces.
#[test]
fn a_service_with_more_endpoints_than_fit_inline_reaches_every_one() {
    require_root!();
    let c = Cluster::create(&B.prefix("wide")).expect("cluster");
    let pod = &c.pod("pod1a").ns;
    let addrs: Vec<String> = (100..112).map(|i| format!("10.244.1.{i}")).collect();
    // Local addresses on the pod's loopback (this kernel has no dummy links).
    for a in &addrs {
        pod.run_ok(["ip", "addr", "add", &format!("{a}/32"), "dev", "lo"])
            .expect("loopback address");
    }
    let mut server = pod
        .spawn(["python3", "-c", ADDR_SERVER])
        .expect("python3 address server");
    server
        .wait_for_line(|l| l == "ready", Duration::from_secs(10))
        .expect("address server ready");
    let endpoints: String = addrs
        .iter()
        .map(|a| {
            format!(
                "- {{addresses: [\"{a}\"], nodeName: node1, conditions: {{ready: true, serving: true, terminating: false}}}}\n"
            )
        })
        .collect();
    let v4 = cip(30, false);
    let objects = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{namespace: default, name: wide}}\n\
         spec: {{type: ClusterIP, clusterIP: {v4}, clusterIPs: [{v4}], ipFamilies: [IPv4], \
         ipFamilyPolicy: SingleStack, ports: [{{name: tcp, port: {SVC_PORT}, protocol: TCP, \
         targetPort: {EP_PORT}}}]}}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{namespace: default, name: wide-ipv4, labels: {{kubernetes.io/service-name: wide}}}}\n\
         addressType: IPv4\nports: [{{name: tcp, port: {EP_PORT}, protocol: TCP}}]\n\
         endpoints:\n{endpoints}"
    );
    let _k = Kpng::start(B, &c.node1.ns, &manifest(&[objects]), &[]);
    // 240 connections: the chance that a fair choice misses one of 12 is below 1e-8.
    let out = pod
        .run_ok([
            "python3",
            "-c",
            ADDR_CLIENT,
            &v4.to_string(),
            &SVC_PORT.to_string(),
            "240",
        ])
        .expect("python3 client");
    let mut expected = addrs.clone();
    expected.sort();
    assert_eq!(
        out.trim(),
        expected.join(" "),
        "every endpoint, inline and in the slots map, is chosen"
    );
    // Chosen at connect() by the programs, not by node1's nftables DNAT.
    let tracked = c
        .node1
        .ns
        .exec([
            "conntrack",
            "-L",
            "-p",
            "tcp",
            "--orig-dst",
            &v4.to_string(),
        ])
        .expect("conntrack");
    let tracked = String::from_utf8_lossy(&tracked.stdout);
    assert!(
        !tracked.contains("dport=80 "),
        "no connection to the ClusterIP crossed node1: {tracked:?}"
    );
}

/// Someone empties the pin directory while kpng runs (an `rm -rf /sys/fs/bpf/*`, a tool
/// cleaning the bpffs): the programs keep translating, since kpng holds their links and maps,
/// and the next periodic sync pins everything again, shown as a repair, so that a restart
/// still adopts the maps and replaces the programs instead of adding a second set.
#[test]
fn removed_pins_are_pinned_again_and_translation_never_stops() {
    require_root!();
    let c = Cluster::create(&B.prefix("unpin")).expect("cluster");
    let _line_server = start_line_server(&c, "pod2a");
    let mut k = Kpng::start(
        B,
        &c.node1.ns,
        &manifest(&[svc("web", 10, "ClusterIP", "", &[("pod2a", Cond::Ready)])]),
        &["--sync-period", "1s"],
    );
    let pins = ebpf_pins(&c.node1.ns);
    let pinned = |dir: &str| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(pins.join(dir))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    let (links, maps) = (pinned("links"), pinned("v3"));
    assert_eq!(links.len(), 9, "{links:?}");
    // The six maps and the programs' counters.
    assert_eq!(maps.len(), 7, "{maps:?}");
    let mut held = HeldConnection::open(&c.pod("pod1a").ns, cip(10, false), "pod2a");

    std::fs::remove_dir_all(&pins).expect("rm -rf the pin directory");
    assert_eq!(
        attached(&c).len(),
        9,
        "kpng holds the links: removing the pins detaches nothing"
    );
    HeldConnection::open(&c.pod("pod1b").ns, cip(10, false), "pod2a")
        .second("pod2a")
        .expect("a new connection right after the pins went");

    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while (pinned("links") != links || pinned("v3") != maps) && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(pinned("links"), links, "links pinned again within 5 s");
    assert_eq!(pinned("v3"), maps, "maps pinned again within 5 s");
    // The sync records its repair once it is done, after the pins are back.
    let repaired = |status: &serde_json::Value| {
        status["repairs"]["count"].as_u64().is_some_and(|n| n >= 1)
            && status["repairs"]["lastChange"]
                .as_str()
                .is_some_and(|c| c.contains("eBPF pins") && c.contains("kpng_connect4"))
    };
    let status = k.status_until(repaired);
    assert!(repaired(&status), "the repair is shown: {status}");

    // The pins are the real ones: a restart adopts the maps and replaces the programs.
    k.restart();
    assert_eq!(attached(&c).len(), 9, "{:?}", attached(&c));
    held.second("pod2a")
        .expect("the established connection outlives it all");
    HeldConnection::open(&c.pod("pod1b").ns, cip(10, false), "pod2a")
        .second("pod2a")
        .expect("a new connection after the restart");
}

/// Elements of the pinned reverse map (`bpftool map dump`).
fn reverse_entries(c: &Cluster) -> usize {
    let map = ebpf_pins(&c.node1.ns).join("v3/kpng_reverse");
    let out = std::process::Command::new("bpftool")
        .args(["-j", "map", "dump", "pinned"])
        .arg(&map)
        .output()
        .expect("bpftool map dump");
    let dump: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("bpftool's JSON ({e}): {out:?}"));
    dump.as_array().map_or(0, Vec::len)
}

/// A closing socket takes its translation with it (`cgroup/sock_release`): the reverse map
/// holds the sockets alive, not every socket since the start. Left to the LRU, a busy node's
/// closed connections would push out the entry of a long-lived connected UDP socket, whose
/// endpoint leaving would then not destroy it.
#[test]
fn a_closed_socket_leaves_nothing_in_the_reverse_map() {
    require_root!();
    let c = Cluster::create(&B.prefix("release")).expect("cluster");
    let _echo = echo_in(&c, &["pod2a"]);
    let _line_server = start_line_server(&c, "pod1b");
    let _k = Kpng::start(
        B,
        &c.node1.ns,
        &manifest(&[
            svc("web", 10, "ClusterIP", "", &[("pod2a", Cond::Ready)]),
            svc("hold", 11, "ClusterIP", "", &[("pod1b", Cond::Ready)]),
        ]),
        &[],
    );
    let pod1a = &c.pod("pod1a").ns;
    for proto in [Proto::Tcp, Proto::Udp] {
        let answered = probes(pod1a, proto, sa(cip(10, false), SVC_PORT), 50);
        assert!(
            answered.iter().all(|r| r.outcome == Outcome::Ok),
            "{answered:?}"
        );
    }
    let mut held = HeldConnection::open(pod1a, cip(11, false), "pod1b");
    // The probe's sockets are closed; the kernel runs the release hook as each goes.
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while reverse_entries(&c) > 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        reverse_entries(&c),
        1,
        "100 closed sockets left nothing; the held connection's translation stays"
    );
    held.second("pod1b").expect("the held connection works");
    drop(held);
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while reverse_entries(&c) > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(reverse_entries(&c), 0, "and nothing once it closed");
}

/// `kpng status` shows the socket half: its programs attached (and to which cgroup) and its
/// maps' fill in the wide view and JSON, and unasked once something is wrong.
#[test]
fn status_shows_the_socket_programs_and_their_maps() {
    require_root!();
    let c = Cluster::create(&B.prefix("ststatus")).expect("cluster");
    let _line_server = start_line_server(&c, "pod2a");
    let k = Kpng::start(
        B,
        &c.node1.ns,
        &manifest(&[svc("web", 10, "ClusterIP", "", &[("pod2a", Cond::Ready)])]),
        &[],
    );
    let (cgroup, pins) = ebpf_scope(&c.node1.ns);
    let mut held = HeldConnection::open(&c.pod("pod1a").ns, cip(10, false), "pod2a");
    let status = k.status_json();
    let lines = status["dataPlane"].as_array().expect("dataPlane lines");
    // The rules half's table first, then the socket half.
    assert_eq!(lines[0]["what"], "nftables", "{status}");
    assert!(
        lines[0]["state"]
            .as_str()
            .is_some_and(|s| s.starts_with("table ip kpng: ") && s.contains("table ip6 kpng: ")),
        "{status}"
    );
    let lines = &lines[1..];
    assert_eq!(
        lines[0]["state"],
        format!(
            "9 of 9 attached to cgroup {} (its subtree's sockets), links pinned in {}",
            cgroup.display(),
            pins.join("links").display()
        ),
        "{status}"
    );
    let maps = lines[1]["state"].as_str().expect("maps line");
    // web: TCP and UDP on its IPv4 and IPv6 ClusterIPs; the held connection is the one open
    // translated socket.
    assert!(
        maps.starts_with("Service frontends 4 of 262144, ")
            && maps.contains("socket translations (connected sockets + unconnected UDP flows, freed by eviction) 1 of 131072"),
        "{maps}"
    );
    assert!(lines.iter().all(|l| l.get("problem").is_none()), "{status}");
    let kpng_status = |wide: bool| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_kpng"));
        cmd.args(["status", "--admin-socket"]).arg(k.admin_socket());
        if wide {
            cmd.args(["-o", "wide"]);
        }
        let out = cmd.output().expect("kpng status");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(
        !kpng_status(false).contains("eBPF"),
        "nothing to say unasked"
    );
    assert!(
        kpng_status(true).contains("eBPF socket programs: 9 of 9 attached"),
        "{}",
        kpng_status(true)
    );

    // Someone removes the link pins: said unasked (the default 30 s sync period has not come),
    // and the programs still count as attached (the cgroup's own list says so).
    std::fs::remove_dir_all(pins.join("links")).expect("rm the link pins");
    let table = kpng_status(false);
    assert!(
        table.contains("eBPF socket programs: 9 of 9 attached")
            && table.contains("0 of 9 links pinned in")
            && table.contains("PROBLEM: not pinned: kpng_connect4, "),
        "{table}"
    );
    held.second("pod2a")
        .expect("and the programs still translate");
}

/// Someone detaches kpng's programs from the cgroup (`bpftool link detach`) while their links
/// and pins stay: the pins alone would show nothing wrong. `kpng status` says so unasked, the
/// hooks' traffic goes through the nftables rules meanwhile, and the next periodic sync
/// attaches the programs again (new links pinned over the old ones).
#[test]
fn detached_programs_are_shown_and_attached_again() {
    require_root!();
    let c = Cluster::create(&B.prefix("detach")).expect("cluster");
    let _line_server = start_line_server(&c, "pod2a");
    // The default sync period (30 s): nothing repairs during the first half.
    let mut k = Kpng::start(
        B,
        &c.node1.ns,
        &manifest(&[svc("web", 10, "ClusterIP", "", &[("pod2a", Cond::Ready)])]),
        &[],
    );
    let (_, pins) = ebpf_scope(&c.node1.ns);
    let detach = |name: &str| {
        let out = std::process::Command::new("bpftool")
            .args(["link", "detach", "pinned"])
            .arg(pins.join("links").join(name))
            .output()
            .expect("bpftool link detach");
        assert!(out.status.success(), "bpftool link detach {name}: {out:?}");
    };
    let conntrack = |args: &[&str]| -> String {
        let mut all = vec!["conntrack"];
        all.extend(args);
        let out = c.node1.ns.exec(all).expect("conntrack");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let service = cip(10, false).to_string();
    let entries_to_service = || conntrack(&["-L", "-p", "tcp", "--orig-dst", &service]);
    let mut held = HeldConnection::open(&c.pod("pod1a").ns, cip(10, false), "pod2a");
    assert!(entries_to_service().is_empty(), "translated at connect()");

    detach("kpng_connect4");
    assert!(
        !attached(&c).iter().any(|n| n == "kpng_connect4"),
        "{:?}",
        attached(&c)
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kpng"))
        .args(["status", "--admin-socket"])
        .arg(k.admin_socket())
        .output()
        .expect("kpng status");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("eBPF socket programs: 8 of 9 attached")
            && table.contains("PROBLEM: not attached to the cgroup: kpng_connect4 detached"),
        "said unasked: {table}"
    );
    // Meanwhile a new connection is the rules' (DNAT, conntracked to the ClusterIP).
    HeldConnection::open(&c.pod("pod1b").ns, cip(10, false), "pod2a")
        .second("pod2a")
        .expect("a new connection while connect4 is detached");
    assert!(
        !entries_to_service().is_empty(),
        "the nftables rules took it: the detach was real"
    );

    // Repaired by the periodic sync: every program detached at once this time.
    k.set_extra(&["--sync-period", "1s"]);
    k.restart();
    assert_eq!(attached(&c).len(), 9, "{:?}", attached(&c));
    // kpng is held still while the nine are detached one by one: a periodic sync among them
    // (one a second) would attach the first ones again before the last went.
    let pid = k.pid().expect("kpng runs").to_string();
    let signal = |sig: &str| {
        let out = std::process::Command::new("kill")
            .args([sig, pid.as_str()])
            .output()
            .expect("kill");
        assert!(out.status.success(), "kill {sig} {pid}: {out:?}");
    };
    // Repairs so far (the restart may have found connect4 detached): this one comes after.
    let repairs_before = k.status_json()["repairs"]["count"].as_u64().unwrap_or(0);
    signal("-STOP");
    for name in kpng_backend_ebpf::kernel::PROGRAMS {
        detach(name);
    }
    assert!(attached(&c).is_empty(), "{:?}", attached(&c));
    signal("-CONT");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while attached(&c).len() < 9 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(attached(&c).len(), 9, "attached again within 5 s");
    // The sync records its repair once it is done, after the programs were attached.
    let repaired = |status: &serde_json::Value| {
        status["repairs"]["count"]
            .as_u64()
            .is_some_and(|n| n > repairs_before)
            && status["repairs"]["lastChange"]
                .as_str()
                .is_some_and(|c| c.contains("attached again: kpng_connect4, "))
    };
    let status = k.status_until(repaired);
    assert!(repaired(&status), "the repair is shown: {status}");
    assert!(
        status["dataPlane"]
            .as_array()
            .is_some_and(|lines| lines.iter().all(|l| l.get("problem").is_none())),
        "and nothing is left to say: {status}"
    );
    conntrack(&["-D", "-p", "tcp", "--orig-dst", &service]);
    let mut again = HeldConnection::open(&c.pod("pod1b").ns, cip(10, false), "pod2a");
    again.second("pod2a").expect("a new connection");
    assert!(
        entries_to_service().is_empty(),
        "translated at connect() again: {}",
        entries_to_service()
    );
    held.second("pod2a")
        .expect("the first connection outlived it all");
}

/// A kpng in a cgroup namespace of its own (a container's, by default on a cgroup v2 node)
/// with the default `--cgroup-path` sees its own cgroup as the root: attached there, the
/// programs would translate kpng's sockets only while every pod's traffic took the NAT rules,
/// and nothing would fail to say so. It warns at start, and `kpng status` shows it unasked.
#[test]
fn a_kpng_in_its_own_cgroup_namespace_says_the_pods_are_not_translated() {
    require_root!();
    let c = Cluster::create(&B.prefix("cgns")).expect("cluster");
    // node1's test cgroup: the process joins it before `unshare --cgroup` makes it the root.
    let (_cgroup, pins) = ebpf_scope(&c.node1.ns);
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("cluster.yaml");
    std::fs::write(
        &input,
        manifest(&[svc("web", 10, "ClusterIP", "", &[("pod2a", Cond::Ready)])]),
    )
    .expect("write");
    let socket = dir.path().join("kpng.sock");
    let mut args: Vec<std::ffi::OsString> = [
        "timeout",
        "60",
        "unshare",
        "--mount",
        "--cgroup",
        env!("CARGO_BIN_EXE_kpng"),
        "file",
        "--input",
    ]
    .map(Into::into)
    .to_vec();
    args.push(input.clone().into());
    for a in [
        "--node-name",
        "node1",
        "--metrics-bind-address=",
        "--healthz-bind-address=127.0.0.1:0",
        "--admin-socket",
    ] {
        args.push(a.into());
    }
    args.push(socket.clone().into());
    for a in ["to-local", "ebpf", "--bpf-pin-path"] {
        args.push(a.into());
    }
    args.push(pins.clone().into());
    let mut k = c.node1.ns.spawn(&args).expect("kpng");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !k.stderr_text().contains("synced backend=") {
        assert!(
            k.try_wait().expect("wait").is_none(),
            "kpng exited: {}",
            k.stderr_text()
        );
        assert!(std::time::Instant::now() < deadline, "{}", k.stderr_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    let said = k.stderr_text();
    assert!(
        said.contains("WARN") && said.contains("cgroup namespace of its own"),
        "{said}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kpng"))
        .args(["status", "--admin-socket"])
        .arg(&socket)
        .output()
        .expect("kpng status");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("attached to the root of kpng's own cgroup namespace")
            && table.contains("PROBLEM: kpng runs in a cgroup namespace of its own"),
        "{table}"
    );
    drop(k);
    forget_ebpf_scope(&c.node1.ns);
    // The directory kpng mounted its own hierarchy on, in its private mount namespace: the
    // mount went with it, the empty directory stays on the host's /run (removed only if
    // empty, so a real mount there is never touched).
    let _ = std::fs::remove_dir(kpng_backend_ebpf::host::OWN_CGROUP2_MOUNT);
}

/// Removes a pin directory when dropped (a test's moved-away pins, on failure too).
struct PinsGone(std::path::PathBuf);

impl Drop for PinsGone {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Moves node1's pin directory away, as a kpng started with another `--bpf-pin-path` (or its
/// own bpffs) would not see it: the programs stay attached, held by pins nobody looks at.
fn hide_pins(c: &Cluster, suffix: &str) -> PinsGone {
    let pins = ebpf_pins(&c.node1.ns);
    let hidden = pins.with_file_name(format!(
        "{}-{suffix}",
        pins.file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
    ));
    let _ = std::fs::remove_dir_all(&hidden);
    std::fs::rename(&pins, &hidden).expect("move the pins away");
    PinsGone(hidden)
}

/// The endpoints of the Service `web` the switch and restart tests start with: one pod on each
/// node, both ready.
const WEB_ENDPOINTS: [(&str, Cond); 2] = [("pod2a", Cond::Ready), ("pod1b", Cond::Ready)];

/// node1 of `c` with an eBPF kpng serving `web` and its nine programs attached: where the
/// tests of a later kpng meeting those programs start. The echo servers live as long as the
/// returned handles.
fn ebpf_serving_web(c: &Cluster) -> (Vec<Spawned>, Kpng<'_>) {
    let echo = echo_in(c, &["pod2a", "pod1b"]);
    let k = Kpng::start(
        B,
        &c.node1.ns,
        &manifest(&[svc("web", 10, "ClusterIP", "", &WEB_ENDPOINTS)]),
        &[],
    );
    assert_eq!(attached(c).len(), 9, "{:?}", attached(c));
    (echo, k)
}

/// A kpng that cannot see its predecessor's pins (another `--bpf-pin-path`, its own bpffs, a
/// DaemonSet without the host's `/sys/fs/bpf`) finds the previous generation on its cgroup and
/// detaches it, instead of leaving it to run first and translate from a map nobody updates;
/// `kpng cleanup` detaches programs that no pin names.
#[test]
fn a_start_that_cannot_see_the_old_pins_detaches_the_old_programs() {
    require_root!();
    let c = Cluster::create(&B.prefix("stale")).expect("cluster");
    let (_echo, mut k) = ebpf_serving_web(&c);
    let both = WEB_ENDPOINTS;
    k.stop();
    let _old = hide_pins(&c, "old");

    let mut k = Kpng::start(
        B,
        &c.node1.ns,
        &manifest(&[svc("web", 10, "ClusterIP", "", &both)]),
        &["--sync-period", "1s"],
    );
    assert_eq!(
        attached(&c).len(),
        9,
        "the old generation was detached: {:?}",
        attached(&c)
    );
    k.wait_logged("the warning", |err| {
        err.contains("kpng eBPF programs that are not this kpng's were attached to cgroup")
            && err.contains("kpng_connect4 (program ")
    });
    let repaired = |status: &serde_json::Value| {
        status["repairs"]["count"].as_u64().is_some_and(|n| n >= 1)
            && status["repairs"]["lastChange"]
                .as_str()
                .is_some_and(|c| c.contains("not this kpng's"))
    };
    let status = k.status_until(repaired);
    assert!(repaired(&status), "counted as a repair: {status}");

    // pod2a leaves: new connections go to pod1b only (the old programs, had they stayed,
    // would translate from their frozen map first).
    k.apply(&manifest(&[svc(
        "web",
        10,
        "ClusterIP",
        "",
        &[("pod1b", Cond::Ready)],
    )]));
    let reached = spread(
        &c.pod("pod1a").ns,
        Proto::Tcp,
        sa(cip(10, false), SVC_PORT),
        8,
    );
    assert_eq!(names(&reached), set(&["pod1b"]), "{reached:?}");

    // Stopped and its pins moved away too: `kpng cleanup` finds the programs on the cgroup.
    k.stop();
    let _newer = hide_pins(&c, "newer");
    assert_eq!(attached(&c).len(), 9, "{:?}", attached(&c));
    let (cgroup, pins) = ebpf_scope(&c.node1.ns);
    let out = c
        .node1
        .ns
        .command([
            env!("CARGO_BIN_EXE_kpng"),
            "cleanup",
            "--kpng-only",
            "--bpf-pin-path",
        ])
        .arg(&pins)
        .arg("--cgroup-path")
        .arg(&cgroup)
        .output()
        .expect("kpng cleanup");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("removed the eBPF backend's pinned programs and maps"),
        "{said}"
    );
    assert!(attached(&c).is_empty(), "{:?}: {said}", attached(&c));
}

/// A full `kpng_frontends` map (unwanted elements: a crash between a sync's writes and its
/// deletes, someone else's writes) recovers at the next full sync: the unwanted elements are
/// deleted before the wanted ones are written. Before, the writes came first and every retry
/// failed with "Argument list too long".
#[test]
fn a_full_frontends_map_converges() {
    use std::os::fd::AsFd;
    require_root!();
    let c = Cluster::create(&B.prefix("fullmap")).expect("cluster");
    let _echo = echo_in(&c, &["pod2a", "pod1b"]);
    let web = svc("web", 10, "ClusterIP", "", &[("pod2a", Cond::Ready)]);
    let mut k = Kpng::start(B, &c.node1.ns, &manifest(std::slice::from_ref(&web)), &[]);
    k.stop();
    // Filled to its capacity with frontends nobody wants.
    let pin = ebpf_pins(&c.node1.ns).join("v3/kpng_frontends");
    let fd = kpng_backend_ebpf::links::open_pin(&pin).expect("open the pinned map");
    use kpng_backend_ebpf::layout::{FRONTEND_KEY, SERVICE, frontend_key};
    let mut map = kpng_backend_ebpf::batch::Map::new(fd.as_fd(), FRONTEND_KEY, SERVICE);
    let mut refused = None;
    for chunk in 0u32..(262_144 / 4096) + 1 {
        let (mut keys, values) = (Vec::new(), vec![0u8; 4096 * SERVICE]);
        for i in 0..4096u32 {
            let n = chunk * 4096 + i;
            let ip =
                std::net::Ipv6Addr::new(0xfd00, 0xdead, 0, 0, 0, 0, (n >> 16) as u16, n as u16);
            keys.extend_from_slice(&frontend_key(ip.into(), 80, 6));
        }
        if let Err(e) = map.update(&keys, &values) {
            refused = Some(e);
            break;
        }
    }
    let refused = refused.expect("the map filled up");
    // E2BIG: a full hash map refuses new keys.
    assert_eq!(refused.raw_os_error(), Some(7), "{refused}");
    drop(fd);

    // A new Service while the map is full: the start's full sync must converge.
    let api = svc("api", 11, "ClusterIP", "", &[("pod1b", Cond::Ready)]);
    k.write(&manifest(&[web, api]));
    k.spawn();
    let reached = spread(
        &c.pod("pod1a").ns,
        Proto::Tcp,
        sa(cip(11, false), SVC_PORT),
        4,
    );
    assert_eq!(names(&reached), set(&["pod1b"]), "{reached:?}");
}

/// `/metrics` answers the questions about the socket half: the programs attached to which
/// cgroup, each map's fill and capacity, and what the programs do (their per-CPU counters,
/// read at scrape): a connection through a ClusterIP counts as translated, one to a Service
/// without endpoints as refused, and a new Service's frontend shows in the map's entries.
#[test]
fn metrics_show_the_programs_translating_and_the_maps_filling() {
    require_root!();
    let c = Cluster::create(&B.prefix("metrics")).expect("cluster");
    let _line_server = start_line_server(&c, "pod2a");
    let web = svc("web", 10, "ClusterIP", "", &[("pod2a", Cond::Ready)]);
    let empty = svc("empty", 12, "ClusterIP", "", &[]);
    let mut k = Kpng::start(
        B,
        &c.node1.ns,
        &manifest(&[web.clone(), empty.clone()]),
        &[],
    );
    let (cgroup, _) = ebpf_scope(&c.node1.ns);
    let before = scrape_metrics(&c);
    for program in kpng_backend_ebpf::kernel::PROGRAMS {
        let series = format!(
            "kpng_ebpf_program_attached{{program=\"{program}\",cgroup=\"{}\"}}",
            cgroup.display()
        );
        assert_eq!(
            sample(&before, &series),
            Some(1.0),
            "{series} in:\n{before}"
        );
    }
    let frontends = "kpng_ebpf_map_entries{map=\"kpng_frontends\"}";
    let frontends_before = sample(&before, frontends).expect("frontends entries");
    assert!(
        frontends_before >= 2.0,
        "both Services' frontends: {before}"
    );
    assert_eq!(
        sample(&before, "kpng_ebpf_map_max_entries{map=\"kpng_frontends\"}"),
        Some(262_144.0),
        "{before}"
    );
    assert!(
        sample(&before, "kpng_ebpf_map_memory_bytes{map=\"kpng_counters\"}").is_some(),
        "{before}"
    );
    let translated = "kpng_ebpf_translations_total{hook=\"connect4\"}";
    let refused = "kpng_ebpf_refused_total{hook=\"connect4\"}";
    let translated_before = sample(&before, translated).expect("the translation counter");
    let refused_before = sample(&before, refused).expect("the refusal counter");

    let mut held = HeldConnection::open(&c.pod("pod1a").ns, cip(10, false), "pod2a");
    held.second("pod2a").expect("the connection works");
    let r = probe(
        &c.pod("pod1a").ns,
        Proto::Tcp,
        sa(cip(12, false), SVC_PORT),
        Duration::from_secs(2),
    );
    assert_outcome(&r, Outcome::Refused, "a Service without endpoints");
    let after = scrape_metrics(&c);
    let translated_after = sample(&after, translated).expect("the translation counter");
    assert!(
        translated_after > translated_before,
        "{translated}: {translated_before} then {translated_after}"
    );
    assert_eq!(
        sample(&after, refused),
        Some(refused_before + 1.0),
        "{after}"
    );

    // A new Service like the first (a change's sync, not a full one): its frontends (one per
    // family and port: TCP and UDP on IPv4 and IPv6) are counted at once. (The empty one has
    // its TCP frontends only: UDP without endpoints is the rules'.)
    let more = svc("more", 13, "ClusterIP", "", &[("pod2a", Cond::Ready)]);
    k.apply(&manifest(&[web, empty, more]));
    let applied = scrape_metrics(&c);
    assert_eq!(
        sample(&applied, frontends),
        Some(frontends_before + 4.0),
        "{applied}"
    );
}

/// A switch from eBPF to nftables on a node whose new kpng cannot see the eBPF kpng's pins
/// (another `--bpf-pin-path`, a DaemonSet without the host's `/sys/fs/bpf`): the nftables
/// kpng's sweep finds the programs that translate its node's sockets through the kernel's
/// links and detaches them. Before, it looked at its pin path and the cgroup root only, found
/// nothing, and the old programs kept sending pods to the endpoints of their frozen maps.
/// While an eBPF kpng runs, its programs are kept (its links are held open), and `kpng status`
/// of the other backend shows them as a PROBLEM.
#[test]
fn a_switch_to_nftables_detaches_programs_whose_pins_it_cannot_see() {
    require_root!();
    let c = Cluster::create(&B.prefix("switch")).expect("cluster");
    let (_echo, mut k) = ebpf_serving_web(&c);
    let both = WEB_ENDPOINTS;

    // An nftables kpng in a namespace of node1's cgroup (pod1a's) while the eBPF kpng runs:
    // the programs are that kpng's, held open, and stay; its status says they translate.
    let mut beside = Kpng::start(
        Backend::Nft,
        &c.pod("pod1a").ns,
        &manifest(&[svc("web", 10, "ClusterIP", "", &both)]),
        &[],
    );
    beside.wait_logged("the sweep keeping them", |err| {
        err.contains("kept the eBPF backend's") && err.contains("in use by a running kpng (pid ")
    });
    assert_eq!(attached(&c).len(), 9, "a running kpng's programs stay");
    let status = beside.status_json();
    let shown = status["dataPlane"].to_string();
    assert!(
        shown.contains("eBPF socket programs of another kpng") && shown.contains("kpng_connect4"),
        "{status}"
    );
    drop(beside);
    // Its rules in pod1a's namespace would answer for node1's.
    for family in ["ip", "ip6"] {
        let out = c
            .pod("pod1a")
            .ns
            .exec(["nft", "delete", "table", family, "kpng"])
            .expect("nft");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // The eBPF kpng is gone (its DaemonSet replaced); its pins, in its own directory, keep
    // its programs attached.
    k.stop();
    assert_eq!(attached(&c).len(), 9, "{:?}", attached(&c));
    let scope = node_scope(&c);
    let mut nft = Kpng::start_wrapped(
        Backend::Nft,
        &c.node1.ns,
        &manifest(&[svc("web", 10, "ClusterIP", "", &[("pod1b", Cond::Ready)])]),
        &[],
        &["env", &scope],
    );
    switched_to_nft(&c, &mut nft, "", "another kpng");
}

/// What a switch from eBPF to nftables must leave: the nftables kpng logged the detach (naming
/// `place`, where the programs were attached, when not empty), nothing is attached, pod1a
/// reaches pod1b only (pod2a left the Service with the switch: the frozen map still had it), and
/// the data-plane status no longer mentions `gone`.
fn switched_to_nft(c: &Cluster, nft: &mut Kpng<'_>, place: &str, gone: &str) {
    nft.wait_logged("the detach", |err| {
        err.contains("detached the kpng eBPF programs that translated this node's sockets")
            && err.contains("kpng_connect4 (program ")
            && err.contains(place)
    });
    assert!(attached(c).is_empty(), "{:?}", attached(c));
    let reached = spread(
        &c.pod("pod1a").ns,
        Proto::Tcp,
        sa(cip(10, false), SVC_PORT),
        8,
    );
    assert_eq!(names(&reached), set(&["pod1b"]), "{reached:?}");
    let status = nft.status_json();
    assert!(!status["dataPlane"].to_string().contains(gone), "{status}");
}

/// `KPNG_CGROUP_PATH=` node1's test group (the parent of its `local` and `outside` cgroups), for
/// a kpng of another backend: its sweep looks for kpng programs at or below that cgroup only.
/// Without it, the test hierarchy's root: every test's cgroups, and the sweep would detach the
/// programs a test running beside stopped on purpose (an adoption, a cleanup).
fn node_scope(c: &Cluster) -> String {
    let (local, _) = ebpf_scope(&c.node1.ns);
    let group = local
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or(local);
    format!("KPNG_CGROUP_PATH={}", group.display())
}

/// Puts a namespace's programs back in their cgroup when dropped (on failure too).
struct Regroup<'a>(&'a str, std::path::PathBuf);

impl Drop for Regroup<'_> {
    fn drop(&mut self) {
        let _ = kpng_testkit::cgroups::assign(self.0, &self.1);
    }
}

/// A switch from eBPF to nftables by a kpng that is not in the eBPF kpng's `--cgroup-path`
/// subtree (node1's cgroup, below the test hierarchy's root; the nftables kpng runs in node1's
/// network namespace but in the sibling cgroup): the effective programs of the root and of its
/// own cgroup do not include the subtree's, so until 2026-12-07 its sweep found nothing, and
/// the subtree's pods kept going to the endpoints of the frozen maps while `kpng status` said
/// ok. Now the sweep finds them among the kernel's links wherever they are attached, detaches
/// them, and says where they were.
#[test]
fn a_switch_detaches_programs_left_on_a_cgroup_subtree() {
    require_root!();
    let c = Cluster::create(&B.prefix("subtree")).expect("cluster");
    let (_echo, mut k) = ebpf_serving_web(&c);
    k.stop();
    assert_eq!(attached(&c).len(), 9, "{:?}", attached(&c));

    let (local, _) = ebpf_scope(&c.node1.ns);
    let outside = local.with_file_name("outside");
    kpng_testkit::cgroups::assign(c.node1.ns.name(), &outside).expect("regroup node1");
    let _back = Regroup(c.node1.ns.name(), local.clone());
    let scope = node_scope(&c);
    let mut nft = Kpng::start_wrapped(
        Backend::Nft,
        &c.node1.ns,
        &manifest(&[svc("web", 10, "ClusterIP", "", &[("pod1b", Cond::Ready)])]),
        &[],
        &["env", &scope],
    );
    let place = format!("attached to cgroup {})", local.display());
    switched_to_nft(&c, &mut nft, &place, &place);
}

/// Two nodes of one host (node1 and node2, network namespaces standing for nodes, as kind's
/// containers or parallel test runs share a kernel): node1 runs an eBPF kpng, node2 starts an
/// nftables kpng in a PID namespace of its own (a DaemonSet without `hostPID`) whose sweep
/// covers node1's cgroup (`KPNG_CGROUP_PATH`: the scope a sweep without one has too, narrowed
/// to this test's cgroups so that it leaves tests running beside alone). The links' own fds are
/// out of its sight, so until 2026-12-07 the sweep took the running kpng's links for a stopped
/// one's and detached them: node1's pods lost socket load balancing. Now a link pinned in a pin
/// directory a running kpng has locked is that kpng's: the programs stay and still translate.
#[test]
fn a_running_ebpf_kpngs_programs_survive_an_nft_kpng_of_another_node() {
    require_root!();
    let c = Cluster::create(&B.prefix("neighbour")).expect("cluster");
    let (_echo, _k) = ebpf_serving_web(&c);
    let scope = node_scope(&c);
    let mut nft = Kpng::start_wrapped(
        Backend::Nft,
        &c.node2.ns,
        &manifest(&[svc("web", 10, "ClusterIP", "", &WEB_ENDPOINTS)]),
        &[],
        &[
            "env",
            &scope,
            "RUST_LOG=info,kpng::leftovers=debug",
            "unshare",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
        ],
    );
    // The sweep found nothing of the eBPF backend's to remove.
    nft.wait_logged("its sweep", |err| {
        err.contains("no the eBPF backend's pinned programs")
            || err.contains("detached the kpng eBPF programs")
    });
    assert!(
        !nft.stderr().contains("detached the kpng eBPF programs"),
        "{}",
        nft.stderr()
    );
    assert_eq!(attached(&c).len(), 9, "{:?}", attached(&c));
    // node1's pods still go to both endpoints, translated by the programs at connect(): no
    // connection of theirs reached node1 addressed to the ClusterIP (node1's rules would DNAT
    // it, with a conntrack entry saying so).
    let reached = spread(
        &c.pod("pod1a").ns,
        Proto::Tcp,
        sa(cip(10, false), SVC_PORT),
        16,
    );
    assert_eq!(names(&reached), set(&["pod1b", "pod2a"]), "{reached:?}");
    let to_service = c
        .node1
        .ns
        .exec([
            "conntrack",
            "-L",
            "-p",
            "tcp",
            "--orig-dst",
            &cip(10, false).to_string(),
        ])
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    assert!(
        !to_service.contains(&format!("dport={SVC_PORT} ")),
        "no connection to the ClusterIP went through node1's rules: {to_service:?}"
    );
}

/// A bpffs of a test's own, with another tool's map in it, unmounted when dropped.
struct SharedBpffs(std::path::PathBuf);

impl SharedBpffs {
    fn mount(name: &str) -> SharedBpffs {
        let root = std::path::PathBuf::from(format!("/run/{name}-{}", std::process::id()));
        std::fs::create_dir_all(&root).expect("mkdir");
        let run = |args: &[&str]| {
            let out = std::process::Command::new(args[0])
                .args(&args[1..])
                .output()
                .expect("run");
            assert!(
                out.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let at = |p: &str| root.join(p).display().to_string();
        run(&["mount", "-t", "bpf", "bpf", &at("")]);
        let shared = SharedBpffs(root.clone());
        std::fs::create_dir_all(root.join("tc/globals")).expect("mkdir");
        std::fs::create_dir_all(root.join("shared")).expect("mkdir");
        let map = |path: &str, name: &str| {
            run(&[
                "bpftool",
                "map",
                "create",
                &at(path),
                "type",
                "hash",
                "key",
                "4",
                "value",
                "4",
                "entries",
                "8",
                "name",
                name,
            ]);
        };
        map("tc/globals/othertool_map", "othermap");
        map("shared/othertool", "othermap2");
        // What kpng leaves: a first-layout map in the directory itself and a layout directory.
        std::fs::create_dir_all(root.join("v3")).expect("mkdir");
        map("kpng_services", "kpng_services");
        map("v3/kpng_frontends", "kpng_frontends");
        shared
    }
}

impl Drop for SharedBpffs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// `--bpf-pin-path` on a bpffs mount root (as the docs advised until 2026-12-07) or on a
/// directory holding another tool's pins is refused at start, naming the flag and the directory
/// to use; nothing of the other tool's is touched. Before, the start removed every entry but
/// its own layout's (another tool's `tc/globals` maps) and then failed every sync on the
/// kernel's `progs.debug`, and `kpng cleanup` removed the other tool's pins too. `kpng cleanup`
/// on such a directory removes kpng's pins and keeps the rest.
#[test]
fn a_pin_path_shared_with_other_tools_is_refused_and_never_emptied() {
    require_root!();
    let c = Cluster::create(&B.prefix("pinroot")).expect("cluster");
    let bpffs = SharedBpffs::mount("kpng-e2e-pinroot");
    let root = bpffs.0.clone();
    let (cgroup, _) = ebpf_scope(&c.node1.ns);
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("cluster.yaml");
    std::fs::write(
        &input,
        manifest(&[svc("web", 10, "ClusterIP", "", &[("pod2a", Cond::Ready)])]),
    )
    .expect("write");
    let start = |pins: &std::path::Path| {
        let out = c
            .node1
            .ns
            .command([
                "timeout",
                "20",
                env!("CARGO_BIN_EXE_kpng"),
                "file",
                "--input",
            ])
            .arg(&input)
            .args([
                "--node-name",
                "node1",
                "--metrics-bind-address=",
                "--healthz-bind-address=127.0.0.1:0",
                "--admin-socket=",
                "to-local",
                "ebpf",
                "--bpf-pin-path",
            ])
            .arg(pins)
            .arg("--cgroup-path")
            .arg(&cgroup)
            .output()
            .expect("kpng");
        assert!(!out.status.success(), "{pins:?} was taken");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let kept = |when: &str| {
        for foreign in ["tc/globals/othertool_map", "shared/othertool"] {
            assert!(root.join(foreign).exists(), "{foreign} removed {when}");
        }
    };
    let said = start(&root);
    assert!(
        said.contains(&format!(
            "--bpf-pin-path {} is the root of a BPF file system",
            root.display()
        )) && said.contains(&format!("pass --bpf-pin-path {}/kpng", root.display())),
        "{said}"
    );
    kept("by a start on the mount root");
    let said = start(&root.join("shared"));
    assert!(
        said.contains("holds entries kpng did not create (othertool)")
            && said.contains(&format!("pass --bpf-pin-path {}/kpng", root.display())),
        "{said}"
    );
    kept("by a start on a shared directory");
    assert!(attached(&c).is_empty(), "{:?}", attached(&c));

    // `kpng cleanup` on the mount root: kpng's pins go, the other tool's stay.
    let out = c
        .node1
        .ns
        .command([
            env!("CARGO_BIN_EXE_kpng"),
            "cleanup",
            "--kpng-only",
            "--bpf-pin-path",
        ])
        .arg(&root)
        .arg("--cgroup-path")
        .arg(&cgroup)
        .output()
        .expect("kpng cleanup");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    for gone in ["kpng_services", "v3"] {
        assert!(!root.join(gone).exists(), "{gone} kept: {said}");
    }
    kept("by kpng cleanup");
    assert!(root.exists(), "{said}");
}
