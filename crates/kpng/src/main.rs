//! `kpng`: a Kubernetes service proxy.
//!
//! `kpng <source> [flags] <sink> [backend] [flags]`: a source turns cluster state into the
//! node-local model, a sink consumes it. See `kpng --help`.

mod admin;
mod admin_socket;
mod after_healthy;
mod backends;
#[cfg(target_os = "linux")]
mod beside;
mod brain;
#[cfg(target_os = "linux")]
mod caps;
mod cli;
mod config;
#[cfg(target_os = "linux")]
mod conntrack;
#[cfg(target_os = "linux")]
mod conntrack_metrics;
mod dry_run;
#[cfg(target_os = "linux")]
mod earlier_rules;
#[cfg(target_os = "linux")]
mod ebpf_status;
mod exit_codes;
mod fatal_line;
#[cfg(target_os = "linux")]
mod foreign_chains;
mod hns_status;
#[cfg(target_os = "linux")]
mod host_facts;
mod http;
mod input_metrics;
mod instance_lock;
#[cfg(target_os = "linux")]
mod iptables_status;
mod json_log;
#[cfg(target_os = "linux")]
mod kube_proxy_checks;
mod kube_proxy_flags;
mod kube_proxy_process;
mod leftovers;
#[cfg(target_os = "linux")]
mod legacy_chains;
mod listen;
#[cfg(target_os = "linux")]
mod lock_askers;
mod log_dedup;
mod logging;
mod memory;
mod metrics_text;
#[cfg(target_os = "linux")]
mod netns_records;
#[cfg(target_os = "linux")]
mod nft_status;
#[cfg(target_os = "linux")]
mod own_rules;
#[cfg(target_os = "linux")]
mod peer_owner;
#[cfg(target_os = "linux")]
mod pod_interfaces;
#[cfg(target_os = "linux")]
mod prereq;
mod process_metrics;
mod quiet_sink;
mod run;
#[cfg(target_os = "linux")]
mod run_marker;
mod signals;
mod status_filter;
mod status_history;
mod status_policy;
mod status_problems;
mod status_web;
mod version;
mod winservice;
mod zpages;

/// jemalloc instead of glibc's allocator: loading a large cluster allocates and frees many
/// small objects from several threads, and glibc keeps that memory in fragmented per-thread
/// arenas (measured at 30k Services: glibc peaks at 565 MB, and `MALLOC_ARENA_MAX=1` alone
/// brings it to 475 MB); jemalloc returns it.
#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use clap::{CommandFactory, FromArgMatches};

