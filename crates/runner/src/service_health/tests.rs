//! Health-check servers on loopback: status, headers and body for 0/1/2 endpoints, an unhealthy
//! proxy, closing, and a port already in use.

use std::io::{Read, Write};
use std::time::Duration;

use kpng_model::Family;

use super::*;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// (status, headers lower-cased, body)
fn get(port: u16, path: &str) -> std::io::Result<(u16, HashMap<String, String>, String)> {
    get_at(IpAddr::from([127, 0, 0, 1]), port, path)
}

/// [`get`] on `ip`.
fn get_at(
    ip: IpAddr,
    port: u16,
    path: &str,
) -> std::io::Result<(u16, HashMap<String, String>, String)> {
    let mut s = std::net::TcpStream::connect((ip, port))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_lowercase(), v.trim().to_string()))
        .collect();
    Ok((status, headers, body.to_string()))
}

fn servers(healthy: bool) -> (ServiceHealthServers, Counter) {
    let (servers, failures, _) = servers_and_gauge(healthy);
    (servers, failures)
}

/// The servers, their failure counter and their gauge of checks not served.
fn servers_and_gauge(healthy: bool) -> (ServiceHealthServers, Counter, Gauge) {
    let health = Arc::new(ProxyHealth::new(&[Family::V4], Duration::from_secs(60)));
    if !healthy {
        health.queued(Family::V4, SystemTime::UNIX_EPOCH);
    }
    let failures = Counter::default();
    let not_served = Gauge::default();
    (
        ServiceHealthServers::new(health, failures.clone(), not_served.clone()),
        failures,
        not_served,
    )
}

#[test]
fn body_is_kube_proxys_byte_for_byte() {
    assert_eq!(
        body(&ServiceKey::new("shop", "storefront"), 2, true),
        "{\n\t\"service\": {\n\t\t\"namespace\": \"shop\",\n\t\t\"name\": \"storefront\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
    );
}

#[tokio::test]
async fn answers_by_local_endpoint_count_and_closes_with_the_service() {
    let (mut hc, _) = servers(true);
    let port = free_port();
    let key = ServiceKey::new("shop", "storefront");
    let loopback = [IpAddr::from([127, 0, 0, 1])];
    for (count, want_status) in [(0u32, 503u16), (1, 200), (2, 200)] {
        let wanted = BTreeMap::from([(
            key.clone(),
            HealthCheck {
                port,
                local_endpoints: LocalEndpoints::both(count),
                families: ServiceFamilies::BOTH,
            },
        )]);
        hc.sync(&wanted, &loopback).await;
        let (status, headers, text) =
            tokio::task::spawn_blocking(move || get(port, "/any/path?x=1"))
                .await
                .expect("join")
                .expect("get");
        assert_eq!(status, want_status, "{count} endpoints");
        assert_eq!(
            headers.get("content-type").map(String::as_str),
            Some("application/json")
        );
        assert_eq!(
            headers.get("x-content-type-options").map(String::as_str),
            Some("nosniff")
        );
        assert_eq!(
            headers.get("x-load-balancing-endpoint-weight").cloned(),
            Some(count.to_string())
        );
        assert_eq!(text, body(&key, count, true));
    }
    hc.sync(&BTreeMap::new(), &loopback).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        tokio::task::spawn_blocking(move || get(port, "/"))
            .await
            .expect("join")
            .is_err(),
        "closed with its Service"
    );
}

#[tokio::test]
async fn an_unhealthy_proxy_answers_503_even_with_endpoints() {
    let (mut hc, _) = servers(false);
    let port = free_port();
    let key = ServiceKey::new("ns", "svc");
    hc.sync(
        &BTreeMap::from([(
            key.clone(),
            HealthCheck {
                port,
                local_endpoints: LocalEndpoints::both(3),
                families: ServiceFamilies::BOTH,
            },
        )]),
        &[IpAddr::from([127, 0, 0, 1])],
    )
    .await;
    let (status, _, text) = tokio::task::spawn_blocking(move || get(port, "/healthz"))
        .await
        .expect("join")
        .expect("get");
    assert_eq!(status, 503);
    assert_eq!(text, body(&key, 3, false));
}

/// A free port, and a listener that holds it on `ip` (so that binding it there fails). A port
/// taken on `ip` between the two binds (by another test's client) is given up for another.
fn squatted(ip: &str) -> (u16, std::net::TcpListener) {
    for _ in 0..20 {
        let port = free_port();
        if let Ok(squatter) = std::net::TcpListener::bind((ip, port)) {
            return (port, squatter);
        }
    }
    panic!("no port free on both 127.0.0.1 and {ip} in 20 tries")
}

/// Service `ns/svc` wanting its check on `port`, with one local endpoint.
fn one_check(port: u16) -> (ServiceKey, BTreeMap<ServiceKey, HealthCheck>) {
    let key = ServiceKey::new("ns", "svc");
    let check = HealthCheck {
        port,
        local_endpoints: LocalEndpoints::both(1),
        families: ServiceFamilies::BOTH,
    };
    (key.clone(), BTreeMap::from([(key, check)]))
}

