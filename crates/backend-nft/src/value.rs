//! Typed keys and values of set and map elements.
//!
//! Why typed: the same element goes to the kernel two ways, as nft text (`Display`, exactly
//! the text nft reads) and as netlink bytes (`crate::netlink`, from the fields directly). With
//! text as the model, the netlink writer had to parse every element back, and a verdict's
//! chain had to be found again by parsing `goto …`. Typed values are also smaller than their
//! text: a key is at most 40 bytes inline and allocates nothing.
//!
//! A key or value is one of a few *shapes* (`addr . proto . port`, …) rather than a list of
//! fields, which keeps it compact; [`Key::fields`] and [`Value::fields`] give the fields in
//! order, which the encoder checks against the set's declaration ([`crate::sets`]).

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use kpng_model::Protocol;

use crate::ruleset::DynamicChain;
use crate::sets::Field;

/// One field value of a key or value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValue {
    /// An address.
    Addr(IpAddr),
    /// A prefix (only in `flags interval` sets): the range of its addresses.
    Net(IpNet),
    /// An L4 protocol.
    Proto(Protocol),
    /// A port.
    Port(u16),
    /// A conntrack mark (affinity ids); written in hex.
    Mark(u32),
    /// An endpoint slot or client hash; written in decimal.
    Slot(u32),
}

impl FieldValue {
    /// The field kind this value fills.
    pub fn kind(self) -> Field {
        match self {
            FieldValue::Addr(_) | FieldValue::Net(_) => Field::Addr,
            FieldValue::Proto(_) => Field::Proto,
            FieldValue::Port(_) => Field::Port,
            FieldValue::Mark(_) => Field::Mark,
            FieldValue::Slot(_) => Field::Slot,
        }
    }
}

impl fmt::Display for FieldValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FieldValue::Addr(a) => a.fmt(f),
            FieldValue::Net(n) => n.fmt(f),
            FieldValue::Proto(p) => f.write_str(p.lower()),
            FieldValue::Port(p) => p.fmt(f),
            FieldValue::Mark(m) => write!(f, "{m:#x}"),
            FieldValue::Slot(s) => s.fmt(f),
        }
    }
}

/// The fields of one key or value, in order, on the stack.
#[derive(Debug, Clone, Copy)]
pub struct Fields {
    items: [FieldValue; 4],
    len: usize,
}

impl Fields {
    fn of(items: &[FieldValue]) -> Fields {
        let mut out = Fields {
            items: [FieldValue::Port(0); 4],
            len: items.len().min(4),
        };
        out.items[..out.len].copy_from_slice(&items[..out.len]);
        out
    }

    /// The fields.
    pub fn as_slice(&self) -> &[FieldValue] {
        &self.items[..self.len]
    }
}

impl fmt::Display for Fields {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, v) in self.as_slice().iter().enumerate() {
            if i > 0 {
                f.write_str(" . ")?;
            }
            v.fmt(f)?;
        }
        Ok(())
    }
}

/// The source of a `firewall-allow` element: one address or a prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    /// One address.
    Addr(IpAddr),
    /// A prefix.
    Net(IpNet),
}

impl Source {
    fn field(self) -> FieldValue {
        match self {
            Source::Addr(a) => FieldValue::Addr(a),
            Source::Net(n) => FieldValue::Net(n),
        }
    }
}

/// An element's key, by shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    /// `addr` (`cluster-ips`, `nodeport-ips`).
    Addr(IpAddr),
    /// A prefix (`service-cidrs`).
    Net(IpNet),
    /// `addr . proto . port`: a VIP.
    Vip(IpAddr, Protocol, u16),
    /// `proto . port`: a node port.
    NodePort(Protocol, u16),
    /// `mark`: an affinity id.
    Mark(u32),
    /// `addr . port . slot`: an endpoint slot of a VIP.
    VipSlot(IpAddr, u16, u32),
    /// `port . slot`: an endpoint slot of a node port.
    NodePortSlot(u16, u32),
    /// `mark . addr . port`: an affinity id and one of its endpoints.
    MarkEndpoint(u32, IpAddr, u16),
    /// `addr . addr . proto . port`: an endpoint reaching itself.
    Hairpin(IpAddr, IpAddr, Protocol, u16),
    /// `addr . proto . port . source`: a load-balancer VIP and a source it allows.
    VipSource(IpAddr, Protocol, u16, Source),
    /// `addr . mark`: a client and an affinity id (IPv4 `affinity`).
    ClientMark(IpAddr, u32),
    /// `mark . slot`: an affinity id and a client hash (IPv6 `affinity-addr`/`-port`).
    MarkHash(u32, u32),
    /// `addr . proto . port . mark`: a VIP and one bit of its list's affinity id
    /// (`affinity-bits-*`).
    VipBit(IpAddr, Protocol, u16, u32),
    /// `proto . port . mark`: a node port and one bit of its list's affinity id
    /// (`nodeport-affinity-bits-*`).
    NodePortBit(Protocol, u16, u32),
}

