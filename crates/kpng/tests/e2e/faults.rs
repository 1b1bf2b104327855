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

use std::path::Path;
use std::time::{Duration, Instant};

use kpng_testkit::{Cluster, Spawned, require_root};

use super::Backend;
use super::harness::*;
use super::scenarios::LINE_SERVER;

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

/// Runs the fault `inject` (commands run in node1, in order) against backend `b`.
#[track_caller]
pub fn run_fault(b: Backend, tag: &str, what: &str, inject: &[&[&str]]) -> Figures {
    require_root!(Figures {
        detect: Duration::ZERO,
        restore: Duration::ZERO,
        new_failed: 0,
        new_total: 0,
        held_exchanges: 0,
        held_lost: None,
    });
    let c = Cluster::create(&b.prefix(tag)).expect("cluster");
    let _echo = c.pod("pod1b").start_echo(EP_PORT).expect("echo");
    let mut line_server = c
        .pod("pod2a")
        .ns
        .spawn([
            "python3",
            "-c",
            LINE_SERVER,
            "pod2a",
            "10.244.2.2",
            &EP_PORT.to_string(),
        ])
        .expect("python3 line server");
    line_server
        .wait_for_line(|l| l == "ready", Duration::from_secs(10))
        .expect("line server ready");
    let web = || svc("web", 10, "ClusterIP", "", &[("pod1b", Cond::Ready)]);
    let hold = || svc("hold", 111, "ClusterIP", "", &[("pod2a", Cond::Ready)]);
    let mut k = Kpng::start(b, &c.node1.ns, &manifest(&[web(), hold()]), &[]);
    // Our own changes are not tampering: one more sync of a real change, then none reported.
    k.apply(&manifest(&[
        web(),
        hold(),
        svc("more", 12, "ClusterIP", "", &[("pod1b", Cond::Ready)]),
    ]));
    assert!(
        !k.stderr().contains("changed by someone else"),
        "kpng took its own changes for tampering:\n{}",
        k.stderr()
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let stop = dir.path().join("repaired");
    let mut prober = c
        .pod("pod1a")
        .ns
        .spawn([
            "python3",
            "-c",
            PROBER,
            &cip(111, false).to_string(),
            &SVC_PORT.to_string(),
            &cip(10, false).to_string(),
            &SVC_PORT.to_string(),
            &stop.display().to_string(),
        ])
        .expect("prober");
    prober
        .wait_for_line(|l| l == "ready", Duration::from_secs(10))
        .expect("prober ready");

    let (ok, failed) = k.sync_counts();
    // From before the commands: the figures include their own run time (an upper bound).
    let t0 = Instant::now();
    for cmd in inject {
        c.node1.ns.run_ok(cmd.iter().copied()).expect("inject");
    }
    k.wait_logged("tampering detected", |s| {
        s.contains("changed by someone else") || s.contains("were flushed")
    });
    let detect = t0.elapsed();
    k.wait_synced(ok, failed);
    let restore = t0.elapsed();
    // Traffic flows again: a new connection is answered by the endpoint.
    let r = probe(
        &c.pod("pod1a").ns,
        kpng_testkit::Proto::Tcp,
        sa(cip(10, false), SVC_PORT),
        OK_T,
    );
    assert!(r.is_ok(), "{what}: web after the repair: {r:?}");
    let figures = finish(&mut prober, &stop, detect, restore);
    println!(
        "FAULT {} {what}: detected in {:?}, restored in {:?}; new connections failed {}/{}; \
         held connection: {} exchanges, {}",
        b.prefix(tag),
        figures.detect,
        figures.restore,
        figures.new_failed,
        figures.new_total,
        figures.held_exchanges,
        figures.held_lost.as_deref().unwrap_or("kept"),
    );
    figures
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

/// `iptables -t nat -F` (iptables backends, their variant's tool).
pub fn iptables_nat_flushed(b: Backend) {
    let tool = b.iptables_tool().expect("an iptables backend");
    let what = format!("{tool} -t nat -F");
    let f = run_fault(b, "natflush", &what, &[&[tool, "-t", "nat", "-F"]]);
    assert_repaired("nat flushed", &f);
}

/// `iptables -t nat -F; iptables -t nat -X`: our chains deleted too.
pub fn iptables_nat_deleted(b: Backend) {
    let tool = b.iptables_tool().expect("an iptables backend");
    let what = format!("{tool} -t nat -F; -X");
    let f = run_fault(
        b,
        "natdel",
        &what,
        &[&[tool, "-t", "nat", "-F"], &[tool, "-t", "nat", "-X"]],
    );
    assert_repaired("nat chains deleted", &f);
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
    let mut second = k.spawn_another(&c.node1.ns);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = second.try_wait().expect("wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "the second kpng still runs");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(!status.success());
    let err = second.stderr_text();
    assert!(
        err.contains(&format!("another kpng (pid {pid}) already runs")),
        "{err}"
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
}
