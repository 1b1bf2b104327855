//! The `--config` file changing while kpng runs.
//!
//! kube-proxy watches its file (fsnotify) and exits when it is written, so that the kubelet
//! restarts it on the new content; kpng did nothing, and `/configz` kept the old values while
//! the ConfigMap said otherwise. kpng reads the file again every [`POLL`] (a ConfigMap mount
//! is replaced by the kubelet's swap of its `..data` link, which no event on the file's own
//! path reports; reading through the path follows it) and, when its content differs from
//! what kpng started with, checks it at once the way a start would:
//! - valid: kpng says the file changed and ends (exit 1, as kube-proxy), so that its restart
//!   applies it; the rules stay in place meanwhile (a restart adopts them);
//! - invalid (or unreadable): kpng keeps running on the configuration it has, and says so
//!   loudly (an ERROR naming the file and the field, a `kpng status` PROBLEM line, the
//!   `kpng_config_file_rejected` gauge at 1), so a bad merge does not crash-loop every node.
//!   Writing back the content kpng runs with clears it.
//!
//! What a valid new content does depends on the run ([`OnValid`]): a proxy ends, and so does
//! a `to-file` run (its output describes the configuration it started with, and a supervisor
//! restarting it writes the new one; its line says it leaves no rules); a `--dry-run`, which
//! previews one start and which nobody restarts, says that the file changed and that it goes
//! on with what it started with (until 2026-12-07 it ended with status 1, which reads as the
//! failure a dry run reports).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kpng_runner::admin::{DataPlaneDetail, DataPlaneProbe};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// How often the file is read again.
pub const POLL: Duration = Duration::from_secs(1);

/// Checks the file's current content the way a start with the same command line would
/// (`config::apply` again): `Err` names the file and the field.
type Check = Arc<dyn Fn() -> anyhow::Result<()> + Send + Sync>;

/// The `--config` file as kpng started with it, and how to check a new content; carried by
/// the flags from `main` (which has the command line) to the proxy's loop.
#[derive(Clone)]
pub struct Recheck {
    path: PathBuf,
    started_with: String,
    check: Check,
}

impl std::fmt::Debug for Recheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recheck").field("path", &self.path).finish()
    }
}

impl Recheck {
    /// `started_with` is the content `--config` was applied from.
    pub fn new(
        path: PathBuf,
        started_with: String,
        check: impl Fn() -> anyhow::Result<()> + Send + Sync + 'static,
    ) -> Recheck {
        Recheck {
            path,
            started_with,
            check: Arc::new(check),
        }
    }
}

/// What a new valid content of the file does to this run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnValid {
    /// End (status 1, as kube-proxy) so that the restart applies it: a proxy, or a `to-file`
    /// run. `meanwhile` says what stays until then (`the rules stay in place until then`).
    End {
        /// What the ending leaves behind, for its line.
        meanwhile: &'static str,
    },
    /// Say so and go on with the configuration it started with: a dry run, which previews one
    /// start and which nobody restarts.
    Say,
}

/// A running watch: its state for `kpng status` and `/metrics`.
#[derive(Clone)]
pub struct Watch {
    recheck: Recheck,
    on_valid: OnValid,
    /// Why the file's current content is not used; `None` while it is the one in use.
    rejected: Arc<Mutex<Option<String>>>,
    gauge: Gauge,
}

/// What a read of the file gives: its text, or why it could not be read.
type Read = Result<String, String>;

/// What a new content of the file means for the running kpng.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    /// Nothing to do (unchanged since the last look).
    Same,
    /// The content kpng runs with is back: the earlier rejection is over.
    Restored,
    /// A new valid content: restart to apply it.
    Apply,
    /// A new content that cannot be used: why.
    Reject(String),
}

impl Watch {
    /// Starts with the content kpng runs with as the last one seen; a new valid content does
    /// what `on_valid` says.
    pub fn new(recheck: Recheck, on_valid: OnValid) -> Watch {
        Watch {
            recheck,
            on_valid,
            rejected: Arc::default(),
            gauge: Gauge::default(),
        }
    }

