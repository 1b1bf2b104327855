//! Frontends two Services cannot both own: an IP + port + protocol (a ClusterIP, an external
//! IP or a load-balancer ingress IP: one key space, as the backends' Service maps have one),
//! and a node port + protocol.
//!
//! The API server allocates ClusterIPs and node ports once, so two Services never share one in
//! a real cluster; they can in hand-written manifests or after a restore of old objects, and
//! external and load-balancer IPs are not allocated at all (two Services can name the same
//! one, or name another Service's ClusterIP). Both cannot be programmed (an nftables map takes
//! one verdict per key and refuses the transaction otherwise; taking one Service's endpoints
//! and another's firewall would let traffic through that neither allows), so the model picks
//! one deterministically, so that every attribute of the frontend comes from one Service, as
//! the API server would have:
//!
//! 1. a **ClusterIP** keeps its address + port + protocol against an external IP or a
//!    load-balancer ingress IP, whatever their ages: the API server hands a ClusterIP to one
//!    Service only, while any tenant allowed to create a Service can write another one's
//!    ClusterIP in `spec.externalIPs` (unless `DenyServiceExternalIPs` or an admission policy
//!    refuses it); letting the older Service win there let any existing Service take over
//!    every later ClusterIP (`kubernetes`'s 10.96.0.1:443 included);
//! 2. among claims of one rank (two ClusterIPs, or external / load-balancer IPs), the
//!    **oldest** Service keeps the frontend (`metadata.creationTimestamp`; a Service without
//!    one counts as the newest). Equal ages (hand-written manifests have no creation times) go
//!    to the Service the model had first, so that a Service added beside a working one never
//!    takes its frontend away; the Services of one list (a start, a relist) count as had at
//!    once, and are ordered by namespace/name, so that a restart decides the same way whatever
//!    the order of the input.
//!
//! The others lose it, with a warning naming both Services, the field and why the winner
//! keeps it; when the winner goes away, the next one takes it over.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::SystemTime;

use crate::event::{Kind, ObjectRef};
use crate::key::{Family, Protocol, ServiceKey};
use crate::records::{ServiceInfo, Warning};

/// A frontend only one Service may own, as the Service declares it (the field it comes from
/// words the warnings and `kpng status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Frontend {
    /// A ClusterIP, Service port and protocol.
    Cluster(IpAddr, u16, Protocol),
    /// An external IP (`spec.externalIPs`), Service port and protocol.
    External(IpAddr, u16, Protocol),
    /// A load-balancer ingress IP, Service port and protocol.
    LoadBalancer(IpAddr, u16, Protocol),
    /// A node port and protocol (on every node address).
    NodePort(u16, Protocol),
}

/// What two Services conflict over: the key of the backends' maps. A ClusterIP, an external
/// IP and a load-balancer IP with the same port and protocol are one key (one Service's
/// external IP can be another's load-balancer IP, or even its ClusterIP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ClaimKey {
    Ip(IpAddr, u16, Protocol),
    NodePort(u16, Protocol),
}

impl Frontend {
    /// Whether the API server allocated this frontend to one Service (a ClusterIP): such a
    /// claim outranks an external or load-balancer IP naming the same address.
    fn allocated(self) -> bool {
        matches!(self, Frontend::Cluster(..))
    }

    fn claim_key(self) -> ClaimKey {
        match self {
            Frontend::Cluster(ip, port, protocol)
            | Frontend::External(ip, port, protocol)
            | Frontend::LoadBalancer(ip, port, protocol) => ClaimKey::Ip(ip, port, protocol),
            Frontend::NodePort(port, protocol) => ClaimKey::NodePort(port, protocol),
        }
    }
}

/// A Service claiming a frontend, ordered ClusterIP first, then oldest first (the winner is
/// the first).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Claimant {
    /// `false` for a ClusterIP claim (allocated by the API server), `true` for an external or
    /// load-balancer IP claim: an allocated address always wins over a named one.
    unallocated: bool,
    /// `true` without a creation timestamp: such a Service counts as the newest.
    undated: bool,
    created: Option<SystemTime>,
    /// When the model first had the Service ([`Seen`]).
    seen: Seen,
    key: ServiceKey,
}

