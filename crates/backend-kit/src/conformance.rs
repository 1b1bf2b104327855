//! The backend contract, checked at the fake level for any backend.
//!
//! The real-packet suite (`crates/kpng/tests/e2e`) proves what packets do; it needs root and
//! network namespaces. These scenarios prove, in milliseconds and without root, that a backend
//! keeps the contract of [`kpng_backend::Backend`] for each Service feature the real-packet
//! suite covers: it programs the feature, removes it without a trace, does nothing when nothing
//! changed, converges after a failure with a full sync, and cleans up everything. The scenario
//! names mirror the real-packet suite's, so a new backend runs both lists.
//!
//! A backend joins with a [`Harness`] (the backend over its fake data plane) and one line:
//!
//! ```ignore
//! kpng_backend_kit::conformance_tests!(|| MyHarness::new());
//! ```

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use kpng_backend::{Backend, SyncRequest};
use kpng_model::{
    Change, Diff, Endpoint, Family, NodeState, PortKey, Protocol, ServiceKey, ServicePort,
    SessionAffinity, Snapshot,
};

/// A backend over a fake data plane.
pub trait Harness {
    /// The backend under test.
    fn backend(&mut self) -> &mut dyn Backend;
    /// How many objects the data plane holds for Services and the node (rules, set elements,
    /// capture entries, …), as the backend committed them.
    fn objects(&self) -> usize;
    /// Makes the next data-plane transaction fail.
    fn fail_next(&mut self);
}

/// One scenario: runs against a fresh harness and panics with what broke.
pub type Scenario = fn(&mut dyn Harness);

/// The scenarios, by name: the real-packet suite's scenario each one mirrors is named in its
/// doc comment.
pub const SCENARIOS: &[(&str, Scenario)] = &[
    ("cluster_ip", cluster_ip),
    ("udp_services", udp_services),
    ("wrong_port_unallocated_ip_and_no_endpoints", no_endpoints),
    ("node_port", node_port),
    (
        "external_ip_and_load_balancer_source_ranges",
        external_ip_and_load_balancer_source_ranges,
    ),
    (
        "external_traffic_policy_local",
        external_traffic_policy_local,
    ),
    (
        "internal_traffic_policy_local",
        internal_traffic_policy_local,
    ),
    ("session_affinity_client_ip", session_affinity_client_ip),
    (
        "terminating_endpoints_fallback",
        terminating_endpoints_fallback,
    ),
    (
        "ipv6_cluster_ip_and_node_port",
        ipv6_cluster_ip_and_node_port,
    ),
    ("live_changes_are_minimal", live_changes_are_minimal),
    (
        "a_failed_sync_is_repaired_by_a_full_sync",
        failed_sync_then_full,
    ),
    ("nothing_is_left_behind", nothing_is_left_behind),
];

/// Generates one `#[test]` per scenario for the harness `make` builds (a closure or function
/// returning a fresh harness).
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@tests $make;
            cluster_ip,
            udp_services,
            wrong_port_unallocated_ip_and_no_endpoints,
            node_port,
            external_ip_and_load_balancer_source_ranges,
            external_traffic_policy_local,
            internal_traffic_policy_local,
            session_affinity_client_ip,
            terminating_endpoints_fallback,
            ipv6_cluster_ip_and_node_port,
            live_changes_are_minimal,
            a_failed_sync_is_repaired_by_a_full_sync,
            nothing_is_left_behind,
        );
    };
    (@tests $make:expr; $($name:ident),* $(,)?) => {
        mod conformance {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[test]
                fn $name() {
                    let mut harness = ($make)();
                    $crate::conformance::run(stringify!($name), &mut harness);
                }
            )*
            #[test]
            fn every_scenario_is_generated() {
                let generated = [$(stringify!($name)),*];
                let listed: Vec<&str> =
                    $crate::conformance::SCENARIOS.iter().map(|(n, _)| *n).collect();
                assert_eq!(generated.as_slice(), listed.as_slice());
            }
        }
    };
}

/// Runs one scenario by name.
pub fn run(name: &str, harness: &mut dyn Harness) {
    let Some((_, scenario)) = SCENARIOS.iter().find(|(n, _)| *n == name) else {
        panic!("no conformance scenario {name}");
    };
    scenario(harness);
}

