//! Directory input: one manifest per file, re-read per file.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kpng_model::{Event, Kind, Object, ObjectRef};
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use crate::dirwatch::DirWatch;
use crate::parse::{ExpansionLimit, parse_manifests_with};
use crate::refs::{Held, PackedRefs, until};
use crate::watch::{Fingerprint, POLL, SourceError, fingerprint};

fn is_manifest(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "json")
    ) && !path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with('.'))
}

/// What the directory held at its last good read, per file.
#[derive(Default)]
struct DirState {
    /// File → a hash of the text last read (good or bad) and the objects of its last good
    /// read. A hash, not the text: at 30k files the texts alone would be tens of MB. Keyed
    /// by the path's bytes: the files are those of one directory, so this is their order by
    /// name, as a `PathBuf` key's would be, without comparing component by component (which
    /// took 8 % of a 30k-file start's CPU).
    files: BTreeMap<OsString, (u64, PackedRefs)>,
    /// Errors and good loads.
    metrics: crate::metrics::SourceMetrics,
    /// The YAML expansion limit (`--max-yaml-expansion`).
    expansion: ExpansionLimit,
    /// Files that could not be read since the state was made (what the first load reports
    /// beside what it loaded).
    unreadable: usize,
    /// Files whose hash in `files` is of a version that did not parse: the same text again is
    /// still a problem, while the same text as the last good one ends a problem (a file that
    /// could not be read for a moment). Empty unless a file is broken.
    broken: BTreeSet<OsString>,
    /// Files that are symlinks → the identity of the file they led to when last read. A change
    /// behind a link makes no event for the link (kubelet updates a ConfigMap by swapping its
    /// `..data` link to a new directory): these are compared on every change in the directory
    /// and every [`POLL`]. Empty unless a file is a symlink.
    links: BTreeMap<OsString, Option<Fingerprint>>,
    /// Files whose last version lacks objects the one before had: deleted once the file has
    /// been quiet (see [`crate::refs`]); they stay in the file's refs until then.
    held: BTreeMap<OsString, Held>,
    /// Each file's identity at its last good read: a version written in place over it (the
    /// same file) may be caught between its writer's parts; a file replaced atomically is
    /// whole.
    last_good: BTreeMap<OsString, Fingerprint>,
    /// Files whose version in use keeps this many objects only because its last object was
    /// rejected ([`crate::watch::held_back_problem`], an input problem until a version whose
    /// end reads). Empty unless such a file exists.
    held_back: BTreeMap<OsString, usize>,
}

