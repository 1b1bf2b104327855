//! kube-proxy's debug pages on the metrics address: `/configz` (the effective
//! KubeProxyConfiguration, JSON), `/flagz` (every flag's effective value) and `/statusz`
//! (start time, uptime, version). Why: an operator comparing kpng with the kube-proxy it
//! replaced asks these pages first, and tools scrape `/configz`.

use std::time::SystemTime;

use crate::cli::GlobalFlags;

/// The texts of the three pages: fixed at start, since flags and configuration do not change
/// while kpng runs.
#[derive(Debug, Clone)]
pub struct ZPages {
    /// `/configz`: `{"kubeproxy.config.k8s.io": <KubeProxyConfiguration>}`, as kube-proxy.
    pub configz: String,
    /// `/flagz`.
    pub flagz: String,
    /// When kpng started.
    pub started: SystemTime,
    /// What serves: `kpng` and the backend.
    pub component: String,
}

/// The warning kube's z-pages start with.
const NOT_PARSEABLE: &str = "Warning: This endpoint is not meant to be machine parseable, has no \
     formatting compatibility guarantees and is for debugging purposes only.";

impl ZPages {
    /// The pages of a kpng running with `flags` (`backend`: the backend's or sink's name).
    pub fn new(flags: &GlobalFlags, backend: &str) -> ZPages {
        let configz = match crate::config::effective(flags)
            .and_then(|c| serde_json::to_value(c).map_err(anyhow::Error::from))
        {
            Ok(config) => serde_json::json!({ "kubeproxy.config.k8s.io": config }).to_string(),
            Err(e) => serde_json::json!({ "error": format!("{e:#}") }).to_string(),
        };
        // component-base's flagz: "<component> flags", the warning, then `name=value`
        // lines, sorted.
        let mut flagz = format!("kpng flags\n{NOT_PARSEABLE}\n\n");
        for line in &flags.effective_flags {
            flagz.push_str(line);
            flagz.push('\n');
        }
        ZPages {
            configz,
            flagz,
            started: SystemTime::now(),
            component: format!("kpng ({backend})"),
        }
    }

    /// `/statusz` now.
    pub fn statusz(&self) -> String {
        let info = crate::version::BuildInfo::current();
        let up = SystemTime::now()
            .duration_since(self.started)
            .unwrap_or_default();
        let up = std::time::Duration::from_secs(up.as_secs());
        format!(
            "{} statusz\n{NOT_PARSEABLE}\n\nStarted: {}\nUp: {}\nBinary version: {} (git {}, built {})\nKubernetes schema: {}\nPaths: /configz /flagz /healthz /livez /metrics /proxyMode /status /statusz\n",
            self.component,
            humantime::format_rfc3339_seconds(self.started),
            humantime::format_duration(up),
            info.version,
            info.git_commit,
            info.build_date,
            info.kubernetes_schema,
        )
    }
}

/// kube-proxy's name of each kpng flag that has another name there (kpng accepts both), so
/// that `/flagz` reads like kube-proxy's page.
const KUBE_PROXY_NAMES: [(&str, &str); 5] = [
    ("node-name", "hostname-override"),
    ("node-ip", "bind-address"),
    ("masquerade-bit", "iptables-masquerade-bit"),
    ("min-sync-period", "iptables-min-sync-period"),
    ("sync-period", "iptables-sync-period"),
];

/// Every flag clap knows with its effective value (`name=value`, as component-base's
/// flagz writes it), sorted, for `/flagz`: the ones given, the defaults and, for the flags a
/// `--config` file can set, the value in force after it applied (`flags` is what
/// `config::apply` left), so the page answers "what does this kpng run with". Flags
/// kube-proxy also has are listed under kube-proxy's names (`hostname-override`,
/// `iptables-sync-period`).
pub fn effective_flags(
    command: &clap::Command,
    matches: &clap::ArgMatches,
    flags: &GlobalFlags,
) -> Vec<String> {
    let mut out = Vec::new();
    collect(command, matches, flags, &mut out);
    out.sort();
    out.dedup();
    out
}

