//! `deploy/` is what an administrator applies: every document must be a valid Kubernetes object
//! (read into the k8s-openapi type without losing a field), the RBAC rules exactly what kpng
//! watches, the DaemonSet consistent with the ConfigMap, and the ConfigMap's configuration must
//! load with `kpng --config` without a warning.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every document of every `deploy/*.yaml`, with the file it came from.
fn documents() -> Vec<(String, Value)> {
    documents_in("")
}

/// Reads a document into its typed object and checks that writing it back gives the same
/// document: a misspelt or misplaced field would be dropped by the typed read.
fn typed<T: DeserializeOwned + Serialize>(file: &str, doc: &Value) -> T {
    let object: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{file}: {} is not a valid object: {e}", doc["kind"]));
    let back = serde_json::to_value(&object).unwrap();
    if let Some(path) = difference(doc, &back, String::new()) {
        panic!(
            "{file}: {} field {path} is not what its type reads",
            doc["kind"]
        );
    }
    object
}

/// The first path where two documents differ, e.g. `spec.template.spec.hostNetwrok`.
fn difference(a: &Value, b: &Value, path: String) -> Option<String> {
    let at = |key: &str| {
        if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        }
    };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            x.keys()
                .chain(y.keys())
                .find_map(|k| match (x.get(k), y.get(k)) {
                    (Some(v), Some(w)) => difference(v, w, at(k)),
                    _ => Some(at(k)),
                })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (v, w))| difference(v, w, format!("{path}[{i}]"))),
        _ => (a != b).then_some(path),
    }
}

struct Deploy {
    service_account: ServiceAccount,
    role: ClusterRole,
    binding: ClusterRoleBinding,
    config_map: ConfigMap,
    daemon_set: DaemonSet,
}

fn deploy() -> Deploy {
    let (mut sa, mut role, mut binding, mut cm, mut ds) = (None, None, None, None, None);
    for (file, doc) in documents() {
        match doc["kind"].as_str().unwrap_or_default() {
            "ServiceAccount" => sa = Some(typed(&file, &doc)),
            "ClusterRole" => role = Some(typed(&file, &doc)),
            "ClusterRoleBinding" => binding = Some(typed(&file, &doc)),
            "ConfigMap" => cm = Some(typed(&file, &doc)),
            "DaemonSet" => ds = Some(typed(&file, &doc)),
            other => panic!("{file}: unexpected kind {other:?}"),
        }
    }
    Deploy {
        service_account: sa.expect("a ServiceAccount"),
        role: role.expect("a ClusterRole"),
        binding: binding.expect("a ClusterRoleBinding"),
        config_map: cm.expect("a ConfigMap"),
        daemon_set: ds.expect("a DaemonSet"),
    }
}

#[test]
fn rbac_grants_exactly_what_the_kube_source_watches_and_its_events() {
    let d = deploy();
    let grants = grants(&d.role);
    let want: BTreeMap<String, Vec<String>> = [
        ("/services", vec!["list", "watch"]),
        ("/nodes", vec!["get", "list", "watch"]),
        ("discovery.k8s.io/endpointslices", vec!["list", "watch"]),
        ("networking.k8s.io/servicecidrs", vec!["list", "watch"]),
        ("events.k8s.io/events", vec!["create", "patch"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(grants, want);

    let sa = &d.service_account.metadata;
    assert_eq!(d.binding.role_ref.kind, "ClusterRole");
    assert_eq!(
        Some(&d.binding.role_ref.name),
        d.role.metadata.name.as_ref()
    );
    let subjects = d.binding.subjects.unwrap();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].kind, "ServiceAccount");
    assert_eq!(Some(&subjects[0].name), sa.name.as_ref());
    assert_eq!(subjects[0].namespace, sa.namespace);
    let pod = d.daemon_set.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.service_account_name, sa.name);
}

