//! kpng's userspace backend: an L4 proxy in tokio for TCP and UDP Services, portable except for
//! how traffic is captured.
//!
//! - [`proxy`]: one listener per Service port and way in (ClusterIP, or node port / external
//!   IPs / load-balancer IPs), round robin over the endpoints the model selected, ClientIP
//!   affinity ([`balancer`]), traffic policies ([`routing`]), UDP sessions ([`sessions`]) and
//!   graceful drain. Runs on tasks of the tokio runtime that calls [`Backend::sync`] (the
//!   runner's), so wiring it is no different from any other backend.
//! - [`entries`] + [`store`]: what the capture must do (which VIP and port goes to which
//!   listener, which are refused or dropped), as owned entries diffed into minimal operations.
//! - [`capture`]: the OS-specific part behind the [`capture::Capture`] trait; on Linux a
//!   constant nftables ruleset with maps ([`capture::nft`]).
//!
//! [`Backend::sync`] is synchronous and quick: it binds listeners for new ports, hands changed
//! endpoint lists to the running listeners, and commits the capture changes.
//!
//! Differences from the kernel backends, by design: endpoints see the node as the client
//! (client IPs are not preserved, whatever the traffic policy); established connections end
//! when kpng stops (after a short grace for those in flight, [`Backend::exit_drain`]); SCTP is
//! not proxied. See `docs/backends.md`.

pub mod balancer;
pub mod capture;
pub mod entries;
pub mod metrics;
pub mod proxy;
pub mod routing;
pub mod sessions;
pub mod store;
#[cfg(test)]
mod testutil;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use kpng_backend::settings::DetectLocal;
use kpng_backend::{Backend, BackendError, ExitDrain, SyncRequest, SyncStats};
use kpng_model::{Family, PortKey, Protocol, ServicePort, Snapshot};
use prometheus_client::registry::Registry;
use tokio::runtime::Handle;
use tracing::{debug, warn};

use crate::capture::Capture;
use crate::entries::{Action, Entry, EntryKey, ListenerPorts, NodePortAddresses};
use crate::metrics::ProxyMetrics;
use crate::proxy::{Listener, PortShared, ProxySettings, ProxyTasks};
use crate::routing::Scope;
use crate::store::{EntryStore, NODE_OWNER, Op, OwnerId};

/// Configuration of the userspace backend.
#[derive(Debug, Clone)]
pub struct UserspaceConfig {
    /// The families to proxy.
    pub families: Vec<Family>,
    /// Where node ports are served (`--nodeport-addresses`).
    pub nodeport_addresses: NodePortAddresses,
    /// `--service-cidr`: traffic to unallocated IPs inside is dropped.
    pub service_cidrs: Vec<IpNet>,
    /// How pods are recognised (`--detect-local-mode`), for externalTrafficPolicy Local's
    /// exception: pods (and the node itself) may use every endpoint. The CIDR modes become
    /// capture entries here; interface modes are the capture's own rules
    /// ([`capture::nft::PodMatch`]).
    pub detect_local: DetectLocal,
    /// Data-path timeouts.
    pub settings: ProxySettings,
    /// How long kpng, asked to stop, waits for the connections it already accepted to end
    /// (`--drain-on-exit`). New connections are refused meanwhile, so it is short.
    pub drain_on_exit: Duration,
    /// `--dry-run`: open no listener (the capture, a dry run too, shows placeholder listener
    /// ports from [`PLANNED_PORTS`] upward).
    pub dry_run: bool,
}

/// The default of [`UserspaceConfig::drain_on_exit`]: enough for a request in flight to be
/// answered, short enough that a restart is not held up by connections that stay open.
pub const DEFAULT_DRAIN_ON_EXIT: Duration = Duration::from_secs(1);

/// The first placeholder listener port of a dry run (the real ones are the OS's choice).
pub const PLANNED_PORTS: u16 = 61000;

impl Default for UserspaceConfig {
    fn default() -> Self {
        UserspaceConfig {
            families: Family::ALL.to_vec(),
            nodeport_addresses: NodePortAddresses::Primary,
            service_cidrs: Vec::new(),
            detect_local: DetectLocal::None,
            settings: ProxySettings::default(),
            drain_on_exit: DEFAULT_DRAIN_ON_EXIT,
            dry_run: false,
        }
    }
}

/// One proxied Service port.
struct PortProxy {
    owner: OwnerId,
    shared: Arc<PortShared>,
    internal: Listener,
    external: Option<Listener>,
    short_circuit: Option<Listener>,
    entries: Vec<Entry>,
}

impl PortProxy {
    fn listener_ports(&self) -> ListenerPorts {
        ListenerPorts {
            internal: self.internal.port,
            external: self.external.as_ref().map(|l| l.port),
            short_circuit: self.short_circuit.as_ref().map(|l| l.port),
        }
    }
}

