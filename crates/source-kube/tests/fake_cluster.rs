//! The `kube` source against the fake API server: what it asks for, the events it sends, and
//! how it rides through dropped watches, 410 Gone and an outage.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kpng_fake_apiserver::FakeApiServer;
use kpng_model::input::InputHealth;
use kpng_model::{Event, Kind, Model, ModelConfig, Object};
use kpng_source_kube::{
    ClientMetrics, ClientOptions, KubeSource, ListFailure, SourceConfig, SourceErrors, Superseded,
    client, connect,
};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tracing::instrument::WithSubscriber;

const WAIT: Duration = Duration::from_secs(20);

fn service(name: &str, ip: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "default", "name": name, "labels": labels},
        "spec": {"clusterIP": ip, "clusterIPs": [ip], "ports": [{"name": "http", "port": 80}]}})
}

fn slice(service: &str, ip: &str) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": "default", "name": format!("{service}-1"),
            "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "nodeName": "node1", "conditions": {"ready": true}}]})
}

fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.1"}]}})
}

/// A cluster of node1 + node2, Service `web` with one endpoint, one Service owned by another
/// proxy, and a ServiceCIDR.
fn cluster(server: &FakeApiServer) {
    for object in [
        node("node1"),
        node("node2"),
        service("web", "10.96.0.10", json!({})),
        slice("web", "10.244.1.2"),
        service(
            "theirs",
            "10.96.0.11",
            json!({"service.kubernetes.io/service-proxy-name": "other"}),
        ),
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
            "metadata": {"name": "kubernetes"}, "spec": {"cidrs": ["10.96.0.0/16"]}}),
    ] {
        server.apply(object).expect("apply");
    }
}

struct Running {
    events: mpsc::Receiver<Event>,
    /// What the source logged.
    logged: Logged,
    _task: tokio::task::JoinHandle<()>,
}

/// The levels and messages of the events logged inside the future it is attached to (no
/// tracing-subscriber here: a minimal subscriber that keeps each event's message).
#[derive(Clone, Default)]
struct Logged(Arc<Mutex<Vec<String>>>);

impl Logged {
    fn lines(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn any(&self, needle: &str) -> bool {
        self.lines().iter().any(|l| l.contains(needle))
    }
}

impl tracing::Subscriber for Logged {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        struct Message<'a>(&'a mut String);
        impl tracing::field::Visit for Message<'_> {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0.push_str(&format!("{value:?}"));
                }
            }
        }
        // The level first ("WARN …"): tests tell a warning from the same text at debug.
        let mut text = format!("{} ", event.metadata().level());
        event.record(&mut Message(&mut text));
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(text);
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// Polls `ok` until it holds; fails with `what` and `context()` after [`WAIT`].
async fn wait_for(what: &str, ok: impl Fn() -> bool, context: impl Fn() -> String) {
    wait_for_longer(what, WAIT, ok, context).await;
}

/// Waits until `health` records no problem: the outage is over in what `kpng status` shows.
async fn outage_over(health: &InputHealth) {
    wait_for(
        "the outage over in the record",
        || health.state().problems.is_empty(),
        || format!("{:?}", health.state().problems),
    )
    .await;
}

/// How many watches of `path` the server was asked for.
fn watches(server: &FakeApiServer, path: &str) -> usize {
    server
        .requests()
        .iter()
        .filter(|q| q.path == path && q.is_watch())
        .count()
}

async fn run(server: &FakeApiServer) -> Running {
    run_with(server, ClientOptions::default(), |source| source).await
}

/// A client of `server` with `options` (its kubeconfig filled in).
async fn client_of(server: &FakeApiServer, options: ClientOptions) -> kube::Client {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kubeconfig");
    server.write_kubeconfig(&path).expect("kubeconfig");
    let (client, _) = client(&ClientOptions {
        kubeconfig: Some(path),
        ..options
    })
    .await
    .expect("client");
    client
}

/// [`run`] with the client's `options` and the source as `configure` makes it.
async fn run_with(
    server: &FakeApiServer,
    options: ClientOptions,
    configure: impl FnOnce(KubeSource) -> KubeSource,
) -> Running {
    let client = client_of(server, options).await;
    let source = KubeSource::new(
        client,
        SourceConfig {
            node_name: Some("node1".into()),
            service_proxy_name: None,
        },
    );
    let source = configure(source);
    let (tx, events) = mpsc::channel(64);
    let logged = Logged::default();
    Running {
        events,
        _task: tokio::spawn(source.run(tx).with_subscriber(logged.clone())),
        logged,
    }
}

/// Events until `done` says stop, or fails after [`WAIT`].
async fn until(r: &mut Running, mut done: impl FnMut(&Event) -> bool) -> Vec<Event> {
    let mut seen = Vec::new();
    let result = tokio::time::timeout(WAIT, async {
        while let Some(e) = r.events.recv().await {
            let stop = done(&e);
            seen.push(e);
            if stop {
                return;
            }
        }
    })
    .await;
    assert!(result.is_ok(), "timed out; events so far: {seen:#?}");
    seen
}

fn names(events: &[Event], kind: Kind) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::ListItem(o) | Event::Apply(o) if o.kind() == kind => {
                Some(o.reference().name.to_string())
            }
            _ => None,
        })
        .collect()
}

