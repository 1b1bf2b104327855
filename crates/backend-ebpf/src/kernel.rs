//! The kernel side through aya: loads the clang-built object, attaches its cgroup programs,
//! pins maps and links under the pin directory, and reads and writes the maps.
//!
//! Restart without interruption: the maps are pinned by name (`LIBBPF_PIN_BY_NAME`) under
//! `<pin dir>/<layout version>`, so the next kpng's loader opens the same maps, contents
//! included, as long as their layout is the same; a kpng of another layout creates its own
//! maps in its own directory, copies over the elements of the maps whose definition did not
//! change ([`CARRIED`]), and removes the previous layout's pins once its programs are
//! attached. Its programs are attached *beside*
//! the previous ones (`BPF_F_ALLOW_MULTI`), their links pinned under a temporary name and
//! renamed over the previous pins: the rename drops the last reference to the previous links,
//! which detaches the previous programs. During the overlap both generations translate with the
//! same maps (the second finds the endpoint address, which is no frontend, and passes).
//!
//! The programs' counters (`kpng_counters`) are pinned the same way, so the counts go on across
//! a restart. A pin set of a build without them lacks that pin: the loader creates the map
//! beside the adopted ones; a rollback to such a build leaves it unused until the next upgrade
//! or `kpng cleanup` (which removes kpng's pins, [`crate::pins::remove`]).
//!
//! aya 0.14 has no batch map API: the maps are written and read through [`crate::batch`]
//! (`BPF_MAP_UPDATE_BATCH`, `BPF_MAP_DELETE_BATCH`, `BPF_MAP_LOOKUP_BATCH` on the fds aya
//! opened), 4096 elements per system call.

use std::fs::File;
use std::path::{Path, PathBuf};

use aya::maps::{HashMap as BpfHashMap, MapData};
use aya::programs::CgroupAttachMode;
use aya::programs::links::{FdLink, PinnedLink};
use aya::{Ebpf, EbpfLoader};

use crate::Error;
use crate::batch;
use crate::layout::{
    ENDPOINT, FRONTEND_KEY, MEMBER, MEMBER_KEY, REVERSE_KEY, SERVICE, SLOT_KEY, VERSION,
};
use crate::links::LinkState;
use crate::object::OBJECT;
use crate::plan::{Kind, MapId, Step, Table};

/// Every program of the object, by its function name: the socket-address hooks, then the
/// release hook that forgets a closing socket's translation.
pub const PROGRAMS: [&str; 9] = [
    "kpng_connect4",
    "kpng_connect6",
    "kpng_sendmsg4",
    "kpng_sendmsg6",
    "kpng_recvmsg4",
    "kpng_recvmsg6",
    "kpng_getpeername4",
    "kpng_getpeername6",
    "kpng_sock_release",
];

/// Each program's attach type (`enum bpf_attach_type`), in [`PROGRAMS`]' order: what
/// [`kpng_programs`] asks the cgroup about.
pub const ATTACH_TYPES: [u32; 9] = [10, 11, 14, 15, 19, 20, 29, 30, 34];

/// The name of kpng's program for `attach_type`, if it has one.
pub fn program_for(attach_type: u32) -> Option<&'static str> {
    ATTACH_TYPES
        .iter()
        .position(|t| *t == attach_type)
        .and_then(|i| PROGRAMS.get(i).copied())
}

/// Every kpng program (by name: `kpng_*`) attached to the cgroup `cgroup` with one of kpng's
/// attach types, whoever attached it, with the name of the kpng program of its hook.
pub fn kpng_programs(
    cgroup: &Path,
) -> std::io::Result<Vec<(&'static str, crate::links::CgroupProgram)>> {
    Ok(crate::links::attached_programs(cgroup, &ATTACH_TYPES)?
        .into_iter()
        .filter(|p| p.name.starts_with("kpng_"))
        .filter_map(|p| Some((program_for(p.attach_type)?, p)))
        .collect())
}

