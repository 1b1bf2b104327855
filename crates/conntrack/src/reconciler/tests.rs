use std::sync::Arc;

use kpng_model::{Change, Diff};

use super::*;
use crate::fake::FakeTable;
use crate::flow::IPPROTO_TCP;
use crate::test_support::{flow, ip, sa, udp_port};

const NODE: &str = "192.168.100.1";

/// kube-dns-like (ClusterIP + node port) and one more UDP Service.
fn ports(dns_serving: &[&str]) -> Vec<ServicePort> {
    let mut dns = udp_port("dns", "10.96.0.10", 53, dns_serving);
    dns.node_port = Some(30053);
    vec![
        dns,
        udp_port("stats", "10.96.0.20", 8125, &["10.244.1.4:8125"]),
    ]
}

/// Entries that must survive every pass below.
fn unrelated() -> Vec<Flow> {
    let mut tcp = flow("10.244.1.9:4100", "10.96.0.10:53", "10.244.2.1:53");
    tcp.protocol = IPPROTO_TCP;
    vec![
        flow("10.244.1.9:4000", "10.96.0.10:53", "10.244.2.7:53"),
        flow("10.244.1.9:4001", "8.8.8.8:53", "8.8.8.8:53"),
        flow("10.244.1.9:4002", "192.168.100.2:30053", "10.244.2.1:53"),
        flow("[fd00::9]:4003", "[fd00:96::a]:53", "[fd00:244::1]:53"),
        tcp,
    ]
}

fn dnat_stale() -> Vec<Flow> {
    vec![
        flow("10.244.1.9:5000", "10.96.0.10:53", "10.244.2.1:53"),
        flow(
            "192.168.100.10:5001",
            "192.168.100.1:30053",
            "10.244.2.1:53",
        ),
    ]
}

fn never_dnated() -> Vec<Flow> {
    vec![
        flow("10.244.1.9:5002", "10.96.0.10:53", "10.96.0.10:53"),
        flow(
            "192.168.100.10:5003",
            "192.168.100.1:30053",
            "192.168.100.1:30053",
        ),
    ]
}

fn table(flows: Vec<Flow>) -> FakeTable {
    FakeTable::new(flows, vec![ip(NODE), ip("fd00:100::1")])
}

fn originals(flows: &[Flow]) -> Vec<Tuple> {
    let mut v: Vec<Tuple> = flows.iter().map(|f| f.original).collect();
    v.sort_by_key(|t| (t.src, t.dst));
    v
}

#[test]
fn first_pass_reads_each_new_frontend_and_deletes_every_stale_entry() {
    let all: Vec<Flow> = [unrelated(), dnat_stale(), never_dnated()].concat();
    let fake = table(all);
    let mut reconciler = Reconciler::new(Box::new(fake.clone()));
    let ports = ports(&["10.244.2.7:53"]);
    let pass = reconciler.reconcile(Family::V4, &ports).expect("pass");
    assert_eq!((pass.frontends, pass.new_frontends), (3, 3));
    // Every frontend is new (a start-up): one narrow dump each, no DNAT dump.
    assert_eq!(
        pass.dumps,
        [
            DumpFilter::UdpTo(sa("10.96.0.10:53")),
            DumpFilter::UdpTo(sa("10.96.0.20:8125")),
            DumpFilter::UdpToPort(30053),
        ]
    );
    assert_eq!(
        (pass.stale, pass.outcome.deleted, pass.outcome.gone),
        (4, 4, 0)
    );
    assert_eq!(originals(&fake.flows()), originals(&unrelated()));
}

/// The pass names the Service ports whose entries it found stale (by Service IP and by node
/// port), and only those: the deletion log line says whose clients were moved.
#[test]
fn a_pass_names_the_services_whose_entries_were_stale() {
    // (what, extra flows, services named)
    let cases: [(&str, Vec<Flow>, &[&str]); 3] = [
        ("nothing stale", Vec::new(), &[]),
        (
            "dns by ClusterIP and node port",
            dnat_stale(),
            &["ns/dns:dns"],
        ),
        (
            "dns and stats",
            [
                never_dnated(),
                vec![flow(
                    "10.244.1.9:6000",
                    "10.96.0.20:8125",
                    "10.244.9.9:8125",
                )],
            ]
            .concat(),
            &["ns/dns:dns", "ns/stats:dns"],
        ),
    ];
    for (what, extra, want) in cases {
        let fake = table([unrelated(), extra].concat());
        let mut reconciler = Reconciler::new(Box::new(fake));
        let pass = reconciler
            .reconcile(Family::V4, &ports(&["10.244.2.7:53"]))
            .expect("pass");
        assert_eq!(pass.services, want, "{what}");
    }
}