impl Key {
    /// The key of the `affinity-bits-*` element saying that this entry point's (VIP's or node
    /// port's) affinity id has `bit`; `None` for a key that is not an entry point.
    pub fn with_bit(self, bit: u32) -> Option<Key> {
        match self {
            Key::Vip(a, p, port) => Some(Key::VipBit(a, p, port, bit)),
            Key::NodePort(p, port) => Some(Key::NodePortBit(p, port, bit)),
            _ => None,
        }
    }
}

impl Key {
    /// The key's fields, in order.
    pub fn fields(&self) -> Fields {
        use FieldValue as F;
        match *self {
            Key::Addr(a) => Fields::of(&[F::Addr(a)]),
            Key::Net(n) => Fields::of(&[F::Net(n)]),
            Key::Vip(a, p, port) => Fields::of(&[F::Addr(a), F::Proto(p), F::Port(port)]),
            Key::NodePort(p, port) => Fields::of(&[F::Proto(p), F::Port(port)]),
            Key::Mark(m) => Fields::of(&[F::Mark(m)]),
            Key::VipSlot(a, port, slot) => Fields::of(&[F::Addr(a), F::Port(port), F::Slot(slot)]),
            Key::NodePortSlot(port, slot) => Fields::of(&[F::Port(port), F::Slot(slot)]),
            Key::MarkEndpoint(m, a, port) => Fields::of(&[F::Mark(m), F::Addr(a), F::Port(port)]),
            Key::Hairpin(a, b, p, port) => {
                Fields::of(&[F::Addr(a), F::Addr(b), F::Proto(p), F::Port(port)])
            }
            Key::VipSource(a, p, port, s) => {
                Fields::of(&[F::Addr(a), F::Proto(p), F::Port(port), s.field()])
            }
            Key::ClientMark(a, m) => Fields::of(&[F::Addr(a), F::Mark(m)]),
            Key::MarkHash(m, h) => Fields::of(&[F::Mark(m), F::Slot(h)]),
            Key::VipBit(a, p, port, bit) => {
                Fields::of(&[F::Addr(a), F::Proto(p), F::Port(port), F::Mark(bit)])
            }
            Key::NodePortBit(p, port, bit) => {
                Fields::of(&[F::Proto(p), F::Port(port), F::Mark(bit)])
            }
        }
    }
}

impl Key {
    /// The key of these fields (as [`crate::netlink::decode::key_fields`] reads them back):
    /// the inverse of [`Key::fields`] for every shape but the prefixes of interval sets;
    /// `None` for a sequence no key has. A restart uses it to delete, by key, the elements
    /// the kernel holds that kpng does not want.
    pub fn from_fields(fields: &[FieldValue]) -> Option<Key> {
        use FieldValue as F;
        Some(match *fields {
            [F::Addr(a)] => Key::Addr(a),
            [F::Addr(a), F::Proto(p), F::Port(port)] => Key::Vip(a, p, port),
            [F::Proto(p), F::Port(port)] => Key::NodePort(p, port),
            [F::Mark(m)] => Key::Mark(m),
            [F::Addr(a), F::Port(port), F::Slot(slot)] => Key::VipSlot(a, port, slot),
            [F::Port(port), F::Slot(slot)] => Key::NodePortSlot(port, slot),
            [F::Mark(m), F::Addr(a), F::Port(port)] => Key::MarkEndpoint(m, a, port),
            [F::Addr(a), F::Addr(b), F::Proto(p), F::Port(port)] => Key::Hairpin(a, b, p, port),
            [F::Addr(a), F::Mark(m)] => Key::ClientMark(a, m),
            [F::Mark(m), F::Slot(h)] => Key::MarkHash(m, h),
            [F::Addr(a), F::Proto(p), F::Port(port), F::Mark(bit)] => Key::VipBit(a, p, port, bit),
            [F::Proto(p), F::Port(port), F::Mark(bit)] => Key::NodePortBit(p, port, bit),
            _ => return None,
        })
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fields().fmt(f)
    }
}

