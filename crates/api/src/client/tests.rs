//! Client tests: a change set becomes model ports; a Reset replay of the same state is no
//! change at all; the backoff grows with jitter.

use crate::fixtures::Logs;
use std::sync::Arc;
use std::time::Duration;

use kpng_model::{ClusterConfig, ClusterModel, Event};
use serde_json::json;

use super::*;
use crate::fixtures;
use crate::hub::Hub;

fn hub() -> Arc<Hub> {
    let hub = Arc::new(Hub::new(
        ClusterModel::new(ClusterConfig::default()),
        crate::metrics::ApiMetrics::default(),
    ));
    hub.apply(fixtures::cluster_event());
    hub
}

/// Feeds the next change set of `reg` into `wire` and the model; returns the model's diff size.
fn deliver(
    reg: &crate::hub::Registration,
    wire: &mut WireState,
    model: &mut RemoteModel,
) -> (usize, bool) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("rt");
    let pending = rt.block_on(reg.slot.next());
    let mut synced = false;
    for op in pending.ops() {
        synced |= wire.apply(op).expect("valid op");
    }
    assert!(synced, "a change set ends with Sync");
    let (update, errors) = wire.take_update();
    assert!(errors.is_empty(), "{errors:?}");
    let out = model.apply(update);
    (out.diff.changes.len(), out.diff.node_changed)
}

#[test]
fn the_received_state_is_the_in_process_state() {
    let hub = hub();
    for name in ["n1", "n2", "n3"] {
        let reg = hub.register(name);
        let (mut wire, mut model) = (WireState::default(), RemoteModel::new(name, Vec::new()));
        deliver(&reg, &mut wire, &mut model);
        let cluster = fixtures::cluster();
        let node = fixtures::node(&cluster, name);
        let mut want = Snapshot {
            // As the in-process model keeps it (`ever_known`).
            node: kpng_model::NodeMemory::default().view(&node, &[]),
            ..Snapshot::default()
        };
        for (key, source) in cluster.sources() {
            want.replace_service(key, source.ports_for(&node), &mut Diff::default());
        }
        assert_eq!(model.snapshot(), &want, "node {name}");
    }
}

#[test]
fn a_reconnect_replay_is_a_minimal_diff() {
    let hub = hub();
    let (mut wire, mut model) = (WireState::default(), RemoteModel::new("n1", Vec::new()));
    let first = hub.register("n1");
    let (changes, node_changed) = deliver(&first, &mut wire, &mut model);
    assert!(changes > 10 && node_changed);
    drop(first);

    // Same state after a reconnect: Reset + everything again, and no change at all.
    let again = hub.register("n1");
    assert_eq!(deliver(&again, &mut wire, &mut model), (0, false));
    drop(again);

    // While disconnected, a Service went away and an endpoint changed: exactly those.
    hub.apply(Event::Delete(kpng_model::ObjectRef {
        kind: kpng_model::Kind::Service,
        namespace: "other".into(),
        name: "empty".into(),
    }));
    hub.apply(Event::Apply(
        kpng_k8s::from_json::<k8s_openapi::api::discovery::v1::EndpointSlice>(json!({
            "metadata": {"namespace": "default", "name": "np-local-1",
                         "labels": {"kubernetes.io/service-name": "np-local"}},
            "addressType": "IPv4", "ports": [{"name": "", "port": 8080}],
            "endpoints": [{"addresses": ["10.244.1.3"], "nodeName": "n1"}]
        }))
        .expect("slice")
        .object,
    ));
    let third = hub.register("n1");
    assert_eq!(deliver(&third, &mut wire, &mut model), (2, false));
    assert!(
        !model
            .snapshot()
            .ports
            .keys()
            .any(|k| &*k.service.name == "empty")
    );
}

#[test]
fn the_first_change_set_lists_every_kind_once() {
    let mut model = RemoteModel::new("n1", Vec::new());
    assert_eq!(model.apply(RemoteUpdate::default()).listed.len(), 3);
    assert!(model.apply(RemoteUpdate::default()).listed.is_empty());
}

#[test]
fn node_ip_override_wins_over_the_brain() {
    let mut model = RemoteModel::new("n1", vec!["10.1.1.1".parse().expect("ip")]);
    let node = NodeState {
        name: "n1".into(),
        ips: vec!["192.168.0.1".parse().expect("ip")],
        ..NodeState::default()
    };
    model.apply(RemoteUpdate {
        node: Some(node),
        ..RemoteUpdate::default()
    });
    assert_eq!(
        model.snapshot().node.ips,
        ["10.1.1.1".parse::<IpAddr>().expect("ip")]
    );
}

/// One step of a brain-fed node's Node lifecycle.
enum BrainNodeStep {
    /// The brain sends the Node with these IPs and pod CIDRs.
    Node(&'static [&'static str], &'static [&'static str]),
    /// The brain sends that there is no Node of this name (deleted, or never there).
    NoNode,
    /// The runner's wait for node IPs ended.
    GiveUp,
    /// The brain went away and came back: its replay sends the Node as it is now.
    Replay,
}

