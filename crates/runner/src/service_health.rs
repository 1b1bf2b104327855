//! Service health-check servers: what cloud load balancers probe on each node.
//!
//! For every LoadBalancer Service with `externalTrafficPolicy: Local` and a
//! `healthCheckNodePort`, kube-proxy serves HTTP on that port on the node-port addresses and
//! answers, for any path, 200 when this node has local *ready* endpoints for the Service and the
//! proxy is healthy, 503 otherwise, with the endpoint count in a JSON body and in the
//! `X-Load-Balancing-Endpoint-Weight` header. Load balancers then send external traffic only to
//! nodes that can serve it locally. Servers open and close with the Services after each sync;
//! a port already in use is reported and retried at the next sync, never fatal.
//!
//! Where they listen follows `--nodeport-addresses` as kube-proxy's `newServiceHealthServer`
//! does ([`HealthCheckAddresses`]): with CIDRs, only the node's addresses inside them (per
//! family, as the node ports themselves), read again at full, node and periodic syncs so that an
//! address added is bound and one removed is closed ([`ListenAddresses`]). Each Service's
//! check listens only on the addresses of its own families ([`ServiceFamilies`]), as upstream's
//! server per family's proxier: an IPv6-only Service's check has no IPv4 listener. And each
//! listener answers with the local ready endpoints of its own family only ([`LocalEndpoints`]),
//! as that server is fed only its family's endpoints: a dual-stack Service whose local
//! endpoints are all IPv6 answers 503 on IPv4, whose traffic kpng rejects.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use axum::Router;
use axum::extract::{Extension, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use ipnet::IpNet;
use kpng_backend::settings::{NodePortAddresses, NodePortScope};
use kpng_model::{Family, ServiceKey, ServicePort, Snapshot};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use crate::guarded_http::{
    ConnectionLimits, Guard, OpenConnections, RefusalTally, RefusedConnections,
};
use crate::health::ProxyHealth;

/// Where Service health checks listen, as `--nodeport-addresses` says (decided by the binary
/// with the backend's node-port addresses, so that the checks go where the node ports are).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthCheckAddresses {
    /// The node's IPs (`--nodeport-addresses primary`, or the mode's default): none while they
    /// are unknown ([`ListenAddresses::serves_nothing`]), every address once NodePorts are
    /// served on every local address for want of them.
    NodeIps,
    /// Every address (`0.0.0.0` and `[::]`): iptables mode's default, and the Windows backend.
    All,
    /// The node's interface addresses inside these CIDRs (`--nodeport-addresses` as CIDRs), as
    /// kube-proxy's `GetNodeIPs`. Per family, as the node ports ([`NodePortAddresses::scope`]):
    /// a family without a CIDR, or with a `/0` (kube-proxy's "match all"), listens on all of
    /// its addresses; one whose CIDRs match no address listens nowhere; when the addresses
    /// cannot be read, on all of them (kube-proxy's fallback, with an error logged). Only the
    /// backend's families listen: kube-proxy runs a health server per family's proxier.
    Cidrs(Vec<IpNet>),
}

/// The addresses [`HealthCheckAddresses`] selects at one moment, with what the log says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chosen {
    /// Where the checks listen: addresses, or a family's wildcard (`0.0.0.0`, `[::]`). Sorted.
    pub addresses: Vec<IpAddr>,
    /// Families that needed the node's interface addresses, which could not be read: they
    /// listen on every address instead.
    pub unread: Vec<Family>,
    /// Families whose CIDRs match no address of the node: they listen nowhere.
    pub unmatched: Vec<Family>,
}

/// The wildcard of a family: every address of it.
fn wildcard(family: Family) -> IpAddr {
    match family {
        Family::V4 => IpAddr::from([0u8; 4]),
        Family::V6 => IpAddr::from([0u16; 8]),
    }
}

impl HealthCheckAddresses {
    /// Whether no health check may be served on `node`: with checks on the node IPs and none
    /// known (before `--node-ips-wait` moves NodePorts to every local address), the NodePorts
    /// are not served either ([`ListenAddresses::serves_nothing`]).
    pub fn serves_nothing(&self, node: &kpng_model::NodeState) -> bool {
        matches!(self, HealthCheckAddresses::NodeIps)
            && node.ips.is_empty()
            && !node.nodeports_on_all_local
    }

    /// Where the checks listen on `node` for `families`, with the node's interface addresses
    /// `local` (none when [`HealthCheckAddresses::serves_nothing`]): what `kpng trace` says is
    /// answered, the same choice as the servers'.
    pub fn listening_on(
        &self,
        families: &[Family],
        node: &kpng_model::NodeState,
        local: impl FnOnce() -> Vec<IpAddr>,
    ) -> Vec<IpAddr> {
        if self.serves_nothing(node) {
            return Vec::new();
        }
        self.choose(families, &node.ips, local).addresses
    }

    /// Whether the choice depends on the node's interface addresses, which change without
    /// any Kubernetes event (read again at full, node and periodic syncs, as the backends).
    pub fn reads_local_addresses(&self) -> bool {
        matches!(self, HealthCheckAddresses::Cidrs(_))
    }

