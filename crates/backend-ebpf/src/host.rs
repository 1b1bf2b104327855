//! The two file systems the backend needs: the cgroup v2 hierarchy the programs attach to, and
//! a BPF file system (bpffs) that keeps maps and links alive across kpng restarts.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Error;

/// One line of `/proc/self/mountinfo`: where, what of the file system, and which type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The directory of the file system this mount shows: `/` for a whole file system, a
    /// subdirectory for a bind mount (for cgroup v2, a container's own cgroup).
    pub root: PathBuf,
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
            let root = fields.nth(3)?;
            let point = fields.next()?;
            let mut rest = fields.skip_while(|f| *f != "-");
            rest.next()?;
            let fstype = rest.next()?;
            Some(Mount {
                root: PathBuf::from(unescape(root)),
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

pub(crate) fn mounts() -> Result<Vec<Mount>, Error> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| Error::io("reading /proc/self/mountinfo", e))?;
    Ok(parse_mountinfo(&text))
}

/// Where kpng mounts the cgroup v2 hierarchy when none is visible (see [`cgroup2_root`]).
pub const OWN_CGROUP2_MOUNT: &str = "/run/kpng/cgroupv2";

/// The root of the cgroup v2 hierarchy, `--cgroup-path`'s default: the first `cgroup2` mount
/// of a whole hierarchy (`/sys/fs/cgroup` on a unified host, `/sys/fs/cgroup/unified` on a
/// hybrid one). A bind mount of a subtree (a container's own cgroup) is not the root: attached
/// there, the programs would translate that container's sockets only, and nobody would be told.
///
/// When no whole hierarchy is visible, one is mounted on [`OWN_CGROUP2_MOUNT`], as Cilium
/// mounts its own: `ip netns exec` (which remounts `/sys` for the namespace and so hides
/// `/sys/fs/cgroup`) and a container with a bind-mounted cgroup both end up here, and the
/// mount shows the whole hierarchy of kpng's cgroup namespace.
pub fn cgroup2_root() -> Result<PathBuf, Error> {
    if let Some(root) = whole_cgroup2(&mounts()?) {
        return Ok(root);
    }
    mount("cgroup2", Path::new(OWN_CGROUP2_MOUNT)).map_err(|e| {
        Error::Setup(format!(
            "no cgroup v2 hierarchy is mounted and mounting one failed ({e}); the socket \
             programs attach to a cgroup v2 directory: mount one or pass --cgroup-path"
        ))
    })?;
    tracing::info!(
        "no cgroup v2 hierarchy was visible (a private mount namespace, such as `ip netns exec` \
         makes, hides /sys/fs/cgroup): mounted one on {OWN_CGROUP2_MOUNT}"
    );
    Ok(PathBuf::from(OWN_CGROUP2_MOUNT))
}

/// This process's own cgroup v2 directory under `root` (a [`cgroup2_root`]), from
/// `/proc/self/cgroup`: the programs that run for its sockets are those of the node's pods
/// too, wherever they are attached (the node's root, above a container's cgroup namespace).
/// `None` when it cannot be read or is not below `root`.
pub fn own_cgroup(root: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let dir = root.join(unified_cgroup(&text)?.trim_start_matches('/'));
    dir.is_dir().then_some(dir)
}

/// The cgroup v2 path (`0::PATH`) of `/proc/PID/cgroup` text, if it is below the namespace's
/// root (a path with `..` is a cgroup outside the namespace).
fn unified_cgroup(text: &str) -> Option<&str> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .filter(|p| p.starts_with('/') && !p.split('/').any(|c| c == ".."))
}

/// The root of the cgroup v2 hierarchy if one is mounted where this process sees it, without
/// mounting one as [`cgroup2_root`] does: for what only looks (`kpng status`).
pub fn visible_cgroup2_root() -> Option<PathBuf> {
    whole_cgroup2(&mounts().ok()?)
}

/// The inode of the kernel's initial cgroup namespace (`PROC_CGROUP_INIT_INO`).
const INITIAL_CGROUP_NAMESPACE: u64 = 0xEFFF_FFFB;

