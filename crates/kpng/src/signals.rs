//! Shutdown signals, the same on every platform: SIGINT or SIGTERM on Unix (a terminal's
//! Ctrl-C, a kubelet stopping the Pod), Ctrl-C or Ctrl-Break on Windows (a console, or a
//! HostProcess container being stopped).

use std::future::Future;

use anyhow::Context;

/// A future that completes with a description of the first shutdown signal received. The
/// handlers are installed when this is called, not when the future is first polled, so no
/// signal is missed in between.
pub fn shutdown() -> anyhow::Result<impl Future<Output = &'static str>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate =
            signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let mut interrupt =
            signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        Ok(async move {
            tokio::select! {
                _ = interrupt.recv() => "interrupted",
                _ = terminate.recv() => "terminated",
            }
        })
    }
    #[cfg(windows)]
    {
        use tokio::signal::windows::{ctrl_break, ctrl_c};
        let mut interrupt = ctrl_c().context("installing the Ctrl-C handler")?;
        let mut brk = ctrl_break().context("installing the Ctrl-Break handler")?;
        Ok(async move {
            tokio::select! {
                _ = interrupt.recv() => "interrupted",
                _ = brk.recv() => "terminated",
                _ = crate::winservice::stop_requested() => "stopped by the Service Control Manager",
            }
        })
    }
}
