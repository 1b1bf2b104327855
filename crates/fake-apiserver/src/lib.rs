//! A small Kubernetes API server for tests, speaking the real HTTP protocol for Services,
//! EndpointSlices, Nodes and ServiceCIDRs.
//!
//! No API server can be installed where kpng's tests run, so this one stands in for it. It is
//! not a mock of a client library: any Kubernetes client talks to it over plain HTTP (write a
//! kubeconfig with [`FakeApiServer::write_kubeconfig`]) and gets what a real API server sends:
//!
//! - discovery (`/api`, `/apis`, `/api/v1`, `/apis/GROUP/VERSION`, `/version`);
//! - lists with a `resourceVersion`, `limit`/`continue` pagination (every object once, in
//!   namespace/name order; later pages show objects as they are now, where the real server
//!   shows them at the first page's revision), label and field selectors
//!   (`metadata.name`, `metadata.namespace`), items without `kind`/`apiVersion`;
//! - chunked watch streams of `WatchEvent` JSON lines (`ADDED`/`MODIFIED`/`DELETED` with
//!   `kind` and `apiVersion` set, objects entering or leaving a selector as `ADDED`/`DELETED`),
//!   `BOOKMARK` events when `allowWatchBookmarks=true`, `timeoutSeconds`, and an `ERROR` event
//!   with a `410 Gone` `Status` (reason `Expired`) for a resourceVersion older than the history;
//! - counters of what it answered and sent ([`FakeApiServer::load`]: requests, list pages,
//!   watches, bytes, open watch streams), as an API server's own metrics would show them;
//! - `Status` objects for every error (`404`, `400` for a bad selector, `410` for an expired
//!   list continuation).
//!
//! Tests then drive the situations a proxy must survive: [`FakeApiServer::drop_watches`]
//! (connections cut mid-stream), [`FakeApiServer::expire_watches`] (410, so clients relist),
//! [`FakeApiServer::stop`] / [`FakeApiServer::restart`] (an outage: connections refused, on
//! the same port afterwards), [`FakeApiServer::stall`] (a hung server: connections open, no
//! answer), [`FakeApiServer::fail`] (5xx and 429 answers, with a `Retry-After` if asked),
//! [`FakeApiServer::forbid`] (one resource refused with 403, as a missing RBAC rule),
//! [`FakeApiServer::truncate`] (list bodies cut short), [`FakeApiServer::delay`] (latency),
//! and objects no validation would let through.
//!
//! The server runs on its own small runtime, so plain `#[test]`s and async tests can both use
//! it; every method is synchronous.

mod http;
mod resource;
mod selector;
mod store;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::Value;

pub use http::{RequestRecord, ServerConfig, ServerLoad};
pub use resource::Resource;
pub use selector::{FieldSelector, LabelSelector};
pub use store::StoreError;

use http::Shared;
use store::{Notice, Store};

/// Why the fake could not do what a test asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store refused an object.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A fault a test asked for cannot be made (not an HTTP status code).
    #[error("fault: {0}")]
    Fault(String),
    /// A manifest was not YAML.
    #[error("manifest: {0}")]
    Yaml(String),
    /// Binding or running the server failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// Most YAML documents a manifest may hold: the parser's default (1,024) refused the 5,000
/// Services of a scale test; this is a test tool, bounded only against a runaway generator.
pub const MAX_MANIFEST_DOCUMENTS: usize = 1_000_000;

/// The YAML parser's limits for manifests, sized for clusters of tens of thousands of
/// objects (the defaults stop at 1,024 documents and 250,000 nodes).
fn manifest_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_documents: MAX_MANIFEST_DOCUMENTS,
            max_nodes: 100_000_000,
            max_events: 400_000_000,
            max_total_scalar_bytes: 1 << 30,
            max_reader_input_bytes: Some(1 << 30),
        },
    }
}

/// Configures a [`FakeApiServer`] before it starts.
#[derive(Debug, Clone)]
pub struct Builder {
    config: ServerConfig,
}

impl Builder {
    /// Whether `networking.k8s.io/v1` serves `servicecidrs` (default: yes, as Kubernetes
    /// ≥ 1.33). Off, the resource is absent from discovery and its paths are `404`, as on an
    /// older cluster.
    pub fn service_cidrs(mut self, served: bool) -> Builder {
        self.config.service_cidrs = served;
        self
    }

    /// How often watches that allow bookmarks get one (default 1 s; `None`: only when the
    /// test calls [`FakeApiServer::bookmark`]).
    pub fn bookmark_interval(mut self, every: Option<Duration>) -> Builder {
        self.config.bookmark_interval = every;
        self
    }

