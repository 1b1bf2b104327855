//! Start-up: process start → programmed, the `file` source against the `kube` source, in one
//! run (issue #19).
//!
//! The `file` rows read a directory of manifests (`kpng-bench gen`), in YAML and the same
//! objects in JSON (`kubectl get -o json`'s shape); the `kube` row lists the
//! same Services and EndpointSlices from `kpng-fake-apiserver` serving them as a real API
//! server does (JSON objects with labels, annotations and `managedFields`, lists in pages of
//! the client's `limit` held together by `continue` tokens). Both run `kpng … to-file`, and
//! both are timed from the process start to kpng's first "synced" line (the first full sync
//! committed by the sink), alternating, so that machine noise hits both alike. The fake API
//! server's own counters give what the `kube` start cost it.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use kpng_fake_apiserver::{FakeApiServer, ServerLoad};

use crate::control::{Scratch, parse_sync_line, peak_rss_mb};
use crate::stats::percentile;
use crate::workload::{self, Endpoints, NODE_IP};

/// One start of kpng.
#[derive(Debug, Clone)]
struct Start {
    wall: Duration,
    cpu: Option<Duration>,
    operations: usize,
    peak_rss_mb: f64,
    /// What the API server answered for it (`kube` only).
    load: Option<ServerLoad>,
    /// What the sink wrote (the programmed state), to check both sources agree.
    output: String,
}

/// The starts of one source.
#[derive(Debug)]
pub struct SourceRow {
    label: String,
    /// `file`, `file-json` (the same manifests as JSON) or `kube`: which input, whatever
    /// the label says.
    source: &'static str,
    /// The `--before` binary's row.
    before: bool,
    starts: Vec<Start>,
}

impl SourceRow {
    /// A row with no starts yet.
    fn new(source: &'static str, before: bool, label: String) -> SourceRow {
        SourceRow {
            label,
            source,
            before,
            starts: Vec::new(),
        }
    }

    /// Median of the starts' wall times, in seconds.
    fn median_secs(&self) -> f64 {
        let mut walls: Vec<f64> = self.starts.iter().map(|s| s.wall.as_secs_f64()).collect();
        percentile(&mut walls, 50.0)
    }
}

/// Figures of one start-up run.
#[derive(Debug)]
pub struct StartupResult {
    n: usize,
    m: usize,
    rows: Vec<SourceRow>,
    /// How long loading the fake API server took (setup, not measured in the rows).
    fake_load: Duration,
}

impl StartupResult {
    /// The median start → programmed time of `source` (`file`, `file-json` or `kube`) with the measured
    /// binary (not `--before`), for a curve over sizes (`kpng-bench scaling`).
    pub fn median_secs(&self, source: &str) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| r.source == source && !r.before)
            .map(SourceRow::median_secs)
    }

    /// The table.
    pub fn markdown(&self) -> String {
        let mut s = String::from(
            "| source | Services × endpoints | starts (process start → first sync committed) | median | kpng CPU (user + sys), median | operations | kpng peak RSS | API server: requests (list pages) / bytes sent |\n|---|---|---|---|---|---|---|---|\n",
        );
        for row in &self.rows {
            let walls: Vec<f64> = row.starts.iter().map(|s| s.wall.as_secs_f64()).collect();
            let mut cpus: Vec<f64> = row
                .starts
                .iter()
                .filter_map(|s| s.cpu.map(|c| c.as_secs_f64()))
                .collect();
            let list = walls
                .iter()
                .map(|w| format!("{w:.2}"))
                .collect::<Vec<_>>()
                .join(", ");
            let median = row.median_secs();
            let cpu = if cpus.is_empty() {
                "—".to_string()
            } else {
                format!("{:.2} s", percentile(&mut cpus, 50.0))
            };
            let ops = row.starts.first().map_or(0, |s| s.operations);
            let rss = row.starts.iter().map(|s| s.peak_rss_mb).fold(0.0, f64::max);
            let load = row
                .starts
                .first()
                .and_then(|s| s.load)
                .map(|l| {
                    format!(
                        "{} ({}) / {:.1} MB",
                        l.requests,
                        l.lists,
                        l.bytes_sent as f64 / 1e6
                    )
                })
                .unwrap_or_else(|| "—".into());
            s.push_str(&format!(
                "| {} | {} × {} | {list} s | {median:.2} s | {cpu} | {ops} | {rss:.0} MiB | {load} |\n",
                row.label, self.n, self.m
            ));
        }
        s.push_str(&format!(
            "\n(The fake API server was loaded with the objects in {:.1} s before the first start.)\n",
            self.fake_load.as_secs_f64()
        ));
        s
    }
}

