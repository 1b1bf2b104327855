//! `kpng_build_info` and the standard `process_*` metrics (CPU, memory, file descriptors,
//! start time), read at each scrape.
//!
//! Why: an operator graphs a proxy's cost next to its work, and compares the versions nodes
//! run, without a second exporter. The names are the Prometheus client libraries' own
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, …), so existing dashboards
//! and alerts work unchanged. Values come from `/proc/self` on Linux; elsewhere only the build
//! information is exported. Beside them, `kpng_process_max_resident_memory_bytes` (the peak,
//! VmHWM): what a memory request must hold is the start's peak, which a scrape of the current
//! resident size every 30 s misses (docs/deploy.md, "Sizing").

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::version::BuildInfo;

/// Registers both collectors on `registry`.
pub fn register(registry: &mut Registry) {
    registry.register_collector(Box::new(BuildInfoCollector(BuildInfo::current())));
    registry.register_collector(Box::new(ProcessCollector));
}

/// Registers `kpng_unclean_previous_exit`: 1 when the previous kpng of this network namespace
/// ended without a clean shutdown (killed, OOM; its run marker was still there at start,
/// [`crate::run_marker`]), 0 otherwise, for the life of the process. A crash loop of a
/// DaemonSet's pod then shows on a dashboard, not only in `dmesg`; the start's warning says
/// when the dead run was last seen alive ([`crate::run_marker::HEARTBEAT`]).
///
/// And `kpng_unhealthy_previous_exit`: 1 when it shut down cleanly while its syncs were
/// failing (the kubelet's SIGTERM after its `/livez` failed: a liveness-probe restart, which
/// left no trace before), 0 otherwise. Apart, as a crash and a liveness kill call for other
/// searches (`dmesg` for the one, the sync error in the start's warning for the other).
#[cfg(target_os = "linux")]
pub fn register_previous_exit(registry: &mut Registry, unclean: bool, unhealthy: bool) {
    let gauge = prometheus_client::metrics::gauge::Gauge::<i64>::default();
    gauge.set(i64::from(unclean));
    registry.register(
        "kpng_unclean_previous_exit",
        "1 when the previous kpng in this network namespace ended without a clean shutdown \
         (killed, OOM), 0 otherwise; the start's warning says when it was last seen alive \
         (it died within 10 s after).",
        gauge,
    );
    let gauge = prometheus_client::metrics::gauge::Gauge::<i64>::default();
    gauge.set(i64::from(unhealthy));
    registry.register(
        "kpng_unhealthy_previous_exit",
        "1 when the previous kpng in this network namespace shut down cleanly while its syncs \
         were failing (a liveness-probe restart, likely), 0 otherwise; the start's warning \
         says since when and the last error.",
        gauge,
    );
}

/// `kpng_build_info{version, git_commit, build_date, platform} 1`.
#[derive(Debug)]
struct BuildInfoCollector(BuildInfo);

impl Collector for BuildInfoCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let gauge = ConstGauge::new(1i64);
        let mut metric = encoder.encode_descriptor(
            "kpng_build_info",
            "The running kpng's version, git commit, build date and platform (value 1).",
            None,
            gauge.metric_type(),
        )?;
        let labels = vec![
            ("version", self.0.version.to_string()),
            ("git_commit", self.0.git_commit.to_string()),
            ("build_date", self.0.build_date.to_string()),
            ("kubernetes_schema", self.0.kubernetes_schema.to_string()),
            ("platform", self.0.platform.clone()),
        ];
        gauge.encode(metric.encode_family(&labels)?)
    }
}

/// The process's own resource use, read from `/proc/self` at each scrape.
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(sample) = proc::sample() else {
            return Ok(());
        };
        let counter = prometheus_client::metrics::counter::ConstCounter::new(sample.cpu_seconds);
        counter.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            counter.metric_type(),
        )?)?;
        let gauges: [(&str, &str, Option<f64>); 6] = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                sample.resident_bytes,
            ),
            (
                "kpng_process_max_resident_memory_bytes",
                "The highest resident memory size since the process started (VmHWM), in bytes: \
                 the start's peak, which a memory request must hold.",
                sample.max_resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                sample.virtual_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                sample.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors.",
                sample.max_fds,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                sample.start_time_seconds,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(value) = value {
                encode_gauge(&mut encoder, name, help, value)?;
            }
        }
        Ok(())
    }
}

/// Reading and parsing `/proc` (parsers are pure, for the tests).
mod proc {
    /// One reading; a value the system did not give is `None` and not exported.
    #[derive(Debug, Default, PartialEq)]
    pub struct Sample {
        pub cpu_seconds: f64,
        pub resident_bytes: Option<f64>,
        /// The peak resident size (VmHWM).
        pub max_resident_bytes: Option<f64>,
        pub virtual_bytes: Option<f64>,
        pub open_fds: Option<f64>,
        pub max_fds: Option<f64>,
        pub start_time_seconds: Option<f64>,
    }