fn collect(
    command: &clap::Command,
    matches: &clap::ArgMatches,
    flags: &GlobalFlags,
    out: &mut Vec<String>,
) {
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        let Some(long) = arg.get_long() else {
            continue;
        };
        let name = KUBE_PROXY_NAMES
            .iter()
            .find(|(kpng, _)| *kpng == long)
            .map_or(long, |(_, kube)| kube);
        if let Some(value) = effective_value(flags, id) {
            out.push(format!("{name}={value}"));
        } else if let Ok(Some(values)) = matches.try_get_raw(id) {
            // A URL's user and password (`--master https://user:pass@…`) stay off the page.
            let values: Vec<String> = values
                .map(|v| kpng_source_kube::without_credentials(&v.to_string_lossy()))
                .collect();
            out.push(format!("{name}={}", values.join(",")));
        } else if arg.get_action().takes_values() {
            // Unset and without a default (`--service-cidr`): listed empty, as kube-proxy's
            // page lists every flag, so its absence is visible too.
            out.push(format!("{name}="));
        }
    }
    if let Some((name, sub)) = matches.subcommand()
        && let Some(sub_command) = command.find_subcommand(name)
    {
        collect(sub_command, sub, flags, out);
    }
}

/// The value in force of a flag that `--config` can set, as kube-proxy prints it (Go
/// durations, `true`/`false`, lists comma-separated); `None` for the other flags, whose
/// command-line value (or default) is the one in force.
fn effective_value(flags: &GlobalFlags, id: &str) -> Option<String> {
    use crate::config::format_go_duration as d;
    fn list<T: ToString>(items: &[T]) -> String {
        items
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }
    let cc = &flags.client_connection;
    Some(match id {
        "node_name" => flags.node_name.clone().unwrap_or_default(),
        "node_ip" => list(&flags.node_ip),
        "cluster_cidr" => list(&flags.cluster_cidr),
        "masquerade_all" => flags.masquerade_all.to_string(),
        "detect_local_mode" => flags.detect_local_mode.as_str().to_string(),
        "pod_bridge_interface" => flags.pod_bridge_interface.clone().unwrap_or_default(),
        "pod_interface_name_prefix" => flags.pod_interface_name_prefix.clone().unwrap_or_default(),
        "masquerade_bit" => flags.masquerade_bit.to_string(),
        "nodeport_addresses" => list(&flags.nodeport_addresses),
        "healthz_bind_address" => flags
            .healthz_bind_address
            .map_or_else(String::new, |a| a.to_string()),
        "metrics_bind_address" => flags.metrics_bind_address.clone(),
        "bind_address_hard_fail" => flags.bind_address_hard_fail.to_string(),
        "min_sync_period" => d(flags.min_sync_period),
        "sync_period" => d(flags.sync_period),
        "conntrack_max_per_core" => flags.conntrack_max_per_core.to_string(),
        "conntrack_min" => flags.conntrack_min.to_string(),
        "conntrack_tcp_timeout_established" => d(flags.conntrack_tcp_timeout_established),
        "conntrack_tcp_timeout_close_wait" => d(flags.conntrack_tcp_timeout_close_wait),
        "conntrack_tcp_be_liberal" => flags.conntrack_tcp_be_liberal.to_string(),
        "conntrack_udp_timeout" => d(flags.conntrack_udp_timeout),
        "conntrack_udp_timeout_stream" => d(flags.conntrack_udp_timeout_stream),
        "log_level" => flags.log_level.clone(),
        "verbosity" => flags.verbosity.map(|v| v.to_string()).unwrap_or_default(),
        "logging_format" => match flags.logging_format {
            crate::cli::LogFormat::Text => "text".to_string(),
            crate::cli::LogFormat::Json => "json".to_string(),
        },
        "kubeconfig" => cc
            .kubeconfig
            .as_ref()
            .or(flags.kubeconfig.as_ref())
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        "kube_api_qps" => cc.kube_api_qps.unwrap_or(flags.kube_api_qps).to_string(),
        "kube_api_burst" => cc
            .kube_api_burst
            .unwrap_or(flags.kube_api_burst)
            .to_string(),
        "proxy_mode" => flags
            .proxy_mode
            .map_or("", crate::backends::BackendKind::mode)
            .to_string(),
        "iptables_localhost_nodeports" => flags.iptables_localhost_nodeports.to_string(),
        "enable_dsr" => flags.enable_dsr.to_string(),
        "source_vip" => list(&flags.source_vip),
        "network_name" => flags.network_name.clone().unwrap_or_default(),
        "forward_healthcheck_vip" => flags.forward_healthcheck_vip.to_string(),
        "root_hnsendpoint_name" => flags.root_hnsendpoint_name.clone(),
        "windows_service" => flags.windows_service.to_string(),
        _ => return None,
    })
}