/// Whether kpng runs in a cgroup namespace of its own, as a container on a cgroup v2 host
/// does by default (containerd, CRI-O). There the root of the hierarchy it sees, and so the
/// default `--cgroup-path`, is its own container's cgroup: the programs would translate
/// kpng's own sockets only, and every pod's traffic would take the nftables rules (NAT)
/// instead, with nothing failing to tell anyone.
pub fn in_private_cgroup_namespace() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/cgroup").is_ok_and(|m| m.ino() != INITIAL_CGROUP_NAMESPACE)
}

/// The inode of the kernel's initial PID namespace (`PROC_PID_INIT_INO`).
const INITIAL_PID_NAMESPACE: u64 = 0xEFFF_FFFC;

/// Whether kpng runs in a PID namespace of its own, as a container without `hostPID` does:
/// there a cgroup's `cgroup.procs` lists only the processes of kpng's namespace (none of the
/// pods'), so the pods' network namespaces cannot be found, and connected UDP sockets whose
/// endpoint left cannot be destroyed ([`crate::sockets`]).
pub fn in_private_pid_namespace() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").is_ok_and(|m| m.ino() != INITIAL_PID_NAMESPACE)
}

/// What to tell an operator whose kpng runs in a PID namespace of its own (see
/// [`in_private_pid_namespace`]).
pub const PRIVATE_PID_NAMESPACE: &str = "kpng runs in a PID namespace of its own (a container \
     without hostPID): the processes of the pods' cgroups are not visible to it (their \
     cgroup.procs reads empty), so it cannot find the pods' network namespaces, and connected \
     UDP sockets translated to an endpoint that leaves its Service are not destroyed (counted \
     in kpng_ebpf_udp_socket_destroy_failures_total). Run kpng with hostPID: true";

/// What to tell an operator whose kpng runs in a cgroup namespace of its own with the default
/// `--cgroup-path` (see [`in_private_cgroup_namespace`]).
pub const PRIVATE_CGROUP_NAMESPACE: &str = "kpng runs in a cgroup namespace of its own (a \
     container's), so the cgroup v2 root it sees is its own cgroup, not the node's: only \
     sockets below it are translated, and pods' connections to Services go through the \
     nftables rules (NAT) instead. Give kpng the node's cgroup v2 hierarchy: mount the host's \
     /sys/fs/cgroup into the container (a hostPath volume, e.g. at /run/kpng/host-cgroup) and \
     pass that path as --cgroup-path";

/// Checks that `path` is a directory of a cgroup v2 hierarchy, where the socket programs can
/// attach: any directory is not (a cgroup v1 controller, the tmpfs of a hybrid host's
/// `/sys/fs/cgroup`), and the kernel would refuse every attach at every retry.
pub fn check_cgroup2_dir(path: &Path) -> Result<(), Error> {
    let real = std::fs::canonicalize(path).map_err(|e| {
        let hint = (e.kind() == std::io::ErrorKind::NotFound)
            .then(|| mounts().ok())
            .flatten()
            .and_then(|m| fresh_sys_hint(path, &m));
        match hint {
            Some(hint) => Error::Setup(format!("--cgroup-path {}: {e}; {hint}", path.display())),
            None => Error::io(format!("--cgroup-path {}", path.display()), e),
        }
    })?;
    if !real.is_dir() {
        return Err(Error::Setup(format!(
            "--cgroup-path {}: not a directory (it names the cgroup v2 subtree whose sockets \
             are translated; default: the cgroup v2 root)",
            path.display()
        )));
    }
    match fstype_of(&mounts()?, &real) {
        Some("cgroup2") => Ok(()),
        other => Err(Error::Setup(format!(
            "--cgroup-path {} is on {}, not a cgroup v2 hierarchy: the socket programs attach \
             to cgroup v2 directories only (on a hybrid host the v2 hierarchy is usually \
             /sys/fs/cgroup/unified; default: the cgroup v2 root)",
            path.display(),
            other.map_or_else(
                || "no known file system".to_string(),
                |t| format!("a {t} file system")
            )
        ))),
    }
}