/// A chain of the skeleton that verdict elements go to. An enum rather than a name keeps a
/// verdict to a few bytes; a test checks that the skeleton has every one of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FixedChain {
    /// `reject-chain`.
    Reject,
    /// `affinity-cluster`.
    AffinityCluster,
    /// `affinity-local`.
    AffinityLocal,
    /// `external-cluster`.
    ExternalCluster,
    /// `external-local`.
    ExternalLocal,
    /// `external-cluster-affinity`.
    ExternalClusterAffinity,
    /// `external-local-affinity`.
    ExternalLocalAffinity,
    /// `nodeport-external-cluster`.
    NodeportExternalCluster,
    /// `nodeport-external-local`.
    NodeportExternalLocal,
    /// `nodeport-external-cluster-affinity`.
    NodeportExternalClusterAffinity,
    /// `nodeport-external-local-affinity`.
    NodeportExternalLocalAffinity,
}

impl FixedChain {
    /// Every fixed chain.
    pub const ALL: [FixedChain; 11] = [
        FixedChain::Reject,
        FixedChain::AffinityCluster,
        FixedChain::AffinityLocal,
        FixedChain::ExternalCluster,
        FixedChain::ExternalLocal,
        FixedChain::ExternalClusterAffinity,
        FixedChain::ExternalLocalAffinity,
        FixedChain::NodeportExternalCluster,
        FixedChain::NodeportExternalLocal,
        FixedChain::NodeportExternalClusterAffinity,
        FixedChain::NodeportExternalLocalAffinity,
    ];

    /// The chain's name in the skeleton.
    pub fn name(self) -> &'static str {
        match self {
            FixedChain::Reject => "reject-chain",
            FixedChain::AffinityCluster => "affinity-cluster",
            FixedChain::AffinityLocal => "affinity-local",
            FixedChain::ExternalCluster => "external-cluster",
            FixedChain::ExternalLocal => "external-local",
            FixedChain::ExternalClusterAffinity => "external-cluster-affinity",
            FixedChain::ExternalLocalAffinity => "external-local-affinity",
            FixedChain::NodeportExternalCluster => "nodeport-external-cluster",
            FixedChain::NodeportExternalLocal => "nodeport-external-local",
            FixedChain::NodeportExternalClusterAffinity => "nodeport-external-cluster-affinity",
            FixedChain::NodeportExternalLocalAffinity => "nodeport-external-local-affinity",
        }
    }
}

/// The target of a `goto` or `jump`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Chain {
    /// A chain of the skeleton.
    Fixed(FixedChain),
    /// A chain created on demand.
    Dynamic(DynamicChain),
}

impl fmt::Display for Chain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Chain::Fixed(chain) => f.write_str(chain.name()),
            Chain::Dynamic(chain) => chain.fmt(f),
        }
    }
}

/// A verdict of a verdict map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// `drop`.
    Drop,
    /// `accept`.
    Accept,
    /// `return`.
    Return,
    /// `continue`.
    Continue,
    /// `goto CHAIN`.
    Goto(Chain),
    /// `jump CHAIN`.
    Jump(Chain),
}

impl Verdict {
    /// `goto` a chain of the skeleton.
    pub fn goto(chain: FixedChain) -> Verdict {
        Verdict::Goto(Chain::Fixed(chain))
    }

    /// The dynamic chain this verdict needs to exist, if any.
    pub fn dynamic_chain(&self) -> Option<DynamicChain> {
        match self {
            Verdict::Goto(Chain::Dynamic(c)) | Verdict::Jump(Chain::Dynamic(c)) => Some(*c),
            _ => None,
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Drop => f.write_str("drop"),
            Verdict::Accept => f.write_str("accept"),
            Verdict::Return => f.write_str("return"),
            Verdict::Continue => f.write_str("continue"),
            Verdict::Goto(c) => write!(f, "goto {c}"),
            Verdict::Jump(c) => write!(f, "jump {c}"),
        }
    }
}

/// A map element's value, by shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Value {
    /// A verdict (verdict maps).
    Verdict(Verdict),
    /// `addr . port`: an endpoint.
    Endpoint(IpAddr, u16),
    /// `mark`: an affinity id.
    Mark(u32),
    /// `addr` (IPv6 `affinity-addr`).
    Addr(IpAddr),
    /// `port` (IPv6 `affinity-port`).
    Port(u16),
}

