//! The binary end to end: `kpng file … to-file` follows edits of its input and survives broken ones.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running `kpng`, killed when dropped; its stderr is collected as it comes.
struct Kpng {
    child: Child,
    stderr: Arc<Mutex<String>>,
}

impl Kpng {
    fn start(command: &mut Command) -> Kpng {
        let mut child = command.stderr(Stdio::piped()).spawn().expect("start kpng");
        let stderr = kpng_testkit::collect_output(child.stderr.take().expect("stderr"));
        Kpng { child, stderr }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().expect("lock").clone()
    }

    /// Successful syncs logged so far.
    fn synced(&self) -> usize {
        self.stderr().matches(" synced").count()
    }

    /// Waits until `check` holds on (the output file's text, stderr); panics with stderr
    /// after 10 s or when kpng exits.
    #[track_caller]
    fn wait(&mut self, what: &str, output: &Path, check: impl Fn(&str, &str) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = std::fs::read_to_string(output).unwrap_or_default();
            if check(&text, &self.stderr()) {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("kpng exited ({status}) before {what}:\n{}", self.stderr());
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within 10 s; kpng said:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Kpng {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn service(ip: &str, port: u32) -> String {
    format!(
        "kind: Node\nmetadata: {{name: n1}}\n---\nkind: Service\nmetadata: {{namespace: ns, name: web}}\nspec: {{clusterIP: {ip}, ports: [{{name: http, port: {port}}}]}}\n"
    )
}

#[test]
fn follows_edits_and_keeps_the_last_good_output_on_a_broken_edit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("cluster.yaml");
    // Output elsewhere: its own rewrites must not count as changes of the input directory.
    let out_dir = tempfile::tempdir().expect("tempdir");
    let output = out_dir.path().join("out.yaml");
    std::fs::write(&input, service("10.96.0.1", 80)).expect("write");
    let mut kpng = Kpng::start(
        Command::new(env!("CARGO_BIN_EXE_kpng"))
            .args(["file", "--input"])
            .arg(&input)
            .args([
                "--node-name",
                "n1",
                "--healthz-bind-address",
                "127.0.0.1:0",
                "--metrics-bind-address",
                "",
                // Killed at the end: it would leave the default socket in /run/kpng.
                "--admin-socket=",
            ])
            .args(["--min-sync-period", "0", "to-file", "--output"])
            .arg(&output),
    );

    // A sync is logged right after it wrote the output.
    kpng.wait("the first output", &output, |out, err| {
        out.contains("10.96.0.1") && err.contains(" synced")
    });
    let first = kpng.synced();

    std::fs::write(&input, service("10.96.0.2", 80)).expect("write");
    kpng.wait("the edit applied", &output, |out, err| {
        out.contains("10.96.0.2") && err.matches(" synced").count() > first
    });
    // How fast is the benchmark's business (kpng-bench: ≈2 ms from rename to commit).
    let syncs_before = kpng.synced();

    // The file source reports the broken edit once it has read it: kpng has decided.
    std::fs::write(&input, service("10.96.0.3", 99999)).expect("write");
    let precise = format!(
        "rejected Service ns/web ({}: document 2 (line 4)): field spec.ports[0].port: port 99999 is not in 1-65535; keeping its last good version",
        input.display()
    );
    kpng.wait("the broken edit reported", &output, |_, err| {
        err.contains(&precise)
    });
    let after_broken = std::fs::read_to_string(&output).expect("read");
    assert!(
        after_broken.contains("10.96.0.2") && !after_broken.contains("10.96.0.3"),
        "broken edit must keep the last good output:\n{after_broken}"
    );
    assert_eq!(
        kpng.synced(),
        syncs_before,
        "a broken edit syncs nothing:\n{}",
        kpng.stderr()
    );

    // The rest of the file is still used: a new Service beside the broken one is programmed,
    // and the broken one keeps its last good version.
    let beside = format!(
        "{}---\nkind: Service\nmetadata: {{namespace: ns, name: api}}\nspec: {{clusterIP: 10.96.0.50, ports: [{{name: http, port: 80}}]}}\n",
        service("10.96.0.3", 99999)
    );
    std::fs::write(&input, beside).expect("write");
    kpng.wait(
        "the good Service beside the broken one",
        &output,
        |out, err| out.contains("10.96.0.50") && err.matches(" synced").count() > syncs_before,
    );
    let with_api = std::fs::read_to_string(&output).expect("read");
    assert!(
        with_api.contains("10.96.0.2") && !with_api.contains("10.96.0.3"),
        "the broken Service must keep its last good version:\n{with_api}"
    );
    let syncs_before = kpng.synced();

    // The next good edit is applied, in exactly one sync.
    std::fs::write(&input, service("10.96.0.4", 80)).expect("write");
    kpng.wait("the good edit after the broken one", &output, |out, err| {
        out.contains("10.96.0.4") && err.matches(" synced").count() > syncs_before
    });
    assert_eq!(
        kpng.synced(),
        syncs_before + 1,
        "one sync for the good edit:\n{}",
        kpng.stderr()
    );
}

/// Under churn a node's log stays bounded (docs/deploy.md, "Sizing"): the first sync and the
/// first 10 routine syncs of a minute are `synced` lines at info level, the routine syncs after
/// them at debug level only (summed up once the minute is over; each shown with `--log-level
/// debug`). Before 2026-12-07 every sync was an info line: ~220 B/s per node at 10 changes/s.
#[test]
fn routine_syncs_past_ten_a_minute_are_logged_at_debug_level_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("cluster.yaml");
    let out_dir = tempfile::tempdir().expect("tempdir");
    let output = out_dir.path().join("out.yaml");
    std::fs::write(&input, service("10.96.0.1", 80)).expect("write");
    let start = |level: &str| {
        Kpng::start(
            Command::new(env!("CARGO_BIN_EXE_kpng"))
                .args(["--log-level", level, "file", "--input"])
                .arg(&input)
                .args([
                    "--node-name",
                    "n1",
                    "--healthz-bind-address",
                    "",
                    "--metrics-bind-address",
                    "",
                    "--admin-socket=",
                    "--min-sync-period",
                    "0",
                    "to-file",
                    "--output",
                ])
                .arg(&output),
        )
    };
    for (level, info_lines, debug_lines) in [("info", 1 + 10, 0), ("debug", 1 + 10, 3)] {
        std::fs::write(&input, service("10.96.0.1", 80)).expect("write");
        let mut kpng = start(level);
        kpng.wait("the first sync", &output, |out, err| {
            out.contains("10.96.0.1") && err.contains(" synced")
        });
        // 13 changes, each waited for: routine syncs, well within a minute.
        for i in 2..15 {
            let ip = format!("10.96.0.{i}");
            std::fs::write(&input, service(&ip, 80)).expect("write");
            kpng.wait("the change", &output, |out, _| out.contains(&ip));
        }
        // The last sync's line, if any, is written right after the output.
        std::thread::sleep(Duration::from_millis(300));
        let err = kpng.stderr();
        let lines = |level: &str| {
            err.lines()
                .filter(|l| l.contains(level) && l.contains(" synced backend="))
                .count()
        };
        assert_eq!(
            (lines(" INFO "), lines(" DEBUG ")),
            (info_lines, debug_lines),
            "--log-level {level}:\n{err}"
        );
    }
}

#[test]
fn config_file_and_flags_make_the_written_configuration() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/testdata/kube-proxy/kubeadm-v1.33.conf"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_kpng"))
        .args(["--config", fixture, "--write-config-to", "-"])
        .args(["--sync-period", "5s"])
        .output()
        .expect("run kpng");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stdout.contains("kpng 0."),
        "exits before running the command"
    );
    // kube-proxy's own line takes its backend from the mode: how an empty one reads is said.
    assert!(
        stderr.contains("INFO kpng: --config: mode is empty"),
        "{stderr}"
    );
    // The one warning: kube-proxy would ignore the flag beside --config, kpng applies it.
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains(" WARN ")).collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        warnings[0].contains(
            "flags given beside --config override the file's fields in kpng, but kube-proxy \
             ignores them there"
        ) && warnings[0].ends_with(": --sync-period/--iptables-sync-period (iptables.syncPeriod)"),
        "{stderr}"
    );
    // Where the command line chooses (a subcommand), the note would only be noise; the
    // pre-flight check of kube-proxy's line (`--write-config-to - version`) says it, as that
    // line's start does.
    for (args, noted) in [
        (&["version"][..], false),
        (&["--write-config-to", "-", "version"][..], true),
    ] {
        let quiet = Command::new(env!("CARGO_BIN_EXE_kpng"))
            .args(["--config", fixture])
            .args(args)
            .output()
            .expect("run kpng");
        let said = String::from_utf8_lossy(&quiet.stderr);
        assert!(
            quiet.status.success()
                && said.contains("mode is empty") == noted
                && !said.contains("WARN"),
            "{args:?}: {said}"
        );
    }
    // A flag beside the file meets the file's checks: --write-config-to never writes a file
    // --config refuses.
    let out = Command::new(env!("CARGO_BIN_EXE_kpng"))
        .args(["--config", fixture, "--write-config-to", "-"])
        .args(["--min-sync-period", "1m"])
        .output()
        .expect("run kpng");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--min-sync-period (1m0s) must not exceed --sync-period (30s)"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "nothing written: {stderr}");
    for line in [
        "clusterCIDR: 10.244.0.0/16",
        "  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf",
        // kubeadm's file leaves mode empty: kube-proxy's default, iptables.
        "mode: \"\"",
        "  syncPeriod: 5s",
    ] {
        assert!(stdout.lines().any(|l| l == line), "{line:?} in:\n{stdout}");
    }

    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.conf");
    std::fs::write(
        &bad,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nnftables:\n  masqueradeBit: 40\nmode: nftables\n",
    )
    .expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_kpng"))
        .arg("--config")
        .arg(&bad)
        .arg("version")
        .output()
        .expect("run kpng");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains("field nftables.masqueradeBit: 40 is not in 0-31"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "nothing runs after a bad file");
}

