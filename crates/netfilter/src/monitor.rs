//! Watching our nftables tables for changes made by someone else (`nft delete table ip kpng`,
//! `nft flush ruleset`, a deleted rule or element), within milliseconds.
//!
//! How: a `NETLINK_NETFILTER` socket subscribed to `NFNLGRP_NFTABLES` receives one notification
//! per object every committed transaction touched, table name included. The hard part is
//! telling our own commits from others': a notification names the sender's netlink port id,
//! but kpng commits through three channels (its netlink writer, libnftables, an `nft -f -`
//! child) whose port ids are not all known. So ownership is decided by *time window* instead:
//! the kernel queues every notification of a commit on our socket before the commit returns
//! to its sender, so the backend brackets its commits with [`TableMonitor::begin_own`] and
//! [`TableMonitor::end_own`], and everything in between is ours (the socket even leaves the
//! group meanwhile, so that our own large commits cost the kernel no notifications); what is
//! read at any other time (by the monitor's thread, or drained at `begin_own`) is someone
//! else's. A
//! foreign change committed *during* one of our syncs (milliseconds) is not notified; the
//! backend tells it by the kernel's generation id ([`crate::generation`]).
//!
//! Not tampering: elements the kernel itself adds or removes (port id 0: the packet path's
//! dynamic sets, timeouts) and elements of the sets named as dynamic (ClientIP affinity).
//! A receive-queue overflow outside our window (`ENOBUFS`: notifications were lost) counts as
//! tampering, since what was lost is unknown.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use kpng_backend::TamperAlarm;
use kpng_model::Family;
use tracing::debug;

use crate::attr::{
    self, NFGENMSG_LEN, NFNL_SUBSYS_NFTABLES, NLMSG_HDRLEN, string_attr, u16_at, u32_at,
};
use crate::socket::{Socket, Waker};
use crate::{MonitorError, io_err};

/// `NFNLGRP_NFTABLES`: the multicast group of nf_tables notifications.
const NFNLGRP_NFTABLES: libc::c_int = 7;
/// Receive buffer asked for: a burst (`nft flush ruleset` of a large table) should not
/// overflow it; our own full syncs may, harmlessly.
const RCVBUF: libc::c_int = 4 << 20;
/// How long the thread pauses after a failed wait before it waits again (an error, not
/// the idle path: at idle it sleeps until a notification arrives or it is stopped).
const RETRY_MS: u64 = 200;
/// How long a drain waits for the rest of a transaction that deleted a table (its
/// notifications are queued while the kernel commits it), at most [`TRANSACTION_END_WAITS`]
/// times.
const TRANSACTION_END_MS: i32 = 20;
/// See [`TRANSACTION_END_MS`].
const TRANSACTION_END_WAITS: u32 = 5;
/// The attribute that names the table in table, chain, rule, set, element, object and
/// flowtable messages alike (`NFTA_TABLE_NAME`, `NFTA_CHAIN_TABLE`, `NFTA_RULE_TABLE`, …).
const ATTR_TABLE: u16 = 1;
/// The set name in set and element messages (`NFTA_SET_NAME`, `NFTA_SET_ELEM_LIST_SET`).
const ATTR_SET: u16 = 2;
/// The chain of a rule message (`NFTA_RULE_CHAIN`).
const ATTR_RULE_CHAIN: u16 = 2;
/// The name of a chain message (`NFTA_CHAIN_NAME`).
const ATTR_CHAIN_NAME: u16 = 3;

/// nf_tables message types (`NFT_MSG_*`) that notifications carry.
fn message_name(msg: u16) -> &'static str {
    match msg {
        0 => "table added",
        2 => "table deleted",
        3 => "chain added",
        5 => "chain deleted",
        6 => "rule added",
        8 => "rule deleted",
        9 => "set added",
        11 => "set deleted",
        12 => "element added",
        14 => "element deleted",
        18 => "object added",
        20 => "object deleted",
        22 => "flowtable added",
        24 => "flowtable deleted",
        _ => "changed",
    }
}

/// How much a change says about what happened, for choosing one to report among those read
/// together: a table gone, then a chain, a named set, a rule, an element; additions last (an
/// anonymous set, `__set0`, goes with the rule that held it).
fn significance(note: &Notification) -> u8 {
    let anonymous = note.set.as_deref().is_some_and(|s| s.starts_with("__"));
    match note.msg {
        2 => 6,
        5 => 5,
        11 if !anonymous => 4,
        8 => 3,
        14 => 2,
        _ => 1,
    }
}

