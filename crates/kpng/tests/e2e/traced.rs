//! Every probe is also traced: `kpng trace` must say what the packet did.
//!
//! While a scenario's kpng runs in node1, each probe sent from node1, its pods or the outside
//! (the traffic node1's rules handle) is traced through kpng's admin socket with the probe's
//! own source address, and the trace's verdict, endpoint set and masquerade decision are
//! checked against what the packet did. Probes from node2 and its pods pass through no kpng
//! and are not traced. This is the proof that the tracer tells the truth, for every backend.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use kpng_testkit::{Netns, Outcome, ProbeResult, Proto};

thread_local! {
    /// The admin socket of the kpng this test runs, while it runs (each test is one thread).
    static TRACER: RefCell<Option<PathBuf>> = const { RefCell::new(None) };
    /// Probes traced and checked so far on this thread.
    static CHECKED: RefCell<usize> = const { RefCell::new(0) };
}

/// kpng serves its admin socket at `socket` from now on.
pub fn serving(socket: &Path) {
    TRACER.with(|t| *t.borrow_mut() = Some(socket.to_path_buf()));
}

/// kpng stopped: probes are not traced until it serves again.
pub fn stopped() {
    TRACER.with(|t| *t.borrow_mut() = None);
}

/// How many probes this test has checked against a trace.
pub fn checked() -> usize {
    CHECKED.with(|c| *c.borrow())
}

/// The sync generation of the running kpng when its data plane holds exactly its model, before
/// a probe: a probe is compared with a trace only if nothing was programmed in between (a test
/// that waits for a change probes while the change is on its way).
pub fn generation() -> Option<u64> {
    let socket = TRACER.with(|t| t.borrow().clone())?;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kpng"))
        .args(["status", "-o", "json", "--admin-socket"])
        .arg(&socket)
        .output()
        .expect("run kpng status");
    if !out.status.success() {
        // kpng is down (a fault test killed it): nothing to compare with.
        return None;
    }
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    (status["inSync"] == true)
        .then(|| status["generation"].as_u64())
        .flatten()
}

/// Traces the flow of `results` (one source, one target) and checks each result against it,
/// when kpng's programmed state is the one it had before the probe (`before`, from
/// [`generation`]).
#[track_caller]
pub fn check(
    ns: &Netns,
    proto: Proto,
    target: SocketAddr,
    results: &[ProbeResult],
    before: Option<u64>,
) {
    let Some(socket) = TRACER.with(|t| t.borrow().clone()) else {
        return;
    };
    let Some(before) = before else {
        return;
    };
    let name = ns.name();
    if ["-node2", "-pod2", "-node3", "-pod3"]
        .iter()
        .any(|n| name.contains(n))
    {
        return;
    }
    let Some(from) = results.iter().find_map(|r| r.client_addr).map(|a| a.ip()) else {
        return;
    };
    let proto_word = match proto {
        Proto::Tcp => "tcp",
        Proto::Udp => "udp",
    };
    let trace = kpng_trace(&socket, &from.to_string(), &target.to_string(), proto_word);
    if trace["inSync"] != true || trace["generation"].as_u64() != Some(before) {
        // Programmed while the probe ran: the packet and the trace saw different states.
        return;
    }
    let verdict = trace["verdict"].as_str().unwrap_or_default().to_string();
    let endpoints: Vec<String> = trace["endpoints"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| e.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let masquerade = trace["masquerade"] == true;
    let hairpin = trace["hairpin"] == true;
    for r in results {
        let what =
            format!("{proto_word} {from} → {target}: the trace says {trace}\nthe probe: {r}");
        match verdict.as_str() {
            "dnat" => {
                assert_eq!(r.outcome, Outcome::Ok, "{what}");
                let server = r.server_addr.expect("an answer names the server address");
                assert!(
                    endpoints.contains(&server.to_string()),
                    "answered by {server}, not one of the traced endpoints: {what}"
                );
                let seen = r
                    .client_addr_seen_by_server
                    .expect("an answer names the client")
                    .ip();
                // The eBPF backend translates the sockets of node1 and its pods (their
                // namespaces are in its cgroup) at connect(), and the trace says so: never
                // masqueraded. (Load-balancer IPs with source ranges stay with the rules.)
                // The harness attaches to a cgroup below the root: the trace gives both
                // outcomes (atSocketIfInCgroup), and the client's cgroup decides which holds.
                let in_programs_cgroup =
                    kpng_testkit::cgroups::of(ns.name()).is_some_and(|g| g.ends_with("local"));
                let socket_lb = trace["translatedAtSocket"] == true
                    || (trace["atSocketIfInCgroup"].is_string() && in_programs_cgroup);
                if socket_lb {
                    assert!(
                        in_programs_cgroup,
                        "traced as translated at the socket, from outside the programs' cgroup: {what}"
                    );
                    // The client's own address: the pod's, or the node's address towards
                    // that endpoint.
                    let node = super::harness::NODE1_IPS;
                    assert!(
                        seen == from || (node.contains(&seen) && node.contains(&from)),
                        "translated at the socket, the server saw {seen}: {what}"
                    );
                } else if masquerade || (hairpin && server.ip() == from) {
                    assert!(
                        super::harness::NODE1_IPS.contains(&seen),
                        "traced as masqueraded, but the server saw {seen}: {what}"
                    );
                } else {
                    assert_eq!(seen, from, "traced as not masqueraded: {what}");
                }
            }
            "reject" => {
                let eperm = r.outcome == Outcome::Error
                    && r.message
                        .as_deref()
                        .is_some_and(|m| m.contains("Operation not permitted"));
                assert!(r.outcome == Outcome::Refused || eperm, "{what}");
            }
            "drop" => {
                // The node's own packet, dropped on its way out (an unallocated Service IP):
                // the sending socket gets EPERM at once instead of waiting.
                let local_eperm = super::harness::NODE1_IPS.contains(&from)
                    && r.outcome == Outcome::Error
                    && r.message
                        .as_deref()
                        .is_some_and(|m| m.contains("Operation not permitted"));
                assert!(r.outcome == Outcome::Timeout || local_eperm, "{what}");
            }
            // Not kpng's (or left alone by this backend): nothing to compare.
            _ => continue,
        }
        CHECKED.with(|c| *c.borrow_mut() += 1);
    }
}

/// `kpng trace … -o json` against the running kpng; panics when it does not answer.
fn kpng_trace(socket: &Path, from: &str, to: &str, proto: &str) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kpng"))
        .args([
            "trace", "--from", from, "--to", to, "--proto", proto, "-o", "json",
        ])
        .arg("--admin-socket")
        .arg(socket)
        .output()
        .expect("run kpng trace");
    let trace: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "kpng trace {from} → {to}: {e}: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    // Exit 5 is a trace that matches no Service frontend (docs/observability.md), printed
    // all the same.
    let no_service = trace["service"].is_null() && trace["error"]["code"] == "noMatch";
    assert!(
        out.status.success() || (out.status.code() == Some(5) && no_service),
        "kpng trace {from} → {to}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    trace
}
