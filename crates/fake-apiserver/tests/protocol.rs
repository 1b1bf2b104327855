//! The fake speaks the API server's protocol: checked with kube-rs, a real client.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kpng_fake_apiserver::FakeApiServer;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;

async fn client(server: &FakeApiServer) -> kube::Client {
    let kubeconfig = Kubeconfig::from_yaml(&server.kubeconfig()).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("config");
    kube::Client::try_from(config).expect("client")
}

fn service(name: &str, labels: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "default", "name": name, "labels": labels},
        "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]}})
}

async fn next_event<K>(
    stream: &mut (impl futures::Stream<Item = kube::Result<WatchEvent<K>>> + Unpin),
) -> WatchEvent<K> {
    tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("an event within 5 s")
        .expect("stream open")
        .expect("decodes")
}

#[tokio::test]
async fn list_with_selectors_pagination_and_discovery() {
    let server = FakeApiServer::start().expect("start");
    server.apply(service("a", json!({}))).expect("apply");
    server
        .apply(service(
            "b",
            json!({"service.kubernetes.io/service-proxy-name": "other"}),
        ))
        .expect("apply");
    server
        .apply(service("c", json!({"service.kubernetes.io/headless": ""})))
        .expect("apply");
    server
        .apply(json!({"kind": "Node", "metadata": {"name": "node1"}}))
        .expect("apply");
    server
        .apply(json!({"kind": "Node", "metadata": {"name": "node2"}}))
        .expect("apply");
    let client = client(&server).await;
    let services: Api<Service> = Api::all(client.clone());

    let all = services.list(&ListParams::default()).await.expect("list");
    assert_eq!(all.items.len(), 3);
    assert_eq!(
        all.metadata.resource_version,
        Some(server.resource_version().to_string())
    );
    let selected =
        services
            .list(&ListParams::default().labels(
                "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless",
            ))
            .await
            .expect("list");
    let names: Vec<_> = selected
        .items
        .iter()
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    assert_eq!(names, ["a"]);

    // Pages of one, held together by continue tokens.
    let first = services
        .list(&ListParams::default().limit(1))
        .await
        .expect("page");
    assert_eq!(first.items.len(), 1);
    let token = first.metadata.continue_.clone().expect("continue token");
    let second = services
        .list(&ListParams::default().limit(1).continue_token(&token))
        .await
        .expect("page 2");
    assert_ne!(first.items[0].metadata.name, second.items[0].metadata.name);

    let nodes: Api<Node> = Api::all(client.clone());
    let mine = nodes
        .list(&ListParams::default().fields("metadata.name=node2"))
        .await
        .expect("list");
    assert_eq!(mine.items.len(), 1);
    assert_eq!(mine.items[0].metadata.name.as_deref(), Some("node2"));
    let bad = nodes
        .list(&ListParams::default().fields("spec.unschedulable=false"))
        .await;
    assert!(
        matches!(&bad, Err(kube::Error::Api(s)) if s.code == 400),
        "{bad:?}"
    );

    // Discovery: what the API serves.
    let networking = client
        .list_api_group_resources("networking.k8s.io/v1")
        .await
        .expect("discovery");
    assert!(
        networking
            .resources
            .iter()
            .any(|r| r.name == "servicecidrs")
    );
    let cidrs: Api<ServiceCIDR> = Api::all(client.clone());
    assert!(
        cidrs
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .is_empty()
    );
    server.forbid(kpng_fake_apiserver::Resource::Nodes, true);
    let refused = nodes.list(&ListParams::default()).await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403),
        "{refused:?}"
    );
    server.forbid(kpng_fake_apiserver::Resource::Nodes, false);
    assert!(nodes.list(&ListParams::default()).await.is_ok());
    let auth = server.requests()[0].authorization.clone();
    assert_eq!(auth.as_deref(), Some("Bearer fake-token"));
}

#[tokio::test]
async fn an_older_cluster_serves_no_servicecidrs() {
    let server = FakeApiServer::builder()
        .service_cidrs(false)
        .start()
        .expect("start");
    let client = client(&server).await;
    let networking = client
        .list_api_group_resources("networking.k8s.io/v1")
        .await
        .expect("discovery");
    assert!(networking.resources.is_empty());
    let cidrs: Api<ServiceCIDR> = Api::all(client);
    let err = cidrs.list(&ListParams::default()).await;
    assert!(
        matches!(&err, Err(kube::Error::Api(s)) if s.code == 404),
        "{err:?}"
    );
}

