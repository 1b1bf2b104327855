//! Real-packet end-to-end tests of `kpng … to-local nft` (the shared suite in `e2e/`).

mod e2e;

e2e::suite!(e2e::Backend::Nft);

#[test]
fn external_ip_on_a_node_address_wins_over_a_node_port() {
    e2e::scenarios::external_ip_on_a_node_address_wins_over_a_node_port(e2e::Backend::Nft);
}

#[test]
fn session_affinity_dual_stack() {
    e2e::scenarios::session_affinity_dual_stack(e2e::Backend::Nft);
}

#[test]
fn session_affinity_keeps_foreign_conntrack_mark_bits() {
    e2e::scenarios::session_affinity_keeps_foreign_conntrack_mark_bits(e2e::Backend::Nft);
}

/// The health-check servers are the runner's, the same for every node backend: one backend
/// shows where they listen with CIDR `--nodeport-addresses`.
#[test]
fn health_check_listens_on_the_node_port_addresses() {
    e2e::scenarios::health_check_listens_on_the_node_port_addresses(e2e::Backend::Nft);
}

/// IPv6 health checks on an edge node: per the Service's families, and following duplicate
/// address detection (the runner's and the node reader's, the same for every node backend;
/// nftables shows the `nodeport-ips` set).
#[test]
fn ipv6_health_checks_follow_dad_and_the_service_families() {
    e2e::scenarios::ipv6_health_checks_follow_dad_and_the_service_families(e2e::Backend::Nft);
}

// The fault suite (`e2e/faults.rs`; figures in docs/reliability.md).

#[test]
fn fault_table_deleted() {
    e2e::faults::nft_table_deleted(e2e::Backend::Nft);
}

#[test]
fn fault_double_flush_during_the_repair() {
    e2e::faults::double_flush(e2e::Backend::Nft);
}

#[test]
fn fault_repeated_deletions_back_off() {
    e2e::faults::repair_loop(e2e::Backend::Nft, None);
}

/// A foreign rule committed during kpng's own transaction (not notified: the monitor has left
/// its group) is found by the generation check and repaired within seconds, not at the
/// periodic full sync (docs/reliability.md).
#[test]
fn fault_rule_inserted_during_a_sync_is_repaired() {
    assert!(e2e::faults::nft_rule_inserted_during_a_sync(
        e2e::Backend::Nft
    ));
}

/// A neighbour committing to its own table during each of kpng's text transactions is not
/// taken as someone changing kpng's rules (docs/reliability.md).
#[test]
fn fault_neighbour_commits_during_syncs_are_not_tampering() {
    let (overlapped, log) = e2e::faults::nft_neighbour_commits_during_syncs(e2e::Backend::Nft);
    if overlapped == 0 {
        return; // not root: skipped with its reason printed
    }
    assert!(
        overlapped >= 3,
        "the neighbour committed during the start and both changes: {overlapped}"
    );
    assert!(
        !log.contains("changed by someone else"),
        "no change of kpng's rules, no repair:\n{log}"
    );
}

#[test]
fn fault_ruleset_flushed() {
    e2e::faults::nft_ruleset_flushed(e2e::Backend::Nft);
}

/// An external client's connection held through a node port survives `nft flush ruleset`
/// (the anchor table keeps it NATed until the repair; docs/reliability.md).
#[test]
fn fault_ruleset_flushed_keeps_a_node_port_connection() {
    e2e::faults::nft_ruleset_flushed_node_port(e2e::Backend::Nft);
}

#[test]
fn fault_chain_flushed() {
    e2e::faults::nft_chain_flushed(e2e::Backend::Nft);
}

#[test]
fn fault_rule_inserted() {
    e2e::faults::nft_rule_inserted(e2e::Backend::Nft);
}

#[test]
fn one_instance_per_namespace() {
    e2e::faults::one_instance_per_namespace(e2e::Backend::Nft);
}

#[test]
fn fault_killed_during_a_sync_and_restarted() {
    e2e::faults::kill_during_sync_and_restart(e2e::Backend::Nft);
}

#[test]
fn fault_transaction_refused() {
    e2e::faults::nft_transaction_refused(e2e::Backend::Nft);
}

