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
//!
//! A list the API server answered (a 200) whose body then could not be read (cut short by a
//! proxy, the connection reset) or decoded is a problem of its own: the reachability layer
//! saw an answer and says nothing. It is logged once as a warning naming the kind and the
//! error, shown in `kpng status` and counted (`kpng_source_errors_total{reason}`) until a
//! list of that kind completes. A list with no complete answer after [`LIST_PATIENCE`] is
//! shown too ("waiting for the Service list"), whatever holds it up.

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
use crate::source_errors::{ListFailure, SourceErrors};
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

/// How long a list may go without a complete answer before `kpng status` says the source is
/// waiting for it: a list of tens of thousands of objects takes seconds, not this long.
pub const LIST_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// The `kube` source.
#[derive(Clone)]
pub struct KubeSource {
    client: kube::Client,
    config: SourceConfig,
    health: InputHealth,
    errors: SourceErrors,
    list_patience: std::time::Duration,
    /// A watcher's first and longest delay after an error ([`crate::backoff`]).
    retry_delays: (std::time::Duration, std::time::Duration),
    /// The client's reachability, probed while the source runs (`None`: no probe).
    reachability: Option<crate::reachability::Reachability>,
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
fn watch<K>(api: Api<K>, config: watcher::Config, source: &KubeSource) -> BoxStream<'static, Item>
where
    K: Resource + Convert + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64 ^ (K::KIND as u64).rotate_left(17))
        .unwrap_or(1);
    let items = crate::backoff::Backoff::new(watcher::watcher(api, config).boxed(), seed)
        .with_delays(source.retry_delays.0, source.retry_delays.1)
        .with_reachability(source.reachability.clone())
        .map(|result| Item {
            kind: K::KIND,
            result: result.map(translate),
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

/// A task that ends with the source.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
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
    /// The problem shown per kind; cleared (with a line saying so) when that watcher makes
    /// progress.
    last: HashMap<Kind, Shown>,
    /// Where each kind's problem is shown (`kpng status`) until that watcher makes progress.
    health: InputHealth,
    /// Lists that failed after their answer began, counted.
    errors: SourceErrors,
    /// The lists under way: since when each kind has been listing (its first attempt).
    lists: HashMap<Kind, PendingList>,
    /// How long a list may take before it is shown as a problem ([`LIST_PATIENCE`]).
    patience: std::time::Duration,
}

/// A list started and not done.
struct PendingList {
    /// When its first attempt began (kept across retries), for `kpng status`.
    since: std::time::SystemTime,
    /// The same, for the timer.
    started: tokio::time::Instant,
    /// Whether it is shown as a problem already.
    overdue: bool,
}

/// A watcher's problem as logged and shown: under which name (`<Kind> list` or
/// `<Kind> watch`), what it says, since when (for the line that says it is over).
struct Shown {
    what: String,
    message: String,
    since: std::time::SystemTime,
}

/// The API resource a kind is read from, as RBAC and `kubectl auth can-i` name it.
fn resource_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Service => "services",
        Kind::EndpointSlice => "endpointslices.discovery.k8s.io",
        Kind::Node => "nodes",
        Kind::ServiceCidr => "servicecidrs.networking.k8s.io",
    }
}

/// Who the API server says kpng is, from a 403's message (`… User "system:serviceaccount:
/// kube-system:kpng" cannot list …`): RBAC is granted to that name, and it is the one to
/// check, whatever the kubeconfig or token says.
fn forbidden_user(message: &str) -> Option<&str> {
    let (_, rest) = message.split_once("User \"")?;
    let (user, _) = rest.split_once('"')?;
    (!user.is_empty()).then_some(user)
}

/// What a 403 for `verb` on `kind` says to do: the permission RBAC lacks, for whom, and the
/// command that checks it (an operator should not have to work out the API group).
fn forbidden_advice(kind: Kind, verb: &str, message: &str) -> String {
    let resource = resource_name(kind);
    let (who, as_) = match forbidden_user(message) {
        Some(user) => (format!("kpng (\"{user}\")"), user.to_string()),
        None => (
            "kpng's service account".to_string(),
            "system:serviceaccount:<namespace>:<name>".to_string(),
        ),
    };
    format!(
        "{who} may not {verb} {resource}: grant list and watch on it (RBAC), check with \
         `kubectl auth can-i {verb} {resource} --as={as_}`"
    )
}

