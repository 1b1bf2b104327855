//! `--logging-format json` lines in Kubernetes component-base's shape.
//!
//! Why: an operator swapping kube-proxy keeps the log pipeline that parses kube-proxy's JSON
//! (Loki, Elasticsearch, Cloud Logging rules keyed on `msg`, `ts`, `v` and `err`). tracing's
//! own JSON uses `timestamp`, `level`, `message` and `fields`, so every such rule missed kpng's
//! lines. component-base writes one object per line:
//! `{"ts":<Unix time in milliseconds, a float>,"caller":"dir/file:line","msg":"…","v":<verbosity>, …key/values}`;
//! an error line has no `v` and carries its error as `err`.
//!
//! kpng maps its levels to klog verbosities as `-v` does the other way ([`verbosity`]). klog
//! writes warnings as `v: 0` info lines, which would hide them from anyone filtering on
//! severity; kpng's warnings and errors also carry `"severity":"WARNING"`/`"ERROR"`, the key
//! Cloud Logging reads, an extra key that component-base parsers ignore like any other value.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Formats events as component-base JSON lines.
#[derive(Debug, Default, Clone, Copy)]
pub struct KubeJson;

/// The klog verbosity a tracing level stands for: `None` for errors, which component-base
/// writes without one. The inverse of `-v`'s mapping (0–3 info, 4 debug, 5+ trace).
pub fn verbosity(level: Level) -> Option<u32> {
    match level {
        Level::ERROR => None,
        Level::WARN | Level::INFO => Some(0),
        Level::DEBUG => Some(4),
        Level::TRACE => Some(5),
    }
}

/// `dir/file:line` from a source path: the last two components, as zap's short caller.
fn short_caller(file: &str, line: Option<u32>) -> String {
    let file = file.replace('\\', "/");
    let mut parts = file.rsplitn(3, '/');
    let name = parts.next().unwrap_or_default();
    let short = match parts.next() {
        Some(dir) => format!("{dir}/{name}"),
        None => name.to_string(),
    };
    match line {
        Some(line) => format!("{short}:{line}"),
        None => short,
    }
}

/// An event's fields in the order they were recorded, `message` and `error` set apart.
#[derive(Default)]
struct Fields {
    message: Option<String>,
    error: Option<String>,
    values: Vec<(String, Value)>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: Value) {
        match (field.name(), value) {
            ("message", Value::String(text)) => self.message = Some(text),
            ("error" | "err", Value::String(text)) => self.error = Some(text),
            (name, value) => self.values.push((name.to_string(), value)),
        }
    }
}

impl Visit for Fields {
    fn record_f64(&mut self, field: &Field, value: f64) {
        let value = serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number);
        self.put(field, value);
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, value.to_string().into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, format!("{value:?}").into());
    }
}

/// The line's keys and values in component-base's order, built from its parts (apart from
/// the subscriber, so it is testable).
fn line_pairs(
    ts_millis: f64,
    caller: String,
    level: Level,
    fields: Fields,
) -> Vec<(String, Value)> {
    let ts = serde_json::Number::from_f64(ts_millis).map_or(Value::Null, Value::Number);
    let mut line: Vec<(String, Value)> = vec![
        ("ts".into(), ts),
        ("caller".into(), caller.into()),
        ("msg".into(), fields.message.unwrap_or_default().into()),
    ];
    if let Some(v) = verbosity(level) {
        line.push(("v".into(), v.into()));
    }
    match level {
        Level::WARN => line.push(("severity".into(), "WARNING".into())),
        Level::ERROR => line.push(("severity".into(), "ERROR".into())),
        _ => {}
    }
    for (key, value) in fields.values {
        // A field named like one of the line's own keys would make a duplicate key: it is
        // left out, the line's own value wins.
        if !line.iter().any(|(k, _)| *k == key) {
            line.push((key, value));
        }
    }
    if let Some(err) = fields.error {
        line.push(("err".into(), err.into()));
    }
    line
}

/// One JSON object from ordered pairs (serde_json's map would sort the keys).
fn render(pairs: &[(String, Value)]) -> String {
    let mut text = String::from("{");
    for (i, (key, value)) in pairs.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        text.push_str(&Value::String(key.clone()).to_string());
        text.push(':');
        text.push_str(&value.to_string());
    }
    text.push('}');
    text
}

impl<S, N> FormatEvent<S, N> for KubeJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let ts_millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0);
        let caller = short_caller(meta.file().unwrap_or(meta.target()), meta.line());
        let line = line_pairs(ts_millis, caller, *meta.level(), fields);
        writeln!(writer, "{}", render(&line))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callers_are_shortened_to_directory_and_file() {
        let cases = [
            ("crates/runner/src/runner.rs", Some(42), "src/runner.rs:42"),
            ("src\\main.rs", Some(7), "src/main.rs:7"),
            ("main.rs", Some(1), "main.rs:1"),
            ("kpng::run", None, "kpng::run"),
        ];
        for (file, line, want) in cases {
            assert_eq!(short_caller(file, line), want, "{file}");
        }
    }

    #[test]
    fn lines_have_component_base_keys_in_its_order() {
        let fields = |extra: Vec<(&str, Value)>, error: Option<&str>| Fields {
            message: Some("synced".into()),
            error: error.map(str::to_string),
            values: extra.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        };
        let cases: Vec<(Level, Fields, &str)> = vec![
            (
                Level::INFO,
                fields(vec![("ports", 3.into())], None),
                r#"{"ts":1500.5,"caller":"src/a.rs:9","msg":"synced","v":0,"ports":3}"#,
            ),
            (
                Level::DEBUG,
                fields(vec![], None),
                r#"{"ts":1500.5,"caller":"src/a.rs:9","msg":"synced","v":4}"#,
            ),
            (
                Level::TRACE,
                fields(vec![], None),
                r#"{"ts":1500.5,"caller":"src/a.rs:9","msg":"synced","v":5}"#,
            ),
            (
                Level::WARN,
                fields(vec![("msg", "shadowed".into())], None),
                r#"{"ts":1500.5,"caller":"src/a.rs:9","msg":"synced","v":0,"severity":"WARNING"}"#,
            ),
            // An error line: no `v`, the error last as `err`.
            (
                Level::ERROR,
                fields(vec![("service", "ns/web".into())], Some("boom")),
                r#"{"ts":1500.5,"caller":"src/a.rs:9","msg":"synced","severity":"ERROR","service":"ns/web","err":"boom"}"#,
            ),
        ];
        for (level, fields, want) in cases {
            let got = render(&line_pairs(1500.5, "src/a.rs:9".into(), level, fields));
            assert_eq!(got, want, "{level}");
            serde_json::from_str::<Value>(&got).expect("one JSON object");
        }
    }
}
