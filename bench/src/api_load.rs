//! API-server load: N nodes each watching the API server against one brain serving N nodes
//! (issue #19), from the fake API server's own counters.
//!
//! - **N nodes watching**: N `kube` sources (the `kpng-source-kube` library, as `kpng kube …`
//!   runs it, each with its own client, rate limiter and node name) in N tasks of this
//!   process, each listing and watching Services, EndpointSlices, its Node and ServiceCIDRs.
//! - **one brain**: `kpng kube … to-api` (one list and watch of each kind, every Node) and N
//!   simulated `api` nodes in a separate process (`kpng-bench api-clients`), each holding its
//!   own stream from the brain.
//!
//! Each side gets a fresh fake API server with the same objects. Measured: what the API server
//! answered and sent until all N nodes hold the initial state (requests, list pages, watches,
//! bytes, watch streams open), then for one Service update (a port added) until all N nodes
//! have it.

use std::time::{Duration, Instant};

use kpng_fake_apiserver::{FakeApiServer, ServerLoad};
use kpng_model::{Event, Kind, Object};
use tokio::sync::mpsc;

use crate::api::{BrainProcess, collect_lines, start_clients};
use crate::control::Scratch;
use crate::workload::{self, Endpoints};

/// The figures of one side.
#[derive(Debug)]
struct Side {
    label: String,
    /// One brain (else every node watches the API server).
    brain: bool,
    nodes: usize,
    initial: ServerLoad,
    initial_time: Duration,
    change: ServerLoad,
    change_time: Duration,
}

/// Figures of one API-load run.
#[derive(Debug)]
pub struct ApiLoadResult {
    n: usize,
    m: usize,
    sides: Vec<Side>,
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

fn kb(bytes: u64) -> String {
    format!("{:.1} kB", bytes as f64 / 1e3)
}

/// What the API server answered until all N nodes held the initial state, for a curve over N
/// (`kpng-bench scaling`).
#[derive(Debug, Clone, Copy)]
pub struct InitialLoad {
    /// One brain served the nodes (else every node watched the API server).
    pub brain: bool,
    /// N.
    pub nodes: usize,
    /// Response bytes the API server sent.
    pub bytes_sent: u64,
    /// Watch streams open once all nodes held the state.
    pub watches_open: u64,
}

impl ApiLoadResult {
    /// Every side's initial-state load, in run order.
    pub fn initial_loads(&self) -> Vec<InitialLoad> {
        self.sides
            .iter()
            .map(|s| InitialLoad {
                brain: s.brain,
                nodes: s.nodes,
                bytes_sent: s.initial.bytes_sent,
                watches_open: s.initial.watches_open,
            })
            .collect()
    }

