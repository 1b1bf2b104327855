//! The UDP frontends kpng's own nftables table had when kpng started, read before its first
//! commit: the UDP conntrack cleanup trusts the last run's memory only for those.
//!
//! Why: the memory (`kpng_conntrack::memory`) says which frontends the last run had checked,
//! and a restart that adopts the table trusts it, since a frontend that kept its rule never
//! went un-DNATed. But the table is not only this build's: an earlier kpng build adopts it
//! too (a rollback, then the upgrade again), and a Service it deleted meanwhile had no rule
//! for a while, so its clients may hold never-DNATed entries while this build's memory still
//! lists it. A frontend still in the table's dispatch maps kept its rule (every kpng build
//! replaces the table in one transaction); one that is not is read whole.
//!
//! The read is one netlink dump per dispatch map and family (`service-ips`,
//! `service-nodeports`), on its own thread while kpng loads, and only when a memory file was
//! found (without one, every frontend is read whole anyway).

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};

use kpng_conntrack::Frontend;
use kpng_conntrack::memory::Checked;
use kpng_model::Family;
use kpng_netfilter::elements::Element;

/// UDP's protocol number, as an `inet_proto` key field holds it.
const IPPROTO_UDP: u8 = 17;

/// The Service IP:port of an `address . inet_proto . inet_service` key (each field padded to
/// 4 bytes) when its protocol is UDP.
pub fn udp_service_ip(key: &[u8], family: Family) -> Option<SocketAddr> {
    let addr_len = match family {
        Family::V4 => 4,
        Family::V6 => 16,
    };
    if key.len() != addr_len + 8 || key[addr_len] != IPPROTO_UDP {
        return None;
    }
    let addr = match family {
        Family::V4 => IpAddr::from(<[u8; 4]>::try_from(&key[..4]).ok()?),
        Family::V6 => IpAddr::from(<[u8; 16]>::try_from(&key[..16]).ok()?),
    };
    let port = u16::from_be_bytes([key[addr_len + 4], key[addr_len + 5]]);
    Some(SocketAddr::new(addr, port))
}

/// The node port of an `inet_proto . inet_service` key when its protocol is UDP.
fn udp_node_port(key: &[u8]) -> Option<u16> {
    (key.len() == 8 && key[0] == IPPROTO_UDP).then(|| u16::from_be_bytes([key[4], key[5]]))
}

/// The UDP frontends among the elements of one family's `service-ips` and
/// `service-nodeports` maps. Every element there dispatches to endpoints (a frontend without
/// endpoints is in the `no-endpoint-*` maps instead).
pub fn frontends(
    service_ips: &[Element],
    node_ports: &[Element],
    family: Family,
) -> HashSet<Frontend> {
    let ips = service_ips
        .iter()
        .filter_map(|e| udp_service_ip(&e.key, family))
        .map(Frontend::Ip);
    let ports = node_ports
        .iter()
        .filter_map(|e| udp_node_port(&e.key))
        .map(Frontend::NodePort);
    ips.chain(ports).collect()
}

/// Reads table `table`'s dispatch maps in both families. A family whose table or maps cannot
/// be read has no entry: none of its remembered frontends is trusted, which is always safe.
pub fn read_nft(table: &str) -> Checked {
    let mut found = Checked::new();
    for family in Family::ALL {
        let nft_family = match family {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        };
        let read = |map: &str| match kpng_netfilter::elements::set_elements(nft_family, table, map)
        {
            Ok(elements) => elements,
            Err(e) => {
                tracing::debug!("kpng's {nft_family} {map}: {e}");
                None
            }
        };
        if let (Some(ips), Some(ports)) = (read("service-ips"), read("service-nodeports")) {
            found.insert(family, frontends(&ips, &ports, family));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn element(key: Vec<u8>) -> Element {
        Element {
            key,
            ..Element::default()
        }
    }

    #[test]
    fn udp_frontends_are_read_from_both_dispatch_maps() {
        let v4 = |a: [u8; 4], proto: u8, port: u16| {
            let mut key = a.to_vec();
            key.extend([proto, 0, 0, 0]);
            key.extend(port.to_be_bytes());
            key.extend([0, 0]);
            element(key)
        };
        let node_port = |proto: u8, port: u16| {
            let mut key = vec![proto, 0, 0, 0];
            key.extend(port.to_be_bytes());
            key.extend([0, 0]);
            element(key)
        };
        let ips = [
            v4([10, 96, 0, 10], 17, 53),
            v4([10, 96, 0, 10], 6, 53),
            v4([10, 96, 0, 11], 17, 5353),
            element(vec![1, 2, 3]),
        ];
        let ports = [node_port(17, 30053), node_port(6, 30080)];
        let got = frontends(&ips, &ports, Family::V4);
        let want: HashSet<Frontend> = [
            Frontend::Ip("10.96.0.10:53".parse().expect("addr")),
            Frontend::Ip("10.96.0.11:5353".parse().expect("addr")),
            Frontend::NodePort(30053),
        ]
        .into();
        assert_eq!(got, want);
        // An IPv4 key read as IPv6 is nothing.
        assert!(frontends(&ips, &[], Family::V6).is_empty());
    }
}
