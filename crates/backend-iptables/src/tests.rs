//! Backend tests against a recording executor: golden restore input, minimal partial syncs,
//! convergence of partial syncs to what a full sync writes, failure recovery, adoption of a
//! previous run's rules, flush detection and cleanup.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use kpng_backend::{Backend, SyncRequest};
use kpng_model::{Diff, Event, Kind, Model, ModelConfig};

use super::*;
use crate::exec::Recorder;

fn repo_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(name)
}

fn model_from(yaml: &str) -> Model {
    let loaded = kpng_source_file::parse_manifests(yaml).expect("manifest parses");
    let mut model = Model::new(ModelConfig {
        node_name: "node1".into(),
        ..ModelConfig::default()
    });
    let out = model.apply(Event::Replace {
        kinds: vec![Kind::Service, Kind::EndpointSlice, Kind::Node],
        objects: loaded.objects,
    });
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    model
}

/// Replaces the model's state with `yaml`; returns the diff.
fn apply(model: &mut Model, yaml: &str) -> Diff {
    let loaded = kpng_source_file::parse_manifests(yaml).expect("manifest parses");
    let out = model.apply(Event::Replace {
        kinds: vec![Kind::Service, Kind::EndpointSlice, Kind::Node],
        objects: loaded.objects,
    });
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    out.diff
}

fn config() -> IptablesConfig {
    IptablesConfig {
        detect_local: DetectLocal::ClusterCidr(vec![
            "10.244.0.0/16".parse().expect("cidr"),
            "fd00:244::/32".parse().expect("cidr"),
        ]),
        ..IptablesConfig::default()
    }
}

fn backend_with(config: IptablesConfig) -> (IptablesBackend, Recorder) {
    let recorder = Recorder::default();
    let backend = IptablesBackend::new(config, Box::new(recorder.clone()))
        .with_local_addresses(local_addresses());
    (backend, recorder)
}

/// The node's addresses, as the backend would read them.
fn local_addresses() -> Box<dyn Fn() -> Vec<std::net::IpAddr> + Send> {
    Box::new(|| {
        ["127.0.0.1", "192.168.100.1", "10.244.1.1", "fd00:100::1"]
            .iter()
            .filter_map(|s| s.parse().ok())
            .collect()
    })
}

fn backend() -> (IptablesBackend, Recorder) {
    backend_with(config())
}

/// Makes the recorder's kernel show every canary of `families` in place (nobody flushed the
/// tables), and those of the other families gone.
fn canary_present(r: &Recorder, families: &[Family]) {
    canaries_except(r, families, None);
}

/// As [`canary_present`], with `missing` (table, chain) gone.
fn canaries_except(r: &Recorder, families: &[Family], missing: Option<(Table, &str)>) {
    let mut chains = Vec::new();
    for f in families {
        for c in crate::watch::every_canary() {
            let gone = missing == Some((c.table, c.chain));
            let listing = match (c.jumps_to, c.has_rules) {
                // A built-in chain stays; it loses our jump.
                (Some(_), _) if gone => format!("-P {} ACCEPT\n", c.chain),
                _ if gone => continue,
                (Some(to), _) => format!("-P {} ACCEPT\n-A {} -j {to}\n", c.chain, c.chain),
                (None, true) => format!("-N {}\n-A {} -j RETURN\n", c.chain, c.chain),
                (None, false) => format!("-N {}\n", c.chain),
            };
            chains.push((*f, c.table, c.chain.to_string(), listing));
        }
    }
    r.0.lock().expect("lock").chains = chains;
}

fn sync(b: &mut IptablesBackend, model: &Model, diff: &Diff, full: bool) -> usize {
    b.sync(&SyncRequest {
        diff,
        snapshot: model.snapshot(),
        full,
    })
    .expect("sync")
    .operations
}

fn full_sync(b: &mut IptablesBackend, model: &Model) -> usize {
    let diff = Diff::full(model.snapshot());
    sync(b, model, &diff, true)
}

fn inputs(r: &Recorder) -> Vec<String> {
    r.restores().into_iter().map(|(_, text)| text).collect()
}

/// Compares `text` with the committed snapshot `tests/golden/{name}.snap` (insta: a change
/// fails the test and, outside CI, writes `{name}.snap.new` beside it to compare; to accept a
/// deliberate change, `INSTA_UPDATE=always cargo test -p kpng-backend-iptables --lib` and review `git diff`;
/// `cargo insta review` does the same when cargo-insta is installed).
fn check_golden(name: &str, text: &str) {
    insta::with_settings!({
        snapshot_path => "../tests/golden",
        prepend_module_to_snapshot => false,
        omit_expression => true,
    }, {
        insta::assert_snapshot!(name, text);
    });
}

