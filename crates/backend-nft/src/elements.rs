//! One Service port → the set and map elements that implement it.
//!
//! This is a pure function of the port (and the node's IPs, for the load-balancer firewall
//! exception). Every verdict it writes points at a constant chain or at a per-endpoint-count
//! chain from [`crate::ruleset::DynamicChain`].

use std::net::IpAddr;
use std::sync::Arc;

use kpng_model::{Endpoint, ServicePort};

use crate::affinity::{self, Marks};
use crate::ruleset::{DynamicChain, PickKind};
use crate::sets::Set;
use crate::store::Element;
use crate::value::{Chain, FixedChain, Key, Source, Value, Verdict};

fn el(set: Set, key: Key, value: Option<Value>) -> Element {
    Element {
        set,
        key,
        value,
        comment: None,
    }
}

/// nft refuses element comments over 128 bytes (a long `namespace/name:port` can exceed it).
const MAX_COMMENT: usize = 127;

/// The comment of a port's dispatch elements, cut to what nft accepts; one allocation per
/// port, shared by its elements.
///
/// The text is `ns/name:port`, names the conversion checks (`kpng_k8s::validate`); as
/// defence in depth a control character is replaced by `_` and a `"` by `'` (what the nft
/// script writer does), so that the netlink and the script paths store the same comment and
/// `nft list` never shows a line a name forged.
fn port_comment(comment: &str) -> Arc<str> {
    let cleaned: String;
    let mut comment = comment;
    if comment.contains(|c: char| c.is_control() || c == '"') {
        cleaned = comment
            .chars()
            .map(|c| match c {
                '"' => '\'',
                c if c.is_control() => '_',
                c => c,
            })
            .collect();
        comment = &cleaned;
    }
    if comment.len() <= MAX_COMMENT {
        return Arc::from(comment);
    }
    Arc::from(shortened(comment).as_str())
}

/// `ns/name:port` over [`MAX_COMMENT`] bytes, shortened in the middle of `ns/name` (its
/// start and end kept around a `…`) and never in `:port`: two ports of a Service whose
/// namespace and name are long (63 bytes each) keep comments telling them apart. Cutting
/// the end, as until 2026-12-07, gave both the same comment.
fn shortened(comment: &str) -> String {
    const CUT: &str = "…";
    let (head, tail) = match comment.rfind(':') {
        // A port name has at most 15 characters (IANA_SVC_NAME): room is always left.
        Some(at) if comment.len() - at < MAX_COMMENT / 2 => comment.split_at(at),
        _ => (comment, ""),
    };
    let room = MAX_COMMENT - tail.len() - CUT.len();
    let mut start = room.div_ceil(2);
    while !head.is_char_boundary(start) {
        start -= 1;
    }
    let mut end = head.len() - (room - start);
    while !head.is_char_boundary(end) {
        end += 1;
    }
    format!("{}{CUT}{}{tail}", &head[..start], &head[end..])
}

fn commented(set: Set, key: Key, value: Verdict, comment: &Arc<str>) -> Element {
    Element {
        set,
        key,
        value: Some(Value::Verdict(value)),
        comment: Some(comment.clone()),
    }
}

/// The number of endpoints in a list, as a chain's slot count.
fn count(eps: &[Endpoint]) -> u32 {
    u32::try_from(eps.len()).unwrap_or(u32::MAX)
}

/// One way into a Service port: a VIP (`ip . proto . port`) or the node port (`proto . port`).
struct Entry {
    /// The key of its pick and affinity-id elements.
    key: Key,
    /// The VIP its slot keys start with; `None` for the node port (slots keyed by port only).
    vip: Option<IpAddr>,
    /// The VIP's port or the node port.
    port: u16,
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
        marks: Option<Marks>,
    ) {
        if eps.is_empty() {
            return;
        }
        let kind = PickKind::of(self.vip.is_none(), local);
        if self.pick {
            out.push(el(
                kind.pick_map(),
                self.key,
                Some(Value::Verdict(Verdict::Goto(Chain::Dynamic(
                    kind.chain(count(eps)),
                )))),
            ));
        }
        let map = kind.slot_map(protocol);
        for (slot, e) in (0u32..).zip(eps) {
            let key = match self.vip {
                Some(vip) => Key::VipSlot(vip, self.port, slot),
                None => Key::NodePortSlot(self.port, slot),
            };
            out.push(el(map, key, Some(Value::Endpoint(e.ip, e.port))));
        }
        if let Some(marks) = marks {
            let id = if local { marks.local } else { marks.cluster };
            for bit in affinity::bits(id) {
                if let Some(key) = self.key.with_bit(bit) {
                    out.push(el(kind.affinity_bits_set(), key, None));
                }
            }
        }
    }
}