fn text_hash(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

impl DirState {
    /// What is in use while `path` cannot be: its objects as last loaded, or none.
    fn instead(&self, path: &Path) -> &'static str {
        match self.files.get(path.as_os_str()) {
            Some((_, refs)) if refs.lines().next().is_some() => "keeping its last good state",
            _ => "nothing from it is in use until it loads",
        }
    }

    /// Re-reads one file. Returns the events it implies (none when unchanged or broken).
    fn reload(&mut self, path: &Path) -> Vec<Event> {
        // The file's identity before reading: a change after this is seen at the next check.
        let seen = fingerprint(path);
        let is_link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
        if is_link {
            self.links.insert(path.as_os_str().to_owned(), seen);
        } else if !self.links.is_empty() {
            self.links.remove(path.as_os_str());
        }
        self.read(path, seen)
    }

    /// When the next held deletion is due.
    fn next_due(&self) -> Option<tokio::time::Instant> {
        self.held.values().map(|h| h.due).min()
    }

    /// Deletes what the files whose quiet period is over no longer have; a file that changed
    /// meanwhile is read again instead (that version decides).
    fn release_due(&mut self) -> Vec<(PathBuf, Vec<Event>)> {
        let now = tokio::time::Instant::now();
        let due: Vec<OsString> = self
            .held
            .iter()
            .filter(|(_, h)| h.due <= now)
            .map(|(path, _)| path.clone())
            .collect();
        let mut out = Vec::new();
        for key in due {
            let path = PathBuf::from(&key);
            let Some(held) = self.held.get(&key) else {
                continue;
            };
            if fingerprint(&path) != held.seen {
                let events = self.reload(&path);
                // A version that did not load holds nothing: the next one that does decides.
                if self.held.get(&key).is_some_and(|h| h.due <= now) {
                    self.held.remove(&key);
                }
                out.push((path, events));
                continue;
            }
            let Some(held) = self.held.remove(&key) else {
                continue;
            };
            info!(
                "{}: unchanged for {:?}: deleting the {} objects it no longer has",
                path.display(),
                crate::refs::DELETE_QUIET,
                held.gone.len()
            );
            if let Some((_, refs)) = self.files.get_mut(&key) {
                *refs = refs.without(&held.gone);
            }
            out.push((path, held.gone.into_iter().map(Event::Delete).collect()));
        }
        out
    }

    /// The files that are symlinks whose target changed since they were read.
    fn moved_links(&self) -> Vec<PathBuf> {
        self.links
            .iter()
            .filter(|(path, seen)| fingerprint(Path::new(path)) != **seen)
            .map(|(path, _)| PathBuf::from(path))
            .collect()
    }

    /// [`DirState::reload`] without the notes of the file's identity; `seen`: its identity
    /// before reading.
    fn read(&mut self, path: &Path, seen: Option<Fingerprint>) -> Vec<Event> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // The file is gone: so are its objects, and its problem.
                if self
                    .metrics
                    .health
                    .recovered(&path.to_string_lossy())
                    .is_some()
                {
                    info!("{}: removed, so its problem is over", path.display());
                }
                self.broken.remove(path.as_os_str());
                self.held.remove(path.as_os_str());
                self.held_back.remove(path.as_os_str());
                let Some(refs) = self.files.remove(path.as_os_str()).map(|(_, r)| r.unpack())
                else {
                    return Vec::new();
                };
                info!(
                    "{}: removed, deleting its {} objects",
                    path.display(),
                    refs.len()
                );
                return refs.into_iter().map(Event::Delete).collect();
            }
            Err(e) => {
                let instead = self.instead(path);
                warn!("cannot read {}: {e}; {instead}", path.display());
                self.unreadable += 1;
                self.metrics
                    .failed("read", path, &format!("cannot read it: {e}; {instead}"));
                // What a held version lacks stays the file's until a version that loads.
                self.held.remove(path.as_os_str());
                return Vec::new();
            }
        };
        let hash = text_hash(&text);
        if self
            .files
            .get(path.as_os_str())
            .is_some_and(|(last, _)| *last == hash)
        {
            if !self.broken.contains(path.as_os_str()) {
                if let Some(kept) = self.held_back.get(path.as_os_str()) {
                    // Still the version that holds deletions back: that problem goes on.
                    let message = crate::watch::held_back_problem(*kept);
                    let now = std::time::SystemTime::now();
                    self.metrics
                        .health
                        .failing(&path.to_string_lossy(), &message, now);
                } else if let Some(since) = self.metrics.health.recovered(&path.to_string_lossy()) {
                    // The last good version, read again: a read problem meanwhile is over.
                    // Nothing to load (the version is in use), so no other line says it.
                    let now = std::time::SystemTime::now();
                    crate::metrics::log_problem_over(path, since, now);
                    self.metrics.health.good_again(now);
                }
                // Written again: what it lacks waits for a new quiet period.
                if let Some(held) = self.held.get_mut(path.as_os_str()) {
                    held.rewritten(seen);
                }
            }
            return Vec::new();
        }
        match parse_manifests_with(&text, self.expansion) {
            Err(errors) => {
                let instead = self.instead(path);
                errors.log(path, instead);
                self.unreadable += 1;
                self.metrics.failed(
                    "parse",
                    path,
                    &format!("not loaded: {}; {instead}", errors.summary()),
                );
                let refs = self
                    .files
                    .remove(path.as_os_str())
                    .map(|(_, r)| r)
                    .unwrap_or_default();
                self.files.insert(path.as_os_str().to_owned(), (hash, refs));
                self.broken.insert(path.as_os_str().to_owned());
                self.held.remove(path.as_os_str());
                Vec::new()
            }
            Ok(mut loaded) => {
                loaded.log_omissions(path);
                loaded.locate_in(path);
                let was_held_back = self.held_back.remove(path.as_os_str()).is_some();
                // A version that still holds deletions back goes on with that problem.
                let still_held_back = was_held_back && loaded.ends_rejected();
                if !still_held_back && let Some(since) = self.metrics.good_load(path) {
                    let now = std::time::SystemTime::now();
                    crate::metrics::log_problem_over(path, since, now);
                }
                if !self.broken.is_empty() {
                    self.broken.remove(path.as_os_str());
                }
                let mut new_refs: Vec<ObjectRef> =
                    loaded.objects.iter().map(Object::reference).collect();
                let keep: BTreeSet<&ObjectRef> = new_refs.iter().collect();
                let old = self
                    .files
                    .remove(path.as_os_str())
                    .map(|(_, r)| r.unpack())
                    .unwrap_or_default();
                let mut gone: Vec<ObjectRef> =
                    old.into_iter().filter(|r| !keep.contains(r)).collect();
                let before = match seen {
                    Some(now) => self.last_good.insert(path.as_os_str().to_owned(), now),
                    None => self.last_good.remove(path.as_os_str()),
                };
                if !self.held.is_empty() {
                    self.held.remove(path.as_os_str());
                }
                if loaded.ends_rejected() && !gone.is_empty() {
                    // Possibly cut off mid-write: what it no longer has stays its objects.
                    warn!(
                        "{}: {} ({} kept)",
                        path.display(),
                        crate::watch::HELD_DELETIONS,
                        gone.len()
                    );
                    // An input problem too, until a version whose end reads: the warning
                    // alone scrolls away, and `kpng status` said `ok`.
                    let now = std::time::SystemTime::now();
                    self.metrics.health.failing(
                        &path.to_string_lossy(),
                        &crate::watch::held_back_problem(gone.len()),
                        now,
                    );
                    self.held_back
                        .insert(path.as_os_str().to_owned(), gone.len());
                    new_refs.extend(gone);
                    gone = Vec::new();
                } else if still_held_back {
                    // Cut off again, lacking nothing more: the objects kept earlier are in
                    // `old`, so this is only reached when none is kept any more.
                    if let Some(since) = self.metrics.good_load(path) {
                        let now = std::time::SystemTime::now();
                        crate::metrics::log_problem_over(path, since, now);
                    }
                } else if !gone.is_empty() && crate::watch::written_in_place(before, seen) {
                    // Maybe a write in progress: deleted once the file has been quiet.
                    info!(
                        "{}: {}",
                        path.display(),
                        crate::watch::held_until_quiet(gone.len())
                    );
                    new_refs.extend(gone.iter().cloned());
                    self.held
                        .insert(path.as_os_str().to_owned(), Held::new(gone, seen));
                    gone = Vec::new();
                }
                // A file replaced atomically is whole: what it lacks goes at once.
                let mut events: Vec<Event> = gone.into_iter().map(Event::Delete).collect();
                events.extend(loaded.objects.into_iter().map(Event::Apply));
                self.files.insert(
                    path.as_os_str().to_owned(),
                    (hash, PackedRefs::pack(&new_refs)),
                );
                events
            }
        }
    }
}

