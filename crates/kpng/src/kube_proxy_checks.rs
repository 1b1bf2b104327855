//! The UDP frontends kube-proxy's rules were DNATing when kpng started on its node: the UDP
//! conntrack cleanup takes them as checked, so that the first pass after the swap from
//! kube-proxy reads the DNATed entries alone instead of walking the table once per frontend.
//!
//! Why this is safe: never-DNATed entries of a frontend can only come from a moment when it had
//! no DNAT rule. While a frontend is in kube-proxy's rules every new flow to it is DNATed, and
//! after each sync kube-proxy deletes every UDP entry to a frontend with serving endpoints whose
//! reply does not come from one of them, never-DNATed ones included (`CleanStaleEntries` in
//! upstream `pkg/proxy/conntrack`). kpng removes kube-proxy's rules only once its own are in
//! place (`leftovers::sweep`). So such a frontend has no never-DNATed entry left, exactly as one
//! kpng has checked itself.
//!
//! Only rules that are surely kube-proxy's count:
//! - its nftables table `kube-proxy`: the `service-ips` map's UDP elements that go to a Service
//!   chain (a Service without endpoints is in `no-endpoint-services` instead), read with one
//!   netlink dump of that map (`nft list` would read every table's elements, kpng's included);
//! - in iptables (either variant), the nat table's `KUBE-SERVICES` rules for UDP that jump to
//!   a Service's chain, but only when no kpng has run in this network namespace during this
//!   boot: kpng's iptables backend writes the same chains, and what kpng checked is in its own
//!   memory file (`kpng_conntrack::memory`), which it creates before its first commit. The
//!   runner waits for this read before kpng's first commit, so it never sees kpng's rules.
//!
//! The read runs on its own thread while kpng loads the cluster. It costs about one system
//! call per map element (nftables) and ~30 µs per `KUBE-SERVICES` rule (iptables, through
//! the tool: 0.9 s at 30,000 Services), once, on the first start after kube-proxy.
//!
//! Node ports are left out: kube-proxy DNATs them only on its `--nodeport-addresses`, while the
//! cleanup's node-port frontend covers every address of the node. They are read whole.

use std::collections::HashSet;

use kpng_conntrack::Frontend;
use kpng_conntrack::memory::Checked;
use kpng_model::Family;
use kpng_netfilter::attr::{NFT_GOTO, NFT_JUMP};
use kpng_netfilter::elements::Element;

/// The UDP Service-IP frontends among the elements of one family's `service-ips` map
/// (`address . inet_proto . inet_service : verdict`) that go to a Service's chain.
pub fn from_service_ips(elements: &[Element], family: Family) -> HashSet<Frontend> {
    elements
        .iter()
        .filter(|e| {
            e.verdict.as_ref().is_some_and(|verdict| {
                matches!(verdict.code, NFT_GOTO | NFT_JUMP)
                    && verdict.chain.as_deref().is_some_and(|chain| {
                        ["service-", "local-", "external-"]
                            .iter()
                            .any(|p| chain.starts_with(p))
                    })
            })
        })
        .filter_map(|e| crate::own_rules::udp_service_ip(&e.key, family))
        .map(Frontend::Ip)
        .collect()
}

/// The UDP Service-IP frontends of one family's `KUBE-SERVICES` rules in the nat table, from
/// `iptables -t nat -S KUBE-SERVICES`.
pub fn from_iptables_services(text: &str, family: Family) -> HashSet<Frontend> {
    kpng_backend_iptables::save::Saved::parse(text)
        .udp_service_ips()
        .into_iter()
        .filter(|a| Family::of(&a.ip()) == family)
        .map(Frontend::Ip)
        .collect()
}

