//! The run marker: `/run/kpng/running.<netns inode>`, written by a proxy programming the node
//! when it starts (its pid, start time and backend) and removed when it shuts down cleanly.
//!
//! Why: a kpng killed by the OOM killer, a `SIGKILL` or a crash leaves its rules in place
//! (good) but no trace in its own output; the next start looked like any other, so a crash
//! loop read as normal restarts and only `dmesg` knew. A marker still there at start names
//! the run that ended without a clean shutdown: kpng warns once, `kpng status` shows it for
//! the life of the process and `kpng_unclean_previous_exit` is 1.
//!
//! Only the process holding the instance lock ([`crate::instance_lock`]) of its network
//! namespace writes or reads the marker, so the marker it finds is never a running kpng's;
//! `kpng status`, `cleanup` and `trace` never touch it. Like the other per-namespace records
//! ([`crate::netns_records`]), a marker whose namespace is gone is forgotten by the next
//! sweep. A marker from another boot, or of an earlier namespace whose inode this one got
//! (told apart by the namespace's cookie, on Linux 5.14 and later), is ignored.
//!
//! The time of death: a running kpng touches its marker (its modification time) every
//! [`HEARTBEAT`], so the marker a killed run left says when it was last seen alive, at most
//! that long before it died; without it an incident's timeline had the start of the dead run
//! and the start of the next, nothing in between.
//!
//! A run that ends cleanly while its syncs fail (stopped by a SIGTERM: the kubelet's, once a
//! persistent failure fails `/livez`, or anyone's) keeps its marker, rewritten to
//! say so ([`RunMarker::follow`]): the next start warns `the previous kpng … ended unhealthy:
//! …`, `kpng status` shows it and `kpng_unhealthy_previous_exit` is 1. Until 2026-12-07 such
//! a restart left no trace at all.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use kpng_runner::health::ProxyHealth;
use kpng_runner::runner::SyncReport;

use serde::{Deserialize, Serialize};

/// The record name, followed by `.<netns inode>` (and `.tmp` while being written).
pub const PREFIX: &str = "running.";

/// How often a running kpng touches its marker: the precision of "last seen alive". One
/// `utimensat` per period, whatever the sync rate.
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(10);

/// What the marker holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    /// The running kpng's pid (in its PID namespace).
    pid: u32,
    /// When it started (RFC 3339).
    started: String,
    /// Its backend (`nft`, `iptables`, …).
    backend: String,
    /// The boot it ran in (`/proc/sys/kernel/random/boot_id`), empty if unknown.
    #[serde(default)]
    boot_id: String,
    /// Its network namespace's cookie ([`kpng_netfilter::socket::netns_cookie`]), when the
    /// kernel has one: the inode in the name is reused by a later namespace once one is gone
    /// (test namespaces, pods), and the cookie tells them apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    netns_cookie: Option<u64>,
    /// Set by a clean shutdown while the syncs were failing: what was wrong (since when, the
    /// last error). A marker without it that is still there is a run that did not shut down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ended_unhealthy: Option<String>,
}

/// The run of kpng that ended without a clean shutdown, as the marker it left says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Previous {
    /// Its pid.
    pub pid: u32,
    /// When it started (RFC 3339).
    pub started: String,
    /// When it last touched its marker (RFC 3339): it died at most [`HEARTBEAT`] later.
    pub last_alive: Option<String>,
    /// It shut down cleanly, but while its syncs were failing: what was wrong.
    pub unhealthy: Option<String>,
}

impl Previous {
    /// Whether it ended without a clean shutdown (`kpng_unclean_previous_exit`), rather than
    /// cleanly while unhealthy (`kpng_unhealthy_previous_exit`).
    pub fn unclean(&self) -> bool {
        self.unhealthy.is_none()
    }

    /// The warning and `kpng status` line. For a clean end while unhealthy it says only what is
    /// known (stopped while unhealthy) and gives the liveness probe as one possible reason:
    /// the marker does not record who sent the signal.
    pub fn note(&self) -> String {
        if let Some(what) = &self.unhealthy {
            return format!(
                "the previous kpng (pid {}, started {}) ended unhealthy: {what}; it was \
                 stopped while unhealthy and shut down cleanly (e.g. the kubelet restarting it \
                 for a failed liveness probe: see the pod's events)",
                self.pid, self.started
            );
        }
        let alive = self
            .last_alive
            .as_ref()
            .map_or_else(String::new, |t| format!(", last seen alive at {t}"));
        format!(
            "the previous kpng (pid {}, started {}{alive}) ended without a clean shutdown \
             (killed, OOM — see `dmesg` / `journalctl -k`)",
            self.pid, self.started
        )
    }
}

