//! The `file` source: Kubernetes manifests on disk, watched for changes.
//!
//! The input is a file, or a directory of files, holding what `kubectl get svc,endpointslices,nodes,servicecidrs -A -o yaml` prints: a YAML stream of
//! `---`-separated documents, any of which may be a `kind: List`. Every object is converted to
//! the model's records (`kpng-k8s`) as it is parsed, so no Kubernetes object outlives the load.
//!
//! - A file: every load is sent to the model as one [`kpng_model::Event::Replace`], so the model
//!   diffs it against the previous load and backends see only what changed.
//! - A directory: the first load streams every file's objects as `ListStart`, `ListItem`…,
//!   `ListDone`; after that a changed file sends `Apply`/`Delete` for its own objects only.
//!
//! A load that fails (a document that does not parse, an object that cannot be converted) is
//! reported with the document index, kind, namespace/name and field, and *nothing* is sent: the
//! last good state stays programmed until the file is fixed. Values the conversion dropped are
//! logged with the file's name.

// Errors are rare, carry the whole location for the operator, and are never on a hot path:
// a large error type is the right trade.
#![allow(clippy::result_large_err)]

mod dir;
mod dirwatch;
mod parse;
mod watch;

pub use parse::{Loaded, ManifestError, parse_manifests};
pub use watch::{FileSource, SourceError};
