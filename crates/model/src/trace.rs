//! The decision this node makes for one packet, from the model: `kpng trace`.
//!
//! Why: "why does this connection go there (or nowhere)?" is the question of every Service
//! incident, and the rules in the kernel answer it only to someone who reads them fluently.
//! The trace follows the same steps as every backend (kube-proxy's nftables mode, which the
//! backends implement and the real-packet suites check): the load-balancer firewall, the
//! frontend that matches, the endpoint list the traffic policy selects, the no-endpoint verdict,
//! and masquerading.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use serde::Serialize;

use crate::key::{Family, Protocol, ServiceKey};
use crate::model::Snapshot;
use crate::service_port::ServicePort;

/// One packet to trace: the first packet of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceQuery {
    /// Its source address.
    pub from: IpAddr,
    /// Its destination.
    pub to: SocketAddr,
    /// Its protocol.
    pub protocol: Protocol,
    /// The interface it arrives on (`kpng trace --in-interface`), when the asker knows it:
    /// with `--detect-local-mode BridgeInterface|InterfaceNamePrefix` the rules tell pods by
    /// it, not by the source address, and without it the trace can only assume.
    pub in_interface: Option<String>,
}

/// What the node knows beyond the model: which sources are its pods and itself, and which of
/// its addresses accept node ports. The runner fills it from the backend's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// The node's own addresses (traffic from them is "node-originated").
    pub local_ips: Vec<IpAddr>,
    /// The addresses that accept node ports (`--nodeport-addresses`).
    pub nodeport_ips: Vec<IpAddr>,
    /// Of `local_ips`, the Node object's addresses that no interface of the host has (a
    /// stale InternalIP, an address moved away): no packet to them reaches this node, and the
    /// trace says so rather than calling them this node's. Empty where the host's addresses
    /// are not read.
    pub node_ips_not_on_host: Vec<IpAddr>,
    /// Where NodePorts are served now, in words for `kpng status`'s header (`192.168.100.1,
    /// fd00:100::1 (--nodeport-addresses primary)`, `every local address but loopback
    /// (--nodeport-addresses unset)`): an operator reads where they are without working the
    /// flag out against the host's addresses. Empty when the binary does not say.
    pub node_ports_on: String,
    /// `--nodeport-addresses` as set, in words (`primary`, CIDRs, every local address): a
    /// node port reached on another of the node's addresses is not served there, and the
    /// trace names the setting that decided so.
    pub nodeport_setting: String,
    /// `--service-cidr`: the rules drop traffic to an unallocated IP inside them as inside the
    /// cluster's ServiceCIDR objects (which the snapshot holds), so the trace must know both.
    pub service_cidrs: Vec<IpNet>,
    /// How a source is recognised as a pod (`--detect-local-mode`).
    pub local_pods: LocalPods,
    /// `--masquerade-all`.
    pub masquerade_all: bool,
    /// Where the backend departs from nftables mode by design (docs/backends.md).
    pub backend: BackendTraits,
    /// Which of the node's sockets the backend translates, when it translates local sockets
    /// ([`BackendTraits::translates_local_sockets`]): its settings narrow them.
    pub local_sockets: LocalSockets,
    /// Why IPv4 node ports are not served on 127.0.0.1 although the backend was asked to
    /// (iptables mode's `--iptables-localhost-nodeports`, whose `route_localnet` sysctl could
    /// not be set): the trace names the reason instead of the general "loopback is never a
    /// node-port address". `None` otherwise.
    pub localhost_not_served: Option<String>,
    /// Where the Service health checks (`healthCheckNodePort`) listen, as the runner chooses
    /// (`--nodeport-addresses`: the node-port addresses of a family it restricts, loopback
    /// included when a CIDR holds it; `0.0.0.0` / `::` for every local address of a family it
    /// does not restrict); empty when they listen nowhere. A packet to a health-check port on
    /// another of the node's addresses is refused. `None` where the binary does not say (a
    /// sink without health checks): every local address then counts as listening.
    pub health_check_ips: Option<Vec<IpAddr>>,
}

impl NodeFacts {
    /// Whether the Service health checks listen on `dst` (see [`NodeFacts::health_check_ips`]).
    pub fn health_checks_listen_on(&self, dst: IpAddr) -> bool {
        let wildcard = match Family::of(&dst) {
            Family::V4 => IpAddr::from([0u8; 4]),
            Family::V6 => IpAddr::from([0u16; 8]),
        };
        self.health_check_ips
            .as_ref()
            .is_none_or(|ips| ips.contains(&dst) || ips.contains(&wildcard))
    }
}

/// Which of the node's sockets the eBPF programs translate (`to-local ebpf`'s
/// `--cgroup-path` and `--socket-lb-host-netns-only`): the rest reach Services through the
/// rules, and a trace must not promise the socket path for them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalSockets {
    /// `--cgroup-path` when it is not the cgroup v2 root: only the sockets of processes in
    /// that subtree are translated. A trace knows the source address, not the process, so it
    /// gives both outcomes.
    pub cgroup_subtree: Option<String>,
    /// `--socket-lb-host-netns-only`: only the sockets of the node's network namespace (the
    /// node's own processes, hostNetwork pods); pods' go through the rules.
    pub host_netns_only: bool,
    /// kpng's own network namespace (`net:[N]`) when it is not the host's: the option then
    /// means that namespace, and the node's processes and hostNetwork pods go through the
    /// rules like the pods (what `kpng status` says as a PROBLEM). A trace knows the source
    /// address, not the socket's namespace (where a namespace stands for a node, as in tests,
    /// the node's addresses are in it), so it gives both outcomes. `None`: the host's, or
    /// unknown.
    pub own_netns_not_host: Option<String>,
}

