//! The command line: `kpng <source> [source flags] <sink> [backend] [flags]`, or kube-proxy's
//! own command line (no subcommand: the `kube` source and the backend of `--proxy-mode` or the
//! configuration file's `mode`), so that kpng replaces kube-proxy by changing only the image.
//!
//! Node and proxy flags are global: they may stand anywhere on the line, as kube-proxy users
//! expect to paste them. kube-proxy flags that kpng does not implement are taken off the line
//! before clap sees it (`kube_proxy_flags.rs`) and warned about.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::backends::BackendKind;

/// kpng: a Kubernetes service proxy (kube-proxy next generation).
///
/// A source turns cluster state (Services, EndpointSlices, Nodes) into a small node-local model;
/// a sink consumes it. Without a subcommand kpng runs as kube-proxy does: the `kube` source and
/// the backend of --proxy-mode or the --config file's `mode` (by default kube-proxy's: iptables
/// on Linux, kernelspace on Windows).
#[derive(Debug, Parser)]
#[command(
    name = "kpng",
    // Both carry the Kubernetes API version as kube-proxy's `Kubernetes v1.x.y` does: tools that
    // run `kube-proxy --version` (Calico's start.ps1) match `v([0-9])\.([0-9]+)` in it.
    // The commit too: every build of a version says the same number, and an operator rolling
    // builds out must tell them apart.
    version = concat!(
        env!("CARGO_PKG_VERSION"),
        " (git ",
        env!("KPNG_GIT_COMMIT"),
        "), Kubernetes v",
        kpng_k8s::kubernetes_schema!(),
        " API"
    ),
    long_version = concat!(
        env!("CARGO_PKG_VERSION"),
        " (git ",
        env!("KPNG_GIT_COMMIT"),
        ", built ",
        env!("KPNG_BUILD_DATE"),
        "), Kubernetes v",
        kpng_k8s::kubernetes_schema!(),
        " API"
    ),
    propagate_version = true,
    // A flag given twice keeps its last value, as pflag (kube-proxy's flag parser) does:
    // `--v=2 --v=4` is 4. List flags kube-proxy reads as one string (`--cluster-cidr`,
    // `--bind-address`, `--source-vip`) are `Set` for the same reason; `--nodeport-addresses`
    // is a pflag StringSlice, whose repeats append, so it stays `Append`.
    args_override_self = true,
    max_term_width = 100,
    after_help = EXAMPLES
)]
pub struct Cli {
    /// Flags that apply wherever they are written.
    #[command(flatten)]
    pub global: GlobalFlags,
    /// kube-proxy's command line (no subcommand): print what the backend would do and change
    /// nothing, as `to-local <backend> --dry-run` (with a source, write it after the backend);
    /// with --cleanup or `cleanup`: print what would be removed, remove nothing; with
    /// --init-only: check, and print the sysctls instead of writing them.
    #[arg(long, help_heading = "Backend")]
    pub dry_run: bool,
    /// With --cleanup: remove only what kpng alone installs, as `kpng cleanup --kpng-only`
    /// (for going back to a kube-proxy that runs again).
    #[arg(long, help_heading = "Node")]
    pub kpng_only: bool,
    /// What to read cluster state from; none: kube-proxy's command line.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// The headings of the global flags, in `kpng --help`'s order.
const GLOBAL_HEADINGS: [&str; 5] = ["Source", "Node", "Backend", "Output", "Logging"];

/// What a subcommand's help says instead of repeating the global flags.
const GLOBAL_FLAGS_FOOTER: &str = "\
Global flags (source, node, backend, output, logging: --config, --node-name, --proxy-mode,
--masquerade-bit, --metrics-bind-address, --log-level, …) may stand anywhere on the line;
`kpng --help` lists them once, grouped.";

/// The command that renders help: the parser's ([`Cli`]), except that the global flags belong
/// to the root only, grouped under [`GLOBAL_HEADINGS`] in that order, and each subcommand says
/// where they are instead of repeating them. Parsing keeps the derived command, where they are
/// global (accepted anywhere on the line).
pub fn help_command() -> clap::Command {
    let mut root = <Cli as clap::CommandFactory>::command();
    // Every flag under a heading (the global ones, and the root's own `--dry-run`).
    let mut ranked: Vec<(clap::Id, usize)> = root
        .get_arguments()
        .filter(|a| a.is_global_set() || a.get_help_heading().is_some())
        .enumerate()
        .map(|(i, a)| {
            let rank = a
                .get_help_heading()
                .and_then(|h| GLOBAL_HEADINGS.iter().position(|g| *g == h))
                .unwrap_or(0);
            (a.get_id().clone(), 1000 * (rank + 1) + i)
        })
        .collect();
    // Headings come in the order of their first flag in the argument list, and `mut_arg`
    // moves a flag to the end of it: mutating in rank order sorts the list by heading.
    ranked.sort_by_key(|(_, order)| *order);
    for (id, order) in ranked {
        root = root.mut_arg(id, |a| a.global(false).display_order(order));
    }
    let names: Vec<String> = root
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect();
    for name in names {
        root = root.mut_subcommand(name, with_footer);
    }
    root.build();
    root
}

/// `sub` and its subcommands with [`GLOBAL_FLAGS_FOOTER`].
fn with_footer(mut sub: clap::Command) -> clap::Command {
    sub = sub.after_help(GLOBAL_FLAGS_FOOTER);
    let names: Vec<String> = sub
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect();
    for name in names {
        sub = sub.mut_subcommand(name, with_footer);
    }
    sub
}

/// The help the line asks for (`-h`: the summary; `--help` or `help …`: the long form), of
/// the deepest (sub)command it names, rendered by [`help_command`].
pub fn help_text(args: &[String]) -> String {
    let mut cmd = help_command();
    let long = !args.iter().any(|a| a == "-h");
    let mut path: Vec<String> = Vec::new();
    {
        let mut here = &cmd;
        for arg in args.iter().skip(1) {
            if arg == "help"
                && here.find_subcommand("help").is_some()
                && path.last().map(String::as_str) != Some("help")
            {
                continue;
            }
            if let Some(sub) = here
                .get_subcommands()
                .find(|c| c.get_name() == arg || c.get_all_aliases().any(|a| a == arg))
            {
                path.push(sub.get_name().to_string());
                here = sub;
            }
        }
    }
    fn render(cmd: &mut clap::Command, path: &[String], long: bool) -> String {
        if let Some((first, rest)) = path.split_first()
            && let Some(sub) = cmd.find_subcommand_mut(first)
        {
            return render(sub, rest, long);
        }
        let rendered = if long {
            cmd.render_long_help()
        } else {
            cmd.render_help()
        };
        rendered.to_string()
    }
    render(&mut cmd, &path, long)
}

/// `kpng --help`'s examples, one command line each, printed verbatim.
pub const EXAMPLES: &str = "\
Examples:
  kpng --config /var/lib/kube-proxy/config.conf --hostname-override=node1
  kpng --config /var/lib/kube-proxy/config.conf --hostname-override=node1 --dry-run
  kpng kube --kubeconfig ~/.kube/config --node-name node1 to-local nft
  kpng file --input examples/cluster.yaml to-file --output -
  kpng file --input examples/cluster.yaml to-local nft --dry-run
  kpng file --input examples/cluster.yaml --node-name node1 to-local hns --hcn-simulator hcn.json
  kpng --cleanup

kube-proxy flags kpng accepts without effect, each warning once when set away from kube-proxy's
default: --feature-gates, --profiling, --show-hidden-metrics-for-version, --oom-score-adj,
--config-sync-period, --proxy-port-range, --ipvs-*, --vmodule. Accepted silently, because kpng
already does what they ask or they only tune kube-proxy's own logging: --kube-api-content-type,
--log-flush-frequency, --log-{json,text}-*.";

/// What feeds the model: hand-written manifests, or objects an API server has validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputKind {
    /// The `file` source: nothing checked the objects before kpng.
    Manifests,
    /// The `kube` source: the API server allocated the node ports, within its own range.
    ApiServer,
}

impl GlobalFlags {
    /// The node-port range the model enforces for `input`: `--service-node-port-range` when
    /// given, else the API server's default for manifests and none for the API server's own
    /// objects (see the flag).
    pub fn node_port_range(&self, input: InputKind) -> Option<kpng_model::NodePortRange> {
        self.service_node_port_range.or(match input {
            InputKind::Manifests => Some(kpng_model::NodePortRange::DEFAULT),
            InputKind::ApiServer => None,
        })
    }
}

