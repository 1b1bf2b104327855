//! The POLICY cell of `kpng status`'s table, compact, and the detail it leaves out: in full
//! under the port's row when the operator asks about one Service (`kpng status NAME`), for the
//! wide view, or for the ports with a problem (`--problems`).
//!
//! Why: the cell held the traffic policies in words, the affinity, what the health check
//! answers (with where it is not served and how many probes it refused) and every load
//! balancer source range; on a small node one long cell pushed every row of the table past
//! 200 columns, so no line fit a terminal. The cell now abbreviates, a legend under the table
//! says what the abbreviations in it mean, and the long words moved to detail lines.

use kpng_runner::admin::PortStatus;
use kpng_runner::service_health::HealthCheckAnswer;

/// `C` for `Cluster`, `L` for `Local`, anything else as it is.
fn initial(policy: &str) -> &str {
    match policy {
        "Cluster" => "C",
        "Local" => "L",
        other => other,
    }
}

/// The POLICY cell: `EXT/INT` traffic policies (`C`luster, `L`ocal), then `aff Ns` (ClientIP
/// affinity), `hc:PORT ANSWER` (the health check: its HTTP status, `NOT SERVED`, and in
/// capitals when it is served on some addresses only or refuses probes) and `src N` (`N`
/// loadBalancerSourceRanges of this family; `src ALL` when they name none of it).
pub fn cell(p: &PortStatus) -> String {
    let mut cell = format!(
        "{}/{}",
        initial(&p.external_traffic_policy),
        initial(&p.internal_traffic_policy)
    );
    if let Some(t) = p.affinity_timeout_seconds {
        cell.push_str(&format!(" aff {t}s"));
    }
    if let Some(hc) = &p.health_check {
        cell.push_str(&format!(" hc:{} ", hc.port));
        match hc.status {
            Some(status) => cell.push_str(&status.to_string()),
            None => cell.push_str("NOT SERVED"),
        }
        if hc.status.is_some() && hc.not_served.is_some() {
            cell.push_str(" PARTLY");
        }
        if hc.refused_connections.is_some() {
            cell.push_str(" REFUSING");
        }
    }
    if !p.source_ranges.is_empty() {
        cell.push_str(&format!(" src {}", p.source_ranges.len()));
    } else if !p.source_ranges_of_other_families_only.is_empty() {
        cell.push_str(" src ALL");
    }
    cell
}

/// The detail the cell abbreviates, one line each (unindented): what the health check
/// answers and why, and the load balancer's source ranges.
pub fn details(p: &PortStatus) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(hc) = &p.health_check {
        lines.push(health_check_answer(hc));
    }
    if !p.source_ranges.is_empty() {
        lines.push(format!("lb sources {}", join_ranges(&p.source_ranges)));
    } else if !p.source_ranges_of_other_families_only.is_empty() {
        lines.push(format!(
            "lb sources ALL (loadBalancerSourceRanges {} name no {} range)",
            join_ranges(&p.source_ranges_of_other_families_only),
            p.family
        ));
    }
    lines
}

/// The legend under the table: what the abbreviations used in `ports`' POLICY cells mean,
/// and, when `detailed` is false, how to see them in full; `None` without ports.
pub fn legend(ports: &[PortStatus], detailed: bool) -> Option<String> {
    if ports.is_empty() {
        return None;
    }
    let mut parts = vec!["ext/int traffic policy, C Cluster, L Local".to_string()];
    if ports.iter().any(|p| p.affinity_timeout_seconds.is_some()) {
        parts.push("aff ClientIP affinity".into());
    }
    let checks = ports.iter().any(|p| p.health_check.is_some());
    if checks {
        parts.push(
            "hc:PORT the health check's answer (PARTLY: not on every address, REFUSING: probes \
             over its caps)"
                .into(),
        );
    }
    let sources = ports
        .iter()
        .any(|p| !p.source_ranges.is_empty() || !p.source_ranges_of_other_families_only.is_empty());
    if sources {
        parts.push(
            "src N loadBalancerSourceRanges of the family (ALL: none, every source let in)".into(),
        );
    }
    if !detailed && (checks || sources) {
        parts.push("in full: `kpng status NAME`, -o wide or --problems".into());
    }
    Some(format!("POLICY: {}", parts.join("; ")))
}

/// What a load balancer probing the health check gets, in a few words.
pub fn health_check_answer(hc: &HealthCheckAnswer) -> String {
    let why = match (hc.status, hc.local_endpoints) {
        // Why: a server that could not start (also listed on its own), or no listener of the
        // family at all (`--nodeport-addresses` CIDRs matching only another family's address).
        (None, _) => {
            return match &hc.not_served {
                Some(why) => format!("health check :{} NOT SERVED: {why}", hc.port),
                None => format!("health check :{} NOT SERVED", hc.port),
            };
        }
        (Some(200), n) => format!("{n} local"),
        (Some(_), 0) => "no local ready endpoint".to_string(),
        (Some(_), _) => "kpng not healthy".to_string(),
    };
    let answers = format!(
        "health check :{} answers {} ({why})",
        hc.port,
        hc.status.unwrap_or_default()
    );
    let answers = match &hc.not_served {
        // Served on some of the node's addresses only (another family's is missing, say).
        Some(e) => format!("{answers}, NOT SERVED on {e}"),
        None => answers,
    };
    match hc.refused_connections {
        // A flood holds the listener: probers may be refused or have connections closed.
        Some((total, ago)) => format!(
            "{answers}, REFUSING CONNECTIONS over its caps ({total} since it started, the \
             last {ago} s ago; the log names the sources)"
        ),
        None => answers,
    }
}

