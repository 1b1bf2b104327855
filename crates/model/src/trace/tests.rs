use std::sync::Arc;

use super::*;
use crate::key::{PortKey, ServiceKey};
use crate::service_port::{Endpoint, SessionAffinity};

fn ep(ip: &str, local: bool) -> Endpoint {
    Endpoint {
        ip: ip.parse().expect("ip"),
        port: 8080,
        is_local: local,
        ready: true,
        serving: true,
        terminating: false,
    }
}

fn web() -> ServicePort {
    let mut p = ServicePort::new(
        PortKey {
            service: ServiceKey::new("ns", "web"),
            port_name: "http".into(),
            protocol: Protocol::Tcp,
            family: Family::V4,
        },
        "10.96.0.10".parse().expect("ip"),
        80,
    );
    p.node_port = Some(30080);
    p.external_ips = vec!["192.0.2.10".parse().expect("ip")];
    p.load_balancer_ips = vec!["198.51.100.10".parse().expect("ip")];
    p.cluster_endpoints = vec![ep("10.244.1.5", true), ep("10.244.2.5", false)];
    p.local_endpoints = vec![ep("10.244.1.5", true)];
    p.has_any_endpoints = true;
    p
}

/// `web`'s IPv6 half.
fn web6() -> ServicePort {
    let mut p = ServicePort::new(
        PortKey {
            family: Family::V6,
            ..web().key
        },
        "fd00:96::10".parse().expect("ip"),
        80,
    );
    p.cluster_endpoints = vec![ep("fd00:244:1::5", true)];
    p.local_endpoints = p.cluster_endpoints.clone();
    p.has_any_endpoints = true;
    p
}

fn snapshot(ports: Vec<ServicePort>) -> Snapshot {
    let mut s = Snapshot {
        service_cidrs: vec!["10.96.0.0/16".parse().expect("cidr")],
        ..Snapshot::default()
    };
    for p in ports {
        s.ports.insert(p.key.clone(), Arc::new(p));
    }
    s
}

fn facts() -> NodeFacts {
    NodeFacts {
        local_ips: vec!["172.18.0.2".parse().expect("ip")],
        nodeport_ips: vec!["172.18.0.2".parse().expect("ip")],
        nodeport_setting: "primary".into(),
        node_ips_not_on_host: Vec::new(),
        node_ports_on: String::new(),
        service_cidrs: Vec::new(),
        local_pods: LocalPods::Cidrs(vec!["10.244.1.0/24".parse().expect("cidr")]),
        masquerade_all: false,
        backend: BackendTraits::default(),
        local_sockets: LocalSockets::default(),
        localhost_not_served: None,
        health_check_ips: None,
    }
}

struct Case {
    what: &'static str,
    port: fn(&mut ServicePort),
    from: &'static str,
    to: &'static str,
    verdict: Verdict,
    frontend: Option<Frontend>,
    endpoints: &'static [&'static str],
    masquerade: bool,
}

fn same(_: &mut ServicePort) {}

/// A family without a pod CIDR has no detection rule, so its ClusterIP traffic from outside
/// is not masqueraded (the backends write no rule for it; kube-proxy's no-op detector).
#[test]
fn clusterip_masquerade_follows_the_detection_of_the_packets_family() {
    let node = "172.18.0.2";
    let v6_node = "fd00:18::2";
    for (what, cidrs, from, to, masquerade) in [
        (
            "v4 CIDR, node to v4 ClusterIP",
            &["10.244.1.0/24"][..],
            node,
            "10.96.0.10:80",
            true,
        ),
        (
            "v4 CIDR, pod to v4 ClusterIP",
            &["10.244.1.0/24"][..],
            "10.244.1.7",
            "10.96.0.10:80",
            false,
        ),
        (
            "no CIDR at all, node to v4 ClusterIP",
            &[][..],
            node,
            "10.96.0.10:80",
            false,
        ),
        (
            "v4 CIDR only, node to v6 ClusterIP",
            &["10.244.1.0/24"][..],
            v6_node,
            "[fd00:96::10]:80",
            false,
        ),
        (
            "both CIDRs, node to v6 ClusterIP",
            &["10.244.1.0/24", "fd00:244:1::/64"][..],
            v6_node,
            "[fd00:96::10]:80",
            true,
        ),
        (
            "both CIDRs, pod to v6 ClusterIP",
            &["10.244.1.0/24", "fd00:244:1::/64"][..],
            "fd00:244:1::7",
            "[fd00:96::10]:80",
            false,
        ),
    ] {
        let p = if to.starts_with('[') { web6() } else { web() };
        let facts = NodeFacts {
            local_ips: vec![node.parse().expect("ip"), v6_node.parse().expect("ip")],
            local_pods: LocalPods::Cidrs(cidrs.iter().map(|c| c.parse().expect("cidr")).collect()),
            ..facts()
        };
        let t = trace(
            &snapshot(vec![p]),
            &facts,
            &TraceQuery {
                from: from.parse().expect("ip"),
                to: to.parse().expect("addr"),
                protocol: Protocol::Tcp,
                in_interface: None,
            },
        );
        assert_eq!(t.verdict, Verdict::Dnat, "{what}: {t:?}");
        assert_eq!(t.masquerade, masquerade, "{what}: {t:?}");
    }
    // Interfaces tell pods in both families.
    let facts = NodeFacts {
        local_pods: LocalPods::Interface {
            rule: InterfaceRule::Bridge("cbr0".into()),
            assumed: vec!["10.244.1.0/24".parse().expect("cidr")],
        },
        ..facts()
    };
    let t = trace(
        &snapshot(vec![web()]),
        &facts,
        &TraceQuery {
            from: node.parse().expect("ip"),
            to: "10.96.0.10:80".parse().expect("addr"),
            protocol: Protocol::Tcp,
            in_interface: None,
        },
    );
    assert!(t.masquerade, "{t:?}");
}

