//! A watched directory: inotify (through `notify`) plus the debounce both sources share.

use std::collections::BTreeSet;
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
    // Dropping the watcher ends the watch.
    _watcher: RecommendedWatcher,
}

impl DirWatch {
    /// Starts watching `dir` (not recursively).
    pub(crate) fn new(dir: &Path) -> Result<DirWatch, SourceError> {
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
            _watcher: watcher,
        })
    }

    /// Waits for something to be written in the directory, then until it has been quiet for
    /// `debounce` (but never longer than ten debounce periods, so an always-busy directory
    /// cannot starve us). Returns the paths written, or `None` when the watch has ended.
    pub(crate) async fn next_writes(&mut self, debounce: Duration) -> Option<BTreeSet<PathBuf>> {
        let mut changed = BTreeSet::new();
        loop {
            match self.rx.recv().await? {
                Err(e) => warn!("file watch error on {}: {e}", self.dir.display()),
                Ok(ev) if is_write(&ev) => {
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
                match self.rx.try_recv() {
                    Ok(Ok(ev)) if is_write(&ev) => changed.extend(ev.paths),
                    Ok(_) => {}
                    Err(mpsc::error::TryRecvError::Empty) => return Some(changed),
                    Err(mpsc::error::TryRecvError::Disconnected) => return None,
                }
            }
        }
        let give_up = tokio::time::Instant::now() + debounce * 10;
        loop {
            let quiet_until = (tokio::time::Instant::now() + debounce).min(give_up);
            match tokio::time::timeout_at(quiet_until, self.rx.recv()).await {
                Ok(Some(Ok(ev))) if is_write(&ev) => changed.extend(ev.paths),
                Ok(Some(_)) => {}
                Ok(None) => return None,
                Err(_) => return Some(changed),
            }
            if tokio::time::Instant::now() >= give_up {
                return Some(changed);
            }
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
