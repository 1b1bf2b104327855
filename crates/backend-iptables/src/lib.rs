//! kpng's iptables backend: upstream kube-proxy iptables-mode rules (same chains, same hashed
//! names, same matches), applied with `iptables-restore --noflush`.
//!
//! - [`rules`]: one Service port → its rules in the shared chains and its own chains;
//! - [`skeleton`]: the chains and rules no Service owns, from the flags and the node;
//! - [`script`]: restore input in the order iptables-restore needs;
//! - [`save`]: reading `iptables-save` output (full syncs and cleanup only);
//! - [`earlier`]: whether an earlier run's rules (or kube-proxy's) route Services, asked once
//!   at start;
//! - [`exec`]: the legacy or nft variant of the tools, a dry run, or a recorder for tests;
//! - [`watch`]: a thread that notices, within a second, someone flushing or deleting our
//!   chains, and asks the runner for a full sync (iptables-legacy); iptables-nft is watched
//!   through nf_tables notifications instead (`kpng-netfilter`'s monitor), within milliseconds;
//! - [`own_restores`]: kpng's own restores counted and what they changed recorded, so that
//!   someone else's commit while the monitor is away for them is found (iptables-nft);
//! - [`route_localnet`]: the sysctl for localhost node ports, restored at cleanup.
//!
//! Every family keeps in memory what it last committed: the static configuration and each
//! Service port's rendered rules. A partial sync sends only the difference: changed rules of the
//! shared chains as `-D`/`-I` lines, and the port chains whose rules changed (declared, hence
//! flushed, and refilled) or that are gone (flushed and deleted). A full sync (start-up, after a
//! failure, periodically, on a node or flag change) declares every chain and rewrites it, adopts
//! what a previous run left, ensures the jumps from the built-in chains, and deletes stale
//! Service chains found by `iptables-save`. See `docs/backends.md`.

pub mod earlier;
pub mod exec;
pub mod names;
pub mod own_restores;
pub mod route_localnet;

pub use route_localnet::LocalhostFailure;
pub mod rules;
pub mod save;
pub mod script;
pub mod skeleton;
pub mod watch;

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use kpng_backend::metrics::FamilyLabel;
use kpng_backend::settings::{DetectLocal, NodePortAddresses};
use kpng_backend::{Backend, BackendError, SyncRequest, SyncStats, TamperAlarm, UdpFrontends};
use kpng_model::{Family, PortKey, Snapshot};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as MetricFamily;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tracing::{debug, info, warn};

use crate::exec::{ExecError, Iptables};
use crate::rules::{CANARY, MARK_MASQ, PortRules, SERVICES, SharedRule, Table};
use crate::save::Saved;
use crate::script::Script;
use crate::skeleton::{StaticConfig, StaticInputs};
use kpng_backend_kit::families::sync_each;

/// Configuration of the iptables backend (kube-proxy's flags of the same names).
#[derive(Debug, Clone)]
pub struct IptablesConfig {
    /// `--masquerade-all`.
    pub masquerade_all: bool,
    /// `--masquerade-bit` (14 → mark 0x4000).
    pub masquerade_bit: u8,
    /// `--detect-local-mode` with its parameters.
    pub detect_local: DetectLocal,
    /// `--nodeport-addresses` (default: every local address).
    pub nodeport_addresses: NodePortAddresses,
    /// `--iptables-localhost-nodeports` (default on): IPv4 node ports on 127.0.0.1.
    pub localhost_node_ports: bool,
    /// conntrack's `tcp_be_liberal` is set: no drop of conntrack-invalid forwarded packets.
    pub tcp_be_liberal: bool,
    /// The families to program.
    pub families: Vec<Family>,
}

impl Default for IptablesConfig {
    fn default() -> Self {
        IptablesConfig {
            masquerade_all: false,
            masquerade_bit: 14,
            detect_local: DetectLocal::None,
            nodeport_addresses: NodePortAddresses::AllLocal,
            localhost_node_ports: true,
            tcp_be_liberal: false,
            families: Family::ALL.to_vec(),
        }
    }
}

/// The `table` and `ip_family` labels of the rule-count gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableLabel {
    table: String,
    ip_family: String,
}

/// kube-proxy's iptables-mode metrics.
#[derive(Debug, Clone, Default)]
struct IptablesMetrics {
    restore_failures: MetricFamily<FamilyLabel, Counter>,
    partial_restore_failures: MetricFamily<FamilyLabel, Counter>,
    rules_total: MetricFamily<TableLabel, Gauge>,
    rules_last: MetricFamily<TableLabel, Gauge>,
}

