//! Reads the node's kernel settings that Services need ([`kpng_runner::host_check`]) from
//! `/proc/sys` and `/sys/class/net`: a few small files, cheap enough for every full or periodic
//! sync, and, only when bridge netfilter is off or not loaded, the addresses of the bridges
//! with ports (`ip -o addr show dev BRIDGE`), which tell a pod bridge from Docker's. The
//! decision and the words are the runner's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ipnet::IpNet;
use kpng_model::Family;
use kpng_runner::host_check::{Bridge, HostFacts, HostNeeds, HostProbe};

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

/// The probe reading this process's network namespace; `pod_bridge`: the configured
/// `--pod-bridge-interface` (`detectLocalMode: BridgeInterface`), if any.
pub fn probe(pod_bridge: Option<String>) -> HostProbe {
    Arc::new(move || {
        let mut facts = read(Path::new("/proc/sys"), Path::new("/sys/class/net"), |dev| {
            bridge_addresses(dev)
        });
        facts.configured_pod_bridge.clone_from(&pod_bridge);
        facts
    })
}

/// The addresses of `dev` (`ip -o addr show dev DEV`); none when `ip` fails.
fn bridge_addresses(dev: &str) -> Vec<IpNet> {
    std::process::Command::new("ip")
        .args(["-o", "addr", "show", "dev", dev])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| parse_addresses(&String::from_utf8_lossy(&o.stdout)))
        .unwrap_or_default()
}

/// The `inet`/`inet6` addresses with prefix of `ip -o addr` output.
fn parse_addresses(text: &str) -> Vec<IpNet> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|w| *w == "inet" || *w == "inet6")?;
            words.next()?.parse().ok()
        })
        .collect()
}

/// Reads the facts from `proc_sys` (`/proc/sys`) and `class_net` (`/sys/class/net`), and the
/// bridges' addresses with `addresses` when bridge netfilter may be off for some family.
pub fn read(
    proc_sys: &Path,
    class_net: &Path,
    addresses: impl Fn(&str) -> Vec<IpNet>,
) -> HostFacts {
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
    let br_netfilter_loaded = bridge.join("bridge-nf-call-iptables").exists();
    let may_be_off = kpng_runner::host_check::bridge_netfilter_may_be_off(
        br_netfilter_loaded,
        &bridge_nf_call,
        &Family::ALL,
    );
    let bridges_with_ports = bridges_with_ports(class_net)
        .into_iter()
        .map(|name| Bridge {
            addresses: if may_be_off {
                addresses(&name)
            } else {
                Vec::new()
            },
            name,
        })
        .collect();
    HostFacts {
        forwarding,
        br_netfilter_loaded,
        bridge_nf_call,
        bridges_with_ports,
        configured_pod_bridge: None,
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
        let addrs = |dev: &str| -> Vec<IpNet> {
            if dev == "cni0" {
                vec!["10.244.1.1/24".parse().expect("net")]
            } else {
                Vec::new()
            }
        };
        let facts = read(&sys, &net, addrs);
        assert_eq!(
            facts.forwarding,
            BTreeMap::from([(Family::V4, false), (Family::V6, true)])
        );
        assert!(!facts.br_netfilter_loaded && facts.bridge_nf_call.is_empty());
        // br_netfilter not loaded: the addresses are read.
        assert_eq!(
            facts.bridges_with_ports,
            [Bridge {
                name: "cni0".into(),
                addresses: addrs("cni0")
            }]
        );
        write(&sys.join("net/bridge/bridge-nf-call-iptables"), "1\n");
        write(&sys.join("net/bridge/bridge-nf-call-ip6tables"), "1\n");
        // Bridge netfilter on: nothing depends on the addresses, which are not read.
        let facts = read(&sys, &net, |_: &str| -> Vec<IpNet> { panic!("read") });
        assert!(facts.bridges_with_ports[0].addresses.is_empty());
        write(&sys.join("net/bridge/bridge-nf-call-iptables"), "0\n");
        let facts = read(&sys, &net, addrs);
        assert!(facts.br_netfilter_loaded);
        assert_eq!(
            facts.bridge_nf_call,
            BTreeMap::from([(Family::V4, false), (Family::V6, true)])
        );
        assert_eq!(facts.bridges_with_ports[0].addresses, addrs("cni0"));
    }

    #[test]
    fn parses_ip_o_addr_with_prefixes() {
        let text = "5: cni0    inet 10.244.1.1/24 brd 10.244.1.255 scope global cni0\\       \
                    valid_lft forever preferred_lft forever\n\
                    5: cni0    inet6 fd00:244:1::1/64 scope global \\       valid_lft forever\n";
        let got: Vec<String> = parse_addresses(text)
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(got, ["10.244.1.1/24", "fd00:244:1::1/64"]);
    }
}
