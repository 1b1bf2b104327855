//! The backend contract, checked at the fake level for any backend.
//!
//! The real-packet suite (`crates/kpng/tests/e2e`) proves what packets do; it needs root and
//! network namespaces. These scenarios prove, in milliseconds and without root, that a backend
//! keeps the contract of [`kpng_backend::Backend`] for each Service feature the real-packet
//! suite covers: it programs the feature, removes it without a trace, does nothing when nothing
//! changed, converges after a failure with a full sync, and cleans up everything. The scenario
//! names mirror the real-packet suite's, so a new backend runs both lists.
//!
//! Counting objects is not enough: a backend that ignored a traffic policy, sent terminating
//! endpoints traffic while ready ones exist, or forgot a frontend's endpoints would still hold
//! "more objects". So the scenarios also ask the harness where each frontend *dispatches*
//! ([`Harness::dispatch`]), read back from what the backend committed to its fake data plane, and
//! compare it with the endpoints Kubernetes prescribes (written out in each scenario, not
//! derived from the [`ServicePort`] handed to the backend).
//!
//! A backend joins with a [`Harness`] (the backend over its fake data plane) and one line:
//!
//! ```ignore
//! kpng_backend_kit::conformance_tests!(|| MyHarness::new());
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use kpng_backend::{Backend, SyncRequest};
use kpng_model::{
    Change, Diff, Endpoint, EndpointCandidate, Family, NodeState, PortKey, Protocol, ServiceKey,
    ServicePort, SessionAffinity, Snapshot, categorize_endpoints,
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
    /// Where a new connection from `from` to `to` goes, read from what the backend committed
    /// to the fake data plane (its committed set elements and chains, its committed rules, its
    /// capture entries and running listeners), never from the [`ServicePort`]s the scenario
    /// handed it: only then can a scenario catch a backend that programs the wrong endpoints
    /// for a frontend (all endpoints under externalTrafficPolicy Local, terminating ones while
    /// ready ones exist, the cluster list for ClusterIP traffic under internalTrafficPolicy
    /// Local).
    ///
    /// Why `from`: a backend may program one frontend twice (nftables and iptables send
    /// external traffic to an externalTrafficPolicy Local port through a chain that lets pods
    /// and the node itself use every endpoint, and everyone else the local ones only); the
    /// answer is the set of endpoints the data plane may pick for that client, whatever the
    /// random choice would pick for one connection. What the data plane recorded for earlier
    /// connections counts: once a client of a ClientIP-affinity Service has connected
    /// ([`Harness::connect`]), the set is its endpoint alone.
    fn dispatch(&self, to: Frontend, from: Client) -> Dispatch;
    /// Makes one new connection from `from` to `to` through the fake data plane and says where
    /// it went (`To` one endpoint, `Refused` or `Unknown`). The data plane records what it
    /// records for a real connection (ClientIP affinity entries: nftables' `update @affinity`,
    /// iptables' `recent --set`, the userspace proxy's sticky table), and its random choice is
    /// made in turn (round robin over the choices, one step per connection), so that without
    /// affinity two connections in a row reach two endpoints of a Service with two.
    ///
    /// Why: [`Harness::dispatch`] answers for one connection; ClientIP affinity is about the
    /// next ones (the same client keeps its endpoint), which only connections made one after
    /// the other show.
    fn connect(&mut self, to: Frontend, from: Client) -> Dispatch;
}

/// What a client connects to: a ClusterIP, external IP or load-balancer IP with the Service
/// port, or one of [`NODE_IPS`] with a node port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frontend {
    /// The destination address.
    pub ip: IpAddr,
    /// The destination port.
    pub port: u16,
    /// The L4 protocol.
    pub protocol: Protocol,
}

