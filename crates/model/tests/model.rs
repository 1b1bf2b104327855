//! Model tests: conversion rules, incremental diffs, relists, node changes.

use serde_json::{Value, json};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kpng_k8s::from_json;
use kpng_model::*;

fn service(value: Value) -> Object {
    from_json::<Service>(value)
        .expect("valid Service JSON")
        .object
}

fn slice(value: Value) -> Object {
    from_json::<EndpointSlice>(value)
        .expect("valid EndpointSlice JSON")
        .object
}

fn node(value: Value) -> Object {
    from_json::<Node>(value).expect("valid Node JSON").object
}

fn svc(name: &str, spec: Value) -> Object {
    service(json!({"metadata": {"namespace": "ns", "name": name}, "spec": spec}))
}

/// A slice of service `svc` named `name`, port `p80`/TCP → `target`, with endpoints given as
/// (ip, node, ready, serving, terminating).
fn eps(svc: &str, name: &str, target: i32, endpoints: &[(&str, &str, bool, bool, bool)]) -> Object {
    let addr_type = if endpoints.first().is_some_and(|e| e.0.contains(':')) {
        "IPv6"
    } else {
        "IPv4"
    };
    slice(json!({
        "metadata": {"namespace": "ns", "name": name, "labels": {"kubernetes.io/service-name": svc}},
        "addressType": addr_type,
        "ports": [{"name": "p80", "port": target, "protocol": "TCP"}],
        "endpoints": endpoints.iter().map(|(ip, node, r, s, t)| json!({
            "addresses": [ip], "nodeName": node,
            "conditions": {"ready": r, "serving": s, "terminating": t}
        })).collect::<Vec<_>>()
    }))
}

fn basic_spec() -> Value {
    json!({"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"], "ports": [{"name": "p80", "port": 80, "protocol": "TCP"}]})
}

fn model() -> Model {
    Model::new(ModelConfig {
        node_name: "node-a".into(),
        ..ModelConfig::default()
    })
}

fn key(name: &str, family: Family) -> PortKey {
    PortKey {
        service: ServiceKey::new("ns", name),
        port_name: "p80".into(),
        protocol: Protocol::Tcp,
        family,
    }
}

fn endpoint_strings(eps: &[crate::Endpoint]) -> Vec<String> {
    eps.iter().map(|e| e.to_string()).collect()
}

#[test]
fn cluster_ip_service_with_endpoints() {
    let mut m = model();
    m.apply(Event::Apply(svc("web", basic_spec())));
    let out = m.apply(Event::Apply(eps(
        "web",
        "web-1",
        8080,
        &[
            ("10.0.2.1", "node-b", true, true, false),
            ("10.0.1.1", "node-a", true, true, false),
            ("10.0.3.1", "node-c", false, false, false),
        ],
    )));
    assert_eq!(out.diff.changes.len(), 1);
    let port = &m.snapshot().ports[&key("web", Family::V4)];
    assert_eq!(port.cluster_ip.to_string(), "10.96.0.10");
    assert_eq!(port.port, 80);
    // Sorted by "IP:port"; the slice port (8080) is the target; unready endpoints are left out.
    assert_eq!(
        endpoint_strings(&port.cluster_endpoints),
        ["10.0.1.1:8080", "10.0.2.1:8080"]
    );
    assert!(port.local_endpoints.is_empty());
    assert!(port.has_any_endpoints);
    assert_eq!(port.local_ready_endpoints, 1);
    assert_eq!(
        port.serving_endpoints,
        [
            "10.0.1.1:8080".parse().expect("addr"),
            "10.0.2.1:8080".parse().expect("addr")
        ]
    );
}

#[test]
fn one_endpoint_change_yields_exactly_one_port_in_the_diff() {
    let mut m = model();
    for i in 0..50 {
        m.apply(Event::Apply(svc(
            &format!("s{i}"),
            json!({"clusterIP": format!("10.96.1.{i}"), "ports": [{"name": "p80", "port": 80}]}),
        )));
        m.apply(Event::Apply(eps(
            &format!("s{i}"),
            &format!("s{i}-x"),
            80,
            &[("10.0.0.1", "node-b", true, true, false)],
        )));
    }
    let out = m.apply(Event::Apply(eps(
        "s7",
        "s7-x",
        80,
        &[("10.0.0.2", "node-b", true, true, false)],
    )));
    assert_eq!(out.diff.changes.len(), 1);
    let (k, change) = out.diff.changes.iter().next().expect("one change");
    assert_eq!(k, &key("s7", Family::V4));
    assert_eq!(
        endpoint_strings(&change.old.as_ref().expect("old").cluster_endpoints),
        ["10.0.0.1:80"]
    );
    assert_eq!(
        endpoint_strings(&change.new.as_ref().expect("new").cluster_endpoints),
        ["10.0.0.2:80"]
    );
    // Applying the same object again changes nothing.
    let again = m.apply(Event::Apply(eps(
        "s7",
        "s7-x",
        80,
        &[("10.0.0.2", "node-b", true, true, false)],
    )));
    assert!(again.diff.is_empty());
}

#[test]
fn dual_stack_service_gets_one_port_per_family() {
    let mut m = model();
    m.apply(Event::Apply(svc(
        "ds",
        json!({
            "clusterIP": "10.96.0.20", "clusterIPs": ["10.96.0.20", "fd00:96::20"],
            "externalIPs": ["192.0.2.7", "2001:db8::7"],
            "ports": [{"name": "p80", "port": 80}]
        }),
    )));
    m.apply(Event::Apply(eps(
        "ds",
        "ds-v4",
        80,
        &[("10.0.0.1", "node-a", true, true, false)],
    )));
    m.apply(Event::Apply(eps(
        "ds",
        "ds-v6",
        80,
        &[("fd00::1", "node-a", true, true, false)],
    )));
    let v4 = &m.snapshot().ports[&key("ds", Family::V4)];
    let v6 = &m.snapshot().ports[&key("ds", Family::V6)];
    assert_eq!(
        v4.external_ips
            .iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>(),
        ["192.0.2.7"]
    );
    assert_eq!(
        v6.external_ips
            .iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>(),
        ["2001:db8::7"]
    );
    assert_eq!(endpoint_strings(&v4.cluster_endpoints), ["10.0.0.1:80"]);
    assert_eq!(endpoint_strings(&v6.cluster_endpoints), ["[fd00::1]:80"]);
}

