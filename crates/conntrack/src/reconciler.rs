//! One reconciliation pass: dump (filtered in the kernel), decide, delete in batches.

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use kpng_model::{Diff, Family, Protocol, ServicePort, Snapshot};

use crate::Error;
use crate::flow::{Flow, Tuple};
use crate::local_addrs::local_addresses;
use crate::socket::{ConntrackSocket, DeleteOutcome};
use crate::stale::StaleFilter;
use crate::wire::DumpFilter;

/// Narrow (per-frontend) dumps are used up to this many frontends; beyond, one dump of every
/// UDP entry. A narrow dump costs one walk of the kernel's hash table (tens of milliseconds
/// with a million entries) but copies out only the frontend's entries; a UDP dump walks once
/// and copies out every UDP entry (about a microsecond each).
pub const DEFAULT_MAX_NARROW_DUMPS: usize = 8;

/// Where conntrack entries live: the kernel ([`KernelTable`]) or a fake in tests.
pub trait FlowTable: Send {
    /// Calls `each` for every entry of `family` that passes `filter`.
    ///
    /// # Errors
    /// When the table cannot be read.
    fn dump(
        &mut self,
        family: Family,
        filter: &DumpFilter,
        each: &mut dyn FnMut(&Flow),
    ) -> Result<(), Error>;

    /// Deletes exactly these entries.
    ///
    /// # Errors
    /// When the table cannot be written at all (single refusals are counted instead).
    fn delete(&mut self, flows: &[Flow]) -> Result<DeleteOutcome, Error>;

    /// The node's own addresses of `family`, on which node ports are served.
    ///
    /// # Errors
    /// When they cannot be listed.
    fn local_addresses(&mut self, family: Family) -> Result<Vec<IpAddr>, Error>;
}

/// The conntrack table of the network namespace the process runs in.
///
/// Holds one netfilter socket for the process's lifetime; after an error it is dropped
/// (it may be stuck inside a dump) and a new one is opened on next use.
#[derive(Debug)]
pub struct KernelTable {
    socket: Option<ConntrackSocket>,
}

impl KernelTable {
    /// Opens the socket (it does not check permissions: the first dump does).
    ///
    /// # Errors
    /// When no netfilter netlink socket can be opened.
    pub fn open() -> Result<KernelTable, Error> {
        Ok(KernelTable {
            socket: Some(ConntrackSocket::open()?),
        })
    }

    fn with_socket<T>(
        &mut self,
        f: impl FnOnce(&mut ConntrackSocket) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut socket = match self.socket.take() {
            Some(s) => s,
            None => ConntrackSocket::open()?,
        };
        let result = f(&mut socket);
        if result.is_ok() {
            self.socket = Some(socket);
        }
        result
    }
}

impl FlowTable for KernelTable {
    fn dump(
        &mut self,
        family: Family,
        filter: &DumpFilter,
        each: &mut dyn FnMut(&Flow),
    ) -> Result<(), Error> {
        self.with_socket(|s| s.dump(family, filter, each).map(drop))
    }

    fn delete(&mut self, flows: &[Flow]) -> Result<DeleteOutcome, Error> {
        self.with_socket(|s| s.delete(flows))
    }

    fn local_addresses(&mut self, family: Family) -> Result<Vec<IpAddr>, Error> {
        local_addresses(family)
    }
}

/// What one pass did.
#[derive(Debug, Default)]
pub struct Pass {
    /// Frontends (Service IP:port pairs and node ports) checked.
    pub frontends: usize,
    /// Dumps requested from the kernel (0 when no UDP port had serving endpoints).
    pub dumps: usize,
    /// Entries the dumps returned.
    pub scanned: usize,
    /// Entries found stale.
    pub stale: usize,
    /// What deleting them did.
    pub outcome: DeleteOutcome,
    /// How long the pass took.
    pub duration: Duration,
}

/// kube-proxy's conntrack reconciler for UDP Services.
///
/// After a successful sync, [`Reconciler::reconcile`] deletes the UDP entries of the given
/// Service ports that are pinned to something other than a serving endpoint (see
/// [`StaleFilter`] for the rule), so that the client's next packet is load-balanced anew
/// instead of following the stale entry into a black hole. Nothing else is ever deleted:
/// TCP and SCTP entries, UDP entries of other destinations and entries of ports without
/// serving endpoints stay, also at start-up.
pub struct Reconciler {
    table: Box<dyn FlowTable>,
    max_narrow_dumps: usize,
}

