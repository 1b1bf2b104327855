//! A remote brain as a source: `kpng local --api ADDR …` and `kpng api --api ADDR …`.
//!
//! [`watch`] keeps one Watch stream open (reconnecting with jittered backoff), applies the ops
//! to a [`WireState`] and, at every `Sync`, hands the runner a [`RemoteUpdate`] with the
//! Services the change set touched, decoded back into model ports. The runner's model is a
//! [`RemoteModel`]: it compares those ports with what the backend already has, so
//! - a backend keeps its rules while the brain is away (nothing is sent, nothing changes);
//! - the `Reset` replay after a reconnect becomes a minimal diff: unchanged Services produce
//!   no change at all, Services that vanished meanwhile are removed.
//!
//! The runner's change counters come from the stream: every `Service` value set or deleted is
//! a Service change, every `Endpoint` value an endpoint change. The brain forwards no
//! EndpointSlice trigger times, so `kubeproxy_network_programming_duration_seconds` is observed
//! only where the Kubernetes objects are seen (an in-process `kube` source), not on API nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;

use hyper_util::rt::TokioIo;
use kpng_backend::{InputInfo, NodeModel};
use kpng_model::input::InputHealth;
use kpng_model::{
    ApplyOutcome, Diff, Kind, NodeChange, NodeChanges, NodeMemory, NodeState, ServiceKey,
    ServicePort, Snapshot,
};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tracing::{debug, info, warn};

use crate::addr::{ApiAddr, TlsFiles};
use crate::convert::{DecodeError, decode_node, decode_service, decode_service_cidrs};
use crate::proto;
use crate::proto::op_item::Op;
use crate::proto::sets_client::SetsClient;

pub mod hold;

use hold::{EmptyStateHold, Programmed, Verdict};

/// One change set, decoded: what the runner applies.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RemoteUpdate {
    /// The node's properties, when they were sent.
    pub node: Option<NodeState>,
    /// The cluster's ServiceCIDR ranges, when they were sent (or reset).
    pub service_cidrs: Option<Vec<IpNet>>,
    /// Every touched Service with all its ports now (empty: the Service is gone).
    pub services: Vec<(ServiceKey, Vec<ServicePort>)>,
    /// Services whose `Service` value was set or deleted (kube-proxy's Service changes).
    pub service_changes: Vec<ServiceKey>,
    /// `Endpoint` values set or deleted (kube-proxy's endpoint changes).
    pub endpoint_changes: usize,
    /// The change set began with a `Reset`: the brain's whole state for this node, replayed.
    pub replay: bool,
}

/// The node-local state received from a brain, as the runner's model.
///
/// The brain sends the node's Node as it is now; this node keeps its last IPs and pod CIDRs
/// when the Node is deleted or stops listing them, and falls back to every local address for
/// NodePorts when the runner's wait for node IPs ends with none, through the same
/// [`NodeMemory`] as the in-process model. The keeping is the node's, not the brain's: it
/// survives a brain restart (the replay sends the Node as it is), and, as with kube-proxy or an
/// in-process kpng, a node restarted while its Node is deleted starts without node IPs.
#[derive(Debug, Default)]
pub struct RemoteModel {
    snapshot: Snapshot,
    node_ips: Vec<IpAddr>,
    /// The node as the brain last sent it (before [`NodeMemory`] and `--node-ip`).
    received_node: NodeState,
    memory: NodeMemory,
    listed: bool,
}

impl RemoteModel {
    /// An empty state for node `node_name`; `node_ips` (`--node-ip`) replace the node's
    /// address of their family, as in the in-process model.
    pub fn new(node_name: &str, node_ips: Vec<IpAddr>) -> RemoteModel {
        let received_node = NodeState {
            name: node_name.to_string(),
            ..NodeState::default()
        };
        let mut memory = NodeMemory::default();
        let snapshot = Snapshot {
            node: memory.view(&received_node, &node_ips),
            ..Snapshot::default()
        };
        RemoteModel {
            snapshot,
            node_ips,
            received_node,
            memory,
            listed: false,
        }
    }

    /// Sets the node from what the brain sent last and what this node remembers; what that
    /// changed (for the backends, or in the node's status only).
    fn refresh_node(&mut self) -> (NodeChange, NodeChanges) {
        let node = self.memory.view(&self.received_node, &self.node_ips);
        let changes = NodeChanges::between(&self.snapshot.node, &node);
        (self.snapshot.node.replace(node), changes)
    }
}

impl NodeModel for RemoteModel {
    type Input = RemoteUpdate;

    fn describe(update: &RemoteUpdate) -> InputInfo {
        // No Kubernetes object reaches this node: only the change counters move.
        InputInfo {
            service_changes: update.service_changes.len() as u64,
            endpoint_changes: update.endpoint_changes as u64,
            ..InputInfo::default()
        }
    }

    fn apply(&mut self, update: RemoteUpdate) -> ApplyOutcome {
        let mut diff = Diff::default();
        let mut node_status_changed = false;
        if let Some(node) = update.node {
            self.received_node = node;
            match self.refresh_node() {
                (NodeChange::None, _) => {}
                (NodeChange::Status, _) => node_status_changed = true,
                (NodeChange::Programmed, changes) => {
                    diff.node_changed = true;
                    diff.node_changes.merge(changes);
                }
            }
        }
        if let Some(cidrs) = update.service_cidrs
            && cidrs != self.snapshot.service_cidrs
        {
            self.snapshot.service_cidrs = cidrs;
            diff.node_changed = true;
            diff.node_changes.service_cidrs = true;
        }
        for (key, ports) in update.services {
            self.snapshot.replace_service(&key, ports, &mut diff);
        }
        if update.replay {
            let changed: BTreeSet<&ServiceKey> = diff.changes.keys().map(|k| &k.service).collect();
            info!(
                node_changed = diff.node_changed,
                "brain state replayed: {} Services changed",
                changed.len()
            );
        }
        let mut listed = Vec::new();
        if !self.listed {
            // The first complete change set is the whole cluster as far as this node goes.
            self.listed = true;
            listed = vec![Kind::Service, Kind::EndpointSlice, Kind::Node];
        }
        ApplyOutcome {
            diff,
            node_status_changed,
            listed,
            services_changed: update.service_changes,
            slices_changed: update.endpoint_changes,
            ..ApplyOutcome::default()
        }
    }

    fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    fn fed_by_brain(&self) -> bool {
        true
    }

    fn give_up_waiting_for_node_ips(&mut self) -> Diff {
        self.memory.give_up_waiting_for_ips();
        // Only `nodeports_on_all_local` can change, a programmed value.
        let (change, node_changes) = self.refresh_node();
        let node_changed = change == NodeChange::Programmed;
        Diff {
            node_changed,
            node_changes: if node_changed {
                node_changes
            } else {
                NodeChanges::default()
            },
            ..Diff::default()
        }
    }
}

/// The values received so far, by path, and what the current change set touched.
#[derive(Debug, Default)]
pub struct WireState {
    services: BTreeMap<ServiceKey, proto::Service>,
    endpoints: BTreeMap<ServiceKey, BTreeMap<String, proto::Endpoint>>,
    node: Option<NodeState>,
    service_cidrs: Vec<IpNet>,
    touched: BTreeSet<ServiceKey>,
    node_touched: bool,
    service_cidrs_touched: bool,
    /// The brain's report on its own input (`None`: it sent none since the last `Reset`).
    brain_report: Option<proto::KpngBrainReport>,
    brain_report_touched: bool,
    service_changes: BTreeSet<ServiceKey>,
    endpoint_changes: usize,
    reset: bool,
}

fn bad_path(path: &str, set: &str) -> DecodeError {
    DecodeError {
        what: format!("{set} {path:?}"),
        field: "Ref.Path".into(),
        message: "not the path of a value of this set".into(),
    }
}

fn service_path(path: &str) -> Result<ServiceKey, DecodeError> {
    match path.split('/').collect::<Vec<_>>()[..] {
        [ns, name] if !ns.is_empty() && !name.is_empty() => Ok(ServiceKey::new(ns, name)),
        _ => Err(bad_path(path, "Service")),
    }
}

fn endpoint_path(path: &str) -> Result<(ServiceKey, String), DecodeError> {
    match path.split('/').collect::<Vec<_>>()[..] {
        [ns, name, key] if !ns.is_empty() && !name.is_empty() && !key.is_empty() => {
            Ok((ServiceKey::new(ns, name), key.to_string()))
        }
        _ => Err(bad_path(path, "Endpoint")),
    }
}

fn decode_error(what: &str, path: &str, e: prost::DecodeError) -> DecodeError {
    DecodeError {
        what: format!("{what} {path}"),
        field: "Value.Bytes".into(),
        message: e.to_string(),
    }
}

impl WireState {
    /// Applies one op; `Ok(true)` at `Sync` (the change set is complete). A bad value is an
    /// error and is not applied; the rest of the change set still is.
    pub fn apply(&mut self, item: proto::OpItem) -> Result<bool, DecodeError> {
        match item.op {
            Some(Op::Sync(_)) => return Ok(true),
            Some(Op::Reset(_)) => {
                // Everything known is touched: what is not sent again before Sync is gone.
                self.touched.extend(self.services.keys().cloned());
                self.touched.extend(self.endpoints.keys().cloned());
                self.services.clear();
                self.endpoints.clear();
                self.service_cidrs.clear();
                self.service_cidrs_touched = true;
                self.brain_report = None;
                self.brain_report_touched = true;
                self.reset = true;
            }
            Some(Op::Set(value)) => {
                let r = value.r#ref.unwrap_or_default();
                match proto::Set::try_from(r.set) {
                    Ok(proto::Set::ServicesSet) => {
                        let key = service_path(&r.path)?;
                        let service = proto::Service::decode(value.bytes)
                            .map_err(|e| decode_error("Service", &r.path, e))?;
                        self.services.insert(key.clone(), service);
                        self.touched.insert(key.clone());
                        self.service_changes.insert(key);
                    }
                    Ok(proto::Set::EndpointsSet) => {
                        let (key, ep_key) = endpoint_path(&r.path)?;
                        let endpoint = proto::Endpoint::decode(value.bytes)
                            .map_err(|e| decode_error("Endpoint", &r.path, e))?;
                        self.endpoints
                            .entry(key.clone())
                            .or_default()
                            .insert(ep_key, endpoint);
                        self.touched.insert(key);
                        self.endpoint_changes += 1;
                    }
                    Ok(proto::Set::KpngNodeSet) => {
                        let node = proto::KpngNode::decode(value.bytes)
                            .map_err(|e| decode_error("Node", &r.path, e))?;
                        self.node = Some(decode_node(&node)?);
                        self.node_touched = true;
                    }
                    Ok(proto::Set::KpngServiceCidRsSet) => {
                        let value = proto::KpngServiceCidRs::decode(value.bytes)
                            .map_err(|e| decode_error("ServiceCIDRs", &r.path, e))?;
                        self.service_cidrs = decode_service_cidrs(&value)?;
                        self.service_cidrs_touched = true;
                    }
                    Ok(proto::Set::KpngBrainReportSet) => {
                        let value = proto::KpngBrainReport::decode(value.bytes)
                            .map_err(|e| decode_error("brain report", &r.path, e))?;
                        self.brain_report = Some(value);
                        self.brain_report_touched = true;
                    }
                    // Sets we do not watch.
                    _ => {}
                }
            }
            Some(Op::Delete(r)) => match proto::Set::try_from(r.set) {
                Ok(proto::Set::ServicesSet) => {
                    let key = service_path(&r.path)?;
                    self.services.remove(&key);
                    self.endpoints.remove(&key);
                    self.touched.insert(key.clone());
                    self.service_changes.insert(key);
                }
                Ok(proto::Set::EndpointsSet) => {
                    let (key, ep_key) = endpoint_path(&r.path)?;
                    if let Some(eps) = self.endpoints.get_mut(&key) {
                        if eps.remove(&ep_key).is_some() {
                            self.endpoint_changes += 1;
                        }
                        if eps.is_empty() {
                            self.endpoints.remove(&key);
                        }
                    }
                    self.touched.insert(key);
                }
                _ => {}
            },
            // Opened by the session ([`crate::bundle::unbundle`]) before its ops come here.
            Some(Op::Bundle(_)) => {
                return Err(DecodeError {
                    what: "a bundle".into(),
                    field: "OpItem.Bundle".into(),
                    message: "bundles are opened before their ops are applied".into(),
                });
            }
            None => {}
        }
        Ok(false)
    }

