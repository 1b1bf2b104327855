//! Why kpng ignores a kube-proxy setting: one sentence per setting, shared by the
//! configuration file's fields (`mapping.rs`) and the command line's flags
//! (`kube_proxy_flags.rs`), so that a setting warns the same way wherever it was written.

/// `featureGates`, `--feature-gates`.
pub const FEATURE_GATES: &str = "kpng has no feature gates";
/// `logging.vmodule`, `--vmodule`.
pub const VMODULE: &str =
    "kpng has no per-file verbosity (--log-level takes a tracing filter, e.g. kpng=debug)";
/// `enableProfiling`, `--profiling`.
pub const PROFILING: &str = "kpng serves no /debug/pprof";
/// `showHiddenMetricsForVersion`, `--show-hidden-metrics-for-version`.
pub const HIDDEN_METRICS: &str = "kpng hides no metrics";
/// `oomScoreAdj`, `--oom-score-adj`.
pub const OOM_SCORE_ADJ: &str =
    "kpng leaves its OOM score to the kubelet (the pod's priority and QoS class)";
/// `configSyncPeriod`, `--config-sync-period`.
pub const CONFIG_SYNC_PERIOD: &str =
    "kpng's watches have no periodic resync (full syncs: --full-sync-period)";
/// `portRange`, `--proxy-port-range`.
pub const PORT_RANGE: &str = "unused since kube-proxy's userspace mode";
/// `ipvs.*`, `--ipvs-*`.
pub const IPVS: &str = "settings of the ipvs mode";