/// Who connects, as far as traffic policies, source ranges and session affinity care: they
/// tell a pod (which may use every endpoint of an externalTrafficPolicy Local port) from a
/// client outside the cluster, a client inside the load-balancer source ranges from one
/// outside them, and one client from another (affinity is per client).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// A pod of this node ([`Client::address`]: inside the node's pod CIDR). The harness's
    /// pod detection (`--detect-local-mode`) must cover both addresses: the node's pod CIDRs
    /// are `10.244.1.0/24` and `fd00:10:244:1::/64` (a cluster CIDR `10.244.0.0/16`,
    /// `fd00:10:244::/48`).
    Pod,
    /// Another pod of this node: a second client for ClientIP affinity.
    OtherPod,
    /// A client outside the cluster, neither a pod nor the node itself, inside the
    /// load-balancer source ranges the scenarios use (`203.0.113.0/24`, `2001:db8::/64`).
    Outside,
    /// A client outside the cluster and outside the load-balancer source ranges the scenarios
    /// use (`198.51.100.9`, `2001:db8:ff::9`).
    Barred,
}

impl Client {
    /// The client's source address in `family`.
    pub fn address(self, family: Family) -> IpAddr {
        match (self, family) {
            (Client::Pod, Family::V4) => ip("10.244.1.100"),
            (Client::Pod, Family::V6) => ip("fd00:10:244:1::100"),
            (Client::OtherPod, Family::V4) => ip("10.244.1.101"),
            (Client::OtherPod, Family::V6) => ip("fd00:10:244:1::101"),
            (Client::Outside, Family::V4) => ip("203.0.113.9"),
            (Client::Outside, Family::V6) => ip("2001:db8::9"),
            (Client::Barred, Family::V4) => ip("198.51.100.9"),
            (Client::Barred, Family::V6) => ip("2001:db8:ff::9"),
        }
    }
}

/// The addresses of the scenarios' node (every node port is served on them; a harness whose
/// data plane asks "is this a local address?" answers from this list).
pub const NODE_IPS: [&str; 2] = ["192.168.100.1", "fd00:100::1"];

/// What the data plane does with a new connection to a [`Frontend`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dispatch {
    /// Nothing of the backend's matches: the connection passes as if no Service existed.
    Unknown,
    /// Rejected or dropped (no endpoint may serve this client).
    Refused,
    /// Sent to one of these endpoints (the whole set the data plane may choose from).
    To(BTreeSet<SocketAddr>),
}

impl Dispatch {
    /// A dispatch to these endpoints (`IP:port` texts).
    pub fn to(endpoints: &[&str]) -> Dispatch {
        Dispatch::To(
            endpoints
                .iter()
                .map(|e| e.parse().expect("socket address"))
                .collect(),
        )
    }
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
        "load_balancer_source_ranges_refuse_other_clients",
        load_balancer_source_ranges_refuse_other_clients,
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
    ("session_affinity_sticks", session_affinity_sticks),
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
            load_balancer_source_ranges_refuse_other_clients,
            external_traffic_policy_local,
            internal_traffic_policy_local,
            session_affinity_client_ip,
            session_affinity_sticks,
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
        ips: NODE_IPS.iter().map(|a| ip(a)).collect(),
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
    endpoint_in(addr, local, State::Ready)
}

/// An endpoint's conditions, as its EndpointSlice says them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Ready (and serving).
    Ready,
    /// Terminating but still serving: used only where no ready endpoint is.
    Terminating,
    /// Terminating and no longer serving: never used.
    Gone,
}

fn endpoint_in(addr: &str, local: bool, state: State) -> Endpoint {
    let sa: SocketAddr = addr.parse().expect("socket address");
    Endpoint {
        ip: sa.ip(),
        port: sa.port(),
        is_local: local,
        ready: state == State::Ready,
        serving: state != State::Gone,
        terminating: state != State::Ready,
    }
}

/// The local and the remote endpoint of [`port`], per family.
fn endpoint_addrs(family: Family) -> (&'static str, &'static str) {
    match family {
        Family::V4 => (LOCAL, REMOTE),
        Family::V6 => ("[fd00:10:244:1::2]:8080", "[fd00:10:244:2::2]:8080"),
    }
}