/// kpng, killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `kpng ARGS… to-file` and waits for its first sync line.
fn start_once(kpng: &str, source: &[String], scratch: &std::path::Path) -> Result<Start, String> {
    let log_path = scratch.join("kpng.log");
    let out = scratch.join("out.yaml");
    let log = std::fs::File::create(&log_path).map_err(|e| format!("creating the log: {e}"))?;
    let mut args: Vec<String> = source.to_vec();
    args.extend(
        [
            "--node-name",
            "node1",
            "--min-sync-period",
            "0",
            "--metrics-bind-address",
            "",
            "--admin-socket",
            "",
            "--healthz-bind-address",
            "127.0.0.1:0",
            "--cluster-cidr",
            "10.128.0.0/9",
            "--service-node-port-range",
            workload::NODE_PORT_RANGE,
            "to-file",
            "--output",
        ]
        .map(String::from),
    );
    args.push(out.display().to_string());
    let started = Instant::now();
    let mut child = Proc(
        std::process::Command::new(kpng)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| format!("starting kpng: {e}"))?,
    );
    let deadline = started + Duration::from_secs(300);
    loop {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        if let Some(sync) = text.lines().find_map(parse_sync_line) {
            let wall = started.elapsed();
            let pid = child.0.id();
            return Ok(Start {
                wall,
                cpu: crate::cpu::cpu_time(pid),
                operations: sync.operations,
                peak_rss_mb: peak_rss_mb(pid),
                load: None,
                output: std::fs::read_to_string(&out).unwrap_or_default(),
            });
        }
        if let Ok(Some(status)) = child.0.try_wait() {
            return Err(format!("kpng exited ({status}); log:\n{text}"));
        }
        if Instant::now() > deadline {
            return Err(format!("no sync within 300 s; log:\n{text}"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Fills `server` with the workload's Services and EndpointSlices as a cluster returns them,
/// and the Node `node1`.
pub fn load_fake(
    server: &FakeApiServer,
    n: usize,
    m: usize,
    endpoints: Endpoints,
) -> Result<(), String> {
    server
        .apply(workload::node_object("node1", NODE_IP, "10.244.0.0/24"))
        .map_err(|e| e.to_string())?;
    for i in 0..n {
        for object in workload::service_objects(i, m, endpoints, 0) {
            server.apply(object).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Runs `rounds` starts of each source, alternating (the `--before` binary's start of each
/// source just before the new binary's); `with_kube: false` measures the `file` source only
/// (`--sources file`: at 100k Services loading the fake API server takes longer than the
/// starts).
pub fn run(
    kpng: &str,
    before: Option<&str>,
    n: usize,
    m: usize,
    rounds: usize,
    extra_kube_args: &[String],
    with_kube: bool,
) -> Result<StartupResult, String> {
    let scratch = Scratch::new(&format!("startup{n}"))?;
    let manifests = scratch.0.join("manifests");
    workload::generate(&manifests, n, m, Endpoints::Unique)
        .map_err(|e| format!("generating: {e}"))?;
    let json_manifests = scratch.0.join("manifests-json");
    workload::generate_json(&json_manifests, n, m, Endpoints::Unique)?;
    let t = Instant::now();
    // No periodic bookmarks: they would only add noise to the byte counts.
    let server = FakeApiServer::builder()
        .bookmark_interval(None)
        .start()
        .map_err(|e| e.to_string())?;
    if with_kube {
        load_fake(&server, n, m, Endpoints::Unique)?;
    }
    let fake_load = t.elapsed();
    let kubeconfig = scratch.0.join("kubeconfig");
    server
        .write_kubeconfig(&kubeconfig)
        .map_err(|e| e.to_string())?;
    let file_source = |dir: &std::path::Path| {
        vec![
            "file".to_string(),
            "--input".into(),
            dir.display().to_string(),
            "--debounce".into(),
            "0".into(),
        ]
    };
    let file_args = file_source(&manifests);
    let json_args = file_source(&json_manifests);
    let mut kube_args = vec![
        "kube".to_string(),
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
    ];
    kube_args.extend_from_slice(extra_kube_args);
    let mut file = SourceRow::new("file", false, "file (a directory of YAML manifests)".into());
    let mut json = SourceRow::new(
        "file-json",
        false,
        "file (the same manifests as JSON, one `kind: List` per file)".into(),
    );
    let mut json_before = SourceRow::new(
        "file-json",
        true,
        "file JSON, before (the `--before` binary)".into(),
    );
    let kube_label = if extra_kube_args.is_empty() {
        "kube (fake API server, JSON, pages of 500)".into()
    } else {
        format!(
            "kube (fake API server, JSON, pages of 500; {})",
            extra_kube_args.join(" ")
        )
    };
    let mut kube = SourceRow::new("kube", false, kube_label);
    let mut file_before =
        SourceRow::new("file", true, "file, before (the `--before` binary)".into());
    let mut kube_before =
        SourceRow::new("kube", true, "kube, before (the `--before` binary)".into());
    let kube_start = |binary: &str, row: &mut SourceRow| -> Result<(), String> {
        let earlier = server.load();
        let mut start = start_once(binary, &kube_args, &scratch.0)?;
        start.load = Some(server.load().since(&earlier));
        row.starts.push(start);
        Ok(())
    };
    for round in 0..rounds.max(1) {
        eprintln!("start-up round {}/{rounds} …", round + 1);
        if let Some(before) = before {
            file_before
                .starts
                .push(start_once(before, &file_args, &scratch.0)?);
        }
        file.starts.push(start_once(kpng, &file_args, &scratch.0)?);
        if let Some(before) = before {
            json_before
                .starts
                .push(start_once(before, &json_args, &scratch.0)?);
        }
        json.starts.push(start_once(kpng, &json_args, &scratch.0)?);
        if with_kube {
            if let Some(before) = before {
                kube_start(before, &mut kube_before)?;
            }
            kube_start(kpng, &mut kube)?;
        }
    }
    // Both sources must have programmed the same state, or the comparison means nothing.
    let reference = file
        .starts
        .first()
        .map(|s| s.output.clone())
        .unwrap_or_default();
    let same = file
        .starts
        .iter()
        .chain(&file_before.starts)
        .chain(&json.starts)
        .chain(&json_before.starts)
        .chain(&kube.starts)
        .chain(&kube_before.starts)
        .all(|s| !s.output.is_empty() && s.output == reference);
    if !same {
        return Err("the sources (file YAML, file JSON, kube) programmed different states".into());
    }
    let mut rows = Vec::new();
    if before.is_some() {
        rows.push(file_before);
    }
    rows.push(file);
    if before.is_some() {
        rows.push(json_before);
    }
    rows.push(json);
    if with_kube {
        if before.is_some() {
            rows.push(kube_before);
        }
        rows.push(kube);
    }
    Ok(StartupResult {
        n,
        m,
        rows,
        fake_load,
    })
}