/// Node, proxy and server flags (kube-proxy's names and defaults).
#[derive(Debug, Args, Clone)]
pub struct GlobalFlags {
    /// A kube-proxy configuration file (KubeProxyConfiguration v1alpha1, YAML or JSON, e.g. the
    /// `config.conf` of the kube-proxy ConfigMap); flags given on the command line win over it.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// The admin socket: a running kpng answers `kpng status` and `kpng trace` on it (root
    /// only; on Windows a named pipe, `\\.\pipe\kpng`, administrators only); the client
    /// commands ask the kpng serving it. Empty: none; `to-file` opens none unless given.
    #[arg(
        long,
        global = true,
        value_name = "PATH",
        default_value = crate::admin_socket::DEFAULT_ADMIN_SOCKET,
        help_heading = "Output"
    )]
    pub admin_socket: String,

    /// Every flag's effective value (`name=value`, kube-proxy's names), for `/flagz`;
    /// filled once `--config` applied.
    #[arg(skip)]
    pub effective_flags: Vec<String>,

    /// How a running kpng checks a new content of its `--config` file (`config::watch`);
    /// set by `main` once `--config` applied.
    #[arg(skip)]
    pub config_recheck: Option<crate::config::watch::Recheck>,

    /// Exit 1 when the --config file draws a warning (a field kpng does not know, a setting it
    /// ignores or replaces) instead of running with it: for a CI check of a ConfigMap
    /// (`--strict-config --config FILE --write-config-to - version`).
    #[arg(long, global = true, action = clap::ArgAction::Set, value_parser = parse_go_bool, num_args = 0..=1, require_equals = true, default_value_t = false, default_missing_value = "true", help_heading = "Output")]
    pub strict_config: bool,

    /// Write the effective configuration as a KubeProxyConfiguration to FILE (`-`: standard
    /// output) and exit without running the command.
    #[arg(long, global = true, value_name = "FILE", help_heading = "Output")]
    pub write_config_to: Option<String>,

    /// The backend, by kube-proxy's mode name: iptables, nftables, kernelspace (Windows' HNS;
    /// also winkernel), or kpng's userspace and ebpf; "" is kube-proxy's default of the system
    /// (iptables on Linux, kernelspace on Windows). Without a subcommand it chooses the
    /// backend; with `to-local` it must agree. Default: the --config file's `mode`.
    #[arg(id = "proxy_mode", long = "proxy-mode", global = true, value_name = "MODE", value_parser = parse_proxy_mode, help_heading = "Backend")]
    pub proxy_mode_arg: Option<ProxyModeArg>,

    /// The backend `--proxy-mode` or the --config file's `mode` chose (`config::apply`
    /// settles it); `None` when neither did.
    #[arg(skip)]
    pub proxy_mode: Option<BackendKind>,

    /// Where the backend came from (`--proxy-mode`, or the --config file's `mode`), for
    /// messages; `None` when neither said.
    #[arg(skip)]
    pub proxy_mode_origin: Option<String>,

    /// Remove the rules of kube-proxy (every mode) and of every kpng backend from this node,
    /// then exit (kube-proxy's --cleanup).
    #[arg(long, global = true, action = clap::ArgAction::Set, value_parser = parse_go_bool, num_args = 0..=1, require_equals = true, default_value_t = false, default_missing_value = "true", help_heading = "Node")]
    pub cleanup: bool,

    /// Do what needs full privileges (the conntrack sysctls, the kernel checks), then exit
    /// (kube-proxy's --init-only).
    #[arg(long, global = true, action = clap::ArgAction::Set, value_parser = parse_go_bool, num_args = 0..=1, require_equals = true, default_value_t = false, default_missing_value = "true", help_heading = "Node")]
    pub init_only: bool,

    /// The kubeconfig file of the `kube` source. Without it and without --master, kpng uses
    /// its Pod's service account (in-cluster configuration).
    #[arg(long, global = true, value_name = "FILE", help_heading = "Source")]
    pub kubeconfig: Option<PathBuf>,
    /// The API server's URL (overrides the kubeconfig's server).
    #[arg(long, global = true, value_name = "URL", help_heading = "Source")]
    pub master: Option<String>,
    /// Requests per second to the API server (0 or less: no limit).
    #[arg(long, global = true, default_value_t = 5.0, help_heading = "Source")]
    pub kube_api_qps: f32,
    /// Requests allowed in a burst above --kube-api-qps.
    #[arg(long, global = true, default_value_t = 10, help_heading = "Source")]
    pub kube_api_burst: u32,
    /// How long a connection to the API server may send nothing before kpng gives up on it
    /// and connects again (a hung API server, or a connection a load balancer dropped). The
    /// API server sends a watch a bookmark every minute, so a healthy idle watch never
    /// reaches it; kube-proxy's client gives up after about 45 s (HTTP/2 pings). After a
    /// third of it without anything from the server, kpng asks for /version: no answer is an
    /// outage, and watches silent through it resume once the server answers.
    #[arg(long, global = true, default_value = "90s", value_parser = parse_duration, help_heading = "Source")]
    pub kube_api_idle_timeout: Duration,

    /// How the `kube` source reaches the API server, from `--config`'s `clientConnection` and
    /// the source's own flags (see `config::ClientConnection`).
    #[arg(skip)]
    pub client_connection: crate::config::ClientConnection,

    /// This node's name (kube-proxy's --hostname-override, accepted too); endpoints with this
    /// nodeName are local. Default: the OS hostname.
    #[arg(
        long,
        global = true,
        visible_alias = "hostname-override",
        env = "KPNG_NODE_NAME",
        help_heading = "Node"
    )]
    pub node_name: Option<String>,

    /// This node's IP(s), each replacing the Node object's address of its family and made primary,
    /// as kube-proxy's --bind-address (comma-separated, one per family).
    #[arg(
        long,
        global = true,
        alias = "bind-address",
        action = clap::ArgAction::Set,
        value_delimiter = ',',
        help_heading = "Node"
    )]
    pub node_ip: Vec<IpAddr>,

    /// Serve only the Services labelled service.kubernetes.io/service-proxy-name=NAME (without
    /// it: only the Services without that label, as kube-proxy).
    #[arg(long, global = true, help_heading = "Source")]
    pub service_proxy_name: Option<String>,

    /// The cluster's pod CIDR(s), one per family: traffic from outside them is masqueraded.
    #[arg(long, global = true, action = clap::ArgAction::Set, value_delimiter = ',', value_parser = parse_cidr_flag, help_heading = "Node")]
    pub cluster_cidr: Vec<ipnet::IpNet>,

    /// Masquerade all traffic to ClusterIPs.
    #[arg(long, global = true, action = clap::ArgAction::Set, value_parser = parse_go_bool, num_args = 0..=1, require_equals = true, default_value_t = false, default_missing_value = "true", help_heading = "Backend")]
    pub masquerade_all: bool,

    /// How pod traffic is recognised.
    #[arg(long, global = true, value_enum, default_value_t = DetectLocalMode::ClusterCidr, help_heading = "Node")]
    pub detect_local_mode: DetectLocalMode,

    /// The pod bridge, with --detect-local-mode BridgeInterface.
    #[arg(long, global = true, help_heading = "Node")]
    pub pod_bridge_interface: Option<String>,

    /// The pod interface prefix, with --detect-local-mode InterfaceNamePrefix.
    #[arg(long, global = true, help_heading = "Node")]
    pub pod_interface_name_prefix: Option<String>,

    /// The fwmark bit that marks connections for masquerading (0-31).
    #[arg(long, global = true, alias = "iptables-masquerade-bit", default_value_t = 14, value_parser = clap::value_parser!(u8).range(0..=31), help_heading = "Backend")]
    pub masquerade_bit: u8,

    /// The bits of the conntrack mark kpng may use (nftables: ClientIP-affinity ids; at least
    /// 2 bits, hex or decimal). Every other bit of a connection's mark is kept for the CNI; the
    /// default leaves those of Calico, Cilium, Antrea, Istio and the AWS VPC CNI alone
    /// (docs/deploy.md).
    #[arg(long, global = true, value_name = "MASK", default_value = "0xff00f000", value_parser = parse_mark_mask, help_heading = "Backend")]
    pub conntrack_mark_mask: u32,

    /// The Service CIDR(s): traffic to unallocated ClusterIPs inside them is dropped.
    #[arg(long, global = true, value_delimiter = ',', value_parser = parse_cidr_flag, help_heading = "Node")]
    pub service_cidr: Vec<ipnet::IpNet>,

    /// Addresses that accept NodePort traffic: `primary` (the node's IPs) or CIDRs. Unset: the
    /// backend's default (nftables: `primary`; iptables: every local address). Service health
    /// checks (`healthCheckNodePort`) listen on the same addresses.
    #[arg(long, global = true, value_delimiter = ',', help_heading = "Node")]
    pub nodeport_addresses: Vec<String>,

    /// The node ports the API server may allocate (its own `--service-node-port-range`):
    /// `FIRST-LAST`, `FIRST+COUNT` or one port. A Service's node port outside it (a hand-written
    /// manifest taking, say, port 22 on every node) is not programmed, with a warning.
    /// Default: 30000-32767 for the `file` source, whose manifests no API server checked; no
    /// check for the `kube` source, whose API server allocated every node port within its own
    /// range, whatever that is (kube-proxy has no such check).
    #[arg(long, global = true, value_name = "RANGE", help_heading = "Node")]
    pub service_node_port_range: Option<kpng_model::NodePortRange>,

    /// Where /healthz and /livez are served (kube-proxy's health server), and /readyz (200
    /// once the first sync programmed the node); empty disables; a bare IP gets port 10256, as
    /// kube-proxy's. `to-file` serves none unless given.
    // (`::std::option::Option`: the parser itself says `None` for an empty value, where
    // clap's `Option` would mean "not given".)
    #[arg(
        long,
        global = true,
        default_value = "0.0.0.0:10256",
        value_parser = parse_healthz_bind_address,
        help_heading = "Output"
    )]
    pub healthz_bind_address: ::std::option::Option<SocketAddr>,

    /// Where /metrics, /healthz and /proxyMode are served; empty disables; a bare IP gets
    /// port 10249, as kube-proxy's. `to-file` serves none unless given.
    #[arg(
        long,
        global = true,
        default_value = "127.0.0.1:10249",
        value_parser = parse_metrics_bind_address,
        help_heading = "Output"
    )]
    pub metrics_bind_address: String,

    /// When the health or metrics server cannot bind its address (a port another process
    /// holds, an address the node does not have yet): `true` ends kpng (status 1), as
    /// kube-proxy's `bindAddressHardFail`; `false`, kube-proxy's default, logs it and tries
    /// again every 5 s while kpng runs on.
    #[arg(long, global = true, action = clap::ArgAction::Set, value_parser = parse_go_bool, num_args = 0..=1, require_equals = true, default_value_t = false, default_missing_value = "true", help_heading = "Output")]
    pub bind_address_hard_fail: bool,

    /// Minimum time from a sync that wrote to the data plane (a full sync, one with operations,
    /// or a failed one) to the next sync; a periodic sync that changed nothing does not hold
    /// the next change back (0 = sync at once).
    #[arg(long, global = true, alias = "iptables-min-sync-period", default_value = "1s", value_parser = parse_duration, help_heading = "Backend")]
    pub min_sync_period: Duration,

    /// Periodic sync interval; a change unsynced for twice this makes /healthz fail.
    #[arg(long, global = true, alias = "iptables-sync-period", default_value = "30s", value_parser = parse_duration, help_heading = "Backend")]
    pub sync_period: Duration,

    /// Periodic full resync interval (0 disables).
    #[arg(long, global = true, default_value = "1h", value_parser = parse_duration, help_heading = "Backend")]
    pub full_sync_period: Duration,

    /// With NodePorts on the primary node IPs: how long after the initial lists kpng waits
    /// for a node IP before serving NodePorts on every local address (kube-proxy's fixed
    /// 30 s start-up wait for the Node's addresses). Hidden: tests shorten it.
    #[arg(long, global = true, default_value = "30s", value_parser = parse_duration, hide = true)]
    pub node_ips_wait: Duration,

    /// Repairs of changes someone else made to kpng's rules that are made at once within a
    /// minute; later ones back off (1 s doubling up to --sync-period, at most 30 s) until none
    /// comes for a minute. Hidden: tests that repeat such a change on purpose raise it.
    #[arg(long, global = true, default_value_t = kpng_runner::repair_backoff::FREE_REPAIRS, hide = true)]
    pub repairs_at_once: usize,

    /// Conntrack entries per CPU for nf_conntrack_max (0: leave it).
    #[arg(long, global = true, default_value_t = 32768, help_heading = "Node")]
    pub conntrack_max_per_core: u64,
    /// Minimum nf_conntrack_max.
    #[arg(long, global = true, default_value_t = 131072, help_heading = "Node")]
    pub conntrack_min: u64,
    /// Idle timeout of established TCP connections (0: leave it).
    #[arg(long, global = true, default_value = "24h", value_parser = parse_duration, help_heading = "Node")]
    pub conntrack_tcp_timeout_established: Duration,
    /// Timeout of TCP connections in CLOSE_WAIT (0: leave it).
    #[arg(long, global = true, default_value = "1h", value_parser = parse_duration, help_heading = "Node")]
    pub conntrack_tcp_timeout_close_wait: Duration,
    /// Accept out-of-window TCP packets instead of marking them invalid.
    #[arg(long, global = true, action = clap::ArgAction::Set, value_parser = parse_go_bool, num_args = 0..=1, require_equals = true, default_value_t = false, default_missing_value = "true", help_heading = "Node")]
    pub conntrack_tcp_be_liberal: bool,
    /// Idle timeout of UDP flows (0: leave it).
    #[arg(long, global = true, default_value = "0", value_parser = parse_duration, help_heading = "Node")]
    pub conntrack_udp_timeout: Duration,
    /// Idle timeout of UDP streams (0: leave it).
    #[arg(long, global = true, default_value = "0", value_parser = parse_duration, help_heading = "Node")]
    pub conntrack_udp_timeout_stream: Duration,

    /// Also accept IPv4 NodePort traffic on 127.0.0.1 with the iptables backend (sets
    /// net.ipv4.conf.all.route_localnet=1), as kube-proxy does by default;
    /// `--iptables-localhost-nodeports=false` turns it off. nftables never does.
    #[arg(
        long,
        global = true,
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_parser = parse_go_bool,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        help_heading = "Backend"
    )]
    pub iptables_localhost_nodeports: bool,

    /// Windows (`to-local hns`): direct server return for ClusterIPs and for
    /// externalTrafficPolicy Local frontends (kube-proxy's `winkernel.enableDSR`);
    /// `--enable-dsr=true|false` as kube-proxy's (Calico's start.ps1 writes `=true`).
    #[arg(
        long,
        global = true,
        action = clap::ArgAction::Set,
        value_parser = parse_go_bool,
        num_args = 0..=1,
        require_equals = true,
        default_value_t = false,
        default_missing_value = "true",
        help_heading = "Windows"
    )]
    pub enable_dsr: bool,
    /// Windows (`to-local hns`): the source address of load-balanced traffic on an overlay
    /// network, an address the CNI reserved on this node (`winkernel.sourceVip`); one per
    /// family, comma-separated.
    #[arg(long, global = true, action = clap::ArgAction::Set, value_delimiter = ',', help_heading = "Windows")]
    pub source_vip: Vec<IpAddr>,
    /// Windows (`to-local hns`): the CNI's HNS network (`winkernel.networkName`; kube-proxy's
    /// KUBE_NETWORK variable).
    #[arg(long, global = true, env = "KUBE_NETWORK", help_heading = "Windows")]
    pub network_name: Option<String>,
    /// Windows (`to-local hns`): forward health checks sent to a load-balancer ingress IP
    /// (its health-check node port, else the --healthz-bind-address port) to this host
    /// through the root HNS endpoint (`winkernel.forwardHealthCheckVip`), for pass-through
    /// cloud load balancers that probe the VIP.
    #[arg(
        long,
        global = true,
        action = clap::ArgAction::Set,
        value_parser = parse_go_bool,
        num_args = 0..=1,
        require_equals = true,
        default_value_t = false,
        default_missing_value = "true",
        help_heading = "Windows"
    )]
    pub forward_healthcheck_vip: bool,
    /// Windows (`to-local hns`): the name of the CNI's HNS endpoint for the host's network
    /// namespace, the target of --forward-healthcheck-vip (`winkernel.rootHnsEndpointName`).
    #[arg(long, global = true, default_value = "cbr0", help_heading = "Windows")]
    pub root_hnsendpoint_name: String,
    /// Windows: the process priority class, set at start (kubernetes#96935). Accepted on other
    /// systems with a warning.
    #[arg(
        long,
        global = true,
        value_enum,
        ignore_case = true,
        help_heading = "Windows"
    )]
    pub windows_priority_class: Option<WindowsPriorityClass>,
    /// Windows: run as a Windows service under the Service Control Manager (install with
    /// `sc.exe create`; `windowsRunAsService`): its Stop control stops kpng. Accepted on other
    /// systems with a warning.
    #[arg(
        long,
        global = true,
        action = clap::ArgAction::Set,
        value_parser = parse_go_bool,
        num_args = 0..=1,
        require_equals = true,
        default_value_t = false,
        default_missing_value = "true",
        help_heading = "Windows"
    )]
    pub windows_service: bool,

    /// kube-proxy's deprecated --healthz-port: the health server's port (0: kube-proxy turns
    /// the server off; kpng keeps it, with a warning).
    #[arg(long, global = true, hide = true)]
    pub healthz_port: Option<u16>,
    /// kube-proxy's deprecated --metrics-port: the metrics server's port (0: off).
    #[arg(long, global = true, hide = true)]
    pub metrics_port: Option<u16>,

    /// Log filter: a level (error, warn, info, debug, trace, off) and/or MODULE=LEVEL
    /// directives, e.g. `info,kpng_backend_nft=debug`; RUST_LOG wins when set.
    #[arg(long, global = true, default_value = "info", help_heading = "Logging")]
    pub log_level: String,

    /// Log line format: `text` for people, `json` (one object per line) for log collectors;
    /// kube-proxy's --logging-format and the config file's `logging.format`. Log lines only:
    /// `kpng version`, `status` and `trace` print JSON with their own `-o json`.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t = LogFormat::Text,
        help_heading = "Logging"
    )]
    pub logging_format: LogFormat,

    /// Append the log to FILE instead of standard error: for kpng run as a Windows service
    /// (which has no standard error) or under an init system that collects none. kpng does not
    /// rotate it (logrotate's `copytruncate` works: kpng writes in append mode).
    #[arg(long, global = true, value_name = "FILE", help_heading = "Logging")]
    pub log_file: Option<std::path::PathBuf>,

    /// kube-proxy's (klog's) verbosity, when --log-level is not given: 0-3 info, 4 debug, 5+
    /// trace.
    #[arg(
        short = 'v',
        long = "v",
        global = true,
        value_name = "LEVEL",
        help_heading = "Logging"
    )]
    pub verbosity: Option<u32>,
}

