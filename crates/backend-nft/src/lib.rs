//! kpng's nftables backend: upstream kube-proxy nftables-mode behaviour with a ruleset whose
//! size does not grow with Services or endpoints.
//!
//! - [`ruleset`]: the constant table (named sets, maps and a fixed set of chains);
//! - [`sets`]: the one declaration of every set and map, which both the skeleton text and the
//!   netlink byte layout are generated from;
//! - [`value`]: typed element keys and values (`Display` is nft's text, netlink encodes the
//!   fields);
//! - [`elements`]: one Service port → its set/map elements (all per-Service state lives there);
//! - [`store`]: elements as claims in the backend kit's owner-keyed store, diffed into minimal
//!   add/delete operations;
//! - [`exec`]: one transaction through libnftables or `nft -f -` (atomic), or the kit's dry run,
//!   or its recorder for tests;
//! - [`netlink`]: elements straight over netlink ([`netlink::ElementWriter`]), or a fake.
//!
//! The first full sync of each family reads the kernel once
//! ([`netlink::ElementWriter::probe_table`]: the table and its `skeleton` marker chain, which
//! says the layout and skeleton it was written with, never its elements) and decides: adopt a
//! table a previous run left (its sets read once each and sent only what differs, in one
//! transaction: `diff_refill`), put the rules back then the sets (same layout, another
//! configuration, or tampered with: the sets diffed too when the skeleton is this one), or
//! replace it whole. Either way
//! established connections are untouched, because their NAT lives in conntrack. A full sync
//! that reuses the table also lists its chains (one chain dump) to delete the dynamic chains no
//! element refers to. Every other sync sends only the elements that changed, and the sync loop
//! never reads the kernel. See
//! `docs/nftables.md`.

pub mod affinity;
pub mod affinity_seed;
mod chain_refs;
mod diff_refill;
pub mod elements;
pub mod exec;
mod fill;
pub mod netlink;
mod own_commits;
pub mod ruleset;
mod script;
pub mod sets;
pub mod store;
pub mod value;

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

use ipnet::IpNet;
use kpng_backend::host as local_addrs;
use kpng_backend::settings::NodePortScope;
use kpng_backend::{Backend, BackendError, SyncRequest, SyncStats, TamperAlarm};
use kpng_model::{Family, PortKey, Snapshot};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tracing::{debug, info, warn};

use crate::exec::NftExec;
use crate::netlink::{ElementWriter, ProbedTable};
use crate::ruleset::{DetectLocal, Fam, StaticConfig};
use crate::sets::Set;
use crate::store::{Element, ElementStore};
use crate::value::Key;
use kpng_backend_kit::families::sync_each;
use kpng_backend_kit::owners::{NODE_OWNER, OwnerId, OwnerIds};

pub use kpng_backend::settings::NodePortAddresses;

/// Configuration of the nftables backend.
#[derive(Debug, Clone)]
pub struct NftConfig {
    /// Our table's name in both families (`kpng`).
    pub table: String,
    /// `--masquerade-all`.
    pub masquerade_all: bool,
    /// `--masquerade-bit` (14 → mark 0x4000).
    pub masquerade_bit: u8,
    /// `--conntrack-mark-mask`: the bits of the conntrack mark that carry affinity ids (checked
    /// with [`affinity::check_mask`]); every other bit of a connection's mark is kept.
    pub conntrack_mark_mask: u32,
    /// `--detect-local-mode` with its parameters.
    pub detect_local: DetectLocal,
    /// `--nodeport-addresses`.
    pub nodeport_addresses: NodePortAddresses,
    /// `--service-cidr`: traffic to unallocated IPs inside them is dropped (as inside the
    /// cluster's ServiceCIDR objects, which come with the snapshot).
    pub service_cidrs: Vec<IpNet>,
    /// The families to program.
    pub families: Vec<Family>,
}

impl Default for NftConfig {
    fn default() -> Self {
        NftConfig {
            table: "kpng".into(),
            masquerade_all: false,
            masquerade_bit: 14,
            conntrack_mark_mask: affinity::DEFAULT_CONNTRACK_MARK_MASK,
            detect_local: DetectLocal::None,
            nodeport_addresses: NodePortAddresses::Primary,
            service_cidrs: Vec::new(),
            families: Family::ALL.to_vec(),
        }
    }
}

#[derive(Debug)]
struct FamilyState {
    fam: Fam,
    store: ElementStore,
    /// Dynamic chains that exist in the kernel.
    chains: BTreeSet<String>,
    /// How many committed elements refer to each dynamic chain: a chain none refers to is
    /// deleted after the partial sync that removed its last reference.
    chain_refs: chain_refs::ChainRefs,
    /// The static configuration last committed; `None` until the first full sync succeeds.
    committed: Option<StaticConfig>,
    /// What the kernel's table is known to be: `Unknown` until probed once at start-up.
    kernel: KernelTable,
    /// Someone else changed the table: a table that is still there gets its rules back
    /// ([`script::restore_rules`]) before its sets are refilled (adopting alone refills sets
    /// only, and the rules may be what was changed).
    distrust: bool,
    /// Putting the rules back in place failed (the table no longer fits the skeleton's
    /// declarations): the next full sync replaces the table whole.
    replace_whole: bool,
    /// The last full sync adopted the table's rules as they were and refilled its sets in
    /// one transaction ([`SyncStats::kept_rules`]).
    kept_rules: bool,
    /// A full sync has committed this table: finding it absent later means someone deleted it.
    ever_committed: bool,
    /// The last full sync read the table's elements and sent their difference
    /// ([`diff_refill`]), and that failed: the next full sync flushes and refills without
    /// reading (trusting nothing read, and naming an element the kernel rejects). Cleared by
    /// a full sync that succeeds.
    refill_next: bool,
    /// This sync committed the table whole (created, replaced or refilled): it is confirmed
    /// once the sync's window of own changes has closed ([`NftBackend::confirm`]).
    full_done: bool,
    /// The table's rules (chain, handle) as read after kpng's last own change of them, when
    /// no one else committed meanwhile: what a sync someone else's commit overlapped is
    /// compared with ([`NftBackend::check_overlap`]). `None`: not read (yet).
    rules_seen: Option<Vec<(String, u64)>>,
}

/// How a full sync treats a table in the kernel that has our skeleton.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Adopt {
    /// Not adopted: created, or replaced whole.
    No,
    /// Its sets read and sent only what differs ([`diff_refill`]), or flushed and refilled,
    /// in one transaction; its rules trusted.
    Sets,
    /// Its rules put back first ([`script::restore_rules`]): someone else changed them, or
    /// the table has another skeleton of our layout (another configuration).
    RulesAndSets,
}

/// What we know of our table in the kernel (read once, at start-up; never in the sync loop).
#[derive(Debug, Clone, PartialEq, Eq)]
enum KernelTable {
    /// Not looked at yet.
    Unknown,
    /// No such table.
    Absent,
    /// A table whose skeleton marker is this (empty: none, or not to be trusted).
    Skeleton(String),
}

