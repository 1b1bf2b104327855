//! Backend tests against a recording executor: golden transactions, minimal diffs, failure
//! recovery and the constant-size principle.

use std::collections::BTreeMap;
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
        kinds: Kind::ALL.to_vec(),
        objects: loaded.objects,
    });
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    model
}

fn config() -> NftConfig {
    NftConfig {
        detect_local: DetectLocal::ClusterCidr(vec![
            "10.244.0.0/16".parse().expect("cidr"),
            "fd00:244::/32".parse().expect("cidr"),
        ]),
        service_cidrs: vec!["10.96.0.0/16".parse().expect("cidr")],
        ..NftConfig::default()
    }
}

fn backend() -> (NftBackend, Recorder) {
    let recorder = Recorder::default();
    (
        NftBackend::new(config(), Box::new(recorder.clone())),
        recorder,
    )
}

fn scripts(r: &Recorder) -> Vec<String> {
    r.scripts()
}

fn full_sync(b: &mut NftBackend, model: &Model) -> usize {
    try_full_sync(b, model).expect("sync").operations
}

/// A full sync of `model`, its outcome as the runner would get it.
fn try_full_sync(
    b: &mut NftBackend,
    model: &Model,
) -> Result<kpng_backend::SyncStats, kpng_backend::BackendError> {
    let diff = Diff::full(model.snapshot());
    b.sync(&SyncRequest {
        diff: &diff,
        snapshot: model.snapshot(),
        full: true,
    })
}

/// Compares `text` with the committed snapshot `tests/golden/{name}.snap` (insta: a change
/// fails the test and, outside CI, writes `{name}.snap.new` beside it to compare; to accept a
/// deliberate change, `INSTA_UPDATE=always cargo test -p kpng-backend-nft --lib` and review `git diff`;
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
fn example_cluster_full_transactions_are_golden() {
    let yaml = std::fs::read_to_string(repo_file("../../examples/cluster.yaml")).expect("example");
    let model = model_from(&yaml);
    let (mut b, r) = backend();
    full_sync(&mut b, &model);
    let s = scripts(&r);
    assert_eq!(s.len(), 2, "one transaction per family");
    check_golden("example-full.ip", &s[0]);
    check_golden("example-full.ip6", &s[1]);
}

/// LoadBalancers whose `loadBalancerSourceRanges` hold the node and the ingress IP (the
/// node's subnet, `/0`) or overlap, in both families.
const SOURCE_RANGES: &str = "
kind: Node
metadata: {name: node1}
status: {addresses: [{type: InternalIP, address: 192.168.100.1}, {type: InternalIP, address: 'fd00:100::1'}]}
---
kind: Service
metadata: {namespace: t, name: subnet}
spec:
  type: LoadBalancer
  clusterIPs: [10.96.9.1, 'fd00:96::9:1']
  clusterIP: 10.96.9.1
  loadBalancerSourceRanges: [192.168.100.0/24, 'fd00:100::/64']
  ports: [{name: a, port: 80, nodePort: 30901}]
status: {loadBalancer: {ingress: [{ip: 192.168.100.80}, {ip: 203.0.113.80}, {ip: 'fd00:100::80'}]}}
---
kind: Service
metadata: {namespace: t, name: world}
spec:
  type: LoadBalancer
  clusterIPs: [10.96.9.2, 'fd00:96::9:2']
  clusterIP: 10.96.9.2
  loadBalancerSourceRanges: [0.0.0.0/0, '::/0']
  ports: [{name: a, port: 80, nodePort: 30902}]
status: {loadBalancer: {ingress: [{ip: 198.51.100.2}, {ip: '2001:db8::2'}]}}
---
kind: Service
metadata: {namespace: t, name: overlap}
spec:
  type: LoadBalancer
  clusterIPs: [10.96.9.3, 'fd00:96::9:3']
  clusterIP: 10.96.9.3
  loadBalancerSourceRanges: [10.0.0.0/8, 10.1.0.0/16, 11.0.0.0/8, 'fd00:1::/48', 'fd00:1:0:1::/64']
  ports: [{name: a, port: 80, nodePort: 30903}]
status: {loadBalancer: {ingress: [{ip: 198.51.100.3}, {ip: '2001:db8::3'}]}}
";

/// The `add element` block of `set` in a transaction script.
fn element_block(script: &str, set: &str) -> String {
    let head = format!(" {set} {{");
    let mut out = String::new();
    let mut inside = false;
    for line in script.lines() {
        if line.starts_with("add element ") && line.ends_with(&head) {
            inside = true;
        }
        if inside {
            out.push_str(line);
            out.push('\n');
            if line == "}" {
                inside = false;
            }
        }
    }
    out
}

