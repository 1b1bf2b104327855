//! The netlink side against the real kernel, each test in a fresh network namespace (its own
//! conntrack table): create entries, dump them with kernel filters, delete exactly the stale
//! ones. Root only (skipped otherwise, failing under `CI`).
//!
//! A test re-executes this test binary inside a new namespace (`ip netns exec`) with
//! `KPNG_CONNTRACK_TEST_NETNS` set; the inner run does the work.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use kpng_conntrack::{ConntrackSocket, DumpFilter, Flow, IPPROTO_TCP, Reconciler, Tuple};
use kpng_model::{Family, PortKey, Protocol, ServiceKey, ServicePort};
use kpng_testkit::{Netns, require_root};

const INSIDE: &str = "KPNG_CONNTRACK_TEST_NETNS";

/// Runs `body` in a fresh network namespace (by re-running test `name` there); returns
/// `true` in the outer process once the inner run passed.
#[track_caller]
fn in_fresh_netns(name: &str, body: impl FnOnce()) {
    if std::env::var_os(INSIDE).is_some() {
        body();
        return;
    }
    let ns = Netns::new("ct").expect("netns");
    let exe = std::env::current_exe().expect("test executable");
    let out = ns
        .command([
            exe.as_os_str(),
            name.as_ref(),
            "--exact".as_ref(),
            "--nocapture".as_ref(),
            "--test-threads=1".as_ref(),
        ])
        .env(INSIDE, "1")
        .stdin(Stdio::null())
        .output()
        .expect("run the test in the namespace");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "inside the namespace:\n{text}");
    assert!(
        text.contains("1 passed"),
        "the inner run did not run the test:\n{text}"
    );
}

fn sa(s: &str) -> SocketAddr {
    s.parse().expect("socket address")
}

/// A UDP entry client → vip, DNATed to `endpoint` (reply endpoint → client).
fn dnat(client: &str, vip: &str, endpoint: &str) -> Flow {
    Flow::udp(
        Tuple::new(sa(client), sa(vip)),
        Tuple::new(sa(endpoint), sa(client)),
    )
}

fn dump(s: &mut ConntrackSocket, family: Family, filter: DumpFilter) -> Vec<Flow> {
    let mut out = Vec::new();
    s.dump(family, &filter, &mut |f| out.push(*f))
        .expect("dump");
    out.sort_by_key(|f| (f.original.src, f.original.dst));
    out
}

