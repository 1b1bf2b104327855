//! Connected UDP sockets the programs translated to an endpoint that has since left the
//! Service are destroyed (`SOCK_DESTROY` through sock_diag, with `ss -K`), the way kube-proxy's
//! conntrack reconciler deletes the UDP conntrack entries DNATed from the Service to a gone
//! endpoint: a pending or later receive fails with `ECONNABORTED` and a send on the socket, now
//! unconnected, with `EDESTADDRREQ`; the application opens a new socket, which the programs
//! translate to a current endpoint. Unconnected sockets need nothing: a flow whose endpoint
//! left chooses again at its next `sendmsg()`.
//!
//! Only the translated sockets go, named by their cookie in the reverse map: a socket connected
//! to the same endpoint directly, or through another Service that still has it, is left alone.
//! `ss` cannot select by cookie, so each namespace is read once (`ss -e` shows each socket's
//! cookie as `sk:`) and the translated sockets are then destroyed by their exact addresses.
//!
//! sock_diag works on one network namespace at a time, and pods have their own: the namespaces
//! are found from the processes of the cgroup subtree the programs are attached to (one
//! `nsenter … ss` to read and one to destroy per namespace, only when a UDP endpoint leaves).
//! A kpng in a PID namespace of its own (no `hostPID`) sees none of the pods' processes there
//! (`cgroup.procs` lists only its own namespace's): the sockets it cannot find are counted as
//! failures and said why ([`miss_reason`]), never taken for closed ones, since a socket that
//! closed has already left the reverse map (`sock_release`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::Command;

use tracing::{debug, warn};

/// One process per network namespace of the cgroup subtree at `cgroup`: namespace inode →
/// pid.
fn namespaces(cgroup: &Path) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![cgroup.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            for pid in procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                if let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/net")) {
                    out.entry(ns.display().to_string()).or_insert(pid);
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(&dir) {
            dirs.extend(
                entries
                    .filter_map(Result::ok)
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    out
}

/// Whether `ss`'s peer address `seen` is `target` (the endpoint as the reverse map holds
/// it). The map holds IPv4 endpoints IPv4-mapped and [`crate::layout::ip_of`] gives them back
/// as IPv4, while `ss` writes a dual-stack IPv6 socket's peer as `[::ffff:a.b.c.d]:port`: the
/// addresses are compared in canonical form (the filters keep `ss`'s own form).
pub fn same_peer(target: SocketAddr, seen: SocketAddr) -> bool {
    target.port() == seen.port() && target.ip().to_canonical() == seen.ip().to_canonical()
}

/// The `ss` filter selecting sockets connected to any of `endpoints`.
pub fn filter(endpoints: &BTreeSet<SocketAddr>) -> Vec<String> {
    let mut words = vec!["(".to_owned()];
    for (i, ep) in endpoints.iter().enumerate() {
        if i > 0 {
            words.push("or".into());
        }
        words.push("dst".into());
        words.push(ep.to_string());
    }
    words.push(")".into());
    words
}

/// The `ss` filter selecting exactly these sockets, by (local, peer) address.
pub fn exact_filter(sockets: &[(SocketAddr, SocketAddr)]) -> Vec<String> {
    let mut words = Vec::new();
    for (i, (local, peer)) in sockets.iter().enumerate() {
        if i > 0 {
            words.push("or".into());
        }
        words.extend(["(".into(), "src".into(), local.to_string()]);
        words.extend(["and".into(), "dst".into(), peer.to_string(), ")".into()]);
    }
    words
}

/// One line of `ss -H -n -u -e`: the socket's local and peer addresses and its cookie
/// (`sk:` in hex). `None` for a line that does not read so.
pub fn parse_line(line: &str) -> Option<(SocketAddr, SocketAddr, u64)> {
    let mut addresses = line.split_whitespace().filter_map(socket_address);
    let local = addresses.next()?;
    let peer = addresses.next()?;
    let cookie = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("sk:"))
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())?;
    Some((local, peer, cookie))
}

