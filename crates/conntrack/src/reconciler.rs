//! One reconciliation pass: plan the dumps, dump (filtered in the kernel), decide, delete in
//! batches.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use kpng_model::{Change, Diff, Family, Protocol, ServicePort};

use crate::Error;
use crate::flow::{Flow, Tuple};
use crate::local_addrs::local_addresses;
use crate::socket::{ConntrackSocket, DeleteOutcome};
use crate::stale::{Frontend, StaleFilter};
use crate::wire::DumpFilter;

/// How many narrow dumps a pass may use when the table's size is unknown.
pub const FALLBACK_MAX_NARROW_DUMPS: usize = 4;

/// The size of the kernel's conntrack table, which decides how to dump it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableSize {
    /// Entries (`nf_conntrack_count`).
    pub entries: usize,
    /// Hash buckets (`nf_conntrack_buckets`).
    pub buckets: usize,
}

impl TableSize {
    /// Whether `n` dumps narrowed to one frontend each cost less than one dump that copies
    /// out every UDP entry. Every dump walks the whole table in the kernel; only matching
    /// entries are copied out. Measured on a 2-vCPU VM with kernel 6.18: a walk costs about
    /// 0.13 µs per bucket and 0.3 µs per entry, copying an entry out about 3 µs. With a
    /// million entries that allows about 8 narrow dumps; with ten thousand, none.
    ///
    /// Dumps cannot share that cost by running side by side: the kernel runs the first part of
    /// every ctnetlink dump (with a narrow filter, the whole walk) under one mutex, so two
    /// dumps on two sockets end one walk apart (measured: 5 narrow dumps at a million entries
    /// took 1.58 s one after the other and 1.70 s on two threads).
    pub fn narrow_dumps_pay_off(&self, n: usize) -> bool {
        let walk = self.buckets as u128 * 130 + self.entries as u128 * 300;
        let copy_everything = self.entries as u128 * 3000;
        n as u128 * walk <= copy_everything
    }
}

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

    /// Runs every dump of `filters`, one after the other, and calls `each` with the index of
    /// the dump and every entry it returned.
    ///
    /// # Errors
    /// When the table cannot be read (nothing is reported for a failed call, or only part).
    fn dump_all(
        &mut self,
        family: Family,
        filters: &[DumpFilter],
        each: &mut dyn FnMut(usize, &Flow),
    ) -> Result<(), Error> {
        for (i, filter) in filters.iter().enumerate() {
            self.dump(family, filter, &mut |flow| each(i, flow))?;
        }
        Ok(())
    }

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

    /// The table's size, when known.
    fn size(&mut self) -> Option<TableSize>;
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

/// How full this network namespace's conntrack table is: a full table makes the kernel evict
/// unreplied entries and, when it finds none, drop new connections' packets, Services
/// included, and nothing else says why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableUsage {
    /// Entries now (`nf_conntrack_count`).
    pub entries: usize,
    /// The limit (`nf_conntrack_max`).
    pub max: usize,
    /// Whether this process may write `nf_conntrack_max`: not outside the host network
    /// namespace (the table's size is the host's) nor where `/proc/sys` is mounted read-only,
    /// so advice to raise kpng's flags would not help there.
    pub max_writable: bool,
}

/// The table's usage now; `None` when conntrack is not loaded (no sysctls).
pub fn table_usage() -> Option<TableUsage> {
    Some(TableUsage {
        entries: read_sysctl("nf_conntrack_count")?,
        max: read_sysctl("nf_conntrack_max")?,
        // Opening for writing checks the permission and writes nothing.
        max_writable: std::fs::OpenOptions::new()
            .write(true)
            .open("/proc/sys/net/netfilter/nf_conntrack_max")
            .is_ok(),
    })
}

fn read_sysctl(name: &str) -> Option<usize> {
    std::fs::read_to_string(format!("/proc/sys/net/netfilter/{name}"))
        .ok()?
        .trim()
        .parse()
        .ok()
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

    fn size(&mut self) -> Option<TableSize> {
        Some(TableSize {
            entries: read_sysctl("nf_conntrack_count")?,
            buckets: read_sysctl("nf_conntrack_buckets")?,
        })
    }
}