    /// Starts the server on a free port of 127.0.0.1.
    pub fn start(self) -> Result<FakeApiServer, Error> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fake-apiserver")
            .enable_all()
            .build()
            .map_err(|source| Error::Io {
                context: "starting the fake API server's runtime",
                source,
            })?;
        let mut server = FakeApiServer {
            shared: Arc::new(Shared {
                store: Mutex::new(Store::default()),
                config: self.config,
                requests: Mutex::new(Vec::new()),
                down: AtomicBool::new(false),
                forbidden: Mutex::default(),
                missing: Mutex::default(),
                events: Mutex::default(),
                events_forbidden: AtomicBool::new(false),
                stalled: AtomicBool::new(false),
                faults: Mutex::default(),
                counters: Arc::default(),
            }),
            runtime: Some(runtime),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            running: None,
        };
        server.serve()?;
        Ok(server)
    }
}

/// The server while it accepts connections.
#[derive(Debug)]
struct Running {
    shutdown: tokio::sync::oneshot::Sender<()>,
    done: std::sync::mpsc::Receiver<()>,
}

/// A running fake API server. Dropping it stops it.
#[derive(Debug)]
pub struct FakeApiServer {
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
    addr: SocketAddr,
    running: Option<Running>,
}

impl FakeApiServer {
    /// A builder, to change the defaults.
    pub fn builder() -> Builder {
        Builder {
            config: ServerConfig {
                service_cidrs: true,
                bookmark_interval: Some(Duration::from_secs(1)),
            },
        }
    }

    /// Starts a server with the defaults.
    pub fn start() -> Result<FakeApiServer, Error> {
        FakeApiServer::builder().start()
    }

