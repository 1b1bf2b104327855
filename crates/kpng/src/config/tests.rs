//! Table-driven tests of `--config`: real installer files, field mappings, errors, warnings,
//! flag precedence and the written configuration.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use crate::backends::BackendKind;
use crate::cli::{DetectLocalMode, LogFormat};

use clap::{CommandFactory, FromArgMatches};

use super::mapping::FileSettings;
use super::*;
use crate::cli::Cli;

const KUBEADM: &str = include_str!("../../testdata/kube-proxy/kubeadm-v1.33.conf");
const KIND: &str = include_str!("../../testdata/kube-proxy/kind-v1.33.conf");

/// What kube-proxy itself writes with `--write-config-to` (1.33, no flags): every default
/// spelled out, mode empty.
const KUBE_PROXY_DEFAULTS: &str = r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 10
  contentType: application/vnd.kubernetes.protobuf
  kubeconfig: ""
  qps: 5
clusterCIDR: ""
configSyncPeriod: 15m0s
conntrack:
  maxPerCore: 32768
  min: 131072
  tcpBeLiberal: false
  tcpCloseWaitTimeout: 1h0m0s
  tcpEstablishedTimeout: 24h0m0s
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: 0.0.0.0:10256
hostnameOverride: ""
iptables:
  localhostNodePorts: true
  masqueradeAll: false
  masqueradeBit: 14
  minSyncPeriod: 1s
  syncPeriod: 30s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 30s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 5s
  format: text
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: 127.0.0.1:10249
mode: ""
nftables:
  masqueradeAll: false
  masqueradeBit: 14
  minSyncPeriod: 1s
  syncPeriod: 30s
nodePortAddresses: null
oomScoreAdj: -999
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
"#;

const HEAD: &str = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";

/// A minimal file with `body` appended.
fn doc(body: &str) -> String {
    format!("{HEAD}{body}")
}

/// kube-proxy's defaults for nftables mode, as kpng's flag values.
fn defaults() -> FileSettings {
    FileSettings {
        node_name: None,
        node_ip: vec![],
        cluster_cidr: vec![],
        masquerade_all: false,
        detect_local_mode: DetectLocalMode::ClusterCidr,
        pod_bridge_interface: None,
        pod_interface_name_prefix: None,
        masquerade_bit: 14,
        nodeport_addresses: vec![],
        healthz_bind_address: Some("0.0.0.0:10256".parse().unwrap()),
        metrics_bind_address: "127.0.0.1:10249".into(),
        bind_address_hard_fail: false,
        min_sync_period: Duration::from_secs(1),
        sync_period: Duration::from_secs(30),
        conntrack_max_per_core: 32768,
        conntrack_min: 131072,
        conntrack_tcp_timeout_established: Duration::from_secs(86400),
        conntrack_tcp_timeout_close_wait: Duration::from_secs(3600),
        conntrack_tcp_be_liberal: false,
        conntrack_udp_timeout: Duration::ZERO,
        conntrack_udp_timeout_stream: Duration::ZERO,
        log_level: "info".into(),
        verbosity: Some(0),
        logging_format: LogFormat::Text,
        client_connection: ClientConnection::default(),
        proxy_mode: None,
        mode_error: None,
        iptables_localhost_nodeports: true,
        enable_dsr: false,
        source_vip: vec![],
        network_name: None,
        forward_healthcheck_vip: false,
        root_hnsendpoint_name: "cbr0".into(),
        windows_service: false,
        mode_section: "iptables",
    }
}

/// [`defaults`] with `mode: nftables`.
fn nft_defaults() -> FileSettings {
    FileSettings {
        proxy_mode: Some(BackendKind::Nft),
        mode_section: "nftables",
        ..defaults()
    }
}

#[test]
fn an_empty_mode_reads_as_the_platforms_kube_proxy_default() {
    // kubeadm's file says `mode: ""`: kube-proxy on Windows runs kernelspace, on Linux iptables.
    let parsed = load::parse(KUBEADM).unwrap();
    assert_eq!(parsed.config.mode, "");
    let windows = mapping::map_on(&parsed.config, crate::backends::Platform::Windows).unwrap();
    assert_eq!(windows.notes.len(), 1, "{:?}", windows.notes);
    let note = &windows.notes[0];
    assert!(
        note.starts_with(mapping::EMPTY_MODE_NOTE)
            && note.contains("kube-proxy's Windows default")
            && note.contains("kernelspace (HNS) backend")
            && !note.contains("Linux"),
        "{note}"
    );
    assert!(windows.settings.mode_error.is_none());
    let linux = mapping::map_on(&parsed.config, crate::backends::Platform::Linux).unwrap();
    assert!(
        linux.notes[0].contains("kube-proxy's Linux default")
            && linux.notes[0].contains("the iptables backend"),
        "{:?}",
        linux.notes
    );
}

#[test]
fn stock_kubeadm_file_loads_without_a_warning() {
    let (settings, report) = from_text(KUBEADM).unwrap();
    assert_eq!(report.warnings, Vec::<String>::new());
    assert_eq!(report.notes.len(), 1, "{:?}", report.notes);
    assert!(
        report.notes[0].contains("mode is empty"),
        "{:?}",
        report.notes
    );
    assert_eq!(
        settings,
        FileSettings {
            cluster_cidr: vec!["10.244.0.0/16".parse().unwrap()],
            client_connection: ClientConnection {
                kubeconfig: Some("/var/lib/kube-proxy/kubeconfig.conf".into()),
                ..Default::default()
            },
            ..defaults()
        }
    );
}

#[test]
fn kind_file_loads_without_warnings() {
    let (settings, report) = from_text(KIND).unwrap();
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    assert!(report.notes.is_empty(), "{:?}", report.notes);
    assert_eq!(settings.proxy_mode, Some(BackendKind::Iptables));
    assert_eq!(
        settings.conntrack_max_per_core, 0,
        "kind leaves the table size alone"
    );
    assert_eq!(settings.min_sync_period, Duration::from_secs(1));
}

#[test]
fn kube_proxys_own_defaults_warn_about_what_kpng_lacks() {
    let (settings, report) = from_text(KUBE_PROXY_DEFAULTS).unwrap();
    let fields: Vec<&str> = report
        .warnings
        .iter()
        .map(|w| w.split(':').next().unwrap())
        .collect();
    assert_eq!(fields, ["oomScoreAdj"]);
    assert_eq!(
        settings,
        FileSettings {
            client_connection: ClientConnection {
                kube_api_qps: Some(5.0),
                kube_api_burst: Some(10),
                ..Default::default()
            },
            ..defaults()
        }
    );
}

