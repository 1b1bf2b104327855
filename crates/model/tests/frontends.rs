//! Node ports outside `--service-node-port-range` and frontends two Services claim: what is
//! programmed, what is warned about, and that the resolution (oldest wins) does not depend on
//! the order objects arrive in.

use serde_json::{Value, json};

use k8s_openapi::api::core::v1::Service;
use kpng_k8s::from_json;
use kpng_model::*;

fn range(s: &str) -> NodePortRange {
    s.parse().expect("valid range")
}

fn model(range: Option<NodePortRange>) -> Model {
    Model::new(ModelConfig {
        node_name: "node-a".into(),
        node_port_range: range,
        ..ModelConfig::default()
    })
}

/// A Service `ns/name` created at `created` (RFC 3339, or none) with this spec.
fn service(ns: &str, name: &str, created: Option<&str>, spec: Value) -> Event {
    let mut metadata = json!({"namespace": ns, "name": name});
    if let Some(at) = created {
        metadata["creationTimestamp"] = json!(at);
    }
    let svc = from_json::<Service>(json!({"metadata": metadata, "spec": spec}))
        .expect("valid Service JSON");
    assert!(svc.warnings.is_empty(), "{:?}", svc.warnings);
    Event::Apply(svc.object)
}

fn delete(ns: &str, name: &str) -> Event {
    Event::Delete(ObjectRef {
        kind: Kind::Service,
        namespace: ns.into(),
        name: name.into(),
    })
}

/// Every programmed Service port as `ns/name cluster_ip:port np=NODE_PORT hc=HC`, sorted.
fn programmed(m: &Model) -> Vec<String> {
    m.snapshot()
        .ports
        .values()
        .map(|p| {
            format!(
                "{} {}:{} np={} hc={}",
                p.key.service,
                p.cluster_ip,
                p.port,
                p.node_port.map_or("-".into(), |n| n.to_string()),
                p.health_check_node_port
                    .map_or("-".into(), |n| n.to_string()),
            )
        })
        .collect()
}

#[test]
fn node_port_range_parses_kube_proxy_spellings_and_refuses_garbage() {
    let cases: &[(&str, Result<&str, &str>)] = &[
        ("30000-32767", Ok("30000-32767")),
        ("30000+2767", Ok("30000-32767")),
        ("8080", Ok("8080-8080")),
        (" 2000 - 3000 ", Ok("2000-3000")),
        ("1-65535", Ok("1-65535")),
        ("", Err("\"\" is not a number")),
        ("abc", Err("\"abc\" is not a number")),
        ("30000-", Err("\"\" is not a number")),
        ("-5", Err("\"\" is not a number")),
        ("1,2", Err("\"1,2\" is not a number")),
        ("32767-30000", Err("32767 is above 30000")),
        ("0-100", Err("port 0 is not a node port")),
        ("1-70000", Err("70000 is above 65535")),
        ("60000+10000", Err("70000 is above 65535")),
        ("99999999999-1", Err("99999999999 is too large")),
    ];
    for (input, want) in cases {
        let got = input.parse::<NodePortRange>();
        match (want, got) {
            (Ok(want), Ok(got)) => assert_eq!(got.to_string(), *want, "{input:?}"),
            (Err(want), Err(got)) => {
                let text = got.to_string();
                assert!(text.contains(want), "{input:?}: {text}");
                assert!(text.contains("expected FIRST-LAST"), "{input:?}: {text}");
            }
            (want, got) => panic!("{input:?}: want {want:?}, got {got:?}"),
        }
    }
    assert_eq!(NodePortRange::default(), range("30000-32767"));
}

#[test]
fn node_ports_outside_the_range_are_dropped_with_a_warning() {
    struct Case {
        name: &'static str,
        range: Option<&'static str>,
        node_port: u16,
        health_check: u16,
        programmed: &'static str,
        warnings: &'static [&'static str],
    }
    let cases = [
        Case {
            name: "inside the default range",
            range: Some("30000-32767"),
            node_port: 30080,
            health_check: 32000,
            programmed: "default/web 10.96.0.10:80 np=30080 hc=32000",
            warnings: &[],
        },
        Case {
            name: "both ends are inside",
            range: Some("30080+1920"),
            node_port: 30080,
            health_check: 32000,
            programmed: "default/web 10.96.0.10:80 np=30080 hc=32000",
            warnings: &[],
        },
        Case {
            name: "an SSH-like node port",
            range: Some("30000-32767"),
            node_port: 2222,
            health_check: 32000,
            programmed: "default/web 10.96.0.10:80 np=- hc=32000",
            warnings: &[
                "Service default/web: field spec.ports[0].nodePort: 2222 is outside --service-node-port-range 30000-32767; the node port is not programmed (ignored)",
            ],
        },
        Case {
            name: "kpng's own health port as health check port",
            range: Some("30000-32767"),
            node_port: 30080,
            health_check: 10256,
            programmed: "default/web 10.96.0.10:80 np=30080 hc=-",
            warnings: &[
                "Service default/web: field spec.healthCheckNodePort: 10256 is outside --service-node-port-range 30000-32767; the health check node port is not programmed (ignored)",
            ],
        },
        Case {
            name: "a custom range excludes the default one",
            range: Some("20000-20999"),
            node_port: 30080,
            health_check: 20001,
            programmed: "default/web 10.96.0.10:80 np=- hc=20001",
            warnings: &[
                "Service default/web: field spec.ports[0].nodePort: 30080 is outside --service-node-port-range 20000-20999; the node port is not programmed (ignored)",
            ],
        },
        Case {
            name: "no range accepts anything",
            range: None,
            node_port: 22,
            health_check: 10256,
            programmed: "default/web 10.96.0.10:80 np=22 hc=10256",
            warnings: &[],
        },
    ];
    for case in cases {
        let mut m = model(case.range.map(range));
        let spec = json!({
            "type": "LoadBalancer", "externalTrafficPolicy": "Local",
            "clusterIP": "10.96.0.10", "externalIPs": ["192.0.2.10"],
            "healthCheckNodePort": case.health_check,
            "ports": [{"name": "p", "port": 80, "nodePort": case.node_port}]
        });
        let out = m.apply(service("default", "web", None, spec.clone()));
        let warnings: Vec<String> = out.warnings.iter().map(|w| w.to_string()).collect();
        assert_eq!(warnings, case.warnings, "{}", case.name);
        assert_eq!(programmed(&m), [case.programmed], "{}", case.name);
        // Kept among the dropped values while it lasts, so that `kpng status` shows it (it
        // was a warning only, gone once the log scrolled).
        let dropped: Vec<String> = m.dropped().map(|(_, w)| w.to_string()).collect();
        assert_eq!(dropped, case.warnings, "{}: dropped", case.name);
        // The rest of the Service is kept.
        let port = m.snapshot().ports.values().next().expect("a port");
        assert_eq!(port.external_ips.len(), 1, "{}", case.name);
        // The same object again changes nothing and warns no more.
        let again = m.apply(service("default", "web", None, spec));
        assert!(again.warnings.is_empty(), "{}", case.name);
        assert!(again.diff.is_empty(), "{}", case.name);
        // A version inside the range ends it.
        let inside = json!({
            "type": "LoadBalancer", "externalTrafficPolicy": "Local",
            "clusterIP": "10.96.0.10", "externalIPs": ["192.0.2.10"],
            "ports": [{"name": "p", "port": 80}]
        });
        m.apply(service("default", "web", None, inside));
        assert_eq!(m.dropped().count(), 0, "{}: fixed", case.name);
    }
}

