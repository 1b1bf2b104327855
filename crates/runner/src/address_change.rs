//! A change of the node's interface addresses, as the runner logs and syncs it. Platform-free
//! (the watch that produces it, `address_watch`, is Linux's).

use std::net::IpAddr;

/// How many addresses a log line names before it counts the rest: deleting an interface
/// that carries every ClusterIP (ipvs mode's `kube-ipvs0`) loses thousands at once, and
/// container runtimes split lines longer than 16 KiB.
const NAMED: usize = 5;

/// Addresses the node gained and lost, as one report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressChange {
    /// New addresses, sorted.
    pub added: Vec<IpAddr>,
    /// Addresses gone, sorted.
    pub removed: Vec<IpAddr>,
}

impl AddressChange {
    /// The difference from `was` to `now` (both sorted); `None` when they are the same.
    pub fn between(was: &[IpAddr], now: &[IpAddr]) -> Option<AddressChange> {
        let added: Vec<IpAddr> = now.iter().filter(|a| !was.contains(a)).copied().collect();
        let removed: Vec<IpAddr> = was.iter().filter(|a| !now.contains(a)).copied().collect();
        Self::of(added, removed)
    }

    /// This change followed by `next` (changes that came before one sync): their net effect,
    /// `None` when they cancel out. An address gained then lost again is neither.
    pub fn then(self, next: AddressChange) -> Option<AddressChange> {
        let minus = |a: &[IpAddr], b: &[IpAddr]| -> Vec<IpAddr> {
            a.iter().filter(|x| !b.contains(x)).copied().collect()
        };
        let mut added = minus(&self.added, &next.removed);
        added.extend(minus(&next.added, &self.removed));
        let mut removed = minus(&self.removed, &next.added);
        removed.extend(minus(&next.removed, &self.added));
        for list in [&mut added, &mut removed] {
            list.sort();
            list.dedup();
        }
        Self::of(added, removed)
    }

    fn of(added: Vec<IpAddr>, removed: Vec<IpAddr>) -> Option<AddressChange> {
        (!added.is_empty() || !removed.is_empty()).then_some(AddressChange { added, removed })
    }
}

/// `change` without the addresses that matter to nothing with CIDR `--nodeport-addresses`
/// `cidrs`: those of a family the CIDRs restrict (one with a CIDR, none of them its whole
/// range) and outside all of them. Neither the node ports nor the health checks of any backend
/// use them (a family without a CIDR is every local address, which some backends list).
/// `outside` is told of the part left out, if any; `None` when nothing is left. Without
/// CIDRs, `change` as it is.
pub fn outside_cidrs(
    change: AddressChange,
    cidrs: &[ipnet::IpNet],
    outside: impl FnOnce(&AddressChange),
) -> Option<AddressChange> {
    if cidrs.is_empty() {
        return Some(change);
    }
    let setting = kpng_backend::settings::NodePortAddresses::Cidrs(cidrs.to_vec());
    let matters = |ip: &IpAddr| match setting.scope(kpng_model::Family::of(ip)) {
        kpng_backend::settings::NodePortScope::Cidrs(mine) => mine.iter().any(|c| c.contains(ip)),
        _ => true,
    };
    let split =
        |ips: &[IpAddr]| -> (Vec<IpAddr>, Vec<IpAddr>) { ips.iter().partition(|ip| matters(ip)) };
    let (added, added_outside) = split(&change.added);
    let (removed, removed_outside) = split(&change.removed);
    if let Some(left_out) = AddressChange::of(added_outside, removed_outside) {
        outside(&left_out);
    }
    AddressChange::of(added, removed)
}

impl std::fmt::Display for AddressChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |ips: &[IpAddr]| {
            let named: Vec<String> = ips.iter().take(NAMED).map(IpAddr::to_string).collect();
            if ips.len() > NAMED {
                format!(
                    "{} addresses: {} and {} more",
                    ips.len(),
                    named.join(", "),
                    ips.len() - NAMED
                )
            } else {
                named.join(", ")
            }
        };
        match (self.added.is_empty(), self.removed.is_empty()) {
            (false, true) => write!(f, "gained {}", list(&self.added)),
            (true, false) => write!(f, "lost {}", list(&self.removed)),
            _ => write!(
                f,
                "gained {}, lost {}",
                list(&self.added),
                list(&self.removed)
            ),
        }
    }
}

