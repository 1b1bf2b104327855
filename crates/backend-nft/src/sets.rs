//! The one declaration of every named set and map of our table.
//!
//! Why one table: the skeleton's `set`/`map` lines ([`crate::ruleset::skeleton`]), the byte
//! layout the netlink writer encodes elements with ([`crate::netlink`]) and the list of sets a
//! full sync flushes all come from [`Set::decl`]. Before, each was kept by hand (or parsed back
//! out of the skeleton text) and could drift; now a set exists exactly once.

use std::fmt::Write as _;

use kpng_model::{Family, Protocol};

use crate::ruleset::{Fam, PickKind};

/// One field of a key or value, as nft's datatypes lay it out in a register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    /// `ipv4_addr` (4 bytes) or `ipv6_addr` (16 bytes) by the table's family, network order.
    Addr,
    /// `inet_proto` (`meta l4proto`): 1 byte.
    Proto,
    /// `inet_service` (`th dport`): 2 bytes, network order.
    Port,
    /// `mark` (`ct mark`): 4 bytes, host order.
    Mark,
    /// The `numgen random mod 1` slot of the endpoint maps (and the client hash of the IPv6
    /// affinity maps): a 4-byte integer in host order. Only `typeof` declarations can name it.
    Slot,
}

impl Field {
    /// The datatype a `type` declaration names.
    fn type_name(self, fam: Fam) -> &'static str {
        match self {
            Field::Addr => fam.addr_type(),
            Field::Proto => "inet_proto",
            Field::Port => "inet_service",
            Field::Mark => "mark",
            // Never used: a test checks that no `type` declaration has a slot.
            Field::Slot => "integer",
        }
    }

    /// The expression a `typeof` declaration names; `port` is the port's protocol keyword
    /// (`tcp`, `udp`, `sctp` or `th`).
    fn typeof_expr(self, fam: Fam, port: &str, out: &mut String) {
        let _ = match self {
            Field::Addr => write!(out, "{} daddr", fam.l3()),
            Field::Proto => write!(out, "meta l4proto"),
            Field::Port => write!(out, "{port} dport"),
            Field::Mark => write!(out, "ct mark"),
            Field::Slot => write!(out, "numgen random mod 1"),
        };
    }
}

/// What a map stores per element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Data {
    /// A set: no value.
    None,
    /// A verdict map (`: verdict`).
    Verdict,
    /// A data map: these fields (concatenated and padded like a key when more than one).
    Fields(&'static [Field]),
}

/// The set's flags, and the declaration text that goes with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flags {
    /// None.
    None,
    /// `flags interval`: elements may be prefixes and ranges.
    Interval,
    /// `flags dynamic,timeout; timeout 1d; size 1048576`: the packet path writes the entries
    /// (ClientIP affinity); kpng never flushes them, so stickiness survives restarts (each
    /// port keeps its affinity id, read back at start-up: [`crate::affinity_seed`]).
    Dynamic,
}

/// How an interval set stores a range (what the kernel's set backend expects).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interval {
    /// Not an interval set: one exact key per element.
    None,
    /// A one-field interval set (the kernel's rbtree): a start element and an end element whose
    /// key is the last value + 1, flagged `NFT_SET_ELEM_INTERVAL_END`.
    Single,
    /// An interval set with a concatenated key (the kernel's pipapo): one element with
    /// `NFTA_SET_ELEM_KEY` (first values) and `NFTA_SET_ELEM_KEY_END` (last values).
    Concat,
}

/// How the declaration spells its key and data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spelling {
    /// `type ipv4_addr . inet_proto : verdict`: datatypes.
    Type,
    /// `typeof ip daddr . tcp dport : …`: expressions, needed where a datatype cannot say it
    /// (the `numgen` slot, a protocol-specific port). The string is the port's protocol keyword.
    Typeof(&'static str),
}