/// A brain-fed node keeps its last node IPs and pod CIDRs when its Node is deleted or loses
/// them, and falls back to every local address once the wait for node IPs ends with none, as
/// the in-process model does (the same `NodeMemory`); a brain's replay of a deleted Node keeps
/// them too. Keeping them changes the node's status only, nothing the backends program.
#[test]
fn a_brain_fed_node_keeps_its_last_node_ips_and_falls_back_as_in_process() {
    use BrainNodeStep::*;
    // (what, --node-ip, steps, then: node IPs, pod CIDRs, known, ever known, IPs kept, CIDRs
    // kept, node ports on all local addresses, whether the last step changed what the
    // backends program, whether it changed the node's status only)
    type Want = (&'static [&'static str], &'static [&'static str], [bool; 7]);
    let cases: Vec<(&str, &[&str], Vec<BrainNodeStep>, Want)> = vec![
        (
            "present",
            &[],
            vec![Node(&["10.1.1.1"], &["10.244.1.0/24"])],
            (
                &["10.1.1.1"],
                &["10.244.1.0/24"],
                [true, true, false, false, false, true, false],
            ),
        ),
        (
            "deleted: both kept",
            &[],
            vec![Node(&["10.1.1.1"], &["10.244.1.0/24"]), NoNode],
            (
                &["10.1.1.1"],
                &["10.244.1.0/24"],
                [false, true, true, true, false, false, true],
            ),
        ),
        (
            "deleted, then the brain's replay: still kept, no change",
            &[],
            vec![Node(&["10.1.1.1"], &["10.244.1.0/24"]), NoNode, Replay],
            (
                &["10.1.1.1"],
                &["10.244.1.0/24"],
                [false, true, true, true, false, false, false],
            ),
        ),
        (
            "addresses emptied: IPs kept",
            &[],
            vec![
                Node(&["10.1.1.1"], &["10.244.1.0/24"]),
                Node(&[], &["10.244.1.0/24"]),
            ],
            (
                &["10.1.1.1"],
                &["10.244.1.0/24"],
                [true, true, true, false, false, false, true],
            ),
        ),
        (
            "deleted then re-created with another IP: the new one",
            &[],
            vec![
                Node(&["10.1.1.1"], &["10.244.1.0/24"]),
                NoNode,
                Node(&["10.1.1.2"], &["10.244.2.0/24"]),
            ],
            (
                &["10.1.1.2"],
                &["10.244.2.0/24"],
                [true, true, false, false, false, true, false],
            ),
        ),
        (
            "deleted, giving up changes nothing: IPs are known",
            &[],
            vec![Node(&["10.1.1.1"], &[]), NoNode, GiveUp],
            (
                &["10.1.1.1"],
                &[],
                [false, true, true, false, false, false, false],
            ),
        ),
        (
            "deleted with --node-ip of the other family: the IPv4 kept",
            &["fd00::9"],
            vec![Node(&["10.1.1.1"], &[]), NoNode],
            (
                &["fd00::9", "10.1.1.1"],
                &[],
                [false, true, true, false, false, false, true],
            ),
        ),
        (
            "never a Node, the wait ended: all local",
            &[],
            vec![NoNode, GiveUp],
            (&[], &[], [false, false, false, false, true, true, false]),
        ),
        (
            "a Node with no address, the wait ended: all local",
            &[],
            vec![Node(&[], &[]), GiveUp],
            (&[], &[], [true, true, false, false, true, true, false]),
        ),
        (
            "an IP after the wait: on it only",
            &[],
            vec![Node(&[], &[]), GiveUp, Node(&["10.1.1.1"], &[])],
            (
                &["10.1.1.1"],
                &[],
                [true, true, false, false, false, true, false],
            ),
        ),
        (
            "--node-ip: the wait changes nothing",
            &["192.0.2.1"],
            vec![NoNode, GiveUp],
            (
                &["192.0.2.1"],
                &[],
                [false, false, false, false, false, false, false],
            ),
        ),
    ];
    for (what, overrides, steps, want) in cases {
        let overrides = overrides.iter().map(|s| s.parse().expect("ip")).collect();
        let mut model = RemoteModel::new("n1", overrides);
        let mut sent = NodeState {
            name: "n1".into(),
            ..NodeState::default()
        };
        let mut changed = (false, false);
        let both = |out: ApplyOutcome| (out.diff.node_changed, out.node_status_changed);
        for step in steps {
            let update = |node: &NodeState, replay| RemoteUpdate {
                node: Some(node.clone()),
                replay,
                ..RemoteUpdate::default()
            };
            changed = match step {
                Node(ips, cidrs) => {
                    sent = NodeState {
                        name: "n1".into(),
                        known: true,
                        ips: ips.iter().map(|s| s.parse().expect("ip")).collect(),
                        pod_cidrs: cidrs.iter().map(|s| s.parse().expect("cidr")).collect(),
                        ..NodeState::default()
                    };
                    both(model.apply(update(&sent, false)))
                }
                NoNode => {
                    sent = NodeState {
                        name: "n1".into(),
                        ..NodeState::default()
                    };
                    both(model.apply(update(&sent, false)))
                }
                GiveUp => (model.give_up_waiting_for_node_ips().node_changed, false),
                Replay => both(model.apply(update(&sent, true))),
            };
        }
        let n = &model.snapshot().node;
        let ips: Vec<String> = n.ips.iter().map(|i| i.to_string()).collect();
        let cidrs: Vec<String> = n.pod_cidrs.iter().map(|c| c.to_string()).collect();
        assert_eq!(
            (
                ips,
                cidrs,
                [
                    n.known,
                    n.ever_known,
                    n.ips_kept,
                    n.pod_cidrs_kept,
                    n.nodeports_on_all_local,
                    changed.0,
                    changed.1
                ]
            ),
            (
                want.0.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                want.1.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                want.2
            ),
            "{what}"
        );
    }
}

#[test]
fn bad_paths_and_values_are_errors_not_state() {
    let mut wire = WireState::default();
    let bad = [
        proto::OpItem {
            op: Some(Op::Set(proto::Value {
                r#ref: Some(proto::Ref {
                    set: proto::Set::ServicesSet as i32,
                    path: "no-slash".into(),
                }),
                bytes: Default::default(),
            })),
        },
        proto::OpItem {
            op: Some(Op::Set(proto::Value {
                r#ref: Some(proto::Ref {
                    set: proto::Set::EndpointsSet as i32,
                    path: "ns/svc/1".into(),
                }),
                bytes: vec![0xff, 0xff].into(),
            })),
        },
    ];
    for op in bad {
        assert!(wire.apply(op).is_err());
    }
    assert_eq!(wire.take_update().0, RemoteUpdate::default());
}

#[test]
fn backoff_doubles_with_jitter_up_to_the_cap() {
    let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1), 42);
    let delays: Vec<Duration> = (0..6).map(|_| b.next_delay()).collect();
    let caps = [100, 200, 400, 800, 1000, 1000];
    for (d, cap) in delays.iter().zip(caps) {
        let cap = Duration::from_millis(cap);
        assert!(
            *d >= cap / 2 && *d <= cap,
            "{d:?} not in [{:?}, {cap:?}]",
            cap / 2
        );
    }
    b.reset();
    assert!(b.next_delay() <= Duration::from_millis(100));
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
fn service_cidrs_reach_the_node_snapshot_and_a_change_is_a_node_change() {
    let hub = hub();
    hub.apply(service_cidr(
        "kubernetes",
        &["10.96.0.0/16", "fd00:96::/112"],
    ));
    let reg = hub.register("n1");
    let (mut wire, mut model) = (WireState::default(), RemoteModel::new("n1", Vec::new()));
    deliver(&reg, &mut wire, &mut model);
    let want: Vec<IpNet> = vec![
        "10.96.0.0/16".parse().expect("net"),
        "fd00:96::/112".parse().expect("net"),
    ];
    assert_eq!(model.snapshot().service_cidrs, want);

    // A second object adds a range: only the ranges are sent, and the node changed.
    hub.apply(service_cidr("extra", &["10.97.0.0/16"]));
    let (changes, node_changed) = deliver(&reg, &mut wire, &mut model);
    assert_eq!((changes, node_changed), (0, true));
    assert_eq!(model.snapshot().service_cidrs.len(), 3);

    // A reconnect replay of the same ranges changes nothing.
    let again = hub.register("n1");
    assert_eq!(deliver(&again, &mut wire, &mut model), (0, false));
    assert_eq!(model.snapshot().service_cidrs.len(), 3);

    // Every object gone: no ranges.
    hub.apply(Event::Delete(kpng_model::ObjectRef {
        kind: kpng_model::Kind::ServiceCidr,
        namespace: "".into(),
        name: "kubernetes".into(),
    }));
    hub.apply(Event::Delete(kpng_model::ObjectRef {
        kind: kpng_model::Kind::ServiceCidr,
        namespace: "".into(),
        name: "extra".into(),
    }));
    assert_eq!(deliver(&reg, &mut wire, &mut model), (0, true));
    assert!(model.snapshot().service_cidrs.is_empty());
}

