//! The node's kernel settings that Services need and kpng does not set (kube-proxy does not
//! set them either): checked at start and at every full or periodic sync, warned once per
//! condition, and shown as the `node checks` line of `kpng status` while they last.
//!
//! - IP forwarding (`net.ipv4.ip_forward`, `net.ipv6.conf.all.forwarding`) off: every packet
//!   the rules translate to another host's or a pod's address is dropped by the kernel (a
//!   pod's connection to a ClusterIP whose endpoint is another pod, a NodePort from outside),
//!   with nothing in kpng's rules to show why. Checked for the families that have Services.
//! - Bridge netfilter off (`net.bridge.bridge-nf-call-iptables` 0, or the `br_netfilter`
//!   module not loaded at all) while a Linux bridge with ports carries pods (a bridge CNI's
//!   `cni0`): a pod's connection to a Service whose chosen endpoint is on the same bridge is
//!   bridged without passing netfilter, never translated, and times out. Upstream kube-proxy
//!   (iptables mode) logs "Missing br-netfilter module or unset sysctl br-nf-call-iptables"
//!   when the sysctl reads other than 1, and nothing when the module is not loaded (the read
//!   fails); kpng warns in both cases, but only for a bridge that carries pods
//!   ([`pod_bridges`]): a routed CNI (no bridge) needs neither, and Docker's `docker0` or
//!   libvirt's `virbr0` with containers or VMs that are no Service's endpoints cannot lose a
//!   Service connection that way (what is bridged there never reaches an endpoint without
//!   being routed, and routed packets pass netfilter); naming them was noise.
//!
//! The reading is the binary's (Linux files, [`HostFacts`]); the decision here is
//! platform-free and table-tested.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use kpng_model::Family;

/// What the node's kernel says, read when the checks run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFacts {
    /// IP forwarding per family (`net.ipv4.ip_forward`, `net.ipv6.conf.all.forwarding`);
    /// a family missing: unreadable (not checked).
    pub forwarding: BTreeMap<Family, bool>,
    /// `net.bridge.bridge-nf-call-iptables` / `-ip6tables` per family; empty when the
    /// `br_netfilter` module is not loaded (no `/proc/sys/net/bridge`).
    pub bridge_nf_call: BTreeMap<Family, bool>,
    /// Whether `br_netfilter` is loaded (its sysctls exist).
    pub br_netfilter_loaded: bool,
    /// The Linux bridges that have at least one port, by name, with their addresses (read
    /// only when bridge netfilter is off or not loaded: otherwise nothing depends on them).
    pub bridges_with_ports: Vec<Bridge>,
    /// `--pod-bridge-interface` (`detectLocalMode: BridgeInterface`): the bridge the
    /// configuration names as the pods'.
    pub configured_pod_bridge: Option<String>,
}

/// A Linux bridge with at least one port.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bridge {
    /// Its name (`cni0`).
    pub name: String,
    /// Its addresses with their prefix (`10.244.1.1/24`).
    pub addresses: Vec<IpNet>,
}

/// Whether bridge netfilter may be off: the module not loaded, or a sysctl of `families` 0.
/// Only then do the bridges' addresses matter.
pub fn bridge_netfilter_may_be_off(
    loaded: bool,
    calls: &BTreeMap<Family, bool>,
    families: &[Family],
) -> bool {
    !loaded || families.iter().any(|f| calls.get(f) == Some(&false))
}

