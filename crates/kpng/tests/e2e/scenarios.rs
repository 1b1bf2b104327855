//! The scenarios of the end-to-end suite, each a function of the backend under test.
//!
//! Every scenario builds its own throw-away two-node cluster of network namespaces
//! (`kpng_testkit::Cluster`), runs `kpng` in node1 against a small manifest, starts echo
//! servers in the pods and checks where real TCP/UDP traffic ends up: which endpoint
//! answered, which source address it saw (masquerade or not), and whether unserved traffic is
//! refused (REJECT) or silently dropped (DROP). Where backends differ by design, the scenario
//! asks [`Backend::behaviour`] and checks the documented behaviour (docs/backends.md).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use kpng_testkit::{
    Cluster, Netns, Outcome, Probe, ProbeResult, Proto, Spawned, addr, require_root, tally,
};

use super::harness::*;
use super::{Backend, NodePortScope, Unserved};

// ---------------------------------------------------------------------------------------
// 1-2. ClusterIP.
// ---------------------------------------------------------------------------------------

pub fn cluster_ip_from_pod_spreads_over_all_endpoints_without_masquerade(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("cip")).expect("cluster");
    let _echo = echo_all(&c);
    let _k = Kpng::start(
        b,
        &c.node1.ns,
        &manifest(&[svc("web", 10, "ClusterIP", "", ALL3)]),
        &[],
    );
    // pod1b as the client: the endpoints are a pod on the same node (pod1a), a pod on
    // the other node (pod2a) and the client itself (a hairpin, masqueraded).
    let client = c.pod("pod1b");
    for v6 in [false, true] {
        let results = probes(&client.ns, Proto::Tcp, sa(cip(10, v6), SVC_PORT), 60);
        assert_eq!(
            names(&tally(&results)),
            set(&["pod1a", "pod1b", "pod2a"]),
            "v6={v6}: {:?}",
            tally(&results)
        );
        for r in &results {
            if r.server_name.as_deref() == Some("pod1b") {
                assert_pod_masqueraded(b, r, &["pod1b"], client.ip(v6));
            } else {
                assert_direct(b, r, &["pod1a", "pod2a"], client.ip(v6));
            }
        }
    }
}

pub fn cluster_ip_from_node_and_from_outside_is_masqueraded(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("cipx")).expect("cluster");
    let _echo = echo_all(&c);
    let _k = Kpng::start(
        b,
        &c.node1.ns,
        &manifest(&[svc(
            "web",
            10,
            "ClusterIP",
            "",
            &[("pod1a", Cond::Ready), ("pod2a", Cond::Ready)],
        )]),
        &[],
    );
    let target = sa(cip(10, false), SVC_PORT);
    for (who, ns) in [("node1", &c.node1.ns), ("ext", &c.ext.ns)] {
        let results = probes(ns, Proto::Tcp, target, 30);
        assert_eq!(
            names(&tally(&results)),
            set(&["pod1a", "pod2a"]),
            "{who}: {:?}",
            tally(&results)
        );
        for r in &results {
            assert_masqueraded(r, &["pod1a", "pod2a"]);
        }
    }
}

pub fn udp_services_are_load_balanced(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("udp")).expect("cluster");
    let _echo = echo_all(&c);
    let _k = Kpng::start(
        b,
        &c.node1.ns,
        &manifest(&[svc(
            "dns",
            10,
            "NodePort",
            "externalIPs: [198.51.100.10]",
            ALL3,
        )]),
        &[],
    );
    let all = ["pod1a", "pod1b", "pod2a"];
    let pod = c.pod("pod1b");
    // One datagram first, so that the test fails fast while the bug is there.
    answered(
        &probe(&pod.ns, Proto::Udp, sa(cip(10, false), SVC_PORT), OK_T),
        &all,
    );
    // From a pod: every endpoint, no masquerade (except the hairpin to itself).
    let results = probes(&pod.ns, Proto::Udp, sa(cip(10, false), SVC_PORT), 60);
    assert_eq!(names(&tally(&results)), set(&all), "{:?}", tally(&results));
    for r in results
        .iter()
        .filter(|r| r.server_name.as_deref() != Some("pod1b"))
    {
        assert_direct(b, r, &all, pod.ipv4.into());
    }
    // From the node and from outside: ClusterIP, node port, external IP; masqueraded.
    let cases = [
        ("node1 ClusterIP", &c.node1.ns, sa(cip(10, false), SVC_PORT)),
        ("ext ClusterIP", &c.ext.ns, sa(cip(10, false), SVC_PORT)),
        (
            "ext NodePort",
            &c.ext.ns,
            sa(addr::NODE1_LAN_V4.into(), node_port(10)),
        ),
        ("ext externalIP", &c.ext.ns, sa(vip(10), SVC_PORT)),
        ("ext IPv6 ClusterIP", &c.ext.ns, sa(cip(10, true), SVC_PORT)),
        ("pod IPv6 ClusterIP", &pod.ns, sa(cip(10, true), SVC_PORT)),
    ];
    // 60 datagrams each: one of three endpoints is missed by chance with p < 3·(2/3)^60 ≈ 1e-10
    // (30 made it 2e-5 a case, 1e-4 a run of the six).
    for (what, ns, target) in cases {
        let results = probes(ns, Proto::Udp, target, 60);
        assert_eq!(
            names(&tally(&results)),
            set(&all),
            "{what}: {:?}",
            tally(&results)
        );
        if what.starts_with("pod") {
            continue;
        }
        for r in &results {
            assert_masqueraded(r, &all);
        }
    }
}

// ---------------------------------------------------------------------------------------
// 3. REJECT vs DROP.
// ---------------------------------------------------------------------------------------

pub fn wrong_port_unallocated_ip_and_no_endpoints(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("rej")).expect("cluster");
    let _echo = echo_all(&c);
    let _k = Kpng::start(
        b,
        &c.node1.ns,
        &manifest(&[
            svc("web", 10, "ClusterIP", "", &[("pod2a", Cond::Ready)]),
            svc("empty", 20, "NodePort", "externalIPs: [198.51.100.20]", &[]),
        ]),
        &[],
    );
    let pod = &c.pod("pod1a").ns;
    let active = sa(cip(10, false), SVC_PORT);
    assert_direct(
        b,
        &probe(pod, Proto::Tcp, active, OK_T),
        &["pod2a"],
        addr::POD1A_V4.into(),
    );
    // Each client gets few ICMP errors in a row: the node rate-limits them per
    // destination (a burst of 6, then 1/s), and a rate-limited REJECT looks like a DROP.
    //
    // Wrong port on an active ClusterIP: rejected (nftables), or left alone (iptables:
    // the packet is routed on unchanged; nothing in this topology answers it).
    let wrong_port = b.behaviour().wrong_port;
    // A refused TCP connection is refused at once, IPv6 too (a TCP reset: TCP_REJECT_T).
    let wrong = |proto| match wrong_port {
        Unserved::Rejected => (reject_t(proto), Outcome::Refused),
        Unserved::Untouched => (DROP_T, Outcome::Timeout),
    };
    for (proto, v6) in [
        (Proto::Tcp, false),
        (Proto::Tcp, true),
        (Proto::Udp, false),
        (Proto::Udp, true),
    ] {
        let (wrong_t, wrong_outcome) = wrong(proto);
        let r = probe(pod, proto, sa(cip(10, v6), 81), wrong_t);
        assert_outcome(
            &r,
            wrong_outcome,
            &format!("pod {proto} v6={v6} wrong port"),
        );
    }
    for v6 in [false, true] {
        let (wrong_t, wrong_outcome) = wrong(Proto::Tcp);
        let r = probe(&c.ext.ns, Proto::Tcp, sa(cip(10, v6), 81), wrong_t);
        assert_outcome(&r, wrong_outcome, &format!("ext v6={v6} wrong port"));
    }
    for proto in [Proto::Tcp, Proto::Udp] {
        let r = probe(&c.node1.ns, proto, sa(cip(10, false), 81), wrong(proto).0);
        match wrong_port {
            Unserved::Rejected => assert_rejected_locally(&r, &format!("node1 {proto} wrong port")),
            Unserved::Untouched => {
                assert_ne!(r.outcome, Outcome::Ok, "node1 {proto} wrong port: {r}")
            }
        }
    }
    // An unallocated IP inside the Service CIDR: dropped (nftables), or routed on
    // unchanged (iptables); either way nobody answers.
    for (who, ns) in [("pod", pod), ("ext", &c.ext.ns)] {
        for ip in [cip(99, false), cip(99, true)] {
            let r = probe(ns, Proto::Tcp, sa(ip, SVC_PORT), DROP_T);
            assert_outcome(&r, Outcome::Timeout, &format!("{who} unallocated {ip}"));
        }
    }
    let r = probe(
        &c.node1.ns,
        Proto::Udp,
        sa(cip(99, false), SVC_PORT),
        DROP_T,
    );
    assert_ne!(r.outcome, Outcome::Ok, "node1 → unallocated ClusterIP: {r}");
    // No endpoints: rejected on every address of the Service.
    for (proto, v6) in [
        (Proto::Tcp, false),
        (Proto::Tcp, true),
        (Proto::Udp, false),
        (Proto::Udp, true),
    ] {
        let r = probe(pod, proto, sa(cip(20, v6), SVC_PORT), reject_t(proto));
        assert_outcome(
            &r,
            Outcome::Refused,
            &format!("pod {proto} v6={v6} ClusterIP without endpoints"),
        );
    }
    for proto in [Proto::Tcp, Proto::Udp] {
        let r = probe(
            &c.node1.ns,
            proto,
            sa(cip(20, false), SVC_PORT),
            reject_t(proto),
        );
        assert_rejected_locally(&r, &format!("node1 {proto} ClusterIP without endpoints"));
    }
    let np4 = sa(addr::NODE1_LAN_V4.into(), node_port(20));
    let np6 = sa(addr::NODE1_LAN_V6.into(), node_port(20));
    let eip = sa(vip(20), SVC_PORT);
    for (proto, target) in [
        (Proto::Tcp, sa(cip(20, false), SVC_PORT)),
        (Proto::Tcp, np4),
        (Proto::Tcp, np6),
        (Proto::Tcp, eip),
        (Proto::Udp, np4),
        (Proto::Udp, eip),
    ] {
        let r = probe(&c.ext.ns, proto, target, reject_t(proto));
        assert_outcome(
            &r,
            Outcome::Refused,
            &format!("ext {proto} {target} without endpoints"),
        );
    }
}

