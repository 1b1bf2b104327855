//! kpng's eBPF backend: socket-level load balancing.
//!
//! cgroup v2 `sock_addr` programs (`bpf/sock_lb.c`, built by clang from `build.rs`, loaded by
//! aya) translate a Service frontend into one of its endpoints when a socket of the cgroup
//! subtree connects (`connect4/6`) or sends an unconnected datagram (`sendmsg4/6`), and the
//! endpoint back into the frontend where the application reads its peer (`recvmsg4/6`,
//! `getpeername4/6`). A pod's connection to a ClusterIP is therefore a direct connection to
//! the endpoint: no per-packet rewrite, no conntrack NAT entry.
//!
//! The backend sees only the model: each Service port's frontends and the endpoint lists the
//! model computed ([`plan`]), written into pinned maps by diff ([`kernel`]). Traffic that does
//! not come from a local socket (north-south: node ports, external and load-balancer IPs from
//! outside, source ranges, externalTrafficPolicy Local, masquerading) is not this crate's: the
//! binary runs the nftables backend beside it (docs/backends.md, "eBPF").

pub mod batch;
pub mod counters;
pub mod host;
pub mod inspect;
pub mod kernel;
pub mod layout;
pub mod links;
pub mod metrics;
pub mod netns;
mod object;
pub mod owners;
pub mod pins;
pub mod plan;
pub mod sockets;
pub mod strays;

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use kpng_backend::settings::NodePortAddresses;
use kpng_backend::{Backend, BackendError, SyncRequest, SyncStats};
use kpng_model::{Family, Protocol, Snapshot};
use prometheus_client::registry::Registry;
use tracing::{debug, info, warn};

use crate::kernel::Kernel;
use crate::metrics::EbpfMetrics;
use crate::plan::{Entries, Group, Ids, MapId};

/// Why the backend could not do its work.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file-system or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Loading, attaching or a map operation was refused by the kernel.
    #[error("eBPF: {0}")]
    Bpf(String),
    /// The node lacks something the backend needs (cgroup v2, bpffs).
    #[error("{0}")]
    Setup(String),
}

impl Error {
    fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

impl From<Error> for BackendError {
    fn from(e: Error) -> BackendError {
        BackendError::Other(e.to_string())
    }
}

/// The default pin directory: the conventional bpffs mount point's `kpng` directory.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/kpng";

/// What the backend is configured with.
#[derive(Debug, Clone)]
pub struct EbpfConfig {
    /// Where maps and links are pinned (on a bpffs).
    pub pin_dir: PathBuf,
    /// The cgroup v2 directory the programs attach to; `None`: the root of the cgroup v2
    /// mount (every process of the node).
    pub cgroup: Option<PathBuf>,
    /// `--nodeport-addresses`: the node addresses whose node ports local sockets reach.
    pub nodeport_addresses: NodePortAddresses,
    /// Destroy connected UDP sockets whose endpoint left.
    pub destroy_udp_sockets: bool,
    /// `--socket-lb-host-netns-only`: translate only the sockets of kpng's own network
    /// namespace (the node's); pods' sockets go through the nftables rules, where a service
    /// mesh's sidecar (an iptables REDIRECT in the pod) still sees the Service address.
    pub host_netns_only: bool,
}

impl Default for EbpfConfig {
    fn default() -> Self {
        EbpfConfig {
            pin_dir: PathBuf::from(DEFAULT_PIN_DIR),
            cgroup: None,
            nodeport_addresses: NodePortAddresses::Primary,
            destroy_udp_sockets: true,
            host_netns_only: false,
        }
    }
}

/// The eBPF backend (see the crate documentation).
pub struct EbpfBackend {
    config: EbpfConfig,
    cgroup: Option<PathBuf>,
    kernel: Option<Kernel>,
    ids: Ids,
    /// Who owns a `kpng_frontends` key several ports want (a node port on an address that is
    /// also a Service IP): as the ports were last programmed.
    contest: plan::Contest,
    node_port_ips: HashMap<Family, Vec<IpAddr>>,
    metrics: EbpfMetrics,
    /// This kpng's hold on the pin directory, for as long as the backend lives.
    pin_lock: Option<host::PinLock>,
    /// A repair done while loading (other kpng programs detached from the cgroup), reported
    /// with the next sync's stats.
    pending_repair: Option<String>,
    /// The warning about UDP sockets that could not be found to destroy, at most once per
    /// ten minutes (a kpng without `hostPID` would say it at every endpoint change).
    missed_warning: sockets::Throttle,
}

/// The words for kpng programs of another generation detached from `cgroup`, logged as a
/// warning and shown as a repair. Detaching leaves the other kpng's pins (its links and maps,
/// in the kernel while pinned) where it left them, which this kpng cannot find from the
/// programs: the words tell the operator how to remove them.
fn strangers_detached(cgroup: &std::path::Path, detached: &[String]) -> String {
    format!(
        "kpng eBPF programs that are not this kpng's were attached to cgroup {}, detached: \
         {} (a previous kpng whose pins this one cannot see: another --bpf-pin-path, a bpffs of \
         its own, a DaemonSet without the host's /sys/fs/bpf; or a second kpng on this cgroup, \
         which is unsupported: two kpngs need their own --cgroup-path and --bpf-pin-path). \
         That kpng's pin directory (its links and maps) stays pinned: once no kpng uses it, \
         `kpng cleanup --bpf-pin-path DIR` with its directory removes it",
        cgroup.display(),
        detached.join(", ")
    )
}

impl EbpfBackend {
    /// The backend, holding the pin directory ([`host::lock_pins`]) while it lives.
    pub fn holding(mut self, lock: host::PinLock) -> EbpfBackend {
        self.pin_lock = Some(lock);
        self
    }

