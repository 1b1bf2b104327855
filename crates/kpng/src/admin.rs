//! The admin socket (`--admin-socket`, a Unix socket) and its clients, `kpng status` and
//! `kpng trace`: an operator asks the running proxy what it programmed and why a packet goes
//! where it goes, without reading kernel rules.
//!
//! The socket is local and root-only (mode 0600): the answers name every Service and
//! endpoint. HTTP/1.1 carries JSON (`GET /v1/status`, `GET /v1/trace?from=…&to=…&proto=…`) so
//! that `curl --unix-socket` works too. The client side is a few lines of HTTP over a blocking
//! socket rather than an HTTP client crate: one request, `Connection: close`, one JSON body.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use anyhow::{Context, bail};
use kpng_model::Protocol;
use kpng_model::trace::{NodeFacts, TraceQuery};
use kpng_runner::admin::{
    AdminHandle, BrainReportStatus, ConntrackStatus, DataPlaneDetail, DroppedStatus,
    HealthCheckStatus, InputStatus, PortStatus, RejectedStatus, RepairStatus, Status, StatusQuery,
};

use crate::admin_socket::Serving;
use crate::cli::{StatusArgs, StatusOutput, TraceArgs};
use crate::exit_codes::{Classified, Failure};
use crate::status_filter::{keep_rejections_of, keep_rejections_of_json};

/// Serves `handle` on the admin socket `path` until the process ends (`crate::admin_socket`:
/// `Ok(None)` when another process serves it).
pub async fn serve(path: &Path, handle: AdminHandle) -> anyhow::Result<Option<Serving>> {
    use axum::routing::get;
    let app = axum::Router::new()
        .route("/v1/status", get(status))
        .route("/v1/trace", get(trace))
        .with_state(handle);
    crate::admin_socket::serve(path, app).await
}

/// A brain's admin socket: `kpng status` lists the connected nodes; `kpng status --node NAME`
/// explains node NAME's view, every endpoint used or not, as that node cannot (it receives
/// only the endpoints it uses).
pub async fn serve_brain(
    path: &Path,
    hub: std::sync::Arc<kpng_api::hub::Hub>,
    input: kpng_model::input::InputHealth,
) -> anyhow::Result<Option<Serving>> {
    use axum::response::IntoResponse;
    use axum::routing::get;
    let app = axum::Router::new()
        .route(
            "/v1/status",
            get(
                move |axum::extract::Query(query): axum::extract::Query<BrainQuery>| {
                    let hub = hub.clone();
                    let input = InputStatus::of(&input.state());
                    async move {
                        match query
                            .node
                            .as_deref()
                            .map(str::trim)
                            .filter(|n| !n.is_empty())
                        {
                            Some(node) => match brain_node_status(&hub, node, &query.status()) {
                                Ok(status) => axum::Json(status).into_response(),
                                // As `kpng status` says of a Service no port matches: an
                                // error, not a view of a node that is not there.
                                Err(no_such_node) => {
                                    (axum::http::StatusCode::NOT_FOUND, no_such_node)
                                        .into_response()
                                }
                            },
                            None => axum::Json(brain_status(&hub, input, &query.status()))
                                .into_response(),
                        }
                    }
                },
            ),
        )
        .route("/v1/trace", get(brain_trace));
    crate::admin_socket::serve(path, app).await
}

/// A status request to a brain: a node's view with `node`, else the brain's own status.
#[derive(Debug, Default, serde::Deserialize)]
struct BrainQuery {
    /// The node whose view to explain (`kpng status --node`).
    #[serde(default)]
    node: Option<String>,
    /// [`StatusQuery::service`].
    #[serde(default)]
    service: Option<String>,
    /// [`StatusQuery::text`].
    #[serde(default)]
    q: Option<String>,
    /// [`StatusQuery::limit`].
    #[serde(default)]
    limit: Option<usize>,
    /// [`StatusQuery::offset`].
    #[serde(default)]
    offset: Option<usize>,
}

impl BrainQuery {
    /// The Services and page asked for, as of a node's kpng (the query string's fields are
    /// listed here rather than flattened: a flattened struct's numbers arrive as text).
    fn status(&self) -> StatusQuery {
        StatusQuery {
            service: self.service.clone(),
            text: self.q.clone(),
            limit: self.limit,
            offset: self.offset,
        }
    }
}

/// The brain's own status; with a Service asked for, what it can say of it without a node.
fn brain_status(hub: &kpng_api::hub::Hub, input: InputStatus, query: &StatusQuery) -> BrainStatus {
    let selected =
        query.service.as_deref().filter(|s| !s.is_empty()).map(|_| {
            hub.service_summaries(&|namespace, name| query.names_service(namespace, name))
        });
    BrainStatus {
        role: "brain".into(),
        version: Some(hub.version().to_string()),
        synced: hub.synced(),
        services: hub.service_count(),
        nodes: hub.watchers(),
        not_connected: hub.not_connected(),
        disconnected: hub.disconnected_nodes(),
        unknown_nodes: hub.unknown_watchers(),
        deleted_nodes: hub.deleted_node_watchers(),
        duplicate_nodes: hub.duplicate_nodes(),
        rejected: hub.rejected().iter().map(RejectedStatus::of).collect(),
        dropped: hub
            .dropped()
            .iter()
            .map(|(service, w)| DroppedStatus::of(service.as_ref(), w))
            .collect(),
        input: Some(input),
        tls: hub.metrics().tls.get(),
        selected,
    }
}

/// Node `node`'s view as the brain computes it, in the shape a node's kpng answers, so `kpng
/// status --node` prints what a kpng of that node fed from the same cluster (not through a
/// brain) would: every endpoint of each port, used or not, with why. What only the node knows
/// (its `--node-ip`, backend, syncs, health-check servers) is left out and said so; empty
/// endpoint lists are worded for a Linux backend.
///
/// `Err` with what to say when the brain has no Node object of that name: the view of a node
/// without one is a node with no endpoint of its own, which answered as if it existed (until
/// 2026-12-06) sent the operator of a typo chasing endpoints.
fn brain_node_status(
    hub: &kpng_api::hub::Hub,
    node: &str,
    query: &StatusQuery,
) -> Result<Status, String> {
    let view = hub.node_view(node, &|namespace, name| {
        query.names_service(namespace, name)
    });
    if !view.node.known {
        let connected: Vec<String> = hub.watchers().into_iter().map(|w| w.node).collect();
        return Err(no_such_node(
            node,
            &hub.node_names(),
            &connected,
            view.node.ever_known,
            hub.synced(),
        ));
    }
    let traits = kpng_model::trace::BackendTraits::default();
    let text = query.text_filter();
    let ports: Vec<PortStatus> = view
        .ports
        .iter()
        .filter(|(p, _)| {
            let svc = &p.key.service;
            query.wants_service(&svc.namespace, &svc.name, &p.key.port_name, p.port)
        })
        .map(|(p, explained)| PortStatus::of(p, Some(explained.clone()), &traits))
        .filter(|s| text.as_deref().is_none_or(|t| s.row_contains(t)))
        .collect();
    let matching = ports.len();
    let not_programmed = if matching == 0 && query.service.is_some() {
        view.not_programmed
            .iter()
            .map(|(key, why)| kpng_runner::admin::NotProgrammed {
                service: key.to_string(),
                why: why.clone(),
            })
            .collect()
    } else {
        Vec::new()
    };
    let connected = if view.connected {
        format!("a kpng watching as {node} is connected")
    } else {
        format!("no kpng watching as {node} is connected now")
    };
    let synced = hub.synced();
    Ok(Status {
        node: node.to_string(),
        brain_view: Some(format!(
            "as the brain computes node {node}'s view ({connected}); that node's --node-ip, \
             backend and syncs are not known here"
        )),
        backend: "-".into(),
        programmed: synced,
        in_sync: synced,
        services: ports
            .into_iter()
            .skip(query.offset.unwrap_or_default())
            .take(query.limit.unwrap_or(usize::MAX))
            .collect(),
        total_ports: matching,
        matching_ports: matching,
        not_programmed,
        rejected: hub.rejected().iter().map(RejectedStatus::of).collect(),
        waiting_for: if synced {
            Vec::new()
        } else {
            vec!["the brain's lists".into()]
        },
        node_problem: synced
            .then(|| kpng_runner::admin::node_problem(&view.node, Default::default()))
            .flatten(),
        node_ips: view.node.ips.iter().map(|ip| ip.to_string()).collect(),
        pod_cidrs: view.node.pod_cidrs.iter().map(|c| c.to_string()).collect(),
        zone: view.node.zone.clone(),
        ..Status::default()
    })
}

/// How many Node names `kpng status --node` on a brain suggests for a name it has no Node
/// for (the nearest first when there are more).
const NEAREST_NODES: usize = 10;

/// What a brain says when asked for node `node`'s view and it has no Node object of that name
/// (`known`: its Nodes' names, `connected`: the names connected kpngs watch as, `deleted`:
/// it had one, `synced`: its input is listed): plainly that, the Node names it does know
/// (the [`NEAREST_NODES`] nearest when there are more), the connected node names, and a
/// kpng watching as that name, which gets no local endpoint.
fn no_such_node(
    node: &str,
    known: &[String],
    connected: &[String],
    deleted: bool,
    synced: bool,
) -> String {
    use std::fmt::Write as _;
    let mut out = if !synced {
        format!(
            "the brain has no Node object named {node:?} yet: it is still listing its input \
             (`kpng status` on the brain says why)"
        )
    } else if deleted {
        format!("the brain has no Node object named {node:?} now: it was deleted")
    } else {
        format!(
            "the brain has no Node object named {node:?} (a typo, or a short hostname where \
             the Node's name is an FQDN?)"
        )
    };
    match known.len() {
        0 => out.push_str("; it knows no Node"),
        n if n <= NEAREST_NODES => {
            let _ = write!(out, "; its Nodes: {}", known.join(", "));
        }
        n => {
            let mut nearest: Vec<(usize, &String)> = known
                .iter()
                .map(|k| (strsim::levenshtein(node, k), k))
                .collect();
            nearest.sort();
            let names: Vec<&str> = nearest
                .iter()
                .take(NEAREST_NODES)
                .map(|(_, k)| k.as_str())
                .collect();
            let _ = write!(
                out,
                "; the {NEAREST_NODES} nearest of its {n} Nodes: {}",
                names.join(", ")
            );
        }
    }
    let mut connected = connected.to_vec();
    connected.sort_unstable();
    connected.dedup();
    if connected.iter().any(|c| c == node) {
        let _ = write!(
            out,
            "; a kpng watching as {node:?} is connected, and gets no local endpoint"
        );
    }
    match connected.len() {
        0 => out.push_str("; no kpng is connected"),
        n if n <= NEAREST_NODES => {
            let _ = write!(out, "; connected kpngs watch as: {}", connected.join(", "));
        }
        n => {
            let _ = write!(
                out,
                "; {n} kpngs are connected (`kpng status` on the brain lists them)"
            );
        }
    }
    out
}

/// `kpng trace` asked of a brain: it programs no node, so no packet meets its rules.
async fn brain_trace() -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        axum::http::StatusCode::NOT_FOUND,
        "this kpng is a brain (`to-api`): it programs no node, so there is nothing to trace \
         here; ask a node's kpng (`kpng trace --admin-socket` of a `kpng local`/`api` node)",
    )
        .into_response()
}

/// What a brain answers to `kpng status`.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BrainStatus {
    /// `brain`: tells the client which view this is.
    pub role: String,
    /// The brain's build (`0.1.0+COMMIT`), which its nodes' VERSION is compared with: a
    /// rollout shows as nodes of another build (absent from a brain before 2026-12-07).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Whether every list is complete (nodes are served).
    pub synced: bool,
    /// Services the brain holds.
    pub services: usize,
    /// The connected nodes.
    pub nodes: Vec<kpng_api::hub::WatcherStatus>,
    /// The cluster's Nodes with no kpng connected: they do not follow the cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_connected: Vec<String>,
    /// Those of them whose kpng was connected to this brain and went away: since when, and
    /// after how long (absent from a brain before 2026-12-07, and for a Node not connected
    /// since the brain started).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disconnected: Vec<kpng_api::hub::DisconnectedNode>,
    /// Node names kpngs ask for (connected, or refused in the last 5 minutes) that no Node of
    /// the cluster has had.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unknown_nodes: Vec<String>,
    /// Node names connected kpngs ask for whose Node the brain saw, and is deleted now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deleted_nodes: Vec<String>,
    /// Node names that more than one connected kpng asks for, with each one's address: a
    /// copied DaemonSet or a wrong `--hostname-override`, which only the brain can see.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub duplicate_nodes: Vec<kpng_api::hub::DuplicateNode>,
    /// Objects whose latest version the brain rejected.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<RejectedStatus>,
    /// Values the brain's conversion dropped from objects in use (the rest of each object
    /// goes to the nodes, which are not told: see docs/observability.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<DroppedStatus>,
    /// How the brain's own source is doing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<InputStatus>,
    /// The certificate its API serves, when it serves TLS: when it expires, and whether its
    /// files' last change could be taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<kpng_api::metrics::TlsStatus>,
    /// The Services `kpng status NAME` asked for without `--node`: what the brain can say of
    /// them whatever the node (absent when none was asked for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selected: Option<Vec<kpng_api::hub::ServiceSummary>>,
}

async fn status(
    axum::extract::State(handle): axum::extract::State<AdminHandle>,
    axum::extract::Query(query): axum::extract::Query<StatusQuery>,
) -> axum::response::Response {
    status_answer(Some(&handle), query).await
}

async fn trace(
    axum::extract::State(handle): axum::extract::State<AdminHandle>,
    axum::extract::Query(p): axum::extract::Query<TraceParams>,
) -> axum::response::Response {
    trace_answer(Some(&handle), p).await
}

/// A trace request's query string (`from`, `to`, `proto`, `iif`), on the admin socket and the
/// status page alike.
#[derive(Debug, serde::Deserialize)]
pub struct TraceParams {
    from: String,
    to: String,
    proto: Option<String>,
    /// The input interface (`kpng trace --in-interface`); blank: not given.
    iif: Option<String>,
}

/// The status of the ports `query` selects as JSON, or why there is none (no handle: a
/// brain; none: kpng is stopping).
pub async fn status_answer(
    handle: Option<&AdminHandle>,
    query: StatusQuery,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    match handle {
        Some(h) => match h.status(query).await {
            Some(s) => axum::Json(s).into_response(),
            None => not_answering(),
        },
        None => not_answering(),
    }
}

/// A trace as JSON; a bad request says which field is wrong.
pub async fn trace_answer(
    handle: Option<&AdminHandle>,
    p: TraceParams,
) -> axum::response::Response {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let Some(handle) = handle else {
        return not_answering();
    };
    let query = match parse_trace(&p.from, &p.to, p.proto.as_deref(), p.iif.as_deref()) {
        Ok(q) => q,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{e:#}\n")).into_response(),
    };
    match handle.trace(query).await {
        Some(t) => axum::Json(t).into_response(),
        None => not_answering(),
    }
}

pub(crate) fn not_answering() -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        "this kpng does not answer status questions (a brain, or it is stopping)\n",
    )
        .into_response()
}

/// A trace request, checked. An IPv6 `--from` may be bracketed as in `--to`; an IPv4-mapped
/// IPv6 address (`::ffff:10.96.0.20`) is the IPv4 address, as the kernel sends it and
/// kube-proxy's rules see it. `in_interface` (blank: not given) must be a name the kernel
/// accepts for a link.
pub fn parse_trace(
    from: &str,
    to: &str,
    proto: Option<&str>,
    in_interface: Option<&str>,
) -> anyhow::Result<TraceQuery> {
    let bare = from.trim();
    let bare = bare
        .strip_prefix('[')
        .and_then(|b| b.strip_suffix(']'))
        .unwrap_or(bare);
    let from: IpAddr = bare
        .parse::<IpAddr>()
        .with_context(|| format!("--from {from:?} is not an IP address"))?
        .to_canonical();
    let to: SocketAddr = to
        .trim()
        .parse()
        .with_context(|| format!("--to {to:?} is not IP:PORT (IPv6: [ADDRESS]:PORT)"))?;
    let to = SocketAddr::new(to.ip().to_canonical(), to.port());
    let protocol = match proto.unwrap_or("tcp").to_ascii_lowercase().as_str() {
        "tcp" => Protocol::Tcp,
        "udp" => Protocol::Udp,
        "sctp" => Protocol::Sctp,
        other => bail!("--proto {other:?}: tcp, udp or sctp"),
    };
    if from.is_ipv4() != to.is_ipv4() {
        bail!("--from {from} and --to {to} are of different IP families");
    }
    let in_interface = in_interface
        .filter(|i| !i.is_empty())
        .map(|i| match crate::config::checks::link_name_problem(i) {
            Some(problem) => Err(anyhow::anyhow!("--in-interface {i:?}: {problem}")),
            None => Ok(i.to_string()),
        })
        .transpose()?;
    Ok(TraceQuery {
        from,
        to,
        protocol,
        in_interface,
    })
}

/// How long `kpng status` and `kpng trace` wait for the kpng's answer by default: a healthy
/// kpng answers in milliseconds (a page of 2,000 ports in well under a second), so this is
/// only reached by a hung one (stopped, deadlocked) or one far too busy.
pub const DEFAULT_ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// One GET on the admin socket: the body of a 200 answer, else an error with the server's
/// message. A kpng that does not answer within `timeout` is an error that says so (and names
/// its process where the socket tells), rather than a client waiting forever.
fn get(socket: &Path, target: &str, timeout: std::time::Duration) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut stream = crate::admin_socket::connect(socket)
        .map_err(|e| Classified::error(Failure::NotReachable, crate::describe(&e)))?;
    let peer = crate::admin_socket::peer_pid(&stream);
    let request = format!("GET {target} HTTP/1.1\r\nHost: kpng\r\nConnection: close\r\n\r\n");
    // The exchange on a thread of its own: a named pipe (Windows) has no read timeout, and a
    // thread left waiting on a hung kpng ends with this process.
    let (done, answer) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut exchange = || -> anyhow::Result<String> {
            stream.write_all(request.as_bytes())?;
            let mut response = String::new();
            stream
                .read_to_string(&mut response)
                .context("reading kpng's answer")?;
            Ok(response)
        };
        let _ = done.send(exchange());
    });
    // `--timeout 0` waits as long as it takes (as kubectl's `--request-timeout=0`).
    let answered = if timeout.is_zero() {
        answer.recv().map_err(|_| ())
    } else {
        answer.recv_timeout(timeout).map_err(|_| ())
    };
    let response = match answered {
        Ok(response) => response?,
        Err(()) => {
            return Err(Classified::error(
                Failure::NoAnswer,
                no_answer(socket, peer, timeout),
            ));
        }
    };
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("kpng's answer has no HTTP header")?;
    let code = head.split_whitespace().nth(1).unwrap_or("?");
    // A 404 with words is kpng's own answer that what was asked for is not there (a brain
    // asked for a node it has no Node of, or for a trace): said as it is.
    if code == "404" && !body.trim().is_empty() {
        let kind = if body.starts_with("this kpng is a brain") {
            Failure::Usage
        } else {
            Failure::NoMatch
        };
        return Err(Classified::error(kind, body.trim()));
    }
    // A 503 is a kpng that cannot answer now (it is stopping): its own exit code, so that a
    // script retries rather than reporting a broken kpng (until 2026-12-07: exit 1).
    if code == "503" {
        return Err(Classified::error(
            Failure::Unavailable,
            format!("kpng answered 503: {}", body.trim()),
        ));
    }
    if code != "200" {
        bail!("kpng answered {code}: {}", body.trim());
    }
    Ok(body.to_string())
}

