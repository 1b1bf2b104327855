//! `kpng-echo`: the backend server of real-packet tests.
//!
//! It tells a probe who answered and what addresses it saw, so tests can check
//! which endpoint a Service sent them to and whether the proxy rewrote the source:
//!
//! ```text
//! kpng-echo --name pod1a --tcp 10.244.1.2:8080 --udp [fd00:244:1::2]:8080 ...
//! ```
//!
//! For every TCP connection it writes one line `NAME LOCALADDR PEERADDR\n` and
//! closes; every UDP datagram gets that line back as the reply. `--tcp`/`--udp` may
//! be repeated; IPv6 listeners are IPv6-only, so pass IPv4 and IPv6 addresses
//! separately. For a UDP listener on a wildcard address, LOCALADDR is the address
//! the kernel would use to reach the peer (exact for single-address pods); bind
//! specific addresses to be sure. It prints `kpng-echo ready` on stdout once all
//! listeners are bound and then serves until killed.

use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpListener, UdpSocket};
use std::process::ExitCode;
use std::thread;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

const USAGE: &str = "usage: kpng-echo --name NAME [--tcp ADDR:PORT]... [--udp ADDR:PORT]...";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kpng-echo: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), String> {
    let mut name = None;
    let mut tcp = Vec::new();
    let mut udp = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |flag: &str| args.next().ok_or(format!("{flag} needs a value\n{USAGE}"));
        match a.as_str() {
            "--name" => name = Some(value("--name")?),
            "--tcp" => tcp.push(parse_addr(&value("--tcp")?)?),
            "--udp" => udp.push(parse_addr(&value("--udp")?)?),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unexpected argument {other:?}\n{USAGE}")),
        }
    }
    let name = name.ok_or(format!("--name is required\n{USAGE}"))?;
    if name.is_empty() || name.chars().any(char::is_whitespace) {
        return Err(format!("--name must be one word, got {name:?}"));
    }
    if tcp.is_empty() && udp.is_empty() {
        return Err(format!("no listener given\n{USAGE}"));
    }

    let mut handles = Vec::new();
    for addr in tcp {
        let l = tcp_listener(addr).map_err(|e| format!("tcp {addr}: {e}"))?;
        let name = name.clone();
        handles.push(thread::spawn(move || serve_tcp(&l, &name)));
    }
    for addr in udp {
        let s = udp_socket(addr).map_err(|e| format!("udp {addr}: {e}"))?;
        let name = name.clone();
        handles.push(thread::spawn(move || serve_udp(&s, &name)));
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "kpng-echo ready").map_err(|e| e.to_string())?;
    out.flush().map_err(|e| e.to_string())?;
    drop(out);
    for h in handles {
        let _ = h.join();
    }
    Ok(())
}

fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse()
        .map_err(|e| format!("bad address {s:?} ({e}); use IP:PORT or [IPV6]:PORT"))
}

fn socket(addr: SocketAddr, ty: Type, proto: Protocol) -> std::io::Result<Socket> {
    let s = Socket::new(Domain::for_address(addr), ty, Some(proto))?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.set_reuse_address(true)?;
    s.bind(&addr.into())?;
    Ok(s)
}

fn tcp_listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let s = socket(addr, Type::STREAM, Protocol::TCP)?;
    s.listen(1024)?;
    Ok(s.into())
}

fn udp_socket(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    Ok(socket(addr, Type::DGRAM, Protocol::UDP)?.into())
}

fn serve_tcp(l: &TcpListener, name: &str) {
    loop {
        let (mut conn, peer) = match l.accept() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("kpng-echo: accept: {e}");
                thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let local = match conn.local_addr() {
            Ok(a) => a.to_string(),
            Err(_) => "?".to_owned(),
        };
        let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
        if let Err(e) = conn.write_all(format!("{name} {local} {peer}\n").as_bytes()) {
            eprintln!("kpng-echo: writing to {peer}: {e}");
        }
        let _ = conn.shutdown(Shutdown::Write);
    }
}

fn serve_udp(s: &UdpSocket, name: &str) {
    let bound = s.local_addr().ok();
    let mut buf = [0u8; 2048];
    loop {
        let peer = match s.recv_from(&mut buf) {
            Ok((_, peer)) => peer,
            Err(e) => {
                // E.g. ECONNREFUSED left over from an earlier reply: not fatal.
                eprintln!("kpng-echo: udp recv: {e}");
                thread::sleep(Duration::from_millis(1));
                continue;
            }
        };
        let local = match bound {
            Some(b) if !b.ip().is_unspecified() => b.to_string(),
            Some(b) => route_source(peer)
                .map(|ip| SocketAddr::new(ip, b.port()).to_string())
                .unwrap_or_else(|| b.to_string()),
            None => "?".to_owned(),
        };
        if let Err(e) = s.send_to(format!("{name} {local} {peer}\n").as_bytes(), peer) {
            eprintln!("kpng-echo: udp reply to {peer}: {e}");
        }
    }
}

/// The source address the kernel picks to reach `peer` (a connected UDP socket
/// sends nothing but learns its local address).
fn route_source(peer: SocketAddr) -> Option<std::net::IpAddr> {
    let any: SocketAddr = if peer.is_ipv6() {
        "[::]:0".parse().ok()?
    } else {
        "0.0.0.0:0".parse().ok()?
    };
    let s = UdpSocket::bind(any).ok()?;
    s.connect(peer).ok()?;
    Some(s.local_addr().ok()?.ip())
}
