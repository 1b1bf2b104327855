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