fn list_done(kinds: &[Kind]) -> impl FnMut(&Event) -> bool {
    let mut left: Vec<Kind> = kinds.to_vec();
    move |e| {
        if let Event::ListDone { kinds } = e {
            left.retain(|k| !kinds.contains(k));
        }
        left.is_empty()
    }
}

#[tokio::test]
async fn lists_every_kind_with_kube_proxys_selectors() {
    let server = FakeApiServer::start().expect("server");
    cluster(&server);
    let mut r = run(&server).await;
    let events = until(&mut r, list_done(&Kind::ALL)).await;
    assert_eq!(
        names(&events, Kind::Service),
        ["web"],
        "the other proxy's Service is not listed"
    );
    assert_eq!(names(&events, Kind::EndpointSlice), ["web-1"]);
    assert_eq!(names(&events, Kind::Node), ["node1"], "only this node");
    assert_eq!(names(&events, Kind::ServiceCidr), ["kubernetes"]);
    for kind in Kind::ALL {
        let start = events
            .iter()
            .position(|e| matches!(e, Event::ListStart { kinds } if kinds == &[kind]));
        let done = events
            .iter()
            .position(|e| matches!(e, Event::ListDone { kinds } if kinds == &[kind]));
        assert!(start < done && start.is_some(), "{kind:?}: {events:#?}");
    }

    // The watches start right after the lists.
    let watching = |path: &str| {
        server
            .requests()
            .iter()
            .any(|q| q.path == path && q.is_watch())
    };
    let paths = [
        "/api/v1/services",
        "/apis/discovery.k8s.io/v1/endpointslices",
    ];
    let deadline = tokio::time::Instant::now() + WAIT;
    while !paths.iter().all(|p| watching(p)) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let requests = server.requests();
    let selector = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";
    for path in paths {
        let watch = requests
            .iter()
            .find(|q| q.path == path && q.is_watch())
            .unwrap_or_else(|| panic!("no watch of {path}: {requests:#?}"));
        assert_eq!(
            watch.query.get("labelSelector").map(String::as_str),
            Some(selector)
        );
        assert_eq!(
            watch.query.get("allowWatchBookmarks").map(String::as_str),
            Some("true")
        );
    }
    let nodes = requests
        .iter()
        .find(|q| q.path == "/api/v1/nodes")
        .expect("node list");
    assert_eq!(
        nodes.query.get("fieldSelector").map(String::as_str),
        Some("metadata.name=node1")
    );
}

#[tokio::test]
async fn changes_arrive_as_apply_and_delete_and_survive_dropped_watches() {
    let server = FakeApiServer::start().expect("server");
    cluster(&server);
    let mut r = run(&server).await;
    until(&mut r, list_done(&Kind::ALL)).await;

    server.apply(slice("web", "10.244.1.3")).expect("apply");
    let events = until(&mut r, |e| matches!(e, Event::Apply(_))).await;
    assert_eq!(names(&events, Kind::EndpointSlice), ["web-1"]);

    // Cut every watch: they resume from their resourceVersion, so no relist, and the next
    // change still arrives. The change is made once every watcher has asked again.
    let paths = [
        "/api/v1/services",
        "/apis/discovery.k8s.io/v1/endpointslices",
        "/api/v1/nodes",
    ];
    let requests = || format!("requests: {:#?}", server.requests());
    wait_for(
        "every watch open",
        || paths.iter().all(|p| watches(&server, p) > 0),
        requests,
    )
    .await;
    let before: Vec<usize> = paths.iter().map(|p| watches(&server, p)).collect();
    server.drop_watches();
    wait_for(
        "every watch asked for again",
        || {
            paths
                .iter()
                .zip(&before)
                .all(|(p, n)| watches(&server, p) > *n)
        },
        requests,
    )
    .await;
    for (path, n) in paths.iter().zip(&before) {
        let again = server
            .requests()
            .into_iter()
            .filter(|q| q.path == *path && q.is_watch())
            .nth(*n)
            .expect("the new watch");
        assert!(
            again
                .query
                .get("resourceVersion")
                .is_some_and(|rv| !rv.is_empty() && rv != "0"),
            "{path} resumes from its resourceVersion: {again:?}"
        );
    }
    server.delete("Service", "default", "web").expect("delete");
    let events = until(&mut r, |e| matches!(e, Event::Delete(_))).await;
    assert!(
        !events.iter().any(|e| matches!(e, Event::ListStart { .. })),
        "a dropped watch resumes without a relist: {events:#?}"
    );
    let Some(Event::Delete(gone)) = events.last() else {
        panic!("{events:#?}")
    };
    assert_eq!((gone.kind, &*gone.name), (Kind::Service, "web"));
}

