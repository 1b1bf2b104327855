//! The API server's checks, made again at conversion (`kpng_k8s::validate`): objects from the
//! `file` source or a non-validating API server that a real one would refuse never reach a
//! backend, and a refused update keeps what the object's last good version programmed.
//! The objects are the security audit's (`hij.yaml`, `dos.yaml`, `coll.yaml`, `ext.yaml`).

use serde_json::{Value, json};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kpng_k8s::{Converted, from_json};
use kpng_model::*;

const INJECTION: &str = "a\n-I KUBE-SERVICES 1 -d 10.96.0.1/32 -p tcp --dport 443 -j DNAT --to-destination 10.244.1.66:443\n#";

fn service(ns: &str, name: &str, port_name: &str) -> Converted {
    from_json::<Service>(json!({
        "metadata": {"namespace": ns, "name": name},
        "spec": {"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                 "ports": [{"name": port_name, "port": 81, "protocol": "TCP", "targetPort": 8080}]}
    }))
    .expect("valid Service JSON")
}

fn slice_json(ns: &str, name: &str, label: &str, port_name: &str, addresses: &[&str]) -> Value {
    json!({
        "metadata": {"namespace": ns, "name": name, "labels": {"kubernetes.io/service-name": label}},
        "addressType": "IPv4",
        "ports": [{"name": port_name, "port": 8080, "protocol": "TCP"}],
        "endpoints": addresses.iter().map(|a| json!({"addresses": [a], "conditions": {"ready": true}})).collect::<Vec<_>>()
    })
}

fn slice(value: Value) -> Converted {
    from_json::<EndpointSlice>(value).expect("valid EndpointSlice JSON")
}

fn rejected(c: &Converted) -> Option<&ConversionError> {
    match &c.object {
        Object::Rejected(e) => Some(e),
        _ => None,
    }
}

fn model() -> Model {
    Model::new(ModelConfig {
        node_name: "node1".into(),
        ..ModelConfig::default()
    })
}

/// Each object a real API server refuses for a name, with the field the error names.
#[test]
fn names_the_api_server_refuses_are_rejected_naming_the_field() {
    let cases: Vec<(&str, Converted, &str)> = vec![
        (
            "rule injection through a Service port name",
            service("tenant-a", "web", INJECTION),
            "spec.ports[0].name",
        ),
        (
            "a quote in a Service port name (every iptables-restore failed)",
            service("tenant-a", "web", "a\"b"),
            "spec.ports[0].name",
        ),
        (
            "a backslash in a Service port name",
            service("tenant-a", "web", "a\\b"),
            "spec.ports[0].name",
        ),
        (
            "a space in a Service port name",
            service("tenant-a", "web", "a b"),
            "spec.ports[0].name",
        ),
        (
            "an upper-case Service port name",
            service("tenant-a", "web", "HTTP"),
            "spec.ports[0].name",
        ),
        (
            "a Service port name of 64 characters",
            service("tenant-a", "web", &"p".repeat(64)),
            "spec.ports[0].name",
        ),
        (
            "a '/' in a Service name",
            service("a", "b/c", "http"),
            "metadata.name",
        ),
        (
            "a '/' in a Service's namespace",
            service("a/b", "c", "http"),
            "metadata.namespace",
        ),
        (
            "a '.' in a Service name",
            service("a", "b.c", "http"),
            "metadata.name",
        ),
        (
            "rule injection through an EndpointSlice port name",
            slice(slice_json(
                "tenant-a",
                "web-1",
                "web",
                INJECTION,
                &["10.244.1.2"],
            )),
            "ports[0].name",
        ),
        (
            "a quote in an EndpointSlice port name",
            slice(slice_json(
                "tenant-a",
                "web-1",
                "web",
                "a\"b",
                &["10.244.1.2"],
            )),
            "ports[0].name",
        ),
        (
            "a '/' in the service-name label",
            slice(slice_json("a", "s1", "b/c", "http", &["10.244.1.11"])),
            "metadata.labels[kubernetes.io/service-name]",
        ),
        (
            "a newline in the service-name label",
            slice(slice_json("a", "s1", "web\n#", "http", &["10.244.1.11"])),
            "metadata.labels[kubernetes.io/service-name]",
        ),
        (
            "a '/' in an EndpointSlice's namespace",
            slice(slice_json("a/b", "s2", "c", "http", &["10.244.1.22"])),
            "metadata.namespace",
        ),
        (
            "a '/' in an EndpointSlice name",
            slice(slice_json("a", "s/2", "c", "http", &["10.244.1.22"])),
            "metadata.name",
        ),
    ];
    for (what, converted, field) in cases {
        let Some(e) = rejected(&converted) else {
            panic!("{what}: accepted: {:?}", converted.object);
        };
        assert_eq!(e.field, field, "{what}: {e}");
        let text = e.to_string();
        assert!(
            !text.contains('\n'),
            "{what}: the error holds a raw newline: {text}"
        );
    }
}

/// What the API server accepts is accepted: names with digits, dots where allowed, empty
/// EndpointSlice port names, a Service name starting with a digit (`RelaxedServiceNameValidation`).
#[test]
fn names_the_api_server_accepts_are_kept() {
    for (ns, name, port) in [
        ("default", "kubernetes", "https"),
        ("kube-system", "kube-dns", "dns-tcp"),
        ("ns1", "svc1", "p80"),
        ("a", "1abc", "8080"),
        ("a", "web", ""),
        ("a", "web", &"p".repeat(63)),
    ] {
        let c = service(ns, name, port);
        assert!(rejected(&c).is_none(), "{ns}/{name}:{port}: {:?}", c.object);
    }
    for (ns, name, label, port) in [
        ("default", "kubernetes", "kubernetes", "https"),
        ("a", "web-abc12.x", "web", ""),
        ("a", "web-1", "Web_1.x", "http-metrics"),
    ] {
        let c = slice(slice_json(ns, name, label, port, &["10.244.1.2"]));
        assert!(rejected(&c).is_none(), "{ns}/{name}: {:?}", c.object);
        assert!(c.warnings.is_empty(), "{ns}/{name}: {:?}", c.warnings);
    }
}

/// The injected update of a Service that was programmed is refused and its last good version
/// stays: the tenant's own Service keeps working, no rule of theirs is written.
#[test]
fn a_refused_update_keeps_the_last_good_version() {
    let mut m = model();
    m.apply(Event::Apply(service("tenant-a", "web", "http").object));
    m.apply(Event::Apply(
        slice(slice_json(
            "tenant-a",
            "web-1",
            "web",
            "http",
            &["10.244.1.2"],
        ))
        .object,
    ));
    let before = m.snapshot().clone();
    assert_eq!(before.ports.len(), 1);
    for object in [
        service("tenant-a", "web", INJECTION).object,
        slice(slice_json(
            "tenant-a",
            "web-1",
            "web",
            INJECTION,
            &["10.244.1.2"],
        ))
        .object,
        slice(slice_json(
            "tenant-a",
            "web-1",
            "a/b",
            "http",
            &["10.244.1.2"],
        ))
        .object,
    ] {
        let out = m.apply(Event::Apply(object));
        assert_eq!(out.errors.len(), 1, "{:?}", out.errors);
        assert!(out.errors[0].kept, "{}", out.errors[0]);
        assert!(out.diff.is_empty());
        assert_eq!(m.snapshot(), &before);
    }
}

/// A slice port without `name` is the unnamed port, as the API server defaults it
/// (`SetDefaults_EndpointPort`: nil becomes ""): a hand-written selectorless slice of a
/// Service with one unnamed port gives it its endpoints (its port was dropped, "nil port
/// name", and the Service had none).
#[test]
fn a_slice_port_without_a_name_is_the_unnamed_port() {
    let mut m = model();
    let svc = from_json::<Service>(json!({
        "metadata": {"namespace": "ns", "name": "web"},
        "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80, "targetPort": 8080}]}
    }))
    .expect("valid Service JSON");
    let mut value = slice_json("ns", "web-1", "web", "", &["10.244.1.2"]);
    value["ports"] = json!([{"port": 8080, "protocol": "TCP"}]);
    let c = slice(value);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    m.apply(Event::Apply(svc.object));
    m.apply(Event::Apply(c.object));
    let ports: Vec<_> = m.snapshot().ports.values().collect();
    assert_eq!(ports.len(), 1);
    let eps: Vec<String> = ports[0]
        .cluster_endpoints
        .iter()
        .map(|e| e.addr().to_string())
        .collect();
    assert_eq!(eps, ["10.244.1.2:8080"]);
}

/// `a` / `b/c` and `a/b` / `c` were both `a/b/c:http` to the iptables backend: one
/// `KUBE-SVC-` chain for two Services of two namespaces. Neither can be converted now.
#[test]
fn names_that_would_share_a_chain_are_rejected() {
    let mut m = model();
    let objects = [
        service("a", "b/c", "http").object,
        slice(slice_json("a", "s1", "b/c", "http", &["10.244.1.11"])).object,
        service("a/b", "c", "http").object,
        slice(slice_json("a/b", "s2", "c", "http", &["10.244.1.22"])).object,
    ];
    let out = m.apply(Event::Replace {
        kinds: vec![Kind::Service, Kind::EndpointSlice, Kind::Node],
        objects: objects.to_vec(),
    });
    assert_eq!(out.errors.len(), 4, "{:?}", out.errors);
    assert!(m.snapshot().ports.is_empty(), "{:?}", m.snapshot().ports);
}

/// Upstream's ValidateEndpointIP: an endpoint at 127.0.0.1, 0.0.0.0 or 169.254.169.254 is
/// dropped with a warning naming the slice and the field; the others stay.
#[test]
fn special_endpoint_addresses_are_dropped() {
    let c = slice(slice_json(
        "tenant-b",
        "evil-1",
        "evil",
        "p",
        &[
            "10.244.1.66",
            "127.0.0.1",
            "169.254.169.254",
            "0.0.0.0",
            "192.168.77.1",
            "224.0.0.1",
        ],
    ));
    let Object::EndpointSlice { slice: info, .. } = &c.object else {
        panic!("{:?}", c.object);
    };
    let kept: Vec<String> = info.endpoints.iter().map(|e| e.ip.to_string()).collect();
    assert_eq!(kept, ["10.244.1.66", "192.168.77.1"]);
    let fields: Vec<&str> = c.warnings.iter().map(|w| w.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "endpoints[1].addresses[0]",
            "endpoints[2].addresses[0]",
            "endpoints[3].addresses[0]",
            "endpoints[5].addresses[0]"
        ]
    );
    let first = c.warnings[0].to_string();
    assert!(
        first.contains("EndpointSlice tenant-b/evil-1") && first.contains("loopback"),
        "{first}"
    );

    // IPv6 too.
    let endpoints: Vec<Value> = ["fd00::1", "::1", "fe80::1", "::", "ff02::1"]
        .iter()
        .map(|a| json!({"addresses": [a]}))
        .collect();
    let c = slice(json!({
        "metadata": {"namespace": "a", "name": "v6", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv6",
        "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints
    }));
    let Object::EndpointSlice { slice: info, .. } = &c.object else {
        panic!("{:?}", c.object);
    };
    assert_eq!(info.endpoints.len(), 1);
    assert_eq!(c.warnings.len(), 4, "{:?}", c.warnings);
}

/// Upstream's ValidateEndpointIP for `spec.externalIPs`: the special ones are dropped with a
/// warning each, the rest programmed.
#[test]
fn special_external_ips_are_dropped() {
    let c = from_json::<Service>(json!({
        "metadata": {"namespace": "tenant-b", "name": "evil"},
        "spec": {"clusterIP": "10.96.0.20",
                 "externalIPs": ["127.0.0.1", "192.168.77.1", "0.0.0.0", "169.254.169.254", "224.0.0.1", "10.96.0.1", "not-an-ip"],
                 "ports": [{"name": "p", "port": 2379, "protocol": "TCP"}]}
    }))
    .expect("valid Service JSON");
    let Object::Service(info) = &c.object else {
        panic!("{:?}", c.object);
    };
    let kept: Vec<String> = info.external_ips.iter().map(|i| i.to_string()).collect();
    assert_eq!(kept, ["192.168.77.1", "10.96.0.1"]);
    let fields: Vec<&str> = c.warnings.iter().map(|w| w.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.externalIPs[0]",
            "spec.externalIPs[2]",
            "spec.externalIPs[3]",
            "spec.externalIPs[4]",
            "spec.externalIPs[6]"
        ]
    );
}