/// An address as `ss -n` writes it: `10.0.0.1:53`, `[fd00::1]:53`, or with the device a
/// socket is bound to (`10.0.0.1%eth0:53`), which is dropped.
fn socket_address(word: &str) -> Option<SocketAddr> {
    if let Ok(a) = word.parse() {
        return Some(a);
    }
    let (host, port) = word.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let host = host.split_once('%').map_or(host, |(h, _)| h);
    let ip: IpAddr = host.parse().ok()?;
    Some(SocketAddr::new(ip, port.parse().ok()?))
}

/// Runs `ss` with `args` in the network namespace of `pid`; its output lines.
fn ss_in(ns: &str, pid: u32, args: &[String]) -> Option<Vec<String>> {
    let out = Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .arg("ss")
        .args(args)
        .output();
    match out {
        Ok(o) if o.status.success() => Some(
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(str::to_owned)
                .collect(),
        ),
        Ok(o) => {
            warn!(
                "ss in {ns} (pid {pid}) failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            None
        }
        // The process left meanwhile, or nsenter/ss are missing.
        Err(e) => {
            warn!("cannot run nsenter … ss for {ns}: {e}");
            None
        }
    }
}

/// What one [`destroy_udp`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Destroyed {
    /// Sockets destroyed.
    pub destroyed: usize,
    /// Sockets to destroy that were not: see [`failed`].
    pub failed: usize,
    /// The targets' cookies found in no namespace, when every `ss` run worked (else they are
    /// in `failed`). Each is a failure unless the socket closed meanwhile: the caller reads
    /// the reverse map again, where a closed socket no longer is ([`still_there`]).
    pub missing: Vec<u64>,
    /// The network namespaces found in the cgroup subtree: 0 when `cgroup.procs` read empty
    /// everywhere (another PID namespace's view).
    pub namespaces: usize,
    /// The cookies of the sockets destroyed (those `ss -K` named back), so that the log can
    /// say which Services' sockets they were.
    pub cookies: Vec<u64>,
}

/// The sockets of `targets` (`targets` of them) that were to be destroyed and were not, after
/// `destroyed` were, of the `found` ones `ss` showed: when every `ss` run worked, the found
/// ones not destroyed (the targets not found are [`Destroyed::missing`], judged by the
/// caller); when a run failed (`nsenter` or `ss` missing, a namespace that could not be
/// entered or a destroy refused), every target not destroyed, since any could have been
/// behind it.
pub fn failed(targets: usize, found: usize, destroyed: usize, a_run_failed: bool) -> usize {
    if a_run_failed {
        targets.saturating_sub(destroyed)
    } else {
        found.saturating_sub(destroyed)
    }
}

/// Of the `missing` cookies, those the reverse map read again (`now`) still holds: sockets
/// still open that were not found, each a failure (a socket that closed meanwhile left the
/// map at its `sock_release`).
pub fn still_there(missing: &[u64], now: &BTreeMap<u64, SocketAddr>) -> usize {
    missing.iter().filter(|c| now.contains_key(c)).count()
}

/// Why sockets still open were not found in the network namespaces of `cgroup`'s processes
/// (`namespaces` of them seen): for the warning, which must say what to do.
pub fn miss_reason(cgroup: &Path, namespaces: usize, private_pid_namespace: bool) -> String {
    if private_pid_namespace {
        format!(
            "cannot see the processes of cgroup {} (kpng runs in a PID namespace of its own, \
             where cgroup.procs lists only that namespace's processes; {namespaces} network \
             namespaces found): run kpng with hostPID",
            cgroup.display()
        )
    } else if namespaces == 0 {
        format!(
            "no process in cgroup {} (cgroup.procs reads empty everywhere below it)",
            cgroup.display()
        )
    } else {
        format!(
            "not in the network namespaces of the processes of cgroup {} ({namespaces} found): \
             their owners may have moved out of the subtree",
            cgroup.display()
        )
    }
}

/// Lets a repeated warning through at most once per `every`: a node whose kpng cannot see
/// the pods' processes would otherwise warn at every endpoint change.
#[derive(Debug)]
pub struct Throttle {
    every: std::time::Duration,
    last: Option<std::time::Instant>,
}

impl Throttle {
    /// A throttle letting one warning through per `every`.
    pub fn new(every: std::time::Duration) -> Throttle {
        Throttle { every, last: None }
    }

    /// Whether a warning may go out at `now` (and if so, the next waits `every`).
    pub fn allow(&mut self, now: std::time::Instant) -> bool {
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < self.every)
        {
            return false;
        }
        self.last = Some(now);
        true
    }
}