#[tokio::test]
async fn watch_streams_changes_selector_transitions_bookmarks_and_gone() {
    let server = FakeApiServer::builder()
        .bookmark_interval(None)
        .start()
        .expect("start");
    let rv = server
        .apply(
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"namespace": "default", "name": "web-1",
                "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4", "endpoints": []}),
        )
        .expect("apply");
    let client = client(&server).await;
    let slices: Api<EndpointSlice> = Api::all(client);
    let params = WatchParams::default()
        .labels("!service.kubernetes.io/headless")
        .timeout(60);
    let mut stream = slices
        .watch(&params, &rv.to_string())
        .await
        .expect("watch")
        .boxed();

    let slice = |labels: serde_json::Value, ip: &str| {
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"namespace": "default", "name": "web-1", "labels": labels},
            "addressType": "IPv4", "endpoints": [{"addresses": [ip]}]})
    };
    let svc = json!({"kubernetes.io/service-name": "web"});
    server.apply(slice(svc.clone(), "10.0.0.1")).expect("apply");
    match next_event(&mut stream).await {
        WatchEvent::Modified(s) => assert_eq!(s.endpoints[0].addresses, ["10.0.0.1"]),
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    // Leaving the selector is a DELETED, entering it again an ADDED.
    server
        .apply(slice(
            json!({"kubernetes.io/service-name": "web", "service.kubernetes.io/headless": ""}),
            "10.0.0.1",
        ))
        .expect("apply");
    assert!(matches!(
        next_event(&mut stream).await,
        WatchEvent::Deleted(_)
    ));
    let rv_back = server.apply(slice(svc, "10.0.0.2")).expect("apply");
    match next_event(&mut stream).await {
        WatchEvent::Added(s) => {
            assert_eq!(s.metadata.resource_version, Some(rv_back.to_string()));
        }
        other => panic!("expected ADDED, got {other:?}"),
    }
    server.bookmark();
    match next_event(&mut stream).await {
        WatchEvent::Bookmark(b) => assert_eq!(b.metadata.resource_version, rv_back.to_string()),
        other => panic!("expected BOOKMARK, got {other:?}"),
    }
    server.expire_watches();
    match next_event(&mut stream).await {
        WatchEvent::Error(status) => {
            assert_eq!(status.code, 410);
            assert_eq!(status.reason, "Expired");
        }
        other => panic!("expected ERROR 410, got {other:?}"),
    }
    // Resuming from the old resourceVersion is refused the same way.
    let mut resumed = slices
        .watch(&params, &rv.to_string())
        .await
        .expect("watch")
        .boxed();
    assert!(matches!(
        next_event(&mut resumed).await,
        WatchEvent::Error(s) if s.code == 410
    ));
}

#[tokio::test]
async fn a_dropped_watch_ends_and_an_outage_refuses_connections_until_restart() {
    let mut server = FakeApiServer::start().expect("start");
    server
        .apply(json!({"kind": "Node", "metadata": {"name": "node1"}}))
        .expect("apply");
    let client = client(&server).await;
    let nodes: Api<Node> = Api::all(client);
    let rv = server.resource_version().to_string();
    let mut stream = nodes
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("watch")
        .boxed();
    server.drop_watches();
    // The cut stream ends (kube reads the broken chunked body as the end of the watch).
    let end = tokio::time::timeout(Duration::from_secs(5), stream.try_next()).await;
    assert!(matches!(end, Ok(Ok(None) | Err(_))), "{end:?}");

    server.stop();
    let refused = nodes.list(&ListParams::default()).await;
    assert!(refused.is_err(), "{refused:?}");
    server
        .apply(json!({"kind": "Node", "metadata": {"name": "node2"}}))
        .expect("changes during the outage are kept");
    server.restart().expect("restart");
    let back = nodes.list(&ListParams::default()).await.expect("list");
    assert_eq!(back.items.len(), 2);
}

