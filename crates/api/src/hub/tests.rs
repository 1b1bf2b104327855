//! Protocol tests of the brain: op order, per-node views, coalescing for slow watchers.

use crate::fixtures::Logs;
use std::sync::Arc;

use futures_free::block_on;
use kpng_model::{ClusterConfig, ClusterModel, Event};
use prost::Message;
use serde_json::json;

use super::*;
use crate::fixtures;
use crate::proto::op_item::Op;

/// Minimal executor: every future here is ready at once (pending change sets are taken
/// synchronously), so no runtime is needed.
mod futures_free {
    pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(v) => v,
            std::task::Poll::Pending => panic!("nothing to send yet"),
        }
    }
}

fn hub() -> Arc<Hub> {
    Arc::new(Hub::new(
        ClusterModel::new(ClusterConfig::default()),
        crate::metrics::ApiMetrics::default(),
    ))
}

/// The ops of the next change set, as short strings. Checks on the way that the frames the
/// server sends (shared, in chunks) are exactly these ops encoded one by one.
fn next(reg: &Registration) -> Vec<String> {
    let pending = block_on(reg.slot.next());
    let ops: Vec<proto::OpItem> = pending.ops().collect();
    let mut frames = pending.frames(reg.hub.replay_cache(), false);
    let mut sent = Vec::new();
    for chunk in frames.by_ref() {
        sent.extend_from_slice(&chunk);
    }
    assert_eq!(
        sent,
        crate::frames::frames_of(&ops).to_vec(),
        "frames differ from the ops"
    );
    // To a watcher that reads bundles: the same ops once the bundles are opened.
    let mut bundled = pending.frames(reg.hub.replay_cache(), true);
    let mut received = Vec::new();
    for chunk in bundled.by_ref() {
        received.extend_from_slice(&chunk);
    }
    assert_eq!(
        unbundled(&received),
        ops,
        "bundled frames differ from the ops"
    );
    assert_eq!(bundled.ops(), frames.ops());
    let syncs = ops
        .iter()
        .filter(|o| matches!(o.op, Some(Op::Sync(_))))
        .count();
    assert_eq!(frames.ops() as usize, ops.len() - syncs);
    assert_eq!(frames.synced(), syncs == 1);
    ops.into_iter().map(describe).collect()
}

/// How many bundles a stream's bytes hold.
fn count_bundles(mut rest: &[u8]) -> usize {
    let mut bundles = 0;
    while !rest.is_empty() {
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let item = proto::OpItem::decode(&rest[5..5 + len]).expect("an OpItem");
        bundles += usize::from(matches!(item.op, Some(Op::Bundle(_))));
        rest = &rest[5 + len..];
    }
    bundles
}

/// The ops of a stream's bytes, each bundle replaced by the ops it holds.
fn unbundled(mut bytes: &[u8]) -> Vec<proto::OpItem> {
    let mut ops = Vec::new();
    while !bytes.is_empty() {
        let len = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
        let item = proto::OpItem::decode(&bytes[5..5 + len]).expect("an OpItem");
        match item.op {
            Some(Op::Bundle(b)) => ops.extend(crate::bundle::unbundle(&b).expect("a bundle")),
            _ => ops.push(item),
        }
        bytes = &bytes[5 + len..];
    }
    ops
}

fn describe(item: proto::OpItem) -> String {
    match item.op.expect("op") {
        Op::Reset(_) => "reset".into(),
        Op::Sync(_) => "sync".into(),
        Op::Set(v) => {
            let r = v.r#ref.expect("ref");
            match proto::Set::try_from(r.set).expect("set") {
                proto::Set::ServicesSet => format!("set svc {}", r.path),
                proto::Set::EndpointsSet => {
                    let ep = proto::Endpoint::decode(v.bytes).expect("endpoint");
                    let local = if ep.local { " local" } else { "" };
                    format!("set ep {}{local}", r.path)
                }
                proto::Set::KpngNodeSet => format!("node {}", r.path),
                proto::Set::KpngServiceCidRsSet => {
                    let v = proto::KpngServiceCidRs::decode(v.bytes).expect("cidrs");
                    format!("cidrs {}", v.cid_rs.join(","))
                }
                other => format!("set {other:?}"),
            }
        }
        Op::Delete(r) => match proto::Set::try_from(r.set).expect("set") {
            proto::Set::ServicesSet => format!("del svc {}", r.path),
            proto::Set::KpngNodeSet => format!("del node {}", r.path),
            _ => format!("del ep {}", r.path),
        },
        // `Pending::ops` gives single ops only.
        Op::Bundle(b) => format!("bundle of {}", b.ops),
    }
}

fn ready(reg: &Registration) -> bool {
    reg.slot.lock().is_ready()
}

/// The fixture's `np-local` slice with ready endpoints `ips` (address, node).
fn slice(ips: &[(&str, &str)]) -> Event {
    slice_of(
        ips.iter()
            .map(|(ip, node)| json!({"addresses": [ip], "nodeName": node}))
            .collect(),
    )
}

/// The fixture's `np-local` slice with these endpoints (EndpointSlice JSON).
fn slice_of(endpoints: Vec<serde_json::Value>) -> Event {
    Event::Apply(
        kpng_k8s::from_json::<k8s_openapi::api::discovery::v1::EndpointSlice>(json!({
            "metadata": {"namespace": "default", "name": "np-local-1",
                         "labels": {"kubernetes.io/service-name": "np-local"}},
            "addressType": "IPv4",
            "ports": [{"name": "", "port": 8080}],
            "endpoints": endpoints
        }))
        .expect("slice")
        .object,
    )
}

#[test]
fn nothing_is_served_before_the_cluster_is_listed_then_reset_everything_sync() {
    let hub = hub();
    let n1 = hub.register("n1");
    assert!(!ready(&n1), "not synced yet");
    hub.apply(fixtures::cluster_event());
    let ops = next(&n1);
    assert_eq!(ops[0], "reset");
    assert_eq!(ops[1], "node n1");
    assert_eq!(ops.last().map(String::as_str), Some("sync"));
    // Every endpoint comes after its Service.
    let mut seen_services = Vec::new();
    for op in &ops {
        if let Some(path) = op.strip_prefix("set svc ") {
            seen_services.push(path.to_string());
        }
        if let Some(path) = op.strip_prefix("set ep ") {
            let svc: Vec<&str> = path.split('/').take(2).collect();
            assert!(
                seen_services.contains(&svc.join("/")),
                "{op} before its Service in {ops:?}"
            );
        }
    }
    assert_eq!(seen_services.len(), 6, "{ops:?}");
    assert!(
        ops.contains(&"set ep default/np-local/10.244.1.3 local".to_string()),
        "{ops:?}"
    );
    assert!(!ready(&n1), "nothing more until something changes");
}