/// A restart with another configuration (`--masquerade-all` added) keeps the table: the rules
/// are put back in place and the sets refilled over netlink, not the whole table replaced as
/// text (seconds and hundreds of MB at 30k Services); the marker chain then names the new
/// skeleton, and a restart back to the first configuration puts its rules back in turn.
/// Established and new connections are served throughout.
#[test]
fn a_restart_with_another_configuration_puts_the_rules_in_place() {
    use e2e::faults::{Bed, hold, web};
    use e2e::harness::{Kpng, manifest};
    kpng_testkit::require_root!();
    let bed = Bed::new(e2e::Backend::Nft, "reconf");
    let ns = &bed.c.node1.ns;
    let mut k = Kpng::start(e2e::Backend::Nft, ns, &manifest(&[web(), hold()]), &[]);
    let marker = || {
        ns.run_ok(["nft", "list", "chain", "ip", "kpng", "skeleton"])
            .expect("the marker chain")
    };
    let masquerade_all = || {
        ns.run_ok(["nft", "list", "chain", "ip", "kpng", "services"])
            .expect("services")
            .lines()
            .any(|l| l.trim() == "ip daddr @cluster-ips meta mark set meta mark | 0x00004000")
    };
    let first = marker();
    assert!(!masquerade_all());
    let prober = bed.prober();
    let t0 = std::time::Instant::now();
    k.terminate();
    k.set_extra(&["--masquerade-all"]);
    k.spawn();
    let restarted = t0.elapsed();
    let log = k.stderr();
    assert!(
        log.contains("rules left by an earlier kpng (another build or configuration"),
        "{log}"
    );
    let second = marker();
    assert_ne!(first, second, "the marker names the new skeleton");
    assert!(masquerade_all(), "--masquerade-all's rule is in place");
    bed.assert_served(10, "after the restart");
    let f = prober.finish(restarted, restarted);
    println!("restart with another configuration: {restarted:?}; {f:?}");
    assert!(f.held_lost.is_none(), "{f:?}");

    k.terminate();
    k.set_extra(&[]);
    k.spawn();
    assert_eq!(marker(), first, "back to the first skeleton");
    assert!(!masquerade_all());
    bed.assert_served(10, "after the second restart");
}

/// A cold start on a cluster large enough that its elements go to the kernel in several
/// transactions (crates/backend-nft/src/fill.rs) programs exactly what a restart's single
/// atomic refill of the same table programs, and serves its Services.
#[test]
fn a_cold_fill_in_several_transactions_holds_what_one_refill_holds() {
    use e2e::faults::{Bed, hold, web};
    use e2e::harness::{Kpng, manifest};
    kpng_testkit::require_root!();
    let bed = Bed::new(e2e::Backend::Nft, "coldfill");
    let ns = &bed.c.node1.ns;
    // 4,000 more Services of 4 endpoints: over 30,000 elements in the IPv4 table.
    let mut objects = vec![web(), hold()];
    for i in 0..4000u32 {
        let ip = format!("10.96.{}.{}", 16 + i / 250, i % 250 + 1);
        let eps: String = (0..4u32)
            .map(|e| {
                format!(
                    "- {{addresses: [\"10.244.{}.{}\"], conditions: {{ready: true}}}}\n",
                    100 + e,
                    i % 250 + 1
                )
            })
            .collect();
        objects.push(format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{namespace: fill, name: f{i}}}\n\
             spec: {{clusterIP: {ip}, ports: [{{name: p, port: 80, protocol: TCP}}]}}\n\
             ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{namespace: fill, name: f{i}-1, labels: {{kubernetes.io/service-name: f{i}}}}}\n\
             addressType: IPv4\nports: [{{name: p, port: 8080, protocol: TCP}}]\nendpoints:\n{eps}"
        ));
    }
    let elements = || {
        let listing = ns
            .run_ok(["nft", "list", "table", "ip", "kpng"])
            .expect("the table");
        // One element per line or per comma-separated item, in a stable order.
        let mut items: Vec<String> = listing
            .lines()
            .flat_map(|l| l.split(','))
            .map(|s| {
                s.trim()
                    .trim_start_matches("elements = {")
                    .trim()
                    .to_string()
            })
            .filter(|s| !s.is_empty())
            .collect();
        items.sort();
        items
    };
    let mut k = Kpng::start(e2e::Backend::Nft, ns, &manifest(&objects), &[]);
    let cold = elements();
    assert!(
        cold.iter().filter(|l| l.contains(" . 80 . ")).count() >= 16_000,
        "the filler's endpoint slots are in the table"
    );
    bed.assert_served(10, "after a cold fill in several transactions");

    k.terminate();
    k.spawn();
    let refilled = elements();
    assert_eq!(cold.len(), refilled.len());
    let differ: Vec<_> = cold
        .iter()
        .zip(&refilled)
        .filter(|(a, b)| a != b)
        .take(5)
        .collect();
    assert!(
        differ.is_empty(),
        "the cold fill and the refill differ: {differ:?}"
    );
    bed.assert_served(10, "after the restart's refill");
}

