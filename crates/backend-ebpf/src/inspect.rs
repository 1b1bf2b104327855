//! What a running eBPF backend has in the kernel, read from its pins when `kpng status` asks:
//! whether every program's link is pinned and attached to the cgroup, and how full each map is.
//!
//! Why: the nftables half of `to-local ebpf` has its table to look at, the socket half had
//! nothing; and when its programs are not where the operator thinks (a DaemonSet whose
//! `--cgroup-path` is the container's own cgroup), traffic still flows through the rules, so
//! nothing else would say that local sockets are not translated. Reading costs a batched dump
//! per map (a 30k-Service frontends map in ~10 ms), done on demand and never on the sync path.

use std::path::Path;

use aya::maps::MapData;

use crate::batch;
use crate::kernel::{LINKS, MAP_NAMES, PROGRAMS};
use crate::layout::VERSION;
use crate::links::{LinkState, check};

/// One map's fill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapFill {
    /// The map's name (`kpng_frontends`).
    pub name: &'static str,
    /// Elements in it now.
    pub entries: usize,
    /// Its capacity.
    pub max_entries: u32,
}

impl MapFill {
    /// Whether it is full enough (90 %) to say so unasked: a full hash map refuses new
    /// frontends; a full LRU map evicts.
    pub fn nearly_full(&self) -> bool {
        self.max_entries > 0 && self.entries * 10 >= self.max_entries as usize * 9
    }
}

/// What the pin directory shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspection {
    /// The programs whose link is pinned and attached to the cgroup (or pinned, when the
    /// cgroup to compare with is unknown).
    pub pinned: Vec<&'static str>,
    /// The programs whose link pin is missing.
    pub missing: Vec<&'static str>,
    /// The programs whose link is pinned but not attached to the cgroup (detached, attached
    /// elsewhere, or unreadable), and why.
    pub not_attached: Vec<(&'static str, String)>,
    /// Each map that could be opened, with its fill; maps that could not are in `unreadable`.
    pub maps: Vec<MapFill>,
    /// Maps that are not pinned or cannot be read, and why.
    pub unreadable: Vec<(&'static str, String)>,
    /// The programs of which a kpng program is attached to the cgroup, by the cgroup's own
    /// list (`BPF_PROG_QUERY`): true whether the pins are there or not. `None` when the cgroup
    /// is unknown or could not be asked.
    pub attached: Option<Vec<&'static str>>,
    /// kpng programs attached to the cgroup that are not the pinned links' (another
    /// generation's, which runs before this kpng's and translates from maps nobody updates), by
    /// hook name and program id. Without a pin to compare with, every one of a hook but the
    /// last attached (the running kpng's) counts.
    pub strangers: Vec<(&'static str, u32)>,
}

/// Reads the links and maps pinned under `pin_dir` (the backend's `--bpf-pin-path`); each
/// pinned link is checked against `cgroup`, the directory the programs should be attached to.
pub fn inspect(pin_dir: &Path, cgroup: Option<&Path>) -> Inspection {
    let links = pin_dir.join(LINKS);
    let (pinned, missing): (Vec<&'static str>, Vec<&'static str>) =
        PROGRAMS.iter().partition(|name| links.join(name).exists());
    let mut not_attached = Vec::new();
    let pinned = pinned
        .into_iter()
        .filter(|name| {
            let state = cgroup.map_or(LinkState::Attached, |cg| check(&links.join(name), cg));
            match state {
                LinkState::Attached => true,
                LinkState::NotAttached(why) | LinkState::Unknown(why) => {
                    not_attached.push((*name, why));
                    false
                }
            }
        })
        .collect();
    let (attached, strangers) = match cgroup.map(crate::kernel::kpng_programs) {
        Some(Ok(on_cgroup)) => {
            let mut attached = Vec::new();
            let mut strangers = Vec::new();
            for name in PROGRAMS {
                let mine: Vec<u32> = on_cgroup
                    .iter()
                    .filter(|(n, _)| *n == name)
                    .map(|(_, p)| p.id)
                    .collect();
                let own = crate::links::pinned_link_program(&links.join(name))
                    .ok()
                    .map(|(_, id)| id)
                    .filter(|id| mine.contains(id))
                    .or_else(|| mine.last().copied());
                if own.is_some() {
                    attached.push(name);
                }
                strangers.extend(
                    mine.iter()
                        .filter(|id| Some(**id) != own)
                        .map(|id| (name, *id)),
                );
            }
            (Some(attached), strangers)
        }
        _ => (None, Vec::new()),
    };
    let mut maps = Vec::new();
    let mut unreadable = Vec::new();
    for name in MAP_NAMES {
        match fill(&pin_dir.join(VERSION).join(name), name) {
            Ok(f) => maps.push(f),
            Err(why) => unreadable.push((name, why)),
        }
    }
    Inspection {
        pinned,
        missing,
        not_attached,
        maps,
        unreadable,
        attached,
        strangers,
    }
}

/// Whether the frontends map pinned under `pin_dir` (this build's layout, the one a restarted
/// kpng adopts) holds a Service frontend: the programs an earlier run attached keep
/// translating with it until the first sync converges it. Asked once at start (one batched
/// dump, ~10 ms at 30k Services); a missing or unreadable map is "no".
pub fn frontends_pinned(pin_dir: &Path) -> bool {
    let name = crate::plan::MapId::Frontends.name();
    fill(&pin_dir.join(VERSION).join(name), name).is_ok_and(|f| f.entries > 0)
}

fn fill(path: &Path, name: &'static str) -> Result<MapFill, String> {
    use std::os::fd::AsFd;
    let data = MapData::from_pin(path).map_err(|e| e.to_string())?;
    let info = data.info().map_err(|e| e.to_string())?;
    let (key, value) = (info.key_size() as usize, info.value_size() as usize);
    let (keys, _) = batch::Map::new(data.fd().as_fd(), key, value)
        .dump()
        .map_err(|e| e.to_string())?;
    Ok(MapFill {
        name,
        entries: keys.len() / key.max(1),
        max_entries: info.max_entries(),
    })
}
