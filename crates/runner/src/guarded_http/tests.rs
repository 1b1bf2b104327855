//! With real sockets on loopback: 127.0.0.9 and 127.0.0.10 are two peers (addresses the
//! runner's other tests listen on, 127.0.0.1 and .2, are left alone, so that a client port
//! here never takes a port another test picked).

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream as StdStream};

use axum::routing::get;

use super::*;

/// The flood's address: none the runner's other tests bind servers on (127.0.0.1, .2), so
/// that the flood's hundreds of client ports never take a port another test picked to listen on.
const FLOODER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9));
const PROBER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 10));

/// How long a test waits for what must happen before it calls it a failure (a bound on a
/// hang, not a timing assertion: each condition holds within milliseconds when it holds).
const PATIENCE: Duration = Duration::from_secs(20);

struct Server {
    addr: SocketAddr,
    open: OpenConnections,
    refused: RefusedConnections,
    task: tokio::task::JoinHandle<io::Result<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A health-check-like server (`ok` on any path, 16 MiB on `/large`, `ok` after 20 ms on
/// `/slow`) within `limits`.
async fn start(limits: ConnectionLimits) -> Server {
    let listener = TcpListener::bind((FLOODER, 0))
        .await
        .expect("bind on loopback");
    let addr = listener.local_addr().expect("bound address");
    let app = Router::new()
        .route("/large", get(|| async { vec![b'x'; 16 << 20] }))
        // An answer that takes a moment (as one reading shared state may): the client's
        // half-close reaches the server before it.
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                "ok"
            }),
        )
        .fallback(|| async { "ok" });
    let refused = RefusedConnections::default();
    let open = OpenConnections::default();
    let guard = Guard::new("test", "test server", limits, refused.clone());
    let task = tokio::spawn(serve(listener, app, guard, open.clone()));
    Server {
        addr,
        open,
        refused,
        task,
    }
}

/// A blocking client connection from `from`.
fn connect(from: IpAddr, to: SocketAddr) -> StdStream {
    try_connect(from, to).expect("connect")
}

/// A flood's connection from `from`: `None` when the server refused it so fast that the reset
/// reached `connect()` before it returned (a loaded machine), which is a refusal like the
/// resets seen later.
fn flood_connect(from: IpAddr, to: SocketAddr) -> Option<StdStream> {
    match try_connect(from, to) {
        Ok(stream) => Some(stream),
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => None,
        Err(e) => panic!("connect: {e}"),
    }
}

fn try_connect(from: IpAddr, to: SocketAddr) -> io::Result<StdStream> {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("a socket");
    socket
        .bind(&SocketAddr::new(from, 0).into())
        .expect("bind the client's address");
    socket.connect(&to.into())?;
    let stream: StdStream = socket.into();
    stream
        .set_read_timeout(Some(PATIENCE))
        .expect("set a read timeout");
    Ok(stream)
}

async fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Whether the server has closed this connection (a reset or an end of stream is waiting);
/// `false` while it is open and silent.
fn closed_by_server(stream: &StdStream) -> bool {
    server_closing(stream).is_some()
}

/// How the server closed this connection: `Ok` for an end of stream (a FIN), the error for
/// a reset; `None` while it is open and silent.
fn server_closing(stream: &StdStream) -> Option<Result<(), ErrorKind>> {
    stream.set_nonblocking(true).expect("non-blocking");
    let mut byte = [0u8; 1];
    let closing = match (&*stream).read(&mut byte) {
        Ok(0) => Some(Ok(())),
        Ok(_) => None,
        Err(e) if e.kind() == ErrorKind::WouldBlock => None,
        Err(e) => Some(Err(e.kind())),
    };
    stream.set_nonblocking(false).expect("blocking");
    closing
}

/// What a load balancer's probe from [`PROBER`] gets for `/healthz` on `addr`.
async fn probe_from_prober(addr: SocketAddr) -> String {
    tokio::task::spawn_blocking(move || {
        let mut probe = connect(PROBER, addr);
        probe
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n")
            .expect("send the probe");
        read_until_closed(probe)
    })
    .await
    .expect("probe")
    .expect("the probe's answer")
}

