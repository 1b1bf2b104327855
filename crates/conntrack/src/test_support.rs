//! Builders shared by the unit tests.

use std::net::{IpAddr, SocketAddr};

use kpng_model::{Family, PortKey, Protocol, ServiceKey, ServicePort};

use crate::flow::{Flow, Tuple};

pub(crate) fn sa(s: &str) -> SocketAddr {
    s.parse().expect("socket address")
}

pub(crate) fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

/// A UDP Service port `name` on `vip:port` with these serving endpoints.
pub(crate) fn udp_port(name: &str, vip: &str, port: u16, serving: &[&str]) -> ServicePort {
    let cluster_ip = ip(vip);
    let mut serving: Vec<SocketAddr> = serving.iter().map(|s| sa(s)).collect();
    serving.sort();
    ServicePort {
        has_any_endpoints: !serving.is_empty(),
        cluster_endpoints: serving.iter().map(|a| ready(*a)).collect(),
        serving_endpoints: serving,
        ..ServicePort::new(
            PortKey {
                service: ServiceKey::new("ns", name),
                port_name: "dns".into(),
                protocol: Protocol::Udp,
                family: Family::of(&cluster_ip),
            },
            cluster_ip,
            port,
        )
    }
}

/// A ready endpoint at `addr`, on another node.
pub(crate) fn ready(addr: SocketAddr) -> kpng_model::Endpoint {
    kpng_model::Endpoint {
        ip: addr.ip(),
        port: addr.port(),
        is_local: false,
        ready: true,
        serving: true,
        terminating: false,
    }
}

/// A UDP flow `client → dst` whose reply comes from `reply_src` (DNATed when that differs).
pub(crate) fn flow(client: &str, dst: &str, reply_src: &str) -> Flow {
    Flow::udp(
        Tuple::new(sa(client), sa(dst)),
        Tuple::new(sa(reply_src), sa(client)),
    )
}
