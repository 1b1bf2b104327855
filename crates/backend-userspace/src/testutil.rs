//! Service ports for unit tests, built by hand.

use std::net::IpAddr;

use kpng_model::{Endpoint, Family, PortKey, Protocol, ServiceKey, ServicePort};

/// A ready endpoint `ip:8080`.
pub fn endpoint(ip: &str, local: bool) -> Endpoint {
    Endpoint {
        ip: ip.parse().expect("endpoint ip"),
        port: 8080,
        is_local: local,
        ready: true,
        serving: true,
        terminating: false,
    }
}

/// A ClusterIP Service port `default/NAME` on `CLUSTER_IP:80` with these cluster endpoints
/// (the local list holds the local ones), cluster policies, no affinity.
pub fn service_port(
    name: &str,
    protocol: Protocol,
    cluster_ip: &str,
    eps: &[Endpoint],
) -> ServicePort {
    let cluster_ip: IpAddr = cluster_ip.parse().expect("cluster ip");
    ServicePort {
        key: PortKey {
            service: ServiceKey::new("default", name),
            port_name: "".into(),
            protocol,
            family: Family::of(&cluster_ip),
        },
        cluster_ip,
        port: 80,
        node_port: None,
        target_port: kpng_model::TargetPort::Number(80),
        external_ips: Vec::new(),
        load_balancer_ips: Vec::new(),
        source_ranges: Vec::new(),
        session_affinity: None,
        external_policy_local: false,
        internal_policy_local: false,
        health_check_node_port: None,
        preserve_destination: false,
        cluster_endpoints: eps.to_vec(),
        local_endpoints: eps.iter().filter(|e| e.is_local).cloned().collect(),
        has_any_endpoints: !eps.is_empty(),
        local_ready_endpoints: eps.iter().filter(|e| e.is_local).count() as u32,
        serving_endpoints: eps.iter().map(Endpoint::addr).collect(),
    }
}
