//! The standard two-node test cluster (see the crate documentation for a picture).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::thread;

use crate::error::{Error, Result};
use crate::netns::{Netns, Spawned};

/// Every address of the standard topology, as constants, so tests can name them
/// without a [`Cluster`] at hand (e.g. in expected nftables output).
pub mod addr {
    use std::net::{Ipv4Addr, Ipv6Addr};

    /// Prefix length of the LAN (`192.168.100.0/24`).
    pub const LAN_PREFIX_V4: u8 = 24;
    /// Prefix length of the LAN (`fd00:100::/64`).
    pub const LAN_PREFIX_V6: u8 = 64;
    /// node1's LAN address.
    pub const NODE1_LAN_V4: Ipv4Addr = Ipv4Addr::new(192, 168, 100, 1);
    /// node1's LAN address.
    pub const NODE1_LAN_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x100, 0, 0, 0, 0, 0, 1);
    /// node2's LAN address.
    pub const NODE2_LAN_V4: Ipv4Addr = Ipv4Addr::new(192, 168, 100, 2);
    /// node2's LAN address.
    pub const NODE2_LAN_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x100, 0, 0, 0, 0, 0, 2);
    /// The external client's LAN address (also the nodes' default gateway).
    pub const EXT_V4: Ipv4Addr = Ipv4Addr::new(192, 168, 100, 10);
    /// The external client's LAN address (also the nodes' default gateway).
    pub const EXT_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x100, 0, 0, 0, 0, 0, 0x10);

    /// node1's pod CIDR.
    pub const NODE1_POD_CIDR_V4: &str = "10.244.1.0/24";
    /// node1's pod CIDR.
    pub const NODE1_POD_CIDR_V6: &str = "fd00:244:1::/64";
    /// node2's pod CIDR.
    pub const NODE2_POD_CIDR_V4: &str = "10.244.2.0/24";
    /// node2's pod CIDR.
    pub const NODE2_POD_CIDR_V6: &str = "fd00:244:2::/64";
    /// The whole cluster's pod CIDR (both nodes' pod CIDRs), as a proxy's
    /// `clusterCIDR` setting would name it.
    pub const CLUSTER_CIDR_V4: &str = "10.244.0.0/16";
    /// The whole cluster's pod CIDR.
    pub const CLUSTER_CIDR_V6: &str = "fd00:244::/32";
    /// node1's bridge (`cbr0`) address: its pods' default gateway.
    pub const NODE1_POD_GW_V4: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 1);
    /// node1's bridge (`cbr0`) address: its pods' default gateway.
    pub const NODE1_POD_GW_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 1, 0, 0, 0, 0, 1);
    /// node2's bridge (`cbr0`) address: its pods' default gateway.
    pub const NODE2_POD_GW_V4: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 1);
    /// node2's bridge (`cbr0`) address: its pods' default gateway.
    pub const NODE2_POD_GW_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 2, 0, 0, 0, 0, 1);
    /// Prefix length of a node's pod CIDR (IPv4).
    pub const POD_PREFIX_V4: u8 = 24;
    /// Prefix length of a node's pod CIDR (IPv6).
    pub const POD_PREFIX_V6: u8 = 64;

    /// Pod `pod1a` on node1.
    pub const POD1A_V4: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
    /// Pod `pod1a` on node1.
    pub const POD1A_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 1, 0, 0, 0, 0, 2);
    /// Pod `pod1b` on node1.
    pub const POD1B_V4: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 3);
    /// Pod `pod1b` on node1.
    pub const POD1B_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 1, 0, 0, 0, 0, 3);
    /// Pod `pod2a` on node2.
    pub const POD2A_V4: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 2);
    /// Pod `pod2a` on node2.
    pub const POD2A_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 2, 0, 0, 0, 0, 2);

    /// node3's LAN address (three-node clusters only, see [`super::ClusterBuilder::three_nodes`]).
    pub const NODE3_LAN_V4: Ipv4Addr = Ipv4Addr::new(192, 168, 100, 3);
    /// node3's LAN address.
    pub const NODE3_LAN_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x100, 0, 0, 0, 0, 0, 3);
    /// node3's pod CIDR.
    pub const NODE3_POD_CIDR_V4: &str = "10.244.3.0/24";
    /// node3's pod CIDR.
    pub const NODE3_POD_CIDR_V6: &str = "fd00:244:3::/64";
    /// node3's bridge (`cbr0`) address.
    pub const NODE3_POD_GW_V4: Ipv4Addr = Ipv4Addr::new(10, 244, 3, 1);
    /// node3's bridge (`cbr0`) address.
    pub const NODE3_POD_GW_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 3, 0, 0, 0, 0, 1);
    /// Pod `pod3a` on node3.
    pub const POD3A_V4: Ipv4Addr = Ipv4Addr::new(10, 244, 3, 2);
    /// Pod `pod3a` on node3.
    pub const POD3A_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 3, 0, 0, 0, 0, 2);

    /// Conventional Service (ClusterIP) range for tests. Nothing in the topology
    /// routes it specially: `ext` sends it (like everything) to its gateway node,
    /// nodes and pods send it along their default routes.
    pub const SERVICE_CIDR_V4: &str = "10.96.0.0/16";
    /// Conventional Service (ClusterIP) range for tests (IPv6).
    pub const SERVICE_CIDR_V6: &str = "fd00:96::/112";
}

