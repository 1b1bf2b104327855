//! Workload generation: N Services × M endpoints as a directory of Kubernetes manifests
//! (one file per Service with its EndpointSlices, plus the Node), a realistic mix of types.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::Path;

/// Where endpoints live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoints {
    /// A unique pod IP per endpoint, spread over ten nodes (control-plane benchmarks).
    Unique,
    /// The same four local addresses for every Service (data-plane benchmarks: every endpoint
    /// answers, whatever Service is probed).
    Local4,
    /// Unique pod IPs spread over this many nodes (`node0`…): the API benchmark, where every
    /// simulated node hosts some endpoints.
    Spread(usize),
}

impl Endpoints {
    /// The node of endpoint `j` of Service `i`.
    fn node(self, i: usize, j: usize, m: usize) -> usize {
        match self {
            Endpoints::Spread(nodes) => (i * m + j) % nodes.max(1),
            _ => (i + j) % 10,
        }
    }
}

/// The node the benchmark's kpng runs as.
pub const NODE_IP: &str = "192.168.200.1";
/// The port endpoints listen on.
pub const TARGET_PORT: u16 = 8080;

/// The ClusterIP of Service `i` (10.96.0.0/12).
pub fn cluster_ip(i: usize) -> Ipv4Addr {
    let n = (i + 1) as u32;
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 0)) + n)
}

/// The address of endpoint number `idx` of the [`Endpoints::Unique`] workload.
pub fn endpoint_ip(idx: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + idx as u32 + 1)
}

/// The local endpoint addresses used with [`Endpoints::Local4`].
pub fn local_endpoint(j: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, 0, (j % 4 + 1) as u8)
}

/// The manifest of Service `i` (Service + EndpointSlices). `generation` changes endpoint 0's
/// address so that a rewrite is an endpoint change.
pub fn service_manifest(i: usize, m: usize, endpoints: Endpoints, generation: usize) -> String {
    // Mix: 60% ClusterIP, 20% NodePort, 20% LoadBalancer; LBs alternate eTP Local; 5% affinity;
    // 10% dual-stack.
    let kind = match i % 10 {
        0..=5 => "ClusterIP",
        6 | 7 => "NodePort",
        _ => "LoadBalancer",
    };
    let dual = i % 10 == 3;
    let mut y = String::new();
    let _ = write!(
        y,
        "kind: Service\nmetadata: {{namespace: bench, name: s{i}}}\nspec:\n  type: {kind}\n"
    );
    let _ = writeln!(y, "  clusterIP: {}", cluster_ip(i));
    if dual {
        let _ = writeln!(
            y,
            "  clusterIPs: [{}, \"fd00:96::{:x}:{:x}\"]",
            cluster_ip(i),
            (i + 1) >> 16,
            (i + 1) & 0xffff
        );
    }
    if kind == "LoadBalancer" && i % 20 == 9 {
        let _ = writeln!(
            y,
            "  externalTrafficPolicy: Local\n  healthCheckNodePort: {}",
            20000 + i % 30000
        );
    }
    if i % 20 == 1 {
        y.push_str("  sessionAffinity: ClientIP\n");
    }
    let node_port = if kind == "ClusterIP" {
        String::new()
    } else {
        format!(", nodePort: {}", 20000 + i % 40000)
    };
    let _ = writeln!(
        y,
        "  ports: [{{name: http, port: 80, protocol: TCP{node_port}}}]"
    );
    if kind == "LoadBalancer" {
        let lb = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) + i as u32 + 1);
        let _ = writeln!(y, "status: {{loadBalancer: {{ingress: [{{ip: {lb}}}]}}}}");
    }
    let _ = write!(
        y,
        "---\nkind: EndpointSlice\nmetadata: {{namespace: bench, name: s{i}-v4, labels: {{kubernetes.io/service-name: s{i}}}}}\naddressType: IPv4\nports: [{{name: http, port: {TARGET_PORT}, protocol: TCP}}]\nendpoints:\n"
    );
    for j in 0..m {
        let ip = match endpoints {
            Endpoints::Unique | Endpoints::Spread(_) => endpoint_ip(
                i * m
                    + j
                    + if j == 0 {
                        generation % 2 * 7_000_000
                    } else {
                        0
                    },
            ),
            Endpoints::Local4 => local_endpoint(j + if j == 0 { generation % 2 } else { 0 }),
        };
        let _ = writeln!(
            y,
            "- {{addresses: [{ip}], nodeName: node{}}}",
            endpoints.node(i, j, m)
        );
    }
    if dual {
        let _ = write!(
            y,
            "---\nkind: EndpointSlice\nmetadata: {{namespace: bench, name: s{i}-v6, labels: {{kubernetes.io/service-name: s{i}}}}}\naddressType: IPv6\nports: [{{name: http, port: {TARGET_PORT}, protocol: TCP}}]\nendpoints:\n"
        );
        for j in 0..m {
            let idx = i * m + j + 1;
            let _ = writeln!(
                y,
                "- {{addresses: [\"fd00:244::{:x}:{:x}\"], nodeName: node{}}}",
                idx >> 16,
                idx & 0xffff,
                endpoints.node(i, j, m)
            );
        }
    }
    y
}

/// Writes the whole workload into `dir` (which must exist).
pub fn generate(dir: &Path, n: usize, m: usize, endpoints: Endpoints) -> std::io::Result<()> {
    std::fs::write(
        dir.join("node.yaml"),
        format!(
            "kind: Node\nmetadata: {{name: node1, labels: {{topology.kubernetes.io/zone: zone-a}}}}\nspec: {{podCIDRs: [10.244.0.0/24]}}\nstatus: {{addresses: [{{type: InternalIP, address: {NODE_IP}}}]}}\n"
        ),
    )?;
    for i in 0..n {
        std::fs::write(
            dir.join(format!("s{i}.yaml")),
            service_manifest(i, m, endpoints, 0),
        )?;
    }
    Ok(())
}

/// Rewrites Service `i`'s file atomically (temp file + rename: one inotify event, never a
/// half-written read).
pub fn rewrite(
    dir: &Path,
    i: usize,
    m: usize,
    endpoints: Endpoints,
    generation: usize,
) -> std::io::Result<()> {
    let tmp = dir.join(format!(".s{i}.tmp"));
    std::fs::write(&tmp, service_manifest(i, m, endpoints, generation))?;
    std::fs::rename(&tmp, dir.join(format!("s{i}.yaml")))
}

/// The last Service (highest index) that is a plain single-stack ClusterIP without affinity: the
/// data-plane target, the worst case for any linear structure.
pub fn last_plain_service(n: usize) -> usize {
    (0..n)
        .rev()
        .find(|i| i % 10 <= 5 && i % 10 != 3 && i % 20 != 1)
        .unwrap_or(0)
}
