//! The backend against the simulator: winkernel's objects and flags, the HCN call budget, and
//! one test per upstream bug (docs/windows.md), with faults injected.

use std::net::IpAddr;
use std::sync::Arc;

use kpng_backend::{Backend, BackendError, SyncRequest, SyncStats};
use kpng_model::{
    Diff, Endpoint, Family, NodeState, PortKey, Protocol, ServiceKey, ServicePort, SessionAffinity,
    Snapshot,
};

use crate::hcn::{E_INVALID_ARG, E_NOT_FOUND};
use crate::plan::{HnsConfig, NetworkView, plan_port};
use crate::schema::{
    Endpoint as HcnEndpoint, IpConfig, LoadBalancer, Network, Policy, State, distribution,
    lb_flags, port_flags,
};
use crate::sim::{Call, Simulator};
use crate::{HnsBackend, hcn::Hcn};

const NET: &str = "NET-1";
const NODE_IP: &str = "192.168.1.10";

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn network(kind: &str) -> Network {
    Network {
        id: NET.into(),
        name: "cbr0".into(),
        network_type: kind.into(),
        policies: vec![Policy {
            policy_type: "RemoteSubnetRoute".into(),
            settings: serde_json::json!({"DestinationPrefix": "10.244.2.0/24", "ProviderAddress": "192.168.1.12"}),
        }],
        extra: Default::default(),
    }
}

fn cni_endpoint(id: &str, addr: &str) -> HcnEndpoint {
    HcnEndpoint {
        id: id.into(),
        host_compute_network: NET.into(),
        ip_configurations: vec![IpConfig {
            ip_address: addr.into(),
            prefix_length: Some(24),
        }],
        ..HcnEndpoint::default()
    }
}

/// HCN as the CNI leaves it: the network and two local pods (10.244.1.5, 10.244.1.6).
fn hcn(kind: &str) -> Simulator {
    Simulator::new(State {
        networks: vec![network(kind)],
        endpoints: vec![
            cni_endpoint("LOCAL-5", "10.244.1.5"),
            cni_endpoint("LOCAL-6", "10.244.1.6"),
        ],
        load_balancers: vec![],
    })
}

fn config() -> HnsConfig {
    HnsConfig {
        network_name: "cbr0".into(),
        ..HnsConfig::default()
    }
}

/// [`config`] for an Overlay network, which needs a source VIP.
fn overlay_config() -> HnsConfig {
    HnsConfig {
        source_vips: vec![ip("10.244.1.2")],
        ..config()
    }
}

fn ep(addr: &str, local: bool) -> Endpoint {
    Endpoint {
        ip: ip(addr),
        port: 8080,
        is_local: local,
        ready: true,
        serving: true,
        terminating: false,
    }
}

fn port(name: &str, cluster_ip: &str, eps: &[Endpoint]) -> ServicePort {
    let family = Family::of(&ip(cluster_ip));
    let mut p = ServicePort::new(
        PortKey {
            service: ServiceKey::new("ns", name),
            port_name: "http".into(),
            protocol: Protocol::Tcp,
            family,
        },
        ip(cluster_ip),
        80,
    );
    p.cluster_endpoints = eps.to_vec();
    p.local_endpoints = eps.iter().filter(|e| e.is_local).cloned().collect();
    p.has_any_endpoints = !eps.is_empty();
    p
}

fn node() -> NodeState {
    NodeState {
        name: "win-1".into(),
        known: true,
        ips: vec![ip(NODE_IP), ip("fd00::10")],
        ..NodeState::default()
    }
}

fn snapshot(ports: &[ServicePort]) -> Snapshot {
    Snapshot {
        node: node(),
        ports: ports
            .iter()
            .map(|p| (p.key.clone(), Arc::new(p.clone())))
            .collect(),
        service_cidrs: vec![],
    }
}

/// Drives a backend through model states, as the runner would.
struct Driver {
    backend: HnsBackend,
    current: Snapshot,
    /// The repair the last sync reported.
    repaired: Option<String>,
}

impl Driver {
    fn new(sim: &Simulator, config: HnsConfig) -> Driver {
        Driver {
            backend: HnsBackend::new(config, Box::new(sim.clone())),
            current: snapshot(&[]),
            repaired: None,
        }
    }

    fn full(&mut self, ports: &[ServicePort]) -> Result<usize, String> {
        let snap = snapshot(ports);
        let diff = Diff::full(&snap);
        let r = self.backend.sync(&SyncRequest {
            diff: &diff,
            snapshot: &snap,
            full: true,
        });
        self.current = snap;
        self.finish(r)
    }

    fn change(&mut self, ports: &[ServicePort]) -> Result<usize, String> {
        let snap = snapshot(ports);
        let mut diff = Diff::default();
        for (k, v) in &snap.ports {
            diff.record(
                k.clone(),
                self.current.ports.get(k).cloned(),
                Some(v.clone()),
            );
        }
        for (k, v) in &self.current.ports {
            if !snap.ports.contains_key(k) {
                diff.record(k.clone(), Some(v.clone()), None);
            }
        }
        let r = self.backend.sync(&SyncRequest {
            diff: &diff,
            snapshot: &snap,
            full: false,
        });
        self.current = snap;
        self.finish(r)
    }

    fn finish(&mut self, r: Result<SyncStats, BackendError>) -> Result<usize, String> {
        let stats = r.map_err(|e| e.to_string())?;
        self.repaired = stats.repaired;
        Ok(stats.operations)
    }
}

fn lb_at(state: &State, vip: &str) -> Option<LoadBalancer> {
    state
        .load_balancers
        .iter()
        .find(|l| l.frontend_vips.iter().any(|v| v == vip))
        .cloned()
}

fn endpoint_ips(state: &State, lb: &LoadBalancer) -> Vec<String> {
    let mut ips: Vec<String> = lb
        .host_compute_endpoints
        .iter()
        .filter_map(|id| {
            state
                .endpoints
                .iter()
                .find(|e| e.id.eq_ignore_ascii_case(id))
        })
        .flat_map(|e| e.ip_configurations.iter().map(|c| c.ip_address.clone()))
        .collect();
    ips.sort();
    ips
}

// ---- the planner: winkernel's objects and flags ----

fn view(kind: &str) -> NetworkView {
    let mut v = NetworkView::of(&network(kind));
    v.local.insert(ip("10.244.1.5"), "LOCAL-5".into());
    v
}

#[test]
fn every_frontend_of_a_port_gets_its_load_balancer_with_winkernel_flags() {
    let mut p = port(
        "web",
        "10.96.0.10",
        &[ep("10.244.1.5", true), ep("10.244.2.7", false)],
    );
    p.node_port = Some(30080);
    p.external_ips = vec![ip("203.0.113.1")];
    p.load_balancer_ips = vec![ip("198.51.100.1")];
    p.session_affinity = Some(SessionAffinity {
        timeout_seconds: 10800,
    });
    let mut warnings = Vec::new();
    let lbs = plan_port(&p, &node(), &view("L2Bridge"), &config(), &mut warnings);
    assert!(warnings.is_empty(), "{warnings:?}");
    let got: Vec<(Option<IpAddr>, u16, u32, u32, usize)> = lbs
        .iter()
        .map(|l| {
            (
                l.frontend.vip,
                l.frontend.port,
                l.port_flags,
                l.lb_flags,
                l.endpoints.len(),
            )
        })
        .collect();
    let ext = port_flags::VIP_EXTERNAL_IP;
    assert_eq!(
        got,
        vec![
            (Some(ip("10.96.0.10")), 80, port_flags::NONE, 0, 2),
            (None, 30080, port_flags::LOCAL_ROUTED_VIP | ext, 0, 2),
            (Some(ip("203.0.113.1")), 80, ext, 0, 2),
            (Some(ip("198.51.100.1")), 80, ext, 0, 2),
        ]
    );
    for l in &lbs {
        assert_eq!(l.distribution, distribution::SOURCE_IP, "ClientIP affinity");
        assert_eq!(l.internal_port, 8080);
        assert_eq!(l.source_vip, NODE_IP, "L2Bridge: the node IP");
    }
}

