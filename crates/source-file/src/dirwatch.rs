//! A watched directory: inotify (through `notify`) plus the debounce both sources share.
//!
//! A change is taken once the directory's writes have been quiet for the debounce, and, where
//! the watcher reports a writer closing its file (inotify's `IN_CLOSE_WRITE`, on Linux), once
//! the files that matter were closed: a writer that does not rename atomically (a shell loop,
//! `helm template … > file`) may pause longer than the debounce between its parts, and its
//! file read in between is a cut-off manifest.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tracing::warn;

use crate::watch::SourceError;

/// A directory being watched. Directories, not files, are watched: editors and ConfigMap mounts
/// replace files, and a watch on the old inode would go silent.
pub(crate) struct DirWatch {
    dir: PathBuf,
    rx: mpsc::UnboundedReceiver<notify::Result<notify::Event>>,
    /// Files written and not yet closed.
    writers: Writers,
    /// Paths written whose quiet period [`DirWatch::next_writes`] was waiting for when it was
    /// cancelled (a `select!` whose other branch won: a poll, a held deletion falling due):
    /// the next call returns them, instead of losing the change.
    written: BTreeSet<PathBuf>,
    // Dropping the watcher ends the watch.
    _watcher: RecommendedWatcher,
}

/// How long a file written and not closed is waited for before it is read anyway: a writer
/// may keep its file open (or the close may be lost when the kernel's event queue
/// overflows), and the file must be read some time.
pub(crate) const UNCLOSED_WAIT: Duration = Duration::from_secs(10);

/// Files a writer has open: written (`IN_MODIFY`) and not yet closed, with when their write
/// began. Only where the watcher reports closes (Linux's inotify); elsewhere always empty.
#[derive(Debug, Default)]
pub(crate) struct Writers(BTreeMap<PathBuf, tokio::time::Instant>);

impl Writers {
    /// Takes note of one event.
    fn note(&mut self, event: &notify::Event) {
        use notify::event::{AccessKind, AccessMode, EventKind, ModifyKind};
        if !cfg!(any(target_os = "linux", target_os = "android")) {
            return;
        }
        match event.kind {
            EventKind::Modify(ModifyKind::Data(_)) => {
                let now = tokio::time::Instant::now();
                for path in &event.paths {
                    self.0.entry(path.clone()).or_insert(now);
                }
            }
            // Closed, or the name now names another file (created, removed, renamed).
            EventKind::Access(AccessKind::Close(AccessMode::Write))
            | EventKind::Create(_)
            | EventKind::Remove(_)
            | EventKind::Modify(ModifyKind::Name(_)) => {
                for path in &event.paths {
                    self.0.remove(path);
                }
            }
            _ => {}
        }
    }

    /// Until when a write of a file that matters may still be waited for: `None` when no such
    /// file is open (or each has been open longer than [`UNCLOSED_WAIT`]).
    fn open_until(&self, matters: &(dyn Fn(&Path) -> bool + Sync)) -> Option<tokio::time::Instant> {
        let now = tokio::time::Instant::now();
        self.0
            .iter()
            .filter(|(path, _)| matters(path))
            .map(|(_, since)| *since + UNCLOSED_WAIT)
            .filter(|until| *until > now)
            .max()
    }
}

