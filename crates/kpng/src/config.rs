//! `--config FILE`: kube-proxy's configuration file (`kubeproxy.config.k8s.io/v1alpha1`
//! `KubeProxyConfiguration`) as the source of kpng's flag values, and `--write-config-to`.
//!
//! An administrator replacing kube-proxy already has this file in the `kube-proxy` ConfigMap.
//! Loading it: parse (`load.rs`: YAML or JSON, unknown fields collected), map with kube-proxy's
//! defaulting and validation (`mapping.rs`: errors name the field, unsupported settings become
//! warnings), then overlay the values on the flags: a flag given on the command line (or its
//! environment variable) wins over the file, a flag left at its default takes the file's value.
//! kube-proxy itself ignores most flags when `--config` is given (only `--hostname-override` and
//! the logging flags win); letting every explicit flag win is a superset of that.

pub(crate) mod checks;
mod duration;
mod json_keys;
mod load;
mod mapping;
mod unwritten;
mod v1alpha1;
pub mod watch;
pub mod why;
mod write;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::ArgMatches;
use clap::parser::ValueSource;

use crate::cli::{GlobalFlags, ProxyModeArg};

pub use checks::nodeport_addresses_problem;
pub use duration::{format as format_go_duration, parse as parse_go_duration};
pub use mapping::{HEALTHZ_PORT, METRICS_PORT};
pub use write::effective;

/// `clientConnection` of the file, for the `kube` source, whose flags of the same names
/// (`--kubeconfig`, `--kube-api-qps`, `--kube-api-burst`) fill it too. When a flag was given on
/// the command line its value is here; otherwise the file's; `None` means neither, so the
/// source's own default (in-cluster configuration, 5 QPS, burst 10) applies:
/// `flags.client_connection.kubeconfig.or(kube_args.kubeconfig)`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClientConnection {
    /// `clientConnection.kubeconfig` / `--kubeconfig`.
    pub kubeconfig: Option<PathBuf>,
    /// `clientConnection.qps` / `--kube-api-qps`.
    pub kube_api_qps: Option<f32>,
    /// `clientConnection.burst` / `--kube-api-burst`.
    pub kube_api_burst: Option<u32>,
}

/// What loading the file has to say, logged once logging is set up (its level may come from
/// the file).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Report {
    /// Settings kpng ignores or replaces, one line each, naming the field.
    pub warnings: Vec<String>,
    /// Informational lines.
    pub notes: Vec<String>,
    /// Command-line flags kpng ignores, one line each, naming the flag.
    pub flag_warnings: Vec<String>,
    /// The file's content as applied, which a running kpng compares the file with
    /// (`watch`); `None` without `--config`.
    pub text: Option<String>,
}

/// A node name must be a Node's name (an RFC 1123 subdomain): anything else can never match
/// a Node, so every local endpoint and the node's addresses would be missed in silence. The
/// usual cause is a DaemonSet whose `$(NODE_NAME)` was not expanded, which the error names.
/// `typed` is the name as given (before lower-casing), which the error quotes; `from` says
/// where it was given.
fn check_node_name(name: &str, typed: &str, from: &str) -> anyhow::Result<()> {
    if kpng_api::identity::is_node_name(name) {
        return Ok(());
    }
    let hint = if name.contains("$(") {
        ": the Pod's command line refers to an environment variable the Pod does not set \
         (give it env NODE_NAME from fieldRef spec.nodeName)"
    } else {
        ""
    };
    anyhow::bail!(
        "the node name {typed:?} ({from}) is not a Node's name (lower-case letters, digits, \
         '-' and '.'){hint}"
    )
}

/// The longest conntrack timeout every kernel accepts: `INT_MAX` jiffies at HZ=1000
/// (596h31m23s); a longer one is refused with EINVAL on such kernels.
pub const MAX_CONNTRACK_TIMEOUT: std::time::Duration =
    std::time::Duration::from_secs(i32::MAX as u64 / 1000);