/// The entry points of a Service port, as its `affinity-bits-*` elements key them: the
/// ClusterIP first, then the external and load-balancer IPs, then the node port. All share the
/// port's affinity ids; reading them back at start-up ([`crate::affinity_seed`]) looks the
/// port up by these keys (ClusterIP first).
pub fn entry_points(sp: &ServicePort) -> Vec<Key> {
    let proto = sp.key.protocol;
    let vips = std::iter::once(&sp.cluster_ip)
        .chain(&sp.external_ips)
        .chain(&sp.load_balancer_ips);
    vips.map(|ip| Key::Vip(*ip, proto, sp.port))
        .chain(sp.node_port.map(|np| Key::NodePort(proto, np)))
        .collect()
}

/// Builds every element of one Service port. `marks` are the port's affinity ids (conntrack
/// mark values, [`crate::affinity`]); a port with ClientIP affinity but without ids (the mask
/// is full) is served without affinity. `node_ips` are the node's own addresses: a
/// load-balancer source range that contains one lets traffic from the LB IPs themselves in, as
/// kube-proxy does.
pub fn port_elements(sp: &ServicePort, marks: Option<Marks>, node_ips: &[IpAddr]) -> Vec<Element> {
    let mut out = Vec::new();
    let proto = sp.key.protocol;
    let vip_key = |ip: &IpAddr| Key::Vip(*ip, proto, sp.port);
    let comment = port_comment(&format!("{}:{}", sp.key.service, sp.key.port_name));
    let marks = marks.filter(|_| sp.session_affinity.is_some());
    let affinity = marks.is_some();
    let reject = Verdict::goto(FixedChain::Reject);
    let reject_or_drop = Value::Verdict(if sp.has_any_endpoints {
        Verdict::Drop
    } else {
        reject
    });
    let lists: [(&[Endpoint], bool); 2] =
        [(&sp.cluster_endpoints, false), (&sp.local_endpoints, true)];

    out.push(el(Set::ClusterIps, Key::Addr(sp.cluster_ip), None));

    // ClusterIP traffic.
    let internal = sp.internal_endpoints();
    let cip = vip_key(&sp.cluster_ip);
    if internal.is_empty() {
        let verdict = if sp.internal_policy_local && sp.has_any_endpoints {
            Verdict::Drop
        } else {
            reject
        };
        out.push(el(
            Set::NoEndpointServices,
            cip,
            Some(Value::Verdict(verdict)),
        ));
    } else if affinity {
        let chain = if sp.internal_policy_local {
            FixedChain::AffinityLocal
        } else {
            FixedChain::AffinityCluster
        };
        out.push(commented(
            Set::ServiceIps,
            cip,
            Verdict::goto(chain),
            &comment,
        ));
    } else {
        let kind = PickKind::of(false, sp.internal_policy_local);
        let chain = Chain::Dynamic(kind.chain(count(internal)));
        out.push(commented(
            Set::ServiceIps,
            cip,
            Verdict::Goto(chain),
            &comment,
        ));
    }

    // External IPs and load-balancer IPs.
    let external_vips: Vec<&IpAddr> = sp
        .external_ips
        .iter()
        .chain(sp.load_balancer_ips.iter())
        .collect();
    let (external_chain, nodeport_chain) = match (sp.external_policy_local, affinity) {
        (false, false) => (
            FixedChain::ExternalCluster,
            FixedChain::NodeportExternalCluster,
        ),
        (true, false) => (FixedChain::ExternalLocal, FixedChain::NodeportExternalLocal),
        (false, true) => (
            FixedChain::ExternalClusterAffinity,
            FixedChain::NodeportExternalClusterAffinity,
        ),
        (true, true) => (
            FixedChain::ExternalLocalAffinity,
            FixedChain::NodeportExternalLocalAffinity,
        ),
    };
    for vip in &external_vips {
        let key = vip_key(vip);
        if sp.has_any_endpoints {
            out.push(commented(
                Set::ServiceIps,
                key,
                Verdict::goto(external_chain),
                &comment,
            ));
        }
        if sp.external_endpoints().is_empty() {
            out.push(el(Set::NoEndpointServices, key, Some(reject_or_drop)));
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
            vip: Some(**vip),
            port: sp.port,
            pick,
        };
        for (eps, local) in lists {
            entry.list_elements(&mut out, eps, local, sp.key.protocol, marks);
        }
    }

    // Node port.
    if let Some(node_port) = sp.node_port {
        let key = Key::NodePort(proto, node_port);
        if sp.has_any_endpoints {
            out.push(commented(
                Set::ServiceNodeports,
                key,
                Verdict::goto(nodeport_chain),
                &comment,
            ));
        }
        if sp.external_endpoints().is_empty() {
            out.push(el(Set::NoEndpointNodeports, key, Some(reject_or_drop)));
        }
        let entry = Entry {
            key,
            vip: None,
            port: node_port,
            pick: true,
        };
        for (eps, local) in lists {
            entry.list_elements(&mut out, eps, local, sp.key.protocol, marks);
        }
    }

    // Affinity bookkeeping: which endpoints an id may stick to, and its recording chain.
    if let (Some(a), Some(marks)) = (sp.session_affinity, marks) {
        for (eps, local) in lists {
            if eps.is_empty() {
                continue;
            }
            let id = if local { marks.local } else { marks.cluster };
            let chain = Chain::Dynamic(DynamicChain::AffinityTimeout(a.timeout_seconds));
            out.push(el(
                Set::AffinityTimeouts,
                Key::Mark(id),
                Some(Value::Verdict(Verdict::Goto(chain))),
            ));
            for e in eps {
                out.push(el(
                    Set::AffinityValid,
                    Key::MarkEndpoint(id, e.ip, e.port),
                    None,
                ));
            }
        }
    }

    // loadBalancerSourceRanges: only load-balancer IPs are filtered, from every source.
    // The allowed sources are disjoint prefixes (the model's one normalisation): the set is
    // an interval set, which refuses overlapping elements.
    if !sp.source_ranges.is_empty() {
        let allowed = sp.load_balancer_allowed_sources(node_ips);
        for vip in &sp.load_balancer_ips {
            out.push(el(Set::FirewallIps, vip_key(vip), None));
            for net in &allowed {
                // A single address as one (the form nft lists it in).
                let source = if net.prefix_len() == net.max_prefix_len() {
                    Source::Addr(net.addr())
                } else {
                    Source::Net(*net)
                };
                out.push(el(
                    Set::FirewallAllow,
                    Key::VipSource(*vip, proto, sp.port, source),
                    None,
                ));
            }
        }
    }

    // Hairpin: a local endpoint reaching itself through the Service is masqueraded.
    for e in sp.all_reachable_endpoints().iter().filter(|e| e.is_local) {
        out.push(el(
            Set::HairpinConnections,
            Key::Hairpin(e.ip, e.ip, proto, e.port),
            None,
        ));
    }
    out
}

