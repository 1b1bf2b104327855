//! `loadBalancerSourceRanges` that name no range of a family the Service has load-balancer IPs
//! in. kube-proxy applies the ranges per family, so such a family's load-balancer IPs accept
//! every source (an IPv4 LoadBalancer with only `fd00::/8` is open to the world); kpng does
//! the same, for compatibility, but says so: in the log, in `kpng status NAME` and in `kpng
//! trace`, since elsewhere an invalid range never widens access.
//!
//! Also the one normalisation of the sources a port's load-balancer firewall lets in
//! ([`ServicePort::load_balancer_allowed_sources`]), which every backend with an interval set
//! of them uses: such a set refuses overlapping elements, so the list must hold none.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::event::{Kind, ObjectRef};
use crate::key::Family;
use crate::records::{ServiceInfo, Warning};
use crate::service_port::ServicePort;

impl ServicePort {
    /// The sources allowed to reach this port's load-balancer IPs, given the node's primary
    /// IPs `node_ips` ([`crate::NodeState::ips`]: one per family, as kube-proxy's `nodeIPs`,
    /// never every local address); empty when the port has no `loadBalancerSourceRanges`
    /// (every source is). The ranges, plus, when one of them holds the node IP of the port's
    /// family, the load-balancer IPs themselves (kube-proxy's exception, `cidr.Contains(nodeIP)`
    /// in its nftables and iptables proxiers: with the VIP routed locally, the node's own
    /// requests to it arrive with the VIP as source).
    ///
    /// Aggregated into the fewest disjoint prefixes: nftables interval sets refuse overlapping
    /// elements (`File exists`), so a range that already holds a load-balancer IP
    /// (`0.0.0.0/0`, or the node's subnet holding the ingress IP) or two overlapping ranges
    /// would make every transaction fail. The allowed addresses are the same either way.
    pub fn load_balancer_allowed_sources(&self, node_ips: &[IpAddr]) -> Vec<IpNet> {
        if self.source_ranges.is_empty() {
            return Vec::new();
        }
        let node_inside = node_ips
            .iter()
            .any(|ip| self.source_ranges.iter().any(|r| r.contains(ip)));
        let mut all = self.source_ranges.clone();
        if node_inside {
            all.extend(self.load_balancer_ips.iter().map(|ip| IpNet::from(*ip)));
        }
        IpNet::aggregate(&all)
    }
}

/// The Service's source ranges when it has some but none of `family` (the ones that then do
/// not restrict that family's load-balancer IPs); empty otherwise.
pub(crate) fn of_other_families_only(info: &ServiceInfo, family: Family) -> Vec<IpNet> {
    if info
        .source_ranges
        .iter()
        .any(|r| Family::of(&r.addr()) == family)
    {
        return Vec::new();
    }
    info.source_ranges.clone()
}

/// The warning for each family in which `info`'s load-balancer IPs are programmed (it has a
/// ClusterIP of it) but its source ranges name no range of it.
pub(crate) fn open_family_warnings(info: &ServiceInfo) -> Vec<Warning> {
    if info.source_ranges.is_empty() {
        return Vec::new();
    }
    [Family::V4, Family::V6]
        .into_iter()
        .filter_map(|family| {
            let in_family = |ip: &&std::net::IpAddr| Family::of(ip) == family;
            if !info.cluster_ips.iter().any(|ip| in_family(&ip)) {
                return None;
            }
            let lb: Vec<String> = info
                .load_balancer_ips
                .iter()
                .filter(in_family)
                .map(|ip| ip.to_string())
                .collect();
            let ranges = of_other_families_only(info, family);
            if lb.is_empty() || ranges.is_empty() {
                return None;
            }
            let ranges: Vec<String> = ranges.iter().map(|r| r.to_string()).collect();
            Some(Warning {
                object: ObjectRef {
                    kind: Kind::Service,
                    namespace: info.key.namespace.clone(),
                    name: info.key.name.clone(),
                },
                field: "spec.loadBalancerSourceRanges".to_string(),
                message: format!(
                    "no {family} range ({}): the {family} load-balancer IPs ({}) accept every \
                     source, as with kube-proxy, which applies the ranges per family; add {family} \
                     ranges to restrict them",
                    ranges.join(", "),
                    lb.join(", ")
                ),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{PortKey, Protocol, ServiceKey};

    fn port(ranges: &[&str], lbs: &[&str]) -> ServicePort {
        let lb: Vec<IpAddr> = lbs.iter().map(|s| s.parse().expect("ip")).collect();
        let family = Family::of(&lb[0]);
        let cluster_ip: IpAddr = match family {
            Family::V4 => "10.96.0.1".parse().expect("ip"),
            Family::V6 => "fd00:96::1".parse().expect("ip"),
        };
        ServicePort {
            load_balancer_ips: lb,
            source_ranges: ranges.iter().map(|s| s.parse().expect("cidr")).collect(),
            ..ServicePort::new(
                PortKey {
                    service: ServiceKey::new("ns", "lb"),
                    port_name: "a".into(),
                    protocol: Protocol::Tcp,
                    family,
                },
                cluster_ip,
                80,
            )
        }
    }

    /// Disjoint prefixes whatever the ranges and load-balancer IPs: a range holding a
    /// load-balancer IP, `/0`, overlapping ranges; the load-balancer IPs only when a range
    /// holds a node address.
    #[test]
    fn allowed_sources_are_disjoint_and_hold_the_load_balancer_ips_only_for_the_node() {
        let node = ["192.168.100.1", "fd00:100::1"].map(|s| s.parse().expect("ip"));
        for (what, ranges, lbs, want) in [
            (
                "node and LB IP in one range",
                &["192.168.100.0/24"][..],
                &["192.168.100.80"][..],
                &["192.168.100.0/24"][..],
            ),
            (
                "/0",
                &["0.0.0.0/0"],
                &["192.168.100.80", "203.0.113.7"],
                &["0.0.0.0/0"],
            ),
            (
                "node inside, LB IP outside",
                &["192.168.100.0/24"],
                &["203.0.113.7"],
                &["192.168.100.0/24", "203.0.113.7/32"],
            ),
            (
                "node outside: no LB IP",
                &["198.51.100.0/24"],
                &["198.51.100.7"],
                &["198.51.100.0/24"],
            ),
            (
                "overlapping and adjacent ranges",
                &["10.0.0.0/8", "10.1.0.0/16", "11.0.0.0/8"],
                &["203.0.113.7"],
                &["10.0.0.0/7"],
            ),
            ("IPv6 /0", &["::/0"], &["fd00:100::80"], &["::/0"]),
            (
                "IPv6 node and LB IP in one range",
                &["fd00:100::/64"],
                &["fd00:100::80", "2001:db8::8"],
                &["2001:db8::8/128", "fd00:100::/64"],
            ),
        ] {
            let got: Vec<String> = port(ranges, lbs)
                .load_balancer_allowed_sources(&node)
                .iter()
                .map(|n| n.to_string())
                .collect();
            assert_eq!(got, want, "{what}");
        }
        assert!(
            port(&[], &["192.168.100.80"])
                .load_balancer_allowed_sources(&node)
                .is_empty()
        );
    }
}
