//! The keys a JSON configuration file gives twice: what kube-proxy makes of them, and where
//! they are.
//!
//! kube-proxy's strict decoding refuses such a file and its lenient one decodes it with
//! sigs.k8s.io/json, a fork of Go's encoding/json, straight into the typed configuration: a
//! repeated key is decoded *into the value the first one left*. Two objects (a section such as
//! `nftables`, or `featureGates`) are thus merged field by field, a field given in both taking
//! the later value; anything else (a scalar, a list, an object after a scalar) is replaced,
//! except by a `null`: Go sets a pointer, map or slice field to nil for it (its default) and
//! leaves any other field (a section, a string, a number, a bool) as it was ([`NILLABLE`]).
//! serde_json would keep the last value whole and in silence, so [`parse_merging`] decodes the
//! way Go does and [`duplicate_keys`] names each repeat with its line for the warning. (YAML
//! is different: sigs.k8s.io/yaml first builds a generic map, where a repeated key replaces the
//! whole value; see `load.rs`.)

use std::collections::BTreeMap;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// A key given twice in a JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repeat {
    /// The dotted path of the key (`conntrack.min`, an array item `l.[0].x`).
    pub path: String,
    /// The 1-based line of the repeat.
    pub line: u64,
    /// What the repeat did to the earlier value.
    pub outcome: RepeatOutcome,
}

/// What a repeated key did to the value the first one left, as Go's decoding does it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepeatOutcome {
    /// Both are objects: merged field by field.
    Merged,
    /// The later value replaced the earlier one.
    Replaced,
    /// A later `null` for a field that cannot be nil ([`NILLABLE`]): ignored.
    NullIgnored,
}

/// The fields of kube-proxy's `KubeProxyConfiguration` (v1alpha1) whose Go type is a pointer,
/// a map or a slice, by key: a `null` sets such a field to nil (its default). For any other
/// field Go's decoding leaves the value already there. The names do not recur elsewhere in
/// the configuration with another type.
const NILLABLE: [&str; 11] = [
    "featureGates",
    "masqueradeBit",
    "localhostNodePorts",
    "oomScoreAdj",
    "maxPerCore",
    "min",
    "tcpEstablishedTimeout",
    "tcpCloseWaitTimeout",
    "nodePortAddresses",
    "excludeCIDRs",
    "vmodule",
];

/// What a repeat of `key` whose earlier value is (`earlier_is_object`) and whose later value
/// starts with `later` does, as Go decodes it.
fn outcome_of(key: &str, earlier_is_object: bool, later: Option<u8>) -> RepeatOutcome {
    match later {
        Some(b'n') if !NILLABLE.contains(&key) => RepeatOutcome::NullIgnored,
        Some(b'{') if earlier_is_object => RepeatOutcome::Merged,
        _ => RepeatOutcome::Replaced,
    }
}

/// One open container while walking the text.
enum Frame {
    /// An object: the keys seen so far, whether the value each holds so far is an object (the
    /// condition for a repeat to merge), and the last key (the path of its value).
    Object {
        keys: BTreeMap<String, bool>,
        current: Option<String>,
    },
    /// An array: the index of the item being read.
    Array { index: usize },
}

/// Parses JSON `text` as kube-proxy's lenient decoding reads it: a repeated key whose earlier
/// and later values are both objects merges them (recursively, the later field winning), any
/// other repeated key keeps its later value.
pub fn parse_merging(text: &str) -> serde_json::Result<Value> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let merged = Merged::deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(merged.0)
}

/// Decodes field `key`'s `later` value into the `earlier` one as Go decodes a repeated key
/// into the value already there: object into object field by field, a `null` ignored unless
/// the field is [`NILLABLE`], anything else replaced.
fn merge_field(key: &str, earlier: &mut Value, later: Value) {
    match (earlier, later) {
        (_, Value::Null) if !NILLABLE.contains(&key) => {}
        (Value::Object(earlier), Value::Object(later)) => {
            for (key, value) in later {
                match earlier.get_mut(&key) {
                    Some(existing) => merge_field(&key, existing, value),
                    None => {
                        earlier.insert(key, value);
                    }
                }
            }
        }
        (earlier, later) => *earlier = later,
    }
}

/// A JSON value decoded with [`merge_field`] for repeated keys.
struct Merged(Value);

impl<'de> Deserialize<'de> for Merged {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Merged, D::Error> {
        deserializer.deserialize_any(MergedVisitor)
    }
}

/// Builds a [`Merged`] value.
struct MergedVisitor;