/// Reads kube-proxy's rules on this node (see the module's documentation). `kpng_ran_here`:
/// a kpng left its memory file in this namespace during this boot, so iptables chains may be
/// kpng's and are not read. Whatever cannot be read counts as nothing: those frontends are
/// read whole, as without this.
#[cfg(target_os = "linux")]
pub fn read(kpng_ran_here: bool) -> Checked {
    use crate::leftovers::{Variant, iptables_table_exists};
    let mut checked = Checked::new();
    for family in Family::ALL {
        let (nft_family, iptables) = match family {
            Family::V4 => ("ip", "iptables"),
            Family::V6 => ("ip6", "ip6tables"),
        };
        let mut found = HashSet::new();
        match kpng_netfilter::elements::set_elements(nft_family, "kube-proxy", "service-ips") {
            Ok(Some(elements)) => found.extend(from_service_ips(&elements, family)),
            Ok(None) => {}
            Err(e) => tracing::debug!("kube-proxy's {nft_family} service-ips: {e}"),
        }
        for variant in [Variant::Legacy, Variant::Nft] {
            if kpng_ran_here || !iptables_table_exists(variant, family, "nat") {
                continue;
            }
            let tool = format!("{iptables}-{}", variant.name());
            let args = ["-w", "-t", "nat", "-S", "KUBE-SERVICES"];
            match kpng_backend_kit::exec::run_tool(&tool, &args, None) {
                Ok(text) => found.extend(from_iptables_services(&text, family)),
                Err(e) => tracing::debug!("kube-proxy's KUBE-SERVICES ({tool}): {e}"),
            }
        }
        if !found.is_empty() {
            checked.insert(family, found);
        }
    }
    checked
}

/// Says what was read, per family: the operator sees why the first pass reads less.
pub fn log(checked: &Checked) {
    for (family, frontends) in checked {
        tracing::info!(
            %family,
            frontends = frontends.len(),
            "the rules found at start (kube-proxy's, or an earlier kpng build's in kube-proxy's \
             iptables chains) DNATed these UDP frontends until kpng's were in place, and their \
             writer deleted their never-DNATed conntrack entries itself: the UDP conntrack \
             cleanup reads only their DNATed entries"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Frontend {
        Frontend::Ip(s.parse().expect("socket address"))
    }

    #[test]
    fn service_ips_udp_elements_to_service_chains_count() {
        use kpng_netfilter::attr::NF_DROP;
        use kpng_netfilter::elements::Verdict;
        let v4 = |a: [u8; 4], proto: u8, port: u16| {
            let p = port.to_be_bytes();
            vec![a[0], a[1], a[2], a[3], proto, 0, 0, 0, p[0], p[1], 0, 0]
        };
        let mut v6 = vec![0xfd, 0, 0, 0x96, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xa];
        v6.extend([17, 0, 0, 0, 0, 53, 0, 0]);
        let to = |chain: &str| {
            Some(Verdict {
                code: NFT_GOTO,
                chain: Some(chain.into()),
            })
        };
        let elements = [
            (v4([10, 96, 0, 10], 6, 53), to("service-AAA")),
            (v4([1, 2, 3, 4], 17, 53), to("external-AAA")),
            (v4([10, 96, 0, 10], 17, 53), to("service-AAA")),
            (v4([10, 96, 0, 11], 17, 5353), to("local-BBB")),
            (v4([10, 96, 0, 12], 17, 53), to("reject-chain")),
            (
                v4([10, 96, 0, 13], 17, 53),
                Some(Verdict {
                    code: NF_DROP,
                    chain: None,
                }),
            ),
            (v4([10, 96, 0, 14], 17, 53), None),
            (v6, to("service-CCC")),
        ]
        .map(|(key, verdict)| Element {
            key,
            verdict,
            ..Element::default()
        });
        let cases: [(Family, &[&str]); 2] = [
            (
                Family::V4,
                &["1.2.3.4:53", "10.96.0.10:53", "10.96.0.11:5353"],
            ),
            (Family::V6, &["[fd00:96::a]:53"]),
        ];
        for (family, want) in cases {
            let want: HashSet<Frontend> = want.iter().map(|s| ip(s)).collect();
            assert_eq!(from_service_ips(&elements, family), want, "{family}");
        }
    }
}
