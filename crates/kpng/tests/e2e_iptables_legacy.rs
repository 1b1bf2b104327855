//! Real-packet end-to-end tests of `kpng … to-local iptables --iptables-mode legacy` (the shared
//! suite in `e2e/`, with iptables mode's documented differences from nftables).

mod e2e;

e2e::suite!(e2e::Backend::IptablesLegacy);

#[test]
fn session_affinity_dual_stack() {
    e2e::scenarios::session_affinity_dual_stack(e2e::Backend::IptablesLegacy);
}

#[test]
fn iptables_chains_and_flush_repair() {
    e2e::scenarios::iptables_chains_and_flush_repair(e2e::Backend::IptablesLegacy);
}

// The fault suite (`e2e/faults.rs`; figures in docs/reliability.md).

#[test]
fn fault_nat_flushed() {
    e2e::faults::iptables_nat_flushed(e2e::Backend::IptablesLegacy);
}

#[test]
fn fault_nat_chains_deleted() {
    e2e::faults::iptables_nat_deleted(e2e::Backend::IptablesLegacy);
}

#[test]
fn fault_jump_deleted() {
    e2e::faults::iptables_jump_deleted(e2e::Backend::IptablesLegacy);
}

/// An external client's connection held through a node port survives
/// `iptables-legacy-restore` of a saved ruleset (the anchor table keeps a conntrack user in the
/// namespace; docs/reliability.md).
#[test]
fn fault_restore_keeps_a_node_port_connection() {
    e2e::faults::iptables_restored_node_port(e2e::Backend::IptablesLegacy);
}

#[test]
fn fault_killed_during_a_sync_and_restarted() {
    e2e::faults::kill_during_sync_and_restart(e2e::Backend::IptablesLegacy);
}
