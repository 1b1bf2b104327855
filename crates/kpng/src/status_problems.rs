//! Which Service ports of `kpng status` have a problem, for `kpng status --problems` and the
//! header's count of them.
//!
//! Why: on a small node (305 Services) `kpng status` printed 614 lines, and the few ports that
//! were wrong were somewhere in them; the operator debugging a Service at night had no way to
//! see only those. A port has a problem when the status already says so in its row or above
//! the table: an endpoint list it needs is empty (traffic rejected or dropped), its health
//! check is not served, answers 503 although it has local endpoints or refuses probes, its
//! load balancer's source ranges do not apply to its family, or its Service had values
//! dropped or its latest version rejected (by this kpng or by its brain).

use kpng_runner::admin::{PortStatus, Status};

/// One kind of problem a Service port has, in the order the header names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PortProblem {
    /// An endpoint list the port needs is empty (`withoutEndpoints`): the Service has no
    /// endpoint, or none usable.
    NoEndpoints,
    /// Only its local endpoint list is empty (eTP or iTP Local, no endpoint on this node): the
    /// Service has endpoints elsewhere, so it is not counted as without endpoints (an operator
    /// would look for them in the EndpointSlices and find them).
    NoLocalEndpoint,
    /// Its health check is not served everywhere, refuses probes, or says unhealthy while it
    /// has local endpoints.
    HealthCheck,
    /// `loadBalancerSourceRanges` name no range of the port's family: every source is let in.
    SourceRanges,
    /// The conversion dropped values of its Service (the rest is in use).
    DroppedValues,
    /// The latest version of its Service is rejected (an older one, or none, is in use).
    Rejected,
}

impl PortProblem {
    /// Every kind, in the header's order.
    pub const ALL: [PortProblem; 6] = [
        PortProblem::NoEndpoints,
        PortProblem::NoLocalEndpoint,
        PortProblem::HealthCheck,
        PortProblem::SourceRanges,
        PortProblem::DroppedValues,
        PortProblem::Rejected,
    ];

    /// The kind's name in `-o json|yaml` (a port's `problems`, `problemCounts`): a stable
    /// camelCase word scripts match on (docs/observability.md).
    pub fn word(self) -> &'static str {
        match self {
            PortProblem::NoEndpoints => "noEndpoints",
            PortProblem::NoLocalEndpoint => "noLocalEndpoint",
            PortProblem::HealthCheck => "healthCheck",
            PortProblem::SourceRanges => "sourceRanges",
            PortProblem::DroppedValues => "droppedValues",
            PortProblem::Rejected => "rejected",
        }
    }

    /// The header's words for ports with this problem.
    pub fn words(self) -> &'static str {
        match self {
            PortProblem::NoEndpoints => "without endpoints",
            PortProblem::NoLocalEndpoint => "without a local endpoint",
            PortProblem::HealthCheck => "health check",
            PortProblem::SourceRanges => "lb sources of another family only",
            PortProblem::DroppedValues => "values dropped",
            PortProblem::Rejected => "Service rejected",
        }
    }
}

/// The problems of `port`, as `status` (its node's) shows them; empty when it has none.
pub fn of_port(port: &PortStatus, status: &Status) -> Vec<PortProblem> {
    let mut found = Vec::new();
    if port.without_endpoints.is_some() {
        found.push(if port.without_local_endpoint_only() {
            PortProblem::NoLocalEndpoint
        } else {
            PortProblem::NoEndpoints
        });
    }
    let check_wrong = port.health_check.as_ref().is_some_and(|hc| {
        hc.status.is_none()
            || hc.not_served.is_some()
            || hc.refused_connections.is_some()
            || (hc.status != Some(200) && hc.local_endpoints > 0)
    }) || status
        .health_checks_not_served
        .iter()
        .any(|c| c.service == port.service);
    if check_wrong {
        found.push(PortProblem::HealthCheck);
    }
    if port.source_ranges.is_empty() && !port.source_ranges_of_other_families_only.is_empty() {
        found.push(PortProblem::SourceRanges);
    }
    let brain = status.brain_reports.as_ref();
    let dropped = status
        .dropped
        .iter()
        .chain(brain.map_or(&[][..], |b| &b.dropped[..]))
        .any(|d| d.service.as_deref() == Some(port.service.as_str()));
    if dropped {
        found.push(PortProblem::DroppedValues);
    }
    let object = format!("Service {}", port.service);
    let rejected = status
        .rejected
        .iter()
        .chain(brain.map_or(&[][..], |b| &b.rejected[..]))
        .any(|r| r.object == object);
    if rejected {
        found.push(PortProblem::Rejected);
    }
    found
}