#[test]
fn fields_map_onto_flags() {
    let cases: Vec<(&str, String, FileSettings)> = vec![
        ("empty file body", doc(""), defaults()),
        (
            "kernelspace: the hns backend, winkernel's fields and the iptables section's periods",
            doc("mode: kernelspace\nwinkernel:\n  enableDSR: true\n  networkName: vxlan0\n  sourceVip: 10.244.1.2\niptables:\n  syncPeriod: 10s\n"),
            FileSettings {
                proxy_mode: Some(BackendKind::Hns),
                enable_dsr: true,
                network_name: Some("vxlan0".into()),
                source_vip: vec!["10.244.1.2".parse().unwrap()],
                sync_period: Duration::from_secs(10),
                ..defaults()
            },
        ),
        (
            "winkernel: health-check VIP forwarding to the named root endpoint",
            doc("mode: kernelspace\nwinkernel:\n  forwardHealthCheckVip: true\n  rootHnsEndpointName: cbr0_ep\nwindowsRunAsService: true\n"),
            FileSettings {
                proxy_mode: Some(BackendKind::Hns),
                forward_healthcheck_vip: true,
                root_hnsendpoint_name: "cbr0_ep".into(),
                windows_service: true,
                ..defaults()
            },
        ),
        (
            "nftables section",
            doc("mode: nftables\nnftables:\n  masqueradeAll: true\n  masqueradeBit: 10\n  syncPeriod: 1m0s\n  minSyncPeriod: 2s\niptables:\n  masqueradeBit: 3\n"),
            FileSettings {
                masquerade_all: true,
                masquerade_bit: 10,
                sync_period: Duration::from_secs(60),
                min_sync_period: Duration::from_secs(2),
                ..nft_defaults()
            },
        ),
        (
            "empty mode reads the iptables section, as kube-proxy",
            doc("mode: \"\"\niptables:\n  masqueradeAll: true\n  masqueradeBit: 3\n  syncPeriod: 10s\nnftables:\n  masqueradeBit: 9\n"),
            FileSettings {
                masquerade_all: true,
                masquerade_bit: 3,
                sync_period: Duration::from_secs(10),
                ..defaults()
            },
        ),
        (
            "nftables mode: zero periods take the defaults",
            doc("mode: nftables\nnftables:\n  syncPeriod: 0s\n  minSyncPeriod: 0s\n"),
            nft_defaults(),
        ),
        (
            "dual-stack cluster CIDR",
            doc("clusterCIDR: 10.244.0.0/16, fd00:10:244::/56\n"),
            FileSettings {
                cluster_cidr: vec![
                    "10.244.0.0/16".parse().unwrap(),
                    "fd00:10:244::/56".parse().unwrap(),
                ],
                ..defaults()
            },
        ),
        (
            "bindAddressHardFail: a server that cannot bind ends kpng",
            doc("bindAddressHardFail: true\n"),
            FileSettings {
                bind_address_hard_fail: true,
                ..defaults()
            },
        ),
        (
            "bind address is the node IP",
            doc("bindAddress: 192.168.1.5\n"),
            FileSettings {
                node_ip: vec!["192.168.1.5".parse().unwrap()],
                ..defaults()
            },
        ),
        (
            "IPv6 bind address moves the default listen addresses",
            doc("bindAddress: \"::\"\n"),
            FileSettings {
                healthz_bind_address: Some("[::]:10256".parse().unwrap()),
                metrics_bind_address: "[::1]:10249".into(),
                ..defaults()
            },
        ),
        (
            "listen addresses get default ports",
            doc("healthzBindAddress: 10.0.0.1\nmetricsBindAddress: \"[fd00::1]\"\n"),
            FileSettings {
                healthz_bind_address: Some("10.0.0.1:10256".parse().unwrap()),
                metrics_bind_address: "[fd00::1]:10249".into(),
                ..defaults()
            },
        ),
        (
            "listen addresses with ports",
            doc("healthzBindAddress: 0.0.0.0:1234\nmetricsBindAddress: 0.0.0.0:10249\n"),
            FileSettings {
                healthz_bind_address: Some("0.0.0.0:1234".parse().unwrap()),
                metrics_bind_address: "0.0.0.0:10249".into(),
                ..defaults()
            },
        ),
        (
            "hostname override is trimmed and lower-cased",
            doc("hostnameOverride: \" Node-1 \"\n"),
            FileSettings {
                node_name: Some("node-1".into()),
                ..defaults()
            },
        ),
        (
            "bridge interface detection",
            doc("detectLocalMode: BridgeInterface\ndetectLocal:\n  bridgeInterface: cni0\n"),
            FileSettings {
                detect_local_mode: DetectLocalMode::BridgeInterface,
                pod_bridge_interface: Some("cni0".into()),
                ..defaults()
            },
        ),
        (
            "interface prefix detection",
            doc("detectLocalMode: InterfaceNamePrefix\ndetectLocal:\n  interfaceNamePrefix: veth\n"),
            FileSettings {
                detect_local_mode: DetectLocalMode::InterfaceNamePrefix,
                pod_interface_name_prefix: Some("veth".into()),
                ..defaults()
            },
        ),
        (
            "node port CIDRs",
            doc("nodePortAddresses: [10.0.0.0/8, \"fd00::/8\"]\n"),
            FileSettings {
                nodeport_addresses: vec!["10.0.0.0/8".into(), "fd00::/8".into()],
                ..defaults()
            },
        ),
        (
            "conntrack: explicit zeros leave the sysctls",
            doc("conntrack:\n  maxPerCore: 0\n  min: 0\n  tcpEstablishedTimeout: 0s\n  tcpCloseWaitTimeout: 0s\n"),
            FileSettings {
                conntrack_max_per_core: 0,
                conntrack_min: 0,
                conntrack_tcp_timeout_established: Duration::ZERO,
                conntrack_tcp_timeout_close_wait: Duration::ZERO,
                ..defaults()
            },
        ),
        (
            "conntrack: every value",
            doc("conntrack:\n  maxPerCore: 1000\n  min: 2000\n  tcpEstablishedTimeout: 2h\n  tcpCloseWaitTimeout: 60s\n  tcpBeLiberal: true\n  udpTimeout: 30s\n  udpStreamTimeout: 5m0s\n"),
            FileSettings {
                conntrack_max_per_core: 1000,
                conntrack_min: 2000,
                conntrack_tcp_timeout_established: Duration::from_secs(7200),
                conntrack_tcp_timeout_close_wait: Duration::from_secs(60),
                conntrack_tcp_be_liberal: true,
                conntrack_udp_timeout: Duration::from_secs(30),
                conntrack_udp_timeout_stream: Duration::from_secs(300),
                ..defaults()
            },
        ),
        (
            "verbosity 4 is debug",
            doc("logging:\n  verbosity: 4\n"),
            FileSettings {
                log_level: "debug".into(),
                verbosity: Some(4),
                ..defaults()
            },
        ),
        (
            "client connection",
            doc("clientConnection:\n  kubeconfig: /etc/k.conf\n  qps: 20\n  burst: 40\n"),
            FileSettings {
                client_connection: ClientConnection {
                    kubeconfig: Some("/etc/k.conf".into()),
                    kube_api_qps: Some(20.0),
                    kube_api_burst: Some(40),
                },
                ..defaults()
            },
        ),
        (
            "JSON",
            r#"{"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
                "mode": "nftables", "clusterCIDR": "10.1.0.0/16", "nftables": {"masqueradeAll": true}}"#
                .to_string(),
            FileSettings {
                cluster_cidr: vec!["10.1.0.0/16".parse().unwrap()],
                masquerade_all: true,
                ..nft_defaults()
            },
        ),
    ];
    for (name, text, want) in cases {
        let (got, _) = from_text(&text).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert_eq!(got, want, "{name}");
    }
}

/// A mode kpng does not run is not a parse error: it is kept, naming the field, for the
/// command line to decide (an error only where the mode would choose the backend).
#[test]
fn a_mode_kpng_does_not_run_is_kept_as_an_error_for_later() {
    for (text, want) in [
        ("mode: ipvs\n", "field mode: \"ipvs\" is not supported"),
        ("mode: proxy\n", "field mode: unknown proxy mode \"proxy\""),
        (
            "mode: NFTables\n",
            "field mode: unknown proxy mode \"NFTables\"",
        ),
    ] {
        let (got, _) = from_text(&doc(text)).unwrap_or_else(|e| panic!("{text}: {e:#}"));
        assert_eq!(got.proxy_mode, None, "{text}");
        assert!(
            got.mode_error
                .as_deref()
                .is_some_and(|e| e.starts_with(want)),
            "{text}: {:?}",
            got.mode_error
        );
    }
    let (got, _) = from_text(&doc("mode: ebpf\n")).expect("ebpf is a mode kpng runs");
    assert_eq!(got.proxy_mode, Some(BackendKind::Ebpf));
}

