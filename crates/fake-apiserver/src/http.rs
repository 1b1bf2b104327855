//! The HTTP side: discovery documents, list (with pagination), and chunked watch streams of
//! `WatchEvent` JSON lines, in the shapes the real API server sends.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;

use crate::resource::Resource;
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{Change, ChangeType, Notice, Store, WatchStart};

/// How the server behaves, fixed when it is built.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Whether `networking.k8s.io/v1` serves `servicecidrs` (Kubernetes ≥ 1.33 does).
    pub service_cidrs: bool,
    /// Send a `BOOKMARK` this often on watches that allow bookmarks (`None`: only on demand).
    pub bookmark_interval: Option<Duration>,
}

/// One request the server answered, for tests to assert on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// The path.
    pub path: String,
    /// The decoded query parameters.
    pub query: HashMap<String, String>,
    /// The `Authorization` header, if any.
    pub authorization: Option<String>,
}

impl RequestRecord {
    /// Whether this was a watch.
    pub fn is_watch(&self) -> bool {
        self.query
            .get("watch")
            .is_some_and(|w| w == "true" || w == "1")
    }
}

/// What the server has answered and sent, as an API server's own metrics count it
/// (`apiserver_request_total`, `apiserver_response_sizes`, `apiserver_longrunning_requests`):
/// the figures for comparing N nodes watching the API server with one brain.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    requests: AtomicU64,
    lists: AtomicU64,
    watches: AtomicU64,
    bytes_sent: AtomicU64,
    watches_open: AtomicU64,
}

/// A snapshot of the server's counters (see [`crate::FakeApiServer::load`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerLoad {
    /// Every request answered (discovery, lists, list pages, watches, gets, events).
    pub requests: u64,
    /// List requests (each page counts: a list in pages of 500 is many requests).
    pub lists: u64,
    /// Watch requests (streams started).
    pub watches: u64,
    /// Response body bytes: whole answers, and every line written to watch streams.
    pub bytes_sent: u64,
    /// Watch streams open now.
    pub watches_open: u64,
}

impl ServerLoad {
    /// What happened between `earlier` and this snapshot (`watches_open` is this one's).
    pub fn since(&self, earlier: &ServerLoad) -> ServerLoad {
        ServerLoad {
            requests: self.requests.saturating_sub(earlier.requests),
            lists: self.lists.saturating_sub(earlier.lists),
            watches: self.watches.saturating_sub(earlier.watches),
            bytes_sent: self.bytes_sent.saturating_sub(earlier.bytes_sent),
            watches_open: self.watches_open,
        }
    }
}

impl Counters {
    pub fn snapshot(&self) -> ServerLoad {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ServerLoad {
            requests: get(&self.requests),
            lists: get(&self.lists),
            watches: get(&self.watches),
            bytes_sent: get(&self.bytes_sent),
            watches_open: get(&self.watches_open),
        }
    }

    fn sent(&self, bytes: usize) {
        self.bytes_sent.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

/// Counts one open watch stream while it lives.
struct OpenWatch(Arc<Counters>);

impl OpenWatch {
    fn new(counters: Arc<Counters>) -> OpenWatch {
        counters.watches_open.fetch_add(1, Ordering::Relaxed);
        OpenWatch(counters)
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.0.watches_open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What the handlers share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub store: Mutex<Store>,
    pub config: ServerConfig,
    pub requests: Mutex<Vec<RequestRecord>>,
    /// Set while stopping: requests still arriving on open connections get their connection
    /// cut instead of an answer, as in a real outage.
    pub down: AtomicBool,
    /// Resources the client may not read (`403 Forbidden`, as with missing RBAC rules).
    pub forbidden: Mutex<std::collections::BTreeSet<Resource>>,
    /// Resources answered with `404 Not Found` (an API the server does not serve).
    pub missing: Mutex<std::collections::BTreeSet<Resource>>,
    /// Events (`events.k8s.io/v1`) created or patched by clients, newest last.
    pub events: Mutex<Vec<Value>>,
    /// Whether posting Events is refused (`403 Forbidden`, as without the RBAC rule for them).
    pub events_forbidden: AtomicBool,
    /// Whether requests are accepted and never answered (a hung server).
    pub stalled: AtomicBool,
    /// Failures and slowness a test asked for ([`Faults`]).
    pub faults: Mutex<Faults>,
    /// What was answered and sent.
    pub counters: Arc<Counters>,
}

/// Faults injected by a test, as a proxy in front of a real API server would: answers that
/// fail, list bodies cut short, latency.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    /// The next `.1` requests are answered with status `.0` (a `Status` body).
    pub fail: Option<(StatusCode, u64)>,
    /// The `Retry-After` (seconds) those failed answers carry, as API Priority and Fairness
    /// sends with its 429s: `None` sends none.
    pub retry_after: Option<u64>,
    /// List bodies longer than this are cut after this many bytes (the connection is then
    /// aborted, as by a proxy that gave up mid-answer).
    pub truncate: Option<usize>,
    /// Every request waits this long before it is answered.
    pub delay: Option<Duration>,
}

impl Faults {
    /// The status the next request is failed with, if any (and counts it).
    fn take_failure(&mut self) -> Option<StatusCode> {
        let (code, left) = self.fail.as_mut()?;
        let code = *code;
        *left -= 1;
        if *left == 0 {
            self.fail = None;
        }
        Some(code)
    }
}

impl Shared {
    pub fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(handle).with_state(shared)
}

/// A `Status` object, as every API error is sent.
pub fn status(code: StatusCode, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    })
}