#[test]
fn dsr_applies_to_external_frontends_only_with_external_policy_local() {
    let mut p = port(
        "web",
        "10.96.0.10",
        &[ep("10.244.1.5", true), ep("10.244.2.7", false)],
    );
    p.node_port = Some(30080);
    p.load_balancer_ips = vec![ip("198.51.100.1")];
    let dsr = HnsConfig {
        enable_dsr: true,
        ..config()
    };
    let mut w = Vec::new();
    let cluster_policy = plan_port(&p, &node(), &view("L2Bridge"), &dsr, &mut w);
    let flags: Vec<u32> = cluster_policy.iter().map(|l| l.lb_flags).collect();
    assert_eq!(
        flags,
        vec![lb_flags::DSR, 0, 0],
        "eTP Cluster: DSR on the ClusterIP only"
    );
    p.external_policy_local = true;
    let local = plan_port(&p, &node(), &view("L2Bridge"), &dsr, &mut w);
    let got: Vec<(u32, usize)> = local
        .iter()
        .map(|l| (l.lb_flags, l.endpoints.len()))
        .collect();
    assert_eq!(
        got,
        vec![(lb_flags::DSR, 2), (lb_flags::DSR, 1), (lb_flags::DSR, 1)],
        "eTP Local: DSR and the model's local endpoints on external frontends"
    );
    let no_dsr = plan_port(&p, &node(), &view("L2Bridge"), &config(), &mut w);
    assert!(no_dsr.iter().all(|l| l.lb_flags == 0));
}

#[test]
fn preserve_dip_turns_off_the_mesh_and_sets_winkernels_flags_on_ingress_ips() {
    let ext = port_flags::VIP_EXTERNAL_IP;
    let np = port_flags::LOCAL_ROUTED_VIP | ext;
    let pdip = ext | port_flags::USE_MUX | port_flags::PRESERVE_DIP;
    let dsr = lb_flags::DSR;
    // (preserve-destination, --enable-dsr, eTP Local) → per frontend (ClusterIP, node port,
    // external IP, ingress IP): (port-mapping flags, load-balancer flags, endpoints)
    type Row = (bool, bool, bool, [(u32, u32, usize); 4]);
    let cases: [Row; 6] = [
        (
            false,
            false,
            false,
            [(0, 0, 2), (np, 0, 2), (ext, 0, 2), (ext, 0, 2)],
        ),
        // preserve-DIP alone: node port and ingress IP get local endpoints only; the ingress
        // IP gets DSR, UseMux and PreserveDIP; ClusterIP and external IPs are untouched.
        (
            true,
            false,
            false,
            [(0, 0, 2), (np, 0, 1), (ext, 0, 2), (pdip, dsr, 1)],
        ),
        // It does not need --enable-dsr (upstream gates it on HNS's DSR support only).
        (
            true,
            true,
            false,
            [(0, dsr, 2), (np, 0, 1), (ext, 0, 2), (pdip, dsr, 1)],
        ),
        // Local-traffic DSR without preserve-DIP: DSR everywhere external, no mux flags.
        (
            false,
            true,
            true,
            [(0, dsr, 2), (np, dsr, 1), (ext, dsr, 1), (ext, dsr, 1)],
        ),
        (
            true,
            true,
            true,
            [(0, dsr, 2), (np, dsr, 1), (ext, dsr, 1), (pdip, dsr, 1)],
        ),
        // eTP Local without --enable-dsr: the model's local endpoints, no DSR.
        (
            true,
            false,
            true,
            [(0, 0, 2), (np, 0, 1), (ext, 0, 1), (pdip, dsr, 1)],
        ),
    ];
    for (preserve, enable_dsr, etp_local, want) in cases {
        let mut p = port(
            "web",
            "10.96.0.10",
            &[ep("10.244.1.5", true), ep("10.244.2.7", false)],
        );
        p.node_port = Some(30080);
        p.external_ips = vec![ip("203.0.113.1")];
        p.load_balancer_ips = vec![ip("198.51.100.1")];
        p.preserve_destination = preserve;
        p.external_policy_local = etp_local;
        let cfg = HnsConfig {
            enable_dsr,
            ..config()
        };
        let mut w = Vec::new();
        let lbs = plan_port(&p, &node(), &view("L2Bridge"), &cfg, &mut w);
        assert!(w.is_empty(), "{w:?}");
        let got: Vec<(u32, u32, usize)> = lbs
            .iter()
            .map(|l| (l.port_flags, l.lb_flags, l.endpoints.len()))
            .collect();
        assert_eq!(
            got, want,
            "preserve {preserve}, enable-dsr {enable_dsr}, eTP Local {etp_local}"
        );
        for l in lbs.iter().filter(|l| l.endpoints.len() == 1) {
            assert_eq!(l.endpoints[0].ip(), ip("10.244.1.5"), "the local endpoint");
        }
    }
    // No local endpoint: the node port and ingress IP get no load balancer at all.
    let mut p = port("web", "10.96.0.10", &[ep("10.244.2.7", false)]);
    p.node_port = Some(30080);
    p.load_balancer_ips = vec![ip("198.51.100.1")];
    p.preserve_destination = true;
    let mut w = Vec::new();
    let lbs = plan_port(&p, &node(), &view("L2Bridge"), &config(), &mut w);
    let vips: Vec<Option<IpAddr>> = lbs.iter().map(|l| l.frontend.vip).collect();
    assert_eq!(vips, vec![Some(ip("10.96.0.10"))]);
}

fn health_config() -> HnsConfig {
    HnsConfig {
        forward_health_check_vip: true,
        root_hns_endpoint_name: "cbr0".into(),
        healthz_port: 10256,
        ..config()
    }
}

fn root_view() -> NetworkView {
    let mut v = view("L2Bridge");
    v.local.insert(ip("10.244.1.1"), "ROOT".into());
    v.root = Some((ip("10.244.1.1"), "ROOT".into()));
    v
}