    /// `kpng_config_file_rejected`: 1 while the file holds a content kpng cannot use.
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "kpng_config_file_rejected",
            "1 while the --config file holds a content kpng refused (kpng runs on the \
             configuration it started with)",
            self.gauge.clone(),
        );
    }

    /// `kpng status`'s line, with a PROBLEM while the file's content is refused.
    pub fn probe(&self) -> DataPlaneProbe {
        let me = self.clone();
        Arc::new(move || {
            let problem = me.rejected.lock().ok().and_then(|r| r.clone());
            vec![DataPlaneDetail {
                what: "--config".into(),
                state: format!(
                    "{} ({})",
                    me.recheck.path.display(),
                    if problem.is_some() {
                        "changed, refused"
                    } else {
                        "in use"
                    }
                ),
                problem,
            }]
        })
    }

    /// What `now` (a read after `last`) means.
    pub fn judge(&self, last: &Read, now: &Read) -> Verdict {
        if now == last {
            return Verdict::Same;
        }
        match now {
            Ok(text) if *text == self.recheck.started_with => Verdict::Restored,
            Ok(_) => match (self.recheck.check)() {
                Ok(()) => Verdict::Apply,
                Err(e) => Verdict::Reject(format!("{e:#}")),
            },
            Err(e) => Verdict::Reject(e.clone()),
        }
    }

    /// Completes with the line kpng ends with once the file holds a new valid content (with
    /// [`OnValid::End`]; with [`OnValid::Say`] it never completes); refusals and
    /// restorations are logged and shown meanwhile.
    pub async fn changed(self) -> String {
        let path = self.recheck.path.clone();
        let read = || -> Read {
            std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))
        };
        let mut last: Read = Ok(self.recheck.started_with.clone());
        loop {
            tokio::time::sleep(POLL).await;
            let now = read();
            match self.judge(&last, &now) {
                Verdict::Same => {}
                Verdict::Restored => {
                    self.set_rejected(None);
                    tracing::info!(
                        "--config {}: back to the content kpng runs with",
                        path.display()
                    );
                }
                Verdict::Apply => match self.on_valid {
                    OnValid::End { meanwhile } => {
                        return format!(
                            "--config {} changed: ending so that the restart applies it \
                             ({meanwhile}), as kube-proxy does",
                            path.display()
                        );
                    }
                    OnValid::Say => {
                        self.set_rejected(None);
                        tracing::warn!(
                            "--config {} changed (a start would accept it): this dry run goes \
                             on with the configuration it started with; run it again to see \
                             what the new one does",
                            path.display()
                        );
                    }
                },
                Verdict::Reject(why) => {
                    tracing::error!(
                        "--config {} changed but cannot be used, kpng runs on with the \
                         configuration it started with: {why}",
                        path.display()
                    );
                    self.set_rejected(Some(format!(
                        "the file changed but cannot be used ({why}); kpng runs on the \
                         configuration it started with"
                    )));
                }
            }
            last = now;
        }
    }

    fn set_rejected(&self, why: Option<String>) {
        self.gauge.set(i64::from(why.is_some()));
        if let Ok(mut r) = self.rejected.lock() {
            *r = why;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_content_is_applied_refused_or_back_to_the_one_in_use() {
        let end = OnValid::End { meanwhile: "-" };
        let watch = Watch::new(
            Recheck::new("/c".into(), "good".into(), || anyhow::bail!("field x: bad")),
            end,
        );
        let valid = Watch::new(Recheck::new("/c".into(), "good".into(), || Ok(())), end);
        let ok = |s: &str| -> Read { Ok(s.to_string()) };
        let cases: [(&Watch, Read, Read, Verdict); 5] = [
            (&valid, ok("good"), ok("good"), Verdict::Same),
            (&valid, ok("good"), ok("new"), Verdict::Apply),
            (
                &watch,
                ok("good"),
                ok("new"),
                Verdict::Reject("field x: bad".into()),
            ),
            (&watch, ok("new"), ok("good"), Verdict::Restored),
            (
                &watch,
                ok("good"),
                Err("reading /c: gone".into()),
                Verdict::Reject("reading /c: gone".into()),
            ),
        ];
        for (w, last, now, want) in cases {
            assert_eq!(w.judge(&last, &now), want, "{last:?} -> {now:?}");
        }
    }
}
