use super::*;
use crate::flow::IPPROTO_TCP;
use crate::test_support::{flow, ip, sa, udp_port};

/// kube-dns-like: ClusterIP, an external IP, a load-balancer IP and a node port, two
/// serving endpoints; plus a TCP port and a UDP port without endpoints on other IPs.
fn ports() -> Vec<ServicePort> {
    let mut dns = udp_port("dns", "10.96.0.10", 53, &["10.244.2.7:53", "10.244.1.5:53"]);
    dns.external_ips = vec![ip("198.51.100.10")];
    dns.load_balancer_ips = vec![ip("203.0.113.10")];
    dns.node_port = Some(30053);
    let mut tcp = udp_port("tcp", "10.96.0.11", 53, &["10.244.2.9:53"]);
    tcp.key.protocol = Protocol::Tcp;
    let idle = udp_port("idle", "10.96.0.20", 53, &[]);
    let v6 = udp_port("dns6", "fd00:96::a", 53, &["[fd00:244:2::7]:53"]);
    vec![dns, tcp, idle, v6]
}

const NODE: &str = "192.168.100.1";

#[test]
fn stale_rule() {
    let ports = ports();
    let filter = StaleFilter::new(Family::V4, &ports, &[ip(NODE), ip("fd00:100::1")]);
    let mut tcp = flow("10.244.1.9:4000", "10.96.0.11:53", "10.244.2.1:53");
    tcp.protocol = IPPROTO_TCP;
    let mut tcp_to_dns = flow("10.244.1.9:4000", "10.96.0.10:53", "10.244.2.1:53");
    tcp_to_dns.protocol = IPPROTO_TCP;
    let cases = [
        // (what, entry, stale)
        (
            "ClusterIP, serving endpoint",
            flow("10.244.1.9:4000", "10.96.0.10:53", "10.244.2.7:53"),
            false,
        ),
        (
            "ClusterIP, other serving endpoint",
            flow("10.244.1.9:4000", "10.96.0.10:53", "10.244.1.5:53"),
            false,
        ),
        (
            "ClusterIP, deleted endpoint",
            flow("10.244.1.9:4000", "10.96.0.10:53", "10.244.2.1:53"),
            true,
        ),
        (
            "ClusterIP, never DNATed",
            flow("10.244.1.9:4000", "10.96.0.10:53", "10.96.0.10:53"),
            true,
        ),
        (
            "ClusterIP, serving IP on a port it no longer serves",
            flow("10.244.1.9:4000", "10.96.0.10:53", "10.244.2.7:5353"),
            true,
        ),
        (
            "external IP, deleted endpoint",
            flow("192.168.100.10:4000", "198.51.100.10:53", "10.244.2.1:53"),
            true,
        ),
        (
            "external IP, serving endpoint",
            flow("192.168.100.10:4000", "198.51.100.10:53", "10.244.2.7:53"),
            false,
        ),
        (
            "load-balancer IP, never DNATed",
            flow("192.168.100.10:4000", "203.0.113.10:53", "203.0.113.10:53"),
            true,
        ),
        (
            "node port on the node, deleted endpoint",
            flow(
                "192.168.100.10:4000",
                "192.168.100.1:30053",
                "10.244.2.1:53",
            ),
            true,
        ),
        (
            "node port on the node, never DNATed",
            flow(
                "192.168.100.10:4000",
                "192.168.100.1:30053",
                "192.168.100.1:30053",
            ),
            true,
        ),
        (
            "node port on the node, serving endpoint",
            flow(
                "192.168.100.10:4000",
                "192.168.100.1:30053",
                "10.244.1.5:53",
            ),
            false,
        ),
        (
            "node port of a foreign address",
            flow(
                "192.168.100.1:4000",
                "192.168.100.2:30053",
                "192.168.100.2:30053",
            ),
            false,
        ),
        (
            "another port of the ClusterIP",
            flow("10.244.1.9:4000", "10.96.0.10:5353", "10.244.2.1:5353"),
            false,
        ),
        (
            "unrelated destination",
            flow("10.244.1.9:4000", "8.8.8.8:53", "8.8.8.8:53"),
            false,
        ),
        (
            "UDP port without serving endpoints",
            flow("10.244.1.9:4000", "10.96.0.20:53", "10.244.2.1:53"),
            false,
        ),
        ("TCP Service", tcp, false),
        ("TCP to the UDP Service's frontend", tcp_to_dns, false),
        (
            "IPv6 entry, IPv4 filter",
            flow("[fd00::9]:4000", "[fd00:96::a]:53", "[fd00:244:2::1]:53"),
            false,
        ),
    ];
    for (what, entry, stale) in cases {
        assert_eq!(filter.is_stale(&entry), stale, "{what}: {entry}");
    }
    let v6 = StaleFilter::new(Family::V6, &ports, &[ip(NODE)]);
    assert!(v6.is_stale(&flow(
        "[fd00::9]:4000",
        "[fd00:96::a]:53",
        "[fd00:244:2::1]:53"
    )));
    assert!(!v6.is_stale(&flow(
        "[fd00::9]:4000",
        "[fd00:96::a]:53",
        "[fd00:244:2::7]:53"
    )));
}

#[test]
fn frontends_are_the_udp_ports_with_serving_endpoints() {
    let ports = ports();
    let filter = StaleFilter::new(Family::V4, &ports, &[]);
    assert_eq!(
        filter.frontends(),
        [
            Frontend::Ip(sa("10.96.0.10:53")),
            Frontend::Ip(sa("198.51.100.10:53")),
            Frontend::Ip(sa("203.0.113.10:53")),
            Frontend::NodePort(30053),
        ]
    );
    assert_eq!(
        filter
            .frontends()
            .iter()
            .map(Frontend::dump)
            .collect::<Vec<_>>(),
        [
            DumpFilter::UdpTo(sa("10.96.0.10:53")),
            DumpFilter::UdpTo(sa("198.51.100.10:53")),
            DumpFilter::UdpTo(sa("203.0.113.10:53")),
            DumpFilter::UdpToPort(30053),
        ]
    );
    assert!(StaleFilter::new(Family::V4, &ports[1..3], &[]).is_empty());
}

#[test]
fn a_frontend_claimed_twice_keeps_entries_either_port_serves() {
    let mut a = udp_port("a", "10.96.0.1", 53, &["10.244.1.1:53"]);
    let mut b = udp_port("b", "10.96.0.2", 53, &["10.244.1.2:53"]);
    a.external_ips = vec![ip("198.51.100.1")];
    b.external_ips = vec![ip("198.51.100.1")];
    let ports = [a, b];
    let filter = StaleFilter::new(Family::V4, &ports, &[]);
    let to = |ep: &str| flow("192.168.100.10:4000", "198.51.100.1:53", ep);
    assert!(!filter.is_stale(&to("10.244.1.1:53")));
    assert!(!filter.is_stale(&to("10.244.1.2:53")));
    assert!(filter.is_stale(&to("10.244.1.3:53")));
}
