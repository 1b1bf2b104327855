//! Real-packet end-to-end tests of `kpng … to-local iptables --iptables-mode nft` (the shared
//! suite in `e2e/`, with iptables mode's documented differences from nftables).

mod e2e;

e2e::suite!(e2e::Backend::IptablesNft);

#[test]
fn session_affinity_dual_stack() {
    e2e::scenarios::session_affinity_dual_stack(e2e::Backend::IptablesNft);
}

#[test]
fn iptables_chains_and_flush_repair() {
    e2e::scenarios::iptables_chains_and_flush_repair(e2e::Backend::IptablesNft);
}

// The fault suite (`e2e/faults.rs`; figures in docs/reliability.md).

#[test]
fn fault_nat_flushed() {
    e2e::faults::iptables_nat_flushed(e2e::Backend::IptablesNft);
}

#[test]
fn fault_nat_chains_deleted() {
    e2e::faults::iptables_nat_deleted(e2e::Backend::IptablesNft);
}

#[test]
fn fault_jump_deleted() {
    e2e::faults::iptables_jump_deleted(e2e::Backend::IptablesNft);
}

#[test]
fn fault_double_flush_during_the_repair() {
    e2e::faults::double_flush(e2e::Backend::IptablesNft);
}

/// A rule inserted into kpng's chains while its own restore runs (its monitor away) is found
/// by the generation id and repaired (docs/reliability.md).
#[test]
fn fault_rule_inserted_during_a_sync_is_repaired() {
    assert!(e2e::faults::iptables_rule_inserted_during_a_sync(
        e2e::Backend::IptablesNft
    ));
}

/// Neighbours committing their own chains, jumps and tables during each of kpng's restores are
/// not taken as someone changing kpng's rules.
#[test]
fn fault_neighbour_commits_during_syncs_are_not_tampering() {
    let (overlapped, log) =
        e2e::faults::iptables_neighbour_commits_during_syncs(e2e::Backend::IptablesNft);
    if overlapped == 0 {
        return; // not root: skipped with its reason printed
    }
    assert!(
        overlapped >= 3,
        "the neighbours committed during the start and both changes: {overlapped}"
    );
    assert!(
        !log.contains("changed by someone else"),
        "no change of kpng's rules, no repair:\n{log}"
    );
}

#[test]
fn fault_ruleset_flushed() {
    e2e::faults::nft_ruleset_flushed(e2e::Backend::IptablesNft);
}

/// An external client's connection held through a node port survives `nft flush ruleset`
/// and `iptables-nft-restore` of a saved ruleset (the anchor table; docs/reliability.md).
#[test]
fn fault_ruleset_flushed_keeps_a_node_port_connection() {
    e2e::faults::nft_ruleset_flushed_node_port(e2e::Backend::IptablesNft);
}

#[test]
fn fault_restore_keeps_a_node_port_connection() {
    e2e::faults::iptables_restored_node_port(e2e::Backend::IptablesNft);
}

#[test]
fn one_instance_per_namespace() {
    e2e::faults::one_instance_per_namespace(e2e::Backend::IptablesNft);
}

#[test]
fn fault_killed_during_a_sync_and_restarted() {
    e2e::faults::kill_during_sync_and_restart(e2e::Backend::IptablesNft);
}