    fn serve(&mut self) -> Result<(), Error> {
        let Some(runtime) = self.runtime.as_ref() else {
            return Ok(());
        };
        let io = |context| move |source| Error::Io { context, source };
        let _context = runtime.enter();
        // SO_REUSEADDR: a restart binds the same port although closed connections linger.
        let socket =
            tokio::net::TcpSocket::new_v4().map_err(io("creating the listening socket"))?;
        socket
            .set_reuseaddr(true)
            .map_err(io("setting SO_REUSEADDR"))?;
        socket.bind(self.addr).map_err(io("binding 127.0.0.1"))?;
        let listener = socket.listen(128).map_err(io("listening"))?;
        self.addr = listener
            .local_addr()
            .map_err(io("reading the bound address"))?;
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done) = std::sync::mpsc::channel();
        let router = http::router(self.shared.clone());
        runtime.spawn(async move {
            let serve = axum::serve(listener, router).with_graceful_shutdown(async move {
                let _ = shutdown_rx.await;
            });
            if let Err(e) = serve.await {
                tracing::warn!("fake API server stopped: {e}");
            }
            let _ = done_tx.send(());
        });
        self.running = Some(Running { shutdown, done });
        Ok(())
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig for this server (plain HTTP, a bearer token the requests carry).
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             users:\n- name: kpng\n  user:\n    token: fake-token\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: kpng\n\
             current-context: fake\n",
            self.url()
        )
    }

    /// Writes [`FakeApiServer::kubeconfig`] to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), Error> {
        std::fs::write(path, self.kubeconfig()).map_err(|source| Error::Io {
            context: "writing the kubeconfig",
            source,
        })
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.shared.store()
    }

    /// Creates or updates one object (by `kind`, namespace and name); returns its new
    /// resourceVersion. Only identity is checked: anything else is stored as given.
    pub fn apply(&self, object: Value) -> Result<u64, Error> {
        Ok(self.store().apply(object)?)
    }

    /// Applies every document of a YAML stream (`kind: List` documents item by item);
    /// returns the last resourceVersion.
    pub fn apply_manifest(&self, yaml: &str) -> Result<u64, Error> {
        let docs: Vec<Value> = serde_saphyr::from_multiple_with_options(yaml, manifest_options())
            .map_err(|e| Error::Yaml(e.to_string()))?;
        let mut rv = self.resource_version();
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            match doc.get("items").and_then(Value::as_array) {
                Some(items) => {
                    for item in items {
                        rv = self.apply(item.clone())?;
                    }
                }
                None => rv = self.apply(doc)?,
            }
        }
        Ok(rv)
    }

    /// Deletes one object; returns the delete's resourceVersion.
    pub fn delete(&self, kind: &str, namespace: &str, name: &str) -> Result<u64, Error> {
        Ok(self.store().delete(kind, namespace, name)?)
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.store().rv()
    }

    /// Forgets the change history (an etcd compaction): watches resuming from any
    /// resourceVersion a client holds get `410 Gone` and must relist.
    pub fn compact(&self) {
        self.store().compact();
    }

    /// Compacts and ends every open watch with an `ERROR` event, `410 Gone` (reason
    /// `Expired`), as the API server does to a watcher too far behind: clients relist.
    pub fn expire_watches(&self) {
        let mut store = self.store();
        store.compact();
        store.notify(Notice::Expire);
    }

    /// Sends a `BOOKMARK` now on every watch that allows bookmarks.
    pub fn bookmark(&self) {
        self.store().notify(Notice::Bookmark);
    }

    /// Cuts every open watch connection mid-stream (no clean end of the chunked body).
    pub fn drop_watches(&self) {
        self.store().notify(Notice::Drop);
    }

    /// A hung server (`true`): every open watch goes silent for good with its connection left
    /// open, and every request from now on is accepted and never answered, until `false`
    /// (connections hung meanwhile stay hung: only new requests are answered again).
    pub fn stall(&self, stalled: bool) {
        self.shared.stalled.store(stalled, Ordering::SeqCst);
        if stalled {
            self.store().notify(Notice::Stall);
        }
    }

    /// Answers the next `count` requests (any path, even while stalled) with status `code`
    /// and a `Status` body, as an overloaded API server (500, 503) or a proxy in front of it
    /// (502, 504) does. `count` 0 stops failing. A code that is not an HTTP status is refused.
    pub fn fail(&self, code: u16, count: u64) -> Result<(), Error> {
        self.fail_retry_after(code, count, None)
    }

    /// [`FakeApiServer::fail`], each answer with `Retry-After: SECONDS` when `retry_after`
    /// is given: API Priority and Fairness sends one with its 429s, and a client should wait
    /// that long before it asks again.
    pub fn fail_retry_after(
        &self,
        code: u16,
        count: u64,
        retry_after: Option<u64>,
    ) -> Result<(), Error> {
        let code =
            axum::http::StatusCode::from_u16(code).map_err(|e| Error::Fault(e.to_string()))?;
        let mut faults = self.shared.faults();
        faults.fail = (count > 0).then_some((code, count));
        faults.retry_after = retry_after;
        Ok(())
    }

    /// Cuts every list answer longer than `bytes` after that many bytes of its body and
    /// aborts its connection (the status and headers were sent: a 200), as a proxy or load
    /// balancer that gives up mid-answer does; `None` sends whole lists again.
    pub fn truncate(&self, bytes: Option<usize>) {
        self.shared.faults().truncate = bytes;
    }

    /// Makes every request wait `delay` before it is answered (`None`: no wait), as a slow
    /// or distant API server.
    pub fn delay(&self, delay: Option<Duration>) {
        self.shared.faults().delay = delay;
    }

    /// An outage: stops accepting connections and closes every open one. The objects stay
    /// and can still be changed; [`FakeApiServer::restart`] serves them again on the same
    /// port.
    pub fn stop(&mut self) {
        let Some(running) = self.running.take() else {
            return;
        };
        self.shared.down.store(true, Ordering::SeqCst);
        let _ = running.shutdown.send(());
        // Connections close at once: idle ones by the graceful shutdown, watches by the drop,
        // requests racing with it by `down`. Repeat the drop for watches that were starting.
        for _ in 0..100 {
            self.store().notify(Notice::Drop);
            if running
                .done
                .recv_timeout(Duration::from_millis(100))
                .is_ok()
            {
                break;
            }
        }
    }

    /// Ends an outage: serves again on the same address.
    pub fn restart(&mut self) -> Result<(), Error> {
        if self.running.is_some() {
            return Ok(());
        }
        self.shared.down.store(false, Ordering::SeqCst);
        self.serve()
    }

    /// Refuses every request for `resource` with `403 Forbidden` (as a missing RBAC rule does),
    /// or serves it again.
    pub fn forbid(&self, resource: Resource, forbidden: bool) {
        let mut set = self
            .shared
            .forbidden
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if forbidden {
            set.insert(resource);
        } else {
            set.remove(&resource);
        }
    }

    /// Refuses every Event post with `403 Forbidden` (as without the RBAC rule for Events), or
    /// accepts them again.
    pub fn forbid_events(&self, forbidden: bool) {
        self.shared
            .events_forbidden
            .store(forbidden, Ordering::SeqCst);
    }

    /// Answers every request for `resource` with `404 Not Found` (as a server that does not
    /// serve that API), or serves it again.
    pub fn not_found(&self, resource: Resource, missing: bool) {
        let mut set = self
            .shared
            .missing
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if missing {
            set.insert(resource);
        } else {
            set.remove(&resource);
        }
    }

    /// Whether the server accepts connections.
    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// Every Event clients created (`events.k8s.io/v1`), with their later patches applied.
    pub fn events(&self) -> Vec<Value> {
        self.shared
            .events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// What the server has answered and sent so far (requests, list pages, watches, bytes)
    /// and the watch streams open now: the API server's side of a load comparison.
    pub fn load(&self) -> ServerLoad {
        self.shared.counters.snapshot()
    }

    /// Every request answered so far, in order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.stop();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
