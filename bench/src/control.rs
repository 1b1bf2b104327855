//! Control plane: cold programming, one-change latency, operations per change, peak RSS, per
//! backend (nftables; iptables in its nft and legacy variants).
//!
//! kpng runs in a fresh network namespace on a directory of manifests (one file per Service).
//! Cold programming is the first full sync as kpng measures it around the backend call (and,
//! separately, the wall time from process start, which includes reading N files). One change is
//! an atomic rewrite (rename) of one Service's file with a different endpoint; its latency runs
//! from just before the rename to the timestamp of kpng's "synced" log line, which is written
//! after the backend has committed the transaction (`nft`, or `iptables-restore`).

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant, SystemTime};

use kpng_testkit::Netns;

use crate::stats::percentile;
use crate::workload::{self, Endpoints, NODE_IP};

/// A backend under benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// `to-local nft`.
    Nft,
    /// `to-local iptables --iptables-mode nft`.
    IptablesNft,
    /// `to-local iptables --iptables-mode legacy`.
    IptablesLegacy,
    /// `to-local userspace` (data plane only: not in [`BackendKind::ALL`]).
    Userspace,
    /// `to-local ebpf` (asked for by name: not in [`BackendKind::ALL`]). kpng and the clients
    /// of its namespace run in a cgroup of their own, the programs' scope.
    Ebpf,
}

impl BackendKind {
    /// Every backend, nftables first.
    pub const ALL: [BackendKind; 3] = [
        BackendKind::Nft,
        BackendKind::IptablesNft,
        BackendKind::IptablesLegacy,
    ];

    /// The arguments that select it.
    pub fn args(self) -> &'static [&'static str] {
        match self {
            BackendKind::Nft => &["to-local", "nft"],
            BackendKind::IptablesNft => &["to-local", "iptables", "--iptables-mode", "nft"],
            BackendKind::IptablesLegacy => &["to-local", "iptables", "--iptables-mode", "legacy"],
            BackendKind::Userspace => &["to-local", "userspace"],
            BackendKind::Ebpf => &["to-local", "ebpf"],
        }
    }

    /// `nft`, `iptables-nft`, `iptables-legacy`.
    pub fn label(self) -> &'static str {
        match self {
            BackendKind::Nft => "nft",
            BackendKind::IptablesNft => "iptables-nft",
            BackendKind::IptablesLegacy => "iptables-legacy",
            BackendKind::Userspace => "userspace",
            BackendKind::Ebpf => "ebpf",
        }
    }

    /// Parses a [`BackendKind::label`].
    pub fn parse(s: &str) -> Option<BackendKind> {
        BackendKind::ALL
            .into_iter()
            .chain([BackendKind::Ebpf])
            .find(|b| b.label() == s)
    }
}

/// Figures of one control-plane run.
#[derive(Debug)]
pub struct ControlResult {
    /// The backend.
    pub backend: BackendKind,
    /// Services.
    pub n: usize,
    /// Endpoints per Service.
    pub m: usize,
    /// The first full sync as kpng measured it.
    pub cold_backend: Duration,
    cold_wall: Duration,
    cold_ops: usize,
    /// One change, median.
    pub change_p50: Duration,
    /// One change, 99th percentile.
    pub change_p99: Duration,
    change_backend_p50: Duration,
    ops_per_change: f64,
    /// kpng's peak RSS.
    pub peak_rss_mb: f64,
    /// kpng's CPU time (user + system) from process start to the first full sync committed.
    pub cold_cpu: Option<Duration>,
    /// The rolling-update and 100-Services change scripts.
    pub scripts: crate::changes::ScriptResults,
    /// A restart over the rules the first process left (what a rolling update of kpng does).
    pub restart: Restart,
}

/// kpng stopped (SIGTERM: rules left in place) and started again on the same manifests.
#[derive(Debug, Clone, Copy)]
pub struct Restart {
    /// How long the stopped process took to exit after SIGTERM (`None`: over 30 s).
    pub exit_after_sigterm: Option<Duration>,
    /// Process start → the first sync committed (the table adopted and refilled).
    pub wall: Duration,
    /// That sync as kpng measured it.
    pub backend: Duration,
    /// kpng's CPU (user + sys, with the helpers it ran and waited for) from its start to the
    /// first sync committed.
    pub cpu_to_programmed: Option<Duration>,
    /// kpng's CPU in the [`SETTLE`] after the first sync, where nothing changes: what start-up
    /// work still runs once the node is programmed (the sweep of other proxies' leftovers).
    pub cpu_settling: Option<Duration>,
    /// kpng's peak RSS over the restart and the settling, helpers excluded.
    pub peak_rss_mb: f64,
}

/// How long a restarted kpng is watched after its first sync.
pub const SETTLE: Duration = Duration::from_secs(10);

