//! The backend driven through its trait, with a recording capture and real sockets on loopback:
//! clients connect straight to the listener ports (what the capture would redirect to), and
//! endpoints are small servers on 127.0.0.1 that answer with their name.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use kpng_backend::{Backend, SyncRequest};
use kpng_model::{Change, Diff, Endpoint, Protocol, ServicePort, SessionAffinity, Snapshot};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

use super::*;
use crate::capture::{Recorded, Recorder};
use crate::entries::{Action, EntryKey};
use crate::testutil::service_port;

/// A TCP endpoint: greets every connection with `NAME`, then answers every line `NAME LINE`.
async fn tcp_endpoint(name: &'static str) -> (Endpoint, tokio::task::JoinHandle<()>) {
    slow_tcp_endpoint(name, Duration::ZERO).await
}

/// [`tcp_endpoint`], taking `think` to answer each line (the greeting comes at once).
async fn slow_tcp_endpoint(
    name: &'static str,
    think: Duration,
) -> (Endpoint, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let (r, mut w) = stream.into_split();
                w.write_all(format!("{name}\n").as_bytes()).await.unwrap();
                let mut lines = BufReader::new(r).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tokio::time::sleep(think).await;
                    if w.write_all(format!("{name} {line}\n").as_bytes())
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (loopback(port), task)
}

/// A UDP endpoint: answers every datagram with `NAME`.
async fn udp_endpoint(name: &'static str) -> (Endpoint, tokio::task::JoinHandle<()>) {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let port = socket.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let mut buf = [0u8; 1500];
        loop {
            let (_, from) = socket.recv_from(&mut buf).await.unwrap();
            socket.send_to(name.as_bytes(), from).await.unwrap();
        }
    });
    (loopback(port), task)
}

fn loopback(port: u16) -> Endpoint {
    Endpoint {
        ip: "127.0.0.1".parse().unwrap(),
        port,
        is_local: true,
        ready: true,
        serving: true,
        terminating: false,
    }
}

fn with_endpoints(protocol: Protocol, eps: &[Endpoint]) -> Arc<ServicePort> {
    Arc::new(service_port("web", protocol, "10.96.0.1", eps))
}

fn backend() -> (UserspaceBackend, Recorder) {
    let recorder = Recorder::new();
    let b = UserspaceBackend::new(UserspaceConfig::default(), Box::new(recorder.clone()));
    (b, recorder)
}

fn snapshot(ports: &[&Arc<ServicePort>]) -> Snapshot {
    Snapshot {
        ports: ports
            .iter()
            .map(|p| (p.key.clone(), (*p).clone()))
            .collect(),
        ..Snapshot::default()
    }
}

fn full(b: &mut UserspaceBackend, ports: &[&Arc<ServicePort>]) -> usize {
    let snap = snapshot(ports);
    b.sync(&SyncRequest {
        diff: &Diff::full(&snap),
        snapshot: &snap,
        full: true,
    })
    .expect("full sync")
    .operations
}

fn change(
    b: &mut UserspaceBackend,
    old: Option<&Arc<ServicePort>>,
    new: Option<&Arc<ServicePort>>,
) -> Result<usize, BackendError> {
    let key = old.or(new).map(|p| p.key.clone()).unwrap();
    let snap = snapshot(&new.into_iter().collect::<Vec<_>>());
    let diff = Diff {
        changes: BTreeMap::from([(
            key,
            Change {
                old: old.cloned(),
                new: new.cloned(),
            },
        )]),
        node_changed: false,
        ..Diff::default()
    };
    b.sync(&SyncRequest {
        diff: &diff,
        snapshot: &snap,
        full: false,
    })
    .map(|s| s.operations)
}