    /// `/proc`'s clock-tick unit (USER_HZ): 100 on every Linux architecture's ABI.
    const TICKS_PER_SECOND: f64 = 100.0;

    /// Reads this process's figures; `None` where there is no `/proc` (not Linux).
    pub fn sample() -> Option<Sample> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let (utime, stime, start_ticks) = parse_stat(&stat)?;
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let boot_time = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| parse_boot_time(&s));
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        Some(Sample {
            cpu_seconds: (utime + stime) as f64 / TICKS_PER_SECOND,
            resident_bytes: status_kib(&status, "VmRSS:").map(|k| k * 1024.0),
            max_resident_bytes: status_kib(&status, "VmHWM:").map(|k| k * 1024.0),
            virtual_bytes: status_kib(&status, "VmSize:").map(|k| k * 1024.0),
            open_fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|d| d.count() as f64),
            max_fds: parse_max_open_files(&limits),
            start_time_seconds: boot_time
                .map(|boot| boot as f64 + start_ticks as f64 / TICKS_PER_SECOND),
        })
    }

    /// `utime`, `stime` and `starttime` (fields 14, 15 and 22) of `/proc/self/stat`. The
    /// command name (field 2) may hold spaces and parentheses: fields are counted after its
    /// last `)`.
    pub fn parse_stat(stat: &str) -> Option<(u64, u64, u64)> {
        let after_name = &stat[stat.rfind(')')? + 1..];
        // After the name: field 3 (state) is index 0.
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        Some((field(14)?, field(15)?, field(22)?))
    }

    /// A `Key:   123 kB` line of `/proc/self/status`, in KiB.
    pub fn status_kib(status: &str, key: &str) -> Option<f64> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        line[key.len()..].split_whitespace().next()?.parse().ok()
    }

    /// `btime` of `/proc/stat`: the boot time, seconds since the epoch.
    pub fn parse_boot_time(stat: &str) -> Option<u64> {
        stat.lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()
    }

    /// The soft limit of `Max open files` in `/proc/self/limits`.
    pub fn parse_max_open_files(limits: &str) -> Option<f64> {
        let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
        line["Max open files".len()..]
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn stat_fields_are_counted_after_the_name() {
            let stat = "4242 (kpng (a) b) S 1 4242 4242 0 -1 4194560 1523 0 0 0 250 75 0 0 20 0 \
                        9 0 123456 1048576 512 18446744073709551615";
            assert_eq!(parse_stat(stat), Some((250, 75, 123456)));
            assert_eq!(parse_stat("garbage"), None);
        }

        #[test]
        fn status_limits_and_boot_time_parse() {
            let status =
                "Name:\tkpng\nVmSize:\t  204800 kB\nVmHWM:\t    4096 kB\nVmRSS:\t    1536 kB\n";
            assert_eq!(status_kib(status, "VmRSS:"), Some(1536.0));
            assert_eq!(status_kib(status, "VmHWM:"), Some(4096.0));
            assert_eq!(status_kib(status, "VmSize:"), Some(204800.0));
            assert_eq!(status_kib(status, "VmSwap:"), None);
            let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                          Max open files            1048576              1048576              files\n";
            assert_eq!(parse_max_open_files(limits), Some(1048576.0));
            assert_eq!(
                parse_boot_time("cpu  1 2 3\nbtime 1764547200\nprocesses 9\n"),
                Some(1764547200)
            );
        }

        #[cfg(target_os = "linux")]
        #[test]
        fn this_process_is_sampled() {
            let s = sample().expect("a sample on Linux");
            assert!(s.resident_bytes.is_some_and(|b| b > 0.0), "{s:?}");
            // The peak is never below the current size.
            assert!(
                s.max_resident_bytes
                    .zip(s.resident_bytes)
                    .is_some_and(|(peak, now)| peak >= now),
                "{s:?}"
            );
            assert!(s.open_fds.is_some_and(|n| n >= 3.0), "{s:?}");
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970")
                .as_secs_f64();
            let start = s.start_time_seconds.expect("start time");
            assert!(
                start <= now + 1.0 && start > now - 86_400.0,
                "{start} vs {now}"
            );
        }
    }
}

/// Writes one gauge read at scrape time (a value kpng does not keep, but reads when asked):
/// the process's and the conntrack table's collectors share it.
pub(crate) fn encode_gauge<V: prometheus_client::encoding::EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: V,
) -> Result<(), std::fmt::Error> {
    let gauge = ConstGauge::new(value);
    gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)
}