#[test]
fn forward_healthcheck_vip_adds_a_health_load_balancer_per_ingress_ip() {
    let pdip = port_flags::USE_MUX | port_flags::PRESERVE_DIP;
    // (forward, health-check node port, preserve-DIP, endpoints, healthz port) →
    // the health-check load balancers (VIP, port, port flags)
    type Row = (
        bool,
        Option<u16>,
        bool,
        bool,
        u16,
        Vec<(&'static str, u16, u32)>,
    );
    let cases: Vec<Row> = vec![
        (false, None, false, true, 10256, vec![]),
        // kpng's health server port when the Service has no health-check node port.
        (
            true,
            None,
            false,
            true,
            10256,
            vec![("198.51.100.1", 10256, 0), ("198.51.100.2", 10256, 0)],
        ),
        // eTP Local: the Service's health-check node port; preserve-DIP adds its flags.
        (
            true,
            Some(32000),
            true,
            true,
            10256,
            vec![("198.51.100.1", 32000, pdip), ("198.51.100.2", 32000, pdip)],
        ),
        // No endpoint anywhere: nothing (winkernel's endpointsAvailableForLB).
        (true, None, false, false, 10256, vec![]),
        // No health server and no health-check node port: nothing.
        (true, None, false, true, 0, vec![]),
    ];
    for (forward, hc, preserve, with_eps, healthz, want) in cases {
        let eps = if with_eps {
            vec![ep("10.244.2.7", false)]
        } else {
            vec![]
        };
        let mut p = port("lb", "10.96.0.30", &eps);
        p.load_balancer_ips = vec![ip("198.51.100.1"), ip("198.51.100.2")];
        p.health_check_node_port = hc;
        p.preserve_destination = preserve;
        let cfg = HnsConfig {
            forward_health_check_vip: forward,
            healthz_port: healthz,
            ..health_config()
        };
        let mut w = Vec::new();
        let lbs = plan_port(&p, &node(), &root_view(), &cfg, &mut w);
        assert!(w.is_empty(), "{w:?}");
        let health: Vec<&crate::plan::LbPlan> = lbs
            .iter()
            .filter(|l| l.endpoints.iter().any(|e| e.ip() == ip("10.244.1.1")))
            .collect();
        let got: Vec<(IpAddr, u16, u32)> = health
            .iter()
            .map(|l| {
                (
                    l.frontend.vip.expect("a VIP"),
                    l.frontend.port,
                    l.port_flags,
                )
            })
            .collect();
        let want: Vec<(IpAddr, u16, u32)> = want.iter().map(|(v, p, f)| (ip(v), *p, *f)).collect();
        assert_eq!(
            got, want,
            "forward {forward}, hc {hc:?}, preserve {preserve}"
        );
        for l in health {
            assert_eq!(l.internal_port, l.frontend.port, "the same port inside");
            assert_eq!(l.lb_flags, 0, "never DSR");
            assert_eq!(l.distribution, distribution::NONE);
            assert_eq!(l.endpoints.len(), 1, "the root endpoint only");
        }
    }
    // The root endpoint missing: a warning naming it, no health load balancer.
    let mut p = port("lb", "10.96.0.30", &[ep("10.244.2.7", false)]);
    p.load_balancer_ips = vec![ip("198.51.100.1")];
    let mut w = Vec::new();
    let lbs = plan_port(&p, &node(), &view("L2Bridge"), &health_config(), &mut w);
    assert_eq!(lbs.len(), 2, "ClusterIP and ingress IP only");
    assert_eq!(w.len(), 1);
    assert!(w[0].message.contains("\"cbr0\""), "{}", w[0].message);
}

#[test]
fn overlay_remote_endpoints_carry_the_provider_address_and_public_ips_use_the_node_ip() {
    let p = port("web", "10.96.0.10", &[ep("10.244.2.7", false)]);
    let cfg = HnsConfig {
        source_vips: vec![ip("10.244.1.2")],
        ..config()
    };
    let mut w = Vec::new();
    let lbs = plan_port(&p, &node(), &view("Overlay"), &cfg, &mut w);
    assert_eq!(
        lbs[0].endpoints,
        vec![crate::plan::EndpointRef::Remote {
            ip: ip("10.244.2.7"),
            provider: Some(ip("192.168.1.12"))
        }]
    );
    assert_eq!(lbs[0].source_vip, "10.244.1.2", "overlay: --source-vip");
    let public = port("ext", "10.96.0.11", &[ep("203.0.113.9", false)]);
    let lbs = plan_port(&public, &node(), &view("Overlay"), &cfg, &mut w);
    assert_eq!(
        lbs[0].source_vip, NODE_IP,
        "an endpoint outside the pod subnets"
    );
}

#[test]
fn ipv6_ports_get_the_ipv6_flag_and_local_endpoints_missing_in_hns_are_warned_about() {
    let p = port("v6", "fd00:96::10", &[ep("fd00:244::5", false)]);
    let mut w = Vec::new();
    let lbs = plan_port(&p, &node(), &view("L2Bridge"), &config(), &mut w);
    assert_eq!(lbs[0].lb_flags, lb_flags::IPV6);
    assert_eq!(lbs[0].source_vip, "fd00::10");
    let missing = port("m", "10.96.0.12", &[ep("10.244.1.99", true)]);
    let lbs = plan_port(&missing, &node(), &view("L2Bridge"), &config(), &mut w);
    assert!(lbs.is_empty(), "no endpoint found: no load balancer");
    assert_eq!(w.len(), 1);
    assert!(w[0].message.contains("10.244.1.99"), "{}", w[0].message);
}

// ---- the backend against the simulator ----

#[test]
fn a_cold_sync_costs_one_create_per_object_and_three_enumerates() {
    let sim = hcn("L2Bridge");
    let mut d = Driver::new(&sim, config());
    let shared = ep("10.244.2.7", false);
    let ports = [
        port("a", "10.96.0.10", &[shared.clone(), ep("10.244.1.5", true)]),
        port(
            "b",
            "10.96.0.11",
            &[shared.clone(), ep("10.244.3.8", false)],
        ),
    ];
    d.full(&ports).expect("sync");
    let calls = sim.calls();
    assert_eq!(
        calls.of(Call::CreateEndpoint),
        2,
        "shared remote endpoint once"
    );
    assert_eq!(calls.of(Call::CreateLoadBalancer), 2);
    assert_eq!(calls.total(), 3 + 2 + 2);
    let state = sim.state();
    let a = lb_at(&state, "10.96.0.10").expect("a's load balancer");
    assert_eq!(endpoint_ips(&state, &a), vec!["10.244.1.5", "10.244.2.7"]);
    assert!(a.host_compute_endpoints.contains(&"local-5".to_string()));
    let remote = state
        .endpoints
        .iter()
        .find(|e| e.ips().any(|i| i == ip("10.244.2.7")))
        .expect("remote endpoint");
    assert!(remote.is_remote());
    // An empty periodic sync only looks, and so does a second full sync.
    sim.reset_calls();
    assert_eq!(d.change(&ports), Ok(0));
    assert_eq!(sim.calls().total(), 3);
    assert_eq!(d.repaired, None, "nothing to repair");

    sim.reset_calls();
    assert_eq!(d.full(&ports), Ok(0));
    assert_eq!(sim.calls().total(), 3);
    assert_eq!(sim.state(), state);
}

#[test]
fn preserve_dip_reaches_hcn_and_toggling_it_replaces_only_the_affected_load_balancers() {
    let sim = hcn("L2Bridge");
    let mut d = Driver::new(&sim, config());
    let mut p = port(
        "lb",
        "10.96.0.20",
        &[ep("10.244.1.5", true), ep("10.244.2.7", false)],
    );
    p.node_port = Some(30090);
    p.load_balancer_ips = vec![ip("198.51.100.7")];
    p.preserve_destination = true;
    d.full(std::slice::from_ref(&p)).expect("sync");
    let state = sim.state();
    let ingress = lb_at(&state, "198.51.100.7").expect("ingress load balancer");
    let pm = &ingress.port_mappings[0];
    assert_eq!(
        pm.flags,
        port_flags::VIP_EXTERNAL_IP | port_flags::USE_MUX | port_flags::PRESERVE_DIP
    );
    assert_eq!(ingress.flags, lb_flags::DSR);
    assert_eq!(endpoint_ips(&state, &ingress), vec!["10.244.1.5"]);
    let node_port = state
        .load_balancers
        .iter()
        .find(|l| l.frontend_vips.is_empty())
        .expect("node-port load balancer");
    assert_eq!(endpoint_ips(&state, node_port), vec!["10.244.1.5"]);
    let cluster = lb_at(&state, "10.96.0.20").expect("ClusterIP load balancer");
    assert_eq!(endpoint_ips(&state, &cluster).len(), 2);

    // Annotation removed: the node port and the ingress IP are replaced (delete + create
    // each); the ClusterIP's load balancer stays.
    sim.reset_calls();
    p.preserve_destination = false;
    assert!(d.change(std::slice::from_ref(&p)).is_ok());
    let calls = sim.calls();
    assert_eq!(calls.of(Call::DeleteLoadBalancer), 2);
    assert_eq!(calls.of(Call::CreateLoadBalancer), 2);
    let after = sim.state();
    let ingress = lb_at(&after, "198.51.100.7").expect("ingress load balancer");
    assert_eq!(ingress.port_mappings[0].flags, port_flags::VIP_EXTERNAL_IP);
    assert_eq!(ingress.flags, 0);
    assert_eq!(endpoint_ips(&after, &ingress).len(), 2);
    assert_eq!(lb_at(&after, "10.96.0.20"), Some(cluster));
}

#[test]
fn health_check_forwarding_reaches_hcn_and_is_shared_by_the_ports_of_a_service() {
    let mut state = hcn("L2Bridge").state();
    state.endpoints.push(HcnEndpoint {
        name: "cbr0".into(),
        ..cni_endpoint("ROOT-1", "10.244.1.1")
    });
    let sim = Simulator::new(state);
    let mut d = Driver::new(&sim, health_config());
    let lb_port = |name: &str, svc_port: u16| {
        let mut p = port("lb", "10.96.0.30", &[ep("10.244.2.7", false)]);
        p.key.port_name = name.into();
        p.port = svc_port;
        p.load_balancer_ips = vec![ip("198.51.100.9")];
        p.health_check_node_port = Some(32100);
        p
    };
    let (http, https) = (lb_port("http", 80), lb_port("https", 443));
    d.full(&[http.clone(), https.clone()]).expect("sync");
    let health = |state: &State| -> Vec<LoadBalancer> {
        state
            .load_balancers
            .iter()
            .filter(|l| l.port_mappings[0].external_port == 32100)
            .cloned()
            .collect()
    };
    let s = sim.state();
    let hc = health(&s);
    assert_eq!(hc.len(), 1, "one health load balancer for the two ports");
    assert_eq!(hc[0].frontend_vips, vec!["198.51.100.9".to_string()]);
    assert_eq!(hc[0].port_mappings[0].internal_port, 32100);
    assert_eq!(endpoint_ips(&s, &hc[0]), vec!["10.244.1.1"]);
    // One port goes: the other still wants the health load balancer; it stays.
    assert!(d.change(std::slice::from_ref(&https)).is_ok());
    assert_eq!(health(&sim.state()), hc);
    // A periodic sync leaves it alone too; the last port going takes it.
    sim.reset_calls();
    assert_eq!(d.full(std::slice::from_ref(&https)), Ok(0));
    assert!(d.change(&[]).is_ok());
    assert!(health(&sim.state()).is_empty());
    assert!(sim.state().load_balancers.is_empty());
}

#[test]
fn one_endpoint_change_costs_at_most_three_calls() {
    let sim = hcn("L2Bridge");
    let mut d = Driver::new(&sim, config());
    let mut ports: Vec<ServicePort> = (0..50)
        .map(|i| {
            port(
                &format!("s{i}"),
                &format!("10.96.1.{i}"),
                &[ep(&format!("10.244.2.{i}"), false)],
            )
        })
        .collect();
    d.full(&ports).expect("cold");
    sim.reset_calls();
    ports[7] = port(
        "s7",
        "10.96.1.7",
        &[ep("10.244.2.7", false), ep("10.244.3.100", false)],
    );
    d.change(&ports).expect("add an endpoint");
    let calls = sim.calls();
    assert_eq!(calls.total(), 3, "{calls:?}");
    assert_eq!(calls.of(Call::CreateEndpoint), 1);
    sim.reset_calls();
    ports[7] = port("s7", "10.96.1.7", &[ep("10.244.2.7", false)]);
    d.change(&ports).expect("remove it");
    let calls = sim.calls();
    assert_eq!(calls.total(), 3, "{calls:?}");
    assert_eq!(
        calls.of(Call::DeleteEndpoint),
        1,
        "the unused remote endpoint goes"
    );
    let state = sim.state();
    let lb = lb_at(&state, "10.96.1.7").expect("lb");
    assert_eq!(endpoint_ips(&state, &lb), vec!["10.244.2.7"]);
}

/// PR #106936: HNS refuses a load balancer without endpoints; the Service was retried every
/// sync. kpng does not ask.
#[test]
fn bug_106936_a_port_without_endpoints_never_asks_hns() {
    let sim = hcn("L2Bridge");
    let mut d = Driver::new(&sim, config());
    let ports = [port("empty", "10.96.0.10", &[])];
    assert_eq!(d.full(&ports), Ok(0));
    assert_eq!(sim.calls().of(Call::CreateLoadBalancer), 0);
    sim.reset_calls();
    assert_eq!(d.change(&ports), Ok(0), "nor on the next (periodic) sync");
    assert_eq!(sim.calls().of(Call::CreateLoadBalancer), 0);
    assert_eq!(sim.calls().total(), 3, "three enumerates");
    // And the simulator does refuse it, as HNS.
    let mut raw = sim.clone();
    let e = raw
        .create_load_balancer(&LoadBalancer::default())
        .expect_err("refused");
    assert_eq!(e.code, E_INVALID_ARG);
}

/// PR #137530: endpoints → 0 skipped the delete; the orphan held the port ("port already
/// exists" crash loops). And a failed delete kept the cached ID.
#[test]
fn bug_137530_endpoints_to_zero_delete_and_a_failed_delete_is_forgotten() {
    let sim = hcn("L2Bridge");
    let mut d = Driver::new(&sim, config());
    let with = [port("a", "10.96.0.10", &[ep("10.244.2.7", false)])];
    let without = [port("a", "10.96.0.10", &[])];
    d.full(&with).expect("cold");
    d.change(&without).expect("to zero");
    assert!(sim.state().load_balancers.is_empty(), "deleted at zero");
    assert!(
        sim.state().endpoints.iter().all(|e| !e.is_remote()),
        "and its remote endpoint"
    );
    d.change(&with).expect("back: no port conflict");
    assert!(lb_at(&sim.state(), "10.96.0.10").is_some());
    // A delete that fails: the sync reports it, forgets the ID, and the full sync that
    // follows re-discovers and finishes the job.
    sim.fail_next(Call::DeleteLoadBalancer, 0x8000_4005);
    assert!(d.change(&without).is_err(), "the failure is reported");
    assert!(d.backend.known().lbs.is_empty(), "cached ID forgotten");
    assert!(lb_at(&sim.state(), "10.96.0.10").is_some(), "still in HNS");
    d.full(&without).expect("the retry");
    assert!(sim.state().load_balancers.is_empty());
    d.change(&with).expect("and the port is free again");
}

/// #113524: after a failed delete, the Service came back with the same endpoint *count* and
/// the stale policy was taken as valid.
#[test]
fn bug_113524_identity_is_content_not_endpoint_count() {
    let sim = hcn("L2Bridge");
    let mut d = Driver::new(&sim, config());
    d.full(&[port("a", "10.96.0.10", &[ep("10.244.2.7", false)])])
        .expect("cold");
    sim.fail_next(Call::DeleteLoadBalancer, 0x8000_4005);
    assert!(d.change(&[]).is_err());
    let again = [port("a", "10.96.0.10", &[ep("10.244.3.9", false)])];
    d.full(&again)
        .expect("re-created with one (other) endpoint");
    let state = sim.state();
    assert_eq!(state.load_balancers.len(), 1);
    let lb = lb_at(&state, "10.96.0.10").expect("lb");
    assert_eq!(endpoint_ips(&state, &lb), vec!["10.244.3.9"]);
    assert!(
        !state
            .endpoints
            .iter()
            .any(|e| e.ips().any(|i| i == ip("10.244.2.7"))),
        "the stale remote endpoint is gone too"
    );
}

/// #110674, #110849, #135802: load balancers deleted out of band were never re-created.
#[test]
fn bug_110674_objects_deleted_out_of_band_come_back_at_the_next_full_sync() {
    let sim = hcn("Overlay");
    let mut d = Driver::new(&sim, overlay_config());
    let ports = [
        port("a", "10.96.0.10", &[ep("10.244.2.7", false)]),
        port("b", "10.96.0.11", &[ep("10.244.1.5", true)]),
    ];
    d.full(&ports).expect("cold");
    let before = sim.state();
    let a = lb_at(&before, "10.96.0.10").expect("a");
    assert!(
        sim.delete_out_of_band(&a.id),
        "hnsdiag delete loadbalancers"
    );
    let remote = &a.host_compute_endpoints[0];
    assert!(sim.delete_out_of_band(remote), "and the remote endpoint");
    sim.reset_calls();
    d.change(&ports)
        .expect("the periodic (empty) sync re-reads HCN");
    assert_eq!(
        d.repaired.as_deref(),
        Some(
            "HNS changed by someone else (an HNS or CNI restart, hnsdiag): 1 load balancer(s) \
             missing or changed, created again; 1 remote endpoint(s) missing, created again"
        ),
        "shown as a repair"
    );
    let after = sim.state();
    let a2 = lb_at(&after, "10.96.0.10").expect("re-created");
    assert_eq!(endpoint_ips(&after, &a2), vec!["10.244.2.7"]);
    let calls = sim.calls();
    assert_eq!(
        (
            calls.of(Call::CreateEndpoint),
            calls.of(Call::CreateLoadBalancer)
        ),
        (1, 1),
        "only what vanished: {calls:?}"
    );
    let pa = after
        .endpoints
        .iter()
        .find(|e| e.is_remote() && e.ips().any(|i| i == ip("10.244.2.7")))
        .map(|e| e.policies.clone());
    assert_eq!(
        pa.and_then(|p| p.first().map(|p| p.settings["ProviderAddress"].clone())),
        Some(serde_json::json!("192.168.1.12")),
        "overlay: the remote node's provider address"
    );
}

/// #139519: while HNS was down, failed look-ups were taken as "absent"; HNS restored its
/// objects on restart and the creates then failed with 0xb7.
#[test]
fn bug_139519_hns_down_is_an_error_and_restored_objects_are_adopted() {
    let sim = hcn("L2Bridge");
    let mut d = Driver::new(&sim, config());
    let ports = [port("a", "10.96.0.10", &[ep("10.244.2.7", false)])];
    d.full(&ports).expect("cold");
    let before = sim.state();
    sim.restart();
    let err = d
        .full(&ports)
        .expect_err("HNS down: an error, not 'absent'");
    assert!(err.contains("unavailable"), "{err}");
    assert_eq!(sim.state(), before, "nothing torn down");
    sim.set_unavailable(false);
    sim.reset_calls();
    assert_eq!(d.full(&ports), Ok(0), "restored objects adopted");
    assert_eq!(sim.calls().total(), 3, "three enumerates, no create");
    assert_eq!(sim.state(), before);
}

#[test]
fn already_existing_objects_are_adopted_on_conflict() {
    let sim = hcn("L2Bridge");
    let mut d = Driver::new(&sim, config());
    d.full(&[]).expect("cold");
    // Someone (a previous kpng, HNS's restore) already made what the next change wants.
    let mut other = Driver::new(&sim, config());
    let ports = [port("a", "10.96.0.10", &[ep("10.244.2.7", false)])];
    other.full(&ports).expect("the other instance");
    let state = sim.state();
    sim.reset_calls();
    d.change(&ports).expect("adopts, no failure");
    let calls = sim.calls();
    assert_eq!(sim.state(), state, "nothing duplicated or replaced");
    assert_eq!(calls.of(Call::CreateEndpoint), 1, "0xb7 …");
    assert_eq!(calls.of(Call::CreateLoadBalancer), 1, "0x803b0013 …");
    assert_eq!(
        calls.of(Call::EnumerateEndpoints),
        1,
        "… then one look-up each"
    );
    assert_eq!(calls.of(Call::EnumerateLoadBalancers), 1);
    assert_eq!(calls.of(Call::DeleteLoadBalancer), 0);
    assert_eq!(d.backend.known().lbs.len(), 1);
    // Replaced behind its back: the cached ID answers "not found" (done, as far as this
    // delete goes) and the next full sync finds the newcomer and removes it.
    let changed = [port(
        "a",
        "10.96.0.10",
        &[ep("10.244.2.7", false), ep("10.244.1.5", true)],
    )];
    other
        .change(&changed)
        .expect("the other instance changes it");
    d.change(&[]).expect("remove (stale ID)");
    d.full(&[]).expect("full sync");
    assert!(sim.state().load_balancers.is_empty());
    assert!(sim.state().endpoints.iter().all(|e| !e.is_remote()));
}

#[test]
fn a_missing_network_is_an_error_naming_it() {
    let sim = hcn("L2Bridge");
    let mut d = Driver::new(
        &sim,
        HnsConfig {
            network_name: "vxlan0".into(),
            ..config()
        },
    );
    let err = d.full(&[]).expect_err("no such network");
    assert!(err.contains("vxlan0") && err.contains("cbr0"), "{err}");
}

#[test]
fn deleted_ports_take_every_frontend_and_unused_endpoints_with_them() {
    let sim = hcn("L2Bridge");
    let mut d = Driver::new(&sim, config());
    let mut p = port(
        "a",
        "10.96.0.10",
        &[ep("10.244.2.7", false), ep("10.244.1.5", true)],
    );
    p.node_port = Some(30080);
    p.external_ips = vec![ip("203.0.113.1")];
    let keep = port("b", "10.96.0.11", &[ep("10.244.2.8", false)]);
    d.full(&[p, keep.clone()]).expect("cold");
    assert_eq!(sim.state().load_balancers.len(), 4);
    sim.reset_calls();
    d.change(std::slice::from_ref(&keep)).expect("delete a");
    let state = sim.state();
    assert_eq!(state.load_balancers.len(), 1);
    assert_eq!(
        state.endpoints.len(),
        3,
        "2 CNI endpoints and b's remote one"
    );
    assert_eq!(
        sim.calls().total(),
        4,
        "3 load balancers and one remote endpoint"
    );
}

#[test]
fn stray_and_unknown_deletes_do_not_wedge_the_sync() {
    let sim = hcn("L2Bridge");
    let mut d = Driver::new(&sim, config());
    let ports = [port("a", "10.96.0.10", &[ep("10.244.1.5", true)])];
    d.full(&ports).expect("cold");
    // A second load balancer on the same frontend (HNS allowed it with another VIP order,
    // or a restore doubled it): found and removed by the full sync.
    let mut st = sim.state();
    let mut dup = st.load_balancers[0].clone();
    dup.id = "DUP".into();
    st.load_balancers.push(dup);
    sim.set_state(st);
    d.full(&ports).expect("full");
    assert_eq!(sim.state().load_balancers.len(), 1);
    // A delete answered "not found" counts as done.
    sim.fail_next(Call::DeleteLoadBalancer, E_NOT_FOUND);
    d.change(&[]).expect("not found is fine");
    assert!(d.backend.known().lbs.is_empty());
}

#[test]
fn the_state_file_is_written_and_an_edited_file_is_adopted() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("hcn.json");
    let initial = hcn("L2Bridge").state();
    std::fs::write(&path, serde_json::to_vec(&initial).expect("json")).expect("write");
    let sim = Simulator::with_file(&path, Network::default()).expect("open");
    let mut d = Driver::new(&sim, config());
    let ports = [port("a", "10.96.0.10", &[ep("10.244.2.7", false)])];
    d.full(&ports).expect("cold");
    let text = std::fs::read_to_string(&path).expect("read");
    let on_disk: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(on_disk["LoadBalancers"][0]["FrontendVIPs"][0], "10.96.0.10");
    assert_eq!(
        on_disk["LoadBalancers"][0]["PortMappings"][0]["ExternalPort"],
        80
    );
    // Out of band: the load balancer removed from the file.
    let mut st: State = serde_json::from_str(&text).expect("state");
    st.load_balancers.clear();
    std::fs::write(&path, serde_json::to_vec_pretty(&st).expect("json")).expect("write");
    d.full(&ports).expect("full sync");
    let back: State =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("state");
    assert_eq!(back.load_balancers.len(), 1, "re-created");
    // A removed file is written again at the next sync.
    std::fs::remove_file(&path).expect("rm");
    d.full(&ports).expect("full sync");
    assert!(path.exists());
}