#[tokio::test]
async fn gone_relists_and_the_model_sees_only_the_difference() {
    let server = FakeApiServer::start().expect("server");
    cluster(&server);
    server
        .apply(service("api", "10.96.0.20", json!({})))
        .expect("apply");
    let mut r = run(&server).await;
    let mut model = Model::new(ModelConfig {
        node_name: "node1".into(),
        ..ModelConfig::default()
    });
    for e in until(&mut r, list_done(&Kind::ALL)).await {
        model.apply(e);
    }
    let before = model.snapshot().clone();
    assert_eq!(before.ports.len(), 2);

    // The endpoint moves while the watches are expired: every watcher relists.
    server.apply(slice("web", "10.244.1.9")).expect("apply");
    server.expire_watches();
    let events = until(
        &mut r,
        list_done(&[Kind::Service, Kind::EndpointSlice, Kind::Node]),
    )
    .await;
    assert!(
        events.iter().any(|e| matches!(e, Event::ListStart { .. })),
        "{events:#?}"
    );
    let mut changed = Vec::new();
    for e in events {
        let out = model.apply(e);
        assert!(
            out.diff.changes.values().all(|c| c.new.is_some()),
            "a relist never removes a port that still exists: {:?}",
            out.diff
        );
        changed.extend(out.diff.changes.into_keys());
    }
    let changed: Vec<String> = changed.iter().map(|k| k.service.name.to_string()).collect();
    assert_eq!(
        changed,
        ["web"],
        "only the moved endpoint's Service changed"
    );
}

#[tokio::test]
async fn an_outage_sends_nothing_and_recovers_without_a_relist() {
    let mut server = FakeApiServer::start().expect("server");
    cluster(&server);
    let mut r = run(&server).await;
    until(&mut r, list_done(&Kind::ALL)).await;

    server.stop();
    server.apply(slice("web", "10.244.1.7")).expect("apply");
    // Every watcher fails and retries (each failure is logged, the first as a warning, the
    // rest at debug): once two rounds of them have happened, the source has had every chance
    // to send something.
    let logged = r.logged.clone();
    let failures = move || {
        logged
            .lines()
            .iter()
            .filter(|l| l.contains("unreachable"))
            .count()
    };
    wait_for(
        "two rounds of failed retries during the outage",
        || failures() >= 8,
        || format!("{:#?}", r.logged.lines()),
    )
    .await;
    let quiet = r.events.try_recv();
    assert!(
        quiet.is_err(),
        "nothing is sent during the outage: {quiet:?}"
    );
    server.restart().expect("restart");
    let events = until(&mut r, |e| matches!(e, Event::Apply(_))).await;
    assert!(
        !events.iter().any(|e| matches!(e, Event::ListStart { .. })),
        "resumed from the resourceVersion: {events:#?}"
    );
    let Some(Event::Apply(Object::EndpointSlice { slice, .. })) = events.last() else {
        panic!("{events:#?}")
    };
    assert_eq!(slice.endpoints[0].ip.to_string(), "10.244.1.7");
}

#[tokio::test]
async fn without_servicecidrs_the_three_kinds_are_enough() {
    let server = FakeApiServer::builder()
        .service_cidrs(false)
        .start()
        .expect("server");
    server.apply(node("node1")).expect("apply");
    let mut r = run(&server).await;
    let events = until(
        &mut r,
        list_done(&[Kind::Service, Kind::EndpointSlice, Kind::Node]),
    )
    .await;
    assert!(names(&events, Kind::ServiceCidr).is_empty());
    // The source says what discovery answered once it has decided: no ServiceCIDR watch.
    wait_for(
        "the ServiceCIDR decision",
        || r.logged.any("the API server serves no ServiceCIDRs"),
        || format!("logged: {:#?}", r.logged.lines()),
    )
    .await;
    assert!(
        !r.logged.any("the API server serves ServiceCIDRs"),
        "{:#?}",
        r.logged.lines()
    );
    assert!(
        server
            .requests()
            .iter()
            .any(|q| q.path == "/apis/networking.k8s.io/v1"),
        "the decision comes from discovery"
    );
    assert!(
        !server
            .requests()
            .iter()
            .any(|q| q.path.ends_with("/servicecidrs")),
        "no ServiceCIDR request on a cluster without them"
    );
}

/// The rejection in `events` of the object named `name`, if any.
fn rejected<'a>(
    events: &'a [Event],
    name: &str,
) -> Option<&'a kpng_model::records::ConversionError> {
    events.iter().find_map(|e| match e {
        Event::ListItem(Object::Rejected(r)) | Event::Apply(Object::Rejected(r))
            if &*r.object.name == name =>
        {
            Some(&**r)
        }
        _ => None,
    })
}

#[tokio::test]
async fn an_undecodable_object_is_rejected_alone_in_a_list_and_in_a_watch() {
    let server = FakeApiServer::start().expect("server");
    cluster(&server);
    // A Service whose port is not a number, there from the start: no client decodes it as a
    // Service, and it must not hold up the list of every other Service.
    let mut bad_service = service("named-port", "10.96.0.40", json!({}));
    bad_service["spec"]["ports"][0]["port"] = json!("http");
    server.apply(bad_service).expect("apply");
    let mut r = run(&server).await;
    let events = until(&mut r, list_done(&Kind::ALL)).await;
    let error = rejected(&events, "named-port").expect("the bad Service rejected alone");
    assert_eq!(error.object.to_string(), "Service default/named-port");
    assert_eq!(error.field, "spec.ports[0].port");
    assert_eq!(
        error.message, "invalid type: string \"http\", expected i32",
        "no position in a part of the text"
    );
    assert_eq!(names(&events, Kind::Service), ["named-port", "web"]);

    // In a watch: the slice is rejected by name, and the watch goes on.
    let mut bad = slice("web", "10.244.1.5");
    bad["endpoints"][0]["addresses"] = json!("10.244.1.5");
    server.apply(bad).expect("apply");
    server
        .apply(service("later", "10.96.0.30", json!({})))
        .expect("apply");
    // Each kind has its own watch: wait for both, in any order.
    let mut seen = (false, false);
    let events = until(&mut r, |e| {
        if let Event::Apply(o) = e {
            seen.0 |= &*o.reference().name == "later";
            seen.1 |= matches!(o, Object::Rejected(_));
        }
        seen == (true, true)
    })
    .await;
    let error = rejected(&events, "web-1").expect("the bad slice rejected by name");
    assert_eq!(error.object.to_string(), "EndpointSlice default/web-1");
    assert_eq!(error.field, "endpoints[0].addresses");

    // A relist with both still there completes.
    server.expire_watches();
    let events = until(&mut r, list_done(&[Kind::Service, Kind::EndpointSlice])).await;
    assert!(rejected(&events, "named-port").is_some(), "{events:#?}");
    assert!(rejected(&events, "web-1").is_some(), "{events:#?}");
    assert!(
        !r.logged.any("does not decode"),
        "no list failed: {:?}",
        r.logged.lines()
    );
}