/// The endpoint on this node (in its pod CIDR `10.244.1.0/24`).
const LOCAL: &str = "10.244.1.2:8080";
/// An endpoint on another node.
const REMOTE: &str = "10.244.2.2:8080";
/// Another endpoint on another node.
const REMOTE2: &str = "10.244.2.3:8080";
/// The node's IPv4 address, where node ports are served.
const NODE: &str = NODE_IPS[0];

/// A ClusterIP port with endpoints `10.244.1.2:8080` (local) and `10.244.2.2:8080`.
fn port(name: &str, cluster_ip: &str, protocol: Protocol) -> ServicePort {
    let family = Family::of(&ip(cluster_ip));
    let (local, remote) = endpoint_addrs(family);
    port_over(
        name,
        cluster_ip,
        protocol,
        &[endpoint(local, true), endpoint(remote, false)],
        |_| {},
    )
}

/// A port over `endpoints` with `shape` (frontends, policies, affinity) applied, whose endpoint
/// lists are those the model hands a backend: chosen by [`categorize_endpoints`] (policies,
/// terminating fallback), sorted, with the counts that go with them.
fn port_over(
    name: &str,
    cluster_ip: &str,
    protocol: Protocol,
    endpoints: &[Endpoint],
    shape: impl FnOnce(&mut ServicePort),
) -> ServicePort {
    let cluster_ip = ip(cluster_ip);
    let family = Family::of(&cluster_ip);
    let mut sp = ServicePort::new(key(name, protocol, family), cluster_ip, 80);
    shape(&mut sp);
    let candidates: Vec<EndpointCandidate> = endpoints
        .iter()
        .map(|e| EndpointCandidate {
            endpoint: e.clone(),
            zone_hints: Vec::new(),
            node_hints: Vec::new(),
        })
        .collect();
    let lists = categorize_endpoints(
        &candidates,
        sp.uses_cluster_endpoints(),
        sp.uses_local_endpoints(),
        &node().name,
        None,
    );
    sp.cluster_endpoints = lists.cluster;
    sp.local_endpoints = lists.local;
    kpng_model::sort_endpoints(&mut sp.cluster_endpoints);
    kpng_model::sort_endpoints(&mut sp.local_endpoints);
    sp.has_any_endpoints = lists.has_any;
    sp.local_ready_endpoints =
        u32::try_from(endpoints.iter().filter(|e| e.is_local && e.ready).count())
            .unwrap_or(u32::MAX);
    sp.serving_endpoints = endpoints
        .iter()
        .filter(|e| e.serving)
        .map(Endpoint::addr)
        .collect();
    sp.serving_endpoints.sort();
    sp
}

/// A TCP frontend (`IP:port`).
fn tcp(addr: &str) -> Frontend {
    frontend(addr, Protocol::Tcp)
}

fn frontend(addr: &str, protocol: Protocol) -> Frontend {
    let sa: SocketAddr = addr.parse().expect("socket address");
    Frontend {
        ip: sa.ip(),
        port: sa.port(),
        protocol,
    }
}

/// One expectation: a connection from `.1` to `.0` is dispatched as `.2`.
type Expect = (Frontend, Client, Dispatch);

/// Checks every expectation against what the harness's data plane holds.
fn assert_dispatch(harness: &dyn Harness, what: &str, expected: &[Expect]) {
    for (to, from, want) in expected {
        let got = harness.dispatch(*to, *from);
        assert_eq!(
            &got, want,
            "{what}: a connection from {from:?} to {}:{} {:?} (left: the data plane, right: \
             the contract)",
            to.ip, to.port, to.protocol
        );
    }
}

