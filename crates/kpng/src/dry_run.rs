//! `--dry-run`: print what would be done, change nothing, and let the kernel judge it.
//!
//! A dry run keeps watching its source and prints every transaction the backend would commit
//! (and, at start, the sysctls it would set), so that one can see what each change would do.
//! It opens no listener (no health, metrics or Service health-check server), writes no sysctl,
//! removes no leftover and cleans no conntrack entry. Each transaction is also checked by the
//! kernel without being committed (`nft --check`, `iptables-restore --test`) when this process
//! may ask (root, the tool installed); the first one the kernel refuses ends kpng with a
//! non-zero status, naming the error. When it may not ask, a note says so once and the dry
//! run goes on unchecked.

// The kernel checks exist where kernel backends do (Linux).
#![cfg_attr(not(target_os = "linux"), allow(dead_code))]

use tokio::sync::watch;

/// Where checkers report the first refusal; `serve` waits on the other end and exits with it.
#[derive(Debug, Clone)]
pub struct Refusals(watch::Sender<Option<String>>);

impl Refusals {
    /// A new channel: the reporting end and the receiving end.
    pub fn channel() -> (Refusals, watch::Receiver<Option<String>>) {
        let (tx, rx) = watch::channel(None);
        (Refusals(tx), rx)
    }

    /// Reports that the kernel would refuse a transaction (the first report wins).
    pub fn refuse(&self, why: String) {
        self.0.send_if_modified(|slot| {
            if slot.is_none() {
                *slot = Some(why);
                true
            } else {
                false
            }
        });
    }
}

/// Waits for the first refusal; never returns when there is none.
pub async fn refused(mut rx: watch::Receiver<Option<String>>) -> String {
    loop {
        if let Some(why) = rx.borrow_and_update().clone() {
            return why;
        }
        if rx.changed().await.is_err() {
            // Every checker is gone without a refusal: nothing will be refused any more.
            std::future::pending::<()>().await;
        }
    }
}

/// Whether a checker's failure means "this process may not ask the kernel" (not root, the
/// tool missing) rather than "the kernel refuses the transaction".
pub fn cannot_ask(message: &str) -> bool {
    let lower = message.to_lowercase();
    lower.contains("operation not permitted")
        || lower.contains("permission denied")
        || lower.contains("cannot run")
        || lower.contains("you must be root")
        || lower.contains("could not fetch rule set generation id")
}

/// The nft scripts a dry run has printed, per family, since that family's last full
/// transaction: a partial transaction is checked after them, in one `nft --check` batch, so
/// that it is judged against the table the dry run would have built, not the kernel's.
#[derive(Debug, Default)]
pub struct NftHistory {
    /// `(family word, scripts since its last full transaction)`.
    families: Vec<(&'static str, Vec<String>)>,
}

impl NftHistory {
    /// The family word (`ip`, `ip6`) a kpng script is about, from the table it names.
    fn family_of(script: &str, table: &str) -> Option<&'static str> {
        let v6 = script.contains(&format!(" ip6 {table}"));
        let v4 = script.contains(&format!(" ip {table}"));
        match (v4, v6) {
            (true, false) => Some("ip"),
            (false, true) => Some("ip6"),
            _ => None,
        }
    }

    /// The batch to check for `script`, and records it.
    pub fn batch_for(&mut self, script: &str, table: &str) -> String {
        let Some(family) = NftHistory::family_of(script, table) else {
            return script.to_string();
        };
        let full = script.contains(&format!("delete table {family} {table}"));
        let index = match self.families.iter().position(|(f, _)| *f == family) {
            Some(i) => i,
            None => {
                self.families.push((family, Vec::new()));
                self.families.len() - 1
            }
        };
        let earlier = &mut self.families[index].1;
        if full {
            earlier.clear();
        }
        let mut batch = earlier.concat();
        batch.push_str(script);
        if !batch.ends_with('\n') {
            batch.push('\n');
        }
        earlier.push(if script.ends_with('\n') {
            script.to_string()
        } else {
            format!("{script}\n")
        });
        batch
    }
}

#[cfg(target_os = "linux")]
pub use linux::{CheckedIptables, CheckedNft};

#[cfg(target_os = "linux")]
mod linux {
    use std::collections::BTreeSet;

    use kpng_backend_iptables::exec::{DryRun as IptablesDryRun, ExecError, Iptables, Mode};
    use kpng_backend_iptables::rules::Table;
    use kpng_backend_kit::exec::{DryRun, ScriptExec, run_tool};
    use kpng_model::Family;

    use super::{NftHistory, Refusals, cannot_ask};

    /// Prints every nft transaction (as the kit's dry run does) and checks it with
    /// `nft --check -f -`.
    pub struct CheckedNft {
        print: DryRun,
        binary: String,
        table: String,
        history: NftHistory,
        refusals: Refusals,
        checking: bool,
    }