/// The deliberate differences between backends that change a packet's fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendTraits {
    /// A packet to a ClusterIP on a port no Service uses is rejected (nftables mode); else it
    /// is left alone (iptables mode).
    pub rejects_unknown_ports: bool,
    /// The backend is a proxy: it opens its own connection to the endpoint, which therefore
    /// always sees a node address (the userspace backend).
    pub proxies_connections: bool,
    /// Sockets on this node (the node's own, its pods') are connected to an endpoint at
    /// `connect()`/`sendmsg()`: no packet of theirs is rewritten and none is masqueraded (the
    /// eBPF backend; load-balancer IPs with source ranges, and SCTP, stay with the rules).
    pub translates_local_sockets: bool,
    /// `loadBalancerSourceRanges` drop other sources (every Linux backend); kube-proxy's
    /// winkernel, and so the HNS backend, does not enforce them (kubernetes#107019).
    pub enforces_source_ranges: bool,
    /// A Service without any endpoint is refused at once (a reject rule: TCP reset / ICMP
    /// unreachable) on every Linux backend; HNS has no such object and refuses a load balancer
    /// without endpoints, so kube-proxy's winkernel, and the HNS backend, program nothing for
    /// it and its connections are not answered (the client times out).
    pub rejects_without_endpoints: bool,
    /// An IP that is both an external IP and a load-balancer IP of one Service port is
    /// served as the external IP, without the source ranges (iptables mode: its external-IP
    /// rule comes first); nftables mode serves it as the load balancer, firewall included
    /// (one map key for both, the firewall keyed by the load-balancer IP).
    pub external_ips_before_load_balancers: bool,
    /// Forwarded traffic marked for masquerading is accepted in filter `FORWARD` by
    /// `KUBE-FORWARD` (`-m mark --mark 0x4000/0x4000 -j ACCEPT`), before any chain jumped to
    /// after kpng's there (iptables mode, as kube-proxy): NetworkPolicy and firewall rules
    /// placed after kpng's jump never see it, and a trace of such a packet says so. The
    /// nftables backend accepts nothing, so policy still sees it.
    pub accepts_masqueraded_in_forward: bool,
}

impl Default for BackendTraits {
    /// nftables mode's.
    fn default() -> Self {
        BackendTraits {
            rejects_unknown_ports: true,
            proxies_connections: false,
            translates_local_sockets: false,
            enforces_source_ranges: true,
            rejects_without_endpoints: true,
            external_ips_before_load_balancers: false,
            accepts_masqueraded_in_forward: false,
        }
    }
}

/// How pod traffic is told apart (`--detect-local-mode`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum LocalPods {
    /// No detection: no source is a pod.
    #[default]
    None,
    /// Sources inside these CIDRs (`--cluster-cidr`, mode ClusterCIDR) are pods.
    Cidrs(Vec<IpNet>),
    /// Sources inside the Node's pod CIDRs (mode NodeCIDR) are pods: a separate variant so
    /// that a family without one is explained by the Node, not by `--cluster-cidr`.
    NodeCidrs(Vec<IpNet>),
    /// Decided by the interface the packet came in on: by `rule` when the query names the
    /// interface ([`TraceQuery::in_interface`]); otherwise the trace takes sources inside
    /// `assumed` (the node's pod CIDRs, whose pods usually sit behind that interface) as
    /// pods, and says that it assumed so ([`Trace::interface`]): the assumption is wrong both
    /// ways on some CNIs (a pod CIDR routed elsewhere, pods outside the Node's podCIDRs).
    Interface {
        /// The rule the backends write.
        rule: InterfaceRule,
        /// The CIDRs whose sources are taken as coming in through it when the query names no
        /// interface.
        assumed: Vec<IpNet>,
    },
}

/// An interface-based pod detector, as the rules match it (`iifname`/`-i`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InterfaceRule {
    /// `--detect-local-mode BridgeInterface`: packets arriving on this bridge (exact name).
    Bridge(String),
    /// `--detect-local-mode InterfaceNamePrefix`: packets arriving on an interface whose name
    /// starts with this prefix (`iifname "cali*"`, `-i cali+`).
    Prefix(String),
}

impl InterfaceRule {
    /// Whether a packet arriving on `interface` is a pod's, as the rules decide.
    pub fn matches(&self, interface: &str) -> bool {
        match self {
            InterfaceRule::Bridge(b) => interface == b,
            InterfaceRule::Prefix(p) => interface.starts_with(p.as_str()),
        }
    }

    /// The rule in words: "a pod if it arrives on cni0".
    pub fn words(&self) -> String {
        match self {
            InterfaceRule::Bridge(b) => format!("a pod if it arrives on {b}"),
            InterfaceRule::Prefix(p) => {
                format!("a pod if it arrives on an interface whose name starts with {p}")
            }
        }
    }

