//! Real-packet end-to-end tests of `kpng … to-local nft` (the shared suite in `e2e/`).

mod e2e;

e2e::suite!(e2e::Backend::Nft);

#[test]
fn session_affinity_dual_stack() {
    e2e::scenarios::session_affinity_dual_stack(e2e::Backend::Nft);
}

#[test]
fn session_affinity_keeps_foreign_conntrack_mark_bits() {
    e2e::scenarios::session_affinity_keeps_foreign_conntrack_mark_bits(e2e::Backend::Nft);
}

// The fault suite (`e2e/faults.rs`; figures in docs/reliability.md).

#[test]
fn fault_table_deleted() {
    e2e::faults::nft_table_deleted(e2e::Backend::Nft);
}

#[test]
fn fault_ruleset_flushed() {
    e2e::faults::nft_ruleset_flushed(e2e::Backend::Nft);
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
        log.contains("another configuration's rules; putting ours in place"),
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