#[test]
fn example_cluster_full_restores_are_golden() {
    let yaml = std::fs::read_to_string(repo_file("../../examples/cluster.yaml")).expect("example");
    let model = model_from(&yaml);
    let (mut b, r) = backend();
    full_sync(&mut b, &model);
    let s = r.restores();
    assert_eq!(s.len(), 2, "one restore per family");
    assert_eq!((s[0].0, s[1].0), (Family::V4, Family::V6));
    check_golden("example-full.ipv4.iptables", &s[0].1);
    check_golden("example-full.ipv6.iptables", &s[1].1);
    assert_eq!(
        r.0.lock().expect("lock").route_localnet,
        1,
        "IPv4 localhost node ports need route_localnet"
    );
}

#[test]
fn other_flags_full_restore_is_golden() {
    let yaml = std::fs::read_to_string(repo_file("../../examples/cluster.yaml")).expect("example");
    let model = model_from(&yaml);
    let (mut b, r) = backend_with(IptablesConfig {
        masquerade_all: true,
        masquerade_bit: 5,
        detect_local: DetectLocal::BridgeInterface("cbr0".into()),
        nodeport_addresses: NodePortAddresses::Cidrs(vec!["10.244.0.0/16".parse().expect("cidr")]),
        localhost_node_ports: false,
        tcp_be_liberal: true,
        families: vec![Family::V4],
    });
    full_sync(&mut b, &model);
    let s = inputs(&r);
    assert_eq!(s.len(), 1);
    check_golden("flags-full.ipv4.iptables", &s[0]);
    assert_eq!(r.0.lock().expect("lock").route_localnet, 0);
}

/// In an unprivileged Pod `/proc/sys` is read-only and `route_localnet` cannot be set. IPv4
/// failed every sync for it (kube-proxy exits); now the node ports are served without
/// 127.0.0.1: the rules are exactly those of `--iptables-localhost-nodeports=false`, and
/// later syncs neither retry nor fail.
#[test]
fn a_read_only_route_localnet_serves_node_ports_without_localhost() {
    let yaml = std::fs::read_to_string(repo_file("../../examples/cluster.yaml")).expect("example");
    let model = model_from(&yaml);
    let (mut without, want) = backend_with(IptablesConfig {
        localhost_node_ports: false,
        ..config()
    });
    full_sync(&mut without, &model);
    let (mut b, r) = backend();
    r.0.lock().expect("lock").route_localnet_read_only = true;
    full_sync(&mut b, &model);
    assert_eq!(inputs(&r), inputs(&want));
    full_sync(&mut b, &model);
    assert_eq!(inputs(&r).len(), 2 * inputs(&want).len());
}

/// The packet mark and the conntrack mark are shared with the CNI: the rules only OR and XOR
/// the masquerade bit into the packet mark, and never touch the conntrack mark (affinity is
/// `-m recent`).
#[test]
fn only_the_masquerade_bit_of_the_packet_mark_is_written() {
    let yaml = std::fs::read_to_string(repo_file("../../examples/cluster.yaml")).expect("example");
    let model = model_from(&yaml);
    for bit in [14u8, 5] {
        let (mut b, r) = backend_with(IptablesConfig {
            masquerade_bit: bit,
            ..IptablesConfig::default()
        });
        full_sync(&mut b, &model);
        let mark = format!("{:#x}", 1u32 << bit);
        let mut writes = 0;
        for text in inputs(&r) {
            assert!(
                !text.contains("CONNMARK") && !text.contains("connmark"),
                "{text}"
            );
            for line in text.lines().filter(|l| l.contains("-j MARK")) {
                let tail = line.split("-j MARK ").nth(1).unwrap_or_default();
                assert!(
                    tail == format!("--or-mark {mark}") || tail == format!("--xor-mark {mark}"),
                    "a packet-mark write beyond the masquerade bit: {line}"
                );
                writes += 1;
            }
        }
        assert!(writes >= 2, "the masquerade bit is set and cleared");
    }
}

const ONE_SERVICE: &str = "
kind: Node
metadata: {name: node1}
status: {addresses: [{type: InternalIP, address: 192.168.100.1}]}
---
kind: Service
metadata: {namespace: ns, name: web}
spec: {type: NodePort, clusterIP: 10.96.0.10, ports: [{name: http, port: 80, nodePort: 30080}]}
---
kind: EndpointSlice
metadata: {namespace: ns, name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.1.2], nodeName: node1}
- {addresses: [10.244.2.2], nodeName: node2}
";

