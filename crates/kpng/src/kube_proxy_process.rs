//! A kube-proxy still running on a Windows node: `kube-proxy.exe` in kernelspace mode programs
//! the same HNS load balancers as `to-local hns` (the same frontends, on the same network), so
//! the two would delete and re-create each other's whenever their views differ, and traffic
//! would flap. kpng refuses to start beside it, as it refuses to start beside another kpng
//! programming the node (`instance_lock`: "two proxies on one node fight. Stop it first"); a
//! dry run, which changes nothing, says that a real run would refuse.
//!
//! The process list is read with a Toolhelp32 snapshot (`kpng_backend_hns::system::processes`,
//! Windows only); the decision is a pure function of that list, tested on any OS.

// Windows' check; the decision and its wording are tested everywhere.
#![cfg_attr(not(windows), allow(dead_code))]

/// One running process, as the system lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    /// Its process ID.
    pub pid: u32,
    /// Its executable's file name (`kube-proxy.exe`), as Toolhelp32 gives it.
    pub name: String,
}

/// The kube-proxy among `processes`, if one runs: an executable named `kube-proxy.exe` (any
/// case, as Windows file names; or `kube-proxy`) other than this process (`own_pid`), which may
/// itself be kpng installed under kube-proxy's name as a drop-in.
pub fn running_kube_proxy(processes: &[Process], own_pid: u32) -> Option<&Process> {
    processes.iter().find(|p| {
        p.pid != own_pid
            && (p.name.eq_ignore_ascii_case("kube-proxy.exe")
                || p.name.eq_ignore_ascii_case("kube-proxy"))
    })
}

/// Why kpng does not start beside `kube_proxy`, in the words of the instance lock's refusal.
pub fn refusal(kube_proxy: &Process) -> String {
    format!(
        "{} (pid {}) runs on this node; `to-local hns` beside it would replace the HNS load \
         balancers it programs, and it would put them back: two proxies on one node fight. \
         Stop it first (`Stop-Service kube-proxy`, or the kube-proxy DaemonSet's pod on this \
         node)",
        kube_proxy.name, kube_proxy.pid
    )
}

/// The kube-proxy running on this node, if any. A process list that cannot be read is a
/// warning and `None`: kpng goes on, as it cannot tell.
#[cfg(windows)]
pub fn on_this_node() -> Option<Process> {
    let processes = match kpng_backend_hns::system::processes() {
        Ok(list) => list
            .into_iter()
            .map(|(pid, name)| Process { pid, name })
            .collect::<Vec<_>>(),
        Err(e) => {
            tracing::warn!("listing this node's processes to find a running kube-proxy.exe: {e}");
            return None;
        }
    };
    running_kube_proxy(&processes, std::process::id()).cloned()
}

/// Who programs HNS, for `kpng cleanup`'s refusal: a running kube-proxy would re-create the
/// load balancers cleanup removes, as a running kpng would.
pub fn as_programmer(kube_proxy: &Process) -> crate::backends::hns::Programmer {
    crate::backends::hns::Programmer {
        who: format!(
            "{} (pid {}) runs on this node and programs HNS",
            kube_proxy.name, kube_proxy.pid
        ),
        stop: "`Stop-Service kube-proxy`, or the kube-proxy DaemonSet's pod on this node",
    }
}

/// Refuses (or, for a dry run, warns that a real run would refuse) when a kube-proxy runs on
/// this node.
#[cfg(windows)]
pub fn check(dry_run: bool) -> anyhow::Result<()> {
    let Some(kube_proxy) = on_this_node() else {
        return Ok(());
    };
    let why = refusal(&kube_proxy);
    if dry_run {
        tracing::warn!("--dry-run: {why}; a real run would refuse to start");
        return Ok(());
    }
    anyhow::bail!(why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kube_proxy_other_than_this_process_is_found() {
        let p = |pid: u32, name: &str| Process {
            pid,
            name: name.to_string(),
        };
        let cases: [(&str, Vec<Process>, Option<u32>); 6] = [
            ("none", vec![p(4, "System"), p(900, "svchost.exe")], None),
            (
                "kube-proxy.exe",
                vec![p(4, "System"), p(2100, "kube-proxy.exe")],
                Some(2100),
            ),
            ("any case", vec![p(2200, "KUBE-PROXY.EXE")], Some(2200)),
            ("without .exe", vec![p(2300, "kube-proxy")], Some(2300)),
            (
                "kpng itself, installed as kube-proxy.exe",
                vec![p(1000, "kube-proxy.exe")],
                None,
            ),
            (
                "a name that only contains it",
                vec![
                    p(2400, "kube-proxy-wrapper.exe"),
                    p(2500, "my-kube-proxy.exe"),
                ],
                None,
            ),
        ];
        for (what, list, want) in cases {
            assert_eq!(
                running_kube_proxy(&list, 1000).map(|p| p.pid),
                want,
                "{what}"
            );
        }
    }

    #[test]
    fn the_refusal_names_the_process_and_what_to_do() {
        let text = refusal(&Process {
            pid: 2100,
            name: "kube-proxy.exe".into(),
        });
        assert!(
            text.starts_with("kube-proxy.exe (pid 2100) runs on this node"),
            "{text}"
        );
        assert!(text.contains("two proxies on one node fight"), "{text}");
        assert!(text.contains("Stop-Service kube-proxy"), "{text}");
    }
}