/// What a watcher's problem concerns, in `kpng status`.
fn watch_name(kind: Kind) -> String {
    format!("{} watch", kind.as_str())
}

/// What a list that takes too long concerns, in `kpng status`.
fn list_name(kind: Kind) -> String {
    format!("{} list", kind.as_str())
}

/// Why a list the API server answered failed, if that is what happened: the body could not
/// be read (hyper's error for the body, as kube passes it on) or decoded. A request that got
/// no answer, or a 5xx, is the reachability layer's (`None`).
fn list_failure(error: &kube::Error) -> Option<ListFailure> {
    match error {
        kube::Error::Service(e) if e.is::<hyper::Error>() => Some(ListFailure::Read),
        kube::Error::SerdeError(_) | kube::Error::FromUtf8(_) => Some(ListFailure::Decode),
        _ => None,
    }
}

/// An error with its causes (hyper's "error reading a body from connection" alone does not
/// say the body ended early).
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        let c_text = c.to_string();
        if !text.ends_with(&c_text) {
            text.push_str(": ");
            text.push_str(&c_text);
        }
        cause = c.source();
    }
    text
}

impl ErrorLog {
    fn progress(&mut self, kind: Kind) {
        // Per event: only a watcher that had a problem touches the shared record.
        if let Some(shown) = self.last.remove(&kind) {
            self.health.recovered(&shown.what);
            // The warning said it began; without this nothing says when it was fixed (a
            // refusal ends up to 30 s after RBAC allows it again, the backoff's wait).
            let now = std::time::SystemTime::now();
            info!(
                lasted_seconds = kpng_model::input::lasted_seconds(shown.since, now),
                "{} works again, the problem is over (it lasted {})",
                shown.what,
                kpng_model::input::lasted(shown.since, now)
            );
        }
    }

    /// Follows `kind`'s watcher through `event`: a list started, done (its problems are
    /// over), or a watch event (progress). A list's items and its restarts are not progress:
    /// a list that keeps failing must not clear, then warn again, at each attempt.
    fn event(&mut self, kind: Kind, event: &Event) {
        match event {
            Event::ListStart { .. } => {
                self.lists.entry(kind).or_insert_with(|| PendingList {
                    since: std::time::SystemTime::now(),
                    started: tokio::time::Instant::now(),
                    overdue: false,
                });
            }
            Event::ListDone { .. } => {
                if let Some(list) = self.lists.remove(&kind)
                    && list.overdue
                {
                    info!(
                        "the {} list is complete after {:.1?}",
                        kind.as_str(),
                        list.started.elapsed()
                    );
                    self.health.recovered(&list_name(kind));
                }
                self.progress(kind);
            }
            Event::ListItem(_) => {}
            // (Only the last two come from this source.)
            Event::Changes { .. } | Event::Replace { .. } | Event::Apply(_) | Event::Delete(_) => {
                self.progress(kind);
            }
        }
    }

    /// When the next list under way becomes overdue, if one is under way.
    fn next_overdue(&self) -> Option<tokio::time::Instant> {
        self.lists
            .values()
            .filter(|l| !l.overdue)
            .map(|l| l.started + self.patience)
            .min()
    }

    /// Shows every list under way for longer than the patience as a problem (once each).
    fn check_overdue(&mut self) {
        let now = tokio::time::Instant::now();
        for (kind, list) in &mut self.lists {
            if list.overdue || now < list.started + self.patience {
                continue;
            }
            list.overdue = true;
            if self.last.contains_key(kind) {
                // Its failure is shown already and says more than the wait.
                continue;
            }
            let what = kind.as_str();
            let problem = format!(
                "waiting for the {what} list: no complete answer for {}s; changes to {what}s \
                 wait for it, the programmed rules stay",
                (now - list.started).as_secs()
            );
            warn!("{problem}");
            self.health.failing(&list_name(*kind), &problem, list.since);
        }
    }

