//! Conntrack sysctls at start-up, as kube-proxy sets them (`--conntrack-*`).
//!
//! A proxy node terminates every Service connection in conntrack, so the table must be large
//! enough and its timeouts sane. Values of 0 mean "leave it". The table size is only ever
//! raised (an administrator's larger value stands), and its hash table grows with it. A
//! read-only `/proc/sys` (an unprivileged container) is a warning, never fatal.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::{info, warn};

/// The `--conntrack-*` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConntrackSettings {
    /// Entries per CPU (`--conntrack-max-per-core`, 32768).
    pub max_per_core: u64,
    /// Minimum table size (`--conntrack-min`, 131072).
    pub min: u64,
    /// `--conntrack-tcp-timeout-established` (24h).
    pub tcp_established: Duration,
    /// `--conntrack-tcp-timeout-close-wait` (1h).
    pub tcp_close_wait: Duration,
    /// `--conntrack-tcp-be-liberal`: accept out-of-window TCP packets instead of marking them
    /// invalid.
    pub tcp_be_liberal: bool,
    /// `--conntrack-udp-timeout` (0: leave).
    pub udp: Duration,
    /// `--conntrack-udp-timeout-stream` (0: leave).
    pub udp_stream: Duration,
}

impl ConntrackSettings {
    /// The `--conntrack-*` flags.
    pub fn from_flags(flags: &crate::cli::GlobalFlags) -> ConntrackSettings {
        ConntrackSettings {
            max_per_core: flags.conntrack_max_per_core,
            min: flags.conntrack_min,
            tcp_established: flags.conntrack_tcp_timeout_established,
            tcp_close_wait: flags.conntrack_tcp_timeout_close_wait,
            tcp_be_liberal: flags.conntrack_tcp_be_liberal,
            udp: flags.conntrack_udp_timeout,
            udp_stream: flags.conntrack_udp_timeout_stream,
        }
    }
}

/// The CPUs the table size is computed for (`--conntrack-max-per-core` × this).
pub fn cpus() -> u64 {
    std::thread::available_parallelism()
        .map(|n| n.get() as u64)
        .unwrap_or(1)
}

/// One sysctl to write: (path under /proc/sys, value, only if larger than the current value).
type Write = (&'static str, u64, bool);

impl ConntrackSettings {
    /// The writes these settings call for on a machine with `cpus` CPUs.
    pub fn writes(&self, cpus: u64) -> Vec<Write> {
        let mut out = Vec::new();
        if self.max_per_core > 0 {
            let max = (self.max_per_core * cpus).max(self.min);
            out.push(("net/netfilter/nf_conntrack_max", max, true));
        }
        let secs = |d: Duration| d.as_secs();
        if secs(self.tcp_established) > 0 {
            out.push((
                "net/netfilter/nf_conntrack_tcp_timeout_established",
                secs(self.tcp_established),
                false,
            ));
        }
        if secs(self.tcp_close_wait) > 0 {
            out.push((
                "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
                secs(self.tcp_close_wait),
                false,
            ));
        }
        if self.tcp_be_liberal {
            out.push(("net/netfilter/nf_conntrack_tcp_be_liberal", 1, false));
        }
        if secs(self.udp) > 0 {
            out.push((
                "net/netfilter/nf_conntrack_udp_timeout",
                secs(self.udp),
                false,
            ));
        }
        if secs(self.udp_stream) > 0 {
            out.push((
                "net/netfilter/nf_conntrack_udp_timeout_stream",
                secs(self.udp_stream),
                false,
            ));
        }
        out
    }

    /// The writes that would change something under `proc_sys` (normally `/proc/sys`): each
    /// sysctl's path, the value to write and the current value. `--dry-run` prints these.
    pub fn pending(&self, proc_sys: &Path, cpus: u64) -> Vec<(PathBuf, u64, Option<u64>)> {
        let mut out = Vec::new();
        for (name, value, only_raise) in self.writes(cpus) {
            let path: PathBuf = proc_sys.join(name);
            let current = std::fs::read_to_string(&path)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok());
            if current == Some(value) || (only_raise && current.is_some_and(|c| c >= value)) {
                continue;
            }
            out.push((path, value, current));
        }
        out
    }

    /// Applies the settings under `proc_sys` (normally `/proc/sys`). Problems are warnings.
    pub fn apply(&self, proc_sys: &Path, cpus: u64) {
        for (path, value, current) in self.pending(proc_sys, cpus) {
            match std::fs::write(&path, value.to_string()) {
                Ok(()) => {
                    info!("set {} to {value}", path.display());
                    if path.ends_with("nf_conntrack_max") {
                        raise_hashsize(value / 4);
                    }
                }
                Err(e) => warn!("{}", cannot_set(&path, value, current, &e)),
            }
        }
    }
}

