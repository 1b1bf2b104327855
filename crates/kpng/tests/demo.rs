//! The README's demo (`./scripts/demo.sh [BACKEND]`) runs for every backend and every line it
//! shows holds: `kpng-demo` checks each line against what the Service asks for and exits 1
//! when one does not. Root only (namespaces); skipped otherwise, failing under `CI`.

use std::path::Path;
use std::process::Command;

fn run_demo(backend: &str) {
    let demo = kpng_testkit::bin_path("kpng-demo").expect("kpng-demo");
    let input = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster.yaml");
    let out = Command::new(&demo)
        .args(["--kpng", env!("CARGO_BIN_EXE_kpng"), "--input"])
        .arg(&input)
        .args(["--backend", backend])
        .output()
        .expect("run kpng-demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the demo with {backend} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(!stdout.contains("UNEXPECTED"), "{stdout}");
    for line in [
        format!("… to-local {backend}"),
        "default/web ClusterIP 10.96.0.10:80".to_owned(),
        "inspect it yourself".to_owned(),
        // The socket's own path, so that the line runs as printed (it said `…` until
        // 2026-12-07).
        "--admin-socket /".to_owned(),
        "KPNG_DEMO_PAUSE_SECS=600 ./scripts/demo.sh".to_owned(),
        "== done; removing the sandbox".to_owned(),
    ] {
        assert!(stdout.contains(&line), "no {line:?} in:\n{stdout}");
    }
    // `kpng status` and `kpng trace` answered through the admin socket.
    assert!(
        stdout.contains("unused: topology: hinted for zone zone-b"),
        "{stdout}"
    );
    assert!(
        stdout.contains("is outside loadBalancerSourceRanges"),
        "{stdout}"
    );
    // `-o wide` adds what the backend holds beyond its rules.
    let data_plane: &[&str] = match backend {
        "nft" => &["nftables: table ip kpng: "],
        "iptables" => &["iptables: iptables-"],
        "ebpf" => &[
            "nftables: table ip kpng: ",
            "eBPF socket programs: 9 of 9 attached to cgroup ",
        ],
        _ => &[],
    };
    for line in data_plane {
        assert!(stdout.contains(line), "no {line:?} in:\n{stdout}");
    }
}

#[test]
fn demo_with_nft() {
    kpng_testkit::require_root!();
    run_demo("nft");
}

#[test]
fn demo_with_iptables() {
    kpng_testkit::require_root!();
    run_demo("iptables");
}

#[test]
fn demo_with_userspace() {
    kpng_testkit::require_root!();
    run_demo("userspace");
}

#[test]
fn demo_with_ebpf() {
    kpng_testkit::require_root!();
    run_demo("ebpf");
}

/// The scripts run the binaries cargo just built, wherever `CARGO_TARGET_DIR` (or a cargo
/// config's `target-dir`) put them: a literal `target/debug/kpng` failed after a full build
/// with `CARGO_TARGET_DIR` set ("No such file"), or silently ran a stale binary left in
/// `target/`. No root needed.
#[test]
fn scripts_run_binaries_from_cargos_target_dir() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for script in ["scripts/demo.sh", "scripts/test.sh"] {
        let text = std::fs::read_to_string(repo.join(script)).expect(script);
        for (n, line) in text.lines().enumerate() {
            let code = line.split(" #").next().unwrap_or(line).trim_start();
            if code.starts_with('#') {
                continue;
            }
            for literal in ["target/debug", "target/release"] {
                // `target/…` as a path of its own, not the end of `$windows_target/…`.
                let hardcoded = code.match_indices(literal).any(|(i, _)| {
                    code[..i]
                        .chars()
                        .next_back()
                        .is_none_or(|c| !(c.is_alphanumeric() || "_/}$".contains(c)))
                });
                assert!(
                    !hardcoded,
                    "{script}:{}: runs {literal}/… instead of \"$target_dir/…\" from \
                     `cargo metadata`: {line}",
                    n + 1
                );
            }
        }
        assert!(
            text.contains("cargo metadata --format-version 1 --no-deps"),
            "{script} does not ask cargo where its target directory is"
        );
    }
}

/// `./scripts/demo.sh --help` prints its comment block, the environment it reads included, and
/// no code (it printed `set -euo pipefail` until 2026-12-07). No root needed.
#[test]
fn the_demo_script_help_is_its_comment_block() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("bash")
        .arg(repo.join("scripts/demo.sh"))
        .arg("--help")
        .output()
        .expect("run demo.sh --help");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        text.starts_with("The demo: builds kpng")
            && text.contains("KPNG_BIN_DIR=DIR")
            && text.contains("KPNG_DEMO_PAUSE_SECS=N")
            && !text.contains("set -euo")
            && !text.contains('#'),
        "{text}"
    );
}