    /// The table.
    pub fn markdown(&self) -> String {
        let mut s = format!(
            "API server: {} Services × {} endpoints (JSON objects as a cluster returns them, lists in pages of 500).\n\n\
             | who watches the API server | nodes | initial state: requests (list pages / watches) | bytes sent | watch streams open | all nodes hold it after | one Service update: bytes sent | requests | all nodes have it after |\n|---|---|---|---|---|---|---|---|---|\n",
            self.n, self.m
        );
        for side in &self.sides {
            s.push_str(&format!(
                "| {} | {} | {} ({} / {}) | {} | {} | {:.2} s | {} | {} | {:.0} ms |\n",
                side.label,
                side.nodes,
                side.initial.requests,
                side.initial.lists,
                side.initial.watches,
                mb(side.initial.bytes_sent),
                side.initial.watches_open,
                side.initial_time.as_secs_f64(),
                kb(side.change.bytes_sent),
                side.change.requests,
                side.change_time.as_secs_f64() * 1000.0,
            ));
        }
        s
    }
}

/// A fresh fake API server with the workload spread over `nodes` nodes, and their Nodes.
fn fake(
    n: usize,
    m: usize,
    nodes: usize,
    scratch: &std::path::Path,
) -> Result<(FakeApiServer, std::path::PathBuf), String> {
    let server = FakeApiServer::builder()
        .bookmark_interval(None)
        .start()
        .map_err(|e| e.to_string())?;
    for k in 0..nodes {
        let ip = format!("192.168.{}.{}", 200 + k / 250, k % 250 + 1);
        let cidr = format!("10.{}.{}.0/24", 64 + k / 256, k % 256);
        server
            .apply(workload::node_object(&format!("node{k}"), &ip, &cidr))
            .map_err(|e| e.to_string())?;
    }
    for i in 0..n {
        for object in workload::service_objects(i, m, Endpoints::Spread(nodes), 0) {
            server.apply(object).map_err(|e| e.to_string())?;
        }
    }
    let kubeconfig = scratch.join(format!("kubeconfig-{nodes}"));
    server
        .write_kubeconfig(&kubeconfig)
        .map_err(|e| e.to_string())?;
    Ok((server, kubeconfig))
}

/// The update every node must see: Service `s0` gains a port.
fn change(server: &FakeApiServer, m: usize, nodes: usize) -> Result<(), String> {
    let mut service = workload::service_objects(0, m, Endpoints::Spread(nodes), 0)
        .into_iter()
        .next()
        .ok_or("no Service")?;
    if let Some(ports) = service
        .pointer_mut("/spec/ports")
        .and_then(|p| p.as_array_mut())
    {
        ports.push(
            serde_json::json!({"name": "https", "port": 443, "protocol": "TCP",
            "targetPort": 8443}),
        );
    }
    server.apply(service).map_err(|e| e.to_string())?;
    Ok(())
}

/// What a simulated node reports.
enum Report {
    /// Its Service, EndpointSlice and Node lists are done.
    Initial,
    /// A Service update arrived after the initial state.
    Changed,
}

/// One node: the `kube` source as `kpng kube --node-name nodeK` runs it, its events counted.
async fn kube_node(
    kubeconfig: std::path::PathBuf,
    k: usize,
    reports: mpsc::UnboundedSender<Report>,
) -> Result<(), String> {
    let options = kpng_source_kube::ClientOptions {
        kubeconfig: Some(kubeconfig),
        ..kpng_source_kube::ClientOptions::default()
    };
    let (client, _) = kpng_source_kube::client(&options)
        .await
        .map_err(|e| e.to_string())?;
    let source = kpng_source_kube::KubeSource::new(
        client,
        kpng_source_kube::SourceConfig {
            node_name: Some(format!("node{k}")),
            service_proxy_name: None,
        },
    );
    let (tx, mut rx) = mpsc::channel(1024);
    tokio::spawn(source.run(tx));
    let mut done: Vec<Kind> = Vec::new();
    let mut initial = false;
    while let Some(event) = rx.recv().await {
        match event {
            Event::ListDone { kinds } => {
                done.extend(kinds);
                let all = [Kind::Service, Kind::EndpointSlice, Kind::Node]
                    .iter()
                    .all(|k| done.contains(k));
                if all && !initial {
                    initial = true;
                    let _ = reports.send(Report::Initial);
                }
            }
            Event::Apply(Object::Service(_)) if initial => {
                let _ = reports.send(Report::Changed);
            }
            _ => {}
        }
    }
    Ok(())
}

/// Waits for `count` reports of the kind `want` picks.
async fn wait_reports(
    rx: &mut mpsc::UnboundedReceiver<Report>,
    count: usize,
    want: fn(&Report) -> bool,
    timeout: Duration,
) -> Result<(), String> {
    let mut k = 0;
    while k < count {
        let report = tokio::time::timeout(timeout, rx.recv())
            .await
            .map_err(|_| format!("only {k} of {count} nodes reported within {timeout:?}"))?
            .ok_or("the nodes ended")?;
        if want(&report) {
            k += 1;
        }
    }
    Ok(())
}

/// N nodes each watching the API server.
fn every_node_watches(
    n: usize,
    m: usize,
    nodes: usize,
    scratch: &std::path::Path,
) -> Result<Side, String> {
    let (server, kubeconfig) = fake(n, m, nodes, scratch)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let side = runtime.block_on(async {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let before = server.load();
        let t0 = Instant::now();
        for k in 0..nodes {
            let kubeconfig = kubeconfig.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                if let Err(e) = kube_node(kubeconfig, k, tx).await {
                    eprintln!("node{k}: {e}");
                }
            });
        }
        let long = Duration::from_secs(600);
        wait_reports(&mut rx, nodes, |r| matches!(r, Report::Initial), long).await?;
        let initial_time = t0.elapsed();
        // Let the watches that follow the lists open (each node's last list ends before its
        // watches start).
        settle_watches(&server, 4 * nodes as u64).await;
        let initial = server.load().since(&before);
        let before = server.load();
        let t = Instant::now();
        change(&server, m, nodes)?;
        wait_reports(&mut rx, nodes, |r| matches!(r, Report::Changed), long).await?;
        let change_time = t.elapsed();
        let change = server.load().since(&before);
        Ok::<_, String>(Side {
            label: "every node (the `kube` source, as `kpng kube …` runs it)".into(),
            brain: false,
            nodes,
            initial,
            initial_time,
            change,
            change_time,
        })
    });
    runtime.shutdown_background();
    side
}

