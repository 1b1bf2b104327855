//! ctnetlink on the wire: requests are built with `netlink-packet-netfilter`'s types; dumps
//! and acknowledgements are read by walking the attributes in place (no allocation per
//! entry), because one dump can carry a million entries.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use kpng_model::Family;
use netlink_packet_core::{
    DefaultNla, Emitable, NLA_F_NESTED, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL,
    NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, NetlinkBuffer, NetlinkHeader, NetlinkMessage,
    NetlinkPayload, Nla, NlasIterator,
};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Protocol, Tuple as NlTuple,
};
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterProtoFamily};

use crate::flow::{Flow, IPPROTO_UDP, IPS_DST_NAT, Tuple};

/// `NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_NEW`: the type of every entry in a dump.
const CT_NEW_MESSAGE: u16 = 1 << 8;

// Top-level conntrack attributes (`enum ctattr_type`).
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_STATUS: u16 = 3;
const CTA_ID: u16 = 12;
const CTA_NAT_DST: u16 = 13;
const CTA_ZONE: u16 = 18;
const CTA_FILTER: u16 = 25;
const CTA_STATUS_MASK: u16 = 26;
// Inside CTA_NAT_DST, and inside its CTA_NAT_PROTO.
const CTA_NAT_V4_MINIP: u16 = 1;
const CTA_NAT_V4_MAXIP: u16 = 2;
const CTA_NAT_PROTO: u16 = 3;
const CTA_NAT_V6_MINIP: u16 = 4;
const CTA_NAT_V6_MAXIP: u16 = 5;
const CTA_PROTONAT_PORT_MIN: u16 = 1;
const CTA_PROTONAT_PORT_MAX: u16 = 2;
// Inside a tuple.
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_TUPLE_ZONE: u16 = 3;
// Inside CTA_TUPLE_IP.
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
// Inside CTA_TUPLE_PROTO.
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
// Inside CTA_FILTER, and its flag bits (the kernel's `CTA_FILTER_F_*`, a stable ABI that
// libnetfilter_conntrack uses too).
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
const FILTER_IP_DST: u32 = 1 << 1;
const FILTER_PROTO_NUM: u32 = 1 << 3;
const FILTER_PROTO_DST_PORT: u32 = 1 << 5;

/// What a dump asks the kernel for, beyond the family (always filtered in the kernel).
///
/// The kernel (5.8+) matches these on the original tuple before it copies an entry out, so a
/// narrow filter costs one walk of the table and nothing per unrelated entry. Older kernels
/// ignore the filter and send every entry of the family; callers re-check every entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DumpFilter {
    /// Every UDP entry.
    Udp,
    /// Every DNATed UDP entry (`IPS_DST_NAT`, kernel 6.1+; older kernels ignore the status
    /// filter and send every UDP entry).
    UdpDnat,
    /// UDP entries whose original destination is this address and port (a Service IP).
    UdpTo(SocketAddr),
    /// UDP entries whose original destination port is this, on any address (a node port).
    UdpToPort(u16),
}

/// What a dump reads, for logs: `DNATed UDP entries`, `UDP to 10.96.0.10:53`.
impl std::fmt::Display for DumpFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DumpFilter::Udp => f.write_str("every UDP entry"),
            DumpFilter::UdpDnat => f.write_str("DNATed UDP entries"),
            DumpFilter::UdpTo(dst) => write!(f, "UDP to {dst}"),
            DumpFilter::UdpToPort(port) => write!(f, "UDP to port {port}"),
        }
    }
}

impl DumpFilter {
    /// Whether an entry passes the filter: what the kernel checks, for fakes and re-checks.
    pub fn matches(&self, flow: &Flow) -> bool {
        flow.protocol == IPPROTO_UDP
            && match self {
                DumpFilter::Udp => true,
                DumpFilter::UdpDnat => flow.is_dnat(),
                DumpFilter::UdpTo(dst) => flow.original.dst == *dst,
                DumpFilter::UdpToPort(port) => flow.original.dst.port() == *port,
            }
    }
}

fn nf_family(family: Family) -> NetfilterProtoFamily {
    match family {
        Family::V4 => NetfilterProtoFamily::IPv4,
        Family::V6 => NetfilterProtoFamily::IPv6,
    }
}

