//! How a simulated node reads its Watch stream: a tonic codec that either decodes every op and
//! value, as a kpng node does, or only takes the stream apart into gRPC messages.
//!
//! The second exists because on one machine the simulated nodes share the brain's CPUs: at a
//! thousand nodes their decoding (about 85 ms of CPU per node for 30k × 4) bounds the time
//! until all hold the initial state, and hides how fast the brain itself fans the state out.
//! Reading frames only, every byte still crosses the socket and HTTP/2 flow control, and each
//! message is still counted, so the figures stay comparable (the ops per node must match).

use prost::Message;
use prost::bytes::Buf;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

use kpng_api::proto;

/// What each simulated node does with the messages it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// Decodes every op and every `Service` and `Endpoint` value: a node's own work.
    Decode,
    /// Splits the stream into messages and spots `Sync` by its bytes; decodes nothing.
    Frames,
}

impl Reading {
    /// The name on the command line (`--read decode|frames`).
    pub fn name(self) -> &'static str {
        match self {
            Reading::Decode => "decode",
            Reading::Frames => "frames",
        }
    }

    /// Parses [`Reading::name`].
    pub fn parse(name: &str) -> Result<Reading, String> {
        match name {
            "decode" => Ok(Reading::Decode),
            "frames" => Ok(Reading::Frames),
            other => Err(format!("--read {other:?}: expected decode or frames")),
        }
    }
}

/// A message of the stream, as the node's loop needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// The change set is complete.
    Sync,
    /// Any other op.
    Op,
    /// A bundle of this many ops (a node that reads bundles).
    Bundle(u64),
}

/// The codec of one simulated node's Watch call.
#[derive(Debug, Clone, Copy)]
pub struct NodeCodec(pub Reading);

impl Codec for NodeCodec {
    type Encode = proto::WatchReq;
    type Decode = Received;
    type Encoder = RequestEncoder;
    type Decoder = NodeDecoder;

    fn encoder(&mut self) -> RequestEncoder {
        RequestEncoder
    }

    fn decoder(&mut self) -> NodeDecoder {
        NodeDecoder {
            reading: self.0,
            sync: sync_bytes(),
        }
    }
}

/// The exact encoding of a `Sync` op: what [`Reading::Frames`] compares messages with.
fn sync_bytes() -> Vec<u8> {
    proto::OpItem {
        op: Some(proto::op_item::Op::Sync(proto::EmptyOp {})),
    }
    .encode_to_vec()
}

/// Encodes the node's `WatchReq`s.
#[derive(Debug)]
pub struct RequestEncoder;

impl Encoder for RequestEncoder {
    type Item = proto::WatchReq;
    type Error = Status;

    fn encode(&mut self, item: proto::WatchReq, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("encoding a WatchReq: {e}")))
    }
}

/// Reads one message as its [`Reading`] says.
#[derive(Debug)]
pub struct NodeDecoder {
    reading: Reading,
    sync: Vec<u8>,
}

impl Decoder for NodeDecoder {
    type Item = Received;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Received>, Status> {
        match self.reading {
            Reading::Frames => {
                let len = src.remaining();
                if src.chunk().starts_with(&BUNDLE_TAG) {
                    // Its op count, without opening it.
                    return match decode_item(src)?.op {
                        Some(proto::op_item::Op::Bundle(b)) => Ok(Some(Received::Bundle(b.ops))),
                        _ => Ok(Some(Received::Op)),
                    };
                }
                let received = classify_frame(src.chunk(), len, &self.sync);
                src.advance(len);
                Ok(Some(received))
            }
            Reading::Decode => decode_op(src).map(Some),
        }
    }
}

/// A message of `len` bytes whose first contiguous bytes are `head`.
fn classify_frame(head: &[u8], len: usize, sync: &[u8]) -> Received {
    if len == sync.len() && head.starts_with(sync) {
        Received::Sync
    } else {
        Received::Op
    }
}

/// How an `OpItem` holding a bundle starts: field 100 (`Bundle`), length-delimited.
const BUNDLE_TAG: [u8; 2] = [0xa2, 0x06];

