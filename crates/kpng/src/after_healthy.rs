//! `kpng cleanup --after-healthy ADDR` / `--after-synced ADDR`: wait until the proxy that takes
//! over again (kube-proxy after a rollback) answers `http://ADDR/healthz` with 200, or until its
//! `http://ADDR/metrics` says it has programmed the node once, and only then let cleanup remove
//! kpng's rules.
//!
//! Why: kpng's `table ip/ip6 kpng` hooks NAT at the same priority as kube-proxy's rules and
//! was registered first, so while it stays it keeps translating every Service it knows with
//! kpng's last endpoints, and kube-proxy's rules are not reached. Removing it before kube-proxy
//! has synced leaves no Service rules at all (kpng removed kube-proxy's at swap-in). kube-proxy's
//! `/healthz` answers 200 as soon as its health server listens (before its first sync; 503 only
//! once a change waited longer than its health timeout), so 200 says it runs, not that its rules
//! are in place: `--after-synced`, the one the rollback manifest uses, waits for its
//! `kubeproxy_sync_proxy_rules_last_timestamp_seconds` (0 until its first successful sync).
//!
//! Only 200 (and, for `--after-synced`, a non-zero timestamp) counts: any other status, a
//! refused connection, or an answer that is not HTTP is "not yet", reported when it changes, and
//! the last one is named if the wait times out. A blocking GET over a `TcpStream` to a loopback
//! address is all it takes: no HTTP client crate is pulled into the cleanup for it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// How often `/healthz` is asked.
const POLL_EVERY: Duration = Duration::from_secs(1);
/// How long one ask may take (connect, and reading the answer).
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// What to wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// `GET /healthz` answers 200.
    Healthy,
    /// `GET /metrics` answers 200 with `kubeproxy_sync_proxy_rules_last_timestamp_seconds` > 0.
    Synced,
}

/// kube-proxy's metric of its last successful sync (seconds since the epoch; 0 before the first).
const SYNC_METRIC: &str = "kubeproxy_sync_proxy_rules_last_timestamp_seconds";

/// Waits until `addr` says what `until` asks; `timeout` zero waits as long as it takes.
/// Prints one line when it starts and one each time the answer changes. An error (for the
/// binary's exit status) names the address, the time waited and the last answer.
///
/// `blocker` says who still programs this node (a kpng not yet replaced): while it answers,
/// the wait goes on whatever the address says (a kpng's own `/healthz` and metrics answer on
/// the same ports as kube-proxy's), so that this can start right after a rollback begins.
pub fn wait(
    addr: SocketAddr,
    until: Until,
    timeout: Duration,
    blocker: &dyn Fn() -> Option<String>,
) -> Result<(), String> {
    let (path, want) = match until {
        Until::Healthy => ("/healthz", "200".to_string()),
        Until::Synced => ("/metrics", format!("200 with {SYNC_METRIC} > 0")),
    };
    let url = format!("http://{addr}{path}");
    println!("kpng: waiting until {url} answers {want} before removing anything");
    let start = Instant::now();
    let mut last = String::new();
    loop {
        let said = if let Some(who) = blocker() {
            Some(format!(
                "is not asked yet: {who} still runs `to-local` here (it answers on the same ports)"
            ))
        } else {
            answer_says(ask(addr, path), until)
        };
        let Some(said) = said else {
            println!("kpng: {url} answered {want} after {:.1?}", start.elapsed());
            return Ok(());
        };
        if said != last {
            println!("kpng: {url} {said}; waiting");
            last = said;
        }
        if !timeout.is_zero() && start.elapsed() >= timeout {
            return Err(format!(
                "{url} did not answer {want} within {} (last: {last}); removed nothing: \
                 kpng's rules stay and keep translating Services until the proxy there is \
                 healthy and cleanup runs again (--timeout 0 waits as long as it takes)",
                humantime::format_duration(timeout)
            ));
        }
        std::thread::sleep(POLL_EVERY);
    }
}