#[test]
fn bad_values_are_errors_naming_the_field() {
    let cases = [
        (
            "mode: nftables\nnftables:\n  masqueradeBit: 32\n",
            "field nftables.masqueradeBit: 32 is not in 0-31",
        ),
        (
            "iptables:\n  masqueradeBit: -1\n",
            "field iptables.masqueradeBit: -1 is not in 0-31",
        ),
        (
            "mode: nftables\nnftables:\n  syncPeriod: 10s\n  minSyncPeriod: 1m\n",
            "field nftables.minSyncPeriod: 1m0s must not exceed nftables.syncPeriod (10s)",
        ),
        (
            "clusterCIDR: 10.244.0.0\n",
            "field clusterCIDR: \"10.244.0.0\" is not a CIDR",
        ),
        (
            "clusterCIDR: 10.1.0.0/16,10.2.0.0/16\n",
            "field clusterCIDR: \"10.1.0.0/16,10.2.0.0/16\" has two CIDRs of one family",
        ),
        (
            "bindAddress: node1\n",
            "field bindAddress: \"node1\" is not an IP address",
        ),
        (
            "healthzBindAddress: localhost:10256\n",
            "field healthzBindAddress: \"localhost:10256\" is not IP:port",
        ),
        (
            "detectLocalMode: Bridge\n",
            "field detectLocalMode: unknown mode \"Bridge\"",
        ),
        (
            "nodePortAddresses: [primary, 10.0.0.0/8]\n",
            "field nodePortAddresses: \"primary\" cannot be combined with CIDRs",
        ),
        (
            "nodePortAddresses: [10.0.0.1]\n",
            "field nodePortAddresses: \"10.0.0.1\" is not a CIDR or \"primary\"",
        ),
        (
            "nodePortAddresses: [\"::ffff:10.0.0.0/88\"]\n",
            "field nodePortAddresses: \"::ffff:10.0.0.0/88\" is an IPv4-mapped IPv6 CIDR with prefix /88",
        ),
        (
            "clusterCIDR: \"::ffff:10.244.0.0/64\"\n",
            "field clusterCIDR: \"::ffff:10.244.0.0/64\" is an IPv4-mapped IPv6 CIDR with prefix /64",
        ),
        (
            "conntrack:\n  maxPerCore: -1\n",
            "field conntrack.maxPerCore: -1 is negative (0 to 2147483647; 0 leaves the sysctl to the node)",
        ),
        (
            "conntrack:\n  maxPerCore: 4000000000\n",
            "field conntrack.maxPerCore: invalid value: integer `4000000000`, expected an integer from -2147483648 to 2147483647",
        ),
        (
            "conntrack:\n  udpTimeout: 5\n",
            "field conntrack.udpTimeout: invalid type: integer `5`, expected a duration such as \"30s\"",
        ),
        (
            "conntrack:\n  maxPerCore: many\n",
            "field conntrack.maxPerCore: invalid type: string \"many\", expected an integer",
        ),
        (
            "clientConnection:\n  qps: fast\n",
            "field clientConnection.qps: invalid type: string \"fast\", expected a number",
        ),
        (
            "conntrack:\n  udpTimeout: 5x\n",
            "field conntrack.udpTimeout: \"5x\" is not a duration (unknown unit \"x\"",
        ),
        (
            "conntrack:\n  tcpEstablishedTimeout: -1s\n",
            "field conntrack.tcpEstablishedTimeout: \"-1s\" is not a duration (negative",
        ),
        (
            "nftables:\n  masqueradeAll: maybe\n",
            "field nftables.masqueradeAll: invalid type: string \"maybe\", expected a boolean",
        ),
        (
            "clientConnection:\n  burst: -5\n",
            "field clientConnection.burst: -5 is negative",
        ),
    ];
    for (body, want) in cases {
        let err = format!("{:#}", from_text(&doc(body)).expect_err(body));
        assert!(err.contains(want), "{body:?}:\n  got  {err}\n  want {want}");
        // Rust's own words for a failed conversion tell an operator nothing.
        assert!(!err.contains("integral type"), "{body:?}: {err}");
    }
    for (text, want) in [
        (
            "kind: KubeProxyConfiguration\n",
            "field apiVersion: kpng reads \"kubeproxy.config.k8s.io/v1alpha1\", found \"\"",
        ),
        (
            "apiVersion: kubeproxy.config.k8s.io/v1alpha2\nkind: KubeProxyConfiguration\n",
            "(write the file as v1alpha1",
        ),
        (
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n",
            "field kind: expected \"KubeProxyConfiguration\", found \"KubeletConfiguration\"",
        ),
        (
            "",
            "expected a KubeProxyConfiguration mapping, found an empty document",
        ),
        (
            "- a\n",
            "expected a KubeProxyConfiguration mapping, found a list",
        ),
        ("mode: [\n", "invalid YAML: "),
        ("kind: x\nmode: {a\n", " at line 2, column 7"),
        ("{\"kind\": ", "invalid JSON"),
    ] {
        let err = format!("{:#}", from_text(text).expect_err(text));
        assert!(err.contains(want), "{text:?}:\n  got  {err}\n  want {want}");
    }
}

#[test]
fn unsupported_settings_warn_naming_the_field() {
    let cases: [(&str, &[&str]); 16] = [
        (
            "featureGates:\n  Foo: true\n  Bar: false\n",
            &["featureGates (Bar=false, Foo=true): kpng has no feature gates; ignored"],
        ),
        ("featureGates: {}\n", &[]),
        ("logging:\n  format: json\n", &[]),
        (
            "logging:\n  format: text\n  flushFrequency: 5s\n  vmodule: [{filePattern: proxier, verbosity: 4}]\n",
            &["logging.vmodule: kpng has no per-file verbosity"],
        ),
        (
            "enableProfiling: true\nshowHiddenMetricsForVersion: \"1.32\"\n",
            &[
                "enableProfiling: kpng serves no /debug/pprof; ignored",
                "showHiddenMetricsForVersion: kpng hides no metrics; ignored",
            ],
        ),
        (
            "oomScoreAdj: -999\n",
            &["oomScoreAdj: kpng leaves its OOM score to the kubelet"],
        ),
        ("configSyncPeriod: 15m0s\n", &[]),
        (
            "configSyncPeriod: 1m\n",
            &["configSyncPeriod: kpng's watches have no periodic resync"],
        ),
        (
            "portRange: 30000-32767\n",
            &["portRange: unused since kube-proxy's userspace mode; ignored"],
        ),
        (
            "mode: nftables\niptables:\n  localhostNodePorts: true\n",
            &[],
        ),
        (
            "ipvs:\n  syncPeriod: 30s\n  scheduler: rr\n  strictARP: true\n",
            &["ipvs.scheduler, ipvs.strictARP: settings of the ipvs mode; ignored"],
        ),
        (
            "winkernel:\n  networkName: flannel\n  enableDSR: true\n  rootHnsEndpointName: x\n  forwardHealthCheckVip: true\nwindowsRunAsService: true\n",
            &[],
        ),
        (
            "bindAddressHardFail: true\nclientConnection:\n  contentType: application/vnd.kubernetes.protobuf\n  acceptContentTypes: application/json\n",
            &[],
        ),
        // The mode section the mode does not read: what would be lost says so.
        (
            "mode: nftables\niptables:\n  masqueradeAll: true\n  minSyncPeriod: 10s\n  syncPeriod: 30s\n",
            &[
                "iptables.masqueradeAll: true is not read in mode \"nftables\", which reads nftables.masqueradeAll (false); move it there",
                "iptables.minSyncPeriod: 10s is not read in mode \"nftables\", which reads nftables.minSyncPeriod (1s)",
            ],
        ),
        (
            "mode: nftables\niptables:\n  masqueradeAll: true\nnftables:\n  masqueradeAll: true\n",
            &[],
        ),
        (
            "nftables:\n  masqueradeBit: 20\n",
            &[
                "nftables.masqueradeBit: 20 is not read in mode \"\" (iptables), which reads iptables.masqueradeBit (14)",
            ],
        ),
    ];
    for (body, want) in cases {
        let (_, report) = from_text(&doc(body)).unwrap_or_else(|e| panic!("{body:?}: {e:#}"));
        let mut warnings = report.warnings.clone();
        // Every case leaves `mode` empty except where it says; only the warnings matter here.
        warnings.retain(|w| !w.starts_with("mode "));
        assert_eq!(warnings.len(), want.len(), "{body:?}: {warnings:?}");
        for (got, want) in warnings.iter().zip(want.iter()) {
            assert!(
                got.starts_with(want),
                "{body:?}:\n  got  {got}\n  want {want}"
            );
        }
    }
}

#[test]
fn unknown_fields_warn_once_naming_each() {
    let text = doc(
        "udpIdleTimeout: 250ms\nconntrack:\n  max: 0\n  min: 5\nmasqueradeAll: true\nmetadata:\n  name: config\nfeatureGates:\n  AnyGate: true\n",
    );
    let (settings, report) = from_text(&text).unwrap();
    assert_eq!(
        settings.conntrack_min, 5,
        "known fields next to unknown ones still apply"
    );
    assert!(
        !settings.masquerade_all,
        "a top-level masqueradeAll is not a v1alpha1 field"
    );
    let unknown: Vec<&String> = report
        .warnings
        .iter()
        .filter(|w| w.contains("not fields of"))
        .collect();
    assert_eq!(
        unknown,
        [
            "conntrack.max, masqueradeAll, metadata, udpIdleTimeout: not fields of kubeproxy.config.k8s.io/v1alpha1; ignored"
        ]
    );
}