    /// The setting: `--detect-local-mode BridgeInterface, --pod-bridge-interface cni0`.
    pub fn setting(&self) -> String {
        match self {
            InterfaceRule::Bridge(b) => {
                format!("--detect-local-mode BridgeInterface, --pod-bridge-interface {b}")
            }
            InterfaceRule::Prefix(p) => {
                format!("--detect-local-mode InterfaceNamePrefix, --pod-interface-name-prefix {p}")
            }
        }
    }
}

/// The outcome for the packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Rewritten to one of `endpoints`.
    Dnat,
    /// Refused at once (TCP reset / ICMP unreachable): no endpoint anywhere, or no such port.
    Reject,
    /// Silently dropped: endpoints exist but none for this policy, a firewall, or an
    /// unallocated Service IP; on HNS also a Service without endpoints (no load balancer:
    /// nothing answers).
    Drop,
    /// Delivered to the node itself untouched (one of its addresses, no node port there).
    Accept,
    /// Not a Service address: kpng does not touch it.
    None,
}

/// Which kind of Service address matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Frontend {
    /// `spec.clusterIP(s)`.
    #[serde(rename = "clusterIP")]
    ClusterIp,
    /// A node address and `nodePort`.
    NodePort,
    /// `spec.externalIPs`.
    #[serde(rename = "externalIP")]
    ExternalIp,
    /// `status.loadBalancer.ingress[].ip`.
    LoadBalancer,
}

/// The trace of one packet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Trace {
    /// What happens to it.
    pub verdict: Verdict,
    /// `namespace/name:port` of the Service port that matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The kind of address that matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frontend: Option<Frontend>,
    /// The endpoint list used: `cluster` or `local`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint_list: Option<&'static str>,
    /// The endpoints one of which receives it (`IP:port`).
    pub endpoints: Vec<SocketAddr>,
    /// Whether its source is rewritten to the node's.
    pub masquerade: bool,
    /// The client is itself one of the endpoints: when it is picked, the packet is
    /// masqueraded (hairpin) whatever `masquerade` says.
    pub hairpin: bool,
    /// Every endpoint the client can pick is the client itself: it is always masqueraded
    /// (hairpin). Said once here so that every renderer (the text, the status page) words it
    /// alike, not "whenever it picks itself".
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub only_itself: bool,
    /// The connection is made to the endpoint at the socket (`connect()`/`sendmsg()`, the eBPF
    /// backend) rather than rewritten packet by packet: for a source on this node.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub translated_at_socket: bool,
    /// The socket path applies only to the processes of this cgroup subtree (`--cgroup-path`
    /// is not the cgroup root): from one of them the connection is made to an endpoint at the
    /// socket; from any other process the rest of this trace (the rules) holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at_socket_if_in_cgroup: Option<String>,
    /// The socket path applies only to the sockets of kpng's own network namespace
    /// (`net:[N]`), which is not the host's, under `--socket-lb-host-netns-only`
    /// ([`LocalSockets::own_netns_not_host`]): from a process in it the connection is made at
    /// the socket; from any other (the host's processes, hostNetwork pods) the rest of this
    /// trace (the rules) holds. Until 2026-12-07 the trace said "at the socket" whatever the
    /// namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at_socket_if_in_netns: Option<String>,
    /// ClientIP session affinity's timeout, when the Service has it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affinity_timeout_seconds: Option<u32>,
    /// How the input interface decided whether the source is a pod, when it mattered for the
    /// answer: with an interface detector and no [`TraceQuery::in_interface`], that the
    /// answer depends on it and what was assumed; with one given, what it meant. Also says
    /// when a given interface is not what the detector looks at.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// Why, in words.
    pub reason: String,
}

impl Trace {
    fn unmatched(verdict: Verdict, reason: String) -> Trace {
        Trace {
            verdict,
            service: None,
            frontend: None,
            endpoint_list: None,
            endpoints: Vec::new(),
            masquerade: false,
            hairpin: false,
            only_itself: false,
            translated_at_socket: false,
            at_socket_if_in_cgroup: None,
            at_socket_if_in_netns: None,
            affinity_timeout_seconds: None,
            interface: None,
            reason,
        }
    }
}

/// A Service that shows an address on purpose left without rules (see
/// [`crate::records::ServiceInfo::not_proxied_ips`]): what a trace to it names instead of
/// "not a Service address" or "unallocated ClusterIP".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotProxied {
    /// The Service.
    pub service: ServiceKey,
    /// Which of its addresses it is.
    pub kind: NotProxiedKind,
}

/// Which address of a Service gets no rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotProxiedKind {
    /// The `clusterIP` of an ExternalName Service (a DNS alias).
    ExternalNameClusterIp,
    /// A load-balancer ingress IP with `ipMode: Proxy`.
    ProxyModeIngress,
    /// The `clusterIP` of a Service labelled `service.kubernetes.io/headless`, which kube-proxy
    /// leaves to other components (a trace used to say "no Service has it").
    HeadlessLabelClusterIp,
    /// The `clusterIP` of another proxy's Service: its `service.kubernetes.io/service-proxy-name`
    /// label (`None`: unlabelled, while kpng runs with `--service-proxy-name`).
    OtherProxyClusterIp(Option<String>),
}

