#![allow(clippy::unwrap_used)]

use kpng_model::Protocol;

use super::*;

/// Compares `text` with the committed snapshot `tests/golden/{name}.snap` (insta: a change
/// fails the test and, outside CI, writes `{name}.snap.new` beside it to compare; to accept a
/// deliberate change, `INSTA_UPDATE=always cargo test -p kpng-backend-userspace --lib` and review `git diff`;
/// `cargo insta review` does the same when cargo-insta is installed).
fn check_golden(name: &str, text: &str) {
    insta::with_settings!({
        snapshot_path => "../../../tests/golden",
        prepend_module_to_snapshot => false,
        omit_expression => true,
    }, {
        insta::assert_snapshot!(name, text);
    });
}

/// One entry of every kind, both families.
fn sample_entries() -> Vec<Entry> {
    let e = |key, action| Entry { key, action };
    let vip = |ip: &str, protocol, port| EntryKey::Vip {
        ip: ip.parse().unwrap(),
        protocol,
        port,
    };
    vec![
        e(
            vip("10.96.0.10", Protocol::Tcp, 80),
            Action::Redirect(41000),
        ),
        e(
            vip("10.96.0.10", Protocol::Udp, 53),
            Action::Redirect(41001),
        ),
        e(vip("10.96.0.11", Protocol::Tcp, 80), Action::Refuse),
        e(vip("198.51.100.8", Protocol::Tcp, 80), Action::Drop),
        e(
            vip("fd00:96::a", Protocol::Tcp, 80),
            Action::Redirect(41002),
        ),
        e(
            EntryKey::NodePort {
                family: Family::V4,
                protocol: Protocol::Tcp,
                port: 30080,
            },
            Action::Redirect(42000),
        ),
        e(
            EntryKey::NodePort {
                family: Family::V6,
                protocol: Protocol::Udp,
                port: 30053,
            },
            Action::Refuse,
        ),
        e(
            EntryKey::ClusterIp("10.96.0.10".parse().unwrap()),
            Action::Member,
        ),
        e(
            EntryKey::FirewallVip {
                ip: "198.51.100.8".parse().unwrap(),
                protocol: Protocol::Tcp,
                port: 80,
            },
            Action::Member,
        ),
        e(
            EntryKey::FirewallAllow {
                ip: "198.51.100.8".parse().unwrap(),
                protocol: Protocol::Tcp,
                port: 80,
                source: "203.0.113.0/24".parse().unwrap(),
            },
            Action::Member,
        ),
        e(
            EntryKey::Listener {
                family: Family::V4,
                protocol: Protocol::Tcp,
                port: 41000,
            },
            Action::Member,
        ),
        e(
            EntryKey::NodePortAddresses("192.168.100.1/32".parse().unwrap()),
            Action::Member,
        ),
        e(
            EntryKey::ServiceCidr("fd00:96::/112".parse().unwrap()),
            Action::Member,
        ),
        e(
            EntryKey::VipShortCircuit {
                ip: "198.51.100.9".parse().unwrap(),
                protocol: Protocol::Tcp,
                port: 80,
            },
            Action::Redirect(43000),
        ),
        e(
            EntryKey::NodePortShortCircuit {
                family: Family::V4,
                protocol: Protocol::Tcp,
                port: 30090,
            },
            Action::Redirect(43000),
        ),
        e(
            EntryKey::PodCidr("10.244.0.0/16".parse().unwrap()),
            Action::Member,
        ),
    ]
}

#[test]
fn the_full_script_is_golden() {
    let c = NftCapture::dry_run(Family::ALL.to_vec()).with_pods(PodMatch::Cidrs);
    check_golden("replace.nft", &c.replace_script(&sample_entries()));
}

/// The firewall entries of load balancers whose source ranges hold the node and the ingress
/// IP (the node's subnet, `/0`) or overlap, both families, as the capture adds them: disjoint
/// prefixes (the ingress IP inside a range as well made every capture change fail, `File
/// exists`: the set is an interval set).
#[test]
fn source_ranges_holding_the_node_and_ingress_ips_are_golden() {
    use crate::entries::{ListenerPorts, port_entries};
    use crate::testutil::{endpoint, service_port};
    let listeners = ListenerPorts {
        internal: 41000,
        external: Some(42000),
        short_circuit: None,
    };
    let cases: [(&str, &str, &[&str], &[&str]); 6] = [
        (
            "subnet",
            "10.96.9.1",
            &["192.168.100.80", "203.0.113.80"],
            &["192.168.100.0/24"],
        ),
        ("world", "10.96.9.2", &["198.51.100.2"], &["0.0.0.0/0"]),
        (
            "overlap",
            "10.96.9.3",
            &["198.51.100.3"],
            &["10.0.0.0/8", "10.1.0.0/16", "11.0.0.0/8"],
        ),
        (
            "subnet6",
            "fd00:96::9:1",
            &["fd00:100::80"],
            &["fd00:100::/64"],
        ),
        ("world6", "fd00:96::9:2", &["2001:db8::2"], &["::/0"]),
        (
            "overlap6",
            "fd00:96::9:3",
            &["2001:db8::3"],
            &["fd00:1::/48", "fd00:1:0:1::/64"],
        ),
    ];
    let node_ips = ["192.168.100.1", "fd00:100::1"].map(|s| s.parse().unwrap());
    let mut entries = Vec::new();
    for (name, cluster_ip, lbs, ranges) in cases {
        let ep = if cluster_ip.contains(':') {
            "fd00:244:1::2"
        } else {
            "10.244.1.2"
        };
        let mut sp = service_port(name, Protocol::Tcp, cluster_ip, &[endpoint(ep, true)]);
        sp.load_balancer_ips = lbs.iter().map(|s| s.parse().unwrap()).collect();
        sp.source_ranges = ranges.iter().map(|s| s.parse().unwrap()).collect();
        entries.extend(
            port_entries(&sp, listeners, &node_ips)
                .into_iter()
                .filter(|e| matches!(e.key, EntryKey::FirewallAllow { .. })),
        );
    }
    entries.sort();
    let c = NftCapture::dry_run(Family::ALL.to_vec());
    let script = c.replace_script(&entries);
    let elements: Vec<&str> = script
        .lines()
        .filter(|l| l.starts_with("add element"))
        .collect();
    check_golden("source-ranges.nft", &elements.join("\n"));
}

