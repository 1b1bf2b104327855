//! Records the git commit and the build time for `kpng version` and `kpng_build_info`, so an
//! operator can tell which code a node runs. Outside a git checkout (a source tarball) the
//! commit is `unknown`; `SOURCE_DATE_EPOCH` (reproducible builds) fixes the build time.

use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string()).filter(|s| !s.is_empty())
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some();
    let commit = if dirty && commit != "unknown" {
        format!("{commit}-dirty")
    } else {
        commit
    };
    let built = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or_else(SystemTime::now, |secs| {
            UNIX_EPOCH + Duration::from_secs(secs)
        });
    println!("cargo:rustc-env=KPNG_GIT_COMMIT={commit}");
    println!(
        "cargo:rustc-env=KPNG_BUILD_DATE={}",
        humantime::format_rfc3339_seconds(built)
    );
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    // A new commit or checkout re-runs this script (worktrees keep HEAD in their own git dir).
    for path in ["HEAD", "index"] {
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    if let Some(head_ref) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(p) = git(&["rev-parse", "--git-path", &head_ref])
    {
        println!("cargo:rerun-if-changed={p}");
    }
}
