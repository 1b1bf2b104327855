//! Reads the node's kernel settings that Services need ([`kpng_runner::host_check`]) from
//! `/proc/sys` and `/sys/class/net`: a few small files, cheap enough for every full or periodic
//! sync. The decision and the words are the runner's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kpng_model::Family;
use kpng_runner::host_check::{HostFacts, HostNeeds, HostProbe};

use crate::backends::BackendKind;

/// What `kind` needs of the node: forwarding and bridge netfilter for the backends that
/// translate in netfilter's hooks (nftables, iptables); nothing for those that translate at
/// the socket (userspace, eBPF) or on another platform (HNS).
pub fn needs(kind: BackendKind) -> HostNeeds {
    match kind {
        BackendKind::Nft | BackendKind::Iptables => HostNeeds {
            forwarding: true,
            bridge_netfilter: true,
        },
        BackendKind::Userspace | BackendKind::Ebpf | BackendKind::Hns => HostNeeds::default(),
    }
}

/// The probe reading this process's network namespace.
pub fn probe() -> HostProbe {
    Arc::new(|| read(Path::new("/proc/sys"), Path::new("/sys/class/net")))
}

/// Reads the facts from `proc_sys` (`/proc/sys`) and `class_net` (`/sys/class/net`).
pub fn read(proc_sys: &Path, class_net: &Path) -> HostFacts {
    let flag = |path: PathBuf| std::fs::read_to_string(path).ok().map(|v| v.trim() != "0");
    let mut forwarding = BTreeMap::new();
    for (family, key) in [
        (Family::V4, "net/ipv4/ip_forward"),
        (Family::V6, "net/ipv6/conf/all/forwarding"),
    ] {
        if let Some(on) = flag(proc_sys.join(key)) {
            forwarding.insert(family, on);
        }
    }
    let bridge = proc_sys.join("net/bridge");
    let mut bridge_nf_call = BTreeMap::new();
    for (family, key) in [
        (Family::V4, "bridge-nf-call-iptables"),
        (Family::V6, "bridge-nf-call-ip6tables"),
    ] {
        if let Some(on) = flag(bridge.join(key)) {
            bridge_nf_call.insert(family, on);
        }
    }
    HostFacts {
        forwarding,
        br_netfilter_loaded: bridge.join("bridge-nf-call-iptables").exists(),
        bridge_nf_call,
        bridges_with_ports: bridges_with_ports(class_net),
    }
}

/// The Linux bridges (`DEV/bridge` exists) that have at least one port (`DEV/brif` not empty).
fn bridges_with_ports(class_net: &Path) -> Vec<String> {
    let Ok(devices) = std::fs::read_dir(class_net) else {
        return Vec::new();
    };
    let mut out: Vec<String> = devices
        .flatten()
        .filter(|d| d.path().join("bridge").is_dir())
        .filter(|d| {
            std::fs::read_dir(d.path().join("brif")).is_ok_and(|mut ports| ports.next().is_some())
        })
        .map(|d| d.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_sysctls_and_the_bridges_with_ports() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sys = dir.path().join("sys");
        let net = dir.path().join("net");
        let write = |p: &Path, v: &str| {
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, v).expect("write");
        };
        write(&sys.join("net/ipv4/ip_forward"), "0\n");
        write(&sys.join("net/ipv6/conf/all/forwarding"), "1\n");
        // cni0 with a port, docker0 without, eth0 no bridge.
        std::fs::create_dir_all(net.join("cni0/bridge")).expect("mkdir");
        write(&net.join("cni0/brif/veth1"), "");
        std::fs::create_dir_all(net.join("docker0/bridge")).expect("mkdir");
        std::fs::create_dir_all(net.join("docker0/brif")).expect("mkdir");
        std::fs::create_dir_all(net.join("eth0")).expect("mkdir");
        let facts = read(&sys, &net);
        assert_eq!(
            facts.forwarding,
            BTreeMap::from([(Family::V4, false), (Family::V6, true)])
        );
        assert!(!facts.br_netfilter_loaded && facts.bridge_nf_call.is_empty());
        assert_eq!(facts.bridges_with_ports, ["cni0"]);
        write(&sys.join("net/bridge/bridge-nf-call-iptables"), "0\n");
        write(&sys.join("net/bridge/bridge-nf-call-ip6tables"), "1\n");
        let facts = read(&sys, &net);
        assert!(facts.br_netfilter_loaded);
        assert_eq!(
            facts.bridge_nf_call,
            BTreeMap::from([(Family::V4, false), (Family::V6, true)])
        );
    }
}