fn decode_item(src: impl Buf) -> Result<proto::OpItem, Status> {
    proto::OpItem::decode(src).map_err(|e| Status::internal(format!("decoding an op: {e}")))
}

/// Decodes an op and the `Service` or `Endpoint` value it carries (every op of a bundle).
fn decode_op(src: impl Buf) -> Result<Received, Status> {
    let item = decode_item(src)?;
    if let Some(proto::op_item::Op::Bundle(bundle)) = &item.op {
        let ops = kpng_api::bundle::unbundle(bundle)
            .map_err(|e| Status::internal(format!("opening a bundle: {e}")))?;
        for op in ops {
            decode_value(op)?;
        }
        return Ok(Received::Bundle(bundle.ops));
    }
    decode_value(item)
}

/// Decodes the `Service` or `Endpoint` value `item` carries.
fn decode_value(item: proto::OpItem) -> Result<Received, Status> {
    match item.op {
        Some(proto::op_item::Op::Sync(_)) => Ok(Received::Sync),
        Some(proto::op_item::Op::Set(value)) => {
            let set = value.r#ref.map_or(0, |r| r.set);
            let decoded = if set == proto::Set::ServicesSet as i32 {
                proto::Service::decode(value.bytes).map(drop)
            } else if set == proto::Set::EndpointsSet as i32 {
                proto::Endpoint::decode(value.bytes).map(drop)
            } else {
                Ok(())
            };
            decoded.map_err(|e| Status::internal(format!("decoding a value: {e}")))?;
            Ok(Received::Op)
        }
        _ => Ok(Received::Op),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops() -> Vec<proto::OpItem> {
        use proto::op_item::Op;
        let value = |set: proto::Set, bytes: Vec<u8>| {
            Op::Set(proto::Value {
                r#ref: Some(proto::Ref {
                    set: set as i32,
                    path: "default/web".into(),
                }),
                bytes: bytes.into(),
            })
        };
        [
            Op::Reset(proto::EmptyOp {}),
            value(
                proto::Set::ServicesSet,
                proto::Service::default().encode_to_vec(),
            ),
            value(
                proto::Set::EndpointsSet,
                proto::Endpoint::default().encode_to_vec(),
            ),
            // An op whose encoding is as short as Sync's.
            Op::Delete(proto::Ref::default()),
            Op::Sync(proto::EmptyOp {}),
        ]
        .into_iter()
        .map(|op| proto::OpItem { op: Some(op) })
        .collect()
    }

    #[test]
    fn reading_frames_finds_the_syncs_that_decoding_finds() {
        let sync = sync_bytes();
        for op in ops() {
            let bytes = op.encode_to_vec();
            let decoded = decode_op(bytes.as_slice()).expect("decodes");
            assert_eq!(
                classify_frame(&bytes, bytes.len(), &sync),
                decoded,
                "{op:?}"
            );
        }
        let syncs = ops()
            .iter()
            .filter(|op| matches!(op.op, Some(proto::op_item::Op::Sync(_))))
            .count();
        assert_eq!(syncs, 1);
    }

    #[test]
    fn a_bundle_counts_its_ops_opened_or_not() {
        let inner: Vec<proto::OpItem> = ops()
            .into_iter()
            .filter(|o| !matches!(o.op, Some(proto::op_item::Op::Sync(_))))
            .cycle()
            .take(200)
            .collect();
        let frames = kpng_api::frames::frames_of(&inner);
        let framed = kpng_api::bundle::bundle_frame(&frames, 200).expect("it compresses");
        let message = &framed[5..];
        assert!(message.starts_with(&BUNDLE_TAG));
        assert_eq!(decode_op(message).expect("decodes"), Received::Bundle(200));
        let outer = decode_item(message).expect("an OpItem");
        assert!(matches!(outer.op, Some(proto::op_item::Op::Bundle(b)) if b.ops == 200));
    }

    #[test]
    fn the_read_flag_names_round_trip() {
        for reading in [Reading::Decode, Reading::Frames] {
            assert_eq!(Reading::parse(reading.name()), Ok(reading));
        }
        assert!(Reading::parse("bytes").is_err());
    }
}
