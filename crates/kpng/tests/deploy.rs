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
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("deploy"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "deploy/ holds no manifests");
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        out.extend(
            docs.into_iter()
                .filter(|d| !d.is_null())
                .map(|d| (name.clone(), d)),
        );
    }
    out
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
    let mut grants: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for rule in d.role.rules.unwrap() {
        assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none());
        for group in rule.api_groups.unwrap() {
            for resource in rule.resources.clone().unwrap() {
                let verbs = grants.entry(format!("{group}/{resource}")).or_default();
                verbs.extend(rule.verbs.iter().cloned());
                verbs.sort();
            }
        }
    }
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
    // Liveness waits for the first sync: the startup probe is /healthz (200 once the first
    // sync has programmed the node) on the health server, with minutes of budget.
    let startup = c.startup_probe.as_ref().expect("a startupProbe");
    let get = startup.http_get.as_ref().unwrap();
    assert_eq!(get.path.as_deref(), Some("/healthz"));
    let liveness = c.liveness_probe.as_ref().unwrap();
    assert_eq!(get.port, liveness.http_get.as_ref().unwrap().port);
    let budget = startup.period_seconds.unwrap_or(10) * startup.failure_threshold.unwrap_or(3);
    assert!(budget >= 300, "startup budget {budget}s");
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
