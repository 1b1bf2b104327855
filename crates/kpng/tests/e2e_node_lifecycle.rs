//! The node's own Node object through its lifecycle, with real packets (root): `kpng` in
//! kube-proxy mode (nftables) against the fake API server in node1.
//!
//! - The Node deleted while kpng runs: its NodePorts stay served on the last node IPs (as
//!   kube-proxy keeps its start-up IPs), so the eTP Local health check that still answers 200
//!   does not draw a load balancer's traffic to a node that drops it. Nothing kpng programs
//!   changes, so the deletion, the Node's re-creation with the same values and an edit of its
//!   labels cost no sync and no kernel operation.
//! - A Node with no InternalIP/ExternalIP: after the wait for node IPs, NodePorts are served
//!   on every local address (as kube-proxy once its start-up wait times out).
//!
//! The same with a brain: `kpng file … to-api` beside node1, node1 programmed by
//! `kpng api … to-local nft`, which keeps its Node's last IPs and falls back as the
//! in-process sources do (the keeping is the node's: restarted while its Node is deleted, it
//! knows no node IP, as an in-process kpng or kube-proxy restarted then).

use std::path::Path;
use std::time::{Duration, Instant};

use e2e::harness::{Cond, EP_PORT, FakeServer, OK_T, manifest, sa, svc};
use kpng_testkit::{Cluster, Netns, Outcome, Proto, Spawned, addr, require_root};

#[allow(unused_macros, unused_imports)]
mod e2e;

/// The LoadBalancer Service (eTP Local) both tests serve: ClusterIP number 130, node port
/// 30130, health check node port 32130, its endpoint pod1a on node1.
fn lb_service() -> String {
    svc(
        "lb",
        130,
        "LoadBalancer",
        "externalTrafficPolicy: Local, healthCheckNodePort: 32130",
        &[("pod1a", Cond::Ready)],
    )
}

/// Starts kpng as kube-proxy (nftables mode) in node1 against `kubeconfig`.
fn kpng(ns: &Netns, dir: &Path, kubeconfig: &Path, extra: &[&str]) -> Spawned {
    let source = [
        "--kubeconfig",
        kubeconfig.to_str().expect("utf-8"),
        "--proxy-mode",
        "nftables",
        "--hostname-override",
    ];
    let admin = dir.join("admin.sock");
    ns.spawn(node1_args(&source, "127.0.0.1:10249", &admin, extra, &[]))
        .expect("start kpng")
}

/// kpng's command line in node1: `source` (ending with the node-name flag), the test's node
/// flags, then `extra` and `sink`.
fn node1_args(
    source: &[&str],
    metrics: &str,
    admin: &Path,
    extra: &[&str],
    sink: &[&str],
) -> Vec<String> {
    let cluster_cidr = format!("{},{}", addr::CLUSTER_CIDR_V4, addr::CLUSTER_CIDR_V6);
    let node = [
        "node1",
        "--cluster-cidr",
        &cluster_cidr,
        "--healthz-bind-address",
        "127.0.0.1:10256",
        "--metrics-bind-address",
        metrics,
        "--min-sync-period",
        "0",
        "--admin-socket",
        admin.to_str().expect("utf-8"),
    ];
    std::iter::once(env!("CARGO_BIN_EXE_kpng"))
        .chain(source.iter().copied())
        .chain(node)
        .chain(extra.iter().copied())
        .chain(sink.iter().copied())
        .map(str::to_string)
        .collect()
}

/// The brain: `kpng file --input <input> to-api` in node1, on a Unix socket in `dir`.
fn brain(ns: &Netns, dir: &Path, input: &Path) -> Spawned {
    let socket = dir.join("brain.sock");
    // Its own admin socket: the default, /run/kpng/kpng.sock, may be another test's.
    let admin = dir.join("brain-admin.sock");
    let brain = ns
        .spawn([
            env!("CARGO_BIN_EXE_kpng"),
            "file",
            "--input",
            input.to_str().expect("utf-8"),
            "--debounce",
            "0",
            "--metrics-bind-address",
            "",
            "--admin-socket",
            admin.to_str().expect("utf-8"),
            "to-api",
            "--listen",
            &format!("unix://{}", socket.display()),
        ])
        .expect("start the brain");
    assert!(
        wait_for(Duration::from_secs(10), || {
            std::os::unix::net::UnixStream::connect(&socket).is_ok()
        }),
        "the brain listens:\n{}",
        brain.stderr_text()
    );
    brain
}

/// node1's kpng fed by the brain in `dir`: `kpng api … to-local nft`.
fn brain_node(ns: &Netns, dir: &Path, extra: &[&str]) -> Spawned {
    let api = format!("unix://{}", dir.join("brain.sock").display());
    let source = [
        "api",
        "--api",
        &api,
        "--api-retry-max",
        "500ms",
        "--node-name",
    ];
    let admin = dir.join("admin.sock");
    ns.spawn(node1_args(&source, "", &admin, extra, &["to-local", "nft"]))
        .expect("start kpng api")
}

