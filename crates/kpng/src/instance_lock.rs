//! One kpng programming each network namespace: two proxies programming the same node fight
//! each other (each repairs what the other "tampered with", or sweeps the other's rules).
//!
//! How: the lock is an abstract Unix socket named `kpng-<backend>` (`\0kpng-nft`, …), and a
//! kpng that took its own asks for the other backends' before it goes on. Abstract names live
//! in the network namespace, so instances in different namespaces (containers, tests) never
//! block each other, and the name vanishes with the process, whatever killed it: no stale lock
//! file. The holder answers every connection with its pid, so a second instance refuses to
//! start with a message naming the first; the asker then says why it asked (a start, a
//! cleanup), which the holder logs ([`crate::lock_askers`]). On Windows the lock is a named
//! mutex.

/// Held for the life of the process (dropping it does not release the name; exiting does).
#[derive(Debug)]
pub struct InstanceLock {
    #[cfg(target_os = "linux")]
    _listener: std::thread::JoinHandle<()>,
    #[cfg(windows)]
    _mutex: kpng_backend_hns::system::NamedMutex,
}

/// The abstract socket name of `backend`'s lock.
#[cfg(target_os = "linux")]
pub fn lock_name(backend: &str) -> String {
    format!("kpng-{backend}")
}

/// The kpng holding `backend`'s lock in this network namespace, as a message's subject
/// ("another kpng (pid 4242)"); `None` when nobody holds it. Connecting only asks: it never
/// takes the name, so a kpng starting meanwhile is not disturbed. `asking` tells the holder
/// why, which it logs ([`crate::lock_askers`]).
///
/// A connection closed or reset before any answer means the name is going away, not that a
/// kpng runs: a kpng killed while it started a tool (`iptables-restore`) leaves the child it
/// forked holding a copy of the socket until that child's `exec` closes it, which on a loaded
/// node can be long enough for a `kpng cleanup` run right after to connect; it then refused
/// with "another kpng runs …" and removed nothing. It asks again, a few times, until the name
/// is free or someone answers; a holder that stays connected and silent (a hung kpng) still
/// counts.
#[cfg(target_os = "linux")]
pub fn holder(backend: &str, asking: &crate::lock_askers::Asking) -> Option<String> {
    identify(backend, asking).map(|h| match h {
        Holder::Named(who) => who,
        Holder::Unnamed => "another kpng".to_string(),
    })
}

/// Who holds a lock's name, as far as its holder said.
#[cfg(target_os = "linux")]
enum Holder {
    /// It answered with its pid: a running kpng ("another kpng (pid 4242)").
    Named(String),
    /// It did not say who it is: a hung kpng, or one being torn down by the kernel.
    Unnamed,
}