#[test]
fn every_watcher_gets_its_own_node_view() {
    let hub = hub();
    hub.apply(fixtures::cluster_event());
    let watchers: Vec<(&str, Registration)> = ["n1", "n2", "n3"]
        .into_iter()
        .map(|n| (n, hub.register(n)))
        .collect();
    assert_eq!(hub.metrics().clients_connected.get(), 3);
    for (name, reg) in &watchers {
        let ops = next(reg);
        let local: Vec<&String> = ops
            .iter()
            .filter(|o| o.starts_with("set ep default/np-local/") && o.ends_with(" local"))
            .collect();
        let want = match *name {
            "n1" => vec!["set ep default/np-local/10.244.1.3 local"],
            "n2" => vec!["set ep default/np-local/10.244.2.3 local"],
            _ => vec![],
        };
        assert_eq!(
            local,
            want.iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .iter()
                .collect::<Vec<_>>(),
            "{name}"
        );
    }
    drop(watchers);
    assert_eq!(hub.metrics().clients_connected.get(), 0);
}

#[test]
fn the_nodes_no_watcher_asks_for_and_the_watchers_no_node_has_are_named() {
    let hub = hub();
    hub.apply(fixtures::cluster_event());
    let all = hub.not_connected();
    assert!(all.len() >= 2, "the fixture's Nodes: {all:?}");
    assert!(all.windows(2).all(|w| w[0] < w[1]), "sorted: {all:?}");
    let first = hub.register(&all[0]);
    assert_eq!(hub.unknown_watchers(), Vec::<String>::new());
    // A watcher for a node the cluster does not know changes nothing here, and is named as
    // unknown (its kpng gets no local endpoint and cannot see why).
    let _stranger = hub.register("not-a-node");
    assert_eq!(hub.not_connected(), all[1..]);
    assert_eq!(hub.unknown_watchers(), ["not-a-node"]);
    drop(first);
    assert_eq!(
        hub.not_connected(),
        all,
        "a watcher that leaves is missed again"
    );
}

#[test]
fn a_change_sends_only_its_difference_and_deletes_after_sets() {
    let hub = hub();
    hub.apply(fixtures::cluster_event());
    let n3 = hub.register("n3");
    next(&n3);
    // 10.244.2.3 replaced by 10.244.2.9; 10.244.1.3 stays.
    hub.apply(slice(&[("10.244.1.3", "n1"), ("10.244.2.9", "n2")]));
    assert_eq!(
        next(&n3),
        [
            "set ep default/np-local/10.244.2.9",
            "del ep default/np-local/10.244.2.3",
            "sync"
        ]
    );
    // Service deleted: its endpoints go first.
    hub.apply(Event::Delete(kpng_model::ObjectRef {
        kind: kpng_model::Kind::Service,
        namespace: "default".into(),
        name: "np-local".into(),
    }));
    assert_eq!(
        next(&n3),
        [
            "del ep default/np-local/10.244.1.3",
            "del ep default/np-local/10.244.2.9",
            "del svc default/np-local",
            "sync"
        ]
    );
}

/// The chunks of the next change set, checked against its ops as [`next`] does.
fn next_chunks(reg: &Registration) -> (Vec<String>, Vec<Bytes>) {
    let pending = block_on(reg.slot.next());
    let ops: Vec<proto::OpItem> = pending.ops().collect();
    let chunks: Vec<Bytes> = pending.frames(reg.hub.replay_cache(), false).collect();
    assert_eq!(chunks.concat(), crate::frames::frames_of(&ops).to_vec());
    (ops.into_iter().map(describe).collect(), chunks)
}

#[test]
fn one_event_is_encoded_once_for_every_node_that_does_not_depend_on_it() {
    let hub = hub();
    hub.apply(fixtures::cluster_event());
    let n1 = hub.register("n1");
    let n3 = hub.register("n3");
    let stranger = hub.register("not-a-node");
    for reg in [&n1, &n3, &stranger] {
        next(reg);
    }
    hub.apply(slice(&[("10.244.1.3", "n1"), ("10.244.2.9", "n2")]));
    let (n3_ops, n3_chunks) = next_chunks(&n3);
    let (stranger_ops, stranger_chunks) = next_chunks(&stranger);
    let want = [
        "set ep default/np-local/10.244.2.9",
        "del ep default/np-local/10.244.2.3",
        "sync",
    ];
    assert_eq!(n3_ops, want);
    assert_eq!(stranger_ops, want);
    assert_eq!(n3_chunks.len(), 1, "one chunk, Sync included");
    assert_eq!(
        n3_chunks[0].as_ptr(),
        stranger_chunks[0].as_ptr(),
        "the same bytes, not a copy per node"
    );
    // n1 runs an endpoint of the Service: its own view; it holds the version before both
    // events, so they are folded into one.
    hub.apply(slice(&[("10.244.1.3", "n1"), ("10.244.2.10", "n2")]));
    assert_eq!(
        next(&n1),
        [
            "set ep default/np-local/10.244.2.10",
            "del ep default/np-local/10.244.2.3",
            "sync"
        ]
    );
    let (_, n3_chunks) = next_chunks(&n3);
    let (_, stranger_next) = next_chunks(&stranger);
    assert_eq!(n3_chunks[0].as_ptr(), stranger_next[0].as_ptr());
    assert_ne!(
        n3_chunks[0].as_ptr(),
        stranger_chunks[0].as_ptr(),
        "another event, other bytes"
    );
    // One event that moves n1's own endpoint: n1 gets its view, not the shared bytes.
    hub.apply(slice(&[("10.244.1.4", "n1"), ("10.244.2.10", "n2")]));
    assert_eq!(
        next(&n1),
        [
            "set ep default/np-local/10.244.1.4 local",
            "del ep default/np-local/10.244.1.3",
            "sync"
        ]
    );
    assert_eq!(next(&n3), next(&stranger));
}

#[test]
fn a_slow_watcher_blocks_nobody_and_gets_one_coalesced_change_set() {
    let hub = hub();
    hub.apply(fixtures::cluster_event());
    let fast = hub.register("n1");
    let slow = hub.register("n2");
    next(&fast);
    next(&slow);
    for i in 0..50 {
        hub.apply(slice(&[
            ("10.244.1.3", "n1"),
            (&format!("10.244.2.{}", 10 + i), "n2"),
        ]));
        // The fast watcher sees every change.
        assert_eq!(next(&fast).len(), 3, "change {i}");
    }
    // The slow one never asked; it now gets the net difference since its last change set.
    assert_eq!(
        next(&slow),
        [
            "set ep default/np-local/10.244.2.59 local",
            "del ep default/np-local/10.244.2.3",
            "sync"
        ]
    );
    // A change and its undo cancel out: nothing to send (not even a Sync).
    hub.apply(slice(&[("10.244.1.3", "n1"), ("10.244.2.99", "n2")]));
    hub.apply(slice(&[("10.244.1.3", "n1"), ("10.244.2.59", "n2")]));
    assert!(next(&slow).is_empty());
}

#[test]
fn a_change_that_does_not_concern_a_node_sends_nothing() {
    let hub = hub();
    hub.apply(fixtures::cluster_event());
    let n3 = hub.register("n3");
    next(&n3);
    // A terminating, not serving endpoint is usable nowhere: n3's view does not change, when
    // it comes or when it goes, so nothing is sent, not even a Sync.
    hub.apply(slice_of(vec![
        json!({"addresses": ["10.244.1.3"], "nodeName": "n1"}),
        json!({"addresses": ["10.244.2.3"], "nodeName": "n2"}),
        json!({"addresses": ["10.244.1.77"], "nodeName": "n1",
               "conditions": {"ready": false, "serving": false, "terminating": true}}),
    ]));
    assert!(next(&n3).is_empty());
    assert!(!ready(&n3), "taken");
    hub.apply(slice(&[("10.244.1.3", "n1"), ("10.244.2.3", "n2")]));
    assert!(next(&n3).is_empty());
}

