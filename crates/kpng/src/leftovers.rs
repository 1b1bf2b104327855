//! What a service proxy can leave on a node, whoever installed it: each kpng backend's rules
//! and each of kube-proxy's modes. Left in place, another proxy's rules keep translating
//! Service traffic with stale endpoints next to the running one's, so a starting backend
//! removes everything that is not its own once its rules are in place ([`sweep`]), and
//! `kpng cleanup` / `kpng --cleanup` remove everything ([`cleanup_all`]).
//!
//! kpng's iptables backend writes kube-proxy's chains under kube-proxy's names, so "iptables
//! chains" are one leftover per variant (legacy, nft) for both: a kpng running the iptables
//! backend keeps its variant's and removes the other's. kubelet's chains (`KUBE-FIREWALL`,
//! `KUBE-KUBELET-CANARY`, `KUBE-IPTABLES-HINT`, `KUBE-MARK-DROP`) are never touched.

#[cfg(target_os = "linux")]
use std::path::Path;
use std::path::PathBuf;

#[cfg(target_os = "linux")]
use crate::backends::BackendKind;

/// One thing a proxy may have left on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leftover {
    /// kpng's `kpng` nftables tables (`to-local nft`).
    KpngNft,
    /// The userspace proxy's capture tables (`to-local userspace`).
    KpngUserspace,
    /// The eBPF backend's pinned maps and links under `/sys/fs/bpf/kpng` (`to-local ebpf`);
    /// removing the link pins detaches its socket programs.
    KpngEbpf,
    /// kube-proxy's iptables and ipvs modes' chains, and kpng's iptables backend's, in one
    /// iptables variant.
    IptablesChains(Variant),
    /// kube-proxy's nftables mode: its `kube-proxy` tables (ip, ip6).
    KubeProxyNft,
    /// kube-proxy's ipvs mode: the `kube-ipvs0` interface holding the Service IPs and its
    /// `KUBE-*` ipsets (the IPVS virtual servers stay, inert without the interface).
    KubeProxyIpvs,
}

/// Whether an entry of [`Leftover::ALL`] matches the pattern `$p` (at compile time).
macro_rules! in_all {
    ($p:pat) => {{
        let mut i = 0;
        let mut found = false;
        while i < Leftover::ALL.len() {
            found |= matches!(Leftover::ALL[i], $p);
            i += 1;
        }
        found
    }};
}

/// One arm per leftover, each checking while kpng compiles that [`Leftover::ALL`] lists it:
/// the match is exhaustive, so a new variant does not compile until it is named here, and
/// then not until it is in `ALL`. Why: `ALL` is what `kpng cleanup` and a backend's takeover
/// walk; a variant missing from it would never be removed, and nothing else would notice.
macro_rules! each_in_all {
    ($l:expr; $($p:pat),+ $(,)?) => {
        match $l {
            $($p => const {
                assert!(in_all!($p), concat!(stringify!($p), " is missing from Leftover::ALL"))
            },)+
        }
    };
}

/// See `each_in_all`; its checks run when the constant below is evaluated.
const fn every_leftover_is_in_all(leftover: Leftover) {
    each_in_all!(leftover;
        Leftover::KpngNft,
        Leftover::KpngUserspace,
        Leftover::KpngEbpf,
        Leftover::IptablesChains(Variant::Legacy),
        Leftover::IptablesChains(Variant::Nft),
        Leftover::KubeProxyNft,
        Leftover::KubeProxyIpvs,
    );
}

const _: () = every_leftover_is_in_all(Leftover::KpngNft);

/// An iptables variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// x_tables (`iptables-legacy`).
    Legacy,
    /// nf_tables (`iptables-nft`).
    Nft,
}

impl Variant {
    /// `legacy` or `nft`, as in the tools' names.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Legacy => "legacy",
            Variant::Nft => "nft",
        }
    }
}

impl Leftover {
    /// Everything, in the order it is removed (iptables rules before the ipsets they use).
    /// Checked complete while kpng compiles: `every_leftover_is_in_all` fails while a variant
    /// is missing (`kpng cleanup` and the takeover would never remove it).
    pub const ALL: [Leftover; 7] = [
        Leftover::KpngNft,
        Leftover::KpngUserspace,
        Leftover::KpngEbpf,
        Leftover::IptablesChains(Variant::Legacy),
        Leftover::IptablesChains(Variant::Nft),
        Leftover::KubeProxyNft,
        Leftover::KubeProxyIpvs,
    ];

