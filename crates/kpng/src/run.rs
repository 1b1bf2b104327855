//! Wiring: source → model → runner → sink, plus the HTTP servers.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, bail};
use kpng_backend::Backend;
use kpng_backend::SyncTiming;
use kpng_backend::health::ProxyHealth;
use kpng_backend::metrics::ProxyMetrics;
use kpng_backend::runner::{HealthCheckAddresses, Runner};
use kpng_model::{Model, ModelConfig};
use kpng_sink_file::{FileSink, Output};
use kpng_source_file::FileSource;
use kpng_source_kube::{ClientOptions, KubeSource, SourceConfig};
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tracing::info;

use kpng_backend_nft::exec::libnftables::LibNftables;
use kpng_backend_nft::exec::{Auto, DryRun, NftCommand, NftExec};
use kpng_backend_nft::netlink::NetlinkWriter;
use kpng_backend_nft::ruleset::DetectLocal;
use kpng_backend_nft::{NftBackend, NftConfig, NodePortAddresses};

use kpng_backend_userspace::entries::NodePortAddresses as UserspaceNodePorts;
use kpng_backend_userspace::proxy::ProxySettings;
use kpng_backend_userspace::{PodCidrs, UserspaceBackend, UserspaceConfig};

use crate::cli::{Cli, Command, GlobalFlags, LocalBackend, NftArgs, Sink, UserspaceArgs};

/// `--nodeport-addresses`: `None` for `primary`, else the CIDRs.
fn nodeport_cidrs(flags: &GlobalFlags) -> anyhow::Result<Option<Vec<ipnet::IpNet>>> {
    if flags.nodeport_addresses.iter().all(|a| a == "primary") {
        return Ok(None);
    }
    flags
        .nodeport_addresses
        .iter()
        .map(|a| {
            a.parse::<ipnet::IpNet>()
                .with_context(|| format!("--nodeport-addresses: {a:?} is not a CIDR or `primary`"))
        })
        .collect::<anyhow::Result<Vec<_>>>()
        .map(Some)
}

/// The backend a sink names; backends with tasks of their own run them on `runtime`.
fn sink_backend(
    sink: &Sink,
    flags: &GlobalFlags,
    runtime: &tokio::runtime::Handle,
) -> anyhow::Result<Box<dyn Backend>> {
    Ok(match sink {
        Sink::ToFile(t) => Box::new(FileSink::new(Output::parse(&t.output))),
        Sink::ToLocal(local) => match &local.backend {
            LocalBackend::Nft(args) => Box::new(nft_backend(flags, args)?),
            LocalBackend::Userspace(args) => {
                Box::new(userspace_backend(flags, args, runtime.clone())?)
            }
        },
    })
}

