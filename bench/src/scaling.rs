//! `kpng-bench scaling`: the scaling curves of issue #19 in one run, each point measured by
//! an existing benchmark (nothing is measured here that the single-size commands do not):
//!
//! - **start → programmed against Services**: [`crate::startup`] (the `file` source from YAML
//!   and from JSON manifests, and the `kube` source) at several sizes;
//! - **the brain against nodes**: [`crate::api`] (one brain, simulated nodes in a separate
//!   process) at several node counts: wall time until all hold the initial state, and the
//!   brain's CPU per node;
//! - **API-server load against nodes**: [`crate::api_load`] (N nodes each watching the API
//!   server against one brain serving N), bytes sent and watch streams.
//!
//! It prints one markdown section (every figure, the command line, the date, the load average
//! at the start and the end); `--write-docs` also writes the plots to `docs/img/` and the
//! section into the `scaling` block of `docs/benchmarks.md`, leaving the rest of the file as
//! it is.

use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::api::{self, ApiResult};
use crate::api_load::{self, ApiLoadResult};
use crate::plots::{self, Chart, Series};
use crate::startup::{self, StartupResult};

/// Endpoints per Service in every part (the issue's "× 4").
const ENDPOINTS: usize = 4;
/// The issue's start-up target at 30k × 4, drawn on the start-up chart.
const STARTUP_TARGET_SECS: f64 = 1.5;

/// The points of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Plan {
    /// Start-up sizes (Services).
    startup_services: Vec<usize>,
    /// Starts per source and size (the median is plotted).
    startup_rounds: usize,
    /// Services the brain serves.
    brain_services: usize,
    /// Simulated node counts for the brain.
    brain_nodes: Vec<usize>,
    /// Change rounds per brain run (the curve is the initial state; a few changes keep the
    /// run's change columns meaningful without adding minutes).
    brain_changes: usize,
    /// Services of the API-server load comparison.
    load_services: usize,
    /// Node counts of the API-server load comparison. The "every node" side runs N `kube`
    /// sources in this process, each receiving the whole state: N stays where that fits the
    /// benchmark machine (the API server's cost per node does not depend on N).
    load_nodes: Vec<usize>,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                startup_services: vec![500, 2000],
                startup_rounds: 1,
                brain_services: 1000,
                brain_nodes: vec![10, 50],
                brain_changes: 2,
                load_services: 1000,
                load_nodes: vec![10, 50],
            }
        } else {
            Plan {
                startup_services: vec![1000, 10_000, 30_000],
                startup_rounds: 3,
                brain_services: 30_000,
                brain_nodes: vec![50, 200, 500, 1000],
                brain_changes: 3,
                load_services: 1000,
                load_nodes: vec![50, 200, 500],
            }
        }
    }
}

/// Everything one run measured.
struct Measured {
    plan: Plan,
    startups: Vec<StartupResult>,
    brains: Vec<ApiResult>,
    load: ApiLoadResult,
}

/// The 1-minute load average, as `/proc/loadavg` gives it ("?" when unreadable).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(String::from))
        .unwrap_or_else(|| "?".into())
}

fn now() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

