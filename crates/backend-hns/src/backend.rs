//! The backend: discovers what HCN holds (one enumerate of each kind per full sync, never per
//! Service), asks the planner for the operations of a sync, and carries them out so that HNS's
//! failure modes cannot wedge it:
//! - HCN unavailable: the sync fails at once ([`BackendError`]); the runner backs off and
//!   retries with a full sync, which re-discovers. Never taken as "absent".
//! - "already exists" / "port already exists" on a create: the existing object is found (one
//!   enumerate, at most once per sync) and adopted if it is what kpng wants, else replaced.
//! - a failed delete: the cached ID is forgotten; the next full sync re-discovers the object.
//! - objects deleted out of band: the full sync's enumerate no longer lists them, so they are
//!   re-created.

use std::collections::BTreeSet;
use std::net::IpAddr;

use kpng_backend::{Backend, BackendError, SyncRequest, SyncStats};
use kpng_model::PortKey;
use tracing::{debug, info, warn};

use crate::hcn::{Hcn, HcnError};
use crate::metrics::{Counted, HnsMetrics};
use crate::plan::{
    ConfigError, Frontend, HnsConfig, Known, KnownLb, LbPlan, NetworkType, NetworkView, Op,
    PlanWarning, ServedFamilies, plan_ops, served_families,
};
use crate::schema::{
    Endpoint, IpConfig, LoadBalancer, Policy, SchemaVersion, endpoint_flags, normalize_id,
};
use crate::summary::{HnsSummary, NetworkSummary, SharedSummary};

/// The Windows backend (`to-local hns`).
pub struct HnsBackend {
    config: HnsConfig,
    hcn: Box<dyn Hcn>,
    known: Known,
    metrics: HnsMetrics,
    /// Planner warnings already logged: each is logged once while it holds (every periodic
    /// sync re-plans every port, and would repeat them every `--sync-period`).
    warned: BTreeSet<String>,
    /// What `kpng status` shows, written after each successful sync.
    summary: SharedSummary,
    /// The IP families served on the network as last decided ([`served_families`]), so that
    /// a family left out is logged once, not at every sync.
    families: Option<ServedFamilies>,
}

/// How one sync went, beyond its result.
#[derive(Default)]
struct Run {
    /// HCN calls that change something.
    calls: usize,
    /// Failures that did not stop the sync; it returns an error at the end so that the
    /// runner retries with a full sync.
    failures: Vec<String>,
    /// How many of `calls` failed (each also in `failures`); the other failures are load
    /// balancers that could not be asked for (no call made).
    failed_calls: usize,
    /// Load balancers enumerated during this sync (to adopt after a conflict), at most once.
    enumerated_lbs: Option<Vec<LoadBalancer>>,
    /// Endpoints enumerated during this sync, at most once.
    enumerated_eps: Option<Vec<Endpoint>>,
    /// What a periodic sync (nothing changed in the cluster) found missing or changed in HCN
    /// and puts back: a repair, shown by `kpng status`.
    repair: Option<String>,
}

impl Run {
    /// A change call HCN refused (already counted in `calls`).
    fn call_failed(&mut self, what: String) {
        self.failed_calls += 1;
        self.failures.push(what);
    }

    /// Why a sync (or cleanup, `what`) with failures fails: counts that agree with each other (the change calls
    /// made, how many of them failed, the load balancers not asked for), then the first three
    /// failures and how many more, so that a log line never hides how much went wrong.
    fn failure_message(&self, what: &str) -> String {
        const SHOWN: usize = 3;
        let not_asked = self.failures.len().saturating_sub(self.failed_calls);
        let counts = match (self.failed_calls, not_asked) {
            (failed, 0) => format!("{failed} of its {} HCN change calls failed", self.calls),
            (0, left) => format!(
                "{left} load balancer(s) could not be asked for (no HNS endpoint); its {} HCN \
                 change calls succeeded",
                self.calls
            ),
            (failed, left) => format!(
                "{failed} of its {} HCN change calls failed, and {left} load balancer(s) could \
                 not be asked for (no HNS endpoint)",
                self.calls
            ),
        };
        let first: Vec<&str> = self
            .failures
            .iter()
            .take(SHOWN)
            .map(String::as_str)
            .collect();
        let more = self.failures.len().saturating_sub(SHOWN);
        let more = if more > 0 {
            format!("; and {more} more")
        } else {
            String::new()
        };
        format!("HNS {what} failed: {counts}: {}{more}", first.join("; "))
    }
}

