//! Label and field selectors, as the API server parses and applies them to lists and watches.

use serde_json::Value;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Exists(String),
    NotExists(String),
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed `labelSelector`: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Requirement>);

/// Splits at commas that are not inside parentheses (`a in (x,y),!b`).
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn key(raw: &str, whole: &str) -> Result<String, String> {
    let k = raw.trim();
    let valid = !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if valid {
        Ok(k.to_string())
    } else {
        Err(format!("invalid label key {k:?} in selector {whole:?}"))
    }
}

/// `key in (a, b)` / `key notin (a, b)`, or `None` when `part` is not set-based.
fn set_based(part: &str, whole: &str) -> Option<Result<Requirement, String>> {
    let open = part.find('(')?;
    let close = part.rfind(')')?;
    let head: Vec<&str> = part[..open].split_whitespace().collect();
    let [k, op] = head[..] else {
        return Some(Err(format!(
            "invalid requirement {part:?} in selector {whole:?}"
        )));
    };
    let values: Vec<String> = part[open + 1..close]
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect();
    let k = match key(k, whole) {
        Ok(k) => k,
        Err(e) => return Some(Err(e)),
    };
    Some(match op {
        "in" => Ok(Requirement::In(k, values)),
        "notin" => Ok(Requirement::NotIn(k, values)),
        other => Err(format!("unknown operator {other:?} in selector {whole:?}")),
    })
}

impl LabelSelector {
    /// Parses the API's selector syntax: `k`, `!k`, `k=v`, `k==v`, `k!=v`, `k in (a,b)`,
    /// `k notin (a,b)`, comma-separated. The empty string selects everything.
    pub fn parse(s: &str) -> Result<LabelSelector, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(LabelSelector(reqs));
        }
        for part in split_top_level(s) {
            let part = part.trim();
            let req = if let Some(rest) = part.strip_prefix('!') {
                Requirement::NotExists(key(rest, s)?)
            } else if let Some(r) = set_based(part, s) {
                r?
            } else if let Some((k, v)) = part.split_once("!=") {
                Requirement::NotEquals(key(k, s)?, v.trim().to_string())
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                Requirement::Equals(key(k, s)?, v.trim().to_string())
            } else {
                Requirement::Exists(key(part, s)?)
            };
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether it selects everything (the empty selector).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether an object (its JSON) carries matching labels.
    pub fn matches(&self, object: &Value) -> bool {
        let label = |k: &str| {
            object
                .pointer("/metadata/labels")
                .and_then(|l| l.get(k))
                .and_then(Value::as_str)
        };
        self.0.iter().all(|r| match r {
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::NotExists(k) => label(k).is_none(),
            Requirement::Equals(k, v) => label(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
            Requirement::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::NotIn(k, vs) => !label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
        })
    }
}

/// A parsed `fieldSelector` on `metadata.name` / `metadata.namespace` (the fields every
/// resource supports): `f=v`, `f==v`, `f!=v`, comma-separated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parses a field selector; other fields are refused, as the API server does for fields a
    /// resource does not index.
    pub fn parse(s: &str) -> Result<FieldSelector, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(FieldSelector(reqs));
        }
        for part in s.split(',') {
            let (field, equal, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (f, true, v)
            } else {
                return Err(format!("invalid field selector {s:?}"));
            };
            let field = field.trim();
            if !matches!(field, "metadata.name" | "metadata.namespace") {
                return Err(format!(
                    "field label not supported: {field} (in field selector {s:?})"
                ));
            }
            reqs.push((field.to_string(), equal, value.trim().to_string()));
        }
        Ok(FieldSelector(reqs))
    }

    /// Whether it selects everything (the empty selector).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether an object's fields match.
    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            let pointer = match field.as_str() {
                "metadata.name" => "/metadata/name",
                _ => "/metadata/namespace",
            };
            let actual = object
                .pointer(pointer)
                .and_then(Value::as_str)
                .unwrap_or("");
            (actual == value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labelled(labels: Value) -> Value {
        json!({"metadata": {"name": "x", "namespace": "ns", "labels": labels}})
    }

    #[test]
    fn label_selectors_as_the_api_server() {
        let kube_proxy =
            "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";
        // (selector, labels, matches)
        let cases = [
            (kube_proxy, json!({}), true),
            (
                kube_proxy,
                json!({"service.kubernetes.io/headless": ""}),
                false,
            ),
            (
                kube_proxy,
                json!({"service.kubernetes.io/service-proxy-name": "x"}),
                false,
            ),
            (
                "service.kubernetes.io/service-proxy-name=kpng,!service.kubernetes.io/headless",
                json!({"service.kubernetes.io/service-proxy-name": "kpng"}),
                true,
            ),
            (
                "service.kubernetes.io/service-proxy-name==kpng",
                json!({"service.kubernetes.io/service-proxy-name": "other"}),
                false,
            ),
            ("app!=web", json!({}), true),
            ("app!=web", json!({"app": "web"}), false),
            ("app", json!({"app": ""}), true),
            ("app in (a, b),tier", json!({"app": "b", "tier": "x"}), true),
            ("app in (a,b)", json!({"app": "c"}), false),
            ("app notin (a,b)", json!({}), true),
            ("app notin (a,b)", json!({"app": "a"}), false),
            ("", json!({"anything": "x"}), true),
        ];
        for (selector, labels, want) in cases {
            let s = LabelSelector::parse(selector).expect("parses");
            assert_eq!(
                s.matches(&labelled(labels.clone())),
                want,
                "{selector} on {labels}"
            );
        }
    }

    #[test]
    fn bad_selectors_are_refused() {
        for bad in ["!", "a in (x", "=v", "a b (x)"] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad:?}");
        }
        assert!(FieldSelector::parse("spec.unschedulable=false").is_err());
        assert!(FieldSelector::parse("metadata.name").is_err());
    }

    #[test]
    fn field_selectors_on_name_and_namespace() {
        let o = json!({"metadata": {"name": "node1"}});
        let cases = [
            ("metadata.name=node1", true),
            ("metadata.name==node2", false),
            ("metadata.name!=node2", true),
            ("metadata.name=node1,metadata.namespace=", true),
        ];
        for (selector, want) in cases {
            let s = FieldSelector::parse(selector).expect("parses");
            assert_eq!(s.matches(&o), want, "{selector}");
        }
    }
}