fn json_response(code: StatusCode, body: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn error(code: StatusCode, reason: &str, message: &str) -> Response {
    json_response(code, &status(code, reason, message))
}

fn not_found() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "NotFound",
        "the server could not find the requested resource",
    )
}

/// Which objects a list or watch selects.
struct Filter {
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    /// Whether it selects every object of the collection (no namespace, no selector).
    fn is_everything(&self) -> bool {
        self.namespace.is_none() && self.labels.is_empty() && self.fields.is_empty()
    }

    fn matches(&self, object: &Value) -> bool {
        let ns_ok = self.namespace.as_deref().is_none_or(|ns| {
            object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                == Some(ns)
        });
        ns_ok && self.labels.matches(object) && self.fields.matches(object)
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
    body: axum::body::Bytes,
) -> Response {
    shared.counters.requests.fetch_add(1, Ordering::Relaxed);
    let (failure, retry_after, delay) = {
        let mut faults = shared.faults();
        (faults.take_failure(), faults.retry_after, faults.delay)
    };
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    // Before the stall: a test can make a hung server fail a request too.
    if let Some(code) = failure {
        let reason = code
            .canonical_reason()
            .unwrap_or("Failure")
            .replace(' ', "");
        let mut response = error(code, &reason, "failing as the test asked (fail CODE N)");
        if let Some(seconds) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(seconds));
        }
        return response;
    }
    if shared.stalled.load(Ordering::SeqCst) {
        // Hung: never answers; the future is dropped when the client gives up.
        std::future::pending::<()>().await;
    }
    let response = answer(&shared, method, uri, headers, query, body);
    // Whole answers have a known length; watch streams count their lines as they go.
    if let Some(bytes) = axum::body::HttpBody::size_hint(response.body()).exact() {
        shared.counters.sent(bytes as usize);
    }
    response
}

