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

#[test]
fn fault_ruleset_flushed() {
    e2e::faults::nft_ruleset_flushed(e2e::Backend::IptablesNft);
}

#[test]
fn one_instance_per_namespace() {
    e2e::faults::one_instance_per_namespace(e2e::Backend::IptablesNft);
}

#[test]
fn fault_killed_during_a_sync_and_restarted() {
    e2e::faults::kill_during_sync_and_restart(e2e::Backend::IptablesNft);
}