/// The nftables backend's own metrics.
#[derive(Debug, Clone, Default)]
struct NftMetrics {
    /// `kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family}`: refused
    /// transactions of that family's table (kube-proxy's, one proxier per family).
    sync_failures:
        prometheus_client::metrics::family::Family<kpng_backend::metrics::FamilyLabel, Counter>,
    /// `kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total{ip_family}`: failed
    /// removals of that family's table.
    cleanup_failures:
        prometheus_client::metrics::family::Family<kpng_backend::metrics::FamilyLabel, Counter>,
    /// `kpng_nftables_elements{ip_family}`: set and map elements kpng programmed (its in-memory
    /// view of the kernel's, updated after every successful sync).
    elements: prometheus_client::metrics::family::Family<
        kpng_backend::metrics::FamilyLabel,
        prometheus_client::metrics::gauge::Gauge,
    >,
    /// `kpng_nftables_dynamic_chains{ip_family}`: dynamic chains (one per distinct endpoint count and
    /// affinity timeout, never per Service).
    chains: prometheus_client::metrics::family::Family<
        kpng_backend::metrics::FamilyLabel,
        prometheus_client::metrics::gauge::Gauge,
    >,
}

/// What kpng keeps in one family's table, for `kpng status`: the table to look at, and how big
/// it is (the same figures as `kpng_nftables_elements` and `kpng_nftables_dynamic_chains`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Committed {
    /// The family.
    pub family: Family,
    /// Set and map elements.
    pub elements: usize,
    /// Dynamic chains (one per distinct endpoint count and affinity timeout).
    pub chains: usize,
}

/// The figures of every family programmed, written after each successful sync and read by
/// the status (never the kernel: listing a 30k-Service table takes seconds).
pub type SharedCommitted = std::sync::Arc<std::sync::Mutex<Vec<Committed>>>;

/// The nftables backend.
pub struct NftBackend {
    /// Whether to watch the kernel for changes others make to our tables (off for dry runs
    /// and tests without a kernel).
    watch_kernel: bool,
    /// The watcher, once the runner asked for it ([`Backend::watch_tampering`]).
    monitor: Option<netlink::monitor::TableMonitor>,
    /// The anchor tables, held from the runner's start to the process's end: established
    /// connections keep their NAT through a foreign `nft flush ruleset`
    /// (`kpng_netfilter::anchor`).
    _anchor: Option<kpng_netfilter::anchor::Anchor>,
    config: NftConfig,
    exec: Box<dyn NftExec>,
    /// kpng's own commits (through `exec` and `netlink`), counted against the kernel's
    /// generation id ([`NftBackend::check_overlap`]).
    own: own_commits::OwnCommits,
    /// Reads the kernel's generation id and our tables' rules ([`NftBackend::check_overlap`])
    /// over one socket kept for the process's life: a socket closed after every sync cost an
    /// RCU grace period per change (`kpng_netfilter::generation::KernelReader`).
    kernel_reader: kpng_netfilter::generation::KernelReader,
    /// Service port ↔ its owner id; the reverse recomputes an owner's elements when a shared
    /// element passes to it.
    owners: OwnerIds,
    /// Affinity ids of the Service ports with ClientIP affinity.
    affinity_ids: affinity::AffinityIds,
    /// The first sync read back the affinity ids of the tables it adopts (once per process:
    /// after that, the allocator's memory is what the tables hold).
    affinity_seeded: bool,
    states: Vec<FamilyState>,
    metrics: NftMetrics,
    warned_no_node_ip: bool,
    /// The node's interface addresses as last read, for `--nodeport-addresses` other than
    /// `primary`. Read again at full syncs, node changes and the periodic (empty) syncs, so
    /// that an address added to or removed from the node gets or loses its node ports within
    /// a sync period, as kube-proxy reads them again at every sync; not at a change's sync,
    /// which stays free of the `ip` call.
    local_addrs: Vec<IpAddr>,
    /// The families whose table this sync found deleted by someone else without a
    /// notification saying so: reported as a repair ([`SyncStats::repaired`]).
    found_gone: Vec<Family>,
    /// Element writes over netlink (see [`netlink`]); `None`: everything goes as nft text.
    netlink: Option<Box<dyn ElementWriter>>,
    /// What is committed, for `kpng status`.
    committed: SharedCommitted,
    /// The runner's alarm (kept from [`Backend::watch_tampering`]): a table found deleted
    /// right after a sync of kpng's committed it is reported through it, so that the repair
    /// comes a few milliseconds later instead of at the next full sync.
    alarm: Option<TamperAlarm>,
}

impl NftBackend {
    /// Sends set and map elements over netlink instead of nft text: no parsing (a 300k-element
    /// load takes ~0.7 s instead of ~2.7 s), and ~50 µs per small change. Chains and the
    /// skeleton still go through `exec`.
    pub fn with_netlink(mut self, writer: impl ElementWriter + 'static) -> NftBackend {
        self.netlink = Some(self.own.writer(Box::new(writer)));
        self
    }

    /// Watches the kernel for changes others make to our tables (nf_tables notifications,
    /// see [`netlink::monitor`]) and reports them to the runner, which repairs them with a
    /// full sync. For backends that program this network namespace's kernel.
    pub fn watching_kernel(mut self) -> NftBackend {
        self.watch_kernel = true;
        self
    }

    /// Foreign changes to our tables seen so far, and notifications taken for our own
    /// (diagnostics).
    pub fn tampering_seen(&self) -> Option<(u64, u64)> {
        self.monitor
            .as_ref()
            .map(|m| (m.foreign_seen(), m.own_seen()))
    }

    /// What this backend has committed, shared with `kpng status` (updated after each
    /// successful sync).
    pub fn committed(&self) -> SharedCommitted {
        self.committed.clone()
    }

    /// The table's name (in every family).
    pub fn table(&self) -> &str {
        &self.config.table
    }

    /// A backend that commits through `exec`.
    pub fn new(config: NftConfig, exec: Box<dyn NftExec>) -> NftBackend {
        let states = config
            .families
            .iter()
            .map(|f| FamilyState {
                fam: Fam(*f),
                store: ElementStore::new(),
                chains: BTreeSet::new(),
                chain_refs: chain_refs::ChainRefs::default(),
                committed: None,
                kernel: KernelTable::Unknown,
                distrust: false,
                replace_whole: false,
                kept_rules: false,
                ever_committed: false,
                refill_next: false,
                full_done: false,
                rules_seen: None,
            })
            .collect();
        let affinity_ids = affinity::AffinityIds::new(config.conntrack_mark_mask);
        let own = own_commits::OwnCommits::default();
        NftBackend {
            watch_kernel: false,
            monitor: None,
            _anchor: None,
            config,
            exec: own.exec(exec),
            own,
            kernel_reader: kpng_netfilter::generation::KernelReader::new(),
            owners: OwnerIds::new(),
            affinity_ids,
            affinity_seeded: false,
            states,
            metrics: NftMetrics::default(),
            warned_no_node_ip: false,
            local_addrs: Vec::new(),
            found_gone: Vec::new(),
            netlink: None,
            committed: SharedCommitted::default(),
            alarm: None,
        }
    }

    fn owner(&mut self, key: &PortKey) -> OwnerId {
        self.owners.id(key)
    }

    /// Node-level elements of one family: NodePort addresses and Service CIDRs.
    fn node_elements(&self, fam: Fam, snapshot: &Snapshot) -> Vec<Element> {
        self.node_elements_with(fam, snapshot, &self.local_addrs)
    }

