//! The netlink element writer (`src/netlink.rs`) against the real kernel, each test in a
//! throw-away network namespace: the writer must leave exactly what `nft -f` would (compared
//! through `nft list`), replace values atomically, name the set and element of an error and
//! then have applied nothing. It also measures a 300k-element load against the nft paths.
//!
//! How: std cannot enter a namespace, so every root test (the "outer" one) creates a namespace
//! and re-runs this test binary inside it with `ip netns exec NS <binary> --exact inner_… --ignored`;
//! the `inner_…` tests are `#[ignore]`d and do nothing unless `KPNG_NETLINK_TEST_NETNS` is set,
//! so neither `cargo test` nor `cargo test -- --ignored` ever touches the host's ruleset.
//! Run with `--nocapture` to see the measurements.
//!
//! It drives `kpng_backend_nft::netlink` directly.

use kpng_backend_nft::netlink;

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use kpng_backend_nft::elements::port_elements;
use kpng_backend_nft::exec::NftExec;
use kpng_backend_nft::exec::libnftables::LibNftables;
use kpng_backend_nft::ruleset::{DynamicChain, Fam, PickKind, StaticConfig, skeleton};
use kpng_backend_nft::sets::{Data, Set};
use kpng_backend_nft::store::{Element, ElementStore};
use kpng_backend_nft::value::{Chain, FixedChain, Key, Source, Value, Verdict};
use kpng_model::{Endpoint, Family, PortKey, Protocol, ServiceKey, ServicePort, SessionAffinity};
use kpng_testkit::Netns;

use netlink::{ElementWriter, NetlinkError, NetlinkWriter, Operation};

/// Set (to the namespace's name) only in the re-executed test binary inside a namespace.
const INNER: &str = "KPNG_NETLINK_TEST_NETNS";

/// The outer tests run one at a time: the timings must not compete with each other.
static SERIAL: Mutex<()> = Mutex::new(());

/// Runs the `#[ignore]`d test `inner` of this binary inside a fresh namespace; returns its
/// standard output (which it also prints).
fn in_fresh_netns(inner: &str) -> String {
    in_fresh_netns_via(inner, &[])
}

/// [`in_fresh_netns`], with the binary started through `wrapper` (e.g. `setpriv …`).
fn in_fresh_netns_via(inner: &str, wrapper: &[&str]) -> String {
    let ns = Netns::new("kpng-nl").expect("creating a namespace");
    let exe = std::env::current_exe().expect("the test binary's path");
    let args = wrapper.iter().map(OsStr::new).chain([
        exe.as_os_str(),
        OsStr::new("--exact"),
        OsStr::new(inner),
        OsStr::new("--ignored"),
        OsStr::new("--nocapture"),
        OsStr::new("--test-threads=1"),
    ]);
    let out = ns
        .command(args)
        .env(INNER, ns.name())
        .stdin(Stdio::null())
        .output()
        .expect("running the test binary in the namespace");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{inner} failed in namespace {}:\n{stdout}\n{stderr}",
        ns.name()
    );
    assert!(
        stdout.contains("1 passed"),
        "{inner} did not run in the namespace:\n{stdout}\n{stderr}"
    );
    stdout
}

/// Whether this is the re-executed binary inside a namespace (else an inner test must not
/// touch anything: it would be the host's ruleset).
fn inside_netns() -> bool {
    if std::env::var_os(INNER).is_some() {
        return true;
    }
    eprintln!("skipped: runs only inside the namespace its outer test creates");
    false
}

