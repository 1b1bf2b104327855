//! Real-packet end-to-end tests of the UDP conntrack cleanup of `kpng … to-local <backend>`, for
//! every backend that DNATs in the kernel (nft, iptables-legacy, iptables-nft, and ebpf's
//! nftables half, which serves every flow that does not come from a socket its programs
//! translate: here the pods', see [`ebpf_node_only`]).
//!
//! A long-lived UDP client keeps sending on ONE connected socket (one conntrack entry, as
//! DNS and statsd clients do) to a Service of a throw-away cluster (`kpng_testkit::Cluster`,
//! kpng in node1 on a manifest file it watches), while the Service's endpoints change under
//! it. Without the cleanup every packet would follow the entry's first DNAT decision for as
//! long as the client keeps sending. Root only (skipped otherwise, failing under `CI`).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kpng_testkit::{
    Cluster, Netns, Outcome, Probe, ProbeResult, Spawned, addr, bin_path, require_root,
};

/// Port of every echo server (the EndpointSlice port) and of the Service.
const EP_PORT: u16 = 8080;
const SVC_PORT: u16 = 53;
/// How long the client takes at most to reach the new endpoint after a sync.
const WITHIN: Duration = Duration::from_secs(3);

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

fn cip(n: u8, v6: bool) -> IpAddr {
    if v6 {
        format!("fd00:96::{n:x}").parse().expect("v6 cluster IP")
    } else {
        format!("10.96.0.{n}").parse().expect("v4 cluster IP")
    }
}

/// A dual-stack UDP Service `name` (ClusterIPs number `n`, port 53 → 8080, node port
/// `30000+n`) and its EndpointSlices with these (ready) pods.
fn udp_service(name: &str, n: u8, pods: &[&str]) -> String {
    let mut out = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{namespace: default, name: {name}}}\n\
         spec: {{type: NodePort, clusterIP: {v4}, clusterIPs: [{v4}, \"{v6}\"], \
         ipFamilies: [IPv4, IPv6], ipFamilyPolicy: RequireDualStack, ports: [\
         {{name: dns, port: {SVC_PORT}, protocol: UDP, targetPort: {EP_PORT}, nodePort: {np}}}]}}\n",
        v4 = cip(n, false),
        v6 = cip(n, true),
        np = 30000 + u16::from(n),
    );
    for (fam, v6) in [("IPv4", false), ("IPv6", true)] {
        // Slice names are DNS-1123 subdomains: lower case, as the API server requires.
        let fam_lower = fam.to_lowercase();
        out.push_str(&format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{namespace: default, name: {name}-{fam_lower}, \
             labels: {{kubernetes.io/service-name: {name}}}}}\n\
             addressType: {fam}\nports: [{{name: dns, port: {EP_PORT}, protocol: UDP}}]\nendpoints:"
        ));
        if pods.is_empty() {
            out.push_str(" []");
        }
        out.push('\n');
        for pod in pods {
            let (ip4, ip6, node) = pod_ips(pod);
            let ip = if v6 { ip6 } else { ip4 };
            out.push_str(&format!("- {{addresses: [\"{ip}\"], nodeName: {node}}}\n"));
        }
    }
    out
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

/// `kpng file … to-local <backend>` in node1 on a manifest it watches.
struct Kpng {
    proc: Spawned,
    input: PathBuf,
    /// The eBPF backend's pins (dropped after `proc`, which is killed first).
    _pins: Option<Pins>,
    _dir: tempfile::TempDir,
}

/// The eBPF backend's pin directory, removed when the test ends: the pins keep the programs
/// attached after kpng is gone.
struct Pins(PathBuf);

impl Drop for Pins {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The eBPF backend's scope for these tests: its programs translate the sockets of node1's
/// own processes only (a group of their own, as `--cgroup-path` on a host's system slice
/// would), so the pods' UDP flows go through its nftables half like traffic from outside the
/// node, and that half's conntrack cleanup is what moves them. Returns (the group, the pin
/// directory); both go when the test's namespaces do (the group) or its kpng does (the pins).
fn ebpf_node_only(ns: &Netns) -> (PathBuf, PathBuf) {
    use kpng_testkit::cgroups;
    let group = cgroups::create(&format!("{}/node-only", ns.name())).expect("cgroup");
    cgroups::assign(ns.name(), &group).expect("node1 in its group");
    cgroups::bpffs().expect("test bpffs");
    (group, cgroups::socket_pins(ns.name()))
}

impl Kpng {
    #[track_caller]
    fn start(ns: &Netns, manifest: &str, sink: &[&str]) -> Kpng {
        let dir = tempfile::tempdir().expect("tempdir");
        let input = dir.path().join("cluster.yaml");
        write_atomically(&input, manifest);
        let mut args: Vec<String> = [
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
            "",
            // No admin socket: these tests kill kpng, which would leave it in /run/kpng.
            "--admin-socket",
            "",
        ]
        .map(String::from)
        .to_vec();
        args.extend(sink.iter().map(|a| (*a).to_owned()));
        let pins = (sink.get(1) == Some(&"ebpf")).then(|| {
            let (group, pins) = ebpf_node_only(ns);
            args.extend([
                "--cgroup-path".to_owned(),
                group.display().to_string(),
                "--bpf-pin-path".to_owned(),
                pins.display().to_string(),
            ]);
            Pins(pins)
        });
        let mut k = Kpng {
            proc: ns.spawn(&args).expect("start kpng"),
            input,
            _pins: pins,
            _dir: dir,
        };
        k.wait_synced(0);
        k
    }

