//! The API benchmark: one brain (`kpng file … to-api` on a Unix socket), N Services × M
//! endpoints spread over as many nodes as there are clients, and that many simulated node
//! clients in a separate process (`kpng-bench api-clients`: each its own connection and Watch
//! stream, decoding every op and every `Service` and `Endpoint` value it receives, or with
//! `--read frames` only taking the stream apart into messages: [`crate::node_codec`]), so that
//! the brain's own CPU time is visible. Measures the time until every client holds the initial
//! state, the time for one endpoint change to reach every client, the brain's memory and its
//! CPU seconds per node and per change, and the simulated nodes' CPU per change beside it.

use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use kpng_api::proto;
use tokio::sync::{Barrier, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Endpoint;

use crate::control::{Scratch, peak_rss_mb};
use crate::node_codec::{NodeCodec, Reading, Received};
use crate::stats::percentile;
use crate::workload::{self, Endpoints};

/// Figures of one API run.
#[derive(Debug)]
pub struct ApiResult {
    label: String,
    n: usize,
    m: usize,
    clients: usize,
    load: Duration,
    initial_all: Duration,
    ops_per_client: usize,
    change_p50: Duration,
    change_p99: Duration,
    rss_mb: f64,
    peak_rss_mb: f64,
    /// Brain CPU from the clients' start until all hold the initial state.
    initial_cpu: Duration,
    /// Brain CPU per change while every client receives it: the mean over the changes, as
    /// the process's CPU clock counts in 10 ms ticks (a median of single changes reads
    /// 10 or 20 ms whatever the cost).
    change_cpu: Duration,
    /// The simulated nodes' CPU per change (their process, measured as `change_cpu`). On one
    /// machine they share the brain's CPUs, so the two together, divided by the CPUs, bound
    /// how soon the last node can hold a change; in a cluster each node reads on its own CPU.
    nodes_change_cpu: Duration,
    /// Bytes the brain wrote (`/proc/PID/io` `wchar`: its streams, and a few log lines) from
    /// the clients' start until all hold the initial state, per node: what the initial state
    /// costs the network.
    initial_bytes_per_node: u64,
}

impl ApiResult {
    /// Simulated nodes served.
    pub fn clients(&self) -> usize {
        self.clients
    }

    /// From the clients' start until every one holds the initial state.
    pub fn initial_all(&self) -> Duration {
        self.initial_all
    }

    /// The brain's CPU for the initial state divided by the nodes it served: what a node
    /// costs the brain, the figure that carries over to a cluster whose nodes decode on
    /// their own CPUs.
    pub fn initial_cpu_per_node(&self) -> Duration {
        self.initial_cpu / self.clients.max(1) as u32
    }

    /// The table header matching [`ApiResult::markdown_row`].
    pub fn markdown_header() -> &'static str {
        "| brain | Services × endpoints | clients | brain load → first client synced | all clients hold the initial state | ops per client | brain CPU, initial state: total / per node | brain bytes sent per node, initial state | one change reaches all: p50 | p99 | brain CPU per change | nodes' CPU per change | brain RSS after | brain peak RSS |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    }

    /// One table row.
    pub fn markdown_row(&self) -> String {
        format!(
            "| {} | {} × {} | {} | {:.2} s | {:.2} s | {} | {:.2} s / {:.2} ms | {:.2} MB | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.0} MiB | {:.0} MiB |",
            self.label,
            self.n,
            self.m,
            self.clients,
            self.load.as_secs_f64(),
            self.initial_all.as_secs_f64(),
            self.ops_per_client,
            self.initial_cpu.as_secs_f64(),
            self.initial_cpu_per_node().as_secs_f64() * 1000.0,
            self.initial_bytes_per_node as f64 / 1e6,
            self.change_p50.as_secs_f64() * 1000.0,
            self.change_p99.as_secs_f64() * 1000.0,
            self.change_cpu.as_secs_f64() * 1000.0,
            self.nodes_change_cpu.as_secs_f64() * 1000.0,
            self.rss_mb,
            self.peak_rss_mb,
        )
    }
}

/// Bytes `pid` has written so far (`wchar` of `/proc/PID/io`; 0 when it cannot be read).
fn written(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .ok()
        .and_then(|io| {
            io.lines()
                .find_map(|l| l.strip_prefix("wchar:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// A brain process, killed on drop.
pub(crate) struct BrainProcess(pub(crate) Child);

impl Drop for BrainProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn rss_mb(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// What all simulated nodes together let the brain send ahead of their decoding: each node's
/// HTTP/2 window is its share, between 64 KiB and 4 MiB. With a fixed 4 MiB, 5,000 nodes that
/// decode slower than the brain sends would buffer up to 20 GB in the clients' process.
const CLIENTS_WINDOW_BUDGET: usize = 1 << 30;

/// One node's HTTP/2 window when `clients` share [`CLIENTS_WINDOW_BUDGET`].
fn window_per_client(clients: usize) -> u32 {
    let share = CLIENTS_WINDOW_BUDGET / clients.max(1);
    u32::try_from(share.clamp(64 << 10, 4 << 20)).unwrap_or(4 << 20)
}

/// How many ops (about 2.5 ms of decoding) a simulated node decodes before it lets the
/// others run. Without it a node with a full window decodes for tens of milliseconds at a
/// stretch; with thousands of nodes on two threads the connections' own tasks then wait longer
/// than the brain's keepalive timeout to answer a ping, and the brain closes them as dead.
/// Yielding every 256 ops instead cost the brain 1.5× the CPU per node at 200 nodes (smaller
/// reads, more wake-ups); 2,048 cost nothing measurable.
const OPS_BEFORE_YIELD: usize = 2048;

/// How often a simulated node asks for change sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asking {
    /// Once (`WatchReq.continuous`), as kpng's own client does with a brain that honours it.
    Once,
    /// Before each change set, as KPNG's clients and kpng before `continuous` did.
    EachChangeSet,
}

impl Asking {
    /// The name on the command line (`--ask once|each`).
    pub fn name(self) -> &'static str {
        match self {
            Asking::Once => "once",
            Asking::EachChangeSet => "each",
        }
    }

    /// Parses [`Asking::name`].
    pub fn parse(name: &str) -> Result<Asking, String> {
        match name {
            "once" => Ok(Asking::Once),
            "each" => Ok(Asking::EachChangeSet),
            other => Err(format!("--ask {other:?}: expected once or each")),
        }
    }
}

/// How the simulated nodes behave.
#[derive(Debug, Clone, Copy)]
pub struct Nodes {
    /// What they do with the messages.
    pub reading: Reading,
    /// How often they ask for change sets.
    pub asking: Asking,
    /// Whether they read bundles (`WatchReq.AcceptZstd`).
    pub bundles: bool,
}

impl Nodes {
    /// Nodes as kpng's: decoding everything, asking once, reading bundles.
    pub const KPNG: Nodes = Nodes {
        reading: Reading::Decode,
        asking: Asking::Once,
        bundles: true,
    };

    /// The `api-clients` flags that make its nodes behave so.
    fn flags(self) -> [String; 6] {
        [
            "--read".into(),
            self.reading.name().into(),
            "--ask".into(),
            self.asking.name().into(),
            "--zstd".into(),
            if self.bundles { "on" } else { "off" }.into(),
        ]
    }

    /// How a table row names them, after the brain's label.
    fn describe(self) -> String {
        let mut how = Vec::new();
        if self.reading == Reading::Frames {
            how.push("read frames only");
        }
        if self.asking == Asking::EachChangeSet {
            how.push("ask for each change set");
        }
        if !self.bundles {
            how.push("without bundles");
        }
        if how.is_empty() {
            String::new()
        } else {
            format!(" (nodes {})", how.join(", "))
        }
    }
}

async fn connect(socket: &Path, clients: usize) -> Result<tonic::transport::Channel, String> {
    let path = socket.to_path_buf();
    let window = window_per_client(clients);
    Endpoint::from_static("http://localhost")
        .initial_stream_window_size(Some(window))
        .initial_connection_window_size(Some(window))
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
        .map_err(|e| format!("connecting to the brain: {e}"))
}

/// One simulated node: reads every op as `reading` says; reports (client, ops) at every Sync.
async fn client(
    socket: &Path,
    clients: usize,
    nodes: Nodes,
    index: usize,
    node: String,
    start: Arc<Barrier>,
    syncs: mpsc::UnboundedSender<(usize, usize)>,
) -> Result<(), String> {
    let Nodes {
        reading,
        asking,
        bundles,
    } = nodes;
    let channel = connect(socket, clients).await?;
    start.wait().await;
    let (requests, rx) = mpsc::channel(2);
    // Asking once, as kpng's own client does, a brain that does not say it honours that (an
    // older kpng given as `--before`) is still asked for each change set.
    let request = proto::WatchReq {
        node_name: node,
        continuous: asking == Asking::Once,
        accept_zstd: bundles,
    };
    let _ = requests.send(request.clone()).await;
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(64 << 20);
    grpc.ready().await.map_err(|e| format!("connecting: {e}"))?;
    let response = grpc
        .streaming(
            tonic::Request::new(ReceiverStream::new(rx)),
            PathAndQuery::from_static(kpng_api::server::WATCH_PATH),
            NodeCodec(reading),
        )
        .await
        .map_err(|e| format!("watch: {e}"))?;
    let continuous = asking == Asking::Once
        && response
            .metadata()
            .get(kpng_api::server::CONTINUOUS_HEADER)
            .is_some();
    let mut stream = response.into_inner();
    let mut ops = 0;
    while let Some(received) = stream.message().await.map_err(|e| format!("stream: {e}"))? {
        if received == Received::Sync {
            if syncs.send((index, ops)).is_err() {
                return Ok(());
            }
            ops = 0;
            if !continuous {
                let _ = requests.send(request.clone()).await;
            }
            continue;
        }
        let before = ops;
        ops += match received {
            Received::Bundle(n) => n as usize,
            _ => 1,
        };
        if ops / OPS_BEFORE_YIELD != before / OPS_BEFORE_YIELD {
            tokio::task::yield_now().await;
        }
    }
    Ok(())
}

/// `kpng-bench api-clients --socket PATH --clients N [--read decode|frames]`: N simulated
/// nodes (`node0`…) in this process. Prints `start` once every client is connected, then
/// `sync CLIENT OPS` at every Sync a client receives; ends when stdin closes.
pub fn clients_main(socket: &Path, clients: usize, nodes: Nodes) -> Result<(), String> {
    use std::io::Write;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let barrier = Arc::new(Barrier::new(clients + 1));
        for i in 0..clients {
            let socket = socket.to_path_buf();
            let tx = tx.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                let node = format!("node{i}");
                if let Err(e) = client(&socket, clients, nodes, i, node, barrier, tx).await {
                    eprintln!("client node{i}: {e}");
                }
            });
        }
        drop(tx);
        barrier.wait().await;
        let mut out = std::io::BufWriter::with_capacity(64 << 10, std::io::stdout().lock());
        writeln!(out, "start").map_err(|e| e.to_string())?;
        out.flush().map_err(|e| e.to_string())?;
        // The parent closes stdin when it is done.
        let stdin_closed = tokio::task::spawn_blocking(|| {
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        });
        tokio::pin!(stdin_closed);
        loop {
            tokio::select! {
                sync = rx.recv() => {
                    let Some((i, ops)) = sync else { return Ok(()) };
                    writeln!(out, "sync {i} {ops}").map_err(|e| e.to_string())?;
                    // The Syncs already queued go out in the same write: one write per line
                    // was a system call per node per change, on the CPUs the brain uses. A
                    // line is never written before its Sync arrived, so no time is hidden.
                    while let Ok((i, ops)) = rx.try_recv() {
                        writeln!(out, "sync {i} {ops}").map_err(|e| e.to_string())?;
                    }
                    out.flush().map_err(|e| e.to_string())?;
                }
                _ = &mut stdin_closed => return Ok(()),
            }
        }
    })
}

/// The clients' process; killed when dropped.
pub(crate) struct ClientsProcess(Child);

impl Drop for ClientsProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `kpng-bench api-clients`; its lines arrive on the returned channel with the time
/// they were read.
pub(crate) fn start_clients(
    socket: &Path,
    clients: usize,
    nodes: Nodes,
) -> Result<(ClientsProcess, mpsc::UnboundedReceiver<(String, Instant)>), String> {
    use std::io::BufRead;
    let exe = std::env::current_exe().map_err(|e| format!("locating kpng-bench: {e}"))?;
    let mut child = std::process::Command::new(exe)
        .arg("api-clients")
        .arg("--socket")
        .arg(socket)
        .arg("--clients")
        .arg(clients.to_string())
        .args(nodes.flags())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the clients: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout of the clients")?;
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send((line, Instant::now())).is_err() {
                return;
            }
        }
    });
    Ok((ClientsProcess(child), rx))
}