    /// The addresses to listen on for the backend's `families`, the node's primary IPs
    /// `node_ips`, and its interface addresses `local` (read only when needed; an empty list
    /// means they could not be read: a host always has some).
    pub fn choose(
        &self,
        families: &[Family],
        node_ips: &[IpAddr],
        local: impl FnOnce() -> Vec<IpAddr>,
    ) -> Chosen {
        let mut chosen = Chosen::default();
        match self {
            HealthCheckAddresses::All => {
                chosen.addresses = Family::ALL.into_iter().map(wildcard).collect();
            }
            HealthCheckAddresses::NodeIps if node_ips.is_empty() => {
                chosen.addresses = Family::ALL.into_iter().map(wildcard).collect();
            }
            // Per family, as the node ports (`NodePortAddresses::scope_on`): a family the node
            // has no IP of is served on all its addresses, so its checks listen on all too.
            HealthCheckAddresses::NodeIps => {
                for &family in families {
                    let of_family: Vec<IpAddr> = node_ips
                        .iter()
                        .copied()
                        .filter(|ip| Family::of(ip) == family)
                        .collect();
                    if of_family.is_empty() {
                        chosen.addresses.push(wildcard(family));
                    } else {
                        chosen.addresses.extend(of_family);
                    }
                }
            }
            HealthCheckAddresses::Cidrs(cidrs) => {
                // The node ports' own rule, so that the checks and the node ports agree.
                let setting = NodePortAddresses::Cidrs(cidrs.clone());
                let mut local = Some(local);
                let mut read: Option<Vec<IpAddr>> = None;
                for &family in families {
                    let scope = setting.scope(family);
                    let matches_all = match &scope {
                        NodePortScope::Cidrs(c) => c.iter().any(|n| n.prefix_len() == 0),
                        NodePortScope::AllLocal => true,
                        NodePortScope::Primary => false,
                    };
                    if matches_all {
                        chosen.addresses.push(wildcard(family));
                        continue;
                    }
                    let here =
                        read.get_or_insert_with(|| local.take().map_or_else(Vec::new, |f| f()));
                    if here.is_empty() {
                        chosen.unread.push(family);
                        chosen.addresses.push(wildcard(family));
                        continue;
                    }
                    let ips = scope.addresses(family, node_ips, || here.clone());
                    if ips.is_empty() {
                        chosen.unmatched.push(family);
                    }
                    chosen.addresses.extend(ips);
                }
            }
        }
        chosen.addresses.sort();
        chosen.addresses.dedup();
        chosen
    }
}

/// Reads the node's interface addresses (empty when they cannot be read).
pub type LocalAddresses = Box<dyn FnMut() -> Vec<IpAddr> + Send>;

/// [`HealthCheckAddresses`] followed from sync to sync: what was chosen last, so that a
/// change moves the servers and is logged once.
pub struct ListenAddresses {
    setting: HealthCheckAddresses,
    local_addresses: LocalAddresses,
    last: Option<Chosen>,
    /// The families last warned of as listening nowhere ([`ListenAddresses::warn_unserved`]).
    warned_unmatched: Vec<Family>,
}

impl ListenAddresses {
    /// Reads the node's interface addresses as the backends do (`ip -o addr show`; none
    /// outside Linux, where the CIDR setting falls back to every address).
    pub fn new(setting: HealthCheckAddresses) -> ListenAddresses {
        #[cfg(target_os = "linux")]
        let local_addresses: LocalAddresses = Box::new(kpng_backend::host::local_addresses);
        #[cfg(not(target_os = "linux"))]
        let local_addresses: LocalAddresses = Box::new(Vec::new);
        ListenAddresses {
            setting,
            local_addresses,
            last: None,
            warned_unmatched: Vec::new(),
        }
    }

    /// Whether no health check may be served on `node`: with checks on the node IPs and none
    /// known (before `--node-ips-wait` moves NodePorts to every local address), the NodePorts
    /// are not served either, and a check answering 200 would draw a load balancer's traffic
    /// to a node that drops it.
    pub fn serves_nothing(&self, node: &kpng_model::NodeState) -> bool {
        self.setting.serves_nothing(node)
    }

    /// Reads the node's interface addresses with `read` instead (tests).
    pub fn with_local_addresses(mut self, read: LocalAddresses) -> ListenAddresses {
        self.local_addresses = read;
        self
    }

    /// Where the checks listen at this sync, and whether that changed since the last one.
    /// `reread`: whether to read the node's interface addresses again (a full, node or
    /// periodic sync; other syncs keep the last ones, since reading them costs a process).
    pub fn at_sync(
        &mut self,
        families: &[Family],
        node_ips: &[IpAddr],
        reread: bool,
    ) -> (Vec<IpAddr>, bool) {
        if let Some(last) = &self.last
            && self.setting.reads_local_addresses()
            && !reread
        {
            return (last.addresses.clone(), false);
        }
        let chosen = self
            .setting
            .choose(families, node_ips, &mut self.local_addresses);
        let before = self.last.take();
        self.report(before.as_ref(), &chosen);
        let changed = before.is_none_or(|b| b.addresses != chosen.addresses);
        let addresses = chosen.addresses.clone();
        self.last = Some(chosen);
        (addresses, changed)
    }