const OLD: Option<&str> = Some("2024-01-01T00:00:00Z");
const NEW: Option<&str> = Some("2025-06-01T00:00:00Z");
const MID: Option<&str> = Some("2024-06-01T00:00:00Z");

#[test]
fn conflicting_frontends_go_to_the_oldest_service() {
    /// (namespace, name, creationTimestamp, clusterIP, port, nodePort).
    type Svc = (
        &'static str,
        &'static str,
        Option<&'static str>,
        &'static str,
        u16,
        u16,
    );
    struct Case {
        name: &'static str,
        services: &'static [Svc],
        programmed: &'static [&'static str],
        /// (loser, owner named in the warning, field).
        warned: &'static [(&'static str, &'static str, &'static str)],
    }
    let cases = [
        Case {
            name: "no conflict",
            services: &[
                ("a", "x", NEW, "10.96.0.1", 80, 30001),
                ("a", "y", OLD, "10.96.0.2", 80, 30002),
            ],
            programmed: &[
                "a/x 10.96.0.1:80 np=30001 hc=-",
                "a/y 10.96.0.2:80 np=30002 hc=-",
            ],
            warned: &[],
        },
        Case {
            name: "same ClusterIP, other port: no conflict",
            services: &[
                ("a", "x", NEW, "10.96.0.1", 80, 0),
                ("a", "y", OLD, "10.96.0.1", 81, 0),
            ],
            programmed: &["a/x 10.96.0.1:80 np=- hc=-", "a/y 10.96.0.1:81 np=- hc=-"],
            warned: &[],
        },
        Case {
            name: "same ClusterIP port: the older keeps it",
            services: &[
                ("a", "x", NEW, "10.96.0.1", 80, 0),
                ("z", "y", OLD, "10.96.0.1", 80, 0),
            ],
            programmed: &["z/y 10.96.0.1:80 np=- hc=-"],
            warned: &[("a/x", "z/y", "spec.ports[0].port")],
        },
        Case {
            name: "same node port: the older keeps it, the rest of the loser stays",
            services: &[
                ("a", "x", NEW, "10.96.0.1", 80, 30080),
                ("a", "y", OLD, "10.96.0.2", 80, 30080),
            ],
            programmed: &[
                "a/x 10.96.0.1:80 np=- hc=-",
                "a/y 10.96.0.2:80 np=30080 hc=-",
            ],
            warned: &[("a/x", "a/y", "spec.ports[0].nodePort")],
        },
        Case {
            name: "a Service without a timestamp counts as the newest",
            services: &[
                ("a", "a", None, "10.96.0.1", 80, 30080),
                ("z", "z", NEW, "10.96.0.1", 80, 30080),
            ],
            programmed: &["z/z 10.96.0.1:80 np=30080 hc=-"],
            warned: &[
                ("a/a", "z/z", "spec.ports[0].port"),
                ("a/a", "z/z", "spec.ports[0].nodePort"),
            ],
        },
        Case {
            name: "same age: namespace/name decides",
            services: &[
                ("b", "a", OLD, "10.96.0.1", 80, 30080),
                ("a", "b", OLD, "10.96.0.2", 80, 30080),
            ],
            programmed: &[
                "a/b 10.96.0.2:80 np=30080 hc=-",
                "b/a 10.96.0.1:80 np=- hc=-",
            ],
            warned: &[("b/a", "a/b", "spec.ports[0].nodePort")],
        },
        Case {
            name: "neither has a timestamp: namespace/name decides",
            services: &[
                ("ns", "web2", None, "10.96.0.1", 80, 0),
                ("ns", "web1", None, "10.96.0.1", 80, 0),
            ],
            programmed: &["ns/web1 10.96.0.1:80 np=- hc=-"],
            warned: &[("ns/web2", "ns/web1", "spec.ports[0].port")],
        },
        Case {
            name: "three claimants: both younger ones lose to the oldest",
            services: &[
                ("a", "new", NEW, "10.96.0.1", 80, 30080),
                ("a", "undated", None, "10.96.0.2", 80, 30080),
                ("a", "old", OLD, "10.96.0.3", 80, 30080),
            ],
            programmed: &[
                "a/new 10.96.0.1:80 np=- hc=-",
                "a/old 10.96.0.3:80 np=30080 hc=-",
                "a/undated 10.96.0.2:80 np=- hc=-",
            ],
            warned: &[
                ("a/new", "a/old", "spec.ports[0].nodePort"),
                ("a/undated", "a/old", "spec.ports[0].nodePort"),
            ],
        },
    ];
    for case in cases {
        let events = |order: &mut dyn Iterator<Item = &Svc>| -> Vec<Event> {
            order
                .map(|(ns, name, created, ip, port, np)| {
                    let mut p = json!({"name": "p", "port": port});
                    let mut spec = json!({"clusterIP": ip});
                    if *np != 0 {
                        p["nodePort"] = json!(np);
                        spec["type"] = json!("NodePort");
                    }
                    spec["ports"] = json!([p]);
                    service(ns, name, *created, spec)
                })
                .collect()
        };
        // One list (a start), forward and backward: the same result, whichever comes first.
        for order in ["forward", "backward"] {
            let list = if order == "forward" {
                events(&mut case.services.iter())
            } else {
                events(&mut case.services.iter().rev())
            };
            let mut m = model(Some(NodePortRange::default()));
            let mut warnings = Vec::new();
            let kinds = vec![Kind::Service];
            m.apply(Event::ListStart {
                kinds: kinds.clone(),
            });
            for e in list {
                let Event::Apply(o) = e else {
                    unreachable!("service() builds an Apply")
                };
                warnings.extend(m.apply(Event::ListItem(o)).warnings);
            }
            warnings.extend(m.apply(Event::ListDone { kinds }).warnings);
            assert_eq!(programmed(&m), case.programmed, "{} ({order})", case.name);
            let mut got: Vec<(String, String)> = warnings
                .iter()
                .map(|w| {
                    (
                        format!("{}/{}", w.object.namespace, w.object.name),
                        w.field.clone(),
                    )
                })
                .collect();
            got.sort();
            got.dedup();
            let mut want: Vec<(String, String)> = case
                .warned
                .iter()
                .map(|(loser, _, field)| (loser.to_string(), field.to_string()))
                .collect();
            want.sort();
            assert_eq!(got, want, "{} ({order})", case.name);
            // Each lost frontend is also a dropped value of the loser, which `kpng status`
            // and the brain's report show while it lasts (the warning alone scrolls away).
            let mut dropped: Vec<(String, String)> = m
                .dropped()
                .map(|(service, w)| {
                    let object = format!("{}/{}", w.object.namespace, w.object.name);
                    assert_eq!(service.map(|k| k.to_string()), Some(object.clone()));
                    (object, w.field.clone())
                })
                .collect();
            dropped.sort();
            dropped.dedup();
            assert_eq!(dropped, want, "{} ({order}): dropped", case.name);
            for (loser, owner, _) in case.warned {
                // The last warning for the loser names the final owner.
                let w = warnings
                    .iter()
                    .rfind(|w| format!("{}/{}", w.object.namespace, w.object.name) == *loser)
                    .expect("a warning for the loser");
                assert!(
                    w.message.contains(&format!("Service {owner}'s")),
                    "{}: {w}",
                    case.name
                );
            }
        }
    }
}