/// A list read in pages with `limit` and `continue` (as kube-rs's watcher and client-go's
/// pager read it): every object exactly once, in every page size, across namespaces whose
/// names sort differently as strings than as keys (`a` < `a-b`, but `a/…` > `a-b/…`), and
/// with a label selector filtering objects out of the middle of pages.
#[tokio::test]
async fn paginated_lists_return_every_object_exactly_once() {
    let server = FakeApiServer::start().expect("start");
    let mut expected = Vec::new();
    for ns in ["a", "a-b", "b", "default"] {
        for i in 0..7 {
            let name = format!("s{i}");
            let labels = if i % 3 == 0 {
                json!({"service.kubernetes.io/headless": ""})
            } else {
                json!({})
            };
            let mut object = service(&name, labels);
            object["metadata"]["namespace"] = ns.into();
            server.apply(object).expect("apply");
            expected.push((ns.to_string(), name, i % 3 != 0));
        }
    }
    let services: Api<Service> = Api::all(client(&server).await);
    let key = |s: &Service| {
        (
            s.metadata.namespace.clone().unwrap_or_default(),
            s.metadata.name.clone().unwrap_or_default(),
        )
    };
    for (selector, limit) in [
        ("", 1),
        ("", 5),
        ("", 28),
        ("", 500),
        ("!service.kubernetes.io/headless", 3),
    ] {
        let mut seen = Vec::new();
        let mut token: Option<String> = None;
        let mut pages = 0;
        loop {
            let mut params = ListParams::default().limit(limit).labels(selector);
            if let Some(t) = &token {
                params = params.continue_token(t);
            }
            let page = services.list(&params).await.expect("page");
            assert!(page.items.len() <= limit as usize, "at most limit items");
            pages += 1;
            seen.extend(page.items.iter().map(key));
            token = page.metadata.continue_.filter(|t| !t.is_empty());
            if token.is_none() {
                break;
            }
            assert!(pages < 100, "the pages end");
        }
        let mut want: Vec<(String, String)> = expected
            .iter()
            .filter(|(_, _, plain)| selector.is_empty() || *plain)
            .map(|(ns, name, _)| (ns.clone(), name.clone()))
            .collect();
        want.sort();
        let mut got = seen.clone();
        got.sort();
        assert_eq!(
            got, want,
            "selector {selector:?}, limit {limit}: every object once"
        );
        assert_eq!(seen, got, "pages come in key order");
    }
    // An unfiltered page says how many are left, as etcd's store does.
    let first = services
        .list(&ListParams::default().limit(10))
        .await
        .expect("page");
    assert_eq!(first.metadata.remaining_item_count, Some(18));
}

/// A continue token from before a compaction is refused with `410 Gone` (reason `Expired`),
/// as the real server refuses one whose revision etcd has compacted: the client lists again.
#[tokio::test]
async fn a_stale_continue_token_gets_410_gone() {
    let server = FakeApiServer::start().expect("start");
    for i in 0..3 {
        server
            .apply(service(&format!("s{i}"), json!({})))
            .expect("apply");
    }
    let services: Api<Service> = Api::all(client(&server).await);
    let first = services
        .list(&ListParams::default().limit(1))
        .await
        .expect("page");
    let token = first.metadata.continue_.expect("continue token");
    // Still valid before the compaction.
    let second = services
        .list(&ListParams::default().limit(1).continue_token(&token))
        .await
        .expect("page 2");
    assert_ne!(first.items[0].metadata.name, second.items[0].metadata.name);
    server.compact();
    let stale = services
        .list(&ListParams::default().limit(1).continue_token(&token))
        .await;
    assert!(
        matches!(&stale, Err(kube::Error::Api(s)) if s.code == 410 && s.reason == "Expired"),
        "{stale:?}"
    );
    // A fresh list works.
    assert_eq!(
        services
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len(),
        3
    );
}

