//! The node's settings seen by a host-firewall admin (root; each test in its own network
//! namespace, the host's settings untouched):
//!
//! - IP forwarding off and bridge netfilter off with a bridge of pods break Services silently:
//!   kpng warns once per condition and `kpng status` shows a `node checks` problem until they
//!   are fixed (sysctls read at start and at every full or periodic sync).
//! - `route_localnet`, which the iptables backend sets: said once at INFO, and a WARN when
//!   kpng finds it reset after it had set it.
//! - Another table's base chain that drops by policy or runs before kpng's, and legacy
//!   iptables' drop policies and drop rules: shown by `kpng status` and noted by `kpng trace`.

use std::path::Path;
use std::time::{Duration, Instant};

use kpng_testkit::{Netns, Spawned, require_root};

const KPNG: &str = env!("CARGO_BIN_EXE_kpng");

fn example() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/cluster.yaml").to_string()
}

/// `kpng file --input examples/cluster.yaml --node-name node1` with a 1 s sync period in `ns`,
/// answering on `admin`, then `backend`.
fn start(ns: &Netns, admin: &Path, backend: &[&str]) -> Spawned {
    let input = example();
    let admin = admin.to_str().expect("utf-8");
    let mut args = vec![
        KPNG,
        "file",
        "--input",
        &input,
        "--node-name",
        "node1",
        "--metrics-bind-address=",
        "--healthz-bind-address=127.0.0.1:0",
        "--admin-socket",
        admin,
        "--sync-period",
        "1s",
        "to-local",
    ];
    args.extend_from_slice(backend);
    ns.spawn(args).expect("kpng")
}