/// Appends one ctnetlink message to `out`.
fn append(out: &mut Vec<u8>, seq: u32, flags: u16, family: Family, body: ConntrackMessage) {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = seq;
    let inner = NetfilterMessage::new(NetfilterHeader::new(nf_family(family), 0, 0), body);
    let mut message = NetlinkMessage::new(header, NetlinkPayload::from(inner));
    message.finalize();
    let start = out.len();
    out.resize(start + message.buffer_len(), 0);
    message.serialize(&mut out[start..]);
}

fn tuple_attributes(protocol: u8, tuple: &Tuple) -> Vec<NlTuple> {
    vec![
        NlTuple::Ip(vec![
            IPTuple::SourceAddress(tuple.src.ip()),
            IPTuple::DestinationAddress(tuple.dst.ip()),
        ]),
        NlTuple::Proto(vec![
            ProtoTuple::Protocol(Protocol::from(protocol)),
            ProtoTuple::SourcePort(tuple.src.port()),
            ProtoTuple::DestinationPort(tuple.dst.port()),
        ]),
    ]
}

/// `IPCTNL_MSG_CT_GET`, for the dump request (sent as an untyped message, see there).
const IPCTNL_MSG_CT_GET: u8 = 1;

/// A nested attribute holding `inner`, flagged `NLA_F_NESTED` (which the typed
/// `ConntrackAttribute::Other` would drop).
fn nested<T: Nla>(kind: u16, inner: &[T]) -> DefaultNla {
    let mut value = vec![0; inner.buffer_len()];
    inner.emit(&mut value);
    DefaultNla::new(kind | NLA_F_NESTED, value)
}

/// A dump request (`IPCTNL_MSG_CT_GET` with `NLM_F_DUMP`) of one family, filtered.
///
/// Built from untyped attributes: the kernel parses `CTA_FILTER` strictly and needs its
/// `NLA_F_NESTED` flag, which `ConntrackAttribute::Other` does not keep.
pub(crate) fn dump_request(out: &mut Vec<u8>, seq: u32, family: Family, filter: &DumpFilter) {
    let mut flags = FILTER_PROTO_NUM;
    let mut tuple = Vec::new();
    let mut proto = vec![ProtoTuple::Protocol(Protocol::Udp)];
    let mut status = Vec::new();
    match filter {
        DumpFilter::Udp => {}
        DumpFilter::UdpDnat => {
            status.push(DefaultNla::new(
                CTA_STATUS,
                IPS_DST_NAT.to_be_bytes().to_vec(),
            ));
            status.push(DefaultNla::new(
                CTA_STATUS_MASK,
                IPS_DST_NAT.to_be_bytes().to_vec(),
            ));
        }
        DumpFilter::UdpTo(dst) => {
            flags |= FILTER_IP_DST | FILTER_PROTO_DST_PORT;
            tuple.push(NlTuple::Ip(vec![IPTuple::DestinationAddress(dst.ip())]));
            proto.push(ProtoTuple::DestinationPort(dst.port()));
        }
        DumpFilter::UdpToPort(port) => {
            flags |= FILTER_PROTO_DST_PORT;
            proto.push(ProtoTuple::DestinationPort(*port));
        }
    }
    tuple.push(NlTuple::Proto(proto));
    let filter_flags = [DefaultNla::new(
        CTA_FILTER_ORIG_FLAGS,
        flags.to_ne_bytes().to_vec(),
    )];
    let mut attributes = vec![
        nested(CTA_TUPLE_ORIG, &tuple),
        nested(CTA_FILTER, &filter_flags),
    ];
    attributes.extend(status);
    append(
        out,
        seq,
        NLM_F_REQUEST | NLM_F_DUMP,
        family,
        ConntrackMessage::Other {
            message_type: IPCTNL_MSG_CT_GET,
            attributes,
        },
    );
}

