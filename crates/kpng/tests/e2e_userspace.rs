//! Real-packet end-to-end tests of `kpng … to-local userspace`: what only a userspace proxy
//! does (or does differently) on top of the shared suite.
//!
//! Every test builds a throw-away two-node cluster of network namespaces
//! (`kpng_testkit::Cluster`), runs `kpng` in node1 on a manifest file it watches, starts echo
//! servers in the pods and checks where real TCP/UDP traffic ends up. Root only (skipped
//! otherwise, failing under `CI`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kpng_testkit::{
    Cluster, Netns, Outcome, Probe, ProbeResult, Proto, Spawned, addr, require_root, tally,
};

/// Port every echo server listens on (TCP and UDP); the EndpointSlice port.
const EP_PORT: u16 = 8080;
/// Service port of every test Service (TCP and UDP).
const SVC_PORT: u16 = 80;
/// Timeout of a probe that should be answered.
const OK_T: Duration = Duration::from_secs(2);
/// Timeout of a probe that should be dropped.
const DROP_T: Duration = Duration::from_millis(400);
/// Timeout of a probe that should be refused.
const REJECT_T: Duration = Duration::from_millis(1500);

const NODES: &str = r#"apiVersion: v1
kind: Node
metadata: {name: node1}
spec: {podCIDRs: [10.244.1.0/24, "fd00:244:1::/64"]}
status:
  addresses:
  - {type: InternalIP, address: 192.168.100.1}
  - {type: InternalIP, address: "fd00:100::1"}
"#;

fn pod_ips(pod: &str) -> (IpAddr, IpAddr, &'static str) {
    match pod {
        "pod1a" => (addr::POD1A_V4.into(), addr::POD1A_V6.into(), "node1"),
        "pod1b" => (addr::POD1B_V4.into(), addr::POD1B_V6.into(), "node1"),
        "pod2a" => (addr::POD2A_V4.into(), addr::POD2A_V6.into(), "node2"),
        other => panic!("unknown pod {other}"),
    }
}

/// ClusterIP number `n` (`10.96.0.N`, `fd00:96::N` in hex).
fn cip(n: u8, v6: bool) -> IpAddr {
    if v6 {
        format!("fd00:96::{n:x}").parse().expect("v6 cluster IP")
    } else {
        format!("10.96.0.{n}").parse().expect("v4 cluster IP")
    }
}

fn node_port(n: u8) -> u16 {
    30000 + u16::from(n)
}

/// A dual-stack Service `name` (ClusterIPs number `n`, TCP and UDP 80 → 8080, node ports
/// `30000+n` unless ClusterIP) with EndpointSlices for `pods` (all ready); `extra` goes into
/// the spec.
fn svc(name: &str, n: u8, ty: &str, extra: &str, pods: &[&str]) -> String {
    let np = if ty == "ClusterIP" {
        String::new()
    } else {
        format!(", nodePort: {}", node_port(n))
    };
    let extra = if extra.is_empty() {
        String::new()
    } else {
        format!(", {extra}")
    };
    let mut s = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{namespace: default, name: {name}}}\n\
         spec: {{type: {ty}, clusterIP: {v4}, clusterIPs: [{v4}, \"{v6}\"], \
         ipFamilies: [IPv4, IPv6], ipFamilyPolicy: RequireDualStack, ports: [\
         {{name: tcp, port: {SVC_PORT}, protocol: TCP, targetPort: {EP_PORT}{np}}}, \
         {{name: udp, port: {SVC_PORT}, protocol: UDP, targetPort: {EP_PORT}{np}}}]{extra}}}\n",
        v4 = cip(n, false),
        v6 = cip(n, true),
    );
    for (fam, v6) in [("IPv4", false), ("IPv6", true)] {
        s.push_str(&format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{namespace: default, name: {name}-{fam}, \
             labels: {{kubernetes.io/service-name: {name}}}}}\n\
             addressType: {fam}\n\
             ports: [{{name: tcp, port: {EP_PORT}, protocol: TCP}}, \
             {{name: udp, port: {EP_PORT}, protocol: UDP}}]\nendpoints:{}\n",
            if pods.is_empty() { " []" } else { "" }
        ));
        for pod in pods {
            let (ip4, ip6, node) = pod_ips(pod);
            let ip = if v6 { ip6 } else { ip4 };
            s.push_str(&format!(
                "- {{addresses: [\"{ip}\"], nodeName: {node}, conditions: {{ready: true}}}}\n"
            ));
        }
    }
    s
}

