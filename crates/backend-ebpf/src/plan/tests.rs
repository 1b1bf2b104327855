use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use kpng_model::{Endpoint, Family, PortKey, Protocol, ServiceKey, ServicePort, SessionAffinity};

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn sa(s: &str) -> SocketAddr {
    s.parse().expect("socket address")
}

fn key(name: &str, protocol: Protocol) -> PortKey {
    PortKey {
        service: ServiceKey {
            namespace: "default".into(),
            name: name.into(),
        },
        port_name: "".into(),
        protocol,
        family: Family::V4,
    }
}

fn ep(addr: &str, is_local: bool) -> Endpoint {
    let a = sa(addr);
    Endpoint {
        ip: a.ip(),
        port: a.port(),
        is_local,
        ready: true,
        serving: true,
        terminating: false,
    }
}

fn port(name: &str) -> ServicePort {
    ServicePort::new(key(name, Protocol::Tcp), ip("10.96.0.10"), 80)
}

#[test]
fn groups_follow_the_model_lists_and_policies() {
    let eps = vec![ep("10.244.1.2:8080", true), ep("10.244.2.2:8080", false)];
    let node = [ip("192.168.1.1"), ip("127.0.0.1")];
    struct Case {
        what: &'static str,
        port: ServicePort,
        want: Vec<(Scope, usize, usize, bool)>, // scope, frontends, endpoints, refuse
    }
    let cases = [
        Case {
            what: "ClusterIP with endpoints",
            port: ServicePort {
                cluster_endpoints: eps.clone(),
                has_any_endpoints: true,
                ..port("a")
            },
            want: vec![(Scope::Internal, 1, 2, false)],
        },
        Case {
            what: "no endpoint anywhere: refused",
            port: port("b"),
            want: vec![(Scope::Internal, 1, 0, true)],
        },
        Case {
            what: "internalTrafficPolicy Local without a local endpoint: left to the rules",
            port: ServicePort {
                internal_policy_local: true,
                has_any_endpoints: true,
                ..port("c")
            },
            want: vec![],
        },
        Case {
            what: "NodePort: node IPs (no loopback), external IP, LB IP without source ranges",
            port: ServicePort {
                node_port: Some(30080),
                external_ips: vec![ip("198.51.100.1")],
                load_balancer_ips: vec![ip("198.51.100.2")],
                cluster_endpoints: eps.clone(),
                local_endpoints: vec![eps[0].clone()],
                external_policy_local: true,
                has_any_endpoints: true,
                ..port("d")
            },
            want: vec![
                (Scope::Internal, 1, 2, false),
                (Scope::External, 3, 2, false),
            ],
        },
        Case {
            what: "LB IPs with source ranges are the rules'",
            port: ServicePort {
                load_balancer_ips: vec![ip("198.51.100.2")],
                source_ranges: vec!["10.0.0.0/8".parse().expect("net")],
                cluster_endpoints: eps.clone(),
                has_any_endpoints: true,
                ..port("e")
            },
            want: vec![(Scope::Internal, 1, 2, false)],
        },
    ];
    for c in cases {
        let got: Vec<(Scope, usize, usize, bool)> = groups(&c.port, &node)
            .iter()
            .map(|g| (g.scope, g.frontends.len(), g.endpoints.len(), g.refuse))
            .collect();
        assert_eq!(got, c.want, "{}", c.what);
    }
}

#[test]
fn sctp_is_left_to_the_rules_and_affinity_is_carried() {
    let mut p = port("s");
    p.key.protocol = Protocol::Sctp;
    assert!(groups(&p, &[]).is_empty());
    let p = ServicePort {
        session_affinity: Some(SessionAffinity {
            timeout_seconds: 30,
        }),
        ..port("t")
    };
    assert_eq!(groups(&p, &[])[0].affinity_seconds, 30);
}

fn entries(id: u32, eps: &[&str]) -> Entries {
    with_affinity(id, eps, 10)
}

fn with_affinity(id: u32, eps: &[&str], affinity_seconds: u32) -> Entries {
    let g = Group {
        scope: Scope::Internal,
        frontends: vec![(ip("10.96.0.10"), 80)],
        endpoints: eps.iter().map(|e| sa(e)).collect(),
        affinity_seconds,
        refuse: eps.is_empty(),
    };
    let mut e = Entries::default();
    e.add_group(id, 6, &g);
    e.seal();
    e
}