#[cfg(test)]
mod comment_tests {
    use super::*;

    /// Names reaching the backend unchecked stay one line, unquoted and within nft's limit.
    #[test]
    fn port_comments_hold_no_control_character_or_quote() {
        for (raw, want) in [
            ("ns/web:http", "ns/web:http".to_string()),
            ("ns/web:a\n-I X\n#", "ns/web:a_-I X_#".to_string()),
            ("ns/web:a\"b", "ns/web:a'b".to_string()),
            ("ns/web:\u{1b}[2J", "ns/web:_[2J".to_string()),
            (
                &"é".repeat(100),
                format!("{}…{}", "é".repeat(31), "é".repeat(31)),
            ),
        ] {
            assert_eq!(&*port_comment(raw), want.as_str(), "{raw:?}");
            assert!(port_comment(raw).len() <= MAX_COMMENT, "{raw:?}");
        }
    }

    /// A long `namespace/name` is shortened in its middle, never the `:port` that tells a
    /// Service's ports apart (until 2026-12-07 the end was cut, and two ports of a Service with
    /// a 63-byte namespace and name had the same comment).
    #[test]
    fn long_names_keep_the_port_in_the_comment() {
        let ns = format!("a{}", "n".repeat(61)) + "z";
        let name = format!("b{}", "m".repeat(61)) + "y";
        let service = format!("{ns}/{name}");
        let mut seen = std::collections::BTreeSet::new();
        for port in ["http", "metrics-port-15"] {
            let comment = port_comment(&format!("{service}:{port}"));
            assert!(comment.len() <= MAX_COMMENT, "{comment}");
            assert!(comment.ends_with(&format!("y:{port}")), "{comment}");
            assert!(comment.starts_with("an"), "{comment}");
            assert!(comment.contains('…'), "{comment}");
            assert!(seen.insert(comment.to_string()), "{comment}: twice");
        }
        // Within the limit: unchanged.
        let fits = format!("{}/web:http", "n".repeat(63));
        assert_eq!(&*port_comment(&fits), fits.as_str());
    }
}
