//! Typed element values → the bytes nft would send for them.
//!
//! Byte orders are nft's: addresses and ports in network order, `inet_proto` one byte, marks
//! and the `numgen` slot in host order; in a concatenation every field is zero-padded to a
//! 4-byte register. Prefixes in the `flags interval` sets become a start and an end element
//! (one field: end = last address + 1 flagged `NFT_SET_ELEM_INTERVAL_END`, or an "open" start
//! when that overflows) or one element with `NFTA_SET_ELEM_KEY_END` (a concatenation:
//! end = last address), exactly what nft 1.0.6 sends. Nothing here allocates on success.

use std::fmt;

use kpng_model::{Family, Protocol};

use crate::sets::{Data, Field, Interval, SetDecl};
use crate::value::{Chain, FieldValue, Fields, Key, Value, Verdict};

use super::error::EncodeError;
use kpng_netfilter::attr::*;

/// Largest key or value: `NFT_DATA_VALUE_MAXLEN`.
const DATA_MAX: usize = 64;

/// A key or value: up to `NFT_DATA_VALUE_MAXLEN` bytes, without allocating.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct Bytes {
    buf: [u8; DATA_MAX],
    len: usize,
}

impl Bytes {
    const EMPTY: Bytes = Bytes {
        buf: [0; DATA_MAX],
        len: 0,
    };

    pub(super) fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    fn push(&mut self, bytes: &[u8], pad_to: usize) -> Result<(), EncodeError> {
        let end = self.len + pad_to.max(bytes.len());
        if end > DATA_MAX {
            return Err(EncodeError::TooLong(DATA_MAX));
        }
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        // Padding bytes are already zero (buffers start zeroed and only grow).
        self.len = end;
        Ok(())
    }