/// The counters: requests, list pages, watches, bytes and open watch streams.
#[tokio::test]
async fn the_load_counters_count_requests_bytes_and_open_watches() {
    let server = FakeApiServer::start().expect("start");
    for i in 0..5 {
        server
            .apply(service(&format!("s{i}"), json!({})))
            .expect("apply");
    }
    let services: Api<Service> = Api::all(client(&server).await);
    let before = server.load();
    let mut token: Option<String> = None;
    loop {
        let mut params = ListParams::default().limit(2);
        if let Some(t) = &token {
            params = params.continue_token(t);
        }
        let page = services.list(&params).await.expect("page");
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            break;
        }
    }
    let listed = server.load().since(&before);
    assert_eq!((listed.requests, listed.lists, listed.watches), (3, 3, 0));
    assert!(listed.bytes_sent > 5 * 100, "{listed:?}");
    let rv = server.resource_version().to_string();
    let mut stream = services
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("watch")
        .boxed();
    let open = server.load();
    assert_eq!((open.watches, open.watches_open), (1, 1));
    server.apply(service("s9", json!({}))).expect("apply");
    let _ = next_event(&mut stream).await;
    let after = server.load().since(&open);
    assert!(after.bytes_sent > 100, "the event's bytes: {after:?}");
    drop(stream);
    // The stream ends on the server once the client is gone (noticed at the latest when the
    // next event cannot be written).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut k = 0;
    while server.load().watches_open != 0 {
        assert!(std::time::Instant::now() < deadline, "the watch closes");
        k += 1;
        server
            .apply(service(&format!("t{k}"), json!({})))
            .expect("apply");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `fail`, `truncate` and `delay`: what a chaos proxy in front of an API server does, seen by
/// a real client.
#[tokio::test]
async fn injected_faults_fail_cut_and_delay_answers() {
    let server = FakeApiServer::start().expect("start");
    for i in 0..50 {
        server
            .apply(service(&format!("svc-{i:03}"), json!({})))
            .expect("apply");
    }
    let services: Api<Service> = Api::all(client(&server).await);

    // fail CODE N: exactly N answers with that code and a Status, then normal again (500:
    // kube's client retries a 503 on its own).
    server.fail(500, 2).expect("fail");
    for _ in 0..2 {
        match services.list(&ListParams::default()).await {
            Err(kube::Error::Api(s)) => {
                assert_eq!((s.code, s.reason.as_str()), (500, "InternalServerError"));
            }
            Err(e) => panic!("a 500, got {e}"),
            Ok(list) => panic!("a 500, got a list of {}", list.items.len()),
        }
    }
    assert_eq!(
        services
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len(),
        50
    );
    assert!(server.fail(1000, 1).is_err(), "not an HTTP status");

    // truncate BYTES: a 200 whose body stops short; small answers are whole.
    server.truncate(Some(2_000));
    let cut = services.list(&ListParams::default()).await;
    // A 200 whose body fails (hyper's body error), not a request without an answer
    // ("client error (SendRequest)").
    match cut {
        Err(kube::Error::Service(e)) => {
            assert!(e.to_string().contains("error reading a body"), "{e}");
        }
        Err(e) => panic!("a body read error, got {e}"),
        Ok(list) => panic!("a body read error, got a list of {}", list.items.len()),
    }
    let page = services.list(&ListParams::default().limit(2)).await;
    assert_eq!(page.expect("a small page is whole").items.len(), 2);
    server.truncate(None);
    assert_eq!(
        services
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len(),
        50
    );

    // delay MS: every answer late.
    server.delay(Some(Duration::from_millis(400)));
    let started = std::time::Instant::now();
    services.list(&ListParams::default()).await.expect("list");
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    server.delay(None);
}

/// A manifest of a scale test (thousands of documents) loads: the YAML parser's default
/// budget stopped at 1,024 documents.
#[test]
fn a_manifest_of_thousands_of_services_loads() {
    let server = FakeApiServer::start().expect("start");
    let manifest: String = (0..5_000)
        .map(|i| {
            format!(
                "---\napiVersion: v1\nkind: Service\nmetadata:\n  namespace: default\n  name: s{i}\n\
                 spec:\n  clusterIP: 10.96.{}.{}\n  ports:\n  - port: 80\n",
                i / 250,
                i % 250 + 1
            )
        })
        .collect();
    server.apply_manifest(&manifest).expect("5,000 documents");
}

/// `--help` prints the usage and succeeds; an unknown argument points to it.
#[test]
fn the_binary_prints_its_usage() {
    let exe = env!("CARGO_BIN_EXE_kpng-fake-apiserver");
    let help = std::process::Command::new(exe)
        .arg("--help")
        .output()
        .expect("run");
    let out = String::from_utf8_lossy(&help.stdout);
    assert!(help.status.success(), "{help:?}");
    assert!(
        out.contains("usage: kpng-fake-apiserver")
            && out.contains("fail CODE N")
            && out.contains("forbid RESOURCE"),
        "{out}"
    );
    let bad = std::process::Command::new(exe)
        .arg("--bogus")
        .output()
        .expect("run");
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("see --help"));
}

