//! kpng's benchmarks. One entry point; every figure is measured side by side in one run and
//! reported as ratios first.
//!
//! ```text
//! kpng-bench all [--quick] [--check] [--kpng PATH] [--write-docs]
//! kpng-bench control-plane --services 30000 --endpoints 4 [--backend nft|iptables-nft|iptables-legacy]
//! kpng-bench data-plane --services 30000 [--backends nft,ebpf]
//! kpng-bench api --services 30000 --endpoints 4 --clients 1000
//! kpng-bench startup --services 30000 --endpoints 4 [--rounds 3] [--before PATH] [--sources file,kube] [--kube-args "--kube-api-qps 50"]
//! kpng-bench scaling [--quick] [--write-docs] [--kpng PATH]   (the curves of issue #19)
//! kpng-bench api-load --services 1000 --endpoints 4 --nodes 50,200   (no root needed)
//! kpng-bench conntrack --entries 1000000
//! kpng-bench hns --services 2000 --remote 5000 --local 15 --delay-ms 5   (no root needed)
//! kpng-bench gen --services 30000 --endpoints 4 --out DIR
//! ```
//! Needs root (network namespaces, nftables, conntrack). The data plane also measures the
//! userspace backend (up to 5000 Services). `--check` (CI's smoke run) exits non-zero when a
//! figure is missing, connections failed, or kpng is grossly slower than a reference measured
//! in the same run (`check.rs`). Internal subcommands `connect`, `serve`, `conntrack-inner` and
//! `nft-reference-inner` run inside the namespaces.

/// The same allocator as kpng, so `mem` measures what kpng would hold.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

mod api;
mod api_load;
mod changes;
mod check;
mod comparison;
mod conntrack;
mod control;
mod cpu;
mod data;
mod docs;
mod hns;
mod kube_proxy_nft;
mod node_codec;
mod plots;
mod scaling;
mod startup;
mod stats;
mod workload;

use std::process::ExitCode;
use std::time::Duration;

/// The benchmarks document `--write-docs` writes its blocks into (relative to the repository
/// root, where the benchmarks are run from).
const BENCHMARKS_MD: &str = "docs/benchmarks.md";

const USAGE: &str = "usage: kpng-bench all [--quick] [--check] [--write-docs] [--kpng PATH] | control-plane [--services N --endpoints M --backend nft|iptables-nft|iptables-legacy|ebpf --changes K --kpng PATH] | data-plane [--services N --backends nft,iptables-nft,iptables-legacy,ebpf --connects K --kpng PATH] | gen [--services N --endpoints M --out DIR] | mem [--input DIR] | kube-proxy-nft [--services N --endpoints M --cap-secs S] | api [--services N (default 30000: a heavy run; give a small N for a quick check) --endpoints M (4) --changes K (20) --clients 1000,5000 --read decode|frames --ask once,each --zstd on,off --before PATH] | api-load [--services N --endpoints M --nodes 50,200] | scaling [--quick] [--write-docs] [--kpng PATH] | startup [--services N (default 30000) --endpoints M --rounds R --before PATH --sources file,kube] | conntrack [--entries N] | hns [--services N --remote N --local N --delay-ms MS]";

/// The programs the full run drives. Checked before anything starts, so a machine without
/// them gets one clear error instead of kpng retrying a failing sync until a timeout.
const REQUIRED_TOOLS: [&str; 5] = [
    "nft",
    "conntrack",
    "ip",
    "iptables-nft-restore",
    "iptables-legacy-restore",
];

/// Fails with the names of missing tools and of a missing kpng binary.
fn preflight(kpng: &str) -> Result<(), String> {
    let path = std::env::var("PATH").unwrap_or_default();
    let missing: Vec<&str> = REQUIRED_TOOLS
        .into_iter()
        .filter(|tool| {
            !std::env::split_paths(&path)
                .chain(["/usr/sbin".into(), "/sbin".into()])
                .any(|dir| dir.join(tool).is_file())
        })
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "missing tools: {} (apt-get install -y nftables iproute2 iptables conntrack)",
            missing.join(", ")
        ));
    }
    if !std::path::Path::new(kpng).is_file() {
        return Err(format!(
            "no kpng binary at {kpng}: build it with `cargo build --release -p kpng` or pass --kpng PATH"
        ));
    }
    Ok(())
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// `--read decode|frames`: how the simulated API nodes read their stream (decode by default).
fn read_flag(args: &[String]) -> Result<node_codec::Reading, String> {
    node_codec::Reading::parse(&flag(args, "--read").unwrap_or_else(|| "decode".into()))
}

