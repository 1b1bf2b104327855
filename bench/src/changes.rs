//! Change scripts beyond one endpoint flap, run against a kpng that has programmed the whole
//! workload: a rolling update of one Service (its endpoints replaced one by one, each step an
//! atomic rewrite of the Service's file) and 100 Services created at once (100 new files
//! renamed into place back to back). Each is timed from just before the file event to the
//! timestamp of the `synced` line that committed it.

use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::control::Kpng;
use crate::stats::percentile;
use crate::workload::{self, Endpoints};

/// How many Services a burst creates.
pub const BURST: usize = 100;
/// Offset of the replacement endpoints of a rolling update in the endpoint address space, past
/// every workload size and the flap's alternate addresses.
const ROLLING_OFFSET: usize = 8_000_000;
/// No `synced` line for this long after a burst means kpng is done with it.
const QUIET: Duration = Duration::from_millis(300);

/// Figures of the change scripts at one size.
#[derive(Debug, Default)]
pub struct ScriptResults {
    /// Each rolling-update step: file event → committed, in seconds.
    pub rolling_steps: Vec<f64>,
    /// Each burst of [`BURST`] new Services: first file event → the commit of the last, seconds.
    pub bursts: Vec<f64>,
    /// Transactions kpng committed per burst (mean).
    pub syncs_per_burst: f64,
    /// Operations kpng sent per burst (mean).
    pub ops_per_burst: f64,
}

impl ScriptResults {
    /// The table header matching [`ScriptResults::markdown_row`].
    pub fn markdown_header() -> &'static str {
        "| backend | Services × endpoints | endpoint flap p50 / p99 | rolling update, per step p50 / p99 (steps) | 100 Services at once: all committed, p50 / max (bursts) | transactions / ops per burst |\n|---|---|---|---|---|---|\n"
    }

    /// One row; `flap` is the one-endpoint-change (p50, p99) of the same run.
    pub fn markdown_row(
        &self,
        backend: &str,
        n: usize,
        m: usize,
        flap: (Duration, Duration),
    ) -> String {
        let ms = |s: f64| s * 1000.0;
        let mut steps = self.rolling_steps.clone();
        let mut bursts = self.bursts.clone();
        format!(
            "| {backend} | {n} × {m} | {:.1} / {:.1} ms | {:.1} / {:.1} ms ({}) | {:.0} / {:.0} ms ({}) | {:.1} / {:.0} |",
            ms(flap.0.as_secs_f64()),
            ms(flap.1.as_secs_f64()),
            ms(percentile(&mut steps, 50.0)),
            ms(percentile(&mut steps, 99.0)),
            self.rolling_steps.len(),
            ms(percentile(&mut bursts, 50.0)),
            ms(bursts.iter().copied().fold(f64::NAN, f64::max)),
            self.bursts.len(),
            self.syncs_per_burst,
            self.ops_per_burst,
        )
    }
}

/// Service `i`'s manifest after `step` steps of a rolling update: endpoints `0..step` replaced.
fn rolling_manifest(i: usize, m: usize, step: usize) -> String {
    let mut text = workload::service_manifest(i, m, Endpoints::Unique, 0);
    for j in 0..step.min(m) {
        let old = workload::endpoint_ip(i * m + j);
        let new = workload::endpoint_ip(i * m + j + ROLLING_OFFSET);
        text = text.replace(
            &format!("addresses: [{old}]"),
            &format!("addresses: [{new}]"),
        );
    }
    text
}

/// Writes `text` as Service `i`'s file atomically (temp file + rename).
fn write_service(dir: &Path, i: usize, text: &str) -> Result<(), String> {
    let tmp = dir.join(format!(".s{i}.tmp"));
    std::fs::write(&tmp, text).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join(format!("s{i}.yaml")))
        .map_err(|e| format!("renaming {}: {e}", tmp.display()))
}

