//! Wiring: source → model → runner → sink, plus the HTTP servers.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, bail};
use kpng_backend::{Backend, NodeModel};
use kpng_model::input::InputHealth;
use kpng_model::{Model, ModelConfig};
use kpng_runner::SyncTiming;
use kpng_runner::health::ProxyHealth;
use kpng_runner::metrics::ProxyMetrics;
use kpng_runner::runner::{HealthCheckAddresses, Runner};
use kpng_sink_file::{FileSink, Output};
use kpng_source_file::{FileSource, SourceMetrics};
use kpng_source_kube::{ClientOptions, KubeSource, SourceConfig};
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tracing::info;

use crate::backends::{BackendKind, Platform};
use crate::cli::{
    ApiSource, BrainFlags, CleanupArgs, Cli, Command, FileSource as FileArgs, GlobalFlags,
    InputKind, KubeSource as KubeArgs, LocalBackend, NodeSink, Sink, ToLocal,
};

/// The async runtime every source runs on.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Runs `main` on a fresh [`runtime`] and returns its result once it ends.
///
/// Why not `runtime()?.block_on(main)`: dropping a runtime waits for every blocking task,
/// and one nobody awaits any more (the leftover sweep, which can run `iptables-save` over a large
/// kube-proxy ruleset) would then hold the exit past SIGTERM's grace period. What is still
/// running a second after `main` ended is abandoned; the next start redoes it.
fn block_on<F: std::future::Future<Output = anyhow::Result<()>>>(main: F) -> anyhow::Result<()> {
    let runtime = runtime()?;
    let result = runtime.block_on(main);
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}

/// `--cleanup`, `kpng cleanup`: every proxy's leftovers on Linux (with `--kpng-only`, only
/// kpng's own); HNS's load balancers on Windows.
fn cleanup(flags: &GlobalFlags, args: &CleanupArgs, dry_run: bool) -> anyhow::Result<()> {
    #[cfg(windows)]
    return {
        wait_healthy(args, dry_run)?;
        crate::backends::hns::cleanup(flags, dry_run)
    };
    #[cfg(not(windows))]
    {
        let _ = flags;
        // A dry run goes on past what the real run would refuse, listing what it would
        // remove, and then ends as the real run would: a script's `--dry-run` check must not
        // read success where the real run fails.
        #[allow(unused_mut)]
        let mut would_refuse = false;
        // With --after-healthy or --after-synced, a kpng still running here is waited for
        // rather than refused (`wait_healthy`): kpng is being replaced node by node.
        let waits = args.after_healthy.is_some() || args.after_synced.is_some();
        #[cfg(target_os = "linux")]
        {
            if !waits || dry_run {
                would_refuse |= refuse_while_running(dry_run)?;
            }
            // Without these, tables and chains cannot even be listed: they would look absent
            // and cleanup would report success.
            let unreadable = crate::caps::legacy_unreadable();
            if dry_run {
                if !crate::caps::has(crate::caps::NET_ADMIN) {
                    println!(
                        "kpng: cleanup would refuse: it needs CAP_NET_ADMIN, which this process lacks"
                    );
                    would_refuse = true;
                }
                if let Some(why) = &unreadable {
                    println!("kpng: cleanup would refuse: {why}");
                    would_refuse = true;
                }
            } else {
                crate::caps::need_net_admin("kpng cleanup")?;
                if let Some(why) = unreadable {
                    anyhow::bail!("kpng cleanup: {why}");
                }
            }
        }
        let _ = waits;
        if wait_healthy(args, dry_run)? {
            // A kpng started while this waited would put back what cleanup removes.
            #[cfg(target_os = "linux")]
            refuse_while_running(false)?;
        }
        let scope = if args.kpng_only {
            crate::leftovers::Scope::KpngOnly
        } else {
            crate::leftovers::Scope::Everything
        };
        #[allow(unused_mut)]
        let mut removed = crate::leftovers::cleanup_all(
            scope,
            dry_run,
            &crate::leftovers::EbpfPlaces {
                pins: args.bpf_pin_path.clone(),
                cgroup: args.cgroup_path.clone(),
            },
        )?;
        #[cfg(target_os = "linux")]
        {
            removed += remove_conntrack_memory(dry_run)?;
            removed += forget_gone_namespaces(dry_run);
        }
        if removed == 0 {
            println!("kpng: nothing to remove");
        }
        if would_refuse {
            anyhow::bail!("--dry-run: the real cleanup would refuse (said above), and fail so");
        }
        Ok(())
    }
}

/// `--after-healthy`, `--after-synced`: waits until the proxy taking over is healthy or has
/// synced (`crate::after_healthy`); a dry run only says it would. Whether it waited.
fn wait_healthy(args: &CleanupArgs, dry_run: bool) -> anyhow::Result<bool> {
    use crate::after_healthy::Until;
    let (addr, until, flag) = match (args.after_healthy, args.after_synced) {
        (Some(addr), _) => (addr, Until::Healthy, "--after-healthy"),
        (None, Some(addr)) => (addr, Until::Synced, "--after-synced"),
        (None, None) => return Ok(false),
    };
    if dry_run {
        println!("kpng: would wait ({flag} {addr}, --timeout), then:");
        return Ok(false);
    }
    #[cfg(target_os = "linux")]
    let blocker = || {
        BackendKind::ALL.iter().find_map(|kind| {
            let asking = crate::lock_askers::Asking::Cleanup { dry_run: true };
            crate::instance_lock::holder(kind.word(), &asking)
        })
    };
    #[cfg(not(target_os = "linux"))]
    let blocker = || None;
    crate::after_healthy::wait(addr, until, args.timeout, &blocker)
        .map_err(|e| anyhow::anyhow!("kpng cleanup {flag}: {e}"))?;
    Ok(true)
}

/// Removes the records of network namespaces that no longer exist (`crate::netns_records`);
/// returns how many.
#[cfg(target_os = "linux")]
fn forget_gone_namespaces(dry_run: bool) -> usize {
    let dir = std::path::Path::new(kpng_backend_iptables::route_localnet::STATE_DIR);
    let verb = if dry_run { "would remove" } else { "removed" };
    let gone = crate::netns_records::forget_gone(dir, dry_run);
    for record in &gone {
        println!(
            "kpng: {verb} {}, a record of a network namespace that no longer exists",
            record.display()
        );
    }
    gone.len()
}

/// Removes this network namespace's conntrack memory (`kpng_conntrack::memory`): kpng's
/// last state file. Without it a later start reads every UDP frontend whole, as it would
/// anyway once the tables are gone.
#[cfg(target_os = "linux")]
fn remove_conntrack_memory(dry_run: bool) -> anyhow::Result<usize> {
    let Some(path) = kpng_conntrack::memory::default_path().filter(|p| p.exists()) else {
        return Ok(0);
    };
    let what = format!("the UDP conntrack cleanup's memory ({})", path.display());
    if dry_run {
        println!("kpng: would remove {what}");
        return Ok(1);
    }
    std::fs::remove_file(&path).with_context(|| format!("removing {what}"))?;
    println!("kpng: removed {what}");
    Ok(1)
}

/// A kpng still programming this network namespace would put back at once what cleanup
/// removes (it repairs changes by someone else within 100 ms), so cleanup would report
/// success and change nothing: refuse, naming it. A dry run only says so, and gets whether
/// the real run would refuse.
#[cfg(target_os = "linux")]
fn refuse_while_running(dry_run: bool) -> anyhow::Result<bool> {
    let mut would_refuse = false;
    for kind in BackendKind::ALL {
        let asking = crate::lock_askers::Asking::Cleanup { dry_run };
        let Some(who) = crate::instance_lock::holder(kind.word(), &asking) else {
            continue;
        };
        let running = format!(
            "{who} runs `to-local {}` in this network namespace",
            kind.word()
        );
        if dry_run {
            println!("kpng: {running}; cleanup would refuse until it stops");
            would_refuse = true;
            continue;
        }
        anyhow::bail!(
            "{running}: it would put back at once what cleanup removes. Stop it first (its \
             systemd unit, or the DaemonSet's pod on this node), then run cleanup again"
        );
    }
    Ok(would_refuse)
}

