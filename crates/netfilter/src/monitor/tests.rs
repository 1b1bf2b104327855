//! Decoding notifications and deciding what is tampering, on hand-built messages.

use super::*;

/// One nf_tables notification as the kernel frames it.
fn message(msg: u16, nfproto: u8, portid: u32, attrs: &[(u16, &str)]) -> Vec<u8> {
    let mut body = vec![nfproto, 0, 0, 0];
    for (kind, value) in attrs {
        let payload = [value.as_bytes(), &[0]].concat();
        body.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
        body.extend_from_slice(&kind.to_ne_bytes());
        body.extend_from_slice(&payload);
        body.resize(body.len().next_multiple_of(4), 0);
    }
    let mut out = Vec::new();
    out.extend_from_slice(&((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes());
    out.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | msg).to_ne_bytes());
    out.extend_from_slice(&0u16.to_ne_bytes());
    out.extend_from_slice(&7u32.to_ne_bytes());
    out.extend_from_slice(&portid.to_ne_bytes());
    out.extend_from_slice(&body);
    out
}

const IP: u8 = libc::NFPROTO_IPV4 as u8;
const IP6: u8 = libc::NFPROTO_IPV6 as u8;

fn watched() -> Watched {
    Watched {
        tables: vec![(Family::V4, "kpng".into()), (Family::V6, "kpng".into())],
        dynamic_sets: vec!["affinity".into()],
        chains: None,
    }
}

#[test]
fn one_datagram_holds_several_notifications() {
    let datagram = [
        message(2, IP, 42, &[(1, "kpng")]),
        message(12, IP6, 43, &[(1, "kpng"), (2, "cluster-ips")]),
        message(15, 0, 0, &[]),
    ]
    .concat();
    let notes = parse_notifications(&datagram);
    assert_eq!(notes.len(), 3);
    assert_eq!(
        notes[1],
        Notification {
            msg: 12,
            nfproto: IP6,
            table: Some("kpng".into()),
            set: Some("cluster-ips".into()),
            chain: None,
            rule: Vec::new(),
            portid: 43,
            process: None,
        }
    );
    assert_eq!(notes[2].table, None);
}

#[test]
fn truncated_or_foreign_subsystem_messages_are_skipped() {
    let good = message(8, IP, 1, &[(1, "kpng")]);
    let mut other = good.clone();
    other[4..6].copy_from_slice(&((1u16 << 8) | 8).to_ne_bytes());
    let notes = parse_notifications(&[other, good.clone()].concat());
    assert_eq!(notes.len(), 1);
    assert!(parse_notifications(&good[..good.len() - 3]).is_empty());
    assert!(parse_notifications(&[]).is_empty());
}

#[test]
fn what_counts_as_tampering() {
    let cases: &[(&str, Vec<u8>, Option<&str>)] = &[
        (
            "our table deleted",
            message(2, IP, 9, &[(1, "kpng")]),
            Some("ip kpng: table deleted"),
        ),
        (
            "a rule deleted in our ip6 table",
            message(8, IP6, 9, &[(1, "kpng"), (2, "services")]),
            Some("ip6 kpng: rule deleted"),
        ),
        (
            "an element deleted by a tool",
            message(14, IP, 9, &[(1, "kpng"), (2, "cluster-ips")]),
            Some("ip kpng: element deleted (cluster-ips)"),
        ),
        (
            "a set deleted",
            message(11, IP, 9, &[(1, "kpng"), (2, "cluster-ips")]),
            Some("ip kpng: set deleted (cluster-ips)"),
        ),
        ("another table", message(2, IP, 9, &[(1, "filter")]), None),
        (
            "same name, another family (inet)",
            message(2, 1, 9, &[(1, "kpng")]),
            None,
        ),
        (
            "elements the kernel changed itself (packet path, timeouts)",
            message(12, IP, 0, &[(1, "kpng"), (2, "cluster-ips")]),
            None,
        ),
        (
            "elements of a dynamic set",
            message(14, IP, 9, &[(1, "kpng"), (2, "affinity")]),
            None,
        ),
        ("a generation message", message(15, 0, 9, &[]), None),
    ];
    let w = watched();
    for (name, bytes, want) in cases {
        let notes = parse_notifications(bytes);
        assert_eq!(notes.len(), 1, "{name}");
        assert_eq!(w.tampering(&notes[0]).as_deref(), *want, "{name}");
    }
}