/// What one family last committed.
#[derive(Debug)]
struct FamilyState {
    family: Family,
    /// `None` until a full sync succeeds, and again after any failure.
    committed: Option<StaticConfig>,
    /// Each Service port's rules, as committed.
    ports: HashMap<PortKey, PortRules>,
    /// Rules of all ports in the filter and nat tables.
    port_rules: [usize; 2],
    /// The last sync was full and found our rules already in place (an earlier run's, or this
    /// run's): its restore replaced them atomically, so no frontend went without a rule
    /// ([`SyncStats::kept_rules`]).
    kept_rules: bool,
    /// The UDP frontends whose rules that sync found in place: kube-proxy writes the same
    /// chains, so while kpng was down any of them may have come and gone
    /// ([`SyncStats::kept_udp_frontends`]).
    kept_udp_frontends: UdpFrontends,
    /// This sync rewrote every rule of the family: it is confirmed once the notification
    /// monitor listens again ([`IptablesBackend::confirm`]).
    full_done: bool,
    /// The handles of kpng's rules in the family's tables (its chains' rules and the jumps to
    /// them from the built-in chains), as (table, chain, handle), read after kpng's last own
    /// change of them: what a sync someone else's commit overlapped is compared with
    /// ([`IptablesBackend::check_overlap`], iptables-nft). `None`: not read (yet).
    rules_seen: Option<Vec<(&'static str, String, u64)>>,
}

/// Index of a table in [`FamilyState::port_rules`].
fn counted(table: Table) -> Option<usize> {
    match table {
        Table::Filter => Some(0),
        Table::Nat => Some(1),
        Table::Mangle => None,
    }
}

/// Reads the node's interface addresses (for CIDR `--nodeport-addresses`).
pub type LocalAddresses = Box<dyn Fn() -> Vec<IpAddr> + Send>;

/// The rules kpng keeps in one family's nat and filter tables (what
/// `kubeproxy_sync_proxy_rules_iptables_total` counts), for `kpng status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleCounts {
    /// The family.
    pub family: Family,
    /// Rules in the nat table.
    pub nat: usize,
    /// Rules in the filter table.
    pub filter: usize,
}

/// The counts of every family programmed, written after each commit and read by the status.
pub type SharedRuleCounts = std::sync::Arc<std::sync::Mutex<Vec<RuleCounts>>>;

/// The iptables backend.
pub struct IptablesBackend {
    /// What the tampering watcher shares with us (armed families, the busy lock).
    watch_state: std::sync::Arc<watch::WatchState>,
    /// The tampering watcher, once the runner asked for it (iptables-legacy).
    watcher: Option<watch::Watcher>,
    /// The nf_tables notification monitor, once the runner asked for it (iptables-nft).
    monitor: Option<kpng_netfilter::monitor::TableMonitor>,
    /// The anchor tables, held from the runner's start to the process's end: established
    /// connections keep their NAT through a foreign `iptables -F`/`iptables-restore`.
    _anchor: Option<kpng_netfilter::anchor::Anchor>,
    config: IptablesConfig,
    ipt: Box<dyn Iptables>,
    states: Vec<FamilyState>,
    metrics: IptablesMetrics,
    local_addresses: LocalAddresses,
    /// The interface addresses last read (CIDR node-port addresses only): refreshed at full
    /// syncs and node changes, not on every change.
    known_addresses: Vec<IpAddr>,
    /// What a sync found changed by someone else (its own check of the canaries, without an
    /// alarm), for the runner's count of repairs.
    found_flushed: Vec<String>,
    /// The runner's alarm (iptables-nft, kept from [`Backend::watch_tampering`]): a canary
    /// found gone right after a repair is reported through it, for a prompt second repair.
    alarm: Option<TamperAlarm>,
    /// What `kpng status` shows of the rules' size.
    rule_counts: SharedRuleCounts,
    /// `route_localnet` could not be set (a read-only `/proc/sys`, as in an unprivileged
    /// Pod): node ports are served without 127.0.0.1 from then on, rather than IPv4 failing
    /// every sync. Shared with `kpng status` and `kpng trace` ([`IptablesBackend::localhost_failure`]).
    route_localnet_failed: LocalhostFailure,
    /// kpng's own restores, counted against the kernel's generation id
    /// ([`IptablesBackend::check_overlap`]).
    own: own_restores::OwnRestores,
    /// Reads the kernel's generation id and kpng's rules ([`IptablesBackend::check_overlap`])
    /// over one socket kept for the process's life: a socket closed after every sync costs an
    /// RCU grace period when the sync deleted something
    /// (`kpng_netfilter::generation::KernelReader`).
    kernel_reader: kpng_netfilter::generation::KernelReader,
    /// The chains kpng's restores changed since its rules were last read: left out of the
    /// next comparison, so that the rules need not be read after every sync.
    touched_since_read: own_restores::TouchedChains,
    /// When kpng's rules were last read for [`IptablesBackend::check_overlap`].
    last_read: Option<std::time::Instant>,
    /// Someone else committed during a sync whose check was put off
    /// ([`IptablesBackend::OVERLAP_READ_INTERVAL`]): the next check reads and compares.
    overlap_pending: bool,
}

impl IptablesBackend {
    /// A backend that programs through `ipt`.
    pub fn new(config: IptablesConfig, ipt: Box<dyn Iptables>) -> IptablesBackend {
        let states = config
            .families
            .iter()
            .map(|f| FamilyState {
                family: *f,
                committed: None,
                ports: HashMap::new(),
                port_rules: [0; 2],
                kept_rules: false,
                kept_udp_frontends: UdpFrontends::default(),
                full_done: false,
                rules_seen: None,
            })
            .collect();
        let own = own_restores::OwnRestores::default();
        let ipt = own.wrap(ipt);
        IptablesBackend {
            watch_state: Default::default(),
            watcher: None,
            monitor: None,
            _anchor: None,
            config,
            ipt,
            states,
            metrics: IptablesMetrics::default(),
            local_addresses: Box::new(kpng_backend::host::local_addresses),
            known_addresses: Vec::new(),
            found_flushed: Vec::new(),
            alarm: None,
            rule_counts: SharedRuleCounts::default(),
            route_localnet_failed: LocalhostFailure::default(),
            own,
            kernel_reader: kpng_netfilter::generation::KernelReader::new(),
            touched_since_read: Default::default(),
            last_read: None,
            overlap_pending: false,
        }
    }

