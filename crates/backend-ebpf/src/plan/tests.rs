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
            what: "UDP without any endpoint: left to the rules (REJECT at recv, as kube-proxy)",
            port: ServicePort::new(key("u", Protocol::Udp), ip("10.96.0.11"), 53),
            want: vec![],
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

/// With ClientIP affinity, the node port, external and LB IPs share the ClusterIP's group
/// (one id, one affinity per client) when their endpoint lists are the same; a different list
/// (internalTrafficPolicy Local) keeps its own group.
#[test]
fn affinity_is_shared_by_every_address_of_a_port_with_one_list() {
    let eps = vec![ep("10.244.1.2:8080", true), ep("10.244.2.2:8080", false)];
    let node = [ip("192.168.100.1")];
    let affinity = Some(SessionAffinity {
        timeout_seconds: 30,
    });
    let shape = |p: &ServicePort| -> Vec<(Scope, usize, usize)> {
        groups(p, &node)
            .iter()
            .map(|g| (g.scope, g.frontends.len(), g.endpoints.len()))
            .collect()
    };
    let both = ServicePort {
        node_port: Some(30080),
        external_ips: vec![ip("198.51.100.1")],
        cluster_endpoints: eps.clone(),
        local_endpoints: vec![eps[0].clone()],
        has_any_endpoints: true,
        session_affinity: affinity,
        ..port("a")
    };
    assert_eq!(shape(&both), vec![(Scope::Internal, 3, 2)]);
    let without_affinity = ServicePort {
        session_affinity: None,
        ..both.clone()
    };
    assert_eq!(
        shape(&without_affinity),
        vec![(Scope::Internal, 1, 2), (Scope::External, 2, 2)]
    );
    let internal_local = ServicePort {
        internal_policy_local: true,
        ..both
    };
    assert_eq!(
        shape(&internal_local),
        vec![(Scope::Internal, 1, 1), (Scope::External, 2, 2)]
    );
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

fn eps(n: u16) -> Vec<String> {
    (1..=n).map(|i| format!("10.0.0.{i}:80")).collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn maps_of(ops: &[Op<'_>]) -> Vec<(MapId, bool)> {
    ops.iter()
        .map(|o| match o {
            Op::Upsert(m, _, _) => (*m, true),
            Op::Delete(m, _) => (*m, false),
        })
        .collect()
}

#[test]
fn a_short_list_is_one_element_per_frontend() {
    let none = Entries::default();
    let two = entries(1, &["10.0.0.1:80", "10.0.0.2:80"]);
    assert_eq!(two.len(), 1, "the endpoints are inline");
    let value = two
        .table(MapId::Frontends)
        .and_then(|t| t.get(&layout::frontend_key(ip("10.96.0.10"), 80, 6)))
        .expect("frontend");
    assert_eq!(layout::service_id_of(value), Some(1));
    assert_eq!(
        layout::service_endpoints(value),
        [sa("10.0.0.1:80"), sa("10.0.0.2:80")]
    );
    assert_eq!(maps_of(&ops(&none, &two)), [(MapId::Frontends, true)]);
    // One endpoint leaves: the frontend is rewritten, nothing else.
    let one = entries(1, &["10.0.0.2:80"]);
    assert_eq!(maps_of(&ops(&two, &one)), [(MapId::Frontends, true)]);
    assert!(ops(&one, &one).is_empty());
    assert_eq!(maps_of(&ops(&one, &none)), [(MapId::Frontends, false)]);
}

#[test]
fn a_long_list_overflows_into_slots_written_before_and_deleted_after_the_frontend() {
    let none = Entries::default();
    let ten = eps(10);
    let long = entries(1, &strs(&ten));
    // Slots 8 and 9, a member per endpoint (affinity), one frontend.
    assert_eq!(long.table(MapId::Slots).map(Table::len), Some(2));
    assert_eq!(long.table(MapId::Members).map(Table::len), Some(10));
    let add = maps_of(&ops(&none, &long));
    assert_eq!(add.len(), 13);
    assert_eq!(add.last(), Some(&(MapId::Frontends, true)), "{add:?}");
    assert!(
        add[..12]
            .iter()
            .all(|(m, up)| *m != MapId::Frontends && *up)
    );
    // Shrinking to 9: the frontend's count first, then slot 9 and the member go.
    let nine = entries(1, &strs(&ten[..9]));
    assert_eq!(
        maps_of(&ops(&long, &nine)),
        [
            (MapId::Frontends, true),
            (MapId::Slots, false),
            (MapId::Members, false)
        ]
    );
    // Back to inline: every slot and member goes after the frontend.
    let short = entries(1, &strs(&ten[..8]));
    let back = maps_of(&ops(&nine, &short));
    assert_eq!(back[0], (MapId::Frontends, true));
    assert_eq!(back.len(), 1 + 1 + 9, "{back:?}");
    // Gone: frontend first.
    assert_eq!(
        ops(&long, &none).first().map(|o| maps_of(&[*o])[0]),
        Some((MapId::Frontends, false))
    );
}

#[test]
fn members_are_written_only_for_long_lists_whose_choices_are_kept() {
    let ten = eps(10);
    let plain = with_affinity(1, &strs(&ten), 0);
    assert!(plain.table(MapId::Members).is_some_and(Table::is_empty));
    assert_eq!(plain.table(MapId::Slots).map(Table::len), Some(2));
    let sticky = with_affinity(1, &strs(&ten), 10);
    assert_eq!(sticky.table(MapId::Members).map(Table::len), Some(10));
    let short = with_affinity(1, &strs(&ten[..3]), 10);
    assert_eq!(short.len(), 1, "a short list is searched inline");
    // UDP without affinity: unconnected sockets' flows keep their endpoint while it is a member.
    let mut udp = Entries::default();
    udp.add_group(
        1,
        17,
        &Group {
            scope: Scope::Internal,
            frontends: vec![(ip("10.96.0.10"), 53)],
            endpoints: ten.iter().map(|e| sa(e)).collect(),
            affinity_seconds: 0,
            refuse: false,
        },
    );
    udp.seal();
    assert_eq!(udp.table(MapId::Members).map(Table::len), Some(10));
    // Turning affinity off deletes the members, after the frontend is rewritten.
    let off = maps_of(&ops(&sticky, &plain));
    assert_eq!(off[0], (MapId::Frontends, true));
    assert_eq!(off.len(), 11, "{off:?}");
}

#[test]
fn converge_writes_only_changes_in_batches_and_finds_the_stale() {
    let old = entries(1, &["10.0.0.1:80"]);
    let t = old.table(MapId::Frontends).expect("frontends");
    let mut c = Converge::new(t);
    // The same element: nothing to write, no longer stale.
    let (k, v) = t.iter().next().expect("row");
    assert!(!c.put(k, v));
    assert_eq!(c.written(), 0);
    assert_eq!(c.stale().count(), 0);
    // A changed value and new keys are written; a full batch is reported.
    let mut c = Converge::new(t);
    let mut changed = v.to_vec();
    changed[4] ^= 1;
    assert!(!c.put(k, &changed));
    let mut full = false;
    for i in 0..crate::batch::CHUNK as u32 {
        let key = layout::frontend_key(ip("10.97.0.1"), 1 + (i % 60000) as u16, (i / 60000) as u8);
        full = c.put(&key, v);
        if full {
            break;
        }
    }
    assert!(full, "a batch is reported at CHUNK elements");
    let (keys, values) = c.take();
    assert_eq!(keys.len(), crate::batch::CHUNK * layout::FRONTEND_KEY);
    assert_eq!(values.len(), crate::batch::CHUNK * layout::SERVICE);
    assert_eq!(&values[..layout::SERVICE], &changed[..]);
    assert!(c.take().0.is_empty());
    // An old key nobody wanted is stale.
    let c = Converge::new(t);
    assert_eq!(c.stale().collect::<Vec<_>>(), [k]);
}

/// The map holds each key once: an IP that is both a Service's external and load-balancer IP is one
/// frontend key put twice, so `kpng_ebpf_map_entries` counts it once.
#[test]
fn wanted_counts_each_key_once() {
    let old = entries(1, &["10.0.0.1:80"]);
    let t = old.table(MapId::Frontends).expect("frontends");
    let (held, value) = t.iter().next().expect("row");
    let shared = layout::frontend_key(ip("203.0.113.7"), 443, 6);
    let other = layout::frontend_key(ip("203.0.113.8"), 443, 6);
    // (what, the keys put, the distinct keys wanted)
    let cases: [(&str, Vec<&[u8]>, usize); 5] = [
        ("nothing", vec![], 0),
        ("a held key", vec![held], 1),
        ("a held key twice", vec![held, held], 1),
        (
            "a new key twice, as one Service's external and load-balancer IP",
            vec![&shared, &shared],
            1,
        ),
        (
            "held and new keys",
            vec![held, &shared, &other, &shared, held],
            3,
        ),
    ];
    for (what, puts, want) in cases {
        let mut c = Converge::new(t);
        // The first pass of a full sync marks the held keys first: not a put.
        c.keep(held);
        for key in &puts {
            c.put(key, value);
        }
        assert_eq!(c.wanted(), want, "{what}");
    }
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
    // A full sync keeps the ids of the groups it assigns and releases the others.
    ids.begin();
    assert_eq!(ids.assign(&c, Scope::External, None), 7);
    ids.sweep();
    assert_eq!(ids.len(), 1);
    assert_eq!(ids.get(&b, Scope::Internal), None);
    assert_eq!(
        ids.assign(&a, Scope::Internal, None),
        idb,
        "b's id is free again"
    );
    let _ = Arc::new(0);
}

#[test]
fn tables_sort_keep_the_last_of_equal_keys_and_diff_by_value() {
    let mut t = Table::new(MapId::Slots);
    t.push(&[0, 0, 0, 0, 0, 0, 0, 2], &[2; 20]);
    t.push(&[0, 0, 0, 0, 0, 0, 0, 1], &[1; 20]);
    t.push(&[0, 0, 0, 0, 0, 0, 0, 2], &[3; 20]);
    t.seal();
    let rows: Vec<_> = t.iter().collect();
    assert_eq!(
        rows,
        [
            (&[0u8, 0, 0, 0, 0, 0, 0, 1][..], &[1u8; 20][..]),
            (&[0, 0, 0, 0, 0, 0, 0, 2][..], &[3; 20][..])
        ]
    );
    assert_eq!(t.get(&[0, 0, 0, 0, 0, 0, 0, 2]), Some(&[3u8; 20][..]));
    assert_eq!(t.get(&[0, 0, 0, 0, 0, 0, 0, 3]), None);
    // A dump of the wrong length is refused.
    assert!(Table::from_flat(MapId::Slots, vec![0; 8], vec![0; 19]).is_none());

    let mut old = Entries::default();
    old.0.insert(MapId::Slots, t.clone());
    let mut changed = t;
    changed.push(&[0, 0, 0, 0, 0, 0, 0, 1], &[9; 20]);
    changed.push(&[0, 0, 0, 0, 0, 0, 0, 4], &[4; 20]);
    changed.seal();
    let mut new = Entries::default();
    new.0.insert(MapId::Slots, changed);
    // Key 1 changed value, key 4 is new, key 2 is unchanged: two upserts, no delete.
    let got = ops(&old, &new);
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(
        got.iter()
            .all(|o| matches!(o, Op::Upsert(MapId::Slots, _, _)))
    );
    let back = ops(&new, &old);
    assert!(
        matches!(
            back.last(),
            Some(Op::Delete(MapId::Slots, [0, 0, 0, 0, 0, 0, 0, 4]))
        ),
        "{back:?}"
    );
}

/// A node's maps driven by [`replan`] as the backend's change syncs drive them, beside what
/// a full sync of the same ports wants.
#[derive(Default)]
struct Node {
    ids: Ids,
    contest: Contest,
    node_ips: HashMap<Family, Vec<IpAddr>>,
    ports: BTreeMap<PortKey, Arc<ServicePort>>,
    /// The maps, element by element.
    maps: BTreeMap<(MapId, Vec<u8>), Vec<u8>>,
    /// `kpng_ebpf_map_entries` as the change syncs move it (summed over the maps).
    counted: i64,
}

impl Node {
    fn with_node_ip(ip: IpAddr) -> Node {
        Node {
            node_ips: HashMap::from([(Family::V4, vec![ip])]),
            ..Node::default()
        }
    }

    /// One change sync: `changes` are ports set (`Some`) or deleted (`None`).
    fn sync(&mut self, changes: Vec<(PortKey, Option<ServicePort>)>) {
        let mut diff = BTreeMap::new();
        for (key, new) in changes {
            let new = new.map(Arc::new);
            let old = match &new {
                Some(p) => self.ports.insert(key.clone(), p.clone()),
                None => self.ports.remove(&key),
            };
            diff.insert(key, Change { old, new });
        }
        let plan = replan(
            &diff,
            &self.ports,
            &self.node_ips,
            &mut self.ids,
            &mut self.contest,
        );
        for op in ops(&plan.old, &plan.new) {
            match op {
                Op::Upsert(m, k, v) => {
                    self.maps.insert((m, k.to_vec()), v.to_vec());
                }
                Op::Delete(m, k) => {
                    self.maps.remove(&(m, k.to_vec()));
                }
            }
        }
        self.counted += i64::try_from(plan.new.len()).expect("len")
            - i64::try_from(plan.old.len()).expect("len");
        for (key, scope) in plan.released {
            self.ids.release(&key, scope);
        }
    }

    /// The endpoints each frontend key translates to, from the maps (`full`: what a full sync
    /// of the same ports writes instead, as `EbpfBackend::full` computes it).
    fn frontends(&self, full: bool) -> BTreeMap<Vec<u8>, Vec<SocketAddr>> {
        let entries: Vec<(Vec<u8>, Vec<u8>)> = if full {
            let ips = |f: Family| self.node_ips.get(&f).map_or(&[][..], Vec::as_slice);
            let mut contest = Contest::default();
            for p in self.ports.values() {
                contest.declare(p, ips(p.key.family));
            }
            let mut e = Entries::default();
            for (id, p) in (1..).zip(self.ports.values()) {
                for (scope, g) in (0..).zip(won_groups(p, ips(p.key.family), &contest)) {
                    let proto = layout::ip_proto(p.key.protocol).expect("proto");
                    e.add_group(id * 2 + scope, proto, &g);
                }
            }
            e.seal();
            let t = e.table(MapId::Frontends).expect("frontends");
            t.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect()
        } else {
            self.maps
                .iter()
                .filter(|((m, _), _)| *m == MapId::Frontends)
                .map(|((_, k), v)| (k.clone(), v.clone()))
                .collect()
        };
        entries
            .into_iter()
            .map(|(k, v)| (k, layout::service_endpoints(&v)))
            .collect()
    }
}

/// A Service's external IP that is also a node address shares its `kpng_frontends` key with
/// another Service's node port of that number: the external IP wins (nftables matches the
/// Service IPs before the node ports), whichever came first, and a change of either leaves
/// the maps as a full sync of the new state would: the loser takes over in the same sync as
/// the winner leaves, and a change of the loser leaves the winner's element alone.
#[test]
fn a_service_ip_wins_a_key_shared_with_a_node_port_in_every_order() {
    let node_ip = ip("192.168.1.1");
    let a_key = key("a-external", Protocol::Tcp);
    let b_key = key("b-nodeport", Protocol::Tcp);
    let a_ep = sa("10.244.0.1:80");
    let b_ep = sa("10.244.0.2:80");
    let a = ServicePort {
        external_ips: vec![node_ip],
        cluster_endpoints: vec![ep("10.244.0.1:80", false)],
        has_any_endpoints: true,
        ..ServicePort::new(a_key.clone(), ip("10.96.0.1"), 30080)
    };
    let b = ServicePort {
        node_port: Some(30080),
        cluster_endpoints: vec![ep("10.244.0.2:80", false)],
        has_any_endpoints: true,
        ..ServicePort::new(b_key.clone(), ip("10.96.0.2"), 80)
    };
    let a_moved = ServicePort {
        external_ips: vec![node_ip],
        ..ServicePort::new(a_key.clone(), ip("10.96.0.1"), 8080)
    };
    let b_moved = ServicePort {
        node_port: Some(30081),
        ..b.clone()
    };
    let a_firewalled = ServicePort {
        external_ips: vec![],
        load_balancer_ips: vec![node_ip],
        source_ranges: vec!["10.0.0.0/8".parse().expect("net")],
        ..a.clone()
    };
    let shared = layout::frontend_key(node_ip, 30080, 6).to_vec();
    let moved = layout::frontend_key(node_ip, 30081, 6).to_vec();
    let (set_a, set_b) = (
        || (a_key.clone(), Some(a.clone())),
        || (b_key.clone(), Some(b.clone())),
    );
    type Step = Vec<(PortKey, Option<ServicePort>)>;
    struct Case {
        what: &'static str,
        steps: Vec<Step>,
        /// Who the shared key translates to after the last step; `moved`: B's moved node port.
        shared: Option<SocketAddr>,
        moved: Option<SocketAddr>,
    }
    let cases = [
        Case {
            what: "external IP first, then the node port",
            steps: vec![vec![set_a()], vec![set_b()]],
            shared: Some(a_ep),
            moved: None,
        },
        Case {
            what: "node port first, then the external IP",
            steps: vec![vec![set_b()], vec![set_a()]],
            shared: Some(a_ep),
            moved: None,
        },
        Case {
            what: "both in one sync",
            steps: vec![vec![set_b(), set_a()]],
            shared: Some(a_ep),
            moved: None,
        },
        Case {
            what: "the winner deleted: the node port takes over",
            steps: vec![vec![set_a()], vec![set_b()], vec![(a_key.clone(), None)]],
            shared: Some(b_ep),
            moved: None,
        },
        Case {
            what: "the winner deleted, node port first",
            steps: vec![vec![set_b()], vec![set_a()], vec![(a_key.clone(), None)]],
            shared: Some(b_ep),
            moved: None,
        },
        Case {
            what: "the loser deleted: the winner keeps its element",
            steps: vec![vec![set_a()], vec![set_b()], vec![(b_key.clone(), None)]],
            shared: Some(a_ep),
            moved: None,
        },
        Case {
            what: "the loser's node port changed: the winner keeps the key",
            steps: vec![
                vec![set_b()],
                vec![set_a()],
                vec![(b_key.clone(), Some(b_moved.clone()))],
            ],
            shared: Some(a_ep),
            moved: Some(b_ep),
        },
        Case {
            what: "the winner's port changed: the node port takes over",
            steps: vec![
                vec![set_a()],
                vec![set_b()],
                vec![(a_key.clone(), Some(a_moved.clone()))],
            ],
            shared: Some(b_ep),
            moved: None,
        },
        Case {
            what: "a load-balancer IP with source ranges leaves the key to the nftables rules",
            steps: vec![
                vec![set_b()],
                vec![(a_key.clone(), Some(a_firewalled.clone()))],
            ],
            shared: None,
            moved: None,
        },
    ];
    // Every case is run, and every wrong one named.
    let mut wrong = Vec::new();
    for c in cases {
        let mut node = Node::with_node_ip(node_ip);
        for (i, step) in c.steps.into_iter().enumerate() {
            node.sync(step);
            let (now, full) = (node.frontends(false), node.frontends(true));
            if now != full {
                wrong.push(format!(
                    "{}: after step {i} the maps hold {now:?}, a full sync writes {full:?}",
                    c.what
                ));
            }
            let held = i64::try_from(node.maps.len()).expect("len");
            if node.counted != held {
                wrong.push(format!(
                    "{}: after step {i} the entries gauge says {}, the maps hold {held}",
                    c.what, node.counted
                ));
            }
        }
        let frontends = node.frontends(false);
        let owner = |k: &Vec<u8>| frontends.get(k).cloned().unwrap_or_default();
        for (which, k, want) in [("shared", &shared, c.shared), ("moved", &moved, c.moved)] {
            let got = owner(k);
            if got != Vec::from_iter(want) {
                wrong.push(format!(
                    "{}: the {which} key goes to {got:?}, want {want:?}",
                    c.what
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A restart at 30k Services reads every frontend back: what the full sync keeps of each is its
/// key and a digest (36 bytes), not the 196 bytes of the element (~10 MB at 30k Services, more
/// with the copies made while reading and sorting, beside the nftables half's peak), and it
/// still tells an unchanged value from a changed one and reads the service id.
#[test]
fn frontends_read_back_are_kept_as_digests() {
    let n: u16 = 1000;
    let key = |i: u16| layout::frontend_key(ip("10.96.0.1"), i + 1, 6);
    let value = |i: u16, port: u16| {
        layout::service(u32::from(i), 1, 0, 0, &[sa(&format!("10.0.0.1:{port}"))])
    };
    let mut t = Table::read_back(MapId::Frontends);
    for i in 0..n {
        t.push_read(&key(i), &value(i, 80));
    }
    t.seal();
    assert_eq!(t.len(), usize::from(n));
    assert!(
        t.bytes() <= usize::from(n) * (layout::FRONTEND_KEY + DIGEST),
        "{} bytes for {n} frontends",
        t.bytes()
    );
    assert_eq!(t.get(&key(7)).and_then(layout::service_id_of), Some(7));
    let mut c = Converge::new(&t);
    for i in 0..n {
        let port = if i % 10 == 0 { 81 } else { 80 };
        c.put(&key(i), &value(i, port));
    }
    assert_eq!(c.written(), usize::from(n / 10), "only the changed values");
    let (_, values) = c.take();
    assert_eq!(
        values.len(),
        usize::from(n / 10) * layout::SERVICE,
        "written whole"
    );
    assert_eq!(&values[..layout::SERVICE], &value(0, 81)[..]);
    assert_eq!(c.stale().count(), 0);
    // The other maps' values are kept whole (the UDP pairs read the slots' endpoints).
    let slot = layout::slot_key(7, 0);
    let mut slots = Table::read_back(MapId::Slots);
    slots.push_read(&slot, &[3u8; layout::ENDPOINT]);
    slots.seal();
    assert_eq!(slots.get(&slot), Some(&[3u8; layout::ENDPOINT][..]));
}
