//! Every backend that programs this node, in one closed list: how to build each from the
//! flags, where its Service health checks listen, whether it cleans stale UDP conntrack
//! entries, and how to remove what it leaves on the node.
//!
//! Adding a backend is one variant of [`BackendKind`] and one arm in each `match` below; the
//! compiler lists every place that must decide something for it. Switching backends needs no
//! N×N list either: the one that starts removes the leftovers of every *other* kind.

use anyhow::{Context, bail};
use clap::ValueEnum;
use kpng_backend::Backend;
use kpng_backend::settings::{DetectLocal, Masquerade, NodePortAddresses};
use kpng_runner::runner::HealthCheckAddresses;

use crate::cli::{DetectLocalMode, GlobalFlags, LocalBackend};

/// A backend that programs this node (`to-local <kind>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// nftables: kube-proxy's nftables mode with a constant-size ruleset.
    Nft,
    /// iptables: kube-proxy's iptables mode (legacy or nft variant).
    Iptables,
    /// A userspace TCP/UDP proxy, VIP traffic captured by a small nftables table.
    Userspace,
}

impl BackendKind {
    /// Every kind, in the order `kpng cleanup` removes them.
    pub const ALL: [BackendKind; 3] = [
        BackendKind::Nft,
        BackendKind::Iptables,
        BackendKind::Userspace,
    ];

    /// The kind of a parsed `to-local` subcommand.
    pub fn of(backend: &LocalBackend) -> BackendKind {
        match backend {
            LocalBackend::Nft(_) => BackendKind::Nft,
            LocalBackend::Iptables(_) => BackendKind::Iptables,
            LocalBackend::Userspace(_) => BackendKind::Userspace,
        }
    }