/// Hand-written manifests have no creation times: a Service added beside a working one that
/// claims its ClusterIP port or node port (a copy-paste slip) loses them, whatever the names,
/// so that an edit never takes a working Service's frontends away; the warning names the
/// newcomer. A list (a start, a relist) shares one moment: there namespace/name decides.
#[test]
fn a_service_added_beside_a_working_one_does_not_take_its_frontends() {
    let spec = |ip: &str| {
        json!({"type": "NodePort", "clusterIP": ip,
               "ports": [{"name": "p", "port": 80, "nodePort": 30080}]})
    };
    for (working, newcomer) in [("zonal", "clash"), ("clash", "zonal")] {
        let mut m = model(Some(NodePortRange::default()));
        m.apply(service("default", working, None, spec("10.96.0.40")));
        let out = m.apply(service("default", newcomer, None, spec("10.96.0.40")));
        assert_eq!(
            programmed(&m),
            [format!("default/{working} 10.96.0.40:80 np=30080 hc=-"),],
            "{newcomer} added beside {working}"
        );
        assert!(
            out.warnings.len() == 2
                && out
                    .warnings
                    .iter()
                    .all(|w| w.object.name.as_ref() == newcomer
                        && w.message.contains(&format!("Service default/{working}'s"))),
            "{:?}",
            out.warnings
        );
        // Its own edits keep it what it is: still the newcomer.
        let out = m.apply(service("default", newcomer, None, spec("10.96.0.40")));
        assert!(out.warnings.is_empty(), "{:?}", out.warnings);
        let mut edited = spec("10.96.0.40");
        edited["ports"][0]["port"] = json!(80);
        edited["sessionAffinity"] = json!("ClientIP");
        m.apply(service("default", working, None, edited));
        assert!(
            programmed(&m)
                .iter()
                .all(|p| p.starts_with(&format!("default/{working} "))),
            "{:?}",
            programmed(&m)
        );
        // Deleted and added again, it is the newest.
        m.apply(delete("default", working));
        m.apply(service("default", working, None, spec("10.96.0.40")));
        assert_eq!(
            programmed(&m),
            [format!("default/{newcomer} 10.96.0.40:80 np=30080 hc=-")]
        );
    }
}

#[test]
fn the_next_oldest_takes_over_when_the_owner_goes() {
    let mut m = model(Some(NodePortRange::default()));
    let spec = json!({"type": "NodePort", "clusterIP": "10.96.0.1",
                      "ports": [{"name": "p", "port": 80, "nodePort": 30080}]});
    let mut other = spec.clone();
    other["clusterIP"] = json!("10.96.0.2");
    m.apply(service("ns", "old", OLD, spec.clone()));
    let out = m.apply(service("ns", "new", NEW, spec.clone()));
    assert_eq!(out.warnings.len(), 2, "{:?}", out.warnings);
    assert_eq!(programmed(&m), ["ns/old 10.96.0.1:80 np=30080 hc=-"]);

    // The owner moves to another ClusterIP: the ClusterIP port goes to the loser, the node
    // port stays with the owner.
    let out = m.apply(service("ns", "old", OLD, other.clone()));
    assert!(out.warnings.is_empty(), "{:?}", out.warnings);
    assert_eq!(
        programmed(&m),
        [
            "ns/new 10.96.0.1:80 np=- hc=-",
            "ns/old 10.96.0.2:80 np=30080 hc=-"
        ]
    );

    // The owner goes: the loser gets its node port back.
    let out = m.apply(delete("ns", "old"));
    assert!(out.warnings.is_empty(), "{:?}", out.warnings);
    assert_eq!(programmed(&m), ["ns/new 10.96.0.1:80 np=30080 hc=-"]);

    // An even older Service arrives: it takes both, with a warning for the one that had them.
    let out = m.apply(service(
        "ns",
        "oldest",
        Some("2020-01-01T00:00:00Z"),
        spec.clone(),
    ));
    let warned: Vec<String> = out.warnings.iter().map(|w| w.to_string()).collect();
    assert_eq!(warned.len(), 2, "{warned:?}");
    assert!(
        warned
            .iter()
            .all(|w| w.starts_with("Service ns/new: ") && w.contains("Service ns/oldest's")),
        "{warned:?}"
    );
    assert_eq!(programmed(&m), ["ns/oldest 10.96.0.1:80 np=30080 hc=-"]);
}