    /// The brain's report on its own input, when a `Reset` or a new report changed it since
    /// the last call (`Some(None)`: the brain reports nothing).
    pub fn take_brain_report(&mut self) -> Option<Option<kpng_model::input::BrainReport>> {
        std::mem::take(&mut self.brain_report_touched).then(|| {
            self.brain_report
                .as_ref()
                .map(crate::convert::decode_brain_report)
        })
    }

    /// The touched Services as model ports (and the node, if it was sent). A Service whose
    /// values cannot be decoded is left out (its last good ports stay), with an error.
    pub fn take_update(&mut self) -> (RemoteUpdate, Vec<DecodeError>) {
        let mut errors = Vec::new();
        let mut update = RemoteUpdate {
            node: if std::mem::take(&mut self.node_touched) {
                self.node.clone()
            } else {
                None
            },
            service_cidrs: std::mem::take(&mut self.service_cidrs_touched)
                .then(|| self.service_cidrs.clone()),
            services: Vec::new(),
            service_changes: std::mem::take(&mut self.service_changes)
                .into_iter()
                .collect(),
            endpoint_changes: std::mem::take(&mut self.endpoint_changes),
            replay: std::mem::take(&mut self.reset),
        };
        let empty = BTreeMap::new();
        for key in std::mem::take(&mut self.touched) {
            let Some(service) = self.services.get(&key) else {
                update.services.push((key, Vec::new()));
                continue;
            };
            let endpoints = self.endpoints.get(&key).unwrap_or(&empty);
            match decode_service(&key, service, endpoints) {
                Ok(ports) => update.services.push((key, ports)),
                Err(e) => errors.push(e),
            }
        }
        (update, errors)
    }
}

/// How to reach the brain.
#[derive(Debug, Clone)]
pub struct WatchConfig {
    /// The brain's address.
    pub addr: ApiAddr,
    /// TLS files (client certificate for mTLS, the brain's CA).
    pub tls: TlsFiles,
    /// The name in the brain's certificate (default: the host of `addr`).
    pub tls_server_name: Option<String>,
    /// The node whose view we want.
    pub node_name: String,
    /// First retry delay after a failure (doubling, with jitter, up to `retry_max`).
    pub retry_min: Duration,
    /// Longest retry delay.
    pub retry_max: Duration,
    /// Where the link's problems and last change set are recorded (`kpng status`).
    pub health: InputHealth,
    /// How long a connection may carry no state before that is an input problem
    /// ([`NO_STATE_GRACE`] by default): a brain that restarted and cannot list its input
    /// accepts nodes and sends them nothing, which without this looks "ok" on every node.
    pub no_state_grace: Duration,
    /// The backend found rules an earlier kpng left in the kernel and adopts them (the
    /// nftables table, the iptables chains, the eBPF maps; not the userspace proxy's, whose
    /// listeners died with it): a first state with no Service is held, as it is for a node
    /// that programs Services from an earlier session ([`hold`]).
    pub earlier_rules: bool,
    /// `--api-accept-empty-state`: apply a new session's first state even when it holds no
    /// Service and would empty this node.
    pub accept_empty_state: bool,
    /// `kpng_api_held_empty_state`: 1 while a state with no Service is held ([`hold`]).
    pub held_empty_state: prometheus_client::metrics::gauge::Gauge,
    /// This node's build as the brain is told it ([`crate::version::build`]; the bare version
    /// by default): the binary passes its git commit in, shown in the brain's `kpng status`
    /// and counted in its `kpng_api_connected_node_versions`.
    pub version: String,
}

impl WatchConfig {
    /// Node `node_name`'s view from the brain at `addr`, without TLS, with kpng's own retry
    /// delays (100 ms doubling to 5 s, as `--api-retry-max`) and [`NO_STATE_GRACE`]: what a backend of one's own
    /// starts from (`crates/kpng/examples/remote_backend.rs`), setting the TLS fields after.
    pub fn new(addr: ApiAddr, node_name: &str) -> WatchConfig {
        WatchConfig {
            addr,
            tls: TlsFiles::default(),
            tls_server_name: None,
            node_name: node_name.to_string(),
            retry_min: Duration::from_millis(100),
            retry_max: Duration::from_secs(5),
            health: InputHealth::default(),
            no_state_grace: NO_STATE_GRACE,
            earlier_rules: false,
            accept_empty_state: false,
            held_empty_state: prometheus_client::metrics::gauge::Gauge::default(),
            version: crate::version::VERSION.to_string(),
        }
    }

    /// Registers `kpng_api_held_empty_state` in a node's `registry`.
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "kpng_api_held_empty_state",
            "1 while this node keeps its rules instead of applying a new brain session's first \
             state, which holds no Service (a brain given an empty or wrong input); \
             --api-accept-empty-state applies such a state",
            self.held_empty_state.clone(),
        );
    }
}

/// What `kpng status` calls the problem of a node holding a state with no Service.
const HELD_EMPTY: &str = "brain state";

/// How long a node connected to its brain waits for the brain's first state before it
/// records "the brain has sent no state yet" as an input problem: longer than a healthy
/// brain's replay to a reconnecting node takes (milliseconds to a few seconds, even with
/// thousands of nodes reconnecting at once), short enough that an operator who restarted the
/// brain sees the problem on the nodes before looking elsewhere.
pub const NO_STATE_GRACE: Duration = Duration::from_secs(15);

/// The input problem of a node connected to a brain that has sent it no state yet.
pub const NO_STATE_YET: &str = "connected, but the brain has sent no state yet (it is still \
     listing its input: `kpng status` on the brain says why); keeping the rules as they are";