fn listener(b: &UserspaceBackend, sp: &ServicePort) -> SocketAddr {
    let port = b.listener_ports(&sp.key).expect("listening").internal;
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Connects to the listener and returns the stream and the endpoint's greeting.
async fn connect(to: SocketAddr) -> (BufReader<TcpStream>, String) {
    let stream = TcpStream::connect(to).await.unwrap();
    let mut reader = BufReader::new(stream);
    let mut greeting = String::new();
    reader.read_line(&mut greeting).await.unwrap();
    (reader, greeting.trim().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_connections_are_spread_round_robin() {
    let (a, _ta) = tcp_endpoint("a").await;
    let (bb, _tb) = tcp_endpoint("b").await;
    let (c, _tc) = tcp_endpoint("c").await;
    let sp = with_endpoints(Protocol::Tcp, &[a, bb, c]);
    let (mut b, _) = backend();
    full(&mut b, &[&sp]);
    let mut seen = Vec::new();
    for _ in 0..6 {
        seen.push(connect(listener(&b, &sp)).await.1);
    }
    assert_eq!(seen, ["a", "b", "c", "a", "b", "c"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_established_connection_drains_when_its_endpoint_leaves() {
    let (a, _ta) = tcp_endpoint("a").await;
    let (bb, _tb) = tcp_endpoint("b").await;
    let both = with_endpoints(Protocol::Tcp, &[a, bb.clone()]);
    let (mut b, _) = backend();
    full(&mut b, &[&both]);
    let to = listener(&b, &both);
    let (mut conn, name) = connect(to).await;

    // The endpoint that serves `conn` leaves the Service.
    assert_eq!(name, "a", "round robin starts with the first endpoint");
    let only_second = with_endpoints(Protocol::Tcp, &[bb]);
    change(&mut b, Some(&both), Some(&only_second)).unwrap();
    assert_eq!(listener(&b, &only_second), to, "the listener stays");

    conn.get_mut().write_all(b"still there?\n").await.unwrap();
    let mut line = String::new();
    conn.read_line(&mut line).await.unwrap();
    assert_eq!(line.trim(), format!("{name} still there?"));
    for _ in 0..3 {
        let (_, other) = connect(to).await;
        assert_ne!(other, name, "new connections go to the remaining endpoint");
    }

    // Even the whole Service going away leaves the connection alone.
    change(&mut b, Some(&only_second), None).unwrap();
    assert!(b.listener_ports(&both.key).is_none());
    conn.get_mut().write_all(b"and now?\n").await.unwrap();
    line.clear();
    conn.read_line(&mut line).await.unwrap();
    assert_eq!(line.trim(), format!("{name} and now?"));
}

/// Opens a connection with a blocking connect, which returns once the kernel completed the
/// handshake: on a current-thread runtime the proxy's listener task cannot run meanwhile, so the
/// connection waits in the listener's accept queue.
fn queued_connection(to: SocketAddr) -> BufReader<TcpStream> {
    let stream = std::net::TcpStream::connect(to).unwrap();
    stream.set_nonblocking(true).unwrap();
    BufReader::new(TcpStream::from_std(stream).unwrap())
}

/// Reads one line; `Err` when the connection was reset or closed instead.
async fn line(conn: &mut BufReader<TcpStream>) -> std::io::Result<String> {
    let mut line = String::new();
    match conn.read_line(&mut line).await? {
        0 => Err(std::io::ErrorKind::UnexpectedEof.into()),
        _ => Ok(line.trim().to_string()),
    }
}

// Current-thread: see `queued_connection`.
#[tokio::test]
async fn a_closing_listener_serves_the_connections_the_kernel_completed() {
    let (a, _ta) = tcp_endpoint("a").await;
    let sp = with_endpoints(Protocol::Tcp, &[a]);
    let (mut b, _) = backend();
    full(&mut b, &[&sp]);
    let to = listener(&b, &sp);
    let mut queued: Vec<_> = (0..3).map(|_| queued_connection(to)).collect();

    // The Service goes away while they wait to be accepted: its listener closes.
    change(&mut b, Some(&sp), None).unwrap();
    for conn in &mut queued {
        assert_eq!(line(conn).await.expect("served, not reset"), "a");
    }
    assert_eq!(
        TcpStream::connect(to).await.map(drop).unwrap_err().kind(),
        std::io::ErrorKind::ConnectionRefused,
        "the listener is closed"
    );
}

/// A backend whose proxy gives connections `grace` when kpng stops.
fn backend_with_drain(grace: Duration) -> UserspaceBackend {
    let config = UserspaceConfig {
        drain_on_exit: grace,
        ..UserspaceConfig::default()
    };
    UserspaceBackend::new(config, Box::new(Recorder::new()))
}

#[tokio::test]
async fn on_exit_connections_awaiting_an_answer_get_it_and_idle_ones_end() {
    const THINK: Duration = Duration::from_millis(400);
    let (a, _ta) = slow_tcp_endpoint("a", THINK).await;
    let sp = with_endpoints(Protocol::Tcp, &[a]);
    let mut b = backend_with_drain(Duration::from_secs(30));
    full(&mut b, &[&sp]);
    let to = listener(&b, &sp);
    let (mut idle, _) = connect(to).await;
    let (mut asking, _) = connect(to).await;
    asking.get_mut().write_all(b"question\n").await.unwrap();
    let mut queued = queued_connection(to);

    // kpng stops: the drain is taken, then the backend dropped (as `serve` does).
    let started = std::time::Instant::now();
    let drain = tokio::spawn(b.exit_drain().expect("the proxy has connections to drain"));
    drop(b);
    assert_eq!(line(&mut queued).await.expect("served, not reset"), "a");
    assert_eq!(
        TcpStream::connect(to).await.map(drop).unwrap_err().kind(),
        std::io::ErrorKind::ConnectionRefused,
        "new connections are refused while the others end"
    );
    assert!(
        line(&mut idle).await.is_err(),
        "an idle connection ends at the stop"
    );
    assert_eq!(line(&mut asking).await.unwrap(), "a question");
    assert!(!drain.is_finished(), "the answer was on its way");
    tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .expect("the drain ends once the connections are idle, long before its grace")
        .unwrap();
    assert!(started.elapsed() >= THINK, "{:?}", started.elapsed());
    assert!(
        line(&mut asking).await.is_err(),
        "it ended after the answer"
    );
}

#[tokio::test]
async fn on_exit_a_connection_nobody_spoke_on_yet_ends_at_once() {
    // An endpoint that never speaks first (as an HTTP server).
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let _server = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            held.push(stream);
        }
    });
    let sp = with_endpoints(Protocol::Tcp, &[loopback(port)]);
    let mut b = backend_with_drain(Duration::from_secs(30));
    full(&mut b, &[&sp]);
    let mut pooled = BufReader::new(TcpStream::connect(listener(&b, &sp)).await.unwrap());
    let drain = b.exit_drain().expect("the proxy has connections to drain");
    tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .expect("not held for the grace");
    assert!(line(&mut pooled).await.is_err(), "it was ended");
}

#[tokio::test]
async fn on_exit_the_grace_bounds_the_wait_for_an_answer() {
    const GRACE: Duration = Duration::from_millis(200);
    let (a, _ta) = slow_tcp_endpoint("a", Duration::from_secs(3600)).await;
    let sp = with_endpoints(Protocol::Tcp, &[a]);
    let mut b = backend_with_drain(GRACE);
    full(&mut b, &[&sp]);
    let (mut asking, _) = connect(listener(&b, &sp)).await;
    asking.get_mut().write_all(b"question\n").await.unwrap();
    let drain = b.exit_drain().expect("the proxy has connections to drain");
    let started = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .expect("the grace bounds the drain");
    assert!(
        started.elapsed() >= GRACE,
        "it waited for the answer: {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_endpoints_a_connection_is_reset() {
    let sp = with_endpoints(Protocol::Tcp, &[]);
    let (mut b, recorder) = backend();
    full(&mut b, &[&sp]);
    let entries = recorder.current();
    assert!(
        entries.iter().any(|e| e.action == Action::Refuse),
        "the capture refuses it first: {entries:?}"
    );
    // A connection that reaches the listener anyway is reset, not left hanging.
    // (On loopback the reset can even beat `connect` returning.)
    if let Ok(mut stream) = TcpStream::connect(listener(&b, &sp)).await {
        let mut buf = [0u8; 16];
        let read = tokio::io::AsyncReadExt::read(&mut stream, &mut buf).await;
        assert!(
            matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
            "{read:?}"
        );
    }
    assert_eq!(b.metrics.unserved.get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_endpoint_is_skipped() {
    let (a, _ta) = tcp_endpoint("a").await;
    // A port nothing listens on.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        loopback(l.local_addr().unwrap().port())
    };
    let sp = with_endpoints(Protocol::Tcp, &[a, dead]);
    let (mut b, _) = backend();
    full(&mut b, &[&sp]);
    for _ in 0..4 {
        assert_eq!(connect(listener(&b, &sp)).await.1, "a");
    }
    assert!(b.metrics.connect_failures.get() >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_ip_affinity_sticks() {
    let (a, _ta) = tcp_endpoint("a").await;
    let (bb, _tb) = tcp_endpoint("b").await;
    let mut sp = service_port("web", Protocol::Tcp, "10.96.0.1", &[a, bb]);
    sp.session_affinity = Some(SessionAffinity {
        timeout_seconds: 600,
    });
    let sp = Arc::new(sp);
    let (mut b, _) = backend();
    full(&mut b, &[&sp]);
    let first = connect(listener(&b, &sp)).await.1;
    for _ in 0..5 {
        assert_eq!(connect(listener(&b, &sp)).await.1, first);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_sessions_stick_per_client_and_move_when_their_endpoint_leaves() {
    let (a, _ta) = udp_endpoint("a").await;
    let (bb, _tb) = udp_endpoint("b").await;
    let both = with_endpoints(Protocol::Udp, &[a, bb.clone()]);
    let (mut b, _) = backend();
    full(&mut b, &[&both]);
    let to = listener(&b, &both);

    async fn ask(socket: &UdpSocket) -> String {
        socket.send(b"?").await.unwrap();
        let mut buf = [0u8; 64];
        let n = socket.recv(&mut buf).await.unwrap();
        String::from_utf8_lossy(&buf[..n]).to_string()
    }
    let client1 = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    client1.connect(to).await.unwrap();
    let client2 = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    client2.connect(to).await.unwrap();
    let one = ask(&client1).await;
    let two = ask(&client2).await;
    assert_eq!(
        (one.as_str(), two.as_str()),
        ("a", "b"),
        "two clients, two sessions, round robin"
    );
    for _ in 0..3 {
        assert_eq!(ask(&client1).await, one, "a session keeps its endpoint");
    }
    assert_eq!(b.metrics.udp_sessions.get(), 2);

    // client1's endpoint leaves: its next datagram starts a session on the other one.
    let remaining = with_endpoints(Protocol::Udp, &[bb]);
    change(&mut b, Some(&both), Some(&remaining)).unwrap();
    assert_eq!(ask(&client1).await, "b");
    assert_eq!(ask(&client2).await, "b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_stay_across_changes_and_only_changed_entries_are_sent() {
    let (a, _ta) = tcp_endpoint("a").await;
    let sp = with_endpoints(Protocol::Tcp, std::slice::from_ref(&a));
    let (mut b, recorder) = backend();
    full(&mut b, &[&sp]);
    let ports = b.listener_ports(&sp.key).unwrap();
    assert_eq!(ports.external, None, "a ClusterIP Service has one listener");

    // An endpoint change touches no capture entry: one operation, the listener's new state.
    let (c, _tc) = tcp_endpoint("c").await;
    let more = with_endpoints(Protocol::Tcp, &[a.clone(), c]);
    assert_eq!(change(&mut b, Some(&sp), Some(&more)).unwrap(), 1);
    assert_eq!(recorder.calls().last(), Some(&Recorded::Update(vec![])));
    assert_eq!(b.listener_ports(&sp.key), Some(ports));

    // A node port adds a listener and its entries, nothing else.
    let mut np = (*more).clone();
    np.node_port = Some(30080);
    let np = Arc::new(np);
    change(&mut b, Some(&more), Some(&np)).unwrap();
    let with_external = b.listener_ports(&sp.key).unwrap();
    assert_eq!(with_external.internal, ports.internal);
    let external = with_external.external.expect("node port listener");
    let Some(Recorded::Update(ops)) = recorder.calls().last().cloned() else {
        panic!("an update");
    };
    assert_eq!(
        ops,
        vec![
            Op::Add(Entry {
                key: EntryKey::NodePort {
                    family: Family::V4,
                    protocol: Protocol::Tcp,
                    port: 30080
                },
                action: Action::Redirect(external),
            }),
            Op::Add(Entry {
                key: EntryKey::Listener {
                    family: Family::V4,
                    protocol: Protocol::Tcp,
                    port: external
                },
                action: Action::Member,
            }),
        ]
    );

    // Removing the Service removes every entry it had.
    change(&mut b, Some(&np), None).unwrap();
    assert_eq!(recorder.current(), Vec::<Entry>::new());
}

/// A capture that fails on demand: its next `fail` calls (`usize::MAX`: until reset) fail.
struct Flaky {
    fail: Arc<std::sync::atomic::AtomicUsize>,
    inner: Recorder,
}

impl Capture for Flaky {
    fn replace(&mut self, entries: &[Entry]) -> Result<usize, capture::CaptureError> {
        self.check()?;
        self.inner.replace(entries)
    }
    fn update(&mut self, ops: &[Op]) -> Result<usize, capture::CaptureError> {
        self.check()?;
        self.inner.update(ops)
    }
    fn cleanup(&mut self) -> Result<(), capture::CaptureError> {
        self.inner.cleanup()
    }
}

impl Flaky {
    fn check(&self) -> Result<(), capture::CaptureError> {
        use std::sync::atomic::Ordering;
        let failing = self
            .fail
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| match n {
                0 => None,
                usize::MAX => Some(usize::MAX),
                n => Some(n - 1),
            })
            .is_ok();
        if failing {
            return Err(capture::CaptureError::Refused {
                tool: "test".into(),
                status: "exit status: 1".into(),
                message: "injected failure".into(),
            });
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failed_capture_the_next_sync_replaces_it_whole() {
    let fail = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let recorder = Recorder::new();
    let mut b = UserspaceBackend::new(
        UserspaceConfig::default(),
        Box::new(Flaky {
            fail: fail.clone(),
            inner: recorder.clone(),
        }),
    );
    let (a, _ta) = tcp_endpoint("a").await;
    let sp = with_endpoints(Protocol::Tcp, std::slice::from_ref(&a));
    full(&mut b, &[&sp]);
    fail.store(usize::MAX, std::sync::atomic::Ordering::Relaxed);
    let mut np = (*sp).clone();
    np.node_port = Some(30080);
    let np = Arc::new(np);
    assert!(change(&mut b, Some(&sp), Some(&np)).is_err());
    fail.store(0, std::sync::atomic::Ordering::Relaxed);
    // Even a partial request converges: the backend knows its capture is stale.
    change(&mut b, Some(&np), Some(&np)).unwrap();
    assert!(matches!(
        recorder.calls().last(),
        Some(Recorded::Replace(_))
    ));
    assert!(
        recorder
            .current()
            .iter()
            .any(|e| matches!(e.key, EntryKey::NodePort { .. })),
        "the node port made it in: {:?}",
        recorder.current()
    );
}

/// A refused capture change says how many operations it held, as a successful one counts
/// them (it said "transaction of 0 operations" whatever it held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_capture_change_counts_its_operations() {
    let fail = Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX));
    let recorder = Recorder::new();
    let mut b = UserspaceBackend::new(
        UserspaceConfig::default(),
        Box::new(Flaky {
            fail: fail.clone(),
            inner: recorder.clone(),
        }),
    );
    let (a, _ta) = tcp_endpoint("a").await;
    let sp = with_endpoints(Protocol::Tcp, std::slice::from_ref(&a));
    let snap = snapshot(&[&sp]);
    let refused = b.sync(&SyncRequest {
        diff: &Diff::full(&snap),
        snapshot: &snap,
        full: true,
    });
    fail.store(0, std::sync::atomic::Ordering::Relaxed);
    let whole = full(&mut b, &[&sp]);
    assert!(whole > 0);
    let Err(BackendError::Transaction { operations, .. }) = refused else {
        panic!("a refused replace: {refused:?}");
    };
    assert_eq!(operations, whole, "a refused replace counts its entries");

    fail.store(usize::MAX, std::sync::atomic::Ordering::Relaxed);
    let mut np = (*sp).clone();
    np.node_port = Some(30080);
    let np = Arc::new(np);
    let refused = change(&mut b, Some(&sp), Some(&np));
    let Err(BackendError::Transaction { operations, .. }) = refused else {
        panic!("a refused update: {refused:?}");
    };
    assert!(operations > 0, "a refused update counts its operations");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sctp_and_unconfigured_families_are_not_proxied() {
    let sctp = with_endpoints(Protocol::Sctp, &[]);
    let v6 = Arc::new(service_port("six", Protocol::Tcp, "fd00:96::1", &[]));
    let recorder = Recorder::new();
    let mut b = UserspaceBackend::new(
        UserspaceConfig {
            families: vec![Family::V4],
            ..UserspaceConfig::default()
        },
        Box::new(recorder.clone()),
    );
    full(&mut b, &[&sctp, &v6]);
    assert!(b.listener_ports(&sctp.key).is_none());
    assert!(b.listener_ports(&v6.key).is_none());
    assert_eq!(recorder.current(), Vec::<Entry>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_traffic_policy_local_adds_a_short_circuit_listener() {
    let (a, _ta) = tcp_endpoint("a").await;
    let mut sp = service_port("web", Protocol::Tcp, "10.96.0.1", std::slice::from_ref(&a));
    sp.node_port = Some(30080);
    let cluster = Arc::new(sp.clone());
    sp.external_policy_local = true;
    let local = Arc::new(sp);
    let (mut b, recorder) = backend();
    full(&mut b, &[&cluster]);
    assert_eq!(b.listener_ports(&cluster.key).unwrap().short_circuit, None);

    change(&mut b, Some(&cluster), Some(&local)).unwrap();
    let ports = b.listener_ports(&local.key).unwrap();
    let short = ports.short_circuit.expect("a short-circuit listener");
    assert!(recorder.current().contains(&Entry {
        key: EntryKey::NodePortShortCircuit {
            family: Family::V4,
            protocol: Protocol::Tcp,
            port: 30080
        },
        action: Action::Redirect(short),
    }));
    // It serves: the endpoint answers through it.
    let to = SocketAddr::from(([127, 0, 0, 1], short));
    assert_eq!(connect(to).await.1, "a");

    change(&mut b, Some(&local), Some(&cluster)).unwrap();
    assert_eq!(b.listener_ports(&cluster.key).unwrap().short_circuit, None);
    assert!(
        !recorder
            .current()
            .iter()
            .any(|e| matches!(e.key, EntryKey::NodePortShortCircuit { .. })),
        "{:?}",
        recorder.current()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_take_the_ports_a_previous_run_left_when_free() {
    let (a, _ta) = tcp_endpoint("a").await;
    let mut sp = service_port("web", Protocol::Tcp, "10.96.0.1", std::slice::from_ref(&a));
    sp.node_port = Some(30080);
    let sp = Arc::new(sp);
    let free_port = || {
        let l = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (internal, external) = (free_port(), free_port());
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    let previous = vec![
        Entry {
            key: EntryKey::Vip {
                ip: sp.cluster_ip,
                protocol: Protocol::Tcp,
                port: 80,
            },
            action: Action::Redirect(internal),
        },
        Entry {
            key: EntryKey::NodePort {
                family: Family::V4,
                protocol: Protocol::Tcp,
                port: 30080,
            },
            action: Action::Redirect(external),
        },
    ];
    let recorder = Recorder::with_previous(previous);
    let mut b = UserspaceBackend::new(UserspaceConfig::default(), Box::new(recorder.clone()));
    full(&mut b, &[&sp]);
    let ports = b.listener_ports(&sp.key).unwrap();
    assert_eq!((ports.internal, ports.external), (internal, Some(external)));
    assert_eq!(connect(listener(&b, &sp)).await.1, "a");

    // A port someone else holds now: the OS picks another.
    let other = Arc::new(service_port("other", Protocol::Tcp, "10.96.0.2", &[a]));
    let recorder = Recorder::with_previous(vec![Entry {
        key: EntryKey::Vip {
            ip: other.cluster_ip,
            protocol: Protocol::Tcp,
            port: 80,
        },
        action: Action::Redirect(taken_port),
    }]);
    let mut b = UserspaceBackend::new(UserspaceConfig::default(), Box::new(recorder));
    full(&mut b, &[&other]);
    assert_ne!(b.listener_ports(&other.key).unwrap().internal, taken_port);
    drop(taken);
}

/// The backend contract at the fake level (the kit's conformance scenarios): the recording
/// capture is the data plane (its entries), and the proxy runs on a runtime of its own. Where
/// a frontend dispatches is read from the committed entries and the listeners' endpoint lists
/// ([`plane`]).
mod plane;
mod conformance_harness {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use kpng_backend_kit::conformance::{Client, Dispatch, Frontend};

    use super::*;

    /// The backend, called inside its runtime (it opens listeners and spawns their tasks).
    struct InRuntime {
        runtime: tokio::runtime::Runtime,
        backend: UserspaceBackend,
    }

    impl Backend for InRuntime {
        fn name(&self) -> &'static str {
            self.backend.name()
        }
        fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncStats, BackendError> {
            let _entered = self.runtime.enter();
            self.backend.sync(request)
        }
        fn cleanup(&mut self) -> Result<(), BackendError> {
            let _entered = self.runtime.enter();
            self.backend.cleanup()
        }
    }

    pub struct UserspaceHarness {
        backend: InRuntime,
        recorder: Recorder,
        fail: Arc<AtomicUsize>,
    }

    impl kpng_backend_kit::conformance::Harness for UserspaceHarness {
        fn backend(&mut self) -> &mut dyn Backend {
            &mut self.backend
        }

        fn objects(&self) -> usize {
            self.recorder.current().len()
        }

        fn fail_next(&mut self) {
            self.fail.store(1, Ordering::SeqCst);
        }

        fn dispatch(&self, to: Frontend, from: Client) -> Dispatch {
            let entries = self.recorder.current();
            super::plane::dispatch(&self.backend.backend, &entries, to, from)
        }

        fn connect(&mut self, to: Frontend, from: Client) -> Dispatch {
            let entries = self.recorder.current();
            super::plane::connect(&self.backend.backend, &entries, to, from)
        }
    }

    pub fn make() -> UserspaceHarness {
        let recorder = Recorder::new();
        let fail = Arc::new(AtomicUsize::new(0));
        let capture = Flaky {
            fail: fail.clone(),
            inner: recorder.clone(),
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        // Pods are recognised by address, as in the other backends' harnesses.
        let config = UserspaceConfig {
            detect_local: DetectLocal::ClusterCidr(vec![
                "10.244.0.0/16".parse().expect("cidr"),
                "fd00:10:244::/48".parse().expect("cidr"),
            ]),
            ..UserspaceConfig::default()
        };
        let backend = UserspaceBackend::new(config, Box::new(capture));
        UserspaceHarness {
            backend: InRuntime { runtime, backend },
            recorder,
            fail,
        }
    }
}

kpng_backend_kit::conformance_tests!(conformance_harness::make);

/// `kpng_userspace_service_ports` follows the ports served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_port_count_is_exported() {
    let (ep, _task) = tcp_endpoint("a").await;
    let sp = with_endpoints(Protocol::Tcp, &[ep]);
    let (mut b, _r) = backend();
    let mut registry = prometheus_client::registry::Registry::default();
    b.register_metrics(&mut registry);
    full(&mut b, &[&sp]);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.lines().any(|l| l == "kpng_userspace_service_ports 1"),
        "{text}"
    );
}

#[tokio::test]
async fn on_exit_without_grace_nothing_is_awaited() {
    let (a, _ta) = slow_tcp_endpoint("a", Duration::from_secs(3600)).await;
    let sp = with_endpoints(Protocol::Tcp, &[a]);
    let mut b = backend_with_drain(Duration::ZERO);
    full(&mut b, &[&sp]);
    let (mut asking, _) = connect(listener(&b, &sp)).await;
    asking.get_mut().write_all(b"question\n").await.unwrap();
    let drain = b.exit_drain().expect("the proxy has connections to drain");
    tokio::time::timeout(Duration::from_secs(1), drain)
        .await
        .expect("`--drain-on-exit 0` waits for nothing");
}
