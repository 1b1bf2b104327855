//! Watching the manifest file: inotify on its directory, a short debounce, content comparison.
//!
//! The *directory* is watched, not the file, because editors and `kubectl`/ConfigMap mounts
//! replace files (write a new file, rename it over the old one, or swap a `..data` symlink):
//! a watch on the old inode would go silent. Any event in the directory triggers a re-read, and
//! a re-read whose content is unchanged does nothing.
//!
//! inotify alone can go silent: the directory may be deleted and re-created (the watch stays on
//! the old inode), and the path may be a symlink into another directory whose target changes
//! with no event here. So every [`POLL`] the resolved file's identity (device, inode, size,
//! modification time; symlinks followed) is compared with the last load's, and the directory is
//! watched again when its identity changed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kpng_model::{Event, Kind, Object, ObjectRef};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::dirwatch::DirWatch;
use crate::metrics::SourceMetrics;
use crate::parse::{ExpansionLimit, parse_manifests_with};
use crate::refs::{DELETE_QUIET, Held, PackedRefs, until};

/// How often the resolved file and its directory are checked besides inotify.
pub const POLL: Duration = Duration::from_secs(2);
/// How long a file that does not parse must stay unchanged before the error is reported (a
/// writer that does not rename atomically may still be writing).
pub const QUIET: Duration = Duration::from_millis(500);
/// How many newer versions one reload follows while the file keeps changing.
const MAX_RETRIES: usize = 20;
/// How long a first load that looks cut off mid-write ([`crate::Loaded::cut_off_end`]: its
/// last object rejected, and the text stopping mid-line or that object lacking a part) is
/// held back from being the complete list while the file stays unchanged: the first sync
/// waits for it, so the rules an earlier kpng left keep routing meanwhile; a file that still
/// looks so after this is taken as whole with a broken last object (see docs/reliability.md).
/// A last object that is only written wrong (a value out of range, of the wrong type) does
/// not hold the first list at all.
pub const FIRST_LIST_WAIT: Duration = Duration::from_secs(10);

/// What identifies a version of a file without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fingerprint {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl Fingerprint {
    /// Whether `self` and `other` are the same file (an in-place write keeps it; an atomic
    /// replace, a rename over the path or a ConfigMap's `..data` swap, makes a new one).
    pub(crate) fn same_file(self, other: Fingerprint) -> bool {
        (self.dev, self.ino) == (other.dev, other.ino)
    }
}

/// Whether the version fingerprinted `now` was written in place over the one fingerprinted
/// `before`: only such a write can be caught between its parts, so only its deletions wait
/// for the file to be quiet.
pub(crate) fn written_in_place(before: Option<Fingerprint>, now: Option<Fingerprint>) -> bool {
    matches!((before, now), (Some(b), Some(n)) if b.same_file(n))
}

/// The fingerprint of `path` (symlinks followed); `None` when it cannot be read.
pub(crate) fn fingerprint(path: &Path) -> Option<Fingerprint> {
    let m = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let (dev, ino) = {
        use std::os::unix::fs::MetadataExt;
        (m.dev(), m.ino())
    };
    #[cfg(not(unix))]
    let (dev, ino) = (0, 0);
    Some(Fingerprint {
        dev,
        ino,
        len: m.len(),
        modified: m.modified().ok(),
    })
}

/// Errors that stop the source.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The directory could not be watched.
    #[error("cannot watch {path}: {source}")]
    Watch {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: notify::Error,
    },
    /// The manifest's directory does not exist. A missing file is waited for (it may be
    /// written later), but a directory is what kpng watches, so it must be there at the start.
    #[error(
        "cannot watch {path}: no such directory (the directory of --input must exist when kpng \
         starts; the file in it may come later)"
    )]
    NoDirectory {
        /// The directory.
        path: PathBuf,
    },
}