/// A JSON file that gives a section twice: kube-proxy's Go decoder merges the two objects,
/// and so does kpng, saying so in its warning; in YAML the last mapping is used whole.
#[test]
fn a_section_given_twice_in_the_config_file_is_merged_in_json_and_replaced_in_yaml() {
    let dir = tempfile::tempdir().expect("tempdir");
    // (file name, text, the written sync period, the warning)
    let cases = [
        (
            "twice.json",
            "{\"kind\": \"KubeProxyConfiguration\",\n\
             \"apiVersion\": \"kubeproxy.config.k8s.io/v1alpha1\",\n\"mode\": \"nftables\",\n\
             \"nftables\": {\"syncPeriod\": \"10s\"},\n\"nftables\": {\"minSyncPeriod\": \"2s\"}}",
            "  syncPeriod: 10s",
            "nftables (line 5): given twice; merged with the earlier `nftables` (a field given in \
             both takes the later value), as kube-proxy's lenient decoding of JSON does",
        ),
        (
            "twice.yaml",
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
             mode: nftables\nnftables:\n  syncPeriod: 10s\nnftables:\n  minSyncPeriod: 2s\n",
            "  syncPeriod: 30s",
            "nftables (line 6): given twice; the last value is used whole (the earlier \
             `nftables` mapping is dropped, not merged), as kube-proxy's lenient decoding does",
        ),
    ];
    for (name, text, sync_period, warning) in cases {
        let file = dir.path().join(name);
        std::fs::write(&file, text).expect("write");
        let out = kpng()
            .arg("--config")
            .arg(&file)
            .args(["--write-config-to", "-"])
            .output()
            .expect("run kpng");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {stderr}");
        let section: Vec<&str> = stdout
            .lines()
            .skip_while(|l| *l != "nftables:")
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .collect();
        assert!(
            section.contains(&sync_period) && section.contains(&"  minSyncPeriod: 2s"),
            "{name}: {section:?} in:\n{stdout}"
        );
        let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains(" WARN ")).collect();
        assert!(
            warnings.len() == 1 && warnings[0].contains(warning),
            "{name}: {stderr}"
        );
    }
}

fn kpng() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kpng"))
}

const KUBEADM: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/testdata/kube-proxy/kubeadm-v1.33.conf"
);

#[test]
fn kube_proxys_command_line_is_kpngs() {
    // kubeadm's DaemonSet line, plus flags kpng does not implement: accepted, each warned
    // about once when it asks for something, silent when it is kube-proxy's default.
    let out = kpng()
        .args(["--config", KUBEADM, "--hostname-override=Node-1"])
        .args([
            "--oom-score-adj=-999",
            "--feature-gates=Foo=true",
            "--profiling",
        ])
        .args(["--iptables-sync-period=10s", "--kube-api-content-type"])
        .args(["application/vnd.kubernetes.protobuf", "--v=4"])
        .args(["--write-config-to", "-"])
        .output()
        .expect("run kpng");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for line in [
        "hostnameOverride: node-1",
        "mode: \"\"",
        "  syncPeriod: 10s",
        "  verbosity: 4",
    ] {
        assert!(stdout.lines().any(|l| l == line), "{line:?} in:\n{stdout}");
    }
    assert_eq!(stderr.matches("WARN").count(), 3, "{stderr}");
    assert!(
        stderr.contains(
            "--feature-gates \"Foo=true\" (featureGates): kpng has no feature gates; ignored"
        ) && stderr.contains("--profiling \"true\" (enableProfiling)")
            // kubeadm's --hostname-override is honoured beside --config by kube-proxy too, so
            // only the sync period is named.
            && stderr.contains("(it honors only --hostname-override and the logging flags): \
                 --sync-period/--iptables-sync-period (iptables.syncPeriod)\n"),
        "{stderr}"
    );
}

#[test]
fn proxy_modes_choose_the_backend_or_say_what_to_use() {
    for (mode, want) in [
        ("nftables", "mode: nftables"),
        ("iptables", "mode: iptables"),
        ("", "mode: iptables"),
    ] {
        let out = kpng()
            .arg(format!("--proxy-mode={mode}"))
            .args(["--write-config-to", "-"])
            .output()
            .expect("run kpng");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.lines().any(|l| l == want), "{mode}: {stdout}");
    }
    // A typo is a usage error, as in kube-proxy's validation, even beside --cleanup.
    let out = kpng()
        .args(["--proxy-mode", "bpf", "--cleanup"])
        .output()
        .expect("run kpng");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("unknown proxy mode \"bpf\""), "{stderr}");
    // ipvs, a mode kube-proxy runs, is refused where it would choose the backend ...
    let out = kpng()
        .args(["--proxy-mode", "ipvs", "--write-config-to", "-"])
        .output()
        .expect("run kpng");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--proxy-mode: \"ipvs\" is not supported: kpng runs mode \"nftables\""),
        "{stderr}"
    );
    // ... and not where the command line needs no mode (an operator leaving ipvs).
    let out = kpng()
        .args(["--proxy-mode", "ipvs", "version"])
        .output()
        .expect("run kpng");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("\"ipvs\" is not supported"), "{stderr}");
    // docs/deploy.md's pre-flight check (`--write-config-to - version`) fails where the
    // DaemonSet's kube-proxy line would: the mode of the flag or of the file, refused or
    // misspelt; `version` alone still only warns.
    let dir = tempfile::tempdir().expect("tempdir");
    for (mode, said) in [
        ("ipvs", "\"ipvs\" is not supported"),
        ("nftable", "nftable"),
    ] {
        let file = dir.path().join(format!("{mode}.conf"));
        std::fs::write(
            &file,
            format!("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: {mode}\n"),
        )
        .expect("write");
        for (args, code) in [
            (vec!["--write-config-to", "-", "version"], Some(1)),
            (vec![], Some(1)),
            (vec!["version"], Some(0)),
        ] {
            let out = kpng()
                .arg("--config")
                .arg(&file)
                .args(&args)
                .args(["--metrics-bind-address", "", "--healthz-bind-address", ""])
                .args(["--admin-socket", ""])
                .output()
                .expect("run kpng");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), code, "{mode} {args:?}: {stderr}");
            assert!(stderr.contains(said), "{mode} {args:?}: {stderr}");
        }
    }
    let out = kpng()
        .args(["--proxy-mode", "ipvs", "--write-config-to", "-", "version"])
        .output()
        .expect("run kpng");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    // A mode that contradicts the subcommand's backend.
    let out = kpng()
        .args(["--proxy-mode", "iptables", "file", "--input", "/dev/null"])
        .args(["--metrics-bind-address", "", "to-local", "nft", "--dry-run"])
        .output()
        .expect("run kpng");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--proxy-mode asks for mode \"iptables\" (`to-local iptables`), but the command line runs `to-local nft`"),
        "{stderr}"
    );
}

/// A stand-in for `nft`: reports version 1.0.6, and refuses every transaction it is asked to
/// check, as the kernel refuses one it cannot apply.
fn refusing_nft(dir: &Path) -> std::path::PathBuf {
    fake_nft(
        dir,
        "cat >/dev/null\necho 'Error: Could not process rule: No such file or directory' >&2\nexit 1\n",
    )
}

/// An `nft` stand-in in `dir`: answers `--version` as nft 1.0.6, then runs `body` (sh).
fn fake_nft(dir: &Path, body: &str) -> std::path::PathBuf {
    let path = dir.join("nft");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'nftables v1.0.6 (Lester Gooch #5)'; exit 0; fi\n{body}"
        ),
    )
    .expect("write fake nft");
    let mut perms = std::fs::metadata(&path).expect("stat").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&path, perms).expect("chmod");
    path
}

#[test]
fn a_dry_run_opens_no_listener_and_fails_when_the_kernel_would_refuse() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("cluster.yaml");
    std::fs::write(&input, service("10.96.0.1", 80)).expect("write");
    let nft = refusing_nft(dir.path());
    // A port that is free now: a dry run must not take it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let out = kpng()
        .args(["file", "--input"])
        .arg(&input)
        .args(["--node-name", "n1", "--min-sync-period", "0"])
        .arg(format!("--healthz-bind-address=127.0.0.1:{port}"))
        .arg(format!("--metrics-bind-address=127.0.0.1:{port}"))
        .args(["to-local", "nft", "--dry-run", "--nft-binary"])
        .arg(&nft)
        .output()
        .expect("run kpng");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stdout.contains("# --- kpng nft transaction (dry run) ---") && stdout.contains("10.96.0.1"),
        "the transaction is printed:\n{stdout}"
    );
    assert!(
        stderr.contains("--dry-run: the kernel would refuse this nftables transaction")
            && stderr.contains("No such file or directory"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("binding"),
        "no listener was opened:\n{stderr}"
    );
}

#[test]
fn mistakes_on_the_line_say_what_was_meant() {
    let out = kpng()
        .args(["file", "--input", "x.yaml", "to-local", "ipvs"])
        .output()
        .expect("run kpng");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr
            .contains("hint: the backends of `to-local` are: nft, iptables, userspace, ebpf, hns"),
        "{stderr}"
    );
    let out = kpng()
        .args(["file", "to-file", "--input", "x.yaml"])
        .output()
        .expect("run kpng");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("hint: --input is a flag of `kpng file`: write it right after `file`"),
        "{stderr}"
    );
    // KPNG's spellings.
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("c.yaml");
    std::fs::write(&input, service("10.96.0.9", 80)).expect("write");
    let out = kpng()
        .args(["file", "-i"])
        .arg(&input)
        .args(["to-local", "to-nft", "--help"])
        .output()
        .expect("run kpng");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let help = kpng().arg("--help").output().expect("run kpng");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.lines()
            .any(|l| l
                == "  kpng --config /var/lib/kube-proxy/config.conf --hostname-override=node1"),
        "examples verbatim, one per line:\n{help}"
    );
    for heading in ["Source:", "Node:", "Backend:", "Output:", "Logging:"] {
        assert!(help.lines().any(|l| l == heading), "{heading} in:\n{help}");
    }
}

#[test]
fn an_ebpf_cgroup_path_that_does_not_exist_or_is_not_cgroup_v2_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("c.yaml");
    std::fs::write(&input, service("10.96.0.9", 80)).expect("write");
    let missing = dir.path().join("no-such-cgroup");
    let out = kpng()
        .args(["file", "--input"])
        .arg(&input)
        .args(["to-local", "ebpf", "--cgroup-path"])
        .arg(&missing)
        .output()
        .expect("run kpng");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "--cgroup-path {}: no such directory",
            missing.display()
        )),
        "{stderr}"
    );
    // A directory that is not a cgroup v2 one (here a temporary directory) is refused too: the
    // kernel would refuse every attach, at every retry.
    let out = kpng()
        .args(["file", "--input"])
        .arg(&input)
        .args(["to-local", "ebpf", "--cgroup-path"])
        .arg(dir.path())
        .output()
        .expect("run kpng");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("--cgroup-path {} is on a ", dir.path().display()))
            && stderr.contains("not a cgroup v2 hierarchy"),
        "{stderr}"
    );
}

/// A stand-in for `nft` that accepts every transaction (the dry run's kernel check passes).
fn accepting_nft(dir: &Path) -> std::path::PathBuf {
    fake_nft(dir, "cat >/dev/null\nexit 0\n")
}