/// Runs the command line.
pub fn main(cli: Cli) -> anyhow::Result<()> {
    let flags = cli.global;
    // kube-proxy's --cleanup and --init-only stop before anything runs, whatever follows.
    if flags.cleanup {
        // kube-proxy's line has no eBPF flags: the pins of `$KPNG_BPF_PIN_PATH` or the default.
        let args = CleanupArgs {
            kpng_only: cli.kpng_only,
            dry_run: cli.dry_run,
            after_healthy: None,
            after_synced: None,
            timeout: std::time::Duration::ZERO,
            bpf_pin_path: crate::leftovers::default_ebpf_pins(),
            cgroup_path: crate::leftovers::EbpfPlaces::from_env().cgroup,
        };
        return cleanup(&flags, &args, cli.dry_run);
    }
    if cli.kpng_only && !matches!(cli.command, Some(Command::Cleanup(_))) {
        anyhow::bail!("--kpng-only goes with --cleanup or `kpng cleanup`, and only there");
    }
    let command = match cli.command {
        Some(command) => command,
        None => return kube_proxy(flags, cli.dry_run),
    };
    if let Command::Cleanup(args) = &command {
        let mut args = args.clone();
        // `kpng --kpng-only cleanup`: the root's flag, written before the subcommand.
        args.kpng_only |= cli.kpng_only;
        return cleanup(&flags, &args, cli.dry_run || args.dry_run);
    }
    if cli.dry_run {
        anyhow::bail!(
            "--dry-run before a subcommand only applies to kube-proxy's command line (no \
             subcommand); write it after the backend: `kpng … to-local nft --dry-run`"
        );
    }
    if flags.init_only {
        let dry_run = local_of(&command).is_some_and(BackendKind::dry_run);
        return init_only(&flags, local_kind(&command), dry_run);
    }
    match command {
        Command::Version(args) => crate::version::print(&args),
        Command::Status(args) => {
            crate::admin::print_status(std::path::Path::new(&flags.admin_socket), &args)
        }
        Command::Trace(args) => {
            crate::admin::print_trace(std::path::Path::new(&flags.admin_socket), &args)
        }
        Command::Cleanup(args) => cleanup(&flags, &args, args.dry_run),
        Command::File(file) => {
            let source_metrics = SourceMetrics::default();
            let input = source_metrics.health.clone();
            let source = FileSource::new(file.input, file.debounce)
                .with_metrics(source_metrics.clone())
                .with_expansion_limit(kpng_source_file::ExpansionLimit(
                    usize::try_from(file.max_yaml_expansion).unwrap_or(1),
                ));
            let run_source = |tx| async move { source.run(tx).await.map_err(anyhow::Error::from) };
            if let Sink::ToApi(to_api) = &file.sink {
                return block_on(crate::brain::serve(
                    flags,
                    to_api,
                    InputKind::Manifests,
                    input,
                    |registry| source_metrics.register(registry),
                    run_source,
                ));
            }
            let (backend, facts) = sink_backend(&flags, &file.sink)?;
            block_on(async move {
                let model = Model::new(model_config(&flags, InputKind::Manifests)?);
                let facts = SinkFacts {
                    source_metrics: Some(source_metrics),
                    input: Some(input),
                    while_loading: crate::memory::WhileLoading::ReturnAtOnce,
                    ..facts
                };
                serve(flags, model, backend, facts, run_source).await
            })
        }
        Command::Local(local) => {
            let (backend, facts) = local_backend(&flags, &local.backend)?;
            block_on(serve_remote(flags, &local.brain, backend, facts))
        }
        Command::Api(api) => {
            let (backend, facts) = node_sink(&flags, &api.sink)?;
            block_on(serve_remote(flags, &api.brain, backend, facts))
        }
        Command::Kube(kube) => run_kube(flags, kube.sink),
    }
}

/// The backend a command line's `to-local` names, if any.
pub fn local_kind(command: &Command) -> Option<BackendKind> {
    local_of(command).map(BackendKind::of)
}

/// The `to-local` backend of a command line, if any.
fn local_of(command: &Command) -> Option<&LocalBackend> {
    match command {
        Command::Kube(KubeArgs {
            sink: Sink::ToLocal(local),
        })
        | Command::File(FileArgs {
            sink: Sink::ToLocal(local),
            ..
        })
        | Command::Api(ApiSource {
            sink: NodeSink::ToLocal(local),
            ..
        }) => Some(&local.backend),
        Command::Local(local) => Some(&local.backend),
        _ => None,
    }
}

/// kube-proxy's command line (no subcommand): the `kube` source into the backend of
/// `--proxy-mode` or the configuration file's `mode`; when neither says, kube-proxy's default
/// on this system (iptables on Linux, kernelspace on Windows: [`Platform::default_backend`]).
fn kube_proxy(flags: GlobalFlags, dry_run: bool) -> anyhow::Result<()> {
    let kind = chosen_backend(&flags, Platform::HOST);
    if flags.init_only {
        return init_only(&flags, Some(kind), dry_run);
    }
    info!(
        "no subcommand: running as kube-proxy, `kpng kube … to-local {}{}` (mode {:?}{})",
        kind.word(),
        if dry_run { " --dry-run" } else { "" },
        kind.mode(),
        match &flags.proxy_mode_origin {
            Some(origin) => format!(" from {origin}"),
            None => format!(", {}", Platform::HOST.default_name()),
        }
    );
    let backend = LocalBackend::defaults(kind, dry_run)?;
    run_kube(flags, Sink::ToLocal(ToLocal { backend }))
}

/// The backend kube-proxy's command line runs on `platform`: `--proxy-mode`'s or the file's
/// `mode`, else that system's default (kube-proxy's `platformApplyDefaults`).
fn chosen_backend(flags: &GlobalFlags, platform: Platform) -> BackendKind {
    flags.proxy_mode.unwrap_or(platform.default_backend())
}

/// `--init-only`: what needs full privileges, then exit: the node checks of the backend and
/// the conntrack sysctls (kube-proxy's `platformSetup`).
/// With `dry_run` the checks run (they only read) and the sysctls are printed, not written.
fn init_only(flags: &GlobalFlags, kind: Option<BackendKind>, dry_run: bool) -> anyhow::Result<()> {
    #[cfg(target_os = "linux")]
    {
        if let Some(kind) = kind {
            crate::prereq::check(kind, "nft")?;
        }
        // The sysctls are for the backends that take the node's proxying over.
        if kind.is_none_or(BackendKind::takes_over_node_proxying) {
            let settings = crate::conntrack::ConntrackSettings::from_flags(flags);
            let proc_sys = std::path::Path::new("/proc/sys");
            if dry_run {
                print_pending_sysctls(&settings, proc_sys);
            } else {
                settings.apply(proc_sys, crate::conntrack::cpus());
            }
        }
        info!("--init-only: done");
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (flags, kind, dry_run);
        bail!("--init-only sets Linux's conntrack sysctls and is not available on this system")
    }
}

/// A dry run's conntrack sysctls: what would be written, not written.
#[cfg(target_os = "linux")]
fn print_pending_sysctls(
    settings: &crate::conntrack::ConntrackSettings,
    proc_sys: &std::path::Path,
) {
    for (path, value, current) in settings.pending(proc_sys, crate::conntrack::cpus()) {
        let current = current.map_or("unreadable".into(), |c| c.to_string());
        println!(
            "# would write {value} to {} (now {current})",
            path.display()
        );
    }
}