/// Sends what a change of `path` did, noting it as the last change; false when the receiver
/// is gone.
async fn send_changes(
    state: &DirState,
    path: &Path,
    changes: Vec<Event>,
    events: &mpsc::Sender<Event>,
) -> bool {
    if changes.is_empty() {
        return true;
    }
    state.metrics.health.loaded_with(
        std::time::SystemTime::now(),
        Some(format!("last change from {}", path.display())),
        kpng_model::input::LoadFacts {
            changed_file: Some(path.display().to_string()),
            ..Default::default()
        },
    );
    // One file's changes are one event: applied as one change everywhere (a brain's nodes
    // never see its Service without its EndpointSlice).
    let event = match <[Event; 1]>::try_from(changes) {
        Ok([single]) => single,
        Err(several) => {
            let (mut deleted, mut applied) = (Vec::new(), Vec::new());
            for change in several {
                match change {
                    Event::Delete(reference) => deleted.push(reference),
                    Event::Apply(object) => applied.push(object),
                    other => {
                        if events.send(other).await.is_err() {
                            return false;
                        }
                    }
                }
            }
            Event::Changes { deleted, applied }
        }
    };
    events.send(event).await.is_ok()
}

/// Reads every file once, on as many threads as there are CPUs (each its own share of the
/// files, in order), sending each object as a `ListItem` as soon as it is converted. Returns
/// the merged state and the number of objects, or `None` when the receiver is gone.
///
/// The items of one list are a set, so the threads' interleaving does not matter, with one
/// exception that [`settle_duplicates`] takes care of: an object defined in two files.
fn first_load(
    state: DirState,
    paths: &[PathBuf],
    events: &mpsc::Sender<Event>,
) -> Option<(DirState, usize)> {
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(paths.len().div_ceil(FILES_PER_THREAD_AT_LEAST))
        .max(1);
    let share = paths.len().div_ceil(threads).max(1);
    let load = |mut state: DirState, paths: &[PathBuf]| {
        let mut count = 0usize;
        let mut burst = Vec::with_capacity(SEND_BURST);
        let send = |burst: &mut Vec<Object>| {
            burst
                .drain(..)
                .try_for_each(|o| events.blocking_send(Event::ListItem(o)))
                .ok()
        };
        for path in paths {
            for event in state.reload(path) {
                if let Event::Apply(o) = event {
                    count += 1;
                    burst.push(o);
                    if burst.len() == SEND_BURST {
                        send(&mut burst)?;
                    }
                }
            }
        }
        send(&mut burst)?;
        Some((state, count))
    };
    if threads == 1 {
        let (state, count) = load(state, paths)?;
        settle_duplicates(&state, events)?;
        return Some((state, count));
    }
    let results: Vec<Option<(DirState, usize)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = paths
            .chunks(share)
            .skip(1)
            .map(|part| {
                let state = DirState {
                    metrics: state.metrics.clone(),
                    expansion: state.expansion,
                    ..DirState::default()
                };
                scope.spawn(move || load(state, part))
            })
            .collect();
        let first = load(
            DirState {
                metrics: state.metrics.clone(),
                expansion: state.expansion,
                ..DirState::default()
            },
            paths.get(..share.min(paths.len())).unwrap_or_default(),
        );
        std::iter::once(first)
            .chain(handles.into_iter().map(|h| h.join().ok().flatten()))
            .collect()
    });
    let mut merged = state;
    let mut count = 0;
    for result in results {
        let (mut part, n) = result?;
        // Each part is a later range of names than the one before: a merge, not inserts.
        merged.files.append(&mut part.files);
        merged.unreadable += part.unreadable;
        merged.broken.append(&mut part.broken);
        merged.links.append(&mut part.links);
        count += n;
    }
    let settling = std::time::Instant::now();
    settle_duplicates(&merged, events)?;
    tracing::debug!(
        "checked {} files for objects defined twice in {:.0?}",
        merged.files.len(),
        settling.elapsed()
    );
    Some((merged, count))
}