/// Why one Watch session ended.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// Connecting or the stream failed. Shown with its causes: tonic's own text is only
    /// "transport error", and the operator needs the "Connection refused" underneath.
    #[error("{}", with_causes(.0))]
    Transport(#[from] tonic::transport::Error),
    /// The brain answered with an error status, or the stream failed under it (tonic then
    /// says "transport error" and holds the cause: shown as for [`SessionError::Transport`]).
    #[error("{}", status_text(.0))]
    Status(#[from] tonic::Status),
    /// A TLS file could not be read.
    #[error("reading {path}: {source}")]
    TlsFile {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The brain closed the stream.
    #[error("the brain closed the stream")]
    Closed,
    /// A bundle could not be opened: its ops are lost, so the session starts again (and the
    /// brain replays everything).
    #[error("a broken bundle from the brain ({0}); reconnecting for a full replay")]
    Bundle(#[from] crate::bundle::BundleError),
}

/// A status's text: its message, and when it holds the error underneath (a failed stream),
/// that error's causes rather than tonic's `code: 'Unknown error', message: "transport
/// error", source: …` with the cause in Rust's debug notation.
fn status_text(status: &tonic::Status) -> String {
    match std::error::Error::source(status) {
        Some(source) => {
            let mut text = status.message().to_string();
            join_causes(&mut text, source);
            text
        }
        None => status.to_string(),
    }
}

/// `error` and each of its causes, joined by ": ", a cause that repeats its wrapper's text
/// left out (hyper's errors often do).
fn with_causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = String::new();
    join_causes(&mut text, error);
    text
}

/// Appends `error` and each of its causes to `text`, joined by ": ": a piece `text` already
/// ends with is left out, and one that begins with all of `text` replaces it. tonic's
/// message for a broken stream ("h2 protocol error: error reading a body from connection")
/// ends with its source's words, which until 2026-12-07 were shown twice.
fn join_causes(text: &mut String, error: &(dyn std::error::Error + 'static)) {
    let mut cause = Some(error);
    while let Some(e) = cause {
        let line = e.to_string();
        if text.is_empty() || line.starts_with(text.as_str()) {
            *text = line;
        } else if !text.ends_with(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        cause = e.source();
    }
}

/// Exponential backoff with jitter: each delay is drawn from [d/2, d], d doubling from `min`
/// to `max`, so many nodes that lost the same brain do not reconnect in lockstep.
#[derive(Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    current: Duration,
    rng: u64,
}

impl Backoff {
    /// A backoff seeded with `seed` (any value; 0 is replaced).
    pub fn new(min: Duration, max: Duration, seed: u64) -> Backoff {
        Backoff {
            min,
            max: max.max(min),
            current: min,
            rng: seed | 1,
        }
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        // xorshift64
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let d = self.current;
        self.current = (self.current * 2).min(self.max);
        let half = d / 2;
        let spread = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX).max(1);
        half + Duration::from_nanos(self.rng % spread)
    }

    /// After a success: start again from `min`.
    pub fn reset(&mut self) {
        self.current = self.min;
    }
}

fn read(path: &std::path::Path) -> Result<Vec<u8>, SessionError> {
    std::fs::read(path).map_err(|source| SessionError::TlsFile {
        path: path.display().to_string(),
        source,
    })
}

/// How often a node pings its brain over the Watch connection when nothing else arrived
/// (HTTP/2 PING): a few bytes, about 330 a second at 5,000 idle nodes.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(15);

/// How long a node waits for a ping's answer before it gives the connection up: as long as
/// the brain waits for its nodes', since a brain busy sending thousands of nodes their
/// initial state answers late, and dropping it then would only make every node ask again.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(30);

async fn connect(config: &WatchConfig) -> Result<Channel, SessionError> {
    let tls = config.tls.enabled();
    let scheme = if tls { "https" } else { "http" };
    let (uri, host) = match &config.addr {
        ApiAddr::Tcp(hostport) => {
            let host = hostport
                .rsplit_once(':')
                .map_or(hostport.as_str(), |(h, _)| h)
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            (format!("{scheme}://{hostport}"), host)
        }
        ApiAddr::Unix(_) => (format!("{scheme}://localhost"), "localhost".to_string()),
    };
    // HTTP/2 pings, also while only waiting for the next change set: a brain that hangs, or
    // whose host vanished without closing the connection, fails the stream within
    // KEEPALIVE_INTERVAL + KEEPALIVE_TIMEOUT, so the node reconnects (to a restarted brain)
    // and `kpng status` says the brain is unreachable instead of "ok" forever.
    let mut endpoint = Endpoint::from_shared(uri)?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .tcp_keepalive(Some(KEEPALIVE_INTERVAL));
    if tls {
        let mut tls_config =
            ClientTlsConfig::new().domain_name(config.tls_server_name.clone().unwrap_or(host));
        if let Some(ca) = &config.tls.ca {
            tls_config = tls_config.ca_certificate(Certificate::from_pem(read(ca)?));
        }
        if let (Some(cert), Some(key)) = (&config.tls.cert, &config.tls.key) {
            tls_config = tls_config.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        endpoint = endpoint.tls_config(tls_config)?;
    }
    match &config.addr {
        ApiAddr::Tcp(_) => Ok(endpoint.connect().await?),
        #[cfg(not(unix))]
        ApiAddr::Unix(_) => {
            let connector = tower::service_fn(move |_: tonic::transport::Uri| async move {
                Err::<TokioIo<tokio::net::TcpStream>, _>(std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    "unix:// addresses need a Unix system; use a tcp:// brain address",
                ))
            });
            Ok(endpoint.connect_with_connector(connector).await?)
        }
        #[cfg(unix)]
        ApiAddr::Unix(path) => {
            let path = path.clone();
            let connector = tower::service_fn(move |_: tonic::transport::Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(stream))
                }
            });
            Ok(endpoint.connect_with_connector(connector).await?)
        }
    }
}