#[test]
fn change_counters_count_service_and_endpoint_values() {
    let hub = hub();
    let reg = hub.register("n1");
    let (mut wire, mut model) = (WireState::default(), RemoteModel::new("n1", Vec::new()));
    deliver(&reg, &mut wire, &mut model);
    // One endpoint more for one Service: its Endpoint value is new, its Service value is not.
    hub.apply(Event::Apply(
        kpng_k8s::from_json::<k8s_openapi::api::discovery::v1::EndpointSlice>(json!({
            "metadata": {"namespace": "default", "name": "extra-ep",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}],
            "endpoints": [{"addresses": ["10.244.9.9"], "nodeName": "n3"}]
        }))
        .expect("slice")
        .object,
    ));
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("rt");
    for op in rt.block_on(reg.slot.next()).ops() {
        wire.apply(op).expect("valid op");
    }
    let (update, errors) = wire.take_update();
    assert!(errors.is_empty(), "{errors:?}");
    let info = RemoteModel::describe(&update);
    assert!(
        info.objects.is_empty(),
        "no Kubernetes object reaches a node"
    );
    assert_eq!(info.endpoint_changes, 1, "{update:?}");
    assert_eq!(info.service_changes, 0, "{update:?}");
    let out = model.apply(update);
    assert_eq!(out.slices_changed, 1);
    assert!(out.trigger_times.is_empty());
}

#[tokio::test]
async fn an_unreachable_brain_is_reported_with_the_reason_underneath() {
    // A port that was just free: nothing listens there.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind on loopback");
        listener.local_addr().expect("bound address").port()
    };
    let failed = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("a valid address")
        .connect()
        .await
        .expect_err("nothing listens");
    let text = SessionError::from(failed).to_string();
    assert!(text.starts_with("transport error: "), "{text}");
    assert!(text.contains("Connection refused"), "{text}");
}

/// The real client watching `addr` as node-a: its task, and where its updates arrive.
fn watch_as_node_a(addr: ApiAddr) -> (tokio::task::JoinHandle<()>, mpsc::Receiver<RemoteUpdate>) {
    let config = WatchConfig {
        addr,
        tls: TlsFiles::default(),
        tls_server_name: None,
        node_name: "node-a".into(),
        retry_min: Duration::from_millis(50),
        retry_max: Duration::from_millis(200),
        health: InputHealth::default(),
        no_state_grace: crate::client::NO_STATE_GRACE,
        earlier_rules: false,
        accept_empty_state: false,
        held_empty_state: Default::default(),
        version: crate::version::VERSION.into(),
    };
    let (updates, received) = mpsc::channel(4);
    (tokio::spawn(watch(config, updates)), received)
}

/// The next update, within 10 s.
async fn next_update(received: &mut mpsc::Receiver<RemoteUpdate>, what: &str) -> RemoteUpdate {
    tokio::time::timeout(Duration::from_secs(10), received.recv())
        .await
        .unwrap_or_else(|_| panic!("{what} within 10 s"))
        .expect("an update")
}

/// A brain that knows nothing of `WatchReq.continuous` (KPNG's own, or a kpng before it): it
/// answers each request with the next change set, and sends no `kpng-watch-continuous` header.
struct AskedEachTime(Arc<Hub>);

#[tonic::async_trait]
impl proto::sets_server::Sets for AskedEachTime {
    type WatchStream = ReceiverStream<Result<proto::OpItem, tonic::Status>>;

    async fn watch(
        &self,
        request: tonic::Request<tonic::Streaming<proto::WatchReq>>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        let mut requests = request.into_inner();
        let hub = self.0.clone();
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            let mut registration = None;
            while let Ok(Some(req)) = requests.message().await {
                let reg = registration.get_or_insert_with(|| hub.register(&req.node_name));
                for op in reg.slot.next().await.ops() {
                    if tx.send(Ok(op)).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(tonic::Response::new(ReceiverStream::new(rx)))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brain_without_continuous_watches_is_asked_for_each_change_set() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("old-brain.sock");
    let hub = hub();
    let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(proto::sets_server::SetsServer::new(AskedEachTime(
                hub.clone(),
            )))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let addr = format!("unix://{}", socket.display())
        .parse()
        .expect("addr");
    let (watching, mut received) = watch_as_node_a(addr);
    let first = next_update(&mut received, "the first change set").await;
    assert!(first.replay, "the replay");
    hub.apply(service_cidr("extra", &["10.97.0.0/16"]));
    let second = next_update(&mut received, "the second change set (the client asked)").await;
    assert!(!second.replay, "a change, not a replay");
    assert!(second.service_cidrs.is_some(), "the change: {second:?}");
    watching.abort();
}

/// 100 ClusterIP Services whose endpoint runs on node-b: node-a depends on none of them.
fn hundred_services_elsewhere() -> Event {
    let mut yaml = String::from(
        "---\napiVersion: v1\nkind: Node\nmetadata: {name: node-a}\n\
         ---\napiVersion: v1\nkind: Node\nmetadata: {name: node-b}\n",
    );
    for i in 0..100u32 {
        yaml.push_str(&format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: default, name: s{i}}}\n\
             spec: {{clusterIP: 10.96.1.{}, ports: [{{name: p, port: 80}}]}}\n\
             ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{namespace: default, name: s{i}-1, labels: {{kubernetes.io/service-name: s{i}}}}}\n\
             addressType: IPv4\nports: [{{name: p, port: 8080}}]\n\
             endpoints: [{{addresses: [10.244.2.{}], nodeName: node-b}}]\n",
            i + 1,
            i + 1,
        ));
    }
    Event::Replace {
        kinds: vec![
            kpng_model::Kind::Service,
            kpng_model::Kind::EndpointSlice,
            kpng_model::Kind::Node,
        ],
        objects: kpng_source_file::parse_manifests(&yaml)
            .expect("manifests")
            .objects,
    }
}

