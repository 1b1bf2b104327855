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
}

/// Parses the text of a configuration file.
pub fn parse(text: &str) -> anyhow::Result<Parsed> {
    let value: Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).context("invalid JSON")?
    } else {
        // Without the parser's excerpt, which names the file `<input>`: the message already
        // says which file, and the position is the file's.
        serde_saphyr::from_str(text)
            .map_err(|e| anyhow::anyhow!("invalid YAML: {}", e.without_snippet()))?
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
    })
}

/// A type error's Rust type names in the words of a configuration file (`expected i32` is
/// what the decoder says; an operator reads "an integer").
fn in_words(message: &str) -> String {
    let mut out = message.to_string();
    for (rust, words) in [
        ("expected i32", "expected an integer"),
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