#[test]
fn daemon_set_runs_like_kube_proxy() {
    let d = deploy();
    let ds = d.daemon_set;
    // system-node-critical is admitted only in kube-system.
    assert_eq!(ds.metadata.namespace.as_deref(), Some("kube-system"));
    assert_eq!(
        d.config_map.metadata.namespace.as_deref(),
        Some("kube-system")
    );
    assert_eq!(
        d.service_account.metadata.namespace.as_deref(),
        Some("kube-system")
    );
    let spec = ds.spec.unwrap();
    assert_eq!(
        spec.selector.match_labels,
        spec.template.metadata.as_ref().unwrap().labels
    );
    let pod = spec.template.spec.unwrap();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    let tolerations = pod.tolerations.unwrap();
    assert!(
        tolerations
            .iter()
            .any(|t| t.operator.as_deref() == Some("Exists")
                && t.key.is_none()
                && t.effect.is_none()),
        "tolerates every taint: {tolerations:?}"
    );
    assert_eq!(
        pod.node_selector
            .unwrap()
            .get("kubernetes.io/os")
            .map(String::as_str),
        Some("linux")
    );
    assert_eq!(pod.containers.len(), 1);
    let c = &pod.containers[0];
    assert_eq!(
        c.security_context.as_ref().unwrap().privileged,
        Some(true),
        "nftables and conntrack sysctls on the host"
    );
    let env = c.env.as_ref().unwrap();
    let node_name = env.iter().find(|e| e.name == "NODE_NAME").unwrap();
    assert_eq!(
        node_name
            .value_from
            .as_ref()
            .unwrap()
            .field_ref
            .as_ref()
            .unwrap()
            .field_path,
        "spec.nodeName"
    );
    let args = c.args.as_ref().unwrap();
    assert!(
        args.contains(&"--hostname-override=$(NODE_NAME)".to_string()),
        "{args:?}"
    );
    let probe = c
        .liveness_probe
        .as_ref()
        .unwrap()
        .http_get
        .as_ref()
        .unwrap();
    assert_eq!(probe.path.as_deref(), Some("/livez"));
    let probe_port = match &probe.port {
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(p) => *p,
        other => panic!("probe port {other:?}"),
    };

    // The configuration file the args name is a key of the mounted ConfigMap, and the
    // kubeconfig it names is another.
    let config_arg = args
        .iter()
        .find_map(|a| a.strip_prefix("--config="))
        .expect("--config=PATH");
    let (dir, key) = config_arg.rsplit_once('/').unwrap();
    let mount = c
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.mount_path == dir)
        .unwrap_or_else(|| panic!("nothing mounted at {dir}"));
    let volume = pod
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == mount.name)
        .unwrap();
    assert_eq!(
        volume.config_map.as_ref().unwrap().name,
        d.config_map.metadata.name.clone().unwrap()
    );
    let data = d.config_map.data.unwrap();
    let config: Value = serde_saphyr::from_str(&data[key]).unwrap();
    let kubeconfig_path = config["clientConnection"]["kubeconfig"].as_str().unwrap();
    let (kdir, kkey) = kubeconfig_path.rsplit_once('/').unwrap();
    assert_eq!(kdir, dir, "the kubeconfig is in the same ConfigMap");
    let kubeconfig: Value = serde_saphyr::from_str(&data[kkey]).unwrap();
    let cluster = &kubeconfig["clusters"][0]["cluster"];
    assert!(cluster["server"].as_str().unwrap().starts_with("https://"));
    assert_eq!(
        cluster["certificate-authority"],
        "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    );
    assert_eq!(
        kubeconfig["users"][0]["user"]["tokenFile"],
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    );
    // The probe's port is the health server's.
    let healthz = config["healthzBindAddress"].as_str().unwrap();
    assert!(
        healthz.ends_with(&format!(":{probe_port}")),
        "{healthz} vs probe {probe_port}"
    );
}

/// A binary quantity (`128Mi`, `1Gi`) in MiB.
fn mebibytes(q: &str) -> u64 {
    let (n, unit) = q.split_at(q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len()));
    let n: u64 = n.parse().unwrap_or_else(|_| panic!("quantity {q:?}"));
    match unit {
        "Mi" => n,
        "Gi" => n * 1024,
        other => panic!("quantity {q:?}: unit {other:?} (write Mi or Gi)"),
    }
}

/// What a planner reads in docs/deploy.md ("Sizing"): the requests hold the measured peak of a
/// typical cluster, the memory a 64 MiB request did not (an nftables node of 30k Services was
/// OOM-killed in 64 MiB while parsing; eBPF's maps alone are 69 MiB); no limit, a CPU quota
/// least of all (a 100m one stretched a restart of 30k Services to 80 s); and a startup probe,
/// so that a long first sync is not killed by the liveness probe.
#[test]
fn daemon_set_requests_what_a_typical_cluster_needs_and_limits_nothing() {
    let pod = deploy().daemon_set.spec.unwrap().template.spec.unwrap();
    let c = &pod.containers[0];
    let resources = c.resources.as_ref().expect("resources");
    assert_eq!(resources.limits, None, "no limits (docs/deploy.md, Sizing)");
    let requests = resources.requests.as_ref().expect("requests");
    assert!(requests.contains_key("cpu"), "{requests:?}");
    let memory = mebibytes(&requests["memory"].0);
    // docs/deploy.md: nftables ≈ 11 MiB + 5 MiB per 1,000 Services (4 endpoints each), +5%
    // after a restart; ebpf ≈ that + 70–85 MiB. A typical cluster: 10k Services (nftables,
    // the ConfigMap's mode), 5k with ebpf.
    let nft = |services: u64| (11 + 5 * services / 1000) * 105 / 100;
    assert!(memory >= nft(10_000), "{memory} MiB < nftables at 10k");
    assert!(memory >= nft(5_000) + 85, "{memory} MiB < ebpf at 5k");
    // Liveness waits for the first sync: the startup probe is /readyz (200 once this run's
    // first sync has programmed the node; /healthz is 200 from the start, as kube-proxy's) on
    // the health server, with minutes of budget.
    let startup = c.startup_probe.as_ref().expect("a startupProbe");
    let get = startup.http_get.as_ref().unwrap();
    assert_eq!(get.path.as_deref(), Some("/readyz"));
    let liveness = c.liveness_probe.as_ref().unwrap();
    assert_eq!(get.port, liveness.http_get.as_ref().unwrap().port);
    let budget = startup.period_seconds.unwrap_or(10) * startup.failure_threshold.unwrap_or(3);
    assert!(budget >= 300, "startup budget {budget}s");
}