    /// A backend that loads its programs at the first sync.
    pub fn new(config: EbpfConfig) -> EbpfBackend {
        EbpfBackend {
            config,
            cgroup: None,
            kernel: None,
            ids: Ids::default(),
            contest: plan::Contest::default(),
            node_port_ips: HashMap::new(),
            metrics: EbpfMetrics::default(),
            pin_lock: None,
            pending_repair: None,
            missed_warning: sockets::Throttle::new(std::time::Duration::from_secs(600)),
        }
    }

    /// Pins again what someone unpinned ([`Kernel::restore_pins`]) and attaches again what
    /// someone detached ([`Kernel::reattach_detached`]); what was repaired, as a repair for
    /// `kpng status`. On a failure the kernel state is dropped, so that the retry loads and
    /// attaches everything again.
    fn repair_kernel(&mut self) -> Result<Option<String>, Error> {
        let Some(kernel) = self.kernel.as_mut() else {
            return Ok(None);
        };
        let repaired = kernel.restore_pins().and_then(|restored| {
            let reattached = kernel.reattach_detached()?;
            Ok((restored, reattached))
        });
        let (restored, reattached) = match repaired {
            Ok(done) => done,
            Err(e) => {
                self.kernel = None;
                if let Some(cgroup) = &self.cgroup {
                    self.metrics.set_attached(&kernel::PROGRAMS, cgroup, false);
                }
                return Err(e);
            }
        };
        let mut what = Vec::new();
        if !restored.is_empty() {
            let text = format!(
                "eBPF pins under {} removed by someone else, pinned again: {}",
                kernel.pin_dir().display(),
                restored.join(", ")
            );
            tracing::warn!("{text} (the programs kept translating: kpng holds them)");
            what.push(text);
        }
        if !reattached.is_empty() {
            let text = format!(
                "eBPF programs detached from their cgroup by someone else (bpftool link \
                 detach, or the cgroup removed), attached again: {}",
                reattached.join(", ")
            );
            tracing::warn!(
                "{text} (until now those hooks did nothing: local sockets reached Services \
                 through the nftables rules, or got UDP replies from the endpoint's address)"
            );
            what.push(text);
        }
        what.extend(self.pending_repair.take());
        // Another generation's programs run before this kpng's: they go (a failure to look
        // is logged, and the next periodic sync looks again).
        match kernel.detach_strangers() {
            Ok(detached) if !detached.is_empty() => {
                let text = strangers_detached(kernel.cgroup(), &detached);
                tracing::warn!(
                    "{text} (until now they ran before this kpng's programs and translated \
                     Service addresses from maps nobody updates)"
                );
                what.push(text);
            }
            Ok(_) => {}
            Err(e) => warn!("looking for other kpng programs on the cgroup: {e}"),
        }
        Ok((!what.is_empty()).then(|| what.join("; ")))
    }

