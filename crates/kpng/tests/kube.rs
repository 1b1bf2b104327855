//! `kpng kube` end to end against the fake API server (no root needed): initial sync gating,
//! changes reaching the output, bad objects, an outage, 410 Gone, and the same rules as
//! `kpng file` for the same objects.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use kpng_fake_apiserver::{FakeApiServer, Resource};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

/// A running `kpng`, killed when dropped; stdout and stderr are collected as they come.
struct Kpng {
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

impl Kpng {
    fn start(args: &[&str]) -> Kpng {
        Kpng::start_with_rust_log(args, None)
    }

    /// [`Kpng::start`] with `RUST_LOG` set to `rust_log` (unset when `None`).
    fn start_with_rust_log(args: &[&str], rust_log: Option<&str>) -> Kpng {
        let mut command = Command::new(env!("CARGO_BIN_EXE_kpng"));
        command.args(args);
        if !args.contains(&"--healthz-bind-address") {
            command.args(["--healthz-bind-address", "127.0.0.1:0"]);
        }
        // No admin socket unless the test names its own: this kpng is killed (SIGKILL) when
        // dropped, which would leave the default, /run/kpng/kpng.sock, on the host.
        if !args
            .iter()
            .any(|a| *a == "--admin-socket" || a.starts_with("--admin-socket="))
        {
            command.arg("--admin-socket=");
        }
        match rust_log {
            Some(filter) => command.env("RUST_LOG", filter),
            None => command.env_remove("RUST_LOG"),
        };
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start kpng");
        let stdout = kpng_testkit::collect_output(child.stdout.take().expect("stdout"));
        let stderr = kpng_testkit::collect_output(child.stderr.take().expect("stderr"));
        Kpng {
            child,
            stdout,
            stderr,
        }
    }

    fn stdout(&self) -> String {
        self.stdout.lock().expect("lock").clone()
    }

    fn stderr(&self) -> String {
        self.stderr.lock().expect("lock").clone()
    }

