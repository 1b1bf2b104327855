//! Watching our iptables chains for someone else's flush or delete (`iptables -t nat -F`,
//! `iptables -t filter -X`), within a second, for both variants.
//!
//! Why canaries and a poll: the legacy (x_tables) kernel API sends no notifications, so the
//! only way to notice a flush is to look. Looking must be cheap, so a check lists a single
//! chain (`iptables -t TABLE -S CHAIN`), never a whole table: per table, one of our chains
//! that always holds rules while our rules are in place (`KUBE-POSTROUTING` in nat,
//! `KUBE-FORWARD` in filter; a flush empties it, a delete removes it) or, in mangle, the
//! `KUBE-PROXY-CANARY` chain (kube-proxy's canary: a delete removes it); and the built-in
//! chains `PREROUTING` and `OUTPUT` of nat, which must still jump to `KUBE-SERVICES` (a flush
//! of `PREROUTING` alone, or the jump deleted, leaves every chain of ours intact and every
//! Service dead for pods). nat is checked every [`CHECK_INTERVAL`] (a flushed nat table is
//! what breaks Services), the others in turn ([`canaries`]). A family is checked only while its rules are known to be committed (the backend
//! arms it after a full sync and disarms it when a sync fails), and is disarmed once it has
//! raised the alarm until the repairing sync re-arms it, so one flush is one repair. Checks
//! never overlap our own restores (they share a lock), although each restore is atomic per
//! table anyway.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use kpng_backend::TamperAlarm;
use kpng_model::Family;
use tracing::debug;

use crate::exec::{ExecError, Iptables};
use crate::rules::{CANARY, FORWARD, POSTROUTING, SERVICES, Table};

/// Time between two checks of a family (its nat table; the other canaries in turn).
pub const CHECK_INTERVAL: Duration = Duration::from_millis(400);

/// What one check looks at: a chain of a table, and what it must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Canary {
    /// The table.
    pub table: Table,
    /// The chain in it: ours, or a built-in one holding our jump.
    pub chain: &'static str,
    /// Whether the chain always holds rules while ours are in place (so a flush shows).
    pub has_rules: bool,
    /// A chain of ours the chain must jump to (a built-in chain's jump into our rules).
    pub jumps_to: Option<&'static str>,
}

impl Canary {
    const fn ours(table: Table, chain: &'static str, has_rules: bool) -> Canary {
        Canary {
            table,
            chain,
            has_rules,
            jumps_to: None,
        }
    }

    const fn jump(table: Table, chain: &'static str, to: &'static str) -> Canary {
        Canary {
            table,
            chain,
            has_rules: true,
            jumps_to: Some(to),
        }
    }
}

/// The canaries of one check round (`round` counts from 0), two listings per family: in nat,
/// `KUBE-POSTROUTING` and `PREROUTING`'s jump in turn (a flush of the table shows in both,
/// so it is seen every round; the jump alone every other, 0.8 s); then filter's
/// `KUBE-FORWARD`, mangle's canary and nat `OUTPUT`'s jump in turn (each every third round).
pub fn canaries(round: u64) -> Vec<Canary> {
    let nat = if round.is_multiple_of(2) {
        Canary::ours(Table::Nat, POSTROUTING, true)
    } else {
        Canary::jump(Table::Nat, "PREROUTING", SERVICES)
    };
    let other = match round % 3 {
        0 => Canary::ours(Table::Filter, FORWARD, true),
        1 => Canary::ours(Table::Mangle, CANARY, false),
        _ => Canary::jump(Table::Nat, "OUTPUT", SERVICES),
    };
    vec![nat, other]
}

/// Every canary of a family, each once: what the periodic sync and the confirmation after a
/// repair check (upstream's canaries are in mangle, nat and filter alike), nat first (a
/// flushed nat table is what breaks Services). One chain listing each, never a table.
pub fn every_canary() -> [Canary; 5] {
    [
        Canary::ours(Table::Nat, POSTROUTING, true),
        Canary::jump(Table::Nat, "PREROUTING", SERVICES),
        Canary::jump(Table::Nat, "OUTPUT", SERVICES),
        Canary::ours(Table::Filter, FORWARD, true),
        Canary::ours(Table::Mangle, CANARY, false),
    ]
}