/// The first word: a source, or a standalone command.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Read Kubernetes manifests (a YAML stream or a `kind: List`) from a file, and watch it.
    File(FileSource),
    /// Watch the Kubernetes API server (as kube-proxy does): Services, EndpointSlices, this
    /// node's Node and ServiceCIDRs.
    Kube(KubeSource),
    /// Program this node from a brain (`kpng … to-api`): KPNG's split mode, `local --api ADDR nft`.
    Local(LocalSource),
    /// Use a brain (`kpng … to-api`) as the source of this node's model, for any node sink.
    Api(ApiSource),
    /// Remove every kpng backend's and kube-proxy's (every mode) rules from this node, print
    /// what was removed, then exit (kube-proxy's --cleanup).
    Cleanup(CleanupArgs),
    /// Print the version, git commit, build date and the Kubernetes APIs kpng reads.
    Version(VersionArgs),
    /// Ask the running kpng (--admin-socket) what it programmed: every Service port's
    /// frontends, endpoints and, for each endpoint not used, why.
    Status(StatusArgs),
    /// Ask the running kpng (--admin-socket) what it does with one packet: the Service and
    /// frontend that match, the endpoints, masquerading, or why it is rejected or dropped.
    Trace(TraceArgs),
}

/// `kpng status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// One Service: NAME, NAMESPACE/NAME or NAMESPACE/NAME:PORT (PORT: the port's name or
    /// number); NAMESPACE/ for every Service of a namespace.
    pub service: Option<String>,
    /// Only this namespace's Services (kubectl's habit): with NAME, NAMESPACE/NAME.
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// Asked of a brain (`to-api`): node NODE's view as the brain computes it, every endpoint
    /// used or not and why (a node fed by a brain receives only the endpoints it uses).
    #[arg(long, value_name = "NODE")]
    pub node: Option<String>,
    /// `table`, `wide` (every endpoint and why it is unused), `json` or `yaml`.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = StatusOutput::Table)]
    pub output: StatusOutput,
    /// Only the Service ports with a problem: an endpoint list they need is empty, their
    /// health check is not served or unhealthy with local endpoints, their load balancer's
    /// source ranges name none of their family, or their Service had values dropped or is
    /// rejected (the node's own problems stay above the table). With -o json|yaml too.
    #[arg(long)]
    pub problems: bool,
    /// Exit with status 6 when a Service port shown has a problem (as --problems judges it),
    /// after printing the status as usual: for a check or an alerting script (exit codes:
    /// docs/observability.md).
    #[arg(long)]
    pub fail_on_problems: bool,
    /// How long to wait for the kpng's answer (a hung kpng is an error after it; 0: as long
    /// as it takes).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// How `kpng status` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusOutput {
    /// One line per Service port.
    Table,
    /// Also one line per endpoint, with its state and why it is unused.
    Wide,
    /// The whole status as JSON.
    Json,
    /// The whole status as YAML.
    Yaml,
}