/// When the model first had a Service: a counter that moves on after every event but a list's
/// items, so the Services of one list share it and every later one is newer.
pub(crate) type Seen = u64;

impl Claimant {
    fn of(info: &ServiceInfo, frontend: Frontend, seen: Seen) -> Claimant {
        Claimant {
            unallocated: !frontend.allocated(),
            undated: info.created.is_none(),
            created: info.created,
            seen,
            key: info.key.clone(),
        }
    }
}

impl std::fmt::Display for Frontend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Frontend::Cluster(ip, port, protocol) => {
                write!(f, "ClusterIP {ip} port {port}/{protocol}")
            }
            Frontend::External(ip, port, protocol) => {
                write!(f, "external IP {ip} port {port}/{protocol}")
            }
            Frontend::LoadBalancer(ip, port, protocol) => {
                write!(f, "load-balancer IP {ip} port {port}/{protocol}")
            }
            Frontend::NodePort(port, protocol) => write!(f, "node port {port}/{protocol}"),
        }
    }
}

/// The frontends a Service lost to other Services: frontend → the Service that owns it.
pub(crate) type Lost = BTreeMap<Frontend, Owner>;

/// The Service that keeps a frontend another Service lost, and why it wins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owner {
    /// The Service that keeps the frontend.
    pub(crate) key: ServiceKey,
    /// Whether it keeps it as its ClusterIP against the loser's external or load-balancer IP
    /// (a ClusterIP always wins) rather than by age.
    pub(crate) as_cluster_ip: bool,
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.key.fmt(f)
    }
}

/// Every owned Service's frontends and who claims them.
///
/// Each frontend's claimants are a sorted `Vec`, not a `BTreeSet`: almost every frontend has
/// one claimant, and a one-element `BTreeSet` allocates a whole B-tree leaf (eleven slots,
/// hundreds of bytes) where a `Vec` allocates one slot. At 30k Services × 4 endpoints that
/// was 18 MB of the model (measured with `kpng-bench mem`, docs/benchmarks.md).
#[derive(Debug, Default)]
pub(crate) struct Claims {
    by_frontend: HashMap<ClaimKey, Vec<Claimant>>,
}

/// The frontends `info` claims, each with the field that declares it (for warnings). External
/// and load-balancer IPs count only in a family the Service has a ClusterIP of (the others are
/// never programmed, so they take nothing from another Service).
pub(crate) fn frontends(info: &ServiceInfo) -> Vec<(Frontend, String)> {
    let mut out = Vec::new();
    for (i, port) in info.ports.iter().enumerate() {
        for ip in &info.cluster_ips {
            out.push((
                Frontend::Cluster(*ip, port.port, port.protocol),
                format!("spec.ports[{i}].port"),
            ));
            let family = Family::of(ip);
            for external in info.external_ips.iter().filter(|e| Family::of(e) == family) {
                out.push((
                    Frontend::External(*external, port.port, port.protocol),
                    "spec.externalIPs".to_string(),
                ));
            }
            for lb in info
                .load_balancer_ips
                .iter()
                .filter(|e| Family::of(e) == family)
            {
                out.push((
                    Frontend::LoadBalancer(*lb, port.port, port.protocol),
                    "status.loadBalancer.ingress".to_string(),
                ));
            }
        }
        if let Some(np) = port.node_port {
            out.push((
                Frontend::NodePort(np, port.protocol),
                format!("spec.ports[{i}].nodePort"),
            ));
        }
    }
    // The health check node port comes from the same allocator (a TCP listener on every node).
    if let Some(hc) = info.health_check_node_port {
        out.push((
            Frontend::NodePort(hc, Protocol::Tcp),
            "spec.healthCheckNodePort".to_string(),
        ));
    }
    out
}

