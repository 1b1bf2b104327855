//! `kpng status -o wide`'s sync history: the last syncs that did something or failed, newest
//! first, one line each (what `-o json|yaml` call `recentSyncs`).
//!
//! Why: the history was only in `-o json|yaml` and on the status page, while the docs sent the
//! reader of a `synced … changes=…` log line to "`kpng status`'s sync history"; an operator at
//! a terminal in the middle of an incident had to read JSON to learn what the last repair or
//! the last failed sync did.

use kpng_runner::admin::SyncStatus;

/// Writes the history section of the text status (nothing when no sync is in it).
pub fn write(out: &mut String, syncs: &[SyncStatus]) {
    use std::fmt::Write as _;
    if syncs.is_empty() {
        return;
    }
    let _ = writeln!(out, "recent syncs (newest first):");
    for s in syncs {
        let _ = writeln!(out, "  {}", line(s));
    }
}

/// One sync: when, outcome, full or partial, operations, duration, then what it carried and,
/// for a failed one, why.
fn line(s: &SyncStatus) -> String {
    let mut l = format!(
        "{}  {}  {}  {} operations  {:.1} ms",
        s.at,
        if s.ok { "ok" } else { "FAILED" },
        if s.full { "full" } else { "partial" },
        s.operations,
        s.duration_seconds * 1e3
    );
    if !s.changes.is_empty() {
        l.push_str("  ");
        l.push_str(&s.changes);
    }
    if let Some(e) = &s.error {
        l.push_str("  error: ");
        l.push_str(e);
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_sync_of_the_history_is_one_line() {
        let sync = |ok: bool, full: bool, changes: &str, error: Option<&str>| SyncStatus {
            at: "2026-12-07T07:16:49.266Z".into(),
            ok,
            full,
            operations: 16,
            duration_seconds: 0.0778,
            changes: changes.into(),
            error: error.map(str::to_string),
        };
        let mut out = String::new();
        write(&mut out, &[]);
        assert_eq!(out, "", "no history, no section");
        write(
            &mut out,
            &[
                sync(
                    true,
                    true,
                    "repair after a change by someone else (ip kpng: table deleted); no \
                     Service port changed",
                    None,
                ),
                sync(false, false, "", Some("Operation not permitted")),
            ],
        );
        assert_eq!(
            out,
            "recent syncs (newest first):\n  2026-12-07T07:16:49.266Z  ok  full  16 operations  \
             77.8 ms  repair after a change by someone else (ip kpng: table deleted); no Service \
             port changed\n  2026-12-07T07:16:49.266Z  FAILED  partial  16 operations  77.8 ms  \
             error: Operation not permitted\n"
        );
    }
}
