//! Throw-away network namespaces and the processes run inside them.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex, Once};
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Where each live namespace of this harness is recorded (`NAME` -> `PID STARTTIME`),
/// so that a later process can delete namespaces whose creator was killed before its
/// `Drop` ran (e.g. a test binary interrupted with Ctrl-C).
const MARKER_DIR: &str = "/run/kpng-testkit";

static COUNTER: AtomicU64 = AtomicU64::new(0);
static REAP_ONCE: Once = Once::new();

/// A network namespace created for one test and deleted on drop.
///
/// It exists so that tests get an isolated network stack (interfaces, routes,
/// nftables, conntrack) that cannot collide with the host or with tests running in
/// parallel: the name is `PREFIX-PID-COUNTER`, unique per process and per creation.
/// `lo` is up from the start. Dropping it kills every process still running inside
/// and deletes the namespace (and so every interface in it); errors during that are
/// printed, never panicked on, so a failing test still cleans up.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Create a namespace named `PREFIX-PID-COUNTER` and bring up its `lo`.
    ///
    /// `prefix` may contain ASCII letters, digits, `-`, `_` and `.`; keep it short
    /// (namespace names show up in `ip netns list` and error messages). The first call
    /// in a process also reaps namespaces left behind by dead processes
    /// (see [`reap_stale`]).
    pub fn new(prefix: &str) -> Result<Netns> {
        let ns = Self::add(prefix)?;
        ns.ip(["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Create a namespace set up as a Kubernetes node's, for a test that runs the proxy in a
    /// bare namespace: [`Netns::new`], then IPv4 and IPv6 forwarding on, as on every node
    /// (a new namespace has them off, and kpng's node check rightly warns of it: in tests
    /// not about forwarding that warning is only noise in their logs).
    pub fn node(prefix: &str) -> Result<Netns> {
        let ns = Self::new(prefix)?;
        // ip_forward first: changing it resets other settings of the namespace.
        ns.sysctls(&[
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv6.conf.all.forwarding", "1"),
        ])?;
        Ok(ns)
    }

    /// Create the namespace without configuring anything in it.
    pub(crate) fn add(prefix: &str) -> Result<Netns> {
        if prefix.is_empty()
            || !prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(Error::Other(format!(
                "invalid namespace prefix {prefix:?}: use ASCII letters, digits, '-', '_', '.'"
            )));
        }
        REAP_ONCE.call_once(|| {
            if let Err(e) = reap_stale() {
                eprintln!("kpng-testkit: reaping stale namespaces failed: {e}");
            }
        });
        let pid = std::process::id();
        let marker = format!("{pid} {}", process_start_time(pid).unwrap_or(0));
        // A leftover namespace of a dead process that had our pid makes `add` fail
        // with "File exists"; simply try the next counter value.
        let mut last_err = None;
        for _ in 0..8 {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let name = format!("{prefix}-{pid}-{n}");
            if Path::new("/run/netns").join(&name).exists() {
                continue;
            }
            write_marker(&name, &marker)?;
            match run(Command::new("ip").args(["netns", "add", &name])) {
                Ok(_) => return Ok(Netns { name }),
                Err(e) => {
                    remove_marker(&name);
                    last_err = Some(e);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| {
            Error::Other(format!("no free namespace name for prefix {prefix:?}"))
        }))
    }

    /// The namespace's name, as used by `ip netns exec NAME` and `ip -n NAME`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Run `ip netns exec NAME ARGS...` and return its output, whatever its status.
    ///
    /// This is the primitive for running any program inside the namespace; use
    /// [`Netns::run_ok`] when failure should be an error.
    pub fn exec<I, S>(&self, args: I) -> Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = self.command(args);
        let shown = show(&cmd);
        cmd.stdin(Stdio::null())
            .output()
            .map_err(|e| Error::io(format!("running `{shown}`"), e))
    }

    /// Run a program inside the namespace and return its standard output; a non-zero
    /// exit is an [`Error::Command`] carrying stdout and stderr.
    pub fn run_ok<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        run(&mut self.command(args))
    }

    /// Run a program inside the namespace with `stdin` fed to it; returns stdout,
    /// errors on non-zero exit. Used for `nft -f -` and `ip -batch -`.
    pub fn run_with_stdin<I, S>(&self, args: I, stdin: &str) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        run_with_input(&mut self.command(args), stdin)
    }

    /// Run `ip -n NAME ARGS...` (cheaper than going through `ip netns exec`);
    /// returns stdout, errors on failure.
    pub fn ip<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        run(Command::new("ip").args(["-n", &self.name]).args(args))
    }

    /// Run several `ip` commands in one process (`ip -n NAME -batch -`), one per
    /// line of `script`, without the leading `ip`. The fast way to configure links,
    /// addresses and routes.
    pub fn ip_batch(&self, script: &str) -> Result<()> {
        run_with_input(
            Command::new("ip").args(["-n", &self.name, "-batch", "-"]),
            script,
        )
        .map(drop)
    }

    /// Load an nftables script (`nft -f -`) in the namespace, e.g. a rule set a test
    /// wants in place next to the proxy's. Returns nft's stdout.
    pub fn nft(&self, script: &str) -> Result<String> {
        self.run_with_stdin(["nft", "-f", "-"], script)
    }

    /// Set one sysctl in the namespace (`sysctl -w KEY=VALUE`), e.g.
    /// `net.ipv4.ip_forward`, `1`.
    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        self.sysctls(&[(key, value)])
    }

    /// Set several sysctls with one process.
    pub fn sysctls(&self, settings: &[(&str, &str)]) -> Result<()> {
        if settings.is_empty() {
            return Ok(());
        }
        let mut args = vec!["sysctl".to_owned(), "-q".to_owned(), "-w".to_owned()];
        args.extend(settings.iter().map(|(k, v)| format!("{k}={v}")));
        self.run_ok(args).map(drop)
    }

    /// Start a long-running program inside the namespace (e.g. a server or the proxy
    /// under test). Its stdout is available line by line through
    /// [`Spawned::wait_for_line`]; its stderr is collected for error messages. The
    /// returned guard kills the process when dropped.
    pub fn spawn<I, S>(&self, args: I) -> Result<Spawned>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = self.command(args);
        let shown = show(&cmd);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::io(format!("spawning `{shown}`"), e))?;
        let (tx, lines) = channel();
        if let Some(out) = child.stdout.take() {
            thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        let stderr = Arc::new(Mutex::new(String::new()));
        let (stderr_done_tx, stderr_done) = channel();
        if let Some(mut err) = child.stderr.take() {
            let sink = Arc::clone(&stderr);
            thread::spawn(move || {
                let mut buf = [0u8; 4096];
                loop {
                    match err.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if let Ok(mut s) = sink.lock() {
                                s.push_str(&String::from_utf8_lossy(&buf[..n]));
                            }
                        }
                    }
                }
                let _ = stderr_done_tx.send(());
            });
        }
        Ok(Spawned {
            child,
            command: shown,
            lines,
            stderr,
            stderr_done,
        })
    }

    /// PIDs of all processes currently inside the namespace (`ip netns pids`).
    pub fn pids(&self) -> Result<Vec<u32>> {
        let out = run(Command::new("ip").args(["netns", "pids", &self.name]))?;
        Ok(out
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect())
    }

    /// `ip netns exec NAME ARGS...` as a [`Command`], for callers that need to set
    /// up stdio or the environment themselves.
    pub fn command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]);
        if let Some(group) = crate::cgroups::of(&self.name) {
            // Join the namespace's test cgroup, then become the program (same pid).
            cmd.args(["sh", "-c", "echo $$ > \"$0/cgroup.procs\" && exec \"$@\""])
                .arg(group);
        }
        cmd.args(args);
        cmd
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = destroy(&self.name) {
            eprintln!("kpng-testkit: deleting namespace {}: {e}", self.name);
        }
    }
}