/// Which node, for choices such as [`ClusterBuilder::ext_gateway`] and [`Pod::node`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NodeId {
    /// The first node (LAN `.1`, pods `10.244.1.0/24`).
    Node1,
    /// The second node (LAN `.2`, pods `10.244.2.0/24`).
    Node2,
    /// The third node of a three-node cluster (LAN `.3`, pods `10.244.3.0/24`).
    Node3,
}

impl NodeId {
    /// `"node1"` or `"node2"`, the name used in the topology and in namespace names.
    pub fn name(self) -> &'static str {
        match self {
            NodeId::Node1 => "node1",
            NodeId::Node2 => "node2",
            NodeId::Node3 => "node3",
        }
    }
}

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A node: the namespace where a proxy under test programs nftables.
#[derive(Debug)]
pub struct Node {
    /// The node's namespace (interfaces `eth0` to the LAN, bridge `cbr0` to its pods).
    pub ns: Netns,
    /// Which node this is.
    pub id: NodeId,
    /// Address on the LAN (`eth0`): what NodePorts are reached on from outside.
    pub lan_ipv4: Ipv4Addr,
    /// Address on the LAN (`eth0`).
    pub lan_ipv6: Ipv6Addr,
    /// Address of `cbr0`: its pods' default gateway.
    pub pod_gateway_v4: Ipv4Addr,
    /// Address of `cbr0`: its pods' default gateway.
    pub pod_gateway_v6: Ipv6Addr,
    /// The node's pod CIDR, e.g. `10.244.1.0/24`.
    pub pod_cidr_v4: &'static str,
    /// The node's pod CIDR, e.g. `fd00:244:1::/64`.
    pub pod_cidr_v6: &'static str,
}

impl Node {
    /// The node's LAN address of the given family.
    pub fn lan_ip(&self, v6: bool) -> IpAddr {
        if v6 {
            self.lan_ipv6.into()
        } else {
            self.lan_ipv4.into()
        }
    }
}

/// A plain host on the LAN (the external client `ext`).
#[derive(Debug)]
pub struct Host {
    /// The host's namespace (interface `eth0`).
    pub ns: Netns,
    /// Address on the LAN.
    pub ipv4: Ipv4Addr,
    /// Address on the LAN.
    pub ipv6: Ipv6Addr,
    /// The node its default routes point at.
    pub gateway: NodeId,
}

/// A pod: its own namespace with one interface `eth0`, a veth into its node's `cbr0`.
#[derive(Debug)]
pub struct Pod {
    /// The pod's namespace.
    pub ns: Netns,
    /// `pod1a`, `pod1b` or `pod2a`; also the name its echo server answers with.
    pub name: &'static str,
    /// The pod IP.
    pub ipv4: Ipv4Addr,
    /// The pod IP.
    pub ipv6: Ipv6Addr,
    /// The node it runs on.
    pub node: NodeId,
}

