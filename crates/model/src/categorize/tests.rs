//! Table-driven tests following upstream `TestCategorizeEndpoints` (current semantics: hints are
//! always honoured, terminating fallback is always on, PreferSameNode is enabled).

use super::*;

/// Endpoint shorthand: address, flags (`R` ready, `S` serving, `T` terminating, `L` local),
/// zone hints, node hints.
struct Ep(
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
);

struct Case {
    name: &'static str,
    zone: Option<&'static str>,
    /// internalTrafficPolicy Local.
    itp_local: bool,
    /// externalTrafficPolicy Local.
    etp_local: bool,
    /// The port has a node port (so it is externally accessible).
    external: bool,
    endpoints: &'static [Ep],
    /// `None`: the port never uses this policy.
    cluster: Option<&'static [&'static str]>,
    local: Option<&'static [&'static str]>,
    has_any: bool,
}

const NODE: &str = "node-a";

fn candidates(eps: &[Ep]) -> Vec<EndpointCandidate> {
    eps.iter()
        .map(|Ep(addr, flags, zones, nodes)| {
            let sa: std::net::SocketAddr = addr.parse().expect("test address");
            EndpointCandidate {
                endpoint: Endpoint {
                    ip: sa.ip(),
                    port: sa.port(),
                    ready: flags.contains('R'),
                    serving: flags.contains('S') || flags.contains('R'),
                    terminating: flags.contains('T'),
                    is_local: flags.contains('L'),
                },
                zone_hints: zones.iter().map(|s| s.to_string()).collect(),
                node_hints: nodes.iter().map(|s| s.to_string()).collect(),
            }
        })
        .collect()
}

const ZONED: &[Ep] = &[
    Ep("10.1.2.3:80", "R", &["zone-a"], &[]),
    Ep("10.1.2.4:80", "R", &["zone-b"], &[]),
    Ep("10.1.2.5:80", "R", &["zone-c"], &[]),
    Ep("10.1.2.6:80", "R", &["zone-a"], &[]),
];
const ALL_ZONED: &[&str] = &["10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80", "10.1.2.6:80"];

