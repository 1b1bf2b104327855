//! Addresses as sources without an API server can write them: IPv4-mapped IPv6 addresses and
//! CIDRs are IPv4 (as Go's net.ParseIP reads them, so kube-proxy programs them in IPv4), and
//! an invalid load-balancer source range makes the Service a broken object (its last good
//! version stays), never a wider firewall.

use serde_json::{Value, json};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kpng_k8s::from_json;
use kpng_model::*;

fn model() -> Model {
    Model::new(ModelConfig {
        node_name: "node1".into(),
        ..ModelConfig::default()
    })
}

fn service(name: &str, spec: Value, ingress: &[&str]) -> kpng_k8s::Converted {
    let ingress: Vec<Value> = ingress.iter().map(|ip| json!({"ip": ip})).collect();
    from_json::<Service>(json!({
        "metadata": {"namespace": "ns", "name": name},
        "spec": spec,
        "status": {"loadBalancer": {"ingress": ingress}},
    }))
    .expect("valid Service JSON")
}

fn slice(name: &str, family: &str, addresses: &[&str]) -> kpng_k8s::Converted {
    let endpoints: Vec<Value> = addresses
        .iter()
        .map(|a| json!({"addresses": [a], "nodeName": "node1"}))
        .collect();
    from_json::<EndpointSlice>(json!({
        "metadata": {"namespace": "ns", "name": format!("{name}-{}", family.to_lowercase()),
                     "labels": {"kubernetes.io/service-name": name}},
        "addressType": family,
        "ports": [{"name": "http", "port": 8080}],
        "endpoints": endpoints,
    }))
    .expect("valid EndpointSlice JSON")
}

/// Every programmed port as `ns/name family cluster_ip ext=… lb=… ranges=… eps=…`.
fn programmed(m: &Model) -> Vec<String> {
    let list = |v: Vec<String>| v.join(",");
    m.snapshot()
        .ports
        .values()
        .map(|p| {
            format!(
                "{} {} {} ext={} lb={} ranges={} eps={}",
                p.key.service,
                p.key.family,
                p.cluster_ip,
                list(p.external_ips.iter().map(|i| i.to_string()).collect()),
                list(p.load_balancer_ips.iter().map(|i| i.to_string()).collect()),
                list(p.source_ranges.iter().map(|r| r.to_string()).collect()),
                list(p.cluster_endpoints.iter().map(|e| e.to_string()).collect()),
            )
        })
        .collect()
}