impl Pod {
    /// Start `kpng-echo` in the pod, named after the pod, listening on TCP and UDP
    /// `port` on both pod IPs. It is ready when this returns; it stops when the
    /// returned guard is dropped.
    pub fn start_echo(&self, port: u16) -> Result<Spawned> {
        let addrs = [self.addr_v4(port), self.addr_v6(port)];
        self.ns.spawn_echo(self.name, &addrs, &addrs)
    }

    /// `IPV4:port`.
    pub fn addr_v4(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.ipv4.into(), port)
    }

    /// `[IPV6]:port`.
    pub fn addr_v6(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.ipv6.into(), port)
    }

    /// The pod IP of the given family.
    pub fn ip(&self, v6: bool) -> IpAddr {
        if v6 {
            self.ipv6.into()
        } else {
            self.ipv4.into()
        }
    }
}

/// The standard test cluster: LAN, two nodes, three pods and an external client.
///
/// It exists so that every real-packet test starts from the same, documented
/// topology (see the crate documentation) in its own namespaces. Dropping it deletes
/// all of them, and with them every interface and process inside.
#[derive(Debug)]
pub struct Cluster {
    /// `pod1a`, `pod1b` (node1) and `pod2a` (node2), in that order.
    pub pods: Vec<Pod>,
    /// The external client.
    pub ext: Host,
    /// The first node.
    pub node1: Node,
    /// The second node.
    pub node2: Node,
    /// The third node, in a cluster built with [`ClusterBuilder::three_nodes`].
    pub node3: Option<Node>,
    /// The LAN switch namespace (bridge `br0`); nothing to do there for most tests.
    pub lan: Netns,
}

impl Cluster {
    /// Build the standard cluster with namespaces named `PREFIX-ROLE-PID-N`
    /// (`ROLE` is `lan`, `node1`, `node2`, `ext`, `pod1a`, `pod1b`, `pod2a`).
    pub fn create(prefix: &str) -> Result<Cluster> {
        ClusterBuilder::new(prefix).create()
    }

    /// Start from defaults and change some before creating.
    pub fn builder(prefix: &str) -> ClusterBuilder {
        ClusterBuilder::new(prefix)
    }

    /// The pod with this name.
    ///
    /// # Panics
    /// If there is no such pod: the names are fixed (`pod1a`, `pod1b`, `pod2a`), so
    /// that is a bug in the test.
    pub fn pod(&self, name: &str) -> &Pod {
        self.try_pod(name)
            .unwrap_or_else(|| panic!("no pod {name:?} in the test cluster (pod1a, pod1b, pod2a)"))
    }

    /// The pod with this name, if any.
    pub fn try_pod(&self, name: &str) -> Option<&Pod> {
        self.pods.iter().find(|p| p.name == name)
    }

    /// A node by id.
    ///
    /// # Panics
    /// For node3 in a two-node cluster: a bug in the test.
    pub fn node(&self, id: NodeId) -> &Node {
        match id {
            NodeId::Node1 => &self.node1,
            NodeId::Node2 => &self.node2,
            NodeId::Node3 => self
                .node3
                .as_ref()
                .unwrap_or_else(|| panic!("node3 exists only with ClusterBuilder::three_nodes")),
        }
    }

    /// Every node, in order.
    pub fn nodes(&self) -> Vec<&Node> {
        let mut v = vec![&self.node1, &self.node2];
        v.extend(self.node3.as_ref());
        v
    }

    /// The names of all namespaces of the cluster (e.g. to check they are gone).
    pub fn namespace_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.pods.iter().map(|p| p.ns.name().to_owned()).collect();
        v.extend(
            [&self.ext.ns, &self.node1.ns, &self.node2.ns, &self.lan]
                .iter()
                .map(|ns| ns.name().to_owned()),
        );
        v.extend(self.node3.iter().map(|n| n.ns.name().to_owned()));
        v
    }
}

/// Options for [`Cluster`]; created by [`Cluster::builder`].
#[derive(Debug, Clone)]
pub struct ClusterBuilder {
    prefix: String,
    ext_gateway: NodeId,
    three_nodes: bool,
}

struct PodSpec {
    name: &'static str,
    node: NodeId,
    v4: Ipv4Addr,
    v6: Ipv6Addr,
}