// ---------------------------------------------------------------------------------------
// 4. NodePort.
// ---------------------------------------------------------------------------------------

pub fn node_port_default_addresses_and_loopback(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("np")).expect("cluster");
    let _echo = echo_all(&c);
    let _k = Kpng::start(
        b,
        &c.node1.ns,
        &manifest(&[svc("np", 10, "NodePort", "", ALL3)]),
        &[],
    );
    let all = ["pod1a", "pod1b", "pod2a"];
    for ip in [
        IpAddr::from(addr::NODE1_LAN_V4),
        IpAddr::from(addr::NODE1_LAN_V6),
    ] {
        let results = probes(&c.ext.ns, Proto::Tcp, sa(ip, node_port(10)), 45);
        assert_eq!(
            names(&tally(&results)),
            set(&all),
            "ext {ip}: {:?}",
            tally(&results)
        );
        for r in &results {
            assert_masqueraded(r, &all);
        }
        // From node1 itself, to its own address.
        let r = probe(&c.node1.ns, Proto::Tcp, sa(ip, node_port(10)), OK_T);
        assert_masqueraded(&r, &all);
    }
    // Loopback: never in nftables mode; 127.0.0.1 in iptables mode
    // (`--iptables-localhost-nodeports`, on by default, sets route_localnet), never ::1.
    let behaviour = b.behaviour();
    let r = probe(
        &c.node1.ns,
        Proto::Tcp,
        sa("127.0.0.1".parse().expect("ip"), node_port(10)),
        OK_T,
    );
    if behaviour.localhost_node_ports {
        assert_masqueraded(&r, &all);
    } else {
        assert_outcome(&r, Outcome::Refused, "node1 → 127.0.0.1 node port");
    }
    let r = probe(
        &c.node1.ns,
        Proto::Tcp,
        sa("::1".parse().expect("ip"), node_port(10)),
        REJECT_T,
    );
    assert_outcome(&r, Outcome::Refused, "node1 → ::1 node port");
    // Other local addresses (here: the pod bridge): not served by default in nftables mode
    // (primary IPs only), served in iptables mode (every local address).
    let r = probe(
        &c.pod("pod1a").ns,
        Proto::Tcp,
        sa(addr::NODE1_POD_GW_V4.into(), node_port(10)),
        OK_T,
    );
    match behaviour.default_node_port_addresses {
        NodePortScope::PrimaryIps => {
            assert_outcome(&r, Outcome::Refused, "pod → cbr0 address node port")
        }
        NodePortScope::AllLocal => assert_masqueraded(&r, &all),
    }
}

// ---------------------------------------------------------------------------------------
// 5. External IPs and load-balancer source ranges.
// ---------------------------------------------------------------------------------------

pub fn external_ip_and_load_balancer_source_ranges(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("lb")).expect("cluster");
    let _echo = echo_all(&c);
    let eps: Eps<'_> = &[("pod1a", Cond::Ready), ("pod2a", Cond::Ready)];
    let two = ["pod1a", "pod2a"];
    let objects = |ranges: &str| {
        manifest(&[
            svc("eip", 30, "ClusterIP", "externalIPs: [198.51.100.30]", eps),
            svc(
                "lb",
                40,
                "LoadBalancer",
                &format!("loadBalancerSourceRanges: [{ranges}]"),
                eps,
            ),
        ])
    };
    let mut k = Kpng::start(
        b,
        &c.node1.ns,
        &objects("192.168.100.0/24, 10.244.0.0/16"),
        &[],
    );
    // externalIP from outside: works, masqueraded (externalTrafficPolicy Cluster).
    let results = probes(&c.ext.ns, Proto::Tcp, sa(vip(30), SVC_PORT), 30);
    assert_eq!(names(&tally(&results)), set(&two), "{:?}", tally(&results));
    for r in &results {
        assert_masqueraded(r, &two);
    }
    // externalIP from a pod: works, and is masqueraded too (as in kube-proxy, external
    // destinations with policy Cluster always masquerade).
    let pod = c.pod("pod1b");
    assert_pod_masqueraded(
        b,
        &probe(&pod.ns, Proto::Tcp, sa(vip(30), SVC_PORT), OK_T),
        &two,
        pod.ipv4.into(),
    );

    // Load-balancer IP, sources inside the ranges.
    let lb = sa(vip(40), SVC_PORT);
    // 30 connections: both of two endpoints but for p = 2^-29 (20 left 2e-6).
    let results = probes(&c.ext.ns, Proto::Tcp, lb, 30);
    assert_eq!(names(&tally(&results)), set(&two), "{:?}", tally(&results));
    for r in &results {
        assert_masqueraded(r, &two);
    }
    assert_masqueraded(&probe(&pod.ns, Proto::Tcp, lb, OK_T), &two);
    // A source outside the ranges (the ClusterIP and node port are not filtered).
    k.apply(&objects("203.0.113.0/24"));
    assert_outcome(
        &probe(&c.ext.ns, Proto::Tcp, lb, DROP_T),
        Outcome::Timeout,
        "ext → LB IP outside the source ranges",
    );
    assert_outcome(
        &probe(&pod.ns, Proto::Tcp, lb, DROP_T),
        Outcome::Timeout,
        "pod → LB IP outside the source ranges",
    );
    assert_masqueraded(
        &probe(
            &c.ext.ns,
            Proto::Tcp,
            sa(addr::NODE1_LAN_V4.into(), node_port(40)),
            OK_T,
        ),
        &two,
    );
    assert_direct(
        b,
        &probe(&pod.ns, Proto::Tcp, sa(cip(40, false), SVC_PORT), OK_T),
        &two,
        pod.ipv4.into(),
    );
    // And back: allowed again.
    k.apply(&objects("192.168.100.0/24"));
    assert_masqueraded(&probe(&c.ext.ns, Proto::Tcp, lb, OK_T), &two);
    // A range holding the node and the LB IP (every source here): with the LB IP allowed
    // beside the range that holds it, the interval set refused every full transaction and
    // no Service of the node was programmed (a sync that fails fails the test). The restart
    // makes the full sync: a partial one only added the range around the LB IP, which the
    // kernel does not catch.
    k.apply(&objects("0.0.0.0/0"));
    k.restart();
    assert_masqueraded(&probe(&c.ext.ns, Proto::Tcp, lb, OK_T), &two);
    assert_masqueraded(
        &probe(&c.ext.ns, Proto::Tcp, sa(vip(30), SVC_PORT), OK_T),
        &two,
    );
}

/// Two Services name one IP, port and protocol, one as its load-balancer IP, the other as an
/// external IP (the API server allocates neither): the older one keeps the frontend whole, its firewall
/// (source ranges) and its endpoints, the newer one's is not programmed (its ClusterIP is), in
/// every backend and in `kpng trace` (each probe is traced). Creation times decide against the
/// names: without them, `copy` (first by name) would keep it. When the owner goes, the other
/// takes the frontend over, unfiltered.
pub fn external_ip_shared_by_two_services_goes_to_the_older(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("xs")).expect("cluster");
    let _echo = echo_all(&c);
    let created = |text: String, name: &str, at: &str| {
        text.replace(
            &format!("name: {name}}}"),
            &format!("name: {name}, creationTimestamp: \"{at}\"}}"),
        )
    };
    let objects = |ranges: &str, with_owner: bool| {
        let mut objects = vec![created(
            svc_v4(
                "copy",
                51,
                "ClusterIP",
                &format!("externalIPs: [{}]", vip(50)),
                &[("pod2a", Cond::Ready)],
            ),
            "copy",
            "2025-06-01T00:00:00Z",
        )];
        if with_owner {
            objects.push(created(
                svc_v4(
                    "shared-lb",
                    50,
                    "LoadBalancer",
                    &format!("loadBalancerSourceRanges: [{ranges}]"),
                    &[("pod1a", Cond::Ready)],
                ),
                "shared-lb",
                "2024-01-01T00:00:00Z",
            ));
        }
        manifest(&objects)
    };
    let mut k = Kpng::start(b, &c.node1.ns, &objects("203.0.113.0/24", true), &[]);
    let target = sa(vip(50), SVC_PORT);
    // The outside (192.168.100.0/24) is outside the older Service's ranges: dropped, not
    // sent to the newer Service's endpoint.
    assert_outcome(
        &probe(&c.ext.ns, Proto::Tcp, target, DROP_T),
        Outcome::Timeout,
        "ext → the shared IP, outside the older Service's source ranges",
    );
    // The newer Service keeps its ClusterIP.
    let pod = c.pod("pod1b");
    assert_direct(
        b,
        &probe(&pod.ns, Proto::Tcp, sa(cip(51, false), SVC_PORT), OK_T),
        &["pod2a"],
        pod.ipv4.into(),
    );
    // Allowed: only the older Service's endpoint answers.
    k.apply(&objects("192.168.100.0/24", true));
    let results = probes(&c.ext.ns, Proto::Tcp, target, 10);
    assert_eq!(
        names(&tally(&results)),
        set(&["pod1a"]),
        "{:?}",
        tally(&results)
    );
    // The newer Service was told, naming both.
    k.wait_logged("the newer Service's warning", |err| {
        err.contains(
            "Service default/copy: field spec.externalIPs: 198.51.100.50 port 80/TCP is also \
             Service default/shared-lb's",
        )
    });
    // The owner goes: the newer Service takes the IP over, without any source range.
    k.apply(&objects("192.168.100.0/24", false));
    let results = probes(&c.ext.ns, Proto::Tcp, target, 10);
    assert_eq!(
        names(&tally(&results)),
        set(&["pod2a"]),
        "{:?}",
        tally(&results)
    );
}

