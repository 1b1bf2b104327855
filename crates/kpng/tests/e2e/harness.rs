//! Helpers of the end-to-end suite: manifests, running kpng with a backend, probing and
//! the assertions on what a probe saw.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};

use kpng_testkit::{
    Cluster, Netns, Outcome, Probe, ProbeResult, Proto, Spawned, addr, bin_path, tally,
};

use super::Backend;

/// Port every echo server listens on (TCP and UDP); the EndpointSlice port.
pub const EP_PORT: u16 = 8080;
/// Service port of every test Service (TCP and UDP).
pub const SVC_PORT: u16 = 80;
/// Timeout of a probe that should be answered.
pub const OK_T: Duration = Duration::from_secs(2);
/// Timeout of a probe that should be dropped.
pub const DROP_T: Duration = Duration::from_millis(400);
/// Timeout of a probe that should be rejected with an ICMP error (UDP; TCP where something
/// other than kpng's rules refuses). An IPv6 TCP client may see such an error only at its
/// first SYN retransmission (1 s): the ICMPv6 error comes back through the veths while
/// `connect()` still holds the socket lock, so the kernel only records it as a soft error
/// (`LockDroppedIcmps`).
pub const REJECT_T: Duration = Duration::from_millis(1500);
/// Timeout of a TCP connection kpng's rules should refuse: at once in both families, as
/// every backend refuses TCP with a reset, never with the ICMP error above.
pub const TCP_REJECT_T: Duration = Duration::from_millis(300);

/// The timeout of a probe kpng's rules should refuse: [`TCP_REJECT_T`] or [`REJECT_T`].
pub fn reject_t(proto: Proto) -> Duration {
    match proto {
        Proto::Tcp => TCP_REJECT_T,
        Proto::Udp => REJECT_T,
    }
}

/// node1 and node2, with the testkit topology's addresses and pod CIDRs.
pub const NODES: &str = r#"apiVersion: v1
kind: Node
metadata: {name: node1}
spec: {podCIDRs: [10.244.1.0/24, "fd00:244:1::/64"]}
status:
  addresses:
  - {type: InternalIP, address: 192.168.100.1}
  - {type: InternalIP, address: "fd00:100::1"}
---
apiVersion: v1
kind: Node
metadata: {name: node2}
spec: {podCIDRs: [10.244.2.0/24, "fd00:244:2::/64"]}
status:
  addresses:
  - {type: InternalIP, address: 192.168.100.2}
  - {type: InternalIP, address: "fd00:100::2"}
"#;

/// An endpoint's conditions.
#[derive(Debug, Clone, Copy)]
pub enum Cond {
    /// ready, serving, not terminating.
    Ready,
    /// Not ready, serving, terminating (draining).
    Draining,
    /// Not ready, not serving, terminating.
    Dead,
}