    /// Publishes what each map costs the kernel and holds at most (after full syncs: the maps'
    /// memory only changes with their size class, and reading it costs a file read per map),
    /// and how full the programs' maps are.
    fn report_memory(&self) {
        let Some(kernel) = &self.kernel else { return };
        let mut total = 0;
        for (map, bytes) in kernel.memory() {
            total += bytes;
            EbpfMetrics::set_map(&self.metrics.memory, map, bytes);
        }
        for (map, capacity) in kernel.capacities() {
            EbpfMetrics::set_map(&self.metrics.max_entries, map, u64::from(capacity));
        }
        self.report_lru_entries();
        debug!("BPF maps: {total} bytes of kernel memory");
    }

    /// Publishes how many elements the programs' own maps hold (a batched dump of each: at
    /// full and periodic syncs, never on a change's sync).
    fn report_lru_entries(&self) {
        let Some(kernel) = &self.kernel else { return };
        for (map, n) in kernel.lru_entries() {
            EbpfMetrics::set_map(&self.metrics.entries, map, n as u64);
        }
    }

    /// Publishes the elements of the Service maps after a full sync: exactly the distinct keys
    /// it wanted (`wanted`, by map), since it deleted everything else.
    fn report_service_entries(&self, wanted: &[(MapId, usize)]) {
        for (m, n) in wanted {
            EbpfMetrics::set_map(&self.metrics.entries, m.name(), *n as u64);
        }
    }

    /// Loads and attaches the programs (adopting a previous kpng's pins) unless done.
    fn kernel(&mut self) -> Result<&mut Kernel, Error> {
        if self.kernel.is_none() {
            let cgroup = match &self.config.cgroup {
                Some(c) => c.clone(),
                None => {
                    if host::in_private_cgroup_namespace() {
                        warn!("{}", host::PRIVATE_CGROUP_NAMESPACE);
                    }
                    host::cgroup2_root()?
                }
            };
            let host_netns = if self.config.host_netns_only {
                Some(netns::own_cookie().map_err(|e| Error::Setup(netns::unsupported(&e)))?)
            } else {
                None
            };
            let k = Kernel::open(&self.config.pin_dir, &cgroup, host_netns)?;
            // Detached at once, before the first sync: until then the other generation's
            // programs would keep running ahead of these.
            match k.detach_strangers() {
                Ok(detached) if !detached.is_empty() => {
                    let text = strangers_detached(&cgroup, &detached);
                    warn!(
                        "{text} (they ran before this kpng's programs and translated Service \
                         addresses from maps nobody updates)"
                    );
                    self.pending_repair = Some(text);
                }
                Ok(_) => {}
                Err(e) => warn!("looking for other kpng programs on the cgroup: {e}"),
            }
            info!(
                "socket programs attached to cgroup {}, maps and links pinned under {}{}",
                cgroup.display(),
                self.config.pin_dir.display(),
                match host_netns {
                    Some(cookie) => format!(
                        "; translating the sockets of this network namespace only (cookie \
                         {cookie}, --socket-lb-host-netns-only): pods' go through the rules"
                    ),
                    None => String::new(),
                }
            );
            match k.counters() {
                Ok(map) => self.metrics.kernel.set(Some(map)),
                Err(e) => warn!("the programs' counters will not be exported: {e}"),
            }
            self.metrics.set_attached(&kernel::PROGRAMS, &cgroup, true);
            if self.config.destroy_udp_sockets && host::in_private_pid_namespace() {
                warn!("{}", host::PRIVATE_PID_NAMESPACE);
            }
            self.cgroup = Some(cgroup);
            self.kernel = Some(k);
        }
        self.kernel
            .as_mut()
            .ok_or_else(|| Error::Setup("eBPF programs not loaded".into()))
    }