/// Why `kpng status`/`kpng trace` gave up: the kpng at `socket` (process `pid`, when the
/// socket tells) did not answer within `timeout`.
fn no_answer(socket: &Path, pid: Option<u32>, timeout: std::time::Duration) -> String {
    let who = match pid {
        Some(pid) => format!("the kpng at {} (pid {pid})", socket.display()),
        None => format!("the kpng at {}", socket.display()),
    };
    format!(
        "{who} did not answer within {}: it is hung (stopped, deadlocked) or very busy; \
         --timeout waits longer",
        humantime_secs(timeout)
    )
}

/// A timeout in words (`10s`, `1.5s`).
fn humantime_secs(d: std::time::Duration) -> String {
    let secs = d.as_secs_f64();
    if secs.fract() == 0.0 {
        format!("{secs:.0}s")
    } else {
        format!("{secs}s")
    }
}

/// Standard output was closed by its reader (`kpng status -o json | head -1`): not a failure,
/// so `kpng` ends quietly, as command-line tools do, instead of a panic's message.
#[derive(Debug)]
pub struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("standard output was closed")
    }
}

impl std::error::Error for StdoutClosed {}

/// Writes `text` to standard output; a reader gone is [`StdoutClosed`].
fn print_out(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        result => Ok(result?),
    }
}

/// The backend of the kpng answering on `socket` (`nftables`, `kernelspace`, …), or `None`
/// when nothing answers there. Lets `kpng cleanup` on Windows see a kpng that would put back
/// what it removes (Linux has the instance lock for that).
#[cfg_attr(not(windows), allow(dead_code))]
pub fn serving_backend(socket: &Path) -> Option<String> {
    let body = get(socket, "/v1/status?limit=0", DEFAULT_ANSWER_TIMEOUT).ok()?;
    let status: serde_json::Value = serde_json::from_str(&body).ok()?;
    status["backend"].as_str().map(str::to_string)
}

/// The version of the JSON (and YAML) documents `kpng status`, `kpng trace` and their errors
/// print, as their `schemaVersion`: raised only when a field is removed or changes its meaning
/// (docs/observability.md, "Output for scripts"); new fields come without a raise.
pub const SCHEMA_VERSION: u32 = 1;

/// `kpng status`.
pub fn print_status(socket: &Path, args: &StatusArgs) -> anyhow::Result<()> {
    let node = args
        .node
        .as_deref()
        .map(str::trim)
        .filter(|n| !n.is_empty());
    let service = service_filter(args.service.as_deref(), args.namespace.as_deref())
        .map_err(|e| Classified::error(Failure::Usage, e.to_string()))?;
    let mut status = read_status(socket, service.as_deref(), node, args.timeout)?;
    if matches!(args.output, StatusOutput::Table | StatusOutput::Wide) {
        escape_value_controls(&mut status);
    }
    if status["role"] == "brain" {
        if args.problems || args.fail_on_problems {
            return Err(Classified::error(
                Failure::Usage,
                "--problems and --fail-on-problems judge a node's Service ports; a brain lists \
                 its nodes (ask with --node NODE for a node's view, or the node's own kpng)",
            ));
        }
        with_schema_version(&mut status);
        return print_brain(&status, service.as_deref(), args.output);
    }
    if let Some(node) = node
        && status.get("brainView").is_none()
    {
        return Err(Classified::error(
            Failure::Usage,
            format!(
                "--node {} asks a brain (`kpng ... to-api`) for a node's view; this kpng is \
                 node {}'s own: ask without --node, or ask the brain's --admin-socket",
                crate::logging::escape_controls(node),
                crate::logging::escape_controls(status["node"].as_str().unwrap_or("?"))
            ),
        ));
    }
    if let Some(filter) = &service
        && let Some(services) = status.get_mut("services").and_then(|s| s.as_array_mut())
    {
        services.retain(|s| service_matches(s, filter));
        // As a document, a rejected Service is an answer: no port, and its rejection.
        let document = matches!(args.output, StatusOutput::Json | StatusOutput::Yaml);
        if services.is_empty() && !(document && rejected_service(&status, filter).is_some()) {
            return Err(Classified::error(
                Failure::NoMatch,
                no_port_matches(&status, filter),
            ));
        }
    }
    let with_problems;
    match args.output {
        StatusOutput::Json | StatusOutput::Yaml => {
            let typed: Status = serde_json::from_value(status.clone())
                .context("kpng's status does not have the expected shape")?;
            with_problems =
                crate::status_problems::add_problems_json(&mut status, &typed, args.problems);
            with_schema_version(&mut status);
            // About some Services, as the table: their rejections and dropped values only
            // (until 2026-12-07 the JSON listed every object's), after the problems were
            // judged with all of them.
            if let Some(filter) = &service {
                keep_rejections_of_json(&mut status, filter);
            }
            match args.output {
                StatusOutput::Json => {
                    print_out(&format!("{}\n", serde_json::to_string_pretty(&status)?))?
                }
                _ => print_out(&serde_saphyr::to_string(&status)?)?,
            }
        }
        StatusOutput::Table | StatusOutput::Wide => {
            let mut typed: Status = serde_json::from_value(status)
                .context("kpng's status does not have the expected shape")?;
            with_problems = typed
                .services
                .iter()
                .filter(|p| crate::status_problems::has_any(p, &typed))
                .count();
            // Which ports have a problem is judged with every rejection and dropped value
            // of the node, before those of other Services are left out.
            let hidden = args
                .problems
                .then(|| crate::status_problems::keep_ports_with_problems(&mut typed));
            let not_shown = match &service {
                Some(filter) => keep_rejections_of(&mut typed, filter),
                None => 0,
            };
            let wide = args.output == StatusOutput::Wide;
            let view = TableView {
                wide,
                detailed: wide || service.is_some() || args.problems,
                hidden,
            };
            let mut text = table_of(&typed, view);
            // The node's sync history, in the wide view of the whole node (about one Service,
            // the syncs' text names others).
            if args.output == StatusOutput::Wide && service.is_none() {
                crate::status_history::write(&mut text, &typed.recent_syncs);
            }
            write_not_shown(&mut text, not_shown);
            // About one Service, the input's problem is said as when no port matches: what is
            // shown may be out of date (the header's PROBLEM line does not say so of it).
            if service.is_some()
                && let Some(note) = typed.input.as_ref().and_then(InputStatus::stale_note)
            {
                text.push_str(&format!("note: {note}\n"));
            }
            print_out(&terminal_safe(&text))?;
        }
    }
    if args.fail_on_problems && with_problems > 0 {
        return Err(Classified::error(
            Failure::Problems,
            match with_problems {
                1 => "1 Service port has a problem (--fail-on-problems)".to_string(),
                n => format!("{n} Service ports have a problem (--fail-on-problems)"),
            },
        ));
    }
    Ok(())
}

/// Adds `schemaVersion` ([`SCHEMA_VERSION`]) to a JSON document kpng prints.
fn with_schema_version(value: &mut serde_json::Value) {
    if let serde_json::Value::Object(map) = value {
        map.insert("schemaVersion".to_string(), SCHEMA_VERSION.into());
    }
}

/// The Services `kpng status` asks for: `service` as given, within `namespace` (`-n`) when
/// one is given (`NAMESPACE/` alone: all of that namespace's). `Err` when the two name
/// different namespaces.
fn service_filter(
    service: Option<&str>,
    namespace: Option<&str>,
) -> anyhow::Result<Option<String>> {
    let Some(namespace) = namespace.map(str::trim).filter(|n| !n.is_empty()) else {
        return Ok(service.map(str::to_string));
    };
    match service {
        None => Ok(Some(format!("{namespace}/"))),
        Some(s) => match s.split_once('/') {
            None => Ok(Some(format!("{namespace}/{s}"))),
            Some((ns, _)) if ns == namespace => Ok(Some(s.to_string())),
            Some((ns, _)) => {
                bail!("{s:?} is in namespace {ns:?}, not in {namespace:?} (-n): give one of them")
            }
        },
    }
}

/// Why no Service port matches `filter`, in words, for the error `kpng status NAME` stops
/// with, whatever the output format: the values it quotes (a rejection's object and message,
/// a Service's name, the input's problem) come from the input, and have their control
/// characters escaped as the text output escapes every value ([`escape_value_controls`]), so
/// a newline or an escape sequence in one neither forges a line nor reaches the terminal
/// (with `-o json|yaml`, which leave the status itself unescaped, they used to, raw).
fn no_port_matches(status: &serde_json::Value, filter: &str) -> String {
    use crate::logging::escape_controls;
    // The answer comes from the last good input: while the input has a problem, the
    // Service may just not have arrived yet (added while the brain is unreachable).
    let stale = serde_json::from_value::<InputStatus>(status["input"].clone())
        .ok()
        .and_then(|i| i.stale_note())
        .map(|note| format!("\nnote: {}", escape_controls(&note)))
        .unwrap_or_default();
    // A Service that never converted has no port: say so rather than "no such Service". It
    // is found by its name as it is (the filter is the operator's, unescaped).
    if let Some(why) = rejected_service(status, filter) {
        return format!(
            "no Service port matches {filter:?}: {}{stale}",
            escape_controls(&why)
        );
    }
    // Nor has one kpng holds and gives no rule (headless, another proxy's, …).
    let not_programmed: Vec<String> = status["notProgrammed"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| {
            Some(format!(
                "{} has no rule: {}",
                escape_controls(n["service"].as_str()?),
                escape_controls(n["why"].as_str()?)
            ))
        })
        .collect();
    if !not_programmed.is_empty() {
        return format!(
            "no Service port matches {filter:?}: {}{stale}",
            not_programmed.join("; ")
        );
    }
    format!(
        "no Service port matches {filter:?} (NAME, NAMESPACE/NAME, NAMESPACE/NAME:PORT, or \
         NAMESPACE/ or -n NAMESPACE for a whole namespace){stale}"
    )
}

/// Ports per status request: the running kpng builds one page at a time (an answer for every
/// port of a 30k-Service cluster is 22 MB, built in the node agent's memory).
const STATUS_PAGE_PORTS: usize = 2000;

/// The status, with the ports `service` selects read page by page and put together. The
/// pages must come from one generation of the model (a sync in between starts over); the
/// selection is applied here again by the caller for an older kpng, which ignores it.
fn read_status(
    socket: &Path,
    service: Option<&str>,
    node: Option<&str>,
    timeout: std::time::Duration,
) -> anyhow::Result<serde_json::Value> {
    let mut selection = match service {
        Some(filter) => format!("service={}&", query_escape(filter)),
        None => String::new(),
    };
    if let Some(node) = node {
        selection.push_str(&format!("node={}&", query_escape(node)));
    }
    let mut attempts = 0;
    'again: loop {
        attempts += 1;
        let mut first: Option<serde_json::Value> = None;
        let mut ports = Vec::new();
        loop {
            let target = format!(
                "/v1/status?{selection}limit={STATUS_PAGE_PORTS}&offset={}",
                ports.len()
            );
            let body = get(socket, &target, timeout)?;
            let mut page: serde_json::Value =
                serde_json::from_str(&body).context("kpng's status is not JSON")?;
            if page["role"] == "brain" {
                return Ok(page);
            }
            let services = match page.get_mut("services").map(serde_json::Value::take) {
                Some(serde_json::Value::Array(services)) => services,
                _ => Vec::new(),
            };
            let full_page = services.len() >= STATUS_PAGE_PORTS;
            ports.extend(services);
            // An older kpng answers everything at once and has no `matchingPorts`.
            let more = full_page && page.get("matchingPorts").is_some();
            match &first {
                Some(f) if f["generation"] != page["generation"] && attempts < 3 => {
                    continue 'again;
                }
                Some(_) => {}
                None => first = Some(page),
            }
            if !more {
                break;
            }
        }
        let mut status = first.unwrap_or_default();
        status["services"] = serde_json::Value::Array(ports);
        return Ok(status);
    }
}

/// A brain's status: its nodes, what each took and how far behind it is; with `service`, what
/// the brain can say of that Service without a node first ([`brain_output`]).
fn print_brain(
    status: &serde_json::Value,
    service: Option<&str>,
    output: StatusOutput,
) -> anyhow::Result<()> {
    print_out(&brain_output(status, service, output)?)
}

/// What `kpng status` prints of a brain's status in `output`; with `service`, of the brain's
/// rejections and dropped values only that Service's, as on a node
/// ([`keep_rejections_of_json`]).
fn brain_output(
    status: &serde_json::Value,
    service: Option<&str>,
    output: StatusOutput,
) -> anyhow::Result<String> {
    let mut status = status.clone();
    // About some Services, the brain's rejections and dropped values are those of these
    // Services, in every output (until 2026-12-07 a brain listed every object's, while a node
    // asked the same listed the Service's only). Done here, not by the brain, so a brain of
    // an older build is narrowed too.
    let not_shown = service.map_or(0, |filter| keep_rejections_of_json(&mut status, filter));
    Ok(match output {
        StatusOutput::Json => format!("{}\n", serde_json::to_string_pretty(&status)?),
        StatusOutput::Yaml => serde_saphyr::to_string(&status)?,
        StatusOutput::Table | StatusOutput::Wide => {
            escape_value_controls(&mut status);
            let brain: BrainStatus = serde_json::from_value(status)
                .context("the brain's status does not have the expected shape")?;
            let mut text = brain_text(&brain, service, output == StatusOutput::Wide);
            write_not_shown(&mut text, not_shown);
            terminal_safe(&text)
        }
    })
}

/// The line saying how many other objects' rejections a status about some Services left out.
fn write_not_shown(text: &mut String, not_shown: usize) {
    if not_shown > 0 {
        text.push_str(&format!(
            "({} rejected, not shown: `kpng status` without a Service lists them)\n",
            plural(not_shown, "other object")
        ));
    }
}

/// A brain's status as text (its values' control characters escaped already).
fn brain_text(brain: &BrainStatus, service: Option<&str>, wide: bool) -> String {
    let mut text = format!(
        "brain  {} Services  {}  {} connected\n",
        brain.services,
        if brain.synced {
            "synced"
        } else {
            "still listing"
        },
        plural(brain.nodes.len(), "node")
    );
    if let Some(filter) = service {
        write_selected(&mut text, filter, brain);
    }
    if let Some(input) = &brain.input {
        write_input(&mut text, input, brain.dropped.len());
    }
    if let Some(tls) = &brain.tls {
        write_tls(&mut text, tls, std::time::SystemTime::now());
    }
    write_not_connected(
        &mut text,
        &brain.not_connected,
        &brain.disconnected,
        std::time::SystemTime::now(),
    );
    if !brain.unknown_nodes.is_empty() {
        text.push_str(&format!(
            "PROBLEM: kpngs ask for node names no Node has (a node of another cluster, a typo, \
             or a short hostname where the Node is an FQDN; a brain whose input has Nodes \
             refuses them, one without Nodes serves them without local endpoints): {}\n",
            brain.unknown_nodes.join(", ")
        ));
    }
    if !brain.deleted_nodes.is_empty() {
        text.push_str(&format!(
            "PROBLEM: connected kpngs ask for Nodes that were deleted (their kpng still \
             runs: a scale-down, or the Node re-created under another name; they get no \
             local endpoint): {}\n",
            brain.deleted_nodes.join(", ")
        ));
    }
    write_duplicate_nodes(&mut text, &brain.duplicate_nodes);
    write_rejected(&mut text, &brain.rejected);
    write_dropped(&mut text, &brain.dropped);
    write_brain_nodes(&mut text, &brain.nodes, brain.version.as_deref(), wide);
    text
}

/// What a brain says of the Services `filter` names without a node, above its own status:
/// each one's ports and the nodes its endpoints run on, or why it gives no port (or is
/// rejected), and the command that explains a node's view.
fn write_selected(out: &mut String, filter: &str, brain: &BrainStatus) {
    use std::fmt::Write as _;
    let selected = brain.selected.as_deref().unwrap_or_default();
    let example = selected
        .first()
        .map_or_else(|| filter.to_string(), |s| s.service.clone());
    for s in selected {
        let what = match (&s.not_programmed, &s.endpoint_nodes) {
            (Some(why), _) => format!("gives no node a rule: {why}"),
            (None, Some(nodes)) if nodes.is_empty() => format!(
                "{} in every node's view; no endpoint runs on a known node",
                plural(s.ports, "port")
            ),
            (None, Some(nodes)) => format!(
                "{} in every node's view; its endpoints run on {}",
                plural(s.ports, "port"),
                nodes.join(", ")
            ),
            (None, None) => format!(
                "{} in every node's view; topology hints make each node's endpoints its own",
                plural(s.ports, "port")
            ),
        };
        let _ = writeln!(out, "Service {}: {what}", s.service);
    }
    let status = serde_json::json!({ "rejected": brain.rejected });
    if let Some(why) = rejected_service(&status, filter) {
        let _ = writeln!(out, "REJECTED: {why}");
    } else if selected.is_empty() {
        let _ = writeln!(out, "no Service matches {filter:?} in the brain's cluster");
    }
    let _ = writeln!(
        out,
        "which endpoints a node uses, and why not the others: `kpng status --node NODE \
         {example}`"
    );
}

