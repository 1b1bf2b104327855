//! Batched map operations (`BPF_MAP_UPDATE_BATCH`, `BPF_MAP_DELETE_BATCH`,
//! `BPF_MAP_LOOKUP_BATCH`) on the map fds aya opened: with [`crate::links`], the only unsafe
//! code of the crate.
//!
//! Why unsafe: aya 0.14 offers one `bpf()` call per element, and a cold sync at 30k Services ×
//! 4 endpoints is ~400k elements (about a second of system calls). The kernel's batch
//! commands take arrays of keys and values in one call; no maintained pure-Rust crate exposes
//! them over a raw fd (libbpf-rs does, but through the C libbpf). So the three commands, and
//! the per-element fallback, go through `libc::syscall(SYS_bpf, …)` here, each with its
//! SAFETY argument; everything else of the crate stays safe.
//!
//! A kernel or map type without a batch command answers `EINVAL`, `ENOTSUPP` or
//! `EOPNOTSUPP`; [`Map`] then uses single-element commands for that map from then on.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `BPF_MAP_LOOKUP_ELEM`.
const LOOKUP_ELEM: libc::c_long = 1;
/// `BPF_MAP_UPDATE_ELEM`.
const UPDATE_ELEM: libc::c_long = 2;
/// `BPF_MAP_DELETE_ELEM`.
const DELETE_ELEM: libc::c_long = 3;
/// `BPF_MAP_GET_NEXT_KEY`.
const GET_NEXT_KEY: libc::c_long = 4;
/// `BPF_MAP_LOOKUP_BATCH`.
const LOOKUP_BATCH: libc::c_long = 24;
/// `BPF_MAP_UPDATE_BATCH`.
const UPDATE_BATCH: libc::c_long = 26;
/// `BPF_MAP_DELETE_BATCH`.
const DELETE_BATCH: libc::c_long = 27;
/// The kernel-internal `ENOTSUPP` some commands leak to userspace.
const ENOTSUPP: i32 = 524;

/// How many elements one batch call carries: large enough that the system call is noise,
/// small enough that the gather buffers stay a few hundred kilobytes.
pub const CHUNK: usize = 4096;

/// `union bpf_attr` for the `BPF_MAP_*_ELEM` commands.
#[repr(C)]
#[derive(Default)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// `union bpf_attr`'s `batch` member.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// `bpf(cmd, attr, sizeof attr)`.
///
/// # Safety
/// `attr` must be the attribute struct of `cmd`, and every pointer in it must be valid for the
/// sizes the map's key and value sizes imply, for as many elements as it says.
unsafe fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<()> {
    // SAFETY: the caller's guarantee is `bpf_returning`'s.
    unsafe { bpf_returning(cmd, attr) }.map(drop)
}

/// `bpf(cmd, attr, sizeof attr)`, with what the command returns (a new fd for `BPF_OBJ_GET`).
///
/// # Safety
/// As [`bpf`]: `attr` must be `cmd`'s attribute struct, every pointer in it valid for what
/// the command reads or writes through it.
pub(crate) unsafe fn bpf_returning<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: the caller guarantees that `attr` is `cmd`'s attribute struct with valid
    // pointers; the kernel reads at most `size_of::<T>()` bytes of it and writes only fields
    // of that struct (a batch's `count`) or through its pointers.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            std::ptr::from_mut(attr).cast::<libc::c_void>(),
            std::mem::size_of::<T>(),
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL) | Some(ENOTSUPP) | Some(libc::EOPNOTSUPP)
    )
}

fn ptr(bytes: &[u8]) -> u64 {
    bytes.as_ptr() as u64
}

/// One BPF map by its fd and element sizes, with batched operations.
#[derive(Debug)]
pub struct Map<'fd> {
    fd: BorrowedFd<'fd>,
    key_size: usize,
    value_size: usize,
    /// Set after the kernel refused a batch command on this map.
    singles: bool,
}

