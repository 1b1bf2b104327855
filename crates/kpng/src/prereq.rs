//! What the nftables backends need from the node, checked at start with a clear message, as
//! kube-proxy checks it (`pkg/proxy/nftables/proxier.go`, knftables): kernel 5.13 or later
//! (older kernels lack nftables features kube-proxy's and kpng's rulesets use, and had
//! nftables bugs that break them), and `nft` 1.0.1 or later (older versions parse the whole
//! ruleset, every table of every program, at each invocation). Without the check, an old node
//! fails later with an `nft` syntax error that names neither.
//!
//! The eBPF backend also needs 5.18 for its socket programs ([`MIN_KERNEL_EBPF`]); without
//! the check an older node failed every sync with a verifier error about `bpf_set_retval`.
//!
//! The node's IP forwarding and bridge netfilter are checked by the runner at every full sync
//! (`kpng_runner::host_check`), not here.
//!
//! `KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK` (kube-proxy's) or
//! `KPNG_SKIP_KERNEL_VERSION_CHECK`, set to anything, skip the kernel check, for kernels with
//! backported features.

use crate::backends::BackendKind;

/// The oldest kernel nftables mode supports.
pub const MIN_KERNEL: (u32, u32) = (5, 13);
/// The oldest kernel the eBPF backend's socket programs load on: `bpf_set_retval` (a connect
/// to a Service without endpoints fails with ECONNREFUSED) came with 5.18; the other hooks and
/// helpers it uses are older (getpeername 5.8, sock_release 5.9, cgroup bpf_links 5.7).
pub const MIN_KERNEL_EBPF: (u32, u32) = (5, 18);
/// The oldest `nft` the nftables backends support.
pub const MIN_NFT: (u32, u32, u32) = (1, 0, 1);
/// Environment variables that skip the kernel check.
pub const SKIP_KERNEL_CHECK: [&str; 2] = [
    "KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK",
    "KPNG_SKIP_KERNEL_VERSION_CHECK",
];

/// `major.minor[.patch]` at the start of `text` (`6.1.0-18-amd64`, `v1.0.6`).
pub fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let text = text.trim().trim_start_matches('v');
    let mut parts = text.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    Some((major, minor, patch))
}

/// The version in `nft --version`'s output (`nftables v1.0.6 (Lester Gooch #5)`).
pub fn nft_version(output: &str) -> Option<(u32, u32, u32)> {
    output
        .split_whitespace()
        .find(|w| w.starts_with('v') && w[1..].starts_with(|c: char| c.is_ascii_digit()))
        .and_then(parse_version)
}

/// Judges a kernel release (`uname -r`) for `kind`.
pub fn kernel_ok(kind: BackendKind, release: &str) -> Result<(), String> {
    // The kernels the nftables ruleset (and the eBPF programs) need; one arm per backend.
    match kind {
        BackendKind::Nft | BackendKind::Ebpf => {}
        BackendKind::Iptables | BackendKind::Userspace | BackendKind::Hns => return Ok(()),
    }
    let Some((major, minor, _)) = parse_version(release) else {
        return Err(format!("cannot read the kernel version {release:?}"));
    };
    if kind == BackendKind::Ebpf && (major, minor) < MIN_KERNEL_EBPF {
        return Err(format!(
            "the eBPF backend needs Linux {}.{} or later, this node runs {} (its programs use \
             bpf_set_retval, which the kernel's verifier refuses before 5.18); use `to-local \
             nft`, the same Service behaviour with the nftables rules alone, or set {} if this \
             kernel has the feature backported",
            MIN_KERNEL_EBPF.0,
            MIN_KERNEL_EBPF.1,
            release.trim(),
            SKIP_KERNEL_CHECK[0]
        ));
    }
    if (major, minor) < MIN_KERNEL {
        return Err(format!(
            "the nftables backend needs Linux {}.{} or later, this node runs {release} (as \
             kube-proxy's nftables mode); use the iptables backend (mode \"iptables\"), or set \
             {} if this kernel has the features backported",
            MIN_KERNEL.0, MIN_KERNEL.1, SKIP_KERNEL_CHECK[0]
        ));
    }
    Ok(())
}