/// Service A's external IP is node1's address and its port is Service B's node port: both
/// frontends are node1-address:port. kube-proxy's nftables `services` chain matches the
/// Service IPs (ClusterIPs, external and load-balancer IPs) before the node ports, so A owns
/// it, from node1's pods and from outside, whichever Service came first; once A is deleted,
/// B's node port serves it. Every step is a change's sync (no periodic sync in this test:
/// `--sync-period 1h`). Where node1's sockets are translated at `connect()`, each connection
/// from pod1b must have been (no NAT entry in node1's conntrack): a key the programs lost
/// would still reach A through the nftables rules beside them.
pub fn external_ip_on_a_node_address_wins_over_a_node_port(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("xnp")).expect("cluster");
    let _echo = echo_all(&c);
    let node_ip = IpAddr::from(addr::NODE1_LAN_V4);
    let shared = node_port(61);
    let external = format!(
        "{}---\n{}",
        service_fams(
            "xip",
            60,
            "ClusterIP",
            &format!("externalIPs: [{node_ip}]"),
            false
        )
        .replace(
            &format!("port: {SVC_PORT}, protocol"),
            &format!("port: {shared}, protocol")
        ),
        slices("xip", &[("pod1a", Cond::Ready)])
    );
    let node_port_svc = svc_v4("np", 61, "NodePort", "", &[("pod2a", Cond::Ready)]);
    let target = sa(node_ip, shared);
    let pod = c.pod("pod1b");
    let check = |step: &str, owner: &str, from_outside: bool| {
        let results = probes(&pod.ns, Proto::Tcp, target, 10);
        assert_eq!(
            names(&tally(&results)),
            set(&[owner]),
            "{step}: pod1b → {target}: {:?}",
            tally(&results)
        );
        if b.behaviour().translates_local_sockets {
            let tracked = c
                .node1
                .ns
                .exec([
                    "conntrack",
                    "-L",
                    "-p",
                    "tcp",
                    "--orig-src",
                    &pod.ipv4.to_string(),
                    "--orig-dst",
                    &node_ip.to_string(),
                    "--dport",
                    &shared.to_string(),
                ])
                .expect("conntrack");
            let tracked = String::from_utf8_lossy(&tracked.stdout);
            assert!(
                !tracked.contains("dport="),
                "{step}: pod1b's connections were translated at connect(), not by the \
                 rules: {tracked:?}"
            );
        }
        if from_outside {
            let results = probes(&c.ext.ns, Proto::Tcp, target, 10);
            assert_eq!(
                names(&tally(&results)),
                set(&[owner]),
                "{step}: ext → {target}: {:?}",
                tally(&results)
            );
        }
    };
    let mut k = Kpng::start(
        b,
        &c.node1.ns,
        &manifest(&[external.clone(), node_port_svc.clone()]),
        &["--sync-period", "1h"],
    );
    check("both Services", "pod1a", true);
    k.apply(&manifest(std::slice::from_ref(&external)));
    check("the node port's Service deleted", "pod1a", false);
    k.apply(&manifest(&[external, node_port_svc.clone()]));
    check("the node port's Service back", "pod1a", false);
    k.apply(&manifest(&[node_port_svc]));
    check("the external IP's Service deleted", "pod2a", true);
}

/// One Service naming its load-balancer IP among its external IPs too, with source ranges
/// that leave the outside out. nftables mode (one map key for both, the firewall keyed by the
/// load-balancer IP) drops the outside; iptables mode matches the external-IP rule first and
/// lets it through, without the firewall. Whatever a backend does, `kpng trace` must say it
/// (every probe here is checked against the trace).
pub fn own_external_ip_that_is_its_load_balancer_ip(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("xlb")).expect("cluster");
    let _echo = echo_all(&c);
    let _k = Kpng::start(
        b,
        &c.node1.ns,
        &manifest(&[svc_v4(
            "both",
            52,
            "LoadBalancer",
            &format!(
                "externalIPs: [{}], loadBalancerSourceRanges: [203.0.113.0/24]",
                vip(52)
            ),
            &[("pod2a", Cond::Ready)],
        )]),
        &[],
    );
    let r = probe(&c.ext.ns, Proto::Tcp, sa(vip(52), SVC_PORT), DROP_T);
    let expected = if b.external_ips_before_load_balancers() {
        Outcome::Ok
    } else {
        Outcome::Timeout
    };
    assert_outcome(
        &r,
        expected,
        "ext → the IP that is both, outside the source ranges",
    );
}

// ---------------------------------------------------------------------------------------
// 6. externalTrafficPolicy Local.
// ---------------------------------------------------------------------------------------

pub fn external_traffic_policy_local(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("etp")).expect("cluster");
    let _echo = echo_all(&c);
    let _k = Kpng::start(
        b,
        &c.node1.ns,
        &manifest(&[
            svc(
                "local",
                50,
                "LoadBalancer",
                "externalTrafficPolicy: Local",
                &[("pod1a", Cond::Ready), ("pod2a", Cond::Ready)],
            ),
            svc(
                "remote",
                51,
                "LoadBalancer",
                "externalTrafficPolicy: Local",
                &[("pod2a", Cond::Ready)],
            ),
        ]),
        &[],
    );
    let ext_ip = IpAddr::from(addr::EXT_V4);
    // From outside: only the local endpoint, which sees the real client address.
    for (what, target) in [
        ("LB IP", sa(vip(50), SVC_PORT)),
        ("node port", sa(addr::NODE1_LAN_V4.into(), node_port(50))),
    ] {
        let results = probes(&c.ext.ns, Proto::Tcp, target, 20);
        assert_eq!(
            names(&tally(&results)),
            set(&["pod1a"]),
            "ext {what}: {:?}",
            tally(&results)
        );
        for r in &results {
            assert_direct(b, r, &["pod1a"], ext_ip);
        }
    }
    // IPv6 node port too.
    let r = probe(
        &c.ext.ns,
        Proto::Tcp,
        sa(addr::NODE1_LAN_V6.into(), node_port(50)),
        OK_T,
    );
    assert_direct(b, &r, &["pod1a"], addr::EXT_V6.into());
    // From a pod: short-circuited to all (cluster) endpoints, not masqueraded.
    let pod = c.pod("pod1b");
    for target in [
        sa(vip(50), SVC_PORT),
        sa(addr::NODE1_LAN_V4.into(), node_port(50)),
    ] {
        let results = probes(&pod.ns, Proto::Tcp, target, 30);
        assert_eq!(
            names(&tally(&results)),
            set(&["pod1a", "pod2a"]),
            "pod → {target}: {:?}",
            tally(&results)
        );
        for r in &results {
            assert_direct(b, r, &["pod1a", "pod2a"], pod.ipv4.into());
        }
    }
    // From the node itself: works (to any endpoint, masqueraded).
    for target in [
        sa(vip(50), SVC_PORT),
        sa(addr::NODE1_LAN_V4.into(), node_port(50)),
    ] {
        let r = probe(&c.node1.ns, Proto::Tcp, target, OK_T);
        assert_masqueraded(&r, &["pod1a", "pod2a"]);
    }
    // Only a remote endpoint: external traffic is dropped, pods still get through.
    for target in [
        sa(vip(51), SVC_PORT),
        sa(addr::NODE1_LAN_V4.into(), node_port(51)),
    ] {
        let r = probe(&c.ext.ns, Proto::Tcp, target, DROP_T);
        assert_outcome(
            &r,
            Outcome::Timeout,
            &format!("ext → {target}, no local endpoint"),
        );
        let r = probe(&pod.ns, Proto::Tcp, target, OK_T);
        assert_direct(b, &r, &["pod2a"], pod.ipv4.into());
    }
    // The ClusterIP is not affected by the external policy.
    let results = probes(&pod.ns, Proto::Tcp, sa(cip(51, false), SVC_PORT), 5);
    assert_eq!(names(&tally(&results)), set(&["pod2a"]));
}

// ---------------------------------------------------------------------------------------
// 7. internalTrafficPolicy Local.
// ---------------------------------------------------------------------------------------

pub fn internal_traffic_policy_local(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("itp")).expect("cluster");
    let _echo = echo_all(&c);
    let itp = "internalTrafficPolicy: Local";
    let _k = Kpng::start(
        b,
        &c.node1.ns,
        &manifest(&[
            svc(
                "mixed",
                60,
                "ClusterIP",
                itp,
                &[("pod1b", Cond::Ready), ("pod2a", Cond::Ready)],
            ),
            svc("remote", 61, "ClusterIP", itp, &[("pod2a", Cond::Ready)]),
            svc("none", 62, "ClusterIP", itp, &[]),
        ]),
        &[],
    );
    let pod = c.pod("pod1a");
    for v6 in [false, true] {
        let results = probes(&pod.ns, Proto::Tcp, sa(cip(60, v6), SVC_PORT), 20);
        assert_eq!(
            names(&tally(&results)),
            set(&["pod1b"]),
            "v6={v6}: {:?}",
            tally(&results)
        );
        for r in &results {
            assert_direct(b, r, &["pod1b"], pod.ip(v6));
        }
        let r = probe(&pod.ns, Proto::Tcp, sa(cip(61, v6), SVC_PORT), DROP_T);
        assert_outcome(&r, Outcome::Timeout, "only a remote endpoint");
        let r = probe(&pod.ns, Proto::Tcp, sa(cip(62, v6), SVC_PORT), TCP_REJECT_T);
        assert_outcome(&r, Outcome::Refused, "no endpoints at all");
    }
    // The node itself follows the same policy.
    let r = probe(&c.node1.ns, Proto::Tcp, sa(cip(60, false), SVC_PORT), OK_T);
    assert_masqueraded(&r, &["pod1b"]);
}

// ---------------------------------------------------------------------------------------
// 8. Hairpin.
// ---------------------------------------------------------------------------------------

pub fn hairpin_to_own_service_is_masqueraded(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("hp")).expect("cluster");
    let _echo = echo_all(&c);
    let _k = Kpng::start(
        b,
        &c.node1.ns,
        &manifest(&[svc("self", 70, "ClusterIP", "", &[("pod1a", Cond::Ready)])]),
        &[],
    );
    let pod = c.pod("pod1a");
    for v6 in [false, true] {
        for r in pod
            .ns
            .probe(&Probe::tcp(sa(cip(70, v6), SVC_PORT)).count(5).timeout(OK_T))
            .expect("probe")
        {
            let seen = answered(&r, &["pod1a"]);
            if b.behaviour().translates_local_sockets {
                // A socket-translated hairpin is the pod connecting to itself.
                assert_eq!(seen, pod.ip(v6), "{r}");
                continue;
            }
            assert_ne!(seen, pod.ip(v6), "hairpin must be masqueraded: {r}");
            assert!(NODE1_IPS.contains(&seen), "{r}");
        }
        // Another pod reaching it is not masqueraded.
        let other = c.pod("pod1b");
        let r = probe(&other.ns, Proto::Tcp, sa(cip(70, v6), SVC_PORT), OK_T);
        assert_direct(b, &r, &["pod1a"], other.ip(v6));
    }
}

