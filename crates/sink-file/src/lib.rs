//! The `to-file` sink: writes the node-local model as readable YAML in a stable order.
//!
//! The output is what this node must do, in one page: every Service port per family with its
//! VIPs and the endpoints each traffic policy selects. It is rewritten atomically after every
//! change (write to a temporary file in the same directory, then rename), so a reader never sees
//! half a file. With `-` it prints one YAML document per sync to standard output. The same
//! rendering is the golden format of the model's tests.
//!
//! Rendering is O(Service ports) per sync: this sink is for humans and tests, not for scale.

use std::io::Write;
use std::path::PathBuf;

use kpng_backend::{Backend, BackendError, SyncRequest, SyncStats};
use kpng_model::{Endpoint, NodeState, ServicePort, Snapshot};
use serde::Serialize;

/// Where the sink writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Standard output, one `---`-separated document per sync.
    Stdout,
    /// A file, replaced atomically on every sync.
    File(PathBuf),
}

impl Output {
    /// Parses the `--output` flag: `-` is standard output.
    pub fn parse(s: &str) -> Output {
        if s == "-" {
            Output::Stdout
        } else {
            Output::File(PathBuf::from(s))
        }
    }
}

/// The `to-file` sink.
#[derive(Debug)]
pub struct FileSink {
    output: Output,
    last: Option<String>,
}

impl FileSink {
    /// A sink writing to `output`.
    pub fn new(output: Output) -> FileSink {
        FileSink { output, last: None }
    }
}

impl Backend for FileSink {
    fn name(&self) -> &'static str {
        "file"
    }

    /// The dump's `node:` block shows whether the Node is known and eligible.
    fn shows_node_status(&self) -> bool {
        true
    }

    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncStats, BackendError> {
        let text = render(request.snapshot)
            .map_err(|e| BackendError::Other(format!("rendering YAML: {e}")))?;
        if self.last.as_deref() == Some(text.as_str()) {
            return Ok(SyncStats {
                operations: 0,
                ..SyncStats::default()
            });
        }
        match &self.output {
            Output::Stdout => {
                let mut out = std::io::stdout().lock();
                write!(out, "---\n{text}")
                    .and_then(|_| out.flush())
                    .map_err(|source| BackendError::Io {
                        context: "writing to standard output".into(),
                        source,
                    })?;
            }
            Output::File(path) => write_atomically(path, &text)?,
        }
        self.last = Some(text);
        Ok(SyncStats {
            operations: 1,
            ..SyncStats::default()
        })
    }
}

