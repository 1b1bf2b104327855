//! Watching the manifest file: inotify on its directory, a short debounce, content comparison.
//!
//! The *directory* is watched, not the file, because editors and `kubectl`/ConfigMap mounts
//! replace files (write a new file, rename it over the old one, or swap a `..data` symlink):
//! a watch on the old inode would go silent. Any event in the directory triggers a re-read, and
//! a re-read whose content is unchanged does nothing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kpng_model::{Event, Kind};
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use crate::dirwatch::DirWatch;
use crate::parse::parse_manifests;

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
}

/// The `file` source.
#[derive(Debug, Clone)]
pub struct FileSource {
    path: PathBuf,
    debounce: Duration,
}

impl FileSource {
    /// A source reading `path`, re-reading it `debounce` after the last change event.
    pub fn new(path: impl Into<PathBuf>, debounce: Duration) -> FileSource {
        FileSource {
            path: path.into(),
            debounce,
        }
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
    /// O(that file) however large the cluster.
    pub async fn run(self, events: mpsc::Sender<Event>) -> Result<(), SourceError> {
        if self.path.is_dir() {
            return crate::dir::run(self.path, self.debounce, events).await;
        }
        let mut watch = DirWatch::new(&self.directory())?;

        let mut state = ReloadState::default();
        if !self.reload(&events, &mut state).await {
            return Ok(());
        }
        loop {
            if watch.next_writes(self.debounce).await.is_none() {
                return Ok(());
            }
            if !self.reload(&events, &mut state).await {
                return Ok(());
            }
        }
    }

    /// Re-reads the file; returns false when the receiver is gone.
    async fn reload(&self, events: &mpsc::Sender<Event>, state: &mut ReloadState) -> bool {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) => {
                // Mid-replace the file may be briefly missing; the next event re-reads it.
                warn!(
                    "cannot read {}: {e}; keeping the last good state",
                    self.path.display()
                );
                return true;
            }
        };
        if state.good.as_deref() == Some(text.as_str())
            || state.bad.as_deref() == Some(text.as_str())
        {
            return true;
        }
        match parse_manifests(&text) {
            Err(e) => {
                error!("{}: {e}; keeping the last good state", self.path.display());
                state.bad = Some(text);
                true
            }
            Ok(loaded) => {
                loaded.log_omissions(&self.path);
                info!(
                    "{}: loaded {} objects",
                    self.path.display(),
                    loaded.objects.len()
                );
                state.good = Some(text);
                state.bad = None;
                let event = Event::Replace {
                    kinds: Kind::ALL.to_vec(),
                    objects: loaded.objects,
                };
                events.send(event).await.is_ok()
            }
        }
    }
}

#[derive(Default)]
struct ReloadState {
    good: Option<String>,
    bad: Option<String>,
}