/// Applies `--config` (if given) to the flags; flags given on the command line win.
pub fn apply(flags: &mut GlobalFlags, matches: &ArgMatches) -> anyhow::Result<Report> {
    let mut report = Report::default();
    // As kube-proxy's processHostnameOverrideFlag: an empty --hostname-override (what
    // `$(NODE_NAME)` gives when the variable is empty) is not given at all, so the file's
    // hostnameOverride (or the OS hostname) stays; one of spaces only is an error.
    let node_name_flag = command_line_value(matches, "node_name");
    let node_name_given = node_name_flag.as_deref().is_some_and(|v| !v.is_empty());
    if let Some(v) = &node_name_flag
        && !v.is_empty()
        && v.trim().is_empty()
    {
        anyhow::bail!("--hostname-override {v:?}: empty hostname-override is invalid");
    }
    if node_name_flag.is_some() && !node_name_given {
        flags.node_name = None;
    }
    // pflag reads an empty `--nodeport-addresses=` (an empty `$(VAR)`) as an empty list, which
    // kube-proxy takes as unset: so does kpng (the file's value, or the backend's default).
    flags.nodeport_addresses.retain(|a| !a.trim().is_empty());
    let nodeport_addresses_given = given_on_command_line(matches, "nodeport_addresses")
        && !flags.nodeport_addresses.is_empty();
    if let Some(path) = flags.config.clone() {
        let (mut settings, mut file_report) = read(&path)?;
        // Only kube-proxy's own line without --proxy-mode takes the backend from the file.
        let chosen_elsewhere =
            given_on_command_line(matches, "proxy_mode") || runs_without_the_mode(flags, matches);
        if chosen_elsewhere {
            // How an empty mode chooses the backend does not matter here.
            file_report
                .notes
                .retain(|n| !n.starts_with(mapping::EMPTY_MODE_NOTE));
        }
        if let Some(e) = settings.mode_error.take() {
            if !chosen_elsewhere {
                return Err(anyhow::anyhow!("{e}"))
                    .with_context(|| format!("--config {}", path.display()));
            }
            file_report
                .warnings
                .push(format!("{e}; {}", mode_unused(flags)));
        }
        if let Some(w) = kube_proxy_would_ignore(matches, settings.mode_section) {
            file_report.flag_warnings.push(w);
        }
        let mode = settings.proxy_mode;
        overlay(flags, settings, |id| match id {
            "node_name" => node_name_given,
            "nodeport_addresses" => nodeport_addresses_given,
            _ => given_on_command_line(matches, id),
        });
        if !given_on_command_line(matches, "proxy_mode") {
            flags.proxy_mode_origin = Some(format!(
                "--config {} mode {:?}",
                path.display(),
                mode.map_or("", |k| k.mode())
            ));
        }
        report = file_report;
    }
    // As typed, for the error: the operator looks for what they wrote, not its lower case.
    let typed = flags.node_name.as_deref().map(|n| n.trim().to_string());
    // As kube-proxy's --hostname-override: trimmed and lower-cased (the file's value is too).
    if node_name_given {
        flags.node_name = flags
            .node_name
            .as_deref()
            .map(|n| n.trim().to_lowercase())
            .filter(|n| !n.is_empty());
    }
    if let Some(name) = &flags.node_name {
        // The environment variable by its name: the operator looks for it in the Pod's `env`.
        let from = if !node_name_given {
            "the file's hostnameOverride"
        } else if command_line_matches(matches, "node_name")
            .is_some_and(|m| m.value_source("node_name") == Some(ValueSource::EnvVariable))
        {
            "the KPNG_NODE_NAME environment variable"
        } else {
            "--hostname-override or --node-name"
        };
        check_node_name(name, typed.as_deref().unwrap_or(name), from)?;
    }
    if given_on_command_line(matches, "proxy_mode") {
        flags.proxy_mode_origin = Some("--proxy-mode".into());
    }
    // The command line's values meet the file's checks (the file's own were checked on
    // reading), so --write-config-to never writes a file --config refuses.
    if let Some(problem) = checks::cluster_cidr_problem(&flags.cluster_cidr) {
        anyhow::bail!("--cluster-cidr: {problem}");
    }
    if let Some(problem) = checks::nodeport_addresses_problem(&flags.nodeport_addresses) {
        anyhow::bail!("--nodeport-addresses: {problem}");
    }
    if let Some(missing) = checks::detect_local_missing(
        flags.detect_local_mode,
        flags.pod_bridge_interface.as_deref().unwrap_or_default(),
        flags
            .pod_interface_name_prefix
            .as_deref()
            .unwrap_or_default(),
    ) {
        anyhow::bail!(
            "--detect-local-mode {}: needs {} (detectLocal.{})",
            flags.detect_local_mode.as_str(),
            missing.flag,
            missing.field
        );
    }
    if let Some((setting, problem)) = checks::pod_interfaces_problem(
        flags.pod_bridge_interface.as_deref().unwrap_or_default(),
        flags
            .pod_interface_name_prefix
            .as_deref()
            .unwrap_or_default(),
    ) {
        anyhow::bail!("{} {problem}", setting.flag);
    }
    // kube-proxy validates the periods whether a flag or the file gave them; the file's own
    // were checked on reading, a flag beside it was not (until 2026-12-07).
    if flags.min_sync_period > flags.sync_period {
        anyhow::bail!(
            "--min-sync-period ({}) must not exceed --sync-period ({}) (the file's \
             minSyncPeriod and syncPeriod, where no flag gives them)",
            format_go_duration(flags.min_sync_period),
            format_go_duration(flags.sync_period)
        );
    }
    // The conntrack timeouts are sysctls the kernel holds in jiffies in an int: it refuses
    // (EINVAL) more than INT_MAX/HZ seconds, which a dry run would not say and the start only
    // warned about; the bound is the one of HZ=1000 kernels.
    for (value, flag, field) in [
        (
            flags.conntrack_tcp_timeout_established,
            "--conntrack-tcp-timeout-established",
            "conntrack.tcpEstablishedTimeout",
        ),
        (
            flags.conntrack_tcp_timeout_close_wait,
            "--conntrack-tcp-timeout-close-wait",
            "conntrack.tcpCloseWaitTimeout",
        ),
        (
            flags.conntrack_udp_timeout,
            "--conntrack-udp-timeout",
            "conntrack.udpTimeout",
        ),
        (
            flags.conntrack_udp_timeout_stream,
            "--conntrack-udp-timeout-stream",
            "conntrack.udpStreamTimeout",
        ),
    ] {
        if value > MAX_CONNTRACK_TIMEOUT {
            anyhow::bail!(
                "{flag} ({field}): {} is more than the kernel's conntrack timeouts hold (0 to \
                 {}; 0 leaves the sysctl to the node)",
                format_go_duration(value),
                format_go_duration(MAX_CONNTRACK_TIMEOUT)
            );
        }
    }
    settle_proxy_mode(flags, matches, &mut report)?;
    // klog's -v, as kube-proxy's logging flags, wins over the file; --log-level over both.
    if let Some(v) = flags.verbosity
        && !given_on_command_line(matches, "log_level")
    {
        flags.log_level = mapping::log_level(v).to_string();
    }
    deprecated_ports(flags);
    let cc = &mut flags.client_connection;
    if let Some(v) = command_line_value(matches, "kubeconfig") {
        cc.kubeconfig = Some(PathBuf::from(v));
    }
    if let Some(v) = command_line_value(matches, "kube_api_qps").and_then(|v| v.parse().ok()) {
        cc.kube_api_qps = Some(v);
    }
    if let Some(v) = command_line_value(matches, "kube_api_burst").and_then(|v| v.parse().ok()) {
        cc.kube_api_burst = Some(v);
    }
    Ok(report)
}