/// The node's addresses as the watch compares them: sorted, without duplicates, and without
/// link-local ones (`169.254.0.0/16`, `fe80::/10`). Every pod's veth on the node brings an
/// IPv6 link-local address: following them would log and sync once per pod started, while no
/// node port or health check is served on them unless a `--nodeport-addresses` CIDR covers
/// link-local space, a setting nobody needs (such a change is then seen at the next periodic
/// sync).
pub fn without_link_local(mut ips: Vec<IpAddr>) -> Vec<IpAddr> {
    ips.retain(|ip| match ip {
        IpAddr::V4(v4) => !v4.is_link_local(),
        IpAddr::V6(v6) => !v6.is_unicast_link_local(),
    });
    ips.sort();
    ips.dedup();
    ips
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|s| s.parse().expect("ip")).collect()
    }

    /// With CIDR `--nodeport-addresses`, a change of addresses outside them in a family they
    /// restrict is left out (logged at debug level, no sync): on a multi-NIC node a management
    /// address flapping said "follow at the next sync" every time, though nothing followed.
    #[test]
    fn changes_outside_the_node_port_cidrs_are_left_out() {
        let cidrs: Vec<ipnet::IpNet> = vec!["10.45.2.0/24".parse().expect("cidr")];
        let change = |added: &[&str], removed: &[&str]| AddressChange {
            added: ips(added),
            removed: ips(removed),
        };
        // (what, CIDRs, change, what is left, whether a part was left out)
        type Row<'a> = (
            &'a str,
            &'a [ipnet::IpNet],
            AddressChange,
            Option<AddressChange>,
            bool,
        );
        let table: [Row; 5] = [
            (
                "outside only",
                &cidrs,
                change(&[], &["10.45.1.1"]),
                None,
                true,
            ),
            (
                "inside",
                &cidrs,
                change(&["10.45.2.100"], &[]),
                Some(change(&["10.45.2.100"], &[])),
                false,
            ),
            (
                "both: the inside part kept",
                &cidrs,
                change(&["10.45.2.100", "10.45.3.1"], &["10.45.1.1"]),
                Some(change(&["10.45.2.100"], &[])),
                true,
            ),
            (
                "a family without a CIDR: every address counts",
                &cidrs,
                change(&["fd45:1::1"], &[]),
                Some(change(&["fd45:1::1"], &[])),
                false,
            ),
            (
                "no CIDRs",
                &[],
                change(&["10.45.1.1"], &[]),
                Some(change(&["10.45.1.1"], &[])),
                false,
            ),
        ];
        for (what, cidrs, change, want, told) in table {
            let mut left_out = None;
            let got = outside_cidrs(change, cidrs, |o| left_out = Some(o.clone()));
            assert_eq!(got, want, "{what}");
            assert_eq!(left_out.is_some(), told, "{what}: {left_out:?}");
        }
    }

    #[test]
    fn a_change_is_what_came_and_what_went() {
        let table = [
            ("same", ips(&["10.0.0.1"]), ips(&["10.0.0.1"]), None),
            (
                "gained",
                ips(&["10.0.0.1"]),
                ips(&["10.0.0.1", "10.0.0.9"]),
                Some("gained 10.0.0.9"),
            ),
            (
                "lost",
                ips(&["10.0.0.1", "fd00::1"]),
                ips(&["10.0.0.1"]),
                Some("lost fd00::1"),
            ),
            (
                "moved",
                ips(&["10.0.0.1"]),
                ips(&["10.0.0.2"]),
                Some("gained 10.0.0.2, lost 10.0.0.1"),
            ),
        ];
        for (what, was, now, want) in table {
            let got = AddressChange::between(&was, &now).map(|c| c.to_string());
            assert_eq!(got.as_deref(), want, "{what}");
        }
    }

    #[test]
    fn a_long_list_is_counted_not_spelled_out() {
        let many: Vec<IpAddr> = (1..=2000u32)
            .map(|i| IpAddr::from(std::net::Ipv4Addr::from(0x0a60_0000 + i)))
            .collect();
        let change = AddressChange::between(&many, &[]).expect("a change");
        assert_eq!(
            change.to_string(),
            "lost 2000 addresses: 10.96.0.1, 10.96.0.2, 10.96.0.3, 10.96.0.4, 10.96.0.5 and \
             1995 more"
        );
    }

    #[test]
    fn changes_before_one_sync_add_up_to_their_net_effect() {
        let change = |was: &[&str], now: &[&str]| {
            AddressChange::between(&ips(was), &ips(now)).expect("a change")
        };
        let table = [
            (
                "two gains",
                change(&["10.0.0.1"], &["10.0.0.1", "10.0.0.2"]),
                change(
                    &["10.0.0.1", "10.0.0.2"],
                    &["10.0.0.1", "10.0.0.2", "10.0.0.3"],
                ),
                Some("gained 10.0.0.2, 10.0.0.3"),
            ),
            (
                "gained then lost",
                change(&["10.0.0.1"], &["10.0.0.1", "10.0.0.2"]),
                change(&["10.0.0.1", "10.0.0.2"], &["10.0.0.1"]),
                None,
            ),
            (
                "lost then gained back, and one more lost",
                change(&["10.0.0.1", "10.0.0.2"], &["10.0.0.1"]),
                change(&["10.0.0.1"], &["10.0.0.2"]),
                Some("lost 10.0.0.1"),
            ),
        ];
        for (what, first, second, want) in table {
            let got = first.then(second).map(|c| c.to_string());
            assert_eq!(got.as_deref(), want, "{what}");
        }
    }

    #[test]
    fn link_local_addresses_are_not_followed() {
        assert_eq!(
            without_link_local(ips(&[
                "fe80::1",
                "10.0.0.2",
                "169.254.1.1",
                "fd00::1",
                "10.0.0.2"
            ])),
            ips(&["10.0.0.2", "fd00::1"])
        );
    }
}