/// Everything about one set or map: name, layout, flags, and how nft declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetDecl {
    /// The set's name in the table.
    pub name: &'static str,
    /// The key's fields, in order.
    pub key: &'static [Field],
    /// The map's value.
    pub data: Data,
    /// Flags.
    pub flags: Flags,
    /// `type` or `typeof`.
    pub spelling: Spelling,
    /// The set's comment (shown by `nft list`).
    pub comment: Option<&'static str>,
    /// The only family whose table has this set; `None`: both.
    pub family: Option<Family>,
}

impl SetDecl {
    /// How elements of this set hold ranges.
    pub fn interval(&self) -> Interval {
        match (self.flags, self.key.len()) {
            (Flags::Interval, 1) => Interval::Single,
            (Flags::Interval, _) => Interval::Concat,
            _ => Interval::None,
        }
    }

    /// The declaration line of the skeleton (without indentation and newline).
    pub fn render(&self, fam: Fam) -> String {
        let kind = if self.data == Data::None {
            "set"
        } else {
            "map"
        };
        let mut s = format!("{kind} {} {{ ", self.name);
        let fields = |s: &mut String, fields: &[Field]| {
            for (i, f) in fields.iter().enumerate() {
                if i > 0 {
                    s.push_str(" . ");
                }
                match self.spelling {
                    Spelling::Type => s.push_str(f.type_name(fam)),
                    Spelling::Typeof(port) => f.typeof_expr(fam, port, s),
                }
            }
        };
        s.push_str(match self.spelling {
            Spelling::Type => "type ",
            Spelling::Typeof(_) => "typeof ",
        });
        fields(&mut s, self.key);
        match self.data {
            Data::None => {}
            Data::Verdict => s.push_str(" : verdict"),
            Data::Fields(data) => {
                s.push_str(" : ");
                fields(&mut s, data);
            }
        }
        match self.flags {
            Flags::None => {}
            Flags::Interval => s.push_str("; flags interval"),
            Flags::Dynamic => s.push_str("; flags dynamic,timeout; timeout 1d; size 1048576"),
        }
        if let Some(c) = self.comment {
            let _ = write!(s, "; comment \"{c}\"");
        }
        s.push_str("; }");
        s
    }
}

/// A set or map of our table. The variants are the table's sets; [`Set::decl`] says everything
/// about each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Set {
    /// `cluster-ips`.
    ClusterIps,
    /// `nodeport-ips`.
    NodeportIps,
    /// `service-cidrs`.
    ServiceCidrs,
    /// `firewall-ips`.
    FirewallIps,
    /// `firewall-allow`.
    FirewallAllow,
    /// `hairpin-connections`.
    HairpinConnections,
    /// `affinity-valid`.
    AffinityValid,
    /// `service-ips`.
    ServiceIps,
    /// `service-nodeports`.
    ServiceNodeports,
    /// `no-endpoint-services`.
    NoEndpointServices,
    /// `no-endpoint-nodeports`.
    NoEndpointNodeports,
    /// `affinity-timeouts`.
    AffinityTimeouts,
    /// The verdict map from an entry point to its `*-n<k>` chain (`cluster-pick`, …).
    Pick(PickKind),
    /// The endpoint slots a `*-n<k>` chain selects from, per L4 protocol
    /// (`cluster-endpoints-tcp`, …).
    Endpoints(PickKind, Protocol),
    /// Entry point . one bit of its list's affinity id (`affinity-bits-cluster`, …): the
    /// affinity chains set the id in the conntrack mark one bit at a time, from these sets.
    AffinityBits(PickKind),
    /// IPv4 ClientIP affinity, written by the packet path (`affinity`).
    Affinity,
    /// IPv6 ClientIP affinity, endpoint address (`affinity-addr`).
    AffinityAddr,
    /// IPv6 ClientIP affinity, endpoint port (`affinity-port`).
    AffinityPort,
}

use Field::{Addr, Mark, Port, Proto, Slot};

const VIP: &[Field] = &[Addr, Proto, Port];
const NODE_PORT: &[Field] = &[Proto, Port];
const ENDPOINT: &[Field] = &[Addr, Port];