const PODS: [PodSpec; 4] = [
    PodSpec {
        name: "pod1a",
        node: NodeId::Node1,
        v4: addr::POD1A_V4,
        v6: addr::POD1A_V6,
    },
    PodSpec {
        name: "pod1b",
        node: NodeId::Node1,
        v4: addr::POD1B_V4,
        v6: addr::POD1B_V6,
    },
    PodSpec {
        name: "pod2a",
        node: NodeId::Node2,
        v4: addr::POD2A_V4,
        v6: addr::POD2A_V6,
    },
    PodSpec {
        name: "pod3a",
        node: NodeId::Node3,
        v4: addr::POD3A_V4,
        v6: addr::POD3A_V6,
    },
];

impl ClusterBuilder {
    /// Defaults: `ext` routes via node1.
    pub fn new(prefix: &str) -> Self {
        ClusterBuilder {
            prefix: prefix.to_owned(),
            ext_gateway: NodeId::Node1,
            three_nodes: false,
        }
    }

    /// Add node3 (LAN `.3`, pods `10.244.3.0/24`) with pod `pod3a`: for tests of many
    /// nodes sharing one brain. Routes between every pair of nodes' pod CIDRs.
    pub fn three_nodes(mut self) -> Self {
        self.three_nodes = true;
        self
    }

    /// Which node `ext`'s default routes (IPv4 and IPv6) point at, i.e. which node's
    /// proxy handles Service traffic that `ext` sends. Default: node1.
    pub fn ext_gateway(mut self, node: NodeId) -> Self {
        self.ext_gateway = node;
        self
    }

    /// Create all namespaces, links, addresses and routes. On error, everything
    /// created so far is deleted again.
    pub fn create(self) -> Result<Cluster> {
        let p = &self.prefix;
        let lan = Netns::add(&format!("{p}-lan"))?;
        let node1 = node(Netns::add(&format!("{p}-node1"))?, NodeId::Node1);
        let node2 = node(Netns::add(&format!("{p}-node2"))?, NodeId::Node2);
        let node3 = if self.three_nodes {
            Some(node(Netns::add(&format!("{p}-node3"))?, NodeId::Node3))
        } else {
            None
        };
        let ext = Host {
            ns: Netns::add(&format!("{p}-ext"))?,
            ipv4: addr::EXT_V4,
            ipv6: addr::EXT_V6,
            gateway: self.ext_gateway,
        };
        let mut pods = Vec::with_capacity(PODS.len());
        for spec in PODS
            .iter()
            .filter(|s| self.three_nodes || s.node != NodeId::Node3)
        {
            pods.push(Pod {
                ns: Netns::add(&format!("{p}-{}", spec.name))?,
                name: spec.name,
                ipv4: spec.v4,
                ipv6: spec.v6,
                node: spec.node,
            });
        }
        let cluster = Cluster {
            pods,
            ext,
            node1,
            node2,
            node3,
            lan,
        };
        cluster.wire()?;
        Ok(cluster)
    }
}

fn node(ns: Netns, id: NodeId) -> Node {
    match id {
        NodeId::Node1 => Node {
            ns,
            id,
            lan_ipv4: addr::NODE1_LAN_V4,
            lan_ipv6: addr::NODE1_LAN_V6,
            pod_gateway_v4: addr::NODE1_POD_GW_V4,
            pod_gateway_v6: addr::NODE1_POD_GW_V6,
            pod_cidr_v4: addr::NODE1_POD_CIDR_V4,
            pod_cidr_v6: addr::NODE1_POD_CIDR_V6,
        },
        NodeId::Node2 => Node {
            ns,
            id,
            lan_ipv4: addr::NODE2_LAN_V4,
            lan_ipv6: addr::NODE2_LAN_V6,
            pod_gateway_v4: addr::NODE2_POD_GW_V4,
            pod_gateway_v6: addr::NODE2_POD_GW_V6,
            pod_cidr_v4: addr::NODE2_POD_CIDR_V4,
            pod_cidr_v6: addr::NODE2_POD_CIDR_V6,
        },
        NodeId::Node3 => Node {
            ns,
            id,
            lan_ipv4: addr::NODE3_LAN_V4,
            lan_ipv6: addr::NODE3_LAN_V6,
            pod_gateway_v4: addr::NODE3_POD_GW_V4,
            pod_gateway_v6: addr::NODE3_POD_GW_V6,
            pod_cidr_v4: addr::NODE3_POD_CIDR_V4,
            pod_cidr_v6: addr::NODE3_POD_CIDR_V6,
        },
    }
}