/// `None` when an answer is the one waited for; otherwise what it was, for the operator.
fn answer_says(answer: Result<(String, String), String>, until: Until) -> Option<String> {
    match &answer {
        Ok((status, body)) if status == "200" => match until {
            Until::Healthy => None,
            Until::Synced => match synced_at(body) {
                Some(t) if t > 0.0 => None,
                Some(_) => Some(format!("says {SYNC_METRIC} 0 (no sync yet)")),
                None => Some(format!("has no {SYNC_METRIC} (not kube-proxy's metrics?)")),
            },
        },
        Ok((status, _)) => Some(format!("answered HTTP {status}")),
        Err(e) => Some(e.clone()),
    }
}

/// One `GET path`: the status code as written and the body, or what went wrong.
fn ask(addr: SocketAddr, path: &str) -> Result<(String, String), String> {
    let mut stream = TcpStream::connect_timeout(&addr, ASK_TIMEOUT)
        .map_err(|e| format!("could not be reached ({e})"))?;
    stream
        .set_read_timeout(Some(ASK_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(ASK_TIMEOUT)))
        .map_err(|e| format!("could not be asked ({e})"))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: kpng-cleanup\r\n\r\n"
    )
    .map_err(|e| format!("could not be asked ({e})"))?;
    // HTTP/1.0: the server closes after the answer. Bounded: a metrics page is well below.
    let mut answer = Vec::new();
    let mut buf = [0u8; 8192];
    while answer.len() < MAX_ANSWER {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) => return Err(format!("did not answer ({e})")),
        }
    }
    let status =
        status_of(&answer).ok_or_else(|| "answered something that is not HTTP".to_string())?;
    Ok((status, String::from_utf8_lossy(&answer).into_owned()))
}

/// The most of an answer read (kube-proxy's metrics page is a few hundred KiB at most).
const MAX_ANSWER: usize = 16 << 20;

/// The value of [`SYNC_METRIC`] in a Prometheus text page, if it has the metric.
fn synced_at(page: &str) -> Option<f64> {
    page.lines().find_map(|line| {
        let rest = line.strip_prefix(SYNC_METRIC)?;
        // Not a longer name (`…_seconds_total`); labels, if any, before the value.
        let rest = rest.strip_prefix(' ').or_else(|| {
            rest.strip_prefix('{')
                .and_then(|r| r.split_once('}'))
                .map(|(_, v)| v)
        })?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// The status code of an HTTP status line (`HTTP/1.1 200 OK`).
fn status_of(head: &[u8]) -> Option<String> {
    let line = String::from_utf8_lossy(head);
    let line = line.lines().next()?;
    let mut words = line.split_whitespace();
    if !words.next()?.starts_with("HTTP/") {
        return None;
    }
    let code = words.next()?;
    (code.len() == 3 && code.bytes().all(|b| b.is_ascii_digit())).then(|| code.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_metric() {
        let cases: [(&str, Option<f64>); 5] = [
            (
                "# HELP x\nkubeproxy_sync_proxy_rules_last_timestamp_seconds 0\n",
                Some(0.0),
            ),
            (
                "kubeproxy_sync_proxy_rules_last_timestamp_seconds 1.7966e+09\n",
                Some(1.7966e9),
            ),
            (
                "kubeproxy_sync_proxy_rules_last_timestamp_seconds{a=\"b\"} 5\n",
                Some(5.0),
            ),
            (
                "kubeproxy_sync_proxy_rules_last_timestamp_seconds_total 5\n",
                None,
            ),
            (
                "# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge\n",
                None,
            ),
        ];
        for (page, want) in cases {
            assert_eq!(synced_at(page), want, "{page}");
        }
    }

    #[test]
    fn status_lines() {
        let cases: [(&[u8], Option<&str>); 6] = [
            (b"HTTP/1.1 200 OK\r\n", Some("200")),
            (b"HTTP/1.0 503 Service Unavailable\r\n", Some("503")),
            (b"HTTP/1.1 404", Some("404")),
            (b"SSH-2.0-OpenSSH\r\n", None),
            (b"HTTP/1.1 2000 x\r\n", None),
            (b"", None),
        ];
        for (head, want) in cases {
            assert_eq!(status_of(head).as_deref(), want, "{head:?}");
        }
    }
}