// ---------------------------------------------------------------------------------------
// 9. Session affinity.
// ---------------------------------------------------------------------------------------

/// The single server that answered all of `results`.
#[track_caller]
fn sole_server(results: &[ProbeResult], what: &str) -> String {
    let m = tally(results);
    assert_eq!(m.len(), 1, "{what}: expected one server, got {m:?}");
    let name = m.keys().next().expect("one key").clone();
    assert!(!name.starts_with('!'), "{what}: {m:?}");
    name
}

pub fn session_affinity_client_ip(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("aff")).expect("cluster");
    let _echo = echo_all(&c);
    let affinity = "externalIPs: [198.51.100.80], sessionAffinity: ClientIP, sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}";
    // IPv4 here; IPv6 in `session_affinity_dual_stack`.
    let mut k = Kpng::start(
        b,
        &c.node1.ns,
        &manifest(&[svc_v4("sticky", 80, "NodePort", affinity, ALL3)]),
        &[],
    );
    let cluster_ip = sa(cip(80, false), SVC_PORT);
    // A pod client sticks, and to the same endpoint through the node port and the external
    // IP (eBPF: translated at the socket, one affinity for the port's every address).
    let pod_server = sole_server(
        &probes(&c.pod("pod1b").ns, Proto::Tcp, cluster_ip, 20),
        "pod1b → ClusterIP",
    );
    for (what, target) in [
        ("node port", sa(addr::NODE1_LAN_V4.into(), node_port(80))),
        ("external IP", sa(vip(80), SVC_PORT)),
    ] {
        let s = sole_server(&probes(&c.pod("pod1b").ns, Proto::Tcp, target, 10), what);
        assert_eq!(
            s, pod_server,
            "pod1b → {what} must stick to the ClusterIP's choice"
        );
    }
    // ext sticks, and to the same endpoint whichever address of the Service it uses.
    let ext = &c.ext.ns;
    let sticky = sole_server(&probes(ext, Proto::Tcp, cluster_ip, 20), "ext → ClusterIP");
    for (what, target) in [
        ("node port", sa(addr::NODE1_LAN_V4.into(), node_port(80))),
        ("external IP", sa(vip(80), SVC_PORT)),
    ] {
        let s = sole_server(&probes(ext, Proto::Tcp, target, 10), what);
        assert_eq!(
            s, sticky,
            "ext → {what} must stick to the ClusterIP's choice"
        );
    }
    eprintln!("pod1b sticks to {pod_server}, ext to {sticky}");

    // Remove the endpoint ext sticks to: it moves to another one (the first SYN may be
    // dropped once while the stale affinity entry is removed; the retransmit succeeds).
    let remaining: Vec<(&str, Cond)> = ALL3.iter().copied().filter(|(p, _)| *p != sticky).collect();
    k.apply(&manifest(&[svc_v4(
        "sticky", 80, "NodePort", affinity, &remaining,
    )]));
    let r = probe(ext, Proto::Tcp, cluster_ip, Duration::from_secs(3));
    let names_left: Vec<&str> = remaining.iter().map(|(p, _)| *p).collect();
    answered(&r, &names_left);
    eprintln!(
        "first connection after removing {sticky}: {r} in {:?}",
        r.elapsed
    );
    // A second retransmission would come 3 s after the first SYN: below 2.5 s is one at most,
    // with room for a loaded machine (1.5 s left half a second after the retransmission).
    assert!(
        r.elapsed < Duration::from_millis(2500),
        "the first connection after the removal took {:?} (one SYN retransmission at most)",
        r.elapsed
    );
    let again = sole_server(
        &probes(ext, Proto::Tcp, cluster_ip, 10),
        "ext after removal",
    );
    assert_eq!(
        Some(again.as_str()),
        r.server_name.as_deref(),
        "sticks to the new choice"
    );
    let s = sole_server(
        &probes(ext, Proto::Tcp, sa(vip(80), SVC_PORT), 5),
        "external IP after removal",
    );
    assert_eq!(s, again, "still one choice per client across addresses");
}

pub fn session_affinity_with_external_traffic_policy_local(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("affl")).expect("cluster");
    let _echo = echo_all(&c);
    let _k = Kpng::start(
        b,
        &c.node1.ns,
        &manifest(&[svc_v4(
            "sticky",
            85,
            "LoadBalancer",
            "externalTrafficPolicy: Local, sessionAffinity: ClientIP",
            ALL3,
        )]),
        &[],
    );
    let local = ["pod1a", "pod1b"];
    let ext = &c.ext.ns;
    let results = probes(ext, Proto::Tcp, sa(vip(85), SVC_PORT), 20);
    let sticky = sole_server(&results, "ext → LB IP");
    for r in &results {
        assert_direct(b, r, &local, addr::EXT_V4.into());
    }
    let np = sa(addr::NODE1_LAN_V4.into(), node_port(85));
    let s = sole_server(&probes(ext, Proto::Tcp, np, 10), "ext → node port");
    assert_eq!(s, sticky, "LB IP and node port share the affinity");
    // Pods are short-circuited to all endpoints, and stick too.
    sole_server(
        &probes(&c.pod("pod1a").ns, Proto::Tcp, sa(vip(85), SVC_PORT), 20),
        "pod → LB IP",
    );
}

pub fn session_affinity_dual_stack(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("aff6")).expect("cluster");
    let _echo = echo_all(&c);
    let _k = Kpng::start(
        b,
        &c.node1.ns,
        &manifest(&[
            svc("sticky", 80, "ClusterIP", "sessionAffinity: ClientIP", ALL3),
            svc("plain", 81, "ClusterIP", "", &[("pod2a", Cond::Ready)]),
        ]),
        &[],
    );
    let pod = c.pod("pod1b");
    sole_server(
        &probes(&pod.ns, Proto::Tcp, sa(cip(80, false), SVC_PORT), 10),
        "IPv4 ClusterIP",
    );
    sole_server(
        &probes(&pod.ns, Proto::Tcp, sa(cip(80, true), SVC_PORT), 10),
        "IPv6 ClusterIP",
    );
    // A Service without affinity in the same family works too.
    let r = probe(&pod.ns, Proto::Tcp, sa(cip(81, true), SVC_PORT), OK_T);
    assert_direct(b, &r, &["pod2a"], pod.ipv6.into());
}

/// Foreign conntrack-mark bits (as a CNI sets them: bits 0, 2 and 16, outside kpng's default
/// `--conntrack-mark-mask` 0xff00f000) on every new connection through node1, set before
/// kpng's NAT (mangle priority) and counted after it (postrouting, after SNAT).
const FOREIGN_MARK: &str = "\
table ip foreign {
\tchain pre {
\t\ttype filter hook prerouting priority mangle; policy accept;
\t\tct state new ct mark set ct mark | 0x00010005
\t}
\tchain post {
\t\ttype filter hook postrouting priority 300; policy accept;
\t\tct state new ip daddr 10.244.0.0/16 counter comment \"all\"
\t\tct state new ip daddr 10.244.0.0/16 ct mark & 0x00010005 == 0x00010005 counter comment \"foreign-kept\"
\t\tct state new ip daddr 10.244.0.0/16 ct mark & 0xff00f000 != 0 counter comment \"affinity-id\"
\t}
}
";

/// The packet count of the rule of `table ip foreign` with this comment.
fn foreign_counter(ns: &Netns, comment: &str) -> u64 {
    let listing = ns
        .run_ok(["nft", "list", "table", "ip", "foreign"])
        .expect("nft list");
    let line = listing
        .lines()
        .find(|l| l.contains(&format!("comment \"{comment}\"")))
        .unwrap_or_else(|| panic!("no rule {comment} in {listing}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words
        .iter()
        .position(|w| *w == "packets")
        .unwrap_or_else(|| panic!("no counter in {line}"));
    words[at + 1].parse().expect("a count")
}

/// ClientIP affinity uses only kpng's bits of the conntrack mark: bits a CNI set on a
/// connection before kpng's rules are still there after them, and clients still stick.
pub fn session_affinity_keeps_foreign_conntrack_mark_bits(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("affm")).expect("cluster");
    let _echo = echo_all(&c);
    c.node1
        .ns
        .nft(FOREIGN_MARK)
        .expect("the foreign table loads");
    let affinity = "sessionAffinity: ClientIP";
    let _k = Kpng::start(
        b,
        &c.node1.ns,
        &manifest(&[svc_v4("sticky", 82, "NodePort", affinity, ALL3)]),
        &[],
    );
    let ext = &c.ext.ns;
    let cluster_ip = sa(cip(82, false), SVC_PORT);
    let sticky = sole_server(&probes(ext, Proto::Tcp, cluster_ip, 20), "ext → ClusterIP");
    let np = sa(addr::NODE1_LAN_V4.into(), node_port(82));
    let s = sole_server(&probes(ext, Proto::Tcp, np, 10), "ext → node port");
    assert_eq!(s, sticky, "the node port shares the ClusterIP's affinity");
    sole_server(
        &probes(&c.pod("pod1b").ns, Proto::Tcp, cluster_ip, 10),
        "pod1b → ClusterIP",
    );
    let all = foreign_counter(&c.node1.ns, "all");
    let kept = foreign_counter(&c.node1.ns, "foreign-kept");
    let ids = foreign_counter(&c.node1.ns, "affinity-id");
    eprintln!(
        "new connections to endpoints: {all}, foreign bits kept: {kept}, with an affinity id: {ids}"
    );
    assert!(
        all >= 40,
        "every probe is a new connection through node1: {all}"
    );
    assert_eq!(
        kept, all,
        "the foreign conntrack-mark bits survive kpng's rules"
    );
    assert_eq!(ids, all, "and kpng's own bits carry the affinity id");
}

// ---------------------------------------------------------------------------------------
// 10. Terminating endpoints.
// ---------------------------------------------------------------------------------------

pub fn terminating_endpoints_fallback(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("term")).expect("cluster");
    let _echo = echo_all(&c);
    let _k = Kpng::start(
        b,
        &c.node1.ns,
        &manifest(&[
            // Only a draining endpoint (and a dead one): the draining one serves.
            svc(
                "draining",
                90,
                "ClusterIP",
                "",
                &[("pod2a", Cond::Draining), ("pod1a", Cond::Dead)],
            ),
            // Only a dead endpoint: no endpoints.
            svc("dead", 91, "ClusterIP", "", &[("pod1a", Cond::Dead)]),
            // A ready endpoint exists: terminating ones are not used.
            svc(
                "mixed",
                92,
                "ClusterIP",
                "",
                &[("pod1a", Cond::Ready), ("pod2a", Cond::Draining)],
            ),
        ]),
        &[],
    );
    let pod = &c.pod("pod1b").ns;
    for v6 in [false, true] {
        let m = spread(pod, Proto::Tcp, sa(cip(90, v6), SVC_PORT), 20);
        assert_eq!(names(&m), set(&["pod2a"]), "draining v6={v6}: {m:?}");
        let r = probe(pod, Proto::Tcp, sa(cip(91, v6), SVC_PORT), TCP_REJECT_T);
        assert_outcome(&r, Outcome::Refused, "only a non-serving endpoint");
        let m = spread(pod, Proto::Tcp, sa(cip(92, v6), SVC_PORT), 20);
        assert_eq!(names(&m), set(&["pod1a"]), "mixed v6={v6}: {m:?}");
    }
}

