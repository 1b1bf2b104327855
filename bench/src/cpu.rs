//! CPU time of a process from `/proc/PID/stat`: what kpng spent (user + system, including the
//! children it has waited for, such as `iptables-restore`), not just how long it took.

use std::time::Duration;

/// Clock ticks per second (`getconf CLK_TCK`; 100 on Linux when it cannot be asked).
fn ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<f64>()
                .ok()
        })
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

/// User + system ticks (own and waited-for children) from the text of `/proc/PID/stat`.
fn ticks_of_stat(stat: &str) -> Option<u64> {
    // The command name is in parentheses and may hold spaces: count fields after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field 3 (state) is fields[0]: utime 14, stime 15, cutime 16, cstime 17.
    (11..=14)
        .map(|i| fields.get(i)?.parse::<u64>().ok())
        .sum::<Option<u64>>()
}

/// CPU time `pid` has used so far, if it still exists.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let ticks = ticks_of_stat(&stat)?;
    Some(Duration::from_secs_f64(ticks as f64 / ticks_per_second()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn sums_user_system_and_children() {
        let cases = [
            (
                "1234 (kpng) S 1 1234 1234 0 -1 4194560 500 0 0 0 150 30 7 3 20 0 4 0 100 0",
                Some(190),
            ),
            (
                "1234 (a (weird) name) R 1 1 1 0 -1 0 0 0 0 0 1 2 3 4 20 0 1 0 1 0",
                Some(10),
            ),
            ("1234 (short) S 1", None),
        ];
        for (stat, want) in cases {
            assert_eq!(super::ticks_of_stat(stat), want, "{stat}");
        }
    }
}
