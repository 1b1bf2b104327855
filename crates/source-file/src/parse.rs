//! Manifest text → model objects, with errors that say exactly where.

use std::borrow::Cow;
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kpng_k8s::{Convert, Converted};
use kpng_model::records::ConversionError;
use kpng_model::{Kind, Object, ObjectRef, Warning};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tracing::warn;

/// Why a manifest file was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ManifestError {
    /// 1-based document index in the YAML stream.
    pub document: usize,
    /// 1-based index inside a `kind: List`, when the object is a list item.
    pub item: Option<usize>,
    /// The line the document starts on (1-based).
    pub line: usize,
    /// The object's kind, when known.
    pub kind: Option<String>,
    /// `namespace/name` (or `name`), when known.
    pub object: Option<String>,
    /// The field path at fault, when known (`spec.ports[0].port`).
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
    /// Whether this error alone keeps the file from loading (a document that does not read);
    /// false for an object that would only be rejected once the file reads. The fatal ones
    /// come first: `kpng status` shows the first error, which must be what made the load fail.
    pub fatal: bool,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let place = Origin {
            document: self.document,
            item: self.item,
            line: self.line,
            lacks: None,
            absent: false,
        };
        write!(f, "{place}")?;
        match (&self.kind, &self.object) {
            (Some(k), Some(o)) => write!(f, ", {k} {o}")?,
            (Some(k), None) => write!(f, ", {k}")?,
            _ => {}
        }
        if let Some(field) = &self.field {
            write!(f, ", field {field}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Why a manifest file was not loaded at all: every document that could not be read, in file
/// order (at least one), then the objects that would be rejected once it reads, in file order.
/// All of them, so that an operator fixes a file in one pass rather than one error per reload;
/// the fatal ones first, so that the first error (the one `kpng status` shows) is what made
/// the load fail, not an object rejected earlier in the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ManifestErrors {
    /// The errors, the fatal ones first, each group in file order; never empty.
    pub errors: Vec<ManifestError>,
}

impl ManifestErrors {
    fn one(error: ManifestError) -> ManifestErrors {
        ManifestErrors {
            errors: vec![error],
        }
    }

    /// Logs why the file at `path` was not loaded: each unreadable document on its own line
    /// (an operator fixes them in one pass, up to `ERRORS_LOGGED`), and what is in use
    /// instead (`instead`: "keeping its last good state", or that nothing of it is).
    /// A would-be rejection carries its object as fields (`kind`, `namespace`, `name`,
    /// `field`), as the rejection lines of a file that loads do; every line has `document` and
    /// `line` (numbers).
    pub fn log(&self, path: &std::path::Path, instead: &str) {
        for e in self.errors.iter().take(ERRORS_LOGGED) {
            let at = path.display();
            match (&e.kind, &e.object) {
                (Some(kind), Some(object)) if !e.fatal => {
                    let (namespace, name) = object.split_once('/').unwrap_or(("", object));
                    tracing::error!(
                        kind = kind.as_str(),
                        namespace,
                        name,
                        field = e.field.as_deref().unwrap_or_default(),
                        document = e.document as u64,
                        line = e.line as u64,
                        "{at}: {e}; {instead}"
                    );
                }
                _ => tracing::error!(
                    document = e.document as u64,
                    line = e.line as u64,
                    "{at}: {e}; {instead}"
                ),
            }
        }
        if let Some(more) = self
            .errors
            .len()
            .checked_sub(ERRORS_LOGGED)
            .filter(|m| *m > 0)
        {
            tracing::error!("{}: {more} more errors not shown", path.display());
        }
    }
}

impl ManifestErrors {
    /// The errors on one line, for `kpng status`: the first one's first line (a YAML error's
    /// excerpt of the file is left to the log) and how many more there are.
    pub fn summary(&self) -> String {
        let first = self
            .errors
            .first()
            .map(|e| e.to_string())
            .unwrap_or_default();
        let first = first.lines().next().unwrap_or_default().trim_end();
        match self.errors.len() {
            0 | 1 => first.to_string(),
            2 => format!("{first} (and 1 more error)"),
            n => format!("{first} (and {} more errors)", n - 1),
        }
    }
}

/// How many of a file's errors are logged one by one; the rest are counted.
const ERRORS_LOGGED: usize = 20;

impl fmt::Display for ManifestErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut errors = self.errors.iter();
        if let Some(first) = errors.next() {
            write!(f, "{first}")?;
        }
        match errors.len() {
            0 => Ok(()),
            1 => write!(f, " (and 1 more error)"),
            more => write!(f, " (and {more} more errors)"),
        }
    }
}

