//! A KubeProxyConfiguration → kpng's flag values, with kube-proxy's defaulting and validation,
//! and the list of what kpng does not honour.
//!
//! The rules, per field (docs/deploy.md has the table):
//! - **mapped**: the value becomes the flag of the same meaning (`clusterCIDR` → `--cluster-cidr`);
//!   zero or `null` takes kube-proxy's default, as kube-proxy's defaulting does.
//! - **mode**: chooses the backend when the command line has no subcommand (kube-proxy's
//!   command line), and must agree with `to-local <backend>` otherwise. `nftables` reads the
//!   `nftables` section; empty (kube-proxy's Linux default, iptables) and `iptables` read the
//!   `iptables` section, as kube-proxy would; `ipvs`, `kernelspace` and anything else are
//!   errors ([`crate::backends::BackendKind::from_mode`]).
//! - **unsupported**: a field asking for something kpng does not do warns, naming the field, but
//!   only when it differs from its zero value or kube-proxy's default, so that a stock kubeadm
//!   file loads silently.
//! - **no effect**: fields that change nothing observable in kpng are accepted silently
//!   (`clientConnection.contentType`: kpng speaks JSON; `logging.flushFrequency` and
//!   `logging.options`). `bindAddressHardFail` is mapped (`--bind-address-hard-fail`,
//!   `crate::listen`); until 2026-12-07 it was accepted without effect.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use ipnet::IpNet;

use super::ClientConnection;
use super::duration::{SignedGoDuration, format};
use super::v1alpha1::KubeProxyConfiguration;
use super::why;
use crate::backends::{BackendKind, Platform};
use crate::cli::{DetectLocalMode, LogFormat};

/// kube-proxy's health server port.
pub const HEALTHZ_PORT: u16 = 10256;
/// kube-proxy's `--root-hnsendpoint-name` default, also used for an empty
/// `winkernel.rootHnsEndpointName`.
pub const ROOT_HNS_ENDPOINT_NAME: &str = "cbr0";
/// kube-proxy's metrics server port.
pub const METRICS_PORT: u16 = 10249;
/// kube-proxy's default `syncPeriod`.
pub const SYNC_PERIOD: Duration = Duration::from_secs(30);
/// kube-proxy's default `minSyncPeriod`.
pub const MIN_SYNC_PERIOD: Duration = Duration::from_secs(1);
/// kube-proxy's default `configSyncPeriod`.
pub const CONFIG_SYNC_PERIOD: Duration = Duration::from_secs(15 * 60);