/// An object defined in more than one file: the file last by name wins, as it would if the
/// files were read one after the other (and as every later edit does). The threads of the
/// first load may have sent the copies in any order, so the winner's copy is sent again, last;
/// each such object is named in a warning. `None` when the receiver is gone.
fn settle_duplicates(state: &DirState, events: &mpsc::Sender<Event>) -> Option<()> {
    // Keyed by each object's packed line (no `ObjectRef` built per object: at 30k files this
    // runs on the start-up's critical path); almost every object has one file.
    let mut definers: std::collections::HashMap<&str, Vec<&Path>> =
        std::collections::HashMap::with_capacity(state.files.len() * 2);
    for (path, (_, refs)) in &state.files {
        let path = Path::new(path);
        for line in refs.lines() {
            let files = definers.entry(line).or_default();
            // An object twice in one file is that file's business (the parse rejects it).
            if files.last() != Some(&path) {
                files.push(path);
            }
        }
    }
    let mut winners: BTreeMap<&Path, BTreeSet<ObjectRef>> = BTreeMap::new();
    for (line, files) in definers {
        // `state.files` is ordered by path, so each list is too.
        let (Some(first), Some(last)) = (files.first(), files.last()) else {
            continue;
        };
        if files.len() < 2 {
            continue;
        }
        let Some(object) = PackedRefs::parse_line(line) else {
            continue;
        };
        warn!(
            "{object} is defined in {} files ({} … {}); the last by name, {}, is used",
            files.len(),
            first.display(),
            last.display(),
            last.display()
        );
        winners.entry(last).or_default().insert(object);
    }
    for (path, objects) in winners {
        let Ok(text) = std::fs::read_to_string(path) else {
            continue;
        };
        let Ok(mut loaded) = parse_manifests_with(&text, state.expansion) else {
            continue;
        };
        loaded.locate_in(path);
        for object in loaded.objects {
            if objects.contains(&object.reference())
                && events.blocking_send(Event::ListItem(object)).is_err()
            {
                return None;
            }
        }
    }
    Some(())
}

/// How many objects a reading thread sends at once. One at a time, the runner (faster than the
/// parsers) empties the channel after each and sleeps: a wake-up per object, a tenth of a
/// start's CPU at 30k Services. Sent back to back, it takes the whole burst per wake-up.
const SEND_BURST: usize = 128;