/// Every node DaemonSet's startup probe asks `/readyz`: `/healthz` answers 200 before the
/// first sync (as kube-proxy's), so until 2026-12-07 the probe passed within seconds and a long
/// first sync was guarded by `/livez` alone.
#[test]
fn every_node_daemon_set_starts_liveness_after_the_first_sync() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for file in [
        "deploy/20-daemonset.yaml",
        "deploy/split/20-node-daemonset.yaml",
        "deploy/least-privilege/20-daemonset.yaml",
    ] {
        let text = std::fs::read_to_string(repo.join(file)).expect(file);
        let probe = text
            .split_once("startupProbe:")
            .map(|(_, rest)| rest)
            .unwrap_or_else(|| panic!("{file}: no startupProbe"));
        let path = probe
            .lines()
            .find_map(|l| l.trim().strip_prefix("path: "))
            .unwrap_or_else(|| panic!("{file}: no startupProbe path"));
        assert_eq!(path, "/readyz", "{file}");
    }
}

#[test]
fn the_daemon_sets_command_line_and_config_load_without_a_warning() {
    let d = deploy();
    let pod = d.daemon_set.spec.unwrap().template.spec.unwrap();
    let c = &pod.containers[0];
    let data = d.config_map.data.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.conf");
    std::fs::write(&config, &data["config.conf"]).unwrap();

    // The container's command line (kube-proxy's: no subcommand), with the kubelet's
    // $(NODE_NAME) expansion and the config file where this test put it;
    // `--write-config-to -` stops kpng before it starts.
    let args = c.args.clone().unwrap();
    assert!(
        args.iter().all(|a| a.starts_with("--")),
        "no subcommand: {args:?}"
    );
    let mut line: Vec<String> = Vec::new();
    line.extend(args.iter().map(|a| {
        if a.starts_with("--config=") {
            format!("--config={}", config.display())
        } else {
            a.replace("$(NODE_NAME)", "node-1")
        }
    }));
    line.extend(["--write-config-to".into(), "-".into()]);
    let out = Command::new(env!("CARGO_BIN_EXE_kpng"))
        .args(&line)
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kpng {line:?} failed:\n{stderr}");
    assert!(
        !stderr.contains("WARN") && !stderr.contains("ERROR"),
        "{stderr}"
    );
    let effective: Value = serde_saphyr::from_str(&stdout).unwrap();
    assert_eq!(effective["mode"], "nftables");
    assert_eq!(effective["hostnameOverride"], "node-1");
    assert_eq!(effective["clusterCIDR"], "10.244.0.0/16");
    assert_eq!(
        effective["clientConnection"]["kubeconfig"],
        "/var/lib/kpng/kubeconfig.conf"
    );
}