const fn decl(name: &'static str, key: &'static [Field], data: Data) -> SetDecl {
    SetDecl {
        name,
        key,
        data,
        flags: Flags::None,
        spelling: Spelling::Type,
        comment: None,
        family: None,
    }
}

const fn commented(
    name: &'static str,
    key: &'static [Field],
    data: Data,
    comment: &'static str,
) -> SetDecl {
    SetDecl {
        comment: Some(comment),
        ..decl(name, key, data)
    }
}

const fn interval(decl: SetDecl) -> SetDecl {
    SetDecl {
        flags: Flags::Interval,
        ..decl
    }
}

const fn protocol_word(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

impl Set {
    /// Every set and map, in skeleton order.
    pub const ALL: [Set; 35] = {
        use PickKind::{Cluster, Local, NodePortCluster, NodePortLocal};
        use Protocol::{Sctp, Tcp, Udp};
        [
            Set::ClusterIps,
            Set::NodeportIps,
            Set::ServiceCidrs,
            Set::FirewallIps,
            Set::FirewallAllow,
            Set::HairpinConnections,
            Set::AffinityValid,
            Set::ServiceIps,
            Set::ServiceNodeports,
            Set::NoEndpointServices,
            Set::NoEndpointNodeports,
            Set::AffinityTimeouts,
            Set::Pick(Cluster),
            Set::Pick(Local),
            Set::Pick(NodePortCluster),
            Set::Pick(NodePortLocal),
            Set::Endpoints(Cluster, Tcp),
            Set::Endpoints(Cluster, Udp),
            Set::Endpoints(Cluster, Sctp),
            Set::Endpoints(Local, Tcp),
            Set::Endpoints(Local, Udp),
            Set::Endpoints(Local, Sctp),
            Set::Endpoints(NodePortCluster, Tcp),
            Set::Endpoints(NodePortCluster, Udp),
            Set::Endpoints(NodePortCluster, Sctp),
            Set::Endpoints(NodePortLocal, Tcp),
            Set::Endpoints(NodePortLocal, Udp),
            Set::Endpoints(NodePortLocal, Sctp),
            Set::AffinityBits(Cluster),
            Set::AffinityBits(Local),
            Set::AffinityBits(NodePortCluster),
            Set::AffinityBits(NodePortLocal),
            Set::Affinity,
            Set::AffinityAddr,
            Set::AffinityPort,
        ]
    };

    /// The set's declaration.
    pub const fn decl(self) -> SetDecl {
        use PickKind::{Cluster, Local, NodePortCluster, NodePortLocal};
        use Protocol::{Sctp, Tcp, Udp};
        match self {
            Set::ClusterIps => commented("cluster-ips", &[Addr], Data::None, "Active ClusterIPs"),
            Set::NodeportIps => commented(
                "nodeport-ips",
                &[Addr],
                Data::None,
                "IPs that accept NodePort traffic",
            ),
            Set::ServiceCidrs => interval(commented(
                "service-cidrs",
                &[Addr],
                Data::None,
                "ServiceCIDRs: unallocated ClusterIPs are dropped",
            )),
            Set::FirewallIps => commented(
                "firewall-ips",
                VIP,
                Data::None,
                "destinations subject to loadBalancerSourceRanges",
            ),
            Set::FirewallAllow => interval(commented(
                "firewall-allow",
                &[Addr, Proto, Port, Addr],
                Data::None,
                "destination . allowed source range",
            )),
            Set::HairpinConnections => commented(
                "hairpin-connections",
                &[Addr, Addr, Proto, Port],
                Data::None,
                "endpoints reaching themselves",
            ),
            Set::AffinityValid => commented(
                "affinity-valid",
                &[Mark, Addr, Port],
                Data::None,
                "affinity id . live endpoint",
            ),
            Set::ServiceIps => commented(
                "service-ips",
                VIP,
                Data::Verdict,
                "ClusterIP, external IP and load-balancer IP dispatch",
            ),
            Set::ServiceNodeports => commented(
                "service-nodeports",
                NODE_PORT,
                Data::Verdict,
                "NodePort dispatch",
            ),
            Set::NoEndpointServices => commented(
                "no-endpoint-services",
                VIP,
                Data::Verdict,
                "drop or reject VIP traffic without endpoints",
            ),
            Set::NoEndpointNodeports => commented(
                "no-endpoint-nodeports",
                NODE_PORT,
                Data::Verdict,
                "drop or reject NodePort traffic without endpoints",
            ),
            Set::AffinityTimeouts => commented(
                "affinity-timeouts",
                &[Mark],
                Data::Verdict,
                "affinity id to its recording chain",
            ),
            Set::Pick(kind) => {
                let name = match kind {
                    Cluster => "cluster-pick",
                    Local => "local-pick",
                    NodePortCluster => "nodeport-cluster-pick",
                    NodePortLocal => "nodeport-local-pick",
                };
                decl(name, entry_key(kind), Data::Verdict)
            }
            // One map per protocol because the map's value type must name the protocol's port
            // (`tcp dport`): with a shared map nft 1.0.6 silently restricts the rule to TCP, and
            // with `th dport` it refuses rules added in a later transaction.
            Set::Endpoints(kind, protocol) => {
                let name = match (kind, protocol) {
                    (Cluster, Tcp) => "cluster-endpoints-tcp",
                    (Cluster, Udp) => "cluster-endpoints-udp",
                    (Cluster, Sctp) => "cluster-endpoints-sctp",
                    (Local, Tcp) => "local-endpoints-tcp",
                    (Local, Udp) => "local-endpoints-udp",
                    (Local, Sctp) => "local-endpoints-sctp",
                    (NodePortCluster, Tcp) => "nodeport-cluster-endpoints-tcp",
                    (NodePortCluster, Udp) => "nodeport-cluster-endpoints-udp",
                    (NodePortCluster, Sctp) => "nodeport-cluster-endpoints-sctp",
                    (NodePortLocal, Tcp) => "nodeport-local-endpoints-tcp",
                    (NodePortLocal, Udp) => "nodeport-local-endpoints-udp",
                    (NodePortLocal, Sctp) => "nodeport-local-endpoints-sctp",
                };
                let key: &'static [Field] = if kind.keyed_by_vip() {
                    &[Addr, Port, Slot]
                } else {
                    &[Port, Slot]
                };
                SetDecl {
                    spelling: Spelling::Typeof(protocol_word(protocol)),
                    ..decl(name, key, Data::Fields(ENDPOINT))
                }
            }
            Set::AffinityBits(kind) => {
                let name = match kind {
                    Cluster => "affinity-bits-cluster",
                    Local => "affinity-bits-local",
                    NodePortCluster => "nodeport-affinity-bits-cluster",
                    NodePortLocal => "nodeport-affinity-bits-local",
                };
                let key: &'static [Field] = if kind.keyed_by_vip() {
                    &[Addr, Proto, Port, Mark]
                } else {
                    &[Proto, Port, Mark]
                };
                decl(name, key, Data::None)
            }
            // IPv4: one map `client . affinity id → endpoint . port`. IPv6 needs another shape
            // (see `Fam::affinity`): key `affinity id . jhash(client)`, and the endpoint's
            // address and port in two maps.
            Set::Affinity => SetDecl {
                flags: Flags::Dynamic,
                family: Some(Family::V4),
                ..commented(
                    "affinity",
                    &[Addr, Mark],
                    Data::Fields(ENDPOINT),
                    "ClientIP session affinity: client . affinity id → endpoint",
                )
            },
            Set::AffinityAddr => SetDecl {
                flags: Flags::Dynamic,
                family: Some(Family::V6),
                spelling: Spelling::Typeof("th"),
                ..commented(
                    "affinity-addr",
                    &[Mark, Slot],
                    Data::Fields(&[Addr]),
                    "ClientIP session affinity: affinity id . client hash → endpoint",
                )
            },
            Set::AffinityPort => SetDecl {
                flags: Flags::Dynamic,
                family: Some(Family::V6),
                spelling: Spelling::Typeof("th"),
                ..commented(
                    "affinity-port",
                    &[Mark, Slot],
                    Data::Fields(&[Port]),
                    "ClientIP session affinity: affinity id . client hash → endpoint port",
                )
            },
        }
    }

    /// The set's name in the table.
    pub const fn name(self) -> &'static str {
        self.decl().name
    }

    /// Whether `family`'s table has this set.
    pub fn in_family(self, family: Family) -> bool {
        self.decl().family.is_none_or(|f| f == family)
    }

    /// The sets of `family`'s table, in skeleton order.
    pub fn of_family(family: Family) -> impl Iterator<Item = Set> {
        Set::ALL.into_iter().filter(move |s| s.in_family(family))
    }

    /// The sets of `family`'s table whose elements kpng owns (and a full sync flushes): every
    /// one but the dynamic affinity maps, whose entries the packet path writes (keeping them
    /// keeps stickiness across restarts and full syncs).
    pub fn owned(family: Family) -> impl Iterator<Item = Set> {
        Set::of_family(family).filter(|s| s.decl().flags != Flags::Dynamic)
    }

    /// The dynamic sets (affinity), whose elements change without us: their element
    /// notifications are not tampering.
    pub fn dynamic() -> impl Iterator<Item = Set> {
        Set::ALL
            .into_iter()
            .filter(|s| s.decl().flags == Flags::Dynamic)
    }
}