/// A `*-n<k>` chain goes with its last reference: `web` scaled from 3 endpoints to 1 (no other
/// Service has 3) leaves no `cluster-n3` chain in the table after that sync, without waiting
/// for a full sync, and `web` is still served.
#[test]
fn a_chain_no_element_refers_to_goes_with_the_scale_down() {
    use e2e::faults::{Bed, hold, web};
    use e2e::harness::{Cond, Kpng, manifest, svc};
    kpng_testkit::require_root!();
    let bed = Bed::new(e2e::Backend::Nft, "chaingc");
    let ns = &bed.c.node1.ns;
    let three = svc(
        "web",
        10,
        "ClusterIP",
        "",
        &[
            ("pod1b", Cond::Ready),
            ("pod1a", Cond::Ready),
            ("pod2a", Cond::Ready),
        ],
    );
    let mut k = Kpng::start(e2e::Backend::Nft, ns, &manifest(&[three, hold()]), &[]);
    let has_chain = |chain: &str| {
        ns.run_ok(["nft", "list", "chain", "ip", "kpng", chain])
            .is_ok()
    };
    assert!(has_chain("cluster-n3"), "3 endpoints: cluster-n3 in use");
    k.apply(&manifest(&[web(), hold()]));
    assert!(
        !has_chain("cluster-n3"),
        "cluster-n3 is left after the scale-down:\n{}",
        ns.run_ok(["nft", "list", "table", "ip", "kpng"])
            .unwrap_or_default()
    );
    assert!(has_chain("cluster-n1"), "the chain web uses now");
    bed.wait_served(10, "after the scale-down");
}

/// The dynamic chains of a table adopted at start-up are exactly those its elements refer to:
/// kpng stopped (its table left in place) with `web` at 3 endpoints and ClientIP affinity
/// (600 s), someone's `cluster-n9` added, then started again with `web` at 1 endpoint and no
/// affinity: the start-up full sync, which reuses the table, deletes `cluster-n3`,
/// `affinity-t600` and `cluster-n9`, and `kpng status` counts the chains that are left.
#[test]
fn a_restart_deletes_the_chains_the_adopted_table_no_longer_needs() {
    use e2e::faults::{Bed, hold, web};
    use e2e::harness::{Cond, Kpng, manifest, svc};
    kpng_testkit::require_root!();
    let bed = Bed::new(e2e::Backend::Nft, "chainrst");
    let ns = &bed.c.node1.ns;
    let three = svc(
        "web",
        10,
        "ClusterIP",
        "sessionAffinity: ClientIP, sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}",
        &[
            ("pod1b", Cond::Ready),
            ("pod1a", Cond::Ready),
            ("pod2a", Cond::Ready),
        ],
    );
    let mut k = Kpng::start(e2e::Backend::Nft, ns, &manifest(&[three, hold()]), &[]);
    // The chains of table ip kpng (rules and elements left out).
    let chains = || {
        let listing = ns
            .run_ok(["nft", "list", "chains", "ip"])
            .expect("nft list chains");
        let mut in_kpng = false;
        let mut names = Vec::new();
        for line in listing.lines().map(str::trim) {
            if let Some(table) = line.strip_prefix("table ip ") {
                in_kpng = table == "kpng {";
            } else if let Some(name) = line
                .strip_prefix("chain ")
                .and_then(|l| l.strip_suffix(" {"))
                && in_kpng
            {
                names.push(name.to_string());
            }
        }
        names.sort();
        names
    };
    let has = |names: &[String], chain: &str| names.iter().any(|c| c == chain);
    let before = chains();
    for chain in ["cluster-n3", "affinity-t600"] {
        assert!(has(&before, chain), "{chain} in use: {before:?}");
    }
    k.terminate();
    ns.run_ok(["nft", "add", "chain", "ip", "kpng", "cluster-n9"])
        .expect("someone's chain");
    k.write(&manifest(&[web(), hold()]));
    k.spawn();
    let after = chains();
    for chain in ["cluster-n3", "affinity-t600", "cluster-n9"] {
        assert!(
            !has(&after, chain),
            "{chain} is left in the adopted table: {after:?}"
        );
    }
    assert!(has(&after, "cluster-n1"), "the chain web uses now");
    let status = k.status_json().to_string();
    let ip_table = status
        .split("table ip kpng: ")
        .nth(1)
        .and_then(|rest| rest.split(';').next());
    assert!(
        ip_table.is_some_and(|t| t.ends_with(" set and map elements, 1 dynamic chain")),
        "kpng status counts the chains left (cluster-n1): {status}"
    );
    bed.wait_served(10, "after the restart");
}

