//! The comparison with the kube-proxy-shaped nftables ruleset, as report sections: its own
//! control-plane table, the headline ratios, its rows of the targets table and the plots.

use std::path::Path;

use crate::control::ControlResult;
use crate::data::DataResult;
use crate::kube_proxy_nft::{self, KubeProxyNftControl, LABEL};
use crate::plots::{self, Chart, Series};

/// Cold-load sizes of the kube-proxy-shaped ruleset (30k takes minutes: not in quick runs).
pub fn sizes(quick: bool) -> &'static [(usize, usize)] {
    if quick {
        &[(1000, 4)]
    } else {
        &[(1000, 4), (10_000, 4), (30_000, 4)]
    }
}

/// Runs the kube-proxy-shaped control-plane loads.
pub fn run_control(quick: bool) -> Result<Vec<KubeProxyNftControl>, String> {
    let mut out = Vec::new();
    for (n, m) in sizes(quick) {
        eprintln!("control plane: {LABEL} ruleset, {n} Services × {m} endpoints …");
        out.push(kube_proxy_nft::run_control(
            *n,
            *m,
            kube_proxy_nft::CONTROL_CAP,
        )?);
    }
    Ok(out)
}

/// kpng's nftables result at the same size (the comparison is nft against nft).
fn kpng_at(control: &[ControlResult], n: usize, m: usize) -> Option<&ControlResult> {
    control
        .iter()
        .find(|r| r.n == n && r.m == m && r.backend == crate::control::BackendKind::Nft)
}

/// "≥ 52×" when the slower side timed out (its figure is a lower bound), else "52×".
fn ratio_label(ratio: f64, lower_bound: bool) -> String {
    format!("{}{ratio:.0}×", if lower_bound { "≥ " } else { "" })
}

/// The control-plane section of the comparison, with the ratio to kpng at each size.
pub fn control_section(kube_proxy: &[KubeProxyNftControl], control: &[ControlResult]) -> String {
    let mut s = format!(
        "\n## Control plane: the {LABEL} ruleset (what kube-proxy's nftables mode loads)\n\n\
         The same workload rendered the way kube-proxy v1.31–v1.35 writes it (per-Service-port \
         `service-`/`external-`/`local-` chains, a `numgen random mod N vmap` per chain, one chain \
         per endpoint with its `dnat`; IPv4 table), loaded with one `nft -f` into a fresh \
         namespace; then one more Service added with a second `nft -f`. Loads are capped at {} s.\n\n\
         | Services × endpoints | commands in the transaction | cold: `nft -f` | add one Service: `nft -f` | kpng nft cold | kpng faster, cold | kpng one change p50 | kpng faster, one change |\n\
         |---|---|---|---|---|---|---|---|\n",
        kube_proxy_nft::CONTROL_CAP.as_secs()
    );
    for k in kube_proxy {
        let kp = kpng_at(control, k.n, k.m);
        let cold = kp.map(|r| r.cold_backend.as_secs_f64());
        let one = kp.map(|r| r.change_p50.as_secs_f64());
        s.push_str(&format!(
            "| {} × {} | {} | {} | {} | {} | {} | {} | {} |\n",
            k.n,
            k.m,
            k.commands,
            k.cold.label(),
            k.add_one
                .map(|d| format!("{:.0} ms", d.as_secs_f64() * 1000.0))
                .unwrap_or_else(|| "—".into()),
            cold.map(|c| format!("{c:.2} s"))
                .unwrap_or_else(|| "—".into()),
            cold.map(|c| ratio_label(k.cold.secs() / c, !k.cold.loaded()))
                .unwrap_or_else(|| "—".into()),
            one.map(|o| format!("{:.1} ms", o * 1000.0))
                .unwrap_or_else(|| "—".into()),
            match (one, k.add_one) {
                (Some(o), Some(a)) => ratio_label(a.as_secs_f64() / o, false),
                _ => "—".into(),
            },
        ));
    }
    s.push_str(
        "\n(kpng's one change is file event → committed, which includes noticing the file; the \
         kube-proxy-shaped figure is the `nft -f` alone, what kube-proxy's partial sync costs at \
         the least.)\n",
    );
    s
}