/// Kill everything inside namespace `name`, delete it and its marker, and what kpng recorded
/// for it in `/run/kpng`.
fn destroy(name: &str) -> Result<()> {
    kill_all_in(name);
    // Before the namespace goes: a kpng starting or cleaning up meanwhile elsewhere removes
    // the records of gone namespaces and says so, which a test may be reading.
    if let Some(inode) = namespace_inode(name) {
        forget_kpng_records(inode);
    }
    let res = run(Command::new("ip").args(["netns", "del", name])).map(drop);
    remove_marker(name);
    crate::cgroups::forget(name);
    res
}

/// The namespace's inode: the iptables backend names its `route_localnet` record after it.
fn namespace_inode(name: &str) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(Path::new("/run/netns").join(name))
        .ok()
        .map(|m| m.ino())
}

/// Removes the records a kpng left for a namespace that no longer exists (one that ended
/// without `kpng cleanup`): the iptables backend's `route_localnet`, the conntrack
/// cleanup's memory and the run marker of a kpng a test killed. Left behind, the records pile
/// up in `/run/kpng` over test runs, a later namespace given the same inode would find a
/// record not its own, and `kpng cleanup` in another test would list them.
fn forget_kpng_records(inode: u64) {
    for name in ["route_localnet", "conntrack-checked", "running"] {
        let record = Path::new("/run/kpng").join(format!("{name}.{inode}"));
        if let Err(e) = std::fs::remove_file(&record)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!("kpng-testkit: removing {}: {e}", record.display());
        }
    }
}