/// `(pod, conditions)` pairs: the endpoints of one Service.
pub type Eps<'a> = &'a [(&'a str, Cond)];

pub const ALL3: Eps<'static> = &[
    ("pod1a", Cond::Ready),
    ("pod1b", Cond::Ready),
    ("pod2a", Cond::Ready),
];

pub fn pod_ips(pod: &str) -> (IpAddr, IpAddr, &'static str) {
    match pod {
        "pod1a" => (addr::POD1A_V4.into(), addr::POD1A_V6.into(), "node1"),
        "pod1b" => (addr::POD1B_V4.into(), addr::POD1B_V6.into(), "node1"),
        "pod2a" => (addr::POD2A_V4.into(), addr::POD2A_V6.into(), "node2"),
        other => panic!("unknown pod {other}"),
    }
}

/// ClusterIP number `n` of the given family (`10.96.0.N`, `fd00:96::N` in hex).
pub fn cip(n: u8, v6: bool) -> IpAddr {
    if v6 {
        format!("fd00:96::{n:x}").parse().expect("v6 cluster IP")
    } else {
        format!("10.96.0.{n}").parse().expect("v4 cluster IP")
    }
}

/// External IP / load-balancer IP number `n` (`198.51.100.N`).
pub fn vip(n: u8) -> IpAddr {
    format!("198.51.100.{n}").parse().expect("vip")
}

/// The node port of Service number `n`.
pub fn node_port(n: u8) -> u16 {
    30000 + u16::from(n)
}

/// A Service `name` with ClusterIPs number `n` (dual-stack, or IPv4 only), TCP and UDP
/// port 80 → 8080, of type `ty` (node ports `30000+n` for NodePort/LoadBalancer, LB
/// ingress `198.51.100.n`); `extra` is appended to the spec's flow mapping
/// (e.g. `"sessionAffinity: ClientIP"`).
pub fn service_fams(name: &str, n: u8, ty: &str, extra: &str, dual: bool) -> String {
    let np = if ty == "ClusterIP" {
        String::new()
    } else {
        format!(", nodePort: {}", node_port(n))
    };
    let extra = if extra.is_empty() {
        String::new()
    } else {
        format!(", {extra}")
    };
    let status = if ty == "LoadBalancer" {
        format!(
            "\nstatus: {{loadBalancer: {{ingress: [{{ip: {}}}]}}}}",
            vip(n)
        )
    } else {
        String::new()
    };
    let v4 = cip(n, false);
    let fams = if dual {
        format!(
            "clusterIPs: [{v4}, \"{}\"], ipFamilies: [IPv4, IPv6], ipFamilyPolicy: RequireDualStack",
            cip(n, true)
        )
    } else {
        format!("clusterIPs: [{v4}], ipFamilies: [IPv4], ipFamilyPolicy: SingleStack")
    };
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{namespace: default, name: {name}}}\n\
         spec: {{type: {ty}, clusterIP: {v4}, {fams}, ports: [\
         {{name: tcp, port: {SVC_PORT}, protocol: TCP, targetPort: {EP_PORT}{np}}}, \
         {{name: udp, port: {SVC_PORT}, protocol: UDP, targetPort: {EP_PORT}{np}}}]{extra}}}{status}\n"
    )
}

/// The IPv4 and IPv6 EndpointSlices of Service `svc` with the given endpoints.
pub fn slices(svc: &str, eps: Eps<'_>) -> String {
    let mut out = Vec::new();
    for (fam, v6) in [("IPv4", false), ("IPv6", true)] {
        // Slice names are DNS-1123 subdomains: lower case, as the API server requires.
        let fam_lower = fam.to_lowercase();
        let mut s = format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{namespace: default, name: {svc}-{fam_lower}, \
             labels: {{kubernetes.io/service-name: {svc}}}}}\n\
             addressType: {fam}\n\
             ports: [{{name: tcp, port: {EP_PORT}, protocol: TCP}}, \
             {{name: udp, port: {EP_PORT}, protocol: UDP}}]\n\
             endpoints:"
        );
        if eps.is_empty() {
            s.push_str(" []");
        }
        s.push('\n');
        for (pod, cond) in eps {
            let (ip4, ip6, node) = pod_ips(pod);
            let ip = if v6 { ip6 } else { ip4 };
            let (ready, serving, terminating) = match cond {
                Cond::Ready => (true, true, false),
                Cond::Draining => (false, true, true),
                Cond::Dead => (false, false, true),
            };
            s.push_str(&format!(
                "- {{addresses: [\"{ip}\"], nodeName: {node}, conditions: \
                 {{ready: {ready}, serving: {serving}, terminating: {terminating}}}}}\n"
            ));
        }
        out.push(s);
    }
    out.join("---\n")
}

/// A dual-stack Service and its EndpointSlices.
pub fn svc(name: &str, n: u8, ty: &str, extra: &str, eps: Eps<'_>) -> String {
    format!(
        "{}---\n{}",
        service_fams(name, n, ty, extra, true),
        slices(name, eps)
    )
}

/// An IPv4-only Service and its EndpointSlices.
pub fn svc_v4(name: &str, n: u8, ty: &str, extra: &str, eps: Eps<'_>) -> String {
    format!(
        "{}---\n{}",
        service_fams(name, n, ty, extra, false),
        slices(name, eps)
    )
}

/// The whole cluster: the nodes and these objects.
pub fn manifest(objects: &[String]) -> String {
    let mut s = NODES.to_owned();
    for o in objects {
        s.push_str("---\n");
        s.push_str(o);
    }
    s
}