/// Writes `text` to `path`: a regular file is replaced atomically (a reader never sees half a
/// dump); a symlink is followed to its file; anything else (`/dev/stdout`, `/dev/null`, a FIFO)
/// is written in place, since renaming a file over it would replace the device node itself.
fn write_atomically(path: &std::path::Path, text: &str) -> Result<(), BackendError> {
    let io = |context: String| move |source| BackendError::Io { context, source };
    if let Ok(meta) = std::fs::metadata(path) {
        if !meta.is_file() {
            let mut out = std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(path)
                .map_err(io(format!("opening {}", path.display())))?;
            return out
                .write_all(text.as_bytes())
                .map_err(io(format!("writing {}", path.display())));
        }
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
            let target = std::fs::canonicalize(path)
                .map_err(io(format!("resolving the symlink {}", path.display())))?;
            return write_atomically(&target, text);
        }
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(&dir).map_err(io(format!(
        "creating a temporary file in {}",
        dir.display()
    )))?;
    tmp.write_all(text.as_bytes())
        .map_err(io(format!("writing {}", tmp.path().display())))?;
    tmp.persist(path).map_err(|e| BackendError::Io {
        context: format!("replacing {}", path.display()),
        source: e.error,
    })?;
    Ok(())
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NodeView<'a> {
    name: &'a str,
    known: bool,
    eligible: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    ips: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    zone: Option<&'a str>,
    #[serde(rename = "podCIDRs", skip_serializing_if = "Vec::is_empty")]
    pod_cidrs: Vec<String>,
    /// No node IP is known after the wait for one: NodePorts (`--nodeport-addresses primary`)
    /// are served on every local address. Shown only when set, so other dumps are unchanged.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    node_ports_on_all_local: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PortView<'a> {
    service: String,
    port_name: &'a str,
    protocol: &'static str,
    family: &'static str,
    #[serde(rename = "clusterIP")]
    cluster_ip: String,
    port: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    node_port: Option<u16>,
    #[serde(rename = "externalIPs", skip_serializing_if = "Vec::is_empty")]
    external_ips: Vec<String>,
    #[serde(rename = "loadBalancerIPs", skip_serializing_if = "Vec::is_empty")]
    load_balancer_ips: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    load_balancer_source_ranges: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session_affinity_timeout_seconds: Option<u32>,
    external_traffic_policy: &'static str,
    internal_traffic_policy: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    health_check_node_port: Option<u16>,
    /// Only shown when set, so the output of Services without the annotation is unchanged.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    preserve_destination: bool,
    has_any_endpoints: bool,
    local_ready_endpoints: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster_endpoints: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    local_endpoints: Option<Vec<String>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SnapshotView<'a> {
    node: NodeView<'a>,
    #[serde(rename = "serviceCIDRs", skip_serializing_if = "Vec::is_empty")]
    service_cidrs: Vec<String>,
    /// Rendered apart when there are any (see [`render`]): `None` here then.
    #[serde(skip_serializing_if = "Option::is_none")]
    service_ports: Option<&'a [PortView<'a>]>,
}

fn strings<T: ToString>(items: &[T]) -> Vec<String> {
    items.iter().map(ToString::to_string).collect()
}

/// `10.244.1.2:8080`, with ` local` / ` terminating` when they apply.
fn endpoint_label(e: &Endpoint) -> String {
    let mut s = e.addr().to_string();
    if e.is_local {
        s.push_str(" local");
    }
    if e.terminating {
        s.push_str(" terminating");
    }
    s
}

fn policy(local: bool) -> &'static str {
    if local { "Local" } else { "Cluster" }
}

/// Every field of [`ServicePort`] is named (no `..`): a field added to the model does not build
/// until it is written here or said not to need to be.
fn port_view(p: &ServicePort) -> PortView<'_> {
    let eps = |v: &[Endpoint]| v.iter().map(endpoint_label).collect::<Vec<_>>();
    let ServicePort {
        key,
        cluster_ip,
        port,
        node_port,
        // Not programmed: each endpoint's own port (shown with it) is the DNAT target.
        target_port: _,
        external_ips,
        load_balancer_ips,
        source_ranges,
        session_affinity,
        external_policy_local,
        internal_policy_local,
        health_check_node_port,
        preserve_destination,
        cluster_endpoints,
        local_endpoints,
        has_any_endpoints,
        local_ready_endpoints,
        // Not programmed: only conntrack clean-up reads them (endpoints no longer serving).
        serving_endpoints: _,
    } = p;
    PortView {
        service: key.service.to_string(),
        port_name: &key.port_name,
        protocol: key.protocol.as_str(),
        family: key.family.label(),
        cluster_ip: cluster_ip.to_string(),
        port: *port,
        node_port: *node_port,
        external_ips: strings(external_ips),
        load_balancer_ips: strings(load_balancer_ips),
        load_balancer_source_ranges: strings(source_ranges),
        session_affinity_timeout_seconds: session_affinity.map(|a| a.timeout_seconds),
        external_traffic_policy: policy(*external_policy_local),
        internal_traffic_policy: policy(*internal_policy_local),
        health_check_node_port: *health_check_node_port,
        preserve_destination: *preserve_destination,
        has_any_endpoints: *has_any_endpoints,
        local_ready_endpoints: *local_ready_endpoints,
        cluster_endpoints: p.uses_cluster_endpoints().then(|| eps(cluster_endpoints)),
        local_endpoints: p.uses_local_endpoints().then(|| eps(local_endpoints)),
    }
}

