//! `to-local hns --hcn-simulator FILE` end to end: the real binary reads manifests, programs the
//! simulated HCN, and writes its state to FILE in HCN's field names; a load balancer deleted
//! from FILE out of band is re-created within a sync period.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// HCN as the CNI leaves a Windows node1 of `examples/cluster.yaml`: the network and the two
/// local pods' endpoints.
fn initial_state() -> Value {
    let cni = |id: &str, ip: &str| {
        json!({"ID": id, "Name": id, "HostComputeNetwork": "NET", "Flags": 0, "Policies": [],
               "IpConfigurations": [{"IpAddress": ip, "PrefixLength": 24}]})
    };
    json!({
        "Networks": [{"ID": "NET", "Name": "cbr0", "Type": "L2Bridge"}],
        "Endpoints": [cni("CNI-2", "10.244.1.2"), cni("CNI-3", "10.244.1.3")],
        "LoadBalancers": [],
    })
}

/// Starts kpng; its log goes to `log` (a file: a pipe nobody reads could fill up).
fn start(input: &Path, state: &Path, log: &Path) -> Running {
    start_with(input, state, log, &[])
}

/// A kpng under test, killed when the test ends, however it ends (a failed assertion too: a
/// kpng left running would hold its simulator file and ports after the test).
struct Running(Child);