/// `NFT_MSG_NEWGEN`: the kernel's last notification of every committed transaction.
const MSG_NEWGEN: u16 = 15;
/// `NFTA_GEN_PROC_PID` of a `NFT_MSG_NEWGEN`: the committing process's pid (big-endian).
const ATTR_GEN_PROC_PID: u16 = 2;
/// `NFTA_GEN_PROC_NAME` of a `NFT_MSG_NEWGEN`: the committing process's name (its `comm`).
const ATTR_GEN_PROC_NAME: u16 = 3;
/// `NFT_MSG_NEWTABLE`.
const MSG_NEWTABLE: u16 = 0;
/// `NFT_MSG_DELTABLE`.
const MSG_DELTABLE: u16 = 2;

/// Someone else's changes read together, reported as one line.
#[derive(Debug, Default)]
pub struct Burst {
    /// The most telling change so far, with its [`significance`].
    telling: Option<(u8, String)>,
    /// Every table deleted (`ip kpng`): `nft flush ruleset` deletes both families' tables,
    /// and an operator told of one only would look for the other in vain.
    deleted: Vec<String>,
    /// Watched tables added after they were deleted: a restore of a whole table
    /// (`iptables-restore` of a saved `filter`, a host firewall's reload) deletes the table
    /// and adds it again in one transaction, which is a replacement, not a deletion.
    re_added: Vec<String>,
    /// A table was deleted and its transaction's end (`NFT_MSG_NEWGEN`) has not been read yet:
    /// the rest of it may still re-add the table.
    transaction_open: bool,
    /// A change reported was read and its transaction's end has not been: the process that
    /// end names made it.
    unattributed: bool,
    /// The processes whose transactions made the changes reported, in order, each once.
    by: Vec<Process>,
}

/// The process that committed a transaction, as the kernel names it at the transaction's end
/// (what `nft monitor` prints as "by process 1234 (nft)").
///
/// Why: a repair line said only that someone else changed the rules; who did (`nft`, a
/// firewall daemon, `iptables-restore`) is what an operator must find next, and after the fact
/// nothing else records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    /// Its pid, as the initial PID namespace (the host) numbers it.
    pub pid: u32,
    /// Its name (`comm`: at most 15 bytes, control characters escaped).
    pub name: String,
}

impl std::fmt::Display for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.pid, self.name)
    }
}

impl Burst {
    /// Takes `note`, someone else's change to what `watched` names; returns whether it is
    /// tampering.
    pub fn take(&mut self, watched: &Watched, note: &Notification) -> bool {
        match watched.tampering(note) {
            Some(what) => {
                self.add(note, what);
                true
            }
            None => {
                self.add_other(note, watched.table_of(note).as_deref());
                false
            }
        }
    }

    /// Takes `note`, someone else's change described as `what` ([`Watched::tampering`]).
    pub fn add(&mut self, note: &Notification, what: String) {
        self.unattributed = true;
        if note.msg == MSG_DELTABLE
            && let Some((table, _)) = what.split_once(": ")
        {
            if !self.deleted.iter().any(|d| d == table) {
                self.deleted.push(table.to_string());
            }
            self.re_added.retain(|t| t != table);
            self.transaction_open = true;
        }
        if note.msg == MSG_NEWTABLE {
            // Our own tables count every change: their re-creation is one as well.
            self.add_other(note, what.split_once(": ").map(|(table, _)| table));
        }
        let rank = significance(note);
        if self.telling.as_ref().is_none_or(|(best, _)| rank > *best) {
            self.telling = Some((rank, what));
        }
    }

    /// Takes someone else's change that is no tampering by itself: a watched table (named
    /// `table`, as in [`Watched::tampering`]'s lines) added, or the end of a transaction.
    pub fn add_other(&mut self, note: &Notification, table: Option<&str>) {
        match (note.msg, table) {
            (MSG_NEWTABLE, Some(table))
                if self.deleted.iter().any(|d| d == table)
                    && !self.re_added.iter().any(|t| t == table) =>
            {
                self.re_added.push(table.to_string());
            }
            (MSG_NEWGEN, _) => {
                self.transaction_open = false;
                if std::mem::take(&mut self.unattributed)
                    && let Some(process) = &note.process
                    && !self.by.contains(process)
                {
                    self.by.push(process.clone());
                }
            }
            _ => {}
        }
    }

