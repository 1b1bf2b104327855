//! Where a pinned program link is attached right now.
//!
//! Why: a pin only proves that the link object exists. `bpftool link detach`, or the removal of
//! the cgroup it was attached to, leaves the link (and its pin) in place but attached to
//! nothing: the hook stops translating while everything on the bpffs looks as before. The
//! kernel's link info says which cgroup a cgroup link is attached to, 0 once detached; aya 0.14
//! reads that info but keeps the cgroup member to itself, so it is read here through `bpf()`
//! (`BPF_OBJ_GET` on the pin, `BPF_OBJ_GET_INFO_BY_FD` on the fd).
//!
//! And what is attached to a cgroup, whoever attached it ([`attached_programs`],
//! `BPF_PROG_QUERY`): a kpng that cannot see the previous generation's pins (another
//! `--bpf-pin-path`, a bpffs of its own) attaches its programs *beside* the previous ones, which
//! run first and translate from maps nobody updates. Pins cannot show those; the cgroup can.
//! [`detach_links`] detaches them (`BPF_LINK_DETACH` on each of their links).

#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::batch::bpf_returning;

/// `BPF_OBJ_GET`.
const OBJ_GET: libc::c_long = 7;
/// `BPF_OBJ_GET_INFO_BY_FD`.
const OBJ_GET_INFO_BY_FD: libc::c_long = 15;
/// `BPF_PROG_GET_FD_BY_ID`.
const PROG_GET_FD_BY_ID: libc::c_long = 13;
/// `BPF_PROG_QUERY`.
const PROG_QUERY: libc::c_long = 16;
/// `BPF_LINK_GET_FD_BY_ID`.
const LINK_GET_FD_BY_ID: libc::c_long = 30;
/// `BPF_LINK_GET_NEXT_ID`.
const LINK_GET_NEXT_ID: libc::c_long = 31;
/// `BPF_LINK_DETACH`.
const LINK_DETACH: libc::c_long = 34;
/// `BPF_LINK_TYPE_CGROUP`.
const LINK_TYPE_CGROUP: u32 = 3;

/// `union bpf_attr` for `BPF_OBJ_GET`.
#[repr(C)]
#[derive(Default)]
struct ObjGetAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

/// `union bpf_attr`'s `info` member.
#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The start of `struct bpf_link_info` for a cgroup link: the common fields, then (the union
/// is 8-aligned) its `cgroup` member. The kernel copies back at most `info_len` bytes.
#[repr(C)]
#[derive(Default)]
struct CgroupLinkInfo {
    link_type: u32,
    id: u32,
    prog_id: u32,
    _pad: u32,
    cgroup_id: u64,
    attach_type: u32,
    _pad2: u32,
}

/// `union bpf_attr`'s `query` member, up to `prog_cnt` (older kernels know no more; newer ones
/// read the rest as zero).
#[repr(C)]
#[derive(Default)]
struct QueryAttr {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
}

/// `union bpf_attr` for the `*_GET_FD_BY_ID` and `*_GET_NEXT_ID` commands.
#[repr(C)]
#[derive(Default)]
struct IdAttr {
    id: u32,
    next_id: u32,
    open_flags: u32,
}

/// `union bpf_attr`'s `link_detach` member.
#[repr(C)]
#[derive(Default)]
struct DetachAttr {
    link_fd: u32,
}

/// The start of `struct bpf_prog_info`, up to its name.
#[repr(C)]
#[derive(Default)]
struct ProgInfo {
    prog_type: u32,
    id: u32,
    tag: [u8; 8],
    jited_prog_len: u32,
    xlated_prog_len: u32,
    jited_prog_insns: u64,
    xlated_prog_insns: u64,
    load_time: u64,
    created_by_uid: u32,
    nr_map_ids: u32,
    map_ids: u64,
    name: [u8; 16],
}

/// `BPF_OBJ_GET_INFO_BY_FD` into `info` (a prefix of the object's info struct).
fn info_of<T>(fd: &OwnedFd, info: &mut T) -> io::Result<()> {
    let mut attr = InfoAttr {
        bpf_fd: u32::try_from(fd.as_raw_fd()).unwrap_or(u32::MAX),
        info_len: u32::try_from(std::mem::size_of::<T>()).unwrap_or(u32::MAX),
        info: std::ptr::from_mut(info) as u64,
    };
    // SAFETY: `attr` is the info struct; `info` points at a `T` of `info_len` bytes, which
    // the kernel fills (at most that many bytes); `T` is a `repr(C)` prefix of the info
    // struct of the object behind `fd`, made of plain integers.
    unsafe { bpf_returning(OBJ_GET_INFO_BY_FD, &mut attr) }.map(drop)
}