#[tokio::test]
async fn a_port_in_use_is_counted_and_retried_at_the_next_sync() {
    let (mut hc, failures, not_served) = servers_and_gauge(true);
    let (port, squatter) = squatted("127.0.0.1");
    let (key, wanted) = one_check(port);
    let loopback = [IpAddr::from([127, 0, 0, 1])];
    hc.sync(&wanted, &loopback).await;
    assert_eq!(failures.get(), 1);
    assert!(hc.serving().is_empty());
    // Listed until it starts, naming the address, the first failure's time kept.
    let listed = hc.not_served();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!((&listed[0].service, listed[0].port), (&key, port));
    assert!(
        listed[0]
            .error
            .starts_with(&format!("127.0.0.1:{port}: Address already in use")),
        "{}",
        listed[0].error
    );
    hc.sync(&wanted, &loopback).await;
    assert_eq!(failures.get(), 2, "every attempt is counted");
    assert_eq!(
        hc.not_served(),
        listed,
        "the same failure, since the first attempt"
    );
    assert_eq!(not_served.get(), 1, "the gauge to alert on");
    drop(squatter);
    hc.sync(&wanted, &loopback).await;
    assert_eq!(hc.serving(), BTreeMap::from([(key, port)]));
    assert!(hc.not_served().is_empty());
    assert_eq!(not_served.get(), 0);
    let (status, _, _) = tokio::task::spawn_blocking(move || get(port, "/"))
        .await
        .expect("join")
        .expect("get");
    assert_eq!(status, 200);
}

/// One address that cannot be bound (another family's, missing from the host) leaves the
/// check served on the others: kube-proxy runs a proxier per family, so a load balancer
/// probing the node's IPv4 address still gets its answer. The missing address is tried again
/// at every sync without closing the served ones, and the failure names both.
#[tokio::test]
async fn an_address_that_cannot_be_bound_leaves_the_others_served() {
    let (mut hc, failures, not_served) = servers_and_gauge(true);
    let (port, squatter) = squatted("127.0.0.2");
    let (key, wanted) = one_check(port);
    let addresses = [IpAddr::from([127, 0, 0, 1]), IpAddr::from([127, 0, 0, 2])];
    hc.sync(&wanted, &addresses).await;
    assert_eq!(failures.get(), 1);
    assert_eq!(not_served.get(), 1, "a failure to look at");
    assert_eq!(hc.serving(), BTreeMap::from([(key.clone(), port)]));
    let answered = || async move {
        tokio::task::spawn_blocking(move || get(port, "/"))
            .await
            .expect("join")
            .expect("127.0.0.1 answers")
            .0
    };
    assert_eq!(answered().await, 200);
    let answer = hc.answer(&key, Family::V4).expect("an answer");
    assert_eq!(answer.status, Some(200), "{answer:?}");
    assert!(
        hc.not_served_for(&key).is_none(),
        "load balancers probing 127.0.0.1 get their answer"
    );
    assert_eq!(
        hc.not_served().len(),
        1,
        "but `kpng status` lists the failure"
    );
    assert_eq!(
        answer.not_served.as_deref(),
        Some(format!("127.0.0.2:{port}: Address already in use (os error 98) (served on 127.0.0.1:{port})").as_str()),
        "{answer:?}"
    );
    // Retried without closing 127.0.0.1's: a connection held open across the sync survives.
    let held = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    drop(squatter);
    hc.sync(&wanted, &addresses).await;
    assert!(hc.not_served().is_empty());
    assert_eq!(not_served.get(), 0);
    assert_eq!(hc.answer(&key, Family::V4).and_then(|a| a.not_served), None);
    let mut s = std::net::TcpStream::connect(("127.0.0.2", port)).expect("127.0.0.2 served now");
    s.write_all(b"GET / HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n")
        .expect("write");
    let mut held = held;
    held.write_all(b"GET / HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n")
        .expect("the held connection is still open");
    let mut text = String::new();
    held.set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    tokio::task::spawn_blocking(move || held.read_to_string(&mut text).map(|_| text))
        .await
        .expect("join")
        .map(|t| assert!(t.starts_with("HTTP/1.1 200"), "{t}"))
        .expect("read the held connection's answer");
}

#[tokio::test]
async fn a_port_in_use_is_retried_by_an_update_that_names_other_services() {
    let (mut hc, failures) = servers(true);
    let port = free_port();
    let squatter = std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind");
    let key = ServiceKey::new("ns", "svc");
    let check = HealthCheck {
        port,
        local_endpoints: LocalEndpoints::both(1),
        families: ServiceFamilies::BOTH,
    };
    let loopback = [IpAddr::from([127, 0, 0, 1])];
    hc.update(BTreeMap::from([(key.clone(), Some(check))]), &loopback)
        .await;
    assert_eq!(failures.get(), 1);
    drop(squatter);
    // The next sync's diff touches another Service only.
    hc.update(
        BTreeMap::from([(ServiceKey::new("ns", "other"), None)]),
        &loopback,
    )
    .await;
    assert_eq!(hc.serving(), BTreeMap::from([(key, port)]));
}

#[tokio::test]
async fn an_update_leaves_the_services_it_does_not_name() {
    let (mut hc, _) = servers(true);
    let (a, b) = (ServiceKey::new("ns", "a"), ServiceKey::new("ns", "b"));
    let (port_a, port_b) = (free_port(), free_port());
    let check = |port, local_endpoints| HealthCheck {
        port,
        local_endpoints: LocalEndpoints::both(local_endpoints),
        families: ServiceFamilies::BOTH,
    };
    let loopback = [IpAddr::from([127, 0, 0, 1])];
    hc.sync(
        &BTreeMap::from([(a.clone(), check(port_a, 1)), (b.clone(), check(port_b, 1))]),
        &loopback,
    )
    .await;
    let status = |port| async move {
        tokio::task::spawn_blocking(move || get(port, "/"))
            .await
            .expect("join")
            .map(|(status, _, text)| (status, text))
    };
    hc.update(
        BTreeMap::from([(a.clone(), Some(check(port_a, 0)))]),
        &loopback,
    )
    .await;
    assert_eq!(status(port_a).await.expect("a").0, 503, "a's new count");
    assert_eq!(
        status(port_b).await.expect("b"),
        (200, body(&b, 1, true)),
        "b as it was"
    );
    hc.update(BTreeMap::from([(b.clone(), None)]), &loopback)
        .await;
    assert_eq!(hc.serving(), BTreeMap::from([(a, port_a)]));
}