/// This run's marker, held for the life of the proxy: dropping it (a clean shutdown, or an
/// error kpng stops with and reports) removes the file. A kill leaves it.
#[derive(Debug)]
pub struct RunMarker {
    /// The file written, `None` when it could not be.
    path: Option<PathBuf>,
    /// The run before this one, when it ended uncleanly.
    previous: Option<Previous>,
    /// This run's record, as written.
    record: Option<Record>,
    /// What the syncs' reports say now, once [`RunMarker::follow`] follows them.
    syncs: Arc<Mutex<SyncsFailing>>,
    /// The proxy's health, to say whether `/livez` failed at the end.
    health: Option<Arc<ProxyHealth>>,
    /// Stops the heartbeat thread when dropped.
    _heartbeat: Option<std::sync::mpsc::Sender<()>>,
}

/// The syncs failing now (none when `since` is `None`), from the runner's reports.
#[derive(Debug, Default, Clone)]
struct SyncsFailing {
    /// When the first failure of the current run of them was reported.
    since: Option<SystemTime>,
    /// How many failed since.
    failures: u64,
    /// The last one's error.
    last_error: String,
}

impl SyncsFailing {
    /// Takes one sync's report into account.
    fn report(&mut self, report: &SyncReport, now: SystemTime) {
        if report.ok {
            *self = SyncsFailing::default();
            return;
        }
        self.since.get_or_insert(now);
        self.failures += 1;
        self.last_error = report.error.clone().unwrap_or_default();
    }

    /// What the marker says when the run ends now: `None` when the syncs do not fail.
    fn note(&self, livez_failing: bool) -> Option<String> {
        let since = self.since?;
        let failures = if self.failures == 1 {
            "1 failure".to_string()
        } else {
            format!("{} failures", self.failures)
        };
        Some(format!(
            "its syncs had been failing since {} ({failures}; last error: {}){}",
            humantime::format_rfc3339_seconds(since),
            self.last_error,
            if livez_failing {
                ", and /livez was failing"
            } else {
                ""
            }
        ))
    }
}

impl RunMarker {
    /// Reads the marker an earlier run left in `dir` for this network namespace, then writes
    /// this run's (pid `pid`, backend `backend`). Failures (a read-only `/run`) are logged at
    /// debug and leave no marker: the marker only informs.
    pub fn start(dir: &Path, backend: &str, pid: u32) -> RunMarker {
        let Some(path) = marker_path(dir) else {
            tracing::debug!("no run marker: this process's network namespace is unknown");
            return RunMarker {
                path: None,
                previous: None,
                record: None,
                syncs: Arc::default(),
                health: None,
                _heartbeat: None,
            };
        };
        let here = Here {
            boot_id: kpng_conntrack::memory::boot_id().unwrap_or_default(),
            netns_cookie: kpng_netfilter::socket::netns_cookie(),
        };
        let found = read(&path).unwrap_or_else(|why| {
            // An operator after a crash looks for the previous run's record: say it was there
            // but unreadable, rather than nothing.
            tracing::info!(
                "{why}; ignored (whether the kpng before this one shut down cleanly is unknown), \
                 and replaced with this run's"
            );
            None
        });
        let previous = found.and_then(|(r, touched)| {
            left_by_previous(r, &here).map(|p| Previous {
                last_alive: touched.map(|t| humantime::format_rfc3339_seconds(t).to_string()),
                ..p
            })
        });
        let record = Record {
            pid,
            started: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            backend: backend.to_string(),
            boot_id: here.boot_id,
            netns_cookie: here.netns_cookie,
            ended_unhealthy: None,
        };
        let path = match write(&path, &record) {
            Ok(()) => Some(path),
            Err(e) => {
                tracing::debug!("no run marker: writing {}: {e}", path.display());
                None
            }
        };
        let heartbeat = path.clone().and_then(|p| heartbeat(p, HEARTBEAT));
        RunMarker {
            path,
            previous,
            record: Some(record),
            syncs: Arc::default(),
            health: None,
            _heartbeat: heartbeat,
        }
    }