/// `--ask once,each`: how often the simulated API nodes ask for change sets, one run per
/// value in order (once by default, as kpng's own client).
fn ask_flag(args: &[String]) -> Result<Vec<api::Asking>, String> {
    flag(args, "--ask")
        .unwrap_or_else(|| "once".into())
        .split(',')
        .map(|a| api::Asking::parse(a.trim()))
        .collect()
}

/// `--zstd on,off`: whether the simulated API nodes read bundles, one run per value in order
/// (on by default, as kpng's own client).
fn zstd_flag(args: &[String]) -> Result<Vec<bool>, String> {
    flag(args, "--zstd")
        .unwrap_or_else(|| "on".into())
        .split(',')
        .map(|v| match v.trim() {
            "on" => Ok(true),
            "off" => Ok(false),
            other => Err(format!("--zstd {other:?}: expected on or off")),
        })
        .collect()
}

/// The flags that take a whole number ([`num`] reads them).
const NUMBER_FLAGS: [&str; 13] = [
    "--services",
    "--endpoints",
    "--changes",
    "--connects",
    "--rounds",
    "--clients",
    "--entries",
    "--remote",
    "--local",
    "--delay-ms",
    "--cap-secs",
    "--duration-ms",
    "--count",
];

/// Refuses a number flag whose value is missing or not a whole number (`--services 10k`),
/// naming it: [`num`] would otherwise run with the default, a benchmark of the wrong size.
/// (`--clients` also takes a comma-separated list.)
fn check_numbers(args: &[String]) -> Result<(), String> {
    for (i, a) in args.iter().enumerate() {
        if !NUMBER_FLAGS.contains(&a.as_str()) {
            continue;
        }
        let value = args
            .get(i + 1)
            .ok_or_else(|| format!("{a}: a number is missing"))?;
        let list = a == "--clients";
        let ok = value
            .split(if list { ',' } else { '\n' })
            .all(|v| v.trim().parse::<usize>().is_ok());
        if !ok {
            return Err(format!("{a} {value:?}: not a whole number"));
        }
    }
    Ok(())
}

