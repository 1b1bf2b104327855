//! Cluster-layer tests: one state serves every node; views that do not depend on the node are
//! exactly the anonymous node's view.

use serde_json::{Value, json};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kpng_k8s::from_json;
use kpng_model::*;

fn object(kind: &str, value: Value) -> Object {
    let converted = match kind {
        "Service" => from_json::<Service>(value),
        "Node" => from_json::<Node>(value),
        "ServiceCIDR" => from_json::<ServiceCIDR>(value),
        _ => from_json::<EndpointSlice>(value),
    };
    converted.expect("valid JSON").object
}

fn svc(name: &str, extra: Value) -> Event {
    let mut spec = json!({"clusterIP": "10.96.0.10", "ports": [{"name": "p", "port": 80}]});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    Event::Apply(object(
        "Service",
        json!({"metadata": {"namespace": "ns", "name": name}, "spec": spec}),
    ))
}

/// An endpoint: (ip, node, zone hint).
type Ep<'a> = (&'a str, &'a str, Option<&'a str>);

/// A slice of `svc` with these endpoints.
fn slice(svc: &str, eps: &[Ep<'_>]) -> Event {
    Event::Apply(object(
        "EndpointSlice",
        json!({
            "metadata": {"namespace": "ns", "name": format!("{svc}-1"),
                         "labels": {"kubernetes.io/service-name": svc}},
            "addressType": "IPv4",
            "ports": [{"name": "p", "port": 8080}],
            "endpoints": eps.iter().map(|(ip, node, zone)| {
                let mut e = json!({"addresses": [ip], "nodeName": node});
                if let Some(z) = zone {
                    e["hints"] = json!({"forZones": [{"name": z}]});
                }
                e
            }).collect::<Vec<_>>()
        }),
    ))
}

fn node_named(name: &str, zone: &str) -> NodeState {
    NodeState {
        name: name.into(),
        known: true,
        zone: Some(zone.into()),
        ..NodeState::default()
    }
}

#[test]
fn views_depend_on_the_node_only_through_locality_and_hints() {
    // (case, endpoints, node, depends on the node)
    let cases: &[(&str, &[Ep<'_>], &str, bool)] = &[
        (
            "remote endpoints only",
            &[("10.0.0.1", "n1", None), ("10.0.0.2", "n2", None)],
            "n3",
            false,
        ),
        (
            "an endpoint on the node",
            &[("10.0.0.1", "n1", None), ("10.0.0.2", "n3", None)],
            "n3",
            true,
        ),
        (
            "zone hints",
            &[("10.0.0.1", "n1", Some("a")), ("10.0.0.2", "n2", Some("b"))],
            "n3",
            true,
        ),
        ("no endpoints", &[], "n3", false),
    ];
    for (case, eps, node, depends) in cases {
        let mut cluster = ClusterModel::new(ClusterConfig::default());
        cluster.apply(svc(
            "web",
            json!({"type": "NodePort", "externalTrafficPolicy": "Local",
            "ports": [{"name": "p", "port": 80, "nodePort": 30080}]}),
        ));
        cluster.apply(slice("web", eps));
        let source = cluster
            .source(&ServiceKey::new("ns", "web"))
            .expect("source");
        assert_eq!(source.depends_on_node(node), *depends, "{case}");
        let mine = source.ports_for(&node_named(node, "b"));
        let anonymous = source.ports_for(&NodeState::default());
        if !depends {
            assert_eq!(
                mine, anonymous,
                "{case}: an independent view is the anonymous one"
            );
        }
        assert_eq!(mine.len(), 1, "{case}");
    }
}

#[test]
fn one_cluster_serves_every_node_and_reports_what_it_touched() {
    let mut cluster = ClusterModel::new(ClusterConfig::default());
    let out = cluster.apply(svc("web", json!({})));
    assert_eq!(out.services.len(), 1);
    cluster.apply(slice(
        "web",
        &[("10.0.0.1", "n1", None), ("10.0.0.2", "n2", None)],
    ));
    let source = cluster
        .source(&ServiceKey::new("ns", "web"))
        .expect("source")
        .clone();
    for (node, local) in [("n1", "10.0.0.1"), ("n2", "10.0.0.2")] {
        let ports = source.ports_for(&node_named(node, "a"));
        let locals: Vec<String> = ports[0]
            .cluster_endpoints
            .iter()
            .filter(|e| e.is_local)
            .map(|e| e.ip.to_string())
            .collect();
        assert_eq!(locals, [local], "node {node}");
    }
    // Nodes are all kept; touching one reports it.
    let out = cluster.apply(Event::Apply(object(
        "Node",
        json!({"metadata": {"name": "n2"}}),
    )));
    assert_eq!(out.nodes.into_iter().collect::<Vec<_>>(), ["n2"]);
    assert!(cluster.node("n2").is_some());
    // Copy-on-write: the old version held above is unchanged by a later change.
    cluster.apply(slice("web", &[("10.0.0.9", "n1", None)]));
    assert_eq!(
        source.ports_for(&NodeState::default())[0]
            .cluster_endpoints
            .len(),
        2
    );
    let now = cluster
        .source(&ServiceKey::new("ns", "web"))
        .expect("source");
    assert_eq!(
        now.ports_for(&NodeState::default())[0]
            .cluster_endpoints
            .len(),
        1
    );
    // Deleting the Service and its slice forgets it.
    cluster.apply(Event::Delete(ObjectRef {
        kind: Kind::Service,
        namespace: "ns".into(),
        name: "web".into(),
    }));
    let out = cluster.apply(Event::Delete(ObjectRef {
        kind: Kind::EndpointSlice,
        namespace: "ns".into(),
        name: "web-1".into(),
    }));
    assert_eq!(out.services.len(), 1);
    assert!(cluster.source(&ServiceKey::new("ns", "web")).is_none());
}

#[test]
fn a_complete_list_reports_its_kinds_and_removes_missing_nodes() {
    let mut cluster = ClusterModel::new(ClusterConfig::default());
    cluster.apply(Event::Apply(object(
        "Node",
        json!({"metadata": {"name": "gone"}}),
    )));
    let out = cluster.apply(Event::Replace {
        kinds: vec![Kind::Node],
        objects: vec![object("Node", json!({"metadata": {"name": "kept"}}))],
    });
    assert_eq!(out.listed, [Kind::Node]);
    assert!(out.nodes.contains("gone") && out.nodes.contains("kept"));
    assert!(cluster.node("gone").is_none());
}

#[test]
fn interleaved_lists_of_every_node_end_separately_with_their_counters() {
    // A brain (no `only_node`) fed by the kube source: one list per kind, interleaved.
    let mut cluster = ClusterModel::new(ClusterConfig::default());
    for kinds in [
        vec![Kind::Service],
        vec![Kind::EndpointSlice],
        vec![Kind::ServiceCidr],
    ] {
        assert!(cluster.apply(Event::ListStart { kinds }).listed.is_empty());
    }
    let items = [
        svc("web", json!({})),
        slice("web", &[("10.0.0.1", "n1", None), ("10.0.0.2", "n2", None)]),
        Event::Apply(object(
            "ServiceCIDR",
            json!({"metadata": {"name": "kubernetes"}, "spec": {"cidrs": ["10.96.0.0/16"]}}),
        )),
    ];
    for item in items {
        let Event::Apply(object) = item else {
            unreachable!()
        };
        let out = cluster.apply(Event::ListItem(object));
        assert!(
            out.services.is_empty() && !out.service_cidrs_changed,
            "reported at ListDone"
        );
    }
    let done = cluster.apply(Event::ListDone {
        kinds: vec![Kind::EndpointSlice],
    });
    assert_eq!(done.listed, [Kind::EndpointSlice]);
    assert_eq!(done.services.len(), 1);
    assert!(!done.service_cidrs_changed);
    let done = cluster.apply(Event::ListDone {
        kinds: vec![Kind::ServiceCidr],
    });
    assert!(done.service_cidrs_changed);
    assert_eq!(
        cluster.service_cidrs(),
        ["10.96.0.0/16".parse::<ipnet::IpNet>().expect("net")]
    );
    // Slices keep every node name (a brain serves all of them).
    let source = cluster.source(&ServiceKey::new("ns", "web")).expect("web");
    assert!(source.depends_on_node("n2"));

    // Counters: a changed Service and a changed slice; an unchanged one counts nothing.
    let out = cluster.apply(svc("web", json!({"clusterIP": "10.96.0.11"})));
    assert_eq!(out.services_changed, [ServiceKey::new("ns", "web")]);
    let out = cluster.apply(slice("web", &[("10.0.0.1", "n1", None)]));
    assert_eq!(out.slices_changed, 1);
    let out = cluster.apply(slice("web", &[("10.0.0.1", "n1", None)]));
    assert_eq!((out.slices_changed, out.services_changed.len()), (0, 0));
}

/// The objects of `events` (each an `Apply`), for an [`Event::Changes`].
fn applied(events: Vec<Event>) -> Vec<Object> {
    events
        .into_iter()
        .map(|e| match e {
            Event::Apply(o) => o,
            other => panic!("an Apply, not {other:?}"),
        })
        .collect()
}

#[test]
fn changes_applied_together_touch_every_service_they_concern() {
    let mut cluster = ClusterModel::new(ClusterConfig::default());
    let ip = |ip: &str| json!({"clusterIP": ip});
    // One file with two Services and a slice: the outcome names both Services.
    let out = cluster.apply(Event::Changes {
        deleted: Vec::new(),
        applied: applied(vec![
            svc("a1", ip("10.96.0.11")),
            slice("a1", &[("10.244.1.1", "n1", None)]),
            svc("a2", ip("10.96.0.12")),
        ]),
    });
    let names = |out: &ClusterOutcome| -> Vec<String> {
        out.services.iter().map(|k| k.name.to_string()).collect()
    };
    assert_eq!(names(&out), ["a1", "a2"]);
    // The file rewritten: a1 edited, a2 gone, a3 new; every one of them is touched.
    let out = cluster.apply(Event::Changes {
        deleted: vec![ObjectRef {
            kind: Kind::Service,
            namespace: "ns".into(),
            name: "a2".into(),
        }],
        applied: applied(vec![
            svc(
                "a1",
                json!({"clusterIP": "10.96.0.11", "ports": [{"name": "p", "port": 81}]}),
            ),
            svc("a3", ip("10.96.0.13")),
        ]),
    });
    assert_eq!(names(&out), ["a1", "a2", "a3"]);
    assert!(cluster.source(&ServiceKey::new("ns", "a2")).is_none());
}