/// Detaches every kpng program attached to `cgroup` whose id is not in `own`: a previous
/// generation that this kpng could not replace through the pins (another `--bpf-pin-path`, a
/// bpffs of its own, a DaemonSet without the host's `/sys/fs/bpf`), or a second kpng on the
/// same cgroup. Those run before this kpng's programs and translate from maps nobody updates.
/// Returns what was detached, in words (`kpng_connect4 (program 812)`).
pub fn detach_strangers(
    cgroup: &Path,
    own: &std::collections::BTreeSet<u32>,
) -> Result<Vec<String>, Error> {
    let strangers: Vec<(&'static str, crate::links::CgroupProgram)> = kpng_programs(cgroup)
        .map_err(|e| Error::io(format!("querying cgroup {}", cgroup.display()), e))?
        .into_iter()
        .filter(|(_, p)| !own.contains(&p.id))
        .collect();
    if strangers.is_empty() {
        return Ok(Vec::new());
    }
    let ids = strangers.iter().map(|(_, p)| p.id).collect();
    let cgroup_id = crate::links::cgroup_id(cgroup)
        .map_err(|e| Error::io(format!("reading cgroup {}", cgroup.display()), e))?;
    let detached = crate::links::detach_links(cgroup_id, &ids).map_err(|e| {
        Error::io(
            format!("detaching other kpng programs from {}", cgroup.display()),
            e,
        )
    })?;
    Ok(strangers
        .iter()
        .filter(|(_, p)| detached.contains(&p.id))
        .map(|(name, p)| format!("{name} (program {})", p.id))
        .collect())
}

/// The kpng programs (by name: `kpng_*`) that run for the sockets of any of `cgroups`,
/// attached there or inherited from an ancestor (which may be above the root this process
/// sees), with the name of the kpng program of their hook; each program once. Cgroups that
/// cannot be read are skipped, unless none can be.
pub fn node_programs(
    cgroups: &[PathBuf],
) -> std::io::Result<Vec<(&'static str, crate::links::CgroupProgram)>> {
    let mut out: Vec<(&'static str, crate::links::CgroupProgram)> = Vec::new();
    let mut failure = None;
    let mut read = false;
    for cgroup in cgroups {
        match crate::links::effective_programs(cgroup, &ATTACH_TYPES) {
            Ok(found) => {
                read = true;
                for p in found.into_iter().filter(|p| p.name.starts_with("kpng_")) {
                    let Some(name) = program_for(p.attach_type) else {
                        continue;
                    };
                    if !out.iter().any(|(_, q)| q.id == p.id) {
                        out.push((name, p));
                    }
                }
            }
            Err(e) => failure = Some(e),
        }
    }
    match failure {
        Some(e) if !read => Err(e),
        _ => Ok(out),
    }
}

/// A kpng program that translates sockets of the cgroups kpng answers for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The name of kpng's program for its hook.
    pub name: &'static str,
    /// The program.
    pub program: crate::links::CgroupProgram,
    /// Where it is attached, when found below the cgroups by a link nobody holds
    /// ([`crate::strays`]); `None` when it runs for the cgroups themselves ([`node_programs`]).
    pub below: Option<PathBuf>,
}

impl Found {
    /// In words: `kpng_connect4 (program 812)`, with the cgroup when found below.
    pub fn describe(&self) -> String {
        match &self.below {
            Some(cgroup) => format!(
                "{} (program {}, attached to cgroup {})",
                self.name,
                self.program.id,
                cgroup.display()
            ),
            None => format!("{} (program {})", self.name, self.program.id),
        }
    }
}

/// Every kpng program that translates the sockets of any of `cgroups`: those that run for the
/// cgroups themselves ([`node_programs`]: attached there or above, held or not) and those
/// attached to a cgroup below them by a link no running process holds ([`crate::strays`]:
/// a stopped eBPF kpng's on a `--cgroup-path` subtree); each program once. Errors as
/// [`node_programs`]; when the kernel's links cannot be listed, the first kind only.
pub fn found_programs(cgroups: &[PathBuf]) -> std::io::Result<Vec<Found>> {
    let mut out: Vec<Found> = node_programs(cgroups)?
        .into_iter()
        .map(|(name, program)| Found {
            name,
            program,
            below: None,
        })
        .collect();
    match crate::strays::find(cgroups) {
        Ok(strays) => {
            for stray in strays {
                if !out.iter().any(|f| f.program.id == stray.program.id) {
                    out.push(Found {
                        name: stray.name,
                        program: stray.program,
                        below: Some(stray.cgroup),
                    });
                }
            }
        }
        Err(e) => tracing::debug!("listing the kernel's cgroup links: {e}"),
    }
    Ok(out)
}

/// The running kpng that owns the link of one of the kpng programs that run for the sockets
/// of `cgroups` (a running eBPF kpng, whatever its pins), in words ([`crate::owners`]: `pid
/// 812`, …), if any.
pub fn node_programs_holder(cgroups: &[PathBuf]) -> Option<String> {
    let found = node_programs(cgroups).ok()?;
    if found.is_empty() {
        return None;
    }
    let links = crate::links::cgroup_links().ok()?;
    let owners = crate::owners::Owners::find();
    found.iter().find_map(|(_, p)| {
        links
            .iter()
            .filter(|l| l.program == p.id)
            .find_map(|l| owners.of(l))
    })
}

/// What [`sweep_programs`] did, each program in words (`kpng_connect4 (program 812)`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProgramSweep {
    /// Detached (`BPF_LINK_DETACH`).
    pub detached: Vec<String>,
    /// Kept: a running kpng owns its link ([`crate::owners`]), with who.
    pub held: Vec<String>,
    /// Still attached, and why: no link of it could be found or detached (attached without a
    /// bpf_link, by another tool, or the kernel refused).
    pub left: Vec<String>,
}

