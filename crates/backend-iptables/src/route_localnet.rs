//! `net.ipv4.conf.all.route_localnet`: set to 1 for IPv4 node ports on 127.0.0.1 (as
//! kube-proxy's iptables mode does), and put back as it was when kpng leaves for good.
//!
//! Why a file: `kpng cleanup`, and the backend that replaces iptables after a switch, are other
//! processes than the one that set the sysctl. So the first time kpng changes it, the value it
//! found is written to `STATE_DIR/route_localnet.<netns>` (`/run` is a tmpfs: a reboot forgets
//! it, as it forgets the sysctl), and the restore writes that value back and removes the file.
//! The sysctl is per network namespace, so the file name carries the namespace's inode
//! (`/proc/self/ns/net`). Nothing is recorded when the value already is 1, or when a record
//! exists (a restart must not record its own 1).

use std::path::{Path, PathBuf};

use crate::exec::ExecError;

/// Where kpng keeps what it must restore.
pub const STATE_DIR: &str = "/run/kpng";

const SYSCTL: &str = "net/ipv4/conf/all/route_localnet";

fn io(what: String) -> impl FnOnce(std::io::Error) -> ExecError {
    move |source| ExecError::Io { what, source }
}

/// The record's path for this process's network namespace.
pub fn record_path(state_dir: &Path) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let netns = std::fs::metadata("/proc/self/ns/net")
        .map(|m| m.ino())
        .unwrap_or(0);
    state_dir.join(format!("route_localnet.{netns}"))
}

/// What kpng says when it sets the sysctl, as kube-proxy logs it (kubernetes#90259: with it 1,
/// 127.0.0.0/8 addresses may be routed off the loopback device, which an admin who keeps it 0
/// on purpose must be told): once at INFO the first time this process sets it, and a WARN each
/// time it finds it reset after it had set it (someone, or a tool that hardens sysctls, put it
/// back: kpng sets it again at each full sync while node ports on 127.0.0.1 are asked for).
#[derive(Debug, Clone, Default)]
pub struct SetNotes {
    set_before: bool,
}

impl SetNotes {
    /// The log line for setting the sysctl that was `was`: INFO the first time, WARN after.
    pub fn note(&mut self, was: &str) -> (tracing::Level, String) {
        let avoid = "run kpng with --iptables-localhost-nodeports=false \
                     (iptables.localhostNodePorts: false), or --nodeport-addresses without \
                     127.0.0.1, to leave it alone";
        if std::mem::replace(&mut self.set_before, true) {
            (
                tracing::Level::WARN,
                format!(
                    "net.ipv4.conf.all.route_localnet was reset to {was} after kpng had set it to \
                     1: set to 1 again (IPv4 node ports on 127.0.0.1 need it); to keep it {was}, \
                     {avoid}"
                ),
            )
        } else {
            (
                tracing::Level::INFO,
                format!(
                    "set net.ipv4.conf.all.route_localnet=1 (it was {was}) so that IPv4 node \
                     ports answer on 127.0.0.1, as kube-proxy's iptables mode does; it also lets \
                     packets to and from 127.0.0.0/8 be routed off the loopback device \
                     (kubernetes#90259): {avoid}; `kpng cleanup` puts the old value back"
                ),
            )
        }
    }

    /// Logs [`SetNotes::note`].
    pub fn log(&mut self, was: &str) {
        match self.note(was) {
            (tracing::Level::WARN, line) => tracing::warn!("{line}"),
            (_, line) => tracing::info!("{line}"),
        }
    }
}

/// Records the current value (once) and sets 1. Returns the value it found when it wrote 1
/// (`None`: it was 1 already), for [`SetNotes`].
pub fn record_and_enable(proc_sys: &Path, state_dir: &Path) -> Result<Option<String>, ExecError> {
    let path = proc_sys.join(SYSCTL);
    let current =
        std::fs::read_to_string(&path).map_err(io(format!("reading {}", path.display())))?;
    let current = current.trim();
    if current == "1" {
        return Ok(None);
    }
    let record = record_path(state_dir);
    let mut recorded_now = false;
    if !record.exists() {
        // Without the record, cleanup cannot put the value back (kube-proxy never does): the
        // setting itself still matters more than its restore.
        let written = write_record(state_dir, &record, current);
        match written {
            Ok(()) => recorded_now = true,
            Err(e) => tracing::warn!(
                "cannot record route_localnet's value ({current}) in {}: {e}; cleanup will not \
                 put it back",
                record.display()
            ),
        }
    }
    std::fs::write(&path, "1").map_err(|e| {
        // Nothing changed: nothing to put back.
        if recorded_now {
            let _ = std::fs::remove_file(&record);
        }
        io(format!("setting {}", path.display()))(e)
    })?;
    Ok(Some(current.to_string()))
}

