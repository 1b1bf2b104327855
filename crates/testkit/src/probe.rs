//! Running `kpng-echo` and `kpng-probe` inside namespaces and reading their answers.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::bins::bin_path;
use crate::error::{Error, Result};
use crate::netns::{Netns, Spawned};

/// The line `kpng-echo` prints on stdout once all its listeners are bound.
pub(crate) const ECHO_READY: &str = "kpng-echo ready";

/// Transport protocol of a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    /// One TCP connection per attempt.
    Tcp,
    /// UDP datagrams.
    Udp,
}

impl Proto {
    /// `"tcp"` or `"udp"`, as on the `kpng-probe` command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Proto {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "tcp" => Ok(Proto::Tcp),
            "udp" => Ok(Proto::Udp),
            _ => Err(Error::Parse(format!("unknown protocol {s:?} (tcp or udp)"))),
        }
    }
}

/// What happened to one probe attempt; what tests assert on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// A server answered (see [`ProbeResult::reply`]).
    Ok,
    /// Actively refused: TCP RST, or ICMP port unreachable (a connected UDP socket
    /// reports `ECONNREFUSED`). What a proxy's `reject` for a Service without
    /// endpoints looks like.
    Refused,
    /// No answer within the timeout: dropped somewhere (an nftables `drop`, no route
    /// at a host that does not forward, ...).
    Timeout,
    /// ICMP host/network unreachable (`EHOSTUNREACH`, `ENETUNREACH`), also when the
    /// prober itself has no route.
    Unreachable,
    /// Anything else (see [`ProbeResult::message`]).
    Error,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Outcome::Ok => "ok",
            Outcome::Refused => "refused",
            Outcome::Timeout => "timeout",
            Outcome::Unreachable => "unreachable",
            Outcome::Error => "error",
        })
    }
}

/// One line of `kpng-probe` output: the wire format between the binary and
/// [`ProbeResult`]. Public so that both sides share one definition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeLine {
    /// What happened.
    pub outcome: Outcome,
    /// The server's reply line, without the newline (only for `ok`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<String>,
    /// The probe socket's own address, when it got one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<String>,
    /// Error text for anything but `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Duration of the attempt in microseconds.
    #[serde(default)]
    pub elapsed_us: u64,
}

/// One probe attempt, parsed: the outcome and, when a `kpng-echo` answered, who
/// answered and whom it saw as the client (to check DNAT and SNAT/masquerade).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeResult {
    /// What happened.
    pub outcome: Outcome,
    /// The echo server's name (`pod1a`, ...).
    pub server_name: Option<String>,
    /// The address the server received the packet on (after any DNAT).
    pub server_addr: Option<SocketAddr>,
    /// The source address the server saw (after any SNAT).
    pub client_addr_seen_by_server: Option<SocketAddr>,
    /// The probe socket's own address.
    pub client_addr: Option<SocketAddr>,
    /// The raw reply line.
    pub reply: Option<String>,
    /// Error text for outcomes other than `ok`.
    pub message: Option<String>,
    /// How long the attempt took.
    pub elapsed: Duration,
}

impl ProbeResult {
    /// Whether a server answered.
    pub fn is_ok(&self) -> bool {
        self.outcome == Outcome::Ok
    }

    /// Parse one line of `kpng-probe` output.
    pub fn from_json_line(line: &str) -> Result<ProbeResult> {
        let l: ProbeLine = serde_json::from_str(line)
            .map_err(|e| Error::Parse(format!("bad kpng-probe line {line:?}: {e}")))?;
        Ok(ProbeResult::from(l))
    }
}

