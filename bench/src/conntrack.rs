//! UDP conntrack cleanup: one reconciler pass with many unrelated entries in the table.
//!
//! In a fresh network namespace (its own conntrack table) the benchmark creates N unrelated
//! UDP entries over netlink (clients of the node talking to outside servers on ports that
//! Services use too), entries that look related but must stay (to a serving endpoint, to
//! another port of the Service IP, TCP, a node port on a foreign address) and a handful of
//! stale ones (DNATed to a deleted endpoint or to a port the endpoint no longer serves, and
//! never DNATed). It then times reconciler passes exactly as kpng runs them after a sync,
//! and checks by the namespace's entry count that each deleted the stale entries and
//! nothing else:
//! - the first pass after a start-up, when every frontend is new (never-DNATed entries are
//!   looked for too);
//! - a pass after an endpoint change (steady state: DNATed entries only, one dump);
//! - the first pass after a restart whose backend kept the rules in place, the last run's
//!   checked frontends remembered (`kpng_conntrack::memory`): an endpoint changed while kpng
//!   was down, so DNATed entries are stale, and never-DNATed ones cannot exist;
//! - for comparison, a first pass that reads every UDP entry in one dump.
//!
//! `nf_conntrack_max` is global: it is raised for the run (from the initial namespace) and
//! restored afterwards. The pass itself runs in a child process inside the namespace
//! (`kpng-bench conntrack-inner`), which prints one line of figures.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kpng_conntrack::{ConntrackSocket, Flow, IPPROTO_TCP, Reconciler, Tuple};
use kpng_model::{Family, PortKey, Protocol, ServiceKey, ServicePort};
use kpng_testkit::Netns;

const MAX_PATH: &str = "/proc/sys/net/netfilter/nf_conntrack_max";
const COUNT_PATH: &str = "/proc/sys/net/netfilter/nf_conntrack_count";
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 100, 1);
const DNS_PORT: u16 = 53;
const NODE_PORT: u16 = 30053;
const SERVING: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 7);
const DELETED: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 9);
/// Other UDP Services in the model (their frontends have no entries).
const OTHER_SERVICES: u8 = 3;
const TIMEOUT: Duration = Duration::from_secs(3600);

/// Figures of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct ConntrackResult {
    /// Unrelated entries created.
    pub unrelated: usize,
    /// Time to create every entry (netlink, batched).
    create: Duration,
    /// The first pass after a start-up.
    pub first: PassFigures,
    /// A pass after an endpoint change.
    pub after_change: PassFigures,
    /// The first pass after a restart that kept the rules, the last run's checks remembered.
    pub restart: PassFigures,
    /// A first pass reading every UDP entry in one dump.
    pub full_dump: PassFigures,
}

/// One pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PassFigures {
    /// Wall time of the pass.
    pub duration: Duration,
    /// Dumps requested.
    dumps: usize,
    /// Entries the dumps returned.
    scanned: usize,
    /// Entries deleted.
    pub deleted: usize,
    /// Stale entries created before the pass.
    pub stale: usize,
    /// Entries in the table before and after the pass.
    before: usize,
    after: usize,
}

impl PassFigures {
    /// Deleted exactly the stale entries, nothing else.
    pub fn exact(&self) -> bool {
        self.deleted == self.stale && self.before.checked_sub(self.after) == Some(self.stale)
    }

    fn line(&self) -> String {
        format!(
            "{} {} {} {} {} {} {}",
            self.duration.as_micros(),
            self.dumps,
            self.scanned,
            self.deleted,
            self.stale,
            self.before,
            self.after
        )
    }

    fn parse(words: &[&str]) -> Option<PassFigures> {
        let n = |i: usize| words.get(i).and_then(|w| w.parse::<u64>().ok());
        Some(PassFigures {
            duration: Duration::from_micros(n(0)?),
            dumps: usize::try_from(n(1)?).ok()?,
            scanned: usize::try_from(n(2)?).ok()?,
            deleted: usize::try_from(n(3)?).ok()?,
            stale: usize::try_from(n(4)?).ok()?,
            before: usize::try_from(n(5)?).ok()?,
            after: usize::try_from(n(6)?).ok()?,
        })
    }
}

impl ConntrackResult {
    /// The report section.
    pub fn markdown(&self) -> String {
        let row = |what: &str, p: &PassFigures| {
            format!(
                "| {what} | {:.0} ms | {} | {} | {} of {} | {} |\n",
                p.duration.as_secs_f64() * 1000.0,
                p.dumps,
                p.scanned,
                p.deleted,
                p.stale,
                if p.exact() { "none" } else { "**some**" },
            )
        };
        format!(
            "{} unrelated entries in the table (created over netlink in {:.1} s), kube-dns-like UDP \
             Service with a node port plus {OTHER_SERVICES} other UDP Services.\n\n\
             | pass | time | dumps | entries read | stale deleted | unrelated deleted |\n|---|---|---|---|---|---|\n{}{}{}{}",
            self.unrelated,
            self.create.as_secs_f64(),
            row(
                "after an endpoint change (steady state)",
                &self.after_change
            ),
            row(
                "first pass after a start-up (every frontend new)",
                &self.first
            ),
            row(
                "first pass after a restart that kept the rules (the last run's checks remembered)",
                &self.restart
            ),
            row("first pass, every UDP entry in one dump", &self.full_dump),
        )
    }
}