    impl CheckedNft {
        /// Checks with `binary` (the `nft` tool) the transactions on `table`.
        pub fn new(binary: &str, table: &str, refusals: Refusals) -> CheckedNft {
            CheckedNft {
                print: kpng_backend_nft::exec::dry_run(),
                binary: binary.to_string(),
                table: table.to_string(),
                history: NftHistory::default(),
                refusals,
                checking: true,
            }
        }
    }

    impl ScriptExec for CheckedNft {
        fn run(&mut self, script: &str) -> Result<(), ExecError> {
            self.print.run(script)?;
            let batch = self.history.batch_for(script, &self.table);
            if !self.checking {
                return Ok(());
            }
            match run_tool(&self.binary, &["--check", "-f", "-"], Some(&batch)) {
                Ok(_) => {
                    println!("# (checked by the kernel: nft --check accepts it)");
                    Ok(())
                }
                Err(e) if cannot_ask(&e.to_string()) => {
                    self.checking = false;
                    tracing::info!(
                        "--dry-run: not checking transactions with the kernel ({e}); \
                         `nft --check` needs CAP_NET_ADMIN (root with its capabilities)"
                    );
                    Ok(())
                }
                Err(e) => {
                    self.refusals.refuse(format!(
                        "the kernel would refuse this nftables transaction: {e}"
                    ));
                    Err(e)
                }
            }
        }
    }

    /// Prints every iptables-restore input and checks each family's first (complete) one with
    /// `iptables-restore --test`; later ones build on chains the dry run never created, so
    /// they are only printed.
    pub struct CheckedIptables {
        /// The iptables backend's own dry run: what is printed, and an empty kernel.
        print: IptablesDryRun,
        mode: Option<Mode>,
        checked: BTreeSet<Family>,
        refusals: Refusals,
    }

    impl CheckedIptables {
        /// Checks with the tools of `mode` (`None`: no variant usable here; print only).
        pub fn new(mode: Option<Mode>, refusals: Refusals) -> CheckedIptables {
            CheckedIptables {
                print: IptablesDryRun,
                mode,
                checked: BTreeSet::new(),
                refusals,
            }
        }
    }

    impl Iptables for CheckedIptables {
        fn restore(&mut self, family: Family, input: &str) -> Result<(), ExecError> {
            self.print.restore(family, input)?;
            let Some(mode) = self.mode else {
                return Ok(());
            };
            if !self.checked.insert(family) {
                return Ok(());
            }
            let binary = mode.restore_binary(family);
            match run_tool(&binary, &["-w", "5", "--noflush", "--test"], Some(input)) {
                Ok(_) => {
                    println!("# (checked by the kernel: {binary} --test accepts it)");
                    Ok(())
                }
                Err(e) if cannot_ask(&e.to_string()) => {
                    self.mode = None;
                    tracing::info!(
                        "--dry-run: not checking transactions with the kernel ({e}); run as \
                         root for `iptables-restore --test`"
                    );
                    Ok(())
                }
                Err(e) => {
                    self.refusals.refuse(format!(
                        "the kernel would refuse this iptables transaction: {e}"
                    ));
                    Err(e)
                }
            }
        }

        fn save(&mut self, family: Family, table: Table) -> Result<String, ExecError> {
            self.print.save(family, table)
        }

        fn enable_route_localnet(&mut self) -> Result<(), ExecError> {
            self.print.enable_route_localnet()
        }

        fn describe(&self) -> String {
            self.print.describe()
        }

        fn reads_kernel(&self) -> bool {
            self.print.reads_kernel()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_transactions_are_checked_after_their_familys_last_full_one() {
        let mut h = NftHistory::default();
        let full4 = "add table ip kpng\ndelete table ip kpng\nadd table ip kpng\n";
        let full6 = "add table ip6 kpng\ndelete table ip6 kpng\nadd table ip6 kpng\n";
        assert_eq!(h.batch_for(full4, "kpng"), full4);
        assert_eq!(h.batch_for(full6, "kpng"), full6);
        let part4 = "add element ip kpng cluster-ips { 10.96.0.1 }\n";
        assert_eq!(h.batch_for(part4, "kpng"), format!("{full4}{part4}"));
        let part4b = "delete element ip kpng cluster-ips { 10.96.0.1 }";
        assert_eq!(
            h.batch_for(part4b, "kpng"),
            format!("{full4}{part4}{part4b}\n")
        );
        // A new full transaction starts over.
        assert_eq!(h.batch_for(full4, "kpng"), full4);
    }

    #[test]
    fn the_first_refusal_is_kept() {
        let (tx, rx) = Refusals::channel();
        tx.refuse("first".into());
        tx.refuse("second".into());
        assert_eq!(rx.borrow().as_deref(), Some("first"));
    }

    #[test]
    fn lack_of_privilege_is_not_a_refusal() {
        assert!(cannot_ask(
            "nft refused (exit status: 1): Error: Operation not permitted"
        ));
        assert!(cannot_ask("cannot run nft: No such file or directory"));
        assert!(!cannot_ask(
            "nft refused (exit status: 1): Error: syntax error, unexpected junk"
        ));
    }
}