    /// What it is, for messages; `ebpf` is where the eBPF backend's pins are looked for.
    pub fn describe(self, ebpf: &EbpfPlaces) -> String {
        match self {
            Leftover::KpngNft => "kpng's nftables tables (`to-local nft`)".into(),
            Leftover::KpngUserspace => {
                "the userspace proxy's nftables tables (`to-local userspace`)".into()
            }
            Leftover::KpngEbpf => format!(
                "the eBPF backend's pinned programs and maps under {} and the kpng programs \
                 that translate the sockets of {} (or of a cgroup below it) or of kpng's own \
                 cgroup, wherever they are pinned (`to-local ebpf`)",
                ebpf.pins.display(),
                ebpf.cgroup.as_ref().map_or_else(
                    || "the cgroup v2 root".into(),
                    |c| format!("cgroup {}", c.display())
                )
            ),
            Leftover::IptablesChains(v) => format!(
                "kube-proxy's iptables chains in iptables-{} (iptables or ipvs mode, or kpng's \
                 `to-local iptables`)",
                v.name()
            ),
            Leftover::KubeProxyNft => "kube-proxy's nftables tables (nftables mode)".into(),
            Leftover::KubeProxyIpvs => {
                "kube-proxy's ipvs mode's kube-ipvs0 interface and KUBE-* ipsets".into()
            }
        }
    }

    /// Whether any of it is on the node. Errors (a tool missing, no permission) count as
    /// "nothing there": whatever cannot be read cannot be removed either. `ebpf` is the
    /// eBPF backend's pin directory (`--bpf-pin-path`).
    pub fn present(self, ebpf: &EbpfPlaces) -> bool {
        imp::present(self, ebpf)
    }

    /// Who uses it right now, when a running kpng of this host does: then it is not a
    /// leftover (the eBPF pins, which are the host's, of a kpng in another network namespace).
    pub fn in_use(self, ebpf: &EbpfPlaces) -> Option<String> {
        imp::in_use(self, ebpf)
    }

    /// Removes it.
    pub fn remove(self, ebpf: &EbpfPlaces) -> anyhow::Result<()> {
        imp::remove(self, ebpf)
    }
}

/// Where the eBPF backend's leftovers are: its pins, and the cgroup its programs were attached
/// to. Both, because a kpng that could not see its predecessor's pins (another
/// `--bpf-pin-path`, a bpffs of its own) leaves programs attached with no pin to find them by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EbpfPlaces {
    /// The pin directory (`--bpf-pin-path`).
    pub pins: PathBuf,
    /// The cgroup (`--cgroup-path`); `None`: the cgroup v2 root.
    pub cgroup: Option<PathBuf>,
}

impl EbpfPlaces {
    /// `$KPNG_BPF_PIN_PATH` and `$KPNG_CGROUP_PATH` (what the flags also read), else the
    /// defaults: what kube-proxy's `--cleanup` and another backend's start look at.
    pub fn from_env() -> EbpfPlaces {
        EbpfPlaces {
            pins: default_ebpf_pins(),
            cgroup: std::env::var_os("KPNG_CGROUP_PATH")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
        }
    }
}

/// The eBPF backend's pin directory when no `--bpf-pin-path` is given: `$KPNG_BPF_PIN_PATH`
/// (what `--bpf-pin-path` also reads), else the default.
pub fn default_ebpf_pins() -> PathBuf {
    std::env::var_os("KPNG_BPF_PIN_PATH")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_EBPF_PINS), PathBuf::from)
}

/// `--bpf-pin-path`'s default (the eBPF backend's `DEFAULT_PIN_DIR`, which Windows builds do
/// not link).
pub const DEFAULT_EBPF_PINS: &str = "/sys/fs/bpf/kpng";

/// Whether `table` (`nat`, `filter`, …) of one iptables variant and family exists, found
/// without touching iptables (reading a legacy table creates it, and its hooks with it).
#[cfg(target_os = "linux")]
pub fn iptables_table_exists(variant: Variant, family: kpng_model::Family, table: &str) -> bool {
    imp::iptables_table_exists(variant, family, table)
}