/// Destroys the connected UDP sockets named in `targets` (cookie → the endpoint it is
/// connected to) in every network namespace of the cgroup subtree; returns how many were
/// destroyed, and how many could not be.
pub fn destroy_udp(cgroup: &Path, targets: &BTreeMap<u64, SocketAddr>) -> Destroyed {
    if targets.is_empty() {
        return Destroyed::default();
    }
    let endpoints: BTreeSet<SocketAddr> = targets.values().copied().collect();
    let mut list = vec!["-H".to_owned(), "-n".into(), "-u".into(), "-e".into()];
    list.extend(filter(&endpoints));
    let mut destroyed = 0;
    let mut a_run_failed = false;
    let mut found = BTreeSet::new();
    let mut cookies = Vec::new();
    let namespaces = namespaces(cgroup);
    for (ns, pid) in &namespaces {
        let (ns, pid) = (ns.as_str(), *pid);
        let Some(lines) = ss_in(ns, pid, &list) else {
            a_run_failed = true;
            continue;
        };
        let with_cookies: Vec<(SocketAddr, SocketAddr, u64)> = lines
            .iter()
            .filter_map(|l| parse_line(l))
            .filter(|(_, peer, cookie)| targets.get(cookie).is_some_and(|t| same_peer(*t, *peer)))
            .inspect(|(_, _, cookie)| {
                found.insert(*cookie);
            })
            .collect();
        let exact: Vec<(SocketAddr, SocketAddr)> =
            with_cookies.iter().map(|(l, p, _)| (*l, *p)).collect();
        if exact.is_empty() {
            continue;
        }
        let mut kill = vec!["-K".to_owned(), "-H".into(), "-n".into(), "-u".into()];
        kill.extend(exact_filter(&exact));
        match ss_in(ns, pid, &kill) {
            Some(lines) => {
                debug!("destroyed {} UDP sockets in {ns} (pid {pid})", lines.len());
                a_run_failed |= lines.len() < exact.len();
                destroyed += lines.len();
                cookies.extend(killed_cookies(&lines, &with_cookies));
            }
            None => a_run_failed = true,
        }
    }
    let missing = if a_run_failed {
        Vec::new()
    } else {
        targets
            .keys()
            .filter(|c| !found.contains(c))
            .copied()
            .collect()
    };
    Destroyed {
        destroyed,
        failed: failed(targets.len(), found.len(), destroyed, a_run_failed),
        missing,
        namespaces: namespaces.len(),
        cookies,
    }
}

