//! Conversion tests: what is encoded decodes to the same ports, for every node; the KPNG
//! fields say what a KPNG client needs.

use std::collections::BTreeMap;

use kpng_model::ServiceKey;
use prost::Message;

use super::*;
use crate::fixtures;

fn decode_messages(
    key: &ServiceKey,
    m: &ServiceMessages,
) -> (proto::Service, BTreeMap<String, proto::Endpoint>) {
    let service = proto::Service::decode(m.service.clone()).expect("service decodes");
    let endpoints = m
        .endpoints
        .iter()
        .map(|(k, b)| {
            (
                k.clone(),
                proto::Endpoint::decode(b.clone()).expect("endpoint decodes"),
            )
        })
        .collect();
    assert_eq!(service.namespace, *key.namespace);
    (service, endpoints)
}

#[test]
fn every_port_of_every_node_survives_the_round_trip() {
    let cluster = fixtures::cluster();
    let mut checked = 0;
    for name in ["n1", "n2", "n3", "", "not-a-node"] {
        let node = fixtures::node(&cluster, name);
        for (key, source) in cluster.sources() {
            let ports = source.ports_for(&node);
            let refs: Vec<&ServicePort> = ports.iter().collect();
            let Some(messages) = encode_service(&refs) else {
                assert!(ports.is_empty());
                continue;
            };
            let (service, endpoints) = decode_messages(key, &messages);
            let mut want = ports.clone();
            want.sort_by(|a, b| a.key.cmp(&b.key));
            let got = decode_service(key, &service, &endpoints).expect("decodes");
            assert_eq!(got, want, "node {name:?}, Service {key}");
            checked += ports.len();
        }
    }
    assert!(checked > 30, "the fixture covers many ports ({checked})");
}

#[test]
fn kpng_fields_describe_the_service_as_kpng_does() {
    let cluster = fixtures::cluster();
    let node = fixtures::node(&cluster, "n1");
    // (service, type, target port of its first port (no fixture sets targetPort: the Service
    // port), endpoints sent with (local, internal, external))
    type Want = (
        &'static str,
        &'static str,
        i32,
        &'static [(&'static str, bool, bool, bool)],
    );
    let cases: &[Want] = &[
        // The terminating n3 endpoint is not usable while others are ready: not sent.
        (
            "default/web",
            "ClusterIP",
            53,
            &[
                ("10.244.1.2", true, true, true),
                ("10.244.2.2", false, true, true),
                ("fd00:244:1::2", true, true, true),
            ],
        ),
        // eTP Local on n1: the remote endpoint serves internal traffic only.
        (
            "default/np-local",
            "NodePort",
            80,
            &[
                ("10.244.1.3", true, true, true),
                ("10.244.2.3", false, true, false),
            ],
        ),
        (
            "default/lb",
            "LoadBalancer",
            443,
            &[("10.244.2.4", false, true, false)],
        ),
        // iTP Local: only the local endpoint, for internal traffic; nothing for external use.
        (
            "default/itp-local",
            "ClusterIP",
            80,
            &[("10.244.1.6", true, true, false)],
        ),
        // Zone hints: n1 is in zone za.
        (
            "other/zoned",
            "ClusterIP",
            80,
            &[("10.244.1.7", true, true, true)],
        ),
        ("other/empty", "ClusterIP", 80, &[]),
    ];
    for (svc, ty, target, eps) in cases {
        let (ns, name) = svc.split_once('/').expect("ns/name");
        let key = ServiceKey::new(ns, name);
        let ports = cluster.source(&key).expect("source").ports_for(&node);
        let refs: Vec<&ServicePort> = ports.iter().collect();
        let messages = encode_service(&refs).expect("has ports");
        let (service, endpoints) = decode_messages(&key, &messages);
        assert_eq!(service.r#type, *ty, "{svc}");
        assert_eq!(service.ports[0].target_port, *target, "{svc}");
        let got: Vec<(String, bool, bool, bool)> = endpoints
            .iter()
            .map(|(k, e)| {
                let scopes = e.scopes.expect("scopes");
                (k.clone(), e.local, scopes.internal, scopes.external)
            })
            .collect();
        let want: Vec<(String, bool, bool, bool)> = eps
            .iter()
            .map(|(ip, l, i, x)| (ip.to_string(), *l, *i, *x))
            .collect();
        assert_eq!(got, want, "{svc}");
        for e in endpoints.values() {
            for p in &service.ports {
                assert!(
                    e.port_overrides.iter().any(|o| o.name == p.name) || p.target_port > 0,
                    "{svc}: a KPNG client finds the port of {:?}",
                    p.name
                );
            }
        }
    }
}