    /// Whether a table was deleted in a transaction whose end has not been read: the
    /// notifications that follow may show it was replaced rather than deleted.
    pub fn awaits_transaction_end(&self) -> bool {
        self.transaction_open
    }

    /// The line to report: the most telling change, with every table deleted named; tables
    /// deleted and added again are said to be replaced, with what that did to ours; then the
    /// processes that made the changes (`by process 1234 (nft)`), when the kernel named them.
    pub fn report(self) -> Option<String> {
        let by = match self.by.as_slice() {
            [] => String::new(),
            [one] => format!(" by process {one}"),
            many => format!(
                " by processes {}",
                many.iter()
                    .map(Process::to_string)
                    .collect::<Vec<_>>()
                    .join(" and ")
            ),
        };
        self.what().map(|what| what + &by)
    }

    /// [`Burst::report`] without the processes.
    fn what(self) -> Option<String> {
        let (rank, what) = self.telling?;
        if rank != 6 {
            return Some(what);
        }
        let gone: Vec<&String> = self
            .deleted
            .iter()
            .filter(|d| !self.re_added.contains(d))
            .collect();
        let mut parts = Vec::new();
        if !self.re_added.is_empty() {
            parts.push(format!(
                "{}: table replaced as a whole (a restore of the table, as iptables-restore or a \
                 firewall reload does): kpng's chains and jumps in it were removed or replaced",
                self.re_added.join(" and ")
            ));
        }
        if gone.len() > 1 || (!gone.is_empty() && !self.re_added.is_empty()) {
            let names: Vec<&str> = gone.iter().map(|g| g.as_str()).collect();
            parts.push(format!("{}: table deleted", names.join(" and ")));
        }
        Some(if parts.is_empty() {
            what
        } else {
            parts.join("; ")
        })
    }
}

fn is_element(msg: u16) -> bool {
    msg == 12 || msg == 14
}

fn is_rule(msg: u16) -> bool {
    msg == 6 || msg == 8
}

fn is_chain(msg: u16) -> bool {
    msg == 3 || msg == 5
}

/// The table-family byte of `nfgenmsg` (`NFPROTO_IPV4`, `NFPROTO_IPV6`).
fn nfproto(family: Family) -> u8 {
    match family {
        Family::V4 => libc::NFPROTO_IPV4 as u8,
        Family::V6 => libc::NFPROTO_IPV6 as u8,
    }
}

/// One nf_tables notification, as far as watching needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// `NFT_MSG_*`.
    pub msg: u16,
    /// `nfgenmsg.nfgen_family`.
    pub nfproto: u8,
    /// The table it concerns, when it names one.
    pub table: Option<String>,
    /// The set it concerns (set and element messages).
    pub set: Option<String>,
    /// The chain it concerns (chain and rule messages).
    pub chain: Option<String>,
    /// A rule message's attributes as sent (its expressions hold the name of a chain it jumps
    /// to); empty for other messages.
    pub rule: Vec<u8>,
    /// The sender's netlink port id (0: the kernel itself).
    pub portid: u32,
    /// The process that committed the transaction (a transaction's end, `NFT_MSG_NEWGEN`, only).
    pub process: Option<Process>,
}

/// Decodes every nf_tables notification of one datagram (others are skipped; a truncated
/// message ends the walk).
pub fn parse_notifications(datagram: &[u8]) -> Vec<Notification> {
    let mut out = Vec::new();
    for msg in attr::messages(datagram) {
        let (Some(kind), Some(portid)) = (u16_at(msg, 4), u32_at(msg, 12)) else {
            continue;
        };
        if kind >> 8 != NFNL_SUBSYS_NFTABLES || msg.len() < NLMSG_HDRLEN + NFGENMSG_LEN {
            continue;
        }
        let mut n = Notification {
            msg: kind & 0xff,
            nfproto: msg[NLMSG_HDRLEN],
            table: None,
            set: None,
            chain: None,
            rule: Vec::new(),
            portid,
            process: None,
        };
        if is_rule(n.msg) {
            n.rule = msg[NLMSG_HDRLEN + NFGENMSG_LEN..].to_vec();
        }
        if n.msg == MSG_NEWGEN {
            n.process = generation_process(msg);
            out.push(n);
            continue;
        }
        for (ty, payload) in attr::nf_attrs(msg) {
            match ty {
                ATTR_TABLE => n.table = Some(string_attr(payload)),
                ATTR_SET if matches!(n.msg, 9 | 11 | 12 | 14) => n.set = Some(string_attr(payload)),
                ATTR_RULE_CHAIN if is_rule(n.msg) => n.chain = Some(string_attr(payload)),
                ATTR_CHAIN_NAME if is_chain(n.msg) => n.chain = Some(string_attr(payload)),
                _ => {}
            }
        }
        out.push(n);
    }
    out
}

