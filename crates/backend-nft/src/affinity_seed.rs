//! ClientIP affinity ids across a restart: which Service port keeps which id, read back from the
//! table kpng adopts.
//!
//! Why: the dynamic `affinity` map (`client . id → endpoint`) is kept when kpng adopts an
//! earlier run's table, but it is keyed by the id, which lived only in that run's memory. Ids
//! allocated afresh would move a port's clients to other endpoints once, and give a port
//! another port's live entries. The table already says which entry point had which id: its
//! `affinity-bits-*` elements hold `entry point . bit` for every bit of the id (nothing is
//! added to the ruleset for this), and the affinity map's keys say which ids have live
//! entries. Both are read once at start-up ([`crate::netlink::ElementWriter::set_keys`]), never
//! in the sync loop; this module turns what was read into the allocator's seed
//! ([`crate::affinity::AffinityIds::seed`]).

use std::collections::{BTreeSet, HashMap, HashSet};

use kpng_model::ServicePort;

use crate::affinity::AffinityIds;
use crate::elements::entry_points;
use crate::ruleset::PickKind;
use crate::sets::Set;
use crate::store::OwnerId;
use crate::value::{FieldValue, Key};

/// What one family's adopted table says of affinity ids.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableIds {
    /// Each entry point's mark per endpoint list (`true`: the local list): the OR of its
    /// `affinity-bits-*` elements.
    pub entries: HashMap<(Key, bool), u32>,
    /// The marks the affinity map has live entries under.
    pub live: HashSet<u32>,
}

impl TableIds {
    /// Adds one element of an `affinity-bits-*` set, as [`crate::netlink::decode::key_fields`]
    /// read it; `false` when the fields are not such an element's.
    pub fn add_bit_element(&mut self, kind: PickKind, fields: &[FieldValue]) -> bool {
        use FieldValue as F;
        let (entry, bit) = match *fields {
            [F::Addr(a), F::Proto(p), F::Port(port), F::Mark(bit)] if kind.keyed_by_vip() => {
                (Key::Vip(a, p, port), bit)
            }
            [F::Proto(p), F::Port(port), F::Mark(bit)] if !kind.keyed_by_vip() => {
                (Key::NodePort(p, port), bit)
            }
            _ => return false,
        };
        let local = matches!(kind, PickKind::Local | PickKind::NodePortLocal);
        *self.entries.entry((entry, local)).or_insert(0) |= bit;
        true
    }

    /// Adds one key of the dynamic affinity map (`affinity`, `affinity-addr`): its mark is
    /// an id with live entries. `false` when the key holds no mark.
    pub fn add_live_key(&mut self, fields: &[FieldValue]) -> bool {
        match fields.iter().find_map(|f| match f {
            FieldValue::Mark(m) => Some(*m),
            _ => None,
        }) {
            Some(mark) => {
                self.live.insert(mark);
                true
            }
            None => false,
        }
    }
}

/// The `affinity-bits-*` sets, with the endpoint-list kind of each.
pub const BIT_SETS: [(Set, PickKind); 4] = [
    (Set::AffinityBits(PickKind::Cluster), PickKind::Cluster),
    (Set::AffinityBits(PickKind::Local), PickKind::Local),
    (
        Set::AffinityBits(PickKind::NodePortCluster),
        PickKind::NodePortCluster,
    ),
    (
        Set::AffinityBits(PickKind::NodePortLocal),
        PickKind::NodePortLocal,
    ),
];

/// The allocator's seed: the slot each port keeps, and every slot the tables showed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seed {
    /// Owner → the slot it keeps.
    pub claims: Vec<(OwnerId, u32)>,
    /// Every slot in use or with live entries in the tables (kept or not).
    pub seen: BTreeSet<u32>,
}