#[test]
fn calls_are_counted_and_delayed() {
    let sim = hcn("L2Bridge");
    sim.set_delay(std::time::Duration::from_millis(5));
    let mut d = Driver::new(&sim, config());
    let started = std::time::Instant::now();
    d.full(&[port("a", "10.96.0.10", &[ep("10.244.1.5", true)])])
        .expect("sync");
    assert_eq!(sim.calls().total(), 4);
    assert!(started.elapsed() >= std::time::Duration::from_millis(20));
}

#[test]
fn hcn_spellings_of_ids_and_addresses_do_not_cause_churn() {
    let sim = hcn("L2Bridge");
    let mut d = Driver::new(&sim, config());
    let ports = [port("v6", "fd00:96::10", &[ep("fd00:244::5", false)])];
    d.full(&ports).expect("cold");
    // HCN answers with upper-case, braced GUIDs and its own address spelling.
    let mut st = sim.state();
    for lb in &mut st.load_balancers {
        lb.id = format!("{{{}}}", lb.id.to_uppercase());
        for id in &mut lb.host_compute_endpoints {
            *id = id.to_uppercase();
        }
        lb.frontend_vips = vec!["FD00:96:0::10".into()];
    }
    for e in &mut st.endpoints {
        e.id = e.id.to_uppercase();
    }
    sim.set_state(st);
    sim.reset_calls();
    assert_eq!(d.full(&ports), Ok(0), "nothing to replace");
    assert_eq!(sim.calls().total(), 3);
    // And lists HCN sends as null read as empty.
    let lb: LoadBalancer = serde_json::from_str(
        r#"{"ID":"x","HostComputeEndpoints":null,"FrontendVIPs":null,"PortMappings":null,"SourceVIP":null}"#,
    )
    .expect("nulls");
    assert!(lb.host_compute_endpoints.is_empty() && lb.source_vip.is_empty());
}