/// Parses a kpng command line and applies its `--config`, as `main` does.
fn run_cli(args: &[&str]) -> anyhow::Result<(crate::cli::GlobalFlags, Report)> {
    let matches = Cli::command().try_get_matches_from(args)?;
    let mut cli = Cli::from_arg_matches(&matches)?;
    let report = apply(&mut cli.global, &matches)?;
    Ok((cli.global, report))
}

#[test]
fn explicit_flags_win_over_the_file_and_defaults_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.conf");
    std::fs::write(
        &path,
        doc("mode: nftables\nclusterCIDR: 10.244.0.0/16\nhostnameOverride: from-file\nnftables:\n  syncPeriod: 1m\n  minSyncPeriod: 5s\n  masqueradeBit: 9\n  masqueradeAll: true\nconntrack:\n  maxPerCore: 0\nmetricsBindAddress: 0.0.0.0:10249\nclientConnection:\n  kubeconfig: /from/file\n  qps: 7\n"),
    )
    .unwrap();
    let path = path.to_str().unwrap();
    let (flags, report) = run_cli(&[
        "kpng",
        "--config",
        path,
        "--sync-period",
        "2m",
        "file",
        "--input",
        "x.yaml",
        "--hostname-override",
        "From-Flag",
        "to-file",
        "--masquerade-bit",
        "3",
        "--metrics-bind-address",
        "",
    ])
    .unwrap();
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    // Given on the command line, before, between or after the subcommands: the flag wins.
    assert_eq!(flags.sync_period, Duration::from_secs(120));
    assert_eq!(
        flags.node_name.as_deref(),
        Some("from-flag"),
        "lower-cased, as kube-proxy"
    );
    assert_eq!(flags.masquerade_bit, 3);
    assert_eq!(
        flags.metrics_bind_address, "",
        "an explicit empty value wins too"
    );
    // Left at their defaults: the file's values.
    assert_eq!(flags.min_sync_period, Duration::from_secs(5));
    assert!(flags.masquerade_all);
    assert_eq!(flags.cluster_cidr, ["10.244.0.0/16".parse().unwrap()]);
    assert_eq!(flags.conntrack_max_per_core, 0);
    assert_eq!(
        flags.client_connection,
        ClientConnection {
            kubeconfig: Some("/from/file".into()),
            kube_api_qps: Some(7.0),
            kube_api_burst: None,
        }
    );
    // Flags the file does not speak of keep their defaults.
    assert_eq!(flags.full_sync_period, Duration::from_secs(3600));
    assert_eq!(
        flags.healthz_bind_address,
        Some("0.0.0.0:10256".parse::<SocketAddr>().unwrap())
    );
}

#[test]
fn without_config_the_flags_are_untouched() {
    let (flags, report) = run_cli(&["kpng", "file", "--input", "x", "to-file"]).unwrap();
    assert_eq!(report, Report::default());
    assert_eq!(flags.sync_period, Duration::from_secs(30));
    assert_eq!(flags.client_connection, ClientConnection::default());
}

#[test]
fn a_missing_or_broken_file_is_an_error_naming_it() {
    let err = run_cli(&["kpng", "--config", "/nonexistent/kp.conf", "version"]).unwrap_err();
    assert!(
        format!("{err:#}").starts_with("reading --config /nonexistent/kp.conf: "),
        "{err:#}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.conf");
    std::fs::write(&path, doc("mode: ipvs\n")).unwrap();
    // kube-proxy's own line takes the backend from the file: there the mode is an error.
    let config = path.to_str().unwrap();
    let err = run_cli(&["kpng", "--config", config]).unwrap_err();
    let want = format!("--config {}: field mode: \"ipvs\"", path.display());
    assert!(format!("{err:#}").starts_with(&want), "{err:#}");
    // Where the command line chooses (or needs no backend), it is a warning: an operator
    // leaving ipvs can override it, clean up or ask the version without editing the file.
    for line in [
        &["kpng", "--config", config, "--proxy-mode", "nftables"][..],
        &["kpng", "--config", config, "--cleanup"],
        &["kpng", "--config", config, "version"],
        &["kpng", "--config", config, "cleanup"],
    ] {
        let (_, report) = run_cli(line).unwrap_or_else(|e| panic!("{line:?}: {e:#}"));
        let why = if line.contains(&"--cleanup") {
            "--cleanup removes the rules of every mode all the same"
        } else {
            "the command line chooses the backend instead"
        };
        assert!(
            report
                .warnings
                .iter()
                .any(|w| w.starts_with("field mode: \"ipvs\" is not supported") && w.ends_with(why)),
            "{line:?}: {report:?}"
        );
    }
}

#[test]
fn proxy_mode_ipvs_is_refused_only_where_it_would_choose_the_backend() {
    // kube-proxy's own line: ipvs would choose the backend.
    let err = run_cli(&["kpng", "--proxy-mode=ipvs"]).unwrap_err();
    assert!(
        format!("{err:#}").starts_with("--proxy-mode: \"ipvs\" is not supported"),
        "{err:#}"
    );
    // An operator leaving ipvs cleans up with the flags kube-proxy had (#28's finding).
    for (line, why) in [
        (
            &["kpng", "--proxy-mode=ipvs", "--cleanup"][..],
            "--cleanup removes the rules of every mode all the same",
        ),
        (
            &["kpng", "--proxy-mode=ipvs", "cleanup", "--dry-run"],
            "the command line chooses the backend instead",
        ),
    ] {
        let (flags, report) = run_cli(line).unwrap_or_else(|e| panic!("{line:?}: {e:#}"));
        assert_eq!(flags.proxy_mode, None, "{line:?}");
        assert!(
            report
                .flag_warnings
                .iter()
                .any(|w| w.starts_with("--proxy-mode: \"ipvs\"") && w.ends_with(why)),
            "{line:?}: {report:?}"
        );
    }
    // A mode kpng runs is the backend, whatever else the line says.
    let (flags, report) = run_cli(&["kpng", "--proxy-mode=nftables", "--cleanup"]).unwrap();
    assert_eq!(flags.proxy_mode, Some(BackendKind::Nft));
    assert!(report.flag_warnings.is_empty(), "{report:?}");
}

#[test]
fn given_on_command_line_sees_every_level_and_unknown_ids() {
    let matches = Cli::command()
        .try_get_matches_from([
            "kpng",
            "file",
            "--input",
            "x",
            "to-file",
            "--sync-period",
            "1s",
        ])
        .unwrap();
    assert!(given_on_command_line(&matches, "sync_period"));
    assert!(given_on_command_line(&matches, "input"));
    assert!(
        !given_on_command_line(&matches, "min_sync_period"),
        "a default is not given"
    );
    assert!(!given_on_command_line(&matches, "no_such_flag"));
    // How the `kube` source's flags reach `ClientConnection`: the value as written.
    assert_eq!(
        command_line_value(&matches, "sync_period").as_deref(),
        Some("1s")
    );
    assert_eq!(command_line_value(&matches, "input").as_deref(), Some("x"));
    assert_eq!(command_line_value(&matches, "min_sync_period"), None);
}

#[test]
fn written_configuration_reads_back_to_the_same_flags() {
    let (flags, _) = run_cli(&[
        "kpng",
        "--cluster-cidr",
        "10.244.0.0/16,fd00::/56",
        "--node-ip",
        "192.168.1.5,fd00::5",
        "--node-name",
        "n1",
        "--masquerade-all",
        "--masquerade-bit",
        "7",
        "--detect-local-mode",
        "InterfaceNamePrefix",
        "--pod-interface-name-prefix",
        "veth",
        "--nodeport-addresses",
        "192.168.0.0/16",
        "--healthz-bind-address",
        "[::]:10256",
        "--metrics-bind-address",
        "0.0.0.0:9999",
        "--sync-period",
        "45s",
        "--min-sync-period",
        "250ms",
        "--conntrack-max-per-core",
        "0",
        "--conntrack-tcp-timeout-established",
        "0",
        "--conntrack-tcp-be-liberal",
        "--conntrack-udp-timeout",
        "30s",
        "--log-level",
        "debug",
        "--bind-address-hard-fail",
        "file",
        "--input",
        "x",
        "to-file",
    ])
    .unwrap();
    assert!(flags.bind_address_hard_fail);
    let text = write::render(&write::effective(&flags).unwrap()).unwrap();
    assert!(text.contains("\nbindAddressHardFail: true\n"), "{text}");
    let (settings, report) = from_text(&text).unwrap();
    // Only the note that an empty mode is kube-proxy's default (iptables).
    assert!(report.warnings.is_empty(), "{text}");
    assert_eq!(report.notes.len(), 1, "{text}");
    let mut back = flags.clone();
    overlay(&mut back, settings, |_| false);
    // Unset client settings are written as kube-proxy's defaults.
    assert_eq!(
        back.client_connection,
        ClientConnection {
            kubeconfig: None,
            kube_api_qps: Some(5.0),
            kube_api_burst: Some(10),
        }
    );
    back.client_connection = flags.client_connection.clone();
    // --log-level debug is written as kube-proxy's verbosity 4, and read back as that number.
    assert_eq!(back.verbosity, Some(4));
    back.verbosity = flags.verbosity;
    // bindAddress is one IP, as kube-proxy reads it: the other family's is left out, and
    // named for a warning.
    assert!(text.contains("\nbindAddress: \"192.168.1.5\"\n"), "{text}");
    assert_eq!(back.node_ip, vec![flags.node_ip[0]]);
    back.node_ip = flags.node_ip.clone();
    assert_eq!(format!("{back:?}"), format!("{flags:?}"), "{text}");
    let lost = write::not_written(&flags);
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert!(
        lost[0].starts_with(
            "--node-ip 192.168.1.5,fd00::5: bindAddress takes one IP (kube-proxy refuses a \
             pair), so only 192.168.1.5 is written and fd00::5 is left out"
        ),
        "{lost:?}"
    );
}