/// Judges one listing (`None`: the chain does not exist): why it shows tampering, if it does.
pub fn judge(family: Family, canary: Canary, listing: Option<&str>) -> Option<String> {
    let table = canary.table.name();
    let chain = canary.chain;
    match (listing, canary.jumps_to) {
        (None, _) => Some(format!("{family} {table}: chain {chain} was deleted")),
        (Some(text), Some(to))
            if !text.lines().any(|l| {
                l.starts_with("-A ")
                    && l.split_whitespace()
                        .collect::<Vec<_>>()
                        .ends_with(&["-j", to])
            }) =>
        {
            Some(format!(
                "{family} {table}: chain {chain} lost its jump to {to}"
            ))
        }
        (Some(text), _) if canary.has_rules && !text.lines().any(|l| l.starts_with("-A ")) => {
            Some(format!("{family} {table}: chain {chain} was flushed"))
        }
        (Some(_), _) => None,
    }
}

/// Shared by the backend and the checking thread.
#[derive(Debug, Default)]
pub struct WatchState {
    /// Families whose rules are committed and should be intact.
    armed: Mutex<BTreeSet<Family>>,
    /// Held by the backend while it restores, and by a check while it reads.
    busy: Mutex<()>,
    stop: AtomicBool,
}

impl WatchState {
    fn armed(&self) -> MutexGuard<'_, BTreeSet<Family>> {
        self.armed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Held while our own transactions run.
    pub fn busy(&self) -> MutexGuard<'_, ()> {
        self.busy.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets whether `family`'s rules are committed (checked) or not.
    pub fn arm(&self, family: Family, armed: bool) {
        let mut set = self.armed();
        if armed {
            set.insert(family);
        } else {
            set.remove(&family);
        }
    }

    /// One check round: the tampering found, each family reported (and disarmed) once.
    pub fn check_round(&self, ipt: &mut dyn Iptables, round: u64) -> Vec<String> {
        let _busy = self.busy();
        let families: Vec<Family> = self.armed().iter().copied().collect();
        let mut found = Vec::new();
        for family in families {
            for canary in canaries(round) {
                match ipt.list_chain(family, canary.table, canary.chain) {
                    Ok(listing) => {
                        if let Some(what) = judge(family, canary, listing.as_deref()) {
                            self.arm(family, false);
                            found.push(what);
                            break;
                        }
                    }
                    Err(e) => debug!("checking {family} {}: {e}", canary.table.name()),
                }
            }
        }
        found
    }
}