    /// Follows the runner's sync reports (a task of the current runtime), so that a clean
    /// shutdown while the syncs fail leaves the marker saying so, and `health` to say whether
    /// `/livez` failed then: the kubelet restarts a kpng whose `/livez` fails with a SIGTERM,
    /// a clean exit that left nothing for the next start to tell.
    pub fn follow(
        &mut self,
        mut reports: tokio::sync::watch::Receiver<Option<SyncReport>>,
        health: Arc<ProxyHealth>,
    ) {
        self.health = Some(health);
        let syncs = Arc::clone(&self.syncs);
        tokio::spawn(async move {
            while reports.changed().await.is_ok() {
                let report = reports.borrow_and_update().clone();
                if let Some(report) = report {
                    syncs
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .report(&report, SystemTime::now());
                }
            }
        });
    }

    /// What the marker says at a clean shutdown now: `None` when the syncs do not fail.
    fn ended_unhealthy(&self) -> Option<String> {
        let livez_failing = self
            .health
            .as_ref()
            .is_some_and(|h| !h.is_healthy(SystemTime::now()));
        self.syncs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .note(livez_failing)
    }

    /// The earlier run that ended without a clean shutdown, if the marker it left was found.
    pub fn previous(&self) -> Option<&Previous> {
        self.previous.as_ref()
    }
}

impl Drop for RunMarker {
    fn drop(&mut self) {
        // A clean shutdown while the syncs fail: the marker stays, saying so.
        if let (Some(path), Some(record), Some(what)) =
            (&self.path, &self.record, self.ended_unhealthy())
        {
            let record = Record {
                ended_unhealthy: Some(what),
                ..record.clone()
            };
            match write(path, &record) {
                Ok(()) => return,
                Err(e) => tracing::debug!("rewriting the run marker {}: {e}", path.display()),
            }
        }
        if let Some(path) = &self.path
            && let Err(e) = std::fs::remove_file(path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::debug!("removing the run marker {}: {e}", path.display());
        }
    }
}

/// The marker of this process's network namespace in `dir`.
fn marker_path(dir: &Path) -> Option<PathBuf> {
    let netns = std::fs::metadata("/proc/self/ns/net").ok()?.ino();
    Some(dir.join(format!("{PREFIX}{netns}")))
}

/// The record at `path` and when it was last touched: `None` when there is none.
///
/// # Errors
/// Why the file there is not a marker, naming it: not a regular file, larger than a marker
/// (4 KiB), unreadable, or it does not parse.
fn read(path: &Path) -> Result<Option<(Record, Option<std::time::SystemTime>)>, String> {
    let shown = path.display();
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("the run marker {shown} cannot be read: {e}")),
    };
    if !meta.file_type().is_file() {
        return Err(format!("the run marker {shown} is not a regular file"));
    }
    if meta.len() > 4096 {
        return Err(format!(
            "the run marker {shown} is not one: {} bytes, a marker is under 4 KiB",
            meta.len()
        ));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("the run marker {shown} cannot be read: {e}"))?;
    let record = serde_json::from_str(&text)
        .map_err(|e| format!("the run marker {shown} does not parse: {e}"))?;
    Ok(Some((record, meta.modified().ok())))
}

/// Touches the marker at `path` every `period` on a thread of its own (a sleeping thread, not
/// a task of the proxy's runtime: the runtime's periodic work runs only with an admin socket
/// or at `--sync-period`, and a heartbeat must not depend on either), until the returned
/// sender is dropped. `None` when the thread cannot start (the marker then says the start
/// time only).
fn heartbeat(path: PathBuf, period: std::time::Duration) -> Option<std::sync::mpsc::Sender<()>> {
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("kpng-run-marker".into())
        .spawn(move || {
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(period)
            {
                if let Err(e) = touch(&path) {
                    tracing::debug!("touching the run marker {}: {e}", path.display());
                }
            }
        })
        .ok()?;
    Some(stop)
}

/// Sets the marker's modification time to now; a marker removed meanwhile is not created.
fn touch(path: &Path) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .set_modified(std::time::SystemTime::now())
}

/// Where this run is: what tells a marker of this boot and namespace from another's.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Here {
    /// This boot's id, empty if unknown.
    boot_id: String,
    /// This network namespace's cookie, if the kernel has one.
    netns_cookie: Option<u64>,
}