#[test]
fn one_endpoint_change_rewrites_only_the_service_chain_and_the_endpoint_chains() {
    let mut model = model_from(ONE_SERVICE);
    let (mut b, r) = backend();
    full_sync(&mut b, &model);
    let diff = apply(&mut model, &ONE_SERVICE.replace("10.244.2.2", "10.244.2.9"));
    assert_eq!(diff.changes.len(), 1);
    let operations = sync(&mut b, &model, &diff, false);
    let s = r.restores();
    assert_eq!(s.len(), 3, "two full restores, then one partial for IPv4");
    assert_eq!(s[2].0, Family::V4);
    let svc = names::PortChains::new("ns/web:http", "tcp").cluster;
    let ep = |addr: &str| {
        let sa: std::net::SocketAddr = addr.parse().expect("addr");
        names::endpoint_chain(
            "ns/web:http",
            "tcp",
            &kpng_model::Endpoint {
                ip: sa.ip(),
                port: sa.port(),
                is_local: false,
                ready: true,
                serving: true,
                terminating: false,
            },
        )
    };
    let (kept, gone, new) = (
        ep("10.244.1.2:8080"),
        ep("10.244.2.2:8080"),
        ep("10.244.2.9:8080"),
    );
    assert_eq!(
        s[2].1,
        format!(
            "*nat\n\
             :{svc} - [0:0]\n\
             :{new} - [0:0]\n\
             :{gone} - [0:0]\n\
             -A {svc} -m comment --comment \"ns/web:http cluster IP\" -m tcp -p tcp -d 10.96.0.10 --dport 80 ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ\n\
             -A {svc} -m comment --comment \"ns/web:http -> 10.244.1.2:8080\" -m statistic --mode random --probability 0.5000000000 -j {kept}\n\
             -A {svc} -m comment --comment \"ns/web:http -> 10.244.2.9:8080\" -j {new}\n\
             -A {new} -m comment --comment ns/web:http -s 10.244.2.9 -j KUBE-MARK-MASQ\n\
             -A {new} -m comment --comment ns/web:http -m tcp -p tcp -j DNAT --to-destination 10.244.2.9:8080\n\
             -X {gone}\n\
             COMMIT\n"
        )
    );
    assert_eq!(operations, 9);
}

#[test]
fn removing_a_service_deletes_its_rules_and_chains() {
    let mut model = model_from(ONE_SERVICE);
    let (mut b, r) = backend();
    full_sync(&mut b, &model);
    let only_node = ONE_SERVICE.split("---").next().expect("node").to_owned();
    let diff = apply(&mut model, &only_node);
    sync(&mut b, &model, &diff, false);
    let last = inputs(&r).pop().expect("restore");
    let svc = names::PortChains::new("ns/web:http", "tcp");
    for line in [
        format!(
            "-D KUBE-SERVICES -m comment --comment \"ns/web:http cluster IP\" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j {}",
            svc.cluster
        ),
        format!(
            "-D KUBE-NODEPORTS -m comment --comment ns/web:http -m tcp -p tcp --dport 30080 -j {}",
            svc.external
        ),
        format!("-X {}", svc.cluster),
        format!("-X {}", svc.external),
    ] {
        assert!(
            last.lines().any(|l| l == line),
            "missing {line:?} in\n{last}"
        );
    }
    assert_eq!(last.matches("-X KUBE-SEP-").count(), 2, "{last}");
    assert!(!last.contains("-A "), "nothing is added: {last}");
}

#[test]
fn an_unchanged_relist_sends_nothing() {
    let mut model = model_from(ONE_SERVICE);
    let (mut b, r) = backend();
    full_sync(&mut b, &model);
    canary_present(&r, &Family::ALL);
    let diff = apply(&mut model, ONE_SERVICE);
    assert!(diff.is_empty());
    assert_eq!(sync(&mut b, &model, &diff, false), 0);
    assert_eq!(inputs(&r).len(), 2);
}

#[test]
fn a_failed_partial_restore_is_counted_and_the_next_sync_is_full() {
    let mut model = model_from(ONE_SERVICE);
    let (mut b, r) = backend();
    full_sync(&mut b, &model);
    let diff = apply(&mut model, &ONE_SERVICE.replace("10.244.2.2", "10.244.2.9"));
    canary_present(&r, &Family::ALL);
    r.0.lock().expect("lock").fail_restores = 1;
    let err = b
        .sync(&SyncRequest {
            diff: &diff,
            snapshot: model.snapshot(),
            full: false,
        })
        .expect_err("fails");
    assert!(err.to_string().contains("line 2 failed"), "{err}");
    let v4 = FamilyLabel::from(Family::V4);
    assert_eq!(b.metrics.restore_failures.get_or_create(&v4).get(), 1);
    assert_eq!(
        b.metrics.partial_restore_failures.get_or_create(&v4).get(),
        1
    );
    // Even a partial request with an empty diff now rewrites every IPv4 chain.
    sync(&mut b, &model, &Diff::default(), false);
    let last = inputs(&r).pop().expect("restore");
    assert!(last.starts_with("*mangle\n:KUBE-PROXY-CANARY"), "{last}");
    assert!(last.contains("--to-destination 10.244.2.9:8080"), "{last}");
}