/// A node with IPs in both families, where these scenarios' endpoints `10.244.1.*` are local.
fn node() -> NodeState {
    NodeState {
        name: "node1".into(),
        ips: vec![ip("192.168.100.1"), ip("fd00:100::1")],
        pod_cidrs: vec!["10.244.1.0/24".parse().expect("cidr")],
        ..NodeState::default()
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn key(name: &str, protocol: Protocol, family: Family) -> PortKey {
    PortKey {
        service: ServiceKey::new("default", name),
        port_name: "p".into(),
        protocol,
        family,
    }
}

fn endpoint(addr: &str, local: bool) -> Endpoint {
    let sa: SocketAddr = addr.parse().expect("socket address");
    Endpoint {
        ip: sa.ip(),
        port: sa.port(),
        is_local: local,
        ready: true,
        serving: true,
        terminating: false,
    }
}

/// A ClusterIP port with endpoints `10.244.1.2:8080` (local) and `10.244.2.2:8080`.
fn port(name: &str, cluster_ip: &str, protocol: Protocol) -> ServicePort {
    let cluster_ip = ip(cluster_ip);
    let family = Family::of(&cluster_ip);
    let (local, remote) = match family {
        Family::V4 => ("10.244.1.2:8080", "10.244.2.2:8080"),
        Family::V6 => ("[fd00:10:244:1::2]:8080", "[fd00:10:244:2::2]:8080"),
    };
    let mut sp = ServicePort::new(key(name, protocol, family), cluster_ip, 80);
    sp.cluster_endpoints = vec![endpoint(local, true), endpoint(remote, false)];
    sp.local_endpoints = vec![endpoint(local, true)];
    sp.has_any_endpoints = true;
    sp.local_ready_endpoints = 1;
    sp.serving_endpoints = sp.cluster_endpoints.iter().map(Endpoint::addr).collect();
    sp
}

/// The backend's view while a scenario runs: the snapshot it was last told about.
struct Run<'h> {
    harness: &'h mut dyn Harness,
    snapshot: Snapshot,
}

impl<'h> Run<'h> {
    /// Starts from an empty cluster on [`node`], synced in full.
    fn start(harness: &'h mut dyn Harness) -> Run<'h> {
        let mut run = Run {
            harness,
            snapshot: Snapshot {
                node: node(),
                ..Snapshot::default()
            },
        };
        run.sync_full()
            .expect("the first full sync of an empty cluster");
        run
    }

    fn sync(&mut self, diff: &Diff, full: bool) -> Result<usize, String> {
        let request = SyncRequest {
            diff,
            snapshot: &self.snapshot,
            full,
        };
        self.harness
            .backend()
            .sync(&request)
            .map(|stats| stats.operations)
            .map_err(|e| e.to_string())
    }

    fn sync_full(&mut self) -> Result<usize, String> {
        let diff = Diff::full(&self.snapshot);
        self.sync(&diff, true)
    }

    /// Replaces (or adds, or with `None` removes) the ports of `changes` and syncs only that.
    fn change(&mut self, changes: Vec<(PortKey, Option<ServicePort>)>) -> Result<usize, String> {
        let mut diff = Diff::default();
        for (key, new) in changes {
            let new = new.map(Arc::new);
            let old = match &new {
                Some(port) => self.snapshot.ports.insert(key.clone(), port.clone()),
                None => self.snapshot.ports.remove(&key),
            };
            diff.changes.insert(key, Change { old, new });
        }
        self.sync(&diff, false)
    }

    fn add(&mut self, port: ServicePort) -> usize {
        let key = port.key.clone();
        self.change(vec![(key.clone(), Some(port))])
            .unwrap_or_else(|e| panic!("adding {key}: {e}"))
    }

    fn remove(&mut self, key: &PortKey) -> usize {
        self.change(vec![(key.clone(), None)])
            .unwrap_or_else(|e| panic!("removing {key}: {e}"))
    }

    /// Nothing changed: a partial sync must cost nothing.
    fn assert_quiet(&mut self, after: &str) {
        let ops = self
            .sync(&Diff::default(), false)
            .unwrap_or_else(|e| panic!("an empty sync after {after}: {e}"));
        assert_eq!(ops, 0, "an empty sync after {after} sent {ops} operations");
    }

    fn objects(&self) -> usize {
        self.harness.objects()
    }
}

/// Adds `port`, checks that it is programmed and that nothing else is to do, then removes it
/// and checks that the data plane is back to what it was: the shape of most scenarios.
fn programs_and_removes(harness: &mut dyn Harness, what: &str, port: ServicePort) {
    let mut run = Run::start(harness);
    let before = run.objects();
    let key = port.key.clone();
    let ops = run.add(port);
    assert!(ops > 0, "{what}: adding it sent no operation");
    assert!(
        run.objects() > before,
        "{what}: the data plane holds nothing more ({before} objects)"
    );
    run.assert_quiet(&format!("adding {what}"));
    let ops = run.remove(&key);
    assert!(ops > 0, "{what}: removing it sent no operation");
    assert_eq!(
        run.objects(),
        before,
        "{what}: removing it did not restore the data plane"
    );
    run.assert_quiet(&format!("removing {what}"));
}

/// Mirrors `cluster_ip_from_pod_spreads_over_all_endpoints_without_masquerade`.
fn cluster_ip(h: &mut dyn Harness) {
    programs_and_removes(h, "a ClusterIP", port("web", "10.96.0.10", Protocol::Tcp));
}

/// Mirrors `udp_services_are_load_balanced`.
fn udp_services(h: &mut dyn Harness) {
    programs_and_removes(
        h,
        "a UDP ClusterIP",
        port("dns", "10.96.0.53", Protocol::Udp),
    );
}

/// Mirrors `wrong_port_unallocated_ip_and_no_endpoints`: a Service without endpoints is
/// programmed too (it rejects), and gaining endpoints is a change.
fn no_endpoints(h: &mut dyn Harness) {
    let mut empty = port("empty", "10.96.0.20", Protocol::Tcp);
    empty.cluster_endpoints.clear();
    empty.local_endpoints.clear();
    empty.serving_endpoints.clear();
    empty.has_any_endpoints = false;
    empty.local_ready_endpoints = 0;
    programs_and_removes(h, "a Service without endpoints", empty.clone());
    let mut run = Run::start(h);
    run.add(empty);
    run.add(port("empty", "10.96.0.20", Protocol::Tcp));
    run.assert_quiet("endpoints appearing");
}

/// Mirrors `node_port_default_addresses_and_loopback`.
fn node_port(h: &mut dyn Harness) {
    let mut sp = port("np", "10.96.0.30", Protocol::Tcp);
    sp.node_port = Some(30080);
    programs_and_removes(h, "a NodePort", sp.clone());
    let cluster_ip_only = ServicePort {
        node_port: None,
        ..sp.clone()
    };
    holds_more_than(h, "a NodePort", sp, "its ClusterIP alone", cluster_ip_only);
}

/// Programs `lesser`, then `port` (the same Service port with a frontend more), each alone,
/// and checks that `port` holds more of the data plane: a backend that ignored the frontend
/// `port` adds (a node port, an external IP) passed the count of [`programs_and_removes`],
/// since the ClusterIP alone is "more than nothing".
fn holds_more_than(
    harness: &mut dyn Harness,
    what: &str,
    port: ServicePort,
    lesser_what: &str,
    lesser: ServicePort,
) {
    let mut run = Run::start(harness);
    let before = run.objects();
    let key = port.key.clone();
    run.add(lesser);
    let less = run.objects().saturating_sub(before);
    run.remove(&key);
    run.add(port);
    let more = run.objects().saturating_sub(before);
    run.remove(&key);
    assert!(
        more > less,
        "{what}: holds {more} objects, no more than {lesser_what} ({less}): is the frontend \
         programmed?"
    );
    run.assert_quiet(&format!("adding and removing {what}"));
}

/// Mirrors `external_ip_and_load_balancer_source_ranges`.
fn external_ip_and_load_balancer_source_ranges(h: &mut dyn Harness) {
    let mut sp = port("lb", "10.96.0.40", Protocol::Tcp);
    sp.node_port = Some(30040);
    sp.external_ips = vec![ip("192.168.100.50")];
    sp.load_balancer_ips = vec![ip("192.168.100.60")];
    sp.source_ranges = vec!["203.0.113.0/24".parse().expect("cidr")];
    programs_and_removes(
        h,
        "external and LoadBalancer IPs with source ranges",
        sp.clone(),
    );
    let node_port_only = ServicePort {
        external_ips: Vec::new(),
        load_balancer_ips: Vec::new(),
        source_ranges: Vec::new(),
        ..sp.clone()
    };
    let external_only = ServicePort {
        load_balancer_ips: Vec::new(),
        source_ranges: Vec::new(),
        ..sp.clone()
    };
    holds_more_than(
        h,
        "an external IP",
        external_only.clone(),
        "its NodePort alone",
        node_port_only,
    );
    let load_balancer = ServicePort {
        source_ranges: Vec::new(),
        ..sp
    };
    holds_more_than(
        h,
        "a LoadBalancer IP",
        load_balancer,
        "its external IP alone",
        external_only,
    );
}

/// Mirrors `external_traffic_policy_local`.
fn external_traffic_policy_local(h: &mut dyn Harness) {
    let mut sp = port("etp", "10.96.0.50", Protocol::Tcp);
    sp.node_port = Some(30050);
    sp.load_balancer_ips = vec![ip("192.168.100.70")];
    sp.external_policy_local = true;
    sp.health_check_node_port = Some(31050);
    programs_and_removes(h, "externalTrafficPolicy Local", sp);
}

/// Mirrors `internal_traffic_policy_local`.
fn internal_traffic_policy_local(h: &mut dyn Harness) {
    let mut sp = port("itp", "10.96.0.60", Protocol::Tcp);
    sp.internal_policy_local = true;
    programs_and_removes(h, "internalTrafficPolicy Local", sp);
}

/// Mirrors `session_affinity_client_ip`.
fn session_affinity_client_ip(h: &mut dyn Harness) {
    let mut sp = port("sticky", "10.96.0.70", Protocol::Tcp);
    sp.session_affinity = Some(SessionAffinity {
        timeout_seconds: 10_800,
    });
    programs_and_removes(h, "ClientIP affinity", sp);
}

/// Mirrors `terminating_endpoints_fallback`: the model hands a backend the serving,
/// terminating endpoints as the list to use; a backend programs them like any others.
fn terminating_endpoints_fallback(h: &mut dyn Harness) {
    let mut sp = port("term", "10.96.0.80", Protocol::Tcp);
    for e in sp
        .cluster_endpoints
        .iter_mut()
        .chain(sp.local_endpoints.iter_mut())
    {
        e.ready = false;
        e.terminating = true;
    }
    sp.local_ready_endpoints = 0;
    programs_and_removes(h, "terminating endpoints", sp);
}

/// Mirrors `ipv6_cluster_ip_and_node_port`.
fn ipv6_cluster_ip_and_node_port(h: &mut dyn Harness) {
    let mut sp = port("web6", "fd00:96::10", Protocol::Tcp);
    sp.node_port = Some(30060);
    programs_and_removes(h, "an IPv6 ClusterIP and node port", sp);
}

/// Mirrors `live_changes_and_restart_keep_established_connections`: a change touches only what
/// it changes, and a full sync of an unchanged state leaves the data plane as it is.
fn live_changes_are_minimal(h: &mut dyn Harness) {
    let mut run = Run::start(h);
    let ports: BTreeMap<String, ServicePort> = (0..20)
        .map(|i| {
            let name = format!("svc{i}");
            let sp = port(&name, &format!("10.96.1.{}", i + 1), Protocol::Tcp);
            (name, sp)
        })
        .collect();
    let all: Vec<(PortKey, Option<ServicePort>)> = ports
        .values()
        .map(|sp| (sp.key.clone(), Some(sp.clone())))
        .collect();
    let first = run.change(all).expect("adding 20 Services");
    let objects = run.objects();
    // One endpoint of one Service moves: a small fraction of what 20 Services cost.
    let mut moved = ports["svc7"].clone();
    moved.cluster_endpoints[1] = endpoint("10.244.2.9:8080", false);
    moved.serving_endpoints = moved.cluster_endpoints.iter().map(Endpoint::addr).collect();
    // (A proxy may have nothing to send for an endpoint change: its data plane holds no
    // endpoints.)
    let ops = run.add(moved);
    assert!(
        ops * 5 <= first,
        "an endpoint change of one Service sent {ops} operations, adding 20 sent {first}"
    );
    assert_eq!(
        run.objects(),
        objects,
        "an endpoint swap changed the object count"
    );
    run.assert_quiet("an endpoint change");
    run.sync_full().expect("a full sync of an unchanged state");
    assert_eq!(
        run.objects(),
        objects,
        "a full sync changed the object count"
    );
    run.assert_quiet("a full sync");
}

/// Mirrors the kernel-refused cases of the fault suite: after a failure the runner asks for a
/// full sync, which must converge from whatever the failed one left.
fn failed_sync_then_full(h: &mut dyn Harness) {
    let mut run = Run::start(h);
    run.add(port("a", "10.96.2.1", Protocol::Tcp));
    let objects_with_a = run.objects();
    run.harness.fail_next();
    let failed = run.change(vec![(
        key("b", Protocol::Tcp, Family::V4),
        Some(port("b", "10.96.2.2", Protocol::Tcp)),
    )]);
    assert!(failed.is_err(), "an injected failure was not reported");
    run.sync_full().expect("the full sync after a failure");
    assert!(
        run.objects() > objects_with_a,
        "the full sync after a failure did not program the new Service"
    );
    run.assert_quiet("the repairing full sync");
    let ops = run.remove(&key("b", Protocol::Tcp, Family::V4));
    assert!(ops > 0);
    assert_eq!(
        run.objects(),
        objects_with_a,
        "removing the repaired Service left objects"
    );
}

/// Mirrors `nothing_is_left_behind`: cleanup removes everything, and a full sync afterwards
/// programs it all again.
fn nothing_is_left_behind(h: &mut dyn Harness) {
    let mut run = Run::start(h);
    let mut np = port("np", "10.96.3.1", Protocol::Udp);
    np.node_port = Some(30300);
    run.add(np);
    let programmed = run.objects();
    run.harness
        .backend()
        .cleanup()
        .unwrap_or_else(|e| panic!("cleanup: {e}"));
    assert_eq!(run.objects(), 0, "cleanup left objects behind");
    run.sync_full().expect("a full sync after cleanup");
    assert_eq!(
        run.objects(),
        programmed,
        "a full sync after cleanup differs"
    );
}