/// `kpng kube … <sink>` (and kube-proxy's command line).
fn run_kube(mut flags: GlobalFlags, sink: Sink) -> anyhow::Result<()> {
    // A brain serves every node: it watches every Node and needs no name of its own.
    let brain = matches!(sink, Sink::ToApi(_));
    let node_name = if brain {
        None
    } else {
        let name = node_name(&flags)?;
        flags.node_name = Some(name.clone());
        Some(name)
    };
    // Flags given on the command line, else `clientConnection` of --config, else the
    // flags' defaults.
    let cc = flags.client_connection.clone();
    let options = ClientOptions {
        kubeconfig: cc.kubeconfig.or(flags.kubeconfig.clone()),
        master: flags.master.clone(),
        qps: cc.kube_api_qps.unwrap_or(flags.kube_api_qps),
        burst: cc.kube_api_burst.unwrap_or(flags.kube_api_burst),
        idle_timeout: flags.kube_api_idle_timeout,
    };
    let config = SourceConfig {
        node_name,
        service_proxy_name: flags.service_proxy_name.clone(),
    };
    let events_for = config.node_name.clone();
    let client_metrics = kpng_source_kube::ClientMetrics::default();
    let metrics_for_client = client_metrics.clone();
    let source_errors = kpng_source_kube::SourceErrors::default();
    let errors_for_source = source_errors.clone();
    let input = InputHealth::default();
    let input_for_client = input.clone();
    let connect = async move {
        let kpng_source_kube::Connection {
            client,
            server,
            reachability,
        } = kpng_source_kube::connect(&options, &metrics_for_client, &input_for_client).await?;
        info!(%server, "reading cluster state from the API server");
        let events =
            events_for.map(|node| kpng_source_kube::NodeEvents::new(client.clone(), &node));
        let source = KubeSource::new(client, config)
            .with_reachability(reachability)
            .with_health(input_for_client)
            .with_errors(errors_for_source);
        anyhow::Ok((source, events))
    };
    let run_source = |source: KubeSource| {
        move |tx| async move {
            source.run(tx).await;
            Ok(())
        }
    };
    if let Sink::ToApi(to_api) = &sink {
        return block_on(async move {
            let (source, _) = connect.await?;
            crate::brain::serve(
                flags,
                to_api,
                InputKind::ApiServer,
                input,
                |registry| {
                    client_metrics.register(registry);
                    source_errors.register(registry);
                },
                run_source(source),
            )
            .await
        });
    }
    let (backend, facts) = sink_backend(&flags, &sink)?;
    block_on(async move {
        let model = Model::new(model_config(&flags, InputKind::ApiServer)?);
        let (source, events) = connect.await?;
        let facts = SinkFacts {
            events,
            client_metrics: Some(client_metrics),
            kube_errors: Some(source_errors),
            input: Some(input),
            ..facts
        };
        serve(flags, model, backend, facts, run_source(source)).await
    })
}

/// What `serve` needs to know about a sink's backend besides the backend itself.
struct SinkFacts {
    /// For backends that program the node: where Service health checks listen (those that
    /// take the node's proxying over, [`BackendKind::takes_over_node_proxying`], also get the
    /// conntrack sysctls).
    health_checks: Option<HealthCheckAddresses>,
    /// Whether stale UDP conntrack entries are cleaned after syncs (Linux).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    cleans_conntrack: bool,
    /// For a backend that changes the node: what of the leftovers on it is its own; every
    /// other leftover (other backends', kube-proxy's) is removed after its first sync.
    sweeps: Option<Vec<crate::leftovers::Leftover>>,
    /// For a dry run: where the kernel's first refusal arrives. A dry run opens no listener
    /// and writes no sysctl.
    dry_run: Option<tokio::sync::watch::Receiver<Option<String>>>,
    /// For a backend that changes the node: the instance lock it holds (one kpng per network
    /// namespace), taken before the backend was built, so that a second kpng is refused for
    /// that first, before anything else of the node's (the eBPF pins) is asked.
    lock: Option<crate::instance_lock::InstanceLock>,
    /// For a backend that holds the lock on Linux: this run's marker
    /// ([`crate::run_marker`]), removed when `serve` returns; it says whether the run before
    /// ended without a clean shutdown.
    #[cfg(target_os = "linux")]
    run_marker: Option<crate::run_marker::RunMarker>,
    /// The `file` source's metrics, registered with the rest.
    source_metrics: Option<SourceMetrics>,
    /// The backend programming the node, if any: its node-port addresses tell `kpng trace`
    /// which addresses accept node ports.
    kind: Option<BackendKind>,
    /// The `kube` source's Events about this Node (start, failing syncs).
    events: Option<kpng_source_kube::NodeEvents>,
    /// The `kube` source's API client metrics, registered with the rest.
    client_metrics: Option<kpng_source_kube::ClientMetrics>,
    /// The `kube` source's failed lists (`kpng_source_errors_total`), registered with the
    /// rest.
    kube_errors: Option<kpng_source_kube::SourceErrors>,
    /// The source's record of its input's health, shown by `kpng status`.
    input: Option<InputHealth>,
    /// A node fed by a brain: how it watches the brain (its metrics are registered with the
    /// rest; whether the backend found an earlier run's rules is decided there once).
    watch_config: Option<kpng_api::client::WatchConfig>,
    /// What `kpng status` adds about the backend's data plane beyond its rules
    /// ([`crate::backends::Built::data_plane`]).
    data_plane: Option<kpng_runner::admin::DataPlaneProbe>,
    /// The families whose missing `--cluster-cidr` the backend's build warned about
    /// ([`crate::backends::Built::cluster_cidr_warned`]).
    cluster_cidr_warned: Vec<kpng_model::Family>,
    /// The other programs' chains on kpng's hooks ([`crate::backends::Built::foreign_chains`]).
    foreign_chains: Option<kpng_runner::admin::ForeignChainsProbe>,
    /// Rules an earlier run left route traffic until the first sync
    /// ([`crate::backends::Built::earlier_rules`]).
    earlier_rules: bool,
    /// Which local sockets the eBPF backend translates (its `--cgroup-path` and
    /// `--socket-lb-host-netns-only`), for `kpng trace`.
    local_sockets: kpng_model::trace::LocalSockets,
    /// Why node ports are not served on 127.0.0.1 although asked
    /// ([`crate::backends::Built::localhost_failure`]), for `kpng status` and `kpng trace`.
    localhost_failure: Option<crate::backends::LocalhostFailureProbe>,
    /// What happens to freed memory while the source loads: the source decides
    /// ([`crate::memory::WhileLoading`]).
    while_loading: crate::memory::WhileLoading,
}

impl SinkFacts {
    /// A sink that does not touch the node (`to-file`).
    const NONE: SinkFacts = SinkFacts {
        health_checks: None,
        cleans_conntrack: false,
        sweeps: None,
        dry_run: None,
        lock: None,
        #[cfg(target_os = "linux")]
        run_marker: None,
        source_metrics: None,
        kind: None,
        events: None,
        client_metrics: None,
        kube_errors: None,
        input: None,
        watch_config: None,
        data_plane: None,
        cluster_cidr_warned: Vec::new(),
        localhost_failure: None,
        foreign_chains: None,
        earlier_rules: false,
        local_sockets: kpng_model::trace::LocalSockets {
            cgroup_subtree: None,
            host_netns_only: false,
            own_netns_not_host: None,
        },
        while_loading: crate::memory::WhileLoading::Hold,
    };
}

