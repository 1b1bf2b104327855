//! cgroup v2 groups for the processes of test namespaces, for backends whose scope is a cgroup
//! rather than a network namespace (the eBPF backend's socket programs translate the sockets
//! of one cgroup subtree). On one test machine every namespace shares the cgroup tree, so a
//! test puts the processes that stand for "this node" (the node and its pods) in one group
//! and the ones that stand for "elsewhere" in another.
//!
//! Opt-in per namespace: [`assign`] records the group in `/run/kpng-testkit-cgroups/NAME`, and
//! [`crate::Netns::command`] then starts every program of that namespace inside the group
//! (`sh -c 'echo $$ > GROUP/cgroup.procs; exec …'`: the pid stays the program's). Namespaces
//! without a record run as before.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};

/// Where the cgroup v2 hierarchy is mounted for tests (outside `/sys`: `ip netns exec`
/// remounts `/sys`, so a path under it would not exist for the programs it starts).
pub const CGROUP2_MOUNT: &str = "/run/kpng-testkit-cgroup2";

/// Where the namespace → group records live.
const RECORDS: &str = "/run/kpng-testkit-cgroups";

fn mounted(point: &str) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|t| {
        t.lines()
            .any(|l| l.split(' ').nth(4) == Some(point) && l.contains(" - cgroup2 "))
    })
}

/// Creates (or reuses) the test group `name` under [`CGROUP2_MOUNT`]/`kpng-tests`, mounting
/// the hierarchy there first when needed. Returns its directory.
pub fn create(name: &str) -> Result<PathBuf> {
    // One mount per process, even when parallel tests ask at once.
    static MOUNT: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = MOUNT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !mounted(CGROUP2_MOUNT) {
        std::fs::create_dir_all(CGROUP2_MOUNT)
            .map_err(|e| Error::io(format!("creating {CGROUP2_MOUNT}"), e))?;
        let out = Command::new("mount")
            .args(["-t", "cgroup2", "none", CGROUP2_MOUNT])
            .output()
            .map_err(|e| Error::io("running mount -t cgroup2", e))?;
        if !out.status.success() && !mounted(CGROUP2_MOUNT) {
            return Err(Error::Other(format!(
                "mount -t cgroup2 none {CGROUP2_MOUNT}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    let dir = Path::new(CGROUP2_MOUNT).join("kpng-tests").join(name);
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    Ok(dir)
}

/// Runs every later program of namespace `ns` inside the group `group`.
pub fn assign(ns: &str, group: &Path) -> Result<()> {
    std::fs::create_dir_all(RECORDS).map_err(|e| Error::io(format!("creating {RECORDS}"), e))?;
    let record = Path::new(RECORDS).join(ns);
    std::fs::write(&record, group.display().to_string())
        .map_err(|e| Error::io(format!("writing {}", record.display()), e))
}

/// The group recorded for namespace `ns`, if any.
pub fn of(ns: &str) -> Option<PathBuf> {
    std::fs::read_to_string(Path::new(RECORDS).join(ns))
        .ok()
        .map(|s| PathBuf::from(s.trim()))
}

/// Forgets namespace `ns`'s record and removes its group once empty (best effort: a group
/// other namespaces still use stays). A process killed with the namespace may take a moment
/// to leave the group (a many-threaded kpng does), so an occupied group is retried for up to
/// two seconds rather than left behind.
pub(crate) fn forget(ns: &str) {
    let Some(group) = of(ns) else { return };
    let _ = std::fs::remove_file(Path::new(RECORDS).join(ns));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let removed = loop {
        match std::fs::remove_dir(&group) {
            Ok(()) => break true,
            Err(e)
                if e.kind() == std::io::ErrorKind::ResourceBusy
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(_) => break false,
        }
    };
    if removed && let Some(parent) = group.parent() {
        let _ = std::fs::remove_dir(parent);
    }
}

/// Where tests mount a BPF file system for pins (outside `/sys`, for the same reason as
/// [`CGROUP2_MOUNT`]).
pub const BPFFS_MOUNT: &str = "/run/kpng-testkit-bpf";

/// Mounts a bpffs on [`BPFFS_MOUNT`] unless one is there; returns the mount point. Pins of one
/// test go in a directory of their own below it.
pub fn bpffs() -> Result<PathBuf> {
    // Parallel tests mounting at once would stack two file systems (and hide pins).
    static MOUNT: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = MOUNT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mounted = std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|t| {
        t.lines()
            .any(|l| l.split(' ').nth(4) == Some(BPFFS_MOUNT) && l.contains(" - bpf "))
    });
    if !mounted {
        std::fs::create_dir_all(BPFFS_MOUNT)
            .map_err(|e| Error::io(format!("creating {BPFFS_MOUNT}"), e))?;
        let out = Command::new("mount")
            .args(["-t", "bpf", "bpf", BPFFS_MOUNT])
            .output()
            .map_err(|e| Error::io("running mount -t bpf", e))?;
        if !out.status.success() {
            return Err(Error::Other(format!(
                "mount -t bpf bpf {BPFFS_MOUNT}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    Ok(PathBuf::from(BPFFS_MOUNT))
}

/// The pin directory of the eBPF backend run in node namespace `node` (below [`BPFFS_MOUNT`],
/// one per node, so that tests running side by side never adopt each other's maps).
pub fn socket_pins(node: &str) -> PathBuf {
    Path::new(BPFFS_MOUNT).join(node)
}

/// The eBPF backend's scope in a test cluster whose node namespace is `node`
/// (`{prefix}-node1-{pid}-{n}`): a cgroup holding that node's namespace and its pods' (every
/// later program they run: "this node"), another holding the cluster's other namespaces (the
/// external client, the other nodes and their pods: "outside the node"), and the test bpffs
/// mounted for the pins. Returns (the node's cgroup, the pin directory).
///
/// It goes by name because the cluster's namespaces share `{prefix}-` and `-{pid}-` (prefixes
/// are unique per test binary), so a test holding only the node's namespace can scope it.
pub fn socket_scope(node: &str) -> Result<(PathBuf, PathBuf)> {
    let parts: Vec<&str> = node.rsplitn(4, '-').collect();
    let [_, pid, role, prefix] = parts.as_slice() else {
        return Err(Error::Other(format!(
            "{node} is not a test cluster's node namespace (PREFIX-nodeN-PID-N)"
        )));
    };
    let node_tag = role.trim_start_matches("node");
    let local = create(&format!("{node}/local"))?;
    let outside = create(&format!("{node}/outside"))?;
    let listed = std::fs::read_dir("/run/netns").map_err(|e| Error::io("listing /run/netns", e))?;
    for entry in listed.flatten() {
        let Ok(other) = entry.file_name().into_string() else {
            continue;
        };
        let Some(rest) = other.strip_prefix(&format!("{prefix}-")) else {
            continue;
        };
        let Some((other_role, tail)) = rest.split_once('-') else {
            continue;
        };
        if !tail.starts_with(&format!("{pid}-")) || of(&other).is_some() {
            continue;
        }
        let mine = other_role == *role || other_role.starts_with(&format!("pod{node_tag}"));
        assign(&other, if mine { &local } else { &outside })?;
    }
    bpffs()?;
    Ok((local, socket_pins(node)))
}