impl NotProxied {
    /// What the address is, in words, starting with it.
    fn words(&self, dst: IpAddr) -> String {
        match &self.kind {
            NotProxiedKind::ExternalNameClusterIp => format!(
                "{dst} is the clusterIP of ExternalName Service {}, which gets no rules (a DNS \
                 alias, as kube-proxy; the API server refuses a clusterIP on it)",
                self.service
            ),
            NotProxiedKind::ProxyModeIngress => format!(
                "{dst} is an ingress IP of {} with ipMode Proxy: not programmed on nodes, as \
                 upstream (the load balancer delivers to the nodes' own addresses)",
                self.service
            ),
            NotProxiedKind::HeadlessLabelClusterIp => format!(
                "{dst} is the clusterIP of {}, labelled service.kubernetes.io/headless: kpng \
                 (like kube-proxy) does not proxy it",
                self.service
            ),
            NotProxiedKind::OtherProxyClusterIp(Some(proxy)) => format!(
                "{dst} is the clusterIP of {}, labelled for proxy '{proxy}' \
                 (service.kubernetes.io/service-proxy-name): kpng (like kube-proxy) does not \
                 proxy it",
                self.service
            ),
            NotProxiedKind::OtherProxyClusterIp(None) => format!(
                "{dst} is the clusterIP of {}, which has no service.kubernetes.io/service-proxy-name \
                 label while kpng runs with --service-proxy-name: kpng does not proxy it",
                self.service
            ),
        }
    }
}

/// Traces `q` through `snapshot` on a node described by `facts`.
pub fn trace(snapshot: &Snapshot, facts: &NodeFacts, q: &TraceQuery) -> Trace {
    trace_noting(snapshot, facts, q, None)
}