/// Writes back the recorded value, if any, and forgets it.
pub fn restore(proc_sys: &Path, state_dir: &Path) -> Result<(), ExecError> {
    let record = record_path(state_dir);
    let value = match std::fs::read_to_string(&record) {
        Ok(v) => v,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(format!("reading {}", record.display()))(e)),
    };
    let value = value.trim();
    if value != "0" && value != "1" {
        // Not something we wrote: leave the sysctl alone.
        let _ = std::fs::remove_file(&record);
        return Ok(());
    }
    let path = proc_sys.join(SYSCTL);
    std::fs::write(&path, value).map_err(io(format!("setting {}", path.display())))?;
    std::fs::remove_file(&record).map_err(io(format!("removing {}", record.display())))
}

/// Writes the record `record` in `state_dir` (made `rwxr-xr-x` whatever the umask): a new
/// file, mode 0600, created only if nothing holds the name (`O_EXCL`), after removing what
/// was there without following it, so that a link a local user planted cannot make root
/// write another file.
fn write_record(state_dir: &Path, record: &Path, value: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(state_dir)?;
    let _ = std::fs::remove_file(record);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(record)?
        .write_all(value.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sysctl(root: &Path) -> String {
        std::fs::read_to_string(root.join(SYSCTL)).expect("read")
    }

    #[test]
    fn enable_records_once_and_restore_puts_the_first_value_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let proc_sys = dir.path().join("sys");
        let state = dir.path().join("run");
        std::fs::create_dir_all(proc_sys.join(SYSCTL).parent().expect("parent")).expect("mkdir");
        std::fs::write(proc_sys.join(SYSCTL), "0\n").expect("write");

        record_and_enable(&proc_sys, &state).expect("enable");
        assert_eq!(sysctl(&proc_sys), "1");
        // A restart finds 1 and must not record it.
        record_and_enable(&proc_sys, &state).expect("enable again");
        restore(&proc_sys, &state).expect("restore");
        assert_eq!(sysctl(&proc_sys), "0");
        assert!(!record_path(&state).exists());
        // Nothing recorded: nothing to do.
        restore(&proc_sys, &state).expect("restore again");
        assert_eq!(sysctl(&proc_sys), "0");
    }

    /// kpng set `route_localnet` silently at every full sync, and again after an admin reset
    /// it: it now says so once at INFO, naming how to avoid it, and warns when it finds it
    /// reset after it had set it.
    #[test]
    fn setting_it_is_said_once_and_a_reset_is_warned_of() {
        let dir = tempfile::tempdir().expect("tempdir");
        let proc_sys = dir.path().join("sys");
        let state = dir.path().join("run");
        std::fs::create_dir_all(proc_sys.join(SYSCTL).parent().expect("parent")).expect("mkdir");
        std::fs::write(proc_sys.join(SYSCTL), "0\n").expect("write");
        let mut notes = SetNotes::default();
        let mut sync = || {
            record_and_enable(&proc_sys, &state)
                .expect("enable")
                .map(|was| notes.note(&was))
        };
        let (level, line) = sync().expect("set: said");
        assert_eq!(level, tracing::Level::INFO);
        assert!(
            line.starts_with("set net.ipv4.conf.all.route_localnet=1 (it was 0) ")
                && line.contains("kubernetes#90259")
                && line.contains("--iptables-localhost-nodeports=false"),
            "{line}"
        );
        assert_eq!(sync(), None, "1 already: nothing said");
        // An admin puts it back.
        std::fs::write(proc_sys.join(SYSCTL), "0\n").expect("write");
        let (level, line) = sync().expect("set again: said");
        assert_eq!(level, tracing::Level::WARN);
        assert!(
            line.starts_with(
                "net.ipv4.conf.all.route_localnet was reset to 0 after kpng had set it to 1"
            ) && line.contains("--iptables-localhost-nodeports=false"),
            "{line}"
        );
        assert_eq!(sysctl(&proc_sys), "1");
    }

    #[test]
    fn an_operator_setting_of_one_is_left_as_is() {
        let dir = tempfile::tempdir().expect("tempdir");
        let proc_sys = dir.path().join("sys");
        let state = dir.path().join("run");
        std::fs::create_dir_all(proc_sys.join(SYSCTL).parent().expect("parent")).expect("mkdir");
        std::fs::write(proc_sys.join(SYSCTL), "1\n").expect("write");
        record_and_enable(&proc_sys, &state).expect("enable");
        restore(&proc_sys, &state).expect("restore");
        assert_eq!(sysctl(&proc_sys).trim(), "1");
    }
}

/// Why node ports are not served on 127.0.0.1 although `--iptables-localhost-nodeports` asks
/// for them (`route_localnet` could not be set), shared between the backend, which finds out
/// at a sync, and `kpng status` / `kpng trace`, which must not claim 127.0.0.1 then. Clones
/// share one value.
#[derive(Debug, Clone, Default)]
pub struct LocalhostFailure(std::sync::Arc<std::sync::Mutex<Option<String>>>);

impl LocalhostFailure {
    /// The reason, if it failed.
    pub fn get(&self) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Records the failure (the first reason is kept).
    pub fn set(&self, why: String) {
        let mut held = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        held.get_or_insert(why);
    }
}
