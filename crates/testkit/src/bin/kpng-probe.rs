//! `kpng-probe`: the client of real-packet tests, run inside a namespace.
//!
//! It turns "what happens to a connection to this address" into one JSON line per
//! attempt, so tests can assert on outcomes instead of on error strings:
//!
//! ```text
//! kpng-probe tcp|udp ADDR:PORT [--timeout-ms 1000] [--count N] [--interval-ms M]
//!            [--bind SRC[:PORT]] [--fresh]
//! {"outcome":"ok","reply":"pod1a 10.244.1.2:8080 192.168.100.10:40000","local":"192.168.100.10:40000","elapsed_us":812}
//! ```
//!
//! Outcomes: `ok` (a reply line arrived), `refused` (TCP RST; for UDP an ICMP port
//! unreachable, seen as `ECONNREFUSED` on the connected socket), `timeout`,
//! `unreachable` (`EHOSTUNREACH`/`ENETUNREACH`) and `error` (with `message`).
//!
//! TCP makes a new connection per attempt. UDP sends all `--count` datagrams from
//! ONE connected socket (same source port: one conntrack flow, as a long-lived UDP
//! client would), unless `--fresh` asks for a new socket per attempt. Exit status
//! is 0 whenever every attempt was reported, 2 on bad arguments. `--help` prints the usage.

use std::io::{ErrorKind, Read};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use kpng_testkit::{Outcome, ProbeLine, Proto};
use socket2::{Domain, Protocol, Socket, Type};

const USAGE: &str = "usage: kpng-probe tcp|udp ADDR:PORT [--timeout-ms MS] [--count N] \
                     [--interval-ms MS] [--bind SRC[:PORT]] [--fresh]";

struct Args {
    proto: Proto,
    target: SocketAddr,
    timeout: Duration,
    count: usize,
    interval: Duration,
    bind: Option<SocketAddr>,
    fresh: bool,
}