/// Checks that none of the frontends of `expected` reaches an endpoint any more (a Service
/// CIDR may still drop what is sent to a ClusterIP that is gone).
fn assert_gone(harness: &dyn Harness, what: &str, expected: &[Expect]) {
    for (to, from, _) in expected {
        let got = harness.dispatch(*to, *from);
        assert!(
            !matches!(got, Dispatch::To(_)),
            "{what}: after removal a connection from {from:?} to {}:{} still goes to {got:?}",
            to.ip,
            to.port
        );
    }
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
///
/// `expected`: where each of the port's frontends must dispatch while it is programmed.
fn programs_and_removes(
    harness: &mut dyn Harness,
    what: &str,
    port: ServicePort,
    expected: &[Expect],
) {
    let mut run = Run::start(harness);
    let before = run.objects();
    let key = port.key.clone();
    let ops = run.add(port);
    assert!(ops > 0, "{what}: adding it sent no operation");
    assert!(
        run.objects() > before,
        "{what}: the data plane holds nothing more ({before} objects)"
    );
    assert_dispatch(run.harness, what, expected);
    run.assert_quiet(&format!("adding {what}"));
    let ops = run.remove(&key);
    assert!(ops > 0, "{what}: removing it sent no operation");
    assert_eq!(
        run.objects(),
        before,
        "{what}: removing it did not restore the data plane"
    );
    assert_gone(run.harness, what, expected);
    run.assert_quiet(&format!("removing {what}"));
}

/// Programs `port` alone on a fresh data plane and checks its dispatch, then removes it.
fn dispatches(harness: &mut dyn Harness, what: &str, port: ServicePort, expected: &[Expect]) {
    let mut run = Run::start(harness);
    let key = port.key.clone();
    run.add(port);
    assert_dispatch(run.harness, what, expected);
    run.remove(&key);
    assert_gone(run.harness, what, expected);
}

/// Mirrors `cluster_ip_from_pod_spreads_over_all_endpoints_without_masquerade`.
fn cluster_ip(h: &mut dyn Harness) {
    programs_and_removes(
        h,
        "a ClusterIP",
        port("web", "10.96.0.10", Protocol::Tcp),
        &[(
            tcp("10.96.0.10:80"),
            Client::Pod,
            Dispatch::to(&[LOCAL, REMOTE]),
        )],
    );
}

/// Mirrors `udp_services_are_load_balanced`.
fn udp_services(h: &mut dyn Harness) {
    programs_and_removes(
        h,
        "a UDP ClusterIP",
        port("dns", "10.96.0.53", Protocol::Udp),
        &[(
            frontend("10.96.0.53:80", Protocol::Udp),
            Client::Pod,
            Dispatch::to(&[LOCAL, REMOTE]),
        )],
    );
}

/// Mirrors `wrong_port_unallocated_ip_and_no_endpoints`: a Service without endpoints is
/// programmed too (it rejects), and gaining endpoints is a change.
fn no_endpoints(h: &mut dyn Harness) {
    let empty = port_over("empty", "10.96.0.20", Protocol::Tcp, &[], |_| {});
    let cip = tcp("10.96.0.20:80");
    programs_and_removes(
        h,
        "a Service without endpoints",
        empty.clone(),
        &[(cip, Client::Pod, Dispatch::Refused)],
    );
    let mut run = Run::start(h);
    run.add(empty);
    run.add(port("empty", "10.96.0.20", Protocol::Tcp));
    assert_dispatch(
        run.harness,
        "endpoints appearing",
        &[(cip, Client::Pod, Dispatch::to(&[LOCAL, REMOTE]))],
    );
    run.assert_quiet("endpoints appearing");
}

/// Mirrors `node_port_default_addresses_and_loopback`.
fn node_port(h: &mut dyn Harness) {
    let mut sp = port("np", "10.96.0.30", Protocol::Tcp);
    sp.node_port = Some(30080);
    let all = || Dispatch::to(&[LOCAL, REMOTE]);
    programs_and_removes(
        h,
        "a NodePort",
        sp.clone(),
        &[
            (tcp(&format!("{NODE}:30080")), Client::Outside, all()),
            (tcp("10.96.0.30:80"), Client::Pod, all()),
        ],
    );
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
    let all = || Dispatch::to(&[LOCAL, REMOTE]);
    programs_and_removes(
        h,
        "external and LoadBalancer IPs with source ranges",
        sp.clone(),
        &[
            (tcp("192.168.100.50:80"), Client::Outside, all()),
            (tcp("192.168.100.60:80"), Client::Outside, all()),
            (tcp(&format!("{NODE}:30040")), Client::Outside, all()),
            (tcp("10.96.0.40:80"), Client::Pod, all()),
        ],
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

/// Mirrors `external_ip_and_load_balancer_source_ranges` for the clients the ranges leave out:
/// a load-balancer IP with `loadBalancerSourceRanges` serves the clients inside them and
/// refuses every other, in each family, while the ranges leave the Service's external IP,
/// node port and ClusterIP open (kube-proxy's firewall covers load-balancer IPs only).
fn load_balancer_source_ranges_refuse_other_clients(h: &mut dyn Harness) {
    let mut sp = port("fw", "10.96.0.45", Protocol::Tcp);
    sp.node_port = Some(30045);
    sp.external_ips = vec![ip("192.168.100.55")];
    sp.load_balancer_ips = vec![ip("192.168.100.65")];
    sp.source_ranges = vec!["203.0.113.0/24".parse().expect("cidr")];
    let all = || Dispatch::to(&[LOCAL, REMOTE]);
    let lb = tcp("192.168.100.65:80");
    programs_and_removes(
        h,
        "a LoadBalancer IP with source ranges",
        sp,
        &[
            (lb, Client::Outside, all()),
            (lb, Client::Barred, Dispatch::Refused),
            (tcp("192.168.100.55:80"), Client::Barred, all()),
            (tcp(&format!("{NODE}:30045")), Client::Barred, all()),
            (tcp("10.96.0.45:80"), Client::Pod, all()),
        ],
    );

    let mut sp = port("fw6", "fd00:96::45", Protocol::Tcp);
    sp.load_balancer_ips = vec![ip("2001:db8:100::65")];
    sp.source_ranges = vec!["2001:db8::/64".parse().expect("cidr")];
    let (local, remote) = endpoint_addrs(Family::V6);
    let lb = tcp("[2001:db8:100::65]:80");
    dispatches(
        h,
        "an IPv6 LoadBalancer IP with source ranges",
        sp,
        &[
            (lb, Client::Outside, Dispatch::to(&[local, remote])),
            (lb, Client::Barred, Dispatch::Refused),
        ],
    );
}

/// Mirrors `external_traffic_policy_local`: external frontends (node port, external and
/// load-balancer IPs) send clients from outside to local endpoints only, and drop them when
/// there is none; pods (kube-proxy's short-circuit) and the ClusterIP use every endpoint.
fn external_traffic_policy_local(h: &mut dyn Harness) {
    let shape = |sp: &mut ServicePort| {
        sp.node_port = Some(30050);
        sp.external_ips = vec![ip("192.168.100.71")];
        sp.load_balancer_ips = vec![ip("192.168.100.70")];
        sp.external_policy_local = true;
        sp.health_check_node_port = Some(31050);
    };
    let external = [
        tcp(&format!("{NODE}:30050")),
        tcp("192.168.100.71:80"),
        tcp("192.168.100.70:80"),
    ];
    let cip = tcp("10.96.0.50:80");
    let both = [endpoint(LOCAL, true), endpoint(REMOTE, false)];
    let sp = port_over("etp", "10.96.0.50", Protocol::Tcp, &both, shape);
    let mut expected = vec![(cip, Client::Pod, Dispatch::to(&[LOCAL, REMOTE]))];
    for to in external {
        expected.push((to, Client::Outside, Dispatch::to(&[LOCAL])));
    }
    // The short-circuit: a pod reaching the load-balancer IP may use every endpoint.
    expected.push((external[2], Client::Pod, Dispatch::to(&[LOCAL, REMOTE])));
    programs_and_removes(h, "externalTrafficPolicy Local", sp, &expected);

    let remote_only = [endpoint(REMOTE, false)];
    let sp = port_over("etp", "10.96.0.50", Protocol::Tcp, &remote_only, shape);
    let mut expected = vec![(cip, Client::Pod, Dispatch::to(&[REMOTE]))];
    for to in external {
        expected.push((to, Client::Outside, Dispatch::Refused));
    }
    expected.push((external[2], Client::Pod, Dispatch::to(&[REMOTE])));
    dispatches(
        h,
        "externalTrafficPolicy Local without a local endpoint",
        sp,
        &expected,
    );
}

/// Mirrors `internal_traffic_policy_local`: the ClusterIP sends to local endpoints only (and
/// drops when there is none), while the node port keeps every endpoint.
fn internal_traffic_policy_local(h: &mut dyn Harness) {
    let shape = |sp: &mut ServicePort| {
        sp.internal_policy_local = true;
        sp.node_port = Some(30060);
    };
    let cip = tcp("10.96.0.60:80");
    let np = tcp(&format!("{NODE}:30060"));
    let both = [endpoint(LOCAL, true), endpoint(REMOTE, false)];
    let sp = port_over("itp", "10.96.0.60", Protocol::Tcp, &both, shape);
    programs_and_removes(
        h,
        "internalTrafficPolicy Local",
        sp,
        &[
            (cip, Client::Pod, Dispatch::to(&[LOCAL])),
            (np, Client::Outside, Dispatch::to(&[LOCAL, REMOTE])),
        ],
    );
    let remote_only = [endpoint(REMOTE, false)];
    let sp = port_over("itp", "10.96.0.60", Protocol::Tcp, &remote_only, shape);
    dispatches(
        h,
        "internalTrafficPolicy Local without a local endpoint",
        sp,
        &[
            (cip, Client::Pod, Dispatch::Refused),
            (np, Client::Outside, Dispatch::to(&[REMOTE])),
        ],
    );
}

/// Mirrors `session_affinity_client_ip`: the affinity path still dispatches to the
/// endpoints each frontend's policy allows.
fn session_affinity_client_ip(h: &mut dyn Harness) {
    let affinity = Some(SessionAffinity {
        timeout_seconds: 10_800,
    });
    let mut sp = port("sticky", "10.96.0.70", Protocol::Tcp);
    sp.session_affinity = affinity;
    programs_and_removes(
        h,
        "ClientIP affinity",
        sp,
        &[(
            tcp("10.96.0.70:80"),
            Client::Pod,
            Dispatch::to(&[LOCAL, REMOTE]),
        )],
    );
    let both = [endpoint(LOCAL, true), endpoint(REMOTE, false)];
    let sp = port_over("sticky", "10.96.0.70", Protocol::Tcp, &both, |sp| {
        sp.session_affinity = affinity;
        sp.node_port = Some(30070);
        sp.external_policy_local = true;
    });
    dispatches(
        h,
        "ClientIP affinity with externalTrafficPolicy Local",
        sp,
        &[
            (
                tcp("10.96.0.70:80"),
                Client::Pod,
                Dispatch::to(&[LOCAL, REMOTE]),
            ),
            (
                tcp(&format!("{NODE}:30070")),
                Client::Outside,
                Dispatch::to(&[LOCAL]),
            ),
        ],
    );
}

/// One connection from `from` to `to`, which must reach an endpoint.
fn connect_once(harness: &mut dyn Harness, what: &str, to: Frontend, from: Client) -> Dispatch {
    let got = harness.connect(to, from);
    match &got {
        Dispatch::To(endpoints) if endpoints.len() == 1 => got,
        _ => panic!(
            "{what}: a connection from {from:?} to {}:{} reached {got:?}, not one endpoint",
            to.ip, to.port
        ),
    }
}

/// Mirrors `session_affinity_client_ip`, connection after connection: under ClientIP affinity
/// a client keeps the endpoint its first connection reached, through the ClusterIP and the
/// node port, while a client that has not connected yet may still reach every endpoint (the
/// affinity is per client, not one endpoint for all). Without affinity one client's
/// connections spread (which also proves that the harness's choices vary, so that a sticky
/// answer means something).
fn session_affinity_sticks(h: &mut dyn Harness) {
    let all = || Dispatch::to(&[LOCAL, REMOTE]);
    let mut run = Run::start(h);

    let plain = port("plain", "10.96.0.72", Protocol::Tcp);
    let key = plain.key.clone();
    run.add(plain);
    let cip = tcp("10.96.0.72:80");
    let what = "a Service without affinity";
    let first = connect_once(run.harness, what, cip, Client::Pod);
    let second = connect_once(run.harness, what, cip, Client::Pod);
    assert_ne!(
        first, second,
        "{what}: two connections in a row from one client reached the same endpoint"
    );
    assert_dispatch(run.harness, what, &[(cip, Client::Pod, all())]);
    run.remove(&key);

    let mut sp = port("sticky", "10.96.0.71", Protocol::Tcp);
    sp.session_affinity = Some(SessionAffinity {
        timeout_seconds: 10_800,
    });
    sp.node_port = Some(30071);
    let key = sp.key.clone();
    run.add(sp);
    let cip = tcp("10.96.0.71:80");
    let np = tcp(&format!("{NODE}:30071"));
    let ways = [
        (
            "ClientIP affinity on the ClusterIP",
            cip,
            Client::Pod,
            Client::OtherPod,
        ),
        (
            "ClientIP affinity on the node port",
            np,
            Client::Outside,
            Client::Barred,
        ),
    ];
    for (what, to, client, other) in ways {
        assert_dispatch(
            run.harness,
            &format!("{what}, before any connection"),
            &[(to, client, all()), (to, other, all())],
        );
        let first = connect_once(run.harness, what, to, client);
        for n in 2..=5 {
            let again = connect_once(run.harness, what, to, client);
            assert_eq!(
                again, first,
                "{what}: connection {n} from {client:?} left the endpoint of its first"
            );
        }
        assert_dispatch(
            run.harness,
            &format!("{what}, after {client:?} connected"),
            &[(to, client, first), (to, other, all())],
        );
    }
    run.remove(&key);
    assert_gone(
        run.harness,
        "ClientIP affinity",
        &[(cip, Client::Pod, all()), (np, Client::Outside, all())],
    );
}

/// Mirrors `terminating_endpoints_fallback`: serving, terminating endpoints take traffic only
/// where no ready endpoint exists for the frontend's policy (the cluster for Cluster, this node
/// for Local), and endpoints that no longer serve never do.
fn terminating_endpoints_fallback(h: &mut dyn Harness) {
    let cip = tcp("10.96.0.80:80");
    let np = tcp(&format!("{NODE}:30080"));
    let mixed = [
        endpoint(LOCAL, true),
        endpoint_in(REMOTE, false, State::Terminating),
        endpoint_in(REMOTE2, false, State::Ready),
    ];
    dispatches(
        h,
        "a terminating endpoint beside ready ones",
        port_over("term", "10.96.0.80", Protocol::Tcp, &mixed, |_| {}),
        &[(cip, Client::Pod, Dispatch::to(&[LOCAL, REMOTE2]))],
    );
    let terminating = [
        endpoint_in(LOCAL, true, State::Terminating),
        endpoint_in(REMOTE, false, State::Terminating),
        endpoint_in(REMOTE2, false, State::Gone),
    ];
    programs_and_removes(
        h,
        "terminating endpoints only",
        port_over("term", "10.96.0.80", Protocol::Tcp, &terminating, |_| {}),
        &[(cip, Client::Pod, Dispatch::to(&[LOCAL, REMOTE]))],
    );
    // externalTrafficPolicy Local: the local endpoint terminates, a remote one is ready. The
    // node port falls back to the local terminating one; the ClusterIP uses the ready one.
    let local_terminating = [
        endpoint_in(LOCAL, true, State::Terminating),
        endpoint_in(REMOTE, false, State::Ready),
    ];
    dispatches(
        h,
        "a terminating local endpoint under externalTrafficPolicy Local",
        port_over(
            "term",
            "10.96.0.80",
            Protocol::Tcp,
            &local_terminating,
            |sp| {
                sp.node_port = Some(30080);
                sp.external_policy_local = true;
            },
        ),
        &[
            (cip, Client::Pod, Dispatch::to(&[REMOTE])),
            (np, Client::Outside, Dispatch::to(&[LOCAL])),
        ],
    );
}

/// Mirrors `ipv6_cluster_ip_and_node_port`; with externalTrafficPolicy Local, a pod of this
/// node (`fd00:10:244:1::100`, which the harness's pod detection must recognise) may use every
/// endpoint of the node port, a client from outside the local one only.
fn ipv6_cluster_ip_and_node_port(h: &mut dyn Harness) {
    let mut sp = port("web6", "fd00:96::10", Protocol::Tcp);
    sp.node_port = Some(30060);
    let (local, remote) = endpoint_addrs(Family::V6);
    let all = || Dispatch::to(&[local, remote]);
    programs_and_removes(
        h,
        "an IPv6 ClusterIP and node port",
        sp,
        &[
            (tcp("[fd00:96::10]:80"), Client::Pod, all()),
            (
                tcp(&format!("[{}]:30060", NODE_IPS[1])),
                Client::Outside,
                all(),
            ),
        ],
    );
    let both = [endpoint(local, true), endpoint(remote, false)];
    let sp = port_over("web6", "fd00:96::10", Protocol::Tcp, &both, |sp| {
        sp.node_port = Some(30061);
        sp.external_policy_local = true;
    });
    let np = tcp(&format!("[{}]:30061", NODE_IPS[1]));
    dispatches(
        h,
        "an IPv6 node port with externalTrafficPolicy Local",
        sp,
        &[
            (np, Client::Pod, all()),
            (np, Client::Outside, Dispatch::to(&[local])),
        ],
    );
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
    let moved = [(
        tcp("10.96.1.8:80"),
        Client::Pod,
        Dispatch::to(&[LOCAL, "10.244.2.9:8080"]),
    )];
    assert_dispatch(run.harness, "an endpoint change", &moved);
    run.assert_quiet("an endpoint change");
    run.sync_full().expect("a full sync of an unchanged state");
    assert_eq!(
        run.objects(),
        objects,
        "a full sync changed the object count"
    );
    assert_dispatch(run.harness, "a full sync after an endpoint change", &moved);
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
    assert_dispatch(
        run.harness,
        "the full sync after a failure",
        &[(
            tcp("10.96.2.2:80"),
            Client::Pod,
            Dispatch::to(&[LOCAL, REMOTE]),
        )],
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
    let expected = [
        (
            frontend(&format!("{NODE}:30300"), Protocol::Udp),
            Client::Outside,
            Dispatch::to(&[LOCAL, REMOTE]),
        ),
        (
            frontend("10.96.3.1:80", Protocol::Udp),
            Client::Pod,
            Dispatch::to(&[LOCAL, REMOTE]),
        ),
    ];
    assert_gone(run.harness, "cleanup", &expected);
    run.sync_full().expect("a full sync after cleanup");
    assert_eq!(
        run.objects(),
        programmed,
        "a full sync after cleanup differs"
    );
    assert_dispatch(run.harness, "a full sync after cleanup", &expected);
}