/// Ranges for a status line, comma-separated.
fn join_ranges(ranges: &[ipnet::IpNet]) -> String {
    ranges
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port with a health check and source ranges, as on a LoadBalancer of a small node.
    fn port(fields: serde_json::Value) -> PortStatus {
        let mut value = serde_json::json!({
            "service": "shop/storefront", "portName": "https", "protocol": "TCP",
            "family": "IPv4", "clusterIp": "10.96.1.20", "port": 443,
            "externalTrafficPolicy": "Local", "internalTrafficPolicy": "Cluster",
            "endpoints": [],
        });
        for (k, v) in fields.as_object().expect("an object") {
            value[k] = v.clone();
        }
        serde_json::from_value(value).expect("a port")
    }

    /// The cell abbreviates; what it leaves out is in the detail lines.
    #[test]
    fn the_policy_cell_is_compact_and_the_detail_is_kept() {
        let hc = |status: Option<u16>, not_served: Option<&str>, refused: bool| {
            let mut hc = serde_json::json!({"port": 32100, "localEndpoints": 1});
            if let Some(s) = status {
                hc["status"] = s.into();
            }
            if let Some(n) = not_served {
                hc["notServed"] = n.into();
            }
            if refused {
                hc["refusedConnections"] = serde_json::json!([12, 3]);
            }
            hc
        };
        let cases = [
            (serde_json::json!({}), "L/C", vec![]),
            (
                serde_json::json!({"externalTrafficPolicy": "Cluster",
                                   "internalTrafficPolicy": "Local",
                                   "affinityTimeoutSeconds": 10800}),
                "C/L aff 10800s",
                vec![],
            ),
            (
                serde_json::json!({"healthCheck": hc(Some(200), None, false)}),
                "L/C hc:32100 200",
                vec!["health check :32100 answers 200 (1 local)"],
            ),
            (
                serde_json::json!({"healthCheck": hc(None, Some("in use"), false)}),
                "L/C hc:32100 NOT SERVED",
                vec!["health check :32100 NOT SERVED: in use"],
            ),
            (
                // A dual-stack Service's IPv6 row, its CIDRs matching an IPv4 address only.
                serde_json::json!({"family": "IPv6", "healthCheck": hc(None,
                    Some("no IPv6 address of the node is inside --nodeport-addresses"), false)}),
                "L/C hc:32100 NOT SERVED",
                vec![
                    "health check :32100 NOT SERVED: no IPv6 address of the node is inside \
                     --nodeport-addresses",
                ],
            ),
            (
                serde_json::json!({"healthCheck": hc(Some(200),
                    Some("[fd00::1]:32100: Address in use"), true)}),
                "L/C hc:32100 200 PARTLY REFUSING",
                vec![
                    "health check :32100 answers 200 (1 local), NOT SERVED on \
                     [fd00::1]:32100: Address in use, REFUSING CONNECTIONS over its caps (12 \
                     since it started, the last 3 s ago; the log names the sources)",
                ],
            ),
            (
                serde_json::json!({"sourceRanges": ["10.1.0.0/16", "192.168.0.0/16"]}),
                "L/C src 2",
                vec!["lb sources 10.1.0.0/16,192.168.0.0/16"],
            ),
            (
                serde_json::json!({"sourceRangesOfOtherFamiliesOnly": ["fd00::/8"]}),
                "L/C src ALL",
                vec!["lb sources ALL (loadBalancerSourceRanges fd00::/8 name no IPv4 range)"],
            ),
        ];
        for (fields, want_cell, want_details) in cases {
            let p = port(fields);
            assert_eq!(cell(&p), want_cell);
            assert_eq!(details(&p), want_details, "{want_cell}");
        }
    }

    /// The legend names the abbreviations in use only, and where the detail is.
    #[test]
    fn the_legend_explains_what_the_cells_use() {
        assert_eq!(legend(&[], false), None);
        let plain = port(serde_json::json!({}));
        assert_eq!(
            legend(std::slice::from_ref(&plain), false).as_deref(),
            Some("POLICY: ext/int traffic policy, C Cluster, L Local")
        );
        let checked = port(serde_json::json!({"healthCheck":
            {"port": 32100, "status": 200, "localEndpoints": 1}}));
        let text = legend(&[plain, checked.clone()], false).expect("a legend");
        assert!(
            text.contains("; hc:PORT the health check's answer")
                && text.ends_with("; in full: `kpng status NAME`, -o wide or --problems"),
            "{text}"
        );
        let detailed = legend(&[checked], true).expect("a legend");
        assert!(!detailed.contains("in full:"), "{detailed}");
    }
}
