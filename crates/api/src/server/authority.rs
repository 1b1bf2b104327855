//! Over a Unix socket (plain, or TLS once decrypted), a request `:authority` that is not a
//! URI authority is read as `localhost` before h2 sees it.
//!
//! Why: gRPC clients built on grpc-core (Python, C++, Ruby, PHP, …) send the percent-encoded
//! socket path as `:authority` when they dial `unix:///run/kpng.sock` (`run%2Fkpng.sock`). h2
//! (under tonic) parses `:authority` as a URI authority, finds a `%` in the host and resets
//! the stream (`RST_STREAM`, `PROTOCOL_ERROR`) before any service sees the request, logging
//! only at debug level in its own target; it has no option to accept it. A gRPC server
//! ignores `:authority` anyway, and over a Unix socket the only host there is is this one.
//!
//! The connection's client-to-server bytes go through [`AuthorityFix`], which decodes each
//! header block (HPACK, with the client's dynamic table) and passes it on unchanged while the
//! authority is valid. Once one is not, that block and every later one on the connection is
//! re-encoded with literals only (no dynamic table: the server's table stays as it was, so the
//! client's references cannot reach it). Every other frame passes byte for byte. Under TLS it
//! wraps the decrypted stream (the brain does the handshakes itself, `server/tls.rs`), so
//! these clients work unchanged over TLS on a Unix socket too. Over TCP such clients send a
//! valid authority, and the bytes pass as they are.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};
use tonic::transport::server::Connected;
use tracing::debug;

/// What an odd authority is read as.
const LOCALHOST: &[u8] = b"localhost";
/// The connection preface a client sends before its first frame.
const PREFACE_LEN: usize = 24;
/// An HTTP/2 frame header.
const FRAME_HEADER_LEN: usize = 9;
/// The largest frame payload every HTTP/2 peer accepts (`SETTINGS_MAX_FRAME_SIZE`'s
/// minimum): re-encoded blocks are cut into frames of at most this.
const MIN_MAX_FRAME_SIZE: usize = 16_384;
/// A header block (compressed) larger than this closes the connection: a gRPC request's
/// headers take a few hundred bytes, and the server refuses a header list over 16 KiB.
const MAX_BLOCK_BYTES: usize = 64 * 1024;
/// A header block that decodes to more than this closes the connection (HPACK lets a small
/// block name large table entries many times over).
const MAX_DECODED_BYTES: usize = 256 * 1024;
/// The dynamic table size the server allows its clients (`SETTINGS_HEADER_TABLE_SIZE`, h2's
/// default, which the brain does not change).
const MAX_TABLE_SIZE: usize = 4096;

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

fn invalid(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.to_string())
}

/// A header block being gathered (a `HEADERS` frame and its `CONTINUATION`s).
struct Block {
    stream_id: [u8; 4],
    end_stream: bool,
    /// The `HEADERS` frame's priority fields, when it had them.
    priority: Option<[u8; 5]>,
    /// The compressed header block, without padding.
    fragment: Vec<u8>,
    /// The frames as they came, to pass on unchanged.
    raw: Vec<u8>,
}

/// The client-to-server byte stream of one connection, with odd authorities replaced.
pub(crate) struct Rewriter {
    /// Bytes read and not yet handled.
    pending: Vec<u8>,
    preface_left: usize,
    /// Bytes of the current (non-header) frame's payload still to pass on.
    passing: usize,
    block: Option<Block>,
    decoder: loona_hpack::Decoder<'static>,
    /// A block was re-encoded: every later one is too.
    reencoding: bool,
}

impl Default for Rewriter {
    fn default() -> Rewriter {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(MAX_TABLE_SIZE);
        Rewriter {
            pending: Vec::new(),
            preface_left: PREFACE_LEN,
            passing: 0,
            block: None,
            decoder,
            reencoding: false,
        }
    }
}