/// `kpng … to-local <backend>` running in node1 on a manifest file it watches.
pub struct Kpng<'a> {
    backend: Backend,
    ns: &'a Netns,
    input: PathBuf,
    /// The source and its flags; `None`: `file --input <input>`.
    source: Option<Vec<String>>,
    extra: Vec<String>,
    /// Flags after `to-local <backend>`.
    sink_extra: Vec<String>,
    proc: Option<Spawned>,
    dir: Option<tempfile::TempDir>,
    /// A directory searched first for the tools kpng runs (a wrapper around
    /// `iptables-nft-restore`, say); `None`: the inherited `PATH`.
    path_first: Option<PathBuf>,
    /// A command kpng runs under (`unshare --pid …`, say); empty: none.
    wrapper: Vec<String>,
}

impl<'a> Kpng<'a> {
    /// Write `manifest`, start kpng with `backend` in `ns` (node1) with the standard flags
    /// plus `extra`, and wait for its first successful sync.
    #[track_caller]
    pub fn start(backend: Backend, ns: &'a Netns, manifest: &str, extra: &[&str]) -> Kpng<'a> {
        Kpng::start_with(backend, ns, manifest, None, extra, &[])
    }

    /// [`Kpng::start`] with another source than `file` (`source`: the words before the global
    /// flags, e.g. `kube --kubeconfig F`) and flags after `to-local <backend>` (`sink_extra`).
    #[track_caller]
    pub fn start_with(
        backend: Backend,
        ns: &'a Netns,
        manifest: &str,
        source: Option<&[&str]>,
        extra: &[&str],
        sink_extra: &[&str],
    ) -> Kpng<'a> {
        Kpng::start_with_path(backend, ns, manifest, source, extra, sink_extra, None)
    }