impl Claims {
    /// Replaces the claims of one Service (`old` → `new`, `None` = not claiming, e.g. deleted
    /// or not ours), first had by the model at `seen`, and returns every Service whose set of
    /// lost frontends may have changed: the claimants of each frontend involved.
    pub(crate) fn update(
        &mut self,
        old: Option<&ServiceInfo>,
        new: Option<&ServiceInfo>,
        seen: Seen,
    ) -> BTreeSet<ServiceKey> {
        let mut affected = BTreeSet::new();
        if let Some(old) = old {
            for (frontend, _) in frontends(old) {
                let claimant = Claimant::of(old, frontend, seen);
                let key = frontend.claim_key();
                if let Some(set) = self.by_frontend.get_mut(&key) {
                    if let Ok(at) = set.binary_search(&claimant) {
                        set.remove(at);
                    }
                    affected.extend(set.iter().map(|c| c.key.clone()));
                    if set.is_empty() {
                        self.by_frontend.remove(&key);
                    }
                }
            }
            affected.insert(old.key.clone());
        }
        if let Some(new) = new {
            for (frontend, _) in frontends(new) {
                let claimant = Claimant::of(new, frontend, seen);
                let set = self.by_frontend.entry(frontend.claim_key()).or_default();
                // Room for exactly the one claimant almost every frontend has (a first
                // `insert` makes room for four: 160 bytes more per frontend).
                if set.capacity() == 0 {
                    set.reserve_exact(1);
                }
                if let Err(at) = set.binary_search(&claimant) {
                    set.insert(at, claimant.clone());
                }
                affected.extend(set.iter().map(|c| c.key.clone()));
            }
            affected.insert(new.key.clone());
        }
        affected
    }

    /// The frontends of `info` that another Service owns (its ClusterIP, or an older
    /// Service's claim of the same rank), with that Service.
    pub(crate) fn lost(&self, info: &ServiceInfo) -> Lost {
        let mut lost = Lost::new();
        for (frontend, _) in frontends(info) {
            let winner = self
                .by_frontend
                .get(&frontend.claim_key())
                .and_then(|set| set.first())
                .filter(|winner| winner.key != info.key);
            if let Some(winner) = winner {
                lost.insert(
                    frontend,
                    Owner {
                        key: winner.key.clone(),
                        as_cluster_ip: !winner.unallocated && !frontend.allocated(),
                    },
                );
            }
        }
        lost
    }
}

/// The warnings for `info` losing `frontend` to `owner`, one per field that declares it; each
/// names both Services and the field, and says which keeps the frontend and why.
pub(crate) fn conflict_warnings(
    info: &ServiceInfo,
    frontend: Frontend,
    owner: &Owner,
) -> Vec<Warning> {
    frontends(info)
        .into_iter()
        .filter(|(f, _)| *f == frontend)
        .map(|(_, field)| conflict_warning(info, frontend, owner, field))
        .collect()
}

/// Why the owner keeps a frontend, in the words of a warning.
const OLDER: &str = "which is older (created earlier; without creation times, known to kpng first, then first by namespace/name) and keeps it";

fn conflict_warning(
    info: &ServiceInfo,
    frontend: Frontend,
    owner: &Owner,
    field: String,
) -> Warning {
    let what = if field == "spec.healthCheckNodePort" {
        "health check node port"
    } else {
        "node port"
    };
    let message = match frontend {
        Frontend::Cluster(ip, port, protocol) => format!(
            "ClusterIP {ip} port {port}/{protocol} is also Service {owner}'s, {OLDER}; this Service port is not programmed for {ip}"
        ),
        Frontend::External(ip, port, protocol) | Frontend::LoadBalancer(ip, port, protocol)
            if owner.as_cluster_ip =>
        {
            format!(
                "{ip} port {port}/{protocol} is also Service {owner}'s, as its ClusterIP, which keeps it whatever the Services' ages (the API server allocates a ClusterIP to one Service; an external or load-balancer IP naming it never takes it over); {ip} is not programmed for this Service port"
            )
        }
        Frontend::External(ip, port, protocol) | Frontend::LoadBalancer(ip, port, protocol) => {
            format!(
                "{ip} port {port}/{protocol} is also Service {owner}'s, {OLDER}, with its endpoints and source ranges; {ip} is not programmed for this Service port"
            )
        }
        Frontend::NodePort(port, protocol) => format!(
            "node port {port}/{protocol} is also Service {owner}'s, {OLDER}; the {what} is not programmed"
        ),
    };
    Warning {
        object: ObjectRef {
            kind: Kind::Service,
            namespace: info.key.namespace.clone(),
            name: info.key.name.clone(),
        },
        field,
        message,
    }
}