/// A deleted Node keeps its zone for the endpoints the brain chooses, as the node's own
/// `NodeMemory` and upstream's `NodeTopologyConfig` (which ignores a Node's deletion) do:
/// dropping it would send the node's zone-hinted Services across zones until the Node is back.
/// A re-created Node without the label clears it.
#[test]
fn a_deleted_node_keeps_its_zone() {
    let hub = hub();
    hub.apply(fixtures::cluster_event());
    let n1 = hub.register("n1");
    next(&n1);
    let delete = || {
        Event::Delete(kpng_model::ObjectRef {
            kind: kpng_model::Kind::Node,
            namespace: "".into(),
            name: "n1".into(),
        })
    };
    hub.apply(delete());
    let ops = next(&n1);
    assert!(
        !ops.iter().any(|op| op.contains("other/zoned")),
        "the zone-hinted endpoints stay as they were: {ops:?}"
    );
    let everything = |_: &str, _: &str| true;
    assert_eq!(
        hub.node_view("n1", &everything).node.zone.as_deref(),
        Some("za")
    );
    // Re-created without a zone: hints no longer apply, every endpoint is used.
    hub.apply(Event::Apply(
        kpng_k8s::from_json::<k8s_openapi::api::core::v1::Node>(
            json!({"metadata": {"name": "n1"}}),
        )
        .expect("node")
        .object,
    ));
    let ops = next(&n1);
    assert!(
        ops.contains(&"set ep other/zoned/10.244.2.7".to_string()),
        "{ops:?}"
    );
    assert_eq!(hub.node_view("n1", &everything).node.zone, None);
}

#[test]
fn a_node_zone_change_re_evaluates_that_node_only() {
    let hub = hub();
    hub.apply(fixtures::cluster_event());
    let n1 = hub.register("n1");
    let n2 = hub.register("n2");
    next(&n1);
    next(&n2);
    // n1 moves to zone zb: the zoned Service now uses the zb endpoints.
    hub.apply(Event::Apply(
        kpng_k8s::from_json::<k8s_openapi::api::core::v1::Node>(
            json!({"metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "zb"}}}),
        )
        .expect("node")
        .object,
    ));
    let ops = next(&n1);
    assert_eq!(ops[0], "node n1");
    assert!(
        ops.contains(&"set ep other/zoned/10.244.2.7".to_string()),
        "{ops:?}"
    );
    assert!(
        ops.contains(&"del ep other/zoned/10.244.1.7".to_string()),
        "{ops:?}"
    );
    assert!(!ready(&n2));
}

#[test]
fn renaming_the_watched_node_moves_locality() {
    let hub = hub();
    hub.apply(fixtures::cluster_event());
    let mut w = hub.register("n1");
    next(&w);
    w.rename("n2");
    let ops = next(&w);
    // The old name's value goes: a client keeping values by path holds one node.
    assert_eq!(ops[..2], ["del node n1", "node n2"]);
    assert!(
        ops.contains(&"set ep default/np-local/10.244.2.3 local".to_string()),
        "{ops:?}"
    );
}

fn service_cidr(name: &str, cidrs: &[&str]) -> Event {
    Event::Apply(
        kpng_k8s::from_json::<k8s_openapi::api::networking::v1::ServiceCIDR>(
            json!({"metadata": {"name": name}, "spec": {"cidrs": cidrs}}),
        )
        .expect("ServiceCIDR")
        .object,
    )
}

#[test]
fn service_cidrs_follow_the_reset_and_every_change_goes_to_every_watcher() {
    let hub = hub();
    hub.apply(service_cidr("kubernetes", &["10.96.0.0/16"]));
    hub.apply(fixtures::cluster_event());
    let (n1, n2) = (hub.register("n1"), hub.register("n2"));
    for reg in [&n1, &n2] {
        let ops = next(reg);
        assert_eq!(
            ops[..3],
            [
                "reset",
                "cidrs 10.96.0.0/16",
                &format!("node {}", reg.node_name())
            ]
        );
    }
    // The same ranges again: nothing to send.
    hub.apply(service_cidr("copy", &["10.96.0.0/16"]));
    assert!(!ready(&n1) && !ready(&n2));
    hub.apply(service_cidr("extra", &["10.97.0.0/16"]));
    for reg in [&n1, &n2] {
        assert_eq!(next(reg), ["cidrs 10.96.0.0/16,10.97.0.0/16", "sync"]);
    }
}

/// A hub that holds the Nodes `nodes` and `services` Services of one port, Service `i`
/// (`s0000`, `s0001`, … in key order) with one endpoint on node `node_of(i)`.
fn hub_with_services(
    nodes: &[&str],
    services: u32,
    node_of: impl Fn(u32) -> &'static str,
) -> Arc<Hub> {
    let mut yaml = String::new();
    for node in nodes {
        yaml.push_str(&format!(
            "---\napiVersion: v1\nkind: Node\nmetadata: {{name: {node}}}\n"
        ));
    }
    for i in 0..services {
        let node = node_of(i);
        yaml.push_str(&format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: default, name: s{i:04}}}\n\
             spec: {{clusterIP: 10.96.{}.{}, ports: [{{name: p, port: 80}}]}}\n\
             ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{namespace: default, name: s{i:04}-1, labels: {{kubernetes.io/service-name: s{i:04}}}}}\n\
             addressType: IPv4\nports: [{{name: p, port: 8080}}]\n\
             endpoints: [{{addresses: [10.244.{}.{}], nodeName: {node}}}]\n",
            i / 200,
            i % 200 + 1,
            i / 200,
            i % 200 + 1,
        ));
    }
    let loaded = kpng_source_file::parse_manifests(&yaml).expect("manifests");
    let hub = hub();
    hub.apply(Event::Replace {
        kinds: vec![
            kpng_model::Kind::Service,
            kpng_model::Kind::EndpointSlice,
            kpng_model::Kind::Node,
        ],
        objects: loaded.objects,
    });
    hub
}

/// A new watcher for `node` replays every one of the `services` Services, `local` of them
/// with the node's own endpoint; `next` checks on the way that its plain and bundled streams
/// are exactly its ops.
fn check_replay(hub: &Arc<Hub>, node: &str, local: usize, services: usize) {
    let ops = next(&hub.register(node));
    let set_local = ops.iter().filter(|o| o.ends_with(" local")).count();
    assert_eq!(set_local, local, "{node}");
    assert_eq!(
        ops.iter().filter(|o| o.starts_with("set svc ")).count(),
        services
    );
}

