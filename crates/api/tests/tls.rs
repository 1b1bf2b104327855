//! TLS and mTLS between a brain and its clients: with the right certificates the client gets
//! the state; without a client certificate an mTLS brain refuses the stream.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use kpng_api::addr::{ApiAddr, TlsFiles};
use kpng_api::client::{WatchConfig, watch};
use kpng_api::hub::Hub;
use kpng_api::metrics::ApiMetrics;
use kpng_model::{ClusterConfig, ClusterModel, Event, Kind};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

/// A CA, a server certificate for `localhost` and a client certificate, as PEM files.
fn certificates(dir: &Path) -> (TlsFiles, TlsFiles) {
    let ca_key = KeyPair::generate().expect("key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).expect("ca");
    let issuer = Issuer::new(ca_params, ca_key);
    let write = |name: &str, text: String| {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write pem");
        p
    };
    let ca = write("ca.pem", ca_cert.pem());
    let mut files = Vec::new();
    for (who, names) in [
        ("server", vec!["localhost".to_string()]),
        ("client", vec!["node1".to_string()]),
    ] {
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(names)
            .expect("params")
            .signed_by(&key, &issuer)
            .expect("sign");
        files.push(TlsFiles {
            cert: Some(write(&format!("{who}.pem"), cert.pem())),
            key: Some(write(&format!("{who}-key.pem"), key.serialize_pem())),
            ca: Some(ca.clone()),
        });
    }
    let client = files.pop().expect("client");
    let server = files.pop().expect("server");
    (server, client)
}

fn fixture() -> Event {
    Event::Replace {
        kinds: vec![Kind::Service, Kind::EndpointSlice, Kind::Node],
        objects: kpng_source_file::parse_manifests(include_str!("data/cluster.yaml"))
            .expect("fixture")
            .objects,
    }
}

#[tokio::test]
async fn mtls_brain_serves_clients_with_certificates_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server_tls, client_tls) = certificates(dir.path());
    let socket = dir.path().join("brain.sock");
    let addr: ApiAddr = format!("unix://{}", socket.display())
        .parse()
        .expect("addr");
    let hub = Arc::new(Hub::new(
        ClusterModel::new(ClusterConfig::default()),
        ApiMetrics::default(),
    ));
    hub.apply(fixture());
    let server = kpng_api::server::serve(
        hub,
        &addr,
        &server_tls,
        Default::default(),
        std::future::pending(),
    )
    .await
    .expect("listen with TLS");
    let server = tokio::spawn(server);

    // A client with its certificate receives the state.
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    let config = WatchConfig {
        addr: addr.clone(),
        tls: client_tls.clone(),
        tls_server_name: Some("localhost".into()),
        node_name: "node1".into(),
        retry_min: Duration::from_millis(50),
        retry_max: Duration::from_millis(200),
        health: Default::default(),
        no_state_grace: kpng_api::client::NO_STATE_GRACE,
    };
    let client = tokio::spawn(watch(config.clone(), tx));
    let update = rx.recv().await.expect("a change set over mTLS");
    assert_eq!(update.services.len(), 6);
    assert_eq!(update.node.expect("node").name, "node1");
    drop(rx);
    client.abort();

    raw_watch(&socket, &client_tls, true, "node1")
        .await
        .expect("its own name, with tonic's client");
    // The same certificate does not let it watch as another node: the brain says why.
    let err = raw_watch(&socket, &client_tls, true, "node2")
        .await
        .expect_err("node1's certificate must not watch as node2");
    assert!(err.contains("does not name node"), "{err}");

    // A node without TLS flags is told the brain seems to serve TLS (the transport only says
    // FRAME_SIZE_ERROR).
    let (tx, _rx) = tokio::sync::mpsc::channel(4);
    let plaintext = WatchConfig {
        tls: TlsFiles::default(),
        ..config.clone()
    };
    let health = plaintext.health.clone();
    let client = tokio::spawn(watch(plaintext, tx));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let message = loop {
        if let Some(p) = health.state().problems.get("brain") {
            break p.message.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no problem reported"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Over TCP the transport says FRAME_SIZE_ERROR ("seems to serve TLS"), over a Unix
    // socket only that the connection closed ("if the brain serves TLS").
    assert!(message.contains("TLS: give --api-tls-ca"), "{message}");
    client.abort();

    // Without a client certificate, the handshake or the stream fails.
    let refused = raw_watch(&socket, &client_tls, false, "node1");
    assert!(
        refused.await.is_err(),
        "a client without a certificate must be refused"
    );
    server.abort();
}

/// One Watch over the Unix socket with tonic's own client, with or without the client
/// certificate of `tls`; `Err` with the failure (handshake, or the stream's status).
async fn raw_watch(
    socket: &Path,
    tls: &TlsFiles,
    with_certificate: bool,
    node: &str,
) -> Result<(), String> {
    let path = socket.to_path_buf();
    let ca = std::fs::read(tls.ca.as_ref().expect("ca")).expect("ca pem");
    let mut config = tonic::transport::ClientTlsConfig::new()
        .domain_name("localhost")
        .ca_certificate(tonic::transport::Certificate::from_pem(ca));
    if with_certificate {
        let cert = std::fs::read(tls.cert.as_ref().expect("cert")).expect("cert pem");
        let key = std::fs::read(tls.key.as_ref().expect("key")).expect("key pem");
        config = config.identity(tonic::transport::Identity::from_pem(cert, key));
    }
    let endpoint = tonic::transport::Endpoint::from_static("https://localhost")
        .tls_config(config)
        .expect("tls config");
    let channel = endpoint
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
        .map_err(|e| e.to_string())?;
    let mut stream = kpng_api::proto::sets_client::SetsClient::new(channel)
        .watch(tokio_stream::iter([kpng_api::proto::WatchReq {
            node_name: node.into(),
            continuous: false,
            accept_zstd: false,
        }]))
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    stream.message().await.map_err(|e| e.to_string())?;
    Ok(())
}