    fn error(&mut self, kind: Kind, e: &watcher::Error) {
        let what = kind.as_str();
        // A failed list is the list's problem (`kpng_input_problems_by_input{input="list"}`),
        // a failed watch the watch's.
        let (shown_as, verb) = match e {
            watcher::Error::InitialListFailed(_) => (list_name(kind), "list"),
            _ => (watch_name(kind), "watch"),
        };
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
            watcher::Error::InitialListFailed(e) if let Some(failure) = list_failure(e) => {
                // Every failed list counts; the warning is once per problem.
                self.errors.count(failure);
                match (failure, e) {
                    (_, kube::Error::SerdeError(e)) => format!(
                        "the {what} list does not decode: {e}; retrying, the programmed rules stay"
                    ),
                    (ListFailure::Decode, e) => format!(
                        "the {what} list does not decode: {e}; retrying, the programmed rules stay"
                    ),
                    (ListFailure::Read, e) => format!(
                        "the {what} list's answer could not be read ({}): cut short by a proxy \
                         or the connection? retrying, the programmed rules stay",
                        with_causes(e)
                    ),
                }
            }
            watcher::Error::InitialListFailed(kube::Error::Api(s))
            | watcher::Error::WatchStartFailed(kube::Error::Api(s))
            | watcher::Error::WatchFailed(kube::Error::Api(s))
                if s.code == 404 =>
            {
                format!(
                    "{what} {verb}: the API server does not serve this API (404 {}: {}); \
                     is it older than kpng needs? retrying with backoff",
                    s.reason, s.message
                )
            }
            watcher::Error::InitialListFailed(kube::Error::Api(s))
            | watcher::Error::WatchStartFailed(kube::Error::Api(s))
            | watcher::Error::WatchFailed(kube::Error::Api(s))
                if !(500..600).contains(&s.code) && s.code != 429 =>
            {
                // 401: who kpng is was not accepted; 403: what it may read (RBAC).
                let check = match s.code {
                    401 => "check kpng's credentials (the kubeconfig's or service account's \
                            token or client certificate)"
                        .to_string(),
                    403 => forbidden_advice(kind, verb, &s.message),
                    _ => format!(
                        "check kpng's permissions (RBAC: list and watch {})",
                        resource_name(kind)
                    ),
                };
                format!(
                    "{what} {verb} refused: {} {} ({}); {check}",
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
                // Connection problems, 5xx and 429: the client's reachability layer logs the
                // outage once; each attempt is only a debug line.
                debug!("{what} watch: {other}");
                return;
            }
        };
        let same = self
            .last
            .get(&kind)
            .is_some_and(|s| s.what == shown_as && s.message == problem);
        if same {
            debug!("{problem}");
            return;
        }
        warn!("{problem}");
        let now = std::time::SystemTime::now();
        // A problem that changes (a list refused, then its watch) keeps when it began.
        let since = match self.last.remove(&kind) {
            Some(earlier) if earlier.what == shown_as => earlier.since,
            Some(earlier) => {
                self.health.recovered(&earlier.what);
                earlier.since
            }
            None => now,
        };
        self.health.failing(&shown_as, &problem, since);
        self.last.insert(
            kind,
            Shown {
                what: shown_as,
                message: problem,
                since,
            },
        );
    }
}

impl KubeSource {
    /// A source reading through `client`.
    pub fn new(client: kube::Client, config: SourceConfig) -> KubeSource {
        KubeSource {
            client,
            config,
            health: InputHealth::default(),
            errors: SourceErrors::default(),
            list_patience: LIST_PATIENCE,
            retry_delays: (crate::backoff::MIN, crate::backoff::MAX),
            reachability: None,
        }
    }

    /// Probes the API server through the client while the source runs
    /// ([`crate::reachability::Reachability::keep_alive`]): a watch that was streaming when
    /// the server hung is resumed seconds after it answers again, not after the idle timeout.
    /// `reachability` must be the client's ([`crate::Connection`]).
    pub fn with_reachability(
        mut self,
        reachability: crate::reachability::Reachability,
    ) -> KubeSource {
        self.reachability = Some(reachability);
        self
    }

    /// Counts lists whose answer could not be read or decoded in `errors`
    /// (`kpng_source_errors_total`).
    pub fn with_errors(mut self, errors: SourceErrors) -> KubeSource {
        self.errors = errors;
        self
    }

