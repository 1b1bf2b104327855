//! How restore input reaches the kernel: `iptables-restore` / `ip6tables-restore` of the legacy
//! (x_tables) or nft (nf_tables) variant, a dry run that prints, or a recorder for tests.

use std::path::PathBuf;

use std::sync::{Arc, Mutex};

use kpng_model::Family;

use crate::rules::Table;

/// Which iptables variant programs the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `iptables-legacy`: the x_tables kernel API.
    Legacy,
    /// `iptables-nft`: iptables rules stored as nf_tables objects.
    Nft,
}

impl Mode {
    /// `legacy` or `nft`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Legacy => "legacy",
            Mode::Nft => "nft",
        }
    }

    /// Parses `legacy` or `nft`.
    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "legacy" => Some(Mode::Legacy),
            "nft" => Some(Mode::Nft),
            _ => None,
        }
    }

    fn binary(self, family: Family, tool: &str) -> String {
        let prefix = match family {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        };
        format!("{prefix}-{}-{tool}", self.name())
    }

    /// The restore tool of `family` (`iptables-nft-restore`, …).
    pub fn restore_binary(self, family: Family) -> String {
        self.binary(family, "restore")
    }

    /// The save tool of `family` (`ip6tables-legacy-save`, …).
    pub fn save_binary(self, family: Family) -> String {
        self.binary(family, "save")
    }

    /// The plain tool of `family` (`iptables-legacy`, `ip6tables-nft`), for one-chain listings.
    pub fn tool_binary(self, family: Family) -> String {
        let prefix = match family {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        };
        format!("{prefix}-{}", self.name())
    }
}

pub use kpng_backend_kit::exec::ExecError;

/// `chain` cut out of a table's `iptables-save` text, as `iptables -S CHAIN` prints it; `None`
/// when the table has no such chain. The fallback of [`Iptables::list_chain`] for writers
/// that can only save a whole table.
fn chain_from_save(save: &str, chain: &str) -> Option<String> {
    let saved = crate::save::Saved::parse(save);
    if !saved.chains.contains(chain) {
        return None;
    }
    let mut out = format!("-N {chain}\n");
    for (c, spec) in &saved.rules {
        if c == chain {
            out.push_str(&format!("-A {chain} {spec}\n"));
        }
    }
    Some(out)
}

/// The node's iptables, as the backend uses it.
pub trait Iptables: Send {
    /// Feeds `input` to the restore tool of `family` with `--noflush`: only the chains and rules
    /// it names change, atomically per table.
    fn restore(&mut self, family: Family, input: &str) -> Result<(), ExecError>;
    /// The current content of `table` in `family` (`iptables-save -t TABLE`).
    fn save(&mut self, family: Family, table: Table) -> Result<String, ExecError>;
    /// Sets `net.ipv4.conf.all.route_localnet=1` (IPv4 node ports on 127.0.0.1).
    fn enable_route_localnet(&mut self) -> Result<(), ExecError>;
    /// Puts `route_localnet` back as it was before kpng first set it (cleanup).
    fn restore_route_localnet(&mut self) -> Result<(), ExecError> {
        Ok(())
    }
    /// One chain as `iptables -t TABLE -S CHAIN` prints it (`-N CHAIN`, then `-A CHAIN …`
    /// lines); `None` when the chain does not exist. By default cut out of [`Iptables::save`].
    fn list_chain(
        &mut self,
        family: Family,
        table: Table,
        chain: &str,
    ) -> Result<Option<String>, ExecError> {
        Ok(chain_from_save(&self.save(family, table)?, chain))
    }
    /// A second handle on the same iptables for the tampering watcher's thread; `None` when
    /// there is nothing to watch (a dry run).
    fn watcher(&self) -> Option<Box<dyn Iptables>> {
        None
    }
    /// Whether the kernel notifies changes of these tables (iptables-nft: they are nf_tables
    /// tables), so that tampering is watched through notifications instead of polled.
    fn notifies(&self) -> bool {
        false
    }
    /// The variant, for logs (`iptables-nft`, `dry run`, …).
    fn describe(&self) -> String;
    /// Whether these rules NAT in this namespace's kernel, so that the backend holds an
    /// anchor table for their established connections (`kpng_netfilter::anchor`); not for a
    /// dry run or a recorder, which must not touch the kernel.
    fn nats_in_kernel(&self) -> bool {
        false
    }
    /// Whether [`Iptables::save`] shows the kernel (a dry run shows nothing).
    fn reads_kernel(&self) -> bool {
        true
    }
    /// How many Service chains one restore should create at most; `None`: no limit.
    fn chains_per_restore(&self) -> Option<usize> {
        None
    }
}