    /// Whether any family's node ports depend on the node's interface addresses: only CIDR
    /// scopes list them; every local address is matched in the kernel.
    fn reads_local_addresses(&self, node: &kpng_model::NodeState) -> bool {
        self.states.iter().any(|s| {
            matches!(
                self.config.nodeport_addresses.scope_on(s.fam.0, node),
                kpng_backend::settings::NodePortScope::Cidrs(_)
            )
        })
    }

    /// Reads the node's interface addresses again when node ports depend on them; returns the
    /// previous ones when they changed.
    fn refresh_local_addresses(&mut self, node: &kpng_model::NodeState) -> Option<Vec<IpAddr>> {
        if !self.reads_local_addresses(node) {
            return None;
        }
        let now = local_addrs::local_addresses();
        (now != self.local_addrs).then(|| std::mem::replace(&mut self.local_addrs, now))
    }

    /// [`NftBackend::node_elements`] as they are with the interface addresses `local`.
    fn node_elements_with(&self, fam: Fam, snapshot: &Snapshot, local: &[IpAddr]) -> Vec<Element> {
        let family = fam.0;
        let loopback = |ip: &IpAddr| ip.is_loopback();
        // Every local address is `fib daddr type local` in the rules: no set to fill.
        let nodeport_ips = match self
            .config
            .nodeport_addresses
            .scope_on(family, &snapshot.node)
        {
            NodePortScope::AllLocal => Vec::new(),
            scope => scope.addresses(family, &snapshot.node.ips, || local.to_vec()),
        };
        let mut out: Vec<Element> = nodeport_ips
            .into_iter()
            .filter(|ip| !loopback(ip))
            .map(|ip| Element {
                set: Set::NodeportIps,
                key: Key::Addr(ip),
                value: None,
                comment: None,
            })
            .collect();
        // `--service-cidr` and the cluster's ServiceCIDR objects alike.
        let all: Vec<IpNet> = self
            .config
            .service_cidrs
            .iter()
            .chain(&snapshot.service_cidrs)
            .copied()
            .collect();
        let cidrs = IpNet::aggregate(&all);
        out.extend(
            cidrs
                .iter()
                .filter(|c| Family::of(&c.addr()) == family)
                .map(|c| Element {
                    set: Set::ServiceCidrs,
                    key: Key::Net(*c),
                    value: None,
                    comment: None,
                }),
        );
        out
    }

    /// The elements of one port, with the affinity ids it has now.
    fn port_elements(
        &self,
        port: &kpng_model::ServicePort,
        owner: OwnerId,
        node_ips: &[IpAddr],
    ) -> Vec<Element> {
        elements::port_elements(port, self.affinity_ids.get(owner), node_ips)
    }

    /// Gives `port` affinity ids if it has ClientIP affinity, or takes them back if not; a
    /// full mask is said once per port (it is then served without affinity).
    fn assign_affinity_ids(&mut self, port: &kpng_model::ServicePort, owner: OwnerId) {
        if port.session_affinity.is_none() {
            self.affinity_ids.release(owner);
            return;
        }
        if let Err(true) = self.affinity_ids.ensure(owner) {
            warn!(
                service = %port.key.service,
                port = %port.key.port_name,
                mask = format_args!("{:#010x}", self.affinity_ids.mask()),
                in_use = self.affinity_ids.in_use(),
                "ClientIP affinity ids are exhausted (--conntrack-mark-mask has room for {} \
                 Service ports): this port is served without affinity; widen the mask",
                self.affinity_ids.capacity()
            );
        }
    }

    fn warn_unsupported(&mut self, request: &SyncRequest<'_>) {
        if !self.warned_no_node_ip
            && self.config.nodeport_addresses == NodePortAddresses::Primary
            && request.snapshot.node.ips.is_empty()
            && !request.snapshot.node.nodeports_on_all_local
        {
            // Named, so that a wrong name (an unexpanded `$(NODE_NAME)`, a short hostname
            // where the Node is an FQDN) shows at once.
            warn!(
                "the node's IPs are unknown (no Node named {:?} with addresses, and no \
                 --node-ip): NodePorts are not served until they are known or the wait for \
                 them ends (then on every local address, as kube-proxy)",
                request.snapshot.node.name
            );
            self.warned_no_node_ip = true;
        }
    }

    /// Recomputes `owner`'s copy of `e` (same set and key) from the model.
    fn resolve(
        &self,
        owner: OwnerId,
        e: &Element,
        fam: Fam,
        snapshot: &Snapshot,
        node_ips: &[IpAddr],
    ) -> Option<Element> {
        let elements = if owner == NODE_OWNER {
            self.node_elements(fam, snapshot)
        } else {
            let port = snapshot.ports.get(self.owners.key(owner)?)?;
            self.port_elements(port, owner, node_ips)
        };
        elements
            .into_iter()
            .find(|x| x.set == e.set && x.key == e.key)
    }

    fn static_config(&self, fam: Fam, snapshot: &Snapshot) -> StaticConfig {
        StaticConfig::new(
            fam,
            self.config.masquerade_all,
            self.config.masquerade_bit,
            self.config.conntrack_mark_mask,
            &self.config.detect_local,
            &snapshot.node,
            self.config
                .nodeport_addresses
                .scope_on(fam.0, &snapshot.node)
                == NodePortScope::AllLocal,
        )
    }

    /// The error of a failed sync of family `index`. Not "transaction of N operations": the
    /// transaction refused may be the skeleton's or a chain's text, while `ops` counts the
    /// elements the sync sent (an IPv6 table without Services failed as "0 operations").
    fn fail_with(&self, index: usize, ops: usize, message: String) -> BackendError {
        self.metrics
            .sync_failures
            .get_or_create(&self.states[index].fam.0.into())
            .inc();
        BackendError::Other(format!(
            "nftables transaction failed (the sync had {ops} element operations): {} table: \
             {message}",
            self.states[index].fam.table_family()
        ))
    }

