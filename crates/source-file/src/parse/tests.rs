//! Parser tests: streams, lists, and errors that say where.

use super::*;

const STREAM: &str = r#"
# a comment before the first document
apiVersion: v1
kind: Service
metadata: {namespace: default, name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: default
  name: web-abc
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.244.1.2]
  nodeName: node-a
---
apiVersion: v1
kind: ConfigMap
metadata: {namespace: default, name: ignored}
---
apiVersion: v1
kind: Node
metadata: {name: node-a}
---
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: kubernetes}
spec: {cidrs: [10.96.0.0/16]}
---
"#;

#[test]
fn parses_a_yaml_stream_and_skips_unknown_kinds() {
    let loaded = parse_manifests(STREAM).expect("parses");
    let kinds: Vec<&str> = loaded.objects.iter().map(|o| o.kind().as_str()).collect();
    assert_eq!(kinds, ["Service", "EndpointSlice", "Node", "ServiceCIDR"]);
    assert_eq!(
        loaded.skipped_kinds.iter().collect::<Vec<_>>(),
        ["ConfigMap"]
    );
}

#[test]
fn parses_kubectl_list_output() {
    let text = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {namespace: a, name: s1}
  spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {namespace: a, name: s1-x, labels: {kubernetes.io/service-name: s1}}
  addressType: IPv4
  endpoints: []
metadata: {resourceVersion: ""}
---
apiVersion: v1
kind: ServiceList
items:
- metadata: {namespace: a, name: s2}
  spec: {clusterIP: 10.96.0.2, ports: [{port: 80}]}
"#;
    let loaded = parse_manifests(text).expect("parses");
    let names: Vec<String> = loaded
        .objects
        .iter()
        .map(|o| o.reference().to_string())
        .collect();
    assert_eq!(
        names,
        ["Service a/s1", "EndpointSlice a/s1-x", "Service a/s2"]
    );
}

/// Each of `got` starts with the `want` at its place, and there are as many.
fn assert_prefixes(case: &str, got: &[String], want: &[&str]) {
    assert_eq!(got.len(), want.len(), "{case}: {got:#?}");
    for (got, want) in got.iter().zip(want) {
        assert!(
            got.starts_with(want),
            "{case}: got {got:?}, want prefix {want:?}"
        );
    }
}

#[test]
fn unreadable_documents_reject_the_file_naming_each_place() {
    struct Case {
        name: &'static str,
        text: &'static str,
        want: &'static [&'static str],
    }
    let cases = [
        Case {
            name: "YAML syntax error in document 2",
            text: "kind: Node\nmetadata: {name: a}\n---\nkind: Service\nmetadata: {name: [oops\n",
            // The position is the file's line, not the document's.
            want: &["document 2 (line 4): invalid YAML: unclosed bracket '[' at line 5, column 18"],
        },
        Case {
            name: "JSON with a repeated key (refused as YAML refuses it)",
            text: r#"{"kind": "Node", "metadata": {"name": "a"}, "kind": "Node"}"#,
            want: &["document 1 (line 1): invalid YAML: duplicate mapping key: kind"],
        },
        Case {
            name: "empty file",
            text: "# nothing here\n---\n",
            want: &["document 1 (line 1): the file holds no document"],
        },
        Case {
            name: "missing kind",
            text: "metadata: {name: a}\n",
            want: &["document 1 (line 1), field kind: missing"],
        },
        Case {
            name: "a wrong type in an object without a name (nothing to keep it by)",
            text: "kind: Service\nmetadata: {namespace: ns}\nspec: {ports: [{port: eighty}]}\n",
            want: &["document 1 (line 1), Service, field spec.ports[0].port: invalid type"],
        },
        Case {
            // What made the load fail first (the status shows the first error), though the
            // rejected object comes earlier in the file: until 2026-12-07 the status said
            // `not loaded: document 1 …, Service ns/web, field spec.ports[0].port … (and 1
            // more error)`, blaming the object.
            name: "objects that would be rejected are named after what makes the file unreadable",
            text: "kind: Service\nmetadata: {namespace: ns, name: web}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 0}]}\n---\nkind: Service\nmetadata: {namespace: exj, name: typo}\nspec: {clusterIP: 10.96.0.2, ports: [{port: 80, protocol: TPC}]}\n---\nkind: Service\nmetadata: {name: [oops\n",
            want: &[
                "document 3 (line 9): invalid YAML",
                "document 1 (line 1), Service ns/web, field spec.ports[0].port: port 0 is not in 1-65535",
                "document 2 (line 5), Service exj/typo, field spec.ports[0].protocol: unknown protocol",
            ],
        },
        Case {
            name: "every unreadable document, in file order; readable ones between them load",
            text: "kind: Node\nmetadata: {name: [oops\n---\nkind: Node\nmetadata: {name: fine}\n---\nmetadata: {name: b}\n---\nkind: List\nitems:\n- kind: Node\n  metadata: {name: c}\n- metadata: {name: d}\n",
            want: &[
                "document 1 (line 1): invalid YAML",
                "document 3 (line 7), field kind: missing",
                "document 4 item 2 (line 9), field kind: missing",
            ],
        },
    ];
    for case in cases {
        let errors = parse_manifests(case.text).expect_err(case.name);
        let got: Vec<String> = errors.errors.iter().map(ToString::to_string).collect();
        assert_prefixes(case.name, &got, case.want);
        let shown = errors.to_string();
        assert!(shown.starts_with(case.want[0]), "{}: {shown}", case.name);
        assert!(
            errors.summary().starts_with(case.want[0]),
            "{}: {}",
            case.name,
            errors.summary()
        );
        let more = case.want.len() - 1;
        assert_eq!(
            shown.contains(&format!("(and {more} more error")),
            more > 0,
            "{}: {shown}",
            case.name
        );
    }
}