#[test]
fn a_relist_resolves_conflicts_as_updates_do() {
    let spec = json!({"type": "NodePort", "clusterIP": "10.96.0.1",
                      "ports": [{"name": "p", "port": 80, "nodePort": 30080}]});
    let objects = |names: &[(&str, Option<&str>)]| -> Vec<Object> {
        names
            .iter()
            .map(
                |(name, created)| match service("ns", name, *created, spec.clone()) {
                    Event::Apply(o) => o,
                    _ => unreachable!("service() builds an Apply"),
                },
            )
            .collect()
    };
    let mut m = model(Some(NodePortRange::default()));
    m.apply(Event::Replace {
        kinds: vec![Kind::Service],
        objects: objects(&[("b", NEW), ("a", OLD)]),
    });
    assert_eq!(programmed(&m), ["ns/a 10.96.0.1:80 np=30080 hc=-"]);
    // A relist without the owner: the other Service takes over.
    m.apply(Event::Replace {
        kinds: vec![Kind::Service],
        objects: objects(&[("b", NEW)]),
    });
    assert_eq!(programmed(&m), ["ns/b 10.96.0.1:80 np=30080 hc=-"]);
}

#[test]
fn a_health_check_node_port_conflicts_with_node_ports_over_tcp_only() {
    let lb = |ip: &str, hc: u16| {
        json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local", "clusterIP": ip,
               "healthCheckNodePort": hc,
               "ports": [{"name": "p", "port": 80, "nodePort": 31000}]})
    };
    let np = |ip: &str, port: u16, protocol: &str| {
        json!({"type": "NodePort", "clusterIP": ip,
               "ports": [{"name": "p", "port": 80, "protocol": protocol, "nodePort": port}]})
    };
    // (older spec, newer spec, programmed, the newer one's warned fields).
    let cases = [
        (
            lb("10.96.0.1", 32000),
            np("10.96.0.2", 32000, "TCP"),
            vec![
                "ns/new 10.96.0.2:80 np=- hc=-",
                "ns/old 10.96.0.1:80 np=31000 hc=32000",
            ],
            vec!["spec.ports[0].nodePort"],
        ),
        (
            np("10.96.0.2", 32000, "TCP"),
            lb("10.96.0.1", 32000),
            vec![
                "ns/new 10.96.0.1:80 np=31000 hc=-",
                "ns/old 10.96.0.2:80 np=32000 hc=-",
            ],
            vec!["spec.healthCheckNodePort"],
        ),
        (
            np("10.96.0.2", 32000, "UDP"),
            lb("10.96.0.1", 32000),
            vec![
                "ns/new 10.96.0.1:80 np=31000 hc=32000",
                "ns/old 10.96.0.2:80 np=32000 hc=-",
            ],
            vec![],
        ),
    ];
    for (i, (older, newer, want, warned)) in cases.into_iter().enumerate() {
        let mut m = model(Some(NodePortRange::default()));
        m.apply(service("ns", "old", OLD, older));
        let out = m.apply(service("ns", "new", NEW, newer));
        assert_eq!(programmed(&m), want, "case {i}");
        let fields: Vec<&str> = out.warnings.iter().map(|w| w.field.as_str()).collect();
        assert_eq!(fields, warned, "case {i}: {:?}", out.warnings);
        if let Some(w) = out.warnings.first() {
            assert!(w.message.contains("Service ns/old's"), "{w}");
        }
    }
}

/// `kpng status NAME` for a Service kpng holds but gives no rule: why, in words.
#[test]
fn a_service_without_rules_says_why() {
    let np = |ip: &str| {
        json!({"type": "NodePort", "clusterIP": ip,
               "ports": [{"name": "p", "port": 80, "nodePort": 30080}]})
    };
    let labelled = |name: &str, label: &str, value: &str| {
        let Event::Apply(Object::Service(mut info)) = service(
            "ns",
            name,
            None,
            json!({"clusterIP": "10.96.0.9", "ports": [{"port": 80}]}),
        ) else {
            unreachable!("service() builds a Service")
        };
        match label {
            "proxy" => info.proxy_name_label = Some(value.into()),
            _ => info.headless_label = true,
        }
        Event::Apply(Object::Service(info))
    };
    let mut m = model(Some(NodePortRange::default()));
    for event in [
        service("ns", "working", None, np("10.96.0.40")),
        service("ns", "copy", None, np("10.96.0.40")),
        service(
            "ns",
            "headless",
            None,
            json!({"clusterIP": "None", "ports": [{"port": 80}]}),
        ),
        service(
            "ns",
            "alias",
            None,
            json!({"type": "ExternalName", "externalName": "db.example.com"}),
        ),
        labelled("other-proxy", "proxy", "cilium"),
        labelled("not-proxied", "headless", ""),
    ] {
        m.apply(event);
    }
    let why = |name: &str| -> Vec<(String, String)> {
        m.not_programmed(&|ns, n| ns == "ns" && n == name)
            .into_iter()
            .map(|(k, w)| (k.to_string(), w))
            .collect()
    };
    for (name, says) in [
        (
            "copy",
            "its frontends are other Services' (ClusterIP 10.96.0.40 port 80/TCP is Service ns/working's, node port 30080/TCP is Service ns/working's)",
        ),
        (
            "headless",
            "no ClusterIP (spec.clusterIP None or empty: headless)",
        ),
        ("alias", "type ExternalName: a DNS alias"),
        (
            "other-proxy",
            "labelled service.kubernetes.io/service-proxy-name=cilium: another proxy's",
        ),
        (
            "not-proxied",
            "labelled service.kubernetes.io/headless: not proxied",
        ),
    ] {
        let got = why(name);
        assert!(
            got.len() == 1 && got[0].0 == format!("ns/{name}") && got[0].1.starts_with(says),
            "{name}: {got:?}"
        );
    }
    assert!(why("working").is_empty(), "programmed: nothing to explain");
    assert!(why("unknown").is_empty(), "not held: nothing to explain");
}

