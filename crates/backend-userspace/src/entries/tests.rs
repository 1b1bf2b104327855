#![allow(clippy::unwrap_used)]

use kpng_model::Protocol;

use super::*;
use crate::testutil::{endpoint, service_port};

const LISTENERS: ListenerPorts = ListenerPorts {
    internal: 41000,
    external: Some(42000),
    short_circuit: Some(43000),
};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn vip(s: &str) -> EntryKey {
    EntryKey::Vip {
        ip: ip(s),
        protocol: Protocol::Tcp,
        port: 80,
    }
}

fn node_port() -> EntryKey {
    EntryKey::NodePort {
        family: Family::V4,
        protocol: Protocol::Tcp,
        port: 30080,
    }
}

fn action_of(entries: &[Entry], key: &EntryKey) -> Option<Action> {
    entries.iter().find(|e| e.key == *key).map(|e| e.action)
}

#[test]
fn a_cluster_ip_service_redirects_its_vip_to_its_listener() {
    let sp = service_port(
        "web",
        Protocol::Tcp,
        "10.96.0.1",
        &[endpoint("10.244.1.2", true)],
    );
    let got = port_entries(
        &sp,
        ListenerPorts {
            internal: 41000,
            external: None,
            short_circuit: None,
        },
        &[],
    );
    let want = vec![
        Entry {
            key: EntryKey::ClusterIp(ip("10.96.0.1")),
            action: Action::Member,
        },
        Entry {
            key: vip("10.96.0.1"),
            action: Action::Redirect(41000),
        },
        Entry {
            key: EntryKey::Listener {
                family: Family::V4,
                protocol: Protocol::Tcp,
                port: 41000,
            },
            action: Action::Member,
        },
    ];
    assert_eq!(got, want);
}

#[test]
fn unserved_traffic_is_refused_or_dropped_as_kube_proxy_does() {
    struct Case {
        what: &'static str,
        local_endpoint: bool,
        any_endpoint: bool,
        internal_local: bool,
        external_local: bool,
        cluster_ip: Action,
        external: Action,
    }
    let cases = [
        Case {
            what: "endpoints everywhere",
            local_endpoint: true,
            any_endpoint: true,
            internal_local: false,
            external_local: false,
            cluster_ip: Action::Redirect(41000),
            external: Action::Redirect(42000),
        },
        Case {
            what: "no endpoints at all: refused everywhere",
            local_endpoint: false,
            any_endpoint: false,
            internal_local: true,
            external_local: true,
            cluster_ip: Action::Refuse,
            external: Action::Refuse,
        },
        Case {
            what: "only remote endpoints, both policies Local: dropped",
            local_endpoint: false,
            any_endpoint: true,
            internal_local: true,
            external_local: true,
            cluster_ip: Action::Drop,
            external: Action::Drop,
        },
        Case {
            what: "only remote endpoints, externalTrafficPolicy Local",
            local_endpoint: false,
            any_endpoint: true,
            internal_local: false,
            external_local: true,
            cluster_ip: Action::Redirect(41000),
            external: Action::Drop,
        },
        Case {
            what: "only remote endpoints, internalTrafficPolicy Local",
            local_endpoint: false,
            any_endpoint: true,
            internal_local: true,
            external_local: false,
            cluster_ip: Action::Drop,
            external: Action::Redirect(42000),
        },
    ];
    for c in cases {
        let mut eps = Vec::new();
        if c.any_endpoint {
            eps.push(endpoint("10.244.2.2", false));
        }
        if c.local_endpoint {
            eps.push(endpoint("10.244.1.2", true));
        }
        let mut sp = service_port("web", Protocol::Tcp, "10.96.0.1", &eps);
        sp.node_port = Some(30080);
        sp.external_ips = vec![ip("198.51.100.7")];
        sp.load_balancer_ips = vec![ip("198.51.100.8")];
        sp.internal_policy_local = c.internal_local;
        sp.external_policy_local = c.external_local;
        let got = port_entries(&sp, LISTENERS, &[]);
        assert_eq!(
            action_of(&got, &vip("10.96.0.1")),
            Some(c.cluster_ip),
            "{}: ClusterIP",
            c.what
        );
        for key in [vip("198.51.100.7"), vip("198.51.100.8"), node_port()] {
            assert_eq!(
                action_of(&got, &key),
                Some(c.external),
                "{}: {key:?}",
                c.what
            );
        }
    }
}

#[test]
fn load_balancer_source_ranges_filter_only_the_load_balancer_ips() {
    let mut sp = service_port(
        "web",
        Protocol::Tcp,
        "10.96.0.1",
        &[endpoint("10.244.1.2", true)],
    );
    sp.external_ips = vec![ip("198.51.100.7")];
    sp.load_balancer_ips = vec![ip("198.51.100.8")];
    sp.source_ranges = vec![
        "203.0.113.0/25".parse().unwrap(),
        "203.0.113.128/25".parse().unwrap(),
    ];
    let firewall = |sp: &kpng_model::ServicePort, node_ips: &[IpAddr]| -> Vec<EntryKey> {
        port_entries(sp, LISTENERS, node_ips)
            .into_iter()
            .filter(|e| {
                matches!(
                    e.key,
                    EntryKey::FirewallVip { .. } | EntryKey::FirewallAllow { .. }
                )
            })
            .map(|e| e.key)
            .collect()
    };
    let allow = |source: &str| EntryKey::FirewallAllow {
        ip: ip("198.51.100.8"),
        protocol: Protocol::Tcp,
        port: 80,
        source: source.parse().unwrap(),
    };
    let lb = EntryKey::FirewallVip {
        ip: ip("198.51.100.8"),
        protocol: Protocol::Tcp,
        port: 80,
    };
    // Adjacent ranges are aggregated; the external IP is not filtered.
    assert_eq!(
        firewall(&sp, &[ip("192.168.100.1")]),
        vec![lb.clone(), allow("203.0.113.0/24")]
    );
    // A node inside the ranges may reach the LB IP from the LB IP itself (hairpin).
    assert_eq!(
        firewall(&sp, &[ip("203.0.113.9")]),
        vec![
            lb.clone(),
            allow("198.51.100.8/32"),
            allow("203.0.113.0/24")
        ]
    );
    // A range holding both the node and the LB IP (or /0) is the only element: the set is an
    // interval set, and the LB IP inside it as well made every transaction fail.
    for range in ["198.51.100.0/24", "0.0.0.0/0"] {
        sp.source_ranges = vec![range.parse().unwrap()];
        assert_eq!(
            firewall(&sp, &[ip("198.51.100.1")]),
            vec![lb.clone(), allow(range)],
            "{range}"
        );
    }
}