/// An object that names itself but cannot be used is rejected alone (the model keeps its last
/// good version, as for a broken object from the API server): the rest of the file loads, and
/// the rejection says where the object is.
#[test]
fn a_broken_object_is_rejected_alone_and_the_rest_loads() {
    struct Case {
        name: &'static str,
        text: &'static str,
        /// Each rejection, as the runner shows it (before "; keeping its last good version").
        rejected: &'static [&'static str],
        /// The objects used.
        used: usize,
    }
    let cases = [
        Case {
            name: "wrong type",
            text: "kind: Node\nmetadata: {name: a}\n---\nkind: Service\nmetadata: {namespace: ns, name: web}\nspec: {clusterIP: 10.96.0.1, ports: [{port: eighty}]}\n",
            rejected: &[
                "Service ns/web (document 2 (line 4)): field spec.ports[0].port: invalid type",
            ],
            used: 1,
        },
        Case {
            name: "invalid value",
            text: "kind: Service\nmetadata: {namespace: ns, name: web}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 0}]}\n",
            rejected: &[
                "Service ns/web (document 1 (line 1)): field spec.ports[0].port: port 0 is not in 1-65535",
            ],
            used: 0,
        },
        Case {
            name: "list item",
            text: "kind: List\nitems:\n- kind: Node\n  metadata: {name: a}\n- kind: EndpointSlice\n  metadata: {namespace: ns, name: s}\n  addressType: IPv4\n  endpoints: []\n  ports: [{name: x, port: 99999}]\n",
            rejected: &["EndpointSlice ns/s (document 1 item 2 (line 1)): field ports[0].port"],
            used: 1,
        },
        Case {
            name: "JSON list item",
            text: r#"{"kind": "List", "items": [{"kind": "Service", "metadata": {"namespace": "ns", "name": "web"}, "spec": {"ports": [{"port": "eighty"}]}}, {"kind": "Node", "metadata": {"name": "a"}}]}"#,
            rejected: &[
                "Service ns/web (document 1 item 1 (line 1)): field spec.ports[0].port: invalid type",
            ],
            used: 1,
        },
        Case {
            name: "two broken objects, each named",
            text: "kind: Service\nmetadata: {namespace: ns, name: a}\nspec: {clusterIP: 10.96.0.300, ports: [{port: 80}]}\n---\nkind: Service\nmetadata: {namespace: ns, name: b}\nspec: {clusterIP: 10.96.0.2, ports: [{port: 80, protocol: TCPX}]}\n---\nkind: Service\nmetadata: {namespace: ns, name: c}\nspec: {clusterIP: 10.96.0.3, ports: [{port: 80}]}\n",
            rejected: &[
                "Service ns/a (document 1 (line 1)): field spec.clusterIP",
                "Service ns/b (document 2 (line 5)): field spec.ports[0].protocol",
            ],
            used: 1,
        },
        Case {
            name: "defined twice: neither copy is used",
            text: "kind: Node\nmetadata: {name: a}\n---\nkind: Node\nmetadata: {name: b}\n---\nkind: Node\nmetadata: {name: a}\n",
            rejected: &[
                "Node a (document 1 (line 1)): field metadata.name: defined 2 times in the file (document 1 (line 1), document 3 (line 7)); none of them is used",
            ],
            used: 1,
        },
    ];
    for case in cases {
        let loaded = parse_manifests(case.text).expect(case.name);
        let rejected: Vec<String> = loaded
            .objects
            .iter()
            .filter_map(|o| match o {
                Object::Rejected(e) => Some(e.to_string()),
                _ => None,
            })
            .collect();
        assert_prefixes(case.name, &rejected, case.rejected);
        assert_eq!(loaded.rejected(), case.rejected.len(), "{}", case.name);
        assert_eq!(
            loaded.objects.len() - rejected.len(),
            case.used,
            "{}",
            case.name
        );
    }
}

