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

/// The longest link name the kernel accepts, in bytes (`IFNAMSIZ` less its NUL).
pub const LINK_NAME_MAX: usize = 15;

/// Why `name` cannot name a link, as the kernel's `dev_valid_name` refuses it (empty, longer
/// than [`LINK_NAME_MAX`] bytes, `.` or `..`, a `/`, `:` or whitespace), and a `"` or a control
/// character besides: the name is written into nftables rules between quotes, where either
/// would end the string or the line. `None` when the kernel could have such a link.
pub fn link_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("is empty".into());
    }
    if name.len() > LINK_NAME_MAX {
        return Some(format!(
            "is {} bytes long; a link name has at most {LINK_NAME_MAX} (the kernel's IFNAMSIZ)",
            name.len()
        ));
    }
    if name == "." || name == ".." {
        return Some("is not a link name (the kernel refuses \".\" and \"..\")".into());
    }
    if let Some(c) = name
        .chars()
        .find(|c| matches!(c, '/' | ':' | '"') || c.is_whitespace() || c.is_control())
    {
        return Some(format!(
            "has {c:?}; a link name has no '/', ':', '\"', whitespace or control character"
        ));
    }
    None
}

/// Why `value` cannot be `--pod-bridge-interface` (`bridge`) or `--pod-interface-name-prefix`:
/// not a link name ([`link_name_problem`]), or a wildcard (`+`, `*`), which the backends would
/// read differently (iptables' `-i cni+` is a wildcard, nftables' `iifname "cni+"` a literal
/// name, and a prefix's `*` doubled to `cali**` matches nothing). `None` when fine.
pub fn pod_interface_problem(bridge: bool, value: &str) -> Option<String> {
    if let Some(problem) = link_name_problem(value) {
        return Some(problem);
    }
    if value.contains(['+', '*']) {
        return Some(if bridge {
            "a bridge name is exact; for a wildcard use --detect-local-mode \
             InterfaceNamePrefix with the prefix, without `*`"
                .into()
        } else {
            "a prefix matches every name that starts with it (`cali` matches cali1234): give \
             it without `*` or `+`"
                .into()
        });
    }
    None
}

/// [`pod_interface_problem`] for both settings: the first problem, with the setting's
/// names. Checked whenever a value is given, whatever the mode, so that `--write-config-to`
/// never writes one `--config` refuses.
pub fn pod_interfaces_problem(
    bridge_interface: &str,
    interface_name_prefix: &str,
) -> Option<(DetectLocalField, String)> {
    [
        (
            true,
            bridge_interface,
            DetectLocalField {
                field: "bridgeInterface",
                flag: "--pod-bridge-interface",
            },
        ),
        (
            false,
            interface_name_prefix,
            DetectLocalField {
                field: "interfaceNamePrefix",
                flag: "--pod-interface-name-prefix",
            },
        ),
    ]
    .into_iter()
    .filter(|(_, value, _)| !value.is_empty())
    .find_map(|(bridge, value, field)| {
        pod_interface_problem(bridge, value).map(|p| (field, format!("{value:?}: {p}")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names_are_the_kernels_and_carry_no_wildcard() {
        let max = "a".repeat(LINK_NAME_MAX);
        let long = "a".repeat(LINK_NAME_MAX + 1);
        for (bridge, value, problem) in [
            (true, "cni0", None),
            (true, max.as_str(), None),
            (false, "cali", None),
            (false, "veth-x.1", None),
            (true, "cni0\" counter \"", Some("has '\"'")),
            (true, "cni0\" counter", Some("has '\"'")),
            (true, "cni 0", Some("has ' '")),
            (true, "cni0\n", Some("has '\\n'")),
            (true, "cni\u{7}", Some("has '\\u{7}'")),
            (true, "a/b", Some("has '/'")),
            (true, "a:b", Some("has ':'")),
            (true, ".", Some("is not a link name")),
            (false, "..", Some("is not a link name")),
            (
                true,
                long.as_str(),
                Some("is 16 bytes long; a link name has at most 15"),
            ),
            (true, "kube-bridge-interface", Some("is 21 bytes long")),
            (
                true,
                "cni+",
                Some(
                    "a bridge name is exact; for a wildcard use --detect-local-mode \
                     InterfaceNamePrefix with the prefix, without `*`",
                ),
            ),
            (true, "cni*", Some("a bridge name is exact")),
            (false, "cali*", Some("give it without `*` or `+`")),
            (false, "cali+", Some("give it without `*` or `+`")),
        ] {
            let got = pod_interface_problem(bridge, value);
            match problem {
                None => assert_eq!(got, None, "{value:?}"),
                Some(p) => assert!(
                    got.as_deref().is_some_and(|g| g.contains(p)),
                    "{value:?}: {got:?} lacks {p:?}"
                ),
            }
        }
        assert_eq!(pod_interfaces_problem("", ""), None);
        let (field, problem) = pod_interfaces_problem("cni0", "cali*").expect("a problem");
        assert_eq!(field.flag, "--pod-interface-name-prefix");
        assert!(problem.starts_with("\"cali*\": a prefix"), "{problem}");
    }

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
