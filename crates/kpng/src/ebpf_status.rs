//! `kpng status`'s lines about `to-local ebpf`'s socket half: whether its programs are
//! attached, to which cgroup, and how full its maps are ([`kpng_backend_ebpf::inspect`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kpng_backend_ebpf::inspect::{Inspection, inspect};
use kpng_backend_ebpf::kernel::PROGRAMS;
use kpng_runner::admin::{DataPlaneDetail, DataPlaneProbe};

/// The probe for a backend pinning under `pin_dir` and attached to `cgroup` (`None`: the
/// cgroup v2 root), translating only the node's network namespace's sockets when
/// `host_netns_only` (`--socket-lb-host-netns-only`).
pub fn probe(pin_dir: PathBuf, cgroup: Option<PathBuf>, host_netns_only: bool) -> DataPlaneProbe {
    // kpng's namespace does not change while it runs.
    let not_host = host_netns_only
        .then(|| kpng_backend_ebpf::netns::Placement::find().not_host())
        .flatten();
    Arc::new(move || {
        use kpng_backend_ebpf::host;
        // In a cgroup namespace of its own, the default root is its container's cgroup.
        let private = cgroup.is_none() && host::in_private_cgroup_namespace();
        let (scope, dir) = match &cgroup {
            Some(c) => (
                format!("cgroup {} (its subtree's sockets)", c.display()),
                Some(c.clone()),
            ),
            None => {
                let root = host::cgroup2_root().ok();
                let scope = match (&root, private) {
                    (_, true) => "the root of kpng's own cgroup namespace (its container's \
                                  cgroup, not the node's)"
                        .to_string(),
                    (Some(r), false) => {
                        format!(
                            "cgroup {} (the root: every socket of the node)",
                            r.display()
                        )
                    }
                    (None, false) => "the cgroup v2 root (every socket of the node)".to_string(),
                };
                (scope, root)
            }
        };
        let scope = match (host_netns_only, &not_host) {
            (true, None) => format!("{scope}, {HOST_NETNS_ONLY}"),
            (true, Some(_)) => format!("{scope}, {OWN_NETNS_ONLY}"),
            (false, _) => scope,
        };
        let mut shown = details(&inspect(&pin_dir, dir.as_deref()), &pin_dir, &scope);
        let problems = [
            private.then(|| host::PRIVATE_CGROUP_NAMESPACE.to_string()),
            not_host.clone(),
        ];
        if let Some(programs) = shown.first_mut() {
            for problem in problems.into_iter().flatten().rev() {
                programs.problem = Some(match programs.problem.take() {
                    Some(other) => format!("{problem}; {other}"),
                    None => problem,
                });
            }
        }
        shown
    })
}

/// Which sockets the programs translate, for `kpng trace`: a `--cgroup-path` that is not
/// the cgroup v2 root kpng attaches to by default is a subtree whose processes the trace cannot
/// tell from others; `--socket-lb-host-netns-only` in a kpng outside the host's network
/// namespace means kpng's own (the status's PROBLEM), which the trace says too.
pub fn local_sockets(
    cgroup: Option<&Path>,
    host_netns_only: bool,
) -> kpng_model::trace::LocalSockets {
    let root = kpng_backend_ebpf::host::cgroup2_root().ok();
    let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let cgroup_subtree = cgroup
        .filter(|c| root.as_deref().map(canonical) != Some(canonical(c)))
        .map(|c| c.display().to_string());
    // kpng's namespace does not change while it runs: looked at once, as the status's probe.
    let own_netns_not_host = match host_netns_only.then(kpng_backend_ebpf::netns::Placement::find) {
        Some(kpng_backend_ebpf::netns::Placement::Other { own, .. }) => {
            Some(format!("net:[{own}]"))
        }
        _ => None,
    };
    kpng_model::trace::LocalSockets {
        cgroup_subtree,
        host_netns_only,
        own_netns_not_host,
    }
}

/// What `--socket-lb-host-netns-only` narrows the programs' scope to, in `kpng status`.
pub const HOST_NETNS_ONLY: &str = "the node's network namespace only \
    (--socket-lb-host-netns-only: pods' sockets go through the nftables rules)";