impl std::ops::Deref for Running {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Running {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// [`start`] with more flags.
fn start_with(input: &Path, state: &Path, log: &Path, extra: &[&str]) -> Running {
    let child = Command::new(env!("CARGO_BIN_EXE_kpng"))
        .args(["file", "--input"])
        .arg(input)
        .args(["--node-name", "node1", "--network-name", "cbr0"])
        .args(extra)
        .args(["--min-sync-period", "0", "--sync-period", "300ms"])
        .args([
            "--metrics-bind-address=",
            "--healthz-bind-address=127.0.0.1:0",
        ])
        // No admin socket unless the test asks for one.
        .args(if extra.contains(&"--admin-socket") {
            &[][..]
        } else {
            &["--admin-socket", ""][..]
        })
        .args(["to-local", "hns", "--hcn-simulator"])
        .arg(state)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log file"))
        .spawn()
        .expect("start kpng");
    Running(child)
}

/// Waits until FILE holds a state for which `ready` is true.
fn wait_for(
    child: &mut Child,
    state: &Path,
    log: &Path,
    what: &str,
    ready: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(text) = std::fs::read_to_string(state)
            && let Ok(v) = serde_json::from_str::<Value>(&text)
            && ready(&v)
        {
            return v;
        }
        if Instant::now() > deadline || matches!(child.try_wait(), Ok(Some(_))) {
            let _ = child.kill();
            let _ = child.wait();
            let err = std::fs::read_to_string(log).unwrap_or_default();
            panic!("{what}: not within 20 s; kpng said:\n{err}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn lb<'a>(state: &'a Value, vip: &str, proto: u64) -> Option<&'a Value> {
    state["LoadBalancers"].as_array()?.iter().find(|l| {
        l["FrontendVIPs"]
            .as_array()
            .is_some_and(|v| v.iter().any(|x| x == vip))
            && l["PortMappings"][0]["Protocol"] == proto
    })
}

fn endpoint_ips(state: &Value, lb: &Value) -> Vec<String> {
    let mut ips: Vec<String> = lb["HostComputeEndpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|id| {
            state["Endpoints"].as_array()?.iter().find(|e| {
                e["ID"].as_str().map(str::to_ascii_lowercase)
                    == id.as_str().map(str::to_ascii_lowercase)
            })
        })
        .filter_map(|e| {
            e["IpConfigurations"][0]["IpAddress"]
                .as_str()
                .map(String::from)
        })
        .collect();
    ips.sort();
    ips
}

#[test]
fn manifests_in_hcn_state_out_and_out_of_band_deletes_are_repaired() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster.yaml");
    let state = dir.path().join("hcn.json");
    std::fs::write(&state, initial_state().to_string()).expect("write state");
    let log = dir.path().join("kpng.log");
    let mut child = start(&input, &state, &log);
    let programmed = wait_for(&mut child, &state, &log, "the first sync", |s| {
        lb(s, "10.96.0.10", 6).is_some()
    });
    // default/web:http over IPv4: two local pods (the CNI's endpoints) and one on node2 (a
    // remote endpoint kpng created), to port 8080.
    let web = lb(&programmed, "10.96.0.10", 6).expect("web's load balancer");
    assert_eq!(
        endpoint_ips(&programmed, web),
        vec!["10.244.1.2", "10.244.1.3", "10.244.2.2"]
    );
    assert_eq!(web["PortMappings"][0]["InternalPort"], 8080);
    assert_eq!(web["PortMappings"][0]["ExternalPort"], 80);
    assert_eq!(web["SchemaVersion"]["Major"], 2);
    let ids: Vec<&Value> = web["HostComputeEndpoints"]
        .as_array()
        .expect("ids")
        .iter()
        .collect();
    // The CNI's endpoints, by ID (kpng writes GUIDs in lower case; HCN's are case-blind).
    assert!(ids.contains(&&json!("cni-2")) && ids.contains(&&json!("cni-3")));
    let remote = programmed["Endpoints"]
        .as_array()
        .expect("endpoints")
        .iter()
        .find(|e| e["IpConfigurations"][0]["IpAddress"] == "10.244.2.2")
        .expect("the remote endpoint");
    assert_eq!(remote["Flags"], 1, "flagged remote");
    assert_eq!(
        programmed["Endpoints"]
            .as_array()
            .expect("endpoints")
            .iter()
            .filter(|e| e["IpConfigurations"][0]["IpAddress"] == "10.244.2.2")
            .count(),
        1,
        "one remote endpoint, shared by every load balancer"
    );
    // IPv6 too (dual-stack): the IPv6 flag.
    let web6 = lb(&programmed, "fd00:96::10", 6).expect("web's IPv6 load balancer");
    assert_eq!(web6["Flags"], 2);

    // Out of band: web's load balancer vanishes (hnsdiag delete loadbalancers).
    let web_id = web["ID"].clone();
    let mut edited = programmed.clone();
    edited["LoadBalancers"]
        .as_array_mut()
        .expect("lbs")
        .retain(|l| l["ID"] != web_id);
    let tmp = dir.path().join("hcn.json.edit");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&edited).expect("json")).expect("write");
    std::fs::rename(&tmp, &state).expect("replace");
    let repaired = wait_for(&mut child, &state, &log, "the re-creation", |s| {
        lb(s, "10.96.0.10", 6).is_some_and(|l| l["ID"] != web_id)
    });
    let web = lb(&repaired, "10.96.0.10", 6).expect("re-created");
    assert_eq!(
        endpoint_ips(&repaired, web),
        vec!["10.244.1.2", "10.244.1.3", "10.244.2.2"]
    );
    assert_eq!(
        repaired["LoadBalancers"].as_array().map(Vec::len),
        programmed["LoadBalancers"].as_array().map(Vec::len),
        "nothing else changed"
    );
    // Said as a repair, naming what came back (the state file is written before the log).
    let deadline = Instant::now() + Duration::from_secs(5);
    let said = |log: &Path| {
        std::fs::read_to_string(log).is_ok_and(|t| {
            t.contains("HNS changed by someone else (an HNS or CNI restart, hnsdiag): 1 load balancer(s) missing or changed, created again")
        })
    };
    while !said(&log) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        said(&log),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

/// A LoadBalancer Service annotated `preserve-destination: "true"`, its ingress IP, and one
/// pod on node1 and one on node2.
const PRESERVE_DIP: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: node1}
status:
  addresses: [{type: InternalIP, address: 192.168.100.1}]