/// An IPv6 `--node-ip` (and an IPv6 `--service-cidr`) with an IPv4-only `--cluster-cidr`: the
/// notice that IPv6 ClusterIP traffic from outside is not masqueraded is logged once, at start,
/// not again when the Node (with its IPv6 address) arrives; `kpng status` still shows it.
#[test]
fn a_missing_ipv6_cluster_cidr_is_noticed_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("cluster.yaml");
    std::fs::write(
        &input,
        "kind: Node\nmetadata: {name: n1}\nstatus: {addresses: [{type: InternalIP, address: \
         192.0.2.1}, {type: InternalIP, address: \"fd00:2::1\"}]}\n---\nkind: Service\n\
         metadata: {namespace: ns, name: web}\nspec: {clusterIP: 10.96.0.1, ports: [{name: \
         http, port: 80}]}\n",
    )
    .expect("write");
    let nft = accepting_nft(dir.path());
    let mut child = kpng()
        .args(["file", "--input"])
        .arg(&input)
        .args(["--node-name", "n1", "--node-ip", "192.0.2.1,fd00:2::1"])
        .args(["--service-cidr", "10.96.0.0/16,fd00:96::/112"])
        .args(["--cluster-cidr", "10.244.0.0/16"])
        .args(["--min-sync-period", "0", "--metrics-bind-address="])
        .arg("--healthz-bind-address=127.0.0.1:0")
        .args(["to-local", "nft", "--dry-run", "--nft-binary"])
        .arg(&nft)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kpng");
    let stderr = kpng_testkit::collect_output(child.stderr.take().expect("stderr"));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let err = stderr.lock().expect("lock").clone();
        if err.contains(" synced") {
            break;
        }
        if Instant::now() > deadline || matches!(child.try_wait(), Ok(Some(_))) {
            let _ = child.kill();
            panic!("no sync within 10 s:\n{err}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // The Node's check runs when the lists are in, before the first sync: give a late line
    // a moment all the same.
    std::thread::sleep(Duration::from_millis(300));
    let err = stderr.lock().expect("lock").clone();
    let _ = child.kill();
    let _ = child.wait();
    let notices: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("has no IPv6 CIDR"))
        .collect();
    assert_eq!(notices.len(), 1, "{notices:#?}\n{err}");
    assert!(
        notices[0].contains("--node-ip fd00:2::1, --service-cidr fd00:96::/112"),
        "{}",
        notices[0]
    );
    assert!(!err.contains("has no IPv4 CIDR"), "IPv4 has one: {err}");
}

#[test]
fn node_ports_out_of_range_or_taken_by_an_older_service_are_not_programmed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("cluster.yaml");
    let svc = |name: &str, created: &str, ip: &str, np: u16| {
        format!(
            "---\nkind: Service\nmetadata: {{namespace: default, name: {name}{created}}}\n\
             spec: {{type: NodePort, clusterIP: {ip}, ports: [{{name: http, port: 80, nodePort: {np}}}]}}\n\
             ---\nkind: EndpointSlice\napiVersion: discovery.k8s.io/v1\n\
             metadata: {{namespace: default, name: {name}-1, labels: {{kubernetes.io/service-name: {name}}}}}\n\
             addressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{{addresses: [10.1.0.9]}}]\n"
        )
    };
    let manifest = [
        "kind: Node\nmetadata: {name: n1}\n".to_string(),
        svc("web", "", "10.96.0.1", 2222),
        svc(
            "ok",
            ", creationTimestamp: \"2024-01-01T00:00:00Z\"",
            "10.96.0.2",
            30080,
        ),
        svc(
            "dup",
            ", creationTimestamp: \"2025-01-01T00:00:00Z\"",
            "10.96.0.3",
            30080,
        ),
    ]
    .concat();
    std::fs::write(&input, manifest).expect("write");
    let nft = accepting_nft(dir.path());
    let mut child = kpng()
        .args(["file", "--input"])
        .arg(&input)
        .args(["--node-name", "n1", "--node-ip", "192.0.2.1"])
        .args(["--min-sync-period", "0", "--metrics-bind-address="])
        .arg("--healthz-bind-address=127.0.0.1:0")
        .args(["to-local", "nft", "--dry-run", "--nft-binary"])
        .arg(&nft)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kpng");
    let stdout = kpng_testkit::collect_output(child.stdout.take().expect("stdout"));
    let stderr = kpng_testkit::collect_output(child.stderr.take().expect("stderr"));
    let deadline = Instant::now() + Duration::from_secs(10);
    let (out, err) = loop {
        let (out, err) = (
            stdout.lock().expect("lock").clone(),
            stderr.lock().expect("lock").clone(),
        );
        if err.contains(" synced") {
            break (out, err);
        }
        if Instant::now() > deadline || matches!(child.try_wait(), Ok(Some(_))) {
            let _ = child.kill();
            panic!("no sync within 10 s:\n{err}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        err.contains("Service default/web: field spec.ports[0].nodePort: 2222 is outside --service-node-port-range 30000-32767; the node port is not programmed"),
        "{err}"
    );
    assert!(
        err.contains("Service default/dup: field spec.ports[0].nodePort: node port 30080/TCP is also Service default/ok's"),
        "{err}"
    );
    // The out-of-range node port is absent, its ClusterIP served; the node port goes to the
    // older Service only, the younger one keeps its ClusterIP.
    assert!(!out.contains("2222"), "{out}");
    assert!(
        out.contains("10.96.0.1 . tcp . 80 comment \"default/web:http\""),
        "{out}"
    );
    assert!(
        out.contains("10.96.0.3 . tcp . 80 comment \"default/dup:http\""),
        "{out}"
    );
    assert_eq!(out.matches("tcp . 30080 comment").count(), 1, "{out}");
    assert!(
        out.contains("tcp . 30080 comment \"default/ok:http\""),
        "{out}"
    );
}

/// `kpng --help` lists the global flags once, grouped in the order source, node, backend,
/// output, logging; a subcommand's help lists its own flags and says where the global ones are,
/// which are still accepted anywhere on the line.
#[test]
fn help_lists_the_global_flags_once_grouped() {
    let help = |args: &[&str]| {
        let out = kpng().args(args).output().expect("run kpng");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let root = help(&["--help"]);
    let at = |heading: &str| {
        root.lines()
            .position(|l| l == heading)
            .unwrap_or_else(|| panic!("{heading} in:\n{root}"))
    };
    let order: Vec<usize> = ["Source:", "Node:", "Backend:", "Output:", "Logging:"]
        .iter()
        .map(|h| at(h))
        .collect();
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "{order:?} in:\n{root}"
    );
    assert_eq!(root.matches("--masquerade-bit <").count(), 1, "{root}");
    // --logging-format changes the log lines only: its values claim nothing of `kpng
    // version` or `kpng trace` (whose JSON is their own `-o json`).
    let logging = root
        .split_once("--logging-format <")
        .and_then(|(_, rest)| rest.split_once("--log-file"))
        .map(|(text, _)| text)
        .unwrap_or_else(|| panic!("--logging-format in:\n{root}"));
    assert!(
        !logging.contains("for `kpng version` and `kpng trace`"),
        "{logging}"
    );
    assert!(logging.contains("Log lines only"), "{logging}");
    assert!(root.contains("--conntrack-mark-mask <MASK>"), "{root}");

    for args in [
        &["kube", "--help"][..],
        &["file", "--help"],
        &["help", "file"],
        &["kube", "to-local", "nft", "--help"],
        &[
            "file",
            "--input",
            "x.yaml",
            "to-local",
            "iptables",
            "--masquerade-bit",
            "5",
            "-h",
        ],
        &["cleanup", "--help"],
    ] {
        let text = help(args);
        for global in [
            "--masquerade-bit <",
            "--log-level <",
            "--kubeconfig <",
            "--node-name <",
        ] {
            assert!(!text.contains(global), "{args:?} repeats {global}:\n{text}");
        }
        assert!(
            text.contains("`kpng --help` lists them once"),
            "{args:?}:\n{text}"
        );
    }
    assert!(help(&["file", "--help"]).contains("--input <INPUT>"));
    assert!(help(&["kube", "to-local", "nft", "--help"]).contains("--dry-run"));
    assert!(help(&["help", "file"]).contains("Usage: kpng file"));

    // A source without its sink: the help on standard error, exit 2.
    let out = kpng().arg("kube").output().expect("run kpng");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Usage: kpng kube") && !stderr.contains("--masquerade-bit <"),
        "{stderr}"
    );
}

/// `to-local userspace --dry-run` prints the capture it would install, with placeholder
/// listener ports, and opens no socket (no listener, no health or metrics server).
#[cfg(target_os = "linux")]
#[test]
fn a_userspace_dry_run_opens_no_listener() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("cluster.yaml");
    let endpoints = "---\nkind: EndpointSlice\nmetadata: {namespace: ns, name: web-1, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints:\n- {addresses: [10.244.1.2], nodeName: n1}\n";
    std::fs::write(&input, service("10.96.0.1", 80) + endpoints).expect("write");
    let output = dir.path().join("stdout");
    let stdout = std::fs::File::create(&output).expect("stdout file");
    let mut k = Kpng::start(
        kpng()
            .args(["file", "--input"])
            .arg(&input)
            .args(["--node-name", "n1", "--min-sync-period", "0"])
            .args(["to-local", "userspace", "--dry-run"])
            .stdout(stdout),
    );
    k.wait("the capture is printed", &output, |out, _| {
        out.contains("vip-listeners { 10.96.0.1 . tcp . 80 : 61000 }")
    });
    // The process's sockets (tokio's signal handling holds a Unix socket pair), and among
    // them the IP ones: a listener, a health or a metrics server would be one.
    let pid = k.child.id();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).expect("fds");
    let inodes: Vec<String> = fds
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let t = target.display().to_string();
            Some(t.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let mut inet = Vec::new();
    for table in ["tcp", "tcp6", "udp", "udp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let inode = line.split_whitespace().nth(9).unwrap_or_default();
            if inodes.iter().any(|i| i == inode) {
                inet.push(format!("{table}: {line}"));
            }
        }
    }
    assert!(
        inet.is_empty(),
        "a dry run opened IP sockets {inet:?}; kpng said:\n{}",
        k.stderr()
    );
    assert!(!k.stderr().contains("opening the"), "{}", k.stderr());
}

