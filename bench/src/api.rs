//! The API benchmark: one brain (`kpng file … to-api` on a Unix socket), N Services × M
//! endpoints spread over as many nodes as there are clients, and that many simulated node
//! clients in this process (each its own connection and Watch stream, counting ops; values are
//! not decoded). Measures the time until every client holds the initial state, the time for one
//! endpoint change to reach every client, and the brain's memory.

use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use kpng_api::proto;
use kpng_api::proto::sets_client::SetsClient;
use tokio::sync::{Barrier, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;

use crate::control::{Scratch, peak_rss_mb};
use crate::stats::percentile;
use crate::workload::{self, Endpoints};

/// Figures of one API run.
#[derive(Debug)]
pub struct ApiResult {
    n: usize,
    m: usize,
    clients: usize,
    load: Duration,
    initial_all: Duration,
    ops_per_client: usize,
    change_p50: Duration,
    change_max: Duration,
    rss_mb: f64,
    peak_rss_mb: f64,
}

impl ApiResult {
    /// The table header matching [`ApiResult::markdown_row`].
    pub fn markdown_header() -> &'static str {
        "| Services × endpoints | clients | brain load → first client synced | all clients hold the initial state | ops per client | one change reaches all: p50 | max | brain RSS after | brain peak RSS |\n|---|---|---|---|---|---|---|---|---|\n"
    }

    /// One table row.
    pub fn markdown_row(&self) -> String {
        format!(
            "| {} × {} | {} | {:.2} s | {:.2} s | {} | {:.1} ms | {:.1} ms | {:.0} MB | {:.0} MB |",
            self.n,
            self.m,
            self.clients,
            self.load.as_secs_f64(),
            self.initial_all.as_secs_f64(),
            self.ops_per_client,
            self.change_p50.as_secs_f64() * 1000.0,
            self.change_max.as_secs_f64() * 1000.0,
            self.rss_mb,
            self.peak_rss_mb,
        )
    }
}

struct BrainProcess(Child);

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

async fn connect(socket: &Path) -> Result<tonic::transport::Channel, String> {
    let path = socket.to_path_buf();
    Endpoint::from_static("http://localhost")
        .initial_stream_window_size(Some(4 << 20))
        .initial_connection_window_size(Some(4 << 20))
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
        .map_err(|e| format!("connecting to the brain: {e}"))
}

/// One simulated node: reports (ops, time) at every Sync.
async fn client(
    socket: &Path,
    node: String,
    start: Arc<Barrier>,
    syncs: mpsc::UnboundedSender<(usize, Instant)>,
) -> Result<(), String> {
    let channel = connect(socket).await?;
    start.wait().await;
    let (requests, rx) = mpsc::channel(2);
    let request = proto::WatchReq { node_name: node };
    let _ = requests.send(request.clone()).await;
    let mut stream = SetsClient::new(channel)
        .max_decoding_message_size(64 << 20)
        .watch(ReceiverStream::new(rx))
        .await
        .map_err(|e| format!("watch: {e}"))?
        .into_inner();
    let mut ops = 0;
    while let Some(item) = stream.message().await.map_err(|e| format!("stream: {e}"))? {
        if matches!(item.op, Some(proto::op_item::Op::Sync(_))) {
            if syncs.send((ops, Instant::now())).is_err() {
                return Ok(());
            }
            ops = 0;
            let _ = requests.send(request.clone()).await;
        } else {
            ops += 1;
        }
    }
    Ok(())
}

/// Waits for `count` Syncs; returns the time of the last and the ops of the first.
async fn collect(
    rx: &mut mpsc::UnboundedReceiver<(usize, Instant)>,
    count: usize,
    timeout: Duration,
) -> Result<(Instant, usize), String> {
    let mut last = Instant::now();
    let mut ops = 0;
    for k in 0..count {
        let (o, at) = tokio::time::timeout(timeout, rx.recv())
            .await
            .map_err(|_| format!("only {k} of {count} clients synced within {timeout:?}"))?
            .ok_or("clients ended")?;
        if k == 0 {
            ops = o;
        }
        last = last.max(at);
    }
    Ok((last, ops))
}

/// Runs the benchmark.
pub fn run(
    kpng: &str,
    n: usize,
    m: usize,
    clients: usize,
    changes: usize,
) -> Result<ApiResult, String> {
    let scratch = Scratch::new(&format!("api{n}"))?;
    let manifests = scratch.0.join("manifests");
    let spread = Endpoints::Spread(clients);
    workload::generate(&manifests, n, m, spread).map_err(|e| format!("generating: {e}"))?;
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
                "to-api",
                "--listen",
            ])
            .arg(format!("unix://{}", socket.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| format!("starting the brain: {e}"))?,
    );
    let pid = brain.0.id();
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
        let (tx, mut rx) = mpsc::unbounded_channel();
        let first = Arc::new(Barrier::new(1));
        let probe_socket = socket.clone();
        let probe_tx = tx.clone();
        tokio::spawn(async move {
            let _ = client(&probe_socket, "probe".into(), first, probe_tx).await;
        });
        let (loaded_at, _) = collect(&mut rx, 1, Duration::from_secs(300)).await?;
        let load = loaded_at - started;

        let barrier = Arc::new(Barrier::new(clients + 1));
        for i in 0..clients {
            let socket = socket.clone();
            let tx = tx.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                if let Err(e) = client(&socket, format!("node{i}"), barrier, tx).await {
                    eprintln!("client node{i}: {e}");
                }
            });
        }
        barrier.wait().await;
        let t0 = Instant::now();
        let (last, ops) = collect(&mut rx, clients, Duration::from_secs(1800)).await?;
        let initial_all = last - t0;
        let rss = rss_mb(pid);

        let mut latencies = Vec::new();
        for k in 0..changes {
            let i = (k * 7919 + 13) % n;
            tokio::time::sleep(Duration::from_millis(200)).await;
            let t = Instant::now();
            // An odd generation moves endpoint 0 of a Service that was never changed before.
            workload::rewrite(&manifests, i, m, spread, 2 * k + 1).map_err(|e| e.to_string())?;
            // Every client and the probe get a change set.
            let (last, _) = collect(&mut rx, clients + 1, Duration::from_secs(120)).await?;
            latencies.push((last - t).as_secs_f64());
        }
        Ok(ApiResult {
            n,
            m,
            clients,
            load,
            initial_all,
            ops_per_client: ops,
            change_p50: Duration::from_secs_f64(percentile(&mut latencies.clone(), 50.0)),
            change_max: Duration::from_secs_f64(percentile(&mut latencies, 100.0)),
            rss_mb: rss,
            peak_rss_mb: peak_rss_mb(pid),
        })
    })
}
