//! Interface settings of the pod detector that cannot work on this node, said at start, when
//! the node's links change, and in `kpng status`.
//!
//! Why: `--detect-local-mode BridgeInterface|InterfaceNamePrefix` tells pods by the interface a
//! packet arrives on, and a setting that matches no such interface fails silently: every pod's
//! ClusterIP traffic is masqueraded and pods lose the externalTrafficPolicy Local
//! short-circuit, with nothing in the rules to show why. Seen by CNI integrators:
//!
//! - no link of that name or prefix (`--pod-bridge-interface cni9`, a typo; or a bridge CNI
//!   before its first pod creates the bridge);
//! - every matching link is a port of a bridge (`InterfaceNamePrefix veth` on a bridge CNI):
//!   a bridged port's packets reach the IP layer on the bridge, not on the port, so the prefix
//!   never matches: the bridge is what to name;
//! - an interface flag given for a mode that ignores it (`--pod-bridge-interface` with the
//!   default ClusterCIDR mode).
//!
//! The decision ([`problems`]) is platform-free and table-tested; the links are read with
//! `ip -d -o link show` (as the host's addresses are, with `ip`), again at each burst of link
//! notifications on a `NETLINK_ROUTE` socket.

use std::sync::{Arc, Mutex};

use kpng_runner::admin::{DataPlaneDetail, DataPlaneProbe};
use tracing::{info, warn};

use crate::cli::{DetectLocalMode, GlobalFlags};

/// One link of the node, as far as the pod detector cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// Its name (`cni0`, `veth1234`).
    pub name: String,
    /// The bridge it is a port of: its packets reach the rules as arriving on that bridge.
    pub bridge: Option<String>,
}

/// The interface setting checked: what the rules match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setting {
    /// `--detect-local-mode BridgeInterface --pod-bridge-interface NAME`.
    Bridge(String),
    /// `--detect-local-mode InterfaceNamePrefix --pod-interface-name-prefix PREFIX`.
    Prefix(String),
}

impl Setting {
    /// The interface setting the flags make, when the mode decides by interface.
    pub fn of(flags: &GlobalFlags) -> Option<Setting> {
        match flags.detect_local_mode {
            DetectLocalMode::BridgeInterface => {
                flags.pod_bridge_interface.clone().map(Setting::Bridge)
            }
            DetectLocalMode::InterfaceNamePrefix => {
                flags.pod_interface_name_prefix.clone().map(Setting::Prefix)
            }
            _ => None,
        }
    }

    fn matches(&self, link: &str) -> bool {
        match self {
            Setting::Bridge(b) => link == b,
            Setting::Prefix(p) => link.starts_with(p.as_str()),
        }
    }

    fn flag(&self) -> String {
        match self {
            Setting::Bridge(b) => format!("--detect-local-mode BridgeInterface {b}"),
            Setting::Prefix(p) => format!("--detect-local-mode InterfaceNamePrefix {p}"),
        }
    }
}

/// The interface flags given for a mode that ignores them, in words (one line each): the
/// operator meant something the rules do not do.
pub fn ignored_flags(flags: &GlobalFlags) -> Vec<String> {
    let mode = flags.detect_local_mode;
    let mut out = Vec::new();
    if let Some(b) = &flags.pod_bridge_interface
        && mode != DetectLocalMode::BridgeInterface
    {
        out.push(format!(
            "--pod-bridge-interface {b} (detectLocal.bridgeInterface) is ignored: \
             --detect-local-mode {} {}; to tell pods by the bridge, use --detect-local-mode \
             BridgeInterface",
            mode.as_str(),
            mode_words(mode)
        ));
    }
    if let Some(p) = &flags.pod_interface_name_prefix
        && mode != DetectLocalMode::InterfaceNamePrefix
    {
        out.push(format!(
            "--pod-interface-name-prefix {p} (detectLocal.interfaceNamePrefix) is ignored: \
             --detect-local-mode {} {}; to tell pods by the prefix, use --detect-local-mode \
             InterfaceNamePrefix",
            mode.as_str(),
            mode_words(mode)
        ));
    }
    out
}