/// A restart over kpng's own table sends only what differs from it (crates/backend-nft/src/
/// diff_refill.rs), in one transaction: while kpng was stopped, someone added an element
/// (`web`'s VIP in `no-endpoint-services`, dropping its traffic) and removed one (`web`'s
/// dispatch in `service-ips`); the restarted kpng deletes the first and adds the second, and
/// nothing else (the IPv6 table, unchanged, gets no transaction), and `web` is served again.
#[test]
fn a_restart_over_its_table_sends_only_what_differs() {
    use e2e::faults::{Bed, hold, web};
    use e2e::harness::{Kpng, OK_T, SVC_PORT, cip, manifest, probe, sa};
    kpng_testkit::require_root!();
    let bed = Bed::new(e2e::Backend::Nft, "diffrst");
    let ns = &bed.c.node1.ns;
    let mut k = Kpng::start(e2e::Backend::Nft, ns, &manifest(&[web(), hold()]), &[]);
    bed.assert_served(10, "before the restart");
    k.terminate();
    ns.run_ok([
        "nft",
        "add element ip kpng no-endpoint-services { 10.96.0.10 . tcp . 80 : drop }",
    ])
    .expect("someone's element");
    ns.run_ok([
        "nft",
        "delete element ip kpng service-ips { 10.96.0.10 . tcp . 80 }",
    ])
    .expect("someone removes one");
    let pod1a = &bed.c.pod("pod1a").ns;
    let web_vip = sa(cip(10, false), SVC_PORT);
    assert!(
        !probe(pod1a, kpng_testkit::Proto::Tcp, web_vip, OK_T).is_ok(),
        "web is not served while the table holds the changes"
    );
    k.spawn();
    bed.wait_served(10, "after the restart");
    let log = k.stderr();
    let adopted = |table: &str| {
        log.lines()
            .rev()
            .find(|l| l.contains(&format!("adopting table {table}: its sets read once")))
            .unwrap_or_else(|| panic!("no start-up read of {table} in the log:\n{log}"))
            .to_string()
    };
    let v4 = adopted("ip kpng");
    assert!(
        v4.contains("deleted=1") && v4.contains("added=1") && v4.contains("refilled_count=0"),
        "one delete and one add: {v4}"
    );
    let v6 = adopted("ip6 kpng");
    assert!(
        v6.contains("deleted=0") && v6.contains("added=0"),
        "nothing to send: {v6}"
    );
    let dropped = ns
        .run_ok(["nft", "list", "map", "ip", "kpng", "no-endpoint-services"])
        .expect("the map");
    assert!(
        !dropped.contains("10.96.0.10"),
        "someone's element is deleted: {dropped}"
    );
}

