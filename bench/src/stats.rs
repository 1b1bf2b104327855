//! Percentiles and the machine description every report starts with.

use std::process::Command;

/// The `p`-th percentile (0–100) of `values` (sorted in place).
pub fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * (values.len() - 1) as f64).round() as usize;
    values[rank.min(values.len() - 1)]
}

fn command_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or_default()
                .trim()
                .to_string()
        })
        .unwrap_or_default()
}

/// Machine, kernel and nft versions, as a markdown paragraph.
pub fn machine_header() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    format!(
        "\nMachine: {cpus} vCPU ({cpu}); kernel {}; {}.\n",
        command_line("uname", &["-r"]),
        command_line("nft", &["--version"])
    )
}

/// (busy, total) jiffies of all CPUs, from the first line of `/proc/stat`.
fn cpu_jiffies() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().sum();
    // idle and iowait are the 4th and 5th fields.
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

/// Waits (at most `limit`) until the CPUs were at least 90% idle over one second, and returns
/// how long that took.
///
/// Deleting a namespace that held hundreds of thousands of nftables elements and conntrack
/// entries goes on in kernel workers for seconds after the benchmark that made it returned; a
/// latency measurement started meanwhile shares the two vCPUs with that clean-up.
pub fn wait_for_idle(limit: std::time::Duration) -> std::time::Duration {
    let started = std::time::Instant::now();
    while started.elapsed() < limit {
        let Some((busy0, total0)) = cpu_jiffies() else {
            break;
        };
        std::thread::sleep(std::time::Duration::from_secs(1));
        let Some((busy1, total1)) = cpu_jiffies() else {
            break;
        };
        let busy = busy1.saturating_sub(busy0) as f64 / total1.saturating_sub(total0).max(1) as f64;
        if busy < 0.10 {
            break;
        }
    }
    started.elapsed()
}
