//! Which endpoint list a new connection of one Service port uses: the model's traffic policies
//! applied to a client.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ipnet::IpNet;
use kpng_model::{Endpoint, ServicePort};
use tokio::time::Instant;

use crate::balancer::Balancer;

/// Which way traffic entered a Service port: each has its own listener, because the two can
/// use different endpoint lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// To the ClusterIP: internalTrafficPolicy applies.
    Internal,
    /// To the node port, an external IP or a load-balancer IP: externalTrafficPolicy applies.
    External,
}

impl Scope {
    /// `internal` / `external`, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Internal => "internal",
            Scope::External => "external",
        }
    }
}

/// The endpoint selection of one Service port, shared by its listeners.
///
/// The cluster and local lists each have one [`Balancer`], shared by every way in that uses
/// the list, so ClientIP affinity holds whether a client comes through the ClusterIP or the node
/// port (as kube-proxy's one affinity id per endpoint list does).
#[derive(Debug, Default)]
pub struct Routing {
    cluster: Balancer,
    local: Balancer,
    internal_local: bool,
    external_local: bool,
}

/// Who a client is, as far as externalTrafficPolicy Local cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client {
    /// The client's address, as the proxy's socket sees it (never rewritten by the capture).
    pub ip: IpAddr,
    /// The client is this node or one of its pods: kube-proxy lets such traffic to external
    /// addresses use every endpoint even under externalTrafficPolicy Local.
    pub short_circuit: bool,
}

impl Routing {
    /// Applies a new state of the port. Both lists are always kept, so a policy change never
    /// loses affinity entries of the list that stays in use.
    pub fn update(&mut self, sp: &ServicePort) {
        let timeout = sp
            .session_affinity
            .map(|a| Duration::from_secs(u64::from(a.timeout_seconds)));
        self.cluster.update(addrs(&sp.cluster_endpoints), timeout);
        self.local.update(addrs(&sp.local_endpoints), timeout);
        self.internal_local = sp.internal_policy_local;
        self.external_local = sp.external_policy_local;
    }

    fn uses_local(&self, scope: Scope, client: &Client) -> bool {
        match scope {
            Scope::Internal => self.internal_local,
            Scope::External => self.external_local && !client.short_circuit,
        }
    }

    fn balancer(&mut self, scope: Scope, client: &Client) -> &mut Balancer {
        if self.uses_local(scope, client) {
            &mut self.local
        } else {
            &mut self.cluster
        }
    }

    /// How many endpoints a connection of `client` through `scope` may use: a failed connect
    /// is retried on the next one, at most this many times.
    pub fn candidates(&self, scope: Scope, client: &Client) -> usize {
        let b = if self.uses_local(scope, client) {
            &self.local
        } else {
            &self.cluster
        };
        b.endpoints().len()
    }

    /// The endpoint for a new connection or UDP session; `None`: nothing may serve it.
    pub fn pick(&mut self, scope: Scope, client: &Client, now: Instant) -> Option<SocketAddr> {
        let ip = client.ip;
        self.balancer(scope, client).pick(ip, now)
    }

    /// A connection to `endpoint` failed: forget the client's affinity to it.
    pub fn failed(&mut self, scope: Scope, client: &Client, endpoint: SocketAddr) {
        let ip = client.ip;
        self.balancer(scope, client).failed(ip, endpoint);
    }

    /// Whether `endpoint` may still serve traffic that entered through `scope` (UDP sessions
    /// to an endpoint that left are ended, as kube-proxy clears their conntrack entries).
    pub fn serves(&self, scope: Scope, endpoint: SocketAddr) -> bool {
        let in_list = |b: &Balancer| b.endpoints().contains(&endpoint);
        match scope {
            Scope::Internal if self.internal_local => in_list(&self.local),
            Scope::Internal => in_list(&self.cluster),
            // Short-circuited clients may use cluster endpoints under a Local policy.
            Scope::External if self.external_local => {
                in_list(&self.local) || in_list(&self.cluster)
            }
            Scope::External => in_list(&self.cluster),
        }
    }
}

fn addrs(endpoints: &[Endpoint]) -> Vec<SocketAddr> {
    endpoints.iter().map(Endpoint::addr).collect()
}

/// Sources that count as "this node or its pods" for externalTrafficPolicy Local.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalSources {
    /// The pod CIDRs (`--detect-local-mode ClusterCIDR` or `NodeCIDR`) and the node's own IPs.
    pub nets: Vec<IpNet>,
}

impl LocalSources {
    /// Whether `ip` is the node or one of its pods; loopback always is.
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_loopback() || self.nets.iter().any(|n| n.contains(&ip))
    }
}

#[cfg(test)]
mod tests;