impl Restart {
    /// The table header matching [`Restart::markdown_row`].
    pub fn markdown_header() -> String {
        format!(
            "| backend | Services × endpoints | old process: exit after SIGTERM | restart: process start → programmed | of which backend sync | kpng CPU to programmed | kpng CPU in the {} s after | kpng peak RSS |\n|---|---|---|---|---|---|---|---|\n",
            SETTLE.as_secs()
        )
    }

    /// One table row.
    pub fn markdown_row(&self, backend: BackendKind, n: usize, m: usize) -> String {
        let secs = |d: Option<Duration>| {
            d.map(|d| format!("{:.2} s", d.as_secs_f64()))
                .unwrap_or_else(|| "—".into())
        };
        format!(
            "| {} | {n} × {m} | {} | {:.2} s | {:.2} s | {} | {} | {:.0} MiB |",
            backend.label(),
            self.exit_after_sigterm
                .map(|d| format!("{:.2} s", d.as_secs_f64()))
                .unwrap_or_else(|| "> 30 s (killed)".into()),
            self.wall.as_secs_f64(),
            self.backend.as_secs_f64(),
            secs(self.cpu_to_programmed),
            secs(self.cpu_settling),
            self.peak_rss_mb,
        )
    }
}

impl ControlResult {
    /// kpng's own commit of one change (its "synced" line's duration), median.
    pub fn change_backend_p50(&self) -> Duration {
        self.change_backend_p50
    }

    /// Every figure of the row by name, for `--check` (each must be measured: finite and
    /// positive).
    pub fn checked_figures(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("cold: backend sync", self.cold_backend.as_secs_f64()),
            (
                "cold: process start → programmed",
                self.cold_wall.as_secs_f64(),
            ),
            ("cold operations", self.cold_ops as f64),
            ("one change p50", self.change_p50.as_secs_f64()),
            ("one change p99", self.change_p99.as_secs_f64()),
            (
                "of which backend p50",
                self.change_backend_p50.as_secs_f64(),
            ),
            ("ops / change", self.ops_per_change),
            ("kpng peak RSS", self.peak_rss_mb),
            (
                "restart: start → programmed",
                self.restart.wall.as_secs_f64(),
            ),
        ]
    }

    /// The table header matching [`ControlResult::markdown_row`].
    pub fn markdown_header() -> &'static str {
        "| backend | Services × endpoints | cold: backend sync | cold: process start → programmed | operations (nft: elements; iptables: lines) | one change p50 | one change p99 | of which backend p50 | ops / change | kpng peak RSS | kpng CPU, cold (user + sys) |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
    }

    /// One table row.
    pub fn markdown_row(&self) -> String {
        format!(
            "| {} | {} × {} | {:.2} s | {:.2} s | {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} | {:.0} MiB | {} |",
            self.backend.label(),
            self.n,
            self.m,
            self.cold_backend.as_secs_f64(),
            self.cold_wall.as_secs_f64(),
            self.cold_ops,
            self.change_p50.as_secs_f64() * 1000.0,
            self.change_p99.as_secs_f64() * 1000.0,
            self.change_backend_p50.as_secs_f64() * 1000.0,
            self.ops_per_change,
            self.peak_rss_mb,
            self.cold_cpu
                .map(|d| format!("{:.2} s", d.as_secs_f64()))
                .unwrap_or_else(|| "—".into())
        )
    }
}

/// kpng inside a namespace, killed on drop.
pub struct Kpng {
    child: Child,
    log: std::path::PathBuf,
    /// The eBPF backend's pin directory, removed on drop.
    pins: Option<std::path::PathBuf>,
}

impl Drop for Kpng {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The pins keep the eBPF backend's programs attached.
        if let Some(pins) = &self.pins {
            let _ = std::fs::remove_dir_all(pins);
        }
    }
}

/// One `synced` line of kpng's log.
pub struct SyncLine {
    /// When kpng logged it.
    pub at: SystemTime,
    /// Whether it was a full sync.
    pub full: bool,
    /// Operations sent.
    pub operations: usize,
    /// The backend's own duration.
    pub duration: Duration,
}

fn parse_duration(s: &str) -> Option<Duration> {
    let (num, unit) = s
        .find(|c: char| c.is_alphabetic() || c == 'µ')
        .map(|i| s.split_at(i))?;
    let v: f64 = num.parse().ok()?;
    let secs = match unit {
        "s" => v,
        "ms" => v / 1e3,
        "µs" | "us" => v / 1e6,
        "ns" => v / 1e9,
        _ => return None,
    };
    Some(Duration::from_secs_f64(secs))
}

