//! Wiring: source → model → runner → sink, plus the HTTP servers.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, bail};
use kpng_backend::{Backend, NodeModel};
use kpng_model::{Family, Model, ModelConfig};
use kpng_runner::SyncTiming;
use kpng_runner::health::ProxyHealth;
use kpng_runner::metrics::ProxyMetrics;
use kpng_runner::runner::{HealthCheckAddresses, Runner};
use kpng_sink_file::{FileSink, Output};
use kpng_source_file::FileSource;
use kpng_source_kube::{ClientOptions, KubeSource, SourceConfig};
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tracing::info;

use kpng_backend::settings::{DetectLocal, NodePortAddresses};
use kpng_backend_iptables::exec::{
    DryRun as IptablesDryRun, Iptables, IptablesCommand, Mode, detect_mode, family_usable,
};
use kpng_backend_iptables::{IptablesBackend, IptablesConfig};
use kpng_backend_nft::exec::libnftables::LibNftables;
use kpng_backend_nft::exec::{Auto, DryRun, NftCommand, NftExec};
use kpng_backend_nft::netlink::NetlinkWriter;
use kpng_backend_nft::{NftBackend, NftConfig, NodePortAddresses as NftNodePorts};
use kpng_backend_userspace::capture::Capture as _;
use kpng_backend_userspace::capture::nft::{NftCapture, PodMatch};
use kpng_backend_userspace::proxy::ProxySettings;
use kpng_backend_userspace::{UserspaceBackend, UserspaceConfig};

use crate::cli::{
    BrainFlags, Cli, Command, GlobalFlags, IptablesArgs, LocalBackend, NftArgs, NodeSink, Sink,
    UserspaceArgs,
};

/// The async runtime every source runs on.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// `--detect-local-mode` and its parameters.
fn detect_local(flags: &GlobalFlags) -> anyhow::Result<DetectLocal> {
    Ok(match flags.detect_local_mode.as_str() {
        "ClusterCIDR" => DetectLocal::ClusterCidr(flags.cluster_cidr.clone()),
        "NodeCIDR" => DetectLocal::NodeCidr,
        "BridgeInterface" => DetectLocal::BridgeInterface(
            flags
                .pod_bridge_interface
                .clone()
                .context("--detect-local-mode BridgeInterface needs --pod-bridge-interface")?,
        ),
        "InterfaceNamePrefix" => {
            DetectLocal::InterfaceNamePrefix(flags.pod_interface_name_prefix.clone().context(
                "--detect-local-mode InterfaceNamePrefix needs --pod-interface-name-prefix",
            )?)
        }
        _ => DetectLocal::None,
    })
}

/// `--nodeport-addresses` as given.
enum NodePortFlag {
    /// Not given: the backend's default.
    Unset,
    /// `primary`.
    Primary,
    /// CIDRs.
    Cidrs(Vec<ipnet::IpNet>),
}