    /// Why node ports are not served on 127.0.0.1 although asked (`--iptables-localhost-nodeports`):
    /// `route_localnet` could not be set, with the kernel's answer; `None` while they are
    /// (or were not asked). Read by `kpng status` and `kpng trace`, which would otherwise
    /// promise 127.0.0.1.
    pub fn localhost_failure(&self) -> LocalhostFailure {
        self.route_localnet_failed.clone()
    }

    /// The rules kept per family, updated after every commit.
    pub fn rule_counts(&self) -> SharedRuleCounts {
        self.rule_counts.clone()
    }

    /// Replaces how local addresses are read (tests).
    pub fn with_local_addresses(mut self, read: LocalAddresses) -> IptablesBackend {
        self.local_addresses = read;
        self
    }

    fn static_config(&self, family: Family, snapshot: &Snapshot) -> StaticConfig {
        let inputs = StaticInputs {
            masquerade_all: self.config.masquerade_all,
            masquerade_bit: self.config.masquerade_bit,
            detect_local: &self.config.detect_local,
            nodeport_addresses: &self.config.nodeport_addresses,
            localhost_node_ports: self.config.localhost_node_ports
                && self.route_localnet_failed.get().is_none(),
            tcp_be_liberal: self.config.tcp_be_liberal,
        };
        StaticConfig::new(&inputs, family, &snapshot.node, &self.known_addresses)
    }

    fn exec_error(&self, family: Family, what: &str, e: ExecError) -> BackendError {
        BackendError::Other(format!("{} {family}: {what}: {e}", self.ipt.describe()))
    }

    /// Commits `script`, counting failures as kube-proxy does.
    fn commit(&mut self, index: usize, script: &Script, full: bool) -> Result<(), BackendError> {
        let family = self.states[index].family;
        if let Err(e) = self.ipt.restore(family, &script.render()) {
            let label = FamilyLabel::from(family);
            self.metrics.restore_failures.get_or_create(&label).inc();
            if !full {
                self.metrics
                    .partial_restore_failures
                    .get_or_create(&label)
                    .inc();
            }
            // The kernel may now differ from what we remember: the next sync must be full.
            self.states[index].committed = None;
            return Err(BackendError::Transaction {
                backend: "iptables",
                operations: script.operations(),
                message: format!("{} {family}: {e}", self.ipt.describe()),
            });
        }
        Ok(())
    }

    fn record_rule_counts(&self, index: usize, transactions: &[Script]) {
        let state = &self.states[index];
        let Some(cfg) = &state.committed else {
            return;
        };
        let mut counts = RuleCounts {
            family: state.family,
            nat: 0,
            filter: 0,
        };
        for table in [Table::Filter, Table::Nat] {
            let label = TableLabel {
                table: table.name().into(),
                ip_family: state.family.label().into(),
            };
            let ports = counted(table).map_or(0, |i| state.port_rules[i]);
            let total = skeleton::fixed_rule_count(cfg, table) + ports;
            match table {
                Table::Nat => counts.nat = total,
                _ => counts.filter = total,
            }
            let written: usize = transactions.iter().map(|t| t.rules_written(table)).sum();
            self.metrics
                .rules_total
                .get_or_create(&label)
                .set(total as i64);
            self.metrics
                .rules_last
                .get_or_create(&label)
                .set(written as i64);
        }
        if let Ok(mut shared) = self.rule_counts.lock() {
            shared.retain(|c| c.family != counts.family);
            shared.push(counts);
            shared.sort_by_key(|c| c.family);
        }
    }

    /// Commits the transactions in order; stops at the first failure.
    fn commit_all(
        &mut self,
        index: usize,
        transactions: &[Script],
        full: bool,
    ) -> Result<usize, BackendError> {
        let mut operations = 0;
        for t in transactions.iter().filter(|t| !t.is_empty()) {
            self.commit(index, t, full)?;
            operations += t.operations();
        }
        Ok(operations)
    }