const CASES: &[Case] = &[
    Case {
        name: "zone hints for our zone filter cluster endpoints",
        zone: Some("zone-a"),
        itp_local: false,
        etp_local: false,
        external: false,
        endpoints: ZONED,
        cluster: Some(&["10.1.2.3:80", "10.1.2.6:80"]),
        local: None,
        has_any: true,
    },
    Case {
        name: "eTP Local: topology ignored for local endpoints",
        zone: Some("zone-a"),
        itp_local: false,
        etp_local: true,
        external: true,
        endpoints: &[
            Ep("10.1.2.3:80", "RL", &["zone-a"], &[]),
            Ep("10.1.2.4:80", "RL", &["zone-b"], &[]),
            Ep("10.1.2.5:80", "R", &["zone-c"], &[]),
            Ep("10.1.2.6:80", "R", &["zone-a"], &[]),
        ],
        cluster: Some(&["10.1.2.3:80", "10.1.2.6:80"]),
        local: Some(&["10.1.2.3:80", "10.1.2.4:80"]),
        has_any: true,
    },
    Case {
        name: "iTP Local with node port: topology ignored for local endpoints",
        zone: Some("zone-a"),
        itp_local: true,
        etp_local: false,
        external: true,
        endpoints: &[
            Ep("10.1.2.3:80", "RL", &["zone-a"], &[]),
            Ep("10.1.2.4:80", "RL", &["zone-b"], &[]),
            Ep("10.1.2.5:80", "R", &["zone-c"], &[]),
            Ep("10.1.2.6:80", "R", &["zone-a"], &[]),
        ],
        cluster: Some(&["10.1.2.3:80", "10.1.2.6:80"]),
        local: Some(&["10.1.2.3:80", "10.1.2.4:80"]),
        has_any: true,
    },
    Case {
        name: "node without zone label ignores zone hints",
        zone: None,
        itp_local: false,
        etp_local: false,
        external: false,
        endpoints: &[Ep("10.1.2.3:80", "R", &["zone-a"], &[])],
        cluster: Some(&["10.1.2.3:80"]),
        local: None,
        has_any: true,
    },
    Case {
        name: "empty zone label ignores zone hints",
        zone: Some(""),
        itp_local: false,
        etp_local: false,
        external: false,
        endpoints: &[Ep("10.1.2.3:80", "R", &["zone-a"], &[])],
        cluster: Some(&["10.1.2.3:80"]),
        local: None,
        has_any: true,
    },
    Case {
        name: "node in a zone nobody is hinted for: no filtering",
        zone: Some("zone-b"),
        itp_local: false,
        etp_local: false,
        external: false,
        endpoints: &[Ep("10.1.2.3:80", "R", &["zone-a"], &[])],
        cluster: Some(&["10.1.2.3:80"]),
        local: None,
        has_any: true,
    },
    Case {
        name: "unready endpoint in our zone is not used",
        zone: Some("zone-a"),
        itp_local: false,
        etp_local: false,
        external: false,
        endpoints: &[
            Ep("10.1.2.3:80", "R", &["zone-a"], &[]),
            Ep("10.1.2.4:80", "R", &["zone-b"], &[]),
            Ep("10.1.2.5:80", "R", &["zone-c"], &[]),
            Ep("10.1.2.6:80", "", &["zone-a"], &[]),
        ],
        cluster: Some(&["10.1.2.3:80"]),
        local: None,
        has_any: true,
    },
    Case {
        name: "only unready endpoints in our zone: hints ignored",
        zone: Some("zone-a"),
        itp_local: false,
        etp_local: false,
        external: false,
        endpoints: &[
            Ep("10.1.2.3:80", "", &["zone-a"], &[]),
            Ep("10.1.2.4:80", "R", &["zone-b"], &[]),
            Ep("10.1.2.5:80", "R", &["zone-c"], &[]),
            Ep("10.1.2.6:80", "", &["zone-a"], &[]),
        ],
        cluster: Some(&["10.1.2.4:80", "10.1.2.5:80"]),
        local: None,
        has_any: true,
    },
    Case {
        name: "one ready endpoint without hints: hints ignored",
        zone: Some("zone-a"),
        itp_local: false,
        etp_local: false,
        external: false,
        endpoints: &[
            Ep("10.1.2.3:80", "R", &["zone-a"], &[]),
            Ep("10.1.2.4:80", "R", &["zone-b"], &[]),
            Ep("10.1.2.5:80", "R", &[], &[]),
            Ep("10.1.2.6:80", "R", &["zone-a"], &[]),
        ],
        cluster: Some(ALL_ZONED),
        local: None,
        has_any: true,
    },
    Case {
        name: "multiple zone hints per endpoint",
        zone: Some("zone-c"),
        itp_local: false,
        etp_local: false,
        external: false,
        endpoints: &[
            Ep("10.1.2.3:80", "R", &["zone-a", "zone-b", "zone-c"], &[]),
            Ep("10.1.2.4:80", "R", &["zone-b", "zone-c"], &[]),
            Ep("10.1.2.5:80", "R", &["zone-b", "zone-d"], &[]),
            Ep("10.1.2.6:80", "R", &["zone-c"], &[]),
        ],
        cluster: Some(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"]),
        local: None,
        has_any: true,
    },
    Case {
        name: "conflicting topology and locality",
        zone: Some("zone-a"),
        itp_local: false,
        etp_local: true,
        external: true,
        endpoints: &[
            Ep("10.0.0.0:80", "RL", &["zone-a"], &[]),
            Ep("10.0.0.1:80", "RL", &["zone-b"], &[]),
            Ep("10.0.0.2:80", "R", &["zone-a"], &[]),
            Ep("10.0.0.3:80", "R", &["zone-b"], &[]),
        ],
        cluster: Some(&["10.0.0.0:80", "10.0.0.2:80"]),
        local: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        has_any: true,
    },
    Case {
        name: "node hints for our node win over zone hints (PreferSameNode)",
        zone: Some("zone-a"),
        itp_local: false,
        etp_local: false,
        external: false,
        endpoints: &[
            Ep("10.0.0.1:80", "R", &["zone-a"], &["node-a"]),
            Ep("10.0.0.2:80", "R", &["zone-a"], &["node-b"]),
            Ep("10.0.0.3:80", "R", &["zone-b"], &["node-c"]),
        ],
        cluster: Some(&["10.0.0.1:80"]),
        local: None,
        has_any: true,
    },
    Case {
        name: "node hints not naming us fall back to zone hints",
        zone: Some("zone-a"),
        itp_local: false,
        etp_local: false,
        external: false,
        endpoints: &[
            Ep("10.0.0.1:80", "R", &["zone-a"], &["node-x"]),
            Ep("10.0.0.2:80", "R", &["zone-a"], &["node-b"]),
            Ep("10.0.0.3:80", "R", &["zone-b"], &["node-c"]),
        ],
        cluster: Some(&["10.0.0.1:80", "10.0.0.2:80"]),
        local: None,
        has_any: true,
    },
    Case {
        name: "one endpoint without node hints: node hints ignored",
        zone: None,
        itp_local: false,
        etp_local: false,
        external: false,
        endpoints: &[
            Ep("10.0.0.1:80", "R", &[], &["node-a"]),
            Ep("10.0.0.2:80", "R", &[], &[]),
        ],
        cluster: Some(&["10.0.0.1:80", "10.0.0.2:80"]),
        local: None,
        has_any: true,
    },
    Case {
        name: "iTP Local, no endpoints",
        zone: None,
        itp_local: true,
        etp_local: false,
        external: false,
        endpoints: &[],
        cluster: None,
        local: Some(&[]),
        has_any: false,
    },
    Case {
        name: "iTP Local, all endpoints remote",
        zone: None,
        itp_local: true,
        etp_local: false,
        external: false,
        endpoints: &[
            Ep("10.0.0.0:80", "R", &[], &[]),
            Ep("10.0.0.1:80", "R", &[], &[]),
        ],
        cluster: None,
        local: Some(&[]),
        has_any: true,
    },
    Case {
        name: "iTP Local, all endpoints local",
        zone: None,
        itp_local: true,
        etp_local: false,
        external: false,
        endpoints: &[
            Ep("10.0.0.0:80", "RL", &[], &[]),
            Ep("10.0.0.1:80", "RL", &[], &[]),
        ],
        cluster: None,
        local: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        has_any: true,
    },
    Case {
        name: "iTP Local, some endpoints local",
        zone: None,
        itp_local: true,
        etp_local: false,
        external: false,
        endpoints: &[
            Ep("10.0.0.0:80", "RL", &[], &[]),
            Ep("10.0.0.1:80", "R", &[], &[]),
        ],
        cluster: None,
        local: Some(&["10.0.0.0:80"]),
        has_any: true,
    },
    Case {
        name: "cluster policy, no endpoint ready or serving",
        zone: None,
        itp_local: false,
        etp_local: false,
        external: false,
        endpoints: &[
            Ep("10.0.0.0:80", "", &[], &[]),
            Ep("10.0.0.1:80", "", &[], &[]),
        ],
        cluster: Some(&[]),
        local: None,
        has_any: false,
    },
    Case {
        name: "cluster policy, some endpoints ready",
        zone: None,
        itp_local: false,
        etp_local: false,
        external: false,
        endpoints: &[
            Ep("10.0.0.0:80", "", &[], &[]),
            Ep("10.0.0.1:80", "R", &[], &[]),
        ],
        cluster: Some(&["10.0.0.1:80"]),
        local: None,
        has_any: true,
    },
    Case {
        name: "cluster policy, all endpoints serving and terminating: fallback",
        zone: None,
        itp_local: false,
        etp_local: false,
        external: false,
        endpoints: &[
            Ep("10.0.0.0:80", "STL", &[], &[]),
            Ep("10.0.0.1:80", "ST", &[], &[]),
        ],
        cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        local: None,
        has_any: true,
    },
    Case {
        name: "terminating but not serving endpoints are never used",
        zone: None,
        itp_local: false,
        etp_local: false,
        external: false,
        endpoints: &[Ep("10.0.0.0:80", "T", &[], &[])],
        cluster: Some(&[]),
        local: None,
        has_any: false,
    },
    Case {
        name: "iTP Local, eTP Cluster, some endpoints local",
        zone: None,
        itp_local: true,
        etp_local: false,
        external: true,
        endpoints: &[
            Ep("10.0.0.0:80", "RL", &[], &[]),
            Ep("10.0.0.1:80", "R", &[], &[]),
        ],
        cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        local: Some(&["10.0.0.0:80"]),
        has_any: true,
    },
    Case {
        name: "iTP Cluster, eTP Local, some endpoints local",
        zone: None,
        itp_local: false,
        etp_local: true,
        external: true,
        endpoints: &[
            Ep("10.0.0.0:80", "RL", &[], &[]),
            Ep("10.0.0.1:80", "R", &[], &[]),
        ],
        cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        local: Some(&["10.0.0.0:80"]),
        has_any: true,
    },
    Case {
        name: "iTP Local, eTP Local, all endpoints remote",
        zone: None,
        itp_local: true,
        etp_local: true,
        external: true,
        endpoints: &[
            Ep("10.0.0.0:80", "R", &[], &[]),
            Ep("10.0.0.1:80", "R", &[], &[]),
        ],
        cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        local: Some(&[]),
        has_any: true,
    },
    Case {
        name: "iTP Local, eTP Local, all endpoints remote and terminating",
        zone: None,
        itp_local: true,
        etp_local: true,
        external: true,
        endpoints: &[
            Ep("10.0.0.0:80", "ST", &[], &[]),
            Ep("10.0.0.1:80", "ST", &[], &[]),
        ],
        cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        local: Some(&[]),
        has_any: true,
    },
    Case {
        name: "eTP Local with terminating endpoints: local falls back independently",
        zone: None,
        itp_local: false,
        etp_local: true,
        external: true,
        endpoints: &[
            Ep("10.0.0.0:80", "R", &[], &[]),
            Ep("10.0.0.1:80", "L", &[], &[]),
            Ep("10.0.0.2:80", "STL", &[], &[]),
            Ep("10.0.0.3:80", "ST", &[], &[]),
        ],
        cluster: Some(&["10.0.0.0:80"]),
        local: Some(&["10.0.0.2:80"]),
        has_any: true,
    },
    Case {
        name: "eTP ignored when not externally accessible",
        zone: None,
        itp_local: false,
        etp_local: true,
        external: false,
        endpoints: &[
            Ep("10.0.0.0:80", "R", &[], &[]),
            Ep("10.0.0.1:80", "RL", &[], &[]),
        ],
        cluster: Some(&["10.0.0.0:80", "10.0.0.1:80"]),
        local: None,
        has_any: true,
    },
    Case {
        name: "no cluster endpoints for an internal-only iTP Local service",
        zone: None,
        itp_local: true,
        etp_local: false,
        external: false,
        endpoints: &[
            Ep("10.0.0.0:80", "R", &[], &[]),
            Ep("10.0.0.1:80", "RL", &[], &[]),
        ],
        cluster: None,
        local: Some(&["10.0.0.1:80"]),
        has_any: true,
    },
    Case {
        name: "local ready endpoint preferred over local terminating one",
        zone: None,
        itp_local: true,
        etp_local: false,
        external: false,
        endpoints: &[
            Ep("10.0.0.0:80", "RL", &[], &[]),
            Ep("10.0.0.1:80", "STL", &[], &[]),
        ],
        cluster: None,
        local: Some(&["10.0.0.0:80"]),
        has_any: true,
    },
];

#[test]
fn categorize_endpoints_table() {
    for case in CASES {
        let uses_cluster = !case.itp_local || case.external;
        let uses_local = case.itp_local || (case.etp_local && case.external);
        let got = categorize_endpoints(
            &candidates(case.endpoints),
            uses_cluster,
            uses_local,
            NODE,
            case.zone,
        );
        let strings = |eps: &[Endpoint]| eps.iter().map(|e| e.to_string()).collect::<Vec<_>>();
        let want = |list: Option<&[&str]>| {
            list.unwrap_or(&[])
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            strings(&got.cluster),
            want(case.cluster),
            "{}: cluster endpoints",
            case.name
        );
        assert_eq!(
            strings(&got.local),
            want(case.local),
            "{}: local endpoints",
            case.name
        );
        assert_eq!(got.has_any, case.has_any, "{}: has_any", case.name);
        assert_eq!(
            uses_cluster,
            case.cluster.is_some(),
            "{}: case declares cluster use",
            case.name
        );
        assert_eq!(
            uses_local,
            case.local.is_some(),
            "{}: case declares local use",
            case.name
        );
    }
}
