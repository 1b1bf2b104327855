//! Logging set-up: the `--log-level` filter (checked, so a typo does not silence everything),
//! text or component-base JSON lines (`--logging-format`, see [`crate::json_log`]), and the rate limit of identical warnings.

use std::io::IsTerminal;

use crate::cli::LogFormat;
use crate::log_dedup;

/// The level words `--log-level` takes, alone or after `MODULE=`.
const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Checks a `--log-level` value. tracing's filter syntax reads a bare word as a module name
/// (enabling only that module), so `--log-level loud` or `--log-level verbose` would be
/// accepted and silence every line: a bare word must be a level, a module filter must say
/// `MODULE=LEVEL`, and the level must be one of [`LEVELS`].
pub fn check_level(spec: &str) -> Result<(), String> {
    let is_level = |word: &str| LEVELS.contains(&word.trim().to_ascii_lowercase().as_str());
    for directive in spec.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        match directive.rsplit_once('=') {
            Some((_, level)) if !is_level(level) => {
                return Err(format!(
                    "--log-level {spec:?}: {level:?} in {directive:?} is not a level ({})",
                    LEVELS.join(", ")
                ));
            }
            Some(_) => {}
            // `target[span{field=value}]` forms carry `=` inside brackets; those have a level
            // after the last `=` outside them, so only plain words reach here.
            None if !is_level(directive) => {
                return Err(format!(
                    "--log-level {spec:?}: {directive:?} is not a level ({}); to filter one \
                     module write MODULE=LEVEL, e.g. kpng_backend_nft=debug",
                    LEVELS.join(", ")
                ));
            }
            None => {}
        }
    }
    tracing_subscriber::EnvFilter::try_new(normalize(spec))
        .map(|_| ())
        .map_err(|e| format!("--log-level {spec:?}: {e}"))
}

/// The directives without the blanks people put after commas (tracing's parser refuses them).
fn normalize(spec: &str) -> String {
    spec.split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect::<Vec<_>>()
        .join(",")
}

/// `--log-level`, with kube's own crates silenced unless it names them: they log every
/// failed attempt while the API server is down, and the `kube` source already reports an
/// outage, a refusal or a bad object once itself. At `debug` and `trace` (kube-proxy's
/// `--v=4` and up) the HTTP, TLS and service plumbing stays at `info` unless named: its
/// lines (a connection pool's checkouts, a buffer worker's polls) outnumbered kpng's own
/// thirty to eleven, and hid the proxy's detail that the level is asked for.
pub fn filter_spec(spec: &str) -> String {
    let mut filter = kube_quiet(spec);
    let verbose = filter.split(',').any(|d| matches!(d, "debug" | "trace"));
    if verbose {
        for plumbing in PLUMBING {
            if !spec.contains(plumbing) {
                filter.push_str(&format!(",{plumbing}=info"));
            }
        }
    }
    filter
}

/// The directives of `spec` with kube's own crates off unless it names them: they warn per
/// attempt what the `kube` source reports once (`eof in poll` for every watch an API-server
/// restart cut, `watch initlist error with 403` at every retry of a refused list), which broke
/// the one-warning-per-outage rule.
fn kube_quiet(spec: &str) -> String {
    let mut filter = normalize(spec);
    for chatty in ["kube_client", "kube_runtime"] {
        if !spec.contains(chatty) {
            filter.push_str(&format!(",{chatty}=off"));
        }
    }
    filter
}

/// `RUST_LOG` as the filter: as given, but with kube's own crates off unless it names them
/// ([`kube_quiet`]). `RUST_LOG=info` let through a WARN from kube's client for every watch an
/// API-server restart cut (`eof in poll`) beside kpng's one warning for the outage.
pub fn rust_log_spec(rust_log: &str) -> String {
    kube_quiet(rust_log)
}

/// Libraries whose debug lines are about their own machinery, not the proxy.
const PLUMBING: [&str; 9] = [
    "hyper",
    "hyper_util",
    "h2",
    "tower",
    "rustls",
    "tonic",
    "axum",
    "mio",
    "want",
];

/// Where log lines go: standard error, or `--log-file` opened for appending.
pub enum LogTarget {
    /// Standard error (coloured when it is a terminal).
    Stderr,
    /// A file, appended to.
    File(std::fs::File),
}

impl LogTarget {
    /// `--log-file` opened for appending (created when missing), or standard error.
    pub fn open(file: Option<&std::path::Path>) -> Result<LogTarget, String> {
        let Some(path) = file else {
            return Ok(LogTarget::Stderr);
        };
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map(LogTarget::File)
            .map_err(|e| format!("--log-file {}: {e}", path.display()))
    }
}

/// RUST_LOG when it is set to something (blank is as unset).
pub fn rust_log() -> Option<String> {
    std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
}