#[test]
fn ipv4_mapped_addresses_are_ipv4() {
    struct Case {
        name: &'static str,
        spec: Value,
        ingress: &'static [&'static str],
        /// (addressType, addresses).
        slices: &'static [(&'static str, &'static [&'static str])],
        programmed: &'static [&'static str],
        /// (object field, words of the warning).
        warned: &'static [(&'static str, &'static str)],
    }
    let cases = [
        Case {
            name: "a mapped ClusterIP and a mapped endpoint in an IPv4 slice",
            spec: json!({"clusterIP": "::ffff:10.96.0.99", "clusterIPs": ["::ffff:10.96.0.99"],
                         "ports": [{"name": "http", "port": 80}]}),
            ingress: &[],
            slices: &[("IPv4", &["::ffff:10.244.1.2", "10.244.1.3"])],
            programmed: &[
                "ns/web IPv4 10.96.0.99 ext= lb= ranges= eps=10.244.1.2:8080,10.244.1.3:8080",
            ],
            warned: &[],
        },
        Case {
            name: "a mapped endpoint in an IPv6 slice is no IPv6 endpoint",
            spec: json!({"clusterIP": "fd00:96::a1", "ports": [{"name": "http", "port": 80}]}),
            ingress: &[],
            slices: &[("IPv6", &["::ffff:10.244.1.2", "fd00:244:1::3"])],
            programmed: &["ns/web IPv6 fd00:96::a1 ext= lb= ranges= eps=[fd00:244:1::3]:8080"],
            warned: &[(
                "endpoints[0].addresses[0]",
                "\"::ffff:10.244.1.2\" is an IPv4-mapped IPv6 address, which is IPv4 10.244.1.2; an addressType IPv6 slice holds IPv6 addresses only",
            )],
        },
        Case {
            name: "mapped external and load-balancer IPs and source range",
            spec: json!({"type": "LoadBalancer", "clusterIP": "10.96.0.3",
                         "allocateLoadBalancerNodePorts": false,
                         "externalIPs": ["::ffff:198.51.100.3"],
                         "loadBalancerSourceRanges": ["::ffff:192.168.100.0/120"],
                         "ports": [{"name": "http", "port": 80}]}),
            ingress: &["::ffff:198.51.100.4"],
            slices: &[("IPv4", &["10.244.1.2"])],
            programmed: &[
                "ns/web IPv4 10.96.0.3 ext=198.51.100.3 lb=198.51.100.4 ranges=192.168.100.0/24 eps=10.244.1.2:8080",
            ],
            warned: &[],
        },
        Case {
            name: "mapped IPs of an IPv6-only Service are IPv4: not programmed in IPv6",
            spec: json!({"type": "LoadBalancer", "clusterIP": "fd00:96::a3",
                         "allocateLoadBalancerNodePorts": false,
                         "externalIPs": ["::ffff:198.51.100.3"],
                         "ports": [{"name": "http", "port": 80}]}),
            ingress: &["::ffff:198.51.100.4"],
            slices: &[("IPv6", &["fd00:244:1::2"])],
            programmed: &["ns/web IPv6 fd00:96::a3 ext= lb= ranges= eps=[fd00:244:1::2]:8080"],
            warned: &[],
        },
    ];
    for case in cases {
        let mut m = model();
        let mut warnings = Vec::new();
        let svc = service("web", case.spec, case.ingress);
        warnings.extend(svc.warnings);
        m.apply(Event::Apply(svc.object));
        for (family, addresses) in case.slices {
            let s = slice("web", family, addresses);
            warnings.extend(s.warnings);
            m.apply(Event::Apply(s.object));
        }
        assert_eq!(programmed(&m), case.programmed, "{}", case.name);
        let got: Vec<(String, String)> = warnings
            .iter()
            .map(|w| (w.field.clone(), w.message.clone()))
            .collect();
        assert_eq!(got.len(), case.warned.len(), "{}: {got:?}", case.name);
        for ((field, message), (want_field, want)) in got.iter().zip(case.warned) {
            assert_eq!(field, want_field, "{}", case.name);
            assert!(message.contains(want), "{}: {message}", case.name);
        }
        // What was dropped stays in the model for `kpng status`, not only in the log.
        let kept: Vec<(String, String)> = m
            .dropped()
            .map(|(service, w)| {
                assert_eq!(service.map(|k| k.to_string()).as_deref(), Some("ns/web"));
                (w.field.clone(), w.message.clone())
            })
            .collect();
        assert_eq!(kept, got, "{}", case.name);
    }
}

#[test]
fn a_node_with_mapped_addresses_is_ipv4() {
    let converted = from_json::<Node>(json!({
        "metadata": {"name": "node1"},
        "spec": {"podCIDRs": ["::ffff:10.244.1.0/120", "::ffff:10.0.0.0/64"]},
        "status": {"addresses": [{"type": "InternalIP", "address": "::ffff:192.168.100.1"}]},
    }))
    .expect("valid Node JSON");
    let Object::Node(node) = &converted.object else {
        panic!("not a Node: {:?}", converted.object)
    };
    assert_eq!(
        node.internal_ips,
        ["192.168.100.1".parse::<std::net::IpAddr>().expect("ip")]
    );
    let cidrs: Vec<String> = node.pod_cidrs.iter().map(|c| c.to_string()).collect();
    assert_eq!(cidrs, ["10.244.1.0/24"]);
    let warned: Vec<String> = converted.warnings.iter().map(|w| w.to_string()).collect();
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0].contains("field spec.podCIDRs[1]")
            && warned[0].contains("IPv4-mapped IPv6 CIDR with prefix /64"),
        "{warned:?}"
    );
}