---
apiVersion: v1
kind: Service
metadata:
  namespace: default
  name: gclb
  annotations: {preserve-destination: "true"}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.40
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30400}]
status:
  loadBalancer: {ingress: [{ip: 198.51.100.40}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: default
  name: gclb-v4
  labels: {kubernetes.io/service-name: gclb}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [10.244.1.2], nodeName: node1, conditions: {ready: true}}
- {addresses: [10.244.2.2], nodeName: node2, conditions: {ready: true}}
"#;

#[test]
fn preserve_destination_annotation_sets_winkernels_flags_in_hcn() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("cluster.yaml");
    std::fs::write(&input, PRESERVE_DIP).expect("write manifest");
    let state = dir.path().join("hcn.json");
    std::fs::write(&state, initial_state().to_string()).expect("write state");
    let log = dir.path().join("kpng.log");
    let mut child = start(&input, &state, &log);
    let s = wait_for(&mut child, &state, &log, "the first sync", |s| {
        lb(s, "198.51.100.40", 6).is_some()
    });
    let _ = child.kill();
    let _ = child.wait();
    // The ingress IP: DSR (load balancer flag 1); port mapping VipExternalIP 16 | UseMux 4 |
    // PreserveDIP 8; the local pod only.
    let ingress = lb(&s, "198.51.100.40", 6).expect("ingress load balancer");
    assert_eq!(ingress["Flags"], 1);
    assert_eq!(ingress["PortMappings"][0]["Flags"], 16 | 4 | 8);
    assert_eq!(endpoint_ips(&s, ingress), vec!["10.244.1.2"]);
    // The node port: no routing mesh either (local pod only), flags as without the annotation.
    let node_port = s["LoadBalancers"]
        .as_array()
        .expect("lbs")
        .iter()
        .find(|l| l["PortMappings"][0]["ExternalPort"] == 30400)
        .expect("node-port load balancer");
    assert_eq!(node_port["Flags"], 0);
    assert_eq!(node_port["PortMappings"][0]["Flags"], 2 | 16);
    assert_eq!(endpoint_ips(&s, node_port), vec!["10.244.1.2"]);
    // The ClusterIP: untouched, both pods.
    let cluster = lb(&s, "10.96.0.40", 6).expect("ClusterIP load balancer");
    assert_eq!(cluster["Flags"], 0);
    assert_eq!(cluster["PortMappings"][0]["Flags"], 0);
    assert_eq!(endpoint_ips(&s, cluster), vec!["10.244.1.2", "10.244.2.2"]);
}

#[test]
fn forward_healthcheck_vip_reaches_the_root_endpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("cluster.yaml");
    let manifest = PRESERVE_DIP.replace(
        "  type: LoadBalancer\n",
        "  type: LoadBalancer\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 32400\n",
    );
    std::fs::write(&input, manifest).expect("write manifest");
    let state = dir.path().join("hcn.json");
    // The CNI's root endpoint (the host's vNIC on the network), named as --root-hnsendpoint-name.
    let mut initial = initial_state();
    initial["Endpoints"]
        .as_array_mut()
        .expect("endpoints")
        .push(json!({"ID": "ROOT", "Name": "cbr0_ep", "HostComputeNetwork": "NET", "Flags": 0,
                     "Policies": [], "IpConfigurations": [{"IpAddress": "10.244.1.1", "PrefixLength": 24}]}));
    std::fs::write(&state, initial.to_string()).expect("write state");
    let log = dir.path().join("kpng.log");
    let mut child = start_with(
        &input,
        &state,
        &log,
        &[
            "--forward-healthcheck-vip",
            "--root-hnsendpoint-name",
            "cbr0_ep",
        ],
    );
    let health = |s: &Value| -> Option<Value> {
        s["LoadBalancers"]
            .as_array()?
            .iter()
            .find(|l| l["PortMappings"][0]["ExternalPort"] == 32400)
            .cloned()
    };
    let s = wait_for(&mut child, &state, &log, "the health load balancer", |s| {
        health(s).is_some()
    });
    let _ = child.kill();
    let _ = child.wait();
    let hc = health(&s).expect("health load balancer");
    assert_eq!(hc["FrontendVIPs"], json!(["198.51.100.40"]));
    assert_eq!(hc["PortMappings"][0]["InternalPort"], 32400);
    assert_eq!(hc["PortMappings"][0]["Protocol"], 6);
    // preserve-DIP: UseMux | PreserveDIP; never DSR.
    assert_eq!(hc["PortMappings"][0]["Flags"], 4 | 8);
    assert_eq!(hc["Flags"], 0);
    assert_eq!(endpoint_ips(&s, &hc), vec!["10.244.1.1"]);
}

