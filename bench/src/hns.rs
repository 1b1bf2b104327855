//! The Windows backend's cost in HCN calls: upstream's anchor shape (kubernetes#109162: 2000
//! ClusterIP Services on a node with 5000 remote endpoints and 15 local ones, 114–192 min to
//! start on Windows Server 2019/2022) against the HCN simulator with a fixed delay per call.
//!
//! Runs in process (no root, no Windows): the model's snapshot is built directly and handed to
//! `HnsBackend` as the runner would. Reports the cold programming time and HCN call count beside
//! the minimum (one create per object), and one endpoint change's calls and time.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kpng_backend::{Backend, SyncRequest};
use kpng_backend_hns::schema::{Endpoint as HcnEndpoint, IpConfig, Network, State};
use kpng_backend_hns::sim::Simulator;
use kpng_backend_hns::{HnsBackend, HnsConfig};
use kpng_model::{
    Diff, Endpoint, Family, NodeState, PortKey, Protocol, ServiceKey, ServicePort, Snapshot,
};

/// One run's figures.
pub struct HnsResult {
    services: usize,
    remote: usize,
    local: usize,
    delay: Duration,
    cold: Duration,
    cold_calls: u64,
    minimum: u64,
    change: Duration,
    change_calls: u64,
}

impl HnsResult {
    /// The table header.
    pub fn markdown_header() -> &'static str {
        "| Services | remote endpoints | local endpoints | delay per HCN call | cold programming | HCN calls (minimum) | one endpoint change | its HCN calls |\n|---|---|---|---|---|---|---|---|\n"
    }

    /// One row.
    pub fn markdown_row(&self) -> String {
        format!(
            "| {} | {} | {} | {:?} | {:.1} s | {} ({}) | {:.1} ms | {} |",
            self.services,
            self.remote,
            self.local,
            self.delay,
            self.cold.as_secs_f64(),
            self.cold_calls,
            self.minimum,
            self.change.as_secs_f64() * 1e3,
            self.change_calls,
        )
    }
}

fn pod_ip(i: usize) -> IpAddr {
    // 10.244.0.0/14: a /24 per 250 pods, as a CNI would hand them out.
    let i = u32::try_from(i).unwrap_or(u32::MAX);
    IpAddr::V4(Ipv4Addr::new(
        10,
        244 + (i / 62500) as u8,
        ((i / 250) % 250) as u8,
        (i % 250 + 2) as u8,
    ))
}

fn snapshot(services: usize, pool: &[(IpAddr, bool)], per_service: usize) -> Snapshot {
    let mut ports = BTreeMap::new();
    for s in 0..services {
        let key = PortKey {
            service: ServiceKey::new("bench", format!("svc-{s}")),
            port_name: "http".into(),
            protocol: Protocol::Tcp,
            family: Family::V4,
        };
        let s32 = u32::try_from(s).unwrap_or(0);
        let vip = IpAddr::V4(Ipv4Addr::new(
            10,
            96,
            (s32 / 250) as u8,
            (s32 % 250 + 1) as u8,
        ));
        let mut p = ServicePort::new(key.clone(), vip, 80);
        p.cluster_endpoints = (0..per_service)
            .map(|k| {
                let (ip, local) = pool[(s * per_service + k) % pool.len()];
                Endpoint {
                    ip,
                    port: 8080,
                    is_local: local,
                    ready: true,
                    serving: true,
                    terminating: false,
                }
            })
            .collect();
        kpng_model::sort_endpoints(&mut p.cluster_endpoints);
        p.has_any_endpoints = true;
        ports.insert(key, Arc::new(p));
    }
    Snapshot {
        node: NodeState {
            name: "win-1".into(),
            known: true,
            ips: vec![
                "192.168.0.10"
                    .parse()
                    .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            ],
            ..NodeState::default()
        },
        ports,
        service_cidrs: vec![],
    }
}

/// Programs `services` ClusterIP Services over `remote` remote and `local` local endpoints
/// cold, with `delay` per HCN call, then changes one endpoint.
pub fn run(
    services: usize,
    remote: usize,
    local: usize,
    delay: Duration,
) -> Result<HnsResult, String> {
    let pool: Vec<(IpAddr, bool)> = (0..remote + local)
        .map(|i| (pod_ip(i), i >= remote))
        .collect();
    let per_service = (remote + local).div_ceil(services).max(1);
    let network = Network {
        id: "NET".into(),
        name: "cbr0".into(),
        network_type: "L2Bridge".into(),
        ..Network::default()
    };
    let cni: Vec<HcnEndpoint> = pool
        .iter()
        .filter(|(_, l)| *l)
        .enumerate()
        .map(|(i, (ip, _))| HcnEndpoint {
            id: format!("CNI-{i}"),
            host_compute_network: "NET".into(),
            ip_configurations: vec![IpConfig {
                ip_address: ip.to_string(),
                prefix_length: Some(24),
            }],
            ..HcnEndpoint::default()
        })
        .collect();
    let sim = Simulator::new(State {
        networks: vec![network],
        endpoints: cni,
        load_balancers: vec![],
    });
    sim.set_delay(delay);
    let config = HnsConfig {
        network_name: "cbr0".into(),
        ..HnsConfig::default()
    };
    let mut backend = HnsBackend::new(config, Box::new(sim.clone()));
    let snap = snapshot(services, &pool, per_service);
    let started = Instant::now();
    backend
        .sync(&SyncRequest {
            diff: &Diff::full(&snap),
            snapshot: &snap,
            full: true,
        })
        .map_err(|e| format!("cold sync: {e}"))?;
    let cold = started.elapsed();
    let cold_calls = sim.calls().total();
    let state = sim.state();
    let minimum = (state.load_balancers.len() + state.endpoints.len() - local) as u64;
    // One endpoint change: a new remote pod joins the first Service.
    let mut next = snap.clone();
    let first = next.ports.keys().next().cloned().ok_or("no Service")?;
    let old = next.ports.get(&first).cloned().ok_or("no Service")?;
    let mut changed = (*old).clone();
    changed.cluster_endpoints.push(Endpoint {
        ip: pod_ip(remote + local + 1),
        port: 8080,
        is_local: false,
        ready: true,
        serving: true,
        terminating: false,
    });
    kpng_model::sort_endpoints(&mut changed.cluster_endpoints);
    let changed = Arc::new(changed);
    next.ports.insert(first.clone(), changed.clone());
    let mut diff = Diff::default();
    diff.record(first, Some(old), Some(changed));
    sim.reset_calls();
    let started = Instant::now();
    backend
        .sync(&SyncRequest {
            diff: &diff,
            snapshot: &next,
            full: false,
        })
        .map_err(|e| format!("endpoint change: {e}"))?;
    Ok(HnsResult {
        services,
        remote,
        local,
        delay,
        cold,
        cold_calls,
        minimum,
        change: started.elapsed(),
        change_calls: sim.calls().total(),
    })
}