/// The bridges of `facts` that carry pods, and so need bridge netfilter. A bridge with ports
/// carries pods when
///
/// 1. it is the configured `--pod-bridge-interface`, or
/// 2. one of its addresses is inside `pod_cidrs` (`--cluster-cidr`, the Node's podCIDRs): the
///    bridge plugin, flannel and kindnet give the bridge the gateway address of the node's
///    pod subnet, or
/// 3. one of its subnets holds a Service endpoint's address (`endpoints`): whatever the CNI
///    (Docker containers made endpoints included), an endpoint there is one a client on the
///    same bridge reaches by bridging, which is the failure.
///
/// The first two catch a pod bridge before its first endpoint; the third the bridges no
/// setting names. A bridge matching none (Docker's `docker0`, libvirt's `virbr0`, a VM host's
/// bridge) cannot lose a Service connection to bridge netfilter being off: nothing bridged
/// there reaches an endpoint. Not caught: a bridge without an address that holds endpoints
/// (pods whose gateway is elsewhere) and is not `--pod-bridge-interface`.
pub fn pod_bridges(facts: &HostFacts, pod_cidrs: &[IpNet], endpoints: &[IpAddr]) -> Vec<String> {
    facts
        .bridges_with_ports
        .iter()
        .filter(|b| {
            facts.configured_pod_bridge.as_deref() == Some(b.name.as_str())
                || b.addresses.iter().any(|a| {
                    pod_cidrs.iter().any(|c| c.contains(&a.addr()))
                        || endpoints.iter().any(|e| a.trunc().contains(e))
                })
        })
        .map(|b| b.name.clone())
        .collect()
}

/// Reads [`HostFacts`] now (the binary's, cheap: a few small files).
pub type HostProbe = Arc<dyn Fn() -> HostFacts + Send + Sync>;

/// Which checks matter for the backend: forwarding for those that translate packets in
/// netfilter (nftables, iptables), bridge netfilter for those whose translation is in
/// netfilter's hooks (a socket-level backend translates before the packet reaches a bridge).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostNeeds {
    /// IP forwarding.
    pub forwarding: bool,
    /// Bridge netfilter.
    pub bridge_netfilter: bool,
}

/// One condition that breaks Services, with a stable key (warned once per key, whatever
/// changes in its wording: a bridge's port count comes and goes with pods).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostProblem {
    /// `forwarding IPv4`, `bridge-nf IPv6`, …
    pub key: String,
    /// The setting at fault, the `check` label of `kpng_node_check_problems` (one of
    /// [`checks`]).
    pub check: &'static str,
    /// What is wrong, what breaks, and the fix.
    pub message: String,
}

/// The problems of `facts` for a backend needing `needs`, whose Services use `families`;
/// `pod_bridges`: the bridges that carry pods ([`pod_bridges`]).
pub fn problems(
    facts: &HostFacts,
    needs: HostNeeds,
    families: &[Family],
    pod_bridges: &[String],
) -> Vec<HostProblem> {
    let mut out = Vec::new();
    for family in families {
        if needs.forwarding && facts.forwarding.get(family) == Some(&false) {
            let key = forwarding_sysctl(*family);
            out.push(HostProblem {
                key: format!("forwarding {family}"),
                check: key,
                message: format!(
                    "{key} is 0: the node forwards no {family} packet, so Service traffic \
                     translated to a pod or another host (a pod's connection to a ClusterIP, a \
                     NodePort from outside) is dropped; set it to 1 (sysctl -w {key}=1; \
                     neither kpng nor kube-proxy sets it)"
                ),
            });
        }
    }
    if needs.bridge_netfilter && !pod_bridges.is_empty() {
        let bridges = pod_bridges.join(", ");
        let effect = "traffic between pods on one Linux bridge bypasses netfilter, so a pod's \
                      connection to a Service whose endpoint is on the same bridge is never \
                      translated and fails";
        if !facts.br_netfilter_loaded {
            if !families.is_empty() {
                out.push(HostProblem {
                    key: "br_netfilter".into(),
                    check: BR_NETFILTER,
                    message: format!(
                        "the br_netfilter module is not loaded and the node bridges pods \
                         ({bridges}): {effect}; load it (modprobe br_netfilter) and keep \
                         net.bridge.bridge-nf-call-iptables=1"
                    ),
                });
            }
        } else {
            for family in families {
                if facts.bridge_nf_call.get(family) == Some(&false) {
                    let key = bridge_sysctl(*family);
                    out.push(HostProblem {
                        key: format!("bridge-nf {family}"),
                        check: key,
                        message: format!(
                            "{key} is 0 and the node bridges pods ({bridges}): {effect}; set \
                             it to 1 (sysctl -w {key}=1)"
                        ),
                    });
                }
            }
        }
    }
    out
}

/// The forwarding sysctl of `family`, as `sysctl` names it.
pub fn forwarding_sysctl(family: Family) -> &'static str {
    match family {
        Family::V4 => "net.ipv4.ip_forward",
        Family::V6 => "net.ipv6.conf.all.forwarding",
    }
}