    /// Syncs one family; `addresses_were` are the node's interface addresses before this
    /// sync read them again, when they changed.
    fn sync_family(
        &mut self,
        index: usize,
        request: &SyncRequest<'_>,
        addresses_were: Option<&[IpAddr]>,
    ) -> Result<usize, BackendError> {
        let fam = self.states[index].fam;
        let family = fam.0;
        let cfg = self.static_config(fam, request.snapshot);
        // A node change (IPs, pod CIDRs) is rare and touches node-level elements and the
        // load-balancer firewall exception of every port: simplest done as a full sync.
        let full = request.full
            || request.diff.node_changed
            || self.states[index].committed.as_ref() != Some(&cfg);
        let node_ips = request.snapshot.node.ips.clone();
        if full {
            return self.full_sync(index, request, cfg);
        }

        let mut ops = Vec::new();
        let mut store = std::mem::take(&mut self.states[index].store);
        for (key, change) in request
            .diff
            .changes
            .iter()
            .filter(|(k, _)| k.family == family)
        {
            let owner = self.owner(key);
            // The old elements with the ids they were written with, then the new ids.
            let old = change
                .old
                .as_deref()
                .map(|p| self.port_elements(p, owner, &node_ips))
                .unwrap_or_default();
            match change.new.as_deref() {
                Some(p) => self.assign_affinity_ids(p, owner),
                None => self.affinity_ids.release(owner),
            }
            let new = change
                .new
                .as_deref()
                .map(|p| self.port_elements(p, owner, &node_ips))
                .unwrap_or_default();
            let this: &NftBackend = self;
            let resolve =
                |o: OwnerId, e: &Element| this.resolve(o, e, fam, request.snapshot, &node_ips);
            store.change_owner(owner, &old, &new, &mut ops, &resolve);
        }
        if let Some(before) = addresses_were {
            let old = self.node_elements_with(fam, request.snapshot, before);
            let new = self.node_elements(fam, request.snapshot);
            if old != new {
                info!(
                    family = %family,
                    "the node's addresses changed: node ports follow (--nodeport-addresses)"
                );
                let this: &NftBackend = self;
                let resolve =
                    |o: OwnerId, e: &Element| this.resolve(o, e, fam, request.snapshot, &node_ips);
                store.change_owner(NODE_OWNER, &old, &new, &mut ops, &resolve);
            }
        }
        self.states[index].store = store;
        if ops.is_empty() {
            return Ok(0);
        }
        let count = ops.len();
        let mut refs_after = self.states[index].chain_refs.clone();
        refs_after.apply(&ops);
        let result = if self.netlink.is_some() {
            self.partial_over_netlink(index, ops)
        } else {
            let (text, new_chains) = script::partial(
                fam,
                &self.config.table,
                self.config.conntrack_mark_mask,
                &self.states[index].chains,
                ops,
            );
            self.exec
                .run(&text)
                .map(|()| self.states[index].chains.extend(new_chains))
                .map_err(|e| e.to_string())
        };
        if let Err(message) = result {
            // Our in-memory view is now ahead of the kernel: force the next sync to be full,
            // and let it look at the table again (someone may have deleted it, or its chains,
            // while this transaction was on its way: trusting what we knew would fail the
            // retry the same way).
            let state = &mut self.states[index];
            state.committed = None;
            state.kernel = KernelTable::Unknown;
            state.chains.clear();
            return Err(self.fail_with(index, count, message));
        }
        self.states[index].chain_refs = refs_after;
        self.delete_unreferenced_chains(index);
        Ok(count)
    }

    /// Deletes the dynamic chains no committed element refers to any more, in a transaction
    /// of its own after the sync's: should nft refuse (something else jumps to one), the sync
    /// has succeeded all the same, and the chains stay until the next full sync tries again
    /// ([`NftBackend::delete_chains_the_table_holds_unreferenced`]).
    fn delete_unreferenced_chains(&mut self, index: usize) {
        let state = &self.states[index];
        let stale = state.chain_refs.unreferenced(&state.chains);
        if stale.is_empty() {
            return;
        }
        let text = script::delete_chains(state.fam, &self.config.table, &stale);
        match self.exec.run(&text) {
            Ok(()) => {
                debug!(chains = ?stale, "deleted dynamic chains no element refers to any more");
                for chain in &stale {
                    self.states[index].chains.remove(chain);
                }
            }
            Err(e) => {
                debug!(chains = ?stale, "could not delete unreferenced dynamic chains: {e}");
                // Not tried again before the next full sync, which lists the table's
                // chains and tries again.
                self.states[index].chain_refs.keep(stale);
            }
        }
    }

    /// After a full sync that reused the table (start-up adoption, a repair, the periodic
    /// full sync): learns, with one chain dump, which dynamic chains the table holds, and
    /// deletes those no element refers to as [`NftBackend::delete_unreferenced_chains`] does.
    ///
    /// Why: the per-sync delete knows only the chains this process created, while an adopted
    /// table may hold a previous run's (`cluster-n3` of a Service that had 3 endpoints before
    /// the restart), someone's (`nft add chain ip kpng cluster-n9`), or one whose delete was
    /// refused before; refilling the sets keeps them all, and they would stay for good.
    fn delete_chains_the_table_holds_unreferenced(&mut self, index: usize) {
        let fam = self.states[index].fam;
        let Some(names) = self
            .netlink
            .as_mut()
            .and_then(|w| w.chain_names(fam.0, &self.config.table))
        else {
            return;
        };
        let dynamic = names
            .into_iter()
            .filter(|name| ruleset::DynamicChain::from_name(name).is_some());
        self.states[index].chains.extend(dynamic);
        self.delete_unreferenced_chains(index);
    }

    /// Creates the dynamic chains in `needed` that do not exist yet, in one text
    /// transaction of its own (an unused chain does nothing, so this is safe before the
    /// elements that use it).
    fn ensure_chains(
        &mut self,
        index: usize,
        needed: impl Iterator<Item = ruleset::DynamicChain>,
    ) -> Result<(), String> {
        let fam = self.states[index].fam;
        let missing: BTreeSet<_> = needed
            .filter(|c| !self.states[index].chains.contains(&c.name()))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let text = script::ensure_chains(
            fam,
            &self.config.table,
            self.config.conntrack_mark_mask,
            missing.iter(),
        );
        self.exec.run(&text).map_err(|e| e.to_string())?;
        self.states[index]
            .chains
            .extend(missing.iter().map(|c| c.name()));
        Ok(())
    }

    /// Before an adopted table's sets are refilled: its dynamic chains `needed`, and with
    /// [`Adopt::RulesAndSets`] every rule put back in the same transaction.
    fn adopt_rules(
        &mut self,
        index: usize,
        cfg: &StaticConfig,
        adopt: Adopt,
        needed: BTreeSet<ruleset::DynamicChain>,
    ) -> Result<(), String> {
        if adopt != Adopt::RulesAndSets {
            return self.ensure_chains(index, needed.into_iter());
        }
        let fam = self.states[index].fam;
        let text = script::restore_rules(fam, &self.config.table, cfg, needed.iter());
        self.exec.run(&text).map_err(|e| e.to_string())?;
        self.states[index]
            .chains
            .extend(needed.iter().map(|c| c.name()));
        Ok(())
    }

    /// One netlink transaction on this family's table.
    fn netlink_apply(
        &mut self,
        index: usize,
        flush: &[Set],
        deletes: &[(Set, Key)],
        adds: &[Element],
    ) -> Result<(), String> {
        let family = self.states[index].fam.0;
        match &mut self.netlink {
            Some(nl) => nl
                .apply(family, &self.config.table, flush, deletes, adds)
                .map_err(|e| e.to_string()),
            None => Err("no netlink writer".into()),
        }
    }

    fn partial_over_netlink(
        &mut self,
        index: usize,
        ops: Vec<store::ElementOp>,
    ) -> Result<(), String> {
        let (deletes, adds) = store::order_ops(ops);
        self.ensure_chains(index, adds.iter().filter_map(script::referenced_chain))?;
        self.netlink_apply(index, &[], &deletes, &adds)
    }