// ---------------------------------------------------------------------------------------
// 11. IPv6.
// ---------------------------------------------------------------------------------------

pub fn ipv6_cluster_ip_and_node_port(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("v6")).expect("cluster");
    let _echo = echo_all(&c);
    let _k = Kpng::start(
        b,
        &c.node1.ns,
        &manifest(&[svc(
            "web6",
            100,
            "NodePort",
            "",
            &[("pod1a", Cond::Ready), ("pod2a", Cond::Ready)],
        )]),
        &[],
    );
    let two = ["pod1a", "pod2a"];
    let cluster_ip = sa(cip(100, true), SVC_PORT);
    let node_port6 = sa(addr::NODE1_LAN_V6.into(), node_port(100));
    let pod = c.pod("pod1b");
    for target in [cluster_ip, node_port6] {
        let results = probes(&pod.ns, Proto::Tcp, target, 30);
        assert_eq!(
            names(&tally(&results)),
            set(&two),
            "pod → {target}: {:?}",
            tally(&results)
        );
        for r in &results {
            if target == cluster_ip {
                assert_direct(b, r, &two, pod.ipv6.into());
            } else {
                // A node port is an external destination: policy Cluster masquerades.
                assert_pod_masqueraded(b, r, &two, pod.ipv6.into());
            }
        }
        let results = probes(&c.ext.ns, Proto::Tcp, target, 30);
        assert_eq!(
            names(&tally(&results)),
            set(&two),
            "ext → {target}: {:?}",
            tally(&results)
        );
        for r in &results {
            assert_masqueraded(r, &two);
        }
    }
    let r = probe(&c.node1.ns, Proto::Tcp, cluster_ip, OK_T);
    assert_masqueraded(&r, &two);
}

// ---------------------------------------------------------------------------------------
// 12. Live changes and restarts.
// ---------------------------------------------------------------------------------------

/// An echo server that keeps TCP connections open and answers every line with
/// `NAME LINE`.
pub const LINE_SERVER: &str = r#"
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

/// A client that opens one TCP connection, exchanges a line, waits until file
/// `argv[3]` exists and exchanges another line on the same connection.
pub const LINE_CLIENT: &str = r#"
import os, socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
f = c.makefile("rb")
c.sendall(b"one\n"); print("got", f.readline().decode().strip(), flush=True)
while not os.path.exists(sys.argv[3]): time.sleep(0.02)
c.sendall(b"two\n"); print("got", f.readline().decode().strip(), flush=True)
"#;

/// One TCP connection held open by [`LINE_CLIENT`] from a namespace to `ip:SVC_PORT`: the
/// first line is exchanged when it is made, the second when [`HeldConnection::second`] asks.
pub struct HeldConnection {
    client: Spawned,
    go: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl HeldConnection {
    /// Opens the connection from `ns` and waits until `server` answered its first line.
    #[track_caller]
    pub fn open(ns: &Netns, ip: IpAddr, server: &str) -> HeldConnection {
        let dir = tempfile::tempdir().expect("tempdir");
        let go = dir.path().join("go");
        let mut client = ns
            .spawn([
                "python3",
                "-c",
                LINE_CLIENT,
                &ip.to_string(),
                &SVC_PORT.to_string(),
                &go.display().to_string(),
            ])
            .expect("python3 line client");
        let first = format!("got {server} one");
        client
            .wait_for_line(|l| l == first, Duration::from_secs(5))
            .expect("first line over the held connection");
        HeldConnection {
            client,
            go,
            _dir: dir,
        }
    }

    /// Exchanges the second line over the same connection; `Err` when `server` did not answer
    /// it within 5 s (the connection was lost).
    pub fn second(&mut self, server: &str) -> kpng_testkit::Result<String> {
        std::fs::write(&self.go, "").expect("signal the client");
        let second = format!("got {server} two");
        self.client
            .wait_for_line(|l| l == second, Duration::from_secs(5))
    }
}

pub fn live_changes_and_restart_keep_established_connections(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("live")).expect("cluster");
    // pod1a and pod1b run the echo server; pod2a a line server holding connections.
    let _echo: Vec<Spawned> = ["pod1a", "pod1b"]
        .iter()
        .map(|p| c.pod(p).start_echo(EP_PORT).expect("echo"))
        .collect();
    let _line_server = start_line_server(&c, "pod2a");

    let hold = || svc("hold", 111, "ClusterIP", "", &[("pod2a", Cond::Ready)]);
    let mut k = Kpng::start(
        b,
        &c.node1.ns,
        &manifest(&[
            svc("live", 110, "NodePort", "", &[("pod1a", Cond::Ready)]),
            hold(),
        ]),
        &[],
    );
    let client = &c.ext.ns;
    let live = sa(cip(110, false), SVC_PORT);
    let live_np = sa(addr::NODE1_LAN_V4.into(), node_port(110));
    assert_eq!(
        names(&spread(client, Proto::Tcp, live, 10)),
        set(&["pod1a"])
    );

    // A long-lived connection through the other Service's ClusterIP (to a remote pod).
    let mut held = HeldConnection::open(&c.pod("pod1b").ns, cip(111, false), "pod2a");

    // Add an endpoint: traffic reaches it.
    k.apply(&manifest(&[
        svc(
            "live",
            110,
            "NodePort",
            "",
            &[("pod1a", Cond::Ready), ("pod1b", Cond::Ready)],
        ),
        hold(),
    ]));
    assert_eq!(
        names(&spread(client, Proto::Tcp, live, 30)),
        set(&["pod1a", "pod1b"])
    );

    // Restart kpng while probing: every new connection works (the rules stay while it
    // is down, and the full resync at start-up replaces them atomically). A proxy refuses
    // them while it is down, and serves again once it is back.
    //
    // A new connection every 40 ms from before kpng stops until a second after it serves
    // again, however long the restart takes (a fixed number of attempts ended before a slow
    // machine's restart did, and the last one was refused).
    let mut prober = ProbeStream::start(
        client,
        &Probe::tcp(live_np)
            .count(100_000)
            .interval(Duration::from_millis(40))
            .timeout(OK_T),
    );
    // Probing runs (five answers came back) before kpng stops.
    let mut results: Vec<ProbeResult> = (0..5).map(|_| prober.next()).collect();
    k.restart();
    let restarted = std::time::Instant::now();
    // Every result so far, then a second's more (what was printed before is read at once).
    loop {
        results.push(prober.next());
        if std::time::Instant::now() >= restarted + Duration::from_secs(1) {
            break;
        }
    }
    drop(prober);
    let m = tally(&results);
    if b.behaviour().serves_over_restart {
        assert_eq!(names(&m), set(&["pod1a", "pod1b"]), "over restart: {m:?}");
    } else {
        let served: BTreeSet<&str> = names(&m)
            .into_iter()
            .filter(|n| !n.starts_with('!'))
            .collect();
        assert_eq!(served, set(&["pod1a", "pod1b"]), "over restart: {m:?}");
        assert!(
            names(&m)
                .iter()
                .all(|n| !n.starts_with('!') || *n == "!refused"),
            "over restart, unserved connections are refused: {m:?}"
        );
        assert!(
            results.last().is_some_and(ProbeResult::is_ok),
            "after the restart: {m:?}"
        );
    }

    // A change made while kpng is down is applied when it starts (its first sync
    // replaces whatever the previous run left).
    k.stop();
    k.write(&manifest(&[
        svc("live", 110, "NodePort", "", &[("pod1b", Cond::Ready)]),
        hold(),
    ]));
    k.restart();
    assert_eq!(
        names(&spread(client, Proto::Tcp, live, 20)),
        set(&["pod1b"])
    );
    assert_eq!(
        names(&spread(client, Proto::Tcp, live_np, 10)),
        set(&["pod1b"])
    );

    // Same number of endpoints, another endpoint: the slot is rewritten.
    k.apply(&manifest(&[
        svc("live", 110, "NodePort", "", &[("pod1a", Cond::Ready)]),
        hold(),
    ]));
    assert_eq!(
        names(&spread(client, Proto::Tcp, live, 10)),
        set(&["pod1a"])
    );

    // The Service moves to another ClusterIP and node port: the old ones are gone (an
    // unallocated Service IP is dropped; nothing listens on a free node port, so the
    // node's own stack refuses it), the new ones work.
    k.apply(&manifest(&[
        svc("live", 112, "NodePort", "", &[("pod1a", Cond::Ready)]),
        hold(),
    ]));
    let moved = sa(cip(112, false), SVC_PORT);
    let moved_np = sa(addr::NODE1_LAN_V4.into(), node_port(112));
    for target in [moved, moved_np] {
        assert_masqueraded(&probe(client, Proto::Tcp, target, OK_T), &["pod1a"]);
    }
    assert_outcome(
        &probe(client, Proto::Tcp, live, DROP_T),
        Outcome::Timeout,
        "the old ClusterIP",
    );
    assert_outcome(
        &probe(client, Proto::Tcp, live_np, REJECT_T),
        Outcome::Refused,
        "the old node port",
    );

    // Remove the Service.
    k.apply(&manifest(&[hold()]));
    assert_outcome(
        &probe(client, Proto::Tcp, moved, DROP_T),
        Outcome::Timeout,
        "removed Service's ClusterIP",
    );
    assert_outcome(
        &probe(client, Proto::Tcp, moved_np, REJECT_T),
        Outcome::Refused,
        "removed Service's node port",
    );