#[test]
fn create_dump_filter_and_delete_by_tuple() {
    require_root!();
    in_fresh_netns("create_dump_filter_and_delete_by_tuple", || {
        let mut s = ConntrackSocket::open().expect("socket");
        let stale = dnat("10.244.1.5:4000", "10.96.0.10:53", "10.244.2.9:53");
        let live = dnat("10.244.1.5:4001", "10.96.0.10:53", "10.244.2.7:53");
        let other_vip = dnat("10.244.1.5:4002", "10.96.0.11:53", "10.244.2.9:53");
        let node_port = dnat(
            "192.168.100.10:5000",
            "192.168.100.1:30053",
            "10.244.2.9:53",
        );
        let mut tcp = dnat("10.244.1.5:4003", "10.96.0.10:53", "10.244.2.9:53");
        tcp.protocol = IPPROTO_TCP;
        let v6 = dnat("[fd00::5]:4000", "[fd00:96::a]:53", "[fd00:244::9]:53");
        let all = [stale, live, other_vip, node_port, tcp, v6];
        let created = s.create(&all, Duration::from_secs(600)).expect("create");
        assert_eq!(created, all.len());
        // Creating again changes nothing ("exists" is not an error).
        assert_eq!(s.create(&all, Duration::from_secs(600)).expect("again"), 0);

        // Family and protocol are filtered in the kernel.
        let udp4 = dump(&mut s, Family::V4, DumpFilter::Udp);
        assert_eq!(udp4.len(), 4, "{udp4:#?}");
        assert!(udp4.iter().all(|f| f.id.is_some() && f.zone.is_none()));
        let found = udp4
            .iter()
            .find(|f| f.original == stale.original)
            .expect("stale entry dumped");
        // Created with a DNAT, as a Service rule makes it: the kernel derived the reply.
        assert_eq!(found.reply, stale.reply);
        assert!(found.is_dnat());
        // DNATed entries only (status filter).
        let plain = Flow::udp(
            Tuple::new(sa("10.244.1.5:4010"), sa("8.8.8.8:53")),
            Tuple::new(sa("8.8.8.8:53"), sa("10.244.1.5:4010")),
        );
        s.create(&[plain], Duration::from_secs(600)).expect("plain");
        let dnat = dump(&mut s, Family::V4, DumpFilter::UdpDnat);
        assert_eq!(dnat.len(), 4, "{dnat:#?}");
        assert!(dnat.iter().all(Flow::is_dnat));
        let plain = dump(&mut s, Family::V4, DumpFilter::UdpTo(sa("8.8.8.8:53")));
        assert_eq!(plain.len(), 1);
        assert!(!plain[0].is_dnat());
        s.delete(&plain).expect("delete the plain one");
        let udp6 = dump(&mut s, Family::V6, DumpFilter::Udp);
        assert_eq!(udp6.len(), 1);
        assert_eq!(udp6[0].original, v6.original);
        // Destination address and port.
        let to_vip = dump(&mut s, Family::V4, DumpFilter::UdpTo(sa("10.96.0.10:53")));
        let originals: Vec<Tuple> = to_vip.iter().map(|f| f.original).collect();
        assert_eq!(originals, [stale.original, live.original]);
        // Destination port on any address.
        let to_port = dump(&mut s, Family::V4, DumpFilter::UdpToPort(30053));
        assert_eq!(to_port.len(), 1);
        assert_eq!(to_port[0].original, node_port.original);

        // Delete exactly one entry, by its dumped tuple and id.
        let outcome = s.delete(&[*found]).expect("delete");
        assert_eq!((outcome.deleted, outcome.gone, outcome.failed), (1, 0, 0));
        let left = dump(&mut s, Family::V4, DumpFilter::Udp);
        assert_eq!(left.len(), 3);
        assert!(left.iter().all(|f| f.original != stale.original));
        // Deleting it again: gone, not an error.
        let outcome = s.delete(&[*found]).expect("delete again");
        assert_eq!((outcome.deleted, outcome.gone), (0, 1));
        // The id is checked: an entry with the same tuple but another id (a newer one) stays.
        s.create(&[stale], Duration::from_secs(600))
            .expect("re-create");
        let newer = dump(&mut s, Family::V4, DumpFilter::UdpTo(sa("10.96.0.10:53")))
            .into_iter()
            .find(|f| f.original == stale.original)
            .expect("re-created entry");
        let mut other_id = newer;
        other_id.id = newer.id.map(|id| id ^ 1);
        let outcome = s.delete(&[other_id]).expect("delete with another id");
        assert_eq!((outcome.deleted, outcome.gone), (0, 1));
        assert_eq!(dump(&mut s, Family::V4, DumpFilter::Udp).len(), 4);
    });
}

#[test]
fn batches_of_thousands() {
    require_root!();
    in_fresh_netns("batches_of_thousands", || {
        let mut s = ConntrackSocket::open().expect("socket");
        let flows: Vec<Flow> = (0..3000u32)
            .map(|i| {
                let client =
                    SocketAddr::new([10, 1, (i / 250) as u8, (i % 250) as u8 + 1].into(), 5000);
                dnat(&client.to_string(), "10.96.0.10:53", "10.244.2.9:53")
            })
            .collect();
        assert_eq!(
            s.create(&flows, Duration::from_secs(600)).expect("create"),
            3000
        );
        let dumped = dump(&mut s, Family::V4, DumpFilter::UdpTo(sa("10.96.0.10:53")));
        assert_eq!(dumped.len(), 3000);
        let outcome = s.delete(&dumped[..2500]).expect("delete");
        assert_eq!(outcome.deleted, 2500);
        assert_eq!(dump(&mut s, Family::V4, DumpFilter::Udp).len(), 500);
    });
}

