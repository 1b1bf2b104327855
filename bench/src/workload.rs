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
/// The node-port range every kpng of the benchmark is started with (its
/// `--service-node-port-range`, the API server's flag of the same name): the workload gives
/// its NodePort and LoadBalancer Services node ports 20000-59999, 12,000 of them at 30k
/// Services, which kube's default 30000-32767 (2,768 ports) cannot hold; with the default,
/// kpng would leave most of them out (with a warning each) and the benchmark would measure a
/// smaller ruleset than its workload.
pub const NODE_PORT_RANGE: &str = "20000-59999";
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

/// This node (`node1`), as the workload's manifests declare it.
fn node_manifest() -> String {
    format!(
        "kind: Node\nmetadata: {{name: node1, labels: {{topology.kubernetes.io/zone: zone-a}}}}\nspec: {{podCIDRs: [10.244.0.0/24]}}\nstatus: {{addresses: [{{type: InternalIP, address: {NODE_IP}}}]}}\n"
    )
}

/// Writes the whole workload into `dir` (which must exist).
pub fn generate(dir: &Path, n: usize, m: usize, endpoints: Endpoints) -> std::io::Result<()> {
    std::fs::write(dir.join("node.yaml"), node_manifest())?;
    for i in 0..n {
        std::fs::write(
            dir.join(format!("s{i}.yaml")),
            service_manifest(i, m, endpoints, 0),
        )?;
    }
    Ok(())
}

