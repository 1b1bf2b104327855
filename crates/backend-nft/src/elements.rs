//! One Service port → the set and map elements that implement it.
//!
//! This is a pure function of the port (and the node's IPs, for the load-balancer firewall
//! exception). Every verdict it writes points at a constant chain or at a per-endpoint-count
//! chain from [`crate::ruleset::DynamicChain`].

use std::net::IpAddr;

use ipnet::IpNet;
use kpng_model::{Endpoint, ServicePort};

use crate::ruleset::PickKind;
use crate::store::{Element, OwnerId};

/// Affinity ids live in this range of the conntrack mark (`0x6b7` = "kp" in the top 12 bits), so
/// they are unlikely to collide with marks other software sets.
const AFFINITY_ID_BASE: u32 = 0x6b70_0000;

/// The conntrack-mark id of one Service port's cluster (`local: false`) or local endpoint list:
/// ClientIP affinity is remembered per client and per id, so it holds whichever VIP or node
/// port the client used.
pub fn affinity_id(owner: OwnerId, local: bool) -> u32 {
    AFFINITY_ID_BASE | (((owner & 0x7_ffff) << 1) | u32::from(local))
}

fn el(set: &'static str, key: String, value: Option<String>) -> Element {
    Element {
        set,
        key,
        value,
        comment: None,
    }
}

/// nft refuses element comments over 128 bytes (a long `namespace/name:port` can exceed it).
const MAX_COMMENT: usize = 127;

fn commented(set: &'static str, key: String, value: String, comment: &str) -> Element {
    let mut end = comment.len().min(MAX_COMMENT);
    while !comment.is_char_boundary(end) {
        end -= 1;
    }
    Element {
        set,
        key,
        value: Some(value),
        comment: Some(comment[..end].to_string()),
    }
}

fn ep_value(e: &Endpoint) -> String {
    format!("{} . {}", e.ip, e.port)
}

/// One way into a Service port: a VIP (`ip . proto . port`) or the node port (`proto . port`).
struct Entry {
    /// The key of its pick and affinity-id elements.
    key: String,
    /// What its slot keys start with (`ip . port` or `nodePort`).
    slot_prefix: String,
    /// Whether this is the node port.
    node_port: bool,
    /// Whether it needs a pick-map element (entry chains go through the pick map).
    pick: bool,
}

impl Entry {
    /// The pick element, endpoint slots and affinity id of one endpoint list.
    fn list_elements(
        &self,
        out: &mut Vec<Element>,
        eps: &[Endpoint],
        local: bool,
        protocol: kpng_model::Protocol,
        affinity_ids: Option<(u32, u32)>,
    ) {
        if eps.is_empty() {
            return;
        }
        let kind = PickKind::of(self.node_port, local);
        if self.pick {
            out.push(el(
                kind.pick_map(),
                self.key.clone(),
                Some(format!("goto {}", kind.chain(eps.len()))),
            ));
        }
        let map = kind.slot_map(protocol);
        for (slot, e) in eps.iter().enumerate() {
            out.push(el(
                map,
                format!("{} . {slot}", self.slot_prefix),
                Some(ep_value(e)),
            ));
        }
        if let Some((cluster, local_id)) = affinity_ids {
            let id = if local { local_id } else { cluster };
            out.push(el(
                kind.affinity_ids_map(),
                self.key.clone(),
                Some(format!("{id:#x}")),
            ));
        }
    }
}