/// Services that depend on a node at the edges of chunks (every 32) and of buffers (every
/// 1,024): the slices around them, the whole chunks and the bundles before and after join or
/// split there, and every node's stream is still exactly its ops (`next` checks the plain and
/// the bundled stream).
#[test]
fn a_replay_sliced_at_chunk_and_buffer_edges_is_exactly_the_ops() {
    let edges = [0u32, 31, 32, 63, 1023, 1024, 1055, 1056, 1099];
    let hub = hub_with_services(&["edge", "other", "none"], 1100, |i| {
        if edges.contains(&i) { "edge" } else { "other" }
    });
    for (node, local) in [
        ("edge", edges.len()),
        ("other", 1100 - edges.len()),
        ("none", 0),
    ] {
        check_replay(&hub, node, local, 1100);
    }
    // Read with bundles, the 29 chunks without a Service of "edge" go as one bundle each, and
    // the 6 with one as the parts of 8 Services without one (2, 2, 3, 2, 3 and 1 of the last
    // chunk's 2) as one bundle each, beside the slices around its own.
    let reg = hub.register("edge");
    let pending = block_on(reg.slot.next());
    let bundled: Vec<u8> = pending
        .frames(hub.replay_cache(), true)
        .flat_map(|c| c.to_vec())
        .collect();
    assert_eq!(count_bundles(&bundled), 29 + 13);
}

/// A replay of many Services whose endpoints run on several nodes: each node receives the
/// shared chunks whole, or sliced around the Services that depend on it (their endpoints run
/// there), and the bytes are still exactly its ops encoded one by one (`next` checks that).
/// 2,100 Services fill three buffers of 32 chunks of 32 (the last one partly).
#[test]
fn a_replay_is_sliced_around_the_services_that_depend_on_the_node() {
    let hub = hub_with_services(&["n1", "n2", "n3", "n4"], 2100, |i| {
        // Service i has one endpoint on n1 when i % 7 == 0, on n2 when i % 50 == 0, else on n4.
        if i % 50 == 0 {
            "n2"
        } else if i % 7 == 0 {
            "n1"
        } else {
            "n4"
        }
    });
    for (node, local) in [("n1", 294), ("n2", 42), ("n3", 0), ("n4", 1764)] {
        check_replay(&hub, node, local, 2100);
    }
    // n3 depends on none of them: every chunk of 32 Services is shared whole, and a watcher
    // that reads bundles gets each as one compressed bundle.
    let reg = hub.register("n3");
    let pending = block_on(reg.slot.next());
    let plain: Vec<prost::bytes::Bytes> = pending.frames(hub.replay_cache(), false).collect();
    // The single ops before, each buffer's chunks as one slice of it, the Sync.
    assert_eq!(plain.len(), 5, "{} pieces", plain.len());
    let plain: usize = plain.iter().map(|c| c.len()).sum();
    let pieces: Vec<prost::bytes::Bytes> = pending.frames(hub.replay_cache(), true).collect();
    // The same with the buffers of bundles (passed by reference however small).
    assert_eq!(pieces.len(), 5, "{} pieces", pieces.len());
    let bundled: Vec<u8> = pieces.iter().flat_map(|c| c.to_vec()).collect();
    assert_eq!(count_bundles(&bundled), 2100usize.div_ceil(32));
    assert!(
        bundled.len() * 3 < plain,
        "{plain} → {} bytes",
        bundled.len()
    );
}

/// The brain's report in a change set, if any: (source, problems as `what: message`,
/// rejected objects as `Kind ns/name field`, total).
fn report_of(pending_ops: &[proto::OpItem]) -> Option<(String, Vec<String>, Vec<String>, u64)> {
    pending_ops.iter().find_map(|item| match &item.op {
        Some(Op::Set(v))
            if v.r#ref.as_ref().map(|r| r.set) == Some(proto::Set::KpngBrainReportSet as i32) =>
        {
            let r = proto::KpngBrainReport::decode(v.bytes.clone()).expect("a report");
            Some((
                r.source,
                r.problems
                    .iter()
                    .map(|p| format!("{}: {}", p.what, p.message))
                    .collect(),
                r.rejected
                    .iter()
                    .map(|o| format!("{} {}/{} {}", o.kind, o.namespace, o.name, o.field))
                    .collect(),
                r.rejected_total,
            ))
        }
        _ => None,
    })
}

/// The next change set's ops (checked as [`next`] does).
fn next_ops(reg: &Registration) -> Vec<proto::OpItem> {
    let pending = block_on(reg.slot.next());
    let ops: Vec<proto::OpItem> = pending.ops().collect();
    let mut sent = Vec::new();
    for chunk in pending.frames(reg.hub.replay_cache(), false) {
        sent.extend_from_slice(&chunk);
    }
    assert_eq!(sent, crate::frames::frames_of(&ops).to_vec());
    ops
}

/// A Service `default/typo` whose protocol no kpng knows: the model rejects it.
fn typo_service(protocol: &str) -> Event {
    Event::Apply(
        kpng_k8s::from_json::<k8s_openapi::api::core::v1::Service>(json!({
            "metadata": {"namespace": "default", "name": "typo"},
            "spec": {"clusterIP": "10.96.9.9", "ports": [{"port": 80, "protocol": protocol}]}
        }))
        .expect("service")
        .object,
    )
}

#[test]
fn the_brains_report_reaches_every_node_once_per_change_and_after_each_reset() {
    let input = kpng_model::input::InputHealth::new("kube https://10.0.0.1:6443/");
    let hub = Arc::new(
        Hub::new(
            ClusterModel::new(ClusterConfig::default()),
            crate::metrics::ApiMetrics::default(),
        )
        .reporting(input.clone()),
    );
    let n1 = hub.register("n1");
    hub.apply(fixtures::cluster_event());
    let ops = next_ops(&n1);
    let healthy = Some(("kube https://10.0.0.1:6443/".to_string(), vec![], vec![], 0));
    assert_eq!(report_of(&ops), healthy, "after the Reset: all is well");
    assert_eq!(
        ops.iter()
            .map(|o| describe(o.clone()))
            .take(3)
            .collect::<Vec<_>>(),
        ["reset", "set KpngBrainReportSet", "node n1"],
        "the report comes before the node and the Services"
    );

    // A broken Service: every node hears of it, with one encoding shared by all.
    let n2 = hub.register("n2");
    assert!(
        report_of(&next_ops(&n2)).is_some(),
        "n2's replay has it too"
    );
    let out = hub.apply(typo_service("TPC"));
    assert_eq!(out.errors.len(), 1, "{:?}", out.errors);
    let n1_ops = next_ops(&n1);
    let rejected = vec!["Service default/typo spec.ports[0].protocol".to_string()];
    assert_eq!(
        report_of(&n1_ops).map(|r| (r.2, r.3)),
        Some((rejected.clone(), 1))
    );
    let shared = |reg: &Registration| {
        reg.slot
            .lock()
            .brain_report
            .clone()
            .expect("a report pending")
    };
    let n2_report = shared(&n2);
    assert!(n2_report.value().rejected_total == 1);
    assert_eq!(next_ops(&n2), n1_ops, "the same change set for both");

    // An event that changes no rejection sends no report (and nothing at all when nothing
    // else changed for the node).
    hub.apply(slice(&[("10.244.1.3", "n1"), ("10.244.2.9", "n2")]));
    assert_eq!(report_of(&next_ops(&n1)), None);
    // The same rejection again: no new report.
    hub.apply(typo_service("TPC"));
    assert!(!ready(&n1), "nothing new for n1");
    hub.refresh_report();
    assert!(!ready(&n1), "a refresh with nothing changed sends nothing");

    // The brain's source fails: the next refresh sends it; while it holds, nothing more.
    input.failing(
        "API server",
        "unreachable: connection refused",
        std::time::SystemTime::now(),
    );
    hub.refresh_report();
    let report = report_of(&next_ops(&n1)).expect("a report");
    assert_eq!(report.1, ["API server: unreachable: connection refused"]);
    assert_eq!(report.2, rejected, "the rejection still holds");
    hub.refresh_report();
    assert!(!ready(&n1));

    // Fixed: both go, the report says all is well again.
    input.recovered("API server");
    hub.apply(typo_service("TCP"));
    assert_eq!(report_of(&next_ops(&n1)), healthy);
    assert_eq!(hub.rejected(), vec![]);
}