/// Detaches every kpng program that translates the sockets of `cgroups` ([`found_programs`]),
/// wherever it is pinned (pins that this process cannot see: another `--bpf-pin-path`, a bpffs
/// of its own) and whatever cgroup it is attached to (an ancestor above this process's cgroup
/// namespace, a descendant: a stopped kpng's `--cgroup-path` subtree): the links are found
/// through the kernel's list of links, not through pins. A link a running kpng owns
/// ([`crate::owners`]: held open, its program held, or pinned in a locked pin directory) is a
/// running eBPF kpng's and is kept. Links whose pins were just removed are released by the kernel in a work
/// queue: what is still attached is looked at again for up to `wait`.
pub fn sweep_programs(
    cgroups: &[PathBuf],
    wait: std::time::Duration,
) -> Result<ProgramSweep, Error> {
    let deadline = std::time::Instant::now() + wait;
    let mut out = ProgramSweep::default();
    loop {
        let found = found_programs(cgroups)
            .map_err(|e| Error::io("querying the cgroups' kpng programs", e))?;
        let links = crate::links::cgroup_links()
            .map_err(|e| Error::io("listing the kernel's cgroup links", e))?;
        let owners = crate::owners::Owners::find();
        out.held.clear();
        let mut left = Vec::new();
        for found in found {
            let what = found.describe();
            let program = found.program;
            let theirs: Vec<&crate::links::CgroupLink> = links
                .iter()
                .filter(|l| l.program == program.id && l.cgroup_id != 0)
                .collect();
            if let Some(owner) = theirs.iter().find_map(|l| owners.of(l)) {
                out.held.push(format!("{what}, held by {owner}"));
                continue;
            }
            let theirs: Vec<u32> = theirs.iter().map(|l| l.id).collect();
            if theirs.is_empty() {
                left.push(format!("{what}: no bpf_link attaches it"));
                continue;
            }
            for link in theirs {
                match crate::links::detach_link(link) {
                    Ok(()) => {
                        if !out.detached.contains(&what) {
                            out.detached.push(what.clone());
                        }
                    }
                    Err(e) => left.push(format!("{what}: detaching link {link}: {e}")),
                }
            }
        }
        if left.is_empty() || std::time::Instant::now() >= deadline {
            out.left = left;
            return Ok(out);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Whether [`attach`] loads the program first (once per process) or attaches the loaded one
/// again (after someone detached its link).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Load {
    First,
    Loaded,
}

/// Attaches program `name` (loading it first if `load` says so) to the cgroup `cg` (at
/// `cgroup`) with a bpf_link.
fn attach(
    ebpf: &mut Ebpf,
    name: &str,
    load: Load,
    cg: &File,
    cgroup: &Path,
) -> Result<FdLink, Error> {
    use aya::programs::Program;
    let loading = |e| bpf_err(format_args!("loading {name}"), e);
    let attaching = |e| bpf_err(format_args!("attaching {name} to {}", cgroup.display()), e);
    let not_a_link = |e| bpf_err(format_args!("{name} is not a bpf_link"), e);
    // A bpf_link attachment is always one of many (the kernel sets BPF_F_ALLOW_MULTI itself
    // and refuses the flag from userspace).
    match ebpf.program_mut(name) {
        Some(Program::CgroupSockAddr(p)) => {
            if load == Load::First {
                p.load().map_err(loading)?;
            }
            let id = p.attach(cg, CgroupAttachMode::Single).map_err(attaching)?;
            let link = p.take_link(id).map_err(|e| bpf_err(name, e))?;
            link.try_into().map_err(not_a_link)
        }
        Some(Program::CgroupSock(p)) => {
            if load == Load::First {
                p.load().map_err(loading)?;
            }
            let id = p.attach(cg, CgroupAttachMode::Single).map_err(attaching)?;
            let link = p.take_link(id).map_err(|e| bpf_err(name, e))?;
            link.try_into().map_err(not_a_link)
        }
        Some(_) => Err(Error::Bpf(format!("{name} is not a cgroup socket program"))),
        None => Err(Error::Bpf(format!("the object has no program {name}"))),
    }
}

/// Pins `link` as `links_dir/name`, replacing what was pinned there in one rename: the
/// previous link (a previous kpng's, or a detached one) loses its pin only once this one has
/// it, so the hook is never left without a program.
fn pin_over(link: FdLink, links_dir: &Path, name: &str) -> Result<PinnedLink, Error> {
    // bpffs refuses names with dots.
    let fresh = links_dir.join(format!("new-{name}"));
    let _ = std::fs::remove_file(&fresh);
    let held = link
        .pin(&fresh)
        .map_err(|e| bpf_err(format_args!("pinning {}", fresh.display()), e))?;
    std::fs::rename(&fresh, links_dir.join(name)).map_err(|e| {
        Error::io(
            format!("renaming {} over the previous link", fresh.display()),
            e,
        )
    })?;
    Ok(held)
}

/// The programs' global holding the network namespace cookie of the sockets they translate
/// (0: every socket): `--socket-lb-host-netns-only`.
const HOST_NETNS: &str = "kpng_host_netns";

/// The directory of the link pins inside the pin directory.
pub const LINKS: &str = "links";

/// The loaded programs and the maps userspace writes.
pub struct Kernel {
    // Keeps the programs loaded while their links are pinned and the maps' fds open.
    ebpf: Ebpf,
    /// Each program's link, held open as well as pinned: while kpng runs, a removed pin does
    /// not detach its program ([`Kernel::restore_pins`] pins it again).
    links: Vec<(&'static str, PinnedLink)>,
    frontends: BpfHashMap<MapData, [u8; FRONTEND_KEY], [u8; SERVICE]>,
    slots: BpfHashMap<MapData, [u8; SLOT_KEY], [u8; ENDPOINT]>,
    members: BpfHashMap<MapData, [u8; MEMBER_KEY], [u8; MEMBER]>,
    reverse: BpfHashMap<MapData, [u8; REVERSE_KEY], [u8; ENDPOINT]>,
    pin_dir: PathBuf,
    /// The cgroup v2 directory the programs are attached to.
    cgroup: PathBuf,
    /// The kernel's ids of this kpng's programs: kpng programs on the cgroup with other ids
    /// are another generation's ([`detach_strangers`]).
    own: std::collections::BTreeSet<u32>,
}

fn bpf_err(what: impl std::fmt::Display, e: impl std::error::Error) -> Error {
    let mut text = format!("{what}: {e}");
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    Error::Bpf(text)
}

/// `e`, with the capabilities to check when the kernel said "Operation not permitted": the
/// kernel's words name none, and the sync retried forever.
fn permission_hint(e: Error) -> Error {
    match e {
        Error::Bpf(text) if text.contains("Operation not permitted") => Error::Bpf(format!(
            "{text} (loading eBPF programs and creating maps needs CAP_BPF, or CAP_SYS_ADMIN \
             on kernels before 5.8, and attaching them CAP_NET_ADMIN; kernels before 5.11 also \
             need a memlock limit large enough for the maps)"
        )),
        other => other,
    }
}

fn take<K: aya::Pod, V: aya::Pod>(
    ebpf: &mut Ebpf,
    name: &str,
) -> Result<BpfHashMap<MapData, K, V>, Error> {
    let map = ebpf
        .take_map(name)
        .ok_or_else(|| Error::Bpf(format!("the object has no map {name}")))?;
    BpfHashMap::try_from(map).map_err(|e| bpf_err(format_args!("map {name}"), e))
}

impl Kernel {
    /// Loads the object (adopting pinned maps under `pin_dir`), attaches every program to the
    /// cgroup v2 directory `cgroup` and pins the links, replacing a previous kpng's.
    /// `host_netns`: the network namespace cookie of the only sockets to translate
    /// (`--socket-lb-host-netns-only`, [`crate::netns::own_cookie`]); `None`: every socket of
    /// the subtree.
    pub fn open(pin_dir: &Path, cgroup: &Path, host_netns: Option<u64>) -> Result<Kernel, Error> {
        crate::host::ensure_bpffs(pin_dir)?;
        let links = pin_dir.join(LINKS);
        let maps = pin_dir.join(VERSION);
        for dir in [&links, &maps] {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        }
        // 0: every socket (the programs' global `kpng_host_netns`, read-only to them).
        let netns = host_netns.unwrap_or(0);
        let mut ebpf = EbpfLoader::new()
            // No CO-RE relocations in these programs (they read only `bpf_sock_addr`, which
            // the verifier rewrites): without the kernel's BTF (parsed by `new()`, 5 MB of
            // types) the load neither keeps nor walks it.
            .btf(None)
            .default_map_pin_directory(&maps)
            .override_global(HOST_NETNS, &netns, true)
            .load(&OBJECT.0)
            .map_err(|e| permission_hint(bpf_err("loading the socket programs", e)))?;
        let cg = File::open(cgroup)
            .map_err(|e| Error::io(format!("opening cgroup {}", cgroup.display()), e))?;
        let mut pinned = Vec::with_capacity(PROGRAMS.len());
        for name in PROGRAMS {
            let fd = attach(&mut ebpf, name, Load::First, &cg, cgroup).map_err(permission_hint)?;
            pinned.push((name, pin_over(fd, &links, name)?));
        }
        let own = PROGRAMS
            .iter()
            .filter_map(|name| ebpf.program(name))
            .map(|p| {
                use std::os::fd::AsFd;
                let fd = p.fd().map_err(|e| bpf_err("program fd", e))?;
                crate::links::program_of(fd.as_fd())
                    .map(|(id, _)| id)
                    .map_err(|e| Error::io("reading a program's id", e))
            })
            .collect::<Result<_, Error>>()?;
        // A newer build's programs this one lacks (after a rollback) keep running against maps
        // this build now writes alone: their pins go, which detaches them.
        remove_unknown_links(&links)?;
        // What another layout's maps hold that this one's mean the same way goes on.
        for carried in carry_over(&ebpf, pin_dir) {
            tracing::info!("carried over {carried}: its definition did not change");
        }
        // The previous programs are detached: pins of another layout have no reader left.
        crate::pins::remove_other_layouts(pin_dir, VERSION);
        Ok(Kernel {
            frontends: take(&mut ebpf, MapId::Frontends.name())?,
            slots: take(&mut ebpf, MapId::Slots.name())?,
            members: take(&mut ebpf, MapId::Members.name())?,
            reverse: take(&mut ebpf, "kpng_reverse")?,
            ebpf,
            links: pinned,
            pin_dir: pin_dir.to_owned(),
            cgroup: cgroup.to_owned(),
            own,
        })
    }

    fn map_data(&self, map: MapId) -> &MapData {
        use aya::maps::IterableMap;
        match map {
            MapId::Frontends => self.frontends.map(),
            MapId::Slots => self.slots.map(),
            MapId::Members => self.members.map(),
        }
    }

    /// Inserts or replaces the elements (keys and values back to back) in `map`, batched.
    pub fn write(&self, map: MapId, keys: &[u8], values: &[u8]) -> Result<(), Error> {
        if keys.is_empty() {
            return Ok(());
        }
        self.batch(map)
            .update(keys, values)
            .map_err(|e| self.update_error(map, &e))
    }

    /// The error of a refused update, saying so when the map is full (`E2BIG`: a hash map at
    /// its `max_entries` refuses new keys), which the kernel's own words do not.
    fn update_error(&self, map: MapId, e: &std::io::Error) -> Error {
        if e.raw_os_error() != Some(libc::E2BIG) {
            return Error::Bpf(format!("updating {}: {e}", map.name()));
        }
        let capacity = self
            .map_data(map)
            .info()
            .map(|i| i.max_entries().to_string())
            .unwrap_or_else(|_| "its".into());
        tracing::error!(
            "{} is full ({capacity} entries): the kernel refuses new elements; the next full \
             sync deletes the unwanted ones before it writes",
            map.name()
        );
        Error::Bpf(format!(
            "updating {}: the map is full ({capacity} entries): {e}",
            map.name()
        ))
    }

    /// Deletes the keys (back to back) from `map`, batched; absent keys are fine.
    pub fn delete(&self, map: MapId, keys: &[u8]) -> Result<(), Error> {
        if keys.is_empty() {
            return Ok(());
        }
        self.batch(map)
            .delete(keys)
            .map_err(|e| Error::Bpf(format!("deleting from {}: {e}", map.name())))
    }

    fn batch(&self, map: MapId) -> batch::Map<'_> {
        use std::os::fd::AsFd;
        let (k, v) = map.sizes();
        batch::Map::new(self.map_data(map).fd().as_fd(), k, v)
    }

    /// Applies `steps` in order, each as batches of [`batch::CHUNK`] elements gathered from
    /// its rows (so the buffers stay small whatever the size of the sync); stops at the first
    /// refusal.
    pub fn apply(&mut self, steps: &[Step<'_>]) -> Result<(), Error> {
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        for step in steps {
            let mut map = self.batch(step.map);
            for rows in step.rows.chunks(batch::CHUNK) {
                keys.clear();
                values.clear();
                for &r in rows {
                    keys.extend_from_slice(step.table.key(r as usize));
                    if step.kind == Kind::Upsert {
                        values.extend_from_slice(step.table.value(r as usize));
                    }
                }
                let r = match step.kind {
                    Kind::Upsert => map.update(&keys, &values),
                    Kind::Delete => map.delete(&keys),
                };
                r.map_err(|e| match step.kind {
                    Kind::Upsert => self.update_error(step.map, &e),
                    Kind::Delete => Error::Bpf(format!("deleting from {}: {e}", step.map.name())),
                })?;
            }
        }
        Ok(())
    }

    /// Every entry of one map, as a sealed table (full syncs compare against it); read with
    /// `BPF_MAP_LOOKUP_BATCH` where the kernel has it, a batch at a time ([`batch::Map::dump_each`]):
    /// the frontends' values are kept as digests ([`Table::read_back`]), never whole, and `each`
    /// sees every element as read, for the caller to keep what a digest loses.
    pub fn dump(&self, map: MapId, each: &mut dyn FnMut(&[u8], &[u8])) -> Result<Table, Error> {
        let mut table = Table::read_back(map);
        self.batch(map)
            .dump_each(|k, v| {
                each(k, v);
                table.push_read(k, v);
            })
            .map_err(|e| Error::Bpf(format!("reading {}: {e}", map.name())))?;
        table.seal();
        Ok(table)
    }

    /// The connected sockets translated for a (frontend, endpoint) pair in `pairs` (from the reverse
    /// map, whose key is the socket's cookie and endpoint and whose value the frontend): the
    /// sockets to destroy when those pairs go, by cookie, with the endpoint each is connected to.
    ///
    /// Read in batches (4096 elements per system call): on a busy node the map is full (131,072
    /// sockets), and a walk key by key would cost two system calls per socket on the sync
    /// that removes a UDP endpoint. A map that cannot be read yields no socket: the sockets
    /// then stay until their owner closes them, as before the backend destroyed any.
    pub fn translated_sockets(
        &self,
        pairs: &std::collections::BTreeSet<(std::net::SocketAddr, std::net::SocketAddr)>,
    ) -> std::collections::BTreeMap<u64, (std::net::SocketAddr, std::net::SocketAddr)> {
        use aya::maps::IterableMap;
        use std::os::fd::AsFd;
        let mut map = batch::Map::new(self.reverse.map().fd().as_fd(), REVERSE_KEY, ENDPOINT);
        match map.dump() {
            Ok((keys, values)) => keys
                .chunks_exact(REVERSE_KEY)
                .zip(values.chunks_exact(ENDPOINT))
                // A datagram's entry is an unconnected socket's: nothing to destroy, and
                // nothing sock_diag would find by its peer.
                .filter(|(_, value)| !crate::layout::reverse_is_datagram(value))
                .filter_map(|(key, value)| {
                    let (cookie, endpoint) = crate::layout::reverse_key(key)?;
                    let frontend = crate::layout::endpoint_of(value)?;
                    pairs
                        .contains(&(frontend, endpoint))
                        .then_some((cookie, (frontend, endpoint)))
                })
                .collect(),
            Err(e) => {
                tracing::warn!("reading kpng_reverse: {e}; no UDP socket destroyed this time");
                std::collections::BTreeMap::new()
            }
        }
    }

    /// Every map of the object, by name (the Service maps, the programs' LRU maps, the
    /// counters).
    fn maps(&self) -> Vec<(&'static str, &MapData)> {
        use aya::maps::IterableMap;
        let mut maps: Vec<(&'static str, &MapData)> = vec![
            (MapId::Frontends.name(), self.frontends.map()),
            (MapId::Slots.name(), self.slots.map()),
            (MapId::Members.name(), self.members.map()),
            ("kpng_reverse", self.reverse.map()),
        ];
        // Only the programs use these; they are charged all the same.
        for name in [LRU_MAPS[0], LRU_MAPS[1], crate::counters::MAP] {
            if let Some(aya::maps::Map::LruHashMap(data) | aya::maps::Map::PerCpuArray(data)) =
                self.ebpf.map(name)
            {
                maps.push((name, data));
            }
        }
        maps
    }

    /// Kernel memory charged to each map (`memlock` in the map fd's `/proc/self/fdinfo`):
    /// what the maps cost, reported as a metric. Maps whose figure cannot be read are left out.
    pub fn memory(&self) -> Vec<(&'static str, u64)> {
        use std::os::fd::{AsFd, AsRawFd};
        self.maps()
            .into_iter()
            .filter_map(|(name, data)| {
                let fd = data.fd().as_fd().as_raw_fd();
                let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
                Some((name, memlock(&info)?))
            })
            .collect()
    }

    /// Each map's capacity (`max_entries`); maps whose info cannot be read are left out.
    pub fn capacities(&self) -> Vec<(&'static str, u32)> {
        self.maps()
            .into_iter()
            .filter_map(|(name, data)| Some((name, data.info().ok()?.max_entries())))
            .collect()
    }

    /// Elements in each map the programs fill ([`LRU_MAPS`]), counted with a batched dump (the
    /// kernel keeps no count of a hash map's elements): what `kpng status` reads, at most
    /// 131,072 elements (~7 MB) per map, so only at full and periodic syncs. Maps that cannot
    /// be read are left out.
    pub fn lru_entries(&self) -> Vec<(&'static str, usize)> {
        use std::os::fd::AsFd;
        self.maps()
            .into_iter()
            .filter(|(name, _)| LRU_MAPS.contains(name))
            .filter_map(|(name, data)| {
                let info = data.info().ok()?;
                let (key, value) = (info.key_size() as usize, info.value_size() as usize);
                match batch::Map::new(data.fd().as_fd(), key, value).dump() {
                    Ok((keys, _)) => Some((name, keys.len() / key.max(1))),
                    Err(e) => {
                        tracing::debug!("counting {name}: {e}");
                        None
                    }
                }
            })
            .collect()
    }

    /// A second handle on the programs' counters map (`kpng_counters`), for the scrape-time
    /// reader ([`crate::counters::KernelCounters`]), which lives on another thread.
    pub fn counters(&self) -> Result<aya::maps::PerCpuArray<MapData, u64>, Error> {
        use std::os::fd::AsFd;
        let name = crate::counters::MAP;
        let Some(aya::maps::Map::PerCpuArray(data)) = self.ebpf.map(name) else {
            return Err(Error::Bpf(format!(
                "the object has no per-CPU array {name}"
            )));
        };
        let fd = data
            .fd()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| Error::io(format!("duplicating the fd of {name}"), e))?;
        let data = MapData::from_fd(fd).map_err(|e| bpf_err(format_args!("map {name}"), e))?;
        aya::maps::PerCpuArray::try_from(aya::maps::Map::PerCpuArray(data))
            .map_err(|e| bpf_err(format_args!("map {name}"), e))
    }

    /// Detaches the kpng programs on this kpng's cgroup that are not its own
    /// ([`detach_strangers`]); what it detached, in words. One `BPF_PROG_QUERY` per attach
    /// type when there are none, so it runs at start and at every periodic sync.
    pub fn detach_strangers(&self) -> Result<Vec<String>, Error> {
        detach_strangers(&self.cgroup, &self.own)
    }

    /// The cgroup v2 directory the programs are attached to.
    pub fn cgroup(&self) -> &Path {
        &self.cgroup
    }

    /// The pin directory.
    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// Pins again every link and map whose pin someone removed (an `rm -rf /sys/fs/bpf/*`, a
    /// tool cleaning the bpffs): the programs kept translating, since this process holds their
    /// links and maps, but the next kpng would find nothing to adopt, and would start with
    /// empty maps and programs of its own. Returns the names pinned again; a few `stat`s when
    /// nothing is missing, so it runs at every periodic sync.
    pub fn restore_pins(&mut self) -> Result<Vec<&'static str>, Error> {
        use aya::maps::IterableMap;
        let links_dir = self.pin_dir.join(LINKS);
        let maps_dir = self.pin_dir.join(VERSION);
        let missing_link = |name: &str| !links_dir.join(name).exists();
        let missing_map = |name: &str| !maps_dir.join(name).exists();
        let pinned_maps = || MAP_NAMES.iter().chain([&crate::counters::MAP]);
        if !self.links.iter().any(|(n, _)| missing_link(n))
            && !pinned_maps().any(|n| missing_map(n))
        {
            return Ok(Vec::new());
        }
        for dir in [&links_dir, &maps_dir] {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        }
        let mut restored = Vec::new();
        let mut links = Vec::with_capacity(self.links.len());
        for (name, held) in std::mem::take(&mut self.links) {
            if !missing_link(name) {
                links.push((name, held));
                continue;
            }
            let path = links_dir.join(name);
            match FdLink::from(held).pin(&path) {
                Ok(held) => {
                    links.push((name, held));
                    restored.push(name);
                }
                // aya consumed the link with the failed pin, and with no pin left its
                // program is detached: the caller drops this kernel, and the next sync loads
                // and attaches everything again.
                Err(e) => {
                    self.links = links;
                    return Err(bpf_err(format_args!("pinning {} again", path.display()), e));
                }
            }
        }
        self.links = links;
        let held: [(&'static str, &MapData); 4] = [
            (MapId::Frontends.name(), self.frontends.map()),
            (MapId::Slots.name(), self.slots.map()),
            (MapId::Members.name(), self.members.map()),
            ("kpng_reverse", self.reverse.map()),
        ];
        for (name, data) in held {
            if missing_map(name) {
                data.pin(maps_dir.join(name))
                    .map_err(|e| bpf_err(format_args!("pinning map {name} again"), e))?;
                restored.push(name);
            }
        }
        for (name, map) in self.ebpf.maps() {
            let Some(name) = pinned_maps().find(|n| **n == name) else {
                continue;
            };
            if missing_map(name) {
                map.pin(maps_dir.join(name))
                    .map_err(|e| bpf_err(format_args!("pinning map {name} again"), e))?;
                restored.push(name);
            }
        }
        Ok(restored)
    }

    /// Attaches again every program whose link someone detached (`bpftool link detach`), or
    /// whose cgroup was removed and made again at the same path: the link and its pin survive
    /// both, so pins alone cannot show it, but the hook translates nothing. Each program gets a
    /// new link, pinned over the old one. Returns the names attached again; one `BPF_OBJ_GET`
    /// and one info query per program when all is well, so it runs at every periodic sync,
    /// after [`Kernel::restore_pins`] (which makes sure every pin is there to read).
    pub fn reattach_detached(&mut self) -> Result<Vec<&'static str>, Error> {
        let links_dir = self.pin_dir.join(LINKS);
        let detached: Vec<(&'static str, String)> = self
            .links
            .iter()
            .filter_map(|(name, _)| {
                match crate::links::check(&links_dir.join(name), &self.cgroup) {
                    LinkState::Attached => None,
                    LinkState::NotAttached(why) => Some((*name, why)),
                    // Attaching blindly could attach a program twice; the next sync looks again.
                    LinkState::Unknown(why) => {
                        tracing::debug!("eBPF program {name}: {why}");
                        None
                    }
                }
            })
            .collect();
        if detached.is_empty() {
            return Ok(Vec::new());
        }
        let cg = File::open(&self.cgroup)
            .map_err(|e| Error::io(format!("opening cgroup {}", self.cgroup.display()), e))?;
        let mut reattached = Vec::with_capacity(detached.len());
        for (name, why) in detached {
            tracing::debug!("eBPF program {name}: {why}; attaching it again");
            let link = attach(&mut self.ebpf, name, Load::Loaded, &cg, &self.cgroup)?;
            let held = pin_over(link, &links_dir, name)?;
            // The old link (detached) goes with its last fd.
            if let Some(slot) = self.links.iter_mut().find(|(n, _)| *n == name) {
                slot.1 = held;
            }
            reattached.push(name);
        }
        Ok(reattached)
    }
}

/// The maps only the programs write (least recently used elements go first): their fill is
/// counted from the kernel, not known from what kpng wrote.
pub const LRU_MAPS: [&str; 3] = ["kpng_affinity", "kpng_flows", "kpng_reverse"];

/// Every map of the object that holds Service or socket state, by name: each is pinned in the
/// layout's directory. The programs' counters (`kpng_counters`, [`crate::counters::MAP`]) are
/// pinned there too, but hold no elements to show.
pub const MAP_NAMES: [&str; 6] = [
    "kpng_frontends",
    "kpng_slots",
    "kpng_members",
    "kpng_affinity",
    "kpng_flows",
    "kpng_reverse",
];

/// Removes the link pins in `links_dir` of programs this build does not have: a newer kpng's
/// extra hook, left attached when the node rolls back to this build, and a `new-` pin a
/// crash left between [`pin_over`]'s pin and rename. Removing the last pin of a link nobody
/// holds open detaches its program.
fn remove_unknown_links(links_dir: &Path) -> Result<(), Error> {
    let entries = std::fs::read_dir(links_dir)
        .map_err(|e| Error::io(format!("reading {}", links_dir.display()), e))?;
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        if PROGRAMS.iter().any(|p| name == *p) {
            continue;
        }
        let path = entry.path();
        std::fs::remove_file(&path)
            .map_err(|e| Error::io(format!("removing {}", path.display()), e))?;
        tracing::info!(
            "removed {} (the link of a program this build does not have, as a newer kpng's \
             after a rollback): that program is detached",
            path.display()
        );
    }
    Ok(())
}

/// The maps whose elements are carried over from another layout's directory when their
/// definition (type, key and value sizes, flags) is the same as this build's: a layout change
/// that does not touch them keeps them. `kpng_reverse` ((socket cookie, endpoint) → frontend)
/// depends on nothing else the layout holds: without it, connected UDP sockets' replies and
/// TCP `getpeername()` show the endpoint instead of the Service after an upgrade, and the
/// sockets of a leaving endpoint are not destroyed. Not `kpng_affinity`: its keys hold service
/// ids, which a new layout's maps number afresh. A change to the meaning of a carried map's
/// elements that keeps their sizes must rename the map or take it off this list.
pub const CARRIED: [&str; 1] = ["kpng_reverse"];

/// Copies the elements of each [`CARRIED`] map pinned in another layout's directory under
/// `pin_dir` into this build's map of the same name, when both have the same definition.
/// Best effort (a failure is a warning: the map starts empty, as before). Returns what was
/// carried over, in words.
fn carry_over(ebpf: &Ebpf, pin_dir: &Path) -> Vec<String> {
    let mut carried = Vec::new();
    // kpng's own directories only: another tool's `v2` holds nothing of kpng's.
    let Ok(found) = crate::pins::contents(pin_dir) else {
        return carried;
    };
    for dir in found.owned.into_iter().filter(|p| p.is_dir()) {
        let Some(layout) = dir.file_name().map(std::ffi::OsStr::to_os_string) else {
            continue;
        };
        if layout == LINKS || layout == VERSION {
            continue;
        }
        for name in CARRIED {
            let old = dir.join(name);
            if !old.exists() {
                continue;
            }
            match carry(ebpf, name, &old) {
                Ok(Some(n)) => carried.push(format!(
                    "{n} elements of {name} from layout {}",
                    layout.to_string_lossy()
                )),
                Ok(None) => tracing::info!(
                    "{name} of layout {} has another definition than {VERSION}'s: not carried over",
                    layout.to_string_lossy()
                ),
                Err(e) => tracing::warn!("carrying {} over: {e}", old.display()),
            }
        }
    }
    carried
}

/// Copies the elements of the map pinned at `old` into this build's map `name` if their
/// definitions match; how many, or `None` when they do not match.
fn carry(ebpf: &Ebpf, name: &str, old: &Path) -> Result<Option<usize>, Error> {
    use aya::maps::Map;
    use std::os::fd::AsFd;
    let Some(Map::HashMap(new) | Map::LruHashMap(new)) = ebpf.map(name) else {
        return Err(Error::Bpf(format!("the object has no hash map {name}")));
    };
    let old = MapData::from_pin(old)
        .map_err(|e| bpf_err(format_args!("opening {}", old.display()), e))?;
    let info = |m: &MapData| {
        m.info()
            .map_err(|e| bpf_err(format_args!("map {name}"), e))
            .map(|i| {
                (
                    i.map_type().ok(),
                    i.key_size() as usize,
                    i.value_size() as usize,
                    i.map_flags(),
                )
            })
    };
    let (was, now) = (info(&old)?, info(new)?);
    if was != now || was.0.is_none() {
        return Ok(None);
    }
    let (_, key, value, _) = now;
    let (keys, values) = batch::Map::new(old.fd().as_fd(), key, value)
        .dump()
        .map_err(|e| Error::io(format!("reading the old {name}"), e))?;
    batch::Map::new(new.fd().as_fd(), key, value)
        .update(&keys, &values)
        .map_err(|e| Error::io(format!("writing {name}"), e))?;
    Ok(Some(keys.len() / key.max(1)))
}

/// The `memlock:` figure of a BPF map's fdinfo text.
pub fn memlock(fdinfo: &str) -> Option<u64> {
    fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("memlock:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_memlock_from_fdinfo() {
        let text = "pos:\t0\nflags:\t02000002\nmap_type:\t1\nmemlock:\t1234\nmap_id:\t7\n";
        assert_eq!(super::memlock(text), Some(1234));
        assert_eq!(super::memlock("pos: 0\n"), None);
    }
}