/// Runs `rolling` rolling updates and `bursts` bursts against `kpng`, which watches `manifests`
/// holding `n` Services × `m` endpoints.
pub fn run(
    kpng: &mut Kpng,
    manifests: &Path,
    n: usize,
    m: usize,
    rolling: usize,
    bursts: usize,
) -> Result<ScriptResults, String> {
    let mut out = ScriptResults::default();
    for r in 0..rolling {
        // Spread over the workload, away from the flap's Services.
        let i = (n - 1).saturating_sub(r * (n / rolling.max(1)).max(1));
        for step in 1..=m {
            // Spaced like the flaps (a real rolling update waits for each new pod anyway).
            std::thread::sleep(Duration::from_millis(50));
            let before = kpng.syncs().len();
            let t = SystemTime::now();
            write_service(manifests, i, &rolling_manifest(i, m, step))?;
            let syncs = kpng.wait_for_syncs(before + 1, Duration::from_secs(30))?;
            out.rolling_steps.push(
                syncs[before]
                    .at
                    .duration_since(t)
                    .unwrap_or_default()
                    .as_secs_f64(),
            );
        }
    }
    let (mut syncs_total, mut ops_total) = (0usize, 0usize);
    for b in 0..bursts {
        std::thread::sleep(Duration::from_millis(50));
        let texts: Vec<(usize, String)> = (0..BURST)
            .map(|k| {
                let i = n + b * BURST + k;
                (i, workload::service_manifest(i, m, Endpoints::Unique, 0))
            })
            .collect();
        let before = kpng.syncs().len();
        let t = SystemTime::now();
        for (i, text) in &texts {
            write_service(manifests, *i, text)?;
        }
        // Wait for the first commit, then until kpng has been quiet for a while.
        kpng.wait_for_syncs(before + 1, Duration::from_secs(60))?;
        // "Quiet" must outlast a sync in progress: a slow backend (iptables-legacy: ≈1.5 s per
        // sync at 10k) would otherwise look quiet while it writes the rest of the burst.
        let mut seen = before;
        loop {
            let slowest = kpng.syncs()[before..]
                .iter()
                .map(|s| s.duration)
                .max()
                .unwrap_or_default();
            std::thread::sleep(QUIET.max(slowest * 2 + QUIET));
            let now = kpng.syncs().len();
            if now == seen {
                break;
            }
            seen = now;
        }
        let syncs = kpng.syncs();
        let mine = &syncs[before..];
        let ops: usize = mine.iter().map(|s| s.operations).sum();
        // Every new Service adds at least its ClusterIP's elements: fewer operations than
        // Services means some were not programmed.
        if ops < BURST {
            return Err(format!(
                "burst of {BURST} Services: only {ops} operations in {} transactions",
                mine.len()
            ));
        }
        let last = mine.last().map(|s| s.at).unwrap_or(t);
        out.bursts
            .push(last.duration_since(t).unwrap_or_default().as_secs_f64());
        syncs_total += mine.len();
        ops_total += ops;
    }
    if bursts > 0 {
        out.syncs_per_burst = syncs_total as f64 / bursts as f64;
        out.ops_per_burst = ops_total as f64 / bursts as f64;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Table: (step, endpoints replaced).
    #[test]
    fn rolling_update_replaces_endpoints_one_by_one() {
        let (i, m) = (17, 4);
        for (step, replaced) in [(0, 0), (1, 1), (2, 2), (4, 4), (9, 4)] {
            let text = rolling_manifest(i, m, step);
            for j in 0..m {
                let old = workload::endpoint_ip(i * m + j).to_string();
                let new = workload::endpoint_ip(i * m + j + ROLLING_OFFSET).to_string();
                let is_replaced = j < replaced;
                assert_eq!(
                    text.contains(&new),
                    is_replaced,
                    "step {step}, endpoint {j}"
                );
                assert_eq!(
                    text.contains(&old),
                    !is_replaced,
                    "step {step}, endpoint {j}"
                );
            }
        }
    }
}
