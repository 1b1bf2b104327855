//! Deciding whether root-only tests can run.

/// Whether the process runs with effective uid 0, which the namespace tests need.
///
/// Read from the `Uid:` line of `/proc/self/status` (real, effective, saved, fs),
/// so no libc call and no `unsafe` is needed. `false` if it cannot be read.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| effective_uid(&s))
        == Some(0)
}

fn effective_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Whether the environment says we run in CI (`CI` set, and not `""`, `0` or `false`).
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"))
}

/// Where skipped root-only tests are recorded: `KPNG_SKIPPED_TESTS` names a file that the
/// test script (`scripts/test.sh`) creates and reads back after `cargo test`, to print how many
/// tests did not run and which. A skipped test still shows as `ok` in cargo's own report
/// (stable Rust has no run-time skip), so this record is what keeps a skip from passing
/// for a pass.
pub const SKIPPED_TESTS_ENV: &str = "KPNG_SKIPPED_TESTS";

/// The function behind [`require_root!`](crate::require_root): `true` when the
/// test `test` may go on. When not root it records the test as skipped (see
/// [`SKIPPED_TESTS_ENV`]), prints `SKIPPED TEST: needs root (network namespaces)` and returns
/// `false`, except in CI (`CI` set), where it panics: root-only tests must not skip there.
#[track_caller]
pub fn root_or_skip(test: &str) -> bool {
    if is_root() {
        return true;
    }
    assert!(
        !in_ci(),
        "{test}: needs root (network namespaces), and CI is set: refusing to skip"
    );
    record_skip(test);
    eprintln!("SKIPPED {test}: needs root (network namespaces)");
    false
}

/// Appends `test` to the skip record, one name per line. Without the record file (plain
/// `cargo test`), the skip is only printed.
fn record_skip(test: &str) {
    use std::io::Write;
    let Some(path) = std::env::var_os(SKIPPED_TESTS_ENV) else {
        return;
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path);
    if let Ok(mut file) = file {
        let _ = writeln!(file, "{test}");
    }
}

/// Skip the calling test when not root (return from the enclosing function);
/// panic instead when the `CI` environment variable is set.
///
/// `require_root!()` returns `()`; `require_root!(value)` returns `value`, for
/// tests that return a `Result`. The test's name in the message is the enclosing
/// function's path.
///
/// ```no_run
/// #[test]
/// fn needs_namespaces() {
///     kpng_testkit::require_root!();
///     // ... create a Cluster ...
/// }
/// ```
#[macro_export]
macro_rules! require_root {
    () => {
        $crate::require_root!(())
    };
    ($ret:expr) => {
        if !$crate::root_or_skip({
            fn f() {}
            let name = ::std::any::type_name_of_val(&f);
            name.strip_suffix("::f").unwrap_or(name)
        }) {
            return $ret;
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_effective_uid() {
        let s = "Name:\tx\nUmask:\t0022\nUid:\t1000\t0\t0\t0\nGid:\t0\t0\t0\t0\n";
        assert_eq!(effective_uid(s), Some(0));
        assert_eq!(effective_uid("Uid:\t0\t1000\t0\t0\n"), Some(1000));
        assert_eq!(effective_uid("Name: x\n"), None);
    }

    #[test]
    fn macro_returns_its_value_when_skipping() {
        if !is_root() && in_ci() {
            return; // would (rightly) panic
        }
        fn g() -> u8 {
            crate::require_root!(7);
            1
        }
        assert_eq!(g(), if is_root() { 1 } else { 7 });
    }
}