    /// Waits until `check` holds on (stdout, stderr); panics with both after [`WAIT`].
    #[track_caller]
    fn wait(&mut self, what: &str, check: impl Fn(&str, &str) -> bool) {
        let deadline = Instant::now() + WAIT;
        loop {
            if check(&self.stdout(), &self.stderr()) {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("kpng exited ({status}) before {what}:\n{}", self.stderr());
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {WAIT:?}; kpng said:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn synced(&self) -> usize {
        self.stderr().matches(" synced").count()
    }

    /// Waits until the file `output` (of `to-file`) holds `text`; panics as [`Kpng::wait`].
    #[track_caller]
    fn wait_written(&mut self, what: &str, output: &Path, text: &str) {
        self.wait(what, |_, _| {
            std::fs::read_to_string(output).is_ok_and(|t| t.contains(text))
        });
    }

    /// The port of a server kpng was given `127.0.0.1:0` for, once it logged `serving WHAT on
    /// http://ADDR` (`/metrics`, `/healthz and /livez`). A port found free, released and given
    /// to kpng could be taken by another test of this binary before kpng binds it.
    #[track_caller]
    fn served_port(&mut self, what: &str) -> u16 {
        let prefix = format!("serving {what} on http://");
        self.wait(&format!("{what} served"), |_, err| err.contains(&prefix));
        let err = self.stderr();
        let addr = err
            .lines()
            .find_map(|l| l.split_once(&prefix))
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
            .unwrap_or_else(|| panic!("no address after {prefix:?}:\n{err}"));
        addr.port()
    }
}

impl Drop for Kpng {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The fake cluster every test starts from: node1 and node2, Service `web` with one endpoint
/// on node1, and (when `cidrs`) a ServiceCIDR.
fn cluster(server: &FakeApiServer, cidrs: bool) {
    server
        .apply_manifest(
            r#"
apiVersion: v1
kind: Node
metadata: {name: node1}
status: {addresses: [{type: InternalIP, address: 192.168.100.1}]}
---
apiVersion: v1
kind: Node
metadata: {name: node2}
status: {addresses: [{type: InternalIP, address: 192.168.100.2}]}
---
apiVersion: v1
kind: Service
metadata: {namespace: default, name: web}
spec:
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
"#,
        )
        .expect("cluster");
    server
        .apply(endpoints("web-1", "web", "10.244.1.2", None))
        .expect("slice");
    if cidrs {
        server
            .apply(
                json!({"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
                "metadata": {"name": "kubernetes"}, "spec": {"cidrs": ["10.96.0.0/16"]}}),
            )
            .expect("servicecidr");
    }
}

/// An EndpointSlice of `service` with one ready endpoint `ip` on node1, optionally with the
/// endpoints controller's last-change trigger time.
fn endpoints(name: &str, service: &str, ip: &str, trigger: Option<SystemTime>) -> Value {
    let mut annotations = json!({});
    if let Some(at) = trigger {
        let nanos = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("after 1970")
            .as_nanos();
        let stamp =
            k8s_openapi::jiff::Timestamp::from_nanosecond(i128::try_from(nanos).expect("i128"))
                .expect("timestamp");
        annotations =
            json!({"endpoints.kubernetes.io/last-change-trigger-time": stamp.to_string()});
    }
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": "default", "name": name, "annotations": annotations,
            "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "nodeName": "node1", "conditions": {"ready": true}}]})
}

fn kubeconfig(server: &FakeApiServer, dir: &Path) -> PathBuf {
    let path = dir.join("kubeconfig");
    server.write_kubeconfig(&path).expect("kubeconfig");
    path
}

/// `GET path` on 127.0.0.1:port: (status code, body).
fn http_get(port: u16, path: &str) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn kube_args<'a>(kubeconfig: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "kube",
        "--kubeconfig",
        kubeconfig.to_str().expect("utf-8 path"),
        "--node-name",
        "node1",
        "--min-sync-period",
        "0",
    ];
    args.extend_from_slice(extra);
    args
}

/// [`kube_args`] for a kpng writing its rules to `output` (`to-file`), with `flags` (the
/// servers, the admin socket) before the sink.
fn kube_to_file<'a>(kubeconfig: &'a Path, flags: &[&'a str], output: &'a Path) -> Vec<&'a str> {
    let mut args = kube_args(kubeconfig, flags);
    args.extend(["to-file", "--output", output.to_str().expect("utf-8")]);
    args
}

#[test]
fn nothing_is_programmed_before_every_list_then_changes_and_metrics_follow() {
    let server = FakeApiServer::start().expect("server");
    cluster(&server, true);
    // Nodes cannot be read yet (RBAC being fixed): Services and EndpointSlices are listed,
    // the Node list is not.
    server.forbid(Resource::Nodes, true);
    let dir = tempfile::tempdir().expect("tempdir");
    let k = kubeconfig(&server, dir.path());
    let output = dir.path().join("out.yaml");
    let admin = dir.path().join("admin.sock");
    let admin = admin.to_str().expect("utf-8");
    let mut kpng = Kpng::start(&kube_to_file(
        &k,
        &[
            "--metrics-bind-address",
            "127.0.0.1:0",
            "--admin-socket",
            admin,
        ],
        &output,
    ));
    let port = kpng.served_port("/metrics");

    let watching = |path: &str| {
        server
            .requests()
            .iter()
            .any(|q| q.path == path && q.is_watch())
    };
    kpng.wait(
        "Service and EndpointSlice lists done, Node refused",
        |_, err| {
            watching("/api/v1/services")
                && watching("/apis/discovery.k8s.io/v1/endpointslices")
                && err.contains("Node list refused: 403")
        },
    );
    // The runner says, after applying what it received, that only the Node list is missing:
    // it has decided not to sync.
    kpng.wait("the first sync held for the Node list only", |_, err| {
        err.lines()
            .any(|l| l.ends_with("holding the first sync until these lists are complete: Node"))
    });
    assert!(
        !output.exists(),
        "nothing may be written before the Node list is done:\n{}",
        kpng.stderr()
    );
    assert_eq!(kpng.synced(), 0);
    // `kpng status` says what it waits for, and why.
    let status = status_json(admin);
    assert_eq!(status["waitingFor"], json!(["Node"]), "{status}");
    let problem = &status["input"]["problems"][0];
    assert_eq!(problem["what"], "Node list", "{status}");
    // It names the resource, who kpng is (as the server says) and how to check.
    assert!(
        problem["message"].as_str().is_some_and(|m| m
            .starts_with("Node list refused: 403 Forbidden")
            && m.ends_with(
                "kpng (\"system:serviceaccount:kube-system:kpng\") may not list nodes: \
                     grant list and watch on it (RBAC), check with `kubectl auth can-i list \
                     nodes --as=system:serviceaccount:kube-system:kpng`"
            )),
        "{status}"
    );

    let body = http_get(port, "/metrics").1;
    assert_eq!(
        metric(&body, "kpng_input_problems"),
        Some(1.0),
        "the refused list, for an alert"
    );
    assert_eq!(
        metric(&body, "kpng_input_problems_by_input{input=\"list\"}"),
        Some(1.0),
        "a refused list is the list's problem: {body}"
    );
    assert_eq!(
        metric(&body, "kpng_input_problems_by_input{input=\"watch\"}"),
        Some(0.0),
        "{body}"
    );

    server.forbid(Resource::Nodes, false);
    kpng.wait_written("the first sync", &output, "10.244.1.2:8080");
    // The warning said it began; a line says it ended.
    kpng.wait("the refusal's end logged", |_, err| {
        err.lines().any(|l| {
            l.contains("INFO")
                && l.contains("Node list works again, the problem is over (it lasted ")
        })
    });
    let status = status_json(admin);
    assert!(status.get("waitingFor").is_none(), "{status}");
    assert_eq!(status["input"]["problems"], json!([]), "{status}");
    let body = http_get(port, "/metrics").1;
    assert_eq!(metric(&body, "kpng_input_problems"), Some(0.0), "{body}");
    assert!(
        metric(&body, "kpng_input_last_good_timestamp_seconds").is_some_and(|t| t > 1.7e9),
        "{body}"
    );
    let first = std::fs::read_to_string(&output).expect("output");
    assert!(first.contains("known: true"), "{first}");
    assert!(first.contains("10.96.0.0/16"), "the ServiceCIDR: {first}");

    // An endpoint change, triggered now: it reaches the output, and the metrics count it.
    server
        .apply(endpoints(
            "web-1",
            "web",
            "10.244.1.3",
            Some(SystemTime::now()),
        ))
        .expect("apply");
    kpng.wait_written("the endpoint change", &output, "10.244.1.3:8080");
    let programmed = "kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv4\"}";
    // Observed right after the sync that wrote the file.
    kpng.wait("the latency observed", |_, _| {
        metric(&http_get(port, "/metrics").1, programmed) == Some(1.0)
    });
    let (code, body) = http_get(port, "/metrics");
    assert_eq!(code, 200);
    let latency = metric(
        &body,
        "kubeproxy_network_programming_duration_seconds_sum{ip_family=\"IPv4\"}",
    )
    .expect("sum");
    assert!(latency < 60.0, "programmed within a minute: {latency}");
    // The listed Service and slice, then the slice's update.
    assert_eq!(
        metric(&body, "kubeproxy_sync_proxy_rules_service_changes_total"),
        Some(1.0)
    );
    assert_eq!(
        metric(&body, "kubeproxy_sync_proxy_rules_endpoint_changes_total"),
        Some(2.0)
    );
    assert_eq!(
        metric(&body, "kubeproxy_sync_proxy_rules_endpoint_changes_pending"),
        Some(0.0)
    );
    // client-go's request metrics: the lists and watches, by method and code.
    let gets: f64 = body
        .lines()
        .filter(|l| {
            l.starts_with("rest_client_requests_total{")
                && l.contains("code=\"200\"")
                && l.contains("method=\"GET\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        gets >= 3.0,
        "lists of Services, EndpointSlices and Nodes:\n{body}"
    );
    // client-go's `host` label is the server's host and port, not its URL.
    let host = server
        .url()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    assert!(
        body.lines()
            .any(|l| l.starts_with("rest_client_requests_total{")
                && l.contains(&format!("host=\"{host}\""))),
        "host=\"{host}\" in:\n{body}"
    );
    assert!(
        body.contains("rest_client_request_duration_seconds_count{verb=\"GET\""),
        "{body}"
    );
}

#[test]
fn a_bad_object_is_rejected_alone_and_shown() {
    let server = FakeApiServer::start().expect("server");
    cluster(&server, false);
    // There from the start, a Service whose port is a name: no client decodes it as a
    // Service. It is rejected alone; the rest of the list is programmed.
    server
        .apply(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": "default", "name": "named"},
            "spec": {"clusterIP": "10.96.0.30", "ports": [{"name": "http", "port": "http"}]}}))
        .expect("apply");
    let dir = tempfile::tempdir().expect("tempdir");
    let k = kubeconfig(&server, dir.path());
    let output = dir.path().join("out.yaml");
    let admin = dir.path().join("admin.sock");
    let admin = admin.to_str().expect("utf-8");
    let mut kpng = Kpng::start(&kube_to_file(
        &k,
        &["--metrics-bind-address", "", "--admin-socket", admin],
        &output,
    ));
    kpng.wait_written("the first sync", &output, "10.244.1.2:8080");
    assert_eq!(
        status_json(admin)["rejected"],
        json!([{"object": "Service default/named", "kind": "Service", "namespace": "default",
            "name": "named", "service": "default/named", "field": "spec.ports[0].port",
            "message": "invalid type: string \"http\", expected i32", "kept": false}]),
    );

    // A port out of range: kpng rejects the new version and keeps the last good one.
    let mut out_of_range = endpoints("web-1", "web", "10.244.1.9", None);
    out_of_range["ports"][0]["port"] = json!(70000);
    server.apply(out_of_range).expect("apply");
    // Not even decodable: a port that is not a number.
    let mut undecodable = endpoints("web-2", "web", "10.244.1.8", None);
    undecodable["ports"][0]["port"] = json!("eighty");
    server.apply(undecodable).expect("apply");
    // A good change after both still arrives.
    server
        .apply_manifest(
            "apiVersion: v1\nkind: Service\nmetadata: {namespace: default, name: api}\n\
             spec: {clusterIP: 10.96.0.20, clusterIPs: [10.96.0.20], ports: [{name: http, port: 80}]}\n",
        )
        .expect("apply");
    // Each kind has its own watch: wait for the three, in any order.
    let rejected =
        "rejected EndpointSlice default/web-1: field ports[0].port: port 70000 is not in 1-65535";
    let undecodable = "rejected EndpointSlice default/web-2: field ports[0].port: invalid type: \
                       string \"eighty\", expected i32";
    kpng.wait(
        "both bad objects reported and the good change synced",
        |_, err| {
            err.contains(rejected)
                && err.contains(undecodable)
                && std::fs::read_to_string(&output).is_ok_and(|t| t.contains("default/api"))
        },
    );
    let text = std::fs::read_to_string(&output).expect("output");
    assert!(
        text.contains("10.244.1.2:8080"),
        "the last good slice stays:\n{text}"
    );
    assert!(
        !text.contains("10.244.1.9") && !text.contains("10.244.1.8"),
        "{text}"
    );
    let objects: Vec<Value> = status_json(admin)["rejected"]
        .as_array()
        .expect("rejected")
        .iter()
        .map(|r| json!([r["object"], r["kept"]]))
        .collect();
    assert_eq!(
        objects,
        [
            json!(["Service default/named", false]),
            json!(["EndpointSlice default/web-1", true]),
            json!(["EndpointSlice default/web-2", false]),
        ],
        "every rejection listed, each saying whether a last good version is in use"
    );
    // A slice's rejection names its Service (the label's), whichever check refused it, and
    // `kpng status default/web` lists the slices' rejections, not the other Service's.
    let web = status_json_of(admin, &["default/web"]);
    let objects: Vec<Value> = web["rejected"]
        .as_array()
        .expect("rejected")
        .iter()
        .map(|r| json!([r["object"], r["service"]]))
        .collect();
    assert_eq!(
        objects,
        [
            json!(["EndpointSlice default/web-1", "default/web"]),
            json!(["EndpointSlice default/web-2", "default/web"]),
        ],
        "{web}"
    );
    assert_eq!(
        status_json(admin)["input"]["problems"],
        json!([]),
        "no watch is failing"
    );
}

#[test]
fn an_outage_keeps_the_rules_logs_once_and_recovers() {
    let mut server = FakeApiServer::start().expect("server");
    cluster(&server, false);
    let dir = tempfile::tempdir().expect("tempdir");
    let k = kubeconfig(&server, dir.path());
    let output = dir.path().join("out.yaml");
    let admin = dir.path().join("admin.sock");
    let admin = admin.to_str().expect("utf-8");
    // The reachability layer's debug lines count the failed attempts during the outage.
    let mut kpng = Kpng::start(&kube_to_file(
        &k,
        &[
            "--log-level",
            "info,kpng_source_kube=debug",
            "--metrics-bind-address",
            "",
            "--healthz-bind-address",
            "127.0.0.1:0",
            "--admin-socket",
            admin,
        ],
        &output,
    ));
    let health_port = kpng.served_port("/healthz and /livez");
    kpng.wait_written("the first sync", &output, "10.244.1.2:8080");
    let before = std::fs::read_to_string(&output).expect("output");
    let input = status_json(admin)["input"].clone();
    assert!(
        input["source"]
            .as_str()
            .is_some_and(|s| s.starts_with("kube http://127.0.0.1:")),
        "{input}"
    );
    assert_eq!(input["problems"], json!([]), "{input}");
    assert!(
        input["lastGood"].is_string(),
        "the lists completed: {input}"
    );

    server.stop();
    server
        .apply(endpoints("web-1", "web", "10.244.1.4", None))
        .expect("a change during the outage");
    // Several watchers retry several times meanwhile (backoff from 0.8 s): wait until the
    // failed attempts after the first are seen, each a debug line, not a warning.
    kpng.wait("the outage noticed and retried", |_, err| {
        err.contains("API server unreachable")
            && err.matches("API server still unreachable").count() >= 3
    });
    let err = kpng.stderr();
    assert_eq!(
        err.matches("API server unreachable").count(),
        1,
        "one warning per outage, not per attempt:\n{err}"
    );
    assert!(
        !err.contains("WARN kube") && !err.contains("ERROR kube"),
        "kube's per-attempt lines are quiet:\n{err}"
    );
    assert_eq!(
        std::fs::read_to_string(&output).expect("output"),
        before,
        "rules stay"
    );
    let (code, _) = http_get(health_port, "/healthz");
    assert_eq!(code, 200, "nothing is pending: healthy during the outage");
    // `kpng status` says why nothing changes: the outage, since when, and its cause.
    let input = status_json(admin)["input"].clone();
    let problem = &input["problems"][0];
    assert_eq!(problem["what"], "API server", "{input}");
    let message = problem["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("unreachable: ")
            && message.contains("Connection refused")
            && message.ends_with("; keeping the programmed rules, retrying with backoff"),
        "{message}"
    );
    assert!(problem["since"].is_string(), "{input}");

    server.restart().expect("restart");
    kpng.wait("recovery", |_, err| {
        err.contains("API server reachable again")
    });
    assert_eq!(
        status_json(admin)["input"]["problems"],
        json!([]),
        "the outage is over"
    );
    kpng.wait_written(
        "the change made during the outage",
        &output,
        "10.244.1.4:8080",
    );
}

/// Watches cut mid-stream and an API-server restart, with `RUST_LOG=info` (as many DaemonSets
/// set it): one warning for the outage, none per cut watch. kube's client warned `eof in poll`
/// for every watch the restart cut (three or four a restart, beside kpng's one warning), as
/// `RUST_LOG` let its crates through.
#[test]
fn an_api_server_restart_is_one_warning_even_with_rust_log() {
    let mut server = FakeApiServer::start().expect("server");
    cluster(&server, false);
    let dir = tempfile::tempdir().expect("tempdir");
    let k = kubeconfig(&server, dir.path());
    let output = dir.path().join("out.yaml");
    let args = kube_to_file(&k, &["--metrics-bind-address", ""], &output);
    let mut kpng = Kpng::start_with_rust_log(&args, Some("info"));
    kpng.wait_written("the first sync", &output, "10.244.1.2:8080");
    let before = kpng.stderr().len();
    let watching = |server: &FakeApiServer| server.load().watches_open >= 3;
    let wait_watching = |server: &FakeApiServer| {
        let deadline = Instant::now() + WAIT;
        while !watching(server) {
            assert!(Instant::now() < deadline, "the watches resumed");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_watching(&server);
    let watches = server.load().watches;

    // Connections cut mid-stream, the server up: the watches resume, nothing is wrong.
    server.drop_watches();
    let deadline = Instant::now() + WAIT;
    while server.load().watches < watches + 3 {
        assert!(Instant::now() < deadline, "the watches made again");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A restart: the watches cut, then refused until the server is back.
    wait_watching(&server);
    server.stop();
    server
        .apply(endpoints("web-1", "web", "10.244.1.4", None))
        .expect("a change during the outage");
    kpng.wait("the outage", |_, err| {
        err.contains("API server unreachable")
    });
    server.restart().expect("restart");
    kpng.wait_written(
        "the change made during the outage",
        &output,
        "10.244.1.4:8080",
    );
    kpng.wait("the outage's end", |_, err| {
        err.contains("API server reachable again")
    });
    let err = kpng.stderr();
    let warnings: Vec<&str> = err[before..]
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning, for the outage:\n{err}");
    assert!(
        warnings[0].contains("API server unreachable: "),
        "{warnings:?}"
    );
    assert!(!err.contains("eof in poll"), "{err}");
}

/// `kpng status -o json` of the kpng serving `admin`.
fn status_json(admin: &str) -> Value {
    status_json_of(admin, &[])
}

/// `kpng status ARGS -o json` of the kpng at `admin` (`ARGS`: a Service, `-n NAMESPACE`).
fn status_json_of(admin: &str, args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_kpng"))
        .arg("status")
        .args(args)
        .args(["-o", "json", "--admin-socket", admin])
        .output()
        .expect("kpng status");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)))
}

/// The dry-run transactions printed so far, in order.
fn transactions(stdout: &str) -> Vec<&str> {
    stdout
        .split("# --- kpng nft transaction (dry run) ---")
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect()
}

/// Whether a transaction replaces the whole table of `family` (a full sync).
fn is_full(transaction: &str, family: &str) -> bool {
    transaction.contains(&format!("delete table {family} kpng"))
}

#[test]
fn gone_relists_with_a_minimal_transaction() {
    let server = FakeApiServer::start().expect("server");
    cluster(&server, false);
    let dir = tempfile::tempdir().expect("tempdir");
    let k = kubeconfig(&server, dir.path());
    let mut kpng = Kpng::start(&kube_args(
        &k,
        &["--metrics-bind-address", "", "to-local", "nft", "--dry-run"],
    ));
    // Both families' first (full) transactions, each printed once the kernel checked it.
    kpng.wait("the first sync", |out, _| {
        out.contains("10.244.1.2 . 8080") && transactions(out).iter().any(|t| is_full(t, "ip6"))
    });
    let before = kpng.stdout().len();

    // Every watch is told 410 Gone; the endpoint moves before the watchers relist.
    server.expire_watches();
    server
        .apply(endpoints("web-1", "web", "10.244.1.7", None))
        .expect("apply");
    kpng.wait("the relist after 410 Gone", |out, err| {
        err.contains("410 Gone") && out[before..].contains("10.244.1.7 . 8080")
    });
    let after = kpng.stdout()[before..].to_string();
    for t in transactions(&after) {
        assert!(
            !is_full(t, "ip") && !is_full(t, "ip6") && !t.contains("flush"),
            "a relist is not a teardown:\n{t}"
        );
    }
    assert!(
        after.contains("delete element ip kpng cluster-endpoints-tcp")
            && after.contains("10.244.1.2 . 10.244.1.2 . tcp . 8080"),
        "the old endpoint is removed:\n{after}"
    );
}

/// The last full transaction of each family, without the dry run's "checked by the kernel"
/// trailer: it is printed after the kernel answers, so a snapshot of stdout may or may not hold it.
fn last_full(stdout: &str) -> (Option<String>, Option<String>) {
    let all = transactions(stdout);
    let last = |family: &str| {
        all.iter().rev().find(|t| is_full(t, family)).map(|t| {
            t.lines()
                .filter(|l| !l.starts_with("# (checked by the kernel"))
                .collect::<Vec<_>>()
                .join("\n")
                .trim()
                .to_string()
        })
    };
    (last("ip"), last("ip6"))
}

#[test]
fn kube_programs_the_same_rules_as_file_for_the_same_objects() {
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster.yaml"),
    )
    .expect("example");
    let manifest = format!(
        "{example}\n---\napiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\n\
         metadata: {{name: kubernetes}}\nspec: {{cidrs: [10.96.0.0/12, \"fd00:96::/108\"]}}\n"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("cluster.yaml");
    std::fs::write(&input, &manifest).expect("write");
    let flags = [
        "--node-name",
        "node1",
        "--cluster-cidr",
        "10.244.0.0/16,fd00:244::/32",
        "--metrics-bind-address",
        "",
        "to-local",
        "nft",
        "--dry-run",
    ];
    let complete = |out: &str| {
        let (ip, ip6) = last_full(out);
        ip.is_some_and(|t| t.contains("10.96.0.0/12"))
            && ip6.is_some_and(|t| t.contains("fd00:96::/108"))
    };

    let mut file = Kpng::start(
        &[
            &["file", "--input", input.to_str().expect("utf-8")][..],
            &flags[..],
        ]
        .concat(),
    );
    file.wait("kpng file's first sync", |out, _| complete(out));
    let from_file = last_full(&file.stdout());
    drop(file);

    let server = FakeApiServer::start().expect("server");
    server.apply_manifest(&manifest).expect("manifest");
    let k = kubeconfig(&server, dir.path());
    let mut kube = Kpng::start(
        &[
            &["kube", "--kubeconfig", k.to_str().expect("utf-8")][..],
            &flags[..],
        ]
        .concat(),
    );
    kube.wait("kpng kube's sync with every object", |out, _| complete(out));
    let from_kube = last_full(&kube.stdout());
    assert_eq!(from_kube.0, from_file.0, "IPv4 rules differ");
    assert_eq!(from_kube.1, from_file.1, "IPv6 rules differ");
    assert!(from_file.0.is_some_and(|t| t.contains("default/web:http")));
}

#[test]
fn kube_feeds_a_brain_whose_nodes_get_their_own_view_and_the_service_cidrs() {
    let mut server = FakeApiServer::start().expect("server");
    cluster(&server, true);
    let dir = tempfile::tempdir().expect("tempdir");
    let k = kubeconfig(&server, dir.path());
    let socket = format!("unix://{}", dir.path().join("brain.sock").display());
    // The brain: no --node-name, it watches every Node.
    let brain_admin = dir.path().join("brain-admin.sock");
    let brain_admin = brain_admin.to_str().expect("utf-8 path");
    let mut brain = Kpng::start(&[
        "kube",
        "--kubeconfig",
        k.to_str().expect("utf-8 path"),
        "--metrics-bind-address",
        "",
        "--admin-socket",
        brain_admin,
        "to-api",
        "--listen",
        &socket,
    ]);
    brain.wait("the brain watches every Node", |_, err| {
        err.contains("watching Services, EndpointSlices and every Node")
    });
    let outputs: Vec<(String, PathBuf)> = ["node1", "node2"]
        .into_iter()
        .map(|n| (n.to_string(), dir.path().join(format!("{n}.yaml"))))
        .collect();
    let mut nodes: Vec<Kpng> = outputs
        .iter()
        .map(|(name, output)| {
            let admin = dir.path().join(format!("{name}-admin.sock"));
            Kpng::start(&[
                "api",
                "--api",
                &socket,
                "--healthz-bind-address",
                "127.0.0.1:0",
                "--admin-socket",
                admin.to_str().expect("utf-8"),
                "--node-name",
                name,
                "--min-sync-period",
                "0",
                "--metrics-bind-address",
                "",
                "to-file",
                "--output",
                output.to_str().expect("utf-8"),
            ])
        })
        .collect();
    // node1's health server: a brain's problems must not turn it 503.
    let node1_health = nodes[0].served_port("/healthz and /livez");
    for ((name, output), node) in outputs.iter().zip(&mut nodes) {
        node.wait(&format!("{name}'s first sync"), |_, _| {
            std::fs::read_to_string(output).is_ok_and(|t| t.contains("10.244.1.2:8080"))
        });
        let text = std::fs::read_to_string(output).expect("output");
        assert!(text.contains("10.96.0.0/16"), "the ServiceCIDR: {text}");
        // Each node's own Node object came through the brain (its IP).
        let ip = if name == "node1" {
            "192.168.100.1"
        } else {
            "192.168.100.2"
        };
        assert!(text.contains(ip), "{name}'s Node: {text}");
    }
    // The endpoint runs on node1: local there only.
    let local = |output: &Path| {
        let text = std::fs::read_to_string(output).expect("output");
        text.contains("10.244.1.2:8080 local")
    };
    assert!(local(&outputs[0].1) && !local(&outputs[1].1));

    // A change in the cluster reaches every node through the brain.
    server
        .apply(endpoints("web-1", "web", "10.244.1.3", None))
        .expect("apply");
    for ((name, output), node) in outputs.iter().zip(&mut nodes) {
        node.wait(&format!("{name} sees the endpoint change"), |_, _| {
            std::fs::read_to_string(output).is_ok_and(|t| t.contains("10.244.1.3:8080"))
        });
    }

    // `kpng status` on the brain: both nodes, each having taken the replay and the change.
    let status = status_json(brain_admin);
    assert_eq!(status["role"], "brain", "{status}");
    assert_eq!(status["synced"], true, "{status}");
    let listed = status["nodes"].as_array().expect("nodes");
    let names: Vec<&str> = listed.iter().filter_map(|n| n["node"].as_str()).collect();
    assert_eq!(names, ["node1", "node2"], "{status}");
    for n in listed {
        assert!(n["changeSetsSent"].as_u64().is_some_and(|c| c >= 2), "{n}");
    }
    let brain_table = || {
        let out = Command::new(env!("CARGO_BIN_EXE_kpng"))
            .args(["status", "--admin-socket", brain_admin])
            .output()
            .expect("kpng status");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let table = brain_table();
    assert!(
        table.contains("2 nodes connected")
            && table.contains("node2")
            && table.contains("\ninput kube http://127.0.0.1:")
            && table.contains("  ok  last good input 20"),
        "{table}"
    );
    assert!(!table.contains("rejected objects"), "{table}");
    assert!(
        !table.contains("not connected"),
        "every Node follows: {table}"
    );

    // Every node is listed with its connection: over the Unix socket, its kpng's process.
    let pids: Vec<String> = nodes
        .iter()
        .map(|n| format!("unix, pid {}", n.child.id()))
        .collect();
    let peers: Vec<&str> = listed.iter().filter_map(|n| n["peer"].as_str()).collect();
    assert_eq!(peers, pids, "{status}");
    assert!(table.contains(&format!("  {}\n", pids[0])), "{table}");

    // A second kpng claiming node1 (a copied DaemonSet): the brain names both connections.
    let copy_admin = dir.path().join("copy-admin.sock");
    let mut copy = Kpng::start(&[
        "api",
        "--api",
        &socket,
        "--admin-socket",
        copy_admin.to_str().expect("utf-8"),
        "--node-name",
        "node1",
        "--metrics-bind-address",
        "",
        "to-file",
        "--output",
        dir.path().join("copy.yaml").to_str().expect("utf-8"),
    ]);
    let copy_pid = format!("unix, pid {}", copy.child.id());
    let mut claimants = vec![pids[0].clone(), copy_pid.clone()];
    claimants.sort();
    let deadline = Instant::now() + WAIT;
    while status_json(brain_admin)["duplicateNodes"]
        != json!([{"node": "node1", "peers": claimants}])
    {
        assert!(
            Instant::now() < deadline,
            "{}\n{}",
            status_json(brain_admin),
            copy.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let table = brain_table();
    assert!(
        table.contains(&format!(
            "PROBLEM: 2 kpngs claim node node1: connections from {} and {} (",
            claimants[0], claimants[1]
        )),
        "{table}"
    );
    // Said at once as a possible reconnect; warned only if both are still open after the
    // keepalive's grace (60 s, tested in the hub's tests), which the copy is not.
    brain.wait("the brain says of the second claim", |_, err| {
        err.contains("node \"node1\" reconnected from ")
    });
    copy.wait("the copy synced", |_, err| err.contains(" synced"));
    drop(copy);
    let deadline = Instant::now() + WAIT;
    while status_json(brain_admin).get("duplicateNodes").is_some() {
        assert!(Instant::now() < deadline, "{}", status_json(brain_admin));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        brain.stderr().matches("two kpngs claim node").count(),
        0,
        "gone within the grace: not warned: {}",
        brain.stderr()
    );

    // A node whose kpng stops is named: its Node exists, nothing follows the brain for it.
    drop(nodes.pop());
    let deadline = Instant::now() + WAIT;
    while status_json(brain_admin)["notConnected"] != json!(["node2"]) {
        assert!(Instant::now() < deadline, "{}", status_json(brain_admin));
        std::thread::sleep(Duration::from_millis(50));
    }
    let table = brain_table();
    assert!(
        table.contains(
            "not connected: 1 Node without a kpng following this brain (down, cannot \
             reach it, or following another brain behind the same Service): node2 \
             (disconnected since "
        ) && table.contains("  1 node connected\n"),
        "{table}"
    );
    // Since when (the name alone until 2026-12-07).
    assert_eq!(
        status_json(brain_admin)["disconnected"][0]["node"],
        "node2",
        "{}",
        status_json(brain_admin)
    );

    // An object the brain cannot use is named by the brain's status (its nodes never see it).
    server
        .apply(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": "default", "name": "typo"},
            "spec": {"clusterIP": "10.96.9.9", "ports": [{"port": 80, "protocol": "TPC"}]}}))
        .expect("apply");
    brain.wait("the brain rejects the Service", |_, err| {
        err.contains("rejected Service default/typo")
    });
    let table = brain_table();
    assert!(
        table.contains("rejected objects: 1")
            && table.contains("Service default/typo: field spec.ports[0].protocol")
            && table.contains("(not in use: no earlier version)"),
        "{table}"
    );

    // node1 hears of it from the brain: its `kpng status` says what the brain rejects, so a
    // Service that looks wrong on the node is explained there.
    let node1_admin = dir.path().join("node1-admin.sock");
    let node1_admin = node1_admin.to_str().expect("utf-8");
    let node1_reports = || status_json(node1_admin)["brainReports"].clone();
    let deadline = Instant::now() + WAIT;
    while node1_reports()["rejectedTotal"] != 1 {
        assert!(Instant::now() < deadline, "{}", status_json(node1_admin));
        std::thread::sleep(Duration::from_millis(50));
    }
    let reports = node1_reports();
    assert_eq!(reports["healthy"], true, "{reports}");
    assert_eq!(
        reports["rejected"],
        json!([{"object": "Service default/typo", "kind": "Service", "namespace": "default",
                "name": "typo", "service": "default/typo", "field": "spec.ports[0].protocol",
                "message": reports["rejected"][0]["message"], "kept": false}]),
        "{reports}"
    );
    let node1_table = || {
        let out = Command::new(env!("CARGO_BIN_EXE_kpng"))
            .args(["status", "--admin-socket", node1_admin])
            .output()
            .expect("kpng status");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let table = node1_table();
    assert!(
        table.contains("\nbrain reports: its input kube http://127.0.0.1:")
            && table.contains("  ok; it rejects 1 object\n")
            && table.contains("\n  rejected Service default/typo: field spec.ports[0].protocol: "),
        "{table}"
    );
    // `kpng status typo` on the node names the brain's rejection instead of "no such Service".
    let out = Command::new(env!("CARGO_BIN_EXE_kpng"))
        .args(["status", "--admin-socket", node1_admin, "default/typo"])
        .output()
        .expect("kpng status");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Service default/typo: field spec.ports[0].protocol"),
        "{err}"
    );

    // A rejected object fixed in the API server: the brain logs the end of its rejection
    // (until 2026-12-07 nothing followed the rejection's line).
    let typo2 = |protocol: &str| {
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": "default", "name": "typo2"},
            "spec": {"clusterIP": "10.96.9.10", "ports": [{"port": 80, "protocol": protocol}]}})
    };
    server.apply(typo2("TPC")).expect("apply");
    brain.wait("the brain rejects the second Service", |_, err| {
        err.contains("rejected Service default/typo2")
    });
    server.apply(typo2("TCP")).expect("apply");
    brain.wait("the end of its rejection", |_, err| {
        err.contains("Service default/typo2: accepted again (rejected since 20")
    });