#[test]
fn a_rejected_objects_location_names_its_file() {
    let text = "kind: Service\nmetadata: {namespace: ns, name: web}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 0}]}\n";
    let mut loaded = parse_manifests(text).expect("loads");
    loaded.locate_in(std::path::Path::new("/etc/kpng/cluster.yaml"));
    let Some(Object::Rejected(e)) = loaded.objects.first() else {
        panic!("expected a rejection: {:?}", loaded.objects)
    };
    assert_eq!(
        e.to_string(),
        "Service ns/web (/etc/kpng/cluster.yaml: document 1 (line 1)): field spec.ports[0].port: port 0 is not in 1-65535"
    );
}

#[test]
fn kubectl_json_output_reads_as_its_yaml_does() {
    let yaml = r#"
kind: List
items:
- kind: Service
  metadata: {namespace: a, name: s1, labels: {app: web}}
  spec: {type: NodePort, clusterIP: 10.96.0.1, ports: [{name: http, port: 80, nodePort: 30080}], sessionAffinity: ClientIP}
- kind: EndpointSlice
  metadata: {namespace: a, name: s1-x, labels: {kubernetes.io/service-name: s1}}
  addressType: IPv4
  ports: [{name: http, port: 8080, protocol: TCP}]
  endpoints:
  - {addresses: [10.244.1.2], nodeName: node-a, conditions: {ready: true, serving: true, terminating: false}}
  - {addresses: [10.244.2.2], nodeName: node-b, conditions: {ready: false}, zone: z1}
"#;
    let as_yaml = parse_manifests(yaml).expect("YAML parses");
    let value: Value = serde_saphyr::from_str(yaml).expect("YAML");
    let json = serde_json::to_string_pretty(&value).expect("JSON");
    assert!(
        super::json::document(&json).is_some(),
        "the JSON path takes it"
    );
    let as_json = parse_manifests(&json).expect("JSON parses");
    assert_eq!(
        format!("{:?}", as_json.objects),
        format!("{:?}", as_yaml.objects)
    );
    assert_eq!(as_json.objects.len(), 2);
}

#[test]
fn an_explicitly_empty_list_is_fine() {
    let loaded = parse_manifests("kind: List\nitems: []\n").expect("parses");
    assert!(loaded.objects.is_empty());
}

#[test]
fn a_list_of_100k_services_loads() {
    use std::fmt::Write as _;
    let mut text = String::from("apiVersion: v1\nkind: List\nitems:\n");
    for i in 0..100_000u32 {
        let _ = write!(
            text,
            "- apiVersion: v1\n  kind: Service\n  metadata: {{namespace: ns, name: s{i}}}\n  \
             spec:\n    clusterIP: 10.{}.{}.{}\n    ports: [{{name: p, port: 80, protocol: TCP}}]\n",
            (i >> 16) & 255,
            (i >> 8) & 255,
            i & 255
        );
    }
    let loaded = parse_manifests(&text).expect("100k Services");
    assert_eq!(loaded.objects.len(), 100_000);
}

#[test]
fn an_alias_bomb_is_refused_naming_the_limit() {
    // Each level doubles: 2^24 nodes out of a few hundred bytes.
    let mut text = String::from("a0: &a0 [x, x]\n");
    for i in 1..25 {
        text.push_str(&format!("a{i}: &a{i} [*a{}, *a{}]\n", i - 1, i - 1));
    }
    let err = parse_manifests(&text).expect_err("bomb").to_string();
    assert!(
        err.contains("budget")
            && err.contains("scale with")
            && err.contains("raise --max-yaml-expansion"),
        "{err}"
    );
}