#[test]
fn without_a_simulator_off_windows_the_error_says_what_to_do() {
    let out = Command::new(env!("CARGO_BIN_EXE_kpng"))
        .args(["file", "--input", "x.yaml", "--network-name", "cbr0"])
        .args(["--metrics-bind-address=", "--admin-socket", ""])
        .args(["to-local", "hns"])
        .output()
        .expect("run kpng");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if cfg!(windows) {
        return;
    }
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("Windows Host Networking Service") && stderr.contains("--hcn-simulator"),
        "{stderr}"
    );
}

/// `kpng status` names the HNS network kpng programs and what it keeps there (the Windows
/// admin's first questions), in the wide view and JSON.
#[test]
fn status_names_the_hns_network_and_what_kpng_keeps_there() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster.yaml");
    let state = dir.path().join("hcn.json");
    std::fs::write(&state, initial_state().to_string()).expect("write state");
    let log = dir.path().join("kpng.log");
    let socket = dir.path().join("admin.sock");
    let socket_arg = socket.display().to_string();
    let mut child = start_with(&input, &state, &log, &["--admin-socket", &socket_arg]);
    let programmed = wait_for(&mut child, &state, &log, "the first sync", |s| {
        lb(s, "10.96.0.10", 6).is_some()
    });
    let lbs = programmed["LoadBalancers"].as_array().map_or(0, Vec::len);
    let status = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_kpng"))
            .arg("status")
            .args(args)
            .args(["--admin-socket", &socket_arg])
            .output()
            .expect("kpng status");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let json: Value = serde_json::from_str(&status(&["-o", "json"])).expect("status JSON");
    let lines = json["dataPlane"].as_array().expect("dataPlane");
    assert_eq!(
        lines[0]["state"], "cbr0 (L2Bridge, net): 2 endpoint(s) of this node's pods",
        "{json}"
    );
    // node2's pod, over IPv4 and IPv6: two remote endpoints.
    assert_eq!(
        lines[1]["state"],
        format!("{lbs} load balancer(s), 2 remote endpoint(s) kept by kpng"),
        "{json}"
    );
    // The CNI of this simulated node made no IPv6 endpoint for pod1a: the planner's warning
    // stays visible, unasked.
    let problem = "default/web:http/TCP (IPv6): local endpoint fd00:244:1::2 has no HNS \
                   endpoint on the network (not created by the CNI yet); left out";
    assert_eq!(lines[1]["problem"], problem, "{json}");
    assert!(status(&[]).contains(problem), "{}", status(&[]));
    let wide = status(&["-o", "wide"]);
    assert!(wide.contains("HNS network: cbr0 (L2Bridge, net)"), "{wide}");
    // A Service without endpoints has no load balancer on HNS: nothing answers its
    // connections, nothing rejects them (the Linux backends' REJECT).
    let empty = status(&["default/empty"]);
    assert!(
        empty.contains("no endpoints: no HNS load balancer") && empty.contains("not answered"),
        "{empty}"
    );
    assert!(!empty.contains("rejected"), "{empty}");
}