    /// Warns of the families whose `--nodeport-addresses` CIDRs match no address of the node
    /// and that some Service's check has (`in_use`, asked only when some family listens
    /// nowhere): those checks are not served on that family. Once, and again when the
    /// families change; returns the families newly warned of.
    pub fn warn_unserved(&mut self, in_use: impl FnOnce() -> ServiceFamilies) -> Vec<Family> {
        let unmatched = self.last.as_ref().map_or(&[][..], |l| &l.unmatched[..]);
        let now: Vec<Family> = if unmatched.is_empty() {
            Vec::new()
        } else {
            let in_use = in_use();
            unmatched
                .iter()
                .copied()
                .filter(|f| in_use.contains(*f))
                .collect()
        };
        if now == self.warned_unmatched {
            return Vec::new();
        }
        self.warned_unmatched = now.clone();
        if !now.is_empty() {
            let names = now
                .iter()
                .map(|f| f.label())
                .collect::<Vec<_>>()
                .join(" and ");
            warn!(
                "no {names} address of the node is inside --nodeport-addresses: the {names} \
                 Service health checks do not listen anywhere (`kpng status` shows them NOT \
                 SERVED), and a load balancer probing this node over {names} sees it down"
            );
        }
        now
    }

    /// Logs what changed in the choice: a fallback, a move.
    fn report(&self, before: Option<&Chosen>, now: &Chosen) {
        let names = |families: &[Family]| {
            families
                .iter()
                .map(|f| f.label())
                .collect::<Vec<_>>()
                .join(" and ")
        };
        if !now.unread.is_empty() && before.is_none_or(|b| b.unread != now.unread) {
            error!(
                "cannot read the node's addresses: Service health checks listen on every {} \
                 address instead of those inside --nodeport-addresses",
                names(&now.unread)
            );
        }
        // A family listening nowhere is warned of by `warn_unserved`, once a Service's check
        // has that family (until 2026-12-07 it was warned here, even with no such check).
        if let Some(before) = before
            && before.addresses != now.addresses
            && self.setting.reads_local_addresses()
        {
            let list = |ips: &[IpAddr]| {
                ips.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            info!(
                "the node's addresses inside --nodeport-addresses changed: Service health \
                 checks listen on [{}] (were [{}])",
                list(&now.addresses),
                list(&before.addresses)
            );
        }
    }
}

/// What one Service's health check must answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthCheck {
    /// The `healthCheckNodePort`.
    pub port: u16,
    /// Local ready endpoints (terminating ones excluded) per family, over the Service's ports
    /// of that family: each family's listeners answer with their own family's count.
    pub local_endpoints: LocalEndpoints,
    /// The Service's families (among the backend's): its check listens on addresses of these
    /// only.
    pub families: ServiceFamilies,
}

/// A Service's local ready endpoints per IP family. kube-proxy runs a proxier per family, each
/// with its own health server fed only that family's endpoints: a dual-stack Service whose
/// local endpoints are all IPv6 answers 503 on the node's IPv4 addresses (whose traffic kpng
/// rejects, as there is no IPv4 endpoint) and 200 on its IPv6 ones. One count for both
/// families told an IPv4 load balancer to send traffic to a node that refuses it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LocalEndpoints {
    v4: u32,
    v6: u32,
}

impl LocalEndpoints {
    /// `count` endpoints of `family`, none of the other.
    pub fn of(family: Family, count: u32) -> LocalEndpoints {
        match family {
            Family::V4 => LocalEndpoints { v4: count, v6: 0 },
            Family::V6 => LocalEndpoints { v4: 0, v6: count },
        }
    }

    /// `count` endpoints in each family.
    pub fn both(count: u32) -> LocalEndpoints {
        LocalEndpoints {
            v4: count,
            v6: count,
        }
    }

    /// The count a listener of `family` answers with.
    pub fn get(self, family: Family) -> u32 {
        match family {
            Family::V4 => self.v4,
            Family::V6 => self.v6,
        }
    }

    /// Per family, the larger of the two (ports of one Service share its endpoints).
    fn max(self, other: LocalEndpoints) -> LocalEndpoints {
        LocalEndpoints {
            v4: self.v4.max(other.v4),
            v6: self.v6.max(other.v6),
        }
    }
}

/// The IP families a Service has ports of. kube-proxy runs a health server per family's
/// proxier, and a proxier sees only its family's Services: an IPv6-only Service's check
/// listens on no IPv4 address (where its node port is not served either), whatever the
/// IPv4 listen address would be.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServiceFamilies {
    v4: bool,
    v6: bool,
}