/// The error for a `--cgroup-path` that does not exist: what the option names and, when the
/// path is under a fresh `/sys` (`ip netns exec`), that it may well exist on the host, why it
/// is not seen here and what to do ([`fresh_sys_hint`]). Without the hint an operator who
/// sees the directory in another shell has nothing to go on.
pub fn missing_cgroup_path(path: &Path) -> String {
    missing_cgroup_path_in(path, &mounts().unwrap_or_default())
}

fn missing_cgroup_path_in(path: &Path, mounts: &[Mount]) -> String {
    let what = "it names the cgroup v2 subtree whose sockets are translated; default: the \
                cgroup v2 root";
    match fresh_sys_hint(path, mounts) {
        Some(hint) => format!(
            "--cgroup-path {}: no such directory in kpng's mount namespace ({what}); {hint}",
            path.display()
        ),
        None => format!(
            "--cgroup-path {}: no such directory ({what})",
            path.display()
        ),
    }
}

/// Why a path under `/sys` that the host has may be missing here: no cgroup file system is
/// mounted below `/sys`, as in the fresh sysfs that `ip netns exec` mounts in the mount
/// namespace it makes, which hides the host's `/sys/fs/cgroup` and `/sys/fs/bpf`. `None` when
/// `path` is not under `/sys` or a cgroup hierarchy is mounted there (then the path is
/// simply wrong).
pub fn fresh_sys_hint(path: &Path, mounts: &[Mount]) -> Option<&'static str> {
    let under_sys = |p: &Path| p.starts_with("/sys") && p != Path::new("/sys");
    let cgroup_below_sys = mounts
        .iter()
        .any(|m| under_sys(&m.point) && m.fstype.starts_with("cgroup"));
    (under_sys(path) && !cgroup_below_sys).then_some(
        "no cgroup file system is mounted under /sys here: `ip netns exec` mounts a fresh /sys, \
         which hides the host's /sys/fs/cgroup and /sys/fs/bpf, so a directory the host has is \
         not seen. Run kpng with `nsenter --net=/run/netns/NAME` instead (it enters the network \
         namespace only and keeps the host's mounts), or mount cgroup2 and bpffs under \
         /run on the host (mount -t cgroup2 none /run/kpng-cgroup; mount -t bpf bpf \
         /run/kpng-bpf) and pass /run/kpng-cgroup as --cgroup-path and a directory of kpng's \
         own on the bpffs, /run/kpng-bpf/kpng, as --bpf-pin-path, or leave --cgroup-path out \
         (kpng then mounts the cgroup v2 hierarchy on /run/kpng/cgroupv2)",
    )
}

/// The type of the file system `path` is on: that of the mount with the longest mount point
/// holding it.
fn fstype_of<'m>(mounts: &'m [Mount], path: &Path) -> Option<&'m str> {
    mounts
        .iter()
        .filter(|m| path.starts_with(&m.point))
        .max_by_key(|m| m.point.as_os_str().len())
        .map(|m| m.fstype.as_str())
}

/// The mount point of the bpffs holding `path` (the mount with the longest mount point holding
/// it, when that is a bpffs), `path` resolved first when it exists: where a pin path that is
/// not a directory of kpng's own should have one (`<mount>/kpng`).
pub fn bpffs_mount_of(path: &Path) -> Option<PathBuf> {
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    bpffs_mount_in(&mounts().ok()?, &real)
}

fn bpffs_mount_in(mounts: &[Mount], path: &Path) -> Option<PathBuf> {
    mounts
        .iter()
        .filter(|m| path.starts_with(&m.point))
        .max_by_key(|m| m.point.as_os_str().len())
        .filter(|m| m.fstype == "bpf")
        .map(|m| m.point.clone())
}

/// The mount point of the first `cgroup2` mount that shows a whole hierarchy.
fn whole_cgroup2(mounts: &[Mount]) -> Option<PathBuf> {
    mounts
        .iter()
        .find(|m| m.fstype == "cgroup2" && m.root == Path::new("/"))
        .map(|m| m.point.clone())
}