#[test]
fn dockerfile_builds_the_binary_the_daemon_set_runs() {
    let d = deploy();
    let pod = d.daemon_set.spec.unwrap().template.spec.unwrap();
    let command = pod.containers[0].command.clone().unwrap();
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let from: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("FROM "))
        .collect();
    assert_eq!(from, ["rust:1.95-bookworm AS build", "scratch"]);
    assert!(dockerfile.contains("cargo build --profile dist --locked -p kpng"));
    assert!(dockerfile.contains("RUN scripts/image-rootfs.sh /out/kpng /rootfs"));
    assert!(dockerfile.contains("COPY --from=build /rootfs/ /"));
    for package in ["nftables", "iptables", "iproute2"] {
        assert!(dockerfile.contains(&format!(" {package} ")), "{package}");
    }
    // The build stage installs what the eBPF backend's build script says it needs: the image
    // build fails without them (the rust image has gcc, not clang).
    let installed: BTreeSet<&str> = dockerfile
        .split("apt-get install")
        .skip(1)
        .flat_map(|rest| {
            rest.split("&&")
                .next()
                .unwrap_or_default()
                .split_whitespace()
                .filter(|w| !w.starts_with('-') && *w != "\\")
        })
        .collect();
    let build_rs = std::fs::read_to_string(repo().join("crates/backend-ebpf/build.rs")).unwrap();
    let needed = build_rs
        .split("(apt-get install ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .expect("the eBPF build script names the packages it needs");
    for package in needed.split_whitespace() {
        assert!(
            installed.contains(package),
            "the Dockerfile's build stage installs {package} (crates/backend-ebpf/build.rs \
             needs it); it installs {installed:?}"
        );
    }
    let script = std::fs::read_to_string(repo().join("scripts/image-rootfs.sh")).unwrap();
    assert_eq!(command[0], "/usr/local/bin/kpng");
    assert!(
        script.contains(r#"install -m 0755 "$kpng" "$root/usr/local/bin/kpng""#),
        "the image puts kpng where the DaemonSet runs it"
    );
    let cargo = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    assert!(
        cargo.contains("[profile.dist]\ninherits = \"release\"\ndebug = 0\nstrip = \"debuginfo\""),
        "the dist profile strips debug info"
    );
}

#[test]
fn daemon_set_mounts_what_kubeadms_kube_proxy_mounts() {
    let pod = deploy().daemon_set.spec.unwrap().template.spec.unwrap();
    let c = &pod.containers[0];
    let mounts = c.volume_mounts.as_ref().unwrap();
    let volumes = pod.volumes.as_ref().unwrap();
    for (path, read_only, host_type) in [
        ("/run/xtables.lock", false, Some("FileOrCreate")),
        ("/lib/modules", true, None),
        // Not kubeadm's: kpng's records (conntrack memory, route_localnet) outlive the
        // container only on the host.
        ("/run/kpng", false, Some("DirectoryOrCreate")),
    ] {
        let mount = mounts
            .iter()
            .find(|m| m.mount_path == path)
            .unwrap_or_else(|| panic!("{path} is not mounted"));
        assert_eq!(mount.read_only.unwrap_or(false), read_only, "{path}");
        let volume = volumes.iter().find(|v| v.name == mount.name).unwrap();
        let host = volume.host_path.as_ref().unwrap();
        assert_eq!(host.path, path);
        assert_eq!(host.type_.as_deref(), host_type, "{path}");
    }
}

/// The image's file system (scripts/image-rootfs.sh) has everything kpng runs, and it runs
/// there: kpng (also as kube-proxy), nft, both iptables variants and ip, each in a chroot of
/// only that tree. Root only (chroot).
#[test]
fn the_image_root_file_system_runs_kpng_and_its_tools() {
    kpng_testkit::require_root!();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("rootfs");
    let out = Command::new(repo().join("scripts/image-rootfs.sh"))
        .arg(env!("CARGO_BIN_EXE_kpng"))
        .arg(&root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (argv, want) in [
        (&["/usr/local/bin/kpng", "version"][..], "kpng "),
        (&["/usr/local/bin/kube-proxy", "version"][..], "kpng "),
        (&["/usr/sbin/nft", "--version"][..], "nftables v"),
        (
            &["/usr/sbin/iptables-nft-save", "--version"][..],
            "(nf_tables)",
        ),
        (
            &["/usr/sbin/ip6tables-legacy-restore", "--version"][..],
            "(legacy)",
        ),
        (&["/usr/sbin/ip", "-V"][..], "iproute2"),
    ] {
        let out = Command::new("chroot")
            .arg(&root)
            .args(argv)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && text.contains(want),
            "{argv:?}: {text}"
        );
    }
    // libnftables, which kpng loads at run time, is there under the name it asks for.
    let listing = Command::new("chroot")
        .arg(&root)
        .args(["/usr/local/bin/kpng", "--help"])
        .output()
        .unwrap();
    assert!(listing.status.success());
    let found = std::fs::read_dir(root.join("usr/lib"))
        .unwrap()
        .filter_map(Result::ok)
        .any(|d| d.path().join("libnftables.so.1").exists());
    assert!(found, "libnftables.so.1 in the image");
}

/// `deploy/least-privilege/20-daemonset.yaml`: the DaemonSet without `privileged`, for a
/// hardened cluster. It must be the default one but for the container's securityContext and
/// the default's `hostPID` (for `mode: ebpf`, which the variant does not run; no other
/// drift), give root NET_ADMIN and NET_RAW only (what the ConfigMap's mode needs: nftables or
/// iptables, legacy included; docs/deploy.md), with a read-only image, no privilege escalation
/// and the runtime's seccomp filter.
#[test]
fn the_least_privilege_daemon_set_differs_by_its_security_context_only() {
    let path = repo().join("deploy/least-privilege/20-daemonset.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let doc: Value = serde_saphyr::from_str(&text).unwrap();
    let mut variant: DaemonSet = typed("least-privilege/20-daemonset.yaml", &doc);
    let mut default = deploy().daemon_set;
    let container = |ds: &mut DaemonSet| {
        ds.spec
            .as_mut()
            .unwrap()
            .template
            .spec
            .as_mut()
            .unwrap()
            .containers[0]
            .security_context
            .take()
            .unwrap()
    };
    let sc = container(&mut variant);
    container(&mut default);
    // The host's PID namespace is for `mode: ebpf` (its UDP socket destroys find the pods'
    // processes), which this variant does not run: it keeps its own.
    let host_pid = |ds: &mut DaemonSet| {
        ds.spec
            .as_mut()
            .unwrap()
            .template
            .spec
            .as_mut()
            .unwrap()
            .host_pid
            .take()
    };
    assert_eq!(
        host_pid(&mut variant),
        None,
        "the variant's own PID namespace"
    );
    assert_eq!(host_pid(&mut default), Some(true), "hostPID for mode: ebpf");
    assert_eq!(
        serde_json::to_value(&variant).unwrap(),
        serde_json::to_value(&default).unwrap(),
        "only the securityContext differs"
    );
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.run_as_user, Some(0));
    let caps = sc.capabilities.unwrap();
    assert_eq!(caps.drop, Some(vec!["ALL".to_string()]));
    assert_eq!(
        caps.add,
        Some(vec!["NET_ADMIN".to_string(), "NET_RAW".to_string()])
    );
    assert_eq!(sc.seccomp_profile.unwrap().type_, "RuntimeDefault");
    // Enough for the ConfigMap's mode only: eBPF needs CAP_BPF and the host's bpffs.
    let config = deploy().config_map.data.unwrap()["config.conf"].clone();
    let mode = config
        .lines()
        .find_map(|l| l.trim().strip_prefix("mode:"))
        .map(str::trim);
    assert!(matches!(mode, Some("nftables" | "iptables")), "{mode:?}");
}

/// Every document of every `*.yaml` in `deploy/<dir>` (`""`: `deploy/` itself), with its file
/// name (`<dir>/<file>`, or `<file>` in `deploy/`).
fn documents_in(dir: &str) -> Vec<(String, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("deploy").join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "deploy/{dir} holds no manifests");
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let file_name = file.file_name().unwrap().to_string_lossy();
        let name = if dir.is_empty() {
            file_name.into_owned()
        } else {
            format!("{dir}/{file_name}")
        };
        out.extend(
            docs.into_iter()
                .filter(|d| !d.is_null())
                .map(|d| (name.clone(), d)),
        );
    }
    out
}