/// Restores `nf_conntrack_max` when dropped.
struct MaxGuard(Option<String>);

impl Drop for MaxGuard {
    fn drop(&mut self) {
        if let Some(old) = self.0.take()
            && let Err(e) = std::fs::write(MAX_PATH, &old)
        {
            eprintln!("kpng-bench: restoring {MAX_PATH} to {}: {e}", old.trim());
        }
    }
}

fn read_number(path: &str) -> Result<usize, String> {
    std::fs::read_to_string(path)
        .map_err(|e| format!("reading {path}: {e}"))?
        .trim()
        .parse()
        .map_err(|e| format!("parsing {path}: {e}"))
}

/// `kpng-bench conntrack --entries N`: the whole benchmark, from the initial namespace.
pub fn run(entries: usize) -> Result<ConntrackResult, String> {
    if !kpng_testkit::is_root() {
        return Err("needs root (network namespaces, conntrack)".into());
    }
    let old = std::fs::read_to_string(MAX_PATH).map_err(|e| format!("reading {MAX_PATH}: {e}"))?;
    let current: usize = old.trim().parse().map_err(|e| format!("{MAX_PATH}: {e}"))?;
    let in_use = read_number(COUNT_PATH).unwrap_or(0);
    // Room for this run next to whatever the machine already tracks.
    let needed = in_use + entries * 2 + 100_000;
    let _guard = if current != 0 && current < needed {
        std::fs::write(MAX_PATH, needed.to_string())
            .map_err(|e| format!("raising {MAX_PATH} to {needed}: {e}"))?;
        MaxGuard(Some(old))
    } else {
        MaxGuard(None)
    };
    let ns = Netns::new("ctbench").map_err(|e| e.to_string())?;
    ns.ip(["addr", "add", &format!("{NODE_IP}/32"), "dev", "lo"])
        .map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| format!("locating kpng-bench: {e}"))?;
    let out = ns
        .command([
            exe.display().to_string(),
            "conntrack-inner".into(),
            "--entries".into(),
            entries.to_string(),
        ])
        .output()
        .map_err(|e| format!("running the pass in the namespace: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "conntrack-inner failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let words: Vec<&str> = text.split_whitespace().collect();
    let parsed = (|| {
        Some(ConntrackResult {
            unrelated: words.first()?.parse().ok()?,
            create: Duration::from_micros(words.get(1)?.parse().ok()?),
            first: PassFigures::parse(words.get(2..9)?)?,
            after_change: PassFigures::parse(words.get(9..16)?)?,
            full_dump: PassFigures::parse(words.get(16..23)?)?,
            restart: PassFigures::parse(words.get(23..30)?)?,
        })
    })();
    parsed.ok_or_else(|| format!("conntrack-inner printed {text:?}"))
}

fn v4(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(ip), port)
}

/// Entry number `i` of the unrelated bulk: a client of the node talking UDP to some server
/// (no NAT), on ports that Services also use.
fn unrelated(i: usize) -> Flow {
    let b = i.to_be_bytes();
    let n = b.len();
    let client = v4(
        Ipv4Addr::new(10, 1 + b[n - 3] % 200, b[n - 2], b[n - 1]),
        40000,
    );
    let ports = [DNS_PORT, 123, 443, 8125, 4789];
    let server = v4(
        Ipv4Addr::new(198, 18, b[n - 2], b[n - 1]),
        ports[i % ports.len()],
    );
    Flow::udp(Tuple::new(client, server), Tuple::new(server, client))
}

/// A client → `dst` entry answered by `reply_src`.
fn pinned(client: u8, dst: SocketAddr, reply_src: SocketAddr) -> Flow {
    let client = v4(Ipv4Addr::new(10, 244, 1, client), 5000);
    Flow::udp(Tuple::new(client, dst), Tuple::new(reply_src, client))
}

/// Entries that look related but must stay.
fn lookalikes() -> Vec<Flow> {
    let vip = v4(VIP, DNS_PORT);
    let mut out: Vec<Flow> = (0..100)
        .map(|i| pinned(100 + i, vip, v4(SERVING, DNS_PORT)))
        .collect();
    // Another port of the Service IP, not a UDP Service port.
    out.push(pinned(1, v4(VIP, 5353), v4(DELETED, 5353)));
    // TCP is never touched.
    let mut tcp = pinned(2, vip, v4(DELETED, DNS_PORT));
    tcp.protocol = IPPROTO_TCP;
    out.push(tcp);
    // The node port on an address that is not the node's: someone else's flows.
    let foreign = v4(Ipv4Addr::new(192, 168, 100, 2), NODE_PORT);
    out.push(pinned(3, foreign, foreign));
    out.push(pinned(4, foreign, v4(DELETED, DNS_PORT)));
    out
}