/// Waits for `count` Syncs from the clients' process; returns the time of the last and the
/// ops of the first.
pub(crate) async fn collect_lines(
    rx: &mut mpsc::UnboundedReceiver<(String, Instant)>,
    count: usize,
    timeout: Duration,
) -> Result<(Instant, usize), String> {
    let mut last = Instant::now();
    let mut ops = 0;
    let mut k = 0;
    while k < count {
        let (line, at) = tokio::time::timeout(timeout, rx.recv())
            .await
            .map_err(|_| format!("only {k} of {count} clients synced within {timeout:?}"))?
            .ok_or("the clients' process ended")?;
        let Some(rest) = line.strip_prefix("sync ") else {
            continue;
        };
        if k == 0 {
            ops = rest
                .split_whitespace()
                .nth(1)
                .and_then(|o| o.parse().ok())
                .unwrap_or(0);
        }
        last = last.max(at);
        k += 1;
    }
    Ok((last, ops))
}

/// The in-process probe: reports its Syncs.
async fn probe(
    socket: &Path,
    nodes: Nodes,
    syncs: mpsc::UnboundedSender<(usize, usize)>,
) -> Result<(), String> {
    client(
        socket,
        1,
        Nodes {
            reading: Reading::Decode,
            ..nodes
        },
        0,
        "probe".into(),
        Arc::new(Barrier::new(1)),
        syncs,
    )
    .await
}

