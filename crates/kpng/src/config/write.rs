//! `--write-config-to`: the effective configuration as a KubeProxyConfiguration.
//!
//! The output is what kube-proxy would write for the same settings in the same mode (all
//! fields, keys in kube-proxy's order, Go durations; the sync and masquerade settings in the
//! mode's section, kube-proxy's defaults in the other), so it reads back into kpng without a
//! warning and into kube-proxy unchanged. The mode is `--proxy-mode`'s, the file's, or the
//! `to-local` backend's; `""` when none says, which reads back as kube-proxy's default of the
//! system (iptables on Linux, kernelspace on Windows; both read the iptables section's sync
//! periods, so the sections written are the same). kpng-only flags (`--service-cidr`,
//! `--service-proxy-name`, `--full-sync-period`, the sink's flags) have no field and are not
//! written: `super::unwritten` names each one given in a warning. A `minSyncPeriod` of 0 and an empty (disabled) `--metrics-bind-address` are written
//! as given but read back as defaults (the file format reads 0 as "1s" and an empty address as
//! the default one), so [`not_written`] names them for a warning.

use anyhow::Context;

use super::ClientConnection;
use super::duration::GoDuration;
use super::mapping::{CONFIG_SYNC_PERIOD, MIN_SYNC_PERIOD, SYNC_PERIOD};
use super::v1alpha1::{
    API_VERSION, ClientConnectionConfiguration, ConntrackConfiguration, DetectLocalConfiguration,
    IpTablesConfiguration, IpvsConfiguration, KIND, KubeProxyConfiguration, LoggingConfiguration,
    LoggingOptions, NfTablesConfiguration, OutputRouting,
};
use crate::backends::BackendKind;
use crate::cli::GlobalFlags;

