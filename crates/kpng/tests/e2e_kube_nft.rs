//! `kpng kube … to-local nft` in a network namespace (root): against the fake API server
//! running in the same namespace, it programs exactly the nftables rules `kpng file` programs
//! for the same objects, and an endpoint change reaches the kernel's tables.

use std::path::Path;
use std::time::{Duration, Instant};

use e2e::harness::FakeServer;
use kpng_testkit::{Netns, Spawned, require_root};

// The fault suite's outage test and the fake API server's driver live in the shared module.
#[allow(unused_macros, unused_imports)]
mod e2e;

const WAIT: Duration = Duration::from_secs(20);

/// Set elements in a stable order: the kernel lists hash sets in hash order, which differs
/// between two tables with the same elements.
fn normalize(listing: &str) -> String {
    let mut out = String::new();
    let mut rest = listing;
    while let Some(start) = rest.find("elements = {") {
        let open = start + "elements = {".len();
        let Some(len) = rest[open..].find('}') else {
            break;
        };
        out.push_str(&rest[..open]);
        let mut elements: Vec<&str> = rest[open..open + len]
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .collect();
        elements.sort_unstable();
        out.push(' ');
        out.push_str(&elements.join(", "));
        out.push_str(" }");
        rest = &rest[open + len + 1..];
    }
    out.push_str(rest);
    out
}

/// The lines only one of two listings has, each side in its order: what a failed comparison
/// needs to show (two whole tables are too long for a CI log).
fn differing_lines(file: &str, kube: &str) -> String {
    let only = |a: &str, b: &str| -> Vec<String> {
        let theirs: std::collections::HashSet<&str> = b.lines().collect();
        a.lines()
            .filter(|l| !theirs.contains(l))
            .map(str::to_owned)
            .collect()
    };
    let (file_only, kube_only) = (only(file, kube), only(kube, file));
    if file_only.is_empty() && kube_only.is_empty() {
        return "the same lines in another order:\n".to_owned() + kube;
    }
    format!(
        "only from file:\n{}\nonly from kube:\n{}",
        file_only.join("\n"),
        kube_only.join("\n")
    )
}

fn tables(ns: &Netns) -> String {
    let mut all = String::new();
    for family in ["ip", "ip6"] {
        let listing = ns
            .run_ok(["nft", "list", "table", family, "kpng"])
            .expect("nft list table");
        all.push_str(&normalize(&listing));
    }
    all
}

/// Runs `kpng <args> to-local nft` in `ns` with the test's node flags.
fn kpng(ns: &Netns, source: &[&str]) -> Spawned {
    let mut args: Vec<&str> = vec![env!("CARGO_BIN_EXE_kpng")];
    args.extend_from_slice(source);
    args.extend([
        "--node-name",
        "node1",
        "--cluster-cidr",
        "10.244.0.0/16,fd00:244::/32",
        "--min-sync-period",
        "0",
        "--metrics-bind-address",
        "",
        // No admin socket: these kpngs are killed, which would leave it in /run/kpng.
        "--admin-socket",
        "",
        "to-local",
        "nft",
    ]);
    ns.spawn(&args).expect("start kpng")
}

