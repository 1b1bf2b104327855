//! Real-packet end-to-end tests of `kpng … to-local nft` (the shared suite in `e2e/`).

mod e2e;

e2e::suite!(e2e::Backend::Nft);

#[test]
#[ignore = "LIMITATION (docs/nftables.md): IPv6 ClientIP affinity is disabled (its `@affinity { ip6 saddr . ct mark : ip6 daddr . th dport }` updates need a newer nft than 1.0.6), so IPv6 clients are not sticky"]
fn session_affinity_dual_stack() {
    e2e::scenarios::session_affinity_dual_stack(e2e::Backend::Nft);
}