#[test]
fn later_passes_read_only_dnated_entries_and_new_frontends() {
    let fake = table(unrelated());
    let mut reconciler = Reconciler::new(Box::new(fake.clone()));
    let before = ports(&["10.244.2.7:53", "10.244.2.1:53"]);
    reconciler
        .reconcile(Family::V4, &before)
        .expect("first pass");
    // 10.244.2.1 goes away; entries pinned to it are stale. A never-DNATed entry to a
    // frontend that has long been programmed cannot appear; if one does, it is left.
    fake.state().flows.extend(dnat_stale());
    fake.state().flows.extend(never_dnated());
    fake.state().dumps.clear();
    let after = ports(&["10.244.2.7:53"]);
    let pass = reconciler.reconcile(Family::V4, &after).expect("pass");
    assert_eq!(pass.new_frontends, 0);
    assert_eq!(pass.dumps, [DumpFilter::UdpDnat]);
    assert_eq!(fake.state().dumps, [(Family::V4, DumpFilter::UdpDnat)]);
    assert_eq!(pass.outcome.deleted, 2);
    assert_eq!(
        originals(&fake.flows()),
        originals(&[unrelated(), never_dnated()].concat())
    );

    // A new external IP is a new frontend: its never-DNATed entries are looked for too.
    let mut grown = ports(&["10.244.2.7:53"]);
    grown[0].external_ips = vec![ip("198.51.100.10")];
    let early = flow(
        "192.168.100.10:6000",
        "198.51.100.10:53",
        "198.51.100.10:53",
    );
    fake.state().flows.push(early);
    let pass = reconciler.reconcile(Family::V4, &grown).expect("pass");
    assert_eq!(
        pass.dumps,
        [
            DumpFilter::UdpDnat,
            DumpFilter::UdpTo(sa("198.51.100.10:53"))
        ]
    );
    assert_eq!(pass.outcome.deleted, 1);
    assert!(!fake.flows().contains(&early));
}

#[test]
fn a_port_that_gets_endpoints_back_is_new_again() {
    let fake = table(unrelated());
    let mut reconciler = Reconciler::new(Box::new(fake.clone()));
    reconciler
        .reconcile(Family::V4, &ports(&["10.244.2.7:53"]))
        .expect("pass");
    // Scaled to zero: the port is left alone (its traffic is rejected), and forgotten.
    let zero = ports(&[]);
    let pass = reconciler.reconcile(Family::V4, &zero).expect("pass");
    assert_eq!(
        (pass.frontends, pass.new_frontends),
        (1, 0),
        "only the other Service"
    );
    // Scaled back to a new endpoint: the entry still pinned to the old one and one sent
    // while nothing was programmed are both stale.
    let pinned_to_old = flow("10.244.1.9:7000", "10.96.0.10:53", "10.244.2.7:53");
    let unprogrammed = flow("10.244.1.9:7001", "10.96.0.10:53", "10.96.0.10:53");
    fake.state().flows.extend([pinned_to_old, unprogrammed]);
    let pass = reconciler
        .reconcile(Family::V4, &ports(&["10.244.2.8:53"]))
        .expect("pass");
    assert_eq!(pass.new_frontends, 2);
    assert!(pass.dumps.contains(&DumpFilter::UdpTo(sa("10.96.0.10:53"))));
    let left = fake.flows();
    assert!(!left.contains(&pinned_to_old) && !left.contains(&unprogrammed));
}

#[test]
fn many_new_frontends_in_a_large_table_use_one_dump_of_every_udp_entry() {
    let fake = table(unrelated());
    fake.state().size = Some(TableSize {
        entries: 10_000,
        buckets: 262_144,
    });
    let mut reconciler = Reconciler::new(Box::new(fake.clone()));
    let pass = reconciler
        .reconcile(Family::V4, &ports(&["10.244.2.7:53"]))
        .expect("pass");
    assert_eq!(pass.dumps, [DumpFilter::Udp]);
    fake.state().size = Some(TableSize {
        entries: 1_000_000,
        buckets: 262_144,
    });
    reconciler.forget_checked();
    let pass = reconciler
        .reconcile(Family::V4, &ports(&["10.244.2.7:53"]))
        .expect("pass");
    assert_eq!(pass.dumps.len(), 3, "narrow: {:?}", pass.dumps);
    assert_eq!(originals(&fake.flows()), originals(&unrelated()));
}