/// `ns/name`, `name` (any namespace) or `ns/name:port` ([`StatusQuery::wants_service`]).
fn service_matches(service: &serde_json::Value, filter: &str) -> bool {
    let query = StatusQuery {
        service: Some(filter.to_string()),
        ..StatusQuery::default()
    };
    let (namespace, name) = service["service"]
        .as_str()
        .unwrap_or_default()
        .split_once('/')
        .unwrap_or_default();
    query.wants_service(
        namespace,
        name,
        service["portName"].as_str().unwrap_or_default(),
        service["port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or_default(),
    )
}

/// The rejection of the Service `filter` names (its port left out), in words: why a Service the
/// operator asks for has no port.
fn rejected_service(status: &serde_json::Value, filter: &str) -> Option<String> {
    let service = filter.split_once(':').map_or(filter, |(s, _)| s);
    let query = StatusQuery {
        service: Some(service.to_string()),
        ..StatusQuery::default()
    };
    // This kpng's own rejections, and on a node its brain's.
    let list = |value: Option<&serde_json::Value>| -> Vec<RejectedStatus> {
        value
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .unwrap_or_default()
    };
    let rejected = list(status.get("rejected"))
        .into_iter()
        .chain(list(status.pointer("/brainReports/rejected")));
    rejected.into_iter().find_map(|r| {
        let (namespace, name) = r.object.strip_prefix("Service ")?.split_once('/')?;
        query
            .wants_service(namespace, name, "", 0)
            .then(|| format!("{}; fix it in the input", rejected_line(&r)))
    })
}

/// `text` for a URL's query string: unreserved characters as they are, the rest
/// percent-encoded.
fn query_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/:".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The human view: a header, one line per Service port, and with `wide` one per endpoint
/// (the tests' shorthand for [`table_of`]).
#[cfg(test)]
fn table(status: &Status, wide: bool) -> String {
    table_of(
        status,
        TableView {
            wide,
            detailed: wide,
            hidden: None,
        },
    )
}

/// How [`table_of`] shows the ports.
#[derive(Debug, Clone, Copy)]
struct TableView {
    /// One line per endpoint under each port (`-o wide`).
    wide: bool,
    /// The POLICY cell's detail under each port ([`crate::status_policy::details`]): about
    /// one Service, in the wide view and for the ports with a problem.
    detailed: bool,
    /// How many ports `kpng status --problems` left out, when it did: the header's problem
    /// line then says so.
    hidden: Option<usize>,
}

/// The human view, as `view` says: a header, one line per Service port, and in the wide
/// view one per endpoint.
fn table_of(status: &Status, view: TableView) -> String {
    use std::fmt::Write as _;
    let TableView {
        wide,
        detailed,
        hidden,
    } = view;
    let mut out = String::new();
    let last = status.last_sync.as_ref().map_or("never".to_string(), |s| {
        format!(
            "{} ({}, {}, {} operations, {:.1} ms)",
            s.at,
            if s.ok { "ok" } else { "FAILED" },
            if s.full { "full" } else { "partial" },
            s.operations,
            s.duration_seconds * 1e3
        )
    });
    match &status.brain_view {
        Some(view) => {
            let _ = writeln!(out, "node {}  {view}", status.node);
        }
        None => {
            let _ = writeln!(
                out,
                "node {}  backend {}  last sync {last}  pending changes {}",
                status.node, status.backend, status.pending_port_changes
            );
        }
    }
    if let Some(e) = &status.last_error {
        let _ = writeln!(out, "last error: {e}");
    }
    if let Some(note) = &status.previous_run {
        let _ = writeln!(out, "previous run: {note}");
    }
    if !status.node_ips.is_empty() || !status.pod_cidrs.is_empty() || status.zone.is_some() {
        // What kpng uses of the Node (or of --node-ip, or kept from a deleted Node).
        let none = || "none".to_string();
        let _ = writeln!(
            out,
            "node IPs {}  pod CIDRs {}  zone {}",
            Some(status.node_ips.join(", "))
                .filter(|s| !s.is_empty())
                .unwrap_or_else(none),
            Some(status.pod_cidrs.join(", "))
                .filter(|s| !s.is_empty())
                .unwrap_or_else(none),
            status.zone.clone().unwrap_or_else(none)
        );
    }
    if let Some(words) = &status.node_ports_on {
        let _ = writeln!(out, "node ports on: {words}");
    }
    if let Some(problem) = &status.node_problem {
        let _ = writeln!(out, "PROBLEM: {problem}");
    }
    if let Some(input) = &status.input {
        write_input(&mut out, input, status.dropped.len());
    }
    if let Some(report) = &status.brain_reports {
        write_brain_reports(&mut out, report, brain_report_heading(status, report));
    }
    if let Some(repairs) = &status.repairs {
        write_repairs(&mut out, repairs);
    }
    if let Some(conntrack) = &status.conntrack {
        write_conntrack(&mut out, conntrack, wide);
    }
    write_data_plane(&mut out, &status.data_plane, wide);
    if let Some(line) = waiting_line(status) {
        let _ = writeln!(out, "{line}");
    }
    write_rejected(&mut out, &status.rejected);
    write_dropped(&mut out, &status.dropped);
    write_health_checks(&mut out, &status.health_checks_not_served);
    if let Some(line) = crate::status_problems::header_line(status, hidden) {
        let _ = writeln!(out, "{line}");
    }
    let rows: Vec<[String; 6]> = status.services.iter().map(row).collect();
    let header = [
        "SERVICE",
        "PORT",
        "FAMILY",
        "FRONTENDS",
        "POLICY",
        "ENDPOINTS",
    ];
    let mut widths = header.map(str::len);
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: &[&str]| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                l.push_str(cell);
            } else {
                let _ = write!(l, "{cell:<w$}  ");
            }
        }
        l
    };
    let _ = writeln!(out, "{}", line(&header));
    for (r, port) in rows.iter().zip(&status.services) {
        let cells: Vec<&str> = r.iter().map(String::as_str).collect();
        let _ = writeln!(out, "{}", line(&cells));
        if detailed {
            for d in crate::status_policy::details(port) {
                let _ = writeln!(out, "    {d}");
            }
        }
        if wide {
            for e in &port.endpoints {
                let state = kpng_model::inspect::condition_word(e.ready, e.serving, e.terminating);
                let mut used = if e.used_by.is_empty() {
                    format!("unused: {}", e.reason.as_deref().unwrap_or("not selected"))
                } else {
                    format!("used ({})", e.used_by.join(", "))
                };
                if let Some(copies) = &e.other_copies {
                    let _ = write!(used, "; {copies}");
                }
                let _ = writeln!(
                    out,
                    "    {:<24} {:<11} {:<6} {used}",
                    e.address.to_string(),
                    state,
                    if e.local { "local" } else { "remote" },
                );
            }
        }
    }
    if let Some(legend) = crate::status_policy::legend(&status.services, detailed) {
        let _ = writeln!(out, "{legend}");
    }
    write_brain_hint(&mut out, status);
    out
}

/// How current a node's brain report is, as its heading says: while the brain is out of
/// reach, what it last said may be out of date; so is what a brain said on an earlier
/// connection, until the brain connected now sends its state.
fn brain_report_heading(status: &Status, report: &BrainReportStatus) -> &'static str {
    let problems = status.input.as_ref().map_or(&[][..], |i| &i.problems[..]);
    if problems
        .iter()
        .any(|p| p.message.starts_with("unreachable"))
    {
        "brain reported (before it went out of reach; may be out of date)"
    } else if report.from_earlier_connection {
        "brain reported (on the previous connection; may be out of date until the brain sends \
         its state)"
    } else if !problems.is_empty() {
        "brain reported (may be out of date)"
    } else {
        "brain reports"
    }
}

/// Before the first sync, what it waits for and what meanwhile routes traffic: nothing, or
/// the rules an earlier run left (which the backend found at start).
fn waiting_line(status: &Status) -> Option<String> {
    if status.waiting_for.is_empty() {
        return None;
    }
    let waiting = if status.fed_by_brain {
        "waiting for the brain's first state".to_string()
    } else {
        format!(
            "waiting for the first complete lists of {}",
            status.waiting_for.join(", ")
        )
    };
    let meanwhile = if status.earlier_rules_in_place {
        "rules an earlier run of kpng left are still in place and route traffic as they did \
         until the first sync replaces them"
    } else {
        "nothing is programmed before"
    };
    Some(format!("{waiting} ({meanwhile})"))
}

/// On a node fed by a brain, when a port uses no endpoint: one line naming the brain's
/// command that says why (this node receives only the endpoints it uses, so it cannot).
fn write_brain_hint(out: &mut String, status: &Status) {
    use std::fmt::Write as _;
    let mut unused: Vec<&str> = status
        .services
        .iter()
        .filter(|p| p.only_used_known && p.endpoints.iter().all(|e| e.used_by.is_empty()))
        .map(|p| p.service.as_str())
        .collect();
    unused.dedup();
    let service = match unused[..] {
        [] => return,
        [one] => one,
        _ => "NAMESPACE/NAME",
    };
    let _ = writeln!(
        out,
        "hint: this node receives only the endpoints it uses; `kpng status --node {} {service}` \
         on the brain explains the endpoints this node does not receive",
        status.node
    );
}

/// How many rejected objects the table lists (all of them are in `-o json`).
const REJECTED_LISTED: usize = 20;

/// How many Nodes without a connected kpng a brain's table names (all are in `-o json`).
const NOT_CONNECTED_LISTED: usize = 20;

/// How many connected nodes a brain's table lists, the most behind first (`-o wide`: all).
const BRAIN_NODES_LISTED: usize = 50;

/// The objects whose latest version kpng could not use, above the ports: what to fix in the
/// input, and whether an older version of each is what the ports below show.
/// The input's line, and one line per problem it has now: what is wrong, since when.
fn write_input(out: &mut String, input: &InputStatus, dropped: usize) {
    use std::fmt::Write as _;
    let last = match (&input.last_good, &input.detail) {
        (Some(at), Some(detail)) => format!("{at} ({detail})"),
        (Some(at), None) => at.clone(),
        (None, _) => "never".into(),
    };
    // Values dropped from objects in use are problems of the input too (the log said so
    // once), though not of its freshness: listed apart ([`write_dropped`]).
    let state = match (input.problems.len(), dropped) {
        (_, 0) => problems_word(input.problems.len()),
        (0, 1) => "1 VALUE DROPPED".to_string(),
        (0, n) => format!("{n} VALUES DROPPED"),
        (p, 1) => format!("{}, 1 VALUE DROPPED", problems_word(p)),
        (p, n) => format!("{}, {n} VALUES DROPPED", problems_word(p)),
    };
    let version = match &input.brain_version {
        Some(v) => format!(" (kpng {v})"),
        None => String::new(),
    };
    let _ = writeln!(
        out,
        "input {}{version}  {state}  last good input {last}",
        input.source
    );
    write_problems(out, &input.problems);
}

/// `ok`, `1 PROBLEM`, `N PROBLEMS`: an input's state in the status's first lines.
fn problems_word(n: usize) -> String {
    match n {
        0 => "ok".to_string(),
        1 => "1 PROBLEM".to_string(),
        n => format!("{n} PROBLEMS"),
    }
}

/// One indented line per problem of an input.
fn write_problems(out: &mut String, problems: &[kpng_runner::admin::InputProblemStatus]) {
    use std::fmt::Write as _;
    for p in problems {
        let _ = writeln!(out, "  {} (since {}): {}", p.what, p.since, p.message);
    }
}

/// What the brain reports about its own input, on a node: its source's problems and the
/// objects it rejects (listed as the node's own rejected objects would be), which explain a
/// Service that looks wrong here although this node's own input is fine.
/// `heading` says whether the report is current (`brain reports`) or the last one received,
/// which may be out of date.
fn write_brain_reports(out: &mut String, report: &BrainReportStatus, heading: &str) {
    use std::fmt::Write as _;
    let state = problems_word(report.problems.len());
    let rejects = match report.rejected_total {
        0 => "rejects nothing".to_string(),
        1 => "rejects 1 object".to_string(),
        n => format!("rejects {n} objects"),
    };
    // The values it dropped from objects it uses: this node got the rest of each object.
    let dropped = match report.dropped_total {
        0 => String::new(),
        1 => "; it dropped 1 value".to_string(),
        n => format!("; it dropped {n} values"),
    };
    let _ = writeln!(
        out,
        "{heading}: its input {}  {state}; it {rejects}{dropped}",
        report.source
    );
    write_problems(out, &report.problems);
    for r in report.rejected.iter().take(REJECTED_LISTED) {
        let _ = writeln!(out, "  rejected {}", rejected_line(r));
    }
    let listed = report.rejected.len().min(REJECTED_LISTED) as u64;
    if report.rejected_total > listed {
        let _ = writeln!(
            out,
            "  … and {} more (`kpng status` on the brain lists all)",
            report.rejected_total - listed
        );
    }
    for d in report.dropped.iter().take(REJECTED_LISTED) {
        let _ = writeln!(
            out,
            "  dropped {}: field {}: {} (the rest of the object is used)",
            d.object, d.field, d.message
        );
    }
    let listed = report.dropped.len().min(REJECTED_LISTED) as u64;
    if report.dropped_total > listed {
        let _ = writeln!(
            out,
            "  … and {} more dropped (`kpng status` on the brain lists all)",
            report.dropped_total - listed
        );
    }
}

/// How often kpng put back what someone else changed, and the last time.
fn write_repairs(out: &mut String, r: &RepairStatus) {
    use std::fmt::Write as _;
    // None made yet: the first change by someone else is still waiting for its repair.
    if r.count > 0 {
        let _ = writeln!(
            out,
            "repaired {} after changes by someone else; the last at {} ({})",
            match r.count {
                1 => "once".to_string(),
                n => format!("{n} times"),
            },
            r.last_at,
            r.last_change
        );
    }
    if let Some(unrepaired) = &r.unrepaired {
        let _ = writeln!(out, "PROBLEM: {unrepaired}");
    }
    if let Some(problem) = &r.problem {
        let _ = writeln!(out, "PROBLEM: {problem}");
    }
}

/// One `PROBLEM:` line per node name that several connected kpngs claim, with their
/// addresses: each of them gets that node's view, so at most one programs the right host.
fn write_duplicate_nodes(out: &mut String, duplicates: &[kpng_api::hub::DuplicateNode]) {
    use std::fmt::Write as _;
    for d in duplicates {
        let _ = writeln!(
            out,
            "PROBLEM: {} kpngs claim node {}: connections from {} (a copied DaemonSet or a \
             wrong --hostname-override/--node-name: each gets that node's view, so one \
             programs its host with another node's local endpoints)",
            d.peers.len(),
            d.node,
            d.peers.join(" and "),
        );
    }
}

/// Under this many days to its expiry, the served certificate is a problem: a renewal that
/// should have happened (cert-manager renews with a third of the lifetime left) did not reach
/// the brain.
const CERTIFICATE_WARN_DAYS: i64 = 7;

/// The certificate a brain serves: its expiry in one line, a PROBLEM when it is near or past,
/// or when its files changed and could not be taken.
fn write_tls(out: &mut String, tls: &kpng_api::metrics::TlsStatus, now: std::time::SystemTime) {
    use std::fmt::Write as _;
    let now = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let left = tls.not_after_unix.saturating_sub(now);
    let days = left / 86_400;
    let when = if left < 0 {
        format!(
            "EXPIRED {} ago",
            plural(usize::try_from(-days).unwrap_or(0), "day")
        )
    } else {
        format!("in {}", plural(usize::try_from(days).unwrap_or(0), "day"))
    };
    let problem = if left < CERTIFICATE_WARN_DAYS * 86_400 {
        "PROBLEM: "
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "{problem}TLS certificate {} ({}) expires {} ({when}); its files are reloaded when they \
         change",
        tls.file, tls.subject, tls.not_after
    );
    if let Some(failure) = &tls.reload_failure {
        let _ = writeln!(
            out,
            "PROBLEM: the TLS files changed but cannot be used, the previous certificate \
             is still served: {failure}"
        );
    }
}

/// A brain's connected nodes, the most behind first (the longest lag, then the most pending
/// changes, then by name): on a large cluster the table shows the first
/// [`BRAIN_NODES_LISTED`] and counts the rest, `-o wide` shows all.
fn write_brain_nodes(
    out: &mut String,
    nodes: &[kpng_api::hub::WatcherStatus],
    brain_version: Option<&str>,
    wide: bool,
) {
    use std::fmt::Write as _;
    // A node of another build than the brain's: a rollout in progress, or one left behind.
    let other_build = |n: &kpng_api::hub::WatcherStatus| {
        brain_version.is_some_and(|b| n.version.as_deref() != Some(b))
    };
    if let Some(ours) = brain_version
        && nodes.iter().any(other_build)
    {
        let mut builds: std::collections::BTreeMap<&str, usize> = Default::default();
        for n in nodes {
            *builds
                .entry(n.version.as_deref().unwrap_or("-"))
                .or_default() += 1;
        }
        let counts: Vec<String> = builds.iter().map(|(v, n)| format!("{n} on {v}")).collect();
        let _ = writeln!(
            out,
            "builds: this brain runs {ours}; its nodes: {} (a rollout in progress? `!` marks \
             the nodes of another build)",
            counts.join(", ")
        );
    }
    let version_of = |n: &kpng_api::hub::WatcherStatus| {
        let v = n.version.as_deref().unwrap_or("-");
        if other_build(n) {
            format!("{v}!")
        } else {
            v.to_string()
        }
    };
    let width = nodes
        .iter()
        .map(|n| version_of(n).chars().count())
        .max()
        .unwrap_or(0)
        .max(10);
    let mut order: Vec<&kpng_api::hub::WatcherStatus> = nodes.iter().collect();
    order.sort_by(|a, b| {
        b.lag_seconds
            .total_cmp(&a.lag_seconds)
            .then(b.pending_service_changes.cmp(&a.pending_service_changes))
            .then(a.node.cmp(&b.node))
    });
    let shown = if wide {
        order.len()
    } else {
        order.len().min(BRAIN_NODES_LISTED)
    };
    let _ = writeln!(
        out,
        "{:<24} {:<26} {:>9} {:<26} {:>8} {:>8}  {:<width$}  PEER",
        "NODE", "CONNECTED", "SENT*", "LAST SENT*", "PENDING", "LAG*", "VERSION"
    );
    for n in &order[..shown] {
        let _ = writeln!(
            out,
            "{:<24} {:<26} {:>9} {:<26} {:>8} {:>7.1}s  {:<width$}  {}",
            n.node,
            n.connected_at,
            n.change_sets_sent,
            n.last_sent_at.as_deref().unwrap_or("-"),
            n.pending_service_changes,
            n.lag_seconds,
            version_of(n),
            n.peer.as_deref().unwrap_or("-"),
        );
    }
    if shown < order.len() {
        let _ = writeln!(
            out,
            "… and {} more, none further behind (`-o wide` lists all)",
            order.len() - shown
        );
    }
    if !nodes.is_empty() {
        out.push_str(BRAIN_NODES_NOTE);
    }
}