    /// The command word (`nft`, `iptables`, `userspace`).
    pub fn word(self) -> &'static str {
        match self {
            BackendKind::Nft => "nft",
            BackendKind::Iptables => "iptables",
            BackendKind::Userspace => "userspace",
        }
    }

    /// Where node ports are served when `--nodeport-addresses` is unset: kube-proxy's default
    /// for the mode (nftables: the node's IPs; iptables: every local address).
    fn default_nodeport_addresses(self) -> NodePortAddresses {
        match self {
            BackendKind::Nft | BackendKind::Userspace => NodePortAddresses::Primary,
            BackendKind::Iptables => NodePortAddresses::AllLocal,
        }
    }

    /// `--nodeport-addresses` as this backend reads it.
    pub fn nodeport_addresses(self, flags: &GlobalFlags) -> anyhow::Result<NodePortAddresses> {
        if flags.nodeport_addresses.is_empty() {
            return Ok(self.default_nodeport_addresses());
        }
        if flags.nodeport_addresses.iter().all(|a| a == "primary") {
            return Ok(NodePortAddresses::Primary);
        }
        let cidrs = flags
            .nodeport_addresses
            .iter()
            .map(|a| {
                a.parse::<ipnet::IpNet>().with_context(|| {
                    format!("--nodeport-addresses: {a:?} is not a CIDR or `primary`")
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(NodePortAddresses::Cidrs(cidrs))
    }

    /// Where the Service health checks (`healthCheckNodePort`) listen: the node IPs when node
    /// ports are served on those only, else every address.
    pub fn health_check_addresses(self, flags: &GlobalFlags) -> HealthCheckAddresses {
        match self.nodeport_addresses(flags) {
            Ok(NodePortAddresses::Primary) => HealthCheckAddresses::NodeIps,
            _ => HealthCheckAddresses::All,
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
        }
    }

    /// Whether the backend, as configured, changes the node (not a dry run): only then does it
    /// remove other backends' leftovers, get the conntrack sysctls, and so on.
    pub fn changes_the_node(backend: &LocalBackend) -> bool {
        match backend {
            LocalBackend::Nft(args) => !args.dry_run,
            LocalBackend::Iptables(args) => !args.dry_run,
            LocalBackend::Userspace(args) => !args.dry_run,
        }
    }

    /// Builds the backend from the flags.
    pub fn build(flags: &GlobalFlags, backend: &LocalBackend) -> anyhow::Result<Box<dyn Backend>> {
        let kind = BackendKind::of(backend);
        let node = NodeSettings {
            masquerade: Masquerade {
                all: flags.masquerade_all,
                bit: flags.masquerade_bit,
            },
            detect_local: detect_local(flags)?,
            nodeport_addresses: kind.nodeport_addresses(flags)?,
        };
        linux::build(flags, backend, node)
    }

    /// Removes everything this kind of backend installed on the node. `Ok(false)`: there was
    /// nothing to remove (or no tool to remove it with).
    pub fn remove_leftovers(self) -> anyhow::Result<bool> {
        linux::remove_leftovers(self)
    }

    /// Removes the leftovers of every other kind, so that a node switched from another
    /// backend does not keep a second set of rules. Best effort: logged, never fatal. Called
    /// once this backend's own rules are in place, so that traffic keeps flowing meanwhile.
    pub fn remove_other_kinds(self) {
        for other in BackendKind::ALL.into_iter().filter(|k| *k != self) {
            match other.remove_leftovers() {
                Ok(true) => tracing::info!(
                    "removed the rules a previous `to-local {}` left on this node",
                    other.word()
                ),
                Ok(false) => tracing::debug!("no `to-local {}` leftovers", other.word()),
                Err(e) => tracing::warn!(
                    "could not remove the `to-local {}` leftovers: {e:#}",
                    other.word()
                ),
            }
        }
    }
}

/// What every node backend is configured with, whatever the backend.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
struct NodeSettings {
    masquerade: Masquerade,
    detect_local: DetectLocal,
    nodeport_addresses: NodePortAddresses,
}

/// `--detect-local-mode` with its parameters.
fn detect_local(flags: &GlobalFlags) -> anyhow::Result<DetectLocal> {
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

/// `kpng cleanup`: every backend's leftovers, each reported.
pub fn cleanup() -> anyhow::Result<()> {
    let mut failed = Vec::new();
    for kind in BackendKind::ALL {
        match kind.remove_leftovers() {
            Ok(true) => println!("kpng: removed what `to-local {}` installed", kind.word()),
            Ok(false) => println!("kpng: nothing of `to-local {}` to remove", kind.word()),
            Err(e) => failed.push(format!("to-local {}: {e:#}", kind.word())),
        }
    }
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    Ok(())
}

/// The Linux backends: nftables, iptables and the userspace proxy (its capture is nftables).
#[cfg(target_os = "linux")]
mod linux {
    use anyhow::{Context, bail};
    use kpng_backend::Backend;
    use kpng_backend_iptables::exec::{
        DryRun as IptablesDryRun, Iptables, IptablesCommand, Mode, detect_mode, family_usable,
    };
    use kpng_backend_iptables::{IptablesBackend, IptablesConfig};
    use kpng_backend_nft::exec::libnftables::LibNftables;
    use kpng_backend_nft::exec::{Auto, NftCommand, NftExec, dry_run};
    use kpng_backend_nft::netlink::NetlinkWriter;
    use kpng_backend_nft::{NftBackend, NftConfig};
    use kpng_backend_userspace::capture::Capture as _;
    use kpng_backend_userspace::capture::nft::{NftCapture, PodMatch};
    use kpng_backend_userspace::proxy::ProxySettings;
    use kpng_backend_userspace::{UserspaceBackend, UserspaceConfig};
    use kpng_model::Family;
    use tracing::info;

    use super::{BackendKind, NodeSettings};
    use crate::cli::{
        GlobalFlags, IptablesArgs, IptablesMode, LocalBackend, NftArgs, NftExecMode, UserspaceArgs,
    };

    pub(super) fn build(
        flags: &GlobalFlags,
        backend: &LocalBackend,
        node: NodeSettings,
    ) -> anyhow::Result<Box<dyn Backend>> {
        Ok(match backend {
            LocalBackend::Nft(args) => Box::new(nft(flags, args, node)?),
            LocalBackend::Iptables(args) => Box::new(iptables(flags, args, node)?),
            LocalBackend::Userspace(args) => Box::new(userspace(flags, args, node)),
        })
    }

    fn nft(flags: &GlobalFlags, args: &NftArgs, node: NodeSettings) -> anyhow::Result<NftBackend> {
        let config = NftConfig {
            masquerade_all: node.masquerade.all,
            masquerade_bit: node.masquerade.bit,
            detect_local: node.detect_local,
            nodeport_addresses: node.nodeport_addresses,
            service_cidrs: flags.service_cidr.clone(),
            ..NftConfig::default()
        };
        let exec: Box<dyn NftExec> = match (args.dry_run, args.nft_exec) {
            (true, _) => Box::new(dry_run()),
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

    fn iptables(
        flags: &GlobalFlags,
        args: &IptablesArgs,
        node: NodeSettings,
    ) -> anyhow::Result<IptablesBackend> {
        let config = IptablesConfig {
            masquerade_all: node.masquerade.all,
            masquerade_bit: node.masquerade.bit,
            detect_local: node.detect_local,
            nodeport_addresses: node.nodeport_addresses,
            localhost_node_ports: args.iptables_localhost_nodeports,
            tcp_be_liberal: tcp_be_liberal(flags),
            ..IptablesConfig::default()
        };
        if args.dry_run {
            return Ok(IptablesBackend::new(config, Box::new(IptablesDryRun)));
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
        let families: Vec<Family> = Family::ALL
            .into_iter()
            .filter(|f| {
                let usable = family_usable(mode, *f);
                if !usable {
                    tracing::warn!(
                        "{f}: {} does not work here; not programming {f}",
                        mode.save_binary(*f)
                    );
                }
                usable
            })
            .collect();
        if families.is_empty() {
            bail!(
                "iptables-{} works for neither IPv4 nor IPv6 on this node",
                mode.name()
            );
        }
        info!("programming iptables-{}", mode.name());
        let ipt: Box<dyn Iptables> = Box::new(IptablesCommand::new(mode));
        Ok(IptablesBackend::new(
            IptablesConfig { families, ..config },
            ipt,
        ))
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
            ..UserspaceConfig::default()
        };
        let capture = if args.dry_run {
            NftCapture::dry_run(config.families.clone())
        } else {
            NftCapture::with_binary(config.families.clone(), &args.nft_binary)
        };
        UserspaceBackend::new(config, Box::new(capture.with_pods(pods)))
    }

    /// Whether iptables of `mode` holds any table in this network namespace, found without
    /// touching iptables itself: reading a legacy table instantiates it, and with it netfilter hooks
    /// that every packet of the node then traverses (measured: +5% on a connection's first packet),
    /// and iptables-nft may create its base chains when asked to list them.
    fn iptables_tables_exist(mode: Mode) -> bool {
        match mode {
            Mode::Legacy => ["/proc/net/ip_tables_names", "/proc/net/ip6_tables_names"]
                .iter()
                .any(|p| std::fs::read_to_string(p).is_ok_and(|t| !t.trim().is_empty())),
            Mode::Nft => nft_tables().iter().any(|(family, name)| {
                matches!(family.as_str(), "ip" | "ip6")
                    && matches!(name.as_str(), "filter" | "nat" | "mangle")
            }),
        }
    }

    /// The nftables tables of this network namespace, as (family, name); empty when `nft` is
    /// missing. One cheap listing without contents.
    fn nft_tables() -> Vec<(String, String)> {
        let Ok(out) = std::process::Command::new("nft")
            .args(["list", "tables"])
            .output()
        else {
            return Vec::new();
        };
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let mut words = l.split_whitespace();
                (words.next() == Some("table"))
                    .then(|| Some((words.next()?.to_string(), words.next()?.to_string())))
                    .flatten()
            })
            .collect()
    }

    /// Whether an nftables table of this name exists in any family.
    fn nft_table_exists(name: &str) -> bool {
        nft_tables().iter().any(|(_, n)| n == name)
    }

    pub(super) fn remove_leftovers(kind: BackendKind) -> anyhow::Result<bool> {
        match kind {
            BackendKind::Nft => {
                let config = NftConfig::default();
                if !nft_table_exists(&config.table) {
                    return Ok(false);
                }
                let mut nft = NftBackend::new(config, Box::new(NftCommand::default()));
                nft.cleanup().context("removing kpng's nftables tables")?;
                Ok(true)
            }
            BackendKind::Userspace => {
                if !nft_table_exists(kpng_backend_userspace::capture::nft::TABLE) {
                    return Ok(false);
                }
                NftCapture::new(Family::ALL.to_vec())
                    .cleanup()
                    .context("removing the userspace proxy's nftables tables")?;
                Ok(true)
            }
            BackendKind::Iptables => {
                let mut removed = false;
                let mut failed = Vec::new();
                for mode in [Mode::Legacy, Mode::Nft] {
                    if !iptables_tables_exist(mode) {
                        continue;
                    }
                    let mut ipt = IptablesBackend::new(
                        IptablesConfig::default(),
                        Box::new(IptablesCommand::new(mode)),
                    );
                    match ipt.cleanup() {
                        Ok(()) => removed = true,
                        Err(e) => failed.push(format!("iptables-{}: {e}", mode.name())),
                    }
                }
                if !failed.is_empty() {
                    bail!("removing kpng's iptables chains: {}", failed.join("; "));
                }
                Ok(removed)
            }
        }
    }
}

/// Other systems have no node backend yet (the Windows HNS backend is the next one): the
/// commands parse everywhere, and say so when run.
#[cfg(not(target_os = "linux"))]
mod linux {
    use kpng_backend::Backend;

    use super::{BackendKind, NodeSettings};
    use crate::cli::{GlobalFlags, LocalBackend};

    pub(super) fn build(
        _flags: &GlobalFlags,
        backend: &LocalBackend,
        _node: NodeSettings,
    ) -> anyhow::Result<Box<dyn Backend>> {
        anyhow::bail!(
            "`to-local {}` programs the Linux kernel and is not available on this system; \
             `to-file` and `to-api` are",
            BackendKind::of(backend).word()
        )
    }

    pub(super) fn remove_leftovers(_kind: BackendKind) -> anyhow::Result<bool> {
        Ok(false)
    }
}