impl From<ProbeLine> for ProbeResult {
    fn from(l: ProbeLine) -> Self {
        let parsed = l.reply.as_deref().and_then(parse_reply);
        let (server_name, server_addr, client_seen) = match parsed {
            Some((n, s, c)) => (Some(n), Some(s), Some(c)),
            None => (None, None, None),
        };
        ProbeResult {
            outcome: l.outcome,
            server_name,
            server_addr,
            client_addr_seen_by_server: client_seen,
            client_addr: l.local.as_deref().and_then(|s| s.parse().ok()),
            reply: l.reply,
            message: l.message,
            elapsed: Duration::from_micros(l.elapsed_us),
        }
    }
}

impl fmt::Display for ProbeResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.outcome)?;
        if let Some(r) = &self.reply {
            write!(f, " reply={r:?}")?;
        }
        if let Some(m) = &self.message {
            write!(f, " message={m:?}")?;
        }
        Ok(())
    }
}

/// Split a `kpng-echo` reply `NAME LOCALADDR PEERADDR` into its parts; `None` if
/// it is not one.
pub fn parse_reply(line: &str) -> Option<(String, SocketAddr, SocketAddr)> {
    let mut it = line.split_whitespace();
    let name = it.next()?;
    let local = it.next()?.parse().ok()?;
    let peer = it.next()?.parse().ok()?;
    if it.next().is_some() {
        return None;
    }
    Some((name.to_owned(), local, peer))
}

/// A `kpng-probe` invocation; build with [`Probe::tcp`] / [`Probe::udp`], run with
/// [`Netns::probe`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    proto: Proto,
    target: String,
    timeout: Duration,
    count: usize,
    interval: Duration,
    bind: Option<String>,
    fresh_socket: bool,
}

impl Probe {
    /// A probe of `target` (`IP:PORT`, IPv6 as `[IP]:PORT`; a [`SocketAddr`] prints
    /// that way). Defaults: 1 attempt, 1 s timeout, no interval, no bind.
    pub fn new(proto: Proto, target: impl fmt::Display) -> Self {
        Probe {
            proto,
            target: target.to_string(),
            timeout: Duration::from_secs(1),
            count: 1,
            interval: Duration::ZERO,
            bind: None,
            fresh_socket: false,
        }
    }

    /// A TCP probe: each attempt is a new connection (new source port).
    pub fn tcp(target: impl fmt::Display) -> Self {
        Self::new(Proto::Tcp, target)
    }

    /// A UDP probe: by default all attempts use one connected socket, so one
    /// conntrack flow (see [`Probe::fresh_socket`]).
    pub fn udp(target: impl fmt::Display) -> Self {
        Self::new(Proto::Udp, target)
    }

    /// Per-attempt timeout (connect plus reply).
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// Number of attempts.
    pub fn count(mut self, n: usize) -> Self {
        self.count = n;
        self
    }

    /// Pause between attempts.
    pub fn interval(mut self, d: Duration) -> Self {
        self.interval = d;
        self
    }

    /// Source address (`IP` or `IP:PORT`) to bind the probe socket to.
    pub fn bind(mut self, src: impl fmt::Display) -> Self {
        self.bind = Some(src.to_string());
        self
    }

    /// UDP only: a new socket (new source port, new conntrack flow) per attempt,
    /// as needed to see load balancing. TCP always uses a new connection.
    pub fn fresh_socket(mut self, fresh: bool) -> Self {
        self.fresh_socket = fresh;
        self
    }

    /// The `kpng-probe` arguments (without the program).
    pub fn args(&self) -> Vec<String> {
        let mut a = vec![
            self.proto.as_str().to_owned(),
            self.target.clone(),
            "--timeout-ms".to_owned(),
            self.timeout.as_millis().to_string(),
            "--count".to_owned(),
            self.count.to_string(),
            "--interval-ms".to_owned(),
            self.interval.as_millis().to_string(),
        ];
        if let Some(b) = &self.bind {
            a.push("--bind".to_owned());
            a.push(b.clone());
        }
        if self.fresh_socket {
            a.push("--fresh".to_owned());
        }
        a
    }
}