/// A successfully parsed manifest file.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    /// The objects, in file order. An object that names itself but cannot be used (a field of
    /// the wrong type, a value out of range, defined twice) is an [`Object::Rejected`] here:
    /// the model keeps its last good version and the rest of the file is used, as a broken
    /// object from the API server is handled.
    pub objects: Vec<Object>,
    /// Kinds that were skipped because kpng does not use them (each named once).
    pub skipped_kinds: BTreeSet<String>,
    /// Values the conversion dropped (the rest of their objects is used).
    pub warnings: Vec<Warning>,
    /// Whether the last object, ending the file, was rejected for lacking what a write cut off
    /// before it leaves out (a field absent or empty, a Service without `spec` or ports): one
    /// of the two signs [`Loaded::cut_off_end`] reads.
    ends_lacking: bool,
}

impl Loaded {
    /// How many objects were rejected (each is logged by the model's consumer, with its
    /// location).
    pub fn rejected(&self) -> usize {
        self.objects
            .iter()
            .filter(|o| matches!(o, Object::Rejected(_)))
            .count()
    }

    /// Whether the file may have been cut off mid-write: its last object was rejected, as an
    /// interrupted copy or write leaves one. Deleting what such a load no longer has could tear
    /// down working rules, so the sources keep those objects until the end of the file reads.
    pub fn ends_rejected(&self) -> bool {
        matches!(self.objects.last(), Some(Object::Rejected(_)))
    }

    /// Why the end of the file reads as a write cut off mid-object rather than as an object
    /// written wrong: `None` unless the last object was rejected ([`Loaded::ends_rejected`])
    /// and either `text` (what was parsed) stops mid-line, or the field it was rejected at is
    /// not written at all or empty (a port never written, a `namespace` not yet written, an
    /// `addresses:` without its list, a Service without `spec` or ports at the end: see
    /// `reject_a_cut_off_end`).
    ///
    /// Why these two: writers end their last line (a JSON file may not, but it ends with its
    /// closing `}` or `]`, which is no cut), and a cut at a byte offset rarely falls on a
    /// line break; a cut that does fall on one leaves the last object lacking what its
    /// writer had not written yet. A value present but wrong (a port out of range, a field of
    /// the wrong type) is an object written wrong, as operators and tests write on purpose:
    /// holding a first list for it would delay every such start (see `watch`).
    pub fn cut_off_end(&self, text: &str) -> Option<CutOffEnd> {
        let Some(Object::Rejected(last)) = self.objects.last() else {
            return None;
        };
        // Trailing blanks are no sign, and a text that ends a flow collection (`}`, `]`: every
        // JSON file, as `json.dump` and `serde_json::to_string` write it, without a line
        // break) ended where its writer closed it: a cut inside one is not YAML at all.
        let end = text.trim_end_matches([' ', '\t', '\r']);
        if !end.is_empty() && !end.ends_with(['\n', '}', ']']) {
            let line = end.lines().count().max(1);
            let column = end.rsplit('\n').next().map_or(1, |l| l.chars().count() + 1);
            return Some(CutOffEnd::MidLine { line, column });
        }
        self.ends_lacking.then(|| CutOffEnd::Lacking {
            object: format!(
                "{} {}",
                last.object.kind.as_str(),
                namespaced_name(&last.object)
            ),
            field: last.field.clone(),
            location: last.location.clone().unwrap_or_default(),
        })
    }

    /// Prefixes each rejected object's location with the file it came from, so that the error
    /// line names the file as well as the document.
    pub fn locate_in(&mut self, source: &std::path::Path) {
        for object in &mut self.objects {
            if let Object::Rejected(e) = object {
                let at = e.location.take().unwrap_or_default();
                e.location = Some(format!("{}: {at}", source.display()));
            }
        }
    }

    /// Logs what the load left out: kinds kpng does not use and values it could not use.
    pub fn log_omissions(&self, source: &std::path::Path) {
        for kind in &self.skipped_kinds {
            warn!(
                "{}: skipping objects of kind {kind}: kpng does not use them",
                source.display()
            );
        }
        for warning in &self.warnings {
            warn!("{}: {warning}", source.display());
        }
    }
}

/// What makes the end of a file read as a write cut off mid-object ([`Loaded::cut_off_end`]),
/// worded for the operator: where the file stops, or what its last object lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CutOffEnd {
    /// The text stops mid-line (no line break ends it): its last character is at `line`,
    /// before `column`.
    MidLine {
        /// The last line (1-based).
        line: usize,
        /// Where the next character would have gone (1-based, in characters).
        column: usize,
    },
    /// The last object was rejected for lacking a part its writer had not written yet.
    Lacking {
        /// `Kind namespace/name`.
        object: String,
        /// The field it lacks (or that is empty).
        field: String,
        /// Where the object is (file, document and line).
        location: String,
    },
}