/// A repair over kpng's own table sends only what differs (crates/backend-nft/src/
/// diff_refill.rs), not a flush and refill of every set: someone flushes `service-ips` (every
/// Service's dispatch: `web` is no longer served), and the repair reads the sets once and adds
/// the map's elements back (deleted=0); someone then deletes `web`'s dispatch and adds a drop
/// of it in `no-endpoint-services` in one transaction, and the repair deletes the one and adds
/// the other. A table deleted whole is created again as a new one, nothing read. `web` is
/// served after each.
#[test]
fn a_repair_over_its_table_sends_only_what_differs() {
    use e2e::faults::{Bed, hold, web};
    use e2e::harness::{Kpng, manifest};
    kpng_testkit::require_root!();
    let bed = Bed::new(e2e::Backend::Nft, "diffrep");
    let ns = &bed.c.node1.ns;
    let mut k = Kpng::start(e2e::Backend::Nft, ns, &manifest(&[web(), hold()]), &[]);
    bed.assert_served(10, "before the faults");
    const READ: &str = "repairing table ip kpng: its sets read once";
    const REFILLED: &str = "repairing table ip kpng: flushing and refilling";
    // Injects `cmd` in node1, waits for the repair (and, with `read`, for its line about
    // the IPv4 table's read) and returns the lines about the IPv4 table it logged.
    let repair = |k: &mut Kpng, cmd: &str, what: &str, read: bool| -> Vec<String> {
        let before = k.stderr().lines().count();
        let (ok, failed) = k.sync_counts();
        ns.run_ok(["nft", cmd]).expect(what);
        k.wait_synced(ok, failed);
        if read {
            k.wait_logged(what, |log| {
                log.lines().skip(before).any(|l| l.contains(READ))
            });
        }
        bed.wait_served(10, what);
        let log = k.stderr();
        assert!(
            log.lines()
                .skip(before)
                .any(|l| l.contains("repair after a change by someone else")),
            "{what}: repaired:\n{log}"
        );
        log.lines()
            .skip(before)
            .filter(|l| l.contains("table ip kpng"))
            .map(str::to_string)
            .collect()
    };
    let find = |lines: &[String], what: &str| -> String {
        lines
            .iter()
            .find(|l| l.contains(READ))
            .unwrap_or_else(|| panic!("{what}: not repaired by a difference: {lines:?}"))
            .clone()
    };
    // The map's elements (one per Service port and IP: `: goto` each), all to be added back.
    let held = ns
        .run_ok(["nft", "list", "map", "ip", "kpng", "service-ips"])
        .expect("the map")
        .matches(": goto ")
        .count();
    assert!(held >= 2, "web's and hold's dispatch at least");
    let lines = repair(
        &mut k,
        "flush map ip kpng service-ips",
        "service-ips flushed",
        true,
    );
    let line = find(&lines, "flush");
    assert!(
        line.contains("deleted=0")
            && line.contains(&format!("added={held} "))
            && line.contains("refilled_count=0"),
        "the map's {held} elements added back, nothing else: {line}"
    );
    let lines = repair(
        &mut k,
        "delete element ip kpng service-ips { 10.96.0.10 . tcp . 80 }; \
         add element ip kpng no-endpoint-services { 10.96.0.10 . tcp . 80 : drop }",
        "web's dispatch replaced by a drop",
        true,
    );
    let line = find(&lines, "element changes");
    assert!(
        line.contains("deleted=1") && line.contains("added=1"),
        "one delete, one add: {line}"
    );
    assert!(
        !lines.iter().any(|l| l.contains(REFILLED)),
        "no refill: {lines:?}"
    );
    let lines = repair(&mut k, "delete table ip kpng", "table deleted", false);
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("its sets read once") || l.contains(REFILLED)),
        "a deleted table is created again, nothing read: {lines:?}"
    );
    let held = ns
        .run_ok(["nft", "list", "map", "ip", "kpng", "service-ips"])
        .expect("the map is there again");
    assert!(held.contains("10.96.0.10"), "{held}");
}