/// Headline ratios against the kube-proxy-shaped ruleset, data plane included.
pub fn headline(
    kube_proxy: &[KubeProxyNftControl],
    control: &[ControlResult],
    data: &[DataResult],
) -> String {
    let mut s = format!("\n## Headline: kpng against the {LABEL} ruleset\n\n");
    for k in kube_proxy {
        if let Some(r) = kpng_at(control, k.n, k.m) {
            let ratio = k.cold.secs() / r.cold_backend.as_secs_f64();
            s.push_str(&format!(
                "- Cold programming, {} × {}: kpng {:.2} s, kube-proxy-shaped {} → kpng {} faster.\n",
                k.n,
                k.m,
                r.cold_backend.as_secs_f64(),
                k.cold.label(),
                ratio_label(ratio, !k.cold.loaded())
            ));
        }
    }
    for d in data {
        let kpng = d.figures("kpng nft,");
        let kp = d.figures(LABEL);
        match (kpng, kp) {
            (Some((kp50, _, krate)), Some((p50, _, rate))) => s.push_str(&format!(
                "- Connect to the last Service, {} Services: p50 kpng {kp50:.0} µs vs {p50:.0} µs ({:.2}×), rate kpng {krate:.0}/s vs {rate:.0}/s ({:.2}×).\n",
                d.n,
                kp50 / p50,
                krate / rate
            )),
            _ => s.push_str(&format!(
                "- Connect to the last Service, {} Services: the kube-proxy-shaped ruleset did not load ({}).\n",
                d.n, d.kube_proxy_load
            )),
        }
    }
    s
}

/// Rows for the targets table (appended to it).
pub fn target_rows(kube_proxy: &[KubeProxyNftControl], control: &[ControlResult]) -> String {
    let mut s = String::new();
    let k = kube_proxy.iter().find(|k| k.n == 10_000);
    if let (Some(k), Some(r)) = (k, k.and_then(|k| kpng_at(control, k.n, k.m))) {
        let ratio = k.cold.secs() / r.cold_backend.as_secs_f64();
        // A ruleset that did not load gives a lower bound: the verdict says so.
        let bound = if k.cold.loaded() { "" } else { "≥ " };
        let verdict = crate::verdict(crate::Bound::AtLeast, ratio, 50.0, "×");
        s.push_str(&format!(
            "| cold programming at 10k ≥ 50× faster than the {LABEL} ruleset | {} | {bound}{verdict} |\n",
            ratio_label(ratio, !k.cold.loaded()),
        ));
    }
    s
}

/// Writes the plots into `dir` and returns the markdown that shows them.
pub fn write_plots(
    dir: &Path,
    kube_proxy: &[KubeProxyNftControl],
    kpng_cold: &[Series],
    data: &[DataResult],
) -> Result<String, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    plots::load_font()?;
    let mut cold = kpng_cold.to_vec();
    cold.push(Series {
        label: format!("{LABEL} (points at the cap did not finish)"),
        points: kube_proxy
            .iter()
            .map(|k| (k.n as f64, k.cold.secs()))
            .collect(),
    });
    plots::line_chart(
        &dir.join("cold-programming.png"),
        Chart {
            title: "Cold programming time (one transaction)",
            x_label: "Services",
            reference: None,
            y_label: "seconds",
        },
        &cold,
    )?;
    let mut latency = Vec::new();
    for (label, prefix) in [
        ("kpng nft, last Service", "kpng nft,"),
        (LABEL, LABEL),
        ("floor: one static DNAT rule", "floor"),
        ("no NAT", "no NAT"),
    ] {
        let points: Vec<(f64, f64)> = data
            .iter()
            .filter_map(|d| d.figures(prefix).map(|f| (d.n as f64, f.0)))
            .collect();
        if !points.is_empty() {
            latency.push(Series {
                label: label.into(),
                points,
            });
        }
    }
    plots::line_chart(
        &dir.join("connect-latency.png"),
        Chart {
            title: "TCP connect latency p50, last Service",
            x_label: "Services",
            reference: None,
            y_label: "µs",
        },
        &latency,
    )?;
    Ok(
        "\n## Plots\n\n![Cold programming time against Services](img/cold-programming.png)\n\n\
        ![TCP connect latency p50 against Services](img/connect-latency.png)\n"
            .into(),
    )
}