#[test]
fn narrow_dumps_pay_off_in_large_tables_only() {
    let cases = [
        // (entries, buckets, narrow dumps, worth it)
        (1_000_000, 262_144, 1, true),
        (1_000_000, 262_144, 8, true),
        (1_000_000, 262_144, 9, false),
        (100_000, 262_144, 4, true),
        (100_000, 262_144, 5, false),
        (10_000, 262_144, 1, false),
        (10_000, 1024, 1, true),
    ];
    for (entries, buckets, n, expected) in cases {
        let size = TableSize { entries, buckets };
        assert_eq!(
            size.narrow_dumps_pay_off(n),
            expected,
            "{size:?}, {n} dumps"
        );
    }
}

#[test]
fn a_failed_pass_deletes_nothing_and_keeps_its_frontends_new() {
    let fake = table([unrelated(), dnat_stale()].concat());
    let mut reconciler = Reconciler::new(Box::new(fake.clone()));
    fake.state().failing = true;
    assert!(
        reconciler
            .reconcile(Family::V4, &ports(&["10.244.2.7:53"]))
            .is_err()
    );
    fake.state().failing = false;
    assert_eq!(fake.flows().len(), unrelated().len() + 2);
    let pass = reconciler
        .reconcile(Family::V4, &ports(&["10.244.2.7:53"]))
        .expect("pass");
    assert_eq!(pass.new_frontends, 3);
    assert_eq!(pass.outcome.deleted, 2);
}

#[test]
fn no_udp_port_with_serving_endpoints_reads_nothing() {
    let fake = table(unrelated());
    let mut reconciler = Reconciler::new(Box::new(fake.clone()));
    let mut tcp = ports(&["10.244.2.7:53"]);
    for p in &mut tcp {
        p.key.protocol = Protocol::Tcp;
    }
    let mut idle = ports(&[]);
    idle[1].serving_endpoints.clear();
    for ports in [Vec::new(), idle, tcp] {
        let pass = reconciler.reconcile(Family::V4, &ports).expect("pass");
        assert!(pass.dumps.is_empty());
    }
    assert!(fake.state().dumps.is_empty());
    assert_eq!(fake.flows().len(), unrelated().len());
}

#[test]
fn ipv6_passes_see_ipv6_entries_only() {
    let stale6 = flow("[fd00::9]:5000", "[fd00:96::a]:53", "[fd00:244::1]:53");
    let fake = table([unrelated(), dnat_stale(), vec![stale6]].concat());
    let mut reconciler = Reconciler::new(Box::new(fake.clone()));
    let ports6 = [udp_port("dns6", "fd00:96::a", 53, &["[fd00:244::7]:53"])];
    let pass = reconciler.reconcile(Family::V6, &ports6).expect("pass");
    assert_eq!(
        pass.outcome.deleted, 2,
        "the unrelated one too: it is stale for v6"
    );
    let left = fake.flows();
    assert!(!left.contains(&stale6));
    assert_eq!(left.len(), unrelated().len() + 2 - 1);
}

/// A diff with one change of port `p` from `old` to `new` serving endpoints.
fn change(old: Option<ServicePort>, new: Option<ServicePort>) -> Diff {
    let key = old
        .as_ref()
        .or(new.as_ref())
        .map(|p| p.key.clone())
        .expect("a port");
    let mut diff = Diff::default();
    diff.changes.insert(
        key,
        Change {
            old: old.map(Arc::new),
            new: new.map(Arc::new),
        },
    );
    diff
}

