use super::document;
use serde_json::Value;

/// What serde-saphyr reads from `doc`.
fn saphyr(doc: &str) -> Value {
    serde_saphyr::from_str(doc).unwrap_or_else(|e| panic!("the YAML parser refuses {doc:?}: {e}"))
}

/// A Service as `kubectl get service -o yaml` prints it, with managed fields and the
/// last-applied annotation as a block scalar.
const KUBECTL_SERVICE: &str = r#"apiVersion: v1
kind: Service
metadata:
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: |
      {"apiVersion":"v1","kind":"Service","metadata":{"annotations":{},"name":"web","namespace":"default"},"spec":{"ports":[{"port":80}]}}
  creationTimestamp: "2026-11-30T10:00:00Z"
  labels:
    app.kubernetes.io/name: web
  managedFields:
  - apiVersion: v1
    fieldsType: FieldsV1
    fieldsV1:
      f:metadata:
        f:annotations:
          .: {}
          f:kubectl.kubernetes.io/last-applied-configuration: {}
      f:spec:
        f:ports:
          .: {}
          k:{"port":80,"protocol":"TCP"}:
            .: {}
            f:port: {}
    manager: kubectl-client-side-apply
    operation: Update
    time: "2026-11-30T10:00:00Z"
  name: web
  namespace: default
  resourceVersion: "4711"
  uid: 5f3a9c2e-4b1d-4c2a-9e7f-0123456789ab
spec:
  clusterIP: 10.96.12.34
  clusterIPs:
  - 10.96.12.34
  internalTrafficPolicy: Cluster
  ipFamilies:
  - IPv4
  ipFamilyPolicy: SingleStack
  ports:
  - name: http
    port: 80
    protocol: TCP
    targetPort: 8080
  - name: metrics   # scraped by Prometheus
    port: 9090
    targetPort: metrics
  selector:
    app.kubernetes.io/name: web
  sessionAffinity: None
  type: ClusterIP
status:
  loadBalancer: {}
"#;

#[test]
fn reads_what_the_yaml_parser_reads() {
    let cases = [
        KUBECTL_SERVICE,
        // The benchmark's compact style: flow mappings and sequences on one line.
        "kind: Service\nmetadata: {namespace: bench, name: s17}\nspec:\n  type: NodePort\n  clusterIP: 10.96.0.18\n  ports: [{name: http, port: 80, protocol: TCP, nodePort: 20017}]\n",
        "kind: EndpointSlice\nmetadata: {namespace: bench, name: s17-v4, labels: {kubernetes.io/service-name: s17}}\naddressType: IPv4\nports: [{name: http, port: 8080, protocol: TCP}]\nendpoints:\n- {addresses: [10.128.0.69], nodeName: node7}\n- addresses: [\"fd00::1\", 2001:db8::5]\n  conditions: {ready: true, serving: true, terminating: false}\n",
        // Sequences indented under their key, nested and compact.
        "a:\n  - x\n  - - w\n    - z\n  -\n    k: v\n  -\nb: []\nc: {}\n",
        // Comments everywhere they may stand, blank lines, an empty value.
        "# head\nkind: Service # trailing\n\nmetadata:   # after a key\n  name: 'it''s'\n  # between\n  namespace: \"a \\\"b\\\" \\u00e9\\x41 \\\\ \\/ #x\"\nspec:\nz: a#b\n",
        // Scalars: integers, booleans, nulls, addresses, CIDRs, UIDs, URLs, durations.
        "i: 0\nneg: -5\nflow: [-1, -a]\nbig: 922337203685477580\nt: true\nf: false\nnull1: null\nnull2: ~\nv4: 10.96.0.10\nv6: fd00::10\nfull6: 1:2:3:4:5:6:7:8\ncidr: 10.0.0.0/8\nuid: 5f3a9c2e-4b1d\nurl: http://example.com:8080/x\nd: 10s\ndot: .\ndash: -foo\n",
        // Block scalars: clip, strip and keep, with blank and comment-like lines inside.
        "a: |\n  one\n\n  # not a comment\n    indented\nb: |-\n  stripped\n\n\nc: |+\n  kept\n\nd: x\n",
        "- k: |\n    in a compact mapping\n  j: 1\n",
        // A whole document indented.
        "  a: 1\n  b:\n  - 2\n",
        // Quoted keys.
        "\"quoted key\": 1\n'single': 2\n",
        "k: {\"q\": 'v', a b: c d}\n",
    ];
    for doc in cases {
        assert_eq!(document(doc), Some(saphyr(doc)), "{doc}");
    }
}

