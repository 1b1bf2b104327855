//! `kpng <source> to-api`: the brain. The source's events go into one node-independent
//! [`kpng_api::hub::Hub`]; the gRPC server streams each watching node its own view.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use kpng_api::addr::TlsFiles;
use kpng_api::hub::Hub;
use kpng_api::metrics::ApiMetrics;
use kpng_model::input::InputHealth;
use kpng_model::{ClusterConfig, ClusterModel, Event};
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use crate::cli::{GlobalFlags, InputKind, ToApi};

/// How often a brain renews its budget of warnings about objects (a runner does at each sync).
const WARNING_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// How often a brain looks whether its input's problems changed, for the report its nodes show
/// (an API server outage changes them without any event); the report is sent only when it
/// changed.
const REPORT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
/// The source's queue, and the most events applied as one change: what the source sent
/// together (a file's objects) reaches the nodes in one change set.
const MAX_EVENTS_AT_ONCE: usize = 1024;
/// How long a brain that shuts down waits for its nodes' streams to end with the status that
/// says so.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// What a brain's ending leaves, for the line it ends with after a `--config` change.
const BRAIN_ENDING_LEAVES: &str =
    "its nodes keep their rules meanwhile and watch the restarted brain";

/// Runs the source (of `kind`) into a hub and serves it until the source ends,
/// SIGINT/SIGTERM, or a new valid `--config` file (an error, as a node's kpng).
/// `source_metrics` registers the source's own metrics (its errors, the API client's
/// requests) with the brain's.
pub async fn serve<F, Fut>(
    flags: GlobalFlags,
    to_api: &ToApi,
    kind: InputKind,
    input: InputHealth,
    source_metrics: impl FnOnce(&mut Registry),
    source: F,
) -> anyhow::Result<()>
where
    F: FnOnce(mpsc::Sender<Event>) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let mut registry = Registry::default();
    crate::process_metrics::register(&mut registry);
    crate::input_metrics::register(&mut registry, input.clone());
    source_metrics(&mut registry);
    let metrics = ApiMetrics::new(&mut registry);
    // The --config file read again while the brain runs (`config::watch`): a valid change
    // ends it, as it ends a node's kpng and kube-proxy, so that its restart applies it.
    let config_watch = flags.config_recheck.clone().map(|recheck| {
        crate::config::watch::Watch::new(
            recheck,
            crate::config::watch::OnValid::End {
                meanwhile: BRAIN_ENDING_LEAVES,
            },
        )
    });
    if let Some(watch) = &config_watch {
        watch.register_metrics(&mut registry);
    }
    let config_changed = async move {
        match config_watch {
            Some(watch) => watch.changed().await,
            None => std::future::pending().await,
        }
    };
    let refused_connections = kpng_runner::guarded_http::RefusedConnections::default();
    refused_connections.register_in(&mut registry);
    // Its nodes show what it rejects and how its input is doing (`kpng status`, "brain
    // reports"): they never see the objects themselves.
    let hub = Arc::new(
        Hub::new(
            ClusterModel::new(ClusterConfig {
                service_proxy_name: flags.service_proxy_name.clone(),
                only_node: None,
                node_port_range: flags.node_port_range(kind),
                service_cidrs: flags.service_cidr.clone(),
            }),
            metrics,
        )
        .reporting(input.clone())
        .with_version(crate::version::BuildInfo::current().api_version()),
    );
    if let Some(addr) = flags.healthz_bind_address
        && (addr.port() != crate::config::HEALTHZ_PORT || !addr.ip().is_unspecified())
    {
        warn!(
            "--healthz-bind-address {addr}: a brain has no health server; its /healthz (ready \
             once the cluster is listed) and /livez are on --metrics-bind-address"
        );
    }
    if !flags.metrics_bind_address.trim().is_empty() {
        let addr: SocketAddr = flags.metrics_bind_address.parse().with_context(|| {
            format!(
                "--metrics-bind-address {:?} is not HOST:PORT",
                flags.metrics_bind_address
            )
        })?;
        let server = crate::http::metrics_server(
            crate::listen::BindTo {
                addr,
                hard_fail: flags.bind_address_hard_fail,
            },
            Arc::new(registry),
            "api",
            crate::zpages::ZPages::new(&flags, "to-api"),
            None,
            crate::http::MetricsProbes::Brain(crate::http::BrainHealth {
                hub: hub.clone(),
                input: input.clone(),
            }),
            refused_connections,
        )
        .await?;
        tokio::spawn(async move {
            if let Err(e) = server.await {
                error!("metrics server stopped: {e}");
            }
        });
    }
    let tls = TlsFiles {
        cert: to_api.listen_tls_cert.clone(),
        key: to_api.listen_tls_key.clone(),
        ca: to_api.listen_tls_ca.clone(),
    };
    let limits = kpng_api::server::ConnLimits {
        max_connections: usize::try_from(to_api.max_connections).unwrap_or(usize::MAX),
        idle_timeout: to_api.connection_idle_timeout,
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = kpng_api::server::serve(hub.clone(), &to_api.listen, &tls, limits, async move {
        let _ = stop_rx.await;
    })
    .await
    .with_context(|| format!("serving the API on {} (--listen)", to_api.listen))?;
    let mut server = tokio::spawn(server);

    // `kpng status` on a brain: the connected nodes and the input.
    let mut _admin_socket: Option<crate::admin_socket::SocketFile> = None;
    if !flags.admin_socket.is_empty() {
        let path = std::path::Path::new(&flags.admin_socket);
        match crate::admin::serve_brain(path, hub.clone(), input).await {
            Ok(Some(server)) => {
                _admin_socket = Some(crate::admin_socket::SocketFile(path.to_path_buf()));
                tokio::spawn(async move {
                    if let Err(e) = server.await {
                        error!("admin socket stopped: {e}");
                    }
                });
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!("no admin socket (`kpng status` will not reach this brain): {e:#}")
            }
        }
    }
    let (tx, mut rx) = mpsc::channel(MAX_EVENTS_AT_ONCE);
    let source_task = tokio::spawn(source(tx));
    let feed = async {
        // A brain has no syncs: its warning budget is renewed every ten seconds.
        let mut warnings = kpng_runner::warning_budget::WarningBudget::default();
        // Rejections in the log, each with its end.
        let mut rejections = kpng_runner::rejection_log::RejectionLog::default();
        let mut renew = tokio::time::interval(WARNING_INTERVAL);
        let mut report = tokio::time::interval(REPORT_INTERVAL);
        report.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                event = rx.recv() => {
                    let Some(event) = event else { break };
                    // What the source sent together (one file's objects) goes to the nodes as
                    // one change set.
                    let mut events = vec![event];
                    while events.len() < MAX_EVENTS_AT_ONCE
                        && let Ok(event) = rx.try_recv()
                    {
                        events.push(event);
                    }
                    for out in hub.apply_all(events) {
                        let now = std::time::SystemTime::now();
                        for ended in &out.accepted_again {
                            rejections.accepted_again(ended, now);
                        }
                        for e in &out.errors {
                            rejections.rejected(e, now);
                        }
                        for w in &out.warnings {
                            if warnings.admit() {
                                warn!("{w}");
                            } else {
                                tracing::debug!("{w}");
                            }
                        }
                    }
                }
                _ = renew.tick() => {
                    kpng_runner::warning_budget::held_back(warnings.next_interval());
                }
                _ = report.tick() => {
                    if !rejections.is_empty() {
                        // Forget those that went without a usable version (deleted).
                        let still = hub.rejected().into_iter().map(|r| r.error.object);
                        rejections.keep_only(&still.collect());
                    }
                    hub.refresh_report();
                    hub.refresh_node_gauges();
                }
            }
        }
    };
    info!(listen = %to_api.listen, "starting kpng brain");
    let shutdown = crate::signals::shutdown()?;
    let mut server_ended = false;
    let result = tokio::select! {
        _ = feed => match source_task.await {
            Ok(result) => result,
            Err(e) => Err(anyhow::anyhow!("source task failed: {e}")),
        },
        r = &mut server => {
            server_ended = true;
            match r {
                Ok(r) => r.context("API server"),
                Err(e) => Err(anyhow::anyhow!("API server task failed: {e}")),
            }
        }
        why = shutdown => { info!("{why}"); Ok(()) }
        why = config_changed => Err(anyhow::anyhow!(why)),
    };
    let _ = stop_tx.send(());
    if !server_ended {
        // Every Watch stream ends with a status saying the brain shuts down, so nodes
        // reconnect at once and log why; a connection that takes longer is dropped.
        if tokio::time::timeout(SHUTDOWN_GRACE, &mut server)
            .await
            .is_err()
        {
            debug!("API connections still open after {SHUTDOWN_GRACE:?}: dropped");
        }
    }
    result
}