/// The fd a `*_GET_FD_BY_ID` command returns for `id`.
fn fd_by_id(cmd: libc::c_long, id: u32) -> io::Result<OwnedFd> {
    let mut attr = IdAttr {
        id,
        ..IdAttr::default()
    };
    // SAFETY: `attr` is the command's struct; it holds no pointer.
    let fd = unsafe { bpf_returning(cmd, &mut attr) }?;
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("not an fd"))?;
    // SAFETY: a successful `*_GET_FD_BY_ID` returns a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The id and name (at most 15 bytes: the kernel truncates) of the program behind `fd`.
pub fn program_of(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<(u32, String)> {
    let fd = fd.try_clone_to_owned()?;
    let mut info = ProgInfo::default();
    info_of(&fd, &mut info)?;
    Ok((info.id, program_name(&info)))
}

/// A program's name from its info: the bytes before the first NUL (the kernel keeps at most
/// 15 and pads with NULs).
fn program_name(info: &ProgInfo) -> String {
    let len = info
        .name
        .iter()
        .position(|b| *b == 0)
        .unwrap_or(info.name.len());
    String::from_utf8_lossy(&info.name[..len]).into_owned()
}

/// The name (at most 15 bytes) of the loaded program with id `id`: what tells kpng's
/// programs (`kpng_*`) among those a link attaches.
pub fn program_name_by_id(id: u32) -> io::Result<String> {
    let fd = fd_by_id(PROG_GET_FD_BY_ID, id)?;
    let mut info = ProgInfo::default();
    info_of(&fd, &mut info)?;
    Ok(program_name(&info))
}

/// A program attached to a cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupProgram {
    /// The kernel's id of the program.
    pub id: u32,
    /// Its name as the kernel keeps it (at most 15 bytes).
    pub name: String,
    /// The attach type (`BPF_CGROUP_INET4_CONNECT`, …) it is attached with.
    pub attach_type: u32,
}

/// The programs attached directly to the cgroup v2 directory `cgroup` (not inherited from its
/// parents) with each of `attach_types`, in the order they run.
pub fn attached_programs(cgroup: &Path, attach_types: &[u32]) -> io::Result<Vec<CgroupProgram>> {
    query_programs(cgroup, attach_types, 0)
}

/// `BPF_F_QUERY_EFFECTIVE`.
const QUERY_EFFECTIVE: u32 = 1;

/// The programs that run for the sockets of the cgroup v2 directory `cgroup` with each of
/// `attach_types`: those attached to it and those inherited from its ancestors, even ancestors
/// this process cannot see (a cgroup namespace of its own, as a container's: the node's root
/// is above the root it sees).
pub fn effective_programs(cgroup: &Path, attach_types: &[u32]) -> io::Result<Vec<CgroupProgram>> {
    query_programs(cgroup, attach_types, QUERY_EFFECTIVE)
}

fn query_programs(
    cgroup: &Path,
    attach_types: &[u32],
    query_flags: u32,
) -> io::Result<Vec<CgroupProgram>> {
    let cg = std::fs::File::open(cgroup)?;
    let mut out = Vec::new();
    for &attach_type in attach_types {
        let mut ids = vec![0u32; 64];
        loop {
            let mut attr = QueryAttr {
                target_fd: u32::try_from(cg.as_raw_fd()).unwrap_or(u32::MAX),
                attach_type,
                query_flags,
                prog_ids: ids.as_mut_ptr() as u64,
                prog_cnt: u32::try_from(ids.len()).unwrap_or(u32::MAX),
                ..QueryAttr::default()
            };
            // SAFETY: `attr` is `BPF_PROG_QUERY`'s struct; `prog_ids` points at `prog_cnt`
            // u32s, which the kernel fills (at most that many).
            match unsafe { bpf_returning(PROG_QUERY, &mut attr) } {
                Ok(_) => {
                    ids.truncate(attr.prog_cnt as usize);
                    break;
                }
                // More attached than room: the kernel said how many.
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                    ids = vec![0u32; attr.prog_cnt as usize + 16];
                }
                Err(e) => return Err(e),
            }
        }
        for id in ids {
            // Gone since the query (a link released meanwhile): nothing to report.
            let Ok(fd) = fd_by_id(PROG_GET_FD_BY_ID, id) else {
                continue;
            };
            let mut info = ProgInfo::default();
            info_of(&fd, &mut info)?;
            out.push(CgroupProgram {
                id,
                name: program_name(&info),
                attach_type,
            });
        }
    }
    Ok(out)
}

