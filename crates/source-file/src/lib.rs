//! The `file` source: Kubernetes manifests on disk, watched for changes.
//!
//! The input is a file, or a directory of files, holding what `kubectl get svc,endpointslices,nodes,servicecidrs -A -o yaml` prints: a YAML stream of
//! `---`-separated documents, any of which may be a `kind: List`, or the same as JSON (`-o json`):
//! a document that is strict JSON is read by `serde_json`, several times faster than the YAML
//! parser, with the same result (see `parse/json.rs`). Every object is converted to
//! the model's records (`kpng-k8s`) as it is parsed, so no Kubernetes object outlives the load.
//!
//! - A file: every load is sent to the model as one [`kpng_model::Event::Replace`], so the model
//!   diffs it against the previous load and backends see only what changed.
//! - A directory: the first load streams every file's objects as `ListStart`, `ListItem`…,
//!   `ListDone`; after that a changed file sends `Apply`/`Delete` for its own objects only.
//!
//! An object that names itself but cannot be used (a port out of range, a field of the wrong
//! type, an object defined twice) is sent as [`kpng_model::Object::Rejected`], located by file,
//! document and line: the model keeps its last good version and the rest of the file is used,
//! as for a broken object from the API server. A file that cannot be read (a document that is
//! not YAML, an object without `kind` or name) is reported with every such document, and
//! *nothing* is sent: the last good state stays programmed until the file is fixed. Values the
//! conversion dropped are logged with the file's name.
//!
//! Writers should replace the file atomically (write a temporary file, then rename it over the
//! input, as `kubectl`'s ConfigMap mounts and most editors do): a file written in place can be
//! read half-written. So a written file is read once its writer has closed it (where the watcher
//! reports closes, inotify on Linux; at most 10 s after the write began, see `dirwatch`); a load
//! that does not parse, or has a rejected object, is only reported once the file has been quiet
//! for half a second (a newer version within that time is read instead); a load whose last
//! object is rejected, or lacks a part the API server requires (a Service without `spec`: see
//! `parse::reject_a_cut_off_end`), deletes nothing until a version whose end reads; and what a
//! load written in place (the same file as the last good read) no longer has is deleted only
//! once the file has been unchanged for [`DELETE_QUIET`] (`refs`), while what it adds or
//! changes is applied at once. A file replaced atomically is whole: it deletes at once.
//! A *first* load that looks cut off mid-write ([`Loaded::cut_off_end`]: its last object
//! rejected, and the text stopping mid-line or that object lacking a field never written) is
//! not sent as the complete list (its objects are applied one by one, so the runner's first
//! sync waits and rules an earlier kpng left keep routing) until a version that does not look
//! so, or until it has been unchanged for [`FIRST_LIST_WAIT`]. A last object merely written
//! wrong (a value out of range) does not hold it.
//!
//! The source never goes quietly stale: besides inotify on the file's directory, the resolved
//! file (symlinks followed, into any directory) is checked every two seconds, and a
//! re-created directory is watched again. In a directory, each file that is a symlink is
//! re-read when what it leads to changes (a ConfigMap update swaps the `..data` link, an event
//! that names no manifest), checked after every change in the directory and every two seconds. `kpng_source_errors_total{reason}`
//! ([`SourceMetrics`]) counts failed loads, and the input's health record (`kpng status`,
//! `kpng_input_problems`, `kpng_input_last_good_timestamp_seconds`) shows a source that stopped
//! loading.

// Errors are rare, carry the whole location for the operator, and are never on a hot path:
// a large error type is the right trade.
#![allow(clippy::result_large_err)]

mod dir;
mod dirwatch;
mod metrics;
mod parse;
mod refs;
mod watch;

pub use metrics::{ReasonLabel, SourceMetrics};
pub use parse::{
    CutOffEnd, ExpansionLimit, Loaded, ManifestError, ManifestErrors, parse_manifests,
    parse_manifests_with,
};
pub use refs::DELETE_QUIET;
pub use watch::{FIRST_LIST_WAIT, FileSource, SourceError};