/// `kpng trace`.
#[derive(Debug, Args)]
pub struct TraceArgs {
    /// The packet's source IP.
    #[arg(long)]
    pub from: String,
    /// The packet's destination, IP:PORT (an IPv6 address in brackets, as in a URL).
    #[arg(long)]
    pub to: String,
    /// tcp, udp or sctp.
    #[arg(long, default_value = "tcp")]
    pub proto: String,
    /// The interface the packet arrives on (`cni0`, `cali1234`): with --detect-local-mode
    /// BridgeInterface or InterfaceNamePrefix the rules tell pods by it, so the trace decides
    /// by it exactly as they do (without it, the trace assumes from the Node's podCIDRs and
    /// says so).
    #[arg(long, value_name = "NAME")]
    pub in_interface: Option<String>,
    /// `text` or `json`.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = LogFormat::Text)]
    pub output: LogFormat,
    /// How long to wait for the kpng's answer (a hung kpng is an error after it; 0: as long
    /// as it takes).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// `kpng cleanup`.
#[derive(Debug, Clone, Args)]
pub struct CleanupArgs {
    /// Remove only what kpng alone installs (its `kpng` and `kpng-userspace` nftables tables,
    /// the eBPF backend's pins), never kube-proxy's rules: for going back to a kube-proxy that
    /// already runs again. The iptables chains, which kube-proxy's iptables mode shares by
    /// name with kpng's iptables backend, are kept (kube-proxy takes them over).
    #[arg(long)]
    pub kpng_only: bool,
    /// Print what would be removed, remove nothing (`kpng --cleanup --dry-run` says the same).
    #[arg(long)]
    pub dry_run: bool,
    /// Remove nothing until `http://ADDR/healthz` answers 200 (ADDR: IP:PORT, a bare IP means
    /// port 10256): going back to kube-proxy, its health server once it has synced, so that
    /// kpng's rules (which win over kube-proxy's while they stay) are removed only once
    /// kube-proxy's are in place. Any other answer, or none, is "not yet".
    #[arg(long, value_name = "ADDR", value_parser = |s: &str| listen_address(s, 10256))]
    pub after_healthy: Option<SocketAddr>,
    /// Remove nothing until `http://ADDR/metrics` answers with
    /// `kubeproxy_sync_proxy_rules_last_timestamp_seconds` above 0 (ADDR: IP:PORT, a bare IP
    /// means port 10249): kube-proxy has programmed the node once. Stricter than
    /// --after-healthy, whose 200 kube-proxy answers from its start, before its first sync.
    #[arg(long, value_name = "ADDR", value_parser = |s: &str| listen_address(s, 10249), conflicts_with = "after_healthy")]
    pub after_synced: Option<SocketAddr>,
    /// How long --after-healthy or --after-synced waits before giving up (exit status 1,
    /// nothing removed); 0: as long as it takes.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub timeout: Duration,
    /// The eBPF backend's pin directory to remove, as `to-local ebpf --bpf-pin-path` had it
    /// (pins a running kpng holds are kept).
    #[arg(long, env = "KPNG_BPF_PIN_PATH", default_value = crate::leftovers::DEFAULT_EBPF_PINS)]
    pub bpf_pin_path: std::path::PathBuf,
    /// The cgroup v2 directory the eBPF backend's programs were attached to, as `to-local
    /// ebpf --cgroup-path` had it (default: the cgroup v2 root): kpng programs attached there
    /// are detached even when no pin is left to find them by (a kpng that ran with another
    /// `--bpf-pin-path`).
    #[arg(long, env = "KPNG_CGROUP_PATH")]
    pub cgroup_path: Option<std::path::PathBuf>,
}

/// `kpng version`.
#[derive(Debug, Args)]
pub struct VersionArgs {
    /// `text` for people, `json` for scripts.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = LogFormat::Text)]
    pub output: LogFormat,
}

/// Text for people or JSON for machines: `--logging-format` (log lines only) and the `-o` of
/// `kpng version` and `kpng trace`. Its values' words are shown under each of those flags,
/// so they say nothing of the others: `--logging-format json` once claimed to make `kpng
/// version` and `kpng trace` print JSON, which only their own `-o json` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum LogFormat {
    /// For people.
    #[default]
    Text,
    /// For machines (JSON).
    Json,
}

/// `kpng file …`.
#[derive(Debug, Args)]
pub struct FileSource {
    /// The manifest file (what `kubectl get svc,endpointslices,nodes -A -o yaml` prints), or a
    /// directory whose every *.yaml, *.yml and *.json file is one.
    #[arg(short = 'i', long)]
    pub input: PathBuf,
    /// How long the file must be quiet after a change before it is re-read.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub debounce: Duration,
    /// How far a YAML document may expand while parsed, in nodes per byte of the document:
    /// bounds anchors and aliases (an alias bomb); a document without aliases never reaches 1.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_yaml_expansion: u32,
    /// Where the model goes.
    #[command(subcommand)]
    pub sink: Sink,
}

/// `kpng kube …` (its client flags, `--kubeconfig`, `--master`, `--kube-api-qps`,
/// `--kube-api-burst`, are global: kube-proxy's command line has them without a subcommand).
#[derive(Debug, Args)]
pub struct KubeSource {
    /// Where the model goes.
    #[command(subcommand)]
    pub sink: Sink,
}

/// The second word: where the model goes.
// The variants are the command words (`to-file`, `to-local`, `to-api`).
#[allow(clippy::enum_variant_names)]
#[derive(Debug, Subcommand)]
pub enum Sink {
    /// Write the node-local model as YAML.
    ToFile(ToFile),
    /// Program this node with a backend.
    ToLocal(ToLocal),
    /// Serve every node's model over gRPC (KPNG localv1 `Sets/Watch`): be a brain.
    ToApi(ToApi),
}

/// Where a brain is and how to authenticate to it.
#[derive(Debug, Args, Clone)]
pub struct BrainFlags {
    /// The brain: tcp://HOST:PORT, unix:///PATH or HOST:PORT (KPNG's --server).
    #[arg(long, alias = "server", default_value = "tcp://127.0.0.1:12090")]
    pub api: kpng_api::addr::ApiAddr,
    /// Client certificate (PEM) for a brain that requires mTLS; with --api-tls-key.
    #[arg(long)]
    pub api_tls_cert: Option<PathBuf>,
    /// Client key (PEM).
    #[arg(long)]
    pub api_tls_key: Option<PathBuf>,
    /// CA bundle (PEM) that signs the brain's certificate; any TLS flag turns TLS on.
    #[arg(long)]
    pub api_tls_ca: Option<PathBuf>,
    /// The name in the brain's certificate (default: the host of --api).
    #[arg(long)]
    pub api_tls_server_name: Option<String>,
    /// Longest delay between reconnection attempts (they start at 100ms, doubling, jittered).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub api_retry_max: Duration,
    /// How long the brain may keep this node connected without sending its state (a brain
    /// restarted and still listing its input, or unable to) before that is an input problem in
    /// `kpng status` and `kpng_input_problems`; the rules stay as they are meanwhile.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub api_state_grace: Duration,
    /// Apply a new brain session's first state even when it holds no Service. By default such
    /// a state (a brain given an empty manifest directory, or another cluster's kubeconfig) is
    /// not applied while this node programs Services: the rules stay, `kpng status` says so,
    /// and the brain's state goes through once it holds a Service again.
    #[arg(long)]
    pub api_accept_empty_state: bool,
}

/// `kpng local …`.
#[derive(Debug, Args)]
pub struct LocalSource {
    /// The brain.
    #[command(flatten)]
    pub brain: BrainFlags,
    /// The backend.
    #[command(subcommand)]
    pub backend: LocalBackend,
}

/// `kpng api …`.
#[derive(Debug, Args)]
pub struct ApiSource {
    /// The brain.
    #[command(flatten)]
    pub brain: BrainFlags,
    /// Where this node's model goes.
    #[command(subcommand)]
    pub sink: NodeSink,
}

/// Sinks of one node's model (a brain's stream is one node's view, so it cannot feed `to-api`).
#[allow(clippy::enum_variant_names)]
#[derive(Debug, Subcommand)]
pub enum NodeSink {
    /// Write the node-local model as YAML.
    ToFile(ToFile),
    /// Program this node with a backend.
    ToLocal(ToLocal),
}

/// `… to-api …`.
#[derive(Debug, Args)]
pub struct ToApi {
    /// Where to listen: tcp://IP:PORT (loopback by default; 0.0.0.0 only when asked) or
    /// unix:///PATH.
    #[arg(long, default_value = "tcp://127.0.0.1:12090")]
    pub listen: kpng_api::addr::ApiAddr,
    /// Server certificate (PEM); with --listen-tls-key, turns TLS on.
    #[arg(long)]
    pub listen_tls_cert: Option<PathBuf>,
    /// Server key (PEM).
    #[arg(long)]
    pub listen_tls_key: Option<PathBuf>,
    /// CA bundle (PEM): clients must present a certificate it signed (mTLS).
    #[arg(long)]
    pub listen_tls_ca: Option<PathBuf>,
    /// Connections served at once (a node holds one); a connection over it is closed at once.
    #[arg(long, default_value_t = kpng_api::server::DEFAULT_MAX_CONNECTIONS, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// A connection without a Watch stream for this long is closed (a client that connects and
    /// never asks, or stops asking).
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub connection_idle_timeout: Duration,
}

/// `… to-local <backend>`.
#[derive(Debug, Args)]
pub struct ToLocal {
    /// The backend.
    #[command(subcommand)]
    pub backend: LocalBackend,
}

/// `--detect-local-mode`: how pod traffic is told apart from other traffic (kube-proxy's values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DetectLocalMode {
    /// Sources inside `--cluster-cidr`. Also the empty value (`--detect-local-mode=`), as
    /// kube-proxy and the configuration file's `detectLocalMode: ""` take it.
    #[value(name = "ClusterCIDR", alias = "")]
    ClusterCidr,
    /// Sources inside this node's pod CIDRs (from the Node object).
    #[value(name = "NodeCIDR")]
    NodeCidr,
    /// Traffic entering from `--pod-bridge-interface`.
    #[value(name = "BridgeInterface")]
    BridgeInterface,
    /// Traffic entering from interfaces named `--pod-interface-name-prefix`*.
    #[value(name = "InterfaceNamePrefix")]
    InterfaceNamePrefix,
    /// No detection.
    #[value(name = "None")]
    None,
}

impl DetectLocalMode {
    /// kube-proxy's spelling (the flag value and the config file's `detectLocalMode`).
    pub fn as_str(self) -> &'static str {
        match self {
            DetectLocalMode::ClusterCidr => "ClusterCIDR",
            DetectLocalMode::NodeCidr => "NodeCIDR",
            DetectLocalMode::BridgeInterface => "BridgeInterface",
            DetectLocalMode::InterfaceNamePrefix => "InterfaceNamePrefix",
            DetectLocalMode::None => "None",
        }
    }

    /// Parses kube-proxy's spelling; `None` for an unknown value.
    pub fn parse(value: &str) -> Option<DetectLocalMode> {
        DetectLocalMode::value_variants()
            .iter()
            .copied()
            .find(|m| m.as_str() == value)
    }
}

/// `--iptables-mode`: which iptables variant programs the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IptablesMode {
    /// The one the node already uses (kubelet's hint chains, else the one with more rules; nft
    /// when undecided).
    Auto,
    /// x_tables (`iptables-legacy`).
    Legacy,
    /// nf_tables (`iptables-nft`).
    Nft,
}

/// `--nft-exec`: how the nftables backend reaches the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NftExecMode {
    /// Set elements over netlink; chains through libnftables; whole-table replaces through an
    /// `nft -f -` process.
    Auto,
    /// Everything as nft text through libnftables, in process.
    Library,
    /// An `nft -f -` process for every transaction.
    Command,
}