/// An IP two Services name as external or load-balancer IP.
const X: &str = "198.51.100.80";

/// Every programmed Service port as `ns/name cluster_ip:port ext=… lb=… ranges=…`, sorted.
fn programmed_vips(m: &Model) -> Vec<String> {
    let list = |v: Vec<String>| v.join(",");
    m.snapshot()
        .ports
        .values()
        .map(|p| {
            format!(
                "{} {}:{} ext={} lb={} ranges={}",
                p.key.service,
                p.cluster_ip,
                p.port,
                list(p.external_ips.iter().map(|i| i.to_string()).collect()),
                list(p.load_balancer_ips.iter().map(|i| i.to_string()).collect()),
                list(p.source_ranges.iter().map(|r| r.to_string()).collect()),
            )
        })
        .collect()
}

/// An external IP or load-balancer IP + port + protocol is one frontend, whichever field of
/// which Service names it (and a ClusterIP with the same port is the same key of the
/// backends' maps): the oldest Service keeps it whole (its endpoints, its source ranges), the
/// other loses that IP for that port with a warning naming both; a Service naming one IP in
/// two of its own fields conflicts with nobody.
#[test]
fn external_and_load_balancer_ips_go_to_the_oldest_service() {
    /// (namespace/name, creationTimestamp, spec, load-balancer ingress IPs).
    type Svc = (
        &'static str,
        Option<&'static str>,
        Value,
        &'static [&'static str],
    );
    struct Case {
        name: &'static str,
        services: Vec<Svc>,
        programmed: &'static [&'static str],
        /// (loser, owner named in the warning, field).
        warned: &'static [(&'static str, &'static str, &'static str)],
    }
    let lb = |ip: &str, ext: &[&str], ranges: &[&str], port: u16, protocol: &str| {
        json!({"type": "LoadBalancer", "clusterIP": ip, "externalIPs": ext,
               "loadBalancerSourceRanges": ranges, "allocateLoadBalancerNodePorts": false,
               "ports": [{"name": "p", "port": port, "protocol": protocol}]})
    };
    let cip = |ip: &str, ext: &[&str], port: u16, protocol: &str| {
        json!({"clusterIP": ip, "externalIPs": ext,
               "ports": [{"name": "p", "port": port, "protocol": protocol}]})
    };
    let cases = [
        Case {
            name: "the repro: LB IP + external IP vs external IP, one list, by name",
            services: vec![
                (
                    "q/same",
                    None,
                    lb("10.96.11.1", &[X], &["203.0.113.0/24"], 80, "TCP"),
                    &[X],
                ),
                ("q/other", None, cip("10.96.11.2", &[X], 80, "TCP"), &[]),
            ],
            programmed: &[
                "q/other 10.96.11.2:80 ext=198.51.100.80 lb= ranges=",
                "q/same 10.96.11.1:80 ext= lb= ranges=203.0.113.0/24",
            ],
            warned: &[
                ("q/same", "q/other", "spec.externalIPs"),
                ("q/same", "q/other", "status.loadBalancer.ingress"),
            ],
        },
        Case {
            name: "the repro with creation times: the LoadBalancer is older and keeps its firewall",
            services: vec![
                (
                    "q/same",
                    OLD,
                    lb("10.96.11.1", &[X], &["203.0.113.0/24"], 80, "TCP"),
                    &[X],
                ),
                ("q/other", NEW, cip("10.96.11.2", &[X], 80, "TCP"), &[]),
            ],
            programmed: &[
                "q/other 10.96.11.2:80 ext= lb= ranges=",
                "q/same 10.96.11.1:80 ext=198.51.100.80 lb=198.51.100.80 ranges=203.0.113.0/24",
            ],
            warned: &[("q/other", "q/same", "spec.externalIPs")],
        },
        Case {
            name: "one's external IP is the other's LB IP",
            services: vec![
                (
                    "a/lb",
                    NEW,
                    lb("10.96.0.1", &[], &["203.0.113.0/24"], 80, "TCP"),
                    &[X],
                ),
                (
                    "a/ext",
                    OLD,
                    cip("10.96.0.2", &[X, "198.51.100.81"], 80, "TCP"),
                    &[],
                ),
            ],
            programmed: &[
                "a/ext 10.96.0.2:80 ext=198.51.100.80,198.51.100.81 lb= ranges=",
                "a/lb 10.96.0.1:80 ext= lb= ranges=203.0.113.0/24",
            ],
            warned: &[("a/lb", "a/ext", "status.loadBalancer.ingress")],
        },
        Case {
            name: "another port or protocol: no conflict",
            services: vec![
                ("a/x", NEW, cip("10.96.0.1", &[X], 80, "TCP"), &[]),
                ("a/y", OLD, cip("10.96.0.2", &[X], 81, "TCP"), &[]),
                ("a/z", OLD, cip("10.96.0.3", &[X], 80, "UDP"), &[]),
            ],
            programmed: &[
                "a/x 10.96.0.1:80 ext=198.51.100.80 lb= ranges=",
                "a/y 10.96.0.2:81 ext=198.51.100.80 lb= ranges=",
                "a/z 10.96.0.3:80 ext=198.51.100.80 lb= ranges=",
            ],
            warned: &[],
        },
        Case {
            name: "one Service naming one IP as external and LB IP: no conflict",
            services: vec![(
                "a/both",
                None,
                lb("10.96.0.1", &[X], &["203.0.113.0/24"], 80, "TCP"),
                &[X],
            )],
            programmed: &[
                "a/both 10.96.0.1:80 ext=198.51.100.80 lb=198.51.100.80 ranges=203.0.113.0/24",
            ],
            warned: &[],
        },
        Case {
            name: "an external IP that is an older Service's ClusterIP",
            services: vec![
                (
                    "a/hijack",
                    NEW,
                    cip("10.96.0.2", &["10.96.0.1"], 80, "TCP"),
                    &[],
                ),
                ("a/dns", OLD, cip("10.96.0.1", &[], 80, "TCP"), &[]),
            ],
            programmed: &[
                "a/dns 10.96.0.1:80 ext= lb= ranges=",
                "a/hijack 10.96.0.2:80 ext= lb= ranges=",
            ],
            warned: &[("a/hijack", "a/dns", "spec.externalIPs")],
        },
        Case {
            name: "an older Service's external IP never takes a newer Service's ClusterIP (the audit's repro)",
            services: vec![
                (
                    "tenant-b/evil",
                    OLD,
                    cip("10.96.0.20", &["10.96.0.1"], 443, "TCP"),
                    &[],
                ),
                (
                    "default/kubernetes",
                    NEW,
                    cip("10.96.0.1", &[], 443, "TCP"),
                    &[],
                ),
            ],
            programmed: &[
                "default/kubernetes 10.96.0.1:443 ext= lb= ranges=",
                "tenant-b/evil 10.96.0.20:443 ext= lb= ranges=",
            ],
            warned: &[("tenant-b/evil", "default/kubernetes", "spec.externalIPs")],
        },
        Case {
            name: "an older Service's load-balancer IP never takes a newer (or undated) Service's ClusterIP",
            services: vec![
                (
                    "t/lb",
                    OLD,
                    lb("10.96.0.30", &[], &[], 443, "TCP"),
                    &["10.96.0.1"],
                ),
                (
                    "default/kubernetes",
                    None,
                    cip("10.96.0.1", &[], 443, "TCP"),
                    &[],
                ),
            ],
            programmed: &[
                "default/kubernetes 10.96.0.1:443 ext= lb= ranges=",
                "t/lb 10.96.0.30:443 ext= lb= ranges=",
            ],
            warned: &[("t/lb", "default/kubernetes", "status.loadBalancer.ingress")],
        },
        Case {
            name: "two ClusterIPs: the older keeps it, external IPs of it count for neither",
            services: vec![
                (
                    "a/ext",
                    OLD,
                    cip("10.96.0.9", &["10.96.0.1"], 80, "TCP"),
                    &[],
                ),
                ("a/mid", MID, cip("10.96.0.1", &[], 80, "TCP"), &[]),
                ("a/new", NEW, cip("10.96.0.1", &[], 80, "TCP"), &[]),
            ],
            programmed: &[
                "a/ext 10.96.0.9:80 ext= lb= ranges=",
                "a/mid 10.96.0.1:80 ext= lb= ranges=",
            ],
            warned: &[
                ("a/ext", "a/mid", "spec.externalIPs"),
                ("a/new", "a/mid", "spec.ports[0].port"),
            ],
        },
        Case {
            name: "an IPv6 external IP of an IPv4-only Service is never programmed: no claim",
            services: vec![
                (
                    "a/v4",
                    OLD,
                    cip("10.96.0.1", &["2001:db8::80"], 80, "TCP"),
                    &[],
                ),
                (
                    "a/v6",
                    NEW,
                    cip("fd00:96::1", &["2001:db8::80"], 80, "TCP"),
                    &[],
                ),
            ],
            programmed: &[
                "a/v4 10.96.0.1:80 ext= lb= ranges=",
                "a/v6 fd00:96::1:80 ext=2001:db8::80 lb= ranges=",
            ],
            warned: &[],
        },
    ];
    for case in cases {
        let event = |(key, created, spec, ingress): &Svc| -> Object {
            let (ns, name) = key.split_once('/').expect("ns/name");
            let mut metadata = json!({"namespace": ns, "name": name});
            if let Some(at) = created {
                metadata["creationTimestamp"] = json!(at);
            }
            let ingress: Vec<Value> = ingress.iter().map(|ip| json!({"ip": ip})).collect();
            let svc = from_json::<Service>(json!({"metadata": metadata, "spec": spec,
                "status": {"loadBalancer": {"ingress": ingress}}}))
            .expect("valid Service JSON");
            assert!(svc.warnings.is_empty(), "{:?}", svc.warnings);
            svc.object
        };
        for order in ["forward", "backward"] {
            let mut objects: Vec<Object> = case.services.iter().map(event).collect();
            if order == "backward" {
                objects.reverse();
            }
            let mut m = model(Some(NodePortRange::default()));
            let kinds = vec![Kind::Service];
            m.apply(Event::ListStart {
                kinds: kinds.clone(),
            });
            let mut warnings = Vec::new();
            for o in objects {
                warnings.extend(m.apply(Event::ListItem(o)).warnings);
            }
            warnings.extend(m.apply(Event::ListDone { kinds }).warnings);
            assert_eq!(
                programmed_vips(&m),
                case.programmed,
                "{} ({order})",
                case.name
            );
            let mut got: Vec<(String, String)> = warnings
                .iter()
                .map(|w| {
                    let loser = format!("{}/{}", w.object.namespace, w.object.name);
                    let owner = case
                        .warned
                        .iter()
                        .find(|(l, _, f)| *l == loser && *f == w.field)
                        .map_or("?", |(_, owner, _)| owner);
                    assert!(
                        w.message.contains(&format!("is also Service {owner}'s")),
                        "{}: {w}",
                        case.name
                    );
                    (loser, w.field.clone())
                })
                .collect();
            got.sort();
            got.dedup();
            let mut want: Vec<(String, String)> = case
                .warned
                .iter()
                .map(|(loser, _, field)| (loser.to_string(), field.to_string()))
                .collect();
            want.sort();
            assert_eq!(got, want, "{} ({order})", case.name);
        }
    }
}

