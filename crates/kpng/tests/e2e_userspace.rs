//! Real-packet end-to-end tests of `kpng … to-local userspace`: the shared suite in `e2e/`
//! (with the proxy's documented differences: endpoints see the node as the client, and
//! connections do not outlive kpng), plus what only a proxy does: drain of an established
//! connection when its endpoint leaves, listeners reachable only through Service addresses,
//! UDP affinity, and UDP flows that outlive a restart.

mod e2e;

use std::collections::BTreeMap;
use std::time::Duration;

use e2e::Backend;
use e2e::harness::*;
use e2e::scenarios::HeldConnection;
use kpng_testkit::{Cluster, Netns, Outcome, Probe, Proto, Spawned, require_root};

e2e::suite!(Backend::Userspace);

#[test]
fn session_affinity_dual_stack() {
    e2e::scenarios::session_affinity_dual_stack(Backend::Userspace);
}

const B: Backend = Backend::Userspace;

/// The listener ports kpng's capture redirects ClusterIPs to, from its nft map in `ns`.
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

#[test]
fn listeners_are_reachable_only_through_service_addresses() {
    require_root!();
    let c = Cluster::create(&B.prefix("guard")).expect("cluster");
    let _echo = echo_all(&c);
    let _k = Kpng::start(
        B,
        &c.node1.ns,
        &manifest(&[svc("web", 10, "ClusterIP", "", &[("pod1a", Cond::Ready)])]),
        &[],
    );
    let ports = listener_ports(&c.node1.ns);
    assert_eq!(ports.len(), 2, "one TCP and one UDP listener: {ports:?}");
    let r = probe(&c.ext.ns, Proto::Tcp, sa(cip(10, false), SVC_PORT), OK_T);
    assert_masqueraded(&r, &["pod1a"]);
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
fn client_ip_affinity_holds_for_udp_and_across_ways_in() {
    require_root!();
    let c = Cluster::create(&B.prefix("aff")).expect("cluster");
    let _echo = echo_all(&c);
    let _k = Kpng::start(
        B,
        &c.node1.ns,
        &manifest(&[svc(
            "sticky",
            10,
            "NodePort",
            "sessionAffinity: ClientIP",
            ALL3,
        )]),
        &[],
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

/// A pod on node1 wired the Calico way: its own veth, routed rather than bridged, the node's
/// side holding only the IPv6 link-local `fe80::ee` (and `169.254.1.1` with proxy ARP for
/// IPv4), while node1's global IPv6 addresses are on other interfaces. Pod addresses
/// `fd00:244:1::99`, `10.244.1.99`, inside node1's pod CIDR.
fn routed_pod(c: &Cluster) -> Netns {
    let pod = Netns::new(&format!("{}-rpod", B.prefix("lla"))).expect("pod namespace");
    pod.sysctls(&[
        ("net.ipv6.conf.all.accept_dad", "0"),
        ("net.ipv6.conf.default.accept_dad", "0"),
    ])
    .expect("pod sysctls");
    let node = &c.node1.ns;
    node.ip_batch(&format!(
        "link add calir type veth peer name eth0 netns {}\n\
         link set calir addrgenmode none\n\
         link set calir up\n\
         addr add fe80::ee/64 dev calir nodad\n\
         addr add 169.254.1.1/32 dev calir\n\
         route add fd00:244:1::99/128 dev calir\n\
         route add 10.244.1.99/32 dev calir\n",
        pod.name()
    ))
    .expect("node side of the routed pod");
    node.sysctl("net.ipv4.conf.calir.proxy_arp", "1")
        .expect("proxy ARP");
    pod.ip_batch(
        "link set eth0 up\n\
         addr add fd00:244:1::99/128 dev eth0 nodad\n\
         addr add 10.244.1.99/32 dev eth0\n\
         route add 169.254.1.1/32 dev eth0\n\
         route add default via 169.254.1.1 dev eth0\n\
         route add default via fe80::ee dev eth0\n",
    )
    .expect("pod side of the routed pod");
    pod
}

/// UDP replies leave from the address the client's datagram was redirected to. A routed pod's
/// node-side interface has only an IPv6 link-local address, which the capture redirects to;
/// the kernel's own choice of source towards the pod is a global node address, which conntrack
/// would not map back to the ClusterIP (the pod saw a reply from a stranger and answered it
/// with a port unreachable).
#[test]
fn udp_replies_to_a_pod_behind_a_link_local_only_interface() {
    require_root!();
    let c = Cluster::create(&B.prefix("lla")).expect("cluster");
    let _echo = echo_all(&c);
    let pod = routed_pod(&c);
    let _k = Kpng::start(
        B,
        &c.node1.ns,
        &manifest(&[svc("dns", 10, "ClusterIP", "", &[("pod1a", Cond::Ready)])]),
        &[],
    );
    for v6 in [true, false] {
        for proto in [Proto::Udp, Proto::Tcp] {
            for _ in 0..3 {
                // The probe's socket is connected to the ClusterIP: it takes only replies
                // from there.
                let r = probe(&pod, proto, sa(cip(10, v6), SVC_PORT), OK_T);
                assert_masqueraded(&r, &["pod1a"]);
            }
        }
    }
}

#[test]
fn an_established_connection_drains_when_its_endpoint_leaves() {
    require_root!();
    let c = Cluster::create(&B.prefix("drain")).expect("cluster");
    let _echo: Vec<Spawned> = ["pod1a", "pod2a"]
        .iter()
        .map(|p| c.pod(p).start_echo(EP_PORT).expect("echo"))
        .collect();
    let _line_server = start_line_server(&c, "pod1b");
    let mut k = Kpng::start(
        B,
        &c.node1.ns,
        &manifest(&[svc("live", 10, "ClusterIP", "", &[("pod1b", Cond::Ready)])]),
        &[],
    );
    let target = sa(cip(10, false), SVC_PORT);

    // A connection to pod1b, held open.
    let mut held = HeldConnection::open(&c.ext.ns, cip(10, false), "pod1b");

    // pod1b leaves, two others come: new traffic goes to them only.
    k.apply(&manifest(&[svc(
        "live",
        10,
        "ClusterIP",
        "",
        &[("pod1a", Cond::Ready), ("pod2a", Cond::Ready)],
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
    held.second("pod1b")
        .expect("second line over the held connection after its endpoint left");
}

#[test]
fn a_restart_keeps_udp_flows_on_their_listener_ports() {
    require_root!();
    let c = Cluster::create(&B.prefix("restart")).expect("cluster");
    let _echo = echo_all(&c);
    let mut k = Kpng::start(
        B,
        &c.node1.ns,
        &manifest(&[svc(
            "dns",
            10,
            "NodePort",
            "",
            &[("pod1a", Cond::Ready), ("pod2a", Cond::Ready)],
        )]),
        &[],
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
        let r = c
            .ext
            .ns
            .probe_one(&Probe::tcp(target).timeout(OK_T))
            .expect("probe");
        assert_masqueraded(&r, &["pod1a", "pod2a"]);
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

// The fault suite (`e2e/faults.rs`; figures in docs/reliability.md).

#[test]
fn fault_capture_deleted() {
    e2e::faults::capture_table_deleted(e2e::Backend::Userspace);
}

#[test]
fn fault_ruleset_flushed() {
    e2e::faults::nft_ruleset_flushed(e2e::Backend::Userspace);
}

/// An external client's connection held through a node port survives `nft flush ruleset`:
/// its redirect to the proxy's listener lives in conntrack, and the anchor table keeps the
/// NAT hooks that apply it until the capture is repaired (docs/reliability.md; without the
/// anchor node1 reset it).
#[test]
fn fault_ruleset_flushed_keeps_a_node_port_connection() {
    e2e::faults::nft_ruleset_flushed_node_port(e2e::Backend::Userspace);
}

#[test]
fn one_instance_per_namespace() {
    e2e::faults::one_instance_per_namespace(e2e::Backend::Userspace);
}
