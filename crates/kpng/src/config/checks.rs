//! Checks shared by the command line and the configuration file, so that both refuse the same
//! values with the same words, and `--write-config-to` never writes what `--config` refuses.
//! The caller names where the value came from (`--cluster-cidr`, `field clusterCIDR`).

use ipnet::IpNet;

/// `--cluster-cidr` / `clusterCIDR`: at most one CIDR per family (one CIDR, or a dual-stack
/// pair), as kube-proxy's validation says. `None` when the list is fine.
pub fn cluster_cidr_problem(cidrs: &[IpNet]) -> Option<String> {
    let v4 = cidrs.iter().filter(|c| c.addr().is_ipv4()).count();
    if v4 > 1 || cidrs.len() - v4 > 1 {
        let text: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
        return Some(format!(
            "{:?} has two CIDRs of one family (at most one IPv4 and one IPv6)",
            text.join(",")
        ));
    }
    None
}

/// `--nodeport-addresses` / `nodePortAddresses`: `primary` alone, or CIDRs. `None` when the
/// list is fine.
pub fn nodeport_addresses_problem(list: &[String]) -> Option<String> {
    if list.len() > 1 && list.iter().any(|a| a.trim() == "primary") {
        return Some("\"primary\" cannot be combined with CIDRs".to_string());
    }
    list.iter()
        .map(|a| a.trim())
        .filter(|a| *a != "primary")
        .find_map(|a| match a.parse::<IpNet>() {
            Err(_) => Some(format!("{a:?} is not a CIDR or \"primary\"")),
            Ok(net) => kpng_model::ip::unmap_cidr(net, a)
                .err()
                .map(|e| e.to_string()),
        })
}

/// The setting an interface-based `detectLocalMode` needs, by both of its names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DetectLocalField {
    /// The field of `detectLocal` in the file.
    pub field: &'static str,
    /// The command-line flag.
    pub flag: &'static str,
}

/// `detectLocalMode` BridgeInterface or InterfaceNamePrefix without its interface (blank
/// counts as missing): kube-proxy's `validateDetectLocalConfiguration` refuses it at start,
/// so kpng does too rather than failing when the backend starts. `None` when fine.
pub fn detect_local_missing(
    mode: crate::cli::DetectLocalMode,
    bridge_interface: &str,
    interface_name_prefix: &str,
) -> Option<DetectLocalField> {
    use crate::cli::DetectLocalMode;
    match mode {
        DetectLocalMode::BridgeInterface if bridge_interface.trim().is_empty() => {
            Some(DetectLocalField {
                field: "bridgeInterface",
                flag: "--pod-bridge-interface",
            })
        }
        DetectLocalMode::InterfaceNamePrefix if interface_name_prefix.trim().is_empty() => {
            Some(DetectLocalField {
                field: "interfaceNamePrefix",
                flag: "--pod-interface-name-prefix",
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_cidr_per_family() {
        for (list, problem) in [
            (&["10.244.0.0/16"][..], None),
            (&["10.244.0.0/16", "fd00:244::/32"][..], None),
            (&[][..], None),
            (
                &["10.244.0.0/16", "10.245.0.0/16"][..],
                Some("\"10.244.0.0/16,10.245.0.0/16\" has two CIDRs of one family"),
            ),
            (
                &["fd00:244::/32", "10.244.0.0/16", "fd00:245::/32"][..],
                Some("has two CIDRs of one family"),
            ),
        ] {
            let cidrs: Vec<IpNet> = list.iter().map(|c| c.parse().expect("cidr")).collect();
            let got = cluster_cidr_problem(&cidrs);
            match problem {
                None => assert_eq!(got, None, "{list:?}"),
                Some(p) => assert!(got.as_deref().is_some_and(|g| g.contains(p)), "{got:?}"),
            }
        }
    }

    #[test]
    fn primary_alone_or_cidrs() {
        for (list, problem) in [
            (&["primary"][..], None),
            (&["10.0.0.0/8", "fd00::/8"][..], None),
            (
                &["primary", "fd00::/8"][..],
                Some("\"primary\" cannot be combined with CIDRs"),
            ),
            (
                &["fd00::/8", "primary"][..],
                Some("\"primary\" cannot be combined with CIDRs"),
            ),
            (
                &["10.0.0.1"][..],
                Some("\"10.0.0.1\" is not a CIDR or \"primary\""),
            ),
        ] {
            let list: Vec<String> = list.iter().map(|s| s.to_string()).collect();
            assert_eq!(
                nodeport_addresses_problem(&list).as_deref(),
                problem,
                "{list:?}"
            );
        }
    }
}
