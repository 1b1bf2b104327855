//! Every backend that programs this node, in one closed list: how to build each from the
//! flags, where its Service health checks listen, whether it cleans stale UDP conntrack
//! entries, and how to remove what it leaves on the node.
//!
//! Adding a backend is one variant of [`BackendKind`] and one arm in each `match` below; the
//! compiler lists every place that must decide something for it. Switching backends needs no
//! N×N list either: the one that starts removes every leftover but its own
//! ([`crate::leftovers`], which also knows kube-proxy's modes).

use anyhow::Context;
use clap::ValueEnum;
use kpng_backend::Backend;
use kpng_backend::settings::{DetectLocal, Masquerade, NodePortAddresses};
use kpng_runner::runner::HealthCheckAddresses;

use crate::cli::{DetectLocalMode, GlobalFlags, LocalBackend};

/// The system whose kube-proxy defaults apply. kube-proxy's `platformApplyDefaults` makes an
/// empty mode `iptables` on Linux and `kernelspace` on Windows, so a kpng.exe given kube-proxy's
/// Windows command line (no `--proxy-mode`) must run the HNS backend, not iptables. A value,
/// not `cfg!` at each use, so that both systems' behaviour is tested on either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    /// Linux, and every system that is not Windows: kube-proxy's Linux defaults.
    Linux,
    /// Windows: kube-proxy's Windows defaults (kernelspace).
    Windows,
}

impl Platform {
    /// The system this binary was built for.
    pub const HOST: Platform = if cfg!(windows) {
        Platform::Windows
    } else {
        Platform::Linux
    };

    /// The backend of an empty (or absent) mode on this system, as kube-proxy's default.
    pub fn default_backend(self) -> BackendKind {
        match self {
            Platform::Linux => BackendKind::Iptables,
            Platform::Windows => BackendKind::Hns,
        }
    }

    /// How messages name that default: "kube-proxy's Linux default" / "… Windows default".
    pub fn default_name(self) -> &'static str {
        match self {
            Platform::Linux => "kube-proxy's Linux default",
            Platform::Windows => "kube-proxy's Windows default",
        }
    }
}

/// A backend that programs this node (`to-local <kind>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// nftables: kube-proxy's nftables mode with a constant-size ruleset.
    Nft,
    /// iptables: kube-proxy's iptables mode (legacy or nft variant).
    Iptables,
    /// A userspace TCP/UDP proxy, VIP traffic captured by a small nftables table.
    Userspace,
    /// eBPF socket-level load balancing for local sockets, the nftables ruleset beside it.
    Ebpf,
    /// Windows: load balancers in the Host Networking Service (kube-proxy's kernelspace).
    Hns,
}

impl BackendKind {
    /// Every kind (a test checks it against the variants `clap` derives, so that a new one is
    /// not forgotten here: `kpng cleanup` and the instance lock read this list).
    pub const ALL: [BackendKind; 5] = [
        BackendKind::Nft,
        BackendKind::Iptables,
        BackendKind::Userspace,
        BackendKind::Ebpf,
        BackendKind::Hns,
    ];

    /// The kind of a parsed `to-local` subcommand.
    pub fn of(backend: &LocalBackend) -> BackendKind {
        match backend {
            LocalBackend::Nft(_) => BackendKind::Nft,
            LocalBackend::Iptables(_) => BackendKind::Iptables,
            LocalBackend::Userspace(_) => BackendKind::Userspace,
            LocalBackend::Ebpf(_) => BackendKind::Ebpf,
            LocalBackend::Hns(_) => BackendKind::Hns,
        }
    }