/// iptables-nft's tables, shared with others: only our chains count.
fn shared() -> Watched {
    Watched {
        tables: ["nat", "filter", "mangle"]
            .iter()
            .flat_map(|t| [(Family::V4, t.to_string()), (Family::V6, t.to_string())])
            .collect(),
        dynamic_sets: Vec::new(),
        chains: Some(OurChains {
            is_ours: |c| c.starts_with("KUBE-SVC-") || c == "KUBE-SERVICES",
            jump_targets: vec!["KUBE-SERVICES".into()],
        }),
    }
}

#[test]
fn what_counts_as_tampering_in_shared_tables() {
    // A rule message: table, chain, then its expressions (here only the jump target's name,
    // as an immediate verdict carries it).
    let rule = |msg, chain: &str, target: &str| {
        message(msg, IP, 9, &[(1, "nat"), (2, chain), (4, target)])
    };
    let cases: &[(&str, Vec<u8>, Option<&str>)] = &[
        (
            "the table deleted",
            message(2, IP, 9, &[(1, "nat")]),
            Some("ip nat: table deleted"),
        ),
        (
            "a rule deleted from our chain",
            rule(8, "KUBE-SERVICES", ""),
            Some("ip nat: rule deleted (KUBE-SERVICES)"),
        ),
        (
            "a rule added to our chain",
            rule(6, "KUBE-SVC-ABC", "DROP"),
            Some("ip nat: rule added (KUBE-SVC-ABC)"),
        ),
        (
            "our chain deleted",
            message(5, IP6, 9, &[(1, "filter"), (3, "KUBE-SERVICES")]),
            Some("ip6 filter: chain deleted (KUBE-SERVICES)"),
        ),
        (
            "our jump deleted from a built-in chain",
            rule(8, "PREROUTING", "KUBE-SERVICES"),
            Some("ip nat: rule deleted (PREROUTING)"),
        ),
        (
            "another jump deleted from a built-in chain",
            rule(8, "PREROUTING", "CNI-HOSTPORT-DNAT"),
            None,
        ),
        (
            "a longer name is not ours",
            rule(8, "PREROUTING", "KUBE-SERVICES-X"),
            None,
        ),
        (
            "a rule added to a built-in chain",
            rule(6, "POSTROUTING", "KUBE-SERVICES"),
            None,
        ),
        (
            "someone else's chain deleted",
            message(5, IP, 9, &[(1, "nat"), (3, "cali-nat")]),
            None,
        ),
        ("a table added", message(0, IP, 9, &[(1, "nat")]), None),
        (
            "a table of no interest",
            message(2, IP, 9, &[(1, "raw")]),
            None,
        ),
    ];
    let w = shared();
    for (name, bytes, want) in cases {
        let notes = parse_notifications(bytes);
        assert_eq!(notes.len(), 1, "{name}");
        assert_eq!(w.tampering(&notes[0]).as_deref(), *want, "{name}");
    }
}

#[test]
fn the_most_telling_change_of_a_burst_is_the_one_reported() {
    let note = |msg: u16, set: Option<&str>| Notification {
        msg,
        nfproto: 2,
        table: Some("kpng".into()),
        set: set.map(str::to_string),
        chain: None,
        rule: Vec::new(),
        portid: 4242,
        process: None,
    };
    // What `nft delete table` and `nft flush table` send, in the kernel's order.
    let burst = [
        note(8, None),
        note(11, Some("__set0")),
        note(14, Some("cluster-ips")),
        note(11, Some("cluster-ips")),
        note(5, None),
        note(2, None),
        note(6, None),
    ];
    let mut ranked: Vec<&Notification> = burst.iter().collect();
    ranked.sort_by_key(|n| std::cmp::Reverse(significance(n)));
    let order: Vec<(u16, Option<&str>)> =
        ranked.iter().map(|n| (n.msg, n.set.as_deref())).collect();
    assert_eq!(
        order,
        [
            (2, None),
            (5, None),
            (11, Some("cluster-ips")),
            (8, None),
            (14, Some("cluster-ips")),
            (11, Some("__set0")),
            (6, None),
        ]
    );
}