impl<'de> Visitor<'de> for MergedVisitor {
    type Value = Merged;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Merged, E> {
        Ok(Merged(Value::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Merged, E> {
        Ok(Merged(Value::from(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Merged, E> {
        Ok(Merged(Value::from(v)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Merged, E> {
        Ok(Merged(
            serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number),
        ))
    }
    fn visit_str<E>(self, v: &str) -> Result<Merged, E> {
        Ok(Merged(Value::String(v.to_string())))
    }
    fn visit_string<E>(self, v: String) -> Result<Merged, E> {
        Ok(Merged(Value::String(v)))
    }
    fn visit_unit<E>(self) -> Result<Merged, E> {
        Ok(Merged(Value::Null))
    }
    fn visit_none<E>(self) -> Result<Merged, E> {
        Ok(Merged(Value::Null))
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Merged, D::Error> {
        d.deserialize_any(MergedVisitor)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Merged, A::Error> {
        let mut items = Vec::new();
        while let Some(Merged(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Merged(Value::Array(items)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Merged, A::Error> {
        let mut object = Map::new();
        while let Some((key, Merged(value))) = map.next_entry::<String, Merged>()? {
            match object.get_mut(&key) {
                Some(existing) => merge_field(&key, existing, value),
                None => {
                    object.insert(key, value);
                }
            }
        }
        Ok(Merged(Value::Object(object)))
    }
}

/// Each key given twice in the valid JSON `text`, as a dotted path (`conntrack.min`, an array
/// item `[0]`), the 1-based line of the repeat and whether it merges, in the order of the text.
pub fn duplicate_keys(text: &str) -> Vec<Repeat> {
    let bytes = text.as_bytes();
    let mut stack: Vec<Frame> = Vec::new();
    let mut out = Vec::new();
    let mut line = 1u64;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\n' => line += 1,
            b'{' => stack.push(Frame::Object {
                keys: BTreeMap::new(),
                current: None,
            }),
            b'[' => stack.push(Frame::Array { index: 0 }),
            b'}' | b']' => {
                stack.pop();
            }
            b',' => {
                if let Some(Frame::Array { index }) = stack.last_mut() {
                    *index += 1;
                }
            }
            b'"' => {
                let end = string_end(bytes, i);
                let expects_key = matches!(
                    stack.last(),
                    Some(Frame::Object { .. }) if next_token(bytes, end) == Some(b':')
                );
                if expects_key {
                    let name: String = serde_json::from_str(&text[i..end]).unwrap_or_default();
                    let path = path_to(&stack, &name);
                    let later = value_start(bytes, end);
                    if let Some(Frame::Object { keys, current }) = stack.last_mut() {
                        // What the key holds now is an object exactly when the later value is
                        // one (merged or not), or when an ignored `null` left an object.
                        let is_object = later == Some(b'{');
                        match keys.get(&name).copied() {
                            Some(was_object) => {
                                let outcome = outcome_of(&name, was_object, later);
                                if outcome != RepeatOutcome::NullIgnored {
                                    keys.insert(name.clone(), is_object);
                                }
                                out.push(Repeat {
                                    path,
                                    line,
                                    outcome,
                                });
                            }
                            None => {
                                keys.insert(name.clone(), is_object);
                            }
                        }
                        *current = Some(name);
                    }
                }
                i = end;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The index just past the string that starts with the quote at `start`.
fn string_end(bytes: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// The first byte at or after `from` that is not JSON whitespace.
fn next_token(bytes: &[u8], from: usize) -> Option<u8> {
    bytes[from.min(bytes.len())..]
        .iter()
        .copied()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
}

/// The first byte of the value that follows the key ending at `key_end` (past the colon).
fn value_start(bytes: &[u8], key_end: usize) -> Option<u8> {
    let colon = (key_end..bytes.len()).find(|&i| bytes[i] == b':')?;
    next_token(bytes, colon + 1)
}

/// The dotted path of key `name` in the innermost object of `stack`.
fn path_to(stack: &[Frame], name: &str) -> String {
    let mut path = String::new();
    // Every frame but the innermost contributes the place of the value being read in it.
    // Written as the YAML reader writes them: `list.[1].name`.
    for frame in &stack[..stack.len().saturating_sub(1)] {
        if !path.is_empty() {
            path.push('.');
        }
        match frame {
            Frame::Object { current, .. } => path.push_str(current.as_deref().unwrap_or_default()),
            Frame::Array { index } => path.push_str(&format!("[{index}]")),
        }
    }
    if !path.is_empty() {
        path.push('.');
    }
    path.push_str(name);
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_keys_are_named_with_their_path_line_and_merge() {
        use RepeatOutcome::{Merged, NullIgnored, Replaced};
        /// What a case expects: each repeated key's path, line, and what it did.
        type Repeats<'a> = &'a [(&'a str, u64, RepeatOutcome)];
        let cases: [(&str, &str, Repeats); 11] = [
            ("none", r#"{"a": 1, "b": {"a": 2}}"#, &[]),
            (
                "top level",
                "{\n\"a\": 1,\n\"a\": 2\n}",
                &[("a", 3, Replaced)],
            ),
            (
                "nested",
                "{\"conntrack\": {\n  \"min\": 1,\n  \"min\": 2}}",
                &[("conntrack.min", 3, Replaced)],
            ),
            (
                "a value that looks like a key is not one",
                r#"{"a": "a", "b": ["a", "a"], "c": "x\":"}"#,
                &[],
            ),
            (
                "in an array's object",
                r#"{"l": [{"x": 1}, {"y": 1, "y": 2}]}"#,
                &[("l.[1].y", 1, Replaced)],
            ),
            (
                "escaped names",
                r#"{"a\"b": 1, "a\u0022b": 2}"#,
                &[("a\"b", 1, Replaced)],
            ),
            (
                "two objects merge",
                "{\"n\": {\"s\": 1},\n \"n\" :\n {\"m\": 2}}",
                &[("n", 2, Merged)],
            ),
            (
                "an object after a scalar replaces it; a third object then merges",
                r#"{"n": 1, "n": {"s": 1}, "n": {"m": 2}}"#,
                &[("n", 1, Replaced), ("n", 1, Merged)],
            ),
            (
                "a null after a section or a string is ignored; after a pointer field it is not",
                r#"{"n": {"s": 1}, "n": null, "mode": "x", "mode": null, "masqueradeBit": 1, "masqueradeBit": null}"#,
                &[
                    ("n", 1, NullIgnored),
                    ("mode", 1, NullIgnored),
                    ("masqueradeBit", 1, Replaced),
                ],
            ),
            (
                "an object after an ignored null still merges",
                r#"{"n": {"s": 1}, "n": null, "n": {"m": 2}}"#,
                &[("n", 1, NullIgnored), ("n", 1, Merged)],
            ),
            (
                "a scalar or a list after an object replaces it",
                r#"{"n": {"s": 1}, "n": 1, "l": {}, "l": []}"#,
                &[("n", 1, Replaced), ("l", 1, Replaced)],
            ),
        ];
        for (what, text, want) in cases {
            let want: Vec<Repeat> = want
                .iter()
                .map(|(p, line, outcome)| Repeat {
                    path: p.to_string(),
                    line: *line,
                    outcome: *outcome,
                })
                .collect();
            assert_eq!(duplicate_keys(text), want, "{what}");
        }
    }

    /// sigs.k8s.io/json decodes a repeated key into the value already there: objects merge
    /// field by field (recursively), anything else is replaced.
    #[test]
    fn repeated_keys_decode_as_go_does() {
        let cases = [
            (
                "no repeat",
                r#"{"a": 1, "b": [1, 2]}"#,
                r#"{"a": 1, "b": [1, 2]}"#,
            ),
            (
                "scalar: the last wins",
                r#"{"a": 1, "a": 2}"#,
                r#"{"a": 2}"#,
            ),
            (
                "objects merge, a field in both takes the later value",
                r#"{"n": {"s": "10s", "m": "1s"}, "n": {"m": "2s"}}"#,
                r#"{"n": {"s": "10s", "m": "2s"}}"#,
            ),
            (
                "merging is recursive",
                r#"{"n": {"o": {"x": 1}}, "n": {"o": {"y": 2}}}"#,
                r#"{"n": {"o": {"x": 1, "y": 2}}}"#,
            ),
            (
                "a list replaces a list",
                r#"{"l": [1, 2], "l": [3]}"#,
                r#"{"l": [3]}"#,
            ),
            (
                "an object replaces a scalar",
                r#"{"n": 1, "n": {"s": 1}}"#,
                r#"{"n": {"s": 1}}"#,
            ),
            (
                "a null leaves a section, a string, a number as they were",
                r#"{"n": {"s": "10s"}, "n": null, "mode": "nftables", "mode": null, "v": 2, "v": null}"#,
                r#"{"n": {"s": "10s"}, "mode": "nftables", "v": 2}"#,
            ),
            (
                "a null resets a pointer, map or slice field (nested too)",
                r#"{"featureGates": {"A": true}, "featureGates": null, "c": {"min": 5}, "c": {"min": null}}"#,
                r#"{"featureGates": null, "c": {"min": null}}"#,
            ),
            (
                "a repeat inside a list item",
                r#"{"l": [{"a": {"x": 1}, "a": {"y": 1}}]}"#,
                r#"{"l": [{"a": {"x": 1, "y": 1}}]}"#,
            ),
        ];
        for (what, text, want) in cases {
            let want: Value = serde_json::from_str(want).expect("the expected JSON");
            let got = parse_merging(text).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(got, want, "{what}");
        }
        assert!(parse_merging("{} x").is_err(), "trailing characters");
    }
}