/// What one pass did.
#[derive(Debug, Default)]
pub struct Pass {
    /// Frontends (Service IP:port pairs and node ports) with serving endpoints.
    pub frontends: usize,
    /// Of those, seen for the first time (their un-DNATed entries were looked for too).
    pub new_frontends: usize,
    /// The dumps requested from the kernel, in order.
    pub dumps: Vec<DumpFilter>,
    /// Entries the dumps returned.
    pub scanned: usize,
    /// Entries found stale.
    pub stale: usize,
    /// The Service ports (`namespace/name:port`, sorted, each once) whose entries were found
    /// stale: the deletion log line names them, so that "deleted=1" says whose clients were
    /// moved to a new endpoint.
    pub services: Vec<String>,
    /// What deleting them did.
    pub outcome: DeleteOutcome,
    /// How long the pass took.
    pub duration: Duration,
}

/// kube-proxy's conntrack reconciler for UDP Services.
///
/// After a successful sync that [`pass_needed`], [`Reconciler::reconcile`] deletes the UDP
/// entries of the family's Service ports that are pinned to something other than a serving
/// endpoint (the rule: [`StaleFilter`]), so that the client's next packet is load-balanced
/// anew instead of following the stale entry into a black hole. Nothing else is ever
/// deleted: TCP and SCTP entries, UDP entries of other destinations and entries of ports
/// without serving endpoints stay, also at start-up.
///
/// Reading the table is planned to touch as little as possible:
/// - a pass reads the DNATed UDP entries (one dump filtered in the kernel by protocol and
///   `IPS_DST_NAT`): every Service flow is DNATed once its port is programmed, so this finds
///   every entry pinned to a gone endpoint;
/// - a frontend seen for the first time (a new Service IP or node port, a port that got
///   serving endpoints back, every frontend after a restart) may also have entries that were
///   never DNATed (sent before it was programmed: their reply source is the frontend
///   itself); those are read with one dump per new frontend filtered by destination in the
///   kernel (each is a walk of the whole table in the kernel, which no filter avoids:
///   ctnetlink matches one destination per dump), or, when there are many new frontends in a
///   large table, with one dump of every UDP entry (see [`TableSize::narrow_dumps_pay_off`]).
pub struct Reconciler {
    table: Box<dyn FlowTable>,
    /// Frontends whose entries (DNATed or not) a successful pass has checked, per family.
    checked: HashMap<Family, HashSet<Frontend>>,
    /// Grows whenever `checked` changes: a caller that keeps it elsewhere writes it only then.
    checked_version: u64,
    max_narrow_dumps: Option<usize>,
}