#[test]
fn leaves_everything_else_to_the_yaml_parser() {
    let cases = [
        // Structures outside the subset.
        "a: &x 1\nb: *x\n",
        "a: !!str 80\n",
        "a: >\n  folded\n",
        "- |\n  a block scalar as an item\n",
        "a: |2\n  explicit\n",
        "a: plain\n  continued\n",
        "- a\n  b\n",
        "a: \"multi\n  line\"\n",
        "a: [1,\n  2]\n",
        "a: [1, 2, ]\n",
        "a: {b:1}\n",
        "a: {b: 1, c}\n",
        "a: [b: c]\n",
        "a: b: c\n",
        "? a\n: b\n",
        "%YAML 1.2\n---\na: 1\n",
        "a:\tb\n",
        "a: 1\na: 2\n",
        "a: {b: 1, b: 2}\n",
        "a: 1\n - b\n",
        "a:\n  b: 1\n c: 2\n",
        "<<: {a: 1}\n",
        // Scalars YAML readings type differently, or serde-saphyr specially.
        "a: yes\n",
        "a: True\n",
        "a: NULL\n",
        "a: .inf\n",
        "a: 0x1F\n",
        "a: 1_000\n",
        "a: 007\n",
        "a: 1e3\n",
        "a: 1.5\n",
        "a: 12:30\n",
        "a: 2026-12-02\n",
        "a: +5\n",
        "a: 12345678901234567890\n",
        "a: \"\\ud83d\\ude00\"\n",
        "a: \"\\e\"\n",
        "yes: 1\n",
        "80: x\n",
        "",
        "# only a comment\n",
    ];
    for doc in cases {
        assert_eq!(document(doc), None, "{doc:?}");
    }
}

/// Every document of every YAML file in the repository (examples, deployment manifests, test
/// data) that the subset reader takes reads as the YAML parser reads it.
#[test]
fn every_yaml_file_of_the_repository_reads_the_same() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dirs = [
        "examples",
        "deploy",
        "crates/api/tests/data",
        "crates/kpng/testdata/kube-proxy",
    ];
    let (mut documents, mut taken) = (0, 0);
    for dir in dirs {
        for entry in std::fs::read_dir(root.join(dir)).expect("a directory of the repository") {
            let path = entry.expect("entry").path();
            if path.extension().is_none_or(|e| e != "yaml") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("readable");
            for (_, doc) in super::super::documents(&text) {
                documents += 1;
                if let Some(value) = document(&doc) {
                    taken += 1;
                    assert_eq!(value, saphyr(&doc), "{}: {doc}", path.display());
                }
            }
        }
    }
    println!("{taken} of {documents} documents taken by the subset reader");
    assert!(
        taken * 2 > documents,
        "only {taken} of {documents} documents were taken"
    );
}

/// A small deterministic generator (xorshift), so that the differential test below is the
/// same on every run.
struct Random(u64);

impl Random {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.below(from.len())]
    }
}

/// Keys and scalars outside the subset, or on its edge (the safe ones are below).
const OTHER_KEYS: &[&str] = &[
    "app.kubernetes.io/name",
    "y",
    "80",
    "-k",
    "a#b",
    "a #b",
    "on",
    "_x",
    "<<",
    "? x",
    "a:b",
];

const OTHER_SCALARS: &[&str] = &[
    "-0",
    "+5",
    "007",
    "1.5",
    ".5",
    "1e3",
    "1_000",
    "0x1F",
    "12:30",
    "2026-12-02",
    "2001:db8::1",
    "1:2:3:4:5:6:7:8",
    "10s",
    "yes",
    "No",
    "True",
    "false",
    "Null",
    ".inf",
    "nan",
    "-",
    "'a",
    "\"\\x41\\t\"",
    "\"\\e\"",
    "\"a",
    "[a,]",
    "{a:1}",
    "[a: b]",
    "{a: }",
    "{\"a\": 1}",
    "&x a",
    "*x",
    "!!str 1",
    "a: b",
    "x:",
    "@a",
    "`a",
    "%a",
    "a  ",
    "=",
    "<<",
    "9223372036854775807",
    "99999999999999999999",
];

