//! Real-packet end-to-end test harness for kpng-rs.
//!
//! A service proxy is only proven by packets: this crate builds a small, throw-away
//! two-node "cluster" out of Linux network namespaces, veth pairs and bridges, runs
//! tiny echo servers in the pods and probes them from anywhere in the topology, so
//! that other crates' tests (which take this crate as a dev-dependency) can program
//! nftables in a node namespace and check where real TCP/UDP traffic ends up.
//!
//! Everything needs root (`CAP_NET_ADMIN` + `CAP_SYS_ADMIN`): guard such tests with
//! [`require_root!`], which skips them when not root, except under `CI` where it fails.
//!
//! # Topology
//!
//! [`Cluster::create`] builds seven namespaces (dual-stack everywhere; every IPv6
//! address is added with `nodad`, so it is usable at once):
//!
//! ```text
//!                       ns "lan": bridge br0 (a dumb switch, no addresses)
//!        192.168.100.0/24, fd00:100::/64
//!   +-------------------------+------------------------+-----------------------+
//!   | eth0 .1 / ::1           | eth0 .2 / ::2          | eth0 .10 / ::10       |
//! +-+-----------------------+ +-+--------------------+ +-+-------------------+
//! | ns node1                | | ns node2             | | ns ext              |
//! | default -> ext          | | default -> ext       | | (external client)   |
//! | 10.244.2/24 -> node2    | | 10.244.1/24 -> node1 | | default -> node1    |
//! | cbr0 10.244.1.1/24      | | cbr0 10.244.2.1/24   | | (configurable)      |
//! |      fd00:244:1::1/64   | |      fd00:244:2::1/64| | no forwarding       |
//! +---+---------------+-----+ +---+------------------+ +---------------------+
//!     |               |           |
//! +---+--------+ +----+-------+ +-+----------+
//! | ns pod1a   | | ns pod1b   | | ns pod2a   |
//! | 10.244.1.2 | | 10.244.1.3 | | 10.244.2.2 |
//! | fd00:244:  | | fd00:244:  | | fd00:244:  |
//! |   1::2     | |   1::3     | |   2::2     |
//! +------------+ +------------+ +------------+
//! ```
//!
//! * [`ClusterBuilder::three_nodes`] adds `node3` (LAN `.3`, pods `10.244.3.0/24`,
//!   `fd00:244:3::/64`) with pod `pod3a` (`10.244.3.2`); every node then routes both other
//!   nodes' pod CIDRs.
//! * Nodes forward (IPv4 and IPv6) and route the other node's pod CIDR via its LAN
//!   address. Their default route points at `ext`, which does **not** forward: a
//!   packet for a Service IP that no proxy rewrote escapes to `ext` and is silently
//!   dropped there (a probe sees `timeout`), so one node's proxy can never hide a bug
//!   in the other's. Each node proxies its own traffic.
//! * `ext` is a plain host on the LAN; its default route points at node1 (or node2,
//!   see [`ClusterBuilder::ext_gateway`]), so ClusterIPs, LoadBalancer IPs and
//!   external IPs probed from `ext` arrive at that node. The conventional Service
//!   ranges are [`addr::SERVICE_CIDR_V4`] and [`addr::SERVICE_CIDR_V6`].
//! * Pods route everything via their node's bridge address. Pods of one node share
//!   the bridge `cbr0`; `bridge-nf-call-iptables`/`ip6tables` are on in the nodes (when
//!   the kernel has `br_netfilter`), so even pod-to-pod traffic on one node crosses
//!   the node's netfilter hooks, as on a real bridge-CNI node.
//! * Interface names: `eth0` on the LAN side of nodes and `ext`, and inside pods;
//!   `cbr0` and `veth-<pod>` in nodes; `br0`, `node1`, `node2`, `ext` in `lan`.
//!
//! All addresses are in [`addr`]. All namespaces are deleted when the [`Cluster`] is
//! dropped (also while a test unwinds from a panic); namespaces left over by a
//! process that was killed are reaped by the next process that creates one.
//!
//! # Traffic helpers
//!
//! * `kpng-echo` (a binary of this crate) answers every TCP connection and every UDP
//!   datagram with one line `NAME LOCALADDR PEERADDR`; start it with
//!   [`Netns::spawn_echo`] or [`Pod::start_echo`].
//! * `kpng-probe` connects or sends and prints one JSON line per attempt; run it
//!   with [`Netns::probe_tcp`], [`Netns::probe_udp`], [`Netns::probe`] or [`spread`],
//!   which parse the answer into a [`ProbeResult`].
//!
//! Tests of other crates find both binaries with [`bin_path`] (which builds them
//! with cargo if needed).
//!
//! ```no_run
//! use std::time::Duration;
//! use kpng_testkit::{Cluster, Outcome, require_root};
//!
//! # fn main() -> kpng_testkit::Result<()> {
//! require_root!(Ok(()));
//! let cluster = Cluster::create("doc")?;
//! let pod = cluster.pod("pod1a");
//! let _echo = pod.start_echo(8080)?;
//! let r = cluster.ext.ns.probe_tcp(format!("{}:8080", pod.ipv4), Duration::from_secs(1))?;
//! assert_eq!(r.outcome, Outcome::Ok);
//! assert_eq!(r.server_name.as_deref(), Some("pod1a"));
//! # Ok(())
//! # }
//! ```

mod bins;
pub mod cgroups;
mod cluster;
mod configmap;
mod error;
mod netns;
mod output;
mod probe;
mod root;

pub use bins::{ENV_BIN_DIR, bin_path, profile_dir_of, sibling_bin};
pub use cluster::{Cluster, ClusterBuilder, Host, Node, NodeId, Pod, addr};
pub use configmap::{ProxyConfigMount, configmap_version};
pub use error::{Error, Result};
pub use netns::{Netns, Spawned, reap_stale, wait_exit};
pub use output::{collect_output, describe_output};
pub use probe::{Outcome, Probe, ProbeLine, ProbeResult, Proto, parse_reply, spread, tally};
pub use root::{SKIPPED_TESTS_ENV, is_root, root_or_skip};