/// The load-balancer firewall's elements are disjoint whatever the ranges: a range that holds
/// the node and the ingress IP, `/0`, overlapping ranges (each once made every transaction
/// fail, `File exists`, the interval set refusing the ingress IP inside a range).
#[test]
fn source_ranges_holding_the_node_and_ingress_ips_are_golden() {
    let model = model_from(SOURCE_RANGES);
    let (mut b, r) = backend();
    full_sync(&mut b, &model);
    let s = scripts(&r);
    assert_eq!(s.len(), 2, "one transaction per family");
    for (script, family) in s.iter().zip(["ip", "ip6"]) {
        let text = format!(
            "{}{}",
            element_block(script, "firewall-ips"),
            element_block(script, "firewall-allow")
        );
        check_golden(&format!("source-ranges.{family}"), &text);
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
fn one_endpoint_change_is_a_minimal_transaction() {
    let mut model = model_from(ONE_SERVICE);
    let (mut b, r) = backend();
    full_sync(&mut b, &model);
    let changed = ONE_SERVICE.replace("10.244.2.2", "10.244.2.9");
    let loaded = kpng_source_file::parse_manifests(&changed).expect("parses");
    let out = model.apply(Event::Replace {
        kinds: vec![Kind::Service, Kind::EndpointSlice, Kind::Node],
        objects: loaded.objects,
    });
    assert_eq!(out.diff.changes.len(), 1);
    let stats = b
        .sync(&SyncRequest {
            diff: &out.diff,
            snapshot: model.snapshot(),
            full: false,
        })
        .expect("sync");
    let s = scripts(&r);
    assert_eq!(
        s.len(),
        3,
        "two full transactions, then one partial for IPv4 only"
    );
    assert_eq!(
        s[2],
        "delete element ip kpng cluster-endpoints-tcp {\n\t10.96.0.10 . 80 . 1,\n}\n\
         delete element ip kpng nodeport-cluster-endpoints-tcp {\n\t30080 . 1,\n}\n\
         add element ip kpng cluster-endpoints-tcp {\n\t10.96.0.10 . 80 . 1 : 10.244.2.9 . 8080,\n}\n\
         add element ip kpng nodeport-cluster-endpoints-tcp {\n\t30080 . 1 : 10.244.2.9 . 8080,\n}\n"
    );
    assert_eq!(stats.operations, 4);
}

#[test]
fn a_new_endpoint_count_adds_its_chain_once() {
    let mut model = model_from(ONE_SERVICE);
    let (mut b, r) = backend();
    full_sync(&mut b, &model);
    let three = ONE_SERVICE.replace("- {addresses: [10.244.2.2], nodeName: node2}", "- {addresses: [10.244.2.2], nodeName: node2}\n- {addresses: [10.244.2.3], nodeName: node2}");
    partial_sync_to(&mut b, &mut model, &three);
    let s = scripts(&r);
    // The chains of 2 endpoints, which no element refers to any more, go after the sync.
    assert_eq!(
        s.last().map(String::as_str),
        Some("delete chain ip kpng cluster-n2\ndelete chain ip kpng nodeport-cluster-n2\n")
    );
    let last = &s[s.len() - 2];
    assert!(
        last.starts_with(
            "add chain ip kpng cluster-n3\n\
             add rule ip kpng cluster-n3 meta l4proto tcp dnat ip to ip daddr . tcp dport . numgen random mod 3 map @cluster-endpoints-tcp\n\
             add rule ip kpng cluster-n3 meta l4proto udp dnat ip to ip daddr . udp dport . numgen random mod 3 map @cluster-endpoints-udp\n\
             add rule ip kpng cluster-n3 meta l4proto sctp dnat ip to ip daddr . sctp dport . numgen random mod 3 map @cluster-endpoints-sctp\n"
        ),
        "{last}"
    );
    assert!(
        last.contains("add chain ip kpng nodeport-cluster-n3\n"),
        "{last}"
    );
    assert!(
        last.contains("10.96.0.10 . tcp . 80 comment \"ns/web:http\" : goto cluster-n3"),
        "{last}"
    );
}

/// ONE_SERVICE with `web`'s endpoints `10.244.2.2`, `10.244.2.3`, … (`n` in all, with the
/// first) and Service `other` with `others` endpoints.
fn scaled(n: usize, others: usize) -> String {
    let mut text = ONE_SERVICE.replace("- {addresses: [10.244.2.2], nodeName: node2}\n", "");
    for i in 0..n.saturating_sub(1) {
        text.push_str(&format!(
            "- {{addresses: [10.244.2.{}], nodeName: node2}}\n",
            i + 2
        ));
    }
    if others > 0 {
        text.push_str(
            "---\nkind: Service\nmetadata: {namespace: ns, name: other}\n\
             spec: {clusterIP: 10.96.0.11, ports: [{name: http, port: 80}]}\n---\n\
             kind: EndpointSlice\n\
             metadata: {namespace: ns, name: other-1, labels: {kubernetes.io/service-name: other}}\n\
             addressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints:\n",
        );
        for i in 0..others {
            text.push_str(&format!(
                "- {{addresses: [10.244.3.{}], nodeName: node2}}\n",
                i + 2
            ));
        }
    }
    text
}

/// Applies `yaml` to `model` and syncs the change (partial).
fn partial_sync_to(b: &mut NftBackend, model: &mut Model, yaml: &str) {
    let loaded = kpng_source_file::parse_manifests(yaml).expect("parses");
    let out = model.apply(Event::Replace {
        kinds: vec![Kind::Service, Kind::EndpointSlice, Kind::Node],
        objects: loaded.objects,
    });
    b.sync(&SyncRequest {
        diff: &out.diff,
        snapshot: model.snapshot(),
        full: false,
    })
    .expect("sync");
}

/// A `*-n<k>` chain no element refers to any more is deleted right after the sync that
/// removed its last reference, in a transaction of its own; one another Service still uses
/// stays.
#[test]
fn a_chain_is_deleted_with_its_last_reference() {
    let mut model = model_from(&scaled(3, 3));
    let (mut b, r) = backend();
    full_sync(&mut b, &model);
    let dynamic = |b: &NftBackend| b.states[0].chains.clone();
    assert!(dynamic(&b).contains("cluster-n3"), "{:?}", dynamic(&b));
    // `other` still has 3 endpoints: cluster-n3 stays.
    partial_sync_to(&mut b, &mut model, &scaled(1, 3));
    let s = scripts(&r);
    assert!(
        !s.iter()
            .any(|t| t.contains("delete chain ip kpng cluster-n3")),
        "{s:?}"
    );
    assert_eq!(
        s.last().map(String::as_str),
        Some("delete chain ip kpng nodeport-cluster-n3\n"),
        "web was the only NodePort with 3 endpoints"
    );
    assert!(dynamic(&b).contains("cluster-n3"));
    // The last Service with 3 endpoints goes to 1: its chain goes in the same sync.
    partial_sync_to(&mut b, &mut model, &scaled(1, 1));
    let s = scripts(&r);
    assert_eq!(
        s.last().map(String::as_str),
        Some("delete chain ip kpng cluster-n3\n")
    );
    assert!(
        s[s.len() - 2].contains("goto cluster-n1"),
        "the elements moved first, in the transaction before: {s:?}"
    );
    assert!(!dynamic(&b).contains("cluster-n3"), "{:?}", dynamic(&b));
    // Needed again: created again.
    partial_sync_to(&mut b, &mut model, &scaled(1, 3));
    assert!(dynamic(&b).contains("cluster-n3"));
    assert!(
        scripts(&r)
            .last()
            .expect("script")
            .starts_with("add chain ip kpng cluster-n3\n")
    );
}

/// A delete nft refuses never fails the sync, and is not tried again at every sync.
#[test]
fn a_refused_chain_delete_does_not_fail_the_sync() {
    /// Refuses every `delete chain`, records everything.
    struct RefusesChainDeletes(Recorder);
    impl exec::ScriptExec for RefusesChainDeletes {
        fn run(&mut self, script: &str) -> Result<(), exec::ExecError> {
            let result = exec::ScriptExec::run(&mut self.0, script);
            if script.starts_with("delete chain") {
                return Err(exec::ExecError::Refused {
                    tool: "nft".into(),
                    status: "exit status: 1".into(),
                    message: "Error: Could not process rule: Device or resource busy".into(),
                });
            }
            result
        }
    }
    let mut model = model_from(&scaled(3, 0));
    let r = Recorder::default();
    let mut b = NftBackend::new(config(), Box::new(RefusesChainDeletes(r.clone())));
    full_sync(&mut b, &model);
    partial_sync_to(&mut b, &mut model, &scaled(1, 0));
    let deletes = |r: &Recorder| {
        r.scripts()
            .iter()
            .filter(|t| t.contains("delete chain ip kpng cluster-n3\n"))
            .count()
    };
    assert_eq!(deletes(&r), 1, "tried once");
    assert!(b.states[0].committed.is_some(), "the sync stands");
    assert!(b.states[0].chains.contains("cluster-n3"), "still there");
    partial_sync_to(&mut b, &mut model, &scaled(2, 0));
    assert_eq!(deletes(&r), 1, "not tried again before a full sync");
}

/// A full sync that adopts a table deletes the dynamic chains the table holds that no element
/// refers to: a previous run's (`cluster-n3`, `affinity-t600` of a Service that had 3
/// endpoints and ClientIP affinity before the restart) and someone's (`cluster-n9`), listed
/// with one chain dump; other chains are not touched, and partial and periodic syncs never
/// list the kernel. The dynamic chain count is then the table's.
#[test]
fn an_adopted_tables_unreferenced_dynamic_chains_go_at_the_full_sync() {
    let mut model = model_from(&scaled(1, 0));
    let (mut b, r, w) = netlink_backend();
    keep_table(&w, &b, &model, Family::V4);
    *w.chains.lock().expect("lock") = vec![(
        Family::V4,
        [
            "skeleton",
            "services",
            "cluster-n1",
            "cluster-n3",
            "nodeport-cluster-n1",
            "nodeport-cluster-n3",
            "affinity-t600",
            "cluster-n9",
            "cluster-n03",
        ]
        .map(String::from)
        .to_vec(),
    )];
    let stats = try_full_sync(&mut b, &model).expect("sync");
    assert_eq!(stats.kept_rules, [Family::V4], "the table was adopted");
    let deletes: Vec<String> = scripts(&r)
        .into_iter()
        .filter(|t| t.starts_with("delete chain ip kpng "))
        .collect();
    assert_eq!(
        deletes.iter().map(String::as_str).collect::<Vec<_>>(),
        ["delete chain ip kpng affinity-t600\n\
             delete chain ip kpng cluster-n3\n\
             delete chain ip kpng cluster-n9\n\
             delete chain ip kpng nodeport-cluster-n3\n"],
        "one transaction of its own: {:?}",
        scripts(&r)
    );
    let dynamic = |b: &NftBackend| b.states[0].chains.iter().cloned().collect::<Vec<_>>();
    assert_eq!(dynamic(&b), ["cluster-n1", "nodeport-cluster-n1"]);
    let shared = b.committed();
    let count = |family| {
        shared
            .lock()
            .expect("lock")
            .iter()
            .find(|c| c.family == family)
            .map(|c| c.chains)
    };
    assert_eq!(
        count(Family::V4),
        Some(2),
        "the metric counts the table's chains"
    );
    // Partial and periodic syncs do not list the kernel: no chain dump, no element dump.
    let listings = |w: &RecordingWriter| {
        (
            *w.chain_listings.lock().expect("lock"),
            *w.element_listings.lock().expect("lock"),
        )
    };
    let before = listings(&w);
    partial_sync_to(&mut b, &mut model, &scaled(2, 0));
    let empty = Diff::default();
    b.sync(&SyncRequest {
        diff: &empty,
        snapshot: model.snapshot(),
        full: false,
    })
    .expect("periodic sync");
    assert_eq!(listings(&w), before, "no dump outside full syncs");
}

/// A delete nft refused once is tried again by the next full sync that reuses the table (the
/// periodic one), which lists the table's chains; refused again, the sync still stands.
#[test]
fn a_refused_chain_delete_is_tried_again_by_the_next_full_sync() {
    /// Refuses `delete chain` while `refuse` is set, records everything.
    struct RefusesChainDeletes(Recorder, std::sync::Arc<std::sync::Mutex<bool>>);
    impl exec::ScriptExec for RefusesChainDeletes {
        fn run(&mut self, script: &str) -> Result<(), exec::ExecError> {
            let result = exec::ScriptExec::run(&mut self.0, script);
            // Not the hooks of a new table (`delete chain ip6 kpng skeleton` + `table …`).
            let chain_deletes = script.starts_with("delete chain") && !script.contains("table");
            if chain_deletes && *self.1.lock().expect("lock") {
                return Err(exec::ExecError::Refused {
                    tool: "nft".into(),
                    status: "exit status: 1".into(),
                    message: "Error: Could not process rule: Device or resource busy".into(),
                });
            }
            result
        }
    }
    let mut model = model_from(&scaled(3, 0));
    let (r, refuse) = (
        Recorder::default(),
        std::sync::Arc::new(std::sync::Mutex::new(true)),
    );
    let w = RecordingWriter::default();
    let mut b = NftBackend::new(
        config(),
        Box::new(RefusesChainDeletes(r.clone(), refuse.clone())),
    )
    .with_netlink(w.clone());
    full_sync(&mut b, &model);
    partial_sync_to(&mut b, &mut model, &scaled(1, 0));
    let deletes = |r: &Recorder| {
        r.scripts()
            .iter()
            .filter(|t| t.contains("delete chain ip kpng cluster-n3\n"))
            .count()
    };
    assert_eq!(deletes(&r), 1, "refused once");
    // The table as it is: what the first sync created, cluster-n3 still there.
    keep_table(&w, &b, &model, Family::V4);
    let mut held: Vec<String> = b.states[0].chains.iter().cloned().collect();
    held.push("skeleton".into());
    *w.chains.lock().expect("lock") = vec![(Family::V4, held)];
    full_sync(&mut b, &model);
    assert_eq!(deletes(&r), 2, "tried again by the full sync");
    assert!(
        b.states[0].chains.contains("cluster-n3"),
        "refused again: kept"
    );
    *refuse.lock().expect("lock") = false;
    full_sync(&mut b, &model);
    assert_eq!(deletes(&r), 3);
    assert!(
        !b.states[0].chains.contains("cluster-n3"),
        "deleted at last"
    );
}

/// `kpng_nftables_elements` and `kpng_nftables_dynamic_chains` follow what was programmed.
#[test]
fn element_and_chain_counts_are_exported() {
    let model = model_from(ONE_SERVICE);
    let (mut b, _r) = backend();
    let mut registry = prometheus_client::registry::Registry::default();
    b.register_metrics(&mut registry);
    let gauge = |registry: &prometheus_client::registry::Registry, name: &str| -> f64 {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).expect("encode");
        text.lines()
            .find(|l| l.starts_with(&format!("{name}{{ip_family=\"IPv4\"}}")))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
    };
    full_sync(&mut b, &model);
    let elements = gauge(&registry, "kpng_nftables_elements");
    assert!(elements >= 5.0, "{elements}");
    assert!(gauge(&registry, "kpng_nftables_dynamic_chains") >= 1.0);
}

/// kube-proxy's nftables failure counters are per `ip_family` (one proxier per family), with
/// its help text, and exist at 0 from the start for the families the node runs; a refused
/// transaction counts under its family only, and the error names it for the runner.
#[test]
fn a_refused_transaction_is_counted_under_its_family() {
    let model = model_from(ONE_SERVICE);
    let (mut b, r) = backend();
    let mut registry = prometheus_client::registry::Registry::default();
    b.register_metrics(&mut registry);
    let text = |registry: &prometheus_client::registry::Registry| {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).expect("encode");
        text
    };
    let at_start = text(&registry);
    for line in [
        "# HELP kubeproxy_sync_proxy_rules_nftables_sync_failures Cumulative proxy nftables sync failures.",
        "# HELP kubeproxy_sync_proxy_rules_nftables_cleanup_failures Cumulative proxy nftables cleanup failures.",
        "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family=\"IPv4\"} 0",
        "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family=\"IPv6\"} 0",
        "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total{ip_family=\"IPv4\"} 0",
        "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total{ip_family=\"IPv6\"} 0",
    ] {
        assert!(at_start.contains(line), "{line} missing:\n{at_start}");
    }
    full_sync(&mut b, &model);
    // The next transaction (IPv4's, synced first) is refused; IPv6's goes through.
    r.record().fail_next = 1;
    let error = try_full_sync(&mut b, &model).expect_err("refused");
    assert_eq!(error.failed_families(), Some(&[Family::V4][..]), "{error}");
    let after = text(&registry);
    for line in [
        "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family=\"IPv4\"} 1",
        "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family=\"IPv6\"} 0",
    ] {
        assert!(after.contains(line), "{line} missing:\n{after}");
    }
}

#[test]
fn an_unchanged_relist_sends_nothing() {
    let mut model = model_from(ONE_SERVICE);
    let (mut b, r) = backend();
    full_sync(&mut b, &model);
    let loaded = kpng_source_file::parse_manifests(ONE_SERVICE).expect("parses");
    let out = model.apply(Event::Replace {
        kinds: vec![Kind::Service, Kind::EndpointSlice, Kind::Node],
        objects: loaded.objects,
    });
    assert!(out.diff.is_empty());
    let stats = b
        .sync(&SyncRequest {
            diff: &out.diff,
            snapshot: model.snapshot(),
            full: false,
        })
        .expect("sync");
    assert_eq!(stats.operations, 0);
    assert_eq!(scripts(&r).len(), 2, "no transaction for an empty diff");
}

#[test]
fn a_failed_partial_sync_makes_the_next_sync_a_full_replace() {
    let mut model = model_from(ONE_SERVICE);
    let (mut b, r) = backend();
    full_sync(&mut b, &model);
    let loaded =
        kpng_source_file::parse_manifests(&ONE_SERVICE.replace("10.244.2.2", "10.244.2.9"))
            .expect("parses");
    let out = model.apply(Event::Replace {
        kinds: vec![Kind::Service, Kind::EndpointSlice, Kind::Node],
        objects: loaded.objects,
    });
    r.record().fail_with = Some("injected".into());
    let err = b
        .sync(&SyncRequest {
            diff: &out.diff,
            snapshot: model.snapshot(),
            full: false,
        })
        .expect_err("fails");
    assert!(err.to_string().contains("injected"), "{err}");
    r.record().fail_with = None;
    // Even a partial request with an empty diff now rebuilds the IPv4 table.
    let empty = Diff::default();
    b.sync(&SyncRequest {
        diff: &empty,
        snapshot: model.snapshot(),
        full: false,
    })
    .expect("sync");
    let last = scripts(&r).last().cloned().expect("script");
    assert!(
        last.starts_with("add table ip kpng\ndelete table ip kpng\ntable ip kpng {"),
        "{last}"
    );
    assert!(
        last.contains("10.96.0.10 . 80 . 1 : 10.244.2.9 . 8080"),
        "{last}"
    );
}