/// kube-proxy's deprecated `--healthz-port` and `--metrics-port`: the port of the server's
/// address (0 turns the server off, as in kube-proxy). A bare
/// `--metrics-bind-address` IP gets the metrics port first, as kube-proxy's.
fn deprecated_ports(flags: &mut GlobalFlags) {
    let metrics = flags.metrics_bind_address.trim();
    if !metrics.is_empty()
        && let Ok(addr) = crate::cli::listen_address(metrics, mapping::METRICS_PORT)
    {
        flags.metrics_bind_address = addr.to_string();
    }
    if let Some(port) = flags.healthz_port {
        if port == 0 {
            // kube-proxy turns its health server off, as with an empty address.
            flags.healthz_bind_address = None;
        } else if let Some(addr) = &mut flags.healthz_bind_address {
            addr.set_port(port);
        }
    }
    if let Some(port) = flags.metrics_port {
        if port == 0 {
            flags.metrics_bind_address.clear();
        } else {
            let host = match flags.metrics_bind_address.parse::<std::net::SocketAddr>() {
                Ok(addr) => addr.ip(),
                Err(_) => std::net::IpAddr::from([127, 0, 0, 1]),
            };
            flags.metrics_bind_address = std::net::SocketAddr::new(host, port).to_string();
        }
    }
}