#[test]
fn a_full_sync_adopts_existing_jumps_and_removes_stale_chains() {
    let model = model_from(ONE_SERVICE);
    let (mut b, r) = backend();
    r.0.lock().expect("lock").saved = vec![(
        Family::V4,
        Table::Nat,
        "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-STALESTALESTALE - [0:0]\n\
         :KUBE-SEP-STALESTALESTALE - [0:0]\n:DOCKER - [0:0]\n\
         -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\nCOMMIT\n"
            .into(),
    )];
    full_sync(&mut b, &model);
    let v4 = inputs(&r).remove(0);
    assert!(
        !v4.contains("-I PREROUTING 1"),
        "an existing jump is kept: {v4}"
    );
    assert!(
        v4.contains(
            "-I OUTPUT 1 -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n"
        ),
        "{v4}"
    );
    assert!(v4.contains("-X KUBE-SVC-STALESTALESTALE\n"), "{v4}");
    assert!(v4.contains("-X KUBE-SEP-STALESTALESTALE\n"), "{v4}");
    assert!(!v4.contains("DOCKER"), "other chains are not ours: {v4}");
}

/// A full sync reports a family's rules as kept (so that a restart's UDP conntrack cleanup
/// trusts what the last run checked) only when its nat table already sent Service traffic
/// through `KUBE-SERVICES`: the restore then replaces those rules without a gap.
#[test]
fn a_full_sync_keeps_the_rules_only_when_they_were_in_place() {
    let portals = "-m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES";
    let service = "-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m udp --dport 53 -j KUBE-SVC-X";
    let nat = |lines: &[String]| {
        format!(
            "*nat\n:KUBE-SERVICES - [0:0]\n{}\nCOMMIT\n",
            lines.join("\n")
        )
    };
    let both_jumps = [
        format!("-A PREROUTING {portals}"),
        format!("-A OUTPUT {portals}"),
        service.to_owned(),
    ];
    let cases: [(&str, Option<String>, &[Family]); 5] = [
        ("a node kpng never programmed", None, &[]),
        (
            "an earlier run's rules",
            Some(nat(&both_jumps)),
            &[Family::V4],
        ),
        (
            "the OUTPUT jump gone",
            Some(nat(&both_jumps[..1]
                .iter()
                .chain(&both_jumps[2..])
                .cloned()
                .collect::<Vec<_>>())),
            &[],
        ),
        ("KUBE-SERVICES flushed", Some(nat(&both_jumps[..2])), &[]),
        (
            "another comment on the jumps",
            Some(nat(&both_jumps
                .clone()
                .map(|l| l.replace("service portals", "other")))),
            &[],
        ),
    ];
    let model = model_from(ONE_SERVICE);
    for (case, saved, kept) in cases {
        let (mut b, r) = backend();
        canary_present(&r, &Family::ALL);
        r.0.lock()
            .expect("lock")
            .saved
            .extend(saved.map(|text| (Family::V4, Table::Nat, text)));
        let stats = b
            .sync(&SyncRequest {
                diff: &Diff::full(model.snapshot()),
                snapshot: model.snapshot(),
                full: true,
            })
            .expect("sync");
        assert_eq!(stats.kept_rules, kept, "{case}");
        // What was in place is told per Service IP: kube-proxy writes the same chains.
        let in_place = if kept.is_empty() {
            Vec::new()
        } else {
            vec!["10.96.0.10:53".parse().expect("addr")]
        };
        let found = stats.kept_udp_frontends.expect("told");
        assert_eq!(found.service_ips, in_place, "{case}");
        let partial = b
            .sync(&SyncRequest {
                diff: &Diff::default(),
                snapshot: model.snapshot(),
                full: false,
            })
            .expect("sync");
        assert!(
            partial.kept_rules.is_empty(),
            "{case}: a partial sync says nothing"
        );
    }
}