/// Below a brain's table of nodes: what SENT, LAST SENT and LAG measure. The brain knows what
/// it handed to a node's connection, not what the node applied (the protocol has no
/// acknowledgement from a node that asked once), so a node whose connection stalls or whose
/// sync fails still looks up to date here.
const BRAIN_NODES_NOTE: &str = "* SENT, LAST SENT: change sets handed to the node's connection \
     (HTTP/2), not confirmed as applied: the node's own `kpng status` says what it programmed; \
     LAG: how long the oldest PENDING change has waited to be handed over. VERSION: the \
     node's kpng build, version+git commit (- : KPNG's or before 2026-12-07; ! : another \
     build than this brain's).\n";

/// `1 node`, `2 nodes`.
fn plural(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// The cluster's Nodes no kpng follows the brain for: the first few by name, and how many;
/// each one whose kpng was connected and went away with since when (`disconnected`, at
/// `now`), so a node that flapped a minute ago is told from one gone all day.
fn write_not_connected(
    out: &mut String,
    nodes: &[String],
    disconnected: &[kpng_api::hub::DisconnectedNode],
    now: std::time::SystemTime,
) {
    use std::fmt::Write as _;
    if nodes.is_empty() {
        return;
    }
    let shown = nodes
        .iter()
        .take(NOT_CONNECTED_LISTED)
        .map(|node| match disconnected.iter().find(|d| &d.node == node) {
            Some(d) => {
                let since = std::time::UNIX_EPOCH
                    + std::time::Duration::from_secs(u64::try_from(d.since_unix).unwrap_or(0));
                let ago = now.duration_since(since).unwrap_or_default();
                format!(
                    "{node} (disconnected since {} ({} ago), after {} connected)",
                    d.since,
                    humantime::format_duration(std::time::Duration::from_secs(ago.as_secs())),
                    humantime::format_duration(std::time::Duration::from_secs(
                        d.connected_for_seconds
                    )),
                )
            }
            None => node.clone(),
        })
        .collect::<Vec<_>>();
    let more = nodes.len() - shown.len();
    let _ = writeln!(
        out,
        "not connected: {} without a kpng following this brain (down, cannot reach it, or \
         following another brain behind the same Service): {}{}",
        plural(nodes.len(), "Node"),
        shown.join(", "),
        if more > 0 {
            format!(" … and {more} more (`-o json` lists all)")
        } else {
            String::new()
        }
    );
}

/// The conntrack table's usage: always in the wide view, and unasked when it is nearly full
/// (a full table drops new connections, and nothing else on the node says why), with what to
/// do: kpng's flags where it can set the size, the host's setting where it cannot.
fn write_conntrack(out: &mut String, c: &ConntrackStatus, wide: bool) {
    use std::fmt::Write as _;
    if !wide && !c.nearly_full() {
        return;
    }
    let percent = (c.entries.saturating_mul(100))
        .checked_div(c.max)
        .unwrap_or(0);
    let _ = write!(
        out,
        "conntrack table {percent} % full ({} of {} entries)",
        c.entries, c.max
    );
    if c.nearly_full() {
        let _ = write!(
            out,
            ": when full, the kernel evicts unreplied entries to make room and, when it finds \
             none, drops new connections' packets (dmesg: \"nf_conntrack: table full, dropping \
             packet\"; `conntrack -S`: early_drop, then drop); "
        );
        if c.max_read_only {
            let _ = write!(
                out,
                "kpng cannot raise it: {}; or find what opens so many connections",
                ConntrackStatus::MAX_READ_ONLY
            );
        } else {
            out.push_str(
                "raise --conntrack-max-per-core or --conntrack-min, or find what opens so many \
                 connections",
            );
        }
    }
    out.push('\n');
}

/// The backend's own lines (the eBPF programs and maps): every one in the wide view, and
/// unasked those with a problem.
fn write_data_plane(out: &mut String, lines: &[DataPlaneDetail], wide: bool) {
    use std::fmt::Write as _;
    for d in lines.iter().filter(|d| wide || d.problem.is_some()) {
        let _ = write!(out, "{}: {}", d.what, d.state);
        if let Some(p) = &d.problem {
            let _ = write!(out, "; PROBLEM: {p}");
        }
        out.push('\n');
    }
}

/// Health checks whose server could not start: the Service, its port, since when and why.
fn write_health_checks(out: &mut String, checks: &[HealthCheckStatus]) {
    use std::fmt::Write as _;
    if checks.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "health checks not served: {} (a load balancer probing one sees this node as unhealthy \
         for that Service; retried at every sync)",
        checks.len()
    );
    for c in checks {
        let _ = writeln!(
            out,
            "  {} healthCheckNodePort {}: {} (since {})",
            c.service, c.port, c.message, c.since
        );
    }
}

/// The values the conversion dropped from objects in use, as the log warned about them.
fn write_dropped(out: &mut String, dropped: &[DroppedStatus]) {
    use std::fmt::Write as _;
    if dropped.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "dropped values: {} (the rest of each object is used)",
        dropped.len()
    );
    for d in dropped.iter().take(REJECTED_LISTED) {
        let _ = writeln!(out, "  {}: field {}: {}", d.object, d.field, d.message);
    }
    if dropped.len() > REJECTED_LISTED {
        let _ = writeln!(
            out,
            "  … and {} more (`kpng status -o json` lists all)",
            dropped.len() - REJECTED_LISTED
        );
    }
}

fn write_rejected(out: &mut String, rejected: &[RejectedStatus]) {
    use std::fmt::Write as _;
    if rejected.is_empty() {
        return;
    }
    let _ = writeln!(out, "rejected objects: {}", rejected.len());
    for r in rejected.iter().take(REJECTED_LISTED) {
        let _ = writeln!(out, "  {}", rejected_line(r));
    }
    if rejected.len() > REJECTED_LISTED {
        let _ = writeln!(
            out,
            "  … and {} more (`kpng status -o json` lists all)",
            rejected.len() - REJECTED_LISTED
        );
    }
}

/// One rejected object in words: what, where, why, and what is in use instead.
fn rejected_line(r: &RejectedStatus) -> String {
    let at = r
        .location
        .as_deref()
        .map(|l| format!(" [{l}]"))
        .unwrap_or_default();
    let used = if r.kept {
        "its last good version is in use"
    } else {
        "not in use: no earlier version"
    };
    format!(
        "{}{at}: field {}: {} ({used})",
        r.object, r.field, r.message
    )
}

/// The cells of one Service port's line.
fn row(p: &PortStatus) -> [String; 6] {
    let mut frontends = vec![format!("{}", SocketAddr::new(p.cluster_ip, p.port))];
    if let Some(np) = p.node_port {
        frontends.push(format!("node:{np}"));
    }
    frontends.extend(p.external_ips.iter().map(|ip| format!("ext {ip}")));
    frontends.extend(p.load_balancer_ips.iter().map(|ip| format!("lb {ip}")));
    let policy = crate::status_policy::cell(p);
    let used = p.endpoints.iter().filter(|e| !e.used_by.is_empty()).count();
    // A brain-fed node knows only the endpoints it uses: "0/0" would say there are none.
    let mut endpoints = if p.only_used_known {
        format!("{used} used")
    } else {
        format!("{used}/{} used", p.endpoints.len())
    };
    if let Some(v) = &p.without_endpoints {
        endpoints.push_str(&format!("; {v}"));
    }
    let port = if p.port_name.is_empty() {
        p.protocol.clone()
    } else {
        format!("{}/{}", p.port_name, p.protocol)
    };
    [
        p.service.clone(),
        port,
        p.family.clone(),
        frontends.join(", "),
        policy,
        endpoints,
    ]
}

/// `kpng trace`.
pub fn print_trace(socket: &Path, args: &TraceArgs) -> anyhow::Result<()> {
    let q = parse_trace(
        &args.from,
        &args.to,
        Some(&args.proto),
        args.in_interface.as_deref(),
    )
    .map_err(|e| Classified::error(Failure::Usage, crate::describe(&e)))?;
    let iif = q
        .in_interface
        .as_deref()
        .map(|i| format!("&iif={}", query_escape(i)))
        .unwrap_or_default();
    let body = get(
        socket,
        &format!(
            "/v1/trace?from={}&to={}&proto={}{iif}",
            q.from,
            q.to,
            proto_word(q.protocol)
        ),
        args.timeout,
    )?;
    let mut t: serde_json::Value =
        serde_json::from_str(&body).context("kpng's trace is not JSON")?;
    // No Service frontend matched: exit 5 as a status that matches nothing, after the trace
    // (which says what the node does with the packet: delivered to itself, left alone,
    // dropped as an unallocated Service IP). Until 2026-12-07 such a trace exited 0.
    let no_match = no_frontend_matched(&t).then(|| {
        format!(
            "no Service frontend matches {} {} (the trace above says what this node does with it)",
            proto_word(q.protocol),
            q.to
        )
    });
    if args.output == crate::cli::LogFormat::Json {
        with_schema_version(&mut t);
        if let (Some(message), serde_json::Value::Object(map)) = (&no_match, &mut t) {
            map.insert(
                "error".to_string(),
                crate::exit_codes::error_object(Failure::NoMatch, message),
            );
        }
        print_out(&format!("{}\n", serde_json::to_string_pretty(&t)?))?;
    } else {
        escape_value_controls(&mut t);
        print_out(&terminal_safe(&trace_text(&q, &t)))?;
    }
    match no_match {
        Some(message) => Err(Classified::after_output(Failure::NoMatch, message)),
        None => Ok(()),
    }
}

/// Whether the trace `t` matched no Service frontend (no `service`): `kpng trace` then exits
/// 5 ([`Failure::NoMatch`]).
fn no_frontend_matched(t: &serde_json::Value) -> bool {
    t.get("service").is_none_or(serde_json::Value::is_null)
}