/// At 30k Services, 1,500 checks each built a router holding the answer's state, 5 MiB of
/// the ~9 MiB they added to kpng's peak RSS: the checks share one router, so starting more
/// of them adds no holder of that state. Each still answers for its own Service.
#[tokio::test]
async fn every_check_shares_one_router() {
    let (mut hc, _) = servers(true);
    let loopback = [IpAddr::from([127, 0, 0, 1])];
    let keys: Vec<ServiceKey> = (0..8)
        .map(|i| ServiceKey::new("ns", format!("s{i}").as_str()))
        .collect();
    let ports: Vec<u16> = keys.iter().map(|_| free_port()).collect();
    let wanted = |n: usize| -> BTreeMap<ServiceKey, HealthCheck> {
        keys.iter()
            .zip(&ports)
            .take(n)
            .enumerate()
            .map(|(i, (key, &port))| {
                let check = HealthCheck {
                    port,
                    local_endpoints: LocalEndpoints::both(u32::try_from(i).expect("small")),
                    families: ServiceFamilies::BOTH,
                };
                (key.clone(), check)
            })
            .collect()
    };
    hc.sync(&wanted(1), &loopback).await;
    let holders_of_one = Arc::strong_count(&hc.shared.counts);
    hc.sync(&wanted(keys.len()), &loopback).await;
    assert_eq!(hc.serving().len(), keys.len());
    assert_eq!(
        Arc::strong_count(&hc.shared.counts),
        holders_of_one,
        "each check's server holds its own copy of the answer's state (a router each)"
    );
    for (i, (key, &port)) in keys.iter().zip(&ports).enumerate() {
        let count = u32::try_from(i).expect("small");
        let answer = tokio::task::spawn_blocking(move || get(port, "/"))
            .await
            .expect("join")
            .expect("answered");
        let status = if count > 0 { 200 } else { 503 };
        assert_eq!(
            (answer.0, answer.2),
            (status, body(key, count, true)),
            "{key}"
        );
    }
}

#[test]
fn one_services_check_is_what_the_whole_snapshot_says_for_it() {
    use kpng_model::{PortKey, Protocol, ServicePort};
    let port = |service: &str, name: &str, family, hc: Option<u16>, local| {
        let key = PortKey {
            service: ServiceKey::new("ns", service),
            port_name: name.into(),
            protocol: Protocol::Tcp,
            family,
        };
        let mut sp = ServicePort::new(key.clone(), IpAddr::from([10, 96, 0, 1]), 80);
        sp.health_check_node_port = hc;
        sp.local_ready_endpoints = local;
        (key, Arc::new(sp))
    };
    let snapshot = Snapshot {
        ports: BTreeMap::from([
            // Two ports and two families: the largest count of a family is the Service's
            // in that family.
            port("lb", "http", Family::V4, Some(30100), 1),
            port("lb", "https", Family::V4, Some(30100), 3),
            port("lb", "http", Family::V6, Some(30100), 2),
            // A neighbour in key order without a check.
            port("lb-plain", "", Family::V4, None, 5),
            port("local", "", Family::V6, Some(30200), 0),
            // Dual-stack, local endpoints in IPv6 only (mid-migration): IPv4 counts none.
            port("v6-eps", "", Family::V4, Some(30300), 0),
            port("v6-eps", "", Family::V6, Some(30300), 2),
            // And the mirror.
            port("v4-eps", "", Family::V4, Some(30400), 2),
            port("v4-eps", "", Family::V6, Some(30400), 0),
        ]),
        ..Snapshot::default()
    };
    let all = wanted(&snapshot, &Family::ALL);
    let counts = |v4, v6| LocalEndpoints { v4, v6 };
    for (service, want) in [
        ("lb", Some((30100, counts(3, 2)))),
        ("lb-plain", None),
        ("local", Some((30200, counts(0, 0)))),
        ("v6-eps", Some((30300, counts(0, 2)))),
        ("v4-eps", Some((30400, counts(2, 0)))),
        ("absent", None),
    ] {
        let key = ServiceKey::new("ns", service);
        let one = wanted_for(&snapshot, &key, &Family::ALL);
        assert_eq!(one.map(|c| (c.port, c.local_endpoints)), want, "{service}");
        assert_eq!(
            one,
            all.get(&key).copied(),
            "{service}: as the whole snapshot"
        );
    }
}

