//! What kpng owns in its pin directory (`--bpf-pin-path`), and the rules that keep it to that.
//!
//! Why: the pin directory used to be taken as kpng's alone. A start removed every entry but
//! `links` and its layout's directory, and `kpng cleanup` removed the whole directory. Pointed
//! at a bpffs mount root, as the docs once advised, a start deleted other tools' pins (Cilium's
//! `tc/globals`) and then failed every sync on the kernel's own `progs.debug`. Now kpng removes
//! only what it creates, and refuses a pin directory that it would share ([`check`]).
//!
//! kpng creates `links/` (its programs' link pins `kpng_*`, and `new-kpng_*` for a moment), one
//! directory per map layout (`v1`, `v2`, `v3`…, holding `kpng_*` map pins) and, in builds from
//! before layout versions, `kpng_*` map pins in the directory itself. A directory counts as
//! kpng's only when it holds kpng's names and nothing else: another tool's `v2` is left alone.

use std::path::{Path, PathBuf};

use crate::Error;
use crate::kernel::LINKS;

/// Whether `name` is a layout directory's name: `v` and a number.
fn is_layout(name: &str) -> bool {
    name.strip_prefix('v')
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether an entry of the pin directory is kpng's: a `kpng_*` pin, or a `links` or layout
/// directory holding only kpng's pins. `children` is `None` for a pin (a file), else the
/// directory's entries as (name, is a directory).
fn is_kpngs(name: &str, children: Option<&[(String, bool)]>) -> bool {
    let Some(children) = children else {
        return name.starts_with("kpng_");
    };
    let links = name == LINKS;
    (links || is_layout(name))
        && children.iter().all(|(child, dir)| {
            !dir && (child.starts_with("kpng_") || (links && child.starts_with("new-kpng_")))
        })
}

/// The entries of `dir`: (name, path, is a directory).
fn entries(dir: &Path) -> Result<Vec<(String, PathBuf, bool)>, Error> {
    let read =
        std::fs::read_dir(dir).map_err(|e| Error::io(format!("reading {}", dir.display()), e))?;
    Ok(read
        .filter_map(Result::ok)
        .map(|e| {
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            (
                e.file_name().to_string_lossy().into_owned(),
                e.path(),
                is_dir,
            )
        })
        .collect())
}

/// What a pin directory holds, sorted into kpng's entries and everything else.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Contents {
    /// kpng's entries (`links` first: removing it detaches the programs before their maps go).
    pub owned: Vec<PathBuf>,
    /// The names of the entries that are not kpng's.
    pub foreign: Vec<String>,
}

/// What `pin_dir` holds (nothing when it does not exist).
pub fn contents(pin_dir: &Path) -> Result<Contents, Error> {
    let mut out = Contents::default();
    if !pin_dir.exists() {
        return Ok(out);
    }
    for (name, path, is_dir) in entries(pin_dir)? {
        let children = if is_dir {
            Some(
                entries(&path)?
                    .into_iter()
                    .map(|(n, _, d)| (n, d))
                    .collect::<Vec<_>>(),
            )
        } else {
            None
        };
        if is_kpngs(&name, children.as_deref()) {
            if name == LINKS {
                out.owned.insert(0, path);
            } else {
                out.owned.push(path);
            }
        } else {
            out.foreign.push(name);
        }
    }
    out.foreign.sort();
    Ok(out)
}

/// Whether `pin_dir` is the root of a bpffs mount.
fn is_mount_root(pin_dir: &Path) -> bool {
    let real = std::fs::canonicalize(pin_dir).unwrap_or_else(|_| pin_dir.to_owned());
    crate::host::bpffs_mount_of(pin_dir).is_some_and(|m| m == real)
}

/// Where kpng's pins should go instead of `pin_dir`: `<bpffs mount>/kpng`.
fn suggestion(pin_dir: &Path) -> PathBuf {
    crate::host::bpffs_mount_of(pin_dir)
        .unwrap_or_else(|| pin_dir.parent().unwrap_or(pin_dir).to_owned())
        .join("kpng")
}

/// Refuses a pin directory kpng cannot have to itself: the root of a bpffs mount (the kernel's
/// `progs.debug` and `maps.debug` are there, and every other tool's pins), or a directory
/// holding entries that are not kpng's. Why: kpng removes its pins on upgrades, switches to
/// another backend and `kpng cleanup`; in a shared directory, a mistake there would take
/// other tools' pins with them. A directory that does not exist yet is fine.
pub fn check(pin_dir: &Path) -> Result<(), Error> {
    let instead = suggestion(pin_dir);
    if is_mount_root(pin_dir) {
        return Err(Error::Setup(format!(
            "--bpf-pin-path {} is the root of a BPF file system, which other tools share (the \
             kernel's own progs.debug and maps.debug are there, and e.g. Cilium's tc/globals): \
             kpng keeps its pins in a directory of its own, so that removing them (an upgrade, \
             a switch to another backend, `kpng cleanup`) never touches another tool's; pass \
             --bpf-pin-path {}",
            pin_dir.display(),
            instead.display()
        )));
    }
    let found = contents(pin_dir)?;
    if found.foreign.is_empty() {
        return Ok(());
    }
    const SHOWN: usize = 5;
    let mut names = found.foreign[..found.foreign.len().min(SHOWN)].join(", ");
    if found.foreign.len() > SHOWN {
        names.push_str(&format!(" and {} more", found.foreign.len() - SHOWN));
    }
    let instead = if instead == std::fs::canonicalize(pin_dir).unwrap_or_default() {
        "another, empty directory of its own".to_string()
    } else {
        format!("--bpf-pin-path {}", instead.display())
    };
    Err(Error::Setup(format!(
        "--bpf-pin-path {} holds entries kpng did not create ({names}): kpng keeps its pins in \
         a directory of its own, so that removing them (an upgrade, a switch to another \
         backend, `kpng cleanup`) never touches another tool's; pass {instead}",
        pin_dir.display()
    )))
}

