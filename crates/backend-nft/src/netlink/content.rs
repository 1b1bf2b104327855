//! An element's content as the kernel holds it (key, verdict or value, comment, flags), for the
//! restart that compares the kernel's elements with the ones it wants instead of flushing and
//! refilling every set.
//!
//! Why the kernel's form: a wanted element ([`Element`]) is turned into exactly what a dump of
//! it reads back ([`kernel_form`]: the bytes the encoder sends, the comment as nft stores it),
//! and both sides are hashed from that form ([`Contents`]), so "same content" means "the
//! kernel holds what kpng would write", whatever the typed values look like.

use std::fmt::Write as _;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};

use kpng_model::Family;
use kpng_netfilter::elements::{Element as Held, Verdict as HeldVerdict};

use crate::sets::{Data, Interval, Set};
use crate::store::Element;
use crate::value::Value;

use kpng_netfilter::attr::NFT_SET_ELEM_INTERVAL_END;

use super::encode::{encode_fields, put_comment, put_open_flag, verdict_code};
use super::error::EncodeError;

/// Writes into `out` what a dump of `e` (an element of `family`'s table) reads back, reusing
/// `out`'s buffers; for a range of a one-field interval set, `out` is its start element and
/// the end element (key: the last address + 1, flagged `NFT_SET_ELEM_INTERVAL_END`) is
/// returned, unless the range runs to the last address (then the start says so in its user
/// data). A concatenated range holds its last values in [`Held::key_end`].
pub fn kernel_form(
    family: Family,
    e: &Element,
    out: &mut Held,
) -> Result<Option<Held>, EncodeError> {
    let decl = e.set.decl();
    if !e.set.in_family(family) {
        return Err(EncodeError::Family(format!(
            "set {} (of the other family)",
            decl.name
        )));
    }
    let interval = decl.interval();
    let (lo, hi) = encode_fields(
        decl.key,
        &e.key.fields(),
        family,
        interval != Interval::None,
    )?;
    out.key.clear();
    out.key.extend_from_slice(lo.as_slice());
    out.flags = 0;
    let mut key_end = out.key_end.take().unwrap_or_default();
    key_end.clear();
    let mut data = out.data.take().unwrap_or_default();
    data.clear();
    let mut chain = out.verdict.take().and_then(|v| v.chain).unwrap_or_default();
    chain.clear();
    let mut end = None;
    let mut open = false;
    match interval {
        Interval::None => {}
        Interval::Concat => {
            key_end.extend_from_slice(hi.as_slice());
            out.key_end = Some(key_end);
        }
        Interval::Single => {
            let mut last = hi;
            if last.increment() {
                end = Some(Held {
                    key: last.as_slice().to_vec(),
                    flags: NFT_SET_ELEM_INTERVAL_END,
                    ..Held::default()
                });
            } else {
                open = true;
            }
        }
    }
    match (e.value.as_ref(), decl.data) {
        (None, _) => {}
        (Some(_), Data::None) => return Err(EncodeError::UnexpectedValue),
        (Some(Value::Verdict(v)), Data::Verdict) => {
            let (code, target) = verdict_code(v);
            let chain = target.map(|c| {
                let _ = write!(chain, "{c}");
                chain
            });
            out.verdict = Some(HeldVerdict { code, chain });
        }
        (Some(v), Data::Fields(fields)) => {
            let f = v.fields().ok_or(EncodeError::ValueKind)?;
            data.extend_from_slice(encode_fields(fields, &f, family, false)?.0.as_slice());
            out.data = Some(data);
        }
        (Some(_), Data::Verdict) => return Err(EncodeError::ValueKind),
    }
    let mut udata = out.userdata.take().unwrap_or_default();
    udata.clear();
    if let Some(c) = e.comment.as_deref() {
        put_comment(&mut udata, c);
    }
    if open {
        put_open_flag(&mut udata);
    }
    if !udata.is_empty() {
        out.userdata = Some(udata);
    }
    Ok(end)
}

/// Whether `e` is the end element at address zero that nft's text path puts before the first
/// range of a one-field interval set: it closes nothing, and kpng's own writes never hold it,
/// so a comparison passes over it.
pub fn is_zero_end(e: &Held) -> bool {
    e.flags == NFT_SET_ELEM_INTERVAL_END && e.key.iter().all(|b| *b == 0)
}

/// Content hashes of elements: 128 bits from two randomly keyed hashers, so that two different
/// elements hash alike with a probability of about 2^-128 per pair (and no one can make them).
#[derive(Debug)]
pub struct Contents {
    family: Family,
    keys: (RandomState, RandomState),
    /// What [`kernel_form`] last wrote, its buffers reused.
    scratch: Held,
}

impl Contents {
    /// Hashes for elements of `family`'s table.
    pub fn new(family: Family) -> Contents {
        Contents {
            family,
            keys: (RandomState::new(), RandomState::new()),
            scratch: Held::default(),
        }
    }