/// When the Service that keeps an external IP goes, the one that lost it takes it over, with
/// its own source ranges; an older Service arriving takes it back with a warning.
#[test]
fn an_external_ip_passes_to_the_next_oldest_service() {
    let lb = json!({"type": "LoadBalancer", "clusterIP": "10.96.11.1", "externalIPs": [X],
                    "loadBalancerSourceRanges": ["203.0.113.0/24"],
                    "allocateLoadBalancerNodePorts": false,
                    "ports": [{"name": "p", "port": 80}]});
    let mut m = model(None);
    m.apply(service(
        "q",
        "other",
        OLD,
        json!({"clusterIP": "10.96.11.2", "externalIPs": [X], "ports": [{"name": "p", "port": 80}]}),
    ));
    let out = m.apply(service("q", "same", NEW, lb));
    let warned: Vec<String> = out.warnings.iter().map(|w| w.to_string()).collect();
    assert_eq!(
        warned,
        [
            "Service q/same: field spec.externalIPs: 198.51.100.80 port 80/TCP is also Service q/other's, which is older (created earlier; without creation times, known to kpng first, then first by namespace/name) and keeps it, with its endpoints and source ranges; 198.51.100.80 is not programmed for this Service port (ignored)"
        ]
    );
    assert_eq!(
        programmed_vips(&m),
        [
            "q/other 10.96.11.2:80 ext=198.51.100.80 lb= ranges=",
            "q/same 10.96.11.1:80 ext= lb= ranges=203.0.113.0/24",
        ]
    );
    let out = m.apply(delete("q", "other"));
    assert!(out.warnings.is_empty(), "{:?}", out.warnings);
    assert_eq!(
        programmed_vips(&m),
        ["q/same 10.96.11.1:80 ext=198.51.100.80 lb= ranges=203.0.113.0/24"]
    );
}