    /// Rewrites every chain of the family and removes stale Service chains.
    fn full_sync(
        &mut self,
        index: usize,
        snapshot: &Snapshot,
        mut cfg: StaticConfig,
    ) -> Result<usize, BackendError> {
        let family = self.states[index].family;
        if cfg.localhost_node_ports
            && let Err(e) = self.ipt.enable_route_localnet()
        {
            // kube-proxy exits here; serving every other node port is what the node needs.
            warn!(
                "{} {family}: node ports on 127.0.0.1 need net.ipv4.conf.all.route_localnet=1, \
                 which cannot be set here ({e}): node ports are served on the node's other \
                 addresses only. Say so with --iptables-localhost-nodeports=false \
                 (iptables.localhostNodePorts: false) or --nodeport-addresses without \
                 127.0.0.1, or give kpng a writable /proc/sys (a privileged container)",
                self.ipt.describe()
            );
            self.route_localnet_failed.set(format!(
                "net.ipv4.conf.all.route_localnet cannot be set: {e}"
            ));
            cfg = self.static_config(family, snapshot);
        }
        let nat = self
            .ipt
            .save(family, Table::Nat)
            .map_err(|e| self.exec_error(family, "reading the nat table", e))?;
        let filter = self
            .ipt
            .save(family, Table::Filter)
            .map_err(|e| self.exec_error(family, "reading the filter table", e))?;
        let (nat, filter) = (Saved::parse(&nat), Saved::parse(&filter));
        let kept_rules = rules_in_place(&nat, &cfg);

        let mut script = Script::default();
        for table in Table::ALL {
            for chain in cfg.chains(table) {
                script.declare(table, chain);
            }
        }
        for jump in cfg.jumps() {
            let saved = match jump.table {
                Table::Nat => &nat,
                Table::Filter => &filter,
                Table::Mangle => continue,
            };
            if !saved.has_jump(jump.from, jump.to, jump.comment) {
                script.insert_jump(jump.table, jump.from, &jump.spec());
            }
        }
        for table in [Table::Filter, Table::Nat] {
            for (chain, spec) in cfg.rules(table) {
                script.append(table, chain, &spec);
            }
        }
        let rendered: Vec<(PortKey, PortRules)> = snapshot
            .family(family)
            .map(|port| (port.key.clone(), rules::render(port, &cfg.render)))
            .collect();
        let total_chains: usize = rendered.iter().map(|(_, r)| r.chains.len()).sum();
        let limit = self
            .ipt
            .chains_per_restore()
            .filter(|limit| total_chains > *limit);
        let mut parts = Vec::new();
        let mut port_rules = [0; 2];
        for (_, rules) in &rendered {
            for r in &rules.shared {
                script.append(r.table, r.chain, &r.spec);
            }
            let own = own_chains(rules);
            if limit.is_some() {
                parts.push(own);
            } else {
                script.extend(own);
            }
            add_counts(&mut port_rules, rules, 1);
        }
        for spec in cfg.node_port_tail() {
            script.append(Table::Nat, SERVICES, &spec);
        }
        let desired: HashSet<&str> = rendered
            .iter()
            .flat_map(|(_, p)| p.chains.iter().map(|c| c.name.as_str()))
            .collect();
        for chain in nat
            .chains
            .iter()
            .filter(|c| names::is_service_chain(c) && !desired.contains(c.as_str()))
        {
            script.delete_chain(Table::Nat, chain);
        }

        let mut transactions = Vec::new();
        if let Some(limit) = limit {
            // The port chains first, whole ports per transaction; they jump to KUBE-MARK-MASQ,
            // which must exist (with its rule) before them.
            let mut first = Script::default();
            first.declare(Table::Nat, MARK_MASQ);
            for (chain, spec) in cfg.rules(Table::Nat) {
                if chain == MARK_MASQ {
                    first.append(Table::Nat, chain, &spec);
                }
            }
            transactions.push(first);
            transactions.extend(batches(parts, limit));
        }
        transactions.push(script);
        let operations = self.commit_all(index, &transactions, true)?;
        let state = &mut self.states[index];
        state.committed = Some(cfg);
        state.ports = rendered.into_iter().collect();
        state.port_rules = port_rules;
        state.kept_rules = kept_rules;
        state.kept_udp_frontends = if kept_rules {
            UdpFrontends {
                service_ips: nat.udp_service_ips(),
                node_ports: nat
                    .udp_node_ports()
                    .into_iter()
                    .map(|p| (family, p))
                    .collect(),
            }
        } else {
            UdpFrontends::default()
        };
        self.record_rule_counts(index, &transactions);
        Ok(operations)
    }

    /// Sends only what the diff changed.
    fn partial_sync(
        &mut self,
        index: usize,
        request: &SyncRequest<'_>,
        cfg: &StaticConfig,
    ) -> Result<usize, BackendError> {
        let family = self.states[index].family;
        let mut main = Script::default();
        let mut parts = Vec::new();
        let mut updates = Vec::new();
        for (key, change) in request
            .diff
            .changes
            .iter()
            .filter(|(k, _)| k.family == family)
        {
            let new = change.new.as_deref().map(|p| rules::render(p, &cfg.render));
            parts.push(diff_port(
                &mut main,
                self.states[index].ports.get(key),
                new.as_ref(),
            ));
            updates.push((key.clone(), new));
        }
        let declared: usize = parts.iter().map(Script::declarations).sum();
        let transactions = match self.ipt.chains_per_restore() {
            Some(limit) if declared > limit => {
                let mut t = batches(parts, limit);
                t.push(main);
                t
            }
            _ => {
                let mut one = Script::default();
                for part in parts {
                    one.extend(part);
                }
                one.extend(main);
                vec![one]
            }
        };
        let operations = self.commit_all(index, &transactions, false)?;
        let state = &mut self.states[index];
        for (key, new) in updates {
            if let Some(old) = state.ports.remove(&key) {
                add_counts(&mut state.port_rules, &old, -1);
            }
            if let Some(new) = new {
                add_counts(&mut state.port_rules, &new, 1);
                state.ports.insert(key, new);
            }
        }
        if operations > 0 {
            self.record_rule_counts(index, &transactions);
        }
        Ok(operations)
    }

    /// What someone else changed of our rules, read from every canary ([`watch::every_canary`]:
    /// our chains in nat, filter and mangle and the jumps from nat's built-in chains), one
    /// chain listing each, never a whole table; `None` when all are in place (or unreadable:
    /// nothing is concluded from an error).
    fn canary_gone(&mut self, family: Family) -> Option<String> {
        if !self.ipt.reads_kernel() {
            return None;
        }
        for canary in watch::every_canary() {
            match self.ipt.list_chain(family, canary.table, canary.chain) {
                Ok(listing) => {
                    if let Some(what) = watch::judge(family, canary, listing.as_deref()) {
                        return Some(what);
                    }
                }
                Err(e) => {
                    warn!(
                        "{} {family}: reading chain {} of {}: {e}",
                        self.ipt.describe(),
                        canary.chain,
                        canary.table.name()
                    );
                    return None;
                }
            }
        }
        None
    }