#[test]
fn periodic_syncs_rewrite_everything_after_a_flush() {
    let model = model_from(ONE_SERVICE);
    let (mut b, r) = backend();
    full_sync(&mut b, &model);
    canary_present(&r, &Family::ALL);
    let periodic = |b: &mut IptablesBackend| {
        b.sync(&SyncRequest {
            diff: &Diff::default(),
            snapshot: model.snapshot(),
            full: false,
        })
        .expect("sync")
    };
    let stats = periodic(&mut b);
    assert_eq!((stats.operations, stats.repaired), (0, None));
    assert_eq!(inputs(&r).len(), 2, "canary present: nothing to do");
    canary_present(&r, &[Family::V6]);
    let stats = periodic(&mut b);
    assert!(stats.operations > 0);
    assert_eq!(
        stats.repaired.as_deref(),
        Some("IPv4 nat: chain KUBE-POSTROUTING was deleted"),
        "the runner counts the repair"
    );
    let s = r.restores();
    assert_eq!(s.len(), 3, "only the flushed family is rewritten");
    assert_eq!(s[2].0, Family::V4);
    assert!(s[2].1.contains(":KUBE-PROXY-CANARY - [0:0]"));
}

/// Upstream's canaries are in mangle, nat and filter: a restore of nat alone (`iptables-restore
/// < rules-nat.v4`, which leaves mangle's canary alone) is found by the periodic sync too,
/// whichever of nat's or filter's canaries it took.
#[test]
fn periodic_syncs_check_the_canaries_of_nat_and_filter_too() {
    let model = model_from(ONE_SERVICE);
    let (mut b, r) = backend_with(IptablesConfig {
        families: vec![Family::V4],
        ..config()
    });
    full_sync(&mut b, &model);
    let cases = [
        (
            Table::Nat,
            "PREROUTING",
            "IPv4 nat: chain PREROUTING lost its jump to KUBE-SERVICES",
        ),
        (
            Table::Nat,
            "OUTPUT",
            "IPv4 nat: chain OUTPUT lost its jump to KUBE-SERVICES",
        ),
        (
            Table::Filter,
            "KUBE-FORWARD",
            "IPv4 filter: chain KUBE-FORWARD was deleted",
        ),
        (
            Table::Mangle,
            "KUBE-PROXY-CANARY",
            "IPv4 mangle: chain KUBE-PROXY-CANARY was deleted",
        ),
    ];
    for (table, chain, want) in cases {
        canaries_except(&r, &[Family::V4], Some((table, chain)));
        let before = r.restores().len();
        let stats = b
            .sync(&SyncRequest {
                diff: &Diff::default(),
                snapshot: model.snapshot(),
                full: false,
            })
            .expect("sync");
        assert_eq!(stats.repaired.as_deref(), Some(want), "{chain}");
        assert!(r.restores().len() > before, "{chain}: rewritten");
    }
    // Everything in place: nothing read but the canaries, nothing written.
    canary_present(&r, &[Family::V4]);
    let before = r.restores().len();
    let stats = b
        .sync(&SyncRequest {
            diff: &Diff::default(),
            snapshot: model.snapshot(),
            full: false,
        })
        .expect("sync");
    assert_eq!((stats.operations, stats.repaired), (0, None));
    assert_eq!(r.restores().len(), before);
}

#[test]
fn cleanup_removes_our_jumps_and_chains_only() {
    let (mut b, r) = backend_with(IptablesConfig {
        families: vec![Family::V4],
        ..config()
    });
    r.0.lock().expect("lock").saved = vec![
        (
            Family::V4,
            Table::Nat,
            "*nat\n:PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n\
             :KUBE-POSTROUTING - [0:0]\n:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]\n:CNI-NAT - [0:0]\n\
             -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
             -A POSTROUTING -j CNI-NAT\nCOMMIT\n"
                .into(),
        ),
        (
            Family::V4,
            Table::Filter,
            "*filter\n:INPUT ACCEPT [0:0]\n:KUBE-FIREWALL - [0:0]\n:KUBE-FORWARD - [0:0]\n\
             -A INPUT -j KUBE-FIREWALL\nCOMMIT\n"
                .into(),
        ),
    ];
    b.cleanup().expect("cleanup");
    assert_eq!(
        inputs(&r),
        vec![
            "*filter\n:KUBE-FORWARD - [0:0]\n-X KUBE-FORWARD\nCOMMIT\n\
             *nat\n:KUBE-POSTROUTING - [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]\n\
             -D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -D POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
             -X KUBE-POSTROUTING\n-X KUBE-SERVICES\n-X KUBE-SVC-XPGD46QRK7WJZT7O\nCOMMIT\n"
        ]
    );
}