/// Installs the process's log subscriber: `target`, the given filter (RUST_LOG wins when
/// set), text or JSON, identical warnings rate-limited.
pub fn init(level: &str, format: LogFormat, target: LogTarget) {
    use tracing_subscriber::fmt::writer::BoxMakeWriter;
    // An empty RUST_LOG (`RUST_LOG= kpng …`, a template that left it blank) is no filter:
    // taken as one, it silenced every line, errors included.
    let filter = rust_log()
        .and_then(|spec| tracing_subscriber::EnvFilter::try_new(rust_log_spec(&spec)).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new(filter_spec(level)));
    let (writer, ansi) = match target {
        LogTarget::Stderr => (
            BoxMakeWriter::new(std::io::stderr),
            std::io::stderr().is_terminal(),
        ),
        // One line per write, whole: the file's lock is held for each event.
        LogTarget::File(file) => (BoxMakeWriter::new(std::sync::Mutex::new(file)), false),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => builder
            .with_ansi(ansi)
            .fmt_fields(EscapedFields)
            .event_format(log_dedup::Dedup::new(
                tracing_subscriber::fmt::format(),
                log_dedup::WINDOW,
            ))
            .init(),
        LogFormat::Json => builder
            .event_format(log_dedup::Dedup::new(
                crate::json_log::KubeJson,
                log_dedup::WINDOW,
            ))
            .init(),
    }
}

/// Text logs' fields (the message among them) as tracing's default formatting writes them,
/// with control characters escaped (`\n`, `\u{1b}`): a value from the input (a manifest's
/// name, a node name a brain client sent) could otherwise forge a log line with a newline or
/// rewrite a terminal with an escape sequence. JSON logs escape them by JSON's rules.
struct EscapedFields;

impl<'writer> tracing_subscriber::fmt::FormatFields<'writer> for EscapedFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        mut writer: tracing_subscriber::fmt::format::Writer<'writer>,
        fields: R,
    ) -> std::fmt::Result {
        let mut plain = String::new();
        tracing_subscriber::fmt::format::DefaultFields::new().format_fields(
            tracing_subscriber::fmt::format::Writer::new(&mut plain),
            fields,
        )?;
        writer.write_str(&escape_controls(&plain))
    }
}

/// `text` with every control character escaped as Rust writes it in a string literal.
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(escape_controls("plain café"), "plain café");
        assert_eq!(
            escape_controls("evil\u{1b}[2J\nERROR forged"),
            "evil\\u{1b}[2J\\nERROR forged"
        );
    }

    #[test]
    fn kube_crates_are_quiet_unless_named() {
        assert_eq!(filter_spec("info"), "info,kube_client=off,kube_runtime=off");
        // At debug, the plumbing stays at info unless named.
        let debug = filter_spec("debug,h2=trace");
        assert!(
            debug.starts_with("debug,h2=trace,kube_client=off,kube_runtime=off,hyper=info,")
                && debug.contains(",tower=info")
                && !debug.contains(",h2=info"),
            "{debug}"
        );
        assert_eq!(filter_spec("warn"), "warn,kube_client=off,kube_runtime=off");
        assert_eq!(
            filter_spec("info,kube_client=debug"),
            "info,kube_client=debug,kube_runtime=off"
        );
    }

    /// RUST_LOG is taken as given, but kube's crates stay off unless it names them: they
    /// warn per cut watch or per retry what the `kube` source reports once.
    #[test]
    fn rust_log_keeps_kube_crates_quiet_unless_named() {
        let cases = [
            ("info", "info,kube_client=off,kube_runtime=off"),
            // No plumbing rule: RUST_LOG=debug asks for everything else.
            ("debug", "debug,kube_client=off,kube_runtime=off"),
            (
                "warn,kube_client=info",
                "warn,kube_client=info,kube_runtime=off",
            ),
            (
                "info, kube_runtime=debug,kube_client=trace",
                "info,kube_runtime=debug,kube_client=trace",
            ),
        ];
        for (rust_log, want) in cases {
            assert_eq!(rust_log_spec(rust_log), want, "{rust_log}");
        }
    }

    #[test]
    fn levels_are_checked() {
        let cases: [(&str, Option<&str>); 9] = [
            ("info", None),
            ("DEBUG", None),
            ("info,kpng=debug", None),
            ("warn, kpng_backend_nft=trace", None),
            ("off", None),
            ("loud", Some("\"loud\" is not a level")),
            ("verbose,kpng=debug", Some("\"verbose\" is not a level")),
            (
                "kpng=chatty",
                Some("\"chatty\" in \"kpng=chatty\" is not a level"),
            ),
            ("kpng", Some("write MODULE=LEVEL")),
        ];
        for (spec, want) in cases {
            match (check_level(spec), want) {
                (Ok(()), None) => {}
                (Err(e), Some(w)) => assert!(e.contains(w), "{spec}: {e}"),
                (got, want) => panic!("{spec}: got {got:?}, want {want:?}"),
            }
        }
    }
}