/// Waits until `check` holds on the namespace's tables; panics with kpng's log otherwise.
#[track_caller]
fn wait_tables(ns: &Netns, kpng: &Spawned, what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let listing = tables_if_any(ns);
        if check(&listing) {
            return listing;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {WAIT:?}; tables:\n{listing}\nkpng said:\n{}",
            kpng.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn tables_if_any(ns: &Netns) -> String {
    let present = ns
        .run_ok(["nft", "list", "tables"])
        .is_ok_and(|t| has_table(&t, "table ip kpng") && has_table(&t, "table ip6 kpng"));
    if present { tables(ns) } else { String::new() }
}

/// Whether `nft list tables` lists exactly `table` (a line of its own): kpng's anchor table
/// (`kpng-anchor`) shares the prefix of `table ip kpng`.
fn has_table(listing: &str, table: &str) -> bool {
    listing.lines().any(|line| line.trim() == table)
}

#[test]
fn kube_programs_the_same_rules_as_file_and_follows_an_endpoint_change() {
    require_root!();
    let ns = Netns::node("kube").expect("netns");
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster.yaml"),
    )
    .expect("example");
    let manifest = format!(
        "{example}\n---\napiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\n\
         metadata: {{name: kubernetes}}\nspec: {{cidrs: [10.96.0.0/12, \"fd00:96::/108\"]}}\n"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("cluster.yaml");
    std::fs::write(&input, &manifest).expect("write");
    let complete = |t: &str| t.contains("10.96.0.0/12") && t.contains("fd00:96::/108");

    let file = kpng(&ns, &["file", "--input", input.to_str().expect("utf-8")]);
    let from_file = wait_tables(&ns, &file, "kpng file programmed", complete);
    file.kill().expect("stop kpng file");
    ns.nft("delete table ip kpng\ndelete table ip6 kpng\n")
        .expect("remove the tables");

    let kubeconfig = dir.path().join("kubeconfig");
    let mut server = FakeServer::start(&ns, &input, &kubeconfig);
    let kube = kpng(
        &ns,
        &["kube", "--kubeconfig", kubeconfig.to_str().expect("utf-8")],
    );
    assert!(
        from_file.contains("10.244.1.3 . 8080") && from_file.contains("default/web:http"),
        "{from_file}"
    );
    // The kube source may sync before the ServiceCIDR list is in, and each family is its own
    // transaction: the tables are compared once kpng has settled, not at the first listing
    // that has the CIDRs.
    let deadline = Instant::now() + WAIT;
    loop {
        let from_kube = tables_if_any(&ns);
        if from_kube == from_file {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "kube and file must program the same rules; not within {WAIT:?}: {}\n\
             kpng kube said:\n{}",
            differing_lines(&from_file, &from_kube),
            kube.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // An endpoint of `web` moves: the API server's change reaches the kernel.
    let moved = dir.path().join("moved.yaml");
    std::fs::write(&moved, manifest.replace("10.244.1.3", "10.244.1.33")).expect("write");
    server.command(&format!("apply {}", moved.display()));
    // Each EndpointSlice is its own watch event, so a sync may see `web` moved before `cart`
    // (which shares the endpoint): wait for the whole change, the old address gone from both.
    wait_tables(&ns, &kube, "the endpoint change", |t| {
        t.contains("10.244.1.33") && !t.contains("10.244.1.3 ")
    });
}

/// The fake API server serving the example cluster in `ns`, and a `kube` source kpng watching
/// it (started once `prepare` has told the server what to do).
struct OnTheExample {
    dir: tempfile::TempDir,
    server: FakeServer,
    kube: Spawned,
}

fn on_the_example(ns: &Netns, prepare: impl FnOnce(&mut FakeServer)) -> OnTheExample {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("cluster.yaml");
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster.yaml"),
    )
    .expect("example");
    std::fs::write(&input, &example).expect("write");
    let kubeconfig = dir.path().join("kubeconfig");
    let mut server = FakeServer::start(ns, &input, &kubeconfig);
    prepare(&mut server);
    let kube = kpng(
        ns,
        &["kube", "--kubeconfig", kubeconfig.to_str().expect("utf-8")],
    );
    OnTheExample { dir, server, kube }
}

/// A health check this node cannot serve (node1's address is not in the namespace) is
/// reported as kube-proxy reports it: a `Warning FailedToStartServiceHealthcheck` Event on the
/// Service, posted once however many syncs retry it.
#[test]
fn a_health_check_that_cannot_start_is_an_event_on_the_service() {
    require_root!();
    let ns = Netns::node("kubehc").expect("netns");
    let OnTheExample {
        dir,
        mut server,
        kube,
    } = on_the_example(&ns, |_| {});
    let failed = |server: &mut FakeServer| -> Vec<serde_json::Value> {
        let answer = server.command("events");
        let events: Vec<serde_json::Value> =
            serde_json::from_str(answer.trim_start_matches("ok").trim()).expect("events JSON");
        events
            .into_iter()
            .filter(|e| e["reason"] == "FailedToStartServiceHealthcheck")
            .collect()
    };
    let deadline = Instant::now() + WAIT;
    while failed(&mut server).is_empty() {
        assert!(
            Instant::now() < deadline,
            "no FailedToStartServiceHealthcheck Event; kpng said:\n{}",
            kube.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Another change is another sync that retries the check: still one Event.
    let later = dir.path().join("later.yaml");
    std::fs::write(
        &later,
        "apiVersion: v1\nkind: Service\nmetadata: {namespace: default, name: later}\n\
         spec: {clusterIP: 10.96.0.99, clusterIPs: [10.96.0.99], ports: [{name: http, port: 80}]}\n",
    )
    .expect("write");
    server.command(&format!("apply {}", later.display()));
    wait_tables(&ns, &kube, "the later Service", |t| {
        t.contains("10.96.0.99")
    });
    let events = failed(&mut server);
    assert_eq!(events.len(), 1, "{events:#?}");
    let event = &events[0];
    assert_eq!(event["type"], "Warning", "{event}");
    assert_eq!(event["regarding"]["kind"], "Service", "{event}");
    assert_eq!(event["regarding"]["namespace"], "shop", "{event}");
    assert_eq!(event["regarding"]["name"], "storefront", "{event}");
    // storefront is IPv4 only: its check listens on no IPv6 address (one per Service family).
    assert_eq!(
        event["note"],
        "node node1 failed to start healthcheck \"shop/storefront\" on port 32100: \
         192.168.100.1:32100: Cannot assign requested address (os error 99)",
        "{event}"
    );
}

/// Without the RBAC rule for Events every post is refused: kpng says so once per kind of Event
/// at warning level, naming the rule (later refusals are debug lines), and programs the node
/// all the same.
#[test]
fn refused_event_posts_are_one_warning_each() {
    require_root!();
    let ns = Netns::node("kubeev").expect("netns");
    let OnTheExample {
        dir: _dir,
        mut server,
        kube,
    } = on_the_example(&ns, |server| {
        server.command("forbid-events");
    });
    // shop/storefront's health check cannot start (node1's address is not in the namespace).
    let warned = |what: &str| {
        format!(
            "WARN kpng::run: cannot post the {what} Event (RBAC: events.k8s.io events create, patch)"
        )
    };
    let deadline = Instant::now() + WAIT;
    while !(kube.stderr_text().contains(&warned("Starting"))
        && kube
            .stderr_text()
            .contains(&warned("FailedToStartServiceHealthcheck")))
    {
        assert!(
            Instant::now() < deadline,
            "no warning for each refused Event; kpng said:\n{}",
            kube.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    wait_tables(&ns, &kube, "the example's Services", |t| {
        t.contains("10.96.0.10")
    });
    let log = kube.stderr_text();
    assert_eq!(log.matches("cannot post the").count(), 2, "{log}");
    assert!(server.command("events").contains("[]"), "nothing posted");
}

/// The fault suite's API server outage (`e2e/faults.rs`; figures in docs/reliability.md).
#[test]
fn fault_api_server_outage() {
    e2e::faults::api_server_outage(e2e::Backend::Nft);
}