/// `kpng status -o json` and the text status, once the status answers.
fn status(admin: &Path) -> (serde_json::Value, String) {
    let run = |json: bool| {
        let mut cmd = std::process::Command::new(KPNG);
        cmd.arg("status").arg("--admin-socket").arg(admin);
        if json {
            cmd.args(["-o", "json"]);
        }
        cmd.output().expect("kpng status")
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = run(true);
        if out.status.success() {
            let json = serde_json::from_slice(&out.stdout).expect("status JSON");
            let text = String::from_utf8_lossy(&run(false).stdout).into_owned();
            return (json, text);
        }
        assert!(
            Instant::now() < deadline,
            "no status: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The status's data-plane line `what`, if any.
fn line(status: &serde_json::Value, what: &str) -> Option<serde_json::Value> {
    status["dataPlane"]
        .as_array()?
        .iter()
        .find(|d| d["what"] == what)
        .cloned()
}

/// Waits until `cond` holds for the status (the checks run at the syncs, every second).
fn wait_status(
    admin: &Path,
    kpng: &Spawned,
    what: &str,
    cond: impl Fn(&serde_json::Value, &str) -> bool,
) -> (serde_json::Value, String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (json, text) = status(admin);
        if cond(&json, &text) {
            return (json, text);
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {json}\n{text}\nlog:\n{}",
            kpng.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// IP forwarding off (a new namespace's default) and bridge netfilter off in a namespace
/// with a bridge of "pods": until 2026-12-07 kpng said nothing and `kpng status` was fine
/// while every forwarded Service packet was dropped. Now each is warned once and shown as
/// a `node checks` problem, which goes (with an INFO line) once the setting is fixed. A
/// second, Docker-like bridge (ports, an address outside the pod CIDRs, no endpoint) is not
/// named: it cannot lose a Service connection to bridge netfilter.
#[test]
fn forwarding_and_bridge_netfilter_off_are_warned_and_shown() {
    require_root!();
    let ns = Netns::new("hostchk").expect("netns");
    ns.run_ok([
        "sh",
        "-c",
        "ip link add br0 type bridge && ip link add p0 type veth peer name p1 && \
         ip link set p0 master br0 && ip link set br0 up && ip link set p0 up && \
         ip addr add 10.244.1.1/24 dev br0 && \
         ip link add dk0 type bridge && ip link add d0 type veth peer name d1 && \
         ip link set d0 master dk0 && ip link set dk0 up && ip link set d0 up && \
         ip addr add 172.17.0.1/16 dev dk0 && \
         sysctl -qw net.ipv4.ip_forward=0 net.ipv6.conf.all.forwarding=0",
    ])
    .expect("the bridge");
    // br_netfilter's sysctls are per namespace (Linux 5.3 and later) when it is loaded.
    let br_netfilter = ns
        .run_ok(["sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=0"])
        .is_ok();
    let dir = tempfile::tempdir().expect("tempdir");
    let admin = dir.path().join("admin.sock");
    let kpng = start(&ns, &admin, &["nft"]);
    let bridge = if br_netfilter {
        "net.bridge.bridge-nf-call-iptables is 0 and the node bridges pods (br0): "
    } else {
        "the br_netfilter module is not loaded and the node bridges pods (br0): "
    };
    let (json, text) = wait_status(&admin, &kpng, "the node checks", |json, _| {
        line(json, "node checks").is_some_and(|l| l["problem"].is_string())
    });
    let checks = line(&json, "node checks").expect("node checks");
    let problem = checks["problem"].as_str().expect("a problem");
    for want in [
        "net.ipv4.ip_forward is 0: the node forwards no IPv4 packet",
        "net.ipv6.conf.all.forwarding is 0: the node forwards no IPv6 packet",
        bridge,
    ] {
        assert!(problem.contains(want), "{want:?} not in {problem}");
    }
    // dk0, a Docker-like bridge whose containers are no endpoint and outside the pod CIDRs,
    // is no pod bridge: not named (it used to be, as "(br0, dk0)").
    assert!(!problem.contains("dk0"), "{problem}");
    if br_netfilter {
        let state = checks["state"].as_str().unwrap_or_default();
        assert!(
            state.contains("bridges of pods: br0; other bridges with ports: dk0"),
            "{state}"
        );
    }
    assert!(
        text.contains("node checks: net.ipv4.ip_forward 0")
            && text.contains("; PROBLEM: net.ipv4.ip_forward is 0"),
        "{text}"
    );
    // Warned once each, whatever the syncs since.
    std::thread::sleep(Duration::from_millis(2500));
    let log = kpng.stderr_text();
    for want in [
        "node check: net.ipv4.ip_forward is 0",
        "node check: net.ipv6.conf.all.forwarding is 0",
    ] {
        assert_eq!(log.matches(want).count(), 1, "{want}:\n{log}");
    }
    // Fixed: gone from the status at a later sync, and said.
    ns.run_ok(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        .expect("forwarding on");
    wait_status(&admin, &kpng, "IPv4 forwarding fixed", |json, _| {
        line(json, "node checks").is_some_and(|l| {
            !l["problem"]
                .as_str()
                .unwrap_or_default()
                .contains("net.ipv4.ip_forward")
        })
    });
    assert!(
        kpng.stderr_text()
            .contains("node check: fixed now (forwarding IPv4)"),
        "{}",
        kpng.stderr_text()
    );
}

/// A host firewall's table with a forward chain whose policy drops, a prerouting chain
/// before kpng's, and a multi-tenant CNI's drops in chains after kpng's with policy accept (an
/// `inet` table's input chain at priority 10, an iptables-nft `cali-INPUT` chain): `kpng
/// status` lists them all (the drop policy as a problem) and `kpng trace` notes them, a drop
/// rule as "may drop this". Until 2026-12-07 the chains after kpng's that drop by rule were
/// never listed, and a trace to the health-check node port said "no node port here".
#[test]
fn another_tables_drop_policy_is_shown_by_status_and_trace() {
    require_root!();
    let ns = Netns::node("fwchains").expect("netns");
    ns.run_with_stdin(
        ["nft", "-f", "-"],
        "table inet hostfw {\n\
           chain forward { type filter hook forward priority 0; policy drop; }\n\
           chain early { type filter hook prerouting priority -300; policy accept; }\n\
           chain late { type filter hook input priority 10; policy accept; }\n\
           chain quiet { type filter hook output priority 10; policy accept; ct state established accept; }\n\
         }\n\
         table inet tenantpolicy {\n\
           chain input { type filter hook input priority 0; policy accept;\n\
             tcp dport { 32100, 30000-32767 } drop comment \"tenant a\"; }\n\
         }\n",
    )
    .expect("the host firewall");
    ns.run_ok([
        "sh",
        "-c",
        "iptables-nft -N cali-INPUT && iptables-nft -A INPUT -j cali-INPUT && \
         iptables-nft -A cali-INPUT -p tcp --dport 32100 -j DROP",
    ])
    .expect("the CNI's iptables-nft chain");
    let dir = tempfile::tempdir().expect("tempdir");
    let admin = dir.path().join("admin.sock");
    let kpng = start(&ns, &admin, &["nft"]);
    // Once kpng's table is there (before its first sync only the anchor's chains are).
    let (json, text) = wait_status(&admin, &kpng, "the other tables' chains", |json, _| {
        line(json, "other tables' chains").is_some_and(|l| {
            l["problem"].is_string()
                && l["state"]
                    .as_str()
                    .is_some_and(|s| s.contains("hostfw early: hook prerouting, type filter, priority -300, policy accept (before kpng's"))
        })
    });
    let chains = line(&json, "other tables' chains").expect("the line");
    let state = chains["state"].as_str().unwrap_or_default();
    for want in [
        "inet hostfw forward: hook forward, type filter, priority 0, policy drop",
        "inet hostfw early: hook prerouting, type filter, priority -300, policy accept (before \
         kpng's, priority ",
        "inet tenantpolicy input: hook input, type filter, priority 0, policy accept (",
        "inet tenantpolicy input: rule handle ",
        " \"tenant a\" matching on ",
        "ip filter INPUT: hook input, type filter, priority 0, policy accept",
        "ip filter INPUT → cali-INPUT: rule handle ",
    ] {
        assert!(state.contains(want), "{want}:\n{state}");
    }
    // An accepting chain after kpng's without drop rules is not listed.
    assert!(
        !state.contains("hostfw late") && !state.contains("hostfw quiet"),
        "{state}"
    );
    assert!(
        text.contains("PROBLEM: another table drops by policy what its rules do not accept")
            && text.contains("inet hostfw forward: hook forward"),
        "{text}"
    );
    let trace = |from: &str, to: &str| {
        let out = std::process::Command::new(KPNG)
            .args(["trace", "--from", from, "--to", to, "--admin-socket"])
            .arg(&admin)
            .output()
            .expect("kpng trace");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let to_service = trace("10.244.1.5", "10.96.0.10:80");
    assert!(
        to_service.contains("note:       this follows kpng's rules only; other tables' chains")
            && to_service.contains(
                "inet hostfw forward: hook forward, type filter, priority 0, \
                               policy drop"
            ),
        "{to_service}"
    );
    // The health-check node port: named as such, and the tenant's drop rule may drop it.
    let to_check = trace("203.0.113.1", "192.168.100.1:32100");
    assert!(
        to_check.contains("32100/TCP is the health-check node port of shop/storefront")
            && to_check.contains(
                "a rule in table inet tenantpolicy chain input may drop this: inet tenantpolicy \
                 input: rule handle "
            )
            && to_check.contains("a rule in table ip filter chain cali-INPUT may drop this"),
        "{to_check}"
    );
    // The namespace is set up as a node's (Netns::node: forwarding on): no node check warns,
    // where a bare namespace's log used to carry the forwarding warnings as noise.
    let log = kpng.stderr_text();
    assert!(!log.contains("node check:"), "{log}");
    drop(kpng);
}

/// Legacy iptables (x_tables) is not nf_tables: the chain dump behind the "other tables'
/// chains" never saw a legacy `-P FORWARD DROP` (Docker on a legacy host) or a legacy
/// `INPUT` drop, and status said nothing of them. Now both are listed (the policy as a
/// problem) and `kpng trace` notes them. Skipped, saying why, without `iptables-legacy`
/// (never in CI, where test.sh installs it).
#[test]
fn legacy_iptables_drops_are_shown_by_status_and_trace() {
    require_root!();
    let have = std::process::Command::new("iptables-legacy")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false");
        assert!(
            !ci,
            "iptables-legacy is not installed, and CI is set: refusing to skip"
        );
        eprintln!(
            "SKIPPED legacy_iptables_drops_are_shown_by_status_and_trace: iptables-legacy not installed"
        );
        return;
    }
    let ns = Netns::node("fwlegacy").expect("netns");
    ns.run_ok([
        "sh",
        "-c",
        "iptables-legacy -P FORWARD DROP && \
         iptables-legacy -A INPUT -p tcp --dport 30080 -j DROP",
    ])
    .expect("the legacy rules");
    let dir = tempfile::tempdir().expect("tempdir");
    let admin = dir.path().join("admin.sock");
    let kpng = start(&ns, &admin, &["nft"]);
    let (json, text) = wait_status(&admin, &kpng, "the legacy drops", |json, _| {
        line(json, "other tables' chains").is_some_and(|l| l["problem"].is_string())
    });
    let chains = line(&json, "other tables' chains").expect("the line");
    let state = chains["state"].as_str().unwrap_or_default();
    assert!(
        state.contains("iptables-legacy filter FORWARD: policy DROP")
            && state.contains(
                "iptables-legacy filter INPUT: -A INPUT -p tcp -m tcp --dport 30080 -j DROP"
            ),
        "{state}"
    );
    assert!(
        text.contains("PROBLEM: another table drops by policy what its rules do not accept")
            && text.contains("iptables-legacy filter FORWARD: policy DROP"),
        "{text}"
    );
    let trace = std::process::Command::new(KPNG)
        .args([
            "trace",
            "--from",
            "192.0.2.9",
            "--to",
            "10.96.0.10:80",
            "--admin-socket",
        ])
        .arg(&admin)
        .output()
        .expect("kpng trace");
    let trace = String::from_utf8_lossy(&trace.stdout);
    assert!(
        trace.contains("iptables-legacy filter FORWARD: policy DROP")
            && trace.contains("iptables-legacy filter INPUT: -A INPUT"),
        "{trace}"
    );
    drop(kpng);
}

/// The iptables backend sets `net.ipv4.conf.all.route_localnet` (IPv4 node ports on
/// 127.0.0.1) and used to do it in silence, again after an admin reset it: it now says so
/// once at INFO, naming the flag that avoids it, and warns when it finds it reset.
#[test]
fn route_localnet_set_is_said_once_and_a_reset_warned() {
    require_root!();
    let ns = Netns::node("rlnote").expect("netns");
    let sysctl = "net.ipv4.conf.all.route_localnet";
    ns.run_ok(["sysctl", "-qw", &format!("{sysctl}=0")])
        .expect("route_localnet=0");
    let dir = tempfile::tempdir().expect("tempdir");
    let admin = dir.path().join("admin.sock");
    let mut kpng = start(
        &ns,
        &admin,
        &[
            "iptables",
            "--iptables-mode",
            "nft",
            "--full-sync-period",
            "1s",
        ],
    );
    let set = "set net.ipv4.conf.all.route_localnet=1 (it was 0)";
    let reset = "net.ipv4.conf.all.route_localnet was reset to 0 after kpng had set it to 1";
    let wait_log = |kpng: &Spawned, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !kpng.stderr_text().contains(what) {
            assert!(
                Instant::now() < deadline,
                "{what:?} not logged:\n{}",
                kpng.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_log(&kpng, set);
    let log = kpng.stderr_text();
    let said = log.lines().find(|l| l.contains(set)).unwrap_or_default();
    assert!(
        said.contains("INFO")
            && said.contains("--iptables-localhost-nodeports=false")
            && said.contains("kubernetes#90259"),
        "{said}"
    );
    // Full syncs (every second here) find it 1: nothing more is said.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(kpng.stderr_text().matches(set).count(), 1);
    // An admin resets it: the next full sync sets it again and warns.
    ns.run_ok(["sysctl", "-qw", &format!("{sysctl}=0")])
        .expect("reset");
    wait_log(&kpng, reset);
    let log = kpng.stderr_text();
    let warned = log.lines().find(|l| l.contains(reset)).unwrap_or_default();
    assert!(
        warned.contains("WARN") && warned.contains("--iptables-localhost-nodeports=false"),
        "{warned}"
    );
    assert_eq!(log.matches(set).count(), 1, "INFO once:\n{log}");
    let _ = kpng.try_wait();
    drop(kpng);
    // Put it back and forget the record (/run/kpng), as an operator leaving would.
    cleanup(&ns);
}

/// Runs `kpng cleanup` in `ns` and checks it succeeded: what kpng changed in the namespace's
/// settings is put back and its record (/run/kpng) goes, as an operator leaving would.
fn cleanup(ns: &Netns) {
    let out = ns.exec([KPNG, "cleanup"]).expect("kpng cleanup");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// kpng in iptables mode with `--iptables-localhost-nodeports` (the default) where
/// `net.ipv4.conf.all.route_localnet` cannot be set (a read-only `/proc/sys`, as in a container
/// that is not privileged; here a read-only bind mount in a mount namespace of kpng's own):
/// the backend serves node ports without 127.0.0.1, and until 2026-12-07 `kpng status`'s
/// "node ports on:" and `kpng trace` to 127.0.0.1 still said 127.0.0.1 was served. Both now
/// say it is not, and why.
#[test]
fn a_route_localnet_that_cannot_be_set_is_said_by_status_and_trace() {
    require_root!();
    let ns = Netns::node("rlro").expect("netns");
    ns.run_ok(["sysctl", "-qw", "net.ipv4.conf.all.route_localnet=0"])
        .expect("route_localnet=0");
    let dir = tempfile::tempdir().expect("tempdir");
    let admin = dir.path().join("admin.sock");
    let input = example();
    let admin_arg = admin.to_str().expect("utf-8");
    let kpng = ns
        .spawn([
            "unshare",
            "--mount",
            "sh",
            "-c",
            "mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && \
             exec \"$@\"",
            "sh",
            KPNG,
            "file",
            "--input",
            &input,
            "--node-name",
            "node1",
            "--metrics-bind-address=",
            "--healthz-bind-address=127.0.0.1:0",
            "--admin-socket",
            admin_arg,
            "to-local",
            "iptables",
            "--iptables-mode",
            "nft",
        ])
        .expect("kpng");
    let (_, text) = wait_status(&admin, &kpng, "node ports without 127.0.0.1", |_, text| {
        text.contains("not 127.0.0.1")
    });
    let on = text
        .lines()
        .find(|l| l.starts_with("node ports on: "))
        .unwrap_or_default();
    assert!(
        !on.contains(" and 127.0.0.1 (--iptables-localhost-nodeports)")
            && on.contains(
                "; not 127.0.0.1, although --iptables-localhost-nodeports asks for it: \
                 net.ipv4.conf.all.route_localnet cannot be set: "
            ),
        "{on}\n{}",
        kpng.stderr_text()
    );
    let out = std::process::Command::new(KPNG)
        .args(["trace", "--from", "127.0.0.1", "--to", "127.0.0.1:30443"])
        .arg("--admin-socket")
        .arg(&admin)
        .output()
        .expect("kpng trace");
    let trace = String::from_utf8_lossy(&out.stdout);
    assert!(
        trace.contains(
            "node ports on 127.0.0.1 are not served although --iptables-localhost-nodeports \
             asks for them (net.ipv4.conf.all.route_localnet cannot be set: "
        ),
        "{trace}"
    );
    drop(kpng);
    // The record kpng may have made (/run/kpng) goes, as an operator leaving would.
    cleanup(&ns);
}

/// kube-proxy's line (`--config` alone choosing the nftables backend) in its own network
/// namespace, its file updated as a ConfigMap mount is (the kubelet's swap of `..data`): a
/// content kpng cannot use is refused while it runs on, shown by `kpng status` as a
/// `--config` problem; a valid one ends kpng with status 1 (as kube-proxy) and leaves its
/// rules in place for the restart to adopt. Until 2026-12-07 kpng ignored the change.
#[test]
fn a_changed_config_file_is_refused_or_ends_kpng_leaving_its_rules() {
    require_root!();
    let ns = Netns::new("cfgwatch").expect("netns");
    let dir = tempfile::tempdir().expect("tempdir");
    let volume = kpng_testkit::ProxyConfigMount::new(
        dir.path(),
        "mode: nftables\nhostnameOverride: node1\nmetricsBindAddress: \"\"\n\
         healthzBindAddress: 127.0.0.1:10256\nconntrack:\n  maxPerCore: 0\n",
    )
    .expect("a ConfigMap volume");
    let version = |n: u32, body: &str| volume.version(n, body).expect("a ConfigMap version");
    version(1, "clusterCIDR: 10.244.0.0/16\n");
    let config = volume.file();
    let admin = dir.path().join("admin.sock");
    // kube-proxy's line reads the API server; this one reads the example cluster instead
    // (`file … to-local nft`), the same proxy loop.
    let input = example();
    let mut kpng = ns
        .spawn([
            KPNG,
            "--config",
            config.to_str().expect("utf-8"),
            "--metrics-bind-address=",
            "--admin-socket",
            admin.to_str().expect("utf-8"),
            "file",
            "--input",
            &input,
            "to-local",
            "nft",
        ])
        .expect("kpng");
    wait_status(&admin, &kpng, "the first sync", |json, _| {
        json["lastSuccessfulSync"].is_string()
    });
    version(
        2,
        "clusterCIDR: 10.244.0.0/16\nnftables:\n  masqueradeBit: 40\n",
    );
    let (json, text) = wait_status(&admin, &kpng, "the refusal", |json, _| {
        line(json, "--config").is_some_and(|l| l["problem"].is_string())
    });
    let problem = line(&json, "--config").expect("--config")["problem"].clone();
    assert!(
        problem
            .as_str()
            .is_some_and(|p| p.contains("field nftables.masqueradeBit: 40 is not in 0-31")),
        "{problem}"
    );
    assert!(text.contains("(changed, refused); PROBLEM: "), "{text}");
    assert!(
        kpng.stderr_text().contains(" ERROR ")
            && kpng.stderr_text().contains("changed but cannot be used"),
        "{}",
        kpng.stderr_text()
    );
    version(3, "clusterCIDR: 10.245.0.0/16\n");
    let exit = kpng
        .wait_exit(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("kpng did not end:\n{}", kpng.stderr_text()));
    let log = kpng.stderr_text();
    assert_eq!(exit.code(), Some(1), "{log}");
    assert!(
        log.contains("changed: ending so that the restart applies it"),
        "{log}"
    );
    // The rules stay for the restart to adopt.
    let tables = ns.nft("list tables").expect("nft");
    assert!(tables.contains("kpng"), "{tables}");
}