    /// Computes the addresses node ports are served on again (reading the node's interface
    /// addresses when `--nodeport-addresses` needs them); returns whether they changed.
    fn refresh_node_port_ips(&mut self, snapshot: &Snapshot) -> bool {
        let mut local: Option<Vec<IpAddr>> = None;
        let mut changed = false;
        for family in Family::ALL {
            let scope = self
                .config
                .nodeport_addresses
                .scope_on(family, &snapshot.node);
            let ips = scope.addresses(family, &snapshot.node.ips, || {
                local
                    .get_or_insert_with(kpng_backend::host::local_addresses)
                    .clone()
            });
            changed |= self.node_port_ips.get(&family) != Some(&ips);
            self.node_port_ips.insert(family, ips);
        }
        changed
    }

    /// Converges the maps on `snapshot` from whatever they hold: the kernel's contents are
    /// read back a batch at a time into sealed tables (the frontends' values as digests,
    /// [`plan::digest`]), and each wanted element is compared with them as it is
    /// computed ([`plan::Converge`]) and written in batches, so no image of the wanted state
    /// is built beside the dump.
    ///
    /// Two passes over the ports: the first only marks what is still wanted, so that what is
    /// not can be deleted *before* the writes. A map full of unwanted elements (a crash
    /// between writes and deletes, someone else's writes) would otherwise refuse every new
    /// element, and the deletes at the end would never come. Deleted first: every unwanted
    /// frontend, and the slots and members no remaining frontend points at; the rest (what
    /// a frontend that is about to be rewritten still points at) after the writes.
    fn full(&mut self, snapshot: &Snapshot) -> Result<(usize, BTreeSet<UdpPair>), Error> {
        let started = std::time::Instant::now();
        self.refresh_node_port_ips(snapshot);
        let loaded = self.kernel.is_some();
        self.kernel()?;
        let opened = started.elapsed();
        let kernel = self
            .kernel
            .as_ref()
            .ok_or_else(|| Error::Setup("eBPF programs not loaded".into()))?;
        // Read back a batch at a time: the frontends' values as digests, and of those the
        // UDP ones' endpoints on the side (which UDP pairs go away).
        let mut old = Entries::default();
        let mut old_udp = Vec::new();
        for m in MapId::ALL {
            let table = kernel.dump(m, &mut |k, v| {
                if m == MapId::Frontends {
                    old_udp.extend(udp_inline(k, v));
                }
            })?;
            old.0.insert(m, table);
        }
        let dumped = started.elapsed();
        let empty = plan::Table::new(MapId::Frontends);
        let table = |m: MapId| old.table(m).unwrap_or(&empty);
        let mut frontends = plan::Converge::new(table(MapId::Frontends));
        let mut slots = plan::Converge::new(table(MapId::Slots));
        let mut members = plan::Converge::new(table(MapId::Members));
        // Frontends point at slots and members: those are always written first.
        let flush = |slots: &mut plan::Converge<'_>,
                     members: &mut plan::Converge<'_>,
                     frontends: Option<&mut plan::Converge<'_>>|
         -> Result<(), Error> {
            let (keys, values) = members.take();
            kernel.write(MapId::Members, &keys, &values)?;
            let (keys, values) = slots.take();
            kernel.write(MapId::Slots, &keys, &values)?;
            if let Some(f) = frontends {
                let (keys, values) = f.take();
                kernel.write(MapId::Frontends, &keys, &values)?;
            }
            Ok(())
        };
        let delete = |map: MapId, keys: &[u8]| -> Result<usize, Error> {
            let key_size = map.sizes().0.max(1);
            for chunk in keys.chunks(batch::CHUNK * key_size) {
                kernel.delete(map, chunk)?;
            }
            Ok(keys.len() / key_size)
        };
        self.ids.begin();
        // Who owns each shared key, before any port's frontends are computed.
        self.contest.clear();
        for port in snapshot.ports.values() {
            let node_ips = self.node_port_ips.get(&port.key.family);
            self.contest
                .declare(port, node_ips.map_or(&[], Vec::as_slice));
        }
        // The first pass: ids, and what is still wanted.
        for port in snapshot.ports.values() {
            let Some(proto) = layout::ip_proto(port.key.protocol) else {
                continue;
            };
            let node_ips = self.node_port_ips.get(&port.key.family);
            let node_ips = node_ips.map_or(&[][..], Vec::as_slice);
            for g in plan::won_groups(port, node_ips, &self.contest) {
                let preferred = self.ids.get(&port.key, g.scope).or_else(|| {
                    let (ip, p) = g.frontends.first()?;
                    table(MapId::Frontends)
                        .get(layout::frontend_key(*ip, *p, proto).as_slice())
                        .and_then(layout::service_id_of)
                });
                let id = self.ids.assign(&port.key, g.scope, preferred);
                plan::for_group(id, proto, &g, &mut |m, k, _| match m {
                    MapId::Frontends => frontends.keep(k),
                    MapId::Slots => slots.keep(k),
                    MapId::Members => members.keep(k),
                });
            }
        }
        // Unwanted frontends go first (nothing wants them); then the slots and members of
        // services no remaining frontend points at.
        let mut operations = delete(MapId::Frontends, &frontends.take_stale(|_, _| true))?;
        let pointed: BTreeSet<u32> = frontends
            .kept()
            .filter_map(|(_, v)| layout::service_id_of(v))
            .collect();
        let unpointed =
            |k: &[u8], _: &[u8]| layout::service_id_of(k).is_some_and(|id| !pointed.contains(&id));
        operations += delete(MapId::Slots, &slots.take_stale(unpointed))?;
        operations += delete(MapId::Members, &members.take_stale(unpointed))?;
        let udp = layout::ip_proto(Protocol::Udp);
        let mut udp_now = BTreeSet::new();
        for port in snapshot.ports.values() {
            let Some(proto) = layout::ip_proto(port.key.protocol) else {
                continue;
            };
            let node_ips = self.node_port_ips.get(&port.key.family);
            let node_ips = node_ips.map_or(&[][..], Vec::as_slice);
            for g in plan::won_groups(port, node_ips, &self.contest) {
                // Assigned by the first pass.
                let id = self.ids.assign(&port.key, g.scope, None);
                if Some(proto) == udp {
                    udp_now.extend(group_pairs(&g));
                }
                let (mut full_pointed, mut full_frontends) = (false, false);
                plan::for_group(id, proto, &g, &mut |m, k, v| match m {
                    MapId::Frontends => full_frontends |= frontends.put(k, v),
                    MapId::Slots => full_pointed |= slots.put(k, v),
                    MapId::Members => full_pointed |= members.put(k, v),
                });
                if full_frontends {
                    flush(&mut slots, &mut members, Some(&mut frontends))?;
                } else if full_pointed {
                    flush(&mut slots, &mut members, None)?;
                }
            }
        }
        flush(&mut slots, &mut members, Some(&mut frontends))?;
        self.ids.sweep();
        operations += frontends.written() + slots.written() + members.written();
        // What rewritten frontends pointed at until now.
        for (map, c) in [(MapId::Slots, &slots), (MapId::Members, &members)] {
            let keys: Vec<u8> = c.stale().flatten().copied().collect();
            operations += delete(map, &keys)?;
        }
        let gone: BTreeSet<UdpPair> = udp_pairs_with(old_udp, old.table(MapId::Slots))
            .into_iter()
            .filter(|pair| !udp_now.contains(pair))
            .collect();
        self.report_service_entries(&[
            (MapId::Frontends, frontends.wanted()),
            (MapId::Slots, slots.wanted()),
            (MapId::Members, members.wanted()),
        ]);
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        debug!(
            load_ms = if loaded { 0.0 } else { ms(opened) },
            dump_ms = ms(dumped - opened),
            write_ms = ms(started.elapsed() - dumped),
            in_kernel = old.len(),
            operations,
            "full sync of the socket maps"
        );
        Ok((operations, gone))
    }