/// What a configuration file sets, in the types of kpng's flags. Each field is named like the
/// `GlobalFlags` field (= clap argument id) it fills, so that an explicit flag can win over it.
#[derive(Debug, Clone, PartialEq)]
pub struct FileSettings {
    /// `hostnameOverride`, trimmed and lower-cased as kube-proxy does.
    pub node_name: Option<String>,
    /// `bindAddress`, unless unspecified (`0.0.0.0`, `::`).
    pub node_ip: Vec<IpAddr>,
    /// `clusterCIDR`.
    pub cluster_cidr: Vec<IpNet>,
    /// `<section>.masqueradeAll`.
    pub masquerade_all: bool,
    /// `detectLocalMode` (empty: `ClusterCIDR`).
    pub detect_local_mode: DetectLocalMode,
    /// `detectLocal.bridgeInterface`.
    pub pod_bridge_interface: Option<String>,
    /// `detectLocal.interfaceNamePrefix`.
    pub pod_interface_name_prefix: Option<String>,
    /// `<section>.masqueradeBit`.
    pub masquerade_bit: u8,
    /// `nodePortAddresses` (unset: `primary`, nftables mode's default).
    pub nodeport_addresses: Vec<String>,
    /// `healthzBindAddress` (empty in the file: the default, as kube-proxy's defaulting; only
    /// the flag can turn the server off).
    pub healthz_bind_address: Option<SocketAddr>,
    /// `metricsBindAddress`.
    pub metrics_bind_address: String,
    /// `bindAddressHardFail`: a server that cannot bind ends kpng (`crate::listen`).
    pub bind_address_hard_fail: bool,
    /// `<section>.minSyncPeriod`.
    pub min_sync_period: Duration,
    /// `<section>.syncPeriod`.
    pub sync_period: Duration,
    /// `conntrack.maxPerCore`.
    pub conntrack_max_per_core: u64,
    /// `conntrack.min`.
    pub conntrack_min: u64,
    /// `conntrack.tcpEstablishedTimeout`.
    pub conntrack_tcp_timeout_established: Duration,
    /// `conntrack.tcpCloseWaitTimeout`.
    pub conntrack_tcp_timeout_close_wait: Duration,
    /// `conntrack.tcpBeLiberal`.
    pub conntrack_tcp_be_liberal: bool,
    /// `conntrack.udpTimeout`.
    pub conntrack_udp_timeout: Duration,
    /// `conntrack.udpStreamTimeout`.
    pub conntrack_udp_timeout_stream: Duration,
    /// `logging.verbosity` as a tracing level.
    pub log_level: String,
    /// `logging.verbosity` itself, so that `--write-config-to` writes back the number read.
    pub verbosity: Option<u32>,
    /// `logging.format` (empty: text).
    pub logging_format: LogFormat,
    /// `mode`; `None` when empty (kube-proxy's default: iptables) or not one kpng runs.
    pub proxy_mode: Option<BackendKind>,
    /// Why `mode` is not one kpng runs (`ipvs`, a typo), naming the field: an error only when
    /// the mode would choose the backend, not when the command line does (`--proxy-mode`, a
    /// subcommand, `--cleanup`), so that an operator leaving ipvs can override or clean up
    /// without editing the ConfigMap first.
    pub mode_error: Option<String>,
    /// `iptables.localhostNodePorts` (null: true), read in iptables mode only, as kube-proxy.
    pub iptables_localhost_nodeports: bool,
    /// `clientConnection`, for the `kube` source.
    pub client_connection: ClientConnection,
    /// `winkernel.enableDSR`.
    pub enable_dsr: bool,
    /// `winkernel.sourceVip` (empty: none).
    pub source_vip: Vec<IpAddr>,
    /// `winkernel.networkName` (empty: none).
    pub network_name: Option<String>,
    /// `winkernel.forwardHealthCheckVip`.
    pub forward_healthcheck_vip: bool,
    /// `winkernel.rootHnsEndpointName` (empty: kube-proxy's flag default, `cbr0`).
    pub root_hnsendpoint_name: String,
    /// `windowsRunAsService`.
    pub windows_service: bool,
    /// The mode section (`iptables`, `nftables`) the `<section>.` fields were read from:
    /// messages about those fields name the one kube-proxy reads in this mode.
    pub mode_section: &'static str,
}

/// The result of mapping one file.
#[derive(Debug, Clone, PartialEq)]
pub struct Mapped {
    /// The values for kpng's flags.
    pub settings: FileSettings,
    /// One line per field kpng does not honour, naming the field.
    pub warnings: Vec<String>,
    /// Information worth a log line that is not a problem (how an empty `mode` is read).
    pub notes: Vec<String>,
}

/// How the note on an empty `mode` starts (dropped where the command line chooses the
/// backend).
pub const EMPTY_MODE_NOTE: &str = "mode is empty";

/// One mode section's settings, with kube-proxy's defaults filled in (so that a field left
/// at its default compares equal to one that spells the default out).
#[derive(Debug, Clone, Copy, PartialEq)]
struct ModeSettings {
    masquerade_all: bool,
    masquerade_bit: i32,
    sync_period: Duration,
    min_sync_period: Duration,
}

impl ModeSettings {
    fn of(
        masquerade_all: bool,
        masquerade_bit: Option<i32>,
        sync_period: Duration,
        min_sync_period: Duration,
    ) -> ModeSettings {
        ModeSettings {
            masquerade_all,
            masquerade_bit: masquerade_bit.unwrap_or(14),
            sync_period: non_zero_or(sync_period, SYNC_PERIOD),
            min_sync_period: non_zero_or(min_sync_period, MIN_SYNC_PERIOD),
        }
    }
}

/// One field of [`ModeSettings`], as the file writes it.
type ShowSetting = fn(&ModeSettings) -> String;

