//! The fault suite: someone else breaks what kpng programmed while traffic flows, and kpng
//! must notice and repair it within a second without losing an established connection.
//!
//! Every fault runs the same way: node1 serves `web` (ClusterIP 10.96.0.10 → pod1b's echo
//! server) and `hold` (10.96.0.111 → a line server in pod2a); a prober in pod1a holds one
//! connection through `hold`, exchanging a line every 20 ms, and opens a new connection to
//! `web` every 10 ms (300 ms timeout). Then the fault is injected in node1 and the test
//! measures, from the moment the command started: when kpng logged the detection, when its
//! repairing sync was done, how many new connections failed meanwhile, and whether the held
//! connection survived. The figures are printed (`FAULT …` lines, `--nocapture`) and are the
//! ones `docs/reliability.md` reports.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use kpng_testkit::{Cluster, Spawned, require_root};

use super::Backend;
use super::harness::*;

/// Holds one connection and opens new ones; once the `repaired` file exists, goes on until the
/// held connection made 10 more exchanges and 10 more new connections succeeded (both show the
/// repair), then prints a JSON summary. Arguments: held IP, port, new-connection IP, port,
/// `repaired` file.
const PROBER: &str = r#"
import json, os, socket, sys, threading, time
held_target = (sys.argv[1], int(sys.argv[2]))
new_target = (sys.argv[3], int(sys.argv[4]))
repaired = sys.argv[5]
res = {"held": 0, "held_lost": None, "new_ok": 0, "new_failed": 0, "fail_at": []}
t0 = time.monotonic()
first = threading.Event()
done = threading.Event()
def held():
    try:
        c = socket.create_connection(held_target, timeout=5)
        c.settimeout(5)
        f = c.makefile("rb")
        while not done.is_set():
            c.sendall(b"x\n")
            if not f.readline():
                raise Exception("closed by the peer")
            res["held"] += 1
            first.set()
            time.sleep(0.02)
    except Exception as e:
        res["held_lost"] = repr(e)
        first.set()
th = threading.Thread(target=held)
th.start()
first.wait(10)
ok_once = False
after = None
while True:
    if after is None and os.path.exists(repaired):
        after = (res["held"], res["new_ok"], time.monotonic())
    if after is not None and ((res["held"] >= after[0] + 10 and res["new_ok"] >= after[1] + 10)
                              or res["held_lost"] or time.monotonic() > after[2] + 10):
        break
    t = time.monotonic()
    try:
        s = socket.create_connection(new_target, timeout=0.3)
        s.settimeout(0.3)
        if not s.recv(100):
            raise Exception("no reply")
        s.close()
        res["new_ok"] += 1
        if not ok_once:
            ok_once = True
            print("ready", flush=True)
    except Exception:
        res["new_failed"] += 1
        res["fail_at"].append(round(t - t0, 3))
    time.sleep(0.01)
done.set()
th.join()
print(json.dumps(res), flush=True)
"#;

/// What a fault did to traffic and how fast kpng repaired it.
#[derive(Debug)]
pub struct Figures {
    /// From the injection to kpng's detection log line.
    pub detect: Duration,
    /// From the injection to the end of the repairing sync.
    pub restore: Duration,
    /// New connections that failed during the whole probe, of how many.
    pub new_failed: u64,
    /// New connections attempted.
    pub new_total: u64,
    /// Line exchanges on the held connection.
    pub held_exchanges: u64,
    /// Why the held connection broke, if it did.
    pub held_lost: Option<String>,
}

/// The fault bed: node1 serves `web` (→ pod1b's echo server) and `hold` (→ pod2a's line
/// server), both servers running.
pub struct Bed {
    /// The cluster.
    pub c: Cluster,
    _echo: Spawned,
    _line_server: Spawned,
}

/// `web`: new connections are probed through it.
pub fn web() -> String {
    svc("web", 10, "ClusterIP", "", &[("pod1b", Cond::Ready)])
}

/// `hold`: the established connection goes through it.
pub fn hold() -> String {
    svc("hold", 111, "ClusterIP", "", &[("pod2a", Cond::Ready)])
}

/// `more` (ClusterIP 10.96.0.12): the change made during a fault.
pub fn more() -> String {
    svc("more", 12, "ClusterIP", "", &[("pod1b", Cond::Ready)])
}

impl Bed {
    /// A new cluster for backend `b` with both servers running.
    pub fn new(b: Backend, tag: &str) -> Bed {
        let c = Cluster::create(&b.prefix(tag)).expect("cluster");
        let echo = c.pod("pod1b").start_echo(EP_PORT).expect("echo");
        let line_server = start_line_server(&c, "pod2a");
        Bed {
            c,
            _echo: echo,
            _line_server: line_server,
        }
    }

    /// Starts the prober in pod1a (held connection through `hold`, new ones to `web`) and
    /// waits until its first new connection succeeded.
    pub fn prober(&self) -> Prober {
        self.prober_in(
            &self.c.pod("pod1a").ns,
            sa(cip(111, false), SVC_PORT),
            sa(cip(10, false), SVC_PORT),
        )
    }

    /// Starts the prober in the external client `ext`, through node1's node ports: the held
    /// connection through `hold-np`, new ones to `web-np` ([`node_port_services`]).
    pub fn prober_outside(&self) -> Prober {
        let node1 = IpAddr::V4(kpng_testkit::addr::NODE1_LAN_V4);
        self.prober_in(
            &self.c.ext.ns,
            sa(node1, node_port(HOLD_NP)),
            sa(node1, node_port(WEB_NP)),
        )
    }

    /// Starts the prober in `ns` (held connection to `held`, new ones to `new`) and waits
    /// until its first new connection succeeded.
    fn prober_in(&self, ns: &kpng_testkit::Netns, held: SocketAddr, new: SocketAddr) -> Prober {
        let dir = tempfile::tempdir().expect("tempdir");
        let stop = dir.path().join("repaired");
        let mut spawned = ns
            .spawn([
                "python3",
                "-c",
                PROBER,
                &held.ip().to_string(),
                &held.port().to_string(),
                &new.ip().to_string(),
                &new.port().to_string(),
                &stop.display().to_string(),
            ])
            .expect("prober");
        spawned
            .wait_for_line(|l| l == "ready", Duration::from_secs(10))
            .expect("prober ready");
        Prober {
            spawned,
            stop,
            _dir: dir,
        }
    }