#[test]
fn on_overlay_the_source_vip_gets_its_endpoint_once() {
    let sim = hcn("Overlay");
    let cfg = HnsConfig {
        source_vips: vec![ip("10.244.1.2")],
        ..config()
    };
    let mut d = Driver::new(&sim, cfg);
    let ports = [port("a", "10.96.0.10", &[ep("10.244.2.7", false)])];
    d.full(&ports).expect("cold");
    let state = sim.state();
    let vip = state
        .endpoints
        .iter()
        .find(|e| e.ips().any(|i| i == ip("10.244.1.2")))
        .expect("the source VIP's endpoint");
    assert!(!vip.is_remote());
    assert_eq!(
        vip.policies[0].settings["ProviderAddress"],
        serde_json::json!(NODE_IP),
        "the node's address"
    );
    let lb = lb_at(&state, "10.96.0.10").expect("lb");
    assert_eq!(lb.source_vip, "10.244.1.2");
    sim.reset_calls();
    assert_eq!(d.full(&ports), Ok(0), "not created twice");
    assert_eq!(sim.calls().of(Call::CreateEndpoint), 0);
}

#[test]
fn internal_traffic_policy_local_uses_the_models_local_endpoints() {
    let mut p = port(
        "web",
        "10.96.0.10",
        &[ep("10.244.1.5", true), ep("10.244.2.7", false)],
    );
    p.internal_policy_local = true;
    // The model's lists are used as they are: here the cluster list holds a terminating
    // fallback the planner must not second-guess.
    p.cluster_endpoints = vec![ep("10.244.2.7", false)];
    let mut w = Vec::new();
    let lbs = plan_port(&p, &node(), &view("L2Bridge"), &config(), &mut w);
    let ips: Vec<IpAddr> = lbs[0].endpoints.iter().map(|e| e.ip()).collect();
    assert_eq!(ips, vec![ip("10.244.1.5")]);
    p.internal_policy_local = false;
    let lbs = plan_port(&p, &node(), &view("L2Bridge"), &config(), &mut w);
    let ips: Vec<IpAddr> = lbs[0].endpoints.iter().map(|e| e.ip()).collect();
    assert_eq!(ips, vec![ip("10.244.2.7")]);
}