    // The connection opened before the restart still works (a proxy's ended with it).
    let second = held.second("pod2a");
    if b.behaviour().serves_over_restart {
        second.expect("second line over the held connection, after a kpng restart");
    } else {
        assert!(
            second.is_err(),
            "a proxy's connection does not outlive the proxy"
        );
    }
}

// ---------------------------------------------------------------------------------------
// 13. --masquerade-all.
// ---------------------------------------------------------------------------------------

pub fn masquerade_all_masquerades_pod_traffic(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("masq")).expect("cluster");
    let _echo = echo_all(&c);
    let _k = Kpng::start(
        b,
        &c.node1.ns,
        &manifest(&[
            svc(
                "web",
                120,
                "ClusterIP",
                "",
                &[("pod1b", Cond::Ready), ("pod2a", Cond::Ready)],
            ),
            svc(
                "local",
                121,
                "NodePort",
                "externalTrafficPolicy: Local",
                &[("pod1b", Cond::Ready), ("pod2a", Cond::Ready)],
            ),
        ]),
        &["--masquerade-all"],
    );
    let pod = &c.pod("pod1a").ns;
    for v6 in [false, true] {
        // 30 connections: both of two endpoints but for p = 2^-29 (20 left 2e-6).
        let results = probes(pod, Proto::Tcp, sa(cip(120, v6), SVC_PORT), 30);
        assert_eq!(
            names(&tally(&results)),
            set(&["pod1b", "pod2a"]),
            "{:?}",
            tally(&results)
        );
        for r in &results {
            assert_pod_masqueraded(b, r, &["pod1b", "pod2a"], c.pod("pod1a").ip(v6));
        }
    }
    // masquerade-all masquerades ClusterIP destinations only (kube-proxy's rule matches the
    // ClusterIP): a pod to an eTP Local node port is short-circuited to every endpoint and
    // keeps its address. The probes are traced: the trace must say so too.
    for node in [
        IpAddr::from(addr::NODE1_LAN_V4),
        IpAddr::from(addr::NODE1_LAN_V6),
    ] {
        let results = probes(pod, Proto::Tcp, sa(node, node_port(121)), 30);
        assert_eq!(
            names(&tally(&results)),
            set(&["pod1b", "pod2a"]),
            "pod → {node} node port: {:?}",
            tally(&results)
        );
        for r in &results {
            assert_direct(b, r, &["pod1b", "pod2a"], c.pod("pod1a").ip(node.is_ipv6()));
        }
        // From outside: the local endpoint, which sees the client's address.
        let ext = if node.is_ipv6() {
            IpAddr::from(addr::EXT_V6)
        } else {
            IpAddr::from(addr::EXT_V4)
        };
        let r = probe(&c.ext.ns, Proto::Tcp, sa(node, node_port(121)), OK_T);
        assert_direct(b, &r, &["pod1b"], ext);
    }
}

// ---------------------------------------------------------------------------------------
// Other flags: --detect-local-mode, --nodeport-addresses.
// ---------------------------------------------------------------------------------------

pub fn detect_local_modes(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("dlm")).expect("cluster");
    let _echo = echo_all(&c);
    let m = manifest(&[
        svc("remote", 130, "ClusterIP", "", &[("pod2a", Cond::Ready)]),
        svc("local", 131, "ClusterIP", "", &[("pod1b", Cond::Ready)]),
    ]);
    let pod = c.pod("pod1a");
    for (flags, ext_masqueraded) in [
        (&["--detect-local-mode", "NodeCIDR"][..], true),
        (
            &[
                "--detect-local-mode",
                "BridgeInterface",
                "--pod-bridge-interface",
                "cbr0",
            ][..],
            true,
        ),
        // No detector: off-cluster traffic to ClusterIPs is not masqueraded either.
        (&["--detect-local-mode", "None"][..], false),
    ] {
        let mut k = Kpng::start(b, &c.node1.ns, &m, flags);
        for v6 in [false, true] {
            let r = probe(&pod.ns, Proto::Tcp, sa(cip(130, v6), SVC_PORT), OK_T);
            assert_direct(b, &r, &["pod2a"], pod.ip(v6));
            let r = probe(&c.ext.ns, Proto::Tcp, sa(cip(131, v6), SVC_PORT), OK_T);
            if ext_masqueraded {
                assert_masqueraded(&r, &["pod1b"]);
            } else {
                let ext: IpAddr = if v6 {
                    addr::EXT_V6.into()
                } else {
                    addr::EXT_V4.into()
                };
                assert_direct(b, &r, &["pod1b"], ext);
            }
        }
        k.stop();
    }
}

pub fn node_port_addresses_cidrs(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("npa")).expect("cluster");
    let _echo = echo_all(&c);
    // Only node1's pod-bridge IPv4 address takes node ports. A sync period of an hour: an
    // address change is followed through kpng's watch of the node's addresses, not a
    // periodic sync.
    let _k = Kpng::start(
        b,
        &c.node1.ns,
        &manifest(&[svc("np", 10, "NodePort", "", &[("pod2a", Cond::Ready)])]),
        &[
            "--nodeport-addresses",
            addr::NODE1_POD_CIDR_V4,
            "--sync-period",
            "1h",
        ],
    );
    let pod = c.pod("pod1a");
    let r = probe(
        &pod.ns,
        Proto::Tcp,
        sa(addr::NODE1_POD_GW_V4.into(), node_port(10)),
        OK_T,
    );
    assert_pod_masqueraded(b, &r, &["pod2a"], pod.ipv4.into());
    let lan_v4 = IpAddr::from(addr::NODE1_LAN_V4);
    let r = probe(&c.ext.ns, Proto::Tcp, sa(lan_v4, node_port(10)), REJECT_T);
    assert_outcome(&r, Outcome::Refused, &format!("ext → {lan_v4} node port"));
    // No IPv6 CIDR given: as upstream's NodePortAddresses, every local IPv6 address serves
    // IPv6 node ports.
    let lan_v6 = IpAddr::from(addr::NODE1_LAN_V6);
    let r = probe(&c.ext.ns, Proto::Tcp, sa(lan_v6, node_port(10)), OK_T);
    assert_masqueraded(&r, &["pod2a"]);
    // The ClusterIP is not affected.
    let r = probe(&pod.ns, Proto::Tcp, sa(cip(10, false), SVC_PORT), OK_T);
    assert_direct(b, &r, &["pod2a"], pod.ipv4.into());
    // An address the node gets later inside the CIDR (a VIP moving in) serves node ports at
    // once: kube-proxy reads the addresses again at its next sync, kpng when the kernel
    // announces the change.
    let added: IpAddr = "10.244.1.250".parse().expect("ip");
    c.node1
        .ns
        .ip(["addr", "add", "10.244.1.250/32", "dev", "cbr0"])
        .expect("add an address");
    let target = sa(added, node_port(10));
    wait_served_on_added_address(b, pod, target);
    let r = probe(&pod.ns, Proto::Tcp, target, OK_T);
    assert_pod_masqueraded(b, &r, &["pod2a"], pod.ipv4.into());
}