/// The settings of the mode section this mode does not read, where they are not kube-proxy's
/// defaults and differ from the section it reads: an operator who switched `mode` (with
/// docs/deploy.md's sed, say) and left `iptables.masqueradeAll: true` behind would otherwise
/// lose it without a word.
fn unread_section(config: &KubeProxyConfiguration, section: Section) -> Vec<String> {
    let i = &config.iptables;
    let n = &config.nftables;
    let iptables = ModeSettings::of(
        i.masquerade_all,
        i.masquerade_bit,
        i.sync_period.0,
        i.min_sync_period.0,
    );
    let nftables = ModeSettings::of(
        n.masquerade_all,
        n.masquerade_bit,
        n.sync_period.0,
        n.min_sync_period.0,
    );
    let ((read, used), (unread, unused)) = match section {
        Section::NfTables => (("nftables", nftables), ("iptables", iptables)),
        Section::IpTables => (("iptables", iptables), ("nftables", nftables)),
    };
    let default = ModeSettings::of(false, None, Duration::ZERO, Duration::ZERO);
    let mode = match config.mode.trim() {
        "" => "\"\" (iptables)".to_string(),
        m => format!("{m:?}"),
    };
    let fields: [(&str, ShowSetting); 4] = [
        ("masqueradeAll", |s| s.masquerade_all.to_string()),
        ("masqueradeBit", |s| s.masquerade_bit.to_string()),
        ("syncPeriod", |s| format(s.sync_period)),
        ("minSyncPeriod", |s| format(s.min_sync_period)),
    ];
    fields
        .iter()
        .filter(|(_, value)| value(&unused) != value(&default) && value(&unused) != value(&used))
        .map(|(field, value)| {
            format!(
                "{unread}.{field}: {} is not read in mode {mode}, which reads {read}.{field} \
                 ({}); move it there to keep it",
                value(&unused),
                value(&used)
            )
        })
        .collect()
}

/// Which mode section the sync periods and masquerade settings come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Section {
    IpTables,
    NfTables,
}

impl Section {
    /// The section a backend's mode reads (and `--write-config-to` writes the flags to).
    pub(crate) fn of(kind: BackendKind) -> Section {
        match kind {
            BackendKind::Nft | BackendKind::Userspace | BackendKind::Ebpf => Section::NfTables,
            // kube-proxy's Windows proxier reads the iptables section's sync periods in v1alpha1.
            BackendKind::Iptables | BackendKind::Hns => Section::IpTables,
        }
    }

    /// The section's name in the file.
    fn name(self) -> &'static str {
        match self {
            Section::IpTables => "iptables",
            Section::NfTables => "nftables",
        }
    }
}

/// Maps a parsed file on this system ([`Platform::HOST`]); errors name the field at fault.
pub fn map(config: &KubeProxyConfiguration) -> anyhow::Result<Mapped> {
    map_on(config, Platform::HOST)
}