/// The audit's repro, as it happens in a cluster: a tenant's Service (created 2020) names
/// 10.96.0.1 in `spec.externalIPs`; `default/kubernetes` (created 2024) gets that ClusterIP.
/// The ClusterIP wins whatever the ages, with a warning on the tenant's Service naming both
/// and the field; the tenant's external IP comes back only when the ClusterIP is gone.
#[test]
fn an_external_ip_never_takes_a_cluster_ip_whatever_the_ages() {
    let mut m = model(None);
    let out = m.apply(service(
        "tenant-b",
        "evil",
        Some("2020-01-01T00:00:00Z"),
        json!({"clusterIP": "10.96.0.20", "externalIPs": ["10.96.0.1"],
               "ports": [{"name": "q", "port": 443}]}),
    ));
    assert!(out.warnings.is_empty(), "{:?}", out.warnings);
    let out = m.apply(service(
        "default",
        "kubernetes",
        Some("2024-01-01T00:00:00Z"),
        json!({"clusterIP": "10.96.0.1", "ports": [{"name": "https", "port": 443}]}),
    ));
    let warned: Vec<String> = out.warnings.iter().map(|w| w.to_string()).collect();
    assert_eq!(
        warned,
        [
            "Service tenant-b/evil: field spec.externalIPs: 10.96.0.1 port 443/TCP is also Service default/kubernetes's, as its ClusterIP, which keeps it whatever the Services' ages (the API server allocates a ClusterIP to one Service; an external or load-balancer IP naming it never takes it over); 10.96.0.1 is not programmed for this Service port (ignored)"
        ]
    );
    assert_eq!(
        programmed_vips(&m),
        [
            "default/kubernetes 10.96.0.1:443 ext= lb= ranges=",
            "tenant-b/evil 10.96.0.20:443 ext= lb= ranges=",
        ]
    );
    let out = m.apply(delete("default", "kubernetes"));
    assert!(out.warnings.is_empty(), "{:?}", out.warnings);
    assert_eq!(
        programmed_vips(&m),
        ["tenant-b/evil 10.96.0.20:443 ext=10.96.0.1 lb= ranges="]
    );
}

/// An external IP inside `--service-cidr` or a ServiceCIDR object names a ClusterIP the API
/// server allocates: warned about once per Service change (and once when a new range takes
/// it in), naming the Service, the field, the IP and the range; still programmed, as
/// kube-proxy does, when no ClusterIP of that port takes it.
#[test]
fn external_ips_inside_a_service_cidr_are_warned_about() {
    use k8s_openapi::api::networking::v1::ServiceCIDR;
    let mut m = Model::new(ModelConfig {
        node_name: "node-a".into(),
        service_cidrs: vec!["10.96.0.0/12".parse().expect("cidr")],
        ..ModelConfig::default()
    });
    let spec = json!({"clusterIP": "10.96.0.20",
                      "externalIPs": ["10.96.0.1", "198.51.100.1", "10.200.0.5"],
                      "ports": [{"name": "q", "port": 443}]});
    let out = m.apply(service("t", "evil", OLD, spec.clone()));
    let warned: Vec<String> = out.warnings.iter().map(|w| w.to_string()).collect();
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0].starts_with(
            "Service t/evil: field spec.externalIPs: 10.96.0.1 (in 10.96.0.0/12) inside the Service CIDRs"
        ),
        "{warned:?}"
    );
    assert!(warned[0].contains("DenyServiceExternalIPs"), "{warned:?}");
    // The same Service again: nothing new to say.
    assert!(m.apply(service("t", "evil", OLD, spec)).warnings.is_empty());
    // A ServiceCIDR object taking in another of its external IPs: that one only, once.
    let cidr = || {
        let object = from_json::<ServiceCIDR>(
            json!({"metadata": {"name": "extra"}, "spec": {"cidrs": ["10.200.0.0/16"]}}),
        )
        .expect("valid ServiceCIDR JSON");
        Event::Apply(object.object)
    };
    let warned: Vec<String> = m
        .apply(cidr())
        .warnings
        .iter()
        .map(|w| w.to_string())
        .collect();
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0].starts_with(
            "Service t/evil: field spec.externalIPs: 10.200.0.5 (in 10.200.0.0/16) inside"
        ),
        "{warned:?}"
    );
    assert!(m.apply(cidr()).warnings.is_empty());
    assert_eq!(
        programmed_vips(&m),
        ["t/evil 10.96.0.20:443 ext=10.96.0.1,10.200.0.5,198.51.100.1 lb= ranges="]
    );
}