/// Reads and maps one configuration file.
fn read(path: &Path) -> anyhow::Result<(mapping::FileSettings, Report)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading --config {}", path.display()))?;
    let (settings, mut report) =
        from_text(&text).with_context(|| format!("--config {}", path.display()))?;
    report.text = Some(text);
    Ok((settings, report))
}

/// Parses and maps the text of a configuration file.
fn from_text(text: &str) -> anyhow::Result<(mapping::FileSettings, Report)> {
    let parsed = load::parse(text)?;
    let mapped = mapping::map(&parsed.config)?;
    let mut warnings = parsed.lenient;
    warnings.extend(mapped.warnings);
    if !parsed.unknown_fields.is_empty() {
        warnings.push(format!(
            "{}: not fields of {}; ignored",
            parsed.unknown_fields.join(", "),
            v1alpha1::API_VERSION
        ));
    }
    let report = Report {
        warnings,
        notes: mapped.notes,
        flag_warnings: Vec::new(),
        text: None,
    };
    Ok((mapped.settings, report))
}

/// Turns `--proxy-mode` into the backend it chooses. A mode kpng refuses (`ipvs`) is an error
/// only on kube-proxy's own line, where it would choose the backend; beside `--cleanup` or a
/// subcommand it is a warning, so an operator leaving ipvs can still clean up, as with the
/// file's `mode` (`FileSettings::mode_error`).
fn settle_proxy_mode(
    flags: &mut GlobalFlags,
    matches: &ArgMatches,
    report: &mut Report,
) -> anyhow::Result<()> {
    match flags.proxy_mode_arg.clone() {
        None => {}
        Some(ProxyModeArg::Runs(kind)) => flags.proxy_mode = Some(kind),
        Some(ProxyModeArg::Refused(why)) => {
            if !runs_without_the_mode(flags, matches) {
                anyhow::bail!("--proxy-mode: {why}");
            }
            flags.proxy_mode = None;
            flags.proxy_mode_origin = None;
            report
                .flag_warnings
                .push(format!("--proxy-mode: {why}; {}", mode_unused(flags)));
        }
    }
    Ok(())
}

/// Whether this command runs no backend of the mode (`--cleanup`, or a subcommand: `to-local`
/// names its own, `status` asks a running kpng), so a mode kpng refuses is only a warning.
/// Not `--write-config-to FILE version`, docs/deploy.md's pre-flight check of kube-proxy's
/// command line: it writes what that line would run, so it fails where that line would
/// (until 2026-12-07 it warned and exited 0 on `mode: ipvs` or a misspelt mode, which the
/// DaemonSet's kpng then refused).
fn runs_without_the_mode(flags: &GlobalFlags, matches: &ArgMatches) -> bool {
    if flags.cleanup {
        return true;
    }
    match matches.subcommand_name() {
        None => false,
        Some("version") => flags.write_config_to.is_none(),
        Some(_) => true,
    }
}

/// Why a refused mode does not stop this command, for its warning.
fn mode_unused(flags: &GlobalFlags) -> &'static str {
    if flags.cleanup {
        "--cleanup removes the rules of every mode all the same"
    } else {
        "the command line chooses the backend instead"
    }
}

/// Stands for the mode's section (`iptables`, `nftables`) in a field of [`FLAGS_OF_FIELDS`].
const MODE_SECTION: &str = "<mode>";