pub(crate) fn parse_sync_line(line: &str) -> Option<SyncLine> {
    if !line.contains(" synced ") {
        return None;
    }
    let at = humantime::parse_rfc3339(line.split_whitespace().next()?).ok()?;
    let field = |name: &str| line.split_whitespace().find_map(|w| w.strip_prefix(name));
    Some(SyncLine {
        at,
        full: field("full=")? == "true",
        operations: field("operations=")?.parse().ok()?,
        duration: parse_duration(field("duration=")?)?,
    })
}

impl Kpng {
    /// Starts kpng with `backend` on `input` inside `ns`, logging to `log`.
    pub fn start(
        ns: &Netns,
        kpng: &str,
        backend: BackendKind,
        input: &Path,
        log: &Path,
    ) -> Result<Kpng, String> {
        let file =
            std::fs::File::create(log).map_err(|e| format!("creating {}: {e}", log.display()))?;
        let input = input.display().to_string();
        let mut args = vec![
            kpng,
            "file",
            "--input",
            &input,
            "--node-name",
            "node1",
            "--min-sync-period",
            "0",
            "--debounce",
            "0",
            "--metrics-bind-address",
            "",
            // No admin socket: the benchmark kills kpng, which would leave it in /run/kpng.
            "--admin-socket",
            "",
            "--healthz-bind-address",
            "127.0.0.1:10256",
            "--cluster-cidr",
            "10.128.0.0/9",
            "--service-node-port-range",
            crate::workload::NODE_PORT_RANGE,
            // Every sync's line: beyond the first ten routine syncs of a minute they are
            // logged at debug level (crates/runner/src/sync_log.rs), and the benchmark reads
            // each one's duration.
            "--log-level",
            "info,kpng_runner::runner=debug",
        ];
        args.extend_from_slice(backend.args());
        let mut command = ns.command(args);
        let mut pins = None;
        if backend == BackendKind::Ebpf {
            let e = |e: kpng_testkit::Error| format!("eBPF scope: {e}");
            let group =
                kpng_testkit::cgroups::create(&format!("bench-{}", ns.name())).map_err(e)?;
            kpng_testkit::cgroups::assign(ns.name(), &group).map_err(e)?;
            let dir = kpng_testkit::cgroups::bpffs().map_err(e)?.join(ns.name());
            // `command` was built before the assignment: kpng itself need not be in the group.
            command
                .env("KPNG_CGROUP_PATH", &group)
                .env("KPNG_BPF_PIN_PATH", &dir);
            pins = Some(dir);
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::from(file))
            .spawn()
            .map_err(|e| format!("starting kpng: {e}"))?;
        Ok(Kpng {
            child,
            log: log.to_path_buf(),
            pins,
        })
    }

    /// Stops kpng as a rolling update does (SIGTERM), leaving its rules and pins in place for
    /// the next process; returns how long it took to exit (`None`: not within 30 s, after
    /// which it is killed, as the kubelet would after a 30 s grace period).
    pub fn stop_leaving_rules(mut self) -> Result<Option<Duration>, String> {
        let pid = self.child.id().to_string();
        let asked = Instant::now();
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .map_err(|e| format!("kill -TERM {pid}: {e}"))?;
        // Kept for the next process (dropping would remove them).
        self.pins = None;
        while self.child.try_wait().map_err(|e| e.to_string())?.is_none() {
            if asked.elapsed() > Duration::from_secs(30) {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(Some(asked.elapsed()))
    }

    /// The pid (kpng itself: `ip netns exec` execs it).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Every sync line logged so far.
    pub fn syncs(&self) -> Vec<SyncLine> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(parse_sync_line)
            .collect()
    }

    /// Waits until at least `count` sync lines exist.
    pub fn wait_for_syncs(
        &mut self,
        count: usize,
        timeout: Duration,
    ) -> Result<Vec<SyncLine>, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let syncs = self.syncs();
            if syncs.len() >= count {
                return Ok(syncs);
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "kpng exited ({status}); log:\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "no sync after {timeout:?}; log:\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                ));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Peak resident memory of a process (`VmHWM`), in MiB (1,048,576 bytes): the output labels
/// say MiB; 150 MiB is 157.3 MB.
pub fn peak_rss_mb(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|kb| kb.parse::<f64>().ok())
            })
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// A scratch directory removed on drop.
pub struct Scratch(pub std::path::PathBuf);

