//! Real-socket end-to-end tests of what the eBPF backend's programs remember per socket (the
//! reverse map: which endpoint a socket reaches under which Service address) and of its UDP
//! semantics next to kube-proxy's: replies' source addresses, a stale translation after a
//! disconnect, a UDP Service without endpoints, and sockets kpng cannot find to destroy.
//! The shared suite and the rest of the backend's own tests are in `e2e_ebpf.rs`.

// Only the harness; not the shared suite (e2e_ebpf.rs runs it).
#[allow(unused_macros, unused_imports)]
mod e2e;

use std::time::Duration;

use e2e::Backend;
use e2e::harness::*;
use e2e::sockets::*;
use kpng_testkit::{Cluster, Spawned, require_root};

const B: Backend = Backend::Ebpf;

/// One unconnected UDP socket sends to Services A (argv[1]) and B (argv[2]), both on port
/// argv[3], whose only endpoint is the same pod (argv[4], port argv[5]): rounds of one
/// datagram to each, the replies read after both were sent; then one datagram to the endpoint
/// directly; then rounds of one datagram to each of the three. Every reply must come from the
/// address its datagram went to: prints `bad …` for each round that did not, `done` at the end.
const TWO_SERVICES: &str = r#"
import socket, sys
a = (sys.argv[1], int(sys.argv[3])); b = (sys.argv[2], int(sys.argv[3]))
ep = (sys.argv[4], int(sys.argv[5]))
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
def round(dsts):
    for d in dsts: s.sendto(b"x", d)
    got = set()
    for _ in dsts:
        try: got.add(s.recvfrom(200)[1])
        except socket.timeout: got.add("timeout")
    if got != set(dsts): print("bad", sorted(map(str, dsts)), "got", sorted(map(str, got)), flush=True)
for _ in range(10): round([a, b])
round([ep])
for _ in range(10): round([a, b, ep])
print("done", flush=True)
"#;

/// Two Services whose only endpoint is one pod, used by one unconnected socket: the reverse
/// map is keyed by (socket, endpoint), so the second Service's translation used to overwrite
/// the first's, and both Services' replies read as the second's. Now the second is left to the
/// nftables rules (whose conntrack keeps the two apart), and so is every Service datagram once
/// the socket also sends to the endpoint directly.
#[test]
fn an_unconnected_socket_using_two_services_of_one_endpoint_gets_each_reply_from_its_service() {
    require_root!();
    let c = Cluster::create(&B.prefix("twosvc")).expect("cluster");
    let _echo = echo_in(&c, &["pod1b"]);
    let one = [("pod1b", Cond::Ready)];
    let _k = Kpng::start(
        B,
        &c.node1.ns,
        &manifest(&[
            svc("a", 10, "ClusterIP", "", &one),
            svc("b", 11, "ClusterIP", "", &one),
        ]),
        &[],
    );
    let ep = c.pod("pod1b").addr_v4(EP_PORT);
    let out = python(
        &c,
        "pod1a",
        TWO_SERVICES,
        &[
            cip(10, false).to_string(),
            cip(11, false).to_string(),
            SVC_PORT.to_string(),
            ep.ip().to_string(),
            ep.port().to_string(),
        ],
    );
    assert_eq!(out.trim(), "done", "replies from the wrong address:\n{out}");
}

/// A UDP socket connected through a Service, disconnected (`connect(AF_UNSPEC)`, which no
/// program sees), then connected to the endpoint itself: its peer is the endpoint. Prints the
/// peer after each connect.
const RECONNECT: &str = r#"
import ctypes, socket, struct, sys
svc = (sys.argv[1], int(sys.argv[2])); ep = (sys.argv[3], int(sys.argv[4]))
libc = ctypes.CDLL(None, use_errno=True)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect(svc); print("%s:%d" % s.getpeername(), flush=True)
unspec = ctypes.create_string_buffer(struct.pack("H14x", socket.AF_UNSPEC), 16)
assert libc.connect(s.fileno(), unspec, 16) == 0, ctypes.get_errno()
s.connect(ep); print("%s:%d" % s.getpeername(), flush=True)
"#;

#[test]
fn a_socket_reconnected_directly_after_a_disconnect_sees_the_endpoint_as_its_peer() {
    require_root!();
    let c = Cluster::create(&B.prefix("reconn")).expect("cluster");
    let _k = Kpng::start(
        B,
        &c.node1.ns,
        &manifest(&[svc("a", 10, "ClusterIP", "", &[("pod1b", Cond::Ready)])]),
        &[],
    );
    let ep = c.pod("pod1b").addr_v4(EP_PORT);
    let out = python(
        &c,
        "pod1a",
        RECONNECT,
        &[
            cip(10, false).to_string(),
            SVC_PORT.to_string(),
            ep.ip().to_string(),
            ep.port().to_string(),
        ],
    );
    let peers: Vec<&str> = out.lines().collect();
    assert_eq!(
        peers,
        [format!("{}:{SVC_PORT}", cip(10, false)), ep.to_string()],
        "{out}"
    );
}

