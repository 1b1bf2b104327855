//! Which Watch streams the brain serves: a stream that never asks is closed and holds no
//! place, one client gets only its share of the places, and a node name that is not a Node's
//! is refused.

mod common;

use std::time::{Duration, Instant};

use common::{Watcher, channel_to, next_change_set, watch_as, watchers};
use kpng_api::proto;
use kpng_api::server::{ConnLimits, FIRST_REQUEST_TIMEOUT, MAX_WATCHES_PER_PEER};
use prost::bytes::Bytes;
use tokio::net::UnixStream;

/// A raw HTTP/2 connection to `socket` with `window` as its streams' initial window.
async fn raw(
    socket: &std::path::Path,
    window: u32,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let io = UnixStream::connect(socket).await.expect("connect");
    let (client, conn) = h2::client::Builder::new()
        .initial_window_size(window)
        .handshake::<_, Bytes>(io)
        .await
        .expect("handshake");
    (client, tokio::spawn(conn))
}

/// Opens a Watch stream on `client` and sends nothing on it.
async fn silent_watch(
    client: &mut h2::client::SendRequest<Bytes>,
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    client.clone().ready().await.expect("ready");
    let request = http::Request::post("http://brain/localv1.Sets/Watch")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request");
    client.send_request(request, false).expect("open a stream")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_that_never_ask_are_closed_and_do_not_keep_their_connection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("brain.sock");
    let (hub, _) = common::hub_with_one_service();
    // Longer than the first request's deadline, as by default (20 s against 5 s).
    let idle = FIRST_REQUEST_TIMEOUT + Duration::from_secs(2);
    common::serve(
        hub.clone(),
        &socket,
        ConnLimits {
            max_connections: 100,
            idle_timeout: idle,
        },
    )
    .await;

    // Eight streams that never ask (the connection's whole allowance), read as usual: each
    // is ended with DEADLINE_EXCEEDED.
    let (mut client, _conn) = raw(&socket, 65_535).await;
    let start = Instant::now();
    let mut silent = Vec::new();
    for _ in 0..8 {
        silent.push(silent_watch(&mut client).await);
    }
    for (response, _send) in silent {
        let response = response.await.expect("response");
        let mut body = response.into_body();
        let trailers = tokio::time::timeout(FIRST_REQUEST_TIMEOUT * 2, body.trailers())
            .await
            .expect("the silent stream is ended")
            .expect("trailers")
            .expect("trailers");
        assert_eq!(
            trailers.get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"4"[..]),
            "DEADLINE_EXCEEDED: {trailers:?}"
        );
    }
    let took = start.elapsed();
    assert!(
        took >= FIRST_REQUEST_TIMEOUT - Duration::from_millis(100),
        "closed after {took:?}"
    );

    // Eight that never ask and never let the brain write (a zero window): they hold no place
    // and do not count as watching, so the connection is idle and is closed.
    let (mut client, conn) = raw(&socket, 0).await;
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(silent_watch(&mut client).await);
    }
    // Closed at the idle timeout, not once the streams have been ended at their deadline.
    let closed = tokio::time::timeout(idle + Duration::from_secs(2), conn).await;
    assert!(
        closed.is_ok(),
        "a connection whose streams never ask is closed as idle"
    );

    // A node is served meanwhile and after.
    let mut node = Watcher::connect_continuous(&socket).await;
    assert_eq!(next_change_set(&mut node.stream).await, ["default/a"]);
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_gets_only_its_share_of_the_watch_streams() {
    let (hub, _) = common::hub_with_one_service();
    let brain = common::serve_tcp(hub.clone()).await;

    // One client (127.0.0.1) takes its whole share, eight streams per connection.
    let mut held = Vec::new();
    let mut channel = channel_to(brain, Some([127, 0, 0, 1])).await;
    for i in 0..MAX_WATCHES_PER_PEER {
        if i % 8 == 0 {
            channel = channel_to(brain, Some([127, 0, 0, 1])).await;
        }
        held.push(watch_as(channel.clone(), "n1").await.expect("watch"));
    }
    watchers(&hub, MAX_WATCHES_PER_PEER).await;

    // One more from it is refused…
    let channel = channel_to(brain, Some([127, 0, 0, 1])).await;
    let refused = match watch_as(channel, "n1").await {
        Err(status) => status,
        Ok((_requests, mut stream)) => {
            tokio::time::timeout(Duration::from_secs(10), stream.message())
                .await
                .expect("an answer")
                .expect_err("refused")
        }
    };
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert_eq!(hub.watchers().len(), MAX_WATCHES_PER_PEER);

    // …while another client (127.0.0.2) is served.
    let (_requests, mut stream) = watch_as(channel_to(brain, Some([127, 0, 0, 2])).await, "n2")
        .await
        .expect("watch");
    let mut first = next_change_set(&mut stream).await;
    first.sort();
    assert_eq!(first, ["default/a"]);
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_name_that_is_not_a_nodes_is_refused_naming_the_field_and_echoing_it_escaped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("brain.sock");
    let (hub, _) = common::hub_with_one_service();
    common::serve(hub.clone(), &socket, Default::default()).await;
    let long = "a".repeat(300);
    let long_shown = format!("\"{}\"…", "a".repeat(80));
    // (name sent, what the message repeats of it)
    let cases = [
        (
            "n1\x1b[31m\nforged log line",
            r#""n1\u{1b}[31m\nforged log line""#,
        ),
        (long.as_str(), long_shown.as_str()),
        ("N1", r#""N1""#),
        ("", "\"\""),
    ];
    for (bad, shown) in cases {
        let mut node = Watcher::connect(&socket).await;
        node.requests
            .send(proto::WatchReq {
                node_name: bad.into(),
                continuous: true,
                accept_zstd: false,
            })
            .await
            .expect("request");
        let status = tokio::time::timeout(Duration::from_secs(10), node.stream.message())
            .await
            .expect("an answer")
            .expect_err("refused");
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{bad:?}: {status:?}"
        );
        assert!(
            status.message().contains("DNS-1123 subdomain"),
            "{status:?}"
        );
        assert!(
            status
                .message()
                .starts_with(&format!("WatchReq.NodeName {shown} is not ")),
            "{status:?}"
        );
        assert!(
            !status.message().contains('\x1b') && !status.message().contains(&long),
            "{status:?}"
        );
    }
    assert!(hub.watchers().is_empty(), "{:?}", hub.watchers());
}