#[tokio::test]
async fn two_services_that_trade_ports_both_serve_after_one_sync() {
    let (mut hc, failures) = servers(true);
    let (a, b) = (ServiceKey::new("ns", "a"), ServiceKey::new("ns", "b"));
    let (p1, p2) = (free_port(), free_port());
    let check = |port| HealthCheck {
        port,
        local_endpoints: LocalEndpoints::both(1),
        families: ServiceFamilies::BOTH,
    };
    let loopback = [IpAddr::from([127, 0, 0, 1])];
    hc.sync(
        &BTreeMap::from([(a.clone(), check(p1)), (b.clone(), check(p2))]),
        &loopback,
    )
    .await;
    hc.sync(
        &BTreeMap::from([(a.clone(), check(p2)), (b.clone(), check(p1))]),
        &loopback,
    )
    .await;
    assert_eq!(failures.get(), 0, "no port was still taken");
    assert_eq!(
        hc.serving(),
        BTreeMap::from([(a.clone(), p2), (b.clone(), p1)])
    );
    let (_, _, text) = tokio::task::spawn_blocking(move || get(p1, "/"))
        .await
        .expect("join")
        .expect("get");
    assert_eq!(text, body(&b, 1, true), "p1 answers for b now");
}

fn ips(list: &[&str]) -> Vec<IpAddr> {
    list.iter().map(|ip| ip.parse().expect("ip")).collect()
}

/// Which addresses the checks listen on, per `--nodeport-addresses` (kube-proxy's
/// `newServiceHealthServer`): with CIDRs, the node's addresses inside them, per family as the
/// node ports; a family without a CIDR or with a `/0` on every address; a family whose CIDRs
/// match nothing nowhere; every address when the node's cannot be read.
#[test]
fn the_checks_listen_on_the_node_port_addresses() {
    let local = || {
        ips(&[
            "127.0.0.1",
            "10.1.2.3",
            "192.168.1.1",
            "10.1.2.3",
            "::1",
            "fd00::1",
            "fd01::1",
        ])
    };
    let node = ips(&["192.168.1.1", "fd00::9"]);
    let cidrs = |l: &[&str]| {
        HealthCheckAddresses::Cidrs(l.iter().map(|c| c.parse().expect("cidr")).collect())
    };
    let both = [Family::V4, Family::V6];
    let wildcards = ips(&["0.0.0.0", "::"]);
    let chosen = |addresses: Vec<IpAddr>, unread: &[Family], unmatched: &[Family]| Chosen {
        addresses,
        unread: unread.to_vec(),
        unmatched: unmatched.to_vec(),
    };
    /// What, the setting, the backend's families, the node's addresses, the choice.
    type Row<'a> = (
        &'a str,
        HealthCheckAddresses,
        &'a [Family],
        Vec<IpAddr>,
        Chosen,
    );
    let table: Vec<Row<'_>> = vec![
        (
            "every address (iptables' default)",
            HealthCheckAddresses::All,
            &both,
            local(),
            chosen(wildcards.clone(), &[], &[]),
        ),
        (
            "the node IPs (primary)",
            HealthCheckAddresses::NodeIps,
            &both,
            local(),
            chosen(node.clone(), &[], &[]),
        ),
        (
            "one CIDR per family",
            cidrs(&["10.0.0.0/8", "fd00::/64"]),
            &both,
            local(),
            chosen(ips(&["10.1.2.3", "fd00::1"]), &[], &[]),
        ),
        (
            "no IPv6 CIDR: every IPv6 address",
            cidrs(&["10.0.0.0/8", "192.168.0.0/16"]),
            &both,
            local(),
            chosen(ips(&["10.1.2.3", "192.168.1.1", "::"]), &[], &[]),
        ),
        (
            "only the backend's families",
            cidrs(&["10.0.0.0/8"]),
            &[Family::V4],
            local(),
            chosen(ips(&["10.1.2.3"]), &[], &[]),
        ),
        (
            "a /0 matches all (kube-proxy's MatchAll)",
            cidrs(&["0.0.0.0/0", "fd00::/64"]),
            &both,
            local(),
            chosen(ips(&["0.0.0.0", "fd00::1"]), &[], &[]),
        ),
        (
            "loopback when a CIDR holds it",
            cidrs(&["127.0.0.0/8", "::1/128"]),
            &both,
            local(),
            chosen(ips(&["127.0.0.1", "::1"]), &[], &[]),
        ),
        (
            "a CIDR no address is in: that family listens nowhere",
            cidrs(&["172.16.0.0/12", "fd00::/64"]),
            &both,
            local(),
            chosen(ips(&["fd00::1"]), &[], &[Family::V4]),
        ),
        (
            "the addresses cannot be read: every address of that family",
            cidrs(&["10.0.0.0/8"]),
            &both,
            Vec::new(),
            chosen(wildcards.clone(), &[Family::V4], &[]),
        ),
    ];
    for (what, setting, families, local, want) in table {
        assert_eq!(setting.choose(families, &node, || local), want, "{what}");
    }
    // Unknown node IPs: every address, as before; and nothing reads the node's addresses
    // unless a CIDR needs them.
    let unread = || -> Vec<IpAddr> { panic!("read the node's addresses") };
    assert_eq!(
        HealthCheckAddresses::NodeIps.choose(&both, &[], unread),
        chosen(wildcards.clone(), &[], &[])
    );
    assert_eq!(
        HealthCheckAddresses::All.choose(&both, &node, unread),
        chosen(wildcards.clone(), &[], &[])
    );
    // A Node that lists IPv4 only: IPv6 node ports are on every IPv6 address
    // (`NodePortAddresses::scope_on`), and so are their checks.
    let v4_node: Vec<IpAddr> = node.iter().copied().filter(IpAddr::is_ipv4).collect();
    let mut want = v4_node.clone();
    want.push("::".parse().expect("ip"));
    assert_eq!(
        HealthCheckAddresses::NodeIps.choose(&both, &v4_node, unread),
        chosen(want, &[], &[])
    );
    assert_eq!(
        cidrs(&["fd00::/64"]).choose(&[Family::V4], &node, unread),
        chosen(ips(&["0.0.0.0"]), &[], &[])
    );
}