/// An operator's slips: an unknown flag, a backend flag on kube-proxy's command line, `--dry-run`
/// before a subcommand, kpng's backend word as `--proxy-mode`.
#[test]
fn an_operators_slips_get_a_hint_or_work() {
    let run = |args: &[&str]| {
        let out = kpng().args(args).output().expect("run kpng");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // (A name far from every flag: for a near one clap suggests that flag instead.)
    let (code, _, err) = run(&["--frobnicate"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("hint: --frobnicate is neither a kpng flag nor a kube-proxy one"),
        "{err}"
    );
    let (code, _, err) = run(&["--hostname-override=n1", "--nft-binary", "/usr/sbin/nft"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("hint: --nft-binary is a flag of `kpng kube … to-local … nft`")
            && err.contains("without a subcommand"),
        "{err}"
    );
    let (code, _, err) = run(&["kube", "--nft-binary", "x", "to-local", "nft"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("write it right after `nft`") && !err.contains("without a subcommand"),
        "{err}"
    );
    // A flag of another backend: kpng says which, and clap's guess at a similar flag of this
    // backend (`--iptables-sync-period` for `--iptables-mode`) is left out.
    let (code, _, err) = run(&[
        "file",
        "--input",
        "x.yaml",
        "to-local",
        "nft",
        "--iptables-mode",
        "nft",
    ]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("hint: --iptables-mode is a flag of `kpng")
            && err.contains("error: unexpected argument '--iptables-mode'")
            && !err.contains("similar argument"),
        "{err}"
    );
    // kube-proxy's booleans take `=`; a space makes the value a word clap reads as a command.
    let (code, _, err) = run(&["--masquerade-all", "true"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("hint: a boolean flag takes its value after '=': --masquerade-all=true"),
        "{err}"
    );
    let (code, _, err) = run(&["--dry-run", "kube", "to-local", "nft"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("write it after the backend"), "{err}");
    // kube-proxy's mode name as the backend word.
    let (code, _, err) = run(&["kube", "to-local", "nftables", "--help"]);
    assert_eq!(code, Some(0), "{err}");
    let (code, out, err) = run(&["--proxy-mode", "nft", "--write-config-to", "-"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.lines().any(|l| l == "mode: nftables"), "{out}");
}

#[test]
fn log_file_takes_the_log_and_the_error_kpng_stops_with() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("kpng.log");
    let output = dir.path().join("out.yaml");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster.yaml");
    // A file that exists already is appended to, not replaced.
    std::fs::write(&log, "an earlier line\n").expect("write");
    // `kpng file --input INPUT … --log-file LOG to-file --output OUTPUT`.
    let logging_to_file = |input: &Path| {
        let mut command = kpng();
        command
            .args(["file", "--input"])
            .arg(input)
            .args(["--node-name", "node1", "--log-file"])
            .arg(&log)
            .args([
                "--metrics-bind-address=",
                "--healthz-bind-address=127.0.0.1:0",
                "--admin-socket=",
                "to-file",
                "--output",
            ])
            .arg(&output);
        command
    };
    let mut running = Kpng::start(&mut logging_to_file(&example));
    running.wait("the first sync, in the log file", &output, |_, _| {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains(" synced "))
    });
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(
        text.starts_with("an earlier line\n") && text.contains("starting kpng"),
        "{text}"
    );
    assert!(!text.contains('\u{1b}'), "no colours in a file: {text}");
    assert_eq!(running.stderr(), "", "the log went to the file");
    drop(running);

    // The error kpng stops with is on stderr, and in the file where a service's operator looks.
    let out = logging_to_file(&dir.path().join("no-such-dir/cluster.yaml"))
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no such directory"), "{stderr}");
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(
        text.lines()
            .any(|l| l.contains("ERROR kpng: stopping: cannot watch")
                && l.contains("no such directory")),
        "{text}"
    );

    // A log file that cannot be opened is refused at once, naming it.
    let out = kpng()
        .args(["version", "--log-file"])
        .arg(dir.path().join("no-such-dir/kpng.log"))
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(2)
            && stderr.contains("--log-file ")
            && stderr.contains("no-such-dir/kpng.log"),
        "{stderr}"
    );
}

/// The first `vMAJOR.MINOR` in `text`, as Calico's start.ps1 finds kube-proxy's version
/// (`v([0-9])\.([0-9]+)`).
fn v_major_minor(text: &str) -> Option<(u32, u32)> {
    text.match_indices('v').find_map(|(i, _)| {
        let rest = &text[i + 1..];
        let mut chars = rest.chars();
        let major = chars.next()?.to_digit(10)?;
        let rest = rest.get(1..)?.strip_prefix('.')?;
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        Some((major, digits.parse().ok()?))
    })
}

#[test]
fn version_lines_carry_the_kubernetes_version_as_kube_proxys_does() {
    // kube-proxy prints `Kubernetes v1.x.y`; scripts that check it (Calico's start.ps1 runs
    // `kube-proxy.exe --version`) find kpng's Kubernetes API version the same way.
    let schema = kpng_k8s::KUBERNETES_SCHEMA;
    let want = schema
        .split_once('.')
        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
    assert!(want.is_some(), "{schema}");
    for args in [&["--version"][..], &["-V"], &["version"]] {
        let out = kpng().args(args).output().expect("run kpng");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{args:?}: {stdout}");
        let first = stdout.lines().next().unwrap_or_default();
        assert!(first.starts_with("kpng 0."), "{args:?}: {first}");
        assert!(
            first.contains(&format!("Kubernetes v{schema} API")),
            "{args:?}: {first}"
        );
        assert_eq!(v_major_minor(first), want, "{args:?}: {first}");
        if args != ["version"] {
            assert!(first.contains("(git "), "which build: {args:?}: {first}");
        }
    }
    let long = kpng().arg("--version").output().expect("run kpng");
    let long = String::from_utf8_lossy(&long.stdout);
    assert!(
        long.contains("(git ") && long.contains(", built "),
        "{long}"
    );
}

#[test]
fn help_names_every_mode_and_each_systems_default() {
    let out = kpng().arg("--help").output().expect("run kpng");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{help}");
    // Help wraps lines: compare with single spaces.
    let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains("iptables on Linux, kernelspace on Windows"),
        "{help}"
    );
    let proxy_mode = flat
        .split("--proxy-mode <MODE>")
        .nth(1)
        .and_then(|rest| rest.split(" --").next())
        .unwrap_or_else(|| panic!("--proxy-mode in:\n{help}"));
    for mode in [
        "iptables",
        "nftables",
        "kernelspace",
        "winkernel",
        "userspace",
        "ebpf",
    ] {
        assert!(proxy_mode.contains(mode), "{mode} in: {proxy_mode}");
    }
    // `to-local winkernel` is an alias of the HNS backend: --proxy-mode takes it too.
    let out = kpng()
        .args(["--proxy-mode=winkernel", "--write-config-to", "-"])
        .output()
        .expect("run kpng");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.lines().any(|l| l == "mode: kernelspace"), "{stdout}");
}

/// `GET path` on 127.0.0.1:port: (status code, body); `None` while nothing listens.
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n")?.1.to_string();
    Some((code, body))
}

#[test]
fn a_brain_is_ready_once_its_cluster_is_listed_alive_before_and_says_it_traces_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("c.yaml");
    let mut brain = Kpng::start(
        kpng()
            .args(["file", "--input"])
            .arg(&input)
            .args(["--debounce", "0", "--admin-socket"])
            .arg(dir.path().join("admin.sock"))
            .arg("--metrics-bind-address=127.0.0.1:0")
            .args(["to-api", "--listen"])
            .arg(format!("unix://{}", dir.path().join("b.sock").display())),
    );
    // The port kpng bound and logged (one found free here and released could be taken by
    // another test of this binary before kpng binds it).
    const SERVING: &str = "serving /metrics on http://";
    brain.wait("the metrics address", &input, |_, err| {
        err.contains(SERVING)
    });
    let port = brain
        .stderr()
        .lines()
        .find_map(|l| l.split_once(SERVING))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
        .unwrap_or_else(|| panic!("no metrics address in:\n{}", brain.stderr()))
        .port();
    // The answer `want` whose body holds `showing` (the source records the missing file a
    // moment after the server answers: a first 503 may not name it yet).
    let wait_for = |path: &str, want: u16, showing: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some((code, body)) = http_get(port, path)
                && code == want
                && body.contains(showing)
            {
                return body;
            }
            assert!(
                Instant::now() < deadline,
                "{path} {want} showing {showing} within 10 s:\n{}",
                brain.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // The manifest is not there yet: alive, not ready (nodes would get nothing).
    let live = wait_for("/livez", 200, "");
    assert!(live.contains("\"synced\":false"), "{live}");
    wait_for("/healthz", 503, "\"inputProblems\":1");
    std::fs::write(&input, service("10.96.0.9", 80)).expect("write");
    let ready = wait_for("/healthz", 200, "");
    assert!(
        ready.contains("\"synced\":true") && ready.contains("\"inputProblems\":0"),
        "{ready}"
    );
    // `kpng trace` asked of a brain says where to ask instead.
    let out = kpng()
        .args([
            "trace",
            "--from",
            "10.244.1.5",
            "--to",
            "10.96.0.9:80",
            "--admin-socket",
        ])
        .arg(dir.path().join("admin.sock"))
        .output()
        .expect("kpng trace");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("this kpng is a brain"), "{said}");
}