/// The reason names what decided: a family without a detector, a Service CIDR given by
/// flag, a node port on an address that is not a node-port address.
#[test]
fn the_reason_names_what_decided() {
    struct Why {
        what: &'static str,
        facts: fn(&mut NodeFacts),
        from: &'static str,
        to: &'static str,
        verdict: Verdict,
        says: &'static str,
    }
    let cases = [
        Why {
            what: "IPv6 cluster CIDR only, a LAN client to an IPv4 ClusterIP",
            facts: |f| {
                f.local_pods = LocalPods::Cidrs(vec!["fd00:244::/32".parse().expect("cidr")])
            },
            from: "192.168.100.10",
            to: "10.96.0.10:80",
            verdict: Verdict::Dnat,
            says: "no IPv4 cluster CIDR is given (--cluster-cidr, --detect-local-mode \
                   ClusterCIDR), so the local-traffic detector does nothing for IPv4",
        },
        Why {
            what: "NodeCIDR mode, the Node has an IPv6 pod CIDR only",
            facts: |f| {
                f.local_pods = LocalPods::NodeCidrs(vec!["fd00:244:1::/64".parse().expect("cidr")])
            },
            from: "192.168.100.10",
            to: "10.96.0.10:80",
            verdict: Verdict::Dnat,
            says: "the Node has no IPv4 pod CIDR",
        },
        Why {
            what: "a pod of a detected family keeps its address",
            facts: |_| {},
            from: "10.244.1.7",
            to: "10.96.0.10:80",
            verdict: Verdict::Dnat,
            says: "the source is a pod (--detect-local-mode)",
        },
        Why {
            what: "an unallocated IP of a --service-cidr range",
            facts: |f| {
                f.service_cidrs = vec![
                    "fd00:96::/112".parse().expect("cidr"),
                    "10.96.0.0/16".parse().expect("cidr"),
                ]
            },
            from: "192.168.100.10",
            to: "10.96.0.99:80",
            verdict: Verdict::Drop,
            says: "10.96.0.99 is in the Service CIDR 10.96.0.0/16 but no Service has it",
        },
        Why {
            what: "an allocated ClusterIP on a port no Service has",
            facts: |_| {},
            from: "192.168.100.10",
            to: "10.96.0.10:81",
            verdict: Verdict::Reject,
            says: "10.96.0.10 is a ClusterIP, but no Service port 81/TCP is on it (its \
                   ports: 80/TCP)",
        },
        Why {
            what: "a node port on a local address that is not a node-port address",
            facts: |f| f.local_ips.push("10.244.1.1".parse().expect("ip")),
            from: "10.244.1.7",
            to: "10.244.1.1:30080",
            verdict: Verdict::Accept,
            says: "10.244.1.1 is this node's, but it is not one of the node-port addresses \
                   (--nodeport-addresses primary: 172.18.0.2): node port 30080/TCP is not \
                   served on it",
        },
        Why {
            what: "a Node object's address the host no longer has (no node port there)",
            facts: |f| {
                f.node_ips_not_on_host
                    .push("172.18.0.2".parse().expect("ip"))
            },
            from: "192.168.100.10",
            to: "172.18.0.2:9999",
            verdict: Verdict::Accept,
            says: "172.18.0.2 is the Node object's address, not present on the host; no node \
                   port 9999/TCP here",
        },
        Why {
            what: "a Node object's address the host no longer has, outside the CIDRs",
            facts: |f| {
                f.local_ips.push("10.1.1.9".parse().expect("ip"));
                f.node_ips_not_on_host.push("10.1.1.9".parse().expect("ip"));
            },
            from: "192.168.100.10",
            to: "10.1.1.9:30080",
            verdict: Verdict::Accept,
            says: "10.1.1.9 is the Node object's address, not present on the host, but it is \
                   not one of the node-port addresses",
        },
        Why {
            what: "a node port on loopback",
            facts: |f| f.local_ips.push("127.0.0.1".parse().expect("ip")),
            from: "127.0.0.1",
            to: "127.0.0.1:30080",
            verdict: Verdict::Accept,
            says: "loopback is never a node-port address here (kube-proxy's nftables mode \
                   never serves node ports on loopback; its iptables mode serves IPv4 ones on \
                   127.0.0.1 only with --iptables-localhost-nodeports): node port 30080/TCP is \
                   not served on it, so the packet goes to the node untouched: nothing is \
                   proxied there, only a process of the node listening on 30080/TCP answers, \
                   and without one the client is refused (ECONNREFUSED)",
        },
        Why {
            what: "a node port on 127.0.0.1 asked for, but route_localnet could not be set",
            facts: |f| {
                f.local_ips.push("127.0.0.1".parse().expect("ip"));
                f.localhost_not_served = Some(
                    "net.ipv4.conf.all.route_localnet cannot be set: read-only file system".into(),
                );
            },
            from: "127.0.0.1",
            to: "127.0.0.1:30080",
            verdict: Verdict::Accept,
            says: "node ports on 127.0.0.1 are not served although \
                   --iptables-localhost-nodeports asks for them (net.ipv4.conf.all.\
                   route_localnet cannot be set: read-only file system)",
        },
        Why {
            what: "a health-check node port, on the node",
            facts: |_| {},
            from: "203.0.113.1",
            to: "172.18.0.2:32010",
            verdict: Verdict::Accept,
            says: "172.18.0.2 is this node's; 32010/TCP is the health-check node port of \
                   ns/web (externalTrafficPolicy Local): no Service rule, kpng's health-check \
                   server answers it",
        },
        Why {
            what: "a port that is no node port, on the node",
            facts: |_| {},
            from: "203.0.113.1",
            to: "172.18.0.2:22",
            verdict: Verdict::Accept,
            says: "no node port 22/TCP here",
        },
    ];
    for c in cases {
        let mut facts = facts();
        (c.facts)(&mut facts);
        let mut w = web();
        w.health_check_node_port = Some(32010);
        let mut snap = snapshot(vec![w]);
        snap.service_cidrs.clear();
        let t = trace(
            &snap,
            &facts,
            &TraceQuery {
                from: c.from.parse().expect("ip"),
                to: c.to.parse().expect("addr"),
                protocol: Protocol::Tcp,
                in_interface: None,
            },
        );
        assert_eq!(t.verdict, c.verdict, "{}: {t:?}", c.what);
        assert!(t.reason.contains(c.says), "{}: {}", c.what, t.reason);
    }
}