/// A client of KPNG's older `localnetv1` API (or of another method of `localv1.Sets`) learns
/// what is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_methods_are_unimplemented_saying_what_is_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("brain.sock");
    let (hub, _) = common::hub_with_one_service();
    common::serve(hub, &socket, Default::default()).await;
    // (method, what the message must say besides the served method)
    let cases = [
        (
            "/localnetv1.Endpoints/Watch",
            Some("KPNG's older localnetv1 API is not served"),
        ),
        ("/localv1.Sets/Next", None),
    ];
    for (path, older) in cases {
        let (mut client, _conn) = raw(&socket, 65_535).await;
        client.clone().ready().await.expect("ready");
        let request = http::Request::post(format!("http://localhost{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .expect("request");
        let (response, _send) = client.send_request(request, true).expect("a stream");
        let response = response.await.expect("an answer");
        let headers = response.headers();
        assert_eq!(
            headers.get("grpc-status").and_then(|v| v.to_str().ok()),
            Some("12"),
            "{path}: {headers:?}"
        );
        let message = headers
            .get("grpc-message")
            .and_then(|v| v.to_str().ok())
            .map(percent_decode)
            .unwrap_or_default();
        assert!(
            message.contains(path) && message.contains("kpng serves /localv1.Sets/Watch"),
            "{path}: {message:?}"
        );
        assert_eq!(
            older.is_some_and(|o| message.contains(o)),
            older.is_some(),
            "{path}: {message:?}"
        );
    }
}

/// A `grpc-message` as the client reads it (percent-decoded).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = text.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(hex, 16)
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