    /// After a sync's own window closed (the monitor listens again), checks the canaries of
    /// every family the sync rewrote whole, and returns what someone else changed meanwhile.
    /// A family found changed is rebuilt by the next sync.
    ///
    /// Why: while a sync of kpng's runs, the notification monitor has left its group, so a
    /// second `iptables-restore` landing then (30-70 ms after the first, as a firewall
    /// restart does) was never reported, and nat stayed without kpng's jumps.
    fn confirm(&mut self) -> Vec<String> {
        let mut lost = Vec::new();
        for index in 0..self.states.len() {
            if !self.states[index].full_done {
                continue;
            }
            let family = self.states[index].family;
            if let Some(what) = self.canary_gone(family) {
                self.states[index].committed = None;
                lost.push(what);
            }
        }
        lost
    }

    fn sync_family(
        &mut self,
        index: usize,
        request: &SyncRequest<'_>,
    ) -> Result<usize, BackendError> {
        let family = self.states[index].family;
        let cfg = self.static_config(family, request.snapshot);
        let committed = self.states[index].committed.as_ref();
        let mut full = request.full || committed != Some(&cfg);
        // Periodic syncs (nothing changed) check that nobody flushed the tables, as
        // kube-proxy's canaries in mangle, nat and filter do.
        if !full
            && request.diff.is_empty()
            && let Some(what) = self.canary_gone(family)
        {
            info!("{what}: changed by someone else; rewriting every rule");
            self.found_flushed.push(what);
            full = true;
        }
        if full {
            let done = self.full_sync(index, request.snapshot, cfg);
            self.states[index].full_done = done.is_ok();
            done
        } else {
            self.partial_sync(index, request, &cfg)
        }
    }
}

/// Whether the nat table, as a full sync read it, already sends Service traffic through our
/// rules: `KUBE-SERVICES` holds rules and every jump to it from the built-in chains is there.
/// The full sync's restore then replaces those rules atomically (each port chain is flushed
/// and refilled in one transaction, `KUBE-SERVICES` last), so a frontend they covered never
/// went without a rule. A table someone flushed, or a node kpng never programmed, fails it.
fn rules_in_place(nat: &Saved, cfg: &StaticConfig) -> bool {
    nat.rules.iter().any(|(chain, _)| chain == SERVICES)
        && cfg
            .jumps()
            .iter()
            .filter(|j| j.table == Table::Nat && j.to == SERVICES)
            .all(|j| nat.has_jump(j.from, j.to, j.comment))
}

/// Adds (`sign` 1) or removes (`sign` -1) a port's rules from the per-table counts.
fn add_counts(counts: &mut [usize; 2], rules: &PortRules, sign: isize) {
    for table in [Table::Filter, Table::Nat] {
        if let Some(i) = counted(table) {
            counts[i] = counts[i].saturating_add_signed(sign * rules.rule_count(table) as isize);
        }
    }
}

/// A port's own chains, declared (created or flushed) and filled.
fn own_chains(rules: &PortRules) -> Script {
    let mut script = Script::default();
    for c in &rules.chains {
        script.declare(Table::Nat, &c.name);
        for spec in &c.rules {
            script.append(Table::Nat, &c.name, spec);
        }
    }
    script
}

