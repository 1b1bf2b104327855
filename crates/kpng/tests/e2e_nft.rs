//! Real-packet end-to-end tests of `kpng … to-local nft` (the shared suite in `e2e/`).

mod e2e;

e2e::suite!(e2e::Backend::Nft);

#[test]
fn session_affinity_dual_stack() {
    e2e::scenarios::session_affinity_dual_stack(e2e::Backend::Nft);
}