/// Below this many files per thread, one thread reads them all (threads cost more).
const FILES_PER_THREAD_AT_LEAST: usize = 64;

/// The manifests in `dir`, by the path's bytes (as `DirState::files` is ordered).
fn manifests_in(dir: &Path) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| is_manifest(p))
            .collect(),
        Err(e) => {
            error!("cannot list {}: {e}", dir.display());
            Vec::new()
        }
    };
    paths.sort_by(|a, b| a.as_os_str().cmp(b.as_os_str()));
    paths
}

/// Runs the directory source until the receiver is dropped.
pub(crate) async fn run(
    dir: PathBuf,
    debounce: Duration,
    metrics: crate::metrics::SourceMetrics,
    expansion: ExpansionLimit,
    events: mpsc::Sender<Event>,
) -> Result<(), SourceError> {
    // The watcher names changed files under the directory made absolute; the first load's
    // paths must be the same, or a file read at start is known under another name than its
    // changes and its removal (`--input manifests`) deletes nothing.
    let dir = std::path::absolute(&dir).unwrap_or(dir);
    let mut watch = DirWatch::new(&dir)?;

    // First load: every file, as one complete list, streamed object by object so that no
    // event ever holds the whole cluster. Reading and parsing tens of thousands of files is
    // blocking work: it runs on a blocking thread, which also keeps the parser's short-lived
    // allocations apart from the model's (less fragmentation after a large load).
    //
    // The list is complete only when every file reads: a start (or a brain's restart) with a
    // broken manifest would otherwise tell the model, and every node of a brain, that its
    // objects are gone, and remove rules that work. Until then the list stays open (nothing
    // is applied; an earlier run's rules stay) and is read again after each change.
    let kinds = Kind::ALL.to_vec();
    let (mut state, count, paths) = loop {
        let state = DirState {
            metrics: metrics.clone(),
            expansion,
            ..DirState::default()
        };
        let paths = manifests_in(&dir);
        if events
            .send(Event::ListStart {
                kinds: kinds.clone(),
            })
            .await
            .is_err()
        {
            return Ok(());
        }
        let loader_events = events.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            first_load(state, &paths, &loader_events).map(|(state, count)| (state, count, paths))
        })
        .await;
        let Ok(Some((state, count, paths))) = loaded else {
            return Ok(());
        };
        if state.unreadable == 0 {
            break (state, count, paths);
        }
        warn!(
            "{}: {} of {} files could not be read (see the errors above): nothing from the \
             directory is applied until every file reads, so that a broken manifest at start \
             removes no rules; fix or remove them",
            dir.display(),
            state.unreadable,
            paths.len()
        );
        // Read again after the next change in the directory.
        match watch.next_writes(debounce, &is_manifest).await {
            Some(_) => {}
            None => return Ok(()),
        }
    };
    let files = |n: usize| {
        if n == 1 {
            "1 file".to_string()
        } else {
            format!("{n} files")
        }
    };
    info!(
        "{}: loaded {count} objects from {}",
        dir.display(),
        files(paths.len())
    );
    state.metrics.health.loaded_with(
        std::time::SystemTime::now(),
        Some(format!("{count} objects from {}", files(paths.len()))),
        kpng_model::input::LoadFacts {
            objects: Some(count),
            files: Some(paths.len()),
            changed_file: None,
        },
    );
    if events.send(Event::ListDone { kinds }).await.is_err() {
        return Ok(());
    }

    let mut poll = tokio::time::interval(POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    poll.tick().await;
    loop {
        let mut changed = tokio::select! {
            written = watch.next_writes(debounce, &is_manifest) => match written {
                Some(written) => written.into_iter().filter(|p| is_manifest(p)).collect(),
                None => return Ok(()),
            },
            _ = poll.tick() => BTreeSet::new(),
            _ = until(state.next_due()) => {
                for (path, changes) in state.release_due() {
                    if !send_changes(&state, &path, changes, &events).await {
                        return Ok(());
                    }
                }
                continue;
            }
        };
        // A link whose target changed: after any change in the directory (a `..data` swap
        // names no manifest), and every poll (a link into another directory).
        changed.extend(state.moved_links());
        for path in &changed {
            let changes = state.reload(path);
            if !send_changes(&state, path, changes, &events).await {
                return Ok(());
            }
        }
    }
}