/// The real client against the real server: the replay comes in bundles (every chunk is
/// shared whole with node-a), the client opens them, and holds what the plain ops would have
/// given it, for a fraction of the bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_in_bundles_gives_the_client_the_whole_state_for_fewer_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("brain.sock");
    let hub = Arc::new(Hub::new(
        ClusterModel::new(ClusterConfig::default()),
        crate::metrics::ApiMetrics::default(),
    ));
    hub.apply(hundred_services_elsewhere());
    // What the replay weighs as single ops.
    let plain: usize = {
        let reg = hub.register("node-a");
        let pending = reg.slot.next().await;
        pending
            .frames(hub.replay_cache(), false)
            .map(|c| c.len())
            .sum()
    };
    let addr = serve_on(&hub, &socket).await;
    let (watching, mut received) = watch_as_node_a(addr);
    let first = next_update(&mut received, "the replay").await;
    assert!(first.replay);
    assert_eq!(first.services.len(), 100, "{first:?}");
    assert_eq!(first.endpoint_changes, 100);
    assert!(first.services.iter().all(|(_, ports)| ports.len() == 1));
    let sent = hub.metrics().sent_bytes.get() as usize;
    assert!(sent * 3 < plain, "{plain} bytes as single ops, {sent} sent");
    assert_eq!(
        hub.metrics().ops.get(),
        1 + 1 + 200,
        "Reset, the node, 200 values"
    );
    watching.abort();
}

/// A stream that broke after the brain said nothing for the keepalive's timeout is named as a
/// brain gone silent (its host vanished): until 2026-12-07 the node said only "h2 protocol
/// error: … broken pipe", the words of a brain that closed the connection.
#[test]
fn a_stream_broken_after_the_keepalives_timeout_names_a_silent_brain() {
    let pipe = "h2 protocol error: stream closed because of a broken pipe";
    let long = Some(KEEPALIVE_TIMEOUT + Duration::from_secs(9));
    // (failure, connected, silent for, a piece of the hint or "" for none)
    let cases: [(&str, bool, Option<Duration>, &str); 6] = [
        (pipe, true, long, "went silent"),
        (pipe, true, long, "39s"),
        (pipe, true, long, "keepalive"),
        // The brain sent something a moment ago: it closed the connection itself.
        (pipe, true, Some(Duration::from_secs(2)), ""),
        // Never watching: a connection that fails at once is not a silence.
        (pipe, false, long, ""),
        // Another failure than a closed connection says what it is.
        ("status: Internal, message: \"boom\"", true, long, ""),
    ];
    for (failure, connected, silent, want) in cases {
        let hint = silence_hint(failure, connected, silent);
        if want.is_empty() {
            assert_eq!(hint, "", "{failure} {silent:?}");
        } else {
            assert!(hint.contains(want), "{want:?} in {hint}");
        }
    }
}

#[test]
fn tls_mismatches_get_a_hint_naming_the_flags() {
    use crate::addr::TlsFiles;
    let plain = TlsFiles::default();
    let ca_only = TlsFiles {
        ca: Some("ca.pem".into()),
        ..TlsFiles::default()
    };
    // (failure, TLS files, ever connected, a piece of the hint or "" for none)
    let cases: [(&str, &TlsFiles, bool, &str); 10] = [
        (
            "http2 error: GoAway(b\"\", FRAME_SIZE_ERROR)",
            &plain,
            false,
            "seems to serve TLS",
        ),
        (
            "connection closed",
            &plain,
            false,
            "if the brain serves TLS",
        ),
        (
            "operation was canceled",
            &plain,
            false,
            "at its --max-connections",
        ),
        ("connection closed", &plain, true, ""),
        ("Connection refused (os error 111)", &plain, false, ""),
        (
            "received corrupt message of type InvalidContentType",
            &ca_only,
            false,
            "plaintext",
        ),
        (
            "invalid peer certificate: UnsupportedCertVersion",
            &ca_only,
            true,
            "X.509 v1",
        ),
        ("broken pipe", &ca_only, false, "client certificate (mTLS)"),
        // A load balancer with no brain behind it accepts, then closes at once.
        (
            "connection closed",
            &plain,
            false,
            "or a load balancer with no brain behind it",
        ),
        (
            "broken pipe",
            &ca_only,
            false,
            "or a load balancer with no brain behind it",
        ),
    ];
    for (failure, tls, ever, want) in cases {
        let hint = tls_hint(failure, tls, ever);
        if want.is_empty() {
            assert_eq!(hint, "", "{failure}");
        } else {
            assert!(hint.contains(want), "{failure}: {hint}");
        }
    }
}

/// The real client against the real server: what the brain reports about its own input
/// (rejected objects, its source's problems) lands in the node's input record, which its
/// `kpng status` shows, and changes when the brain's report does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_brains_report_reaches_the_nodes_input_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("brain.sock");
    let brain_input = InputHealth::new("kube https://10.0.0.1:6443/");
    let hub = Arc::new(
        Hub::new(
            ClusterModel::new(ClusterConfig::default()),
            crate::metrics::ApiMetrics::default(),
        )
        .reporting(brain_input.clone()),
    );
    hub.apply(fixtures::cluster_event());
    let addr = serve_on(&hub, &socket).await;
    let node_input = InputHealth::default();
    let config = WatchConfig {
        addr,
        tls: TlsFiles::default(),
        tls_server_name: None,
        node_name: "n1".into(),
        retry_min: Duration::from_millis(50),
        retry_max: Duration::from_millis(200),
        health: node_input.clone(),
        no_state_grace: crate::client::NO_STATE_GRACE,
        earlier_rules: false,
        accept_empty_state: false,
        held_empty_state: Default::default(),
        version: crate::version::VERSION.into(),
    };
    let (updates, mut received) = mpsc::channel(4);
    let watching = tokio::spawn(watch(config, updates));
    next_update(&mut received, "the replay").await;
    let report = node_input
        .state()
        .brain_report
        .expect("a report after the replay");
    assert_eq!(report.source, "kube https://10.0.0.1:6443/");
    assert!(report.problems.is_empty() && report.rejected.is_empty());

    // The brain rejects a Service and its API server fails.
    let typo = kpng_k8s::from_json::<k8s_openapi::api::core::v1::Service>(json!({
        "metadata": {"namespace": "default", "name": "typo"},
        "spec": {"clusterIP": "10.96.9.9", "ports": [{"port": 80, "protocol": "TPC"}]}
    }))
    .expect("service");
    hub.apply(Event::Apply(typo.object));
    next_update(&mut received, "the report").await;
    brain_input.failing("API server", "unreachable", std::time::SystemTime::now());
    hub.refresh_report();
    next_update(&mut received, "the next report").await;
    let report = node_input.state().brain_report.expect("a report");
    assert_eq!(report.rejected_total, 1);
    let r = &report.rejected[0];
    assert_eq!(
        (
            r.kind.as_str(),
            r.namespace.as_str(),
            r.name.as_str(),
            r.field.as_str(),
            r.kept
        ),
        (
            "Service",
            "default",
            "typo",
            "spec.ports[0].protocol",
            false
        )
    );
    assert_eq!(
        report.problems.keys().collect::<Vec<_>>(),
        ["API server"],
        "{report:?}"
    );
    assert!(
        node_input.state().problems.is_empty(),
        "the brain's problems are not the node's own"
    );
    watching.abort();
}