fn many_services(n: usize, endpoints: usize) -> String {
    let mut y = String::from("kind: Node\nmetadata: {name: node1}\n");
    for i in 0..n {
        let ip = format!("10.96.{}.{}", i / 250, i % 250 + 1);
        y.push_str(&format!(
            "---\nkind: Service\nmetadata: {{namespace: ns, name: s{i}}}\nspec: {{clusterIP: {ip}, ports: [{{name: p, port: 80}}]}}\n"
        ));
        y.push_str(&format!(
            "---\nkind: EndpointSlice\nmetadata: {{namespace: ns, name: s{i}-1, labels: {{kubernetes.io/service-name: s{i}}}}}\naddressType: IPv4\nports: [{{name: p, port: 8080}}]\nendpoints:\n"
        ));
        for e in 0..endpoints {
            y.push_str(&format!(
                "- {{addresses: [10.244.{}.{}]}}\n",
                e,
                i % 250 + 1
            ));
        }
    }
    y
}

fn count_rules(script: &str) -> (usize, usize) {
    let chains = script
        .lines()
        .filter(|l| l.trim_start().starts_with("chain ") || l.starts_with("add chain "))
        .count();
    let elements = script
        .lines()
        .filter(|l| l.starts_with('\t') && l.ends_with(','))
        .count();
    (chains, elements)
}

#[test]
fn ruleset_size_does_not_grow_with_services() {
    let mut sizes = Vec::new();
    for n in [10, 1000] {
        let model = model_from(&many_services(n, 3));
        let (mut b, r) = backend();
        full_sync(&mut b, &model);
        let s = scripts(&r);
        let (chains, elements) = count_rules(&s[0]);
        let rules = s[0]
            .lines()
            .filter(|l| l.starts_with("\t\t") && !l.contains("type ") && !l.contains("policy"))
            .count();
        sizes.push((n, chains, rules, elements));
    }
    let (_, chains_small, rules_small, elements_small) = sizes[0];
    let (_, chains_big, rules_big, elements_big) = sizes[1];
    assert_eq!(
        chains_small, chains_big,
        "chains must not grow with Services: {sizes:?}"
    );
    assert_eq!(
        rules_small, rules_big,
        "rules must not grow with Services: {sizes:?}"
    );
    assert!(
        elements_big > 50 * elements_small,
        "state lives in elements: {sizes:?}"
    );
}

#[test]
fn cleanup_removes_both_tables() {
    let (mut b, r) = backend();
    b.cleanup().expect("cleanup");
    assert_eq!(
        scripts(&r),
        vec![
            "add table ip kpng\ndelete table ip kpng\nadd table ip6 kpng\ndelete table ip6 kpng\n"
        ]
    );
}

/// The elements a full transaction adds to `set` of table `family kpng`, one per line.
fn set_elements(script: &str, family: &str, set: &str) -> Vec<String> {
    let head = format!("add element {family} kpng {set} {{");
    let Some(start) = script.find(&head) else {
        return Vec::new();
    };
    script[start + head.len()..]
        .lines()
        .map(str::trim)
        .take_while(|l| *l != "}")
        .filter(|l| !l.is_empty())
        .map(|l| l.trim_end_matches(',').to_string())
        .collect()
}

#[test]
fn service_cidr_objects_join_the_flag_ranges_and_a_change_resyncs() {
    let with_cidrs = |cidrs: &str| {
        format!(
            "{ONE_SERVICE}---\nkind: ServiceCIDR\nmetadata: {{name: kubernetes}}\nspec: {{cidrs: [{cidrs}]}}\n"
        )
    };
    let mut model = model_from(&with_cidrs(
        "10.96.0.0/16, 10.100.0.0/24, \"fd00:96::/112\"",
    ));
    let (mut b, r) = backend();
    full_sync(&mut b, &model);
    let s = scripts(&r);
    // The flag's 10.96.0.0/16 and the object's equal range are one element.
    assert_eq!(
        set_elements(&s[0], "ip", "service-cidrs"),
        ["10.100.0.0/24", "10.96.0.0/16"]
    );
    assert_eq!(
        set_elements(&s[1], "ip6", "service-cidrs"),
        ["fd00:96::/112"]
    );

    // The object drops a range: a node-level change, so a full resync without it.
    let loaded = kpng_source_file::parse_manifests(&with_cidrs("10.96.0.0/16")).expect("parses");
    let out = model.apply(Event::Replace {
        kinds: Kind::ALL.to_vec(),
        objects: loaded.objects,
    });
    assert!(out.diff.node_changed);
    b.sync(&SyncRequest {
        diff: &out.diff,
        snapshot: model.snapshot(),
        full: false,
    })
    .expect("sync");
    let s = scripts(&r);
    let v4 = s
        .iter()
        .rev()
        .find(|t| t.contains("table ip kpng"))
        .expect("v4");
    assert_eq!(set_elements(v4, "ip", "service-cidrs"), ["10.96.0.0/16"]);
    let v6 = s
        .iter()
        .rev()
        .find(|t| t.contains("table ip6 kpng"))
        .expect("v6");
    assert!(set_elements(v6, "ip6", "service-cidrs").is_empty(), "{v6}");
}

// ---------------------------------------------------------------------------------------------
// The netlink path, against the recording writer (no root needed)
// ---------------------------------------------------------------------------------------------

use crate::netlink::{Operation, ProbedTable, RecordedBatch, RecordingWriter};

fn netlink_backend() -> (NftBackend, Recorder, RecordingWriter) {
    let (b, r) = backend();
    let w = RecordingWriter::default();
    (b.with_netlink(w.clone()), r, w)
}

/// Elements per set name that a text script adds.
fn text_counts(script: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let mut set = None;
    for line in script.lines() {
        if let Some(rest) = line.strip_prefix("add element ") {
            set = rest.split_whitespace().nth(2).map(str::to_string);
        } else if line == "}" {
            set = None;
        } else if let Some(s) = &set
            && line.starts_with('\t')
        {
            *out.entry(s.clone()).or_default() += 1;
        }
    }
    out
}

/// Elements per set name that a recorded batch adds.
fn netlink_counts(b: &RecordedBatch) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for m in b.messages.iter().filter(|m| m.op == Operation::Add) {
        *out.entry(m.set.name().to_string()).or_default() += m.elems.len();
    }
    out
}

#[test]
fn netlink_full_sync_without_a_table_sends_the_skeleton_as_text_and_the_same_elements() {
    let yaml = std::fs::read_to_string(repo_file("../../examples/cluster.yaml")).expect("example");
    let model = model_from(&yaml);
    let (mut text_backend, text) = backend();
    let text_ops = full_sync(&mut text_backend, &model);
    let text_scripts = scripts(&text);

    let (mut b, r, w) = netlink_backend();
    let ops = full_sync(&mut b, &model);
    assert_eq!(ops, text_ops, "same operation count as the text path");
    let batches = w.recorded();
    assert_eq!(batches.len(), 2, "one element transaction per family");
    for (i, batch) in batches.iter().enumerate() {
        assert!(
            batch.flushed().is_empty(),
            "a new table has nothing to flush"
        );
        assert_eq!(batch.deletes, 0);
        assert_eq!(
            netlink_counts(batch),
            text_counts(&text_scripts[i]),
            "{:?}: the netlink batch adds what the text path adds",
            batch.family
        );
    }
    assert_eq!(batches.iter().map(|b| b.adds).sum::<usize>(), ops);
    // The text went to nft without elements: the skeleton and the dynamic chains.
    let s = scripts(&r);
    assert!(s.iter().all(|t| !t.contains("add element")), "{s:?}");
    assert!(s[0].starts_with("add table ip kpng\ndelete table ip kpng\ntable ip kpng {"));
    assert!(s.iter().any(|t| t.contains("add chain ip kpng cluster-n")));
}

#[test]
fn a_large_cold_fill_is_cut_into_transactions_that_add_what_the_text_path_adds() {
    let model = model_from(&many_services(4000, 4));
    let (mut text_backend, text) = backend();
    let text_ops = full_sync(&mut text_backend, &model);
    let text_scripts = scripts(&text);

    let (mut b, _, w) = netlink_backend();
    assert_eq!(full_sync(&mut b, &model), text_ops);
    let batches = w.recorded();
    let ip: Vec<&RecordedBatch> = batches.iter().filter(|b| b.family == Family::V4).collect();
    assert!(ip.len() >= 2, "{} elements in one transaction", text_ops);
    let mut counts = BTreeMap::new();
    let mut before = 0;
    for (i, batch) in ip.iter().enumerate() {
        assert!(batch.flushed().is_empty() && batch.deletes == 0);
        if i > 0 {
            assert!(
                batch.adds <= before + 16,
                "batch {i} more than doubles the table"
            );
        }
        before += batch.adds;
        for (set, n) in netlink_counts(batch) {
            *counts.entry(set).or_default() += n;
        }
    }
    assert_eq!(counts, text_counts(&text_scripts[0]));
    assert_eq!(batches.iter().map(|b| b.adds).sum::<usize>(), text_ops);

    // Adopting that table again refills it in one transaction: it is in use.
    let (mut again, _, w) = netlink_backend();
    *w.tables.lock().expect("lock") = markers(&again, &model);
    full_sync(&mut again, &model);
    assert_eq!(w.recorded().len(), 2, "one transaction per family");
}

#[test]
fn a_failed_cold_fill_is_retried_as_one_refill_of_the_table_it_left() {
    let model = model_from(&many_services(4000, 4));
    let (mut b, _, w) = netlink_backend();
    *w.fail_with.lock().expect("lock") = Some("injected".into());
    assert!(try_full_sync(&mut b, &model).is_err());
    assert_eq!(
        w.recorded().len(),
        1,
        "the fill stops at the first refused transaction"
    );

    // The kernel now holds our skeleton (created as text before the elements): the retry
    // flushes and refills it in one transaction per family.
    *w.fail_with.lock().expect("lock") = None;
    *w.tables.lock().expect("lock") = markers(&b, &model);
    w.batches.lock().expect("lock").clear();
    try_full_sync(&mut b, &model).expect("the retry");
    let batches = w.recorded();
    assert_eq!(batches.len(), 2, "one transaction per family");
    for batch in &batches {
        assert_eq!(
            batch.flushed(),
            Set::owned(batch.family).collect::<Vec<_>>()
        );
    }
}