impl fmt::Display for CutOffEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CutOffEnd::MidLine { line, column } => write!(
                f,
                "it stops mid-line, at line {line} column {column} (no line break ends it), \
                 its last object rejected"
            ),
            CutOffEnd::Lacking {
                object,
                field,
                location,
            } => write!(
                f,
                "its last object, {object} ({location}), lacks {field}, as a write cut off \
                 before it does"
            ),
        }
    }
}

/// Splits a YAML stream into documents, returning each with its 1-based start line. A text
/// without separator or end lines (every JSON file, and most one-document YAML files) is one
/// document, borrowed as it is: copying it line by line was a tenth of a JSON start's CPU.
fn documents(text: &str) -> Vec<(usize, Cow<'_, str>)> {
    if is_single_document(text) {
        return vec![(1, Cow::Borrowed(text))];
    }
    let mut docs = Vec::new();
    let mut current = String::new();
    let mut start = 1;
    for (i, line) in text.lines().enumerate() {
        let is_separator = line == "---" || line.starts_with("--- ") || line.starts_with("---\t");
        if is_separator {
            docs.push((start, Cow::Owned(std::mem::take(&mut current))));
            start = i + 2;
            // `--- key: value` keeps content after the marker.
            if let Some(rest) = line.get(4..).filter(|r| !r.trim().is_empty()) {
                current.push_str(rest);
                current.push('\n');
                start = i + 1;
            }
        } else if line == "..." {
            continue;
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    docs.push((start, Cow::Owned(current)));
    docs
}

/// Whether no line of `text` starts with `---` or `...` (a separator or an end marker; a line
/// that only starts so, such as `----`, sends the text to the line-by-line split, which reads
/// it the same).
fn is_single_document(text: &str) -> bool {
    let marker_at_line_start =
        |marker: &str| text.starts_with(marker) || text.contains(&format!("\n{marker}"));
    !marker_at_line_start("---") && !marker_at_line_start("...")
}

fn name_of(value: &Value) -> Option<String> {
    let meta = value.get("metadata")?;
    let name = meta.get("name")?.as_str()?;
    Some(match meta.get("namespace").and_then(Value::as_str) {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    })
}

/// Where an object came from, for error messages.
#[derive(Debug, Clone, Copy)]
struct Origin {
    document: usize,
    item: Option<usize>,
    line: usize,
    /// For an object read from here: a part it lacks that the API server requires (a
    /// Service's `spec`), named as a field. At the end of a file it marks a write cut off
    /// mid-object (see [`reject_a_cut_off_end`]).
    lacks: Option<&'static str>,
    /// For an object rejected here: whether the field it was rejected at is absent or empty
    /// in what was written (a port never written reads as 0, out of range), as a write cut
    /// off before it leaves it; not a value written wrong (see [`Loaded::cut_off_end`]).
    absent: bool,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "document {}", self.document)?;
        if let Some(item) = self.item {
            write!(f, " item {item}")?;
        }
        write!(f, " (line {})", self.line)
    }
}

impl Origin {
    fn error(
        &self,
        value: Option<&Value>,
        kind: Option<&str>,
        field: Option<String>,
        message: String,
    ) -> ManifestError {
        ManifestError {
            document: self.document,
            item: self.item,
            line: self.line,
            kind: kind.map(str::to_string),
            object: value.and_then(name_of),
            field,
            message,
            fatal: true,
        }
    }
}

/// Deserializes from the value by reference: the value stays for the error message without a
/// copy of every object (at 30k Services the copies cost as much as the conversion).
fn typed<T: DeserializeOwned>(
    value: &Value,
    origin: Origin,
    kind: &str,
) -> Result<T, ManifestError> {
    serde_path_to_error::deserialize::<_, T>(value).map_err(|e| {
        let path = e.path().to_string();
        let field = (path != ".").then_some(path);
        origin.error(Some(value), Some(kind), field, e.into_inner().to_string())
    })
}

/// What to do with an object that names itself but whose fields do not read into its type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Undecodable {
    /// The reading is final (the YAML parser's, or strict JSON's): reject the object alone.
    Reject,
    /// A fast reader's: it may have typed a plain scalar differently from the YAML parser, so
    /// give the document up to the path that reads it by the field's type.
    GiveUp,
}

