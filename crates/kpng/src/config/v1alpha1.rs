//! `kubeproxy.config.k8s.io/v1alpha1` `KubeProxyConfiguration`, field for field as upstream
//! (`k8s.io/kube-proxy/config/v1alpha1/types.go`, Kubernetes 1.33), so that the file an
//! administrator already has in the `kube-proxy` ConfigMap reads unchanged.
//!
//! Every field is optional in the file, as in Go: a missing field or `null` is the zero value
//! (loading strips `null`s first), and kube-proxy's defaulting turns zeros into defaults
//! (`mapping.rs`). Fields are declared in the byte order of their JSON names, the order in which
//! kube-proxy writes them (Go's YAML writer sorts keys). No field is skipped when serialising: the
//! serialised default is also the list of known fields that loading checks a file against
//! (`load.rs`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::duration::{GoDuration, SignedGoDuration};

/// The `apiVersion` kpng reads and writes.
pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
/// The `kind` kpng reads and writes.
pub const KIND: &str = "KubeProxyConfiguration";

/// kube-proxy's whole configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeProxyConfiguration {
    /// Must be [`API_VERSION`].
    pub api_version: String,
    /// The node's primary IP override (`0.0.0.0`/`::` mean "none"); no socket is bound to it.
    pub bind_address: String,
    /// Whether failing to bind a server port is fatal (kpng always treats it as fatal).
    pub bind_address_hard_fail: bool,
    /// How to reach the API server.
    pub client_connection: ClientConnectionConfiguration,
    /// The pod CIDR(s), comma-separated (a dual-stack pair at most).
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: String,
    /// Informer resync period (kpng's watches have none).
    pub config_sync_period: GoDuration,
    /// Conntrack sysctls.
    pub conntrack: ConntrackConfiguration,
    /// Parameters of `detectLocalMode`.
    pub detect_local: DetectLocalConfiguration,
    /// How pod traffic is recognised; empty means `ClusterCIDR`.
    pub detect_local_mode: String,
    /// `/debug/pprof` on the metrics server.
    pub enable_profiling: bool,
    /// Kubernetes feature gates.
    pub feature_gates: BTreeMap<String, bool>,
    /// Health server address (`IP:port`, or an IP that gets port 10256).
    pub healthz_bind_address: String,
    /// This node's name, when not the hostname.
    pub hostname_override: String,
    /// Settings of the iptables mode (also read when `mode` is empty, as kube-proxy does).
    pub iptables: IpTablesConfiguration,
    /// Settings of the ipvs mode.
    pub ipvs: IpvsConfiguration,
    /// Must be [`KIND`].
    pub kind: String,
    /// component-base logging options.
    pub logging: LoggingConfiguration,
    /// Metrics server address (`IP:port`, or an IP that gets port 10249).
    pub metrics_bind_address: String,
    /// The proxy mode: `iptables` (kube-proxy's Linux default), `ipvs`, `nftables`, `kernelspace`
    /// (its Windows default); empty: the system's default.
    pub mode: String,
    /// Settings of the nftables mode.
    pub nftables: NfTablesConfiguration,
    /// Addresses that accept NodePorts: `primary` or CIDRs.
    pub node_port_addresses: Option<Vec<String>>,
    /// The process's OOM score adjustment.
    pub oom_score_adj: Option<i32>,
    /// Unused even by kube-proxy (the userspace proxy's port range).
    pub port_range: String,
    /// Re-enable metrics hidden since this version.
    pub show_hidden_metrics_for_version: String,
    /// Windows service-control-manager integration.
    pub windows_run_as_service: bool,
    /// Settings of the Windows kernelspace mode.
    pub winkernel: WinkernelConfiguration,
}

/// `clientConnection` (component-base `ClientConnectionConfiguration`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ClientConnectionConfiguration {
    /// The Accept header (kpng always reads JSON).
    pub accept_content_types: String,
    /// Token-bucket burst towards the API server (0 means the default, 10).
    pub burst: i32,
    /// Request content type (kpng always sends JSON).
    pub content_type: String,
    /// Path of the kubeconfig file; empty means in-cluster configuration.
    pub kubeconfig: String,
    /// Queries per second towards the API server (0 means the default, 5).
    pub qps: f32,
}