/// Judges `nft --version`'s output.
pub fn nft_ok(output: &str) -> Result<(), String> {
    let Some(version) = nft_version(output) else {
        return Err(format!(
            "cannot read nft's version from {:?}",
            output.trim()
        ));
    };
    if version < MIN_NFT {
        return Err(format!(
            "nft {}.{}.{} is too old: kpng needs nft {}.{}.{} or later (older versions parse \
             every table on the node at each call); install a newer nftables package",
            version.0, version.1, version.2, MIN_NFT.0, MIN_NFT.1, MIN_NFT.2
        ));
    }
    Ok(())
}

/// Checks the node for `kind`, whose `nft` tool is `nft_binary`.
#[cfg(target_os = "linux")]
pub fn check(kind: BackendKind, nft_binary: &str) -> anyhow::Result<()> {
    let skip = SKIP_KERNEL_CHECK
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()));
    if !skip {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        kernel_ok(kind, &release).map_err(anyhow::Error::msg)?;
    }
    let needs_nft = match kind {
        BackendKind::Nft | BackendKind::Userspace | BackendKind::Ebpf => true,
        BackendKind::Iptables | BackendKind::Hns => false,
    };
    if needs_nft {
        let output = kpng_backend_kit::exec::run_tool(nft_binary, &["--version"], None)
            .map_err(|e| anyhow::anyhow!("the {} backend needs nft: {e}", kind.word()))?;
        nft_ok(&output).map_err(anyhow::Error::msg)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_as_the_kernel_and_nft_print_them() {
        assert_eq!(parse_version("6.1.0-18-amd64\n"), Some((6, 1, 0)));
        assert_eq!(parse_version("5.4.0"), Some((5, 4, 0)));
        assert_eq!(parse_version("6.18.44-fc-v669"), Some((6, 18, 44)));
        assert_eq!(
            nft_version("nftables v1.0.6 (Lester Gooch #5)"),
            Some((1, 0, 6))
        );
        assert_eq!(nft_version("nftables v0.9.8 (E.D.S.)"), Some((0, 9, 8)));
        assert_eq!(nft_version("garbage"), None);
    }

    #[test]
    fn old_kernels_and_old_nft_are_refused_with_the_way_out() {
        assert!(kernel_ok(BackendKind::Nft, "5.13.0").is_ok());
        let err = kernel_ok(BackendKind::Nft, "5.10.0-28-amd64").expect_err("too old");
        assert!(
            err.contains("needs Linux 5.13") && err.contains("iptables"),
            "{err}"
        );
        assert!(kernel_ok(BackendKind::Iptables, "4.19.0").is_ok());
        // The eBPF backend's programs need more than the nftables half: Ubuntu 22.04's 5.15
        // runs nft but not ebpf.
        assert!(kernel_ok(BackendKind::Nft, "5.15.0-91-generic").is_ok());
        let err = kernel_ok(BackendKind::Ebpf, "5.15.0-91-generic\n").expect_err("too old");
        assert!(
            err.starts_with(
                "the eBPF backend needs Linux 5.18 or later, this node runs 5.15.0-91-generic"
            ) && err.contains("to-local nft"),
            "{err}"
        );
        assert!(kernel_ok(BackendKind::Ebpf, "5.18.0").is_ok());
        assert!(kernel_ok(BackendKind::Ebpf, "6.1.0-18-amd64").is_ok());
        assert!(nft_ok("nftables v1.0.1 (Fearless Fosdick #3)").is_ok());
        let err = nft_ok("nftables v0.9.8 (E.D.S.)").expect_err("too old");
        assert!(err.contains("nft 0.9.8 is too old"), "{err}");
    }
}