    fn incremental(
        &mut self,
        request: &SyncRequest<'_>,
    ) -> Result<(usize, BTreeSet<UdpPair>), Error> {
        // (The node's addresses are unchanged, else this would be a full sync.)
        let plan::Replan { old, new, released } = plan::replan(
            &request.diff.changes,
            &request.snapshot.ports,
            &self.node_port_ips,
            &mut self.ids,
            &mut self.contest,
        );
        let steps = plan::steps(&old, &new);
        let now = udp_pairs(&new);
        let gone: BTreeSet<UdpPair> = udp_pairs(&old)
            .into_iter()
            .filter(|pair| !now.contains(pair))
            .collect();
        self.kernel()?.apply(&steps)?;
        // What the changed ports had in each map, and have now: the rest is unchanged.
        for m in MapId::ALL {
            let len = |e: &Entries| e.table(m).map_or(0, plan::Table::len);
            let delta = i64::try_from(len(&new)).unwrap_or(i64::MAX)
                - i64::try_from(len(&old)).unwrap_or(i64::MAX);
            self.metrics
                .entries
                .get_or_create(&metrics::MapLabel::of(m.name()))
                .inc_by(delta);
        }
        let operations = plan::count(&steps);
        for (key, scope) in released {
            self.ids.release(&key, scope);
        }
        Ok((operations, gone))
    }
}

/// The Service (`namespace/name`) with UDP frontend `frontend` in `snapshot`: its ClusterIP,
/// an external or load-balancer IP with its port, or a node port; `None` when none has it (the
/// Service was deleted).
fn udp_service_of(snapshot: &Snapshot, frontend: SocketAddr) -> Option<String> {
    let ip = frontend.ip().to_canonical();
    let udp = || {
        snapshot
            .ports
            .values()
            .filter(|p| p.key.protocol == Protocol::Udp)
    };
    // A Service IP first: a node port is only a port, on the node's addresses.
    udp()
        .find(|p| {
            p.port == frontend.port()
                && (p.cluster_ip == ip
                    || p.external_ips.contains(&ip)
                    || p.load_balancer_ips.contains(&ip))
        })
        .or_else(|| udp().find(|p| p.node_port == Some(frontend.port())))
        .map(|p| p.key.service.to_string())
}

/// A UDP frontend and one of its endpoints. When the pair goes (the endpoint left the
/// frontend's list), the sockets the programs translated to that endpoint *for that frontend*
/// are destroyed, as kube-proxy deletes the conntrack entries DNATed from the Service's IP to
/// the endpoint: a socket connected to the endpoint directly, or through another Service that
/// still has it, is left alone.
type UdpPair = (SocketAddr, SocketAddr);

/// The (frontend, endpoint) pairs of one group.
fn group_pairs(g: &Group) -> impl Iterator<Item = UdpPair> + '_ {
    g.frontends.iter().flat_map(|(ip, port)| {
        let frontend = SocketAddr::new(*ip, *port);
        g.endpoints.iter().map(move |ep| (frontend, *ep))
    })
}