/// The warning for a setting that could not be written: the value kept, and, where it is
/// read-only (the table's size outside the host network namespace, `/proc/sys` in an
/// unprivileged container), why and the way out: kpng's own flags cannot help there.
fn cannot_set(path: &Path, value: u64, current: Option<u64>, e: &std::io::Error) -> String {
    use std::io::ErrorKind;
    let kept = current.map_or_else(|| "the kernel's value".to_string(), |c| c.to_string());
    let read_only = matches!(
        e.kind(),
        ErrorKind::ReadOnlyFilesystem | ErrorKind::PermissionDenied
    );
    let hint = if read_only && path.ends_with("nf_conntrack_max") {
        format!(
            " ({}; --conntrack-max-per-core 0 leaves it to the node and stops this warning)",
            kpng_runner::admin::ConntrackStatus::MAX_READ_ONLY
        )
    } else if read_only {
        " (/proc/sys is read-only outside a privileged container: run kpng privileged, or set \
         the config's conntrack values to 0 to leave them to the node)"
            .to_string()
    } else {
        String::new()
    };
    // Named by its flag and field: the path alone does not say which setting to change.
    let setting = setting_of(path).map_or_else(String::new, |s| format!("{s}: "));
    format!(
        "{setting}cannot set {} to {value} ({e}); continuing with {kept}{hint}",
        path.display()
    )
}

/// The flag and `--config` field that set the sysctl at `path`.
fn setting_of(path: &Path) -> Option<&'static str> {
    let name = path.file_name()?.to_str()?;
    Some(match name {
        "nf_conntrack_max" => {
            "--conntrack-max-per-core/--conntrack-min (conntrack.maxPerCore, conntrack.min)"
        }
        "nf_conntrack_tcp_timeout_established" => {
            "--conntrack-tcp-timeout-established (conntrack.tcpEstablishedTimeout)"
        }
        "nf_conntrack_tcp_timeout_close_wait" => {
            "--conntrack-tcp-timeout-close-wait (conntrack.tcpCloseWaitTimeout)"
        }
        "nf_conntrack_tcp_be_liberal" => "--conntrack-tcp-be-liberal (conntrack.tcpBeLiberal)",
        "nf_conntrack_udp_timeout" => "--conntrack-udp-timeout (conntrack.udpTimeout)",
        "nf_conntrack_udp_timeout_stream" => {
            "--conntrack-udp-timeout-stream (conntrack.udpStreamTimeout)"
        }
        _ => return None,
    })
}