/// The userspace backend.
pub struct UserspaceBackend {
    config: UserspaceConfig,
    /// The runtime the proxy's tasks run on: the one of the first sync.
    runtime: Option<Handle>,
    /// The listeners' and connections' tasks, stopped together when kpng stops.
    tasks: ProxyTasks,
    capture: Box<dyn Capture>,
    ports: HashMap<PortKey, PortProxy>,
    store: EntryStore,
    node_entries: Vec<Entry>,
    node_ips: Vec<IpAddr>,
    next_owner: OwnerId,
    metrics: ProxyMetrics,
    /// False after a failed capture call: the next sync replaces the capture whole.
    capture_in_sync: bool,
    /// The listener ports a previous run left in the capture, by entry key: read at the first
    /// full sync and used by the listeners it opens.
    previous: Option<HashMap<EntryKey, u16>>,
    /// Whether the first full sync has run (and read `previous`).
    started: bool,
    /// The next placeholder port of a dry run's listeners.
    next_planned: u16,
    warned_sctp: bool,
}

impl UserspaceBackend {
    /// A backend whose listeners `capture` feeds. Its proxy runs on the tokio runtime that
    /// calls [`Backend::sync`].
    pub fn new(config: UserspaceConfig, capture: Box<dyn Capture>) -> UserspaceBackend {
        UserspaceBackend {
            config,
            runtime: None,
            tasks: ProxyTasks::default(),
            capture,
            ports: HashMap::new(),
            store: EntryStore::new(),
            node_entries: Vec::new(),
            node_ips: Vec::new(),
            next_owner: NODE_OWNER + 1,
            metrics: ProxyMetrics::default(),
            capture_in_sync: false,
            previous: None,
            started: false,
            next_planned: PLANNED_PORTS,
            warned_sctp: false,
        }
    }

    /// The listener ports of a Service port (tests and diagnostics).
    pub fn listener_ports(&self, key: &PortKey) -> Option<ListenerPorts> {
        self.ports.get(key).map(PortProxy::listener_ports)
    }

    /// The runtime the proxy runs on (the caller's, from the first sync on).
    fn runtime(&mut self) -> Result<Handle, BackendError> {
        if let Some(h) = &self.runtime {
            return Ok(h.clone());
        }
        let h = Handle::try_current().map_err(|e| {
            BackendError::Other(format!(
                "the userspace proxy must be synced from a tokio runtime: {e}"
            ))
        })?;
        self.runtime = Some(h.clone());
        Ok(h)
    }

    /// Whether this backend proxies `key` at all (family configured, protocol supported).
    fn handles(&mut self, key: &PortKey) -> bool {
        if !self.config.families.contains(&key.family) {
            return false;
        }
        if key.protocol == Protocol::Sctp {
            if !self.warned_sctp {
                warn!("{key}: SCTP Services are not served by the userspace proxy");
                self.warned_sctp = true;
            }
            return false;
        }
        true
    }

    /// Re-reads the node-level state: the node's IPs, node-port addresses and pod CIDRs, and
    /// the Service CIDRs (`--service-cidr` and the cluster's ServiceCIDR objects alike).
    fn update_node(&mut self, snapshot: &Snapshot) {
        let node = &snapshot.node;
        self.node_ips = node.ips.clone();
        let pod_cidrs = match &self.config.detect_local {
            DetectLocal::ClusterCidr(c) => &c[..],
            DetectLocal::NodeCidr => &node.pod_cidrs[..],
            _ => &[][..],
        };
        let service_cidrs: Vec<IpNet> = self
            .config
            .service_cidrs
            .iter()
            .chain(&snapshot.service_cidrs)
            .copied()
            .collect();
        self.node_entries = entries::node_entries(
            &self.config.nodeport_addresses,
            node,
            &service_cidrs,
            pod_cidrs,
            &self.config.families,
        );
    }