/// A ready endpoint at `addr`: what the rules DNAT to.
fn ready(addr: &str) -> kpng_model::Endpoint {
    let addr = sa(addr);
    kpng_model::Endpoint {
        ip: addr.ip(),
        port: addr.port(),
        is_local: false,
        ready: true,
        serving: true,
        terminating: false,
    }
}

fn dns_port(serving: &str) -> ServicePort {
    ServicePort {
        node_port: Some(30053),
        has_any_endpoints: true,
        cluster_endpoints: vec![ready(serving)],
        serving_endpoints: vec![sa(serving)],
        ..ServicePort::new(
            PortKey {
                service: ServiceKey::new("kube-system", "dns"),
                port_name: "dns".into(),
                protocol: Protocol::Udp,
                family: Family::V4,
            },
            "10.96.0.10".parse().expect("ip"),
            53,
        )
    }
}

#[test]
fn reconciler_passes_against_the_kernel() {
    require_root!();
    in_fresh_netns("reconciler_passes_against_the_kernel", || {
        std::process::Command::new("ip")
            .args(["addr", "add", "192.168.100.1/32", "dev", "lo"])
            .status()
            .expect("ip addr add");
        let mut s = ConntrackSocket::open().expect("socket");
        let keep = [
            dnat("10.244.1.5:4000", "10.96.0.10:53", "10.244.2.7:53"),
            dnat("10.244.1.5:4001", "8.8.8.8:53", "8.8.8.8:53"),
            dnat(
                "10.244.1.5:4002",
                "192.168.100.2:30053",
                "192.168.100.2:30053",
            ),
        ];
        let first_stale = [
            dnat("10.244.1.5:5000", "10.96.0.10:53", "10.244.2.9:53"),
            dnat("10.244.1.5:5001", "10.96.0.10:53", "10.96.0.10:53"),
            dnat(
                "192.168.100.10:5002",
                "192.168.100.1:30053",
                "10.244.2.9:53",
            ),
            dnat(
                "192.168.100.10:5003",
                "192.168.100.1:30053",
                "192.168.100.1:30053",
            ),
        ];
        s.create(&keep, Duration::from_secs(600)).expect("create");
        s.create(&first_stale, Duration::from_secs(600))
            .expect("create");
        let mut reconciler = Reconciler::open().expect("reconciler");
        let ports = [dns_port("10.244.2.7:53")];
        let pass = reconciler
            .reconcile(Family::V4, &ports)
            .expect("first pass");
        assert_eq!(pass.outcome.deleted, 4, "{pass:?}");
        let left: Vec<Tuple> = dump(&mut s, Family::V4, DumpFilter::Udp)
            .iter()
            .map(|f| f.original)
            .collect();
        let mut expected: Vec<Tuple> = keep.iter().map(|f| f.original).collect();
        expected.sort_by_key(|t| (t.src, t.dst));
        assert_eq!(left, expected);

        // The endpoint is replaced: one dump of the DNATed entries finds the stale ones.
        let pinned_to_old = dnat("10.244.1.5:6000", "10.96.0.10:53", "10.244.2.8:53");
        s.create(&[pinned_to_old], Duration::from_secs(600))
            .expect("create");
        let ports = [dns_port("10.244.2.8:53")];
        let pass = reconciler
            .reconcile(Family::V4, &ports)
            .expect("second pass");
        assert_eq!(pass.dumps, [DumpFilter::UdpDnat]);
        // The entry to the old endpoint 10.244.2.7 is stale now; the new one stays.
        assert_eq!(pass.outcome.deleted, 1, "{pass:?}");
        let left = dump(&mut s, Family::V4, DumpFilter::UdpTo(sa("10.96.0.10:53")));
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].original, pinned_to_old.original);
    });
}