#[test]
fn a_raised_expansion_limit_lets_a_document_with_aliases_through() {
    // ≈2^18 nodes out of a few hundred bytes: over the default budget (250,000 nodes for a
    // small document), within 1,024 nodes per byte.
    let mut text =
        String::from("apiVersion: v1\nkind: Node\nmetadata: {name: n1}\nx0: &a0 [x, x]\n");
    for i in 1..16 {
        text.push_str(&format!("x{i}: &a{i} [*a{}, *a{}]\n", i - 1, i - 1));
    }
    let refused = parse_manifests(&text)
        .expect_err("over the default")
        .to_string();
    assert!(
        refused.contains("--max-yaml-expansion 1 nodes per byte"),
        "{refused}"
    );
    let loaded =
        parse_manifests_with(&text, ExpansionLimit(1024)).expect("within the raised limit");
    assert_eq!(loaded.objects.len(), 1);
}

#[test]
fn a_text_without_markers_is_read_as_one_document_and_the_same_as_split_line_by_line() {
    let service = "kind: Service\nmetadata: {namespace: default, name: web}\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{port: 80}]\n";
    let json_list = r#"{"apiVersion": "v1", "kind": "List", "items": [
  {"kind": "Service", "metadata": {"namespace": "default", "name": "web"},
   "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]}}
]}"#;
    // (text, read whole without copying)
    let cases = [
        (service.to_string(), true),
        (service.replace('\n', "\r\n"), true),
        (service.trim_end().to_string(), true),
        (json_list.to_string(), true),
        (format!("---\n{service}"), false),
        (format!("{service}...\n"), false),
        (format!("# ----\n{service}"), true),
    ];
    for (text, whole) in cases {
        let docs = documents(&text);
        assert_eq!(
            matches!(docs.as_slice(), [(1, Cow::Borrowed(_))]),
            whole,
            "{text:?}: {docs:?}"
        );
        // The line-by-line split (forced by a leading separator) reads the same objects.
        // (`Object` has no `PartialEq`: compared by what `Debug` shows of every field.)
        let outcome = |text: &str| {
            parse_manifests(text)
                .map(|l| format!("{:?}", l.objects))
                .map_err(|e| e.to_string())
        };
        let read = outcome(&text);
        assert!(
            read.as_ref().is_ok_and(|o| o.contains("web")),
            "{text:?}: {read:?}"
        );
        assert_eq!(read, outcome(&format!("---\n{text}")), "{text:?}");
    }
}

#[test]
fn a_document_whose_objects_do_not_read_from_the_subset_value_reads_as_the_yaml_parser_reads_it() {
    // A plain `2` is a number in a JSON value, and a label must be a string: the YAML
    // parser, which reads a document into its type, takes it as "2", so it still loads.
    let service = "kind: Service\nmetadata: {namespace: a, name: web, labels: {version: 2}}\n\
                   spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n";
    let loaded = parse_manifests(service).expect("loads as before");
    assert_eq!(loaded.objects.len(), 1);
    // In a `kind: List` both readers go through a generic value, so both refuse the item (it
    // is rejected alone), and the objects read before it are not kept twice.
    let list = "kind: List\nitems:\n\
                - kind: Service\n  metadata: {namespace: a, name: first}\n  spec: {clusterIP: 10.96.0.2, ports: [{port: 80}]}\n\
                - kind: Service\n  metadata: {namespace: a, name: web, labels: {version: 2}}\n  spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n";
    let loaded = parse_manifests(list).expect("the rest loads");
    let [Object::Service(first), Object::Rejected(e)] = loaded.objects.as_slice() else {
        panic!(
            "expected the first Service and a rejection: {:?}",
            loaded.objects
        )
    };
    assert_eq!(&*first.key.name, "first");
    assert_eq!(&*e.object.name, "web");
    assert_eq!(e.field, "metadata.labels.version");
    assert_eq!(e.location.as_deref(), Some("document 1 item 2 (line 1)"));
}

/// The origin of a one-document text's document.
const FIRST: Origin = Origin {
    document: 1,
    item: None,
    line: 1,
    lacks: None,
    absent: false,
};