impl ServiceFamilies {
    /// Both families (a dual-stack Service).
    pub const BOTH: ServiceFamilies = ServiceFamilies { v4: true, v6: true };

    /// One family.
    pub fn of(family: Family) -> ServiceFamilies {
        ServiceFamilies {
            v4: family == Family::V4,
            v6: family == Family::V6,
        }
    }

    /// Whether `family` is one of them.
    pub fn contains(self, family: Family) -> bool {
        match family {
            Family::V4 => self.v4,
            Family::V6 => self.v6,
        }
    }

    /// These and `other`'s.
    pub fn union(self, other: ServiceFamilies) -> ServiceFamilies {
        ServiceFamilies {
            v4: self.v4 || other.v4,
            v6: self.v6 || other.v6,
        }
    }

    /// Of the node's listen addresses (wildcards included), those of these families: where
    /// the Service's check listens.
    pub fn select(self, addresses: &[IpAddr]) -> Vec<IpAddr> {
        addresses
            .iter()
            .copied()
            .filter(|ip| self.contains(Family::of(ip)))
            .collect()
    }
}

/// The health checks a snapshot calls for, per Service, from its ports of the backend's
/// `families` (a single-stack node has no check for a Service of the other family only).
pub fn wanted(snapshot: &Snapshot, families: &[Family]) -> BTreeMap<ServiceKey, HealthCheck> {
    let mut out: BTreeMap<ServiceKey, HealthCheck> = BTreeMap::new();
    for sp in snapshot.ports.values() {
        if !families.contains(&sp.key.family) {
            continue;
        }
        if let Some(check) = port_check(sp) {
            out.entry(sp.key.service.clone())
                .and_modify(|c| *c = merge(*c, check))
                .or_insert(check);
        }
    }
    out
}

/// The health check of one Service, read from its ports only: what a change to that Service
/// needs, without walking every port of the cluster.
pub fn wanted_for(
    snapshot: &Snapshot,
    service: &ServiceKey,
    families: &[Family],
) -> Option<HealthCheck> {
    snapshot
        .service_ports(service)
        .filter(|sp| families.contains(&sp.key.family))
        .filter_map(|sp| port_check(sp))
        .reduce(merge)
}

/// What one port says about its Service's health check.
fn port_check(sp: &ServicePort) -> Option<HealthCheck> {
    sp.health_check_node_port.map(|port| HealthCheck {
        port,
        local_endpoints: LocalEndpoints::of(sp.key.family, sp.local_ready_endpoints),
        families: ServiceFamilies::of(sp.key.family),
    })
}

/// Two ports' views of one Service's check. kube-proxy reports the Service's local ready
/// endpoints of the family; ports of one Service share them, so the largest per-port count of
/// a family is the Service's in that family (never the other family's: see [`LocalEndpoints`]).
/// The port is the first port's (all ports of a Service carry the same one); the families are
/// both ports'.
fn merge(first: HealthCheck, other: HealthCheck) -> HealthCheck {
    HealthCheck {
        port: first.port,
        local_endpoints: first.local_endpoints.max(other.local_endpoints),
        families: first.families.union(other.families),
    }
}

/// kube-proxy's response body: tab-indented JSON without a trailing newline.
pub fn body(service: &ServiceKey, local_endpoints: u32, proxy_healthy: bool) -> String {
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""));
    format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\t\"localEndpoints\": {local_endpoints},\n\t\"serviceProxyHealthy\": {proxy_healthy}\n}}",
        quote(&service.namespace),
        quote(&service.name)
    )
}

/// What every check's answer reads: the local endpoint counts (per family) and the proxy's
/// health. The one router of all the checks holds it as its state; which Service a request is
/// for, and the family of the listener it came to, come with the request ([`answer`]).
#[derive(Clone)]
struct Shared {
    counts: Arc<RwLock<HashMap<ServiceKey, LocalEndpoints>>>,
    health: Arc<ProxyHealth>,
}

/// The router every health-check listener serves: built once, shared (cloning a `Router` is
/// a reference count). Each listener tags its requests with its Service and its address's
/// family ([`Probed`], [`crate::guarded_http::serve_tagged`]); a router per listener, with the Service in its
/// state, was ~3.5 KiB each, 5 MiB of the ~9 MiB that 1,500 checks added to kpng's peak
/// RSS at 30k Services.
fn router(shared: Shared) -> Router {
    Router::new().fallback(answer).with_state(shared)
}

/// kube-proxy's rule: 200 when the node has local ready endpoints and the proxy is healthy
/// (load balancers send it the Service's traffic), else 503. The servers answer with it and
/// `kpng status` reports it.
fn answer_status(local_endpoints: u32, healthy: bool) -> StatusCode {
    if local_endpoints > 0 && healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

/// What a listener tags its requests with: the Service whose check it serves, and the family
/// of its address (`0.0.0.0` is IPv4, `[::]` IPv6: the IPv6 wildcard is v6-only, [`bind`]),
/// whose local endpoint count it answers with.
#[derive(Debug, Clone)]
struct Probed {
    service: ServiceKey,
    family: Family,
}

async fn answer(State(shared): State<Shared>, Extension(probed): Extension<Probed>) -> Response {
    let Probed { service, family } = probed;
    let count = shared
        .counts
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&service)
        .map_or(0, |c| c.get(family));
    let healthy = shared.health.is_healthy(SystemTime::now());
    let status = answer_status(count, healthy);
    let mut response = (status, body(&service, count, healthy)).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if let Ok(v) = HeaderValue::from_str(&count.to_string()) {
        headers.insert("X-Load-Balancing-Endpoint-Weight", v);
    }
    response
}