/// The effective configuration of these flags.
pub fn effective(flags: &GlobalFlags) -> anyhow::Result<KubeProxyConfiguration> {
    let client = &flags.client_connection;
    let i32_field = |name: &str, v: u64| {
        i32::try_from(v).with_context(|| format!("{name} {v} does not fit the file's int32 field"))
    };
    // kube-proxy's bindAddress is one IP (a pair is refused); the other family's is left out
    // and named by `not_written`. Without a node IP it is the unspecified address, `::` on an
    // IPv6 cluster (kubeadm writes it so, and it makes the listen defaults IPv6): the health
    // server's address, which followed it when the file was read, tells which.
    let ipv6_defaults = flags
        .healthz_bind_address
        .is_some_and(|a| a.ip() == std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED));
    let bind_address = flags.node_ip.first().map_or_else(
        || if ipv6_defaults { "::" } else { "0.0.0.0" }.to_string(),
        ToString::to_string,
    );
    let cluster_cidr: Vec<String> = flags.cluster_cidr.iter().map(ToString::to_string).collect();
    let kind = flags.proxy_mode;
    // The section the mode reads (one arm per backend); none given: iptables, the default.
    let nftables_mode =
        kind.map(super::mapping::Section::of) == Some(super::mapping::Section::NfTables);
    let iptables = if nftables_mode {
        IpTablesConfiguration {
            localhost_node_ports: Some(true),
            masquerade_all: false,
            masquerade_bit: Some(14),
            min_sync_period: GoDuration(MIN_SYNC_PERIOD),
            sync_period: GoDuration(SYNC_PERIOD),
        }
    } else {
        IpTablesConfiguration {
            localhost_node_ports: Some(flags.iptables_localhost_nodeports),
            masquerade_all: flags.masquerade_all,
            masquerade_bit: Some(i32::from(flags.masquerade_bit)),
            min_sync_period: GoDuration(flags.min_sync_period),
            sync_period: GoDuration(flags.sync_period),
        }
    };
    let nftables = if nftables_mode {
        NfTablesConfiguration {
            masquerade_all: flags.masquerade_all,
            masquerade_bit: Some(i32::from(flags.masquerade_bit)),
            min_sync_period: GoDuration(flags.min_sync_period),
            sync_period: GoDuration(flags.sync_period),
        }
    } else {
        NfTablesConfiguration {
            masquerade_all: false,
            masquerade_bit: Some(14),
            min_sync_period: GoDuration(MIN_SYNC_PERIOD),
            sync_period: GoDuration(SYNC_PERIOD),
        }
    };
    let buffer = OutputRouting {
        info_buffer_size: Some(serde_json::Value::String("0".into())),
        split_stream: None,
    };
    Ok(KubeProxyConfiguration {
        api_version: API_VERSION.into(),
        bind_address,
        bind_address_hard_fail: flags.bind_address_hard_fail,
        client_connection: client_connection(client),
        cluster_cidr: cluster_cidr.join(","),
        config_sync_period: GoDuration(CONFIG_SYNC_PERIOD),
        conntrack: ConntrackConfiguration {
            max_per_core: Some(i32_field(
                "--conntrack-max-per-core",
                flags.conntrack_max_per_core,
            )?),
            min: Some(i32_field("--conntrack-min", flags.conntrack_min)?),
            tcp_be_liberal: flags.conntrack_tcp_be_liberal,
            tcp_close_wait_timeout: Some(GoDuration(flags.conntrack_tcp_timeout_close_wait)),
            tcp_established_timeout: Some(GoDuration(flags.conntrack_tcp_timeout_established)),
            udp_stream_timeout: GoDuration(flags.conntrack_udp_timeout_stream),
            udp_timeout: GoDuration(flags.conntrack_udp_timeout),
        },
        detect_local: DetectLocalConfiguration {
            bridge_interface: flags.pod_bridge_interface.clone().unwrap_or_default(),
            interface_name_prefix: flags.pod_interface_name_prefix.clone().unwrap_or_default(),
        },
        detect_local_mode: flags.detect_local_mode.as_str().to_string(),
        enable_profiling: false,
        feature_gates: Default::default(),
        healthz_bind_address: flags
            .healthz_bind_address
            .map_or_else(String::new, |a| a.to_string()),
        hostname_override: flags.node_name.clone().unwrap_or_default(),
        iptables,
        ipvs: IpvsConfiguration {
            sync_period: super::duration::SignedGoDuration::from(SYNC_PERIOD),
            ..Default::default()
        },
        kind: KIND.into(),
        logging: LoggingConfiguration {
            flush_frequency: Some(serde_json::Value::String("5s".into())),
            format: match flags.logging_format {
                crate::cli::LogFormat::Text => "text",
                crate::cli::LogFormat::Json => "json",
            }
            .into(),
            options: LoggingOptions {
                json: buffer.clone(),
                text: buffer,
            },
            // The number read (`-v=7`, the file's), while it still gives the level in force.
            verbosity: flags
                .verbosity
                .filter(|v| super::mapping::log_level(*v) == flags.log_level.trim())
                .unwrap_or_else(|| verbosity(&flags.log_level)),
            vmodule: None,
        },
        metrics_bind_address: flags.metrics_bind_address.clone(),
        mode: kind.map_or("", BackendKind::mode).into(),
        nftables,
        // Unset addresses: nftables mode's default is `primary`, iptables mode's every local
        // address (null).
        node_port_addresses: match (flags.nodeport_addresses.is_empty(), nftables_mode) {
            (false, _) => Some(flags.nodeport_addresses.clone()),
            (true, true) => Some(vec!["primary".into()]),
            (true, false) => None,
        },
        oom_score_adj: None,
        port_range: String::new(),
        show_hidden_metrics_for_version: String::new(),
        winkernel: super::v1alpha1::WinkernelConfiguration {
            enable_dsr: flags.enable_dsr,
            network_name: flags.network_name.clone().unwrap_or_default(),
            source_vip: flags
                .source_vip
                .iter()
                .map(|ip| ip.to_string())
                .collect::<Vec<_>>()
                .join(","),
            forward_health_check_vip: flags.forward_healthcheck_vip,
            // The default (`cbr0`) as kube-proxy off Windows writes it: empty (read back as
            // `cbr0`).
            root_hns_endpoint_name: if flags.root_hnsendpoint_name
                == super::mapping::ROOT_HNS_ENDPOINT_NAME
            {
                String::new()
            } else {
                flags.root_hnsendpoint_name.clone()
            },
        },
        windows_run_as_service: flags.windows_service,
    })
}

/// `clientConnection` with kube-proxy's defaults for what is not set (kpng speaks JSON).
fn client_connection(client: &ClientConnection) -> ClientConnectionConfiguration {
    ClientConnectionConfiguration {
        accept_content_types: String::new(),
        // A burst of 0 is a bucket of one request (the source's token bucket holds at least
        // one), but the file reads 0 as the default 10: written as 1, it means the same.
        burst: client
            .kube_api_burst
            .and_then(|b| i32::try_from(b.max(1)).ok())
            .unwrap_or(10),
        content_type: "application/json".into(),
        kubeconfig: client
            .kubeconfig
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        // A QPS of 0 is no limit, but the file reads 0 as the default 5: written as -1 (no
        // limit there too), it means the same.
        qps: match client.kube_api_qps {
            None => 5.0,
            Some(q) => {
                if q == 0.0 {
                    -1.0
                } else {
                    q
                }
            }
        },
    }
}

