//! kpng programs attached *below* the cgroups kpng looks at, by links no running process holds.
//!
//! Why: an eBPF kpng run with `--cgroup-path` on a subtree (not the root) and stopped leaves
//! its programs attached there, pinned where the next kpng may not look (another
//! `--bpf-pin-path`, a bpffs of its own). The effective programs of the cgroup root and of
//! kpng's own cgroup ([`crate::kernel::node_programs`]) do not include a descendant's, so a
//! switch to nftables or iptables left them translating the subtree's sockets from maps nobody
//! updates, and `kpng status` said all was well. The kernel's list of links
//! ([`crate::links::cgroup_links`]) has every one of them, wherever attached and pinned.
//!
//! Only links no running kpng owns count ([`crate::owners`]: held open by a running process,
//! its program held, or pinned in a pin directory a running kpng has locked): an owned link
//! is a running eBPF kpng's (another node's on a host of several, as kind's, or a test's),
//! whose maps are kept up to date. And
//! only links on a cgroup found below the cgroups asked about: a cgroup outside them (another
//! node's container, in a cgroup namespace of its own) is not this node's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use crate::links::CgroupProgram;

/// A kpng program attached below one of the cgroups asked about by a link nobody holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stray {
    /// The name of kpng's program for its hook.
    pub name: &'static str,
    /// The program.
    pub program: CgroupProgram,
    /// The cgroup v2 directory it is attached to.
    pub cgroup: PathBuf,
}

impl Stray {
    /// In words: `kpng_connect4 (program 812, attached to cgroup /sys/fs/cgroup/x)`.
    pub fn describe(&self) -> String {
        format!(
            "{} (program {}, attached to cgroup {})",
            self.name,
            self.program.id,
            self.cgroup.display()
        )
    }
}

/// Every kpng program (by name: `kpng_*`, on one of kpng's hooks) that a link no running
/// kpng owns ([`crate::owners`]) attaches to one of `cgroups` or a cgroup below it. The cgroup tree is walked
/// only when the kernel has such links, and only until all of them are placed.
pub fn find(cgroups: &[PathBuf]) -> std::io::Result<Vec<Stray>> {
    let links = crate::links::cgroup_links()?;
    let kpngs: Vec<(&'static str, CgroupProgram, u64, &crate::links::CgroupLink)> = links
        .iter()
        .filter(|l| l.cgroup_id != 0)
        .filter_map(|l| {
            let hook = crate::kernel::program_for(l.attach_type)?;
            // Gone since the walk: nothing to report.
            let name = crate::links::program_name_by_id(l.program).ok()?;
            name.starts_with("kpng_").then(|| {
                let program = CgroupProgram {
                    id: l.program,
                    name,
                    attach_type: l.attach_type,
                };
                (hook, program, l.cgroup_id, l)
            })
        })
        .collect();
    if kpngs.is_empty() {
        return Ok(Vec::new());
    }
    // Looked for only when the kernel has kpng links: a walk of /proc and of the bpffs mounts.
    let owners = crate::owners::Owners::find();
    let candidates: Vec<(&'static str, CgroupProgram, u64)> = kpngs
        .into_iter()
        .filter(|(_, _, _, l)| owners.of(l).is_none())
        .map(|(hook, program, cgroup, _)| (hook, program, cgroup))
        .collect();
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    let wanted: BTreeSet<u64> = candidates.iter().map(|(_, _, c)| *c).collect();
    let places = cgroup_dirs(cgroups, &wanted);
    let mut out: Vec<Stray> = Vec::new();
    for (name, program, cgroup_id) in candidates {
        let Some(cgroup) = places.get(&cgroup_id) else {
            continue;
        };
        if out.iter().any(|s| s.program.id == program.id) {
            continue;
        }
        out.push(Stray {
            name,
            program,
            cgroup: cgroup.clone(),
        });
    }
    Ok(out)
}

/// The directories, by cgroup id (inode), of the cgroups in `wanted` found at or below one of
/// `roots`; the walk stops once every one is found. Directories that cannot be read are
/// skipped.
pub fn cgroup_dirs(roots: &[PathBuf], wanted: &BTreeSet<u64>) -> BTreeMap<u64, PathBuf> {
    let mut found = BTreeMap::new();
    let mut seen = BTreeSet::new();
    let mut stack: Vec<PathBuf> = roots.to_vec();
    while let Some(dir) = stack.pop() {
        if found.len() == wanted.len() {
            break;
        }
        let Ok(id) = crate::links::cgroup_id(&dir) else {
            continue;
        };
        if !seen.insert(id) {
            continue;
        }
        if wanted.contains(&id) {
            found.insert(id, dir.clone());
        }
        stack.extend(crate::owners::subdirectories(&dir));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The walk finds directories by inode at any depth, below every root, each once, and
    /// nothing outside the roots.
    #[test]
    fn cgroup_directories_are_found_by_id_below_the_roots() {
        let tmp = std::env::temp_dir().join(format!("kpng-strays-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let deep = tmp.join("root/a/b/c");
        let outside = tmp.join("elsewhere/d");
        for d in [&deep, &outside, &tmp.join("root/e")] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        let id = |p: &Path| crate::links::cgroup_id(p).expect("inode");
        let wanted: BTreeSet<u64> = [id(&deep), id(&outside), id(&tmp.join("root/e"))].into();
        let roots = [tmp.join("root"), tmp.join("root/a")];
        let found = cgroup_dirs(&roots, &wanted);
        assert_eq!(found.get(&id(&deep)), Some(&deep));
        assert_eq!(
            found.get(&id(&tmp.join("root/e"))),
            Some(&tmp.join("root/e"))
        );
        assert_eq!(found.get(&id(&outside)), None, "not below a root");
        assert_eq!(found.len(), 2);
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