/// Groups per-port scripts into transactions declaring at most `limit` chains each (a port is
/// never split, so that its chains only ever jump to chains that exist).
fn batches(parts: Vec<Script>, limit: usize) -> Vec<Script> {
    let mut out: Vec<Script> = Vec::new();
    let mut current = Script::default();
    for part in parts {
        let n = part.declarations();
        if n > 0 && current.declarations() > 0 && current.declarations() + n > limit {
            out.push(std::mem::take(&mut current));
        }
        current.extend(part);
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// The restore lines that turn `old` (committed) into `new` for one port: edits of the shared
/// chains and deletions of gone chains go to `main`; the returned script rewrites the port's
/// changed chains (it must be committed before or with `main`).
fn diff_port(main: &mut Script, old: Option<&PortRules>, new: Option<&PortRules>) -> Script {
    let empty = PortRules::default();
    let (old, new) = (old.unwrap_or(&empty), new.unwrap_or(&empty));
    // Shared chains: rules are a multiset; order within them does not matter (the NodePort
    // tail stays last because new rules are inserted at the top).
    let mut unmatched: HashMap<&SharedRule, usize> = HashMap::new();
    for r in &old.shared {
        *unmatched.entry(r).or_default() += 1;
    }
    let mut added = Vec::new();
    for r in &new.shared {
        match unmatched.get_mut(r) {
            Some(n) if *n > 0 => *n -= 1,
            _ => added.push(r),
        }
    }
    for r in &old.shared {
        if let Some(n) = unmatched.get_mut(r)
            && *n > 0
        {
            *n -= 1;
            main.delete_rule(r.table, r.chain, &r.spec);
        }
    }
    for r in added {
        main.insert_first(r.table, r.chain, &r.spec);
    }
    // Own chains: rewrite the changed ones, delete the gone ones.
    let before: HashMap<&str, &Vec<String>> = old
        .chains
        .iter()
        .map(|c| (c.name.as_str(), &c.rules))
        .collect();
    let mut own = Script::default();
    let mut kept = HashSet::new();
    for c in &new.chains {
        kept.insert(c.name.as_str());
        if before.get(c.name.as_str()) == Some(&&c.rules) {
            continue;
        }
        own.declare(Table::Nat, &c.name);
        for spec in &c.rules {
            own.append(Table::Nat, &c.name, spec);
        }
    }
    for c in old
        .chains
        .iter()
        .filter(|c| !kept.contains(c.name.as_str()))
    {
        main.delete_chain(Table::Nat, &c.name);
    }
    own
}

/// Our top-level chains per table: `cleanup` deletes them, and every rule of a built-in chain
/// that jumps to one of them.
const OUR_TOP_CHAINS: [(Table, &[&str]); 3] = [
    (Table::Mangle, &[CANARY]),
    (
        Table::Filter,
        &[
            rules::SERVICES,
            rules::EXTERNAL_SERVICES,
            rules::FORWARD,
            rules::NODEPORTS,
            rules::PROXY_FIREWALL,
        ],
    ),
    (
        Table::Nat,
        &[
            rules::SERVICES,
            rules::NODEPORTS,
            rules::POSTROUTING,
            rules::MARK_MASQ,
        ],
    ),
];

/// Whether `chain` is one kpng creates (a top chain of [`OUR_TOP_CHAINS`] or a Service's).
fn is_our_chain(chain: &str) -> bool {
    names::is_service_chain(chain)
        || OUR_TOP_CHAINS
            .iter()
            .any(|(_, chains)| chains.contains(&chain))
}

/// The built-in chains of every table.
const BUILTIN_CHAINS: [&str; 5] = ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];

impl Backend for IptablesBackend {
    fn name(&self) -> &'static str {
        "iptables"
    }

    /// The families whose iptables work here (an IPv6-less node programs IPv4 only).
    fn families(&self) -> Vec<Family> {
        self.states.iter().map(|state| state.family).collect()
    }

    fn register_metrics(&self, registry: &mut Registry) {
        // At 0 from the start, so that the first failure shows in `increase()`.
        for state in &self.states {
            let label = FamilyLabel::from(state.family);
            let _ = self.metrics.restore_failures.get_or_create(&label);
            let _ = self.metrics.partial_restore_failures.get_or_create(&label);
        }
        registry.register(
            "kubeproxy_sync_proxy_rules_iptables_restore_failures",
            "Cumulative proxy iptables restore failures",
            self.metrics.restore_failures.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures",
            "Cumulative proxy iptables partial restore failures",
            self.metrics.partial_restore_failures.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_iptables_total",
            "Total number of iptables rules owned by kube-proxy",
            self.metrics.rules_total.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_iptables_last",
            "Number of iptables rules written by kube-proxy in last sync",
            self.metrics.rules_last.clone(),
        );
    }

    fn watch_tampering(&mut self, alarm: TamperAlarm) -> Result<bool, BackendError> {
        if self.ipt.nats_in_kernel() {
            self._anchor = kpng_netfilter::anchor::hold_logged(&self.families());
        }
        let Some(ipt) = self.ipt.watcher() else {
            return Ok(false);
        };
        if self.ipt.notifies() {
            match kpng_netfilter::monitor::TableMonitor::start(self.watched(), alarm.clone()) {
                Ok(monitor) => {
                    self.monitor = Some(monitor);
                    self.alarm = Some(alarm);
                    return Ok(true);
                }
                Err(e) => warn!(
                    "{}: {e}; checking our chains every {:?} instead",
                    self.ipt.describe(),
                    watch::CHECK_INTERVAL
                ),
            }
        }
        let watcher = watch::Watcher::start(self.watch_state.clone(), ipt, alarm)
            .map_err(|e| BackendError::Other(e.to_string()))?;
        self.watcher = Some(watcher);
        Ok(true)
    }

    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncStats, BackendError> {
        let watch_state = self.watch_state.clone();
        let _busy = watch_state.busy();
        if self.monitor.as_ref().is_some_and(|m| m.begin_own()) {
            // Someone else changed our chains: rewrite every rule.
            for state in &mut self.states {
                state.committed = None;
            }
        }
        // Where kpng's window of own restores starts: the kernel's generation, and kpng's
        // count of its commits; what its restores change from here on is this window's.
        let window = match self.monitor {
            Some(_) => self.kernel_reader.generation().ok(),
            None => None,
        }
        .map(|generation| (generation, self.own.now()));
        let result = self.sync_all(request);
        if let Some(m) = &self.monitor {
            m.end_own();
            match window {
                Some(window) => self.check_overlap(window),
                // The generation could not be read: what this sync's restores changed is not
                // known against it, so the rules read before are no longer a reference.
                None => self.forget_rules_seen(),
            }
            // Listening again: what went before is read here, what comes after is notified.
            let lost = self.confirm();
            if !lost.is_empty() {
                let what = format!(
                    "{}, again, right after kpng's sync rewrote the rules",
                    lost.join("; ")
                );
                match &self.alarm {
                    Some(alarm) => alarm.raise(what),
                    None if result.is_ok() => {
                        for state in &self.states {
                            watch_state.arm(state.family, state.committed.is_some());
                        }
                        return Err(BackendError::Other(what));
                    }
                    None => {}
                }
            }
        }
        for state in &self.states {
            watch_state.arm(state.family, state.committed.is_some());
        }
        result
    }

    /// Removes the jumps from the built-in chains and every chain we create, in both families
    /// (kubelet's `KUBE-FIREWALL` stays, as kube-proxy leaves it), and puts `route_localnet`
    /// back as it was before kpng.
    fn cleanup(&mut self) -> Result<(), BackendError> {
        let watch_state = self.watch_state.clone();
        let _busy = watch_state.busy();
        for state in &self.states {
            watch_state.arm(state.family, false);
        }
        self.monitor.as_ref().map(|m| m.begin_own());
        let result = self.cleanup_all();
        if let Some(m) = &self.monitor {
            m.end_own();
        }
        self.forget_rules_seen();
        if let Err(e) = self.ipt.restore_route_localnet() {
            warn!("{}: restoring route_localnet: {e}", self.ipt.describe());
        }
        result
    }
}