/// The command line and the file refuse the same values with the same words, so
/// `--write-config-to` cannot write a file that `--config` refuses.
#[test]
fn the_command_line_and_the_file_refuse_alike() {
    let dir = tempfile::tempdir().unwrap();
    for (flag, value, field, says) in [
        (
            "--nodeport-addresses",
            "primary,fd00::/8",
            "nodePortAddresses: [primary, \"fd00::/8\"]",
            "\"primary\" cannot be combined with CIDRs",
        ),
        (
            "--cluster-cidr",
            "10.244.0.0/16,10.245.0.0/16",
            "clusterCIDR: 10.244.0.0/16,10.245.0.0/16",
            "\"10.244.0.0/16,10.245.0.0/16\" has two CIDRs of one family (at most one IPv4 \
             and one IPv6)",
        ),
    ] {
        let err =
            run_cli(&["kpng", flag, value, "--write-config-to", "-", "version"]).expect_err(value);
        assert_eq!(format!("{err:#}"), format!("{flag}: {says}"));
        let path = dir.path().join("kp.conf");
        std::fs::write(&path, doc(&format!("{field}\n"))).unwrap();
        let err =
            run_cli(&["kpng", "--config", path.to_str().unwrap(), "version"]).expect_err(field);
        assert!(format!("{err:#}").contains(says), "{err:#}");
    }
}

#[test]
fn written_default_configuration_is_kube_proxys_shape() {
    let (flags, _) = run_cli(&["kpng", "version"]).unwrap();
    let text = write::render(&write::effective(&flags).unwrap()).unwrap();
    let want = include_str!("../../testdata/kube-proxy/kpng-effective-defaults.yaml");
    assert_eq!(text, want, "got:\n{text}");
}

#[test]
fn a_node_name_that_no_node_can_have_is_refused() {
    for ok in ["node1", "ip-10-0-0-1.ec2.internal", "NODE1"] {
        let (flags, _) = run_cli(&["kpng", "--hostname-override", ok, "version"])
            .unwrap_or_else(|e| panic!("{ok}: {e:#}"));
        assert_eq!(flags.node_name.as_deref(), Some(ok.to_lowercase().as_str()));
    }
    for (bad, says) in [
        ("$(NODE_NAME)", "environment variable the Pod does not set"),
        ("node_1", "is not a Node's name"),
        ("-node", "is not a Node's name"),
        ("node..1", "is not a Node's name"),
    ] {
        let flag = format!("--hostname-override={bad}");
        let err = run_cli(&["kpng", &flag, "version"])
            .expect_err(bad)
            .to_string();
        assert!(
            // Quoted as typed (not lower-cased): what the operator searches their manifest for.
            err.contains(says) && err.contains(&format!("the node name {bad:?}")),
            "{bad}: {err}"
        );
    }
}

#[test]
fn a_bare_ip_for_a_server_gets_its_default_port_as_in_kube_proxy() {
    let (flags, _) = run_cli(&[
        "kpng",
        "--healthz-bind-address=0.0.0.0",
        "--metrics-bind-address",
        "::",
        "version",
    ])
    .expect("bare IPs");
    let shown = |flags: &crate::cli::GlobalFlags| flags.healthz_bind_address.map(|a| a.to_string());
    assert_eq!(shown(&flags).as_deref(), Some("0.0.0.0:10256"));
    assert_eq!(flags.metrics_bind_address, "[::]:10249");
    let (flags, _) =
        run_cli(&["kpng", "--healthz-bind-address=[::1]:9999", "version"]).expect("IP:port");
    assert_eq!(shown(&flags).as_deref(), Some("[::1]:9999"));
    let err = run_cli(&["kpng", "--healthz-bind-address=localhost", "version"])
        .expect_err("a name")
        .to_string();
    assert!(
        err.contains("\"localhost\" is not IP:port or an IP"),
        "{err}"
    );
}

#[test]
fn write_config_to_reads_back_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kp.conf");
    // -v=7 is trace, as 5 is; the file keeps the number the operator chose.
    let (flags, _) = run_cli(&["kpng", "--proxy-mode=nftables", "-v=7"]).unwrap();
    let written = write::render(&write::effective(&flags).unwrap()).unwrap();
    assert!(written.contains("\n  verbosity: 7\n"), "{written}");
    std::fs::write(&path, &written).unwrap();
    let config = path.to_str().unwrap();
    let (again, _) = run_cli(&["kpng", "--config", config]).unwrap();
    let rewritten = write::render(&write::effective(&again).unwrap()).unwrap();
    assert_eq!(rewritten, written);
    // --log-level wins over the file's number: the level in force is written.
    let (debug, _) = run_cli(&["kpng", "--config", config, "--log-level=debug"]).unwrap();
    let text = write::render(&write::effective(&debug).unwrap()).unwrap();
    assert!(text.contains("\n  verbosity: 4\n"), "{text}");
    // What the file cannot carry is named, not written as if it could.
    assert!(write::not_written(&flags).is_empty());
    let (zero, _) = run_cli(&[
        "kpng",
        "--min-sync-period=0s",
        "--metrics-bind-address=",
        "--healthz-bind-address=",
    ])
    .unwrap();
    let lost = write::not_written(&zero);
    assert_eq!(lost.len(), 3, "{lost:?}");
    assert!(lost[0].starts_with("--min-sync-period=0s"), "{lost:?}");
    assert!(
        lost[1].starts_with("--healthz-bind-address=\"\""),
        "{lost:?}"
    );
    assert!(
        lost[2].starts_with("--metrics-bind-address=\"\""),
        "{lost:?}"
    );
}

/// An IPv6 cluster's file (kubeadm writes `bindAddress: "::"`) is written back as it was read,
/// not as an IPv4 one whose listen defaults differ.
#[test]
fn an_ipv6_clusters_unspecified_bind_address_is_written_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kp.conf");
    std::fs::write(&path, doc("bindAddress: \"::\"\nmode: nftables\n")).unwrap();
    let config = path.to_str().unwrap();
    let (flags, _) = run_cli(&["kpng", "--config", config]).unwrap();
    let written = write::render(&write::effective(&flags).unwrap()).unwrap();
    assert!(written.contains("\nbindAddress: \"::\"\n"), "{written}");
    assert!(written.contains("[::]:10256"), "{written}");
    std::fs::write(&path, &written).unwrap();
    let (again, _) = run_cli(&["kpng", "--config", config]).unwrap();
    assert_eq!(
        write::render(&write::effective(&again).unwrap()).unwrap(),
        written
    );
    // An IPv4 cluster's stays 0.0.0.0.
    let (v4, _) = run_cli(&["kpng", "--proxy-mode=nftables"]).unwrap();
    let written = write::render(&write::effective(&v4).unwrap()).unwrap();
    assert!(
        written.contains("\nbindAddress: \"0.0.0.0\"\n"),
        "{written}"
    );
}