    /// Rebuilds the whole family. With netlink, and when the kernel's table already has this
    /// skeleton, that is one atomic netlink transaction sending the sets only what differs
    /// ([`diff_refill`]), or flushing and refilling every set (the affinity map is kept);
    /// without a table, the skeleton goes as text and then the elements;
    /// otherwise one atomic text transaction replaces the table.
    fn full_sync(
        &mut self,
        index: usize,
        request: &SyncRequest<'_>,
        cfg: StaticConfig,
    ) -> Result<usize, BackendError> {
        let fam = self.states[index].fam;
        let skeleton = ruleset::skeleton(fam, &self.config.table, &cfg);
        let marker = ruleset::skeleton_marker(&skeleton)
            .unwrap_or_default()
            .to_string();
        // What this process committed last: when it differs from `cfg`, a different skeleton
        // in the kernel is our own change (the node's pod CIDRs changed), not someone else's.
        let ours_was = self.states[index].committed.take();

        self.probe(index);
        let kernel = match &self.states[index].kernel {
            _ if self.netlink.is_none() => KernelTable::Unknown,
            KernelTable::Skeleton(_) if self.states[index].replace_whole => {
                KernelTable::Skeleton(String::new())
            }
            known => known.clone(),
        };
        // Our skeleton: refill the sets (and put the rules back first when someone else
        // changed them). Another skeleton of our layout (another configuration, a build whose
        // rules differ): rules in place, then the sets. Anything else: replaced whole.
        let adopting = match &kernel {
            KernelTable::Skeleton(m) if *m == marker && !self.states[index].distrust => Adopt::Sets,
            KernelTable::Skeleton(m) if *m == marker || ruleset::same_layout(m) => {
                Adopt::RulesAndSets
            }
            _ => Adopt::No,
        };
        let adopt = adopting != Adopt::No;
        match (&kernel, adopting) {
            (KernelTable::Skeleton(m), Adopt::RulesAndSets) if !self.states[index].distrust => {
                match ours_was.as_ref().filter(|was| **was != cfg && *m != marker) {
                    Some(was) => tracing::info!(
                        "table {} {}: our configuration changed ({}); putting the new rules in \
                         place and refilling the sets",
                        fam.table_family(),
                        self.config.table,
                        was.change_to(&cfg)
                    ),
                    None => tracing::info!(
                        "table {} {}: {ADOPTING_EARLIER}",
                        fam.table_family(),
                        self.config.table
                    ),
                }
            }
            (KernelTable::Skeleton(m), Adopt::No) => tracing::info!(
                "table {} {}: {}; replacing it whole, elements included (established \
                 connections keep their conntrack state; ClientIP affinities start over)",
                fam.table_family(),
                self.config.table,
                if m.is_empty() {
                    "no skeleton marker (an earlier kpng's, or a failed repair)".to_string()
                } else {
                    format!("another layout ({m})")
                }
            ),
            _ => {}
        }
        // Its own skeleton, marker and all: its sets and maps are declared as this build
        // declares them, so what they hold can be compared element by element.
        let why = match &kernel {
            KernelTable::Skeleton(m) if *m == marker && adopt => {
                Some(if self.states[index].distrust {
                    diff_refill::Why::Repairing
                } else if self.states[index].ever_committed {
                    diff_refill::Why::FullSync
                } else {
                    diff_refill::Why::Adopting
                })
            }
            _ => None,
        };
        let streamed = if adopt || kernel == KernelTable::Absent {
            self.streamed_full(index, request.snapshot, &cfg, adopting, why)
        } else {
            None
        };
        let (result, store, ops) = match streamed {
            Some(done) => done,
            None => self.collected_full(index, request.snapshot, &cfg, adopting),
        };
        match result {
            Ok(()) => {
                let state = &mut self.states[index];
                state.store = store;
                state.committed = Some(cfg);
                state.kernel = KernelTable::Skeleton(marker);
                state.distrust = false;
                state.replace_whole = false;
                state.ever_committed = true;
                state.full_done = true;
                state.kept_rules = adopting == Adopt::Sets;
                state.refill_next = false;
                if adopt {
                    self.delete_chains_the_table_holds_unreferenced(index);
                }
                Ok(ops)
            }
            Err(message) => {
                if adopting == Adopt::RulesAndSets {
                    warn!(
                        "could not put the rules of table {} back in place ({message}); \
                         replacing it whole",
                        self.config.table
                    );
                    self.states[index].replace_whole = true;
                }
                // Look again next time: the failure may have left anything.
                self.states[index].kernel = KernelTable::Unknown;
                self.states[index].chains.clear();
                Err(self.fail_with(index, ops, message))
            }
        }
    }

    /// Reads family `index`'s table and marker once, when what the kernel holds is not known
    /// (start-up, and after a failure or someone else's change).
    fn probe(&mut self, index: usize) {
        let fam = self.states[index].fam;
        if self.states[index].kernel == KernelTable::Unknown
            && let Some(writer) = &mut self.netlink
        {
            let state = &self.states[index];
            let deleted_by_someone = state.ever_committed && !state.distrust;
            self.states[index].kernel = match writer.probe_table(fam.0, &self.config.table) {
                // Ours before, gone now, and no notification said so (it went while a
                // transaction of ours was on its way): a repair, as the monitor's would be.
                ProbedTable::Absent if deleted_by_someone => {
                    self.found_gone.push(fam.0);
                    KernelTable::Absent
                }
                ProbedTable::Absent => KernelTable::Absent,
                // A fill that did not finish: no base chain, nothing runs through it.
                ProbedTable::Present(marker) if ruleset::is_filling(&marker) => KernelTable::Absent,
                ProbedTable::Present(marker) => KernelTable::Skeleton(marker),
            };
        }
    }

    /// Before the first sync allocates any affinity id: reads back, from every table of this
    /// layout that the sync will adopt, which entry point had which id and which ids have live
    /// affinity entries ([`affinity_seed`]), and seeds the allocator with it, so that each
    /// Service port keeps its id across the restart and the ids of removed ports go to new ones
    /// last. One element dump of the four `affinity-bits-*` sets and of the affinity map per
    /// family, at start-up only; a table without them (or unreadable) falls back to fresh
    /// allocation, said once.
    fn seed_affinity_ids(&mut self, snapshot: &Snapshot) {
        if self.netlink.is_none() {
            return;
        }
        let mut tables = Vec::new();
        let mut lacking = Vec::new();
        for index in 0..self.states.len() {
            self.probe(index);
            let adoptable = matches!(
                &self.states[index].kernel,
                KernelTable::Skeleton(m) if ruleset::same_layout(m)
            );
            if !adoptable {
                continue;
            }
            let fam = self.states[index].fam;
            match self.read_table_ids(fam) {
                Some(t) => tables.push((fam.0, t)),
                None => lacking.push(format!("{} {}", fam.table_family(), self.config.table)),
            }
        }
        if !lacking.is_empty() {
            info!(
                "table {}: its ClientIP affinity ids cannot be read (a table of an older kpng, \
                 or the read failed): ids are allocated afresh, so a port whose id changes \
                 loses its clients' stickiness once",
                lacking.join(" and ")
            );
        }
        if tables.is_empty() {
            return;
        }
        let families: Vec<Family> = tables.iter().map(|(f, _)| *f).collect();
        let ports: Vec<(OwnerId, &kpng_model::ServicePort)> = snapshot
            .ports
            .values()
            .filter(|p| p.session_affinity.is_some() && families.contains(&p.key.family))
            .map(|p| (self.owners.id(&p.key), &**p))
            .collect();
        let seed = affinity_seed::plan(&tables, &self.affinity_ids, ports.iter().copied());
        if !seed.seen.is_empty() {
            info!(
                kept_count = seed.claims.len(),
                affinity_ports = ports.len(),
                ids_seen = seed.seen.len(),
                "ClientIP affinity ids read back from the adopted table: Service ports keep theirs"
            );
        }
        self.affinity_ids.seed(seed.claims, &seed.seen);
    }