/// One Watch stream, until it fails. `Ok` when the runner is gone.
async fn session(
    config: &WatchConfig,
    wire: &mut WireState,
    updates: &mpsc::Sender<RemoteUpdate>,
    backoff: &mut Backoff,
    connected: &mut bool,
    hold: &mut EmptyStateHold,
    link: &mut Link,
) -> Result<(), SessionError> {
    let Link { last_heard, outage } = link;
    let channel = connect(config).await?;
    let (requests, requests_rx) = mpsc::channel(2);
    let request = proto::WatchReq {
        node_name: config.node_name.clone(),
        continuous: true,
        accept_zstd: true,
    };
    // The receiver lives in the stream below; a failed send only means the stream is gone.
    let _ = requests.send(request.clone()).await;
    let mut watch = tonic::Request::new(ReceiverStream::new(requests_rx));
    // This node's version, for the brain's status and its mismatch warning (KPNG's brain
    // ignores metadata it does not know).
    // A build identity is visible ASCII; anything else falls back to the bare version.
    let version = tonic::metadata::MetadataValue::try_from(config.version.as_str())
        .unwrap_or_else(|_| tonic::metadata::MetadataValue::from_static(crate::version::VERSION));
    watch.metadata_mut().insert(crate::version::HEADER, version);
    let response = SetsClient::new(channel).watch(watch).await?;
    // A brain that honours `continuous` says so; any other (KPNG's, an older kpng) is asked
    // for each change set, as the protocol always had it.
    let continuous = response
        .metadata()
        .get(crate::server::CONTINUOUS_HEADER)
        .is_some();
    let brain_version = response_version(&response);
    let mut stream = response.into_inner();
    // Headers only say the brain answered: a brain that refuses this node (another node's
    // certificate, too many watches) answers too, and then ends the stream with its refusal.
    // Connected, and the outage over, once its first item arrives (until 2026-12-07 at the
    // headers, and a refused node warned and said "watching the brain" at every retry).
    let connected_at = std::time::SystemTime::now();
    // What the brain reported before is the earlier connection's until this one sends state.
    config.health.brain_connected();
    brain_answered(config, brain_version);
    *last_heard = Some(tokio::time::Instant::now());
    // A brain that accepts this node and sends nothing (it restarted and is still listing its
    // input, perhaps forever) is an input problem after the grace, until its first state.
    let no_state = tokio::time::sleep(config.no_state_grace);
    tokio::pin!(no_state);
    let mut state_received = false;
    let mut no_state_recorded = false;
    loop {
        let item = tokio::select! {
            item = tokio_stream::StreamExt::next(&mut stream) => item,
            () = &mut no_state, if !state_received && !no_state_recorded => {
                no_state_recorded = true;
                warn!(
                    brain = %config.addr,
                    "the brain accepted this node {:?} ago and has sent no state yet (it is \
                     still listing its input: `kpng status` on the brain says why); keeping the \
                     rules as they are",
                    config.no_state_grace
                );
                config.health.failing(BRAIN, NO_STATE_YET, connected_at);
                continue;
            }
        };
        let Some(item) = item.transpose()? else {
            break;
        };
        *last_heard = Some(tokio::time::Instant::now());
        if !*connected {
            *connected = true;
            info!(brain = %config.addr, node = %config.node_name, continuous, "watching the brain");
            if let Some(over) = outage.take() {
                info!(
                    brain = %config.addr,
                    failed_attempts = over.failed_attempts,
                    "brain reachable again: this node was cut off from it for {}",
                    humantime::format_duration(Duration::from_millis(
                        u64::try_from(over.since.elapsed().as_millis()).unwrap_or(u64::MAX)
                            / 100
                            * 100
                    ))
                );
            }
            if !no_state_recorded {
                config.health.recovered(BRAIN);
            }
        }
        if let Some(Op::Bundle(bundle)) = &item.op {
            for op in crate::bundle::unbundle(bundle)? {
                if let Err(e) = wire.apply(op) {
                    warn!("ignoring a value from the brain: {e}");
                }
            }
            continue;
        }
        match wire.apply(item) {
            Ok(false) => {}
            Ok(true) => {
                let (update, errors) = wire.take_update();
                for e in errors {
                    warn!("ignoring a value from the brain: {e}");
                }
                // Shown by `kpng status`; what the node programs does not depend on it.
                if let Some(report) = wire.take_brain_report() {
                    config.health.set_brain_report(report);
                }
                if !state_received {
                    state_received = true;
                    if no_state_recorded {
                        info!(brain = %config.addr, "the brain sent its state");
                    }
                    config.health.recovered(BRAIN);
                }
                let was_holding = hold.holding();
                match hold.decide(update, wire.services.len()) {
                    Verdict::Apply(update) => {
                        if was_holding {
                            released(config, wire.services.len());
                        }
                        if updates.send(update).await.is_err() {
                            return Ok(());
                        }
                        config.health.loaded(std::time::SystemTime::now(), None);
                    }
                    Verdict::Hold { first, keeping } => {
                        if first {
                            held(config, keeping);
                        }
                    }
                }
                backoff.reset();
                if !continuous {
                    // Ready for the next change set.
                    let _ = requests.send(request.clone()).await;
                }
            }
            Err(e) => warn!("ignoring a value from the brain: {e}"),
        }
    }
    Err(SessionError::Closed)
}

/// The brain's version from its response headers (see [`crate::version`]).
fn response_version<T>(response: &tonic::Response<T>) -> Option<String> {
    response
        .metadata()
        .get(crate::version::HEADER)
        .and_then(|v| crate::version::from_header(v.as_bytes()))
}

/// The problem of a node whose brain answered (the stream's headers) and has sent nothing
/// yet: true between a reconnect and the first item, where the outage's "unreachable" would
/// no longer be (and a refusal may still follow).
pub const WAITING_FOR_FIRST_STATE: &str = "connected, waiting for the brain's first state \
     since the reconnect; keeping the rules as they are";

/// The brain answered this node's Watch: its version is recorded (and warned about once per
/// change when its major.minor differs from this node's), and an outage's problem, if one is
/// held, becomes [`WAITING_FOR_FIRST_STATE`] (keeping when the outage began: the node is not
/// up to date until the first state arrives). Returns whether it warned.
fn brain_answered(config: &WatchConfig, version: Option<String>) -> bool {
    let warned = config.health.set_brain_version(version.clone())
        && version
            .as_deref()
            .is_some_and(|theirs| crate::version::mismatch(&config.version, theirs));
    if let (true, Some(theirs)) = (warned, &version) {
        warn!(
            brain = %config.addr,
            "the brain runs kpng {theirs}, this node {}: their major.minor versions differ (a \
             rollout in progress?); finish it so that both sides mean the same by the protocol",
            config.version
        );
    }
    if config.health.state().problems.contains_key(BRAIN) {
        config
            .health
            .failing(BRAIN, WAITING_FOR_FIRST_STATE, std::time::SystemTime::now());
    }
    warned
}

/// A new session's first state holds no Service and the node programs `keeping`: it is not
/// applied ([`hold`]); said once per hold, in the log, `kpng status` and the gauge.
fn held(config: &WatchConfig, keeping: Programmed) {
    let kept = match keeping {
        Programmed::Services(n) => format!("the {n} Services it programs"),
        _ => "the rules an earlier kpng left (adopted at start)".to_string(),
    };
    warn!(
        brain = %config.addr,
        "the brain at {} sent a complete state with no Service, which would delete every \
         Service rule of this node: not applied, keeping {kept} until the brain's state holds a \
         Service (a brain given an empty or wrong input: an empty manifest directory, another \
         cluster's kubeconfig?; a real cluster always has default/kubernetes; \
         --api-accept-empty-state applies such a state)",
        config.addr
    );
    config.held_empty_state.set(1);
    config.health.failing(
        HELD_EMPTY,
        &format!(
            "the brain sent a state with no Service: not applied, keeping {kept} until it \
             holds a Service (an empty or wrong brain input?)"
        ),
        std::time::SystemTime::now(),
    );
}