    /// The content hash of an element the kernel holds in `set`.
    pub fn held(&self, set: Set, e: &Held) -> u128 {
        let one = |keys: &RandomState| {
            let mut h = keys.build_hasher();
            set.hash(&mut h);
            e.key.hash(&mut h);
            e.key_end.hash(&mut h);
            e.flags.hash(&mut h);
            match &e.verdict {
                Some(v) => (1u8, v.code, v.chain.as_deref()).hash(&mut h),
                None => 0u8.hash(&mut h),
            }
            e.data.hash(&mut h);
            e.userdata.as_deref().unwrap_or_default().hash(&mut h);
            h.finish()
        };
        (u128::from(one(&self.keys.0)) << 64) | u128::from(one(&self.keys.1))
    }

    /// The content hash of `e` as the kernel would hold it, and of its end element (a range
    /// of a one-field interval set); an element that does not encode is the encoder's error.
    pub fn wanted(&mut self, e: &Element) -> Result<(u128, Option<u128>), EncodeError> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let result = kernel_form(self.family, e, &mut scratch).map(|end| {
            (
                self.held(e.set, &scratch),
                end.map(|end| self.held(e.set, &end)),
            )
        });
        self.scratch = scratch;
        result
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::sync::Arc;

    use kpng_model::Protocol;

    use super::*;
    use crate::ruleset::{DynamicChain, PickKind};
    use crate::value::{Chain, FixedChain, Key, Verdict};

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    /// An element and the kernel's form of it hash alike; any difference the kernel would show
    /// (value, chain, comment, key) does not; prefixes of one start stay apart.
    #[test]
    fn wanted_and_held_hash_alike_only_when_the_kernel_holds_the_same() {
        let goto3 = Value::Verdict(Verdict::Goto(Chain::Dynamic(DynamicChain::Pick(
            PickKind::Cluster,
            3,
        ))));
        let vip = Key::Vip(ip("10.96.0.10"), Protocol::Tcp, 80);
        let base = Element {
            set: Set::ServiceIps,
            key: vip,
            value: Some(goto3),
            comment: Some(Arc::from("ns/svc:http")),
        };
        let mut c = Contents::new(Family::V4);
        let mut held = Held::default();
        kernel_form(Family::V4, &base, &mut held).expect("encodes");
        assert_eq!(
            c.wanted(&base).expect("encodes"),
            (c.held(base.set, &held), None)
        );
        let endpoint = Element {
            set: Set::Endpoints(PickKind::Cluster, Protocol::Tcp),
            key: Key::VipSlot(ip("10.96.0.10"), 80, 0),
            value: Some(Value::Endpoint(ip("10.244.1.2"), 8080)),
            comment: None,
        };
        kernel_form(Family::V4, &endpoint, &mut held).expect("encodes");
        assert_eq!(
            held.data.as_deref(),
            Some(&[10, 244, 1, 2, 0x1f, 0x90, 0, 0][..])
        );
        assert_eq!(
            held.verdict, None,
            "the buffers of the verdict before are not kept"
        );
        assert_eq!(held.userdata, None);
        assert_eq!(
            c.wanted(&endpoint).expect("encodes"),
            (c.held(endpoint.set, &held), None)
        );
        let others = [
            Element {
                value: Some(Value::Verdict(Verdict::goto(FixedChain::Reject))),
                ..base.clone()
            },
            Element {
                comment: None,
                ..base.clone()
            },
            Element {
                comment: Some(Arc::from("ns/svc:https")),
                ..base.clone()
            },
            Element {
                key: Key::Vip(ip("10.96.0.10"), Protocol::Udp, 80),
                ..base.clone()
            },
            Element {
                set: Set::NoEndpointServices,
                ..base.clone()
            },
        ];
        let hash = c.wanted(&base).expect("encodes");
        for other in others {
            assert_ne!(c.wanted(&other).expect("encodes"), hash, "{other:?}");
        }
        let net = |n: &str| Element {
            set: Set::ServiceCidrs,
            key: Key::Net(n.parse().expect("net")),
            value: None,
            comment: None,
        };
        // A range: its start and end elements, as nft sends them; a range to the last
        // address has no end element.
        let (start, end) = c.wanted(&net("10.0.0.0/8")).expect("encodes");
        let (start16, end16) = c.wanted(&net("10.0.0.0/16")).expect("encodes");
        assert_eq!(start, start16, "the same start element");
        assert_ne!(end, end16);
        let last = kernel_form(Family::V4, &net("10.0.0.0/8"), &mut held).expect("encodes");
        assert_eq!(
            last.map(|e| (e.key, e.flags)),
            Some((vec![11, 0, 0, 0], NFT_SET_ELEM_INTERVAL_END))
        );
        let (_, open) = c.wanted(&net("255.0.0.0/8")).expect("encodes");
        assert_eq!(open, None);
    }
}