#[test]
fn packets_meet_the_same_rules_as_in_the_kernel() {
    let both = &["10.244.1.5:8080", "10.244.2.5:8080"][..];
    let local = &["10.244.1.5:8080"][..];
    let cases = [
        Case {
            what: "pod to ClusterIP",
            port: same,
            from: "10.244.1.7",
            to: "10.96.0.10:80",
            verdict: Verdict::Dnat,
            frontend: Some(Frontend::ClusterIp),
            endpoints: both,
            masquerade: false,
        },
        Case {
            what: "node to ClusterIP is masqueraded",
            port: same,
            from: "172.18.0.2",
            to: "10.96.0.10:80",
            verdict: Verdict::Dnat,
            frontend: Some(Frontend::ClusterIp),
            endpoints: both,
            masquerade: true,
        },
        Case {
            what: "iTP Local",
            port: |p| p.internal_policy_local = true,
            from: "10.244.1.7",
            to: "10.96.0.10:80",
            verdict: Verdict::Dnat,
            frontend: Some(Frontend::ClusterIp),
            endpoints: local,
            masquerade: false,
        },
        Case {
            what: "wrong port on a ClusterIP",
            port: same,
            from: "10.244.1.7",
            to: "10.96.0.10:81",
            verdict: Verdict::Reject,
            frontend: None,
            endpoints: &[],
            masquerade: false,
        },
        Case {
            what: "unallocated Service IP",
            port: same,
            from: "10.244.1.7",
            to: "10.96.9.9:80",
            verdict: Verdict::Drop,
            frontend: None,
            endpoints: &[],
            masquerade: false,
        },
        Case {
            what: "not ours",
            port: same,
            from: "10.244.1.7",
            to: "8.8.8.8:53",
            verdict: Verdict::None,
            frontend: None,
            endpoints: &[],
            masquerade: false,
        },
        Case {
            what: "the node, no node port",
            port: same,
            from: "203.0.113.1",
            to: "172.18.0.2:22",
            verdict: Verdict::Accept,
            frontend: None,
            endpoints: &[],
            masquerade: false,
        },
        Case {
            what: "node port, eTP Cluster",
            port: same,
            from: "203.0.113.1",
            to: "172.18.0.2:30080",
            verdict: Verdict::Dnat,
            frontend: Some(Frontend::NodePort),
            endpoints: both,
            masquerade: true,
        },
        Case {
            what: "node port, eTP Local, outside client",
            port: |p| p.external_policy_local = true,
            from: "203.0.113.1",
            to: "172.18.0.2:30080",
            verdict: Verdict::Dnat,
            frontend: Some(Frontend::NodePort),
            endpoints: local,
            masquerade: false,
        },
        Case {
            what: "eTP Local from a local pod short-circuits",
            port: |p| p.external_policy_local = true,
            from: "10.244.1.7",
            to: "192.0.2.10:80",
            verdict: Verdict::Dnat,
            frontend: Some(Frontend::ExternalIp),
            endpoints: both,
            masquerade: false,
        },
        Case {
            what: "eTP Local from the node itself",
            port: |p| p.external_policy_local = true,
            from: "172.18.0.2",
            to: "172.18.0.2:30080",
            verdict: Verdict::Dnat,
            frontend: Some(Frontend::NodePort),
            endpoints: both,
            masquerade: true,
        },
        Case {
            what: "eTP Local without local endpoints drops",
            port: |p| {
                p.external_policy_local = true;
                p.local_endpoints.clear();
            },
            from: "203.0.113.1",
            to: "198.51.100.10:80",
            verdict: Verdict::Drop,
            frontend: Some(Frontend::LoadBalancer),
            endpoints: &[],
            masquerade: false,
        },
        Case {
            what: "no endpoints rejects",
            port: |p| {
                p.cluster_endpoints.clear();
                p.local_endpoints.clear();
                p.has_any_endpoints = false;
            },
            from: "10.244.1.7",
            to: "10.96.0.10:80",
            verdict: Verdict::Reject,
            frontend: Some(Frontend::ClusterIp),
            endpoints: &[],
            masquerade: false,
        },
        Case {
            what: "load balancer source ranges",
            port: |p| p.source_ranges = vec!["192.168.0.0/16".parse().expect("cidr")],
            from: "203.0.113.1",
            to: "198.51.100.10:80",
            verdict: Verdict::Drop,
            frontend: Some(Frontend::LoadBalancer),
            endpoints: &[],
            masquerade: false,
        },
        Case {
            what: "inside the source ranges",
            port: |p| p.source_ranges = vec!["203.0.113.0/24".parse().expect("cidr")],
            from: "203.0.113.1",
            to: "198.51.100.10:80",
            verdict: Verdict::Dnat,
            frontend: Some(Frontend::LoadBalancer),
            endpoints: both,
            masquerade: true,
        },
    ];
    for c in cases {
        let mut p = web();
        (c.port)(&mut p);
        let t = trace(
            &snapshot(vec![p]),
            &facts(),
            &TraceQuery {
                from: c.from.parse().expect("ip"),
                to: c.to.parse().expect("addr"),
                protocol: Protocol::Tcp,
                in_interface: None,
            },
        );
        let endpoints: Vec<String> = t.endpoints.iter().map(|e| e.to_string()).collect();
        assert_eq!(t.verdict, c.verdict, "{}: {t:?}", c.what);
        assert_eq!(t.frontend, c.frontend, "{}: {t:?}", c.what);
        assert_eq!(endpoints, c.endpoints, "{}: {t:?}", c.what);
        assert_eq!(t.masquerade, c.masquerade, "{}: {t:?}", c.what);
        assert!(!t.reason.is_empty(), "{}", c.what);
    }
}

#[test]
fn hairpin_and_affinity_are_reported() {
    let mut p = web();
    p.session_affinity = Some(SessionAffinity {
        timeout_seconds: 60,
    });
    let t = trace(
        &snapshot(vec![p]),
        &facts(),
        &TraceQuery {
            from: "10.244.1.5".parse().expect("ip"),
            to: "10.96.0.10:80".parse().expect("addr"),
            protocol: Protocol::Tcp,
            in_interface: None,
        },
    );
    assert!(t.hairpin && !t.masquerade && !t.only_itself, "{t:?}");
    assert!(
        t.reason
            .starts_with("the source is a pod (--detect-local-mode), its address kept")
            && t.reason
                .ends_with("a connection it makes to itself is masqueraded (hairpin)"),
        "{}",
        t.reason
    );
    assert_eq!(t.affinity_timeout_seconds, Some(60));
    // Its only endpoint is itself: always hairpin, and said so.
    let mut alone = web();
    alone
        .cluster_endpoints
        .retain(|e| e.ip.to_string() == "10.244.1.5");
    let t = trace(
        &snapshot(vec![alone]),
        &facts(),
        &TraceQuery {
            from: "10.244.1.5".parse().expect("ip"),
            to: "10.96.0.10:80".parse().expect("addr"),
            protocol: Protocol::Tcp,
            in_interface: None,
        },
    );
    assert!(t.hairpin && t.only_itself, "{t:?}");
    // The why line gives the hairpin, not "its address kept" under "masquerade: yes".
    assert!(
        t.reason
            .starts_with("hairpin: the client is the only endpoint it can pick"),
        "{}",
        t.reason
    );
    assert_eq!(
        serde_json::to_value(&t).expect("json")["onlyItself"],
        serde_json::Value::Bool(true)
    );
    let udp = trace(
        &snapshot(vec![web()]),
        &facts(),
        &TraceQuery {
            from: "10.244.1.7".parse().expect("ip"),
            to: "10.96.0.10:80".parse().expect("addr"),
            protocol: Protocol::Udp,
            in_interface: None,
        },
    );
    assert_eq!(udp.verdict, Verdict::Reject, "TCP only: {udp:?}");
}

/// A Service IP that is a node address, on another Service's node port: the Service IP wins
/// (nftables matches `service-ips` before the node ports), whichever Service sorts first.
#[test]
fn a_service_ip_on_a_node_address_wins_over_a_node_port() {
    let node_port_first = |name: &str| {
        let mut p = web();
        p.key.service = ServiceKey::new("ns", name);
        p.external_ips.clear();
        p.load_balancer_ips.clear();
        p
    };
    for other in ["aaa", "zzz"] {
        let mut external = web();
        external.external_ips = vec!["172.18.0.2".parse().expect("ip")];
        external.port = 30080;
        external.node_port = None;
        let t = trace(
            &snapshot(vec![node_port_first(other), external]),
            &facts(),
            &TraceQuery {
                from: "10.244.1.7".parse().expect("ip"),
                to: "172.18.0.2:30080".parse().expect("addr"),
                protocol: Protocol::Tcp,
                in_interface: None,
            },
        );
        assert_eq!(
            t.frontend,
            Some(Frontend::ExternalIp),
            "beside {other}: {t:?}"
        );
        assert_eq!(t.service.as_deref(), Some("ns/web:http"), "beside {other}");
    }
}