/// Upstream's EndpointSlice limits (1000 endpoints, 100 ports): a slice over them is refused
/// before its endpoints are read; one at the limit is used.
#[test]
fn slices_over_the_api_servers_limits_are_rejected() {
    let addresses: Vec<String> = (0..1001)
        .map(|i| format!("10.244.{}.{}", i / 250, i % 250 + 1))
        .collect();
    let refs: Vec<&str> = addresses.iter().map(String::as_str).collect();

    let c = slice(slice_json("a", "big", "web", "http", &refs));
    let e = rejected(&c).expect("1001 endpoints refused");
    assert_eq!(e.field, "endpoints");
    assert!(e.to_string().contains("at most 1000"), "{e}");
    let c = slice(slice_json("a", "big", "web", "http", &refs[..1000]));
    assert!(rejected(&c).is_none());

    let ports = |n: usize| {
        (0..n)
            .map(|i| json!({"name": format!("p{i}"), "port": 8000 + i, "protocol": "TCP"}))
            .collect::<Vec<_>>()
    };
    let mut value = slice_json("a", "wide", "web", "http", &["10.244.1.2"]);
    value["ports"] = Value::Array(ports(101));
    let c = slice(value.clone());
    let e = rejected(&c).expect("101 ports refused");
    assert_eq!(e.field, "ports");
    value["ports"] = Value::Array(ports(100));
    assert!(rejected(&slice(value)).is_none());
}