/// Runs every part and prints the section; with `write_docs`, writes the plots and the
/// section's block of `docs/benchmarks.md`.
pub fn run(kpng: &str, quick: bool, write_docs: bool) -> Result<(), String> {
    if !Path::new(kpng).is_file() {
        return Err(format!(
            "no kpng binary at {kpng}: build it with `cargo build --release -p kpng` or pass --kpng PATH"
        ));
    }
    let plan = Plan::new(quick);
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let (started, load_start) = (now(), load_average());
    let mut startups = Vec::new();
    for &n in &plan.startup_services {
        eprintln!("scaling: start-up, {n} Services × {ENDPOINTS} endpoints, file and kube …");
        startups.push(startup::run(
            kpng,
            None,
            n,
            ENDPOINTS,
            plan.startup_rounds,
            &[],
            true,
        )?);
    }
    let mut brains = Vec::new();
    for &nodes in &plan.brain_nodes {
        eprintln!(
            "scaling: brain, {} Services × {ENDPOINTS} endpoints, {nodes} nodes …",
            plan.brain_services
        );
        let r = api::run(
            kpng,
            "kpng",
            plan.brain_services,
            ENDPOINTS,
            nodes,
            plan.brain_changes,
            crate::api::Nodes::KPNG,
        )?;
        eprintln!("{}", r.markdown_row());
        brains.push(r);
    }
    let load = api_load::run(kpng, plan.load_services, ENDPOINTS, &plan.load_nodes)?;
    let (ended, load_end) = (now(), load_average());
    let measured = Measured {
        plan,
        startups,
        brains,
        load,
    };
    let mut section = format!(
        "## Scaling curves (issue #19)\n\n\
         Generated by `kpng-bench scaling{}` from {started} to {ended} (load average {load_start} \
         at the start, {load_end} at the end) with\n\n```\n{command}\n```\n{}",
        if quick { " --quick" } else { "" },
        crate::stats::machine_header(),
    );
    section.push_str(&markdown(&measured));
    if write_docs {
        section.push_str(&write_plots(Path::new("docs/img"), &measured)?);
    }
    println!("{section}");
    if write_docs {
        crate::docs::write_block(
            Path::new(crate::BENCHMARKS_MD),
            "Benchmarks",
            "scaling",
            &section,
        )?;
    }
    Ok(())
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

fn median_label(secs: Option<f64>) -> String {
    secs.filter(|s| s.is_finite())
        .map_or_else(|| "—".into(), |s| format!("{s:.2} s"))
}

/// The tables: a summary per curve, then every figure of every point.
fn markdown(m: &Measured) -> String {
    let plan = &m.plan;
    let mut s = format!(
        "\n### Start → programmed against Services (`file` and `kube` sources)\n\n\
         Median of {} start(s) per source and size (`kpng-bench startup`); target ≤ {STARTUP_TARGET_SECS} s at 30k × 4.\n\n\
         | Services × endpoints | `file` (YAML) median | `file` (JSON) median | `kube` median |\n|---|---|---|---|\n",
        plan.startup_rounds
    );
    for (n, r) in plan.startup_services.iter().zip(&m.startups) {
        s.push_str(&format!(
            "| {n} × {ENDPOINTS} | {} | {} | {} |\n",
            median_label(r.median_secs("file")),
            median_label(r.median_secs("file-json")),
            median_label(r.median_secs("kube")),
        ));
    }
    for (n, r) in plan.startup_services.iter().zip(&m.startups) {
        s.push_str(&format!("\n{n} × {ENDPOINTS}:\n\n{}", r.markdown()));
    }
    s.push_str(&format!(
        "\n### Brain: all nodes hold the initial state against nodes ({} × {ENDPOINTS})\n\n\
         `kpng-bench api` at each node count, {} change round(s) each; the simulated nodes run in \
         one separate process on the same machine and decode everything they receive.\n\n\
         | nodes | all nodes hold the initial state | brain CPU per node |\n|---|---|---|\n",
        plan.brain_services, plan.brain_changes
    ));
    for r in &m.brains {
        s.push_str(&format!(
            "| {} | {} | {:.2} ms |\n",
            r.clients(),
            secs(r.initial_all()),
            r.initial_cpu_per_node().as_secs_f64() * 1000.0
        ));
    }
    s.push('\n');
    s.push_str(ApiResult::markdown_header());
    for r in &m.brains {
        s.push_str(&r.markdown_row());
        s.push('\n');
    }
    s.push_str(
        "\n### API-server load against nodes: N nodes each watching it, or one brain serving N\n\n\
         `kpng-bench api-load`, the fake API server's own counters until all N nodes hold the \
         initial state.\n\n\
         | nodes | every node watches: bytes sent / watch streams | one brain: bytes sent / watch streams |\n|---|---|---|\n",
    );
    let loads = m.load.initial_loads();
    for &nodes in &plan.load_nodes {
        let side = |brain: bool| {
            loads
                .iter()
                .find(|l| l.nodes == nodes && l.brain == brain)
                .map_or_else(
                    || "—".into(),
                    |l| format!("{} / {}", mb(l.bytes_sent), l.watches_open),
                )
        };
        s.push_str(&format!("| {nodes} | {} | {} |\n", side(false), side(true)));
    }
    s.push('\n');
    s.push_str(&m.load.markdown());
    s
}

/// The curves, as chart series.
struct Curves {
    startup: Vec<Series>,
    brain_wall: Vec<Series>,
    brain_cpu: Vec<Series>,
    load_bytes: Vec<Series>,
    load_watches: Vec<Series>,
}

fn curves(m: &Measured) -> Curves {
    let startup: Vec<Series> = [
        ("file", "file source (YAML), median"),
        ("file-json", "file source (JSON), median"),
        ("kube", "kube source, median"),
    ]
    .into_iter()
    .map(|(source, label)| Series {
        label: label.into(),
        points: m
            .plan
            .startup_services
            .iter()
            .zip(&m.startups)
            .filter_map(|(n, r)| r.median_secs(source).map(|s| (*n as f64, s)))
            .collect(),
    })
    .collect();
    let brain = |label: &str, y: fn(&ApiResult) -> f64| -> Vec<Series> {
        vec![Series {
            label: label.into(),
            points: m
                .brains
                .iter()
                .map(|r| (r.clients() as f64, y(r)))
                .collect(),
        }]
    };
    let loads = m.load.initial_loads();
    let load = |y: fn(&api_load::InitialLoad) -> f64| -> Vec<Series> {
        [
            (false, "every node watches the API server"),
            (true, "one brain"),
        ]
        .into_iter()
        .map(|(brain, label)| Series {
            label: label.into(),
            points: loads
                .iter()
                .filter(|l| l.brain == brain)
                .map(|l| (l.nodes as f64, y(l)))
                .collect(),
        })
        .collect()
    };
    Curves {
        startup,
        brain_wall: brain("all nodes hold the initial state", |r| {
            r.initial_all().as_secs_f64()
        }),
        brain_cpu: brain("brain CPU per node", |r| {
            r.initial_cpu_per_node().as_secs_f64() * 1000.0
        }),
        load_bytes: load(|l| l.bytes_sent as f64 / 1e6),
        load_watches: load(|l| l.watches_open as f64),
    }
}

/// Writes the scaling PNGs into `dir`; returns the markdown that shows them.
fn write_plots(dir: &Path, m: &Measured) -> Result<String, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    plots::load_font()?;
    let c = curves(m);
    let brain_title = format!(
        "Brain, {} Services × {ENDPOINTS}: all nodes hold the initial state",
        m.plan.brain_services
    );
    let brain_cpu_title = format!(
        "Brain CPU per node, initial state, {} Services × {ENDPOINTS}",
        m.plan.brain_services
    );
    let load_title = format!(
        "API server, {} Services × {ENDPOINTS}: bytes sent until all nodes hold the state",
        m.plan.load_services
    );
    let target = format!("target {STARTUP_TARGET_SECS} s (30k × 4)");
    let charts: [(&str, Chart<'_>, &[Series], &str); 5] = [
        (
            "scaling-startup.png",
            Chart {
                title: "Process start → programmed",
                x_label: "Services (× 4 endpoints)",
                y_label: "seconds",
                reference: Some((target.as_str(), STARTUP_TARGET_SECS)),
            },
            &c.startup,
            "Start → programmed against Services",
        ),
        (
            "scaling-brain-wall.png",
            Chart {
                title: &brain_title,
                x_label: "nodes",
                y_label: "seconds",
                reference: None,
            },
            &c.brain_wall,
            "Brain: all nodes hold the initial state against nodes",
        ),
        (
            "scaling-brain-cpu.png",
            Chart {
                title: &brain_cpu_title,
                x_label: "nodes",
                y_label: "ms of brain CPU per node",
                reference: None,
            },
            &c.brain_cpu,
            "Brain CPU per node against nodes",
        ),
        (
            "scaling-apiserver-bytes.png",
            Chart {
                title: &load_title,
                x_label: "nodes",
                y_label: "MB",
                reference: None,
            },
            &c.load_bytes,
            "API-server bytes sent against nodes",
        ),
        (
            "scaling-apiserver-watches.png",
            Chart {
                title: "API server: watch streams open",
                x_label: "nodes",
                y_label: "watch streams",
                reference: None,
            },
            &c.load_watches,
            "API-server watch streams against nodes",
        ),
    ];
    let mut s = String::from("\n### Plots\n");
    for (file, chart, series, alt) in charts {
        plots::line_chart(&dir.join(file), chart, series)?;
        s.push_str(&format!("\n![{alt}](img/{file})\n"));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quick_plan_is_a_smaller_copy_of_the_full_one() {
        let (quick, full) = (Plan::new(true), Plan::new(false));
        // The issue's sizes are in the full run.
        assert!(full.startup_services.contains(&30_000));
        assert_eq!(full.brain_services, 30_000);
        assert!(full.brain_nodes.contains(&1000));
        assert_eq!(full.startup_rounds, 3);
        // Every curve has at least two points, in increasing order, and the quick run is
        // never larger.
        for plan in [&quick, &full] {
            for points in [&plan.startup_services, &plan.brain_nodes, &plan.load_nodes] {
                assert!(points.len() >= 2, "{plan:?}");
                assert!(points.windows(2).all(|w| w[0] < w[1]), "{plan:?}");
            }
        }
        assert!(quick.startup_services.last() < full.startup_services.last());
        assert!(quick.brain_services < full.brain_services);
        assert!(quick.brain_nodes.last() < full.brain_nodes.last());
    }
}