#[test]
fn node_entries_follow_the_node_port_addresses_setting() {
    let node_ips = [ip("192.168.100.1"), ip("fd00:100::1"), ip("127.0.0.1")];
    let cidrs = ["10.96.0.0/16".parse().unwrap()];
    let pods = ["10.244.1.0/24".parse().unwrap()];
    let keys = |setting: &NodePortAddresses, families: &[Family]| -> Vec<EntryKey> {
        let node = kpng_model::NodeState {
            ips: node_ips.to_vec(),
            ..kpng_model::NodeState::default()
        };
        node_entries(setting, &node, &cidrs, &pods, families)
            .into_iter()
            .map(|e| e.key)
            .collect()
    };
    let net = |s: &str| s.parse::<IpNet>().unwrap();
    assert_eq!(
        keys(&NodePortAddresses::Primary, &Family::ALL),
        vec![
            EntryKey::NodePortAddresses(net("192.168.100.1/32")),
            EntryKey::NodePortAddresses(net("fd00:100::1/128")),
            EntryKey::ServiceCidr(net("10.96.0.0/16")),
            EntryKey::PodCidr(net("10.244.1.0/24")),
        ],
        "primary: the node's IPs, never loopback"
    );
    assert_eq!(
        keys(
            &NodePortAddresses::Cidrs(vec![net("192.168.0.0/16")]),
            &[Family::V6]
        ),
        vec![EntryKey::NodePortAddresses(net("::/0"))],
        "a family without a CIDR: all its local addresses (as upstream)"
    );
    assert_eq!(
        keys(
            &NodePortAddresses::Cidrs(vec![net("192.168.0.0/16")]),
            &[Family::V4]
        ),
        vec![
            EntryKey::NodePortAddresses(net("192.168.0.0/16")),
            EntryKey::ServiceCidr(net("10.96.0.0/16")),
            EntryKey::PodCidr(net("10.244.1.0/24")),
        ]
    );
    // primary on a node that lists IPv4 only: IPv6 node ports on every local IPv6 address, as
    // kube-proxy's `primary` gives IPv6 no CIDR.
    let v4_only = kpng_model::NodeState {
        ips: vec![ip("192.168.100.1")],
        ..kpng_model::NodeState::default()
    };
    let nodeports: Vec<EntryKey> = node_entries(
        &NodePortAddresses::Primary,
        &v4_only,
        &[],
        &[],
        &Family::ALL,
    )
    .into_iter()
    .map(|e| e.key)
    .collect();
    assert_eq!(
        nodeports,
        vec![
            EntryKey::NodePortAddresses(net("192.168.100.1/32")),
            EntryKey::NodePortAddresses(net("::/0")),
        ]
    );
}

#[test]
fn pods_and_the_node_are_short_circuited_only_under_external_traffic_policy_local() {
    let short = |ip: &str| EntryKey::VipShortCircuit {
        ip: ip.parse().unwrap(),
        protocol: Protocol::Tcp,
        port: 80,
    };
    let node_port_short = EntryKey::NodePortShortCircuit {
        family: Family::V4,
        protocol: Protocol::Tcp,
        port: 30080,
    };
    // (policy Local, endpoints, short-circuit listener present, expected action)
    let cases = [
        (
            true,
            vec![endpoint("10.244.2.2", false)],
            true,
            Some(Action::Redirect(43000)),
        ),
        (
            true,
            vec![endpoint("10.244.1.2", true)],
            true,
            Some(Action::Redirect(43000)),
        ),
        (true, vec![], true, None),
        (false, vec![endpoint("10.244.1.2", true)], false, None),
    ];
    for (local, eps, listener, want) in cases {
        let mut sp = service_port("web", Protocol::Tcp, "10.96.0.1", &eps);
        sp.node_port = Some(30080);
        sp.load_balancer_ips = vec![ip("198.51.100.8")];
        sp.external_policy_local = local;
        let ports = ListenerPorts {
            short_circuit: listener.then_some(43000),
            ..LISTENERS
        };
        let got = port_entries(&sp, ports, &[]);
        let what = format!("local={local} endpoints={}", eps.len());
        assert_eq!(action_of(&got, &short("198.51.100.8")), want, "{what}");
        assert_eq!(action_of(&got, &node_port_short), want, "{what}");
        assert_eq!(
            action_of(&got, &short("10.96.0.1")),
            None,
            "{what}: never the ClusterIP"
        );
    }
}