/// Detaches every live link that attaches one of `programs` (ids) to the cgroup with id
/// `cgroup_id`, found by walking the kernel's links (`BPF_LINK_GET_NEXT_ID`). Returns the ids
/// of the programs whose link it detached. A link whose last reference is already gone (its
/// pin just replaced, detaching in the kernel's work queue) cannot be opened and is left to
/// the kernel.
pub fn detach_links(
    cgroup_id: u64,
    programs: &std::collections::BTreeSet<u32>,
) -> io::Result<Vec<u32>> {
    let mut detached = Vec::new();
    for link in cgroup_links()? {
        if link.cgroup_id != cgroup_id || !programs.contains(&link.program) {
            continue;
        }
        match detach_link(link.id) {
            Ok(()) => detached.push(link.program),
            // Gone since the walk: the kernel is detaching it.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(detached)
}

/// A cgroup link of the kernel, whoever made it and wherever it is pinned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupLink {
    /// The link's id.
    pub id: u32,
    /// The id of the program it attaches.
    pub program: u32,
    /// The id of the cgroup it is attached to (0: detached).
    pub cgroup_id: u64,
    /// The hook it attaches to (`enum bpf_attach_type`).
    pub attach_type: u32,
}

/// Every live cgroup link of the kernel (`BPF_LINK_GET_NEXT_ID`): unlike pins and cgroup
/// directories, the list depends on no mount and no cgroup namespace. A link whose last
/// reference is already gone (detaching in the kernel's work queue) cannot be opened and is
/// left out.
pub fn cgroup_links() -> io::Result<Vec<CgroupLink>> {
    let mut out = Vec::new();
    let mut id = 0u32;
    loop {
        let mut next = IdAttr {
            id,
            ..IdAttr::default()
        };
        // SAFETY: `next` is the command's struct; it holds no pointer.
        match unsafe { bpf_returning(LINK_GET_NEXT_ID, &mut next) } {
            Ok(_) => id = next.next_id,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => break,
            Err(e) => return Err(e),
        }
        let Ok(fd) = fd_by_id(LINK_GET_FD_BY_ID, id) else {
            continue;
        };
        let mut info = CgroupLinkInfo::default();
        if info_of(&fd, &mut info).is_err() || info.link_type != LINK_TYPE_CGROUP {
            continue;
        }
        out.push(CgroupLink {
            id,
            program: info.prog_id,
            cgroup_id: info.cgroup_id,
            attach_type: info.attach_type,
        });
    }
    Ok(out)
}

/// Detaches the link with id `id` (`BPF_LINK_DETACH`): its program stops running at once,
/// whoever holds or pins the link.
pub fn detach_link(id: u32) -> io::Result<()> {
    let fd = fd_by_id(LINK_GET_FD_BY_ID, id)?;
    let mut attr = DetachAttr {
        link_fd: u32::try_from(fd.as_raw_fd()).unwrap_or(u32::MAX),
    };
    // SAFETY: `attr` is `BPF_LINK_DETACH`'s struct; it holds no pointer.
    unsafe { bpf_returning(LINK_DETACH, &mut attr) }.map(drop)
}

/// The bpf objects that the running processes of this pid namespace (but this one) hold open,
/// by id, with one of the pids holding each: links (`link_id:`) and programs (`prog_id:`), from
/// `/proc/PID/fd` and `/proc/PID/fdinfo`. A running eBPF kpng holds both, and its links are
/// not leftovers whatever its pins. Processes whose fds cannot be read (another pid namespace,
/// a process this one may not trace) are not seen: see [`crate::owners`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    /// Link id → pid.
    pub links: std::collections::BTreeMap<u32, u32>,
    /// Program id → pid.
    pub programs: std::collections::BTreeMap<u32, u32>,
}

/// What the running processes hold ([`Held`]).
pub fn held() -> Held {
    let me = std::process::id();
    let mut held = Held::default();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return held;
    };
    for proc in procs.filter_map(Result::ok) {
        let Some(pid) = proc
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(proc.path().join("fd")) else {
            continue;
        };
        for fd in fds.filter_map(Result::ok) {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let (key, into) = match target.as_os_str().as_bytes() {
                b"anon_inode:bpf_link" => ("link_id:", &mut held.links),
                b"anon_inode:bpf-prog" => ("prog_id:", &mut held.programs),
                _ => continue,
            };
            let info = proc.path().join("fdinfo").join(fd.file_name());
            if let Some(id) = std::fs::read_to_string(info)
                .ok()
                .as_deref()
                .and_then(|t| fdinfo_id(t, key))
            {
                into.entry(id).or_insert(pid);
            }
        }
    }
    held
}

/// The value of `key` (`link_id:`, `prog_id:`) in a bpf fd's fdinfo text.
fn fdinfo_id(text: &str, key: &str) -> Option<u32> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().parse().ok())
}

/// Where a link is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attachment {
    /// To the cgroup with this id (the inode number of its cgroup v2 directory).
    Cgroup(u64),
    /// To nothing: detached by hand, or its cgroup was removed.
    Detached,
}

/// Where the link pinned at `pin` is attached.
pub fn pinned_link(pin: &Path) -> io::Result<Attachment> {
    pinned_link_program(pin).map(|(a, _)| a)
}