/// Parses `--nodeport-addresses`.
fn nodeport_flag(flags: &GlobalFlags) -> anyhow::Result<NodePortFlag> {
    if flags.nodeport_addresses.is_empty() {
        return Ok(NodePortFlag::Unset);
    }
    if flags.nodeport_addresses.iter().all(|a| a == "primary") {
        return Ok(NodePortFlag::Primary);
    }
    let cidrs = flags
        .nodeport_addresses
        .iter()
        .map(|a| {
            a.parse::<ipnet::IpNet>()
                .with_context(|| format!("--nodeport-addresses: {a:?} is not a CIDR or `primary`"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(NodePortFlag::Cidrs(cidrs))
}

/// The nftables backend configured from the flags.
fn nft_backend(flags: &GlobalFlags, args: &NftArgs) -> anyhow::Result<NftBackend> {
    let detect_local = detect_local(flags)?;
    let nodeport_addresses = match nodeport_flag(flags)? {
        NodePortFlag::Unset | NodePortFlag::Primary => NftNodePorts::Primary,
        NodePortFlag::Cidrs(cidrs) => NftNodePorts::Cidrs(cidrs),
    };
    let config = NftConfig {
        masquerade_all: flags.masquerade_all,
        masquerade_bit: flags.masquerade_bit,
        detect_local,
        nodeport_addresses,
        service_cidrs: flags.service_cidr.clone(),
        ..NftConfig::default()
    };
    let exec: Box<dyn NftExec> = match (args.dry_run, args.nft_exec.as_str()) {
        (true, _) => Box::new(DryRun),
        (false, "command") => Box::new(NftCommand::with_binary(&args.nft_binary)),
        (false, "library") => {
            Box::new(LibNftables::open().context("loading libnftables (--nft-exec library)")?)
        }
        (false, _) => Box::new(Auto::new(&args.nft_binary)),
    };
    let backend = NftBackend::new(config, exec);
    if !args.dry_run {
        remove_userspace_tables();
    }
    if args.dry_run || args.nft_exec != "auto" {
        return Ok(backend);
    }
    match NetlinkWriter::open() {
        Ok(writer) => Ok(backend.with_netlink(writer)),
        Err(e) => {
            tracing::info!("netlink writer unavailable ({e}); sending elements as nft text");
            Ok(backend)
        }
    }
}

/// Whether conntrack's `tcp_be_liberal` is on: the flag (applied at start-up) or the sysctl
/// as the node has it (kube-proxy reads the sysctl).
fn tcp_be_liberal(flags: &GlobalFlags) -> bool {
    flags.conntrack_tcp_be_liberal
        || std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal")
            .is_ok_and(|v| v.trim() != "0")
}

/// The iptables backend configured from the flags.
fn iptables_backend(flags: &GlobalFlags, args: &IptablesArgs) -> anyhow::Result<IptablesBackend> {
    let nodeport_addresses = match nodeport_flag(flags)? {
        NodePortFlag::Unset => NodePortAddresses::AllLocal,
        NodePortFlag::Primary => NodePortAddresses::Primary,
        NodePortFlag::Cidrs(cidrs) => NodePortAddresses::Cidrs(cidrs),
    };
    let config = IptablesConfig {
        masquerade_all: flags.masquerade_all,
        masquerade_bit: flags.masquerade_bit,
        detect_local: detect_local(flags)?,
        nodeport_addresses,
        localhost_node_ports: args.iptables_localhost_nodeports,
        tcp_be_liberal: tcp_be_liberal(flags),
        ..IptablesConfig::default()
    };
    if args.dry_run {
        return Ok(IptablesBackend::new(config, Box::new(IptablesDryRun)));
    }
    let mode = match Mode::parse(&args.iptables_mode) {
        Some(mode) => mode,
        None => detect_mode().context("choosing the iptables variant (--iptables-mode auto)")?,
    };
    // As kube-proxy: a family whose iptables does not work (IPv6 disabled) is not programmed.
    let families: Vec<Family> = Family::ALL
        .into_iter()
        .filter(|f| {
            let usable = family_usable(mode, *f);
            if !usable {
                tracing::warn!(
                    "{f}: {} does not work here; not programming {f}",
                    mode.save_binary(*f)
                );
            }
            usable
        })
        .collect();
    if families.is_empty() {
        bail!(
            "iptables-{} works for neither IPv4 nor IPv6 on this node",
            mode.name()
        );
    }
    info!("programming iptables-{}", mode.name());
    remove_nft_tables();
    remove_userspace_tables();
    let ipt: Box<dyn Iptables> = Box::new(IptablesCommand::new(mode));
    Ok(IptablesBackend::new(
        IptablesConfig { families, ..config },
        ipt,
    ))
}

/// Removes the userspace backend's capture tables, so that a node switched from
/// `to-local userspace` does not keep redirecting Service traffic to listeners that are gone.
/// Best effort, as [`remove_nft_tables`].
fn remove_userspace_tables() {
    match NftCapture::new(Family::ALL.to_vec()).cleanup() {
        Ok(()) => tracing::debug!("no kpng-userspace tables left behind"),
        Err(e) => tracing::debug!("not removing the kpng-userspace tables: {e}"),
    }
}

/// Removes the nftables backend's tables, so that a node switched from `to-local nft` to
/// `to-local iptables` does not keep a second set of DNAT rules (kube-proxy's iptables mode
/// likewise removes its nftables mode's tables at start-up). Best effort: without `nft` there
/// is nothing to remove.
fn remove_nft_tables() {
    let mut nft = NftBackend::new(NftConfig::default(), Box::new(NftCommand::default()));
    match nft.cleanup() {
        Ok(()) => tracing::debug!("no kpng nftables tables left behind"),
        Err(e) => tracing::debug!("not removing kpng's nftables tables: {e}"),
    }
}

/// The userspace backend configured from the flags.
fn userspace_backend(
    flags: &GlobalFlags,
    args: &UserspaceArgs,
) -> anyhow::Result<UserspaceBackend> {
    let nodeport_addresses = match nodeport_flag(flags)? {
        NodePortFlag::Unset | NodePortFlag::Primary => NodePortAddresses::Primary,
        NodePortFlag::Cidrs(cidrs) => NodePortAddresses::Cidrs(cidrs),
    };
    let detect_local = detect_local(flags)?;
    // Pods reach every endpoint of an externalTrafficPolicy Local Service: the capture
    // recognises them as --detect-local-mode says.
    let pods = PodMatch::from(&detect_local);
    let config = UserspaceConfig {
        nodeport_addresses,
        service_cidrs: flags.service_cidr.clone(),
        detect_local,
        settings: ProxySettings {
            connect_timeout: args.connect_timeout,
            udp_idle_timeout: args.udp_timeout,
        },
        ..UserspaceConfig::default()
    };
    if args.dry_run {
        let capture = NftCapture::dry_run(config.families.clone()).with_pods(pods);
        return Ok(UserspaceBackend::new(config, Box::new(capture)));
    }
    // Another backend's DNAT rules would take Service traffic before the capture.
    remove_nft_tables();
    let capture =
        NftCapture::with_binary(config.families.clone(), &args.nft_binary).with_pods(pods);
    Ok(UserspaceBackend::new(config, Box::new(capture)))
}

/// Where Service health checks listen for a backend: the node IPs, unless NodePorts are served
/// on more than those.
fn health_check_addresses(flags: &GlobalFlags, backend: &LocalBackend) -> HealthCheckAddresses {
    let primary_only = flags.nodeport_addresses.iter().all(|a| a == "primary");
    match backend {
        // nftables mode: unset means `primary`.
        LocalBackend::Nft(_) | LocalBackend::Userspace(_) if primary_only => {
            HealthCheckAddresses::NodeIps
        }
        // iptables mode: unset means every local address.
        LocalBackend::Iptables(_) if primary_only && !flags.nodeport_addresses.is_empty() => {
            HealthCheckAddresses::NodeIps
        }
        _ => HealthCheckAddresses::All,
    }
}

/// `kpng cleanup`: every backend's tables and chains.
fn cleanup() -> anyhow::Result<()> {
    let mut nft = NftBackend::new(NftConfig::default(), Box::new(NftCommand::default()));
    nft.cleanup().context("removing kpng's nftables tables")?;
    println!("kpng: removed the kpng nftables tables");
    NftCapture::new(Family::ALL.to_vec())
        .cleanup()
        .context("removing the userspace proxy's nftables tables")?;
    println!("kpng: removed the kpng-userspace nftables tables");
    let mut failed = Vec::new();
    for mode in [Mode::Legacy, Mode::Nft] {
        let probe = std::process::Command::new(mode.save_binary(Family::V4))
            .arg("--version")
            .output();
        if !probe.is_ok_and(|o| o.status.success()) {
            println!(
                "kpng: iptables-{} is not installed; nothing to remove there",
                mode.name()
            );
            continue;
        }
        let mut ipt = IptablesBackend::new(
            IptablesConfig::default(),
            Box::new(IptablesCommand::new(mode)),
        );
        match ipt.cleanup() {
            Ok(()) => println!("kpng: removed kpng's iptables-{} chains", mode.name()),
            Err(e) => failed.push(format!("iptables-{}: {e}", mode.name())),
        }
    }
    if !failed.is_empty() {
        bail!("removing iptables chains: {}", failed.join("; "));
    }
    Ok(())
}

/// Runs the command line.
pub fn main(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Version => {
            println!("kpng {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::Cleanup => cleanup(),
        Command::File(file) => {
            let source = FileSource::new(file.input, file.debounce);
            let run_source = |tx| async move { source.run(tx).await.map_err(anyhow::Error::from) };
            if let Sink::ToApi(to_api) = &file.sink {
                return runtime()?.block_on(crate::brain::serve(cli.global, to_api, run_source));
            }
            let (backend, health_checks, cleans_conntrack) = sink_backend(&cli.global, &file.sink)?;
            let flags = cli.global;
            runtime()?.block_on(async move {
                let model = Model::new(model_config(&flags)?);
                serve(
                    flags,
                    model,
                    backend,
                    health_checks,
                    cleans_conntrack,
                    run_source,
                )
                .await
            })
        }
        Command::Local(local) => {
            let backend = local_backend(&cli.global, &local.backend)?;
            let cleans_conntrack = backend_cleans_conntrack(&local.backend);
            let health_checks = Some(health_check_addresses(&cli.global, &local.backend));
            runtime()?.block_on(serve_remote(
                cli.global,
                &local.brain,
                backend,
                health_checks,
                cleans_conntrack,
            ))
        }
        Command::Api(api) => {
            let (health_checks, cleans_conntrack) = match &api.sink {
                NodeSink::ToLocal(local) => (
                    Some(health_check_addresses(&cli.global, &local.backend)),
                    backend_cleans_conntrack(&local.backend),
                ),
                NodeSink::ToFile(_) => (None, false),
            };
            let backend = node_sink(&cli.global, &api.sink)?;
            runtime()?.block_on(serve_remote(
                cli.global,
                &api.brain,
                backend,
                health_checks,
                cleans_conntrack,
            ))
        }
        Command::Kube(kube) => {
            let mut flags = cli.global;
            // A brain serves every node: it watches every Node and needs no name of its own.
            let brain = matches!(kube.sink, Sink::ToApi(_));
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
                kubeconfig: cc.kubeconfig.or(kube.kubeconfig),
                master: kube.master,
                qps: cc.kube_api_qps.unwrap_or(kube.kube_api_qps),
                burst: cc.kube_api_burst.unwrap_or(kube.kube_api_burst),
            };
            let config = SourceConfig {
                node_name,
                service_proxy_name: flags.service_proxy_name.clone(),
            };
            let connect = async move {
                let (client, server) = kpng_source_kube::client(&options).await?;
                info!(%server, "reading cluster state from the API server");
                anyhow::Ok(KubeSource::new(client, config))
            };
            let run_source = |source: KubeSource| {
                move |tx| async move {
                    source.run(tx).await;
                    Ok(())
                }
            };
            if let Sink::ToApi(to_api) = &kube.sink {
                return runtime()?.block_on(async move {
                    let source = connect.await?;
                    crate::brain::serve(flags, to_api, run_source(source)).await
                });
            }
            let (backend, health_checks, cleans_conntrack) = sink_backend(&flags, &kube.sink)?;
            runtime()?.block_on(async move {
                let model = Model::new(model_config(&flags)?);
                let source = connect.await?;
                serve(
                    flags,
                    model,
                    backend,
                    health_checks,
                    cleans_conntrack,
                    run_source(source),
                )
                .await
            })
        }
    }
}

/// The backend of an in-process sink (not `to-api`), where its Service health checks listen
/// when it programs the node (it then also gets the conntrack sysctls), and whether it cleans
/// stale UDP conntrack entries (it really changes the data plane).
fn sink_backend(
    flags: &GlobalFlags,
    sink: &Sink,
) -> anyhow::Result<(Box<dyn Backend>, Option<HealthCheckAddresses>, bool)> {
    Ok(match sink {
        Sink::ToFile(t) => (
            Box::new(FileSink::new(Output::parse(&t.output))),
            None,
            false,
        ),
        Sink::ToLocal(local) => (
            local_backend(flags, &local.backend)?,
            Some(health_check_addresses(flags, &local.backend)),
            backend_cleans_conntrack(&local.backend),
        ),
        Sink::ToApi(_) => bail!("to-api is served by the brain, not a node backend"),
    })
}

/// Whether the backend changes the data plane, so that stale UDP conntrack entries must go.
fn backend_cleans_conntrack(backend: &LocalBackend) -> bool {
    match backend {
        LocalBackend::Nft(args) => !args.dry_run,
        LocalBackend::Iptables(args) => !args.dry_run,
        // The proxy's UDP conntrack entries are client → listener, never pinned to an endpoint:
        // the endpoint-based cleanup does not apply (a session moves inside the proxy when its
        // endpoint leaves).
        LocalBackend::Userspace(_) => false,
    }
}

fn local_backend(flags: &GlobalFlags, backend: &LocalBackend) -> anyhow::Result<Box<dyn Backend>> {
    Ok(match backend {
        LocalBackend::Nft(args) => Box::new(nft_backend(flags, args)?),
        LocalBackend::Iptables(args) => Box::new(iptables_backend(flags, args)?),
        LocalBackend::Userspace(args) => Box::new(userspace_backend(flags, args)?),
    })
}

fn node_sink(flags: &GlobalFlags, sink: &NodeSink) -> anyhow::Result<Box<dyn Backend>> {
    match sink {
        NodeSink::ToFile(t) => Ok(Box::new(FileSink::new(Output::parse(&t.output)))),
        NodeSink::ToLocal(local) => local_backend(flags, &local.backend),
    }
}

fn node_name(flags: &GlobalFlags) -> anyhow::Result<String> {
    match flags.node_name.clone() {
        Some(n) => Ok(n),
        None => hostname(),
    }
}

fn model_config(flags: &GlobalFlags) -> anyhow::Result<ModelConfig> {
    Ok(ModelConfig {
        node_name: node_name(flags)?,
        service_proxy_name: flags.service_proxy_name.clone(),
        node_ips: flags.node_ip.clone(),
    })
}

/// A brain's node-local model into one backend: the same runner as in-process, fed by the
/// Watch stream instead of Kubernetes objects.
async fn serve_remote(
    flags: GlobalFlags,
    brain: &BrainFlags,
    backend: Box<dyn Backend>,
    health_checks: Option<HealthCheckAddresses>,
    cleans_conntrack: bool,
) -> anyhow::Result<()> {
    let node_name = node_name(&flags)?;
    let model = kpng_api::client::RemoteModel::new(&node_name, flags.node_ip.clone());
    let config = kpng_api::client::WatchConfig {
        addr: brain.api.clone(),
        tls: kpng_api::addr::TlsFiles {
            cert: brain.api_tls_cert.clone(),
            key: brain.api_tls_key.clone(),
            ca: brain.api_tls_ca.clone(),
        },
        tls_server_name: brain.api_tls_server_name.clone(),
        node_name,
        retry_min: std::time::Duration::from_millis(100),
        retry_max: brain.api_retry_max,
    };
    serve(
        flags,
        model,
        backend,
        health_checks,
        cleans_conntrack,
        |tx| async move {
            kpng_api::client::watch(config, tx).await;
            Ok(())
        },
    )
    .await
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
/// Rules are left in place on exit. `health_checks`: for backends that program the node, where
/// Service health checks listen (they also get the conntrack sysctls).
async fn serve<M, F, Fut>(
    flags: GlobalFlags,
    model: M,
    backend: Box<dyn Backend>,
    health_checks: Option<HealthCheckAddresses>,
    cleans_conntrack: bool,
    source: F,
) -> anyhow::Result<()>
where
    M: NodeModel,
    F: FnOnce(mpsc::Sender<M::Input>) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    info!(node = %model.snapshot().node.name, backend = backend.name(), "starting kpng");
    let timing = SyncTiming {
        min_sync_period: flags.min_sync_period,
        sync_period: flags.sync_period,
        full_sync_period: flags.full_sync_period,
    };
    let mut registry = Registry::default();
    backend.register_metrics(&mut registry);
    let metrics = ProxyMetrics::new(&mut registry);
    let health = Arc::new(ProxyHealth::new(
        &backend.families(),
        timing.sync_period * 2,
    ));
    let proxy_mode = backend.name();

    let health_server =
        crate::http::health_server(flags.healthz_bind_address, health.clone(), metrics.clone())
            .await?;
    let metrics_server = if flags.metrics_bind_address.trim().is_empty() {
        None
    } else {
        let addr: SocketAddr = flags.metrics_bind_address.parse().with_context(|| {
            format!(
                "--metrics-bind-address {:?} is not HOST:PORT",
                flags.metrics_bind_address
            )
        })?;
        Some(crate::http::metrics_server(addr, Arc::new(registry), proxy_mode).await?)
    };

    let mut runner = Runner::new(model, backend, timing, metrics, health);
    if let Some(addresses) = health_checks {
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get() as u64)
            .unwrap_or(1);
        crate::conntrack::ConntrackSettings {
            max_per_core: flags.conntrack_max_per_core,
            min: flags.conntrack_min,
            tcp_established: flags.conntrack_tcp_timeout_established,
            tcp_close_wait: flags.conntrack_tcp_timeout_close_wait,
            tcp_be_liberal: flags.conntrack_tcp_be_liberal,
            udp: flags.conntrack_udp_timeout,
            udp_stream: flags.conntrack_udp_timeout_stream,
        }
        .apply(std::path::Path::new("/proc/sys"), cpus);
        runner = runner.with_service_health(addresses);
    }
    if cleans_conntrack {
        match kpng_conntrack::Reconciler::open() {
            Ok(reconciler) => runner = runner.with_conntrack_cleanup(reconciler),
            Err(e) => tracing::warn!("UDP conntrack cleanup is off: {e}"),
        }
    }
    let (tx, rx) = mpsc::channel(1024);
    let source_task = tokio::spawn(source(tx));
    tokio::spawn(async move {
        if let Err(e) = health_server.await {
            tracing::error!("health server stopped: {e}");
        }
    });
    if let Some(server) = metrics_server {
        tokio::spawn(async move {
            if let Err(e) = server.await {
                tracing::error!("metrics server stopped: {e}");
            }
        });
    }

    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = runner.run(rx) => {
            // The runner only ends when the source does.
            match source_task.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(anyhow::anyhow!("source task failed: {e}")),
            }
        }
        _ = tokio::signal::ctrl_c() => { info!("interrupted; leaving rules in place"); Ok(()) }
        _ = sigterm.recv() => { info!("terminated; leaving rules in place"); Ok(()) }
    }
}