/// Upstream's ValidateLoadBalancerStatus: a load-balancer status on a Service not of type
/// LoadBalancer (AllowServiceLBStatusOnNonLB is locked off since 1.32), an `ipMode` other than
/// VIP or Proxy, an `ipMode` without an `ip` and an `ip` that is no address are refused by the
/// API server. kpng drops each such value with a warning naming the field, keeps the rest of
/// the Service, and reports the dropped values as for external IPs. Upstream applies no
/// ValidateEndpointIP here (nor does kube-proxy), so neither does kpng.
#[test]
fn load_balancer_ingress_the_api_server_refuses_is_dropped() {
    let lb = |name: &str, type_: &str, ingress: Value| {
        from_json::<Service>(json!({
            "metadata": {"namespace": "tenant-b", "name": name},
            "spec": {"type": type_, "clusterIP": "10.96.0.30",
                     "ports": [{"name": "p", "port": 443, "protocol": "TCP", "nodePort": 30443}]},
            "status": {"loadBalancer": {"ingress": ingress}}
        }))
        .expect("valid Service JSON")
    };
    let c = lb(
        "lb",
        "LoadBalancer",
        json!([
            {"ip": "203.0.113.1"},
            {"ip": "203.0.113.2", "ipMode": "VIP"},
            {"ip": "203.0.113.3", "ipMode": "Proxy"},
            {"ip": "203.0.113.4", "ipMode": "Tunnel"},
            {"hostname": "lb.example.com", "ipMode": "VIP"},
            {"ip": "not-an-ip"},
            {"ip": "127.0.0.1", "ipMode": "VIP"},
        ]),
    );
    let Object::Service(info) = &c.object else {
        panic!("{:?}", c.object);
    };
    let kept: Vec<String> = info
        .load_balancer_ips
        .iter()
        .map(|i| i.to_string())
        .collect();
    assert_eq!(kept, ["203.0.113.1", "203.0.113.2", "127.0.0.1"]);
    let fields: Vec<&str> = c.warnings.iter().map(|w| w.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "status.loadBalancer.ingress[3].ipMode",
            "status.loadBalancer.ingress[4].ipMode",
            "status.loadBalancer.ingress[5].ip",
        ]
    );
    let first = c.warnings[0].to_string();
    assert!(
        first.contains("Service tenant-b/lb") && first.contains("\"Tunnel\""),
        "{first}"
    );

    // On a Service of another type, no load-balancer IP is programmed; the rest is.
    for type_ in ["ClusterIP", "NodePort"] {
        let c = lb(
            "np",
            type_,
            json!([{"ip": "203.0.113.9", "ipMode": "VIP"}, {"ip": "10.0.0.1"}]),
        );
        let Object::Service(info) = &c.object else {
            panic!("{type_}: {:?}", c.object);
        };
        assert!(info.load_balancer_ips.is_empty(), "{type_}: {info:?}");
        assert_eq!(info.cluster_ips.len(), 1);
        let fields: Vec<&str> = c.warnings.iter().map(|w| w.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "status.loadBalancer.ingress[0].ip",
                "status.loadBalancer.ingress[1].ip"
            ],
            "{type_}"
        );
        assert!(
            c.warnings[0].message.contains("'LoadBalancer'"),
            "{}",
            c.warnings[0]
        );
    }

    // The model reports the dropped values of the Service in use, as for external IPs.
    let mut m = model();
    let c = lb("np", "NodePort", json!([{"ip": "203.0.113.9"}]));
    m.apply(Event::Apply(c.object));
    let dropped: Vec<String> = m.dropped().map(|(_, w)| w.field.clone()).collect();
    assert_eq!(dropped, ["status.loadBalancer.ingress[0].ip"]);
    assert!(
        m.snapshot()
            .ports
            .values()
            .all(|p| p.load_balancer_ips.is_empty()),
        "{:?}",
        m.snapshot().ports
    );
}