/// `deploy/split/`: split mode's brains and nodes (docs/deploy.md, "Split mode").
struct Split {
    service_account: ServiceAccount,
    role: ClusterRole,
    binding: ClusterRoleBinding,
    brain: k8s_openapi::api::apps::v1::Deployment,
    service: k8s_openapi::api::core::v1::Service,
    budget: k8s_openapi::api::policy::v1::PodDisruptionBudget,
    nodes: DaemonSet,
}

fn split() -> Split {
    let (mut sa, mut role, mut binding, mut brain, mut service, mut budget, mut nodes) =
        (None, None, None, None, None, None, None);
    for (file, doc) in documents_in("split") {
        match doc["kind"].as_str().unwrap_or_default() {
            "ServiceAccount" => sa = Some(typed(&file, &doc)),
            "ClusterRole" => role = Some(typed(&file, &doc)),
            "ClusterRoleBinding" => binding = Some(typed(&file, &doc)),
            "Deployment" => brain = Some(typed(&file, &doc)),
            "Service" => service = Some(typed(&file, &doc)),
            "PodDisruptionBudget" => budget = Some(typed(&file, &doc)),
            "DaemonSet" => nodes = Some(typed(&file, &doc)),
            other => panic!("{file}: unexpected kind {other:?}"),
        }
    }
    Split {
        service_account: sa.expect("a ServiceAccount"),
        role: role.expect("a ClusterRole"),
        binding: binding.expect("a ClusterRoleBinding"),
        brain: brain.expect("the brains' Deployment"),
        service: service.expect("the brains' Service"),
        budget: budget.expect("the brains' PodDisruptionBudget"),
        nodes: nodes.expect("the nodes' DaemonSet"),
    }
}

/// A ClusterRole's grants as `group/resource` → sorted verbs.
fn grants(role: &ClusterRole) -> BTreeMap<String, Vec<String>> {
    let mut grants: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for rule in role.rules.clone().unwrap() {
        assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none());
        for group in rule.api_groups.unwrap() {
            for resource in rule.resources.clone().unwrap() {
                let verbs = grants.entry(format!("{group}/{resource}")).or_default();
                verbs.extend(rule.verbs.iter().cloned());
                verbs.sort();
            }
        }
    }
    grants
}

/// The value of `--flag=VALUE` in `args`.
fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .find_map(|a| a.strip_prefix(&format!("--{name}=")))
}

/// The port of `HOST:PORT`, `tcp://HOST:PORT` or `https://HOST:PORT`.
fn port_of(address: &str) -> i32 {
    let (_, port) = address.rsplit_once(':').unwrap();
    port.parse()
        .unwrap_or_else(|e| panic!("{address}: port: {e}"))
}

fn int(port: &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString) -> i32 {
    match port {
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(p) => *p,
        other => panic!("a port number, not {other:?}"),
    }
}

/// The volume mounted at the directory holding `path` in `pod`'s first container.
fn volume_holding<'a>(
    pod: &'a k8s_openapi::api::core::v1::PodSpec,
    path: &str,
) -> &'a k8s_openapi::api::core::v1::Volume {
    let (dir, _) = path.rsplit_once('/').unwrap();
    let mount = pod.containers[0]
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.mount_path == dir)
        .unwrap_or_else(|| panic!("{path}: nothing mounted at {dir}"));
    pod.volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == mount.name)
        .unwrap_or_else(|| panic!("{path}: no volume {}", mount.name))
}

/// The brains read exactly what the `kube` source reads for every node: deploy/00-rbac.yaml's
/// rules without `get` on Nodes (a node's kpng reads its own Node so) and without Events
/// (posted about a node by its own kpng only); the nodes have no credentials at all.
#[test]
fn split_mode_rbac_is_the_brains_only_and_no_more_than_it_reads() {
    let s = split();
    let mut want = grants(&deploy().role);
    want.remove("events.k8s.io/events");
    want.get_mut("/nodes").unwrap().retain(|v| v != "get");
    assert_eq!(grants(&s.role), want);
    assert_eq!(
        Some(&s.binding.role_ref.name),
        s.role.metadata.name.as_ref()
    );
    let subjects = s.binding.subjects.unwrap();
    assert_eq!(subjects.len(), 1);
    assert_eq!(
        Some(&subjects[0].name),
        s.service_account.metadata.name.as_ref()
    );
    assert_eq!(subjects[0].namespace, s.service_account.metadata.namespace);
    let brain = s.brain.spec.unwrap().template.spec.unwrap();
    assert_eq!(brain.service_account_name, s.service_account.metadata.name);
    let node = s.nodes.spec.unwrap().template.spec.unwrap();
    assert_eq!(node.automount_service_account_token, Some(false));
    assert_eq!(
        node.service_account_name, None,
        "the nodes have no identity of their own"
    );
    let args = node.containers[0].args.clone().unwrap();
    assert!(!args.iter().any(|a| a.contains("kubeconfig")), "{args:?}");
}