/// Reads and converts one object. Errors are those that make the whole file unreadable: no
/// `kind`, or (with [`Undecodable::GiveUp`], or when the object has no name to keep its last
/// good version by) fields that do not read.
fn object(
    value: Value,
    origin: Origin,
    loaded: &mut Loaded,
    origins: &mut Vec<Origin>,
    undecodable: Undecodable,
) -> Result<(), ManifestError> {
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .map(str::to_string);
    let Some(kind) = kind else {
        return Err(origin.error(Some(&value), None, Some("kind".into()), "missing".into()));
    };
    let converted = match kind.as_str() {
        "Service" => {
            typed::<Service>(&value, origin, &kind).map(|o| (service_lacks(&o), o.convert()))
        }
        "EndpointSlice" => {
            typed::<EndpointSlice>(&value, origin, &kind).map(|o| (None, o.convert()))
        }
        "Node" => typed::<Node>(&value, origin, &kind).map(|o| (None, o.convert())),
        "ServiceCIDR" => typed::<ServiceCIDR>(&value, origin, &kind)
            .map(|o| (o.spec.is_none().then_some("spec"), o.convert())),
        other => {
            loaded.skipped_kinds.insert(other.to_string());
            return Ok(());
        }
    };
    match (converted, undecodable, reference_of(&value, &kind)) {
        (Ok((lacks, converted)), _, _) => {
            let absent = match &converted.object {
                Object::Rejected(e) => field_absent(&value, &e.field),
                _ => false,
            };
            let origin = Origin {
                lacks,
                absent,
                ..origin
            };
            accept(converted, origin, loaded, origins)
        }
        (Err(e), Undecodable::Reject, Some(object)) => {
            let absent = field_absent(&value, e.field.as_deref().unwrap_or("."));
            let rejected = ConversionError {
                service: owner_of(&value, &object).map(Box::new),
                object,
                field: e.field.unwrap_or_else(|| ".".into()),
                message: e.message,
                location: None,
            };
            let converted = Converted {
                object: Object::Rejected(Box::new(rejected)),
                warnings: Vec::new(),
            };
            accept(converted, Origin { absent, ..origin }, loaded, origins);
        }
        (Err(e), _, _) => return Err(e),
    }
    Ok(())
}

/// The identity of an object of a kind kpng reads, from its raw value: what a rejected object's
/// last good version is found by. `None` without a name.
fn reference_of(value: &Value, kind: &str) -> Option<ObjectRef> {
    let kind = *Kind::ALL.iter().find(|k| k.as_str() == kind)?;
    let meta = value.get("metadata")?;
    let name = meta.get("name")?.as_str().filter(|n| !n.is_empty())?;
    let namespace = meta
        .get("namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    Some(ObjectRef {
        kind,
        namespace: namespace.into(),
        name: name.into(),
    })
}

/// The Service `object` (read from `value`) concerns, as a rejection of it carries it: its
/// own, or an EndpointSlice's `kubernetes.io/service-name` label's (see
/// [`kpng_k8s::owning_service`]).
fn owner_of(value: &Value, object: &ObjectRef) -> Option<kpng_model::ServiceKey> {
    let label = value
        .pointer("/metadata/labels")
        .and_then(|l| l.get(kpng_k8s::LABEL_SERVICE_NAME))
        .and_then(Value::as_str);
    kpng_k8s::owning_service(object.kind, &object.namespace, &object.name, label)
}

/// `namespace/name`, or `name` for a cluster-scoped object (what [`ManifestError::object`] holds).
fn namespaced_name(object: &ObjectRef) -> String {
    if object.namespace.is_empty() {
        object.name.to_string()
    } else {
        format!("{}/{}", object.namespace, object.name)
    }
}

/// Keeps one converted object; a rejected one gets its place in the file as its location.
fn accept(converted: Converted, origin: Origin, loaded: &mut Loaded, origins: &mut Vec<Origin>) {
    let Converted {
        mut object,
        warnings,
    } = converted;
    if let Object::Rejected(e) = &mut object {
        e.location = Some(origin.to_string());
    } else {
        loaded.warnings.extend(warnings);
    }
    loaded.objects.push(object);
    origins.push(origin);
}

/// How often a long parse reports its progress.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(3);

/// Parses a manifest file.
///
/// An object that names itself but cannot be used is kept as [`Object::Rejected`] (see
/// [`Loaded::objects`]) and the rest of the file loads. What leaves the file unreadable (a
/// document that is not YAML, an object without `kind`, or one that cannot be used and has no
/// name) rejects the whole file, with every such error: the caller keeps its last good load.
///
/// A file with no document at all (empty, or only comments) is rejected too: it is far more
/// often a file caught mid-write than a cluster without Services.
///
/// The YAML parser's budget scales with each document's size (see `yaml_options`), so a
/// `kind: List` of 100k Services loads, while an alias bomb (a few anchors expanded into
/// millions of nodes) is still refused. Write `kind: List` with
/// `items: []` to mean "nothing".
pub fn parse_manifests(text: &str) -> Result<Loaded, ManifestErrors> {
    parse_manifests_with(text, ExpansionLimit::default())
}