/// Waits (up to 5 s) until `count` watch streams are open.
async fn settle_watches(server: &FakeApiServer, count: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.load().watches_open < count && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One brain serving N nodes.
fn one_brain(
    kpng: &str,
    n: usize,
    m: usize,
    nodes: usize,
    scratch: &std::path::Path,
) -> Result<Side, String> {
    let (server, kubeconfig) = fake(n, m, nodes, scratch)?;
    let socket = scratch.join(format!("brain-{nodes}.sock"));
    let log = std::fs::File::create(scratch.join(format!("brain-{nodes}.log")))
        .map_err(|e| e.to_string())?;
    let before = server.load();
    let t0 = Instant::now();
    let brain = BrainProcess(
        std::process::Command::new(kpng)
            .arg("kube")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args([
                "--metrics-bind-address",
                "",
                "--admin-socket",
                "",
                "--healthz-bind-address",
                "127.0.0.1:0",
                "--service-node-port-range",
                crate::workload::NODE_PORT_RANGE,
                "to-api",
                "--listen",
            ])
            .arg(format!("unix://{}", socket.display()))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::from(log))
            .spawn()
            .map_err(|e| format!("starting the brain: {e}"))?,
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let side = runtime.block_on(async {
        while !socket.exists() {
            if t0.elapsed() > Duration::from_secs(120) {
                return Err("the brain did not listen within 120 s".to_string());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (_clients, mut lines) = start_clients(&socket, nodes, crate::api::Nodes::KPNG)?;
        let long = Duration::from_secs(600);
        collect_lines(&mut lines, nodes, long).await?;
        let initial_time = t0.elapsed();
        settle_watches(&server, 4).await;
        let initial = server.load().since(&before);
        let before = server.load();
        let t = Instant::now();
        change(&server, m, nodes)?;
        collect_lines(&mut lines, nodes, long).await?;
        let change_time = t.elapsed();
        let change = server.load().since(&before);
        Ok(Side {
            label: "one brain (`kpng kube … to-api`), nodes on `kpng api`".into(),
            brain: true,
            nodes,
            initial,
            initial_time,
            change,
            change_time,
        })
    });
    drop(brain);
    runtime.shutdown_background();
    side
}

/// Runs both sides for every node count.
pub fn run(kpng: &str, n: usize, m: usize, counts: &[usize]) -> Result<ApiLoadResult, String> {
    let scratch = Scratch::new(&format!("apiload{n}"))?;
    let mut sides = Vec::new();
    for &nodes in counts {
        eprintln!("api-load: {nodes} nodes each watching the API server …");
        sides.push(every_node_watches(n, m, nodes, &scratch.0)?);
        eprintln!("api-load: one brain serving {nodes} nodes …");
        sides.push(one_brain(kpng, n, m, nodes, &scratch.0)?);
    }
    Ok(ApiLoadResult { n, m, sides })
}