impl std::fmt::Display for Set {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The key of an entry point's maps: a VIP (`addr . proto . port`) or a node port.
const fn entry_key(kind: PickKind) -> &'static [Field] {
    match kind {
        PickKind::Cluster | PickKind::Local => VIP,
        PickKind::NodePortCluster | PickKind::NodePortLocal => NODE_PORT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn every_set_is_listed_once_with_a_unique_name() {
        let mut names: Vec<&str> = Set::ALL.iter().map(|s| s.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Set::ALL.len());
    }

    #[test]
    fn type_declarations_never_name_a_slot_and_intervals_are_sets() {
        for set in Set::ALL {
            let d = set.decl();
            let data = match d.data {
                Data::Fields(f) => f,
                _ => &[],
            };
            if d.spelling == Spelling::Type {
                assert!(!d.key.contains(&Slot) && !data.contains(&Slot), "{set:?}");
            }
            if d.flags == Flags::Interval {
                assert_eq!(d.data, Data::None, "{set:?}");
            }
        }
    }

    #[test]
    fn families_have_their_affinity_maps() {
        let v4: Vec<&str> = Set::of_family(Family::V4).map(Set::name).collect();
        let v6: Vec<&str> = Set::of_family(Family::V6).map(Set::name).collect();
        assert!(v4.contains(&"affinity") && !v4.contains(&"affinity-addr"));
        assert!(v6.contains(&"affinity-addr") && v6.contains(&"affinity-port"));
        assert!(!v6.contains(&"affinity"));
        // Only the dynamic affinity maps are not owned; a failure names the sets that differ.
        for (family, dynamic) in [
            (Family::V4, vec!["affinity"]),
            (Family::V6, vec!["affinity-addr", "affinity-port"]),
        ] {
            let all: BTreeSet<&str> = Set::of_family(family).map(Set::name).collect();
            let owned: BTreeSet<&str> = Set::owned(family).map(Set::name).collect();
            let not_owned: Vec<&str> = all.difference(&owned).copied().collect();
            assert_eq!(
                not_owned, dynamic,
                "{family:?}: sets a full sync does not flush"
            );
            assert_eq!(
                owned.len(),
                32,
                "{family:?}: owned sets changed in number (a set added or removed?): {owned:?}"
            );
        }
    }
}