    /// [`Kpng::start_with`] with `path_first` searched first for the tools kpng runs (the
    /// iptables backend has no flag naming its tools: a wrapper is put there instead).
    #[track_caller]
    pub fn start_with_path(
        backend: Backend,
        ns: &'a Netns,
        manifest: &str,
        source: Option<&[&str]>,
        extra: &[&str],
        sink_extra: &[&str],
        path_first: Option<&Path>,
    ) -> Kpng<'a> {
        let owned = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<String>>();
        let dir = tempfile::tempdir().expect("tempdir");
        let input = dir.path().join("cluster.yaml");
        write_atomically(&input, manifest);
        let mut k = Kpng {
            backend,
            ns,
            input,
            source: source.map(owned),
            extra: owned(extra),
            sink_extra: owned(sink_extra),
            proc: None,
            dir: Some(dir),
            path_first: path_first.map(Path::to_path_buf),
            wrapper: Vec::new(),
        };
        k.spawn();
        k
    }

    /// [`Kpng::start`] with kpng run under `wrapper` (a command that runs the rest of its
    /// arguments: `unshare --pid --fork --kill-child --mount-proc`, say).
    #[track_caller]
    pub fn start_wrapped(
        backend: Backend,
        ns: &'a Netns,
        manifest: &str,
        extra: &[&str],
        wrapper: &[&str],
    ) -> Kpng<'a> {
        let dir = tempfile::tempdir().expect("tempdir");
        let input = dir.path().join("cluster.yaml");
        write_atomically(&input, manifest);
        let mut k = Kpng {
            backend,
            ns,
            input,
            source: None,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            sink_extra: Vec::new(),
            proc: None,
            dir: Some(dir),
            path_first: None,
            wrapper: wrapper.iter().map(|s| (*s).to_owned()).collect(),
        };
        k.spawn();
        k
    }

    /// The manifest file a `file` source watches.
    pub fn input(&self) -> &Path {
        &self.input
    }

    #[track_caller]
    pub fn spawn(&mut self) {
        let args = self.args();
        self.proc = Some(self.ns.spawn(&args).expect("start kpng"));
        self.wait_synced(0, 0);
        self.wait_logged("the admin socket", |err| {
            err.contains("serving `kpng status` and `kpng trace`")
        });
        super::traced::serving(&self.admin_socket());
    }

    /// Starts kpng without waiting for anything: for a start whose first sync is held (a
    /// manifest cut off mid-write), where [`Kpng::spawn`] would wait for the sync.
    pub fn spawn_unsynced(&mut self) {
        let args = self.args();
        self.proc = Some(self.ns.spawn(&args).expect("start kpng"));
    }

    /// Where this kpng answers `kpng status` and `kpng trace`.
    pub fn admin_socket(&self) -> PathBuf {
        self.input.with_file_name("admin.sock")
    }

    /// `kpng status -o json` of this kpng.
    pub fn status_json(&self) -> serde_json::Value {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kpng"))
            .args(["status", "-o", "json", "--admin-socket"])
            .arg(self.admin_socket())
            .output()
            .expect("kpng status");
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("kpng status: {e}: {}", String::from_utf8_lossy(&out.stderr))
        })
    }

    /// `kpng status -o json` of this kpng once `ok` holds for it (asked every 20 ms, for at most
    /// 10 s), or the last answer: a sync records what it did (a repair, say) when it ends, after
    /// its effect on the node can already be seen.
    pub fn status_until(&self, ok: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut status = self.status_json();
        while !ok(&status) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
            status = self.status_json();
        }
        status
    }

    /// Starts another kpng with the same arguments in `ns` (this one's namespace or another),
    /// without waiting for anything. In another namespace an eBPF kpng gets that node's own
    /// cgroup and pins, as a node of its own would have (pins are the host's: shared ones are
    /// refused).
    pub fn spawn_another(&self, ns: &Netns) -> Spawned {
        ns.spawn(self.args_in(self.backend, ns))
            .expect("start another kpng")
    }

    /// Starts a kpng of `backend` (another one) in this one's namespace, on the same input,
    /// without waiting for anything.
    pub fn spawn_beside(&self, backend: Backend) -> Spawned {
        self.ns
            .spawn(self.args_for(backend))
            .expect("start a kpng of another backend")
    }

    /// The running kpng's pid.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(Spawned::id)
    }

    fn args(&self) -> Vec<String> {
        self.args_for(self.backend)
    }

    fn args_for(&self, backend: Backend) -> Vec<String> {
        self.args_in(backend, self.ns)
    }

    /// The arguments of a kpng of `backend` in namespace `ns`.
    fn args_in(&self, backend: Backend, ns: &Netns) -> Vec<String> {
        let mut args: Vec<String> = self.wrapper.clone();
        if let Some(dir) = &self.path_first {
            let path = std::env::var("PATH").unwrap_or_default();
            args.extend(["env".to_owned(), format!("PATH={}:{path}", dir.display())]);
        }
        args.push(env!("CARGO_BIN_EXE_kpng").into());
        // Every sync's `synced backend=` line, which `wait_synced` counts: past the first ten
        // routine syncs of a minute kpng logs them at debug level only (docs/observability.md).
        args.extend([
            "--log-level".into(),
            "info,kpng_runner::runner=debug".into(),
        ]);
        match &self.source {
            Some(source) => args.extend(source.iter().cloned()),
            None => args.extend([
                "file".into(),
                "--input".into(),
                self.input.display().to_string(),
            ]),
        }
        args.extend(
            [
                "--node-name",
                "node1",
                "--cluster-cidr",
                &format!("{},{}", addr::CLUSTER_CIDR_V4, addr::CLUSTER_CIDR_V6),
                "--service-cidr",
                &format!("{},{}", addr::SERVICE_CIDR_V4, addr::SERVICE_CIDR_V6),
                "--min-sync-period",
                "0",
                "--healthz-bind-address",
                "127.0.0.1:10256",
                "--metrics-bind-address",
                "127.0.0.1:10249",
                "--admin-socket",
                &self.admin_socket().display().to_string(),
            ]
            .map(|a| a.to_string()),
        );
        args.extend(self.extra.iter().cloned());
        args.extend(backend.sink_args().iter().map(|a| (*a).to_owned()));
        if backend == Backend::Ebpf {
            let (cgroup, pins) = ebpf_scope(ns);
            args.extend([
                "--cgroup-path".to_owned(),
                cgroup.display().to_string(),
                "--bpf-pin-path".to_owned(),
                pins.display().to_string(),
            ]);
        }
        args.extend(self.sink_extra.iter().cloned());
        args
    }

    pub fn stderr(&self) -> String {
        self.proc
            .as_ref()
            .map(Spawned::stderr_text)
            .unwrap_or_default()
    }

    /// (successful syncs, failed syncs) kpng logged so far.
    pub fn sync_counts(&self) -> (usize, usize) {
        let err = self.stderr();
        (
            err.matches("synced backend=").count(),
            err.matches("sync failed").count(),
        )
    }

    /// Wait until kpng has logged more than `ok_before` successful syncs; fail at once
    /// on a failed sync (more than `failed_before`) or when kpng exits.
    #[track_caller]
    pub fn wait_synced(&mut self, ok_before: usize, failed_before: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (ok, failed) = self.sync_counts();
            assert!(
                failed <= failed_before,
                "kpng failed to sync:\n{}",
                self.stderr()
            );
            if ok > ok_before {
                return;
            }
            if let Some(p) = self.proc.as_mut()
                && let Ok(Some(status)) = p.try_wait()
            {
                panic!("kpng exited ({status}):\n{}", self.stderr());
            }
            assert!(
                Instant::now() < deadline,
                "kpng did not sync within 10 s:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Wait until kpng's stderr satisfies `logged` (e.g. a line it writes once it decided
    /// something); fail after 10 s or when kpng exits.
    #[track_caller]
    pub fn wait_logged(&mut self, what: &str, logged: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if logged(&self.stderr()) {
                return;
            }
            if let Some(p) = self.proc.as_mut()
                && let Ok(Some(status)) = p.try_wait()
            {
                panic!("kpng exited ({status}) before {what}:\n{}", self.stderr());
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within 10 s; kpng said:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Rewrite the watched file without waiting (e.g. while kpng is stopped).
    pub fn write(&self, manifest: &str) {
        write_atomically(&self.input, manifest);
    }

    /// Replace the cluster state (rewrite the watched file) and wait until kpng synced it.
    #[track_caller]
    pub fn apply(&mut self, manifest: &str) {
        let (ok, failed) = self.sync_counts();
        write_atomically(&self.input, manifest);
        self.wait_synced(ok, failed);
    }

    /// Kill kpng (`kill -9`: a crash; it leaves its rules in place).
    pub fn stop(&mut self) {
        super::traced::stopped();
        if let Some(p) = self.proc.take() {
            p.kill().expect("kill kpng");
        }
    }

    /// Stop kpng as kubelet does (SIGTERM; kill -9 after 10 s) and check that it exited of
    /// its own accord, successfully.
    #[track_caller]
    pub fn terminate(&mut self) {
        super::traced::stopped();
        if let Some(p) = self.proc.take() {
            let stderr = p.stderr_text();
            let status = p
                .terminate(Duration::from_secs(10))
                .expect("terminate kpng");
            assert!(
                status.is_some_and(|s| s.success()),
                "kpng did not exit cleanly on SIGTERM ({status:?}):\n{stderr}"
            );
        }
    }

    /// Replaces the flags given after the standard ones (from the next start on).
    pub fn set_extra(&mut self, extra: &[&str]) {
        self.extra = extra.iter().map(|s| (*s).to_owned()).collect();
    }

    /// Restart kpng as a rolling update does (SIGTERM, then a new process on the current
    /// file).
    #[track_caller]
    pub fn restart(&mut self) {
        self.terminate();
        self.spawn();
    }

    /// Let go of the running kpng process (and of the manifest directory), e.g. to
    /// drop the cluster while kpng still runs.
    pub fn detach(mut self) -> (Option<Spawned>, tempfile::TempDir) {
        super::traced::stopped();
        let dir = self.dir.take().expect("the manifest directory");
        (self.proc.take(), dir)
    }
}

impl Drop for Kpng<'_> {
    fn drop(&mut self) {
        super::traced::stopped();
        if self.backend == Backend::Ebpf {
            // The pins keep the programs attached; kpng is gone (or going) with its cluster.
            if let Some(p) = self.proc.take() {
                let _ = p.kill();
            }
            let _ = std::fs::remove_dir_all(ebpf_pins(self.ns));
        }
    }
}

/// The pin directory of the eBPF backend running in `node`.
/// Removes what an eBPF kpng of `node` started by hand (not a [`Kpng`], whose drop does it)
/// leaves: its pins and the node's test cgroups. Its process must be gone.
pub fn forget_ebpf_scope(node: &Netns) {
    let (local, pins) = ebpf_scope(node);
    let _ = std::fs::remove_dir_all(pins);
    if let Some(groups) = local.parent() {
        for group in ["local", "outside"] {
            let _ = std::fs::remove_dir(groups.join(group));
        }
        let _ = std::fs::remove_dir(groups);
    }
}

pub fn ebpf_pins(node: &Netns) -> PathBuf {
    kpng_testkit::cgroups::socket_pins(node.name())
}

/// The eBPF backend's scope in a test cluster ([`kpng_testkit::cgroups::socket_scope`]):
/// (node `node`'s cgroup, the pin directory).
pub fn ebpf_scope(node: &Netns) -> (PathBuf, PathBuf) {
    kpng_testkit::cgroups::socket_scope(node.name()).expect("eBPF scope")
}

pub fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write manifest");
    std::fs::rename(&tmp, path).expect("rename manifest");
}

/// Start the echo server in every pod (TCP and UDP port 8080, IPv4 and IPv6).
pub fn echo_all(c: &Cluster) -> Vec<Spawned> {
    c.pods
        .iter()
        .map(|p| p.start_echo(EP_PORT).expect("echo"))
        .collect()
}

pub fn sa(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}

/// One probe of `target` from `ns` with timeout `t`.
pub fn probe(ns: &Netns, proto: Proto, target: SocketAddr, t: Duration) -> ProbeResult {
    let before = super::traced::generation();
    let r = ns
        .probe_one(&Probe::new(proto, target).timeout(t))
        .expect("run kpng-probe");
    super::traced::check(ns, proto, target, std::slice::from_ref(&r), before);
    r
}

/// `n` probes of `target` from `ns`, each from a fresh socket (a new flow each).
pub fn probes(ns: &Netns, proto: Proto, target: SocketAddr, n: usize) -> Vec<ProbeResult> {
    let before = super::traced::generation();
    let results = ns
        .probe(
            &Probe::new(proto, target)
                .count(n)
                .fresh_socket(true)
                .timeout(OK_T),
        )
        .expect("run kpng-probe");
    super::traced::check(ns, proto, target, &results, before);
    results
}

/// `kpng-probe` running in the background (a probe of many attempts), its results read as it
/// prints them: for probing across an event that takes as long as it takes (a restart), rather
/// than for a number of attempts fixed beforehand. Stopped when dropped.
pub struct ProbeStream(Spawned);

impl ProbeStream {
    pub fn start(ns: &Netns, probe: &Probe) -> ProbeStream {
        let mut args = vec![
            bin_path("kpng-probe")
                .expect("kpng-probe")
                .display()
                .to_string(),
        ];
        args.extend(probe.args());
        ProbeStream(ns.spawn(&args).expect("start kpng-probe"))
    }

    /// The next attempt's result.
    #[track_caller]
    pub fn next(&mut self) -> ProbeResult {
        let line = self
            .0
            .wait_for_line(|l| !l.trim().is_empty(), Duration::from_secs(10))
            .expect("a probe result");
        ProbeResult::from_json_line(&line).expect("a probe result")
    }
}

/// `n` probes from fresh sockets, answers counted by server (`!timeout`, … for failures).
pub fn spread(ns: &Netns, proto: Proto, target: SocketAddr, n: usize) -> BTreeMap<String, usize> {
    tally(&probes(ns, proto, target, n))
}

/// The set of answering servers (and failure kinds) of a [`spread`].
pub fn names(m: &BTreeMap<String, usize>) -> BTreeSet<&str> {
    m.keys().map(String::as_str).collect()
}

pub fn set<'s>(v: &[&'s str]) -> BTreeSet<&'s str> {
    v.iter().copied().collect()
}