/// Decides which slot each Service port with ClientIP affinity keeps. `ports` in a stable
/// order (the snapshot's key order): a slot two ports could claim goes to the first. A port's
/// candidates are the slots of its entry points' marks, the ClusterIP's first: the slot it was
/// reached by before. A mark that is not one `ids` could have given (outside the mask, a
/// cluster list's even id) is ignored.
pub fn plan<'a>(
    tables: &[(kpng_model::Family, TableIds)],
    ids: &AffinityIds,
    ports: impl IntoIterator<Item = (OwnerId, &'a ServicePort)>,
) -> Seed {
    let mut seed = Seed::default();
    for (_, table) in tables {
        let listed = table.entries.iter().map(|((_, l), m)| (*m, Some(*l)));
        let live = table.live.iter().map(|m| (*m, None));
        seed.seen
            .extend(listed.chain(live).filter_map(|(m, l)| ids.slot_of(m, l)));
    }
    let mut taken = HashSet::new();
    for (owner, port) in ports {
        if port.session_affinity.is_none() {
            continue;
        }
        let Some((_, table)) = tables.iter().find(|(f, _)| *f == port.key.family) else {
            continue;
        };
        let candidates = entry_points(port).into_iter().flat_map(|entry| {
            [false, true].into_iter().filter_map(move |local| {
                let mark = table.entries.get(&(entry, local))?;
                ids.slot_of(*mark, Some(local))
            })
        });
        let mut candidates = candidates;
        if let Some(slot) = candidates.find(|s| !taken.contains(s)) {
            taken.insert(slot);
            seed.claims.push((owner, slot));
        }
    }
    seed
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use kpng_model::{Family, PortKey, Protocol, ServiceKey, SessionAffinity, TargetPort};

    use super::*;
    use crate::affinity::{DEFAULT_CONNTRACK_MARK_MASK, deposit};

    fn port(name: &str, family: Family, cip: &str, node_port: Option<u16>) -> ServicePort {
        ServicePort {
            key: PortKey {
                service: ServiceKey::new("ns", name),
                port_name: "p".into(),
                protocol: Protocol::Tcp,
                family,
            },
            cluster_ip: cip.parse::<IpAddr>().expect("ip"),
            port: 80,
            node_port,
            target_port: TargetPort::Number(8080),
            external_ips: Vec::new(),
            load_balancer_ips: Vec::new(),
            source_ranges: Vec::new(),
            session_affinity: Some(SessionAffinity {
                timeout_seconds: 10800,
            }),
            external_policy_local: false,
            internal_policy_local: false,
            health_check_node_port: None,
            preserve_destination: false,
            cluster_endpoints: Vec::new(),
            local_endpoints: Vec::new(),
            has_any_endpoints: true,
            local_ready_endpoints: 0,
            serving_endpoints: Vec::new(),
        }
    }

    /// The marks of slot `s` in the default mask: (cluster, local).
    fn marks(s: u32) -> (u32, u32) {
        let m = DEFAULT_CONNTRACK_MARK_MASK;
        (deposit(2 * s + 1, m), deposit(2 * s + 2, m))
    }

    fn vip(ip: &str) -> Key {
        Key::Vip(ip.parse().expect("ip"), Protocol::Tcp, 80)
    }

    /// A table whose entry points had these slots (both lists), and live entries under these
    /// slots' cluster marks.
    fn table(entries: &[(Key, u32)], live: &[u32]) -> TableIds {
        let mut t = TableIds::default();
        for (entry, slot) in entries {
            let (c, l) = marks(*slot);
            t.entries.insert((*entry, false), c);
            t.entries.insert((*entry, true), l);
        }
        t.live = live.iter().map(|s| marks(*s).0).collect();
        t
    }

    #[test]
    fn ports_keep_the_slot_their_entry_points_had() {
        struct Case {
            what: &'static str,
            tables: Vec<(Family, TableIds)>,
            ports: Vec<ServicePort>,
            claims: Vec<(OwnerId, u32)>,
            seen: Vec<u32>,
        }
        let a = port("a", Family::V4, "10.96.0.1", None);
        let b = port("b", Family::V4, "10.96.0.2", Some(30002));
        let b6 = port("b", Family::V6, "fd00::2", Some(30002));
        let mut plain = port("plain", Family::V4, "10.96.0.3", None);
        plain.session_affinity = None;
        let cases = [
            Case {
                what: "a removed port's slot stays seen, the other keeps its own",
                tables: vec![(
                    Family::V4,
                    table(&[(vip("10.96.0.1"), 0), (vip("10.96.0.2"), 1)], &[]),
                )],
                ports: vec![b.clone()],
                claims: vec![(2, 1)],
                seen: vec![0, 1],
            },
            Case {
                what: "the node port alone names the slot (ClusterIP changed)",
                tables: vec![(
                    Family::V4,
                    table(&[(Key::NodePort(Protocol::Tcp, 30002), 4)], &[]),
                )],
                ports: vec![b.clone()],
                claims: vec![(2, 4)],
                seen: vec![4],
            },
            Case {
                what: "the ClusterIP wins over the node port",
                tables: vec![(
                    Family::V4,
                    table(
                        &[
                            (vip("10.96.0.2"), 3),
                            (Key::NodePort(Protocol::Tcp, 30002), 5),
                        ],
                        &[],
                    ),
                )],
                ports: vec![b.clone()],
                claims: vec![(2, 3)],
                seen: vec![3, 5],
            },
            Case {
                what: "families are apart: the same node port has its own slot per table",
                tables: vec![
                    (
                        Family::V4,
                        table(&[(Key::NodePort(Protocol::Tcp, 30002), 1)], &[]),
                    ),
                    (
                        Family::V6,
                        table(&[(Key::NodePort(Protocol::Tcp, 30002), 2)], &[]),
                    ),
                ],
                ports: vec![b.clone(), b6.clone()],
                claims: vec![(2, 1), (6, 2)],
                seen: vec![1, 2],
            },
            Case {
                what: "a slot two ports name goes to the first; the second takes its next",
                tables: vec![(
                    Family::V4,
                    table(
                        &[
                            (vip("10.96.0.1"), 2),
                            (vip("10.96.0.2"), 2),
                            (Key::NodePort(Protocol::Tcp, 30002), 6),
                        ],
                        &[],
                    ),
                )],
                ports: vec![a.clone(), b.clone()],
                claims: vec![(1, 2), (2, 6)],
                seen: vec![2, 6],
            },
            Case {
                what: "live entries only: seen, claimed by no one",
                tables: vec![(Family::V4, table(&[], &[7, 9]))],
                ports: vec![a.clone()],
                claims: vec![],
                seen: vec![7, 9],
            },
            Case {
                what: "a port without affinity claims nothing",
                tables: vec![(Family::V4, table(&[(vip("10.96.0.3"), 0)], &[]))],
                ports: vec![plain.clone()],
                claims: vec![],
                seen: vec![0],
            },
            Case {
                what: "no table for the family (an older kpng's): nothing",
                tables: vec![(Family::V6, table(&[(vip("10.96.0.1"), 0)], &[]))],
                ports: vec![a.clone()],
                claims: vec![],
                seen: vec![0],
            },
        ];
        let ids = AffinityIds::new(DEFAULT_CONNTRACK_MARK_MASK);
        for case in cases {
            let owner = |p: &ServicePort| -> OwnerId {
                match (&*p.key.service.name, p.key.family) {
                    ("a", _) => 1,
                    ("b", Family::V4) => 2,
                    ("b", Family::V6) => 6,
                    _ => 9,
                }
            };
            let seed = plan(&case.tables, &ids, case.ports.iter().map(|p| (owner(p), p)));
            assert_eq!(seed.claims, case.claims, "{}", case.what);
            assert_eq!(
                seed.seen.into_iter().collect::<Vec<_>>(),
                case.seen,
                "{}",
                case.what
            );
        }
    }

    /// The entry points read back are exactly those whose `affinity-bits-*` elements the port
    /// writes: every VIP and the node port.
    #[test]
    fn entry_points_are_those_the_bit_elements_are_keyed_by() {
        use kpng_model::Endpoint;
        let mut p = port("lb", Family::V4, "10.96.0.7", Some(30007));
        p.external_ips = vec!["198.51.100.7".parse().expect("ip")];
        p.load_balancer_ips = vec!["203.0.113.7".parse().expect("ip")];
        let ep = Endpoint {
            ip: "10.244.1.7".parse().expect("ip"),
            port: 8080,
            is_local: true,
            ready: true,
            serving: true,
            terminating: false,
        };
        p.cluster_endpoints = vec![ep.clone()];
        p.local_endpoints = vec![ep];
        let marks = crate::affinity::Marks {
            cluster: 0x3000,
            local: 0x4000,
        };
        let mut written = BTreeSet::new();
        for e in crate::elements::port_elements(&p, Some(marks), &[]) {
            let entry = match e.key {
                Key::VipBit(a, proto, port, _) => Key::Vip(a, proto, port),
                Key::NodePortBit(proto, port, _) => Key::NodePort(proto, port),
                _ => continue,
            };
            written.insert(entry);
        }
        let read: BTreeSet<Key> = entry_points(&p).into_iter().collect();
        assert_eq!(written, read);
        assert_eq!(read.len(), 4);
    }

    #[test]
    fn marks_that_no_allocator_could_give_are_ignored() {
        let ids = AffinityIds::new(DEFAULT_CONNTRACK_MARK_MASK);
        let mut t = TableIds::default();
        // A bit outside the mask (another --conntrack-mark-mask), an even cluster id, zero.
        t.entries.insert((vip("10.96.0.1"), false), 0x0000_0001);
        t.entries.insert((vip("10.96.0.2"), false), marks(0).1);
        t.entries.insert((vip("10.96.0.4"), false), 0);
        t.live.insert(0x10);
        let ports = [
            port("a", Family::V4, "10.96.0.1", None),
            port("b", Family::V4, "10.96.0.2", None),
            port("c", Family::V4, "10.96.0.4", None),
        ];
        let seed = plan(
            &[(Family::V4, t)],
            &ids,
            ports.iter().enumerate().map(|(i, p)| (i as OwnerId, p)),
        );
        assert_eq!(seed, Seed::default());
    }

    #[test]
    fn bit_elements_add_up_to_each_entry_points_mark() {
        let mut t = TableIds::default();
        let ip: IpAddr = "10.96.0.1".parse().expect("ip");
        for bit in [0x1000, 0x0100_0000] {
            let fields = [
                FieldValue::Addr(ip),
                FieldValue::Proto(Protocol::Udp),
                FieldValue::Port(53),
                FieldValue::Mark(bit),
            ];
            assert!(t.add_bit_element(PickKind::Local, &fields));
            // A VIP-keyed element in a node-port set is not one.
            assert!(!t.add_bit_element(PickKind::NodePortLocal, &fields));
        }
        assert_eq!(
            t.entries.get(&(Key::Vip(ip, Protocol::Udp, 53), true)),
            Some(&0x0100_1000)
        );
        assert!(t.add_live_key(&[FieldValue::Addr(ip), FieldValue::Mark(0x3000)]));
        assert!(!t.add_live_key(&[FieldValue::Addr(ip)]));
        assert_eq!(t.live, HashSet::from([0x3000]));
    }
}