/// Keys and scalars inside the subset, picked most of the time so that most documents are.
const SAFE_KEYS: &[&str] = &[
    "a",
    "b",
    "name",
    "f:spec",
    "k:{\"port\":80}",
    ".",
    "a b",
    "\"q k\"",
    "'s'",
];
const SAFE_SCALARS: &[&str] = &[
    "80",
    "-5",
    "0",
    "10.0.0.1",
    "10.0.0.0/8",
    "fd00::1",
    "5f3a9c2e-4b1d",
    "true",
    "null",
    "~",
    "a b",
    "a #c",
    "a#c",
    "http://x:80/y",
    "-a",
    "'q''s'",
    "\"e\\u00e9 \\\"\"",
    "[a, b]",
    "{a: 1, b: [c]}",
    "[]",
    "{}",
    "[fd00::1, 10.0.0.1]",
    "[-1, -a]",
];

fn key<'a>(r: &mut Random) -> &'a str {
    if r.below(12) == 0 {
        r.pick(OTHER_KEYS)
    } else {
        r.pick(SAFE_KEYS)
    }
}

fn scalar<'a>(r: &mut Random) -> &'a str {
    if r.below(12) == 0 {
        r.pick(OTHER_SCALARS)
    } else {
        r.pick(SAFE_SCALARS)
    }
}

/// One random node at `indent` (the column of its parent's key), appended to `out` after a
/// key or a dash.
fn node(r: &mut Random, out: &mut String, indent: usize, depth: usize) {
    match if depth == 0 { 0 } else { r.below(6) } {
        0 | 1 => {
            out.push(' ');
            out.push_str(scalar(r));
            out.push('\n');
        }
        2 => {
            out.push('\n');
            for _ in 0..1 + r.below(3) {
                out.push_str(&" ".repeat(indent + 2));
                out.push_str(key(r));
                out.push(':');
                node(r, out, indent + 2, depth - 1);
            }
        }
        3 => {
            // A sequence at the key's column (kubectl) or indented.
            let at = if r.below(2) == 0 { indent } else { indent + 2 };
            out.push('\n');
            for _ in 0..1 + r.below(3) {
                out.push_str(&" ".repeat(at));
                out.push('-');
                if r.below(3) == 0 {
                    // A compact mapping.
                    out.push(' ');
                    out.push_str(key(r));
                    out.push(':');
                    node(r, out, at + 2, depth - 1);
                    out.push_str(&" ".repeat(at + 2));
                    out.push_str(key(r));
                    out.push(':');
                    node(r, out, at + 2, depth - 1);
                } else {
                    node(r, out, at, depth - 1);
                }
            }
        }
        4 => {
            out.push_str(if r.below(12) == 0 {
                r.pick(&[" >", " |2", " | # c"])
            } else {
                r.pick(&[" |", " |-", " |+"])
            });
            out.push('\n');
            let inner = indent + 2 + r.below(2);
            for _ in 0..1 + r.below(3) {
                let line = r.pick(&["text", "# not a comment", "", "  more", "a: b", "- c"]);
                if !line.is_empty() {
                    out.push_str(&" ".repeat(inner));
                }
                out.push_str(line);
                out.push('\n');
            }
        }
        _ => {
            out.push_str(r.pick(&["", " # comment"]));
            out.push('\n');
            out.push_str(&" ".repeat(indent + r.below(2) * 2));
            out.push_str(scalar(r));
            out.push('\n');
        }
    }
}

/// Random documents mixing the subset with what lies outside it: whenever the subset reader
/// takes one, the YAML parser reads the same value from it (and does not refuse it).
#[test]
fn random_documents_read_the_same_or_are_left_to_the_yaml_parser() {
    let mut r = Random(0x9e37_79b9_7f4a_7c15);
    let (mut taken, mut total) = (0, 0);
    for _ in 0..20_000 {
        let mut doc = String::new();
        for _ in 0..1 + r.below(4) {
            doc.push_str(key(&mut r));
            doc.push(':');
            node(&mut r, &mut doc, 0, 3);
        }
        total += 1;
        let Some(value) = document(&doc) else {
            continue;
        };
        taken += 1;
        match serde_saphyr::from_str::<Value>(&doc) {
            Ok(expected) => assert_eq!(value, expected, "{doc}"),
            Err(e) => panic!("the subset reader takes what the YAML parser refuses ({e}):\n{doc}"),
        }
    }
    println!("{taken} of {total} random documents taken by the subset reader");
    assert!(
        taken * 4 > total,
        "only {taken} of {total} taken: the test no longer tests"
    );
}