/// ClientIP affinity across a restart whose Service set changed: `first` and `second` (both
/// with affinity; `first` sorts first, so a fresh start gives its ports the lower ids), a client
/// stuck to `second`'s endpoint X and, through `first`, to another endpoint Y. kpng stops (its
/// table left in place), `first` goes, kpng starts again over the table: a fresh allocation
/// would give `second` the id `first` had, whose affinity entry sends the client to Y (a valid
/// endpoint of `second` too). Read back from the table, `second` keeps its id and the client
/// still reaches X.
#[test]
fn a_restart_keeps_each_ports_affinity_id() {
    use e2e::harness::{ALL3, Cond, Kpng, SVC_PORT, cip, echo_all, manifest, probes, sa, svc_v4};
    use kpng_testkit::{Cluster, Proto, tally};
    kpng_testkit::require_root!();
    let c = Cluster::create(&e2e::Backend::Nft.prefix("affrst")).expect("cluster");
    let _echo = echo_all(&c);
    let ns = &c.node1.ns;
    let affinity = "sessionAffinity: ClientIP";
    let first = |eps: e2e::harness::Eps<'_>| svc_v4("first", 83, "ClusterIP", affinity, eps);
    let second = svc_v4("second", 84, "ClusterIP", affinity, ALL3);
    let mut k = Kpng::start(
        e2e::Backend::Nft,
        ns,
        &manifest(&[first(ALL3), second.clone()]),
        &[],
    );
    let ext = &c.ext.ns;
    let sole = |n: u8, what: &str| {
        let m = tally(&probes(ext, Proto::Tcp, sa(cip(n, false), SVC_PORT), 10));
        assert_eq!(m.len(), 1, "{what}: expected one server, got {m:?}");
        let name = m.keys().next().expect("one key").clone();
        assert!(!name.starts_with('!'), "{what}: {m:?}");
        name
    };
    let x = sole(84, "second, before the restart");
    let y = ALL3
        .iter()
        .map(|(pod, _)| *pod)
        .find(|pod| *pod != x)
        .expect("another endpoint");
    k.apply(&manifest(&[first(&[(y, Cond::Ready)]), second.clone()]));
    assert_eq!(
        sole(83, "first"),
        y,
        "first sticks the client to its endpoint"
    );

    k.terminate();
    k.write(&manifest(std::slice::from_ref(&second)));
    k.spawn();
    assert_eq!(
        sole(84, "second, after the restart"),
        x,
        "the client still reaches second's endpoint: second kept its affinity id"
    );
    let log = k.stderr();
    assert!(
        log.contains("ClientIP affinity ids read back from the adopted table"),
        "{log}"
    );
}

/// A restart on a manifest cut off mid-write (a writer that writes in place, caught between
/// its parts: the file stops inside Service `b`, and `c` is not written yet) holds the first
/// sync: the rules the earlier run left keep serving `b` and `c` until the writer finishes,
/// when the first sync follows. Before 2026-12-07 the cut-off file was the complete list, and
/// the first sync removed `b` and `c` until the rest was written (crash44: 1,797 Services for
/// 2.5 s).
#[test]
fn a_restart_on_a_manifest_cut_off_mid_write_keeps_the_earlier_rules() {
    use e2e::harness::{ALL3, Kpng, SVC_PORT, cip, echo_all, manifest, probes, sa, svc_v4};
    use kpng_testkit::{Cluster, Proto, tally};
    kpng_testkit::require_root!();
    let c = Cluster::create(&e2e::Backend::Nft.prefix("cutrst")).expect("cluster");
    let _echo = echo_all(&c);
    let ns = &c.node1.ns;
    let services: Vec<String> = [("a", 91), ("b", 92), ("c", 93)]
        .iter()
        .map(|(name, n)| svc_v4(name, *n, "ClusterIP", "", ALL3))
        .collect();
    let whole = manifest(&services);
    let mut k = Kpng::start(e2e::Backend::Nft, ns, &whole, &[]);
    let served = |n: u8, what: &str| {
        let answers = tally(&probes(
            &c.ext.ns,
            Proto::Tcp,
            sa(cip(n, false), SVC_PORT),
            6,
        ));
        assert!(
            !answers.is_empty() && answers.keys().all(|server| !server.starts_with('!')),
            "{what}: Service {n} not served: {answers:?}"
        );
    };
    for n in [91, 92, 93] {
        served(n, "before the restart");
    }

    k.terminate();
    // Cut inside `b`'s Service, right after `spec:` (mid-line): `b` is rejected, `c` absent.
    let b = whole.find("name: b}").expect("b's Service");
    let cut = b + whole[b..].find("spec:").expect("b's spec") + "spec:".len();
    k.write(&whole[..cut]);
    k.spawn_unsynced();
    k.wait_logged("the held first sync", |err| {
        err.contains("the first sync waits: the file looks cut off mid-write")
    });
    let log = k.stderr();
    assert!(log.contains("stops mid-line, at line"), "{log}");
    for n in [91, 92, 93] {
        served(n, "while the restart reads a cut-off file");
    }
    assert_eq!(
        k.sync_counts(),
        (0, 0),
        "no sync from a cut-off file:\n{log}"
    );

    k.write(&whole);
    k.wait_synced(0, 0);
    for n in [91, 92, 93] {
        served(n, "once the file is whole");
    }
}