/// A UDP client of a Service without endpoints, as with kube-proxy: `connect()` and `send()`
/// succeed, the receive fails with ECONNREFUSED (the REJECT rule's ICMP error), an unconnected
/// `sendto()` succeeds; once endpoints come (file argv[3]), the same connected socket is
/// answered. Prints each step. An IPv6 address (`::ffff:10.96.0.12`) makes dual-stack AF_INET6
/// sockets, whose every send() runs the sendmsg4 hook with the connected peer.
const NO_ENDPOINTS_YET: &str = r#"
import os, socket, sys, time
dst = (sys.argv[1], int(sys.argv[2]))
family = socket.AF_INET6 if ":" in dst[0] else socket.AF_INET
s = socket.socket(family, socket.SOCK_DGRAM); s.settimeout(2)
s.connect(dst); print("connected", flush=True)
s.send(b"x")
try: s.recv(200); print("answered", flush=True)
except ConnectionRefusedError: print("refused at recv", flush=True)
u = socket.socket(family, socket.SOCK_DGRAM)
u.sendto(b"x", dst); print("sent", flush=True)
while not os.path.exists(sys.argv[3]): time.sleep(0.05)
s.settimeout(0.3)
for _ in range(30):
    try:
        s.send(b"x"); print("got", s.recv(200).decode().split()[0], flush=True); break
    except OSError: pass
"#;

#[test]
fn a_udp_service_without_endpoints_fails_at_recv_and_serves_the_socket_once_they_come() {
    require_root!();
    let c = Cluster::create(&B.prefix("udpnoep")).expect("cluster");
    let _echo = echo_in(&c, &["pod1b"]);
    let mut k = Kpng::start(
        B,
        &c.node1.ns,
        &manifest(&[svc("dns", 12, "ClusterIP", "", &[])]),
        &[],
    );
    let signals = Signals::new();
    let mut clients: Vec<Spawned> = [cip(12, false), v4_mapped(cip(12, false))]
        .iter()
        .map(|dst| {
            spawn_python(
                &c,
                "pod1a",
                NO_ENDPOINTS_YET,
                &[dst.to_string(), SVC_PORT.to_string(), signals.path("come")],
            )
        })
        .collect();
    for client in &mut clients {
        for step in ["connected", "refused at recv", "sent"] {
            let line = client
                .wait_for_line(|_| true, Duration::from_secs(5))
                .unwrap_or_else(|e| panic!("{step}: {e}: {}", client.stderr_text()));
            assert_eq!(line, step, "{}", client.stderr_text());
        }
    }
    k.apply(&manifest(&[svc(
        "dns",
        12,
        "ClusterIP",
        "",
        &[("pod1b", Cond::Ready)],
    )]));
    signals.raise("come");
    for client in &mut clients {
        let line = client
            .wait_for_line(|_| true, Duration::from_secs(15))
            .unwrap_or_else(|e| panic!("an answer: {e}: {}", client.stderr_text()));
        assert_eq!(line, "got pod1b", "{}", client.stderr_text());
    }
}

/// A connected UDP socket through a Service, held open until file argv[3] exists; prints
/// `ready` once answered.
const HELD_UDP: &str = r#"
import os, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
s.connect((sys.argv[1], int(sys.argv[2]))); s.send(b"x"); s.recv(200)
print("ready", flush=True)
while not os.path.exists(sys.argv[3]): time.sleep(0.05)
"#;

/// A kpng in a PID namespace of its own (a DaemonSet without `hostPID`) cannot see the pods'
/// processes in the cgroup's `cgroup.procs`, so it cannot find their network namespaces to
/// destroy a connected UDP socket whose endpoint left: it says so at start and when it
/// happens, and counts the socket as a failure (it used to take it for one closed meanwhile).
#[test]
fn a_kpng_without_host_pids_counts_and_says_the_udp_sockets_it_cannot_destroy() {
    require_root!();
    let c = Cluster::create(&B.prefix("hostpid")).expect("cluster");
    let _echo = echo_in(&c, &["pod1b", "pod2a"]);
    let mut k = Kpng::start_wrapped(
        B,
        &c.node1.ns,
        &manifest(&[svc("dns", 10, "ClusterIP", "", &[("pod1b", Cond::Ready)])]),
        &[],
        &["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"],
    );
    assert!(
        k.stderr()
            .contains("kpng runs in a PID namespace of its own"),
        "{}",
        k.stderr()
    );
    let signals = Signals::new();
    let mut client = spawn_python(
        &c,
        "pod1a",
        HELD_UDP,
        &[
            cip(10, false).to_string(),
            SVC_PORT.to_string(),
            signals.path("stop"),
        ],
    );
    client
        .wait_for_line(|l| l == "ready", Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{e}: {}", client.stderr_text()));
    k.apply(&manifest(&[svc(
        "dns",
        10,
        "ClusterIP",
        "",
        &[("pod2a", Cond::Ready)],
    )]));
    k.wait_logged("the warning", |err| {
        err.contains("1 UDP sockets translated to endpoints that left their Service were not found")
            && err.contains("run kpng with hostPID")
    });
    let metrics = scrape_metrics(&c);
    assert_eq!(
        sample(&metrics, "kpng_ebpf_udp_socket_destroy_failures_total"),
        Some(1.0),
        "{metrics}"
    );
    signals.raise("stop");
}
