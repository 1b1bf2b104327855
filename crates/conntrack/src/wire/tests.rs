use netlink_packet_core::{NLA_TYPE_MASK, NlaBuffer};

use super::*;
use crate::flow::IPPROTO_TCP;
use crate::test_support::{flow, sa};

/// One entry as the kernel sends it in a dump (`IPCTNL_MSG_CT_NEW`, NLM_F_MULTI), built with
/// the typed crate so that our reader is checked against an independent writer.
fn kernel_entry(seq: u32, flow: &Flow, id: u32, zone: Option<u16>) -> Vec<u8> {
    let mut attributes = vec![
        ConntrackAttribute::CtaTupleOrig(tuple_attributes(flow.protocol, &flow.original)),
        ConntrackAttribute::CtaTupleReply(tuple_attributes(flow.protocol, &flow.reply)),
        ConntrackAttribute::CtaStatus(
            netlink_packet_netfilter::conntrack::Status::from_bits_retain(flow.status | 0x8),
        ),
        ConntrackAttribute::CtaTimeout(30),
        ConntrackAttribute::Other(DefaultNla::new(CTA_ID, id.to_be_bytes().to_vec())),
    ];
    if let Some(zone) = zone {
        attributes.push(ConntrackAttribute::Other(DefaultNla::new(
            CTA_ZONE,
            zone.to_be_bytes().to_vec(),
        )));
    }
    let mut out = Vec::new();
    append(
        &mut out,
        seq,
        2,
        flow.family(),
        ConntrackMessage::New(attributes),
    );
    out
}