/// Entries a first pass must delete; the DNATed ones are what a pass after a change must.
fn stale() -> Vec<Flow> {
    let vip = v4(VIP, DNS_PORT);
    let node_port = v4(NODE_IP, NODE_PORT);
    let mut out: Vec<Flow> = (0..5)
        .map(|i| pinned(10 + i, vip, v4(DELETED, DNS_PORT)))
        .collect();
    // Sent before the Service had endpoints: never DNATed.
    out.push(pinned(20, vip, vip));
    out.push(pinned(21, vip, vip));
    // The serving endpoint's IP, but a port it no longer serves.
    out.push(pinned(22, vip, v4(SERVING, 5353)));
    out.push(pinned(23, node_port, v4(DELETED, DNS_PORT)));
    out.push(pinned(24, node_port, node_port));
    out
}

/// The UDP Service ports the model would hold.
fn service_ports() -> Vec<ServicePort> {
    let port =
        |name: &str, ip: Ipv4Addr, node_port: Option<u16>, serving: Vec<SocketAddr>| ServicePort {
            node_port,
            has_any_endpoints: true,
            serving_endpoints: serving,
            ..ServicePort::new(
                PortKey {
                    service: ServiceKey::new("kube-system", name),
                    port_name: "dns".into(),
                    protocol: Protocol::Udp,
                    family: Family::V4,
                },
                IpAddr::V4(ip),
                DNS_PORT,
            )
        };
    let mut ports = vec![port(
        "dns",
        VIP,
        Some(NODE_PORT),
        vec![v4(SERVING, DNS_PORT)],
    )];
    for i in 0..OTHER_SERVICES {
        ports.push(port(
            &format!("udp{i}"),
            Ipv4Addr::new(10, 96, 1, i),
            None,
            vec![v4(Ipv4Addr::new(10, 244, 3, i), DNS_PORT)],
        ));
    }
    ports
}

/// One pass with the given stale entries freshly created.
fn timed_pass(
    socket: &mut ConntrackSocket,
    reconciler: &mut Reconciler,
    ports: &[Arc<ServicePort>],
    stale: &[Flow],
) -> Result<PassFigures, String> {
    let created = socket
        .create(stale, TIMEOUT)
        .map_err(|e| format!("creating the stale entries: {e}"))?;
    if created != stale.len() {
        return Err(format!(
            "created {created} of {} stale entries",
            stale.len()
        ));
    }
    let before = read_number(COUNT_PATH)?;
    let started = Instant::now();
    let pass = reconciler
        .reconcile(Family::V4, ports.iter().map(|p| &**p))
        .map_err(|e| format!("reconcile: {e}"))?;
    let duration = started.elapsed();
    Ok(PassFigures {
        duration,
        dumps: pass.dumps.len(),
        scanned: pass.scanned,
        deleted: pass.outcome.deleted,
        stale: stale.len(),
        before,
        after: read_number(COUNT_PATH)?,
    })
}

/// `kpng-bench conntrack-inner --entries N`, inside the namespace: prints
/// `N CREATE_US` and the figures of the two passes on one line.
pub fn inner(entries: usize) -> Result<(), String> {
    let mut socket = ConntrackSocket::open().map_err(|e| e.to_string())?;
    let started = Instant::now();
    const CHUNK: usize = 50_000;
    let mut created = 0;
    let mut chunk = Vec::with_capacity(CHUNK);
    for i in 0..entries {
        chunk.push(unrelated(i));
        if chunk.len() == CHUNK || i + 1 == entries {
            created += socket
                .create(&chunk, TIMEOUT)
                .map_err(|e| format!("creating entries: {e}"))?;
            chunk.clear();
        }
    }
    let lookalikes = lookalikes();
    created += socket
        .create(&lookalikes, TIMEOUT)
        .map_err(|e| format!("creating entries: {e}"))?;
    let create = started.elapsed();
    if created != entries + lookalikes.len() {
        return Err(format!(
            "created {created} of {} entries",
            entries + lookalikes.len()
        ));
    }
    let ports: Vec<Arc<ServicePort>> = service_ports().into_iter().map(Arc::new).collect();
    let all_stale = stale();
    let dnat_stale: Vec<Flow> = all_stale.iter().filter(|f| f.is_dnat()).copied().collect();
    let open = || Reconciler::open().map_err(|e| e.to_string());
    let mut reconciler = open()?;
    let first = timed_pass(&mut socket, &mut reconciler, &ports, &all_stale)?;
    let after_change = timed_pass(&mut socket, &mut reconciler, &ports, &dnat_stale)?;
    let mut one_dump = open()?.with_max_narrow_dumps(0);
    let full = timed_pass(&mut socket, &mut one_dump, &ports, &all_stale)?;
    // A new process, as after a restart: the first one's checks handed over as its memory
    // file would hand them (the backend kept the rules, so nothing was ever un-DNATed).
    let mut restarted = open()?;
    for (family, frontends) in reconciler.checked() {
        restarted.assume_checked(*family, frontends.clone());
    }
    let restart = timed_pass(&mut socket, &mut restarted, &ports, &dnat_stale)?;
    println!(
        "{entries} {} {} {} {} {}",
        create.as_micros(),
        first.line(),
        after_change.line(),
        full.line(),
        restart.line()
    );
    Ok(())
}