#[test]
fn a_brain_that_does_not_report_sends_no_report() {
    let hub = hub();
    let n1 = hub.register("n1");
    hub.apply(fixtures::cluster_event());
    assert_eq!(report_of(&next_ops(&n1)), None);
    hub.apply(typo_service("TPC"));
    hub.refresh_report();
    assert!(!ready(&n1), "no report, and nothing else changed for n1");
}

/// Service `default/pair` (ClusterIP 10.96.7.7, port 80) with `ready` endpoints on node n2.
fn pair(ready: &[&str]) -> Vec<Event> {
    let service = kpng_k8s::from_json::<k8s_openapi::api::core::v1::Service>(json!({
        "metadata": {"namespace": "default", "name": "pair"},
        "spec": {"clusterIP": "10.96.7.7", "ports": [{"port": 80}]}
    }))
    .expect("service")
    .object;
    let slice = kpng_k8s::from_json::<k8s_openapi::api::discovery::v1::EndpointSlice>(json!({
        "metadata": {"namespace": "default", "name": "pair-1",
                     "labels": {"kubernetes.io/service-name": "pair"}},
        "addressType": "IPv4",
        "ports": [{"name": "", "port": 8080}],
        "endpoints": ready.iter()
            .map(|ip| json!({"addresses": [ip], "nodeName": "n2"}))
            .collect::<Vec<_>>()
    }))
    .expect("slice")
    .object;
    vec![Event::Apply(service), Event::Apply(slice)]
}

#[test]
fn events_applied_together_are_one_change_set_encoded_once() {
    let hub = hub();
    hub.apply(fixtures::cluster_event());
    let n3 = hub.register("n3");
    let stranger = hub.register("not-a-node");
    for reg in [&n3, &stranger] {
        next(reg);
    }
    // A Service and its endpoints (one file): one change set, the Service never without its
    // endpoints, and the same bytes for every node whose view does not depend on it.
    let outcomes = hub.apply_all(pair(&["10.244.2.7"]));
    assert_eq!(outcomes.len(), 2);
    let (n3_ops, n3_chunks) = next_chunks(&n3);
    let (stranger_ops, stranger_chunks) = next_chunks(&stranger);
    let want = [
        "set svc default/pair",
        "set ep default/pair/10.244.2.7",
        "sync",
    ];
    assert_eq!(n3_ops, want);
    assert_eq!(stranger_ops, want);
    assert_eq!(
        n3_chunks[0].as_ptr(),
        stranger_chunks[0].as_ptr(),
        "the same bytes, not a copy per node"
    );
    // A Service changed twice and one created and deleted within the events: the net change.
    let mut events = pair(&["10.244.2.8"]);
    events.extend(pair(&["10.244.2.9"]));
    let mut gone = pair(&[]);
    let Event::Apply(kpng_model::Object::Service(svc)) = &mut gone[0] else {
        panic!("a Service first")
    };
    svc.key.name = "brief".into();
    events.push(gone.swap_remove(0));
    events.push(Event::Delete(kpng_model::ObjectRef {
        kind: kpng_model::Kind::Service,
        namespace: "default".into(),
        name: "brief".into(),
    }));
    hub.apply_all(events);
    let want = [
        "set ep default/pair/10.244.2.9",
        "del ep default/pair/10.244.2.7",
        "sync",
    ];
    assert_eq!(next(&n3), want);
    assert_eq!(next(&stranger), want);
}

/// `kpng status --node` on the brain: a node's view with every endpoint explained, as an
/// in-process node's model explains it (the node itself receives only what it uses).
#[test]
fn a_nodes_view_explains_the_endpoints_it_does_not_receive() {
    let hub = hub();
    hub.apply(fixtures::cluster_event());
    let wanted = |namespace: &str, name: &str| namespace == "default" && name == "itp-local";
    let view = hub.node_view("n2", &wanted);
    assert!(!view.connected);
    assert_eq!(view.node.zone.as_deref(), Some("zb"));
    let [(port, endpoints)] = &view.ports[..] else {
        panic!("one port: {:?}", view.ports);
    };
    assert_eq!(port.key.service.to_string(), "default/itp-local");
    let reasons: Vec<(String, Option<&str>)> = endpoints
        .iter()
        .map(|e| (e.address.to_string(), e.reason.as_deref()))
        .collect();
    assert_eq!(
        reasons,
        [
            (
                "10.244.1.6:80".to_string(),
                Some("on another node, and internalTrafficPolicy is Local")
            ),
            (
                "10.244.3.6:80".to_string(),
                Some("on another node, and internalTrafficPolicy is Local")
            ),
        ]
    );
    // The same as an in-process node's model says.
    let mut model = kpng_model::Model::new(kpng_model::ModelConfig {
        node_name: "n2".into(),
        ..kpng_model::ModelConfig::default()
    });
    model.apply(fixtures::cluster_event());
    assert_eq!(model.explain(&port.key).as_ref(), Some(endpoints));
    // n1 uses its own.
    let _n1 = hub.register("n1");
    let view = hub.node_view("n1", &wanted);
    assert!(view.connected);
    assert_eq!(view.ports[0].1[0].used_by, ["local"]);
    // Services without a port for the node are named with why; summaries hold for all.
    let summaries = hub.service_summaries(&wanted);
    assert_eq!(summaries.len(), 1);
    assert_eq!(summaries[0].ports, 1);
    assert_eq!(
        summaries[0].endpoint_nodes.as_deref(),
        Some(&["n1".to_string(), "n3".to_string()][..])
    );
}

/// A watcher whose Node the brain saw and is gone is a deleted Node, not a typo; the gauges
/// count what the status names.
#[test]
fn a_deleted_node_is_told_apart_from_an_unknown_name_and_both_are_counted() {
    let hub = hub();
    hub.apply(fixtures::cluster_event());
    let _a = hub.register("n3");
    let _b = hub.register("n3");
    let _c = hub.register("typo");
    hub.apply(Event::Delete(kpng_model::ObjectRef {
        kind: kpng_model::Kind::Node,
        namespace: "".into(),
        name: "n3".into(),
    }));
    assert_eq!(hub.unknown_watchers(), ["typo"]);
    assert_eq!(hub.deleted_node_watchers(), ["n3"]);
    hub.refresh_node_gauges();
    let m = hub.metrics();
    assert_eq!(m.unknown_node_names.get(), 2);
    assert_eq!(m.duplicate_node_names.get(), 1);
    assert_eq!(m.nodes_not_connected.get(), 2, "n1 and n2");
}