/// `--windows-priority-class`: Windows' process priority classes (`SetPriorityClass`), in any
/// case and with or without `_PRIORITY_CLASS` (`above_normal`, `ABOVE_NORMAL_PRIORITY_CLASS`),
/// as `set_priority_class` in kpng-backend-hns documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WindowsPriorityClass {
    /// IDLE_PRIORITY_CLASS.
    #[value(name = "IDLE", alias = "IDLE_PRIORITY_CLASS")]
    Idle,
    /// BELOW_NORMAL_PRIORITY_CLASS.
    #[value(name = "BELOW_NORMAL", alias = "BELOW_NORMAL_PRIORITY_CLASS")]
    BelowNormal,
    /// NORMAL_PRIORITY_CLASS.
    #[value(name = "NORMAL", alias = "NORMAL_PRIORITY_CLASS")]
    Normal,
    /// ABOVE_NORMAL_PRIORITY_CLASS.
    #[value(name = "ABOVE_NORMAL", alias = "ABOVE_NORMAL_PRIORITY_CLASS")]
    AboveNormal,
    /// HIGH_PRIORITY_CLASS.
    #[value(name = "HIGH", alias = "HIGH_PRIORITY_CLASS")]
    High,
    /// REALTIME_PRIORITY_CLASS.
    #[value(name = "REALTIME", alias = "REALTIME_PRIORITY_CLASS")]
    Realtime,
}

impl WindowsPriorityClass {
    /// The class's name, as Windows spells it without `_PRIORITY_CLASS`.
    pub fn as_str(self) -> &'static str {
        match self {
            WindowsPriorityClass::Idle => "IDLE",
            WindowsPriorityClass::BelowNormal => "BELOW_NORMAL",
            WindowsPriorityClass::Normal => "NORMAL",
            WindowsPriorityClass::AboveNormal => "ABOVE_NORMAL",
            WindowsPriorityClass::High => "HIGH",
            WindowsPriorityClass::Realtime => "REALTIME",
        }
    }
}

/// `--hcn`: which HCN the Windows backend programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HcnMode {
    /// The Host Networking Service of this Windows node (computenetwork.dll).
    System,
    /// The HCN simulator (any OS); its state lives in --hcn-simulator FILE.
    Simulator,
}

/// `… to-local hns …`.
#[derive(Debug, Args)]
pub struct HnsArgs {
    /// Print the HCN calls each sync would make (load balancers and remote endpoints to
    /// create or delete, with the JSON HCN would be given) and make none: HCN is read once
    /// (the system's, or --hcn-simulator FILE, which is not written), then planned in memory.
    #[arg(long)]
    pub dry_run: bool,
    /// Which HCN to program: the system's (Windows only) or the simulator (any OS).
    #[arg(long, value_enum, default_value_t = HcnMode::System)]
    pub hcn: HcnMode,
    /// Run against the HCN simulator with its state in FILE (implies `--hcn simulator`): FILE,
    /// if it exists at start, is the initial HCN state (networks, the CNI's endpoints); the
    /// whole state is written back to it after every sync, and an edit of FILE by someone
    /// else becomes HCN's state (noticed at the next full sync at the latest).
    #[arg(long, value_name = "FILE")]
    pub hcn_simulator: Option<PathBuf>,
}

/// The backends that program this node.
#[derive(Debug, Subcommand)]
pub enum LocalBackend {
    /// nftables (kube-proxy nftables mode, with a constant-size ruleset).
    #[command(aliases = ["to-nft", "nftables"])]
    Nft(NftArgs),
    /// iptables (kube-proxy iptables mode: the same chains and rules, legacy or nft variant).
    #[command(alias = "to-iptables")]
    Iptables(IptablesArgs),
    /// A userspace TCP/UDP proxy (VIP traffic captured by a small nftables ruleset on Linux);
    /// endpoints see the node as the client.
    Userspace(UserspaceArgs),
    /// eBPF socket-level load balancing (cgroup connect/sendmsg programs: local sockets
    /// connect straight to endpoints), with the nftables ruleset beside it for traffic from
    /// outside the node.
    Ebpf(EbpfArgs),
    /// Windows: load balancers in the Host Networking Service (kube-proxy's kernelspace mode;
    /// `--hcn-simulator FILE` runs it against a simulator on any OS).
    #[command(aliases = ["kernelspace", "winkernel"])]
    Hns(HnsArgs),
}

/// `… to-local ebpf …`.
#[derive(Debug, Args)]
pub struct EbpfArgs {
    /// Print the nftables transactions instead of applying them and load no program; change
    /// nothing on the node.
    #[arg(long)]
    pub dry_run: bool,
    /// The cgroup v2 directory the socket programs attach to: only sockets of processes in
    /// that subtree are translated. Default: the root of the cgroup v2 mount (every process).
    #[arg(long, env = "KPNG_CGROUP_PATH")]
    pub cgroup_path: Option<std::path::PathBuf>,
    /// Translate only the sockets of kpng's own network namespace (the node's: hostNetwork
    /// pods and host processes); pods' sockets reach Services through the nftables rules,
    /// packet by packet, so a service mesh's sidecar (an iptables REDIRECT in the pod) still
    /// sees the Service address (Cilium's bpf-lb-sock-hostns-only; docs/backends.md,
    /// "Service meshes"). Needs Linux 5.14.
    #[arg(
        long,
        env = "KPNG_SOCKET_LB_HOST_NETNS_ONLY",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub socket_lb_host_netns_only: bool,
    /// Where maps and links are pinned (on a BPF file system; `/sys/fs/bpf` is mounted when
    /// missing). The next kpng adopts them; `kpng cleanup` removes them (it reads the same
    /// environment variable).
    #[arg(long, env = "KPNG_BPF_PIN_PATH", default_value = crate::leftovers::DEFAULT_EBPF_PINS)]
    pub bpf_pin_path: std::path::PathBuf,
    /// The `nft` binary (the nftables ruleset for traffic from outside the node).
    #[arg(long, default_value = "nft")]
    pub nft_binary: String,
}

/// `… to-local iptables …`.
#[derive(Debug, Args)]
pub struct IptablesArgs {
    /// Print every iptables-restore input instead of applying it, checked with
    /// `iptables-restore --test` when possible; change nothing on the node.
    #[arg(long)]
    pub dry_run: bool,
    /// Which iptables variant programs the kernel.
    #[arg(long, value_enum, default_value_t = IptablesMode::Auto)]
    pub iptables_mode: IptablesMode,
}

/// `… to-local userspace …`.
#[derive(Debug, Args)]
pub struct UserspaceArgs {
    /// Print every capture transaction instead of applying it, and open no listener (the
    /// capture shows placeholder listener ports).
    #[arg(long)]
    pub dry_run: bool,
    /// How long an idle UDP session is kept (no datagram either way). kube-proxy's userspace
    /// mode defaulted to 250ms; 30s matches the kernel's UDP conntrack timeout.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub udp_timeout: Duration,
    /// How long one connection attempt to an endpoint may take before the next endpoint is
    /// tried.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub connect_timeout: Duration,
    /// When kpng is asked to stop (SIGTERM), how long it waits for the connections it already
    /// accepted to end; what is still open then is cut. Its listeners close at once, so new
    /// connections are refused meanwhile: keep it short. 0: cut at once.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub drain_on_exit: Duration,
    /// The `nft` binary that installs the capture rules.
    #[arg(long, default_value = "nft")]
    pub nft_binary: String,
}

/// `… to-local nft …`.
#[derive(Debug, Args)]
pub struct NftArgs {
    /// Print every transaction instead of applying it, checked with `nft --check` when
    /// possible; change nothing on the node.
    #[arg(long)]
    pub dry_run: bool,
    /// How changes reach the kernel.
    #[arg(long, value_enum, default_value_t = NftExecMode::Auto)]
    pub nft_exec: NftExecMode,
    /// The `nft` binary, for `--nft-exec command`.
    #[arg(long, default_value = "nft")]
    pub nft_binary: String,
}

/// `… to-file …`.
#[derive(Debug, Args)]
pub struct ToFile {
    /// Output file, replaced atomically on every change; `-` prints to standard output.
    #[arg(short = 'o', long, default_value = "-")]
    pub output: String,
}

/// kpng's command line, where an environment variable set to nothing (or spaces: what an
/// empty `$(VAR)` or a blank ConfigMap key gives a DaemonSet's `env`) is not set at all, as
/// kube-proxy's `--hostname-override=` and kpng's `KPNG_NODE_NAME` always were. Before
/// 2026-12-07 `KPNG_BPF_PIN_PATH=` stopped kpng with "a value is required for
/// '--bpf-pin-path'", `KPNG_SOCKET_LB_HOST_NETNS_ONLY=` with "invalid value ''".
pub fn command() -> clap::Command {
    let set_to_nothing = |name: &std::ffi::OsStr| {
        std::env::var_os(name).is_some_and(|v| v.to_string_lossy().trim().is_empty())
    };
    without_empty_env(<Cli as clap::CommandFactory>::command(), &set_to_nothing)
}