/// Builds every element of one Service port. `node_ips` are the node's own addresses: a
/// load-balancer source range that contains one lets traffic from the LB IPs themselves in, as
/// kube-proxy does.
pub fn port_elements(sp: &ServicePort, owner: OwnerId, node_ips: &[IpAddr]) -> Vec<Element> {
    let mut out = Vec::new();
    let proto = sp.key.protocol.lower();
    let vip_key = |ip: &IpAddr| format!("{ip} . {proto} . {}", sp.port);
    let comment = format!("{}:{}", sp.key.service, sp.key.port_name);
    let affinity = sp.session_affinity.is_some();
    let reject_or_drop = if sp.has_any_endpoints {
        "drop"
    } else {
        "goto reject-chain"
    };
    let (id_cluster, id_local) = (affinity_id(owner, false), affinity_id(owner, true));
    let lists: [(&[Endpoint], bool); 2] =
        [(&sp.cluster_endpoints, false), (&sp.local_endpoints, true)];

    out.push(el("cluster-ips", sp.cluster_ip.to_string(), None));

    // ClusterIP traffic.
    let internal = sp.internal_endpoints();
    let cip = vip_key(&sp.cluster_ip);
    let internal_list = if sp.internal_policy_local {
        "local"
    } else {
        "cluster"
    };
    if internal.is_empty() {
        let verdict = if sp.internal_policy_local && sp.has_any_endpoints {
            "drop"
        } else {
            "goto reject-chain"
        };
        out.push(el(
            "no-endpoint-services",
            cip.clone(),
            Some(verdict.into()),
        ));
    } else if affinity {
        out.push(commented(
            "service-ips",
            cip.clone(),
            format!("goto affinity-{internal_list}"),
            &comment,
        ));
    } else {
        let chain = format!("{internal_list}-n{}", internal.len());
        out.push(commented(
            "service-ips",
            cip.clone(),
            format!("goto {chain}"),
            &comment,
        ));
    }

    // External IPs and load-balancer IPs.
    let external_vips: Vec<&IpAddr> = sp
        .external_ips
        .iter()
        .chain(sp.load_balancer_ips.iter())
        .collect();
    let external_chain = match (sp.external_policy_local, affinity) {
        (false, false) => "external-cluster",
        (true, false) => "external-local",
        (false, true) => "external-cluster-affinity",
        (true, true) => "external-local-affinity",
    };
    for vip in &external_vips {
        let key = vip_key(vip);
        if sp.has_any_endpoints {
            out.push(commented(
                "service-ips",
                key.clone(),
                format!("goto {external_chain}"),
                &comment,
            ));
        }
        if sp.external_endpoints().is_empty() {
            out.push(el("no-endpoint-services", key, Some(reject_or_drop.into())));
        }
    }

    // Endpoint slots and pick maps, for every VIP that reaches them.
    let mut vips: Vec<&IpAddr> = vec![&sp.cluster_ip];
    vips.extend(external_vips.iter().copied());
    for (i, vip) in vips.iter().enumerate() {
        // A plain ClusterIP jumps straight to its n-chain; pick maps serve the entry chains.
        let pick = i > 0 || affinity;
        let entry = Entry {
            key: vip_key(vip),
            slot_prefix: format!("{vip} . {}", sp.port),
            node_port: false,
            pick,
        };
        for (eps, local) in lists {
            entry.list_elements(
                &mut out,
                eps,
                local,
                sp.key.protocol,
                affinity.then_some((id_cluster, id_local)),
            );
        }
    }

    // Node port.
    if let Some(node_port) = sp.node_port {
        let key = format!("{proto} . {node_port}");
        if sp.has_any_endpoints {
            out.push(commented(
                "service-nodeports",
                key.clone(),
                format!("goto nodeport-{external_chain}"),
                &comment,
            ));
        }
        if sp.external_endpoints().is_empty() {
            out.push(el(
                "no-endpoint-nodeports",
                key.clone(),
                Some(reject_or_drop.into()),
            ));
        }
        let entry = Entry {
            key,
            slot_prefix: node_port.to_string(),
            node_port: true,
            pick: true,
        };
        for (eps, local) in lists {
            entry.list_elements(
                &mut out,
                eps,
                local,
                sp.key.protocol,
                affinity.then_some((id_cluster, id_local)),
            );
        }
    }

    // Affinity bookkeeping: which endpoints an id may stick to, and its recording chain.
    if let Some(a) = sp.session_affinity {
        for (eps, local) in lists {
            if eps.is_empty() {
                continue;
            }
            let id = if local { id_local } else { id_cluster };
            out.push(el(
                "affinity-timeouts",
                format!("{id:#x}"),
                Some(format!("goto affinity-t{}", a.timeout_seconds)),
            ));
            for e in eps {
                out.push(el(
                    "affinity-valid",
                    format!("{id:#x} . {} . {}", e.ip, e.port),
                    None,
                ));
            }
        }
    }

    // loadBalancerSourceRanges: only load-balancer IPs are filtered, from every source.
    if !sp.source_ranges.is_empty() {
        let ranges = IpNet::aggregate(&sp.source_ranges);
        let node_inside = node_ips
            .iter()
            .any(|ip| ranges.iter().any(|r| r.contains(ip)));
        for vip in &sp.load_balancer_ips {
            let key = vip_key(vip);
            out.push(el("firewall-ips", key.clone(), None));
            for r in &ranges {
                out.push(el("firewall-allow", format!("{key} . {r}"), None));
            }
            if node_inside {
                for lb in &sp.load_balancer_ips {
                    out.push(el("firewall-allow", format!("{key} . {lb}"), None));
                }
            }
        }
    }

    // Hairpin: a local endpoint reaching itself through the Service is masqueraded.
    for e in sp.all_reachable_endpoints().iter().filter(|e| e.is_local) {
        out.push(el(
            "hairpin-connections",
            format!("{} . {} . {proto} . {}", e.ip, e.ip, e.port),
            None,
        ));
    }
    out
}