/// A UDP Service port `ip:53` served by `serving`, without a node port.
fn udp_port(name: &str, ip: &str, serving: &str) -> ServicePort {
    ServicePort {
        node_port: None,
        ..ServicePort::new(
            PortKey {
                service: ServiceKey::new("default", name),
                port_name: "dns".into(),
                protocol: Protocol::Udp,
                family: Family::V4,
            },
            ip.parse().expect("ip"),
            53,
        )
    }
    .with_serving(serving)
}

trait WithServing {
    fn with_serving(self, serving: &str) -> ServicePort;
}

impl WithServing for ServicePort {
    fn with_serving(mut self, serving: &str) -> ServicePort {
        self.has_any_endpoints = true;
        self.cluster_endpoints = vec![ready(serving)];
        self.serving_endpoints = vec![sa(serving)];
        self
    }
}

#[test]
fn a_first_pass_dumps_each_new_frontend_and_deletes_exactly_the_stale() {
    require_root!();
    in_fresh_netns(
        "a_first_pass_dumps_each_new_frontend_and_deletes_exactly_the_stale",
        || {
            std::process::Command::new("ip")
                .args(["addr", "add", "192.168.100.1/32", "dev", "lo"])
                .status()
                .expect("ip addr add");
            let mut s = ConntrackSocket::open().expect("socket");
            let mut ports = vec![dns_port("10.244.2.7:53")];
            let mut keep = vec![
                dnat("10.244.1.5:4000", "10.96.0.10:53", "10.244.2.7:53"),
                // Unrelated traffic on the Services' port: never read into a narrow dump's
                // result as stale.
                dnat("10.244.1.5:4001", "198.18.0.1:53", "198.18.0.1:53"),
            ];
            let mut stale = vec![
                dnat("10.244.1.5:5000", "10.96.0.10:53", "10.96.0.10:53"),
                dnat(
                    "192.168.100.10:5003",
                    "192.168.100.1:30053",
                    "192.168.100.1:30053",
                ),
            ];
            for i in 0..5u8 {
                let vip = format!("10.96.1.{i}:53");
                let serving = format!("10.244.3.{i}:53");
                ports.push(udp_port(
                    &format!("udp{i}"),
                    &format!("10.96.1.{i}"),
                    &serving,
                ));
                keep.push(dnat(
                    &format!("10.244.1.6:{}", 4000 + u16::from(i)),
                    &vip,
                    &serving,
                ));
                // Never DNATed (sent before the Service was programmed), and DNATed to an
                // endpoint that is gone.
                stale.push(dnat(
                    &format!("10.244.1.7:{}", 5000 + u16::from(i)),
                    &vip,
                    &vip,
                ));
                stale.push(dnat(
                    &format!("10.244.1.8:{}", 5000 + u16::from(i)),
                    &vip,
                    &format!("10.244.4.{i}:53"),
                ));
            }
            s.create(&keep, Duration::from_secs(600)).expect("create");
            s.create(&stale, Duration::from_secs(600)).expect("create");
            let mut reconciler = Reconciler::open()
                .expect("reconciler")
                .with_max_narrow_dumps(16);
            let pass = reconciler
                .reconcile(Family::V4, &ports)
                .expect("first pass");
            // One narrow dump per frontend (6 Service IPs, 1 node port), nothing else.
            assert_eq!(pass.dumps.len(), 7, "{pass:?}");
            assert!(
                pass.dumps
                    .iter()
                    .all(|d| matches!(d, DumpFilter::UdpTo(_) | DumpFilter::UdpToPort(_))),
                "{pass:?}"
            );
            assert_eq!(pass.stale, stale.len(), "{pass:?}");
            assert_eq!(pass.outcome.deleted, stale.len(), "{pass:?}");
            let mut left: Vec<Tuple> = dump(&mut s, Family::V4, DumpFilter::Udp)
                .iter()
                .map(|f| f.original)
                .collect();
            left.sort_by_key(|t| (t.src, t.dst));
            let mut expected: Vec<Tuple> = keep.iter().map(|f| f.original).collect();
            expected.sort_by_key(|t| (t.src, t.dst));
            assert_eq!(left, expected);
        },
    );
}