impl std::fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconciler")
            .field("checked", &self.checked)
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
            checked: HashMap::new(),
            checked_version: 0,
            max_narrow_dumps: None,
        }
    }

    /// Fixes how many narrow dumps a pass may use instead of deciding from the table's size
    /// (0: new frontends are always found with one dump of every UDP entry). For
    /// benchmarks and tests.
    pub fn with_max_narrow_dumps(mut self, max: usize) -> Reconciler {
        self.max_narrow_dumps = Some(max);
        self
    }

    /// Forgets which frontends were checked: the next pass looks for never-DNATed entries of
    /// every frontend, as after a restart.
    pub fn forget_checked(&mut self) {
        if !self.checked.is_empty() {
            self.checked.clear();
            self.checked_version += 1;
        }
    }

    /// The frontends a successful pass has checked, per family: what
    /// [`crate::memory::MemoryFile`] keeps across a restart.
    pub fn checked(&self) -> &crate::memory::Checked {
        &self.checked
    }

    /// Changes whenever [`Reconciler::checked`] does (and only then), so that keeping it
    /// elsewhere costs nothing in a sync that changed nothing.
    pub fn checked_version(&self) -> u64 {
        self.checked_version
    }

    /// Takes `frontends` of `family` as checked, as a restart whose backend kept the last
    /// run's rules in place may (see [`crate::memory`]): the next pass reads their DNATed
    /// entries only. Frontends the next pass does not see are dropped by it.
    pub fn assume_checked(&mut self, family: Family, frontends: HashSet<Frontend>) {
        self.checked.entry(family).or_default().extend(frontends);
        self.checked_version += 1;
    }

    /// Forgets the frontends of `family` that `diff` takes out of the rules or leaves without
    /// serving endpoints: a removed UDP port, a dropped external or load-balancer IP, a
    /// changed node port, a port scaled to zero. Call it after every successful sync, with or
    /// without a pass.
    ///
    /// Why: a pass runs only after a sync that can strand entries, and a removal cannot; but
    /// while a frontend is out of the rules, a client's packets to it are not DNATed, and if
    /// the frontend comes back (a Service re-created with the same IP, as kube-dns often is)
    /// those never-DNATed entries are stale. Remembered as checked, it would be read by the
    /// DNAT dump alone and they would stay; forgotten, it is new again and read whole. A port
    /// scaled to zero keeps a rule (its traffic is rejected, which leaves no entry) but is
    /// forgotten too, as a port back from zero has always been new: one walk more, never an
    /// entry left.
    pub fn forget_gone(&mut self, family: Family, diff: &Diff) {
        let Some(checked) = self.checked.get_mut(&family) else {
            return;
        };
        for (key, change) in &diff.changes {
            let Some(old) = &change.old else {
                continue;
            };
            if key.family != family || key.protocol != Protocol::Udp {
                continue;
            }
            let kept: HashSet<Frontend> = change
                .new
                .iter()
                .flat_map(|new| dnat_frontends(new))
                .collect();
            for frontend in frontends_of(old) {
                if !kept.contains(&frontend) && checked.remove(&frontend) {
                    self.checked_version += 1;
                }
            }
        }
    }

    /// Forgets the frontends of `family` that none of `ports` (the whole desired state, as a
    /// full sync programs it) keeps in the rules with serving endpoints: what
    /// [`Reconciler::forget_gone`] does for a diff, for a full sync, whose diff names no
    /// removal.
    pub fn keep_only<'a>(
        &mut self,
        family: Family,
        ports: impl IntoIterator<Item = &'a ServicePort>,
    ) {
        let Some(checked) = self.checked.get_mut(&family) else {
            return;
        };
        let kept: HashSet<Frontend> = ports
            .into_iter()
            .filter(|p| p.key.family == family && p.key.protocol == Protocol::Udp)
            .flat_map(dnat_frontends)
            .collect();
        let before = checked.len();
        checked.retain(|f| kept.contains(f));
        if checked.len() != before {
            self.checked_version += 1;
        }
    }

    /// The dumps of a pass: the DNATed UDP entries, plus every entry of each new frontend
    /// (narrow dumps, or one dump of every UDP entry when that is cheaper). When every
    /// frontend is new (after a start-up) the narrow dumps alone see every entry that matters.
    fn plan(&mut self, new: &[Frontend], all_new: bool) -> Vec<DumpFilter> {
        if new.is_empty() {
            return vec![DumpFilter::UdpDnat];
        }
        let narrow = match self.max_narrow_dumps {
            Some(max) => new.len() <= max,
            None => match self.table.size() {
                Some(size) => size.narrow_dumps_pay_off(new.len()),
                None => new.len() <= FALLBACK_MAX_NARROW_DUMPS,
            },
        };
        if !narrow {
            return vec![DumpFilter::Udp];
        }
        let dnat = (!all_new).then_some(DumpFilter::UdpDnat);
        dnat.into_iter()
            .chain(new.iter().map(Frontend::dump))
            .collect()
    }

    /// One pass over the UDP ports among `ports` of `family` (pass all of the family's ports:
    /// frontends missing from `ports` count as gone).
    ///
    /// # Errors
    /// When the table cannot be read or written; nothing is half-decided (a failed dump
    /// deletes nothing) and the pass's new frontends stay new for the next one. Refusals of
    /// single deletes are counted in [`Pass::outcome`].
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
            if self.checked.remove(&family).is_some() {
                self.checked_version += 1;
            }
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
        // Only the frontends the rules DNAT are remembered (and looked for as new): one whose
        // endpoints are all serving but none usable is in the backend's no-endpoint sets, so
        // a restart's look at the rules (the nftables dispatch maps) would not find it.
        let dnat: HashSet<Frontend> = ports.iter().flat_map(|p| dnat_frontends(p)).collect();
        let filter = StaleFilter::new(family, ports.iter().copied(), &local);
        let frontends = filter.frontends();
        let new: Vec<Frontend> = {
            let checked = self.checked.get(&family);
            frontends
                .iter()
                .filter(|f| dnat.contains(f) && !checked.is_some_and(|c| c.contains(f)))
                .copied()
                .collect()
        };
        let dumps = self.plan(&new, new.len() == frontends.len());
        let mut pass = Pass {
            frontends: frontends.len(),
            new_frontends: new.len(),
            ..Pass::default()
        };
        let mut stale: Vec<Flow> = Vec::new();
        let mut seen: HashSet<Tuple> = HashSet::new();
        let scanned = &mut pass.scanned;
        self.table.dump_all(family, &dumps, &mut |i, flow| {
            *scanned += 1;
            // Re-checked: older kernels ignore (parts of) the dump filter.
            let wanted = dumps.get(i).is_some_and(|dump| dump.matches(flow));
            if wanted && filter.is_stale(flow) && seen.insert(flow.original) {
                stale.push(*flow);
            }
        })?;
        pass.dumps = dumps;
        pass.stale = stale.len();
        pass.services = services_of(&stale, &ports, &local);
        if !stale.is_empty() {
            pass.outcome = self.table.delete(&stale)?;
        }
        let now: HashSet<Frontend> = frontends.into_iter().filter(|f| dnat.contains(f)).collect();
        if self.checked.insert(family, now.clone()).as_ref() != Some(&now) {
            self.checked_version += 1;
        }
        pass.duration = started.elapsed();
        Ok(pass)
    }
}

