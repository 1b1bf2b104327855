//! Reading a KubeProxyConfiguration file: YAML or JSON, `null` as "unset", unknown fields
//! reported rather than fatal.
//!
//! kube-proxy decodes strictly first and, when only unknown or duplicate fields fail, decodes
//! again leniently and logs it. kpng does the same: unknown fields become a warning that names
//! each of them (an obsolete field such as `udpIdleTimeout`, or a typo), while a known field
//! with a bad value is an error naming the field.

use anyhow::{Context, bail};
use serde_json::{Map, Value};

use super::v1alpha1::{API_VERSION, KIND, KubeProxyConfiguration};

/// A parsed file and what in it kpng does not know.
#[derive(Debug, Clone)]
pub struct Parsed {
    /// The typed configuration, not yet defaulted.
    pub config: KubeProxyConfiguration,
    /// Dotted paths of fields that are not part of v1alpha1 (e.g. `conntrack.max`).
    pub unknown_fields: Vec<String>,
    /// What kube-proxy's lenient decoding lets pass and kpng warns about, one line each:
    /// a key given twice (the last value wins; in JSON two objects merge), documents after
    /// the first (ignored).
    pub lenient: Vec<String>,
}

/// Parses the text of a configuration file.
pub fn parse(text: &str) -> anyhow::Result<Parsed> {
    let mut lenient = Vec::new();
    let value: Value = if text.trim_start().starts_with('{') {
        // A repeated key is decoded into the earlier value, as sigs.k8s.io/json does in
        // kube-proxy: two objects merge, anything else is replaced.
        let value = super::json_keys::parse_merging(text).context("invalid JSON")?;
        for repeat in super::json_keys::duplicate_keys(text) {
            use super::json_keys::RepeatOutcome;
            lenient.push(match repeat.outcome {
                RepeatOutcome::Merged => merged_twice(&repeat.path, repeat.line),
                RepeatOutcome::Replaced => given_twice(&repeat.path, repeat.line, Kind::Other),
                RepeatOutcome::NullIgnored => null_ignored(&repeat.path, repeat.line),
            });
        }
        value
    } else {
        // kube-proxy's YAML decoder (sigs.k8s.io/yaml) reads the first document only.
        let (first, rest) = split_first_document(text);
        if has_content(rest) {
            lenient.push(
                "the file has more than one YAML document: only the first is read, as \
                 kube-proxy does; the others are ignored"
                    .to_string(),
            );
        }
        // Every key is passed on, so that a repeated one is seen: its last value wins whole, as
        // in kube-proxy's lenient decoding (sigs.k8s.io/yaml builds a generic map first, where
        // a repeat replaces the earlier value, mapping or not), with a warning.
        let options = serde_saphyr::options! {
            duplicate_keys: serde_saphyr::DuplicateKeyPolicy::PassThrough,
        };
        // Without the parser's excerpt, which names the file `<input>`: the message already
        // says which file, and the position is the file's.
        let node: Node = serde_saphyr::from_str_with_options(first, options)
            .map_err(|e| anyhow::anyhow!("invalid YAML: {}", e.without_snippet()))?;
        for (key, line, kind) in node.duplicates {
            lenient.push(given_twice(&key, line, kind));
        }
        node.value
    };
    let Value::Object(mut object) = value else {
        bail!(
            "expected a KubeProxyConfiguration mapping, found {}",
            kind_of(&value)
        );
    };
    check_type(&object)?;
    let mut unknown_fields = Vec::new();
    let template = serde_json::to_value(KubeProxyConfiguration::default())
        .context("describing the known fields")?;
    if let Value::Object(known) = &template {
        find_unknown(&object, known, "", &mut unknown_fields);
    }
    unknown_fields.sort();
    for field in &unknown_fields {
        remove_path(&mut object, field);
    }
    let mut value = Value::Object(object);
    strip_nulls(&mut value);
    let config = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        anyhow::anyhow!("field {path}: {}", in_words(&e.into_inner().to_string()))
    })?;
    Ok(Parsed {
        config,
        unknown_fields,
        lenient,
    })
}

