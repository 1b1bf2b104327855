//! A Service's cluster IPs per family, as kube-proxy's `GetClusterIPByFamily` picks them from
//! `spec.ipFamilies`, and the inconsistent objects the API server refuses.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use kpng_model::Object;
use serde_json::{Value, json};

use crate::from_json;

/// The Service's cluster IPs, or the rejected field and message.
type Outcome = Result<Vec<IpAddr>, (String, String)>;

/// The Service's [`Outcome`], and its warnings' fields.
fn convert(spec: Value) -> (Outcome, Vec<String>) {
    let mut spec = spec;
    spec["ports"] = json!([{"name": "http", "port": 80, "protocol": "TCP"}]);
    let converted = from_json::<Service>(json!({
        "metadata": {"namespace": "default", "name": "svc"},
        "spec": spec,
    }))
    .expect("valid Service JSON");
    let warnings = converted.warnings.iter().map(|w| w.field.clone()).collect();
    let result = match converted.object {
        Object::Service(info) => Ok(info.cluster_ips.clone()),
        Object::Rejected(e) => {
            assert_eq!(&*e.object.name, "svc", "the error names the object");
            Err((e.field, e.message))
        }
        other => panic!("unexpected {other:?}"),
    };
    (result, warnings)
}

fn ips(list: &[&str]) -> Vec<IpAddr> {
    list.iter().map(|s| s.parse().expect("ip")).collect()
}

#[test]
fn each_family_s_cluster_ip_is_picked_by_ip_families() {
    let (v4, v6) = ("10.96.45.22", "fd45:96::22");
    // (case, spec, the cluster IPs used, the fields warned about)
    let cases: Vec<(&str, Value, Vec<IpAddr>, Vec<&str>)> = vec![
        (
            "no ipFamilies: every clusterIP (an old object)",
            json!({"clusterIP": v4, "clusterIPs": [v4, v6]}),
            ips(&[v4, v6]),
            vec![],
        ),
        (
            "no clusterIPs, no ipFamilies: clusterIP",
            json!({"clusterIP": v6}),
            ips(&[v6]),
            vec![],
        ),
        (
            "dual-stack",
            json!({"clusterIP": v4, "clusterIPs": [v4, v6], "ipFamilies": ["IPv4", "IPv6"]}),
            ips(&[v4, v6]),
            vec![],
        ),
        (
            "IPv6 primary",
            json!({"clusterIP": v6, "clusterIPs": [v6, v4], "ipFamilies": ["IPv6", "IPv4"]}),
            ips(&[v6, v4]),
            vec![],
        ),
        (
            "ipFamilies [IPv4] with two clusterIPs: no IPv6 frontend, as kube-proxy",
            json!({"clusterIP": v4, "clusterIPs": [v4, v6], "ipFamilies": ["IPv4"]}),
            ips(&[v4]),
            vec!["spec.clusterIPs[1]"],
        ),
        (
            "single-stack IPv6",
            json!({"clusterIP": v6, "clusterIPs": [v6], "ipFamilies": ["IPv6"]}),
            ips(&[v6]),
            vec![],
        ),
        (
            "an empty ipFamilies is as none",
            json!({"clusterIP": v4, "clusterIPs": [v4], "ipFamilies": []}),
            ips(&[v4]),
            vec![],
        ),
    ];
    for (case, spec, want, warned) in cases {
        let (got, warnings) = convert(spec);
        assert_eq!(got, Ok(want), "{case}");
        assert_eq!(warnings, warned, "{case}");
    }
}

#[test]
fn ip_families_the_api_server_refuses_are_rejected_naming_the_field() {
    let (v4, v6) = ("10.96.45.21", "fd45:96::21");
    // (case, spec, the field, words the message has)
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        (
            "more families than cluster IPs",
            json!({"clusterIP": v4, "clusterIPs": [v4], "ipFamilies": ["IPv4", "IPv6"]}),
            "spec.ipFamilies[1]",
            "IPv6 has no cluster IP: spec.clusterIPs has 1 entry",
        ),
        (
            "the order disagrees",
            json!({"clusterIP": v4, "clusterIPs": [v4, v6], "ipFamilies": ["IPv6", "IPv4"]}),
            "spec.clusterIPs[0]",
            "10.96.45.21 is not an IPv6 address, as spec.ipFamilies[0] says",
        ),
        (
            "a single IP of the other family",
            json!({"clusterIP": v6, "clusterIPs": [v6], "ipFamilies": ["IPv4"]}),
            "spec.clusterIPs[0]",
            "is not an IPv4 address",
        ),
        (
            "clusterIP is not clusterIPs[0]",
            json!({"clusterIP": v4, "clusterIPs": [v6, v4]}),
            "spec.clusterIP",
            "\"10.96.45.21\" is not spec.clusterIPs[0] (\"fd45:96::21\")",
        ),
        (
            "an unknown family",
            json!({"clusterIP": v4, "clusterIPs": [v4], "ipFamilies": ["ipv4"]}),
            "spec.ipFamilies[0]",
            "\"ipv4\" is not IPv4 or IPv6",
        ),
        (
            "a family named twice",
            json!({"clusterIP": v4, "clusterIPs": [v4, v6], "ipFamilies": ["IPv4", "IPv4"]}),
            "spec.ipFamilies[1]",
            "IPv4 is named twice",
        ),
    ];
    for (case, spec, field, words) in cases {
        let (got, _) = convert(spec);
        let (got_field, message) = got.expect_err(case);
        assert_eq!(got_field, field, "{case}: {message}");
        assert!(message.contains(words), "{case}: {message}");
    }
}