#[test]
fn backend_differences_change_the_trace() {
    let q = |to: &str| TraceQuery {
        from: "10.244.1.7".parse().expect("ip"),
        to: to.parse().expect("addr"),
        protocol: Protocol::Tcp,
        in_interface: None,
    };
    let iptables = NodeFacts {
        backend: BackendTraits {
            rejects_unknown_ports: false,
            ..BackendTraits::default()
        },
        ..facts()
    };
    for to in ["10.96.0.10:81", "10.96.9.9:80"] {
        let t = trace(&snapshot(vec![web()]), &iptables, &q(to));
        assert_eq!(t.verdict, Verdict::None, "{to}: {t:?}");
    }
    let userspace = NodeFacts {
        backend: BackendTraits {
            proxies_connections: true,
            ..BackendTraits::default()
        },
        ..facts()
    };
    let t = trace(&snapshot(vec![web()]), &userspace, &q("10.96.0.10:80"));
    assert!(t.masquerade && t.verdict == Verdict::Dnat, "{t:?}");
    // HNS (kube-proxy's winkernel) does not enforce loadBalancerSourceRanges: the trace says
    // where the packet goes, and that the ranges do not apply.
    let mut ranged = web();
    ranged.load_balancer_ips = vec!["198.51.100.10".parse().expect("ip")];
    ranged.source_ranges = vec!["192.0.2.0/24".parse().expect("cidr")];
    let hns = NodeFacts {
        backend: BackendTraits {
            rejects_unknown_ports: false,
            enforces_source_ranges: false,
            ..BackendTraits::default()
        },
        ..facts()
    };
    for (facts, verdict) in [(&facts(), Verdict::Drop), (&hns, Verdict::Dnat)] {
        let t = trace(
            &snapshot(vec![ranged.clone()]),
            facts,
            &q("198.51.100.10:80"),
        );
        assert_eq!(t.verdict, verdict, "{t:?}");
        assert!(
            t.reason.contains("outside loadBalancerSourceRanges"),
            "{t:?}"
        );
    }
    // An IP that is both the external IP and the load-balancer IP of the port: nftables
    // mode applies the load balancer's source ranges to it, iptables mode matches the
    // external-IP rule first and does not.
    let mut both = ranged.clone();
    both.external_ips = both.load_balancer_ips.clone();
    let iptables = NodeFacts {
        backend: BackendTraits {
            rejects_unknown_ports: false,
            external_ips_before_load_balancers: true,
            ..BackendTraits::default()
        },
        ..facts()
    };
    for (facts, verdict, frontend) in [
        (&facts(), Verdict::Drop, Frontend::LoadBalancer),
        (&iptables, Verdict::Dnat, Frontend::ExternalIp),
    ] {
        let t = trace(&snapshot(vec![both.clone()]), facts, &q("198.51.100.10:80"));
        assert_eq!((t.verdict, t.frontend), (verdict, Some(frontend)), "{t:?}");
    }
    // A Service without endpoints: rejected by the Linux backends; on HNS it has no load
    // balancer (HNS refuses one), so nothing answers: not a reject.
    let mut empty = web();
    empty.cluster_endpoints.clear();
    empty.local_endpoints.clear();
    empty.has_any_endpoints = false;
    let hns = NodeFacts {
        backend: BackendTraits {
            rejects_without_endpoints: false,
            ..hns.backend
        },
        ..hns
    };
    for (facts, verdict, says) in [
        (&facts(), Verdict::Reject, "the Service has no endpoints"),
        (
            &hns,
            Verdict::Drop,
            "nothing answers and the connection times out",
        ),
    ] {
        let t = trace(&snapshot(vec![empty.clone()]), facts, &q("10.96.0.10:80"));
        assert_eq!(t.verdict, verdict, "{t:?}");
        assert!(t.reason.contains(says), "{t:?}");
    }
}

/// The eBPF backend: sockets of this node (its pods, by the Node's pod CIDR, and the node
/// itself) are connected to an endpoint at `connect()`; the rest goes through the rules.
#[test]
fn sockets_of_this_node_are_translated_at_the_socket_with_ebpf() {
    struct SocketCase {
        what: &'static str,
        port: fn(&mut ServicePort),
        from: &'static str,
        to: &'static str,
        protocol: Protocol,
        at_socket: bool,
        masquerade: bool,
    }
    let ebpf = NodeFacts {
        backend: BackendTraits {
            translates_local_sockets: true,
            ..BackendTraits::default()
        },
        // ClusterCIDR detection: pods of every node are "pods" to the rules.
        local_pods: LocalPods::Cidrs(vec!["10.244.0.0/16".parse().expect("cidr")]),
        ..facts()
    };
    let unchanged: fn(&mut ServicePort) = |_| {};
    let cases = [
        SocketCase {
            what: "a pod of this node to the ClusterIP",
            port: unchanged,
            from: "10.244.1.7",
            to: "10.96.0.10:80",
            protocol: Protocol::Tcp,
            at_socket: true,
            masquerade: false,
        },
        SocketCase {
            what: "an endpoint to its own Service: no hairpin masquerade",
            port: unchanged,
            from: "10.244.1.5",
            to: "10.96.0.10:80",
            protocol: Protocol::Tcp,
            at_socket: true,
            masquerade: false,
        },
        SocketCase {
            what: "the node itself to a node port",
            port: unchanged,
            from: "172.18.0.2",
            to: "172.18.0.2:30080",
            protocol: Protocol::Tcp,
            at_socket: true,
            masquerade: false,
        },
        SocketCase {
            what: "a pod of this node to an external IP, over UDP",
            port: |p| p.key.protocol = Protocol::Udp,
            from: "10.244.1.7",
            to: "192.0.2.10:80",
            protocol: Protocol::Udp,
            at_socket: true,
            masquerade: false,
        },
        SocketCase {
            what: "a pod of another node: its packets reach the rules",
            port: unchanged,
            from: "10.244.2.9",
            to: "10.96.0.10:80",
            protocol: Protocol::Tcp,
            at_socket: false,
            masquerade: false,
        },
        SocketCase {
            what: "a client outside to a node port: the rules, masqueraded",
            port: unchanged,
            from: "192.0.2.77",
            to: "172.18.0.2:30080",
            protocol: Protocol::Tcp,
            at_socket: false,
            masquerade: true,
        },
        SocketCase {
            what: "a load-balancer IP with source ranges stays with the rules (masqueraded)",
            port: |p| p.source_ranges = vec!["10.244.0.0/16".parse().expect("cidr")],
            from: "10.244.1.7",
            to: "198.51.100.10:80",
            protocol: Protocol::Tcp,
            at_socket: false,
            masquerade: true,
        },
        SocketCase {
            what: "SCTP stays with the rules",
            port: |p| p.key.protocol = Protocol::Sctp,
            from: "10.244.1.7",
            to: "10.96.0.10:80",
            protocol: Protocol::Sctp,
            at_socket: false,
            masquerade: false,
        },
    ];
    for c in cases {
        let mut port = web();
        (c.port)(&mut port);
        let mut snap = snapshot(vec![port]);
        snap.node.pod_cidrs = vec!["10.244.1.0/24".parse().expect("cidr")];
        let t = trace(
            &snap,
            &ebpf,
            &TraceQuery {
                from: c.from.parse().expect("ip"),
                to: c.to.parse().expect("addr"),
                protocol: c.protocol,
                in_interface: None,
            },
        );
        assert_eq!(t.verdict, Verdict::Dnat, "{}: {t:?}", c.what);
        assert_eq!(t.translated_at_socket, c.at_socket, "{}: {t:?}", c.what);
        assert_eq!(t.masquerade, c.masquerade, "{}: {t:?}", c.what);
        if c.at_socket {
            assert!(!t.hairpin && t.reason.contains("eBPF"), "{}: {t:?}", c.what);
        }
    }
    // Without endpoints, a local socket's TCP connect() itself fails (no packet); from
    // outside the node, and for UDP (kube-proxy's connect() succeeds, recv() fails), the
    // rules reject the packet.
    let mut empty = web();
    empty.cluster_endpoints.clear();
    empty.local_endpoints.clear();
    empty.has_any_endpoints = false;
    let mut snap = snapshot(vec![empty.clone()]);
    snap.node.pod_cidrs = vec!["10.244.1.0/24".parse().expect("cidr")];
    let mut empty_udp = empty;
    empty_udp.key.protocol = Protocol::Udp;
    let mut snap_udp = snapshot(vec![empty_udp]);
    snap_udp.node.pod_cidrs = snap.node.pod_cidrs.clone();
    for (from, protocol, at_socket) in [
        ("10.244.1.7", Protocol::Tcp, true),
        ("203.0.113.9", Protocol::Tcp, false),
        ("10.244.1.7", Protocol::Udp, false),
    ] {
        let snap = if protocol == Protocol::Udp {
            &snap_udp
        } else {
            &snap
        };
        let t = trace(
            snap,
            &ebpf,
            &TraceQuery {
                from: from.parse().expect("ip"),
                to: "10.96.0.10:80".parse().expect("addr"),
                protocol,
                in_interface: None,
            },
        );
        assert_eq!(t.verdict, Verdict::Reject, "{from}: {t:?}");
        assert_eq!(t.translated_at_socket, at_socket, "{from}: {t:?}");
        assert_eq!(
            t.reason.contains("ECONNREFUSED"),
            at_socket,
            "{from}: {t:?}"
        );
    }
}

