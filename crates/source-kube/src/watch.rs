//! One kube-runtime watcher per kind, merged into the model's event stream.
//!
//! | watcher event | model event |
//! |---|---|
//! | `Init` (a list starts: first start, 410 Gone, …) | `ListStart { kinds: [kind] }` |
//! | `InitApply(object)` | `ListItem(object)` |
//! | `InitDone` | `ListDone { kinds: [kind] }` |
//! | `Apply(object)` | `Apply(object)` |
//! | `Delete(object)` | `Delete(reference)` |
//!
//! The model applies a list atomically at `ListDone` and diffs it against what it had, so a
//! relist is a minimal change, never a teardown; and the runner programs nothing until the
//! Service, EndpointSlice and Node lists are all done.

use std::collections::HashMap;
use std::fmt::Debug;

use futures::stream::{BoxStream, SelectAll};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::serde::de::DeserializeOwned;
use kpng_k8s::{Convert, Converted, LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME};
use kpng_model::input::InputHealth;
use kpng_model::{Event, Kind, Object, ObjectRef};
use kube::runtime::watcher::{self, DefaultBackoff};
use kube::{Api, Resource};

use crate::slim::Slim;
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

/// What the source watches for: this node, and which Services are ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceConfig {
    /// This node's name: only its Node object is watched (field selector on the name).
    /// `None`: every Node is (a brain, `kpng kube … to-api`, serves every node).
    pub node_name: Option<String>,
    /// `--service-proxy-name`: watch only the Services (and their EndpointSlices) labelled
    /// with it; without it, only the unlabelled ones.
    pub service_proxy_name: Option<String>,
}

/// The label selector for Services and EndpointSlices, as kube-proxy's informers use it:
/// objects labelled `service.kubernetes.io/service-proxy-name` belong to another proxy unless
/// the label names us, and `service.kubernetes.io/headless` ones are never proxied.
pub fn label_selector(service_proxy_name: Option<&str>) -> String {
    match service_proxy_name {
        None => format!("!{LABEL_SERVICE_PROXY_NAME},!{LABEL_HEADLESS}"),
        Some(name) => format!("{LABEL_SERVICE_PROXY_NAME}={name},!{LABEL_HEADLESS}"),
    }
}

/// The `kube` source.
#[derive(Clone)]
pub struct KubeSource {
    client: kube::Client,
    config: SourceConfig,
    health: InputHealth,
}

impl Debug for KubeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeSource")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// One watcher's output, tagged with its kind.
struct Item {
    kind: Kind,
    result: Result<Event, watcher::Error>,
}

fn reference<K: Resource>(kind: Kind, object: &K) -> ObjectRef {
    ObjectRef {
        kind,
        namespace: object.meta().namespace.clone().unwrap_or_default().into(),
        name: object.meta().name.clone().unwrap_or_default().into(),
    }
}

/// Converts one object as it arrives (the model never sees a Kubernetes type); values it had
/// to drop are logged here, where the object was read.
fn convert<K: Convert>(object: &K) -> Object {
    let Converted { object, warnings } = object.convert();
    for warning in &warnings {
        warn!("{warning}");
    }
    object
}

/// Translates one watcher event (see the module table).
fn translate<K: Resource + Convert>(event: watcher::Event<K>) -> Event {
    let kind = K::KIND;
    match event {
        watcher::Event::Init => Event::ListStart { kinds: vec![kind] },
        watcher::Event::InitApply(o) => Event::ListItem(convert(&o)),
        watcher::Event::InitDone => Event::ListDone { kinds: vec![kind] },
        watcher::Event::Apply(o) => Event::Apply(convert(&o)),
        watcher::Event::Delete(o) => Event::Delete(reference(kind, &o)),
    }
}

/// A watcher of `api` as a stream of [`Item`]s: every object converted as it arrives (so no
/// Kubernetes object outlives its event), errors followed by backoff with jitter (0.8 s
/// doubling to 30 s, reset only by real progress: [`crate::backoff`]), bookmarks on
/// (kube-runtime's default), a relist after `410 Gone`.
fn watch<K>(api: Api<K>, config: watcher::Config) -> BoxStream<'static, Item>
where
    K: Resource + Convert + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64 ^ (K::KIND as u64).rotate_left(17))
        .unwrap_or(1);
    let items =
        crate::backoff::Backoff::new(watcher::watcher(api, config).boxed(), seed).map(|result| {
            Item {
                kind: K::KIND,
                result: result.map(translate),
            }
        });
    on_own_task(items)
}

/// Runs a watcher on a task of its own and returns its items: the lists of Services and
/// EndpointSlices (reading, parsing, converting each page) then proceed in parallel on the
/// runtime's threads instead of taking turns in the task that merges them. The channel holds
/// a few pages' worth of items; the task ends when the stream is dropped.
fn on_own_task(
    items: impl futures::Stream<Item = Item> + Send + 'static,
) -> BoxStream<'static, Item> {
    use tracing::Instrument;
    use tracing::instrument::WithSubscriber;
    let (tx, rx) = mpsc::channel(1024);
    // The task logs where the source logs: its span and its subscriber (tests attach one to
    // the source's future).
    let task = async move {
        futures::pin_mut!(items);
        loop {
            tokio::select! {
                item = items.next() => {
                    let Some(item) = item else { return };
                    if tx.send(item).await.is_err() {
                        return;
                    }
                }
                () = tx.closed() => return,
            }
        }
    };
    tokio::spawn(task.in_current_span().with_current_subscriber());
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
    .boxed()
}