/// Whether `pin_dir` holds anything of kpng's (an empty directory that is no mount root
/// counts: kpng made it).
pub fn holds_pins(pin_dir: &Path) -> bool {
    match contents(pin_dir) {
        Ok(c) if !c.owned.is_empty() => true,
        Ok(c) => {
            c.foreign.is_empty()
                && pin_dir.is_dir()
                && !is_mount_root(pin_dir)
                && std::fs::read_dir(pin_dir).is_ok_and(|mut d| d.next().is_none())
        }
        Err(_) => false,
    }
}

/// What [`remove`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removed {
    /// Whether it removed anything.
    pub any: bool,
    /// The entries that are not kpng's, left in place (with the directory).
    pub kept: Vec<String>,
}

/// Removes kpng's pins under `pin_dir` (links first: that detaches the programs), and the
/// directory when nothing else is left in it and it is no mount root. Entries that are not
/// kpng's stay. Goes on past a failure and names every one. Absent is fine.
pub fn remove(pin_dir: &Path) -> Result<Removed, Error> {
    let found = contents(pin_dir)?;
    let mut out = Removed {
        any: false,
        kept: found.foreign.clone(),
    };
    let mut failed = Vec::new();
    for path in &found.owned {
        let removed = if path.is_dir() {
            std::fs::remove_dir_all(path)
        } else {
            std::fs::remove_file(path)
        };
        match removed {
            Ok(()) => out.any = true,
            Err(e) => failed.push(format!("removing {}: {e}", path.display())),
        }
    }
    if pin_dir.exists() && found.foreign.is_empty() && failed.is_empty() && !is_mount_root(pin_dir)
    {
        match std::fs::remove_dir(pin_dir) {
            Ok(()) => out.any = true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => failed.push(format!("removing {}: {e}", pin_dir.display())),
        }
    }
    if failed.is_empty() {
        Ok(out)
    } else {
        Err(Error::Setup(failed.join("; ")))
    }
}

/// Removes kpng's entries of `pin_dir` other than the links and the layout `keep`: the map
/// pins of other layout versions (before versions, the maps were pinned in the directory
/// itself). Their programs are detached by then, and the maps go with their last pin. Entries
/// that are not kpng's stay; a failure is a warning (the stale maps only cost memory).
pub fn remove_other_layouts(pin_dir: &Path, keep: &str) {
    let found = match contents(pin_dir) {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!("looking for maps of other layouts: {e}");
            return;
        }
    };
    for path in found.owned {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        if matches!(name.as_deref(), Some(n) if n == LINKS || n == keep) {
            continue;
        }
        let removed = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match removed {
            Ok(()) => tracing::info!(
                "removed {} (maps of another layout than {keep})",
                path.display()
            ),
            Err(e) => tracing::warn!("removing {} (maps of another layout): {e}", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (name, children (None: a pin), kpng's?)
    #[test]
    fn only_kpngs_names_are_kpngs() {
        let pins = |names: &[&str]| -> Vec<(String, bool)> {
            names.iter().map(|n| ((*n).to_owned(), false)).collect()
        };
        let with_dir = vec![("kpng_frontends".to_owned(), false), ("x".to_owned(), true)];
        type Children = Option<Vec<(String, bool)>>;
        let cases: [(&str, Children, bool); 16] = [
            ("kpng_services", None, true),
            (
                "links",
                Some(pins(&["kpng_connect4", "new-kpng_connect6"])),
                true,
            ),
            ("links", Some(Vec::new()), true),
            ("v3", Some(pins(&["kpng_frontends", "kpng_counters"])), true),
            ("v12", Some(pins(&["kpng_frontends"])), true),
            ("v2", Some(Vec::new()), true),
            ("v3", Some(pins(&["new-kpng_frontends"])), false),
            ("v3", Some(pins(&["kpng_frontends", "cilium_lb4"])), false),
            ("v3", Some(with_dir), false),
            ("links", Some(pins(&["othertool_link"])), false),
            ("tc", Some(pins(&["globals"])), false),
            ("progs.debug", None, false),
            ("maps.debug", None, false),
            ("v", Some(Vec::new()), false),
            ("vx", Some(Vec::new()), false),
            ("kpng", Some(Vec::new()), false),
        ];
        for (name, children, want) in cases {
            assert_eq!(
                is_kpngs(name, children.as_deref()),
                want,
                "{name} {children:?}"
            );
        }
    }
}