/// An fd of the object (map, link, program) pinned at `pin` (`BPF_OBJ_GET`): for tools and
/// tests that read or fill a pinned map with [`crate::batch::Map`].
pub fn open_pin(pin: &Path) -> io::Result<OwnedFd> {
    let path = CString::new(pin.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut get = ObjGetAttr {
        pathname: path.as_ptr() as u64,
        ..ObjGetAttr::default()
    };
    // SAFETY: `get` is `BPF_OBJ_GET`'s struct; `pathname` points at a NUL-terminated string
    // that outlives the call; the kernel only reads it.
    let fd = unsafe { bpf_returning(OBJ_GET, &mut get) }?;
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("BPF_OBJ_GET: not an fd"))?;
    // SAFETY: a successful `BPF_OBJ_GET` returns a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The id of the cgroup link pinned at `pin`: which of the kernel's links
/// ([`cgroup_links`]) a pin keeps.
pub fn pinned_link_id(pin: &Path) -> io::Result<u32> {
    let fd = open_pin(pin)?;
    let mut info = CgroupLinkInfo::default();
    info_of(&fd, &mut info)?;
    Ok(info.id)
}

/// Where the link pinned at `pin` is attached, and the id of its program.
pub fn pinned_link_program(pin: &Path) -> io::Result<(Attachment, u32)> {
    let fd = open_pin(pin)?;
    let mut info = CgroupLinkInfo::default();
    info_of(&fd, &mut info)?;
    if info.link_type != LINK_TYPE_CGROUP {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not a cgroup link", pin.display()),
        ));
    }
    let attachment = match info.cgroup_id {
        0 => Attachment::Detached,
        id => Attachment::Cgroup(id),
    };
    Ok((attachment, info.prog_id))
}

/// The id the kernel gives the cgroup v2 directory `dir` (its inode number on the cgroup2
/// file system), as link info reports it.
pub fn cgroup_id(dir: &Path) -> io::Result<u64> {
    Ok(std::fs::metadata(dir)?.ino())
}

/// What a check of one pinned link found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkState {
    /// Attached to the expected cgroup.
    Attached,
    /// Not attached to it (detached, or attached to another cgroup), in words.
    NotAttached(String),
    /// The pin or the cgroup could not be read, in words: nothing is known.
    Unknown(String),
}

/// Whether the link pinned at `pin` is attached to the cgroup `cgroup`.
pub fn check(pin: &Path, cgroup: &Path) -> LinkState {
    let expected = match cgroup_id(cgroup) {
        Ok(id) => id,
        Err(e) => return LinkState::Unknown(format!("cgroup {}: {e}", cgroup.display())),
    };
    match pinned_link(pin) {
        Ok(Attachment::Cgroup(id)) if id == expected => LinkState::Attached,
        Ok(Attachment::Cgroup(id)) => {
            LinkState::NotAttached(format!("attached to another cgroup (id {id})"))
        }
        Ok(Attachment::Detached) => LinkState::NotAttached("detached".into()),
        Err(e) => LinkState::Unknown(format!("{}: {e}", pin.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup_link_info_prefix_has_the_kernel_layout() {
        // type, id, prog_id, then the union at 16: cgroup_id (u64), attach_type (u32).
        assert_eq!(std::mem::size_of::<CgroupLinkInfo>(), 32);
        assert_eq!(std::mem::offset_of!(CgroupLinkInfo, cgroup_id), 16);
        assert_eq!(std::mem::offset_of!(CgroupLinkInfo, attach_type), 24);
    }

    #[test]
    fn the_prog_info_prefix_has_the_kernel_layout() {
        assert_eq!(std::mem::offset_of!(ProgInfo, id), 4);
        assert_eq!(std::mem::offset_of!(ProgInfo, name), 64);
        assert_eq!(std::mem::size_of::<ProgInfo>(), 80);
        assert_eq!(std::mem::size_of::<QueryAttr>(), 32);
    }

    #[test]
    fn the_link_id_is_read_from_fdinfo() {
        let text = "pos:\t0\nflags:\t02000000\nmnt_id:\t15\nino:\t1057\nlink_type:\tcgroup\n\
                    link_id:\t812\nprog_tag:\t0123456789abcdef\nprog_id:\t77\n";
        assert_eq!(fdinfo_id(text, "link_id:"), Some(812));
        assert_eq!(fdinfo_id(text, "prog_id:"), Some(77));
        assert_eq!(fdinfo_id("pos:\t0\n", "link_id:"), None);
    }

    #[test]
    fn a_path_that_is_no_pin_is_an_error() {
        assert!(pinned_link(Path::new("/nonexistent/kpng-link")).is_err());
        assert!(matches!(
            check(Path::new("/nonexistent/kpng-link"), Path::new("/")),
            LinkState::Unknown(_)
        ));
    }
}
