//! `--windows-service` (`windowsRunAsService`): run under the Windows Service Control Manager
//! (SCM), as kube-proxy's `--windows-service` does, for nodes that install the proxy with
//! `sc.exe create kpng binPath= "C:\k\kpng.exe … --windows-service"` instead of a HostProcess
//! container.
//!
//! At start kpng connects to the SCM (`kpng_backend_hns::service`, where the FFI lives),
//! reports the service running, and takes the SCM's Stop and Shutdown controls as a shutdown
//! signal (`signals::shutdown` waits on `stop_requested` beside Ctrl-C); when kpng has stopped,
//! [`stopped`] reports it with its exit code. Started from a console rather than by the SCM,
//! kpng exits with the dispatcher's error, as kube-proxy does. On other systems the flag warns
//! and changes nothing.

#[cfg(windows)]
use std::sync::{Arc, OnceLock};

/// The SCM's stop request. The SCM's callbacks carry no context, and the shutdown future is
/// built far from `main`; this one process-wide value, set once by `start`, joins them.
#[cfg(windows)]
static STOP: OnceLock<Arc<tokio::sync::Notify>> = OnceLock::new();

/// Connects to the SCM and reports the service running.
#[cfg(windows)]
pub fn start() -> anyhow::Result<()> {
    let stop = STOP
        .get_or_init(|| Arc::new(tokio::sync::Notify::new()))
        .clone();
    // A permit is kept if nobody waits yet: a stop that comes early is not lost.
    kpng_backend_hns::service::start(Box::new(move || stop.notify_one()))
        .map_err(|e| anyhow::anyhow!("--windows-service: {e}"))
}

/// Completes when the SCM asks the service to stop (never, when not a service).
#[cfg(windows)]
pub async fn stop_requested() {
    match STOP.get() {
        Some(stop) => stop.notified().await,
        None => std::future::pending::<()>().await,
    }
}

/// Reports the service stopped with kpng's exit code (nothing when not a service).
pub fn stopped(exit_code: u32) {
    #[cfg(windows)]
    kpng_backend_hns::service::stopped(exit_code);
    #[cfg(not(windows))]
    let _ = exit_code;
}