/// One namespace's share of a setup phase: sysctls, then an `ip -batch` script.
struct Step<'a> {
    ns: &'a Netns,
    script: String,
    sysctls: Vec<(String, String)>,
}

impl Step<'_> {
    fn run(&self) -> Result<()> {
        let s: Vec<(&str, &str)> = self
            .sysctls
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        self.ns.sysctls(&s)?;
        if self.script.is_empty() {
            Ok(())
        } else {
            self.ns.ip_batch(&self.script)
        }
    }
}

/// Run the steps concurrently (each is a couple of processes), first error wins.
fn run_parallel(steps: &[Step<'_>]) -> Result<()> {
    thread::scope(|s| {
        let handles: Vec<_> = steps.iter().map(|st| s.spawn(move || st.run())).collect();
        let mut first = Ok(());
        for h in handles {
            let r = h
                .join()
                .unwrap_or_else(|_| Err(Error::Other("cluster setup thread panicked".into())));
            if first.is_ok() {
                first = r;
            }
        }
        first
    })
}

fn kv(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

impl Cluster {
    fn wire(&self) -> Result<()> {
        // Phase 0: sysctls, before any interface exists, so that the `default`
        // settings are what every interface created or moved in later starts with.
        let bridge_nf = Path::new("/proc/sys/net/bridge/bridge-nf-call-iptables").exists();
        let mut lan_sysctls = no_dad();
        if bridge_nf {
            // The LAN is a dumb switch: bridged frames skip its (empty) IP hooks.
            lan_sysctls.extend(kv(&[
                ("net.bridge.bridge-nf-call-iptables", "0"),
                ("net.bridge.bridge-nf-call-ip6tables", "0"),
            ]));
        }
        let mut phase0 = vec![Step {
            ns: &self.lan,
            script: String::new(),
            sysctls: lan_sysctls,
        }];
        for n in self.nodes() {
            let mut sysctls = no_dad();
            // ip_forward first: changing it resets other settings (accept_redirects);
            // both forwarding switches also set the `default` for new interfaces.
            sysctls.extend(kv(&[
                ("net.ipv4.ip_forward", "1"),
                ("net.ipv6.conf.all.forwarding", "1"),
                // Nodes hairpin traffic (ext -> node1 -> ext, pod -> DNAT -> pod on the
                // same bridge); ICMP redirects would only confuse the senders' caches.
                ("net.ipv4.conf.all.send_redirects", "0"),
                ("net.ipv4.conf.default.send_redirects", "0"),
            ]));
            if bridge_nf {
                sysctls.extend(kv(&[
                    ("net.bridge.bridge-nf-call-iptables", "1"),
                    ("net.bridge.bridge-nf-call-ip6tables", "1"),
                ]));
            }
            phase0.push(Step {
                ns: &n.ns,
                script: String::new(),
                sysctls,
            });
        }
        for ns in std::iter::once(&self.ext.ns).chain(self.pods.iter().map(|p| &p.ns)) {
            let mut sysctls = no_dad();
            sysctls.extend(no_redirects());
            phase0.push(Step {
                ns,
                script: String::new(),
                sysctls,
            });
        }
        run_parallel(&phase0)?;

        // Phase 1: the LAN switch, with one veth into each LAN host.
        let mut lan = String::from(
            "link set lo up\nlink add br0 type bridge forward_delay 0 stp_state 0\nlink set br0 up\n",
        );
        let mut ports: Vec<(&str, &Netns)> =
            self.nodes().iter().map(|n| (n.id.name(), &n.ns)).collect();
        ports.push(("ext", &self.ext.ns));
        for (port, ns) in ports {
            lan.push_str(&format!(
                "link add {port} type veth peer name eth0 netns {}\nlink set {port} master br0 up\n",
                ns.name()
            ));
        }
        Step {
            ns: &self.lan,
            script: lan,
            sysctls: Vec::new(),
        }
        .run()?;

        // Phase 2: nodes (LAN side, bridge, veths into their pods, routes) and ext.
        let mut phase2 = Vec::new();
        for n in self.nodes() {
            let mut s = format!(
                "link set lo up\nlink set eth0 up\n\
                 addr add {}/{} dev eth0\naddr add {}/{} dev eth0 nodad\n\
                 link add cbr0 type bridge forward_delay 0 stp_state 0\nlink set cbr0 up\n\
                 addr add {}/{} dev cbr0\naddr add {}/{} dev cbr0 nodad\n",
                n.lan_ipv4,
                addr::LAN_PREFIX_V4,
                n.lan_ipv6,
                addr::LAN_PREFIX_V6,
                n.pod_gateway_v4,
                addr::POD_PREFIX_V4,
                n.pod_gateway_v6,
                addr::POD_PREFIX_V6,
            );
            for pod in self.pods.iter().filter(|p| p.node == n.id) {
                s.push_str(&format!(
                    "link add veth-{0} type veth peer name eth0 netns {1}\n\
                     link set veth-{0} master cbr0 up\n\
                     link set dev veth-{0} type bridge_slave hairpin on\n",
                    pod.name,
                    pod.ns.name()
                ));
            }
            for other in self.nodes().into_iter().filter(|o| o.id != n.id) {
                s.push_str(&format!(
                    "route add {} via {}\nroute add {} via {}\n",
                    other.pod_cidr_v4, other.lan_ipv4, other.pod_cidr_v6, other.lan_ipv6,
                ));
            }
            s.push_str(&format!(
                "route add default via {}\nroute add default via {}\n",
                addr::EXT_V4,
                addr::EXT_V6,
            ));
            phase2.push(Step {
                ns: &n.ns,
                script: s,
                sysctls: Vec::new(),
            });
        }
        let gw = self.node(self.ext.gateway);
        phase2.push(Step {
            ns: &self.ext.ns,
            script: format!(
                "link set lo up\nlink set eth0 up\n\
                 addr add {}/{} dev eth0\naddr add {}/{} dev eth0 nodad\n\
                 route add default via {}\nroute add default via {}\n",
                self.ext.ipv4,
                addr::LAN_PREFIX_V4,
                self.ext.ipv6,
                addr::LAN_PREFIX_V6,
                gw.lan_ipv4,
                gw.lan_ipv6
            ),
            sysctls: Vec::new(),
        });
        run_parallel(&phase2)?;

        // Phase 3: pods.
        let phase3: Vec<Step<'_>> = self
            .pods
            .iter()
            .map(|pod| {
                let n = self.node(pod.node);
                Step {
                    ns: &pod.ns,
                    script: format!(
                        "link set lo up\nlink set eth0 up\n\
                         addr add {}/{} dev eth0\naddr add {}/{} dev eth0 nodad\n\
                         route add default via {}\nroute add default via {}\n",
                        pod.ipv4,
                        addr::POD_PREFIX_V4,
                        pod.ipv6,
                        addr::POD_PREFIX_V6,
                        n.pod_gateway_v4,
                        n.pod_gateway_v6
                    ),
                    sysctls: Vec::new(),
                }
            })
            .collect();
        run_parallel(&phase3)
    }
}

/// Hosts (pods, ext) ignore ICMP redirects, so a route never changes under a test.
fn no_redirects() -> Vec<(String, String)> {
    kv(&[
        ("net.ipv4.conf.all.accept_redirects", "0"),
        ("net.ipv4.conf.default.accept_redirects", "0"),
        ("net.ipv6.conf.all.accept_redirects", "0"),
        ("net.ipv6.conf.default.accept_redirects", "0"),
    ])
}

/// No duplicate address detection, also for link-local addresses: a router sends
/// neighbour solicitations for forwarded packets only from a usable link-local
/// address, so with DAD the first packets through a fresh node vanish for ~1-2 s.
fn no_dad() -> Vec<(String, String)> {
    kv(&[
        ("net.ipv6.conf.all.accept_dad", "0"),
        ("net.ipv6.conf.default.accept_dad", "0"),
    ])
}