/// `nft flush ruleset` deletes both families' tables: the one report names both, not the
/// first read.
#[test]
fn a_burst_names_every_table_deleted() {
    let w = watched();
    let mut burst = Burst::default();
    for n in [
        message(8, IP, 42, &[(1, "kpng"), (2, "services")]),
        message(2, IP, 42, &[(1, "kpng")]),
        message(2, IP6, 42, &[(1, "kpng")]),
        message(2, IP6, 42, &[(1, "kpng")]),
    ] {
        for note in parse_notifications(&n) {
            let what = w.tampering(&note).expect("ours");
            burst.add(&note, what);
        }
    }
    assert_eq!(
        burst.report().as_deref(),
        Some("ip kpng and ip6 kpng: table deleted")
    );
    let mut one = Burst::default();
    for note in parse_notifications(&message(2, IP6, 42, &[(1, "kpng")])) {
        let what = w.tampering(&note).expect("ours");
        one.add(&note, what);
    }
    assert_eq!(one.report().as_deref(), Some("ip6 kpng: table deleted"));
    assert_eq!(Burst::default().report(), None);
}

/// `iptables-restore` of a saved filter table (a host firewall's reload) deletes the whole
/// table and adds it again in one transaction: reported as the replacement it is, saying
/// what it did to kpng's chains, not as "table deleted"; a deletion alone still reads so.
#[test]
fn a_table_deleted_and_added_again_is_reported_as_replaced() {
    let w = shared();
    let chain = |msg, name: &str| message(msg, IP, 9, &[(1, "filter"), (3, name)]);
    let rule = |msg, chain: &str, target: &str| {
        message(msg, IP, 9, &[(1, "filter"), (2, chain), (4, target)])
    };
    // What `nft monitor` shows of `iptables-nft-restore` of a filter table without our chains.
    let restore = [
        rule(8, "KUBE-SERVICES", "ACCEPT"),
        rule(8, "FORWARD", "KUBE-SERVICES"),
        chain(5, "KUBE-SERVICES"),
        chain(5, "FORWARD"),
        message(2, IP, 9, &[(1, "filter")]),
        message(0, IP, 9, &[(1, "filter")]),
        chain(3, "INPUT"),
        chain(3, "FORWARD"),
        message(15, 0, 9, &[]),
    ];
    let feed = |notes: &[Vec<u8>]| {
        let mut burst = Burst::default();
        for n in notes {
            for note in parse_notifications(n) {
                burst.take(&w, &note);
            }
        }
        burst
    };
    let replaced = feed(&restore);
    assert!(!replaced.awaits_transaction_end());
    assert_eq!(
        replaced.report().as_deref(),
        Some(
            "ip filter: table replaced as a whole (a restore of the table, as iptables-restore \
             or a firewall reload does): kpng's chains and jumps in it were removed or replaced"
        )
    );
    // Read before the transaction's end: the drain waits for the rest.
    assert!(feed(&restore[..5]).awaits_transaction_end());
    // Deleted, not added again (`nft delete table ip filter`).
    let deleted = feed(&[
        rule(8, "FORWARD", "KUBE-SERVICES"),
        message(2, IP, 9, &[(1, "filter")]),
        message(15, 0, 9, &[]),
    ]);
    assert_eq!(
        deleted.report().as_deref(),
        Some("ip filter: table deleted")
    );
    // A table added that was never deleted is nobody's tampering.
    assert_eq!(feed(&[message(0, IP, 9, &[(1, "filter")])]).report(), None);
}

/// A transaction's end as the kernel sends it: generation id, then the committing process's
/// pid (big-endian) and name.
fn newgen(pid: u32, name: &str) -> Vec<u8> {
    let mut body = vec![0, 0, 0, 0];
    for (kind, payload) in [
        (1u16, 7u32.to_be_bytes().to_vec()),
        (2, pid.to_be_bytes().to_vec()),
        (3, [name.as_bytes(), &[0]].concat()),
    ] {
        body.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
        body.extend_from_slice(&kind.to_ne_bytes());
        body.extend_from_slice(&payload);
        body.resize(body.len().next_multiple_of(4), 0);
    }
    let mut out = Vec::new();
    out.extend_from_slice(&((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes());
    out.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | MSG_NEWGEN).to_ne_bytes());
    out.extend_from_slice(&0u16.to_ne_bytes());
    out.extend_from_slice(&7u32.to_ne_bytes());
    out.extend_from_slice(&9u32.to_ne_bytes());
    out.extend_from_slice(&body);
    out
}