/// Whether the command line asks for the usage (`--help` or `-h` anywhere): it was taken
/// as an unknown protocol.
fn wants_help(args: &[String]) -> bool {
    args.iter().any(|a| a == "--help" || a == "-h")
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if wants_help(&argv) {
        println!(
            "{USAGE}\n\nOne JSON line per attempt: outcome ok (a reply line arrived), refused, \
             timeout, unreachable or error."
        );
        return ExitCode::SUCCESS;
    }
    let args = match parse_args(argv.into_iter()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("kpng-probe: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let mut udp: Option<UdpSocket> = None;
    for i in 0..args.count {
        if i > 0 && !args.interval.is_zero() {
            std::thread::sleep(args.interval);
        }
        let line = match args.proto {
            Proto::Tcp => tcp_attempt(&args),
            Proto::Udp => {
                if args.fresh {
                    udp = None;
                }
                udp_attempt(&args, &mut udp, i)
            }
        };
        match serde_json::to_string(&line) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("kpng-probe: serialising result: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let proto = match it.next().as_deref() {
        Some("tcp") => Proto::Tcp,
        Some("udp") => Proto::Udp,
        Some(other) => return Err(format!("unknown protocol {other:?}")),
        None => return Err("missing protocol".into()),
    };
    let target = it.next().ok_or("missing ADDR:PORT")?;
    let target: SocketAddr = target
        .parse()
        .map_err(|e| format!("bad target {target:?}: {e}"))?;
    let mut a = Args {
        proto,
        target,
        timeout: Duration::from_millis(1000),
        count: 1,
        interval: Duration::ZERO,
        bind: None,
        fresh: false,
    };
    while let Some(flag) = it.next() {
        if flag == "--fresh" {
            a.fresh = true;
            continue;
        }
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = |v: &str| {
            v.parse::<u64>()
                .map_err(|e| format!("bad number {v:?} for {flag}: {e}"))
        };
        match flag.as_str() {
            "--timeout-ms" => a.timeout = Duration::from_millis(num(&v)?.max(1)),
            "--count" => {
                a.count = usize::try_from(num(&v)?).map_err(|e| format!("--count: {e}"))?;
            }
            "--interval-ms" => a.interval = Duration::from_millis(num(&v)?),
            "--bind" => {
                let b = match v.parse::<SocketAddr>() {
                    Ok(sa) => sa,
                    // A bare address, bracketed or not (`[fd00::2]`, as in `[fd00::2]:PORT`).
                    Err(_) => SocketAddr::new(
                        v.strip_prefix('[')
                            .and_then(|rest| rest.strip_suffix(']'))
                            .unwrap_or(&v)
                            .parse::<IpAddr>()
                            .map_err(|e| format!("bad --bind {v:?}: {e}"))?,
                        0,
                    ),
                };
                if b.is_ipv6() != a.target.is_ipv6() {
                    return Err(format!(
                        "--bind {b} and target {} differ in family",
                        a.target
                    ));
                }
                a.bind = Some(b);
            }
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    Ok(a)
}

fn line(outcome: Outcome, start: Instant) -> ProbeLine {
    ProbeLine {
        outcome,
        reply: None,
        local: None,
        message: None,
        elapsed_us: u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX),
    }
}

fn failed(e: &std::io::Error, what: &str, local: Option<SocketAddr>, start: Instant) -> ProbeLine {
    let mut l = line(classify(e), start);
    l.message = Some(format!("{what}: {e}"));
    l.local = local.map(|a| a.to_string());
    l
}

fn classify(e: &std::io::Error) -> Outcome {
    match e.kind() {
        ErrorKind::ConnectionRefused => Outcome::Refused,
        ErrorKind::TimedOut | ErrorKind::WouldBlock => Outcome::Timeout,
        ErrorKind::HostUnreachable | ErrorKind::NetworkUnreachable => Outcome::Unreachable,
        _ => Outcome::Error,
    }
}

fn new_socket(a: &Args, ty: Type, proto: Protocol) -> std::io::Result<Socket> {
    let s = Socket::new(Domain::for_address(a.target), ty, Some(proto))?;
    if let Some(b) = a.bind {
        s.bind(&b.into())?;
    }
    Ok(s)
}

fn tcp_attempt(a: &Args) -> ProbeLine {
    let start = Instant::now();
    let sock = match new_socket(a, Type::STREAM, Protocol::TCP) {
        Ok(s) => s,
        Err(e) => return failed(&e, "socket/bind", None, start),
    };
    if let Err(e) = sock.connect_timeout(&a.target.into(), a.timeout) {
        let local = sock.local_addr().ok().and_then(|l| l.as_socket());
        return failed(&e, "connect", local, start);
    }
    let mut stream: TcpStream = sock.into();
    let local = stream.local_addr().ok();
    let left = a
        .timeout
        .saturating_sub(start.elapsed())
        .max(Duration::from_millis(1));
    if let Err(e) = stream.set_read_timeout(Some(left)) {
        return failed(&e, "set_read_timeout", local, start);
    }
    let mut reply = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                reply.extend_from_slice(&buf[..n]);
                if reply.contains(&b'\n') || reply.len() > 4096 {
                    break;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                let mut l = failed(&e, "connected, then read", local, start);
                if l.outcome == Outcome::Refused {
                    // RST after the handshake: not a refused connection.
                    l.outcome = Outcome::Error;
                }
                return l;
            }
        }
    }
    reply_line(&reply, local, start)
}

fn reply_line(reply: &[u8], local: Option<SocketAddr>, start: Instant) -> ProbeLine {
    let text = String::from_utf8_lossy(reply);
    let first = text.lines().next().unwrap_or("").trim_end().to_owned();
    let mut l = line(Outcome::Ok, start);
    l.local = local.map(|a| a.to_string());
    if first.is_empty() {
        l.outcome = Outcome::Error;
        l.message = Some("connection closed without a reply".into());
    } else {
        l.reply = Some(first);
    }
    l
}

fn udp_connect(a: &Args) -> std::io::Result<UdpSocket> {
    let s = new_socket(a, Type::DGRAM, Protocol::UDP)?;
    s.connect(&a.target.into())?;
    Ok(s.into())
}

fn udp_attempt(a: &Args, sock: &mut Option<UdpSocket>, seq: usize) -> ProbeLine {
    let start = Instant::now();
    if sock.is_none() {
        match udp_connect(a) {
            Ok(s) => *sock = Some(s),
            Err(e) => return failed(&e, "socket/bind/connect", None, start),
        }
    }
    let Some(s) = sock.as_ref() else {
        return failed(&std::io::Error::other("no socket"), "socket", None, start);
    };
    let local = s.local_addr().ok();
    drain(s);
    if let Err(e) = s.set_read_timeout(Some(a.timeout)) {
        return failed(&e, "set_read_timeout", local, start);
    }
    if let Err(e) = s.send(format!("kpng-probe {seq}\n").as_bytes()) {
        return failed(&e, "send", local, start);
    }
    let mut buf = [0u8; 2048];
    loop {
        match s.recv(&mut buf) {
            Ok(n) => return reply_line(&buf[..n], local, start),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return failed(&e, "recv", local, start),
        }
    }
}

/// Throw away late replies and pending ICMP errors of earlier attempts, so that
/// they are not taken for the answer to the next one.
fn drain(s: &UdpSocket) {
    if s.set_nonblocking(true).is_err() {
        return;
    }
    let mut buf = [0u8; 2048];
    for _ in 0..64 {
        match s.recv(&mut buf) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(_) => {}
        }
    }
    let _ = s.set_nonblocking(false);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Args, String> {
        parse_args(s.split_whitespace().map(str::to_owned))
    }

    #[test]
    fn parses_all_flags() {
        let a = parse(
            "udp [fd00::1]:53 --timeout-ms 250 --count 4 --interval-ms 10 --bind fd00::2 --fresh",
        )
        .expect("valid");
        assert_eq!(a.proto, Proto::Udp);
        assert_eq!(a.target, "[fd00::1]:53".parse().expect("addr"));
        assert_eq!(a.timeout, Duration::from_millis(250));
        assert_eq!(a.count, 4);
        assert_eq!(a.interval, Duration::from_millis(10));
        assert_eq!(a.bind, Some("[fd00::2]:0".parse().expect("addr")));
        assert!(a.fresh);
        let a = parse("tcp 10.0.0.1:80 --bind 10.0.0.2:4000").expect("valid");
        assert_eq!(a.bind, Some("10.0.0.2:4000".parse().expect("addr")));
        assert_eq!(a.count, 1);
    }

    #[test]
    fn help_is_asked_for_anywhere_on_the_line() {
        let words = |s: &str| s.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        for (line, want) in [
            ("--help", true),
            ("-h", true),
            ("tcp 10.0.0.1:80 --help", true),
            ("tcp 10.0.0.1:80", false),
            ("", false),
        ] {
            assert_eq!(wants_help(&words(line)), want, "{line:?}");
        }
    }

    #[test]
    fn rejects_bad_input() {
        assert!(parse("icmp 10.0.0.1:80").is_err());
        assert!(parse("tcp 10.0.0.1").is_err());
        assert!(parse("tcp 10.0.0.1:80 --count").is_err());
        assert!(parse("tcp 10.0.0.1:80 --count x").is_err());
        assert!(parse("tcp 10.0.0.1:80 --bind fd00::1").is_err());
        assert!(parse("tcp 10.0.0.1:80 --what 1").is_err());
    }

    #[test]
    fn classifies_errors() {
        let k = |kind| classify(&std::io::Error::from(kind));
        assert_eq!(k(ErrorKind::ConnectionRefused), Outcome::Refused);
        assert_eq!(k(ErrorKind::TimedOut), Outcome::Timeout);
        assert_eq!(k(ErrorKind::WouldBlock), Outcome::Timeout);
        assert_eq!(k(ErrorKind::HostUnreachable), Outcome::Unreachable);
        assert_eq!(k(ErrorKind::NetworkUnreachable), Outcome::Unreachable);
        assert_eq!(k(ErrorKind::PermissionDenied), Outcome::Error);
        assert_eq!(
            classify(&std::io::Error::from_raw_os_error(113)),
            Outcome::Unreachable
        );
    }
}
