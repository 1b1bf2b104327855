//! The status page in a real browser: headless Chromium loads `/status` from a running kpng,
//! runs its JavaScript, and the DOM it leaves must hold the Services table (filtered), the
//! endpoints' states with reasons, the sync history and a trace.
//!
//! Needs `chromium` (Debian's package; `scripts/test.sh` installs it). Without it the test
//! says why it skips, and fails under `CI=true`.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| {
            Command::new(b)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The DOM after the page's scripts ran (Chromium's `--dump-dom`).
fn dom(browser: &str, url: &str) -> String {
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--virtual-time-budget=10000",
            "--dump-dom",
            url,
        ])
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_status_page_shows_services_endpoints_syncs_and_a_trace_in_a_browser() {
    let Some(browser) = chromium() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI: chromium is missing (scripts/test.sh installs it)"
        );
        eprintln!("SKIPPED: no chromium to load the status page (apt-get install chromium)");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("cluster.yaml");
    let example = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster.yaml"),
    )
    .expect("example");
    std::fs::write(&input, example).expect("write");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kpng"))
        .env_remove("RUST_LOG")
        .args(["file", "--input"])
        .arg(&input)
        .args([
            "--node-name",
            "node1",
            "--cluster-cidr",
            "10.244.0.0/16",
            "--metrics-bind-address",
            "127.0.0.1:0",
            "--healthz-bind-address",
            "127.0.0.1:0",
            "--admin-socket",
            "",
            "to-file",
            "--output",
        ])
        .arg(dir.path().join("out.yaml"))
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kpng");
    let mut stderr = child.stderr.take().expect("stderr");
    let kpng = Running(child);
    let mut log = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let addr = loop {
        let mut chunk = [0u8; 4096];
        let n = stderr.read(&mut chunk).expect("read kpng's log");
        assert!(n > 0, "kpng exited:\n{log}");
        log.push_str(&String::from_utf8_lossy(&chunk[..n]));
        if log.contains(" synced ")
            && let Some(addr) = log.lines().find_map(|l| {
                l.split_once("serving /metrics on http://")
                    .map(|(_, a)| a.trim())
            })
        {
            break addr.to_string();
        }
        assert!(Instant::now() < deadline, "kpng did not sync:\n{log}");
    };

    let page = dom(
        browser,
        &format!("http://{addr}/status?filter=zonal&from=10.244.1.9&to=10.96.0.40:80"),
    );
    let services = page
        .split("<table id=\"services\">")
        .nth(1)
        .and_then(|t| t.split("</table>").next())
        .expect("the Services table");
    assert!(services.contains("default/zonal"), "{services}");
    assert!(
        !services.contains("default/web"),
        "the filter keeps only zonal: {services}"
    );
    assert!(
        services.contains("10.244.2.2:8080 ready remote unused: topology: hinted for zone zone-b"),
        "{services}"
    );
    assert!(page.contains("node node1 · backend file"), "{page}");
    let syncs = page
        .split("<table id=\"syncs\">")
        .nth(1)
        .and_then(|t| t.split("</table>").next())
        .expect("the sync history");
    assert!(
        syncs.contains("full") && syncs.contains("Service ports: "),
        "{syncs}"
    );
    assert!(page.contains("data-verdict=\"dnat\""), "{page}");
    assert!(
        page.contains("service: default/zonal:http (via clusterIP)"),
        "{page}"
    );
    assert!(
        page.contains("endpoints: cluster list: 10.244.1.2:8080"),
        "{page}"
    );

    // A rejected trace reads as such.
    let page = dom(
        browser,
        &format!("http://{addr}/status?from=10.244.1.9&to=10.96.0.60:80"),
    );
    assert!(page.contains("data-verdict=\"reject\""), "{page}");
    assert!(page.contains("the Service has no endpoints"), "{page}");
    drop(kpng);
}