    /// Creates or updates the proxy of one port (its running listeners see the new endpoints
    /// at once; listeners open and close as its ways in come and go) and records its capture
    /// entries' changes in `ops`.
    fn upsert(&mut self, sp: &ServicePort, ops: &mut Vec<Op>) -> Result<(), BackendError> {
        let key = &sp.key;
        let runtime = self.runtime()?;
        let settings = self.config.settings;
        let previous = self.previous.as_ref();
        let dry_run = self.config.dry_run;
        let tasks = &self.tasks;
        let planned = std::cell::Cell::new(self.next_planned);
        let bind = |scope: Scope, shared: &Arc<PortShared>| {
            if dry_run {
                let port = planned.get();
                planned.set(port.checked_add(1).unwrap_or(PLANNED_PORTS));
                return Ok(Listener::planned(port));
            }
            proxy::listen(
                &runtime,
                tasks,
                key,
                scope,
                shared.clone(),
                settings,
                previous.and_then(|p| previous_port(p, sp, scope)),
            )
            .map_err(|source| BackendError::Io {
                context: format!("{key}: opening the {} listener", scope.as_str()),
                source,
            })
        };
        // Opens or closes an optional listener as `needed` says.
        let ensure = |slot: &mut Option<Listener>,
                      needed: bool,
                      scope: Scope,
                      shared: &Arc<PortShared>|
         -> Result<(), BackendError> {
            match (slot.is_some(), needed) {
                (false, true) => *slot = Some(bind(scope, shared)?),
                (true, false) => *slot = None,
                _ => {}
            }
            Ok(())
        };
        let external_needed = sp.externally_accessible();
        let short_circuit_needed = external_needed && sp.external_policy_local;
        let mut port = match self.ports.remove(key) {
            Some(p) => {
                p.shared.update(sp);
                p
            }
            None => {
                let shared = Arc::new(PortShared::new(sp, self.metrics.clone()));
                let internal = bind(Scope::Internal, &shared)?;
                let owner = self.next_owner;
                self.next_owner = self.next_owner.wrapping_add(1).max(NODE_OWNER + 1);
                PortProxy {
                    owner,
                    shared,
                    internal,
                    external: None,
                    short_circuit: None,
                    entries: Vec::new(),
                }
            }
        };
        let shared = port.shared.clone();
        let opened = ensure(
            &mut port.external,
            external_needed,
            Scope::External,
            &shared,
        )
        .and_then(|()| {
            ensure(
                &mut port.short_circuit,
                short_circuit_needed,
                Scope::ShortCircuit,
                &shared,
            )
        });
        self.next_planned = planned.get();
        if let Err(e) = opened {
            // Keep what works; the retry (a full sync) opens the rest.
            self.ports.insert(key.clone(), port);
            return Err(e);
        }
        let entries = entries::port_entries(sp, port.listener_ports(), &self.node_ips);
        self.claim(port.owner, &port.entries, &entries, ops);
        port.entries = entries;
        self.ports.insert(key.clone(), port);
        Ok(())
    }

    /// Stops proxying one port (its listeners close; its connections drain).
    fn remove(&mut self, key: &PortKey, ops: &mut Vec<Op>) {
        if let Some(port) = self.ports.remove(key) {
            self.claim(port.owner, &port.entries, &[], ops);
        }
    }

    /// Replaces `owner`'s capture entries `old` with `new` in the store, appending the capture
    /// operations; another owner's entry for a key (one that takes over, or one a delete
    /// removes) is looked up among the ports and the node's entries.
    fn claim(&mut self, owner: OwnerId, old: &[Entry], new: &[Entry], ops: &mut Vec<Op>) {
        let (ports, node_entries) = (&self.ports, &self.node_entries);
        let resolve = |o: OwnerId, e: &Entry| -> Option<Entry> {
            let entries = if o == NODE_OWNER {
                node_entries
            } else {
                &ports.values().find(|p| p.owner == o)?.entries
            };
            entries.iter().find(|x| x.key == e.key).cloned()
        };
        store::change(&mut self.store, owner, old, new, ops, &resolve);
    }

    /// Rebuilds everything from the snapshot and replaces the capture. The first one reads
    /// what a previous run left, so that its listeners can take the same ports again.
    fn full_sync(&mut self, snapshot: &Snapshot) -> Result<usize, BackendError> {
        self.capture_in_sync = false;
        if !self.started {
            self.started = true;
            let previous: HashMap<EntryKey, u16> = self
                .capture
                .previous_redirects()
                .into_iter()
                .filter_map(|e| match e.action {
                    Action::Redirect(port) => Some((e.key, port)),
                    _ => None,
                })
                .collect();
            self.previous = Some(previous).filter(|p| !p.is_empty());
        }
        self.update_node(snapshot);
        let wanted: Vec<&Arc<ServicePort>> = snapshot
            .ports
            .values()
            .filter(|sp| self.handles(&sp.key))
            .collect();
        let keep: std::collections::HashSet<&PortKey> = wanted.iter().map(|sp| &sp.key).collect();
        self.ports.retain(|k, _| keep.contains(k));
        self.store = EntryStore::new();
        for port in self.ports.values_mut() {
            port.entries.clear();
        }
        // From an empty store, the operations of the rebuild add up to the whole capture.
        let mut rebuild = Vec::new();
        let node_entries = self.node_entries.clone();
        self.claim(NODE_OWNER, &[], &node_entries, &mut rebuild);
        for sp in wanted {
            self.upsert(sp, &mut rebuild)?;
        }
        // Only the first full sync's new listeners take previous ports.
        self.previous = None;
        let (_, mut entries) = kpng_backend_kit::claims::order(rebuild);
        entries.sort();
        let n = self
            .capture
            .replace(&entries)
            .map_err(|e| capture_error(e, entries.len()))?;
        self.capture_in_sync = true;
        Ok(n)
    }