struct Running {
    port: u16,
    /// The Service's families: where its check is wanted ([`ServiceFamilies::select`]).
    families: ServiceFamilies,
    /// Where the check is wanted (sorted); none when no address of the node is inside
    /// `--nodeport-addresses`.
    addresses: Vec<IpAddr>,
    /// Of those, where it could not be bound yet (retried at every sync): one family's
    /// address missing from the host must not take the other family's check down, as with
    /// kube-proxy's proxier per family.
    unbound: Vec<IpAddr>,
    /// One server per bound address, so that an address that goes closes alone.
    tasks: Vec<(IpAddr, JoinHandle<()>)>,
    /// Since when it listens nowhere (no address wanted), for `kpng trace`.
    nowhere_since: Option<SystemTime>,
    /// The connections its listeners refused or closed over a cap, for `kpng status`.
    refusals: RefusalTally,
}

/// Why a wanted check listens nowhere: `--nodeport-addresses` CIDRs no address of the node is
/// in (kube-proxy then listens nowhere too; a load balancer probing the node sees it down).
const NO_ADDRESS: &str = "no address of the node is inside --nodeport-addresses";

impl Running {
    /// Stops the server and waits until its sockets are closed, so that its port can be
    /// bound again at once (dropping only asks the runtime to stop the tasks).
    async fn close(mut self) {
        for (_, task) in std::mem::take(&mut self.tasks) {
            task.abort();
            let _ = task.await;
        }
    }

    /// Follows the node's addresses: closes (and waits for) the servers of addresses no
    /// longer wanted, and marks the new ones unbound; the others keep serving, connections
    /// included.
    async fn move_to(&mut self, addresses: &[IpAddr]) {
        let (kept, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut self.tasks)
            .into_iter()
            .partition(|(ip, _)| addresses.contains(ip));
        self.tasks = kept;
        for (_, task) in gone {
            task.abort();
            let _ = task.await;
        }
        self.unbound.retain(|ip| addresses.contains(ip));
        for ip in addresses {
            if !self.addresses.contains(ip) {
                self.unbound.push(*ip);
            }
        }
        self.addresses = addresses.to_vec();
        self.nowhere_since = match (self.addresses.is_empty(), self.nowhere_since) {
            (false, _) => None,
            (true, since) => Some(since.unwrap_or_else(SystemTime::now)),
        };
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        for (_, t) in &self.tasks {
            t.abort();
        }
    }
}

/// A wanted health check whose server could not start: retried at every sync, logged once
/// (and again only when the reason changes), listed by `kpng status` until it starts.
#[derive(Debug, Clone)]
struct NotStarted {
    check: HealthCheck,
    error: String,
    since: SystemTime,
    attempts: u32,
}

impl NotStarted {
    /// What `kpng status` and the Event report of it.
    fn not_served(&self, service: &ServiceKey) -> NotServed {
        NotServed {
            service: service.clone(),
            port: self.check.port,
            error: self.error.clone(),
            since: self.since,
        }
    }
}

/// A Service's health check that is not served now, for `kpng status`: a load balancer
/// probing it sees this node as unhealthy for that Service, whatever its endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotServed {
    /// The Service.
    pub service: ServiceKey,
    /// Its `healthCheckNodePort`.
    pub port: u16,
    /// Why the server could not start (the address and the system's error).
    pub error: String,
    /// When it first failed.
    pub since: SystemTime,
}

/// What a Service's health check answers on this node now (see
/// [`ServiceHealthServers::answer`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheckAnswer {
    /// The `healthCheckNodePort`.
    pub port: u16,
    /// The HTTP status a probe gets (200: the node takes the traffic; 503: it has no local
    /// ready endpoint, or the proxy is not healthy); `None` when nothing answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The local ready endpoints it reports (`X-Load-Balancing-Endpoint-Weight`) on the
    /// addresses of the family asked about: that family's only.
    pub local_endpoints: u32,
    /// Why nothing answers, when the server could not start; with a `status`, where it could
    /// not start while it answers on the node's other addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_served: Option<String>,
    /// Connections its listeners refused or closed over a connection cap, when the last was
    /// within [`RECENT_REFUSALS`]: (since the check started, seconds since the last).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_connections: Option<(u64, u64)>,
}

/// How recent a refused connection must be for `kpng status` to show the check refusing.
pub const RECENT_REFUSALS: std::time::Duration = std::time::Duration::from_secs(300);