/// The eBPF backend's settings narrow which sockets are translated: with
/// `--socket-lb-host-netns-only` a pod's socket goes through the rules (a sidecar in the pod
/// sees the Service address) while the node's own stays at the socket; with a `--cgroup-path`
/// below the root the trace cannot know the sending process and gives both outcomes.
#[test]
fn ebpf_settings_decide_which_local_sockets_are_translated() {
    // (what, host netns only, cgroup subtree, from, protocol, endpoints, at the socket,
    // only if in this cgroup, words in the reason)
    type Case = (
        &'static str,
        bool,
        Option<&'static str>,
        &'static str,
        Protocol,
        bool,
        bool,
        Option<&'static str>,
        &'static str,
    );
    let cases: [Case; 8] = [
        (
            "pod, every socket",
            false,
            None,
            "10.244.1.7",
            Protocol::Tcp,
            true,
            true,
            None,
            "eBPF",
        ),
        (
            "pod, host netns only: the rules",
            true,
            None,
            "10.244.1.7",
            Protocol::Tcp,
            true,
            false,
            None,
            "--socket-lb-host-netns-only",
        ),
        (
            "the node itself, host netns only: still at the socket",
            true,
            None,
            "172.18.0.2",
            Protocol::Tcp,
            true,
            true,
            None,
            "eBPF",
        ),
        (
            "pod, a cgroup subtree: both outcomes",
            false,
            Some("/sys/fs/cgroup/system.slice"),
            "10.244.1.7",
            Protocol::Tcp,
            true,
            false,
            Some("/sys/fs/cgroup/system.slice"),
            "otherwise through the rules",
        ),
        (
            "node, host netns only and a cgroup subtree: both outcomes",
            true,
            Some("/sys/fs/cgroup/system.slice"),
            "172.18.0.2",
            Protocol::Udp,
            true,
            false,
            Some("/sys/fs/cgroup/system.slice"),
            "subtree (--cgroup-path)",
        ),
        (
            "pod, host netns only and a cgroup subtree: the rules only",
            true,
            Some("/sys/fs/cgroup/system.slice"),
            "10.244.1.7",
            Protocol::Tcp,
            true,
            false,
            None,
            "--socket-lb-host-netns-only",
        ),
        (
            "no endpoints, a cgroup subtree: refused at the socket or by the rules",
            false,
            Some("/sys/fs/cgroup/system.slice"),
            "10.244.1.7",
            Protocol::Tcp,
            false,
            false,
            Some("/sys/fs/cgroup/system.slice"),
            "ECONNREFUSED",
        ),
        (
            "a pod of another node: the rules, no note",
            true,
            None,
            "10.244.2.9",
            Protocol::Tcp,
            true,
            false,
            None,
            "its address kept",
        ),
    ];
    for (what, host_netns_only, subtree, from, protocol, endpoints, at_socket, only_in, words) in
        cases
    {
        let facts = NodeFacts {
            backend: BackendTraits {
                translates_local_sockets: true,
                ..BackendTraits::default()
            },
            local_sockets: LocalSockets {
                cgroup_subtree: subtree.map(String::from),
                host_netns_only,
                own_netns_not_host: None,
            },
            local_pods: LocalPods::Cidrs(vec!["10.244.0.0/16".parse().expect("cidr")]),
            ..facts()
        };
        let mut port = web();
        port.key.protocol = protocol;
        if !endpoints {
            port.cluster_endpoints.clear();
            port.local_endpoints.clear();
            port.has_any_endpoints = false;
        }
        let mut snap = snapshot(vec![port]);
        snap.node.pod_cidrs = vec!["10.244.1.0/24".parse().expect("cidr")];
        let t = trace(
            &snap,
            &facts,
            &TraceQuery {
                from: from.parse().expect("ip"),
                to: "10.96.0.10:80".parse().expect("addr"),
                protocol,
                in_interface: None,
            },
        );
        assert_eq!(t.translated_at_socket, at_socket, "{what}: {t:?}");
        assert_eq!(
            t.at_socket_if_in_cgroup.as_deref(),
            only_in,
            "{what}: {t:?}"
        );
        assert!(t.reason.contains(words), "{what}: {t:?}");
        let noted = t.reason.contains("--socket-lb-host-netns-only");
        assert_eq!(
            noted,
            words == "--socket-lb-host-netns-only",
            "{what}: the option named only where it decided: {t:?}"
        );
        if !at_socket && only_in.is_none() && endpoints {
            // The rules' answer: a pod's address kept, not masqueraded.
            assert!(!t.masquerade, "{what}: {t:?}");
        }
    }
}