/// An invalid entry of `loadBalancerSourceRanges` (a zone id, a mapped range shorter than
/// /96, garbage) rejects the Service: the last good version, with its ranges, stays; a
/// Service never seen valid is not programmed at all. Dropping the entry instead left a
/// Service whose only range was invalid open to every source.
#[test]
fn an_invalid_source_range_rejects_the_service() {
    let lb = |ranges: &[&str]| {
        json!({"type": "LoadBalancer", "clusterIP": "fd00:96::a1",
               "allocateLoadBalancerNodePorts": false, "loadBalancerSourceRanges": ranges,
               "ports": [{"name": "http", "port": 80}]})
    };
    let cases: &[(&str, &str)] = &[
        (
            "fd00:100::10%eth0/128",
            "\"fd00:100::10%eth0/128\" is not a CIDR",
        ),
        (
            "::ffff:192.168.0.0/80",
            "IPv4-mapped IPv6 CIDR with prefix /80",
        ),
        ("garbage", "\"garbage\" is not a CIDR"),
    ];
    for (bad, says) in cases {
        let mut m = model();
        let good = service("zone", lb(&["fd00:100::/64"]), &["fd00:203::a1"]);
        m.apply(Event::Apply(good.object));
        let before = programmed(&m);
        assert_eq!(
            before,
            ["ns/zone IPv6 fd00:96::a1 ext= lb=fd00:203::a1 ranges=fd00:100::/64 eps="]
        );
        let broken = service("zone", lb(&["fd00:100::/64", bad]), &["fd00:203::a1"]);
        assert!(broken.warnings.is_empty(), "{:?}", broken.warnings);
        let out = m.apply(Event::Apply(broken.object));
        assert_eq!(out.errors.len(), 1, "{bad}");
        let error = out.errors[0].to_string();
        assert!(
            error.starts_with("Service ns/zone: field spec.loadBalancerSourceRanges[1]: ")
                && error.contains(says)
                && error.ends_with("; keeping its last good version"),
            "{bad}: {error}"
        );
        assert!(out.diff.is_empty(), "{bad}");
        assert_eq!(programmed(&m), before, "{bad}");
        assert_eq!(m.rejected().len(), 1, "{bad}: kpng status lists it");

        // Never valid: nothing is programmed, rather than an open load balancer.
        let out = m.apply(Event::Apply(
            service("open", lb(&[bad]), &["fd00:203::a2"]).object,
        ));
        assert!(!out.errors[0].kept, "{bad}");
        assert!(
            programmed(&m).iter().all(|p| !p.starts_with("ns/open ")),
            "{bad}: {:?}",
            programmed(&m)
        );
    }
}