/// What a running backend installs itself, which [`sweep`] keeps.
#[cfg(target_os = "linux")]
pub fn own(kind: BackendKind, iptables_variant: Option<Variant>) -> Vec<Leftover> {
    match kind {
        BackendKind::Nft => vec![Leftover::KpngNft],
        BackendKind::Userspace => vec![Leftover::KpngUserspace],
        BackendKind::Iptables => iptables_variant
            .map(Leftover::IptablesChains)
            .into_iter()
            .collect(),
        // The socket programs and the nftables ruleset beside them.
        BackendKind::Ebpf => vec![Leftover::KpngEbpf, Leftover::KpngNft],
        BackendKind::Hns => Vec::new(),
    }
}

/// Removes every leftover but `own`, logging each removal. Best effort: a failure is a
/// warning, never fatal. Called once the running backend's rules are in place, so that
/// traffic keeps flowing through whichever rules match first meanwhile, and established
/// connections keep their conntrack entries.
pub fn sweep(own: &[Leftover], ebpf: &EbpfPlaces) {
    for leftover in Leftover::ALL.into_iter().filter(|l| !own.contains(l)) {
        if !leftover.present(ebpf) {
            tracing::debug!("no {}", leftover.describe(ebpf));
            continue;
        }
        if let Some(user) = leftover.in_use(ebpf) {
            tracing::info!("kept {}: in use by {user}", leftover.describe(ebpf));
            continue;
        }
        match leftover.remove(ebpf) {
            Ok(()) => tracing::info!("removed {}", leftover.describe(ebpf)),
            Err(e) => tracing::warn!("could not remove {}: {e:#}", leftover.describe(ebpf)),
        }
    }
    #[cfg(target_os = "linux")]
    if !own.iter().any(|l| matches!(l, Leftover::IptablesChains(_)))
        && let Some(done) = put_back_route_localnet(false)
    {
        tracing::info!("{done}");
    }
}

/// Puts `net.ipv4.conf.all.route_localnet` back as it was before kpng's iptables backend set
/// it (its record in `/run/kpng`), once no rules of kpng's need it: `kpng cleanup` of every
/// proxy's rules, and a start of another backend that removed the iptables chains. Returns
/// what it did (or would do). Not under `--kpng-only`: a kube-proxy running again in iptables
/// mode set it to 1 itself at its start and needs it.
#[cfg(target_os = "linux")]
pub fn put_back_route_localnet(dry_run: bool) -> Option<String> {
    use kpng_backend_iptables::route_localnet::{STATE_DIR, record_path, restore};
    let state = Path::new(STATE_DIR);
    let value = std::fs::read_to_string(record_path(state)).ok()?;
    let what = format!(
        "net.ipv4.conf.all.route_localnet back to {}, as it was before kpng's iptables backend \
         set it",
        value.trim()
    );
    if dry_run {
        return Some(format!("would put {what}"));
    }
    match restore(Path::new("/proc/sys"), state) {
        Ok(()) => Some(format!("put {what}")),
        Err(e) => {
            tracing::warn!("putting {what}: {e}");
            None
        }
    }
}

/// What `kpng cleanup` removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(windows, allow(dead_code))]
pub enum Scope {
    /// Every proxy's leftovers (kube-proxy's `--cleanup`).
    Everything,
    /// What kpng alone installs (`--kpng-only`): going back to a kube-proxy that already runs
    /// again must not remove that kube-proxy's rules.
    KpngOnly,
}

impl Leftover {
    /// Whether only kpng installs it: kpng's nftables tables and eBPF pins. The iptables
    /// chains carry kube-proxy's names whoever wrote them.
    pub fn is_kpngs_own(self) -> bool {
        matches!(
            self,
            Leftover::KpngNft | Leftover::KpngUserspace | Leftover::KpngEbpf
        )
    }
}