fn answer(
    shared: &Arc<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    query: HashMap<String, String>,
    body: axum::body::Bytes,
) -> Response {
    let path = uri.path().trim_end_matches('/').to_string();
    shared
        .requests
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(RequestRecord {
            path: path.clone(),
            query: query.clone(),
            authorization: headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
        });
    if shared.down.load(Ordering::SeqCst) {
        let cut = futures::stream::once(async {
            Err::<String, _>(std::io::Error::other("the API server is down"))
        });
        return Response::new(Body::from_stream(cut));
    }
    if let Some(rest) = path.strip_prefix("/apis/events.k8s.io/v1/namespaces/")
        && let Some((namespace, tail)) = rest.split_once("/events")
    {
        if shared.events_forbidden.load(Ordering::SeqCst) {
            let message = format!(
                "events.events.k8s.io is forbidden: User \"system:serviceaccount:kube-system:kpng\" cannot create resource \"events\" in API group \"events.k8s.io\" in the namespace \"{namespace}\""
            );
            return error(StatusCode::FORBIDDEN, "Forbidden", &message);
        }
        return event(shared, &method, tail.trim_start_matches('/'), &body);
    }
    if method != Method::GET {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the fake API server only serves GET",
        );
    }
    if let Some(doc) = discovery(&path, &shared.config) {
        return json_response(StatusCode::OK, &doc);
    }
    let Some((resource, namespace, name)) = route(&path, &shared.config) else {
        return not_found();
    };
    let forbidden = shared
        .forbidden
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .contains(&resource);
    let missing = shared
        .missing
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .contains(&resource);
    if missing {
        return error(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        );
    }
    if forbidden {
        // The real server's words: the verb asked for and the API group ("" for the core
        // group), which is what `kubectl auth can-i` and an RBAC rule need.
        let verb = if query.get("watch").is_some_and(|w| w == "true" || w == "1") {
            "watch"
        } else if name.is_some() {
            "get"
        } else {
            "list"
        };
        let group = resource.group();
        let qualified = if group.is_empty() {
            resource.plural().to_string()
        } else {
            format!("{}.{group}", resource.plural())
        };
        let message = format!(
            "{qualified} is forbidden: User \"system:serviceaccount:kube-system:kpng\" cannot {verb} resource \"{}\" in API group \"{group}\" at the cluster scope",
            resource.plural()
        );
        return error(StatusCode::FORBIDDEN, "Forbidden", &message);
    }
    if let Some(name) = name {
        return get(shared, resource, namespace.as_deref().unwrap_or(""), &name);
    }
    let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str));
    let fields = FieldSelector::parse(query.get("fieldSelector").map_or("", String::as_str));
    let filter = match (labels, fields) {
        (Ok(labels), Ok(fields)) => Filter {
            namespace,
            labels,
            fields,
        },
        (Err(e), _) | (_, Err(e)) => return error(StatusCode::BAD_REQUEST, "BadRequest", &e),
    };
    let watch = query.get("watch").is_some_and(|w| w == "true" || w == "1");
    if watch {
        watch_response(shared, resource, filter, &query)
    } else {
        list(shared, resource, &filter, &query)
    }
}

/// `POST …/events` creates an Event, `PATCH …/events/NAME` merges into one (a series): the
/// calls kube's event recorder makes. Events are kept for the tests to read.
fn event(shared: &Shared, method: &Method, name: &str, body: &[u8]) -> Response {
    let Ok(object) = serde_json::from_slice::<Value>(body) else {
        return error(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the body is not JSON",
        );
    };
    let mut events = shared.events.lock().unwrap_or_else(PoisonError::into_inner);
    match (method.as_str(), name) {
        ("POST", "") => {
            events.push(object.clone());
            json_response(StatusCode::CREATED, &object)
        }
        ("PATCH", name) if !name.is_empty() => {
            let found = events
                .iter_mut()
                .rev()
                .find(|e| e.pointer("/metadata/name").and_then(Value::as_str) == Some(name));
            match (found, object) {
                (Some(Value::Object(existing)), Value::Object(patch)) => {
                    for (k, v) in patch {
                        existing.insert(k, v);
                    }
                    json_response(StatusCode::OK, &Value::Object(existing.clone()))
                }
                _ => not_found(),
            }
        }
        _ => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "events: POST to create, PATCH to update",
        ),
    }
}

/// `(resource, namespace, name)` of a resource path.
fn route(path: &str, config: &ServerConfig) -> Option<(Resource, Option<String>, Option<String>)> {
    for resource in Resource::ALL {
        if resource == Resource::ServiceCidrs && !config.service_cidrs {
            continue;
        }
        let Some(rest) = path
            .strip_prefix(resource.prefix())
            .and_then(|r| r.strip_prefix('/'))
        else {
            continue;
        };
        let segments: Vec<&str> = rest.split('/').collect();
        let found = match segments[..] {
            [plural] if plural == resource.plural() => Some((None, None)),
            [plural, name] if plural == resource.plural() && !resource.namespaced() => {
                Some((None, Some(name.to_string())))
            }
            ["namespaces", ns, plural] if plural == resource.plural() && resource.namespaced() => {
                Some((Some(ns.to_string()), None))
            }
            ["namespaces", ns, plural, name]
                if plural == resource.plural() && resource.namespaced() =>
            {
                Some((Some(ns.to_string()), Some(name.to_string())))
            }
            _ => None,
        };
        if let Some((ns, name)) = found {
            return Some((resource, ns, name));
        }
    }
    None
}