/// `objects` with node1's Node left out (node2's stays).
fn without_node1(objects: &str) -> String {
    let node1 = node1();
    assert!(node1.contains("{name: node1}") && objects.contains(node1));
    objects.replacen(node1, "", 1)
}

/// `kpng status -o json` of the kpng whose admin socket is in `dir`.
fn status(dir: &Path) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kpng"))
        .args(["status", "-o", "json", "--admin-socket"])
        .arg(dir.join("admin.sock"))
        .output()
        .expect("kpng status");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)))
}

/// How many syncs `kpng` has logged.
fn syncs(kpng: &Spawned) -> usize {
    kpng.stderr_text().matches("synced backend=").count()
}

/// node1's `/metrics` (the in-process kpng's).
fn scrape_metrics(c: &Cluster) -> String {
    c.node1
        .ns
        .run_ok(["curl", "-s", "http://127.0.0.1:10249/metrics"])
        .expect("curl /metrics")
}

/// The value of the sample `series` (name and labels, as written) in `metrics`; 0 when absent.
fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

/// What programming the kernel leaves behind: the nftables operations sent (`/metrics`) and
/// the syncs logged. A Node event that changes nothing kpng programs leaves both alone.
fn kernel_work(c: &Cluster, kpng: &Spawned) -> (f64, usize) {
    let ops = sample(
        &scrape_metrics(c),
        "kpng_sync_operations_total{backend=\"nftables\"}",
    );
    (ops, syncs(kpng))
}

/// How many Node events the in-process kpng has received.
fn node_events(c: &Cluster) -> f64 {
    sample(&scrape_metrics(c), "kpng_objects_seen_total{kind=\"Node\"}")
}

/// The HTTP status of `url` asked from `ns` (`000`: no answer).
fn http_status(ns: &Netns, url: &str) -> String {
    ns.run_ok([
        "curl",
        "-s",
        "-m",
        "2",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        url,
    ])
    .unwrap_or_else(|_| "000".into())
}

/// The HTTP status of the in-process kpng's `/healthz` (`000`: no answer).
fn healthz(c: &Cluster) -> String {
    http_status(&c.node1.ns, "http://127.0.0.1:10256/healthz")
}

/// Waits until the kpng whose admin socket is in `dir` holds no change waiting for a sync:
/// asked after it handled an event, whatever sync that event queued is done.
fn wait_in_sync(dir: &Path, log: impl Fn() -> String) {
    assert!(
        wait_for(Duration::from_secs(10), || status(dir)["inSync"] == true),
        "kpng in sync:\n{}",
        log()
    );
}

/// Applies `yaml` (node1's Node) to the fake API server, waits until kpng has handled the
/// event and synced whatever it queued.
fn apply_node1(c: &Cluster, dir: &Path, server: &mut FakeServer, kpng: &Spawned, yaml: &str) {
    let file = dir.join("node1.yaml");
    std::fs::write(&file, yaml).expect("write node1");
    let seen = node_events(c);
    server.command(&format!("apply {}", file.display()));
    assert!(
        wait_for(Duration::from_secs(10), || node_events(c) > seen),
        "kpng received the Node:\n{}",
        kpng.stderr_text()
    );
    wait_in_sync(dir, || kpng.stderr_text());
}

/// node1's Node as the manifest has it.
fn node1() -> &'static str {
    e2e::harness::NODES
        .split_inclusive("---\n")
        .next()
        .expect("node1 first")
}

/// Whether the node port answers from the external client.
fn node_port_answers(c: &Cluster) -> bool {
    let target = sa(addr::NODE1_LAN_V4.into(), 30130);
    e2e::harness::probe(&c.ext.ns, Proto::Tcp, target, OK_T).outcome == Outcome::Ok
}

/// The health check's HTTP status from the external client (`000`: no answer).
fn health_check(c: &Cluster) -> String {
    http_status(&c.ext.ns, "http://192.168.100.1:32130/")
}

/// Waits until `check` holds, for at most `within`.
fn wait_for(within: Duration, check: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    check()
}