#[test]
fn which_syncs_need_a_pass() {
    let dns = |serving: &[&str]| udp_port("dns", "10.96.0.10", 53, serving);
    let with_external = {
        let mut p = dns(&["10.244.2.7:53"]);
        p.external_ips = vec![ip("198.51.100.10")];
        p
    };
    let mut tcp_old = dns(&["10.244.2.7:53"]);
    tcp_old.key.protocol = Protocol::Tcp;
    let mut tcp_new = dns(&[]);
    tcp_new.key.protocol = Protocol::Tcp;
    let mut moved = dns(&["10.244.2.7:53"]);
    moved.port = 5353;
    let cases = [
        ("nothing", Diff::default(), false),
        (
            "new UDP port with endpoints",
            change(None, Some(dns(&["10.244.2.7:53"]))),
            true,
        ),
        (
            "new UDP port without endpoints",
            change(None, Some(dns(&[]))),
            false,
        ),
        (
            "scale-up",
            change(
                Some(dns(&["10.244.2.7:53"])),
                Some(dns(&["10.244.2.7:53", "10.244.2.8:53"])),
            ),
            false,
        ),
        (
            "lost an endpoint",
            change(
                Some(dns(&["10.244.2.7:53", "10.244.2.8:53"])),
                Some(dns(&["10.244.2.7:53"])),
            ),
            true,
        ),
        (
            "endpoint replaced",
            change(Some(dns(&["10.244.2.7:53"])), Some(dns(&["10.244.2.8:53"]))),
            true,
        ),
        (
            "scaled to zero",
            change(Some(dns(&["10.244.2.7:53"])), Some(dns(&[]))),
            false,
        ),
        (
            "back from zero",
            change(Some(dns(&[])), Some(dns(&["10.244.2.7:53"]))),
            true,
        ),
        (
            "gained an external IP",
            change(Some(dns(&["10.244.2.7:53"])), Some(with_external.clone())),
            true,
        ),
        (
            "lost an external IP",
            change(Some(with_external), Some(dns(&["10.244.2.7:53"]))),
            false,
        ),
        (
            "port number changed",
            change(Some(dns(&["10.244.2.7:53"])), Some(moved)),
            true,
        ),
        (
            "port removed",
            change(Some(dns(&["10.244.2.7:53"])), None),
            false,
        ),
        (
            "TCP endpoint gone",
            change(Some(tcp_old), Some(tcp_new)),
            false,
        ),
    ];
    for (what, diff, needed) in cases {
        assert_eq!(pass_needed(Family::V4, &diff, false), needed, "{what}");
        assert!(
            pass_needed(Family::V4, &diff, true),
            "{what}: full syncs always"
        );
        assert!(
            !pass_needed(Family::V6, &diff, false),
            "{what}: other family"
        );
    }
}

/// What the runner does after each successful sync: forget the frontends that left the
/// rules, then a pass when the sync calls for one.
fn after_sync(reconciler: &mut Reconciler, diff: &Diff, now: &[ServicePort]) -> Option<Pass> {
    reconciler.forget_gone(Family::V4, diff);
    pass_needed(Family::V4, diff, false)
        .then(|| reconciler.reconcile(Family::V4, now).expect("pass"))
}