impl Value {
    /// The value's fields, in order; `None` for a verdict.
    pub fn fields(&self) -> Option<Fields> {
        use FieldValue as F;
        Some(match *self {
            Value::Verdict(_) => return None,
            Value::Endpoint(a, port) => Fields::of(&[F::Addr(a), F::Port(port)]),
            Value::Mark(m) => Fields::of(&[F::Mark(m)]),
            Value::Addr(a) => Fields::of(&[F::Addr(a)]),
            Value::Port(port) => Fields::of(&[F::Port(port)]),
        })
    }

    /// The dynamic chain this value needs to exist, if any.
    pub fn dynamic_chain(&self) -> Option<DynamicChain> {
        match self {
            Value::Verdict(v) => v.dynamic_chain(),
            _ => None,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Verdict(v) => v.fmt(f),
            other => match other.fields() {
                Some(fields) => fields.fmt(f),
                None => Ok(()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ruleset::PickKind;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn text_is_what_nft_reads() {
        let cases: [(String, &str); 12] = [
            (
                Key::VipBit(ip("10.96.0.10"), Protocol::Tcp, 80, 0x1000).to_string(),
                "10.96.0.10 . tcp . 80 . 0x1000",
            ),
            (
                Key::NodePortBit(Protocol::Udp, 30080, 0x8000_0000).to_string(),
                "udp . 30080 . 0x80000000",
            ),
            (
                Key::Vip(ip("10.96.0.10"), Protocol::Tcp, 80).to_string(),
                "10.96.0.10 . tcp . 80",
            ),
            (
                Key::VipSlot(ip("fd00::1"), 53, 2).to_string(),
                "fd00::1 . 53 . 2",
            ),
            (Key::NodePortSlot(30080, 0).to_string(), "30080 . 0"),
            (
                Key::MarkEndpoint(0x6b70000e, ip("10.244.1.9"), 8080).to_string(),
                "0x6b70000e . 10.244.1.9 . 8080",
            ),
            (
                Key::VipSource(
                    ip("198.51.100.21"),
                    Protocol::Sctp,
                    443,
                    Source::Net("192.168.100.0/24".parse().expect("net")),
                )
                .to_string(),
                "198.51.100.21 . sctp . 443 . 192.168.100.0/24",
            ),
            (
                Key::Net("10.200.0.1/32".parse().expect("net")).to_string(),
                "10.200.0.1/32",
            ),
            (
                Value::Verdict(Verdict::Goto(Chain::Dynamic(DynamicChain::Pick(
                    PickKind::NodePortLocal,
                    3,
                ))))
                .to_string(),
                "goto nodeport-local-n3",
            ),
            (
                Value::Verdict(Verdict::goto(FixedChain::Reject)).to_string(),
                "goto reject-chain",
            ),
            (Value::Mark(0x6b70_0010).to_string(), "0x6b700010"),
            (
                Value::Endpoint(ip("10.244.1.2"), 8080).to_string(),
                "10.244.1.2 . 8080",
            ),
        ];
        for (got, want) in cases {
            assert_eq!(got, want);
        }
    }

    #[test]
    fn the_skeleton_has_every_fixed_chain() {
        use crate::ruleset::{Fam, StaticConfig, skeleton};
        for all_local in [false, true] {
            let cfg = StaticConfig {
                masquerade_all: false,
                mark: 0x4000,
                affinity_mask: crate::affinity::DEFAULT_CONNTRACK_MARK_MASK,
                local_match: None,
                non_local_match: None,
                nodeports_on_local_addresses: all_local,
            };
            for family in kpng_model::Family::ALL {
                let s = skeleton(Fam(family), "kpng", &cfg);
                for chain in FixedChain::ALL {
                    assert!(
                        s.contains(&format!("\tchain {} {{\n", chain.name())),
                        "{chain:?}"
                    );
                }
                // Node ports: the listed addresses, or the kernel's "local" (kube-proxy's
                // match-all), in both rules that select them.
                let (set, fib) = (
                    s.matches("daddr @nodeport-ips meta l4proto").count(),
                    s.matches("fib daddr type local").count(),
                );
                assert_eq!((set, fib), if all_local { (0, 2) } else { (2, 0) }, "{s}");
            }
        }
    }
}