#[tokio::test]
async fn master_overrides_the_kubeconfig_and_works_alone() {
    use k8s_openapi::api::core::v1::Node;
    let server = FakeApiServer::start().expect("server");
    server.apply(node("node1")).expect("apply");
    let dir = tempfile::tempdir().expect("tempdir");
    // A kubeconfig pointing nowhere useful: --master wins.
    let stale = dir.path().join("stale");
    std::fs::write(
        &stale,
        server
            .kubeconfig()
            .replace(&server.url(), "http://127.0.0.1:9"),
    )
    .expect("write");
    let cases = [
        ("kubeconfig + master", Some(stale), Some(server.url())),
        ("master alone", None, Some(server.url())),
    ];
    for (what, kubeconfig, master) in cases {
        let (client, url) = client(&ClientOptions {
            kubeconfig,
            master,
            ..ClientOptions::default()
        })
        .await
        .expect("client");
        assert!(url.starts_with(&server.url()), "{what}: {url}");
        let nodes: kube::Api<Node> = kube::Api::all(client);
        let list = nodes.list(&Default::default()).await;
        assert_eq!(list.map(|l| l.items.len()).ok(), Some(1), "{what}");
    }
}

#[tokio::test]
async fn a_token_file_with_a_trailing_newline_is_sent_trimmed() {
    use k8s_openapi::api::core::v1::Node;
    let server = FakeApiServer::start().expect("server");
    server.apply(node("node1")).expect("apply");
    let dir = tempfile::tempdir().expect("tempdir");
    // As `kubectl create token kube-proxy > token` writes it; client-go trims it.
    let token = dir.path().join("token");
    std::fs::write(&token, "tok123\n").expect("write");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        server.kubeconfig().replace(
            "token: fake-token",
            &format!("tokenFile: {}", token.display()),
        ),
    )
    .expect("write");
    let (client, _) = client(&ClientOptions {
        kubeconfig: Some(kubeconfig),
        ..ClientOptions::default()
    })
    .await
    .expect("client");
    let nodes: kube::Api<Node> = kube::Api::all(client);
    let list = nodes.list(&Default::default()).await;
    assert_eq!(
        list.map(|l| l.items.len()).map_err(|e| e.to_string()),
        Ok(1)
    );
    let sent: Vec<Option<String>> = server
        .requests()
        .into_iter()
        .map(|r| r.authorization)
        .collect();
    assert_eq!(sent, [Some("Bearer tok123".to_string())]);
}

#[tokio::test]
async fn bad_client_flags_are_clear_errors() {
    let cases = [
        (
            ClientOptions {
                master: Some("http://[not a url".into()),
                ..ClientOptions::default()
            },
            "--master",
        ),
        (
            ClientOptions {
                kubeconfig: Some("/nonexistent/kubeconfig".into()),
                ..ClientOptions::default()
            },
            "the kubeconfig /nonexistent/kubeconfig (--kubeconfig, or clientConnection.kubeconfig of a --config file) cannot be read",
        ),
    ];
    for (options, want) in cases {
        let Err(err) = client(&options).await else {
            panic!("{want}: accepted")
        };
        assert!(err.to_string().contains(want), "{err}");
    }
    // Neither flag and not in a Pod: the error says what to pass.
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_none() {
        let Err(err) = client(&ClientOptions::default()).await else {
            panic!("in-cluster configuration outside a cluster")
        };
        assert!(err.to_string().contains("pass --kubeconfig PATH"), "{err}");
    }
}

/// A list that always fails (404: the server does not serve the API) is retried with a
/// growing delay (0.8 s doubling, each from [d/2, d]): in 4 s at most 4 attempts
/// (at 0, ≥0.4, ≥1.2, ≥2.8 s), where a delay reset by every `Init` would make 5 or more.
#[tokio::test]
async fn a_list_that_always_fails_backs_off_and_a_404_says_the_api_is_not_served() {
    let server = FakeApiServer::start().expect("server");
    cluster(&server);
    server.not_found(kpng_fake_apiserver::Resource::Nodes, true);
    let r = run(&server).await;
    let lists = |server: &FakeApiServer| {
        server
            .requests()
            .iter()
            .filter(|q| q.path == "/api/v1/nodes" && !q.is_watch())
            .count()
    };
    wait_for(
        "the 404 explained",
        || r.logged.any("does not serve this API (404"),
        || format!("logged: {:#?}", r.logged.lines()),
    )
    .await;
    let started = tokio::time::Instant::now();
    let first = lists(&server);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let attempts = lists(&server) - first;
    assert!(
        (1..=4).contains(&attempts),
        "{attempts} Node list attempts in {:?}",
        started.elapsed()
    );
    assert!(
        r.logged.lines().iter().all(|l| !l.contains("RBAC")),
        "{:#?}",
        r.logged.lines()
    );
}