/// kube-proxy's processHostnameOverrideFlag: an empty --hostname-override (an empty
/// `$(NODE_NAME)`) is ignored, so the file's hostnameOverride stays (or, without one, the OS
/// hostname: `None`); spaces only are an error; anything else wins, trimmed and lower-cased.
/// An empty `--nodeport-addresses=` (an empty `$(VAR)`): pflag's empty list, unset for
/// kube-proxy; the file's value stays, and without a file the backend's default applies.
#[test]
fn an_empty_nodeport_addresses_flag_is_unset() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kp.conf");
    std::fs::write(&path, doc("nodePortAddresses: [10.0.0.0/8]\n")).unwrap();
    let config = path.to_str().unwrap();
    let (flags, _) = run_cli(&[
        "kpng",
        "--config",
        config,
        "--nodeport-addresses=",
        "version",
    ])
    .expect("an empty flag is accepted");
    assert_eq!(flags.nodeport_addresses, ["10.0.0.0/8"]);
    let (flags, _) =
        run_cli(&["kpng", "--nodeport-addresses=", "version"]).expect("an empty flag alone");
    assert!(flags.nodeport_addresses.is_empty());
}

#[test]
fn an_empty_hostname_override_leaves_the_files_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kp.conf");
    std::fs::write(&path, doc("hostnameOverride: From-File\n")).unwrap();
    let config = path.to_str().unwrap();
    let none: Option<&str> = None;
    for (line, want) in [
        (vec!["--hostname-override="], Ok(Some("from-file"))),
        (vec!["--hostname-override", ""], Ok(Some("from-file"))),
        (vec!["--node-name="], Ok(Some("from-file"))),
        (vec!["--hostname-override= Node2 "], Ok(Some("node2"))),
        (vec![], Ok(Some("from-file"))),
        (
            vec!["--hostname-override=  "],
            Err("--hostname-override \"  \": empty hostname-override is invalid"),
        ),
    ] {
        let mut args = vec!["kpng", "--config", config];
        args.extend(&line);
        args.push("version");
        match (run_cli(&args), want) {
            (Ok((flags, _)), Ok(name)) => assert_eq!(flags.node_name.as_deref(), name, "{line:?}"),
            (Err(e), Err(says)) => assert_eq!(format!("{e:#}"), says, "{line:?}"),
            (got, _) => panic!("{line:?}: {:?}", got.map(|(f, _)| f.node_name)),
        }
        // Without a file: an empty flag is no name (the OS hostname), as without the flag.
        let mut args = vec!["kpng"];
        args.extend(&line);
        args.push("version");
        if let Ok(Some(name)) = want {
            let (flags, _) = run_cli(&args).unwrap();
            let expect = if name == "from-file" {
                none
            } else {
                Some(name)
            };
            assert_eq!(
                flags.node_name.as_deref(),
                expect,
                "{line:?} without --config"
            );
        }
    }
}

/// kube-proxy decodes leniently when strict decoding fails: a key given twice keeps its last
/// value (with a warning naming it and its line, in YAML and JSON alike), and sigs.k8s.io/yaml reads the first
/// document only (later ones warn when they hold anything).
#[test]
fn repeated_keys_and_later_documents_are_lenient_as_in_kube_proxy() {
    for (text, cidr, warning) in [
        (
            doc("clusterCIDR: 10.1.0.0/16\nclusterCIDR: 10.2.0.0/16\n"),
            "10.2.0.0/16",
            Some("clusterCIDR (line 4): given twice; the last value is used"),
        ),
        (
            doc("conntrack:\n  min: 1\n  min: 2\nclusterCIDR: 10.2.0.0/16\n"),
            "10.2.0.0/16",
            Some("conntrack.min (line 5): given twice"),
        ),
        (
            format!("{}---\n", doc("clusterCIDR: 10.3.0.0/16\n")),
            "10.3.0.0/16",
            None,
        ),
        (
            format!("---\n{}...\n# done\n", doc("clusterCIDR: 10.3.0.0/16\n")),
            "10.3.0.0/16",
            None,
        ),
        (
            format!(
                "{}---\n{}",
                doc("clusterCIDR: 10.3.0.0/16\n"),
                doc("clusterCIDR: 10.4.0.0/16\n")
            ),
            "10.3.0.0/16",
            Some("more than one YAML document: only the first is read"),
        ),
        (
            format!("{}--- \nnot: [valid\n", doc("clusterCIDR: 10.3.0.0/16\n")),
            "10.3.0.0/16",
            Some("more than one YAML document"),
        ),
        // JSON, which kube-proxy reads too: the same warning, key and line.
        (
            "{\"apiVersion\": \"kubeproxy.config.k8s.io/v1alpha1\",\n\
             \"kind\": \"KubeProxyConfiguration\",\n\
             \"clusterCIDR\": \"10.1.0.0/16\",\n\
             \"clusterCIDR\": \"10.2.0.0/16\"}"
                .to_string(),
            "10.2.0.0/16",
            Some("clusterCIDR (line 4): given twice; the last value is used"),
        ),
        (
            "{\"apiVersion\": \"kubeproxy.config.k8s.io/v1alpha1\",\n\
             \"kind\": \"KubeProxyConfiguration\",\n\
             \"conntrack\": {\"min\": 1,\n\"min\": 2},\n\
             \"clusterCIDR\": \"10.2.0.0/16\"}"
                .to_string(),
            "10.2.0.0/16",
            Some("conntrack.min (line 4): given twice"),
        ),
    ] {
        let (settings, report) = from_text(&text).unwrap_or_else(|e| panic!("{text:?}: {e:#}"));
        assert_eq!(
            settings.cluster_cidr,
            [cidr.parse::<ipnet::IpNet>().unwrap()],
            "{text:?}"
        );
        match warning {
            None => assert!(report.warnings.is_empty(), "{text:?}: {report:?}"),
            Some(w) => assert!(
                report.warnings.len() == 1 && report.warnings[0].contains(w),
                "{text:?}: {:?}",
                report.warnings
            ),
        }
    }
}

/// A section given twice: kube-proxy's lenient JSON decoding (sigs.k8s.io/json) decodes the
/// later object into the earlier one, so the two merge field by field; its YAML decoding
/// (sigs.k8s.io/yaml over a generic map) keeps the later mapping whole. The warning says which.
#[test]
fn a_section_given_twice_merges_in_json_and_is_replaced_in_yaml_as_in_kube_proxy() {
    const JSON_HEAD: &str = "{\"kind\": \"KubeProxyConfiguration\",\n\
                             \"apiVersion\": \"kubeproxy.config.k8s.io/v1alpha1\",\n";
    // (what, text, sync period, min sync period, the warning)
    let cases = [
        (
            "JSON: two objects merge",
            format!(
                "{JSON_HEAD}\"mode\": \"nftables\",\n\"nftables\": {{\"syncPeriod\": \"10s\"}},\n\
                 \"nftables\": {{\"minSyncPeriod\": \"2s\"}}}}"
            ),
            10,
            2,
            "nftables (line 5): given twice; merged with the earlier `nftables` (a field given \
             in both takes the later value)",
        ),
        (
            "JSON: a field in both takes the later value",
            format!(
                "{JSON_HEAD}\"mode\": \"nftables\",\n\"nftables\": {{\"syncPeriod\": \"10s\", \"minSyncPeriod\": \"3s\"}},\n\
                 \"nftables\": {{\"syncPeriod\": \"20s\"}}}}"
            ),
            20,
            3,
            "nftables (line 5): given twice; merged with the earlier `nftables`",
        ),
        (
            "JSON: a scalar given twice keeps its last value",
            format!(
                "{JSON_HEAD}\"mode\": \"nftables\",\n\"nftables\": {{\"syncPeriod\": \"10s\",\n\
                 \"syncPeriod\": \"20s\"}}}}"
            ),
            20,
            1,
            "nftables.syncPeriod (line 5): given twice; the last value is used, as",
        ),
        (
            "YAML: the later mapping is used whole",
            doc("mode: nftables\nnftables:\n  syncPeriod: 10s\nnftables:\n  minSyncPeriod: 2s\n"),
            30,
            2,
            "nftables (line 6): given twice; the last value is used whole (the earlier \
             `nftables` mapping is dropped, not merged)",
        ),
        (
            "YAML: a scalar given twice keeps its last value",
            doc("mode: nftables\nnftables:\n  syncPeriod: 10s\n  syncPeriod: 20s\n"),
            20,
            1,
            "nftables.syncPeriod (line 6): given twice; the last value is used, as",
        ),
    ];
    for (what, text, sync, min_sync, warning) in cases {
        let (settings, report) = from_text(&text).unwrap_or_else(|e| panic!("{what}: {e:#}"));
        assert_eq!(
            (settings.sync_period, settings.min_sync_period),
            (Duration::from_secs(sync), Duration::from_secs(min_sync)),
            "{what}"
        );
        assert!(
            report.warnings.len() == 1 && report.warnings[0].contains(warning),
            "{what}: {:?}",
            report.warnings
        );
    }
}