/// The brains run one per control-plane host (required anti-affinity, the ports are the
/// host's): a replica more than there are control-plane nodes stays Pending for ever. The
/// manifests name kind's default cluster (`kind-control-plane`), which has one, so the
/// Deployment asks for one, and says at the field when to raise it.
#[test]
fn the_brains_replicas_fit_the_control_plane_nodes() {
    let s = split();
    let spec = s.brain.spec.as_ref().unwrap();
    let pod = spec.template.spec.as_ref().unwrap();
    let one_per_host = pod
        .affinity
        .as_ref()
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .is_some_and(|terms| {
            terms
                .iter()
                .any(|t| t.topology_key == "kubernetes.io/hostname")
        });
    assert!(one_per_host, "one brain per host");
    let on_control_planes = pod
        .node_selector
        .as_ref()
        .is_some_and(|s| s.contains_key("node-role.kubernetes.io/control-plane"));
    assert!(on_control_planes, "the brains run on control-plane nodes");
    let kind_control_planes = 1;
    let replicas = spec.replicas.unwrap_or(1);
    assert!(
        replicas <= kind_control_planes,
        "{replicas} brains on kind's {kind_control_planes} control-plane node: the rest stay \
         Pending"
    );
    let text = std::fs::read_to_string(repo().join("deploy/split/10-brain.yaml")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.trim_start().starts_with("replicas:"))
        .expect("a replicas field");
    let comment = lines[..at]
        .iter()
        .rev()
        .take_while(|l| l.trim_start().starts_with('#'))
        .copied()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        comment.contains("number of control-plane nodes"),
        "the replicas field says its limit: {comment:?}"
    );
}

/// The brains: behind a Service whose ports are the containers' and the flags', probes on
/// the metrics port the flag opens, TLS files where their volumes are, and nothing on the
/// ports or admin socket of the node's own kpng beside it on a control-plane host.
#[test]
fn the_brains_ports_probes_and_certificates_are_consistent() {
    let s = split();
    let spec = s.brain.spec.unwrap();
    let labels = spec.template.metadata.as_ref().unwrap().labels.clone();
    assert_eq!(spec.selector.match_labels, labels);
    assert_eq!(s.service.spec.as_ref().unwrap().selector, labels);
    assert_eq!(
        s.budget
            .spec
            .as_ref()
            .unwrap()
            .selector
            .as_ref()
            .unwrap()
            .match_labels,
        labels
    );
    for ns in [
        &s.brain.metadata.namespace,
        &s.service.metadata.namespace,
        &s.budget.metadata.namespace,
        &s.nodes.metadata.namespace,
        &s.service_account.metadata.namespace,
    ] {
        assert_eq!(ns.as_deref(), Some("kube-system"));
    }
    let pod = spec.template.spec.unwrap();
    assert_eq!(
        pod.host_network,
        Some(true),
        "nodes reach it without a ClusterIP"
    );
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-cluster-critical")
    );
    let c = &pod.containers[0];
    let args = c.args.clone().unwrap();
    assert_eq!(args[0], "kube");
    assert!(args.contains(&"to-api".to_string()), "{args:?}");
    let container_port = |name: &str| {
        c.ports
            .as_ref()
            .unwrap()
            .iter()
            .find(|p| p.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no {name} port"))
            .container_port
    };
    let listen = flag(&args, "listen").unwrap();
    assert!(listen.starts_with("tcp://0.0.0.0:"), "{listen}");
    assert_eq!(port_of(listen), container_port("api"));
    let metrics = flag(&args, "metrics-bind-address").unwrap();
    assert!(
        metrics.starts_with("0.0.0.0:"),
        "the kubelet probes it: {metrics}"
    );
    assert_eq!(port_of(metrics), container_port("metrics"));
    let probe = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        let get = p.as_ref().unwrap().http_get.clone().unwrap();
        (get.path.unwrap(), int(&get.port))
    };
    assert_eq!(
        probe(&c.readiness_probe),
        ("/healthz".into(), port_of(metrics))
    );
    assert_eq!(
        probe(&c.liveness_probe),
        ("/livez".into(), port_of(metrics))
    );
    for p in s.service.spec.unwrap().ports.unwrap() {
        let target = match p.target_port.unwrap() {
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(name) => name,
            other => panic!("{other:?}"),
        };
        assert_eq!(p.port, container_port(&target), "Service port {target}");
    }
    // TLS with client certificates: the files are the volumes'.
    let cert = flag(&args, "listen-tls-cert").unwrap();
    let key = flag(&args, "listen-tls-key").unwrap();
    let ca = flag(&args, "listen-tls-ca").unwrap();
    let secret = volume_holding(&pod, cert).secret.clone().unwrap();
    assert_eq!(secret.secret_name.as_deref(), Some("kpng-brain-tls"));
    assert_eq!(
        secret.default_mode,
        Some(0o400),
        "the key readable by its owner only"
    );
    assert_eq!(
        volume_holding(&pod, key).name,
        volume_holding(&pod, cert).name
    );
    assert!(
        cert.ends_with("/tls.crt") && key.ends_with("/tls.key"),
        "a kubernetes.io/tls Secret"
    );
    let cluster_ca = volume_holding(&pod, ca).config_map.clone().unwrap();
    assert_eq!(cluster_ca.name, "kube-root-ca.crt");
    assert!(ca.ends_with("/ca.crt"));
    // The API server is read at the address the ConfigMap's kubeconfig names.
    let kubeconfig = flag(&args, "kubeconfig").unwrap();
    let cm = volume_holding(&pod, kubeconfig).config_map.clone().unwrap();
    assert_eq!(Some(cm.name), deploy().config_map.metadata.name);
    // Beside a node's kpng on one host: other ports, another admin socket.
    let node_config: Value =
        serde_saphyr::from_str(&deploy().config_map.data.unwrap()["config.conf"]).unwrap();
    let node_ports = [
        port_of(node_config["healthzBindAddress"].as_str().unwrap()),
        port_of(node_config["metricsBindAddress"].as_str().unwrap()),
    ];
    for port in [port_of(listen), port_of(metrics)] {
        assert!(!node_ports.contains(&port), "{port} is a node kpng's");
    }
    let admin = flag(&args, "admin-socket").unwrap();
    assert_ne!(admin, "/run/kpng/kpng.sock");
    assert!(volume_holding(&pod, admin).empty_dir.is_some(), "{admin}");
}