#[test]
fn a_reset_forgets_the_brains_report_and_a_brain_without_one_leaves_none() {
    let mut wire = WireState::default();
    assert_eq!(wire.take_brain_report(), None, "nothing received");
    let report = proto::KpngBrainReport {
        source: "file /x.yaml".into(),
        rejected_total: 3,
        ..Default::default()
    };
    for op in [
        proto::OpItem {
            op: Some(Op::Reset(proto::EmptyOp {})),
        },
        proto::OpItem {
            op: Some(Op::Set(proto::Value {
                r#ref: Some(proto::Ref {
                    set: proto::Set::KpngBrainReportSet as i32,
                    path: "brain".into(),
                }),
                bytes: report.encode_to_vec().into(),
            })),
        },
    ] {
        wire.apply(op).expect("valid");
    }
    let got = wire
        .take_brain_report()
        .expect("changed")
        .expect("a report");
    assert_eq!(
        (got.source.as_str(), got.rejected_total),
        ("file /x.yaml", 3)
    );
    assert_eq!(wire.take_brain_report(), None, "taken");
    // A replay from a brain that reports nothing (KPNG's, an older kpng).
    wire.apply(proto::OpItem {
        op: Some(Op::Reset(proto::EmptyOp {})),
    })
    .expect("valid");
    assert_eq!(wire.take_brain_report(), Some(None));
}

/// An outage warns once per cause, whatever their order: a brain refusing connections fails
/// in turn as a cancelled operation and as a transport error, and used to warn at each retry.
/// A connection that only closed while connecting ("~…", a follow-on) is warned about only
/// when nothing else explains the outage, after [`WarnedCauses::PATIENCE`] of them: a brain
/// refusing this node's certificate sends its alert, then a broken pipe and a cancelled
/// operation follow, and each was a warning until 2026-12-06.
#[test]
fn an_outage_warns_once_per_cause() {
    // (the causes of one outage in order, which of them warn)
    let cases: [(&[&str], &[bool]); 8] = [
        (&["a", "a", "a"], &[true, false, false]),
        (
            &["a", "b", "a", "b", "a"],
            &[true, true, false, false, false],
        ),
        (
            &["a", "b", "c", "d", "e", "a"],
            &[true, true, true, true, false, false],
        ),
        (&[], &[]),
        // The alert, then what follows from it: one warning.
        (
            &["a", "~1", "~2", "~1", "a"],
            &[true, false, false, false, false],
        ),
        // What follows from it first, then the alert: still one warning, the alert.
        (&["~1", "a", "~2", "a"], &[false, true, false, false]),
        (&["~1", "~2", "a", "~1"], &[false, false, true, false]),
        // Nothing but closed connections: warned once at the third (2 s after the first).
        (
            &["~1", "~2", "~1", "~2", "~1"],
            &[false, false, true, false, false],
        ),
    ];
    // One attempt a second, unless the case says otherwise below.
    let start = std::time::Instant::now();
    for (causes, want) in cases {
        let mut warned = super::WarnedCauses::default();
        let got: Vec<bool> = causes
            .iter()
            .enumerate()
            .map(|(i, c)| {
                warned.first_time_at(
                    &super::Failure {
                        cause: c.to_string(),
                        follow_on: c.starts_with('~'),
                        refused: None,
                    },
                    start + std::time::Duration::from_secs(i as u64),
                )
            })
            .collect();
        assert_eq!(got, want, "{causes:?}");
    }
    // Closed connections in quick succession (an expired certificate: three in 0.36 s before
    // the alert came): no warning until the alert, which is the one.
    let mut warned = super::WarnedCauses::default();
    let at = |ms: u64| start + std::time::Duration::from_millis(ms);
    let closed = |n: u8| super::Failure {
        cause: format!("~{n}"),
        follow_on: true,
        refused: None,
    };
    let alert = super::Failure {
        cause: "expired".into(),
        follow_on: false,
        refused: None,
    };
    assert!(!warned.first_time_at(&closed(1), at(0)));
    assert!(!warned.first_time_at(&closed(2), at(85)));
    assert!(
        !warned.first_time_at(&closed(1), at(356)),
        "the third, 0.36 s in"
    );
    assert!(warned.first_time_at(&alert, at(700)));
    assert!(!warned.first_time_at(&closed(2), at(3_000)));
}

/// A refusal is warned about once per episode, however its words change while the node
/// retries: a node the brain's cluster does not have is told the brain's Node count, and until
/// 2026-12-07 each new count warned again. Another refusal (another code) or another cause
/// still warns.
#[test]
fn a_refusal_warns_once_whatever_its_counts() {
    let unknown = |nodes: usize| super::Failure {
        cause: format!(
            "the brain refused this node: this brain's cluster has no Node named \"n9\" (it \
             has {nodes} Nodes): … (FailedPrecondition)"
        ),
        follow_on: false,
        refused: Some(tonic::Code::FailedPrecondition),
    };
    let busy = super::Failure {
        cause: "the brain refused this node: too many watches (ResourceExhausted)".into(),
        follow_on: false,
        refused: Some(tonic::Code::ResourceExhausted),
    };
    let unreachable = super::Failure {
        cause: "transport error".into(),
        follow_on: false,
        refused: None,
    };
    // (the failures of one outage in order, which of them warn)
    let cases: [(Vec<super::Failure>, &[bool]); 3] = [
        (
            vec![unknown(3), unknown(4), unknown(5), unknown(3), unknown(6)],
            &[true, false, false, false, false],
        ),
        (
            vec![unknown(3), busy.clone(), unknown(4), busy.clone()],
            &[true, true, false, false],
        ),
        (
            vec![
                unknown(3),
                unreachable.clone(),
                unknown(4),
                unreachable.clone(),
            ],
            &[true, true, false, false],
        ),
    ];
    let start = std::time::Instant::now();
    for (i, (failures, want)) in cases.into_iter().enumerate() {
        let mut warned = super::WarnedCauses::default();
        let got: Vec<bool> = failures
            .iter()
            .map(|f| warned.first_time_at(f, start))
            .collect();
        assert_eq!(got, want, "case {i}");
        // What `kpng status` shows is the last warned refusal's words, as before.
        assert!(warned.telling().is_some(), "case {i}");
    }
}