/// Waits until `pod` reaches the node port `target` on an address just added to node1, as
/// the backend serves it (eBPF: translated at the socket). Retried only for the address to
/// settle in the kernel and for kpng's watch of the node's addresses (a backend that lists
/// them follows at the sync the change triggers): 2 s, far below the tests' sync period of an
/// hour. Unchecked probes: `kpng trace` reads the addresses when asked, the data plane at
/// that sync.
fn wait_served_on_added_address(b: Backend, pod: &kpng_testkit::Pod, target: SocketAddr) {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    let pod_ip = pod.ip(target.is_ipv6());
    loop {
        let r = pod
            .ns
            .probe_one(&kpng_testkit::Probe::new(Proto::Tcp, target).timeout(REJECT_T))
            .expect("run kpng-probe");
        let translated = || r.client_addr_seen_by_server.map(|a| a.ip()) == Some(pod_ip);
        if r.outcome == Outcome::Ok && (!b.behaviour().translates_local_sockets || translated()) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{}, added to the node, does not serve the node port within 2 s: {r:?}",
            target.ip()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `--nodeport-addresses 0.0.0.0/0,::/0` (kube-proxy's match-all): every local address serves
/// node ports, one the node gains included, at once: the kernel matches "local", no periodic
/// sync has to list the new address (the sync period here is an hour).
pub fn node_port_addresses_match_all(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("npall")).expect("cluster");
    let _echo = echo_all(&c);
    let mut k = Kpng::start(
        b,
        &c.node1.ns,
        &manifest(&[svc("np", 11, "NodePort", "", &[("pod2a", Cond::Ready)])]),
        &[
            "--nodeport-addresses",
            "0.0.0.0/0,::/0",
            "--sync-period",
            "1h",
        ],
    );
    let pod = c.pod("pod1a");
    let lan_v4 = IpAddr::from(addr::NODE1_LAN_V4);
    let r = probe(&c.ext.ns, Proto::Tcp, sa(lan_v4, node_port(11)), OK_T);
    assert_masqueraded(&r, &["pod2a"]);
    // A new pod's veth brings only an IPv6 link-local address: not a change kpng follows
    // (it would log and sync once per pod started).
    let ns = &c.node1.ns;
    ns.ip([
        "link", "add", "npall0", "type", "veth", "peer", "name", "npall1",
    ])
    .expect("add a veth");
    for link in ["npall0", "npall1"] {
        ns.ip(["link", "set", link, "up"]).expect("link up");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !ns
        .run_ok(["ip", "-6", "addr", "show", "dev", "npall0"])
        .is_ok_and(|a| a.contains("fe80") && !a.contains("tentative"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no link-local address on the veth"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for (added, prefix) in [("10.244.1.251", 32), ("fd00:244:1::fb", 128)] {
        let added: IpAddr = added.parse().expect("ip");
        c.node1
            .ns
            .ip([
                "addr",
                "add",
                &format!("{added}/{prefix}"),
                "dev",
                "cbr0",
                "nodad",
            ])
            .expect("add an address");
        let target = sa(added, node_port(11));
        wait_served_on_added_address(b, pod, target);
        let r = probe(&pod.ns, Proto::Tcp, target, OK_T);
        assert_pod_masqueraded(b, &r, &["pod2a"], pod.ip(added.is_ipv6()));
    }
    // The watch reports in order: once the last address is logged, a report of the
    // link-local one would have come before it.
    // (Both addresses may be one report when the second came within the first's settle.)
    k.wait_logged("the last address reported", |log| {
        log.lines().any(|l| {
            l.contains("the node's addresses changed (gained") && l.contains("fd00:244:1::fb")
        })
    });
    let log = k.stderr();
    assert!(
        !log.lines()
            .any(|l| l.contains("the node's addresses changed") && l.contains("fe80")),
        "a link-local address was reported:\n{log}"
    );
}

// ---------------------------------------------------------------------------------------
// 14. No leftovers.
// ---------------------------------------------------------------------------------------

fn netns_list() -> BTreeSet<String> {
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

pub fn nothing_is_left_behind(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("gone")).expect("cluster");
    let names_before = c.namespace_names();
    let echo = echo_all(&c);
    let k = Kpng::start(
        b,
        &c.node1.ns,
        &manifest(&[svc("web", 10, "ClusterIP", "", ALL3)]),
        &[],
    );
    let (kpng, dir) = k.detach();
    let kpng = kpng.expect("kpng runs");
    let pid = kpng.id();
    let r = probe(
        &c.pod("pod1a").ns,
        Proto::Tcp,
        sa(cip(10, false), SVC_PORT),
        OK_T,
    );
    answered(&r, &["pod1a", "pod1b", "pod2a"]);
    // Dropping the cluster kills everything inside its namespaces, kpng included, even
    // before the guards go.
    drop(c);
    let listed = netns_list();
    for n in &names_before {
        assert!(!listed.contains(n), "namespace {n} left behind");
    }
    // SIGKILL is sent, but a process with many threads takes a moment to finish dying.
    let gone = || {
        !Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z"))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while !gone() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(gone(), "kpng (pid {pid}) still runs");
    drop(kpng);
    drop(echo);
    drop(dir);
}

/// GETs `url` from inside `ns` with curl: (status, headers lower-cased, body). Retries briefly:
/// health-check servers open right after a sync.
fn http_get(ns: &Netns, url: &str) -> (u16, BTreeMap<String, String>, String) {
    let mut last = String::new();
    for _ in 0..20 {
        if let Ok(out) = ns.run_ok(["curl", "-s", "-i", "--max-time", "2", url]) {
            let text = out.replace("\r\n", "\n");
            let (head, body) = text.split_once("\n\n").unwrap_or((&text, ""));
            let mut lines = head.lines();
            let status = lines
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let headers = lines
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.trim().to_lowercase(), v.trim().to_string()))
                .collect();
            return (status, headers, body.to_string());
        }
        last = format!("no answer from {url}");
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{last}");
}

pub fn health_check_node_port_reports_local_ready_endpoints(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("hc")).expect("cluster");
    let _echo = echo_all(&c);
    let lb = |eps: Eps<'_>| {
        manifest(&[svc(
            "hc",
            60,
            "LoadBalancer",
            "externalTrafficPolicy: Local, healthCheckNodePort: 32160",
            eps,
        )])
    };
    let mut k = Kpng::start(
        b,
        &c.node1.ns,
        &lb(&[
            ("pod1a", Cond::Ready),
            ("pod1b", Cond::Ready),
            ("pod2a", Cond::Ready),
        ]),
        &[],
    );
    let url = format!("http://{}:32160/any/path", addr::NODE1_LAN_V4);
    let body = |n: u32| {
        format!(
            "{{\n\t\"service\": {{\n\t\t\"namespace\": \"default\",\n\t\t\"name\": \"hc\"\n\t}},\n\t\"localEndpoints\": {n},\n\t\"serviceProxyHealthy\": true\n}}"
        )
    };

    // Two local ready endpoints (pod2a is on node2): 200, weight 2.
    let (status, headers, text) = http_get(&c.ext.ns, &url);
    assert_eq!(status, 200, "{headers:?} {text}");
    assert_eq!(
        headers.get("content-type").map(String::as_str),
        Some("application/json")
    );
    assert_eq!(
        headers.get("x-content-type-options").map(String::as_str),
        Some("nosniff")
    );
    assert_eq!(
        headers
            .get("x-load-balancing-endpoint-weight")
            .map(String::as_str),
        Some("2")
    );
    assert_eq!(text, body(2));
    // `kpng status` says what the load balancer just got.
    let answer = |k: &Kpng| {
        let status = k.status_json();
        status["services"]
            .as_array()
            .and_then(|ports| ports.iter().find(|p| p["service"] == "default/hc"))
            .map(|p| p["healthCheck"].clone())
            .unwrap_or_else(|| panic!("no default/hc in {status}"))
    };
    assert_eq!(
        answer(&k),
        serde_json::json!({"port": 32160, "status": 200, "localEndpoints": 2})
    );

    // A terminating local endpoint does not count; with none ready locally: 503.
    k.apply(&lb(&[("pod1a", Cond::Draining), ("pod2a", Cond::Ready)]));
    // kpng logs the sync before it brings the health-check servers up to date: the answer
    // may still be the last one for a moment.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (status, headers, text) = loop {
        let answer = http_get(&c.ext.ns, &url);
        if answer.0 != 200 || std::time::Instant::now() >= deadline {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status, 503, "{text}");
    assert_eq!(
        headers
            .get("x-load-balancing-endpoint-weight")
            .map(String::as_str),
        Some("0")
    );
    assert_eq!(text, body(0));
    assert_eq!(
        answer(&k),
        serde_json::json!({"port": 32160, "status": 503, "localEndpoints": 0})
    );

    // Mid-migration, local endpoints in IPv6 only: each family's listener answers with its
    // family's count, as kube-proxy's health server per family's proxier. The IPv4 listener
    // says 503 (kpng rejects IPv4 traffic: no IPv4 endpoint), the IPv6 one 200, weight 2;
    // one count over both families drew an IPv4 load balancer's traffic to a node refusing it.
    let v6_only = {
        let both = slices("hc", &[("pod1a", Cond::Ready), ("pod1b", Cond::Ready)]);
        let empty = slices("hc", &[]);
        let v4_empty = empty.split("---\n").next().expect("the IPv4 slice");
        let v6 = both.split("---\n").nth(1).expect("the IPv6 slice");
        format!(
            "{}---\n{v4_empty}---\n{v6}",
            service_fams(
                "hc",
                60,
                "LoadBalancer",
                "externalTrafficPolicy: Local, healthCheckNodePort: 32160",
                true
            )
        )
    };
    k.apply(&manifest(&[v6_only]));
    let url6 = format!("http://[{}]:32160/", addr::NODE1_LAN_V6);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (status, headers, text) = loop {
        let answer = http_get(&c.ext.ns, &url6);
        if answer.0 == 200 || std::time::Instant::now() >= deadline {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status, 200, "GET over IPv6: {text}");
    assert_eq!(text, body(2), "GET over IPv6");
    assert_eq!(
        headers
            .get("x-load-balancing-endpoint-weight")
            .map(String::as_str),
        Some("2")
    );
    let (status, _, text) = http_get(&c.ext.ns, &url);
    assert_eq!(status, 503, "GET over IPv4: {text}");
    assert_eq!(text, body(0), "GET over IPv4");
    // `kpng status` says each family's answer on its row.
    let status = k.status_json();
    let per_family: Vec<(String, serde_json::Value)> = status["services"]
        .as_array()
        .expect("services")
        .iter()
        .filter(|p| p["service"] == "default/hc" && p["protocol"] == "TCP")
        .map(|p| {
            (
                p["family"].as_str().unwrap_or("").to_string(),
                p["healthCheck"].clone(),
            )
        })
        .collect();
    assert_eq!(
        per_family,
        [
            (
                "IPv4".to_string(),
                serde_json::json!({"port": 32160, "status": 503, "localEndpoints": 0})
            ),
            (
                "IPv6".to_string(),
                serde_json::json!({"port": 32160, "status": 200, "localEndpoints": 2})
            ),
        ],
        "{status}"
    );

    // The Service turns eTP Cluster: the health check closes.
    k.apply(&manifest(&[svc(
        "hc",
        60,
        "LoadBalancer",
        "",
        &[("pod1a", Cond::Ready)],
    )]));
    // kpng says it closes the server; then the kernel shows the listener gone.
    k.wait_logged("the health check closed", |err| {
        err.lines()
            .any(|l| l.contains("closing health check") && l.contains("port=32160"))
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let listening = c
            .node1
            .ns
            .run_ok(["ss", "-H", "-l", "-t", "-n", "sport = :32160"])
            .expect("ss");
        if listening.trim().is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still listening on 32160 within 10 s:\n{listening}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        c.ext
            .ns
            .run_ok(["curl", "-s", "--max-time", "1", &url])
            .is_err(),
        "health check still open"
    );
}

/// The kernel's listening TCP sockets on `port` in `ns`, as `ss` names their local addresses,
/// sorted: where a load balancer's probe of the node can be answered.
fn tcp_listeners(ns: &Netns, port: u16) -> Vec<String> {
    let filter = format!("sport = :{port}");
    let out = ns
        .run_ok(["ss", "-H", "-l", "-t", "-n", filter.as_str()])
        .expect("ss");
    let mut local: Vec<String> = out
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .map(str::to_string)
        .collect();
    local.sort();
    local
}

/// Polls [`tcp_listeners`] until `done` holds, for at most 5 s: a timeout names `what`, what
/// was listened on and kpng's log.
fn wait_for_listeners(
    ns: &Netns,
    port: u16,
    k: &Kpng,
    what: &str,
    done: &dyn Fn(&[String]) -> bool,
) -> Vec<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let now = tcp_listeners(ns, port);
        if done(&now) {
            return now;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what} within 5 s: listening on {now:?}\n{}",
            k.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// With CIDR `--nodeport-addresses`, Service health checks listen where the node ports are, as
/// kube-proxy's (`GetNodeIPs`): on node1's IPv4 addresses inside the CIDR (its pod bridge's),
/// on every IPv6 address (no IPv6 CIDR given: upstream's rule per family), and not on its LAN
/// IPv4 address. An address node1 gets inside the CIDR is listened on within a sync period, and
/// one it loses is closed there, the others left serving.
pub fn health_check_listens_on_the_node_port_addresses(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("hcnpa")).expect("cluster");
    let _echo = echo_all(&c);
    let mut k = Kpng::start(
        b,
        &c.node1.ns,
        &manifest(&[svc(
            "hc",
            61,
            "LoadBalancer",
            "externalTrafficPolicy: Local, healthCheckNodePort: 32161",
            &[("pod1a", Cond::Ready), ("pod2a", Cond::Ready)],
        )]),
        &[
            "--nodeport-addresses",
            addr::NODE1_POD_CIDR_V4,
            "--sync-period",
            "1h",
        ],
    );
    let wait_for = |what: &str, done: &dyn Fn(&[String]) -> bool| {
        wait_for_listeners(&c.node1.ns, 32161, &k, what, done)
    };
    let gateway = format!("{}:32161", addr::NODE1_POD_GW_V4);
    let first = wait_for("the health check listening", &|l| !l.is_empty());
    assert_eq!(first, [gateway.clone(), "[::]:32161".to_string()]);
    // A load balancer probing the pod-bridge address gets its answer (one local endpoint)…
    let (status, _, text) = http_get(
        &c.pod("pod1a").ns,
        &format!("http://{}:32161/", addr::NODE1_POD_GW_V4),
    );
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("\"localEndpoints\": 1"), "{text}");
    let (status, _, text) = http_get(
        &c.ext.ns,
        &format!("http://[{}]:32161/", addr::NODE1_LAN_V6),
    );
    assert_eq!(status, 200, "IPv6 has no CIDR: every address; {text}");
    // …one probing the LAN IPv4 address, outside the CIDR, finds nothing listening.
    let lan = format!("http://{}:32161/", addr::NODE1_LAN_V4);
    assert!(
        c.ext
            .ns
            .run_ok(["curl", "-s", "--max-time", "1", &lan])
            .is_err(),
        "{lan} answers: it is outside --nodeport-addresses"
    );
    // `kpng trace` says the same: answered where the check listens, refused on the LAN
    // address (until 2026-12-07 it said kpng answered on any of the node's addresses).
    let trace = |to: String| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kpng"))
            .args(["trace", "--from", &addr::EXT_V4.to_string(), "--to", &to])
            .arg("--admin-socket")
            .arg(k.admin_socket())
            .output()
            .expect("kpng trace");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let on_gateway = trace(gateway.clone());
    assert!(
        on_gateway.contains("kpng's health-check server answers it on the node"),
        "{on_gateway}"
    );
    let on_lan = trace(format!("{}:32161", addr::NODE1_LAN_V4));
    assert!(
        on_lan.contains("but the Service health checks do not listen on it")
            && on_lan.contains("the client is refused (ECONNREFUSED)"),
        "{on_lan}"
    );
    // An address added inside the CIDR is listened on at the next periodic sync…
    c.node1
        .ns
        .ip(["addr", "add", "10.244.1.250/32", "dev", "cbr0"])
        .expect("add an address");
    let added = "10.244.1.250:32161".to_string();
    let now = wait_for("the added address listened on", &|l| l.contains(&added));
    assert_eq!(
        now,
        [gateway.clone(), added.clone(), "[::]:32161".to_string()]
    );
    // …and closed once the node loses it (a socket outlives its address), the others kept.
    c.node1
        .ns
        .ip(["addr", "del", "10.244.1.250/32", "dev", "cbr0"])
        .expect("delete the address");
    let now = wait_for("the removed address closed", &|l| !l.contains(&added));
    assert_eq!(now, [gateway, "[::]:32161".to_string()]);
    k.stop();
}

/// An edge node's IPv6 health checks with `--nodeport-addresses` an IPv6 CIDR only:
/// - an IPv6-only Service's check listens on IPv6 only (upstream's health server per family's
///   proxier), not also on `0.0.0.0` because IPv4 has no CIDR;
/// - an address added with duplicate address detection on (the default; the test cluster
///   turns it off) is listened on once the detection succeeds, within seconds: while
///   tentative it cannot be bound, and the detection's end is a gain for kpng's address
///   watch, not a periodic sync (an hour here) later;
/// - an address whose detection failed (node2 has it) is not the node's: neither in the
///   `nodeport-ips` set nor listened on, and no health check is reported not served.
pub fn ipv6_health_checks_follow_dad_and_the_service_families(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("hcdad")).expect("cluster");
    let _echo = echo_all(&c);
    let cluster_ip = cip(62, true);
    let service = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{namespace: default, name: hc6}}\n\
         spec: {{type: LoadBalancer, clusterIP: \"{cluster_ip}\", clusterIPs: [\"{cluster_ip}\"], \
         ipFamilies: [IPv6], ipFamilyPolicy: SingleStack, ports: [{{name: tcp, port: {SVC_PORT}, \
         protocol: TCP, targetPort: {EP_PORT}, nodePort: {np}}}], externalTrafficPolicy: Local, \
         healthCheckNodePort: 32162}}\n",
        np = node_port(62)
    );
    let objects = format!("{service}---\n{}", slices("hc6", &[("pod1a", Cond::Ready)]));
    let mut k = Kpng::start(
        b,
        &c.node1.ns,
        &manifest(&[objects]),
        &[
            "--nodeport-addresses",
            "fd00:100::/64",
            "--sync-period",
            "1h",
        ],
    );
    let node1 = &c.node1.ns;
    let listening = || tcp_listeners(node1, 32162);
    let wait_for = |what: &str, done: &dyn Fn(&[String]) -> bool| {
        wait_for_listeners(node1, 32162, &k, what, done)
    };
    let first = wait_for("the health check listening", &|l| !l.is_empty());
    assert_eq!(
        first,
        [format!("[{}]:32162", addr::NODE1_LAN_V6)],
        "an IPv6-only Service's check listens on IPv6 only"
    );
    // Duplicate address detection on node1's LAN link; node2 already has fd00:100::30.
    node1
        .sysctl("net.ipv6.conf.eth0.accept_dad", "1")
        .expect("accept_dad");
    c.node2
        .ns
        .ip(["addr", "add", "fd00:100::30/64", "dev", "eth0", "nodad"])
        .expect("node2's address");
    let added = std::time::Instant::now();
    for ip in ["fd00:100::20/64", "fd00:100::30/64"] {
        node1
            .ip(["addr", "add", ip, "dev", "eth0"])
            .expect("add an address");
    }
    let good = "[fd00:100::20]:32162".to_string();
    wait_for(
        "the address listened on once its detection succeeded",
        &|l| l.contains(&good),
    );
    eprintln!(
        "fd00:100::20 listened on {:?} after it was added",
        added.elapsed()
    );
    let (status, _, text) = http_get(&c.ext.ns, "http://[fd00:100::20]:32162/");
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("\"localEndpoints\": 1"), "{text}");
    // fd00:100::30's detection fails (node2 answers for it).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let addrs = node1
            .ip(["-o", "addr", "show", "dev", "eth0"])
            .expect("ip addr");
        if addrs
            .lines()
            .any(|l| l.contains("fd00:100::30/64") && l.contains("dadfailed"))
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "fd00:100::30's detection did not fail within 5 s:\n{addrs}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Time for a sync the kernel's notifications might bring.
    std::thread::sleep(Duration::from_secs(1));
    let set = node1
        .run_ok(["nft", "list", "set", "ip6", "kpng", "nodeport-ips"])
        .expect("nft list set");
    assert!(set.contains("fd00:100::20"), "{set}");
    assert!(
        !set.contains("fd00:100::30"),
        "an address whose detection failed is not the node's:\n{set}"
    );
    assert_eq!(
        listening(),
        [format!("[{}]:32162", addr::NODE1_LAN_V6), good],
        "not listened on where the detection failed"
    );
    let log = k.stderr();
    assert!(
        !log.contains("cannot start the health check"),
        "no health check failed to start:\n{log}"
    );
    k.stop();
}