/// The health-check servers of this node.
pub struct ServiceHealthServers {
    shared: Shared,
    /// The one router of every listener ([`router`]).
    app: Router,
    running: HashMap<ServiceKey, Running>,
    /// Wanted checks whose server could not start: retried at every sync.
    not_started: BTreeMap<ServiceKey, NotStarted>,
    failures: Counter,
    /// How many wanted checks are not served now (`not_started`'s size), for alerts.
    not_served: Gauge,
    /// Where each new failure (a first one, or a new reason) is reported, for kube-proxy's
    /// `FailedToStartServiceHealthcheck` Event on the Service.
    failure_reports: Option<tokio::sync::mpsc::UnboundedSender<NotServed>>,
    /// The connection caps and timeouts of every server (each listener counts its own
    /// connections; the refusal log is shared, so a peer flooding every port is summarised
    /// once).
    guard: Guard,
}

/// The metric label and the log's name of these servers.
const SERVER: &str = "service_health_check";
const WHAT: &str = "Service health check";

impl ServiceHealthServers {
    /// Servers that report `health` as `serviceProxyHealthy`. `failures` counts servers that
    /// could not be started (port in use, address not available); `not_served` is how many
    /// wanted checks are not served now.
    pub fn new(
        health: Arc<ProxyHealth>,
        failures: Counter,
        not_served: Gauge,
    ) -> ServiceHealthServers {
        let shared = Shared {
            counts: Arc::new(RwLock::new(HashMap::new())),
            health,
        };
        ServiceHealthServers {
            app: router(shared.clone()),
            shared,
            running: HashMap::new(),
            not_started: BTreeMap::new(),
            failures,
            not_served,
            failure_reports: None,
            guard: Guard::new(
                SERVER,
                WHAT,
                ConnectionLimits::DEFAULT,
                RefusedConnections::default(),
            ),
        }
    }

    /// Serves within `limits` (per listener: each address and port), counting refused
    /// connections in `refused`. Without it: [`ConnectionLimits::DEFAULT`], uncounted.
    pub fn with_connection_limits(
        mut self,
        limits: ConnectionLimits,
        refused: RefusedConnections,
    ) -> ServiceHealthServers {
        self.guard = Guard::new(SERVER, WHAT, limits, refused);
        self
    }