/// The process a transaction's end (`NFT_MSG_NEWGEN`) names, when it names one (Linux 5.3+).
fn generation_process(msg: &[u8]) -> Option<Process> {
    let mut pid = None;
    let mut name = None;
    for (ty, payload) in attr::nf_attrs(msg) {
        match ty {
            ATTR_GEN_PROC_PID => {
                pid = payload
                    .get(..4)
                    .and_then(|b| b.try_into().ok())
                    .map(u32::from_be_bytes);
            }
            ATTR_GEN_PROC_NAME => {
                name = Some(
                    string_attr(payload)
                        .chars()
                        .flat_map(char::escape_default)
                        .take(64)
                        .collect(),
                );
            }
            _ => {}
        }
    }
    Some(Process {
        pid: pid?,
        name: name.unwrap_or_else(|| "?".to_string()),
    })
}

/// What to watch.
#[derive(Debug, Clone)]
pub struct Watched {
    /// Our tables, by family.
    pub tables: Vec<(Family, String)>,
    /// Sets whose elements change on their own (the packet path, timeouts).
    pub dynamic_sets: Vec<String>,
    /// For tables others use too (iptables-nft's `nat`, `filter`, `mangle`): only changes to
    /// these chains count. `None`: the tables are ours alone, every change counts.
    pub chains: Option<OurChains>,
}

/// Our chains in tables shared with others: what of a shared table is ours to mind.
#[derive(Debug, Clone)]
pub struct OurChains {
    /// Whether a chain is ours (its rules added or deleted, or itself deleted, is tampering).
    pub is_ours: fn(&str) -> bool,
    /// Our chains that rules of other chains (the built-in ones) jump to: deleting such a rule
    /// is tampering too. A delete notification carries the whole rule, so the target's name is
    /// in it.
    pub jump_targets: Vec<String>,
}

impl OurChains {
    /// Whether `n`, a change in a shared table, touches what we own.
    fn touched(&self, n: &Notification) -> bool {
        let ours = n.chain.as_deref().is_some_and(self.is_ours);
        match n.msg {
            // The table gone (`nft flush ruleset`, `nft delete table ip nat`).
            2 => true,
            // One of our chains deleted.
            5 => ours,
            // A rule added to or deleted from one of our chains.
            6 => ours,
            // A rule deleted elsewhere that jumped to one of our chains.
            8 => ours || self.jump_targets.iter().any(|t| attr::names(&n.rule, t)),
            // Tables and chains added, sets, elements, objects: not ours in a shared table.
            _ => false,
        }
    }
}

impl Watched {
    /// The watched table `n` concerns, as the report lines name it (`ip filter`).
    pub fn table_of(&self, n: &Notification) -> Option<String> {
        let table = n.table.as_deref()?;
        let (family, _) = self
            .tables
            .iter()
            .find(|(f, t)| nfproto(*f) == n.nfproto && t == table)?;
        let fam = match family {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        };
        Some(format!("{fam} {table}"))
    }

    /// Why `n` is someone else's change to our tables, or `None` when it is not ours to mind.
    pub fn tampering(&self, n: &Notification) -> Option<String> {
        let table = n.table.as_deref()?;
        let (family, _) = self
            .tables
            .iter()
            .find(|(f, t)| nfproto(*f) == n.nfproto && t == table)?;
        if let Some(ours) = &self.chains {
            if !ours.touched(n) {
                return None;
            }
            let fam = match family {
                Family::V4 => "ip",
                Family::V6 => "ip6",
            };
            let what = message_name(n.msg);
            return Some(match &n.chain {
                Some(chain) => format!("{fam} {table}: {what} ({chain})"),
                None => format!("{fam} {table}: {what}"),
            });
        }
        if is_element(n.msg)
            && (n.portid == 0
                || n.set
                    .as_deref()
                    .is_some_and(|s| self.dynamic_sets.iter().any(|d| d == s)))
        {
            return None;
        }
        let what = message_name(n.msg);
        let fam = match family {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        };
        Some(match &n.set {
            Some(set) => format!("{fam} {table}: {what} ({set})"),
            None => format!("{fam} {table}: {what}"),
        })
    }
}