/// Every string of `value` (and every key) with its control characters escaped (`\n`,
/// `\u{1b}`), before the value is laid out as text for a terminal. A value comes from the
/// input (a manifest's name, a brain client's node name); escaped only in the finished text,
/// line by line, a newline inside one would still start a line of its choosing (a forged
/// `PROBLEM:` line in `kpng status`). JSON and YAML output keep the values as they are
/// (their own quoting is exact).
fn escape_value_controls(value: &mut serde_json::Value) {
    use crate::logging::escape_controls;
    match value {
        serde_json::Value::String(s) => {
            if let std::borrow::Cow::Owned(escaped) = escape_controls(s) {
                *s = escaped;
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(escape_value_controls),
        serde_json::Value::Object(map) => {
            if map.keys().any(|k| k.chars().any(char::is_control)) {
                *map = std::mem::take(map)
                    .into_iter()
                    .map(|(k, v)| (escape_controls(&k).into_owned(), v))
                    .collect();
            }
            map.values_mut().for_each(escape_value_controls);
        }
        _ => {}
    }
}

/// `text` for a terminal: its lines as they are, every other control character escaped
/// (`\u{1b}`), so that a value from the input (a manifest's field, a name a brain client
/// sent) cannot rewrite the operator's screen with an escape sequence. The values were
/// escaped before the text was laid out ([`escape_value_controls`]): this is the second net.
fn terminal_safe(text: &str) -> String {
    text.split('\n')
        .map(|line| crate::logging::escape_controls(line).into_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

fn proto_word(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

/// The masquerade line's words: `yes`/`no` as the trace decided, and hairpin as the client
/// meets it. When every endpoint the client can pick is itself (`onlyItself`), it is always
/// masqueraded (hairpin), whatever the non-hairpin decision says; "whenever" only when it may
/// pick another endpoint.
fn masquerade_words(t: &serde_json::Value) -> String {
    if t["translatedAtSocket"] == true {
        let yes_no = if t["masquerade"] == true { "yes" } else { "no" };
        return format!(
            "{yes_no} (translated at the socket: no NAT, the endpoint sees the client's address)"
        );
    }
    if let Some(condition) = socket_condition(t) {
        let rules = match (t["masquerade"] == true, t["hairpin"] == true) {
            (true, _) => "yes",
            (false, true) => "no (and whenever the client picks itself: hairpin)",
            (false, false) => "no",
        };
        return format!(
            "{rules} through the rules; no from a process {condition} (translated at the socket)"
        );
    }
    match (t["masquerade"] == true, t["hairpin"] == true) {
        (_, true) if t["onlyItself"] == true => {
            "yes (hairpin: the client is the only endpoint it can pick, so it always reaches \
             itself, from the node's address)"
                .to_string()
        }
        (true, _) => "yes".to_string(),
        (false, true) => "no (and whenever the client picks itself: hairpin)".to_string(),
        (false, false) => "no".to_string(),
    }
}

/// Which processes' sockets the trace `t` says are translated at the socket when that is not
/// certain: `in cgroup X's subtree` (`atSocketIfInCgroup`), `in kpng's network namespace
/// net:[N]` (`atSocketIfInNetns`: `--socket-lb-host-netns-only` outside the host's), or both.
fn socket_condition(t: &serde_json::Value) -> Option<String> {
    let cgroup = t["atSocketIfInCgroup"]
        .as_str()
        .map(|c| format!("in cgroup {c}'s subtree"));
    let netns = t["atSocketIfInNetns"]
        .as_str()
        .map(|n| format!("in kpng's network namespace {n} (not the host's)"));
    match (cgroup, netns) {
        (Some(c), Some(n)) => Some(format!("{c} and {n}")),
        (c, n) => c.or(n),
    }
}

/// `kpng trace`'s text output for the answer `t` to `q`.
fn trace_text(q: &TraceQuery, t: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let s = |k: &str| t[k].as_str().unwrap_or_default().to_string();
    let _ = writeln!(
        out,
        "{} {} → {}: {}{}",
        proto_word(q.protocol),
        q.from,
        q.to,
        s("verdict").to_uppercase(),
        if t["translatedAtSocket"] == true {
            " (at the socket: connect()/sendmsg(), not per packet)".to_string()
        } else if let Some(condition) = socket_condition(t) {
            format!(
                " (at the socket if the process is {condition}, otherwise per packet through \
                 the rules)"
            )
        } else {
            String::new()
        }
    );
    if let Some(service) = t["service"].as_str() {
        let _ = writeln!(out, "  service:    {service} (via {})", s("frontend"));
    }
    if let Some(list) = t["endpointList"]
        .as_str()
        .filter(|_| t["verdict"] == "dnat")
    {
        let eps: Vec<String> = t["endpoints"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        let _ = writeln!(out, "  endpoints:  {list} list: {}", eps.join(", "));
        let _ = writeln!(out, "  masquerade: {}", masquerade_words(t));
    }
    if let Some(timeout) = t["affinityTimeoutSeconds"].as_u64() {
        let _ = writeln!(out, "  affinity:   ClientIP, {timeout} s");
    }
    let _ = writeln!(out, "  why:        {}", s("reason"));
    if let Some(interface) = t["interface"].as_str() {
        let _ = writeln!(out, "  interface:  {interface}");
    }
    if let Ok(r) = serde_json::from_value::<RejectedStatus>(t["rejected"].clone()) {
        let _ = writeln!(
            out,
            "  note:       the Service's latest version is rejected, so this traces its last good \
             version: {}",
            rejected_line(&r)
        );
    }
    if let Ok(c) = serde_json::from_value::<HealthCheckStatus>(t["healthCheckNotServed"].clone()) {
        let _ = writeln!(
            out,
            "  note:       this node does not serve the Service's health check \
             (healthCheckNodePort {}: {}, since {}): load balancers see it as unhealthy and send \
             this Service's traffic to other nodes",
            c.port, c.message, c.since
        );
    }
    if let Some(held) = t["firstSyncHeld"].as_str() {
        // Says why no packet meets these rules yet, which the in-sync note below does not,
        // and that the answer may change when what is missing arrives (the runner's words).
        let _ = writeln!(out, "  note:       {held}");
    } else if t["inSync"] == false {
        let _ = writeln!(
            out,
            "  note:       changes are waiting for a sync (or the last one failed): this is what \
             kpng is about to program, not yet what the kernel does"
        );
    }
    if let Some(note) = t["inputProblem"].as_str() {
        let _ = writeln!(out, "  note:       {note}");
    }
    if let Some(note) = t["programsNothing"].as_str() {
        let _ = writeln!(out, "  note:       {note}");
    }
    if let Some(ranges) = t["sourceRangesOfOtherFamiliesOnly"]
        .as_array()
        .filter(|a| !a.is_empty())
    {
        let ranges: Vec<&str> = ranges.iter().filter_map(|r| r.as_str()).collect();
        let _ = writeln!(
            out,
            "  note:       every {} source is let in: the Service's loadBalancerSourceRanges \
             ({}) name no range of this family, and apply per family (as in kube-proxy)",
            kpng_model::Family::of(&q.to.ip()),
            ranges.join(", ")
        );
    }
    if let Some(chains) = t["otherChains"].as_array().filter(|a| !a.is_empty()) {
        // kpng's model only: another table's chain may decide first.
        let chains: Vec<&str> = chains.iter().filter_map(|c| c.as_str()).collect();
        let _ = writeln!(
            out,
            "  note:       this follows kpng's rules only; other tables' chains on its hooks see \
             the packet before kpng's, drop what they do not accept, or hold rules that may drop \
             it: {}",
            chains.join("; ")
        );
    }
    if let Some(command) = t["brainExplains"].as_str() {
        // As `kpng status` says it of such a port (`write_brain_hint`).
        let _ = writeln!(
            out,
            "  hint:       this node receives only the endpoints it uses; `{command}` on the \
             brain explains the endpoints this node does not receive"
        );
    }
    out
}

/// `--nodeport-addresses` as the backend reads it, in the flag's own words, for a trace that
/// explains why a node port is not served on an address.
fn nodeport_setting(nodeport: &kpng_backend::settings::NodePortAddresses) -> String {
    use kpng_backend::settings::NodePortAddresses;
    match nodeport {
        NodePortAddresses::Primary => "primary".to_string(),
        NodePortAddresses::AllLocal => "unset: every local address but loopback".to_string(),
        NodePortAddresses::Cidrs(cidrs) => cidrs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
    }
}

/// Whether IPv4 node ports are served on 127.0.0.1 (iptables mode's
/// `--iptables-localhost-nodeports`, which needs `net.ipv4.conf.all.route_localnet=1`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub enum LocalhostV4 {
    /// Not asked (another backend, or the flag off).
    Off,
    /// Asked and served (where the IPv4 scope takes loopback).
    Served,
    /// Asked, but `route_localnet` could not be set: not served, and why (until 2026-12-07
    /// `kpng status` and `kpng trace` claimed 127.0.0.1 all the same).
    Failed(String),
}

/// Where NodePorts are served, in words: per family the addresses `--nodeport-addresses`
/// selects on this node (`every local IPv6 address` for a family served on all, as a
/// `primary` family the Node lists no IP of), then the flag; and 127.0.0.1 when
/// `localhost_v4` (iptables mode's `--iptables-localhost-nodeports`) applies to the IPv4
/// scope ([`kpng_backend::settings::NodePortScope::takes_ipv4_localhost`]), as the backend
/// then serves node ports there too (until 2026-12-07 the line said "but loopback" then);
/// when `route_localnet` could not be set, that 127.0.0.1 is not, and why.
fn node_ports_on(
    nodeport: &kpng_backend::settings::NodePortAddresses,
    snapshot: &kpng_model::Snapshot,
    host: &[IpAddr],
    localhost_v4: &LocalhostV4,
) -> String {
    use kpng_model::Family;
    let words = node_ports_on_without_localhost(nodeport, snapshot, host);
    let takes = nodeport
        .scope_on(Family::V4, &snapshot.node)
        .takes_ipv4_localhost();
    match localhost_v4 {
        LocalhostV4::Served if takes => {
            format!("{words} and 127.0.0.1 (--iptables-localhost-nodeports)")
        }
        LocalhostV4::Failed(why) if takes => format!(
            "{words}; not 127.0.0.1, although --iptables-localhost-nodeports asks for it: {why}"
        ),
        _ => words,
    }
}

/// [`node_ports_on`] without 127.0.0.1: the addresses `--nodeport-addresses` selects.
fn node_ports_on_without_localhost(
    nodeport: &kpng_backend::settings::NodePortAddresses,
    snapshot: &kpng_model::Snapshot,
    host: &[IpAddr],
) -> String {
    use kpng_backend::settings::{NodePortAddresses, NodePortScope};
    use kpng_model::Family;
    let scopes = Family::ALL.map(|family| (family, nodeport.scope_on(family, &snapshot.node)));
    if scopes
        .iter()
        .all(|(_, scope)| matches!(scope, NodePortScope::AllLocal))
    {
        let why = match nodeport {
            NodePortAddresses::AllLocal => "unset".to_string(),
            NodePortAddresses::Primary => "primary, and no node IP".to_string(),
            NodePortAddresses::Cidrs(_) => nodeport_setting(nodeport),
        };
        return format!("every local address but loopback (--nodeport-addresses {why})");
    }
    let parts: Vec<String> = scopes
        .iter()
        .map(|(family, scope)| match scope {
            NodePortScope::AllLocal => format!("every local {family} address"),
            scope => {
                let ips: Vec<String> = scope
                    .addresses(*family, &snapshot.node.ips, || host.to_vec())
                    .iter()
                    .filter(|ip| !ip.is_loopback())
                    .map(ToString::to_string)
                    .collect();
                if ips.is_empty() {
                    format!("no {family} address")
                } else {
                    ips.join(", ")
                }
            }
        })
        .collect();
    format!(
        "{} (--nodeport-addresses {})",
        parts.join(", "),
        nodeport_setting(nodeport)
    )
}

/// The trace facts of a node, from the flags and the current snapshot. `localhost_v4`:
/// iptables mode with `--iptables-localhost-nodeports`, which also serves IPv4 node ports on
/// 127.0.0.1 (route_localnet) where the IPv4 scope takes loopback, unless the sysctl could
/// not be set.
pub fn node_facts(
    snapshot: &kpng_model::Snapshot,
    nodeport: &kpng_backend::settings::NodePortAddresses,
    detect: &kpng_backend::settings::DetectLocal,
    masquerade_all: bool,
    kind: Option<crate::backends::BackendKind>,
    service_cidrs: &[ipnet::IpNet],
    localhost_v4: &LocalhostV4,
) -> NodeFacts {
    use kpng_backend::settings::DetectLocal;
    use kpng_model::Family;
    use kpng_model::trace::{InterfaceRule, LocalPods, LocalSockets};
    #[cfg(target_os = "linux")]
    let host = kpng_backend::host::local_addresses();
    // Elsewhere (Windows) the node's own addresses stand for the host's: HNS serves node
    // ports on every node address.
    #[cfg(not(target_os = "linux"))]
    let host: Vec<IpAddr> = snapshot.node.ips.clone();
    let mut nodeport_ips = Vec::new();
    for family in [Family::V4, Family::V6] {
        nodeport_ips.extend(nodeport.scope_on(family, &snapshot.node).addresses(
            family,
            &snapshot.node.ips,
            || host.clone(),
        ));
    }
    // Loopback never reaches a node port by this route: a DNAT from it to a pod is a martian
    // (but iptables mode's 127.0.0.1, with route_localnet).
    nodeport_ips.retain(|ip| !ip.is_loopback());
    let takes_localhost = nodeport
        .scope_on(Family::V4, &snapshot.node)
        .takes_ipv4_localhost();
    if *localhost_v4 == LocalhostV4::Served && takes_localhost {
        nodeport_ips.push(IpAddr::from([127, 0, 0, 1]));
    }
    let localhost_not_served = match localhost_v4 {
        LocalhostV4::Failed(why) if takes_localhost => Some(why.clone()),
        _ => None,
    };
    // A sink that programs no node (to-file, a brain's view) serves no node port.
    let node_ports_on = match kind {
        Some(_) => node_ports_on(nodeport, snapshot, &host, localhost_v4),
        None => String::new(),
    };
    let node_ips_not_on_host: Vec<IpAddr> = snapshot
        .node
        .ips
        .iter()
        .copied()
        .filter(|ip| !host.contains(ip))
        .collect();
    // Where the Service health checks listen: the servers' own choice (a sink that programs
    // no node serves none, and says nothing).
    let health_check_ips = kind.map(|kind| {
        kind.health_check_addresses_of(Some(nodeport)).listening_on(
            &Family::ALL,
            &snapshot.node,
            || host.clone(),
        )
    });
    let mut local_ips = host.clone();
    local_ips.extend(snapshot.node.ips.iter().copied());
    local_ips.sort();
    local_ips.dedup();
    NodeFacts {
        local_ips,
        nodeport_ips,
        node_ips_not_on_host,
        node_ports_on,
        nodeport_setting: nodeport_setting(nodeport),
        service_cidrs: service_cidrs.to_vec(),
        local_pods: match detect {
            DetectLocal::None => LocalPods::None,
            DetectLocal::ClusterCidr(c) => LocalPods::Cidrs(c.clone()),
            DetectLocal::NodeCidr => LocalPods::NodeCidrs(snapshot.node.pod_cidrs.clone()),
            DetectLocal::BridgeInterface(b) => LocalPods::Interface {
                rule: InterfaceRule::Bridge(b.clone()),
                assumed: snapshot.node.pod_cidrs.clone(),
            },
            DetectLocal::InterfaceNamePrefix(p) => LocalPods::Interface {
                rule: InterfaceRule::Prefix(p.clone()),
                assumed: snapshot.node.pod_cidrs.clone(),
            },
        },
        masquerade_all,
        backend: backend_traits(kind),
        // The eBPF backend's settings, set by the caller that knows them.
        local_sockets: LocalSockets::default(),
        localhost_not_served,
        health_check_ips,
    }
}

/// How the backend's data plane differs from kube-proxy's nftables mode, for `kpng trace`:
/// one arm per backend, so that a new backend must say how it differs (no backend, `None`,
/// traces as nftables mode).
fn backend_traits(kind: Option<crate::backends::BackendKind>) -> kpng_model::trace::BackendTraits {
    use crate::backends::BackendKind;
    use kpng_model::trace::BackendTraits;
    let nftables = BackendTraits {
        rejects_unknown_ports: true,
        proxies_connections: false,
        translates_local_sockets: false,
        enforces_source_ranges: true,
        rejects_without_endpoints: true,
        external_ips_before_load_balancers: false,
        accepts_masqueraded_in_forward: false,
    };
    let Some(kind) = kind else {
        return nftables;
    };
    match kind {
        BackendKind::Nft => nftables,
        BackendKind::Iptables => BackendTraits {
            rejects_unknown_ports: false,
            external_ips_before_load_balancers: true,
            accepts_masqueraded_in_forward: true,
            ..nftables
        },
        BackendKind::Userspace => BackendTraits {
            proxies_connections: true,
            ..nftables
        },
        BackendKind::Ebpf => BackendTraits {
            translates_local_sockets: true,
            ..nftables
        },
        BackendKind::Hns => BackendTraits {
            // HNS leaves a Service IP's other ports alone, as iptables mode does.
            rejects_unknown_ports: false,
            enforces_source_ranges: false,
            // HNS gets no load balancer for a Service without endpoints (winkernel's "not
            // applying any policy"): nothing answers, nothing rejects.
            rejects_without_endpoints: false,
            ..nftables
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `kpng status`'s "node ports on:" words for each `--nodeport-addresses` mode: the
    /// addresses per family, "every local … address" where a family is served on all, and the
    /// flag that decided it.
    #[test]
    fn node_ports_on_names_the_addresses_and_the_flag() {
        use kpng_backend::settings::NodePortAddresses;
        let ip = |s: &str| -> std::net::IpAddr { s.parse().expect("ip") };
        let host = [
            ip("127.0.0.1"),
            ip("192.168.100.1"),
            ip("10.244.1.1"),
            ip("::1"),
            ip("2001:db8:1::20"),
            ip("fd00:100::1"),
        ];
        let snapshot = |ips: &[&str], all_local: bool| {
            let mut s = kpng_model::Snapshot::default();
            s.node.ips = ips.iter().map(|i| ip(i)).collect();
            s.node.nodeports_on_all_local = all_local;
            s
        };
        let cidrs = |l: &[&str]| {
            NodePortAddresses::Cidrs(l.iter().map(|c| c.parse().expect("cidr")).collect())
        };
        for (what, setting, node, want) in [
            (
                "primary",
                NodePortAddresses::Primary,
                snapshot(&["192.168.100.1", "fd00:100::1"], false),
                "192.168.100.1, fd00:100::1 (--nodeport-addresses primary)",
            ),
            (
                "primary, an IPv6-only Node",
                NodePortAddresses::Primary,
                snapshot(&["fd00:100::1"], false),
                "every local IPv4 address, fd00:100::1 (--nodeport-addresses primary)",
            ),
            (
                "primary, no node IP after the wait",
                NodePortAddresses::Primary,
                snapshot(&[], true),
                "every local address but loopback (--nodeport-addresses primary, and no node IP)",
            ),
            (
                "unset (iptables)",
                NodePortAddresses::AllLocal,
                snapshot(&["192.168.100.1"], false),
                "every local address but loopback (--nodeport-addresses unset)",
            ),
            (
                "an IPv6 CIDR",
                cidrs(&["2001:db8:1::/64"]),
                snapshot(&["fd00:100::1"], false),
                "every local IPv4 address, 2001:db8:1::20 (--nodeport-addresses 2001:db8:1::/64)",
            ),
            (
                "CIDRs one family matches nothing of",
                cidrs(&["10.0.0.0/8", "2001:db8:9::/64"]),
                snapshot(&["192.168.100.1"], false),
                "10.244.1.1, no IPv6 address (--nodeport-addresses 10.0.0.0/8,2001:db8:9::/64)",
            ),
        ] {
            assert_eq!(
                super::node_ports_on(&setting, &node, &host, &super::LocalhostV4::Off),
                want,
                "{what}"
            );
        }
        // iptables mode's --iptables-localhost-nodeports: 127.0.0.1 too, where the IPv4 scope
        // takes loopback (every local address, or a CIDR holding 127.0.0.1), never with
        // primary (as the backend, which adds no rule for it then).
        let with_ips = snapshot(&["192.168.100.1"], false);
        for (what, setting, want) in [
            (
                "unset",
                NodePortAddresses::AllLocal,
                "every local address but loopback (--nodeport-addresses unset) and 127.0.0.1 \
                 (--iptables-localhost-nodeports)",
            ),
            (
                "a CIDR holding 127.0.0.1",
                cidrs(&["192.168.0.0/16", "127.0.0.0/8", "fd00::/8"]),
                "192.168.100.1, fd00:100::1 (--nodeport-addresses \
                 192.168.0.0/16,127.0.0.0/8,fd00::/8) and 127.0.0.1 \
                 (--iptables-localhost-nodeports)",
            ),
            (
                "primary",
                NodePortAddresses::Primary,
                "192.168.100.1, every local IPv6 address (--nodeport-addresses primary)",
            ),
            (
                "CIDRs without loopback",
                cidrs(&["192.168.0.0/16"]),
                "192.168.100.1, every local IPv6 address (--nodeport-addresses 192.168.0.0/16)",
            ),
        ] {
            assert_eq!(
                super::node_ports_on(&setting, &with_ips, &host, &super::LocalhostV4::Served),
                want,
                "{what}"
            );
        }
    }

    /// `kpng trace` to 127.0.0.1:NODEPORT is served in iptables mode with
    /// --iptables-localhost-nodeports where the backend serves it (node ports on every local
    /// address), not with `primary`, where it adds no rule for it (the trace said it was), nor
    /// when `route_localnet` could not be set: then the status line and the trace say why
    /// (until 2026-12-07 both claimed 127.0.0.1).
    #[test]
    fn localhost_node_ports_are_traced_where_the_backend_serves_them() {
        use crate::backends::BackendKind;
        use kpng_backend::settings::{DetectLocal, NodePortAddresses};
        let mut snapshot = kpng_model::Snapshot::default();
        snapshot.node.ips = vec!["192.168.100.1".parse().expect("ip")];
        let localhost: IpAddr = "127.0.0.1".parse().expect("ip");
        let failed = LocalhostV4::Failed("read-only /proc/sys".into());
        for (setting, localhost_v4, want, not_served) in [
            (NodePortAddresses::AllLocal, LocalhostV4::Served, true, None),
            (NodePortAddresses::AllLocal, LocalhostV4::Off, false, None),
            (NodePortAddresses::Primary, LocalhostV4::Served, false, None),
            (
                NodePortAddresses::AllLocal,
                failed.clone(),
                false,
                Some("read-only /proc/sys"),
            ),
            // Not asked of this scope: nothing to say about it.
            (NodePortAddresses::Primary, failed.clone(), false, None),
        ] {
            let facts = node_facts(
                &snapshot,
                &setting,
                &DetectLocal::None,
                false,
                Some(BackendKind::Iptables),
                &[],
                &localhost_v4,
            );
            assert_eq!(
                facts.nodeport_ips.contains(&localhost),
                want,
                "{setting:?} {localhost_v4:?}: {:?}",
                facts.nodeport_ips
            );
            assert_eq!(
                facts
                    .node_ports_on
                    .ends_with(" and 127.0.0.1 (--iptables-localhost-nodeports)"),
                want,
                "{}",
                facts.node_ports_on
            );
            assert_eq!(
                facts.localhost_not_served.as_deref(),
                not_served,
                "{setting:?} {localhost_v4:?}"
            );
            assert_eq!(
                facts.node_ports_on.contains(
                    "; not 127.0.0.1, although --iptables-localhost-nodeports asks for it: \
                     read-only /proc/sys"
                ),
                not_served.is_some(),
                "{}",
                facts.node_ports_on
            );
        }
    }

    /// `kpng trace` learns where the Service health checks listen, by the servers' own rule:
    /// the node-port addresses of a family `--nodeport-addresses` restricts (loopback too when
    /// a CIDR holds it), the wildcard of one it does not, nowhere while the node IPs are
    /// unknown; a sink that serves none says nothing.
    #[test]
    fn the_trace_knows_where_the_health_checks_listen() {
        use crate::backends::BackendKind;
        use kpng_backend::settings::{DetectLocal, NodePortAddresses};
        let ips =
            |l: &[&str]| -> Vec<IpAddr> { l.iter().map(|i| i.parse().expect("ip")).collect() };
        let cidrs = |l: &[&str]| {
            NodePortAddresses::Cidrs(l.iter().map(|c| c.parse().expect("cidr")).collect())
        };
        let node_ip = ["192.168.100.1"];
        // (what, node IPs, setting, backend, listen addresses wanted)
        type Case<'a> = (
            &'a str,
            &'a [&'a str],
            NodePortAddresses,
            Option<BackendKind>,
            Option<&'a [&'a str]>,
        );
        let cases: [Case; 6] = [
            (
                "nft, an IPv4 CIDR holding loopback",
                &node_ip,
                cidrs(&["127.0.0.0/8"]),
                Some(BackendKind::Nft),
                Some(&["127.0.0.1", "::"]),
            ),
            (
                "nft, primary, an IPv4 node IP only",
                &node_ip,
                NodePortAddresses::Primary,
                Some(BackendKind::Nft),
                Some(&["192.168.100.1", "::"]),
            ),
            (
                "nft, primary, no node IP yet",
                &[],
                NodePortAddresses::Primary,
                Some(BackendKind::Nft),
                Some(&[]),
            ),
            (
                "iptables, every address",
                &node_ip,
                NodePortAddresses::AllLocal,
                Some(BackendKind::Iptables),
                Some(&["0.0.0.0", "::"]),
            ),
            (
                "Windows: every address",
                &node_ip,
                NodePortAddresses::Primary,
                Some(BackendKind::Hns),
                Some(&["0.0.0.0", "::"]),
            ),
            ("a sink", &node_ip, NodePortAddresses::Primary, None, None),
        ];
        for (what, node_ips, setting, kind, want) in cases {
            let mut snapshot = kpng_model::Snapshot::default();
            snapshot.node.ips = ips(node_ips);
            let facts = node_facts(
                &snapshot,
                &setting,
                &DetectLocal::None,
                false,
                kind,
                &[],
                &LocalhostV4::Off,
            );
            assert_eq!(facts.health_check_ips, want.map(ips), "{what}");
        }
    }

    /// The traits per backend, as they were written before one arm per backend (a
    /// `matches!` list then): unchanged.
    #[test]
    fn each_backend_traces_with_its_own_traits() {
        use crate::backends::BackendKind;
        let kinds = BackendKind::ALL.map(Some);
        for kind in kinds.iter().copied().chain([None]) {
            let t = backend_traits(kind);
            let got = [
                t.rejects_unknown_ports,
                t.proxies_connections,
                t.translates_local_sockets,
                t.enforces_source_ranges,
                t.rejects_without_endpoints,
                t.external_ips_before_load_balancers,
                t.accepts_masqueraded_in_forward,
            ];
            let want = [
                !matches!(kind, Some(BackendKind::Iptables | BackendKind::Hns)),
                kind == Some(BackendKind::Userspace),
                kind == Some(BackendKind::Ebpf),
                kind != Some(BackendKind::Hns),
                kind != Some(BackendKind::Hns),
                kind == Some(BackendKind::Iptables),
                kind == Some(BackendKind::Iptables),
            ];
            assert_eq!(got, want, "{kind:?}");
        }
    }

    /// A brain asked for a node it has no Node object of says so, with the Node names it
    /// knows (the nearest when there are many) and the connected ones.
    #[test]
    fn a_brain_names_the_nodes_it_knows_when_asked_for_another() {
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let many: Vec<String> = (0..30).map(|i| format!("worker-{i:02}")).collect();
        // (node asked for, known, connected, deleted, synced, words said, words not said)
        type Case<'a> = (
            &'a str,
            Vec<String>,
            Vec<String>,
            bool,
            bool,
            &'a [&'a str],
            &'a [&'a str],
        );
        let cases: Vec<Case> = vec![
            (
                "node9",
                names(&["node1", "node2"]),
                names(&["node2"]),
                false,
                true,
                &[
                    "the brain has no Node object named \"node9\" (a typo",
                    "its Nodes: node1, node2",
                    "connected kpngs watch as: node2",
                ],
                &["is connected, and gets no local endpoint"],
            ),
            (
                "node9",
                names(&["node1"]),
                names(&["node1", "node9"]),
                false,
                true,
                &["a kpng watching as \"node9\" is connected, and gets no local endpoint"],
                &[],
            ),
            (
                "worker-7",
                many.clone(),
                Vec::new(),
                false,
                true,
                &[
                    "the 10 nearest of its 30 Nodes: worker-07, ",
                    "no kpng is connected",
                ],
                &["worker-29"],
            ),
            (
                "old",
                names(&["node1"]),
                Vec::new(),
                true,
                true,
                &["no Node object named \"old\" now: it was deleted"],
                &[],
            ),
            (
                "node1",
                Vec::new(),
                Vec::new(),
                false,
                false,
                &["yet: it is still listing its input", "it knows no Node"],
                &[],
            ),
        ];
        for (node, known, connected, deleted, synced, want, not) in cases {
            let said = no_such_node(node, &known, &connected, deleted, synced);
            for w in want {
                assert!(said.contains(w), "{node}: {said:?} lacks {w:?}");
            }
            for w in not {
                assert!(!said.contains(w), "{node}: {said:?} has {w:?}");
            }
        }
    }

    #[test]
    fn a_brains_certificate_says_when_it_expires() {
        let at = |unix: u64| std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix);
        let not_after = 1_893_456_000;
        let status = |failure: Option<&str>| kpng_api::metrics::TlsStatus {
            file: "/etc/kpng/tls.crt".into(),
            subject: "CN=brain".into(),
            not_after: "2030-01-01T00:00:00Z".into(),
            not_after_unix: not_after,
            reload_failure: failure.map(String::from),
        };
        let day = 86_400;
        /// What, the clock, the reload failure, words the lines hold and words they do not.
        type Case<'a> = (&'a str, u64, Option<&'a str>, &'a [&'a str], &'a [&'a str]);
        let cases: &[Case] = &[
            (
                "far",
                1_893_456_000 - 60 * day,
                None,
                &[
                    "expires 2030-01-01T00:00:00Z (in 60 days)",
                    "/etc/kpng/tls.crt",
                    "CN=brain",
                ],
                &["PROBLEM"],
            ),
            (
                "near",
                1_893_456_000 - 3 * day,
                None,
                &["PROBLEM: TLS certificate", "(in 3 days)"],
                &[],
            ),
            (
                "past",
                1_893_456_000 + 2 * day,
                None,
                &["PROBLEM: TLS certificate", "EXPIRED 2 days ago"],
                &[],
            ),
            (
                "bad files",
                1_893_456_000 - 60 * day,
                Some("reading /etc/kpng/tls.key: gone"),
                &[
                    "(in 60 days)",
                    "PROBLEM: the TLS files changed",
                    "tls.key: gone",
                ],
                &[],
            ),
        ];
        for (what, now, failure, want, not) in cases {
            let mut out = String::new();
            write_tls(&mut out, &status(*failure), at(*now));
            for w in *want {
                assert!(out.contains(w), "{what}: {out:?} lacks {w:?}");
            }
            for n in *not {
                assert!(!out.contains(n), "{what}: {out:?} has {n:?}");
            }
            assert!(!out.contains("  "), "{what}: {out:?}");
        }
    }

    #[test]
    fn trace_requests_are_checked() {
        assert!(parse_trace("10.0.0.1", "10.96.0.1:80", None, None).is_ok());
        assert!(parse_trace("fd00::1", "[fd00:96::1]:80", Some("UDP"), None).is_ok());
        // A bracketed IPv6 source, as in --to; IPv4-mapped addresses are IPv4.
        for (from, to, want_from, want_to) in [
            (
                "[fd00:244:1::2]",
                "[fd00:96::10]:80",
                "fd00:244:1::2",
                "[fd00:96::10]:80",
            ),
            (
                "192.168.100.10",
                "[::ffff:10.96.0.20]:80",
                "192.168.100.10",
                "10.96.0.20:80",
            ),
            (
                "[::ffff:192.168.100.10]",
                "10.96.0.20:80",
                "192.168.100.10",
                "10.96.0.20:80",
            ),
            (
                "::ffff:192.168.100.10",
                "[::ffff:10.96.0.20]:80",
                "192.168.100.10",
                "10.96.0.20:80",
            ),
        ] {
            let q = parse_trace(from, to, None, None).expect(from);
            assert_eq!(q.from.to_string(), want_from, "{from}");
            assert_eq!(q.to.to_string(), want_to, "{to}");
        }
        for (from, to, proto, says) in [
            ("x", "10.96.0.1:80", None, "--from \"x\" is not an IP"),
            ("[10.0.0.1", "10.96.0.1:80", None, "is not an IP"),
            ("10.0.0.1", "10.96.0.1", None, "is not IP:PORT"),
            ("10.0.0.1", "10.96.0.1:80", Some("icmp"), "tcp, udp or sctp"),
            ("fd00::1", "10.96.0.1:80", None, "different IP families"),
        ] {
            let e = parse_trace(from, to, proto, None).expect_err(says);
            assert!(format!("{e:#}").contains(says), "{e:#}");
        }
    }

    /// While the first sync is held, the trace says so, why, and that the answer may change
    /// when what is missing arrives, instead of the generic "waiting for a sync" note; never
    /// that it is what kpng will program (in NodeCIDR mode the podCIDRs can turn
    /// `masquerade: no` into `yes`).
    #[test]
    fn a_trace_says_when_the_first_sync_is_held() {
        let q = parse_trace("10.244.1.5", "10.96.0.10:80", None, None).expect("query");
        let cases = [
            "nothing is programmed yet: the first sync is held until Node \"n\" has \
             spec.podCIDRs (--detect-local-mode NodeCIDR; kube-proxy waits for them too); this \
             answer is from what kpng knows now and may change when they arrive (which clients \
             are local to this node, hence masqueraded, follows them)",
            "nothing is programmed yet: the first sync is held until the brain's first state \
             arrives; this answer is from what kpng knows now and may change when it does",
        ];
        for held in cases {
            let t = serde_json::json!({
                "verdict": "dnat",
                "reason": "r",
                "inSync": false,
                "firstSyncHeld": held,
            });
            let text = trace_text(&q, &t);
            assert!(text.contains(&format!("  note:       {held}\n")), "{text}");
            assert!(!text.contains("waiting for a sync"), "{text}");
            assert!(!text.contains("will program"), "{text}");
        }
    }

    /// The masquerade line agrees with the JSON's `masquerade` and `hairpin`: a client whose
    /// only endpoint is itself is always masqueraded (hairpin); "whenever" is for a client
    /// that may pick another endpoint.
    #[test]
    fn the_masquerade_line_says_when_hairpin_is_certain() {
        let q = parse_trace("10.244.1.5", "10.96.0.10:80", None, None).expect("query");
        for (what, masquerade, hairpin, only_itself, endpoints, says) in [
            (
                "only itself",
                false,
                true,
                true,
                &["10.244.1.5:8080"][..],
                "masquerade: yes (hairpin: the client is the only endpoint",
            ),
            (
                "itself among others",
                false,
                true,
                false,
                &["10.244.1.5:8080", "10.244.2.5:8080"][..],
                "masquerade: no (and whenever the client picks itself: hairpin)",
            ),
            (
                "not itself",
                false,
                false,
                false,
                &["10.244.2.5:8080"][..],
                "masquerade: no\n",
            ),
            (
                "masqueraded anyway",
                true,
                false,
                false,
                &["10.244.2.5:8080"][..],
                "masquerade: yes\n",
            ),
        ] {
            let t = serde_json::json!({
                "verdict": "dnat",
                "service": "ns/web:http",
                "frontend": "clusterIP",
                "endpointList": "cluster",
                "endpoints": endpoints,
                "masquerade": masquerade,
                "hairpin": hairpin,
                "onlyItself": only_itself,
                "reason": "r",
                "inSync": true,
            });
            let text = trace_text(&q, &t);
            assert!(text.contains(says), "{what}: {text}");
        }
    }

    /// `--socket-lb-host-netns-only` outside the host's network namespace: the text says the
    /// socket path holds for kpng's namespace only, as the status's PROBLEM says, with the
    /// rules' answer for the others (a cgroup subtree is said alike, and both together).
    #[test]
    fn a_socket_path_for_some_processes_only_is_said_with_its_condition() {
        let q = parse_trace("172.18.0.2", "10.96.0.10:80", None, None).expect("query");
        for (cgroup, netns, says) in [
            (
                None,
                Some("net:[8]"),
                "(at the socket if the process is in kpng's network namespace net:[8] (not the \
                 host's), otherwise per packet through the rules)",
            ),
            (
                Some("/sys/fs/cgroup/a"),
                None,
                "(at the socket if the process is in cgroup /sys/fs/cgroup/a's subtree, \
                 otherwise per packet through the rules)",
            ),
            (
                Some("/sys/fs/cgroup/a"),
                Some("net:[8]"),
                "no from a process in cgroup /sys/fs/cgroup/a's subtree and in kpng's network \
                 namespace net:[8] (not the host's) (translated at the socket)",
            ),
        ] {
            let t = serde_json::json!({
                "verdict": "dnat",
                "service": "ns/web:http",
                "frontend": "clusterIP",
                "endpointList": "cluster",
                "endpoints": ["10.244.2.5:8080"],
                "masquerade": true,
                "hairpin": false,
                "atSocketIfInCgroup": cgroup,
                "atSocketIfInNetns": netns,
                "reason": "r",
                "inSync": true,
            });
            let text = trace_text(&q, &t);
            assert!(text.contains(says), "{text}");
            assert!(!no_frontend_matched(&t));
        }
        assert!(no_frontend_matched(
            &serde_json::json!({"verdict": "none", "reason": "r"})
        ));
    }

    /// An endpoint several slices hold with other conditions: the wide view says so after its
    /// use, and JSON has `otherCopies`.
    #[test]
    fn the_other_copies_of_an_endpoint_are_shown() {
        let note = "also in slice dup-1 (ready); dup-2's conditions used";
        let port = serde_json::from_value::<PortStatus>(serde_json::json!({
            "service": "default/dup", "portName": "", "protocol": "TCP", "family": "IPv4",
            "clusterIp": "10.96.7.8", "port": 80, "externalTrafficPolicy": "Cluster",
            "internalTrafficPolicy": "Cluster",
            "endpoints": [{
                "address": "10.244.1.2:8080", "ready": false, "serving": false,
                "terminating": true, "local": true, "usedBy": [],
                "reason": "not serving (conditions.serving is false)", "otherCopies": note,
            }],
        }))
        .expect("a port");
        let status = Status {
            node: "node1".into(),
            services: vec![port],
            ..Status::default()
        };
        let wide = table(&status, true);
        assert!(
            wide.contains(&format!(
                "not serving local  unused: not serving (conditions.serving is false); {note}"
            )),
            "{wide}"
        );
        let json = serde_json::to_value(&status).expect("JSON");
        assert_eq!(json["services"][0]["endpoints"][0]["otherCopies"], note);
    }

    /// A node fed by a brain knows only the endpoints it uses: no "0/0 used" (it would say the
    /// Service has none), and one hint pointing at the brain when a port uses none.
    #[test]
    fn a_brain_fed_node_counts_used_endpoints_only_and_points_at_the_brain() {
        let port = |service: &str, used: bool, only_used_known: bool| {
            let endpoints = if used {
                vec![kpng_model::inspect::EndpointStatus {
                    address: "10.244.2.2:8080".parse().expect("addr"),
                    ready: true,
                    serving: true,
                    terminating: false,
                    local: true,
                    zone_hints: Vec::new(),
                    node_hints: Vec::new(),
                    used_by: vec!["local".into()],
                    reason: None,
                    other_copies: None,
                }]
            } else {
                Vec::new()
            };
            serde_json::from_value::<PortStatus>(serde_json::json!({
                "service": service, "portName": "", "protocol": "TCP", "family": "IPv4",
                "clusterIp": "10.96.7.7", "port": 80, "externalTrafficPolicy": "Cluster",
                "internalTrafficPolicy": "Local", "endpoints": endpoints,
                "onlyUsedKnown": only_used_known,
            }))
            .expect("a port")
        };
        let status = |services: Vec<PortStatus>| Status {
            node: "node2".into(),
            services,
            ..Status::default()
        };
        let hint = "hint: this node receives only the endpoints it uses; `kpng status --node \
                    node2 default/itp` on the brain explains the endpoints this node does not \
                    receive\n";
        let cases = [
            (
                "brain-fed, none used",
                status(vec![port("default/itp", false, true)]),
                "0 used",
                Some(hint),
            ),
            (
                "brain-fed, one used",
                status(vec![port("default/itp", true, true)]),
                "1 used",
                None,
            ),
            (
                "in-process, none at all",
                status(vec![port("default/itp", false, false)]),
                "0/0 used",
                None,
            ),
        ];
        for (what, status, cell, want_hint) in cases {
            let out = table(&status, false);
            assert!(out.contains(cell), "{what}: {out}");
            assert_eq!(
                out.contains("0/0 used"),
                cell == "0/0 used",
                "{what}: {out}"
            );
            match want_hint {
                Some(h) => assert!(out.ends_with(h), "{what}: {out}"),
                None => assert!(!out.contains("hint:"), "{what}: {out}"),
            }
        }
        let two = table(
            &status(vec![
                port("default/itp", false, true),
                port("default/other", false, true),
            ]),
            false,
        );
        assert!(two.contains("--node node2 NAMESPACE/NAME`"), "{two}");
    }

    #[test]
    fn rejected_objects_are_listed_above_the_ports_with_what_is_in_use() {
        let rejection = |name: &str, kept: bool| RejectedStatus {
            object: format!("Service ns/{name}"),
            kind: "Service".into(),
            namespace: "ns".into(),
            name: name.into(),
            service: Some(format!("ns/{name}")),
            field: "spec.ports[0].port".into(),
            message: "port 0 is not in 1-65535".into(),
            location: Some("cluster.yaml: document 2 (line 9)".into()),
            kept,
        };
        let mut out = String::new();
        write_rejected(&mut out, &[]);
        assert_eq!(out, "", "nothing rejected, nothing written");
        write_rejected(&mut out, &[rejection("a", true), rejection("b", false)]);
        assert_eq!(
            out,
            "rejected objects: 2\n  \
             Service ns/a [cluster.yaml: document 2 (line 9)]: field spec.ports[0].port: port 0 is not in 1-65535 (its last good version is in use)\n  \
             Service ns/b [cluster.yaml: document 2 (line 9)]: field spec.ports[0].port: port 0 is not in 1-65535 (not in use: no earlier version)\n"
        );
        let many: Vec<RejectedStatus> = (0..25).map(|i| rejection(&i.to_string(), true)).collect();
        let mut out = String::new();
        write_rejected(&mut out, &many);
        assert_eq!(out.lines().count(), 1 + REJECTED_LISTED + 1, "{out}");
        assert!(
            out.ends_with("… and 5 more (`kpng status -o json` lists all)\n"),
            "{out}"
        );
    }

    #[test]
    fn the_input_and_the_repairs_are_one_line_each_and_a_line_per_problem() {
        use kpng_runner::admin::InputProblemStatus;
        let cases: [(InputStatus, &str); 4] = [
            // A node fed by a brain names the brain's version (the `kpng-version` header).
            (
                InputStatus {
                    source: "brain tcp://kind-control-plane:12090".into(),
                    problems: vec![],
                    last_good: Some("T1".into()),
                    detail: None,
                    brain_version: Some("0.1.0".into()),
                    ..Default::default()
                },
                "input brain tcp://kind-control-plane:12090 (kpng 0.1.0)  ok  last good input T1\n",
            ),
            (
                InputStatus {
                    source: "file /etc/kpng/cluster.yaml".into(),
                    problems: vec![],
                    last_good: Some("T1".into()),
                    detail: Some("18 objects".into()),
                    brain_version: None,
                    ..Default::default()
                },
                "input file /etc/kpng/cluster.yaml  ok  last good input T1 (18 objects)\n",
            ),
            (
                InputStatus {
                    source: "kube https://10.0.0.1:6443/".into(),
                    problems: vec![InputProblemStatus {
                        what: "API server".into(),
                        message: "unreachable: refused".into(),
                        since: "T0".into(),
                    }],
                    last_good: None,
                    detail: None,
                    brain_version: None,
                    ..Default::default()
                },
                "input kube https://10.0.0.1:6443/  1 PROBLEM  last good input never\n  \
                 API server (since T0): unreachable: refused\n",
            ),
            (
                InputStatus {
                    source: "directory /m".into(),
                    problems: ["/m/a.yaml", "/m/b.yaml"]
                        .map(|what| InputProblemStatus {
                            what: what.into(),
                            message: "not loaded".into(),
                            since: "T0".into(),
                        })
                        .to_vec(),
                    last_good: Some("T1".into()),
                    detail: None,
                    brain_version: None,
                    ..Default::default()
                },
                "input directory /m  2 PROBLEMS  last good input T1\n  \
                 /m/a.yaml (since T0): not loaded\n  /m/b.yaml (since T0): not loaded\n",
            ),
        ];
        for (input, want) in cases {
            let mut out = String::new();
            write_input(&mut out, &input, 0);
            assert_eq!(out, want);
        }
        for (count, problem, want) in [
            (
                1,
                None,
                "repaired once after changes by someone else; the last at T (ip kpng: table deleted)\n",
            ),
            (
                3,
                None,
                "repaired 3 times after changes by someone else; the last at T (ip kpng: table deleted)\n",
            ),
            (
                9,
                Some("someone else changed kpng's rules 9 times …"),
                "repaired 9 times after changes by someone else; the last at T (ip kpng: table deleted)\n\
                 PROBLEM: someone else changed kpng's rules 9 times …\n",
            ),
        ] {
            let mut out = String::new();
            write_repairs(
                &mut out,
                &RepairStatus {
                    count,
                    last_at: "T".into(),
                    last_change: "ip kpng: table deleted".into(),
                    problem: problem.map(str::to_string),
                    unrepaired: None,
                },
            );
            assert_eq!(out, want);
        }
        // A change not repaired yet (the first: nothing repaired before it) is a problem line.
        let mut out = String::new();
        write_repairs(
            &mut out,
            &RepairStatus {
                unrepaired: Some("ip kpng: table deleted (reported at T): not repaired yet".into()),
                ..RepairStatus::default()
            },
        );
        assert_eq!(
            out,
            "PROBLEM: ip kpng: table deleted (reported at T): not repaired yet\n"
        );
    }

    /// A Node whose kpng left is listed with since when and after how long it had been
    /// connected (until 2026-12-07 by name alone: a node that flapped a minute ago read as one
    /// gone all day); a Node never connected is named alone.
    #[test]
    fn a_node_that_left_is_listed_with_since_when() {
        let left = kpng_api::hub::DisconnectedNode {
            node: "n3".into(),
            since: "2026-12-07T22:27:10.000Z".into(),
            since_unix: 1_796_682_430,
            connected_for_seconds: 28,
        };
        let now = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_796_682_430 + 150);
        let mut out = String::new();
        write_not_connected(&mut out, &["n3".into(), "n5".into()], &[left], now);
        assert!(
            out.contains(
                ": n3 (disconnected since 2026-12-07T22:27:10.000Z (2m 30s ago), after 28s \
                 connected), n5\n"
            ),
            "{out}"
        );
    }

    /// A status as a node answers it, from its JSON fields (the rest empty).
    fn node_status(fields: serde_json::Value) -> Status {
        let mut value = serde_json::json!({
            "node": "n1", "backend": "nftables", "programmed": false,
            "pendingPortChanges": 0, "services": [],
        });
        for (k, v) in fields.as_object().expect("an object") {
            value[k] = v.clone();
        }
        serde_json::from_value(value).expect("a status")
    }

    /// A brain's own status lists the values its conversion dropped (the log said so once;
    /// its nodes get the rest of each object and are not told), counted in its input's line
    /// as a node's `kpng status` counts its own.
    #[test]
    fn a_brains_status_lists_the_values_it_dropped() {
        let hub = kpng_api::hub::Hub::new(
            kpng_model::ClusterModel::new(kpng_model::ClusterConfig::default()),
            kpng_api::metrics::ApiMetrics::default(),
        );
        hub.apply(kpng_model::Event::Apply(
            kpng_k8s::from_json::<k8s_openapi::api::core::v1::Service>(serde_json::json!({
                "metadata": {"namespace": "ns", "name": "web"},
                "spec": {"clusterIP": "10.96.0.1", "externalIPs": ["nope"],
                         "ports": [{"name": "http", "port": 80}]},
            }))
            .expect("a Service")
            .object,
        ));
        let input = InputStatus {
            source: "file /c.yaml".into(),
            problems: Vec::new(),
            last_good: Some("T1".into()),
            detail: None,
            brain_version: None,
            ..Default::default()
        };
        let status = brain_status(&hub, input, &StatusQuery::default());
        assert_eq!(
            status.dropped,
            [DroppedStatus {
                object: "Service ns/web".into(),
                service: Some("ns/web".into()),
                field: "spec.externalIPs[0]".into(),
                message: "\"nope\" is not an IP address".into(),
            }]
        );
        let text = brain_text(&status, None, false);
        assert!(
            text.contains("input file /c.yaml  1 VALUE DROPPED  last good input T1\n")
                && text.contains(
                    "dropped values: 1 (the rest of each object is used)\n  \
                     Service ns/web: field spec.externalIPs[0]: \"nope\" is not an IP address\n"
                ),
            "{text}"
        );
    }

    /// `kpng status NS/NAME` asked of a brain lists, of its rejections and dropped values,
    /// that Service's only (its own and its EndpointSlices'), in the table and in JSON alike,
    /// as a node does; the table says how many others it left out. Until 2026-12-07 a brain
    /// listed every object's.
    #[test]
    fn a_brains_status_about_one_service_lists_that_services_rejections_only() {
        let hub = kpng_api::hub::Hub::new(
            kpng_model::ClusterModel::new(kpng_model::ClusterConfig::default()),
            kpng_api::metrics::ApiMetrics::default(),
        );
        let service = |namespace: &str, name: &str, ip: &str, extra: serde_json::Value| {
            let mut spec = serde_json::json!({"clusterIP": ip, "ports": [{"port": 80}]});
            if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
                spec.extend(extra.clone());
            }
            kpng_model::Event::Apply(
                kpng_k8s::from_json::<k8s_openapi::api::core::v1::Service>(serde_json::json!({
                    "metadata": {"namespace": namespace, "name": name}, "spec": spec,
                }))
                .expect("a Service")
                .object,
            )
        };
        let slice = |name: &str| {
            kpng_model::Event::Apply(
                kpng_k8s::from_json::<k8s_openapi::api::discovery::v1::EndpointSlice>(
                    serde_json::json!({
                        "metadata": {"namespace": "ns", "name": name,
                                     "labels": {"kubernetes.io/service-name": "web"}},
                        "addressType": "IPv4",
                        "ports": [{"port": 8080, "protocol": "TPC"}],
                        "endpoints": [{"addresses": ["10.244.1.7"]}],
                    }),
                )
                .expect("an EndpointSlice")
                .object,
            )
        };
        hub.apply(service("ns", "web", "10.96.0.1", serde_json::json!({})));
        hub.apply(slice("web-bad"));
        hub.apply(service(
            "ns",
            "typo",
            "10.96.0.2",
            serde_json::json!({"ports": [{"port": 80, "protocol": "TPC"}]}),
        ));
        hub.apply(service(
            "other",
            "dropper",
            "10.96.0.3",
            serde_json::json!({"externalIPs": ["nope"]}),
        ));
        let input = InputStatus {
            source: "file /c.yaml".into(),
            kind: "file".into(),
            location: "/c.yaml".into(),
            state: "ok".into(),
            problems: Vec::new(),
            last_good: Some("T1".into()),
            detail: None,
            last_good_objects: None,
            last_good_files: None,
            last_change_from: None,
            brain_version: None,
        };
        let query = StatusQuery {
            service: Some("ns/web".into()),
            ..StatusQuery::default()
        };
        let status = serde_json::to_value(brain_status(&hub, input, &query)).expect("JSON");
        assert_eq!(
            status["rejected"].as_array().map(Vec::len),
            Some(2),
            "{status}"
        );
        assert_eq!(
            status["dropped"].as_array().map(Vec::len),
            Some(1),
            "{status}"
        );

        let table = brain_output(&status, Some("ns/web"), StatusOutput::Table).expect("table");
        assert!(
            table.contains("rejected objects: 1\n  EndpointSlice ns/web-bad")
                && !table.contains("ns/typo")
                && !table.contains("other/dropper")
                && !table.contains("VALUE DROPPED")
                && table.contains("(1 other object rejected, not shown"),
            "{table}"
        );
        let json: serde_json::Value = serde_json::from_str(
            &brain_output(&status, Some("ns/web"), StatusOutput::Json).expect("JSON"),
        )
        .expect("JSON");
        let objects: Vec<&str> = json["rejected"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["object"].as_str())
            .collect();
        assert_eq!(objects, ["EndpointSlice ns/web-bad"], "{json}");
        assert!(json.get("dropped").is_none(), "{json}");
        // Another namespace's Service: its dropped value, no rejection.
        let other =
            brain_output(&status, Some("other/dropper"), StatusOutput::Table).expect("table");
        assert!(
            other.contains("1 VALUE DROPPED")
                && !other.contains("rejected objects")
                && other.contains("(2 other objects rejected, not shown"),
            "{other}"
        );
        // Without a Service, everything.
        let all = brain_output(&status, None, StatusOutput::Table).expect("table");
        assert!(
            all.contains("rejected objects: 2") && all.contains("1 VALUE DROPPED"),
            "{all}"
        );
    }

    /// The values a brain dropped travel to its nodes in its report (new fields of the
    /// kpng-rs-only KpngBrainReport, which a client from before skips): a node's `kpng status`
    /// counts and lists them under the brain's line, and `kpng status NAME` keeps those of
    /// that Service. Until 2026-12-07 a brain-fed node
    /// showed none of them.
    #[test]
    fn a_brain_fed_node_lists_the_values_its_brain_dropped() {
        use prost::Message as _;
        let mut cluster = kpng_model::ClusterModel::new(kpng_model::ClusterConfig::default());
        for value in [
            serde_json::json!({"kind": "Service", "metadata": {"namespace": "ns", "name": "web"},
                "spec": {"clusterIP": "10.96.0.1", "externalIPs": ["nope"],
                         "ports": [{"name": "http", "port": 80}]}}),
            serde_json::json!({"kind": "Service", "metadata": {"namespace": "ns", "name": "db"},
                "spec": {"clusterIP": "10.96.0.2", "externalIPs": ["127.0.0.1"],
                         "ports": [{"name": "sql", "port": 5432}]}}),
        ] {
            cluster.apply(kpng_model::Event::Apply(
                kpng_k8s::from_json::<k8s_openapi::api::core::v1::Service>(value)
                    .expect("a Service")
                    .object,
            ));
        }
        let input = kpng_model::input::InputHealth::new("file /c.yaml");
        let sent =
            kpng_api::convert::brain_report(&input.state(), cluster.rejected(), cluster.dropped());
        assert_eq!(sent.dropped_total, 2, "{sent:?}");
        // Through the wire, as node n1 gets it.
        let received = kpng_api::proto::KpngBrainReport::decode(sent.encode_to_vec().as_slice())
            .expect("decode");
        let report = kpng_runner::admin::BrainReportStatus::of(
            &kpng_api::convert::decode_brain_report(&received),
            "n1",
        );
        let objects: Vec<&str> = report.dropped.iter().map(|d| d.object.as_str()).collect();
        assert_eq!(objects, ["Service ns/db", "Service ns/web"]);
        assert_eq!(report.dropped_total, 2);
        let status = node_status(serde_json::json!({
            "brainReports": serde_json::to_value(&report).expect("JSON"),
        }));
        let text = table(&status, false);
        assert!(
            text.contains("brain reports: its input file /c.yaml  ok; it rejects nothing; it dropped 2 values\n")
                && text.contains(
                    "  dropped Service ns/web: field spec.externalIPs[0]: \"nope\" is not an IP \
                     address (the rest of the object is used)\n"
                ),
            "{text}"
        );
        let mut status = status;
        keep_rejections_of(&mut status, "ns/web");
        let kept = status.brain_reports.as_ref().expect("a report");
        assert_eq!(kept.dropped.len(), 1, "{:?}", kept.dropped);
        assert_eq!(kept.dropped[0].object, "Service ns/web");
    }

    /// `kpng status NAME -o json|yaml` (and the table) stop with the same error when no port
    /// matches: the rejection or the reason it quotes has its control characters escaped as
    /// the text output escapes each value, not raw (a newline forged a line, an escape
    /// sequence reached the terminal); the filter is matched against the names as they are.
    #[test]
    fn the_no_port_error_escapes_the_values_it_quotes() {
        let status = serde_json::json!({
            "node": "n1",
            "services": [],
            "rejected": [{
                "object": "Service ns/web",
                "field": "spec.ports[0].name",
                "message": "\"x\u{1b}[2J\nPROBLEM: forged\" is bad",
                "kept": false,
            }],
            "notProgrammed": [{"service": "ns/other", "why": "headless\u{1b}[1m\nforged"}],
        });
        for (filter, want) in [
            (
                "ns/web",
                "no Service port matches \"ns/web\": Service ns/web: field spec.ports[0].name: \
                 \"x\\u{1b}[2J\\nPROBLEM: forged\" is bad (not in use: no earlier version); \
                 fix it in the input",
            ),
            (
                "ns/other",
                "no Service port matches \"ns/other\": ns/other has no rule: \
                 headless\\u{1b}[1m\\nforged",
            ),
        ] {
            let mut status = status.clone();
            if filter == "ns/other" {
                status["rejected"] = serde_json::json!([]);
            }
            let said = no_port_matches(&status, filter);
            assert_eq!(said, want, "{filter}");
            assert!(!said.chars().any(char::is_control), "{said:?}");
        }
    }

    #[test]
    fn an_unclean_previous_run_is_an_information_line_not_a_problem() {
        let note = "the previous kpng (pid 42, started T) ended without a clean shutdown \
                    (killed, OOM — see `dmesg` / `journalctl -k`)";
        let out = table(
            &node_status(serde_json::json!({"previousRun": note})),
            false,
        );
        assert!(out.contains(&format!("\nprevious run: {note}\n")), "{out}");
        assert!(!out.contains("PROBLEM"), "{out}");
        let out = table(&node_status(serde_json::json!({})), false);
        assert!(!out.contains("previous run"), "{out}");
    }

    #[test]
    fn a_brain_report_says_whether_it_may_be_out_of_date() {
        let problem = |message: &str| {
            serde_json::json!({"source": "brain tcp://b:1", "problems": [
                {"what": "brain", "message": message, "since": "T0"}]})
        };
        let fine = serde_json::json!({"source": "brain tcp://b:1", "problems": []});
        // (the node's input, the report from an earlier connection, the heading)
        let cases = [
            (fine.clone(), false, "brain reports"),
            (
                problem("unreachable: refused"),
                false,
                "brain reported (before it went out of reach; may be out of date)",
            ),
            (
                problem("unreachable: refused"),
                true,
                "brain reported (before it went out of reach; may be out of date)",
            ),
            (
                fine,
                true,
                "brain reported (on the previous connection; may be out of date until the \
                 brain sends its state)",
            ),
            (
                problem(kpng_api::client::NO_STATE_YET),
                true,
                "brain reported (on the previous connection; may be out of date until the \
                 brain sends its state)",
            ),
            (
                problem("something else"),
                false,
                "brain reported (may be out of date)",
            ),
        ];
        for (input, earlier, want) in cases {
            let status = node_status(serde_json::json!({
                "input": input,
                "brainReports": {"source": "file /c.yaml", "healthy": true,
                                 "fromEarlierConnection": earlier},
            }));
            let report = status.brain_reports.as_ref().expect("a report");
            assert_eq!(
                brain_report_heading(&status, report),
                want,
                "{input} {earlier}"
            );
            assert!(table(&status, false).contains(&format!("\n{want}: its input file /c.yaml")));
        }
    }

    #[test]
    fn the_wait_for_the_first_sync_says_what_routes_traffic_meanwhile() {
        let kinds = serde_json::json!(["Service", "EndpointSlice", "Node"]);
        let cases = [
            (serde_json::json!({}), None),
            (
                serde_json::json!({"waitingFor": kinds}),
                Some(
                    "waiting for the first complete lists of Service, EndpointSlice, Node \
                     (nothing is programmed before)",
                ),
            ),
            (
                serde_json::json!({"waitingFor": kinds, "fedByBrain": true}),
                Some("waiting for the brain's first state (nothing is programmed before)"),
            ),
            (
                serde_json::json!({"waitingFor": kinds, "fedByBrain": true,
                                   "earlierRulesInPlace": true}),
                Some(
                    "waiting for the brain's first state (rules an earlier run of kpng left are \
                     still in place and route traffic as they did until the first sync \
                     replaces them)",
                ),
            ),
        ];
        for (fields, want) in cases {
            let status = node_status(fields.clone());
            assert_eq!(waiting_line(&status).as_deref(), want, "{fields}");
        }
    }

    /// A newline inside a value (a name from a manifest, a brain client's node name) is
    /// escaped where it stands: it once started a line of its own in `kpng status` and
    /// `kpng trace` (a forged `PROBLEM:` line), as the text was escaped line by line only.
    #[test]
    fn a_newline_inside_a_value_forges_no_line() {
        let forged = "web\nPROBLEM: forged line\u{1b}[2J";
        let mut value = serde_json::json!({
            "node": "n1", "backend": "nftables", "programmed": false,
            "pendingPortChanges": 0, "services": [],
            "rejected": [{"object": format!("Service ns/{forged}"), "field": "spec.ports[0].name",
                          "message": forged, "kept": false}],
        });
        escape_value_controls(&mut value);
        let status: Status = serde_json::from_value(value).expect("a status");
        let text = terminal_safe(&table(&status, true));
        assert!(
            text.contains("web\\nPROBLEM: forged line\\u{1b}[2J"),
            "{text}"
        );
        assert!(
            !text
                .lines()
                .any(|l| l.trim_start().starts_with("PROBLEM: forged")),
            "{text}"
        );

        let q = parse_trace("10.0.0.1", "10.96.0.60:80", None, None).expect("query");
        let mut t = serde_json::json!({"verdict": "none", "reason": forged, "inSync": true,
            "inputProblem": forged, format!("key{forged}"): 1});
        escape_value_controls(&mut t);
        let text = terminal_safe(&trace_text(&q, &t));
        assert!(
            !text
                .lines()
                .any(|l| l.trim_start().starts_with("PROBLEM: forged")),
            "{text}"
        );
        assert!(
            !t.as_object()
                .expect("object")
                .keys()
                .any(|k| k.contains('\n'))
        );
    }

    #[test]
    fn one_services_status_keeps_its_own_rejections_and_counts_the_others() {
        let rejected = |object: &str| serde_json::json!({"object": object, "field": "f", "message": "m", "kept": false});
        let mut status = node_status(serde_json::json!({
            "rejected": [rejected("Service ns/web"), rejected("Service ns/db")],
            "brainReports": {"source": "file /c.yaml", "healthy": true, "rejectedTotal": 150,
                "rejected": [rejected("Service ns/web"), rejected("EndpointSlice ns/web-1"),
                             rejected("Service other/web2")]},
        }));
        assert_eq!(keep_rejections_of(&mut status, "ns/web:http"), 1 + 149);
        let objects = |list: &[RejectedStatus]| -> Vec<String> {
            list.iter().map(|r| r.object.clone()).collect()
        };
        assert_eq!(objects(&status.rejected), ["Service ns/web"]);
        let report = status.brain_reports.as_ref().expect("a report");
        assert_eq!(objects(&report.rejected), ["Service ns/web"]);
        assert_eq!(report.rejected_total, 1);
    }

    #[test]
    fn a_trace_notes_a_stale_input_and_a_kpng_that_does_not_answer_is_named() {
        let q = parse_trace("10.0.0.1", "10.96.0.60:80", None, None).expect("query");
        let t = serde_json::json!({"verdict": "none", "reason": "r", "inSync": true,
            "inputProblem": "this node's input (brain tcp://b:1) has a problem"});
        let text = trace_text(&q, &t);
        assert!(
            text.ends_with("  note:       this node's input (brain tcp://b:1) has a problem\n"),
            "{text}"
        );
        let socket = Path::new("/run/kpng/kpng.sock");
        let ten = std::time::Duration::from_secs(10);
        assert_eq!(
            no_answer(socket, Some(42), ten),
            "the kpng at /run/kpng/kpng.sock (pid 42) did not answer within 10s: it is hung \
             (stopped, deadlocked) or very busy; --timeout waits longer"
        );
        assert!(
            no_answer(socket, None, std::time::Duration::from_millis(1500))
                .starts_with("the kpng at /run/kpng/kpng.sock did not answer within 1.5s: ")
        );
    }

    /// Values dropped from objects in use count in the input's line and are listed with
    /// their object and field (until 2026-12-06 only the log had them, while the status said
    /// "input … ok"); `kpng status NAME` keeps those of that Service and its slices.
    #[test]
    fn dropped_values_are_input_problems_in_the_status() {
        let input = |problems: usize| InputStatus {
            source: "file /c.yaml".into(),
            problems: (0..problems)
                .map(|i| kpng_runner::admin::InputProblemStatus {
                    what: format!("/c{i}.yaml"),
                    message: "not loaded".into(),
                    since: "T0".into(),
                })
                .collect(),
            last_good: Some("T1".into()),
            detail: None,
            brain_version: None,
            ..Default::default()
        };
        for (problems, dropped, want) in [
            (0, 0, "input file /c.yaml  ok  last good input T1\n"),
            (
                0,
                1,
                "input file /c.yaml  1 VALUE DROPPED  last good input T1\n",
            ),
            (
                0,
                2,
                "input file /c.yaml  2 VALUES DROPPED  last good input T1\n",
            ),
            (
                1,
                2,
                "input file /c.yaml  1 PROBLEM, 2 VALUES DROPPED  last good input T1\n  \
                 /c0.yaml (since T0): not loaded\n",
            ),
        ] {
            let mut out = String::new();
            write_input(&mut out, &input(problems), dropped);
            assert_eq!(out, want);
        }
        let dropped = |object: &str, service: Option<&str>| DroppedStatus {
            object: object.into(),
            service: service.map(String::from),
            field: "endpoints[0].addresses[0]".into(),
            message: "\"::ffff:10.77.0.2\" is an IPv4-mapped IPv6 address".into(),
        };
        let mut status = node_status(serde_json::json!({}));
        status.dropped = vec![
            dropped("EndpointSlice ns/web-6", Some("ns/web")),
            dropped("Service ns/db", Some("ns/db")),
            dropped("EndpointSlice ns/orphan", None),
        ];
        let mut out = String::new();
        write_dropped(&mut out, &status.dropped);
        assert_eq!(
            out,
            "dropped values: 3 (the rest of each object is used)\n  \
             EndpointSlice ns/web-6: field endpoints[0].addresses[0]: \"::ffff:10.77.0.2\" is an IPv4-mapped IPv6 address\n  \
             Service ns/db: field endpoints[0].addresses[0]: \"::ffff:10.77.0.2\" is an IPv4-mapped IPv6 address\n  \
             EndpointSlice ns/orphan: field endpoints[0].addresses[0]: \"::ffff:10.77.0.2\" is an IPv4-mapped IPv6 address\n"
        );
        keep_rejections_of(&mut status, "ns/web");
        let objects: Vec<&str> = status.dropped.iter().map(|d| d.object.as_str()).collect();
        assert_eq!(objects, ["EndpointSlice ns/web-6"]);
    }

    /// An IPv4 load balancer whose source ranges are all IPv6 lets every IPv4 source in (as
    /// kube-proxy): its status line and a trace to it say so, as they show the ranges that
    /// do apply.
    #[test]
    fn source_ranges_of_another_family_only_are_shown_as_open() {
        let port = |ranges: &[&str], other: &[&str]| PortStatus {
            service: "t/lb2".into(),
            port_name: "http".into(),
            protocol: "TCP".into(),
            family: "IPv4".into(),
            cluster_ip: "10.96.0.42".parse().expect("ip"),
            port: 80,
            node_port: None,
            external_ips: Vec::new(),
            load_balancer_ips: vec!["203.0.113.42".parse().expect("ip")],
            source_ranges: ranges.iter().map(|r| r.parse().expect("cidr")).collect(),
            source_ranges_of_other_families_only: other
                .iter()
                .map(|r| r.parse().expect("cidr"))
                .collect(),
            external_traffic_policy: "Cluster".into(),
            internal_traffic_policy: "Cluster".into(),
            affinity_timeout_seconds: None,
            health_check_node_port: None,
            health_check: None,
            without_endpoints: None,
            without_endpoints_detail: None,
            endpoints: Vec::new(),
            only_used_known: false,
        };
        for (ranges, other, want, detail) in [
            (&[][..], &[][..], "C/C", None),
            (
                &["10.1.0.0/16"][..],
                &[][..],
                "C/C src 1",
                Some("lb sources 10.1.0.0/16"),
            ),
            (
                &[][..],
                &["fd00::/8"][..],
                "C/C src ALL",
                Some("lb sources ALL (loadBalancerSourceRanges fd00::/8 name no IPv4 range)"),
            ),
        ] {
            let port = port(ranges, other);
            assert_eq!(row(&port)[4], want);
            // In full under the row, about one Service.
            let status = Status {
                services: vec![port],
                ..Status::default()
            };
            let view = TableView {
                wide: false,
                detailed: true,
                hidden: None,
            };
            let text = table_of(&status, view);
            if let Some(detail) = detail {
                assert!(text.contains(&format!("\n    {detail}\n")), "{text}");
            }
        }
        let q = parse_trace("198.51.100.7", "203.0.113.42:80", None, None).expect("query");
        let t = serde_json::json!({"verdict": "dnat", "reason": "r", "inSync": true,
            "service": "t/lb2:http", "frontend": "loadBalancer",
            "sourceRangesOfOtherFamiliesOnly": ["fd00::/8"]});
        let text = trace_text(&q, &t);
        assert!(
            text.ends_with(
                "  note:       every IPv4 source is let in: the Service's loadBalancerSourceRanges \
                 (fd00::/8) name no range of this family, and apply per family (as in kube-proxy)\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn the_conntrack_table_is_shown_when_nearly_full_or_asked_for() {
        let cases = [
            (1_000, 262_144, false, ""),
            (
                1_000,
                262_144,
                true,
                "conntrack table 0 % full (1000 of 262144 entries)\n",
            ),
            (
                235_929,
                262_144,
                true,
                "conntrack table 89 % full (235929 of 262144 entries)\n",
            ),
            (0, 0, true, "conntrack table 0 % full (0 of 0 entries)\n"),
        ];
        for (entries, max, wide, want) in cases {
            let mut out = String::new();
            write_conntrack(
                &mut out,
                &ConntrackStatus {
                    entries,
                    max,
                    max_read_only: false,
                },
                wide,
            );
            assert_eq!(out, want, "{entries}/{max} wide {wide}");
        }
        for wide in [false, true] {
            let mut out = String::new();
            write_conntrack(
                &mut out,
                &ConntrackStatus {
                    entries: 235_930,
                    max: 262_144,
                    max_read_only: false,
                },
                wide,
            );
            assert!(
                out.starts_with(
                    "conntrack table 90 % full (235930 of 262144 entries): when full, the kernel \
                     evicts unreplied entries to make room and, when it finds none, drops new \
                     connections' packets (dmesg: \"nf_conntrack: table full, dropping packet\"; \
                     `conntrack -S`: early_drop, then drop); raise"
                ) && out.ends_with("--conntrack-min, or find what opens so many connections\n"),
                "{out}"
            );
        }
        // Where kpng cannot set the size (not the host network namespace, /proc/sys
        // read-only), its flags would not help: the status says why and what to do instead
        // (it advised the flags).
        let mut out = String::new();
        write_conntrack(
            &mut out,
            &ConntrackStatus {
                entries: 262_144,
                max: 262_144,
                max_read_only: true,
            },
            false,
        );
        assert!(
            out.contains(
                "kpng cannot raise it: nf_conntrack_max is read-only here: not the host network \
                 namespace, or /proc/sys mounted read-only"
            ) && out.contains("set net.netfilter.nf_conntrack_max on the host")
                && !out.contains("--conntrack-max-per-core"),
            "{out}"
        );
    }

    /// A brain's node `name` running `version`, connected at `T0`, one change set sent and
    /// nothing pending: the brain-table tests' row, each test changing what it checks.
    fn watcher(name: &str, version: Option<&str>) -> kpng_api::hub::WatcherStatus {
        kpng_api::hub::WatcherStatus {
            node: name.into(),
            peer: None,
            connected_at: "T0".into(),
            change_sets_sent: 1,
            last_sent_at: None,
            pending_service_changes: 0,
            lag_seconds: 0.0,
            version: version.map(str::to_string),
        }
    }

    #[test]
    fn a_brains_nodes_are_listed_most_behind_first_and_capped_unless_wide() {
        let node = |name: &str, lag: f64, pending: usize| kpng_api::hub::WatcherStatus {
            peer: Some("10.0.0.9:41000".into()),
            change_sets_sent: 3,
            pending_service_changes: pending,
            lag_seconds: lag,
            ..watcher(name, None)
        };
        let mut nodes: Vec<_> = (0..60).map(|i| node(&format!("n{i:02}"), 0.0, 0)).collect();
        nodes.push(node("slow", 4.5, 7));
        nodes.push(node("queued", 0.0, 2));
        let names = |text: &str| -> Vec<String> {
            text.lines()
                .skip(1)
                .filter_map(|l| l.split_whitespace().next())
                .map(str::to_string)
                .collect()
        };
        let mut out = String::new();
        write_brain_nodes(&mut out, &nodes, None, false);
        let out = out
            .strip_suffix(BRAIN_NODES_NOTE)
            .expect("the note")
            .to_string();
        let listed = names(&out);
        assert_eq!(listed[..3], ["slow", "queued", "n00"], "{out}");
        assert_eq!(listed.len(), BRAIN_NODES_LISTED + 1, "{out}");
        assert!(
            out.ends_with("… and 12 more, none further behind (`-o wide` lists all)\n"),
            "{out}"
        );
        let mut wide = String::new();
        write_brain_nodes(&mut wide, &nodes, None, true);
        let wide = wide.strip_suffix(BRAIN_NODES_NOTE).expect("the note");
        assert_eq!(names(wide).len(), 62, "{wide}");
    }

    /// Mid-rollout, the brain's table says which nodes run another build than the brain's
    /// (the same release, another commit) and how many run each: until 2026-12-07 every build
    /// showed as `0.1.0`, and a rollout's progress was invisible.
    #[test]
    fn nodes_of_another_build_than_the_brains_are_marked_and_counted() {
        let ours = "0.1.0+aaaaaaaaaaaa";
        let nodes = [
            watcher("n1", Some(ours)),
            watcher("n2", Some("0.1.0+bbbbbbbbbbbb")),
            watcher("n3", None),
        ];
        let mut table = String::new();
        write_brain_nodes(&mut table, &nodes, Some(ours), false);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "builds: this brain runs 0.1.0+aaaaaaaaaaaa; its nodes: 1 on -, 1 on \
             0.1.0+aaaaaaaaaaaa, 1 on 0.1.0+bbbbbbbbbbbb (a rollout in progress? `!` marks the \
             nodes of another build)",
            "{table}"
        );
        let row = |name: &str| {
            lines
                .iter()
                .find(|l| l.starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("{name} in {table}"))
                .split_whitespace()
                .nth(6)
                .unwrap_or_default()
                .to_string()
        };
        assert_eq!(row("n1"), ours);
        assert_eq!(row("n2"), "0.1.0+bbbbbbbbbbbb!");
        assert_eq!(row("n3"), "-!");
        // All on the brain's build: no line, no mark.
        let mut same = String::new();
        write_brain_nodes(&mut same, &nodes[..1], Some(ours), false);
        assert!(same.starts_with("NODE "), "{same}");
        assert!(!same.contains(&format!("{ours}!")), "{same}");
    }

    #[test]
    fn a_node_name_claimed_twice_is_a_problem_naming_both_addresses() {
        let mut out = String::new();
        write_duplicate_nodes(&mut out, &[]);
        assert_eq!(out, "", "one kpng per node: nothing said");
        write_duplicate_nodes(
            &mut out,
            &[kpng_api::hub::DuplicateNode {
                node: "node1".into(),
                peers: vec!["10.0.0.5:41000".into(), "10.0.0.7:39000".into()],
            }],
        );
        assert!(
            out.starts_with(
                "PROBLEM: 2 kpngs claim node node1: connections from 10.0.0.5:41000 and \
                 10.0.0.7:39000 (a copied DaemonSet"
            ),
            "{out}"
        );
        let mut table = String::new();
        let node = kpng_api::hub::WatcherStatus {
            peer: Some("10.0.0.5:41000".into()),
            ..watcher("node1", Some("0.1.0"))
        };
        write_brain_nodes(&mut table, &[node], Some("0.1.0"), false);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].ends_with(" VERSION     PEER"), "{table}");
        assert!(
            lines[1].ends_with("  0.1.0       10.0.0.5:41000"),
            "{table}"
        );
        // The widest build fills its column and two spaces still part it from the peer (a
        // build with its commit is wider than the column's minimum).
        let mut table = String::new();
        let node = kpng_api::hub::WatcherStatus {
            peer: Some("10.0.0.5:41000".into()),
            ..watcher("node1", Some("0.1.0+188f6b2e5dae"))
        };
        write_brain_nodes(&mut table, &[node], Some("0.1.0+188f6b2e5dae"), false);
        assert!(
            table
                .lines()
                .nth(1)
                .is_some_and(|l| l.ends_with("  0.1.0+188f6b2e5dae  10.0.0.5:41000")),
            "{table}"
        );
        // What SENT and LAG measure is said under the table: handed over, not applied.
        assert!(
            table.ends_with(BRAIN_NODES_NOTE)
                && BRAIN_NODES_NOTE.contains("not confirmed as applied"),
            "{table}"
        );
    }

    #[test]
    fn a_health_checks_answer_reads_as_what_the_load_balancer_gets() {
        use kpng_runner::service_health::HealthCheckAnswer;
        let answer = |status: Option<u16>, local_endpoints: u32| HealthCheckAnswer {
            port: 32100,
            status,
            local_endpoints,
            not_served: status.is_none().then(|| "in use".to_string()),
            refused_connections: None,
        };
        for (hc, want) in [
            (
                answer(Some(200), 2),
                "health check :32100 answers 200 (2 local)",
            ),
            (
                answer(Some(503), 0),
                "health check :32100 answers 503 (no local ready endpoint)",
            ),
            (
                answer(Some(503), 2),
                "health check :32100 answers 503 (kpng not healthy)",
            ),
            (answer(None, 2), "health check :32100 NOT SERVED: in use"),
            (
                HealthCheckAnswer {
                    not_served: Some(
                        "no IPv6 address of the node is inside --nodeport-addresses".into(),
                    ),
                    ..answer(None, 1)
                },
                "health check :32100 NOT SERVED: no IPv6 address of the node is inside \
                 --nodeport-addresses",
            ),
            (
                HealthCheckAnswer {
                    not_served: Some("[fd00:100::1]:32100: Cannot assign requested address (os error 99) (served on 192.168.100.1:32100)".into()),
                    ..answer(Some(200), 2)
                },
                "health check :32100 answers 200 (2 local), NOT SERVED on [fd00:100::1]:32100: \
                 Cannot assign requested address (os error 99) (served on 192.168.100.1:32100)",
            ),
            (
                HealthCheckAnswer {
                    refused_connections: Some((968, 3)),
                    ..answer(Some(200), 1)
                },
                "health check :32100 answers 200 (1 local), REFUSING CONNECTIONS over its caps \
                 (968 since it started, the last 3 s ago; the log names the sources)",
            ),
        ] {
            assert_eq!(crate::status_policy::health_check_answer(&hc), want);
        }
    }

    #[test]
    fn health_checks_not_served_are_listed_with_why_and_since_when() {
        let mut out = String::new();
        write_health_checks(&mut out, &[]);
        assert_eq!(out, "", "nothing when every check is served");
        let check = HealthCheckStatus {
            service: "shop/storefront".into(),
            port: 32100,
            message: "0.0.0.0:32100: Address already in use (os error 98)".into(),
            since: "T0".into(),
        };
        write_health_checks(&mut out, &[check]);
        assert_eq!(
            out,
            "health checks not served: 1 (a load balancer probing one sees this node as \
             unhealthy for that Service; retried at every sync)\n  shop/storefront \
             healthCheckNodePort 32100: 0.0.0.0:32100: Address already in use (os error 98) \
             (since T0)\n"
        );
    }

    #[test]
    fn services_are_found_by_name_namespace_and_port() {
        let s = serde_json::json!({"service": "default/web", "portName": "http"});
        for (filter, want) in [
            ("web", true),
            ("default/web", true),
            ("default/web:http", true),
            ("default/web:grpc", false),
            ("other/web", false),
            ("we", false),
        ] {
            assert_eq!(service_matches(&s, filter), want, "{filter}");
        }
    }
}
