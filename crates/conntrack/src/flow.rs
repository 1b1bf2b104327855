//! A conntrack entry, reduced to what identifies it and what the reconciler decides on.

use std::fmt;
use std::net::SocketAddr;

use kpng_model::Family;

/// `IPPROTO_UDP`: the only protocol the reconciler ever deletes.
pub const IPPROTO_UDP: u8 = 17;
/// `IPPROTO_TCP`, for tests and benchmarks that create unrelated entries.
pub const IPPROTO_TCP: u8 = 6;
/// `IPS_DST_NAT`: the entry's destination was rewritten (a Service DNAT).
pub const IPS_DST_NAT: u32 = 1 << 5;

/// One direction of a conntrack entry: who sent, to whom.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tuple {
    /// Source address and port.
    pub src: SocketAddr,
    /// Destination address and port.
    pub dst: SocketAddr,
}

impl Tuple {
    /// A tuple from its two ends.
    pub fn new(src: SocketAddr, dst: SocketAddr) -> Tuple {
        Tuple { src, dst }
    }

    /// The other direction of an entry without NAT (`dst → src`).
    pub fn reversed(&self) -> Tuple {
        Tuple {
            src: self.dst,
            dst: self.src,
        }
    }
}

/// One conntrack entry.
///
/// The original tuple is what the client sent (for a Service: client → VIP:port); the reply
/// tuple is what the answer must look like, so after a DNAT its source is the endpoint the
/// entry is pinned to. `id` and `zone` make a delete hit exactly the dumped entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Flow {
    /// The layer-4 protocol number (`IPPROTO_*`).
    pub protocol: u8,
    /// The original direction.
    pub original: Tuple,
    /// The reply direction.
    pub reply: Tuple,
    /// The kernel's id of the entry (`CTA_ID`, as sent by the kernel). A delete carrying it
    /// fails with `ENOENT` instead of removing a newer entry that reuses the tuple.
    pub id: Option<u32>,
    /// The conntrack zone (`CTA_ZONE`), when not the default one.
    pub zone: Option<u16>,
    /// The status bits (`CTA_STATUS`, `IPS_*`).
    pub status: u32,
}

impl Flow {
    /// A UDP entry with the given directions (no id, default zone): for tests and for
    /// creating entries. It counts as DNATed when the reply comes from somewhere else than
    /// the original destination.
    pub fn udp(original: Tuple, reply: Tuple) -> Flow {
        Flow {
            protocol: IPPROTO_UDP,
            original,
            reply,
            id: None,
            zone: None,
            status: if reply.src == original.dst {
                0
            } else {
                IPS_DST_NAT
            },
        }
    }

    /// Whether the entry was DNATed (`IPS_DST_NAT`): what every Service flow is once its
    /// port is programmed.
    pub fn is_dnat(&self) -> bool {
        self.status & IPS_DST_NAT != 0
    }

    /// The entry's IP family (that of its original source).
    pub fn family(&self) -> Family {
        Family::of(&self.original.src.ip())
    }
}

impl fmt::Display for Flow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "proto {} {} -> {} (reply {} -> {})",
            self.protocol, self.original.src, self.original.dst, self.reply.src, self.reply.dst
        )
    }
}