#[test]
fn a_frontend_that_left_the_rules_is_new_when_it_comes_back() {
    let dns = |serving: &[&str]| udp_port("dns", "10.96.0.10", 53, serving);
    let with_external = |serving: &[&str]| {
        let mut p = dns(serving);
        p.external_ips = vec![ip("198.51.100.10")];
        p
    };
    let to_cluster_ip = flow("10.244.1.9:7001", "10.96.0.10:53", "10.96.0.10:53");
    let to_external = flow(
        "192.168.100.10:6000",
        "198.51.100.10:53",
        "198.51.100.10:53",
    );
    // (what happens, the port, the port while a frontend is out of the rules (None: gone),
    // an entry a client created meanwhile, never DNATed)
    let cases = [
        (
            "Service deleted and re-created with its ClusterIP",
            dns(&["10.244.2.7:53"]),
            None,
            to_cluster_ip,
        ),
        (
            "scaled to zero and back",
            dns(&["10.244.2.7:53"]),
            Some(dns(&[])),
            to_cluster_ip,
        ),
        (
            "external IP dropped and added again",
            with_external(&["10.244.2.7:53"]),
            Some(dns(&["10.244.2.7:53"])),
            to_external,
        ),
    ];
    for (what, port, out, early) in cases {
        let fake = table(unrelated());
        let mut reconciler = Reconciler::new(Box::new(fake.clone()));
        let added = change(None, Some(port.clone()));
        assert!(after_sync(&mut reconciler, &added, std::slice::from_ref(&port)).is_some());
        let now: Vec<ServicePort> = out.iter().cloned().collect();
        let taken_out = change(Some(port.clone()), out.clone());
        assert!(
            after_sync(&mut reconciler, &taken_out, &now).is_none(),
            "{what}: taking a frontend out calls for no pass"
        );
        fake.state().flows.push(early);
        let back = change(out, Some(port.clone()));
        let pass = after_sync(&mut reconciler, &back, std::slice::from_ref(&port))
            .expect("a frontend back calls for a pass");
        assert_eq!(pass.new_frontends, 1, "{what}: {:?}", pass.dumps);
        assert!(!fake.flows().contains(&early), "{what}: {:?}", pass.dumps);
        assert_eq!(originals(&fake.flows()), originals(&unrelated()), "{what}");
    }

    // A frontend that stays in the rules stays checked: an endpoint leaving reads the DNATed
    // entries only.
    let fake = table(unrelated());
    let mut reconciler = Reconciler::new(Box::new(fake.clone()));
    let two = dns(&["10.244.2.7:53", "10.244.2.8:53"]);
    after_sync(
        &mut reconciler,
        &change(None, Some(two.clone())),
        std::slice::from_ref(&two),
    );
    // The checks' version moves only when they change: a memory of them is not rewritten
    // by syncs that change nothing.
    let version = reconciler.checked_version();
    reconciler
        .reconcile(Family::V4, std::slice::from_ref(&two))
        .expect("pass");
    reconciler.forget_gone(Family::V4, &change(Some(two.clone()), Some(two.clone())));
    assert_eq!(reconciler.checked_version(), version);
    let one = dns(&["10.244.2.7:53"]);
    let pass = after_sync(
        &mut reconciler,
        &change(Some(two), Some(one.clone())),
        &[one],
    )
    .expect("a lost endpoint calls for a pass");
    assert_eq!(pass.dumps, [DumpFilter::UdpDnat]);
    assert_eq!(
        reconciler.checked_version(),
        version,
        "the same frontend, still checked"
    );
    reconciler.forget_gone(Family::V4, &change(Some(dns(&["10.244.2.7:53"])), None));
    assert_ne!(reconciler.checked_version(), version, "forgotten");
}

/// Only the frontends the rules DNAT are remembered as checked: a port whose only endpoint is
/// serving but neither ready nor terminating is in the backends' no-endpoint sets (upstream
/// does not use such an endpoint), and so is the ClusterIP of an internal-traffic-policy-Local
/// port without a local endpoint. Remembered, a restart that reads the rules in place (the
/// nftables dispatch maps) did not find them and said another writer had taken them out.
#[test]
fn frontends_the_rules_do_not_dnat_are_not_remembered_as_checked() {
    let fake = table(unrelated());
    let mut reconciler = Reconciler::new(Box::new(fake.clone()));
    let mut ports = ports(&["10.244.2.7:53"]);
    // stats: its only endpoint is serving, not ready, not terminating.
    ports[1].cluster_endpoints.clear();
    ports[1].has_any_endpoints = false;
    // A third: internal traffic policy Local, its endpoints on other nodes only.
    let mut local = udp_port("local", "10.96.0.30", 514, &["10.244.2.9:514"]);
    local.internal_policy_local = true;
    local.node_port = Some(30514);
    ports.push(local);
    let want: HashSet<Frontend> = [
        Frontend::Ip(sa("10.96.0.10:53")),
        Frontend::NodePort(30053),
        Frontend::NodePort(30514),
    ]
    .into();
    reconciler.reconcile(Family::V4, &ports).expect("pass");
    assert_eq!(reconciler.checked().get(&Family::V4), Some(&want));
    reconciler.keep_only(Family::V4, &ports);
    assert_eq!(reconciler.checked().get(&Family::V4), Some(&want));
    // Its entries are still judged against its serving endpoints, as upstream's cleanup does.
    let stale = flow("10.244.1.9:6000", "10.96.0.20:8125", "10.244.1.5:8125");
    let kept = flow("10.244.1.9:6001", "10.96.0.20:8125", "10.244.1.4:8125");
    let fake = table(vec![stale, kept]);
    let mut reconciler = Reconciler::new(Box::new(fake.clone()));
    reconciler.reconcile(Family::V4, &ports).expect("pass");
    assert_eq!(fake.flows(), vec![kept]);
}