fn kill_all_in(name: &str) {
    let Ok(out) = run(Command::new("ip").args(["netns", "pids", name])) else {
        return;
    };
    let pids: Vec<&str> = out.split_whitespace().collect();
    if !pids.is_empty() {
        // Failures (a process that already exited) do not matter.
        let _ = Command::new("kill")
            .arg("-KILL")
            .args(&pids)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Delete namespaces recorded by this harness whose creating process is gone.
///
/// It exists because a test process that is killed (Ctrl-C, a CI timeout) never
/// runs its destructors. Every namespace this crate creates is recorded in
/// `/run/kpng-testkit/NAME` with its creator's pid and start time; only namespaces
/// recorded there, whose creator no longer runs, are deleted. [`Netns::new`] calls it
/// once per process, so there is rarely a reason to call it directly. Returns the
/// names deleted.
pub fn reap_stale() -> Result<Vec<String>> {
    let entries = match std::fs::read_dir(MARKER_DIR) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("reading {MARKER_DIR}"), e)),
    };
    let mut reaped = Vec::new();
    for entry in entries.flatten() {
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let Ok(content) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let mut it = content.split_whitespace();
        let (Some(Ok(pid)), start) = (it.next().map(str::parse::<u32>), it.next()) else {
            continue;
        };
        let start: u64 = start.and_then(|s| s.parse().ok()).unwrap_or(0);
        let alive = match process_start_time(pid) {
            None => false,
            Some(now) => start == 0 || now == start,
        };
        if alive {
            continue;
        }
        if Path::new("/run/netns").join(&name).exists() {
            destroy(&name)?;
        } else {
            remove_marker(&name);
        }
        reaped.push(name);
    }
    Ok(reaped)
}

fn write_marker(name: &str, content: &str) -> Result<()> {
    std::fs::create_dir_all(MARKER_DIR)
        .map_err(|e| Error::io(format!("creating {MARKER_DIR}"), e))?;
    let path = Path::new(MARKER_DIR).join(name);
    std::fs::write(&path, content).map_err(|e| Error::io(format!("writing {path:?}"), e))
}

fn remove_marker(name: &str) {
    let _ = std::fs::remove_file(Path::new(MARKER_DIR).join(name));
}

/// Start time (field 22 of `/proc/PID/stat`, in clock ticks since boot) of a live
/// process, or `None` when there is no such process.
fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