/// Overlay without `--source-vip`: kpng stops at start naming the flag and the file's field,
/// as kube-proxy's winkernel ("source-vip flag not set"), and programs nothing; with it, it
/// runs.
#[test]
fn overlay_without_a_source_vip_stops_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster.yaml");
    let state = dir.path().join("hcn.json");
    let mut overlay = initial_state();
    overlay["Networks"][0]["Type"] = json!("Overlay");
    std::fs::write(&state, overlay.to_string()).expect("write state");
    let log = dir.path().join("kpng.log");
    let mut child = start(&input, &state, &log);
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status;
        }
        assert!(Instant::now() < deadline, "kpng kept running on Overlay");
        std::thread::sleep(Duration::from_millis(20));
    };
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(1), "{said}");
    assert!(
        said.contains("\"cbr0\" is an Overlay network")
            && said.contains("--source-vip")
            && said.contains("winkernel.sourceVip"),
        "{said}"
    );
    let after: Value =
        serde_json::from_str(&std::fs::read_to_string(&state).expect("state")).expect("json");
    assert_eq!(after["LoadBalancers"], json!([]), "nothing programmed");

    let mut child = start_with(&input, &state, &log, &["--source-vip", "10.244.1.9"]);
    wait_for(&mut child, &state, &log, "the first sync", |s| {
        lb(s, "10.96.0.10", 6).is_some()
    });
}

