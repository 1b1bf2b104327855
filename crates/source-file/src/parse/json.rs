//! The JSON fast path: a document that is strict JSON (what `kubectl get … -o json` prints) is
//! read by `serde_json`: a Service document into its type takes ~2 µs there against ~30 µs in
//! the YAML parser, and a 30k-Service start from JSON manifests needs 2.1 CPU-seconds against
//! 5.1 from the same objects in YAML (docs/benchmarks.md, start-up follow-up of 06:40).
//!
//! JSON is YAML, so the YAML path would read these documents too; this path only saves the time.
//! It must therefore accept exactly what the YAML path accepts and read it the same: it refuses
//! duplicate keys (serde-saphyr does; `serde_json` alone would keep the last value), and any
//! document it does not take whole goes to the YAML path, which then also words the error. A YAML
//! flow mapping such as `{kind: Service, …}` starts with `{` too; it is not JSON and takes the
//! YAML path.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// The document as a JSON value, or `None` when it is not a strict JSON object or array
/// (the YAML path reads it then).
pub(super) fn document(doc: &str) -> Option<Value> {
    let first = doc.trim_start().as_bytes().first()?;
    if !matches!(first, b'{' | b'[') {
        return None;
    }
    let mut de = serde_json::Deserializer::from_str(doc);
    let value = StrictValue::deserialize(&mut de).ok()?.0;
    de.end().ok()?;
    Some(value)
}

/// A JSON value whose objects may not repeat a key.
struct StrictValue(Value);

impl<'de> Deserialize<'de> for StrictValue {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor).map(StrictValue)
    }
}

struct StrictVisitor;

impl<'de> DeserializeSeed<'de> for StrictVisitor {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        // serde_json turns an out-of-range number into an error already; a non-finite float
        // cannot be a JSON value, and the YAML path refuses it too.
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("non-finite number"))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element_seed(StrictVisitor)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(StrictVisitor)?;
            if object.insert(key, value).is_some() {
                return Err(de::Error::custom("duplicate key"));
            }
        }
        Ok(Value::Object(object))
    }
}

/// A strict-JSON List document (`kubectl get … -o json`) read one item at a time: each item's
/// value goes to `item` as soon as it is read, so the whole List never exists as one value (a
/// 30k-Service dump peaked at 942 MB that way). `None` when the document is not a strict JSON
/// object with an `items` array and a `kind` ending in `List`, when an item has no `kind` of
/// its own (kubectl's always have one; the List's kind only comes after the items, in key
/// order), or when `item` refuses one: the caller then reads the document whole.
pub(super) fn list_items(doc: &str, item: &mut dyn FnMut(Value) -> bool) -> Option<()> {
    if !doc.trim_start().starts_with('{') {
        return None;
    }
    let mut de = serde_json::Deserializer::from_str(doc);
    de::Deserializer::deserialize_map(&mut de, ListVisitor { item }).ok()?;
    de.end().ok()
}

/// The top level of a List: hands the items over, keeps the kind, refuses repeated keys, and
/// gives up at the first key or kind no List has.
struct ListVisitor<'f> {
    item: &'f mut dyn FnMut(Value) -> bool,
}

impl<'de> Visitor<'de> for ListVisitor<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON List")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = std::collections::BTreeSet::new();
        let mut kind = false;
        let mut items = false;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "items" => {
                    map.next_value_seed(Items {
                        item: &mut *self.item,
                    })?;
                    items = true;
                }
                "kind" => {
                    let value = map.next_value_seed(StrictVisitor)?;
                    // Any other object gives up here, before the rest of it is read (the
                    // whole-document path reads it next).
                    kind = value.as_str().is_some_and(|k| k.ends_with("List"));
                    if !kind {
                        return Err(de::Error::custom("not a List"));
                    }
                }
                "apiVersion" | "metadata" => {
                    map.next_value_seed(StrictVisitor)?;
                }
                _ => return Err(de::Error::custom("not a List")),
            }
            if !seen.insert(key) {
                return Err(de::Error::custom("duplicate key"));
            }
        }
        if kind && items {
            Ok(())
        } else {
            Err(de::Error::custom("not a List"))
        }
    }
}

/// A List's `items` array, each item handed over as read.
struct Items<'f> {
    item: &'f mut dyn FnMut(Value) -> bool,
}

impl<'de> DeserializeSeed<'de> for Items<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Items<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON array of objects")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(value) = seq.next_element_seed(StrictVisitor)? {
            if value.get("kind").and_then(Value::as_str).is_none() || !(self.item)(value) {
                return Err(de::Error::custom("an item not taken item by item"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_strict_json_and_leaves_everything_else_to_yaml() {
        // (document, taken by the JSON path)
        let cases = [
            (r#"{"kind": "Service", "metadata": {"name": "a"}}"#, true),
            ("  \n{\"items\": [1, 2.5, true, null, \"x\"]}\n", true),
            (r#"[{"kind": "Node"}]"#, true),
            // YAML flow mappings are not JSON.
            ("{kind: Service, metadata: {name: a}}", false),
            // The YAML path refuses repeated keys, so this one must not slip through here.
            (r#"{"kind": "Service", "kind": "Node"}"#, false),
            (r#"{"a": {"b": 1, "b": 2}}"#, false),
            // Out of range for any number type.
            (r#"{"port": 1e400}"#, false),
            // Trailing text after the value.
            (r#"{"a": 1} {"b": 2}"#, false),
            ("kind: Service", false),
            ("", false),
        ];
        for (doc, taken) in cases {
            assert_eq!(document(doc).is_some(), taken, "{doc:?}");
        }
    }

    #[test]
    fn reads_the_same_value_as_the_yaml_path() {
        let doc = r#"{"kind": "Service", "metadata": {"name": "web", "labels": {"a": "1"}},
            "spec": {"ports": [{"port": 80, "protocol": "TCP"}], "clusterIP": "10.96.0.10",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 10800}},
            "allocateLoadBalancerNodePorts": false, "externalName": null},
            "escaped": "caf\u00e9 \ud83d\ude00 \"q\" \\"}"#;
        let json = document(doc).expect("strict JSON");
        let yaml: Value = serde_saphyr::from_str(doc).expect("JSON is YAML");
        assert_eq!(json, yaml);
    }
}