/// [`trace`], naming the Service that shows the destination when no frontend matches and
/// `not_proxied` says which ([`crate::Model::not_proxied`]).
pub fn trace_noting(
    snapshot: &Snapshot,
    facts: &NodeFacts,
    q: &TraceQuery,
    not_proxied: Option<&NotProxied>,
) -> Trace {
    let family = Family::of(&q.to.ip());
    let ports: Vec<&ServicePort> = snapshot
        .family(family)
        .map(|p| p.as_ref())
        .filter(|p| p.key.protocol == q.protocol)
        .collect();
    let (dst, dport) = (q.to.ip(), q.to.port());
    // The Service IPs of every port before any node port, as kube-proxy's nftables `services`
    // chain matches its `service-ips` map before the node-port dispatch: an external IP that
    // is a node address owns its port over another Service's node port of that number.
    let service_ip = ports.iter().find_map(|p| {
        if p.cluster_ip == dst && p.port == dport {
            Some((*p, Frontend::ClusterIp))
        } else if p.port == dport
            && p.external_ips.contains(&dst)
            && (facts.backend.external_ips_before_load_balancers
                || !p.load_balancer_ips.contains(&dst))
        {
            Some((*p, Frontend::ExternalIp))
        } else if p.port == dport && p.load_balancer_ips.contains(&dst) {
            Some((*p, Frontend::LoadBalancer))
        } else {
            None
        }
    });
    let matched = service_ip.or_else(|| {
        ports
            .iter()
            .find(|p| p.node_port == Some(dport) && facts.nodeport_ips.contains(&dst))
            .map(|p| (*p, Frontend::NodePort))
    });
    let Some((port, frontend)) = matched else {
        return no_frontend(snapshot, facts, q, family, not_proxied);
    };
    let name = format!("{}:{}", port.key.service, port.key.port_name);
    let mut t = Trace {
        service: Some(name),
        frontend: Some(frontend),
        affinity_timeout_seconds: port.session_affinity.map(|a| a.timeout_seconds),
        ..Trace::unmatched(Verdict::Dnat, String::new())
    };
    let outside_ranges = frontend == Frontend::LoadBalancer
        && !port.source_ranges.is_empty()
        && !port.source_ranges.iter().any(|r| r.contains(&q.from));
    if outside_ranges && facts.backend.enforces_source_ranges {
        t.verdict = Verdict::Drop;
        t.reason = format!(
            "{} is outside loadBalancerSourceRanges ({})",
            q.from,
            join(&port.source_ranges)
        );
        return t;
    }
    let pod = pod_source(facts, q);
    let from_pod = pod.is_pod;
    let from_node = facts.local_ips.contains(&q.from);
    // Whether the decision below looked at pod-ness: only then does an interface detector's
    // input interface change the answer.
    let mut consulted = false;
    let (list, masquerade, why) = match frontend {
        Frontend::ClusterIp => {
            let detecting = is_detecting(facts, q.from);
            consulted = detecting && !facts.masquerade_all;
            let masq = facts.masquerade_all || (detecting && !from_pod);
            let why = if facts.masquerade_all {
                "masquerade-all".to_string()
            } else if masq {
                format!(
                    "{}: ClusterIP traffic from outside is masqueraded",
                    pod.not_pod_words
                )
            } else if !detecting {
                no_detector(&facts.local_pods, Family::of(&q.from))
            } else {
                format!("{}, its address kept", pod.pod_words)
            };
            let list = if port.internal_policy_local {
                "local"
            } else {
                "cluster"
            };
            (list, masq, why)
        }
        _ if !port.external_policy_local => (
            "cluster",
            true,
            "externalTrafficPolicy Cluster: external traffic is masqueraded".to_string(),
        ),
        // kube-proxy sends a pod's packet to the Service's cluster chain, whose masquerade-all
        // rule matches ClusterIP destinations only: the pod's address is kept.
        _ if from_pod => {
            consulted = true;
            (
                "cluster",
                false,
                format!(
                    "externalTrafficPolicy Local, but {}: every endpoint, its address kept{}",
                    pod.pod_words,
                    masquerade_all_note(facts)
                ),
            )
        }
        _ if from_node => (
            "cluster",
            true,
            "externalTrafficPolicy Local, but the node itself is the source: every endpoint, masqueraded".to_string(),
        ),
        _ => {
            consulted = true;
            (
                "local",
                false,
                format!(
                    "externalTrafficPolicy Local: this node's endpoints, the client's address \
                     kept{}",
                    masquerade_all_note(facts)
                ),
            )
        }
    };
    if consulted || pod.note_always {
        t.interface = pod.note;
    }
    let endpoints = if list == "local" {
        &port.local_endpoints
    } else {
        &port.cluster_endpoints
    };
    t.endpoint_list = Some(list);
    t.endpoints = endpoints.iter().map(|e| e.addr()).collect();
    let from_this_node = from_node || snapshot.node.pod_cidrs.iter().any(|c| c.contains(&q.from));
    let socket_lb = facts.backend.translates_local_sockets
        && from_this_node
        && q.protocol != Protocol::Sctp
        && (frontend != Frontend::LoadBalancer || port.source_ranges.is_empty());
    let path = socket_path(&facts.local_sockets, socket_lb, from_node);
    let (at_socket, pod_left_to_rules) = (path.certain, path.pod_left_to_rules);
    // Without endpoints the programs act only by refusing a TCP connect() (a Service without
    // any endpoint); the rest is the rules' in any case.
    let refused = !port.has_any_endpoints && q.protocol == Protocol::Tcp;
    let acts = !endpoints.is_empty() || refused;
    let notes = SocketNotes {
        only_in: path.only_in_cgroup.filter(|_| acts),
        only_in_netns: path.only_in_netns.filter(|_| acts),
        pod_left_to_rules,
        refused: endpoints.is_empty() && refused,
    };
    if endpoints.is_empty() {
        (t.verdict, t.reason) = if port.has_any_endpoints {
            (
                Verdict::Drop,
                format!("no {list} endpoint on this node's view, though the Service has endpoints"),
            )
        } else if at_socket && q.protocol == Protocol::Tcp {
            t.translated_at_socket = true;
            (
                Verdict::Reject,
                "the Service has no endpoints: the eBPF programs fail the socket's connect() \
                 with ECONNREFUSED at once, and no packet is sent"
                    .to_string(),
            )
        } else if !facts.backend.rejects_without_endpoints {
            (
                Verdict::Drop,
                "the Service has no endpoints: HNS has no load balancer for it (it refuses one \
                 without endpoints, as kube-proxy's winkernel), so nothing answers and the \
                 connection times out instead of being refused"
                    .to_string(),
            )
        } else {
            (Verdict::Reject, no_endpoints_words(snapshot, port))
        };
        return notes.apply(t);
    }
    t.hairpin = endpoints.iter().any(|e| e.ip == q.from);
    t.only_itself = endpoints.iter().all(|e| e.ip == q.from);
    if at_socket {
        t.translated_at_socket = true;
        t.masquerade = false;
        t.hairpin = false;
        t.only_itself = false;
        t.reason = "a socket on this node (the node's, or a pod's of this node): the eBPF \
                    programs connect it to one of the endpoints at connect()/sendmsg(), so no \
                    packet is rewritten and the endpoint sees the client's own address"
            .to_string();
    } else if facts.backend.proxies_connections {
        t.masquerade = true;
        t.reason = "the userspace proxy connects to the endpoint from the node".to_string();
    } else if t.only_itself {
        // The masquerade line says yes (hairpin): so must the why line, first.
        t.masquerade = masquerade;
        t.reason = format!(
            "hairpin: the client is the only endpoint it can pick, and a connection to itself \
             is always masqueraded to a node address (else the reply would not come back \
             through the node); without the hairpin: {why}"
        );
    } else if t.hairpin && !masquerade {
        t.masquerade = masquerade;
        t.reason = format!(
            "{why}; the client is also one of the endpoints: a connection it makes to itself \
             is masqueraded (hairpin)"
        );
    } else {
        t.masquerade = masquerade;
        t.reason = why;
    }
    if t.masquerade && !from_node && facts.backend.accepts_masqueraded_in_forward {
        t.reason.push_str(
            "; forwarded, it is accepted in filter FORWARD by KUBE-FORWARD (the masquerade \
             mark, as kube-proxy): NetworkPolicy or firewall chains jumped to after kpng's \
             there never see it",
        );
    }
    if outside_ranges {
        t.reason.push_str(&format!(
            "; {} is outside loadBalancerSourceRanges ({}), which this backend does not \
             enforce (as kube-proxy's winkernel)",
            q.from,
            join(&port.source_ranges)
        ));
    }
    notes.apply(t)
}

/// Which sockets of a local source the eBPF programs translate ([`socket_path`]).
struct SocketPath<'a> {
    /// Certainly at the socket.
    certain: bool,
    /// A pod's socket left to the rules by `--socket-lb-host-netns-only`.
    pod_left_to_rules: bool,
    /// At the socket only if its process is in this cgroup subtree (`--cgroup-path`).
    only_in_cgroup: Option<&'a str>,
    /// At the socket only if it is in kpng's own network namespace, not the host's
    /// ([`LocalSockets::own_netns_not_host`]).
    only_in_netns: Option<&'a str>,
}