#[test]
fn services_that_get_no_rules() {
    let cases = [
        (
            "headless",
            json!({"metadata": {"namespace": "ns", "name": "x"}, "spec": {"clusterIP": "None", "ports": [{"port": 80}]}}),
        ),
        (
            "no cluster IP",
            json!({"metadata": {"namespace": "ns", "name": "x"}, "spec": {"ports": [{"port": 80}]}}),
        ),
        (
            "ExternalName",
            json!({"metadata": {"namespace": "ns", "name": "x"}, "spec": {"type": "ExternalName", "externalName": "example.com", "clusterIP": "10.96.0.1"}}),
        ),
        (
            "other proxy",
            json!({"metadata": {"namespace": "ns", "name": "x", "labels": {"service.kubernetes.io/service-proxy-name": "other"}}, "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}}),
        ),
        (
            "headless label",
            json!({"metadata": {"namespace": "ns", "name": "x", "labels": {"service.kubernetes.io/headless": ""}}, "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}}),
        ),
    ];
    for (name, value) in cases {
        let mut m = model();
        let out = m.apply(Event::Apply(service(value)));
        assert!(out.errors.is_empty(), "{name}: {:?}", out.errors);
        assert!(m.snapshot().ports.is_empty(), "{name}: expected no ports");
    }
}

#[test]
fn service_proxy_name_label_decides_ownership() {
    // (our --service-proxy-name, the Service's label, whether we program it): the label names
    // the proxy that owns the Service, as the kube source's label selector does.
    let cases = [
        (None, None, true),
        (None, Some("other"), false),
        (Some("kpng"), Some("kpng"), true),
        (Some("kpng"), Some("other"), false),
        (Some("kpng"), None, false),
    ];
    for (ours, label, programmed) in cases {
        let mut m = Model::new(ModelConfig {
            node_name: "n".into(),
            service_proxy_name: ours.map(str::to_string),
            node_ips: vec![],
            node_port_range: None,
            service_cidrs: vec![],
        });
        let labels = match label {
            Some(l) => json!({"service.kubernetes.io/service-proxy-name": l}),
            None => json!({}),
        };
        m.apply(Event::Apply(service(json!({"metadata": {"namespace": "ns", "name": "x", "labels": labels}, "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}}))));
        assert_eq!(
            m.snapshot().ports.len(),
            usize::from(programmed),
            "ours={ours:?} label={label:?}"
        );
    }
}

fn service_cidr(name: &str, cidrs: &[&str]) -> Object {
    from_json::<ServiceCIDR>(json!({"metadata": {"name": name}, "spec": {"cidrs": cidrs}}))
        .expect("valid ServiceCIDR JSON")
        .object
}

#[test]
fn service_cidrs_are_the_union_of_every_object_and_a_change_is_a_node_change() {
    let mut m = model();
    let out = m.apply(Event::Apply(service_cidr(
        "kubernetes",
        &["10.96.0.0/16", "fd00:96::/112"],
    )));
    assert!(out.diff.node_changed);
    let extra = from_json::<ServiceCIDR>(json!({"metadata": {"name": "extra"},
        "spec": {"cidrs": ["10.97.0.0/16", "10.96.0.0/16", "bad"]}}))
    .expect("valid ServiceCIDR JSON");
    assert_eq!(extra.warnings.len(), 1, "{:?}", extra.warnings);
    assert_eq!(extra.warnings[0].field, "spec.cidrs[2]");
    let out = m.apply(Event::Apply(extra.object));
    assert!(out.diff.node_changed);
    let cidrs: Vec<String> = m
        .snapshot()
        .service_cidrs
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(cidrs, ["10.96.0.0/16", "10.97.0.0/16", "fd00:96::/112"]);
    // The same object again changes nothing.
    let out = m.apply(Event::Apply(service_cidr(
        "extra",
        &["10.97.0.0/16", "10.96.0.0/16", "bad"],
    )));
    assert!(out.diff.is_empty());
    // A relist without "extra" removes its range.
    let out = m.apply(Event::Replace {
        kinds: vec![Kind::ServiceCidr],
        objects: vec![service_cidr(
            "kubernetes",
            &["10.96.0.0/16", "fd00:96::/112"],
        )],
    });
    assert!(out.diff.node_changed);
    assert_eq!(m.snapshot().service_cidrs.len(), 2);
    let out = m.apply(Event::Delete(ObjectRef {
        kind: Kind::ServiceCidr,
        namespace: "".into(),
        name: "kubernetes".into(),
    }));
    assert!(out.diff.node_changed);
    assert!(m.snapshot().service_cidrs.is_empty());
}

#[test]
fn lists_of_different_kinds_interleave() {
    let mut m = model();
    m.apply(Event::Replace {
        kinds: vec![Kind::Service, Kind::EndpointSlice],
        objects: vec![
            svc("a", basic_spec()),
            eps(
                "a",
                "a-1",
                8080,
                &[("10.0.0.1", "node-b", true, true, false)],
            ),
        ],
    });
    // Two watchers relist at once: Services keep "a"; EndpointSlices move "a" to 10.0.0.2.
    m.apply(Event::ListStart {
        kinds: vec![Kind::Service],
    });
    m.apply(Event::ListStart {
        kinds: vec![Kind::EndpointSlice],
    });
    m.apply(Event::ListItem(eps(
        "a",
        "a-2",
        8080,
        &[("10.0.0.2", "node-b", true, true, false)],
    )));
    m.apply(Event::ListItem(svc("a", basic_spec())));
    let services_done = m.apply(Event::ListDone {
        kinds: vec![Kind::Service],
    });
    assert!(services_done.diff.is_empty(), "{:?}", services_done.diff);
    let slices_done = m.apply(Event::ListDone {
        kinds: vec![Kind::EndpointSlice],
    });
    assert_eq!(slices_done.diff.changes.len(), 1);
    assert_eq!(slices_done.slices_changed, 1, "a-1 is gone");
    let port = &m.snapshot().ports[&key("a", Family::V4)];
    assert_eq!(endpoint_strings(&port.cluster_endpoints), ["10.0.0.2:8080"]);
}

#[test]
fn an_abandoned_list_leaves_nothing_stale() {
    let mut m = model();
    m.apply(Event::Replace {
        kinds: vec![Kind::Service],
        objects: vec![svc("a", basic_spec())],
    });
    // A list starts, applies a new Service "b", and is abandoned (the watcher restarted).
    m.apply(Event::ListStart {
        kinds: vec![Kind::Service],
    });
    m.apply(Event::ListItem(svc(
        "b",
        json!({"clusterIP": "10.96.0.11", "ports": [{"name": "p80", "port": 80}]}),
    )));
    m.apply(Event::ListStart {
        kinds: vec![Kind::Service],
    });
    m.apply(Event::ListItem(svc("a", basic_spec())));
    m.apply(Event::ListItem(svc(
        "b",
        json!({"clusterIP": "10.96.0.11", "ports": [{"name": "p80", "port": 80}]}),
    )));
    let done = m.apply(Event::ListDone {
        kinds: vec![Kind::Service],
    });
    let names: Vec<&str> = done.diff.changes.keys().map(|k| &*k.service.name).collect();
    assert_eq!(
        names,
        ["b"],
        "b, applied by the abandoned list, reaches the snapshot"
    );
}

#[test]
fn changes_are_counted_per_object_as_kube_proxy_does() {
    let mut m = model();
    let out = m.apply(Event::Apply(svc("a", basic_spec())));
    assert_eq!(out.services_changed, [ServiceKey::new("ns", "a")]);
    let out = m.apply(Event::Apply(svc("a", basic_spec())));
    assert!(out.services_changed.is_empty(), "unchanged object");
    let slice = eps(
        "a",
        "a-1",
        8080,
        &[("10.0.0.1", "node-b", true, true, false)],
    );
    assert_eq!(m.apply(Event::Apply(slice.clone())).slices_changed, 1);
    assert_eq!(m.apply(Event::Apply(slice)).slices_changed, 0);
    let out = m.apply(Event::Delete(ObjectRef {
        kind: Kind::EndpointSlice,
        namespace: "ns".into(),
        name: "a-1".into(),
    }));
    assert_eq!(out.slices_changed, 1);
    let out = m.apply(Event::Replace {
        kinds: vec![Kind::Service],
        objects: vec![],
    });
    assert_eq!(
        out.services_changed,
        [ServiceKey::new("ns", "a")],
        "removed by the relist"
    );
}

#[test]
fn trigger_times_come_from_changed_slices_only() {
    let with_time = |name: &str, ip: &str, time: &str| {
        slice(json!({
            "metadata": {"namespace": "ns", "name": name,
                "labels": {"kubernetes.io/service-name": "a"},
                "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": time}},
            "addressType": if ip.contains(':') { "IPv6" } else { "IPv4" },
            "ports": [{"name": "p80", "port": 8080}],
            "endpoints": [{"addresses": [ip]}]
        }))
    };
    let mut m = model();
    let out = m.apply(Event::Apply(with_time(
        "a-1",
        "10.0.0.1",
        "2026-01-02T03:04:05.5Z",
    )));
    let want = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_767_323_045_500);
    assert_eq!(
        out.trigger_times,
        [TriggerTime {
            service: ServiceKey::new("ns", "a"),
            family: Family::V4,
            at: want,
        }]
    );
    // Unchanged: no new trigger time.
    let out = m.apply(Event::Apply(with_time(
        "a-1",
        "10.0.0.1",
        "2026-01-02T03:04:05.5Z",
    )));
    assert!(out.trigger_times.is_empty());
    let out = m.apply(Event::Apply(with_time(
        "a-2",
        "fd00::1",
        "2026-01-02T03:04:06+00:00",
    )));
    assert_eq!(out.trigger_times.len(), 1);
    assert_eq!(out.trigger_times[0].family, Family::V6);
    // An unparseable annotation is ignored, as upstream does.
    let out = m.apply(Event::Apply(with_time("a-3", "10.0.0.3", "yesterday")));
    assert_eq!(out.slices_changed, 1);
    assert!(out.trigger_times.is_empty());
}

#[test]
fn sloppy_ips_are_written_canonically_and_invalid_ones_warn() {
    let mut m = model();
    let converted = from_json::<Service>(json!({"metadata": {"namespace": "ns", "name": "lb"},
    "spec": {
        "type": "LoadBalancer",
        "clusterIP": "172.30.0.041",
        "externalIPs": ["192.168.099.011", "not-an-ip"],
        "loadBalancerSourceRanges": [" 203.0.113.000/025 "],
        "ports": [{"name": "p80", "port": 80, "nodePort": 30080}]
    }}))
    .expect("valid Service JSON");
    let out = converted;
    m.apply(Event::Apply(out.object.clone()));
    let port = &m.snapshot().ports[&key("lb", Family::V4)];
    assert_eq!(port.cluster_ip.to_string(), "172.30.0.41");
    assert_eq!(port.external_ips[0].to_string(), "192.168.99.11");
    assert_eq!(port.source_ranges[0].to_string(), "203.0.113.0/25");
    let fields: Vec<String> = out.warnings.iter().map(|w| w.field.clone()).collect();
    assert_eq!(fields, ["spec.externalIPs[1]"]);
    assert!(
        out.warnings[0].to_string().contains("Service ns/lb"),
        "{}",
        out.warnings[0]
    );
}

#[test]
fn invalid_update_keeps_the_last_good_version() {
    let mut m = model();
    m.apply(Event::Apply(svc("web", basic_spec())));
    let before = m.snapshot().clone();
    let out = m.apply(Event::Apply(svc(
        "web",
        json!({"clusterIP": "10.96.0.10", "ports": [{"name": "p80", "port": 70000}]}),
    )));
    assert_eq!(out.errors.len(), 1);
    assert_eq!(out.errors[0].error.field, "spec.ports[0].port");
    assert_eq!(
        out.errors[0].to_string(),
        "Service ns/web: field spec.ports[0].port: port 70000 is not in 1-65535; keeping its last good version"
    );
    assert!(out.diff.is_empty());
    assert_eq!(m.snapshot(), &before);

    let out = m.apply(Event::Apply(svc("web", json!({"clusterIP": "10.96.0.10", "ports": [{"name": "p80", "port": 80, "protocol": "ICMP"}]}))));
    assert_eq!(out.errors[0].error.field, "spec.ports[0].protocol");
    assert!(out.errors[0].kept);
    let out = m.apply(Event::Apply(service(
        json!({"metadata": {"namespace": "ns"}, "spec": basic_spec()}),
    )));
    assert_eq!(out.errors[0].error.field, "metadata.name");
    assert!(!out.errors[0].kept);
    // A broken object the model never held says so: nothing of it is used.
    let out = m.apply(Event::Apply(svc(
        "new",
        json!({"clusterIP": "10.96.0.11", "ports": [{"name": "p80", "port": 0}]}),
    )));
    assert_eq!(
        out.errors[0].to_string(),
        "Service ns/new: field spec.ports[0].port: port 0 is not in 1-65535; not used (there is no earlier version of it to keep)"
    );
    assert!(out.diff.is_empty());
}

#[test]
fn endpoint_ports_match_by_name_and_protocol() {
    let mut m = model();
    m.apply(Event::Apply(svc(
        "mp",
        json!({"clusterIP": "10.96.0.30", "ports": [
            {"name": "http", "port": 80, "protocol": "TCP"},
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP"}
        ]}),
    )));
    m.apply(Event::Apply(slice(json!({
        "metadata": {"namespace": "ns", "name": "mp-1", "labels": {"kubernetes.io/service-name": "mp"}},
        "addressType": "IPv4",
        "ports": [
            {"name": "http", "port": 8080, "protocol": "TCP"},
            {"name": "dns", "port": 5353, "protocol": "UDP"},
            {"name": "dns", "port": 9999, "protocol": "TCP"},
            {"port": 1234, "protocol": "TCP"}
        ],
        "endpoints": [{"addresses": ["10.0.0.5"]}]
    }))));
    let get = |name: &str, protocol: Protocol| {
        let k = PortKey {
            service: ServiceKey::new("ns", "mp"),
            port_name: name.into(),
            protocol,
            family: Family::V4,
        };
        endpoint_strings(&m.snapshot().ports[&k].cluster_endpoints)
    };
    assert_eq!(get("http", Protocol::Tcp), ["10.0.0.5:8080"]);
    assert_eq!(get("dns", Protocol::Udp), ["10.0.0.5:5353"]);
    assert!(get("dns-tcp", Protocol::Tcp).is_empty());
}

#[test]
fn duplicate_endpoint_across_slices_prefers_the_local_copy() {
    let mut m = model();
    m.apply(Event::Apply(svc("dup", json!({"clusterIP": "10.96.0.40", "internalTrafficPolicy": "Local", "ports": [{"name": "p80", "port": 80}]}))));
    m.apply(Event::Apply(eps(
        "dup",
        "dup-a",
        80,
        &[("10.0.0.9", "node-z", true, true, false)],
    )));
    m.apply(Event::Apply(eps(
        "dup",
        "dup-b",
        80,
        &[("10.0.0.9", "node-a", true, true, false)],
    )));
    let port = &m.snapshot().ports[&key("dup", Family::V4)];
    assert_eq!(endpoint_strings(&port.local_endpoints), ["10.0.0.9:80"]);
}

#[test]
fn load_balancer_ingress_and_policies() {
    let mut m = model();
    m.apply(Event::Apply(service(json!({
        "metadata": {"namespace": "ns", "name": "lb"},
        "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.50", "externalTrafficPolicy": "Local", "healthCheckNodePort": 32000,
                 "ports": [{"name": "p80", "port": 80, "nodePort": 30050}]},
        "status": {"loadBalancer": {"ingress": [
            {"ip": "198.51.100.1"}, {"ip": "198.51.100.2", "ipMode": "VIP"},
            {"ip": "198.51.100.3", "ipMode": "Proxy"}, {"hostname": "lb.example.com"}
        ]}}
    }))));
    let port = &m.snapshot().ports[&key("lb", Family::V4)];
    let lbs: Vec<String> = port
        .load_balancer_ips
        .iter()
        .map(|i| i.to_string())
        .collect();
    assert_eq!(lbs, ["198.51.100.1", "198.51.100.2"]);
    assert!(port.external_policy_local);
    assert_eq!(port.health_check_node_port, Some(32000));
    assert_eq!(port.node_port, Some(30050));

    // eTP Local on a ClusterIP Service means nothing; a NodePort gets no health check port.
    m.apply(Event::Apply(svc("cip", json!({"clusterIP": "10.96.0.51", "externalTrafficPolicy": "Local", "healthCheckNodePort": 32001, "ports": [{"name": "p80", "port": 80}]}))));
    let port = &m.snapshot().ports[&key("cip", Family::V4)];
    assert!(!port.external_policy_local);
    assert_eq!(port.health_check_node_port, None);
}

#[test]
fn preserve_destination_annotation() {
    // (annotation value, expected flag, expected warning)
    let cases: [(Option<&str>, bool, bool); 5] = [
        (None, false, false),
        (Some("true"), true, false),
        (Some("false"), false, false),
        (Some("True"), false, true),
        (Some("yes"), false, true),
    ];
    for (value, want, warns) in cases {
        let mut m = model();
        let mut meta = json!({"namespace": "ns", "name": "pd"});
        if let Some(v) = value {
            meta["annotations"] = json!({"preserve-destination": v});
        }
        let converted = from_json::<Service>(json!({"metadata": meta,
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.70",
                     "ports": [{"name": "p80", "port": 80, "nodePort": 30070}]}}))
        .expect("valid Service JSON");
        m.apply(Event::Apply(converted.object.clone()));
        let port = &m.snapshot().ports[&key("pd", Family::V4)];
        assert_eq!(port.preserve_destination, want, "{value:?}");
        let fields: Vec<String> = converted.warnings.iter().map(|w| w.to_string()).collect();
        if warns {
            assert_eq!(fields.len(), 1, "{value:?}: {fields:?}");
            assert!(
                fields[0].contains("Service ns/pd")
                    && fields[0].contains("metadata.annotations[preserve-destination]"),
                "{}",
                fields[0]
            );
        } else {
            assert!(fields.is_empty(), "{value:?}: {fields:?}");
        }
    }
    // A change of the annotation alone is a frontend change of the port.
    let mut m = model();
    let spec = json!({"clusterIP": "10.96.0.71", "ports": [{"name": "p80", "port": 80}]});
    m.apply(Event::Apply(svc("pd2", spec.clone())));
    let before = m.snapshot().ports[&key("pd2", Family::V4)].clone();
    let out = m.apply(Event::Apply(service(json!({
        "metadata": {"namespace": "ns", "name": "pd2", "annotations": {"preserve-destination": "true"}},
        "spec": spec}))));
    let after = &m.snapshot().ports[&key("pd2", Family::V4)];
    assert!(after.preserve_destination);
    assert!(!before.same_frontend(after));
    assert!(out.diff.changes.contains_key(&key("pd2", Family::V4)));
}

#[test]
fn session_affinity_timeout() {
    let mut m = model();
    m.apply(Event::Apply(svc("aff", json!({"clusterIP": "10.96.0.60", "sessionAffinity": "ClientIP", "ports": [{"name": "p80", "port": 80}]}))));
    m.apply(Event::Apply(svc("aff2", json!({"clusterIP": "10.96.0.61", "sessionAffinity": "ClientIP",
        "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}, "ports": [{"name": "p80", "port": 80}]}))));
    assert_eq!(
        m.snapshot().ports[&key("aff", Family::V4)]
            .session_affinity
            .map(|a| a.timeout_seconds),
        Some(10800)
    );
    assert_eq!(
        m.snapshot().ports[&key("aff2", Family::V4)]
            .session_affinity
            .map(|a| a.timeout_seconds),
        Some(60)
    );
}

#[test]
fn replace_with_the_same_objects_is_a_no_op_and_missing_objects_are_removed() {
    let mut m = model();
    let objects = vec![
        svc("a", basic_spec()),
        svc(
            "b",
            json!({"clusterIP": "10.96.0.11", "ports": [{"name": "p80", "port": 80}]}),
        ),
        eps("a", "a-1", 80, &[("10.0.0.1", "node-b", true, true, false)]),
    ];
    let all = vec![Kind::Service, Kind::EndpointSlice, Kind::Node];
    let first = m.apply(Event::Replace {
        kinds: all.clone(),
        objects: objects.clone(),
    });
    assert_eq!(first.diff.changes.len(), 2);
    let again = m.apply(Event::Replace {
        kinds: all.clone(),
        objects: objects.clone(),
    });
    assert!(again.diff.is_empty(), "{:?}", again.diff);
    let without_b = m.apply(Event::Replace {
        kinds: all,
        objects: objects[..1].to_vec(),
    });
    let keys: Vec<String> = without_b
        .diff
        .changes
        .keys()
        .map(|k| k.service.name.to_string())
        .collect();
    assert_eq!(keys, ["a", "b"], "a lost its slice, b is gone");
    assert!(without_b.diff.changes[&key("b", Family::V4)].new.is_none());
    assert!(
        m.snapshot().ports[&key("a", Family::V4)]
            .cluster_endpoints
            .is_empty()
    );
}

#[test]
fn replace_keeps_the_previous_version_of_a_broken_object() {
    let mut m = model();
    let all = vec![Kind::Service, Kind::EndpointSlice];
    m.apply(Event::Replace {
        kinds: all.clone(),
        objects: vec![svc("a", basic_spec())],
    });
    let broken = svc(
        "a",
        json!({"clusterIP": "10.96.0.10", "ports": [{"name": "p80", "port": -1}]}),
    );
    let out = m.apply(Event::Replace {
        kinds: all,
        objects: vec![broken],
    });
    assert_eq!(out.errors.len(), 1);
    assert!(out.errors[0].kept);
    assert!(out.diff.is_empty());
    assert_eq!(m.snapshot().ports.len(), 1);
}

/// What `kpng status` lists as rejected: an object whose latest version is rejected, until a
/// usable version replaces it or it goes, in every way an event can say so.
#[test]
fn a_rejected_object_is_listed_until_fixed_or_gone() {
    let broken = |name: &str| {
        svc(
            name,
            json!({"clusterIP": "10.96.0.10", "ports": [{"name": "p80", "port": 0}]}),
        )
    };
    let all = || vec![Kind::Service, Kind::EndpointSlice];
    let listed = |m: &Model| -> Vec<(String, bool)> {
        m.rejected()
            .map(|r| (r.error.object.name.to_string(), r.kept))
            .collect()
    };
    struct Case {
        name: &'static str,
        events: Vec<Event>,
        want: Vec<(&'static str, bool)>,
    }
    let cases = [
        Case {
            name: "new and broken: listed, nothing kept",
            events: vec![Event::Apply(broken("a"))],
            want: vec![("a", false)],
        },
        Case {
            name: "broken update: listed, last good version kept",
            events: vec![
                Event::Apply(svc("a", basic_spec())),
                Event::Apply(broken("a")),
            ],
            want: vec![("a", true)],
        },
        Case {
            name: "fixed by a usable version",
            events: vec![
                Event::Apply(broken("a")),
                Event::Apply(svc("a", basic_spec())),
            ],
            want: vec![],
        },
        Case {
            name: "deleted",
            events: vec![
                Event::Apply(broken("a")),
                Event::Delete(ObjectRef {
                    kind: Kind::Service,
                    namespace: "ns".into(),
                    name: "a".into(),
                }),
            ],
            want: vec![],
        },
        Case {
            name: "a relist without it",
            events: vec![
                Event::Apply(broken("a")),
                Event::Replace {
                    kinds: all(),
                    objects: vec![svc("b", basic_spec())],
                },
            ],
            want: vec![],
        },
        Case {
            name: "a relist of another kind leaves it listed",
            events: vec![
                Event::Apply(broken("a")),
                Event::Replace {
                    kinds: vec![Kind::EndpointSlice],
                    objects: vec![],
                },
            ],
            want: vec![("a", false)],
        },
        Case {
            name: "a relist still broken: listed once",
            events: vec![
                Event::Apply(broken("a")),
                Event::Replace {
                    kinds: all(),
                    objects: vec![broken("a"), broken("b")],
                },
            ],
            want: vec![("a", false), ("b", false)],
        },
    ];
    for case in cases {
        let mut m = model();
        for event in case.events {
            m.apply(event);
        }
        let want: Vec<(String, bool)> = case
            .want
            .iter()
            .map(|(n, kept)| (n.to_string(), *kept))
            .collect();
        assert_eq!(listed(&m), want, "{}", case.name);
    }
}

#[test]
fn slice_moving_to_another_service_updates_both() {
    let mut m = model();
    m.apply(Event::Apply(svc("a", basic_spec())));
    m.apply(Event::Apply(svc(
        "b",
        json!({"clusterIP": "10.96.0.11", "ports": [{"name": "p80", "port": 80}]}),
    )));
    m.apply(Event::Apply(eps(
        "a",
        "shared",
        80,
        &[("10.0.0.1", "node-b", true, true, false)],
    )));
    let out = m.apply(Event::Apply(eps(
        "b",
        "shared",
        80,
        &[("10.0.0.1", "node-b", true, true, false)],
    )));
    assert_eq!(out.diff.changes.len(), 2);
    assert!(
        m.snapshot().ports[&key("a", Family::V4)]
            .cluster_endpoints
            .is_empty()
    );
    assert_eq!(
        m.snapshot().ports[&key("b", Family::V4)]
            .cluster_endpoints
            .len(),
        1
    );
    let out = m.apply(Event::Delete(ObjectRef {
        kind: Kind::EndpointSlice,
        namespace: "ns".into(),
        name: "shared".into(),
    }));
    assert_eq!(out.diff.changes.len(), 1);
}

#[test]
fn node_zone_change_recomputes_topology() {
    let mut m = model();
    m.apply(Event::Apply(svc("z", basic_spec())));
    m.apply(Event::Apply(slice(json!({
        "metadata": {"namespace": "ns", "name": "z-1", "labels": {"kubernetes.io/service-name": "z"}},
        "addressType": "IPv4",
        "ports": [{"name": "p80", "port": 80, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": ["10.0.0.1"], "hints": {"forZones": [{"name": "zone-a"}]}},
            {"addresses": ["10.0.0.2"], "hints": {"forZones": [{"name": "zone-b"}]}}
        ]
    }))));
    assert_eq!(
        m.snapshot().ports[&key("z", Family::V4)]
            .cluster_endpoints
            .len(),
        2
    );
    let out = m.apply(Event::Apply(node(json!({
        "metadata": {"name": "node-a", "labels": {"topology.kubernetes.io/zone": "zone-b"}},
        "spec": {"podCIDRs": ["10.244.1.0/24"]},
        "status": {"addresses": [{"type": "ExternalIP", "address": "203.0.113.9"}, {"type": "InternalIP", "address": "192.168.100.1"}]}
    }))));
    assert!(out.diff.node_changed);
    assert_eq!(out.diff.changes.len(), 1);
    assert_eq!(
        endpoint_strings(&m.snapshot().ports[&key("z", Family::V4)].cluster_endpoints),
        ["10.0.0.2:80"]
    );
    let state = &m.snapshot().node;
    assert!(state.known && state.eligible());
    assert_eq!(
        state.ips.iter().map(|i| i.to_string()).collect::<Vec<_>>(),
        ["192.168.100.1"]
    );
    assert_eq!(state.pod_cidrs[0].to_string(), "10.244.1.0/24");

    // Other nodes are ignored.
    let out = m.apply(Event::Apply(node(json!({"metadata": {"name": "node-x"}}))));
    assert!(out.diff.is_empty());
}

#[test]
fn node_eligibility() {
    let mut m = model();
    m.apply(Event::Apply(node(json!({"metadata": {"name": "node-a"}, "spec": {"taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]}}))));
    assert!(!m.snapshot().node.eligible());
    m.apply(Event::Apply(node(
        json!({"metadata": {"name": "node-a", "deletionTimestamp": "2026-01-01T00:00:00Z"}}),
    )));
    assert!(!m.snapshot().node.eligible());
    m.apply(Event::Apply(node(json!({"metadata": {"name": "node-a"}}))));
    assert!(m.snapshot().node.eligible());
}

#[test]
fn node_ip_override_wins() {
    let mut m = Model::new(ModelConfig {
        node_name: "node-a".into(),
        service_proxy_name: None,
        node_ips: vec!["192.0.2.1".parse().expect("ip")],
        node_port_range: None,
        service_cidrs: vec![],
    });
    m.apply(Event::Apply(node(json!({"metadata": {"name": "node-a"}, "status": {"addresses": [{"type": "InternalIP", "address": "10.1.1.1"}]}}))));
    assert_eq!(
        m.snapshot().node.ips,
        vec!["192.0.2.1".parse::<std::net::IpAddr>().expect("ip")]
    );
}

/// `--node-ip` replaces the Node object's IP of its own family only, and comes first, as
/// kube-proxy's bind address does.
#[test]
fn node_ip_override_replaces_its_own_family() {
    let ip = |s: &str| s.parse::<std::net::IpAddr>().expect("ip");
    // (what, the Node object's IPs, --node-ip, the node IPs)
    type Case<'a> = (&'a str, &'a [&'a str], &'a [&'a str], &'a [&'a str]);
    let cases: [Case; 6] = [
        (
            "no override",
            &["10.1.1.1", "fd00::1"],
            &[],
            &["10.1.1.1", "fd00::1"],
        ),
        (
            "IPv6 on a dual-stack node keeps IPv4",
            &["10.1.1.1", "fd00::1"],
            &["fd00::9"],
            &["fd00::9", "10.1.1.1"],
        ),
        (
            "IPv4 on a dual-stack node keeps IPv6",
            &["10.1.1.1", "fd00::1"],
            &["192.0.2.1"],
            &["192.0.2.1", "fd00::1"],
        ),
        (
            "both families",
            &["10.1.1.1", "fd00::1"],
            &["fd00::9", "192.0.2.1"],
            &["fd00::9", "192.0.2.1"],
        ),
        ("no Node IPs", &[], &["fd00::9"], &["fd00::9"]),
        (
            "the other family on a single-stack node adds it",
            &["10.1.1.1"],
            &["fd00::9"],
            &["fd00::9", "10.1.1.1"],
        ),
    ];
    for (what, node, overrides, want) in cases {
        let node: Vec<_> = node.iter().map(|s| ip(s)).collect();
        let overrides: Vec<_> = overrides.iter().map(|s| ip(s)).collect();
        let want: Vec<_> = want.iter().map(|s| ip(s)).collect();
        assert_eq!(
            kpng_model::cluster::override_node_ips(&node, &overrides),
            want,
            "{what}"
        );
    }
}

#[test]
fn diff_merge_folds_and_cancels() {
    let mut m = model();
    m.apply(Event::Apply(svc("a", basic_spec())));
    let mut pending = m
        .apply(Event::Apply(eps(
            "a",
            "a-1",
            80,
            &[("10.0.0.1", "node-b", true, true, false)],
        )))
        .diff;
    pending.merge(
        m.apply(Event::Delete(ObjectRef {
            kind: Kind::EndpointSlice,
            namespace: "ns".into(),
            name: "a-1".into(),
        }))
        .diff,
    );
    assert!(
        pending.is_empty(),
        "a change and its undo cancel out: {pending:?}"
    );
    let full = Diff::full(m.snapshot());
    assert_eq!(full.changes.len(), 1);
    assert_eq!(full.upserted().count(), 1);
}

#[test]
fn a_streamed_list_changes_nothing_until_it_is_done() {
    let mut m = model();
    let all = vec![Kind::Service, Kind::EndpointSlice, Kind::Node];
    m.apply(Event::Replace {
        kinds: all.clone(),
        objects: vec![
            svc("a", basic_spec()),
            svc(
                "b",
                json!({"clusterIP": "10.96.0.11", "ports": [{"name": "p80", "port": 80}]}),
            ),
        ],
    });
    assert!(
        m.apply(Event::ListStart { kinds: all.clone() })
            .diff
            .is_empty()
    );
    // Relist with "a" unchanged, "b" missing and "c" new.
    assert!(
        m.apply(Event::ListItem(svc("a", basic_spec())))
            .diff
            .is_empty()
    );
    assert!(
        m.apply(Event::ListItem(svc(
            "c",
            json!({"clusterIP": "10.96.0.12", "ports": [{"name": "p80", "port": 80}]})
        )))
        .diff
        .is_empty()
    );
    assert_eq!(
        m.snapshot().ports.len(),
        2,
        "nothing changes before ListDone"
    );
    let done = m.apply(Event::ListDone { kinds: all.clone() }).diff;
    let names: Vec<String> = done
        .changes
        .keys()
        .map(|k| k.service.name.to_string())
        .collect();
    assert_eq!(names, ["b", "c"]);
    assert!(done.changes[&key("b", Family::V4)].new.is_none());
    // The same list again: no change at all.
    m.apply(Event::ListStart { kinds: all.clone() });
    m.apply(Event::ListItem(svc("a", basic_spec())));
    m.apply(Event::ListItem(svc(
        "c",
        json!({"clusterIP": "10.96.0.12", "ports": [{"name": "p80", "port": 80}]}),
    )));
    assert!(m.apply(Event::ListDone { kinds: all }).diff.is_empty());
}

#[test]
fn serving_endpoints_ignore_readiness_policy_and_locality() {
    // What the UDP conntrack cleanup keeps: every serving endpoint, terminating or not,
    // whether or not the port's policies would pick it; not-serving ones are left out.
    let mut m = model();
    let mut spec = basic_spec();
    spec["internalTrafficPolicy"] = json!("Local");
    m.apply(Event::Apply(svc("web", spec)));
    m.apply(Event::Apply(eps(
        "web",
        "web-1",
        8080,
        &[
            ("10.0.1.1", "node-a", true, true, false),
            ("10.0.2.1", "node-b", true, true, false),
            ("10.0.2.2", "node-b", false, true, true),
            ("10.0.2.3", "node-b", false, false, true),
        ],
    )));
    let port = &m.snapshot().ports[&key("web", Family::V4)];
    assert_eq!(
        endpoint_strings(port.internal_endpoints()),
        ["10.0.1.1:8080"]
    );
    let serving: Vec<String> = port
        .serving_endpoints
        .iter()
        .map(|e| e.to_string())
        .collect();
    assert_eq!(serving, ["10.0.1.1:8080", "10.0.2.1:8080", "10.0.2.2:8080"]);
}

/// The Node node-a with `labels`, `annotations`, InternalIP `ip` and podCIDR `cidr`.
fn node_a(labels: Value, annotations: Value, ip: &str, cidr: &str) -> Object {
    node(json!({
        "metadata": {"name": "node-a", "labels": labels, "annotations": annotations},
        "spec": {"podCIDRs": [cidr]},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}]}
    }))
}

/// A Node event only the backends' values decide about: a deletion that keeps the node IPs
/// and pod CIDRs, a re-creation with the same values or a label/annotation edit changes
/// nothing they program (no `node_changed`, so no node change in the sync line and no
/// refill of the node's sets), and says whether the node's status changed (for `/healthz`
/// and the log); a new IP, pod CIDR or zone is a node change, as before, and the sync line
/// names which.
#[test]
fn only_a_change_of_what_the_backends_program_is_a_node_change() {
    let plain = || node_a(json!({}), json!({}), "10.1.1.1", "10.244.1.0/24");
    let labelled = || {
        node_a(
            json!({"team": "blue"}),
            json!({"note": "drained on Monday"}),
            "10.1.1.1",
            "10.244.1.0/24",
        )
    };
    let delete = || {
        Event::Delete(ObjectRef {
            kind: Kind::Node,
            namespace: "".into(),
            name: "node-a".into(),
        })
    };
    let deleting = || {
        node(json!({
            "metadata": {"name": "node-a", "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"podCIDRs": ["10.244.1.0/24"]},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.1.1.1"}]}
        }))
    };
    const SAME: &str = "no Service port changed";
    // (what, events before, the event, then: its summary, node status changed)
    let cases: Vec<(&str, Vec<Event>, Event, &str, bool)> = vec![
        ("deleted, values kept", vec![], delete(), SAME, true),
        (
            "re-created identical",
            vec![delete()],
            Event::Apply(plain()),
            SAME,
            true,
        ),
        (
            "labels and annotations only",
            vec![],
            Event::Apply(labelled()),
            SAME,
            false,
        ),
        (
            "the same Node again",
            vec![],
            Event::Apply(plain()),
            SAME,
            false,
        ),
        (
            "being deleted",
            vec![],
            Event::Apply(deleting()),
            SAME,
            true,
        ),
        (
            "a new pod CIDR",
            vec![],
            Event::Apply(node_a(json!({}), json!({}), "10.1.1.1", "10.244.9.0/24")),
            "no Service port changed; pod CIDRs changed",
            false,
        ),
        (
            "a new node IP",
            vec![],
            Event::Apply(node_a(json!({}), json!({}), "10.1.1.9", "10.244.1.0/24")),
            "no Service port changed; node IPs changed",
            false,
        ),
        (
            "re-created with a new node IP",
            vec![delete()],
            Event::Apply(node_a(json!({}), json!({}), "10.1.1.9", "10.244.1.0/24")),
            "no Service port changed; node IPs changed",
            false,
        ),
        (
            "a zone label (topology-aware routing)",
            vec![],
            Event::Apply(node_a(
                json!({"topology.kubernetes.io/zone": "zone-b"}),
                json!({}),
                "10.1.1.1",
                "10.244.1.0/24",
            )),
            "no Service port changed; zone changed",
            false,
        ),
    ];
    for (what, before, event, summary, status_changed) in cases {
        let mut m = model();
        m.apply(Event::Apply(svc("web", basic_spec())));
        m.apply(Event::Apply(plain()));
        for e in before {
            m.apply(e);
        }
        let kept = m.snapshot().node.clone();
        let out = m.apply(event);
        assert_eq!(
            (
                DiffSummary::of(&out.diff).to_string().as_str(),
                out.node_status_changed
            ),
            (summary, status_changed),
            "{what}"
        );
        if summary == SAME {
            assert!(out.diff.is_empty(), "{what}: {:?}", out.diff);
            assert!(m.snapshot().node.programs_as(&kept), "{what}");
        }
    }
}

/// A Node event, for the lifecycle table.
enum NodeStep {
    /// Apply the Node with these addresses (InternalIP) and podCIDRs.
    Apply(&'static [&'static str], &'static [&'static str]),
    /// Delete the Node.
    Delete,
    /// The runner's wait for node IPs ended.
    GiveUp,
}

/// The node IPs and pod CIDRs survive the Node's deletion and the loss of its addresses, as
/// kube-proxy keeps its start-up values (NodePorts stay served, the NodeCIDR detector keeps
/// working); a new value replaces them; with none ever known, giving up the wait turns
/// `primary` node ports into every local address until an IP appears.
#[test]
fn node_lifecycle_keeps_the_last_ips_and_pod_cidrs() {
    use NodeStep::*;
    // (what, --node-ip, steps, then: node IPs, pod CIDRs, known, ever known, IPs kept,
    // CIDRs kept, node ports on all local addresses)
    type Want = (
        &'static [&'static str],
        &'static [&'static str],
        bool,
        bool,
        bool,
        bool,
        bool,
    );
    let cases: Vec<(&str, &[&str], Vec<NodeStep>, Want)> = vec![
        (
            "present",
            &[],
            vec![Apply(&["10.1.1.1"], &["10.244.1.0/24"])],
            (
                &["10.1.1.1"],
                &["10.244.1.0/24"],
                true,
                true,
                false,
                false,
                false,
            ),
        ),
        (
            "deleted: both kept",
            &[],
            vec![Apply(&["10.1.1.1"], &["10.244.1.0/24"]), Delete],
            (
                &["10.1.1.1"],
                &["10.244.1.0/24"],
                false,
                true,
                true,
                true,
                false,
            ),
        ),
        (
            "addresses emptied: IPs kept",
            &[],
            vec![
                Apply(&["10.1.1.1"], &["10.244.1.0/24"]),
                Apply(&[], &["10.244.1.0/24"]),
            ],
            (
                &["10.1.1.1"],
                &["10.244.1.0/24"],
                true,
                true,
                true,
                false,
                false,
            ),
        ),
        (
            "deleted then re-created with another IP: the new one",
            &[],
            vec![
                Apply(&["10.1.1.1"], &["10.244.1.0/24"]),
                Delete,
                Apply(&["10.1.1.2"], &["10.244.2.0/24"]),
            ],
            (
                &["10.1.1.2"],
                &["10.244.2.0/24"],
                true,
                true,
                false,
                false,
                false,
            ),
        ),
        (
            "deleted, giving up changes nothing: IPs are known",
            &[],
            vec![Apply(&["10.1.1.1"], &[]), Delete, GiveUp],
            (&["10.1.1.1"], &[], false, true, true, false, false),
        ),
        (
            "deleted with --node-ip of the family: nothing to keep",
            &["192.0.2.1"],
            vec![Apply(&["10.1.1.1"], &[]), Delete],
            (&["192.0.2.1"], &[], false, true, false, false, false),
        ),
        (
            "deleted with --node-ip of the other family: the IPv4 kept",
            &["fd00::9"],
            vec![Apply(&["10.1.1.1"], &[]), Delete],
            (
                &["fd00::9", "10.1.1.1"],
                &[],
                false,
                true,
                true,
                false,
                false,
            ),
        ),
        (
            "never a Node, before the wait ends",
            &[],
            vec![],
            (&[], &[], false, false, false, false, false),
        ),
        (
            "never a Node, the wait ended: all local",
            &[],
            vec![GiveUp],
            (&[], &[], false, false, false, false, true),
        ),
        (
            "a Node with no address, the wait ended: all local",
            &[],
            vec![Apply(&[], &[]), GiveUp],
            (&[], &[], true, true, false, false, true),
        ),
        (
            "an IP after the wait: on it only",
            &[],
            vec![Apply(&[], &[]), GiveUp, Apply(&["10.1.1.1"], &[])],
            (&["10.1.1.1"], &[], true, true, false, false, false),
        ),
        (
            "--node-ip: the wait changes nothing",
            &["192.0.2.1"],
            vec![GiveUp],
            (&["192.0.2.1"], &[], false, false, false, false, false),
        ),
    ];
    for (what, overrides, steps, want) in cases {
        let mut m = Model::new(ModelConfig {
            node_name: "node-a".into(),
            node_ips: overrides.iter().map(|s| s.parse().expect("ip")).collect(),
            ..ModelConfig::default()
        });
        for step in steps {
            match step {
                Apply(ips, cidrs) => {
                    let addresses: Vec<Value> = ips
                        .iter()
                        .map(|ip| json!({"type": "InternalIP", "address": ip}))
                        .chain([json!({"type": "Hostname", "address": "node-a"})])
                        .collect();
                    m.apply(Event::Apply(node(json!({
                        "metadata": {"name": "node-a"},
                        "spec": {"podCIDRs": cidrs},
                        "status": {"addresses": addresses}
                    }))));
                }
                Delete => {
                    let out = m.apply(Event::Delete(ObjectRef {
                        kind: Kind::Node,
                        namespace: "".into(),
                        name: "node-a".into(),
                    }));
                    assert!(
                        out.diff.node_changed || out.node_status_changed,
                        "{what}: a deletion changes the node's view"
                    );
                }
                GiveUp => {
                    m.give_up_waiting_for_node_ips();
                }
            }
        }
        let n = &m.snapshot().node;
        let ips: Vec<String> = n.ips.iter().map(|i| i.to_string()).collect();
        let cidrs: Vec<String> = n.pod_cidrs.iter().map(|c| c.to_string()).collect();
        assert_eq!(
            (
                ips,
                cidrs,
                n.known,
                n.ever_known,
                n.ips_kept,
                n.pod_cidrs_kept,
                n.nodeports_on_all_local
            ),
            (
                want.0.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                want.1.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                want.2,
                want.3,
                want.4,
                want.5,
                want.6
            ),
            "{what}"
        );
    }
}

/// A Node event, for the zone table.
enum ZoneStep {
    /// Apply the Node (InternalIP 10.1.1.1) with this zone label, or none.
    Apply(Option<&'static str>),
    /// Delete the Node.
    Delete,
}

/// The zone survives the Node's deletion, as upstream's `NodeTopologyConfig` ignores a Node
/// delete (topology hints keep applying instead of sending Services across zones until the
/// Node is back); a live Node that drops the label, or a re-created one without it, clears
/// it; a deletion that keeps the zone programs nothing new.
#[test]
fn node_lifecycle_keeps_the_last_zone() {
    use ZoneStep::*;
    // (what, steps, then: zone, the cluster endpoints of the zone-hinted Service, whether the
    // last step changed what the backends program)
    type Case = (
        &'static str,
        Vec<ZoneStep>,
        Option<&'static str>,
        &'static [&'static str],
        bool,
    );
    let cases: Vec<Case> = vec![
        (
            "zone-b",
            vec![Apply(Some("zone-b"))],
            Some("zone-b"),
            &["10.0.0.2:80"],
            true,
        ),
        (
            "zone-b, deleted: kept",
            vec![Apply(Some("zone-b")), Delete],
            Some("zone-b"),
            &["10.0.0.2:80"],
            false,
        ),
        (
            "zone-b, label removed from the live Node: cleared",
            vec![Apply(Some("zone-b")), Apply(None)],
            None,
            &["10.0.0.1:80", "10.0.0.2:80"],
            true,
        ),
        (
            "zone-b, deleted, re-created without a zone: cleared",
            vec![Apply(Some("zone-b")), Delete, Apply(None)],
            None,
            &["10.0.0.1:80", "10.0.0.2:80"],
            true,
        ),
        (
            "zone-b, deleted, re-created in zone-a",
            vec![Apply(Some("zone-b")), Delete, Apply(Some("zone-a"))],
            Some("zone-a"),
            &["10.0.0.1:80"],
            true,
        ),
        (
            "no zone, deleted",
            vec![Apply(None), Delete],
            None,
            &["10.0.0.1:80", "10.0.0.2:80"],
            false,
        ),
    ];
    for (what, steps, zone, endpoints, programmed) in cases {
        let mut m = model();
        m.apply(Event::Apply(svc("z", basic_spec())));
        m.apply(Event::Apply(slice(json!({
            "metadata": {"namespace": "ns", "name": "z-1", "labels": {"kubernetes.io/service-name": "z"}},
            "addressType": "IPv4",
            "ports": [{"name": "p80", "port": 80, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.0.0.1"], "hints": {"forZones": [{"name": "zone-a"}]}},
                {"addresses": ["10.0.0.2"], "hints": {"forZones": [{"name": "zone-b"}]}}
            ]
        }))));
        let mut last = None;
        for step in steps {
            last = Some(m.apply(match step {
                Apply(zone) => {
                    let labels =
                        zone.map_or(json!({}), |z| json!({"topology.kubernetes.io/zone": z}));
                    Event::Apply(node_a(labels, json!({}), "10.1.1.1", "10.244.1.0/24"))
                }
                Delete => Event::Delete(ObjectRef {
                    kind: Kind::Node,
                    namespace: "".into(),
                    name: "node-a".into(),
                }),
            }));
        }
        let out = last.expect("a step");
        assert_eq!(
            (
                m.snapshot().node.zone.as_deref(),
                endpoint_strings(&m.snapshot().ports[&key("z", Family::V4)].cluster_endpoints),
                out.diff.node_changed,
            ),
            (
                zone,
                endpoints.iter().map(|s| s.to_string()).collect(),
                programmed
            ),
            "{what}"
        );
    }
}

/// One address in two slices with different conditions: one copy is used (a local copy, else
/// the first, as upstream), and `kpng status` says the other exists and whose conditions it
/// shows; a copy with the same conditions is no news.
#[test]
fn an_endpoint_in_two_slices_notes_the_other_copy() {
    let mut m = model();
    m.apply(Event::Apply(svc("dup", basic_spec())));
    m.apply(Event::Apply(eps(
        "dup",
        "dup-1",
        8080,
        &[
            ("10.244.1.2", "node-b", true, true, false),
            ("10.244.1.3", "node-b", true, true, false),
        ],
    )));
    m.apply(Event::Apply(eps(
        "dup",
        "dup-2",
        8080,
        &[
            ("10.244.1.2", "node-b", false, false, true),
            ("10.244.1.3", "node-b", true, true, false),
        ],
    )));
    let explained = m.explain(&key("dup", Family::V4)).expect("the port");
    let notes: Vec<(String, Option<&str>)> = explained
        .iter()
        .map(|e| (e.address.to_string(), e.other_copies.as_deref()))
        .collect();
    assert_eq!(
        notes,
        [
            (
                "10.244.1.2:8080".to_string(),
                Some("also in slice dup-2 (not serving); dup-1's conditions used")
            ),
            ("10.244.1.3:8080".to_string(), None),
        ]
    );
    // A local copy wins, whatever the slice order.
    m.apply(Event::Apply(eps(
        "dup",
        "dup-2",
        8080,
        &[("10.244.1.2", "node-a", false, true, true)],
    )));
    let explained = m.explain(&key("dup", Family::V4)).expect("the port");
    assert!(!explained[0].ready && explained[0].local, "{explained:?}");
    assert_eq!(
        explained[0].other_copies.as_deref(),
        Some("also in slice dup-1 (ready, on another node); dup-2's conditions used")
    );
}

/// An ExternalName Service is skipped whatever its clusterIP, as kube-proxy's service change
/// tracker skips it (ShouldSkipService); one that also has a clusterIP says so once, naming
/// the Service and the field, in the log (the conversion's warning) and in `kpng status` (the
/// model's dropped values), rather than being taken silently.
#[test]
fn an_external_name_service_with_a_cluster_ip_is_skipped_and_says_so_once() {
    // (case, spec, the field of the one note, what it names), or no note.
    let cases = [
        (
            "clusterIP",
            json!({"type": "ExternalName", "externalName": "example.com", "clusterIP": "10.96.7.7"}),
            Some(("spec.clusterIP", "\"10.96.7.7\"")),
        ),
        (
            "dual-stack clusterIPs: one note naming both",
            json!({"type": "ExternalName", "externalName": "example.com", "clusterIP": "10.96.7.7",
                   "clusterIPs": ["10.96.7.7", "fd00:96::7"]}),
            Some(("spec.clusterIP", "\"10.96.7.7\", \"fd00:96::7\"")),
        ),
        (
            "clusterIPs only",
            json!({"type": "ExternalName", "externalName": "example.com", "clusterIPs": ["10.96.7.7"]}),
            Some(("spec.clusterIPs", "\"10.96.7.7\"")),
        ),
        (
            "no cluster IP",
            json!({"type": "ExternalName", "externalName": "example.com"}),
            None,
        ),
        (
            "clusterIP None",
            json!({"type": "ExternalName", "externalName": "example.com", "clusterIP": "None"}),
            None,
        ),
    ];
    for (case, spec, note) in cases {
        let converted = from_json::<Service>(json!({
            "metadata": {"namespace": "ns", "name": "alias"}, "spec": spec
        }))
        .expect("valid Service JSON");
        let logged: Vec<String> = converted.warnings.iter().map(|w| w.to_string()).collect();
        let mut m = model();
        let out = m.apply(Event::Apply(converted.object));
        assert!(out.errors.is_empty(), "{case}: {:?}", out.errors);
        assert!(m.snapshot().ports.is_empty(), "{case}: no rules");
        let shown: Vec<String> = m.dropped().map(|(_, w)| w.to_string()).collect();
        assert_eq!(shown, logged, "{case}: the status shows what the log said");
        match note {
            Some((field, ips)) => {
                assert_eq!(logged.len(), 1, "{case}: said once: {logged:?}");
                let want = format!(
                    "Service ns/alias: field {field}: cluster IP {ips} of an ExternalName Service \
                     gets no rules"
                );
                assert!(logged[0].starts_with(&want), "{case}: {}", logged[0]);
            }
            None => assert!(logged.is_empty(), "{case}: {logged:?}"),
        }
    }
}

/// The model keeps, for `kpng trace`, the addresses a Service shows that get no rules on
/// purpose: an ExternalName Service's stray clusterIP and ipMode Proxy ingress IPs.
#[test]
fn addresses_left_without_rules_on_purpose_are_found_by_their_service() {
    let mut m = model();
    m.apply(Event::Apply(svc(
        "alias",
        json!({"type": "ExternalName", "externalName": "example.com", "clusterIP": "10.96.7.7"}),
    )));
    m.apply(Event::Apply(service(json!({
        "metadata": {"namespace": "ns", "name": "gw"},
        "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.20",
                 "ports": [{"name": "p80", "port": 80, "protocol": "TCP", "nodePort": 30080}]},
        "status": {"loadBalancer": {"ingress": [
            {"ip": "203.0.113.9", "ipMode": "Proxy"}, {"ip": "203.0.113.10"}
        ]}}
    }))));
    let found = |ip: &str| {
        m.not_proxied(ip.parse().expect("ip"))
            .map(|n| (n.service.to_string(), n.kind))
    };
    assert_eq!(
        found("10.96.7.7"),
        Some((
            "ns/alias".into(),
            trace::NotProxiedKind::ExternalNameClusterIp
        ))
    );
    assert_eq!(
        found("203.0.113.9"),
        Some(("ns/gw".into(), trace::NotProxiedKind::ProxyModeIngress))
    );
    assert_eq!(found("203.0.113.10"), None, "a VIP ingress is programmed");
    assert_eq!(found("10.96.0.20"), None);
}

/// The clusterIP of a Service kpng does not proxy by its labels (headless, another proxy's)
/// is found by its Service for `kpng trace`; an owned Service's is not.
#[test]
fn a_clusterip_of_a_service_not_ours_is_found_by_its_service() {
    let labelled = |name: &str, ip: &str, labels: Value| {
        service(json!({
            "metadata": {"namespace": "ns", "name": name, "labels": labels},
            "spec": {"clusterIP": ip, "ports": [{"name": "p80", "port": 80, "protocol": "TCP"}]}
        }))
    };
    let events = || {
        [
            labelled("mine", "10.96.1.5", json!({})),
            labelled(
                "other",
                "10.96.1.6",
                json!({"service.kubernetes.io/service-proxy-name": "cilium"}),
            ),
            labelled(
                "quiet",
                "10.96.1.7",
                json!({"service.kubernetes.io/headless": ""}),
            ),
        ]
    };
    // (--service-proxy-name, then what each clusterIP is found as)
    type Found = Option<(&'static str, trace::NotProxiedKind)>;
    let cases: [(Option<&str>, [Found; 3]); 2] = [
        (
            None,
            [
                None,
                Some((
                    "ns/other",
                    trace::NotProxiedKind::OtherProxyClusterIp(Some("cilium".into())),
                )),
                Some(("ns/quiet", trace::NotProxiedKind::HeadlessLabelClusterIp)),
            ],
        ),
        (
            Some("cilium"),
            [
                Some(("ns/mine", trace::NotProxiedKind::OtherProxyClusterIp(None))),
                None,
                Some(("ns/quiet", trace::NotProxiedKind::HeadlessLabelClusterIp)),
            ],
        ),
    ];
    for (proxy_name, want) in cases {
        let mut m = Model::new(ModelConfig {
            node_name: "node-a".into(),
            service_proxy_name: proxy_name.map(str::to_string),
            ..ModelConfig::default()
        });
        for e in events() {
            m.apply(Event::Apply(e));
        }
        let found: Vec<Option<(String, trace::NotProxiedKind)>> =
            ["10.96.1.5", "10.96.1.6", "10.96.1.7"]
                .iter()
                .map(|ip| {
                    m.not_proxied(ip.parse().expect("ip"))
                        .map(|n| (n.service.to_string(), n.kind))
                })
                .collect();
        let want: Vec<Option<(String, trace::NotProxiedKind)>> = want
            .into_iter()
            .map(|w| w.map(|(s, k)| (s.to_string(), k)))
            .collect();
        assert_eq!(found, want, "--service-proxy-name {proxy_name:?}");
    }
}

/// A Service's EndpointSlices of a family it has no cluster IP of are ignored, as kube-proxy
/// ignores them, and the model says so for a port without endpoints (`kpng status` adds it to
/// "no endpoints", which alone sends the operator to the pods).
/// (case, cluster IPs, slices as (name, endpoint IPs), for the IPv4 port: what is ignored)
#[test]
fn slices_of_a_family_the_service_does_not_serve_are_named_for_a_port_without_endpoints() {
    type Case = (
        &'static str,
        &'static [&'static str],
        Vec<(&'static str, &'static [&'static str])>,
        Vec<(Family, usize, usize)>,
    );
    let cases: Vec<Case> = vec![
        (
            "an IPv4-only Service with an IPv6 slice",
            &["10.96.0.10"],
            vec![("v6", &["fd00::1:2"])],
            vec![(Family::V6, 1, 1)],
        ),
        (
            "two IPv6 slices",
            &["10.96.0.10"],
            vec![
                ("v6a", &["fd00::1:2", "fd00::2:2"]),
                ("v6b", &["fd00::3:2"]),
            ],
            vec![(Family::V6, 2, 3)],
        ),
        (
            "the IPv4 port has endpoints: nothing to say",
            &["10.96.0.10"],
            vec![("v4", &["10.244.1.2"]), ("v6", &["fd00::1:2"])],
            vec![],
        ),
        (
            "dual-stack, IPv6 endpoints only: the IPv6 slice is served",
            &["10.96.0.10", "fd00:96::10"],
            vec![("v6", &["fd00::1:2"])],
            vec![],
        ),
        ("no slice at all", &["10.96.0.10"], vec![], vec![]),
    ];
    for (case, cluster_ips, slices, want) in cases {
        let mut m = model();
        m.apply(Event::Apply(svc(
            "web",
            json!({"clusterIP": cluster_ips[0], "clusterIPs": cluster_ips,
                   "ports": [{"name": "p80", "port": 80, "protocol": "TCP"}]}),
        )));
        for (name, ips) in slices {
            let endpoints: Vec<(&str, &str, bool, bool, bool)> = ips
                .iter()
                .map(|ip| (*ip, "node-b", true, true, false))
                .collect();
            m.apply(Event::Apply(eps("web", name, 8080, &endpoints)));
        }
        let key = PortKey {
            service: ServiceKey::new("ns", "web"),
            port_name: "p80".into(),
            protocol: Protocol::Tcp,
            family: Family::V4,
        };
        assert!(m.snapshot().ports.contains_key(&key), "{case}");
        assert_eq!(m.slices_of_unserved_families(&key), want, "{case}");
    }
}