/// [`holder`], telling a holder that named itself from one that did not.
#[cfg(target_os = "linux")]
fn identify(backend: &str, asking: &crate::lock_askers::Asking) -> Option<Holder> {
    use std::time::Duration;

    /// How many times a holder that closes without answering is asked again.
    const ASKS: usize = 10;
    for _ in 0..ASKS {
        match ask(backend, asking)? {
            Answer::Line(line) => {
                return Some(Holder::Named(describe_holder(&line, pid_namespace())));
            }
            Answer::Silent => return Some(Holder::Unnamed),
            Answer::Closed => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    Some(Holder::Unnamed)
}

/// [`holder`], waiting until `deadline` for one that does not say who it is to go away (a
/// kpng of another backend killed a moment ago): `None` when the name is free by then.
#[cfg(target_os = "linux")]
fn settled_holder(
    backend: &str,
    asking: &crate::lock_askers::Asking,
    deadline: std::time::Instant,
) -> Option<String> {
    loop {
        match identify(backend, asking)? {
            Holder::Named(who) => return Some(who),
            Holder::Unnamed if std::time::Instant::now() < deadline => {
                std::thread::sleep(UNNAMED_HOLDER_POLL);
            }
            Holder::Unnamed => {
                return Some(
                    "another kpng (which did not say its pid: a kpng that is exiting, or a \
                     hung one)"
                        .to_string(),
                );
            }
        }
    }
}

/// What the holder of a lock's name said when asked.
#[cfg(target_os = "linux")]
enum Answer {
    /// Its answer: `PID [PID-NAMESPACE]`.
    Line(String),
    /// Nothing within a second, the connection open (a hung or very old holder).
    Silent,
    /// The connection closed or was reset before an answer: the name's holder went away.
    Closed,
}

/// Asks the holder of `backend`'s lock who it is; `None` when nobody holds the name.
#[cfg(target_os = "linux")]
fn ask(backend: &str, asking: &crate::lock_askers::Asking) -> Option<Answer> {
    use std::io::{BufRead, BufReader, ErrorKind, Write};
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixStream};
    use std::time::Duration;

    let addr = SocketAddr::from_abstract_name(lock_name(backend).as_bytes()).ok()?;
    let mut stream = UnixStream::connect_addr(&addr).ok()?;
    // Before reading: the holder answers first, then reads this (an older holder never does).
    let _ = stream.write_all(asking.line().as_bytes());
    if stream
        .set_read_timeout(Some(Duration::from_secs(1)))
        .is_err()
    {
        return Some(Answer::Silent);
    }
    let mut line = String::new();
    Some(match BufReader::new(stream).read_line(&mut line) {
        Ok(0) => Answer::Closed,
        Ok(_) => Answer::Line(line),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Answer::Silent,
        Err(_) => Answer::Closed,
    })
}

/// This process's PID namespace (its inode), which the holder also sends: a pid means
/// something only in its own namespace.
#[cfg(target_os = "linux")]
fn pid_namespace() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
}

/// The holder as its answer (`PID [PID-NAMESPACE]`) names it: a pid of another PID namespace
/// (a container's, where kpng is often pid 1) is said to be one, since here that pid is
/// another process (init, for pid 1).
#[cfg(target_os = "linux")]
fn describe_holder(line: &str, own_namespace: Option<u64>) -> String {
    let mut words = line.split_whitespace();
    let Some(pid) = words.next().and_then(|w| w.parse::<u32>().ok()) else {
        return "another kpng".to_string();
    };
    let namespace = words.next().and_then(|w| w.parse::<u64>().ok());
    match (namespace, own_namespace) {
        (Some(theirs), Some(ours)) if theirs != ours => {
            format!("another kpng (pid {pid} in another PID namespace, such as a container's)")
        }
        _ => format!("another kpng (pid {pid})"),
    }
}

/// Takes the lock of `backend` (`nft`, `iptables`, …) in this network namespace, and refuses
/// when a kpng of one of the `others` backends programs it already: two proxies on one node
/// remove or rewrite each other's rules (`ebpf`'s ruleset is the `kpng` table `nft` writes, so
/// those two repair each other's "tampering" several times a second; the others sweep each
/// other's rules at start-up). Its own lock is taken before the others are asked, so of two
/// kpngs of different backends starting at once neither misses the other (at worst both
/// refuse, and the next start wins).
#[cfg(target_os = "linux")]
pub fn acquire(backend: &str, others: &[&str]) -> anyhow::Result<InstanceLock> {
    use crate::lock_askers::Asking;
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixListener};

    let name = lock_name(backend);
    let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
    let deadline = std::time::Instant::now() + UNNAMED_HOLDER_WAIT;
    let listener = loop {
        match UnixListener::bind_addr(&addr) {
            Ok(l) => break l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                match identify(backend, &Asking::Start(backend.to_string())) {
                    Some(Holder::Named(who)) => anyhow::bail!(
                        "{who} already runs `to-local {backend}` in this network namespace \
                         (it holds the abstract socket @{name}); two would fight over the \
                         same rules: stop it first"
                    ),
                    // Gone meanwhile, or not saying who it is: a kpng killed a moment ago
                    // holds the name until the kernel has torn it down (tens of
                    // milliseconds), so it is asked again for a while.
                    _ if std::time::Instant::now() < deadline => {
                        std::thread::sleep(UNNAMED_HOLDER_POLL);
                    }
                    _ => anyhow::bail!("{}", unnamed_holder_refusal(backend, &name)),
                }
            }
            Err(e) => return Err(e.into()),
        }
    };
    for other in others.iter().filter(|o| **o != backend) {
        if let Some(who) = settled_holder(other, &Asking::Start(backend.to_string()), deadline) {
            anyhow::bail!(
                "{who} runs `to-local {other}` in this network namespace; `to-local {backend}` \
                 beside it would remove or rewrite its rules, and it would put them back: two \
                 proxies on one node fight. Stop it first (its systemd unit, or the DaemonSet's \
                 pod on this node)"
            );
        }
    }
    let pid = std::process::id();
    let backend = backend.to_string();
    let thread = std::thread::Builder::new()
        .name("kpng-instance-lock".into())
        .spawn(move || {
            let mut limit = crate::lock_askers::Limit::default();
            for stream in listener.incoming().flatten() {
                answer(stream, pid, &backend, &mut limit);
            }
        })?;
    Ok(InstanceLock { _listener: thread })
}