/// Declares the outer test `$outer`: as root, one at a time ([`SERIAL`]), it runs the
/// `#[ignore]`d test `$inner` in a fresh namespace ([`in_fresh_netns`]). Doc comments before
/// the name go to the test.
macro_rules! outer_test {
    ($(#[$attr:meta])* $outer:ident, $inner:ident) => {
        $(#[$attr])*
        #[test]
        fn $outer() {
            kpng_testkit::require_root!();
            let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
            in_fresh_netns(stringify!($inner));
        }
    };
}

// ---------------------------------------------------------------------------------------------
// nft helpers (inside the namespace)
// ---------------------------------------------------------------------------------------------

fn nft_stdin(script: &str) -> Result<String, String> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting nft");
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(script.as_bytes());
    }
    let out = child.wait_with_output().expect("waiting for nft");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn nft(script: &str) {
    if let Err(e) = nft_stdin(script) {
        let head: String = script.lines().take(40).collect::<Vec<_>>().join("\n");
        panic!("nft -f failed: {e}\nscript starts:\n{head}");
    }
}

fn nft_list(args: &[&str]) -> String {
    let out = Command::new("nft")
        .arg("list")
        .args(args)
        .output()
        .expect("running nft list");
    assert!(
        out.status.success(),
        "nft list {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `nft list set` or `nft list map`, whichever `set` is.
fn list_set(f: &str, table: &str, set: Set) -> String {
    let is_set = set.decl().data == Data::None;
    nft_list(&[if is_set { "set" } else { "map" }, f, table, set.name()])
}

fn fam_word(family: Family) -> &'static str {
    Fam(family).table_family()
}

fn static_config() -> StaticConfig {
    StaticConfig {
        masquerade_all: false,
        mark: 0x4000,
        affinity_mask: kpng_backend_nft::affinity::DEFAULT_CONNTRACK_MARK_MASK,
        local_match: None,
        non_local_match: None,
        nodeports_on_local_addresses: false,
    }
}

/// The skeleton of `table` plus every dynamic chain that `elements` jump to, as nft text.
fn table_script(family: Family, table: &str, elements: &[Element]) -> String {
    let fam = Fam(family);
    let f = fam.table_family();
    let mut s = format!("add table {f} {table}\ndelete table {f} {table}\n");
    s.push_str(&skeleton(fam, table, &static_config()));
    let mut chains: BTreeSet<DynamicChain> = elements
        .iter()
        .filter_map(|e| e.value?.dynamic_chain())
        .collect();
    // The tests also jump to these after the initial load.
    chains.insert(DynamicChain::Pick(PickKind::Cluster, 2));
    for chain in &chains {
        let name = chain.name();
        let _ = writeln!(s, "add chain {f} {table} {name}");
        for rule in chain.rules(fam, static_config().affinity_mask) {
            let _ = writeln!(s, "add rule {f} {table} {name} {rule}");
        }
    }
    s
}

/// `elements` as `add element` commands, the way the backend's text path writes them.
fn elements_script(family: Family, table: &str, elements: &[Element]) -> String {
    let f = fam_word(family);
    let mut sets: Vec<Set> = elements.iter().map(|e| e.set).collect();
    sets.sort();
    sets.dedup();
    let mut s = String::new();
    for set in sets {
        let _ = writeln!(s, "add element {f} {table} {} {{", set.name());
        for e in elements.iter().filter(|e| e.set == set) {
            let _ = write!(s, "\t{}", e.key);
            if let Some(c) = &e.comment {
                let _ = write!(s, " comment \"{}\"", c.replace('"', "'"));
            }
            if let Some(v) = &e.value {
                let _ = write!(s, " : {v}");
            }
            s.push_str(",\n");
        }
        s.push_str("}\n");
    }
    s
}

/// A listing with the elements of every set sorted one per line (hash sets list in hash
/// order, which differs between two tables), `expires …` dropped, and the table renamed.
fn normalized(listing: &str, table: &str) -> String {
    // The marker chain's comment carries a hash of the skeleton, which includes the table's
    // name.
    let listing: String = listing
        .lines()
        .filter(|l| !l.trim_start().starts_with("comment \"kpng layout "))
        .map(|l| format!("{l}\n"))
        .collect();
    let mut text = listing.replace(&format!(" {table} {{"), " TABLE {");
    let mut out = String::new();
    while let Some(start) = text.find("elements = {") {
        let open = start + "elements = {".len();
        let close = open + text[open..].find('}').expect("closing brace");
        out.push_str(&text[..open]);
        let mut elems: Vec<String> = split_elements(&text[open..close])
            .into_iter()
            .map(|e| drop_expires(e.trim()))
            .filter(|e| !e.is_empty())
            .collect();
        elems.sort();
        for e in elems {
            out.push_str("\n\t");
            out.push_str(&e);
        }
        out.push('\n');
        text = text[close..].to_string();
    }
    out.push_str(&text);
    out
}

/// Splits an element list on the commas that are not inside a quoted comment.
fn split_elements(list: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut quoted = false;
    for c in list.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.push(String::new());
                continue;
            }
            _ => {}
        }
        if let Some(last) = out.last_mut() {
            last.push(c);
        }
    }
    out.into_iter()
        .map(|e| e.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

fn drop_expires(e: &str) -> String {
    let mut words: Vec<&str> = Vec::new();
    let mut it = e.split(' ');
    while let Some(w) = it.next() {
        if w == "expires" {
            it.next();
            continue;
        }
        words.push(w);
    }
    words.join(" ")
}

// ---------------------------------------------------------------------------------------------
// Elements
// ---------------------------------------------------------------------------------------------

fn el(set: Set, key: Key, value: Option<Value>, comment: Option<&str>) -> Element {
    Element {
        set,
        key,
        value,
        comment: comment.map(Into::into),
    }
}

/// An `affinity-bits-*` element: the entry key with one bit of its affinity id.
fn affinity_bit(set: Set, key: Key, bit: u32) -> Element {
    el(set, key.with_bit(bit).expect("an entry key"), None, None)
}

/// The TCP endpoint slots of cluster-policy VIPs.
const TCP_SLOTS: Set = Set::Endpoints(PickKind::Cluster, Protocol::Tcp);

/// The address of a VIP key.
fn vip_of(key: &Key) -> IpAddr {
    match key {
        Key::Vip(ip, _, _) => *ip,
        other => panic!("not a VIP: {other}"),
    }
}

fn goto(chain: FixedChain) -> Option<Value> {
    Some(Value::Verdict(Verdict::goto(chain)))
}

fn goto_pick(kind: PickKind, n: u32) -> Option<Value> {
    Some(Value::Verdict(Verdict::Goto(Chain::Dynamic(
        DynamicChain::Pick(kind, n),
    ))))
}

fn verdict(v: Verdict) -> Option<Value> {
    Some(Value::Verdict(v))
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("an address")
}

fn net(s: &str) -> IpNet {
    s.parse().expect("a prefix")
}

/// At least one element of every set and map of the skeleton, with every kind of key and
/// value: ranges, open ranges, verdicts with and without chains, comments.
fn every_set_type(family: Family) -> Vec<Element> {
    use PickKind::{Cluster, Local, NodePortCluster, NodePortLocal};
    use Protocol::{Sctp, Tcp, Udp};
    let (vip, vip2, ep, ep2, client, lb, range, cidr, cidr_single, cidr_open, node) = match family {
        Family::V4 => (
            "10.97.0.10",
            "10.97.0.11",
            "10.244.1.2",
            "10.244.2.2",
            "192.168.100.10",
            "198.51.100.20",
            "192.168.100.0/24",
            "10.96.0.0/16",
            "10.200.0.1/32",
            "240.0.0.0/4",
            "192.168.100.1",
        ),
        Family::V6 => (
            "fd00:97::a",
            "fd00:97::b",
            "fd00:244:1::2",
            "fd00:244:2::2",
            "fd00:100::10",
            "2001:db8:52::20",
            "fd00:100::/64",
            "fd00:96::/112",
            "fd00:200::1/128",
            "ffff::/16",
            "fd00:100::1",
        ),
    };
    let (vip, vip2, ep, ep2, client, lb, node) = (
        ip(vip),
        ip(vip2),
        ip(ep),
        ip(ep2),
        ip(client),
        ip(lb),
        ip(node),
    );
    let mut v = vec![
        el(Set::ClusterIps, Key::Addr(vip), None, None),
        el(Set::ClusterIps, Key::Addr(vip2), None, None),
        el(Set::NodeportIps, Key::Addr(node), None, None),
        el(Set::ServiceCidrs, Key::Net(net(cidr)), None, None),
        el(Set::ServiceCidrs, Key::Net(net(cidr_single)), None, None),
        el(Set::ServiceCidrs, Key::Net(net(cidr_open)), None, None),
        el(Set::FirewallIps, Key::Vip(lb, Tcp, 443), None, None),
        el(
            Set::FirewallAllow,
            Key::VipSource(lb, Tcp, 443, Source::Net(net(range))),
            None,
            Some("a \"quoted\" comment"),
        ),
        el(
            Set::FirewallAllow,
            Key::VipSource(lb, Tcp, 443, Source::Addr(lb)),
            None,
            None,
        ),
        el(
            Set::HairpinConnections,
            Key::Hairpin(ep, ep, Tcp, 8080),
            None,
            None,
        ),
        el(
            Set::HairpinConnections,
            Key::Hairpin(ep, ep, Sctp, 9),
            None,
            None,
        ),
        el(
            Set::AffinityValid,
            Key::MarkEndpoint(0x0100_3000, ep, 8080),
            None,
            None,
        ),
        el(
            Set::ServiceIps,
            Key::Vip(vip, Tcp, 80),
            goto_pick(Cluster, 3),
            Some("default/web:http"),
        ),
        el(
            Set::ServiceIps,
            Key::Vip(vip, Udp, 53),
            goto(FixedChain::AffinityCluster),
            None,
        ),
        el(
            Set::ServiceIps,
            Key::Vip(lb, Tcp, 443),
            goto(FixedChain::ExternalLocal),
            Some("shop/storefront:https"),
        ),
        el(
            Set::ServiceNodeports,
            Key::NodePort(Tcp, 30080),
            goto(FixedChain::NodeportExternalClusterAffinity),
            Some("shop/cart:http"),
        ),
        el(
            Set::NoEndpointServices,
            Key::Vip(vip2, Tcp, 80),
            goto(FixedChain::Reject),
            None,
        ),
        el(
            Set::NoEndpointServices,
            Key::Vip(vip2, Tcp, 81),
            verdict(Verdict::Drop),
            None,
        ),
        el(
            Set::NoEndpointNodeports,
            Key::NodePort(Udp, 30081),
            verdict(Verdict::Drop),
            None,
        ),
        el(
            Set::NoEndpointNodeports,
            Key::NodePort(Tcp, 30082),
            verdict(Verdict::Accept),
            None,
        ),
        el(
            Set::AffinityTimeouts,
            Key::Mark(0x0100_3000),
            // This test's ports have no IPv6 affinity (written before the backend had it,
            // docs/nftables.md), so IPv6 jumps nowhere.
            match family {
                Family::V4 => verdict(Verdict::Goto(Chain::Dynamic(
                    DynamicChain::AffinityTimeout(600),
                ))),
                Family::V6 => verdict(Verdict::Drop),
            },
            None,
        ),
        el(
            Set::Pick(Cluster),
            Key::Vip(lb, Tcp, 443),
            goto_pick(Cluster, 2),
            None,
        ),
        el(
            Set::Pick(Local),
            Key::Vip(lb, Tcp, 443),
            goto_pick(Local, 1),
            None,
        ),
        el(
            Set::Pick(NodePortCluster),
            Key::NodePort(Tcp, 30080),
            goto_pick(NodePortCluster, 2),
            None,
        ),
        el(
            Set::Pick(NodePortLocal),
            Key::NodePort(Tcp, 30443),
            goto_pick(NodePortLocal, 1),
            None,
        ),
        el(
            Set::Endpoints(Local, Tcp),
            Key::VipSlot(lb, 443, 0),
            Some(Value::Endpoint(ep, 8443)),
            None,
        ),
        el(
            Set::Endpoints(Local, Udp),
            Key::VipSlot(vip, 53, 0),
            Some(Value::Endpoint(ep, 5353)),
            None,
        ),
        el(
            Set::Endpoints(Cluster, Sctp),
            Key::VipSlot(vip2, 9, 0),
            Some(Value::Endpoint(ep2, 9)),
            None,
        ),
        el(
            Set::Endpoints(Local, Sctp),
            Key::VipSlot(vip2, 9, 0),
            Some(Value::Endpoint(ep, 9)),
            None,
        ),
        el(
            Set::Endpoints(NodePortCluster, Tcp),
            Key::NodePortSlot(30080, 0),
            Some(Value::Endpoint(ep, 8080)),
            None,
        ),
        el(
            Set::Endpoints(NodePortCluster, Tcp),
            Key::NodePortSlot(30080, 1),
            Some(Value::Endpoint(ep2, 8080)),
            None,
        ),
        el(
            Set::Endpoints(NodePortCluster, Udp),
            Key::NodePortSlot(30081, 0),
            Some(Value::Endpoint(ep2, 53)),
            None,
        ),
        el(
            Set::Endpoints(NodePortCluster, Sctp),
            Key::NodePortSlot(30082, 0),
            Some(Value::Endpoint(ep2, 9)),
            None,
        ),
        el(
            Set::Endpoints(NodePortLocal, Tcp),
            Key::NodePortSlot(30443, 0),
            Some(Value::Endpoint(ep, 65535)),
            None,
        ),
        el(
            Set::Endpoints(NodePortLocal, Udp),
            Key::NodePortSlot(30444, 0),
            Some(Value::Endpoint(ep, 1)),
            None,
        ),
        el(
            Set::Endpoints(NodePortLocal, Sctp),
            Key::NodePortSlot(30445, 0),
            Some(Value::Endpoint(ep, 2)),
            None,
        ),
        affinity_bit(Set::AffinityBits(Cluster), Key::Vip(vip, Udp, 53), 0x1000),
        affinity_bit(Set::AffinityBits(Cluster), Key::Vip(vip, Udp, 53), 0x2000),
        affinity_bit(
            Set::AffinityBits(Cluster),
            Key::Vip(vip, Udp, 53),
            0x0100_0000,
        ),
        affinity_bit(Set::AffinityBits(Local), Key::Vip(lb, Tcp, 443), 0x4000),
        affinity_bit(
            Set::AffinityBits(Local),
            Key::Vip(lb, Tcp, 443),
            0x0100_0000,
        ),
        affinity_bit(
            Set::AffinityBits(NodePortCluster),
            Key::NodePort(Tcp, 30080),
            0x1000,
        ),
        affinity_bit(
            Set::AffinityBits(NodePortCluster),
            Key::NodePort(Tcp, 30080),
            0x2000,
        ),
        affinity_bit(
            Set::AffinityBits(NodePortCluster),
            Key::NodePort(Tcp, 30080),
            0x0100_0000,
        ),
        affinity_bit(
            Set::AffinityBits(NodePortLocal),
            Key::NodePort(Tcp, 30443),
            0x4000,
        ),
        affinity_bit(
            Set::AffinityBits(NodePortLocal),
            Key::NodePort(Tcp, 30443),
            0x0100_0000,
        ),
    ];
    // The dynamic affinity maps differ per family (see `Fam::affinity`).
    match family {
        Family::V4 => v.push(el(
            Set::Affinity,
            Key::ClientMark(client, 0x0100_3000),
            Some(Value::Endpoint(ep, 8080)),
            None,
        )),
        Family::V6 => {
            v.push(el(
                Set::AffinityAddr,
                Key::MarkHash(0x0100_3000, 2952585853),
                Some(Value::Addr(ep)),
                None,
            ));
            v.push(el(
                Set::AffinityPort,
                Key::MarkHash(0x0100_3000, 2952585853),
                Some(Value::Port(8080)),
                None,
            ));
        }
    }
    for slot in 0..3u16 {
        v.push(el(
            Set::Endpoints(Cluster, Udp),
            Key::VipSlot(vip, 53, u32::from(slot)),
            Some(Value::Endpoint(ep2, 53 + slot)),
            None,
        ));
        v.push(el(
            Set::Endpoints(Cluster, Tcp),
            Key::VipSlot(vip, 80, u32::from(slot)),
            Some(Value::Endpoint(ep, 8080 + slot)),
            None,
        ));
    }
    v
}

/// Service port `i` of a kube-proxy-like mix (60% ClusterIP, 20% NodePort, 20% LoadBalancer,
/// some with eTP Local, source ranges, affinity, or no endpoints), `endpoints` endpoints each.
fn service_port(i: u32, family: Family, endpoints: u32) -> ServicePort {
    let ip = |v4: u32, v6_net: u128| -> IpAddr {
        match family {
            Family::V4 => IpAddr::V4(Ipv4Addr::from(v4 + i)),
            Family::V6 => IpAddr::V6(Ipv6Addr::from(v6_net + u128::from(i))),
        }
    };
    let kind = i % 10;
    let lb = kind >= 8;
    let node_port = (kind >= 6).then(|| 20000 + (i % 40000) as u16);
    let no_endpoints = i % 50 == 7;
    let etp_local = lb && i % 20 == 9;
    let eps: Vec<Endpoint> = (0..if no_endpoints { 0 } else { endpoints })
        .map(|j| Endpoint {
            ip: match family {
                Family::V4 => IpAddr::V4(Ipv4Addr::from(0x0a80_0000 + i * endpoints + j)),
                Family::V6 => IpAddr::V6(Ipv6Addr::from(
                    0xfd00_0128_0000_0000_0000_0000_0000_0000u128 + u128::from(i * endpoints + j),
                )),
            },
            port: 8080,
            is_local: j == 0,
            ready: true,
            serving: true,
            terminating: false,
        })
        .collect();
    let local: Vec<Endpoint> = if etp_local {
        eps.iter().filter(|e| e.is_local).cloned().collect()
    } else {
        Vec::new()
    };
    let source_ranges: Vec<IpNet> = if lb && i % 40 == 8 {
        match family {
            Family::V4 => vec!["203.0.113.0/24", "192.168.100.0/24"],
            Family::V6 => vec!["2001:db8:113::/48", "fd00:100::/64"],
        }
        .into_iter()
        .map(|s| s.parse().expect("a CIDR"))
        .collect()
    } else {
        Vec::new()
    };
    ServicePort {
        key: PortKey {
            service: ServiceKey::new("bench", format!("s{i}")),
            port_name: "http".into(),
            protocol: if i % 7 == 3 {
                Protocol::Udp
            } else {
                Protocol::Tcp
            },
            family,
        },
        cluster_ip: ip(0x0a60_0001, 0xfd00_0096_0000_0000_0000_0000_0000_0001),
        port: 80,
        target_port: kpng_model::TargetPort::Number(80),
        node_port,
        external_ips: Vec::new(),
        load_balancer_ips: if lb {
            vec![ip(0xc633_0000, 0x2001_0db8_0051_0000_0000_0000_0000_0000)]
        } else {
            Vec::new()
        },
        source_ranges,
        // IPv4 affinity only in this test's data (it predates the backend's IPv6 affinity).
        session_affinity: (i % 20 == 1 && family == Family::V4).then_some(SessionAffinity {
            timeout_seconds: 10800,
        }),
        external_policy_local: etp_local,
        internal_policy_local: false,
        health_check_node_port: None,
        preserve_destination: false,
        has_any_endpoints: !no_endpoints,
        local_ready_endpoints: local.len() as u32,
        serving_endpoints: eps.iter().map(|e| e.addr()).collect(),
        cluster_endpoints: eps,
        local_endpoints: local,
    }
}

/// The distinct elements of `services` generated Service ports, as the backend's store holds
/// them.
fn generated(family: Family, services: u32, endpoints: u32) -> Vec<Element> {
    let mut store = ElementStore::new();
    let (mut all, mut index) = (Vec::new(), std::collections::HashMap::new());
    let node_ips: Vec<IpAddr> = match family {
        Family::V4 => vec!["192.168.100.1".parse().expect("ip")],
        Family::V6 => vec!["fd00:100::1".parse().expect("ip")],
    };
    let mut ids = kpng_backend_nft::affinity::AffinityIds::new(
        kpng_backend_nft::affinity::DEFAULT_CONNTRACK_MARK_MASK,
    );
    for i in 0..services {
        let sp = service_port(i, family, endpoints);
        let elements = port_elements(&sp, ids.ensure(i + 1).ok(), &node_ips);
        store.build(i + 1, elements, &mut all, &mut index);
    }
    all.sort();
    all
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

/// The first 20 lines that differ between the netlink listing `a` and the `nft -f` one `b`, a
/// line only one of them has included (shown as `(none)`): pairing them with `zip` stopped at
/// the shorter one, so a listing with extra trailing lines failed with an empty diff.
fn listing_differences(a: &str, b: &str) -> Vec<String> {
    let (a, b): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    (0..a.len().max(b.len()))
        .map(|i| (a.get(i).copied(), b.get(i).copied()))
        .filter(|(x, y)| x != y)
        .take(20)
        .map(|(x, y)| {
            format!(
                "netlink: {}\nnft -f:  {}",
                x.unwrap_or("(none)"),
                y.unwrap_or("(none)")
            )
        })
        .collect()
}

/// Listings that differ only by trailing lines are told apart by what those lines are.
#[test]
fn listing_differences_name_lines_only_one_side_has() {
    let cases: &[(&str, &str, &[&str])] = &[
        ("x\ny", "x\ny", &[]),
        ("x\ny", "x\nz", &["netlink: y\nnft -f:  z"]),
        ("x\ny\nextra", "x\ny", &["netlink: extra\nnft -f:  (none)"]),
        ("x", "x\nmissing", &["netlink: (none)\nnft -f:  missing"]),
    ];
    for (a, b, want) in cases {
        assert_eq!(listing_differences(a, b), *want, "{a:?} vs {b:?}");
    }
}

/// Declares the tables `kpng` and `kpngtext` for `elements`' sets and writes the elements to
/// the first over netlink and to the second as nft text: the two listings or dumps the
/// round-trip tests compare.
fn write_netlink_and_text(writer: &mut NetlinkWriter, family: Family, elements: &[Element]) {
    for table in ["kpng", "kpngtext"] {
        nft(&table_script(family, table, elements));
    }
    writer
        .apply(family, "kpng", &[], &[], elements)
        .expect("netlink add");
    nft(&elements_script(family, "kpngtext", elements));
}

/// [`every_set_type`] and `services` generated Services of `family` (3 endpoints each),
/// written as [`write_netlink_and_text`] writes them: the round-trip tests' elements.
fn write_every_set_type(writer: &mut NetlinkWriter, family: Family, services: u32) -> Vec<Element> {
    let mut elements = every_set_type(family);
    elements.extend(generated(family, services, 3));
    write_netlink_and_text(writer, family, &elements);
    elements
}

outer_test!(
    every_set_type_lists_like_nft_text,
    inner_every_set_type_lists_like_nft_text
);

#[test]
#[ignore = "run inside a namespace by every_set_type_lists_like_nft_text"]
fn inner_every_set_type_lists_like_nft_text() {
    if !inside_netns() {
        return;
    }
    let mut writer = NetlinkWriter::open().expect("opening the netlink socket");
    for family in Family::ALL {
        let f = fam_word(family);
        let elements = write_every_set_type(&mut writer, family, 400);
        let sets: BTreeSet<Set> = elements.iter().map(|e| e.set).collect();

        let via_netlink = nft_list(&["table", f, "kpng"]);
        let via_text = nft_list(&["table", f, "kpngtext"]);
        let (a, b) = (
            normalized(&via_netlink, "kpng"),
            normalized(&via_text, "kpngtext"),
        );
        if a != b {
            let diff = listing_differences(&a, &b);
            panic!("{f}: listings differ:\n{}", diff.join("\n"));
        }
        println!(
            "{f}: {} elements in {} sets/maps list identically through netlink and nft -f",
            elements.len(),
            sets.len()
        );
        // Every set and map of the skeleton got elements: name the ones that did not (or that
        // got elements without being declared) rather than dumping every covered set.
        let declared: BTreeSet<&str> = via_text
            .lines()
            .filter_map(|l| {
                let l = l.trim_start();
                l.strip_prefix("set ")
                    .or_else(|| l.strip_prefix("map "))
                    .and_then(|rest| rest.split_whitespace().next())
            })
            .collect();
        let covered: BTreeSet<&str> = sets.iter().map(|s| s.name()).collect();
        let uncovered: Vec<&&str> = declared.difference(&covered).collect();
        let undeclared: Vec<&&str> = covered.difference(&declared).collect();
        assert!(
            uncovered.is_empty() && undeclared.is_empty(),
            "{f}: sets/maps without elements in every_set_type: {uncovered:?}; \
             with elements but not declared: {undeclared:?}"
        );
    }
}

outer_test!(
    /// What a restart reads back from the kernel ([`ElementWriter::set_elements`]) hashes exactly
    /// like the elements written, whether they went over netlink or as nft text: every set and
    /// map, verdicts, values, comments, ranges. Else a restart over an unchanged table would
    /// delete and add what it holds (`src/diff_refill.rs`).
    every_set_type_reads_back_as_written,
    inner_every_set_type_reads_back_as_written
);

#[test]
#[ignore = "run inside a namespace by every_set_type_reads_back_as_written"]
fn inner_every_set_type_reads_back_as_written() {
    if !inside_netns() {
        return;
    }
    use netlink::content::Contents;
    let mut writer = NetlinkWriter::open().expect("opening the netlink socket");
    for family in Family::ALL {
        let f = fam_word(family);
        let elements = write_every_set_type(&mut writer, family, 50);
        let mut contents = Contents::new(family);
        for table in ["kpng", "kpngtext"] {
            for set in Set::owned(family) {
                let mut wanted = BTreeSet::new();
                for e in elements.iter().filter(|e| e.set == set) {
                    let (start, end) = contents.wanted(e).expect("encodes");
                    wanted.insert(start);
                    wanted.extend(end);
                }
                let mut held = BTreeSet::new();
                let mut odd = Vec::new();
                let read = writer.set_elements(family, table, set, &mut |e| {
                    if netlink::content::is_zero_end(e) {
                        return; // nft text's, before the first range
                    }
                    let h = contents.held(set, e);
                    if !wanted.contains(&h) {
                        odd.push(format!("{e:?}"));
                    }
                    held.insert(h);
                });
                assert!(read, "{f} {table} {set}: not read");
                assert!(
                    odd.is_empty() && held == wanted,
                    "{f} {table} {set}: {} held, {} written; held but not as written: {odd:?}",
                    held.len(),
                    wanted.len()
                );
            }
        }
        println!(
            "{f}: {} elements read back as written, over netlink and as nft text",
            elements.len()
        );
    }
}

outer_test!(replace_delete_and_flush, inner_replace_delete_and_flush);

#[test]
#[ignore = "run inside a namespace by replace_delete_and_flush"]
fn inner_replace_delete_and_flush() {
    if !inside_netns() {
        return;
    }
    let mut w = NetlinkWriter::open().expect("opening the netlink socket");
    for family in Family::ALL {
        let f = fam_word(family);
        let all = every_set_type(family);
        nft(&table_script(family, "kpng", &all));
        w.apply(family, "kpng", &[], &[], &all)
            .expect("initial add");
        // Adding the same elements again is a no-op, as with nft's `add element`.
        w.apply(family, "kpng", &[], &[], &all)
            .expect("re-adding identical elements");

        let svc = all
            .iter()
            .find(|e| e.set == Set::ServiceIps && e.value == goto_pick(PickKind::Cluster, 3))
            .expect("a service-ips element");
        let slot = all.iter().find(|e| e.set == TCP_SLOTS).expect("a slot");
        let new_ep = match family {
            Family::V4 => Value::Endpoint(ip("10.244.9.9"), 9999),
            Family::V6 => Value::Endpoint(ip("fd00:244:9::9"), 9999),
        };
        let changed = [
            el(
                Set::ServiceIps,
                svc.key,
                goto_pick(PickKind::Cluster, 2),
                Some("changed"),
            ),
            el(TCP_SLOTS, slot.key, Some(new_ep), None),
        ];
        w.apply(
            family,
            "kpng",
            &[],
            &[(Set::ServiceIps, svc.key), (TCP_SLOTS, slot.key)],
            &changed,
        )
        .expect("delete + add in one transaction");
        let map = list_set(f, "kpng", Set::ServiceIps);
        assert!(
            map.contains("comment \"changed\" : goto cluster-n2") && !map.contains("cluster-n3"),
            "{map}"
        );
        let map = list_set(f, "kpng", TCP_SLOTS);
        assert!(map.contains(&new_ep.to_string()), "{map}");

        // Deleting ranges: both ends of a one-field interval, KEY_END of a concatenation.
        let cidrs: Vec<&Element> = all.iter().filter(|e| e.set == Set::ServiceCidrs).collect();
        let allow: Vec<&Element> = all.iter().filter(|e| e.set == Set::FirewallAllow).collect();
        w.apply(
            family,
            "kpng",
            &[],
            &[
                (Set::ServiceCidrs, cidrs[0].key),
                (Set::ServiceCidrs, cidrs[2].key),
                (Set::FirewallAllow, allow[0].key),
            ],
            &[],
        )
        .expect("deleting ranges");
        let set = nft_list(&["set", f, "kpng", "service-cidrs"]);
        let single = cidrs[1].key.to_string();
        let single = single.split('/').next().expect("address");
        assert!(
            set.contains(&format!("elements = {{ {single} }}")),
            "only {single} is left: {set}"
        );
        let set = nft_list(&["set", f, "kpng", "firewall-allow"]);
        assert!(!set.contains('/'), "the CIDR is gone: {set}");
        assert_eq!(set.matches(" . tcp . 443 . ").count(), 1, "{set}");

        // Flush, and add in the same transaction.
        w.apply(
            family,
            "kpng",
            &[Set::ClusterIps, Set::ServiceIps, Set::ServiceCidrs],
            &[],
            &[el(Set::ClusterIps, Key::Addr(vip_of(&svc.key)), None, None)],
        )
        .expect("flush");
        for set in [Set::ServiceIps, Set::ServiceCidrs] {
            let l = list_set(f, "kpng", set);
            assert!(!l.contains("elements"), "{set:?} flushed: {l}");
        }
        let l = list_set(f, "kpng", Set::ClusterIps);
        assert_eq!(l.matches(',').count(), 0, "one element left: {l}");
        assert!(l.contains("elements = {"), "{l}");
        println!("{f}: replace, range deletes and flush ok");
    }
}

outer_test!(
    errors_name_set_and_element_and_apply_nothing,
    inner_errors_name_set_and_element_and_apply_nothing
);

#[test]
#[ignore = "run inside a namespace by errors_name_set_and_element_and_apply_nothing"]
fn inner_errors_name_set_and_element_and_apply_nothing() {
    if !inside_netns() {
        return;
    }
    let mut w = NetlinkWriter::open().expect("opening the netlink socket");
    let family = Family::V4;
    let all = every_set_type(family);
    nft(&table_script(family, "kpng", &all));
    nft("table ip partial {\n\tset cluster-ips { type ipv4_addr; }\n}\n");

    // A set missing from the table: the set is named, and nothing of the batch is applied
    // (the cluster-ips message before it was fine).
    let adds = [
        el(Set::ClusterIps, Key::Addr(ip("10.0.0.1")), None, None),
        el(Set::ClusterIps, Key::Addr(ip("10.0.0.2")), None, None),
        el(Set::NodeportIps, Key::Addr(ip("192.168.1.1")), None, None),
    ];
    let err = w
        .apply(family, "partial", &[], &[], &adds)
        .expect_err("nodeport-ips does not exist");
    println!("missing set: {err}");
    match &err {
        NetlinkError::Rejected {
            operation,
            set,
            errno,
            ..
        } => {
            assert_eq!(*operation, Operation::Add);
            assert_eq!(set.as_deref(), Some("nodeport-ips"));
            assert_eq!(*errno, libc::ENOENT);
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert!(err.to_string().contains("nodeport-ips"), "{err}");
    let l = nft_list(&["set", "ip", "partial", "cluster-ips"]);
    assert!(!l.contains("elements"), "nothing applied: {l}");

    // A missing table: the error says so.
    let err = w
        .apply(family, "nosuchtable", &[], &[], &adds)
        .expect_err("no such table");
    println!("missing table: {err}");
    assert!(err.to_string().contains("table `nosuchtable`"), "{err}");

    // An element deep inside a large message: the kernel points at it (extended ACK).
    let mut adds: Vec<Element> = (0..3000u32)
        .map(|i| {
            el(
                TCP_SLOTS,
                Key::VipSlot(IpAddr::V4(Ipv4Addr::from(0x0a60_1000 + i)), 80, 0),
                Some(Value::Endpoint(ip("10.244.1.2"), 8080)),
                None,
            )
        })
        .collect();
    adds.insert(
        1777,
        el(
            Set::ServiceIps,
            Key::Vip(ip("10.96.5.5"), Protocol::Tcp, 80),
            goto_pick(PickKind::Local, 99),
            None,
        ),
    );
    for i in 0..1500u32 {
        adds.push(el(
            Set::ServiceIps,
            Key::Vip(
                IpAddr::V4(Ipv4Addr::from(0x0a60_2000 + i)),
                Protocol::Tcp,
                1000 + i as u16,
            ),
            goto_pick(PickKind::Cluster, 2),
            None,
        ));
    }
    let err = w
        .apply(family, "kpng", &[], &[], &adds)
        .expect_err("the chain does not exist");
    println!("bad element: {err}");
    let NetlinkError::Rejected { set, element, .. } = &err else {
        panic!("unexpected error {err:?}")
    };
    assert_eq!(set.as_deref(), Some("service-ips"));
    assert_eq!(
        element.as_deref(),
        Some("10.96.5.5 . tcp . 80 : goto local-n99")
    );
    assert!(
        !nft_list(&["map", "ip", "kpng", "cluster-endpoints-tcp"]).contains("elements"),
        "nothing applied"
    );

    // A value change without deleting first: EEXIST, naming the element.
    w.apply(family, "kpng", &[], &[], &all)
        .expect("initial add");
    let svc = all
        .iter()
        .find(|e| e.set == Set::ServiceIps)
        .expect("a service");
    let err = w
        .apply(
            family,
            "kpng",
            &[],
            &[],
            &[
                el(Set::ClusterIps, Key::Addr(ip("10.96.77.77")), None, None),
                el(Set::ServiceIps, svc.key, verdict(Verdict::Drop), None),
            ],
        )
        .expect_err("a different value for an existing key");
    println!("clash: {err}");
    assert!(err.to_string().contains(&svc.key.to_string()), "{err}");
    assert!(!nft_list(&["set", "ip", "kpng", "cluster-ips"]).contains("10.96.77.77"));

    // Deleting what is not there: ENOENT, naming the element; the flush before it is undone.
    let err = w
        .apply(
            family,
            "kpng",
            &[Set::ClusterIps],
            &[(TCP_SLOTS, Key::VipSlot(ip("10.1.2.3"), 1, 0))],
            &[],
        )
        .expect_err("no such element");
    println!("missing element: {err}");
    let NetlinkError::Rejected {
        operation, element, ..
    } = &err
    else {
        panic!("unexpected error {err:?}")
    };
    assert_eq!(*operation, Operation::Delete);
    assert_eq!(element.as_deref(), Some("10.1.2.3 . 1 . 0"));
    assert!(nft_list(&["set", "ip", "kpng", "cluster-ips"]).contains("elements"));

    // The socket is still usable after errors.
    w.apply(
        family,
        "kpng",
        &[],
        &[],
        &[el(
            Set::ClusterIps,
            Key::Addr(ip("10.96.77.78")),
            None,
            None,
        )],
    )
    .expect("works after errors");
    assert!(nft_list(&["set", "ip", "kpng", "cluster-ips"]).contains("10.96.77.78"));
}

outer_test!(
    interval_sets_written_over_netlink_match_packets,
    inner_interval_sets_written_over_netlink_match_packets
);

/// The rbtree (`service-cidrs`) and pipapo (`firewall-allow`) elements written over netlink
/// match packets as intended, through the skeleton's own output-hook rules: a UDP datagram the
/// ruleset drops makes `send_to` fail with `EPERM`. nft adds a leading "interval end" element at
/// 0 to an empty one-field interval set; the writer does not, and addresses below the first
/// range show that nothing depends on it.
#[test]
#[ignore = "run inside a namespace by interval_sets_written_over_netlink_match_packets"]
fn inner_interval_sets_written_over_netlink_match_packets() {
    if !inside_netns() {
        return;
    }
    for cmd in [
        "link add v0 type veth peer name v1",
        "addr add 192.168.100.5/24 dev v0",
        "addr add 10.50.0.5/32 dev v0",
        "link set v1 up",
        "link set v0 up",
        "route add default dev v0",
    ] {
        let ok = Command::new("ip")
            .args(cmd.split(' '))
            .status()
            .expect("running ip");
        assert!(ok.success(), "ip {cmd}");
    }
    let lb = ip("198.51.100.20");
    let allow = Key::VipSource(lb, Protocol::Udp, 443, Source::Net(net("192.168.100.0/24")));
    let adds = [
        el(Set::ServiceCidrs, Key::Net(net("10.96.0.0/16")), None, None),
        el(
            Set::ServiceCidrs,
            Key::Net(net("10.200.0.1/32")),
            None,
            None,
        ),
        el(
            Set::FirewallIps,
            Key::Vip(lb, Protocol::Udp, 443),
            None,
            None,
        ),
        el(Set::FirewallAllow, allow, None, None),
    ];
    nft(&table_script(Family::V4, "kpng", &adds));
    let mut w = NetlinkWriter::open().expect("opening the netlink socket");
    w.apply(Family::V4, "kpng", &[], &[], &adds).expect("add");

    let send = |from: &str, to: &str| -> bool {
        let sock = std::net::UdpSocket::bind((from, 0)).expect("binding");
        match sock.send_to(b"x", to) {
            Ok(_) => true,
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => false,
            Err(e) => panic!("sending {from} -> {to}: {e}"),
        }
    };
    let cases = [
        ("192.168.100.5", "1.1.1.1:9", true),
        ("192.168.100.5", "10.95.255.255:9", true),
        ("192.168.100.5", "10.96.0.0:9", false),
        ("192.168.100.5", "10.96.5.5:9", false),
        ("192.168.100.5", "10.96.255.255:9", false),
        ("192.168.100.5", "10.97.0.0:9", true),
        ("192.168.100.5", "10.200.0.0:9", true),
        ("192.168.100.5", "10.200.0.1:9", false),
        ("192.168.100.5", "10.200.0.2:9", true),
        ("192.168.100.5", "198.51.100.20:443", true),
        ("10.50.0.5", "198.51.100.20:443", false),
        ("10.50.0.5", "198.51.100.20:444", true),
    ];
    for (from, to, passes) in cases {
        assert_eq!(send(from, to), passes, "{from} -> {to}");
    }
    // Deleting the ranges over netlink lets the traffic through.
    w.apply(
        Family::V4,
        "kpng",
        &[],
        &[
            (Set::ServiceCidrs, Key::Net(net("10.96.0.0/16"))),
            (Set::FirewallAllow, allow),
        ],
        &[],
    )
    .expect("delete");
    assert!(send("192.168.100.5", "10.96.5.5:9"));
    assert!(
        !send("192.168.100.5", "198.51.100.20:443"),
        "no source allowed"
    );
    println!("service-cidrs and firewall-allow match packets as written");
}

#[test]
fn unprivileged_batch_is_refused_as_a_whole() {
    kpng_testkit::require_root!();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // As `nobody`: no CAP_NET_ADMIN, so nfnetlink refuses the batch at BATCH_BEGIN.
    in_fresh_netns_via(
        "inner_unprivileged_batch_is_refused_as_a_whole",
        &[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ],
    );
}

#[test]
#[ignore = "run inside a namespace by unprivileged_batch_is_refused_as_a_whole"]
fn inner_unprivileged_batch_is_refused_as_a_whole() {
    if !inside_netns() {
        return;
    }
    let mut w = NetlinkWriter::open().expect("opening needs no privilege");
    let adds = [el(Set::ClusterIps, Key::Addr(ip("10.0.0.1")), None, None)];
    let err = w
        .apply(Family::V4, "kpng", &[], &[], &adds)
        .expect_err("no CAP_NET_ADMIN");
    println!("unprivileged: {err}");
    match err {
        NetlinkError::Rejected {
            operation: Operation::Batch,
            set: None,
            errno,
            ..
        } => assert_eq!(errno, libc::EPERM),
        other => panic!("unexpected error {other:?}"),
    }
}

outer_test!(
    /// kpng's anchor tables (`kpng_netfilter::anchor`) of three kpngs with the same pid in one
    /// namespace (two containers' pid 1 and the upgrade of one of them; here three holds by one
    /// process, which is what the kernel sees): each holds its own. Until 2026-12-07 the fallback
    /// was `kpng-anchor-<pid>`, and the third found it taken and got no anchor.
    anchors_of_kpngs_sharing_a_pid_are_all_held,
    inner_anchors_of_kpngs_sharing_a_pid_are_all_held
);

#[test]
#[ignore = "run inside a namespace by anchors_of_kpngs_sharing_a_pid_are_all_held"]
fn inner_anchors_of_kpngs_sharing_a_pid_are_all_held() {
    use kpng_netfilter::anchor::{Anchor, is_anchor_table};
    if !inside_netns() {
        return;
    }
    let families = [Family::V4, Family::V6];
    let anchors: Vec<Anchor> = (0..3)
        .map(|i| Anchor::hold(&families).unwrap_or_else(|e| panic!("anchor {i}: {e}")))
        .collect();
    let held: BTreeSet<String> = anchors
        .iter()
        .flat_map(|a| a.tables().iter().cloned())
        .collect();
    println!("held: {held:?}");
    assert_eq!(held.len(), 6, "{held:?}");
    let listed = nft_list(&["tables"]);
    for table in &held {
        let (_, name) = table.split_once(' ').expect("family name");
        assert!(is_anchor_table(name), "{table}");
        assert!(
            listed.lines().any(|l| l.trim() == format!("table {table}")),
            "{table} not in:\n{listed}"
        );
    }
    // Each goes with its holder.
    drop(anchors);
    let listed = nft_list(&["tables"]);
    assert!(!listed.contains("kpng-anchor"), "{listed}");
}

/// One Service of four endpoints, the fourth `last` (nft's YAML as `kpng-source-file` reads
/// it).
fn one_service(last: u32) -> String {
    format!(
        "kind: Node
metadata: {{name: node1}}
status: {{addresses: [{{type: InternalIP, address: 192.168.100.1}}]}}
---
kind: Service
metadata: {{namespace: ns, name: web}}
spec: {{clusterIP: 10.96.0.10, ports: [{{name: http, port: 80}}]}}
---
kind: EndpointSlice
metadata: {{namespace: ns, name: web-1, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv4
ports: [{{name: http, port: 8080}}]
endpoints:
- {{addresses: [10.244.1.2], nodeName: node1}}
- {{addresses: [10.244.1.3], nodeName: node1}}
- {{addresses: [10.244.1.4], nodeName: node1}}
- {{addresses: [10.244.2.{last}], nodeName: node2}}
"
    )
}

/// The backend's syncs, as kpng runs it (`--nft-exec auto`: elements over netlink, watching
/// the kernel), open no netlink socket once the first has run: the generation id read before
/// and after each sync goes over a socket kept for the process's life. Until 2026-12-07 each
/// read opened (and closed) a socket of its own, and the close after a sync that deleted an
/// element waited for an RCU grace period: one change took 8–14 ms instead of ~1 ms at 1k
/// Services (docs/benchmarks.md). Counted, not timed, so a loaded machine cannot flake it.
#[test]
fn backend_syncs_open_no_netlink_socket() {
    kpng_testkit::require_root!();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    in_fresh_netns("inner_backend_syncs_open_no_netlink_socket");
}

#[test]
#[ignore = "run inside a namespace by backend_syncs_open_no_netlink_socket"]
fn inner_backend_syncs_open_no_netlink_socket() {
    use kpng_backend::{Backend, SyncRequest, TamperAlarm};
    use kpng_backend_nft::NftBackend;
    use kpng_backend_nft::exec::Auto;
    use kpng_model::{Diff, Event, Kind, Model, ModelConfig};
    use kpng_netfilter::socket::Socket;
    if !inside_netns() {
        return;
    }
    let objects = |last: u32| {
        kpng_source_file::parse_manifests(&one_service(last))
            .expect("manifest parses")
            .objects
    };
    let mut model = Model::new(ModelConfig {
        node_name: "node1".into(),
        ..ModelConfig::default()
    });
    let kinds = vec![Kind::Service, Kind::EndpointSlice, Kind::Node];
    let out = model.apply(Event::Replace {
        kinds: kinds.clone(),
        objects: objects(2),
    });
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    let config = kpng_backend_nft::NftConfig {
        families: vec![Family::V4],
        ..Default::default()
    };
    let writer = NetlinkWriter::open().expect("netlink writer");
    let mut backend = NftBackend::new(config, Box::new(Auto::new("nft")))
        .watching_kernel()
        .with_netlink(writer);
    let alarms = std::sync::Arc::new(Mutex::new(Vec::new()));
    let sink = alarms.clone();
    let alarm = TamperAlarm::new(move |t| {
        if let Ok(mut v) = sink.lock() {
            v.push(t.what);
        }
    });
    assert!(backend.watch_tampering(alarm).expect("monitor"));
    let full = Diff::full(model.snapshot());
    backend
        .sync(&SyncRequest {
            diff: &full,
            snapshot: model.snapshot(),
            full: true,
        })
        .expect("full sync");
    // The first change opens what stays open (the generation reader's socket).
    let mut change = |last: u32| {
        let out = model.apply(Event::Replace {
            kinds: kinds.clone(),
            objects: objects(last),
        });
        assert!(!out.diff.is_empty(), "endpoint {last} changed nothing");
        backend
            .sync(&SyncRequest {
                diff: &out.diff,
                snapshot: model.snapshot(),
                full: false,
            })
            .expect("partial sync");
    };
    change(3);
    let before = Socket::opened_on_this_thread();
    const CHANGES: u32 = 10;
    for i in 0..CHANGES {
        // Each replaces the fourth endpoint: elements deleted and added.
        change(4 + i);
    }
    let opened = Socket::opened_on_this_thread() - before;
    println!("netlink sockets opened by {CHANGES} one-endpoint syncs: {opened}");
    assert_eq!(
        opened, 0,
        "each sync must reuse the backend's sockets: a socket closed after a sync that deleted \
         elements waits for an RCU grace period"
    );
    let listed = list_set(
        "ip",
        "kpng",
        Set::Endpoints(PickKind::Cluster, Protocol::Tcp),
    );
    assert!(listed.contains("10.244.2.13"), "{listed}");
    // kpng's own commits are not taken for someone else's.
    let alarms = alarms.lock().map(|v| v.clone()).unwrap_or_default();
    assert!(alarms.is_empty(), "{alarms:?}");
}

// ---------------------------------------------------------------------------------------------
// Measurements
// ---------------------------------------------------------------------------------------------

/// Services of the full-load measurement (`KPNG_NETLINK_BENCH_SERVICES` overrides).
fn bench_services() -> u32 {
    std::env::var("KPNG_NETLINK_BENCH_SERVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30_000)
}

/// User and system CPU seconds of this process and of its waited-for children.
fn cpu_times() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // After ")": state is index 0, so utime (field 14) is 11, stime 12, cutime 13, cstime 14.
    let tick = 100.0;
    let get = |i: usize| f.get(i).copied().unwrap_or(0.0) / tick;
    (get(11) + get(13), get(12) + get(14))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The small transaction: two endpoint slots change value (delete + add each).
fn small_change(all: &[Element], round: usize) -> (Vec<(Set, Key)>, Vec<Element>) {
    let slots: Vec<&Element> = all.iter().filter(|e| e.set == TCP_SLOTS).take(2).collect();
    let deletes = slots.iter().map(|e| (e.set, e.key)).collect();
    let adds = slots
        .iter()
        .map(|e| {
            el(
                e.set,
                e.key,
                Some(Value::Endpoint(
                    IpAddr::V4(Ipv4Addr::new(10, 250, 0, (round % 200 + 1) as u8)),
                    9000 + round as u16,
                )),
                None,
            )
        })
        .collect();
    (deletes, adds)
}

fn summarize(label: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let mean = samples.iter().sum::<Duration>() / samples.len().max(1) as u32;
    println!(
        "RESULT {label}: small transaction (delete+add of 2 elements) on the loaded table: \
         median {:.2} ms, mean {:.2} ms, max {:.2} ms over {} runs",
        ms(samples[samples.len() / 2]),
        ms(mean),
        ms(samples[samples.len() - 1]),
        samples.len()
    );
}

#[test]
fn full_load_timing() {
    kpng_testkit::require_root!();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut results = Vec::new();
    for inner in [
        "inner_load_netlink",
        "inner_load_libnftables",
        "inner_load_nft_command",
    ] {
        let out = in_fresh_netns(inner);
        results.extend(
            out.lines()
                .filter(|l| l.starts_with("RESULT"))
                .map(str::to_string),
        );
    }
    println!("\n{}", results.join("\n"));
}

/// Loads the skeleton and generates the elements (not timed).
fn bench_setup() -> Vec<Element> {
    let services = bench_services();
    let t = Instant::now();
    let all = generated(Family::V4, services, 4);
    println!(
        "{services} services x 4 endpoints: {} elements, generated in {:.0} ms",
        all.len(),
        ms(t.elapsed())
    );
    nft(&table_script(Family::V4, "kpng", &all));
    all
}

#[test]
#[ignore = "run inside a namespace by full_load_timing"]
fn inner_load_netlink() {
    if !inside_netns() {
        return;
    }
    let all = bench_setup();
    let (u0, s0) = cpu_times();
    let t = Instant::now();
    let mut w = NetlinkWriter::open().expect("opening the netlink socket");
    w.apply(Family::V4, "kpng", &[], &[], &all)
        .expect("full load");
    let took = t.elapsed();
    let (u1, s1) = cpu_times();
    println!(
        "RESULT netlink: full load of {} elements: {:.0} ms (user {:.2} s, sys {:.2} s)",
        all.len(),
        ms(took),
        u1 - u0,
        s1 - s0
    );
    let listed = nft_list(&["map", "ip", "kpng", "cluster-endpoints-tcp"]);
    assert!(listed.matches(" : ").count() > 1000);
    let mut samples = Vec::new();
    for round in 0..200 {
        let (deletes, adds) = small_change(&all, round + 1);
        let t = Instant::now();
        w.apply(Family::V4, "kpng", &[], &deletes, &adds)
            .expect("small transaction");
        samples.push(t.elapsed());
    }
    // The last round's values are in place (each round replaced the previous one's).
    let listed = nft_list(&["map", "ip", "kpng", "cluster-endpoints-tcp"]);
    assert_eq!(
        listed.matches(" : 10.250.0.1 . 9200").count(),
        2,
        "last round applied"
    );
    summarize("netlink", samples);
}

#[test]
#[ignore = "run inside a namespace by full_load_timing"]
fn inner_load_libnftables() {
    if !inside_netns() {
        return;
    }
    let all = bench_setup();
    let script = elements_script(Family::V4, "kpng", &all);
    let (u0, s0) = cpu_times();
    let t = Instant::now();
    let mut lib = LibNftables::open().expect("libnftables");
    lib.run(&script).expect("full load");
    let took = t.elapsed();
    let (u1, s1) = cpu_times();
    println!(
        "RESULT libnftables: full load of {} elements: {:.0} ms (user {:.2} s, sys {:.2} s)",
        all.len(),
        ms(took),
        u1 - u0,
        s1 - s0
    );
    let mut samples = Vec::new();
    for round in 0..200 {
        let text = small_script(&all, round + 1);
        let t = Instant::now();
        lib.run(&text).expect("small transaction");
        samples.push(t.elapsed());
    }
    summarize("libnftables", samples);
}

fn small_script(all: &[Element], round: usize) -> String {
    let (deletes, adds) = small_change(all, round);
    let mut s = String::new();
    for (set, key) in &deletes {
        let _ = writeln!(s, "delete element ip kpng {set} {{ {key} }}");
    }
    s.push_str(&elements_script(Family::V4, "kpng", &adds));
    s
}

#[test]
#[ignore = "run inside a namespace by full_load_timing"]
fn inner_load_nft_command() {
    if !inside_netns() {
        return;
    }
    let all = bench_setup();
    let script = elements_script(Family::V4, "kpng", &all);
    let (u0, s0) = cpu_times();
    let t = Instant::now();
    nft(&script);
    let took = t.elapsed();
    let (u1, s1) = cpu_times();
    println!(
        "RESULT nft -f: full load of {} elements: {:.0} ms (user {:.2} s, sys {:.2} s)",
        all.len(),
        ms(took),
        u1 - u0,
        s1 - s0
    );
    let mut samples = Vec::new();
    for round in 0..50 {
        let text = small_script(&all, round + 1);
        let t = Instant::now();
        nft(&text);
        samples.push(t.elapsed());
    }
    summarize("nft -f", samples);
}

outer_test!(
    the_start_up_probe_reads_the_skeleton_id_without_nft,
    inner_the_start_up_probe_reads_the_skeleton_id_without_nft
);

#[test]
#[ignore = "run inside a namespace by the_start_up_probe_reads_the_skeleton_id_without_nft"]
fn inner_the_start_up_probe_reads_the_skeleton_id_without_nft() {
    if !inside_netns() {
        return;
    }
    use kpng_backend_nft::ruleset::skeleton_marker;
    for family in Family::ALL {
        let f = fam_word(family);
        assert_eq!(
            netlink::probe_with_netlink(family, "kpng"),
            netlink::ProbedTable::Absent,
            "{f}: no table yet"
        );
        let elements = generated(family, 2000, 4);
        nft(&table_script(family, "kpng", &elements));
        let mut writer = NetlinkWriter::open().expect("opening the netlink socket");
        writer
            .apply(family, "kpng", &[], &[], &elements)
            .expect("netlink add");
        // The marker nft prints is the one the probe reads; a table of another name, or of
        // the other family, is not ours.
        let listed = nft_list(&["table", f, "kpng"]);
        let expected = skeleton_marker(&listed).expect("the skeleton has a marker");
        assert!(expected.contains(" skeleton "), "{expected}");
        assert_eq!(
            netlink::probe_with_netlink(family, "kpng"),
            netlink::ProbedTable::Present(expected.to_string()),
            "{f}"
        );
        assert_eq!(
            netlink::probe_with_netlink(family, "kpngx"),
            netlink::ProbedTable::Absent
        );
        nft(&format!("table {f} plain {{ }}\n"));
        assert_eq!(
            netlink::probe_with_netlink(family, "plain"),
            netlink::ProbedTable::Present(String::new()),
            "{f}: a table without the marker chain has no skeleton id"
        );
        let started = Instant::now();
        let tables = kpng_netfilter_tables();
        println!(
            "{f}: {} tables listed over netlink in {:?} next to {} elements",
            tables.len(),
            started.elapsed(),
            elements.len()
        );
        assert!(tables.contains(&(f.to_string(), "kpng".to_string())));
    }
}

/// Every table as (family, name), through the dump the probe and `kpng cleanup` use.
fn kpng_netfilter_tables() -> Vec<(String, String)> {
    kpng_netfilter::tables::list_tables()
        .expect("a table dump")
        .into_iter()
        .map(|t| (t.family.to_string(), t.name))
        .collect()
}

outer_test!(
    /// Load-balancer ports whose source ranges hold the node and the ingress IP (the node's
    /// subnet, `/0`) or overlap: the kernel takes their `firewall-allow` elements through both
    /// paths. The ingress IP allowed beside the range holding it was refused (`File exists`), and
    /// with it every transaction of the node.
    source_ranges_holding_the_ingress_ip_are_accepted_by_the_kernel,
    inner_source_ranges_holding_the_ingress_ip_are_accepted_by_the_kernel
);

#[test]
#[ignore = "run inside a namespace by source_ranges_holding_the_ingress_ip_are_accepted_by_the_kernel"]
fn inner_source_ranges_holding_the_ingress_ip_are_accepted_by_the_kernel() {
    if !inside_netns() {
        return;
    }
    let mut writer = NetlinkWriter::open().expect("opening the netlink socket");
    for family in Family::ALL {
        let (node, ingress, cases): (&str, &str, [&[&str]; 3]) = match family {
            Family::V4 => (
                "192.168.100.1",
                "192.168.100.80",
                [
                    &["192.168.100.0/24"],
                    &["0.0.0.0/0"],
                    &["192.168.0.0/16", "192.168.100.0/24", "192.168.100.80/32"],
                ],
            ),
            Family::V6 => (
                "fd00:100::1",
                "fd00:100::80",
                [
                    &["fd00:100::/64"],
                    &["::/0"],
                    &["fd00::/16", "fd00:100::/64", "fd00:100::80/128"],
                ],
            ),
        };
        let mut elements = Vec::new();
        for (i, ranges) in cases.iter().enumerate() {
            let mut sp = service_port(8, family, 1);
            sp.key.service = ServiceKey::new("t", format!("lb{i}"));
            sp.port = 80 + i as u16;
            sp.load_balancer_ips = vec![ip(ingress)];
            sp.source_ranges = ranges.iter().map(|r| net(r)).collect();
            elements.extend(
                port_elements(&sp, None, &[ip(node)])
                    .into_iter()
                    .filter(|e| matches!(e.set, Set::FirewallIps | Set::FirewallAllow)),
            );
        }
        // In the order the port gives them: the kernel refuses an address inside a range
        // added before it (a range around an address added before is not detected).
        let f = fam_word(family);
        for table in ["kpng", "kpngtext"] {
            nft(&table_script(family, table, &elements));
        }
        nft(&elements_script(family, "kpngtext", &elements));
        writer
            .apply(family, "kpng", &[], &[], &elements)
            .expect("netlink add");
        let listed = list_set(f, "kpngtext", Set::FirewallAllow);
        println!("{f}: {listed}");
        assert_eq!(
            normalized(&nft_list(&["table", f, "kpng"]), "kpng"),
            normalized(&nft_list(&["table", f, "kpngtext"]), "kpngtext"),
            "{f}: both paths hold the same elements"
        );
    }
}