/// What `--socket-lb-host-netns-only` narrows the programs' scope to when kpng does not run in
/// the host's network namespace ([`kpng_backend_ebpf::netns::Placement`]): its own.
pub const OWN_NETNS_ONLY: &str = "kpng's own network namespace only, which is not the host's \
    (--socket-lb-host-netns-only: every other socket goes through the nftables rules)";

/// A map's name for an operator. `kpng_reverse` holds an entry per open connected socket
/// (deleted as it closes) and per (unconnected UDP socket, endpoint it sent to), which stays
/// after the socket closed until the LRU evicts it: not a count of open sockets.
fn label(map: &str) -> &str {
    match map {
        "kpng_frontends" => "Service frontends",
        "kpng_slots" => "endpoint slots past 8",
        "kpng_members" => "affinity members",
        "kpng_affinity" => "ClientIP affinities",
        "kpng_flows" => "unconnected UDP flows",
        "kpng_reverse" => {
            "socket translations (connected sockets + unconnected UDP flows, freed by eviction)"
        }
        other => other,
    }
}

/// What is wrong with the links, if anything: pins removed, or programs not attached.
fn link_problems(i: &Inspection) -> Option<String> {
    let mut problems = Vec::new();
    if !i.missing.is_empty() {
        problems.push(format!(
            "not pinned: {} (removed by someone else; this kpng still holds them, so they \
             translate, and its next periodic sync pins them again)",
            i.missing.join(", ")
        ));
    }
    if !i.not_attached.is_empty() {
        let each: Vec<String> = i
            .not_attached
            .iter()
            .map(|(name, why)| format!("{name} {why}"))
            .collect();
        problems.push(format!(
            "not attached to the cgroup: {} (by someone else: bpftool link detach, or the \
             cgroup removed; those hooks do nothing meanwhile: without connect or sendmsg, local \
             sockets go through the nftables rules; without recvmsg, an unconnected UDP socket \
             sees replies from the endpoint's address; the next periodic sync attaches them \
             again)",
            each.join(", ")
        ));
    }
    if !i.strangers.is_empty() {
        let each: Vec<String> = i
            .strangers
            .iter()
            .map(|(name, id)| format!("{name} (program {id})"))
            .collect();
        problems.push(format!(
            "other kpng programs attached to the cgroup, not this kpng's links: {} (a previous \
             kpng whose pins this one cannot see, or a second kpng on this cgroup; they run \
             before this kpng's and translate Service addresses from maps nobody updates; the \
             next periodic sync detaches them, `kpng cleanup --cgroup-path` too)",
            each.join(", ")
        ));
    }
    (!problems.is_empty()).then(|| problems.join("; "))
}