/// [`parse_manifests`] with another YAML expansion limit (`--max-yaml-expansion`).
pub fn parse_manifests_with(text: &str, limit: ExpansionLimit) -> Result<Loaded, ManifestErrors> {
    if text
        .lines()
        .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#') || l.trim() == "---")
    {
        return Err(ManifestErrors::one(ManifestError {
            document: 1,
            item: None,
            line: 1,
            kind: None,
            object: None,
            field: None,
            fatal: true,
            message: "the file holds no document (write `kind: List` with `items: []` for an empty cluster)".into(),
        }));
    }
    let mut loaded = Loaded::default();
    let mut origins = Vec::new();
    let mut errors = Vec::new();
    // A large input takes seconds: say how far along it is every few seconds.
    let started = std::time::Instant::now();
    let mut next_report = started + PROGRESS_EVERY;
    // The last document with content: what a write cut off mid-object ends with.
    let mut last_document = 0;
    for (index, (line, doc)) in documents(text).into_iter().enumerate() {
        let document = index + 1;
        if std::time::Instant::now() >= next_report {
            next_report += PROGRESS_EVERY;
            let total_lines = text.lines().count().max(1);
            tracing::info!(
                "still parsing: {document} documents, {} objects so far ({}% of the input, {:.0?})",
                loaded.objects.len(),
                line * 100 / total_lines,
                started.elapsed()
            );
        }
        let origin = Origin {
            document,
            item: None,
            line,
            lacks: None,
            absent: false,
        };
        if doc
            .lines()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
        {
            continue;
        }
        last_document = document;
        // Strict JSON (`kubectl get -o json`) is read by serde_json, and the plain YAML most
        // manifests are written in by the subset reader: both about ten times faster than the
        // YAML parser. A document the subset reader takes but whose objects do not read (a
        // plain `80` where a string belongs, which the YAML parser reads by the field's type)
        // is read again by the YAML parser, which then also words any error.
        // Strict JSON reads exactly as the YAML parser would refuse or read it: its verdict
        // on an object is final.
        if take_items(
            origin,
            &mut loaded,
            &mut origins,
            Undecodable::Reject,
            |take| json::list_items(&doc, take),
        )
        .is_some()
        {
            continue;
        }
        if let Some(value) = json::document(&doc) {
            if let Err(e) = take(
                value,
                origin,
                &mut loaded,
                &mut origins,
                Undecodable::Reject,
            ) {
                errors.push(e);
            }
            continue;
        }
        if take_list_by_items(&doc, origin, &mut loaded, &mut origins).is_some() {
            continue;
        }
        if let Some(value) = yaml_subset::document(&doc) {
            let before = Checkpoint::of(&loaded, &origins);
            if take(
                value,
                origin,
                &mut loaded,
                &mut origins,
                Undecodable::GiveUp,
            )
            .is_ok()
            {
                continue;
            }
            before.restore(&mut loaded, &mut origins);
        }
        // A Service or an EndpointSlice document is read straight into its type (no generic
        // tree in between: half the work). Anything else, and any document that does not read
        // so, takes the generic path, which also words the errors.
        if let Some((lacks, converted)) = direct(&doc, limit) {
            accept(
                converted,
                Origin { lacks, ..origin },
                &mut loaded,
                &mut origins,
            );
            continue;
        }
        let read = serde_saphyr::from_str_with_options(&doc, yaml_options(doc.len(), limit))
            .map_err(|e| {
                let message = yaml_error(&e, doc.len(), limit, origin.line);
                origin.error(None, None, None, message)
            })
            .and_then(|value: Value| {
                take(
                    value,
                    origin,
                    &mut loaded,
                    &mut origins,
                    Undecodable::Reject,
                )
            });
        if let Err(e) = read {
            errors.push(e);
        }
    }
    reject_a_cut_off_end(&mut loaded, &origins, last_document);
    reject_duplicates(&mut loaded, &mut origins);
    loaded.ends_lacking = loaded.ends_rejected()
        && origins
            .last()
            .is_some_and(|o| o.document == last_document && (o.absent || o.lacks.is_some()));
    if !errors.is_empty() {
        // The objects that would be rejected once the file reads are named too, in file
        // order: everything to fix, in one pass.
        errors.extend(loaded.objects.iter().zip(&origins).filter_map(
            |(object, origin)| match object {
                Object::Rejected(e) => Some(ManifestError {
                    kind: Some(e.object.kind.as_str().to_string()),
                    object: Some(namespaced_name(&e.object)),
                    field: Some(e.field.clone()),
                    message: e.message.clone(),
                    fatal: false,
                    ..origin.error(None, None, None, String::new())
                }),
                _ => None,
            },
        ));
        // What made the load fail first: `kpng status` shows the first error, and an object
        // rejected earlier in the file is not why the file was refused.
        errors.sort_by_key(|e| (!e.fatal, e.document, e.item));
        return Err(ManifestErrors { errors });
    }
    Ok(loaded)
}