/// A `to-local` backend, checked against the mode the configuration asks for, and what
/// `serve` must know about it.
fn local_backend(
    flags: &GlobalFlags,
    backend: &LocalBackend,
) -> anyhow::Result<(Box<dyn Backend>, SinkFacts)> {
    let kind = BackendKind::of(backend);
    // A file whose mode is empty (kubeadm's) asks for nothing: the command line chooses.
    let asked = flags
        .proxy_mode_origin
        .as_ref()
        .filter(|origin| *origin == "--proxy-mode" || flags.proxy_mode.is_some());
    if let Some(origin) = asked {
        let wanted = chosen_backend(flags, Platform::HOST);
        if wanted != kind {
            let what = format!(
                "{origin} asks for mode {:?} (`to-local {}`), but the command line runs \
                 `to-local {}`",
                wanted.mode(),
                wanted.word(),
                kind.word()
            );
            if origin == "--proxy-mode" {
                bail!("{what}: drop one of them");
            }
            tracing::warn!("{what}: the command line wins");
        }
    }
    let dry_run = BackendKind::dry_run(backend);
    let simulated = BackendKind::simulated(backend);
    // One kpng per network namespace, whatever the backend (before anything touches the node).
    let lock = if dry_run || simulated {
        None
    } else {
        Some(crate::instance_lock::acquire(
            kind.word(),
            &BackendKind::ALL.map(BackendKind::word),
        )?)
    };
    // The run marker: only the process holding the lock reads and writes it, so the one it
    // finds is never a running kpng's.
    #[cfg(target_os = "linux")]
    let run_marker = lock.as_ref().map(|_| {
        crate::run_marker::RunMarker::start(
            std::path::Path::new(kpng_backend_iptables::route_localnet::STATE_DIR),
            kind.word(),
            std::process::id(),
        )
    });
    // Legacy iptables rules this process cannot read (no CAP_NET_RAW): kube-proxy's there
    // would stay and translate beside kpng's, and the iptables backend's automatic mode would
    // not see them. Said once, at start.
    #[cfg(target_os = "linux")]
    if lock.is_some()
        && kind.takes_over_node_proxying()
        && let Some(why) = crate::caps::legacy_unreadable()
    {
        tracing::warn!("{why}");
    }
    // On its own thread: it reads every process's and thread's namespace, which on a busy
    // node is not worth delaying the first programming for.
    #[cfg(target_os = "linux")]
    if lock.is_some() {
        std::thread::spawn(|| {
            let dir = std::path::Path::new(kpng_backend_iptables::route_localnet::STATE_DIR);
            for record in crate::netns_records::forget_gone(dir, false) {
                tracing::info!(
                    "removed {}, a record of a network namespace that no longer exists",
                    record.display()
                );
            }
        });
    }
    // kube-proxy.exe programming HNS beside kpng: refused as another proxy is (a dry run
    // that reads the system's HCN warns). Not for the simulator, which is not this node's HNS.
    #[cfg(windows)]
    if let LocalBackend::Hns(args) = backend
        && args.hcn_simulator.is_none()
        && args.hcn == crate::cli::HcnMode::System
    {
        crate::kube_proxy_process::check(dry_run)?;
    }
    let (refusals, refused) = crate::dry_run::Refusals::channel();
    let built = BackendKind::build(flags, backend, &refusals)?;
    let facts = SinkFacts {
        health_checks: (!simulated).then(|| kind.health_check_addresses(flags)),
        cleans_conntrack: BackendKind::cleans_conntrack(backend),
        // Linux proxies' leftovers are not the Windows backend's to sweep.
        // Only a backend that takes the node's proxying over sweeps the others' rules.
        sweeps: (!dry_run && kind.takes_over_node_proxying()).then_some(built.own),
        dry_run: dry_run.then_some(refused),
        lock,
        #[cfg(target_os = "linux")]
        run_marker,
        source_metrics: None,
        kind: Some(kind),
        events: None,
        client_metrics: None,
        kube_errors: None,
        input: None,
        watch_config: None,
        data_plane: built.data_plane,
        cluster_cidr_warned: built.cluster_cidr_warned,
        localhost_failure: built.localhost_failure,
        foreign_chains: built.foreign_chains,
        earlier_rules: built.earlier_rules,
        local_sockets: local_sockets(backend),
        while_loading: crate::memory::WhileLoading::Hold,
    };
    Ok((built.backend, facts))
}

/// Which local sockets `backend` translates, for `kpng trace` (only the eBPF backend's
/// settings narrow them).
fn local_sockets(backend: &LocalBackend) -> kpng_model::trace::LocalSockets {
    match backend {
        #[cfg(target_os = "linux")]
        LocalBackend::Ebpf(args) => crate::ebpf_status::local_sockets(
            args.cgroup_path.as_deref(),
            args.socket_lb_host_netns_only,
        ),
        _ => kpng_model::trace::LocalSockets::default(),
    }
}

/// The backend of an in-process sink (not `to-api`) and what `serve` must know about it.
fn sink_backend(flags: &GlobalFlags, sink: &Sink) -> anyhow::Result<(Box<dyn Backend>, SinkFacts)> {
    Ok(match sink {
        Sink::ToFile(t) => (
            Box::new(FileSink::new(Output::parse(&t.output))),
            SinkFacts::NONE,
        ),
        Sink::ToLocal(local) => local_backend(flags, &local.backend)?,
        Sink::ToApi(_) => bail!("to-api is served by the brain, not a node backend"),
    })
}

/// The backend of a brain client's sink and what `serve` must know about it.
fn node_sink(
    flags: &GlobalFlags,
    sink: &NodeSink,
) -> anyhow::Result<(Box<dyn Backend>, SinkFacts)> {
    Ok(match sink {
        NodeSink::ToFile(t) => (
            Box::new(FileSink::new(Output::parse(&t.output))),
            SinkFacts::NONE,
        ),
        NodeSink::ToLocal(local) => local_backend(flags, &local.backend)?,
    })
}

fn node_name(flags: &GlobalFlags) -> anyhow::Result<String> {
    match flags.node_name.clone() {
        Some(n) => Ok(n),
        None => hostname(),
    }
}

fn model_config(flags: &GlobalFlags, input: InputKind) -> anyhow::Result<ModelConfig> {
    Ok(ModelConfig {
        node_name: node_name(flags)?,
        service_proxy_name: flags.service_proxy_name.clone(),
        node_ips: flags.node_ip.clone(),
        node_port_range: flags.node_port_range(input),
        service_cidrs: flags.service_cidr.clone(),
    })
}

/// A brain's node-local model into one backend: the same runner as in-process, fed by the
/// Watch stream instead of Kubernetes objects.
async fn serve_remote(
    flags: GlobalFlags,
    brain: &BrainFlags,
    backend: Box<dyn Backend>,
    facts: SinkFacts,
) -> anyhow::Result<()> {
    let node_name = node_name(&flags)?;
    for ignored in brain_only_settings(&flags) {
        tracing::warn!("{ignored}");
    }
    if let Some(key) = &brain.api_tls_key
        && let Some(w) = kpng_api::exposure::of_key_file("--api-tls-key", key)
    {
        tracing::warn!("{w}");
    }
    let model = kpng_api::client::RemoteModel::new(&node_name, flags.node_ip.clone());
    let config = kpng_api::client::WatchConfig {
        tls: kpng_api::addr::TlsFiles {
            cert: brain.api_tls_cert.clone(),
            key: brain.api_tls_key.clone(),
            ca: brain.api_tls_ca.clone(),
        },
        tls_server_name: brain.api_tls_server_name.clone(),
        retry_max: brain.api_retry_max,
        no_state_grace: brain.api_state_grace,
        earlier_rules: facts.earlier_rules,
        accept_empty_state: brain.api_accept_empty_state,
        version: crate::version::BuildInfo::current().api_version(),
        ..kpng_api::client::WatchConfig::new(brain.api.clone(), &node_name)
    };
    let facts = SinkFacts {
        input: Some(config.health.clone()),
        watch_config: Some(config.clone()),
        ..facts
    };
    serve(flags, model, backend, facts, |tx| async move {
        kpng_api::client::watch(config, tx).await;
        Ok(())
    })
    .await
}

