//! The real-packet end-to-end suite, shared by every backend that programs the node.
//!
//! Each `tests/e2e_<backend>.rs` file is a thin test binary:
//!
//! ```ignore
//! mod e2e;
//! e2e::suite!(e2e::Backend::Nft);
//! ```
//!
//! [`suite!`] generates one `#[test]` per scenario of [`scenarios`] that every backend must
//! pass. Scenarios a backend may document as a limitation are listed in each backend's file
//! (ignored there with the reason, or run as usual). Deliberate differences between backends
//! (docs/backends.md) are data: [`Backend::behaviour`], which the scenarios check.
//!
//! Root only (skipped otherwise, failing under `CI`). Tests marked `#[ignore = "…"]`
//! demonstrate a documented limitation; they pass once it is lifted
//! (`cargo test -p kpng --test e2e_nft -- --ignored`).

// Each backend's test binary compiles this module; not every binary uses every helper.
#![allow(dead_code)]

pub mod faults;
pub mod harness;
pub mod scenarios;
pub mod sockets;
pub mod traced;

/// A backend under test, with the arguments that select it after the global flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `to-local nft`.
    Nft,
    /// `to-local iptables --iptables-mode legacy` (the x_tables kernel API).
    IptablesLegacy,
    /// `to-local iptables --iptables-mode nft` (iptables rules over nf_tables).
    IptablesNft,
    /// `to-local userspace` (a TCP/UDP proxy; a small nftables table captures Service traffic).
    Userspace,
    /// `to-local ebpf` (socket programs for the node's sockets, the nftables ruleset for the
    /// rest). The harness puts node1 and its pods in one cgroup (the programs' scope), the
    /// other namespaces in another ([`harness::ebpf_scope`]).
    Ebpf,
}

/// Where a family's NodePorts are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodePortScope {
    /// The node's primary IPs only.
    PrimaryIps,
    /// Every local address (loopback aside).
    AllLocal,
}

/// What happens to traffic a Service address does not serve (a port no Service uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unserved {
    /// REJECTed (a TCP reset, an ICMP port unreachable for UDP; clients see ECONNREFUSED).
    Rejected,
    /// Left alone: routed on unchanged, as if the proxy did not exist.
    Untouched,
}

/// The documented, deliberate differences between backends (docs/backends.md).
#[derive(Debug, Clone, Copy)]
pub struct Behaviour {
    /// A wrong port on an active ClusterIP.
    pub wrong_port: Unserved,
    /// NodePort addresses without `--nodeport-addresses`.
    pub default_node_port_addresses: NodePortScope,
    /// IPv4 NodePorts also answer on 127.0.0.1 by default.
    pub localhost_node_ports: bool,
    /// Endpoints see the client's own address where no masquerade applies (pod clients,
    /// externalTrafficPolicy Local). A proxy is always the client of its endpoints.
    pub keeps_client_address: bool,
    /// Established connections and new ones keep working while kpng restarts (the kernel holds
    /// the state). A proxy's connections end with it, and new ones are refused until it is back.
    pub serves_over_restart: bool,
    /// Connections from this node's sockets (the node, its pods) are translated at
    /// `connect()`/`sendmsg()`: endpoints see the client's own address, never a masqueraded
    /// one (hairpin, node ports, external IPs and `--masquerade-all` included).
    pub translates_local_sockets: bool,
}

impl Backend {
    /// The arguments after the global flags (`to-local nft`, …).
    pub fn sink_args(self) -> &'static [&'static str] {
        match self {
            Backend::Nft => &["to-local", "nft"],
            Backend::IptablesLegacy => &["to-local", "iptables", "--iptables-mode", "legacy"],
            Backend::IptablesNft => &["to-local", "iptables", "--iptables-mode", "nft"],
            Backend::Userspace => &["to-local", "userspace"],
            Backend::Ebpf => &["to-local", "ebpf"],
        }
    }

    /// A namespace-name prefix for scenario `what` (`nft-cip`, `iptl-cip`, …).
    pub fn prefix(self, what: &str) -> String {
        let tag = match self {
            Backend::Nft => "nft",
            Backend::IptablesLegacy => "iptl",
            Backend::IptablesNft => "iptn",
            Backend::Userspace => "us",
            Backend::Ebpf => "ebpf",
        };
        format!("{tag}-{what}")
    }

    /// Whether an IP that is both an external IP and the load-balancer IP of one Service
    /// port is served as the external IP, without the load balancer's source ranges
    /// (iptables mode's rule order), rather than as the load balancer (nftables mode).
    pub fn external_ips_before_load_balancers(self) -> bool {
        self.iptables_tool().is_some()
    }

    /// The variant's `iptables` tool, for iptables backends.
    pub fn iptables_tool(self) -> Option<&'static str> {
        match self {
            Backend::Nft | Backend::Userspace | Backend::Ebpf => None,
            Backend::IptablesLegacy => Some("iptables-legacy"),
            Backend::IptablesNft => Some("iptables-nft"),
        }
    }

    /// How this backend differs by design.
    pub fn behaviour(self) -> Behaviour {
        match self {
            Backend::Ebpf => Behaviour {
                translates_local_sockets: true,
                ..Backend::Nft.behaviour()
            },
            Backend::Nft => Behaviour {
                wrong_port: Unserved::Rejected,
                default_node_port_addresses: NodePortScope::PrimaryIps,
                localhost_node_ports: false,
                keeps_client_address: true,
                serves_over_restart: true,
                translates_local_sockets: false,
            },
            Backend::IptablesLegacy | Backend::IptablesNft => Behaviour {
                wrong_port: Unserved::Untouched,
                default_node_port_addresses: NodePortScope::AllLocal,
                localhost_node_ports: true,
                keeps_client_address: true,
                serves_over_restart: true,
                translates_local_sockets: false,
            },
            Backend::Userspace => Behaviour {
                wrong_port: Unserved::Rejected,
                default_node_port_addresses: NodePortScope::PrimaryIps,
                localhost_node_ports: false,
                keeps_client_address: false,
                serves_over_restart: false,
                translates_local_sockets: false,
            },
        }
    }
}

/// One `#[test]` per scenario every backend passes, for the backend given
/// (an expression of type [`Backend`]).
macro_rules! suite {
    ($backend:expr) => {
        $crate::e2e::suite!(@tests $backend;
            cluster_ip_from_pod_spreads_over_all_endpoints_without_masquerade,
            cluster_ip_from_node_and_from_outside_is_masqueraded,
            udp_services_are_load_balanced,
            wrong_port_unallocated_ip_and_no_endpoints,
            node_port_default_addresses_and_loopback,
            external_ip_and_load_balancer_source_ranges,
            external_ip_shared_by_two_services_goes_to_the_older,
            own_external_ip_that_is_its_load_balancer_ip,
            external_traffic_policy_local,
            internal_traffic_policy_local,
            hairpin_to_own_service_is_masqueraded,
            session_affinity_client_ip,
            session_affinity_with_external_traffic_policy_local,
            terminating_endpoints_fallback,
            ipv6_cluster_ip_and_node_port,
            live_changes_and_restart_keep_established_connections,
            masquerade_all_masquerades_pod_traffic,
            detect_local_modes,
            node_port_addresses_cidrs,
            node_port_addresses_match_all,
            nothing_is_left_behind,
            health_check_node_port_reports_local_ready_endpoints,
        );
    };
    (@tests $backend:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::e2e::scenarios::$name($backend);
                eprintln!(
                    "{}: {} probes checked against kpng trace",
                    stringify!($name),
                    $crate::e2e::traced::checked()
                );
            }
        )*
    };
}
pub(crate) use suite;
