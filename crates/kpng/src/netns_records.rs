//! The per-network-namespace records kpng keeps in `/run/kpng` (the iptables backend's
//! `route_localnet.<netns inode>`, the conntrack cleanup's `conntrack-checked.<netns inode>`,
//! the run marker `running.<netns inode>`), forgotten once their namespace is gone.
//!
//! Why: a namespace deleted without `kpng cleanup` (a kind-style node torn down, a test
//! namespace, `ip netns del`) leaves its records, and they pile up over the host's uptime.
//! Worse, the kernel reuses namespace inodes: a later namespace given the same inode would
//! read the dead one's record as its own (the conntrack memory would skip the walks a fresh
//! table needs). A starting kpng and `kpng cleanup` therefore remove the records of
//! namespaces no process, thread or bind mount holds any more.
//!
//! Forgetting is the safe side: a record wrongly removed costs the next start one full
//! conntrack walk per UDP frontend, or leaves `route_localnet` at 1 after a cleanup. So the
//! sweep runs only where kpng sees every process of the host (the initial PID namespace): in
//! a Pod without `hostPID` every other namespace would look gone.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The record names, each followed by `.<netns inode>` (and `.tmp` while being written).
const RECORD_PREFIXES: [&str; 3] = [
    "route_localnet.",
    "conntrack-checked.",
    crate::run_marker::PREFIX,
];

/// The inode of the kernel's initial PID namespace (`PROC_PID_INIT_INO`): only a process in
/// it sees every process of the host in `/proc`.
const INITIAL_PID_NAMESPACE: u64 = 0xEFFF_FFFC;

/// The namespace inode a record file is for, `None` for any other file.
fn record_namespace(file_name: &str) -> Option<u64> {
    let rest = RECORD_PREFIXES
        .iter()
        .find_map(|prefix| file_name.strip_prefix(prefix))?;
    let inode = rest.strip_suffix(".tmp").unwrap_or(rest);
    inode.parse().ok()
}

/// The network namespaces something holds: a process's or thread's (`/proc/*/ns/net`,
/// `/proc/*/task/*/ns/net`) or a bind mount's (`ip netns add`'s, CNI's), as this process's
/// and the host's mount tables show them (`net:[<inode>]`).
pub fn live_namespaces() -> HashSet<u64> {
    let mut live = HashSet::new();
    let inode = |path: PathBuf| std::fs::metadata(path).ok().map(|m| m.ino());
    let numeric = |dir: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .bytes()
                    .all(|b| b.is_ascii_digit())
            })
            .map(|e| e.path())
            .collect()
    };
    for process in numeric(Path::new("/proc")) {
        live.extend(inode(process.join("ns/net")));
        for thread in numeric(&process.join("task")) {
            live.extend(inode(thread.join("ns/net")));
        }
    }
    // This process's mount table and the host's (init's): `ip netns exec` runs kpng in a
    // mount namespace of its own, which may not see a bind mount made after it began.
    for table in ["/proc/self/mountinfo", "/proc/1/mountinfo"] {
        if let Ok(mounts) = std::fs::read_to_string(table) {
            live.extend(mounts.lines().filter_map(|line| {
                let root = line.split(' ').nth(3)?;
                root.strip_prefix("net:[")?
                    .strip_suffix(']')?
                    .parse::<u64>()
                    .ok()
            }));
        }
    }
    live
}

/// The record files in `state_dir` whose namespace is not in `live`.
pub fn gone_records(state_dir: &Path, live: &HashSet<u64>) -> Vec<PathBuf> {
    let mut gone: Vec<PathBuf> = std::fs::read_dir(state_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| {
            record_namespace(&entry.file_name().to_string_lossy())
                .is_some_and(|netns| !live.contains(&netns))
        })
        .map(|entry| entry.path())
        .collect();
    gone.sort();
    gone
}

/// Whether this process sees every process of the host (see the module doc).
fn sees_every_process() -> bool {
    std::fs::metadata("/proc/self/ns/pid").is_ok_and(|m| m.ino() == INITIAL_PID_NAMESPACE)
}

/// Removes (or, for a dry run, names) the records of gone namespaces in `state_dir`; returns
/// what it removed or would remove. Failures are logged, never fatal: the records are only
/// an optimisation and a restore.
pub fn forget_gone(state_dir: &Path, dry_run: bool) -> Vec<PathBuf> {
    if !sees_every_process() {
        tracing::debug!(
            "not in the host's PID namespace: records of gone network namespaces in {} are \
             left alone",
            state_dir.display()
        );
        return Vec::new();
    }
    let gone = gone_records(state_dir, &live_namespaces());
    if dry_run {
        return gone;
    }
    gone.into_iter()
        .filter(|record| match std::fs::remove_file(record) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => {
                tracing::warn!("removing {}: {e}", record.display());
                false
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_names_give_their_namespace() {
        let cases = [
            ("route_localnet.4026531840", Some(4026531840)),
            ("conntrack-checked.4026532261", Some(4026532261)),
            ("conntrack-checked.4026532261.tmp", Some(4026532261)),
            ("conntrack-checked.", None),
            ("conntrack-checked.x", None),
            ("running.4026532261", Some(4026532261)),
            ("running.4026532261.tmp", Some(4026532261)),
            ("kpng.sock", None),
            ("kpng-nft.lock", None),
            ("cgroupv2", None),
        ];
        for (name, want) in cases {
            assert_eq!(record_namespace(name), want, "{name}");
        }
    }

    #[test]
    fn only_the_records_of_namespaces_nothing_holds_are_gone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let own = std::fs::metadata("/proc/self/ns/net")
            .expect("own netns")
            .ino();
        let live = live_namespaces();
        assert!(live.contains(&own), "own namespace {own} not found live");
        // Inode 1 is never a namespace's.
        let files = [
            (format!("conntrack-checked.{own}"), false),
            (format!("route_localnet.{own}"), false),
            ("conntrack-checked.1".to_string(), true),
            ("route_localnet.1".to_string(), true),
            (format!("running.{own}"), false),
            ("running.1".to_string(), true),
            ("conntrack-checked.1.tmp".to_string(), true),
            ("kpng.sock".to_string(), false),
        ];
        for (name, _) in &files {
            std::fs::write(dir.path().join(name), "x").expect("write");
        }
        let mut want: Vec<PathBuf> = files
            .iter()
            .filter(|(_, gone)| *gone)
            .map(|(name, _)| dir.path().join(name))
            .collect();
        want.sort();
        assert_eq!(gone_records(dir.path(), &live), want);
    }
}