/// What [`HnsBackend::clean`] removed (or, in a dry run, would remove), one line per object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// The load balancers: frontend and ID (`10.96.0.10:80/TCP (…)`, `node port 30080/TCP
    /// (…)`).
    pub load_balancers: Vec<String>,
    /// The remote endpoints: IP and ID.
    pub remote_endpoints: Vec<String>,
}

fn unavailable(e: &HcnError, what: &str) -> BackendError {
    BackendError::Other(format!("HNS unavailable while {what}: {e}"))
}

impl HnsBackend {
    /// The backend's name, kube-proxy's for its Windows mode: in logs, metrics' `backend`
    /// label and `kpng status`, by which `kpng cleanup` knows a kpng that programs HNS.
    pub const NAME: &'static str = "kernelspace";

    /// A backend over an HCN (the system's, or the simulator).
    pub fn new(config: HnsConfig, hcn: Box<dyn Hcn>) -> HnsBackend {
        let metrics = HnsMetrics::default();
        HnsBackend {
            config,
            hcn: Box::new(Counted::new(hcn, metrics.clone())),
            known: Known::default(),
            metrics,
            warned: BTreeSet::new(),
            summary: SharedSummary::default(),
            families: None,
        }
    }

    /// The backend's last picture of HCN, kept up to date after every successful sync.
    pub fn summary(&self) -> SharedSummary {
        self.summary.clone()
    }

    fn publish_summary(&self) {
        let network = self.known.view.as_ref().map(|v| NetworkSummary {
            name: self.config.network_name.clone(),
            id: v.id.clone(),
            network_type: match &v.network_type {
                NetworkType::L2Bridge => "L2Bridge".to_string(),
                NetworkType::Overlay => "Overlay".to_string(),
                NetworkType::Other(t) => t.clone(),
            },
            local_endpoints: v.local.len(),
            root_endpoint: v.root.as_ref().map(|(ip, _)| *ip),
        });
        let summary = HnsSummary {
            network,
            load_balancers: self.known.lbs.len(),
            remote_endpoints: self.known.remote.len(),
            warnings: self.warned.iter().cloned().collect(),
            skipped_family: self
                .families
                .as_ref()
                .and_then(|f| f.skipped.as_ref())
                .map(|(_, why)| why.clone()),
        };
        if let Ok(mut shared) = self.summary.lock() {
            *shared = summary;
        }
    }

    /// At start, before the first sync: finds the network (one enumerate) and refuses a
    /// configuration that cannot work on it ([`HnsConfig::check`]: Overlay without a source
    /// VIP), so that kpng stops at once with the flag to set, as kube-proxy does, instead of
    /// failing every sync. HNS unavailable, or no such network yet: `Ok`, the sync says so
    /// (and checks again once the network is there).
    pub fn check_network(&mut self) -> Result<(), ConfigError> {
        let Ok(networks) = self.hcn.enumerate_networks() else {
            return Ok(());
        };
        let name = &self.config.network_name;
        match networks.iter().find(|n| n.name.eq_ignore_ascii_case(name)) {
            Some(network) => self.config.check(&network.name, &NetworkView::of(network)),
            None => Ok(()),
        }
    }