/// `--socket-lb-host-netns-only` in a kpng outside the host's network namespace means kpng's
/// own (`kpng status` says so as a PROBLEM): a socket of the node's address is translated only
/// if it is in that namespace, which the trace cannot tell, so it gives both outcomes; until
/// 2026-12-07 it said "at the socket" as if kpng were in the host's namespace.
#[test]
fn host_netns_only_outside_the_hosts_namespace_gives_both_outcomes_for_the_node() {
    // (own namespace when not the host's, cgroup subtree, at the socket, words)
    let cases = [
        (None, None, true, "the eBPF programs connect it"),
        (
            Some("net:[8]"),
            None,
            false,
            "at the socket if the sending process is in kpng's own network namespace net:[8], \
             which is not the host's",
        ),
        (
            Some("net:[8]"),
            Some("/sys/fs/cgroup/system.slice"),
            false,
            "subtree (--cgroup-path) and in kpng's own network namespace net:[8]",
        ),
    ];
    for (netns, subtree, at_socket, words) in cases {
        let facts = NodeFacts {
            backend: BackendTraits {
                translates_local_sockets: true,
                ..BackendTraits::default()
            },
            local_sockets: LocalSockets {
                cgroup_subtree: subtree.map(String::from),
                host_netns_only: true,
                own_netns_not_host: netns.map(String::from),
            },
            local_pods: LocalPods::Cidrs(vec!["10.244.0.0/16".parse().expect("cidr")]),
            ..facts()
        };
        // The same Service port, asked from `from`.
        let trace_from = |from: &str| {
            trace(
                &snapshot(vec![web()]),
                &facts,
                &TraceQuery {
                    from: from.parse().expect("ip"),
                    to: "10.96.0.10:80".parse().expect("addr"),
                    protocol: Protocol::Tcp,
                    in_interface: None,
                },
            )
        };
        let t = trace_from("172.18.0.2");
        assert_eq!(t.translated_at_socket, at_socket, "{netns:?}: {t:?}");
        assert_eq!(t.at_socket_if_in_netns.as_deref(), netns, "{t:?}");
        assert_eq!(t.at_socket_if_in_cgroup.as_deref(), subtree, "{t:?}");
        assert!(t.reason.contains(words), "{netns:?}: {t:?}");
        if netns.is_some() {
            assert!(
                t.reason.contains("otherwise through the rules"),
                "the rules' answer too: {t:?}"
            );
        }
        // A pod's socket: the rules, whatever kpng's namespace.
        let t = trace_from("10.244.1.7");
        assert!(
            !t.translated_at_socket && t.at_socket_if_in_netns.is_none(),
            "{t:?}"
        );
    }
}

/// `--masquerade-all` masquerades ClusterIP destinations only (kube-proxy's rule matches the
/// ClusterIP): a pod's or an outside client's packet to an eTP Local node port, external IP
/// or load-balancer IP keeps its address, as the real-packet suite sees.
#[test]
fn masquerade_all_masquerades_cluster_ip_destinations_only() {
    let all = NodeFacts {
        masquerade_all: true,
        ..facts()
    };
    let local: fn(&mut ServicePort) = |p| p.external_policy_local = true;
    for (what, port, from, to, list, masquerade) in [
        (
            "pod to ClusterIP",
            same as fn(&mut ServicePort),
            "10.244.1.7",
            "10.96.0.10:80",
            "cluster",
            true,
        ),
        (
            "outside to ClusterIP",
            same,
            "203.0.113.1",
            "10.96.0.10:80",
            "cluster",
            true,
        ),
        (
            "pod to eTP Local node port",
            local,
            "10.244.1.7",
            "172.18.0.2:30080",
            "cluster",
            false,
        ),
        (
            "pod to eTP Local external IP",
            local,
            "10.244.1.7",
            "192.0.2.10:80",
            "cluster",
            false,
        ),
        (
            "pod to eTP Local LB IP",
            local,
            "10.244.1.7",
            "198.51.100.10:80",
            "cluster",
            false,
        ),
        (
            "outside to eTP Local node port",
            local,
            "203.0.113.1",
            "172.18.0.2:30080",
            "local",
            false,
        ),
        (
            "node to eTP Local node port",
            local,
            "172.18.0.2",
            "172.18.0.2:30080",
            "cluster",
            true,
        ),
        (
            "pod to eTP Cluster node port",
            same,
            "10.244.1.7",
            "172.18.0.2:30080",
            "cluster",
            true,
        ),
    ] {
        let mut p = web();
        port(&mut p);
        let t = trace(
            &snapshot(vec![p]),
            &all,
            &TraceQuery {
                from: from.parse().expect("ip"),
                to: to.parse().expect("addr"),
                protocol: Protocol::Tcp,
                in_interface: None,
            },
        );
        assert_eq!(t.verdict, Verdict::Dnat, "{what}: {t:?}");
        assert_eq!(t.endpoint_list, Some(list), "{what}: {t:?}");
        assert_eq!(t.masquerade, masquerade, "{what}: {t:?}");
        if !masquerade {
            assert!(
                t.reason
                    .ends_with("(--masquerade-all masquerades ClusterIP destinations only)"),
                "{what}: {}",
                t.reason
            );
        }
    }
}