#[test]
fn a_deleted_node_keeps_its_node_ports_on_the_last_node_ips() {
    require_root!();
    let c = Cluster::create("nlife").expect("cluster");
    let _echo = c.pod("pod1a").start_echo(EP_PORT).expect("echo");
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("cluster.yaml");
    std::fs::write(&input, manifest(&[lb_service()])).expect("write manifest");
    let kubeconfig = dir.path().join("kubeconfig");
    let mut server = FakeServer::start(&c.node1.ns, &input, &kubeconfig);
    let kpng = kpng(&c.node1.ns, dir.path(), &kubeconfig, &[]);
    assert!(
        wait_for(Duration::from_secs(20), || node_port_answers(&c)),
        "NodePort never served:\n{}",
        kpng.stderr_text()
    );
    // Bound after the sync that serves the NodePort, a moment later.
    assert!(
        wait_for(Duration::from_secs(10), || health_check(&c) == "200"),
        "the health check answers 200:\n{}",
        kpng.stderr_text()
    );

    wait_in_sync(dir.path(), || kpng.stderr_text());
    let before = kernel_work(&c, &kpng);
    let logged_before = kpng.stderr_text().len();

    // The deletion keeps every value kpng programs: no sync, no element flushed or refilled.
    let seen = node_events(&c);
    server.command("delete Node - node1");
    assert!(
        wait_for(Duration::from_secs(10), || node_events(&c) > seen),
        "kpng received the deletion:\n{}",
        kpng.stderr_text()
    );
    wait_in_sync(dir.path(), || kpng.stderr_text());
    assert_eq!(
        kernel_work(&c, &kpng),
        before,
        "the deletion changed nothing to program:\n{}",
        kpng.stderr_text()
    );
    // The node's status did change: `/healthz` says the node is no longer eligible.
    assert_eq!(healthz(&c), "503", "{}", kpng.stderr_text());
    // The health check still answers 200 for the local endpoint: so must the NodePort.
    assert_eq!(health_check(&c), "200");
    assert!(
        node_port_answers(&c),
        "NodePort dropped after the Node's deletion:\n{}",
        kpng.stderr_text()
    );
    let log = kpng.stderr_text();
    assert_eq!(
        log.matches(
            "Node \"node1\" was deleted; keeping node IPs [192.168.100.1, fd00:100::1] and pod \
             CIDRs [10.244.1.0/24, fd00:244:1::/64]"
        )
        .count(),
        1,
        "{log}"
    );

    // Re-created with the same values, then given a label and an annotation: still nothing
    // to program, and the node eligible again.
    apply_node1(&c, dir.path(), &mut server, &kpng, node1());
    assert_eq!(healthz(&c), "200", "{}", kpng.stderr_text());
    let labelled = node1().replacen(
        "metadata: {name: node1}",
        "metadata: {name: node1, labels: {team: blue}, annotations: {note: drained}}",
        1,
    );
    assert_ne!(labelled, node1());
    apply_node1(&c, dir.path(), &mut server, &kpng, &labelled);
    assert_eq!(
        kernel_work(&c, &kpng),
        before,
        "the re-creation and the labels changed nothing to program:\n{}",
        kpng.stderr_text()
    );
    let log = kpng.stderr_text();
    assert_eq!(
        log.matches(
            "Node \"node1\" was re-created: node IPs [192.168.100.1, fd00:100::1], pod CIDRs \
             [10.244.1.0/24, fd00:244:1::/64], zone none"
        )
        .count(),
        1,
        "{log}"
    );
    let since = log.get(logged_before..).unwrap_or_default();
    for node_change in [
        "node or Service CIDRs changed",
        "node IPs changed",
        "pod CIDRs changed",
        "zone changed",
    ] {
        assert!(!since.contains(node_change), "{node_change}:\n{log}");
    }
    assert!(
        node_port_answers(&c),
        "NodePort served after the re-creation:\n{}",
        kpng.stderr_text()
    );
    kpng.kill().expect("stop kpng");
    drop(server);
}

/// The test's manifest with node1 listing a Hostname address only: no node IP.
fn without_node_ips() -> String {
    let objects = manifest(&[lb_service()]).replacen(
        "  - {type: InternalIP, address: 192.168.100.1}\n  - {type: InternalIP, address: \"fd00:100::1\"}\n",
        "  - {type: Hostname, address: node1}\n",
        1,
    );
    assert!(objects.contains("{type: Hostname, address: node1}"));
    objects
}

#[test]
fn without_node_ips_node_ports_go_to_every_local_address_after_the_wait() {
    require_root!();
    let c = Cluster::create("nlife2").expect("cluster");
    let _echo = c.pod("pod1a").start_echo(EP_PORT).expect("echo");
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("cluster.yaml");
    let objects = without_node_ips();
    std::fs::write(&input, objects).expect("write manifest");
    let kubeconfig = dir.path().join("kubeconfig");
    let server = FakeServer::start(&c.node1.ns, &input, &kubeconfig);
    let kpng = kpng(
        &c.node1.ns,
        dir.path(),
        &kubeconfig,
        &["--node-ips-wait", "3s"],
    );
    assert!(
        wait_for(Duration::from_secs(20), || node_port_answers(&c)),
        "NodePort never served without node IPs:\n{}",
        kpng.stderr_text()
    );
    let log = kpng.stderr_text();
    assert!(
        log.contains("serving NodePorts on every local address"),
        "{log}"
    );
    // The health checks are bound after the sync that serves the NodePorts, a moment later.
    assert!(
        wait_for(Duration::from_secs(10), || health_check(&c) == "200"),
        "the health check answers 200 on every address too:\n{}",
        kpng.stderr_text()
    );
    kpng.kill().expect("stop kpng");
    drop(server);
}