/// The discovery documents kube clients read.
fn discovery(path: &str, config: &ServerConfig) -> Option<Value> {
    let resources = |group_version: &str, list: &[Resource]| {
        json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": list.iter().map(|r| r.discovery_entry()).collect::<Vec<_>>(),
        })
    };
    let group = |name: &str| {
        let gv = format!("{name}/v1");
        json!({"name": name, "versions": [{"groupVersion": gv, "version": "v1"}],
            "preferredVersion": {"groupVersion": gv, "version": "v1"}})
    };
    let networking: &[Resource] = if config.service_cidrs {
        &[Resource::ServiceCidrs]
    } else {
        &[]
    };
    Some(match path {
        "/version" => json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-kpng-fake",
            "platform": "linux/amd64"}),
        "/api" => json!({"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}),
        "/apis" => json!({"kind": "APIGroupList", "apiVersion": "v1",
            "groups": [group("discovery.k8s.io"), group("networking.k8s.io")]}),
        "/api/v1" => resources("v1", &[Resource::Services, Resource::Nodes]),
        "/apis/discovery.k8s.io/v1" => {
            resources("discovery.k8s.io/v1", &[Resource::EndpointSlices])
        }
        "/apis/networking.k8s.io/v1" => resources("networking.k8s.io/v1", networking),
        _ => return None,
    })
}

/// An object as watch events and single GETs carry it: with `kind` and `apiVersion`.
fn typed(resource: Resource, mut object: Value) -> Value {
    if let Some(map) = object.as_object_mut() {
        map.insert("kind".into(), resource.kind().into());
        map.insert("apiVersion".into(), resource.api_version().into());
    }
    object
}

fn get(shared: &Shared, resource: Resource, namespace: &str, name: &str) -> Response {
    match shared.store().get(resource, namespace, name) {
        Some(object) => json_response(StatusCode::OK, &typed(resource, object)),
        None => error(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("{} \"{name}\" not found", resource.plural()),
        ),
    }
}

/// The continue token of a page: `RV/NAMESPACE/NAME` of the list's resourceVersion and the
/// last object sent (opaque to clients, as the real server's base64 tokens are).
fn continue_token(rv: u64, last: &Value) -> String {
    let s = |p| last.pointer(p).and_then(Value::as_str).unwrap_or_default();
    format!("{rv}/{}/{}", s("/metadata/namespace"), s("/metadata/name"))
}

/// `(rv, namespace, name)` of a continue token.
fn parse_continue(token: &str) -> Option<(u64, &str, &str)> {
    let (rv, key) = token.split_once('/')?;
    let (namespace, name) = key.split_once('/')?;
    Some((rv.parse().ok()?, namespace, name))
}

