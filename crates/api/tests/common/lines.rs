//! A log capture for tests: [`Lines`]. Shared by the integration tests (through `common`)
//! and the crate's own unit tests (`src/server/tls/tests.rs` includes this file by path), so
//! the capture is written once.

#![allow(dead_code)]

use std::sync::{Arc, Mutex, PoisonError};

/// The log lines written while a test's subscriber ([`Lines::subscriber`]) is the default
/// (or the global one): what a test asserts about logs.
#[derive(Clone, Default)]
pub struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    /// A subscriber writing here, plain text (no colours), at `level` and above.
    pub fn subscriber(&self, level: tracing::Level) -> impl tracing::Subscriber + Send + Sync {
        let writer = self.clone();
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_max_level(level)
            .with_ansi(false)
            .finish()
    }

    /// Everything written so far.
    fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The lines written so far that contain `text`.
    pub fn matching(&self, text: &str) -> Vec<String> {
        self.text()
            .lines()
            .filter(|l| l.contains(text))
            .map(str::to_string)
            .collect()
    }

    /// The last line written so far (empty if none).
    pub fn last(&self) -> String {
        self.text().lines().last().unwrap_or_default().to_string()
    }
}