// ---------------------------------------------------------------------------------------
// iptables only: kube-proxy's chains, and repair after someone flushes the tables.
// ---------------------------------------------------------------------------------------

/// The rules carry kube-proxy's chain names, and a periodic sync rewrites them after someone
/// flushed every table (kube-proxy's canary-chain check).
pub fn iptables_chains_and_flush_repair(b: Backend) {
    require_root!();
    let tool = b.iptables_tool().expect("an iptables backend");
    let c = Cluster::create(&b.prefix("flush")).expect("cluster");
    let _echo = echo_all(&c);
    let mut k = Kpng::start(
        b,
        &c.node1.ns,
        &manifest(&[svc("web", 10, "ClusterIP", "", &[("pod2a", Cond::Ready)])]),
        &["--sync-period", "1s"],
    );
    let node = &c.node1.ns;
    let saved = node
        .run_ok([&format!("{tool}-save"), "-t", "nat"])
        .expect("save");
    let chain = kpng_backend_iptables::names::PortChains::new("default/web:tcp", "tcp").cluster;
    assert!(
        saved.contains(&format!(":{chain} ")) && saved.contains("-j KUBE-SERVICES"),
        "kube-proxy's chains in node1:\n{saved}"
    );
    let pod = &c.pod("pod1a").ns;
    let target = sa(cip(10, false), SVC_PORT);
    assert_direct(
        b,
        &probe(pod, Proto::Tcp, target, OK_T),
        &["pod2a"],
        addr::POD1A_V4.into(),
    );

    let (ok, failed) = k.sync_counts();
    // `-F` and `-X` of every table in one restore: as separate commands, the second could
    // find our chains already put back (and referenced again) by the repair of the first.
    node.run_ok([
        "sh",
        "-c",
        &format!(
            "printf '*nat\\n-F\\n-X\\nCOMMIT\\n*filter\\n-F\\n-X\\nCOMMIT\\n\
             *mangle\\n-F\\n-X\\nCOMMIT\\n' | {tool}-restore --noflush"
        ),
    ])
    .expect("flush and delete every chain");
    // (No probe in between: the tampering watcher or the next periodic sync may repair it
    // at any moment.)
    k.wait_synced(ok, failed);
    k.wait_logged("the flush noticed", |s| {
        s.contains("were flushed") || s.contains("changed by someone else")
    });
    let saved = node
        .run_ok([&format!("{tool}-save"), "-t", "nat"])
        .expect("save");
    assert!(saved.contains(&format!(":{chain} ")), "rewritten:\n{saved}");
    assert_direct(
        b,
        &probe(pod, Proto::Tcp, target, OK_T),
        &["pod2a"],
        addr::POD1A_V4.into(),
    );
}