/// Which Services the destroyed sockets (`cookies`) were translated for, for the log line an
/// operator finds when an application reports `EDESTADDRREQ` ("Destination address
/// required"): per Service (`service_of` a UDP frontend, `None` for one whose Service is gone),
/// its frontends as `address:port/UDP` with how many sockets each, and the endpoints that
/// left. `translated`: cookie → (frontend, endpoint), as the reverse map had them.
pub fn destroyed_by_service(
    cookies: &[u64],
    translated: &BTreeMap<u64, (SocketAddr, SocketAddr)>,
    service_of: impl Fn(SocketAddr) -> Option<String>,
) -> String {
    // Service → frontend → (sockets, endpoints).
    type PerFrontend = BTreeMap<SocketAddr, (usize, BTreeSet<SocketAddr>)>;
    let mut per: BTreeMap<String, PerFrontend> = BTreeMap::new();
    for (frontend, endpoint) in cookies.iter().filter_map(|c| translated.get(c)) {
        let service = service_of(*frontend).unwrap_or_else(|| "a deleted Service".to_owned());
        let entry = per
            .entry(service)
            .or_default()
            .entry(*frontend)
            .or_default();
        entry.0 += 1;
        entry.1.insert(*endpoint);
    }
    per.iter()
        .map(|(service, frontends)| {
            let total: usize = frontends.values().map(|(n, _)| n).sum();
            let each: Vec<String> = frontends
                .iter()
                .map(|(f, (n, eps))| {
                    let eps: Vec<String> = eps.iter().map(ToString::to_string).collect();
                    format!("{f}/UDP: {n} to {}", eps.join(", "))
                })
                .collect();
            format!("{service} {total} ({})", each.join("; "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The cookies of the sockets `ss -K` named back in `killed` (its lines: local and peer
/// address, no cookie), from the `found` sockets (local, peer, cookie) it was told to destroy.
fn killed_cookies(killed: &[String], found: &[(SocketAddr, SocketAddr, u64)]) -> Vec<u64> {
    killed
        .iter()
        .filter_map(|line| {
            let mut addresses = line.split_whitespace().filter_map(socket_address);
            let (local, peer) = (addresses.next()?, addresses.next()?);
            found
                .iter()
                .find(|(l, p, _)| *l == local && same_peer(*p, peer))
                .map(|(_, _, c)| *c)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The log line names each Service, its frontends with their socket counts and the
    /// endpoints that left; a socket not destroyed is not counted, a gone Service is said so.
    #[test]
    fn destroyed_sockets_are_named_by_service() {
        let web = sa("10.96.44.10:5353");
        let web_np = sa("192.168.1.2:30053");
        let dns = sa("[fd00:96::10]:53");
        let gone = sa("10.96.44.99:53");
        let translated: BTreeMap<u64, (SocketAddr, SocketAddr)> = [
            (1, (web, sa("10.244.1.3:8080"))),
            (2, (web, sa("10.244.1.3:8080"))),
            (3, (web_np, sa("10.244.1.2:8080"))),
            (4, (dns, sa("[fd00:244::3]:53"))),
            (5, (gone, sa("10.244.1.9:53"))),
            (6, (web, sa("10.244.1.4:8080"))),
        ]
        .into_iter()
        .collect();
        let service_of = |f: SocketAddr| {
            if f == web || f == web_np {
                Some("default/web".to_owned())
            } else if f == dns {
                Some("kube-system/dns".to_owned())
            } else {
                None
            }
        };
        for (cookies, want) in [
            (&[][..], ""),
            (
                &[1, 2, 3][..],
                "default/web 3 (10.96.44.10:5353/UDP: 2 to 10.244.1.3:8080; \
                 192.168.1.2:30053/UDP: 1 to 10.244.1.2:8080)",
            ),
            (
                &[4, 5, 1, 99][..],
                "a deleted Service 1 (10.96.44.99:53/UDP: 1 to 10.244.1.9:53), default/web 1 \
                 (10.96.44.10:5353/UDP: 1 to 10.244.1.3:8080), kube-system/dns 1 \
                 ([fd00:96::10]:53/UDP: 1 to [fd00:244::3]:53)",
            ),
            (
                &[1, 6][..],
                "default/web 2 (10.96.44.10:5353/UDP: 2 to 10.244.1.3:8080, 10.244.1.4:8080)",
            ),
        ] {
            assert_eq!(
                destroyed_by_service(cookies, &translated, service_of),
                want,
                "{cookies:?}"
            );
        }
    }

    /// `ss -K` names the destroyed sockets by addresses only: each is matched back to the
    /// cookie of the socket found with them.
    #[test]
    fn killed_lines_are_matched_to_their_cookies() {
        let found = [
            (sa("10.244.1.10:49009"), sa("10.244.1.3:8080"), 7),
            (sa("10.244.1.10:49010"), sa("10.244.1.3:8080"), 8),
        ];
        let killed = vec![
            "UNCONN 0 0 10.244.1.10:49010 10.244.1.3:8080".to_owned(),
            "UNCONN 0 0 10.244.1.10:1 10.244.1.3:8080".to_owned(),
        ];
        assert_eq!(killed_cookies(&killed, &found), vec![8]);
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().expect("socket address")
    }

    #[test]
    fn filters_list_every_endpoint_and_every_exact_socket() {
        let eps: BTreeSet<SocketAddr> = [sa("10.0.0.1:53"), sa("[fd00::1]:53")].into();
        assert_eq!(
            filter(&eps).join(" "),
            "( dst 10.0.0.1:53 or dst [fd00::1]:53 )"
        );
        let exact = [
            (sa("10.244.1.2:40000"), sa("10.0.0.1:53")),
            (sa("[fd00::2]:40001"), sa("[fd00::1]:53")),
        ];
        assert_eq!(
            exact_filter(&exact).join(" "),
            "( src 10.244.1.2:40000 and dst 10.0.0.1:53 ) or ( src [fd00::2]:40001 and dst [fd00::1]:53 )"
        );
    }

    #[test]
    fn failures_count_the_targets_left_only_when_a_run_failed() {
        // (targets, found, destroyed, a run failed, failed)
        let cases = [
            (3, 3, 3, false, 0),
            (3, 1, 1, false, 0), // two not found: judged by the caller (missing)
            (3, 3, 1, false, 2), // found, and the destroy missed two
            (3, 3, 1, true, 2),
            (3, 0, 0, true, 3),
            (1, 1, 2, true, 0), // two sockets of one cookie's addresses: never below 0
        ];
        for (targets, found, destroyed, run_failed, want) in cases {
            assert_eq!(
                failed(targets, found, destroyed, run_failed),
                want,
                "{targets} {found} {destroyed} {run_failed}"
            );
        }
    }

    #[test]
    fn a_socket_not_found_is_a_failure_unless_it_left_the_reverse_map() {
        let now: BTreeMap<u64, SocketAddr> =
            [(1, sa("10.244.1.2:53")), (3, sa("10.244.1.2:53"))].into();
        // (missing cookies, still open and missed)
        let cases: [(&[u64], usize); 4] = [(&[], 0), (&[2], 0), (&[1], 1), (&[1, 2, 3], 2)];
        for (missing, want) in cases {
            assert_eq!(still_there(missing, &now), want, "{missing:?}");
        }
    }

    #[test]
    fn the_miss_reason_says_what_to_do() {
        let cg = Path::new("/sys/fs/cgroup/kubepods");
        let cases = [
            ((0, true), "run kpng with hostPID"),
            ((1, true), "run kpng with hostPID"),
            ((0, false), "cgroup.procs reads empty"),
            ((4, false), "4 found"),
        ];
        for ((namespaces, private), want) in cases {
            let why = miss_reason(cg, namespaces, private);
            assert!(why.contains(want) && why.contains("kubepods"), "{why}");
        }
    }

    #[test]
    fn a_throttle_lets_one_warning_through_per_interval() {
        let mut t = Throttle::new(std::time::Duration::from_secs(60));
        let t0 = std::time::Instant::now();
        assert!(t.allow(t0));
        assert!(!t.allow(t0 + std::time::Duration::from_secs(59)));
        assert!(t.allow(t0 + std::time::Duration::from_secs(61)));
    }

    #[test]
    fn a_dual_stack_socket_connected_to_a_mapped_endpoint_is_its_peer() {
        // (the reverse map's endpoint, ss's peer, same)
        let cases = [
            ("10.244.1.2:8080", "10.244.1.2:8080", true),
            ("10.244.1.2:8080", "[::ffff:10.244.1.2]:8080", true),
            ("10.244.1.2:8080", "[::ffff:10.244.1.2]:8081", false),
            ("10.244.1.2:8080", "[::ffff:10.244.1.3]:8080", false),
            ("[fd00::1]:53", "[fd00::1]:53", true),
            ("[fd00::1]:53", "[fd00::2]:53", false),
        ];
        for (target, seen, want) in cases {
            assert_eq!(same_peer(sa(target), sa(seen)), want, "{target} {seen}");
        }
    }

    #[test]
    fn lines_give_addresses_and_cookie() {
        let cases = [
            (
                "0      0      127.0.0.1:46455 127.0.0.1:9 ino:39254495 sk:6546b cgroup:/ <->",
                Some((sa("127.0.0.1:46455"), sa("127.0.0.1:9"), 0x6546b)),
            ),
            (
                "ESTAB 0 0 [fd00::2]:40001 [fd00::1]:53 ino:1 sk:1001 <->",
                Some((sa("[fd00::2]:40001"), sa("[fd00::1]:53"), 0x1001)),
            ),
            (
                "ESTAB 0 0 10.244.1.2%eth0:40000 10.0.0.1:53 ino:1 sk:ff <->",
                Some((sa("10.244.1.2:40000"), sa("10.0.0.1:53"), 0xff)),
            ),
            ("ESTAB 0 0 10.244.1.2:40000 10.0.0.1:53 ino:1 <->", None),
            ("garbage", None),
        ];
        for (line, want) in cases {
            assert_eq!(parse_line(line), want, "{line}");
        }
    }
}