/// The brain's TLS alerts are named as its refusal of this node's certificate, with what to
/// check; the failures that follow a refusal are follow-ons, and a stream that closes after
/// it was connected is not (the brain went away: a cause of its own).
#[test]
fn the_brains_tls_alert_is_named_and_what_follows_it_is_a_follow_on() {
    let tls = crate::addr::TlsFiles {
        ca: Some("ca.pem".into()),
        cert: Some("node.pem".into()),
        key: Some("node-key.pem".into()),
    };
    // (the transport's words, the words the cause must hold, whether a follow-on)
    let cases: [(&str, &str, bool); 6] = [
        (
            "transport error: received fatal alert: UnknownCA",
            "the brain refused this node's certificate: unknown CA",
            false,
        ),
        (
            "transport error: received fatal alert: CertificateExpired",
            "the brain refused this node's certificate: expired",
            false,
        ),
        (
            "transport error: received fatal alert: CertificateRequired",
            "requires a client certificate",
            false,
        ),
        (
            "transport error: received fatal alert: HandshakeFailure",
            "the brain ended the TLS handshake: HandshakeFailure",
            false,
        ),
        (
            "transport error: Broken pipe (os error 32)",
            "Broken pipe",
            true,
        ),
        ("transport error: operation was canceled", "canceled", true),
    ];
    for (text, want, follow_on) in cases {
        let error = SessionError::Status(tonic::Status::unavailable(text));
        let failure = super::Failure::of(&error, &tls, false, false);
        assert!(failure.cause.contains(want), "{text}: {failure:?}");
        assert!(failure.cause.contains(text), "{text}: {failure:?}");
        assert_eq!(failure.follow_on, follow_on, "{text}");
    }
    let closed = SessionError::Status(tonic::Status::unavailable("connection closed"));
    assert!(!super::Failure::of(&closed, &tls, true, true).follow_on);
}