/// The brain's state holds Services again after a hold: the held state goes through.
fn released(config: &WatchConfig, services: usize) {
    info!(
        brain = %config.addr,
        "the brain's state holds {services} Services again: applying it (the state held since \
         it had none included)"
    );
    config.held_empty_state.set(0);
    config.health.recovered(HELD_EMPTY);
}

/// What a stream that broke says about a brain that went silent, as a hint to append (empty
/// when nothing): a brain whose host vanished (powered off, its network gone) sends nothing
/// and closes nothing, and this node notices only when its keepalive ping goes unanswered for
/// [`KEEPALIVE_TIMEOUT`]; hyper then drops the connection, and the stream fails as "broken
/// pipe", the words of a connection the brain closed. Neither hyper nor h2 tells the two
/// apart, so the time since the brain's last message does: at least [`KEEPALIVE_TIMEOUT`] on
/// a stream that was `connected` (a brain killed after as long a quiet spell reads the same,
/// hence the "if").
pub fn silence_hint(failure: &str, connected: bool, silent_for: Option<Duration>) -> String {
    match silent_for {
        Some(silent) if connected && is_closed(failure) && silent >= KEEPALIVE_TIMEOUT => format!(
            " (nothing came from the brain in the last {}: unless it was killed, it went \
             silent, its host gone or the network between, and this node's keepalive gave the \
             connection up after its ping had no answer within {})",
            humantime::format_duration(Duration::from_secs(silent.as_secs())),
            humantime::format_duration(KEEPALIVE_TIMEOUT)
        ),
        _ => String::new(),
    }
}

/// What a failure's text says about a TLS mismatch between this node and its brain, as a
/// hint to append (empty when nothing): the transport's own words ("FRAME_SIZE_ERROR", "broken
/// pipe", "UnsupportedCertVersion") do not name TLS.
///
/// A connection closed at once, before this node was ever served, is named as a possible
/// mismatch only then (`ever_connected` false): later it is a brain going away. A load
/// balancer (a Service's, a cloud one) with no brain behind it accepts and closes at once
/// too, which looks the same from here, so the hint names it as well.
pub fn tls_hint(failure: &str, tls: &crate::addr::TlsFiles, ever_connected: bool) -> &'static str {
    let closed_at_once = !ever_connected && is_closed(failure);
    if !tls.enabled()
        && (failure.contains("FRAME_SIZE_ERROR") || failure.contains("frame with invalid size"))
    {
        " (the brain seems to serve TLS: give --api-tls-ca, and --api-tls-cert/--api-tls-key \
         if it asks for client certificates)"
    } else if !tls.enabled() && closed_at_once {
        " (if the brain serves TLS: give --api-tls-ca, and --api-tls-cert/--api-tls-key if it \
         asks for client certificates; or a load balancer with no brain behind it accepted the \
         connection: see that the brain's Service has endpoints; a brain at its \
         --max-connections also closes new connections at once, and its log says so)"
    } else if tls.enabled()
        && (failure.contains("InvalidContentType") || failure.contains("corrupt message"))
    {
        " (the brain seems to serve plaintext: drop --api-tls-*, or give it --listen-tls-*)"
    } else if failure.contains("UnsupportedCertVersion") {
        " (a certificate is X.509 v1, which rustls refuses: issue v3 certificates, for this \
         node's --api-tls-cert as well as the brain's)"
    } else if tls.enabled() && tls.cert.is_none() && closed_at_once {
        " (the brain may ask for a client certificate (mTLS): give --api-tls-cert and \
         --api-tls-key; or a load balancer with no brain behind it accepted the connection: \
         see that the brain's Service has endpoints)"
    } else {
        ""
    }
}

/// Whether `failure` only says the connection went away (closed, reset, a write into a
/// closed connection, hyper cancelling what was waiting on it): words that name no cause of
/// their own. When connecting, such a failure often follows a cause said on the same
/// connection a moment before (a brain refusing this node's certificate sends its TLS alert,
/// then the node's next write meets a broken pipe and what waited is cancelled).
fn is_closed(failure: &str) -> bool {
    [
        "connection closed",
        "operation was canceled",
        "broken pipe",
        "Broken pipe",
        "connection reset",
        "Connection reset",
    ]
    .iter()
    .any(|c| failure.contains(c))
}

/// The TLS alert the brain ended this node's handshake with, in words (`None` when `failure`
/// carries none): the transport only says `received fatal alert: UnknownCA`, which does not
/// say that the brain refused this node's own certificate, nor what to fix.
pub fn brain_alert(failure: &str) -> Option<String> {
    let (_, alert) = failure.split_once("received fatal alert: ")?;
    let alert: String = alert
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect();
    let refused = |why: &str| format!("the brain refused this node's certificate: {why}");
    Some(match alert.as_str() {
        "UnknownCA" => refused(
            "unknown CA (no CA in the brain's --listen-tls-ca signed this node's \
             --api-tls-cert)",
        ),
        "CertificateExpired" => refused("expired or not yet valid (this node's --api-tls-cert)"),
        "CertificateRevoked" => refused("revoked"),
        "BadCertificate" => refused("bad certificate"),
        "UnsupportedCertificate" => refused("unsupported certificate (not for client auth?)"),
        "CertificateUnknown" => refused("certificate unknown"),
        "DecryptError" => refused("its signature does not verify (a key of another pair?)"),
        "CertificateRequired" => "the brain requires a client certificate (mTLS): give \
                                  --api-tls-cert and --api-tls-key"
            .to_string(),
        other => format!("the brain ended the TLS handshake: {other}"),
    })
}

/// What the link's problem concerns, in `kpng status`.
const BRAIN: &str = "brain";