/// Keeps the objects of one document's value: a single object, or the items of a `kind: List`.
fn take(
    value: Value,
    origin: Origin,
    loaded: &mut Loaded,
    origins: &mut Vec<Origin>,
    undecodable: Undecodable,
) -> Result<(), ManifestError> {
    if value.is_null() {
        return Ok(());
    }
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if !(kind == "List" || (kind.ends_with("List") && value.get("items").is_some())) {
        return object(value, origin, loaded, origins, undecodable);
    }
    let mut value = value;
    let items = match value.get_mut("items").map(Value::take) {
        Some(Value::Array(items)) => items,
        Some(Value::Null) | None => Vec::new(),
        Some(_) => {
            return Err(origin.error(
                None,
                Some(&kind),
                Some("items".into()),
                "must be a list".into(),
            ));
        }
    };
    let item_kind = kind
        .strip_suffix("List")
        .filter(|k| !k.is_empty())
        .map(str::to_string);
    for (i, mut item) in items.into_iter().enumerate() {
        if let (Some(k), Some(map)) = (&item_kind, item.as_object_mut()) {
            map.entry("kind")
                .or_insert_with(|| Value::String(k.clone()));
        }
        let origin = Origin {
            item: Some(i + 1),
            ..origin
        };
        object(item, origin, loaded, origins, undecodable)?;
    }
    Ok(())
}

/// A `kind: List` document read one item at a time (see [`list`]); `None`, with `loaded` and
/// `origins` as they were, when the document is not such a List, or when any part of it is
/// outside the subset reader or does not convert: the whole-document path then reads it as
/// before, and words any error.
fn take_list_by_items(
    doc: &str,
    origin: Origin,
    loaded: &mut Loaded,
    origins: &mut Vec<Origin>,
) -> Option<()> {
    // Any other object's document is not cut (its `kind:` line comes first).
    if top_level_kind(doc).is_some_and(|k| !k.ends_with("List")) {
        return None;
    }
    let split = list::split(doc)?;
    let head = yaml_subset::document(&split.head)?;
    let kind = head.get("kind").and_then(Value::as_str)?;
    if !kind.ends_with("List") {
        return None;
    }
    let item_kind = kind.strip_suffix("List").filter(|k| !k.is_empty());
    take_items(origin, loaded, origins, Undecodable::GiveUp, |take| {
        for text in split.items() {
            let mut item = yaml_subset::document(&text)?;
            if let (Some(k), Some(map)) = (item_kind, item.as_object_mut()) {
                map.entry("kind")
                    .or_insert_with(|| Value::String(k.to_string()));
            }
            if !take(item) {
                return None;
            }
        }
        Some(())
    })
}

/// Converts a List's items as `read` hands them to the closure it is given (which answers
/// whether the item was taken), numbering them for error messages. `None`, with `loaded` and
/// `origins` as they were, when `read` gives up or an item makes the file unreadable (see
/// [`object`]).
fn take_items(
    origin: Origin,
    loaded: &mut Loaded,
    origins: &mut Vec<Origin>,
    undecodable: Undecodable,
    read: impl FnOnce(&mut dyn FnMut(Value) -> bool) -> Option<()>,
) -> Option<()> {
    let before = Checkpoint::of(loaded, origins);
    let mut index = 0;
    let read_all = read(&mut |item| {
        index += 1;
        let origin = Origin {
            item: Some(index),
            ..origin
        };
        object(item, origin, loaded, origins, undecodable).is_ok()
    });
    if read_all.is_none() {
        before.restore(loaded, origins);
    }
    read_all
}

/// What a load held before a fast reader tried a document, so that a reader that gives up
/// leaves nothing behind for the path that reads the document next.
struct Checkpoint {
    objects: usize,
    warnings: usize,
    skipped_kinds: BTreeSet<String>,
}

impl Checkpoint {
    fn of(loaded: &Loaded, origins: &[Origin]) -> Checkpoint {
        debug_assert_eq!(loaded.objects.len(), origins.len());
        Checkpoint {
            objects: loaded.objects.len(),
            warnings: loaded.warnings.len(),
            skipped_kinds: loaded.skipped_kinds.clone(),
        }
    }