fn node(name: &str) -> Converted {
    from_json::<Node>(json!({
        "metadata": {"name": name},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.1.1"}]}
    }))
    .expect("valid Node JSON")
}

fn service_cidr(name: &str, cidr: &str) -> Converted {
    from_json::<ServiceCIDR>(json!({
        "metadata": {"name": name},
        "spec": {"cidrs": [cidr]}
    }))
    .expect("valid ServiceCIDR JSON")
}

/// Upstream's ValidateNodeName and ValidateServiceCIDRName: DNS-1123 subdomains. A Node or
/// ServiceCIDR named otherwise is refused naming the object and the field, and changes nothing
/// the model holds (the Nodes and ranges in use stay).
#[test]
fn node_and_service_cidr_names_follow_the_api_server() {
    for name in ["node1", "ip-10-0-0-1.ec2.internal", "0", "kubernetes"] {
        let c = node(name);
        assert!(rejected(&c).is_none(), "Node {name}: {:?}", c.object);
        let c = service_cidr(name, "10.96.0.0/16");
        assert!(rejected(&c).is_none(), "ServiceCIDR {name}: {:?}", c.object);
    }
    let long = "n".repeat(254);
    for name in [
        "Node1",
        "node_1",
        "node 1",
        "a/b",
        "node1.",
        "-node1",
        "node\"1",
        "é",
        long.as_str(),
    ] {
        for (kind, c) in [
            ("Node", node(name)),
            ("ServiceCIDR", service_cidr(name, "10.97.0.0/16")),
        ] {
            let Some(e) = rejected(&c) else {
                panic!("{kind} {name:?}: accepted: {:?}", c.object);
            };
            assert_eq!(e.field, "metadata.name", "{kind} {name:?}: {e}");
            let text = e.to_string();
            assert!(
                text.contains(kind) && text.contains("DNS-1123 subdomain"),
                "{kind} {name:?}: {text}"
            );
        }
    }

    // The node and the Service CIDRs in use stay, whether the refused objects come one by one
    // or in a relist.
    let mut m = model();
    m.apply(Event::Replace {
        kinds: vec![Kind::Node, Kind::ServiceCidr],
        objects: vec![
            node("node1").object,
            service_cidr("kubernetes", "10.96.0.0/16").object,
        ],
    });
    let before = m.snapshot().clone();
    assert_eq!(before.service_cidrs.len(), 1);
    assert_eq!(before.node.ips.len(), 1, "{:?}", before.node);
    let out = m.apply(Event::Apply(service_cidr("Evil_CIDR", "0.0.0.0/0").object));
    assert_eq!(out.errors.len(), 1, "{:?}", out.errors);
    assert!(!out.errors[0].kept);
    assert_eq!(m.snapshot(), &before);
    let out = m.apply(Event::Replace {
        kinds: vec![Kind::Node, Kind::ServiceCidr],
        objects: vec![
            node("node1").object,
            node("Node1").object,
            service_cidr("kubernetes", "10.96.0.0/16").object,
            service_cidr("a/b", "10.0.0.0/8").object,
        ],
    });
    assert_eq!(out.errors.len(), 2, "{:?}", out.errors);
    assert_eq!(m.snapshot(), &before);
}