/// The async runtime every source runs on.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// The nftables backend configured from the flags.
fn nft_backend(flags: &GlobalFlags, args: &NftArgs) -> anyhow::Result<NftBackend> {
    let detect_local = match flags.detect_local_mode.as_str() {
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
    };
    let nodeport_addresses = match nodeport_cidrs(flags)? {
        None => NodePortAddresses::Primary,
        Some(cidrs) => NodePortAddresses::Cidrs(cidrs),
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

/// The userspace backend configured from the flags; its proxy runs on `runtime`.
fn userspace_backend(
    flags: &GlobalFlags,
    args: &UserspaceArgs,
    runtime: tokio::runtime::Handle,
) -> anyhow::Result<UserspaceBackend> {
    use kpng_backend_userspace::capture::nft::{NftCapture, PodMatch};
    let nodeport_addresses = match nodeport_cidrs(flags)? {
        None => UserspaceNodePorts::Primary,
        Some(cidrs) => UserspaceNodePorts::Cidrs(cidrs),
    };
    // Pods reach every endpoint of an externalTrafficPolicy Local Service: the capture
    // recognises them by address (the CIDRs are entries) or by interface.
    let (pod_cidrs, pods) = match flags.detect_local_mode.as_str() {
        "ClusterCIDR" => (
            PodCidrs::Static(flags.cluster_cidr.clone()),
            PodMatch::Cidrs,
        ),
        "NodeCIDR" => (PodCidrs::Node, PodMatch::Cidrs),
        "BridgeInterface" => (
            PodCidrs::None,
            PodMatch::Interface(
                flags
                    .pod_bridge_interface
                    .clone()
                    .context("--detect-local-mode BridgeInterface needs --pod-bridge-interface")?,
            ),
        ),
        "InterfaceNamePrefix" => (
            PodCidrs::None,
            PodMatch::InterfacePrefix(flags.pod_interface_name_prefix.clone().context(
                "--detect-local-mode InterfaceNamePrefix needs --pod-interface-name-prefix",
            )?),
        ),
        _ => (PodCidrs::None, PodMatch::None),
    };
    let config = UserspaceConfig {
        nodeport_addresses,
        service_cidrs: flags.service_cidr.clone(),
        pod_cidrs,
        settings: ProxySettings {
            connect_timeout: args.connect_timeout,
            udp_idle_timeout: args.udp_timeout,
        },
        ..UserspaceConfig::default()
    };
    let capture = if args.dry_run {
        NftCapture::dry_run(config.families.clone())
    } else {
        NftCapture::with_binary(config.families.clone(), &args.nft_binary)
    }
    .with_pods(pods);
    Ok(UserspaceBackend::new(config, Box::new(capture), runtime))
}

/// Runs the command line.
pub fn main(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Version => {
            println!("kpng {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::Cleanup => {
            let mut nft = NftBackend::new(NftConfig::default(), Box::new(NftCommand::default()));
            nft.cleanup().context("removing kpng's nftables tables")?;
            println!("kpng: removed the kpng nftables tables");
            let mut userspace = kpng_backend_userspace::capture::nft::NftCapture::new(
                kpng_model::Family::ALL.to_vec(),
            );
            kpng_backend_userspace::capture::Capture::cleanup(&mut userspace)
                .context("removing the userspace proxy's nftables tables")?;
            println!("kpng: removed the kpng-userspace nftables tables");
            Ok(())
        }
        Command::File(file) => {
            let runtime = runtime()?;
            let backend = sink_backend(&file.sink, &cli.global, runtime.handle())?;
            let source = FileSource::new(file.input, file.debounce);
            // Backends that program the node also get conntrack sysctls and health checks,
            // and, when they really change the data plane, UDP conntrack cleanup.
            let programs_the_node = matches!(file.sink, Sink::ToLocal(_));
            let cleans_conntrack = cleans_conntrack(&file.sink);
            runtime.block_on(serve(
                cli.global,
                backend,
                programs_the_node,
                cleans_conntrack,
                |tx| async move { source.run(tx).await.map_err(anyhow::Error::from) },
            ))
        }
        Command::Kube(kube) => {
            let runtime = runtime()?;
            let backend = sink_backend(&kube.sink, &cli.global, runtime.handle())?;
            let programs_the_node = matches!(kube.sink, Sink::ToLocal(_));
            let cleans_conntrack = cleans_conntrack(&kube.sink);
            let mut flags = cli.global;
            let node_name = match flags.node_name.clone() {
                Some(n) => n,
                None => hostname()?,
            };
            flags.node_name = Some(node_name.clone());
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
            runtime.block_on(async move {
                let (client, server) = kpng_source_kube::client(&options).await?;
                info!(%server, "reading cluster state from the API server");
                let source = KubeSource::new(client, config);
                serve(
                    flags,
                    backend,
                    programs_the_node,
                    cleans_conntrack,
                    |tx| async move {
                        source.run(tx).await;
                        Ok(())
                    },
                )
                .await
            })
        }
    }
}

/// Whether the sink changes the data plane, so that stale UDP conntrack entries must go.
fn cleans_conntrack(sink: &Sink) -> bool {
    match sink {
        Sink::ToLocal(local) => match &local.backend {
            LocalBackend::Nft(args) => !args.dry_run,
            // The proxy's UDP conntrack entries are client → listener, never pinned to an
            // endpoint: the endpoint-based cleanup does not apply (a session moves inside the
            // proxy when its endpoint leaves).
            LocalBackend::Userspace(_) => false,
        },
        Sink::ToFile(_) => false,
    }
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
async fn serve<F, Fut>(
    flags: GlobalFlags,
    backend: Box<dyn Backend>,
    programs_the_node: bool,
    cleans_conntrack: bool,
    source: F,
) -> anyhow::Result<()>
where
    F: FnOnce(mpsc::Sender<kpng_model::Event>) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let node_name = match flags.node_name.clone() {
        Some(n) => n,
        None => hostname()?,
    };
    info!(node = %node_name, backend = backend.name(), "starting kpng");
    let model = Model::new(ModelConfig {
        node_name,
        service_proxy_name: flags.service_proxy_name.clone(),
        node_ips: flags.node_ip.clone(),
    });
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
    if programs_the_node {
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
        let addresses = if flags.nodeport_addresses.iter().all(|a| a == "primary") {
            HealthCheckAddresses::NodeIps
        } else {
            HealthCheckAddresses::All
        };
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