/// A list the API server answers with a 200 and then cuts short (a proxy giving up mid-answer)
/// is a problem of its own: warned once naming the kind and the error, shown in the input's
/// record and counted at each attempt, until a list of that kind completes. (It was a debug
/// line: the reachability layer had seen an answer.)
#[tokio::test]
async fn a_list_cut_short_is_warned_once_shown_and_counted_until_a_list_completes() {
    let server = FakeApiServer::start().expect("server");
    cluster(&server);
    // Enough Services that their list is longer than the cut; the other lists are shorter.
    for i in 0..30 {
        server
            .apply(service(
                &format!("svc-{i:02}"),
                &format!("10.96.1.{}", i + 1),
                json!({}),
            ))
            .expect("apply");
    }
    let health = InputHealth::default();
    let errors = SourceErrors::default();
    let mut r = run_with(&server, ClientOptions::default(), |source| {
        source
            .with_health(health.clone())
            .with_errors(errors.clone())
    })
    .await;
    until(&mut r, list_done(&Kind::ALL)).await;
    assert!(health.state().problems.is_empty());

    server.truncate(Some(4_000));
    server.expire_watches();
    wait_for(
        "three Service lists cut short, each counted",
        || errors.get(ListFailure::Read) >= 3,
        || format!("{:#?}", r.logged.lines()),
    )
    .await;
    let problems = health.state().problems;
    let message = problems
        .get("Service list")
        .map(|p| p.message.clone())
        .unwrap_or_else(|| panic!("the Service list is a problem: {problems:?}"));
    assert!(
        message.starts_with("the Service list's answer could not be read (")
            && message.ends_with("retrying, the programmed rules stay"),
        "{message}"
    );
    let warned = r
        .logged
        .lines()
        .iter()
        .filter(|l| l.starts_with("WARN the Service list's answer could not be read"))
        .count();
    assert_eq!(warned, 1, "once, not per attempt: {:#?}", r.logged.lines());
    assert_eq!(errors.get(ListFailure::Decode), 0);

    server.truncate(None);
    until(&mut r, list_done(&[Kind::Service])).await;
    assert!(
        health.state().problems.is_empty(),
        "a complete list ends it: {:?}",
        health.state().problems
    );
}

/// A request sent to a hung server and still unanswered when the server answers again is
/// cancelled at once (it waited for the idle timeout, 90 s by default, while everything said
/// the server was back).
#[tokio::test]
async fn a_request_hung_before_the_server_answers_again_is_cancelled() {
    use k8s_openapi::api::core::v1::Service;
    let server = FakeApiServer::start().expect("server");
    cluster(&server);
    let client = client_of(
        &server,
        ClientOptions {
            idle_timeout: Duration::from_secs(60),
            ..ClientOptions::default()
        },
    )
    .await;
    let services: kube::Api<Service> = kube::Api::all(client);
    let before = server.load().requests;
    server.stall(true);
    let hung = tokio::spawn({
        let services = services.clone();
        async move { services.list(&Default::default()).await }
    });
    wait_for(
        "the request at the hung server",
        || server.load().requests > before,
        || format!("{:?}", server.load()),
    )
    .await;
    // An outage (a 500, answered although the server hangs), then an answer that ends it.
    server.fail(500, 1).expect("fail");
    let failed = services.list(&Default::default()).await;
    assert!(matches!(failed, Err(kube::Error::Api(ref s)) if s.code == 500));
    server.stall(false);
    services
        .list(&Default::default())
        .await
        .expect("the server answers again");
    let cancelled = tokio::time::timeout(Duration::from_secs(3), hung)
        .await
        .expect("cancelled when the server answered, not after the idle timeout")
        .expect("joined");
    match cancelled {
        Err(kube::Error::Service(e)) => assert!(e.is::<Superseded>(), "{e}"),
        other => panic!("superseded, got {:?}", other.map(|l| l.items.len())),
    }
}

/// The source's requests hung at a server that came back hung (after an outage) are made
/// again once it answers: the change made meanwhile arrives seconds after, not after the
/// idle timeout (60 s here).
#[tokio::test]
async fn requests_hung_during_an_outage_are_made_again_when_the_server_is_back() {
    let mut server = FakeApiServer::start().expect("server");
    cluster(&server);
    let health = InputHealth::default();
    let options = ClientOptions {
        idle_timeout: Duration::from_secs(60),
        ..ClientOptions::default()
    };
    let mut r = run_with(&server, options, |source| {
        source.with_health(health.clone())
    })
    .await;
    until(&mut r, list_done(&Kind::ALL)).await;

    server.stop();
    wait_for(
        "the outage",
        || r.logged.any("API server unreachable"),
        || format!("{:#?}", r.logged.lines()),
    )
    .await;
    // Back, but hung: the watchers' retries get no answer.
    server.stall(true);
    server.restart().expect("restart");
    server.apply(slice("web", "10.244.1.7")).expect("apply");
    let before = server.load().requests;
    wait_for(
        "the retries at the hung server",
        || server.load().requests >= before + 3,
        || format!("{:?}", server.load()),
    )
    .await;
    server.stall(false);
    let unstalled = tokio::time::Instant::now();
    let events = until(&mut r, |e| matches!(e, Event::Apply(_))).await;
    let Some(Event::Apply(Object::EndpointSlice { slice, .. })) = events.last() else {
        panic!("{events:#?}")
    };
    assert_eq!(slice.endpoints[0].ip.to_string(), "10.244.1.7");
    assert!(
        unstalled.elapsed() < Duration::from_secs(15),
        "{:?} after the server answered again",
        unstalled.elapsed()
    );
    outage_over(&health).await;
}