/// Maps a parsed file as kube-proxy on `platform` reads it (an empty `mode` is that system's
/// default: iptables on Linux, kernelspace on Windows); errors name the field at fault.
pub fn map_on(config: &KubeProxyConfiguration, platform: Platform) -> anyhow::Result<Mapped> {
    let mut warnings = Vec::new();
    let mut notes = Vec::new();
    // An unsupported mode reads the iptables section, as kube-proxy's ipvs mode does.
    let (kind, mode_error) = match BackendKind::from_mode_on(config.mode.trim(), platform) {
        Ok(kind) => (kind, None),
        Err(e) => (BackendKind::Iptables, Some(format!("field mode: {e}"))),
    };
    let section = Section::of(kind);
    if config.mode.trim().is_empty() {
        let what = match platform {
            Platform::Windows => {
                "the kernelspace (HNS) backend without a subcommand, the iptables section's \
                 sync periods and the winkernel section"
            }
            Platform::Linux => {
                "the iptables backend without a subcommand, and the iptables section's settings"
            }
        };
        notes.push(format!(
            "{EMPTY_MODE_NOTE} ({}): {what}, as kube-proxy would",
            platform.default_name()
        ));
    }
    let proxy_mode = Some(kind).filter(|_| !config.mode.trim().is_empty() && mode_error.is_none());
    let (prefix, masquerade_all, masquerade_bit, sync_period, min_sync_period) = match section {
        Section::NfTables => {
            let s = &config.nftables;
            (
                "nftables",
                s.masquerade_all,
                s.masquerade_bit,
                s.sync_period,
                s.min_sync_period,
            )
        }
        Section::IpTables => {
            let s = &config.iptables;
            (
                "iptables",
                s.masquerade_all,
                s.masquerade_bit,
                s.sync_period,
                s.min_sync_period,
            )
        }
    };
    let masquerade_bit = match masquerade_bit {
        None => 14,
        Some(bit) => u8::try_from(bit)
            .ok()
            .filter(|b| *b <= 31)
            .with_context(|| format!("field {prefix}.masqueradeBit: {bit} is not in 0-31"))?,
    };
    let sync_period = non_zero_or(sync_period.0, SYNC_PERIOD);
    let min_sync_period = non_zero_or(min_sync_period.0, MIN_SYNC_PERIOD);
    if min_sync_period > sync_period {
        bail!(
            "field {prefix}.minSyncPeriod: {} must not exceed {prefix}.syncPeriod ({})",
            format(min_sync_period),
            format(sync_period)
        );
    }

    // kube-proxy validates the ipvs section in ipvs mode only: a negative timeout there is
    // an error, in any other mode a setting kpng ignores (warned about as such).
    if config.mode.trim() == "ipvs" {
        let ipvs = &config.ipvs;
        for (field, value) in [
            ("tcpTimeout", ipvs.tcp_timeout),
            ("tcpFinTimeout", ipvs.tcp_fin_timeout),
            ("udpTimeout", ipvs.udp_timeout),
            ("minSyncPeriod", ipvs.min_sync_period),
        ] {
            if value.negative {
                bail!("field ipvs.{field}: {value} must not be negative (mode ipvs)");
            }
        }
    }
    // kube-proxy reads the winkernel section on Windows only: elsewhere a bad value there
    // changes nothing and does not stop it, so it only warns here.
    let source_vip = match (source_vip(&config.winkernel.source_vip), platform) {
        (Ok(vips), _) => vips,
        (Err(e), Platform::Windows) => return Err(e),
        (Err(e), Platform::Linux) => {
            warnings.push(format!(
                "{e:#}; kube-proxy reads winkernel only on Windows; ignored"
            ));
            Vec::new()
        }
    };

    let node_ip = bind_address(&config.bind_address)?;
    let ipv6_defaults = node_ip.first().is_some_and(IpAddr::is_ipv6)
        || config
            .bind_address
            .trim()
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_ipv6());
    let (any, loopback): (IpAddr, IpAddr) = if ipv6_defaults {
        ("::".parse()?, "::1".parse()?)
    } else {
        ("0.0.0.0".parse()?, "127.0.0.1".parse()?)
    };
    let healthz_bind_address = listen_address(
        "healthzBindAddress",
        &config.healthz_bind_address,
        SocketAddr::new(any, HEALTHZ_PORT),
    )?;
    let metrics_bind_address = listen_address(
        "metricsBindAddress",
        &config.metrics_bind_address,
        SocketAddr::new(loopback, METRICS_PORT),
    )?
    .to_string();

    let detect_local_mode = match config.detect_local_mode.as_str() {
        "" => DetectLocalMode::ClusterCidr,
        other => DetectLocalMode::parse(other).with_context(|| {
            format!(
                "field detectLocalMode: unknown mode {other:?} (ClusterCIDR, NodeCIDR, \
                 BridgeInterface, InterfaceNamePrefix or None)"
            )
        })?,
    };
    // kube-proxy's validateDetectLocalConfiguration: the interface modes need their field.
    if let Some(field) = super::checks::detect_local_missing(
        detect_local_mode,
        &config.detect_local.bridge_interface,
        &config.detect_local.interface_name_prefix,
    ) {
        bail!(
            "field detectLocal.{}: must not be empty with detectLocalMode {}",
            field.field,
            detect_local_mode.as_str()
        );
    }
    // Spliced into the rules: refused unless the kernel could have such a link, and without
    // wildcards, which the backends read differently.
    if let Some((setting, problem)) = super::checks::pod_interfaces_problem(
        config.detect_local.bridge_interface.trim(),
        config.detect_local.interface_name_prefix.trim(),
    ) {
        bail!("field detectLocal.{} {problem}", setting.field);
    }
    let conntrack = &config.conntrack;
    let count = |field: &str, value: Option<i32>, default: u64| -> anyhow::Result<u64> {
        match value {
            None => Ok(default),
            // The conversion's own error ("out of range integral type conversion
            // attempted") says nothing an operator can use: the field and its range do.
            Some(n) => u64::try_from(n).map_err(|_| {
                anyhow::anyhow!(
                    "field conntrack.{field}: {n} is negative (0 to 2147483647; 0 leaves the \
                     sysctl to the node)"
                )
            }),
        }
    };
    let client = &config.client_connection;
    let settings = FileSettings {
        node_name: Some(config.hostname_override.trim().to_lowercase()).filter(|n| !n.is_empty()),
        node_ip,
        cluster_cidr: cluster_cidrs(&config.cluster_cidr)?,
        masquerade_all,
        detect_local_mode,
        pod_bridge_interface: non_empty(&config.detect_local.bridge_interface),
        pod_interface_name_prefix: non_empty(&config.detect_local.interface_name_prefix),
        masquerade_bit,
        nodeport_addresses: nodeport_addresses(config.node_port_addresses.as_deref())?,
        healthz_bind_address: Some(healthz_bind_address),
        metrics_bind_address,
        bind_address_hard_fail: config.bind_address_hard_fail,
        min_sync_period,
        sync_period,
        conntrack_max_per_core: count("maxPerCore", conntrack.max_per_core, 32768)?,
        conntrack_min: count("min", conntrack.min, 131072)?,
        conntrack_tcp_timeout_established: conntrack
            .tcp_established_timeout
            .map_or(Duration::from_secs(24 * 3600), |d| d.0),
        conntrack_tcp_timeout_close_wait: conntrack
            .tcp_close_wait_timeout
            .map_or(Duration::from_secs(3600), |d| d.0),
        conntrack_tcp_be_liberal: conntrack.tcp_be_liberal,
        conntrack_udp_timeout: conntrack.udp_timeout.0,
        conntrack_udp_timeout_stream: conntrack.udp_stream_timeout.0,
        log_level: log_level(config.logging.verbosity).to_string(),
        verbosity: Some(config.logging.verbosity),
        logging_format: logging_format(&config.logging.format)?,
        proxy_mode,
        mode_error,
        iptables_localhost_nodeports: match section {
            Section::IpTables => config.iptables.localhost_node_ports.unwrap_or(true),
            Section::NfTables => true,
        },
        client_connection: ClientConnection {
            kubeconfig: non_empty(&client.kubeconfig).map(PathBuf::from),
            // 0 is "the default" (5); a negative QPS is no limit, as in client-go (kube-proxy
            // does not validate it), and as `--kube-api-qps` says.
            kube_api_qps: Some(client.qps).filter(|q| *q != 0.0),
            kube_api_burst: u32::try_from(client.burst).ok().filter(|b| *b > 0),
        },
        enable_dsr: config.winkernel.enable_dsr,
        source_vip,
        network_name: non_empty(&config.winkernel.network_name),
        forward_healthcheck_vip: config.winkernel.forward_health_check_vip,
        root_hnsendpoint_name: non_empty(&config.winkernel.root_hns_endpoint_name)
            .unwrap_or_else(|| ROOT_HNS_ENDPOINT_NAME.to_string()),
        windows_service: config.windows_run_as_service,
        mode_section: section.name(),
    };
    if client.burst < 0 {
        bail!("field clientConnection.burst: {} is negative", client.burst);
    }
    warnings.extend(unsupported(config));
    warnings.extend(unread_section(config, section));
    Ok(Mapped {
        settings,
        warnings,
        notes,
    })
}

