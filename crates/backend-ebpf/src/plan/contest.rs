//! Which Service port owns a `kpng_frontends` key that several want.
//!
//! The map is keyed by address, port and protocol, and a node port is served on every node
//! address: Service A's external IP (or load-balancer IP, or ClusterIP) `X:P` and Service B's
//! node port `P` on a node address `X` are one key. The model's claims already settle every
//! other conflict between Services (one owner per IP port, one per node port: the oldest
//! Service); this one crosses the two kinds, so it is left to the backends, and kube-proxy's
//! nftables `services` chain settles it by order: the `service-ips` map (ClusterIPs, external
//! and load-balancer IPs) is matched before the node-port dispatch. So here: a Service-IP
//! frontend wins over a node port; between two of one kind (only ports of one Service can be
//! left there, the model's claims separate different Services) the lower port key wins.
//!
//! A key can be contested only on a node-port address, so only those are indexed: the holders
//! of each node port, and the Service IPs that are node addresses (rare). The winner is the
//! one that *declares* the frontend, whether or not it programs it: an external IP that the
//! programs leave to the nftables rules (a load-balancer IP with source ranges, a list empty
//! under a Local policy) leaves the key to the rules, which pick that Service as nftables does.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

use kpng_model::{Family, PortKey, ServicePort};

use crate::layout;
use crate::plan::Group;

/// How a port declares a frontend, in precedence order (the first wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// A ClusterIP, external IP or load-balancer IP: nftables' `service-ips` map.
    ServiceIp,
    /// A node port on a node address: the node-port dispatch, matched after.
    NodePort,
}

/// The frontends on node-port addresses and who declares them: enough to find every rival of
/// a port in O(its frontends), without an index of every key.
#[derive(Debug, Default)]
pub struct Contest {
    /// Node port (family, IP protocol, port) → the ports declaring it (almost always one).
    node_ports: HashMap<(Family, u8, u16), Vec<PortKey>>,
    /// A Service IP that is a node-port address (address, port, IP protocol) → the ports
    /// declaring it.
    node_vips: HashMap<(IpAddr, u16, u8), Vec<PortKey>>,
}

/// The node-port addresses of `port`'s family that serve node ports (loopback excepted, as
/// [`crate::plan::groups`] does).
fn serving(node_ips: &[IpAddr]) -> impl Iterator<Item = &IpAddr> {
    node_ips.iter().filter(|ip| !ip.is_loopback())
}

/// The Service IPs `port` declares (ClusterIP, external and load-balancer IPs).
fn service_ips(port: &ServicePort) -> impl Iterator<Item = &IpAddr> {
    std::iter::once(&port.cluster_ip)
        .chain(&port.external_ips)
        .chain(&port.load_balancer_ips)
}

fn insert(set: &mut Vec<PortKey>, key: &PortKey) {
    if let Err(at) = set.binary_search(key) {
        if set.capacity() == 0 {
            set.reserve_exact(1);
        }
        set.insert(at, key.clone());
    }
}

impl Contest {
    /// Forgets everything (a full sync declares every port again).
    pub fn clear(&mut self) {
        *self = Contest::default();
    }

    /// Records the frontends `port` declares on the node-port addresses `node_ips` (of its
    /// family).
    pub fn declare(&mut self, port: &ServicePort, node_ips: &[IpAddr]) {
        let Some(proto) = layout::ip_proto(port.key.protocol) else {
            return;
        };
        if let Some(np) = port.node_port {
            let set = self
                .node_ports
                .entry((port.key.family, proto, np))
                .or_default();
            insert(set, &port.key);
        }
        for ip in service_ips(port) {
            if serving(node_ips).any(|n| n == ip) {
                let set = self.node_vips.entry((*ip, port.port, proto)).or_default();
                insert(set, &port.key);
            }
        }
    }

    /// Forgets what [`Contest::declare`] recorded for `port` (as it was declared).
    pub fn withdraw(&mut self, port: &ServicePort) {
        let Some(proto) = layout::ip_proto(port.key.protocol) else {
            return;
        };
        let remove = |set: &mut Vec<PortKey>| {
            if let Ok(at) = set.binary_search(&port.key) {
                set.remove(at);
            }
            !set.is_empty()
        };
        if let Some(np) = port.node_port {
            let k = (port.key.family, proto, np);
            if let Some(set) = self.node_ports.get_mut(&k)
                && !remove(set)
            {
                self.node_ports.remove(&k);
            }
        }
        for ip in service_ips(port) {
            let k = (*ip, port.port, proto);
            if let Some(set) = self.node_vips.get_mut(&k)
                && !remove(set)
            {
                self.node_vips.remove(&k);
            }
        }
    }

    /// Every port that declares `(ip, port)` of IP protocol `proto` in `family`, with how,
    /// when `ip` is a node-port address (elsewhere a key is never contested).
    fn contenders<'a>(
        &'a self,
        family: Family,
        proto: u8,
        ip: IpAddr,
        port: u16,
        node_ips: &[IpAddr],
    ) -> impl Iterator<Item = (Kind, &'a PortKey)> + 'a {
        let on_node = serving(node_ips).any(|n| *n == ip);
        let vips = on_node
            .then(|| self.node_vips.get(&(ip, port, proto)))
            .flatten();
        let node_ports = on_node
            .then(|| self.node_ports.get(&(family, proto, port)))
            .flatten();
        let vips = vips.into_iter().flatten().map(|k| (Kind::ServiceIp, k));
        let node_ports = node_ports
            .into_iter()
            .flatten()
            .map(|k| (Kind::NodePort, k));
        vips.chain(node_ports)
    }

    /// The port that owns `(ip, port)` of `proto` in `family`, if the key is contested.
    fn winner(
        &self,
        family: Family,
        proto: u8,
        ip: IpAddr,
        port: u16,
        node_ips: &[IpAddr],
    ) -> Option<&PortKey> {
        let mut all = self.contenders(family, proto, ip, port, node_ips);
        let first = all.next()?;
        let mut contested = false;
        let best = all.fold(first, |best, c| {
            contested |= c.1 != first.1;
            best.min(c)
        });
        contested.then_some(best.1)
    }

    /// Removes from `groups` (those of `port`) the frontends another port owns, and the groups
    /// left without a frontend.
    pub fn keep_won(&self, port: &ServicePort, node_ips: &[IpAddr], groups: &mut Vec<Group>) {
        let Some(proto) = layout::ip_proto(port.key.protocol) else {
            return;
        };
        let family = port.key.family;
        for g in groups.iter_mut() {
            g.frontends.retain(|(ip, p)| {
                self.winner(family, proto, *ip, *p, node_ips)
                    .is_none_or(|w| *w == port.key)
            });
        }
        groups.retain(|g| !g.frontends.is_empty());
    }

    /// Adds to `out` the other ports that declare one of the frontends `port` declares (on
    /// node-port addresses): whose share of a key may change when `port` does.
    pub fn rivals(&self, port: &ServicePort, node_ips: &[IpAddr], out: &mut BTreeSet<PortKey>) {
        let Some(proto) = layout::ip_proto(port.key.protocol) else {
            return;
        };
        let family = port.key.family;
        let mut add = |ip: IpAddr, p: u16| {
            for (_, k) in self.contenders(family, proto, ip, p, node_ips) {
                if *k != port.key {
                    out.insert(k.clone());
                }
            }
        };
        if let Some(np) = port.node_port {
            for ip in serving(node_ips) {
                add(*ip, np);
            }
        }
        for ip in service_ips(port) {
            add(*ip, port.port);
        }
    }
}