impl Scratch {
    /// Creates `/tmp/kpng-bench-<pid>-<tag>`.
    pub fn new(tag: &str) -> Result<Scratch, String> {
        let dir = std::env::temp_dir().join(format!("kpng-bench-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("manifests"))
            .map_err(|e| format!("creating {}: {e}", dir.display()))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the control-plane benchmark of `backend` for `n` Services × `m` endpoints.
pub fn run(
    kpng_path: &str,
    backend: BackendKind,
    n: usize,
    m: usize,
    changes: usize,
) -> Result<ControlResult, String> {
    let scratch = Scratch::new(&format!("cp{n}-{}", backend.label()))?;
    let manifests = scratch.0.join("manifests");
    workload::generate(&manifests, n, m, Endpoints::Unique)
        .map_err(|e| format!("generating: {e}"))?;
    let ns = Netns::new("kbc").map_err(|e| e.to_string())?;
    ns.run_ok(["ip", "addr", "add", &format!("{NODE_IP}/32"), "dev", "lo"])
        .map_err(|e| e.to_string())?;

    let started = Instant::now();
    let mut kpng = Kpng::start(
        &ns,
        kpng_path,
        backend,
        &manifests,
        &scratch.0.join("kpng.log"),
    )?;
    let cold = kpng.wait_for_syncs(1, Duration::from_secs(600))?;
    let cold_wall = started.elapsed();
    let cold_cpu = crate::cpu::cpu_time(kpng.pid());
    let first = &cold[0];
    if !first.full {
        return Err("the first sync was not a full sync".into());
    }

    let mut latencies = Vec::new();
    let mut backend_secs = Vec::new();
    let mut ops = 0usize;
    let mut generations = std::collections::HashMap::new();
    for k in 0..changes {
        let i = (k * 7919 + 13) % n;
        let generation = generations.entry(i).or_insert(0usize);
        *generation += 1;
        let generation = *generation;
        // Space the changes: each is measured on its own. (Back to back, a transaction that
        // deletes elements makes the next one wait for an RCU grace period in the kernel.)
        std::thread::sleep(Duration::from_millis(50));
        let before = kpng.syncs().len();
        let t = SystemTime::now();
        workload::rewrite(&manifests, i, m, Endpoints::Unique, generation)
            .map_err(|e| format!("rewriting: {e}"))?;
        let syncs = kpng.wait_for_syncs(before + 1, Duration::from_secs(30))?;
        let line = &syncs[before];
        latencies.push(line.at.duration_since(t).unwrap_or_default().as_secs_f64());
        backend_secs.push(line.duration.as_secs_f64());
        ops += line.operations;
    }
    // Before the scripts, which add Services.
    let peak_rss_mb = peak_rss_mb(kpng.pid());
    let scripts = crate::changes::run(&mut kpng, &manifests, n, m, changes / 10, changes / 20)?;
    let exit = kpng.stop_leaving_rules()?;
    let mut restart = restart(&ns, kpng_path, backend, &manifests, &scratch)?;
    restart.exit_after_sigterm = exit;
    Ok(ControlResult {
        backend,
        n,
        m,
        cold_backend: first.duration,
        cold_wall,
        cold_ops: first.operations,
        change_backend_p50: Duration::from_secs_f64(percentile(&mut backend_secs, 50.0)),
        change_p50: Duration::from_secs_f64(percentile(&mut latencies, 50.0)),
        change_p99: Duration::from_secs_f64(percentile(&mut latencies, 99.0)),
        ops_per_change: ops as f64 / changes.max(1) as f64,
        peak_rss_mb,
        cold_cpu,
        scripts,
        restart,
    })
}

/// Starts kpng again over the rules a stopped one left, and watches it settle.
fn restart(
    ns: &Netns,
    kpng: &str,
    backend: BackendKind,
    manifests: &Path,
    scratch: &Scratch,
) -> Result<Restart, String> {
    let started = Instant::now();
    let mut kpng = Kpng::start(ns, kpng, backend, manifests, &scratch.0.join("restart.log"))?;
    let first = kpng.wait_for_syncs(1, Duration::from_secs(600))?;
    let wall = started.elapsed();
    let at_programmed = crate::cpu::cpu_time(kpng.pid());
    std::thread::sleep(SETTLE);
    let settled = crate::cpu::cpu_time(kpng.pid());
    Ok(Restart {
        exit_after_sigterm: None,
        wall,
        backend: first[0].duration,
        cpu_to_programmed: at_programmed,
        cpu_settling: at_programmed.zip(settled).map(|(a, b)| b.saturating_sub(a)),
        peak_rss_mb: peak_rss_mb(kpng.pid()),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn backend_labels_round_trip() {
        for b in super::BackendKind::ALL {
            assert_eq!(super::BackendKind::parse(b.label()), Some(b));
        }
        assert_eq!(super::BackendKind::parse("ipvs"), None);
    }

    #[test]
    fn parses_kpng_sync_lines() {
        let l = super::parse_sync_line(
            "2026-11-30T08:37:10.171735Z  INFO kpng_backend::runner: synced backend=nftables full=false operations=4 duration=406.009µs",
        )
        .expect("parses");
        assert!(!l.full);
        assert_eq!(l.operations, 4);
        assert_eq!(l.duration.as_nanos(), 406_009);
        assert_eq!(
            super::parse_duration("1.5s").map(|d| d.as_millis()),
            Some(1500)
        );
    }
}
