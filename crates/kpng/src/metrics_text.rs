//! `/metrics` in the Prometheus text format (0.0.4), the format kube-proxy serves.
//!
//! Why: prometheus-client writes OpenMetrics, and kube-proxy (component-base's handler, which
//! does not enable OpenMetrics) always answers in the text format, whatever the scraper
//! accepts. The two differ where a stored series is named: OpenMetrics writes a histogram
//! bound `le="1.0"` where the text format writes `le="1"`, so a Prometheus 2 scraping both
//! would keep two series per bucket and a rule naming `le="1"` would miss kpng's nodes. So
//! kpng converts its OpenMetrics output to the text format kube-proxy's Go client writes:
//!
//! - a counter's `# HELP` and `# TYPE` name its `_total` sample, as the text format has it;
//! - `le` and `quantile` values are written as Go's `strconv.FormatFloat(v, 'g', -1, 64)`;
//! - `# UNIT` and `# EOF` go; `info` is a gauge and `unknown` untyped;
//! - the full stop prometheus-client adds to every description goes (the text is kpng's own).

/// The content type of [`to_text`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `openmetrics` (prometheus-client's output) in the Prometheus text format.
pub fn to_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // The families whose HELP and TYPE lines are renamed, and their new names.
    let renamed: std::collections::HashMap<&str, String> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .filter_map(|(name, ty)| match ty.trim() {
            "counter" => Some((name, format!("{name}_total"))),
            "info" => Some((name, format!("{name}_info"))),
            _ => None,
        })
        .collect();
    let family = |name: &str| -> String {
        renamed
            .get(name)
            .cloned()
            .unwrap_or_else(|| name.to_string())
    };
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            let help = help.strip_suffix('.').unwrap_or(help).replace("\\\"", "\"");
            out.push_str(&format!("# HELP {} {help}\n", family(name)));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').unwrap_or((rest, ""));
            let ty = match ty.trim() {
                "info" => "gauge",
                "unknown" => "untyped",
                other => other,
            };
            out.push_str(&format!("# TYPE {} {ty}\n", family(name)));
            continue;
        }
        if line.starts_with('#') {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        out.push_str(&bounds_as_go(line));
        out.push('\n');
    }
    out
}

/// A sample line with its `le` and `quantile` label values written as Go writes them.
fn bounds_as_go(line: &str) -> String {
    let mut out = line.to_string();
    for label in ["le=\"", "quantile=\""] {
        let Some(start) = out.find(label).map(|i| i + label.len()) else {
            continue;
        };
        let Some(len) = out[start..].find('"') else {
            continue;
        };
        let value = &out[start..start + len];
        if let Ok(v) = value.parse::<f64>() {
            let go = go_float(v);
            out.replace_range(start..start + len, &go);
        }
    }
    out
}

/// `v` as Go's `strconv.FormatFloat(v, 'g', -1, 64)` writes it (client_golang's text format):
/// the shortest digits, in exponent form (`1e+06`, `1e-05`) below 1e-4 and from 1e21 on… and,
/// since the shortest form counts as precision 6, from 1e6 on.
pub fn go_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0" } else { "0" }.into();
    }
    // Rust's `{:e}` is the shortest round-trip digits: `1.6384e1`, `1e-5`.
    let sci = format!("{v:e}");
    let Some((mantissa, exp)) = sci.split_once('e') else {
        return sci;
    };
    let Ok(exp) = exp.parse::<i32>() else {
        return sci;
    };
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    // Plain notation: Rust's `{}` writes the same shortest digits without an exponent.
    format!("{v}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_as_go_writes_them() {
        for (v, go) in [
            (0.0, "0"),
            (1.0, "1"),
            (300.0, "300"),
            (0.001, "0.001"),
            (16.384, "16.384"),
            (0.25, "0.25"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (100000.0, "100000"),
            (1000000.0, "1e+06"),
            (1.5e6, "1.5e+06"),
            (f64::INFINITY, "+Inf"),
            (-2.5, "-2.5"),
        ] {
            assert_eq!(go_float(v), go, "{v}");
        }
    }

    #[test]
    fn openmetrics_becomes_kube_proxys_text_format() {
        let om = "# HELP kubeproxy_sync_proxy_rules_endpoint_changes Cumulative proxy rules Endpoint changes.\n\
                  # TYPE kubeproxy_sync_proxy_rules_endpoint_changes counter\n\
                  kubeproxy_sync_proxy_rules_endpoint_changes_total 3\n\
                  # HELP rest_client_request_duration_seconds Request latency in seconds. Broken down by verb, and host..\n\
                  # TYPE rest_client_request_duration_seconds histogram\n\
                  # UNIT rest_client_request_duration_seconds seconds\n\
                  rest_client_request_duration_seconds_bucket{le=\"1.0\",verb=\"GET\"} 2\n\
                  rest_client_request_duration_seconds_bucket{le=\"+Inf\",verb=\"GET\"} 2\n\
                  # HELP kpng_build_info The build.\n\
                  # TYPE kpng_build_info info\n\
                  kpng_build_info_info{version=\"0.1.0\"} 1\n\
                  # HELP kpng_input_problems Problems \\\"now\\\".\n\
                  # TYPE kpng_input_problems gauge\n\
                  kpng_input_problems 0\n\
                  # EOF\n";
        assert_eq!(
            to_text(om),
            "# HELP kubeproxy_sync_proxy_rules_endpoint_changes_total Cumulative proxy rules Endpoint changes\n\
             # TYPE kubeproxy_sync_proxy_rules_endpoint_changes_total counter\n\
             kubeproxy_sync_proxy_rules_endpoint_changes_total 3\n\
             # HELP rest_client_request_duration_seconds Request latency in seconds. Broken down by verb, and host.\n\
             # TYPE rest_client_request_duration_seconds histogram\n\
             rest_client_request_duration_seconds_bucket{le=\"1\",verb=\"GET\"} 2\n\
             rest_client_request_duration_seconds_bucket{le=\"+Inf\",verb=\"GET\"} 2\n\
             # HELP kpng_build_info_info The build\n\
             # TYPE kpng_build_info_info gauge\n\
             kpng_build_info_info{version=\"0.1.0\"} 1\n\
             # HELP kpng_input_problems Problems \"now\"\n\
             # TYPE kpng_input_problems gauge\n\
             kpng_input_problems 0\n"
        );
    }
}