/// A UDP frontend as (frontend, service id, the endpoints inline in its value).
type UdpInline = (SocketAddr, u32, Vec<SocketAddr>);

/// The frontend `k` → `v` as a [`UdpInline`] if it is a UDP one.
fn udp_inline(k: &[u8], v: &[u8]) -> Option<UdpInline> {
    let udp = layout::ip_proto(Protocol::Udp);
    if k.get(18) != udp.as_ref() {
        return None;
    }
    Some((
        layout::endpoint_of(k)?,
        layout::service_id_of(v)?,
        layout::service_endpoints(v),
    ))
}

/// The (frontend, endpoint) pairs of the UDP frontends in `e` (inline and overflow endpoints).
fn udp_pairs(e: &Entries) -> BTreeSet<UdpPair> {
    let inline = e
        .table(MapId::Frontends)
        .into_iter()
        .flat_map(plan::Table::iter)
        .filter_map(|(k, v)| udp_inline(k, v))
        .collect();
    udp_pairs_with(inline, e.table(MapId::Slots))
}

/// The (frontend, endpoint) pairs of the UDP frontends `inline`, with their overflow endpoints
/// from `slots`.
fn udp_pairs_with(inline: Vec<UdpInline>, slots: Option<&plan::Table>) -> BTreeSet<UdpPair> {
    let ids: BTreeSet<u32> = inline.iter().map(|(_, id, _)| *id).collect();
    let mut overflow: HashMap<u32, Vec<SocketAddr>> = HashMap::new();
    for (k, v) in slots.into_iter().flat_map(plan::Table::iter) {
        if let (Some(id), Some(ep)) = (layout::service_id_of(k), layout::endpoint_of(v))
            && ids.contains(&id)
        {
            overflow.entry(id).or_default().push(ep);
        }
    }
    let mut out = BTreeSet::new();
    for (frontend, id, endpoints) in inline {
        let more = overflow.get(&id).map_or(&[][..], Vec::as_slice);
        out.extend(endpoints.iter().chain(more).map(|ep| (frontend, *ep)));
    }
    out
}