/// Whether a socket the eBPF backend would translate (`socket_lb`: a local source, a
/// protocol and frontend the programs serve) is translated given the settings `scope`.
fn socket_path(scope: &LocalSockets, socket_lb: bool, from_node: bool) -> SocketPath<'_> {
    let mut path = SocketPath {
        certain: false,
        pod_left_to_rules: false,
        only_in_cgroup: None,
        only_in_netns: None,
    };
    if !socket_lb {
        return path;
    }
    if scope.host_netns_only && !from_node {
        path.pod_left_to_rules = true;
        return path;
    }
    path.only_in_cgroup = scope.cgroup_subtree.as_deref();
    path.only_in_netns = scope
        .own_netns_not_host
        .as_deref()
        .filter(|_| scope.host_netns_only);
    path.certain = path.only_in_cgroup.is_none() && path.only_in_netns.is_none();
    path
}

/// What a matched port's trace says about the socket path beyond its rules' answer.
struct SocketNotes<'a> {
    /// The socket path holds only for the processes of this cgroup subtree.
    only_in: Option<&'a str>,
    /// The socket path holds only for the sockets of kpng's own network namespace, not the
    /// host's.
    only_in_netns: Option<&'a str>,
    /// A pod's socket the programs would translate but for `--socket-lb-host-netns-only`.
    pod_left_to_rules: bool,
    /// The programs refuse the connect() (a TCP Service without any endpoint).
    refused: bool,
}

impl SocketNotes<'_> {
    /// `t` (the rules' answer when the socket path is not certain) with both outcomes, or
    /// with why a pod's socket takes the rules.
    fn apply(&self, mut t: Trace) -> Trace {
        let cgroup_words = self
            .only_in
            .map(|cgroup| format!("in cgroup {cgroup}'s subtree (--cgroup-path)"));
        let netns_words = self.only_in_netns.map(|netns| {
            format!(
                "in kpng's own network namespace {netns}, which is not the host's \
                 (--socket-lb-host-netns-only translates that namespace's sockets only: the \
                 host's processes and hostNetwork pods go through the rules)"
            )
        });
        let condition = match (cgroup_words, netns_words) {
            (Some(c), Some(n)) => Some(format!("{c} and {n}")),
            (c, n) => c.or(n),
        };
        if let Some(condition) = condition {
            let socket = if self.refused {
                "the eBPF programs fail its connect() with ECONNREFUSED at once"
            } else {
                "the eBPF programs connect it to one of the endpoints at connect()/sendmsg(), \
                 no packet rewritten and the endpoint sees the client's own address"
            };
            t.at_socket_if_in_cgroup = self.only_in.map(str::to_string);
            t.at_socket_if_in_netns = self.only_in_netns.map(str::to_string);
            t.reason = format!(
                "at the socket if the sending process is {condition}: {socket}; otherwise \
                 through the rules: {}",
                t.reason
            );
        } else if self.pod_left_to_rules {
            t.reason.push_str(
                "; a pod's socket is not translated by the eBPF programs \
                 (--socket-lb-host-netns-only): its packets go through these rules, after a \
                 sidecar in the pod saw the Service address",
            );
        }
        t
    }
}

/// Why a port without any endpoint has none, in words: when another port of its Service in
/// the same family has endpoints, the EndpointSlices are not empty, they only do not list
/// this port (by its name): an operator who sees endpoints in `kubectl get endpointslices`
/// is told which port is missing from them.
fn no_endpoints_words(snapshot: &Snapshot, port: &ServicePort) -> String {
    let siblings_served = snapshot
        .family(port.key.family)
        .any(|p| p.key.service == port.key.service && p.key != port.key && p.has_any_endpoints);
    if siblings_served {
        let name = if port.key.port_name.is_empty() {
            "(unnamed)".to_string()
        } else {
            port.key.port_name.to_string()
        };
        format!(
            "the Service has no endpoints for this port: its {} endpoints list no port named \
             {name} (other ports of the Service have endpoints)",
            port.key.family
        )
    } else {
        "the Service has no endpoints".to_string()
    }
}