#[test]
fn metrics_carry_kube_proxy_names() {
    let model = model_from(ONE_SERVICE);
    let (mut b, r) = backend();
    r.0.lock().expect("lock").fail_restores = 1;
    let diff = Diff::full(model.snapshot());
    assert!(
        b.sync(&SyncRequest {
            diff: &diff,
            snapshot: model.snapshot(),
            full: true,
        })
        .is_err()
    );
    full_sync(&mut b, &model);
    let mut registry = Registry::default();
    b.register_metrics(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    // nat IPv4: 4 fixed + 1 tail, then the ClusterIP and node-port jumps, SVC (masquerade +
    // 2 endpoints), EXT (masquerade + policy), two SEPs (2 each).
    for line in [
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family=\"IPv4\"} 1",
        "kubeproxy_sync_proxy_rules_iptables_total{table=\"nat\",ip_family=\"IPv4\"} 16",
        "kubeproxy_sync_proxy_rules_iptables_last{table=\"nat\",ip_family=\"IPv4\"} 16",
        "kubeproxy_sync_proxy_rules_iptables_total{table=\"filter\",ip_family=\"IPv4\"} 4",
    ] {
        assert!(text.contains(line), "{line}:\n{text}");
    }
    // A failed full restore is not a partial failure (the counter is there from the start, at
    // 0, so that the first failure shows in `increase()`).
    assert!(
        text.contains(
            "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total{ip_family=\"IPv4\"} 0"
        ),
        "{text}"
    );
}

// ---------------------------------------------------------------------------------------
// Partial syncs converge: replaying every restore input on a simulated kernel gives the same
// ruleset as one full sync of the final state.
// ---------------------------------------------------------------------------------------

/// A kernel table: chains → rules (order-insensitive for the comparison).
type SimTable = BTreeMap<String, Vec<String>>;

/// Applies restore input to simulated tables, failing on what iptables-restore would refuse.
fn replay(tables: &mut BTreeMap<String, SimTable>, input: &str) {
    let mut table = String::new();
    for line in input.lines() {
        let t = tables.entry(table.clone()).or_default();
        if let Some(name) = line.strip_prefix('*') {
            table = name.to_owned();
        } else if line == "COMMIT" {
        } else if let Some(decl) = line.strip_prefix(':') {
            let chain = decl.split(' ').next().expect("chain");
            t.insert(chain.to_owned(), Vec::new());
        } else if let Some(rest) = line.strip_prefix("-A ") {
            let (chain, spec) = rest.split_once(' ').expect("rule");
            assert_target_exists(t, spec, line);
            t.entry(chain.to_owned()).or_default().push(spec.to_owned());
        } else if let Some(rest) = line.strip_prefix("-I ") {
            let (chain, spec) = rest.split_once(" 1 ").expect("insert");
            assert_target_exists(t, spec, line);
            t.entry(chain.to_owned())
                .or_default()
                .insert(0, spec.to_owned());
        } else if let Some(rest) = line.strip_prefix("-D ") {
            let (chain, spec) = rest.split_once(' ').expect("delete");
            let rules = t.get_mut(chain).expect("-D in an existing chain");
            let i = rules
                .iter()
                .position(|r| r == spec)
                .unwrap_or_else(|| panic!("-D of a missing rule: {line}"));
            rules.remove(i);
        } else if let Some(chain) = line.strip_prefix("-X ") {
            let rules = t.remove(chain).expect("-X of a missing chain");
            assert!(rules.is_empty(), "-X of a non-empty chain {chain}");
        } else {
            panic!("unexpected line {line}");
        }
    }
}

/// iptables refuses a jump to a chain that does not exist.
fn assert_target_exists(table: &SimTable, spec: &str, line: &str) {
    if let Some(target) = spec.split(" -j ").nth(1).and_then(|t| t.split(' ').next())
        && target.starts_with("KUBE-")
    {
        assert!(
            table.contains_key(target),
            "jump to a missing chain: {line}"
        );
    }
}

fn normalized(
    tables: &BTreeMap<String, SimTable>,
) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    tables
        .iter()
        .filter(|(name, _)| !name.is_empty())
        .map(|(name, t)| {
            let t = t
                .iter()
                .map(|(c, rules)| (c.clone(), rules.iter().cloned().collect()))
                .collect();
            (name.clone(), t)
        })
        .collect()
}

