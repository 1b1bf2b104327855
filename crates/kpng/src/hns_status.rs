//! `kpng status`'s lines about `to-local hns`: the CNI's HNS network kpng programs, what it
//! keeps there, the planner's warnings that still hold, and the IP family it leaves out on a
//! single-stack network ([`kpng_backend_hns::summary`]).

use std::sync::Arc;

use kpng_backend_hns::summary::{HnsSummary, SharedSummary};
use kpng_runner::admin::{DataPlaneDetail, DataPlaneProbe};

/// The probe reading the backend's published summary.
pub fn probe(summary: SharedSummary) -> DataPlaneProbe {
    Arc::new(move || {
        let copy = summary.lock().map(|s| s.clone()).unwrap_or_default();
        details(&copy)
    })
}

/// The lines for one summary.
fn details(s: &HnsSummary) -> Vec<DataPlaneDetail> {
    let network = match &s.network {
        Some(n) => DataPlaneDetail {
            what: "HNS network".into(),
            state: format!(
                "{} ({}, {}): {} endpoint(s) of this node's pods{}",
                n.name,
                n.network_type,
                n.id,
                n.local_endpoints,
                n.root_endpoint
                    .map(|ip| format!(", root endpoint {ip}"))
                    .unwrap_or_default()
            ),
            problem: None,
        },
        None => DataPlaneDetail {
            what: "HNS network".into(),
            state: "not found yet".into(),
            problem: Some(
                "no sync has found the CNI's network (see the last error): nothing is \
                 programmed"
                    .into(),
            ),
        },
    };
    let shown = 3;
    let mut problem = s
        .warnings
        .iter()
        .take(shown)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    if s.warnings.len() > shown {
        problem.push_str(&format!("; and {} more", s.warnings.len() - shown));
    }
    let objects = DataPlaneDetail {
        what: "HNS objects".into(),
        state: format!(
            "{} load balancer(s), {} remote endpoint(s) kept by kpng",
            s.load_balancers, s.remote_endpoints
        ),
        problem: (!s.warnings.is_empty()).then_some(problem),
    };
    let mut lines = vec![network, objects];
    // A family left out (single-stack on this network) is said every time, not only logged:
    // an IPv6 Service that does not answer on this node has its reason here.
    if let Some(why) = &s.skipped_family {
        lines.push(DataPlaneDetail {
            what: "HNS IP families".into(),
            state: why.clone(),
            problem: None,
        });
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpng_backend_hns::summary::NetworkSummary;

    #[test]
    fn lines_name_the_network_and_the_warnings() {
        let mut s = HnsSummary {
            network: Some(NetworkSummary {
                name: "cbr0".into(),
                id: "5b1e-net".into(),
                network_type: "L2Bridge".into(),
                local_endpoints: 2,
                root_endpoint: Some("10.244.1.1".parse().expect("ip")),
            }),
            load_balancers: 41,
            remote_endpoints: 3,
            warnings: vec![],
            skipped_family: None,
        };
        let lines = details(&s);
        assert_eq!(
            lines[0].state,
            "cbr0 (L2Bridge, 5b1e-net): 2 endpoint(s) of this node's pods, root endpoint 10.244.1.1"
        );
        assert_eq!(
            lines[1].state,
            "41 load balancer(s), 3 remote endpoint(s) kept by kpng"
        );
        assert!(lines.iter().all(|l| l.problem.is_none()));

        s.warnings = (1..=5).map(|i| format!("warning {i}")).collect();
        assert_eq!(
            details(&s)[1].problem.as_deref(),
            Some("warning 1; warning 2; warning 3; and 2 more")
        );
        assert_eq!(
            details(&s).len(),
            2,
            "both families served: no families line"
        );
        s.skipped_family = Some("HNS network cbr0 has no IPv6 subnet".into());
        assert_eq!(details(&s)[2].what, "HNS IP families");
        assert_eq!(details(&s)[2].state, "HNS network cbr0 has no IPv6 subnet");
        s.network = None;
        assert_eq!(details(&s)[0].state, "not found yet");
        assert!(details(&s)[0].problem.is_some());
    }
}
