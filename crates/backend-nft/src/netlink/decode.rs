//! Bytes the kernel holds → typed key fields: the inverse of `encode` for keys without
//! prefixes.
//!
//! Why: at start-up the backend reads back the affinity ids of the table it adopts (one element
//! dump of the `affinity-bits-*` sets and of the dynamic affinity map, never in the sync loop),
//! so that each Service port keeps the id its clients' affinity entries are keyed by. The
//! layout is the set's declaration ([`SetDecl`]), the one the encoder writes with.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kpng_model::{Family, Protocol};

use crate::sets::{Field, SetDecl};
use crate::value::FieldValue;

/// The L4 protocol of an `inet_proto` byte; `None` for one kpng never writes.
fn protocol(number: u8) -> Option<Protocol> {
    match number {
        6 => Some(Protocol::Tcp),
        17 => Some(Protocol::Udp),
        132 => Some(Protocol::Sctp),
        _ => None,
    }
}

/// The width of one field of `family`'s table.
fn width(field: Field, family: Family) -> usize {
    match (field, family) {
        (Field::Addr, Family::V4) => 4,
        (Field::Addr, Family::V6) => 16,
        (Field::Proto, _) => 1,
        (Field::Port, _) => 2,
        (Field::Mark | Field::Slot, _) => 4,
    }
}

/// The fields of a key of `decl`'s set in `family`'s table, as the kernel holds it (a
/// concatenation's fields each padded to 4 bytes); `None` when the bytes do not have the
/// declared shape (another kpng's set, or not ours). Interval sets' keys are not decoded.
pub fn key_fields(decl: &SetDecl, family: Family, bytes: &[u8]) -> Option<Vec<FieldValue>> {
    let concat = decl.key.len() > 1;
    let mut out = Vec::with_capacity(decl.key.len());
    let mut at = 0;
    for field in decl.key {
        let w = width(*field, family);
        let raw = bytes.get(at..at + w)?;
        out.push(match field {
            Field::Addr => FieldValue::Addr(match family {
                Family::V4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(raw).ok()?)),
                Family::V6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(raw).ok()?)),
            }),
            Field::Proto => FieldValue::Proto(protocol(raw[0])?),
            Field::Port => FieldValue::Port(u16::from_be_bytes(raw.try_into().ok()?)),
            Field::Mark => FieldValue::Mark(u32::from_ne_bytes(raw.try_into().ok()?)),
            Field::Slot => FieldValue::Slot(u32::from_ne_bytes(raw.try_into().ok()?)),
        });
        at += if concat { w.next_multiple_of(4) } else { w };
    }
    (at == bytes.len()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::encode::encode_fields;
    use crate::ruleset::PickKind;
    use crate::sets::Set;
    use crate::value::Key;

    /// Every key shape the start-up read decodes comes back as the encoder wrote it; bytes of
    /// another shape are refused.
    #[test]
    fn affinity_keys_decode_to_what_was_encoded() {
        let v4: IpAddr = "10.96.0.10".parse().expect("ip");
        let v6: IpAddr = "fd00:96::a".parse().expect("ip");
        let cases = [
            (
                Set::AffinityBits(PickKind::Cluster),
                Family::V4,
                Key::VipBit(v4, Protocol::Tcp, 80, 0x1000),
            ),
            (
                Set::AffinityBits(PickKind::Local),
                Family::V6,
                Key::VipBit(v6, Protocol::Sctp, 443, 0x0100_0000),
            ),
            (
                Set::AffinityBits(PickKind::NodePortCluster),
                Family::V4,
                Key::NodePortBit(Protocol::Udp, 30080, 0x8000),
            ),
            (
                Set::AffinityBits(PickKind::NodePortLocal),
                Family::V6,
                Key::NodePortBit(Protocol::Tcp, 30081, 0x2000),
            ),
            (Set::Affinity, Family::V4, Key::ClientMark(v4, 0xff00_f000)),
            (Set::AffinityAddr, Family::V6, Key::MarkHash(0x3000, 77)),
        ];
        for (set, family, key) in cases {
            let decl = set.decl();
            let (bytes, _) =
                encode_fields(decl.key, &key.fields(), family, false).expect("encodes");
            let fields = key_fields(&decl, family, bytes.as_slice());
            assert_eq!(
                fields.as_deref(),
                Some(key.fields().as_slice()),
                "{} {key}",
                set.name()
            );
            // One byte short or long, or the other family's addresses: not this set's key.
            let b = bytes.as_slice();
            assert_eq!(key_fields(&decl, family, &b[..b.len() - 1]), None);
            assert_eq!(key_fields(&decl, family, &[b, &[0]].concat()), None);
            let other = match family {
                Family::V4 => Family::V6,
                Family::V6 => Family::V4,
            };
            if decl.key.contains(&Field::Addr) {
                assert_eq!(key_fields(&decl, other, b), None, "{}", set.name());
            }
        }
        // A protocol kpng never writes (ICMP).
        let decl = Set::AffinityBits(PickKind::NodePortCluster).decl();
        let mut bytes = vec![1, 0, 0, 0, 0, 80, 0, 0];
        bytes.extend(0x1000u32.to_ne_bytes());
        assert_eq!(key_fields(&decl, Family::V4, &bytes), None);
    }
}