/// The node's addresses are read again only when the runner says so (full, node and periodic
/// syncs), and a change is reported once.
#[test]
fn the_node_addresses_are_followed_at_the_syncs_that_read_them() {
    let now = Arc::new(std::sync::Mutex::new(ips(&["10.1.2.3", "192.168.1.1"])));
    let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (n, r) = (now.clone(), reads.clone());
    let mut listen = ListenAddresses::new(HealthCheckAddresses::Cidrs(vec![
        "10.0.0.0/8".parse().expect("cidr"),
    ]))
    .with_local_addresses(Box::new(move || {
        r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        n.lock().expect("lock").clone()
    }));
    let v4 = [Family::V4];
    assert_eq!(
        listen.at_sync(&v4, &[], false),
        (ips(&["10.1.2.3"]), true),
        "the first sync reads them"
    );
    now.lock()
        .expect("lock")
        .push("10.9.9.9".parse().expect("ip"));
    assert_eq!(
        listen.at_sync(&v4, &[], false),
        (ips(&["10.1.2.3"]), false),
        "a change's sync does not read them"
    );
    assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(
        listen.at_sync(&v4, &[], true),
        (ips(&["10.1.2.3", "10.9.9.9"]), true),
        "an address added"
    );
    assert_eq!(
        listen.at_sync(&v4, &[], true),
        (ips(&["10.1.2.3", "10.9.9.9"]), false),
        "nothing moved"
    );
    now.lock()
        .expect("lock")
        .retain(|ip| ip.to_string() != "10.1.2.3");
    assert_eq!(
        listen.at_sync(&v4, &[], true),
        (ips(&["10.9.9.9"]), true),
        "an address removed"
    );
}

/// When the node's addresses move, a server binds the added ones and closes the removed
/// ones, the others left serving with their connections; no address at all (CIDRs that match
/// none of the node's) listens nowhere without counting a failure, and says so.
#[tokio::test]
async fn an_address_added_is_bound_and_one_removed_is_closed() {
    let (mut hc, failures, not_served) = servers_and_gauge(true);
    let (key, wanted) = one_check(free_port());
    let port = wanted[&key].port;
    let connect = |ip: &str| std::net::TcpStream::connect((ip, port));
    let answers = |mut s: std::net::TcpStream| {
        s.write_all(b"GET / HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n")?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        Ok::<_, std::io::Error>(text.starts_with("HTTP/1.1 200"))
    };
    hc.sync(&wanted, &ips(&["127.0.0.1"])).await;
    assert!(connect("127.0.0.2").is_err(), "not listened on yet");
    let held = connect("127.0.0.1").expect("127.0.0.1 served");
    hc.sync(&wanted, &ips(&["127.0.0.1", "127.0.0.2"])).await;
    let added = connect("127.0.0.2").expect("the added address is bound");
    let (added, held) = tokio::task::spawn_blocking(move || (answers(added), answers(held)))
        .await
        .expect("join");
    assert!(added.expect("answer"), "the added address answers");
    assert!(
        held.expect("the held connection is still open"),
        "the kept address was not closed"
    );
    hc.sync(&wanted, &ips(&["127.0.0.2"])).await;
    assert!(
        connect("127.0.0.1").is_err(),
        "the removed address is closed"
    );
    let kept = connect("127.0.0.2").expect("127.0.0.2 still served");
    assert!(
        tokio::task::spawn_blocking(move || answers(kept))
            .await
            .expect("join")
            .expect("answer")
    );
    assert_eq!(hc.serving(), BTreeMap::from([(key.clone(), port)]));
    // No address: nothing listens, nothing failed, and the answer says why.
    hc.sync(&wanted, &[]).await;
    assert!(connect("127.0.0.2").is_err(), "closed");
    assert_eq!((failures.get(), not_served.get()), (0, 0));
    let answer = hc.answer(&key, Family::V4).expect("an answer");
    assert_eq!(answer.status, None, "{answer:?}");
    assert_eq!(answer.not_served.as_deref(), Some(NO_ADDRESS));
    assert_eq!(
        hc.not_served_for(&key).map(|n| n.error),
        Some(NO_ADDRESS.to_string()),
        "a trace says so"
    );
    // An address again: bound, the answer back.
    hc.sync(&wanted, &ips(&["127.0.0.1"])).await;
    assert!(connect("127.0.0.1").is_ok(), "bound again");
    assert_eq!(
        hc.answer(&key, Family::V4).and_then(|a| a.status),
        Some(200)
    );
    assert!(hc.not_served_for(&key).is_none());
    assert_eq!(failures.get(), 0);
}

/// A client connection from `from` (a loopback address: 127.0.0.9 and 127.0.0.10 are two
/// peers).
fn connect_from(from: [u8; 4], port: u16) -> std::net::TcpStream {
    try_connect_from(from, port).expect("connect")
}