struct Inner {
    buf: Vec<u8>,
    /// Between `begin_own` and `end_own`: what is read is ours.
    own: bool,
}

struct Shared {
    /// Waited on without the lock; read only with it (reads are serialised by `inner`).
    sock: Socket,
    inner: Mutex<Inner>,
    watched: Watched,
    alarm: TamperAlarm,
    stop: AtomicBool,
    /// Woken on stop: the thread waits on it and the socket together, with no timeout, so an
    /// idle node's thread never wakes (it woke 5 times a second to look at `stop`).
    waker: Waker,
    /// How often the thread woke with nothing to read and no stop (diagnostics and tests:
    /// it should stay 0).
    idle_wakeups: AtomicU64,
    /// Someone else changed our tables since the backend last asked.
    tampered: AtomicBool,
    own_seen: AtomicU64,
    foreign_seen: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while draining leaves nothing half-done worth refusing.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Joins or leaves `NFNLGRP_NFTABLES`.
    fn membership(&self, join: bool) -> io::Result<()> {
        let option = if join {
            libc::NETLINK_ADD_MEMBERSHIP
        } else {
            libc::NETLINK_DROP_MEMBERSHIP
        };
        self.sock
            .set_opt(libc::SOL_NETLINK, option, NFNLGRP_NFTABLES)
    }

