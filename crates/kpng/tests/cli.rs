//! The binary end to end: `kpng file … to-file` follows edits of its input and survives broken ones.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Kpng(Child);

impl Drop for Kpng {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn service(ip: &str, port: u32) -> String {
    format!(
        "kind: Node\nmetadata: {{name: n1}}\n---\nkind: Service\nmetadata: {{namespace: ns, name: web}}\nspec: {{clusterIP: {ip}, ports: [{{name: http, port: {port}}}]}}\n"
    )
}

fn wait_for(path: &std::path::Path, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) || Instant::now() > deadline {
            return text;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn follows_edits_and_keeps_the_last_good_output_on_a_broken_edit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("cluster.yaml");
    // Output elsewhere: its own rewrites must not count as changes of the input directory.
    let out_dir = tempfile::tempdir().expect("tempdir");
    let output = out_dir.path().join("out.yaml");
    std::fs::write(&input, service("10.96.0.1", 80)).expect("write");
    let child = Command::new(env!("CARGO_BIN_EXE_kpng"))
        .args(["file", "--input"])
        .arg(&input)
        .args([
            "--node-name",
            "n1",
            "--healthz-bind-address",
            "127.0.0.1:0",
            "--metrics-bind-address",
            "",
        ])
        .args(["--min-sync-period", "0", "to-file", "--output"])
        .arg(&output)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kpng");
    let mut kpng = Kpng(child);

    assert!(
        wait_for(&output, "10.96.0.1").contains("10.96.0.1"),
        "first output"
    );

    std::fs::write(&input, service("10.96.0.2", 80)).expect("write");
    if !wait_for(&output, "10.96.0.2").contains("10.96.0.2") {
        let _ = kpng.0.kill();
        let mut stderr = String::new();
        let _ = kpng
            .0
            .stderr
            .take()
            .map(|mut e| e.read_to_string(&mut stderr));
        panic!("edit not applied; kpng said:\n{stderr}");
    }
    // How fast is the benchmark's business (kpng-bench: ≈2 ms from rename to commit).

    std::fs::write(&input, service("10.96.0.3", 99999)).expect("write");
    std::thread::sleep(Duration::from_millis(700));
    let after_broken = std::fs::read_to_string(&output).expect("read");
    assert!(
        after_broken.contains("10.96.0.2"),
        "broken edit must keep the last good output:\n{after_broken}"
    );

    let _ = kpng.0.kill();
    let _ = kpng.0.wait();
    let mut stderr = String::new();
    kpng.0
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    assert!(
        stderr.contains("document 2 (line 4), Service ns/web, field spec.ports[0].port: port 99999 is not in 1-65535"),
        "precise error expected in:\n{stderr}"
    );
}

#[test]
fn config_file_and_flags_make_the_written_configuration() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/testdata/kube-proxy/kubeadm-v1.33.conf"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_kpng"))
        .args(["--config", fixture, "--write-config-to", "-", "version"])
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
    assert!(
        stderr.contains("INFO kpng: --config: mode is empty"),
        "{stderr}"
    );
    assert!(!stderr.contains("WARN"), "{stderr}");
    for line in [
        "clusterCIDR: 10.244.0.0/16",
        "  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf",
        "mode: nftables",
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