/// Watches the brain forever (reconnecting with backoff), sending each change set to
/// `updates`. Returns when `updates` is closed.
pub async fn watch(config: WatchConfig, updates: mpsc::Sender<RemoteUpdate>) {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default()
        ^ u64::from(std::process::id());
    let mut backoff = Backoff::new(config.retry_min, config.retry_max, seed);
    let mut wire = WireState::default();
    config.health.set_source(format!("brain {}", config.addr));
    // Kept across sessions: what the node programs, and a state held since an earlier one.
    let programmed = if config.earlier_rules {
        Programmed::EarlierRules
    } else {
        Programmed::Nothing
    };
    let mut hold = EmptyStateHold::new(programmed, config.accept_empty_state);
    // The causes warned about in this outage: an outage is one warning per cause, its
    // retries debug lines, as the `kube` source logs an API server outage. A set, not the
    // last cause: a refused connection fails in turn as "operation was canceled" and as a
    // transport error, which would otherwise warn at every retry.
    let mut warned = WarnedCauses::default();
    let mut ever_connected = false;
    // When the brain last said it shuts down (its successor may take a while to listen).
    let mut shut_down_at: Option<tokio::time::Instant> = None;
    // The causes logged at INFO while its successor was awaited.
    let mut told = WarnedCauses::default();
    // This outage was warned about: its other causes are INFO lines, its retries debug
    // (until 2026-12-07 a brain killed gave two warnings, the broken stream and the refused
    // connection after it).
    let mut outage_warned = false;
    // Since when the node has been cut off from the brain, for the line when it is back.
    let mut outage: Option<Outage> = None;
    loop {
        let mut connected = false;
        let mut link = Link {
            last_heard: None,
            outage: outage.take(),
        };
        let attempt = session(
            &config,
            &mut wire,
            &updates,
            &mut backoff,
            &mut connected,
            &mut hold,
            &mut link,
        );
        let result = attempt.await;
        let Link {
            last_heard,
            outage: still,
        } = link;
        outage = still;
        if result.is_err() {
            if connected {
                outage = None;
            }
            outage
                .get_or_insert_with(|| Outage {
                    since: tokio::time::Instant::now(),
                    failed_attempts: 0,
                })
                .failed_attempts += u64::from(!connected);
        }
        match result {
            Ok(()) => return,
            Err(e) if is_brain_shutting_down(&e) => {
                // A restart or a rollout of the brain: not a failure to warn about. The rules
                // stay as they are and the next brain is asked at once.
                ever_connected = true;
                warned = WarnedCauses::default();
                outage_warned = false;
                told = WarnedCauses::default();
                shut_down_at = Some(tokio::time::Instant::now());
                backoff.reset();
                config.health.failing(
                    BRAIN,
                    "unreachable: the brain shut down (a restart or a rollout); keeping the \
                     rules as they are, reconnecting",
                    std::time::SystemTime::now(),
                );
                info!(
                    brain = %config.addr,
                    "the brain is shutting down (a restart or a rollout): keeping the rules as \
                     they are, reconnecting"
                );
                tokio::select! {
                    _ = tokio::time::sleep(config.retry_min) => {}
                    _ = updates.closed() => return,
                }
            }
            Err(e) => {
                let delay = backoff.next_delay();
                if connected {
                    warned = WarnedCauses::default();
                    outage_warned = false;
                    ever_connected = true;
                    // A "no state yet" problem is over: the outage begins now.
                    config.health.recovered(BRAIN);
                }
                let silent_for = last_heard.map(|t| t.elapsed());
                let mut failure = Failure::of(&e, &config.tls, ever_connected, connected);
                failure
                    .cause
                    .push_str(&silence_hint(&failure.cause, connected, silent_for));
                let cause = failure.cause.clone();
                // Recorded before it is logged: whoever reads the warning and then asks
                // `kpng status` finds the problem there. A bare "broken pipe" after the
                // brain's alert is the alert's consequence: the alert stays the problem.
                let shown = match (failure.follow_on, warned.telling()) {
                    (true, Some(telling)) => telling.to_string(),
                    _ => cause.clone(),
                };
                let problem = if failure.refused.is_some() {
                    format!("{shown}; keeping the rules as they are, retrying")
                } else {
                    format!("unreachable: {shown}; keeping the rules as they are, retrying")
                };
                config
                    .health
                    .failing(BRAIN, &problem, std::time::SystemTime::now());
                let restarting = shut_down_at.is_some_and(|at| at.elapsed() < RESTART_GRACE);
                if connected {
                    shut_down_at = None;
                }
                if restarting {
                    // Its successor is not listening yet: expected for a while after a brain
                    // said it shuts down, so no warning before RESTART_GRACE (and one after).
                    if told.first_time(&failure) {
                        info!(
                            brain = %config.addr,
                            retry_in = ?delay,
                            "the brain is not back yet, keeping the rules as they are: {cause}"
                        );
                    }
                } else if failure.refused.is_some() {
                    if warned.first_time(&failure) {
                        warn!(
                            brain = %config.addr,
                            retry_in = ?delay,
                            "{cause}; keeping the rules as they are (retries are logged at debug)"
                        );
                    } else {
                        debug!(brain = %config.addr, retry_in = ?delay, "still {cause}");
                    }
                } else if warned.first_time(&failure) {
                    if outage_warned {
                        info!(
                            brain = %config.addr,
                            retry_in = ?delay,
                            "brain still unreachable, now: {cause}"
                        );
                    } else if connected && is_closed(&cause) && !cause.contains("went silent") {
                        outage_warned = true;
                        warn!(
                            brain = %config.addr,
                            retry_in = ?delay,
                            "lost the brain's stream, keeping the rules as they are (retries \
                             are logged at debug, another cause at info): {cause} (the brain \
                             went away, or ended this node's stream: one that falls behind, not \
                             reading it, is dropped; the brain's log says which)"
                        );
                    } else {
                        outage_warned = true;
                        warn!(
                            brain = %config.addr,
                            retry_in = ?delay,
                            "brain unreachable, keeping the rules as they are (retries are \
                             logged at debug, another cause at info): {cause}"
                        );
                    }
                } else {
                    debug!(brain = %config.addr, retry_in = ?delay, "brain still unreachable: {e}");
                }
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = updates.closed() => return,
                }
            }
        }
    }
}

/// What one attempt learns of the link to the brain, kept across attempts by [`watch`].
#[derive(Debug, Default)]
struct Link {
    /// When the brain last sent something on this attempt's stream (its headers, an item).
    last_heard: Option<tokio::time::Instant>,
    /// The outage under way, if any: ended (and said) when the brain's first item arrives.
    outage: Option<Outage>,
}