/// `cmd` and its subcommands without the environment variables `empty` says are set to
/// nothing.
fn without_empty_env(
    mut cmd: clap::Command,
    empty: &dyn Fn(&std::ffi::OsStr) -> bool,
) -> clap::Command {
    let unset: Vec<clap::Id> = cmd
        .get_arguments()
        .filter(|a| a.get_env().is_some_and(empty))
        .map(|a| a.get_id().clone())
        .collect();
    for id in unset {
        cmd = cmd.mut_arg(id, |a| a.env(None::<&'static str>));
    }
    let subcommands: Vec<String> = cmd
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect();
    for name in subcommands {
        cmd = cmd.mut_subcommand(name, |c| without_empty_env(c, empty));
    }
    cmd
}

/// The environment variable a refused value came from, when the flag it fills is not on the
/// line but its variable is set: the error names the flag (`--socket-lb-host-netns-only`),
/// and the operator looks for it in vain in the DaemonSet's `args`.
fn from_environment(
    error: &clap::Error,
    path: &[clap::Command],
    args: &[String],
) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(
        error.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return None;
    }
    let Some(ContextValue::String(shown)) = error.get(ContextKind::InvalidArg) else {
        return None;
    };
    let long = shown.split([' ', '=']).next()?.trim_start_matches('-');
    let arg = path
        .iter()
        .rev()
        .flat_map(|c| c.get_arguments())
        .find(|a| a.get_long() == Some(long))?;
    let on_line = args.iter().skip(1).any(|a| {
        a.strip_prefix("--")
            .and_then(|a| a.split('=').next())
            .is_some_and(|a| a == long || arg.get_all_aliases().is_some_and(|al| al.contains(&a)))
    });
    let var = arg.get_env()?;
    if on_line || std::env::var_os(var).is_none() {
        return None;
    }
    Some(format!(
        "the value comes from the environment variable {} (the Pod's `env`), not the command \
         line",
        var.to_string_lossy()
    ))
}

/// A line to add to a command-line error: which backends or sources exist where an unknown
/// word stood, where a misplaced flag belongs, or which environment variable gave a bad value.
pub fn hint(error: &clap::Error, args: &[String]) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let root = <Cli as clap::CommandFactory>::command();
    // The deepest subcommand the line names.
    let mut path = vec![root.clone()];
    for arg in args.iter().skip(1) {
        let next = path
            .last()?
            .get_subcommands()
            .find(|c| c.get_name() == arg || c.get_all_aliases().any(|a| a == arg))
            .cloned();
        if let Some(sub) = next {
            path.push(sub);
        }
    }
    if let Some(var) = from_environment(error, &path, args) {
        return Some(var);
    }
    let names = |c: &clap::Command| -> Vec<String> {
        c.get_subcommands()
            .filter(|s| s.get_name() != "help")
            .map(|s| s.get_name().to_string())
            .collect()
    };
    match error.kind() {
        ErrorKind::InvalidSubcommand => {
            // `--masquerade-all true`: a boolean takes its value after `=`, as in kube-proxy.
            if let Some(ContextValue::String(word)) = error.get(ContextKind::InvalidSubcommand)
                && matches!(word.as_str(), "true" | "false")
                && let Some(at) = args.iter().position(|a| a == word)
                && let Some(flag) = at.checked_sub(1).and_then(|i| args.get(i))
                && flag.starts_with("--")
            {
                return Some(format!(
                    "a boolean flag takes its value after '=': {flag}={word} (or {flag} alone \
                     for true)"
                ));
            }
            let here = path.last()?;
            let what = if here.get_name() == "to-local" || here.get_name() == "local" {
                "backends"
            } else {
                "choices"
            };
            Some(format!(
                "the {what} of `{}` are: {}",
                here.get_name(),
                names(here).join(", ")
            ))
        }
        ErrorKind::UnknownArgument => {
            let Some(ContextValue::String(arg)) = error.get(ContextKind::InvalidArg) else {
                return None;
            };
            let flag = arg.split('=').next()?.trim_start_matches('-').to_string();
            fn find(c: &clap::Command, flag: &str, trail: &mut Vec<String>) -> bool {
                if c.get_arguments()
                    .any(|a| !a.is_global_set() && a.get_long() == Some(flag))
                {
                    return true;
                }
                for sub in c.get_subcommands() {
                    trail.push(sub.get_name().to_string());
                    if find(sub, flag, trail) {
                        return true;
                    }
                    trail.pop();
                }
                false
            }
            // The commands the line names, and where the flag is: below the deepest of them
            // first (the flag came too early), else anywhere, preferring the `kube` source when
            // the line names none (kube-proxy's command line is the `kube` source's).
            let named: Vec<String> = path
                .iter()
                .skip(1)
                .map(|c| c.get_name().to_string())
                .collect();
            let mut found = None;
            for depth in (1..path.len()).rev() {
                let mut trail = Vec::new();
                if find(&path[depth], &flag, &mut trail) {
                    let mut full = named[..depth].to_vec();
                    full.extend(trail);
                    found = Some(full);
                    break;
                }
            }
            if found.is_none()
                && let Some(kube) = root.find_subcommand("kube")
            {
                let mut trail = Vec::new();
                if find(kube, &flag, &mut trail) {
                    found = Some(std::iter::once("kube".to_string()).chain(trail).collect());
                }
            }
            if found.is_none() {
                let mut trail = Vec::new();
                if find(&root, &flag, &mut trail) {
                    found = Some(trail);
                }
            }
            let Some(full) = found else {
                // Not a flag anywhere; clap already suggests a close spelling when there is one.
                if error.get(ContextKind::SuggestedArg).is_some() {
                    return None;
                }
                return Some(format!(
                    "--{flag} is neither a kpng flag nor a kube-proxy one: `kpng --help` lists \
                     kpng's (kube-proxy's are accepted too; the ones kpng does not implement warn)"
                ));
            };
            if full.is_empty() {
                return None;
            }
            let mut hint = format!(
                "--{flag} is a flag of `kpng {}`: write it right after `{}`",
                full.join(" … "),
                full.last()?
            );
            if named.is_empty() && full.len() > 1 {
                hint.push_str(
                    " (kube-proxy's command line, without a subcommand, takes the backend from \
                     --proxy-mode and no backend flags)",
                );
            }
            Some(hint)
        }
        _ => None,
    }
}

/// The usage line of the subcommand a [`hint`] says a misplaced flag belongs to (`--{flag} is
/// a flag of `kpng A … B``): what the user should have typed, in place of clap's usage of
/// where the parse stopped. `None` for any other hint.
pub fn usage_for_hint(hint: &str) -> Option<String> {
    let (_, rest) = hint.split_once(" is a flag of `kpng ")?;
    let (path, _) = rest.split_once('`')?;
    let mut root = command();
    root.build();
    let mut here = &mut root;
    for name in path.split(" … ") {
        here = here.find_subcommand_mut(name)?;
    }
    Some(here.render_usage().to_string().trim_end().to_string())
}

/// `IP:port`, or a bare IP given `port` (kube-proxy's `AppendPortIfNeeded`, which its
/// `--healthz-bind-address` and `--metrics-bind-address` go through: its help says "set to
/// 0.0.0.0 for all IPv4 interfaces").
pub fn listen_address(s: &str, port: u16) -> Result<SocketAddr, String> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(addr);
    }
    s.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>()
        .map(|ip| SocketAddr::new(ip, port))
        .map_err(|_| format!("{s:?} is not IP:port or an IP"))
}

/// A boolean flag's value as kube-proxy's (pflag's, Go's `strconv.ParseBool`) reads it:
/// `1`, `t`, `T`, `TRUE`, `true`, `True` and their `0`/`f`/`false` counterparts, so that a
/// DaemonSet written for kube-proxy (`--masquerade-all=1`) parses unchanged.
pub fn parse_go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!(
            "{s:?} is not a boolean (true, false, 1, 0, t, f, TRUE, FALSE, True, False)"
        )),
    }
}

/// `--metrics-bind-address`: empty (no server), an IP, or IP:port, as kube-proxy's flag
/// (`IPPortVar`) and the file's `metricsBindAddress` take it; a host name or a missing IP
/// (`:10249`) is refused here as there, so `--write-config-to` never writes one.
fn parse_metrics_bind_address(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Ok(String::new());
    }
    listen_address(s.trim(), crate::config::METRICS_PORT)?;
    Ok(s.trim().to_string())
}

/// `--healthz-bind-address`: empty (no health server, as kube-proxy's "Set empty to
/// disable"), an IP or IP:port.
fn parse_healthz_bind_address(s: &str) -> Result<Option<SocketAddr>, String> {
    if s.trim().is_empty() {
        return Ok(None);
    }
    listen_address(s.trim(), crate::config::HEALTHZ_PORT).map(Some)
}

/// What `--proxy-mode` said. kube-proxy's `ipvs` is one of its valid modes that kpng does not
/// run: it parses, so that `--proxy-mode=ipvs --cleanup` (an operator leaving ipvs) cleans up
/// as kube-proxy's would, and is refused only where it would choose the backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProxyModeArg {
    /// A mode kpng runs.
    Runs(BackendKind),
    /// A mode kube-proxy accepts and kpng does not run, with why and what to use instead.
    Refused(String),
}

/// `--proxy-mode`: kube-proxy's mode names ([`BackendKind::from_mode`]), and kpng's backend
/// words (`nft`) and their `to-local` aliases (`winkernel`) too, so that every name `to-local`
/// takes works here. A typo stays an error here, as in kube-proxy's validation.
fn parse_proxy_mode(s: &str) -> Result<ProxyModeArg, String> {
    match BackendKind::from_mode(s) {
        Ok(kind) => Ok(ProxyModeArg::Runs(kind)),
        Err(e) => match backend_word(s) {
            Some(kind) => Ok(ProxyModeArg::Runs(kind)),
            None if s == "ipvs" => Ok(ProxyModeArg::Refused(e)),
            None => Err(e),
        },
    }
}

/// The backend `to-local WORD` names: its word or one of its aliases (`hns`, `winkernel`).
fn backend_word(word: &str) -> Option<BackendKind> {
    let to_local =
        <LocalBackend as clap::Subcommand>::augment_subcommands(clap::Command::new("to-local"));
    let sub = to_local
        .get_subcommands()
        .find(|c| c.get_name() == word || c.get_all_aliases().any(|a| a == word))?;
    BackendKind::ALL
        .into_iter()
        .find(|k| k.word() == sub.get_name())
}

impl LocalBackend {
    /// The backend of this kind with every flag at its default, as `to-local <word>` alone
    /// parses (kube-proxy's command line names only a mode).
    pub fn defaults(kind: BackendKind, dry_run: bool) -> anyhow::Result<LocalBackend> {
        use clap::FromArgMatches;
        let command = <LocalBackend as clap::Subcommand>::augment_subcommands(
            clap::Command::new("to-local").multicall(false),
        );
        let mut line = vec!["to-local", kind.word()];
        if dry_run {
            line.push("--dry-run");
        }
        let matches = command.try_get_matches_from(line)?;
        Ok(LocalBackend::from_arg_matches(&matches)?)
    }
}

/// Parses Go's duration syntax as kube-proxy's flags do (`1s`, `500ms`, `1m0s`, `1.5h`, `0`),
/// and humantime's spelled-out forms (`1 hour`) as kpng always has.
/// A CIDR flag (`--cluster-cidr`, `--service-cidr`): an IPv4-mapped IPv6 CIDR is the IPv4
/// one (prefix − 96), as kube-proxy's Go parser reads it; below /96 it is refused (clap names
/// the flag).
pub(crate) fn parse_cidr_flag(s: &str) -> Result<ipnet::IpNet, String> {
    let net: ipnet::IpNet = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a CIDR"))?;
    kpng_model::ip::unmap_cidr(net, s).map_err(|e| e.to_string())
}

