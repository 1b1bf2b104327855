//! Where a pinned program link is attached right now.
//!
//! Why: a pin only proves that the link object exists. `bpftool link detach`, or the removal of
//! the cgroup it was attached to, leaves the link (and its pin) in place but attached to
//! nothing: the hook stops translating while everything on the bpffs looks as before. The
//! kernel's link info says which cgroup a cgroup link is attached to, 0 once detached; aya 0.14
//! reads that info but keeps the cgroup member to itself, so it is read here through `bpf()`
//! (`BPF_OBJ_GET` on the pin, `BPF_OBJ_GET_INFO_BY_FD` on the fd).

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
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut info = CgroupLinkInfo::default();
    let mut attr = InfoAttr {
        bpf_fd: u32::try_from(fd.as_raw_fd()).unwrap_or(u32::MAX),
        info_len: std::mem::size_of::<CgroupLinkInfo>() as u32,
        info: std::ptr::from_mut(&mut info) as u64,
    };
    // SAFETY: `attr` is the info struct; `info` points at a zeroed `CgroupLinkInfo` of
    // `info_len` bytes, which the kernel fills (at most that many bytes).
    unsafe { bpf_returning(OBJ_GET_INFO_BY_FD, &mut attr) }?;
    if info.link_type != LINK_TYPE_CGROUP {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not a cgroup link", pin.display()),
        ));
    }
    Ok(match info.cgroup_id {
        0 => Attachment::Detached,
        id => Attachment::Cgroup(id),
    })
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
    fn a_path_that_is_no_pin_is_an_error() {
        assert!(pinned_link(Path::new("/nonexistent/kpng-link")).is_err());
        assert!(matches!(
            check(Path::new("/nonexistent/kpng-link"), Path::new("/")),
            LinkState::Unknown(_)
        ));
    }
}