    fn restore(self, loaded: &mut Loaded, origins: &mut Vec<Origin>) {
        loaded.objects.truncate(self.objects);
        loaded.warnings.truncate(self.warnings);
        loaded.skipped_kinds = self.skipped_kinds;
        origins.truncate(self.objects);
    }
}

/// The value of a document's top-level `kind:` line (`None` when it has none, or it is not
/// a plain word).
fn top_level_kind(doc: &str) -> Option<&str> {
    doc.lines()
        .find_map(|l| l.strip_prefix("kind:"))
        .map(str::trim)
        .filter(|k| !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric()))
}

/// A Service or EndpointSlice document read straight into its type and converted, with the
/// required part it lacks (see [`Origin::lacks`]); `None` for any other document, when it
/// does not read so, or when it converts to a rejection (the generic path then says why, and
/// whether the field at fault was written at all: [`Origin::absent`]).
fn direct(doc: &str, limit: ExpansionLimit) -> Option<(Option<&'static str>, Converted)> {
    let options = || yaml_options(doc.len(), limit);
    let read = match top_level_kind(doc)? {
        "Service" => serde_saphyr::from_str_with_options::<Service>(doc, options())
            .ok()
            .map(|o| (service_lacks(&o), o.convert())),
        "EndpointSlice" => serde_saphyr::from_str_with_options::<EndpointSlice>(doc, options())
            .ok()
            .map(|o| (None, o.convert())),
        _ => None,
    };
    read.filter(|(_, c)| !matches!(c.object, Object::Rejected(_)))
}

/// Whether `field` (a rejection's path, `spec.ports[0].port`) is absent or null in `value`,
/// the object as written: what a write cut off before the field leaves. A path that does
/// not walk (`.`, the object itself) is not absent.
fn field_absent(value: &Value, field: &str) -> bool {
    if field.is_empty() || field == "." {
        return false;
    }
    let mut at = value;
    for segment in field.split('.') {
        let mut parts = segment.split('[');
        let key = parts.next().unwrap_or_default();
        if !key.is_empty() {
            match at.get(key) {
                Some(v) => at = v,
                None => return true,
            }
        }
        for index in parts {
            let Ok(index) = index.trim_end_matches(']').parse::<usize>() else {
                return false;
            };
            match at.get(index) {
                Some(v) => at = v,
                None => return true,
            }
        }
    }
    at.is_null()
}

/// The part of a Service the API server requires that it lacks: its `spec`, or the ports of
/// one that is neither headless nor an `ExternalName` (the API server's validation).
fn service_lacks(service: &Service) -> Option<&'static str> {
    let Some(spec) = &service.spec else {
        return Some("spec");
    };
    let headless = spec.cluster_ip.as_deref() == Some("None");
    let external_name = spec.type_.as_deref() == Some("ExternalName");
    let no_ports = spec.ports.as_ref().is_none_or(Vec::is_empty);
    (no_ports && !headless && !external_name).then_some("spec.ports")
}

/// The file's last object lacking a part the API server requires (a Service cut off after its
/// `metadata:`, or before its `ports:`) is where a write was cut off mid-object, more likely
/// than a Service meant so: it is rejected, so that its last good version stays and the load
/// deletes nothing (see [`Loaded::ends_rejected`]). Elsewhere in a file such an object is used
/// as written.
fn reject_a_cut_off_end(loaded: &mut Loaded, origins: &[Origin], last_document: usize) {
    let (Some(object), Some(origin)) = (loaded.objects.last_mut(), origins.last()) else {
        return;
    };
    let Some(part) = origin.lacks.filter(|_| origin.document == last_document) else {
        return;
    };
    if matches!(object, Object::Rejected(_)) {
        return;
    }
    let kind = object.kind().as_str();
    *object = Object::Rejected(Box::new(ConversionError {
        object: object.reference(),
        service: object.service().map(Box::new),
        field: part.into(),
        message: format!(
            "missing, and the {kind} ends the file, as a write cut off mid-object does (the \
             API server requires it): its last good version is kept"
        ),
        location: Some(origin.to_string()),
    }));
}