/// What a repeated key's two values were, for the words of its warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Both are mappings (a YAML section given twice): the earlier is dropped, not merged.
    Mappings,
    /// Anything else.
    Other,
}

/// The warning for a key given twice whose last value is used (any YAML key; a JSON key unless
/// both values are objects).
fn given_twice(key: &str, line: u64, kind: Kind) -> String {
    let whole = match kind {
        Kind::Mappings => format!(" whole (the earlier `{key}` mapping is dropped, not merged)"),
        Kind::Other => String::new(),
    };
    format!(
        "{key} (line {line}): given twice; the last value is used{whole}, as kube-proxy's \
         lenient decoding does"
    )
}

/// The warning for a JSON key given again as `null` where Go's decoding leaves the earlier
/// value (a field that is no pointer, map or slice in kube-proxy's configuration).
fn null_ignored(key: &str, line: u64) -> String {
    format!(
        "{key} (line {line}): given twice, the second time as null, which is ignored (the \
         earlier value is kept), as kube-proxy's lenient decoding of JSON does"
    )
}

/// The warning for a JSON key given twice with an object both times: Go's JSON decoding, in
/// kube-proxy's lenient path, decodes the later object into the earlier one.
fn merged_twice(key: &str, line: u64) -> String {
    format!(
        "{key} (line {line}): given twice; merged with the earlier `{key}` (a field given in \
         both takes the later value), as kube-proxy's lenient decoding of JSON does"
    )
}

/// The first YAML document of `text` and the rest (from the marker that ends the first). A
/// line starting with `---` or `...` (then a space or the end) at column 0 is always a
/// document marker in YAML, even inside a block scalar, so lines tell documents apart. A
/// `---` before any content opens the first document.
fn split_first_document(text: &str) -> (&str, &str) {
    let mut offset = 0;
    let mut content = false;
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        let marker = |m: &str| {
            bare.strip_prefix(m)
                .is_some_and(|r| r.is_empty() || r.starts_with([' ', '\t']))
        };
        if marker("...") || (marker("---") && content) {
            return text.split_at(offset);
        }
        if !marker("---") && !is_blank_or_comment(bare) && !bare.starts_with('%') {
            content = true;
        }
        offset += line.len();
    }
    (text, "")
}

/// Whether the text after the first document holds anything but markers, comments and
/// blank lines.
fn has_content(rest: &str) -> bool {
    rest.lines().any(|line| {
        let bare = line.trim_end();
        !(is_blank_or_comment(bare)
            || ["---", "..."].iter().any(|m| {
                bare.strip_prefix(m)
                    .is_some_and(|r| is_blank_or_comment(r.trim_start()) || r.trim().is_empty())
            }))
    })
}

/// A line holding nothing but maybe a comment.
fn is_blank_or_comment(line: &str) -> bool {
    let t = line.trim();
    t.is_empty() || t.starts_with('#')
}

/// A YAML value as JSON, and the keys given twice in it (dotted path, line, what the two values
/// were), last value kept: what kube-proxy's lenient decoding does with a repeated key.
struct Node {
    value: Value,
    duplicates: Vec<(String, u64, Kind)>,
}