#[test]
fn a_node_whose_brain_shuts_down_says_so_and_awaits_its_successor_without_a_warning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("c.yaml");
    std::fs::write(&input, service("10.96.0.9", 80)).expect("write");
    let socket = format!("unix://{}", dir.path().join("b.sock").display());
    let brain = || {
        let mut brain = Kpng::start(
            kpng()
                .args(["file", "--input"])
                .arg(&input)
                .arg("--admin-socket")
                .arg(dir.path().join("brain.sock"))
                .arg("--metrics-bind-address=127.0.0.1:0")
                .args(["to-api", "--listen", &socket]),
        );
        brain.wait("the brain listens", &input, |_, err| {
            err.contains("API listening")
        });
        brain
    };
    let mut first = brain();
    let output = dir.path().join("out.yaml");
    let mut node = Kpng::start(
        kpng()
            .args([
                "api",
                "--api",
                &socket,
                "--node-name",
                "n1",
                "--admin-socket",
            ])
            .arg(dir.path().join("node.sock"))
            .args(["--metrics-bind-address=", "--healthz-port=0"])
            .args(["to-file", "--output"])
            .arg(&output),
    );
    node.wait("the node programmed web", &output, |out, _| {
        out.contains("web")
    });
    // The brain is stopped as a rollout or a restart stops it.
    let status = Command::new("kill")
        .args(["-TERM", &first.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let exit = first.child.wait().expect("the brain exits");
    assert!(exit.success(), "{exit}:\n{}", first.stderr());
    node.wait("the node heard the brain shut down", &output, |_, err| {
        err.contains("the brain is shutting down (a restart or a rollout)")
    });
    let _second = brain();
    node.wait("the node follows the next brain", &output, |_, err| {
        err.matches("brain state replayed").count() == 2
    });
    assert!(
        !node.stderr().contains(" WARN "),
        "a planned restart is no warning:\n{}",
        node.stderr()
    );
}

/// `kpng status` against a kpng that does not answer (stopped here with SIGSTOP) gives up
/// after `--timeout`, naming the process, instead of waiting forever; and a reader that
/// closes its end of the pipe early (`| head -1`) ends it quietly, not with a panic.
#[cfg(target_os = "linux")]
#[test]
fn status_gives_up_on_a_hung_kpng_and_stops_quietly_when_its_reader_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("c.yaml");
    std::fs::write(&input, service("10.96.0.9", 80)).expect("write");
    let output = dir.path().join("out.yaml");
    let admin = dir.path().join("admin.sock");
    let running = synced_with_admin_socket(&input, &admin, &output);

    // The reader is gone before kpng writes.
    let mut status = kpng()
        .args(["status", "-o", "json", "--admin-socket"])
        .arg(&admin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kpng status");
    drop(status.stdout.take());
    let out = status.wait_with_output().expect("kpng status");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {said}", out.status);
    assert!(!said.contains("panicked"), "{said}");

    let pid = running.child.id().to_string();
    let stopped = Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .expect("kill");
    assert!(stopped.success());
    let mut status = kpng()
        .args(["status", "--timeout", "1s", "--admin-socket"])
        .arg(&admin)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kpng status");
    let deadline = Instant::now() + Duration::from_secs(20);
    let ended = loop {
        if let Some(code) = status.try_wait().expect("wait") {
            break Some(code);
        }
        if Instant::now() > deadline {
            let _ = status.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = Command::new("kill").args(["-CONT", &pid]).status();
    let out = status.wait_with_output().expect("kpng status");
    let said = String::from_utf8_lossy(&out.stderr);
    let code = ended.unwrap_or_else(|| panic!("still waiting after 20 s: {said}"));
    // No answer within --timeout has its own exit code (docs/observability.md).
    assert_eq!(code.code(), Some(4), "{said}");
    assert!(
        said.contains(&format!(
            "the kpng at {} (pid {pid}) did not answer within 1s",
            admin.display()
        )),
        "{said}"
    );
}

/// An empty RUST_LOG (a template that left it blank) is as unset: the log is kpng's usual one,
/// not silenced.
#[test]
fn an_empty_rust_log_does_not_silence_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = kpng()
        .env("RUST_LOG", "")
        .args(["file", "--input"])
        .arg(dir.path().join("missing/cluster.yaml"))
        .args([
            "--healthz-port=0",
            "--metrics-bind-address=",
            "--admin-socket=",
            "to-file",
            "--output",
        ])
        .arg(dir.path().join("out.yaml"))
        .output()
        .expect("run kpng");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(" INFO "), "{stderr}");
}

/// Under `ip netns exec` (a fresh /sys), a `--cgroup-path` under /sys that the host has is
/// not seen: the refusal says so and what to do, not only "no such directory".
#[test]
fn a_cgroup_path_hidden_by_ip_netns_exec_is_explained() {
    kpng_testkit::require_root!();
    let ns = kpng_testkit::Netns::node("cli-ebpffix44").expect("netns");
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("c.yaml");
    std::fs::write(&input, service("10.96.0.9", 80)).expect("write");
    // A path the host has (its cgroup mount), hidden by the namespace's fresh /sys.
    let hidden = "/sys/fs/cgroup/kpng-ebpffix44-hidden";
    let out = ns
        .command([env!("CARGO_BIN_EXE_kpng")])
        .args(["file", "--input"])
        .arg(&input)
        .args(["to-local", "ebpf", "--dry-run", "--cgroup-path", hidden])
        .output()
        .expect("run kpng");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    for want in [
        &format!("--cgroup-path {hidden}: no such directory in kpng's mount namespace")[..],
        "`ip netns exec` mounts a fresh /sys",
        "nsenter --net",
    ] {
        assert!(stderr.contains(want), "{want:?} in {stderr}");
    }
}

/// Who can read a brain, said once at start-up. With TLS but without `--listen-tls-ca` beyond
/// loopback, any client that reaches it reads any node's view by naming the node: that was
/// silent. A private key every local user can read is named with its mode (the brain's and a
/// node's). The plaintext loopback default says, once, that every local user can read it.
#[test]
fn a_brain_says_who_can_read_it_and_names_a_key_every_user_can_read() {
    kpng_testkit::require_root!();
    let ns = kpng_testkit::Netns::node("cli-expose").expect("netns");
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("c.yaml");
    std::fs::write(&input, service("10.96.0.9", 80)).expect("write");
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-subj", "/CN=brain", "-days", "1", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl");
    assert!(made.status.success(), "{made:?}");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    }
    let brain = |listen: &str, tls: bool| {
        let mut command = ns.command([env!("CARGO_BIN_EXE_kpng")]);
        command
            .args(["file", "--input"])
            .arg(&input)
            .args(["--admin-socket=", "--metrics-bind-address="])
            .args(["to-api", "--listen", listen]);
        if tls {
            command
                .arg("--listen-tls-cert")
                .arg(&cert)
                .arg("--listen-tls-key")
                .arg(&key);
        }
        Kpng::start(&mut command)
    };
    let key_warning = format!(
        "--listen-tls-key {}: the private key is readable by every user (mode 0644)",
        key.display()
    );
    let mut tls = brain("tcp://0.0.0.0:12090", true);
    tls.wait("the brain's warnings", &input, |_, err| {
        err.contains("API listening") && err.contains(&key_warning)
    });
    let said = tls.stderr();
    let no_ca = "with TLS but without --listen-tls-ca: any client that reaches it reads any \
                 node's view";
    assert_eq!(said.matches(no_ca).count(), 1, "{said}");
    assert!(
        said.lines()
            .any(|l| l.contains(" WARN ") && l.contains(no_ca)),
        "{said}"
    );
    drop(tls);
    let mut plain = brain("tcp://127.0.0.1:12090", false);
    plain.wait("the brain's listening line", &input, |_, err| {
        err.contains("API listening")
    });
    let said = plain.stderr();
    assert!(
        said.lines().any(|l| l.contains(" INFO ")
            && l.contains("every local user and every host-network pod can read every Service")
            && l.contains("unix:///PATH (mode 0600)")),
        "{said}"
    );
    drop(plain);
    // A node's key, the same.
    let mut node = Kpng::start(
        ns.command([env!("CARGO_BIN_EXE_kpng")])
            .args([
                "local",
                "--api",
                "tcp://127.0.0.1:12090",
                "--node-name",
                "n1",
            ])
            .arg("--api-tls-cert")
            .arg(&cert)
            .arg("--api-tls-key")
            .arg(&key)
            .args(["--admin-socket=", "--metrics-bind-address="])
            .args(["--healthz-bind-address=127.0.0.1:0", "nft", "--dry-run"]),
    );
    let node_warning = format!(
        "--api-tls-key {}: the private key is readable by every user (mode 0644)",
        key.display()
    );
    node.wait("the node's key warning", &input, |_, err| {
        err.contains(&node_warning)
    });
}

/// Interface names are spliced into the rules: the flags and the file's fields take only names
/// the kernel could give a link, without wildcards (which iptables and nftables read
/// differently); `--detect-local-mode=` (empty) is ClusterCIDR, as kube-proxy and the file's
/// `detectLocalMode: ""` take it.
#[test]
fn pod_interface_names_are_checked_and_an_empty_detect_local_mode_is_the_default() {
    for (args, says) in [
        (
            &[
                "--detect-local-mode",
                "BridgeInterface",
                "--pod-bridge-interface",
                "cni0\" counter \"",
            ][..],
            "--pod-bridge-interface \"cni0\\\" counter \\\"\": has '\"'",
        ),
        (
            &[
                "--detect-local-mode",
                "BridgeInterface",
                "--pod-bridge-interface",
                "cni+",
            ][..],
            "--pod-bridge-interface \"cni+\": a bridge name is exact; for a wildcard use \
             --detect-local-mode InterfaceNamePrefix with the prefix, without `*`",
        ),
        (
            &[
                "--detect-local-mode",
                "InterfaceNamePrefix",
                "--pod-interface-name-prefix",
                "cali*",
            ][..],
            "--pod-interface-name-prefix \"cali*\": a prefix matches every name that starts with it",
        ),
        (
            &["--pod-bridge-interface", "a-very-long-bridge-nm"][..],
            "--pod-bridge-interface \"a-very-long-bridge-nm\": is 21 bytes long; a link name has \
             at most 15",
        ),
    ] {
        let out = kpng()
            .args(args)
            .args(["--write-config-to", "-"])
            .output()
            .expect("run kpng");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: nothing written");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("kp.yaml");
    std::fs::write(
        &file,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
         detectLocalMode: InterfaceNamePrefix\ndetectLocal: {interfaceNamePrefix: \"veth+\"}\n",
    )
    .expect("write");
    let out = kpng()
        .arg("--config")
        .arg(&file)
        .arg("version")
        .output()
        .expect("run kpng");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("field detectLocal.interfaceNamePrefix \"veth+\": a prefix matches"),
        "{stderr}"
    );
    // Empty: the default mode.
    let out = kpng()
        .args(["--detect-local-mode=", "--cluster-cidr", "10.244.0.0/16"])
        .args(["--write-config-to", "-"])
        .output()
        .expect("run kpng");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.lines().any(|l| l == "detectLocalMode: ClusterCIDR"),
        "{stdout}"
    );
    // The trace's interface is a link name too, checked before kpng is asked.
    let out = kpng()
        .args(["trace", "--from", "10.244.1.5", "--to", "10.96.0.10:80"])
        .args(["--in-interface", "cni0 x", "--admin-socket"])
        .arg(dir.path().join("none.sock"))
        .output()
        .expect("run kpng");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // A wrong command line: exit 2 (docs/observability.md, "Output for scripts").
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--in-interface \"cni0 x\": has ' '"),
        "{stderr}"
    );
}

/// README's first command, `kpng file --input examples/cluster.yaml --node-name node1 to-file
/// --output -`, runs on a node whose proxy holds kube-proxy's health and metrics ports: a sink
/// that programs nothing opens no listener unless asked (until 2026-12-07 it bound
/// 0.0.0.0:10256 and failed with "Address already in use").
#[test]
fn to_file_runs_beside_a_proxy_holding_the_health_and_metrics_ports() {
    // Held here, or already held by someone else: either way taken.
    let _health = std::net::TcpListener::bind("0.0.0.0:10256");
    let _metrics = std::net::TcpListener::bind("127.0.0.1:10249");
    let dir = tempfile::tempdir().expect("tempdir");
    let output = dir.path().join("out.yaml");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster.yaml");
    let mut kpng = Kpng::start(
        Command::new(env!("CARGO_BIN_EXE_kpng"))
            .env_remove("RUST_LOG")
            .args(["file", "--input"])
            .arg(&example)
            .args(["--node-name", "node1", "to-file", "--output"])
            .arg(&output),
    );
    kpng.wait("the model written", &output, |out, err| {
        !out.is_empty() && err.contains(" synced")
    });
    let err = kpng.stderr();
    assert!(
        err.contains(
            "to-file programs nothing: no health server, no metrics server, no admin socket \
             (give --healthz-bind-address, --metrics-bind-address, --admin-socket to have them)"
        ) && !err.contains("serving /healthz"),
        "{err}"
    );
}