/// One kpng's hold on a pin directory: an exclusive `flock` on the directory, released when
/// the process ends (even by `kill -9`). The instance lock is per network namespace, but pins
/// and cgroup attachments are the host's: two kpngs of one host (kind or minikube nodes, or a
/// test's namespaces) sharing a pin directory would overwrite each other's maps in silence,
/// and an `nftables` kpng's sweep or a `kpng cleanup` in another namespace would remove pins a
/// running kpng uses.
#[derive(Debug)]
pub struct PinLock {
    _dir: std::fs::File,
}

/// Takes the pin directory for this kpng (mounting a bpffs and creating the directory as
/// [`ensure_bpffs`] does), or says which process holds it. A directory kpng cannot have to
/// itself (a bpffs mount root, one holding other tools' pins) is refused ([`crate::pins::check`]).
pub fn lock_pins(pin_dir: &Path) -> Result<PinLock, Error> {
    ensure_bpffs(pin_dir)?;
    // Before anything is created there: a directory other tools use is refused.
    crate::pins::check(pin_dir)?;
    std::fs::create_dir_all(pin_dir)
        .map_err(|e| Error::io(format!("creating {}", pin_dir.display()), e))?;
    let dir = std::fs::File::open(pin_dir)
        .map_err(|e| Error::io(format!("opening {}", pin_dir.display()), e))?;
    match dir.try_lock() {
        Ok(()) => Ok(PinLock { _dir: dir }),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::Setup(format!(
            "another kpng{} uses the eBPF pins under {}: pins and cgroup attachments are the \
             host's, not a network namespace's, so two kpngs of one host need their own \
             --bpf-pin-path and --cgroup-path (or stop the other one)",
            holder(pin_dir).map_or_else(String::new, |h| format!(" ({h})")),
            pin_dir.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(Error::io(format!("locking {}", pin_dir.display()), e))
        }
    }
}

/// Whether a running kpng holds `pin_dir` ([`lock_pins`]): its pins are then not leftovers.
pub fn pins_in_use(pin_dir: &Path) -> bool {
    std::fs::File::open(pin_dir)
        .is_ok_and(|dir| matches!(dir.try_lock(), Err(std::fs::TryLockError::WouldBlock)))
}

/// Who holds the lock on `pin_dir`, from `/proc/locks`: "pid N, network namespace net:[…]".
pub fn holder(pin_dir: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let inode = std::fs::metadata(pin_dir).ok()?.ino();
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let pid = lock_holder(&locks, inode)?;
    let netns = std::fs::read_link(format!("/proc/{pid}/ns/net"))
        .map(|n| format!(", network namespace {}", n.display()))
        .unwrap_or_default();
    Some(format!("pid {pid}{netns}"))
}

/// The pid holding a `flock` on `inode` in `/proc/locks` text (`1: FLOCK  ADVISORY  WRITE
/// PID MAJ:MIN:INODE 0 EOF`).
fn lock_holder(locks: &str, inode: u64) -> Option<u32> {
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let at = fields.iter().position(|f| *f == "FLOCK")?;
        let pid = fields.get(at + 3)?.parse().ok()?;
        let ino: u64 = fields.get(at + 4)?.rsplit(':').next()?.parse().ok()?;
        (ino == inode).then_some(pid)
    })
}

/// Where the pins go must be on a bpffs. When no bpffs holds `pin_dir` and it is under the
/// conventional `/sys/fs/bpf`, one is mounted there (`mount -t bpf bpf /sys/fs/bpf`, as
/// systemd does on most distributions).
pub fn ensure_bpffs(pin_dir: &Path) -> Result<(), Error> {
    let on_bpffs = |all: &[Mount]| fstype_of(all, pin_dir) == Some("bpf");
    if on_bpffs(&mounts()?) {
        return Ok(());
    }
    let conventional = Path::new("/sys/fs/bpf");
    if !pin_dir.starts_with(conventional) {
        return Err(Error::Setup(format!(
            "{} is not on a BPF file system (mount one on a directory above it: mount -t bpf \
             bpf DIR, and pass DIR/kpng: kpng refuses the mount itself, which other tools share)",
            pin_dir.display()
        )));
    }
    mount("bpf", conventional)?;
    let place = MountNamespace::find();
    tracing::warn!("{}", bpffs_mounted(place));
    Ok(())
}