impl IptablesBackend {
    /// What the notification monitor watches (iptables-nft): our chains in the three tables
    /// of each family, which others use too.
    fn watched(&self) -> kpng_netfilter::monitor::Watched {
        let tables = self
            .states
            .iter()
            .flat_map(|s| Table::ALL.map(|t| (s.family, t.name().to_string())))
            .collect();
        let mut jump_targets: Vec<String> = OUR_TOP_CHAINS
            .iter()
            .flat_map(|(_, chains)| chains.iter().map(|c| (*c).to_string()))
            .collect();
        jump_targets.sort();
        jump_targets.dedup();
        kpng_netfilter::monitor::Watched {
            tables,
            dynamic_sets: Vec::new(),
            chains: Some(kpng_netfilter::monitor::OurChains {
                is_ours: is_our_chain,
                jump_targets,
            }),
        }
    }

    /// Forgets the rules read for [`IptablesBackend::check_overlap`] and what kpng's restores
    /// changed since: after a window that could not be checked (or a cleanup) they are no
    /// reference; the next check reads them again and compares from then on.
    fn forget_rules_seen(&mut self) {
        self.own.take_touched();
        self.touched_since_read = Default::default();
        self.overlap_pending = false;
        for state in &mut self.states {
            state.rules_seen = None;
        }
    }

    /// The handles of kpng's rules in `family`'s three tables, as (table, chain, handle): the
    /// rules of its chains and, in the built-in chains, those that jump to its chains. Other
    /// programs' chains and rules in these shared tables (Docker's, a CNI's) are left out: their
    /// commits are not a change of kpng's rules. `None`: a dump failed.
    fn read_ours(
        reader: &mut kpng_netfilter::generation::KernelReader,
        family: Family,
    ) -> Option<Vec<(&'static str, String, u64)>> {
        let fam = match family {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        };
        let mut ours = Vec::new();
        for table in Table::ALL {
            let targets = OUR_TOP_CHAINS
                .iter()
                .filter(|(t, _)| *t == table)
                .flat_map(|(_, chains)| chains.iter());
            let targets: Vec<&str> = targets.copied().collect();
            let keep = |chain: &str, rule: &[u8]| {
                is_our_chain(chain)
                    || (BUILTIN_CHAINS.contains(&chain)
                        && targets.iter().any(|t| kpng_netfilter::attr::names(rule, t)))
            };
            let rules = reader.rule_handles_where(fam, table.name(), keep).ok()?;
            ours.extend(rules.into_iter().map(|(c, h)| (table.name(), c, h)));
        }
        Some(ours)
    }

    /// The shortest time between two reads of kpng's rules for someone else's commits
    /// ([`IptablesBackend::check_overlap`]): each reads every kpng rule (at 10k Services some
    /// 100k), and a neighbour committing during most syncs would otherwise cost one per sync.
    const OVERLAP_READ_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

