#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::net::IpAddr;

use kpng_model::{Protocol, SessionAffinity};

use super::*;
use crate::testutil::{endpoint, service_port};

fn port(internal_local: bool, external_local: bool, with_local: bool) -> ServicePort {
    let mut eps = vec![endpoint("10.244.2.2", false)];
    if with_local {
        eps.push(endpoint("10.244.1.2", true));
        eps.push(endpoint("10.244.1.3", true));
    }
    let mut sp = service_port("web", Protocol::Tcp, "10.96.0.1", &eps);
    sp.node_port = Some(30080);
    sp.internal_policy_local = internal_local;
    sp.external_policy_local = external_local;
    sp
}

fn addr(s: &str) -> SocketAddr {
    format!("{s}:8080").parse().unwrap()
}

const REMOTE: &str = "10.244.2.2";
const LOCAL_A: &str = "10.244.1.2";
const LOCAL_B: &str = "10.244.1.3";

#[test]
fn each_way_in_uses_the_list_its_traffic_policy_selects() {
    struct Case {
        what: &'static str,
        internal_local: bool,
        external_local: bool,
        with_local: bool,
        scope: Scope,
        want: &'static [&'static str],
    }
    let all: &[&str] = &[REMOTE, LOCAL_A, LOCAL_B];
    let local: &[&str] = &[LOCAL_A, LOCAL_B];
    let cases = [
        Case {
            what: "cluster policies, ClusterIP",
            internal_local: false,
            external_local: false,
            with_local: true,
            scope: Scope::Internal,
            want: all,
        },
        Case {
            what: "cluster policies, node port",
            internal_local: false,
            external_local: false,
            with_local: true,
            scope: Scope::External,
            want: all,
        },
        Case {
            what: "internalTrafficPolicy Local, ClusterIP",
            internal_local: true,
            external_local: false,
            with_local: true,
            scope: Scope::Internal,
            want: local,
        },
        Case {
            what: "internalTrafficPolicy Local does not touch the node port",
            internal_local: true,
            external_local: false,
            with_local: true,
            scope: Scope::External,
            want: all,
        },
        Case {
            what: "externalTrafficPolicy Local, node port from outside",
            internal_local: false,
            external_local: true,
            with_local: true,
            scope: Scope::External,
            want: local,
        },
        Case {
            what: "externalTrafficPolicy Local, node port from a pod or the node",
            internal_local: false,
            external_local: true,
            with_local: true,
            scope: Scope::ShortCircuit,
            want: all,
        },
        Case {
            what: "externalTrafficPolicy Local does not touch the ClusterIP",
            internal_local: false,
            external_local: true,
            with_local: true,
            scope: Scope::Internal,
            want: all,
        },
        Case {
            what: "externalTrafficPolicy Local without local endpoints, from outside",
            internal_local: false,
            external_local: true,
            with_local: false,
            scope: Scope::External,
            want: &[],
        },
        Case {
            what: "externalTrafficPolicy Local without local endpoints, from a pod",
            internal_local: false,
            external_local: true,
            with_local: false,
            scope: Scope::ShortCircuit,
            want: &[REMOTE],
        },
    ];
    let t0 = Instant::now();
    for c in cases {
        let mut r = Routing::default();
        r.update(&port(c.internal_local, c.external_local, c.with_local));
        let client: IpAddr = "192.168.100.10".parse().unwrap();
        let got: BTreeSet<SocketAddr> =
            (0..6).filter_map(|_| r.pick(c.scope, client, t0)).collect();
        let want: BTreeSet<SocketAddr> = c.want.iter().map(|s| addr(s)).collect();
        assert_eq!(got, want, "{}", c.what);
        assert_eq!(r.candidates(c.scope), want.len(), "{}", c.what);
        for e in &want {
            assert!(r.serves(c.scope, *e), "{}: serves {e}", c.what);
        }
    }
}

#[test]
fn affinity_holds_across_the_cluster_ip_and_the_node_port() {
    let mut sp = port(false, false, true);
    sp.session_affinity = Some(SessionAffinity {
        timeout_seconds: 60,
    });
    let mut r = Routing::default();
    r.update(&sp);
    let t0 = Instant::now();
    let client: IpAddr = "192.168.100.10".parse().unwrap();
    let first = r.pick(Scope::Internal, client, t0).unwrap();
    for _ in 0..5 {
        assert_eq!(r.pick(Scope::External, client, t0), Some(first));
        assert_eq!(r.pick(Scope::Internal, client, t0), Some(first));
        assert_eq!(r.pick(Scope::ShortCircuit, client, t0), Some(first));
    }
}

#[test]
fn an_endpoint_that_left_no_longer_serves() {
    let mut r = Routing::default();
    r.update(&port(false, false, true));
    assert!(r.serves(Scope::Internal, addr(LOCAL_A)));
    r.update(&port(false, false, false));
    assert!(!r.serves(Scope::Internal, addr(LOCAL_A)));
    assert!(!r.serves(Scope::External, addr(LOCAL_A)));
    assert!(!r.serves(Scope::ShortCircuit, addr(LOCAL_A)));
    assert!(r.serves(Scope::Internal, addr(REMOTE)));
}