/// The addresses node1 masquerades to: its LAN address or its pod bridge address.
pub const NODE1_IPS: [IpAddr; 4] = [
    IpAddr::V4(addr::NODE1_LAN_V4),
    IpAddr::V4(addr::NODE1_POD_GW_V4),
    IpAddr::V6(addr::NODE1_LAN_V6),
    IpAddr::V6(addr::NODE1_POD_GW_V6),
];

/// Assert the probe was answered by one of `servers` and return the source address the
/// server saw.
#[track_caller]
pub fn answered(r: &ProbeResult, servers: &[&str]) -> IpAddr {
    assert_eq!(
        r.outcome,
        Outcome::Ok,
        "expected an answer from {servers:?}: {r}"
    );
    let name = r.server_name.as_deref().unwrap_or("?");
    assert!(
        servers.contains(&name),
        "expected an answer from {servers:?}, got {r}"
    );
    r.client_addr_seen_by_server
        .expect("echo reply names the client")
        .ip()
}

/// Assert the probe was answered by one of `servers`, which saw `client` (no SNAT) when the
/// backend keeps client addresses, else (a proxy) a node1 address.
#[track_caller]
pub fn assert_direct(b: Backend, r: &ProbeResult, servers: &[&str], client: IpAddr) {
    if !b.behaviour().keeps_client_address {
        return assert_masqueraded(r, servers);
    }
    let seen = answered(r, servers);
    assert_eq!(seen, client, "expected no masquerade: {r}");
}