impl Node {
    fn leaf(value: Value) -> Node {
        Node {
            value,
            duplicates: Vec::new(),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Node {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Node, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

/// Builds a [`Node`] from whatever the YAML holds.
struct NodeVisitor;

impl<'de> serde::de::Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a YAML value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
        Ok(Node::leaf(Value::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
        Ok(Node::leaf(Value::from(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
        Ok(Node::leaf(Value::from(v)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
        Ok(Node::leaf(
            serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number),
        ))
    }
    fn visit_str<E>(self, v: &str) -> Result<Node, E> {
        Ok(Node::leaf(Value::String(v.to_string())))
    }
    fn visit_string<E>(self, v: String) -> Result<Node, E> {
        Ok(Node::leaf(Value::String(v)))
    }
    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::leaf(Value::Null))
    }
    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::leaf(Value::Null))
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        let mut duplicates = Vec::new();
        let mut index = 0usize;
        while let Some(item) = seq.next_element::<Node>()? {
            duplicates.extend(
                item.duplicates
                    .into_iter()
                    .map(|(path, line, kind)| (format!("[{index}].{path}"), line, kind)),
            );
            items.push(item.value);
            index += 1;
        }
        Ok(Node {
            value: Value::Array(items),
            duplicates,
        })
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut object = Map::new();
        let mut duplicates = Vec::new();
        while let Some(key) = map.next_key::<serde_saphyr::Spanned<String>>()? {
            let item: Node = map.next_value()?;
            let name = key.value;
            duplicates.extend(
                item.duplicates
                    .into_iter()
                    .map(|(path, line, kind)| (format!("{name}.{path}"), line, kind)),
            );
            let later_is_mapping = item.value.is_object();
            if let Some(earlier) = object.insert(name.clone(), item.value) {
                let kind = if earlier.is_object() && later_is_mapping {
                    Kind::Mappings
                } else {
                    Kind::Other
                };
                duplicates.push((name, key.referenced.line(), kind));
            }
        }
        duplicates.sort_by_key(|(_, line, _)| *line);
        Ok(Node {
            value: Value::Object(object),
            duplicates,
        })
    }
}

/// A type error's Rust type names in the words of a configuration file (`expected i32` is
/// what the decoder says; an operator reads "an integer").
fn in_words(message: &str) -> String {
    let mut out = message.to_string();
    for (rust, words) in [
        (
            "expected i32",
            "expected an integer from -2147483648 to 2147483647",
        ),
        ("expected i64", "expected an integer"),
        ("expected u32", "expected a whole number"),
        ("expected u64", "expected a whole number"),
        ("expected f32", "expected a number"),
        ("expected f64", "expected a number"),
    ] {
        out = out.replace(rust, words);
    }
    out
}

/// `apiVersion` and `kind` must name a v1alpha1 KubeProxyConfiguration, as kube-proxy requires.
fn check_type(object: &Map<String, Value>) -> anyhow::Result<()> {
    let field = |name: &str| object.get(name).and_then(Value::as_str).unwrap_or_default();
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    if kind != KIND {
        bail!("field kind: expected {KIND:?}, found {kind:?}");
    }
    if api_version != API_VERSION {
        bail!(
            "field apiVersion: kpng reads {API_VERSION:?}, found {api_version:?}{}",
            if api_version.starts_with("kubeproxy.config.k8s.io/") {
                " (write the file as v1alpha1, the version kube-proxy and kubeadm use)"
            } else {
                ""
            }
        );
    }
    Ok(())
}

/// Collects the paths of keys in `object` that `known` (a serialised default) lacks. A known
/// key whose default is an empty mapping (`featureGates`) is a free-form map.
fn find_unknown(
    object: &Map<String, Value>,
    known: &Map<String, Value>,
    prefix: &str,
    out: &mut Vec<String>,
) {
    for (key, value) in object {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match known.get(key) {
            None => out.push(path),
            Some(Value::Object(fields)) if !fields.is_empty() => {
                if let Value::Object(inner) = value {
                    find_unknown(inner, fields, &path, out);
                }
            }
            Some(_) => {}
        }
    }
}

/// Removes one dotted path found by [`find_unknown`], so that typed decoding ignores it.
fn remove_path(object: &mut Map<String, Value>, path: &str) {
    match path.split_once('.') {
        None => {
            object.remove(path);
        }
        Some((head, rest)) => {
            if let Some(Value::Object(inner)) = object.get_mut(head) {
                remove_path(inner, rest);
            }
        }
    }
}

/// Go decodes `null` into the zero value; serde would reject it for a `String` or `bool`. Drop
/// every `null` mapping value so that the field takes its zero value (`#[serde(default)]`).
fn strip_nulls(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(strip_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

/// A word for the shape of a JSON value, for errors.
fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "an empty document",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}