    /// What family `fam`'s table holds of affinity ids: `None` when an `affinity-bits-*` set
    /// cannot be read (the dynamic affinity map is optional: without it only live entries of
    /// removed ports go unseen).
    fn read_table_ids(&mut self, fam: Fam) -> Option<affinity_seed::TableIds> {
        let writer = self.netlink.as_mut()?;
        let table = &self.config.table;
        let mut ids = affinity_seed::TableIds::default();
        let mut odd = 0usize;
        for (set, kind) in affinity_seed::BIT_SETS {
            let decl = set.decl();
            let read = writer.set_keys(fam.0, table, set, &mut |key| {
                let fields = netlink::decode::key_fields(&decl, fam.0, key);
                if !fields.is_some_and(|f| ids.add_bit_element(kind, &f)) {
                    odd += 1;
                }
            });
            if !read {
                return None;
            }
        }
        for set in Set::dynamic().filter(|s| s.in_family(fam.0) && *s != Set::AffinityPort) {
            let decl = set.decl();
            writer.set_keys(fam.0, table, set, &mut |key| {
                let fields = netlink::decode::key_fields(&decl, fam.0, key);
                if !fields.is_some_and(|f| ids.add_live_key(&f)) {
                    odd += 1;
                }
            });
        }
        if odd > 0 {
            debug!(
                family = %fam.0,
                odd,
                "affinity elements of another shape ignored while reading back the ids"
            );
        }
        Some(ids)
    }

    /// Calls `f` with the elements of every Service port of the family, one port at a time,
    /// then with the node-level elements.
    fn each_owner(
        &mut self,
        fam: Fam,
        snapshot: &Snapshot,
        mut f: impl FnMut(OwnerId, Vec<Element>),
    ) {
        let node_ips = snapshot.node.ips.clone();
        for port in snapshot.family(fam.0) {
            let (owner, elements) = self.owner_with_elements(port, &node_ips);
            f(owner, elements);
        }
        f(NODE_OWNER, self.node_elements(fam, snapshot));
    }

    /// One Service port's owner id and elements, its affinity ids assigned first.
    fn owner_with_elements(
        &mut self,
        port: &kpng_model::ServicePort,
        node_ips: &[IpAddr],
    ) -> (OwnerId, Vec<Element>) {
        let owner = self.owner(&port.key);
        self.assign_affinity_ids(port, owner);
        (owner, self.port_elements(port, owner, node_ips))
    }

    /// The full sync over netlink, encoding elements as they are generated so that no list of
    /// every element is ever held (that list was the largest allocation of a cold start). A
    /// table just created goes through [`NftBackend::cold_fill`]; an adopted one with this
    /// skeleton (`why` says why it is synced whole) gets only what differs
    /// ([`diff_refill`]), and otherwise is flushed and refilled in one transaction. `None`
    /// when two owners disagree about an element in a way only the collected path resolves
    /// (rare: conflicting Services).
    fn streamed_full(
        &mut self,
        index: usize,
        snapshot: &Snapshot,
        cfg: &StaticConfig,
        adopt: Adopt,
        why: Option<diff_refill::Why>,
    ) -> Option<(Result<(), String>, ElementStore, usize)> {
        if adopt == Adopt::No {
            return self.cold_fill(index, snapshot, cfg);
        }
        let fam = self.states[index].fam;
        let refill_why = match why {
            Some(_) if self.states[index].refill_next => {
                Some("the last full sync of it failed: nothing read is trusted".to_string())
            }
            Some(why) => {
                self.states[index].refill_next = true;
                match self.diffed_refill(index, snapshot, cfg, adopt, why) {
                    Ok(done) => return Some(done),
                    Err(reason) => Some(reason.to_string()),
                }
            }
            None => None,
        };
        if let (Some(reason), Some(why)) = (refill_why, why) {
            info!(
                "{} table {} {}: flushing and refilling its sets in one transaction ({reason})",
                why.verb(),
                fam.table_family(),
                self.config.table
            );
        }
        let table = self.config.table.clone();
        let mut store = ElementStore::new();
        let mut refill = match netlink::ElementBatch::new(fam.0, &table) {
            Ok(batch) => batch,
            Err(e) => return Some((Err(e.to_string()), ElementStore::new(), 0)),
        };
        let mut chains = BTreeSet::new();
        let mut refs = chain_refs::ChainRefs::default();
        let (mut superseded, mut failed) = (false, None);
        for set in Set::owned(fam.0) {
            refill.flush(set);
        }
        self.each_owner(fam, snapshot, |owner, elements| {
            for e in elements {
                match store.build_one(owner, &e) {
                    store::Built::Emit => {
                        chains.extend(script::referenced_chain(&e));
                        refs.add(&e);
                        if let Err(err) = refill.add(&e) {
                            failed.get_or_insert(err.to_string());
                        }
                    }
                    store::Built::Skip => {}
                    store::Built::Supersede => superseded = true,
                }
            }
        });
        if superseded {
            debug!("conflicting elements: full sync through the collected path");
            return None;
        }
        let ops = refill.adds();
        if let Some(message) = failed {
            return Some((Err(message), store, ops));
        }
        // Same skeleton: refill every set atomically (the affinity map is kept).
        self.states[index].chains.clear();
        self.states[index].chain_refs = refs;
        let result = self
            .adopt_rules(index, cfg, adopt, chains)
            .and_then(|()| self.commit_refill(fam, snapshot, refill));
        Some((result, store, ops))
    }

    /// Commits an adopted table's refill (one transaction); an element the kernel rejects is
    /// found again by regenerating the same sequence.
    fn commit_refill(
        &mut self,
        fam: Fam,
        snapshot: &Snapshot,
        batch: netlink::ElementBatch,
    ) -> Result<(), String> {
        let Some(mut writer) = self.netlink.take() else {
            return Err("no netlink writer".into());
        };
        let this: &NftBackend = self;
        let describe = |op: netlink::Operation, n: usize| match op {
            netlink::Operation::Add => this.nth_full_element(fam, snapshot, n),
            _ => None,
        };
        let result = writer.commit(batch, &describe).map_err(|e| e.to_string());
        self.netlink = Some(writer);
        result
    }

    /// The `n`th element a streamed full sync emitted (for error messages only).
    fn nth_full_element(&self, fam: Fam, snapshot: &Snapshot, n: usize) -> Option<String> {
        let node_ips = &snapshot.node.ips;
        let mut store = ElementStore::new();
        let per_port = snapshot.family(fam.0).filter_map(|port| {
            let owner = self.owners.get(&port.key)?;
            Some((owner, self.port_elements(port, owner, node_ips)))
        });
        let node = std::iter::once((NODE_OWNER, self.node_elements(fam, snapshot)));
        per_port
            .chain(node)
            .flat_map(|(owner, elements)| elements.into_iter().map(move |e| (owner, e)))
            .filter(|(owner, e)| store.build_one(*owner, e) == store::Built::Emit)
            .nth(n)
            .map(|(_, e)| match e.value {
                Some(v) => format!("{} : {v}", e.key),
                None => e.key.to_string(),
            })
    }

