//! `loadBalancerSourceRanges` that name no range of a family the Service has load-balancer IPs
//! in. kube-proxy applies the ranges per family, so such a family's load-balancer IPs accept
//! every source (an IPv4 LoadBalancer with only `fd00::/8` is open to the world); kpng does
//! the same, for compatibility, but says so: in the log, in `kpng status NAME` and in `kpng
//! trace`, since elsewhere an invalid range never widens access.

use ipnet::IpNet;

use crate::event::{Kind, ObjectRef};
use crate::key::Family;
use crate::records::{ServiceInfo, Warning};

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