/// iptables-nft's restore takes time quadratic in the chains one transaction declares (with
/// `--noflush`; measured with 1.8.9: 16k chains 9 s in one transaction, 2 s in batches of
/// 2000; 50k chains over 7 minutes): batches of this many keep it linear.
pub const NFT_CHAINS_PER_RESTORE: usize = 2000;

/// The real thing: one restore process per transaction.
#[derive(Debug, Clone)]
pub struct IptablesCommand {
    mode: Mode,
    proc_sys: PathBuf,
    /// Where the value of `route_localnet` before kpng is kept (see [`crate::route_localnet`]).
    state_dir: PathBuf,
    /// What was said of `route_localnet` so far.
    route_localnet_notes: crate::route_localnet::SetNotes,
}

impl IptablesCommand {
    /// The tools of `mode`.
    pub fn new(mode: Mode) -> IptablesCommand {
        IptablesCommand {
            mode,
            proc_sys: PathBuf::from("/proc/sys"),
            state_dir: PathBuf::from(crate::route_localnet::STATE_DIR),
            route_localnet_notes: Default::default(),
        }
    }

    /// The variant.
    pub fn mode(&self) -> Mode {
        self.mode
    }
}

/// Runs `binary args` with `stdin`, failing with its standard error on a non-zero exit.
fn run(binary: &str, args: &[&str], stdin: Option<&str>) -> Result<String, ExecError> {
    kpng_backend_kit::exec::run_tool(binary, args, stdin)
}

impl Iptables for IptablesCommand {
    fn restore(&mut self, family: Family, input: &str) -> Result<(), ExecError> {
        let binary = self.mode.restore_binary(family);
        run(
            &binary,
            &["-w", "5", "--noflush", "--counters"],
            Some(input),
        )
        .map(|_| ())
    }

    fn save(&mut self, family: Family, table: Table) -> Result<String, ExecError> {
        let binary = self.mode.save_binary(family);
        run(&binary, &["-t", table.name()], None)
    }

    fn enable_route_localnet(&mut self) -> Result<(), ExecError> {
        if let Some(was) =
            crate::route_localnet::record_and_enable(&self.proc_sys, &self.state_dir)?
        {
            self.route_localnet_notes.log(&was);
        }
        Ok(())
    }

    fn restore_route_localnet(&mut self) -> Result<(), ExecError> {
        crate::route_localnet::restore(&self.proc_sys, &self.state_dir)
    }