/// Whether `port` has any problem ([`of_port`]).
pub fn has_any(port: &PortStatus, status: &Status) -> bool {
    !of_port(port, status).is_empty()
}

/// How many Service ports have a problem, of how many, and of which kinds: counted port by
/// port, so that the status page's answer counts over every port of its selection while it
/// holds one page of them at a time (`status_web.rs`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProblemCounts {
    /// Ports with at least one problem.
    ports: usize,
    /// Ports counted, with or without a problem.
    total: usize,
    /// Ports per kind of problem.
    kinds: std::collections::BTreeMap<PortProblem, usize>,
}

impl ProblemCounts {
    /// Counts one port with `problems` ([`of_port`]).
    pub fn add(&mut self, problems: &[PortProblem]) {
        self.total += 1;
        if !problems.is_empty() {
            self.ports += 1;
        }
        for p in problems {
            *self.kinds.entry(*p).or_default() += 1;
        }
    }

    /// How many ports counted have a problem.
    pub fn ports(&self) -> usize {
        self.ports
    }

    /// `PROBLEMS: N of M Service ports (K kind, …)`, as `kpng status` starts its line; `None`
    /// when no port has a problem.
    pub fn summary(&self) -> Option<String> {
        if self.ports == 0 {
            return None;
        }
        let kinds: Vec<String> = self
            .kinds
            .iter()
            .map(|(p, n)| format!("{n} {}", p.words()))
            .collect();
        Some(format!(
            "PROBLEMS: {} of {} Service ports ({})",
            self.ports,
            self.total,
            kinds.join(", ")
        ))
    }
}

/// The header's line when some ports have a problem: how many, of which kinds, and the
/// command that lists only them; `None` when no port has one. `hidden`: how many ports
/// `--problems` left out, when it did (the line then says so, also when none is left).
pub fn header_line(status: &Status, hidden: Option<usize>) -> Option<String> {
    let mut counts = ProblemCounts::default();
    for port in &status.services {
        counts.add(&of_port(port, status));
    }
    counts.total += hidden.unwrap_or(0);
    match (hidden, counts.summary()) {
        (None, None) => None,
        (None, Some(line)) => Some(format!("{line}: `kpng status --problems` lists only them")),
        (Some(_), None) => Some(format!(
            "no Service port has a problem (--problems: {} not shown)",
            counts.total
        )),
        (Some(hidden), Some(line)) => {
            Some(format!("{line}; --problems: the other {hidden} not shown"))
        }
    }
}

/// Keeps, of `status`'s ports, those with a problem; how many were left out.
pub fn keep_ports_with_problems(status: &mut Status) -> usize {
    let keep: Vec<bool> = status.services.iter().map(|p| has_any(p, status)).collect();
    let before = status.services.len();
    let mut flags = keep.into_iter();
    status.services.retain(|_| flags.next().unwrap_or(false));
    before - status.services.len()
}