/// kube-proxy applies `loadBalancerSourceRanges` per family: an IPv4 LoadBalancer whose ranges
/// are all IPv6 accepts every IPv4 source. kpng does the same, but warns, naming the Service,
/// the field and the open family, and tells `kpng status` / `kpng trace` which ranges did
/// not apply.
#[test]
fn source_ranges_of_another_family_only_are_warned_about() {
    let lb = |cluster_ips: &[&str], ranges: &[&str], ingress: &[&str]| {
        let ingress: Vec<Value> = ingress.iter().map(|ip| json!({"ip": ip})).collect();
        let svc = from_json::<Service>(json!({
            "metadata": {"namespace": "t", "name": "lb2"},
            "spec": {"type": "LoadBalancer", "clusterIP": cluster_ips[0], "clusterIPs": cluster_ips,
                     "allocateLoadBalancerNodePorts": false,
                     "loadBalancerSourceRanges": ranges,
                     "ports": [{"name": "http", "port": 80}]},
            "status": {"loadBalancer": {"ingress": ingress}}}))
        .expect("valid Service JSON");
        Event::Apply(svc.object)
    };
    struct Case {
        name: &'static str,
        cluster_ips: &'static [&'static str],
        ranges: &'static [&'static str],
        ingress: &'static [&'static str],
        warned: &'static [&'static str],
        /// Per programmed port (family order): the ranges that do not apply to it.
        open: &'static [&'static str],
    }
    let cases = [
        Case {
            name: "the repro: an IPv4 LoadBalancer with fd00::/8 only",
            cluster_ips: &["10.96.0.42"],
            ranges: &["fd00::/8"],
            ingress: &["203.0.113.42"],
            warned: &[
                "Service t/lb2: field spec.loadBalancerSourceRanges: no IPv4 range (fd00::/8): the IPv4 load-balancer IPs (203.0.113.42) accept every source, as with kube-proxy, which applies the ranges per family; add IPv4 ranges to restrict them (ignored)",
            ],
            open: &["fd00::/8"],
        },
        Case {
            name: "an IPv4 range: nothing to say",
            cluster_ips: &["10.96.0.42"],
            ranges: &["fd00::/8", "198.51.100.0/24"],
            ingress: &["203.0.113.42"],
            warned: &[],
            open: &[""],
        },
        Case {
            name: "no range at all: open as the user asked",
            cluster_ips: &["10.96.0.42"],
            ranges: &[],
            ingress: &["203.0.113.42"],
            warned: &[],
            open: &[""],
        },
        Case {
            name: "no load-balancer IP yet: nothing open",
            cluster_ips: &["10.96.0.42"],
            ranges: &["fd00::/8"],
            ingress: &[],
            warned: &[],
            open: &[""],
        },
        Case {
            name: "dual-stack, IPv4 ranges only: IPv6 is open",
            cluster_ips: &["10.96.0.42", "fd00:96::42"],
            ranges: &["198.51.100.0/24"],
            ingress: &["203.0.113.42", "2001:db8::42"],
            warned: &[
                "Service t/lb2: field spec.loadBalancerSourceRanges: no IPv6 range (198.51.100.0/24): the IPv6 load-balancer IPs (2001:db8::42) accept every source, as with kube-proxy, which applies the ranges per family; add IPv6 ranges to restrict them (ignored)",
            ],
            open: &["", "198.51.100.0/24"],
        },
    ];
    for case in cases {
        let mut m = model(None);
        let out = m.apply(lb(case.cluster_ips, case.ranges, case.ingress));
        let warned: Vec<String> = out.warnings.iter().map(|w| w.to_string()).collect();
        assert_eq!(warned, case.warned, "{}", case.name);
        let open: Vec<String> = m
            .snapshot()
            .ports
            .keys()
            .map(|k| {
                m.source_ranges_of_other_families_only(k)
                    .iter()
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect();
        assert_eq!(open, case.open, "{}", case.name);
    }
}

/// A frontend a Service lost to another one is one of its dropped values, naming the field,
/// the value and the Service that keeps it, for as long as it is lost: a tenant whose
/// external IP or node port another tenant's Service holds sees why in `kpng status`, not
/// only in a warning that scrolls away. Each change moves `dropped_changes` (the brain sends
/// its report again).
#[test]
fn lost_frontends_are_dropped_values_while_they_last() {
    let web = || {
        service(
            "tenant-b",
            "web",
            OLD,
            json!({"type": "NodePort", "clusterIP": "10.96.2.10",
                   "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}),
        )
    };
    let evil = || {
        service(
            "tenant-a",
            "evil",
            NEW,
            json!({"clusterIP": "10.96.1.5", "externalIPs": ["10.96.2.10"],
                   "ports": [{"name": "http", "port": 80}]}),
        )
    };
    let npdup = || {
        service(
            "tenant-c",
            "npdup",
            NEW,
            json!({"type": "NodePort", "clusterIP": "10.96.3.5",
                   "ports": [{"name": "http", "port": 8080, "nodePort": 30080}]}),
        )
    };
    const EVIL: &str = "Service tenant-a/evil: field spec.externalIPs: 10.96.2.10 port 80/TCP is also Service tenant-b/web's, as its ClusterIP, which keeps it whatever the Services' ages (the API server allocates a ClusterIP to one Service; an external or load-balancer IP naming it never takes it over); 10.96.2.10 is not programmed for this Service port (ignored)";
    const NPDUP: &str = "Service tenant-c/npdup: field spec.ports[0].nodePort: node port 30080/TCP is also Service tenant-b/web's, which is older (created earlier; without creation times, known to kpng first, then first by namespace/name) and keeps it; the node port is not programmed (ignored)";
    struct Case {
        name: &'static str,
        events: Vec<Event>,
        dropped: &'static [&'static str],
    }
    let cases = [
        Case {
            name: "an external IP that is another Service's ClusterIP",
            events: vec![web(), evil()],
            dropped: &[EVIL],
        },
        Case {
            name: "the loser arriving first loses it all the same",
            events: vec![evil(), npdup(), web()],
            dropped: &[EVIL, NPDUP],
        },
        Case {
            name: "a node port another Service holds",
            events: vec![web(), npdup()],
            dropped: &[NPDUP],
        },
        Case {
            name: "the owner gone: nothing lost any more",
            events: vec![web(), evil(), npdup(), delete("tenant-b", "web")],
            dropped: &[],
        },
        Case {
            name: "the loser gone",
            events: vec![web(), evil(), delete("tenant-a", "evil")],
            dropped: &[],
        },
        Case {
            name: "the loser fixed",
            events: vec![
                web(),
                evil(),
                service(
                    "tenant-a",
                    "evil",
                    NEW,
                    json!({"clusterIP": "10.96.1.5", "ports": [{"name": "http", "port": 80}]}),
                ),
            ],
            dropped: &[],
        },
    ];
    for case in cases {
        let mut m = ClusterModel::new(ClusterConfig::default());
        let mut changes = m.dropped_changes();
        let mut before: Vec<String> = Vec::new();
        for event in case.events {
            m.apply(event);
            let now: Vec<String> = m.dropped().map(|(_, w)| w.to_string()).collect();
            if now != before {
                assert!(m.dropped_changes() > changes, "{}: {now:?}", case.name);
            }
            changes = m.dropped_changes();
            before = now;
        }
        assert_eq!(before, case.dropped, "{}", case.name);
    }
}