/// The checking thread; stops when dropped.
#[derive(Debug)]
pub struct Watcher {
    state: Arc<WatchState>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    /// Starts checking with `ipt` (a second handle on the node's iptables), raising `alarm`.
    pub fn start(
        state: Arc<WatchState>,
        mut ipt: Box<dyn Iptables>,
        alarm: TamperAlarm,
    ) -> Result<Watcher, ExecError> {
        let shared = state.clone();
        let thread = std::thread::Builder::new()
            .name("kpng-ipt-watch".into())
            .spawn(move || {
                let mut round = 0u64;
                while !shared.stop.load(Ordering::SeqCst) {
                    std::thread::sleep(CHECK_INTERVAL);
                    for what in shared.check_round(ipt.as_mut(), round) {
                        alarm.raise(what);
                    }
                    round += 1;
                }
            })
            .map_err(|source| ExecError::Io {
                what: "starting the iptables watcher thread".into(),
                source,
            })?;
        Ok(Watcher {
            state,
            thread: Some(thread),
        })
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{Recorded, Recorder};

    #[test]
    fn judging_a_listing() {
        let nat = canaries(0)[0];
        let mangle = canaries(1)[1];
        let prerouting = canaries(1)[0];
        let cases: &[(&str, Canary, Option<&str>, Option<&str>)] = &[
            (
                "intact",
                nat,
                Some("-N KUBE-POSTROUTING\n-A KUBE-POSTROUTING -j RETURN\n"),
                None,
            ),
            (
                "flushed",
                nat,
                Some("-N KUBE-POSTROUTING\n"),
                Some("IPv4 nat: chain KUBE-POSTROUTING was flushed"),
            ),
            (
                "deleted",
                nat,
                None,
                Some("IPv4 nat: chain KUBE-POSTROUTING was deleted"),
            ),
            (
                "empty canary is fine",
                mangle,
                Some("-N KUBE-PROXY-CANARY\n"),
                None,
            ),
            (
                "canary deleted",
                mangle,
                None,
                Some("IPv4 mangle: chain KUBE-PROXY-CANARY was deleted"),
            ),
            (
                "the jump in place, among others",
                prerouting,
                Some(
                    "-P PREROUTING ACCEPT\n-A PREROUTING -j CNI-HOSTPORT-DNAT\n\
                     -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n",
                ),
                None,
            ),
            (
                "PREROUTING flushed",
                prerouting,
                Some("-P PREROUTING ACCEPT\n"),
                Some("IPv4 nat: chain PREROUTING lost its jump to KUBE-SERVICES"),
            ),
            (
                "only someone else's jump left",
                prerouting,
                Some("-P PREROUTING ACCEPT\n-A PREROUTING -j KUBE-SERVICES-OTHER\n"),
                Some("IPv4 nat: chain PREROUTING lost its jump to KUBE-SERVICES"),
            ),
        ];
        for (name, canary, listing, want) in cases {
            assert_eq!(
                judge(Family::V4, *canary, *listing).as_deref(),
                *want,
                "{name}"
            );
        }
    }

    #[test]
    fn rounds_take_the_other_canaries_in_turn_and_always_check_nat() {
        let chains = |r| -> Vec<String> {
            canaries(r)
                .iter()
                .map(|c| format!("{} {}", c.table.name(), c.chain))
                .collect()
        };
        assert_eq!(chains(0), ["nat KUBE-POSTROUTING", "filter KUBE-FORWARD"]);
        assert_eq!(chains(1), ["nat PREROUTING", "mangle KUBE-PROXY-CANARY"]);
        assert_eq!(chains(2), ["nat KUBE-POSTROUTING", "nat OUTPUT"]);
        assert_eq!(chains(3), ["nat PREROUTING", "filter KUBE-FORWARD"]);
        assert_eq!(chains(6), chains(0));
    }

    #[test]
    fn only_armed_families_are_checked_and_each_is_reported_once() {
        let recorder = Recorder::default();
        let state = WatchState::default();
        let mut ipt = recorder.clone();
        // Nothing armed: nothing read, nothing found although nothing exists.
        assert!(state.check_round(&mut ipt, 0).is_empty());
        state.arm(Family::V4, true);
        let intact = "*nat\n:KUBE-POSTROUTING - [0:0]\n-A KUBE-POSTROUTING -j RETURN\nCOMMIT\n\
                      *filter\n:KUBE-FORWARD - [0:0]\n-A KUBE-FORWARD -j ACCEPT\nCOMMIT\n";
        recorder.0.lock().expect("lock").saved = vec![
            (Family::V4, Table::Nat, intact.into()),
            (Family::V4, Table::Filter, intact.into()),
        ];
        assert!(state.check_round(&mut ipt, 0).is_empty());
        *recorder.0.lock().expect("lock") = Recorded::default();
        assert_eq!(
            state.check_round(&mut ipt, 0),
            ["IPv4 nat: chain KUBE-POSTROUTING was deleted"]
        );
        assert!(state.check_round(&mut ipt, 1).is_empty(), "reported once");
    }
}