/// The Service ports (`namespace/name:port`, sorted, each once) whose frontend each of `stale`
/// was sent to: a Service IP and port, or a node port on one of the node's `local` addresses.
fn services_of(stale: &[Flow], ports: &[&ServicePort], local: &[IpAddr]) -> Vec<String> {
    let mut out = std::collections::BTreeSet::new();
    for flow in stale {
        let dst = flow.original.dst;
        for port in ports {
            let hit = frontends_of(port).any(|f| match f {
                Frontend::Ip(addr) => addr == dst,
                Frontend::NodePort(p) => p == dst.port() && local.contains(&dst.ip()),
            });
            if hit {
                out.insert(format!("{}:{}", port.key.service, port.key.port_name));
            }
        }
    }
    out.into_iter().collect()
}

/// The frontends of `port` whose traffic the rules DNAT to endpoints, as every backend
/// programs them (and kube-proxy): the ClusterIP when the endpoints for internal traffic are
/// not empty, the external and load-balancer IPs and the node port when any endpoint is usable
/// (ready, or serving and terminating). A serving endpoint that is neither ready nor
/// terminating is not used (upstream's `CategorizeEndpoints`), so a port whose endpoints are
/// all such has its frontends in the no-endpoint sets; its conntrack entries are still judged
/// against the serving endpoints ([`StaleFilter`]), as upstream's cleanup does.
fn dnat_frontends(port: &ServicePort) -> impl Iterator<Item = Frontend> + '_ {
    let cluster_ip = (!port.internal_endpoints().is_empty())
        .then(|| Frontend::Ip(std::net::SocketAddr::new(port.cluster_ip, port.port)));
    let external = port
        .has_any_endpoints
        .then(|| {
            port.external_ips
                .iter()
                .chain(&port.load_balancer_ips)
                .map(|ip| Frontend::Ip(std::net::SocketAddr::new(*ip, port.port)))
                .chain(port.node_port.map(Frontend::NodePort))
        })
        .into_iter()
        .flatten();
    cluster_ip.into_iter().chain(external)
}

fn frontends_of(port: &ServicePort) -> impl Iterator<Item = Frontend> + '_ {
    std::iter::once(&port.cluster_ip)
        .chain(&port.external_ips)
        .chain(&port.load_balancer_ips)
        .map(|ip| Frontend::Ip(std::net::SocketAddr::new(*ip, port.port)))
        .chain(port.node_port.map(Frontend::NodePort))
}

/// Whether a change can leave entries stale: the port (UDP, with serving endpoints now) is
/// new, got its first serving endpoints, lost a serving endpoint, or gained a frontend.
/// Growing or removing a port cannot (a removed port's entries are left to expire, as
/// upstream does).
fn may_leave_stale_entries(change: &Change) -> bool {
    let Some(new) = &change.new else {
        return false;
    };
    if new.key.protocol != Protocol::Udp || new.serving_endpoints.is_empty() {
        return false;
    }
    let Some(old) = &change.old else {
        return true;
    };
    if old.serving_endpoints.is_empty() {
        return true;
    }
    let lost_an_endpoint = old
        .serving_endpoints
        .iter()
        .any(|e| new.serving_endpoints.binary_search(e).is_err());
    let old_frontends: HashSet<Frontend> = frontends_of(old).collect();
    lost_an_endpoint || frontends_of(new).any(|f| !old_frontends.contains(&f))
}

/// Whether a sync needs a pass for `family`: always after a full sync (start-up, recovery,
/// the periodic full resync), else when a UDP port of the family changed in a way that can
/// leave entries stale. Most endpoint changes (scale-ups, TCP Services) need none.
pub fn pass_needed(family: Family, diff: &Diff, full: bool) -> bool {
    full || diff
        .changes
        .iter()
        .any(|(key, change)| key.family == family && may_leave_stale_entries(change))
}

#[cfg(test)]
mod tests;
