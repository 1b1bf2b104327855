//! The node's kernel settings that Services need and kpng does not set (kube-proxy does not
//! set them either): checked at start and at every full or periodic sync, warned once per
//! condition, and shown as the `node checks` line of `kpng status` while they last.
//!
//! - IP forwarding (`net.ipv4.ip_forward`, `net.ipv6.conf.all.forwarding`) off: every packet
//!   the rules translate to another host's or a pod's address is dropped by the kernel (a
//!   pod's connection to a ClusterIP whose endpoint is another pod, a NodePort from outside),
//!   with nothing in kpng's rules to show why. Checked for the families that have Services.
//! - Bridge netfilter off (`net.bridge.bridge-nf-call-iptables` 0, or the `br_netfilter`
//!   module not loaded at all) while the node has a Linux bridge with ports (a bridge CNI's
//!   pods): a pod's connection to a Service whose chosen endpoint is on the same bridge is
//!   bridged without passing netfilter, never translated, and times out. Upstream kube-proxy
//!   (iptables mode) logs "Missing br-netfilter module or unset sysctl br-nf-call-iptables"
//!   when the sysctl reads other than 1, and nothing when the module is not loaded (the read
//!   fails); kpng warns in both cases, but only when a bridge has ports: a routed CNI (no
//!   bridge) needs neither, and saying so there would be noise.
//!
//! The reading is the binary's (Linux files, [`HostFacts`]); the decision here is
//! platform-free and table-tested.

use std::collections::BTreeMap;
use std::sync::Arc;

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
    /// The Linux bridges that have at least one port, by name.
    pub bridges_with_ports: Vec<String>,
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
    /// What is wrong, what breaks, and the fix.
    pub message: String,
}

/// The problems of `facts` for a backend needing `needs`, whose Services use `families`.
pub fn problems(facts: &HostFacts, needs: HostNeeds, families: &[Family]) -> Vec<HostProblem> {
    let mut out = Vec::new();
    for family in families {
        if needs.forwarding && facts.forwarding.get(family) == Some(&false) {
            let key = forwarding_sysctl(*family);
            out.push(HostProblem {
                key: format!("forwarding {family}"),
                message: format!(
                    "{key} is 0: the node forwards no {family} packet, so Service traffic \
                     translated to a pod or another host (a pod's connection to a ClusterIP, a \
                     NodePort from outside) is dropped; set it to 1 (sysctl -w {key}=1; \
                     neither kpng nor kube-proxy sets it)"
                ),
            });
        }
    }
    if needs.bridge_netfilter && !facts.bridges_with_ports.is_empty() {
        let bridges = facts.bridges_with_ports.join(", ");
        let effect = "traffic between pods on one Linux bridge bypasses netfilter, so a pod's \
                      connection to a Service whose endpoint is on the same bridge is never \
                      translated and fails";
        if !facts.br_netfilter_loaded {
            if !families.is_empty() {
                out.push(HostProblem {
                    key: "br_netfilter".into(),
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

/// The bridge-netfilter sysctl of `family`, as `sysctl` names it.
pub fn bridge_sysctl(family: Family) -> &'static str {
    match family {
        Family::V4 => "net.bridge.bridge-nf-call-iptables",
        Family::V6 => "net.bridge.bridge-nf-call-ip6tables",
    }
}

/// The `node checks` line's state: what was read, in sysctl's words.
pub fn describe(facts: &HostFacts, families: &[Family]) -> String {
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
    parts.push(if facts.bridges_with_ports.is_empty() {
        "no bridge with ports".into()
    } else {
        format!(
            "bridges with ports: {}",
            facts.bridges_with_ports.join(", ")
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
            bridges_with_ports: bridges.iter().map(|b| b.to_string()).collect(),
        }
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
            let got: Vec<String> = problems(&facts, needs, families)
                .into_iter()
                .map(|p| p.key)
                .collect();
            assert_eq!(got, want, "{what}");
        }
        let p = problems(&facts(&[(V4, false)], None, &["cni0"]), all, &[V4]);
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
        let p = problems(&facts(&good, Some(&[(V4, false)]), &["cni0"]), all, &[V4]);
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
        assert_eq!(
            describe(&facts(&[(V4, true)], Some(&[(V4, true)]), &["cni0"]), &[V4]),
            "net.ipv4.ip_forward 1, net.bridge.bridge-nf-call-iptables 1, bridges with ports: cni0"
        );
        assert_eq!(
            describe(&facts(&[(V4, false)], None, &[]), &[V4]),
            "net.ipv4.ip_forward 0, br_netfilter not loaded, no bridge with ports"
        );
    }
}