impl std::fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconciler")
            .field("max_narrow_dumps", &self.max_narrow_dumps)
            .finish_non_exhaustive()
    }
}

impl Reconciler {
    /// A reconciler of the kernel's table of this network namespace.
    ///
    /// # Errors
    /// When no netfilter netlink socket can be opened.
    pub fn open() -> Result<Reconciler, Error> {
        Ok(Reconciler::new(Box::new(KernelTable::open()?)))
    }

    /// A reconciler of any table (tests use a fake).
    pub fn new(table: Box<dyn FlowTable>) -> Reconciler {
        Reconciler {
            table,
            max_narrow_dumps: DEFAULT_MAX_NARROW_DUMPS,
        }
    }

    /// Up to how many frontends each gets its own kernel-filtered dump (default
    /// [`DEFAULT_MAX_NARROW_DUMPS`]; 0 always dumps every UDP entry).
    pub fn with_max_narrow_dumps(mut self, max: usize) -> Reconciler {
        self.max_narrow_dumps = max;
        self
    }

    /// One pass over the UDP ports among `ports` of `family`.
    ///
    /// # Errors
    /// When the table cannot be read or written; nothing is half-decided (a failed dump
    /// deletes nothing). Refusals of single deletes are counted in [`Pass::outcome`].
    pub fn reconcile<'a>(
        &mut self,
        family: Family,
        ports: impl IntoIterator<Item = &'a ServicePort>,
    ) -> Result<Pass, Error> {
        let started = Instant::now();
        let ports: Vec<&ServicePort> = ports
            .into_iter()
            .filter(|p| {
                p.key.protocol == Protocol::Udp
                    && p.key.family == family
                    && !p.serving_endpoints.is_empty()
            })
            .collect();
        if ports.is_empty() {
            return Ok(Pass {
                duration: started.elapsed(),
                ..Pass::default()
            });
        }
        let local = if ports.iter().any(|p| p.node_port.is_some()) {
            self.table.local_addresses(family)?
        } else {
            Vec::new()
        };
        let filter = StaleFilter::new(family, ports, &local);
        let dumps = filter.dumps(self.max_narrow_dumps);
        let mut pass = Pass {
            frontends: filter.frontend_count(),
            dumps: dumps.len(),
            ..Pass::default()
        };
        let mut stale: Vec<Flow> = Vec::new();
        let mut seen: HashSet<Tuple> = HashSet::new();
        for dump in &dumps {
            let scanned = &mut pass.scanned;
            self.table.dump(family, dump, &mut |flow| {
                *scanned += 1;
                // Re-checked: kernels before 5.8 ignore the dump filter.
                if dump.matches(flow) && filter.is_stale(flow) && seen.insert(flow.original) {
                    stale.push(*flow);
                }
            })?;
        }
        pass.stale = stale.len();
        if !stale.is_empty() {
            pass.outcome = self.table.delete(&stale)?;
        }
        pass.duration = started.elapsed();
        Ok(pass)
    }
}

/// The Service ports of `family` a pass after a sync must check: every UDP port after a full
/// sync (start-up, recovery, the periodic full resync), else the UDP ports the sync changed
/// (their new state). Empty when no UDP port changed: then no pass is needed at all.
///
/// Checking only changed ports is enough between full syncs: entries can only become stale
/// when their port's serving endpoints or frontends change, and such a port is in the diff
/// of the sync that programs the change.
pub fn ports_to_check<'a>(
    family: Family,
    diff: &'a Diff,
    snapshot: &'a Snapshot,
    full: bool,
) -> Vec<&'a ServicePort> {
    let udp = |p: &&ServicePort| p.key.protocol == Protocol::Udp && p.key.family == family;
    if full {
        snapshot.family(family).map(|p| &**p).filter(udp).collect()
    } else {
        diff.upserted().map(|(_, p)| &**p).filter(udp).collect()
    }
}

#[cfg(test)]
mod tests;