    /// `kpng cleanup`: removes every load balancer and remote endpoint kpng (or kube-proxy)
    /// made on the network, or with `dry_run` only lists them, and says which, so that the
    /// operator sees what went (or would go). The CNI's endpoints stay.
    pub fn clean(&mut self, dry_run: bool) -> Result<CleanupReport, BackendError> {
        let mut run = Run::default();
        self.discover(&[], &mut run)?;
        let lbs: Vec<(String, String)> = self
            .known
            .lbs
            .iter()
            .map(|(frontend, l)| (l.id.clone(), format!("{frontend} ({})", l.id)))
            .chain(
                self.known
                    .strays
                    .iter()
                    .map(|id| (id.clone(), format!("a second or unreadable one ({id})"))),
            )
            .collect();
        let eps: Vec<(IpAddr, String)> = self
            .known
            .remote
            .iter()
            .map(|(ip, id)| (*ip, id.clone()))
            .collect();
        let report = CleanupReport {
            load_balancers: lbs.iter().map(|(_, what)| what.clone()).collect(),
            remote_endpoints: eps.iter().map(|(ip, id)| format!("{ip} ({id})")).collect(),
        };
        if dry_run {
            return Ok(report);
        }
        for (id, _) in lbs {
            self.delete_lb(&id, &mut run)?;
        }
        for (ip, id) in eps {
            self.apply(vec![Op::DeleteEndpoint { id, ip }], &mut run)?;
        }
        self.known = Known::default();
        self.hcn
            .end_sync()
            .map_err(|e| BackendError::Other(e.to_string()))?;
        if run.failures.is_empty() {
            Ok(report)
        } else {
            Err(BackendError::Other(run.failure_message("cleanup")))
        }
    }

    /// What the backend believes HCN holds (for tests and `/debug`).
    pub fn known(&self) -> &Known {
        &self.known
    }

    /// Rebuilds [`Known`] from HCN: one enumerate of networks, endpoints and load balancers.
    fn discover(&mut self, node_ips: &[IpAddr], run: &mut Run) -> Result<(), BackendError> {
        let networks = self
            .hcn
            .enumerate_networks()
            .map_err(|e| unavailable(&e, "listing networks"))?;
        let name = &self.config.network_name;
        let network = networks
            .iter()
            .find(|n| n.name.eq_ignore_ascii_case(name))
            .ok_or_else(|| {
                let names: Vec<&str> = networks.iter().map(|n| n.name.as_str()).collect();
                BackendError::Other(format!(
                    "HNS network {name:?} (--network-name) not found; HNS has {names:?}. The \
                     CNI creates it: check the CNI's deployment"
                ))
            })?;
        let mut view = NetworkView::of(network);
        let endpoints = self
            .hcn
            .enumerate_endpoints()
            .map_err(|e| unavailable(&e, "listing endpoints"))?;
        let mut known = Known::default();
        let others: BTreeSet<String> = endpoints
            .iter()
            .filter(|e| !same_id(&e.host_compute_network, &view.id))
            .map(|e| normalize_id(&e.id))
            .collect();
        for ep in endpoints
            .iter()
            .filter(|e| same_id(&e.host_compute_network, &view.id))
        {
            let id = normalize_id(&ep.id);
            // The root endpoint (the host's own, for --forward-healthcheck-vip), by name.
            let root_name = &self.config.root_hns_endpoint_name;
            if !root_name.is_empty()
                && ep.name == *root_name
                && view.root.is_none()
                && let Some(ip) = ep.ips().next()
            {
                view.root = Some((ip, id.clone()));
            }
            for ip in ep.ips() {
                if ep.is_remote() {
                    known.remote.entry(ip).or_insert_with(|| id.clone());
                } else {
                    view.local.entry(ip).or_insert_with(|| id.clone());
                }
            }
        }
        let lbs = self
            .hcn
            .enumerate_load_balancers()
            .map_err(|e| unavailable(&e, "listing load balancers"))?;
        for lb in lbs {
            // kpng owns the load balancers over this network's endpoints (as kube-proxy,
            // which is the only one to create them there), and those whose endpoints are gone
            // (an orphan holding a port: upstream PR #137530). Load balancers of another
            // network are left alone.
            let any_other = lb
                .host_compute_endpoints
                .iter()
                .any(|id| others.contains(&normalize_id(id)));
            if any_other {
                continue;
            }
            match Frontend::of(&lb) {
                Some(f) if !known.lbs.contains_key(&f) => known.insert_lb(
                    f,
                    KnownLb {
                        id: normalize_id(&lb.id),
                        content: lb.content(),
                    },
                ),
                _ => {
                    known.strays.insert(normalize_id(&lb.id));
                }
            }
        }
        // On overlay, the source VIP is an endpoint of its own (kube-proxy creates it when
        // the CNI did not).
        if view.network_type == crate::plan::NetworkType::Overlay {
            for vip in &self.config.source_vips {
                if view.local.contains_key(vip) || known.remote.contains_key(vip) {
                    continue;
                }
                let node_ip = node_ips
                    .iter()
                    .find(|ip| ip.is_ipv4() == vip.is_ipv4())
                    .copied();
                let ep = endpoint_request(&view.id, *vip, node_ip, false);
                run.calls += 1;
                match self.hcn.create_endpoint(&ep) {
                    Ok(created) => {
                        view.local.insert(*vip, normalize_id(&created.id));
                    }
                    Err(e) if e.is_unavailable() => {
                        return Err(unavailable(&e, "creating the source VIP endpoint"));
                    }
                    Err(e) => {
                        run.call_failed(format!("creating the source VIP endpoint {vip}: {e}"))
                    }
                }
            }
        }
        known.view = Some(view);
        // What each port had is re-derived by the full sync's plan.
        self.known = known;
        Ok(())
    }

