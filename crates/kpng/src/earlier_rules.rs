//! Whether the backend starts over rules an earlier run left that still route Service traffic
//! until its first sync replaces them: asked once when the backend is built, never in the sync
//! loop.
//!
//! Why: a node fed by a brain holds a new session's empty first state instead of applying it
//! when it programs Services (`kpng_api::client::hold`), so that one bad brain input (an empty
//! manifest directory, another cluster's kubeconfig) cannot empty every node. Right after a
//! restart the node has applied nothing yet, and only the backend's own rules in the kernel say
//! that there is something to keep; the runner also says, until the first sync, that they route
//! traffic (`kpng status`, `kpng trace`, the first sync's history line). Until 2026-12-07 only
//! the nftables backend said so, and an iptables or eBPF node restarted against a brain serving
//! an empty state deleted every Service rule.
//!
//! Per backend, by what it keeps (its [`Leftover`]s, [`crate::leftovers::own`]):
//! - nftables (and the eBPF backend's rules half): kpng's `kpng` table exists (one netlink
//!   table dump); its first sync adopts it.
//! - iptables (each variant its own): `KUBE-SERVICES` sends a Service to its chain and a built-in
//!   chain jumps to it ([`kpng_backend_iptables::earlier`], three one-chain listings per family).
//!   kube-proxy's iptables mode writes the same chains under the same names, and the backend
//!   adopts them the same way, so they count too.
//! - eBPF sockets: the pinned frontends map holds a frontend (one batched dump); the restarted
//!   kpng opens the same maps and its programs translate with them.
//! - userspace: never. Its capture rules send Service traffic to listeners of the kpng process,
//!   which died with it: nothing answers until the new process has Services to listen for, so
//!   keeping its rules through an empty state would keep nothing that works.

use std::path::Path;

use crate::leftovers::{EbpfPlaces, Leftover, Variant};

/// Whether any of `own` (what the backend installs itself) holds rules an earlier run left that
/// route Service traffic now. `pins` is the eBPF backend's pin directory (`--bpf-pin-path`).
pub fn found(own: &[Leftover], pins: &Path) -> bool {
    own.iter()
        .filter(|l| kept_until_first_sync(**l))
        .any(|l| routes_services(*l, pins))
}

/// Whether the backend that owns `leftover` leaves it routing until its first sync (the module's
/// doc): the rest cannot be kept by holding a state back.
fn kept_until_first_sync(leftover: Leftover) -> bool {
    match leftover {
        Leftover::KpngNft | Leftover::IptablesChains(_) | Leftover::KpngEbpf => true,
        // Its listeners died with the process that had them.
        Leftover::KpngUserspace => false,
        // Never a kpng backend's own.
        Leftover::KubeProxyNft | Leftover::KubeProxyIpvs => false,
    }
}

/// Whether `leftover` is on the node and routes Services (asked of the kernel).
fn routes_services(leftover: Leftover, pins: &Path) -> bool {
    use kpng_backend_iptables::exec::Mode;
    match leftover {
        Leftover::KpngNft => leftover.present(&EbpfPlaces {
            pins: pins.to_path_buf(),
            cgroup: None,
        }),
        Leftover::IptablesChains(variant) => {
            kpng_backend_iptables::earlier::rules_route_services(match variant {
                Variant::Legacy => Mode::Legacy,
                Variant::Nft => Mode::Nft,
            })
        }
        Leftover::KpngEbpf => kpng_backend_ebpf::inspect::frontends_pinned(pins),
        Leftover::KpngUserspace | Leftover::KubeProxyNft | Leftover::KubeProxyIpvs => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::BackendKind;
    use crate::leftovers::own;

    /// Which backends' earlier rules a held state keeps routing: every kernel backend's own,
    /// not the userspace proxy's (its listeners are gone), and never another proxy's.
    #[test]
    fn each_backend_keeps_its_kernel_rules_but_not_the_userspace_listeners() {
        let cases = [
            (BackendKind::Nft, None, true),
            (BackendKind::Iptables, Some(Variant::Legacy), true),
            (BackendKind::Iptables, Some(Variant::Nft), true),
            (BackendKind::Ebpf, None, true),
            (BackendKind::Userspace, None, false),
            (BackendKind::Hns, None, false),
        ];
        for (kind, variant, kept) in cases {
            assert_eq!(
                own(kind, variant).into_iter().any(kept_until_first_sync),
                kept,
                "{kind:?} {variant:?}"
            );
        }
        assert!(!kept_until_first_sync(Leftover::KubeProxyNft));
        assert!(!kept_until_first_sync(Leftover::KubeProxyIpvs));
    }

    /// With nothing kept, nothing is asked of the kernel and nothing is found.
    #[test]
    fn a_backend_that_keeps_nothing_finds_nothing() {
        let pins = Path::new("/nonexistent/kpng-pins");
        assert!(!found(&[], pins));
        assert!(!found(&[Leftover::KpngUserspace], pins));
        assert!(!found(&own(BackendKind::Hns, None), pins));
    }
}