/// Settings a node fed by a brain has but cannot apply, one line each: the brain chooses the
/// Services and their node ports for every node, so a node's own `--service-proxy-name` or
/// `--service-node-port-range` (carried over from a kube-proxy configuration) would otherwise
/// be dropped in silence.
fn brain_only_settings(flags: &GlobalFlags) -> Vec<String> {
    let mut ignored = Vec::new();
    if let Some(name) = &flags.service_proxy_name {
        ignored.push(format!(
            "--service-proxy-name {name}: ignored on a node fed by a brain, which serves the \
             Services its own --service-proxy-name selects; give it to the brain"
        ));
    }
    if let Some(range) = flags.service_node_port_range {
        ignored.push(format!(
            "--service-node-port-range {range}: ignored on a node fed by a brain, which applies \
             its own --service-node-port-range; give it to the brain"
        ));
    }
    ignored
}

/// The OS hostname, lower-cased as kube-proxy does.
fn hostname() -> anyhow::Result<String> {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::env::var("HOSTNAME"))
        .or_else(|_| std::env::var("COMPUTERNAME"))
        .context("cannot determine the hostname; pass --node-name")?;
    let name = raw.trim().to_lowercase();
    if name.is_empty() {
        bail!("the hostname is empty; pass --node-name");
    }
    Ok(name)
}

/// Runs one source into one backend until the source ends or SIGINT/SIGTERM arrives.
/// Rules are left in place on exit.
///
/// In steps: the metrics ([`metrics_registry`]), the health server, the runner and what it
/// checks, its admin handle ([`with_admin_handle`]), the metrics server, the admin socket
/// ([`serve_admin_socket`]), Service health checks and the conntrack cleanup
/// ([`with_conntrack_cleanup`]), the sweep of other proxies' rules
/// ([`sweep_after_first_sync`]) and the node's Events, then the source task and the servers
/// ([`spawn_server`]), and the loop until kpng ends ([`run_until_end`]).
async fn serve<M, F, Fut>(
    flags: GlobalFlags,
    model: M,
    mut backend: Box<dyn Backend>,
    mut facts: SinkFacts,
    source: F,
) -> anyhow::Result<()>
where
    M: NodeModel,
    F: FnOnce(mpsc::Sender<M::Input>) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    // Held until kpng ends.
    let _lock = facts.lock.take();
    let build = crate::version::BuildInfo::current();
    info!(
        node = %model.snapshot().node.name,
        backend = backend.name(),
        version = build.version,
        commit = build.git_commit,
        "starting kpng"
    );
    // Removed when this function returns (a clean shutdown, or an error kpng reports).
    #[cfg(target_os = "linux")]
    let mut run_marker = facts.run_marker.take();
    #[cfg(target_os = "linux")]
    let previous_run = run_marker
        .as_ref()
        .and_then(|m| m.previous())
        .map(crate::run_marker::Previous::note);
    #[cfg(not(target_os = "linux"))]
    let previous_run: Option<String> = None;
    if let Some(note) = &previous_run {
        tracing::warn!("{note}");
    }
    let timing = SyncTiming {
        min_sync_period: flags.min_sync_period,
        sync_period: flags.sync_period,
        full_sync_period: flags.full_sync_period,
    };
    // (unclean, unhealthy): whether the previous run was killed, or shut down while its
    // syncs failed; `None` where there is no run marker.
    #[cfg(target_os = "linux")]
    let previous_exit = run_marker.as_ref().map(|m| {
        m.previous()
            .map_or((false, false), |p| (p.unclean(), !p.unclean()))
    });
    #[cfg(not(target_os = "linux"))]
    let previous_exit = None;
    let mut registry = metrics_registry(&*backend, &facts, previous_exit);
    let dry_run = facts.dry_run.is_some();
    // The --config file read again while kpng runs (`config::watch`).
    let on_valid = on_config_change(facts.kind.is_some(), dry_run);
    let config_watch = flags
        .config_recheck
        .clone()
        .map(|recheck| crate::config::watch::Watch::new(recheck, on_valid));
    if let Some(watch) = &config_watch {
        watch.register_metrics(&mut registry);
    }
    let metrics = ProxyMetrics::new(&mut registry);
    let refused_connections = metrics.http_connections_refused.clone();
    let health = Arc::new(ProxyHealth::new(
        &backend.families(),
        timing.sync_period * 2,
    ));
    let proxy_mode = backend.name();

    // A dry run opens no listener: it must not change the host, nor take the ports of a
    // proxy running on it. An empty --healthz-bind-address opens none either.
    let health_server = match flags.healthz_bind_address {
        Some(addr) if !dry_run => {
            let started = crate::http::health_server(
                crate::listen::BindTo {
                    addr,
                    hard_fail: flags.bind_address_hard_fail,
                },
                health.clone(),
                metrics.clone(),
            )
            .await;
            let events = facts.events.as_ref();
            match started {
                Ok((server, failure)) => {
                    if let (Some(events), Some(failure)) = (events, failure) {
                        tokio::spawn(report_health_server_failure(events.clone(), failure));
                    }
                    Some(server)
                }
                Err(e) => {
                    if let Some(events) = events {
                        // Before kpng ends: bounded, an API server that does not answer must
                        // not hold up the exit.
                        let _ = tokio::time::timeout(
                            EXIT_EVENT_PATIENCE,
                            report_health_server_failure(events.clone(), format!("{e:#}")),
                        )
                        .await;
                    }
                    return Err(e);
                }
            }
        }
        _ => None,
    };
    // The metrics server answers the same probes (`crate::http`).
    let metrics_probes = crate::http::MetricsProbes::Node {
        health: health.clone(),
        metrics: Box::new(metrics.clone()),
    };
    let exit_drain = backend.exit_drain();
    let backend = Box::new(crate::memory::ReleaseBeforeFirstSync::hold(
        backend,
        facts.while_loading,
    ));
    let mut runner = Runner::new(model, backend, timing, metrics, health.clone())
        .with_free_repairs(flags.repairs_at_once);
    // A clean shutdown while the syncs fail (the kubelet's SIGTERM after `/livez` failed)
    // leaves the marker saying so, for the next start.
    #[cfg(target_os = "linux")]
    if let Some(marker) = &mut run_marker {
        marker.follow(runner.subscribe(), health);
    }
    #[cfg(not(target_os = "linux"))]
    drop(health);
    // Whether an earlier run's rules still route traffic until the first sync (asked once,
    // when the backend was built: `crate::earlier_rules`).
    runner = runner.with_earlier_rules(facts.earlier_rules);
    // A sink that programs nothing (`to-file`): `kpng trace` says its verdict is the model's.
    if facts.kind.is_none() {
        runner = runner.programming_nothing(format!(
            "backend {proxy_mode} programs nothing: this is the model's verdict, not what a \
             kernel does with the packet"
        ));
    }
    if let Some(input) = facts.input.clone() {
        runner = runner.with_input_health(input);
    }
    if facts.health_checks == Some(HealthCheckAddresses::NodeIps) {
        // NodePorts on the primary node IPs: with none known, on every local address after
        // kube-proxy's start-up wait.
        runner = runner.with_node_ips_wait(flags.node_ips_wait);
    }
    // A Node whose pods are outside --cluster-cidr, or (NodePorts on the node IPs) none of
    // whose addresses is on this host: warned about and shown in `kpng status`.
    runner = runner.checking_node_config(
        flags.cluster_cidr.clone(),
        facts.health_checks == Some(HealthCheckAddresses::NodeIps),
    );
    // NodePorts inside CIDRs: a family whose CIDRs match no address of the host serves them
    // nowhere (warned and shown in `kpng status`), and address changes outside them are quiet.
    if let Some(HealthCheckAddresses::Cidrs(cidrs)) = &facts.health_checks {
        runner = runner.checking_node_port_cidrs(cidrs.clone());
    }
    // IP forwarding and bridge netfilter, which Services need and kpng does not set (as
    // kube-proxy does not): warned once and shown in `kpng status` (kpng_runner::host_check).
    #[cfg(target_os = "linux")]
    if !dry_run
        && let Some(needs) = facts.kind.map(crate::host_facts::needs)
        && needs != kpng_runner::host_check::HostNeeds::default()
    {
        let pod_bridge = match crate::pod_interfaces::Setting::of(&flags) {
            Some(crate::pod_interfaces::Setting::Bridge(name)) => Some(name),
            _ => None,
        };
        runner = runner.checking_host(crate::host_facts::probe(pod_bridge), needs);
    }
    if !flags.masquerade_all
        && matches!(
            crate::backends::detect_local(&flags),
            Ok(kpng_backend::settings::DetectLocal::ClusterCidr(_))
        )
    {
        runner = runner.detecting_pods_by_cluster_cidr(facts.cluster_cidr_warned.clone());
    }
    if facts.health_checks.is_some()
        && matches!(
            crate::backends::detect_local(&flags),
            Ok(kpng_backend::settings::DetectLocal::NodeCidr)
        )
    {
        // The node is programmed with the Node's pod CIDRs: not before it has some.
        runner = runner.requiring_pod_cidrs();
    }
    // Answers about the running proxy (`kpng status`, `kpng trace`, the status page); none in
    // a dry run, which opens nothing.
    let mut admin = None;
    if !dry_run {
        let (with_admin, handle) = with_admin_handle(
            runner,
            &flags,
            &facts,
            previous_run.clone(),
            config_watch
                .as_ref()
                .map(crate::config::watch::Watch::probe),
        );
        runner = with_admin;
        admin = Some(handle);
    }
    let metrics_server = if dry_run || flags.metrics_bind_address.trim().is_empty() {
        None
    } else {
        let addr: SocketAddr = flags.metrics_bind_address.parse().with_context(|| {
            format!(
                "--metrics-bind-address {:?} is not HOST:PORT",
                flags.metrics_bind_address
            )
        })?;
        let z = crate::zpages::ZPages::new(&flags, proxy_mode);
        Some(
            crate::http::metrics_server(
                crate::listen::BindTo {
                    addr,
                    hard_fail: flags.bind_address_hard_fail,
                },
                Arc::new(registry),
                proxy_mode,
                z,
                admin.clone(),
                metrics_probes,
                refused_connections,
            )
            .await?,
        )
    };

    // The admin socket: `kpng status` and `kpng trace`.
    let mut _admin_socket: Option<crate::admin_socket::SocketFile> = None;
    if let Some(handle) = admin.clone()
        && !flags.admin_socket.is_empty()
    {
        _admin_socket = serve_admin_socket(&flags.admin_socket, handle).await;
    }
    if let Some(addresses) = facts.health_checks {
        // The node's conntrack table, as kube-proxy sets it (Linux's sysctls); a dry run
        // prints what it would write.
        #[cfg(target_os = "linux")]
        if facts
            .kind
            .is_some_and(BackendKind::takes_over_node_proxying)
        {
            let settings = crate::conntrack::ConntrackSettings::from_flags(&flags);
            let proc_sys = std::path::Path::new("/proc/sys");
            if dry_run {
                print_pending_sysctls(&settings, proc_sys);
            } else {
                settings.apply(proc_sys, crate::conntrack::cpus());
            }
        }
        if !dry_run {
            runner = runner.with_service_health(addresses);
        }
    }
    #[cfg(target_os = "linux")]
    if facts.cleans_conntrack {
        runner = with_conntrack_cleanup(runner, facts.kind, dry_run);
    }
    if let Some(own) = facts.sweeps.take() {
        tokio::spawn(sweep_after_first_sync(own, runner.subscribe()));
    }
    if let Some(events) = facts.events.clone().filter(|_| !dry_run) {
        if let Some(failures) = runner.health_check_failures() {
            tokio::spawn(report_health_check_failures(events.clone(), failures));
        }
        tokio::spawn(report_events(events, proxy_mode, runner.subscribe()));
    }
    let (tx, rx) = mpsc::channel(1024);
    let source_task = tokio::spawn(source(tx));
    if let Some(server) = health_server {
        spawn_server("health server", server);
    }
    if let Some(server) = metrics_server {
        spawn_server("metrics server", server);
    }

    let ending = left_behind(facts.kind.is_some(), dry_run);
    let ends = Ends {
        refusals: facts.dry_run,
        exit_drain,
        ending,
        config_watch,
    };
    run_until_end(runner, rx, source_task, ends).await
}