/// The `file` source.
#[derive(Debug, Clone)]
pub struct FileSource {
    path: PathBuf,
    debounce: Duration,
    metrics: SourceMetrics,
    expansion: ExpansionLimit,
}

impl FileSource {
    /// A source reading `path`, re-reading it `debounce` after the last change event.
    pub fn new(path: impl Into<PathBuf>, debounce: Duration) -> FileSource {
        FileSource {
            path: path.into(),
            debounce,
            metrics: SourceMetrics::default(),
            expansion: ExpansionLimit::default(),
        }
    }

    /// Parses with this YAML expansion limit (`--max-yaml-expansion`) instead of the default.
    pub fn with_expansion_limit(mut self, limit: ExpansionLimit) -> FileSource {
        self.expansion = limit;
        self
    }

    /// Counts errors and good loads in `metrics` (registered by the caller).
    pub fn with_metrics(mut self, metrics: SourceMetrics) -> FileSource {
        self.metrics = metrics;
        self
    }

    fn directory(&self) -> PathBuf {
        match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => Path::new(".").to_path_buf(),
        }
    }

    /// Sends the file's content as [`Event::Replace`] now and after every change, until the
    /// receiver is dropped. Broken content is logged and skipped.
    ///
    /// When the path is a directory, every `*.yaml`, `*.yml` and `*.json` file in it is one
    /// manifest: the first load is one streamed list of all of them, and a change re-reads only
    /// the files that changed and sends `Apply`/`Delete` for their objects. That keeps one change
    /// O(that file) however large the cluster. A path missing at start that appears as a
    /// directory is read as one from then on.
    pub async fn run(self, events: mpsc::Sender<Event>) -> Result<(), SourceError> {
        let is_dir = self.path.is_dir();
        self.metrics.health.set_source(format!(
            "{} {}",
            if is_dir { "directory" } else { "file" },
            self.path.display()
        ));
        if is_dir {
            return crate::dir::run(
                self.path,
                self.debounce,
                self.metrics,
                self.expansion,
                events,
            )
            .await;
        }
        let directory = self.directory();
        let mut watch = DirWatch::new(&directory)?;
        let mut watched = fingerprint(&directory).map(|f| (f.dev, f.ino));

        // The manifest, as the watch names it (`dir/name`, whatever `self.path` looks like).
        let name = self.path.file_name().map(ToOwned::to_owned);
        let is_input = |path: &Path| name.is_some() && path.file_name() == name.as_deref();
        let mut state = ReloadState::default();
        if !self.reload(&events, &mut state).await {
            return Ok(());
        }
        let mut poll = tokio::time::interval(POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        poll.tick().await;
        loop {
            tokio::select! {
                written = watch.next_writes(self.debounce, &is_input) => {
                    if written.is_none() {
                        return Ok(());
                    }
                }
                _ = until(state.first_list_held.as_ref().map(|h| h.until)) => {
                    // Unchanged for FIRST_LIST_WAIT and still cut off: its end is taken as a
                    // broken last object, and the version is read again as the complete list.
                    warn!(
                        "{}: still looks cut off mid-write after {FIRST_LIST_WAIT:?} unchanged: \
                         taking it as the complete list, its last object broken (the first sync \
                         follows; what an earlier kpng programmed that the file lacks is removed)",
                        self.path.display()
                    );
                    state.first_list_held = None;
                    state.good = None;
                    state.take_as_whole = true;
                    let alive = self.reload(&events, &mut state).await;
                    state.take_as_whole = false;
                    if !alive {
                        return Ok(());
                    }
                    continue;
                }
                _ = until(state.held.as_ref().map(|h| h.due)) => {
                    if !self.release_held(&events, &mut state).await {
                        return Ok(());
                    }
                    continue;
                }
                _ = poll.tick() => {
                    let now = fingerprint(&directory).map(|f| (f.dev, f.ino));
                    if now.is_some() && now != watched {
                        match DirWatch::new(&directory) {
                            Ok(w) => {
                                info!("{} was re-created: watching it again", directory.display());
                                watch = w;
                                watched = now;
                            }
                            Err(e) => warn!("{e}"),
                        }
                    }
                    // Unchanged, or being written (read once its writer closes it).
                    if fingerprint(&self.path) == state.seen || watch.writing(&is_input) {
                        continue;
                    }
                }
            }
            if self.path.is_dir() {
                break;
            }
            if !self.reload(&events, &mut state).await {
                return Ok(());
            }
        }
        // The path was missing at start (a volume not mounted yet, a directory created
        // later) and is a directory now: read it as one, its first load replacing whatever
        // the path held before.
        info!(
            "{} is a directory now: reading every manifest in it",
            self.path.display()
        );
        self.metrics.health.recovered_all();
        self.metrics
            .health
            .set_source(format!("directory {}", self.path.display()));
        drop(watch);
        crate::dir::run(
            self.path,
            self.debounce,
            self.metrics,
            self.expansion,
            events,
        )
        .await
    }

    /// A first load that looks cut off mid-write (`cut`): its objects are applied one by one,
    /// not sent as the complete list, so the runner's first sync waits and removes nothing the
    /// rules an earlier kpng left serve (crash44: a restart between a writer's two parts
    /// removed 1,797 Services for 2.5 s). An input problem names the file and where it looks
    /// cut until a version that does not look so, or [`FIRST_LIST_WAIT`] without a change.
    /// Returns false when the receiver is gone.
    async fn hold_first_list(
        &self,
        events: &mpsc::Sender<Event>,
        state: &mut ReloadState,
        text: &str,
        loaded: crate::parse::Loaded,
        cut: crate::parse::CutOffEnd,
    ) -> bool {
        let problem = first_list_held_problem(&cut);
        warn!("{}: {problem}", self.path.display());
        // What the model has from the file: this version's objects and an earlier held one's.
        let mut refs = state.refs.unpack();
        refs.extend(loaded.objects.iter().map(Object::reference));
        refs.sort();
        refs.dedup();
        state.refs = PackedRefs::pack(&refs);
        state.good = Some(state.digests.of(text));
        state.bad = None;
        let now = std::time::SystemTime::now();
        let health = &self.metrics.health;
        health.failing(&self.path.to_string_lossy(), &problem, now);
        state.first_list_held = Some(FirstListHeld {
            until: tokio::time::Instant::now() + FIRST_LIST_WAIT,
            problem,
        });
        health.loaded(
            now,
            Some(objects_loaded(loaded.objects.len(), loaded.rejected())),
        );
        for object in loaded.objects {
            if events.send(Event::Apply(object)).await.is_err() {
                return false;
            }
        }
        true
    }

    /// Deletes what the version in use lacks, once it has been unchanged for [`DELETE_QUIET`];
    /// a file that changed meanwhile is read again instead (that version decides). Returns
    /// false when the receiver is gone.
    async fn release_held(&self, events: &mpsc::Sender<Event>, state: &mut ReloadState) -> bool {
        let Some(seen) = state.held.as_ref().map(|h| h.seen) else {
            return true;
        };
        if fingerprint(&self.path) != seen {
            let alive = self.reload(events, state).await;
            // A version that did not load holds nothing: the next one that does decides.
            if state
                .held
                .as_ref()
                .is_some_and(|h| h.due <= tokio::time::Instant::now())
            {
                state.held = None;
            }
            return alive;
        }
        let Some(held) = state.held.take() else {
            return true;
        };
        info!(
            "{}: unchanged for {DELETE_QUIET:?}: deleting the {} objects it no longer has",
            self.path.display(),
            held.gone.len()
        );
        state.refs = state.refs.without(&held.gone);
        for gone in held.gone {
            if events.send(Event::Delete(gone)).await.is_err() {
                return false;
            }
        }
        true
    }

    /// Re-reads the file; returns false when the receiver is gone.
    async fn reload(&self, events: &mpsc::Sender<Event>, state: &mut ReloadState) -> bool {
        let before = state.seen;
        let mut retries = 0;
        let (text, parsed) = loop {
            let seen = fingerprint(&self.path);
            state.seen = seen;
            let text = match std::fs::read_to_string(&self.path) {
                Ok(t) => t,
                Err(e) => {
                    // Mid-replace the file may be briefly missing; the next event re-reads it.
                    let instead = state.instead();
                    warn!("cannot read {}: {e}; {instead}", self.path.display());
                    self.metrics.failed(
                        "read",
                        &self.path,
                        &format!("cannot read it: {e}; {instead}"),
                    );
                    return true;
                }
            };
            let digest = state.digests.of(&text);
            if state.good == Some(digest) {
                // The version in use, read again (back from a broken edit, or readable again
                // after a moment): whatever went wrong meanwhile is over.
                state.bad = None;
                if let Some(held) = &state.first_list_held {
                    // Still the cut-off first version: the first list is still held.
                    let now = std::time::SystemTime::now();
                    self.metrics
                        .health
                        .failing(&self.path.to_string_lossy(), &held.problem, now);
                } else if let Some(kept) = state.held_back {
                    // Still the version that holds deletions back: that problem goes on (a
                    // read problem meanwhile ends with it).
                    let message = held_back_problem(kept);
                    let now = std::time::SystemTime::now();
                    self.metrics
                        .health
                        .failing(&self.path.to_string_lossy(), &message, now);
                } else if let Some(since) = self.metrics.health.recovered_all() {
                    // Nothing to load (the version is in use), so no other line says it.
                    let now = std::time::SystemTime::now();
                    crate::metrics::log_problem_over(&self.path, since, now);
                    self.metrics.health.good_again(now);
                }
                // Written again: what it lacks waits for a new quiet period.
                if let Some(held) = &mut state.held {
                    held.rewritten(seen);
                }
                return true;
            }
            if state.bad == Some(digest) {
                return true;
            }
            let parsed = parse_manifests_with(&text, self.expansion);
            // A file caught mid-write often reads with a broken object rather than not at all.
            let clean = parsed.as_ref().is_ok_and(|l| l.rejected() == 0);
            if clean || retries >= MAX_RETRIES {
                break (text, parsed);
            }
            // Maybe caught mid-write: report it only once the file has been quiet.
            tokio::time::sleep(QUIET).await;
            if fingerprint(&self.path) == seen {
                break (text, parsed);
            }
            retries += 1;
        };
        match parsed {
            Err(errors) => {
                let instead = state.instead();
                errors.log(&self.path, instead);
                self.metrics.failed(
                    "parse",
                    &self.path,
                    &format!("not loaded: {}; {instead}", errors.summary()),
                );
                state.bad = Some(state.digests.of(&text));
                true
            }
            Ok(mut loaded) => {
                loaded.log_omissions(&self.path);
                loaded.locate_in(&self.path);
                match loaded.rejected() {
                    0 => info!(
                        "{}: loaded {} objects",
                        self.path.display(),
                        loaded.objects.len()
                    ),
                    rejected => info!(
                        "{}: loaded {} objects, {rejected} of them rejected",
                        self.path.display(),
                        loaded.objects.len()
                    ),
                }
                let mut refs: Vec<ObjectRef> =
                    loaded.objects.iter().map(Object::reference).collect();
                // No complete list sent yet: the first load, or one held as cut off.
                let listing = state.good.is_none() || state.first_list_held.is_some();
                // Only an end that looks cut off holds it: a last object merely written wrong
                // is the operator's, and the list is complete (`Loaded::cut_off_end`).
                let cut = (listing && !state.take_as_whole)
                    .then(|| loaded.cut_off_end(&text))
                    .flatten();
                if let Some(cut) = cut {
                    return self
                        .hold_first_list(events, state, &text, loaded, cut)
                        .await;
                }
                state.first_list_held = None;
                let gone = match state.good {
                    Some(_) if !listing => state.refs.gone_from(&refs),
                    _ => Vec::new(),
                };
                state.held = None;
                // A possibly cut-off file after a good one: apply what it has, delete nothing
                // until a version whose end reads. Another version written in place that lacks
                // objects may be a write in progress: they are deleted once the file has been
                // quiet. A file replaced atomically is whole: its deletions apply at once.
                let cut_off = !listing && loaded.ends_rejected();
                let wait_for_quiet =
                    !cut_off && !gone.is_empty() && written_in_place(before, state.seen);
                let hold_deletions = cut_off || wait_for_quiet;
                // Objects kept only because the file may be cut off: an input problem until a
                // version whose end reads (a warning alone scrolls away).
                let held_back = (cut_off && !gone.is_empty()).then_some(gone.len());
                if cut_off {
                    warn!("{}: {HELD_DELETIONS}", self.path.display());
                } else if wait_for_quiet {
                    info!("{}: {}", self.path.display(), held_until_quiet(gone.len()));
                    state.held = Some(Held::new(gone.clone(), state.seen));
                }
                if hold_deletions {
                    refs.extend(gone);
                }
                state.refs = PackedRefs::pack(&refs);
                state.good = Some(state.digests.of(&text));
                state.bad = None;
                let health = &self.metrics.health;
                let now = std::time::SystemTime::now();
                let still_held_back = held_back.is_some() && state.held_back.is_some();
                if !still_held_back {
                    let since = match (self.metrics.good_load(&self.path), health.recovered_all()) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    if let Some(since) = since {
                        crate::metrics::log_problem_over(&self.path, since, now);
                    }
                }
                if let Some(kept) = held_back {
                    health.failing(&self.path.to_string_lossy(), &held_back_problem(kept), now);
                }
                state.held_back = held_back;
                health.loaded(
                    now,
                    Some(objects_loaded(loaded.objects.len(), loaded.rejected())),
                );
                if hold_deletions {
                    // Each object on its own: a list would delete what it does not have.
                    for object in loaded.objects {
                        if events.send(Event::Apply(object)).await.is_err() {
                            return false;
                        }
                    }
                    return true;
                }
                let event = Event::Replace {
                    kinds: Kind::ALL.to_vec(),
                    objects: loaded.objects,
                };
                events.send(event).await.is_ok()
            }
        }
    }
}

