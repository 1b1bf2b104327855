//! Which conntrack entries are stale: kube-proxy's rule, as a pure function of the model.
//!
//! For every UDP Service port that has serving endpoints, its frontends are its Service IPs
//! (ClusterIP, external IPs, load-balancer IPs) with its port, and its node port on any local
//! address. An entry whose original destination is such a frontend is stale when its reply
//! source (the endpoint the entry is pinned to after DNAT, or the frontend itself when the
//! packet was never DNATed) is not one of that port's serving endpoints (`IP:port`).
//!
//! Policies, topology hints, locality and terminating state are deliberately ignored, as
//! upstream does: a flow to a serving endpoint stays, whatever the rules now prefer, exactly
//! as a TCP connection would. A port without serving endpoints is left alone: its traffic is
//! rejected anyway, and its entries are checked again once endpoints come back.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};

use kpng_model::{Family, Protocol, ServicePort};

use crate::flow::{Flow, IPPROTO_UDP};
use crate::wire::DumpFilter;

/// Where a Service port receives UDP traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Frontend {
    /// A Service IP (ClusterIP, external IP, load-balancer IP) and the Service port.
    Ip(SocketAddr),
    /// A node port, on any of the node's addresses.
    NodePort(u16),
}

impl Frontend {
    /// The kernel-filtered dump that returns exactly this frontend's UDP entries (for a node
    /// port: to any address; [`StaleFilter::is_stale`] checks that it is the node's).
    pub fn dump(&self) -> DumpFilter {
        match self {
            Frontend::Ip(dst) => DumpFilter::UdpTo(*dst),
            Frontend::NodePort(port) => DumpFilter::UdpToPort(*port),
        }
    }
}

/// The frontends of the UDP Service ports of one family and the serving endpoints behind
/// each: decides whether an entry is stale.
#[derive(Debug, Clone)]
pub struct StaleFilter<'a> {
    family: Family,
    /// Service IP:port → the serving endpoints of every Service port using it (several only
    /// when two Services claim the same external IP and port; an entry is kept when any of
    /// them serves it).
    frontends: HashMap<SocketAddr, Vec<&'a [SocketAddr]>>,
    /// Node port → the serving endpoints behind it.
    node_ports: HashMap<u16, Vec<&'a [SocketAddr]>>,
    /// Addresses on which node ports are served (the node's own).
    local: HashSet<IpAddr>,
}

impl<'a> StaleFilter<'a> {
    /// The filter for the UDP ports among `ports` of `family`; `local_addresses` are the
    /// node's own addresses (node-port entries to other destinations are not ours).
    pub fn new(
        family: Family,
        ports: impl IntoIterator<Item = &'a ServicePort>,
        local_addresses: &[IpAddr],
    ) -> StaleFilter<'a> {
        let mut filter = StaleFilter {
            family,
            frontends: HashMap::new(),
            node_ports: HashMap::new(),
            local: local_addresses
                .iter()
                .copied()
                .filter(|ip| Family::of(ip) == family)
                .collect(),
        };
        for port in ports {
            if port.key.protocol != Protocol::Udp
                || port.key.family != family
                || port.serving_endpoints.is_empty()
            {
                continue;
            }
            let serving = port.serving_endpoints.as_slice();
            let ips = std::iter::once(&port.cluster_ip)
                .chain(&port.external_ips)
                .chain(&port.load_balancer_ips);
            for ip in ips {
                filter
                    .frontends
                    .entry(SocketAddr::new(*ip, port.port))
                    .or_default()
                    .push(serving);
            }
            if let Some(node_port) = port.node_port {
                filter
                    .node_ports
                    .entry(node_port)
                    .or_default()
                    .push(serving);
            }
        }
        filter
    }

    /// True when no entry can be stale (no UDP port with serving endpoints): no dump needed.
    pub fn is_empty(&self) -> bool {
        self.frontends.is_empty() && self.node_ports.is_empty()
    }

    /// Number of frontends (Service IP:port pairs plus node ports).
    pub fn frontend_count(&self) -> usize {
        self.frontends.len() + self.node_ports.len()
    }

    /// Whether `flow` is a UDP entry of one of our frontends that is not pinned to one of
    /// its serving endpoints.
    pub fn is_stale(&self, flow: &Flow) -> bool {
        if flow.protocol != IPPROTO_UDP || flow.family() != self.family {
            return false;
        }
        let served_by = |sets: &Vec<&[SocketAddr]>| {
            sets.iter()
                .any(|serving| serving.binary_search(&flow.reply.src).is_ok())
        };
        let dst = flow.original.dst;
        if let Some(sets) = self.frontends.get(&dst) {
            return !served_by(sets);
        }
        match self.node_ports.get(&dst.port()) {
            Some(sets) if self.local.contains(&dst.ip()) => !served_by(sets),
            _ => false,
        }
    }

    /// Every frontend, in order.
    pub fn frontends(&self) -> Vec<Frontend> {
        let mut out: Vec<Frontend> = self
            .frontends
            .keys()
            .map(|dst| Frontend::Ip(*dst))
            .chain(self.node_ports.keys().map(|p| Frontend::NodePort(*p)))
            .collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests;
