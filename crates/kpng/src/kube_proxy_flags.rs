//! kube-proxy flags that kpng accepts without implementing them.
//!
//! A DaemonSet written for kube-proxy passes whatever flags its author needed
//! (`--oom-score-adj=-999`, `--feature-gates=…`, `--v=2`); refusing one would make the switch
//! to kpng fail on a flag that changes nothing kpng does. These flags are taken off the command
//! line before clap parses it, and each one that asks for something kpng does not do warns once,
//! with the same reason as the configuration file's field of the same meaning
//! (`config/why.rs`). Flags kpng implements (`--proxy-mode`, `--cleanup`, `--v`, …) are clap
//! flags and are not listed here.
//!
//! The list is kube-proxy's `cmd/kube-proxy/app/options.go` of v1.33–v1.35 and the logging
//! flags of component-base (`logsapi.AddFlags`). As in pflag, a boolean flag takes its value
//! only as `--flag=value`; any other flag takes `--flag=value` or `--flag value`.

use std::ffi::OsString;

use crate::config::why;

/// One kube-proxy flag kpng accepts without effect.
#[derive(Debug, Clone, Copy)]
pub struct Ignored {
    /// The flag without its dashes.
    pub flag: &'static str,
    /// Whether it is a boolean (`--flag` alone means `true`; no separate value).
    pub boolean: bool,
    /// The configuration file's field of the same meaning.
    pub field: &'static str,
    /// Why kpng ignores it; `None`: it changes nothing kpng does, so it is silent.
    pub why: Option<&'static str>,
    /// Values that are kube-proxy's default (or ask for nothing), which do not warn.
    pub quiet_values: &'static [&'static str],
}

const fn warns(
    flag: &'static str,
    boolean: bool,
    field: &'static str,
    why: &'static str,
    quiet_values: &'static [&'static str],
) -> Ignored {
    Ignored {
        flag,
        boolean,
        field,
        why: Some(why),
        quiet_values,
    }
}

const fn silent(flag: &'static str, boolean: bool, field: &'static str) -> Ignored {
    Ignored {
        flag,
        boolean,
        field,
        why: None,
        quiet_values: &[],
    }
}

/// Booleans that are off ask for nothing.
const OFF: &[&str] = &["false", "False", "FALSE", "0", "f", "F"];
/// Durations that are zero (ipvs: "leave as is").
const ZERO: &[&str] = &["0", "0s"];

/// Every kube-proxy flag kpng accepts without effect.
pub const IGNORED: &[Ignored] = &[
    warns(
        "feature-gates",
        false,
        "featureGates",
        why::FEATURE_GATES,
        &[""],
    ),
    warns("profiling", true, "enableProfiling", why::PROFILING, OFF),
    warns(
        "show-hidden-metrics-for-version",
        false,
        "showHiddenMetricsForVersion",
        why::HIDDEN_METRICS,
        &[""],
    ),
    warns(
        "oom-score-adj",
        false,
        "oomScoreAdj",
        why::OOM_SCORE_ADJ,
        &["-999"],
    ),
    warns(
        "config-sync-period",
        false,
        "configSyncPeriod",
        why::CONFIG_SYNC_PERIOD,
        &["15m", "15m0s", "900s"],
    ),
    warns(
        "proxy-port-range",
        false,
        "portRange",
        why::PORT_RANGE,
        &["", "0", "0-0"],
    ),
    warns(
        "ipvs-sync-period",
        false,
        "ipvs.syncPeriod",
        why::IPVS,
        &["30s", "0", "0s"],
    ),
    warns(
        "ipvs-min-sync-period",
        false,
        "ipvs.minSyncPeriod",
        why::IPVS,
        ZERO,
    ),
    warns("ipvs-scheduler", false, "ipvs.scheduler", why::IPVS, &[""]),
    warns(
        "ipvs-exclude-cidrs",
        false,
        "ipvs.excludeCIDRs",
        why::IPVS,
        &[""],
    ),
    warns("ipvs-strict-arp", true, "ipvs.strictARP", why::IPVS, OFF),
    warns(
        "ipvs-tcp-timeout",
        false,
        "ipvs.tcpTimeout",
        why::IPVS,
        ZERO,
    ),
    warns(
        "ipvs-tcpfin-timeout",
        false,
        "ipvs.tcpFinTimeout",
        why::IPVS,
        ZERO,
    ),
    warns(
        "ipvs-udp-timeout",
        false,
        "ipvs.udpTimeout",
        why::IPVS,
        ZERO,
    ),
    warns("vmodule", false, "logging.vmodule", why::VMODULE, &[""]),
    silent(
        "kube-api-content-type",
        false,
        "clientConnection.contentType",
    ),
    silent("log-flush-frequency", false, "logging.flushFrequency"),
    silent(
        "log-json-split-stream",
        true,
        "logging.options.json.splitStream",
    ),
    silent(
        "log-json-info-buffer-size",
        false,
        "logging.options.json.infoBufferSize",
    ),
    silent(
        "log-text-split-stream",
        true,
        "logging.options.text.splitStream",
    ),
    silent(
        "log-text-info-buffer-size",
        false,
        "logging.options.text.infoBufferSize",
    ),
];

