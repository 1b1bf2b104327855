//! A client generated from KPNG's ORIGINAL `localv1` proto (`tests/kpng-original/`, compiled
//! separately by build.rs) watches a kpng-rs brain and decodes every Service and Endpoint,
//! as a KPNG Go backend would.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use kpng_api::hub::Hub;
use kpng_api::metrics::ApiMetrics;
use kpng_model::{ClusterConfig, ClusterModel, Event, Kind};
use prost::Message;

/// Types generated from KPNG's unmodified proto: they never saw our additions.
mod original {
    #![allow(missing_docs, clippy::all)]
    include!(concat!(env!("OUT_DIR"), "/kpng_original/localv1.rs"));
}

use original::op_item::Op;

fn fixture() -> Event {
    let text = include_str!("data/cluster.yaml");
    Event::Replace {
        kinds: vec![Kind::Service, Kind::EndpointSlice, Kind::Node],
        objects: kpng_source_file::parse_manifests(text)
            .expect("fixture")
            .objects,
    }
}

#[tokio::test]
async fn an_unmodified_kpng_client_sees_every_service_and_endpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("brain.sock");
    let hub = Arc::new(Hub::new(
        ClusterModel::new(ClusterConfig::default()),
        ApiMetrics::default(),
    ));
    hub.apply(fixture());
    let addr: kpng_api::addr::ApiAddr = format!("unix://{}", socket.display())
        .parse()
        .expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = kpng_api::server::serve(
        hub.clone(),
        &addr,
        &Default::default(),
        Default::default(),
        async {
            let _ = stopped.await;
        },
    )
    .await
    .expect("listen");
    let server = tokio::spawn(server);

    let path = socket.clone();
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
        .expect("connect");
    let mut client = original::sets_client::SetsClient::new(channel);
    let requests = tokio_stream::iter([original::WatchReq {
        node_name: "n1".into(),
    }]);
    let mut stream = client.watch(requests).await.expect("watch").into_inner();

    let mut services: BTreeMap<String, original::Service> = BTreeMap::new();
    let mut endpoints: BTreeMap<String, original::Endpoint> = BTreeMap::new();
    let mut first = None;
    loop {
        let item = stream.message().await.expect("stream").expect("an op");
        let op = item.op.expect("op");
        first.get_or_insert_with(|| format!("{op:?}"));
        match op {
            Op::Sync(_) => break,
            Op::Reset(_) => {}
            Op::Set(value) => {
                let r = value.r#ref.expect("ref");
                match original::Set::try_from(r.set) {
                    Ok(original::Set::ServicesSet) => {
                        let svc = original::Service::decode(value.bytes.as_slice())
                            .expect("an original Service decodes");
                        assert_eq!(r.path, format!("{}/{}", svc.namespace, svc.name));
                        services.insert(r.path, svc);
                    }
                    Ok(original::Set::EndpointsSet) => {
                        let ep = original::Endpoint::decode(value.bytes.as_slice())
                            .expect("an original Endpoint decodes");
                        let parts: Vec<&str> = r.path.split('/').collect();
                        assert_eq!(parts.len(), 3, "ns/service/key: {}", r.path);
                        let svc = format!("{}/{}", parts[0], parts[1]);
                        assert!(
                            services.contains_key(&svc),
                            "endpoint {} before its Service",
                            r.path
                        );
                        endpoints.insert(r.path, ep);
                    }
                    // Our node value: an unknown set number to an old client, which ignores it.
                    _ => {}
                }
            }
            Op::Delete(r) => panic!("nothing to delete in a first change set: {r:?}"),
        }
    }
    assert!(first.is_some_and(|f| f.starts_with("Reset")));

    let want_services: BTreeSet<&str> = [
        "default/lb",
        "default/np-local",
        "default/itp-local",
        "default/web",
        "other/empty",
        "other/zoned",
    ]
    .into();
    assert_eq!(
        services.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        want_services
    );
    let web = &services["default/web"];
    let ips = web.i_ps.as_ref().expect("IPs");
    assert_eq!(
        ips.cluster_i_ps.as_ref().expect("cluster IPs").v4,
        ["10.96.0.10"]
    );
    assert_eq!(
        ips.cluster_i_ps.as_ref().expect("cluster IPs").v6,
        ["fd00:96::10"]
    );
    assert_eq!(web.ports.len(), 3);
    let np = &services["default/np-local"];
    assert_eq!(
        (np.r#type.as_str(), np.external_traffic_to_local),
        ("NodePort", true)
    );
    assert_eq!(np.ports[0].node_port, 30080);
    assert_eq!(services["default/lb"].health_check_node_port, 32000);

    // Every endpoint usable from n1, with KPNG's fields.
    let want_endpoints: BTreeSet<&str> = [
        "default/itp-local/10.244.1.6",
        "default/lb/10.244.2.4",
        "default/np-local/10.244.1.3",
        "default/np-local/10.244.2.3",
        "default/web/10.244.1.2",
        "default/web/10.244.2.2",
        "default/web/fd00:244:1::2",
        "other/zoned/10.244.1.7",
    ]
    .into();
    assert_eq!(
        endpoints
            .keys()
            .map(String::as_str)
            .collect::<BTreeSet<_>>(),
        want_endpoints
    );
    let local = &endpoints["default/np-local/10.244.1.3"];
    assert!(local.local);
    assert_eq!(local.i_ps.as_ref().expect("IPs").v4, ["10.244.1.3"]);
    assert_eq!(local.port_overrides[0].port, 8080);
    let remote = &endpoints["default/np-local/10.244.2.3"];
    let scopes = remote.scopes.expect("scopes");
    assert!(!remote.local && scopes.internal && !scopes.external);
    // KPNG's port resolution (Endpoint.PortMapping) finds every port of every endpoint.
    for (path, ep) in &endpoints {
        let svc = &services[path.rsplit_once('/').expect("service path").0];
        for port in &svc.ports {
            let by_name = ep.port_overrides.iter().any(|o| o.name == port.name);
            assert!(
                by_name || port.target_port > 0,
                "{path}: port {:?}",
                port.name
            );
        }
    }

    let _ = stop.send(());
    drop(stream);
    server.abort();
}