/// `kpng cleanup`, `kpng --cleanup`: removes every leftover in `scope` and prints what it
/// removed; with `dry_run`, prints what it would remove and removes nothing. Returns how many
/// it removed (or would).
#[cfg_attr(windows, allow(dead_code))]
pub fn cleanup_all(scope: Scope, dry_run: bool, ebpf: &EbpfPlaces) -> anyhow::Result<usize> {
    let mut failed = Vec::new();
    let mut removed = 0;
    for leftover in Leftover::ALL {
        if scope == Scope::KpngOnly && !leftover.is_kpngs_own() {
            continue;
        }
        if !leftover.present(ebpf) {
            continue;
        }
        if let Some(user) = leftover.in_use(ebpf) {
            failed.push(format!(
                "{}: in use by {user}; stop that kpng first",
                leftover.describe(ebpf)
            ));
            continue;
        }
        if dry_run {
            removed += 1;
            println!("kpng: would remove {}", leftover.describe(ebpf));
            continue;
        }
        match leftover.remove(ebpf) {
            Ok(()) => {
                removed += 1;
                println!("kpng: removed {}", leftover.describe(ebpf));
            }
            Err(e) => failed.push(format!("{}: {e:#}", leftover.describe(ebpf))),
        }
    }
    if !failed.is_empty() {
        anyhow::bail!("{}", failed.join("; "));
    }
    #[cfg(target_os = "linux")]
    if scope == Scope::Everything
        && let Some(done) = put_back_route_localnet(dry_run)
    {
        println!("kpng: {done}");
        removed += 1;
    }
    Ok(removed)
}

/// `kpng status`'s line about kpng eBPF programs that still translate this node's sockets
/// while another backend runs: a sweep that could not detach them (a running eBPF kpng holds
/// them, or they are attached without a bpf_link), or programs attached since. Asked at every
/// `kpng status`: one `BPF_PROG_QUERY` per hook and cgroup; nothing is shown when there are
/// none. The cgroups are found at the first call, among the visible mounts (none is mounted).
#[cfg(target_os = "linux")]
pub fn foreign_ebpf_probe(ebpf: EbpfPlaces) -> kpng_runner::admin::DataPlaneProbe {
    let cgroups = std::sync::OnceLock::new();
    std::sync::Arc::new(move || {
        let cgroups = cgroups.get_or_init(|| imp::ebpf_cgroups(&ebpf, false));
        let found = kpng_backend_ebpf::kernel::found_programs(cgroups).unwrap_or_default();
        if found.is_empty() {
            return Vec::new();
        }
        let names: Vec<String> = found
            .iter()
            .map(kpng_backend_ebpf::kernel::Found::describe)
            .collect();
        let holder = kpng_backend_ebpf::kernel::node_programs_holder(cgroups)
            .map_or_else(String::new, |owner| {
                format!(" ({owner} holds them: stop it)")
            });
        vec![kpng_runner::admin::DataPlaneDetail {
            what: "eBPF socket programs of another kpng".into(),
            state: format!("{} attached: {}", found.len(), names.join(", ")),
            problem: Some(format!(
                "they translate this node's connections to Services before this backend's \
                 rules, from maps nobody updates{holder}; `kpng cleanup --kpng-only` (with the \
                 eBPF kpng's --bpf-pin-path and --cgroup-path, once no eBPF kpng runs) detaches \
                 them"
            )),
        }]
    })
}

/// What removing the eBPF backend's leftovers came to: the pins' removal (`pins`, under
/// `dir`) and the programs' sweep, each done whatever became of the other. Logs what was
/// removed and detached, and what was kept (other tools' pins in a shared directory); returns
/// every failure, in words (none: all gone).
#[cfg(target_os = "linux")]
fn ebpf_removal(
    dir: &Path,
    pins: Result<kpng_backend_ebpf::pins::Removed, kpng_backend_ebpf::Error>,
    swept: Result<kpng_backend_ebpf::kernel::ProgramSweep, kpng_backend_ebpf::Error>,
) -> Vec<String> {
    let mut failed = Vec::new();
    match pins {
        Ok(removed) if !removed.kept.is_empty() => tracing::info!(
            "kept {} in {}: not kpng's (kpng removes only its own pins)",
            removed.kept.join(", "),
            dir.display()
        ),
        Ok(_) => {}
        Err(e) => failed.push(format!("removing the eBPF backend's pins: {e}")),
    }
    match swept {
        Ok(swept) => {
            if !swept.detached.is_empty() {
                tracing::info!(
                    "detached the kpng eBPF programs that translated this node's sockets: {}",
                    swept.detached.join(", ")
                );
            }
            let mut left = swept.left;
            left.extend(swept.held);
            if !left.is_empty() {
                failed.push(format!(
                    "kpng eBPF programs still translate this node's sockets: {}",
                    left.join("; ")
                ));
            }
        }
        Err(e) => failed.push(format!("detaching kpng programs: {e}")),
    }
    failed
}

