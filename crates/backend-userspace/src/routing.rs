//! Which endpoint list a new connection of one Service port uses: the model's traffic policies
//! applied to a client.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use kpng_model::{Endpoint, ServicePort};
use tokio::time::Instant;

use crate::balancer::Balancer;

/// Which way traffic entered a Service port. Each has its own listener, because each can use
/// a different endpoint list; the capture decides which listener a packet reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// To the ClusterIP: internalTrafficPolicy applies.
    Internal,
    /// To the node port, an external IP or a load-balancer IP: externalTrafficPolicy applies.
    External,
    /// To an external address of an externalTrafficPolicy Local port, from this node or one of
    /// its pods: kube-proxy lets such traffic use every (cluster) endpoint.
    ShortCircuit,
}

impl Scope {
    /// `internal` / `external` / `short-circuit`, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Internal => "internal",
            Scope::External => "external",
            Scope::ShortCircuit => "short-circuit",
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

    fn uses_local(&self, scope: Scope) -> bool {
        match scope {
            Scope::Internal => self.internal_local,
            Scope::External => self.external_local,
            Scope::ShortCircuit => false,
        }
    }

    fn balancer(&mut self, scope: Scope) -> &mut Balancer {
        if self.uses_local(scope) {
            &mut self.local
        } else {
            &mut self.cluster
        }
    }

    fn list(&self, scope: Scope) -> &[SocketAddr] {
        if self.uses_local(scope) {
            self.local.endpoints()
        } else {
            self.cluster.endpoints()
        }
    }

    /// How many endpoints a connection through `scope` may use: a failed connect is retried
    /// on the next one, at most this many times.
    pub fn candidates(&self, scope: Scope) -> usize {
        self.list(scope).len()
    }

    /// The endpoint for a new connection or UDP session of `client`; `None`: nothing may
    /// serve it.
    pub fn pick(&mut self, scope: Scope, client: IpAddr, now: Instant) -> Option<SocketAddr> {
        self.balancer(scope).pick(client, now)
    }

    /// A connection of `client` to `endpoint` failed: forget the client's affinity to it.
    pub fn failed(&mut self, scope: Scope, client: IpAddr, endpoint: SocketAddr) {
        self.balancer(scope).failed(client, endpoint);
    }

    /// The endpoints a new connection of `client` through `scope` may go to: its sticky
    /// endpoint alone while it has one, else the whole list.
    #[cfg(test)]
    pub fn endpoints(&self, scope: Scope, client: IpAddr, now: Instant) -> Vec<SocketAddr> {
        let balancer = if self.uses_local(scope) {
            &self.local
        } else {
            &self.cluster
        };
        match balancer.sticky(client, now) {
            Some(endpoint) => vec![endpoint],
            None => self.list(scope).to_vec(),
        }
    }

    /// Whether `endpoint` may still serve traffic that entered through `scope` (UDP sessions
    /// to an endpoint that left are ended, as kube-proxy clears their conntrack entries).
    pub fn serves(&self, scope: Scope, endpoint: SocketAddr) -> bool {
        self.list(scope).contains(&endpoint)
    }
}

fn addrs(endpoints: &[Endpoint]) -> Vec<SocketAddr> {
    endpoints.iter().map(Endpoint::addr).collect()
}

#[cfg(test)]
mod tests;