/// What, besides the source, ends [`run_until_end`], and what it says then.
struct Ends {
    /// A dry run's refusals.
    refusals: Option<tokio::sync::watch::Receiver<Option<String>>>,
    /// What the backend carries itself, drained before the process exits.
    exit_drain: Option<kpng_backend::ExitDrain>,
    /// What a shutdown leaves behind ([`left_behind`]).
    ending: &'static str,
    /// A new valid content of the `--config` file (`config::watch`).
    config_watch: Option<crate::config::watch::Watch>,
}

/// Serves `kpng status` and `kpng trace` on the admin socket at `path`, in a task of its own;
/// returns the socket file, removed when dropped (when kpng ends). Without it (the socket
/// could not be made) kpng runs on and says `kpng status` will not reach it.
async fn serve_admin_socket(
    path: &str,
    handle: kpng_runner::admin::AdminHandle,
) -> Option<crate::admin_socket::SocketFile> {
    match crate::admin::serve(std::path::Path::new(path), handle).await {
        Ok(Some(server)) => {
            let file = crate::admin_socket::SocketFile(path.into());
            spawn_server("admin socket", server);
            Some(file)
        }
        Ok(None) => None,
        Err(e) => {
            tracing::warn!("no admin socket (`kpng status` will not reach this kpng): {e:#}");
            None
        }
    }
}

/// Once this backend's rules are in place (the first successful sync), every other proxy's
/// rules go (other kpng backends', kube-proxy's of any mode): traffic keeps flowing through
/// whichever set matches first meanwhile, and established connections keep their conntrack
/// state.
async fn sweep_after_first_sync(
    own: Vec<crate::leftovers::Leftover>,
    mut reports: tokio::sync::watch::Receiver<Option<kpng_runner::runner::SyncReport>>,
) {
    while reports.changed().await.is_ok() {
        let ok = reports.borrow_and_update().as_ref().is_some_and(|r| r.ok);
        if ok {
            let own = own.clone();
            let _ = tokio::task::spawn_blocking(move || {
                crate::leftovers::sweep(&own, &crate::leftovers::EbpfPlaces::from_env())
            })
            .await;
            return;
        }
    }
}

/// Serves a listener's connections in a task of its own; its failure is logged and kpng goes
/// on without it (the data plane matters more than its probes).
fn spawn_server(
    what: &'static str,
    server: impl Future<Output = std::io::Result<()>> + Send + 'static,
) {
    tokio::spawn(async move {
        if let Err(e) = server.await {
            tracing::error!("{what} stopped: {e}");
        }
    });
}

/// What the shutdown line says kpng leaves behind: only a run that programs the node leaves
/// rules (a dry run and `to-file` said "leaving rules in place" too until 2026-12-07, which
/// sent readers looking for rules that were never there).
fn left_behind(programs_node: bool, dry_run: bool) -> &'static str {
    match (programs_node, dry_run) {
        (_, true) => "a dry run: nothing was applied",
        (true, false) => "leaving rules in place",
        (false, false) => "this sink programs no rules",
    }
}

/// What a new valid `--config` file does to a run (`config::watch`): a dry run says so and
/// goes on (it previews one start, and nobody restarts it); a proxy ends so that its restart
/// applies it, leaving its rules, and so does a sink that programs nothing (`to-file`: its
/// output would describe a configuration the file no longer holds).
fn on_config_change(programs_node: bool, dry_run: bool) -> crate::config::watch::OnValid {
    use crate::config::watch::OnValid;
    match (programs_node, dry_run) {
        (_, true) => OnValid::Say,
        (true, false) => OnValid::End {
            meanwhile: "the rules stay in place until then",
        },
        (false, false) => OnValid::End {
            meanwhile: "this sink programs no rules",
        },
    }
}