/// The input problem (and WARN line) of a first load that looks cut off mid-write (`cut`
/// says where): it is not taken as the complete list, so the first sync waits, until a
/// version that does not look cut off, or [`FIRST_LIST_WAIT`] without a change.
pub(crate) fn first_list_held_problem(cut: &crate::parse::CutOffEnd) -> String {
    format!(
        "the first sync waits: the file looks cut off mid-write ({cut}); its objects are applied \
         but it is not taken as the complete list, so nothing an earlier kpng programmed is \
         removed, until a version that does not look cut off, or for at most \
         {FIRST_LIST_WAIT:?} while it stays unchanged"
    )
}

/// A first list held because the file looks cut off ([`FileSource::hold_first_list`]).
struct FirstListHeld {
    /// When the version is taken as whole anyway.
    until: tokio::time::Instant,
    /// The input problem shown meanwhile ([`first_list_held_problem`]).
    problem: String,
}

/// Why a load whose last object was rejected deletes nothing ([`crate::parse::Loaded::ends_rejected`]).
pub(crate) const HELD_DELETIONS: &str = "its last object was rejected, as in a file cut off \
    mid-write: objects no longer in it are kept, not deleted, until a version whose last object \
    reads (fix or remove that object to apply deletions)";

/// The input problem of a manifest whose last object was rejected while it lacks `kept`
/// objects an earlier version had ([`HELD_DELETIONS`]): shown by `kpng status` and counted in
/// `kpng_input_problems` until a version whose last object reads, as the WARNING line alone
/// left it unseen.
pub(crate) fn held_back_problem(kept: usize) -> String {
    let kept = match kept {
        1 => "1 object no longer in it is kept".to_string(),
        n => format!("{n} objects no longer in it are kept"),
    };
    format!(
        "loaded, but its last object was rejected, as in a file cut off mid-write: {kept}, not \
         deleted; deletions are held back until the file is whole (fix or remove that object)"
    )
}