/// kube-proxy's defaulting: a zero duration means "the default".
fn non_zero_or(value: Duration, default: Duration) -> Duration {
    if value.is_zero() { default } else { value }
}

/// `Some(trimmed)` unless blank.
fn non_empty(s: &str) -> Option<String> {
    Some(s.trim().to_string()).filter(|s| !s.is_empty())
}

/// `logging.format`: component-base knows `text` (the default) and `json`.
fn logging_format(text: &str) -> anyhow::Result<LogFormat> {
    match text.trim() {
        "" | "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        other => bail!("field logging.format: {other:?} is not a format (text or json)"),
    }
}

/// klog verbosity → a tracing level: kube-proxy logs routine detail at 2 and debugging at 4+.
pub fn log_level(verbosity: u32) -> &'static str {
    match verbosity {
        0..=3 => "info",
        4 => "debug",
        _ => "trace",
    }
}

/// `bindAddress`: the node IP override; empty or unspecified means none. A comma-separated
/// dual-stack pair is accepted (newer kube-proxy versions read one).
fn bind_address(text: &str) -> anyhow::Result<Vec<IpAddr>> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let ip: IpAddr = part
            .parse()
            .map_err(|_| anyhow::anyhow!("field bindAddress: {part:?} is not an IP address"))?;
        if !ip.is_unspecified() {
            out.push(ip);
        }
    }
    Ok(out)
}

/// `IP:port`, or a bare IP that gets the default port (kube-proxy's `AppendPortIfNeeded`);
/// empty means the default address.
fn listen_address(field: &str, text: &str, default: SocketAddr) -> anyhow::Result<SocketAddr> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(default);
    }
    crate::cli::listen_address(text, default.port()).map_err(|_| {
        anyhow::anyhow!(
            "field {field}: {text:?} is not IP:port (e.g. 0.0.0.0:{})",
            default.port()
        )
    })
}