/// A `kpng file … to-file` of `input` into `output` answering `kpng status` at `admin` (no
/// health or metrics server), once it has synced: what the tests of `kpng status` ask.
fn synced_with_admin_socket(input: &Path, admin: &Path, output: &Path) -> Kpng {
    let mut running = Kpng::start(
        kpng()
            .args(["file", "--input"])
            .arg(input)
            .args(["--node-name", "n1", "--healthz-bind-address", ""])
            .args(["--debounce", "0", "--metrics-bind-address="])
            .arg("--admin-socket")
            .arg(admin)
            .args(["to-file", "--output"])
            .arg(output),
    );
    running.wait("the first sync", output, |_, err| err.contains(" synced"));
    running
}

/// `kpng status -o json` of the kpng at `admin` with `args`: the exit code, standard output
/// read as JSON (`Null` when it is not), and standard error.
fn status_json(admin: &Path, args: &[&str]) -> (Option<i32>, serde_json::Value, String) {
    let out = kpng()
        .args(args)
        .arg("--admin-socket")
        .arg(admin)
        .output()
        .expect("run kpng");
    let json = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (
        out.status.code(),
        json,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Automation around kpng tells its failures apart by exit code (docs/observability.md): no
/// kpng 3, no match 5, a wrong command line 2, ports with a problem 6 with
/// `--fail-on-problems`; with `-o json` a failure is a JSON error on standard output too, and
/// the status says each port's problems, their counts and its schema's version.
#[test]
fn status_and_trace_exit_codes_and_json_are_for_scripts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let admin = dir.path().join("admin.sock");
    // No kpng: not reachable.
    let (code, json, said) = status_json(&admin, &["status", "-o", "json"]);
    assert_eq!(code, Some(3), "{said}");
    assert_eq!(json["error"]["code"], "notReachable", "{json}");
    assert_eq!(json["error"]["exitCode"], 3, "{json}");
    assert_eq!(json["schemaVersion"], 1, "{json}");
    let (code, json, said) = status_json(&admin, &["status"]);
    assert_eq!((code, json), (Some(3), serde_json::Value::Null), "{said}");

    let input = dir.path().join("c.yaml");
    // ns/bad is rejected: it has no port.
    let bad = "---\nkind: Service\nmetadata: {namespace: ns, name: bad}\n\
               spec: {clusterIP: 10.96.0.8, ports: [{name: http, port: 99999}]}\n";
    std::fs::write(&input, service("10.96.0.9", 80) + bad).expect("write");
    let output = dir.path().join("out.yaml");
    let _running = synced_with_admin_socket(&input, &admin, &output);

    // The Service has no endpoints: its port says so, and the counts.
    let (code, json, said) = status_json(&admin, &["status", "-o", "json"]);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(json["schemaVersion"], 1, "{json}");
    assert_eq!(
        json["services"][0]["problems"],
        serde_json::json!(["noEndpoints"]),
        "{json}"
    );
    assert_eq!(json["problemCounts"]["noEndpoints"], 1, "{json}");
    assert_eq!(json["problemCounts"]["rejected"], 0, "{json}");
    assert_eq!(json["portsWithProblems"], 1, "{json}");
    assert_eq!(json["problemsOnly"], false, "{json}");
    let (_, json, _) = status_json(&admin, &["status", "-o", "json", "--problems"]);
    assert_eq!(json["problemsOnly"], true, "{json}");
    assert_eq!(json["portsNotShown"], 0, "{json}");

    // Asked to, a status with a problem fails with its own code, printed all the same.
    let out = kpng()
        .args(["status", "--fail-on-problems", "--admin-socket"])
        .arg(&admin)
        .output()
        .expect("run kpng");
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(6), "{said}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("ns/web"));
    assert!(
        said.contains("1 Service port has a problem (--fail-on-problems)"),
        "{said}"
    );
    let (code, json, said) = status_json(&admin, &["status", "-o", "json", "--fail-on-problems"]);
    assert_eq!(code, Some(6), "{said}");
    assert_eq!(json["portsWithProblems"], 1, "{json}");

    // Nothing matches: 5, and a JSON error.
    let (code, json, said) = status_json(&admin, &["status", "-o", "json", "ns/nosuch"]);
    assert_eq!(code, Some(5), "{said}");
    assert_eq!(json["error"]["code"], "noMatch", "{json}");
    assert!(
        json["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no Service port matches")),
        "{json}"
    );
    // A rejected Service is a document with its rejection; in a table, no port matches.
    let (code, json, said) = status_json(&admin, &["status", "-o", "json", "ns/bad"]);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(json["services"], serde_json::json!([]), "{json}");
    assert_eq!(json["rejected"][0]["object"], "Service ns/bad", "{json}");
    let (code, _, said) = status_json(&admin, &["status", "ns/bad"]);
    assert_eq!(code, Some(5), "{said}");
    assert!(
        said.contains("no Service port matches \"ns/bad\""),
        "{said}"
    );
    // A wrong command line: 2.
    let (code, json, said) = status_json(
        &admin,
        &[
            "status",
            "-o",
            "yaml",
            "-n",
            "a",
            "b/web",
            "--timeout",
            "5s",
        ],
    );
    assert_eq!(code, Some(2), "{said}");
    assert_eq!(json, serde_json::Value::Null, "YAML, not JSON");
    let trace = |to: &str| {
        status_json(
            &admin,
            &["trace", "-o", "json", "--from", "10.244.1.5", "--to", to],
        )
    };
    let (code, json, said) = trace("[fd00::9]:80");
    assert_eq!(code, Some(2), "{said}");
    assert_eq!(json["error"]["code"], "usage", "{json}");
    let (code, json, said) = trace("10.96.0.9:80");
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(json["schemaVersion"], 1, "{json}");
    assert!(json.get("error").is_none(), "{json}");
    // An address no Service has: the trace still says what the node does with it, and
    // exits 5 as a status that matches nothing; as JSON, the trace carries the error (one
    // document). Until 2026-12-07: exit 0.
    let (code, json, said) = trace("192.0.2.1:80");
    assert_eq!(code, Some(5), "{said}");
    assert_eq!(json["error"]["code"], "noMatch", "{json}");
    assert_eq!(json["error"]["exitCode"], 5, "{json}");
    assert_eq!(json["schemaVersion"], 1, "{json}");
    assert!(json["service"].is_null(), "{json}");
    assert!(
        json["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{json}"
    );
    assert!(
        said.contains("no Service frontend matches tcp 192.0.2.1:80"),
        "{said}"
    );
    let out = kpng()
        .args(["trace", "--from", "10.244.1.5", "--to", "192.0.2.1:80"])
        .arg("--admin-socket")
        .arg(&admin)
        .output()
        .expect("run kpng");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(5), "{text}");
    assert!(
        text.contains("  why:        "),
        "the explanation stays: {text}"
    );
}

/// Every time in a JSON document of `kpng status` is RFC 3339 in UTC with milliseconds
/// (docs/observability.md, "Output for scripts").
fn assert_times_have_milliseconds(value: &serde_json::Value) {
    match value {
        serde_json::Value::String(s)
            if s.len() >= 11 && s.as_bytes()[4] == b'-' && s.as_bytes()[10] == b'T' =>
        {
            let b = s.as_bytes();
            assert!(
                s.len() == 24 && b[19] == b'.' && s.ends_with('Z'),
                "{s:?} is not RFC 3339 with milliseconds"
            );
        }
        serde_json::Value::Array(items) => items.iter().for_each(assert_times_have_milliseconds),
        serde_json::Value::Object(map) => map.values().for_each(assert_times_have_milliseconds),
        _ => {}
    }
}

/// The status's prose has machine-readable companions (docs/observability.md, "Output for
/// scripts"): the input's kind, location and state, what a port without endpoints meets as
/// words; its times have one precision.
#[test]
fn the_status_json_has_words_for_scripts_beside_its_prose() {
    let dir = tempfile::tempdir().expect("tempdir");
    let admin = dir.path().join("admin.sock");
    let input = dir.path().join("c.yaml");
    std::fs::write(&input, service("10.96.0.9", 80)).expect("write");
    let output = dir.path().join("out.yaml");
    let _running = synced_with_admin_socket(&input, &admin, &output);
    let (code, json, said) = status_json(&admin, &["status", "-o", "json"]);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(json["input"]["kind"], "file", "{json}");
    assert_eq!(
        json["input"]["location"],
        input.display().to_string(),
        "{json}"
    );
    assert_eq!(json["input"]["state"], "ok", "{json}");
    assert_eq!(
        json["services"][0]["withoutEndpointsDetail"],
        serde_json::json!({"reason": "noEndpoints", "traffic": "all", "verdict": "reject"}),
        "{json}"
    );
    assert!(json["lastSuccessfulSync"].is_string(), "{json}");
    assert_times_have_milliseconds(&json);
}

/// A kpng that answers 503 (it is stopping) is exit 7, `unavailable`: a script retries,
/// rather than reporting a broken kpng (it was exit 1, "other").
#[test]
fn a_kpng_that_answers_503_is_exit_7() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().expect("tempdir");
    let admin = dir.path().join("admin.sock");
    let listener = std::os::unix::net::UnixListener::bind(&admin).expect("bind");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut request = Vec::new();
            let mut byte = [0u8; 1];
            while !request.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                request.push(byte[0]);
            }
            let body = "this kpng does not answer status questions (a brain, or it is stopping)\n";
            let _ = write!(
                stream,
                "HTTP/1.1 503 Service Unavailable\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    for args in [
        &["status", "-o", "json"][..],
        &[
            "trace",
            "-o",
            "json",
            "--from",
            "10.0.0.1",
            "--to",
            "10.96.0.9:80",
        ][..],
    ] {
        let (code, json, said) = status_json(&admin, args);
        assert_eq!(code, Some(7), "{args:?}: {said}");
        assert_eq!(json["error"]["code"], "unavailable", "{json}");
        assert_eq!(json["error"]["exitCode"], 7, "{json}");
        assert!(said.contains("it is stopping"), "{said}");
    }
    let (code, _, said) = status_json(&admin, &["status"]);
    assert_eq!(code, Some(7), "{said}");
}