/// `n` Services of assorted shapes, with endpoint sets chosen by `seed`.
fn cluster(n: usize, seed: usize) -> String {
    let mut y = String::from(
        "kind: Node\nmetadata: {name: node1}\nstatus: {addresses: [{type: InternalIP, address: 192.168.100.1}]}\n",
    );
    for i in 0..n {
        let shape = (i + seed) % 5;
        let spec = match shape {
            0 => "type: ClusterIP".to_owned(),
            1 => format!("type: NodePort, externalIPs: [198.51.100.{i}]"),
            2 => "type: LoadBalancer, externalTrafficPolicy: Local, \
                  loadBalancerSourceRanges: [192.168.0.0/16]"
                .to_owned(),
            3 => "type: ClusterIP, sessionAffinity: ClientIP".to_owned(),
            _ => "type: ClusterIP, internalTrafficPolicy: Local".to_owned(),
        };
        let status = if shape == 2 {
            format!("\nstatus: {{loadBalancer: {{ingress: [{{ip: 203.0.113.{i}}}]}}}}")
        } else {
            String::new()
        };
        y.push_str(&format!(
            "---\nkind: Service\nmetadata: {{namespace: ns, name: s{i}}}\n\
             spec: {{{spec}, clusterIP: 10.96.0.{}, ports: [{{name: p, port: 80, protocol: TCP}}, {{name: u, port: 53, protocol: UDP}}]}}{status}\n",
            i + 1
        ));
        y.push_str(&format!(
            "---\nkind: EndpointSlice\nmetadata: {{namespace: ns, name: s{i}-1, labels: {{kubernetes.io/service-name: s{i}}}}}\n\
             addressType: IPv4\nports: [{{name: p, port: 8080, protocol: TCP}}, {{name: u, port: 5353, protocol: UDP}}]\nendpoints:"
        ));
        let count = (i * 7 + seed * 3) % 4;
        if count == 0 {
            y.push_str(" []");
        }
        y.push('\n');
        for e in 0..count {
            let node = if (e + seed).is_multiple_of(2) {
                "node1"
            } else {
                "node2"
            };
            y.push_str(&format!(
                "- {{addresses: [10.244.{e}.{}], nodeName: {node}}}\n",
                (i + seed) % 200 + 2
            ));
        }
    }
    y
}

#[test]
fn partial_syncs_converge_to_a_full_sync() {
    // Unbatched (legacy), and in small batches (as iptables-nft does with 2000 chains).
    for limit in [None, Some(3)] {
        let mut model = model_from(&cluster(12, 0));
        let (mut b, r) = backend_with(IptablesConfig {
            families: vec![Family::V4],
            ..config()
        });
        r.0.lock().expect("lock").chains_per_restore = limit;
        full_sync(&mut b, &model);
        for (n, seed) in [(12, 1), (15, 2), (9, 3), (12, 4), (0, 5), (6, 6), (20, 7)] {
            let diff = apply(&mut model, &cluster(n, seed));
            sync(&mut b, &model, &diff, false);
        }
        let mut kernel = BTreeMap::new();
        for input in inputs(&r) {
            replay(&mut kernel, &input);
        }
        let (mut fresh, fr) = backend_with(IptablesConfig {
            families: vec![Family::V4],
            ..config()
        });
        full_sync(&mut fresh, &model);
        let mut want = BTreeMap::new();
        replay(&mut want, &inputs(&fr)[0]);
        assert_eq!(normalized(&kernel), normalized(&want), "limit {limit:?}");
    }
}

#[test]
fn many_new_chains_are_created_in_batches_of_whole_ports() {
    let model = model_from(&cluster(12, 0));
    let (mut b, r) = backend_with(IptablesConfig {
        families: vec![Family::V4],
        ..config()
    });
    r.0.lock().expect("lock").chains_per_restore = Some(4);
    full_sync(&mut b, &model);
    let s = inputs(&r);
    assert!(s.len() > 3, "batched: {}", s.len());
    assert_eq!(
        s[0], "*nat\n:KUBE-MARK-MASQ - [0:0]\n-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\nCOMMIT\n",
        "KUBE-MARK-MASQ exists before the chains that jump to it"
    );
    let last = s.last().expect("final");
    assert!(last.contains(":KUBE-SERVICES - [0:0]"), "{last}");
    assert!(
        !last.contains(":KUBE-SEP-"),
        "port chains come before: {last}"
    );
    for batch in &s[1..s.len() - 1] {
        let declared: Vec<&str> = batch.lines().filter_map(|l| l.strip_prefix(':')).collect();
        // A batch only exceeds the limit when one port alone has more chains.
        assert!(!declared.is_empty(), "{batch}");
        for line in batch.lines().filter(|l| l.starts_with("-A ")) {
            let target = line.split(" -j ").nth(1).and_then(|t| t.split(' ').next());
            if let Some(t) = target.filter(|t| names::is_service_chain(t)) {
                assert!(
                    declared.iter().any(|d| d.starts_with(&format!("{t} "))),
                    "{t} jumped to before it exists:\n{batch}"
                );
            }
        }
    }
}