/// No frontend matched: a ClusterIP on another port, an unallocated Service IP, the node
/// itself, or nothing of ours.
fn no_frontend(
    snapshot: &Snapshot,
    facts: &NodeFacts,
    q: &TraceQuery,
    family: Family,
    not_proxied: Option<&NotProxied>,
) -> Trace {
    let dst = q.to.ip();
    let shown = not_proxied.map(|n| n.words(dst));
    if snapshot.family(family).any(|p| p.cluster_ip == dst) && facts.backend.rejects_unknown_ports {
        // The ports it does have settle a wrong port or protocol at once.
        let has: Vec<String> = snapshot
            .family(family)
            .filter(|p| p.cluster_ip == dst)
            .map(|p| format!("{}/{}", p.port, p.key.protocol))
            .collect();
        return Trace::unmatched(
            Verdict::Reject,
            format!(
                "{dst} is a ClusterIP, but no Service port {}/{} is on it (its ports: {})",
                q.to.port(),
                q.protocol,
                has.join(", ")
            ),
        );
    }
    if let Some(cidr) = snapshot
        .service_cidrs
        .iter()
        .chain(&facts.service_cidrs)
        .find(|c| c.contains(&dst))
        && facts.backend.rejects_unknown_ports
    {
        return Trace::unmatched(
            Verdict::Drop,
            match &shown {
                Some(shown) => format!(
                    "{shown}: in the Service CIDR {cidr} it is an unallocated ClusterIP, and \
                     traffic to unallocated ClusterIPs is dropped"
                ),
                None => format!(
                    "{dst} is in the Service CIDR {cidr} but no Service has it: traffic to \
                     unallocated ClusterIPs is dropped"
                ),
            },
        );
    }
    let node_port_elsewhere = snapshot
        .family(family)
        .any(|p| p.key.protocol == q.protocol && p.node_port == Some(q.to.port()));
    if node_port_elsewhere && facts.local_ips.contains(&dst) && !facts.nodeport_ips.contains(&dst) {
        let not_served = if dst.is_loopback() {
            match (&facts.localhost_not_served, dst) {
                (Some(why), IpAddr::V4(_)) => format!(
                    "node ports on 127.0.0.1 are not served although \
                     --iptables-localhost-nodeports asks for them ({why})"
                ),
                _ => "loopback is never a node-port address here (kube-proxy's nftables \
                      mode never serves node ports on loopback; its iptables mode serves IPv4 \
                      ones on 127.0.0.1 only with --iptables-localhost-nodeports)"
                    .to_string(),
            }
        } else {
            let served: Vec<String> = facts
                .nodeport_ips
                .iter()
                .filter(|ip| Family::of(ip) == family)
                .map(ToString::to_string)
                .collect();
            format!(
                "it is not one of the node-port addresses (--nodeport-addresses {}: {})",
                facts.nodeport_setting,
                if served.is_empty() {
                    format!("no {family} address")
                } else {
                    served.join(", ")
                }
            )
        };
        return Trace::unmatched(
            Verdict::Accept,
            format!(
                "{}, but {not_served}: node port {port}/{proto} is not served on it, so the \
                 packet goes to the node untouched: nothing is proxied there, only a process \
                 of the node listening on {port}/{proto} answers, and without one the client \
                 is refused (ECONNREFUSED)",
                whose(dst, facts),
                port = q.to.port(),
                proto = q.protocol
            ),
        );
    }
    if facts.local_ips.contains(&dst) || facts.nodeport_ips.contains(&dst) {
        // A health-check node port (eTP Local): no Service rule, kpng itself answers on the
        // node. Load balancers probe it from outside, and a host firewall dropping it takes
        // the node out of the Service's pool.
        let checked: Vec<String> = snapshot
            .family(family)
            .filter(|p| {
                q.protocol == Protocol::Tcp && p.health_check_node_port == Some(q.to.port())
            })
            .map(|p| p.key.service.to_string())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if !checked.is_empty() && !facts.health_checks_listen_on(dst) {
            // As the NodePort on an address outside `--nodeport-addresses`: nothing of
            // kpng's listens there, and a load balancer probing this address is refused.
            let listening: Vec<String> = facts
                .health_check_ips
                .iter()
                .flatten()
                .filter(|ip| Family::of(ip) == family)
                .map(ToString::to_string)
                .collect();
            return Trace::unmatched(
                Verdict::Accept,
                format!(
                    "{}, but the Service health checks do not listen on it (--nodeport-addresses \
                     {}: they listen on {}): {port}/TCP is the health-check node port of {} \
                     (externalTrafficPolicy Local), not served on this address, so the packet \
                     goes to the node untouched: only a process of the node listening on \
                     {port}/TCP answers, and without one the client is refused (ECONNREFUSED); a \
                     load balancer probing this address sees the node as down",
                    whose(dst, facts),
                    facts.nodeport_setting,
                    if listening.is_empty() {
                        format!("no {family} address")
                    } else {
                        listening.join(", ")
                    },
                    checked.join(", "),
                    port = q.to.port(),
                ),
            );
        }
        if !checked.is_empty() {
            return Trace::unmatched(
                Verdict::Accept,
                format!(
                    "{}; {}/TCP is the health-check node port of {} (externalTrafficPolicy \
                     Local): no Service rule, kpng's health-check server answers it on the node \
                     (200 while the node has a ready local endpoint); load balancers probe it \
                     from outside, so a host firewall that drops it takes the node out of the \
                     pool",
                    whose(dst, facts),
                    q.to.port(),
                    checked.join(", ")
                ),
            );
        }
        return Trace::unmatched(
            Verdict::Accept,
            format!(
                "{}; no node port {}/{} here",
                whose(dst, facts),
                q.to.port(),
                q.protocol
            ),
        );
    }
    match shown {
        Some(shown) => Trace::unmatched(Verdict::None, format!("{shown}; kpng does not touch it")),
        None => Trace::unmatched(Verdict::None, format!("{} is not a Service address", q.to)),
    }
}

/// Whose address `dst` is, one of the node's: the host's, or only the Node object's.
fn whose(dst: IpAddr, facts: &NodeFacts) -> String {
    if facts.node_ips_not_on_host.contains(&dst) {
        format!("{dst} is the Node object's address, not present on the host")
    } else {
        format!("{dst} is this node's")
    }
}

