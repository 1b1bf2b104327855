//! The brain's Unix socket: only its owner may connect, and a second brain on the same path
//! refuses to start instead of deleting the live one's socket; a stale socket is replaced.

mod common;

use std::os::unix::fs::PermissionsExt;

use common::{Watcher, next_change_set};
use kpng_api::addr::ApiAddr;
use kpng_api::proto;
use kpng_api::server::ServeError;

async fn serve(
    hub: std::sync::Arc<kpng_api::hub::Hub>,
    socket: &std::path::Path,
) -> Result<(), ServeError> {
    let addr: ApiAddr = format!("unix://{}", socket.display())
        .parse()
        .expect("addr");
    let server = kpng_api::server::serve(
        hub,
        &addr,
        &Default::default(),
        Default::default(),
        std::future::pending(),
    )
    .await?;
    tokio::spawn(server);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_socket_is_private_and_a_live_brains_socket_is_left_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("brain.sock");

    // A socket left by a brain that is gone is replaced.
    drop(std::os::unix::net::UnixListener::bind(&socket).expect("a stale socket"));
    let (hub, _) = common::hub_with_one_service();
    serve(hub, &socket)
        .await
        .expect("the stale socket is replaced");
    let mode = std::fs::metadata(&socket)
        .expect("socket")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "{mode:o}");

    // A second brain on the same path refuses, and the first still serves.
    let (other, _) = common::hub_with_one_service();
    let err = serve(other, &socket)
        .await
        .expect_err("a live brain's socket");
    let text = err.to_string();
    assert!(text.contains("answers on this socket"), "{text}");
    let mut node = Watcher::connect_continuous(&socket).await;
    assert_eq!(next_change_set(&mut node.stream).await, ["default/a"]);
}

/// An HTTP/2 frame: its type, flags, stream and payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Reads one frame: (type, flags, stream, payload).
async fn read_frame<IO: tokio::io::AsyncRead + Unpin>(io: &mut IO) -> (u8, u8, u32, Vec<u8>) {
    use tokio::io::AsyncReadExt;
    let mut header = [0u8; 9];
    io.read_exact(&mut header).await.expect("a frame header");
    let len = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
    let mut payload = vec![0; len];
    io.read_exact(&mut payload).await.expect("a frame payload");
    let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
    (header[3], header[4], stream, payload)
}

/// What grpc-core (Python, C++, Ruby…) sends when it dials `unix:///run/kpng/ext-api.sock`:
/// the socket path, percent-encoded, as `:authority`. h2 refuses such an authority (a `%` in
/// a host), so the brain reads it as `localhost`; the client gets its Watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_core_clients_watch_with_the_socket_path_as_authority() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("brain.sock");
    let (hub, _) = common::hub_with_one_service();
    serve(hub, &socket).await.expect("serve");
    let io = tokio::net::UnixStream::connect(&socket)
        .await
        .expect("connect");
    grpc_core_watch(io, b"http").await;
}

/// The same over TLS on a Unix socket: the brain terminates TLS itself, so it reads the
/// authority in the decrypted bytes (until 2026-12-06 it did not, and the stream was reset
/// with `PROTOCOL_ERROR` unless the client set `grpc.default_authority`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_core_clients_watch_with_the_socket_path_as_authority_over_tls() {
    use tokio_rustls::rustls;
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("brain.sock");
    // A CA and the brain's certificate for `localhost`, as PEM files.
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "ca");
    let ca_cert = ca_params.self_signed(&ca_key).expect("ca");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .expect("params")
        .signed_by(&key, &issuer)
        .expect("sign");
    let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert_path, cert.pem()).expect("write");
    std::fs::write(&key_path, key.serialize_pem()).expect("write");
    let (hub, _) = common::hub_with_one_service();
    let addr: ApiAddr = format!("unix://{}", socket.display())
        .parse()
        .expect("addr");
    let tls = kpng_api::addr::TlsFiles {
        cert: Some(cert_path),
        key: Some(key_path),
        ca: None,
    };
    let server =
        kpng_api::server::serve(hub, &addr, &tls, Default::default(), std::future::pending())
            .await
            .expect("serve with TLS");
    tokio::spawn(server);

    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca_cert.der().clone()).expect("the CA");
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let io = tokio::net::UnixStream::connect(&socket)
        .await
        .expect("connect");
    let io = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").expect("name"),
            io,
        )
        .await
        .expect("TLS handshake");
    grpc_core_watch(io, b"https").await;
}