/// Why a load that lacks objects the last one had does not delete them yet.
pub(crate) fn held_until_quiet(gone: usize) -> String {
    format!(
        "{gone} objects are no longer in it: they are deleted once it has been unchanged for \
         {DELETE_QUIET:?} (it was written in place, not renamed over atomically, and its writer \
         may not have written them yet)"
    )
}

/// What a load held, in words, for `kpng status`.
pub(crate) fn objects_loaded(objects: usize, rejected: usize) -> String {
    match rejected {
        0 => format!("{objects} objects"),
        _ => format!("{objects} objects, {rejected} of them rejected"),
    }
}

#[derive(Default)]
struct ReloadState {
    /// The version last loaded.
    good: Option<TextDigest>,
    /// The version last refused (reported once).
    bad: Option<TextDigest>,
    /// The fingerprint of the version last read.
    seen: Option<Fingerprint>,
    digests: Digests,
    /// What the model has from the file: the last load's objects, and those it lacks but are
    /// kept (cut off, or held until the file is quiet).
    refs: PackedRefs,
    /// Deletions waiting for the file to be quiet.
    held: Option<Held>,
    /// How many objects the version in use keeps only because its last object was rejected
    /// ([`held_back_problem`]); `None` when its end reads.
    held_back: Option<usize>,
    /// While the first load looks cut off and no complete list was sent: when it is taken as
    /// whole anyway ([`FileSource::hold_first_list`]).
    first_list_held: Option<FirstListHeld>,
    /// The next load is the complete list even if its last object is rejected.
    take_as_whole: bool,
}