fn parse_start_time(stat: &str) -> Option<u64> {
    // "PID (COMM) STATE PPID ..."; COMM may contain spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the comm, field 3 (state) is index 0, so field 22 is index 19.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// `child`'s exit status once it has ended, waiting at most `timeout`; `None` when it still
/// runs then (or cannot be waited for).
///
/// Why: tests that expect kpng to end by itself (a changed `--config`) wait for it with a
/// deadline, whether they started it with [`Netns::spawn`] or with a plain [`Command`].
pub fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// A process started with [`Netns::spawn`]; killed (and reaped) when dropped.
///
/// It exists so that servers started by a test cannot outlive it, even when the
/// test panics.
#[derive(Debug)]
pub struct Spawned {
    child: Child,
    command: String,
    lines: Receiver<String>,
    stderr: Arc<Mutex<String>>,
    /// Signalled when stderr reached its end (all of it is in `stderr`).
    stderr_done: Receiver<()>,
}

impl Spawned {
    /// The process id (of the program itself: `ip netns exec` execs into it).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Wait until the process prints a stdout line for which `pred` is true, and
    /// return that line. Lines before it are consumed. Errors if the process exits
    /// (closes stdout) first or `timeout` passes; the error includes its stderr.
    pub fn wait_for_line(
        &mut self,
        pred: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if pred(&line) => return Ok(line),
                Ok(_) => continue,
                Err(RecvTimeoutError::Timeout) => {
                    return Err(Error::Other(format!(
                        "`{}`: no expected output line within {timeout:?}; stderr: {}",
                        self.command,
                        self.stderr_text()
                    )));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // Give the process a moment to be reaped so the status is known, and its
                    // stderr reader a moment to read what it wrote last.
                    let status = self.wait_exit(Duration::from_millis(200));
                    let _ = self.stderr_done.recv_timeout(Duration::from_secs(1));
                    return Err(Error::Other(format!(
                        "`{}` closed its stdout ({}) before printing the expected line; stderr: {}",
                        self.command,
                        status.map_or_else(|| "still running".to_owned(), |s| s.to_string()),
                        self.stderr_text()
                    )));
                }
            }
        }
    }

    /// Everything the process wrote to stderr so far (lossy UTF-8).
    pub fn stderr_text(&self) -> String {
        self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Whether the process has exited, without waiting.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        self.child
            .try_wait()
            .map_err(|e| Error::io(format!("waiting for `{}`", self.command), e))
    }

    /// Kill the process now and reap it (what `Drop` does, but observable).
    pub fn kill(mut self) -> Result<()> {
        self.kill_and_reap()
    }

    /// Ask the process to stop (SIGTERM, as kubelet does) and reap it; kill it if it has not
    /// exited within `grace`. Returns its exit status, `None` when it had to be killed.
    pub fn terminate(mut self, grace: Duration) -> Result<Option<ExitStatus>> {
        if let Ok(Some(s)) = self.child.try_wait() {
            return Ok(Some(s));
        }
        // A failure means it exited between the check and the signal: reaped below.
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .map_err(|e| Error::io(format!("sending SIGTERM to `{}`", self.command), e))?;
        match self.wait_exit(grace) {
            Some(s) => Ok(Some(s)),
            None => self.kill_and_reap().map(|()| None),
        }
    }

    /// The process's exit status once it has ended, waiting at most `timeout`; `None` when it
    /// still runs then. For the tests in which kpng is expected to end by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        wait_exit(&mut self.child, timeout)
    }

    fn kill_and_reap(&mut self) -> Result<()> {
        if let Ok(Some(_)) = self.child.try_wait() {
            return Ok(());
        }
        // An error here means the process already exited: still reap it below.
        let _ = self.child.kill();
        self.child
            .wait()
            .map(drop)
            .map_err(|e| Error::io(format!("reaping `{}`", self.command), e))
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Err(e) = self.kill_and_reap() {
            eprintln!("kpng-testkit: {e}");
        }
    }
}

/// Render a command for messages.
pub(crate) fn show(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Run to completion; stdout on success, [`Error::Command`] otherwise.
pub(crate) fn run(cmd: &mut Command) -> Result<String> {
    let shown = show(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::io(format!("running `{shown}`"), e))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::command(shown, &out))
    }
}

/// Like [`run`], feeding `input` on stdin.
pub(crate) fn run_with_input(cmd: &mut Command, input: &str) -> Result<String> {
    let shown = show(cmd);
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io(format!("running `{shown}`"), e))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A program that exits early closes the pipe; its status tells why.
        let _ = stdin.write_all(input.as_bytes());
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Error::io(format!("waiting for `{shown}`"), e))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let mut err = Error::command(shown, &out);
        if let Error::Command { command, .. } = &mut err {
            command.push_str(&format!(" <<EOF\n{}EOF", input));
        }
        Err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_parses_comm_with_spaces_and_parens() {
        let stat = "1234 (a b) c)) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 987654 20 21";
        assert_eq!(parse_start_time(stat), Some(987654));
    }

    #[test]
    fn own_start_time_is_known() {
        assert!(process_start_time(std::process::id()).is_some());
    }

    #[test]
    fn bad_prefix_is_rejected_before_touching_the_system() {
        assert!(Netns::new("a/b").is_err());
        assert!(Netns::new("").is_err());
    }
}