/// A Watch as grpc-core sends it on a Unix socket (the path as `:authority`, HPACK with its
/// dynamic table) over `io`, until the first change set's Sync: the brain must answer it.
async fn grpc_core_watch<IO>(mut io: IO, scheme: &[u8])
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use prost::Message;
    use tokio::io::AsyncWriteExt;
    let mut encoder = loona_hpack::Encoder::new();
    let headers: Vec<(&[u8], &[u8])> = vec![
        (b":scheme", scheme),
        (b":method", b"POST"),
        (b":authority", b"run%2Fkpng%2Fext-api.sock"),
        (b":path", b"/localv1.Sets/Watch"),
        (b"te", b"trailers"),
        (b"content-type", b"application/grpc"),
        (
            b"user-agent",
            b"grpc-python/1.76.0 grpc-c/51.0.0 (linux; chttp2)",
        ),
    ];
    let request = proto::WatchReq {
        node_name: "n1".into(),
        continuous: false,
        accept_zstd: false,
    }
    .encode_to_vec();
    let mut message = vec![0];
    message.extend_from_slice(&u32::try_from(request.len()).expect("small").to_be_bytes());
    message.extend_from_slice(&request);
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    out.extend(frame(0x1, 0x4, 1, &encoder.encode(headers)));
    out.extend(frame(0x0, 0, 1, &message));
    io.write_all(&out).await.expect("send the request");
    io.flush().await.expect("flush");

    // Until the first change set's Sync: the response headers, then OpItems.
    let mut decoder = loona_hpack::Decoder::new();
    let mut status = None;
    let mut body = Vec::new();
    let mut ops = Vec::new();
    let read = async {
        loop {
            let (kind, flags, stream, payload) = read_frame(&mut io).await;
            match (kind, stream) {
                (0x4, 0) if flags & 0x1 == 0 => {
                    io.write_all(&frame(0x4, 0x1, 0, &[])).await.expect("ack");
                    io.flush().await.expect("flush");
                }
                (0x3, 1) => panic!("the brain reset the stream: error code {payload:?}"),
                (0x7, _) => panic!("the brain closed the connection (GOAWAY {payload:?})"),
                (0x1, 1) => {
                    for (name, value) in decoder.decode(&payload).expect("response headers") {
                        if name == b":status" {
                            status = Some(String::from_utf8(value).expect("status"));
                        }
                    }
                }
                (0x0, 1) => {
                    body.extend_from_slice(&payload);
                    while body.len() >= 5 {
                        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]);
                        let len = usize::try_from(len).expect("length");
                        if body.len() < 5 + len {
                            break;
                        }
                        let op = proto::OpItem::decode(&body[5..5 + len]).expect("an OpItem");
                        body.drain(..5 + len);
                        ops.push(op);
                    }
                    if ops
                        .iter()
                        .any(|op| matches!(op.op, Some(proto::op_item::Op::Sync(_))))
                    {
                        return;
                    }
                }
                _ => {}
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), read)
        .await
        .expect("a change set within 30 s");
    assert_eq!(status.as_deref(), Some("200"));
    assert!(
        matches!(
            ops.first().and_then(|op| op.op.as_ref()),
            Some(proto::op_item::Op::Reset(_))
        ),
        "{ops:?}"
    );
    assert!(
        ops.iter().any(|op| matches!(
            &op.op,
            Some(proto::op_item::Op::Set(v))
                if v.r#ref.as_ref().is_some_and(|r| r.path == "default/a")
        )),
        "{ops:?}"
    );
}