fn list(
    shared: &Shared,
    resource: Resource,
    filter: &Filter,
    query: &HashMap<String, String>,
) -> Response {
    shared.counters.lists.fetch_add(1, Ordering::Relaxed);
    let store = shared.store();
    let gone = |what: &str| {
        error(
            StatusCode::GONE,
            "Expired",
            &format!(
                "{what}: the resourceVersion is too old (compacted at {})",
                store.compacted()
            ),
        )
    };
    let exact = query
        .get("resourceVersionMatch")
        .is_some_and(|m| m == "Exact");
    if let Some(rv) = query
        .get("resourceVersion")
        .and_then(|v| v.parse::<u64>().ok())
        && exact
        && rv < store.compacted()
    {
        return gone(&format!("list at resourceVersion {rv}"));
    }
    let (list_rv, after) = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let Some((rv, namespace, name)) = parse_continue(token) else {
                return error(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "invalid continue token",
                );
            };
            // The real server reads later pages at the first page's revision; once that is
            // compacted, the client must start the list again.
            if rv < store.compacted() {
                return gone("The provided continue parameter is too old");
            }
            (rv, Some((namespace, name)))
        }
        None => (store.rv(), None),
    };
    let limit = query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let (items, more) = store.page(resource, after, limit, |o| filter.matches(o));
    let mut metadata = json!({"resourceVersion": list_rv.to_string()});
    if more && let Some((last, _)) = items.last() {
        metadata["continue"] = continue_token(list_rv, last).into();
        // As etcd's store: a count of what is left only for an unfiltered list.
        if filter.is_everything() {
            let rest = store.page(resource, last_key(last), None, |_| true).0.len();
            metadata["remainingItemCount"] = rest.into();
        }
    }
    // The store's objects as it encoded them when they were stored (see `Store::page`),
    // copied under the lock.
    let mut body = format!(
        "{{\"kind\":\"{}List\",\"apiVersion\":\"{}\",\"metadata\":{metadata},\"items\":[",
        resource.kind(),
        resource.api_version()
    )
    .into_bytes();
    for (i, (_, encoded)) in items.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(encoded);
    }
    body.extend_from_slice(b"]}");
    drop(store);
    if let Some(keep) = shared.faults().truncate
        && body.len() > keep
    {
        // The status and the first bytes, then the connection aborted mid-body. The pause
        // lets them reach the client first: an error at once would abort the connection
        // before the headers were written (a request with no answer, not a cut body).
        body.truncate(keep);
        shared.counters.sent(keep);
        let first = futures::stream::iter([Ok::<_, std::io::Error>(body)]);
        let cut = futures::stream::once(async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Err(std::io::Error::other(
                "list body cut short by the test (truncate)",
            ))
        });
        return Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from_stream(futures::StreamExt::chain(first, cut)))
            .unwrap_or_else(|_| not_found());
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// `(namespace, name)` of an object, the store's key within its resource.
fn last_key(object: &Value) -> Option<(&str, &str)> {
    let s = |p| {
        object
            .pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    Some((s("/metadata/namespace"), s("/metadata/name")))
}

/// The event a watch sends for a change, as the API server's watch cache decides it: an
/// object that starts matching the selectors is `ADDED`, one that stops is `DELETED` (its
/// previous state at the new RV).
fn event_for(change: &Change, filter: &Filter) -> Option<WatchEvent> {
    let now = filter.matches(&change.object);
    let before = change.previous.as_ref().is_some_and(|p| filter.matches(p));
    let (kind, object) = match (change.change, before, now) {
        (ChangeType::Deleted, _, true) => (ChangeType::Deleted, change.object.clone()),
        (ChangeType::Deleted, _, false) => return None,
        (_, true, true) => (ChangeType::Modified, change.object.clone()),
        (_, false, true) => (ChangeType::Added, change.object.clone()),
        (_, true, false) => {
            let mut previous = change.previous.clone()?;
            previous["metadata"]["resourceVersion"] = change.rv.to_string().into();
            (ChangeType::Deleted, previous)
        }
        (_, false, false) => return None,
    };
    Some(WatchEvent::new(
        kind.as_str(),
        typed(change.resource, object),
    ))
}

/// One line of a watch stream, written as the API server writes it: `type` before `object`
/// (Go encodes the struct's fields in order). A reader that buffers when the object comes
/// first (serde's adjacently tagged enums) then sees what it sees against a real server.
struct WatchEvent {
    kind: &'static str,
    object: Value,
}

impl WatchEvent {
    fn new(kind: &'static str, object: Value) -> WatchEvent {
        WatchEvent { kind, object }
    }
}

impl std::fmt::Display for WatchEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{{\"type\":\"{}\",\"object\":{}}}",
            self.kind, self.object
        )
    }
}

fn bookmark(resource: Resource, rv: u64, initial_events_end: bool) -> WatchEvent {
    let mut metadata = json!({"resourceVersion": rv.to_string(), "creationTimestamp": null});
    if initial_events_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    WatchEvent::new(
        "BOOKMARK",
        json!({"kind": resource.kind(), "apiVersion": resource.api_version(), "metadata": metadata}),
    )
}

type Line = Result<String, std::io::Error>;

fn watch_response(
    shared: &Arc<Shared>,
    resource: Resource,
    filter: Filter,
    query: &HashMap<String, String>,
) -> Response {
    shared.counters.watches.fetch_add(1, Ordering::Relaxed);
    let flag = |name: &str| query.get(name).is_some_and(|v| v == "true" || v == "1");
    let bookmarks = flag("allowWatchBookmarks");
    let initial_events = flag("sendInitialEvents");
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs);
    let rv_param = query.get("resourceVersion").cloned().unwrap_or_default();
    let start = {
        let store = shared.store();
        if rv_param.is_empty() || rv_param == "0" || initial_events {
            Ok(store.watch_current(resource))
        } else {
            match rv_param.parse::<u64>() {
                Ok(rv) => store.watch_from(resource, rv).ok_or(store.compacted()),
                Err(_) => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "BadRequest",
                        &format!("invalid resourceVersion {rv_param:?}"),
                    );
                }
            }
        }
    };
    let (tx, rx) = mpsc::channel::<Line>(64);
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|line| (line, rx))
    });
    let interval = shared.config.bookmark_interval.filter(|_| bookmarks);
    let initial_end = bookmarks && initial_events;
    match start {
        Ok(start) => {
            // Open from now: counted before the client sees the response.
            let open = OpenWatch::new(shared.counters.clone());
            tokio::spawn(stream_events(
                tx,
                open,
                shared.clone(),
                resource,
                filter,
                start,
                WatchOptions {
                    bookmarks,
                    interval,
                    initial_end,
                    timeout,
                },
            ));
        }
        Err(compacted) => {
            // What the API server sends for a resourceVersion older than its history: a
            // 200 stream with one ERROR event, 410 Gone, reason Expired.
            let message = format!("too old resource version: {rv_param} ({compacted})");
            let line = WatchEvent::new("ERROR", status(StatusCode::GONE, "Expired", &message));
            tokio::spawn(async move {
                let _ = tx.send(Ok(format!("{line}\n"))).await;
            });
        }
    }
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| not_found())
}