    /// How long a list may go without a complete answer before `kpng status` shows it
    /// (`LIST_PATIENCE` unless changed; tests shorten it).
    pub fn with_list_patience(mut self, patience: std::time::Duration) -> KubeSource {
        self.list_patience = patience;
        self
    }

    /// A watcher's first and longest delay after an error (0.8 s doubling to 30 s unless
    /// changed): tests make a delay long at once instead of failing for a minute first.
    pub fn with_retry_delays(
        mut self,
        first: std::time::Duration,
        longest: std::time::Duration,
    ) -> KubeSource {
        self.retry_delays = (first, longest.max(first));
        self
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
                self,
            ),
            watch(
                Api::<Slim<EndpointSlice>>::all(self.client.clone()),
                labelled,
                self,
            ),
            watch(Api::<Slim<Node>>::all(self.client.clone()), node, self),
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
        // On a task of its own: a model slow to take events must not delay the probes.
        let _probe = self.reachability.clone().map(|r| {
            use tracing::Instrument;
            use tracing::instrument::WithSubscriber;
            AbortOnDrop(tokio::spawn(
                r.keep_alive(self.client.clone())
                    .in_current_span()
                    .with_current_subscriber(),
            ))
        });
        let mut streams = self.streams();
        let mut discovery = serves_service_cidrs(self.client.clone()).boxed().fuse();
        let mut log = ErrorLog {
            health: self.health.clone(),
            errors: self.errors.clone(),
            patience: self.list_patience,
            ..ErrorLog::default()
        };
        loop {
            tokio::select! {
                item = streams.next() => {
                    // The watchers never end; an empty stream would mean none is left.
                    let Some(Item { kind, result }) = item else { return };
                    match result {
                        Ok(event) => {
                            log.event(kind, &event);
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
                            &self,
                        ));
                    } else {
                        info!("the API server serves no ServiceCIDRs: only --service-cidr ranges are dropped");
                    }
                }
                () = async {
                    match log.next_overdue() {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => log.check_overdue(),
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
        let undecodable = || {
            let Err(e) = serde_json::from_str::<u8>("x") else {
                unreachable!("not a number")
            };
            e
        };
        let cases: [(watcher::Error, Option<(&str, &str)>); 7] = [
            // A list answered whose body does not decode: a problem of its own.
            (
                watcher::Error::InitialListFailed(kube::Error::SerdeError(undecodable())),
                Some((
                    "Node list",
                    "the Node list does not decode: expected value at line 1 column 1; retrying, the programmed rules stay",
                )),
            ),
            // A refused list is the list's problem; it names the resource, who kpng is (as the
            // server says) and the command that checks.
            (
                watcher::Error::InitialListFailed(api(403, "Forbidden")),
                Some((
                    "Node list",
                    "Node list refused: 403 Forbidden (the server says why); kpng's service account may not list nodes: grant list and watch on it (RBAC), check with `kubectl auth can-i list nodes --as=system:serviceaccount:<namespace>:<name>`",
                )),
            ),
            (
                watcher::Error::WatchStartFailed(kube::Error::Api(Box::new(kube::core::Status {
                    code: 403,
                    reason: "Forbidden".into(),
                    message: "endpointslices.discovery.k8s.io is forbidden: User \"system:serviceaccount:kube-system:kpng\" cannot watch resource \"endpointslices\" in API group \"discovery.k8s.io\" at the cluster scope".into(),
                    ..kube::core::Status::default()
                }))),
                Some((
                    "Node watch",
                    "Node watch refused: 403 Forbidden (endpointslices.discovery.k8s.io is forbidden: User \"system:serviceaccount:kube-system:kpng\" cannot watch resource \"endpointslices\" in API group \"discovery.k8s.io\" at the cluster scope); kpng (\"system:serviceaccount:kube-system:kpng\") may not watch nodes: grant list and watch on it (RBAC), check with `kubectl auth can-i watch nodes --as=system:serviceaccount:kube-system:kpng`",
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
                    "Node list",
                    "Node list: the API server does not serve this API (404 NotFound: the server says why); is it older than kpng needs? retrying with backoff",
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
            // A list starting again (each retry) is not progress; one that completes is.
            log.event(
                Kind::Node,
                &Event::ListStart {
                    kinds: vec![Kind::Node],
                },
            );
            assert_eq!(health.state().problems.len(), want.len(), "{error:?}");
            log.event(
                Kind::Node,
                &Event::ListDone {
                    kinds: vec![Kind::Node],
                },
            );
            assert!(health.state().problems.is_empty(), "progress clears it");
        }
    }

    /// A list that fails after its answer began counts once per attempt and warns once:
    /// its retries do not clear the problem, its completion does.
    #[test]
    fn a_failing_list_counts_each_attempt_and_is_one_problem() {
        let health = InputHealth::default();
        let errors = SourceErrors::default();
        let mut log = ErrorLog {
            health: health.clone(),
            errors: errors.clone(),
            ..ErrorLog::default()
        };
        let undecodable = || match serde_json::from_str::<u8>("x") {
            Err(e) => watcher::Error::InitialListFailed(kube::Error::SerdeError(e)),
            Ok(_) => unreachable!("not a number"),
        };
        for _ in 0..3 {
            log.event(
                Kind::Service,
                &Event::ListStart {
                    kinds: vec![Kind::Service],
                },
            );
            log.error(Kind::Service, &undecodable());
        }
        assert_eq!(errors.get(ListFailure::Decode), 3);
        assert_eq!(health.state().problems.len(), 1);
        log.event(
            Kind::Service,
            &Event::ListDone {
                kinds: vec![Kind::Service],
            },
        );
        assert!(health.state().problems.is_empty());
    }

    /// A list under way past the patience is shown from its first attempt, once, until it
    /// completes.
    #[tokio::test(start_paused = true)]
    async fn a_list_without_an_answer_past_the_patience_is_shown_until_done() {
        let health = InputHealth::default();
        let mut log = ErrorLog {
            health: health.clone(),
            patience: std::time::Duration::from_secs(30),
            ..ErrorLog::default()
        };
        assert_eq!(log.next_overdue(), None, "nothing under way");
        let started = tokio::time::Instant::now();
        log.event(
            Kind::Service,
            &Event::ListStart {
                kinds: vec![Kind::Service],
            },
        );
        tokio::time::advance(std::time::Duration::from_secs(10)).await;
        // A retry keeps the first attempt's start.
        log.event(
            Kind::Service,
            &Event::ListStart {
                kinds: vec![Kind::Service],
            },
        );
        let due = started + std::time::Duration::from_secs(30);
        assert_eq!(log.next_overdue(), Some(due));
        log.check_overdue();
        assert!(health.state().problems.is_empty(), "not yet");
        tokio::time::advance(std::time::Duration::from_secs(20)).await;
        log.check_overdue();
        let problems = health.state().problems;
        let message = &problems["Service list"].message;
        assert!(
            message.starts_with("waiting for the Service list: no complete answer for 30s"),
            "{message}"
        );
        assert_eq!(log.next_overdue(), None, "shown once");
        log.event(
            Kind::Service,
            &Event::ListDone {
                kinds: vec![Kind::Service],
            },
        );
        assert!(health.state().problems.is_empty());
    }

    /// A list refused (or failing) past the patience keeps saying why: the wait would hide
    /// the refusal behind "waiting for the list"; it is still checked once only.
    #[tokio::test(start_paused = true)]
    async fn a_failing_list_past_the_patience_keeps_its_reason() {
        let health = InputHealth::default();
        let mut log = ErrorLog {
            health: health.clone(),
            patience: std::time::Duration::from_secs(30),
            ..ErrorLog::default()
        };
        let start = Event::ListStart {
            kinds: vec![Kind::EndpointSlice],
        };
        log.event(Kind::EndpointSlice, &start);
        log.error(
            Kind::EndpointSlice,
            &watcher::Error::InitialListFailed(api(403, "Forbidden")),
        );
        tokio::time::advance(std::time::Duration::from_secs(31)).await;
        log.check_overdue();
        assert_eq!(log.next_overdue(), None, "checked once");
        let problems = health.state().problems;
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems["EndpointSlice list"].message.contains(
                "may not list endpointslices.discovery.k8s.io: grant list and watch on it (RBAC)"
            ),
            "{problems:?}"
        );
        log.event(
            Kind::EndpointSlice,
            &Event::ListDone {
                kinds: vec![Kind::EndpointSlice],
            },
        );
        assert!(health.state().problems.is_empty());
    }
}