/// An object defined more than once in one file: which copy is meant is unclear, so none is
/// used. The first copy's place holds a rejection naming every copy (the model keeps the
/// object's last good version); the later copies are dropped.
fn reject_duplicates(loaded: &mut Loaded, origins: &mut Vec<Origin>) {
    let mut first_at: BTreeMap<ObjectRef, usize> = BTreeMap::new();
    let mut copies: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (at, object) in loaded.objects.iter().enumerate() {
        match first_at.entry(object.reference()) {
            Entry::Vacant(v) => {
                v.insert(at);
            }
            Entry::Occupied(o) => copies.entry(*o.get()).or_default().push(at),
        }
    }
    if copies.is_empty() {
        return;
    }
    let mut dropped = vec![false; loaded.objects.len()];
    for (first, later) in copies {
        let places: Vec<String> = std::iter::once(first)
            .chain(later.iter().copied())
            .filter_map(|at| origins.get(at).map(Origin::to_string))
            .collect();
        let (Some(object), Some(origin)) = (loaded.objects.get_mut(first), origins.get(first))
        else {
            continue;
        };
        *object = Object::Rejected(Box::new(ConversionError {
            object: object.reference(),
            service: object.service().map(Box::new),
            field: "metadata.name".into(),
            message: format!(
                "defined {} times in the file ({}); none of them is used",
                places.len(),
                places.join(", ")
            ),
            location: Some(origin.to_string()),
        }));
        for at in later {
            if let Some(d) = dropped.get_mut(at) {
                *d = true;
            }
        }
    }
    let mut keep = dropped.iter().map(|d| !d);
    loaded.objects.retain(|_| keep.next().unwrap_or(true));
    let mut keep = dropped.iter().map(|d| !d);
    origins.retain(|_| keep.next().unwrap_or(true));
}

/// How far a document may expand beyond its own size while parsed: YAML nodes per byte of the
/// document (`--max-yaml-expansion`). A node takes at least two bytes (`a:`, `- `, `1,`), so a
/// document without aliases never reaches the default of 1; only anchors and aliases expanded
/// many times over (an alias bomb) do. The parser may also build twice as many events and
/// this many times the document's bytes of scalars.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpansionLimit(pub usize);

impl Default for ExpansionLimit {
    fn default() -> Self {
        ExpansionLimit(1)
    }
}

/// The parser options for a document of `len` bytes: serde-saphyr's defaults (sized for
/// configuration files: 250,000 nodes, 1,000,000 events, 64 MiB of scalars), raised in
/// proportion to the document, so that the limits bound alias expansion rather than honest
/// size.
pub fn yaml_options(len: usize, limit: ExpansionLimit) -> serde_saphyr::Options {
    let mut options = serde_saphyr::Options::default();
    let per_byte = limit.0.max(1);
    if let Some(budget) = options.budget.as_mut() {
        budget.max_nodes = budget.max_nodes.max(len.saturating_mul(per_byte));
        budget.max_events = budget
            .max_events
            .max(len.saturating_mul(per_byte.saturating_mul(2)));
        budget.max_total_scalar_bytes = budget
            .max_total_scalar_bytes
            .max(len.saturating_mul(per_byte));
    }
    options
}

/// A parser error, saying which limit a breached budget was, why it was there and how to
/// raise it. A syntax error's position is the file's line (the parser counts from the
/// document's first line, `first_line` in the file), without the parser's excerpt, whose
/// numbers would be the document's.
fn yaml_error(
    e: &serde_saphyr::Error,
    len: usize,
    limit: ExpansionLimit,
    first_line: usize,
) -> String {
    let text = e.to_string();
    let file_line = |at: &serde_saphyr::Location| {
        u64::try_from(first_line.max(1))
            .unwrap_or(u64::MAX)
            .saturating_add(at.line().saturating_sub(1))
    };
    if let serde_saphyr::Error::Budget {
        breach: serde_saphyr::budget::BudgetBreach::Depth { depth },
        location,
    } = e.without_snippet()
    {
        // Not an expansion: the alias advice below would mislead.
        return format!(
            "invalid YAML: nested {depth} levels deep at line {}, column {} (the limit is {}; \
             no manifest nests so deep)",
            file_line(location),
            location.column(),
            depth.saturating_sub(1)
        );
    }
    if let Some(at) = e.location().filter(|_| !text.contains("budget")) {
        let line = file_line(&at);
        let bare = e.without_snippet().to_string();
        let suffix = format!(" at line {}, column {}", at.line(), at.column());
        let reason = bare.strip_suffix(&suffix).unwrap_or(&bare);
        return format!(
            "invalid YAML: {reason} at line {line}, column {}",
            at.column()
        );
    }
    if text.contains("budget") {
        format!(
            "invalid YAML: {text} (the parser's limits scale with the document's size, \
             {len} bytes, at --max-yaml-expansion {} nodes per byte; beyond them the document \
             expands far more than its size, as YAML anchors and aliases can: write it without \
             aliases, or raise --max-yaml-expansion)",
            limit.0
        )
    } else {
        format!("invalid YAML: {text}")
    }
}

mod json;
mod list;
mod yaml_subset;

#[cfg(test)]
mod tests;