/// `clusterCIDR`: one CIDR or a dual-stack pair, comma-separated (checked as
/// `--cluster-cidr` is).
fn cluster_cidrs(text: &str) -> anyhow::Result<Vec<IpNet>> {
    let mut out: Vec<IpNet> = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let net: IpNet = part
            .parse()
            .map_err(|_| anyhow::anyhow!("field clusterCIDR: {part:?} is not a CIDR"))?;
        let net = kpng_model::ip::unmap_cidr(net, part)
            .map_err(|e| anyhow::anyhow!("field clusterCIDR: {e}"))?;
        out.push(net);
    }
    if let Some(problem) = super::checks::cluster_cidr_problem(&out) {
        bail!("field clusterCIDR: {problem}");
    }
    Ok(out)
}

/// `nodePortAddresses`: `primary` alone, or CIDRs; unset (empty) leaves the backend's
/// default, as kube-proxy leaves it to the mode (nftables: `primary`; iptables: every local
/// address).
fn nodeport_addresses(list: Option<&[String]>) -> anyhow::Result<Vec<String>> {
    let list: Vec<String> = list
        .unwrap_or_default()
        .iter()
        .map(|s| s.trim().to_string())
        .collect();
    if list.is_empty() {
        return Ok(Vec::new());
    }
    if let Some(problem) = super::checks::nodeport_addresses_problem(&list) {
        bail!("field nodePortAddresses: {problem}");
    }
    Ok(list)
}

/// Fields set to something kpng does not do, one warning each.
fn unsupported(config: &KubeProxyConfiguration) -> Vec<String> {
    let mut out = Vec::new();
    let mut warn = |field: &str, why: &str| out.push(format!("{field}: {why}; ignored"));
    if !config.feature_gates.is_empty() {
        let gates: Vec<String> = config
            .feature_gates
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        warn(
            &format!("featureGates ({})", gates.join(", ")),
            why::FEATURE_GATES,
        );
    }
    if config
        .logging
        .vmodule
        .as_ref()
        .is_some_and(|v| !v.is_empty())
    {
        warn("logging.vmodule", why::VMODULE);
    }
    if config.enable_profiling {
        warn("enableProfiling", why::PROFILING);
    }
    if !config.show_hidden_metrics_for_version.is_empty() {
        warn("showHiddenMetricsForVersion", why::HIDDEN_METRICS);
    }
    if config.oom_score_adj.is_some() {
        warn("oomScoreAdj", why::OOM_SCORE_ADJ);
    }
    let resync = config.config_sync_period.0;
    if !resync.is_zero() && resync != CONFIG_SYNC_PERIOD {
        warn("configSyncPeriod", why::CONFIG_SYNC_PERIOD);
    }
    if !config.port_range.is_empty() {
        warn("portRange", why::PORT_RANGE);
    }
    let ipvs = &config.ipvs;
    let ipvs_set: Vec<&str> = [
        (
            "ipvs.excludeCIDRs",
            ipvs.exclude_cidrs.as_ref().is_some_and(|c| !c.is_empty()),
        ),
        ("ipvs.minSyncPeriod", !ipvs.min_sync_period.is_zero()),
        ("ipvs.scheduler", !ipvs.scheduler.is_empty()),
        ("ipvs.strictARP", ipvs.strict_arp),
        (
            "ipvs.syncPeriod",
            !ipvs.sync_period.is_zero() && ipvs.sync_period != SignedGoDuration::from(SYNC_PERIOD),
        ),
        ("ipvs.tcpFinTimeout", !ipvs.tcp_fin_timeout.is_zero()),
        ("ipvs.tcpTimeout", !ipvs.tcp_timeout.is_zero()),
        ("ipvs.udpTimeout", !ipvs.udp_timeout.is_zero()),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
    .collect();
    if !ipvs_set.is_empty() {
        warn(&ipvs_set.join(", "), why::IPVS);
    }
    // The winkernel fields are the `hns` backend's (--enable-dsr, --network-name,
    // --source-vip, --forward-healthcheck-vip, --root-hnsendpoint-name) and
    // windowsRunAsService is --windows-service: none is unsupported.
    out
}

/// `winkernel.sourceVip`: one address, or one per family comma-separated; empty is none.
fn source_vip(value: &str) -> anyhow::Result<Vec<IpAddr>> {
    value
        .split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(|v| {
            v.parse()
                .with_context(|| format!("field winkernel.sourceVip: {v:?} is not an IP address"))
        })
        .collect()
}