#[test]
fn ops_write_services_before_frontends_and_delete_in_reverse() {
    let none = Entries::default();
    let two = entries(1, &["10.0.0.1:80", "10.0.0.2:80"]);
    let add = ops(&none, &two);
    let order: Vec<MapId> = add
        .iter()
        .map(|o| match o {
            Op::Upsert(m, _, _) | Op::Delete(m, _) => *m,
        })
        .collect();
    assert_eq!(
        order,
        [
            MapId::Members,
            MapId::Members,
            MapId::Slots,
            MapId::Slots,
            MapId::Services,
            MapId::Frontends
        ]
    );
    // One endpoint leaves: slot 0 rewritten, the count, then slot 1 and the member deleted.
    let one = entries(1, &["10.0.0.2:80"]);
    let shrink = ops(&two, &one);
    assert!(
        matches!(shrink[0], Op::Upsert(MapId::Slots, _, _)),
        "{shrink:?}"
    );
    assert!(
        matches!(shrink[1], Op::Upsert(MapId::Services, _, _)),
        "{shrink:?}"
    );
    assert!(
        matches!(shrink[2], Op::Delete(MapId::Slots, _)),
        "{shrink:?}"
    );
    assert!(
        matches!(shrink[3], Op::Delete(MapId::Members, _)),
        "{shrink:?}"
    );
    assert_eq!(shrink.len(), 4);
    // Same state: nothing to do.
    assert!(ops(&one, &one).is_empty());
    // Gone: frontend first.
    let gone = ops(&one, &none);
    assert!(
        matches!(gone[0], Op::Delete(MapId::Frontends, _)),
        "{gone:?}"
    );
}

#[test]
fn members_are_written_only_for_affinity() {
    let plain = with_affinity(1, &["10.0.0.1:80", "10.0.0.2:80"], 0);
    assert!(plain.table(MapId::Members).is_some_and(Table::is_empty));
    assert_eq!(plain.table(MapId::Slots).map(Table::len), Some(2));
    let sticky = with_affinity(1, &["10.0.0.1:80", "10.0.0.2:80"], 10);
    assert_eq!(sticky.table(MapId::Members).map(Table::len), Some(2));
    // Turning affinity off deletes the members, after the service is rewritten.
    let off = ops(&sticky, &plain);
    assert!(
        matches!(off[0], Op::Upsert(MapId::Services, _, _)),
        "{off:?}"
    );
    assert!(matches!(off[1], Op::Delete(MapId::Members, _)), "{off:?}");
    assert_eq!(off.len(), 3, "{off:?}");
}

#[test]
fn ids_are_stable_reused_and_prefer_the_kernels() {
    let mut ids = Ids::default();
    let (a, b, c) = (
        key("a", Protocol::Tcp),
        key("b", Protocol::Tcp),
        key("c", Protocol::Udp),
    );
    assert_eq!(ids.assign(&a, Scope::Internal, Some(7)), 7);
    assert_eq!(ids.assign(&a, Scope::Internal, None), 7, "stable");
    // 7 is taken: b gets a fresh id.
    let idb = ids.assign(&b, Scope::Internal, Some(7));
    assert_ne!(idb, 7);
    ids.release(&a, Scope::Internal);
    assert_eq!(
        ids.assign(&c, Scope::External, None),
        7,
        "released ids are reused"
    );
    assert_eq!(ids.len(), 2);
    let _ = Arc::new(0);
}

#[test]
fn tables_sort_keep_the_last_of_equal_keys_and_diff_by_value() {
    let mut t = Table::new(MapId::Services);
    t.push(&[0, 0, 0, 2], &[2; 12]);
    t.push(&[0, 0, 0, 1], &[1; 12]);
    t.push(&[0, 0, 0, 2], &[3; 12]);
    t.seal();
    let rows: Vec<_> = t.iter().collect();
    assert_eq!(
        rows,
        [
            (&[0u8, 0, 0, 1][..], &[1u8; 12][..]),
            (&[0, 0, 0, 2][..], &[3; 12][..])
        ]
    );
    assert_eq!(t.get(&[0, 0, 0, 2]), Some(&[3u8; 12][..]));
    assert_eq!(t.get(&[0, 0, 0, 3]), None);
    // A dump of the wrong length is refused.
    assert!(Table::from_flat(MapId::Services, vec![0; 4], vec![0; 11]).is_none());

    let mut old = Entries::default();
    old.0.insert(MapId::Services, t.clone());
    let mut changed = t;
    changed.push(&[0, 0, 0, 1], &[9; 12]);
    changed.push(&[0, 0, 0, 4], &[4; 12]);
    changed.seal();
    let mut new = Entries::default();
    new.0.insert(MapId::Services, changed);
    // Key 1 changed value, key 4 is new, key 2 is unchanged: two upserts, no delete.
    let got = ops(&old, &new);
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(
        got.iter()
            .all(|o| matches!(o, Op::Upsert(MapId::Services, _, _)))
    );
    let back = ops(&new, &old);
    assert!(
        matches!(back.last(), Some(Op::Delete(MapId::Services, [0, 0, 0, 4]))),
        "{back:?}"
    );
}