/// A writer that checks, at each commit, that every per-count chain the transaction jumps to
/// was created by a text transaction before it (the cold fill commits on another thread).
struct ChainsFirst {
    inner: RecordingWriter,
    text: Recorder,
    /// Chains a transaction named before any script created them.
    late: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl netlink::ElementWriter for ChainsFirst {
    fn commit(
        &mut self,
        batch: netlink::ElementBatch,
        describe: &dyn Fn(Operation, usize) -> Option<String>,
    ) -> Result<(), netlink::NetlinkError> {
        let created = self.text.scripts().join("\n");
        let before = self.inner.recorded().len();
        self.inner.commit(batch, describe)?;
        for sent in &self.inner.recorded()[before..] {
            for chain in cluster_chains(&sent.datagram) {
                if !created.contains(&chain) {
                    self.late.lock().expect("lock").push(chain);
                }
            }
        }
        Ok(())
    }

    fn probe_table(&mut self, family: Family, table: &str) -> ProbedTable {
        self.inner.probe_table(family, table)
    }
}

/// The `cluster-n<k>` chain names a datagram's verdicts jump to.
fn cluster_chains(datagram: &[u8]) -> BTreeSet<String> {
    let needle = b"cluster-n";
    let mut out = BTreeSet::new();
    for start in 0..datagram.len().saturating_sub(needle.len()) {
        if datagram[start..].starts_with(needle) {
            let digits = datagram[start + needle.len()..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            let end = start + needle.len() + digits;
            out.insert(String::from_utf8_lossy(&datagram[start..end]).into_owned());
        }
    }
    out
}

#[test]
fn a_cold_fill_creates_each_chain_before_the_transaction_that_jumps_to_it() {
    // Ports are filled in name order; the Services named `s99…` come last and alone have 9
    // endpoints, so `cluster-n9` is first needed by the fill's last transaction.
    let mut yaml = many_services(4000, 4);
    for i in [99, 990, 991, 992, 993] {
        let slice = format!("name: s{i}-1,");
        let at = yaml.find(&slice).expect("slice");
        let endpoints = yaml[at..].find("endpoints:\n").expect("endpoints") + at + 11;
        for e in 4..9 {
            yaml.insert_str(
                endpoints,
                &format!("- {{addresses: [10.245.{e}.{}]}}\n", i % 250),
            );
        }
    }
    let model = model_from(&yaml);
    let (b, r) = backend();
    let w = RecordingWriter::default();
    let late = std::sync::Arc::default();
    let mut b = b.with_netlink(ChainsFirst {
        inner: w.clone(),
        text: r,
        late: std::sync::Arc::clone(&late),
    });
    full_sync(&mut b, &model);
    let ip: Vec<RecordedBatch> = w
        .recorded()
        .into_iter()
        .filter(|b| b.family == Family::V4)
        .collect();
    assert!(ip.len() >= 2, "{} transactions", ip.len());
    let nine = "cluster-n9".to_string();
    assert!(!cluster_chains(&ip[0].datagram).contains(&nine));
    assert!(cluster_chains(&ip[ip.len() - 1].datagram).contains(&nine));
    assert_eq!(*late.lock().expect("lock"), Vec::<String>::new());
}

/// A writer whose `n`th commit (from 0) fails; the others are recorded as usual.
struct FailNth {
    inner: RecordingWriter,
    n: usize,
    seen: usize,
}

impl netlink::ElementWriter for FailNth {
    fn commit(
        &mut self,
        batch: netlink::ElementBatch,
        describe: &dyn Fn(Operation, usize) -> Option<String>,
    ) -> Result<(), netlink::NetlinkError> {
        self.seen += 1;
        if self.seen - 1 == self.n {
            return Err(netlink::NetlinkError::Injected(
                "the third transaction".into(),
            ));
        }
        self.inner.commit(batch, describe)
    }

    fn probe_table(&mut self, family: Family, table: &str) -> ProbedTable {
        self.inner.probe_table(family, table)
    }
}

#[test]
fn a_cold_fill_stops_at_a_refused_transaction_in_the_middle() {
    // 12,000 Services: several transactions; the committer refuses the third while the
    // encoding side is ahead of it. The sync fails with that error, nothing after it is
    // sent, and the encoding side does not wait for a committer that is gone.
    let model = model_from(&many_services(12_000, 4));
    let (b, _) = backend();
    let w = RecordingWriter::default();
    let mut b = b.with_netlink(FailNth {
        inner: w.clone(),
        n: 2,
        seen: 0,
    });
    let error = try_full_sync(&mut b, &model).expect_err("the third transaction is refused");
    assert!(
        error.to_string().contains("the third transaction"),
        "{error}"
    );
    assert_eq!(
        w.recorded().len(),
        2,
        "the two transactions before it, no more"
    );
}

/// A table someone deletes while kpng commits: from `deleted_at` (the number of text scripts
/// run by then) its probe says absent and every element transaction fails, until a text
/// script creates the table again.
struct DeletedTable {
    inner: RecordingWriter,
    text: Recorder,
    deleted_at: std::sync::Arc<std::sync::Mutex<Option<usize>>>,
}

impl DeletedTable {
    fn gone(&self) -> bool {
        let Some(at) = *self.deleted_at.lock().expect("lock") else {
            return false;
        };
        !self.text.scripts()[at..]
            .iter()
            .any(|s| s.starts_with("add table ip kpng"))
    }
}

impl netlink::ElementWriter for DeletedTable {
    fn commit(
        &mut self,
        batch: netlink::ElementBatch,
        describe: &dyn Fn(Operation, usize) -> Option<String>,
    ) -> Result<(), netlink::NetlinkError> {
        if batch.family() == Family::V4 && self.gone() {
            return Err(netlink::NetlinkError::Injected(
                "No such file or directory".into(),
            ));
        }
        self.inner.commit(batch, describe)
    }

    fn probe_table(&mut self, family: Family, table: &str) -> ProbedTable {
        if family == Family::V4 && self.gone() {
            return ProbedTable::Absent;
        }
        self.inner.probe_table(family, table)
    }
}

/// Makes `writer`'s probe find `family`'s table as `b` committed it (its skeleton's marker).
fn keep_table(writer: &RecordingWriter, b: &NftBackend, model: &Model, family: Family) {
    let cfg = b.static_config(Fam(family), model.snapshot());
    let skeleton = ruleset::skeleton(Fam(family), "kpng", &cfg);
    let marker = ruleset::skeleton_marker(&skeleton)
        .expect("marker")
        .to_string();
    writer
        .tables
        .lock()
        .expect("lock")
        .push((family, ProbedTable::Present(marker)));
}

/// The table deleted while a transaction of kpng's was on its way (no notification tells
/// kpng, since its own commit was running): that transaction fails, and the retry looks at the
/// table again and creates it, rather than failing the same way on what it knew, and the sync
/// reports the repair.
#[test]
fn a_table_deleted_during_a_transaction_is_created_again_by_the_first_retry() {
    let mut model = model_from(ONE_SERVICE);
    let (b, r) = backend();
    let deleted_at = std::sync::Arc::default();
    let inner = RecordingWriter::default();
    let mut b = b.with_netlink(DeletedTable {
        inner: inner.clone(),
        text: r.clone(),
        deleted_at: std::sync::Arc::clone(&deleted_at),
    });
    full_sync(&mut b, &model);
    // The first full sync committed the table (the fake has no probe of it afterwards: say
    // it is ours). The IPv6 table stays, with its skeleton.
    *deleted_at.lock().expect("lock") = Some(scripts(&r).len());
    keep_table(&inner, &b, &model, Family::V6);
    let loaded =
        kpng_source_file::parse_manifests(&ONE_SERVICE.replace("10.244.2.2", "10.244.2.9"))
            .expect("parses");
    let out = model.apply(Event::Replace {
        kinds: vec![Kind::Service, Kind::EndpointSlice, Kind::Node],
        objects: loaded.objects,
    });
    let err = b
        .sync(&SyncRequest {
            diff: &out.diff,
            snapshot: model.snapshot(),
            full: false,
        })
        .expect_err("the table is gone");
    assert!(err.to_string().contains("No such file"), "{err}");
    let stats = try_full_sync(&mut b, &model).expect("the first retry creates the table again");
    assert_eq!(
        stats.repaired.as_deref(),
        Some("table ip kpng deleted by someone else during a transaction of kpng's; created again")
    );
}

/// The `chain NAME {` lines of a script, by name, and whether each is hooked.
fn declared_chains(script: &str) -> BTreeMap<String, bool> {
    let mut out = BTreeMap::new();
    let mut current = None;
    for line in script.lines() {
        if let Some(name) = line
            .trim()
            .strip_prefix("chain ")
            .and_then(|l| l.strip_suffix(" {"))
        {
            current = Some(name.to_string());
            out.insert(name.to_string(), false);
        } else if line.contains(" hook ")
            && let Some(name) = &current
        {
            out.insert(name.clone(), true);
        }
    }
    out
}

#[test]
fn a_new_tables_skeleton_in_two_parts_is_the_whole_one_with_the_hooks_last() {
    let model = model_from(ONE_SERVICE);
    let (b, _) = backend();
    let cfg = b.static_config(Fam(Family::V4), model.snapshot());
    let whole = ruleset::skeleton(Fam(Family::V4), "kpng", &cfg);
    let (first, hooks) = ruleset::skeleton_in_two(Fam(Family::V4), "kpng", &cfg);
    let (whole_chains, first_chains, hook_chains) = (
        declared_chains(&whole),
        declared_chains(&first),
        declared_chains(&hooks),
    );
    assert!(whole_chains.values().filter(|hooked| **hooked).count() >= 6);
    assert!(
        first_chains.values().all(|hooked| !hooked),
        "{first_chains:?}"
    );
    for (name, hooked) in &whole_chains {
        let in_first = first_chains.contains_key(name);
        let in_hooks = hook_chains.get(name).copied();
        if name == ruleset::MARKER_CHAIN {
            assert!(
                in_first && in_hooks.is_some(),
                "the marker is rewritten by the hooks"
            );
        } else if *hooked {
            assert_eq!((in_first, in_hooks), (false, Some(true)), "{name}");
        } else {
            assert_eq!((in_first, in_hooks), (true, None), "{name}");
        }
    }
    // Until the hooks are in, the marker says so; then it is the whole skeleton's.
    let marker_of = |script: &str| {
        script.lines().find_map(|l| {
            let comment = l.trim().strip_prefix("comment \"")?.strip_suffix('"')?;
            comment.starts_with("kpng ").then(|| comment.to_string())
        })
    };
    assert!(ruleset::is_filling(&marker_of(&first).expect("marker")));
    assert_eq!(
        marker_of(&hooks).as_deref(),
        ruleset::skeleton_marker(&whole)
    );
    assert!(hooks.starts_with("delete chain ip kpng skeleton\n"));
}

#[test]
fn a_cold_fill_hooks_the_table_last_and_a_fill_left_unhooked_is_filled_again() {
    let model = model_from(&many_services(2000, 4));
    let (mut b, r, w) = netlink_backend();
    try_full_sync(&mut b, &model).expect("sync");
    let s = scripts(&r);
    let first = s
        .iter()
        .position(|t| t.starts_with("add table ip kpng"))
        .expect("v4");
    assert!(
        !s[first].contains(" hook "),
        "no base chain before the fill"
    );
    let hooks = s
        .iter()
        .position(|t| t.contains(" hook ") && t.contains("table ip kpng"))
        .expect("the hooks");
    assert!(hooks > first);
    assert!(s[first + 1..hooks].iter().all(|t| !t.contains(" hook ")));
    assert!(
        w.recorded()
            .iter()
            .any(|b| b.family == Family::V4 && b.adds > 0)
    );

    // A kpng that stopped before the hooks: the probe finds the filling marker, and the next
    // start fills the table again from scratch (no refill of a table nothing runs through).
    let (mut again, r, w) = netlink_backend();
    *w.tables.lock().expect("lock") =
        vec![(Family::V4, ProbedTable::Present("kpng filling".into()))];
    try_full_sync(&mut again, &model).expect("sync");
    let s = scripts(&r);
    assert!(
        s[0].starts_with("add table ip kpng\ndelete table ip kpng\n"),
        "{}",
        s[0]
    );
    let v4: Vec<RecordedBatch> = w
        .recorded()
        .into_iter()
        .filter(|b| b.family == Family::V4)
        .collect();
    assert!(
        v4.iter().all(|b| b.flushed().is_empty()),
        "filled, not refilled"
    );
}

/// Records scripts, refusing the first one that hooks base chains.
struct RefuseHooks {
    text: Recorder,
    refused: bool,
}

impl exec::NftExec for RefuseHooks {
    fn run(&mut self, script: &str) -> Result<(), exec::ExecError> {
        if !self.refused && script.contains(" hook ") {
            self.refused = true;
            return Err(exec::ExecError::Refused {
                tool: "test".into(),
                status: "exit status: 1".into(),
                message: "the hooks are refused".into(),
            });
        }
        exec::ScriptExec::run(&mut self.text, script)
    }
}

#[test]
fn a_refused_hooks_transaction_fails_the_sync_and_the_retry_fills_again() {
    let model = model_from(ONE_SERVICE);
    let text = Recorder::default();
    let w = RecordingWriter::default();
    let mut b = NftBackend::new(
        config(),
        Box::new(RefuseHooks {
            text: text.clone(),
            refused: false,
        }),
    )
    .with_netlink(w.clone());
    let error = try_full_sync(&mut b, &model).expect_err("the hooks are refused");
    assert!(
        error.to_string().contains("the hooks are refused"),
        "{error}"
    );
    // What the kernel holds now: the table without hooks, marked as filling.
    *w.tables.lock().expect("lock") =
        vec![(Family::V4, ProbedTable::Present("kpng filling".into()))];
    let before = text.scripts().len();
    try_full_sync(&mut b, &model).expect("the retry");
    let s = text.scripts();
    assert!(
        s[before].starts_with("add table ip kpng\ndelete table ip kpng\n"),
        "filled again from scratch: {}",
        s[before]
    );
    assert!(s[before..].iter().any(|t| t.contains(" hook ")));
}

/// What the probe finds in a kernel that holds `b`'s own skeleton for `model`, per family.
fn markers(b: &NftBackend, model: &Model) -> Vec<(Family, ProbedTable)> {
    Family::ALL
        .iter()
        .map(|f| {
            let fam = Fam(*f);
            let skeleton = ruleset::skeleton(fam, "kpng", &b.static_config(fam, model.snapshot()));
            let marker = ruleset::skeleton_marker(&skeleton).expect("marker");
            (*f, ProbedTable::Present(marker.to_string()))
        })
        .collect()
}

#[test]
fn netlink_full_sync_adopts_a_table_with_the_same_skeleton_by_flushing_and_refilling() {
    let model = model_from(ONE_SERVICE);
    let (mut b, r, w) = netlink_backend();
    *w.tables.lock().expect("lock") = markers(&b, &model);
    let stats = try_full_sync(&mut b, &model).expect("sync");
    let ops = stats.operations;
    assert_eq!(
        stats.kept_rules,
        [Family::V4, Family::V6],
        "the rules stayed in place: the conntrack cleanup may trust the last run"
    );
    let batches = w.recorded();
    assert_eq!(batches.len(), 2);
    for batch in &batches {
        let owned: Vec<Set> = Set::owned(batch.family).collect();
        assert_eq!(
            batch.flushed(),
            owned,
            "every kpng set, not the affinity maps"
        );
        assert!(!owned.contains(&Set::Affinity) && !owned.contains(&Set::AffinityAddr));
    }
    assert_eq!(batches.iter().map(|b| b.adds).sum::<usize>(), ops);
    let s = scripts(&r);
    assert!(
        s.iter().all(|t| !t.contains("table ip kpng {")),
        "no skeleton text when adopting: {s:?}"
    );
}

#[test]
fn only_an_adopted_table_keeps_its_rules_in_a_full_sync() {
    let model = model_from(ONE_SERVICE);
    // No table yet: created, nothing kept.
    let (mut b, _r, _w) = netlink_backend();
    assert!(
        try_full_sync(&mut b, &model)
            .expect("sync")
            .kept_rules
            .is_empty()
    );
    // Someone else changed the table: its rules are put back, so they were not kept.
    let (mut b, _r, w) = netlink_backend();
    *w.tables.lock().expect("lock") = markers(&b, &model);
    full_sync(&mut b, &model);
    // (What the monitor's report of a change by someone else does to the IPv4 table.)
    b.states[0].distrust = true;
    b.states[0].kernel = KernelTable::Unknown;
    let stats = try_full_sync(&mut b, &model).expect("sync");
    assert_eq!(stats.kept_rules, [Family::V6], "IPv4's rules were put back");
}

#[test]
fn netlink_partial_sync_is_one_minimal_batch_and_a_failure_forces_a_full_sync() {
    let mut model = model_from(ONE_SERVICE);
    let (mut b, r, w) = netlink_backend();
    full_sync(&mut b, &model);
    let texts_before = scripts(&r).len();
    let loaded =
        kpng_source_file::parse_manifests(&ONE_SERVICE.replace("10.244.2.2", "10.244.2.9"))
            .expect("parses");
    let out = model.apply(Event::Replace {
        kinds: vec![Kind::Service, Kind::EndpointSlice, Kind::Node],
        objects: loaded.objects,
    });
    let stats = b
        .sync(&SyncRequest {
            diff: &out.diff,
            snapshot: model.snapshot(),
            full: false,
        })
        .expect("sync");
    assert_eq!(stats.operations, 4, "as on the text path");
    assert_eq!(scripts(&r).len(), texts_before, "no text: no new chain");
    let last = w.recorded().pop().expect("a batch");
    assert_eq!((last.deletes, last.adds), (2, 2));
    let sets: Vec<(Operation, &str)> = last.messages.iter().map(|m| (m.op, m.set.name())).collect();
    assert_eq!(
        sets,
        [
            (Operation::Delete, "cluster-endpoints-tcp"),
            (Operation::Delete, "nodeport-cluster-endpoints-tcp"),
            (Operation::Add, "cluster-endpoints-tcp"),
            (Operation::Add, "nodeport-cluster-endpoints-tcp"),
        ]
    );
    // The new endpoint's bytes are in the datagram.
    assert!(
        last.datagram.windows(4).any(|x| x == [10, 244, 2, 9]),
        "10.244.2.9 encoded"
    );

    // A failed netlink transaction: the next sync rebuilds the family.
    *w.fail_with.lock().expect("lock") = Some("injected".into());
    let loaded = kpng_source_file::parse_manifests(ONE_SERVICE).expect("parses");
    let out = model.apply(Event::Replace {
        kinds: vec![Kind::Service, Kind::EndpointSlice, Kind::Node],
        objects: loaded.objects,
    });
    let err = b
        .sync(&SyncRequest {
            diff: &out.diff,
            snapshot: model.snapshot(),
            full: false,
        })
        .expect_err("fails");
    assert!(err.to_string().contains("injected"), "{err}");
    *w.fail_with.lock().expect("lock") = None;
    let before = w.recorded().len();
    b.sync(&SyncRequest {
        diff: &Diff::default(),
        snapshot: model.snapshot(),
        full: false,
    })
    .expect("sync");
    let again = &w.recorded()[before..];
    assert_eq!(again.len(), 1, "the IPv4 family only");
    assert_eq!(again[0].family, Family::V4);
    assert!(again[0].adds > 4, "a full refill, not a diff");
}

/// The backend contract at the fake level (the kit's conformance scenarios): the recorder is
/// the data plane; what the backend committed for Services is its set and map elements (the
/// `cluster-nN` chains are shared by every Service with N endpoints, like the skeleton, and
/// stay when one Service goes). Where a frontend dispatches is read from the scripts that
/// succeeded, replayed into a fake kernel ([`kernel`]).
mod kernel;
mod conformance_harness {
    use kpng_backend_kit::conformance::{Client, Dispatch, Frontend};

    use super::*;

    pub struct NftHarness {
        backend: NftBackend,
        kernel: kernel::FakeKernel,
    }

    impl kpng_backend_kit::conformance::Harness for NftHarness {
        fn backend(&mut self) -> &mut dyn Backend {
            &mut self.backend
        }

        fn objects(&self) -> usize {
            self.backend.states.iter().map(|s| s.store.len()).sum()
        }

        fn fail_next(&mut self) {
            self.kernel.recorder.record().fail_next = 1;
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

    pub fn make() -> NftHarness {
        let kernel = kernel::FakeKernel::default();
        // Pods are recognised by the scenarios' cluster CIDRs (`Client::Pod`).
        let config = NftConfig {
            detect_local: DetectLocal::ClusterCidr(vec![
                "10.244.0.0/16".parse().expect("cidr"),
                "fd00:10:244::/48".parse().expect("cidr"),
            ]),
            ..config()
        };
        let backend = NftBackend::new(config, Box::new(kernel.clone()));
        NftHarness { backend, kernel }
    }
}

kpng_backend_kit::conformance_tests!(conformance_harness::make);

// ---------------------------------------------------------------------------------------------
// The conntrack mark and the packet mark are shared with the CNI.
// ---------------------------------------------------------------------------------------------

/// `n` ClusterIP Services with ClientIP affinity (`sticky0` …), two endpoints each, one of them
/// local, and a NodePort.
fn affinity_services(n: usize) -> String {
    let mut y = String::from(
        "kind: Node\nmetadata: {name: node1}\nstatus: {addresses: [{type: InternalIP, address: 192.168.100.1}]}\n",
    );
    for i in 0..n {
        y.push_str(&format!(
            "---\nkind: Service\nmetadata: {{namespace: ns, name: sticky{i}}}\nspec: {{type: NodePort, clusterIP: 10.96.1.{}, sessionAffinity: ClientIP, externalTrafficPolicy: Local, ports: [{{name: p, port: 80, nodePort: {}}}]}}\n",
            i + 1,
            30100 + i
        ));
        y.push_str(&format!(
            "---\nkind: EndpointSlice\nmetadata: {{namespace: ns, name: sticky{i}-1, labels: {{kubernetes.io/service-name: sticky{i}}}}}\naddressType: IPv4\nports: [{{name: p, port: 8080}}]\nendpoints:\n- {{addresses: [10.244.1.{}], nodeName: node1}}\n- {{addresses: [10.244.2.{}], nodeName: node2}}\n",
            i + 1,
            i + 1
        ));
    }
    y
}

fn backend_with_mask(mask: u32) -> (NftBackend, Recorder) {
    let recorder = Recorder::default();
    let config = NftConfig {
        conntrack_mark_mask: mask,
        ..config()
    };
    (
        NftBackend::new(config, Box::new(recorder.clone())),
        recorder,
    )
}

/// The value of a `0x…` word.
fn hex(word: &str) -> u32 {
    let digits = word.trim_start_matches("0x");
    u32::from_str_radix(digits, 16).unwrap_or_else(|e| panic!("{word}: {e}"))
}

/// Every statement of `script` that writes or reads a mark, checked against `mask`: the
/// conntrack mark is only cleared in `mask`'s bits or ORed with one of them, and only read
/// through `& mask` (or as the constant `& 0x0 | BIT`); the packet mark is only ORed or XORed
/// with the masquerade bit. Returns how many times each bit of `mask` is set.
fn check_marks(script: &str, mask: u32) -> BTreeMap<u32, usize> {
    let mut set_bits = BTreeMap::new();
    for line in script.lines() {
        let words: Vec<&str> = line
            .split_whitespace()
            .map(|w| w.trim_start_matches('('))
            .collect();
        for (i, w) in words.iter().enumerate() {
            let next = |k: usize| words.get(i + k).copied().unwrap_or("");
            let before = |k: usize| if i >= k { words[i - k] } else { "" };
            if *w == "set" && before(1) == "mark" && before(2) == "ct" {
                // `ct mark set ct mark & ~MASK` or `ct mark set ct mark | BIT`.
                assert_eq!((next(1), next(2)), ("ct", "mark"), "{line}");
                let value = hex(next(4));
                match next(3) {
                    "&" => assert_eq!(value, !mask, "only kpng's bits are cleared: {line}"),
                    "|" => {
                        assert_eq!(value.count_ones(), 1, "{line}");
                        assert_eq!(value & !mask, 0, "a bit outside the mask: {line}");
                        *set_bits.entry(value).or_insert(0) += 1;
                    }
                    other => panic!("a conntrack-mark write that is not masked ({other}): {line}"),
                }
            }
            if *w == "set" && before(1) == "mark" && before(2) == "meta" {
                assert_eq!((next(1), next(2)), ("meta", "mark"), "{line}");
                assert!(matches!(next(3), "or" | "xor"), "{line}");
                assert_eq!(hex(next(4)), 0x4000, "only the masquerade bit: {line}");
            }
            if *w == "ct" && next(1) == "mark" && next(2) != "set" && before(1) != "set" {
                // A read: `ct mark & MASK`, or the constant `ct mark & 0x0 | BIT`.
                assert_eq!(next(2), "&", "an unmasked read: {line}");
                let m = hex(next(3).trim_end_matches(')'));
                assert!(m == mask || (m == 0 && next(4) == "|"), "{line}");
            }
        }
    }
    set_bits
}

#[test]
fn only_kpng_bits_of_the_conntrack_mark_and_the_masquerade_bit_are_written() {
    let model = model_from(&affinity_services(3));
    for mask in [
        affinity::DEFAULT_CONNTRACK_MARK_MASK,
        0x00f0_0000,
        0x0000_0003,
        0x8000_0001,
    ] {
        let (mut b, r) = backend_with_mask(mask);
        full_sync(&mut b, &model);
        let s = scripts(&r);
        let script = &s[0];
        let set_bits = check_marks(script, mask);
        // Each of the four affinity chains sets each bit of the mask with one rule: the rule
        // count depends on the mask's width only.
        assert_eq!(set_bits.len(), mask.count_ones() as usize, "{mask:#x}");
        assert!(
            set_bits.values().all(|n| *n == 4),
            "{mask:#x}: {set_bits:?}"
        );
        // The ids the elements carry are inside the mask, and distinct per list.
        let timeouts = set_elements(script, "ip", "affinity-timeouts");
        let ports = 3.min(affinity::AffinityIds::new(mask).capacity()) as usize;
        assert_eq!(
            timeouts.len(),
            2 * ports,
            "{mask:#x}: 2 lists a port: {timeouts:?}"
        );
        let mut ids: Vec<u32> = timeouts
            .iter()
            .map(|e| hex(e.split_whitespace().next().expect("key")))
            .collect();
        for id in &ids {
            assert_ne!(*id, 0);
            assert_eq!(id & !mask, 0, "{mask:#x}: {id:#x}");
        }
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 2 * ports, "{mask:#x}: distinct ids");
        // The bits of every VIP's cluster id are in `affinity-bits-cluster`.
        for e in set_elements(script, "ip", "affinity-bits-cluster") {
            let bit = hex(e.rsplit(' ').next().expect("bit"));
            assert_eq!(bit.count_ones(), 1, "{e}");
            assert_eq!(bit & !mask, 0, "{e}");
        }
    }
}

#[test]
fn a_full_mask_serves_the_next_affinity_port_without_affinity_until_ids_free_up() {
    // Two bits: ids 1..=3, room for one Service port (two lists).
    let mut model = model_from(&affinity_services(2));
    let (mut b, r) = backend_with_mask(0x3000_0000);
    full_sync(&mut b, &model);
    let s = scripts(&r);
    let dispatch = set_elements(&s[0], "ip", "service-ips");
    let goes = |vip: &str| {
        dispatch
            .iter()
            .find(|e| e.starts_with(vip))
            .unwrap_or_else(|| panic!("{vip} in {dispatch:?}"))
            .clone()
    };
    assert!(
        goes("10.96.1.1 ").contains("goto affinity-cluster"),
        "{}",
        goes("10.96.1.1 ")
    );
    assert!(
        goes("10.96.1.2 ").contains("goto cluster-n2"),
        "{}",
        goes("10.96.1.2 ")
    );
    assert_eq!(set_elements(&s[0], "ip", "affinity-timeouts").len(), 2);

    // The first Service goes: its ids free up, and the second port gets them at its next change
    // (here: the full sync).
    let all = affinity_services(2);
    let without_first: Vec<&str> = all
        .split("---\n")
        .filter(|d| !d.contains("sticky0"))
        .collect();
    let loaded = kpng_source_file::parse_manifests(&without_first.join("---\n")).expect("parses");
    let out = model.apply(Event::Replace {
        kinds: Kind::ALL.to_vec(),
        objects: loaded.objects,
    });
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    b.sync(&SyncRequest {
        diff: &out.diff,
        snapshot: model.snapshot(),
        full: false,
    })
    .expect("partial sync");
    let before = scripts(&r).len();
    full_sync(&mut b, &model);
    let s = scripts(&r)[before..].to_vec();
    let dispatch = set_elements(&s[0], "ip", "service-ips");
    assert!(
        dispatch
            .iter()
            .any(|e| e.starts_with("10.96.1.2 ") && e.contains("goto affinity-cluster")),
        "{dispatch:?}"
    );
    assert!(
        !dispatch.iter().any(|e| e.starts_with("10.96.1.1 ")),
        "{dispatch:?}"
    );
}

#[test]
fn restoring_rules_flushes_chains_and_redeclares_the_skeleton_without_elements() {
    let model = model_from(ONE_SERVICE);
    let (b, _) = backend();
    let fam = Fam(Family::V4);
    let cfg = b.static_config(fam, model.snapshot());
    let chains = [
        ruleset::DynamicChain::Pick(ruleset::PickKind::Cluster, 3),
        ruleset::DynamicChain::AffinityTimeout(600),
    ];
    let text = script::restore_rules(fam, "kpng", &cfg, chains.iter());
    // One transaction: every rule goes, the marker chain is made again (its comment names the
    // skeleton), then the skeleton (sets, maps, chains and their rules) and the dynamic chains
    // come back; the table itself and its elements stay.
    assert!(
        text.starts_with(
            "flush table ip kpng\nadd chain ip kpng skeleton\ndelete chain ip kpng skeleton\n\
             table ip kpng {"
        ),
        "{text}"
    );
    assert!(text.contains(&ruleset::skeleton(fam, "kpng", &cfg)));
    for chain in ["cluster-n3", "affinity-t600"] {
        assert!(
            text.contains(&format!(
                "add chain ip kpng {chain}\nflush chain ip kpng {chain}\n"
            )),
            "{chain}: {text}"
        );
        assert!(
            text.contains(&format!("add rule ip kpng {chain} ")),
            "{chain}"
        );
    }
    assert!(!text.contains("delete table"), "the table is kept");
    assert!(!text.contains("add element"), "elements come over netlink");
}

#[test]
fn a_table_of_another_configuration_gets_its_rules_in_place_and_another_layout_is_replaced() {
    let model = model_from(ONE_SERVICE);
    // The kernel's table: our layout, another skeleton (another configuration).
    let (mut b, r, w) = netlink_backend();
    let other = Family::ALL
        .iter()
        .map(|f| {
            let marker = format!("kpng layout {} skeleton 0123456789abcdef", ruleset::LAYOUT);
            (*f, ProbedTable::Present(marker))
        })
        .collect();
    *w.tables.lock().expect("lock") = other;
    let ops = full_sync(&mut b, &model);
    let s = scripts(&r);
    for (i, f) in ["ip", "ip6"].iter().enumerate() {
        assert!(
            s[i].starts_with(&format!(
                "flush table {f} kpng\nadd chain {f} kpng skeleton\ndelete chain {f} kpng skeleton\n"
            )),
            "rules put back in place: {}",
            s[i]
        );
        assert!(!s[i].contains("add element") && !s[i].contains("delete table"));
    }
    let batches = w.recorded();
    assert_eq!(batches.len(), 2, "then one element transaction per family");
    assert!(batches.iter().all(|b| !b.flushed().is_empty()));
    assert_eq!(batches.iter().map(|b| b.adds).sum::<usize>(), ops);

    // Another layout, no marker at all (an older kpng), or one of ours: as before.
    for (marker, whole) in [
        (
            format!("kpng layout {} skeleton 00", ruleset::LAYOUT + 1),
            true,
        ),
        (String::new(), true),
    ] {
        let (mut b, r, w) = netlink_backend();
        *w.tables.lock().expect("lock") = Family::ALL
            .iter()
            .map(|f| (*f, ProbedTable::Present(marker.clone())))
            .collect();
        full_sync(&mut b, &model);
        let s = scripts(&r);
        assert_eq!(
            s[0].starts_with("add table ip kpng\ndelete table ip kpng\n"),
            whole,
            "{marker:?}: {}",
            s[0]
        );
        assert!(
            w.recorded().is_empty(),
            "{marker:?}: the elements went as text"
        );
    }
    let (mut b, r, w) = netlink_backend();
    *w.tables.lock().expect("lock") = markers(&b, &model);
    full_sync(&mut b, &model);
    assert!(
        scripts(&r).iter().all(|t| !t.contains("flush table")),
        "our own skeleton is adopted as it is"
    );
}

/// Adopting the table an earlier kpng left (a rolling upgrade from another build, a restart
/// with other flags) says so: "another configuration's rules" read like a conflict with
/// someone else's rules to the operator of a cross-build restart.
#[test]
fn adopting_an_earlier_kpngs_table_says_so() {
    let said = crate::ADOPTING_EARLIER;
    for want in ["earlier kpng", "another build", "adopting"] {
        assert!(said.contains(want), "{want:?} in {said:?}");
    }
    assert!(!said.contains("another configuration's rules"), "{said}");
}

/// A full sync that replaces our own rules after the node's pod CIDRs changed says what
/// changed, not "another configuration's rules" (which reads like someone else's change).
#[test]
fn our_own_configuration_change_says_what_changed() {
    use crate::ruleset::{Fam, StaticConfig};
    use kpng_backend::settings::DetectLocal;
    let node = |cidr: &str| kpng_model::NodeState {
        pod_cidrs: vec![cidr.parse().expect("cidr")],
        ..kpng_model::NodeState::default()
    };
    let on = |cidr: &str, all_local: bool| {
        StaticConfig::new(
            Fam(kpng_model::Family::V4),
            false,
            14,
            0xffff,
            &DetectLocal::NodeCidr,
            &node(cidr),
            all_local,
        )
    };
    let cfg = |cidr: &str| on(cidr, false);
    let cases = [
        (
            "node ports",
            cfg("10.244.1.0/24"),
            on("10.244.1.0/24", true),
            "node ports on the listed addresses → every local address",
        ),
        (
            "pod CIDR",
            cfg("10.244.1.0/24"),
            cfg("10.244.2.0/24"),
            "pod traffic match ip saddr 10.244.1.0/24 → ip saddr 10.244.2.0/24",
        ),
        ("same", cfg("10.244.1.0/24"), cfg("10.244.1.0/24"), "rules"),
    ];
    for (what, was, now, want) in cases {
        assert_eq!(was.change_to(&now), want, "{what}");
    }
}

/// A kernel whose tables someone can flush (`nft flush ruleset`) at a chosen moment of a
/// sync: the probes and the confirmation read what it holds, element transactions to a
/// table that is gone fail, and a text script that creates a table brings it back.
#[derive(Clone)]
struct Flushable {
    inner: RecordingWriter,
    text: Recorder,
    /// Each family's table is gone since the text script of this index (none: present).
    gone: std::sync::Arc<std::sync::Mutex<BTreeMap<Family, usize>>>,
    /// When an element transaction of this family arrives: flush every table, before it
    /// (`true`: it fails) or right after it (it succeeds); once.
    flush_at: std::sync::Arc<std::sync::Mutex<Option<(Family, bool)>>>,
    markers: BTreeMap<Family, String>,
}

impl Flushable {
    fn new(b: &NftBackend, model: &Model, text: Recorder) -> Flushable {
        let markers = Family::ALL
            .iter()
            .map(|f| {
                let cfg = b.static_config(Fam(*f), model.snapshot());
                let skeleton = ruleset::skeleton(Fam(*f), "kpng", &cfg);
                let marker = ruleset::skeleton_marker(&skeleton).expect("marker");
                (*f, marker.to_string())
            })
            .collect();
        let k = Flushable {
            inner: RecordingWriter::default(),
            text,
            gone: Default::default(),
            flush_at: Default::default(),
            markers,
        };
        k.flush();
        k
    }

    /// `nft flush ruleset`, now.
    fn flush(&self) {
        let at = self.text.scripts().len();
        let mut gone = self.gone.lock().expect("lock");
        for f in Family::ALL {
            gone.insert(f, at);
        }
    }

    fn is_gone(&self, family: Family) -> bool {
        let Some(at) = self.gone.lock().expect("lock").get(&family).copied() else {
            return false;
        };
        let create = format!("add table {} kpng", Fam(family).table_family());
        !self.text.scripts()[at..]
            .iter()
            .any(|s| s.starts_with(&create))
    }

    fn table(&self, family: Family) -> ProbedTable {
        if self.is_gone(family) {
            ProbedTable::Absent
        } else {
            ProbedTable::Present(self.markers[&family].clone())
        }
    }
}

impl netlink::ElementWriter for Flushable {
    fn commit(
        &mut self,
        batch: netlink::ElementBatch,
        describe: &dyn Fn(Operation, usize) -> Option<String>,
    ) -> Result<(), netlink::NetlinkError> {
        let family = batch.family();
        let flush = {
            let mut at = self.flush_at.lock().expect("lock");
            match *at {
                Some((f, before)) if f == family => {
                    *at = None;
                    Some(before)
                }
                _ => None,
            }
        };
        if flush == Some(true) {
            self.flush();
        }
        if self.is_gone(family) {
            return Err(netlink::NetlinkError::Injected(
                "No such file or directory".into(),
            ));
        }
        let result = self.inner.commit(batch, describe);
        if flush == Some(false) {
            self.flush();
        }
        result
    }

    fn probe_table(&mut self, family: Family, _table: &str) -> ProbedTable {
        self.table(family)
    }

    fn check_marker(&mut self, family: Family, _table: &str) -> Option<ProbedTable> {
        Some(self.table(family))
    }
}

/// What the notification monitor's report of a foreign change does at the next sync.
fn monitor_told(b: &mut NftBackend) {
    for state in &mut b.states {
        state.kernel = KernelTable::Unknown;
        state.committed = None;
        state.distrust = true;
    }
}

/// A backend on a [`Flushable`] kernel, with the runner's alarm recording what it is told.
fn flushable_backend(
    model: &Model,
) -> (
    NftBackend,
    Flushable,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    let (b, r) = backend();
    let kernel = Flushable::new(&b, model, r);
    let mut b = b.with_netlink(kernel.clone());
    let raised = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = raised.clone();
    b.alarm = Some(TamperAlarm::new(move |t| {
        sink.lock().expect("lock").push(t.what);
    }));
    (b, kernel, raised)
}

/// `systemctl restart nftables`: a flush repaired by a full sync, and a second flush landing
/// right after that sync committed (while the notification monitor had left its group, so
/// no notification would say so). The sync reads its tables back and raises the alarm, so
/// the runner repairs again within milliseconds, instead of the tables staying deleted
/// until the hourly full sync.
#[test]
fn a_flush_right_after_a_repair_is_found_by_the_repairs_confirmation() {
    let model = model_from(ONE_SERVICE);
    let (mut b, kernel, raised) = flushable_backend(&model);
    full_sync(&mut b, &model);
    assert!(
        raised.lock().expect("lock").is_empty(),
        "the first sync is confirmed"
    );
    // The first flush, then its repair; the second flush lands right after the repair's
    // last element transaction (the IPv6 table's).
    kernel.flush();
    monitor_told(&mut b);
    *kernel.flush_at.lock().expect("lock") = Some((Family::V6, false));
    try_full_sync(&mut b, &model).expect("the repair commits");
    assert_eq!(
        *raised.lock().expect("lock"),
        ["ip kpng and ip6 kpng: table deleted, again, right after kpng's sync committed it"]
    );
    assert!(kernel.is_gone(Family::V4) && kernel.is_gone(Family::V6));
    // The runner's next repair looks at both tables again and creates them.
    try_full_sync(&mut b, &model).expect("the second repair");
    assert!(!kernel.is_gone(Family::V4) && !kernel.is_gone(Family::V6));
    assert_eq!(raised.lock().expect("lock").len(), 1, "confirmed");
}

/// A flush during a repair that makes the IPv6 transaction fail, after the IPv4 table was
/// refilled: the first retry looks at both tables again (the IPv4 one went too) and creates
/// them, rather than refilling a table it trusted and failing the same way.
#[test]
fn a_flush_failing_one_family_makes_the_first_retry_look_at_every_table_again() {
    let model = model_from(ONE_SERVICE);
    let (mut b, kernel, _raised) = flushable_backend(&model);
    full_sync(&mut b, &model);
    *kernel.flush_at.lock().expect("lock") = Some((Family::V6, true));
    let err = try_full_sync(&mut b, &model).expect_err("the IPv6 transaction fails");
    assert!(err.to_string().contains("No such file"), "{err}");
    try_full_sync(&mut b, &model).expect("the first retry creates both tables");
    assert!(!kernel.is_gone(Family::V4) && !kernel.is_gone(Family::V6));
}

/// A table deleted when no notification could say so is found by the next periodic sync
/// (one chain request per table), not at the hourly full sync.
#[test]
fn the_periodic_sync_finds_a_deleted_table() {
    let model = model_from(ONE_SERVICE);
    let (mut b, kernel, raised) = flushable_backend(&model);
    full_sync(&mut b, &model);
    let periodic = |b: &mut NftBackend| {
        b.sync(&SyncRequest {
            diff: &Diff::default(),
            snapshot: model.snapshot(),
            full: false,
        })
        .expect("sync")
    };
    periodic(&mut b);
    assert!(
        raised.lock().expect("lock").is_empty(),
        "in place: nothing said"
    );
    kernel.flush();
    periodic(&mut b);
    assert_eq!(
        *raised.lock().expect("lock"),
        ["ip kpng and ip6 kpng: table deleted, found by the periodic check"]
    );
    try_full_sync(&mut b, &model).expect("the repair");
    assert!(!kernel.is_gone(Family::V4) && !kernel.is_gone(Family::V6));
}

// ---------------------------------------------------------------------------------------------
// Affinity ids across a restart (read back from the adopted table)
// ---------------------------------------------------------------------------------------------

/// The model of `affinity_services(n)` without the Services named in `without`, plus those of
/// `extra` (more YAML documents).
fn affinity_model(n: usize, without: &[&str], extra: &str) -> Model {
    let all = affinity_services(n);
    let kept: Vec<&str> = all
        .split("---\n")
        .filter(|d| !without.iter().any(|w| d.contains(&format!("name: {w}"))))
        .collect();
    let mut yaml = kept.join("---\n");
    yaml.push_str(extra);
    model_from(&yaml)
}

/// The marks `b` gave each affinity port of `model`, by Service name.
fn marks_by_service(b: &NftBackend, model: &Model) -> BTreeMap<String, affinity::Marks> {
    model
        .snapshot()
        .ports
        .values()
        .filter_map(|p| {
            let owner = b.owners.get(&p.key)?;
            Some((p.key.service.name.to_string(), b.affinity_ids.get(owner)?))
        })
        .collect()
}

/// What the kernel's IPv4 table holds after `b` programmed `model`: the `affinity-bits-*`
/// elements, and one live affinity entry per port from `client` to its first endpoint.
fn kernel_affinity_sets(b: &NftBackend, model: &Model, client: &str) -> netlink::SetKeys {
    let mut sets: BTreeMap<Set, Vec<Key>> = BTreeMap::new();
    let snapshot = model.snapshot();
    for port in snapshot.family(Family::V4) {
        let Some(owner) = b.owners.get(&port.key) else {
            continue;
        };
        for e in b.port_elements(port, owner, &snapshot.node.ips) {
            if matches!(e.set, Set::AffinityBits(_)) {
                sets.entry(e.set).or_default().push(e.key);
            }
        }
        if let Some(marks) = b.affinity_ids.get(owner) {
            let client = client.parse().expect("client");
            sets.entry(Set::Affinity)
                .or_default()
                .push(Key::ClientMark(client, marks.cluster));
        }
    }
    sets.into_iter()
        .map(|(set, keys)| (Family::V4, set, keys))
        .collect()
}

/// A restart over the earlier run's table with `sticky0` removed and `sticky9` added: `sticky1`
/// and `sticky2` keep their ids (their clients' affinity entries are keyed by them), and
/// neither `sticky9` nor anyone gets `sticky0`'s id, which a client still has an entry under.
/// The ids are read once, at the first sync: later syncs read no set. Without the data (a
/// table of an older kpng), ids are allocated afresh.
#[test]
fn a_restart_over_the_table_keeps_each_ports_affinity_id() {
    let first = affinity_model(3, &[], "");
    let (mut earlier, _, _) = netlink_backend();
    full_sync(&mut earlier, &first);
    let before = marks_by_service(&earlier, &first);
    assert_eq!(before.len(), 3, "{before:?}");
    let sets = kernel_affinity_sets(&earlier, &first, "192.168.100.50");

    let sticky9 = "---\nkind: Service\nmetadata: {namespace: ns, name: sticky9}\nspec: {clusterIP: 10.96.1.99, sessionAffinity: ClientIP, ports: [{name: p, port: 80}]}\n---\nkind: EndpointSlice\nmetadata: {namespace: ns, name: sticky9-1, labels: {kubernetes.io/service-name: sticky9}}\naddressType: IPv4\nports: [{name: p, port: 8080}]\nendpoints:\n- {addresses: [10.244.1.99], nodeName: node1}\n";
    let second = affinity_model(3, &["sticky0"], sticky9);
    struct Case {
        what: &'static str,
        sets: netlink::SetKeys,
        kept: bool,
    }
    let cases = [
        Case {
            what: "the table holds the ids",
            sets: sets.clone(),
            kept: true,
        },
        Case {
            what: "a table without affinity-bits sets (an older kpng's)",
            sets: Vec::new(),
            kept: false,
        },
    ];
    for case in cases {
        let (mut b, _, w) = netlink_backend();
        keep_table(&w, &b, &second, Family::V4);
        *w.sets.lock().expect("lock") = case.sets;
        full_sync(&mut b, &second);
        let after = marks_by_service(&b, &second);
        let reads = *w.set_listings.lock().expect("lock");
        if case.kept {
            for name in ["sticky1", "sticky2"] {
                assert_eq!(after.get(name), before.get(name), "{}: {name}", case.what);
            }
            let old = before.get("sticky0").expect("sticky0");
            assert!(
                after.values().all(|m| m != old),
                "{}: sticky0's id went to another port: {after:?}",
                case.what
            );
            assert_eq!(reads, 5, "four affinity-bits sets and the affinity map");
        } else {
            assert_eq!(
                after.get("sticky1"),
                before.get("sticky0"),
                "{}: fresh allocation, in key order",
                case.what
            );
        }
        // Partial and full syncs after the first read nothing.
        let mut third = affinity_model(3, &["sticky0"], sticky9);
        let all = affinity_services(3);
        let kept: Vec<&str> = all
            .split("---\n")
            .filter(|d| !d.contains("name: sticky0") && !d.contains("name: sticky2"))
            .collect();
        let loaded =
            kpng_source_file::parse_manifests(&(kept.join("---\n") + sticky9)).expect("parses");
        let out = third.apply(Event::Replace {
            kinds: Kind::ALL.to_vec(),
            objects: loaded.objects,
        });
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        b.sync(&SyncRequest {
            diff: &out.diff,
            snapshot: third.snapshot(),
            full: false,
        })
        .expect("partial sync");
        full_sync(&mut b, &third);
        assert_eq!(
            *w.set_listings.lock().expect("lock"),
            reads,
            "{}: the sync loop read a set",
            case.what
        );
        assert_eq!(
            marks_by_service(&b, &third).get("sticky1"),
            after.get("sticky1"),
            "{}",
            case.what
        );
    }
}

// ---------------------------------------------------------------------------------------------
// A restart over kpng's own table: only what differs is sent
// ---------------------------------------------------------------------------------------------

use crate::ruleset::PickKind;
use kpng_model::Protocol;

/// An IPv4-only backend whose netlink batches `w` records, with kpng's table in the kernel
/// already (its marker as `model`'s skeleton writes it), and its text recorder.
///
/// Why: the start of every test of how a full sync adopts a table it finds and compares its
/// sets with what it wants.
fn adopting_v4_backend(model: &Model) -> (NftBackend, RecordingWriter, Recorder) {
    let (b, r) = backend();
    let w = RecordingWriter::default();
    let mut b = b.with_netlink(w.clone());
    b.config.families = vec![Family::V4];
    b.states.retain(|s| s.fam.0 == Family::V4);
    keep_table(&w, &b, model, Family::V4);
    (b, w, r)
}

/// The elements `b` wants in `family`'s table for `model` (each once), as a table it committed
/// holds them.
fn wanted_elements(b: &mut NftBackend, model: &Model, family: Family) -> Vec<Element> {
    let mut store = ElementStore::new();
    let mut out = Vec::new();
    b.each_owner(Fam(family), model.snapshot(), |owner, elements| {
        for e in elements {
            if store.build_one(owner, &e) == store::Built::Emit {
                out.push(e);
            }
        }
    });
    out
}

/// A restart over the table an earlier run left, with its skeleton: the first full sync reads
/// each owned set once and sends only the difference, in one transaction: nothing over an
/// identical table; one delete and one add for a stale and a missing element (a foreign
/// element is the stale one); a delete and an add of the same key for a changed value; a
/// changed range refills its set alone. A table it cannot read, or that differs by more than
/// half, is flushed and refilled as before. Every later full sync over the table reads it
/// again the same way; the sync loop never reads elements.
#[test]
fn a_restart_over_its_own_table_sends_only_what_differs() {
    let model = model_from(&many_services(20, 2));
    let ip = |s: &str| -> std::net::IpAddr { s.parse().expect("ip") };
    let foreign = Element {
        set: Set::ClusterIps,
        key: Key::Addr(ip("10.96.99.99")),
        value: None,
        comment: None,
    };
    type Edit = fn(&mut Vec<Element>, &Element);
    struct Case {
        what: &'static str,
        edit: Edit,
        /// A catch-all element in `service-ips` (no key: cannot be decoded).
        catch_all: bool,
        /// The fake answers the dump.
        readable: bool,
        /// Expected (deletes, adds, flushed sets); `None`: flushed and refilled.
        diff: Option<(usize, usize, Vec<Set>)>,
    }
    let cases = [
        Case {
            what: "identical table",
            edit: |_, _| {},
            catch_all: false,
            readable: true,
            diff: Some((0, 0, vec![])),
        },
        Case {
            what: "a stale (foreign) element and a missing one",
            edit: |held, foreign| {
                let i = held
                    .iter()
                    .position(|e| e.set == Set::Endpoints(PickKind::Cluster, Protocol::Tcp))
                    .expect("an endpoint");
                held.remove(i);
                held.push(foreign.clone());
            },
            catch_all: false,
            readable: true,
            diff: Some((1, 1, vec![])),
        },
        Case {
            what: "a value changed by someone",
            edit: |held, _| {
                let e = held
                    .iter_mut()
                    .find(|e| e.set == Set::ServiceIps)
                    .expect("a dispatch element");
                e.value = Some(value::Value::Verdict(value::Verdict::goto(
                    value::FixedChain::Reject,
                )));
            },
            catch_all: false,
            readable: true,
            diff: Some((1, 1, vec![])),
        },
        Case {
            what: "a range changed: its set alone is refilled",
            edit: |held, _| {
                let e = held
                    .iter_mut()
                    .find(|e| e.set == Set::ServiceCidrs)
                    .expect("a service CIDR");
                e.key = Key::Net("10.96.0.0/12".parse().expect("net"));
            },
            catch_all: false,
            readable: true,
            diff: Some((0, 1, vec![Set::ServiceCidrs])),
        },
        Case {
            what: "more than half differs",
            edit: |held, _| held.retain(|e| e.set == Set::ServiceCidrs),
            catch_all: false,
            readable: true,
            diff: None,
        },
        Case {
            what: "an element that cannot be decoded",
            edit: |_, _| {},
            catch_all: true,
            readable: true,
            diff: None,
        },
        Case {
            what: "the sets cannot be read",
            edit: |_, _| {},
            catch_all: false,
            readable: false,
            diff: None,
        },
    ];
    for case in cases {
        let (mut b, w, _r) = adopting_v4_backend(&model);
        let mut held = wanted_elements(&mut b, &model, Family::V4);
        (case.edit)(&mut held, &foreign);
        if case.readable {
            *w.contents.lock().expect("lock") = vec![(Family::V4, held)];
        }
        if case.catch_all {
            w.held_extra.lock().expect("lock").push((
                Family::V4,
                Set::ServiceIps,
                kpng_netfilter::elements::Element {
                    flags: 4,
                    verdict: Some(kpng_netfilter::elements::Verdict {
                        code: kpng_netfilter::attr::NF_DROP,
                        chain: None,
                    }),
                    ..Default::default()
                },
            ));
        }
        let stats = try_full_sync(&mut b, &model).expect("sync");
        assert_eq!(stats.kept_rules, [Family::V4], "{}", case.what);
        let batches = w.recorded();
        let got = batches
            .iter()
            .map(|b| (b.deletes, b.adds, b.flushed()))
            .collect::<Vec<_>>();
        match &case.diff {
            Some((0, 0, _)) => assert_eq!(got, vec![], "{}: nothing sent", case.what),
            Some(diff) => assert_eq!(got, vec![diff.clone()], "{}", case.what),
            None => {
                assert_eq!(got.len(), 1, "{}: one transaction", case.what);
                assert_eq!(
                    got[0].2,
                    Set::owned(Family::V4).collect::<Vec<_>>(),
                    "{}: every set flushed",
                    case.what
                );
                assert_eq!(got[0].1, stats.operations, "{}", case.what);
            }
        }
        if case.what == "a stale (foreign) element and a missing one" {
            // The delete names the foreign element; the add, the missing endpoint.
            let deletes: Vec<_> = batches[0]
                .messages
                .iter()
                .filter(|m| m.op == Operation::Delete)
                .map(|m| m.set)
                .collect();
            let adds: Vec<_> = batches[0]
                .messages
                .iter()
                .filter(|m| m.op == Operation::Add)
                .map(|m| m.set)
                .collect();
            assert_eq!(deletes, [Set::ClusterIps]);
            assert_eq!(adds, [Set::Endpoints(PickKind::Cluster, Protocol::Tcp)]);
        }
        // The next full sync (`--full-sync-period`) reads the sets again, once each, and
        // decides the same way (the fake does not apply what was sent); the partial and
        // periodic syncs in between read nothing
        // (`an_adopted_tables_unreferenced_dynamic_chains_go_at_the_full_sync`).
        let listings = *w.element_listings.lock().expect("lock");
        let sent = w.recorded().len();
        full_sync(&mut b, &model);
        let read = *w.element_listings.lock().expect("lock") - listings;
        let again = w.recorded().split_off(sent);
        match &case.diff {
            Some((0, 0, _)) => assert_eq!(again.len(), 0, "{}: nothing sent again", case.what),
            Some((deletes, adds, _)) => assert_eq!(
                (again.len(), again[0].deletes, again[0].adds),
                (1, *deletes, *adds),
                "{}: the same difference again",
                case.what
            ),
            None => assert_eq!(
                again.last().map(|b| b.flushed()),
                Some(Set::owned(Family::V4).collect::<Vec<_>>()),
                "{}: refilled again",
                case.what
            ),
        }
        if case.readable {
            assert!(
                read >= 1,
                "{}: the full sync read the sets again",
                case.what
            );
        }
    }
}

/// A difference the kernel refuses fails the full sync, and the retry flushes and refills
/// without reading (trusting nothing it read, and naming the element the kernel rejects); the
/// full sync after that one reads again.
#[test]
fn a_refused_difference_is_retried_as_a_refill() {
    let model = model_from(&many_services(20, 2));
    let (mut b, w, _r) = adopting_v4_backend(&model);
    let mut held = wanted_elements(&mut b, &model, Family::V4);
    let dispatch = held
        .iter()
        .position(|e| e.set == Set::ServiceIps)
        .expect("a dispatch element");
    held.remove(dispatch);
    *w.contents.lock().expect("lock") = vec![(Family::V4, held)];
    *w.fail_with.lock().expect("lock") = Some("injected".into());
    try_full_sync(&mut b, &model).expect_err("the difference is refused");
    *w.fail_with.lock().expect("lock") = None;
    let listings = *w.element_listings.lock().expect("lock");
    full_sync(&mut b, &model);
    assert_eq!(
        *w.element_listings.lock().expect("lock"),
        listings,
        "the retry read nothing"
    );
    let last = w.recorded().pop().expect("a refill");
    assert_eq!(last.flushed(), Set::owned(Family::V4).collect::<Vec<_>>());
    full_sync(&mut b, &model);
    assert!(*w.element_listings.lock().expect("lock") > listings);
    let last = w.recorded().pop().expect("the difference");
    assert_eq!((last.deletes, last.adds, last.flushed()), (0, 1, vec![]));
}

/// A repair of someone else's change to a table that keeps kpng's skeleton (its marker
/// chain): the rules are put back by text (`restore_rules`: every chain flushed and declared
/// again, no element), and the sets get only what differs, read once each: a flushed map is
/// refilled alone (deleted 0, added its elements), not every set of the table. A repair of a
/// table whose marker is gone replaces it whole, as before.
#[test]
fn a_repair_of_a_table_with_its_skeleton_sends_only_what_differs() {
    let model = model_from(&many_services(20, 2));
    let (mut b, w, r) = adopting_v4_backend(&model);
    let wanted = wanted_elements(&mut b, &model, Family::V4);
    *w.contents.lock().expect("lock") = vec![(Family::V4, wanted.clone())];
    full_sync(&mut b, &model);
    // Someone flushes `service-ips`; the monitor's report makes the next full sync a repair.
    let flushed: Vec<Element> = wanted
        .iter()
        .filter(|e| e.set != Set::ServiceIps)
        .cloned()
        .collect();
    let lost = wanted.len() - flushed.len();
    assert!(lost >= 20, "one dispatch element per Service port: {lost}");
    *w.contents.lock().expect("lock") = vec![(Family::V4, flushed)];
    b.states[0].kernel = KernelTable::Unknown;
    b.states[0].committed = None;
    b.states[0].distrust = true;
    let before = (w.recorded().len(), scripts(&r).len());
    let stats = try_full_sync(&mut b, &model).expect("the repair");
    let sent = w.recorded().split_off(before.0);
    assert_eq!(
        sent.iter()
            .map(|b| (b.deletes, b.adds, b.flushed()))
            .collect::<Vec<_>>(),
        vec![(0, lost, vec![])],
        "only the flushed map's elements are added"
    );
    assert_eq!(stats.operations, lost);
    let text = scripts(&r).split_off(before.1);
    assert!(
        text.iter().any(|t| t.starts_with("flush table ip kpng\n")),
        "the rules are put back first: {text:?}"
    );
    // The marker gone (someone replaced the table): replaced whole, nothing read.
    w.tables.lock().expect("lock").clear();
    w.tables
        .lock()
        .expect("lock")
        .push((Family::V4, ProbedTable::Present(String::new())));
    b.states[0].kernel = KernelTable::Unknown;
    b.states[0].committed = None;
    b.states[0].distrust = true;
    let listings = *w.element_listings.lock().expect("lock");
    full_sync(&mut b, &model);
    assert_eq!(*w.element_listings.lock().expect("lock"), listings);
}