/// The `node:` block. Every field of [`NodeState`] is named (no `..`), as for [`port_view`].
fn node_view(node: &NodeState) -> NodeView<'_> {
    let NodeState {
        name,
        known,
        ips,
        zone,
        pod_cidrs,
        // Shown through `eligible`.
        deleting: _,
        to_be_deleted: _,
        // Status only (why the values are what they are), for `kpng status`: the dump shows
        // what the node programs.
        ever_known: _,
        ips_kept: _,
        pod_cidrs_kept: _,
        nodeports_on_all_local,
    } = node;
    NodeView {
        name,
        known: *known,
        eligible: node.eligible(),
        ips: strings(ips),
        zone: zone.as_deref(),
        pod_cidrs: strings(pod_cidrs),
        node_ports_on_all_local: *nodeports_on_all_local,
    }
}

/// Below this many Service ports one thread renders them all.
const PORTS_PER_THREAD_AT_LEAST: usize = 2048;

/// Renders a snapshot as the `to-file` YAML.
///
/// The `servicePorts` sequence is the whole cost at scale (tens of thousands of ports), so
/// it is rendered in slices on every CPU and the slices are joined: a sequence under a
/// top-level key is written at column 0 (`- service: …`), exactly as a sequence of its own,
/// so the joined text is the text one pass would write.
pub fn render(snapshot: &Snapshot) -> Result<String, serde_saphyr::SerializeError> {
    let node = &snapshot.node;
    let ports: Vec<PortView<'_>> = snapshot.ports.values().map(|p| port_view(p)).collect();
    let view = SnapshotView {
        node: node_view(node),
        service_cidrs: strings(&snapshot.service_cidrs),
        // Written in this pass when empty (`servicePorts: []`), below otherwise.
        service_ports: ports.is_empty().then_some(&[]),
    };
    let mut text = serde_saphyr::to_string(&view)?;
    if !text.ends_with('\n') {
        text.push('\n');
    }
    if ports.is_empty() {
        return Ok(text);
    }
    text.push_str("servicePorts:\n");
    // The CPU count reads cgroup files: asked only when there is enough to share.
    let threads = if ports.len() < 2 * PORTS_PER_THREAD_AT_LEAST {
        1
    } else {
        std::thread::available_parallelism()
            .map_or(1, usize::from)
            .min(ports.len() / PORTS_PER_THREAD_AT_LEAST)
            .max(1)
    };
    let share = ports.len().div_ceil(threads);
    let parts: Vec<Result<String, serde_saphyr::SerializeError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = ports
            .chunks(share)
            .map(|part| scope.spawn(move || serde_saphyr::to_string(&part)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    for part in parts {
        let part = part?;
        text.push_str(&part);
        if !text.ends_with('\n') {
            text.push('\n');
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::write_atomically;

    /// A symlinked output keeps its symlink (its file gets the dump), and a path that is not a
    /// regular file is written in place, never replaced: `--output /dev/stdout` or `/dev/null`
    /// once replaced the device node with a file.
    #[cfg(unix)]
    #[test]
    fn an_output_that_is_not_a_regular_file_is_written_not_replaced() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("dump.yaml");
        std::fs::write(&file, "old").expect("write");
        let link = dir.path().join("link.yaml");
        std::os::unix::fs::symlink(&file, &link).expect("symlink");
        write_atomically(&link, "new").expect("write through the link");
        assert!(
            std::fs::symlink_metadata(&link)
                .expect("link")
                .file_type()
                .is_symlink()
        );
        assert_eq!(std::fs::read_to_string(&file).expect("read"), "new");
        // A directory path is not replaced either: writing into it fails.
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).expect("mkdir");
        assert!(write_atomically(&sub, "x").is_err());
        assert!(sub.is_dir());
    }

    use super::*;
    use kpng_model::{Family, NodeState, PortKey, Protocol, ServiceKey};

    use std::sync::Arc;

    fn port(i: u32) -> ServicePort {
        let ip = |n: u32| std::net::IpAddr::from(std::net::Ipv4Addr::from(n));
        ServicePort {
            key: PortKey {
                service: ServiceKey::new("ns", format!("s{i:06}").as_str()),
                port_name: "http".into(),
                protocol: Protocol::Tcp,
                family: Family::V4,
            },
            cluster_ip: ip(0x0a60_0000 + i),
            port: 80,
            node_port: i.is_multiple_of(3).then_some(30000),
            target_port: kpng_model::TargetPort::Number(80),
            external_ips: Vec::new(),
            load_balancer_ips: if i.is_multiple_of(5) {
                vec![ip(0xc612_0000 + i)]
            } else {
                Vec::new()
            },
            source_ranges: Vec::new(),
            session_affinity: None,
            external_policy_local: i.is_multiple_of(7),
            internal_policy_local: false,
            health_check_node_port: None,
            preserve_destination: false,
            cluster_endpoints: (0..3)
                .map(|j| Endpoint {
                    ip: ip(0x0a80_0000 + i * 4 + j),
                    port: 8080,
                    is_local: j == 1,
                    ready: true,
                    serving: true,
                    terminating: j == 2,
                })
                .collect(),
            local_endpoints: Vec::new(),
            has_any_endpoints: true,
            local_ready_endpoints: 1,
            serving_endpoints: Vec::new(),
        }
    }

    /// The rendering in slices on several threads writes exactly what one pass writes, for
    /// no port, a few, and more than one thread's share.
    #[test]
    fn split_rendering_equals_one_pass() {
        for count in [0u32, 3, 5000] {
            let mut snapshot = Snapshot {
                node: NodeState {
                    name: "node1".into(),
                    ..NodeState::default()
                },
                ..Snapshot::default()
            };
            for i in 0..count {
                let p = port(i);
                snapshot.ports.insert(p.key.clone(), Arc::new(p));
            }
            let ports: Vec<PortView<'_>> = snapshot.ports.values().map(|p| port_view(p)).collect();
            let one_pass = SnapshotView {
                node: NodeView {
                    name: "node1",
                    known: false,
                    eligible: snapshot.node.eligible(),
                    ips: Vec::new(),
                    zone: None,
                    pod_cidrs: Vec::new(),
                    node_ports_on_all_local: false,
                },
                service_cidrs: Vec::new(),
                service_ports: Some(&ports),
            };
            let mut expected = serde_saphyr::to_string(&one_pass).expect("one pass");
            if !expected.ends_with('\n') {
                expected.push('\n');
            }
            assert_eq!(
                render(&snapshot).expect("render"),
                expected,
                "{count} ports"
            );
        }
    }
}

#[cfg(test)]
mod node_tests {
    use super::render;
    use kpng_model::{NodeState, Snapshot};

    /// Whether NodePorts go to every local address is what the node programs (no node IP
    /// known after the wait): the dump says so, and says nothing when they do not.
    #[test]
    fn the_node_block_shows_nodeports_on_every_local_address() {
        for all_local in [false, true] {
            let snapshot = Snapshot {
                node: NodeState {
                    name: "node1".into(),
                    nodeports_on_all_local: all_local,
                    ..NodeState::default()
                },
                ..Snapshot::default()
            };
            let text = render(&snapshot).expect("render");
            assert_eq!(text.contains("nodePortsOnAllLocal"), all_local, "{text}");
            assert_eq!(
                text.contains("\n  nodePortsOnAllLocal: true\n"),
                all_local,
                "{text}"
            );
        }
    }
}