/// [`connect_from`] for a flood: `None` when the server's reset of a refused connection
/// reached `connect()` before it returned (a loaded machine).
fn try_connect_from(from: [u8; 4], port: u16) -> std::io::Result<std::net::TcpStream> {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("a socket");
    socket
        .bind(&std::net::SocketAddr::from((from, 0)).into())
        .expect("bind the client's address");
    socket.connect(&std::net::SocketAddr::from(([127, 0, 0, 1], port)).into())?;
    let stream: std::net::TcpStream = socket.into();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("read timeout");
    Ok(stream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_one_address_leaves_the_check_answering_others_and_expires() {
    let limits = crate::guarded_http::ConnectionLimits {
        per_peer: 3,
        total: 64,
        header_timeout: Duration::from_millis(500),
        idle_timeout: Duration::from_secs(600),
    };
    let refused = RefusedConnections::default();
    let (hc, _) = servers(true);
    let mut hc = hc.with_connection_limits(limits, refused.clone());
    let port = free_port();
    let key = ServiceKey::new("shop", "storefront");
    let wanted = BTreeMap::from([(
        key.clone(),
        HealthCheck {
            port,
            local_endpoints: LocalEndpoints::both(1),
            families: ServiceFamilies::BOTH,
        },
    )]);
    hc.sync(&wanted, &[IpAddr::from([127, 0, 0, 1])]).await;

    // 100 idle connections from 127.0.0.9: three are held, the others closed at once.
    let flood = tokio::task::spawn_blocking(move || {
        (0..100)
            // From an address no test listens on (its client ports cannot take a port another
            // test picked), to the check on 127.0.0.1.
            .map(|_| match try_connect_from([127, 0, 0, 9], port) {
                Ok(c) => Some(c),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => None,
                Err(e) => panic!("connect: {e}"),
            })
            .collect::<Vec<_>>()
    })
    .await
    .expect("flood");
    let per_peer = crate::guarded_http::Refusal::PeerCap;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while refused.get(SERVER, per_peer) < 97 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the flood is not refused"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(refused.get(SERVER, per_peer), 97);
    // `kpng status` says the check is refusing connections.
    let (total, _ago) = hc
        .answer(&key, Family::V4)
        .and_then(|a| a.refused_connections)
        .expect("the status tells the refusals");
    assert_eq!(total, 97);

    // A load balancer's probe from another address is answered meanwhile.
    let answer = tokio::task::spawn_blocking(move || {
        let mut probe = connect_from([127, 0, 0, 10], port);
        probe
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n")
            .expect("probe");
        let mut text = String::new();
        probe.read_to_string(&mut text).map(|_| text)
    })
    .await
    .expect("join")
    .expect("the probe is answered");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    // The held ones (idle, one with half a header) are closed after the header timeout.
    let closed = tokio::task::spawn_blocking(move || {
        flood
            .into_iter()
            .map(|c| {
                // Reset before `connect()` returned: closed by the server too.
                let Some(mut c) = c else { return true };
                let _ = c.write_all(b"GET / HTTP/1.1\r\nHost: ");
                let mut rest = Vec::new();
                match c.read_to_end(&mut rest) {
                    Ok(_) => true,
                    Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
                }
            })
            .filter(|closed| *closed)
            .count()
    })
    .await
    .expect("join");
    assert_eq!(
        closed, 100,
        "every connection of the flood ends closed by the server"
    );
}

/// Where one Service's check listens, per its families and `--nodeport-addresses`: on the
/// node's listen addresses of its own families only (kube-proxy's server per family's
/// proxier). An IPv6-only Service on a dual-stack node gets no IPv4 listener, not even the
/// IPv4 wildcard a family without a Node IP or CIDR listens on.
#[test]
fn a_services_check_listens_on_addresses_of_its_own_families() {
    let local = || ips(&["127.0.0.1", "10.1.2.3", "::1", "2001:db8:1::20"]);
    let both = [Family::V4, Family::V6];
    let cidrs = |l: &[&str]| {
        HealthCheckAddresses::Cidrs(l.iter().map(|c| c.parse().expect("cidr")).collect())
    };
    let v4 = ServiceFamilies::of(Family::V4);
    let v6 = ServiceFamilies::of(Family::V6);
    let dual = ServiceFamilies::BOTH;
    /// What, the setting, the Node's IPs, the Service's families, where its check listens.
    type Row<'a> = (
        &'a str,
        HealthCheckAddresses,
        Vec<IpAddr>,
        ServiceFamilies,
        Vec<IpAddr>,
    );
    let v6_node = ips(&["2001:db8:1::10"]);
    let dual_node = ips(&["10.1.2.3", "2001:db8:1::10"]);
    let table: Vec<Row<'_>> = vec![
        (
            "all, IPv6-only",
            HealthCheckAddresses::All,
            dual_node.clone(),
            v6,
            ips(&["::"]),
        ),
        (
            "all, IPv4-only",
            HealthCheckAddresses::All,
            dual_node.clone(),
            v4,
            ips(&["0.0.0.0"]),
        ),
        (
            "all, dual",
            HealthCheckAddresses::All,
            dual_node.clone(),
            dual,
            ips(&["0.0.0.0", "::"]),
        ),
        (
            "IPv6 Node IP, IPv6-only (no 0.0.0.0 for the IPv4 family without a Node IP)",
            HealthCheckAddresses::NodeIps,
            v6_node.clone(),
            v6,
            ips(&["2001:db8:1::10"]),
        ),
        (
            "IPv6 Node IP, IPv4-only: every IPv4 address, as its node ports",
            HealthCheckAddresses::NodeIps,
            v6_node.clone(),
            v4,
            ips(&["0.0.0.0"]),
        ),
        (
            "IPv6 Node IP, dual",
            HealthCheckAddresses::NodeIps,
            v6_node.clone(),
            dual,
            ips(&["0.0.0.0", "2001:db8:1::10"]),
        ),
        (
            "dual Node IPs, IPv6-only",
            HealthCheckAddresses::NodeIps,
            dual_node.clone(),
            v6,
            ips(&["2001:db8:1::10"]),
        ),
        (
            "Node IPs unknown (node ports on every address), IPv6-only",
            HealthCheckAddresses::NodeIps,
            Vec::new(),
            v6,
            ips(&["::"]),
        ),
        (
            "an IPv6 CIDR only, IPv6-only (no IPv4 CIDR: match all, but not this Service's)",
            cidrs(&["2001:db8:1::/64"]),
            v6_node.clone(),
            v6,
            ips(&["2001:db8:1::20"]),
        ),
        (
            "an IPv6 CIDR only, dual",
            cidrs(&["2001:db8:1::/64"]),
            v6_node.clone(),
            dual,
            ips(&["0.0.0.0", "2001:db8:1::20"]),
        ),
        (
            "an IPv4 /0 and an IPv6 CIDR, IPv6-only",
            cidrs(&["0.0.0.0/0", "2001:db8:1::/64"]),
            v6_node.clone(),
            v6,
            ips(&["2001:db8:1::20"]),
        ),
        (
            "CIDRs of both families, IPv4-only",
            cidrs(&["10.0.0.0/8", "2001:db8:1::/64"]),
            dual_node.clone(),
            v4,
            ips(&["10.1.2.3"]),
        ),
    ];
    for (what, setting, node, families, want) in table {
        let chosen = setting.choose(&both, &node, local);
        assert_eq!(families.select(&chosen.addresses), want, "{what}");
    }
}