/// How long a start waits for a lock whose holder does not say who it is: a kpng killed
/// (`kill -9`) keeps its lock's name while the kernel tears the process down, 40–80 ms as
/// measured, and a start right after the kill was refused for good, though no kpng ran a
/// moment later. A running kpng answers with its pid and is refused at once.
#[cfg(target_os = "linux")]
const UNNAMED_HOLDER_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// How often the lock is tried again meanwhile.
#[cfg(target_os = "linux")]
const UNNAMED_HOLDER_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// Why a start refuses when the lock stayed held through [`UNNAMED_HOLDER_WAIT`] by a holder
/// that never said who it is: a hung kpng, or one that is exiting very slowly.
#[cfg(target_os = "linux")]
fn unnamed_holder_refusal(backend: &str, name: &str) -> String {
    format!(
        "another kpng holds the lock of `to-local {backend}` in this network namespace (the \
         abstract socket @{name}) and did not say its pid within {}s: a kpng that is exiting, \
         or a hung one, may hold it; two would fight over the same rules: stop it first \
         (`ss -xlp | grep @{name}` shows the holder)",
        UNNAMED_HOLDER_WAIT.as_secs()
    )
}

/// Answers one asker with this kpng's pid (and PID namespace), then reads why it asked and
/// logs it, rate-limited ([`crate::lock_askers`]). The asker's line is already sent when it
/// reads the answer, so the short wait only delays a client that sends nothing.
#[cfg(target_os = "linux")]
fn answer(
    mut stream: std::os::unix::net::UnixStream,
    pid: u32,
    backend: &str,
    limit: &mut crate::lock_askers::Limit,
) {
    use std::io::{BufRead, BufReader, Read, Write};
    let _ = match pid_namespace() {
        Some(ns) => writeln!(stream, "{pid} {ns}"),
        None => writeln!(stream, "{pid}"),
    };
    let asker = crate::admin_socket::peer_pid(&stream);
    if stream
        .set_read_timeout(Some(std::time::Duration::from_millis(200)))
        .is_err()
    {
        return;
    }
    let mut line = String::new();
    let _ = BufReader::new(stream.take(64)).read_line(&mut line);
    let Some(asking) = crate::lock_askers::Asking::parse(&line) else {
        tracing::debug!(
            "asked who holds the instance lock{}",
            asker.map_or_else(String::new, |p| format!(" by pid {p}"))
        );
        return;
    };
    let said = asking.said(asker, backend);
    if let Some(quiet) = limit.admit(std::time::Instant::now()) {
        tracing::warn!("{}", crate::lock_askers::line(&said, quiet));
    }
}

/// Windows: one kpng per node programs HNS. Two own the same load balancers and replace each
/// other's whenever their views differ (other flags, a change seen a moment apart), so traffic
/// would flap, for example while an administrator runs `kpng.exe` in a console beside the
/// service. The lock is the named mutex
/// `Global\kpng-<backend>`, which the system releases with the process.
#[cfg(windows)]
pub fn acquire(backend: &str, _others: &[&str]) -> anyhow::Result<InstanceLock> {
    let name = mutex_name(backend);
    match kpng_backend_hns::system::NamedMutex::acquire(&name) {
        Ok(Some(mutex)) => Ok(InstanceLock { _mutex: mutex }),
        Ok(None) => anyhow::bail!(
            "another kpng already runs `to-local {backend}` on this node (it holds the mutex \
             {name}); two would fight over the same load balancers: stop it first \
             (`Stop-Service kpng`, or the other console)"
        ),
        // Access denied: the mutex exists and belongs to a kpng running as another account
        // (the service's), or this shell is not an administrator's.
        Err(e) => anyhow::bail!(
            "creating the mutex {name}: {e} (another kpng, running as another account, may \
             hold it; programming HNS needs an administrator's shell)"
        ),
    }
}