    fn apply(&mut self, ops: Vec<Op>, run: &mut Run) -> Result<(), BackendError> {
        let mut kept: BTreeSet<String> = BTreeSet::new();
        for op in ops {
            match op {
                Op::CreateRemoteEndpoint { ip, provider } => {
                    self.create_remote_endpoint(ip, provider, run)?
                }
                Op::DeleteLoadBalancer { id, frontend } => {
                    let old = frontend.and_then(|f| self.known.remove_lb(&f));
                    self.known.strays.remove(&id);
                    if !self.delete_lb(&id, run)?
                        && let Some(old) = old
                    {
                        kept.extend(old.content.host_compute_endpoints);
                    }
                }
                Op::ReplaceLoadBalancer { old_id, plan } => {
                    let old = self.known.remove_lb(&plan.frontend);
                    if self.delete_lb(&old_id, run)? {
                        self.create_lb(&plan, run)?;
                    } else if let Some(old) = old {
                        kept.extend(old.content.host_compute_endpoints);
                    }
                }
                Op::CreateLoadBalancer { plan } => self.create_lb(&plan, run)?,
                Op::DeleteEndpoint { id, ip } => {
                    // Still used by a load balancer whose delete failed: HNS would refuse, and
                    // the full sync that follows the failure deletes both.
                    if kept.contains(&id) {
                        continue;
                    }
                    // Forgotten whatever happens: a failed delete is re-discovered.
                    self.known.remote.remove(&ip);
                    run.calls += 1;
                    match self.hcn.delete_endpoint(&id) {
                        Ok(()) => {}
                        Err(e) if e.is_not_found() => {}
                        Err(e) if e.is_unavailable() => {
                            return Err(unavailable(&e, "deleting an endpoint"));
                        }
                        Err(e) => {
                            run.call_failed(format!("deleting remote endpoint {ip} ({id}): {e}"))
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn create_remote_endpoint(
        &mut self,
        ip: IpAddr,
        provider: Option<IpAddr>,
        run: &mut Run,
    ) -> Result<(), BackendError> {
        let Some(view_id) = self.known.view.as_ref().map(|v| v.id.clone()) else {
            return Ok(());
        };
        let request = endpoint_request(&view_id, ip, provider, true);
        run.calls += 1;
        match self.hcn.create_endpoint(&request) {
            Ok(created) => {
                self.known.remote.insert(ip, normalize_id(&created.id));
                Ok(())
            }
            Err(e) if e.is_unavailable() => Err(unavailable(&e, "creating an endpoint")),
            Err(e) if e.is_conflict() => {
                // HCN has one already (restored by an HNS restart, or created by someone
                // else): adopt it.
                let eps = self.enumerated_endpoints(run)?;
                match eps.iter().find(|x| {
                    same_id(&x.host_compute_network, &view_id) && x.ips().any(|a| a == ip)
                }) {
                    Some(existing) => {
                        debug!("adopting existing HNS endpoint {} for {ip}", existing.id);
                        let id = normalize_id(&existing.id);
                        if existing.is_remote() {
                            self.known.remote.insert(ip, id);
                        } else if let Some(v) = self.known.view.as_mut() {
                            v.local.insert(ip, id);
                        }
                    }
                    None => run.call_failed(format!("creating remote endpoint {ip}: {e}")),
                }
                Ok(())
            }
            Err(e) => {
                run.call_failed(format!("creating remote endpoint {ip}: {e}"));
                Ok(())
            }
        }
    }

    /// Deletes a load balancer; `Ok(false)` when the delete failed (the ID is forgotten either
    /// way, and the failure recorded).
    fn delete_lb(&mut self, id: &str, run: &mut Run) -> Result<bool, BackendError> {
        run.calls += 1;
        match self.hcn.delete_load_balancer(id) {
            Ok(()) => Ok(true),
            Err(e) if e.is_not_found() => Ok(true),
            Err(e) if e.is_unavailable() => Err(unavailable(&e, "deleting a load balancer")),
            Err(e) => {
                run.call_failed(format!("deleting load balancer {id}: {e}"));
                Ok(false)
            }
        }
    }

    fn create_lb(&mut self, plan: &LbPlan, run: &mut Run) -> Result<(), BackendError> {
        let known = &self.known;
        let Some(lb) = plan.to_hcn(|ep| known.endpoint_id(ep)) else {
            let missing: Vec<String> = plan
                .endpoints
                .iter()
                .filter(|ep| known.endpoint_id(ep).is_none())
                .map(|ep| ep.ip().to_string())
                .collect();
            run.failures.push(format!(
                "{} ({}): no HNS endpoint for {}",
                plan.frontend,
                plan.port_key,
                missing.join(", ")
            ));
            return Ok(());
        };
        for attempt in 0..2 {
            run.calls += 1;
            match self.hcn.create_load_balancer(&lb) {
                Ok(created) => {
                    self.known.insert_lb(
                        plan.frontend,
                        KnownLb {
                            id: normalize_id(&created.id),
                            content: lb,
                        },
                    );
                    return Ok(());
                }
                Err(e) if e.is_unavailable() => {
                    return Err(unavailable(&e, "creating a load balancer"));
                }
                Err(e) if e.is_conflict() && attempt == 0 => {
                    // Someone holds the frontend: adopt it if it is ours as wanted, else
                    // delete it and try once more.
                    let existing = self
                        .enumerated_lbs(run)?
                        .iter()
                        .find(|x| Frontend::of(x) == Some(plan.frontend))
                        .cloned();
                    let Some(existing) = existing else {
                        run.call_failed(format!(
                            "{} ({}): {e}, and no load balancer holds it",
                            plan.frontend, plan.port_key
                        ));
                        return Ok(());
                    };
                    if existing.content() == lb {
                        debug!(
                            "adopting existing load balancer {} for {}",
                            existing.id, plan.frontend
                        );
                        self.known.insert_lb(
                            plan.frontend,
                            KnownLb {
                                id: normalize_id(&existing.id),
                                content: lb,
                            },
                        );
                        return Ok(());
                    }
                    if !self.delete_lb(&existing.id, run)? {
                        return Ok(());
                    }
                }
                Err(e) => {
                    run.call_failed(format!("{} ({}): {e}", plan.frontend, plan.port_key));
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    fn enumerated_lbs(&mut self, run: &mut Run) -> Result<Vec<LoadBalancer>, BackendError> {
        if run.enumerated_lbs.is_none() {
            let lbs = self
                .hcn
                .enumerate_load_balancers()
                .map_err(|e| unavailable(&e, "listing load balancers"))?;
            run.enumerated_lbs = Some(lbs);
        }
        Ok(run.enumerated_lbs.clone().unwrap_or_default())
    }

    fn enumerated_endpoints(&mut self, run: &mut Run) -> Result<Vec<Endpoint>, BackendError> {
        if run.enumerated_eps.is_none() {
            let eps = self
                .hcn
                .enumerate_endpoints()
                .map_err(|e| unavailable(&e, "listing endpoints"))?;
            run.enumerated_eps = Some(eps);
        }
        Ok(run.enumerated_eps.clone().unwrap_or_default())
    }

    fn sync_inner(&mut self, request: &SyncRequest<'_>, run: &mut Run) -> Result<(), BackendError> {
        // The runner's periodic empty sync (`--sync-period`) re-reads HCN too: objects
        // deleted out of band (HNS or CNI restarts, `hnsdiag delete`) come back within a sync
        // period, for three enumerates (what upstream's per-sync HNS cache costs).
        // A node change (its IPs: every load balancer's SourceVIP may follow) is one too.
        let full = request.full
            || request.diff.is_empty()
            || request.diff.node_changed
            || self.known.view.is_none();
        if full {
            self.discover(&request.snapshot.node.ips, run)?;
        }
        let Some(view) = self.known.view.clone() else {
            return Err(BackendError::Other("HNS network not discovered".into()));
        };
        // A network that appeared after the start's check: the same refusal, every sync, rather
        // than load balancers with the node IP as an overlay's source VIP.
        self.config
            .check(&self.config.network_name, &view)
            .map_err(|e| BackendError::Other(e.to_string()))?;
        // The families winkernel would serve on this network: the other one's ports get no
        // load balancer (and, at a full sync, lose those they had).
        let families =
            served_families(&self.config.network_name, &view, &request.snapshot.node.ips);
        if self.families.as_ref() != Some(&families) {
            match &families.skipped {
                Some((_, why)) => info!("{why}"),
                None if self.families.is_some() => info!(
                    "HNS network {}: both IP families are served again",
                    self.config.network_name
                ),
                None => {}
            }
            self.families = Some(families.clone());
        }
        let ports: BTreeSet<PortKey> = if full {
            request.snapshot.ports.keys().cloned().collect()
        } else {
            request.diff.changes.keys().cloned().collect()
        };
        let ports: BTreeSet<PortKey> = ports
            .into_iter()
            .filter(|k| families.serves(k.family))
            .collect();
        let mut warnings: Vec<PlanWarning> = Vec::new();
        let (ops, by_port) = plan_ops(
            &self.known,
            &view,
            request.snapshot,
            &ports,
            full,
            &self.config,
            &mut warnings,
        );
        let lines: BTreeSet<String> = warnings
            .iter()
            .map(|w| format!("{}: {}", w.port, w.message))
            .collect();
        for line in lines.difference(&self.warned) {
            warn!("{line}");
        }
        if full {
            self.warned = lines;
        } else {
            self.warned.extend(lines);
        }
        if request.diff.is_empty() && !request.full && !ops.is_empty() {
            run.repair = Some(repair_summary(&ops));
        }
        if full {
            self.known.by_port.clear();
        }
        for (key, frontends) in by_port {
            if frontends.is_empty() {
                self.known.by_port.remove(&key);
            } else {
                self.known.by_port.insert(key, frontends);
            }
        }
        self.apply(ops, run)
    }
}

/// What a periodic sync puts back, in a line: the objects someone deleted or changed out of
/// band (an HNS or CNI restart, `hnsdiag delete`, `Get-HnsPolicyList | Remove-HnsPolicyList`),
/// which kpng found when it read HCN again.
fn repair_summary(ops: &[Op]) -> String {
    let (mut lbs, mut endpoints, mut strays) = (0, 0, 0);
    for op in ops {
        match op {
            Op::CreateLoadBalancer { .. } | Op::ReplaceLoadBalancer { .. } => lbs += 1,
            Op::CreateRemoteEndpoint { .. } => endpoints += 1,
            Op::DeleteLoadBalancer { .. } | Op::DeleteEndpoint { .. } => strays += 1,
        }
    }
    let mut parts = Vec::new();
    if lbs > 0 {
        parts.push(format!(
            "{lbs} load balancer(s) missing or changed, created again"
        ));
    }
    if endpoints > 0 {
        parts.push(format!(
            "{endpoints} remote endpoint(s) missing, created again"
        ));
    }
    if strays > 0 {
        parts.push(format!("{strays} object(s) kpng no longer wants, deleted"));
    }
    format!(
        "HNS changed by someone else (an HNS or CNI restart, hnsdiag): {}",
        parts.join("; ")
    )
}

/// Whether two GUIDs name the same object.
fn same_id(a: &str, b: &str) -> bool {
    normalize_id(a) == normalize_id(b)
}

/// The create request of an endpoint on a network: a remote one (a pod on another node, with
/// its node's provider address on overlay) or the overlay's source VIP.
fn endpoint_request(network: &str, ip: IpAddr, provider: Option<IpAddr>, remote: bool) -> Endpoint {
    Endpoint {
        id: String::new(),
        name: String::new(),
        host_compute_network: network.to_string(),
        ip_configurations: vec![IpConfig {
            ip_address: ip.to_string(),
            prefix_length: None,
        }],
        mac_address: Some(conjure_mac(ip)),
        flags: if remote {
            endpoint_flags::REMOTE
        } else {
            endpoint_flags::NONE
        },
        policies: provider
            .map(|pa| Policy {
                policy_type: "ProviderAddress".into(),
                settings: serde_json::json!({ "ProviderAddress": pa.to_string() }),
            })
            .into_iter()
            .collect(),
        schema_version: SchemaVersion::default(),
        extra: Default::default(),
    }
}

/// kube-proxy's MAC for a remote endpoint: `02-11-` and the IPv4 address's bytes (the last
/// four bytes of an IPv6 address).
pub fn conjure_mac(ip: IpAddr) -> String {
    let b = match ip {
        IpAddr::V4(v) => v.octets(),
        IpAddr::V6(v) => {
            let o = v.octets();
            [o[12], o[13], o[14], o[15]]
        }
    };
    format!("02-11-{:02x}-{:02x}-{:02x}-{:02x}", b[0], b[1], b[2], b[3])
}

impl Backend for HnsBackend {
    /// kube-proxy's name of the mode, as `/proxyMode` answers it on Windows.
    fn name(&self) -> &'static str {
        HnsBackend::NAME
    }

    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        self.metrics.register(registry);
    }

    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncStats, BackendError> {
        self.hcn.begin_sync();
        let mut run = Run::default();
        let result = self.sync_inner(request, &mut run);
        let written = self.hcn.end_sync();
        result?;
        written.map_err(|e| BackendError::Other(e.to_string()))?;
        if !run.failures.is_empty() {
            return Err(BackendError::Other(run.failure_message("sync")));
        }
        self.metrics
            .load_balancers
            .set(i64::try_from(self.known.lbs.len()).unwrap_or(i64::MAX));
        self.metrics
            .remote_endpoints
            .set(i64::try_from(self.known.remote.len()).unwrap_or(i64::MAX));
        if request.full {
            info!(
                load_balancers = self.known.lbs.len(),
                remote_endpoints = self.known.remote.len(),
                calls = run.calls,
                "HNS in sync"
            );
        }
        self.publish_summary();
        if let Some(what) = &run.repair {
            warn!("{what}");
        }
        Ok(SyncStats {
            operations: run.calls,
            repaired: run.repair,
            ..SyncStats::default()
        })
    }

    fn cleanup(&mut self) -> Result<(), BackendError> {
        self.clean(false).map(|_| ())
    }
}