/// The brain counts rejected objects as a node's kpng does.
#[test]
fn the_brain_counts_rejections_as_a_node_does() {
    let hub = hub();
    hub.apply(fixtures::cluster_event());
    let bad = kpng_source_file::parse_manifests(
        "kind: Service\nmetadata: {namespace: default, name: bad}\n\
         spec: {clusterIP: 10.96.9.9, ports: [{port: 80, protocol: TPC}]}\n",
    )
    .expect("parses");
    for o in bad.objects {
        hub.apply(Event::Apply(o));
    }
    let m = hub.metrics();
    assert_eq!(m.rejected_objects.get(), 1);
    assert_eq!(
        m.object_errors
            .get_or_create(&crate::metrics::KindLabel {
                kind: "Service".into()
            })
            .get(),
        1
    );
}

/// The brain counts values dropped from objects in use (`kpng_dropped_values`) as a node's
/// kpng does: until 2026-12-07 only its log and `kpng status` said so.
#[test]
fn the_brain_counts_dropped_values_as_a_node_does() {
    let hub = hub();
    hub.apply(fixtures::cluster_event());
    let dual = kpng_source_file::parse_manifests(
        "kind: Service\nmetadata: {namespace: default, name: dual}\n\
         spec: {clusterIP: 10.96.9.9, externalIPs: [\"fe80::1%eth0\"], ports: [{port: 80}]}\n",
    )
    .expect("parses");
    for o in dual.objects {
        hub.apply(Event::Apply(o));
    }
    assert_eq!(hub.metrics().dropped_values.get(), 1);
    hub.apply(Event::Delete(kpng_model::ObjectRef {
        kind: kpng_model::Kind::Service,
        namespace: "default".into(),
        name: "dual".into(),
    }));
    assert_eq!(hub.metrics().dropped_values.get(), 0);
}

/// A brain with the fixture cluster applied, and the registry its metrics are in.
///
/// Why: the tests of what a scrape shows (the documented alerts) read the encoded text.
fn scraped_brain() -> (Arc<Hub>, prometheus_client::registry::Registry) {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = crate::metrics::ApiMetrics::new(&mut registry);
    let hub = Arc::new(Hub::new(
        ClusterModel::new(ClusterConfig::default()),
        metrics,
    ));
    hub.apply(fixtures::cluster_event());
    (hub, registry)
}

/// The text a scrape of `registry` reads.
fn scrape(registry: &prometheus_client::registry::Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).expect("encode");
    text
}

/// Two brains behind one Service, each with some of the nodes: each brain's
/// `kpng_api_nodes_not_connected` counts the other's nodes (the false alarm an operator met),
/// while `kpng_api_nodes` and `kpng_api_node_connected{node}` add up to the truth, as the
/// alert in docs/observability.md computes it from the scraped text. A node that leaves loses
/// its series.
#[test]
fn two_brains_export_which_nodes_follow_one_of_them() {
    // What the documented alert computes: max(kpng_api_nodes) minus the Nodes with a
    // kpng_api_node_connected series on some brain.
    let not_following = |texts: &[String]| {
        let mut nodes = 0;
        let mut connected = BTreeSet::new();
        for text in texts {
            for line in text.lines() {
                if let Some(n) = line.strip_prefix("kpng_api_nodes ") {
                    nodes = nodes.max(n.parse::<usize>().expect("a count"));
                }
                if let Some(rest) = line.strip_prefix("kpng_api_node_connected{node=\"") {
                    let (node, value) = rest.split_once("\"} ").expect("one label");
                    assert_eq!(value, "1");
                    connected.insert(node.to_string());
                }
            }
        }
        nodes - connected.len()
    };
    let (a, registry_a) = scraped_brain();
    let (b, registry_b) = scraped_brain();
    let n1 = a.register("n1");
    let _n2 = b.register("n2");
    a.refresh_node_gauges();
    b.refresh_node_gauges();
    // Per brain: each counts the other's node as not connected.
    assert_eq!(a.metrics().nodes_not_connected.get(), 2);
    assert_eq!(b.metrics().nodes_not_connected.get(), 2);
    let texts = [scrape(&registry_a), scrape(&registry_b)];
    assert_eq!(
        not_following(&texts),
        1,
        "n3 only:\n{}{}",
        texts[0],
        texts[1]
    );

    drop(n1);
    a.refresh_node_gauges();
    let texts = [scrape(&registry_a), scrape(&registry_b)];
    assert!(!texts[0].contains("node=\"n1\""), "{}", texts[0]);
    assert_eq!(not_following(&texts), 2, "n1 and n3");
}

/// The expression of the alert `name` in docs/observability.md's rules.
fn documented_alert(name: &str) -> String {
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/observability.md"),
    )
    .expect("docs/observability.md");
    let (_, rule) = docs
        .split_once(&format!("- alert: {name}\n"))
        .unwrap_or_else(|| panic!("no alert {name} in docs/observability.md"));
    let (_, expr) = rule.split_once("expr:").expect("an expr");
    let (expr, _) = expr.split_once("  for:").expect("a for");
    expr.trim_start_matches([' ', '|']).trim().to_string()
}