    /// After a sync's window of own restores (`window`: the kernel's generation and kpng's
    /// count of committed sections when it began), with the notification group joined again
    /// (iptables-nft): when the generation moved more than kpng's own commits, someone else
    /// committed while the monitor was not listening. Their change is found by reading the
    /// handles of kpng's rules ([`IptablesBackend::read_ours`]: its chains and the jumps to
    /// them, never the other programs' rules in the shared tables) and comparing them with those
    /// read last, leaving out the chains kpng's own restores changed since (their handles
    /// moved; remembered, so the rules are read only when someone else committed, after a
    /// rebuild, and for someone else's commits at most once per
    /// [`IptablesBackend::OVERLAP_READ_INTERVAL`]). A family found changed is reported through the alarm and
    /// rewritten whole by the repair. Without a difference (someone committed to another
    /// chain or table, as Docker, a CNI or fail2ban do), the rules read are the next
    /// comparison's.
    ///
    /// Not seen this way: someone else's change to a chain this sync's restore also changed,
    /// or a rule replaced in place (its handle stays); the periodic checks and full syncs
    /// repair those.
    fn check_overlap(&mut self, window: (u32, u64)) {
        let (before, counted) = window;
        let Ok(after) = self.kernel_reader.generation() else {
            self.forget_rules_seen();
            return;
        };
        self.touched_since_read.merge(self.own.take_touched());
        let own = self.own.now().wrapping_sub(counted);
        let moved = u64::from(after.wrapping_sub(before));
        let foreign = moved.saturating_sub(own) + u64::from(self.overlap_pending);
        let unread = self
            .states
            .iter()
            .any(|s| s.committed.is_some() && s.rules_seen.is_none());
        if foreign == 0 && !unread {
            // Nothing to look for: kpng's own changes since the rules were read are
            // remembered instead of read (a read is every kpng rule, O(Services) here).
            return;
        }
        let recently = self
            .last_read
            .is_some_and(|at| at.elapsed() < Self::OVERLAP_READ_INTERVAL);
        if !unread && recently {
            // A neighbour committing all day: read at most once per interval; the next sync
            // (a periodic one at the latest) compares, against the same reference.
            self.overlap_pending = true;
            return;
        }
        self.overlap_pending = false;
        if foreign > 0 && !unread {
            // Only comparisons for someone else's commits are rationed (not the read of a
            // reference): the first after a calm spell is made at once.
            self.last_read = Some(std::time::Instant::now());
        }
        let touched = std::mem::take(&mut self.touched_since_read);
        let mut changed = Vec::new();
        for state in &mut self.states {
            if state.committed.is_none() {
                state.rules_seen = None;
                continue;
            }
            let family = state.family;
            let now = Self::read_ours(&mut self.kernel_reader, family);
            let differ: Vec<&str> = match (&now, &state.rules_seen) {
                (Some(now), Some(seen)) if foreign > 0 => {
                    let untouched = |rules: &[(&'static str, String, u64)], table: &str| {
                        rules
                            .iter()
                            .filter(|(t, chain, _)| *t == table && !touched.chain(family, t, chain))
                            .cloned()
                            .collect::<Vec<_>>()
                    };
                    Table::ALL
                        .iter()
                        .map(|t| t.name())
                        .filter(|t| untouched(now, t) != untouched(seen, t))
                        .collect()
                }
                _ => Vec::new(),
            };
            if differ.is_empty() {
                state.rules_seen = now;
                continue;
            }
            let fam = match family {
                Family::V4 => "ip",
                Family::V6 => "ip6",
            };
            changed.extend(differ.iter().map(|t| format!("{fam} {t}")));
            state.rules_seen = None;
            state.committed = None;
        }
        if changed.is_empty() {
            return;
        }
        let what = format!(
            "{}: kpng's rules changed by someone else while kpng's sync ran ({foreign} \
             transaction{} not notified)",
            changed.join(" and "),
            if foreign == 1 { "" } else { "s" }
        );
        debug!("{what}");
        if let Some(alarm) = &self.alarm {
            alarm.raise(what);
        }
    }

    fn sync_all(&mut self, request: &SyncRequest<'_>) -> Result<SyncStats, BackendError> {
        let rebuilding = self.states.iter().any(|s| s.committed.is_none());
        // Full, node and periodic (empty) syncs read the node's addresses again, so that an
        // address added or removed gets or loses its node ports within a sync period (as
        // kube-proxy reads them at every sync); a change in them changes the static
        // configuration, which rebuilds that family.
        if matches!(self.config.nodeport_addresses, NodePortAddresses::Cidrs(_))
            && (request.full || request.diff.is_empty() || request.diff.node_changed || rebuilding)
        {
            self.known_addresses = (self.local_addresses)();
        }
        self.found_flushed.clear();
        for state in &mut self.states {
            state.kept_rules = false;
            state.full_done = false;
        }
        let families: Vec<Family> = self.states.iter().map(|s| s.family).collect();
        let operations = sync_each(&families, |index| self.sync_family(index, request))?;
        debug!(operations, "iptables sync done");
        let repaired = (!self.found_flushed.is_empty()).then(|| self.found_flushed.join("; "));
        let kept: Vec<&FamilyState> = self.states.iter().filter(|s| s.kept_rules).collect();
        Ok(SyncStats {
            operations,
            repaired,
            kept_rules: kept.iter().map(|s| s.family).collect(),
            kept_udp_frontends: Some(UdpFrontends {
                service_ips: kept
                    .iter()
                    .flat_map(|s| s.kept_udp_frontends.service_ips.iter().copied())
                    .collect(),
                node_ports: kept
                    .iter()
                    .flat_map(|s| s.kept_udp_frontends.node_ports.iter().copied())
                    .collect(),
            }),
        })
    }

    fn cleanup_all(&mut self) -> Result<(), BackendError> {
        let mut first_error = None;
        for index in 0..self.states.len() {
            let family = self.states[index].family;
            let mut script = Script::default();
            for (table, ours) in OUR_TOP_CHAINS {
                let saved = match self.ipt.save(family, table) {
                    Ok(text) => Saved::parse(&text),
                    Err(e) => {
                        first_error.get_or_insert(self.exec_error(family, "reading rules", e));
                        continue;
                    }
                };
                for (chain, spec) in &saved.rules {
                    let jumps_to_ours = ours
                        .iter()
                        .any(|c| spec == &format!("-j {c}") || spec.ends_with(&format!(" -j {c}")));
                    if BUILTIN_CHAINS.contains(&chain.as_str()) && jumps_to_ours {
                        script.delete_rule(table, chain, spec);
                    }
                }
                for chain in &saved.chains {
                    let service_chain = table == Table::Nat && names::is_service_chain(chain);
                    if ours.contains(&chain.as_str()) || service_chain {
                        script.delete_chain(table, chain);
                    }
                }
            }
            if !script.is_empty()
                && let Err(e) = self.ipt.restore(family, &script.render())
            {
                first_error.get_or_insert(self.exec_error(family, "removing our chains", e));
            }
            let state = &mut self.states[index];
            state.committed = None;
            state.ports.clear();
            state.port_rules = [0; 2];
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