    /// Asserts that a new connection to ClusterIP `n` is answered from pod1a.
    #[track_caller]
    pub fn assert_served(&self, n: u8, what: &str) {
        let r = probe(
            &self.c.pod("pod1a").ns,
            kpng_testkit::Proto::Tcp,
            sa(cip(n, false), SVC_PORT),
            OK_T,
        );
        assert!(r.is_ok(), "{what}: 10.96.0.{n} after the repair: {r:?}");
    }

    /// Waits (up to 10 s) until a new connection to ClusterIP `n` is answered from pod1a.
    #[track_caller]
    pub fn wait_served(&self, n: u8, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let r = probe(
                &self.c.pod("pod1a").ns,
                kpng_testkit::Proto::Tcp,
                sa(cip(n, false), SVC_PORT),
                OK_T,
            );
            if r.is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: 10.96.0.{n} not served: {r:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The running prober (see [`PROBER`]).
pub struct Prober {
    spawned: Spawned,
    stop: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Prober {
    /// Tells the prober the fault is over, waits for its summary and returns the figures.
    pub fn finish(mut self, detect: Duration, restore: Duration) -> Figures {
        finish(&mut self.spawned, &self.stop, detect, restore)
    }
}

/// Prints the `FAULT` line `docs/reliability.md` takes its figures from.
fn report(b: Backend, tag: &str, what: &str, f: &Figures) {
    println!(
        "FAULT {} {what}: detected in {:?}, restored in {:?}; new connections failed {}/{}; \
         held connection: {} exchanges, {}",
        b.prefix(tag),
        f.detect,
        f.restore,
        f.new_failed,
        f.new_total,
        f.held_exchanges,
        f.held_lost.as_deref().unwrap_or("kept"),
    );
}

fn no_figures() -> Figures {
    Figures {
        detect: Duration::ZERO,
        restore: Duration::ZERO,
        new_failed: 0,
        new_total: 0,
        held_exchanges: 0,
        held_lost: None,
    }
}

/// Runs the fault `inject` (commands run in node1, in order) against backend `b`.
#[track_caller]
pub fn run_fault(b: Backend, tag: &str, what: &str, inject: &[&[&str]]) -> Figures {
    run_fault_probed(b, tag, what, inject, false)
}

/// `hold-np`: the NodePort (30000 + this) the external client holds its connection through
/// (→ pod2a's line server).
const HOLD_NP: u8 = 112;
/// `web-np`: the NodePort (30000 + this) the external client opens new connections to (→
/// pod1b's echo server).
const WEB_NP: u8 = 113;

/// The Services [`Bed::prober_outside`] goes through.
fn node_port_services() -> [String; 2] {
    [
        svc(
            "hold-np",
            HOLD_NP,
            "NodePort",
            "",
            &[("pod2a", Cond::Ready)],
        ),
        svc("web-np", WEB_NP, "NodePort", "", &[("pod1b", Cond::Ready)]),
    ]
}

/// [`run_fault`], probed from pod1a through ClusterIPs, or (`outside`) from the external
/// client through node1's node ports. From outside, a packet the kernel does not translate
/// reaches node1 itself, which answers a node port it does not listen on with a reset: the
/// held connection is lost unless its NAT goes on through the fault (the anchor table,
/// `kpng_netfilter::anchor`), where a pod's packet to a ClusterIP is only dropped and
/// retransmitted.
#[track_caller]
pub fn run_fault_probed(
    b: Backend,
    tag: &str,
    what: &str,
    inject: &[&[&str]],
    outside: bool,
) -> Figures {
    require_root!(no_figures());
    let bed = Bed::new(b, tag);
    let mut services = vec![web(), hold()];
    if outside {
        services.extend(node_port_services());
    }
    let mut k = Kpng::start(b, &bed.c.node1.ns, &manifest(&services), &[]);
    // Our own changes are not tampering: one more sync of a real change, then none reported.
    services.push(more());
    k.apply(&manifest(&services));
    assert!(
        !k.stderr().contains("changed by someone else"),
        "kpng took its own changes for tampering:\n{}",
        k.stderr()
    );
    let prober = if outside {
        bed.prober_outside()
    } else {
        bed.prober()
    };

    let (ok, failed) = k.sync_counts();
    // From before the commands: the figures include their own run time (an upper bound).
    let t0 = Instant::now();
    for cmd in inject {
        bed.c.node1.ns.run_ok(cmd.iter().copied()).expect("inject");
    }
    k.wait_logged("tampering detected", |s| {
        s.contains("changed by someone else") || s.contains("were flushed")
    });
    let detect = t0.elapsed();
    k.wait_synced(ok, failed);
    let restore = t0.elapsed();
    // Whether an alarm or the backend's own check found it, the repair is shown.
    assert_repair_shown(&k.admin_socket());
    // Traffic flows again: a new connection is answered by the endpoint.
    bed.assert_served(10, what);
    let figures = prober.finish(detect, restore);
    report(b, tag, what, &figures);
    figures
}

/// `kpng status` counts the repair and names what was changed, and the repairing sync in its
/// history says it was one (its changes alone read "no Service port changed").
#[track_caller]
fn assert_repair_shown(socket: &Path) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kpng"))
        .args(["status", "-o", "json", "--admin-socket"])
        .arg(socket)
        .output()
        .expect("kpng status");
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    let repairs = &status["repairs"];
    assert!(
        repairs["count"].as_u64().is_some_and(|n| n >= 1)
            && repairs["lastChange"]
                .as_str()
                .is_some_and(|c| !c.is_empty()),
        "{status}"
    );
    assert!(
        status["recentSyncs"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["full"] == true
                && s["changes"]
                    .as_str()
                    .is_some_and(|c| c.starts_with("repair after a change by someone else ("))),
        "{status}"
    );
}

fn finish(prober: &mut Spawned, stop: &Path, detect: Duration, restore: Duration) -> Figures {
    std::fs::write(stop, "").expect("stop file");
    let line = prober
        .wait_for_line(|l| l.starts_with('{'), Duration::from_secs(20))
        .expect("prober summary");
    let v: serde_json::Value = serde_json::from_str(&line).expect("prober JSON");
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    Figures {
        detect,
        restore,
        new_failed: n("new_failed"),
        new_total: n("new_ok") + n("new_failed"),
        held_exchanges: n("held"),
        held_lost: v["held_lost"].as_str().map(str::to_owned),
    }
}

/// The targets: repaired within a second, the established connection kept.
#[track_caller]
pub fn assert_repaired(what: &str, f: &Figures) {
    assert!(
        f.restore < Duration::from_secs(1),
        "{what}: restored in {:?}",
        f.restore
    );
    assert!(
        f.held_lost.is_none(),
        "{what}: the established connection was lost: {:?}",
        f.held_lost
    );
    assert!(f.held_exchanges >= 10, "{what}: {f:?}");
}

/// `nft delete table ip kpng` (nftables backend).
pub fn nft_table_deleted(b: Backend) {
    let f = run_fault(
        b,
        "deltab",
        "nft delete table ip kpng",
        &[&["nft", "delete", "table", "ip", "kpng"]],
    );
    assert_repaired("table deleted", &f);
}

/// `nft flush ruleset`: every table of the namespace, ours included.
pub fn nft_ruleset_flushed(b: Backend) {
    let f = run_fault(
        b,
        "flushrs",
        "nft flush ruleset",
        &[&["nft", "flush", "ruleset"]],
    );
    assert_repaired("ruleset flushed", &f);
}

/// `nft flush ruleset` with an external client's connection held through a node port: the
/// anchor table keeps it NATed until the repair (without it, node1 reset it every time).
pub fn nft_ruleset_flushed_node_port(b: Backend) {
    let f = run_fault_probed(
        b,
        "flushnp",
        "nft flush ruleset (held NodePort connection)",
        &[&["nft", "flush", "ruleset"]],
        true,
    );
    assert_repaired("ruleset flushed, NodePort", &f);
}

/// `iptables-restore` of a saved ruleset (filter and nat, no `--noflush`: every chain of
/// both flushed, kpng's deleted) with an external client's connection held through a node
/// port. Without the anchor, iptables-nft and iptables-legacy alike reset it every time (no
/// conntrack user was left in the namespace, so no packet was matched to its entry).
pub fn iptables_restored_node_port(b: Backend) {
    let tool = b.iptables_tool().expect("an iptables backend");
    let what = format!("{tool}-restore of a saved ruleset (held NodePort connection)");
    let script = format!(
        "printf '*filter\\n:INPUT ACCEPT [0:0]\\n:FORWARD ACCEPT [0:0]\\n:OUTPUT ACCEPT [0:0]\\n\
         COMMIT\\n*nat\\n:PREROUTING ACCEPT [0:0]\\n:INPUT ACCEPT [0:0]\\n\
         :OUTPUT ACCEPT [0:0]\\n:POSTROUTING ACCEPT [0:0]\\nCOMMIT\\n' | {tool}-restore"
    );
    let f = run_fault_probed(b, "restnp", &what, &[&["sh", "-c", &script]], true);
    assert_repaired("iptables-restore, NodePort", &f);
}

/// `systemctl restart nftables` (ExecStop `nft flush ruleset`, ExecStart `nft -f FILE` whose
/// file starts with `flush ruleset`), or for the iptables backends `iptables-restore` of a nat
/// table twice: two deletions of kpng's rules 30-70 ms apart, so that the second lands while
/// kpng repairs the first. Until kpng confirmed its repairs, about half such rounds left the
/// tables deleted for up to an hour (the monitor has left its group during kpng's own sync,
/// and the periodic sync never looked). Eight rounds, gaps spread over 30-70 ms: in each,
/// Service traffic must be back within 5 s and kpng's rules in place.
pub fn double_flush(b: Backend) {
    require_root!();
    let bed = Bed::new(b, "dblfl");
    // Sixteen deletions in a few seconds would make later repairs back off (`repair_loop`):
    // this test is about each round's race, so every repair is made at once.
    let k = Kpng::start(
        b,
        &bed.c.node1.ns,
        &manifest(&[web(), hold()]),
        &["--repairs-at-once", "1000"],
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let (first, again, in_place): (String, String, Vec<&str>) = match b.iptables_tool() {
        None => {
            let file = dir.path().join("firewall.nft");
            std::fs::write(
                &file,
                "flush ruleset\ntable inet filter {\n  chain input {\n    type filter hook input \
                 priority filter; policy accept;\n  }\n}\n",
            )
            .expect("write the firewall file");
            (
                "nft flush ruleset".into(),
                format!("nft -f {}", file.display()),
                vec![
                    "nft list chain ip kpng skeleton",
                    "nft list chain ip6 kpng skeleton",
                ],
            )
        }
        Some(tool) => {
            let file = dir.path().join("rules-nat.v4");
            std::fs::write(
                &file,
                "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
                 :POSTROUTING ACCEPT [0:0]\n-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j \
                 MASQUERADE\nCOMMIT\n",
            )
            .expect("write the rules file");
            let restore = format!("{tool}-restore {}", file.display());
            (
                restore.clone(),
                restore,
                vec!["sh -c '{tool} -t nat -S PREROUTING | grep -q KUBE-SERVICES'"],
            )
        }
    };
    let in_place: Vec<String> = in_place
        .iter()
        .map(|c| c.replace("{tool}", b.iptables_tool().unwrap_or_default()))
        .collect();
    for (round, gap_ms) in [30, 45, 60, 70, 35, 50, 65, 40].into_iter().enumerate() {
        bed.wait_served(10, "before the round");
        std::thread::sleep(Duration::from_millis(300));
        let script = format!("{first}; sleep 0.{gap_ms:03}; {again}");
        let t0 = Instant::now();
        bed.c
            .node1
            .ns
            .run_ok(["sh", "-c", &script])
            .expect("inject");
        let deadline = t0 + Duration::from_secs(5);
        loop {
            // Not `probe`: its check against `kpng trace` would fail first, on a timeout
            // while kpng says it is in sync (which is this bug too), with a vaguer message.
            let served = bed
                .c
                .pod("pod1a")
                .ns
                .probe_one(
                    &kpng_testkit::Probe::new(
                        kpng_testkit::Proto::Tcp,
                        sa(cip(10, false), SVC_PORT),
                    )
                    .timeout(Duration::from_millis(300)),
                )
                .is_ok_and(|r| r.is_ok());
            let present = in_place
                .iter()
                .all(|c| bed.c.node1.ns.run_ok(["sh", "-c", c]).is_ok());
            if served && present {
                println!(
                    "FAULT {} round {round} (gap {gap_ms} ms): served and in place after {:?}",
                    b.prefix("dblfl"),
                    t0.elapsed()
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round} (gap {gap_ms} ms): after `{script}`, served: {served}, rules in \
                 place: {present}, 5 s later; kpng's log:\n{}",
                k.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Whether kpng's IPv4 table is in place (its skeleton marker chain).
fn table_present(bed: &Bed) -> bool {
    bed.c
        .node1
        .ns
        .run_ok(["nft", "list", "chain", "ip", "kpng", "skeleton"])
        .is_ok()
}

/// Repairs made so far: the `synced` lines of repairing syncs.
fn repairs_logged(k: &Kpng) -> usize {
    k.stderr()
        .lines()
        .filter(|l| l.contains("synced") && l.contains("repair after a change by someone else ("))
        .count()
}

/// Someone deletes kpng's table again and again (a firewall reload loop, a cron job, a second
/// proxy): 20 deletions, 100 ms apart. The first repair is at once (within the 1 s target);
/// later ones back off, so the repairs are far fewer than the deletions; the log warns once,
/// `kpng status` shows a PROBLEM line and the metrics the delay; once the loop stops, the
/// table is back and traffic flows within the backoff's delay. `repairs_at_once` is kpng's
/// `--repairs-at-once` (`None`: the default): the figures of docs/reliability.md compare both.
pub fn repair_loop(b: Backend, repairs_at_once: Option<&str>) -> (usize, Duration) {
    require_root!((0, Duration::ZERO));
    let bed = Bed::new(b, "flap");
    let extra: Vec<&str> = repairs_at_once
        .map(|n| vec!["--repairs-at-once", n])
        .unwrap_or_default();
    let k = Kpng::start(b, &bed.c.node1.ns, &manifest(&[web(), hold()]), &extra);
    bed.wait_served(10, "before the loop");
    let ns = &bed.c.node1.ns;
    // The first deletion is repaired at once.
    let t0 = Instant::now();
    ns.run_ok(["nft", "delete", "table", "ip", "kpng"])
        .expect("delete the table");
    while !table_present(&bed) {
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "the first repair took over 1 s:\n{}",
            k.stderr()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let first = t0.elapsed();
    // 19 more, 100 ms apart (a deletion of a table not repaired yet fails, as a real loop's
    // would, and changes nothing).
    let out = ns
        .run_ok([
            "sh",
            "-c",
            "for i in $(seq 19); do nft delete table ip kpng 2>/dev/null && echo deleted; \
             sleep 0.1; done",
        ])
        .expect("the deletion loop");
    let deleted = 1 + out.lines().filter(|l| *l == "deleted").count();
    let stopped = Instant::now();
    // The loop usually ends with the table deleted and its repair delayed (not when a delayed
    // repair landed within its last 100 ms): the status says so while it lasts (asked until
    // the runner has taken the monitor's report in, which may lag on a loaded machine).
    let mut unrepaired = None;
    while !table_present(&bed) && stopped.elapsed() < Duration::from_secs(2) {
        let status = k.status_json();
        let text = std::process::Command::new(env!("CARGO_BIN_EXE_kpng"))
            .args(["status", "--admin-socket"])
            .arg(k.admin_socket())
            .output()
            .expect("kpng status");
        let text = String::from_utf8_lossy(&text.stdout).into_owned();
        if let Some(line) = status["repairs"]["unrepaired"].as_str() {
            unrepaired = Some((line.to_string(), text, status.to_string()));
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = k.status_json();
    let problem = status["repairs"]["problem"].as_str().unwrap_or_default();
    let text = std::process::Command::new(env!("CARGO_BIN_EXE_kpng"))
        .args(["status", "--admin-socket"])
        .arg(k.admin_socket())
        .output()
        .expect("kpng status");
    let text = String::from_utf8_lossy(&text.stdout);
    let metrics = ns
        .run_ok(["curl", "-s", "http://127.0.0.1:10249/metrics"])
        .expect("metrics");
    let delay: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("kpng_repair_delay_seconds{backend=\"nftables\"} "))
        .and_then(|v| v.trim().parse().ok())
        .expect("kpng_repair_delay_seconds");
    // Once the loop stopped: the table back, traffic served, within the last delay.
    while !table_present(&bed) {
        assert!(
            stopped.elapsed() < Duration::from_secs(10),
            "the table is not back 10 s after the loop:\n{}",
            k.stderr()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let back = stopped.elapsed();
    bed.wait_served(10, "after the loop");
    let repairs = repairs_logged(&k);
    let warnings = k.stderr().matches("repairs now wait").count();
    println!(
        "FAULT {} a deletion every 100 ms, 20 times (--repairs-at-once {}): {deleted} deletions, \
         {repairs} repairs, the first in {first:?}; warned {warnings} times; the table back \
         {back:?} after the loop (delay then {delay} s)",
        b.prefix("flap"),
        repairs_at_once.unwrap_or("default"),
    );
    if repairs_at_once.is_none() {
        assert_eq!(warnings, 1, "warned once:\n{}", k.stderr());
        assert!(
            repairs <= 10 && deleted <= 10,
            "repairs backed off: {deleted} deletions, {repairs} repairs:\n{}",
            k.stderr()
        );
        assert!(
            problem.starts_with("someone else changed kpng's rules ")
                && problem.contains("firewalld or ufw reloading"),
            "{status}"
        );
        assert!(
            text.contains("PROBLEM: someone else changed kpng's rules "),
            "{text}"
        );
        assert!(delay >= 1.0, "kpng_repair_delay_seconds {delay}");
        println!(
            "the status named the repair not made yet: {:?}",
            unrepaired.as_ref().map(|u| &u.0)
        );
        if let Some((line, text, status)) = &unrepaired {
            assert!(
                line.starts_with("ip kpng: ")
                    && line.contains(" (reported at ")
                    && line.contains("): not repaired yet, repair due at "),
                "{status}"
            );
            assert!(text.contains(&format!("PROBLEM: {line}")), "{text}");
        }
        assert!(
            back < Duration::from_secs_f64(delay * 2.0 + 1.0),
            "back within the backoff's next delay: {back:?}"
        );
    }
    (repairs, back)
}

/// Writes an executable `nft` wrapper in `dir` (for `--nft-exec command --nft-binary`): the
/// shell lines `before`, then the real `nft` with kpng's arguments. Returns its path.
fn nft_wrapper(dir: &std::path::Path, before: &str) -> String {
    let wrapper = dir.join("nft");
    std::fs::write(&wrapper, format!("#!/bin/sh\n{before}exec nft \"$@\"\n"))
        .expect("write the nft wrapper");
    let mut perms = std::fs::metadata(&wrapper).expect("stat").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&wrapper, perms).expect("chmod");
    wrapper.display().to_string()
}

/// A foreign rule inserted while a transaction of kpng's is on its way (an `nft` wrapper
/// commits `nft insert rule ip kpng services ip daddr 10.96.0.10 drop` first, from a process
/// of its own, then kpng's transaction): kpng's notification monitor has left its group for
/// its own sync, so no notification tells it. Until 2026-12-06 `web` stayed dropped until the
/// periodic full sync; now the kernel's generation id shows a commit that was not kpng's and
/// the rules are put back. Returns whether `web` was served again within 3 s.
pub fn nft_rule_inserted_during_a_sync(b: Backend) -> bool {
    require_root!(true);
    let bed = Bed::new(b, "racerule");
    let dir = tempfile::tempdir().expect("tempdir");
    let armed = dir.path().join("armed");
    let wrapper = nft_wrapper(
        dir.path(),
        &format!(
            "if [ \"$1\" = -f ] && [ -e {a} ]; then\n  rm -f {a}\n  \
             nft insert rule ip kpng services ip daddr {web} drop\nfi\n",
            a = armed.display(),
            web = cip(10, false),
        ),
    );
    let mut k = Kpng::start_with(
        b,
        &bed.c.node1.ns,
        &manifest(&[web(), hold()]),
        None,
        &[],
        &["--nft-exec", "command", "--nft-binary", &wrapper],
    );
    bed.wait_served(10, "before");
    std::fs::write(&armed, "").expect("arm");
    // A Service with two endpoints needs a chain kpng has not made yet: a text transaction.
    let two = svc(
        "two",
        13,
        "ClusterIP",
        "",
        &[("pod1b", Cond::Ready), ("pod2a", Cond::Ready)],
    );
    k.apply(&manifest(&[web(), hold(), two]));
    assert!(
        !armed.exists(),
        "no text transaction of kpng's ran the wrapper"
    );
    let t0 = Instant::now();
    let served = loop {
        // Not `probe`: its check against `kpng trace` would fail first (kpng says it is in
        // sync, which is this gap).
        let ok = bed
            .c
            .pod("pod1a")
            .ns
            .probe_one(
                &kpng_testkit::Probe::new(kpng_testkit::Proto::Tcp, sa(cip(10, false), SVC_PORT))
                    .timeout(Duration::from_millis(300)),
            )
            .is_ok_and(|r| r.is_ok());
        if ok {
            break true;
        }
        if t0.elapsed() > Duration::from_secs(3) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    println!(
        "FAULT {} a rule inserted during kpng's transaction: web served again: {served} \
         ({:?}); kpng said:\n{}",
        b.prefix("racerule"),
        t0.elapsed(),
        k.stderr()
    );
    served
}

/// A neighbour committing to a table of its own (fail2ban, Docker, a CNI) during every text
/// transaction of kpng's, as an `nft` wrapper does here before each one: the generation id
/// moves more than kpng's own commits, but kpng's rules are untouched, so no change is reported
/// and nothing is repaired. Until 2026-12-06 each such sync was taken as tampering and its
/// repair (itself a text transaction) overlapped the next neighbour commit: the repairs fed
/// themselves. Returns how many syncs the neighbour overlapped and kpng's log.
pub fn nft_neighbour_commits_during_syncs(b: Backend) -> (usize, String) {
    require_root!((0, String::new()));
    let bed = Bed::new(b, "neighbour");
    let dir = tempfile::tempdir().expect("tempdir");
    let count = dir.path().join("count");
    let wrapper = nft_wrapper(
        dir.path(),
        &format!(
            "if [ \"$1\" = -f ]; then\n  echo x >> {c}\n  \
             nft \"add table inet kpngneighbour; add chain inet kpngneighbour c$$\"\nfi\n",
            c = count.display(),
        ),
    );
    let mut k = Kpng::start_with(
        b,
        &bed.c.node1.ns,
        &manifest(&[web(), hold()]),
        None,
        &[],
        &["--nft-exec", "command", "--nft-binary", &wrapper],
    );
    neighbour_overlaps(&bed, &mut k, &count)
}

/// Writes an `iptables-nft-restore` wrapper into `dir` that runs `before` (shell) and then the
/// real tool (found by dropping `dir`, the first entry, from `PATH`), for
/// [`Kpng::start_with_path`].
fn iptables_restore_wrapper(dir: &Path, before: &str) {
    let wrapper = dir.join("iptables-nft-restore");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\n{before}\nPATH=${{PATH#*:}} exec iptables-nft-restore \"$@\"\n"),
    )
    .expect("write the iptables-nft-restore wrapper");
    let mut perms = std::fs::metadata(&wrapper).expect("stat").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&wrapper, perms).expect("chmod");
}

/// iptables-nft: a foreign rule inserted into one of kpng's chains while a restore of kpng's
/// is on its way (an `iptables-nft-restore` wrapper commits `iptables -I KUBE-FORWARD 1 -j
/// DROP` first, from a process of its own, then kpng's restore runs): kpng's notification
/// monitor has left its group for its own sync, so no notification tells it. Until
/// 2026-12-06 every forwarded packet stayed dropped until the periodic full sync; now the
/// kernel's generation id shows a commit that was not kpng's, kpng's rules are compared and
/// put back. Returns whether `web` was served again within 3 s.
pub fn iptables_rule_inserted_during_a_sync(b: Backend) -> bool {
    require_root!(true);
    let bed = Bed::new(b, "iptrace");
    let dir = tempfile::tempdir().expect("tempdir");
    let armed = dir.path().join("armed");
    iptables_restore_wrapper(
        dir.path(),
        &format!(
            "if [ -e {a} ]; then\n  rm -f {a}\n  \
             iptables-nft -w 5 -t filter -I KUBE-FORWARD 1 -j DROP\nfi",
            a = armed.display(),
        ),
    );
    let mut k = Kpng::start_with_path(
        b,
        &bed.c.node1.ns,
        &manifest(&[web(), hold()]),
        None,
        &[],
        &[],
        Some(dir.path()),
    );
    bed.wait_served(10, "before");
    std::fs::write(&armed, "").expect("arm");
    // A new Service: a restore of kpng's (its own chains and KUBE-SERVICES, not KUBE-FORWARD).
    let two = svc(
        "two",
        13,
        "ClusterIP",
        "",
        &[("pod1b", Cond::Ready), ("pod2a", Cond::Ready)],
    );
    k.apply(&manifest(&[web(), hold(), two]));
    assert!(!armed.exists(), "no restore of kpng's ran the wrapper");
    let t0 = Instant::now();
    let served = loop {
        // Not `probe`: its check against `kpng trace` would fail first (kpng says it is in
        // sync, which is this gap).
        let ok = bed
            .c
            .pod("pod1a")
            .ns
            .probe_one(
                &kpng_testkit::Probe::new(kpng_testkit::Proto::Tcp, sa(cip(10, false), SVC_PORT))
                    .timeout(Duration::from_millis(300)),
            )
            .is_ok_and(|r| r.is_ok());
        if ok {
            break true;
        }
        if t0.elapsed() > Duration::from_secs(3) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    println!(
        "FAULT {} a rule inserted during kpng's restore: web served again: {served} ({:?}); \
         kpng said:\n{}",
        b.prefix("iptrace"),
        t0.elapsed(),
        k.stderr()
    );
    served
}

/// iptables-nft: neighbours (Docker, a CNI, fail2ban) committing in the shared `nat` and
/// `filter` tables (a chain of their own and a jump to it from a built-in chain) and in a table
/// of their own during every restore of kpng's, as an `iptables-nft-restore` wrapper does here:
/// the generation id moves more than kpng's own commits, and the shared tables' rules change,
/// but none of kpng's chains nor its jumps, so no change is reported and nothing is repaired
/// (comparing whole tables would take each for tampering). Returns how many restores the
/// neighbours overlapped and kpng's log.
pub fn iptables_neighbour_commits_during_syncs(b: Backend) -> (usize, String) {
    require_root!((0, String::new()));
    let bed = Bed::new(b, "iptneigh");
    let dir = tempfile::tempdir().expect("tempdir");
    let count = dir.path().join("count");
    iptables_restore_wrapper(
        dir.path(),
        &format!(
            "echo x >> {c}\n\
             iptables-nft -w 5 -t filter -N NEIGH$$ && \
             iptables-nft -w 5 -t filter -A FORWARD -j NEIGH$$\n\
             iptables-nft -w 5 -t nat -N NEIGH$$ && iptables-nft -w 5 -t nat -A PREROUTING -j NEIGH$$\n\
             nft \"add table inet kpngneighbour; add chain inet kpngneighbour c$$\"",
            c = count.display(),
        ),
    );
    let mut k = Kpng::start_with_path(
        b,
        &bed.c.node1.ns,
        &manifest(&[web(), hold()]),
        None,
        &[],
        &[],
        Some(dir.path()),
    );
    neighbour_overlaps(&bed, &mut k, &count)
}

/// The changes of the neighbour tests, kpng `k` started on `bed` with a wrapper that appends a
/// line to `count` each time it commits for the neighbour: two Services with endpoint counts
/// kpng has no chain for yet (new chains: a rule-changing transaction each), then `web`
/// served. Returns how many times the neighbour committed and kpng's log.
fn neighbour_overlaps(bed: &Bed, k: &mut Kpng, count: &Path) -> (usize, String) {
    bed.wait_served(10, "before");
    let two = svc(
        "two",
        13,
        "ClusterIP",
        "",
        &[("pod1b", Cond::Ready), ("pod2a", Cond::Ready)],
    );
    k.apply(&manifest(&[web(), hold(), two.clone()]));
    let three = svc(
        "three",
        14,
        "ClusterIP",
        "",
        &[
            ("pod1a", Cond::Ready),
            ("pod1b", Cond::Ready),
            ("pod2a", Cond::Ready),
        ],
    );
    k.apply(&manifest(&[web(), hold(), two, three]));
    // A report would be handled within the tamper debounce; give it time to show.
    std::thread::sleep(Duration::from_millis(500));
    // (Only pod1b runs an echo server in this bed: `web` is the one to probe.)
    bed.wait_served(10, "after");
    let overlapped = std::fs::read_to_string(count)
        .map(|c| c.lines().count())
        .unwrap_or(0);
    (overlapped, k.stderr())
}

/// `nft flush chain ip kpng services`: the table stays, a chain's rules go.
pub fn nft_chain_flushed(b: Backend) {
    let f = run_fault(
        b,
        "flushch",
        "nft flush chain ip kpng services",
        &[&["nft", "flush", "chain", "ip", "kpng", "services"]],
    );
    assert_repaired("chain flushed", &f);
}

/// `nft insert rule ip kpng services ip daddr 10.96.0.10 drop`: a foreign rule in our table
/// that drops `web`'s traffic. The repair puts our rules back and the foreign one is gone.
pub fn nft_rule_inserted(b: Backend) {
    let web_ip = cip(10, false).to_string();
    let f = run_fault(
        b,
        "insrule",
        "nft insert rule ip kpng services ip daddr 10.96.0.10 drop",
        &[&[
            "nft", "insert", "rule", "ip", "kpng", "services", "ip", "daddr", &web_ip, "drop",
        ]],
    );
    assert_repaired("rule inserted", &f);
}

/// `iptables -t nat -F` (iptables backends, their variant's tool).
pub fn iptables_nat_flushed(b: Backend) {
    let tool = b.iptables_tool().expect("an iptables backend");
    let what = format!("{tool} -t nat -F");
    let f = run_fault(b, "natflush", &what, &[&[tool, "-t", "nat", "-F"]]);
    assert_repaired("nat flushed", &f);
}

/// `iptables -t nat -F; iptables -t nat -X`: our chains deleted too. Both in one restore
/// transaction: as two commands, the repair of the flush can come before the `-X`, which then
/// fails (our chains are referenced again).
pub fn iptables_nat_deleted(b: Backend) {
    let tool = b.iptables_tool().expect("an iptables backend");
    let what = format!("{tool}-restore of `-t nat -F; -X`");
    let script = format!("printf '*nat\\n-F\\n-X\\nCOMMIT\\n' | {tool}-restore --noflush");
    let f = run_fault(b, "natdel", &what, &[&["sh", "-c", &script]]);
    assert_repaired("nat chains deleted", &f);
}

/// Our jump from `PREROUTING` deleted, the chains left alone (iptables-nft: seen through the
/// notification of the deleted rule, which names its target; the legacy variant's poll lists
/// `PREROUTING` every other round, 0.8 s).
pub fn iptables_jump_deleted(b: Backend) {
    let tool = b.iptables_tool().expect("an iptables backend");
    let what = format!("{tool} -t nat -D PREROUTING … -j KUBE-SERVICES");
    let f = run_fault(
        b,
        "jumpdel",
        &what,
        &[&[
            tool,
            "-t",
            "nat",
            "-D",
            "PREROUTING",
            "-m",
            "comment",
            "--comment",
            "kubernetes service portals",
            "-j",
            "KUBE-SERVICES",
        ]],
    );
    assert_repaired("jump deleted", &f);
}

/// `nft delete table ip kpng-userspace` (the userspace proxy's capture).
pub fn capture_table_deleted(b: Backend) {
    let f = run_fault(
        b,
        "capdel",
        "nft delete table ip kpng-userspace",
        &[&["nft", "delete", "table", "ip", "kpng-userspace"]],
    );
    assert_repaired("capture deleted", &f);
}

/// A second kpng of the same backend in the same network namespace refuses to start and
/// names the first; one in another namespace starts.
pub fn one_instance_per_namespace(b: Backend) {
    require_root!();
    let c = Cluster::create(&b.prefix("lock")).expect("cluster");
    let k = Kpng::start(b, &c.node1.ns, &manifest(&[]), &[]);
    let pid = k.pid().expect("pid");
    let refused = |mut second: Spawned| {
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = second.try_wait().expect("wait") {
                break status;
            }
            assert!(Instant::now() < deadline, "the second kpng still runs");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(!status.success());
        // The exit can be seen before the reader thread drained the pipe (under the whole
        // suite's load the message once read empty): wait for the refusal's text.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !second.stderr_text().contains("another kpng (pid ") && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        second.stderr_text()
    };
    let err = refused(k.spawn_another(&c.node1.ns));
    assert!(
        err.contains(&format!("another kpng (pid {pid}) already runs")),
        "{err}"
    );
    // Nor may a kpng of another backend run beside it: `ebpf`'s ruleset is the table `nft`
    // writes (the two repaired each other's "tampering" ten times a second), and the others
    // sweep each other's rules.
    let other = if b == Backend::Nft {
        Backend::Ebpf
    } else {
        Backend::Nft
    };
    let err = refused(k.spawn_beside(other));
    assert!(
        err.contains(&format!(
            "another kpng (pid {pid}) runs `to-local {}` in this network namespace",
            b.sink_args()[1]
        )),
        "{err}"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !k.stderr().contains("a change by someone else"),
        "the first kpng's rules were touched:\n{}",
        k.stderr()
    );
    // Another namespace is another node: no conflict.
    let mut other = k.spawn_another(&c.node2.ns);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !other.stderr_text().contains("synced backend=") {
        assert!(
            other.try_wait().expect("wait").is_none(),
            "kpng in node2 exited: {}",
            other.stderr_text()
        );
        assert!(Instant::now() < deadline, "{}", other.stderr_text());
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(other);
    if b == Backend::Ebpf {
        forget_ebpf_scope(&c.node2.ns);
    }
}

/// `kill -9` of kpng right after it read a change (its sync starts at once), then a restart
/// one second later. The rules stay while kpng is down; the restart's first sync replaces
/// them in one transaction (no flush in between) and programs the change.
pub fn kill_during_sync_and_restart(b: Backend) {
    require_root!();
    let tag = "kill9";
    let bed = Bed::new(b, tag);
    let mut k = Kpng::start(b, &bed.c.node1.ns, &manifest(&[web(), hold()]), &[]);
    let prober = bed.prober();
    // A change whose sync takes a while: `more` and 120 other Services.
    let mut objects = vec![web(), hold(), more()];
    for n in 130..250u8 {
        objects.push(svc(
            &format!("bulk{n}"),
            n,
            "ClusterIP",
            "",
            &[("pod1b", Cond::Ready)],
        ));
    }
    let (ok, _) = k.sync_counts();
    let loaded = k.stderr().matches(" loaded ").count();
    k.write(&manifest(&objects));
    k.wait_logged("the change read", |s| {
        s.matches(" loaded ").count() > loaded
    });
    let before_kill = k.stderr();
    k.stop();
    let killed = Instant::now();
    let mid_sync = before_kill.matches("synced backend=").count() == ok;
    // Down for a second: the kernel keeps serving the rules of the last sync.
    std::thread::sleep(Duration::from_secs(1));
    let down = killed.elapsed();
    let restarted = Instant::now();
    k.spawn();
    let restore = restarted.elapsed();
    bed.assert_served(12, "the change read before the kill");
    bed.assert_served(200, "the change read before the kill");
    bed.assert_served(10, "web");
    let f = prober.finish(down, restore);
    let what = format!(
        "kill -9 {} the change's sync, restart after {down:?}",
        if mid_sync {
            "before the end of"
        } else {
            "after"
        }
    );
    report(b, tag, &what, &f);
    assert!(
        f.held_lost.is_none(),
        "{what}: the established connection was lost: {f:?}"
    );
    if b.behaviour().serves_over_restart {
        assert_eq!(f.new_failed, 0, "{what}: rules were missing: {f:?}");
    }
}

/// The kernel refuses one nftables transaction (`to-local nft --nft-exec command` through an
/// `nft` wrapper that adds a rule for a chain that does not exist, so the kernel rejects the
/// whole transaction); kpng retries from a full resync and programs the change.
pub fn nft_transaction_refused(b: Backend) {
    require_root!();
    let tag = "refuse";
    let bed = Bed::new(b, tag);
    let dir = tempfile::tempdir().expect("tempdir");
    let refuse = dir.path().join("refuse");
    let wrapper = nft_wrapper(
        dir.path(),
        &format!(
            "if [ \"$1\" = -f ] && [ -e {r} ]; then\n  rm -f {r}\n  \
             {{ cat; echo 'add rule ip kpng kpng-no-such-chain counter'; }} | nft \"$@\"\n  \
             exit $?\nfi\n",
            r = refuse.display()
        ),
    );
    let mut k = Kpng::start_with(
        b,
        &bed.c.node1.ns,
        &manifest(&[web(), hold()]),
        None,
        &[],
        &["--nft-exec", "command", "--nft-binary", &wrapper],
    );
    let prober = bed.prober();
    std::fs::write(&refuse, "").expect("arm the refusal");
    let t0 = Instant::now();
    k.write(&manifest(&[web(), hold(), more()]));
    k.wait_logged("the refusal", |s| s.contains("sync failed"));
    let detect = t0.elapsed();
    k.wait_logged("the retry from a full sync", |s| {
        s.split_once("sync failed")
            .is_some_and(|(_, after)| after.contains("synced backend=nftables full=true"))
    });
    let restore = t0.elapsed();
    assert!(!refuse.exists(), "the wrapper refused no transaction");
    let err = k.stderr();
    assert!(
        err.contains("kpng-no-such-chain") || err.contains("No such file or directory"),
        "the kernel's refusal is logged:\n{err}"
    );
    bed.assert_served(12, "the refused change");
    bed.assert_served(10, "web");
    let f = prober.finish(detect, restore);
    report(b, tag, "a refused nftables transaction", &f);
    assert!(
        f.held_lost.is_none(),
        "refused transaction: the established connection was lost: {f:?}"
    );
    assert_eq!(
        f.new_failed, 0,
        "a refused transaction changes nothing in the kernel: {f:?}"
    );
}

/// The API server goes away for two seconds under the `kube` source, a change is made
/// meanwhile, and it comes back: the rules stay, the outage is logged once, and the change
/// is programmed after the recovery.
pub fn api_server_outage(b: Backend) {
    require_root!();
    let tag = "apiout";
    let bed = Bed::new(b, tag);
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("cluster.yaml");
    let changed = dir.path().join("changed.yaml");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&state, manifest(&[web(), hold()])).expect("write");
    std::fs::write(&changed, manifest(&[web(), hold(), more()])).expect("write");
    let mut server = FakeServer::start(&bed.c.node1.ns, &state, &kubeconfig);
    let kubeconfig = kubeconfig.display().to_string();
    let mut k = Kpng::start_with(
        b,
        &bed.c.node1.ns,
        "",
        Some(&["kube", "--kubeconfig", &kubeconfig]),
        &[],
        &[],
    );
    let prober = bed.prober();
    let t0 = Instant::now();
    server.command("stop");
    k.wait_logged("the outage noticed", |s| {
        s.contains("API server unreachable")
    });
    let detect = t0.elapsed();
    server.command(&format!("apply {}", changed.display()));
    // The outage lasts two seconds; kpng retries meanwhile.
    std::thread::sleep(Duration::from_secs(2));
    let t1 = Instant::now();
    server.command("restart");
    k.wait_logged("the recovery", |s| s.contains("API server reachable again"));
    bed.wait_served(12, "the change made during the outage");
    let restore = t1.elapsed();
    let f = prober.finish(detect, restore);
    report(b, tag, "API server outage of 2 s (kube source)", &f);
    let err = k.stderr();
    assert_eq!(
        err.matches("API server unreachable").count(),
        1,
        "one warning per outage:\n{err}"
    );
    assert!(
        f.held_lost.is_none(),
        "API server outage: the established connection was lost: {f:?}"
    );
    assert_eq!(f.new_failed, 0, "the rules stay during the outage: {f:?}");
}