impl Backend for EbpfBackend {
    fn name(&self) -> &'static str {
        "ebpf"
    }

    fn register_metrics(&self, registry: &mut Registry) {
        self.metrics.register(registry);
    }

    /// Loads and attaches the programs and opens (or adopts) the maps: about a third of a
    /// cold 30k-Service sync's time in this half, spent while the cluster is still listed.
    fn prepare(&mut self) -> Result<(), BackendError> {
        self.kernel()?;
        Ok(())
    }

    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncStats, BackendError> {
        // Periodic syncs (nothing changed) and full ones check the pins and the programs'
        // attachment, as the iptables backend checks its canary chain.
        let repaired = if request.full || request.diff.is_empty() {
            self.repair_kernel()?
        } else {
            None
        };
        // A periodic sync also looks at the node's addresses again, as kube-proxy does at every
        // sync: one that came or went (a VIP moving between nodes) gets or loses its node
        // ports, through a full converge (rare; a change's sync never reads them).
        let addresses_moved = !request.full
            && request.diff.is_empty()
            && self.kernel.is_some()
            && self.refresh_node_port_ips(request.snapshot);
        let (operations, gone) = if request.full || request.diff.node_changed || addresses_moved {
            let done = self.full(request.snapshot)?;
            self.report_memory();
            done
        } else {
            let done = self.incremental(request)?;
            if request.diff.is_empty() {
                self.report_lru_entries();
            }
            done
        };
        if self.config.destroy_udp_sockets && !gone.is_empty() {
            // Only the sockets the programs translated for a gone pair: the reverse map names
            // each by its cookie.
            let translated = self
                .kernel
                .as_ref()
                .map(|k| k.translated_sockets(&gone))
                .unwrap_or_default();
            let targets: std::collections::BTreeMap<u64, SocketAddr> = translated
                .iter()
                .map(|(cookie, (_, endpoint))| (*cookie, *endpoint))
                .collect();
            if let Some(cgroup) = &self.cgroup
                && !targets.is_empty()
            {
                let sockets::Destroyed {
                    destroyed,
                    failed,
                    missing,
                    namespaces,
                    cookies,
                } = sockets::destroy_udp(cgroup, &targets);
                // Not found, and still in the reverse map: open sockets kpng cannot reach.
                let missed = if missing.is_empty() {
                    0
                } else {
                    let now: std::collections::BTreeMap<u64, SocketAddr> = self
                        .kernel
                        .as_ref()
                        .map(|k| k.translated_sockets(&gone))
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(cookie, (_, endpoint))| (cookie, endpoint))
                        .collect();
                    sockets::still_there(&missing, &now)
                };
                self.metrics.sockets_destroyed.inc_by(destroyed as u64);
                self.metrics
                    .socket_destroy_failures
                    .inc_by((failed + missed) as u64);
                if failed > 0 {
                    warn!(
                        "{failed} UDP sockets translated to endpoints that left their Service \
                         could not be destroyed (see the warnings above)"
                    );
                }
                if missed > 0 {
                    let why =
                        sockets::miss_reason(cgroup, namespaces, host::in_private_pid_namespace());
                    if self.missed_warning.allow(std::time::Instant::now()) {
                        warn!(
                            "{missed} UDP sockets translated to endpoints that left their \
                             Service were not found, so not destroyed: {why} (counted in \
                             kpng_ebpf_udp_socket_destroy_failures_total; this warning at most \
                             every 10 minutes)"
                        );
                    } else {
                        debug!("{missed} UDP sockets to destroy not found: {why}");
                    }
                }
                let n = destroyed;
                if n > 0 {
                    let which = sockets::destroyed_by_service(&cookies, &translated, |f| {
                        udp_service_of(request.snapshot, f)
                    });
                    info!(
                        "destroyed {n} UDP sockets translated to endpoints that left their \
                         Service ({} pairs gone): {which}; their applications get EDESTADDRREQ \
                         (\"Destination address required\") at their next send and must \
                         reconnect (docs/backends.md)",
                        gone.len()
                    );
                }
            }
        }
        Ok(SyncStats {
            operations,
            repaired,
            ..SyncStats::default()
        })
    }

    fn cleanup(&mut self) -> Result<(), BackendError> {
        self.kernel = None;
        self.metrics.kernel.set(None);
        pins::remove(&self.config.pin_dir)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {

    /// After a restart with another `--bpf-pin-path`, the old programs were detached but the
    /// old pin directory stayed pinned, unmentioned: the warning says how to remove it.
    #[test]
    fn detached_strangers_say_how_to_remove_their_pins() {
        let text = strangers_detached(
            std::path::Path::new("/sys/fs/cgroup"),
            &["kpng_connect4 (program 283)".to_string()],
        );
        assert!(
            text.contains("cgroup /sys/fs/cgroup")
                && text.contains("kpng_connect4 (program 283)")
                && text.contains("stays pinned")
                && text.contains("kpng cleanup --bpf-pin-path DIR"),
            "{text}"
        );
    }
    use super::*;

    /// A full sync reads the old UDP pairs as the frontends stream by (their values are kept
    /// only as digests): the same pairs as from whole tables, overflow slots included.
    #[test]
    fn udp_pairs_read_while_streaming_are_the_tables_pairs() {
        let udp = layout::ip_proto(Protocol::Udp).unwrap_or(17);
        let eps = |n: u16| -> Vec<SocketAddr> {
            (1..=n)
                .map(|i| SocketAddr::from(([10, 0, 0, 1], 1000 + i)))
                .collect()
        };
        // (what, protocol, endpoints): inline only, overflowing into slots, TCP (no pair).
        let cases: [(&str, u8, u16); 3] = [
            ("a short UDP list", udp, 3),
            ("a UDP list longer than the inline endpoints", udp, 12),
            ("TCP", 6, 3),
        ];
        for (what, proto, n) in cases {
            let g = Group {
                scope: plan::Scope::Internal,
                frontends: vec![("10.96.0.10".parse().expect("ip"), 53)],
                endpoints: eps(n),
                affinity_seconds: 0,
                refuse: false,
            };
            let mut e = Entries::default();
            e.add_group(7, proto, &g);
            e.seal();
            let streamed: Vec<UdpInline> = e
                .table(MapId::Frontends)
                .into_iter()
                .flat_map(plan::Table::iter)
                .filter_map(|(k, v)| udp_inline(k, v))
                .collect();
            let pairs = udp_pairs_with(streamed, e.table(MapId::Slots));
            assert_eq!(pairs, udp_pairs(&e), "{what}");
            let want = if proto == udp { usize::from(n) } else { 0 };
            assert_eq!(pairs.len(), want, "{what}");
        }
    }
}