/// The command line without the ignored flags, and what to say about them.
#[derive(Debug, Default, PartialEq)]
pub struct Extracted {
    /// The arguments for clap (the program name first).
    pub args: Vec<OsString>,
    /// One warning per ignored flag that asked for something, in command-line order.
    pub warnings: Vec<String>,
}

/// Takes the ignored kube-proxy flags off `args` (the program name first). Everything after
/// `--` is left alone.
pub fn extract(args: impl IntoIterator<Item = OsString>) -> Extracted {
    let mut out = Extracted::default();
    let mut given: Vec<(&'static Ignored, Vec<String>)> = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let Some(text) = arg.to_str() else {
            out.args.push(arg);
            continue;
        };
        if text == "--" {
            out.args.push(arg);
            out.args.extend(args.by_ref());
            break;
        }
        let Some(long) = text.strip_prefix("--") else {
            out.args.push(arg);
            continue;
        };
        let (name, inline) = match long.split_once('=') {
            Some((name, value)) => (name, Some(value.to_string())),
            None => (long, None),
        };
        let Some(flag) = IGNORED.iter().find(|f| f.flag == name) else {
            out.args.push(arg);
            continue;
        };
        let value = match (inline, flag.boolean) {
            (Some(v), _) => v,
            (None, true) => "true".to_string(),
            (None, false) => args
                .next()
                .map(|v| v.to_string_lossy().into_owned())
                .unwrap_or_default(),
        };
        match given.iter_mut().find(|(f, _)| f.flag == flag.flag) {
            Some((_, values)) => values.push(value),
            None => given.push((flag, vec![value])),
        }
    }
    for (flag, values) in given {
        let Some(why) = flag.why else { continue };
        let asked: Vec<&String> = values
            .iter()
            .filter(|v| !flag.quiet_values.contains(&v.trim()))
            .collect();
        if asked.is_empty() {
            continue;
        }
        let shown: Vec<String> = asked.iter().map(|v| format!("{v:?}")).collect();
        out.warnings.push(format!(
            "--{} {} ({}): {why}; ignored",
            flag.flag,
            shown.join(", "),
            flag.field
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(line: &[&str]) -> Extracted {
        extract(line.iter().map(OsString::from))
    }

    fn args(e: &Extracted) -> Vec<&str> {
        e.args.iter().filter_map(|a| a.to_str()).collect()
    }

    #[test]
    fn kube_proxys_flags_leave_the_line_and_warn_once_each() {
        let e = run(&[
            "kpng",
            "--config=/var/lib/kube-proxy/config.conf",
            "--feature-gates",
            "Foo=true",
            "--oom-score-adj=-999",
            "--profiling",
            "--hostname-override=node1",
            "--ipvs-scheduler",
            "rr",
            "--kube-api-content-type",
            "application/vnd.kubernetes.protobuf",
            "--feature-gates=Bar=false",
        ]);
        assert_eq!(
            args(&e),
            [
                "kpng",
                "--config=/var/lib/kube-proxy/config.conf",
                "--hostname-override=node1"
            ]
        );
        assert_eq!(
            e.warnings,
            [
                format!(
                    "--feature-gates \"Foo=true\", \"Bar=false\" (featureGates): {}; ignored",
                    why::FEATURE_GATES
                ),
                format!(
                    "--profiling \"true\" (enableProfiling): {}; ignored",
                    why::PROFILING
                ),
                format!(
                    "--ipvs-scheduler \"rr\" (ipvs.scheduler): {}; ignored",
                    why::IPVS
                ),
            ]
        );
    }

    #[test]
    fn booleans_take_no_separate_value_and_defaults_are_quiet() {
        let e = run(&[
            "kpng",
            "--profiling=false",
            "--ipvs-strict-arp",
            "kube",
            "--config-sync-period",
            "15m0s",
        ]);
        assert_eq!(args(&e), ["kpng", "kube"]);
        assert_eq!(e.warnings.len(), 1, "{:?}", e.warnings);
        assert!(e.warnings[0].starts_with("--ipvs-strict-arp \"true\""));
    }

    #[test]
    fn nothing_after_a_double_dash_and_nothing_else_is_touched() {
        let e = run(&["kpng", "--proxy-mode", "nftables", "--", "--profiling"]);
        assert_eq!(
            args(&e),
            ["kpng", "--proxy-mode", "nftables", "--", "--profiling"]
        );
        assert!(e.warnings.is_empty());
    }
}