/// The named mutex of `backend`'s lock on Windows (`Global\kpng-hns`).
#[cfg_attr(not(windows), allow(dead_code))] // Windows' lock; messages tested everywhere
pub fn mutex_name(backend: &str) -> String {
    format!("Global\\kpng-{backend}")
}

/// Why a cleanup refuses while a kpng holds `backend`'s mutex: that kpng programs HNS (with or
/// without an admin pipe) and would re-create at once what cleanup removes.
#[cfg_attr(not(windows), allow(dead_code))] // Windows' lock; messages tested everywhere
pub fn held_by_another(backend: &str) -> String {
    format!(
        "another kpng runs `to-local {backend}` on this node (it holds the mutex {})",
        mutex_name(backend)
    )
}

/// Windows: takes `backend`'s lock for the length of a cleanup, so that a kpng starting
/// meanwhile refuses rather than re-create what goes; `Err` says who holds it, naming the
/// mutex. Dropping the lock releases it.
#[cfg(windows)]
pub fn hold(backend: &str) -> Result<InstanceLock, String> {
    let name = mutex_name(backend);
    match kpng_backend_hns::system::NamedMutex::acquire(&name) {
        Ok(Some(mutex)) => Ok(InstanceLock { _mutex: mutex }),
        Ok(None) => Err(held_by_another(backend)),
        Err(e) => Err(format!(
            "the mutex {name} cannot be opened ({e}): a kpng running as another account holds \
             it, or this shell is not an administrator's"
        )),
    }
}