/// Whether an iptables chain is kube-proxy's (any mode) or kpng's iptables backend's, never
/// kubelet's.
#[cfg(target_os = "linux")]
pub fn is_proxy_chain(chain: &str) -> bool {
    const EXACT: [&str; 14] = [
        "KUBE-SERVICES",
        "KUBE-EXTERNAL-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-POSTROUTING",
        "KUBE-MARK-MASQ",
        "KUBE-FORWARD",
        "KUBE-PROXY-FIREWALL",
        "KUBE-PROXY-CANARY",
        // ipvs mode's.
        "KUBE-NODE-PORT",
        "KUBE-LOAD-BALANCER",
        "KUBE-LOOP-BACK",
        "KUBE-SOURCE-RANGES-FIREWALL",
        "KUBE-IPVS-FILTER",
        "KUBE-IPVS-OUT-FILTER",
    ];
    const PREFIXES: [&str; 6] = [
        "KUBE-SVC-",
        "KUBE-SVL-",
        "KUBE-SEP-",
        "KUBE-EXT-",
        "KUBE-FW-",
        "KUBE-XLB-",
    ];
    EXACT.contains(&chain) || PREFIXES.iter().any(|p| chain.starts_with(p))
}

/// The `iptables-restore --noflush` input that removes the proxy chains of one table's
/// `iptables-save` text: every rule of another chain that jumps to one of them, then the
/// chains themselves (declaring a chain flushes it, so no rule of one refers to another
/// when they are deleted). `None` when the table has none.
#[cfg(target_os = "linux")]
pub fn removal_script(table: &str, saved: &str) -> Option<String> {
    let ours: Vec<&str> = saved
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| is_proxy_chain(c))
        .collect();
    if ours.is_empty() {
        return None;
    }
    let mut out = format!("*{table}\n");
    for line in saved.lines() {
        let Some(rule) = line.strip_prefix("-A ") else {
            continue;
        };
        let Some((chain, spec)) = rule.split_once(' ') else {
            continue;
        };
        if ours.contains(&chain) {
            continue;
        }
        let mut tokens = spec.split_whitespace();
        let mut jumps_to_ours = false;
        while let Some(t) = tokens.next() {
            if matches!(t, "-j" | "--jump" | "-g" | "--goto")
                && tokens.next().is_some_and(|target| ours.contains(&target))
            {
                jumps_to_ours = true;
            }
        }
        if jumps_to_ours {
            out.push_str(&format!("-D {chain} {spec}\n"));
        }
    }
    for chain in &ours {
        out.push_str(&format!(":{chain} - [0:0]\n"));
    }
    for chain in &ours {
        out.push_str(&format!("-X {chain}\n"));
    }
    out.push_str("COMMIT\n");
    Some(out)
}

#[cfg(target_os = "linux")]
mod imp {
    use anyhow::{Context, bail};
    use kpng_backend::Backend as _;
    use kpng_backend_kit::exec::run_tool;
    use kpng_backend_nft::exec::NftCommand;
    use kpng_backend_nft::{NftBackend, NftConfig};
    use kpng_backend_userspace::capture::Capture as _;
    use kpng_backend_userspace::capture::nft::NftCapture;
    use kpng_model::Family;

    use super::{EbpfPlaces, Leftover, Variant, removal_script};
    use std::path::PathBuf;

    /// The tables an iptables proxy uses.
    const TABLES: [&str; 3] = ["nat", "filter", "mangle"];

    fn tool(variant: Variant, family: Family, what: &str) -> String {
        let prefix = match family {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        };
        format!("{prefix}-{}-{what}", variant.name())
    }

    /// Every nftables table as (family, name) pairs, from a netlink table dump (`nft list
    /// tables` reads every set element first: seconds and hundreds of MB next to a large
    /// ruleset, and the sweep asks several times); empty when the dump fails.
    fn nft_tables() -> Vec<(String, String)> {
        match kpng_netfilter::tables::list_tables() {
            Ok(tables) => tables
                .into_iter()
                .map(|t| (t.family.to_string(), t.name))
                .collect(),
            Err(e) => {
                tracing::debug!("cannot list the nftables tables: {e}");
                Vec::new()
            }
        }
    }

    /// Whether a `table FAMILY NAME` for one of `families` with `name` exists.
    fn has_table(name: &str, families: &[&str]) -> bool {
        nft_tables()
            .iter()
            .any(|(f, n)| n == name && families.contains(&f.as_str()))
    }