impl DirWatch {
    /// Starts watching `dir` (not recursively).
    pub(crate) fn new(dir: &Path) -> Result<DirWatch, SourceError> {
        if !dir.is_dir() {
            return Err(SourceError::NoDirectory {
                path: dir.to_path_buf(),
            });
        }
        let err = |source| SourceError::Watch {
            path: dir.to_path_buf(),
            source,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let mut watcher = notify::recommended_watcher(move |res| {
            // The receiver only goes away when the source stops.
            let _ = tx.send(res);
        })
        .map_err(err)?;
        watcher
            .watch(dir, RecursiveMode::NonRecursive)
            .map_err(err)?;
        Ok(DirWatch {
            dir: dir.to_path_buf(),
            rx,
            writers: Writers::default(),
            written: BTreeSet::new(),
            _watcher: watcher,
        })
    }

    /// Waits for something to be written in the directory, then until it has been quiet for
    /// `debounce` (but never longer than ten debounce periods, so an always-busy directory
    /// cannot starve us) and each written file that `matters` was closed by its writer (for
    /// at most [`UNCLOSED_WAIT`]). Returns the paths written, or `None` when the watch has
    /// ended.
    pub(crate) async fn next_writes(
        &mut self,
        debounce: Duration,
        matters: &(dyn Fn(&Path) -> bool + Sync),
    ) -> Option<BTreeSet<PathBuf>> {
        next_writes(
            &mut self.rx,
            &self.dir,
            debounce,
            &mut self.writers,
            &mut self.written,
            matters,
        )
        .await
    }

    /// Whether a file that `matters` is being written (written, not yet closed, for less than
    /// [`UNCLOSED_WAIT`]): a poll must not read it half-written.
    pub(crate) fn writing(&self, matters: &(dyn Fn(&Path) -> bool + Sync)) -> bool {
        self.writers.open_until(matters).is_some()
    }
}

/// [`DirWatch::next_writes`] over the watcher's channel. Only writes make the directory busy:
/// a process that reads a file beside the manifest (a poller, a backup, kpng itself) must not
/// hold every change back until the ten periods are up.
///
/// Cancellation-safe: what has been received is kept in `changed` (the watch's own), and a call
/// that finds it non-empty (its predecessor was cancelled) waits only for the quiet period.
async fn next_writes(
    rx: &mut mpsc::UnboundedReceiver<notify::Result<notify::Event>>,
    dir: &Path,
    debounce: Duration,
    writers: &mut Writers,
    changed: &mut BTreeSet<PathBuf>,
    matters: &(dyn Fn(&Path) -> bool + Sync),
) -> Option<BTreeSet<PathBuf>> {
    while changed.is_empty() {
        match rx.recv().await? {
            Err(e) => warn!("file watch error on {}: {e}", dir.display()),
            Ok(ev) if is_write(&ev) => {
                writers.note(&ev);
                changed.extend(ev.paths);
                break;
            }
            Ok(_) => {}
        }
    }
    if debounce.is_zero() {
        // No quiet period: take what is already queued. (A timer for "now" would fire on
        // the timer wheel's next millisecond tick, a delay on every change.)
        loop {
            match rx.try_recv() {
                Ok(Ok(ev)) if is_write(&ev) => {
                    writers.note(&ev);
                    changed.extend(ev.paths);
                }
                Ok(_) => {}
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => return None,
            }
        }
        if writers.open_until(matters).is_none() {
            return Some(std::mem::take(changed));
        }
    }
    let give_up = tokio::time::Instant::now() + debounce * 10;
    let mut quiet_until = (tokio::time::Instant::now() + debounce).min(give_up);
    loop {
        // A file still open for writing is read once its writer closes it.
        let until = writers
            .open_until(matters)
            .map_or(quiet_until, |open| open.max(quiet_until));
        match tokio::time::timeout_at(until, rx.recv()).await {
            Ok(Some(Ok(ev))) if is_write(&ev) => {
                writers.note(&ev);
                changed.extend(ev.paths);
                quiet_until = (tokio::time::Instant::now() + debounce).min(give_up);
            }
            Ok(Some(Err(e))) => warn!("file watch error on {}: {e}", dir.display()),
            Ok(Some(Ok(_))) => {}
            Ok(None) => return None,
            Err(_) => return Some(std::mem::take(changed)),
        }
    }
}

/// Whether an event can have changed a file: reads (open, access, close after reading) cannot.
fn is_write(event: &notify::Event) -> bool {
    use notify::event::{AccessKind, AccessMode, EventKind};
    match event.kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{
        AccessKind, AccessMode, CreateKind, DataChange, Event, EventKind, ModifyKind,
    };
    use tokio::time::Instant;

    fn event(kind: EventKind, path: &str) -> notify::Result<Event> {
        Ok(Event::new(kind).add_path(PathBuf::from(path)))
    }

    fn write(path: &str) -> notify::Result<Event> {
        event(
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
            path,
        )
    }

    /// Data written, the file still open.
    fn modify(path: &str) -> notify::Result<Event> {
        event(EventKind::Modify(ModifyKind::Data(DataChange::Any)), path)
    }

    /// The files that matter in these tests.
    fn is_yaml(path: &Path) -> bool {
        path.extension().is_some_and(|e| e == "yaml")
    }

    fn read(path: &str) -> notify::Result<Event> {
        event(EventKind::Access(AccessKind::Close(AccessMode::Read)), path)
    }

    /// Events, each with its delay in milliseconds from the previous one.
    type Timeline = Vec<(u64, notify::Result<Event>)>;

    /// Sends `events` one after the other, each after its delay from the previous one.
    fn feed(tx: mpsc::UnboundedSender<notify::Result<Event>>, events: Timeline) {
        tokio::spawn(async move {
            for (after_ms, ev) in events {
                tokio::time::sleep(Duration::from_millis(after_ms)).await;
                if tx.send(ev).is_err() {
                    return;
                }
            }
            // Keep the channel open: the end of the watch is another case.
            std::future::pending::<()>().await;
        });
    }

    /// (case, events as (delay from the previous one in ms, event), expected paths, expected
    /// time from the first write to the return in ms), with a debounce of 100 ms.
    #[tokio::test(start_paused = true)]
    async fn a_change_is_taken_once_writes_have_been_quiet_for_the_debounce() {
        let reads_every_20ms: Vec<_> = (0..50).map(|_| (20, read("/d/out.yaml"))).collect();
        let cases: Vec<(&str, Timeline, Vec<&str>, u64)> = vec![
            (
                "one write",
                vec![(0, write("/d/m.yaml"))],
                vec!["/d/m.yaml"],
                100,
            ),
            (
                "reads before the write are not changes",
                vec![(0, read("/d/m.yaml")), (30, write("/d/m.yaml"))],
                vec!["/d/m.yaml"],
                100,
            ),
            (
                "reads of a file beside the manifest do not hold the change back",
                std::iter::once((0, write("/d/m.yaml")))
                    .chain(reads_every_20ms)
                    .collect(),
                vec!["/d/m.yaml"],
                100,
            ),
            (
                "writes 50 ms apart extend the quiet period",
                vec![
                    (0, write("/d/a.yaml")),
                    (50, event(EventKind::Create(CreateKind::File), "/d/b.yaml")),
                    (50, write("/d/b.yaml")),
                ],
                vec!["/d/a.yaml", "/d/b.yaml"],
                200,
            ),
            (
                "a file written in parts is taken once its writer closes it",
                vec![
                    (0, modify("/d/m.yaml")),
                    (500, modify("/d/m.yaml")),
                    (1000, write("/d/m.yaml")),
                ],
                vec!["/d/m.yaml"],
                1500,
            ),
            (
                "a file never closed is taken after UNCLOSED_WAIT",
                vec![(0, modify("/d/m.yaml"))],
                vec!["/d/m.yaml"],
                10_000,
            ),
            (
                "a file that does not matter, left open, does not hold a change back",
                vec![(0, modify("/d/log.txt")), (0, write("/d/m.yaml"))],
                vec!["/d/log.txt", "/d/m.yaml"],
                100,
            ),
            (
                "a file replaced by a rename is no longer waited for",
                vec![
                    (0, modify("/d/m.yaml")),
                    (
                        0,
                        event(
                            EventKind::Modify(ModifyKind::Name(notify::event::RenameMode::To)),
                            "/d/m.yaml",
                        ),
                    ),
                ],
                vec!["/d/m.yaml"],
                100,
            ),
            (
                "a directory that never goes quiet is read after ten periods",
                std::iter::once((0, write("/d/m.yaml")))
                    .chain((0..100).map(|_| (50, write("/d/m.yaml"))))
                    .collect(),
                vec!["/d/m.yaml"],
                1000,
            ),
        ];
        for (case, events, paths, after_ms) in cases {
            let (tx, mut rx) = mpsc::unbounded_channel();
            let first_write_at = events
                .iter()
                .position(|(_, ev)| ev.as_ref().is_ok_and(is_write))
                .map(|i| events[..=i].iter().map(|(ms, _)| ms).sum::<u64>())
                .expect("every case writes");
            let start = Instant::now();
            feed(tx, events);
            let got = next_writes(
                &mut rx,
                Path::new("/d"),
                Duration::from_millis(100),
                &mut Writers::default(),
                &mut BTreeSet::new(),
                &is_yaml,
            )
            .await
            .expect("the watch goes on");
            let took = Instant::now() - start - Duration::from_millis(first_write_at);
            let want: BTreeSet<PathBuf> = paths.into_iter().map(PathBuf::from).collect();
            assert_eq!(got, want, "{case}");
            assert_eq!(took, Duration::from_millis(after_ms), "{case}");
        }
    }

    /// A wait cancelled within the quiet period (the source's poll or a held deletion fell due
    /// first) loses nothing: the next wait returns what the cancelled one had received.
    #[tokio::test(start_paused = true)]
    async fn a_wait_cancelled_in_its_quiet_period_keeps_what_it_received() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        tx.send(write("/d/m.yaml")).expect("open channel");
        let mut writers = Writers::default();
        let mut changed = BTreeSet::new();
        let debounce = Duration::from_millis(100);
        let cancelled = tokio::time::timeout(
            Duration::from_millis(50),
            next_writes(
                &mut rx,
                Path::new("/d"),
                debounce,
                &mut writers,
                &mut changed,
                &is_yaml,
            ),
        )
        .await;
        assert!(cancelled.is_err(), "still in its quiet period");
        let got = next_writes(
            &mut rx,
            Path::new("/d"),
            debounce,
            &mut writers,
            &mut changed,
            &is_yaml,
        )
        .await
        .expect("the watch goes on");
        assert_eq!(got, BTreeSet::from([PathBuf::from("/d/m.yaml")]));
        assert!(changed.is_empty());
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn the_end_of_the_watch_ends_the_wait() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        tx.send(write("/d/m.yaml")).expect("open channel");
        drop(tx);
        assert_eq!(
            next_writes(
                &mut rx,
                Path::new("/d"),
                Duration::from_millis(100),
                &mut Writers::default(),
                &mut BTreeSet::new(),
                &is_yaml
            )
            .await,
            None
        );
    }
}