/// Assert a probe from a pod of node1 (`client`) that kube-proxy masquerades was answered by
/// one of `servers`, which saw a node1 address; or `client` itself where the backend
/// translates node1's sockets at `connect()` (nothing to masquerade).
#[track_caller]
pub fn assert_pod_masqueraded(b: Backend, r: &ProbeResult, servers: &[&str], client: IpAddr) {
    if b.behaviour().translates_local_sockets {
        let seen = answered(r, servers);
        assert_eq!(
            seen, client,
            "translated at the socket, not masqueraded: {r}"
        );
    } else {
        assert_masqueraded(r, servers);
    }
}

/// Assert the probe was answered by one of `servers`, which saw a node1 address.
#[track_caller]
pub fn assert_masqueraded(r: &ProbeResult, servers: &[&str]) {
    let seen = answered(r, servers);
    assert!(
        NODE1_IPS.contains(&seen),
        "expected the source to be masqueraded to a node1 address: {r}"
    );
}

#[track_caller]
pub fn assert_outcome(r: &ProbeResult, expected: Outcome, what: &str) {
    assert_eq!(r.outcome, expected, "{what}: {r}");
}

/// REJECT as a node-originated client sees it: TCP gets ECONNREFUSED from the ICMP
/// error; for UDP the local `reject` verdict already fails `send()` with EPERM.
#[track_caller]
pub fn assert_rejected_locally(r: &ProbeResult, what: &str) {
    let eperm = r.outcome == Outcome::Error
        && r.message
            .as_deref()
            .is_some_and(|m| m.contains("Operation not permitted"));
    assert!(
        r.outcome == Outcome::Refused || eperm,
        "{what}: expected refused: {r}"
    );
}