    fn list_chain(
        &mut self,
        family: Family,
        table: Table,
        chain: &str,
    ) -> Result<Option<String>, ExecError> {
        let binary = self.mode.tool_binary(family);
        match run(&binary, &["-w", "5", "-t", table.name(), "-S", chain], None) {
            Ok(text) => Ok(Some(text)),
            // "No chain/target/match by that name." (legacy); iptables-nft 1.8.9 says "chain
            // `X' in table `nat' is incompatible, use 'nft' tool." for a chain that is not
            // there, and "does not exist" for a missing table.
            Err(ExecError::Refused { message, .. })
                if message.contains("No chain")
                    || message.contains("incompatible")
                    || message.contains("does not exist") =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    fn watcher(&self) -> Option<Box<dyn Iptables>> {
        Some(Box::new(self.clone()))
    }

    fn notifies(&self) -> bool {
        self.mode == Mode::Nft
    }

    fn nats_in_kernel(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        format!("iptables-{}", self.mode.name())
    }

    fn chains_per_restore(&self) -> Option<usize> {
        match self.mode {
            Mode::Nft => Some(NFT_CHAINS_PER_RESTORE),
            // The legacy variant rewrites the whole table at every commit: one commit is best.
            Mode::Legacy => None,
        }
    }
}

/// Whether `family` can be programmed with `mode` (its nat table can be read), or the tool's
/// own error when not, so that the caller can say why ("Permission denied (you must be
/// root)" without `CAP_NET_RAW`). A node booted with IPv6 disabled cannot; kube-proxy then
/// runs IPv4 only, and so does kpng.
pub fn family_usable(mode: Mode, family: Family) -> Result<(), ExecError> {
    run(&mode.save_binary(family), &["-t", "nat"], None).map(drop)
}

/// Picks the variant the node already uses, as kube-proxy's image does (iptables-wrapper):
/// kubelet's hint chains first (`KUBE-IPTABLES-HINT`, `KUBE-KUBELET-CANARY` in mangle), then
/// whichever variant holds more rules; nft when undecided. A variant whose tools are missing
/// is never chosen.
pub fn detect_mode() -> Result<Mode, ExecError> {
    let available = |m: Mode| run(&m.save_binary(Family::V4), &["--version"], None).is_ok();
    let (legacy, nft) = (available(Mode::Legacy), available(Mode::Nft));
    match (legacy, nft) {
        (false, false) => {
            return Err(ExecError::Spawn {
                tool: "iptables-nft-save / iptables-legacy-save".into(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "neither iptables variant is installed",
                ),
            });
        }
        (true, false) => return Ok(Mode::Legacy),
        (false, true) => return Ok(Mode::Nft),
        (true, true) => {}
    }
    let legacy_names = std::fs::read_to_string(legacy_tables_names(Family::V4)).ok();
    let hinted = |m: Mode| {
        hint_readable(m, legacy_names.as_deref())
            && run(&m.save_binary(Family::V4), &["-t", "mangle"], None).is_ok_and(|text| {
                text.lines().any(|l| {
                    l.starts_with(":KUBE-IPTABLES-HINT ") || l.starts_with(":KUBE-KUBELET-CANARY ")
                })
            })
    };
    for m in [Mode::Nft, Mode::Legacy] {
        if hinted(m) {
            return Ok(m);
        }
    }
    let rules = |m: Mode| {
        Family::ALL
            .iter()
            .filter_map(|f| run(&m.save_binary(*f), &[], None).ok())
            .map(|text| text.lines().filter(|l| l.starts_with('-')).count())
            .sum::<usize>()
    };
    Ok(decide(rules(Mode::Legacy), rules(Mode::Nft)))
}

/// Whether the hint chains of `mode` are looked for in its mangle table: always with nft;
/// with legacy only when `legacy_names` (`/proc/net/ip_tables_names`, `None` when unreadable)
/// lists a mangle table. Reading a legacy table that does not exist creates it (with its
/// hooks), and from then on every `iptables-save` of the node warns "iptables-legacy tables
/// present"; a table that does not exist holds no hint anyway.
fn hint_readable(mode: Mode, legacy_names: Option<&str>) -> bool {
    match mode {
        Mode::Nft => true,
        Mode::Legacy => legacy_names.is_some_and(|names| lists_table(names, "mangle")),
    }
}

/// Where the kernel lists the legacy (x_tables) tables of `family` that exist.
fn legacy_tables_names(family: Family) -> &'static str {
    match family {
        Family::V4 => "/proc/net/ip_tables_names",
        Family::V6 => "/proc/net/ip6_tables_names",
    }
}

/// Whether `names` (one table name a line, as `/proc/net/ip_tables_names`) lists `table`.
fn lists_table(names: &str, table: &str) -> bool {
    names.lines().any(|l| l.trim() == table)
}

/// Whether legacy (x_tables) `table` of `family` exists, found without touching iptables:
/// reading a legacy table instantiates it, and with it netfilter hooks that every packet of
/// the node then crosses (the benchmark measured +5-10% on a connection's first packet).
/// Shared by the mode detection and the binary's leftover sweep and kube-proxy checks.
pub fn legacy_table_exists(family: Family, table: &str) -> bool {
    std::fs::read_to_string(legacy_tables_names(family)).is_ok_and(|t| lists_table(&t, table))
}

/// The variant with more rules; nft on a tie.
fn decide(legacy_rules: usize, nft_rules: usize) -> Mode {
    if legacy_rules > nft_rules {
        Mode::Legacy
    } else {
        Mode::Nft
    }
}

/// Prints every transaction instead of applying it (`--dry-run`); the kernel looks empty.
#[derive(Debug, Clone, Copy, Default)]
pub struct DryRun;

impl Iptables for DryRun {
    fn restore(&mut self, family: Family, input: &str) -> Result<(), ExecError> {
        println!("# {family} iptables-restore --noflush\n{input}");
        Ok(())
    }

    fn save(&mut self, _family: Family, _table: Table) -> Result<String, ExecError> {
        Ok(String::new())
    }

    fn enable_route_localnet(&mut self) -> Result<(), ExecError> {
        // The same line as the other sysctls a dry run leaves alone (docs/deploy.md).
        const KEY: &str = "/proc/sys/net/ipv4/conf/all/route_localnet";
        let current = std::fs::read_to_string(KEY)
            .map_or_else(|e| format!("unreadable: {e}"), |v| v.trim().to_string());
        println!("# would write 1 to {KEY} (now {current})");
        Ok(())
    }

    fn describe(&self) -> String {
        "dry run".into()
    }

