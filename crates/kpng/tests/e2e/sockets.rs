//! Helpers of the socket-level tests (`e2e_ebpf.rs`, `e2e_ebpf_sockets.rs`): python clients
//! run in pods, echo servers in some pods, files a client waits for, node1's `/metrics`.
//! One copy here so that the two test binaries do not each grow their own.

use std::net::IpAddr;
use std::path::PathBuf;

use kpng_testkit::{Cluster, Spawned};

use super::harness::EP_PORT;

/// Starts the echo server (port [`EP_PORT`]) in each of `pods`; they serve until dropped.
pub fn echo_in(c: &Cluster, pods: &[&str]) -> Vec<Spawned> {
    pods.iter()
        .map(|p| c.pod(p).start_echo(EP_PORT).expect("echo"))
        .collect()
}

/// The command line that runs python `script` with `args`.
fn python_argv(script: &str, args: &[String]) -> Vec<String> {
    let mut all = vec!["python3".to_owned(), "-c".into(), script.into()];
    all.extend(args.iter().cloned());
    all
}

/// Runs python `script` with `args` in `pod`, and returns its standard output once it exited
/// successfully (its standard error in the panic otherwise).
pub fn python(c: &Cluster, pod: &str, script: &str, args: &[String]) -> String {
    let out = c
        .pod(pod)
        .ns
        .exec(python_argv(script, args))
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{pod}: python failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Starts python `script` with `args` in `pod`, for a client that prints as it goes.
pub fn spawn_python(c: &Cluster, pod: &str, script: &str, args: &[String]) -> Spawned {
    c.pod(pod)
        .ns
        .spawn(python_argv(script, args))
        .expect("python3")
}

/// `ip` as an IPv4-mapped IPv6 address (`::ffff:10.96.0.10`), the address a dual-stack
/// AF_INET6 socket uses for an IPv4 Service; an IPv6 address as it is.
pub fn v4_mapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V6(v4.to_ipv6_mapped()),
        v6 => v6,
    }
}

/// A directory of files a test creates to tell its clients to go on (the scripts poll for
/// them); removed when dropped.
pub struct Signals(tempfile::TempDir);

impl Default for Signals {
    fn default() -> Signals {
        Signals(tempfile::tempdir().expect("tempdir"))
    }
}

impl Signals {
    pub fn new() -> Signals {
        Signals::default()
    }

    /// The path of signal `name`, as a client's argument.
    pub fn path(&self, name: &str) -> String {
        self.file(name).display().to_string()
    }

    /// Gives signal `name`: creates its file.
    pub fn raise(&self, name: &str) {
        std::fs::write(self.file(name), "").expect("signal file");
    }

    fn file(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
}

/// node1's `/metrics`.
pub fn scrape_metrics(c: &Cluster) -> String {
    let out = c
        .node1
        .ns
        .exec(["curl", "-s", "http://127.0.0.1:10249/metrics"])
        .expect("curl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The value of the sample `series` (name and labels, as written) in `metrics`.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}