/// The earlier run `record` names, if it ran here: in this boot and this network namespace
/// (not an earlier one whose inode this one got). What either side does not know counts as
/// the same.
fn left_by_previous(record: Record, here: &Here) -> Option<Previous> {
    let same = |a: &str, b: &str| a.is_empty() || b.is_empty() || a == b;
    let same_boot = same(&record.boot_id, &here.boot_id);
    let same_netns = match (record.netns_cookie, here.netns_cookie) {
        (Some(theirs), Some(ours)) => theirs == ours,
        _ => true,
    };
    if !(same_boot && same_netns) {
        tracing::debug!(
            "a run marker of another boot or network namespace (pid {}, started {}): ignored",
            record.pid,
            record.started
        );
        return None;
    }
    Some(Previous {
        pid: record.pid,
        started: record.started,
        last_alive: None,
        unhealthy: record.ended_unhealthy,
    })
}

/// Writes `record` at `path` atomically: a new file (mode 0600; whatever had the temporary
/// name is removed, never followed), renamed over the old one.
fn write(path: &Path, record: &Record) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o755);
        builder.create(dir)?;
    }
    let text = serde_json::to_string(record).map_err(std::io::Error::other)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(&tmp)?.write_all(text.as_bytes())?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_left_behind_names_the_run_that_did_not_shut_down_cleanly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = RunMarker::start(dir.path(), "nft", 4242);
        assert_eq!(first.previous(), None, "nothing before the first run");
        let path = marker_path(dir.path()).expect("path");
        let (record, _) = read(&path)
            .expect("readable")
            .expect("the marker is written");
        assert_eq!((record.pid, record.backend.as_str()), (4242, "nft"));
        // A kill: the marker stays.
        std::mem::forget(first);
        let second = RunMarker::start(dir.path(), "nft", 4343);
        let previous = second.previous().expect("the killed run is found").clone();
        assert_eq!(previous.pid, 4242);
        assert_eq!(previous.started, record.started);
        assert!(previous.last_alive.is_some(), "the marker's time");
        assert!(
            previous
                .note()
                .starts_with("the previous kpng (pid 4242, started 2")
                && previous.note().ends_with(
                    ") ended without a clean shutdown (killed, OOM — see `dmesg` / `journalctl -k`)"
                ),
            "{}",
            previous.note()
        );
        // A clean shutdown removes it: the next run finds nothing.
        drop(second);
        assert!(!path.exists(), "removed at a clean shutdown");
        let third = RunMarker::start(dir.path(), "nft", 4444);
        assert_eq!(third.previous(), None);
    }

    #[test]
    fn only_a_marker_of_this_boot_and_namespace_counts() {
        let record = |boot: &str, cookie: Option<u64>| Record {
            pid: 7,
            started: "T".into(),
            backend: "nft".into(),
            boot_id: boot.into(),
            netns_cookie: cookie,
            ended_unhealthy: None,
        };
        let here = |boot: &str, cookie: Option<u64>| Here {
            boot_id: boot.into(),
            netns_cookie: cookie,
        };
        let found = true;
        // (the marker's boot and cookie, this run's, whether it names an earlier run here)
        let cases = [
            (("a", Some(1)), ("a", Some(1)), found),
            (("a", Some(1)), ("b", Some(1)), !found),
            // A later namespace given the inode of one that is gone.
            (("a", Some(1)), ("a", Some(2)), !found),
            // What one side does not know is taken as the same.
            (("", Some(1)), ("b", Some(1)), found),
            (("a", Some(1)), ("", Some(1)), found),
            (("a", None), ("a", Some(2)), found),
            (("a", Some(1)), ("a", None), found),
        ];
        for ((boot, cookie), (our_boot, ours), want) in cases {
            let previous = left_by_previous(record(boot, cookie), &here(our_boot, ours));
            assert_eq!(
                previous.is_some(),
                want,
                "{boot:?} {cookie:?} {our_boot:?} {ours:?}"
            );
        }
    }

    #[test]
    fn a_running_kpng_touches_its_marker_which_says_when_it_was_last_alive() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("running.1");
        std::fs::write(&path, "{}").expect("write");
        let long_ago = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1 << 30);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        file.set_modified(long_ago).expect("set the time");
        let stop = heartbeat(path.clone(), std::time::Duration::from_millis(20));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let modified = || std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        while modified() == Some(long_ago) {
            assert!(std::time::Instant::now() < deadline, "not touched");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // Stopped with the marker; a marker removed is not created again.
        drop(stop);
        std::fs::remove_file(&path).expect("remove");
        std::thread::sleep(std::time::Duration::from_millis(60));
        assert!(!path.exists());
        assert!(touch(&path).is_err());
        let previous = Previous {
            pid: 7,
            started: "2026-12-07T07:22:42Z".into(),
            last_alive: Some("2026-12-07T07:28:30Z".into()),
            unhealthy: None,
        };
        assert_eq!(
            previous.note(),
            "the previous kpng (pid 7, started 2026-12-07T07:22:42Z, last seen alive at \
             2026-12-07T07:28:30Z) ended without a clean shutdown (killed, OOM — see `dmesg` / \
             `journalctl -k`)"
        );
    }

    /// A clean shutdown while the syncs fail (the kubelet's SIGTERM after `/livez` failed)
    /// leaves the marker saying so, and the next start says it; a clean shutdown once they
    /// succeed again leaves nothing. Until 2026-12-07 such a restart left no trace.
    #[tokio::test]
    async fn a_clean_shutdown_while_syncs_fail_is_told_at_the_next_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let report = |ok: bool| SyncReport {
            generation: 1,
            ok,
            full: true,
            operations: 0,
            duration: std::time::Duration::ZERO,
            error: (!ok).then(|| "iptables-restore: exit status 1".to_string()),
        };
        let health = Arc::new(ProxyHealth::new(
            &[kpng_model::Family::V4],
            std::time::Duration::from_secs(60),
        ));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let failures = |marker: &RunMarker| marker.syncs.lock().expect("lock").failures;
        let (tx, rx) = tokio::sync::watch::channel(None);
        let mut first = RunMarker::start(dir.path(), "iptables", 4242);
        first.follow(rx, health.clone());
        for n in 1..=2 {
            tx.send_replace(Some(report(false)));
            while failures(&first) < n {
                assert!(std::time::Instant::now() < deadline, "reports not followed");
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        }
        drop(first);
        let second = RunMarker::start(dir.path(), "iptables", 4343);
        let previous = second
            .previous()
            .expect("the unhealthy end is found")
            .clone();
        assert!(!previous.unclean(), "it shut down cleanly");
        let note = previous.note();
        assert!(
            note.starts_with("the previous kpng (pid 4242, started 2")
                && note.contains(") ended unhealthy: its syncs had been failing since 2")
                && note.contains(
                    "(2 failures; last error: iptables-restore: exit status 1); it was stopped \
                     while unhealthy and shut down cleanly (e.g. the kubelet restarting it for a \
                     failed liveness probe"
                ),
            "{note}"
        );
        // Recovered before the shutdown: nothing is left.
        let (tx, rx) = tokio::sync::watch::channel(None);
        let mut third = second;
        third.follow(rx, health);
        tx.send_replace(Some(report(false)));
        while third.ended_unhealthy().is_none() {
            assert!(std::time::Instant::now() < deadline, "report not followed");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        tx.send_replace(Some(report(true)));
        while third.ended_unhealthy().is_some() {
            assert!(std::time::Instant::now() < deadline, "report not followed");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        drop(third);
        assert!(!marker_path(dir.path()).expect("path").exists());
    }

    /// What is not a marker is not read as one, and the reason names the file (a corrupt
    /// marker was ignored silently: after a crash, the operator wants to know the previous
    /// run's record was there but unreadable); no file at all is simply no previous run.
    #[test]
    fn what_is_not_a_marker_is_ignored_saying_why() {
        let dir = tempfile::tempdir().expect("tempdir");
        let at = |name: &str| dir.path().join(name);
        std::fs::write(at("running.1"), "not json").expect("write");
        std::fs::write(at("running.4"), r#"{"pid":999"#).expect("write");
        std::fs::write(at("running.5"), vec![b'x'; 5000]).expect("write");
        std::os::unix::fs::symlink("/etc/hostname", at("running.2")).expect("symlink");
        let cases = [
            ("running.1", "does not parse"),
            ("running.4", "does not parse: EOF"),
            ("running.5", "5000 bytes"),
            ("running.2", "is not a regular file"),
        ];
        for (name, why) in cases {
            let err = read(&at(name)).expect_err(name);
            assert!(
                err.contains(&at(name).display().to_string()) && err.contains(why),
                "{name}: {err}"
            );
        }
        assert_eq!(read(&at("running.3")), Ok(None), "no marker");
    }
}