/// Whose mount namespace kpng runs in, which decides whether a bpffs it mounts outlives it:
/// the host's lives on (the next kpng adopts the pins), a private one (`ip netns exec`, a
/// container) ends with its processes and takes the pins with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountNamespace {
    /// The same as PID 1's, in the host's PID namespace: the host's.
    Host,
    /// Not PID 1's (`ip netns exec` makes one for its command).
    Private,
    /// Cannot tell: PID 1 is not the host's init (a PID namespace of kpng's own, a container)
    /// or its namespace cannot be read.
    Unknown,
}

impl MountNamespace {
    /// Compares `/proc/self/ns/mnt` with `/proc/1/ns/mnt` (when PID 1 is the host's init).
    pub fn find() -> MountNamespace {
        let read = |p: &str| std::fs::read_link(p).ok();
        Self::judge(
            read("/proc/self/ns/mnt").as_deref(),
            read("/proc/1/ns/mnt").as_deref(),
            in_private_pid_namespace(),
        )
    }

    /// The namespace from kpng's and PID 1's `ns/mnt` links (`mnt:[INODE]`), and whether
    /// kpng's PID namespace is its own (then PID 1 is not the host's init).
    fn judge(own: Option<&Path>, init: Option<&Path>, private_pid: bool) -> MountNamespace {
        match (own, init) {
            _ if private_pid => MountNamespace::Unknown,
            (Some(own), Some(init)) if own == init => MountNamespace::Host,
            (Some(_), Some(_)) => MountNamespace::Private,
            _ => MountNamespace::Unknown,
        }
    }
}

/// What kpng says after mounting a bpffs on `/sys/fs/bpf` where none was, in mount namespace
/// `place`: in the host's it changed the host, and the pins stay for the next kpng; in a
/// private one they go with it (the next kpng starts cold).
fn bpffs_mounted(place: MountNamespace) -> String {
    let gone = "the pins go with it: the next kpng starts cold instead of adopting the \
                programs and maps (mount /sys/fs/bpf on the host, or pass it in as a hostPath)";
    match place {
        MountNamespace::Host => "mounted a BPF file system on /sys/fs/bpf: none was mounted \
             there, and kpng runs in the host's mount namespace, so this changed the host: the \
             mount stays after kpng exits and the next kpng adopts the programs and maps \
             (`umount /sys/fs/bpf` after `kpng cleanup` undoes it; most distributions mount it \
             at boot)"
            .to_string(),
        MountNamespace::Private => format!(
            "mounted a BPF file system on /sys/fs/bpf: none was visible, and kpng runs in a \
             mount namespace other than the host's (`ip netns exec` makes one; `nsenter --net` \
             keeps the host's), so this mount is kpng's own and {gone}"
        ),
        MountNamespace::Unknown => format!(
            "mounted a BPF file system on /sys/fs/bpf: none was visible. If kpng runs in a \
             mount namespace of its own (a container without a /sys/fs/bpf hostPath, `ip netns \
             exec`), this mount is its own and {gone}"
        ),
    }
}