/// `conntrack`: pointers in Go, so that `null` (default) differs from `0` (leave the sysctl).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ConntrackConfiguration {
    /// Table entries per CPU (null: 32768; 0: leave the table size and ignore `min`).
    pub max_per_core: Option<i32>,
    /// Minimum table size (null: 131072).
    pub min: Option<i32>,
    /// `nf_conntrack_tcp_be_liberal`.
    pub tcp_be_liberal: bool,
    /// CLOSE_WAIT timeout (null: 1h; 0: leave).
    pub tcp_close_wait_timeout: Option<GoDuration>,
    /// Established TCP timeout (null: 24h; 0: leave).
    pub tcp_established_timeout: Option<GoDuration>,
    /// ASSURED UDP timeout (0: leave).
    pub udp_stream_timeout: GoDuration,
    /// UNREPLIED UDP timeout (0: leave).
    pub udp_timeout: GoDuration,
}

/// `detectLocal`: the parameters of the interface-based `detectLocalMode`s.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DetectLocalConfiguration {
    /// The pod bridge, for `BridgeInterface`.
    pub bridge_interface: String,
    /// The pod interface prefix, for `InterfaceNamePrefix`.
    pub interface_name_prefix: String,
}

/// `iptables`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct IpTablesConfiguration {
    /// Loopback NodePorts (iptables mode, IPv4 only; null: true).
    pub localhost_node_ports: Option<bool>,
    /// Masquerade all traffic to ClusterIPs.
    pub masquerade_all: bool,
    /// The fwmark bit for masquerading (null: 14).
    pub masquerade_bit: Option<i32>,
    /// Minimum time between syncs (0: 1s).
    pub min_sync_period: GoDuration,
    /// Periodic sync interval (0: 30s).
    pub sync_period: GoDuration,
}

/// `ipvs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct IpvsConfiguration {
    // Durations here may be negative: kube-proxy validates this section in ipvs mode only.
    /// CIDRs the ipvs cleanup leaves alone.
    #[serde(rename = "excludeCIDRs")]
    pub exclude_cidrs: Option<Vec<String>>,
    /// Minimum time between syncs.
    pub min_sync_period: SignedGoDuration,
    /// The ipvs scheduler.
    pub scheduler: String,
    /// arp_ignore/arp_announce for kube-ipvs0.
    #[serde(rename = "strictARP")]
    pub strict_arp: bool,
    /// Periodic sync interval (0: 30s).
    pub sync_period: SignedGoDuration,
    /// ipvs TCP FIN timeout.
    pub tcp_fin_timeout: SignedGoDuration,
    /// ipvs TCP timeout.
    pub tcp_timeout: SignedGoDuration,
    /// ipvs UDP timeout.
    pub udp_timeout: SignedGoDuration,
}

/// `nftables`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NfTablesConfiguration {
    /// Masquerade all traffic to ClusterIPs.
    pub masquerade_all: bool,
    /// The fwmark bit for masquerading (null: 14).
    pub masquerade_bit: Option<i32>,
    /// Minimum time between syncs (0: 1s).
    pub min_sync_period: GoDuration,
    /// Periodic sync interval (0: 30s).
    pub sync_period: GoDuration,
}

/// `winkernel`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct WinkernelConfiguration {
    /// Direct server return.
    #[serde(rename = "enableDSR")]
    pub enable_dsr: bool,
    /// Forward the Service VIP for health-check ports.
    pub forward_health_check_vip: bool,
    /// The HNS network.
    pub network_name: String,
    /// The root HNS endpoint.
    pub root_hns_endpoint_name: String,
    /// The source VIP.
    pub source_vip: String,
}

/// `logging` (component-base `LoggingConfiguration`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LoggingConfiguration {
    /// Flush interval: a duration string or nanoseconds (no meaning for kpng).
    pub flush_frequency: Option<serde_json::Value>,
    /// `text` (default) or `json`.
    pub format: String,
    /// Per-format options.
    pub options: LoggingOptions,
    /// klog verbosity.
    pub verbosity: u32,
    /// Per-file verbosity overrides.
    pub vmodule: Option<Vec<serde_json::Value>>,
}

/// `logging.options`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LoggingOptions {
    /// JSON format options.
    pub json: OutputRouting,
    /// Text format options.
    pub text: OutputRouting,
}

/// `logging.options.{json,text}`: where klog sends info and error lines.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct OutputRouting {
    /// Buffer size of the info stream (a Kubernetes quantity).
    pub info_buffer_size: Option<serde_json::Value>,
    /// Info lines to stdout, errors to stderr.
    pub split_stream: Option<bool>,
}