/// Why ClusterIP traffic of `family` is not masqueraded when no rule of the family tells pods
/// apart: the detector has nothing of that family to match (kube-proxy's no-op detector).
fn no_detector(local_pods: &LocalPods, family: Family) -> String {
    let nothing = format!(
        "so the local-traffic detector does nothing for {family}: no {family} ClusterIP \
         traffic is masqueraded for coming from outside the cluster (as kube-proxy)"
    );
    match local_pods {
        LocalPods::Cidrs(_) => format!(
            "no {family} cluster CIDR is given (--cluster-cidr, --detect-local-mode \
             ClusterCIDR), {nothing}"
        ),
        LocalPods::NodeCidrs(_) => format!(
            "the Node has no {family} pod CIDR (spec.podCIDRs, --detect-local-mode NodeCIDR), \
             {nothing}"
        ),
        LocalPods::None | LocalPods::Interface { .. } => {
            format!("--detect-local-mode None tells no source apart, {nothing}")
        }
    }
}

/// Whether the rules tell pods from other sources in `source`'s family, as the backends
/// write them: CIDRs detect only in a family they have one of (without `--cluster-cidr`, or
/// with one family's only, the other family has no rule and no ClusterIP traffic of it is
/// masqueraded for coming from outside, as in kube-proxy); interfaces detect in both.
fn is_detecting(facts: &NodeFacts, source: IpAddr) -> bool {
    match &facts.local_pods {
        LocalPods::None => false,
        LocalPods::Cidrs(cidrs) | LocalPods::NodeCidrs(cidrs) => cidrs
            .iter()
            .any(|c| Family::of(&c.addr()) == Family::of(&source)),
        LocalPods::Interface { .. } => true,
    }
}

/// Whether the source of `q` is a pod's, as the rules decide, and how to say so.
struct PodSource {
    /// The rules take the packet for a pod's.
    is_pod: bool,
    /// "the source is a pod (--detect-local-mode)", or the interface it arrives on.
    pod_words: String,
    /// "the source is not a pod (--detect-local-mode)", likewise.
    not_pod_words: String,
    /// What the trace assumed or was told about the input interface ([`Trace::interface`]).
    note: Option<String>,
    /// The note is worth showing whatever decided (a given interface the detector ignores).
    note_always: bool,
}

fn pod_source(facts: &NodeFacts, q: &TraceQuery) -> PodSource {
    let by_address = |is_pod: bool, note: Option<String>| PodSource {
        is_pod,
        pod_words: "the source is a pod (--detect-local-mode)".into(),
        not_pod_words: "the source is not a pod (--detect-local-mode)".into(),
        note_always: note.is_some(),
        note,
    };
    let ignored = |mode: &str| {
        q.in_interface.as_ref().map(|i| {
            format!(
                "--in-interface {i} is not used: --detect-local-mode {mode} tells pods by the \
                 source address, not by the input interface"
            )
        })
    };
    match &facts.local_pods {
        LocalPods::None => by_address(false, ignored("None")),
        LocalPods::Cidrs(cidrs) => by_address(
            cidrs.iter().any(|c| c.contains(&q.from)),
            ignored("ClusterCIDR"),
        ),
        LocalPods::NodeCidrs(cidrs) => by_address(
            cidrs.iter().any(|c| c.contains(&q.from)),
            ignored("NodeCIDR"),
        ),
        LocalPods::Interface { rule, assumed } => match &q.in_interface {
            Some(iif) => {
                let is_pod = rule.matches(iif);
                PodSource {
                    is_pod,
                    pod_words: format!(
                        "it arrives on {iif}, so it is a pod's ({})",
                        rule.setting()
                    ),
                    not_pod_words: format!(
                        "it arrives on {iif}, so it is not a pod's ({})",
                        rule.setting()
                    ),
                    note: Some(format!(
                        "arrives on {iif}: {} ({}; {})",
                        if is_pod { "a pod's" } else { "not a pod's" },
                        rule.setting(),
                        rule.words()
                    )),
                    note_always: false,
                }
            }
            None => {
                let is_pod = assumed.iter().any(|c| c.contains(&q.from));
                let why = if assumed.is_empty() {
                    "the Node has no pod CIDR".to_string()
                } else if is_pod {
                    format!("it is inside the Node's pod CIDRs ({})", join(assumed))
                } else {
                    format!("it is outside the Node's pod CIDRs ({})", join(assumed))
                };
                PodSource {
                    is_pod,
                    pod_words: "the source is taken for a pod (see interface)".into(),
                    not_pod_words: "the source is not taken for a pod (see interface)".into(),
                    note: Some(format!(
                        "depends on the input interface, which the rules decide by ({}: {}); \
                         not told it, this trace assumed {} arrives {}, as {why}; \
                         `--in-interface NAME` traces it as arriving on NAME",
                        rule.setting(),
                        rule.words(),
                        q.from,
                        if is_pod { "on it" } else { "elsewhere" }
                    )),
                    note_always: false,
                }
            }
        },
    }
}

/// Why `--masquerade-all` does not masquerade a node port, an external IP or a load-balancer
/// IP: kube-proxy's masquerade-all rule matches ClusterIP destinations only.
fn masquerade_all_note(facts: &NodeFacts) -> &'static str {
    if facts.masquerade_all {
        " (--masquerade-all masquerades ClusterIP destinations only)"
    } else {
        ""
    }
}

fn join(ranges: &[IpNet]) -> String {
    ranges
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests;