    /// Reads everything queued, attributing it to us when inside our window. Someone else's
    /// changes read together are reported as the most telling of them: `nft delete table`
    /// sends its rules' deletions before the table's, and "table deleted" is what happened.
    fn drain(&self, inner: &mut Inner) {
        let mut burst = Burst::default();
        let mut waits_for_end = TRANSACTION_END_WAITS;
        loop {
            let Inner { buf, own } = &mut *inner;
            match self.sock.recv(buf, true) {
                Ok(0) => break,
                Ok(n) => {
                    for note in parse_notifications(&buf[..n]) {
                        if *own {
                            if self.watched.tampering(&note).is_some() {
                                self.own_seen.fetch_add(1, Ordering::Relaxed);
                            }
                        } else if burst.take(&self.watched, &note) {
                            self.foreign_seen.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                // The kernel queues a transaction's notifications as it commits: a table's
                // deletion read without its transaction's end may yet be followed by the
                // table's re-creation (a restore), so wait a moment for the rest.
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        && burst.awaits_transaction_end()
                        && waits_for_end > 0 =>
                {
                    waits_for_end -= 1;
                    if !matches!(self.sock.wait_readable(TRANSACTION_END_MS), Ok(true)) {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    if !*own {
                        self.foreign_seen.fetch_add(1, Ordering::Relaxed);
                        burst.telling = Some((
                            u8::MAX,
                            "notifications were lost (receive queue full)".into(),
                        ));
                    }
                }
                Err(e) => {
                    debug!("reading nftables notifications: {e}");
                    break;
                }
            }
        }
        if let Some(what) = burst.report() {
            self.raise_once(what);
        }
    }

    /// Someone else's change: the alarm is raised for the first of a burst only (until the
    /// backend's next sync looks), so a `nft flush ruleset` is one report, not thousands.
    fn raise_once(&self, what: String) {
        if !self.tampered.swap(true, Ordering::SeqCst) {
            self.alarm.raise(what);
        }
    }
}

/// Watches our tables on a thread of its own; stops when dropped.
pub struct TableMonitor {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for TableMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableMonitor")
            .field("watched", &self.shared.watched)
            .finish()
    }
}

impl TableMonitor {
    /// Subscribes, in the calling thread's network namespace, and starts the thread that
    /// raises `alarm` for every foreign change to `watched`.
    pub fn start(watched: Watched, alarm: TamperAlarm) -> Result<TableMonitor, MonitorError> {
        let sock = Socket::open().map_err(io_err("opening a NETLINK_NETFILTER socket"))?;
        if sock
            .set_opt(libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, RCVBUF)
            .is_err()
        {
            let _ = sock.set_opt(libc::SOL_SOCKET, libc::SO_RCVBUF, RCVBUF);
        }
        sock.bind_auto()
            .map_err(io_err("binding the notification socket"))?;
        sock.set_opt(
            libc::SOL_NETLINK,
            libc::NETLINK_ADD_MEMBERSHIP,
            NFNLGRP_NFTABLES,
        )
        .map_err(io_err("subscribing to nftables notifications"))?;
        let waker = Waker::new().map_err(io_err("creating the watcher thread's eventfd"))?;
        let shared = Arc::new(Shared {
            sock,
            inner: Mutex::new(Inner {
                buf: vec![0; 256 * 1024],
                own: false,
            }),
            watched,
            alarm,
            stop: AtomicBool::new(false),
            waker,
            idle_wakeups: AtomicU64::new(0),
            tampered: AtomicBool::new(false),
            own_seen: AtomicU64::new(0),
            foreign_seen: AtomicU64::new(0),
        });
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("kpng-nft-watch".into())
            .spawn(move || watch(&thread_shared))
            .map_err(io_err("starting the nftables watcher thread"))?;
        Ok(TableMonitor {
            shared,
            thread: Some(thread),
        })
    }

    /// Starts one of our own transactions (or several): what was queued before is someone
    /// else's. Returns whether someone else changed our tables since the last call.
    ///
    /// Until [`TableMonitor::end_own`] the socket leaves the multicast group: what happens
    /// meanwhile would count as ours anyway, and without a listener the kernel builds no
    /// notification at all (a full sync of 300k elements would otherwise make it build 300k
    /// messages, and this thread parse them).
    pub fn begin_own(&self) -> bool {
        let mut inner = self.shared.lock();
        self.shared.drain(&mut inner);
        inner.own = true;
        if let Err(e) = self.shared.membership(false) {
            debug!("leaving the nftables notification group: {e}");
        }
        self.shared.tampered.swap(false, Ordering::SeqCst)
    }

    /// Ends our transactions: everything they caused is ours; watching resumes.
    pub fn end_own(&self) {
        let mut inner = self.shared.lock();
        if let Err(e) = self.shared.membership(true) {
            // Without the group nothing more would be seen: say so loudly.
            tracing::warn!(
                "rejoining the nftables notification group: {e}; tampering goes unnoticed"
            );
        }
        self.shared.drain(&mut inner);
        inner.own = false;
    }

    /// Notifications taken for ours so far (few: the socket leaves the group while our own
    /// transactions run; diagnostics only).
    pub fn own_seen(&self) -> u64 {
        self.shared.own_seen.load(Ordering::Relaxed)
    }

    /// Foreign changes seen so far.
    pub fn foreign_seen(&self) -> u64 {
        self.shared.foreign_seen.load(Ordering::Relaxed)
    }

    /// How often the watcher thread woke with nothing to read (diagnostics: an idle monitor
    /// must not cost a small node periodic wakeups; 0 unless a wait failed).
    pub fn idle_wakeups(&self) -> u64 {
        self.shared.idle_wakeups.load(Ordering::Relaxed)
    }
}

impl Drop for TableMonitor {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Err(e) = self.shared.waker.wake() {
            // Cannot happen with an open eventfd; the thread would then never end: leave it.
            debug!("waking the nftables watcher thread to stop: {e}");
            return;
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn watch(shared: &Shared) {
    while !shared.stop.load(Ordering::SeqCst) {
        // Wait without the lock, so that our own syncs are never held up; with no timeout:
        // a stop wakes the waker.
        match shared.sock.wait_readable_or_woken(&shared.waker) {
            Ok((_, true)) => {}
            Ok((true, false)) => {
                let mut inner = shared.lock();
                shared.drain(&mut inner);
            }
            Ok((false, false)) => {
                shared.idle_wakeups.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                shared.idle_wakeups.fetch_add(1, Ordering::Relaxed);
                debug!("waiting for nftables notifications: {e}");
                std::thread::sleep(std::time::Duration::from_millis(RETRY_MS));
            }
        }
    }
}

#[cfg(test)]
mod tests;