/// What the command line accepts, `--write-config-to` writes and `--config` reads back with
/// the same meaning; what one refuses, the other refuses, naming the flag or the field.
#[test]
fn write_config_to_writes_only_what_config_reads_with_the_same_meaning() {
    // (command line, the client settings the written file reads back to)
    for (line, qps, burst) in [
        (&["--kube-api-qps=-1"][..], Some(-1.0), Some(10)),
        (&["--kube-api-qps=0"][..], Some(-1.0), Some(10)),
        (
            &["--kube-api-qps=20", "--kube-api-burst=0"][..],
            Some(20.0),
            Some(1),
        ),
        (&["--kube-api-burst=30"][..], Some(5.0), Some(30)),
    ] {
        let mut args = vec!["kpng"];
        args.extend(line);
        args.push("version");
        let (flags, _) = run_cli(&args).unwrap_or_else(|e| panic!("{line:?}: {e:#}"));
        let text = write::render(&write::effective(&flags).unwrap()).unwrap();
        let (settings, _) = from_text(&text).unwrap_or_else(|e| panic!("{line:?}: {e:#}"));
        let cc = settings.client_connection;
        assert_eq!(
            (cc.kube_api_qps, cc.kube_api_burst),
            (qps, burst),
            "{line:?}"
        );
        // The rate the source gets is the same: no limit at 0 or less, a bucket of at least 1.
        let limited = |q: f32| q > 0.0;
        let given_qps = flags.client_connection.kube_api_qps.unwrap_or(5.0);
        assert_eq!(limited(given_qps), limited(qps.unwrap_or(5.0)), "{line:?}");
    }
    // (flag, value, the file's line, what both say)
    let dir = tempfile::tempdir().unwrap();
    for (flag, value, field, says) in [
        (
            "--metrics-bind-address",
            ":10249",
            "metricsBindAddress: \":10249\"",
            "\":10249\" is not IP:port",
        ),
        (
            "--metrics-bind-address",
            "localhost:10249",
            "metricsBindAddress: localhost:10249",
            "\"localhost:10249\" is not IP:port",
        ),
        (
            "--detect-local-mode",
            "BridgeInterface",
            "detectLocalMode: BridgeInterface",
            "detectLocal.bridgeInterface",
        ),
        (
            "--detect-local-mode",
            "InterfaceNamePrefix",
            "detectLocalMode: InterfaceNamePrefix\ndetectLocal:\n  interfaceNamePrefix: \" \"",
            "detectLocal.interfaceNamePrefix",
        ),
    ] {
        let err = run_cli(&["kpng", flag, value, "version"]).expect_err(value);
        let err = format!("{err:#}");
        assert!(
            err.contains(flag) && err.contains(says),
            "{flag} {value}: {err}"
        );
        let path = dir.path().join("kp.conf");
        std::fs::write(&path, doc(&format!("{field}\n"))).unwrap();
        let err =
            run_cli(&["kpng", "--config", path.to_str().unwrap(), "version"]).expect_err(field);
        assert!(format!("{err:#}").contains(says), "{field}: {err:#}");
    }
    // A negative QPS in the file is no limit, as kube-proxy reads it.
    let (settings, _) = from_text(&doc("clientConnection:\n  qps: -1\n")).unwrap();
    assert_eq!(settings.client_connection.kube_api_qps, Some(-1.0));
}

/// kube-proxy validates the ipvs section in ipvs mode only and the winkernel section on
/// Windows only: elsewhere such a file loads (with a warning), so that swapping the image
/// never turns a running kube-proxy's ConfigMap into a crash loop.
#[test]
fn sections_of_other_modes_and_systems_are_checked_only_there() {
    use crate::backends::Platform;
    let parse = |body: &str, platform| {
        let parsed = load::parse(&doc(body)).unwrap_or_else(|e| panic!("{body:?}: {e:#}"));
        mapping::map_on(&parsed.config, platform)
    };
    // (file, system, Ok(a warning that contains) or Err(the error that contains))
    let cases: [(&str, Platform, Result<&str, &str>); 7] = [
        (
            "mode: nftables\nipvs:\n  tcpTimeout: -1s\n  udpTimeout: -5m\n",
            Platform::Linux,
            Ok("ipvs.tcpTimeout, ipvs.udpTimeout"),
        ),
        (
            "ipvs:\n  tcpFinTimeout: -1s\n  minSyncPeriod: -2s\n  syncPeriod: -1s\n",
            Platform::Linux,
            Ok("ipvs.minSyncPeriod, ipvs.syncPeriod, ipvs.tcpFinTimeout"),
        ),
        (
            "mode: ipvs\nipvs:\n  tcpTimeout: -1s\n",
            Platform::Linux,
            Err("field ipvs.tcpTimeout: -1s must not be negative (mode ipvs)"),
        ),
        (
            "ipvs:\n  tcpTimeout: -1x\n",
            Platform::Linux,
            Err("field ipvs.tcpTimeout: \"-1x\" is not a duration"),
        ),
        (
            "winkernel:\n  sourceVip: 10.0.0.x\n",
            Platform::Linux,
            Ok("field winkernel.sourceVip: \"10.0.0.x\" is not an IP address"),
        ),
        (
            "winkernel:\n  sourceVip: 10.0.0.x\n",
            Platform::Windows,
            Err("field winkernel.sourceVip: \"10.0.0.x\" is not an IP address"),
        ),
        (
            "winkernel:\n  sourceVip: 10.0.0.9\n",
            Platform::Windows,
            Ok(""),
        ),
    ];
    for (body, platform, want) in cases {
        let got = if body.contains("-1x") {
            load::parse(&doc(body))
                .map(|_| ())
                .map_err(|e| format!("{e:#}"))
        } else {
            parse(body, platform)
                .map(|m| {
                    if let Ok(w) = want
                        && !w.is_empty()
                    {
                        assert!(
                            m.warnings.iter().any(|g| g.contains(w)),
                            "{body:?}: {:?}",
                            m.warnings
                        );
                    }
                })
                .map_err(|e| format!("{e:#}"))
        };
        match (got, want) {
            (Ok(()), Ok(_)) => {}
            (Err(e), Err(w)) => assert!(e.contains(w), "{body:?}: {e}"),
            (got, _) => panic!("{body:?} on {platform:?}: {got:?}"),
        }
    }
    // A negative ipvs duration is written back as read.
    let parsed = load::parse(&doc("ipvs:\n  tcpTimeout: -1m30s\n")).unwrap();
    let text = serde_json::to_value(&parsed.config.ipvs).unwrap();
    assert_eq!(text["tcpTimeout"], "-1m30s");
}

/// `/flagz` lists the values in force once `--config` applied, under kube-proxy's flag
/// names where kube-proxy has the flag, as component-base's page writes them (`name=value`).
#[test]
fn flagz_shows_the_values_in_force_under_kube_proxys_names() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kp.conf");
    std::fs::write(
        &path,
        doc("mode: nftables\nhostnameOverride: from-file\nnftables:\n  syncPeriod: 1m\n  masqueradeBit: 9\nclusterCIDR: 10.244.0.0/16\nclientConnection:\n  qps: 7\n"),
    )
    .unwrap();
    let config = path.to_str().unwrap();
    let args = ["kpng", "--config", config, "--iptables-min-sync-period=2s"];
    let matches = Cli::command().try_get_matches_from(args).unwrap();
    let mut cli = Cli::from_arg_matches(&matches).unwrap();
    apply(&mut cli.global, &matches).unwrap();
    let lines = crate::zpages::effective_flags(&Cli::command(), &matches, &cli.global);
    let config_line = format!("config={config}");
    for want in [
        "hostname-override=from-file",
        "iptables-sync-period=1m0s",
        "iptables-min-sync-period=2s",
        "iptables-masquerade-bit=9",
        "cluster-cidr=10.244.0.0/16",
        "proxy-mode=nftables",
        "kube-api-qps=7",
        "kube-api-burst=10",
        "bind-address=",
        config_line.as_str(),
    ] {
        assert!(lines.iter().any(|l| l == want), "{want}: {lines:#?}");
    }
    for kpng_name in ["node-name=", "sync-period=", "masquerade-bit=", "--"] {
        assert!(
            !lines.iter().any(|l| l.starts_with(kpng_name)),
            "{kpng_name}: {lines:#?}"
        );
    }
}

