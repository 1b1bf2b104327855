//! Which running kpng owns a cgroup link: the sweeps of another backend and `kpng cleanup`
//! detach only the kpng links that nobody owns ([`crate::strays`], [`crate::kernel`]).
//!
//! Why: the kernel's list of links is the host's, and so is the cgroup tree below the root a
//! kpng sees. On a host of several nodes (kind, or tests whose network namespaces stand for
//! nodes) an nftables kpng's sweep sees the links of an eBPF kpng that runs for another node.
//! Until 2026-12-07 a link counted as owned only when a process this kpng could see held it
//! open (`/proc/PID/fd`): an nftables kpng in a PID namespace of its own (a DaemonSet without
//! `hostPID`), or one not allowed to read the other's fds, saw nobody holding them and
//! detached a running eBPF kpng's programs, whose node then lost socket load balancing.
//!
//! Now a link is owned when any of these says so:
//! - a visible process holds the link open, or its program (a running eBPF kpng holds both);
//! - it is pinned in the `links` directory of a pin directory on which a running kpng holds
//!   its instance lock (the `flock` of [`crate::host::lock_pins`]), found on every bpffs this
//!   kpng sees. `/proc/locks` names the holder when it is of this PID namespace (and hides
//!   the lock otherwise); the lock itself is tried then, which works across PID namespaces.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::links::CgroupLink;

/// How deep below a bpffs mount point a pin directory is looked for (`/sys/fs/bpf/kpng` is
/// one level down).
const PIN_DIR_DEPTH: usize = 4;

/// Who owns which links, found once for one sweep or status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owners {
    held: crate::links::Held,
    /// Link id → the locked pin directory pinning it, with the lock's pid when visible.
    pinned: BTreeMap<u32, String>,
}

impl Owners {
    /// Looks at every process's bpf fds and at the locked pin directories of every bpffs
    /// this process sees.
    pub fn find() -> Owners {
        Owners {
            held: crate::links::held(),
            pinned: locked_pins(),
        }
    }

    /// Who owns `link`, in words (`pid 812`, `pid 812, which holds its program`, `the kpng
    /// whose pin directory /sys/fs/bpf/kpng is locked (pid 812)`), if anyone.
    pub fn of(&self, link: &CgroupLink) -> Option<String> {
        if let Some(pid) = self.held.links.get(&link.id) {
            return Some(format!("pid {pid}"));
        }
        if let Some(pid) = self.held.programs.get(&link.program) {
            return Some(format!("pid {pid}, which holds its program"));
        }
        self.pinned.get(&link.id).cloned()
    }
}

/// The links pinned in the `links` directory of a pin directory that a running kpng has
/// locked, on any bpffs mounted where this process sees it.
fn locked_pins() -> BTreeMap<u32, String> {
    let mut out = BTreeMap::new();
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    let locked = flocks(&locks);
    let points: BTreeSet<PathBuf> = crate::host::mounts()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.fstype == "bpf")
        .map(|m| m.point)
        .collect();
    let mut seen = BTreeSet::new();
    for point in points {
        let mut stack = vec![(point, 0usize)];
        while let Some((dir, depth)) = stack.pop() {
            let Ok(meta) = std::fs::metadata(&dir) else {
                continue;
            };
            let key = (meta.dev(), meta.ino());
            if !meta.is_dir() || !seen.insert(key) {
                continue;
            }
            let links = dir.join(crate::kernel::LINKS);
            if links.is_dir() {
                // /proc/locks hides the locks of processes outside this PID namespace: those
                // are found by trying the lock (as `lock_pins` of a second kpng would).
                let dev = (libc::major(meta.dev()), libc::minor(meta.dev()));
                let owner = match locked.get(&(dev, meta.ino())) {
                    Some(&pid) if pid != 0 => Some(format!(
                        "the kpng whose pin directory {} is locked (pid {pid})",
                        dir.display()
                    )),
                    _ => crate::host::pins_in_use(&dir).then(|| {
                        format!(
                            "the kpng whose pin directory {} is locked (by a process this one \
                             cannot see)",
                            dir.display()
                        )
                    }),
                };
                if let Some(owner) = owner {
                    for link in pinned_in(&links) {
                        out.entry(link).or_insert_with(|| owner.clone());
                    }
                }
            }
            if depth < PIN_DIR_DEPTH {
                stack.extend(subdirectories(&dir).into_iter().map(|d| (d, depth + 1)));
            }
        }
    }
    out
}

/// The ids of the links pinned directly in `dir`.
fn pinned_in(dir: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| crate::links::pinned_link_id(&e.path()).ok())
        .collect()
}

/// The subdirectories of `dir` (symbolic links not followed); unreadable entries are skipped.
/// Shared with [`crate::strays`], whose cgroup walk lists directories the same way.
pub(crate) fn subdirectories(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

/// The files `flock`ed, by (device major, minor, inode), with the holder's pid (0: not
/// visible from this PID namespace, or not a local process), from `/proc/locks` text (`1: FLOCK  ADVISORY  WRITE 812
/// 00:2a:1057 0 EOF`; waiting requests, `1: -> FLOCK …`, are not locks held).
fn flocks(text: &str) -> BTreeMap<((u32, u32), u64), u32> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.get(1) != Some(&"FLOCK") {
                return None;
            }
            // Negative for remote locks: not a pid either.
            let pid = fields.get(4)?.parse::<i64>().ok()?;
            let pid = u32::try_from(pid).unwrap_or(0);
            let mut place = fields.get(5)?.split(':');
            let major = u32::from_str_radix(place.next()?, 16).ok()?;
            let minor = u32::from_str_radix(place.next()?, 16).ok()?;
            let inode = place.next()?.parse().ok()?;
            Some((((major, minor), inode), pid))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Held flocks are read with their device and pid; waiting requests and POSIX locks are
    /// not owners; an invisible holder's pid is 0.
    #[test]
    fn flocks_are_read_from_proc_locks() {
        let text = "1: FLOCK  ADVISORY  WRITE 812 00:2a:1057 0 EOF\n\
                    1: -> FLOCK  ADVISORY  WRITE 813 00:2a:1057 0 EOF\n\
                    2: POSIX  ADVISORY  WRITE 900 fd:01:77 0 EOF\n\
                    3: FLOCK  ADVISORY  WRITE 0 103:0b:99 0 EOF\n\
                    garbage\n";
        let found = flocks(text);
        assert_eq!(
            found,
            BTreeMap::from([(((0, 0x2a), 1057), 812), (((0x103, 0x0b), 99), 0)])
        );
    }

    /// A link held open, or whose program is held, is owned, by the first evidence; a link
    /// nobody holds or pins in a locked directory is not.
    #[test]
    fn a_link_is_owned_when_held_or_its_program_is() {
        let mut owners = Owners::default();
        owners.held.links.insert(1, 100);
        owners.held.programs.insert(20, 200);
        owners
            .pinned
            .insert(3, "the kpng whose pin directory /p is locked".into());
        let link = |id, program| CgroupLink {
            id,
            program,
            cgroup_id: 7,
            attach_type: 0,
        };
        let cases = [
            (link(1, 20), Some("pid 100")),
            (link(2, 20), Some("pid 200, which holds its program")),
            (
                link(3, 30),
                Some("the kpng whose pin directory /p is locked"),
            ),
            (link(4, 40), None),
        ];
        for (l, want) in cases {
            assert_eq!(owners.of(&l).as_deref(), want, "{l:?}");
        }
    }
}