/// Asks discovery whether `networking.k8s.io/v1` serves ServiceCIDRs (Kubernetes ≥ 1.33, or
/// earlier with the MultiCIDRServiceAllocator gate). Retries with backoff until the API
/// server answers.
async fn serves_service_cidrs(client: kube::Client) -> bool {
    let mut backoff = DefaultBackoff::default();
    loop {
        match client
            .list_api_group_resources("networking.k8s.io/v1")
            .await
        {
            Ok(list) => return list.resources.iter().any(|r| r.name == "servicecidrs"),
            Err(kube::Error::Api(status)) if status.code == 404 => return false,
            Err(kube::Error::Api(status)) if status.code == 403 => {
                warn!(
                    "discovery of networking.k8s.io/v1 is forbidden ({}); not watching ServiceCIDRs",
                    status.message
                );
                return false;
            }
            Err(e) => {
                debug!("discovery of networking.k8s.io/v1 failed: {e}");
                let wait = backoff.next().unwrap_or(std::time::Duration::from_secs(30));
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Logs watch errors so that a persistent problem is one line, not one per retry.
#[derive(Default)]
struct ErrorLog {
    /// The last problem logged per kind; cleared when that watcher makes progress.
    last: HashMap<Kind, String>,
    /// Where each kind's problem is shown (`kpng status`) until that watcher makes progress.
    health: InputHealth,
}

/// What a watcher's problem concerns, in `kpng status`.
fn watch_name(kind: Kind) -> String {
    format!("{} watch", kind.as_str())
}

impl ErrorLog {
    fn progress(&mut self, kind: Kind) {
        // Per event: only a watcher that had a problem touches the shared record.
        if self.last.remove(&kind).is_some() {
            self.health.recovered(&watch_name(kind));
        }
    }

    fn error(&mut self, kind: Kind, e: &watcher::Error) {
        let what = kind.as_str();
        let problem = match e {
            watcher::Error::WatchError(status) if status.code == 410 => {
                info!(
                    "{what} watch: resourceVersion expired (410 Gone); relisting, nothing is torn down meanwhile"
                );
                return;
            }
            watcher::Error::WatchFailed(kube::Error::SerdeError(e)) => {
                // Every occurrence is a different object: always reported.
                error!("skipped an undecodable {what}: {e}; the watch goes on");
                return;
            }
            // kube-client reads a watch line that is not a valid event as a Status, which
            // any JSON object is: code 0 means an object that does not decode.
            watcher::Error::WatchFailed(kube::Error::Api(s)) if s.code == 0 => {
                error!(
                    "skipped an undecodable {what} (a field has the wrong type); the watch goes on"
                );
                return;
            }
            watcher::Error::InitialListFailed(kube::Error::SerdeError(e)) => {
                format!("the {what} list does not decode: {e}; retrying, the programmed rules stay")
            }
            watcher::Error::InitialListFailed(kube::Error::Api(s))
            | watcher::Error::WatchStartFailed(kube::Error::Api(s))
            | watcher::Error::WatchFailed(kube::Error::Api(s))
                if s.code == 404 =>
            {
                format!(
                    "{what} watch: the API server does not serve this API (404 {}: {}); \
                     is it older than kpng needs? retrying with backoff",
                    s.reason, s.message
                )
            }
            watcher::Error::InitialListFailed(kube::Error::Api(s))
            | watcher::Error::WatchStartFailed(kube::Error::Api(s))
            | watcher::Error::WatchFailed(kube::Error::Api(s))
                if !(500..600).contains(&s.code) =>
            {
                // 401: who kpng is was not accepted; 403: what it may read (RBAC).
                let check = if s.code == 401 {
                    "check kpng's credentials (the kubeconfig's or service account's token or \
                     client certificate)"
                } else {
                    "check kpng's permissions (RBAC: list and watch)"
                };
                format!(
                    "{what} watch refused: {} {} ({}); {check}",
                    s.code, s.reason, s.message
                )
            }
            watcher::Error::WatchError(status) => {
                format!(
                    "{what} watch error: {} {} ({})",
                    status.code, status.reason, status.message
                )
            }
            watcher::Error::NoResourceVersion => {
                format!("{what}: the API server sent no resourceVersion; relisting")
            }
            other => {
                // Connection problems and 5xx: the client's reachability layer logs the
                // outage once; each attempt is only a debug line.
                debug!("{what} watch: {other}");
                return;
            }
        };
        if self.last.get(&kind) != Some(&problem) {
            warn!("{problem}");
            self.health
                .failing(&watch_name(kind), &problem, std::time::SystemTime::now());
            self.last.insert(kind, problem);
        } else {
            debug!("{problem}");
        }
    }
}

impl KubeSource {
    /// A source reading through `client`.
    pub fn new(client: kube::Client, config: SourceConfig) -> KubeSource {
        KubeSource {
            client,
            config,
            health: InputHealth::default(),
        }
    }

    /// Records each watcher's problems (RBAC refusals, APIs not served, undecodable lists)
    /// and every completed list in `health`, for `kpng status`.
    pub fn with_health(mut self, health: InputHealth) -> KubeSource {
        self.health = health;
        self
    }

    fn streams(&self) -> SelectAll<BoxStream<'static, Item>> {
        let selector = label_selector(self.config.service_proxy_name.as_deref());
        let labelled = watcher::Config::default().labels(&selector);
        let node = match &self.config.node_name {
            Some(name) => watcher::Config::default().fields(&format!("metadata.name={name}")),
            None => watcher::Config::default(),
        };
        // Services, EndpointSlices and Nodes are read without their managedFields, a Node's
        // status without its images and conditions (`crate::slim`).
        futures::stream::select_all([
            watch(
                Api::<Slim<Service>>::all(self.client.clone()),
                labelled.clone(),
            ),
            watch(
                Api::<Slim<EndpointSlice>>::all(self.client.clone()),
                labelled,
            ),
            watch(Api::<Slim<Node>>::all(self.client.clone()), node),
        ])
    }

    /// Watches until `events` is closed. Never gives up on the API server: while it is
    /// unreachable nothing is sent and the programmed rules stay as they are.
    pub async fn run(self, events: mpsc::Sender<Event>) {
        let nodes = match &self.config.node_name {
            Some(name) => format!("Node {name}"),
            None => "every Node".to_string(),
        };
        info!(
            selector = %label_selector(self.config.service_proxy_name.as_deref()),
            "watching Services, EndpointSlices and {nodes}"
        );
        let mut streams = self.streams();
        let mut discovery = serves_service_cidrs(self.client.clone()).boxed().fuse();
        let mut log = ErrorLog {
            health: self.health.clone(),
            ..ErrorLog::default()
        };
        loop {
            tokio::select! {
                item = streams.next() => {
                    // The watchers never end; an empty stream would mean none is left.
                    let Some(Item { kind, result }) = item else { return };
                    match result {
                        Ok(event) => {
                            log.progress(kind);
                            if matches!(event, Event::ListDone { .. }) {
                                self.health.loaded(std::time::SystemTime::now(), None);
                            }
                            if events.send(event).await.is_err() {
                                return;
                            }
                        }
                        Err(e) => log.error(kind, &e),
                    }
                }
                served = &mut discovery => {
                    if served {
                        info!("the API server serves ServiceCIDRs: watching them");
                        streams.push(watch(
                            Api::<ServiceCIDR>::all(self.client.clone()),
                            watcher::Config::default(),
                        ));
                    } else {
                        info!("the API server serves no ServiceCIDRs: only --service-cidr ranges are dropped");
                    }
                }
                () = events.closed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            reason: reason.into(),
            message: "the server says why".into(),
            ..kube::core::Status::default()
        }))
    }

    /// What a watcher's errors leave in the input's record (`kpng status`), and that progress
    /// clears it.
    #[test]
    fn watch_problems_are_recorded_until_the_watcher_makes_progress() {
        let cases: [(watcher::Error, Option<(&str, &str)>); 5] = [
            (
                watcher::Error::InitialListFailed(api(403, "Forbidden")),
                Some((
                    "Node watch",
                    "Node watch refused: 403 Forbidden (the server says why); check kpng's permissions (RBAC: list and watch)",
                )),
            ),
            (
                watcher::Error::WatchStartFailed(api(401, "Unauthorized")),
                Some((
                    "Node watch",
                    "Node watch refused: 401 Unauthorized (the server says why); check kpng's credentials (the kubeconfig's or service account's token or client certificate)",
                )),
            ),
            (
                watcher::Error::InitialListFailed(api(404, "NotFound")),
                Some((
                    "Node watch",
                    "Node watch: the API server does not serve this API (404 NotFound: the server says why); is it older than kpng needs? retrying with backoff",
                )),
            ),
            // Expired: a relist, not a problem.
            (
                watcher::Error::WatchError(Box::new(kube::core::Status {
                    code: 410,
                    ..kube::core::Status::default()
                })),
                None,
            ),
            // An unreachable server is the reachability layer's problem, not the watcher's.
            (
                watcher::Error::InitialListFailed(api(503, "ServiceUnavailable")),
                None,
            ),
        ];
        for (error, want) in cases {
            let health = InputHealth::default();
            let mut log = ErrorLog {
                health: health.clone(),
                ..ErrorLog::default()
            };
            log.error(Kind::Node, &error);
            let got: Vec<(String, String)> = health
                .state()
                .problems
                .into_iter()
                .map(|(what, p)| (what, p.message))
                .collect();
            let want: Vec<(String, String)> = want
                .iter()
                .map(|(w, m)| (w.to_string(), m.to_string()))
                .collect();
            assert_eq!(got, want, "{error:?}");
            log.progress(Kind::Node);
            assert!(health.state().problems.is_empty(), "progress clears it");
        }
    }
}