/// What the whole-document reading of `doc` (the YAML parser's value) loads, and from where.
fn read_whole(doc: &str) -> (Loaded, Vec<Origin>) {
    let value: Value =
        serde_saphyr::from_str_with_options(doc, yaml_options(doc.len(), ExpansionLimit(1)))
            .expect("valid YAML");
    let (mut loaded, mut origins) = (Loaded::default(), Vec::new());
    take(value, FIRST, &mut loaded, &mut origins, Undecodable::Reject).expect("converts");
    (loaded, origins)
}

/// The example cluster's documents as the items of one List, in kubectl's layout.
fn example_as_kubectl_list() -> String {
    let kubectl = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/cluster.yaml"
    ))
    .expect("the example manifest");
    // The example's documents as the items of one List, kubectl's layout.
    let mut as_list = String::from("apiVersion: v1\nitems:\n");
    for doc in kubectl.split("\n---\n") {
        let lines: Vec<&str> = doc
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .collect();
        for (i, line) in lines.iter().enumerate() {
            as_list.push_str(if i == 0 { "- " } else { "  " });
            as_list.push_str(line);
            as_list.push('\n');
        }
    }
    as_list.push_str("kind: List\nmetadata:\n  resourceVersion: \"\"\n");
    as_list
}

/// Which item-by-item reader a case goes through.
#[derive(Debug, Clone, Copy)]
enum Reader {
    Yaml,
    Json,
}

/// (case, a List document, its reader, whether it is read item by item): what is read item by
/// item is what the whole document loads, and anything else is left as it was for the
/// whole-document path.
#[test]
fn a_list_read_item_by_item_loads_what_the_whole_document_loads() {
    let as_list = example_as_kubectl_list();
    let as_json = |yaml: &str| {
        let value: Value = serde_saphyr::from_str(yaml).expect("valid YAML");
        serde_json::to_string_pretty(&value).expect("JSON")
    };
    let cases: Vec<(&str, String, Reader, bool)> = vec![
        ("the example cluster as one kubectl List", as_list.clone(), Reader::Yaml, true),
        (
            "a typed List, items indented, a block scalar",
            "apiVersion: v1\nkind: ServiceList\nitems:\n  - metadata:\n      namespace: a\n      name: s1\n      annotations:\n        note: |\n          - not an item\n    spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n\n  - metadata: {namespace: a, name: s2}\n    spec: {clusterIP: 10.96.0.2, ports: [{port: 81}]}\n".into(),
            Reader::Yaml,
            true,
        ),
        (
            "an item outside the subset (a folded scalar) is read whole",
            "kind: List\nitems:\n- kind: Node\n  metadata:\n    name: a\n    annotations:\n      note: >\n        folded\n        text\n".into(),
            Reader::Yaml,
            false,
        ),
        (
            "an unknown kind among the items",
            "kind: List\nitems:\n- kind: ConfigMap\n  metadata: {name: c}\n- kind: Node\n  metadata: {name: a}\n".into(),
            Reader::Yaml,
            true,
        ),
        (
            "the example cluster as kubectl -o json prints it",
            as_json(&as_list),
            Reader::Json,
            true,
        ),
        (
            "items without a kind of their own (a typed List) are read whole",
            r#"{"apiVersion": "v1", "items": [{"metadata": {"namespace": "a", "name": "s"}, "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}}], "kind": "ServiceList"}"#.to_string(),
            Reader::Json,
            false,
        ),
        (
            "a Service, given up at its kind",
            r#"{"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "a", "name": "s"}, "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}}"#.to_string(),
            Reader::Json,
            false,
        ),
        (
            "not a List",
            r#"{"kind": "Node", "metadata": {"name": "a"}, "items": []}"#.to_string(),
            Reader::Json,
            false,
        ),
    ];
    for (case, doc, reader, by_items) in cases {
        let (mut loaded, mut origins) = (Loaded::default(), Vec::new());
        let taken = match reader {
            Reader::Yaml => take_list_by_items(&doc, FIRST, &mut loaded, &mut origins),
            Reader::Json => take_items(
                FIRST,
                &mut loaded,
                &mut origins,
                Undecodable::Reject,
                |take| json::list_items(&doc, take),
            ),
        }
        .is_some();
        assert_eq!(taken, by_items, "{case}");
        let (whole, whole_origins) = read_whole(&doc);
        if taken {
            assert_eq!(
                format!("{loaded:?} {origins:?}"),
                format!("{whole:?} {whole_origins:?}"),
                "{case}"
            );
        } else {
            assert!(loaded.objects.is_empty() && origins.is_empty(), "{case}");
        }
        assert_eq!(
            format!("{:?}", parse_manifests(&doc).map(|l| l.objects)),
            format!("{:?}", Ok::<_, ManifestError>(whole.objects)),
            "{case}: through parse_manifests"
        );
    }
}

