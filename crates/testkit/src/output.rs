//! Reading a child process's output while it runs.

use std::io::Read;
use std::sync::{Arc, Mutex};

/// Collects everything `from` produces (a child's stdout or stderr) into a shared string, on a
/// thread of its own, so a test can read what a long-running process has said so far without
/// blocking and without the pipe filling up.
pub fn collect_output(mut from: impl Read + Send + 'static) -> Arc<Mutex<String>> {
    let text = Arc::new(Mutex::new(String::new()));
    let sink = text.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    text
}