impl ReloadState {
    /// What is in use while the file cannot be: its last good version, or nothing yet.
    fn instead(&self) -> &'static str {
        if self.good.is_some() {
            "keeping the last good state"
        } else {
            "nothing from it is in use until it loads"
        }
    }
}

/// A manifest's text, recognised without keeping it: its length and two 64-bit SipHash values
/// under independent random keys. Why not the text: a `kubectl get … -o yaml` dump of a large
/// cluster is hundreds of megabytes, and a copy of it would stay resident for as long as kpng
/// runs, only to tell an unchanged file (an editor's or a neighbour's write in the directory)
/// from a changed one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TextDigest {
    len: usize,
    a: u64,
    b: u64,
}

/// The keys one source digests its manifest's versions with.
#[derive(Default)]
struct Digests {
    a: std::hash::RandomState,
    b: std::hash::RandomState,
}

impl Digests {
    fn of(&self, text: &str) -> TextDigest {
        use std::hash::BuildHasher;
        TextDigest {
            len: text.len(),
            a: self.a.hash_one(text),
            b: self.b.hash_one(text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (case, first version, second version, whether they are the same version)
    #[test]
    fn a_version_is_recognised_by_its_digest() {
        let manifest = "kind: Service\nmetadata: {namespace: ns, name: web}\n";
        let cases = [
            ("the same text", manifest, manifest, true),
            (
                "one character changed, same length",
                manifest,
                "kind: Service\nmetadata: {namespace: ns, name: wex}\n",
                false,
            ),
            ("a line added", manifest, "kind: Service\n", false),
            ("both empty", "", "", true),
            ("emptied", manifest, "", false),
        ];
        let digests = Digests::default();
        for (case, first, second, same) in cases {
            assert_eq!(digests.of(first) == digests.of(second), same, "{case}");
        }
    }
}