/// A document nested deeper than any manifest is (every way YAML and JSON nest: flow and block
/// sequences and mappings, `- - -` on one line, JSON arrays and objects, inside a Service and
/// at the top) is refused like any unreadable document, naming the place: it must not overflow
/// the stack. Parsed on a thread with a tokio worker's stack (2 MiB), where the file source
/// parses; at 10,000 levels the subset reader overflowed it and aborted kpng.
#[test]
fn a_document_nested_beyond_any_manifest_is_refused_without_exhausting_the_stack() {
    const DEPTH: usize = 100_000;
    let service = |ports: &str| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{namespace: ns, name: deep}}\nspec:\n  ports: {ports}\n"
        )
    };
    let nested = |open: &str, close: &str| format!("{}{}", open.repeat(DEPTH), close.repeat(DEPTH));
    let json_service = |ports: &str| {
        format!(
            r#"{{"apiVersion": "v1", "kind": "Service", "metadata": {{"namespace": "ns", "name": "deep"}}, "spec": {{"ports": {ports}}}}}"#
        )
    };
    let cases = [
        ("flow sequences in a Service", service(&nested("[", "]"))),
        ("flow mappings in a Service", service(&nested("{a: ", "}"))),
        (
            "block sequences on one line",
            format!(
                "kind: Service\nmetadata: {{name: deep}}\nspec:\n  ports:\n  {}x\n",
                "- ".repeat(DEPTH)
            ),
        ),
        (
            "block mappings",
            (0..2_000)
                .map(|i| format!("{}a{i}:\n", " ".repeat(i)))
                .collect::<String>(),
        ),
        ("flow sequences at the top", nested("[", "]")),
        ("JSON arrays in a Service", json_service(&nested("[", "]"))),
        (
            "JSON objects in a Service",
            json_service(&nested(r#"{"a": "#, "}")),
        ),
        (
            "a JSON List's item",
            format!(
                r#"{{"kind": "List", "items": [{}]}}"#,
                json_service(&nested("[", "]"))
            ),
        ),
    ];
    for (case, text) in cases {
        let outcome = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || parse_manifests(&text).map(|l| l.objects.len()))
            .expect("thread")
            .join()
            .expect("the parse returns");
        let errors = outcome.expect_err(case).errors;
        assert_eq!(errors.len(), 1, "{case}: {errors:?}");
        let message = &errors[0].message;
        assert!(
            errors[0].document == 1
                && (message.starts_with("invalid YAML: recursion limit exceeded at line ")
                    || message.starts_with("invalid YAML: nested 65 levels deep at line ")),
            "{case}: {}",
            errors[0]
        );
    }
}

/// A file whose last object lacks a part the API server requires ends where a write was cut
/// off: that object is rejected (its last good version stays, and the sources delete nothing,
/// `ends_rejected`). The same object elsewhere in the file, or followed by another document,
/// is used as written; a headless Service and an ExternalName need no ports.
#[test]
fn a_service_cut_off_at_the_end_of_the_file_is_rejected() {
    let whole = "kind: Service\nmetadata: {namespace: ns, name: a}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n";
    let no_spec = "kind: Service\nmetadata:\n  namespace: ns\n  name: b\n";
    let no_ports = "kind: Service\nmetadata: {namespace: ns, name: b}\nspec:\n  type: ClusterIP\n  clusterIP: 10.96.0.2\n";
    let headless = "kind: Service\nmetadata: {namespace: ns, name: b}\nspec: {clusterIP: None}\n";
    let external = "kind: Service\nmetadata: {namespace: ns, name: b}\nspec: {type: ExternalName, externalName: example.com}\n";
    let cidr = "kind: ServiceCIDR\nmetadata: {name: kubernetes}\n";
    let json = r#"{"kind": "Service", "metadata": {"namespace": "ns", "name": "b"}}"#;
    // (case, text, the field the last object is rejected at, if it is)
    let cases = [
        (
            "a Service without spec",
            format!("{whole}---\n{no_spec}"),
            Some("spec"),
        ),
        (
            "…followed by a comment",
            format!("{whole}---\n{no_spec}---\n# done\n"),
            Some("spec"),
        ),
        (
            "…as the file's only object",
            no_spec.to_string(),
            Some("spec"),
        ),
        ("…in JSON", format!("{whole}---\n{json}\n"), Some("spec")),
        (
            "a Service without ports",
            format!("{whole}---\n{no_ports}"),
            Some("spec.ports"),
        ),
        (
            "a ServiceCIDR without spec",
            format!("{whole}---\n{cidr}"),
            Some("spec"),
        ),
        (
            "a headless Service",
            format!("{whole}---\n{headless}"),
            None,
        ),
        (
            "an ExternalName Service",
            format!("{whole}---\n{external}"),
            None,
        ),
        (
            "a Service without spec before another",
            format!("{no_spec}---\n{whole}"),
            None,
        ),
        (
            "…before a kind kpng skips",
            format!("{no_spec}---\nkind: ConfigMap\nmetadata: {{name: x}}\n"),
            None,
        ),
    ];
    for (case, text, rejected_at) in cases {
        let loaded = parse_manifests(&text).expect(case);
        let last = loaded.objects.last().expect(case);
        match (rejected_at, last) {
            (Some(field), Object::Rejected(e)) => {
                assert_eq!(e.field, field, "{case}");
                assert!(e.message.contains("cut off"), "{case}: {}", e.message);
                assert!(loaded.ends_rejected(), "{case}");
            }
            (None, Object::Service(_) | Object::ServiceCidr(_)) if loaded.rejected() == 0 => {}
            _ => panic!("{case}: {:?}", loaded.objects),
        }
    }
}