/// A watch already streaming when the API server hung (its connection stays open, nothing
/// more comes) resumes from its resourceVersion seconds after the server answers again: the
/// client probes while it hears nothing, the probe's answer ends the outage, and the streams
/// silent since it began are ended and watched again. Before, they waited for the idle
/// timeout (30 s here, 90 s by default), and a change made once the server was back arrived
/// only then.
#[tokio::test]
async fn a_watch_streaming_when_the_server_hung_resumes_soon_after_it_answers() {
    let server = FakeApiServer::start().expect("server");
    cluster(&server);
    let idle = Duration::from_secs(30);
    let (mut r, health) = run_probed(&server, idle).await;
    until(&mut r, list_done(&Kind::ALL)).await;
    let lists = |server: &FakeApiServer| {
        server
            .requests()
            .iter()
            .filter(|q| q.path.contains("endpointslices") && !q.is_watch())
            .count()
    };
    let lists_before = lists(&server);

    server.stall(true);
    let hung = tokio::time::Instant::now();
    // The probe (after 10 s of silence, a third of the idle timeout) finds the hang 5 s later.
    wait_for_longer(
        "the hang found",
        Duration::from_secs(25),
        || r.logged.any("WARN API server unreachable"),
        || format!("{:#?}", r.logged.lines()),
    )
    .await;
    assert!(
        health.state().problems.contains_key("API server"),
        "{:?}",
        health.state().problems
    );
    let found = hung.elapsed();
    server.stall(false);
    let back = tokio::time::Instant::now();
    server.apply(slice("web", "10.244.1.7")).expect("apply");
    let events = until(&mut r, |e| matches!(e, Event::Apply(_))).await;
    let Some(Event::Apply(Object::EndpointSlice { slice, .. })) = events.last() else {
        panic!("{events:#?}")
    };
    assert_eq!(slice.endpoints[0].ip.to_string(), "10.244.1.7");
    eprintln!(
        "HANG hang found after {found:.1?}; the change arrived {:.2?} after the server answered \
         again ({:.1?} after the hang)",
        back.elapsed(),
        hung.elapsed()
    );
    assert!(
        back.elapsed() < Duration::from_secs(7) && hung.elapsed() < idle,
        "arrived {:?} after the server answered again, {:?} after it hung (idle timeout {idle:?})",
        back.elapsed(),
        hung.elapsed()
    );
    assert!(
        !events.iter().any(|e| matches!(e, Event::ListStart { .. })),
        "resumed from the resourceVersion, not relisted: {events:#?}"
    );
    assert_eq!(lists(&server), lists_before, "no relist");
    outage_over(&health).await;
}

/// A source whose client probes the server (its reachability followed, idle timeout `idle`),
/// and the input health it records outages in.
async fn run_probed(server: &FakeApiServer, idle: Duration) -> (Running, InputHealth) {
    let health = InputHealth::default();
    let options = ClientOptions {
        idle_timeout: idle,
        ..ClientOptions::default()
    };
    let running =
        run_connected_with(server, options, &health, &ClientMetrics::default(), |s| s).await;
    (running, health)
}

/// A server hung while the requests are being made (here from the start: every list waits
/// for its answer, no body is open) is found by the probe, well before the idle timeout:
/// the probe looked only while a body was open, so a hang as the watchers made their
/// requests (at start, or as they resumed) was found only by the idle timeout (90 s by
/// default). Once it answers again the lists complete.
#[tokio::test]
async fn a_server_hung_before_any_answer_is_found_by_the_probe() {
    let server = FakeApiServer::start().expect("server");
    cluster(&server);
    server.stall(true);
    let idle = Duration::from_secs(30);
    let hung = tokio::time::Instant::now();
    let (mut r, health) = run_probed(&server, idle).await;
    // The probe (after 10 s of silence, a third of the idle timeout) finds the hang 5 s later.
    wait_for_longer(
        "the hang found",
        Duration::from_secs(25),
        || r.logged.any("WARN API server unreachable"),
        || format!("{:#?}", r.logged.lines()),
    )
    .await;
    assert!(
        hung.elapsed() < idle,
        "found by the probe, not the idle timeout"
    );
    assert!(
        health.state().problems.contains_key("API server"),
        "{:?}",
        health.state().problems
    );
    server.stall(false);
    until(&mut r, list_done(&Kind::ALL)).await;
    outage_over(&health).await;
}