    /// Applies the diff: every port touched counts one operation (its listeners took the new
    /// state), plus one per capture change.
    fn partial_sync(&mut self, request: &SyncRequest<'_>) -> Result<usize, BackendError> {
        let mut ops = Vec::new();
        let mut ports_touched = 0;
        if request.diff.node_changed {
            let old = std::mem::take(&mut self.node_entries);
            self.update_node(request.snapshot);
            let new = self.node_entries.clone();
            self.claim(NODE_OWNER, &old, &new, &mut ops);
            // Node IPs decide the load-balancer firewall's hairpin exception of every port.
            let all: Vec<Arc<ServicePort>> = request
                .snapshot
                .ports
                .values()
                .filter(|sp| self.ports.contains_key(&sp.key))
                .cloned()
                .collect();
            for sp in all {
                self.upsert(&sp, &mut ops)?;
            }
        }
        for (key, change) in &request.diff.changes {
            if !self.handles(key) {
                continue;
            }
            match &change.new {
                Some(sp) => self.upsert(sp, &mut ops)?,
                None => self.remove(key, &mut ops),
            }
            ports_touched += 1;
        }
        let changed = self
            .capture
            .update(&ops)
            .map_err(|e| capture_error(e, ops.len()))?;
        Ok(ports_touched + changed)
    }
}

/// The port a previous run's listener for `scope` of this Service port had, looked up by the
/// first of the port's capture keys that redirected to it.
fn previous_port(previous: &HashMap<EntryKey, u16>, sp: &ServicePort, scope: Scope) -> Option<u16> {
    let (protocol, port) = (sp.key.protocol, sp.port);
    let family = sp.key.family;
    let external = sp.external_ips.iter().chain(&sp.load_balancer_ips);
    let keys: Vec<EntryKey> = match scope {
        Scope::Internal => vec![EntryKey::Vip {
            ip: sp.cluster_ip,
            protocol,
            port,
        }],
        Scope::External => external
            .map(|ip| EntryKey::Vip {
                ip: *ip,
                protocol,
                port,
            })
            .chain(sp.node_port.map(|np| EntryKey::NodePort {
                family,
                protocol,
                port: np,
            }))
            .collect(),
        Scope::ShortCircuit => external
            .map(|ip| EntryKey::VipShortCircuit {
                ip: *ip,
                protocol,
                port,
            })
            .chain(sp.node_port.map(|np| EntryKey::NodePortShortCircuit {
                family,
                protocol,
                port: np,
            }))
            .collect(),
    };
    keys.iter().find_map(|k| previous.get(k).copied())
}

/// The error of a refused capture change of `operations` entries (a full replace counts every
/// entry, an update its deletes and adds), as a successful one counts them.
fn capture_error(e: capture::CaptureError, operations: usize) -> BackendError {
    BackendError::Transaction {
        backend: "userspace",
        operations,
        message: e.to_string(),
    }
}

impl Backend for UserspaceBackend {
    fn name(&self) -> &'static str {
        "userspace"
    }

    fn families(&self) -> Vec<Family> {
        self.config.families.clone()
    }

    fn register_metrics(&self, registry: &mut Registry) {
        self.metrics.register(registry);
    }

    fn watch_tampering(&mut self, alarm: kpng_backend::TamperAlarm) -> Result<bool, BackendError> {
        self.capture
            .watch(alarm)
            .map_err(|e| BackendError::Other(format!("watching the capture: {e}")))
    }

    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncStats, BackendError> {
        let result = if request.full || !self.capture_in_sync {
            self.full_sync(request.snapshot)
        } else {
            self.partial_sync(request)
        };
        match result {
            Ok(operations) => {
                debug!(operations, ports = self.ports.len(), "userspace sync done");
                self.metrics
                    .ports
                    .set(i64::try_from(self.ports.len()).unwrap_or(i64::MAX));
                Ok(SyncStats {
                    operations,
                    ..SyncStats::default()
                })
            }
            Err(e) => {
                self.capture_in_sync = false;
                Err(e)
            }
        }
    }

    /// Stops every listener and gives the connections they accepted
    /// [`UserspaceConfig::drain_on_exit`] to end: a client whose request is in flight when kpng
    /// is restarted gets its answer.
    fn exit_drain(&mut self) -> Option<ExitDrain> {
        Some(Box::pin(self.tasks.drain(self.config.drain_on_exit)))
    }

    fn cleanup(&mut self) -> Result<(), BackendError> {
        self.capture.cleanup().map_err(|e| {
            BackendError::Other(format!("removing the userspace proxy's capture: {e}"))
        })?;
        self.ports.clear();
        self.store = EntryStore::new();
        self.capture_in_sync = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