    /// The full sync that first collects every element: for the text path (dry runs, goldens,
    /// a table with another skeleton, replaced in one text transaction) and for conflicts.
    fn collected_full(
        &mut self,
        index: usize,
        snapshot: &Snapshot,
        cfg: &StaticConfig,
        adopt: Adopt,
    ) -> (Result<(), String>, ElementStore, usize) {
        let fam = self.states[index].fam;
        let mut store = ElementStore::new();
        let (mut all, mut index_of) = (Vec::new(), HashMap::new());
        self.each_owner(fam, snapshot, |owner, elements| {
            store.build(owner, elements, &mut all, &mut index_of);
        });
        drop(index_of);
        let ops = all.len();
        let mut refs = chain_refs::ChainRefs::default();
        for e in &all {
            refs.add(e);
        }
        self.states[index].chain_refs = refs;
        let result = if adopt != Adopt::No {
            self.states[index].chains.clear();
            let flush: Vec<Set> = Set::owned(fam.0).collect();
            let needed: BTreeSet<_> = all.iter().filter_map(script::referenced_chain).collect();
            self.adopt_rules(index, cfg, adopt, needed)
                .and_then(|()| self.netlink_apply(index, &flush, &[], &all))
        } else {
            // The script writes elements in text order (stable scripts, golden files).
            let (text, chains) = script::replace(fam, &self.config.table, cfg, &all);
            self.exec
                .run_full(&text)
                .map(|()| self.states[index].chains = chains)
                .map_err(|e| e.to_string())
        };
        (result, store, ops)
    }

    /// Reads back, with one chain request per family, the tables this sync committed whole
    /// (`all`: every table committed, as the periodic sync does) and returns what someone
    /// else changed of them (`ip kpng: table deleted`). A table found changed is forgotten:
    /// the next sync looks at it again and rebuilds it.
    ///
    /// Why: while a sync of kpng's runs, the notification monitor has left its group (its
    /// own commits would be thousands of notifications), so a second `nft flush ruleset`
    /// landing then, 30-70 ms after the first as `systemctl restart nftables` does, was
    /// never reported, and the tables stayed deleted until the hourly full sync.
    fn confirm(&mut self, all: bool) -> Vec<(String, &'static str)> {
        let mut lost = Vec::new();
        for index in 0..self.states.len() {
            let state = &self.states[index];
            let KernelTable::Skeleton(marker) = &state.kernel else {
                continue;
            };
            if !(state.full_done || all && state.committed.is_some()) {
                continue;
            }
            let (fam, marker) = (state.fam, marker.clone());
            let Some(writer) = self.netlink.as_mut() else {
                return lost;
            };
            let table = &self.config.table;
            let what = match writer.check_marker(fam.0, table) {
                None => continue,
                Some(ProbedTable::Present(m)) if m == marker => continue,
                Some(ProbedTable::Absent) => "table deleted",
                Some(ProbedTable::Present(_)) => "skeleton marker changed",
            };
            let name = format!("{} {table}", fam.table_family());
            let state = &mut self.states[index];
            state.kernel = KernelTable::Unknown;
            state.committed = None;
            state.distrust = true;
            state.chains.clear();
            lost.push((name, what));
        }
        lost
    }

    /// After a sync's window of own commits (`window`: the kernel's generation and kpng's
    /// commit count when it began), with the notification group joined again: when the
    /// generation moved more than kpng's own commits, someone else committed while the monitor
    /// was not listening. Their change is found by reading the rules of each committed table
    /// (a rule dump, no element) and comparing them with those read after kpng's last change
    /// of them, leaving out the chains this sync's own text changed (their handles moved). A
    /// table found changed is reported through the alarm and its rules are put back by the
    /// repair. Without a difference (someone committed to another table, as fail2ban, Docker or
    /// a CNI do all day), the rules read are the next comparison's.
    ///
    /// Not seen this way: someone else's change to set elements (its sets are not read), to a
    /// chain this sync's text also changed, or to a table this sync replaced or restored
    /// whole (nothing of it is left to compare); the periodic full sync repairs those. Until
    /// 2026-12-06 such a sync with any foreign commit, to any table, was taken as tampering:
    /// a repair (a whole-table text transaction itself) overlapping a busy neighbour's commits
    /// raised the next, and the repairs fed themselves.
    fn check_overlap(&mut self, window: (u32, own_commits::Counted)) {
        let (before, counted) = window;
        let touched = self.own.take_touched();
        let Ok(after) = self.kernel_reader.generation() else {
            // This sync's own changes are not in the rules read last: comparing the next
            // sync's with them would take kpng's own change for someone else's.
            for state in &mut self.states {
                state.rules_seen = None;
            }
            return;
        };
        let own = self.own.now().since(counted);
        let moved = u64::from(after.wrapping_sub(before));
        let foreign = moved.saturating_sub(own.total());
        if foreign == 0 && own.text == 0 {
            return;
        }
        let table = self.config.table.clone();
        let mut changed = Vec::new();
        for state in &mut self.states {
            if state.committed.is_none() {
                state.rules_seen = None;
                continue;
            }
            let fam = state.fam.table_family();
            let now = self.kernel_reader.rule_handles(fam, &table).ok();
            let evidence = match (&now, &state.rules_seen) {
                (Some(now), Some(seen)) if foreign > 0 && !touched.whole(fam, &table) => {
                    let untouched = |rules: &[(String, u64)]| -> Vec<(String, u64)> {
                        rules
                            .iter()
                            .filter(|(chain, _)| !touched.chain(fam, &table, chain))
                            .cloned()
                            .collect()
                    };
                    untouched(now) != untouched(seen)
                }
                _ => false,
            };
            if !evidence {
                state.rules_seen = now;
                continue;
            }
            changed.push(format!("{fam} {table}"));
            state.rules_seen = None;
            state.kernel = KernelTable::Unknown;
            state.committed = None;
            state.distrust = true;
            state.chains.clear();
        }
        if changed.is_empty() {
            return;
        }
        let what = format!(
            "{}: rules changed by someone else while kpng's sync ran ({foreign} transaction{} \
             not notified)",
            changed.join(" and "),
            if foreign == 1 { "" } else { "s" }
        );
        debug!("{what}");
        if let Some(alarm) = &self.alarm {
            alarm.raise(what);
        }
    }

    fn forget_removed_ports(&mut self, request: &SyncRequest<'_>) {
        for (key, change) in &request.diff.changes {
            if change.new.is_none() {
                if let Some(owner) = self.owners.get(key) {
                    self.affinity_ids.release(owner);
                }
                self.owners.forget(key);
            }
        }
    }
}