/// A brain that accepts this node and sends no state (restarted, still listing its input):
/// the report held from before is the earlier connection's, and after the grace "no state
/// yet" is an input problem of the node, until the brain's first state arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brain_that_sends_no_state_is_an_input_problem_after_the_grace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("brain.sock");
    let hub = Arc::new(
        Hub::new(
            ClusterModel::new(ClusterConfig::default()),
            crate::metrics::ApiMetrics::default(),
        )
        .reporting(InputHealth::new("file /cluster.yaml")),
    );
    let addr = serve_on(&hub, &socket).await;
    // What an earlier connection (to the brain before its restart) had reported.
    let node_input = InputHealth::default();
    node_input.set_brain_report(Some(kpng_model::input::BrainReport {
        source: "file /cluster.yaml".into(),
        ..Default::default()
    }));
    let config = WatchConfig {
        addr,
        tls: TlsFiles::default(),
        tls_server_name: None,
        node_name: "n1".into(),
        retry_min: Duration::from_millis(50),
        retry_max: Duration::from_millis(200),
        health: node_input.clone(),
        no_state_grace: Duration::from_millis(200),
        earlier_rules: false,
        accept_empty_state: false,
        held_empty_state: Default::default(),
        version: crate::version::VERSION.into(),
    };
    let (updates, mut received) = mpsc::channel(4);
    let watching = tokio::spawn(watch(config, updates));
    let problem = async {
        loop {
            if let Some(p) = node_input.state().problems.get("brain") {
                return p.message.clone();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let message = tokio::time::timeout(Duration::from_secs(10), problem)
        .await
        .expect("a problem after the grace");
    assert_eq!(message, NO_STATE_YET);
    assert!(
        node_input.state().brain_report_from_earlier_connection,
        "the report held is the earlier connection's"
    );

    // The brain lists its input: its state arrives, the problem is over.
    hub.apply(fixtures::cluster_event());
    next_update(&mut received, "the replay").await;
    let state = node_input.state();
    assert!(state.problems.is_empty(), "{:?}", state.problems);
    assert!(!state.brain_report_from_earlier_connection);
    watching.abort();
}

/// Serves `hub` on the Unix socket `socket` (plaintext, default limits) in a task; returns its
/// address.
async fn serve_on(hub: &Arc<Hub>, socket: &std::path::Path) -> ApiAddr {
    let addr: ApiAddr = format!("unix://{}", socket.display())
        .parse()
        .expect("addr");
    let server = crate::server::serve(
        hub.clone(),
        &addr,
        &TlsFiles::default(),
        Default::default(),
        std::future::pending(),
    )
    .await
    .expect("listen");
    tokio::spawn(server);
    addr
}

/// Between a reconnect's headers and the brain's first item the node is connected: its
/// status says so, no longer the outage's "unreachable" (which it kept until 2026-12-07),
/// keeping when the outage began; the first state ends the problem. The brain's version
/// arrives with the headers, and the brain lists the node's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_reconnect_the_status_says_connected_and_waiting_until_the_first_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("brain.sock");
    // A brain still listing its input: it answers and sends nothing.
    let hub = Arc::new(Hub::new(
        ClusterModel::new(ClusterConfig::default()),
        crate::metrics::ApiMetrics::default(),
    ));
    let addr = serve_on(&hub, &socket).await;
    let node_input = InputHealth::default();
    let outage_began = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
    node_input.failing(
        "brain",
        "unreachable: transport error: Connection refused; keeping the rules as they are, \
         retrying",
        outage_began,
    );
    let config = WatchConfig {
        retry_min: Duration::from_millis(50),
        retry_max: Duration::from_millis(200),
        health: node_input.clone(),
        no_state_grace: Duration::from_secs(60),
        ..WatchConfig::new(addr, "n1")
    };
    let (updates, mut received) = mpsc::channel(4);
    let watching = tokio::spawn(watch(config, updates));
    let waiting = async {
        loop {
            let state = node_input.state();
            if let Some(p) = state.problems.get("brain")
                && p.message == crate::client::WAITING_FOR_FIRST_STATE
            {
                return (p.since, state.brain_version);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let (since, brain_version) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap_or_else(|_| panic!("still {:?}", node_input.state().problems));
    assert_eq!(since, outage_began, "the outage's start is kept");
    assert_eq!(brain_version.as_deref(), Some(crate::version::VERSION));
    let watchers = hub.watchers();
    assert_eq!(watchers.len(), 1);
    assert_eq!(
        watchers[0].version.as_deref(),
        Some(crate::version::VERSION)
    );

    hub.apply(fixtures::cluster_event());
    next_update(&mut received, "the replay").await;
    let state = node_input.state();
    assert!(state.problems.is_empty(), "{:?}", state.problems);
    watching.abort();
}

/// Two builds of one release tell each other apart: the brain and the node send their build
/// (version and git commit, as the binary passes them in), each side records the other's, and
/// the brain counts its connected nodes per build in `kpng_api_connected_node_versions`, a
/// client that sends none as `unknown`. Until 2026-12-07 both sent `0.1.0` whatever the
/// commit, and a rollout's progress could not be seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brain_and_node_exchange_their_builds_and_the_brain_counts_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("brain.sock");
    let brain_build = crate::version::build("aaaaaaaaaaaa");
    let node_build = crate::version::build("bbbbbbbbbbbb");
    let mut registry = prometheus_client::registry::Registry::default();
    let hub = Arc::new(
        Hub::new(
            ClusterModel::new(ClusterConfig::default()),
            crate::metrics::ApiMetrics::new(&mut registry),
        )
        .with_version(brain_build.clone()),
    );
    hub.apply(fixtures::cluster_event());
    let addr = serve_on(&hub, &socket).await;
    let node_input = InputHealth::default();
    let config = WatchConfig {
        version: node_build.clone(),
        ..node_config(addr, "n1", &node_input)
    };
    let (updates, mut received) = mpsc::channel(4);
    let watching = tokio::spawn(watch(config, updates));
    next_update(&mut received, "the replay").await;
    assert_eq!(
        node_input.state().brain_version.as_deref(),
        Some(brain_build.as_str()),
        "the node's `(kpng X)`"
    );
    let watchers = hub.watchers();
    assert_eq!(watchers.len(), 1);
    assert_eq!(watchers[0].version.as_deref(), Some(node_build.as_str()));
    // A client that sends no version (KPNG's Go client, a kpng before 2026-12-07).
    let older = hub.register("n2");
    let gauges = || {
        hub.refresh_node_gauges();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        text.lines()
            .filter(|l| l.starts_with("kpng_api_connected_node_versions{"))
            .map(str::to_string)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        gauges(),
        [
            format!("kpng_api_connected_node_versions{{version=\"{node_build}\"}} 1"),
            "kpng_api_connected_node_versions{version=\"unknown\"} 1".to_string(),
        ]
    );
    // A build no node runs any more has no series: the rollout's old build disappears.
    drop(older);
    assert_eq!(
        gauges(),
        [format!(
            "kpng_api_connected_node_versions{{version=\"{node_build}\"}} 1"
        )]
    );
    watching.abort();
}

/// The brain's version is recorded at each connection; a major.minor mismatch is warned once
/// per change of the brain's version, not at every reconnect; a brain that sends none (KPNG's)
/// is no mismatch.
#[test]
fn a_brain_of_another_minor_version_is_warned_about_once() {
    let config = WatchConfig::new("unix:///nowhere.sock".parse().expect("addr"), "n1");
    let other = "99.0.0".to_string();
    for (step, version, warns) in [
        (1, Some(crate::version::VERSION.to_string()), false),
        (2, Some(crate::version::VERSION.to_string()), false),
        (3, Some(other.clone()), true),
        (4, Some(other.clone()), false),
        (5, None, false),
        (6, Some(other.clone()), true),
    ] {
        assert_eq!(
            super::brain_answered(&config, version.clone()),
            warns,
            "step {step}"
        );
        assert_eq!(config.health.state().brain_version, version, "step {step}");
    }
    // Without an outage's problem, connecting records none.
    assert!(config.health.state().problems.is_empty());
}

/// A brain on `socket` until `stop` fires (it then ends its streams as shutting down).
async fn serve_until(
    hub: &Arc<Hub>,
    socket: &std::path::Path,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> (ApiAddr, tokio::task::JoinHandle<()>) {
    let addr: ApiAddr = format!("unix://{}", socket.display())
        .parse()
        .expect("addr");
    let server = crate::server::serve(
        hub.clone(),
        &addr,
        &TlsFiles::default(),
        Default::default(),
        async move {
            let _ = stop.await;
        },
    )
    .await
    .expect("listen");
    let task = tokio::spawn(async move {
        let _ = server.await;
    });
    (addr, task)
}

/// The real client watching `addr` as `node`, recording in `health`.
fn node_config(addr: ApiAddr, node: &str, health: &InputHealth) -> WatchConfig {
    WatchConfig {
        retry_min: Duration::from_millis(50),
        retry_max: Duration::from_millis(200),
        health: health.clone(),
        ..WatchConfig::new(addr, node)
    }
}

/// Waits until `health` has a problem `what` (its message), within 10 s.
async fn problem(health: &InputHealth, what: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(p) = health.state().problems.get(what) {
            return p.message.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a {what:?} problem within 10 s: {:?}",
            health.state().problems
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A brain whose cluster has Nodes but not this node's refuses it with a status the node
/// shows; the node gets no state, retries, and is served once the Node appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_of_another_cluster_gets_no_state_and_is_told_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hub = Arc::new(Hub::new(
        ClusterModel::new(ClusterConfig::default()),
        crate::metrics::ApiMetrics::default(),
    ));
    hub.apply(fixtures::cluster_event());
    let addr = serve_on(&hub, &dir.path().join("brain.sock")).await;
    let health = InputHealth::default();
    let (updates, mut received) = mpsc::channel(4);
    let watching = tokio::spawn(watch(node_config(addr, "n4", &health), updates));
    let message = problem(&health, "brain").await;
    assert!(
        message.starts_with(
            "the brain refused this node: this brain's cluster has no Node named \"n4\" (it has \
             3 Nodes)"
        ) && message.contains("(FailedPrecondition)")
            && message.ends_with("; keeping the rules as they are, retrying"),
        "{message}"
    );
    assert!(received.try_recv().is_err(), "no state");
    let refused = hub
        .metrics()
        .refused
        .get_or_create(&crate::metrics::RefusedLabel {
            reason: "unknown_node".into(),
        })
        .get();
    assert!(refused >= 1, "counted: {refused}");
    hub.apply(Event::Apply(
        kpng_k8s::from_json::<k8s_openapi::api::core::v1::Node>(
            json!({"metadata": {"name": "n4"}}),
        )
        .expect("node")
        .object,
    ));
    let update = next_update(&mut received, "the state once the Node exists").await;
    assert!(update.replay && !update.services.is_empty(), "{update:?}");
    assert!(!health.state().problems.contains_key("brain"));
    watching.abort();
}

/// A node that programs Services does not apply a new brain's first state when it holds no
/// Service (a brain restarted on an empty input): it keeps them, says so, and applies the
/// brain's state, the held one included, once it holds a Service again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_brains_empty_state_is_held_until_it_has_a_service() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("brain.sock");
    let new_hub = || {
        Arc::new(Hub::new(
            ClusterModel::new(ClusterConfig::default()),
            crate::metrics::ApiMetrics::default(),
        ))
    };
    let first = new_hub();
    first.apply(fixtures::cluster_event());
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let (addr, server) = serve_until(&first, &socket, stopped).await;
    let health = InputHealth::default();
    let config = node_config(addr, "n1", &health);
    let held = config.held_empty_state.clone();
    let (updates, mut received) = mpsc::channel(4);
    let watching = tokio::spawn(watch(config, updates));
    let replay = next_update(&mut received, "the first brain's state").await;
    let services = replay.services.len();
    assert!(services > 1, "{replay:?}");

    // The brain restarts on an empty input (no Service, no Node).
    let _ = stop.send(());
    let _ = server.await;
    let empty = new_hub();
    empty.apply(Event::Replace {
        kinds: vec![
            kpng_model::Kind::Service,
            kpng_model::Kind::EndpointSlice,
            kpng_model::Kind::Node,
        ],
        objects: Vec::new(),
    });
    let (_keep_serving, serving) = tokio::sync::oneshot::channel();
    let (_, _server) = serve_until(&empty, &socket, serving).await;
    let message = problem(&health, "brain state").await;
    assert!(
        message.starts_with(&format!(
            "the brain sent a state with no Service: not applied, keeping the {services} \
             Services it programs"
        )),
        "{message}"
    );
    assert_eq!(held.get(), 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        received.try_recv().is_err(),
        "the empty state is not applied"
    );

    // Its input is back: one update, the held replay and the Services together.
    empty.apply(fixtures::cluster_event());
    let update = next_update(&mut received, "the state once it has Services").await;
    assert!(update.replay, "the held replay goes through with it");
    assert_eq!(update.services.len(), services, "{update:?}");
    assert!(update.services.iter().all(|(_, ports)| !ports.is_empty()));
    assert_eq!(held.get(), 0);
    assert!(!health.state().problems.contains_key("brain state"));
    watching.abort();
}

/// An error and its causes, for the display of a chain.
#[derive(Debug)]
struct Chain(&'static str, Option<Box<Chain>>);

impl std::fmt::Display for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Chain {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.1
            .as_deref()
            .map(|c| c as &(dyn std::error::Error + 'static))
    }
}

/// A broken stream's status shows each cause once: tonic's message ends with its source's
/// words, which until 2026-12-07 were shown twice ("h2 protocol error: error reading a body
/// from connection: error reading a body from connection: stream closed because of a broken
/// pipe").
#[test]
fn a_status_shows_each_cause_once() {
    let chain = || {
        Chain(
            "error reading a body from connection",
            Some(Box::new(Chain(
                "stream closed because of a broken pipe",
                None,
            ))),
        )
    };
    let mut status =
        tonic::Status::unknown("h2 protocol error: error reading a body from connection");
    status.set_source(Arc::new(chain()));
    assert_eq!(
        super::status_text(&status),
        "h2 protocol error: error reading a body from connection: stream closed because of a \
         broken pipe"
    );
    // A message its source begins with (the source says more), and a plain chain.
    let mut status = tonic::Status::unknown("error reading");
    status.set_source(Arc::new(chain()));
    assert_eq!(
        super::status_text(&status),
        "error reading a body from connection: stream closed because of a broken pipe"
    );
    assert_eq!(
        super::with_causes(&Chain(
            "transport error",
            Some(Box::new(Chain(
                "transport error",
                Some(Box::new(Chain("refused", None)))
            )))
        )),
        "transport error: refused"
    );
}

/// A brain killed (its process gone: connections dropped without a status) and started
/// again: the node warns once for the outage, though it fails first as a broken stream and
/// then as refused connections (two warnings until 2026-12-07, whose text said retries are
/// logged at debug), and says how long it was cut off when the brain is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_brain_is_one_warning_and_its_return_says_how_long_the_outage_was() {
    use tracing::instrument::WithSubscriber;
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("brain.sock");
    let hub = hub();
    // A brain in a runtime of its own: shutting it down drops every connection at once, as
    // a `kill -9` does.
    let brain = |hub: Arc<Hub>, socket: std::path::PathBuf| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        runtime.spawn(async move {
            let addr: ApiAddr = format!("unix://{}", socket.display())
                .parse()
                .expect("addr");
            let server = crate::server::serve(
                hub,
                &addr,
                &TlsFiles::default(),
                Default::default(),
                std::future::pending(),
            )
            .await
            .expect("listen");
            let _ = server.await;
        });
        runtime
    };
    let first = brain(hub.clone(), socket.clone());
    let addr: ApiAddr = format!("unix://{}", socket.display())
        .parse()
        .expect("addr");
    let logs = Logs::default();
    let subscriber = logs.subscriber();
    let health = InputHealth::default();
    let (updates, mut received) = mpsc::channel(4);
    let watching =
        tokio::spawn(watch(node_config(addr, "n1", &health), updates).with_subscriber(subscriber));
    next_update(&mut received, "the first state").await;
    // The outage's lines only (the node may have started before the brain listened).
    let before = logs.text().len();

    first.shutdown_background();
    // Several attempts fail on the missing brain (retries every 50–200 ms).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !logs.text().contains("brain still unreachable, now:")
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = brain(hub.clone(), socket.clone());
    next_update(&mut received, "the replay from the brain started again").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !logs.text().contains("brain reachable again") && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = logs.text().split_off(before);
    assert_eq!(text.matches(" WARN ").count(), 1, "{text}");
    assert!(text.contains("lost the brain's stream"), "{text}");
    assert!(
        text.contains("brain reachable again: this node was cut off from it for"),
        "{text}"
    );
    assert!(
        !text.contains("error reading a body from connection: error reading a body"),
        "{text}"
    );
    watching.abort();
    second.shutdown_background();
}