/// The backend contract at the fake level (the kit's conformance scenarios): the recorder is
/// the kernel; what the backend committed is its rules per Service port. Where a frontend
/// dispatches is read from the restores that succeeded, replayed into a fake kernel
/// ([`kernel`]).
mod kernel;
mod conformance_harness {
    use kpng_backend_kit::conformance::{Client, Dispatch, Frontend};

    use super::*;

    pub struct IptablesHarness {
        backend: IptablesBackend,
        kernel: kernel::FakeKernel,
    }

    impl kpng_backend_kit::conformance::Harness for IptablesHarness {
        fn backend(&mut self) -> &mut dyn Backend {
            &mut self.backend
        }

        fn objects(&self) -> usize {
            self.backend
                .states
                .iter()
                .map(|s| s.port_rules.iter().sum::<usize>())
                .sum()
        }

        fn fail_next(&mut self) {
            self.kernel.recorder.0.lock().expect("lock").fail_restores = 1;
        }

        fn dispatch(&self, to: Frontend, from: Client) -> Dispatch {
            self.kernel
                .kernel
                .lock()
                .expect("kernel")
                .dispatch(to, from)
        }

        fn connect(&mut self, to: Frontend, from: Client) -> Dispatch {
            self.kernel.kernel.lock().expect("kernel").connect(to, from)
        }
    }

    pub fn make() -> IptablesHarness {
        let kernel = kernel::FakeKernel::default();
        // Pods are recognised by the scenarios' cluster CIDRs (`Client::Pod`).
        let config = IptablesConfig {
            detect_local: DetectLocal::ClusterCidr(vec![
                "10.244.0.0/16".parse().expect("cidr"),
                "fd00:10:244::/48".parse().expect("cidr"),
            ]),
            ..config()
        };
        let backend = IptablesBackend::new(config, Box::new(kernel.clone()))
            .with_local_addresses(local_addresses());
        canary_present(&kernel.recorder, &Family::ALL);
        IptablesHarness { backend, kernel }
    }
}

kpng_backend_kit::conformance_tests!(conformance_harness::make);

/// A name that reaches the backend unchecked (the conversion refuses it: this is defence in
/// depth) never writes a rule of its own nor breaks the restore: a newline in a port name
/// once put a DNAT of the tenant's choice at the top of `KUBE-SERVICES`, and a `"` made every
/// iptables-restore fail.
#[test]
fn hostile_names_stay_inside_their_comments() {
    let model = model_from(
        "apiVersion: v1\nkind: Service\nmetadata: {namespace: tenant-a, name: web}\n\
         spec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 81, protocol: TCP, targetPort: 8080}]}\n\
         ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {namespace: tenant-a, name: web-1, labels: {kubernetes.io/service-name: web}}\n\
         addressType: IPv4\nports: [{name: http, port: 8080, protocol: TCP}]\n\
         endpoints: [{addresses: [10.244.1.2], conditions: {ready: true}}]\n",
    );
    let port = model
        .snapshot()
        .ports
        .values()
        .next()
        .expect("one port")
        .as_ref()
        .clone();
    let ctx = crate::rules::RenderContext {
        masquerade_all: false,
        local: None,
        node_ip: None,
    };
    for hostile in [
        "a\n-I KUBE-SERVICES 1 -d 10.96.0.1/32 -p tcp --dport 443 -j DNAT --to-destination 10.244.1.66:443\n#",
        "a\"b",
        "a\\\" -j ACCEPT \\\"",
        "a\r\u{1b}[2Jb\u{0}",
        &"x".repeat(300),
    ] {
        let mut p = port.clone();
        p.key.port_name = hostile.into();
        let rules = crate::rules::render(&p, &ctx);
        let specs = rules.shared.iter().map(|r| r.spec.as_str()).chain(
            rules
                .chains
                .iter()
                .flat_map(|c| c.rules.iter().map(String::as_str)),
        );
        for spec in specs {
            assert!(!spec.chars().any(char::is_control), "{hostile:?}: {spec:?}");
            assert!(!spec.contains('\\'), "{hostile:?}: {spec:?}");
            // The only quotes are the two around a comment with spaces.
            let quotes = spec.matches('"').count();
            assert!(quotes == 0 || quotes == 2, "{hostile:?}: {spec:?}");
            if let Some(start) = spec.find("--comment ") {
                let text = &spec[start + "--comment ".len()..];
                let text = match text.strip_prefix('"') {
                    Some(quoted) => &quoted[..quoted.find('"').expect("closing quote")],
                    None => text.split(' ').next().unwrap_or_default(),
                };
                assert!(
                    text.len() <= 255,
                    "{hostile:?}: comment of {} bytes",
                    text.len()
                );
            }
        }
    }
}