/// A probe pointed at the metrics port reads the proxy's health as at the health port: the
/// same JSON answers on `/healthz`, `/livez` and `/readyz` (it was a plain `ok` forever, and
/// no `/readyz`).
#[test]
fn the_metrics_port_answers_the_health_servers_probes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("c.yaml");
    std::fs::write(&input, service("10.96.0.9", 80)).expect("write");
    let output = dir.path().join("out.yaml");
    let mut running = Kpng::start(
        kpng()
            .args(["file", "--input"])
            .arg(&input)
            .args(["--node-name", "n1", "--healthz-bind-address", "127.0.0.1:0"])
            .args(["--debounce", "0", "--metrics-bind-address=127.0.0.1:0"])
            .arg("--admin-socket=")
            .args(["to-file", "--output"])
            .arg(&output),
    );
    const SERVING: &str = "serving /metrics on http://";
    running.wait("the first sync", &output, |_, err| {
        err.contains(" synced") && err.contains(SERVING)
    });
    let port = running
        .stderr()
        .lines()
        .find_map(|l| l.split_once(SERVING))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
        .unwrap_or_else(|| panic!("no metrics address in:\n{}", running.stderr()))
        .port();
    for path in ["/healthz", "/livez", "/readyz"] {
        let (code, body) = http_get(port, path).unwrap_or_else(|| panic!("{path}"));
        assert_eq!(code, 200, "{path}: {body}");
        let json: serde_json::Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
        assert!(json.is_object(), "{path}: {body}");
    }
}

/// A DaemonSet's `env` set to nothing (an empty `$(VAR)`, a blank ConfigMap key) is as if
/// unset; a bad value names its variable, which the operator finds in the Pod's `env`
/// rather than in its `args`.
#[test]
fn empty_environment_variables_are_unset_and_bad_ones_are_named() {
    let ebpf = ["--write-config-to", "-", "file", "--input", "/dev/null"];
    for (var, value, code, said) in [
        ("KPNG_BPF_PIN_PATH", "", Some(0), ""),
        ("KPNG_SOCKET_LB_HOST_NETNS_ONLY", "", Some(0), ""),
        ("KPNG_CGROUP_PATH", " ", Some(0), ""),
        (
            "KPNG_SOCKET_LB_HOST_NETNS_ONLY",
            "maybe",
            Some(2),
            "hint: the value comes from the environment variable \
             KPNG_SOCKET_LB_HOST_NETNS_ONLY",
        ),
    ] {
        let out = kpng()
            .args(ebpf)
            .args(["to-local", "ebpf"])
            .env(var, value)
            .output()
            .expect("run kpng");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), code, "{var}={value:?}: {stderr}");
        assert!(stderr.contains(said), "{var}={value:?}: {stderr}");
    }
    // On the command line, the flag is the one named: no hint about a variable.
    let out = kpng()
        .args(ebpf)
        .args(["to-local", "ebpf", "--socket-lb-host-netns-only=maybe"])
        .env("KPNG_SOCKET_LB_HOST_NETNS_ONLY", "true")
        .output()
        .expect("run kpng");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(!stderr.contains("environment variable"), "{stderr}");
    let out = kpng()
        .args(["--write-config-to", "-"])
        .env("KPNG_NODE_NAME", "Node_1")
        .output()
        .expect("run kpng");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the node name \"Node_1\" (the KPNG_NODE_NAME environment variable)"),
        "{stderr}"
    );
}

/// A brain's `--config` file is read again as a node's kpng reads it: a content it cannot use
/// is refused loudly while it serves on, a valid one ends it (status 1) so that its restart
/// applies it, saying its nodes keep their rules meanwhile. A brain ignored its file until
/// 2026-12-07 (`/configz` kept the old values while the ConfigMap said otherwise).
#[cfg(target_os = "linux")]
#[test]
fn a_brains_changed_config_file_ends_it_when_valid_and_is_refused_loudly_when_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let volume = kpng_testkit::ProxyConfigMount::new(dir.path(), "").expect("a ConfigMap volume");
    let version = |n: u32, body: &str| volume.version(n, body).expect("a ConfigMap version");
    version(1, "clusterCIDR: 10.244.0.0/16\n");
    let input = dir.path().join("c.yaml");
    std::fs::write(&input, service("10.96.0.1", 80)).expect("write");
    let mut brain = Kpng::start(
        kpng()
            .arg("--config")
            .arg(volume.file())
            .args(["file", "--input"])
            .arg(&input)
            .args(["--admin-socket=", "--metrics-bind-address=127.0.0.1:0"])
            .args(["to-api", "--listen"])
            .arg(format!("unix://{}", dir.path().join("b.sock").display())),
    );
    brain.wait("the brain serving", &input, |_, err| {
        err.contains("starting kpng brain")
    });
    version(
        2,
        "clusterCIDR: 10.244.0.0/16\nconntrack:\n  maxPerCore: -1\n",
    );
    brain.wait("the refusal", &input, |_, err| {
        err.contains(" ERROR ")
            && err.contains("changed but cannot be used")
            && err.contains("field conntrack.maxPerCore: -1 is negative")
    });
    version(3, "clusterCIDR: 10.245.0.0/16\n");
    let exit = kpng_testkit::wait_exit(&mut brain.child, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("the brain did not end:\n{}", brain.stderr()));
    let stderr = brain.stderr();
    assert_eq!(exit.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "changed: ending so that the restart applies it (its nodes keep their rules \
             meanwhile and watch the restarted brain)"
        ),
        "{stderr}"
    );
}

/// The `--config` file of a running kpng, mounted as the kubelet mounts a ConfigMap
/// (`config.conf -> ..data/config.conf`, `..data -> ..<version>`) and updated by its swap of
/// `..data`: a new content kpng cannot use is refused loudly while kpng runs on (an ERROR
/// naming the field, a `kpng status` PROBLEM, the gauge), and a valid one ends kpng (status 1,
/// as kube-proxy) so that its restart applies it. kpng ignored both until 2026-12-07.
#[cfg(target_os = "linux")]
#[test]
fn a_changed_config_file_ends_kpng_when_valid_and_is_refused_loudly_when_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let volume = kpng_testkit::ProxyConfigMount::new(dir.path(), "").expect("a ConfigMap volume");
    let version = |n: u32, body: &str| volume.version(n, body).expect("a ConfigMap version");
    version(1, "clusterCIDR: 10.244.0.0/16\n");
    let config = volume.file();
    let input = dir.path().join("c.yaml");
    std::fs::write(&input, service("10.96.0.1", 80)).expect("write");
    let output = dir.path().join("out.yaml");
    let admin = dir.path().join("admin.sock");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut running = Kpng::start(
        kpng()
            .arg("--config")
            .arg(&config)
            .args(["file", "--input"])
            .arg(&input)
            .args(["--node-name", "n1", "--healthz-bind-address", "127.0.0.1:0"])
            .arg(format!("--metrics-bind-address=127.0.0.1:{port}"))
            .arg("--admin-socket")
            .arg(&admin)
            .args(["--min-sync-period", "0", "to-file", "--output"])
            .arg(&output),
    );
    running.wait("the first sync", &output, |out, err| {
        out.contains("10.96.0.1") && err.contains(" synced")
    });
    let gauge = || {
        http_get(port, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("kpng_config_file_rejected "))
            .map(str::to_string)
    };
    assert_eq!(gauge().as_deref(), Some("kpng_config_file_rejected 0"));

    // A bad merge: kpng runs on, and says so where the operator looks.
    version(
        2,
        "clusterCIDR: 10.244.0.0/16\nconntrack:\n  maxPerCore: -1\n",
    );
    running.wait("the refusal", &output, |_, err| {
        err.contains(" ERROR ")
            && err.contains("changed but cannot be used")
            && err.contains("field conntrack.maxPerCore: -1 is negative")
    });
    let status = kpng()
        .args(["status", "--admin-socket"])
        .arg(&admin)
        .output()
        .expect("kpng status");
    let said = String::from_utf8_lossy(&status.stdout);
    assert!(
        said.contains("--config: ")
            && said.contains("(changed, refused); PROBLEM: the file changed but cannot be used")
            && said.contains("conntrack.maxPerCore"),
        "{said}"
    );
    assert_eq!(gauge().as_deref(), Some("kpng_config_file_rejected 1"));
    std::fs::write(&input, service("10.96.0.2", 80)).expect("write");
    running.wait("kpng still follows its input", &output, |out, _| {
        out.contains("10.96.0.2")
    });

    // A valid new content: kpng ends so that its restart applies it.
    version(3, "clusterCIDR: 10.245.0.0/16\n");
    let exit = kpng_testkit::wait_exit(&mut running.child, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("kpng did not end:\n{}", running.stderr()));
    let stderr = running.stderr();
    assert_eq!(exit.code(), Some(1), "{stderr}");
    // A `to-file` run leaves no rules, and its line says so (it said "the rules stay in
    // place" until 2026-12-07).
    assert!(
        stderr.contains(
            "changed: ending so that the restart applies it (this sink programs no rules)"
        ),
        "{stderr}"
    );
    assert!(!admin.exists(), "the admin socket is removed at the end");
}

/// A `--dry-run` previews one start and nobody restarts it: a new content of its `--config`
/// file does not end it (until 2026-12-07 a valid one ended it with status 1, the status a dry
/// run's failure has); it says whether a start would take the new content and goes on.
#[cfg(target_os = "linux")]
#[test]
fn a_dry_run_goes_on_when_its_config_file_changes_and_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let volume = kpng_testkit::ProxyConfigMount::new(dir.path(), "mode: nftables\n")
        .expect("a ConfigMap volume");
    let version = |n: u32, body: &str| volume.version(n, body).expect("a ConfigMap version");
    version(1, "clusterCIDR: 10.244.0.0/16\n");
    let input = dir.path().join("c.yaml");
    std::fs::write(&input, service("10.96.0.1", 80)).expect("write");
    let nft = fake_nft(dir.path(), "cat >/dev/null\nexit 0\n");
    let output = dir.path().join("none.yaml");
    let mut running = Kpng::start(
        kpng()
            .arg("--config")
            .arg(volume.file())
            .args(["file", "--input"])
            .arg(&input)
            .args(["--node-name", "n1", "--min-sync-period", "0"])
            .args(["to-local", "nft", "--dry-run", "--nft-binary"])
            .arg(&nft)
            .stdout(Stdio::null()),
    );
    running.wait("the first sync", &output, |_, err| err.contains(" synced"));
    version(2, "clusterCIDR: 10.245.0.0/16\n");
    running.wait("the change said", &output, |_, err| {
        err.contains(" WARN ")
            && err.contains(
                "changed (a start would accept it): this dry run goes on with the configuration \
                 it started with",
            )
    });
    version(3, "conntrack:\n  maxPerCore: -1\n");
    running.wait("the refusal said", &output, |_, err| {
        err.contains("changed but cannot be used")
            && err.contains("field conntrack.maxPerCore: -1 is negative")
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        running.child.try_wait().expect("try_wait").is_none(),
        "the dry run goes on:\n{}",
        running.stderr()
    );
}