/// `GET path` (HTTP/1.0) on the server at `url`: the status line and headers, and the body.
fn raw_get(url: &str, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let addr = url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    let (head, body) = response.split_once("\r\n\r\n").expect("a head and a body");
    (head.to_ascii_lowercase(), body.to_string())
}

/// The binary's `forbid RESOURCE` / `allow RESOURCE` (a missing RBAC rule for one resource,
/// worded as the real server words it: the verb, the API group) and `fail CODE N RETRY-AFTER`
/// (a 429 with the `Retry-After` API Priority and Fairness sends). Its command line had only
/// `forbid-events`, so a script could not test the RBAC advice for one resource.
#[test]
fn the_binary_forbids_one_resource_and_fails_with_a_retry_after() {
    use std::io::{BufRead, Write};
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kpng-fake-apiserver"))
        .arg("--kubeconfig")
        .arg(dir.path().join("kubeconfig"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = || {
        let mut l = String::new();
        stdout.read_line(&mut l).expect("read");
        l.trim_end().to_string()
    };
    let url = line()
        .strip_prefix("listening ")
        .expect("listening URL")
        .to_string();
    let mut command = |c: &str| {
        writeln!(stdin, "{c}").expect("write");
        stdin.flush().expect("flush");
        line()
    };
    let slices = "/apis/discovery.k8s.io/v1/endpointslices";

    assert_eq!(command("forbid endpointslices"), "ok");
    let (head, body) = raw_get(&url, slices);
    assert!(head.split_whitespace().nth(1) == Some("403"), "{head}");
    assert!(
        body.contains(
            "endpointslices.discovery.k8s.io is forbidden: User \\\"system:serviceaccount:kube-system:kpng\\\" cannot list resource \\\"endpointslices\\\" in API group \\\"discovery.k8s.io\\\" at the cluster scope"
        ),
        "{body}"
    );
    let (_, body) = raw_get(&url, &format!("{slices}?watch=true"));
    assert!(body.contains("cannot watch resource"), "{body}");
    let (head, body) = raw_get(&url, "/api/v1/services");
    assert!(
        head.split_whitespace().nth(1) == Some("200"),
        "only that resource: {head}"
    );
    assert!(body.contains("ServiceList"), "{body}");
    assert_eq!(command("allow endpointslices.discovery.k8s.io"), "ok");
    assert!(raw_get(&url, slices).0.split_whitespace().nth(1) == Some("200"));
    assert!(
        command("forbid widgets").starts_with("error unknown resource \"widgets\""),
        "an unknown resource is refused"
    );
    assert_eq!(command("forbid nodes"), "ok");
    let (_, body) = raw_get(&url, "/api/v1/nodes");
    assert!(
        body.contains("nodes is forbidden") && body.contains("in API group \\\"\\\""),
        "the core group: {body}"
    );

    assert_eq!(command("fail 429 1 3"), "ok");
    let (head, body) = raw_get(&url, "/api/v1/services");
    assert!(head.split_whitespace().nth(1) == Some("429"), "{head}");
    assert!(head.contains("\r\nretry-after: 3"), "{head}");
    assert!(body.contains("TooManyRequests"), "{body}");
    assert!(
        raw_get(&url, "/api/v1/services")
            .0
            .starts_with("http/1.0 200")
    );
    assert_eq!(command("fail 503 1"), "ok");
    let (head, _) = raw_get(&url, "/api/v1/services");
    assert!(
        head.split_whitespace().nth(1) == Some("503") && !head.contains("retry-after"),
        "no Retry-After unless asked: {head}"
    );
    drop(stdin);
    let _ = child.wait();
}