impl Rewriter {
    /// Takes `input` (bytes from the client) and appends to `out` what the server may read.
    /// An error: the client broke HTTP/2 in a way the shim cannot pass on; the connection
    /// closes.
    pub(crate) fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
        self.pending.extend_from_slice(input);
        let mut at = 0;
        let result = self.handle(&mut at, out);
        self.pending.drain(..at);
        result
    }

    fn handle(&mut self, at: &mut usize, out: &mut Vec<u8>) -> io::Result<()> {
        loop {
            let left = &self.pending[*at..];
            if left.is_empty() {
                return Ok(());
            }
            if self.preface_left > 0 || self.passing > 0 {
                let budget = if self.preface_left > 0 {
                    &mut self.preface_left
                } else {
                    &mut self.passing
                };
                let n = (*budget).min(left.len());
                out.extend_from_slice(&left[..n]);
                *budget -= n;
                *at += n;
                continue;
            }
            if left.len() < FRAME_HEADER_LEN {
                return Ok(());
            }
            let len = usize::from(left[0]) << 16 | usize::from(left[1]) << 8 | usize::from(left[2]);
            let kind = left[3];
            let flags = left[4];
            let is_header_frame = kind == HEADERS || (kind == CONTINUATION && self.block.is_some());
            if self.block.is_some() && kind != CONTINUATION {
                return Err(invalid("a header block interrupted by another frame"));
            }
            if !is_header_frame {
                out.extend_from_slice(&left[..FRAME_HEADER_LEN]);
                *at += FRAME_HEADER_LEN;
                self.passing = len;
                continue;
            }
            if len > MAX_BLOCK_BYTES {
                return Err(invalid("a header block over 64 KiB"));
            }
            if left.len() < FRAME_HEADER_LEN + len {
                return Ok(());
            }
            let frame = &left[..FRAME_HEADER_LEN + len];
            *at += frame.len();
            let payload = &frame[FRAME_HEADER_LEN..];
            match &mut self.block {
                None => {
                    let mut body = payload;
                    if flags & PADDED != 0 {
                        let pad = usize::from(*body.first().ok_or_else(|| invalid("padding"))?);
                        body = body
                            .get(1..body.len().saturating_sub(pad))
                            .ok_or_else(|| invalid("padding longer than the frame"))?;
                    }
                    let mut priority = None;
                    if flags & PRIORITY != 0 {
                        let fields = body.get(..5).ok_or_else(|| invalid("priority"))?;
                        let mut p = [0; 5];
                        p.copy_from_slice(fields);
                        priority = Some(p);
                        body = &body[5..];
                    }
                    let mut stream_id = [0; 4];
                    stream_id.copy_from_slice(&frame[5..9]);
                    self.block = Some(Block {
                        stream_id,
                        end_stream: flags & END_STREAM != 0,
                        priority,
                        fragment: body.to_vec(),
                        raw: frame.to_vec(),
                    });
                }
                Some(block) => {
                    if block.fragment.len() + payload.len() > MAX_BLOCK_BYTES {
                        return Err(invalid("a header block over 64 KiB"));
                    }
                    block.fragment.extend_from_slice(payload);
                    block.raw.extend_from_slice(frame);
                }
            }
            if flags & END_HEADERS != 0
                && let Some(block) = self.block.take()
            {
                self.finish(block, out)?;
            }
        }
    }

    /// Passes a complete header block on: unchanged, or re-encoded with its authority
    /// replaced (and from then on always re-encoded).
    fn finish(&mut self, block: Block, out: &mut Vec<u8>) -> io::Result<()> {
        let mut headers: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut decoded = 0usize;
        self.decoder
            .decode_with_cb(&block.fragment, |name, value| {
                decoded += name.len() + value.len() + 32;
                if decoded <= MAX_DECODED_BYTES {
                    headers.push((name.into_owned(), value.into_owned()));
                }
            })
            .map_err(|e| invalid(&format!("HPACK: {e:?}")))?;
        if decoded > MAX_DECODED_BYTES {
            return Err(invalid("a header list over 256 KiB"));
        }
        for (name, value) in &mut headers {
            if name.as_slice() == b":authority"
                && http::uri::Authority::try_from(value.as_slice()).is_err()
            {
                debug!(
                    authority = %String::from_utf8_lossy(value).escape_debug(),
                    "a Unix-socket client's :authority is not a URI authority (grpc-core sends \
                     the socket path); read as localhost"
                );
                *value = LOCALHOST.to_vec();
                self.reencoding = true;
            }
        }
        if !self.reencoding {
            out.extend_from_slice(&block.raw);
            return Ok(());
        }
        let mut encoded = Vec::new();
        if let Some(p) = block.priority {
            encoded.extend_from_slice(&p);
        }
        for (name, value) in &headers {
            // Literal header field without indexing, new name (RFC 7541 §6.2.2).
            encoded.push(0);
            encode_string(name, &mut encoded);
            encode_string(value, &mut encoded);
        }
        let mut chunks = encoded.chunks(MIN_MAX_FRAME_SIZE).peekable();
        let mut first = true;
        while let Some(chunk) = chunks.next() {
            let last = chunks.peek().is_none();
            let (kind, mut flags) = if first {
                let mut flags = 0;
                if block.end_stream {
                    flags |= END_STREAM;
                }
                if block.priority.is_some() {
                    flags |= PRIORITY;
                }
                (HEADERS, flags)
            } else {
                (CONTINUATION, 0)
            };
            if last {
                flags |= END_HEADERS;
            }
            let len = chunk.len();
            out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
            out.extend_from_slice(&block.stream_id);
            out.extend_from_slice(chunk);
            first = false;
        }
        Ok(())
    }
}