/// The lines for one inspection.
fn details(i: &Inspection, pin_dir: &Path, scope: &str) -> Vec<DataPlaneDetail> {
    let programs = DataPlaneDetail {
        what: "eBPF socket programs".into(),
        // The cgroup's own list when it could be asked: pins can be gone while the programs
        // still run.
        state: format!(
            "{} of {} attached to {scope}, {}links pinned in {}",
            i.attached.as_ref().map_or(i.pinned.len(), Vec::len),
            PROGRAMS.len(),
            if i.missing.is_empty() {
                String::new()
            } else {
                format!(
                    "{} of {} ",
                    PROGRAMS.len() - i.missing.len(),
                    PROGRAMS.len()
                )
            },
            pin_dir.join(kpng_backend_ebpf::kernel::LINKS).display()
        ),
        problem: link_problems(i),
    };
    let fills: Vec<String> = i
        .maps
        .iter()
        .map(|m| format!("{} {} of {}", label(m.name), m.entries, m.max_entries))
        .collect();
    let mut problems: Vec<String> = i
        .maps
        .iter()
        .filter(|m| m.nearly_full())
        .map(|m| {
            let lru = matches!(m.name, "kpng_reverse" | "kpng_affinity" | "kpng_flows");
            let consequence = match (lru, m.entries >= m.max_entries as usize) {
                (true, true) => "the oldest entries are evicted",
                (true, false) => "once full, the oldest entries are evicted",
                (false, true) => {
                    "new entries are refused: a sync that adds any fails until some are removed"
                }
                (false, false) => {
                    "nothing is refused yet; once full, new entries are refused and a sync that \
                     adds any fails"
                }
            };
            format!(
                "{} is {} % full: {consequence}",
                m.name,
                m.entries * 100 / m.max_entries.max(1) as usize
            )
        })
        .collect();
    problems.extend(
        i.unreadable
            .iter()
            .map(|(name, why)| format!("{name} cannot be read: {why}")),
    );
    let maps = DataPlaneDetail {
        what: "eBPF maps".into(),
        state: fills.join(", "),
        problem: (!problems.is_empty()).then(|| problems.join("; ")),
    };
    vec![programs, maps]
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpng_backend_ebpf::inspect::MapFill;

    #[test]
    fn lines_say_what_is_attached_and_what_is_full() {
        let all: Vec<&'static str> = PROGRAMS.to_vec();
        let healthy = Inspection {
            pinned: all.clone(),
            missing: vec![],
            not_attached: vec![],
            maps: vec![
                MapFill {
                    name: "kpng_frontends",
                    entries: 12,
                    max_entries: 262_144,
                },
                MapFill {
                    name: "kpng_reverse",
                    entries: 3,
                    max_entries: 131_072,
                },
            ],
            unreadable: vec![],
            attached: Some(all.clone()),
            strangers: vec![],
        };
        let lines = details(
            &healthy,
            Path::new("/sys/fs/bpf/kpng"),
            "cgroup /sys/fs/cgroup",
        );
        assert_eq!(
            lines[0].state,
            "9 of 9 attached to cgroup /sys/fs/cgroup, links pinned in /sys/fs/bpf/kpng/links"
        );
        assert_eq!(lines[0].problem, None);
        assert_eq!(
            lines[1].state,
            "Service frontends 12 of 262144, socket translations (connected sockets + unconnected UDP flows, freed by eviction) 3 of 131072"
        );
        assert_eq!(lines[1].problem, None);

        let broken = Inspection {
            pinned: all[..6].to_vec(),
            missing: all[7..].to_vec(),
            not_attached: vec![(all[6], "detached".into())],
            maps: vec![MapFill {
                name: "kpng_frontends",
                entries: 235_930,
                max_entries: 262_144,
            }],
            unreadable: vec![("kpng_reverse", "No such file or directory".into())],
            attached: None,
            strangers: vec![],
        };
        let lines = details(&broken, Path::new("/p"), "cgroup /c");
        assert!(
            lines[0].state.starts_with("6 of 9 attached")
                && lines[0]
                    .state
                    .ends_with(", 7 of 9 links pinned in /p/links"),
            "{lines:?}"
        );
        assert_eq!(
            lines[0].problem.as_deref(),
            Some(
                "not pinned: kpng_getpeername6, kpng_sock_release (removed by someone else; this \
                 kpng still holds them, so they translate, and its next periodic sync pins them \
                 again); not attached to the cgroup: kpng_getpeername4 detached (by someone \
                 else: bpftool link detach, or the cgroup removed; those hooks do nothing \
                 meanwhile: without connect or sendmsg, local sockets go through the nftables \
                 rules; without recvmsg, an unconnected UDP socket sees replies from the \
                 endpoint's address; the next periodic sync attaches them again)"
            )
        );
        assert_eq!(
            lines[1].problem.as_deref(),
            Some(
                "kpng_frontends is 90 % full: nothing is refused yet; once full, new entries are \
                 refused and a sync that adds any fails; kpng_reverse cannot be read: No such \
                 file or directory"
            )
        );

        // Pins gone, programs still on the cgroup, and a previous generation beside them.
        let unpinned = Inspection {
            pinned: vec![],
            missing: all.clone(),
            not_attached: vec![],
            maps: vec![MapFill {
                name: "kpng_frontends",
                entries: 262_144,
                max_entries: 262_144,
            }],
            unreadable: vec![],
            attached: Some(all.clone()),
            strangers: vec![("kpng_connect4", 812)],
        };
        let lines = details(&unpinned, Path::new("/p"), "cgroup /c");
        assert_eq!(
            lines[0].state,
            "9 of 9 attached to cgroup /c, 0 of 9 links pinned in /p/links"
        );
        let problem = lines[0].problem.as_deref().unwrap_or_default();
        assert!(
            problem.contains("other kpng programs attached to the cgroup, not this kpng's links: kpng_connect4 (program 812)"),
            "{problem}"
        );
        assert_eq!(
            lines[1].problem.as_deref(),
            Some(
                "kpng_frontends is 100 % full: new entries are refused: a sync that adds any \
                 fails until some are removed"
            )
        );
    }
}