/// The nodes' DaemonSet runs as deploy/20-daemonset.yaml does (host network, priority,
/// tolerations, securityContext, probe, resources and ports), dials the brains' port with
/// their certificate's name, and proves its node with the kubelet's client certificate.
#[test]
fn the_split_nodes_run_like_the_daemon_set_and_dial_the_brains() {
    let s = split();
    let default = deploy().daemon_set.spec.unwrap().template.spec.unwrap();
    let pod = s.nodes.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.host_network, default.host_network);
    assert_eq!(pod.priority_class_name, default.priority_class_name);
    assert_eq!(pod.tolerations, default.tolerations);
    assert_eq!(pod.node_selector, default.node_selector);
    let (c, d) = (&pod.containers[0], &default.containers[0]);
    assert_eq!(c.command, d.command);
    assert_eq!(c.security_context, d.security_context);
    assert_eq!(c.liveness_probe, d.liveness_probe);
    assert_eq!(c.startup_probe, d.startup_probe);
    assert_eq!(c.resources, d.resources);
    assert_eq!(c.ports, d.ports);
    assert_eq!(c.env, d.env);
    let args = c.args.clone().unwrap();
    let words: Vec<&str> = args
        .iter()
        .filter(|a| !a.starts_with("--"))
        .map(String::as_str)
        .collect();
    assert_eq!(words, ["api", "to-local", "nft"]);
    assert_eq!(flag(&args, "hostname-override"), Some("$(NODE_NAME)"));
    assert_eq!(
        flag(&args, "config"),
        d.args
            .as_ref()
            .unwrap()
            .iter()
            .find_map(|a| a.strip_prefix("--config="))
    );
    // The brains' port, at the control-plane host the kubeconfig names, checked against
    // the name the brains' certificate holds: the Service's.
    let brain_args = s.brain.spec.unwrap().template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap();
    let api = flag(&args, "api").unwrap();
    assert_eq!(port_of(api), port_of(flag(&brain_args, "listen").unwrap()));
    let data = deploy().config_map.data.unwrap();
    let kubeconfig: Value = serde_saphyr::from_str(&data["kubeconfig.conf"]).unwrap();
    let server = kubeconfig["clusters"][0]["cluster"]["server"]
        .as_str()
        .unwrap();
    let host = |a: &str| {
        let rest = a.split_once("://").map_or(a, |(_, r)| r);
        rest.rsplit_once(':').unwrap().0.to_string()
    };
    assert_eq!(host(api), host(server), "the control-plane endpoint");
    let service = &s.service.metadata;
    assert_eq!(
        flag(&args, "api-tls-server-name").unwrap(),
        format!(
            "{}.{}.svc",
            service.name.as_deref().unwrap(),
            service.namespace.as_deref().unwrap()
        )
    );
    let ca = flag(&args, "api-tls-ca").unwrap();
    assert_eq!(
        volume_holding(&pod, ca).config_map.as_ref().unwrap().name,
        "kpng-brain-ca"
    );
    let cert = flag(&args, "api-tls-cert").unwrap();
    assert_eq!(
        flag(&args, "api-tls-key"),
        Some(cert),
        "the kubelet's pair is one file"
    );
    let kubelet = volume_holding(&pod, cert).host_path.clone().unwrap();
    assert_eq!(kubelet.path, "/var/lib/kubelet/pki");
    // The mounts the node's kpng needs from its host, as the default DaemonSet's.
    let mounts = |p: &k8s_openapi::api::core::v1::PodSpec| -> BTreeSet<String> {
        p.containers[0]
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| m.mount_path.clone())
            .collect()
    };
    assert!(
        mounts(&pod).is_superset(&mounts(&default)),
        "{:?}",
        mounts(&pod)
    );
}

