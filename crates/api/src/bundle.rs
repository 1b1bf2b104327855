//! Bundles (`KpngBundle`): consecutive ops compressed together, for clients that set
//! `WatchReq.AcceptZstd`.
//!
//! Why: a replay of 30k Services × 4 endpoints is 16.3 MB of single ops per node, so a brain
//! restart at 1,000 nodes sends 16 GB: 13 Gb/s to have every node hold its state within 10 s.
//! The ops of a replay are mostly [`crate::frames::SharedChunk`]s, the same bytes for every
//! node, so each is compressed once (zstd level 1, ~17 kB → ~1.7 kB; a whole replay ~10×
//! smaller) and the compressed bytes are shared as the plain ones were. The decompressed bytes
//! are exactly the single ops' gRPC messages, so a client applies them as if they had come one
//! by one.

use prost::Message;
use prost::bytes::Bytes;

use crate::proto;
use crate::proto::op_item::Op;

/// zstd's fastest level: the ratio of the default level (3) on these chunks, at less CPU.
const LEVEL: i32 = 1;
/// A bundle that says it decompresses to more is refused (a replay chunk is ~17 kB).
pub const MAX_SIZE: u64 = 64 << 20;

/// Why a bundle could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// It claims more than [`MAX_SIZE`] bytes.
    #[error("a bundle of {0} bytes (at most {MAX_SIZE})")]
    TooLarge(u64),
    /// The zstd frame is broken, or its size is not the one announced.
    #[error("decompressing a bundle: {0}")]
    Zstd(String),
    /// A message inside is cut short.
    #[error("a bundle's message is cut short")]
    Truncated,
    /// A message inside is not an `OpItem`.
    #[error("decoding an op inside a bundle: {0}")]
    Decode(#[from] prost::DecodeError),
    /// A bundle holds another bundle or a `Sync`, which the server never sends.
    #[error("a bundle holds a {0}")]
    Unexpected(&'static str),
    /// It holds another number of ops than it announced.
    #[error("a bundle announced {announced} ops and holds {found}")]
    Count {
        /// The announced count.
        announced: u64,
        /// The ops found.
        found: u64,
    },
}

/// `frames` (gRPC messages of `ops` ops) as one gRPC message holding their bundle; `None` when
/// compressing fails or does not make them smaller (the plain frames are sent then).
pub fn bundle_frame(frames: &[u8], ops: u64) -> Option<Bytes> {
    let compressed = zstd::bulk::compress(frames, LEVEL).ok()?;
    let item = proto::OpItem {
        op: Some(Op::Bundle(proto::KpngBundle {
            zstd: Bytes::from(compressed),
            ops,
            size: frames.len() as u64,
        })),
    };
    let framed = crate::frames::frames_of(std::slice::from_ref(&item));
    (framed.len() < frames.len()).then_some(framed)
}

/// The ops of `bundle`, in order.
pub fn unbundle(bundle: &proto::KpngBundle) -> Result<Vec<proto::OpItem>, BundleError> {
    if bundle.size > MAX_SIZE {
        return Err(BundleError::TooLarge(bundle.size));
    }
    let plain = zstd::bulk::decompress(&bundle.zstd, bundle.size as usize)
        .map_err(|e| BundleError::Zstd(e.to_string()))?;
    if plain.len() as u64 != bundle.size {
        return Err(BundleError::Zstd(format!(
            "{} bytes, announced {}",
            plain.len(),
            bundle.size
        )));
    }
    let mut ops = Vec::with_capacity(usize::try_from(bundle.ops).unwrap_or(0).min(1 << 16));
    let mut rest = plain.as_slice();
    while !rest.is_empty() {
        let header = rest.get(..5).ok_or(BundleError::Truncated)?;
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        let body = rest.get(5..5 + len).ok_or(BundleError::Truncated)?;
        let item = proto::OpItem::decode(body)?;
        match item.op {
            Some(Op::Bundle(_)) => return Err(BundleError::Unexpected("bundle")),
            Some(Op::Sync(_)) => return Err(BundleError::Unexpected("Sync")),
            _ => ops.push(item),
        }
        rest = &rest[5 + len..];
    }
    if ops.len() as u64 != bundle.ops {
        return Err(BundleError::Count {
            announced: bundle.ops,
            found: ops.len() as u64,
        });
    }
    Ok(ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frames::frames_of;

    fn service_op(i: usize) -> proto::OpItem {
        proto::OpItem {
            op: Some(Op::Set(proto::Value {
                r#ref: Some(proto::Ref {
                    set: proto::Set::ServicesSet as i32,
                    path: format!("default/svc-{i}"),
                }),
                bytes: Bytes::from(format!("10.96.{}.{} port 80 TCP", i / 256, i % 256)),
            })),
        }
    }

    fn the_bundle(framed: &Bytes) -> proto::KpngBundle {
        let item = proto::OpItem::decode(&framed[5..]).expect("one OpItem");
        match item.op {
            Some(Op::Bundle(b)) => b,
            other => panic!("not a bundle: {other:?}"),
        }
    }

    #[test]
    fn a_bundle_holds_exactly_the_ops_and_is_smaller() {
        let ops: Vec<_> = (0..200).map(service_op).collect();
        let frames = frames_of(&ops);
        let framed = bundle_frame(&frames, 200).expect("compressible");
        assert!(
            framed.len() * 4 < frames.len(),
            "{} → {}",
            frames.len(),
            framed.len()
        );
        assert_eq!(unbundle(&the_bundle(&framed)).expect("unbundled"), ops);
    }

    #[test]
    fn what_does_not_shrink_is_not_bundled() {
        let op = proto::OpItem {
            op: Some(Op::Reset(proto::EmptyOp {})),
        };
        assert_eq!(bundle_frame(&frames_of(&[op]), 1), None);
    }

    #[test]
    fn a_broken_or_lying_bundle_is_an_error_not_ops() {
        let ops: Vec<_> = (0..50).map(service_op).collect();
        let good = the_bundle(&bundle_frame(&frames_of(&ops), 50).expect("bundle"));
        let cases = [
            proto::KpngBundle {
                size: MAX_SIZE + 1,
                ..good.clone()
            },
            proto::KpngBundle {
                zstd: good.zstd.slice(..good.zstd.len() / 2),
                ..good.clone()
            },
            proto::KpngBundle {
                size: good.size - 1,
                ..good.clone()
            },
            proto::KpngBundle {
                ops: 49,
                ..good.clone()
            },
        ];
        for case in cases {
            assert!(unbundle(&case).is_err(), "{case:?}");
        }
        let sync = proto::OpItem {
            op: Some(Op::Sync(proto::EmptyOp {})),
        };
        let with_sync = frames_of(&[service_op(1), sync]);
        let bundle = proto::KpngBundle {
            zstd: Bytes::from(zstd::bulk::compress(&with_sync, 1).expect("compress")),
            ops: 2,
            size: with_sync.len() as u64,
        };
        assert!(matches!(
            unbundle(&bundle),
            Err(BundleError::Unexpected("Sync"))
        ));
    }
}
