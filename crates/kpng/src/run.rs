//! Wiring: source → model → runner → sink, plus the HTTP servers.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, bail};
use kpng_backend::{Backend, NodeModel};
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

use crate::backends::BackendKind;
use crate::cli::{
    BrainFlags, Cli, Command, GlobalFlags, LocalBackend, NodeSink, Sink, ToFile, ToLocal,
};

/// The async runtime every source runs on.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Runs the command line.
pub fn main(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Version => {
            println!("kpng {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::Cleanup => crate::backends::cleanup(),
        Command::File(file) => {
            let source_metrics = SourceMetrics::default();
            let source =
                FileSource::new(file.input, file.debounce).with_metrics(source_metrics.clone());
            let run_source = |tx| async move { source.run(tx).await.map_err(anyhow::Error::from) };
            if let Sink::ToApi(to_api) = &file.sink {
                return runtime()?.block_on(crate::brain::serve(cli.global, to_api, run_source));
            }
            let (backend, facts) = sink_backend(&cli.global, &file.sink)?;
            let flags = cli.global;
            runtime()?.block_on(async move {
                let model = Model::new(model_config(&flags)?);
                let facts = SinkFacts {
                    source_metrics: Some(source_metrics),
                    ..facts
                };
                serve(flags, model, backend, facts, run_source).await
            })
        }
        Command::Local(local) => {
            let to_local = ToLocal {
                backend: local.backend,
            };
            let (backend, facts) = local_sink(&cli.global, &to_local)?;
            runtime()?.block_on(serve_remote(cli.global, &local.brain, backend, facts))
        }
        Command::Api(api) => {
            let (backend, facts) = node_sink(&cli.global, &api.sink)?;
            runtime()?.block_on(serve_remote(cli.global, &api.brain, backend, facts))
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
            let (backend, facts) = sink_backend(&flags, &kube.sink)?;
            runtime()?.block_on(async move {
                let model = Model::new(model_config(&flags)?);
                let source = connect.await?;
                serve(flags, model, backend, facts, run_source(source)).await
            })
        }
    }
}

/// What `serve` needs to know about a sink's backend besides the backend itself.
struct SinkFacts {
    /// For backends that program the node: where Service health checks listen (they then
    /// also get the conntrack sysctls).
    health_checks: Option<HealthCheckAddresses>,
    /// Whether stale UDP conntrack entries are cleaned after syncs (Linux).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    cleans_conntrack: bool,
    /// The node backend that starts, when it changes the node: it removes the other kinds'
    /// leftovers once its own rules are in place.
    replaces_others: Option<BackendKind>,
    /// The `file` source's metrics, registered with the rest.
    source_metrics: Option<SourceMetrics>,
}

impl SinkFacts {
    /// A sink that does not touch the node (`to-file`).
    const NONE: SinkFacts = SinkFacts {
        health_checks: None,
        cleans_conntrack: false,
        replaces_others: None,
        source_metrics: None,
    };

    fn local(flags: &GlobalFlags, backend: &LocalBackend) -> SinkFacts {
        let kind = BackendKind::of(backend);
        SinkFacts {
            health_checks: Some(kind.health_check_addresses(flags)),
            cleans_conntrack: BackendKind::cleans_conntrack(backend),
            replaces_others: BackendKind::changes_the_node(backend).then_some(kind),
            source_metrics: None,
        }
    }
}

/// `to-file`: the model as YAML; touches nothing on the node.
fn file_sink(to_file: &ToFile) -> (Box<dyn Backend>, SinkFacts) {
    (
        Box::new(FileSink::new(Output::parse(&to_file.output))),
        SinkFacts::NONE,
    )
}

/// `to-local <backend>`: the backend and what `serve` must know about it.
fn local_sink(
    flags: &GlobalFlags,
    to_local: &ToLocal,
) -> anyhow::Result<(Box<dyn Backend>, SinkFacts)> {
    Ok((
        BackendKind::build(flags, &to_local.backend)?,
        SinkFacts::local(flags, &to_local.backend),
    ))
}

/// The backend of an in-process sink (not `to-api`) and what `serve` must know about it.
fn sink_backend(flags: &GlobalFlags, sink: &Sink) -> anyhow::Result<(Box<dyn Backend>, SinkFacts)> {
    match sink {
        Sink::ToFile(t) => Ok(file_sink(t)),
        Sink::ToLocal(local) => local_sink(flags, local),
        Sink::ToApi(_) => bail!("to-api is served by the brain, not a node backend"),
    }
}

/// The backend of a brain client's sink and what `serve` must know about it.
fn node_sink(
    flags: &GlobalFlags,
    sink: &NodeSink,
) -> anyhow::Result<(Box<dyn Backend>, SinkFacts)> {
    match sink {
        NodeSink::ToFile(t) => Ok(file_sink(t)),
        NodeSink::ToLocal(local) => local_sink(flags, local),
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
    facts: SinkFacts,
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
    serve(flags, model, backend, facts, |tx| async move {
        kpng_api::client::watch(config, tx).await;
        Ok(())
    })
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
/// Rules are left in place on exit.
async fn serve<M, F, Fut>(
    flags: GlobalFlags,
    model: M,
    backend: Box<dyn Backend>,
    facts: SinkFacts,
    source: F,
) -> anyhow::Result<()>
where
    M: NodeModel,
    F: FnOnce(mpsc::Sender<M::Input>) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    // One kpng per network namespace and backend (before anything touches the node).
    let _lock = match facts.replaces_others {
        Some(kind) => Some(crate::instance_lock::acquire(kind.word())?),
        None => None,
    };
    info!(node = %model.snapshot().node.name, backend = backend.name(), "starting kpng");
    let timing = SyncTiming {
        min_sync_period: flags.min_sync_period,
        sync_period: flags.sync_period,
        full_sync_period: flags.full_sync_period,
    };
    let mut registry = Registry::default();
    backend.register_metrics(&mut registry);
    if let Some(source_metrics) = &facts.source_metrics {
        source_metrics.register(&mut registry);
    }
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
    if let Some(addresses) = facts.health_checks {
        // The node's conntrack table, as kube-proxy sets it (Linux's sysctls).
        #[cfg(target_os = "linux")]
        {
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
        }
        runner = runner.with_service_health(addresses);
    }
    #[cfg(target_os = "linux")]
    if facts.cleans_conntrack {
        match kpng_conntrack::Reconciler::open() {
            Ok(reconciler) => runner = runner.with_conntrack_cleanup(reconciler),
            Err(e) => tracing::warn!("UDP conntrack cleanup is off: {e}"),
        }
    }
    if let Some(kind) = facts.replaces_others {
        // Once this backend's rules are in place, the other kinds' rules go: traffic keeps
        // flowing through whichever set matches first meanwhile.
        let mut reports = runner.subscribe();
        tokio::spawn(async move {
            while reports.changed().await.is_ok() {
                let ok = reports.borrow_and_update().as_ref().is_some_and(|r| r.ok);
                if ok {
                    let _ = tokio::task::spawn_blocking(move || kind.remove_other_kinds()).await;
                    return;
                }
            }
        });
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

    let shutdown = crate::signals::shutdown()?;
    tokio::select! {
        _ = runner.run(rx) => {
            // The runner only ends when the source does.
            match source_task.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(anyhow::anyhow!("source task failed: {e}")),
            }
        }
        why = shutdown => { info!("{why}; leaving rules in place"); Ok(()) }
    }
}