/// The containers running kpng in every manifest under deploy/, with the file each is in.
fn kpng_containers() -> Vec<(String, k8s_openapi::api::core::v1::Container)> {
    let mut out = Vec::new();
    let docs = documents()
        .into_iter()
        .chain(documents_in("least-privilege"))
        .chain(documents_in("split"));
    for (file, doc) in docs {
        let pod = &doc["spec"]["template"]["spec"];
        if pod.is_null() {
            continue;
        }
        let pod: k8s_openapi::api::core::v1::PodSpec =
            serde_json::from_value(pod.clone()).unwrap_or_else(|e| panic!("{file}: {e}"));
        for c in pod.containers {
            if c.command.as_deref() == Some(&["/usr/local/bin/kpng".to_string()][..]) {
                out.push((file.clone(), c));
            }
        }
    }
    out
}

/// Runs `kpng ARGS --write-config-to -` (parses the whole command line with the real CLI,
/// loads the config, and stops before starting): its success, and what it logged.
fn parse_with_kpng(args: &[String], config: &Path) -> (bool, String) {
    let mut line: Vec<String> = args
        .iter()
        .map(|a| {
            if a.starts_with("--config=") {
                format!("--config={}", config.display())
            } else {
                a.replace("$(NODE_NAME)", "node-1")
            }
        })
        .collect();
    line.extend(["--write-config-to".into(), "-".into()]);
    let out = Command::new(env!("CARGO_BIN_EXE_kpng"))
        .args(&line)
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    (
        out.status.success(),
        format!("{line:?}\n{}", String::from_utf8_lossy(&out.stderr)),
    )
}

/// Every kpng command line in deploy/ (the default, least-privilege and split-mode ones)
/// parses with the real CLI and loads the ConfigMap's config without a warning; a misspelt
/// flag would fail here, which the test checks on the brain's line.
#[test]
fn every_kpng_command_line_in_deploy_parses_with_the_real_cli() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.conf");
    std::fs::write(&config, &deploy().config_map.data.unwrap()["config.conf"]).unwrap();
    let containers = kpng_containers();
    let files: BTreeSet<&str> = containers.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(
        files,
        BTreeSet::from([
            "20-daemonset.yaml",
            "least-privilege/20-daemonset.yaml",
            "split/10-brain.yaml",
            "split/20-node-daemonset.yaml",
        ])
    );
    for (file, c) in &containers {
        let args = c.args.clone().unwrap();
        let (ok, log) = parse_with_kpng(&args, &config);
        assert!(ok, "{file}: kpng refused its command line: {log}");
        // What the written file cannot hold (the brain's and the split node's kpng flags) is
        // about the write this check borrows, not about the line or the config.
        let about_the_line: Vec<&str> = log
            .lines()
            .filter(|l| !l.contains(" --write-config-to: "))
            .collect();
        assert!(
            about_the_line
                .iter()
                .all(|l| !l.contains("WARN") && !l.contains("ERROR")),
            "{file}: {log}"
        );
    }
    // The check catches a wrong flag: the brain's line with one misspelt.
    let (_, brain) = containers
        .iter()
        .find(|(f, _)| f == "split/10-brain.yaml")
        .unwrap();
    let wrong: Vec<String> = brain
        .args
        .clone()
        .unwrap()
        .into_iter()
        .map(|a| a.replace("--listen-tls-ca=", "--listen-tls-client-ca="))
        .collect();
    let (ok, log) = parse_with_kpng(&wrong, &config);
    assert!(!ok, "a misspelt flag must fail: {log}");
}

/// `deploy/rollback/kpng-cleanup.yaml`: a valid DaemonSet on the host network whose privileged
/// init container removes only kpng's own rules, and only once kube-proxy has synced (it waits
/// as long as it takes); its flags are ones `kpng cleanup` takes.
#[test]
fn the_rollback_cleanup_waits_for_kube_proxy_then_removes_only_kpngs_rules() {
    let docs = documents_in("rollback");
    assert_eq!(docs.len(), 1, "one DaemonSet");
    let (file, doc) = &docs[0];
    let ds: k8s_openapi::api::apps::v1::DaemonSet = typed(file, doc);
    let pod = ds.spec.and_then(|s| s.template.spec).expect("a pod spec");
    assert_eq!(
        pod.host_network,
        Some(true),
        "{file}: kpng's tables are the node's"
    );
    let init = pod.init_containers.expect("an init container");
    let cleanup = &init[0];
    assert_eq!(
        cleanup.command.as_deref(),
        Some(&["/usr/local/bin/kpng".to_string()][..])
    );
    let args = cleanup.args.clone().expect("args");
    assert_eq!(
        args,
        [
            "cleanup",
            "--kpng-only",
            "--after-synced=127.0.0.1:10249",
            "--timeout=0"
        ],
        "{file}"
    );
    assert_eq!(
        cleanup.security_context.as_ref().and_then(|s| s.privileged),
        Some(true)
    );
    // The real CLI takes the line (its help stops it before anything runs).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kpng"))
        .args(&args)
        .arg("--help")
        .output()
        .expect("run kpng");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