/// The report names the process whose transaction made the change (what `nft monitor` prints
/// as "by process 1234 (nft)"), each once; a transaction that changed nothing of ours is not
/// named, nor is one whose end carries no process (kernels before 5.3).
#[test]
fn a_report_names_the_process_that_made_the_change() {
    let w = watched();
    let feed = |datagrams: &[Vec<u8>]| {
        let mut burst = Burst::default();
        for d in datagrams {
            for note in parse_notifications(d) {
                burst.take(&w, &note);
            }
        }
        burst.report()
    };
    let flush = [
        message(2, IP, 9, &[(1, "kpng")]),
        message(2, IP6, 9, &[(1, "kpng")]),
        newgen(1234, "nft"),
    ];
    let cases: [(Vec<Vec<u8>>, Option<&str>); 5] = [
        (
            flush.to_vec(),
            Some("ip kpng and ip6 kpng: table deleted by process 1234 (nft)"),
        ),
        // Someone's transaction elsewhere, then ours touched: only the second one is named.
        (
            vec![
                newgen(1, "firewalld"),
                message(8, IP, 9, &[(1, "kpng"), (2, "services")]),
                newgen(77, "iptables-nft-re"),
            ],
            Some("ip kpng: rule deleted by process 77 (iptables-nft-re)"),
        ),
        // Two transactions: both named, each once.
        (
            vec![
                message(14, IP, 9, &[(1, "kpng"), (2, "cluster-ips")]),
                newgen(5, "nft"),
                message(2, IP, 9, &[(1, "kpng")]),
                newgen(6, "nft"),
                message(14, IP, 9, &[(1, "kpng"), (2, "cluster-ips")]),
                newgen(5, "nft"),
            ],
            Some("ip kpng: table deleted by processes 5 (nft) and 6 (nft)"),
        ),
        // No process in the transaction's end, or no end read yet.
        (
            vec![message(2, IP, 9, &[(1, "kpng")]), message(15, 0, 9, &[])],
            Some("ip kpng: table deleted"),
        ),
        // A name with control characters is escaped.
        (
            vec![message(2, IP, 9, &[(1, "kpng")]), newgen(3, "x\x1b[31m")],
            Some("ip kpng: table deleted by process 3 (x\\u{1b}[31m)"),
        ),
    ];
    for (datagrams, want) in cases {
        assert_eq!(feed(&datagrams).as_deref(), want);
    }
    let notes = parse_notifications(&newgen(1234, "nft"));
    assert_eq!(
        notes[0].process,
        Some(Process {
            pid: 1234,
            name: "nft".into()
        })
    );
    assert_eq!(notes[0].table, None, "the generation id is no table name");
}

/// An idle monitor's thread sleeps until a notification arrives or it is stopped: it used to
/// wake 5 times a second to look at its stop flag, which a small node pays for in power and
/// scheduler noise. Stopping it stays prompt. (Needs CAP_NET_ADMIN to subscribe; skipped
/// without. It only listens, so the test's own network namespace is fine.)
#[test]
fn an_idle_monitor_sleeps_until_stopped() {
    let alarm = TamperAlarm::new(|_| {});
    let monitor = match TableMonitor::start(watched(), alarm) {
        Ok(monitor) => monitor,
        Err(e) => {
            eprintln!("skipped: cannot subscribe to nftables notifications: {e}");
            return;
        }
    };
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert_eq!(monitor.idle_wakeups(), 0, "woke with nothing to do");
    let stopping = std::time::Instant::now();
    drop(monitor);
    assert!(
        stopping.elapsed() < std::time::Duration::from_secs(1),
        "stopped in {:?}",
        stopping.elapsed()
    );
}