/// A delete of exactly this entry (tuple, and id and zone when known).
pub(crate) fn delete_request(out: &mut Vec<u8>, seq: u32, flow: &Flow, ack: bool) {
    let mut attributes = vec![ConntrackAttribute::CtaTupleOrig(tuple_attributes(
        flow.protocol,
        &flow.original,
    ))];
    if let Some(id) = flow.id {
        attributes.push(ConntrackAttribute::Other(DefaultNla::new(
            CTA_ID,
            id.to_be_bytes().to_vec(),
        )));
    }
    if let Some(zone) = flow.zone {
        attributes.push(ConntrackAttribute::Other(DefaultNla::new(
            CTA_ZONE,
            zone.to_be_bytes().to_vec(),
        )));
    }
    let flags = NLM_F_REQUEST | if ack { NLM_F_ACK } else { 0 };
    append(
        out,
        seq,
        flags,
        flow.family(),
        ConntrackMessage::Delete(attributes),
    );
}

/// `CTA_NAT_DST`: DNAT the entry to `to`, as a Service rule would (the kernel then derives
/// the reply tuple and sets `IPS_DST_NAT`).
fn nat_destination(to: SocketAddr) -> DefaultNla {
    let port = [
        DefaultNla::new(CTA_PROTONAT_PORT_MIN, to.port().to_be_bytes().to_vec()),
        DefaultNla::new(CTA_PROTONAT_PORT_MAX, to.port().to_be_bytes().to_vec()),
    ];
    let (min, max, ip) = match to.ip() {
        IpAddr::V4(ip) => (CTA_NAT_V4_MINIP, CTA_NAT_V4_MAXIP, ip.octets().to_vec()),
        IpAddr::V6(ip) => (CTA_NAT_V6_MINIP, CTA_NAT_V6_MAXIP, ip.octets().to_vec()),
    };
    let range = [
        DefaultNla::new(min, ip.clone()),
        DefaultNla::new(max, ip),
        nested(CTA_NAT_PROTO, &port),
    ];
    nested(CTA_NAT_DST, &range)
}

/// A request creating this entry with the given timeout in seconds (tests and benchmarks).
/// A DNATed flow ([`Flow::is_dnat`]) is created the way a Service rule makes it: original
/// tuple plus a DNAT to its reply source.
pub(crate) fn create_request(out: &mut Vec<u8>, seq: u32, flow: &Flow, timeout: u32, ack: bool) {
    let reply = if flow.is_dnat() {
        flow.original.reversed()
    } else {
        flow.reply
    };
    let mut attributes = vec![
        ConntrackAttribute::CtaTupleOrig(tuple_attributes(flow.protocol, &flow.original)),
        ConntrackAttribute::CtaTupleReply(tuple_attributes(flow.protocol, &reply)),
        ConntrackAttribute::CtaTimeout(timeout),
    ];
    if flow.is_dnat() {
        attributes.push(ConntrackAttribute::Other(nat_destination(flow.reply.src)));
    }
    if let Some(zone) = flow.zone {
        attributes.push(ConntrackAttribute::Other(DefaultNla::new(
            CTA_ZONE,
            zone.to_be_bytes().to_vec(),
        )));
    }
    let flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL | if ack { NLM_F_ACK } else { 0 };
    append(
        out,
        seq,
        flags,
        flow.family(),
        ConntrackMessage::New(attributes),
    );
}

/// One message the kernel sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reply {
    /// An entry of a dump.
    Flow {
        /// The request's sequence number.
        seq: u32,
        /// The entry.
        flow: Flow,
    },
    /// An entry of a dump that is not an IP entry with both tuples (never expected).
    Unreadable {
        /// The request's sequence number.
        seq: u32,
    },
    /// The end of a dump.
    Done {
        /// The request's sequence number.
        seq: u32,
    },
    /// An acknowledgement (`errno == 0`) or an error (a positive errno) for one request.
    Status {
        /// The request's sequence number.
        seq: u32,
        /// 0 for success, else the positive errno.
        errno: i32,
    },
    /// Anything else (ignored).
    Other,
}

/// A netlink message that cannot be read: the byte stream cannot be trusted any further.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Malformed(pub(crate) String);