/// An `NLMSG_ERROR` (an ack when `errno` is 0) for request `seq`, with only the request's
/// header echoed (`NETLINK_CAP_ACK`).
fn kernel_status(seq: u32, errno: i32) -> Vec<u8> {
    let mut out = vec![0u8; 16 + 4 + 16];
    let len = out.len() as u32;
    out[0..4].copy_from_slice(&len.to_ne_bytes());
    out[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
    out[8..12].copy_from_slice(&seq.to_ne_bytes());
    out[16..20].copy_from_slice(&(-errno).to_ne_bytes());
    out
}

fn kernel_done(seq: u32) -> Vec<u8> {
    let mut out = vec![0u8; 20];
    out[0..4].copy_from_slice(&20u32.to_ne_bytes());
    out[4..6].copy_from_slice(&NLMSG_DONE.to_ne_bytes());
    out[8..12].copy_from_slice(&seq.to_ne_bytes());
    out
}

#[test]
fn reads_dump_entries_acks_errors_and_done_from_one_datagram() {
    let v4 = flow("10.244.1.9:4000", "10.96.0.10:53", "10.244.2.7:53");
    let v6 = flow("[fd00::9]:4000", "[fd00:96::a]:53", "[fd00:96::a]:53");
    let mut datagram = kernel_entry(7, &v4, 0xdead_beef, None);
    datagram.extend(kernel_entry(7, &v6, 42, Some(3)));
    datagram.extend(kernel_status(8, 0));
    datagram.extend(kernel_status(9, 2));
    datagram.extend(kernel_done(7));
    let replies: Vec<Reply> = replies(&datagram)
        .collect::<Result<_, _>>()
        .expect("well-formed");
    let expected_v4 = Flow {
        id: Some(0xdead_beef),
        status: v4.status | 0x8,
        ..v4
    };
    let expected_v6 = Flow {
        id: Some(42),
        zone: Some(3),
        status: 0x8,
        ..v6
    };
    assert_eq!(
        replies,
        [
            Reply::Flow {
                seq: 7,
                flow: expected_v4
            },
            Reply::Flow {
                seq: 7,
                flow: expected_v6
            },
            Reply::Status { seq: 8, errno: 0 },
            Reply::Status { seq: 9, errno: 2 },
            Reply::Done { seq: 7 },
        ]
    );
    assert!(expected_v4.is_dnat());
    assert!(!expected_v6.is_dnat());
}

#[test]
fn a_truncated_message_is_malformed_and_ends_the_datagram() {
    let entry = kernel_entry(1, &flow("10.0.0.1:1", "10.0.0.2:2", "10.0.0.3:3"), 1, None);
    let cut = &entry[..entry.len() - 8];
    let replies: Vec<_> = replies(cut).collect();
    assert_eq!(replies.len(), 1);
    assert!(replies[0].is_err(), "{replies:?}");
}

#[test]
fn an_entry_without_tuples_is_unreadable_not_an_error() {
    let mut out = Vec::new();
    append(&mut out, 4, 2, Family::V4, ConntrackMessage::New(vec![]));
    assert_eq!(
        replies(&out).collect::<Vec<_>>(),
        [Ok(Reply::Unreadable { seq: 4 })]
    );
}

/// The request's attributes: (raw type including flags, value).
fn attributes(request: &[u8]) -> Vec<(u16, Vec<u8>)> {
    let message = NetlinkBuffer::new_checked(request).expect("message");
    let payload = &message.payload()[4..];
    NlasIterator::new(payload)
        .map(|a| {
            let a = a.expect("attribute");
            let flags = if a.nested_flag() { NLA_F_NESTED } else { 0 };
            (a.kind() | flags, a.value().to_vec())
        })
        .collect()
}

fn first_u32(nested: &[u8]) -> (u16, u32) {
    let a = NlaBuffer::new_checked(nested).expect("inner attribute");
    let v = a.value();
    (a.kind(), u32::from_ne_bytes([v[0], v[1], v[2], v[3]]))
}

#[test]
fn dump_requests_filter_in_the_kernel() {
    let cases = [
        (DumpFilter::Udp, FILTER_PROTO_NUM, false),
        (DumpFilter::UdpDnat, FILTER_PROTO_NUM, true),
        (
            DumpFilter::UdpTo(sa("10.96.0.10:53")),
            FILTER_PROTO_NUM | FILTER_IP_DST | FILTER_PROTO_DST_PORT,
            false,
        ),
        (
            DumpFilter::UdpToPort(30053),
            FILTER_PROTO_NUM | FILTER_PROTO_DST_PORT,
            false,
        ),
    ];
    for (filter, flags, by_status) in cases {
        let mut request = Vec::new();
        dump_request(&mut request, 5, Family::V4, &filter);
        let message = NetlinkBuffer::new_checked(&request[..]).expect("message");
        assert_eq!(message.message_type(), 0x101, "{filter:?}: CT_GET");
        assert_eq!(message.flags(), NLM_F_REQUEST | NLM_F_DUMP);
        assert_eq!(message.payload()[0], 2, "{filter:?}: AF_INET in nfgenmsg");
        let attrs = attributes(&request);
        let kinds: Vec<u16> = attrs.iter().map(|(k, _)| *k).collect();
        let mut expected = vec![CTA_TUPLE_ORIG | NLA_F_NESTED, CTA_FILTER | NLA_F_NESTED];
        if by_status {
            expected.extend([CTA_STATUS, CTA_STATUS_MASK]);
        }
        assert_eq!(kinds, expected, "{filter:?}");
        assert_eq!(
            first_u32(&attrs[1].1),
            (CTA_FILTER_ORIG_FLAGS, flags),
            "{filter:?}"
        );
        if by_status {
            assert_eq!(attrs[2].1, IPS_DST_NAT.to_be_bytes());
            assert_eq!(attrs[3].1, IPS_DST_NAT.to_be_bytes());
        }
    }
}

#[test]
fn deletes_carry_the_dumped_id_and_zone_byte_for_byte() {
    let dumped = Flow {
        id: Some(0x0102_0304),
        zone: Some(7),
        ..flow("10.244.1.9:4000", "10.96.0.10:53", "10.244.2.7:53")
    };
    let mut request = Vec::new();
    delete_request(&mut request, 9, &dumped, true);
    let message = NetlinkBuffer::new_checked(&request[..]).expect("message");
    assert_eq!(message.message_type(), 0x102, "CT_DELETE");
    assert_eq!(message.flags(), NLM_F_REQUEST | NLM_F_ACK);
    let attrs = attributes(&request);
    assert_eq!(attrs[1], (CTA_ID, vec![1, 2, 3, 4]));
    assert_eq!(attrs[2], (CTA_ZONE, vec![0, 7]));
    // The original tuple reads back as the dumped one.
    let tuple = parse_tuple(&attrs[0].1).expect("tuple");
    assert_eq!(tuple.tuple(), Some(dumped.original));
    assert_eq!(tuple.protocol, Some(IPPROTO_UDP));
}

#[test]
fn dnat_entries_are_created_with_a_nat_destination() {
    let dnat = flow("10.244.1.9:4000", "10.96.0.10:53", "10.244.2.7:5353");
    let mut request = Vec::new();
    create_request(&mut request, 3, &dnat, 60, false);
    let attrs = attributes(&request);
    let kinds: Vec<u16> = attrs.iter().map(|(k, _)| *k & NLA_TYPE_MASK).collect();
    assert_eq!(kinds, [CTA_TUPLE_ORIG, CTA_TUPLE_REPLY, 7, CTA_NAT_DST]);
    // The reply tuple is the plain inverse; the kernel applies the DNAT to it.
    let reply = parse_tuple(&attrs[1].1).expect("reply");
    assert_eq!(reply.tuple(), Some(dnat.original.reversed()));
    let nat: Vec<(u16, Vec<u8>)> = NlasIterator::new(&attrs[3].1[..])
        .map(|a| {
            let a = a.expect("nat attribute");
            (a.kind(), a.value().to_vec())
        })
        .collect();
    assert_eq!(nat[0], (CTA_NAT_V4_MINIP, vec![10, 244, 2, 7]));
    assert_eq!(nat[1], (CTA_NAT_V4_MAXIP, vec![10, 244, 2, 7]));
    let port: Vec<Vec<u8>> = NlasIterator::new(&nat[2].1[..])
        .map(|a| a.expect("port").value().to_vec())
        .collect();
    assert_eq!(port, [5353u16.to_be_bytes(), 5353u16.to_be_bytes()]);

    let plain = flow("10.244.1.9:4000", "8.8.8.8:53", "8.8.8.8:53");
    let mut request = Vec::new();
    create_request(&mut request, 4, &plain, 60, true);
    assert_eq!(attributes(&request).len(), 3, "no NAT for a plain entry");
}

#[test]
fn dump_filters_match_like_the_kernel() {
    let dnat = flow("10.244.1.9:4000", "10.96.0.10:53", "10.244.2.7:53");
    let plain = flow("10.244.1.9:4000", "10.96.0.10:53", "10.96.0.10:53");
    let other_port = flow("10.244.1.9:4000", "10.96.0.10:54", "10.96.0.10:54");
    let mut tcp = dnat;
    tcp.protocol = IPPROTO_TCP;
    let to_vip = DumpFilter::UdpTo(sa("10.96.0.10:53"));
    let to_port = DumpFilter::UdpToPort(53);
    let cases = [
        (DumpFilter::Udp, [true, true, true, false]),
        (DumpFilter::UdpDnat, [true, false, false, false]),
        (to_vip, [true, true, false, false]),
        (to_port, [true, true, false, false]),
    ];
    for (filter, expected) in cases {
        let got = [dnat, plain, other_port, tcp].map(|f| filter.matches(&f));
        assert_eq!(got, expected, "{filter:?}");
    }
}