impl<'fd> Map<'fd> {
    /// The map behind `fd`, whose keys are `key_size` and values `value_size` bytes (as the
    /// object declares them; the kernel checks the fd's map against nothing else).
    pub fn new(fd: BorrowedFd<'fd>, key_size: usize, value_size: usize) -> Map<'fd> {
        Map {
            fd,
            key_size,
            value_size,
            singles: false,
        }
    }

    fn fd(&self) -> u32 {
        u32::try_from(self.fd.as_raw_fd()).unwrap_or(u32::MAX)
    }

    fn check(&self, keys: &[u8], values: Option<&[u8]>) -> io::Result<usize> {
        let bad = || io::Error::new(io::ErrorKind::InvalidInput, "key or value size mismatch");
        if self.key_size == 0 || !keys.len().is_multiple_of(self.key_size) {
            return Err(bad());
        }
        let n = keys.len() / self.key_size;
        if let Some(v) = values
            && v.len() != n * self.value_size
        {
            return Err(bad());
        }
        Ok(n)
    }

    /// Inserts or replaces every (key, value): `keys` and `values` are the elements back to
    /// back. Elements are written in order; on an error, those before it are written.
    pub fn update(&mut self, keys: &[u8], values: &[u8]) -> io::Result<()> {
        let n = self.check(keys, Some(values))?;
        let mut done = 0;
        while done < n && !self.singles {
            let count = (n - done).min(CHUNK);
            let k = &keys[done * self.key_size..(done + count) * self.key_size];
            let v = &values[done * self.value_size..(done + count) * self.value_size];
            let mut attr = BatchAttr {
                keys: ptr(k),
                values: ptr(v),
                count: u32::try_from(count).unwrap_or(u32::MAX),
                map_fd: self.fd(),
                ..BatchAttr::default()
            };
            // SAFETY: `attr` is the batch struct; `keys` and `values` hold `count` elements
            // of the map's key and value sizes (checked above); the kernel only reads them.
            match unsafe { bpf(UPDATE_BATCH, &mut attr) } {
                Ok(()) => done += count,
                Err(e) if unsupported(&e) && attr.count == 0 && done == 0 => self.singles = true,
                Err(e) => return Err(e),
            }
        }
        for i in done..n {
            let mut attr = ElemAttr {
                map_fd: self.fd(),
                key: ptr(&keys[i * self.key_size..]),
                value: ptr(&values[i * self.value_size..]),
                ..ElemAttr::default()
            };
            // SAFETY: `attr` is the element struct; key and value point at one element each
            // inside the checked buffers; the kernel only reads them.
            unsafe { bpf(UPDATE_ELEM, &mut attr) }?;
        }
        Ok(())
    }

    /// Deletes every key (`keys` back to back); keys already absent are skipped.
    pub fn delete(&mut self, keys: &[u8]) -> io::Result<()> {
        let n = self.check(keys, None)?;
        let mut done = 0;
        while done < n && !self.singles {
            let count = (n - done).min(CHUNK);
            let k = &keys[done * self.key_size..(done + count) * self.key_size];
            let mut attr = BatchAttr {
                keys: ptr(k),
                count: u32::try_from(count).unwrap_or(u32::MAX),
                map_fd: self.fd(),
                ..BatchAttr::default()
            };
            // SAFETY: `attr` is the batch struct; `keys` holds `count` keys of the map's key
            // size (checked above); the kernel only reads them and writes `attr.count`.
            match unsafe { bpf(DELETE_BATCH, &mut attr) } {
                Ok(()) => done += count,
                // The kernel stops at the first absent key: `count` were deleted before it.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    done += attr.count as usize + 1;
                }
                Err(e) if unsupported(&e) && attr.count == 0 && done == 0 => self.singles = true,
                Err(e) => return Err(e),
            }
        }
        for i in done..n {
            let mut attr = ElemAttr {
                map_fd: self.fd(),
                key: ptr(&keys[i * self.key_size..]),
                ..ElemAttr::default()
            };
            // SAFETY: `attr` is the element struct; key points at one key inside the checked
            // buffer; the kernel only reads it.
            match unsafe { bpf(DELETE_ELEM, &mut attr) } {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Every element, as (keys back to back, values back to back), in the map's order.
    pub fn dump(&mut self) -> io::Result<(Vec<u8>, Vec<u8>)> {
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        self.dump_each(|k, v| {
            keys.extend_from_slice(k);
            values.extend_from_slice(v);
        })?;
        Ok((keys, values))
    }

    /// Every element handed to `each` as (key, value), in the map's order, read a batch at a
    /// time into buffers of [`CHUNK`] elements that are reused: the map is never held whole
    /// here. A full sync at 30k Services reads ~10 MB of frontends; collected whole (grown by
    /// doubling, then sorted into a copy) they added to a restart's peak RSS, on top of the
    /// nftables half's.
    pub fn dump_each(&mut self, mut each: impl FnMut(&[u8], &[u8])) -> io::Result<()> {
        if !self.singles {
            match self.dump_batched(&mut each) {
                (_, Ok(())) => return Ok(()),
                (0, Err(e)) if unsupported(&e) => self.singles = true,
                (_, Err(e)) => return Err(e),
            }
        }
        self.dump_singles(&mut each)
    }

    /// The batched walk: how many elements it handed to `each`, and how it ended.
    fn dump_batched(&self, each: &mut dyn FnMut(&[u8], &[u8])) -> (usize, io::Result<()>) {
        let (ks, vs) = (self.key_size.max(1), self.value_size.max(1));
        let mut chunk = CHUNK;
        let mut keys = vec![0u8; chunk * ks];
        let mut values = vec![0u8; chunk * vs];
        // The position token: a bucket index for hash maps (8 bytes is ample).
        let mut token = [0u64; 2];
        let mut first = true;
        let mut handed = 0;
        loop {
            let out_batch = std::ptr::from_mut(&mut token[1]) as u64;
            let mut attr = BatchAttr {
                in_batch: if first {
                    0
                } else {
                    std::ptr::from_ref(&token[0]) as u64
                },
                out_batch,
                keys: keys.as_mut_ptr() as u64,
                values: values.as_mut_ptr() as u64,
                count: u32::try_from(chunk).unwrap_or(u32::MAX),
                map_fd: self.fd(),
                ..BatchAttr::default()
            };
            // SAFETY: `attr` is the batch struct; `keys` and `values` have room for `chunk`
            // elements (resized with it); the tokens are 8 bytes each and the kernel writes at
            // most the map's token size (4 bytes for hash maps).
            let r = unsafe { bpf(LOOKUP_BATCH, &mut attr) };
            let got = (attr.count as usize).min(chunk);
            for (k, v) in keys[..got * ks]
                .chunks_exact(ks)
                .zip(values[..got * vs].chunks_exact(vs))
            {
                each(k, v);
            }
            handed += got;
            match r {
                Ok(()) => {}
                // The end of the map.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return (handed, Ok(())),
                // One bucket holds more than `chunk` elements: ask for more at once.
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && got == 0 => {
                    chunk *= 2;
                    keys.resize(chunk * ks, 0);
                    values.resize(chunk * vs, 0);
                    continue;
                }
                Err(e) => return (handed, Err(e)),
            }
            token[0] = token[1];
            first = false;
        }
    }

    fn dump_singles(&self, each: &mut dyn FnMut(&[u8], &[u8])) -> io::Result<()> {
        let (ks, vs) = (self.key_size, self.value_size);
        let mut prev: Option<Vec<u8>> = None;
        let mut next = vec![0u8; ks];
        let mut value = vec![0u8; vs];
        loop {
            let mut attr = ElemAttr {
                map_fd: self.fd(),
                key: prev.as_deref().map_or(0, ptr),
                value: next.as_mut_ptr() as u64,
                ..ElemAttr::default()
            };
            // SAFETY: `attr` is the element struct (`value` is `next_key` here); `prev` and
            // `next` are one key each; the kernel writes one key into `next`.
            match unsafe { bpf(GET_NEXT_KEY, &mut attr) } {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
                Err(e) => return Err(e),
            }
            let mut attr = ElemAttr {
                map_fd: self.fd(),
                key: ptr(&next),
                value: value.as_mut_ptr() as u64,
                ..ElemAttr::default()
            };
            // SAFETY: `attr` is the element struct; `next` is one key, `value` one value;
            // the kernel writes one value.
            match unsafe { bpf(LOOKUP_ELEM, &mut attr) } {
                Ok(()) => each(&next, &value),
                // Deleted between the walk and the lookup.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(e),
            }
            prev = Some(next.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};

    use super::*;

    /// `BPF_MAP_CREATE` of a `BPF_MAP_TYPE_HASH` with `BPF_F_NO_PREALLOC`, as the object's maps.
    fn hash_map(key_size: u32, value_size: u32, max_entries: u32) -> io::Result<OwnedFd> {
        create_map(1, 1, key_size, value_size, max_entries)
    }

    /// `BPF_MAP_CREATE` of a preallocated `BPF_MAP_TYPE_LRU_HASH`, as `kpng_reverse`.
    fn lru_map(key_size: u32, value_size: u32, max_entries: u32) -> io::Result<OwnedFd> {
        create_map(9, 0, key_size, value_size, max_entries)
    }

    fn create_map(
        map_type: u32,
        map_flags: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
    ) -> io::Result<OwnedFd> {
        #[repr(C)]
        #[derive(Default)]
        struct CreateAttr {
            map_type: u32,
            key_size: u32,
            value_size: u32,
            max_entries: u32,
            map_flags: u32,
        }
        let mut attr = CreateAttr {
            map_type,
            key_size,
            value_size,
            max_entries,
            map_flags,
        };
        // SAFETY: `attr` is the leading part of `BPF_MAP_CREATE`'s struct (the rest reads as
        // zero); it holds no pointers.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                0 as libc::c_long,
                std::ptr::from_mut(&mut attr).cast::<libc::c_void>(),
                std::mem::size_of::<CreateAttr>(),
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel returned a new fd that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(i32::try_from(fd).unwrap_or(-1)) })
    }

    fn elements(n: u32) -> (Vec<u8>, Vec<u8>) {
        let keys = (0..n).flat_map(u32::to_ne_bytes).collect();
        let values = (0..n)
            .flat_map(|i| (u64::from(i) * 7).to_ne_bytes())
            .collect();
        (keys, values)
    }

    fn sorted(keys: &[u8], values: &[u8]) -> Vec<(u32, u64)> {
        let mut v: Vec<(u32, u64)> = keys
            .chunks(4)
            .zip(values.chunks(8))
            .map(|(k, v)| {
                (
                    u32::from_ne_bytes(k.try_into().expect("4 bytes")),
                    u64::from_ne_bytes(v.try_into().expect("8 bytes")),
                )
            })
            .collect();
        v.sort_unstable();
        v
    }

    /// Batched and single-element paths against a real map: more elements than a chunk,
    /// deletes of absent keys in the middle of a batch, and a full read back.
    #[test]
    fn batches_update_delete_and_dump_a_real_map() {
        kpng_testkit::require_root!();
        for singles in [false, true] {
            let fd = hash_map(4, 8, 20_000).expect("BPF_MAP_CREATE");
            let mut map = Map::new(fd.as_fd(), 4, 8);
            map.singles = singles;
            let n = u32::try_from(CHUNK).expect("chunk") * 2 + 100;
            let (keys, values) = elements(n);
            map.update(&keys, &values).expect("update");
            let (k, v) = map.dump().expect("dump");
            let want: Vec<(u32, u64)> = (0..n).map(|i| (i, u64::from(i) * 7)).collect();
            assert_eq!(sorted(&k, &v), want, "singles: {singles}");

            // Delete every even key, with absent keys (n..n+50) among them.
            let doomed: Vec<u8> = (0..n + 50)
                .filter(|i| i % 2 == 0 || *i >= n)
                .flat_map(u32::to_ne_bytes)
                .collect();
            map.delete(&doomed).expect("delete");
            let (k, v) = map.dump().expect("dump");
            let want: Vec<(u32, u64)> = (0..n)
                .filter(|i| i % 2 == 1)
                .map(|i| (i, u64::from(i) * 7))
                .collect();
            assert_eq!(sorted(&k, &v), want, "singles: {singles}");
            // Wrong sizes are refused before any system call.
            assert!(map.update(&keys[..5], &values[..8]).is_err());
        }
    }

    /// The reverse map (an LRU hash, full on a busy node) read back whole in batches, as the
    /// sync that removes a UDP endpoint reads it: every element, once.
    #[test]
    fn dumps_a_full_lru_map_in_batches() {
        kpng_testkit::require_root!();
        // 32-byte keys and 20-byte values, as `kpng_reverse`.
        let n: u32 = 20_000;
        let fd = lru_map(32, 20, n).expect("BPF_MAP_CREATE");
        let mut map = Map::new(fd.as_fd(), 32, 20);
        let keys: Vec<u8> = (0..n)
            .flat_map(|i| {
                let mut k = [0u8; 32];
                k[..4].copy_from_slice(&i.to_ne_bytes());
                k
            })
            .collect();
        let values = vec![7u8; 20 * n as usize];
        map.update(&keys, &values).expect("update");
        let (k, v) = map.dump().expect("dump");
        assert!(
            !map.singles,
            "an LRU hash is read in batches on this kernel"
        );
        assert_eq!(v.len(), 20 * k.len() / 32);
        let mut seen: Vec<u32> = k
            .chunks_exact(32)
            .map(|c| u32::from_ne_bytes(c[..4].try_into().expect("4 bytes")))
            .collect();
        seen.sort_unstable();
        seen.dedup();
        // The LRU may have evicted a few while it filled (its free lists are per CPU).
        assert!(
            seen.len() as u32 > n * 9 / 10 && seen.len() * 32 == k.len(),
            "{} distinct of {} read, {n} written",
            seen.len(),
            k.len() / 32
        );
    }
}