/// The servers listen per Service on its families' addresses: an IPv6-only Service given the
/// node's IPv4 and IPv6 addresses answers on IPv6 only, a dual-stack one on both, and a
/// Service turning dual-stack gains its IPv4 listener at the next update.
#[tokio::test]
async fn an_ipv6_only_services_check_has_no_ipv4_listener() {
    let (mut hc, _) = servers(true);
    let port = free_port();
    let key = ServiceKey::new("edge", "v6only");
    let addresses = ips(&["127.0.0.1", "::1"]);
    let check = |families| HealthCheck {
        port,
        local_endpoints: LocalEndpoints::both(1),
        families,
    };
    let connects = |ip: &'static str| {
        tokio::task::spawn_blocking(move || {
            std::net::TcpStream::connect_timeout(
                &SocketAddr::new(ip.parse().expect("ip"), port),
                Duration::from_secs(1),
            )
            .is_ok()
        })
    };
    hc.sync(
        &BTreeMap::from([(key.clone(), check(ServiceFamilies::of(Family::V6)))]),
        &addresses,
    )
    .await;
    assert!(connects("::1").await.expect("join"), "served on IPv6");
    assert!(
        !connects("127.0.0.1").await.expect("join"),
        "an IPv6-only Service's check listens on no IPv4 address"
    );
    assert!(hc.not_served().is_empty());
    hc.update(
        BTreeMap::from([(key.clone(), Some(check(ServiceFamilies::BOTH)))]),
        &addresses,
    )
    .await;
    assert!(connects("127.0.0.1").await.expect("join"), "dual-stack now");
    assert!(connects("::1").await.expect("join"), "IPv6 kept");
}

/// kube-proxy's health server per family's proxier: each listener answers with its own
/// family's local ready endpoints (and `kpng status` says so per family). A dual-stack
/// Service with local endpoints in one family only answers 503 on the other family's
/// listeners, whose traffic kpng rejects; one count over both families drew an IPv4 load
/// balancer's traffic to a node refusing it.
#[tokio::test]
async fn each_family_s_listener_answers_with_its_own_family_s_endpoints() {
    let v4 = IpAddr::from([127, 0, 0, 1]);
    let v6: IpAddr = "::1".parse().expect("ip");
    for (v4_count, v6_count, want_v4, want_v6) in [
        (0u32, 2u32, 503u16, 200u16),
        (2, 0, 200, 503),
        (1, 3, 200, 200),
        (0, 0, 503, 503),
    ] {
        let (mut hc, _) = servers(true);
        let port = free_port();
        let key = ServiceKey::new("edge", "lb");
        let check = HealthCheck {
            port,
            local_endpoints: LocalEndpoints {
                v4: v4_count,
                v6: v6_count,
            },
            families: ServiceFamilies::BOTH,
        };
        hc.sync(&BTreeMap::from([(key.clone(), check)]), &[v4, v6])
            .await;
        let case = format!("IPv4 {v4_count}, IPv6 {v6_count}");
        for (ip, family, count, want) in [
            (v4, Family::V4, v4_count, want_v4),
            (v6, Family::V6, v6_count, want_v6),
        ] {
            let (status, headers, text) =
                tokio::task::spawn_blocking(move || get_at(ip, port, "/"))
                    .await
                    .expect("join")
                    .expect("get");
            assert_eq!(status, want, "{case}: GET on {ip}");
            assert_eq!(text, body(&key, count, true), "{case}: GET on {ip}");
            assert_eq!(
                headers.get("x-load-balancing-endpoint-weight").cloned(),
                Some(count.to_string()),
                "{case}: GET on {ip}"
            );
            let answer = hc.answer(&key, family).expect("an answer");
            assert_eq!(
                (answer.status, answer.local_endpoints),
                (Some(want), count),
                "{case}: `kpng status` for {family:?}"
            );
        }
    }
}

