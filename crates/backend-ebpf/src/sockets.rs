//! Connected UDP sockets whose endpoint left are destroyed (`SOCK_DESTROY` through sock_diag,
//! with `ss -K`), the way kube-proxy's conntrack reconciler deletes the UDP conntrack entries
//! of a gone endpoint: the application sees `ECONNABORTED` and opens a new socket, which the
//! programs translate to a current endpoint. Unconnected sockets need nothing: every
//! `sendmsg()` is translated anew.
//!
//! sock_diag works on one network namespace at a time, and pods have their own: the namespaces
//! are found from the processes of the cgroup subtree the programs are attached to (one
//! `nsenter … ss -K` per namespace, only when a UDP endpoint leaves).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use tracing::{debug, warn};

/// One process per network namespace of the cgroup subtree at `cgroup`: namespace inode →
/// pid.
fn namespaces(cgroup: &Path) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![cgroup.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            for pid in procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                if let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/net")) {
                    out.entry(ns.display().to_string()).or_insert(pid);
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(&dir) {
            dirs.extend(
                entries
                    .filter_map(Result::ok)
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    out
}

/// The `ss` filter selecting sockets connected to any of `endpoints`.
pub fn filter(endpoints: &[SocketAddr]) -> Vec<String> {
    let mut words = vec!["(".to_owned()];
    for (i, ep) in endpoints.iter().enumerate() {
        if i > 0 {
            words.push("or".into());
        }
        words.push("dst".into());
        words.push(match ep {
            SocketAddr::V4(a) => format!("{}:{}", a.ip(), a.port()),
            SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
        });
    }
    words.push(")".into());
    words
}

/// Destroys the UDP sockets connected to `endpoints` in every network namespace of the cgroup
/// subtree; returns how many were destroyed.
pub fn destroy_udp(cgroup: &Path, endpoints: &[SocketAddr]) -> usize {
    if endpoints.is_empty() {
        return 0;
    }
    let filter = filter(endpoints);
    let mut destroyed = 0;
    for (ns, pid) in namespaces(cgroup) {
        let out = Command::new("nsenter")
            .arg(format!("--net=/proc/{pid}/ns/net"))
            .args(["ss", "-K", "-H", "-n", "-u"])
            .args(&filter)
            .output();
        match out {
            Ok(o) if o.status.success() => {
                let n = String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .count();
                if n > 0 {
                    debug!("destroyed {n} UDP sockets in {ns} (pid {pid})");
                }
                destroyed += n;
            }
            Ok(o) => warn!(
                "ss -K in {ns} (pid {pid}) failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            // The process left meanwhile, or nsenter/ss are missing.
            Err(e) => warn!("cannot run nsenter … ss -K for {ns}: {e}"),
        }
    }
    destroyed
}

#[cfg(test)]
mod tests {
    #[test]
    fn filter_lists_every_endpoint() {
        let eps = [
            "10.0.0.1:53".parse().expect("sa"),
            "[fd00::1]:53".parse().expect("sa"),
        ];
        assert_eq!(
            super::filter(&eps).join(" "),
            "( dst 10.0.0.1:53 or dst [fd00::1]:53 )"
        );
    }
}