/// White space in a CIDR is read as kube-proxy reads it: `netutils.ParseCIDRSloppy` trims
/// nothing, so a pod CIDR or a range with white space is invalid; kube-proxy trims a
/// `loadBalancerSourceRanges` entry first (as the API server does), so white space around
/// one is accepted, and inside one rejects the Service, as any invalid range does.
#[test]
fn white_space_in_cidrs_is_read_as_kube_proxy_reads_it() {
    // (source range, Ok(programmed ranges) or Err(words of the error))
    let ranges: &[(&str, Result<&str, &str>)] = &[
        ("fd00:100::/64", Ok("fd00:100::/64")),
        (" fd00:100::/64\t", Ok("fd00:100::/64")),
        ("fd00:100:: /64", Err("\"fd00:100:: /64\" is not a CIDR")),
        ("fd00:100::/ 64", Err("\"fd00:100::/ 64\" is not a CIDR")),
    ];
    for (range, want) in ranges {
        let mut m = model();
        let lb = json!({"type": "LoadBalancer", "clusterIP": "fd00:96::a1",
                        "allocateLoadBalancerNodePorts": false,
                        "loadBalancerSourceRanges": [range],
                        "ports": [{"name": "http", "port": 80}]});
        let out = m.apply(Event::Apply(service("ws", lb, &["fd00:203::a1"]).object));
        match want {
            Ok(programmed_range) => {
                assert!(out.errors.is_empty(), "{range:?}: {:?}", out.errors);
                assert_eq!(
                    programmed(&m),
                    [format!(
                        "ns/ws IPv6 fd00:96::a1 ext= lb=fd00:203::a1 ranges={programmed_range} eps="
                    )],
                    "{range:?}"
                );
            }
            Err(says) => {
                assert_eq!(out.errors.len(), 1, "{range:?}");
                assert!(
                    out.errors[0].to_string().contains(says),
                    "{range:?}: {:?}",
                    out.errors
                );
                assert!(programmed(&m).is_empty(), "{range:?}");
            }
        }
    }
    // (pod CIDR, programmed pod CIDRs)
    let pod_cidrs: &[(&str, &[&str])] = &[
        ("10.244.1.0/24", &["10.244.1.0/24"]),
        (" 10.244.1.0/24", &[]),
        ("10.244.1.0/24 ", &[]),
        ("10.244.1.0 /24", &[]),
        ("10.244.1.0/ 24", &[]),
    ];
    for (cidr, want) in pod_cidrs {
        let converted = from_json::<Node>(json!({
            "metadata": {"name": "node1"},
            "spec": {"podCIDRs": [cidr]},
        }))
        .expect("valid Node JSON");
        let Object::Node(node) = &converted.object else {
            panic!("not a Node: {:?}", converted.object)
        };
        let got: Vec<String> = node.pod_cidrs.iter().map(|c| c.to_string()).collect();
        assert_eq!(got, *want, "{cidr:?}");
        let warned: Vec<String> = converted.warnings.iter().map(|w| w.to_string()).collect();
        assert_eq!(warned.len(), 1 - want.len(), "{cidr:?}: {warned:?}");
    }
}

/// What the conversion dropped stays listed while the object that had it is in use: a new
/// version without it, the object's deletion or a list without it clears it.
#[test]
fn dropped_values_last_as_long_as_their_object() {
    let mut m = model();
    let svc = |ext: &[&str]| {
        service(
            "web",
            json!({"clusterIP": "10.96.0.9", "externalIPs": ext,
                   "ports": [{"name": "http", "port": 80}]}),
            &[],
        )
        .object
    };
    let fields = |m: &Model| -> Vec<String> {
        m.dropped()
            .map(|(_, w)| format!("{} {}", w.object, w.field))
            .collect()
    };
    m.apply(Event::Apply(svc(&["fe80::1%eth0", "198.51.100.9"])));
    m.apply(Event::Apply(
        slice("web", "IPv6", &["::ffff:10.244.1.2"]).object,
    ));
    assert_eq!(
        fields(&m),
        [
            "Service ns/web spec.externalIPs[0]",
            "EndpointSlice ns/web-ipv6 endpoints[0].addresses[0]"
        ]
    );
    m.apply(Event::Apply(svc(&["198.51.100.9"])));
    assert_eq!(
        fields(&m),
        ["EndpointSlice ns/web-ipv6 endpoints[0].addresses[0]"]
    );
    m.apply(Event::Replace {
        kinds: vec![Kind::EndpointSlice],
        objects: Vec::new(),
    });
    assert!(fields(&m).is_empty());
    m.apply(Event::Apply(svc(&["fe80::1%eth0"])));
    m.apply(Event::Delete(ObjectRef {
        kind: Kind::Service,
        namespace: "ns".into(),
        name: "web".into(),
    }));
    assert!(fields(&m).is_empty());
}