fn main() -> std::process::ExitCode {
    // kube-proxy's flags kpng does not implement leave the line first (warned about below).
    let extracted = kube_proxy_flags::extract(std::env::args_os());
    let args: Vec<String> = extracted
        .args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let matches = match cli::command().try_get_matches_from(&extracted.args) {
        Ok(matches) => matches,
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp
                    | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) =>
        {
            // Help with the global flags once, grouped (`cli::help_command`).
            let text = cli::help_text(&args);
            if e.kind() == clap::error::ErrorKind::DisplayHelp {
                print!("{text}");
                return std::process::ExitCode::SUCCESS;
            }
            eprint!("{text}");
            return std::process::ExitCode::from(2);
        }
        Err(e) => {
            match cli::hint(&e, &args) {
                // kpng knows where the flag belongs: clap's guess at a similar spelling (often
                // a flag of the wrong backend) would only mislead, so it is left out.
                Some(hint) if hint.contains(" is a flag of `kpng ") => {
                    let text = e.render().to_string();
                    // clap's usage line shows where the parse stopped (with flags the line
                    // never gave); the usage that helps is the one of where the flag belongs.
                    let usage = cli::usage_for_hint(&hint);
                    let mut kept = String::new();
                    for line in text.split_inclusive('\n') {
                        if let Some(usage) = &usage
                            && line.starts_with("Usage:")
                        {
                            kept.push_str(usage);
                            kept.push('\n');
                            continue;
                        }
                        let blank_again = line.trim().is_empty() && kept.ends_with("\n\n");
                        if !blank_again
                            && !line
                                .trim_start()
                                .starts_with("tip: a similar argument exists")
                        {
                            kept.push_str(line);
                        }
                    }
                    eprint!("{kept}");
                    eprintln!("\nhint: {hint}");
                }
                Some(hint) => {
                    let _ = e.print();
                    eprintln!("\nhint: {hint}");
                }
                None => {
                    let _ = e.print();
                }
            }
            return std::process::ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let mut cli = cli::Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // The configuration file comes first: it may set the log level.
    let report = match config::apply(&mut cli.global, &matches) {
        Ok(report) => report,
        Err(e) => {
            config_refused(&cli.global, &describe(&e));
            return std::process::ExitCode::FAILURE;
        }
    };
    // A running kpng reads its --config file again and checks a new content as this start
    // did (`config::watch`).
    if let (Some(path), Some(text)) = (cli.global.config.clone(), report.text.clone()) {
        let matches = matches.clone();
        cli.global.config_recheck = Some(config::watch::Recheck::new(path, text, move || {
            let mut again = cli::Cli::from_arg_matches(&matches)?;
            config::apply(&mut again.global, &matches).map(drop)
        }));
    }
    // A to-file run opens no listener it was not asked for (`quiet_sink`).
    let quiet_sink =
        quiet_sink::turn_off_unasked(&mut cli, |id| config::given_on_command_line(&matches, id));
    // After the file applied: /flagz shows the values in force.
    cli.global.effective_flags =
        zpages::effective_flags(&cli::Cli::command(), &matches, &cli.global);
    if logging::rust_log().is_none()
        && let Err(e) = logging::check_level(&cli.global.log_level)
    {
        eprintln!("kpng: {e}");
        return std::process::ExitCode::from(2);
    }
    let target = match logging::LogTarget::open(cli.global.log_file.as_deref()) {
        Ok(target) => target,
        Err(e) => {
            eprintln!("kpng: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let to_file = matches!(target, logging::LogTarget::File(_));
    // A command that runs once and ends, rather than a proxy. kube-proxy's `--cleanup` is
    // `kpng cleanup` and ends as it does (its refusal was an ERROR log line, `kpng cleanup`'s a
    // plain `kpng: …`, until 2026-12-07).
    let one_shot = cli.global.cleanup
        || matches!(
            cli.command,
            Some(
                cli::Command::Cleanup(_)
                    | cli::Command::Version(_)
                    | cli::Command::Status(_)
                    | cli::Command::Trace(_)
            )
        );
    let ends = fatal_line::Ending { to_file, one_shot };
    let error_document = error_document_of(cli.command.as_ref());
    logging::init(&cli.global.log_level, cli.global.logging_format, target);
    for note in &report.notes {
        tracing::info!("--config: {note}");
    }
    if let Some(note) = &quiet_sink {
        tracing::info!("{note}");
    }
    for warning in &report.warnings {
        tracing::warn!("--config: {warning}");
    }
    for warning in report.flag_warnings.iter().chain(&extracted.warnings) {
        tracing::warn!("{warning}");
    }
    // `--strict-config`: a CI check of a ConfigMap fails on what only warns at a start.
    if cli.global.strict_config && !report.warnings.is_empty() {
        ends.fatal(&format!(
            "--strict-config: {} warning(s) about --config {} (above)",
            report.warnings.len(),
            cli.global
                .config
                .as_deref()
                .unwrap_or(std::path::Path::new(""))
                .display()
        ));
        return std::process::ExitCode::FAILURE;
    }
    #[cfg(target_os = "linux")]
    raise_open_files_limit(!one_shot);
    if let Some(class) = cli.global.windows_priority_class {
        windows_priority(class);
    }
    if cli.global.windows_service
        && let Err(e) = windows_service()
    {
        ends.fatal(&describe(&e));
        return std::process::ExitCode::FAILURE;
    }
    let result = match cli.global.write_config_to.clone() {
        Some(destination) => {
            // The effective mode: the flag's or the file's, else the `to-local` backend's.
            let mut flags = cli.global.clone();
            if flags.proxy_mode.is_none() {
                flags.proxy_mode = cli.command.as_ref().and_then(run::local_kind);
            }
            config::write_effective(&flags, &destination, &matches)
        }
        None => run::main(cli),
    };
    match result {
        Ok(()) => {
            winservice::stopped(0);
            std::process::ExitCode::SUCCESS
        }
        // `kpng status … | head -1`: the reader had what it wanted.
        Err(e) if e.downcast_ref::<admin::StdoutClosed>().is_some() => {
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            let text = describe(&e);
            let kind = exit_codes::kind_of(&e);
            // A script reading `-o json|yaml` gets a document in every case (`exit_codes`).
            // (Unless the command printed its own, which says the error: `kpng trace` to an
            // address no Service has.)
            if !exit_codes::printed(&e)
                && let Some(document) = exit_codes::error_document(error_document, kind, &text)
            {
                print!("{document}");
            }
            ends.fatal(&text);
            winservice::stopped(1);
            std::process::ExitCode::from(kind.exit_code())
        }
    }
}

/// Whether a failure of `command` is also printed as a document on standard output: `kpng
/// status -o json|yaml` and `kpng trace -o json`, whose output a script parses.
fn error_document_of(command: Option<&cli::Command>) -> exit_codes::ErrorDocument {
    use exit_codes::ErrorDocument;
    match command {
        Some(cli::Command::Status(args)) => match args.output {
            cli::StatusOutput::Json => ErrorDocument::Json,
            cli::StatusOutput::Yaml => ErrorDocument::Yaml,
            _ => ErrorDocument::None,
        },
        Some(cli::Command::Trace(args)) if args.output == cli::LogFormat::Json => {
            ErrorDocument::Json
        }
        _ => ErrorDocument::None,
    }
}

/// A `--config` file refused before the logger exists: a plain `kpng: …` line, or with
/// `--logging-format json` on the line an ERROR line in JSON, which a log pipeline parsing
/// JSON keeps (until 2026-12-07 it was plain text there too).
fn config_refused(flags: &cli::GlobalFlags, text: &str) {
    if flags.logging_format != cli::LogFormat::Json {
        eprintln!("kpng: {text}");
        return;
    }
    match logging::LogTarget::open(flags.log_file.as_deref()) {
        Ok(target) => {
            let to_file = matches!(target, logging::LogTarget::File(_));
            logging::init(&flags.log_level, flags.logging_format, target);
            fatal_line::Ending {
                to_file,
                one_shot: false,
            }
            .fatal(text);
        }
        Err(_) => eprintln!("kpng: {text}"),
    }
}

/// `--windows-service`: run under the Service Control Manager on Windows (`winservice`);
/// elsewhere a warning.
fn windows_service() -> anyhow::Result<()> {
    #[cfg(windows)]
    {
        winservice::start()?;
        tracing::info!("running as a Windows service");
    }
    #[cfg(not(windows))]
    tracing::warn!("--windows-service: a Windows setting; ignored on this system");
    Ok(())
}

/// `--windows-priority-class`: set at start on Windows (kubernetes#96935); elsewhere there is
/// no such thing, so the flag warns and changes nothing.
fn windows_priority(class: cli::WindowsPriorityClass) {
    #[cfg(windows)]
    match kpng_backend_hns::system::set_priority_class(class.as_str()) {
        Ok(()) => tracing::info!("process priority class: {}", class.as_str()),
        Err(e) => tracing::warn!("--windows-priority-class {}: {e}", class.as_str()),
    }
    #[cfg(not(windows))]
    tracing::warn!(
        "--windows-priority-class {}: a Windows setting; ignored on this system",
        class.as_str()
    );
}

/// An error and its causes on one line, each cause once: libraries often put their cause's
/// text in their own message *and* return it as the source (kube's kubeconfig errors do), which
/// `{:#}` would print two or three times.
fn describe(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// Raises the soft limit of open files to the hard one, as a Go program (kube-proxy) does at
/// start: the default soft limit of 1024 is reached by about a thousand idle connections to
/// the health port, and then the manifest, the netlink sockets and the API server's
/// connections cannot be opened, so nothing is programmed until they go.
/// What is left after the raise is said at debug; for a proxy (`proxy`: not `kpng status`
/// and the other commands that only ask or clean), a limit still below [`MIN_OPEN_FILES`] (a
/// hard limit set that low: `ulimit -n 32` sets both) is warned about, since the health server
/// then stops accepting connections and the eBPF backend fails every sync.
#[cfg(target_os = "linux")]
fn raise_open_files_limit(proxy: bool) {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current.is_some() && limit.current != limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::debug!("raising the open files limit to the hard limit: {e}");
        }
    }
    let now = getrlimit(Resource::Nofile);
    let shown = |n: Option<u64>| n.map_or_else(|| "unlimited".to_string(), |n| n.to_string());
    tracing::debug!(
        "open files limit: {} (was {}; hard limit {})",
        shown(now.current),
        shown(limit.current),
        shown(now.maximum)
    );
    if let Some(message) = low_open_files_limit(now.current).filter(|_| proxy) {
        tracing::warn!("{message}");
    }
}

/// Below this many open files kpng is likely to run out: its own sockets, files and netlink
/// connections, the eBPF backend's ~50 descriptors, one per health, metrics or admin client
/// and one per eTP Local Service's health check.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
const MIN_OPEN_FILES: u64 = 256;

/// The warning for a soft limit of `soft` open files (`None`: unlimited) after the raise,
/// when it is below [`MIN_OPEN_FILES`].
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn low_open_files_limit(soft: Option<u64>) -> Option<String> {
    let soft = soft.filter(|n| *n < MIN_OPEN_FILES)?;
    Some(format!(
        "the open-files limit is {soft}, its hard limit too: kpng may run out of descriptors \
         (health and metrics clients unanswered, syncs failing with \"Too many open files\"); \
         {} to {MIN_OPEN_FILES} or more (LimitNOFILE= in a systemd unit, the container \
         runtime's ulimits)",
        kpng_runner::open_files::RAISE_THE_LIMIT
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_open_files_limit_too_low_for_a_proxy_is_said_with_the_fix() {
        assert_eq!(
            super::low_open_files_limit(Some(32)).as_deref(),
            Some(
                "the open-files limit is 32, its hard limit too: kpng may run out of \
                 descriptors (health and metrics clients unanswered, syncs failing with \"Too \
                 many open files\"); raise the open-files limit (ulimit -n; the eBPF backend \
                 needs about 50 descriptors) to 256 or more (LimitNOFILE= in a systemd unit, \
                 the container runtime's ulimits)"
            )
        );
        for fine in [Some(256), Some(1024), None] {
            assert_eq!(super::low_open_files_limit(fine), None, "{fine:?}");
        }
    }

    #[test]
    fn an_error_says_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file (os error 2)");
        let e = anyhow::Error::new(io)
            .context("failed to read kubeconfig from 'k': No such file (os error 2)")
            .context(
                "--kubeconfig k: failed to read kubeconfig from 'k': No such file (os error 2)",
            );
        assert_eq!(
            super::describe(&e),
            "--kubeconfig k: failed to read kubeconfig from 'k': No such file (os error 2)"
        );
        let e = anyhow::anyhow!("root cause").context("doing X");
        assert_eq!(super::describe(&e), "doing X: root cause");
    }
}