/// An address with white space around it is no address, as for Go's `ParseIPSloppy`, which
/// trims nothing (kube-proxy refuses or skips it): a cluster IP rejects the Service, any
/// other address is dropped; the error or warning names the object and the field.
#[test]
fn addresses_with_white_space_are_invalid_naming_object_and_field() {
    let svc = |spec: Value, status: Value| -> Converted {
        from_json::<Service>(json!({
            "metadata": {"namespace": "ns", "name": "web"}, "spec": spec, "status": status
        }))
        .expect("valid Service JSON")
    };
    let ports = json!([{"name": "p", "port": 80, "protocol": "TCP"}]);
    // (case, the converted object, rejected rather than dropped, object, field, raw value)
    let cases: Vec<(&str, Converted, bool, &str, &str, &str)> = vec![
        (
            "clusterIP",
            svc(
                json!({"clusterIP": " 10.96.0.10", "ports": ports}),
                json!({}),
            ),
            true,
            "Service ns/web",
            "spec.clusterIP",
            " 10.96.0.10",
        ),
        (
            "clusterIPs",
            svc(
                json!({"clusterIP": "10.96.0.10 ", "clusterIPs": ["10.96.0.10 "], "ports": ports}),
                json!({}),
            ),
            true,
            "Service ns/web",
            "spec.clusterIPs[0]",
            "10.96.0.10 ",
        ),
        (
            "IPv6 clusterIP",
            svc(
                json!({"clusterIP": "\tfd00:96::10", "ports": ports}),
                json!({}),
            ),
            true,
            "Service ns/web",
            "spec.clusterIP",
            "\tfd00:96::10",
        ),
        (
            "external IP",
            svc(
                json!({"clusterIP": "10.96.0.10", "externalIPs": [" 192.168.77.1"], "ports": ports}),
                json!({}),
            ),
            false,
            "Service ns/web",
            "spec.externalIPs[0]",
            " 192.168.77.1",
        ),
        (
            "load-balancer ingress IP",
            svc(
                json!({"type": "LoadBalancer", "clusterIP": "10.96.0.10", "ports": ports}),
                json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.7 "}]}}),
            ),
            false,
            "Service ns/web",
            "status.loadBalancer.ingress[0].ip",
            "203.0.113.7 ",
        ),
        (
            "endpoint address",
            slice(slice_json("ns", "web-1", "web", "p", &[" 10.244.1.5"])),
            false,
            "EndpointSlice ns/web-1",
            "endpoints[0].addresses[0]",
            " 10.244.1.5",
        ),
        (
            "node address",
            from_json::<Node>(json!({
                "metadata": {"name": "node1"},
                "status": {"addresses": [{"type": "InternalIP", "address": "192.168.77.1 "}]}
            }))
            .expect("valid Node JSON"),
            false,
            "Node node1",
            "status.addresses[0].address",
            "192.168.77.1 ",
        ),
    ];
    for (case, c, rejects, object, field, raw) in cases {
        let (got_object, got_field, message) = match (rejects, rejected(&c), c.warnings.first()) {
            (true, Some(e), _) => (e.object.to_string(), e.field.clone(), e.message.clone()),
            (false, None, Some(w)) => (w.object.to_string(), w.field.clone(), w.message.clone()),
            _ => panic!("{case}: {:?}, warnings {:?}", c.object, c.warnings),
        };
        assert_eq!(got_object, object, "{case}");
        assert_eq!(got_field, field, "{case}");
        assert_eq!(message, format!("{raw:?} is not an IP address"), "{case}");
        if !rejects {
            assert_eq!(c.warnings.len(), 1, "{case}: {:?}", c.warnings);
        }
    }
}