/// A rejection carries the Service the object concerns, whichever path made it: a Service's
/// own, an EndpointSlice's by its label (so `kpng status NS/NAME` lists it under the
/// Service), none for a slice without a valid label or another kind.
#[test]
fn a_rejection_names_the_service_it_concerns() {
    const SLICE: &str = "kind: EndpointSlice\nmetadata: {namespace: ns, name: web-1, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nendpoints: []\n";
    // (case, manifest, the first rejection's Service)
    let cases: &[(&str, String, Option<&str>)] = &[
        (
            "slice refused by conversion",
            format!("{SLICE}ports: [{{name: x, port: 99999}}]\n"),
            Some("ns/web"),
        ),
        (
            "slice that does not read",
            format!("{SLICE}ports: [{{name: x, port: eighty}}]\n"),
            Some("ns/web"),
        ),
        (
            "slice defined twice",
            format!("{SLICE}ports: []\n---\n{SLICE}ports: []\n"),
            Some("ns/web"),
        ),
        (
            "slice without the label",
            "kind: EndpointSlice\nmetadata: {namespace: ns, name: s}\naddressType: IPv4\nendpoints: []\nports: [{name: x, port: 99999}]\n".to_string(),
            None,
        ),
        (
            "slice whose label is refused",
            "kind: EndpointSlice\nmetadata: {namespace: ns, name: s, labels: {kubernetes.io/service-name: a/b}}\naddressType: IPv4\nendpoints: []\nports: []\n".to_string(),
            None,
        ),
        (
            "Service refused",
            "kind: Service\nmetadata: {namespace: ns, name: web}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 0}]}\n".to_string(),
            Some("ns/web"),
        ),
        (
            "Service that does not read",
            "kind: Service\nmetadata: {namespace: ns, name: web}\nspec: {clusterIP: 10.96.0.1, ports: [{port: eighty}]}\n".to_string(),
            Some("ns/web"),
        ),
        (
            "Service cut off at the end of the file",
            "kind: Service\nmetadata: {namespace: ns, name: web}\n".to_string(),
            Some("ns/web"),
        ),
        (
            "Node",
            "kind: Node\nmetadata: {name: a}\n---\nkind: Node\nmetadata: {name: a}\n"
                .to_string(),
            None,
        ),
    ];
    for (case, text, want) in cases {
        let loaded = parse_manifests(text).expect(case);
        let service = loaded.objects.iter().find_map(|o| match o {
            Object::Rejected(e) => Some(e.service.as_ref().map(ToString::to_string)),
            _ => None,
        });
        assert_eq!(
            service.unwrap_or_else(|| panic!("{case}: nothing rejected")),
            want.map(String::from),
            "{case}"
        );
    }
}