fn mode_words(mode: DetectLocalMode) -> &'static str {
    match mode {
        DetectLocalMode::ClusterCidr => "tells pods by --cluster-cidr",
        DetectLocalMode::NodeCidr => "tells pods by the Node's spec.podCIDRs",
        DetectLocalMode::BridgeInterface => "tells pods by --pod-bridge-interface",
        DetectLocalMode::InterfaceNamePrefix => "tells pods by --pod-interface-name-prefix",
        DetectLocalMode::None => "tells no pod apart",
    }
}

/// What is wrong with `setting` on a node with `links`, one line each; empty when some link
/// matches and not every matching link is a bridge's port.
pub fn problems(setting: &Setting, links: &[Link]) -> Vec<String> {
    let matching: Vec<&Link> = links.iter().filter(|l| setting.matches(&l.name)).collect();
    let silent = "no packet is taken for a pod's: pods' ClusterIP traffic is masqueraded, and \
                  pods get no externalTrafficPolicy Local short-circuit";
    if matching.is_empty() {
        let what = match setting {
            Setting::Bridge(b) => format!("no link named {b}"),
            Setting::Prefix(p) => format!("no link whose name starts with {p}"),
        };
        return vec![format!(
            "{}: {what} on this node (yet: a bridge CNI creates its bridge with the first pod), \
             so {silent}",
            setting.flag()
        )];
    }
    let mut masters: Vec<&str> = Vec::new();
    for l in &matching {
        match &l.bridge {
            Some(m) => {
                if !masters.contains(&m.as_str()) {
                    masters.push(m);
                }
            }
            None => return Vec::new(),
        }
    }
    let names: Vec<&str> = matching.iter().map(|l| l.name.as_str()).take(3).collect();
    let more = if matching.len() > names.len() {
        format!(" and {} more", matching.len() - names.len())
    } else {
        String::new()
    };
    let suggest = masters
        .iter()
        .map(|m| format!("--detect-local-mode BridgeInterface --pod-bridge-interface {m}"))
        .collect::<Vec<_>>()
        .join(" or ");
    vec![format!(
        "{}: every matching link ({}{more}) is a port of bridge {}: their packets arrive on \
         the bridge, not on them, so {silent}; use {suggest}",
        setting.flag(),
        names.join(", "),
        masters.join(", ")
    )]
}

/// The links' state for `kpng status --wide`.
fn state(setting: &Setting, links: &[Link]) -> String {
    let matching: Vec<&str> = links
        .iter()
        .filter(|l| setting.matches(&l.name))
        .map(|l| l.name.as_str())
        .collect();
    match setting {
        Setting::Bridge(b) => {
            let ports = links
                .iter()
                .filter(|l| l.bridge.as_deref() == Some(b))
                .count();
            if matching.is_empty() {
                format!("{}: no such link", setting.flag())
            } else {
                format!("{}: present, {ports} bridge ports", setting.flag())
            }
        }
        Setting::Prefix(_) => format!("{}: {} matching links", setting.flag(), matching.len()),
    }
}

/// Parses `ip -d -o link show`: one link a line, `N: NAME[@PEER]: <FLAGS> … master BR …
/// bridge_slave …` (a bridge's port has `bridge_slave` details; another master, a bond or a
/// VRF, is not a bridge).
pub fn parse_links(text: &str) -> Vec<Link> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (Some(_index), Some(name)) = (words.next(), words.next()) else {
            continue;
        };
        let name = name.trim_end_matches(':');
        let name = name.split_once('@').map_or(name, |(n, _)| n);
        if name.is_empty() {
            continue;
        }
        let words: Vec<&str> = words.collect();
        let master = words
            .iter()
            .position(|w| *w == "master")
            .and_then(|i| words.get(i + 1));
        let bridge_port = words.contains(&"bridge_slave");
        out.push(Link {
            name: name.to_string(),
            bridge: master.filter(|_| bridge_port).map(|m| m.to_string()),
        });
    }
    out
}