/// `to-local hns --dry-run` plans against what HCN holds (here the simulator's file; on a
/// Windows node the system's HCN) and prints the HCN calls it would make, making none: the
/// CNI's endpoints of node1's pods are found (no "not created by the CNI yet" warning for
/// them), the load balancers over them are printed with the JSON HCN would get, and the file
/// is not written. (The dry run used to plan against an empty in-memory network: it warned
/// about every local endpoint and printed nothing.)
#[test]
fn dry_run_prints_the_hcn_plan_against_what_hcn_holds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/cluster.yaml");
    let state = dir.path().join("hcn.json");
    let before = initial_state().to_string();
    std::fs::write(&state, &before).expect("write state");
    let log = dir.path().join("kpng.log");
    let out = dir.path().join("plan.txt");
    let child = Command::new(env!("CARGO_BIN_EXE_kpng"))
        .args(["file", "--input"])
        .arg(&input)
        .args(["--node-name", "node1", "--network-name", "cbr0"])
        .args(["--min-sync-period", "0", "--admin-socket", ""])
        .args([
            "--metrics-bind-address=",
            "--healthz-bind-address=127.0.0.1:0",
        ])
        .args(["to-local", "hns", "--dry-run", "--hcn-simulator"])
        .arg(&state)
        .stdout(std::fs::File::create(&out).expect("plan file"))
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("start kpng");
    let mut child = Running(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    let plan = loop {
        let plan = std::fs::read_to_string(&out).unwrap_or_default();
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        if said.contains(" synced ") && plan.contains("HcnCreateLoadBalancer") {
            break plan;
        }
        if Instant::now() > deadline || matches!(child.try_wait(), Ok(Some(_))) {
            panic!("no HCN plan within 20 s; printed:\n{plan}\nkpng said:\n{said}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    for local in ["10.244.1.2", "10.244.1.3"] {
        assert!(
            !said.contains(&format!("local endpoint {local} has no HNS endpoint")),
            "{local} is the CNI's endpoint in the file:\n{said}"
        );
    }
    // web's ClusterIP over node1's two pods (the CNI's endpoints) and node2's (a remote
    // endpoint the dry run would create first).
    let line = plan
        .lines()
        .find(|l| l.starts_with("# HcnCreateLoadBalancer: 10.96.0.10:80/TCP"))
        .unwrap_or_else(|| panic!("no load balancer for web:\n{plan}"));
    assert!(line.contains("10.244.1.2, 10.244.1.3"), "{line}");
    assert!(
        plan.contains("# HcnCreateEndpoint: remote endpoint"),
        "{plan}"
    );
    assert!(plan.contains("\"FrontendVIPs\":[\"10.96.0.10\"]"), "{plan}");
    assert!(
        plan.starts_with("# kpng --dry-run: the HCN calls of this sync"),
        "{plan}"
    );
    assert_eq!(
        std::fs::read_to_string(&state).expect("state"),
        before,
        "a dry run writes nothing"
    );
}

/// `scripts/wine-compare.sh` failing mid-way (here kpng.exe's model differs from kpng's) stops
/// and reaps every process it started: the Linux kpng's `to-file` and the (stubbed) Wine one.
/// Its trap used to stop only Wine's processes (`wineserver -k`), leaving the Linux kpng running
/// after every failed comparison. Wine and mingw are stand-ins on PATH, so this runs without
/// Wine: `wine` answers `version` as kpng.exe would, and for `to-file` writes a wrong model and
/// stays up, as a Wine process would.
#[cfg(unix)]
#[test]
fn wine_compare_failing_midway_leaves_no_process_running() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temp dir");
    let bin = dir.path().join("bin");
    let pids = dir.path().join("pids");
    std::fs::create_dir_all(&bin).expect("bin dir");
    std::fs::create_dir_all(&pids).expect("pids dir");
    let script = |name: &str, text: &str| {
        let path = bin.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{text}")).expect("stand-in");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        path
    };
    script(
        "x86_64-w64-mingw32-gcc",
        "while [ $# -gt 0 ]; do [ \"$1\" = -o ] && : > \"$2\"; shift; done\n",
    );
    script("wineserver", "exit 0\n");
    script(
        "wine",
        "shift\n\
         if [ \"$1\" = version ]; then\n\
           \"$KPNG_REAL\" version | sed -n 1p; echo 'platform: windows/amd64'; exit 0\n\
         fi\n\
         while [ $# -gt 0 ]; do\n\
           if [ \"$1\" = --output ]; then echo 'not the model' > \"$2\"; fi; shift\n\
         done\n\
         echo $$ > \"$PIDS/wine-$$\"\n\
         exec sleep 600\n",
    );
    // The Linux kpng, through a wrapper that notes its pid (exec keeps it).
    let linux = script(
        "kpng-linux",
        "echo $$ > \"$PIDS/kpng-$$\"\nexec \"$KPNG_REAL\" \"$@\"\n",
    );
    let exe = dir.path().join("kpng.exe");
    std::fs::write(&exe, "").expect("kpng.exe stand-in");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out =
        Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/wine-compare.sh"))
            .arg(&exe)
            .arg(&linux)
            .env("PATH", path)
            .env("KPNG_REAL", env!("CARGO_BIN_EXE_kpng"))
            .env("PIDS", &pids)
            .stdin(Stdio::null())
            .output()
            .expect("run wine-compare.sh");
    let started: Vec<(String, u32)> = std::fs::read_dir(&pids)
        .expect("pids")
        .map(|e| {
            let e = e.expect("pid file");
            let pid = std::fs::read_to_string(e.path()).expect("pid");
            (
                e.file_name().to_string_lossy().into_owned(),
                pid.trim().parse().expect("a pid"),
            )
        })
        .collect();
    // Whatever the outcome, nothing this test started stays behind.
    let running: Vec<&(String, u32)> = started
        .iter()
        .filter(|(_, pid)| Path::new(&format!("/proc/{pid}")).exists())
        .collect();
    for (_, pid) in &running {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout.contains("FAILED: kpng.exe and kpng give different models"),
        "it should fail at the model comparison:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        started.iter().any(|(name, _)| name.starts_with("kpng-"))
            && started.iter().any(|(name, _)| name.starts_with("wine-")),
        "both to-file runs started: {started:?}"
    );
    assert!(
        running.is_empty(),
        "still running after the script ended: {running:?}"
    );
}