/// The conntrack hash table should have a bucket per four entries (kube-proxy's rule).
fn raise_hashsize(buckets: u64) {
    let path = Path::new("/sys/module/nf_conntrack/parameters/hashsize");
    let current = std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    if current.is_some_and(|c| c >= buckets) {
        return;
    }
    if let Err(e) = std::fs::write(path, buckets.to_string()) {
        warn!("cannot set {} to {buckets} ({e})", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_that_cannot_be_written_says_what_stays_and_the_way_out() {
        let path = Path::new("/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established");
        let ro = std::io::Error::from(std::io::ErrorKind::ReadOnlyFilesystem);
        let said = cannot_set(path, 86400, Some(432000), &ro);
        assert!(
            said.contains("; continuing with 432000 (/proc/sys is read-only")
                && said.contains("conntrack values to 0"),
            "{said}"
        );
        // The table's size outside the host network namespace: why, and what to do on the
        // host (it said only "continuing with N", and the status advised kpng's flags).
        let max = Path::new("/proc/sys/net/netfilter/nf_conntrack_max");
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let said = cannot_set(max, 262144, Some(131072), &denied);
        assert!(
            said.contains("; continuing with 131072 (nf_conntrack_max is read-only here: not the host network namespace, or /proc/sys mounted read-only")
                && said.contains("set net.netfilter.nf_conntrack_max on the host")
                && said.contains("run kpng privileged in the host network namespace"),
            "{said}"
        );
        // A value the kernel refuses names the setting to change.
        let einval = std::io::Error::from_raw_os_error(22);
        let said = cannot_set(path, 3_600_000_000, Some(86400), &einval);
        assert!(
            said.starts_with(
                "--conntrack-tcp-timeout-established (conntrack.tcpEstablishedTimeout): cannot \
                 set /proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established to 3600000000"
            ),
            "{said}"
        );
        let other = std::io::Error::from(std::io::ErrorKind::NotFound);
        let said = cannot_set(path, 86400, None, &other);
        assert!(
            said.ends_with("continuing with the kernel's value"),
            "{said}"
        );
    }

    fn settings() -> ConntrackSettings {
        ConntrackSettings {
            max_per_core: 32768,
            min: 131072,
            tcp_established: Duration::from_secs(86400),
            tcp_close_wait: Duration::from_secs(3600),
            tcp_be_liberal: false,
            udp: Duration::ZERO,
            udp_stream: Duration::ZERO,
        }
    }

    #[test]
    fn table_size_is_per_core_with_a_floor() {
        let w = settings().writes(2);
        assert_eq!(
            w[0],
            ("net/netfilter/nf_conntrack_max", 131072, true),
            "2 × 32768 is below the minimum"
        );
        assert_eq!(settings().writes(8)[0].1, 262144);
        let none = ConntrackSettings {
            max_per_core: 0,
            ..settings()
        };
        assert!(
            none.writes(8)
                .iter()
                .all(|(n, _, _)| !n.ends_with("nf_conntrack_max"))
        );
    }

    #[test]
    fn applies_into_a_proc_tree_raising_but_never_lowering_the_size() {
        let dir = tempfile::tempdir().expect("tempdir");
        let nf = dir.path().join("net/netfilter");
        std::fs::create_dir_all(&nf).expect("mkdir");
        for (f, v) in [
            ("nf_conntrack_max", "524288"),
            ("nf_conntrack_tcp_timeout_established", "432000"),
            ("nf_conntrack_tcp_timeout_close_wait", "60"),
            ("nf_conntrack_tcp_be_liberal", "0"),
        ] {
            std::fs::write(nf.join(f), v).expect("write");
        }
        let s = ConntrackSettings {
            tcp_be_liberal: true,
            ..settings()
        };
        s.apply(dir.path(), 2);
        let read = |f: &str| std::fs::read_to_string(nf.join(f)).expect("read");
        assert_eq!(
            read("nf_conntrack_max"),
            "524288",
            "an administrator's larger value stands"
        );
        assert_eq!(read("nf_conntrack_tcp_timeout_established"), "86400");
        assert_eq!(read("nf_conntrack_tcp_timeout_close_wait"), "3600");
        assert_eq!(read("nf_conntrack_tcp_be_liberal"), "1");
        // A read-only or missing tree is only a warning.
        ConntrackSettings {
            udp: Duration::from_secs(30),
            ..settings()
        }
        .apply(Path::new("/nonexistent"), 2);
    }
}