/// With an interface detector the rules tell pods by the input interface: given one, the
/// trace decides by it exactly as the rules do (wrong both ways otherwise: a pod CIDR that
/// arrives from elsewhere, pods outside the Node's podCIDRs); without one, it says the answer
/// depends on it and what it assumed.
#[test]
fn interface_detection_decides_by_the_given_interface_or_says_what_it_assumed() {
    let with = |rule: InterfaceRule| NodeFacts {
        local_pods: LocalPods::Interface {
            rule,
            assumed: vec!["10.244.1.0/24".parse().expect("cidr")],
        },
        ..facts()
    };
    let bridge = || with(InterfaceRule::Bridge("cni0".into()));
    let prefix = || with(InterfaceRule::Prefix("cali".into()));
    let cluster_ip = "10.96.0.10:80";
    let node_port = "172.18.0.2:30080";
    struct C {
        what: &'static str,
        facts: NodeFacts,
        etp_local: bool,
        from: &'static str,
        to: &'static str,
        iif: Option<&'static str>,
        masquerade: bool,
        list: &'static str,
        note: Option<&'static str>,
    }
    let cases = [
        C {
            what: "bridge, a Node pod CIDR source, no interface: assumed on it",
            facts: bridge(),
            etp_local: false,
            from: "10.244.1.7",
            to: cluster_ip,
            iif: None,
            masquerade: false,
            list: "cluster",
            note: Some(
                "depends on the input interface, which the rules decide by \
                 (--detect-local-mode BridgeInterface, --pod-bridge-interface cni0: a pod if it \
                 arrives on cni0); not told it, this trace assumed 10.244.1.7 arrives on it, as \
                 it is inside the Node's pod CIDRs (10.244.1.0/24); `--in-interface NAME` \
                 traces it as arriving on NAME",
            ),
        },
        C {
            what: "bridge, outside the Node's pod CIDRs, no interface: assumed elsewhere",
            facts: bridge(),
            etp_local: false,
            from: "10.244.9.9",
            to: cluster_ip,
            iif: None,
            masquerade: true,
            list: "cluster",
            note: Some("this trace assumed 10.244.9.9 arrives elsewhere, as it is outside"),
        },
        C {
            what: "bridge, outside the Node's pod CIDRs, on cni0: a pod",
            facts: bridge(),
            etp_local: false,
            from: "10.244.9.9",
            to: cluster_ip,
            iif: Some("cni0"),
            masquerade: false,
            list: "cluster",
            note: Some("arrives on cni0: a pod's"),
        },
        C {
            what: "bridge, a pod CIDR source arriving on eth0: not a pod",
            facts: bridge(),
            etp_local: false,
            from: "10.244.1.7",
            to: cluster_ip,
            iif: Some("eth0"),
            masquerade: true,
            list: "cluster",
            note: Some("arrives on eth0: not a pod's"),
        },
        C {
            what: "bridge, a port of the bridge is not the bridge",
            facts: bridge(),
            etp_local: false,
            from: "10.244.1.7",
            to: cluster_ip,
            iif: Some("cni0x"),
            masquerade: true,
            list: "cluster",
            note: Some("arrives on cni0x: not a pod's"),
        },
        C {
            what: "prefix, on cali1234: a pod, eTP Local node port short-circuits",
            facts: prefix(),
            etp_local: true,
            from: "10.244.9.9",
            to: node_port,
            iif: Some("cali1234"),
            masquerade: false,
            list: "cluster",
            note: Some("arrives on cali1234: a pod's"),
        },
        C {
            what: "prefix, the prefix itself matches",
            facts: prefix(),
            etp_local: false,
            from: "10.244.9.9",
            to: cluster_ip,
            iif: Some("cali"),
            masquerade: false,
            list: "cluster",
            note: Some("arrives on cali: a pod's"),
        },
        C {
            what: "prefix, on eth0: eTP Local node port, the local list",
            facts: prefix(),
            etp_local: true,
            from: "10.244.1.7",
            to: node_port,
            iif: Some("eth0"),
            masquerade: false,
            list: "local",
            note: Some("arrives on eth0: not a pod's"),
        },
        C {
            what: "eTP Cluster node port: pod-ness does not matter, no note",
            facts: bridge(),
            etp_local: false,
            from: "10.244.9.9",
            to: node_port,
            iif: None,
            masquerade: true,
            list: "cluster",
            note: None,
        },
        C {
            what: "ClusterCIDR mode: the interface is not used, and said so",
            facts: facts(),
            etp_local: false,
            from: "10.244.1.7",
            to: cluster_ip,
            iif: Some("eth0"),
            masquerade: false,
            list: "cluster",
            note: Some(
                "--in-interface eth0 is not used: --detect-local-mode ClusterCIDR tells pods by \
                 the source address, not by the input interface",
            ),
        },
    ];
    for c in cases {
        let mut p = web();
        p.external_policy_local = c.etp_local;
        let t = trace(
            &snapshot(vec![p]),
            &c.facts,
            &TraceQuery {
                from: c.from.parse().expect("ip"),
                to: c.to.parse().expect("addr"),
                protocol: Protocol::Tcp,
                in_interface: c.iif.map(String::from),
            },
        );
        assert_eq!(t.verdict, Verdict::Dnat, "{}: {t:?}", c.what);
        assert_eq!(t.masquerade, c.masquerade, "{}: {t:?}", c.what);
        assert_eq!(t.endpoint_list, Some(c.list), "{}: {t:?}", c.what);
        match c.note {
            None => assert_eq!(t.interface, None, "{}", c.what),
            Some(n) => assert!(
                t.interface.as_deref().is_some_and(|i| i.contains(n)),
                "{}: {:?} lacks {n:?}",
                c.what,
                t.interface
            ),
        }
    }
}

/// An address a Service shows but that gets no rules on purpose is named with its Service:
/// an ExternalName Service's stray clusterIP ("unallocated ClusterIP" before) and an ipMode
/// Proxy ingress IP ("not a Service address" before); the verdict does not change.
#[test]
fn addresses_left_without_rules_on_purpose_name_their_service() {
    let s = snapshot(vec![web()]);
    let q = |to: &str| TraceQuery {
        from: "192.168.100.10".parse().expect("ip"),
        to: to.parse().expect("addr"),
        protocol: Protocol::Tcp,
        in_interface: None,
    };
    let external_name = NotProxied {
        service: ServiceKey::new("ns", "alias"),
        kind: NotProxiedKind::ExternalNameClusterIp,
    };
    let t = trace_noting(&s, &facts(), &q("10.96.7.7:80"), Some(&external_name));
    assert_eq!(t.verdict, Verdict::Drop);
    assert!(
        t.reason.starts_with(
            "10.96.7.7 is the clusterIP of ExternalName Service ns/alias, which gets no rules"
        ) && t
            .reason
            .contains("in the Service CIDR 10.96.0.0/16 it is an unallocated ClusterIP"),
        "{}",
        t.reason
    );
    let proxy = NotProxied {
        service: ServiceKey::new("ns", "gw"),
        kind: NotProxiedKind::ProxyModeIngress,
    };
    let t = trace_noting(&s, &facts(), &q("203.0.113.9:443"), Some(&proxy));
    assert_eq!(t.verdict, Verdict::None);
    assert_eq!(t.service, None);
    assert!(
        t.reason.starts_with(
            "203.0.113.9 is an ingress IP of ns/gw with ipMode Proxy: not programmed on nodes, \
             as upstream"
        ),
        "{}",
        t.reason
    );
    // Without the note, as before.
    let t = trace(&s, &facts(), &q("203.0.113.9:443"));
    assert_eq!(t.reason, "203.0.113.9:443 is not a Service address");
}

/// The clusterIP of a Service kpng leaves alone on purpose, as kube-proxy (labelled
/// `service.kubernetes.io/headless`, or another proxy's by `service-proxy-name`), is named
/// with its Service and why, where a trace said "no Service has it"; still dropped as an
/// unallocated ClusterIP in the Service CIDR.
#[test]
fn a_clusterip_of_a_service_kpng_does_not_proxy_names_it() {
    let s = snapshot(vec![web()]);
    let q = TraceQuery {
        from: "192.168.100.10".parse().expect("ip"),
        to: "10.96.1.6:80".parse().expect("addr"),
        protocol: Protocol::Tcp,
        in_interface: None,
    };
    let unallocated = ": in the Service CIDR 10.96.0.0/16 it is an unallocated ClusterIP, and \
                       traffic to unallocated ClusterIPs is dropped";
    let cases = [
        (
            NotProxiedKind::HeadlessLabelClusterIp,
            "10.96.1.6 is the clusterIP of default/other, labelled service.kubernetes.io/headless: \
             kpng (like kube-proxy) does not proxy it",
        ),
        (
            NotProxiedKind::OtherProxyClusterIp(Some("cilium".into())),
            "10.96.1.6 is the clusterIP of default/other, labelled for proxy 'cilium' \
             (service.kubernetes.io/service-proxy-name): kpng (like kube-proxy) does not proxy it",
        ),
        (
            NotProxiedKind::OtherProxyClusterIp(None),
            "10.96.1.6 is the clusterIP of default/other, which has no \
             service.kubernetes.io/service-proxy-name label while kpng runs with \
             --service-proxy-name: kpng does not proxy it",
        ),
    ];
    for (kind, want) in cases {
        let note = NotProxied {
            service: ServiceKey::new("default", "other"),
            kind,
        };
        let t = trace_noting(&s, &facts(), &q, Some(&note));
        assert_eq!(t.verdict, Verdict::Drop);
        assert_eq!(t.reason, format!("{want}{unallocated}"));
    }
}