    /// The command word (`nft`, `iptables`, `userspace`).
    pub fn word(self) -> &'static str {
        match self {
            BackendKind::Nft => "nft",
            BackendKind::Iptables => "iptables",
            BackendKind::Userspace => "userspace",
            BackendKind::Ebpf => "ebpf",
            BackendKind::Hns => "hns",
        }
    }

    /// The backend a kube-proxy `mode` (`--proxy-mode`, the configuration file's `mode`) asks
    /// for on this system ([`Platform::HOST`]); see [`BackendKind::from_mode_on`].
    pub fn from_mode(mode: &str) -> Result<BackendKind, String> {
        BackendKind::from_mode_on(mode, Platform::HOST)
    }

    /// The backend a kube-proxy `mode` asks for on `platform`, so that kube-proxy's own command
    /// line and configuration choose kpng's backend: `""` is kube-proxy's default of that
    /// system (its `platformApplyDefaults`: iptables on Linux, kernelspace on Windows),
    /// `iptables` → iptables, `nftables` → nftables, `kernelspace` → the HNS backend.
    /// kube-proxy's other modes are errors that say what to use instead; `userspace` (removed
    /// from kube-proxy in 1.26) is kpng's proxy. The platform is a parameter so that both
    /// systems' defaults are tested on either.
    pub fn from_mode_on(mode: &str, platform: Platform) -> Result<BackendKind, String> {
        // Every kind's own name ([`BackendKind::mode`]): what `--write-config-to` writes is
        // read back, for a new backend too.
        if let Some(kind) = BackendKind::ALL.into_iter().find(|k| k.mode() == mode) {
            return Ok(kind);
        }
        match mode {
            "" => Ok(platform.default_backend()),
            "ipvs" => Err(
                "\"ipvs\" is not supported: kpng runs mode \"nftables\" (recommended) or \
                 \"iptables\". Set one of them; kpng removes the ipvs mode's kube-ipvs0 interface \
                 and KUBE-* chains once its own rules are in place (docs/deploy.md, \"Replace \
                 kube-proxy's image\"); the ipvs section does not carry over"
                    .into(),
            ),
            other => {
                let ours: Vec<&str> = BackendKind::ALL.iter().map(|k| k.mode()).collect();
                let theirs = match platform {
                    Platform::Linux => {
                        "kube-proxy's Linux modes are \"iptables\" (the default, also \"\"), \
                         \"nftables\" and \"ipvs\""
                    }
                    Platform::Windows => {
                        "kube-proxy's Windows mode is \"kernelspace\" (the default, also \"\")"
                    }
                };
                Err(format!(
                    "unknown proxy mode {other:?}: {theirs}; kpng runs {}",
                    ours.join(", ")
                ))
            }
        }
    }

    /// kube-proxy's name of this mode (`nftables`, `iptables`; kpng's `userspace`), as written
    /// in a configuration file.
    pub fn mode(self) -> &'static str {
        match self {
            BackendKind::Nft => "nftables",
            BackendKind::Iptables => "iptables",
            BackendKind::Userspace => "userspace",
            BackendKind::Ebpf => "ebpf",
            BackendKind::Hns => "kernelspace",
        }
    }

    /// Where node ports are served when `--nodeport-addresses` is unset: kube-proxy's default
    /// for the mode (nftables: the node's IPs; iptables: every local address).
    fn default_nodeport_addresses(self) -> NodePortAddresses {
        match self {
            BackendKind::Nft | BackendKind::Userspace | BackendKind::Ebpf => {
                NodePortAddresses::Primary
            }
            BackendKind::Iptables | BackendKind::Hns => NodePortAddresses::AllLocal,
        }
    }

    /// `--nodeport-addresses` as this backend reads it.
    pub fn nodeport_addresses(self, flags: &GlobalFlags) -> anyhow::Result<NodePortAddresses> {
        if flags.nodeport_addresses.is_empty() {
            return Ok(self.default_nodeport_addresses());
        }
        // Checked at start (`config::apply`), the file's and the command line's alike.
        if let Some(problem) = crate::config::nodeport_addresses_problem(&flags.nodeport_addresses)
        {
            anyhow::bail!("--nodeport-addresses: {problem}");
        }
        if flags
            .nodeport_addresses
            .iter()
            .all(|a| a.trim() == "primary")
        {
            return Ok(NodePortAddresses::Primary);
        }
        let cidrs = flags
            .nodeport_addresses
            .iter()
            .map(|a| {
                let net = a.parse::<ipnet::IpNet>().with_context(|| {
                    format!("--nodeport-addresses: {a:?} is not a CIDR or `primary`")
                })?;
                kpng_model::ip::unmap_cidr(net, a)
                    .map_err(|e| anyhow::anyhow!("--nodeport-addresses: {e}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(NodePortAddresses::Cidrs(cidrs))
    }

    /// Where the Service health checks (`healthCheckNodePort`) listen: where the node ports
    /// are, as kube-proxy's health server follows `--nodeport-addresses`: the node IPs when
    /// node ports are served on those only, the node's addresses inside the CIDRs when given
    /// (the runner reads them as the backends do), else every address. The Windows backend
    /// does not read `--nodeport-addresses` (nor can the runner read Windows' addresses):
    /// every address, as before.
    pub fn health_check_addresses(self, flags: &GlobalFlags) -> HealthCheckAddresses {
        self.health_check_addresses_of(self.nodeport_addresses(flags).ok().as_ref())
    }

    /// [`BackendKind::health_check_addresses`] from `--nodeport-addresses` as this backend
    /// reads it (`None`: unreadable): one rule for the servers and for `kpng trace`.
    pub fn health_check_addresses_of(
        self,
        nodeport: Option<&NodePortAddresses>,
    ) -> HealthCheckAddresses {
        if self == BackendKind::Hns {
            return HealthCheckAddresses::All;
        }
        match nodeport {
            Some(NodePortAddresses::Primary) => HealthCheckAddresses::NodeIps,
            Some(NodePortAddresses::Cidrs(cidrs)) => HealthCheckAddresses::Cidrs(cidrs.clone()),
            Some(NodePortAddresses::AllLocal) | None => HealthCheckAddresses::All,
        }
    }

    /// Whether this backend, once running for real (not a dry run, not simulated), takes the
    /// node's Service proxying over from every Linux proxy: after its first sync every other
    /// proxy's rules on the node (other kpng backends', kube-proxy's of any mode, eBPF
    /// programs) are removed, all but [`Built::own`], and it gets kube-proxy's conntrack
    /// sysctls. A decision per backend, not a default: a backend that answers `true` without
    /// listing its own leftovers deletes its own neighbours, one that answers `false` runs
    /// beside whatever else proxies the node. An exhaustive `match`, so that a new variant
    /// must decide.
    pub fn takes_over_node_proxying(self) -> bool {
        match self {
            BackendKind::Nft
            | BackendKind::Iptables
            | BackendKind::Userspace
            | BackendKind::Ebpf => true,
            // Windows: kube-proxy's Linux leftovers and sysctls are not its own.
            BackendKind::Hns => false,
        }
    }

    /// Whether this backend, as configured, changes the kernel's data plane so that stale UDP
    /// conntrack entries must go after syncs.
    pub fn cleans_conntrack(backend: &LocalBackend) -> bool {
        match backend {
            LocalBackend::Nft(args) => !args.dry_run,
            LocalBackend::Iptables(args) => !args.dry_run,
            // The proxy's UDP conntrack entries are client → listener, never pinned to an
            // endpoint: the endpoint-based cleanup does not apply (a session moves inside the
            // proxy when its endpoint leaves).
            LocalBackend::Userspace(_) => false,
            // The nftables ruleset beside the programs DNATs traffic from outside the node.
            LocalBackend::Ebpf(args) => !args.dry_run,
            // HNS has no conntrack table kpng reaches.
            LocalBackend::Hns(_) => false,
        }
    }

    /// Whether the backend, as configured, changes the node (not a dry run): only then does it
    /// remove other backends' leftovers, get the conntrack sysctls, and so on.
    pub fn changes_the_node(backend: &LocalBackend) -> bool {
        match backend {
            LocalBackend::Nft(args) => !args.dry_run,
            LocalBackend::Iptables(args) => !args.dry_run,
            LocalBackend::Userspace(args) => !args.dry_run,
            LocalBackend::Ebpf(args) => !args.dry_run,
            LocalBackend::Hns(args) => !args.dry_run,
        }
    }

    /// Builds the backend from the flags. A dry run's checkers report to `refusals`.
    pub fn build(
        flags: &GlobalFlags,
        backend: &LocalBackend,
        refusals: &crate::dry_run::Refusals,
    ) -> anyhow::Result<Built> {
        let kind = BackendKind::of(backend);
        if let LocalBackend::Hns(args) = backend {
            return hns::build(flags, args);
        }
        let detect_local = detect_local(flags)?;
        let mut cluster_cidr_warned = Vec::new();
        if !flags.masquerade_all {
            for (family, warning) in
                cluster_cidr_warnings(&detect_local, &flags.node_ip, &flags.service_cidr)
            {
                tracing::warn!("{warning}");
                cluster_cidr_warned.extend(family);
            }
        }
        let nodeport_addresses = kind.nodeport_addresses(flags)?;
        for warning in loopback_node_port_warnings(
            kind,
            &nodeport_addresses,
            flags.iptables_localhost_nodeports,
        ) {
            tracing::warn!("{warning}");
        }
        let node = NodeSettings {
            masquerade: Masquerade {
                all: flags.masquerade_all,
                bit: flags.masquerade_bit,
            },
            detect_local,
            nodeport_addresses,
        };
        let mut built = linux::build(flags, backend, node, refusals)?;
        built.cluster_cidr_warned = cluster_cidr_warned;
        Ok(built)
    }

    /// Whether the backend, as configured, programs a simulation rather than this host
    /// (`to-local hns --hcn-simulator FILE`): no host-wide lock, no Service health-check
    /// servers, no sysctls.
    pub fn simulated(backend: &LocalBackend) -> bool {
        match backend {
            LocalBackend::Hns(args) => {
                args.dry_run
                    || args.hcn_simulator.is_some()
                    || args.hcn == crate::cli::HcnMode::Simulator
            }
            _ => false,
        }
    }

    /// Whether the backend, as configured, is a dry run (`--dry-run`).
    pub fn dry_run(backend: &LocalBackend) -> bool {
        !BackendKind::changes_the_node(backend)
    }
}

/// A built node backend and what it installs itself (kept when the others' leftovers go).
pub struct Built {
    /// The backend.
    pub backend: Box<dyn Backend>,
    /// What of [`crate::leftovers::Leftover`] is its own; `None` for a dry run.
    pub own: Vec<crate::leftovers::Leftover>,
    /// Rules an earlier run left (its own kind's) still route Service traffic until the
    /// backend's first sync replaces them (`crate::earlier_rules`, asked once here); false for
    /// a dry run, the userspace proxy and HNS.
    pub earlier_rules: bool,
    /// What `kpng status` adds about the backend's data plane beyond its rules (the nftables
    /// table's name and size, the eBPF backend's programs and maps, the HNS network and
    /// objects, the iptables variant and rule counts); none for a dry run and for the
    /// userspace backend.
    pub data_plane: Option<kpng_runner::admin::DataPlaneProbe>,
    /// The families whose missing `--cluster-cidr` was warned about while building: the
    /// runner's check of the Node does not log the same fact again.
    pub cluster_cidr_warned: Vec<kpng_model::Family>,
    /// Lists the other programs' chains on kpng's hooks for `kpng status` and `kpng trace`
    /// (the nftables and iptables backends, and the eBPF backend's rules half); none for a
    /// dry run.
    pub foreign_chains: Option<kpng_runner::admin::ForeignChainsProbe>,
    /// Why node ports are not served on 127.0.0.1 although `--iptables-localhost-nodeports`
    /// asks for them (the iptables backend could not set `route_localnet`), asked by `kpng
    /// status` and `kpng trace`; none for the other backends and a dry run.
    pub localhost_failure: Option<LocalhostFailureProbe>,
}

/// Why node ports are not served on a loopback address `--nodeport-addresses` CIDRs hold,
/// one warning per family, at start, as kube-proxy logs it at every sync (its nftables mode:
/// "--nodeport-addresses includes localhost but localhost NodePorts are not supported"; its
/// iptables mode: "… not supported on IPv6", and for IPv4 "… but
/// --iptables-localhost-nodeports=false was passed"). kpng drops them silently otherwise, and
/// someone moving from iptables mode, where 127.0.0.1 NodePorts work, gets no hint. Only CIDRs
/// narrower than their family's whole range count (a `/0`, or no CIDR of the family, is
/// every address but loopback, as kube-proxy's `MatchAll`); the Windows backend does not read
/// the flag.
pub fn loopback_node_port_warnings(
    kind: BackendKind,
    nodeport: &NodePortAddresses,
    localhost_node_ports: bool,
) -> Vec<String> {
    use kpng_backend::settings::NodePortScope;
    use kpng_model::Family;
    if kind == BackendKind::Hns {
        return Vec::new();
    }
    let mut out = Vec::new();
    for family in Family::ALL {
        let NodePortScope::Cidrs(cidrs) = nodeport.scope(family) else {
            continue;
        };
        // 127.0.0.0/8 and ::1: what an overlapping CIDR brings loopback addresses of.
        let loopback: Option<ipnet::IpNet> = match family {
            Family::V4 => ipnet::Ipv4Net::new(std::net::Ipv4Addr::new(127, 0, 0, 0), 8)
                .ok()
                .map(ipnet::IpNet::V4),
            Family::V6 => Some(ipnet::IpNet::from(std::net::IpAddr::from(
                std::net::Ipv6Addr::LOCALHOST,
            ))),
        };
        let Some(loopback) = loopback else {
            continue;
        };
        let Some(cidr) = cidrs
            .iter()
            .find(|c| c.contains(&loopback.network()) || loopback.contains(&c.network()))
        else {
            continue;
        };
        let why = match (kind, family) {
            (BackendKind::Iptables, Family::V4) if localhost_node_ports => continue,
            (BackendKind::Iptables, Family::V4) => {
                "but --iptables-localhost-nodeports=false was passed".to_string()
            }
            (BackendKind::Iptables, Family::V6) => {
                "but localhost NodePorts are not supported on IPv6 (as kube-proxy's iptables \
                 mode)"
                    .to_string()
            }
            _ => format!(
                "but localhost NodePorts are not supported by the {} backend (as kube-proxy's \
                 nftables mode)",
                kind.mode()
            ),
        };
        out.push(format!(
            "--nodeport-addresses includes localhost ({cidr}) {why}: {family} NodePorts are not \
             served on loopback (Service health checks do listen there)"
        ));
    }
    out
}

/// Why IPv4 node ports are not served on 127.0.0.1 right now, if they are not although asked
/// ([`Built::localhost_failure`]).
pub type LocalhostFailureProbe = std::sync::Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// What every node backend is configured with, whatever the backend.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
struct NodeSettings {
    masquerade: Masquerade,
    detect_local: DetectLocal,
    nodeport_addresses: NodePortAddresses,
}

/// What `--detect-local-mode ClusterCIDR` cannot do with the `--cluster-cidr` given, one
/// warning each: kube-proxy says so too, and an operator who forgot the flag (or one family
/// of it on a dual-stack node) learns why traffic from outside the cluster to a ClusterIP of
/// that family keeps its source address. The families known at start are those of
/// `--node-ip` and `--service-cidr` (the Node object and the Services come later). Each
/// warning comes with the family it is about (none for no `--cluster-cidr` at all).
fn cluster_cidr_warnings(
    detect: &DetectLocal,
    node_ips: &[std::net::IpAddr],
    service_cidrs: &[ipnet::IpNet],
) -> Vec<(Option<kpng_model::Family>, String)> {
    use kpng_model::Family;
    let DetectLocal::ClusterCidr(cidrs) = detect else {
        return Vec::new();
    };
    if cidrs.is_empty() {
        return vec![(
            None,
            "--detect-local-mode ClusterCIDR without --cluster-cidr: kpng cannot tell pods \
             from other sources, so ClusterIP traffic from outside the cluster is not \
             masqueraded (as kube-proxy); give the pods' CIDRs, or another \
             --detect-local-mode"
                .to_string(),
        )];
    }
    let mut out = Vec::new();
    for family in Family::ALL {
        if cidrs.iter().any(|c| Family::of(&c.addr()) == family) {
            continue;
        }
        let mut served: Vec<String> = node_ips
            .iter()
            .filter(|ip| Family::of(ip) == family)
            .map(|ip| format!("--node-ip {ip}"))
            .collect();
        served.extend(
            service_cidrs
                .iter()
                .filter(|c| Family::of(&c.addr()) == family)
                .map(|c| format!("--service-cidr {c}")),
        );
        if served.is_empty() {
            continue;
        }
        out.push((
            Some(family),
            format!(
                "--cluster-cidr has no {family} CIDR, though this node serves {family} ({}): \
                 the local-traffic detector (--detect-local-mode ClusterCIDR) does nothing for \
                 {family}, so {family} ClusterIP traffic from outside the cluster is not \
                 masqueraded (as kube-proxy); add the {family} pod CIDR to --cluster-cidr",
                served.join(", ")
            ),
        ));
    }
    out
}

/// `--detect-local-mode` with its parameters.
pub(crate) fn detect_local(flags: &GlobalFlags) -> anyhow::Result<DetectLocal> {
    Ok(match flags.detect_local_mode {
        DetectLocalMode::ClusterCidr => DetectLocal::ClusterCidr(flags.cluster_cidr.clone()),
        DetectLocalMode::NodeCidr => DetectLocal::NodeCidr,
        DetectLocalMode::BridgeInterface => DetectLocal::BridgeInterface(
            flags
                .pod_bridge_interface
                .clone()
                .context("--detect-local-mode BridgeInterface needs --pod-bridge-interface")?,
        ),
        DetectLocalMode::InterfaceNamePrefix => {
            DetectLocal::InterfaceNamePrefix(flags.pod_interface_name_prefix.clone().context(
                "--detect-local-mode InterfaceNamePrefix needs --pod-interface-name-prefix",
            )?)
        }
        DetectLocalMode::None => DetectLocal::None,
    })
}

/// The Linux backends: nftables, iptables and the userspace proxy (its capture is nftables).
#[cfg(target_os = "linux")]
mod linux {
    use anyhow::{Context, bail};
    use kpng_backend::Backend;
    use kpng_backend_ebpf::{EbpfBackend, EbpfConfig};
    use kpng_backend_iptables::exec::{
        Iptables, IptablesCommand, Mode, detect_mode, family_usable,
    };
    use kpng_backend_iptables::{IptablesBackend, IptablesConfig};
    use kpng_backend_nft::exec::libnftables::LibNftables;
    use kpng_backend_nft::exec::{Auto, NftCommand, NftExec};
    use kpng_backend_nft::netlink::NetlinkWriter;
    use kpng_backend_nft::{NftBackend, NftConfig, SharedCommitted};
    use kpng_backend_userspace::capture::nft::{NftCapture, PodMatch};
    use kpng_backend_userspace::proxy::ProxySettings;
    use kpng_backend_userspace::{UserspaceBackend, UserspaceConfig};
    use kpng_model::Family;
    use tracing::info;

    use super::{BackendKind, Built, NodeSettings};
    use crate::cli::{
        EbpfArgs, GlobalFlags, IptablesArgs, IptablesMode, LocalBackend, NftArgs, NftExecMode,
        UserspaceArgs,
    };
    use crate::dry_run::{CheckedIptables, CheckedNft, Refusals};
    use crate::leftovers::Variant;

    pub(super) fn build(
        flags: &GlobalFlags,
        backend: &LocalBackend,
        node: NodeSettings,
        refusals: &Refusals,
    ) -> anyhow::Result<Built> {
        // What `kpng status` adds about the backend beyond its rules (none for a dry run).
        let mut data_plane = None;
        let mut foreign_chains = None;
        let mut localhost_failure: Option<super::LocalhostFailureProbe> = None;
        let kind = BackendKind::of(backend);
        let dry_run = BackendKind::dry_run(backend);
        // Without it every transaction fails with an error that names no capability.
        #[cfg(target_os = "linux")]
        if !dry_run && kind != BackendKind::Hns {
            crate::caps::need_net_admin(&format!("`to-local {}`", kind.word()))?;
        }
        match backend {
            LocalBackend::Nft(args) => crate::prereq::check(kind, &args.nft_binary)?,
            LocalBackend::Userspace(args) => crate::prereq::check(kind, &args.nft_binary)?,
            LocalBackend::Ebpf(args) => {
                // Without it every sync fails with "Operation not permitted" and no hint.
                #[cfg(target_os = "linux")]
                if !dry_run {
                    crate::caps::need_bpf("`to-local ebpf`")?;
                }
                // A mistyped path never becomes right: say so now, not at every retry.
                if let Some(cgroup) = args.cgroup_path.as_ref() {
                    if !cgroup.exists() {
                        anyhow::bail!("{}", kpng_backend_ebpf::host::missing_cgroup_path(cgroup));
                    }
                    kpng_backend_ebpf::host::check_cgroup2_dir(cgroup)?;
                }
                // An old kernel never gets the cookie: say so now, not at every retry.
                if args.socket_lb_host_netns_only
                    && !dry_run
                    && let Err(e) = kpng_backend_ebpf::netns::own_cookie()
                {
                    anyhow::bail!("{}", kpng_backend_ebpf::netns::unsupported(&e));
                }
                // Outside the host's namespace the option narrows to kpng's own: said, not
                // refused (a namespace standing for a node, in tests, is meant).
                if args.socket_lb_host_netns_only
                    && !dry_run
                    && let Some(what) = kpng_backend_ebpf::netns::Placement::find().not_host()
                {
                    tracing::warn!("{what}");
                }
                crate::prereq::check(kind, &args.nft_binary)?
            }
            LocalBackend::Iptables(_) | LocalBackend::Hns(_) => {}
        }
        // Where the eBPF backend's earlier maps are pinned (asked only of `to-local ebpf`).
        let pins = match backend {
            LocalBackend::Ebpf(args) => args.bpf_pin_path.clone(),
            _ => crate::leftovers::default_ebpf_pins(),
        };
        let (backend, variant): (Box<dyn Backend>, Option<Variant>) = match backend {
            LocalBackend::Nft(args) => {
                let b = nft(flags, args, node, refusals)?;
                if !args.dry_run {
                    data_plane = Some(crate::nft_status::probe(b.table().into(), b.committed()));
                    foreign_chains = Some(crate::foreign_chains::probe(
                        crate::foreign_chains::Own::NftTable(b.table().into()),
                    ));
                }
                (Box::new(b), None)
            }
            LocalBackend::Iptables(args) => {
                let (b, mode) = iptables(flags, args, node, refusals)?;
                let variant = mode.map(|m| match m {
                    Mode::Legacy => Variant::Legacy,
                    Mode::Nft => Variant::Nft,
                });
                // A dry run has no mode (and commits nothing to count).
                foreign_chains = mode.map(|m| {
                    crate::foreign_chains::probe(crate::foreign_chains::Own::Iptables {
                        legacy: m == Mode::Legacy,
                    })
                });
                data_plane = mode.map(|m| {
                    let detected = args.iptables_mode == IptablesMode::Auto;
                    crate::iptables_status::probe(m, detected, b.rule_counts())
                });
                if mode.is_some() {
                    let failure = b.localhost_failure();
                    localhost_failure = Some(std::sync::Arc::new(move || failure.get()));
                }
                (Box::new(b), variant)
            }
            LocalBackend::Userspace(args) => (Box::new(userspace(flags, args, node)), None),
            LocalBackend::Ebpf(args) => {
                let (b, rules) = ebpf(flags, args, node, refusals)?;
                if !dry_run {
                    foreign_chains = Some(crate::foreign_chains::probe(
                        crate::foreign_chains::Own::NftTable(rules.0.clone()),
                    ));
                    // The rules half's table, then the socket half.
                    let rules = crate::nft_status::probe(rules.0, rules.1);
                    let sockets = crate::ebpf_status::probe(
                        args.bpf_pin_path.clone(),
                        args.cgroup_path.clone(),
                        args.socket_lb_host_netns_only,
                    );
                    data_plane = Some(std::sync::Arc::new(move || {
                        let mut lines = rules();
                        lines.extend(sockets());
                        lines
                    }));
                }
                (b, None)
            }
            // Built by `super::hns` before the Linux backends are considered.
            LocalBackend::Hns(args) => return super::hns::build(flags, args),
        };
        let own = if dry_run {
            Vec::new()
        } else {
            crate::leftovers::own(kind, variant)
        };
        let earlier_rules = crate::earlier_rules::found(&own, &pins);
        // Another backend than eBPF: kpng socket programs left translating this node's
        // sockets are shown as a PROBLEM (the sweep removes them when it can).
        #[cfg(target_os = "linux")]
        if !dry_run && kind != BackendKind::Ebpf {
            let foreign =
                crate::leftovers::foreign_ebpf_probe(crate::leftovers::EbpfPlaces::from_env());
            data_plane = Some(match data_plane.take() {
                Some(probe) => std::sync::Arc::new(move || {
                    let mut lines = probe();
                    lines.extend(foreign());
                    lines
                }),
                None => foreign,
            });
        }
        Ok(Built {
            backend,
            own,
            earlier_rules,
            data_plane,
            cluster_cidr_warned: Vec::new(),
            foreign_chains,
            localhost_failure,
        })
    }

    fn nft(
        flags: &GlobalFlags,
        args: &NftArgs,
        node: NodeSettings,
        refusals: &Refusals,
    ) -> anyhow::Result<NftBackend> {
        let config = NftConfig {
            masquerade_all: node.masquerade.all,
            masquerade_bit: node.masquerade.bit,
            conntrack_mark_mask: flags.conntrack_mark_mask,
            detect_local: node.detect_local,
            nodeport_addresses: node.nodeport_addresses,
            service_cidrs: flags.service_cidr.clone(),
            ..NftConfig::default()
        };
        let exec: Box<dyn NftExec> = match (args.dry_run, args.nft_exec) {
            (true, _) => Box::new(CheckedNft::new(
                &args.nft_binary,
                &config.table,
                refusals.clone(),
            )),
            (false, NftExecMode::Command) => Box::new(NftCommand::with_binary(&args.nft_binary)),
            (false, NftExecMode::Library) => {
                Box::new(LibNftables::open().context("loading libnftables (--nft-exec library)")?)
            }
            (false, NftExecMode::Auto) => Box::new(Auto::new(&args.nft_binary)),
        };
        let mut backend = NftBackend::new(config, exec);
        if args.dry_run {
            return Ok(backend);
        }
        backend = backend.watching_kernel();
        if args.nft_exec != NftExecMode::Auto {
            return Ok(backend);
        }
        match NetlinkWriter::open() {
            Ok(writer) => Ok(backend.with_netlink(writer)),
            Err(e) => {
                info!("netlink writer unavailable ({e}); sending elements as nft text");
                Ok(backend)
            }
        }
    }

    /// Whether conntrack's `tcp_be_liberal` is on: the flag (applied at start-up) or the sysctl
    /// as the node has it (kube-proxy reads the sysctl).
    fn tcp_be_liberal(flags: &GlobalFlags) -> bool {
        flags.conntrack_tcp_be_liberal
            || std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal")
                .is_ok_and(|v| v.trim() != "0")
    }

    /// The iptables backend and the variant it programs (`None` for a dry run).
    fn iptables(
        flags: &GlobalFlags,
        args: &IptablesArgs,
        node: NodeSettings,
        refusals: &Refusals,
    ) -> anyhow::Result<(IptablesBackend, Option<Mode>)> {
        let config = IptablesConfig {
            masquerade_all: node.masquerade.all,
            masquerade_bit: node.masquerade.bit,
            detect_local: node.detect_local,
            nodeport_addresses: node.nodeport_addresses,
            localhost_node_ports: flags.iptables_localhost_nodeports,
            tcp_be_liberal: tcp_be_liberal(flags),
            ..IptablesConfig::default()
        };
        if args.dry_run {
            // Checked with the variant the node uses, when it can be read.
            let mode = match args.iptables_mode {
                IptablesMode::Legacy => Some(Mode::Legacy),
                IptablesMode::Nft => Some(Mode::Nft),
                IptablesMode::Auto => detect_mode().ok(),
            };
            let exec = CheckedIptables::new(mode, refusals.clone());
            return Ok((IptablesBackend::new(config, Box::new(exec)), None));
        }
        let mode = match args.iptables_mode {
            IptablesMode::Legacy => Mode::Legacy,
            IptablesMode::Nft => Mode::Nft,
            IptablesMode::Auto => {
                detect_mode().context("choosing the iptables variant (--iptables-mode auto)")?
            }
        };
        // As kube-proxy: a family whose iptables does not work (IPv6 disabled) is not
        // programmed.
        let (families, unusable): (Vec<_>, Vec<_>) = Family::ALL
            .into_iter()
            .map(|f| (f, family_usable(mode, f)))
            .partition(|(_, usable)| usable.is_ok());
        // The tool's own words ("Permission denied (you must be root)"), which said nothing
        // until 2026-12-06.
        let why: Vec<String> = unusable
            .iter()
            .filter_map(|(f, usable)| usable.as_ref().err().map(|e| format!("{f}: {e}")))
            .collect();
        if families.is_empty() {
            // iptables-legacy reads and writes its tables over a raw socket: without
            // CAP_NET_RAW both families fail, as nft without CAP_NET_ADMIN.
            if mode == Mode::Legacy {
                crate::caps::need_net_raw("`to-local iptables` with iptables-legacy", &why)?;
            }
            bail!(
                "iptables-{} works for neither IPv4 nor IPv6 on this node: {}",
                mode.name(),
                why.join("; ")
            );
        }
        for (f, usable) in &unusable {
            if let Err(e) = usable {
                tracing::warn!(
                    "{f}: {} does not work here ({e}); not programming {f}",
                    mode.save_binary(*f)
                );
            }
        }
        let families: Vec<Family> = families.into_iter().map(|(f, _)| f).collect();
        info!("programming iptables-{}", mode.name());
        let ipt: Box<dyn Iptables> = Box::new(IptablesCommand::new(mode));
        Ok((
            IptablesBackend::new(IptablesConfig { families, ..config }, ipt),
            Some(mode),
        ))
    }

    /// The eBPF backend: socket programs for local sockets, and kpng's nftables ruleset beside
    /// them for every packet that does not come from a local socket (docs/backends.md, "eBPF").
    /// A dry run prints the nftables transactions only.
    fn ebpf(
        flags: &GlobalFlags,
        args: &EbpfArgs,
        node: NodeSettings,
        refusals: &Refusals,
    ) -> anyhow::Result<(Box<dyn Backend>, (String, SharedCommitted))> {
        let socket = EbpfConfig {
            pin_dir: args.bpf_pin_path.clone(),
            cgroup: args.cgroup_path.clone(),
            nodeport_addresses: node.nodeport_addresses.clone(),
            host_netns_only: args.socket_lb_host_netns_only,
            ..EbpfConfig::default()
        };
        let nft_args = NftArgs {
            dry_run: args.dry_run,
            nft_exec: NftExecMode::Auto,
            nft_binary: args.nft_binary.clone(),
        };
        let rules = nft(flags, &nft_args, node, refusals)?;
        let committed = (rules.table().to_string(), rules.committed());
        if args.dry_run {
            tracing::info!(
                "dry run of `to-local ebpf`: the nftables half's transactions are printed (the \
                 log names that backend); the socket programs and their maps are not loaded"
            );
            return Ok((Box::new(rules), committed));
        }
        // Refused at start when another kpng of this host uses the same pins.
        let lock = kpng_backend_ebpf::host::lock_pins(&args.bpf_pin_path)?;
        let sockets = EbpfBackend::new(socket).holding(lock);
        let both = crate::beside::Beside::new(Box::new(rules), Box::new(sockets));
        Ok((Box::new(both), committed))
    }

    fn userspace(
        flags: &GlobalFlags,
        args: &UserspaceArgs,
        node: NodeSettings,
    ) -> UserspaceBackend {
        // Pods reach every endpoint of an externalTrafficPolicy Local Service: the capture
        // recognises them as --detect-local-mode says.
        let pods = PodMatch::from(&node.detect_local);
        let config = UserspaceConfig {
            nodeport_addresses: node.nodeport_addresses,
            service_cidrs: flags.service_cidr.clone(),
            detect_local: node.detect_local,
            settings: ProxySettings {
                connect_timeout: args.connect_timeout,
                udp_idle_timeout: args.udp_timeout,
            },
            drain_on_exit: args.drain_on_exit,
            dry_run: args.dry_run,
            ..UserspaceConfig::default()
        };
        let capture = if args.dry_run {
            NftCapture::dry_run(config.families.clone())
        } else {
            NftCapture::with_binary(config.families.clone(), &args.nft_binary)
        };
        UserspaceBackend::new(config, Box::new(capture.with_pods(pods)))
    }
}

/// Other systems have no Linux backend: the commands parse everywhere, and say so when run
/// (`to-local hns` is built by [`hns`] on every system).
#[cfg(not(target_os = "linux"))]
mod linux {
    use super::{BackendKind, Built, NodeSettings};
    use crate::cli::{GlobalFlags, LocalBackend};

    pub(super) fn build(
        _flags: &GlobalFlags,
        backend: &LocalBackend,
        _node: NodeSettings,
        _refusals: &crate::dry_run::Refusals,
    ) -> anyhow::Result<Built> {
        anyhow::bail!(
            "`to-local {}` programs the Linux kernel and is not available on this system; \
             `to-file` and `to-api` are",
            BackendKind::of(backend).word()
        )
    }
}

/// The Windows backend: the system's HCN on Windows, the simulator anywhere.
pub(crate) mod hns {
    #[cfg(windows)]
    use anyhow::Context;
    use kpng_backend_hns::dry_run::DryRunHcn;
    use kpng_backend_hns::schema::Network;
    use kpng_backend_hns::sim::Simulator;
    use kpng_backend_hns::{HnsBackend, HnsConfig, hcn::Hcn};

    use super::Built;
    use crate::cli::{GlobalFlags, HcnMode, HnsArgs};

    /// The network the simulator starts with when its file does not exist yet.
    const SIMULATED_NETWORK: &str = "kpng-sim";

    pub(super) fn build(flags: &GlobalFlags, args: &HnsArgs) -> anyhow::Result<Built> {
        let simulated = args.hcn_simulator.is_some() || args.hcn == HcnMode::Simulator;
        // A dry run on Windows reads the system's HCN (what a real run would find there),
        // so it needs the real network's name as a real run does.
        let reads_system = args.dry_run && !simulated && cfg!(windows);
        let network_name = match (
            &flags.network_name,
            simulated || (args.dry_run && !reads_system),
        ) {
            (Some(n), _) if !n.is_empty() => n.clone(),
            (_, true) => SIMULATED_NETWORK.to_string(),
            _ => anyhow::bail!(
                "`to-local hns` needs the CNI's HNS network: --network-name, the configuration \
                 file's winkernel.networkName or the KUBE_NETWORK variable"
            ),
        };
        let config = HnsConfig {
            network_name: network_name.clone(),
            enable_dsr: flags.enable_dsr,
            source_vips: flags.source_vip.clone(),
            forward_health_check_vip: flags.forward_healthcheck_vip,
            root_hns_endpoint_name: flags.root_hnsendpoint_name.clone(),
            // No health server: no port for the load balancers' probes either (kube-proxy's
            // winkernel takes 0 then).
            healthz_port: flags.healthz_bind_address.map_or(0, |a| a.port()),
        };
        let default = Network {
            id: "00000000-0000-4000-8000-000000000000".into(),
            name: network_name.clone(),
            network_type: "L2Bridge".into(),
            ..Network::default()
        };
        // What HCN holds: the simulator's file, or the system's HCN.
        let source: Box<dyn Hcn> = match &args.hcn_simulator {
            Some(path) => Box::new(Simulator::with_file(path, default)?),
            None if args.hcn == HcnMode::Simulator && !args.dry_run => {
                anyhow::bail!("--hcn simulator needs --hcn-simulator FILE (where its state lives)")
            }
            None if args.dry_run && !reads_system => {
                // Nothing to read here (no HNS on this system): the network alone.
                tracing::warn!(
                    "--dry-run: no HNS to read on this system: planning against network \
                     {network_name} alone, without the CNI's endpoints (this node's pods are \
                     left out, and said so); give --hcn-simulator FILE holding the node's HCN \
                     state to plan against it"
                );
                Box::new(Simulator::new(kpng_backend_hns::schema::State {
                    networks: vec![default],
                    ..Default::default()
                }))
            }
            None => system()?,
        };
        // A dry run reads HCN once (never changes it; a simulator's file is not written)
        // and prints the calls each sync would make.
        let hcn: Box<dyn Hcn> = if args.dry_run {
            Box::new(DryRunHcn::new(source, Box::new(std::io::stdout())))
        } else {
            source
        };
        let mut backend = HnsBackend::new(config, hcn);
        // Overlay without --source-vip: stop now, naming the flag, as kube-proxy does (not a
        // sync that fails again and again).
        backend.check_network()?;
        let data_plane = (!args.dry_run).then(|| crate::hns_status::probe(backend.summary()));
        Ok(Built {
            backend: Box::new(backend),
            own: Vec::new(),
            // Not asked of HNS: whether the load balancers an earlier run left still serve is
            // not looked at start (docs/observability.md, "A brain whose state has no Service").
            earlier_rules: false,
            data_plane,
            cluster_cidr_warned: Vec::new(),
            foreign_chains: None,
            localhost_failure: None,
        })
    }

    /// `kpng --cleanup` / `kpng cleanup` on Windows: removes every load balancer and remote
    /// endpoint kpng (or kube-proxy) made on the CNI's network, as kube-proxy's `--cleanup`.
    #[cfg(windows)]
    pub fn cleanup(flags: &GlobalFlags, dry_run: bool) -> anyhow::Result<()> {
        let network_name = flags
            .network_name
            .clone()
            .filter(|n| !n.is_empty())
            .context(
                "cleaning HNS needs the CNI's network: --network-name or the KUBE_NETWORK variable",
            )?;
        // A kpng still programming HNS would re-create at once what cleanup removes: one
        // answering on the admin pipe, or any holding the mutex (one started with
        // `--admin-socket=` serves no pipe). The mutex is held while cleaning, so that a kpng
        // starting meanwhile refuses.
        let admin = std::path::Path::new(&flags.admin_socket);
        let serving = (crate::admin::serving_backend(admin).as_deref() == Some(HnsBackend::NAME))
            .then(|| {
                Programmer::kpng(format!(
                    "a kpng answering on {} programs HNS ({})",
                    admin.display(),
                    HnsBackend::NAME
                ))
            });
        let (lock, held) = match crate::instance_lock::hold(super::BackendKind::Hns.word()) {
            Ok(lock) => (Some(lock), None),
            Err(why) => (None, Some(Programmer::kpng(why))),
        };
        let kube_proxy = crate::kube_proxy_process::on_this_node()
            .map(|p| crate::kube_proxy_process::as_programmer(&p));
        let mut out = std::io::stdout().lock();
        let result = clean(
            system()?,
            &network_name,
            dry_run,
            serving.or(held).or(kube_proxy),
            &mut out,
        );
        drop(lock);
        result
    }

    /// A process that programs HNS while cleanup would run: it would re-create at once what
    /// cleanup removes.
    #[cfg_attr(not(windows), allow(dead_code))] // Windows' cleanup; tested everywhere
    pub struct Programmer {
        /// Who it is, as a clause ("a kpng answering on … programs HNS").
        pub who: String,
        /// How the operator stops it.
        pub stop: &'static str,
    }

    impl Programmer {
        /// Another kpng, described by `who`.
        #[cfg_attr(not(windows), allow(dead_code))]
        pub fn kpng(who: String) -> Programmer {
            Programmer {
                who,
                stop: "`Stop-Service kpng`, or the DaemonSet's pod on this node",
            }
        }
    }

    /// The cleanup of HNS over `hcn` (the system's on Windows; the simulator in tests):
    /// refuses while `running` (who programs HNS, a refusal's subject) unless `dry_run`, which
    /// says it would refuse; then removes, or lists, the load balancers and remote endpoints
    /// on `network_name` and says how many. A dry run that would be refused then fails as the
    /// real run would, so that a script's dry-run check does not read success. Free of the
    /// platform, so that it is tested on any.
    #[cfg_attr(not(windows), allow(dead_code))] // Windows' cleanup; tested everywhere
    pub(crate) fn clean(
        hcn: Box<dyn Hcn>,
        network_name: &str,
        dry_run: bool,
        running: Option<Programmer>,
        out: &mut dyn std::io::Write,
    ) -> anyhow::Result<()> {
        let would_refuse = running.is_some();
        if let Some(Programmer { who, stop }) = running {
            if !dry_run {
                anyhow::bail!(
                    "{who}: it would re-create at once what cleanup removes. Stop it first \
                     ({stop}), then run cleanup again"
                );
            }
            writeln!(out, "kpng: {who}; cleanup would refuse until it stops")?;
        }
        let config = HnsConfig {
            network_name: network_name.to_string(),
            ..HnsConfig::default()
        };
        let mut backend = HnsBackend::new(config, hcn);
        let report = backend.clean(dry_run)?;
        writeln!(
            out,
            "kpng: {} {} HNS load balancer(s) and {} remote endpoint(s) on network \
             {network_name}",
            if dry_run { "would remove" } else { "removed" },
            report.load_balancers.len(),
            report.remote_endpoints.len()
        )?;
        if dry_run {
            for lb in &report.load_balancers {
                writeln!(out, "  load balancer {lb}")?;
            }
            for ep in &report.remote_endpoints {
                writeln!(out, "  remote endpoint {ep}")?;
            }
            if would_refuse {
                anyhow::bail!("--dry-run: the real cleanup would refuse (said above), and fail so");
            }
        }
        Ok(())
    }

    #[cfg(windows)]
    fn system() -> anyhow::Result<Box<dyn Hcn>> {
        Ok(Box::new(kpng_backend_hns::system::SystemHcn::new()))
    }

    #[cfg(not(windows))]
    fn system() -> anyhow::Result<Box<dyn Hcn>> {
        anyhow::bail!(
            "`to-local hns` programs the Windows Host Networking Service, which this system does \
             not have; run it on a Windows node, or against the simulator with \
             --hcn-simulator FILE"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{BackendKind, NodePortAddresses, Platform, loopback_node_port_warnings};

    /// A ClusterCIDR detector warns for no `--cluster-cidr` at all, and for a family the node
    /// serves (by `--node-ip` or `--service-cidr`) that `--cluster-cidr` has no CIDR of.
    #[test]
    fn a_family_without_a_cluster_cidr_is_warned_about() {
        use kpng_backend::settings::DetectLocal;
        let nets = |l: &[&str]| -> Vec<ipnet::IpNet> {
            l.iter().map(|c| c.parse().expect("cidr")).collect()
        };
        let ips = |l: &[&str]| -> Vec<std::net::IpAddr> {
            l.iter().map(|c| c.parse().expect("ip")).collect()
        };
        for (what, detect, node_ips, service_cidrs, want) in [
            (
                "no --cluster-cidr",
                DetectLocal::ClusterCidr(vec![]),
                ips(&[]),
                nets(&[]),
                &["--detect-local-mode ClusterCIDR without --cluster-cidr"][..],
            ),
            (
                "IPv6 only, dual-stack Service CIDRs",
                DetectLocal::ClusterCidr(nets(&["fd00:244::/32"])),
                ips(&[]),
                nets(&["fd00:96::/112", "10.96.0.0/16"]),
                &[
                    "--cluster-cidr has no IPv4 CIDR, though this node serves IPv4 \
                   (--service-cidr 10.96.0.0/16)",
                ][..],
            ),
            (
                "IPv4 only, an IPv6 node IP",
                DetectLocal::ClusterCidr(nets(&["10.244.0.0/16"])),
                ips(&["192.168.100.1", "fd00:100::1"]),
                nets(&[]),
                &[
                    "--cluster-cidr has no IPv6 CIDR, though this node serves IPv6 \
                   (--node-ip fd00:100::1)",
                ][..],
            ),
            (
                "a pair",
                DetectLocal::ClusterCidr(nets(&["10.244.0.0/16", "fd00:244::/32"])),
                ips(&["192.168.100.1", "fd00:100::1"]),
                nets(&["fd00:96::/112", "10.96.0.0/16"]),
                &[][..],
            ),
            (
                "one family, nothing says the node has the other",
                DetectLocal::ClusterCidr(nets(&["10.244.0.0/16"])),
                ips(&[]),
                nets(&["10.96.0.0/16"]),
                &[][..],
            ),
            (
                "another mode",
                DetectLocal::NodeCidr,
                ips(&["fd00:100::1"]),
                nets(&[]),
                &[][..],
            ),
        ] {
            let got = super::cluster_cidr_warnings(&detect, &node_ips, &service_cidrs);
            assert_eq!(got.len(), want.len(), "{what}: {got:?}");
            for ((_, g), w) in got.iter().zip(want) {
                assert!(g.starts_with(w), "{what}: {g}");
            }
        }
    }

    /// `--nodeport-addresses` CIDRs holding a loopback address: one warning per family where
    /// the backend does not serve node ports on it, worded as kube-proxy's mode logs it
    /// (nftables: not supported; iptables: IPv6 not supported, IPv4 only with
    /// `--iptables-localhost-nodeports`); nothing for `/0`, a family without a CIDR, or the
    /// Windows backend.
    #[test]
    fn loopback_in_the_node_port_cidrs_is_warned_about_where_it_is_not_served() {
        let cidrs = |l: &[&str]| {
            NodePortAddresses::Cidrs(l.iter().map(|c| c.parse().expect("cidr")).collect())
        };
        let nft = "but localhost NodePorts are not supported by the nftables backend";
        // (what, backend, setting, --iptables-localhost-nodeports, warnings wanted)
        type Case<'a> = (&'a str, BackendKind, NodePortAddresses, bool, &'a [&'a str]);
        let cases: [Case; 9] = [
            (
                "nft, 127.0.0.0/8",
                BackendKind::Nft,
                cidrs(&["127.0.0.0/8", "10.45.2.0/24"]),
                false,
                &[
                    "--nodeport-addresses includes localhost (127.0.0.0/8) but localhost NodePorts \
                   are not supported by the nftables backend (as kube-proxy's nftables mode): IPv4 \
                   NodePorts are not served on loopback",
                ],
            ),
            (
                "nft, 127.0.0.1/32",
                BackendKind::Nft,
                cidrs(&["127.0.0.1/32"]),
                false,
                &[nft],
            ),
            (
                "nft, a wider CIDR",
                BackendKind::Nft,
                cidrs(&["64.0.0.0/2"]),
                false,
                &[nft],
            ),
            (
                "nft, ::1",
                BackendKind::Nft,
                cidrs(&["::1/128", "fd45:2::/64"]),
                false,
                &[nft],
            ),
            (
                "nft, no loopback",
                BackendKind::Nft,
                cidrs(&["10.45.2.0/24", "fd45:2::/64"]),
                false,
                &[],
            ),
            (
                "nft, 0.0.0.0/0: every address but loopback",
                BackendKind::Nft,
                cidrs(&["0.0.0.0/0"]),
                false,
                &[],
            ),
            (
                "iptables without --iptables-localhost-nodeports",
                BackendKind::Iptables,
                cidrs(&["127.0.0.0/8", "::1/128"]),
                false,
                &[
                    "(127.0.0.0/8) but --iptables-localhost-nodeports=false was passed",
                    "(::1/128) but localhost NodePorts are not supported on IPv6",
                ],
            ),
            (
                "iptables with it: IPv4 served",
                BackendKind::Iptables,
                cidrs(&["127.0.0.0/8"]),
                true,
                &[],
            ),
            (
                "Windows",
                BackendKind::Hns,
                cidrs(&["127.0.0.0/8"]),
                false,
                &[],
            ),
        ];
        for (what, kind, setting, localhost, want) in cases {
            let got = loopback_node_port_warnings(kind, &setting, localhost);
            assert_eq!(got.len(), want.len(), "{what}: {got:?}");
            for (g, w) in got.iter().zip(want) {
                assert!(g.contains(w), "{what}: {g:?} lacks {w:?}");
            }
        }
    }

    /// The health checks listen where the node ports are: the node IPs, the node's addresses
    /// inside CIDR `--nodeport-addresses` (not every address, as kube-proxy), or every address
    /// (iptables' default; the Windows backend, which does not read the flag).
    #[test]
    fn health_checks_listen_where_the_node_ports_are() {
        use clap::Parser;
        use kpng_runner::runner::HealthCheckAddresses;
        let flags = |args: &[&str]| {
            let mut all = vec!["kpng", "file", "--input", "x.yaml"];
            all.extend_from_slice(args);
            all.extend(["to-local", "nft"]);
            crate::cli::Cli::try_parse_from(all).expect("parses").global
        };
        let cidrs = |l: &[&str]| {
            HealthCheckAddresses::Cidrs(l.iter().map(|c| c.parse().expect("cidr")).collect())
        };
        let npa = ["--nodeport-addresses", "10.0.0.0/8,fd00::/64"];
        for (kind, args, want) in [
            (BackendKind::Nft, &[][..], HealthCheckAddresses::NodeIps),
            (BackendKind::Iptables, &[][..], HealthCheckAddresses::All),
            (
                BackendKind::Iptables,
                &["--nodeport-addresses", "primary"][..],
                HealthCheckAddresses::NodeIps,
            ),
            (
                BackendKind::Nft,
                &npa[..],
                cidrs(&["10.0.0.0/8", "fd00::/64"]),
            ),
            (
                BackendKind::Iptables,
                &npa[..],
                cidrs(&["10.0.0.0/8", "fd00::/64"]),
            ),
            (
                BackendKind::Userspace,
                &npa[..],
                cidrs(&["10.0.0.0/8", "fd00::/64"]),
            ),
            (
                BackendKind::Ebpf,
                &npa[..],
                cidrs(&["10.0.0.0/8", "fd00::/64"]),
            ),
            (BackendKind::Hns, &npa[..], HealthCheckAddresses::All),
        ] {
            assert_eq!(
                kind.health_check_addresses(&flags(args)),
                want,
                "{kind:?} {args:?}"
            );
        }
    }

    /// The backends that ran the sweep of other proxies' rules and got the conntrack sysctls
    /// before the decision was explicit keep doing so; the Windows backend keeps not doing
    /// so. A new backend cannot inherit either: `takes_over_node_proxying` is an exhaustive
    /// match.
    #[test]
    fn all_lists_every_variant_and_each_mode_reads_back() {
        use clap::ValueEnum;
        // The derive lists every variant: one missing from ALL would be unknown to `kpng
        // cleanup`'s refusal and to the instance lock.
        assert_eq!(BackendKind::ALL.as_slice(), BackendKind::value_variants());
        // What `--write-config-to` writes as `mode` is read back by `--config`.
        for platform in [Platform::Linux, Platform::Windows] {
            for kind in BackendKind::ALL {
                assert_eq!(
                    BackendKind::from_mode_on(kind.mode(), platform),
                    Ok(kind),
                    "{kind:?}"
                );
            }
        }
    }

    #[test]
    fn the_existing_backends_keep_taking_the_node_over_or_not() {
        for kind in BackendKind::ALL {
            let want = match kind {
                BackendKind::Nft
                | BackendKind::Iptables
                | BackendKind::Userspace
                | BackendKind::Ebpf => true,
                BackendKind::Hns => false,
            };
            assert_eq!(kind.takes_over_node_proxying(), want, "{kind:?}");
        }
    }

    #[test]
    fn an_empty_mode_is_kube_proxys_default_of_the_platform() {
        // kube-proxy's platformApplyDefaults: iptables on Linux, kernelspace on Windows.
        assert_eq!(
            BackendKind::from_mode_on("", Platform::Linux),
            Ok(BackendKind::Iptables)
        );
        assert_eq!(
            BackendKind::from_mode_on("", Platform::Windows),
            Ok(BackendKind::Hns)
        );
        assert_eq!(Platform::Windows.default_backend(), BackendKind::Hns);
        assert_eq!(Platform::Linux.default_backend(), BackendKind::Iptables);
        // A named mode means the same everywhere.
        for platform in [Platform::Linux, Platform::Windows] {
            assert_eq!(
                BackendKind::from_mode_on("iptables", platform),
                Ok(BackendKind::Iptables)
            );
            assert_eq!(
                BackendKind::from_mode_on("kernelspace", platform),
                Ok(BackendKind::Hns)
            );
        }
        let unknown = BackendKind::from_mode_on("winkernl", Platform::Windows)
            .expect_err("a typo is an error");
        assert!(
            unknown.contains("Windows mode is \"kernelspace\" (the default"),
            "{unknown}"
        );
        assert_eq!(
            Platform::HOST,
            if cfg!(windows) {
                Platform::Windows
            } else {
                Platform::Linux
            }
        );
    }
}

#[cfg(test)]
mod hns_cleanup_tests {
    use kpng_backend_hns::schema::State;
    use kpng_backend_hns::sim::Simulator;

    use super::hns::{Programmer, clean};

    /// HCN with the CNI's endpoint, a remote endpoint and two load balancers kpng made.
    fn programmed() -> Simulator {
        let state: State = serde_json::from_value(serde_json::json!({
            "Networks": [{"ID": "NET", "Name": "cbr0", "Type": "L2Bridge"}],
            "Endpoints": [
                {"ID": "CNI-2", "HostComputeNetwork": "NET",
                 "IpConfigurations": [{"IpAddress": "10.244.1.2"}]},
                {"ID": "REMOTE-7", "HostComputeNetwork": "NET", "Flags": 1,
                 "IpConfigurations": [{"IpAddress": "10.244.2.7"}]}],
            "LoadBalancers": [
                {"ID": "LB-1", "HostComputeEndpoints": ["CNI-2", "REMOTE-7"],
                 "FrontendVIPs": ["10.96.0.10"],
                 "PortMappings": [{"Protocol": 6, "InternalPort": 8080, "ExternalPort": 80}]},
                {"ID": "LB-2", "HostComputeEndpoints": ["CNI-2"],
                 "PortMappings": [{"Protocol": 6, "InternalPort": 8080, "ExternalPort": 30080}]}]
        }))
        .expect("state");
        Simulator::new(state)
    }

    fn run(
        sim: &Simulator,
        dry_run: bool,
        running: Option<Programmer>,
    ) -> (anyhow::Result<()>, String) {
        let mut out = Vec::new();
        let result = clean(Box::new(sim.clone()), "cbr0", dry_run, running, &mut out);
        (result, String::from_utf8_lossy(&out).into_owned())
    }

    #[test]
    fn cleanup_refuses_while_the_mutex_is_held_and_says_what_it_removes() {
        let held = crate::instance_lock::held_by_another("hns");
        assert!(held.contains("the mutex Global\\kpng-hns"), "{held}");
        // A kpng holding the mutex (and serving no admin pipe) programs HNS: refused, nothing
        // touched.
        let sim = programmed();
        let (result, _) = run(&sim, false, Some(Programmer::kpng(held.clone())));
        let err = result.expect_err("refused").to_string();
        assert!(
            err.contains("Global\\kpng-hns") && err.contains("would re-create"),
            "{err}"
        );
        assert_eq!(sim.state().load_balancers.len(), 2);
        // The dry run says it would refuse, naming the mutex, and lists what would go.
        let (result, said) = run(&sim, true, Some(Programmer::kpng(held)));
        // …and fails as the real run would.
        let err = result
            .expect_err("a dry run of a refused cleanup")
            .to_string();
        assert!(err.contains("the real cleanup would refuse"), "{err}");
        assert!(
            said.contains("holds the mutex Global\\kpng-hns); cleanup would refuse"),
            "{said}"
        );
        assert!(
            said.contains("would remove 2 HNS load balancer(s) and 1 remote endpoint(s)")
                && said.contains("load balancer 10.96.0.10:80/TCP")
                && said.contains("load balancer node port 30080/TCP")
                && said.contains("remote endpoint 10.244.2.7"),
            "{said}"
        );
        assert_eq!(
            sim.state().load_balancers.len(),
            2,
            "a dry run removes nothing"
        );
        // Nobody programs HNS: removed and counted; the CNI's endpoint stays.
        let (result, said) = run(&sim, false, None);
        result.expect("cleanup");
        assert!(
            said.contains(
                "removed 2 HNS load balancer(s) and 1 remote endpoint(s) on network cbr0"
            ),
            "{said}"
        );
        let after = sim.state();
        assert!(after.load_balancers.is_empty());
        assert_eq!(after.endpoints.len(), 1, "{:?}", after.endpoints);
    }

    #[test]
    fn cleanup_refuses_while_kube_proxy_runs_and_says_how_to_stop_it() {
        let kube_proxy = crate::kube_proxy_process::Process {
            pid: 2100,
            name: "kube-proxy.exe".into(),
        };
        let sim = programmed();
        let running = crate::kube_proxy_process::as_programmer(&kube_proxy);
        let (result, _) = run(&sim, false, Some(running));
        let err = result.expect_err("refused").to_string();
        assert!(
            err.starts_with("kube-proxy.exe (pid 2100) runs on this node and programs HNS")
                && err.contains("would re-create")
                && err.contains("Stop-Service kube-proxy"),
            "{err}"
        );
        assert_eq!(sim.state().load_balancers.len(), 2, "nothing removed");
    }
}