/// `--conntrack-mark-mask`: `0x…` or decimal, with room for one Service port's two affinity
/// ids (2 bits).
fn parse_mark_mask(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => t.parse::<u32>(),
    };
    let mask =
        parsed.map_err(|e| format!("{s:?} is not a 32-bit mark mask (0x… or decimal): {e}"))?;
    if mask.count_ones() < 2 {
        return Err(format!(
            "{mask:#010x} has {} bit(s); affinity needs at least 2 (the default is 0xff00f000)",
            mask.count_ones()
        ));
    }
    Ok(mask)
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::config::parse_go_duration(s)
        .or_else(|go_error| humantime::parse_duration(s).map_err(|_| go_error))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conntrack_mark_mask_is_hex_or_decimal_with_two_bits_at_least() {
        let cases: [(&str, Result<u32, &str>); 6] = [
            ("0xff00f000", Ok(0xff00_f000)),
            ("0X3", Ok(3)),
            ("12288", Ok(0x3000)),
            ("0x1000", Err("has 1 bit(s)")),
            ("0", Err("has 0 bit(s)")),
            ("0xfffffffff", Err("not a 32-bit mark mask")),
        ];
        for (input, want) in cases {
            match (parse_mark_mask(input), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{input}"),
                (Err(e), Err(part)) => assert!(e.contains(part), "{input}: {e}"),
                (got, want) => panic!("{input}: {got:?}, expected {want:?}"),
            }
        }
        let cli =
            Cli::try_parse_from(["kpng", "--conntrack-mark-mask=0x00f00000"]).expect("parses");
        assert_eq!(cli.global.conntrack_mark_mask, 0x00f0_0000);
        let cli = Cli::try_parse_from(["kpng"]).expect("parses");
        assert_eq!(cli.global.conntrack_mark_mask, 0xff00_f000, "the default");
    }

    #[test]
    fn global_flags_anywhere() {
        let cli = Cli::try_parse_from([
            "kpng",
            "file",
            "--input",
            "x.yaml",
            "--node-name",
            "n1",
            "to-file",
            "--output",
            "-",
            "--masquerade-all",
            "--min-sync-period",
            "0",
        ])
        .expect("parses");
        assert_eq!(cli.global.node_name.as_deref(), Some("n1"));
        assert!(cli.global.masquerade_all);
        assert_eq!(cli.global.min_sync_period, Duration::ZERO);
        let Command::File(f) = cli.command.expect("a subcommand") else {
            panic!("file source")
        };
        let Sink::ToFile(t) = f.sink else {
            panic!("to-file sink")
        };
        assert_eq!(t.output, "-");
    }

    #[test]
    fn hostname_override_alias() {
        let cli = Cli::try_parse_from([
            "kpng",
            "--hostname-override",
            "n2",
            "file",
            "--input",
            "x",
            "to-file",
        ])
        .expect("parses");
        assert_eq!(cli.global.node_name.as_deref(), Some("n2"));
    }

    #[test]
    fn durations_in_go_and_humantime_syntax() {
        for (text, want) in [
            ("0", Some(Duration::ZERO)),
            ("1m0s", Some(Duration::from_secs(60))),
            ("1.5s", Some(Duration::from_millis(1500))),
            ("500ms", Some(Duration::from_millis(500))),
            ("1 hour", Some(Duration::from_secs(3600))),
            ("30", None),
            ("-1s", None),
        ] {
            assert_eq!(parse_duration(text).ok(), want, "{text}");
        }
    }

    #[test]
    fn service_node_port_range_flag() {
        let parse = |extra: &[&str]| {
            let mut args = vec!["kpng"];
            args.extend_from_slice(extra);
            args.extend(["file", "--input", "x.yaml", "to-local", "nft"]);
            Cli::try_parse_from(args)
        };
        let range = |cli: Cli| {
            cli.global
                .node_port_range(InputKind::Manifests)
                .map(|r| r.to_string())
                .unwrap_or_default()
        };
        let default = parse(&[]).expect("parses");
        assert_eq!(
            default.global.node_port_range(InputKind::ApiServer),
            None,
            "the API server checked its own node ports"
        );
        assert_eq!(range(default), "30000-32767");
        for (given, want) in [("20000-22767", "20000-22767"), ("30000+100", "30000-30100")] {
            let cli = parse(&["--service-node-port-range", given]).expect("parses");
            assert_eq!(
                cli.global
                    .node_port_range(InputKind::ApiServer)
                    .map(|r| r.to_string()),
                Some(want.to_string()),
                "{given}: given, it applies to the API server's objects too"
            );
            assert_eq!(range(cli), want, "{given}");
        }
        let err = parse(&["--service-node-port-range", "30000..32767"])
            .expect_err("refused")
            .to_string();
        assert!(
            err.contains("--service-node-port-range")
                && err.contains("\"30000..32767\" is not a port range"),
            "{err}"
        );
    }

    #[test]
    fn kube_source_flags() {
        let cli = Cli::try_parse_from([
            "kpng",
            "kube",
            "--kubeconfig",
            "/etc/kpng/kubeconfig",
            "--kube-api-qps",
            "20",
            "--service-proxy-name",
            "kpng",
            "to-local",
            "nft",
            "--dry-run",
        ])
        .expect("parses");
        assert_eq!(cli.global.service_proxy_name.as_deref(), Some("kpng"));
        assert_eq!(
            cli.global.kubeconfig.as_deref(),
            Some(std::path::Path::new("/etc/kpng/kubeconfig"))
        );
        assert_eq!(
            (
                cli.global.master,
                cli.global.kube_api_qps,
                cli.global.kube_api_burst
            ),
            (None, 20.0, 10)
        );
        let Command::Kube(k) = cli.command.expect("a subcommand") else {
            panic!("kube source")
        };
        assert!(matches!(k.sink, Sink::ToLocal(_)));
    }

    #[test]
    fn kube_proxys_command_line_has_no_subcommand() {
        let cli = Cli::try_parse_from([
            "kpng",
            "--config=/var/lib/kube-proxy/config.conf",
            "--hostname-override=node1",
            "--proxy-mode=nftables",
            "--masquerade-all=true",
            "--conntrack-tcp-be-liberal",
            "--kubeconfig=/k",
            "-v=4",
        ])
        .expect("parses");
        assert!(cli.command.is_none());
        assert_eq!(
            cli.global.proxy_mode_arg,
            Some(ProxyModeArg::Runs(BackendKind::Nft))
        );
        assert!(cli.global.masquerade_all && cli.global.conntrack_tcp_be_liberal);
        assert_eq!(cli.global.verbosity, Some(4));
        assert!(!cli.global.cleanup && !cli.global.init_only);
        let cli = Cli::try_parse_from(["kpng", "--cleanup", "--init-only=false"]).expect("parses");
        assert!(cli.global.cleanup && !cli.global.init_only);
    }

    #[test]
    fn kube_proxys_boolean_flags_take_true_and_false() {
        // pflag booleans: `--flag`, `--flag=true`, `--flag=false` (Calico's start.ps1 writes
        // `--enable-dsr=true`).
        for flag in [
            "enable-dsr",
            "forward-healthcheck-vip",
            "windows-service",
            "cleanup",
            "init-only",
            "masquerade-all",
            "conntrack-tcp-be-liberal",
            "iptables-localhost-nodeports",
        ] {
            for (line, want) in [
                (format!("--{flag}=true"), true),
                (format!("--{flag}=false"), false),
                (format!("--{flag}"), true),
            ] {
                let matches = <Cli as clap::CommandFactory>::command()
                    .try_get_matches_from(["kpng", line.as_str()])
                    .unwrap_or_else(|e| panic!("{line}: {e}"));
                let id = flag.replace('-', "_");
                assert_eq!(matches.get_one::<bool>(&id), Some(&want), "{line}");
            }
        }
        let cli = Cli::try_parse_from(["kpng", "--enable-dsr=true"]).expect("parses");
        assert!(cli.global.enable_dsr);
        // Every boolean flag of the root takes a value: one that is a bare switch (SetTrue)
        // refuses `=true`. Only kpng's own --dry-run and --kpng-only are switches.
        let root = <Cli as clap::CommandFactory>::command();
        let switches: Vec<&str> = root
            .get_arguments()
            .filter(|a| matches!(a.get_action(), clap::ArgAction::SetTrue))
            .map(|a| a.get_id().as_str())
            .collect();
        assert_eq!(switches, ["dry_run", "kpng_only"]);
    }

    /// pflag's booleans take Go's `strconv.ParseBool` spellings; anything else is refused,
    /// naming the flag.
    #[test]
    fn kube_proxys_boolean_flags_take_go_spellings() {
        for (value, want) in [
            ("1", Some(true)),
            ("t", Some(true)),
            ("T", Some(true)),
            ("TRUE", Some(true)),
            ("True", Some(true)),
            ("0", Some(false)),
            ("f", Some(false)),
            ("F", Some(false)),
            ("FALSE", Some(false)),
            ("False", Some(false)),
            ("yes", None),
            ("tRuE", None),
        ] {
            for flag in [
                "masquerade-all",
                "cleanup",
                "init-only",
                "conntrack-tcp-be-liberal",
                "iptables-localhost-nodeports",
                "enable-dsr",
                "forward-healthcheck-vip",
                "windows-service",
            ] {
                let line = format!("--{flag}={value}");
                let got = <Cli as clap::CommandFactory>::command()
                    .try_get_matches_from(["kpng", line.as_str()]);
                match (got, want) {
                    (Ok(m), Some(want)) => assert_eq!(
                        m.get_one::<bool>(&flag.replace('-', "_")),
                        Some(&want),
                        "{line}"
                    ),
                    (Err(e), None) => assert!(e.to_string().contains(&format!("--{flag}")), "{e}"),
                    (got, _) => panic!("{line}: {got:?}"),
                }
            }
        }
    }

    /// A scalar flag given twice keeps its last value, as pflag's; a pflag StringSlice
    /// (`--nodeport-addresses`) appends; kube-proxy's string flags that kpng reads as lists
    /// (`--cluster-cidr`, `--bind-address`) keep the last occurrence whole.
    #[test]
    fn a_repeated_flag_keeps_the_last_value_as_in_pflag() {
        let cli = Cli::try_parse_from([
            "kpng",
            "--v=2",
            "--v=4",
            "--hostname-override=a",
            "--hostname-override=b",
            "--proxy-mode=iptables",
            "--proxy-mode=nftables",
            "--kubeconfig=/a",
            "--kubeconfig=/b",
            "--config=/a",
            "--config=/b",
            "--masquerade-all",
            "--masquerade-all=false",
            "--cluster-cidr=10.1.0.0/16,fd00:1::/64",
            "--cluster-cidr=10.2.0.0/16",
            "--bind-address=10.0.0.1",
            "--bind-address=10.0.0.2,fd00::2",
            "--nodeport-addresses=10.0.0.0/8",
            "--nodeport-addresses=fd00::/8",
            "--iptables-sync-period=10s",
            "--iptables-sync-period=20s",
        ])
        .expect("repeats parse");
        let g = &cli.global;
        assert_eq!(g.verbosity, Some(4));
        assert_eq!(g.node_name.as_deref(), Some("b"));
        assert_eq!(g.proxy_mode_arg, Some(ProxyModeArg::Runs(BackendKind::Nft)));
        assert_eq!(g.kubeconfig.as_deref(), Some(std::path::Path::new("/b")));
        assert_eq!(g.config.as_deref(), Some(std::path::Path::new("/b")));
        assert!(!g.masquerade_all);
        let cidrs: Vec<String> = g.cluster_cidr.iter().map(ToString::to_string).collect();
        assert_eq!(cidrs, ["10.2.0.0/16"]);
        let ips: Vec<String> = g.node_ip.iter().map(ToString::to_string).collect();
        assert_eq!(ips, ["10.0.0.2", "fd00::2"]);
        assert_eq!(g.nodeport_addresses, ["10.0.0.0/8", "fd00::/8"]);
        assert_eq!(g.sync_period, Duration::from_secs(20));
    }

    #[test]
    fn proxy_mode_takes_mode_names_and_backend_words() {
        // (mode, the backend it runs, whether it parses at all)
        let cases: [(&str, Option<BackendKind>, bool); 11] = [
            (
                "",
                Some(crate::backends::Platform::HOST.default_backend()),
                true,
            ),
            ("kernelspace", Some(BackendKind::Hns), true),
            ("winkernel", Some(BackendKind::Hns), true),
            ("hns", Some(BackendKind::Hns), true),
            ("ebpf", Some(BackendKind::Ebpf), true),
            ("iptables", Some(BackendKind::Iptables), true),
            ("nftables", Some(BackendKind::Nft), true),
            ("nft", Some(BackendKind::Nft), true),
            ("userspace", Some(BackendKind::Userspace), true),
            ("ipvs", None, true),
            ("nf", None, false),
        ];
        for (mode, runs, parses) in cases {
            let got = parse_proxy_mode(mode);
            assert_eq!(got.is_ok(), parses, "{mode:?}");
            let kind = match got {
                Ok(ProxyModeArg::Runs(kind)) => Some(kind),
                _ => None,
            };
            assert_eq!(kind, runs, "{mode:?}");
        }
    }

    #[test]
    fn windows_priority_classes_take_windows_spellings() {
        for spelling in [
            "ABOVE_NORMAL",
            "above_normal",
            "ABOVE_NORMAL_PRIORITY_CLASS",
            "Above_Normal_Priority_Class",
        ] {
            let cli = Cli::try_parse_from(["kpng", "--windows-priority-class", spelling])
                .unwrap_or_else(|e| panic!("{spelling}: {e}"));
            assert_eq!(
                cli.global.windows_priority_class,
                Some(WindowsPriorityClass::AboveNormal),
                "{spelling}"
            );
        }
        let cli = Cli::try_parse_from(["kpng", "--windows-priority-class=idle_priority_class"])
            .expect("parses");
        assert_eq!(
            cli.global.windows_priority_class,
            Some(WindowsPriorityClass::Idle)
        );
        assert!(Cli::try_parse_from(["kpng", "--windows-priority-class", "LOUD"]).is_err());
    }

    #[test]
    fn every_backend_has_defaults() {
        for kind in BackendKind::ALL {
            let backend = LocalBackend::defaults(kind, false).expect("defaults");
            assert_eq!(BackendKind::of(&backend), kind);
            assert!(!BackendKind::dry_run(&backend));
            let backend = LocalBackend::defaults(kind, true).expect("dry run");
            assert!(BackendKind::dry_run(&backend), "{kind:?}");
        }
    }

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    /// `--min-sync-period`'s help says what starts the window: a sync that wrote, not any
    /// sync (an idle periodic sync holds nothing back since the runner counts from the last
    /// sync that wrote; the help said "between two syncs").
    #[test]
    fn min_sync_period_help_says_a_sync_that_wrote_starts_the_window() {
        use clap::CommandFactory;
        let command = Cli::command();
        let help = command
            .get_arguments()
            .find(|a| a.get_id() == "min_sync_period")
            .and_then(|a| a.get_help())
            .map(ToString::to_string)
            .expect("--min-sync-period has help");
        assert!(!help.contains("between two syncs"), "{help}");
        assert!(help.contains("a sync that wrote"), "{help}");
        assert!(help.contains("changed nothing"), "{help}");
    }
}