/// An HPACK string literal, not Huffman-coded (RFC 7541 §5.2).
fn encode_string(s: &[u8], out: &mut Vec<u8>) {
    encode_integer(s.len(), 7, 0, out);
    out.extend_from_slice(s);
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541 §5.1).
fn encode_integer(mut value: usize, n: u32, first_bits: u8, out: &mut Vec<u8>) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(first_bits | value as u8);
        return;
    }
    out.push(first_bits | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// A Unix-socket connection (after its TLS handshake, with TLS) whose client's odd
/// `:authority` values reach h2 as `localhost` (see the module doc).
pub struct AuthorityFix<IO> {
    io: IO,
    /// `None`: the bytes pass as they are (TCP).
    rewriter: Option<Rewriter>,
    /// Bytes for the server to read, from `ready_at` on.
    ready: Vec<u8>,
    ready_at: usize,
    eof: bool,
}

impl<IO> AuthorityFix<IO> {
    /// Wraps an accepted connection (decrypted, with TLS); `rewrite`: false over TCP, whose
    /// bytes then pass as they are.
    pub fn new(io: IO, rewrite: bool) -> AuthorityFix<IO> {
        AuthorityFix {
            io,
            rewriter: rewrite.then(Rewriter::default),
            ready: Vec::new(),
            ready_at: 0,
            eof: false,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for AuthorityFix<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let Some(rewriter) = &mut this.rewriter else {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        };
        loop {
            if this.ready_at < this.ready.len() {
                let n = buf.remaining().min(this.ready.len() - this.ready_at);
                buf.put_slice(&this.ready[this.ready_at..this.ready_at + n]);
                this.ready_at += n;
                if this.ready_at == this.ready.len() {
                    this.ready.clear();
                    this.ready_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.io).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) if read.filled().is_empty() => this.eof = true,
                Poll::Ready(Ok(())) => {
                    rewriter.feed(read.filled(), &mut this.ready)?;
                }
            }
        }
    }
}

super::delegate::delegate_async_write!(AuthorityFix);

impl<IO: Connected> Connected for AuthorityFix<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// A header block as a client's encoder writes it (dynamic table included).
    fn block(encoder: &mut loona_hpack::Encoder<'_>, authority: &[u8]) -> Vec<u8> {
        let headers: Vec<(&[u8], &[u8])> = vec![
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", b"/localv1.Sets/Watch"),
            (b":authority", authority),
            (b"te", b"trailers"),
            (b"content-type", b"application/grpc"),
        ];
        encoder.encode(headers)
    }

    /// A decoded header list.
    type Headers = Vec<(Vec<u8>, Vec<u8>)>;
    /// Authorities sent on one connection, those the server must see, and whether the bytes
    /// pass unchanged.
    type Case<'a> = (&'a [&'a [u8]], &'a [&'a [u8]], bool);

    /// Splits `bytes` into frames and decodes each header block with the server's decoder.
    fn server_view(bytes: &[u8]) -> (Vec<Headers>, Vec<(u8, Vec<u8>)>) {
        assert_eq!(&bytes[..PREFACE_LEN], PREFACE);
        let mut decoder = loona_hpack::Decoder::new();
        let mut blocks = Vec::new();
        let mut others = Vec::new();
        let mut fragment = Vec::new();
        let mut at = PREFACE_LEN;
        while at < bytes.len() {
            let len = usize::from(bytes[at]) << 16
                | usize::from(bytes[at + 1]) << 8
                | usize::from(bytes[at + 2]);
            let (kind, flags) = (bytes[at + 3], bytes[at + 4]);
            let payload = &bytes[at + 9..at + 9 + len];
            at += 9 + len;
            if kind == HEADERS || kind == CONTINUATION {
                let mut body = payload;
                if kind == HEADERS && flags & PRIORITY != 0 {
                    body = &body[5..];
                }
                fragment.extend_from_slice(body);
                if flags & END_HEADERS != 0 {
                    blocks.push(decoder.decode(&fragment).expect("the server decodes it"));
                    fragment.clear();
                }
            } else {
                others.push((kind, payload.to_vec()));
            }
        }
        (blocks, others)
    }

    fn authority(block: &[(Vec<u8>, Vec<u8>)]) -> &[u8] {
        &block
            .iter()
            .find(|(n, _)| n.as_slice() == b":authority")
            .expect("an authority")
            .1
    }

    /// Feeds `input` one byte at a time (the worst split a socket can make).
    fn byte_by_byte(input: &[u8]) -> Vec<u8> {
        let mut rewriter = Rewriter::default();
        let mut out = Vec::new();
        for b in input {
            rewriter.feed(&[*b], &mut out).expect("valid input");
        }
        out
    }

    #[test]
    fn authorities_reach_the_server_valid_and_other_frames_unchanged() {
        let data = frame(0x0, END_STREAM, 1, b"\0\0\0\0\x02\x0a\x00");
        // (authorities of three requests on one connection, what the server must see)
        let cases: [Case<'_>; 4] = [
            (&[b"localhost"], &[b"localhost"], true),
            (
                &[b"run%2Fkpng%2Fext-api.sock", b"run%2Fkpng%2Fext-api.sock"],
                &[b"localhost", b"localhost"],
                false,
            ),
            (
                &[b"brain:1234", b"%2Ftmp%2Fa.sock", b"brain:1234"],
                &[b"brain:1234", b"localhost", b"brain:1234"],
                false,
            ),
            (&[b"", b"/tmp/a.sock"], &[b"localhost", b"localhost"], false),
        ];
        for (sent, seen, unchanged) in cases {
            let mut encoder = loona_hpack::Encoder::new();
            let mut input = PREFACE.to_vec();
            input.extend(frame(0x4, 0, 0, &[]));
            for (i, a) in sent.iter().enumerate() {
                let stream = 1 + 2 * i as u32;
                input.extend(frame(HEADERS, END_HEADERS, stream, &block(&mut encoder, a)));
                input.extend(frame(0x0, END_STREAM, stream, &data[9..]));
            }
            let out = byte_by_byte(&input);
            assert_eq!(out == input, unchanged, "{sent:?}");
            let (blocks, others) = server_view(&out);
            let authorities: Vec<&[u8]> = blocks.iter().map(|b| authority(b)).collect();
            assert_eq!(authorities, seen, "{sent:?}");
            for b in &blocks {
                assert!(
                    b.iter()
                        .any(|(n, v)| n == b":path" && v == b"/localv1.Sets/Watch")
                );
                assert!(b.iter().any(|(n, v)| n == b"te" && v == b"trailers"));
            }
            // SETTINGS then one DATA frame per request, byte for byte.
            assert_eq!(others.len(), 1 + sent.len(), "{sent:?}");
            assert!(others[1..].iter().all(|(k, p)| *k == 0 && p == &data[9..]));
        }
    }

    #[test]
    fn padded_prioritised_and_continued_blocks_are_rewritten() {
        let mut encoder = loona_hpack::Encoder::new();
        let fragment = block(&mut encoder, b"run%2Fkpng.sock");
        let (a, b) = fragment.split_at(fragment.len() / 2);
        let mut payload = vec![3];
        payload.extend_from_slice(&[0x80, 0, 0, 3, 15]);
        payload.extend_from_slice(a);
        payload.extend_from_slice(&[0, 0, 0]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, PADDED | PRIORITY | END_STREAM, 1, &payload));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, b));
        let out = byte_by_byte(&input);
        let (blocks, _) = server_view(&out);
        assert_eq!(blocks.len(), 1);
        assert_eq!(authority(&blocks[0]), b"localhost");
        // The first frame keeps END_STREAM and the priority fields.
        assert_eq!(out[PREFACE_LEN + 4], END_STREAM | PRIORITY | END_HEADERS);
        assert_eq!(
            &out[PREFACE_LEN + 9..PREFACE_LEN + 14],
            &[0x80, 0, 0, 3, 15]
        );
    }

    #[test]
    fn broken_input_closes_the_connection() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, 0, 1, &[0x82]));
        input.extend(frame(0x0, 0, 1, b"x"));
        let mut out = Vec::new();
        assert!(Rewriter::default().feed(&input, &mut out).is_err());

        let mut input = PREFACE.to_vec();
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &[0xff, 0xff, 0xff, 0xff, 0x0f],
        ));
        assert!(Rewriter::default().feed(&input, &mut out).is_err());
    }

    #[test]
    fn integers_use_their_prefix_and_continuation_bytes() {
        for (value, bytes) in [
            (10usize, vec![10u8]),
            (126, vec![126]),
            (127, vec![127, 0]),
            (1337, vec![127, 0xba, 0x09]),
        ] {
            let mut out = Vec::new();
            encode_integer(value, 7, 0, &mut out);
            assert_eq!(out, bytes, "{value}");
        }
    }
}