/// The flags that set a field of the configuration file, by clap id, with kube-proxy's flag
/// name and the field: beside `--config`, kube-proxy ignores them all (it honors only
/// `--hostname-override` and the logging flags there), kpng lets them win. A field under
/// [`MODE_SECTION`] is in the section of the file's mode (`nftables.syncPeriod`).
const FLAGS_OF_FIELDS: [(&str, &str, &str); 31] = [
    ("node_ip", "--bind-address", "bindAddress"),
    (
        "bind_address_hard_fail",
        "--bind-address-hard-fail",
        "bindAddressHardFail",
    ),
    ("cluster_cidr", "--cluster-cidr", "clusterCIDR"),
    ("masquerade_all", "--masquerade-all", "<mode>.masqueradeAll"),
    (
        "detect_local_mode",
        "--detect-local-mode",
        "detectLocalMode",
    ),
    (
        "pod_bridge_interface",
        "--pod-bridge-interface",
        "detectLocal.bridgeInterface",
    ),
    (
        "pod_interface_name_prefix",
        "--pod-interface-name-prefix",
        "detectLocal.interfaceNamePrefix",
    ),
    (
        "masquerade_bit",
        "--iptables-masquerade-bit",
        "<mode>.masqueradeBit",
    ),
    (
        "nodeport_addresses",
        "--nodeport-addresses",
        "nodePortAddresses",
    ),
    (
        "healthz_bind_address",
        "--healthz-bind-address",
        "healthzBindAddress",
    ),
    ("healthz_port", "--healthz-port", "healthzBindAddress"),
    (
        "metrics_bind_address",
        "--metrics-bind-address",
        "metricsBindAddress",
    ),
    ("metrics_port", "--metrics-port", "metricsBindAddress"),
    (
        "min_sync_period",
        "--iptables-min-sync-period",
        "<mode>.minSyncPeriod",
    ),
    ("sync_period", "--iptables-sync-period", "<mode>.syncPeriod"),
    (
        "conntrack_max_per_core",
        "--conntrack-max-per-core",
        "conntrack.maxPerCore",
    ),
    ("conntrack_min", "--conntrack-min", "conntrack.min"),
    (
        "conntrack_tcp_timeout_established",
        "--conntrack-tcp-timeout-established",
        "conntrack.tcpEstablishedTimeout",
    ),
    (
        "conntrack_tcp_timeout_close_wait",
        "--conntrack-tcp-timeout-close-wait",
        "conntrack.tcpCloseWaitTimeout",
    ),
    (
        "conntrack_tcp_be_liberal",
        "--conntrack-tcp-be-liberal",
        "conntrack.tcpBeLiberal",
    ),
    (
        "conntrack_udp_timeout",
        "--conntrack-udp-timeout",
        "conntrack.udpTimeout",
    ),
    (
        "conntrack_udp_timeout_stream",
        "--conntrack-udp-timeout-stream",
        "conntrack.udpStreamTimeout",
    ),
    ("kubeconfig", "--kubeconfig", "clientConnection.kubeconfig"),
    ("kube_api_qps", "--kube-api-qps", "clientConnection.qps"),
    (
        "kube_api_burst",
        "--kube-api-burst",
        "clientConnection.burst",
    ),
    ("proxy_mode", "--proxy-mode", "mode"),
    (
        "iptables_localhost_nodeports",
        "--iptables-localhost-nodeports",
        "iptables.localhostNodePorts",
    ),
    ("enable_dsr", "--enable-dsr", "winkernel.enableDSR"),
    ("source_vip", "--source-vip", "winkernel.sourceVip"),
    (
        "forward_healthcheck_vip",
        "--forward-healthcheck-vip",
        "winkernel.forwardHealthCheckVip",
    ),
    (
        "root_hnsendpoint_name",
        "--root-hnsendpoint-name",
        "winkernel.rootHnsEndpointName",
    ),
];