/// [`generate`]'s manifests as JSON, one `kind: List` per file, as `kubectl get -o json`
/// prints them: the same objects, so that a start from this directory against one from the
/// YAML directory measures the format alone.
pub fn generate_json(dir: &Path, n: usize, m: usize, endpoints: Endpoints) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let write = |name: String, yaml: &str| -> Result<(), String> {
        let items = yaml
            .split("\n---\n")
            .map(serde_saphyr::from_str::<serde_json::Value>)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{name}: {e}"))?;
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
        let text = serde_json::to_string_pretty(&list).map_err(|e| format!("{name}: {e}"))?;
        std::fs::write(dir.join(&name), text).map_err(|e| format!("writing {name}: {e}"))
    };
    write("node.json".into(), &node_manifest())?;
    for i in 0..n {
        write(format!("s{i}.json"), &service_manifest(i, m, endpoints, 0))?;
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

/// The objects of Service `i` as the API server stores and returns them (JSON, as `kubectl get
/// -o json` shows them): the same Service and EndpointSlices as [`service_manifest`], with what
/// a real cluster adds around them: labels, the `kubectl.kubernetes.io/last-applied-configuration`
/// annotation, `managedFields` of the client that applied the Service and of the EndpointSlice
/// controller, owner references, defaulted fields, endpoint conditions, target references and
/// zones. The `kube` source's start-up is measured on these, so that it parses what it would
/// parse in a cluster, not a trimmed object.
pub fn service_objects(
    i: usize,
    m: usize,
    endpoints: Endpoints,
    generation: usize,
) -> Vec<serde_json::Value> {
    use serde_json::json;
    let time = "2026-01-01T00:00:00Z";
    let kind = match i % 10 {
        0..=5 => "ClusterIP",
        6 | 7 => "NodePort",
        _ => "LoadBalancer",
    };
    let dual = i % 10 == 3;
    let name = format!("s{i}");
    let ip = cluster_ip(i).to_string();
    let labels = json!({"app": name, "app.kubernetes.io/name": name,
        "app.kubernetes.io/part-of": "bench", "app.kubernetes.io/managed-by": "kubectl"});
    let mut port =
        json!({"name": "http", "port": 80, "protocol": "TCP", "targetPort": TARGET_PORT});
    if kind != "ClusterIP" {
        port["nodePort"] = (20000 + i % 40000).into();
    }
    // What the user applied (the last-applied annotation holds it).
    let mut applied_spec = json!({"type": kind, "selector": {"app": name}, "ports": [{"name": "http",
        "port": 80, "protocol": "TCP", "targetPort": TARGET_PORT}]});
    let mut spec = json!({
        "type": kind,
        "clusterIP": ip,
        "clusterIPs": [ip],
        "ipFamilies": ["IPv4"],
        "ipFamilyPolicy": "SingleStack",
        "internalTrafficPolicy": "Cluster",
        "ports": [port],
        "selector": {"app": name},
        "sessionAffinity": "None",
    });
    if dual {
        let v6 = format!("fd00:96::{:x}:{:x}", (i + 1) >> 16, (i + 1) & 0xffff);
        spec["clusterIPs"] = json!([ip, v6]);
        spec["ipFamilies"] = json!(["IPv4", "IPv6"]);
        spec["ipFamilyPolicy"] = "RequireDualStack".into();
        applied_spec["ipFamilyPolicy"] = "RequireDualStack".into();
    }
    if kind != "ClusterIP" {
        spec["externalTrafficPolicy"] = "Cluster".into();
    }
    if kind == "LoadBalancer" {
        spec["allocateLoadBalancerNodePorts"] = true.into();
        if i % 20 == 9 {
            spec["externalTrafficPolicy"] = "Local".into();
            spec["healthCheckNodePort"] = (20000 + i % 30000).into();
            applied_spec["externalTrafficPolicy"] = "Local".into();
        }
    }
    if i % 20 == 1 {
        spec["sessionAffinity"] = "ClientIP".into();
        spec["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": 10800}});
        applied_spec["sessionAffinity"] = "ClientIP".into();
    }
    let status = if kind == "LoadBalancer" {
        let lb = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) + i as u32 + 1);
        json!({"loadBalancer": {"ingress": [{"ip": lb.to_string(), "ipMode": "VIP"}]}})
    } else {
        json!({"loadBalancer": {}})
    };
    let applied = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"annotations": {},
        "labels": labels, "name": name, "namespace": "bench"}, "spec": applied_spec});
    let service_fields = json!({
        "f:metadata": {"f:annotations": {".": {}, "f:kubectl.kubernetes.io/last-applied-configuration": {}},
            "f:labels": {".": {}, "f:app": {}, "f:app.kubernetes.io/managed-by": {},
                "f:app.kubernetes.io/name": {}, "f:app.kubernetes.io/part-of": {}}},
        "f:spec": {"f:internalTrafficPolicy": {}, "f:ports": {".": {},
            "k:{\"port\":80,\"protocol\":\"TCP\"}": {".": {}, "f:name": {}, "f:port": {},
                "f:protocol": {}, "f:targetPort": {}}},
            "f:selector": {}, "f:sessionAffinity": {}, "f:type": {}}});
    let mut objects = vec![json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": "bench",
            "labels": labels,
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration":
                format!("{applied}\n")},
            "managedFields": [{"manager": "kubectl-client-side-apply", "operation": "Update",
                "apiVersion": "v1", "time": time, "fieldsType": "FieldsV1",
                "fieldsV1": service_fields}],
        },
        "spec": spec,
        "status": status,
    })];
    let service_uid = format!("5e7a1ce0-0000-4000-8000-{i:012}");
    let families: &[&str] = if dual { &["IPv4", "IPv6"] } else { &["IPv4"] };
    for family in families {
        let v6 = *family == "IPv6";
        let eps: Vec<serde_json::Value> = (0..m)
            .map(|j| {
                let address = if v6 {
                    let idx = i * m + j + 1;
                    format!("fd00:244::{:x}:{:x}", idx >> 16, idx & 0xffff)
                } else {
                    match endpoints {
                        Endpoints::Unique | Endpoints::Spread(_) => endpoint_ip(
                            i * m
                                + j
                                + if j == 0 {
                                    generation % 2 * 7_000_000
                                } else {
                                    0
                                },
                        ),
                        Endpoints::Local4 => {
                            local_endpoint(j + if j == 0 { generation % 2 } else { 0 })
                        }
                    }
                    .to_string()
                };
                json!({
                    "addresses": [address],
                    "conditions": {"ready": true, "serving": true, "terminating": false},
                    "nodeName": format!("node{}", endpoints.node(i, j, m)),
                    "targetRef": {"kind": "Pod", "namespace": "bench",
                        "name": format!("s{i}-7d9f8c6b5-{j:05}"),
                        "uid": format!("90d00000-0000-4000-8000-{:012}", i * m + j)},
                    "zone": "zone-a",
                })
            })
            .collect();
        let suffix = if v6 { "v6" } else { "v4" };
        objects.push(json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": format!("s{i}-{suffix}"),
                "generateName": format!("s{i}-"),
                "namespace": "bench",
                "generation": 1 + generation,
                "labels": {"app": name, "app.kubernetes.io/name": name,
                    "app.kubernetes.io/part-of": "bench", "app.kubernetes.io/managed-by": "kubectl",
                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                    "kubernetes.io/service-name": name},
                "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": time},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": name,
                    "uid": service_uid, "controller": true, "blockOwnerDeletion": true}],
                "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                    "apiVersion": "discovery.k8s.io/v1", "time": time, "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:addressType": {}, "f:endpoints": {},
                        "f:metadata": {"f:annotations": {".": {},
                            "f:endpoints.kubernetes.io/last-change-trigger-time": {}},
                            "f:generateName": {}, "f:labels": {".": {}, "f:app": {},
                                "f:app.kubernetes.io/managed-by": {}, "f:app.kubernetes.io/name": {},
                                "f:app.kubernetes.io/part-of": {},
                                "f:endpointslice.kubernetes.io/managed-by": {},
                                "f:kubernetes.io/service-name": {}},
                            "f:ownerReferences": {".": {},
                                format!("k:{{\"uid\":\"{service_uid}\"}}"): {}}},
                        "f:ports": {}}}],
            },
            "addressType": family,
            "endpoints": eps,
            "ports": [{"name": "http", "port": TARGET_PORT, "protocol": "TCP"}],
        }));
    }
    objects
}

/// The Node `name` as the API server returns it (labels, addresses, pod CIDRs).
pub fn node_object(name: &str, ip: &str, pod_cidr: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux", "topology.kubernetes.io/zone": "zone-a"}},
        "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]},
        "status": {"addresses": [{"type": "InternalIP", "address": ip},
            {"type": "Hostname", "address": name}]},
    })
}