/// Runs the sync loop until kpng ends: the source's end (its error, if any, is kpng's),
/// SIGINT or SIGTERM (the rules stay in place, and what the backend carries itself drains
/// first; the line says `ending`, [`left_behind`]), or in a dry run the first change it
/// refuses (an error), or a new valid `--config` file (an error, as kube-proxy's, so that the
/// restart applies it; the rules stay; not in a dry run: [`on_config_change`]).
async fn run_until_end<M: NodeModel>(
    runner: Runner<M>,
    rx: mpsc::Receiver<M::Input>,
    source_task: tokio::task::JoinHandle<anyhow::Result<()>>,
    ends: Ends,
) -> anyhow::Result<()> {
    let Ends {
        refusals,
        exit_drain,
        ending,
        config_watch,
    } = ends;
    let shutdown = crate::signals::shutdown()?;
    let config_changed = async move {
        match config_watch {
            Some(watch) => watch.changed().await,
            None => std::future::pending().await,
        }
    };
    let refused = async move {
        match refusals {
            Some(rx) => crate::dry_run::refused(rx).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        why = refused => Err(anyhow::anyhow!("--dry-run: {why}")),
        why = config_changed => Err(anyhow::anyhow!(why)),
        _ = runner.run(rx) => {
            // The runner only ends when the source does.
            match source_task.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(anyhow::anyhow!("source task failed: {e}")),
            }
        }
        why = shutdown => {
            info!("{why}; {ending}");
            // The runner, and the backend with it, are gone; what the backend carried itself
            // finishes (bounded by the backend's grace) before the process exits.
            if let Some(drain) = exit_drain {
                drain.await;
            }
            Ok(())
        }
    }
}