#[test]
fn source_ranges_and_affinity_are_kpng_fields() {
    let cluster = fixtures::cluster();
    let key = ServiceKey::new("default", "lb");
    let ports = cluster
        .source(&key)
        .expect("lb")
        .ports_for(&fixtures::node(&cluster, "n2"));
    let refs: Vec<&ServicePort> = ports.iter().collect();
    let (service, _) = decode_messages(&key, &encode_service(&refs).expect("ports"));
    assert_eq!(service.ip_filters[0].source_ranges, ["203.0.113.0/24"]);
    assert_eq!(service.health_check_node_port, 32000);
    assert_eq!(
        service.session_affinity,
        Some(proto::service::SessionAffinity::ClientIp(
            proto::ClientIpAffinity {
                timeout_seconds: 300
            }
        ))
    );
    assert_eq!(service.kpng_ports[0].local_ready_endpoints, 1);
}

#[test]
fn bad_values_are_named() {
    let key = ServiceKey::new("ns", "x");
    let service = proto::Service {
        i_ps: Some(proto::ServiceIPs {
            cluster_i_ps: Some(proto::IpSet {
                v4: vec!["10.0.0.300".into()],
                v6: vec![],
            }),
            ..proto::ServiceIPs::default()
        }),
        ..proto::Service::default()
    };
    let err = decode_service(&key, &service, &BTreeMap::new()).expect_err("bad IP");
    assert_eq!(
        err.to_string(),
        "Service ns/x: field IPs.ClusterIPs: \"10.0.0.300\" is not an IP address"
    );
}

#[test]
fn node_round_trip() {
    let cluster = fixtures::cluster();
    for name in ["n1", "n2", "absent"] {
        let node = fixtures::node(&cluster, name);
        let wire = proto::KpngNode::decode(encode_node(&node)).expect("decodes");
        assert_eq!(decode_node(&wire).expect("valid"), node, "{name}");
    }
}

#[test]
fn preserve_destination_travels_as_kpngs_annotation() {
    let cluster = fixtures::cluster();
    let key = ServiceKey::new("default", "lb");
    let mut ports = cluster
        .source(&key)
        .expect("lb")
        .ports_for(&fixtures::node(&cluster, "n2"));
    ports.sort_by(|a, b| a.key.cmp(&b.key));
    for (preserve, want) in [(false, None), (true, Some("true"))] {
        for p in &mut ports {
            p.preserve_destination = preserve;
        }
        let refs: Vec<&ServicePort> = ports.iter().collect();
        let (service, endpoints) = decode_messages(&key, &encode_service(&refs).expect("ports"));
        assert_eq!(
            service
                .annotations
                .get(ANNOTATION_PRESERVE_DESTINATION)
                .map(String::as_str),
            want
        );
        let got = decode_service(&key, &service, &endpoints).expect("decodes");
        assert_eq!(got, ports, "preserve-destination {preserve}");
    }
    // Only "true" enables it, as KPNG's Windows proxier read it.
    let refs: Vec<&ServicePort> = ports.iter().collect();
    let (mut service, endpoints) = decode_messages(&key, &encode_service(&refs).expect("ports"));
    service.annotations.insert(
        ANNOTATION_PRESERVE_DESTINATION.to_string(),
        "yes".to_string(),
    );
    let got = decode_service(&key, &service, &endpoints).expect("decodes");
    assert!(got.iter().all(|p| !p.preserve_destination));
}

