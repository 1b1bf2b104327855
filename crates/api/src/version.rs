//! The version exchange between a brain and its nodes: each side sends its kpng build in a
//! gRPC metadata header ([`HEADER`], the node with its Watch request, the brain with its
//! response headers), shows the other's in `kpng status`, and warns once when their
//! major.minor versions differ.
//!
//! The value is the build's identity, [`build`]: the version and the git commit
//! (`0.1.0+1a2b3c4d5e6f`), since every build of a release has the same version and a rollout
//! from one commit to the next was invisible. The commit is the binary's (`kpng_build_info`'s
//! `git_commit`), passed in by it: this crate does not know it. Peers before 2026-12-07 sent
//! the version alone, and read ours as one ([`mismatch`] ignores what follows a `+`).
//!
//! Why a header and not a message field: KPNG's Go clients and servers ignore metadata they do
//! not know, so the `localv1` messages stay KPNG's, and the peer's version is known at the
//! stream's headers, before any state (a refused node still learns its brain's version).
//! Without it an operator mid-rollout could not tell which nodes run which build against
//! which brain, and a mismatch that changes the protocol's meaning went unnoticed.

use std::collections::BTreeSet;
use std::sync::Mutex;

/// This build's version (the workspace's: every kpng crate has the binary's).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The identity a build sends in [`HEADER`]: [`VERSION`]`+COMMIT` (semver build metadata), or
/// [`VERSION`] alone when the commit is not known (empty, `unknown`: a build outside git).
/// Two builds of one release then differ in `kpng status` and in the brain's
/// `kpng_api_connected_node_versions`, while [`mismatch`] still compares major.minor only.
pub fn build(git_commit: &str) -> String {
    let commit = git_commit.trim();
    if commit.is_empty() || commit == "unknown" {
        VERSION.to_string()
    } else {
        format!("{VERSION}+{commit}")
    }
}

/// The gRPC metadata header (request on the node's side, response on the brain's) that holds
/// the sender's kpng version. A peer without it is KPNG's or a kpng before 2026-12-07.
pub const HEADER: &str = "kpng-version";

/// How many characters of a peer's version are kept: a version is a few characters, and the
/// value reaches the log and `kpng status`.
const MAX_CHARS: usize = 64;

/// A peer's version as sent in [`HEADER`], made safe to show: visible ASCII only (anything
/// else becomes `?`), at most 64 characters. `None` for an empty value.
pub fn from_header(value: &[u8]) -> Option<String> {
    let shown: String = value
        .iter()
        .take(MAX_CHARS)
        .map(|&b| {
            if b.is_ascii_graphic() {
                char::from(b)
            } else {
                '?'
            }
        })
        .collect();
    (!shown.is_empty()).then_some(shown)
}

/// `major.minor` of a version (`0.1` of `0.1.0`, `v1.2.3-rc1` → `1.2`); `None` when it does
/// not start with two numbers.
fn major_minor(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.trim_start_matches('v').split(['.', '-', '+']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Whether a peer running `theirs` may not speak this build's protocol as it means it: their
/// major.minor versions differ, or theirs is not a version this build can read. Patch
/// releases never change the protocol's meaning.
pub fn mismatch(ours: &str, theirs: &str) -> bool {
    match (major_minor(ours), major_minor(theirs)) {
        (Some(a), Some(b)) => a != b,
        _ => ours != theirs,
    }
}

/// The peer versions already warned about, so that a mismatch is warned once per version and
/// not once per node (a brain with a thousand nodes of an older minor during a rollout logs
/// one line).
#[derive(Debug, Default)]
pub struct Warned(Mutex<BTreeSet<String>>);

impl Warned {
    /// Whether `theirs` mismatches `ours` and was not warned about yet (and marks it).
    pub fn first_mismatch(&self, ours: &str, theirs: &str) -> bool {
        if !mismatch(ours, theirs) {
            return false;
        }
        // Bounded: a peer that sends a new version each time fills it up to this many.
        const MAX_REMEMBERED: usize = 256;
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if seen.contains(theirs) || seen.len() >= MAX_REMEMBERED {
            return false;
        }
        seen.insert(theirs.to_string());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_different_major_or_minor_is_a_mismatch() {
        for (ours, theirs, want) in [
            ("0.1.0", "0.1.0", false),
            ("0.1.0", "0.1.7", false),
            ("0.1.0", "v0.1.2-rc1", false),
            ("0.1.0", "0.2.0", true),
            ("0.1.0", "1.1.0", true),
            ("0.1.0", "dev", true),
            ("0.1.0", "0", true),
        ] {
            assert_eq!(mismatch(ours, theirs), want, "{ours} vs {theirs}");
        }
    }

    #[test]
    fn a_build_is_its_version_and_commit_and_matches_its_release() {
        let ours = build("1a2b3c4d5e6f");
        assert_eq!(ours, format!("{VERSION}+1a2b3c4d5e6f"));
        assert_eq!(
            build("1a2b3c4d5e6f-dirty"),
            format!("{VERSION}+1a2b3c4d5e6f-dirty")
        );
        assert_eq!(build("unknown"), VERSION);
        assert_eq!(build(""), VERSION);
        // Another commit of the release differs, but is no mismatch (nor is an older peer's
        // bare version): the warning stays about major.minor.
        assert_ne!(ours, build("ffffffffffff"));
        assert!(!mismatch(&ours, &build("ffffffffffff")));
        assert!(!mismatch(&ours, VERSION));
        assert!(!mismatch(VERSION, &ours));
        assert_eq!(from_header(ours.as_bytes()), Some(ours.clone()));
    }

    #[test]
    fn a_header_value_is_shown_safely_and_short() {
        assert_eq!(from_header(b"0.1.0"), Some("0.1.0".into()));
        assert_eq!(from_header(b""), None);
        assert_eq!(from_header(b"0.1\x1b[2J"), Some("0.1?[2J".into()));
        assert_eq!(from_header(&[b'9'; 100]).map(|v| v.len()), Some(64));
    }

    #[test]
    fn a_mismatch_is_warned_once_per_version() {
        let warned = Warned::default();
        assert!(!warned.first_mismatch("0.1.0", "0.1.3"));
        assert!(warned.first_mismatch("0.1.0", "0.2.0"));
        assert!(!warned.first_mismatch("0.1.0", "0.2.0"));
        assert!(warned.first_mismatch("0.1.0", "0.3.0"));
    }
}