/// `--strict-config`: a CI check of a ConfigMap fails (status 1) on what only warns at a
/// start (a field kpng does not know, a setting it ignores); without it, or on a clean
/// file, it passes. And with `--logging-format json` on the line, a refused file is said
/// in JSON, which a log pipeline parsing JSON keeps (it was a plain `kpng: …` line).
#[test]
fn strict_config_fails_on_a_warning_and_a_refused_file_is_said_in_the_log_format() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = |name: &str, body: &str| {
        let path = dir.path().join(name);
        std::fs::write(
            &path,
            format!("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\n{body}"),
        )
        .expect("write");
        path
    };
    let typo = file("typo.conf", "clusterCDIR: 10.244.0.0/16\n");
    let clean = file("clean.conf", "clusterCIDR: 10.244.0.0/16\n");
    for (path, strict, code) in [
        (&typo, true, Some(1)),
        (&typo, false, Some(0)),
        (&clean, true, Some(0)),
    ] {
        let mut cmd = kpng();
        cmd.arg("--config").arg(path);
        if strict {
            cmd.arg("--strict-config");
        }
        let out = cmd
            .args(["--write-config-to", "-", "version"])
            .output()
            .expect("run kpng");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), code, "{path:?} {strict}: {stderr}");
        if code == Some(1) {
            assert!(
                stderr.contains("clusterCDIR") && stderr.contains("--strict-config: 1 warning"),
                "{stderr}"
            );
            assert!(out.stdout.is_empty(), "nothing written");
        }
    }
    let bad = file("bad.conf", "nftables:\n  masqueradeBit: 40\n");
    let out = kpng()
        .args(["--logging-format", "json", "--config"])
        .arg(&bad)
        .args(["--write-config-to", "-"])
        .output()
        .expect("run kpng");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let line: serde_json::Value = serde_json::from_str(stderr.trim())
        .unwrap_or_else(|e| panic!("not one JSON line ({e}): {stderr}"));
    assert!(
        line.to_string()
            .contains("field nftables.masqueradeBit: 40 is not in 0-31"),
        "{line}"
    );
}

/// `--write-config-to` writes kube-proxy's format, which has no field for kpng's own flags nor
/// for a source or sink other than kube-proxy's: each one given is named in a warning saying to
/// keep it on the command line (until 2026-12-07 they were left out in silence, and a kpng
/// started from the file ran without them). Flags the file holds, and the pre-flight check
/// `--write-config-to FILE version`, warn about nothing.
#[test]
fn write_config_to_names_each_kpng_flag_the_file_cannot_hold() {
    let write = |args: &[&str]| {
        let out = kpng()
            .args(["--write-config-to", "-"])
            .args(args)
            .env_remove("KPNG_BPF_PIN_PATH")
            .output()
            .expect("run kpng");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("kind: KubeProxyConfiguration"),
            "{args:?}: the file is written"
        );
        stderr
    };
    let keep = "a kpng flag with no KubeProxyConfiguration field, not in the file: keep it on \
                kpng's command line beside --config";
    let said = write(&[
        "--service-cidr=10.96.0.0/12",
        "--full-sync-period",
        "2h",
        "--master",
        "https://admin:secret@10.0.0.1:6443",
        "--cluster-cidr=10.244.0.0/16",
        "--hostname-override=n1",
        "kube",
        "to-local",
        "ebpf",
        "--bpf-pin-path",
        "/sys/fs/bpf/kpng-test",
        "--socket-lb-host-netns-only",
    ]);
    for flag in [
        "--service-cidr=10.96.0.0/12: ".to_string(),
        "--full-sync-period=2h: ".to_string(),
        "--bpf-pin-path=/sys/fs/bpf/kpng-test (of `kube to-local ebpf`): ".to_string(),
        "--socket-lb-host-netns-only (of `kube to-local ebpf`): ".to_string(),
    ] {
        assert!(
            said.contains(&format!("--write-config-to: {flag}{keep}")),
            "{flag}: {said}"
        );
    }
    assert!(
        said.contains("--master=https://***@10.0.0.1:6443") && !said.contains("secret"),
        "the URL without its credentials: {said}"
    );
    assert!(
        !said.contains("--cluster-cidr") && !said.contains("--hostname-override"),
        "flags the file holds are not named: {said}"
    );
    let said = write(&[
        "--log-level=warn",
        "file",
        "--input",
        "/dev/null",
        "to-file",
        "--output",
        "-",
    ]);
    assert!(
        said.contains("--input=/dev/null (of `file`): ")
            && said.contains("--output=- (of `file to-file`): ")
            && said
                .contains("`file to-file`: the source and sink of this command line have no field")
            && said.contains("--log-level=warn has no logging.verbosity of its own"),
        "{said}"
    );
    for quiet in [
        &[
            "--hostname-override=n1",
            "--cluster-cidr=10.244.0.0/16",
            "-v=4",
        ][..],
        &["--service-cidr=10.96.0.0/12", "version"][..],
        &["--proxy-mode=nftables", "kube", "to-local", "nft"][..],
    ] {
        let said = write(quiet);
        assert!(!said.contains("--write-config-to"), "{quiet:?}: {said}");
    }
}

/// kube-proxy's `bindAddressHardFail` (`--bind-address-hard-fail`), as kube-proxy reads it: a
/// health or metrics server that cannot bind ends kpng when true, whatever the cause (a port
/// held, an address the node lacks), and is tried again every 5 s while kpng runs when false
/// (kube-proxy's default), taking the port once it is free. `/configz` says the value in force.
/// Until 2026-12-07 kpng decided by the cause whatever the value (a held port ended it, a
/// missing address was retried) and `/configz` said `true`.
#[test]
fn bind_address_hard_fail_decides_what_a_server_that_cannot_bind_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("c.yaml");
    std::fs::write(&input, service("10.96.0.1", 80)).expect("write");
    let output = dir.path().join("out.yaml");
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("a port to hold");
    let held_port = held.local_addr().expect("addr").port();
    let free_port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port()
    };
    let run = |healthz: &str, extra: &[&str]| {
        let mut cmd = kpng();
        cmd.args(extra)
            .args(["file", "--input"])
            .arg(&input)
            .args(["--node-name", "n1", "--admin-socket="])
            .arg(format!("--healthz-bind-address={healthz}"))
            .args(["to-file", "--output"])
            .arg(&output);
        cmd
    };
    // true, from the flag or the file: the start fails, naming the setting, whatever the
    // cause (192.0.2.1, TEST-NET-1, is on no node).
    let config = dir.path().join("hard.conf");
    std::fs::write(
        &config,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nbindAddressHardFail: true\n",
    )
    .expect("write");
    let config_arg = format!("--config={}", config.display());
    let held_address = format!("127.0.0.1:{held_port}");
    let missing_address = format!("192.0.2.1:{}", free_port());
    for (healthz, extra) in [
        (
            held_address.as_str(),
            &["--bind-address-hard-fail=true", "--metrics-bind-address="][..],
        ),
        (
            missing_address.as_str(),
            &[config_arg.as_str(), "--metrics-bind-address="][..],
        ),
    ] {
        // Bounded: a kpng that retries instead runs until killed.
        let mut refused = Kpng::start(run(healthz, extra).stdout(Stdio::null()));
        let exit = kpng_testkit::wait_exit(&mut refused.child, Duration::from_secs(10));
        let stderr = refused.stderr();
        assert_eq!(
            exit.and_then(|e| e.code()),
            Some(1),
            "{healthz} {extra:?}: {stderr}"
        );
        assert!(
            stderr.contains(&format!(
                "binding the health server (--healthz-bind-address) to {healthz} \
                 (bindAddressHardFail, --bind-address-hard-fail: a server that cannot bind ends \
                 kpng, as it ends kube-proxy)"
            )),
            "{healthz} {extra:?}: {stderr}"
        );
    }
    // false (the default): kpng runs on, says so, and binds once the port is free.
    let metrics = free_port();
    let mut running = Kpng::start(&mut run(
        &held_address,
        &[&format!("--metrics-bind-address=127.0.0.1:{metrics}")],
    ));
    running.wait(
        "the first sync despite the held port",
        &output,
        |out, err| {
            out.contains("10.96.0.1")
                && err.contains(&format!(
                    "cannot bind the health server (--healthz-bind-address) to {held_address}"
                ))
                && err.contains("another process holds the port")
                && err.contains("trying again every 5s while kpng runs on")
        },
    );
    let configz = http_get(metrics, "/configz")
        .map(|(_, body)| body)
        .unwrap_or_default();
    assert!(
        configz.contains("\"bindAddressHardFail\":false"),
        "/configz says the value in force: {configz}"
    );
    drop(held);
    running.wait(
        "the health server bound once the port is free",
        &output,
        |_, err| {
            err.contains(&format!(
                "serving /healthz and /livez on http://{held_address}"
            ))
        },
    );
    assert_eq!(
        http_get(held_port, "/livez").map(|(code, _)| code),
        Some(200)
    );
}

/// A flag of `kpng cleanup` written beside kube-proxy's `--cleanup`: the usage line shown is
/// `kpng cleanup`'s (where the flag belongs), not the root's with flags the line never gave;
/// `--kpng-only` is accepted there; `--kpng-only` without a cleanup is refused.
#[test]
fn cleanup_flags_beside_dash_dash_cleanup() {
    let out = kpng()
        .args([
            "--cleanup",
            "--dry-run",
            "--after-healthy",
            "127.0.0.1:10256",
        ])
        .output()
        .expect("run kpng");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("hint: --after-healthy is a flag of `kpng cleanup`")
            && stderr.contains("Usage: kpng cleanup")
            && !stderr.contains("--init-only"),
        "{stderr}"
    );
    // Parsed (the cleanup itself runs only as root in a namespace: e2e_migrate).
    let out = kpng()
        .args(["--kpng-only", "version"])
        .output()
        .expect("run kpng");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--kpng-only goes with --cleanup or `kpng cleanup`"),
        "{stderr}"
    );
    // A bad address or duration is a usage error.
    let out = kpng()
        .args(["cleanup", "--after-healthy", "nowhere"])
        .output()
        .expect("run kpng");
    assert_eq!(out.status.code(), Some(2));
    let out = kpng()
        .args([
            "cleanup",
            "--after-healthy",
            "127.0.0.1",
            "--after-synced",
            "127.0.0.1",
        ])
        .output()
        .expect("run kpng");
    assert_eq!(out.status.code(), Some(2), "one of the two");
}