impl Backend for NftBackend {
    fn name(&self) -> &'static str {
        "nftables"
    }

    /// The families it keeps a table for.
    fn families(&self) -> Vec<Family> {
        self.states.iter().map(|state| state.fam.0).collect()
    }

    fn register_metrics(&self, registry: &mut Registry) {
        // At 0 from the start, for the families this node runs, so that the first failure
        // shows in `increase()`.
        for state in &self.states {
            let label = kpng_backend::metrics::FamilyLabel::from(state.fam.0);
            let _ = self.metrics.sync_failures.get_or_create(&label);
            let _ = self.metrics.cleanup_failures.get_or_create(&label);
        }
        registry.register(
            "kubeproxy_sync_proxy_rules_nftables_sync_failures",
            "Cumulative proxy nftables sync failures",
            self.metrics.sync_failures.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_nftables_cleanup_failures",
            "Cumulative proxy nftables cleanup failures",
            self.metrics.cleanup_failures.clone(),
        );
        registry.register(
            "kpng_nftables_elements",
            "Set and map elements kpng programmed, per family",
            self.metrics.elements.clone(),
        );
        registry.register(
            "kpng_nftables_dynamic_chains",
            "Dynamic chains kpng programmed (per distinct endpoint count and affinity timeout), per family",
            self.metrics.chains.clone(),
        );
    }

    fn watch_tampering(&mut self, alarm: TamperAlarm) -> Result<bool, BackendError> {
        if !self.watch_kernel {
            return Ok(false);
        }
        self._anchor = kpng_netfilter::anchor::hold_logged(&self.config.families);
        let watched = netlink::monitor::Watched {
            tables: self
                .config
                .families
                .iter()
                .map(|f| (*f, self.config.table.clone()))
                .collect(),
            dynamic_sets: Set::dynamic().map(|s| s.name().to_string()).collect(),
            chains: None,
        };
        let monitor = netlink::monitor::TableMonitor::start(watched, alarm.clone())
            .map_err(|e| BackendError::Other(e.to_string()))?;
        self.monitor = Some(monitor);
        self.alarm = Some(alarm);
        Ok(true)
    }

    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncStats, BackendError> {
        self.warn_unsupported(request);
        let tampered = self.monitor.as_ref().is_some_and(|m| m.begin_own());
        // Where kpng's window of own commits starts: the kernel's generation, and kpng's
        // count of its commits.
        let window = match self.monitor {
            Some(_) => self.kernel_reader.generation().ok(),
            None => None,
        }
        .map(|generation| (generation, self.own.now()));
        // What kpng's text changes from here on is this window's (`check_overlap`).
        self.own.take_touched();
        if tampered {
            // Someone else changed our tables: look at them again, and put the rules and then
            // the sets back (or replace a table that is gone or not ours whole).
            for state in &mut self.states {
                state.kernel = KernelTable::Unknown;
                state.committed = None;
                state.distrust = true;
            }
        }
        if !self.affinity_seeded {
            self.affinity_seeded = true;
            self.seed_affinity_ids(request.snapshot);
        }
        if request.full {
            // A full sync carries the whole snapshot, not the removals: the ids of ports that
            // are gone (or lost affinity) are released here.
            let (owners, ports) = (&self.owners, &request.snapshot.ports);
            self.affinity_ids.retain(|owner| {
                owners
                    .key(owner)
                    .and_then(|key| ports.get(key))
                    .is_some_and(|p| p.session_affinity.is_some())
            });
        }
        for state in &mut self.states {
            state.kept_rules = false;
            state.full_done = false;
        }
        self.found_gone.clear();
        // The periodic sync (nothing changed) confirms every table, not only those it
        // rebuilt: a deletion no notification reported (it came while a sync of kpng's had
        // left the notification group) is then repaired within a sync period.
        let periodic = !request.full && request.diff.is_empty();
        // The periodic sync (nothing changed) and every full or node sync look at the node's
        // addresses again; a partial sync applies what changed in them.
        let addresses_were = (request.full || request.diff.is_empty() || request.diff.node_changed)
            .then(|| self.refresh_local_addresses(&request.snapshot.node))
            .flatten();
        let families: Vec<Family> = self.states.iter().map(|s| s.fam.0).collect();
        let result = sync_each(&families, |index| {
            self.sync_family(index, request, addresses_were.as_deref())
        });
        if let Some(m) = &self.monitor {
            m.end_own();
        }
        if let Some(window) = window {
            self.check_overlap(window);
        }
        // Only now, with the notification group joined again, are the tables confirmed: a
        // deletion from here on is notified, and one before is read here.
        let lost = self.confirm(periodic);
        if !lost.is_empty() {
            let what = if periodic {
                format!("{}, found by the periodic check", name_all(&lost))
            } else {
                format!(
                    "{}, again, right after kpng's sync committed it",
                    name_all(&lost)
                )
            };
            match &self.alarm {
                // The runner schedules the repair within milliseconds.
                Some(alarm) => alarm.raise(what),
                None if result.is_ok() => return Err(BackendError::Other(what)),
                None => {}
            }
        }
        if result.is_err() {
            // `nft flush ruleset` deletes every family's table: a failure in one family is
            // reason enough to look at all of them again, or the retry (a full sync) would
            // trust a table that went with the other one and fail the same way.
            for state in &mut self.states {
                state.kernel = KernelTable::Unknown;
            }
        }
        let operations = result?;
        let mut committed = Vec::with_capacity(self.states.len());
        for state in &self.states {
            let label = kpng_backend::metrics::FamilyLabel::from(state.fam.0);
            let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
            self.metrics
                .elements
                .get_or_create(&label)
                .set(count(state.store.len()));
            self.metrics
                .chains
                .get_or_create(&label)
                .set(count(state.chains.len()));
            committed.push(Committed {
                family: state.fam.0,
                elements: state.store.len(),
                chains: state.chains.len(),
            });
        }
        if let Ok(mut shared) = self.committed.lock() {
            *shared = committed;
        }
        self.forget_removed_ports(request);
        debug!(operations, "nftables sync done");
        let mut found = Vec::new();
        if !self.found_gone.is_empty() {
            let tables: Vec<String> = self
                .found_gone
                .iter()
                .map(|f| format!("{} {}", Fam(*f).table_family(), self.config.table))
                .collect();
            found.push(format!(
                "table {} deleted by someone else during a transaction of kpng's; created \
                 again",
                tables.join(" and ")
            ));
        }
        let repaired = (!found.is_empty()).then(|| found.join("; "));
        Ok(SyncStats {
            operations,
            repaired,
            kept_rules: self
                .states
                .iter()
                .filter(|s| s.kept_rules)
                .map(|s| s.fam.0)
                .collect(),
            ..SyncStats::default()
        })
    }

    fn cleanup(&mut self) -> Result<(), BackendError> {
        let text = script::cleanup(&self.config.table, &self.config.families);
        self.monitor.as_ref().map(|m| m.begin_own());
        let result = self.exec.run(&text);
        if let Some(m) = &self.monitor {
            m.end_own();
        }
        result.map_err(|e| {
            for family in &self.config.families {
                self.metrics
                    .cleanup_failures
                    .get_or_create(&(*family).into())
                    .inc();
            }
            BackendError::Other(format!("removing the {} tables: {e}", self.config.table))
        })?;
        for state in &mut self.states {
            state.store = ElementStore::new();
            state.chains.clear();
            state.committed = None;
        }
        Ok(())
    }
}

/// Every table of `lost` with what happened to it, each change said once:
/// `ip kpng and ip6 kpng: table deleted` (an operator reading one name would look for the
/// other table in vain).
pub fn name_all(lost: &[(String, &str)]) -> String {
    let mut parts: Vec<(Vec<&str>, &str)> = Vec::new();
    for (table, what) in lost {
        match parts.iter_mut().find(|(_, w)| w == what) {
            Some((tables, _)) => tables.push(table),
            None => parts.push((vec![table], what)),
        }
    }
    parts
        .iter()
        .map(|(tables, what)| format!("{}: {what}", tables.join(" and ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// What a full sync says when it adopts a table of our layout whose rules this process did
/// not write: an earlier kpng's, of another build (a rolling upgrade or a rollback) or run
/// with other flags. Not a conflict with someone else's rules, which it must not read like.
const ADOPTING_EARLIER: &str = "rules left by an earlier kpng (another build or configuration \
     of the same table layout); adopting the table: putting this build's rules in place and \
     refilling its sets";

#[cfg(test)]
mod tests;