#[test]
fn a_new_node_ip_moves_every_source_vip() {
    let sim = hcn("L2Bridge");
    let mut d = Driver::new(&sim, config());
    let ports = [port("a", "10.96.0.10", &[ep("10.244.2.7", false)])];
    d.full(&ports).expect("cold");
    let mut snap = snapshot(&ports);
    snap.node.ips = vec![ip("192.168.1.99")];
    let diff = Diff {
        node_changed: true,
        ..Diff::default()
    };
    d.backend
        .sync(&SyncRequest {
            diff: &diff,
            snapshot: &snap,
            full: false,
        })
        .expect("node change");
    let lb = lb_at(&sim.state(), "10.96.0.10").expect("lb");
    assert_eq!(lb.source_vip, "192.168.1.99");
}

#[test]
fn hcn_calls_are_metrics() {
    let sim = hcn("L2Bridge");
    let mut d = Driver::new(&sim, config());
    d.full(&[port("a", "10.96.0.10", &[ep("10.244.2.7", false)])])
        .expect("cold");
    let mut registry = prometheus_client::registry::Registry::default();
    d.backend.register_metrics(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    for line in [
        "kpng_hns_calls_total{call=\"create_load_balancer\",outcome=\"ok\"} 1",
        "kpng_hns_calls_total{call=\"create_endpoint\",outcome=\"ok\"} 1",
        "kpng_hns_calls_total{call=\"enumerate_networks\",outcome=\"ok\"} 1",
        "kpng_hns_load_balancers 1",
        "kpng_hns_remote_endpoints 1",
    ] {
        assert!(text.contains(line), "{line} missing in:\n{text}");
    }
}

#[test]
fn on_overlay_every_cluster_ip_gets_a_remote_endpoint_while_it_is_used() {
    let sim = hcn("Overlay");
    let mut d = Driver::new(&sim, overlay_config());
    let ports = [port("a", "10.96.0.10", &[ep("10.244.2.7", false)])];
    d.full(&ports).expect("cold");
    let vip_endpoint = |state: &State| {
        state
            .endpoints
            .iter()
            .find(|e| e.ips().any(|i| i == ip("10.96.0.10")))
            .cloned()
    };
    let vip = vip_endpoint(&sim.state()).expect("the ClusterIP's endpoint");
    assert!(vip.is_remote());
    assert_eq!(
        vip.policies[0].settings["ProviderAddress"],
        serde_json::json!(NODE_IP)
    );
    sim.reset_calls();
    assert_eq!(d.full(&ports), Ok(0), "kept, not re-created");
    d.change(&[]).expect("the Service goes");
    d.full(&[]).expect("the next full sync");
    assert!(
        vip_endpoint(&sim.state()).is_none(),
        "and so does its VIP endpoint"
    );
}

/// An HCN that records the JSON of every create request kpng sends, then asks the simulator.
struct Recording {
    inner: Simulator,
    sent: Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
}

impl Recording {
    fn record(&self, request: &impl serde::Serialize) {
        let json = serde_json::to_value(request).expect("serializes");
        if let Ok(mut sent) = self.sent.lock() {
            sent.push(json);
        }
    }
}

impl Hcn for Recording {
    fn enumerate_networks(&mut self) -> Result<Vec<Network>, crate::hcn::HcnError> {
        self.inner.enumerate_networks()
    }
    fn enumerate_endpoints(&mut self) -> Result<Vec<HcnEndpoint>, crate::hcn::HcnError> {
        self.inner.enumerate_endpoints()
    }
    fn enumerate_load_balancers(
        &mut self,
    ) -> Result<Vec<crate::schema::LoadBalancer>, crate::hcn::HcnError> {
        self.inner.enumerate_load_balancers()
    }
    fn create_endpoint(
        &mut self,
        endpoint: &HcnEndpoint,
    ) -> Result<HcnEndpoint, crate::hcn::HcnError> {
        self.record(endpoint);
        self.inner.create_endpoint(endpoint)
    }
    fn delete_endpoint(&mut self, id: &str) -> Result<(), crate::hcn::HcnError> {
        self.inner.delete_endpoint(id)
    }
    fn create_load_balancer(
        &mut self,
        lb: &crate::schema::LoadBalancer,
    ) -> Result<crate::schema::LoadBalancer, crate::hcn::HcnError> {
        self.record(lb);
        self.inner.create_load_balancer(lb)
    }
    fn delete_load_balancer(&mut self, id: &str) -> Result<(), crate::hcn::HcnError> {
        self.inner.delete_load_balancer(id)
    }
}

#[test]
fn create_requests_omit_an_empty_id_and_a_node_ports_empty_frontend_vips() {
    // hcsshim writes `json:"ID,omitempty"` and `FrontendVIPs json:",omitempty"`: HCN picks the
    // GUID, and a node port's load balancer has no frontend VIP field at all.
    let sent = Arc::new(std::sync::Mutex::new(Vec::new()));
    let recording = Recording {
        inner: hcn("L2Bridge"),
        sent: sent.clone(),
    };
    let mut backend = HnsBackend::new(config(), Box::new(recording));
    let mut p = port(
        "web",
        "10.96.0.20",
        &[ep("10.244.1.5", true), ep("10.244.2.7", false)],
    );
    p.node_port = Some(30080);
    let snap = snapshot(&[p]);
    let diff = Diff::full(&snap);
    backend
        .sync(&SyncRequest {
            diff: &diff,
            snapshot: &snap,
            full: true,
        })
        .expect("sync");
    let sent = sent.lock().expect("lock").clone();
    let endpoints: Vec<&serde_json::Value> = sent
        .iter()
        .filter(|r| r.get("IpConfigurations").is_some())
        .collect();
    let lbs: Vec<&serde_json::Value> = sent
        .iter()
        .filter(|r| r.get("PortMappings").is_some())
        .collect();
    assert_eq!(endpoints.len(), 1, "the remote endpoint: {sent:?}");
    assert_eq!(lbs.len(), 2, "ClusterIP and node port: {sent:?}");
    for request in &sent {
        assert!(request.get("ID").is_none(), "{request}");
    }
    let node_port = lbs
        .iter()
        .find(|l| l["PortMappings"][0]["ExternalPort"] == 30080)
        .expect("node-port request");
    assert!(node_port.get("FrontendVIPs").is_none(), "{node_port}");
    let cluster = lbs
        .iter()
        .find(|l| l["PortMappings"][0]["ExternalPort"] == 80)
        .expect("ClusterIP request");
    assert_eq!(cluster["FrontendVIPs"], serde_json::json!(["10.96.0.20"]));
}

#[test]
fn a_failed_sync_counts_agree_and_say_how_many_more_failed() {
    // One remote endpoint's create fails (so its ClusterIP's load balancer cannot be asked
    // for), and four load balancer creates fail: six failures, five change calls.
    let sim = hcn("L2Bridge");
    let mut d = Driver::new(&sim, config());
    let mut ports = vec![port("remote", "10.96.0.30", &[ep("10.244.2.7", false)])];
    for i in 0..4 {
        ports.push(port(
            &format!("web{i}"),
            &format!("10.96.0.{}", 40 + i),
            &[ep("10.244.1.5", true)],
        ));
    }
    sim.fail_next(Call::CreateEndpoint, E_INVALID_ARG);
    for _ in 0..4 {
        sim.fail_next(Call::CreateLoadBalancer, E_INVALID_ARG);
    }
    let err = d.full(&ports).expect_err("the sync fails");
    assert!(
        err.contains(
            "5 of its 5 HCN change calls failed, and 1 load balancer(s) could not be asked for"
        ),
        "{err}"
    );
    assert!(err.ends_with("; and 3 more"), "{err}");
    assert!(!err.contains("transaction of"), "{err}");
    // Only refused calls: no word about load balancers not asked for.
    let sim = hcn("L2Bridge");
    let mut d = Driver::new(&sim, config());
    sim.fail_next(Call::CreateLoadBalancer, E_INVALID_ARG);
    let err = d.full(&ports[1..2]).expect_err("the sync fails");
    assert!(
        err.starts_with("HNS sync failed: 1 of its 1 HCN change calls failed: "),
        "{err}"
    );
    assert!(!err.contains("more"), "{err}");
}

#[test]
fn overlay_without_a_source_vip_is_refused_at_start_naming_the_flag() {
    // Upstream winkernel refuses to start on Overlay without --source-vip ("source-vip flag
    // not set"); kpng used the node IP as SourceVIP without a word.
    let sim = hcn("Overlay");
    let mut backend = HnsBackend::new(config(), Box::new(sim.clone()));
    let err = backend
        .check_network()
        .expect_err("Overlay needs a source VIP")
        .to_string();
    assert!(
        err.contains("\"cbr0\" is an Overlay network")
            && err.contains("--source-vip")
            && err.contains("winkernel.sourceVip"),
        "{err}"
    );
    // It changed nothing, and a sync refuses as well (a network that appears after start).
    let mut d = Driver::new(&sim, config());
    let sync = d
        .full(&[port("a", "10.96.0.10", &[ep("10.244.1.5", true)])])
        .expect_err("no load balancer with the node IP as source VIP");
    assert!(sync.contains("--source-vip"), "{sync}");
    assert!(sim.state().load_balancers.is_empty());
    // With a source VIP, or on L2Bridge (the node IP), it starts.
    let mut backend = HnsBackend::new(overlay_config(), Box::new(hcn("Overlay")));
    assert_eq!(backend.check_network(), Ok(()));
    let mut backend = HnsBackend::new(config(), Box::new(hcn("L2Bridge")));
    assert_eq!(backend.check_network(), Ok(()));
    // No such network yet, or HNS down: the sync says so, not the start.
    let mut backend = HnsBackend::new(
        HnsConfig {
            network_name: "vxlan0".into(),
            ..config()
        },
        Box::new(hcn("Overlay")),
    );
    assert_eq!(backend.check_network(), Ok(()));
    let down = hcn("Overlay");
    down.set_unavailable(true);
    let mut backend = HnsBackend::new(config(), Box::new(down));
    assert_eq!(backend.check_network(), Ok(()));
}

// ---- IP families: winkernel's dual-stack decision ----

/// `network(kind)` with the pod subnets HCN lists in its `Ipams`.
fn network_with_subnets(kind: &str, subnets: &[&str]) -> Network {
    let mut n = network(kind);
    if !subnets.is_empty() {
        let subnets: Vec<serde_json::Value> = subnets
            .iter()
            .map(|s| serde_json::json!({ "IpAddressPrefix": s }))
            .collect();
        n.extra.insert(
            "Ipams".into(),
            serde_json::json!([{ "Type": "Static", "Subnets": subnets }]),
        );
    }
    n
}

#[test]
fn the_families_served_follow_winkernels_dual_stack_decision_and_the_networks_subnets() {
    use crate::plan::served_families;
    struct Case {
        what: &'static str,
        kind: &'static str,
        subnets: &'static [&'static str],
        node_ips: &'static [&'static str],
        served: &'static [Family],
        why: Option<&'static str>,
    }
    let both: &[Family] = &[Family::V4, Family::V6];
    let cases = [
        Case {
            what: "L2Bridge, subnets not listed: both, as before",
            kind: "L2Bridge",
            subnets: &[],
            node_ips: &[NODE_IP, "fd00::10"],
            served: both,
            why: None,
        },
        Case {
            what: "L2Bridge, a subnet of each family: dual-stack",
            kind: "L2Bridge",
            subnets: &["10.244.1.0/24", "fd00:244:1::/64"],
            node_ips: &[NODE_IP, "fd00::10"],
            served: both,
            why: None,
        },
        Case {
            what: "L2Bridge, IPv4 subnets only",
            kind: "L2Bridge",
            subnets: &["10.244.1.0/24"],
            node_ips: &[NODE_IP, "fd00::10"],
            served: &[Family::V4],
            why: Some(
                "HNS network cbr0 has no IPv6 subnet (its subnets: 10.244.1.0/24): IPv6 \
                 Service ports get no load balancer",
            ),
        },
        Case {
            what: "L2Bridge, IPv6 subnets only",
            kind: "L2Bridge",
            subnets: &["fd00:244:1::/64"],
            node_ips: &["fd00::10"],
            served: &[Family::V6],
            why: Some("HNS network cbr0 has no IPv4 subnet"),
        },
        Case {
            what: "Overlay: single-stack in the node's primary family, even with both subnets",
            kind: "Overlay",
            subnets: &["10.244.1.0/24", "fd00:244:1::/64"],
            node_ips: &[NODE_IP, "fd00::10"],
            served: &[Family::V4],
            why: Some(
                "HNS network cbr0 is an Overlay network, which kube-proxy's winkernel serves \
                 single-stack",
            ),
        },
        Case {
            what: "Overlay, an IPv6-primary node",
            kind: "overlay",
            subnets: &[],
            node_ips: &["fd00::10", NODE_IP],
            served: &[Family::V6],
            why: Some("IPv6 Services only, the node's primary family; IPv4 Service ports"),
        },
        Case {
            what: "Overlay, no node IP yet: the subnets' family",
            kind: "Overlay",
            subnets: &["fd00:244:1::/64"],
            node_ips: &[],
            served: &[Family::V6],
            why: Some("IPv6 Services only"),
        },
    ];
    for c in cases {
        let view = NetworkView::of(&network_with_subnets(c.kind, c.subnets));
        let ips: Vec<IpAddr> = c.node_ips.iter().map(|s| ip(s)).collect();
        let got = served_families("cbr0", &view, &ips);
        assert_eq!(got.served, c.served, "{}", c.what);
        match (c.why, &got.skipped) {
            (None, None) => {}
            (Some(why), Some((family, said))) => {
                assert!(!c.served.contains(family), "{}: {family}", c.what);
                assert!(said.contains(why), "{}: {said}", c.what);
            }
            (want, got) => panic!("{}: want {want:?}, got {got:?}", c.what),
        }
    }
}

