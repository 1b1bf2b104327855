//! The exit codes of the commands that ask a running kpng (`kpng status`, `kpng trace`), and
//! their error as a document for `-o json|yaml`.
//!
//! Why: automation around kpng (a node-problem-detector script, a CI check) has to tell "kpng
//! is not running" from "kpng hangs" from "that Service does not exist" from "some ports have
//! a problem". Every failure used to be exit 1 with prose on standard error, which a script
//! could only grep. The codes are documented (docs/observability.md) and stable.

/// Why an admin-client command did not succeed: its exit code and the `code` of its JSON
/// error. The codes are part of kpng's interface: a new kind gets a new number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Anything else (kpng's answer unreadable, kpng answering that it cannot tell): 1.
    Other,
    /// The command line is wrong (clap's own errors, a bad `--to`, `--problems` asked of a
    /// brain): 2, as clap's.
    Usage,
    /// No kpng answers on the admin socket (none running, another `--admin-socket`): 3.
    NotReachable,
    /// The kpng took the request but did not answer within `--timeout` (hung, far too busy): 4.
    NoAnswer,
    /// No Service (port) or node matches what was asked for: 5.
    NoMatch,
    /// `kpng status --fail-on-problems`: some Service port has a problem (the status was
    /// printed as usual): 6.
    Problems,
    /// A kpng answered, but that it cannot answer now (HTTP 503: it is stopping): 7. Told
    /// apart from 1 so that a script retries (a new kpng starts, or the socket goes away and
    /// the next try says 3) instead of reporting a broken kpng.
    Unavailable,
}

impl Failure {
    /// The process's exit code.
    pub fn exit_code(self) -> u8 {
        match self {
            Failure::Other => 1,
            Failure::Usage => 2,
            Failure::NotReachable => 3,
            Failure::NoAnswer => 4,
            Failure::NoMatch => 5,
            Failure::Problems => 6,
            Failure::Unavailable => 7,
        }
    }

    /// The `error.code` of the JSON error: a stable camelCase word.
    pub fn word(self) -> &'static str {
        match self {
            Failure::Other => "failed",
            Failure::Usage => "usage",
            Failure::NotReachable => "notReachable",
            Failure::NoAnswer => "noAnswer",
            Failure::NoMatch => "noMatch",
            Failure::Problems => "problems",
            Failure::Unavailable => "unavailable",
        }
    }
}

/// An error of a known kind: its message as the operator reads it, and its [`Failure`].
#[derive(Debug)]
pub struct Classified {
    /// What went wrong, in words (the `kpng: …` line).
    pub message: String,
    /// Which kind of failure: the exit code.
    pub kind: Failure,
    /// The command printed its document already (a trace that matches no Service: the trace
    /// says what the node does with the packet, and carries the `error`): no error document
    /// is printed after it.
    pub printed: bool,
}

impl Classified {
    /// An error of kind `kind` saying `message`.
    pub fn error(kind: Failure, message: impl Into<String>) -> anyhow::Error {
        Classified {
            message: message.into(),
            kind,
            printed: false,
        }
        .into()
    }

    /// An error of kind `kind` saying `message`, after the command printed its document
    /// (which says the error itself where a document was asked for).
    pub fn after_output(kind: Failure, message: impl Into<String>) -> anyhow::Error {
        Classified {
            message: message.into(),
            kind,
            printed: true,
        }
        .into()
    }
}

impl std::fmt::Display for Classified {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Classified {}

/// The kind of `e`: the [`Classified`] in it, else [`Failure::Other`].
pub fn kind_of(e: &anyhow::Error) -> Failure {
    e.chain()
        .find_map(|cause| cause.downcast_ref::<Classified>())
        .map_or(Failure::Other, |c| c.kind)
}

/// Whether the command printed its document before failing with `e` ([`Classified::after_output`]).
pub fn printed(e: &anyhow::Error) -> bool {
    e.chain()
        .find_map(|cause| cause.downcast_ref::<Classified>())
        .is_some_and(|c| c.printed)
}

/// The `error` object of a document: `{"code", "exitCode", "message"}`, also carried by a
/// trace that matches no Service.
pub fn error_object(kind: Failure, message: &str) -> serde_json::Value {
    serde_json::json!({
        "code": kind.word(),
        "exitCode": kind.exit_code(),
        "message": message,
    })
}

/// How an admin-client command's failure is printed on standard output, besides the
/// `kpng: …` line on standard error: as a document in the format asked for (`-o json|yaml`),
/// so that a script reading standard output gets one it can parse in every case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorDocument {
    /// No document (text output, or not an admin-client command).
    None,
    /// `{"error": {...}}` as JSON.
    Json,
    /// The same as YAML.
    Yaml,
}

/// The document for `kind` and `message`: `{"schemaVersion": 1, "error": {"code", "exitCode",
/// "message"}}`; `None` when no document is asked for, or for [`Failure::Problems`] (the
/// status was printed already).
pub fn error_document(format: ErrorDocument, kind: Failure, message: &str) -> Option<String> {
    if kind == Failure::Problems {
        return None;
    }
    let value = serde_json::json!({
        "schemaVersion": crate::admin::SCHEMA_VERSION,
        "error": error_object(kind, message),
    });
    match format {
        ErrorDocument::None => None,
        ErrorDocument::Json => serde_json::to_string_pretty(&value).ok().map(|s| s + "\n"),
        ErrorDocument::Yaml => serde_saphyr::to_string(&value).ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_has_its_own_code_and_word() {
        let all = [
            Failure::Other,
            Failure::Usage,
            Failure::NotReachable,
            Failure::NoAnswer,
            Failure::NoMatch,
            Failure::Problems,
            Failure::Unavailable,
        ];
        let codes: std::collections::BTreeSet<u8> = all.iter().map(|f| f.exit_code()).collect();
        let words: std::collections::BTreeSet<&str> = all.iter().map(|f| f.word()).collect();
        assert_eq!(codes.len(), all.len());
        assert_eq!(words.len(), all.len());
        assert!(!codes.contains(&0));
    }

    #[test]
    fn a_classified_error_keeps_its_kind_under_context() {
        let e = Classified::error(Failure::NoAnswer, "hung");
        assert_eq!(kind_of(&e), Failure::NoAnswer);
        let e = e.context("asking");
        assert_eq!(kind_of(&e), Failure::NoAnswer);
        assert_eq!(kind_of(&anyhow::anyhow!("plain")), Failure::Other);
    }

    #[test]
    fn the_json_error_names_its_code() {
        let text = error_document(ErrorDocument::Json, Failure::NotReachable, "no kpng")
            .expect("a document");
        let value: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(value["error"]["code"], "notReachable");
        assert_eq!(value["error"]["exitCode"], 3);
        assert_eq!(value["error"]["message"], "no kpng");
        assert_eq!(value["schemaVersion"], 1);
        assert_eq!(
            error_document(ErrorDocument::None, Failure::NotReachable, "x"),
            None
        );
        assert_eq!(
            error_document(ErrorDocument::Json, Failure::Problems, "x"),
            None
        );
    }
}