    /// Adds one to the value read as a big-endian number; `false` when it wraps to zero.
    pub(super) fn increment(&mut self) -> bool {
        for b in self.buf[..self.len].iter_mut().rev() {
            let (v, carry) = b.overflowing_add(1);
            *b = v;
            if !carry {
                return true;
            }
        }
        false
    }
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.as_slice() {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// One field's first and last value (equal unless it is a prefix), `len` bytes each.
struct Span {
    lo: [u8; 16],
    hi: [u8; 16],
    len: usize,
}

impl Span {
    fn single(bytes: &[u8]) -> Span {
        let mut lo = [0; 16];
        lo[..bytes.len()].copy_from_slice(bytes);
        Span {
            lo,
            hi: lo,
            len: bytes.len(),
        }
    }

    fn range(lo: &[u8], hi: &[u8]) -> Span {
        let mut s = Span::single(lo);
        s.hi[..hi.len()].copy_from_slice(hi);
        s
    }
}

/// The IANA protocol number nft's `inet_proto` holds.
fn protocol_number(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

fn field_span(v: FieldValue, family: Family, ranged: bool) -> Result<Span, EncodeError> {
    use ipnet::IpNet;
    use std::net::IpAddr;
    Ok(match (v, family) {
        (FieldValue::Addr(IpAddr::V4(a)), Family::V4) => Span::single(&a.octets()),
        (FieldValue::Addr(IpAddr::V6(a)), Family::V6) => Span::single(&a.octets()),
        (FieldValue::Net(n), _) => {
            let span = match (n, family) {
                (IpNet::V4(n), Family::V4) => {
                    Span::range(&n.network().octets(), &n.broadcast().octets())
                }
                (IpNet::V6(n), Family::V6) => {
                    Span::range(&n.network().octets(), &n.broadcast().octets())
                }
                _ => return Err(EncodeError::Family(n.to_string())),
            };
            if !ranged && span.lo != span.hi {
                return Err(EncodeError::Range(n.to_string()));
            }
            span
        }
        (FieldValue::Addr(a), _) => return Err(EncodeError::Family(a.to_string())),
        (FieldValue::Proto(p), _) => Span::single(&[protocol_number(p)]),
        (FieldValue::Port(p), _) => Span::single(&p.to_be_bytes()),
        // Host order: nft's `mark` and integer types (`numgen`) are host-endian.
        (FieldValue::Mark(m) | FieldValue::Slot(m), _) => Span::single(&m.to_ne_bytes()),
    })
}

/// Encodes `fields` as the set declares them: the first and last values (equal unless a
/// field is a prefix, which only `ranged` sets allow).
pub(super) fn encode_fields(
    declared: &'static [Field],
    fields: &Fields,
    family: Family,
    ranged: bool,
) -> Result<(Bytes, Bytes), EncodeError> {
    let values = fields.as_slice();
    if values.len() != declared.len() || values.iter().zip(declared).any(|(v, d)| v.kind() != *d) {
        return Err(EncodeError::Shape {
            declared,
            found: values.iter().map(|v| v.kind()).collect(),
        });
    }
    let concat = declared.len() > 1;
    let (mut lo, mut hi) = (Bytes::EMPTY, Bytes::EMPTY);
    for v in values {
        let span = field_span(*v, family, ranged)?;
        // Concatenated fields each take a whole 4-byte register.
        let pad = if concat {
            span.len.next_multiple_of(4)
        } else {
            0
        };
        lo.push(&span.lo[..span.len], pad)?;
        hi.push(&span.hi[..span.len], pad)?;
    }
    Ok((lo, hi))
}

/// Checks a table, set or chain name against nft's limits.
pub(super) fn check_name(name: &str) -> Result<(), EncodeError> {
    if name.is_empty() || name.len() >= NAME_MAX || name.contains('\0') {
        Err(EncodeError::Name(name.to_string()))
    } else {
        Ok(())
    }
}

/// A verdict's code and chain.
pub(super) fn verdict_code(v: &Verdict) -> (i32, Option<&Chain>) {
    match v {
        Verdict::Drop => (NF_DROP, None),
        Verdict::Accept => (NF_ACCEPT, None),
        Verdict::Continue => (NFT_CONTINUE, None),
        Verdict::Return => (NFT_RETURN, None),
        Verdict::Goto(c) => (NFT_GOTO, Some(c)),
        Verdict::Jump(c) => (NFT_JUMP, Some(c)),
    }
}

fn put_data_value(buf: &mut Vec<u8>, ty: u16, value: &Bytes) {
    let nest = nest_start(buf, ty);
    put_attr(buf, NFTA_DATA_VALUE, value.as_slice());
    nest_end(buf, nest);
}

/// A map element's value, encoded.
enum ElemData<'a> {
    /// Value bytes (`NFTA_DATA_VALUE`).
    Value(Bytes),
    /// Verdict code and chain (`NFTA_DATA_VERDICT`).
    Verdict(i32, Option<&'a Chain>),
}

/// The comment as nft's text path stores it: `"` becomes `'` (nft's syntax has no escape for
/// it), cut to nft's maximum at a character boundary.
pub(super) fn put_comment(out: &mut Vec<u8>, comment: &str) {
    let mut cut = comment.len().min(COMMENT_MAX);
    while !comment.is_char_boundary(cut) {
        cut -= 1;
    }
    out.push(UDATA_ELEM_COMMENT);
    out.push((cut + 1) as u8);
    out.extend(
        comment.as_bytes()[..cut]
            .iter()
            .map(|b| if *b == b'"' { b'\'' } else { *b }),
    );
    out.push(0);
}

/// The user data TLV saying that a one-field range runs to the last address ("open": it has no
/// end element, whose key would wrap to zero).
pub(super) fn put_open_flag(out: &mut Vec<u8>) {
    out.push(UDATA_ELEM_FLAGS);
    out.push(4);
    out.extend_from_slice(&UDATA_ELEM_F_INTERVAL_OPEN.to_ne_bytes());
}

/// Encodes one element of `decl`'s set (or, for a one-field interval set, its start and end
/// elements) into `out` as `NFTA_LIST_ELEM` attributes. `value` is `None` for set elements
/// and for deletes (which name the element by its key only).
pub(super) fn encode_element(
    out: &mut Vec<u8>,
    decl: &SetDecl,
    family: Family,
    key: &Key,
    value: Option<&Value>,
    comment: Option<&str>,
) -> Result<(), EncodeError> {
    let interval = decl.interval();
    let (lo, hi) = encode_fields(decl.key, &key.fields(), family, interval != Interval::None)?;
    let data = match (value, decl.data) {
        (None, _) => None,
        (Some(_), Data::None) => return Err(EncodeError::UnexpectedValue),
        (Some(Value::Verdict(v)), Data::Verdict) => {
            let (code, chain) = verdict_code(v);
            Some(ElemData::Verdict(code, chain))
        }
        (Some(v), Data::Fields(fields)) => match v.fields() {
            Some(f) => Some(ElemData::Value(encode_fields(fields, &f, family, false)?.0)),
            None => return Err(EncodeError::ValueKind),
        },
        (Some(_), Data::Verdict) => return Err(EncodeError::ValueKind),
    };
    // The end element of a one-field range: last + 1; none when that wraps ("open" interval).
    let mut end = None;
    if interval == Interval::Single {
        let mut e = hi;
        if e.increment() {
            end = Some(e);
        }
    }
    let open = interval == Interval::Single && end.is_none();

    let elem = nest_start(out, NFTA_LIST_ELEM);
    put_data_value(out, NFTA_SET_ELEM_KEY, &lo);
    if interval == Interval::Concat {
        put_data_value(out, NFTA_SET_ELEM_KEY_END, &hi);
    }
    match data {
        None => {}
        Some(ElemData::Value(bytes)) => put_data_value(out, NFTA_SET_ELEM_DATA, &bytes),
        Some(ElemData::Verdict(code, chain)) => {
            let d = nest_start(out, NFTA_SET_ELEM_DATA);
            let v = nest_start(out, NFTA_DATA_VERDICT);
            put_attr(out, NFTA_VERDICT_CODE, &code.to_be_bytes());
            if let Some(chain) = chain {
                put_display(out, NFTA_VERDICT_CHAIN, chain);
            }
            nest_end(out, v);
            nest_end(out, d);
        }
    }
    if comment.is_some() || open {
        // The user data attribute, written in place: its TLVs follow the header.
        let udata = out.len();
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&NFTA_SET_ELEM_USERDATA.to_ne_bytes());
        if let Some(c) = comment {
            put_comment(out, c);
        }
        if open {
            put_open_flag(out);
        }
        nest_end(out, udata);
        out.resize(out.len().next_multiple_of(4), 0);
    }
    nest_end(out, elem);

    if let Some(end) = end {
        let elem = nest_start(out, NFTA_LIST_ELEM);
        put_attr(
            out,
            NFTA_SET_ELEM_FLAGS,
            &NFT_SET_ELEM_INTERVAL_END.to_be_bytes(),
        );
        put_data_value(out, NFTA_SET_ELEM_KEY, &end);
        nest_end(out, elem);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::ruleset::{DynamicChain, PickKind};
    use crate::sets::Set;
    use crate::value::{FixedChain, Source};

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn key(set: Set, family: Family, key: Key) -> (Bytes, Bytes) {
        let d = set.decl();
        encode_fields(d.key, &key.fields(), family, d.interval() != Interval::None)
            .expect("encodes")
    }

    /// Formats like `nft --debug=netlink`: 32-bit words in host order, space-separated.
    fn words(b: &Bytes) -> String {
        b.as_slice()
            .chunks(4)
            .map(|c| {
                let mut w = [0u8; 4];
                w[..c.len()].copy_from_slice(c);
                format!("{:08x}", u32::from_ne_bytes(w))
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    // The expected words below are what `nft --debug=netlink` (nft 1.0.6, x86_64) printed for
    // the same elements, so these tests pin our bytes to nft's.
    #[cfg(target_endian = "little")]
    #[test]
    fn keys_and_values_match_nft_bytes() {
        use PickKind::{Cluster, Local, NodePortCluster};
        use Protocol::{Sctp, Tcp, Udp};
        let v4 = Family::V4;
        let (k, _) = key(
            Set::Endpoints(Cluster, Tcp),
            v4,
            Key::VipSlot(ip("10.96.0.11"), 80, 3),
        );
        assert_eq!(words(&k), "0b00600a 00005000 00000003");
        let (k, _) = key(
            Set::Endpoints(NodePortCluster, Udp),
            v4,
            Key::NodePortSlot(30080, 1),
        );
        assert_eq!(words(&k), "00008075 00000001");
        let Data::Fields(v) = Set::Endpoints(Cluster, Tcp).decl().data else {
            panic!("data map")
        };
        let val = Value::Endpoint(ip("10.244.1.2"), 8080)
            .fields()
            .expect("fields");
        let (val, _) = encode_fields(v, &val, v4, false).expect("value encodes");
        assert_eq!(words(&val), "0201f40a 0000901f");

        let (k, _) = key(
            Set::AffinityValid,
            v4,
            Key::MarkEndpoint(0x6b70000e, ip("10.244.1.9"), 8080),
        );
        assert_eq!(words(&k), "6b70000e 0901f40a 0000901f");
        let (k, _) = key(
            Set::AffinityBits(Cluster),
            v4,
            Key::VipBit(ip("10.96.1.31"), Sctp, 80, 0x0100_0000),
        );
        assert_eq!(words(&k), "1f01600a 00000084 00005000 01000000");
        let (k, _) = key(Set::ServiceNodeports, v4, Key::NodePort(Udp, 30081));
        assert_eq!(words(&k), "00000011 00008175");
        let (k, _) = key(Set::ClusterIps, v4, Key::Addr(ip("10.96.9.9")));
        assert_eq!(words(&k), "0909600a");
        let (k, _) = key(Set::AffinityTimeouts, v4, Key::Mark(0x6b700010));
        assert_eq!(words(&k), "6b700010");

        let (lo, hi) = key(
            Set::FirewallAllow,
            v4,
            Key::VipSource(
                ip("198.51.100.21"),
                Tcp,
                443,
                Source::Net("192.168.100.0/24".parse().expect("net")),
            ),
        );
        assert_eq!(words(&lo), "156433c6 00000006 0000bb01 0064a8c0");
        assert_eq!(words(&hi), "156433c6 00000006 0000bb01 ff64a8c0");

        let v6 = Family::V6;
        let (k, _) = key(
            Set::Endpoints(Local, Sctp),
            v6,
            Key::VipSlot(ip("fd00::1"), 9, 2),
        );
        assert_eq!(
            words(&k),
            "000000fd 00000000 00000000 01000000 00000900 00000002"
        );
        let (lo, hi) = key(
            Set::FirewallAllow,
            v6,
            Key::VipSource(
                ip("2001:db8::1"),
                Tcp,
                443,
                Source::Net("2001:db8:1::/48".parse().expect("net")),
            ),
        );
        assert_eq!(
            words(&lo),
            "b80d0120 00000000 00000000 01000000 00000006 0000bb01 b80d0120 00000100 00000000 00000000"
        );
        assert_eq!(
            words(&hi),
            "b80d0120 00000000 00000000 01000000 00000006 0000bb01 b80d0120 ffff0100 ffffffff ffffffff"
        );
        // A single address as the source of a concatenated range: first = last.
        let (lo, hi) = key(
            Set::FirewallAllow,
            v4,
            Key::VipSource(ip("198.51.100.21"), Tcp, 443, Source::Addr(ip("1.2.3.4"))),
        );
        assert_eq!(lo, hi);
    }

    fn list_elems(buf: &[u8]) -> Vec<&[u8]> {
        let mut out = Vec::new();
        let mut rest = buf;
        while rest.len() >= 4 {
            let len = u16::from_ne_bytes([rest[0], rest[1]]) as usize;
            out.push(&rest[..len]);
            rest = &rest[len.next_multiple_of(4)..];
        }
        out
    }

    fn contains(hay: &[u8], needle: &[u8]) -> bool {
        hay.windows(needle.len()).any(|w| w == needle)
    }

    fn net(s: &str) -> Key {
        Key::Net(s.parse().expect("net"))
    }

    #[test]
    fn single_field_interval_is_start_and_end_or_open() {
        let d = Set::ServiceCidrs.decl();
        let mut out = Vec::new();
        encode_element(&mut out, &d, Family::V4, &net("10.100.0.0/16"), None, None).expect("ok");
        // Two NFTA_LIST_ELEM: start 10.100.0.0, end 10.101.0.0 flagged INTERVAL_END.
        let elems = list_elems(&out);
        assert_eq!(elems.len(), 2);
        assert!(contains(elems[0], &[10, 100, 0, 0]));
        assert!(contains(elems[1], &[10, 101, 0, 0]));
        assert!(contains(elems[1], &NFT_SET_ELEM_INTERVAL_END.to_be_bytes()));

        out.clear();
        encode_element(&mut out, &d, Family::V4, &net("240.0.0.0/4"), None, None).expect("ok");
        let elems = list_elems(&out);
        assert_eq!(elems.len(), 1, "no end element past the last address");
        // The "open interval" user data nft writes: type 1, length 4, flag 1 (host order).
        let mut udata = vec![UDATA_ELEM_FLAGS, 4];
        udata.extend_from_slice(&1u32.to_ne_bytes());
        assert!(contains(elems[0], &udata));

        out.clear();
        encode_element(&mut out, &d, Family::V4, &net("10.200.0.1/32"), None, None).expect("ok");
        let elems = list_elems(&out);
        assert!(contains(elems[0], &[10, 200, 0, 1]));
        assert!(contains(elems[1], &[10, 200, 0, 2]));

        out.clear();
        encode_element(&mut out, &d, Family::V6, &net("fd00:96::/112"), None, None).expect("ok");
        let elems = list_elems(&out);
        assert_eq!(elems.len(), 2);
        let mut end = [0u8; 16];
        end[..4].copy_from_slice(&[0xfd, 0, 0, 0x96]);
        end[13] = 1;
        assert!(contains(elems[1], &end));
    }

    #[test]
    fn concatenated_interval_has_key_end() {
        let d = Set::FirewallAllow.decl();
        let mut out = Vec::new();
        let k = Key::VipSource(
            ip("198.51.100.21"),
            Protocol::Tcp,
            443,
            Source::Net("192.168.100.0/24".parse().expect("net")),
        );
        encode_element(&mut out, &d, Family::V4, &k, None, None).expect("ok");
        let elems = list_elems(&out);
        assert_eq!(elems.len(), 1);
        let mut key_end = Vec::new();
        let (_, hi) = encode_fields(d.key, &k.fields(), Family::V4, true).expect("ok");
        put_data_value(&mut key_end, NFTA_SET_ELEM_KEY_END, &hi);
        assert!(contains(elems[0], &key_end));
    }

    #[test]
    fn verdicts_name_their_chain_and_comments_are_cut() {
        let d = Set::ServiceIps.decl();
        let k = Key::Vip(ip("10.96.0.10"), Protocol::Tcp, 80);
        let goto = Value::Verdict(Verdict::Goto(Chain::Dynamic(DynamicChain::Pick(
            PickKind::Cluster,
            3,
        ))));
        let mut out = Vec::new();
        encode_element(
            &mut out,
            &d,
            Family::V4,
            &k,
            Some(&goto),
            Some("default/web:\"http\""),
        )
        .expect("ok");
        assert!(contains(&out, &NFT_GOTO.to_be_bytes()));
        assert!(contains(&out, b"cluster-n3\0"));
        assert!(contains(&out, b"\x00\x13default/web:'http'\0"));

        out.clear();
        let jump = Value::Verdict(Verdict::Jump(Chain::Fixed(FixedChain::Reject)));
        encode_element(&mut out, &d, Family::V4, &k, Some(&jump), None).expect("ok");
        assert!(contains(&out, &NFT_JUMP.to_be_bytes()));
        assert!(contains(&out, b"reject-chain\0"));

        out.clear();
        let drop = Value::Verdict(Verdict::Drop);
        let long = "x".repeat(300);
        encode_element(&mut out, &d, Family::V4, &k, Some(&drop), Some(&long))
            .expect("long comments are cut to nft's maximum");
        assert!(contains(&out, &NF_DROP.to_be_bytes()));
        assert!(contains(
            &out,
            &[UDATA_ELEM_COMMENT, (COMMENT_MAX + 1) as u8]
        ));
        assert!(!contains(&out, b"cluster-n3"));
    }

    #[test]
    fn elements_that_do_not_fit_their_set_are_errors() {
        let bad = |set: Set, family: Family, key: Key, value: Option<Value>| {
            encode_element(
                &mut Vec::new(),
                &set.decl(),
                family,
                &key,
                value.as_ref(),
                None,
            )
            .expect_err("must fail")
        };
        let v4 = Family::V4;
        let vip = Key::Vip(ip("10.96.0.10"), Protocol::Tcp, 80);
        assert!(matches!(
            bad(Set::ClusterIps, v4, Key::Addr(ip("fd00::1")), None),
            EncodeError::Family(_)
        ));
        assert!(matches!(
            bad(Set::ClusterIps, Family::V6, Key::Addr(ip("10.0.0.1")), None),
            EncodeError::Family(_)
        ));
        assert!(matches!(
            bad(Set::ClusterIps, v4, net("10.0.0.0/8"), None),
            EncodeError::Range(_)
        ));
        assert!(matches!(
            bad(Set::ClusterIps, v4, vip, None),
            EncodeError::Shape { .. }
        ));
        assert!(matches!(
            bad(
                Set::ClusterIps,
                v4,
                Key::Addr(ip("10.0.0.1")),
                Some(Value::Mark(1))
            ),
            EncodeError::UnexpectedValue
        ));
        assert!(matches!(
            bad(Set::ServiceIps, v4, vip, Some(Value::Mark(1))),
            EncodeError::ValueKind
        ));
        assert!(matches!(
            bad(
                Set::Affinity,
                v4,
                Key::ClientMark(ip("10.0.0.1"), 0x1000),
                Some(Value::Verdict(Verdict::Drop))
            ),
            EncodeError::ValueKind
        ));
        assert!(matches!(
            bad(
                Set::Endpoints(PickKind::Cluster, Protocol::Tcp),
                v4,
                Key::VipSlot(ip("10.96.0.10"), 80, 0),
                Some(Value::Mark(1))
            ),
            EncodeError::Shape { .. }
        ));
    }
}