/// The check of the `br_netfilter` module being loaded.
pub const BR_NETFILTER: &str = "br_netfilter";

/// Every check a backend needing `needs` has, as `kpng_node_check_problems` labels them (each
/// exported, 0 when fine, so that an alert does not depend on a series appearing).
pub fn checks(needs: HostNeeds) -> Vec<&'static str> {
    let mut out = Vec::new();
    if needs.forwarding {
        out.extend([Family::V4, Family::V6].map(forwarding_sysctl));
    }
    if needs.bridge_netfilter {
        out.push(BR_NETFILTER);
        out.extend([Family::V4, Family::V6].map(bridge_sysctl));
    }
    out
}

/// The bridge-netfilter sysctl of `family`, as `sysctl` names it.
pub fn bridge_sysctl(family: Family) -> &'static str {
    match family {
        Family::V4 => "net.bridge.bridge-nf-call-iptables",
        Family::V6 => "net.bridge.bridge-nf-call-ip6tables",
    }
}

/// The `node checks` line's state: what was read, in sysctl's words, and which bridges carry
/// pods (`pod_bridges`) when bridge netfilter may be off.
pub fn describe(facts: &HostFacts, families: &[Family], pod_bridges: &[String]) -> String {
    let mut parts = Vec::new();
    for family in families {
        if let Some(on) = facts.forwarding.get(family) {
            parts.push(format!("{} {}", forwarding_sysctl(*family), u8::from(*on)));
        }
    }
    if facts.br_netfilter_loaded {
        for family in families {
            if let Some(on) = facts.bridge_nf_call.get(family) {
                parts.push(format!("{} {}", bridge_sysctl(*family), u8::from(*on)));
            }
        }
    } else {
        parts.push("br_netfilter not loaded".into());
    }
    let names: Vec<&str> = facts
        .bridges_with_ports
        .iter()
        .map(|b| b.name.as_str())
        .collect();
    let others: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| !pod_bridges.iter().any(|p| p == n))
        .collect();
    parts.push(if names.is_empty() {
        "no bridge with ports".into()
    } else if !bridge_netfilter_may_be_off(
        facts.br_netfilter_loaded,
        &facts.bridge_nf_call,
        families,
    ) {
        format!("bridges with ports: {}", names.join(", "))
    } else if pod_bridges.is_empty() {
        format!(
            "bridges with ports: {} (none carries pods: no pod address, endpoint or \
                 --pod-bridge-interface)",
            names.join(", ")
        )
    } else if others.is_empty() {
        format!("bridges of pods: {}", pod_bridges.join(", "))
    } else {
        format!(
            "bridges of pods: {}; other bridges with ports: {}",
            pod_bridges.join(", "),
            others.join(", ")
        )
    });
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(
        fwd: &[(Family, bool)],
        brnf: Option<&[(Family, bool)]>,
        bridges: &[&str],
    ) -> HostFacts {
        HostFacts {
            forwarding: fwd.iter().copied().collect(),
            bridge_nf_call: brnf.unwrap_or_default().iter().copied().collect(),
            br_netfilter_loaded: brnf.is_some(),
            bridges_with_ports: bridges
                .iter()
                .map(|b| Bridge {
                    name: b.to_string(),
                    addresses: Vec::new(),
                })
                .collect(),
            configured_pod_bridge: None,
        }
    }

    /// Every bridge of `facts` taken as a pod bridge (the problems' tests).
    fn all_bridges(facts: &HostFacts) -> Vec<String> {
        facts
            .bridges_with_ports
            .iter()
            .map(|b| b.name.clone())
            .collect()
    }

    /// The conditions that break Services silently, each named once with its fix; nothing
    /// for a family without Services, a routed CNI (no bridge), or a backend that does not
    /// need the setting.
    #[test]
    fn settings_that_break_services_are_named() {
        use Family::{V4, V6};
        let all = HostNeeds {
            forwarding: true,
            bridge_netfilter: true,
        };
        let sockets = HostNeeds::default();
        let good = [(V4, true), (V6, true)];
        /// What, the facts, the backend's needs, the families with Services, the keys wanted.
        type Case<'a> = (&'a str, HostFacts, HostNeeds, &'a [Family], &'a [&'a str]);
        let cases: [Case; 10] = [
            (
                "all good",
                facts(&good, Some(&good), &["cni0"]),
                all,
                &[V4, V6],
                &[],
            ),
            (
                "IPv4 forwarding off",
                facts(&[(V4, false), (V6, true)], Some(&good), &[]),
                all,
                &[V4],
                &["forwarding IPv4"],
            ),
            (
                "IPv6 forwarding off, no IPv6 Service",
                facts(&[(V4, true), (V6, false)], Some(&good), &[]),
                all,
                &[V4],
                &[],
            ),
            (
                "IPv6 forwarding off, IPv6 Services",
                facts(&[(V4, true), (V6, false)], Some(&good), &[]),
                all,
                &[V4, V6],
                &["forwarding IPv6"],
            ),
            (
                "bridge-nf 0 with a bridge of pods",
                facts(&good, Some(&[(V4, false), (V6, true)]), &["cni0"]),
                all,
                &[V4],
                &["bridge-nf IPv4"],
            ),
            (
                "bridge-nf 0, no bridge (a routed CNI)",
                facts(&good, Some(&[(V4, false), (V6, false)]), &[]),
                all,
                &[V4, V6],
                &[],
            ),
            (
                "br_netfilter not loaded, a bridge of pods",
                facts(&good, None, &["cni0"]),
                all,
                &[V4],
                &["br_netfilter"],
            ),
            (
                "br_netfilter not loaded, no bridge",
                facts(&good, None, &[]),
                all,
                &[V4],
                &[],
            ),
            (
                "a socket-level backend",
                facts(&[(V4, false)], None, &["cni0"]),
                sockets,
                &[V4],
                &[],
            ),
            (
                "no Service at all",
                facts(&[(V4, false)], None, &["cni0"]),
                all,
                &[],
                &[],
            ),
        ];
        for (what, facts, needs, families, want) in cases {
            let got: Vec<String> = problems(&facts, needs, families, &all_bridges(&facts))
                .into_iter()
                .map(|p| p.key)
                .collect();
            assert_eq!(got, want, "{what}");
        }
        let f = facts(&[(V4, false)], None, &["cni0"]);
        let p = problems(&f, all, &[V4], &all_bridges(&f));
        assert!(
            p[0].message.starts_with("net.ipv4.ip_forward is 0: ")
                && p[0].message.contains("sysctl -w net.ipv4.ip_forward=1"),
            "{p:?}"
        );
        assert!(
            p[1].message.starts_with(
                "the br_netfilter module is not loaded and the node bridges pods (cni0): "
            ) && p[1].message.contains("modprobe br_netfilter"),
            "{p:?}"
        );
        let f = facts(&good, Some(&[(V4, false)]), &["cni0"]);
        let p = problems(&f, all, &[V4], &all_bridges(&f));
        assert!(
            p[0].message.starts_with(
                "net.bridge.bridge-nf-call-iptables is 0 and the node bridges pods (cni0): "
            ) && p[0]
                .message
                .contains("sysctl -w net.bridge.bridge-nf-call-iptables=1"),
            "{p:?}"
        );
    }

    #[test]
    fn the_state_says_what_was_read() {
        use Family::V4;
        let cni = vec!["cni0".to_string()];
        assert_eq!(
            describe(
                &facts(&[(V4, true)], Some(&[(V4, true)]), &["cni0", "docker0"]),
                &[V4],
                &cni
            ),
            "net.ipv4.ip_forward 1, net.bridge.bridge-nf-call-iptables 1, bridges with ports: \
             cni0, docker0"
        );
        assert_eq!(
            describe(&facts(&[(V4, false)], None, &[]), &[V4], &[]),
            "net.ipv4.ip_forward 0, br_netfilter not loaded, no bridge with ports"
        );
        let off = facts(&[(V4, true)], Some(&[(V4, false)]), &["cni0", "docker0"]);
        assert_eq!(
            describe(&off, &[V4], &cni),
            "net.ipv4.ip_forward 1, net.bridge.bridge-nf-call-iptables 0, bridges of pods: \
             cni0; other bridges with ports: docker0"
        );
        assert_eq!(
            describe(&off, &[V4], &[]),
            "net.ipv4.ip_forward 1, net.bridge.bridge-nf-call-iptables 0, bridges with ports: \
             cni0, docker0 (none carries pods: no pod address, endpoint or \
             --pod-bridge-interface)"
        );
    }

    /// Which bridges carry pods: the configured one, one with an address in a pod CIDR, one
    /// whose subnet holds an endpoint; not Docker's or libvirt's bridge of containers or VMs
    /// that are no endpoint, nor a bridge without address that no setting names.
    #[test]
    fn only_bridges_that_carry_pods_count() {
        let net = |s: &str| s.parse::<IpNet>().expect("net");
        let bridge = |name: &str, addrs: &[&str]| Bridge {
            name: name.into(),
            addresses: addrs.iter().map(|a| net(a)).collect(),
        };
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        let host = |bridges: Vec<Bridge>, configured: Option<&str>| HostFacts {
            bridges_with_ports: bridges,
            configured_pod_bridge: configured.map(str::to_string),
            ..HostFacts::default()
        };
        let cluster = [net("10.244.0.0/16"), net("fd00:244::/48")];
        /// What, the host, the pod CIDRs, the endpoints, the pod bridges wanted.
        type Case<'a> = (&'a str, HostFacts, &'a [IpNet], Vec<IpAddr>, &'a [&'a str]);
        let cases: [Case; 9] = [
            (
                "flannel's cni0 in the cluster CIDR, docker0 beside it",
                host(
                    vec![
                        bridge("cni0", &["10.244.1.1/24"]),
                        bridge("docker0", &["172.17.0.1/16"]),
                    ],
                    None,
                ),
                &cluster,
                vec![ip("10.244.2.7")],
                &["cni0"],
            ),
            (
                "an IPv6 pod bridge",
                host(vec![bridge("cni0", &["fd00:244:0:1::1/64"])], None),
                &cluster,
                vec![],
                &["cni0"],
            ),
            (
                "docker0 alone, its containers no endpoint",
                host(vec![bridge("docker0", &["172.17.0.1/16"])], None),
                &cluster,
                vec![ip("10.244.2.7"), ip("192.168.1.9")],
                &[],
            ),
            (
                "docker0 holding an endpoint (a Service in front of a container)",
                host(vec![bridge("docker0", &["172.17.0.1/16"])], None),
                &cluster,
                vec![ip("172.17.0.5")],
                &["docker0"],
            ),
            (
                "no pod CIDR known: an endpoint on the bridge tells",
                host(vec![bridge("cbr0", &["10.88.0.1/16"])], None),
                &[],
                vec![ip("10.88.3.4")],
                &["cbr0"],
            ),
            (
                "--pod-bridge-interface names it, no address yet",
                host(vec![bridge("br-pods", &[])], Some("br-pods")),
                &cluster,
                vec![],
                &["br-pods"],
            ),
            (
                "--pod-bridge-interface names another one",
                host(vec![bridge("virbr0", &["192.168.122.1/24"])], Some("cni0")),
                &cluster,
                vec![],
                &[],
            ),
            (
                "a bridge without address nothing names",
                host(vec![bridge("br0", &[])], None),
                &cluster,
                vec![ip("10.244.1.5")],
                &[],
            ),
            (
                "no bridge",
                host(vec![], None),
                &cluster,
                vec![ip("10.244.1.5")],
                &[],
            ),
        ];
        for (what, facts, cidrs, endpoints, want) in cases {
            assert_eq!(pod_bridges(&facts, cidrs, &endpoints), want, "{what}");
        }
        // docker0 only with bridge netfilter off: no problem (it used to be one).
        let docker = HostFacts {
            bridge_nf_call: BTreeMap::from([(Family::V4, false)]),
            br_netfilter_loaded: true,
            ..host(vec![bridge("docker0", &["172.17.0.1/16"])], None)
        };
        let pods = pod_bridges(&docker, &cluster, &[]);
        let needs = HostNeeds {
            forwarding: true,
            bridge_netfilter: true,
        };
        assert_eq!(problems(&docker, needs, &[Family::V4], &pods), []);
    }
}