impl Netns {
    /// Run `kpng-probe` in this namespace and return one result per attempt.
    ///
    /// Errors only when the probe cannot run or its output is not understood; a
    /// refused or dropped connection is an [`Outcome`], not an error.
    pub fn probe(&self, probe: &Probe) -> Result<Vec<ProbeResult>> {
        let bin = bin_path("kpng-probe")?;
        let mut args = vec![bin.into_os_string()];
        args.extend(probe.args().into_iter().map(Into::into));
        let out = self.run_ok(args)?;
        let results = out
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(ProbeResult::from_json_line)
            .collect::<Result<Vec<_>>>()?;
        if results.len() != probe.count {
            return Err(Error::Parse(format!(
                "kpng-probe printed {} results for {} attempts:\n{out}",
                results.len(),
                probe.count
            )));
        }
        Ok(results)
    }

    /// One attempt of [`Netns::probe`]; returns its result.
    pub fn probe_one(&self, probe: &Probe) -> Result<ProbeResult> {
        let mut v = self.probe(&probe.clone().count(1))?;
        v.pop()
            .ok_or_else(|| Error::Parse("kpng-probe printed no result".into()))
    }

    /// Connect once over TCP to `target` (`IP:PORT` / `[IP]:PORT`).
    pub fn probe_tcp(&self, target: impl fmt::Display, timeout: Duration) -> Result<ProbeResult> {
        self.probe_one(&Probe::tcp(target).timeout(timeout))
    }

    /// Send one UDP datagram to `target` and wait for the reply.
    pub fn probe_udp(&self, target: impl fmt::Display, timeout: Duration) -> Result<ProbeResult> {
        self.probe_one(&Probe::udp(target).timeout(timeout))
    }

