//! Finding (and if need be building) this crate's helper binaries.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::SystemTime;

use crate::error::{Error, Result};
use crate::netns::run;

/// Environment variable naming a directory that holds `kpng-echo` and `kpng-probe`;
/// when set, [`bin_path`] looks only there and never builds.
pub const ENV_BIN_DIR: &str = "KPNG_TESTKIT_BIN_DIR";

/// Binaries already located by this process (also serialises builds).
static FOUND: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);

/// The package building a helper binary, and its source directory (relative to this
/// crate's): this crate's `kpng-echo`, `kpng-probe`, `kpng-demo`, and the fake API
/// server's `kpng-fake-apiserver` (run inside namespaces by the `kube` source's tests).
fn package_of(name: &str) -> (&'static str, &'static str) {
    match name {
        "kpng-fake-apiserver" => ("kpng-fake-apiserver", "../fake-apiserver"),
        _ => ("kpng-testkit", "."),
    }
}

/// Path of a helper binary (`"kpng-echo"`, `"kpng-probe"`, `"kpng-fake-apiserver"`).
///
/// It exists because cargo does not build a dev-dependency's binaries for the
/// tests of the crate that depends on it. Lookup order:
///
/// 1. `$KPNG_TESTKIT_BIN_DIR/NAME` if that variable is set (an error if missing).
/// 2. `NAME` in the profile directory of the running test executable: the
///    executable's own directory, or its parent when that is `deps`
///    (`target/debug/deps/foo-HASH` -> `target/debug/NAME`).
/// 3. Otherwise, or when a file under its package's `src/` is newer than the binary,
///    it runs `cargo build -p PACKAGE --bins` (`$CARGO`, else `cargo`) with
///    that target directory and profile, and returns the fresh binary. The first
///    call may therefore take a while (and wait for cargo's build lock).
///
/// The result is cached for the life of the process.
pub fn bin_path(name: &str) -> Result<PathBuf> {
    let mut guard = FOUND
        .lock()
        .map_err(|_| Error::Other("bin_path cache poisoned by a panic".into()))?;
    let cache = guard.get_or_insert_with(HashMap::new);
    if let Some(p) = cache.get(name) {
        return Ok(p.clone());
    }
    let path = locate(name)?;
    cache.insert(name.to_owned(), path.clone());
    Ok(path)
}

/// The cargo profile directory (`…/debug`, `…/release`) an executable was built into: its own
/// directory, or the parent when that is `deps` (test executables). The binaries of one build
/// sit side by side there, wherever `CARGO_TARGET_DIR` or a cargo config put the target dir.
pub fn profile_dir_of(exe: &Path) -> Option<&Path> {
    let dir = exe.parent()?;
    if dir.file_name().is_some_and(|n| n == "deps") {
        return Some(dir.parent().unwrap_or(dir));
    }
    Some(dir)
}

/// Binary `name` of the same build as the running program (its profile directory), e.g. the
/// `kpng` that `kpng-demo` and `kpng-bench` drive by default. `None` when the running
/// program's path is unknown. Guessing `target/debug/NAME` instead ignored `CARGO_TARGET_DIR`
/// and could run a stale binary left in `target/`.
pub fn sibling_bin(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    profile_dir_of(&exe).map(|dir| dir.join(name))
}

fn locate(name: &str) -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(ENV_BIN_DIR) {
        let p = Path::new(&dir).join(name);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(Error::Other(format!(
                "{ENV_BIN_DIR} is set but {} does not exist",
                p.display()
            )))
        };
    }
    let exe = std::env::current_exe().map_err(|e| Error::io("locating the test executable", e))?;
    let dir = profile_dir_of(&exe)
        .ok_or_else(|| Error::Other(format!("{} has no parent directory", exe.display())))?;
    let candidate = dir.join(name);
    let (package, source) = package_of(name);
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(source);
    if candidate.is_file() && !sources_newer_than(&source, &candidate) {
        return Ok(candidate);
    }
    build(dir, package, &source)?;
    if candidate.is_file() {
        Ok(candidate)
    } else {
        Err(Error::Other(format!(
            "built {package}'s binaries but {} is still missing; set {ENV_BIN_DIR} \
             to the directory holding {name}",
            candidate.display()
        )))
    }
}

/// Whether any file under the package's `src/` was modified after `bin`.
fn sources_newer_than(package_dir: &Path, bin: &Path) -> bool {
    let Some(built) = mtime(bin) else { return true };
    newest_mtime(&package_dir.join("src")).is_some_and(|t| t > built)
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

fn newest_mtime(dir: &Path) -> Option<SystemTime> {
    let mut newest = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let p = entry.path();
        let t = if p.is_dir() {
            newest_mtime(&p)
        } else {
            mtime(&p)
        };
        newest = newest.max(t);
    }
    newest
}

/// `cargo build -p PACKAGE --bins` into the target dir and profile that
/// `profile_dir` (e.g. `target/debug`) belongs to.
fn build(profile_dir: &Path, package: &str, package_dir: &Path) -> Result<()> {
    let target_dir = profile_dir.parent().ok_or_else(|| {
        Error::Other(format!(
            "{} is not inside a cargo target directory; set {ENV_BIN_DIR}",
            profile_dir.display()
        ))
    })?;
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev",
        Some(other) => other,
        None => "dev",
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = package_dir.join("Cargo.toml");
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(&manifest)
        .args(["-p", package, "--bins", "--profile", profile])
        .arg("--target-dir")
        .arg(target_dir);
    run(&mut cmd).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_dir_follows_the_executable_not_target() {
        for (exe, want) in [
            ("/work/t/debug/kpng-demo", Some("/work/t/debug")),
            ("/work/t/release/kpng-bench", Some("/work/t/release")),
            ("/work/t/debug/deps/demo-0123abcd", Some("/work/t/debug")),
            ("target/debug/kpng-demo", Some("target/debug")),
            ("kpng-demo", Some("")),
            ("/", None),
        ] {
            assert_eq!(
                profile_dir_of(Path::new(exe)),
                want.map(Path::new),
                "profile directory of {exe}"
            );
        }
    }

    #[test]
    fn sibling_bin_is_in_this_builds_target_dir() {
        let exe = std::env::current_exe().expect("current_exe");
        let kpng = sibling_bin("kpng").expect("sibling_bin");
        // This test executable is `<target>/<profile>/deps/kpng_testkit-HASH`.
        assert_eq!(
            kpng.parent(),
            exe.parent().and_then(Path::parent),
            "{kpng:?}"
        );
        if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
            assert!(kpng.starts_with(&dir), "{kpng:?} is not under {dir:?}");
        }
    }
}