/// Interface settings of the pod detector that cannot work on the node are warned about at
/// start and shown in `kpng status` (they were silent: every pod masqueraded): a prefix whose
/// links are all ports of a bridge (the testkit's pods hang off `cbr0` by `veth-…` ports),
/// a bridge that does not exist (until it is created: the link watch sees it come), and an
/// interface flag for a mode that ignores it.
#[test]
fn pod_interface_settings_that_cannot_work_are_warned_and_shown() {
    use e2e::harness::{Kpng, manifest};
    kpng_testkit::require_root!();
    let b = e2e::Backend::Nft;
    let c = kpng_testkit::Cluster::create(&b.prefix("podif")).expect("cluster");
    let ns = &c.node1.ns;
    let problem = |k: &Kpng<'_>| -> Option<String> {
        let status = k.status_json();
        status["dataPlane"]
            .as_array()
            .and_then(|lines| lines.iter().find(|l| l["what"] == "pod interfaces"))
            .and_then(|l| l["problem"].as_str().map(String::from))
    };
    let mut k = Kpng::start(
        b,
        ns,
        &manifest(&[]),
        &[
            "--detect-local-mode",
            "InterfaceNamePrefix",
            "--pod-interface-name-prefix",
            "veth-",
        ],
    );
    let ports = "is a port of bridge cbr0: their packets arrive on the bridge, not on them, so \
                 no packet is taken for a pod's: pods' ClusterIP traffic is masqueraded, and \
                 pods get no externalTrafficPolicy Local short-circuit; use --detect-local-mode \
                 BridgeInterface --pod-bridge-interface cbr0";
    k.wait_logged("the bridge ports warning", |e| e.contains(ports));
    assert!(
        problem(&k).is_some_and(|p| p.contains(ports)),
        "{:?}",
        problem(&k)
    );

    k.terminate();
    k.set_extra(&[
        "--detect-local-mode",
        "BridgeInterface",
        "--pod-bridge-interface",
        "cbr9",
    ]);
    k.spawn();
    let missing = "--detect-local-mode BridgeInterface cbr9: no link named cbr9 on this node";
    k.wait_logged("the missing bridge warning", |e| e.contains(missing));
    assert!(
        problem(&k).is_some_and(|p| p.contains(missing)),
        "{:?}",
        problem(&k)
    );
    // The bridge comes: the link watch sees it, the problem goes.
    ns.run_ok(["ip", "link", "add", "cbr9", "type", "bridge"])
        .expect("add cbr9");
    k.wait_logged("the problem gone", |e| {
        e.contains("pod interfaces: --detect-local-mode BridgeInterface cbr9: present")
            && e.contains("the earlier problem is gone")
    });
    assert_eq!(problem(&k), None);
    ns.run_ok(["ip", "link", "del", "cbr9"]).expect("del cbr9");

    k.terminate();
    k.set_extra(&["--pod-bridge-interface", "cbr0"]);
    k.spawn();
    let ignored = "--pod-bridge-interface cbr0 (detectLocal.bridgeInterface) is ignored: \
                   --detect-local-mode ClusterCIDR tells pods by --cluster-cidr";
    k.wait_logged("the ignored flag warning", |e| e.contains(ignored));
    assert!(
        problem(&k).is_some_and(|p| p.contains(ignored)),
        "{:?}",
        problem(&k)
    );

    // Right: nothing to say.
    k.terminate();
    k.set_extra(&[
        "--detect-local-mode",
        "BridgeInterface",
        "--pod-bridge-interface",
        "cbr0",
    ]);
    k.spawn();
    assert_eq!(problem(&k), None);
    assert!(!k.stderr().contains("pod interfaces"), "{}", k.stderr());
}