/// A watch stream's sender that counts the bytes of every line it sends.
struct CountingSender {
    tx: mpsc::Sender<Line>,
    counters: Arc<Counters>,
}

impl CountingSender {
    async fn send(&self, line: Line) -> Result<(), mpsc::error::SendError<Line>> {
        let bytes = line.as_ref().map_or(0, String::len);
        self.tx.send(line).await?;
        self.counters.sent(bytes);
        Ok(())
    }

    async fn closed(&self) {
        self.tx.closed().await;
    }
}

struct WatchOptions {
    bookmarks: bool,
    interval: Option<Duration>,
    initial_end: bool,
    timeout: Option<Duration>,
}

/// Feeds one watch: the replay, then live changes, bookmarks, and the test's interventions.
async fn stream_events(
    tx: mpsc::Sender<Line>,
    open: OpenWatch,
    shared: Arc<Shared>,
    resource: Resource,
    filter: Filter,
    start: WatchStart,
    options: WatchOptions,
) {
    // Every line is counted as it is handed to the connection.
    let tx = &CountingSender {
        tx,
        counters: open.0.clone(),
    };
    let WatchStart {
        replay,
        mut live,
        rv,
    } = start;
    let mut last_rv = rv;
    // A stall makes every stream silent, also one whose handler subscribed to the notices
    // just after the stall's notice went out (it passed the stalled check just before).
    let silent_if_stalled = || async {
        if shared.stalled.load(Ordering::SeqCst) {
            tx.closed().await;
            true
        } else {
            false
        }
    };
    for change in &replay {
        if let Some(event) = event_for(change, &filter)
            && (silent_if_stalled().await || tx.send(Ok(format!("{event}\n"))).await.is_err())
        {
            return;
        }
    }
    if options.initial_end {
        let end = bookmark(resource, rv, true);
        if silent_if_stalled().await || tx.send(Ok(format!("{end}\n"))).await.is_err() {
            return;
        }
    }
    let deadline = options.timeout.map(|t| tokio::time::Instant::now() + t);
    let mut ticker = options.interval.map(tokio::time::interval);
    if let Some(t) = ticker.as_mut() {
        t.reset();
    }
    loop {
        let line = tokio::select! {
            notice = live.recv() => match notice {
                Ok(Notice::Change(change)) => {
                    last_rv = last_rv.max(change.rv);
                    if change.resource != resource {
                        continue;
                    }
                    match event_for(&change, &filter) {
                        Some(event) => Ok(format!("{event}\n")),
                        None => continue,
                    }
                }
                Ok(Notice::Bookmark) if options.bookmarks => {
                    Ok(format!("{}\n", bookmark(resource, last_rv, false)))
                }
                Ok(Notice::Bookmark) => continue,
                Ok(Notice::Expire) => {
                    let message = format!("too old resource version: {last_rv}");
                    let gone = WatchEvent::new("ERROR", status(StatusCode::GONE, "Expired", &message));
                    let _ = tx.send(Ok(format!("{gone}\n"))).await;
                    return;
                }
                Ok(Notice::Drop) => {
                    // An error in the body makes the server abort the connection mid-stream.
                    let _ = tx.send(Err(std::io::Error::other("connection dropped by the test"))).await;
                    return;
                }
                Ok(Notice::Stall) => {
                    // Silent until the client gives up on the connection.
                    tx.closed().await;
                    return;
                }
                // Fell behind, or the server is gone: end the watch cleanly.
                Err(RecvError::Lagged(_) | RecvError::Closed) => return,
            },
            _ = async {
                match ticker.as_mut() {
                    Some(t) => { t.tick().await; }
                    None => std::future::pending().await,
                }
            } => Ok(format!("{}\n", bookmark(resource, last_rv, false))),
            _ = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            } => return,
            () = tx.closed() => return,
        };
        if silent_if_stalled().await || tx.send(line).await.is_err() {
            return;
        }
    }
}