/// Whether the end of a file reads as a write cut off mid-object (`Loaded::cut_off_end`),
/// which holds a first load back from being the complete list (`watch`), or as a last object
/// written wrong on purpose, which must not: only a rejected last object with the text
/// stopping mid-line, or lacking what its writer had not written yet, looks cut off.
#[test]
fn only_an_end_that_stops_mid_line_or_lacks_a_part_looks_cut_off() {
    let a = "kind: Service\nmetadata: {namespace: ns, name: a}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n---\n";
    let b = "kind: Service\nmetadata:\n  namespace: ns\n  name: b\nspec:\n  clusterIP: 10.96.0.2\n  ports:\n  - name: http\n    port: 80\n    protocol: TCP\n";
    // (case, text, Some("mid-line") / Some(the field it lacks) when it looks cut off)
    let cases: [(&str, String, Option<&str>); 15] = [
        ("a whole file", format!("{a}{b}"), None),
        (
            "cut mid-value: an unknown protocol, no line break",
            format!("{a}{}", &b[..b.len() - 2]),
            Some("mid-line"),
        ),
        (
            // Not covered: what was cut reads as a valid Service (a cut mid-key is not YAML:
            // the whole file is refused, and nothing of it is a list either).
            "cut mid-value, the value valid",
            format!("{a}{}", &b[..b.find("80").expect("80") + 1]),
            None,
        ),
        (
            "cut after ports:",
            format!("{a}{}", &b[..b.find("  - name").expect("ports")]),
            Some("spec.ports"),
        ),
        (
            "cut before a port's number",
            format!("{a}{}", &b[..b.find("    port:").expect("port")]),
            Some("spec.ports[0].port"),
        ),
        (
            "cut after a key with no value yet",
            format!("{a}{}", &b[..b.find(" 80").expect("80")]) + "\n",
            Some("spec.ports[0].port"),
        ),
        (
            "cut before the Service's namespace",
            format!("{a}kind: Service\nmetadata:\n  name: b\n"),
            Some("metadata.namespace"),
        ),
        (
            "written wrong: a port out of range",
            format!("{a}{}", b.replace("port: 80", "port: 99999")),
            None,
        ),
        (
            "written wrong: a port of the wrong type",
            format!("{a}{}", b.replace("port: 80", "port: eighty")),
            None,
        ),
        (
            "written wrong: an unknown protocol",
            format!("{a}{}", b.replace("TCP", "TCPX")),
            None,
        ),
        (
            "written wrong, in flow style on one line",
            format!(
                "{a}kind: Service\nmetadata: {{namespace: ns, name: b}}\nspec: {{clusterIP: 10.96.0.2, ports: [{{port: 99999}}]}}\n"
            ),
            None,
        ),
        (
            "written wrong, in JSON without a line break (as serde_json and json.dump write)",
            format!(
                "{a}{{\"kind\": \"Service\", \"metadata\": {{\"namespace\": \"ns\", \"name\": \"b\"}}, \"spec\": {{\"clusterIP\": \"10.96.0.2\", \"ports\": [{{\"port\": 99999}}]}}}}"
            ),
            None,
        ),
        (
            "written wrong, in flow style without a line break",
            format!(
                "{a}kind: Service\nmetadata: {{namespace: ns, name: b}}\nspec: {{clusterIP: 10.96.0.2, ports: [{{port: 99999}}]}}"
            ),
            None,
        ),
        (
            "cut mid-value, trailing blanks after it",
            format!("{a}{}  \t", &b[..b.len() - 2]),
            Some("mid-line"),
        ),
        (
            "a valid last object without a line break",
            format!("{a}{}", b.trim_end()),
            None,
        ),
    ];
    for (case, text, cut) in cases {
        let loaded = parse_manifests(&text).unwrap_or_else(|e| panic!("{case}: {e}"));
        let got = loaded.cut_off_end(&text);
        match (cut, &got) {
            (None, None) => {}
            (Some("mid-line"), Some(CutOffEnd::MidLine { line, .. })) => {
                assert_eq!(*line, text.trim_end().lines().count(), "{case}");
                assert!(
                    got.as_ref()
                        .is_some_and(|c| c.to_string().contains(&format!("line {line}"))),
                    "{case}"
                );
            }
            (
                Some(field),
                Some(CutOffEnd::Lacking {
                    field: f, object, ..
                }),
            ) => {
                assert_eq!(f, field, "{case}");
                assert!(
                    object == "Service ns/b" || object == "Service b",
                    "{case}: {object}"
                );
            }
            _ => panic!(
                "{case}: expected {cut:?}, got {got:?} from {:?}",
                loaded.objects.last()
            ),
        }
    }
}
