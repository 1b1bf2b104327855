//! With real sockets on loopback: 127.0.0.1 and 127.0.0.2 are two peers.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream as StdStream};

use axum::routing::get;

use super::*;

const FLOODER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const PROBER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

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

/// A health-check-like server (`ok` on any path, 16 MiB on `/large`) within `limits`.
async fn start(limits: ConnectionLimits) -> Server {
    let listener = TcpListener::bind((FLOODER, 0))
        .await
        .expect("bind on loopback");
    let addr = listener.local_addr().expect("bound address");
    let app = Router::new()
        .route("/large", get(|| async { vec![b'x'; 16 << 20] }))
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
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("a socket");
    socket
        .bind(&SocketAddr::new(from, 0).into())
        .expect("bind the client's address");
    socket.connect(&to.into()).expect("connect");
    let stream: StdStream = socket.into();
    stream
        .set_read_timeout(Some(PATIENCE))
        .expect("set a read timeout");
    stream
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
    stream.set_nonblocking(true).expect("non-blocking");
    let mut byte = [0u8; 1];
    let closed = match (&*stream).read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) if e.kind() == ErrorKind::WouldBlock => false,
        Err(_) => true,
    };
    stream.set_nonblocking(false).expect("blocking");
    closed
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
            .map(|_| connect(FLOODER, addr))
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
    let closed = clients.iter().filter(|c| closed_by_server(c)).count();
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
    let answer = tokio::task::spawn_blocking(move || {
        let mut probe = connect(PROBER, addr);
        probe
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n")
            .expect("send the probe");
        read_until_closed(probe)
    })
    .await
    .expect("probe")
    .expect("the probe's answer");
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
            .flat_map(|&(from, n)| (0..n).map(move |_| connect(from, addr)))
            .collect::<Vec<_>>()
    })
    .await
    .expect("connect");
    wait_for("all connections are accepted or refused", || {
        server.refused.get("test", Refusal::PeerCap) + server.refused.get("test", Refusal::TotalCap)
            == 3
    })
    .await;
    assert_eq!(server.refused.get("test", Refusal::PeerCap), 2);
    assert_eq!(server.refused.get("test", Refusal::TotalCap), 1);
    assert_eq!(server.open.total(), limits.total);
    assert_eq!(server.open.from(FLOODER), 2);
    assert_eq!(server.open.from(PROBER), 2);
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
fn a_summary_says_how_many_more_were_closed_and_why() {
    let guard = Guard::new(
        "healthz",
        "health server",
        ConnectionLimits::DEFAULT,
        RefusedConnections::default(),
    );
    let line = guard.summary_line(&Summary {
        peer: Some(FLOODER),
        held: vec![(Refusal::PeerCap, 512), (Refusal::TotalCap, 3)],
        over: Duration::from_secs(60),
    });
    assert_eq!(
        line,
        "closed 515 more new connections to the health server from 127.0.0.1 in the last 60 s: \
         512 because its address holds as many connections as one address may, 3 because the \
         server holds as many connections as it may"
    );
}