    fn reads_kernel(&self) -> bool {
        false
    }
}

/// What a [`Recorder`] saw and will answer.
#[derive(Debug, Default)]
pub struct Recorded {
    /// Every restore input, with its family, in order.
    pub restores: Vec<(Family, String)>,
    /// What `save` returns per family and table (empty when absent).
    pub saved: Vec<(Family, Table, String)>,
    /// What `list_chain` returns per family, table and chain, before looking in `saved`
    /// (the canaries of an intact node, without a whole saved table).
    pub chains: Vec<(Family, Table, String, String)>,
    /// Fail this many of the next restores.
    pub fail_restores: usize,
    /// How often `route_localnet` was set.
    pub route_localnet: usize,
    /// Setting `route_localnet` fails (a read-only `/proc/sys`, as in an unprivileged Pod).
    pub route_localnet_read_only: bool,
    /// What [`Iptables::chains_per_restore`] answers.
    pub chains_per_restore: Option<usize>,
}

/// Records transactions for tests; shares its state with its clones.
#[derive(Debug, Clone, Default)]
pub struct Recorder(pub Arc<Mutex<Recorded>>);

impl Recorder {
    fn with<T>(&self, f: impl FnOnce(&mut Recorded) -> T) -> T {
        match self.0.lock() {
            Ok(mut g) => f(&mut g),
            Err(poisoned) => f(&mut poisoned.into_inner()),
        }
    }

    /// The restore inputs so far.
    pub fn restores(&self) -> Vec<(Family, String)> {
        self.with(|r| r.restores.clone())
    }
}

impl Iptables for Recorder {
    fn restore(&mut self, family: Family, input: &str) -> Result<(), ExecError> {
        self.with(|r| {
            r.restores.push((family, input.to_owned()));
            if r.fail_restores > 0 {
                r.fail_restores -= 1;
                return Err(ExecError::Refused {
                    tool: "iptables-restore".into(),
                    status: "exit status: 1".into(),
                    message: "iptables-restore: line 2 failed".into(),
                });
            }
            Ok(())
        })
    }

    fn save(&mut self, family: Family, table: Table) -> Result<String, ExecError> {
        Ok(self.with(|r| {
            r.saved
                .iter()
                .find(|(f, t, _)| *f == family && *t == table)
                .map(|(_, _, text)| text.clone())
                .unwrap_or_default()
        }))
    }

    fn list_chain(
        &mut self,
        family: Family,
        table: Table,
        chain: &str,
    ) -> Result<Option<String>, ExecError> {
        let listed = self.with(|r| {
            r.chains
                .iter()
                .find(|(f, t, c, _)| *f == family && *t == table && c == chain)
                .map(|(_, _, _, text)| text.clone())
        });
        if let Some(text) = listed {
            return Ok(Some(text));
        }
        Ok(chain_from_save(&self.save(family, table)?, chain))
    }

    fn enable_route_localnet(&mut self) -> Result<(), ExecError> {
        self.with(|r| {
            if r.route_localnet_read_only {
                return Err(ExecError::Io {
                    what: "setting /proc/sys/net/ipv4/conf/all/route_localnet".into(),
                    source: std::io::Error::from_raw_os_error(30),
                });
            }
            r.route_localnet += 1;
            Ok(())
        })
    }

    fn describe(&self) -> String {
        "recorder".into()
    }

    fn watcher(&self) -> Option<Box<dyn Iptables>> {
        Some(Box::new(self.clone()))
    }

    fn chains_per_restore(&self) -> Option<usize> {
        self.with(|r| r.chains_per_restore)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binaries_per_mode_and_family() {
        assert_eq!(
            Mode::Legacy.restore_binary(Family::V4),
            "iptables-legacy-restore"
        );
        assert_eq!(Mode::Nft.save_binary(Family::V6), "ip6tables-nft-save");
        assert_eq!(Mode::parse("nft"), Some(Mode::Nft));
        assert_eq!(Mode::parse("auto"), None);
    }

    #[test]
    fn the_variant_with_more_rules_wins_and_nft_breaks_ties() {
        assert_eq!(decide(10, 3), Mode::Legacy);
        assert_eq!(decide(3, 10), Mode::Nft);
        assert_eq!(decide(0, 0), Mode::Nft);
    }

    #[test]
    fn a_legacy_mangle_table_is_read_for_hints_only_when_it_exists() {
        // (mode, /proc/net/ip_tables_names, read)
        let cases: &[(Mode, Option<&str>, bool)] = &[
            (Mode::Nft, None, true),
            (Mode::Nft, Some(""), true),
            (Mode::Legacy, None, false),
            (Mode::Legacy, Some(""), false),
            (Mode::Legacy, Some("filter\nnat\n"), false),
            (Mode::Legacy, Some("nat\nmangle\nfilter\n"), true),
            (Mode::Legacy, Some("mangle2\n"), false),
        ];
        for (mode, names, read) in cases {
            assert_eq!(hint_readable(*mode, *names), *read, "{mode:?} {names:?}");
        }
    }
}