/// With the iptables backend, forwarded masqueraded traffic is accepted by KUBE-FORWARD in
/// filter FORWARD before policy chains after kpng's jump: the trace says so there, and only
/// for masqueraded traffic that is forwarded (not the node's own, not with nftables).
#[test]
fn iptables_traces_say_kube_forward_accepts_masqueraded_traffic() {
    let iptables = NodeFacts {
        backend: BackendTraits {
            accepts_masqueraded_in_forward: true,
            ..BackendTraits::default()
        },
        ..facts()
    };
    let snap = snapshot(vec![web()]);
    // (what, facts, from, to, says it)
    let cases = [
        (
            "iptables, outside → node port (eTP Cluster)",
            &iptables,
            "203.0.113.1",
            "172.18.0.2:30080",
            true,
        ),
        (
            "iptables, a pod → ClusterIP: not masqueraded",
            &iptables,
            "10.244.1.7",
            "10.96.0.10:80",
            false,
        ),
        (
            "iptables, the node itself → node port",
            &iptables,
            "172.18.0.2",
            "172.18.0.2:30080",
            false,
        ),
        (
            "nftables, outside → node port",
            &facts(),
            "203.0.113.1",
            "172.18.0.2:30080",
            false,
        ),
    ];
    for (what, facts, from, to, says) in cases {
        let t = trace(
            &snap,
            facts,
            &TraceQuery {
                from: from.parse().expect("ip"),
                to: to.parse().expect("addr"),
                protocol: Protocol::Tcp,
                in_interface: None,
            },
        );
        assert_eq!(t.verdict, Verdict::Dnat, "{what}: {t:?}");
        assert_eq!(
            t.reason
                .contains("accepted in filter FORWARD by KUBE-FORWARD"),
            says,
            "{what}: {}",
            t.reason
        );
    }
}

/// A port without endpoints whose Service's other port of the family has some: the
/// EndpointSlices are not empty, they do not list this port's name, and the trace says so
/// (an operator sees endpoints in `kubectl get endpointslices` and would be confused by "the
/// Service has no endpoints"); a Service with none at all is told as before.
#[test]
fn a_port_missing_from_the_endpoints_is_named() {
    let dns = |family: Family, ip: &str| {
        let mut p = ServicePort::new(
            PortKey {
                service: ServiceKey::new("ns", "web"),
                port_name: "dns".into(),
                protocol: Protocol::Udp,
                family,
            },
            ip.parse().expect("ip"),
            5353,
        );
        p.has_any_endpoints = false;
        p
    };
    let mut alone = web6();
    alone.key.service = ServiceKey::new("ns", "other");
    for (what, ports, to, says) in [
        (
            "the v6 slice lists only http",
            vec![web6(), dns(Family::V6, "fd00:96::10")],
            "[fd00:96::10]:5353",
            "the Service has no endpoints for this port: its IPv6 endpoints list no port named \
             dns (other ports of the Service have endpoints)",
        ),
        (
            "the v4 half's endpoints do not count for IPv6",
            vec![web(), dns(Family::V6, "fd00:96::10"), alone],
            "[fd00:96::10]:5353",
            "the Service has no endpoints",
        ),
    ] {
        let t = trace(
            &snapshot(ports),
            &facts(),
            &TraceQuery {
                from: "fd00:244:1::9".parse().expect("ip"),
                to: to.parse().expect("addr"),
                protocol: Protocol::Udp,
                in_interface: None,
            },
        );
        assert_eq!(t.verdict, Verdict::Reject, "{what}: {t:?}");
        assert_eq!(t.reason, says, "{what}");
    }
}

/// The health-check node port is answered only where the checks listen: the node-port
/// addresses of a family `--nodeport-addresses` restricts (loopback too when a CIDR holds it),
/// every local address (the wildcard) of one it does not. Elsewhere nothing listens and the
/// client is refused, as for a NodePort on such an address (until 2026-12-07 the trace said
/// any of the node's addresses answered).
#[test]
fn the_health_check_port_is_answered_only_where_the_checks_listen() {
    let answered = "kpng's health-check server answers it on the node";
    let refused = "but the Service health checks do not listen on it";
    // (what, listen addresses (None: not said), destination, wanted words)
    type Case<'a> = (&'a str, Option<&'a [&'a str]>, &'a str, &'a [&'a str]);
    let cases: [Case; 9] = [
        (
            "in the CIDRs",
            Some(&["172.18.0.2"]),
            "172.18.0.2",
            &[answered],
        ),
        (
            "outside the CIDRs (another NIC)",
            Some(&["172.18.0.2"]),
            "10.45.3.1",
            &[
                refused,
                "(--nodeport-addresses 172.18.0.0/24: they listen on 172.18.0.2)",
                "the client is refused (ECONNREFUSED)",
            ],
        ),
        (
            "loopback outside the CIDRs",
            Some(&["172.18.0.2"]),
            "127.0.0.1",
            &[refused],
        ),
        (
            "loopback inside a CIDR",
            Some(&["127.0.0.1", "172.18.0.2"]),
            "127.0.0.1",
            &[answered],
        ),
        (
            "a family not restricted: the wildcard, loopback included",
            Some(&["0.0.0.0"]),
            "127.0.0.1",
            &[answered],
        ),
        (
            "the wildcard of the other family only",
            Some(&["::"]),
            "10.45.3.1",
            &[refused, "they listen on no IPv4 address"],
        ),
        (
            "the CIDRs match no address: nowhere",
            Some(&[]),
            "172.18.0.2",
            &[refused, "they listen on no IPv4 address"],
        ),
        (
            "an IPv6 listener does not answer IPv4",
            Some(&["fd45:2::1"]),
            "172.18.0.2",
            &[refused, "they listen on no IPv4 address"],
        ),
        (
            "not said: every local address",
            None,
            "10.45.3.1",
            &[answered],
        ),
    ];
    for (what, listen, to, want) in cases {
        let mut facts = facts();
        facts.nodeport_setting = "172.18.0.0/24".into();
        facts
            .local_ips
            .extend(["10.45.3.1", "127.0.0.1"].map(|ip| ip.parse::<IpAddr>().expect("ip")));
        facts.health_check_ips =
            listen.map(|l| l.iter().map(|ip| ip.parse().expect("ip")).collect());
        let mut w = web();
        w.health_check_node_port = Some(32010);
        let mut snap = snapshot(vec![w]);
        snap.service_cidrs.clear();
        let t = trace(
            &snap,
            &facts,
            &TraceQuery {
                from: "203.0.113.1".parse().expect("ip"),
                to: SocketAddr::new(to.parse().expect("ip"), 32010),
                protocol: Protocol::Tcp,
                in_interface: None,
            },
        );
        assert_eq!(t.verdict, Verdict::Accept, "{what}: {t:?}");
        for w in want {
            assert!(t.reason.contains(w), "{what}: {:?} lacks {w:?}", t.reason);
        }
    }
}