    /// Whether `table` of one variant and family exists, found without touching iptables:
    /// reading a legacy table instantiates it, and with it netfilter hooks that every packet of
    /// the node then crosses (the benchmark measured +5-10% on a connection's first packet),
    /// and iptables-nft may create its base chains when asked to list them.
    pub(crate) fn iptables_table_exists(variant: Variant, family: Family, table: &str) -> bool {
        match variant {
            Variant::Legacy => kpng_backend_iptables::exec::legacy_table_exists(family, table),
            Variant::Nft => {
                let family = match family {
                    Family::V4 => "ip",
                    Family::V6 => "ip6",
                };
                has_table(table, &[family])
            }
        }
    }

    /// The removal scripts of every table of one variant and family.
    fn iptables_scripts(variant: Variant, family: Family) -> Vec<String> {
        TABLES
            .iter()
            .filter(|table| iptables_table_exists(variant, family, table))
            .filter_map(|table| {
                let saved = run_tool(&tool(variant, family, "save"), &["-t", table], None).ok()?;
                removal_script(table, &saved)
            })
            .collect()
    }

    /// The KUBE-* ipsets kube-proxy's ipvs mode made.
    fn kube_ipsets() -> Vec<String> {
        run_tool("ipset", &["list", "-n"], None)
            .map(|t| {
                t.lines()
                    .map(str::trim)
                    .filter(|n| n.starts_with("KUBE-"))
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    }

    fn has_kube_ipvs0() -> bool {
        std::path::Path::new("/sys/class/net/kube-ipvs0").exists()
    }

    /// The cgroups whose sockets the eBPF backend's programs are looked for on: its
    /// `--cgroup-path`, else the cgroup v2 root (where the backend attaches by default), and
    /// this process's own cgroup, whose effective programs include those attached above the
    /// root it sees (a container's cgroup namespace, a DaemonSet without the host's cgroup).
    /// With `mount`, a cgroup v2 hierarchy is mounted when none is visible
    /// ([`kpng_backend_ebpf::host::cgroup2_root`]); without, none is looked at then.
    pub(super) fn ebpf_cgroups(ebpf: &EbpfPlaces, mount: bool) -> Vec<PathBuf> {
        let root = if mount {
            kpng_backend_ebpf::host::cgroup2_root().ok()
        } else {
            kpng_backend_ebpf::host::visible_cgroup2_root()
        };
        let mut cgroups: Vec<PathBuf> = ebpf
            .cgroup
            .clone()
            .or_else(|| root.clone())
            .into_iter()
            .collect();
        if let Some(own) = root
            .as_deref()
            .and_then(kpng_backend_ebpf::host::own_cgroup)
            && !cgroups.contains(&own)
        {
            cgroups.push(own);
        }
        cgroups
    }

    /// The kpng programs that translate those cgroups' sockets, attached there, above or below
    /// (none when they cannot be read).
    fn ebpf_programs(ebpf: &EbpfPlaces) -> Vec<u32> {
        kpng_backend_ebpf::kernel::found_programs(&ebpf_cgroups(ebpf, true))
            .map(|found| found.into_iter().map(|f| f.program.id).collect())
            .unwrap_or_default()
    }

    pub(super) fn in_use(leftover: Leftover, ebpf: &EbpfPlaces) -> Option<String> {
        match leftover {
            Leftover::KpngEbpf if kpng_backend_ebpf::host::pins_in_use(&ebpf.pins) => {
                Some(kpng_backend_ebpf::host::holder(&ebpf.pins).map_or_else(
                    || "a running kpng".into(),
                    |h| format!("a running kpng ({h})"),
                ))
            }
            // Pins this process cannot see, of a kpng that runs: its links are held open.
            Leftover::KpngEbpf => kpng_backend_ebpf::kernel::node_programs_holder(&ebpf_cgroups(
                ebpf, true,
            ))
            .map(|owner| format!("a running kpng ({owner}, which holds its programs' links)")),
            _ => None,
        }
    }

    pub(super) fn present(leftover: Leftover, ebpf: &EbpfPlaces) -> bool {
        match leftover {
            Leftover::KpngNft => has_table("kpng", &["ip", "ip6"]),
            Leftover::KpngUserspace => {
                has_table(kpng_backend_userspace::capture::nft::TABLE, &["ip", "ip6"])
            }
            Leftover::KpngEbpf => {
                kpng_backend_ebpf::pins::holds_pins(&ebpf.pins) || !ebpf_programs(ebpf).is_empty()
            }
            Leftover::KubeProxyNft => has_table("kube-proxy", &["ip", "ip6"]),
            Leftover::IptablesChains(v) => Family::ALL
                .iter()
                .any(|f| !iptables_scripts(v, *f).is_empty()),
            Leftover::KubeProxyIpvs => has_kube_ipvs0() || !kube_ipsets().is_empty(),
        }
    }

    pub(super) fn remove(leftover: Leftover, ebpf: &EbpfPlaces) -> anyhow::Result<()> {
        match leftover {
            Leftover::KpngNft => {
                NftBackend::new(NftConfig::default(), Box::new(NftCommand::default()))
                    .cleanup()
                    .context("removing kpng's nftables tables")?;
            }
            Leftover::KpngUserspace => NftCapture::new(Family::ALL.to_vec())
                .cleanup()
                .context("removing the userspace proxy's nftables tables")?,
            Leftover::KpngEbpf => {
                // kpng's pins only: a pin directory shared with other tools keeps theirs.
                let pins = kpng_backend_ebpf::pins::remove(&ebpf.pins);
                // Programs attached with no pin this process can see (a kpng that ran with
                // another pin directory or bpffs), attached above the cgroup root it sees, or
                // below the cgroups (a stopped kpng's --cgroup-path subtree): found through the
                // kernel's links, and none is a running kpng's. Swept whatever became of the
                // pins: a failure there must not leave programs translating from frozen maps.
                let swept = kpng_backend_ebpf::kernel::sweep_programs(
                    &ebpf_cgroups(ebpf, true),
                    std::time::Duration::from_secs(2),
                );
                let failed = super::ebpf_removal(&ebpf.pins, pins, swept);
                if !failed.is_empty() {
                    bail!("{}", failed.join("; "));
                }
            }
            Leftover::KubeProxyNft => {
                let script = "add table ip kube-proxy\ndelete table ip kube-proxy\n\
                              add table ip6 kube-proxy\ndelete table ip6 kube-proxy\n";
                run_tool("nft", &["-f", "-"], Some(script))?;
            }
            Leftover::IptablesChains(v) => {
                let mut failed = Vec::new();
                for family in Family::ALL {
                    for script in iptables_scripts(v, family) {
                        let restore = tool(v, family, "restore");
                        if let Err(e) = run_tool(&restore, &["-w", "5", "--noflush"], Some(&script))
                        {
                            failed.push(format!("{e}"));
                        }
                    }
                }
                if !failed.is_empty() {
                    bail!("{}", failed.join("; "));
                }
            }
            Leftover::KubeProxyIpvs => {
                if has_kube_ipvs0() {
                    run_tool("ip", &["link", "delete", "kube-ipvs0"], None)?;
                }
                for set in kube_ipsets() {
                    run_tool("ipset", &["destroy", &set], None)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use super::{EbpfPlaces, Leftover};

    pub(super) fn present(_leftover: Leftover, _ebpf: &EbpfPlaces) -> bool {
        false
    }

    pub(super) fn in_use(_leftover: Leftover, _ebpf: &EbpfPlaces) -> Option<String> {
        None
    }

    pub(super) fn remove(_leftover: Leftover, _ebpf: &EbpfPlaces) -> anyhow::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ALL` lists each leftover once (its completeness is checked while compiling:
    /// `every_leftover_is_in_all`), so nothing is removed twice.
    #[test]
    fn all_lists_each_leftover_once() {
        for (i, a) in Leftover::ALL.iter().enumerate() {
            for b in &Leftover::ALL[i + 1..] {
                assert_ne!(a, b, "{a:?} twice in Leftover::ALL");
            }
        }
    }

    /// The Windows-safe copy of the eBPF backend's default pin directory is the same.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_default_pin_directory_is_the_backends() {
        assert_eq!(DEFAULT_EBPF_PINS, kpng_backend_ebpf::DEFAULT_PIN_DIR);
    }

    const KUBE_PROXY_NAT: &str = "\
# Generated by iptables-nft-save v1.8.9
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SEP-ABC - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-XYZ - [0:0]
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -j KUBE-SVC-XYZ
-A KUBE-SVC-XYZ -j KUBE-SEP-ABC
-A KUBE-SEP-ABC -p tcp -j DNAT --to-destination 10.244.1.2:8080
COMMIT
";

    #[test]
    fn removes_kube_proxys_chains_and_jumps_but_not_kubelets() {
        let script = removal_script("nat", KUBE_PROXY_NAT).expect("something to remove");
        assert_eq!(
            script,
            "*nat\n\
             -D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -D OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -D POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
             :KUBE-MARK-MASQ - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-POSTROUTING - [0:0]\n\
             :KUBE-SEP-ABC - [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-XYZ - [0:0]\n\
             -X KUBE-MARK-MASQ\n-X KUBE-NODEPORTS\n-X KUBE-POSTROUTING\n-X KUBE-SEP-ABC\n\
             -X KUBE-SERVICES\n-X KUBE-SVC-XYZ\nCOMMIT\n"
        );
    }

    #[test]
    fn kubelets_chains_alone_are_nothing_to_remove() {
        let saved = "*filter\n:INPUT ACCEPT [0:0]\n:KUBE-FIREWALL - [0:0]\n\
                     :KUBE-KUBELET-CANARY - [0:0]\n-A INPUT -j KUBE-FIREWALL\nCOMMIT\n";
        assert_eq!(removal_script("filter", saved), None);
        for kubelet in [
            "KUBE-FIREWALL",
            "KUBE-KUBELET-CANARY",
            "KUBE-IPTABLES-HINT",
            "KUBE-MARK-DROP",
        ] {
            assert!(!is_proxy_chain(kubelet), "{kubelet}");
        }
        for proxy in [
            "KUBE-XLB-1",
            "KUBE-FW-2",
            "KUBE-PROXY-CANARY",
            "KUBE-FORWARD",
        ] {
            assert!(is_proxy_chain(proxy), "{proxy}");
        }
    }

    /// (case, the pins' removal failed, the sweep, the failures reported): a failure of one
    /// half never hides the other's.
    #[cfg(target_os = "linux")]
    #[test]
    fn an_ebpf_removal_reports_every_failure() {
        use kpng_backend_ebpf::Error;
        use kpng_backend_ebpf::kernel::ProgramSweep;
        let dir = Path::new("/run/x-bpf/kpng");
        let pins_failed = || Err(Error::Setup("removing /run/x-bpf/kpng/v3: busy".into()));
        let pins_ok = || Ok(kpng_backend_ebpf::pins::Removed::default());
        let left = || {
            Ok(ProgramSweep {
                left: vec!["kpng_connect4 (program 9): detaching link 3: denied".into()],
                ..ProgramSweep::default()
            })
        };
        let clean = || Ok(ProgramSweep::default());
        let sweep_failed = || Err(Error::Bpf("listing links: denied".into()));
        type Pins = Result<kpng_backend_ebpf::pins::Removed, Error>;
        type Sweep = Result<ProgramSweep, Error>;
        let cases: [(&str, Pins, Sweep, &[&str]); 4] = [
            ("all gone", pins_ok(), clean(), &[]),
            (
                "both fail",
                pins_failed(),
                left(),
                &["v3: busy", "kpng_connect4 (program 9)"],
            ),
            ("the pins fail", pins_failed(), clean(), &["v3: busy"]),
            (
                "the sweep fails",
                pins_ok(),
                sweep_failed(),
                &["detaching kpng programs: eBPF: listing links: denied"],
            ),
        ];
        for (case, pins, swept, want) in cases {
            let failed = ebpf_removal(dir, pins, swept);
            assert_eq!(failed.len(), want.len(), "{case}: {failed:?}");
            for (got, want) in failed.iter().zip(want) {
                assert!(got.contains(want), "{case}: {got}");
            }
        }
    }

    #[test]
    fn a_running_backend_keeps_only_its_own() {
        assert_eq!(own(BackendKind::Nft, None), [Leftover::KpngNft]);
        assert_eq!(
            own(BackendKind::Iptables, Some(Variant::Legacy)),
            [Leftover::IptablesChains(Variant::Legacy)]
        );
        assert_eq!(own(BackendKind::Iptables, None), []);
        // The socket programs and the nftables ruleset beside them: the nft backend's
        // tables are the eBPF backend's too (and its pins are swept by the others).
        assert_eq!(
            own(BackendKind::Ebpf, None),
            [Leftover::KpngEbpf, Leftover::KpngNft]
        );
        assert!(!own(BackendKind::Nft, None).contains(&Leftover::KpngEbpf));
    }
}