#[test]
fn brain_a_deleted_node_keeps_its_node_ports_on_the_last_node_ips() {
    require_root!();
    let c = Cluster::create("bnlife").expect("cluster");
    let _echo = c.pod("pod1a").start_echo(EP_PORT).expect("echo");
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("cluster.yaml");
    let objects = manifest(&[lb_service()]);
    e2e::harness::write_atomically(&input, &objects);
    let brain = brain(&c.node1.ns, dir.path(), &input);
    let node = brain_node(&c.node1.ns, dir.path(), &["--node-ips-wait", "2s"]);
    let logs = |node: &Spawned| {
        format!(
            "{}\n--- node1:\n{}",
            brain.stderr_text(),
            node.stderr_text()
        )
    };
    assert!(
        wait_for(Duration::from_secs(20), || node_port_answers(&c)),
        "NodePort never served:\n{}",
        logs(&node)
    );
    assert!(
        wait_for(Duration::from_secs(10), || health_check(&c) == "200"),
        "the health check answers 200:\n{}",
        logs(&node)
    );

    // The Node goes; the node's kpng hears it from the brain and, with its values kept, has
    // nothing to program: no sync.
    wait_in_sync(dir.path(), || logs(&node));
    let before = syncs(&node);
    e2e::harness::write_atomically(&input, &without_node1(&objects));
    assert!(
        wait_for(Duration::from_secs(10), || {
            node.stderr_text().contains("Node \"node1\" was deleted")
        }),
        "the node heard of the Node's deletion:\n{}",
        logs(&node)
    );
    wait_in_sync(dir.path(), || logs(&node));
    assert_eq!(
        syncs(&node),
        before,
        "no sync for the deletion:\n{}",
        logs(&node)
    );
    assert_eq!(health_check(&c), "200", "{}", logs(&node));
    assert!(
        node_port_answers(&c),
        "NodePort dropped after the Node's deletion:\n{}",
        logs(&node)
    );
    let log = node.stderr_text();
    assert!(
        log.contains("Node \"node1\" was deleted; keeping node IPs [192.168.100.1, fd00:100::1]"),
        "{log}"
    );

    // Restarted while its Node is deleted, the node knows no node IP (as an in-process kpng
    // restarted then): after the wait, its NodePorts are on every local address.
    node.kill().expect("stop kpng api");
    let node = brain_node(&c.node1.ns, dir.path(), &["--node-ips-wait", "2s"]);
    assert!(
        wait_for(Duration::from_secs(20), || {
            node.stderr_text()
                .contains("serving NodePorts on every local address")
        }),
        "the restarted node fell back to every local address:\n{}",
        logs(&node)
    );
    assert!(
        wait_for(Duration::from_secs(10), || node_port_answers(&c)),
        "NodePort served on every local address after the restart:\n{}",
        logs(&node)
    );
    node.kill().expect("stop kpng api");
}

#[test]
fn brain_without_node_ips_node_ports_go_to_every_local_address_after_the_wait() {
    require_root!();
    let c = Cluster::create("bnlife2").expect("cluster");
    let _echo = c.pod("pod1a").start_echo(EP_PORT).expect("echo");
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("cluster.yaml");
    let objects = without_node_ips();
    e2e::harness::write_atomically(&input, &objects);
    let brain = brain(&c.node1.ns, dir.path(), &input);
    let node = brain_node(&c.node1.ns, dir.path(), &["--node-ips-wait", "3s"]);
    let logs = || {
        format!(
            "{}\n--- node1:\n{}",
            brain.stderr_text(),
            node.stderr_text()
        )
    };
    assert!(
        wait_for(Duration::from_secs(20), || node_port_answers(&c)),
        "NodePort never served without node IPs:\n{}",
        logs()
    );
    let log = node.stderr_text();
    assert!(
        log.contains("serving NodePorts on every local address"),
        "{log}"
    );
    let problem = status(dir.path())["nodeProblem"].clone();
    assert!(
        problem
            .as_str()
            .is_some_and(|p| p.contains("NodePorts are served on every local address")),
        "{problem}"
    );
    assert!(
        wait_for(Duration::from_secs(10), || health_check(&c) == "200"),
        "the health check answers 200 on every address too:\n{}",
        logs()
    );
    node.kill().expect("stop kpng api");
}