/// Waits for one Sync of the probe.
async fn probe_synced(
    rx: &mut mpsc::UnboundedReceiver<(usize, usize)>,
    timeout: Duration,
) -> Result<Instant, String> {
    tokio::time::timeout(timeout, rx.recv())
        .await
        .map_err(|_| format!("the probe did not sync within {timeout:?}"))?
        .ok_or("the probe ended")?;
    Ok(Instant::now())
}

/// Runs the benchmark against the brain `kpng` (`label` names it in the table), its simulated
/// nodes reading as `reading` says.
pub fn run(
    kpng: &str,
    label: &str,
    n: usize,
    m: usize,
    clients: usize,
    changes: usize,
    nodes: Nodes,
) -> Result<ApiResult, String> {
    let scratch = Scratch::new(&format!("api{n}"))?;
    let manifests = scratch.0.join("manifests");
    let spread = Endpoints::Spread(clients);
    workload::generate(&manifests, n, m, spread).map_err(|e| format!("generating: {e}"))?;
    // A brain whose input has Nodes serves only those: every simulated node gets its Node
    // (the workload declares node1), and so does the in-process probe.
    let nodes_yaml: String = (0..clients)
        .filter(|i| *i != 1)
        .map(|i| format!("node{i}"))
        .chain(std::iter::once("probe".to_string()))
        .map(|name| format!("---\nkind: Node\nmetadata: {{name: {name}}}\n"))
        .collect();
    std::fs::write(manifests.join("nodes.yaml"), nodes_yaml).map_err(|e| e.to_string())?;
    let socket = scratch.0.join("brain.sock");
    let log = std::fs::File::create(scratch.0.join("brain.log")).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let brain = BrainProcess(
        std::process::Command::new(kpng)
            .args(["file", "--input"])
            .arg(&manifests)
            .args([
                "--debounce",
                "0",
                "--metrics-bind-address",
                "",
                "--admin-socket",
                "",
                "--service-node-port-range",
                workload::NODE_PORT_RANGE,
                "to-api",
                "--listen",
            ])
            .arg(format!("unix://{}", socket.display()))
            // The simulated nodes connect first and open their Watch streams together once
            // all are connected (minutes at 5,000 in one process); a real node opens its
            // stream at once, so the idle cap (20 s) would only close waiting clients here.
            .args(["--connection-idle-timeout", "30m"])
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| format!("starting the brain: {e}"))?,
    );
    let pid = brain.0.id();
    let cpu = || crate::cpu::cpu_time(pid).unwrap_or_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        // Wait for the socket, then for one client to be served: the brain has loaded.
        while !socket.exists() {
            if started.elapsed() > Duration::from_secs(120) {
                return Err("the brain did not listen within 120 s".to_string());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (probe_tx, mut probe_rx) = mpsc::unbounded_channel();
        let probe_socket = socket.clone();
        tokio::spawn(async move {
            let _ = probe(&probe_socket, nodes, probe_tx).await;
        });
        let loaded_at = probe_synced(&mut probe_rx, Duration::from_secs(300)).await?;
        let load = loaded_at - started;

        let (nodes_process, mut lines) = start_clients(&socket, clients, nodes)?;
        let nodes_pid = nodes_process.0.id();
        let nodes_cpu = || crate::cpu::cpu_time(nodes_pid).unwrap_or_default();
        // Every client is connected when the process says `start`.
        loop {
            let (line, _) = tokio::time::timeout(Duration::from_secs(300), lines.recv())
                .await
                .map_err(|_| "the clients did not connect within 300 s".to_string())?
                .ok_or("the clients' process ended")?;
            if line == "start" {
                break;
            }
        }
        let t0 = Instant::now();
        let cpu0 = cpu();
        let written0 = written(pid);
        let timeout = Duration::from_secs(1800);
        let (last, ops) = collect_lines(&mut lines, clients, timeout).await?;
        let initial_cpu = cpu().saturating_sub(cpu0);
        let initial_bytes = written(pid).saturating_sub(written0);
        let initial_all = last - t0;
        let rss = rss_mb(pid);

        let mut latencies = Vec::new();
        let mut change_cpu = Duration::ZERO;
        let mut nodes_change_cpu = Duration::ZERO;
        for k in 0..changes {
            let i = (k * 7919 + 13) % n;
            tokio::time::sleep(Duration::from_millis(200)).await;
            let before = cpu();
            let nodes_before = nodes_cpu();
            let t = Instant::now();
            // An odd generation moves endpoint 0 of a Service that was never changed before.
            workload::rewrite(&manifests, i, m, spread, 2 * k + 1).map_err(|e| e.to_string())?;
            // Every client and the probe get a change set.
            let (last, _) = collect_lines(&mut lines, clients, Duration::from_secs(120)).await?;
            let probe_at = probe_synced(&mut probe_rx, Duration::from_secs(120)).await?;
            latencies.push((last.max(probe_at) - t).as_secs_f64());
            change_cpu += cpu().saturating_sub(before);
            nodes_change_cpu += nodes_cpu().saturating_sub(nodes_before);
        }
        let per_change =
            |total: Duration| total / u32::try_from(changes.max(1)).unwrap_or(u32::MAX);
        Ok(ApiResult {
            label: format!("{label}{}", nodes.describe()),
            n,
            m,
            clients,
            load,
            initial_all,
            ops_per_client: ops,
            change_p50: Duration::from_secs_f64(percentile(&mut latencies.clone(), 50.0)),
            change_p99: Duration::from_secs_f64(percentile(&mut latencies, 99.0)),
            rss_mb: rss,
            peak_rss_mb: peak_rss_mb(pid),
            initial_cpu,
            change_cpu: per_change(change_cpu),
            nodes_change_cpu: per_change(nodes_change_cpu),
            initial_bytes_per_node: initial_bytes / clients.max(1) as u64,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clients_windows_share_one_budget_within_the_http2_bounds() {
        for (clients, window) in [
            (0, 4 << 20),
            (1, 4 << 20),
            (256, 4 << 20),
            (1000, 1_073_741),
            (5000, 214_748),
            (100_000, 64 << 10),
        ] {
            assert_eq!(window_per_client(clients), window, "{clients} clients");
        }
    }
}