/// Settings in force that the file cannot carry, one line each naming the flag to keep on the
/// command line: `bindAddress` holds one node IP, not a dual-stack pair; `logging.verbosity`
/// holds info, debug or trace, not a `--log-level` of warn or per-module directives; the file
/// reads a `minSyncPeriod` of 0 as kube-proxy's default 1s, and an empty
/// `metricsBindAddress` as the default address, as kube-proxy does.
pub fn not_written(flags: &GlobalFlags) -> Vec<String> {
    let mut lost = Vec::new();
    if let [first, rest @ ..] = flags.node_ip.as_slice()
        && !rest.is_empty()
    {
        let all: Vec<String> = flags.node_ip.iter().map(ToString::to_string).collect();
        let left: Vec<String> = rest.iter().map(ToString::to_string).collect();
        lost.push(format!(
            "--node-ip {}: bindAddress takes one IP (kube-proxy refuses a pair), so only \
             {first} is written and {} is left out (kube-proxy reads the other family's node \
             IP from the Node object): keep --node-ip {} on kpng's command line to keep both",
            all.join(","),
            left.join(","),
            all.join(",")
        ));
    }
    // The file's level is klog's verbosity: `--log-level` warn, error, off or per-module
    // directives have none, and read back as info (or debug, trace).
    let read_back = super::mapping::log_level(verbosity(&flags.log_level));
    if !read_back.eq_ignore_ascii_case(flags.log_level.trim()) {
        lost.push(format!(
            "--log-level={} has no logging.verbosity of its own: it is written as {}, which the \
             file reads as {read_back}: keep --log-level={} on the command line",
            flags.log_level.trim(),
            verbosity(&flags.log_level),
            flags.log_level.trim()
        ));
    }
    if flags.min_sync_period.is_zero() {
        lost.push(
            "--min-sync-period=0s is written as 0s, which the file reads as kube-proxy's \
             default 1s: keep --min-sync-period=0s on the command line"
                .to_string(),
        );
    }
    if flags.healthz_bind_address.is_none() {
        lost.push(
            "--healthz-bind-address=\"\" (no health server) is written as \"\", which the file \
             reads as the default 0.0.0.0:10256: keep --healthz-bind-address=\"\" on the \
             command line"
                .to_string(),
        );
    }
    if flags.metrics_bind_address.trim().is_empty() {
        lost.push(
            "--metrics-bind-address=\"\" (no metrics server) is written as \"\", which the file \
             reads as the default 127.0.0.1:10249: keep --metrics-bind-address=\"\" on the \
             command line"
                .to_string(),
        );
    }
    lost
}

/// A `--log-level` as klog verbosity (the inverse of the mapping on reading).
fn verbosity(log_level: &str) -> u32 {
    match log_level.trim() {
        "debug" => 4,
        "trace" => 5,
        _ => 0,
    }
}

/// Fields Go leaves out when empty (`omitempty`), as dotted paths.
const OMIT_EMPTY: [&str; 6] = [
    "featureGates",
    "windowsRunAsService",
    "logging.format",
    "logging.vmodule",
    "logging.options.json.splitStream",
    "logging.options.text.splitStream",
];

/// Renders the configuration as YAML, keys sorted and empty `omitempty` fields left out, as
/// kube-proxy writes it.
pub fn render(config: &KubeProxyConfiguration) -> anyhow::Result<String> {
    let mut value = serde_json::to_value(config).context("serialising the configuration")?;
    for path in OMIT_EMPTY {
        omit_if_empty(&mut value, path);
    }
    // A whole-number QPS as Go writes it (`5`, not `5.0`).
    if let Some(qps) = value.pointer_mut("/clientConnection/qps")
        && let Some(whole) = qps.as_f64().filter(|q| q.fract() == 0.0 && q.abs() < 1e15)
    {
        *qps = serde_json::Value::from(whole as i64);
    }
    serde_saphyr::to_string(&value).map_err(|e| anyhow::anyhow!("rendering YAML: {e}"))
}

/// Removes the field at a dotted path when it is null, false, "" or an empty map or list.
fn omit_if_empty(value: &mut serde_json::Value, path: &str) {
    use serde_json::Value;
    let Value::Object(map) = value else { return };
    match path.split_once('.') {
        Some((head, rest)) => {
            if let Some(inner) = map.get_mut(head) {
                omit_if_empty(inner, rest);
            }
        }
        None => {
            let empty = match map.get(path) {
                Some(Value::Null | Value::Bool(false)) => true,
                Some(Value::String(s)) => s.is_empty(),
                Some(Value::Object(m)) => m.is_empty(),
                Some(Value::Array(a)) => a.is_empty(),
                _ => false,
            };
            if empty {
                map.remove(path);
            }
        }
    }
}

/// Writes the text to a file, or to standard output for `-`.
pub fn write_to(destination: &str, text: &str) -> anyhow::Result<()> {
    if destination == "-" {
        print!("{text}");
        return Ok(());
    }
    std::fs::write(destination, text).with_context(|| format!("writing {destination}"))
}