    /// Probe `target` until it answers or `timeout` passes (e.g. while a proxy
    /// under test programs its rules); returns the first `ok` result, or an error
    /// with the last result.
    pub fn wait_until_ok(
        &self,
        proto: Proto,
        target: impl fmt::Display,
        timeout: Duration,
    ) -> Result<ProbeResult> {
        let target = target.to_string();
        let deadline = Instant::now() + timeout;
        loop {
            let r =
                self.probe_one(&Probe::new(proto, &target).timeout(Duration::from_millis(300)))?;
            if r.is_ok() {
                return Ok(r);
            }
            if Instant::now() >= deadline {
                return Err(Error::Other(format!(
                    "{proto} {target} from {} did not answer within {timeout:?}; last: {r}",
                    self.name()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// [`spread`] as a method.
    pub fn spread(
        &self,
        proto: Proto,
        target: impl fmt::Display,
        n: usize,
    ) -> Result<BTreeMap<String, usize>> {
        spread(self, proto, target, n)
    }

    /// Start `kpng-echo` named `name` with the given TCP and UDP listeners (pass
    /// IPv4 and IPv6 addresses separately; IPv6 listeners are IPv6-only). Returns once
    /// all listeners are bound; the server stops when the guard is dropped.
    pub fn spawn_echo(
        &self,
        name: &str,
        tcp: &[SocketAddr],
        udp: &[SocketAddr],
    ) -> Result<Spawned> {
        let bin = bin_path("kpng-echo")?;
        let mut args = vec![bin.into_os_string(), "--name".into(), name.into()];
        for a in tcp {
            args.push("--tcp".into());
            args.push(a.to_string().into());
        }
        for a in udp {
            args.push("--udp".into());
            args.push(a.to_string().into());
        }
        let mut child = self.spawn(args)?;
        child.wait_for_line(|l| l == ECHO_READY, Duration::from_secs(10))?;
        Ok(child)
    }
}

/// Probe `target` `n` times, each time from a new socket (new source port, so a
/// new conntrack flow and a new load-balancing decision), and count who answered.
///
/// Keys are server names; attempts without an answer are counted under `"!"`
/// followed by the outcome (`"!timeout"`, `"!refused"`, ...). Each attempt may take
/// up to 1 s when nothing answers.
pub fn spread(
    ns: &Netns,
    proto: Proto,
    target: impl fmt::Display,
    n: usize,
) -> Result<BTreeMap<String, usize>> {
    if n == 0 {
        return Ok(BTreeMap::new());
    }
    let results = ns.probe(&Probe::new(proto, target).count(n).fresh_socket(true))?;
    Ok(tally(&results))
}

/// Count results by server name (`"!OUTCOME"` for attempts without an answer, and
/// `"?"` for answers that are not `kpng-echo` replies).
pub fn tally(results: &[ProbeResult]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for r in results {
        let key = match (r.outcome, &r.server_name) {
            (Outcome::Ok, Some(name)) => name.clone(),
            (Outcome::Ok, None) => "?".to_owned(),
            (o, _) => format!("!{o}"),
        };
        *m.entry(key).or_insert(0) += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_lines_parse_v4_and_v6() {
        let (n, s, c) = parse_reply("pod1a 10.244.1.2:8080 192.168.100.10:40000").expect("v4");
        assert_eq!(n, "pod1a");
        assert_eq!(s, "10.244.1.2:8080".parse().expect("addr"));
        assert_eq!(c, "192.168.100.10:40000".parse().expect("addr"));
        let (_, s, _) = parse_reply("x [fd00:244:1::2]:80 [fd00:100::10]:5").expect("v6");
        assert_eq!(s.port(), 80);
        assert!(parse_reply("x 1.2.3.4:5").is_none());
        assert!(parse_reply("x 1.2.3.4:5 1.2.3.4:6 extra").is_none());
        assert!(parse_reply("HTTP/1.1 200 OK").is_none());
    }

    #[test]
    fn probe_lines_round_trip() {
        let line = r#"{"outcome":"ok","reply":"pod1a 10.244.1.2:8080 192.168.100.10:40000","local":"192.168.100.10:40000","elapsed_us":1500}"#;
        let r = ProbeResult::from_json_line(line).expect("parse");
        assert!(r.is_ok());
        assert_eq!(r.server_name.as_deref(), Some("pod1a"));
        assert_eq!(r.client_addr, r.client_addr_seen_by_server);
        assert_eq!(r.elapsed, Duration::from_micros(1500));
        let t = ProbeResult::from_json_line(r#"{"outcome":"timeout","message":"x"}"#).expect("t");
        assert_eq!(t.outcome, Outcome::Timeout);
        assert!(ProbeResult::from_json_line(r#"{"outcome":"weird"}"#).is_err());
        let json = serde_json::to_string(&ProbeLine {
            outcome: Outcome::Refused,
            reply: None,
            local: None,
            message: Some("m".into()),
            elapsed_us: 3,
        })
        .expect("ser");
        assert_eq!(
            json,
            r#"{"outcome":"refused","message":"m","elapsed_us":3}"#
        );
    }

    #[test]
    fn tally_counts_names_and_failures() {
        let ok = |name: &str| ProbeResult {
            outcome: Outcome::Ok,
            server_name: Some(name.into()),
            server_addr: None,
            client_addr_seen_by_server: None,
            client_addr: None,
            reply: None,
            message: None,
            elapsed: Duration::ZERO,
        };
        let mut to = ok("x");
        to.outcome = Outcome::Timeout;
        let m = tally(&[ok("a"), ok("b"), ok("a"), to]);
        assert_eq!(m.get("a"), Some(&2));
        assert_eq!(m.get("b"), Some(&1));
        assert_eq!(m.get("!timeout"), Some(&1));
    }

    #[test]
    fn probe_args() {
        let p = Probe::udp("[fd00::1]:53")
            .count(3)
            .interval(Duration::from_millis(20))
            .bind("fd00::2")
            .fresh_socket(true);
        assert_eq!(
            p.args().join(" "),
            "udp [fd00::1]:53 --timeout-ms 1000 --count 3 --interval-ms 20 --bind fd00::2 --fresh"
        );
    }
}
