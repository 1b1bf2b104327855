//! The two file systems the backend needs: the cgroup v2 hierarchy the programs attach to, and
//! a BPF file system (bpffs) that keeps maps and links alive across kpng restarts.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Error;

/// One line of `/proc/self/mountinfo`: where, and which file system type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The mount point.
    pub point: PathBuf,
    /// The file system type (`cgroup2`, `bpf`, …).
    pub fstype: String,
}

/// Parses `/proc/self/mountinfo` text (fields: id, parent, dev, root, point, options,
/// optional fields…, `-`, type, source, super options). Octal escapes (`\040`) in mount
/// points are decoded.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let point = fields.nth(4)?;
            let mut rest = fields.skip_while(|f| *f != "-");
            rest.next()?;
            let fstype = rest.next()?;
            Some(Mount {
                point: PathBuf::from(unescape(point)),
                fstype: fstype.to_owned(),
            })
        })
        .collect()
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let code: String = chars.by_ref().take(3).collect();
            match u8::from_str_radix(&code, 8) {
                Ok(b) => out.push(char::from(b)),
                Err(_) => {
                    out.push('\\');
                    out.push_str(&code);
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn mounts() -> Result<Vec<Mount>, Error> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| Error::io("reading /proc/self/mountinfo", e))?;
    Ok(parse_mountinfo(&text))
}

/// The root of the cgroup v2 hierarchy: the first `cgroup2` mount (`/sys/fs/cgroup` on a
/// unified host, `/sys/fs/cgroup/unified` on a hybrid one). `--cgroup-path`'s default.
pub fn cgroup2_root() -> Result<PathBuf, Error> {
    mounts()?
        .into_iter()
        .find(|m| m.fstype == "cgroup2")
        .map(|m| m.point)
        .ok_or_else(|| {
            Error::Setup(
                "no cgroup v2 file system is mounted (the socket programs attach to a cgroup v2 \
                 directory; mount one or pass --cgroup-path)"
                    .into(),
            )
        })
}

/// Where the pins go must be on a bpffs. When no bpffs holds `pin_dir` and it is under the
/// conventional `/sys/fs/bpf`, one is mounted there (`mount -t bpf bpf /sys/fs/bpf`, as
/// systemd does on most distributions).
pub fn ensure_bpffs(pin_dir: &Path) -> Result<(), Error> {
    let on_bpffs = |all: &[Mount]| {
        all.iter()
            .filter(|m| pin_dir.starts_with(&m.point))
            .max_by_key(|m| m.point.as_os_str().len())
            .is_some_and(|m| m.fstype == "bpf")
    };
    if on_bpffs(&mounts()?) {
        return Ok(());
    }
    let conventional = Path::new("/sys/fs/bpf");
    if !pin_dir.starts_with(conventional) {
        return Err(Error::Setup(format!(
            "{} is not on a BPF file system (mount one: mount -t bpf bpf DIR)",
            pin_dir.display()
        )));
    }
    std::fs::create_dir_all(conventional).map_err(|e| Error::io("creating /sys/fs/bpf", e))?;
    let out = Command::new("mount")
        .args(["-t", "bpf", "bpf", "/sys/fs/bpf"])
        .output()
        .map_err(|e| Error::io("running mount -t bpf bpf /sys/fs/bpf", e))?;
    if !out.status.success() {
        return Err(Error::Setup(format!(
            "mount -t bpf bpf /sys/fs/bpf failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    tracing::info!("mounted a BPF file system on /sys/fs/bpf");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_cgroup2_and_bpffs_in_mountinfo() {
        let text = "25 30 0:23 / /sys rw,nosuid shared:7 - sysfs sysfs rw\n\
                    41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw\n\
                    50 25 0:40 / /sys/fs/bpf rw - bpf bpf rw,mode=700\n\
                    51 25 0:41 / /run/with\\040space rw - tmpfs tmpfs rw\n";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 4);
        assert_eq!(m[1].point, PathBuf::from("/sys/fs/cgroup/unified"));
        assert_eq!(m[1].fstype, "cgroup2");
        assert_eq!(m[2].fstype, "bpf");
        assert_eq!(m[3].point, PathBuf::from("/run/with space"));
    }
}
