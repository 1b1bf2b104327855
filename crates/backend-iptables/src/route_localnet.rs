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

/// Records the current value (once) and sets 1.
pub fn record_and_enable(proc_sys: &Path, state_dir: &Path) -> Result<(), ExecError> {
    let path = proc_sys.join(SYSCTL);
    let current =
        std::fs::read_to_string(&path).map_err(io(format!("reading {}", path.display())))?;
    let current = current.trim();
    if current == "1" {
        return Ok(());
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
    })
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
