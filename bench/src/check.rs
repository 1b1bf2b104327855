//! `kpng-bench all --check`: the run fails (exit status 1) when a figure is missing, when
//! connections failed, or when kpng is grossly slower than a reference measured in the same
//! run, so that CI's smoke run catches a regression instead of printing it.
//!
//! Why references measured in the run: CI's machine is a loaded 2-vCPU VM whose speed varies
//! several-fold from one run to the next, and the smoke run is a debug build; a fixed bound
//! either flakes or lets a 10× regression through. The reference is the `nft` binary applying
//! a one-element change in a namespace of its own ([`nft_reference`]): a process start, a
//! parse, a netlink round trip and a socket close, on the same machine at the same moment.
//! kpng's own commit of a one-endpoint change (one netlink batch over a socket it keeps) is
//! several times cheaper; its file event → committed time, which adds noticing the file and a
//! debug build's model work, stays well within a few of them. The bounds and the figures
//! that chose them are in docs/benchmarks.md ("The smoke run's checks").

use std::time::{Duration, Instant};

use kpng_testkit::Netns;

use crate::stats::percentile;

/// kpng's own commit of one change (its "synced" line's duration, p50) may take at most this
/// many times the `nft` binary's one-element add (p50): 1.5×, between CI's debug build (0.35×)
/// and the regressed release build of 2026-12-06 (2.1–3.8×), docs/benchmarks.md.
pub const BACKEND_OVER_NFT_ADD: f64 = 1.5;
/// kpng's one change, file event → committed (p50), may take at most this many times the `nft`
/// binary's one-element add (p50).
pub const CHANGE_OVER_NFT_ADD: f64 = 10.0;
/// The share of a data-plane case's connections that may fail (a SYN lost on a busy 2-vCPU
/// machine now and then) before the run fails: a broken path fails them all.
pub const FAILED_CONNECTIONS_SHARE: f64 = 0.01;
/// How many one-element changes the reference times (each way).
const REFERENCE_SAMPLES: usize = 15;

/// One thing checked.
#[derive(Debug, Clone)]
pub struct Check {
    /// What was checked, with its bound.
    pub what: String,
    /// What was measured.
    pub measured: String,
    /// Whether it held.
    pub ok: bool,
}

/// Everything a `--check` run checked.
#[derive(Debug, Default)]
pub struct Checks(Vec<Check>);

impl Checks {
    /// Adds one check.
    pub fn push(&mut self, what: impl Into<String>, measured: impl Into<String>, ok: bool) {
        self.0.push(Check {
            what: what.into(),
            measured: measured.into(),
            ok,
        });
    }

    /// Checks that each named figure is a finite, positive number.
    pub fn figures(&mut self, of: &str, figures: &[(&str, f64)]) {
        let bad: Vec<String> = figures
            .iter()
            .filter(|(_, v)| !(v.is_finite() && *v > 0.0))
            .map(|(name, v)| format!("{name} = {v}"))
            .collect();
        self.push(
            format!("{of}: every figure measured ({} figures)", figures.len()),
            if bad.is_empty() {
                "all finite and positive".to_string()
            } else {
                bad.join(", ")
            },
            bad.is_empty(),
        );
    }

    /// How many did not hold.
    pub fn failed(&self) -> usize {
        self.0.iter().filter(|c| !c.ok).count()
    }

    /// A markdown table of every check.
    pub fn markdown(&self) -> String {
        let mut s =
            String::from("\n## Checks (--check)\n\n| check | measured | result |\n|---|---|---|\n");
        for c in &self.0 {
            s.push_str(&format!(
                "| {} | {} | {} |\n",
                c.what,
                c.measured,
                if c.ok { "ok" } else { "**FAILED**" }
            ));
        }
        s
    }
}

/// The `nft` binary's one-element changes, timed inside a namespace of their own.
#[derive(Debug, Clone, Copy)]
pub struct NftReference {
    /// `nft add element` of one new element, p50.
    pub add: Duration,
    /// One transaction deleting one element and adding another (what one endpoint change
    /// is), p50: its socket close waits for an RCU grace period.
    pub replace: Duration,
}

/// Times the `nft` binary's one-element changes in a fresh namespace: the in-run reference
/// the checks judge kpng against ([`inner`] runs inside it).
pub fn nft_reference() -> Result<NftReference, String> {
    let ns = Netns::new("kbr").map_err(|e| e.to_string())?;
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = ns
        .run_ok([me.display().to_string(), "nft-reference-inner".to_string()])
        .map_err(|e| format!("nft-reference-inner: {e}"))?;
    let v: serde_json::Value =
        serde_json::from_str(out.trim()).map_err(|e| format!("bad output {out:?}: {e}"))?;
    let p50 = |key: &str| -> Result<Duration, String> {
        let mut us: Vec<f64> = v[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(serde_json::Value::as_f64)
            .collect();
        let p = percentile(&mut us, 50.0);
        if p.is_finite() && p > 0.0 {
            Ok(Duration::from_secs_f64(p / 1e6))
        } else {
            Err(format!("nft reference: no {key} timing in {out:?}"))
        }
    };
    Ok(NftReference {
        add: p50("add_us")?,
        replace: p50("replace_us")?,
    })
}

/// Runs `nft -f -` with `script`, returning how long it took.
fn timed_nft(script: &str) -> Result<Duration, String> {
    use std::io::Write as _;
    let started = Instant::now();
    let mut child = std::process::Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting nft: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| format!("writing to nft: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for nft: {e}"))?;
    let took = started.elapsed();
    if !out.status.success() {
        return Err(format!(
            "nft -f - {script:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(took)
}

/// `kpng-bench nft-reference-inner`, inside the reference's namespace: a table with one set
/// shaped like kpng's endpoint sets, then [`REFERENCE_SAMPLES`] one-element adds and as many
/// one-element replaces, each an `nft -f -` process; prints their times (µs) as one JSON line.
pub fn inner() -> Result<(), String> {
    timed_nft(
        "table ip kpng-ref {\n\tset endpoints {\n\t\ttype ipv4_addr . inet_service\n\t}\n}\n",
    )?;
    let element = |i: usize| format!("10.{}.{}.1 . 8080", i / 250, i % 250);
    let mut add_us = Vec::new();
    for i in 0..REFERENCE_SAMPLES {
        let took = timed_nft(&format!(
            "add element ip kpng-ref endpoints {{ {} }}\n",
            element(i)
        ))?;
        add_us.push(took.as_secs_f64() * 1e6);
    }
    let mut replace_us = Vec::new();
    for i in 0..REFERENCE_SAMPLES {
        let took = timed_nft(&format!(
            "delete element ip kpng-ref endpoints {{ {} }}\nadd element ip kpng-ref endpoints {{ {} }}\n",
            element(i),
            element(i + REFERENCE_SAMPLES)
        ))?;
        replace_us.push(took.as_secs_f64() * 1e6);
    }
    println!(
        "{}",
        serde_json::json!({"add_us": add_us, "replace_us": replace_us})
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_nan_figure_fails_and_names_itself() {
        let mut c = Checks::default();
        c.figures("x", &[("a", 1.0), ("b", 2.5)]);
        assert_eq!(c.failed(), 0);
        c.figures("y", &[("a", f64::NAN), ("b", 0.0), ("c", 3.0)]);
        assert_eq!(c.failed(), 1);
        let md = c.markdown();
        assert!(md.contains("a = NaN, b = 0"), "{md}");
        assert!(md.contains("**FAILED**"), "{md}");
    }
}
