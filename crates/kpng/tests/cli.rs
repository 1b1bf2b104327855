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
    let precise = "document 2 (line 4), Service ns/web, field spec.ports[0].port: port 99999 is not in 1-65535; keeping the last good state";
    kpng.wait("the broken edit reported", &output, |_, err| {
        err.contains(precise)
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