/// Creates `dir` and mounts a file system of type `fstype` on it (`mount -t TYPE TYPE DIR`).
fn mount(fstype: &str, dir: &Path) -> Result<(), Error> {
    let shown = format!("mount -t {fstype} {fstype} {}", dir.display());
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {} for {shown}", dir.display()), e))?;
    let out = Command::new("mount")
        .args(["-t", fstype, fstype])
        .arg(dir)
        .output()
        .map_err(|e| Error::io(format!("running {shown}"), e))?;
    if !out.status.success() {
        return Err(Error::Setup(format!(
            "{shown} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
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
        assert_eq!(m[1].root, PathBuf::from("/"));
        assert_eq!(m[1].fstype, "cgroup2");
        assert_eq!(m[2].fstype, "bpf");
        assert_eq!(m[3].point, PathBuf::from("/run/with space"));
    }

    /// (/proc/self/cgroup, the unified path)
    #[test]
    fn the_own_cgroup_is_the_unified_line() {
        for (text, want) in [
            ("0::/kubepods/pod1/c1\n", Some("/kubepods/pod1/c1")),
            ("12:cpu:/x\n0::/\n", Some("/")),
            ("0::/../../system.slice\n", None),
            ("4:memory:/user.slice\n", None),
        ] {
            assert_eq!(unified_cgroup(text), want, "{text}");
        }
    }

    #[test]
    fn the_holder_of_a_lock_is_read_from_proc_locks() {
        let locks = "1: POSIX  ADVISORY  WRITE 900 00:19:1234 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 12746 00:2f:39274263 0 EOF\n\
                     3: FLOCK  ADVISORY  WRITE 5 00:2f:1 0 EOF\n";
        assert_eq!(lock_holder(locks, 39274263), Some(12746));
        assert_eq!(lock_holder(locks, 1234), None, "a POSIX lock is not kpng's");
        assert_eq!(lock_holder(locks, 7), None);
    }

    /// A missing `--cgroup-path` under `/sys` gets the `ip netns exec` hint only when no
    /// cgroup hierarchy is mounted below `/sys` (a fresh sysfs); otherwise the path is wrong.
    #[test]
    fn a_fresh_sys_is_named_for_a_missing_path_under_it() {
        let host = "25 30 0:23 / /sys rw shared:7 - sysfs sysfs rw\n\
                    31 25 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n\
                    32 25 0:28 / /sys/fs/bpf rw - bpf bpf rw\n";
        let netns_exec = "25 30 0:50 / /sys rw - sysfs wt-a rw\n\
                          26 25 0:28 / /sys/fs/bpf rw - bpf bpf rw\n\
                          27 1 0:1 / /run rw - tmpfs tmpfs rw\n";
        for (mountinfo, path, hint) in [
            (netns_exec, "/sys/fs/cgroup/kpng-test", true),
            (netns_exec, "/run/kpng-cgroup/test", false),
            (host, "/sys/fs/cgroup/kpng-test", false),
            (host, "/run/kpng-cgroup/test", false),
            ("", "/sys/fs/cgroup", true),
        ] {
            let got = fresh_sys_hint(Path::new(path), &parse_mountinfo(mountinfo));
            assert_eq!(got.is_some(), hint, "{path} with {mountinfo:?}");
            if let Some(text) = got {
                assert!(
                    text.contains("ip netns exec") && text.contains("/run"),
                    "{text}"
                );
            }
        }
    }

    /// The bpffs warning says what is true of kpng's mount namespace: the host's keeps the
    /// mount and the pins (a restarted kpng adopts them), a private one takes them away.
    #[test]
    fn the_bpffs_mount_warning_follows_the_mount_namespace() {
        let host = Some(Path::new("mnt:[4026531832]"));
        let other = Some(Path::new("mnt:[4026532400]"));
        for (own, init, private_pid, want) in [
            (host, host, false, MountNamespace::Host),
            (other, host, false, MountNamespace::Private),
            (host, host, true, MountNamespace::Unknown),
            (host, None, false, MountNamespace::Unknown),
            (None, host, false, MountNamespace::Unknown),
        ] {
            assert_eq!(
                MountNamespace::judge(own, init, private_pid),
                want,
                "{own:?} {init:?} {private_pid}"
            );
        }
        for (place, says, never) in [
            (
                MountNamespace::Host,
                &["host's mount namespace", "stays after kpng exits", "adopts"][..],
                &["go with it", "starts cold"][..],
            ),
            (
                MountNamespace::Private,
                &["other than the host's", "ip netns exec", "starts cold"][..],
                &["adopts the"][..],
            ),
            (
                MountNamespace::Unknown,
                &[
                    "If kpng runs in a mount namespace of its own",
                    "starts cold",
                ][..],
                &[][..],
            ),
        ] {
            let text = bpffs_mounted(place);
            for s in says {
                assert!(text.contains(s), "{s:?} in {text}");
            }
            for s in never {
                assert!(!text.contains(s), "{s:?} not in {text}");
            }
        }
    }

    /// A missing `--cgroup-path` says why under a fresh `/sys` (`ip netns exec`), and only
    /// what the option names elsewhere.
    #[test]
    fn a_missing_cgroup_path_says_why_under_a_fresh_sys() {
        let netns_exec = "25 30 0:50 / /sys rw - sysfs wt-a rw\n";
        let host = "25 30 0:23 / /sys rw - sysfs sysfs rw\n\
                    31 25 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        for (mountinfo, path, want) in [
            (
                netns_exec,
                "/sys/fs/cgroup/unified/x",
                &[
                    "--cgroup-path /sys/fs/cgroup/unified/x: no such directory in kpng's mount \
                     namespace",
                    "`ip netns exec` mounts a fresh /sys",
                    "nsenter --net",
                ][..],
            ),
            (
                host,
                "/sys/fs/cgroup/x",
                &["--cgroup-path /sys/fs/cgroup/x: no such directory (it names"][..],
            ),
        ] {
            let got = missing_cgroup_path_in(Path::new(path), &parse_mountinfo(mountinfo));
            for w in want {
                assert!(got.contains(w), "{w:?} in {got}");
            }
            assert_eq!(
                got.contains("ip netns exec"),
                mountinfo == netns_exec,
                "{got}"
            );
        }
    }

    /// (path, the bpffs mount holding it): where `<mount>/kpng` is suggested, and how a pin
    /// path that is a mount root is told.
    #[test]
    fn the_bpffs_of_a_path_is_the_innermost_mount_holding_it() {
        let text = "32 25 0:28 / /sys/fs/bpf rw - bpf bpf rw\n\
                    40 1 0:1 / /run rw - tmpfs tmpfs rw\n\
                    41 40 0:50 / /run/x-bpf rw - bpf bpf rw\n";
        let mounts = parse_mountinfo(text);
        for (path, want) in [
            ("/sys/fs/bpf", Some("/sys/fs/bpf")),
            ("/sys/fs/bpf/kpng", Some("/sys/fs/bpf")),
            ("/run/x-bpf", Some("/run/x-bpf")),
            ("/run/x-bpf/tc/globals", Some("/run/x-bpf")),
            ("/run/kpng", None),
        ] {
            assert_eq!(
                bpffs_mount_in(&mounts, Path::new(path)),
                want.map(PathBuf::from),
                "{path}"
            );
        }
    }

    /// (path, the type of the file system it is on)
    #[test]
    fn a_path_is_on_the_mount_with_the_longest_point() {
        let text = "31 25 0:27 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n\
                    33 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n\
                    41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
                    42 1 0:1 / / rw - ext4 /dev/sda rw\n";
        let mounts = parse_mountinfo(text);
        for (path, want) in [
            ("/sys/fs/cgroup/unified/kubepods", Some("cgroup2")),
            ("/sys/fs/cgroup/unified", Some("cgroup2")),
            ("/sys/fs/cgroup/cpu/x", Some("cgroup")),
            ("/sys/fs/cgroup", Some("tmpfs")),
            ("/tmp/x", Some("ext4")),
        ] {
            assert_eq!(fstype_of(&mounts, Path::new(path)), want, "{path}");
        }
    }

    /// (case, mountinfo, the cgroup v2 root found)
    #[test]
    fn the_cgroup2_root_is_a_mount_of_the_whole_hierarchy() {
        let cases = [
            (
                "unified host",
                "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
                Some("/sys/fs/cgroup"),
            ),
            (
                "hybrid host",
                "31 25 0:27 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n\
                 33 31 0:29 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
                 41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n",
                Some("/sys/fs/cgroup/unified"),
            ),
            (
                "a container's own cgroup bind-mounted, the host's further down",
                "60 50 0:26 /kubepods/pod1/c1 /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n\
                 61 50 0:26 / /host/cgroup rw - cgroup2 cgroup2 rw\n",
                Some("/host/cgroup"),
            ),
            (
                "only a container's own cgroup",
                "60 50 0:26 /kubepods/pod1/c1 /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n",
                None,
            ),
            (
                "under ip netns exec: /sys remounted, no cgroup at all",
                "400 300 0:55 / /sys rw - sysfs kx rw\n",
                None,
            ),
        ];
        for (case, text, want) in cases {
            assert_eq!(
                whole_cgroup2(&parse_mountinfo(text)),
                want.map(PathBuf::from),
                "{case}"
            );
        }
    }
}