    /// Reports each new failure to start a server (the ones logged as warnings) on the
    /// returned channel.
    pub fn report_failures(&mut self) -> tokio::sync::mpsc::UnboundedReceiver<NotServed> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.failure_reports = Some(tx);
        rx
    }

    /// The Services with a running server, and their ports.
    pub fn serving(&self) -> BTreeMap<ServiceKey, u16> {
        self.running
            .iter()
            .map(|(k, r)| (k.clone(), r.port))
            .collect()
    }

    /// What this node tells a load balancer probing `service`'s health check on an address of
    /// `family` now: the status code and the local endpoint count of that family its server
    /// answers with, or why it is not served: also when it listens on no address of `family`
    /// (the CIDRs of `--nodeport-addresses` match only another family's), where a probe is
    /// refused. `None` when the Service has no health check here.
    pub fn answer(&self, service: &ServiceKey, family: Family) -> Option<HealthCheckAnswer> {
        let failed = self.not_started.get(service);
        let Some(running) = self.running.get(service) else {
            return failed.map(|failed| HealthCheckAnswer {
                port: failed.check.port,
                status: None,
                local_endpoints: failed.check.local_endpoints.get(family),
                not_served: Some(failed.error.clone()),
                refused_connections: None,
            });
        };
        let refused_connections = running
            .refusals
            .recent(std::time::Instant::now(), RECENT_REFUSALS)
            .map(|(total, ago)| (total, ago.as_secs()));
        let local_endpoints = self.counts().get(service).map_or(0, |c| c.get(family));
        // Per family, as a load balancer probes one address: a dual-stack Service whose
        // CIDRs match only an IPv4 address of the node has no IPv6 listener, and a probe on
        // IPv6 is refused whatever the IPv4 listener answers.
        if !running.addresses.iter().any(|ip| Family::of(ip) == family) {
            let why = if running.addresses.is_empty() {
                NO_ADDRESS.to_string()
            } else {
                format!("no {family} address of the node is inside --nodeport-addresses")
            };
            return Some(HealthCheckAnswer {
                port: running.port,
                status: None,
                local_endpoints,
                not_served: Some(why),
                refused_connections,
            });
        }
        let healthy = self.shared.health.is_healthy(SystemTime::now());
        Some(HealthCheckAnswer {
            port: running.port,
            status: Some(answer_status(local_endpoints, healthy).as_u16()),
            local_endpoints,
            not_served: failed.map(|f| f.error.clone()),
            refused_connections,
        })
    }

    /// The families of the wanted checks (served or not): whether a family that listens
    /// nowhere leaves some check unserved.
    pub fn families_in_use(&self) -> ServiceFamilies {
        self.running
            .values()
            .map(|r| r.families)
            .chain(self.not_started.values().map(|n| n.check.families))
            .fold(ServiceFamilies::default(), ServiceFamilies::union)
    }

    /// The wanted checks that are not served, in Service order.
    pub fn not_served(&self) -> Vec<NotServed> {
        self.not_started
            .iter()
            .map(|(service, n)| n.not_served(service))
            .collect()
    }

    /// `service`'s check, when it is wanted and served on none of the node's addresses (a
    /// check served on some answers the load balancers that probe those).
    pub fn not_served_for(&self, service: &ServiceKey) -> Option<NotServed> {
        if let Some(running) = self.running.get(service) {
            return running.nowhere_since.map(|since| NotServed {
                service: service.clone(),
                port: running.port,
                error: NO_ADDRESS.to_string(),
                since,
            });
        }
        self.not_started.get(service).map(|n| n.not_served(service))
    }

    /// Opens, moves and closes servers so that exactly `wanted` are served on `addresses`
    /// (`0.0.0.0` and `[::]` for every address; none: listening nowhere, when no address of
    /// the node is inside `--nodeport-addresses`), each on those of its families, and updates
    /// the counts.
    pub async fn sync(&mut self, wanted: &BTreeMap<ServiceKey, HealthCheck>, addresses: &[IpAddr]) {
        let mut services: BTreeSet<ServiceKey> = self.running.keys().cloned().collect();
        services.extend(self.counts().keys().cloned());
        services.extend(wanted.keys().cloned());
        let changes = services
            .into_iter()
            .map(|k| {
                let check = wanted.get(&k).copied();
                (k, check)
            })
            .collect();
        self.update(changes, addresses).await;
    }

    /// Brings the given Services (and any whose server could not start before) to their
    /// wanted check on `addresses` (those of its families): `None` closes a Service's server.
    /// Other servers are left
    /// as they are, so a change to one Service costs one Service's work, not the cluster's.
    /// A server whose addresses changed (and whose port did not) keeps the ones still wanted.
    pub async fn update(
        &mut self,
        mut changes: BTreeMap<ServiceKey, Option<HealthCheck>>,
        addresses: &[IpAddr],
    ) {
        let failed_before = std::mem::take(&mut self.not_started);
        for (key, failed) in &failed_before {
            changes.entry(key.clone()).or_insert(Some(failed.check));
        }
        let mut addresses = addresses.to_vec();
        addresses.sort();
        addresses.dedup();
        // Every server that goes is closed before any opens: two Services that trade ports
        // (or an address and the wildcard that replaces it) both get theirs in the same sync.
        let mut to_start = Vec::new();
        // Servers closed and started by this update, for the log: at start-up, one line per
        // Service was 1,500 lines at 30k Services (a line each when few, `log_moves`).
        let mut closed = Vec::new();
        let mut started = Vec::new();
        for (key, check) in changes {
            self.set_count(&key, check);
            let same_port = match (self.running.get(&key), check) {
                (Some(r), Some(c)) => r.port == c.port,
                _ => false,
            };
            if same_port {
                // The node's addresses (or the Service's families) moved: the ones that went
                // close, the others keep serving (and their connections), the new ones are
                // bound below.
                let own = check.map_or_else(Vec::new, |c| c.families.select(&addresses));
                if let (Some(r), Some(c)) = (self.running.get_mut(&key), check) {
                    r.families = c.families;
                }
                if let Some(r) = self.running.get_mut(&key)
                    && r.addresses != own
                {
                    // (One line per Service: `ListenAddresses` logs the move once.)
                    debug!(
                        service = %key,
                        port = r.port,
                        "moving the health check to the node's addresses {own:?} (was {:?})",
                        r.addresses
                    );
                    r.move_to(&own).await;
                }
                // Served where it could be: the addresses it could not bind are tried again
                // without closing the others.
                if let Some(check) = check
                    && self
                        .running
                        .get(&key)
                        .is_some_and(|r| !r.unbound.is_empty())
                {
                    to_start.push((key, check));
                }
                continue;
            }
            if let Some(r) = self.running.remove(&key) {
                closed.push((key.clone(), r.port));
                r.close().await;
            }
            if let Some(check) = check {
                to_start.push((key, check));
            }
        }
        for (key, check) in to_start {
            // The same port failing again continues the earlier failure.
            let before = failed_before
                .get(&key)
                .filter(|f| f.check.port == check.port);
            let mut running = self.running.remove(&key).unwrap_or_else(|| {
                let own = check.families.select(&addresses);
                Running {
                    port: check.port,
                    families: check.families,
                    nowhere_since: own.is_empty().then(SystemTime::now),
                    unbound: own.clone(),
                    addresses: own,
                    tasks: Vec::new(),
                    refusals: RefusalTally::default(),
                }
            });
            let bound = self.bind_unbound(&key, &mut running);
            let nowhere = running.addresses.is_empty();
            if !running.tasks.is_empty() || nowhere {
                self.running.insert(key.clone(), running);
            }
            match bound {
                Ok(()) if nowhere => info!(
                    service = %key,
                    port = check.port,
                    "the health check listens on no address: {NO_ADDRESS}"
                ),
                Ok(()) => match before {
                    Some(f) => info!(
                        service = %key,
                        port = check.port,
                        "serving health check, after {} failed attempts",
                        f.attempts
                    ),
                    None => started.push((key.clone(), check.port)),
                },
                Err(error) => {
                    self.failures.inc();
                    // A first failure, or a new reason: logged and reported once.
                    let new_failure = before.is_none_or(|f| f.error != error);
                    if new_failure {
                        warn!(
                            service = %key,
                            port = check.port,
                            "cannot start the health check: {error}; retried at every sync, \
                             listed by `kpng status` until it starts"
                        );
                    } else {
                        debug!(service = %key, port = check.port, "health check still not served: {error}");
                    }
                    let failed = NotStarted {
                        check,
                        error,
                        since: before.map_or_else(SystemTime::now, |f| f.since),
                        attempts: before.map_or(1, |f| f.attempts + 1),
                    };
                    if new_failure && let Some(reports) = &self.failure_reports {
                        let _ = reports.send(failed.not_served(&key));
                    }
                    self.not_started.insert(key, failed);
                }
            }
        }
        log_moves("closing", &closed);
        log_moves("serving", &started);
        self.not_served
            .set(i64::try_from(self.not_started.len()).unwrap_or(i64::MAX));
    }

    /// The local endpoint count a Service's server answers with (`None`: no longer wanted).
    fn set_count(&self, key: &ServiceKey, check: Option<HealthCheck>) {
        let mut counts = self
            .shared
            .counts
            .write()
            .unwrap_or_else(|e| e.into_inner());
        match check {
            Some(c) => counts.insert(key.clone(), c.local_endpoints),
            None => counts.remove(key),
        };
    }

    /// The local endpoint counts the servers answer with.
    fn counts(&self) -> std::sync::RwLockReadGuard<'_, HashMap<ServiceKey, LocalEndpoints>> {
        self.shared.counts.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Serves `key`'s check on each of `running`'s addresses not bound yet, independently:
    /// one that fails leaves the others served. The error names every address still unbound
    /// (and, when some are served, where).
    fn bind_unbound(&self, key: &ServiceKey, running: &mut Running) -> Result<(), String> {
        let mut errors = Vec::new();
        for ip in std::mem::take(&mut running.unbound) {
            let addr = SocketAddr::new(ip, running.port);
            match bind(addr) {
                Ok(listener) => {
                    let app = self.app.clone();
                    let probed = Probed {
                        service: key.clone(),
                        family: Family::of(&ip),
                    };
                    let guard = self
                        .guard
                        .for_service(&key.to_string(), running.refusals.clone());
                    running.tasks.push((
                        ip,
                        tokio::spawn(async move {
                            let _ = crate::guarded_http::serve_tagged(
                                listener,
                                app,
                                guard,
                                OpenConnections::default(),
                                probed,
                            )
                            .await;
                        }),
                    ));
                }
                Err(e) => {
                    errors.push(format!("{addr}: {e}"));
                    running.unbound.push(ip);
                }
            }
        }
        if errors.is_empty() {
            return Ok(());
        }
        let mut error = errors.join("; ");
        if running.unbound.len() < running.addresses.len() {
            let served: Vec<String> = running
                .addresses
                .iter()
                .filter(|ip| !running.unbound.contains(ip))
                .map(|ip| SocketAddr::new(*ip, running.port).to_string())
                .collect();
            error.push_str(&format!(" (served on {})", served.join(", ")));
        }
        Err(error)
    }
}