    fn syncs(&self) -> usize {
        self.proc.stderr_text().matches("synced backend=").count()
    }

    #[track_caller]
    fn wait_synced(&mut self, before: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.syncs() <= before {
            let err = self.proc.stderr_text();
            assert!(!err.contains("sync failed"), "kpng failed to sync:\n{err}");
            if let Ok(Some(status)) = self.proc.try_wait() {
                panic!("kpng exited ({status}):\n{err}");
            }
            assert!(Instant::now() < deadline, "kpng did not sync:\n{err}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// kpng's log once it holds `needle` (a line logged a moment after a sync: the first
    /// pass's, say); panics after 5 s.
    #[track_caller]
    fn log_with(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let log = self.proc.stderr_text();
            if log.contains(needle) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "no {needle:?} in kpng's log:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Rewrite the manifest and wait until kpng synced it.
    #[track_caller]
    fn apply(&mut self, manifest: &str) {
        let before = self.syncs();
        write_atomically(&self.input, manifest);
        self.wait_synced(before);
    }
}

/// A UDP client sending one datagram every 20 ms on one connected socket, reporting each
/// answer (or failure) as it comes.
struct Client {
    proc: Spawned,
    target: SocketAddr,
}

impl Client {
    #[track_caller]
    fn start(ns: &Netns, target: SocketAddr) -> Client {
        let probe = Probe::udp(target)
            .count(100_000)
            .interval(Duration::from_millis(20))
            .timeout(Duration::from_millis(150));
        let bin = bin_path("kpng-probe").expect("kpng-probe");
        let mut args = vec![bin.display().to_string()];
        args.extend(probe.args());
        Client {
            proc: ns.spawn(&args).expect("start the UDP client"),
            target,
        }
    }

    /// The next attempt's result.
    #[track_caller]
    fn next(&mut self) -> ProbeResult {
        let line = self
            .proc
            .wait_for_line(|_| true, Duration::from_secs(5))
            .expect("client output");
        ProbeResult::from_json_line(&line).expect("probe line")
    }

    /// Waits until an answer comes from `server` (within `within`); returns the client's
    /// socket address seen in it.
    #[track_caller]
    fn wait_for(&mut self, server: &str, within: Duration) -> SocketAddr {
        let deadline = Instant::now() + within;
        let mut seen = Vec::new();
        loop {
            let r = self.next();
            if r.outcome == Outcome::Ok && r.server_name.as_deref() == Some(server) {
                return r.client_addr.expect("client address");
            }
            seen.push(r.to_string());
            assert!(
                Instant::now() < deadline,
                "{}: no answer from {server} within {within:?}; the last {} answers: {:?}",
                self.target,
                seen.len().min(5),
                &seen[seen.len().saturating_sub(5)..]
            );
        }
    }

    /// Waits until an attempt fails (nothing answers any more).
    #[track_caller]
    fn wait_for_failure(&mut self, within: Duration) -> ProbeResult {
        let deadline = Instant::now() + within;
        loop {
            let r = self.next();
            if r.outcome != Outcome::Ok {
                return r;
            }
            assert!(
                Instant::now() < deadline,
                "{}: still answered after {within:?}: {r}",
                self.target
            );
        }
    }

    /// The next `n` attempts are all answered by `server`.
    #[track_caller]
    fn all_from(&mut self, server: &str, n: usize) {
        for _ in 0..n {
            let r = self.next();
            assert_eq!(
                r.server_name.as_deref(),
                Some(server),
                "{}: expected only {server}: {r}",
                self.target
            );
        }
    }
}

/// `conntrack -L` lines in `ns` (UDP, one family) that contain every one of `needles`.
fn conntrack_lines(ns: &Netns, v6: bool, needles: &[String]) -> Vec<String> {
    let family = if v6 { "ipv6" } else { "ipv4" };
    let out = ns
        .run_ok(["conntrack", "-L", "-p", "udp", "-f", family, "-o", "id"])
        .expect("conntrack -L");
    out.lines()
        .filter(|l| needles.iter().all(|n| l.contains(n.as_str())))
        .map(str::to_owned)
        .collect()
}

/// The `id=` of the one entry matching `needles`.
#[track_caller]
fn entry_id(ns: &Netns, v6: bool, needles: &[String]) -> String {
    let lines = conntrack_lines(ns, v6, needles);
    assert_eq!(lines.len(), 1, "one entry for {needles:?}: {lines:#?}");
    lines[0]
        .split_whitespace()
        .find(|w| w.starts_with("id="))
        .expect("conntrack -o id prints id=")
        .to_owned()
}

/// The `conntrack -L` field of a client's source port (with the separator, so that port
/// 4000 does not match 40001).
fn port_of(a: SocketAddr) -> String {
    format!("sport={} ", a.port())
}

/// Makes node1 track what crosses it when no kpng rule is in place, as a node whose CNI uses
/// conntrack does (a forward rule that matches `ct state`): without such a user, a datagram
/// that meets no rule of kpng's leaves no entry.
fn track_without_kpng(c: &Cluster) {
    c.node1
        .ns
        .nft(
            "table inet cni {\n chain forward {\n  type filter hook forward priority 0;\n  \
             ct state established,related accept\n }\n}\n",
        )
        .expect("a conntrack user in node1");
}

/// The `conntrack -L` needles of `client`'s entry to `vip`, never DNATed: its reply comes
/// from the Service IP itself.
fn unnated_entry(vip: IpAddr, client: SocketAddr) -> [String; 3] {
    [
        format!("dst={vip} "),
        port_of(client),
        format!("src={vip} "),
    ]
}

fn a_udp_client_follows_a_replaced_endpoint_and_unrelated_flows_survive(sink: &[&str]) {
    require_root!();
    let c = Cluster::create("ct-rep").expect("cluster");
    let _echo: Vec<Spawned> = c
        .pods
        .iter()
        .map(|p| p.start_echo(EP_PORT).expect("echo"))
        .collect();
    let mut k = Kpng::start(
        &c.node1.ns,
        &manifest(&[
            udp_service("dns", 30, &["pod1a"]),
            udp_service("other", 31, &["pod2a"]),
        ]),
        sink,
    );
    let client = c.pod("pod1b");
    let mut dns: Vec<Client> = [false, true]
        .map(|v6| Client::start(&client.ns, SocketAddr::new(cip(30, v6), SVC_PORT)))
        .into();
    for d in &mut dns {
        d.wait_for("pod1a", WITHIN);
    }
    // Unrelated flows of the same client: through another UDP Service that does not change,
    // and straight to a pod. Their entries must be the same ones after the cleanup.
    let mut other = Client::start(&client.ns, SocketAddr::new(cip(31, false), SVC_PORT));
    let other_src = other.wait_for("pod2a", WITHIN);
    let mut direct = Client::start(&client.ns, c.pod("pod2a").addr_v4(EP_PORT));
    let direct_src = direct.wait_for("pod2a", WITHIN);
    let other_entry = [format!("dst={}", cip(31, false)), port_of(other_src)];
    let direct_entry = [format!("dst={}", addr::POD2A_V4), port_of(direct_src)];
    let ids_before = (
        entry_id(&c.node1.ns, false, &other_entry),
        entry_id(&c.node1.ns, false, &direct_entry),
    );

    // pod1a is replaced by pod2a while the clients keep sending (pod1a still answers: only
    // the cleanup moves the clients).
    k.apply(&manifest(&[
        udp_service("dns", 30, &["pod2a"]),
        udp_service("other", 31, &["pod2a"]),
    ]));
    for d in &mut dns {
        d.wait_for("pod2a", WITHIN);
        d.all_from("pod2a", 10);
    }
    other.all_from("pod2a", 5);
    direct.all_from("pod2a", 5);
    let ids_after = (
        entry_id(&c.node1.ns, false, &other_entry),
        entry_id(&c.node1.ns, false, &direct_entry),
    );
    assert_eq!(ids_before, ids_after, "unrelated entries were deleted");
    // Logged once the deletions are done, which the clients may see first (panics after 5 s).
    k.log_with("deleted stale UDP conntrack entries");
}

fn a_udp_service_scaled_to_zero_and_back_serves_its_clients_again(sink: &[&str]) {
    require_root!();
    let c = Cluster::create("ct-zero").expect("cluster");
    let mut echo1a = Some(c.pod("pod1a").start_echo(EP_PORT).expect("echo"));
    let _echo2a = c.pod("pod2a").start_echo(EP_PORT).expect("echo");
    let mut k = Kpng::start(
        &c.node1.ns,
        &manifest(&[udp_service("stats", 40, &["pod1a"])]),
        sink,
    );
    let client = c.pod("pod1b");
    let mut stats = Client::start(&client.ns, SocketAddr::new(cip(40, false), SVC_PORT));
    stats.wait_for("pod1a", WITHIN);

    // Scaled to zero: the pod goes away. Its client keeps sending into the old entry.
    if let Some(p) = echo1a.take() {
        p.kill().expect("stop pod1a's server");
    }
    k.apply(&manifest(&[udp_service("stats", 40, &[])]));
    stats.wait_for_failure(WITHIN);

    // Scaled back up, on another pod: the client's traffic resumes there within the sync.
    k.apply(&manifest(&[udp_service("stats", 40, &["pod2a"])]));
    stats.wait_for("pod2a", WITHIN);
    stats.all_from("pod2a", 10);
}

fn a_client_that_sent_before_the_service_was_programmed_is_served_once_it_is(sink: &[&str]) {
    require_root!();
    let c = Cluster::create("ct-early").expect("cluster");
    let _echo = c.pod("pod2a").start_echo(EP_PORT).expect("echo");
    // kpng is not running yet (a node booting): the client's datagrams to the ClusterIP leave
    // node1 un-NATed (to `ext`, which drops them), and node1 tracks them as such, because
    // something else on the node (here: a CNI-like forward rule) already uses conntrack.
    track_without_kpng(&c);
    let client = c.pod("pod1b");
    let target = SocketAddr::new(cip(50, false), SVC_PORT);
    let mut early = Client::start(&client.ns, target);
    let r = early.next();
    assert_eq!(r.outcome, Outcome::Timeout, "nothing programmed yet: {r}");
    let unnated = unnated_entry(cip(50, false), r.client_addr.expect("client address"));
    assert_eq!(
        conntrack_lines(&c.node1.ns, false, &unnated).len(),
        1,
        "an un-NATed entry (its reply comes from the ClusterIP itself)"
    );
    let _k = Kpng::start(
        &c.node1.ns,
        &manifest(&[udp_service("late", 50, &["pod2a"])]),
        sink,
    );
    early.wait_for("pod2a", WITHIN);
    early.all_from("pod2a", 5);
}

/// A UDP client that starts while someone else has deleted kpng's table (a firewall reload)
/// sends un-NATed until kpng repairs it; the repair's cleanup reads the ClusterIP whole and
/// moves the client to the endpoint. nftables only: the table's deletion is what kpng
/// repairs at once (the iptables backends find changes at their periodic full sync).
#[test]
fn nft_a_client_that_started_while_the_table_was_gone_is_served_after_the_repair() {
    require_root!();
    let c = Cluster::create("ct-gap").expect("cluster");
    let _echo = c.pod("pod2a").start_echo(EP_PORT).expect("echo");
    // Something else on the node uses conntrack, so node1 tracks what crosses it while
    // kpng's table is gone (as in the test of a client that sent before kpng started).
    track_without_kpng(&c);
    let mut k = Kpng::start(
        &c.node1.ns,
        &manifest(&[udp_service("gap", 60, &["pod2a"])]),
        &["to-local", "nft"],
    );
    let target = SocketAddr::new(cip(60, false), SVC_PORT);
    let client = c.pod("pod1b");
    let mut before = Client::start(&client.ns, target);
    before.wait_for("pod2a", WITHIN);

    // kpng is held still while the table is deleted and a new client starts, so that the
    // client's first datagrams surely meet no rule; then kpng runs again and repairs.
    let pid = k.proc.id().to_string();
    c.node1
        .ns
        .run_ok(["kill", "-STOP", pid.as_str()])
        .expect("stop kpng");
    let syncs = k.syncs();
    c.node1
        .ns
        .run_ok(["nft", "delete", "table", "ip", "kpng"])
        .expect("delete kpng's table");
    let mut during = Client::start(&client.ns, target);
    let r = during.next();
    assert_eq!(
        r.outcome,
        Outcome::Timeout,
        "no rule while the table is gone: {r}"
    );
    let unnated = unnated_entry(cip(60, false), r.client_addr.expect("client address"));
    assert_eq!(
        conntrack_lines(&c.node1.ns, false, &unnated).len(),
        1,
        "an un-NATed entry of the client that started in the gap"
    );
    c.node1
        .ns
        .run_ok(["kill", "-CONT", pid.as_str()])
        .expect("resume kpng");
    k.wait_synced(syncs);
    during.wait_for("pod2a", WITHIN);
    during.all_from("pod2a", 5);
    // The first client's entry stayed DNATed, but without any NAT rule in the namespace the
    // kernel translates nothing: it timed out during the gap too, and is served again.
    before.wait_for("pod2a", WITHIN);
    assert!(
        conntrack_lines(&c.node1.ns, false, &unnated).is_empty(),
        "the un-NATed entry is gone"
    );
}

/// Waits until kpng's conntrack memory in node1 (`/run/kpng/conntrack-checked.<netns inode>`)
/// holds `line`: the first pass checked that frontend and a restart may trust it.
#[track_caller]
fn wait_remembered(c: &Cluster, line: &str) {
    use std::os::unix::fs::MetadataExt;
    let netns = std::fs::metadata(Path::new("/run/netns").join(c.node1.ns.name()))
        .expect("node1's namespace")
        .ino();
    let memory = PathBuf::from(format!("/run/kpng/conntrack-checked.{netns}"));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(&memory).is_ok_and(|m| m.contains(line)) {
        assert!(
            Instant::now() < deadline,
            "{} does not hold {line:?}",
            memory.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A restart that finds the rules the last run left in place (nftables: the table is adopted
/// and its sets refilled in one transaction; iptables: the restore replaces the chains
/// atomically) trusts what the last run's conntrack cleanup checked: the first pass reads the
/// DNATed entries only, as in steady state, instead of every UDP frontend whole, and still
/// moves a client whose endpoint changed while kpng was down.
fn a_restart_that_keeps_the_rules_reads_only_the_dnated_entries(sink: &[&str]) {
    require_root!();
    let c = Cluster::create("ct-rst").expect("cluster");
    let _echo: Vec<Spawned> = ["pod1a", "pod2a"]
        .map(|p| c.pod(p).start_echo(EP_PORT).expect("echo"))
        .into();
    let before = Kpng::start(
        &c.node1.ns,
        &manifest(&[udp_service("dns", 70, &["pod1a"])]),
        sink,
    );
    let client = c.pod("pod1b");
    let mut dns = Client::start(&client.ns, SocketAddr::new(cip(70, false), SVC_PORT));
    dns.wait_for("pod1a", WITHIN);
    // The first pass has checked the frontend (written to this namespace's memory file) before
    // kpng stops (its rules stay); it starts again with pod1a replaced by pod2a meanwhile.
    wait_remembered(&c, "IPv4 ip 10.96.0.70:53");
    before.proc.kill().expect("stop kpng");
    let after = Kpng::start(
        &c.node1.ns,
        &manifest(&[udp_service("dns", 70, &["pod2a"])]),
        sink,
    );
    dns.wait_for("pod2a", WITHIN);
    dns.all_from("pod2a", 5);
    after.log_with("kpng's rules were in place at start");
    let log = after.log_with("deleted stale UDP conntrack entries");
    let cleanup = log
        .lines()
        .find(|l| l.contains("deleted stale UDP conntrack entries"))
        .unwrap_or_else(|| panic!("no cleanup after the restart:\n{log}"));
    assert!(
        cleanup.contains("read=DNATed UDP entries "),
        "one walk of the DNATed entries, not one per frontend: {cleanup}"
    );
}

/// kube-proxy's rules for one UDP Service (ClusterIP `cip(n)`:53 → `pod`:8080), as its
/// nftables mode (v1.31+ layout, the parts that DNAT) or its iptables mode programs them.
fn kube_proxy_udp_rules(mode: &str, n: u8, pod: &str) -> (&'static str, String) {
    let (vip, ep) = (cip(n, false), pod_ips(pod).0);
    match mode {
        "nftables" => {
            let t = "ip kube-proxy";
            let service = "service-AAAAAAAA-default/dns/udp/dns";
            let endpoint = format!("endpoint-BBBBBBBB-default/dns/udp/dns__{ep}/{EP_PORT}");
            (
                "nft",
                format!(
                    "add table {t} {{ comment \"rules for kube-proxy\" ; }}\n\
                     add chain {t} nat-prerouting {{ type nat hook prerouting priority -100 ; }}\n\
                     add chain {t} nat-output {{ type nat hook output priority -100 ; }}\n\
                     add chain {t} services\n\
                     add chain {t} {service}\n\
                     add chain {t} {endpoint}\n\
                     add map {t} service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; }}\n\
                     add rule {t} nat-prerouting jump services\n\
                     add rule {t} nat-output jump services\n\
                     add rule {t} services ip daddr . meta l4proto . th dport vmap @service-ips\n\
                     add rule {t} {service} numgen random mod 1 vmap {{ 0 : goto {endpoint} }}\n\
                     add rule {t} {endpoint} meta l4proto udp dnat to {ep}:{EP_PORT}\n\
                     add element {t} service-ips {{ {vip} . udp . {SVC_PORT} comment \"default/dns:dns\" : goto {service} }}\n"
                ),
            )
        }
        _ => (
            "iptables-nft-restore",
            format!(
                "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n\
                 :KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]\n\
                 -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
                 -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
                 -A KUBE-SERVICES -d {vip}/32 -p udp -m comment --comment \"default/dns:dns cluster IP\" -m udp --dport {SVC_PORT} -j KUBE-SVC-AAAAAAAAAAAAAAAA\n\
                 -A KUBE-SVC-AAAAAAAAAAAAAAAA -m comment --comment \"default/dns:dns -> {ep}:{EP_PORT}\" -j KUBE-SEP-BBBBBBBBBBBBBBBB\n\
                 -A KUBE-SEP-BBBBBBBBBBBBBBBB -p udp -m comment --comment \"default/dns:dns\" -m udp -j DNAT --to-destination {ep}:{EP_PORT}\n\
                 COMMIT\n"
            ),
        ),
    }
}

/// The swap from kube-proxy on a busy node: kube-proxy's rules DNAT a UDP client's flow when
/// kpng starts, with the Service's endpoint replaced meanwhile. kube-proxy deleted its
/// frontends' never-DNATed entries itself and its rules stay until kpng's are in place, so
/// kpng's first pass reads their DNATed entries alone (one walk of the table, not one per
/// frontend) and still moves the client; a Service kube-proxy did not have is read whole;
/// then kube-proxy's rules are gone.
fn a_swap_from_kube_proxy_reads_only_the_dnated_entries(
    mode: &str,
    sink: &[&str],
    with_late: bool,
) {
    require_root!();
    let c = Cluster::create("ct-swap").expect("cluster");
    let _echo: Vec<Spawned> = ["pod1a", "pod2a"]
        .map(|p| c.pod(p).start_echo(EP_PORT).expect("echo"))
        .into();
    let (tool, rules) = kube_proxy_udp_rules(mode, 72, "pod1a");
    let args: &[&str] = if tool == "nft" {
        &["nft", "-f", "-"]
    } else {
        &["iptables-nft-restore", "--noflush"]
    };
    c.node1
        .ns
        .run_with_stdin(args, &rules)
        .expect("kube-proxy's rules");
    let client = c.pod("pod1b");
    let mut dns = Client::start(&client.ns, SocketAddr::new(cip(72, false), SVC_PORT));
    dns.wait_for("pod1a", WITHIN);
    // A Service kube-proxy never programmed (created while it was down): its client's entry
    // is un-NATed, and kpng must still read that frontend whole.
    let mut late = with_late.then(|| {
        track_without_kpng(&c);
        let mut late = Client::start(&client.ns, SocketAddr::new(cip(73, false), SVC_PORT));
        let r = late.next();
        assert_eq!(r.outcome, Outcome::Timeout, "kube-proxy has no rule: {r}");
        let unnated = unnated_entry(cip(73, false), r.client_addr.expect("client address"));
        assert_eq!(conntrack_lines(&c.node1.ns, false, &unnated).len(), 1);
        late
    });
    // ClusterIP Services, as kube-dns is (node ports are not taken from kube-proxy).
    let cluster_ip = |name, n: u8| {
        udp_service(name, n, &["pod2a"])
            .replace("type: NodePort", "type: ClusterIP")
            .replace(&format!(", nodePort: {}", 30000 + u16::from(n)), "")
    };
    let mut services = vec![cluster_ip("dns", 72)];
    if with_late {
        services.push(cluster_ip("late", 73));
    }
    let k = Kpng::start(&c.node1.ns, &manifest(&services), sink);
    dns.wait_for("pod2a", WITHIN);
    dns.all_from("pod2a", 5);
    if let Some(late) = &mut late {
        late.wait_for("pod2a", WITHIN);
    }
    k.log_with("DNATed these UDP frontends until kpng's were in place");
    let log = k.log_with("deleted stale UDP conntrack entries family=IPv4");
    let cleanup = log
        .lines()
        .find(|l| l.contains("deleted stale UDP conntrack entries") && l.contains("family=IPv4"))
        .unwrap_or_else(|| panic!("no IPv4 cleanup after the start:\n{log}"));
    // With a second, new frontend, this small table is read whole in one dump (cheaper
    // than two); with kube-proxy's frontend alone, only the DNATed entries are read.
    let planned = if late.is_some() {
        "read=every UDP entry "
    } else {
        "read=DNATed UDP entries "
    };
    assert!(
        cleanup.contains(planned),
        "kube-proxy's frontend needs no walk of its own: {cleanup}"
    );
    // Once kpng's rules are in place, kube-proxy's are gone (nftables mode: its table;
    // iptables mode: kpng's iptables backend rewrote its chains).
    let deadline = Instant::now() + Duration::from_secs(5);
    while c
        .node1
        .ns
        .run_ok(["nft", "list", "table", "ip", "kube-proxy"])
        .is_ok()
    {
        assert!(Instant::now() < deadline, "kube-proxy's table stayed");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A restart finds kpng's own rules (in iptables, under kube-proxy's names) and its own
    // memory of this boot: nothing is taken for kube-proxy's any more.
    wait_remembered(&c, "IPv4 ip 10.96.0.72:53");
    k.proc.kill().expect("stop kpng");
    let again = Kpng::start(&c.node1.ns, &manifest(&services), sink);
    dns.all_from("pod2a", 5);
    let log = again.log_with("kpng's rules were in place at start");
    assert!(
        !log.contains("DNATed these UDP frontends until kpng's"),
        "kpng's own rules were taken for kube-proxy's:\n{log}"
    );
}

const IPTABLES_NFT: &[&str] = &["to-local", "iptables", "--iptables-mode", "nft"];

#[test]
fn nft_a_swap_from_kube_proxy_nftables_mode_reads_only_the_dnated_entries() {
    a_swap_from_kube_proxy_reads_only_the_dnated_entries("nftables", &["to-local", "nft"], false);
}

#[test]
fn iptables_a_swap_from_kube_proxy_iptables_mode_reads_only_the_dnated_entries() {
    a_swap_from_kube_proxy_reads_only_the_dnated_entries("iptables", IPTABLES_NFT, false);
}

/// kpng's own rules for a Service kube-proxy did not have are never taken for kube-proxy's
/// (in iptables they carry the same names): that Service's stuck client is served.
#[test]
fn nft_a_swap_from_kube_proxy_nftables_mode_reads_a_service_it_did_not_have_whole() {
    a_swap_from_kube_proxy_reads_only_the_dnated_entries("nftables", &["to-local", "nft"], true);
}

#[test]
fn iptables_a_swap_from_kube_proxy_iptables_mode_reads_a_service_it_did_not_have_whole() {
    a_swap_from_kube_proxy_reads_only_the_dnated_entries("iptables", IPTABLES_NFT, true);
}

/// kube-proxy's iptables mode writes the iptables backend's chains: while kpng is down, a
/// Service's rule may go (kube-proxy removed it, the Service was re-created after it stopped)
/// and its clients send un-NATed meanwhile. The restart trusts the last run's checks only for
/// the frontends whose rules it found in place, so that client is served.
#[test]
fn iptables_a_rule_removed_while_kpng_was_down_is_read_whole_after_the_restart() {
    require_root!();
    let c = Cluster::create("ct-gone").expect("cluster");
    let _echo = c.pod("pod2a").start_echo(EP_PORT).expect("echo");
    let service = udp_service("dns", 74, &["pod2a"])
        .replace("type: NodePort", "type: ClusterIP")
        .replace(", nodePort: 30074", "");
    let manifest = manifest(std::slice::from_ref(&service));
    let before = Kpng::start(&c.node1.ns, &manifest, IPTABLES_NFT);
    let client = c.pod("pod1b");
    let target = SocketAddr::new(cip(74, false), SVC_PORT);
    Client::start(&client.ns, target).wait_for("pod2a", WITHIN);
    before.proc.kill().expect("stop kpng");
    // What kube-proxy would have done meanwhile: the Service's rule is gone.
    let rules = c
        .node1
        .ns
        .run_ok(["iptables-nft", "-t", "nat", "-S", "KUBE-SERVICES"])
        .expect("KUBE-SERVICES");
    let rule = rules
        .lines()
        .find(|l| l.contains("-d 10.96.0.74/32"))
        .unwrap_or_else(|| panic!("no rule for the Service:\n{rules}"));
    let mut delete = vec!["iptables-nft", "-t", "nat", "-D"];
    delete.extend(unquoted(rule.trim_start_matches("-A ")));
    c.node1.ns.run_ok(delete).expect("delete the rule");
    let mut late = Client::start(&client.ns, target);
    let r = late.next();
    assert_eq!(r.outcome, Outcome::Timeout, "no rule for the Service: {r}");
    let unnated = unnated_entry(cip(74, false), r.client_addr.expect("client address"));
    assert_eq!(conntrack_lines(&c.node1.ns, false, &unnated).len(), 1);
    let _after = Kpng::start(&c.node1.ns, &manifest, IPTABLES_NFT);
    late.wait_for("pod2a", WITHIN);
}

/// The same for nftables: kpng's table is its own, but an earlier kpng build (a rollback, then
/// the upgrade again) adopts it too, and may take a Service out of it while this build is down
/// and its memory file stays. The restart trusts the last run's checks only for the UDP
/// frontends it finds in the adopted table, so the client that sent meanwhile is served.
#[test]
fn nft_a_frontend_taken_out_of_the_table_while_kpng_was_down_is_read_whole_after_the_restart() {
    require_root!();
    let c = Cluster::create("ct-gone-nft").expect("cluster");
    let _echo = c.pod("pod2a").start_echo(EP_PORT).expect("echo");
    let service = udp_service("dns", 75, &["pod2a"])
        .replace("type: NodePort", "type: ClusterIP")
        .replace(", nodePort: 30075", "");
    let manifest = manifest(std::slice::from_ref(&service));
    let sink: &[&str] = &["to-local", "nft"];
    let before = Kpng::start(&c.node1.ns, &manifest, sink);
    let client = c.pod("pod1b");
    let target = SocketAddr::new(cip(75, false), SVC_PORT);
    Client::start(&client.ns, target).wait_for("pod2a", WITHIN);
    wait_remembered(&c, "IPv4 ip 10.96.0.75:53");
    before.proc.kill().expect("stop kpng");
    // What an earlier build running meanwhile leaves when the Service is deleted: its
    // elements gone (and, as a build before ServiceCIDRs, no drop of unallocated Service IPs).
    c.node1
        .ns
        .nft(
            "delete element ip kpng service-ips { 10.96.0.75 . udp . 53 }\n\
             delete element ip kpng cluster-ips { 10.96.0.75 }\n\
             flush set ip kpng service-cidrs\n",
        )
        .expect("take the Service out of the table");
    let mut late = Client::start(&client.ns, target);
    let r = late.next();
    // The node answers for the Service CIDR itself: port unreachable.
    assert!(
        matches!(r.outcome, Outcome::Timeout | Outcome::Refused),
        "no rule for the Service: {r}"
    );
    let unnated = unnated_entry(cip(75, false), r.client_addr.expect("client address"));
    assert_eq!(
        conntrack_lines(&c.node1.ns, false, &unnated).len(),
        1,
        "{unnated:?} in {:#?}",
        conntrack_lines(&c.node1.ns, false, &[])
    );
    let after = Kpng::start(&c.node1.ns, &manifest, sink);
    late.wait_for("pod2a", WITHIN);
    after.log_with("not found in the rules in place");
}

/// A rule's words as the shell would pass them: a double-quoted comment is one word.
fn unquoted(rule: &str) -> Vec<&str> {
    let mut words = Vec::new();
    for (i, part) in rule.split('"').enumerate() {
        if i % 2 == 1 {
            words.push(part);
        } else {
            words.extend(part.split_whitespace());
        }
    }
    words
}

/// The scenarios above, once per backend.
macro_rules! for_each_backend {
    ($($backend:ident: $sink:expr;)*) => {
        $(
            mod $backend {
                #[test]
                fn a_udp_client_follows_a_replaced_endpoint_and_unrelated_flows_survive() {
                    super::a_udp_client_follows_a_replaced_endpoint_and_unrelated_flows_survive($sink);
                }

                #[test]
                fn a_udp_service_scaled_to_zero_and_back_serves_its_clients_again() {
                    super::a_udp_service_scaled_to_zero_and_back_serves_its_clients_again($sink);
                }

                #[test]
                fn a_client_that_sent_before_the_service_was_programmed_is_served_once_it_is() {
                    super::a_client_that_sent_before_the_service_was_programmed_is_served_once_it_is($sink);
                }

                #[test]
                fn a_restart_that_keeps_the_rules_reads_only_the_dnated_entries() {
                    super::a_restart_that_keeps_the_rules_reads_only_the_dnated_entries($sink);
                }
            }
        )*
    };
}

for_each_backend! {
    nft: &["to-local", "nft"];
    iptables_legacy: &["to-local", "iptables", "--iptables-mode", "legacy"];
    iptables_nft: &["to-local", "iptables", "--iptables-mode", "nft"];
    ebpf: &["to-local", "ebpf"];
}
