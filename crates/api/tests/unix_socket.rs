//! The brain's Unix socket: only its owner may connect, and a second brain on the same path
//! refuses to start instead of deleting the live one's socket; a stale socket is replaced.

mod common;

use std::os::unix::fs::PermissionsExt;

use common::{Watcher, next_change_set};
use kpng_api::addr::ApiAddr;
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