    // The brain's API server goes away: node1 says its brain's source fails, and stays
    // healthy itself (its rules are as the brain last knew, nothing is pending).
    server.stop();
    let deadline = Instant::now() + WAIT;
    while node1_reports()["healthy"] != false {
        assert!(Instant::now() < deadline, "{}", status_json(node1_admin));
        std::thread::sleep(Duration::from_millis(50));
    }
    let node1 = status_json(node1_admin);
    assert_eq!(
        node1["brainReports"]["problems"][0]["what"], "API server",
        "{node1}"
    );
    assert_eq!(
        node1["input"]["problems"],
        json!([]),
        "the node's own input is fine"
    );
    assert_eq!(http_get(node1_health, "/healthz").0, 200, "{node1}");
    let table = node1_table();
    assert!(
        table.contains("  1 PROBLEM; it rejects 1 object\n  API server (since "),
        "{table}"
    );
    server.restart().expect("restart");
    let deadline = Instant::now() + WAIT;
    while node1_reports()["healthy"] != true {
        assert!(Instant::now() < deadline, "{}", status_json(node1_admin));
        std::thread::sleep(Duration::from_millis(50));
    }

    // The brain itself goes away: node1 keeps what it last reported, and says it may be out
    // of date.
    drop(brain);
    let deadline = Instant::now() + WAIT;
    while status_json(node1_admin)["input"]["problems"] == json!([]) {
        assert!(Instant::now() < deadline, "{}", status_json(node1_admin));
        std::thread::sleep(Duration::from_millis(50));
    }
    let table = node1_table();
    assert!(
        table.contains("\nbrain reported (before it went out of reach; may be out of date): "),
        "{table}"
    );
}

#[test]
fn node_events_say_kpng_started_and_that_syncs_keep_failing() {
    let server = FakeApiServer::start().expect("server");
    cluster(&server, false);
    let dir = tempfile::tempdir().expect("tempdir");
    let k = kubeconfig(&server, dir.path());
    // The output's directory does not exist: every sync fails.
    let output = dir.path().join("missing").join("out.yaml");
    let output = output.to_str().expect("utf-8 path");
    let mut kpng = Kpng::start(&kube_args(
        &k,
        &["--metrics-bind-address", "", "to-file", "--output", output],
    ));
    let events_with = |reason: &str| -> Vec<Value> {
        server
            .events()
            .into_iter()
            .filter(|e| e["reason"] == reason)
            .collect()
    };
    let deadline = Instant::now() + WAIT;
    while events_with("SyncProxyRulesFailed").is_empty() {
        assert!(
            Instant::now() < deadline,
            "no failure event; events {:?}; kpng said:\n{}",
            server.events(),
            kpng.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let starting = events_with("Starting");
    assert_eq!(starting.len(), 1, "{starting:?}");
    let s = &starting[0];
    assert_eq!(s["type"], "Normal");
    assert_eq!(s["action"], "StartKubeProxy");
    assert_eq!(s["reportingController"], "kpng");
    assert_eq!(s["regarding"]["kind"], "Node");
    assert_eq!(s["regarding"]["name"], "node1");
    let failed = &events_with("SyncProxyRulesFailed")[0];
    assert_eq!(failed["type"], "Warning");
    assert!(
        failed["note"]
            .as_str()
            .is_some_and(|n| n.contains("failed 3 times in a row")),
        "{failed}"
    );
    // kpng itself keeps running and retrying.
    kpng.wait("more failed syncs", |_, err| {
        err.matches("sync failed").count() >= 4
    });
}

/// A health server that cannot bind is kube-proxy's `Warning FailedToStartProxierHealthcheck`
/// Event on the Node, naming the address and why, whether kpng then runs on
/// (`bindAddressHardFail` false: it tries again) or ends (true: posted before it exits).
/// Alerting on Events saw nothing of it before: only the log said so.
#[test]
fn a_health_server_that_cannot_bind_is_a_node_event() {
    let server = FakeApiServer::start().expect("server");
    cluster(&server, false);
    let dir = tempfile::tempdir().expect("tempdir");
    let k = kubeconfig(&server, dir.path());
    let output = dir.path().join("out.yaml");
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("a port to hold");
    let held = held.local_addr().expect("its address").to_string();
    let failed = || -> Vec<Value> {
        server
            .events()
            .into_iter()
            .filter(|e| e["reason"] == "FailedToStartProxierHealthcheck")
            .collect()
    };
    let flags = [
        "--healthz-bind-address",
        &held,
        "--metrics-bind-address",
        "",
    ];
    let mut kpng = Kpng::start(&kube_to_file(&k, &flags, &output));
    kpng.wait_written("the first sync", &output, "10.244.1.2:8080");
    let deadline = Instant::now() + WAIT;
    while failed().is_empty() {
        assert!(
            Instant::now() < deadline,
            "no Event; events {:?}; kpng said:\n{}",
            server.events(),
            kpng.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let event = &failed()[0];
    assert_eq!(event["type"], "Warning", "{event}");
    assert_eq!(event["action"], "StartKubeProxy", "{event}");
    assert_eq!(event["regarding"]["kind"], "Node", "{event}");
    assert_eq!(event["regarding"]["name"], "node1", "{event}");
    let note = event["note"].as_str().unwrap_or_default();
    assert!(
        note.contains(&format!(
            "cannot bind the health server (--healthz-bind-address) to {held}"
        )),
        "{event}"
    );
    drop(kpng);

    let hard = [&flags[..], &["--bind-address-hard-fail=true"]].concat();
    let mut kpng = Kpng::start(&kube_to_file(&k, &hard, &output));
    let exit = kpng_testkit::wait_exit(&mut kpng.child, Duration::from_secs(20));
    assert_eq!(exit.and_then(|e| e.code()), Some(1), "{}", kpng.stderr());
    let events = failed();
    assert_eq!(events.len(), 2, "posted before it ended: {events:?}");
    let note = events[1]["note"].as_str().unwrap_or_default();
    assert!(
        note.contains(&format!(
            "binding the health server (--healthz-bind-address) to {held} (bindAddressHardFail"
        )),
        "{note}"
    );
}

/// kube-proxy's command line with kpng's `--dry-run` (and kpng's backend word for
/// `--proxy-mode`): the `kube` source into the nftables backend's dry run, which prints the
/// transaction and opens no server.
#[test]
fn kube_proxys_command_line_takes_a_dry_run() {
    let server = FakeApiServer::start().expect("server");
    cluster(&server, true);
    let dir = tempfile::tempdir().expect("tempdir");
    let k = kubeconfig(&server, dir.path());
    // A port held here all along: a kpng that bound it (for health or metrics) would fail to
    // start; one released first could be taken by another test before the check at the end.
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let bind = held.local_addr().expect("its address").to_string();
    let mut kpng = Kpng::start(&[
        "--kubeconfig",
        k.to_str().expect("utf-8 path"),
        "--hostname-override=node1",
        "--proxy-mode=nft",
        "--dry-run",
        "--min-sync-period=0",
        "--healthz-bind-address",
        &bind,
        "--metrics-bind-address",
        &bind,
    ]);
    kpng.wait("the dry run's transaction", |out, _| {
        out.contains("# --- kpng nft transaction (dry run) ---") && out.contains("10.96.0.10")
    });
    assert!(
        kpng.stderr()
            .contains("`kpng kube … to-local nft --dry-run`"),
        "{}",
        kpng.stderr()
    );
    assert!(
        matches!(kpng.child.try_wait(), Ok(None)),
        "a dry run serves neither health nor metrics (it runs on, with its port taken):\n{}",
        kpng.stderr()
    );
    drop(held);
}

/// A node port the API server allocated is programmed whatever range the API server was given:
/// kube-proxy has no range check, and an API server with `--service-node-port-range
/// 20000-22767` hands out 20080. (The file source keeps the default range check: nothing
/// checked a manifest's node ports before kpng.)
#[test]
fn node_ports_from_the_api_server_are_programmed_outside_the_default_range() {
    let server = FakeApiServer::start().expect("server");
    cluster(&server, false);
    server
        .apply(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": "default", "name": "low"},
            "spec": {"type": "NodePort", "clusterIP": "10.96.0.40", "clusterIPs": ["10.96.0.40"],
                "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 20080}]}}))
        .expect("apply");
    let dir = tempfile::tempdir().expect("tempdir");
    let k = kubeconfig(&server, dir.path());
    let output = dir.path().join("out.yaml");
    let mut kpng = Kpng::start(&kube_to_file(
        &k,
        &["--metrics-bind-address", "", "--admin-socket="],
        &output,
    ));
    kpng.wait_written("the first sync", &output, "default/low");
    let text = std::fs::read_to_string(&output).expect("output");
    assert!(text.contains("nodePort: 20080"), "{text}");
    assert!(
        !kpng.stderr().contains("--service-node-port-range"),
        "no warning:\n{}",
        kpng.stderr()
    );
}

/// A hung API server (connections open, nothing sent): kpng probes it once nothing came for a
/// third of `--kube-api-idle-timeout` and gives up on a connection that has been silent for
/// all of it, says so, and once the server answers again it
/// watches again and programs what changed meanwhile. Before, a silent watch held for 295 s
/// and a hung list for ever, with everything looking fine.
#[test]
fn a_hung_api_server_is_given_up_on_and_the_changes_arrive_after() {
    let server = FakeApiServer::start().expect("server");
    cluster(&server, false);
    let dir = tempfile::tempdir().expect("tempdir");
    let k = kubeconfig(&server, dir.path());
    let output = dir.path().join("out.yaml");
    let admin = dir.path().join("admin.sock");
    let admin = admin.to_str().expect("utf-8");
    let mut kpng = Kpng::start(&kube_to_file(
        &k,
        &[
            "--kube-api-idle-timeout",
            "3s",
            "--metrics-bind-address",
            "",
            "--admin-socket",
            admin,
        ],
        &output,
    ));
    kpng.wait_written("the first sync", &output, "10.244.1.2:8080");
    server.stall(true);
    server
        .apply(endpoints("web-1", "web", "10.244.1.4", None))
        .expect("a change while the server hangs");
    // Found by the probe (nothing came for a third of the idle timeout, and `GET /version`
    // got no answer) or by a connection silent for the idle timeout, whichever comes first.
    let probed = "no answer within 3s to GET /version, asked after nothing came from the server \
                  for 1s (a hung API server or a dropped connection)";
    let said = "nothing received for 3s (--kube-api-idle-timeout): a hung API server or a \
                dropped connection";
    kpng.wait("the hang found", |_, err| {
        err.contains(&format!(
            "WARN kpng_source_kube::reachability: API server unreachable: {probed}"
        )) || err.contains(said)
    });
    // The latest of the requests given up on is shown: the probe, a silent watch or list, or
    // a request made while the server was already unreachable (allowed its headers for the
    // idle timeout at most).
    let during = "no answer within 3s while the API server is unreachable";
    let problems = status_json(admin)["input"]["problems"].clone();
    assert!(
        problems[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains(probed) || m.contains(said) || m.contains(during)),
        "kpng status says why nothing changes: {problems}"
    );
    server.stall(false);
    kpng.wait_written(
        "the change made while the server hung",
        &output,
        "10.244.1.4:8080",
    );
}

/// A list the API server answers and then cuts short (a proxy giving up mid-answer) is
/// warned, shown by `kpng status` and counted in `kpng_source_errors_total` until a list
/// completes; the change made meanwhile then arrives. (It was a debug line: status `ok`, no
/// counter moved, for as long as it lasted.)
#[test]
fn a_list_cut_short_is_shown_counted_and_over_when_a_list_completes() {
    let server = FakeApiServer::start().expect("server");
    cluster(&server, false);
    // The Service list longer than the cut, the others shorter.
    for i in 0..30 {
        let ip = format!("10.96.1.{}", i + 1);
        server
            .apply(json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"namespace": "default", "name": format!("svc-{i:02}")},
                "spec": {"clusterIP": ip, "clusterIPs": [ip], "ports": [{"port": 80}]}}))
            .expect("apply");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let k = kubeconfig(&server, dir.path());
    let output = dir.path().join("out.yaml");
    let admin = dir.path().join("admin.sock");
    let admin = admin.to_str().expect("utf-8");
    let mut kpng = Kpng::start(&kube_to_file(
        &k,
        &[
            "--metrics-bind-address",
            "127.0.0.1:0",
            "--admin-socket",
            admin,
        ],
        &output,
    ));
    let port = kpng.served_port("/metrics");
    kpng.wait_written("the first sync", &output, "10.244.1.2:8080");
    let read_errors = || {
        metric(
            &http_get(port, "/metrics").1,
            "kpng_source_errors_total{reason=\"list_read\"}",
        )
    };
    assert_eq!(read_errors(), Some(0.0), "exported from the start");

    server.truncate(Some(4_000));
    server.expire_watches();
    server
        .apply(endpoints("web-1", "web", "10.244.1.4", None))
        .expect("a change while lists are cut short");
    kpng.wait("the cut list warned", |_, err| {
        err.contains("WARN") && err.contains("the Service list's answer could not be read")
    });
    let problems = status_json(admin)["input"]["problems"].clone();
    assert!(
        problems
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p["what"] == "Service list"
                && p["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("could not be read")))),
        "kpng status says why nothing changes: {problems}"
    );
    assert!(read_errors().is_some_and(|n| n >= 1.0));

    server.truncate(None);
    kpng.wait_written("the change made meanwhile", &output, "10.244.1.4:8080");
    kpng.wait("the problem over", |_, _| {
        status_json(admin)["input"]["problems"] == json!([])
    });
}

/// `kpng-fake-apiserver` as a process, driven through its standard input as a test script
/// would drive it; ended (standard input closed, then killed) when dropped.
struct FakeProcess {
    child: Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl FakeProcess {
    /// Starts it with `manifest` applied and its kubeconfig written to `kubeconfig`.
    fn start(manifest: &Path, kubeconfig: &Path) -> FakeProcess {
        let exe = kpng_testkit::bin_path("kpng-fake-apiserver").expect("the fake's binary");
        let mut child = Command::new(exe)
            .arg("--manifest")
            .arg(manifest)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start kpng-fake-apiserver");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut fake = FakeProcess {
            child,
            stdin,
            stdout,
        };
        let first = fake.line();
        assert!(first.starts_with("listening http://"), "{first}");
        fake
    }

    fn line(&mut self) -> String {
        use std::io::BufRead;
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .expect("read the fake's answer");
        line.trim_end().to_string()
    }

    /// Runs one command; its answer (`ok …` or `error …`).
    fn command(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").expect("write the command");
        self.stdin.flush().expect("flush");
        self.line()
    }
}

impl Drop for FakeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// RBAC missing for one resource (the fake's `forbid endpointslices`): the refusal names
/// that resource with its API group, who the server says kpng is, and the `kubectl auth
/// can-i` command for exactly that resource; the other kinds are unaffected, and `allow`
/// ends it. The fake's command line had no per-resource 403, so a script could not test the
/// advice for anything but Events.
#[test]
fn a_refused_endpointslice_list_names_the_resource_and_the_command_that_checks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = dir.path().join("cluster.yaml");
    std::fs::write(
        &manifest,
        r#"
apiVersion: v1
kind: Node
metadata: {name: node1}
status: {addresses: [{type: InternalIP, address: 192.168.100.1}]}
---
apiVersion: v1
kind: Service
metadata: {namespace: default, name: web}
spec:
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: default
  name: web-1
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: [10.244.1.2], nodeName: node1, conditions: {ready: true}}]
"#,
    )
    .expect("manifest");
    let k = dir.path().join("kubeconfig");
    let mut fake = FakeProcess::start(&manifest, &k);
    assert_eq!(fake.command("forbid endpointslices"), "ok");
    assert!(
        fake.command("forbid pods")
            .starts_with("error unknown resource \"pods\""),
        "only the resources it serves"
    );
    let output = dir.path().join("out.yaml");
    let admin = dir.path().join("admin.sock");
    let admin = admin.to_str().expect("utf-8");
    let mut kpng = Kpng::start(&kube_to_file(
        &k,
        &["--metrics-bind-address", "", "--admin-socket", admin],
        &output,
    ));
    let advice = "kpng (\"system:serviceaccount:kube-system:kpng\") may not list \
                  endpointslices.discovery.k8s.io: grant list and watch on it (RBAC), check \
                  with `kubectl auth can-i list endpointslices.discovery.k8s.io \
                  --as=system:serviceaccount:kube-system:kpng`";
    kpng.wait("the refusal warned", |_, err| {
        err.lines().any(|l| {
            l.contains("WARN")
                && l.contains("EndpointSlice list refused: 403 Forbidden (endpointslices.discovery.k8s.io is forbidden")
                && l.ends_with(advice)
        })
    });
    let status = status_json(admin);
    assert_eq!(status["waitingFor"], json!(["EndpointSlice"]), "{status}");
    let problems = status["input"]["problems"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(problems.len(), 1, "only the EndpointSlice list: {status}");
    assert_eq!(problems[0]["what"], "EndpointSlice list", "{status}");
    assert!(
        problems[0]["message"].as_str().is_some_and(|m| m
            .contains("cannot list resource \"endpointslices\" in API group \"discovery.k8s.io\"")
            && m.ends_with(advice)),
        "{status}"
    );

    assert_eq!(fake.command("allow endpointslices.discovery.k8s.io"), "ok");
    kpng.wait_written("the first sync", &output, "10.244.1.2:8080");
    kpng.wait("the refusal's end logged", |_, err| {
        err.contains("EndpointSlice list works again, the problem is over")
    });
}