/// When an outage began (the stream broke, or the first attempt failed) and how many
/// attempts to reconnect failed since: said when the brain is reachable again, as the `kube`
/// source says how long the API server was out of reach.
#[derive(Debug, Clone, Copy)]
struct Outage {
    since: tokio::time::Instant,
    failed_attempts: u64,
}

/// How long after a brain said it shuts down its successor's absence is expected (logged at
/// INFO, not warned about).
const RESTART_GRACE: Duration = Duration::from_secs(30);

/// Whether the session ended because the brain shuts down ([`crate::server::SHUTTING_DOWN`]).
fn is_brain_shutting_down(error: &SessionError) -> bool {
    matches!(error, SessionError::Status(status)
        if status.code() == tonic::Code::Unavailable
            && status.message().contains(crate::server::SHUTTING_DOWN))
}

/// One failed attempt, as the outage's log sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Failure {
    /// What failed, with a hint when its words suggest a TLS mismatch, or the brain's TLS
    /// alert in words ([`brain_alert`]) before the transport's own.
    cause: String,
    /// A connection that closed while connecting, with no cause of its own ([`is_closed`]):
    /// often the consequence of a cause an attempt just before said.
    follow_on: bool,
    /// The brain answered and refused this node ([`brain_refusal`]), with this status: it is
    /// reachable, and retrying changes nothing until someone fixes what it says. The code
    /// names the reason (a bad name, another node's certificate, too many watches, a node
    /// its cluster does not have): one refusal, however its counts change ([`Failure::warn_key`]).
    refused: Option<tonic::Code>,
}

/// What a brain's refusal of this node says, when `error` is one (`None` otherwise): a
/// status ending the stream before any state, for something about this node (another node's
/// certificate, a name that is not a Node's, a node the brain's cluster does not have, too
/// many watches) rather than the connection.
fn brain_refusal(error: &SessionError) -> Option<(String, tonic::Code)> {
    let SessionError::Status(status) = error else {
        return None;
    };
    match status.code() {
        tonic::Code::PermissionDenied
        | tonic::Code::FailedPrecondition
        | tonic::Code::InvalidArgument
        | tonic::Code::ResourceExhausted
        | tonic::Code::Unauthenticated => Some((
            format!(
                "the brain refused this node: {} ({:?})",
                status.message(),
                status.code()
            ),
            status.code(),
        )),
        _ => None,
    }
}

impl Failure {
    /// `error` of an attempt; `connected`: this attempt had its stream (a connection that
    /// closes then is the brain going away, a cause of its own).
    fn of(
        error: &SessionError,
        tls: &crate::addr::TlsFiles,
        ever_connected: bool,
        connected: bool,
    ) -> Failure {
        if let Some((refusal, code)) = brain_refusal(error) {
            return Failure {
                cause: refusal,
                follow_on: false,
                refused: Some(code),
            };
        }
        let text = error.to_string();
        if let Some(alert) = brain_alert(&text) {
            return Failure {
                cause: format!("{alert} ({text})"),
                follow_on: false,
                refused: None,
            };
        }
        let hint = tls_hint(&text, tls, ever_connected);
        Failure {
            follow_on: !connected && is_closed(&text),
            cause: format!("{text}{hint}"),
            refused: None,
        }
    }

    /// What tells this failure apart from the others of an outage, for its one warning
    /// ([`WarnedCauses`]): its cause, or for a refusal its status code only. A refusal's words
    /// carry counts that change while the node retries (the brain's Node count for an unknown
    /// node): until 2026-12-07 each new count warned again, up to [`WarnedCauses::MAX`].
    fn warn_key(&self) -> String {
        match self.refused {
            Some(code) => format!("refused ({code:?})"),
            None => self.cause.clone(),
        }
    }
}

/// The causes of one outage already warned about ([`watch`]), at most
/// [`WarnedCauses::MAX`]: past them, an outage's new causes are debug lines too.
///
/// A connection that only closed while connecting ([`Failure::follow_on`]) is warned about
/// only when nothing else explains the outage: not once a cause was warned, and not before
/// [`WarnedCauses::PATIENCE`] such attempts over at least [`WarnedCauses::PATIENCE_TIME`],
/// since an attempt after it usually says why (a brain refusing this node's certificate fails
/// in turn as its TLS alert, a broken pipe and a cancelled operation, and until 2026-12-06 each
/// was a warning; with an expired certificate three closed attempts came in 0.36 s, before the
/// alert, so a count alone still warned first of a closed connection).
#[derive(Debug, Default)]
struct WarnedCauses {
    /// Each warned cause: its [`Failure::warn_key`] and its words.
    causes: Vec<(String, String)>,
    /// Attempts of this outage that only closed, before any was warned about.
    closed: usize,
    /// When the first of them failed.
    closed_since: Option<std::time::Instant>,
}

impl WarnedCauses {
    const MAX: usize = 4;
    /// How many attempts that only closed make a warning when no other cause came.
    const PATIENCE: usize = 3;
    /// How long attempts that only closed are given for another cause to come.
    const PATIENCE_TIME: std::time::Duration = std::time::Duration::from_secs(2);

    /// Whether `failure` is to be warned about: the first time this outage, while fewer
    /// than [`WarnedCauses::MAX`] were, and for a follow-on only as above.
    fn first_time(&mut self, failure: &Failure) -> bool {
        self.first_time_at(failure, std::time::Instant::now())
    }

    /// [`WarnedCauses::first_time`] for a failure at `now`.
    fn first_time_at(&mut self, failure: &Failure, now: std::time::Instant) -> bool {
        if failure.follow_on {
            if !self.causes.is_empty() {
                return false;
            }
            self.closed += 1;
            let since = *self.closed_since.get_or_insert(now);
            if self.closed < Self::PATIENCE
                || now.saturating_duration_since(since) < Self::PATIENCE_TIME
            {
                return false;
            }
        }
        let key = failure.warn_key();
        if self.causes.len() >= Self::MAX || self.causes.iter().any(|(k, _)| *k == key) {
            return false;
        }
        self.causes.push((key, failure.cause.clone()));
        true
    }

    /// The last cause warned about this outage: what `kpng status` keeps showing while the
    /// attempts only close.
    fn telling(&self) -> Option<&str> {
        self.causes.last().map(|(_, cause)| cause.as_str())
    }
}

#[cfg(test)]
mod tests;