/// One warning naming each flag written on the command line that overrides a field of the
/// `--config` file, which kube-proxy would ignore there: an operator whose DaemonSet carries
/// leftover flags learns that kpng and kube-proxy run them differently. Environment
/// variables (`KUBE_NETWORK`) are not flags an operator left behind, and are not named.
/// `mode_section` is the section the file's mode reads (the field the flag overrode).
fn kube_proxy_would_ignore(matches: &ArgMatches, mode_section: &str) -> Option<String> {
    let named: Vec<String> = FLAGS_OF_FIELDS
        .iter()
        .filter(|(id, _, _)| {
            command_line_matches(matches, id)
                .is_some_and(|m| m.value_source(id) == Some(ValueSource::CommandLine))
        })
        .map(|(id, flag, field)| {
            // kpng's own spelling and kube-proxy's, when they differ (`--sync-period` and its
            // alias `--iptables-sync-period`): clap does not say which one was typed, and an
            // operator searches the DaemonSet for the one it holds.
            let own = format!("--{}", id.replace('_', "-"));
            let spelled = if own == *flag {
                own
            } else {
                format!("{own}/{flag}")
            };
            format!(
                "{spelled} ({})",
                field.replacen(MODE_SECTION, mode_section, 1)
            )
        })
        .collect();
    (!named.is_empty()).then(|| {
        format!(
            "flags given beside --config override the file's fields in kpng, but kube-proxy \
             ignores them there (it honors only --hostname-override and the logging flags): {}",
            named.join(", ")
        )
    })
}

/// Sets every flag that was not given explicitly to the file's value.
fn overlay(flags: &mut GlobalFlags, file: mapping::FileSettings, given: impl Fn(&str) -> bool) {
    macro_rules! take {
        ($($field:ident),* $(,)?) => {
            $( if !given(stringify!($field)) { flags.$field = file.$field; } )*
        };
    }
    take!(
        node_name,
        node_ip,
        cluster_cidr,
        masquerade_all,
        detect_local_mode,
        pod_bridge_interface,
        pod_interface_name_prefix,
        masquerade_bit,
        nodeport_addresses,
        healthz_bind_address,
        metrics_bind_address,
        bind_address_hard_fail,
        min_sync_period,
        sync_period,
        conntrack_max_per_core,
        conntrack_min,
        conntrack_tcp_timeout_established,
        conntrack_tcp_timeout_close_wait,
        conntrack_tcp_be_liberal,
        conntrack_udp_timeout,
        conntrack_udp_timeout_stream,
        log_level,
        verbosity,
        logging_format,
        client_connection,
        proxy_mode,
        iptables_localhost_nodeports,
        enable_dsr,
        source_vip,
        network_name,
        forward_healthcheck_vip,
        root_hnsendpoint_name,
        windows_service,
    );
}

/// Whether the argument `id` was given on the command line or through its environment
/// variable, at the top level or in any subcommand (global flags may stand anywhere). An id
/// no command defines is simply not given.
pub fn given_on_command_line(matches: &ArgMatches, id: &str) -> bool {
    command_line_matches(matches, id).is_some()
}

/// The matches of the (sub)command where `id` was given explicitly.
fn command_line_matches<'m>(matches: &'m ArgMatches, id: &str) -> Option<&'m ArgMatches> {
    let here = matches.ids().any(|i| i.as_str() == id)
        && matches!(
            matches.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        );
    if here {
        return Some(matches);
    }
    matches
        .subcommand()
        .and_then(|(_, sub)| command_line_matches(sub, id))
}

/// The last value of `id` as written on the command line, if it was given explicitly.
fn command_line_value(matches: &ArgMatches, id: &str) -> Option<String> {
    let m = command_line_matches(matches, id)?;
    let mut raw = m.try_get_raw(id).ok().flatten()?;
    raw.next_back().map(|v| v.to_string_lossy().into_owned())
}

/// `--write-config-to`: writes the effective configuration (`-`: standard output), then warns
/// about each setting in force the file does not hold: values the format reads otherwise
/// (`write::not_written`) and kpng's own flags given on `matches` (`unwritten::named`).
pub fn write_effective(
    flags: &GlobalFlags,
    destination: &str,
    matches: &ArgMatches,
) -> anyhow::Result<()> {
    let config = write::effective(flags)?;
    write::write_to(destination, &write::render(&config)?)?;
    let kpng_only = unwritten::named(&crate::cli::command(), matches);
    for lost in write::not_written(flags).iter().chain(&kpng_only) {
        tracing::warn!("--write-config-to: {lost}");
    }
    Ok(())
}