fn manifest(objects: &[String]) -> String {
    let mut s = NODES.to_owned();
    for o in objects {
        s.push_str("---\n");
        s.push_str(o);
    }
    s
}

fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write manifest");
    std::fs::rename(&tmp, path).expect("rename manifest");
}

/// `kpng … to-local userspace` running in node1 on a manifest file it watches.
struct Kpng<'a> {
    ns: &'a Netns,
    args: Vec<String>,
    input: PathBuf,
    proc: Option<Spawned>,
    _dir: tempfile::TempDir,
}

impl<'a> Kpng<'a> {
    #[track_caller]
    fn start(ns: &'a Netns, manifest: &str) -> Kpng<'a> {
        let dir = tempfile::tempdir().expect("tempdir");
        let input = dir.path().join("cluster.yaml");
        write_atomically(&input, manifest);
        let args: Vec<String> = [
            env!("CARGO_BIN_EXE_kpng"),
            "file",
            "--input",
            &input.display().to_string(),
            "--node-name",
            "node1",
            "--cluster-cidr",
            &format!("{},{}", addr::CLUSTER_CIDR_V4, addr::CLUSTER_CIDR_V6),
            "--service-cidr",
            &format!("{},{}", addr::SERVICE_CIDR_V4, addr::SERVICE_CIDR_V6),
            "--min-sync-period",
            "0",
            "--healthz-bind-address",
            "127.0.0.1:10256",
            "--metrics-bind-address",
            "127.0.0.1:10249",
            "to-local",
            "userspace",
            "--udp-timeout",
            "2s",
        ]
        .map(String::from)
        .to_vec();
        let mut k = Kpng {
            ns,
            proc: Some(ns.spawn(&args).expect("start kpng")),
            args,
            input,
            _dir: dir,
        };
        k.wait_synced(0);
        k
    }

    /// Kills kpng and starts it again on the same file; waits for its first sync.
    #[track_caller]
    fn restart(&mut self) {
        if let Some(p) = self.proc.take() {
            p.kill().expect("kill kpng");
        }
        self.proc = Some(self.ns.spawn(&self.args).expect("restart kpng"));
        self.wait_synced(0);
    }

    fn stderr(&self) -> String {
        self.proc
            .as_ref()
            .map(Spawned::stderr_text)
            .unwrap_or_default()
    }

    fn synced(&self) -> usize {
        let err = self.stderr();
        assert!(!err.contains("sync failed"), "kpng failed to sync:\n{err}");
        err.matches("synced backend=userspace").count()
    }

    #[track_caller]
    fn wait_synced(&mut self, before: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.synced() <= before {
            if let Some(p) = self.proc.as_mut()
                && let Ok(Some(status)) = p.try_wait()
            {
                panic!("kpng exited ({status}):\n{}", self.stderr());
            }
            assert!(
                Instant::now() < deadline,
                "no sync within 10 s:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Replaces the cluster state and waits until kpng synced it.
    #[track_caller]
    fn apply(&mut self, manifest: &str) {
        let before = self.synced();
        write_atomically(&self.input, manifest);
        self.wait_synced(before);
    }
}

fn echo_all(c: &Cluster) -> Vec<Spawned> {
    c.pods
        .iter()
        .map(|p| p.start_echo(EP_PORT).expect("echo"))
        .collect()
}

fn sa(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}

fn probe(ns: &Netns, proto: Proto, target: SocketAddr, t: Duration) -> ProbeResult {
    ns.probe_one(&Probe::new(proto, target).timeout(t))
        .expect("run kpng-probe")
}

fn probes(ns: &Netns, proto: Proto, target: SocketAddr, n: usize) -> Vec<ProbeResult> {
    ns.probe(
        &Probe::new(proto, target)
            .count(n)
            .fresh_socket(true)
            .timeout(OK_T),
    )
    .expect("run kpng-probe")
}

fn spread(ns: &Netns, proto: Proto, target: SocketAddr, n: usize) -> BTreeMap<String, usize> {
    tally(&probes(ns, proto, target, n))
}

fn names(m: &BTreeMap<String, usize>) -> BTreeSet<&str> {
    m.keys().map(String::as_str).collect()
}

fn set<'s>(v: &[&'s str]) -> BTreeSet<&'s str> {
    v.iter().copied().collect()
}

/// node1's addresses: what every endpoint sees as the client of a userspace proxy.
const NODE1_IPS: [IpAddr; 4] = [
    IpAddr::V4(addr::NODE1_LAN_V4),
    IpAddr::V4(addr::NODE1_POD_GW_V4),
    IpAddr::V6(addr::NODE1_LAN_V6),
    IpAddr::V6(addr::NODE1_POD_GW_V6),
];

/// Asserts an answer from one of `servers`, which saw node1 as the client.
#[track_caller]
fn assert_proxied(r: &ProbeResult, servers: &[&str]) {
    assert_eq!(
        r.outcome,
        Outcome::Ok,
        "expected an answer from {servers:?}: {r}"
    );
    let name = r.server_name.as_deref().unwrap_or("?");
    assert!(servers.contains(&name), "expected one of {servers:?}: {r}");
    let seen = r
        .client_addr_seen_by_server
        .expect("echo names the client")
        .ip();
    assert!(
        NODE1_IPS.contains(&seen),
        "the proxy (node1) is the client: {r}"
    );
}

#[track_caller]
fn assert_outcome(r: &ProbeResult, expected: Outcome, what: &str) {
    assert_eq!(r.outcome, expected, "{what}: {r}");
}

/// The listener ports kpng's capture redirects to, from its nft maps in `ns`.
fn listener_ports(ns: &Netns) -> Vec<u16> {
    let out = ns
        .run_ok([
            "nft",
            "list",
            "map",
            "ip",
            "kpng-userspace",
            "vip-listeners",
        ])
        .expect("list the capture map");
    out.split(" : ")
        .skip(1)
        .filter_map(|s| {
            s.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .ok()
        })
        .collect()
}

// ---------------------------------------------------------------------------------------

#[test]
fn cluster_ip_tcp_and_udp_spread_over_every_endpoint_from_everywhere() {
    require_root!();
    let c = Cluster::create("us-cip").expect("cluster");
    let _echo = echo_all(&c);
    let _k = Kpng::start(
        &c.node1.ns,
        &manifest(&[svc(
            "web",
            10,
            "ClusterIP",
            "",
            &["pod1a", "pod1b", "pod2a"],
        )]),
    );
    let all = ["pod1a", "pod1b", "pod2a"];
    let clients = [
        ("pod1a", &c.pod("pod1a").ns),
        ("node1", &c.node1.ns),
        ("ext", &c.ext.ns),
    ];
    for (who, ns) in clients {
        for proto in [Proto::Tcp, Proto::Udp] {
            for v6 in [false, true] {
                let results = probes(ns, proto, sa(cip(10, v6), SVC_PORT), 9);
                assert_eq!(
                    names(&tally(&results)),
                    set(&all),
                    "{who} {proto} v6={v6}: round robin reaches every endpoint: {:?}",
                    tally(&results)
                );
                for r in &results {
                    assert_proxied(r, &all);
                }
            }
        }
    }
}

#[test]
fn node_port_external_ip_and_no_endpoints() {
    require_root!();
    let c = Cluster::create("us-np").expect("cluster");
    let _echo = echo_all(&c);
    let _k = Kpng::start(
        &c.node1.ns,
        &manifest(&[
            svc(
                "web",
                10,
                "NodePort",
                "externalIPs: [198.51.100.10]",
                &["pod1a", "pod2a"],
            ),
            svc("empty", 20, "NodePort", "", &[]),
        ]),
    );
    let two = ["pod1a", "pod2a"];
    let np = |v6: bool, n: u8| sa(c.node1.lan_ip(v6), node_port(n));
    for proto in [Proto::Tcp, Proto::Udp] {
        for target in [
            np(false, 10),
            np(true, 10),
            sa("198.51.100.10".parse().expect("ip"), SVC_PORT),
        ] {
            let m = spread(&c.ext.ns, proto, target, 6);
            assert_eq!(names(&m), set(&two), "ext {proto} {target}: {m:?}");
        }
        // From the node itself, on its own address.
        let m = spread(&c.node1.ns, proto, np(false, 10), 6);
        assert_eq!(names(&m), set(&two), "node1 {proto} node port: {m:?}");
    }
    // Never on loopback.
    let r = probe(
        &c.node1.ns,
        Proto::Tcp,
        sa("127.0.0.1".parse().expect("ip"), node_port(10)),
        REJECT_T,
    );
    assert_outcome(
        &r,
        Outcome::Refused,
        "node port on 127.0.0.1 (nothing listens there)",
    );
    // No endpoints: refused by the capture, on the ClusterIP and the node port.
    for (proto, target) in [
        (Proto::Tcp, sa(cip(20, false), SVC_PORT)),
        (Proto::Tcp, sa(cip(20, true), SVC_PORT)),
        (Proto::Udp, sa(cip(20, false), SVC_PORT)),
        (Proto::Tcp, np(false, 20)),
        (Proto::Udp, np(false, 20)),
    ] {
        let r = probe(&c.ext.ns, proto, target, REJECT_T);
        assert_outcome(
            &r,
            Outcome::Refused,
            &format!("ext {proto} {target} without endpoints"),
        );
    }
}

#[test]
fn external_traffic_policy_local_serves_outside_locally_and_short_circuits_pods_and_the_node() {
    require_root!();
    let c = Cluster::create("us-etp").expect("cluster");
    let _echo = echo_all(&c);
    let etp = "externalTrafficPolicy: Local";
    let _k = Kpng::start(
        &c.node1.ns,
        &manifest(&[
            svc("local", 50, "NodePort", etp, &["pod1a", "pod2a"]),
            svc("remote", 51, "NodePort", etp, &["pod2a"]),
        ]),
    );
    let np = |n: u8| sa(c.node1.lan_ip(false), node_port(n));
    for proto in [Proto::Tcp, Proto::Udp] {
        let m = spread(&c.ext.ns, proto, np(50), 8);
        assert_eq!(
            names(&m),
            set(&["pod1a"]),
            "ext {proto}: local endpoints only: {m:?}"
        );
        for (who, ns) in [("pod1b", &c.pod("pod1b").ns), ("node1", &c.node1.ns)] {
            let m = spread(ns, proto, np(50), 8);
            assert_eq!(
                names(&m),
                set(&["pod1a", "pod2a"]),
                "{who} {proto}: every endpoint: {m:?}"
            );
        }
    }
    // No local endpoint: dropped from outside, served to pods and the node.
    let r = probe(&c.ext.ns, Proto::Tcp, np(51), DROP_T);
    assert_outcome(&r, Outcome::Timeout, "ext, no local endpoint");
    for ns in [&c.pod("pod1b").ns, &c.node1.ns] {
        assert_proxied(&probe(ns, Proto::Tcp, np(51), OK_T), &["pod2a"]);
    }
}

#[test]
fn listeners_are_reachable_only_through_service_addresses() {
    require_root!();
    let c = Cluster::create("us-guard").expect("cluster");
    let _echo = echo_all(&c);
    let _k = Kpng::start(
        &c.node1.ns,
        &manifest(&[svc("web", 10, "ClusterIP", "", &["pod1a"])]),
    );
    let ports = listener_ports(&c.node1.ns);
    assert_eq!(ports.len(), 2, "one TCP and one UDP listener: {ports:?}");
    assert_proxied(
        &probe(&c.ext.ns, Proto::Tcp, sa(cip(10, false), SVC_PORT), OK_T),
        &["pod1a"],
    );
    for port in ports {
        for (who, ns) in [("ext", &c.ext.ns), ("node1", &c.node1.ns)] {
            let r = probe(ns, Proto::Tcp, sa(c.node1.lan_ip(false), port), DROP_T);
            assert_ne!(
                r.outcome,
                Outcome::Ok,
                "{who} reached listener port {port} directly: {r}"
            );
        }
    }
}

#[test]
fn client_ip_affinity_sticks_across_connections_and_ways_in() {
    require_root!();
    let c = Cluster::create("us-aff").expect("cluster");
    let _echo = echo_all(&c);
    let _k = Kpng::start(
        &c.node1.ns,
        &manifest(&[svc(
            "sticky",
            10,
            "NodePort",
            "sessionAffinity: ClientIP",
            &["pod1a", "pod1b", "pod2a"],
        )]),
    );
    for proto in [Proto::Tcp, Proto::Udp] {
        let mut seen = BTreeMap::new();
        for target in [
            sa(cip(10, false), SVC_PORT),
            sa(c.node1.lan_ip(false), node_port(10)),
        ] {
            for (name, n) in spread(&c.ext.ns, proto, target, 8) {
                *seen.entry(name).or_insert(0) += n;
            }
        }
        assert_eq!(
            seen.len(),
            1,
            "{proto}: one endpoint for the client: {seen:?}"
        );
        assert_eq!(seen.values().sum::<usize>(), 16, "{proto}: {seen:?}");
    }
}

#[test]
fn live_changes_drain_established_connections() {
    require_root!();
    let c = Cluster::create("us-live").expect("cluster");
    let _echo: Vec<Spawned> = ["pod1a", "pod2a"]
        .iter()
        .map(|p| c.pod(p).start_echo(EP_PORT).expect("echo"))
        .collect();
    let mut line_server = c
        .pod("pod1b")
        .ns
        .spawn([
            "python3",
            "-c",
            LINE_SERVER,
            "pod1b",
            "10.244.1.3",
            &EP_PORT.to_string(),
        ])
        .expect("python3 line server");
    line_server
        .wait_for_line(|l| l == "ready", Duration::from_secs(10))
        .expect("line server ready");
    let mut k = Kpng::start(
        &c.node1.ns,
        &manifest(&[svc("live", 10, "ClusterIP", "", &["pod1b"])]),
    );
    let target = sa(cip(10, false), SVC_PORT);

    // A connection to pod1b, held open.
    let dir = tempfile::tempdir().expect("tempdir");
    let go = dir.path().join("go");
    let mut held = c
        .ext
        .ns
        .spawn([
            "python3",
            "-c",
            LINE_CLIENT,
            &cip(10, false).to_string(),
            &SVC_PORT.to_string(),
            &go.display().to_string(),
        ])
        .expect("python3 line client");
    held.wait_for_line(|l| l == "got pod1b one", Duration::from_secs(5))
        .expect("first line over the held connection");

    // pod1b leaves, two others come: new traffic goes to them only.
    k.apply(&manifest(&[svc(
        "live",
        10,
        "ClusterIP",
        "",
        &["pod1a", "pod2a"],
    )]));
    for proto in [Proto::Tcp, Proto::Udp] {
        let m = spread(&c.ext.ns, proto, target, 8);
        assert_eq!(
            names(&m),
            set(&["pod1a", "pod2a"]),
            "{proto} after the change: {m:?}"
        );
    }
    // The established connection still reaches pod1b (graceful drain).
    std::fs::write(&go, "").expect("signal the client");
    held.wait_for_line(|l| l == "got pod1b two", Duration::from_secs(5))
        .expect("second line over the held connection after its endpoint left");

    // The Service goes: its address is an unallocated Service IP now (dropped).
    k.apply(&manifest(&[]));
    let r = probe(&c.ext.ns, Proto::Tcp, target, DROP_T);
    assert_outcome(&r, Outcome::Timeout, "removed Service");
}

#[test]
fn a_restart_keeps_udp_flows_on_their_listener_ports() {
    require_root!();
    let c = Cluster::create("us-restart").expect("cluster");
    let _echo = echo_all(&c);
    let mut k = Kpng::start(
        &c.node1.ns,
        &manifest(&[svc("dns", 10, "NodePort", "", &["pod1a", "pod2a"])]),
    );
    let before = listener_ports(&c.node1.ns);

    // One UDP socket sending all along: its conntrack entry outlives the restart.
    let dir = tempfile::tempdir().expect("tempdir");
    let (mark, stop) = (dir.path().join("mark"), dir.path().join("stop"));
    let mut client = c
        .ext
        .ns
        .spawn([
            "python3",
            "-c",
            UDP_CLIENT,
            &cip(10, false).to_string(),
            &SVC_PORT.to_string(),
            &mark.display().to_string(),
            &stop.display().to_string(),
        ])
        .expect("python3 UDP client");
    client
        .wait_for_line(|l| l.starts_with("got "), Duration::from_secs(5))
        .expect("an answer before the restart");

    k.restart();
    assert_eq!(
        listener_ports(&c.node1.ns),
        before,
        "the listeners took their ports again"
    );
    std::fs::write(&mark, "").expect("mark");
    client
        .wait_for_line(|l| l == "mark", Duration::from_secs(5))
        .expect("the client saw the mark");
    client
        .wait_for_line(|l| l.starts_with("got "), Duration::from_secs(5))
        .expect("answers on the same socket after the restart");
    std::fs::write(&stop, "").expect("stop");
    // New TCP connections work too, on every way in.
    for target in [
        sa(cip(10, false), SVC_PORT),
        sa(c.node1.lan_ip(false), node_port(10)),
    ] {
        assert_proxied(
            &probe(&c.ext.ns, Proto::Tcp, target, OK_T),
            &["pod1a", "pod2a"],
        );
    }
}

/// Sends a datagram every 50 ms from one connected socket and prints `got NAME` or `miss`;
/// prints `mark` once file `argv[3]` exists, and stops when file `argv[4]` exists.
const UDP_CLIENT: &str = r#"
import os, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(0.2)
s.connect((sys.argv[1], int(sys.argv[2])))
marked = False
while not os.path.exists(sys.argv[4]):
    if not marked and os.path.exists(sys.argv[3]):
        marked = True; print("mark", flush=True)
    try:
        s.send(b"x"); print("got", s.recv(200).decode().split()[0], flush=True)
    except OSError:
        print("miss", flush=True)
    time.sleep(0.05)
"#;

/// An echo server that keeps TCP connections open and answers every line with `NAME LINE`.
const LINE_SERVER: &str = r#"
import socket, sys, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[2], int(sys.argv[3]))); s.listen(16)
print("ready", flush=True)
def serve(c):
    for line in c.makefile("rb"):
        c.sendall(sys.argv[1].encode() + b" " + line)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// A client that opens one TCP connection, exchanges a line, waits until file `argv[3]`
/// exists and exchanges another line on the same connection.
const LINE_CLIENT: &str = r#"
import os, socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
f = c.makefile("rb")
c.sendall(b"one\n"); print("got", f.readline().decode().strip(), flush=True)
while not os.path.exists(sys.argv[3]): time.sleep(0.02)
c.sendall(b"two\n"); print("got", f.readline().decode().strip(), flush=True)
"#;