/// This node's links; `None` when `ip` cannot tell (then nothing is said).
fn read_links() -> Option<Vec<Link>> {
    let out = std::process::Command::new("ip")
        .args(["-d", "-o", "link", "show"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    Some(parse_links(&String::from_utf8_lossy(&out.stdout)))
}

/// The checks of one kpng: the setting, and the problems last found.
#[derive(Clone)]
pub struct Check {
    setting: Option<Setting>,
    ignored: Vec<String>,
    last: Arc<Mutex<(String, Vec<String>)>>,
}

impl Check {
    /// The checks `flags` call for; `None` when there is nothing to check.
    pub fn new(flags: &GlobalFlags) -> Option<Check> {
        let setting = Setting::of(flags);
        let ignored = ignored_flags(flags);
        (setting.is_some() || !ignored.is_empty()).then(|| Check {
            setting,
            ignored,
            last: Arc::new(Mutex::new((String::new(), Vec::new()))),
        })
    }

    /// Reads the links, warns of each problem not warned before (at start: all of them) and
    /// says when one went away.
    fn refresh(&self) {
        let (state_now, found) = match (&self.setting, read_links()) {
            (Some(setting), Some(links)) => (state(setting, &links), problems(setting, &links)),
            (Some(setting), None) => (format!("{}: links unreadable", setting.flag()), Vec::new()),
            (None, _) => ("no interface detection".to_string(), Vec::new()),
        };
        let Ok(mut last) = self.last.lock() else {
            return;
        };
        for p in found.iter().filter(|p| !last.1.contains(p)) {
            warn!("{p}");
        }
        if !last.1.is_empty() && found.is_empty() {
            info!("pod interfaces: {state_now}: the earlier problem is gone");
        }
        *last = (state_now, found);
    }

    /// Warns now of what is wrong (the ignored flags once, for good), and again whenever a
    /// change of the node's links makes a new problem; nothing is watched when the mode does
    /// not decide by interface.
    pub fn start(&self) {
        for line in &self.ignored {
            warn!("{line}");
        }
        if self.setting.is_none() {
            return;
        }
        self.refresh();
        let me = self.clone();
        if let Err(e) = watch_links(move || me.refresh()) {
            warn!(
                "cannot watch the node's links ({e}): the pod interface checks are those of \
                 the start, and `kpng status` shows them"
            );
        }
    }

    /// `kpng status`'s line: what is checked, and the problems now.
    pub fn probe(&self) -> DataPlaneProbe {
        let me = self.clone();
        Arc::new(move || {
            let (state_now, found) = me.last.lock().map(|l| l.clone()).unwrap_or_default();
            let mut all = me.ignored.clone();
            all.extend(found);
            vec![DataPlaneDetail {
                what: "pod interfaces".into(),
                state: state_now,
                problem: (!all.is_empty()).then(|| all.join("; ")),
            }]
        })
    }
}

/// `RTMGRP_LINK`: the kernel's link notifications.
const RTMGRP_LINK: u32 = 0x1;
/// How long a burst of link notifications (a pod's veth pair coming up) may last and still be
/// one change.
const SETTLE: std::time::Duration = std::time::Duration::from_millis(500);

/// Calls `changed` after each burst of link notifications, on a thread of its own.
fn watch_links(changed: impl Fn() + Send + 'static) -> std::io::Result<()> {
    use netlink_sys::protocols::NETLINK_ROUTE;
    use netlink_sys::{Socket, SocketAddr};
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind(&SocketAddr::new(0, RTMGRP_LINK))?;
    std::thread::Builder::new()
        .name("kpng-links".into())
        .spawn(move || {
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                match socket.recv(&mut &mut buffer[..], 0) {
                    Ok(_) => {}
                    // ENOBUFS: notifications were dropped; the read covers them.
                    Err(e) if e.raw_os_error() == Some(105) => {}
                    Err(e) => {
                        warn!("watching the node's links stopped ({e})");
                        return;
                    }
                }
                std::thread::sleep(SETTLE);
                if socket.set_non_blocking(true).is_ok() {
                    while matches!(socket.recv(&mut &mut buffer[..], 0), Ok(n) if n > 0) {}
                    let _ = socket.set_non_blocking(false);
                }
                changed();
            }
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(name: &str, bridge: Option<&str>) -> Link {
        Link {
            name: name.into(),
            bridge: bridge.map(String::from),
        }
    }

    #[test]
    fn a_setting_that_matches_no_usable_link_is_named() {
        let bridge_cni = || {
            vec![
                link("lo", None),
                link("eth0", None),
                link("cni0", None),
                link("veth1a2b", Some("cni0")),
                link("veth3c4d", Some("cni0")),
            ]
        };
        let calico = || {
            vec![
                link("eth0", None),
                link("cali1234", None),
                link("cali5678", None),
            ]
        };
        let bridge = |b: &str| Setting::Bridge(b.into());
        let prefix = |p: &str| Setting::Prefix(p.into());
        let cases: [(&str, Setting, Vec<Link>, Option<&str>); 8] = [
            ("the bridge is there", bridge("cni0"), bridge_cni(), None),
            (
                "a typo",
                bridge("cni9"),
                bridge_cni(),
                Some(
                    "--detect-local-mode BridgeInterface cni9: no link named cni9 on this node \
                     (yet: a bridge CNI creates its bridge with the first pod), so no packet is \
                     taken for a pod's",
                ),
            ),
            ("Calico's prefix", prefix("cali"), calico(), None),
            (
                "no link of the prefix",
                prefix("cali"),
                bridge_cni(),
                Some("no link whose name starts with cali on this node"),
            ),
            (
                "the veths of a bridge CNI are its ports",
                prefix("veth"),
                bridge_cni(),
                Some(
                    "--detect-local-mode InterfaceNamePrefix veth: every matching link \
                     (veth1a2b, veth3c4d) is a port of bridge cni0: their packets arrive on the \
                     bridge, not on them, so no packet is taken for a pod's: pods' ClusterIP \
                     traffic is masqueraded, and pods get no externalTrafficPolicy Local \
                     short-circuit; use --detect-local-mode BridgeInterface \
                     --pod-bridge-interface cni0",
                ),
            ),
            (
                "a bridge named that is itself a port of another",
                bridge("br-pods"),
                vec![link("br-pods", Some("br0")), link("br0", None)],
                Some("is a port of bridge br0"),
            ),
            (
                "some matching links are not ports",
                prefix("veth"),
                vec![link("veth1", Some("cni0")), link("veth2", None)],
                None,
            ),
            (
                "the bridge without ports yet",
                bridge("cni0"),
                vec![link("cni0", None)],
                None,
            ),
        ];
        for (what, setting, links, want) in cases {
            let got = problems(&setting, &links);
            match want {
                None => assert!(got.is_empty(), "{what}: {got:?}"),
                Some(w) => {
                    assert_eq!(got.len(), 1, "{what}: {got:?}");
                    assert!(got[0].contains(w), "{what}: {:?} lacks {w:?}", got[0]);
                }
            }
        }
    }

    #[test]
    fn ip_link_lines_give_names_and_bridges() {
        let text = "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode \
                    DEFAULT group default qlen 1000\\    link/loopback 00:00:00:00:00:00 brd \
                    00:00:00:00:00:00 promiscuity 0\n\
                    3: cni0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP \
                    mode DEFAULT group default qlen 1000\\    link/ether 6e:1f brd ff:ff \
                    promiscuity 0 \\    bridge forward_delay 1500 hello_time 200\n\
                    4: vethp1a@if2: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue \
                    master cni0 state UP mode DEFAULT\\    link/ether 2a:3b \\    veth \\    \
                    bridge_slave state forwarding priority 32\n\
                    5: bond0s: <UP> mtu 1500 master bond0 state UP\\    bond_slave state ACTIVE\n";
        assert_eq!(
            parse_links(text),
            vec![
                link("lo", None),
                link("cni0", None),
                link("vethp1a", Some("cni0")),
                link("bond0s", None),
            ]
        );
    }

    #[test]
    fn an_interface_flag_for_a_mode_that_ignores_it_is_named() {
        use clap::Parser;
        let flags = |args: &[&str]| {
            let mut all = vec!["kpng"];
            all.extend(args);
            crate::cli::Cli::try_parse_from(all).expect("flags").global
        };
        let got = ignored_flags(&flags(&["--pod-bridge-interface", "cni0"]));
        assert_eq!(
            got,
            [
                "--pod-bridge-interface cni0 (detectLocal.bridgeInterface) is ignored: \
                 --detect-local-mode ClusterCIDR tells pods by --cluster-cidr; to tell pods by \
                 the bridge, use --detect-local-mode BridgeInterface"
            ]
        );
        let got = ignored_flags(&flags(&[
            "--detect-local-mode",
            "BridgeInterface",
            "--pod-bridge-interface",
            "cni0",
            "--pod-interface-name-prefix",
            "veth",
        ]));
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].starts_with("--pod-interface-name-prefix veth"),
            "{got:?}"
        );
        assert!(
            ignored_flags(&flags(&[
                "--detect-local-mode",
                "BridgeInterface",
                "--pod-bridge-interface",
                "cni0"
            ]))
            .is_empty()
        );
    }
}