/// Everything the server sends until it closes; `Err` when it does not close within
/// [`PATIENCE`].
fn read_until_closed(mut stream: StdStream) -> io::Result<String> {
    let mut got = Vec::new();
    match stream.read_to_end(&mut got) {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        Err(e) => return Err(e),
    }
    Ok(String::from_utf8_lossy(&got).into_owned())
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_address_holds_its_share_and_another_address_is_still_answered() {
    let limits = ConnectionLimits {
        per_peer: 4,
        total: 16,
        header_timeout: Duration::from_secs(600),
        idle_timeout: Duration::from_secs(600),
    };
    let server = start(limits).await;
    let flood = 200;
    let fds_before = open_fds();
    let addr = server.addr;
    let clients = tokio::task::spawn_blocking(move || {
        (0..flood)
            .map(|_| flood_connect(FLOODER, addr))
            .collect::<Vec<_>>()
    })
    .await
    .expect("connect the flood");
    wait_for("the flood's connections are accepted or refused", || {
        server.refused.get("test", Refusal::PeerCap) == (flood - limits.per_peer) as u64
    })
    .await;
    // The server holds the cap; every other connection was closed at once.
    assert_eq!(server.open.from(FLOODER), limits.per_peer);
    assert_eq!(server.open.total(), limits.per_peer);
    let closed = clients
        .iter()
        .filter(|c| c.as_ref().is_none_or(closed_by_server))
        .count();
    assert_eq!(closed, flood - limits.per_peer);
    // The process holds the flood's client sockets plus the server's side of the cap (shown,
    // not asserted: other tests of this binary open sockets at the same time).
    let fds_during = open_fds();
    eprintln!(
        "{flood} idle connections from {FLOODER}: {} held by the server, {} refused; \
         the process's fds went from {fds_before} to {fds_during} ({flood} of them the test's \
         clients)",
        server.open.total(),
        server.refused.get("test", Refusal::PeerCap)
    );
    assert_eq!(server.refused.get("test", Refusal::TotalCap), 0);

    // A probe from another address is answered meanwhile.
    let answer = probe_from_prober(addr).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("ok"), "{answer}");
    drop(clients);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_holds_at_most_its_total() {
    let limits = ConnectionLimits {
        per_peer: 2,
        total: 4,
        header_timeout: Duration::from_secs(600),
        idle_timeout: Duration::from_secs(600),
    };
    let server = start(limits).await;
    let addr = server.addr;
    // (from, connections)
    let plan = [(FLOODER, 3), (PROBER, 3), (IpAddr::from([127, 0, 0, 3]), 1)];
    let clients = tokio::task::spawn_blocking(move || {
        plan.iter()
            .flat_map(|&(from, n)| (0..n).map(move |_| flood_connect(from, addr)))
            .collect::<Vec<_>>()
    })
    .await
    .expect("connect");
    wait_for("all connections are accepted, refused or make room", || {
        server.refused.get("test", Refusal::PeerCap) + server.refused.get("test", Refusal::Evicted)
            == 3
    })
    .await;
    assert_eq!(server.refused.get("test", Refusal::PeerCap), 2);
    // The last address found the listener full and closed a larger source's oldest.
    assert_eq!(server.refused.get("test", Refusal::Evicted), 1);
    assert_eq!(server.refused.get("test", Refusal::TotalCap), 0);
    assert_eq!(server.open.total(), limits.total);
    assert_eq!(server.open.from(FLOODER) + server.open.from(PROBER), 3);
    assert_eq!(server.open.from(IpAddr::from([127, 0, 0, 3])), 1);
    drop(clients);
    wait_for("closed connections give their places back", || {
        server.open.total() == 0
    })
    .await;
}

/// Limits whose timeouts a test waits for: `header` and `idle`, in milliseconds.
fn timeouts(header: u64, idle: u64) -> ConnectionLimits {
    ConnectionLimits {
        header_timeout: Duration::from_millis(header),
        idle_timeout: Duration::from_millis(idle),
        ..ConnectionLimits::DEFAULT
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_a_request_header_is_closed_after_the_header_timeout() {
    let server = start(timeouts(300, 600_000)).await;
    let addr = server.addr;
    let answer = tokio::task::spawn_blocking(move || {
        let mut slow = connect(PROBER, addr);
        slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: node\r\nX-Slow: ")
            .expect("send half a header");
        read_until_closed(slow)
    })
    .await
    .expect("slowloris");
    let answer = answer.expect("the server closes a connection that never finishes its header");
    // hyper says why before closing.
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer}"
    );
    wait_for("the connection's place is given back", || {
        server.open.total() == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_kept_alive_connection_is_closed() {
    let server = start(timeouts(300, 600_000)).await;
    let addr = server.addr;
    let answer = tokio::task::spawn_blocking(move || {
        let mut client = connect(PROBER, addr);
        client
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n")
            .expect("send a request");
        // Keep-alive: the answer, then nothing until the server closes.
        read_until_closed(client)
    })
    .await
    .expect("client");
    let answer = answer.expect("the server closes an idle kept-alive connection");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("ok"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_closed_when_idle() {
    let server = start(timeouts(600_000, 300)).await;
    let addr = server.addr;
    let client = tokio::task::spawn_blocking(move || {
        let mut client = connect(PROBER, addr);
        client
            .write_all(b"GET /large HTTP/1.1\r\nHost: node\r\n\r\n")
            .expect("send a request");
        client
    })
    .await
    .expect("client");
    wait_for("the server holds the connection", || {
        server.open.total() == 1
    })
    .await;
    // 16 MiB do not fit in the sockets' buffers: the server's write stalls.
    wait_for("the stalled connection is closed", || {
        server.open.total() == 0
    })
    .await;
    drop(client);
}

#[test]
fn a_summary_says_how_many_more_were_closed_where_and_why() {
    let guard = Guard::new(
        "service_health_check",
        "Service health check",
        ConnectionLimits::DEFAULT,
        RefusedConnections::default(),
    )
    .for_service("default/web", RefusalTally::default());
    let on = guard.listener_name(Some(SocketAddr::new(PROBER, 30_000)));
    let cause = |refusal| Cause {
        refusal,
        on: on.clone(),
    };
    let cases = [
        (
            Some(FLOODER),
            1,
            false,
            vec![
                (cause(Refusal::PeerCap), 512),
                (cause(Refusal::TotalCap), 3),
            ],
            "closed 515 more connections to the Service health check from 127.0.0.9 in the last \
             60 s: 512 on 127.0.0.10:30000 (Service default/web) because its address holds as \
             many connections as one address may, 3 on 127.0.0.10:30000 (Service default/web) \
             because the server holds as many connections as it may, its source (address, or \
             IPv6 /64) the most",
        ),
        (
            None,
            1300,
            true,
            vec![(cause(Refusal::Evicted), 7)],
            "closed 7 more connections to the Service health check from 1300 or more other \
             addresses in the last 60 s: 7 on 127.0.0.10:30000 (Service default/web) because the \
             server held as many connections as it may, its source (address, or IPv6 /64) the \
             most: its oldest was closed for a new one from another source",
        ),
    ];
    for (peer, peers, peers_at_least, held, line) in cases {
        let summary = Summary {
            peer,
            peers,
            peers_at_least,
            held,
            over: Duration::from_secs(60),
        };
        assert_eq!(guard.summary_line(&summary), line);
    }
}

#[test]
fn a_full_listener_closes_the_oldest_connection_of_the_largest_source() {
    let limits = ConnectionLimits {
        per_peer: 32,
        total: 16,
        ..ConnectionLimits::DEFAULT
    };
    let ip = |s: &str| -> IpAddr { s.parse().expect("an address") };
    // One host with 16 addresses of one /64 fills the listener, one connection each.
    let flood: Vec<IpAddr> = (1..=16)
        .map(|i| ip(&format!("2001:db8:1:2::{i:x}")))
        .collect();
    // (newcomer, expected: the evicted peer or the refusal)
    let cases: Vec<(IpAddr, Result<Option<IpAddr>, Refusal>)> = vec![
        // A prober from another /64: the flood's oldest connection is closed for it.
        (ip("2001:db8:1:3::1"), Ok(Some(flood[0]))),
        // And the next from another source again: the flood's next oldest.
        (ip("10.0.0.1"), Ok(Some(flood[1]))),
        // A newcomer from the flood's /64 (another address): its source holds the most.
        (ip("2001:db8:1:2::ffff"), Err(Refusal::TotalCap)),
    ];
    let open = OpenConnections::default();
    let mut kept = Vec::new();
    for peer in &flood {
        let admitted = open.admit(*peer, &limits).expect("room for the flood");
        assert_eq!(admitted.evicted, None);
        kept.push(admitted);
    }
    for (i, (newcomer, expected)) in cases.into_iter().enumerate() {
        let got = open.admit(newcomer, &limits);
        match (got, expected) {
            (Ok(admitted), Ok(evicted)) => {
                assert_eq!(admitted.evicted, evicted, "case {i}");
                kept.push(admitted);
            }
            (Err(got), Err(expected)) => assert_eq!(got, expected, "case {i}"),
            (got, expected) => panic!(
                "case {i}: got {:?}, expected {expected:?}",
                got.map(|a| a.evicted)
            ),
        }
        assert_eq!(open.total(), limits.total, "case {i}");
    }
    // The evicted connections were told to close; the others were not.
    let mut told = 0;
    for admitted in &mut kept {
        if admitted
            .closed
            .try_recv()
            .is_err_and(|e| e == oneshot::error::TryRecvError::Closed)
        {
            told += 1;
        }
    }
    assert_eq!(told, 2);
    assert_eq!(open.from(flood[0]), 0);
    drop(kept);
    assert_eq!(open.total(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prober_is_answered_while_a_flood_holds_the_listener() {
    let limits = ConnectionLimits {
        per_peer: 4,
        total: 12,
        header_timeout: Duration::from_secs(600),
        idle_timeout: Duration::from_secs(600),
    };
    let server = start(limits).await;
    let addr = server.addr;
    // Three flooding addresses fill the listener with idle connections.
    let flooders: Vec<IpAddr> = (3..=5).map(|i| IpAddr::from([127, 0, 0, i])).collect();
    let from = flooders.clone();
    let clients = tokio::task::spawn_blocking(move || {
        from.iter()
            .flat_map(|&f| (0..limits.per_peer).map(move |_| connect(f, addr)))
            .collect::<Vec<_>>()
    })
    .await
    .expect("connect the flood");
    wait_for("the flood holds the listener", || {
        server.open.total() == limits.total
    })
    .await;
    let answer = probe_from_prober(addr).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("ok"), "{answer}");
    assert_eq!(server.refused.get("test", Refusal::Evicted), 1);
    assert_eq!(server.refused.get("test", Refusal::TotalCap), 0);
    // The evicted connection is one flooder's oldest, and its client sees it reset (no
    // FIN_WAIT/TIME_WAIT socket is left on the server for a flood to pile up).
    let mut closings = Vec::new();
    wait_for("the evicted connection is closed", || {
        closings.extend(clients.iter().filter_map(server_closing));
        !closings.is_empty()
    })
    .await;
    assert_eq!(closings, [Err(ErrorKind::ConnectionReset)]);
    assert_eq!(clients.iter().filter(|c| closed_by_server(c)).count(), 1);
    drop(clients);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_half_closes_after_its_request_gets_the_whole_answer() {
    let server = start(ConnectionLimits::DEFAULT).await;
    let addr = server.addr;
    let failures = tokio::task::spawn_blocking(move || {
        (0..20)
            .filter(|_| {
                let mut client = connect(PROBER, addr);
                client
                    .write_all(b"GET /slow HTTP/1.1\r\nHost: node\r\n\r\n")
                    .expect("send a request");
                client
                    .shutdown(std::net::Shutdown::Write)
                    .expect("half-close");
                let answer = read_until_closed(client).unwrap_or_default();
                !(answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok"))
            })
            .count()
    })
    .await
    .expect("clients");
    assert_eq!(failures, 0, "of 20 half-closing clients");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_header_over_16_kib_gets_431() {
    let server = start(ConnectionLimits::DEFAULT).await;
    let addr = server.addr;
    let answer = tokio::task::spawn_blocking(move || {
        let mut client = connect(PROBER, addr);
        let large = "x".repeat(MAX_BUF_SIZE + 1);
        // The server may answer and close before it has read everything: a failed write is
        // fine, the answer is what counts.
        let _ = client.write_all(
            format!("GET /healthz HTTP/1.1\r\nHost: node\r\nX-Large: {large}\r\n\r\n").as_bytes(),
        );
        read_until_closed(client)
    })
    .await
    .expect("client")
    .expect("the answer");
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
}

/// A server's refusal counters exist at 0 from its start, every reason (they had no series
/// until the first refusal, against the policy that alerting counters start at 0); a server
/// that does not run has none.
#[test]
fn a_servers_refusal_counters_exist_at_0_from_its_start() {
    let refused = RefusedConnections::default();
    let mut registry = Registry::default();
    refused.register_in(&mut registry);
    let _guard = Guard::new(
        "metrics",
        "metrics server",
        ConnectionLimits::default(),
        refused.clone(),
    );
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    for reason in ["per_peer", "total", "evicted"] {
        let line = format!(
            "\nkpng_http_connections_refused_total{{server=\"metrics\",reason=\"{reason}\"}} 0\n"
        );
        assert!(text.contains(&line), "{line}{text}");
    }
    assert!(!text.contains("server=\"healthz\""), "{text}");
}