/// kpng lets flags beside `--config` win where kube-proxy ignores them: one warning names
/// each such flag and its field (in the section of the file's mode); --hostname-override, the logging flags and flags without
/// a file say nothing.
#[test]
fn flags_kube_proxy_would_ignore_beside_config_are_named_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kp.conf");
    std::fs::write(&path, doc("mode: nftables\n")).unwrap();
    let config = path.to_str().unwrap();
    // The field a flag overrode is in the section of the file's mode.
    let iptables_path = dir.path().join("kp-iptables.conf");
    std::fs::write(&iptables_path, doc("mode: iptables\n")).unwrap();
    let iptables_config = iptables_path.to_str().unwrap();
    let warned = |line: &[&str]| -> Vec<String> {
        let (_, report) = run_cli(line).unwrap_or_else(|e| panic!("{line:?}: {e:#}"));
        report
            .flag_warnings
            .into_iter()
            .filter(|w| w.contains("kube-proxy ignores them there"))
            .collect()
    };
    for (line, named) in [
        (
            vec![
                "kpng",
                "--config",
                config,
                "--iptables-sync-period=1m",
                "--cluster-cidr=10.0.0.0/8",
            ],
            Some(
                "--cluster-cidr (clusterCIDR), --sync-period/--iptables-sync-period (nftables.syncPeriod)",
            ),
        ),
        (
            vec![
                "kpng",
                "--config",
                config,
                "--kube-api-qps=9",
                "--masquerade-all",
            ],
            Some(
                "--masquerade-all (nftables.masqueradeAll), --kube-api-qps (clientConnection.qps)",
            ),
        ),
        (
            vec![
                "kpng",
                "--config",
                iptables_config,
                "--iptables-min-sync-period=2s",
                "--iptables-masquerade-bit=3",
            ],
            Some(
                "--masquerade-bit/--iptables-masquerade-bit (iptables.masqueradeBit), \
                 --min-sync-period/--iptables-min-sync-period (iptables.minSyncPeriod)",
            ),
        ),
        (
            vec![
                "kpng",
                "--config",
                config,
                "--hostname-override=n1",
                "-v=4",
                "--logging-format=json",
            ],
            None,
        ),
        (vec!["kpng", "--iptables-sync-period=1m"], None),
    ] {
        let got = warned(&line);
        match named {
            None => assert!(got.is_empty(), "{line:?}: {got:?}"),
            Some(n) => {
                assert_eq!(got.len(), 1, "{line:?}: {got:?}");
                assert!(got[0].ends_with(n), "{line:?}: {}", got[0]);
            }
        }
    }
}

/// An empty `--healthz-bind-address` turns the health server off, as kube-proxy's "Set empty
/// to disable", and so does the deprecated `--healthz-port=0`; an empty `healthzBindAddress`
/// in the file is the default (kube-proxy's defaulting fills it in).
#[test]
fn the_health_server_is_turned_off_as_in_kube_proxy() {
    // (what, the command line, the health server's address)
    let cases: [(&str, &[&str], Option<&str>); 5] = [
        ("default", &["kpng", "version"], Some("0.0.0.0:10256")),
        (
            "empty flag",
            &["kpng", "--healthz-bind-address=", "version"],
            None,
        ),
        (
            "blank flag",
            &["kpng", "--healthz-bind-address", " ", "version"],
            None,
        ),
        (
            "deprecated port 0",
            &["kpng", "--healthz-port=0", "version"],
            None,
        ),
        (
            "deprecated port",
            &["kpng", "--healthz-port=9000", "version"],
            Some("0.0.0.0:9000"),
        ),
    ];
    for (what, args, want) in cases {
        let (flags, _) = run_cli(args).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(
            flags.healthz_bind_address.map(|a| a.to_string()).as_deref(),
            want,
            "{what}"
        );
    }
}

/// A conntrack timeout the kernel's sysctl cannot hold is refused at once, naming the flag
/// and the field, from the file or the line (a dry run says it too): it was a warning
/// without either once kpng ran.
#[test]
fn conntrack_timeouts_beyond_the_kernels_range_are_refused_with_their_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.conf");
    std::fs::write(
        &path,
        doc("conntrack:\n  tcpEstablishedTimeout: 1000000h\n"),
    )
    .unwrap();
    let path = path.to_str().unwrap();
    let err = format!(
        "{:#}",
        run_cli(&["kpng", "--config", path, "version"]).unwrap_err()
    );
    assert_eq!(
        err,
        "--conntrack-tcp-timeout-established (conntrack.tcpEstablishedTimeout): 1000000h0m0s \
         is more than the kernel's conntrack timeouts hold (0 to 596h31m23s; 0 leaves the \
         sysctl to the node)"
    );
    let err = format!(
        "{:#}",
        run_cli(&["kpng", "--conntrack-udp-timeout", "900h", "version"]).unwrap_err()
    );
    assert!(
        err.starts_with("--conntrack-udp-timeout (conntrack.udpTimeout): 900h0m0s is more"),
        "{err}"
    );
    run_cli(&["kpng", "--conntrack-udp-timeout", "596h31m23s", "version"]).unwrap();
}

/// kube-proxy checks minSyncPeriod ≤ syncPeriod whoever gave them: a flag beside the file
/// (or alone) too, so `--write-config-to` never writes a file `--config` refuses.
#[test]
fn the_sync_periods_are_checked_after_the_flags_apply() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.conf");
    std::fs::write(&path, doc("iptables:\n  syncPeriod: 10s\n")).unwrap();
    let path = path.to_str().unwrap();
    for args in [
        &["kpng", "--config", path, "--min-sync-period", "20s"][..],
        &["kpng", "--min-sync-period", "20s", "--sync-period", "10s"][..],
    ] {
        let err = format!("{:#}", run_cli(args).unwrap_err());
        assert!(
            err.starts_with("--min-sync-period (20s) must not exceed --sync-period (10s)"),
            "{args:?}: {err}"
        );
    }
    run_cli(&["kpng", "--config", path, "--min-sync-period", "10s"]).unwrap();
}

/// `--write-config-to` names each flag given that the file cannot hold (kpng's own, a
/// subcommand's, through its environment variable too) and a source or sink other than
/// kube-proxy's; flags with a field, and what only says what the command does, are not named.
#[test]
fn the_flags_a_written_file_cannot_hold_are_named() {
    let keep = ": a kpng flag with no KubeProxyConfiguration field, not in the file: keep it on \
                kpng's command line beside --config";
    let sink = "`file to-file`: the source and sink of this command line have no field: `kpng \
                --config FILE` alone runs kube-proxy's (the `kube` source into the `mode`'s \
                backend), so keep them on kpng's command line beside --config";
    // (command line, the lines)
    let cases: Vec<(Vec<&str>, Vec<String>)> = vec![
        (
            vec!["kpng", "--config", "c", "--hostname-override=n1", "-v=4"],
            vec![],
        ),
        (
            vec![
                "kpng",
                "--bind-address-hard-fail",
                "--proxy-mode=nftables",
                "--dry-run",
            ],
            vec![],
        ),
        (
            vec!["kpng", "--service-cidr=10.96.0.0/12", "version"],
            vec![],
        ),
        (
            vec![
                "kpng",
                "--service-cidr=10.96.0.0/12,fd00::/108",
                "kube",
                "to-local",
                "nft",
            ],
            vec![format!("--service-cidr=10.96.0.0/12,fd00::/108{keep}")],
        ),
        (
            vec![
                "kpng",
                "kube",
                "--admin-socket=/x",
                "to-local",
                "nft",
                "--dry-run",
            ],
            vec![format!("--admin-socket=/x{keep}")],
        ),
        (
            vec!["kpng", "file", "--input", "in.yaml", "to-file"],
            vec![
                format!("--input=in.yaml (of `file`){keep}"),
                sink.to_string(),
            ],
        ),
    ];
    for (line, want) in cases {
        let matches = crate::cli::command().try_get_matches_from(&line).unwrap();
        assert_eq!(
            unwritten::named(&crate::cli::command(), &matches),
            want,
            "{line:?}"
        );
    }
}