#[test]
fn pods_are_matched_as_the_detect_local_mode_says() {
    let cases = [
        (PodMatch::None, None),
        (PodMatch::Cidrs, Some("ip saddr @pod-cidrs ")),
        (
            PodMatch::Interface("cbr0".into()),
            Some("iifname \"cbr0\" "),
        ),
        (
            PodMatch::InterfacePrefix("veth".into()),
            Some("iifname \"veth*\" "),
        ),
    ];
    for (pods, want) in cases {
        let text = skeleton(Family::V4, TABLE, &pods);
        let short_circuit: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("redirect") && l.contains("short-circuit"))
            .collect();
        match want {
            None => assert!(short_circuit.is_empty(), "{pods:?}: {short_circuit:?}"),
            Some(m) => {
                assert_eq!(short_circuit.len(), 2, "{pods:?}");
                assert!(
                    short_circuit.iter().all(|l| l.trim_start().starts_with(m)),
                    "{pods:?}: {short_circuit:?}"
                );
            }
        }
    }
}

#[test]
fn an_update_deletes_keys_then_adds_entries_with_values() {
    let c = NftCapture::dry_run(Family::ALL.to_vec());
    let all = sample_entries();
    let ops = vec![
        Op::Delete(all[0].clone()),
        Op::Delete(all[6].clone()),
        Op::Add(Entry {
            key: all[0].key.clone(),
            action: Action::Refuse,
        }),
        Op::Add(all[10].clone()),
    ];
    assert_eq!(
        c.update_script(&ops),
        "delete element ip kpng-userspace vip-listeners { 10.96.0.10 . tcp . 80 }\n\
         delete element ip6 kpng-userspace nodeport-verdicts { udp . 30053 }\n\
         add element ip kpng-userspace vip-verdicts { 10.96.0.10 . tcp . 80 : goto reject-chain }\n\
         add element ip kpng-userspace listener-ports { tcp . 41000 }\n"
    );
}

#[test]
fn entries_of_other_families_are_left_out() {
    let c = NftCapture::dry_run(vec![Family::V4]);
    let script = c.replace_script(&sample_entries());
    assert!(!script.contains("ip6 "), "{script}");
    assert!(script.contains("table ip kpng-userspace {"), "{script}");
}

#[test]
fn the_redirects_a_previous_run_left_are_read_back() {
    // What nft 1.0.6 prints for `nft -j list table ip kpng-userspace` (abridged).
    let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}},
        {"table": {"family": "ip", "name": "kpng-userspace"}},
        {"map": {"family": "ip", "name": "vip-listeners", "table": "kpng-userspace",
          "type": ["ipv4_addr", "inet_proto", "inet_service"], "map": "inet_service",
          "elem": [[{"concat": ["10.96.0.10", "udp", 53]}, 41001],
                   [{"concat": ["10.96.0.10", "tcp", 80]}, 41000]]}},
        {"map": {"family": "ip", "name": "nodeport-listeners", "table": "kpng-userspace",
          "type": ["inet_proto", "inet_service"], "map": "inet_service",
          "elem": [[{"concat": ["tcp", 30080]}, 42000]]}},
        {"map": {"family": "ip", "name": "vip-short-circuit", "table": "kpng-userspace",
          "type": ["ipv4_addr", "inet_proto", "inet_service"], "map": "inet_service",
          "elem": [[{"concat": ["198.51.100.9", "tcp", 80]}, 43000]]}},
        {"map": {"family": "ip", "name": "vip-verdicts", "table": "kpng-userspace",
          "type": ["ipv4_addr", "inet_proto", "inet_service"], "map": "verdict",
          "elem": [[{"concat": ["10.96.0.11", "tcp", 80]}, {"goto": {"target": "reject-chain"}}]]}}
    ]}"#;
    let mut got = parse_redirects(Family::V4, json);
    got.sort();
    let vip = |ip: &str, protocol, port| EntryKey::Vip {
        ip: ip.parse().unwrap(),
        protocol,
        port,
    };
    let mut want = vec![
        Entry {
            key: vip("10.96.0.10", Protocol::Udp, 53),
            action: Action::Redirect(41001),
        },
        Entry {
            key: vip("10.96.0.10", Protocol::Tcp, 80),
            action: Action::Redirect(41000),
        },
        Entry {
            key: EntryKey::NodePort {
                family: Family::V4,
                protocol: Protocol::Tcp,
                port: 30080,
            },
            action: Action::Redirect(42000),
        },
        Entry {
            key: EntryKey::VipShortCircuit {
                ip: "198.51.100.9".parse().unwrap(),
                protocol: Protocol::Tcp,
                port: 80,
            },
            action: Action::Redirect(43000),
        },
    ];
    want.sort();
    assert_eq!(got, want);
    assert_eq!(parse_redirects(Family::V4, "not json"), Vec::new());
}