/// The messages in one datagram received from the kernel.
pub(crate) fn replies(datagram: &[u8]) -> impl Iterator<Item = Result<Reply, Malformed>> + '_ {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        let rest = datagram.get(at..).filter(|r| !r.is_empty())?;
        let message = match NetlinkBuffer::new_checked(rest) {
            Ok(m) => m,
            Err(e) => {
                at = datagram.len();
                return Some(Err(Malformed(e.to_string())));
            }
        };
        let length = message.length() as usize;
        at += length.next_multiple_of(4).max(16);
        let seq = message.sequence_number();
        let payload = rest.get(16..length).unwrap_or_default();
        Some(Ok(match message.message_type() {
            NLMSG_DONE => Reply::Done { seq },
            NLMSG_ERROR => match payload.get(..4) {
                Some(code) => {
                    let code = i32::from_ne_bytes([code[0], code[1], code[2], code[3]]);
                    Reply::Status {
                        seq,
                        errno: code.saturating_neg(),
                    }
                }
                None => {
                    at = datagram.len();
                    return Some(Err(Malformed("truncated NLMSG_ERROR".into())));
                }
            },
            CT_NEW_MESSAGE => match parse_flow(payload) {
                Some(flow) => Reply::Flow { seq, flow },
                None => Reply::Unreadable { seq },
            },
            _ => Reply::Other,
        }))
    })
}

/// The fields of one tuple attribute.
#[derive(Default)]
struct RawTuple {
    src: Option<IpAddr>,
    dst: Option<IpAddr>,
    protocol: Option<u8>,
    src_port: u16,
    dst_port: u16,
    zone: Option<u16>,
}

impl RawTuple {
    fn tuple(&self) -> Option<Tuple> {
        Some(Tuple {
            src: SocketAddr::new(self.src?, self.src_port),
            dst: SocketAddr::new(self.dst?, self.dst_port),
        })
    }
}

/// Reads one `IPCTNL_MSG_CT_NEW` payload (nfgenmsg, then attributes).
fn parse_flow(payload: &[u8]) -> Option<Flow> {
    let mut original = None;
    let mut reply = None;
    let mut id = None;
    let mut zone = None;
    let mut status = 0;
    for attribute in NlasIterator::new(payload.get(4..)?) {
        let attribute = attribute.ok()?;
        let value = attribute.value();
        match attribute.kind() {
            CTA_TUPLE_ORIG => original = Some(parse_tuple(value)?),
            CTA_TUPLE_REPLY => reply = Some(parse_tuple(value)?),
            CTA_STATUS => status = u32::from_be_bytes(value.get(..4)?.try_into().ok()?),
            CTA_ID => id = Some(u32::from_be_bytes(value.get(..4)?.try_into().ok()?)),
            CTA_ZONE => zone = Some(u16::from_be_bytes(value.get(..2)?.try_into().ok()?)),
            _ => {}
        }
    }
    let original = original?;
    let reply = reply?;
    Some(Flow {
        protocol: original.protocol?,
        original: original.tuple()?,
        reply: reply.tuple()?,
        id,
        zone: zone.or(original.zone),
        status,
    })
}

fn parse_tuple(value: &[u8]) -> Option<RawTuple> {
    let mut tuple = RawTuple::default();
    for attribute in NlasIterator::new(value) {
        let attribute = attribute.ok()?;
        let value = attribute.value();
        match attribute.kind() {
            CTA_TUPLE_IP => {
                for ip in NlasIterator::new(value) {
                    let ip = ip.ok()?;
                    match ip.kind() {
                        CTA_IP_V4_SRC | CTA_IP_V6_SRC => tuple.src = Some(parse_ip(ip.value())?),
                        CTA_IP_V4_DST | CTA_IP_V6_DST => tuple.dst = Some(parse_ip(ip.value())?),
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for proto in NlasIterator::new(value) {
                    let proto = proto.ok()?;
                    let v = proto.value();
                    match proto.kind() {
                        CTA_PROTO_NUM => tuple.protocol = Some(*v.first()?),
                        CTA_PROTO_SRC_PORT => tuple.src_port = be16(v)?,
                        CTA_PROTO_DST_PORT => tuple.dst_port = be16(v)?,
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_ZONE => tuple.zone = Some(be16(value)?),
            _ => {}
        }
    }
    Some(tuple)
}

fn be16(v: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(v.get(..2)?.try_into().ok()?))
}

fn parse_ip(v: &[u8]) -> Option<IpAddr> {
    match v.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(v).ok()?))),
        16 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(v).ok()?))),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