/// The metrics `/metrics` serves beside the runner's: the process's, whether the previous run
/// ended uncleanly (`Some` where kpng keeps a run marker), the backend's and those of the
/// source, input and brain client this sink has. Registered in this order, which is the
/// order `/metrics` lists them in.
fn metrics_registry(
    backend: &dyn Backend,
    facts: &SinkFacts,
    previous_exit: Option<(bool, bool)>,
) -> Registry {
    let mut registry = Registry::default();
    crate::process_metrics::register(&mut registry);
    // The conntrack table's fill, where `kpng status` shows it (a backend programming the node).
    #[cfg(target_os = "linux")]
    if facts.cleans_conntrack {
        crate::conntrack_metrics::register(&mut registry);
    }
    // Only Linux keeps a run marker: elsewhere this is always `None`.
    #[cfg(target_os = "linux")]
    if let Some((unclean, unhealthy)) = previous_exit {
        crate::process_metrics::register_previous_exit(&mut registry, unclean, unhealthy);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = previous_exit;
    backend.register_metrics(&mut registry);
    if let Some(source_metrics) = &facts.source_metrics {
        source_metrics.register(&mut registry);
    }
    if let Some(input) = &facts.input {
        crate::input_metrics::register(&mut registry, input.clone());
    }
    if let Some(client_metrics) = &facts.client_metrics {
        client_metrics.register(&mut registry);
    }
    if let Some(kube_errors) = &facts.kube_errors {
        kube_errors.register(&mut registry);
    }
    if let Some(config) = &facts.watch_config {
        config.register_metrics(&mut registry);
    }
    registry
}

/// The runner with its admin handle: what `kpng status`, `kpng trace` and the status page
/// ask. The handle knows the node's facts the model lacks (NodePort addresses, local-traffic
/// detection, the backend), the previous run's unclean end, and the probes of the data
/// plane (foreign chains, pod interface settings) this sink has. Not for a dry run, which
/// opens nothing.
fn with_admin_handle<M: NodeModel>(
    runner: Runner<M>,
    flags: &GlobalFlags,
    facts: &SinkFacts,
    previous_run: Option<String>,
    config_probe: Option<kpng_runner::admin::DataPlaneProbe>,
) -> (Runner<M>, kpng_runner::admin::AdminHandle) {
    let nodeport = facts
        .kind
        .and_then(|k| k.nodeport_addresses(flags).ok())
        .unwrap_or(kpng_backend::settings::NodePortAddresses::Primary);
    let detect =
        crate::backends::detect_local(flags).unwrap_or(kpng_backend::settings::DetectLocal::None);
    let masquerade_all = flags.masquerade_all;
    let kind = facts.kind;
    let localhost_node_ports = flags.iptables_localhost_nodeports;
    let service_cidrs = flags.service_cidr.clone();
    let local_sockets = facts.local_sockets.clone();
    let localhost_failure = facts.localhost_failure.clone();
    let (runner, handle) = runner.with_admin(Box::new(move |snapshot| {
        // iptables mode also serves IPv4 node ports on 127.0.0.1 (route_localnet), unless
        // the sysctl could not be set.
        let localhost = if kind == Some(BackendKind::Iptables) && localhost_node_ports {
            match localhost_failure.as_ref().and_then(|f| f()) {
                Some(why) => crate::admin::LocalhostV4::Failed(why),
                None => crate::admin::LocalhostV4::Served,
            }
        } else {
            crate::admin::LocalhostV4::Off
        };
        let mut node = crate::admin::node_facts(
            snapshot,
            &nodeport,
            &detect,
            masquerade_all,
            kind,
            &service_cidrs,
            &localhost,
        );
        node.local_sockets = local_sockets.clone();
        node
    }));
    let handle = match previous_run {
        Some(note) => handle.with_previous_run(note),
        None => handle,
    };
    let handle = match facts.foreign_chains.clone() {
        Some(probe) => handle.with_foreign_chains_probe(probe),
        None => handle,
    };
    // Interface settings of the pod detector that cannot work here: warned now and when
    // the links change, and a line of `kpng status` (a Linux backend's).
    #[cfg(target_os = "linux")]
    let data_plane = match crate::pod_interfaces::Check::new(flags)
        .filter(|_| facts.kind.is_some_and(|k| k != BackendKind::Hns))
    {
        Some(check) => {
            check.start();
            let interfaces = check.probe();
            Some(match facts.data_plane.clone() {
                Some(probe) => Arc::new(move || {
                    let mut lines = probe();
                    lines.extend(interfaces());
                    lines
                }) as kpng_runner::admin::DataPlaneProbe,
                None => interfaces,
            })
        }
        None => facts.data_plane.clone(),
    };
    #[cfg(not(target_os = "linux"))]
    let data_plane = facts.data_plane.clone();
    // The --config file's line (a PROBLEM while a new content of it is refused).
    let data_plane = match (data_plane, config_probe) {
        (Some(probe), Some(config)) => Some(Arc::new(move || {
            let mut lines = probe();
            lines.extend(config());
            lines
        }) as kpng_runner::admin::DataPlaneProbe),
        (probe, config) => probe.or(config),
    };
    let handle = match data_plane {
        Some(probe) => handle.with_data_plane_probe(probe),
        None => handle,
    };
    (runner, handle)
}

/// The runner with the UDP conntrack cleanup, when the kernel's conntrack can be opened
/// (else a warning: the cleanup is off). Its memory of what it checked, kept across restarts
/// of this boot, and what kube-proxy's rules had checked are read while the cluster loads,
/// so that a restart that keeps the rules in place need not walk the table again.
#[cfg(target_os = "linux")]
fn with_conntrack_cleanup<M: NodeModel>(
    runner: Runner<M>,
    kind: Option<BackendKind>,
    dry_run: bool,
) -> Runner<M> {
    match kpng_conntrack::Reconciler::open() {
        Ok(reconciler) => {
            let mut runner = runner.with_conntrack_cleanup(reconciler);
            // What the cleanup checked, kept across restarts of this boot: a restart that
            // keeps the rules in place need not walk the table once per UDP frontend.
            use kpng_conntrack::memory;
            let mut kpng_ran_here = true;
            if let (Some(path), Some(boot)) = (memory::default_path(), memory::boot_id()) {
                let mut file = memory::MemoryFile::new(path, boot);
                let loaded = file.load();
                kpng_ran_here = !matches!(loaded, Ok(None));
                // The memory is trusted only for the frontends still in kpng's table
                // (another kpng build may have adopted it meanwhile): read before the
                // first commit, while the cluster loads. iptables says which frontends
                // it found itself.
                let nft_table = matches!(kind, Some(BackendKind::Nft | BackendKind::Ebpf));
                if nft_table && matches!(loaded, Ok(Some(_))) && !dry_run {
                    let table = kpng_backend_nft::NftConfig::default().table;
                    let reading = std::thread::spawn(move || crate::own_rules::read_nft(&table));
                    runner = runner.with_conntrack_rules_in_place(
                        kpng_runner::conntrack_cleanup::StartRead::new(move || {
                            reading.join().unwrap_or_default()
                        }),
                    );
                }
                runner = runner.with_conntrack_memory(file, loaded);
            }
            // What kube-proxy's rules, if it ran here, had checked for us: read while the
            // cluster loads, waited for before the first commit (so that kpng's own rules
            // are never read as kube-proxy's), used after the first sync.
            if !dry_run {
                let reading =
                    std::thread::spawn(move || crate::kube_proxy_checks::read(kpng_ran_here));
                runner = runner.with_conntrack_inherited(
                    kpng_runner::conntrack_cleanup::StartRead::new(move || {
                        let checked = reading.join().unwrap_or_default();
                        crate::kube_proxy_checks::log(&checked);
                        checked
                    }),
                );
            }
            runner
        }
        Err(e) => {
            tracing::warn!("UDP conntrack cleanup is off: {e}");
            runner
        }
    }
}

/// kube-proxy's `FailedToStartServiceHealthcheck` Event on the Service, once per new failure
/// (the runner reports a failure again only when its reason changes).
async fn report_health_check_failures(
    events: kpng_source_kube::NodeEvents,
    mut failures: tokio::sync::mpsc::UnboundedReceiver<kpng_runner::service_health::NotServed>,
) {
    let mut refused = RefusedPosts::default();
    while let Some(f) = failures.recv().await {
        let (namespace, name) = (&*f.service.namespace, &*f.service.name);
        if let Err(e) = events
            .health_check_failed(namespace, name, f.port, &f.error)
            .await
        {
            refused.log("FailedToStartServiceHealthcheck", e);
        }
    }
}

/// Logs an Event the API server refused: a warning the first time (saying which RBAC rule is
/// missing when that is why), debug lines after, so that an operator learns it once and the
/// log is not filled with it.
#[derive(Default)]
struct RefusedPosts {
    warned: bool,
}

impl RefusedPosts {
    fn log(&mut self, what: &str, e: kpng_source_kube::EventError) {
        if std::mem::replace(&mut self.warned, true) {
            tracing::debug!("cannot post the {what} Event: {e}");
        } else if e.is_forbidden() {
            tracing::warn!(
                "cannot post the {what} Event (RBAC: events.k8s.io events create, patch): {e}"
            );
        } else {
            tracing::warn!("cannot post the {what} Event: {e}");
        }
    }
}

/// How long an exit for a health server that cannot bind waits for its Event to be posted.
const EXIT_EVENT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(3);

/// kube-proxy's `FailedToStartProxierHealthcheck` Node Event, for a health server that could
/// not bind (`failure` says where and why): best effort, as every Event.
async fn report_health_server_failure(events: kpng_source_kube::NodeEvents, failure: String) {
    if let Err(e) = events.proxier_health_check_failed(&failure).await {
        RefusedPosts::default().log("FailedToStartProxierHealthcheck", e);
    }
}

/// Consecutive failed syncs after which a Warning Event is posted (once per failing streak).
const FAILURES_BEFORE_EVENT: u32 = 3;

/// kube-proxy's Node Events: `Starting` now, and a warning when syncs keep failing.
async fn report_events(
    events: kpng_source_kube::NodeEvents,
    backend: &'static str,
    mut reports: tokio::sync::watch::Receiver<Option<kpng_runner::runner::SyncReport>>,
) {
    let mut refused = RefusedPosts::default();
    if let Err(e) = events.starting(backend).await {
        refused.log("Starting", e);
    }
    let mut failures = 0u32;
    while reports.changed().await.is_ok() {
        let Some(report) = reports.borrow_and_update().clone() else {
            continue;
        };
        if report.ok {
            failures = 0;
            continue;
        }
        failures += 1;
        if failures == FAILURES_BEFORE_EVENT {
            let error = report.error.as_deref().unwrap_or("unknown");
            if let Err(e) = events.sync_failing(failures, error).await {
                refused.log("SyncProxyRulesFailed", e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::chosen_backend;
    use crate::backends::{BackendKind, Platform};
    use crate::cli::Cli;

    #[test]
    fn the_shutdown_line_leaves_rules_only_where_there_are_some() {
        // (programs the node, dry run, what the line says)
        for (programs, dry, said) in [
            (true, false, "leaving rules in place"),
            (true, true, "a dry run: nothing was applied"),
            (false, false, "this sink programs no rules"),
        ] {
            assert_eq!(super::left_behind(programs, dry), said, "{programs} {dry}");
        }
    }

    #[test]
    fn a_new_config_file_ends_a_proxy_and_to_file_but_not_a_dry_run() {
        use crate::config::watch::OnValid;
        // (programs the node, dry run, what a valid new --config content does)
        for (programs, dry, does) in [
            (
                true,
                false,
                OnValid::End {
                    meanwhile: "the rules stay in place until then",
                },
            ),
            (
                false,
                false,
                OnValid::End {
                    meanwhile: "this sink programs no rules",
                },
            ),
            (true, true, OnValid::Say),
            (false, true, OnValid::Say),
        ] {
            assert_eq!(
                super::on_config_change(programs, dry),
                does,
                "{programs} {dry}"
            );
        }
    }

    #[test]
    fn a_node_fed_by_a_brain_names_the_settings_only_the_brain_applies() {
        let cli = Cli::try_parse_from(["kpng", "local", "--api", "unix:///b.sock", "nft"])
            .expect("parses");
        assert_eq!(
            super::brain_only_settings(&cli.global),
            Vec::<String>::new()
        );
        let cli = Cli::try_parse_from([
            "kpng",
            "local",
            "--api",
            "unix:///b.sock",
            "--service-proxy-name",
            "foo",
            "--service-node-port-range",
            "30000-30001",
            "nft",
        ])
        .expect("parses");
        let ignored = super::brain_only_settings(&cli.global);
        assert_eq!(ignored.len(), 2, "{ignored:?}");
        assert!(ignored[0].starts_with("--service-proxy-name foo: ignored"));
        assert!(ignored[1].starts_with("--service-node-port-range 30000-30001: ignored"));
    }

    #[test]
    fn kube_proxys_line_without_a_mode_runs_the_platforms_default() {
        // `kpng.exe --hostname-override=node1 --kubeconfig C:\k\config`: kube-proxy's Windows
        // default is kernelspace, never iptables.
        let cli = Cli::try_parse_from(["kpng", "--hostname-override=node1"]).expect("parses");
        assert_eq!(cli.global.proxy_mode, None);
        assert_eq!(
            chosen_backend(&cli.global, Platform::Windows),
            BackendKind::Hns
        );
        assert_eq!(
            chosen_backend(&cli.global, Platform::Linux),
            BackendKind::Iptables
        );
        let mut flags = cli.global;
        flags.proxy_mode = Some(BackendKind::Nft);
        assert_eq!(chosen_backend(&flags, Platform::Windows), BackendKind::Nft);
    }
}