/// [`wait_for`] with a longer patience.
async fn wait_for_longer(
    what: &str,
    patience: Duration,
    ok: impl Fn() -> bool,
    context: impl Fn() -> String,
) {
    let deadline = tokio::time::Instant::now() + patience;
    while !ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {patience:?}; {}",
            context()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A list with no complete answer past the patience is shown ("waiting for the Service
/// list") until it completes: `kpng status` said ok while the list was outstanding.
#[tokio::test]
async fn a_list_outstanding_past_the_patience_is_shown_until_it_completes() {
    let server = FakeApiServer::start().expect("server");
    cluster(&server);
    let health = InputHealth::default();
    let mut r = run_with(&server, ClientOptions::default(), |source| {
        source
            .with_health(health.clone())
            .with_list_patience(Duration::from_secs(1))
    })
    .await;
    until(&mut r, list_done(&Kind::ALL)).await;
    wait_for(
        "the first lists' record clear",
        || health.state().problems.is_empty(),
        || format!("{:?}", health.state().problems),
    )
    .await;

    server.delay(Some(Duration::from_millis(2_500)));
    server.expire_watches();
    wait_for(
        "the Service list shown as awaited",
        || health.state().problems.contains_key("Service list"),
        || format!("{:?}", health.state().problems),
    )
    .await;
    let message = health.state().problems["Service list"].message.clone();
    assert!(
        message.starts_with("waiting for the Service list: no complete answer for "),
        "{message}"
    );
    assert!(r.logged.any("waiting for the Service list"));
    server.delay(None);
    until(&mut r, list_done(&[Kind::Service])).await;
    assert!(
        !health.state().problems.contains_key("Service list"),
        "{:?}",
        health.state().problems
    );
}

/// A source on a client from [`connect`] (probed, outages in `health`, requests counted in
/// `metrics`), configured by `configure`.
async fn run_connected(
    server: &FakeApiServer,
    health: &InputHealth,
    metrics: &ClientMetrics,
    configure: impl FnOnce(KubeSource) -> KubeSource,
) -> Running {
    run_connected_with(server, ClientOptions::default(), health, metrics, configure).await
}

/// [`run_connected`] with the client's `options` (its kubeconfig is the server's).
async fn run_connected_with(
    server: &FakeApiServer,
    options: ClientOptions,
    health: &InputHealth,
    metrics: &ClientMetrics,
    configure: impl FnOnce(KubeSource) -> KubeSource,
) -> Running {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kubeconfig");
    server.write_kubeconfig(&path).expect("kubeconfig");
    let connection = connect(
        &ClientOptions {
            kubeconfig: Some(path),
            ..options
        },
        metrics,
        health,
    )
    .await
    .expect("client");
    let source = KubeSource::new(
        connection.client,
        SourceConfig {
            node_name: Some("node1".into()),
            service_proxy_name: None,
        },
    )
    .with_reachability(connection.reachability)
    .with_health(health.clone());
    let source = configure(source);
    let (tx, events) = mpsc::channel(64);
    let logged = Logged::default();
    Running {
        events,
        _task: tokio::spawn(source.run(tx).with_subscriber(logged.clone())),
        logged,
    }
}

/// `rest_client_requests_total` by code, as exported.
fn requests_by_code(metrics: &ClientMetrics, code: &str) -> f64 {
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    text.lines()
        .filter(|l| {
            l.starts_with("rest_client_requests_total{") && l.contains(&format!("code=\"{code}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A throttled API server (429) answers, late: a watch or list sent during that outage is
/// waited for, not cut after 5 s as one sent to a server that does not answer at all is.
/// Every attempt was cut (each answer here takes 7 s), the outage was then worded
/// "unreachable", the Service never arrived, and the retries added to the server's load.
#[tokio::test]
async fn a_slow_answer_while_throttled_is_waited_for() {
    let server = FakeApiServer::start().expect("server");
    cluster(&server);
    let health = InputHealth::default();
    let metrics = ClientMetrics::default();
    let mut r = run_connected(&server, &health, &metrics, |source| source).await;
    until(&mut r, list_done(&Kind::ALL)).await;
    // Every answer takes 7 s; the first four (the watchers asking again) are 429s.
    server.delay(Some(Duration::from_secs(7)));
    server.fail(429, 4).expect("fail");
    server.drop_watches();
    server
        .apply(service("new", "10.96.0.20", json!({})))
        .expect("apply");
    // Two rounds of 7 s answers and a backoff: longer than `until`'s patience.
    let arrived = tokio::time::timeout(Duration::from_secs(45), async {
        while let Some(e) = r.events.recv().await {
            if matches!(&e, Event::Apply(Object::Service(s)) if &*s.key.name == "new") {
                return;
            }
        }
    })
    .await;
    assert!(
        arrived.is_ok(),
        "the Service made while throttled arrives: {:#?}",
        r.logged.lines()
    );
    assert!(
        !r.logged.any("while the API server is unreachable"),
        "no slow answer cut: {:#?}",
        r.logged.lines()
    );
    server.delay(None);
    outage_over(&health).await;
}

/// A sustained 503 (or 429) from the API server is an outage like a refused connection: one
/// warning, the `API server` problem in the record, every attempt counted by its code, and a
/// Service created meanwhile arrives seconds after the 503s stop. kube's client retried them
/// itself, below kpng's layers (up to 15 times, its delays doubling to minutes): nothing was
/// logged, shown or counted, and the Service arrived long after. Each is worded for what it
/// says: a 503 is the server `unavailable`, a 429 the server up and `throttled` (with the
/// `Retry-After` it asked for); both read "unreachable", which sent operators after the
/// network.
#[tokio::test]
async fn a_sustained_503_is_warned_shown_counted_and_the_change_arrives_soon_after() {
    for (code, retry_after, warning, shown, over) in [
        (
            503,
            None,
            "WARN API server unavailable: it answers 503 Service Unavailable; keeping the \
             programmed rules, retrying with backoff",
            "unavailable: it answers 503 Service Unavailable; ",
            "INFO API server available again",
        ),
        (
            429,
            Some(1),
            "WARN API server throttled: it answers 429 Too Many Requests (Retry-After 1s); the \
             server is up and sheds kpng's requests (API Priority and Fairness); keeping the \
             programmed rules, retrying with backoff, no sooner than its Retry-After",
            "throttled: it answers 429 Too Many Requests (Retry-After 1s); the server is up",
            "INFO API server no longer throttling",
        ),
    ] {
        let server = FakeApiServer::start().expect("server");
        cluster(&server);
        let health = InputHealth::default();
        let metrics = ClientMetrics::default();
        let mut r = run_connected(&server, &health, &metrics, |source| source).await;
        until(&mut r, list_done(&Kind::ALL)).await;

        server
            .fail_retry_after(code, 1_000_000, retry_after)
            .expect("fail");
        // The watches' connections end: each watcher asks again, and gets the failure.
        server.drop_watches();
        server
            .apply(service("new", "10.96.0.20", json!({})))
            .expect("apply");
        let problem = || {
            health
                .state()
                .problems
                .get("API server")
                .map(|p| p.message.clone())
        };
        wait_for(
            "the failures warned about, shown and counted",
            || {
                r.logged.any(warning)
                    && problem().is_some_and(|p| p.starts_with(shown))
                    && requests_by_code(&metrics, &code.to_string()) >= 3.0
            },
            || {
                format!(
                    "{code}: {:#?} {:?} {}",
                    r.logged.lines(),
                    health.state().problems,
                    requests_by_code(&metrics, &code.to_string())
                )
            },
        )
        .await;
        // Long enough for the watchers' delays to grow.
        tokio::time::sleep(Duration::from_secs(4)).await;
        let warned = r
            .logged
            .lines()
            .iter()
            .filter(|l| l.starts_with("WARN") && !l.starts_with("WARN eof in poll"))
            .count();
        assert_eq!(
            warned,
            1,
            "{code}: once, not per attempt: {:#?}",
            r.logged.lines()
        );
        assert!(
            !r.logged
                .lines()
                .iter()
                .any(|l| (l.starts_with("WARN") || l.starts_with("INFO"))
                    && l.contains("unreachable")),
            "{code}: the server answers, it is not unreachable: {:#?}",
            r.logged.lines()
        );
        assert!(
            r.events.try_recv().is_err(),
            "{code}: nothing arrived meanwhile"
        );
        server.fail(code, 0).expect("stop failing");
        let back = tokio::time::Instant::now();
        let events = until(&mut r, |e| matches!(e, Event::Apply(_))).await;
        assert_eq!(names(&events, Kind::Service), ["new"], "{code}");
        assert!(
            back.elapsed() < Duration::from_secs(6),
            "{code}: arrived {:?} after the failures stopped",
            back.elapsed()
        );
        outage_over(&health).await;
        assert!(r.logged.any(over), "{code}: {:#?}", r.logged.lines());
    }
}

/// A watcher waiting out a long delay when the API server is reachable again retries within
/// a second: the probe finds the server back and the change made meanwhile arrives seconds
/// after it returns. (The delays are made 10–20 s at once here, as after an outage of a
/// minute; they ran out first, so the change waited up to 30 s while everything said the
/// server was back.)
#[tokio::test]
async fn watchers_waiting_out_a_long_delay_retry_soon_after_the_server_is_back() {
    let mut server = FakeApiServer::start().expect("server");
    cluster(&server);
    let health = InputHealth::default();
    let metrics = ClientMetrics::default();
    let long = Duration::from_secs(20);
    let mut r = run_connected(&server, &health, &metrics, |source| {
        source.with_retry_delays(long, long)
    })
    .await;
    until(&mut r, list_done(&Kind::ALL)).await;
    let listed = health.state().last_good.expect("listed");

    server.stop();
    wait_for(
        "the outage",
        || r.logged.any("WARN API server unreachable"),
        || format!("{:#?}", r.logged.lines()),
    )
    .await;
    // Every watcher has failed and waits 10–20 s.
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.restart().expect("restart");
    let back = tokio::time::Instant::now();
    server.apply(slice("web", "10.244.1.7")).expect("apply");
    let events = until(&mut r, |e| matches!(e, Event::Apply(_))).await;
    let Some(Event::Apply(Object::EndpointSlice { slice, .. })) = events.last() else {
        panic!("{events:#?}")
    };
    assert_eq!(slice.endpoints[0].ip.to_string(), "10.244.1.7");
    assert!(
        back.elapsed() < Duration::from_secs(7),
        "arrived {:?} after the server was back",
        back.elapsed()
    );
    // "Last good input" moved when the server was reachable again, without a new list.
    let last_good = health.state().last_good.expect("still listed");
    assert!(last_good > listed, "{last_good:?} after {listed:?}");
}