/// A dual-stack cluster on a single-stack HNS network: the IPv6 ports get no load balancer
/// (those made before the network was known to be IPv4-only go at the next full sync), the
/// IPv4 ones are programmed, and the summary (`kpng status`) says which family is left out.
#[test]
fn a_single_stack_network_gets_no_load_balancer_of_the_other_family() {
    let sim = Simulator::new(State {
        networks: vec![network("L2Bridge")],
        endpoints: vec![cni_endpoint("LOCAL-5", "10.244.1.5")],
        load_balancers: vec![],
    });
    let mut d = Driver::new(&sim, config());
    let ports = [
        port("web", "10.96.0.10", &[ep("10.244.2.7", false)]),
        port("web", "fd00:96::10", &[ep("fd00:244:2::7", false)]),
    ];
    let ipv6_lbs = |state: &State| {
        state
            .load_balancers
            .iter()
            .filter(|l| l.flags & lb_flags::IPV6 != 0)
            .count()
    };
    // Subnets not listed: both families, as before.
    d.full(&ports).expect("sync");
    assert_eq!(ipv6_lbs(&sim.state()), 1);
    assert_eq!(
        d.backend.summary().lock().expect("summary").skipped_family,
        None
    );
    // HCN now says the network's subnets: IPv4 only.
    let mut state = sim.state();
    state.networks = vec![network_with_subnets("L2Bridge", &["10.244.1.0/24"])];
    sim.set_state(state);
    d.full(&ports).expect("sync");
    let state = sim.state();
    assert_eq!(ipv6_lbs(&state), 0, "{:?}", state.load_balancers);
    assert!(lb_at(&state, "10.96.0.10").is_some(), "IPv4 still served");
    assert!(
        !state.endpoints.iter().any(|e| e.ips().any(|a| a.is_ipv6())),
        "no IPv6 remote endpoint is kept: {:?}",
        state.endpoints
    );
    let skipped = d
        .backend
        .summary()
        .lock()
        .expect("summary")
        .skipped_family
        .clone();
    assert_eq!(
        skipped.as_deref(),
        Some(
            "HNS network cbr0 has no IPv6 subnet (its subnets: 10.244.1.0/24): IPv6 Service \
             ports get no load balancer"
        )
    );
    // An IPv6 change alone asks HNS for nothing.
    sim.reset_calls();
    d.change(&[
        ports[0].clone(),
        port("web", "fd00:96::10", &[ep("fd00:244:2::8", false)]),
    ])
    .expect("sync");
    assert_eq!(sim.calls().total(), 0, "{:?}", sim.calls());
}