/// The wildcard listeners count their family too: `0.0.0.0` IPv4, `[::]` (v6-only) IPv6.
#[tokio::test]
async fn the_wildcard_listeners_answer_with_their_family_s_endpoints() {
    let (mut hc, _) = servers(true);
    let port = free_port();
    let key = ServiceKey::new("edge", "wild");
    let check = HealthCheck {
        port,
        local_endpoints: LocalEndpoints::of(Family::V6, 2),
        families: ServiceFamilies::BOTH,
    };
    hc.sync(
        &BTreeMap::from([(key.clone(), check)]),
        &ips(&["0.0.0.0", "::"]),
    )
    .await;
    for (ip, want) in [("127.0.0.1", 503u16), ("::1", 200)] {
        let ip: IpAddr = ip.parse().expect("ip");
        let (status, _, _) = tokio::task::spawn_blocking(move || get_at(ip, port, "/"))
            .await
            .expect("join")
            .expect("get");
        assert_eq!(status, want, "GET on {ip}");
    }
}

/// A dual-stack Service whose `--nodeport-addresses` CIDRs match only an IPv4 address of the
/// node listens on IPv4 only: `kpng status` must say its IPv6 check is not served (a probe on
/// IPv6 is refused), not what the IPv4 listener answers (until 2026-12-07 it said "answers
/// 200" on the IPv6 row, and `--problems` saw no problem).
#[tokio::test]
async fn a_family_without_a_listener_is_not_served_on_that_family() {
    let key = ServiceKey::new("edge", "half");
    // (listen addresses, family asked, status wanted, reason wanted)
    type Case<'a> = (&'a [&'a str], Family, Option<u16>, Option<&'a str>);
    let cases: [Case; 5] = [
        (&["127.0.0.1"], Family::V4, Some(200), None),
        (
            &["127.0.0.1"],
            Family::V6,
            None,
            Some("no IPv6 address of the node is inside --nodeport-addresses"),
        ),
        (
            &["::1"],
            Family::V4,
            None,
            Some("no IPv4 address of the node is inside --nodeport-addresses"),
        ),
        (&["127.0.0.1", "::1"], Family::V6, Some(200), None),
        (&[], Family::V6, None, Some(NO_ADDRESS)),
    ];
    for (addresses, family, status, why) in cases {
        // A port per case: the last case's listener may still be closing.
        let check = HealthCheck {
            port: free_port(),
            local_endpoints: LocalEndpoints::both(1),
            families: ServiceFamilies::BOTH,
        };
        let (mut hc, _) = servers(true);
        hc.sync(&BTreeMap::from([(key.clone(), check)]), &ips(addresses))
            .await;
        let answer = hc.answer(&key, family).expect("an answer");
        assert_eq!(
            (answer.status, answer.not_served.as_deref()),
            (status, why),
            "{addresses:?}, asked for {family:?}"
        );
        assert_eq!(answer.local_endpoints, 1, "{addresses:?}, {family:?}");
    }
}

/// A family whose `--nodeport-addresses` CIDRs match no address of the node is warned of
/// only once a Service's check has that family, once per change: an IPv6 address leaving the
/// node (link down) warned that "health checks do not listen on IPv6" with no IPv6 check.
#[test]
fn a_family_listening_nowhere_is_warned_of_only_when_a_check_needs_it() {
    let mut listen = ListenAddresses::new(HealthCheckAddresses::Cidrs(vec![
        "10.0.0.0/8".parse().expect("cidr"),
        "fd00:9::/64".parse().expect("cidr"),
    ]))
    .with_local_addresses(Box::new(|| ips(&["10.1.2.3", "fd00:1::1"])));
    let _ = listen.at_sync(&Family::ALL, &[], true);
    let v4 = ServiceFamilies::of(Family::V4);
    assert_eq!(listen.warn_unserved(|| v4), [], "IPv4 checks only: nothing");
    assert_eq!(listen.warn_unserved(|| v4), [], "still nothing");
    assert_eq!(
        listen.warn_unserved(|| ServiceFamilies::BOTH),
        [Family::V6],
        "a dual-stack check arrives"
    );
    assert_eq!(
        listen.warn_unserved(|| ServiceFamilies::BOTH),
        [],
        "warned once"
    );
    assert_eq!(listen.warn_unserved(|| v4), [], "it left: nothing to warn");
    assert_eq!(
        listen.warn_unserved(|| ServiceFamilies::BOTH),
        [Family::V6],
        "it came back: warned again"
    );
}

/// The families in use are those of every wanted check, served or not.
#[tokio::test]
async fn the_families_in_use_are_the_wanted_checks() {
    let (mut hc, _) = servers(true);
    assert_eq!(hc.families_in_use(), ServiceFamilies::default());
    let check = |family| HealthCheck {
        port: free_port(),
        local_endpoints: LocalEndpoints::of(family, 1),
        families: ServiceFamilies::of(family),
    };
    let wanted = BTreeMap::from([(ServiceKey::new("edge", "v6"), check(Family::V6))]);
    hc.sync(&wanted, &ips(&["127.0.0.1"])).await;
    assert_eq!(hc.families_in_use(), ServiceFamilies::of(Family::V6));
    hc.sync(&BTreeMap::new(), &ips(&["127.0.0.1"])).await;
    assert_eq!(hc.families_in_use(), ServiceFamilies::default());
}