/// Health checks one update started or closed, each named in an info line when at most this
/// many; otherwise one line counts them and names the first ones (each Service's line is at
/// debug level).
const NAMED_MOVES: usize = 3;

/// Logs the health-check servers one update `verb`ed ("serving", "closing"): one info line per
/// Service when at most [`NAMED_MOVES`], else one line with their count and the first names.
fn log_moves(verb: &str, moved: &[(ServiceKey, u16)]) {
    if moved.len() <= NAMED_MOVES {
        for (key, port) in moved {
            info!(service = %key, port = *port, "{verb} health check");
        }
        return;
    }
    for (key, port) in moved {
        debug!(service = %key, port = *port, "{verb} health check");
    }
    let first: Vec<String> = moved
        .iter()
        .take(NAMED_MOVES)
        .map(|(key, port)| format!("{key} :{port}"))
        .collect();
    info!(
        count = moved.len(),
        "{verb} {} health checks: {}, … (`--log-level debug` names each)",
        moved.len(),
        first.join(", ")
    );
}

/// Binds a listener; IPv6 wildcard sockets are v6-only so that `0.0.0.0` and `[::]` can both be
/// bound on the same port.
fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    if addr.is_ipv6() {
        socket2::SockRef::from(&socket).set_only_v6(true)?;
    }
    socket.bind(addr)?;
    socket.listen(128)
}

#[cfg(test)]
mod tests;