#[cfg(test)]
mod userspace_tests {
    use super::*;

    #[test]
    fn to_local_userspace() {
        let cli = Cli::try_parse_from([
            "kpng",
            "file",
            "--input",
            "x.yaml",
            "to-local",
            "userspace",
            "--udp-timeout",
            "250ms",
        ])
        .expect("parses");
        let Command::File(f) = cli.command.expect("a subcommand") else {
            panic!("file source")
        };
        let Sink::ToLocal(ToLocal {
            backend: LocalBackend::Userspace(u),
        }) = f.sink
        else {
            panic!("userspace")
        };
        assert_eq!(u.udp_timeout, Duration::from_millis(250));
        assert_eq!(u.connect_timeout, Duration::from_secs(2));
        assert_eq!(u.drain_on_exit, Duration::from_secs(1));
        assert!(!u.dry_run);
    }

    #[test]
    fn a_grpc_client_node_runs_the_userspace_backend_too() {
        let cli = Cli::try_parse_from([
            "kpng",
            "local",
            "--api",
            "unix:///run/kpng.sock",
            "userspace",
            "--dry-run",
        ])
        .expect("parses");
        let Command::Local(l) = cli.command.expect("a subcommand") else {
            panic!("local")
        };
        let LocalBackend::Userspace(u) = l.backend else {
            panic!("userspace")
        };
        assert!(u.dry_run);
    }
}

#[cfg(test)]
mod nft_tests {
    use super::*;

    /// `::ffff:a.b.c.d/N` is the IPv4 CIDR `/N-96` (kube-proxy's Go parser reads it so);
    /// below /96 the flag is refused, naming it.
    #[test]
    fn ipv4_mapped_cidr_flags_are_ipv4() {
        let parse = |args: &[&str]| {
            let mut all = vec!["kpng", "file", "--input", "x.yaml", "to-local", "nft"];
            all.extend_from_slice(args);
            Cli::try_parse_from(all)
        };
        let cli = parse(&[
            "--cluster-cidr",
            "::ffff:10.244.0.0/112,fd00:244::/32",
            "--service-cidr",
            "::ffff:10.96.0.0/108",
            "--nodeport-addresses",
            "::ffff:192.168.100.0/120",
        ])
        .expect("parses");
        let text = |nets: &[ipnet::IpNet]| nets.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert_eq!(
            text(&cli.global.cluster_cidr),
            ["10.244.0.0/16", "fd00:244::/32"]
        );
        assert_eq!(text(&cli.global.service_cidr), ["10.96.0.0/12"]);
        let Ok(kpng_backend::settings::NodePortAddresses::Cidrs(cidrs)) =
            crate::backends::BackendKind::Nft.nodeport_addresses(&cli.global)
        else {
            panic!("CIDRs")
        };
        assert_eq!(text(&cidrs), ["192.168.100.0/24"]);
        for flag in ["--cluster-cidr", "--service-cidr"] {
            let Err(e) = parse(&[flag, "::ffff:10.0.0.0/64"]) else {
                panic!("{flag} accepted a mapped /64")
            };
            let e = e.to_string();
            assert!(
                e.contains(flag) && e.contains("IPv4-mapped IPv6 CIDR with prefix /64"),
                "{e}"
            );
        }
        let cli = parse(&["--nodeport-addresses", "::ffff:10.0.0.0/64"]).expect("parses");
        let e = crate::backends::BackendKind::Nft
            .nodeport_addresses(&cli.global)
            .expect_err("a mapped /64");
        assert!(
            e.to_string()
                .starts_with("--nodeport-addresses: \"::ffff:10.0.0.0/64\" is an IPv4-mapped"),
            "{e}"
        );
    }

    #[test]
    fn to_local_nft() {
        let cli = Cli::try_parse_from([
            "kpng",
            "file",
            "--input",
            "x.yaml",
            "to-local",
            "nft",
            "--dry-run",
            "--cluster-cidr",
            "10.244.0.0/16,fd00:244::/32",
        ])
        .expect("parses");
        assert_eq!(cli.global.cluster_cidr.len(), 2);
        let Command::File(f) = cli.command.expect("a subcommand") else {
            panic!("file source")
        };
        let Sink::ToLocal(ToLocal {
            backend: LocalBackend::Nft(n),
        }) = f.sink
        else {
            panic!("nft")
        };
        assert!(n.dry_run);
    }

    #[test]
    fn to_local_iptables() {
        for (args, mode, localhost) in [
            (&["iptables"][..], "auto", true),
            (
                &["iptables", "--iptables-mode", "legacy"][..],
                "legacy",
                true,
            ),
            (
                &[
                    "iptables",
                    "--iptables-mode=nft",
                    "--iptables-localhost-nodeports=false",
                ][..],
                "nft",
                false,
            ),
            (
                &["iptables", "--iptables-localhost-nodeports"][..],
                "auto",
                true,
            ),
        ] {
            let mut line = vec!["kpng", "file", "--input", "x.yaml", "to-local"];
            line.extend_from_slice(args);
            let cli = Cli::try_parse_from(&line).expect("parses");
            assert_eq!(
                cli.global.iptables_localhost_nodeports, localhost,
                "{args:?}"
            );
            let Command::File(f) = cli.command.expect("a subcommand") else {
                panic!("file source")
            };
            let Sink::ToLocal(ToLocal {
                backend: LocalBackend::Iptables(a),
            }) = f.sink
            else {
                panic!("iptables")
            };
            assert_eq!(
                a.iptables_mode
                    .to_possible_value()
                    .map(|v| v.get_name().to_string())
                    .as_deref(),
                Some(mode),
                "{args:?}"
            );
            assert!(!a.dry_run);
        }
        assert!(
            Cli::try_parse_from([
                "kpng",
                "file",
                "--input",
                "x",
                "to-local",
                "iptables",
                "--iptables-mode",
                "ipvs"
            ])
            .is_err()
        );
    }
}

#[cfg(test)]
mod api_tests {
    use super::*;

    #[test]
    fn split_mode_command_lines() {
        let cli = Cli::try_parse_from([
            "kpng",
            "file",
            "--input",
            "x.yaml",
            "to-api",
            "--listen",
            "unix:///run/kpng.sock",
        ])
        .expect("brain");
        let Some(Command::File(FileSource {
            sink: Sink::ToApi(t),
            ..
        })) = cli.command
        else {
            panic!("to-api")
        };
        assert_eq!(t.listen, "unix:///run/kpng.sock".parse().expect("addr"));

        let cli = Cli::try_parse_from([
            "kpng",
            "local",
            "--api",
            "unix:///run/kpng.sock",
            "nft",
            "--dry-run",
            "--node-name",
            "n1",
        ])
        .expect("local");
        let Command::Local(l) = cli.command.expect("a subcommand") else {
            panic!("local")
        };
        let LocalBackend::Nft(n) = l.backend else {
            panic!("nft")
        };
        assert!(n.dry_run);
        assert_eq!(cli.global.node_name.as_deref(), Some("n1"));

        let cli = Cli::try_parse_from(["kpng", "api", "to-file", "--output", "-"]).expect("api");
        let Command::Api(a) = cli.command.expect("a subcommand") else {
            panic!("api")
        };
        assert_eq!(a.brain.api, "127.0.0.1:12090".parse().expect("addr"));
        assert!(matches!(a.sink, NodeSink::ToFile(_)));
        assert!(
            Cli::try_parse_from(["kpng", "api", "to-api"]).is_err(),
            "no relay"
        );
    }
}