/// The value of the number flag `name`, or `default` when it is not given (a bad value was
/// refused by [`check_numbers`] before).
fn num(args: &[String], name: &str, default: usize) -> usize {
    flag(args, name)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if let Err(e) = check_numbers(&args) {
        eprintln!("kpng-bench: {e}\n{USAGE}");
        return ExitCode::from(2);
    }
    // Default: the kpng of this build (same target dir and profile), never a guessed target/.
    let kpng = flag(&args, "--kpng")
        .or_else(|| kpng_testkit::sibling_bin("kpng").map(|p| p.display().to_string()))
        .unwrap_or_else(|| "kpng".into());
    let kpng = std::fs::canonicalize(&kpng)
        .map(|p| p.display().to_string())
        .unwrap_or(kpng);
    let result = match args.get(1).map(String::as_str) {
        Some("gen") => {
            let out = flag(&args, "--out").unwrap_or_else(|| "workload".into());
            std::fs::create_dir_all(&out)
                .and_then(|_| {
                    workload::generate(
                        std::path::Path::new(&out),
                        num(&args, "--services", 1000),
                        num(&args, "--endpoints", 4),
                        workload::Endpoints::Unique,
                    )
                })
                .map_err(|e| format!("generating into {out}: {e}"))
        }
        Some("mem") => mem(&flag(&args, "--input").unwrap_or_else(|| "workload".into())),
        Some("serve") => {
            data::serve(&flag(&args, "--listen").unwrap_or_else(|| "0.0.0.0:8080".into()))
        }
        Some("connect") => data::connect_cmd(&args),
        Some("control-plane") => match flag(&args, "--backend")
            .as_deref()
            .map_or(Some(control::BackendKind::Nft), control::BackendKind::parse)
        {
            None => Err("--backend: nft, iptables-nft or iptables-legacy".into()),
            Some(backend) => control::run(
                &kpng,
                backend,
                num(&args, "--services", 1000),
                num(&args, "--endpoints", 4),
                num(&args, "--changes", 100),
            )
            .map(|r| {
                println!(
                    "{}{}",
                    control::ControlResult::markdown_header(),
                    r.markdown_row()
                );
                println!(
                    "\n{}{}",
                    control::Restart::markdown_header(),
                    r.restart.markdown_row(r.backend, r.n, r.m)
                );
            }),
        },
        Some("data-plane") => {
            let n = num(&args, "--services", 1000);
            // `--backends nft,ebpf`: a subset (and the eBPF backend, which `all` leaves out).
            let backends: Option<Vec<control::BackendKind>> = match flag(&args, "--backends") {
                None => Some(control::BackendKind::ALL.to_vec()),
                Some(list) => list.split(',').map(control::BackendKind::parse).collect(),
            };
            let Some(backends) = backends else {
                eprintln!(
                    "--backends: a comma-separated list of nft, iptables-nft, iptables-legacy, ebpf"
                );
                return ExitCode::FAILURE;
            };
            data::run(
                &kpng,
                &backends,
                n,
                num(&args, "--connects", 2000),
                n <= data::USERSPACE_MAX_SERVICES,
            )
            .map(|r| println!("{}", r.markdown()))
        }
        Some("api") => (|| {
            let n = num(&args, "--services", 30_000);
            let m = num(&args, "--endpoints", 4);
            let changes = num(&args, "--changes", 20);
            // `--read frames`: the simulated nodes only split the stream into messages, so
            // their decoding on this machine's CPUs does not hide the brain's fan-out.
            let reading = read_flag(&args)?;
            // `--ask once,each`: the nodes ask once (kpng's client) and/or for each change set
            // (KPNG's clients, kpng before `continuous`): the rows side by side.
            let askings = ask_flag(&args)?;
            // `--zstd on,off`: the nodes read bundles (kpng's client) and/or not.
            let zstds = zstd_flag(&args)?;
            let mut table = api::ApiResult::markdown_header().to_string();
            // `--clients 1000,5000`: one row per count; `--before PATH`: the same against
            // another kpng binary first (side by side in one run).
            let counts = flag(&args, "--clients").unwrap_or_else(|| "1000".into());
            for clients in counts
                .split(',')
                .filter_map(|c| c.trim().parse::<usize>().ok())
            {
                let kinds = askings
                    .iter()
                    .flat_map(|&asking| zstds.iter().map(move |&bundles| (asking, bundles)));
                for (asking, bundles) in kinds {
                    let nodes = api::Nodes {
                        reading,
                        asking,
                        bundles,
                    };
                    if let Some(before) = flag(&args, "--before") {
                        let r = api::run(&before, "before", n, m, clients, changes, nodes)?;
                        eprintln!("{}", r.markdown_row());
                        table.push_str(&r.markdown_row());
                        table.push('\n');
                    }
                    let r = api::run(&kpng, "kpng", n, m, clients, changes, nodes)?;
                    eprintln!("{}", r.markdown_row());
                    table.push_str(&r.markdown_row());
                    table.push('\n');
                }
            }
            println!("{table}");
            Ok(())
        })(),
        Some("startup") => {
            let extra: Vec<String> = flag(&args, "--kube-args")
                .map(|a| a.split_whitespace().map(String::from).collect())
                .unwrap_or_default();
            startup::run(
                &kpng,
                flag(&args, "--before").as_deref(),
                num(&args, "--services", 30_000),
                num(&args, "--endpoints", 4),
                num(&args, "--rounds", 3),
                &extra,
                flag(&args, "--sources").is_none_or(|s| s.split(',').any(|s| s == "kube")),
            )
            .map(|r| println!("{}", r.markdown()))
        }
        Some("api-load") => {
            let counts: Vec<usize> = flag(&args, "--nodes")
                .unwrap_or_else(|| "50,200".into())
                .split(',')
                .filter_map(|c| c.trim().parse().ok())
                .collect();
            api_load::run(
                &kpng,
                num(&args, "--services", 1000),
                num(&args, "--endpoints", 4),
                &counts,
            )
            .map(|r| println!("{}", r.markdown()))
        }
        Some("api-clients") => read_flag(&args).and_then(|reading| {
            let asking =
                api::Asking::parse(&flag(&args, "--ask").unwrap_or_else(|| "once".into()))?;
            let bundles = zstd_flag(&args)?.first().copied().unwrap_or(true);
            api::clients_main(
                std::path::Path::new(&flag(&args, "--socket").unwrap_or_default()),
                num(&args, "--clients", 1000),
                api::Nodes {
                    reading,
                    asking,
                    bundles,
                },
            )
        }),
        Some("hns") => hns::run(
            num(&args, "--services", 2000),
            num(&args, "--remote", 5000),
            num(&args, "--local", 15),
            Duration::from_millis(num(&args, "--delay-ms", 5) as u64),
        )
        .map(|r| println!("{}{}", hns::HnsResult::markdown_header(), r.markdown_row())),
        Some("conntrack") => {
            conntrack::run(num(&args, "--entries", 1_000_000)).map(|r| println!("{}", r.markdown()))
        }
        Some("kube-proxy-nft") => kube_proxy_nft::run_control(
            num(&args, "--services", 1000),
            num(&args, "--endpoints", 4),
            Duration::from_secs(num(&args, "--cap-secs", 300) as u64),
        )
        .map(|r| {
            print!("{}", kube_proxy_nft::KubeProxyNftControl::markdown_header());
            println!("{}", r.markdown_row());
        }),
        Some("conntrack-inner") => conntrack::inner(num(&args, "--entries", 1_000_000)),
        Some("nft-reference-inner") => check::inner(),
        Some("scaling") => scaling::run(
            &kpng,
            args.iter().any(|a| a == "--quick"),
            args.iter().any(|a| a == "--write-docs"),
        ),
        Some("all") => all(
            &kpng,
            args.iter().any(|a| a == "--quick"),
            args.iter().any(|a| a == "--write-docs"),
            args.iter().any(|a| a == "--check"),
        ),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kpng-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs every benchmark and prints (and optionally writes) the report; with `check`, also
/// judges it ([`check`]) and fails when a check does not hold.
fn all(kpng: &str, quick: bool, write_docs: bool, check: bool) -> Result<(), String> {
    if !kpng_testkit::is_root() {
        return Err("needs root (network namespaces, nftables, iptables)".into());
    }
    preflight(kpng)?;
    let sizes: &[(usize, usize)] = if quick {
        &[(1000, 4)]
    } else {
        &[(1000, 4), (10_000, 4), (30_000, 4), (100_000, 2)]
    };
    let changes = if quick { 20 } else { 100 };
    let mut report = String::new();
    report.push_str(&stats::machine_header());
    report.push_str("\n## Control plane\n\n");
    report.push_str(control::ControlResult::markdown_header());
    let mut control_results = Vec::new();
    // Measured next to the control plane's first (nft) run, which the checks judge by it.
    let reference = if check {
        eprintln!("check: the nft binary's one-element changes, for reference …");
        Some(check::nft_reference()?)
    } else {
        None
    };
    for (n, m) in sizes {
        for backend in control::BackendKind::ALL {
            // The iptables tools read or rewrite the whole table on every change (legacy:
            // 1.5 s per change at 10k): larger sizes take many minutes and say nothing the
            // 10k row does not.
            if backend != control::BackendKind::Nft && *n > 10_000 {
                continue;
            }
            eprintln!(
                "control plane: {} with {n} Services × {m} endpoints …",
                backend.label()
            );
            let r = control::run(kpng, backend, *n, *m, changes)?;
            report.push_str(&r.markdown_row());
            report.push('\n');
            control_results.push(r);
        }
    }
    report.push_str("\n### Restart over the rules left in place (SIGTERM, then a new process)\n\n");
    report.push_str(&control::Restart::markdown_header());
    for r in &control_results {
        report.push_str(&r.restart.markdown_row(r.backend, r.n, r.m));
        report.push('\n');
    }
    report.push_str("\n### Change scripts (file event → committed transaction)\n\n");
    report.push_str(changes::ScriptResults::markdown_header());
    for r in &control_results {
        report.push_str(&r.scripts.markdown_row(
            r.backend.label(),
            r.n,
            r.m,
            (r.change_p50, r.change_p99),
        ));
        report.push('\n');
    }
    let kube_proxy = comparison::run_control(quick)?;
    report.push_str(&comparison::control_section(&kube_proxy, &control_results));
    // The Windows backend against the HCN simulator: upstream's anchor shape (kubernetes#109162)
    // with 5 ms per HCN call (≈35 s; the quick run scales it down).
    let (svcs, remote, local) = if quick {
        (200, 500, 15)
    } else {
        (2000, 5000, 15)
    };
    eprintln!("hns: {svcs} ClusterIP Services, {remote} remote endpoints, 5 ms per HCN call …");
    let hns = hns::run(svcs, remote, local, Duration::from_millis(5))?;
    report.push_str("\n## Windows (HNS backend, HCN simulator)\n\n");
    report.push_str(hns::HnsResult::markdown_header());
    report.push_str(&hns.markdown_row());
    report.push('\n');
    let data_sizes: &[usize] = if quick { &[1000] } else { &[1000, 30_000] };
    report.push_str("\n## Data plane: TCP connect latency to the last-added Service\n\n");
    let mut data_results = Vec::new();
    for n in data_sizes {
        let settled = stats::wait_for_idle(Duration::from_secs(120));
        eprintln!(
            "data plane: {n} Services (the machine settled in {:.0} s) …",
            settled.as_secs_f64()
        );
        let userspace = *n <= data::USERSPACE_MAX_SERVICES;
        if !userspace {
            report.push_str(&format!(
                "(The userspace backend is measured up to {} Services: it holds one or more sockets per Service port.)\n\n",
                data::USERSPACE_MAX_SERVICES
            ));
        }
        let r = data::run(
            kpng,
            &control::BackendKind::ALL,
            *n,
            if quick { 600 } else { 3000 },
            userspace,
        )?;
        report.push_str(&r.markdown());
        report.push('\n');
        data_results.push(r);
    }
    report.push_str("\n## API: one brain, simulated node clients (gRPC over a Unix socket)\n\n");
    report.push_str(api::ApiResult::markdown_header());
    let api_sizes: &[(usize, usize)] = if quick {
        &[(1000, 50)]
    } else {
        &[(30_000, 1000)]
    };
    for (n, clients) in api_sizes {
        eprintln!("api: {n} Services × 4 endpoints, {clients} clients …");
        let r = api::run(
            kpng,
            "kpng",
            *n,
            4,
            *clients,
            if quick { 3 } else { 20 },
            api::Nodes::KPNG,
        )?;
        report.push_str(&r.markdown_row());
        report.push('\n');
    }
    let entries = if quick { 10_000 } else { 1_000_000 };
    eprintln!("UDP conntrack cleanup: {entries} unrelated entries …");
    let cleanup = conntrack::run(entries)?;
    report.push_str("\n## UDP conntrack cleanup\n\n");
    report.push_str(&cleanup.markdown());
    report.push_str(&comparison::headline(
        &kube_proxy,
        &control_results,
        &data_results,
    ));
    report.push_str(&targets(&control_results, &data_results, &cleanup));
    report.push_str(&comparison::target_rows(&kube_proxy, &control_results));
    let checks =
        reference.map(|reference| checks_of(reference, &control_results, &data_results, &cleanup));
    if let Some(checks) = &checks {
        report.push_str(&checks.markdown());
    }
    if write_docs {
        let kpng_cold: Vec<plots::Series> = control::BackendKind::ALL
            .into_iter()
            .map(|backend| plots::Series {
                label: format!("kpng {}", backend.label()),
                points: control_results
                    .iter()
                    .filter(|r| r.backend == backend)
                    .map(|r| (r.n as f64, r.cold_backend.as_secs_f64()))
                    .collect(),
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        report.push_str(&comparison::write_plots(
            std::path::Path::new("docs/img"),
            &kube_proxy,
            &kpng_cold,
            &data_results,
        )?);
    }
    println!("{report}");
    if write_docs {
        // Only the block between the `all` markers: the dated sections written by hand
        // around it stay as they are.
        docs::write_block(
            std::path::Path::new(BENCHMARKS_MD),
            "Benchmarks",
            "all",
            &format!(
                "Generated by `cargo run -p kpng-bench --release -- all --write-docs` (see `bench/`).\n{report}"
            ),
        )?;
    }
    match checks.map(|c| c.failed()) {
        Some(failed) if failed > 0 => Err(format!(
            "{failed} check(s) failed (the \"Checks\" table above)"
        )),
        _ => Ok(()),
    }
}

/// What `all --check` judges: every figure measured, no more than a few connections failed,
/// and kpng's nftables one change against the `nft` binary's one-element change measured in
/// the same run (`check.rs` says why and how the bounds were chosen).
fn checks_of(
    reference: check::NftReference,
    control: &[control::ControlResult],
    data: &[data::DataResult],
    cleanup: &conntrack::ConntrackResult,
) -> check::Checks {
    let mut checks = check::Checks::default();
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
    checks.push(
        "reference: `nft -f -` one-element add, p50 (replace: delete + add)",
        format!(
            "{:.1} ms (replace {:.1} ms)",
            ms(reference.add),
            ms(reference.replace)
        ),
        true,
    );
    for r in control {
        checks.figures(
            &format!("control plane {} {} × {}", r.backend.label(), r.n, r.m),
            &r.checked_figures(),
        );
    }
    let smallest_nft = control
        .iter()
        .filter(|r| r.backend == control::BackendKind::Nft)
        .min_by_key(|r| r.n);
    match smallest_nft {
        Some(r) => {
            let backend = ms(r.change_backend_p50());
            let bound = check::BACKEND_OVER_NFT_ADD * ms(reference.add);
            checks.push(
                format!(
                    "nft {} × {}: kpng's commit of one change (backend p50) ≤ {}× the nft add",
                    r.n,
                    r.m,
                    check::BACKEND_OVER_NFT_ADD
                ),
                format!("{backend:.2} ms (bound {bound:.1} ms)"),
                backend <= bound,
            );
            let change = ms(r.change_p50);
            let bound = check::CHANGE_OVER_NFT_ADD * ms(reference.add);
            checks.push(
                format!(
                    "nft {} × {}: one change, file event → committed (p50) ≤ {}× the nft add",
                    r.n,
                    r.m,
                    check::CHANGE_OVER_NFT_ADD
                ),
                format!("{change:.2} ms (bound {bound:.1} ms)"),
                change <= bound,
            );
        }
        None => checks.push("nft control plane measured", "no nft row", false),
    }
    for d in data {
        let figures = d.checked_figures();
        let named: Vec<(&str, f64)> = figures.iter().map(|(n, v)| (n.as_str(), *v)).collect();
        checks.figures(&format!("data plane {} Services", d.n), &named);
        for (label, failed, attempted) in d.failures() {
            let share = failed as f64 / attempted.max(1) as f64;
            checks.push(
                format!(
                    "data plane: {label}: connections made, at most {:.0} % failed",
                    check::FAILED_CONNECTIONS_SHARE * 100.0
                ),
                format!("{failed} of {attempted} failed"),
                attempted > 0 && share <= check::FAILED_CONNECTIONS_SHARE,
            );
        }
    }
    checks.figures(
        "UDP conntrack cleanup",
        &[(
            "after a change",
            cleanup.after_change.duration.as_secs_f64(),
        )],
    );
    checks.push(
        "UDP conntrack cleanup after a change deletes no unrelated entry",
        if cleanup.after_change.exact() {
            "none deleted"
        } else {
            "unrelated entries deleted"
        },
        cleanup.after_change.exact(),
    );
    checks
}

/// Resident memory of this process, and the bytes jemalloc reports live in allocations, so
/// `mem` tells what a structure really holds from what the allocator keeps around it.
fn rss_mb() -> String {
    let rss = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN);
    let _ = tikv_jemalloc_ctl::epoch::advance();
    let live = tikv_jemalloc_ctl::stats::allocated::read()
        .map(|b| b as f64 / 1048576.0)
        .unwrap_or(f64::NAN);
    format!("{rss:.0} MiB resident, {live:.0} MiB allocated")
}

/// The manifest files of a workload directory, sorted.
fn manifest_paths(input: &str) -> Result<Vec<std::path::PathBuf>, String> {
    let mut paths: Vec<_> = std::fs::read_dir(input)
        .map_err(|e| format!("listing {input}: {e}"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    paths.sort();
    Ok(paths)
}

/// Parses one manifest file into objects.
fn objects_of(path: &std::path::Path) -> Result<Vec<kpng_model::Object>, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    Ok(kpng_source_file::parse_manifests(&text)
        .map_err(|e| e.to_string())?
        .objects)
}

/// `kpng-bench mem --input DIR`: resident memory at each stage of loading a workload (parsed
/// objects held at once, the model, the same model streamed), to see where memory goes.
/// `KPNG_MEM_STREAM_ONLY=1` measures only the streamed model, in a fresh process.
fn mem(input: &str) -> Result<(), String> {
    use kpng_model::{Event, Kind, Model, ModelConfig};
    println!("start: {}", rss_mb());
    println!(
        "sizes: ServicePort {} B, Endpoint {} B, SliceInfo {} B, SliceEndpoint {} B, ServiceInfo {} B, PortKey {} B",
        std::mem::size_of::<kpng_model::ServicePort>(),
        std::mem::size_of::<kpng_model::Endpoint>(),
        std::mem::size_of::<kpng_model::records::SliceInfo>(),
        std::mem::size_of::<kpng_model::records::SliceEndpoint>(),
        std::mem::size_of::<kpng_model::records::ServiceInfo>(),
        std::mem::size_of::<kpng_model::PortKey>(),
    );
    let paths = manifest_paths(input)?;
    let new_model = || {
        Model::new(ModelConfig {
            node_name: "node1".into(),
            ..ModelConfig::default()
        })
    };
    let streamed = |model: &mut Model| -> Result<(), String> {
        for p in &paths {
            for o in objects_of(p)? {
                model.apply(Event::Apply(o));
            }
        }
        Ok(())
    };
    if std::env::var_os("KPNG_MEM_STREAM_ONLY").is_none() {
        let mut objects = Vec::new();
        for p in &paths {
            objects.extend(objects_of(p)?);
        }
        println!("parsed {} objects, all held: {}", objects.len(), rss_mb());
        let mut model = new_model();
        let out = model.apply(Event::Replace {
            kinds: vec![Kind::Service, Kind::EndpointSlice, Kind::Node],
            objects,
        });
        println!(
            "model applied ({} changes), objects dropped: {}",
            out.diff.changes.len(),
            rss_mb()
        );
        drop(out);
        drop(model);
        println!("model dropped: {}", rss_mb());
    }
    if std::env::var_os("KPNG_MEM_CLUSTER").is_some() {
        let mut cluster = kpng_model::cluster::ClusterModel::new(Default::default());
        for p in &paths {
            for o in objects_of(p)? {
                cluster.apply(Event::Apply(o));
            }
        }
        println!("streamed into a cluster model alone: {}", rss_mb());
        drop(cluster);
        println!("cluster model dropped: {}", rss_mb());
    }
    let mut model = new_model();
    streamed(&mut model)?;
    println!(
        "streamed into a model: {} ({} ports)",
        rss_mb(),
        model.snapshot().ports.len()
    );
    Ok(())
}

/// Which side of its target a measured figure has to be on.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Bound {
    /// The figure must be at most the target (a time, a memory size, a slowdown).
    AtMost,
    /// The figure must be at least the target (a rate, a speed-up).
    AtLeast,
}

/// The verdict cell of the targets table: the measured figure first, then the target with its
/// comparison, then met or missed, e.g. `19.9× (target ≥ 5×): met`. Written this way so a
/// reader never has to guess which way a ratio runs (an earlier text printed target/measured
/// for "≥" targets, so a 4× margin read "0.25× the target").
pub(crate) fn verdict(bound: Bound, measured: f64, target: f64, unit: &str) -> String {
    let (ok, sign) = match bound {
        Bound::AtMost => (measured <= target, '≤'),
        Bound::AtLeast => (measured >= target, '≥'),
    };
    format!(
        "{} (target {sign} {target}{unit}): {}",
        figure(measured, unit),
        if ok { "met" } else { "**missed**" }
    )
}

/// A measured figure with its unit, as precise as the bench's tables print it.
fn figure(v: f64, unit: &str) -> String {
    match unit {
        "×" if v >= 10.0 => format!("{v:.1}{unit}"),
        " MiB" => format!("{v:.0}{unit}"),
        " ms" => format!("{v:.1}{unit}"),
        _ => format!("{v:.2}{unit}"),
    }
}

/// The issue's targets, each with the measured figure and its verdict against the target.
fn targets(
    control: &[control::ControlResult],
    data: &[data::DataResult],
    cleanup: &conntrack::ConntrackResult,
) -> String {
    let mut rows: Vec<(String, String, String)> = Vec::new();
    // The targets are the nftables backend's.
    let find = |n: usize| {
        control
            .iter()
            .find(|r| r.n == n && r.backend == control::BackendKind::Nft)
    };
    if let Some(r) = find(30_000) {
        let s = r.cold_backend.as_secs_f64();
        rows.push((
            "cold programming 30k × 4 ≤ 1 s".into(),
            format!("{s:.2} s"),
            verdict(Bound::AtMost, s, 1.0, " s"),
        ));
        let p99 = r.change_p99.as_secs_f64() * 1000.0;
        rows.push((
            "one change at 30k, p99 ≤ 5 ms".into(),
            format!("{p99:.1} ms"),
            verdict(Bound::AtMost, p99, 5.0, " ms"),
        ));
        rows.push((
            "kpng peak RSS at 30k × 4 ≤ 150 MiB (VmHWM)".into(),
            format!("{:.0} MiB", r.peak_rss_mb),
            verdict(Bound::AtMost, r.peak_rss_mb, 150.0, " MiB"),
        ));
        if let Some(small) = find(1000) {
            let ratio = r.change_p99.as_secs_f64() / small.change_p99.as_secs_f64();
            rows.push((
                "one change flat in N: 30k p99 ≤ 2 × 1k p99".into(),
                format!("{ratio:.2}×"),
                verdict(Bound::AtMost, ratio, 2.0, "×"),
            ));
        }
    }
    if let Some(r) = find(100_000) {
        let s = r.cold_backend.as_secs_f64();
        rows.push((
            "cold programming 100k × 2 ≤ 3 s".into(),
            format!("{s:.2} s"),
            verdict(Bound::AtMost, s, 3.0, " s"),
        ));
    }
    // The data-plane targets are set at 30k Services; a `--quick` run has no such row.
    if let Some(d) = data.iter().find(|d| d.n == 30_000) {
        // Both ends of the Service list, judged on the worse.
        let (first_lat, first_rate) = d.nft_vs_floor("first");
        let (last_lat, last_rate) = d.nft_vs_floor("last");
        let lat = first_lat.max(last_lat);
        let rate = first_rate.min(last_rate);
        rows.push((
            format!("first-packet p50 at {}, ≤ 1.1 × floor", d.n),
            format!("first Service {first_lat:.2}×, last {last_lat:.2}×"),
            verdict(Bound::AtMost, lat, 1.1, "×"),
        ));
        rows.push((
            format!("new connections/s at {}, ≥ 0.9 × floor", d.n),
            format!("first Service {first_rate:.2}×, last {last_rate:.2}×"),
            verdict(Bound::AtLeast, rate, 0.9, "×"),
        ));
        for backend in [
            control::BackendKind::IptablesNft,
            control::BackendKind::IptablesLegacy,
        ] {
            if let Some(ratio) = d.nft_rate_over(backend.label()) {
                rows.push((
                    format!(
                        "new connections/s to the last Service at {}, ≥ 5 × kpng's own iptables backend ({})",
                        d.n,
                        backend.label()
                    ),
                    format!("{ratio:.1}×"),
                    verdict(Bound::AtLeast, ratio, 5.0, "×"),
                ));
            }
        }
    }
    let pass = &cleanup.after_change;
    let secs = pass.duration.as_secs_f64();
    rows.push((
        format!(
            "UDP conntrack cleanup after a change, {} unrelated entries, ≤ 1 s, none deleted",
            cleanup.unrelated
        ),
        format!(
            "{secs:.2} s, {}",
            if pass.exact() {
                "none deleted"
            } else {
                "**unrelated entries deleted**"
            }
        ),
        if pass.exact() {
            verdict(Bound::AtMost, secs, 1.0, " s")
        } else {
            format!("{secs:.2} s (target ≤ 1 s, none deleted): **missed**")
        },
    ));
    let mut s = String::from("\n## Targets\n\n| target | measured | verdict |\n|---|---|---|\n");
    for (t, m, v) in rows {
        s.push_str(&format!("| {t} | {m} | {v} |\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::{Bound, check_numbers, verdict};

    /// The verdict cell reads measured, then the target with its comparison, then met or
    /// missed, in the same direction for "≤" and "≥" targets: a 19.9× speed-up against a
    /// "≥ 5×" target must never read as "0.25× the target".
    #[test]
    fn verdict_states_measured_against_target() {
        let cases = [
            (Bound::AtLeast, 19.9, 5.0, "×", "19.9× (target ≥ 5×): met"),
            (
                Bound::AtLeast,
                4.2,
                5.0,
                "×",
                "4.20× (target ≥ 5×): **missed**",
            ),
            (Bound::AtLeast, 0.95, 0.9, "×", "0.95× (target ≥ 0.9×): met"),
            (
                Bound::AtMost,
                1.18,
                1.1,
                "×",
                "1.18× (target ≤ 1.1×): **missed**",
            ),
            (Bound::AtMost, 0.43, 1.0, " s", "0.43 s (target ≤ 1 s): met"),
            (
                Bound::AtMost,
                2.3,
                5.0,
                " ms",
                "2.3 ms (target ≤ 5 ms): met",
            ),
            (
                Bound::AtMost,
                141.2,
                150.0,
                " MiB",
                "141 MiB (target ≤ 150 MiB): met",
            ),
            (
                Bound::AtMost,
                150.0,
                150.0,
                " MiB",
                "150 MiB (target ≤ 150 MiB): met",
            ),
        ];
        for (bound, measured, target, unit, want) in cases {
            assert_eq!(
                verdict(bound, measured, target, unit),
                want,
                "{bound:?} {measured} {target}"
            );
        }
    }

    /// The usage names every flag the `api` mode reads, and its heavy `--services` default:
    /// until 2026-12-07 it hid `--services`, `--endpoints` and `--changes`, and `kpng-bench
    /// api --clients 200` silently started a brain of 30,000 Services.
    #[test]
    fn the_api_modes_usage_names_its_size_flags_and_default() {
        let api = super::USAGE
            .split(" | ")
            .find(|mode| mode.starts_with("api ["))
            .expect("the api mode");
        for flag in [
            "--services N (default 30000",
            "--endpoints M (4)",
            "--changes K (20)",
        ] {
            assert!(api.contains(flag), "{flag} in {api}");
        }
    }

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_bad_number_is_refused_naming_its_flag() {
        let cases: [(&[&str], Option<&str>); 6] = [
            (&["kpng-bench", "control-plane", "--services", "1000"], None),
            (
                &["kpng-bench", "control-plane", "--services", "10k"],
                Some("--services"),
            ),
            (
                &["kpng-bench", "data-plane", "--connects", "-1"],
                Some("--connects"),
            ),
            (
                &["kpng-bench", "control-plane", "--changes"],
                Some("--changes"),
            ),
            (&["kpng-bench", "api", "--clients", "1000,5000"], None),
            (
                &["kpng-bench", "api", "--clients", "1000,5k"],
                Some("--clients"),
            ),
        ];
        for (given, refused) in cases {
            match (check_numbers(&args(given)), refused) {
                (Ok(()), None) => {}
                (Err(e), Some(flag)) => assert!(e.starts_with(flag), "{given:?}: {e}"),
                (got, want) => panic!("{given:?}: {got:?}, expected a refusal of {want:?}"),
            }
        }
    }
}
