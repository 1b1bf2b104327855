//! The capabilities kpng needs on Linux, checked where their absence would otherwise be silent
//! or obscure.
//!
//! Why: in a hardened Pod (capabilities instead of `privileged: true`) a missing capability
//! showed as a retried `nft` error that named none, as a `kpng cleanup` that reported success
//! and removed nothing (the tables could not be listed, so they looked absent), or as legacy
//! iptables rules that were never seen: `iptables-legacy-save` needs a raw socket.
//! - `CAP_NET_ADMIN`: every nftables, iptables and conntrack operation.
//! - `CAP_NET_RAW`: `iptables-legacy` (reading or writing legacy tables).
//! - `CAP_BPF` (or `CAP_SYS_ADMIN`, which kernels before 5.8 need instead): `to-local ebpf`'s
//!   programs and maps; without it every sync failed with "failed to create map …: Operation
//!   not permitted".

/// `CAP_NET_ADMIN`'s bit.
pub const NET_ADMIN: u32 = 12;
/// `CAP_NET_RAW`'s bit.
pub const NET_RAW: u32 = 13;

/// `CAP_SYS_ADMIN`'s bit.
pub const SYS_ADMIN: u32 = 21;
/// `CAP_BPF`'s bit (kernel 5.8+).
pub const BPF: u32 = 39;

/// Refuses `what` without `CAP_BPF` or `CAP_SYS_ADMIN` (loading programs, creating maps),
/// naming them and how a Pod gets them.
pub fn need_bpf(what: &str) -> anyhow::Result<()> {
    if has(BPF) || has(SYS_ADMIN) {
        return Ok(());
    }
    anyhow::bail!(
        "{what} needs CAP_BPF (or CAP_SYS_ADMIN on kernels before 5.8) to load its programs and \
         create its maps, which this process lacks: run it as root with its capabilities, or in \
         a Pod with `privileged: true` or `securityContext.capabilities.add: [NET_ADMIN, \
         NET_RAW, BPF]`"
    )
}

/// The effective set in `/proc/self/status` text (`CapEff:\t000001fffeffffff`).
pub fn effective_in(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
}

/// Whether this process has capability `cap`; `true` when the kernel does not say (the
/// operation then fails with its own error, as before).
pub fn has(cap: u32) -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| effective_in(&s))
        .is_none_or(|set| set & (1 << cap) != 0)
}

/// Refuses `what` without `CAP_NET_ADMIN`, naming it and how a Pod gets it.
pub fn need_net_admin(what: &str) -> anyhow::Result<()> {
    if has(NET_ADMIN) {
        return Ok(());
    }
    anyhow::bail!(
        "{what} needs CAP_NET_ADMIN (nftables, iptables and conntrack all do), which this \
         process lacks: run it as root with its capabilities, or in a Pod with `privileged: \
         true` or `securityContext.capabilities.add: [NET_ADMIN, NET_RAW]`"
    )
}

/// Refuses `what` without `CAP_NET_RAW` (iptables-legacy's raw socket), naming it, how a Pod
/// gets it and what the tool said (`tool_said`), as `need_net_admin` does for nftables.
pub fn need_net_raw(what: &str, tool_said: &[String]) -> anyhow::Result<()> {
    if has(NET_RAW) {
        return Ok(());
    }
    anyhow::bail!(
        "{what} needs CAP_NET_RAW (iptables-legacy reads and writes its tables over a raw \
         socket), which this process lacks: run it as root with its capabilities, or in a Pod \
         with `privileged: true` or `securityContext.capabilities.add: [NET_ADMIN, NET_RAW]` \
         (the tool said: {})",
        tool_said.join("; ")
    )
}

/// Whether this network namespace has legacy iptables tables (`/proc/net/ip_tables_names`,
/// `ip6_tables_names`: readable without touching the tables).
pub fn legacy_tables_present() -> bool {
    ["/proc/net/ip_tables_names", "/proc/net/ip6_tables_names"]
        .iter()
        .any(|p| std::fs::read_to_string(p).is_ok_and(|t| !t.trim().is_empty()))
}

/// Why legacy iptables tables cannot be read here, when they exist and `CAP_NET_RAW` is
/// missing; `None` otherwise.
pub fn legacy_unreadable() -> Option<String> {
    (legacy_tables_present() && !has(NET_RAW)).then(|| {
        "this node has legacy iptables tables, and reading them (iptables-legacy-save) needs \
         CAP_NET_RAW, which this process lacks: kube-proxy's legacy chains there are not seen, \
         removed or chosen (add NET_RAW to the Pod's capabilities)"
            .to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_effective_set_is_read_from_proc_status() {
        let cases = [
            (
                "Name:\tkpng\nCapEff:\t000001fffeffffff\n",
                Some(0x1fffeffffff),
            ),
            ("CapEff:\t0000000000001000\n", Some(1 << NET_ADMIN)),
            ("CapEff:\t0000000000000000\n", Some(0)),
            ("CapInh:\t0\n", None),
            ("CapEff:\tzz\n", None),
        ];
        for (text, want) in cases {
            assert_eq!(effective_in(text), want, "{text:?}");
        }
    }
}