/// Two kpngs claiming one node on the same brain: the brain exports one
/// `kpng_api_node_connected{node}` series for it (a set of names), so the documented
/// `KpngNodeClaimedTwice` alert must read `kpng_api_duplicate_node_names` too: counting the
/// series per node alone (what it did) only ever fires across two brains.
#[test]
fn a_node_claimed_twice_on_one_brain_fires_the_documented_alert() {
    let (hub, registry) = scraped_brain();
    let _first = hub.register_from("n1", Some("10.0.0.5:41000".into()));
    let _second = hub.register_from("n1", Some("10.0.0.7:39000".into()));
    hub.refresh_node_gauges();
    let text = scrape(&registry);
    let series = text
        .lines()
        .filter(|l| l.starts_with("kpng_api_node_connected{"))
        .collect::<Vec<_>>();
    assert_eq!(series, ["kpng_api_node_connected{node=\"n1\"} 1"], "{text}");
    assert!(
        text.contains("\nkpng_api_duplicate_node_names 1\n"),
        "{text}"
    );
    // The documented rule: the brain's own count of doubled names, or the same node's
    // series on two brains.
    let expr = documented_alert("KpngNodeClaimedTwice");
    let terms: Vec<String> = expr
        .split(" or ")
        .map(|t| t.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert!(
        terms.contains(&"max(kpng_api_duplicate_node_names) > 0".to_string())
            && terms.contains(&"count by (node) (kpng_api_node_connected) > 1".to_string()),
        "{expr}"
    );
}

/// The fixture's objects, without its Nodes or with them, as one complete list.
fn cluster_event_with_nodes(with_nodes: bool) -> Event {
    let loaded = kpng_source_file::parse_manifests(fixtures::CLUSTER_YAML).expect("parses");
    Event::Replace {
        kinds: vec![
            kpng_model::Kind::Service,
            kpng_model::Kind::EndpointSlice,
            kpng_model::Kind::Node,
        ],
        objects: loaded
            .objects
            .into_iter()
            .filter(|o| with_nodes || o.kind() != kpng_model::Kind::Node)
            .collect(),
    }
}

/// What a watcher's first change set is: a refusal's message, or a replay.
fn first_answer(reg: &Registration) -> Result<(), String> {
    let mut pending = block_on(reg.slot.next());
    match pending.refused.take() {
        Some(why) => Err(why),
        None => {
            assert!(pending.replay, "a first change set is a replay");
            Ok(())
        }
    }
}

/// A brain whose cluster has Nodes serves only them (and a Node it saw, deleted since): a
/// node of another cluster, asking before or after the brain listed its input or renaming
/// itself, is refused with why; a brain whose source has no Node serves every name.
#[test]
fn a_node_the_brains_cluster_does_not_have_is_refused() {
    struct Case {
        what: &'static str,
        with_nodes: bool,
        name: &'static str,
        /// Registered before the brain listed its input.
        early: bool,
        /// Renamed to `name` from `n1` after its replay, instead of registered as `name`.
        rename: bool,
        /// The Node deleted before the watcher comes.
        delete_first: bool,
        refused: bool,
    }
    let case = |what, with_nodes, name, refused| Case {
        what,
        with_nodes,
        name,
        early: false,
        rename: false,
        delete_first: false,
        refused,
    };
    let cases = [
        case("a Node of the cluster", true, "n1", false),
        case("another cluster's node", true, "elsewhere", true),
        Case {
            early: true,
            ..case(
                "another cluster's node, before the listing",
                true,
                "elsewhere",
                true,
            )
        },
        Case {
            early: true,
            ..case(
                "a Node of the cluster, before the listing",
                true,
                "n2",
                false,
            )
        },
        Case {
            rename: true,
            ..case("renamed to another cluster's node", true, "elsewhere", true)
        },
        Case {
            delete_first: true,
            ..case("a Node the brain saw, deleted since", true, "n3", false)
        },
        case(
            "any name, when the source has no Node",
            false,
            "elsewhere",
            false,
        ),
    ];
    for c in cases {
        let hub = hub();
        let early = c.early.then(|| hub.register(c.name));
        hub.apply(cluster_event_with_nodes(c.with_nodes));
        if c.delete_first {
            hub.apply(Event::Delete(kpng_model::ObjectRef {
                kind: kpng_model::Kind::Node,
                namespace: "".into(),
                name: c.name.into(),
            }));
        }
        let answer = match early {
            Some(reg) => first_answer(&reg),
            None if c.rename => {
                let mut reg = hub.register("n1");
                assert_eq!(first_answer(&reg), Ok(()), "{}: as n1", c.what);
                reg.rename(c.name);
                first_answer(&reg)
            }
            None => first_answer(&hub.register(c.name)),
        };
        assert_eq!(hub.refusal(c.name).is_some(), c.refused, "{}", c.what);
        match (answer, c.refused) {
            (Ok(()), false) => {}
            (Err(why), true) => {
                assert!(
                    why.contains(&format!("has no Node named {:?} (it has 3 Nodes)", c.name)),
                    "{}: {why}",
                    c.what
                );
                assert_eq!(hub.unknown_watchers(), [c.name], "{}: shown", c.what);
            }
            (answer, _) => panic!("{}: {answer:?}", c.what),
        }
    }
}

/// A node refused while its Node was not registered yet is served once the brain has it.
#[test]
fn a_refused_node_is_served_once_its_node_appears() {
    let hub = hub();
    hub.apply(fixtures::cluster_event());
    assert!(first_answer(&hub.register("n4")).is_err());
    hub.refresh_node_gauges();
    assert_eq!(hub.metrics().unknown_node_names.get(), 1, "counted");
    let node =
        kpng_source_file::parse_manifests("apiVersion: v1\nkind: Node\nmetadata: {name: n4}\n")
            .expect("parses");
    for o in node.objects {
        hub.apply(Event::Apply(o));
    }
    assert_eq!(hub.refusal("n4"), None);
    assert_eq!(first_answer(&hub.register("n4")), Ok(()));
    assert_eq!(hub.unknown_watchers(), Vec::<String>::new());
}

/// A node that reconnects while its old connection is still half-open (a brain that hung a
/// minute: `kill -STOP`, then `-CONT`) claims its name twice until the keepalive closes the old
/// one: that is said at INFO, not warned as two kpngs; a second claim still there after the
/// grace is warned, once. (Warned at once, the reconnect had been a false alarm.)
#[tokio::test(start_paused = true)]
async fn a_reconnect_is_not_warned_as_two_kpngs_but_a_lasting_second_claim_is() {
    let (logs, _default) = Logs::capture();
    let warned = |logs: &Logs| logs.text().matches("two kpngs claim node").count();
    let hub = hub();
    hub.apply(fixtures::cluster_event());

    // The reconnect: the old connection closes a moment after the new one came.
    let old = hub.register_from("n1", Some("127.0.0.1:35754".into()));
    let new = hub.register_from("n1", Some("127.0.0.1:52308".into()));
    assert_eq!(warned(&logs), 0, "not at once: {}", logs.text());
    assert!(
        logs.text().contains(
            "node \"n1\" reconnected from 127.0.0.1:52308; replacing the older connection from \
             127.0.0.1:35754 when it closes"
        ),
        "{}",
        logs.text()
    );
    tokio::time::sleep(Duration::from_millis(13)).await;
    drop(old);
    tokio::time::sleep(CLAIM_GRACE * 2).await;
    assert_eq!(warned(&logs), 0, "a reconnect: {}", logs.text());

    // A second kpng that stays: warned once the grace is over.
    let copy = hub.register_from("n1", Some("10.0.0.9:40000".into()));
    tokio::time::sleep(CLAIM_GRACE / 2).await;
    assert_eq!(warned(&logs), 0, "{}", logs.text());
    tokio::time::sleep(CLAIM_GRACE).await;
    assert_eq!(warned(&logs), 1, "{}", logs.text());
    assert!(
        logs.text()
            .contains("connections from 127.0.0.1:52308 and 10.0.0.9:40000"),
        "{}",
        logs.text()
    );
    drop((new, copy));
}

/// A Service `default/NAME` (ClusterIP `ip`, port 80 over `protocol`).
fn service_named(name: &str, ip: &str, protocol: &str) -> Event {
    Event::Apply(
        kpng_k8s::from_json::<k8s_openapi::api::core::v1::Service>(json!({
            "metadata": {"namespace": "default", "name": name},
            "spec": {"clusterIP": ip, "ports": [{"port": 80, "protocol": protocol}]}
        }))
        .expect("service")
        .object,
    )
}

/// The rejections a brain's report in `ops` names, as `Kind ns/name: message`.
fn reported_messages(ops: &[proto::OpItem]) -> Option<Vec<String>> {
    ops.iter().find_map(|item| match &item.op {
        Some(Op::Set(v))
            if v.r#ref.as_ref().map(|r| r.set) == Some(proto::Set::KpngBrainReportSet as i32) =>
        {
            let r = proto::KpngBrainReport::decode(v.bytes.clone()).expect("a report");
            Some(
                r.rejected
                    .iter()
                    .map(|o| format!("{} {}/{}: {}", o.kind, o.namespace, o.name, o.message))
                    .collect(),
            )
        }
        _ => None,
    })
}

/// The report goes out again whenever what it says changes, not only how many objects it
/// names: one rejection fixed and another made in the same change (the count unchanged), and
/// a rejection whose message changes, each reach the nodes.
#[test]
fn the_brains_report_is_sent_again_when_its_rejections_change_but_not_their_number() {
    let input = kpng_model::input::InputHealth::new("file /etc/kpng/cluster.yaml");
    let hub = Arc::new(
        Hub::new(
            ClusterModel::new(ClusterConfig::default()),
            crate::metrics::ApiMetrics::default(),
        )
        .reporting(input),
    );
    let n1 = hub.register("n1");
    hub.apply(fixtures::cluster_event());
    next_ops(&n1);
    hub.apply(service_named("one", "10.96.9.1", "TPC"));
    let first = reported_messages(&next_ops(&n1)).expect("a report");
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(first[0].starts_with("Service default/one: "), "{first:?}");

    // `one` fixed and `two` broken in one change: still one rejection, another one.
    hub.apply_all(vec![
        service_named("one", "10.96.9.1", "TCP"),
        service_named("two", "10.96.9.2", "TPC"),
    ]);
    let swapped = reported_messages(&next_ops(&n1)).expect("a report");
    assert_eq!(swapped.len(), 1, "{swapped:?}");
    assert!(
        swapped[0].starts_with("Service default/two: "),
        "{swapped:?}"
    );

    // `two` broken otherwise: the same object, another message.
    hub.apply(service_named("two", "10.96.9.2", "UPD"));
    let reworded = reported_messages(&next_ops(&n1)).expect("a report");
    assert_eq!(reworded.len(), 1, "{reworded:?}");
    assert_ne!(reworded, swapped, "the message changed");

    // And nothing when nothing changed.
    hub.apply(service_named("two", "10.96.9.2", "UPD"));
    hub.refresh_report();
    assert!(!ready(&n1), "the same report is not sent again");
}

/// A stall of the brain itself puts every node behind at once: the first few are named, the
/// rest are one line with their number, and so are their catch-ups (5,000 nodes were 5,000
/// warnings, then 5,000 INFO lines).
#[test]
fn many_nodes_falling_behind_at_once_are_a_few_lines() {
    let (logs, _default) = Logs::capture();
    let hub = Arc::new(
        Hub::new(
            ClusterModel::new(ClusterConfig::default()),
            crate::metrics::ApiMetrics::default(),
        )
        .with_lag_warning(Duration::from_millis(20)),
    );
    hub.apply(fixtures::cluster_event());
    let watchers: Vec<Registration> = (0..8).map(|_| hub.register("n1")).collect();
    for reg in &watchers {
        next(reg);
    }
    hub.apply(service_named("late", "10.96.0.77", "TCP"));
    std::thread::sleep(Duration::from_millis(40));
    hub.refresh_node_gauges();
    let text = logs.text();
    assert_eq!(text.matches("is falling behind: ").count(), 5, "{text}");
    assert!(text.contains("3 more nodes are falling behind"), "{text}");
    for reg in &watchers {
        next(reg);
    }
    hub.refresh_node_gauges();
    let text = logs.text();
    assert_eq!(text.matches("\" caught up: ").count(), 5, "{text}");
    assert!(text.contains("3 more nodes caught up"), "{text}");
}

/// A node that stops taking its changes is measured (`kpng_api_node_lag_seconds{node}`, a
/// series only for the cluster's connected Nodes), warned about once when it has been behind
/// for the threshold, and said at INFO to have caught up when it took them. Until 2026-12-07
/// only the brain's `kpng status` showed it. The threshold is set small; the test waits past
/// it, it times nothing.
#[test]
fn a_node_that_falls_behind_is_measured_warned_once_and_said_to_catch_up() {
    let (logs, _default) = Logs::capture();
    let hub = Arc::new(
        Hub::new(
            ClusterModel::new(ClusterConfig::default()),
            crate::metrics::ApiMetrics::default(),
        )
        .with_lag_warning(Duration::from_millis(20)),
    );
    hub.apply(fixtures::cluster_event());
    let n1 = hub.register("n1");
    let n2 = hub.register("n2");
    let typo = hub.register("no-such-node");
    for reg in [&n1, &n2] {
        next(reg);
    }
    let lag = |node: &str| {
        hub.metrics()
            .node_lag_seconds
            .get_or_create(&crate::metrics::NodeLabel { node: node.into() })
            .get()
    };
    let warned = |logs: &Logs| logs.text().matches("is falling behind").count();

    hub.apply(service_named("late", "10.96.0.77", "TCP"));
    next(&n2);
    std::thread::sleep(Duration::from_millis(40));
    hub.refresh_node_gauges();
    assert!(lag("n1") >= 0.04, "n1 is behind: {}", lag("n1"));
    assert_eq!(lag("n2"), 0.0, "n2 took its change");
    assert_eq!(warned(&logs), 1, "{}", logs.text());
    assert!(
        logs.text()
            .contains("node \"n1\" is falling behind: 1 Service changes pending for"),
        "{}",
        logs.text()
    );
    hub.refresh_node_gauges();
    assert_eq!(warned(&logs), 1, "once per episode: {}", logs.text());
    assert!(!logs.text().contains("caught up"), "{}", logs.text());

    next(&n1);
    hub.refresh_node_gauges();
    assert_eq!(lag("n1"), 0.0);
    assert!(
        logs.text().contains("node \"n1\" caught up"),
        "{}",
        logs.text()
    );

    // Bounded as kpng_api_node_connected: a name no Node has gets no series; a node that
    // left loses its series.
    drop(n2);
    hub.refresh_node_gauges();
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register(
        "kpng_api_node_lag_seconds",
        "",
        hub.metrics().node_lag_seconds.clone(),
    );
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    assert!(text.contains("node=\"n1\""), "{text}");
    assert!(!text.contains("node=\"n2\""), "{text}");
    assert!(!text.contains("no-such-node"), "{text}");
    drop((n1, typo));
}

/// A Node whose kpng went away is listed with since when and after how long it had been
/// connected (the status said only that it was not connected, until 2026-12-07); it leaves
/// the list when one watches it again, and names no Node has are not kept.
#[test]
fn a_node_that_left_is_listed_with_since_when() {
    let hub = hub();
    hub.apply(fixtures::cluster_event());
    let before = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let n1 = hub.register("n1");
    let typo = hub.register("no-such-node");
    assert!(hub.disconnected_nodes().is_empty());
    drop((n1, typo));
    let left = hub.disconnected_nodes();
    assert_eq!(
        left.iter().map(|d| d.node.as_str()).collect::<Vec<_>>(),
        ["n1"],
        "{left:?}"
    );
    assert!(u64::try_from(left[0].since_unix).expect("positive") >= before);
    assert!(left[0].since.ends_with('Z'), "{}", left[0].since);
    assert_eq!(hub.not_connected(), ["n1", "n2", "n3"]);

    let again = hub.register("n1");
    assert!(hub.disconnected_nodes().is_empty());
    drop(again);
}