/// Other systems: no node backend, nothing to lock.
#[cfg(not(any(target_os = "linux", windows)))]
pub fn acquire(_backend: &str, _others: &[&str]) -> anyhow::Result<InstanceLock> {
    Ok(InstanceLock {})
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn a_holder_in_another_pid_namespace_is_said_to_be_there() {
        let cases = [
            ("42 7\n", Some(7), "another kpng (pid 42)"),
            (
                "1 9\n",
                Some(7),
                "another kpng (pid 1 in another PID namespace, such as a container's)",
            ),
            // An older kpng sends the pid alone.
            ("42\n", Some(7), "another kpng (pid 42)"),
            ("garbage", Some(7), "another kpng"),
        ];
        for (line, ours, want) in cases {
            assert_eq!(describe_holder(line, ours), want, "{line:?}");
        }
    }

    #[test]
    fn a_second_holder_is_refused_with_the_first_ones_pid() {
        // A name of our own, so that a kpng running on this host is not disturbed.
        let backend = format!("test-{}", std::process::id());
        let first = acquire(&backend, &[]).expect("first");
        let err = acquire(&backend, &[]).expect_err("second").to_string();
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        assert!(err.contains(&format!("to-local {backend}")), "{err}");
        let asking = crate::lock_askers::Asking::Start(backend.clone());
        assert_eq!(
            holder(&backend, &asking),
            Some(format!("another kpng (pid {})", std::process::id()))
        );
        assert_eq!(
            holder(&format!("{backend}-none"), &asking),
            None,
            "nobody holds it"
        );
        // Another backend is another lock, refused while the first runs when it is told
        // about the first one's backend (as kpng tells it about every backend).
        let other = format!("{backend}-other");
        let err = acquire(&other, &[backend.as_str(), other.as_str()])
            .expect_err("another backend beside the first")
            .to_string();
        assert!(
            err.contains(&format!("pid {}", std::process::id()))
                && err.contains(&format!("runs `to-local {backend}`"))
                && err.contains(&format!("`to-local {other}` beside it")),
            "{err}"
        );
        let third = format!("{backend}-third");
        let alone = acquire(&third, &[third.as_str(), "none-running"]).expect("no other runs");
        drop((first, alone));
    }

    /// A name whose holder goes away without answering (a killed kpng's child between its
    /// fork and `exec`, which holds a copy of the socket) is not a running kpng: `kpng
    /// cleanup` right after such a kill refused, saying "another kpng runs …". A holder that
    /// stays silent still counts.
    #[test]
    fn a_holder_that_goes_away_without_answering_is_nobody() {
        use std::os::linux::net::SocketAddrExt;
        use std::os::unix::net::{SocketAddr, UnixListener};
        use std::time::Duration;

        /// What the fake holder does with the name after it is bound.
        #[derive(Debug, Clone, Copy)]
        enum Holder {
            /// Never accepts; closes the name after a moment (the connection is reset).
            ClosesUnaccepted,
            /// Accepts the connection and drops it unanswered, then closes the name.
            HangsUp,
            /// Accepts and keeps the connection open, silent, for longer than the asker waits.
            Silent,
        }
        let cases = [
            (Holder::ClosesUnaccepted, None),
            (Holder::HangsUp, None),
            (Holder::Silent, Some("another kpng".to_string())),
        ];
        for (i, (what, want)) in cases.into_iter().enumerate() {
            let backend = format!("test-{}-gone-{i}", std::process::id());
            let addr =
                SocketAddr::from_abstract_name(lock_name(&backend).as_bytes()).expect("addr");
            let listener = UnixListener::bind_addr(&addr).expect("bind");
            let fake = std::thread::spawn(move || match what {
                Holder::ClosesUnaccepted => {
                    std::thread::sleep(Duration::from_millis(200));
                    drop(listener);
                }
                Holder::HangsUp => {
                    let (conn, _) = listener.accept().expect("accept");
                    drop((conn, listener));
                }
                Holder::Silent => {
                    let (conn, _) = listener.accept().expect("accept");
                    std::thread::sleep(Duration::from_millis(1500));
                    drop((conn, listener));
                }
            });
            let asking = crate::lock_askers::Asking::Cleanup { dry_run: false };
            assert_eq!(holder(&backend, &asking), want, "{what:?}");
            fake.join().expect("the fake holder");
        }
    }

    /// `kill -9` and an immediate start: the killed kpng holds its lock's name for a few tens
    /// of milliseconds more, never answering, and the start was refused for good ("another
    /// kpng already runs …", no pid) though no kpng ran a moment later. A start waits for
    /// such a holder; one that keeps the name longer is still refused, saying it may be
    /// exiting.
    #[test]
    fn a_lock_held_by_an_exiting_holder_is_waited_for() {
        use std::os::linux::net::SocketAddrExt;
        use std::os::unix::net::{SocketAddr, UnixListener};
        use std::time::Duration;

        let cases = [
            // Like a killed kpng (tens of ms), with room for a loaded machine.
            (Duration::from_millis(300), true),
            // Well past the wait: a hung holder.
            (UNNAMED_HOLDER_WAIT * 2, false),
        ];
        for (i, (held, taken)) in cases.into_iter().enumerate() {
            let backend = format!("test-{}-exiting-{i}", std::process::id());
            let addr =
                SocketAddr::from_abstract_name(lock_name(&backend).as_bytes()).expect("addr");
            // Bound and never accepting: what a process being torn down looks like.
            let listener = UnixListener::bind_addr(&addr).expect("bind");
            let fake = std::thread::spawn(move || {
                std::thread::sleep(held);
                drop(listener);
            });
            let got = acquire(&backend, &[]);
            match (taken, got) {
                (true, Ok(lock)) => drop(lock),
                (false, Err(e)) => {
                    let e = e.to_string();
                    assert!(
                        e.contains("a kpng that is exiting")
                            && e.contains(&format!("@{}", lock_name(&backend))),
                        "{e}"
                    );
                }
                (want, got) => panic!("held {held:?}: want taken={want}, got {got:?}"),
            }
            fake.join().expect("the fake holder");
        }
    }
}