/// Starts the line server (`scenarios::LINE_SERVER`, answers each line with the pod's name) in
/// `pod` on `EP_PORT` and waits until it listens: the far end of every held connection.
pub fn start_line_server(c: &Cluster, pod: &str) -> Spawned {
    let (v4, _, _) = pod_ips(pod);
    let mut server = c
        .pod(pod)
        .ns
        .spawn([
            "python3",
            "-c",
            super::scenarios::LINE_SERVER,
            pod,
            &v4.to_string(),
            &EP_PORT.to_string(),
        ])
        .expect("python3 line server");
    server
        .wait_for_line(|l| l == "ready", Duration::from_secs(10))
        .expect("line server ready");
    server
}

/// `kpng-fake-apiserver` inside a namespace, driven through its standard input (`apply FILE`,
/// `stop`, `restart`).
pub struct FakeServer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl FakeServer {
    /// Serves `manifest` in `ns` and writes a kubeconfig for it to `kubeconfig`.
    pub fn start(ns: &Netns, manifest: &Path, kubeconfig: &Path) -> FakeServer {
        let bin = bin_path("kpng-fake-apiserver").expect("kpng-fake-apiserver binary");
        let mut child = ns
            .command([bin.as_os_str(), "--manifest".as_ref(), manifest.as_os_str()])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start kpng-fake-apiserver");
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read");
        assert!(line.starts_with("listening http://127.0.0.1:"), "{line:?}");
        FakeServer {
            child,
            stdin,
            stdout,
        }
    }

    /// Sends one command; returns the answer line.
    pub fn command(&mut self, line: &str) -> String {
        writeln!(self.stdin, "{line}").expect("write command");
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).expect("read answer");
        assert!(answer.starts_with("ok"), "{line}: {answer}");
        answer
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