/// Adds to the status as JSON (`-o json|yaml`) what the table judges, so that a script need
/// not judge it again: each port's `problems` (its kinds' [`PortProblem::word`]s, `[]` when
/// fine), `problemCounts` (ports per kind, every kind named), `portsWithProblems`, and
/// `problemsOnly` (`--problems` was given: `services` keeps the ports with a problem,
/// `portsNotShown` says how many others were left out, and `matchingPorts` counts the kept
/// ones). `typed` is `value` read as a [`Status`], with every rejection and dropped value of
/// the node: the problems are judged on it. How many ports have a problem.
pub fn add_problems_json(value: &mut serde_json::Value, typed: &Status, only: bool) -> usize {
    let found: Vec<Vec<PortProblem>> = typed.services.iter().map(|p| of_port(p, typed)).collect();
    let mut counts = serde_json::Map::new();
    for kind in PortProblem::ALL {
        let n = found.iter().filter(|f| f.contains(&kind)).count();
        counts.insert(kind.word().to_string(), n.into());
    }
    let with_problems = found.iter().filter(|f| !f.is_empty()).count();
    let mut not_shown = 0;
    if let Some(services) = value.get_mut("services").and_then(|s| s.as_array_mut()) {
        for (port, problems) in services.iter_mut().zip(&found) {
            let words: Vec<&str> = problems.iter().map(|p| p.word()).collect();
            port["problems"] = words.into();
        }
        if only {
            let mut kinds = found.iter();
            let before = services.len();
            services.retain(|_| kinds.next().is_some_and(|k| !k.is_empty()));
            not_shown = before - services.len();
            value["matchingPorts"] = with_problems.into();
        }
    }
    value["problemCounts"] = counts.into();
    value["portsWithProblems"] = with_problems.into();
    value["problemsOnly"] = only.into();
    value["portsNotShown"] = not_shown.into();
    with_problems
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port from its JSON fields over a plain ClusterIP port with one used endpoint.
    fn port(service: &str, fields: serde_json::Value) -> PortStatus {
        let mut value = serde_json::json!({
            "service": service, "portName": "http", "protocol": "TCP", "family": "IPv4",
            "clusterIp": "10.96.0.10", "port": 80, "externalTrafficPolicy": "Cluster",
            "internalTrafficPolicy": "Cluster", "endpoints": [],
        });
        for (k, v) in fields.as_object().expect("an object") {
            value[k] = v.clone();
        }
        serde_json::from_value(value).expect("a port")
    }

    /// Each kind of problem the status shows marks its port; a port without one is fine, and
    /// a 503 with no local endpoint is the check doing its job (the load balancer skips the
    /// node), not a problem of the check.
    #[test]
    fn a_port_has_the_problems_the_status_shows() {
        let hc = |status: Option<u16>, local: u32| serde_json::json!({"port": 32100, "status": status, "localEndpoints": local});
        let status = |fields: serde_json::Value| -> Status {
            let mut value = serde_json::json!({
                "node": "n1", "backend": "nftables", "programmed": true,
                "pendingPortChanges": 0, "services": [],
            });
            for (k, v) in fields.as_object().expect("an object") {
                value[k] = v.clone();
            }
            serde_json::from_value(value).expect("a status")
        };
        let none = status(serde_json::json!({}));
        let cases: Vec<(&str, PortStatus, Status, Vec<PortProblem>)> = vec![
            (
                "fine",
                port("ns/a", serde_json::json!({})),
                none.clone(),
                vec![],
            ),
            (
                "no endpoints",
                port(
                    "ns/a",
                    serde_json::json!({"withoutEndpoints": "no endpoints: connections are rejected"}),
                ),
                none.clone(),
                vec![PortProblem::NoEndpoints],
            ),
            (
                "endpoints, none local (eTP Local)",
                port(
                    "ns/a",
                    serde_json::json!({"withoutEndpoints": "no local endpoint: external \
                        connections are dropped (externalTrafficPolicy Local)",
                        "withoutEndpointsDetail": {"reason": "noLocalEndpoint",
                            "traffic": "external", "verdict": "drop"}}),
                ),
                none.clone(),
                vec![PortProblem::NoLocalEndpoint],
            ),
            (
                "check answers 200",
                port("ns/a", serde_json::json!({"healthCheck": hc(Some(200), 1)})),
                none.clone(),
                vec![],
            ),
            (
                "check answers 503, no local endpoint",
                port("ns/a", serde_json::json!({"healthCheck": hc(Some(503), 0)})),
                none.clone(),
                vec![],
            ),
            (
                "check answers 503 with local endpoints",
                port("ns/a", serde_json::json!({"healthCheck": hc(Some(503), 2)})),
                none.clone(),
                vec![PortProblem::HealthCheck],
            ),
            (
                "check not served",
                port("ns/a", serde_json::json!({"healthCheck": hc(None, 1)})),
                none.clone(),
                vec![PortProblem::HealthCheck],
            ),
            (
                "check listed as not served",
                port("ns/a", serde_json::json!({})),
                status(serde_json::json!({"healthChecksNotServed": [
                    {"service": "ns/a", "port": 32100, "message": "in use", "since": "t"}]})),
                vec![PortProblem::HealthCheck],
            ),
            (
                "source ranges of the other family only",
                port(
                    "ns/a",
                    serde_json::json!({"sourceRangesOfOtherFamiliesOnly": ["fd00::/8"]}),
                ),
                none.clone(),
                vec![PortProblem::SourceRanges],
            ),
            (
                "a value dropped from its Service",
                port("ns/a", serde_json::json!({})),
                status(serde_json::json!({"dropped": [{"object": "Service ns/a",
                    "service": "ns/a", "field": "spec.externalIPs[0]", "message": "bad"}]})),
                vec![PortProblem::DroppedValues],
            ),
            (
                "another Service's value dropped",
                port("ns/a", serde_json::json!({})),
                status(serde_json::json!({"dropped": [{"object": "Service ns/b",
                    "service": "ns/b", "field": "spec.externalIPs[0]", "message": "bad"}]})),
                vec![],
            ),
            (
                "its Service rejected by the brain",
                port("ns/a", serde_json::json!({})),
                status(
                    serde_json::json!({"brainReports": {"source": "kube", "healthy": true,
                    "rejected": [{"object": "Service ns/a", "field": "f", "message": "m",
                                  "kept": true}], "rejectedTotal": 1}}),
                ),
                vec![PortProblem::Rejected],
            ),
        ];
        for (what, port, status, want) in cases {
            assert_eq!(of_port(&port, &status), want, "{what}");
        }
    }

    /// The header counts the ports with a problem and their kinds; `--problems` keeps those
    /// ports only, in the table and in JSON.
    #[test]
    fn problems_are_counted_and_selected() {
        let empty = port(
            "ns/empty",
            serde_json::json!({"withoutEndpoints": "no endpoints: connections are rejected"}),
        );
        let fine = port("ns/fine", serde_json::json!({}));
        let remote = port(
            "ns/remote",
            serde_json::json!({"withoutEndpoints": "no local endpoint: ClusterIP connections \
                are dropped (internalTrafficPolicy Local)", "withoutEndpointsDetail": {"reason":
                "noLocalEndpoint", "traffic": "clusterIP", "verdict": "drop"}}),
        );
        let mut with_remote = Status {
            node: "n1".into(),
            services: vec![fine.clone(), empty.clone(), remote.clone(), remote],
            ..Status::default()
        };
        assert_eq!(
            header_line(&with_remote, None).as_deref(),
            Some(
                "PROBLEMS: 3 of 4 Service ports (1 without endpoints, 2 without a local \
                 endpoint): `kpng status --problems` lists only them"
            )
        );
        let mut json = serde_json::to_value(&with_remote).expect("JSON");
        add_problems_json(&mut json, &with_remote, false);
        assert_eq!(
            json["services"][2]["problems"],
            serde_json::json!(["noLocalEndpoint"])
        );
        assert_eq!(json["problemCounts"]["noLocalEndpoint"], 2, "{json}");
        assert_eq!(keep_ports_with_problems(&mut with_remote), 1);
        let mut status = Status {
            node: "n1".into(),
            services: vec![fine.clone(), empty, fine],
            ..Status::default()
        };
        assert_eq!(
            header_line(&status, None).as_deref(),
            Some(
                "PROBLEMS: 1 of 3 Service ports (1 without endpoints): `kpng status --problems` \
                 lists only them"
            )
        );
        let mut json = serde_json::to_value(&status).expect("JSON");
        assert_eq!(add_problems_json(&mut json, &status, false), 1);
        assert_eq!(json["services"].as_array().map(Vec::len), Some(3), "{json}");
        assert_eq!(json["services"][0]["problems"], serde_json::json!([]));
        assert_eq!(
            json["services"][1]["problems"],
            serde_json::json!(["noEndpoints"])
        );
        assert_eq!(
            json["problemCounts"],
            serde_json::json!({"noEndpoints": 1, "noLocalEndpoint": 0, "healthCheck": 0,
                "sourceRanges": 0,
                "droppedValues": 0, "rejected": 0})
        );
        assert_eq!(json["portsWithProblems"], 1);
        assert_eq!(json["problemsOnly"], false);
        let mut json = serde_json::to_value(&status).expect("JSON");
        add_problems_json(&mut json, &status, true);
        assert_eq!(json["services"].as_array().map(Vec::len), Some(1), "{json}");
        assert_eq!(json["services"][0]["service"], "ns/empty");
        assert_eq!(json["matchingPorts"], 1);
        assert_eq!(json["problemsOnly"], true);
        assert_eq!(json["portsNotShown"], 2);
        assert_eq!(keep_ports_with_problems(&mut status), 2);
        assert_eq!(status.services.len(), 1);
        assert_eq!(status.services[0].service, "ns/empty");
        assert_eq!(
            header_line(&status, Some(2)).as_deref(),
            Some(
                "PROBLEMS: 1 of 3 Service ports (1 without endpoints); --problems: the other 2 \
                 not shown"
            )
        );
        status.services.clear();
        assert_eq!(header_line(&status, None), None);
        assert_eq!(
            header_line(&status, Some(3)).as_deref(),
            Some("no Service port has a problem (--problems: 3 not shown)")
        );
    }
}