/// `PortMapping.TargetPort` / `TargetPortName` are the Service's `targetPort`, as KPNG's brain
/// sent them (a KPNG client maps an endpoint with them), whatever ports the endpoints use;
/// each endpoint's own port is in its `PortOverrides`; and kpng's own client reads the same
/// model back.
#[test]
fn target_ports_are_the_services_as_kpng_sent_them() {
    use kpng_model::TargetPort;
    // (the port's name, its targetPort in YAML, its endpoints' ports, wire TargetPort and
    // TargetPortName, the names each endpoint's PortOverrides hold)
    type Case = (
        &'static str,
        &'static str,
        &'static [u16],
        i32,
        &'static str,
        &'static [&'static str],
    );
    let cases: &[Case] = &[
        ("http", ", targetPort: 8080", &[8080], 8080, "", &["http"]),
        ("http", ", targetPort: web", &[8080], 0, "web", &["http"]),
        // Unset: the Service port, as the API server defaults it.
        ("http", "", &[80], 80, "", &["http"]),
        // Endpoints that disagree (a rolling update that renumbers the container port).
        (
            "http",
            ", targetPort: web",
            &[8080, 9090],
            0,
            "web",
            &["http"],
        ),
        (
            "http",
            ", targetPort: 8080",
            &[8080, 9090],
            8080,
            "",
            &["http"],
        ),
        // No endpoints at all.
        ("http", ", targetPort: 8443", &[], 8443, "", &[]),
        // An unnamed port: KPNG's newer helper looks the override up by the target's name.
        ("", ", targetPort: web", &[8080], 0, "web", &["", "web"]),
        ("", ", targetPort: 8080", &[8080], 8080, "", &[""]),
    ];
    for (port_name, target, endpoint_ports, wire_port, wire_name, override_names) in cases {
        let mut yaml = format!(
            "kind: Node\nmetadata: {{name: n1}}\n---\nkind: Service\n\
             metadata: {{namespace: default, name: s}}\n\
             spec: {{clusterIP: 10.96.0.9, ports: [{{name: \"{port_name}\", port: 80, protocol: TCP{target}}}]}}\n"
        );
        for (i, port) in endpoint_ports.iter().enumerate() {
            yaml.push_str(&format!(
                "---\nkind: EndpointSlice\n\
                 metadata: {{namespace: default, name: s-{i}, labels: {{kubernetes.io/service-name: s}}}}\n\
                 addressType: IPv4\nports: [{{name: \"{port_name}\", port: {port}, protocol: TCP}}]\n\
                 endpoints:\n- {{addresses: [10.244.1.{i}], nodeName: n1}}\n"
            ));
        }
        let mut cluster = kpng_model::ClusterModel::new(kpng_model::ClusterConfig::default());
        let loaded = kpng_source_file::parse_manifests(&yaml).expect("manifest");
        let out = cluster.apply(kpng_model::Event::Replace {
            kinds: vec![
                kpng_model::Kind::Service,
                kpng_model::Kind::EndpointSlice,
                kpng_model::Kind::Node,
            ],
            objects: loaded.objects,
        });
        assert!(out.errors.is_empty(), "{target}: {:?}", out.errors);
        let key = ServiceKey::new("default", "s");
        let node = fixtures::node(&cluster, "n1");
        let ports = cluster.source(&key).expect("the Service").ports_for(&node);
        let want_model = if wire_name.is_empty() {
            TargetPort::Number(u16::try_from(*wire_port).expect("a port"))
        } else {
            TargetPort::Name((*wire_name).into())
        };
        assert_eq!(ports[0].target_port, want_model, "{target}");

        let refs: Vec<&ServicePort> = ports.iter().collect();
        let messages = encode_service(&refs).expect("has ports");
        let (service, endpoints) = decode_messages(&key, &messages);
        let mapping = &service.ports[0];
        assert_eq!(
            (mapping.target_port, mapping.target_port_name.as_str()),
            (*wire_port, *wire_name),
            "{target} {endpoint_ports:?}"
        );
        let overrides: Vec<(String, i32)> = endpoints
            .values()
            .flat_map(|e| e.port_overrides.iter().map(|o| (o.name.clone(), o.port)))
            .collect();
        let want: Vec<(String, i32)> = endpoint_ports
            .iter()
            .flat_map(|p| {
                override_names
                    .iter()
                    .map(move |name| (name.to_string(), i32::from(*p)))
            })
            .collect();
        assert_eq!(overrides, want, "{target} {endpoint_ports:?}");

        let got = decode_service(&key, &service, &endpoints).expect("decodes");
        assert_eq!(got, ports, "{target} {endpoint_ports:?}");
    }
}

/// A rejection's Service travels in the brain's report, and a report from a brain older than
/// the field (no field 8 on the wire) decodes with none: old peers simply lack it.
#[test]
fn a_rejections_service_travels_and_an_old_brains_lacks_it() {
    use kpng_model::records::{ConversionError, Rejection};
    let rejection = |service: Option<Box<ServiceKey>>| Rejection {
        error: ConversionError {
            object: kpng_model::ObjectRef {
                kind: kpng_model::Kind::EndpointSlice,
                namespace: "shop".into(),
                name: "cart-abc".into(),
            },
            field: "ports[0].protocol".into(),
            message: "unknown protocol".into(),
            location: None,
            service,
        },
        kept: false,
    };
    let input = kpng_model::input::InputState::default();
    // (case, the rejection's Service, as the node reads it)
    let cases = [
        (
            "an owned slice",
            Some(ServiceKey::new("shop", "cart")),
            Some("shop/cart"),
        ),
        ("a slice of no Service", None, None),
    ];
    for (case, service, want) in cases {
        let rejections = [rejection(service.map(Box::new))];
        let wire = brain_report(&input, rejections.iter(), std::iter::empty()).encode_to_vec();
        let report = proto::KpngBrainReport::decode(wire.as_slice()).expect("decodes");
        let got = decode_brain_report(&report);
        assert_eq!(got.rejected[0].service.as_deref(), want, "{case}");
    }
    // An older brain's rejection: fields 1-7 only.
    let old = proto::KpngRejectedObject {
        kind: "EndpointSlice".into(),
        namespace: "shop".into(),
        name: "cart-abc".into(),
        field: "ports[0].protocol".into(),
        message: "unknown protocol".into(),
        location: None,
        kept: false,
        service: None,
    };
    let report = proto::KpngBrainReport {
        rejected: vec![old.clone()],
        rejected_total: 1,
        ..Default::default()
    };
    let got = decode_brain_report(
        &proto::KpngBrainReport::decode(report.encode_to_vec().as_slice()).expect("decodes"),
    );
    assert_eq!(got.rejected[0].service, None);
    assert_eq!(got.rejected[0].name, "cart-abc");
    // And a new brain's field is one an older node skips as unknown: the bytes of the old
    // message are a prefix-compatible subset (field 8 is appended).
    let new = proto::KpngRejectedObject {
        service: Some("shop/cart".into()),
        ..old.clone()
    };
    let new_bytes = new.encode_to_vec();
    assert!(new_bytes.starts_with(&old.encode_to_vec()));
}
