//! How Service traffic reaches the proxy's listeners: the only OS-specific part of the backend.
//!
//! The proxy listens on ordinary sockets (any address, a port the OS picks). Something must
//! send traffic for a Service VIP or node port to the right listener: on Linux a constant
//! nftables ruleset whose maps are filled from [`Entry`]s ([`nft::NftCapture`]); another OS
//! implements [`Capture`] with its own mechanism and reuses everything else unchanged.

use std::sync::{Arc, Mutex};

use crate::entries::Entry;
use crate::store::Op;

#[cfg(target_os = "linux")]
pub mod nft;

/// Why the capture could not be changed (the backend kit's tool error: the capture is
/// committed by a tool such as `nft -f -`).
pub use kpng_backend_kit::exec::ExecError as CaptureError;

/// Something that steers Service traffic to the proxy's listeners.
///
/// Every call is all-or-nothing: on error the capture is as it was before the call.
pub trait Capture: Send {
    /// Replaces the whole capture with exactly `entries` (first sync, recovery, periodic full
    /// sync). Returns how many operations that took.
    fn replace(&mut self, entries: &[Entry]) -> Result<usize, CaptureError>;

    /// Applies `ops` (deletes before adds) to what the last successful call left.
    fn update(&mut self, ops: &[Op]) -> Result<usize, CaptureError>;

    /// Removes everything the capture ever installed.
    fn cleanup(&mut self) -> Result<(), CaptureError>;

    /// The redirects a previous run left in place, read once at start-up. Listeners that take
    /// the same ports again keep the flows the kernel still tracks working across a restart (a
    /// UDP client that keeps sending stays pinned to its old redirect until it pauses). Empty
    /// when unknown.
    fn previous_redirects(&mut self) -> Vec<Entry> {
        Vec::new()
    }

    /// Starts watching for changes others make to the capture, raising `alarm` for each (the
    /// runner then replaces the capture with a full sync); changes this capture makes do not
    /// raise it. Returns whether it watches (`false`, the default: not at all).
    fn watch(&mut self, _alarm: kpng_backend::TamperAlarm) -> Result<bool, CaptureError> {
        Ok(false)
    }
}

/// What a [`Recorder`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// A full replace with these entries.
    Replace(Vec<Entry>),
    /// An update with these operations.
    Update(Vec<Op>),
    /// A cleanup.
    Cleanup,
}

/// A capture that only records what it was asked, for tests (and a place to start a port to a
/// new OS). Clones share the record.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    calls: Arc<Mutex<Vec<Recorded>>>,
    previous: Vec<Entry>,
}

impl Recorder {
    /// An empty record.
    pub fn new() -> Recorder {
        Recorder::default()
    }

    /// A recorder that reports `previous` as what a previous run left.
    pub fn with_previous(previous: Vec<Entry>) -> Recorder {
        Recorder {
            previous,
            ..Recorder::default()
        }
    }

    /// Everything recorded so far, oldest first.
    pub fn calls(&self) -> Vec<Recorded> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// The entries the capture holds after every recorded call.
    pub fn current(&self) -> Vec<Entry> {
        let mut now: Vec<Entry> = Vec::new();
        for call in self.calls() {
            match call {
                Recorded::Replace(all) => now = all,
                Recorded::Update(ops) => {
                    for op in ops {
                        match op {
                            Op::Delete(e) => now.retain(|x| *x != e),
                            Op::Add(e) => now.push(e),
                        }
                    }
                }
                Recorded::Cleanup => now.clear(),
            }
        }
        now.sort();
        now
    }

    fn push(&self, r: Recorded) {
        if let Ok(mut calls) = self.calls.lock() {
            calls.push(r);
        }
    }
}

impl Capture for Recorder {
    fn replace(&mut self, entries: &[Entry]) -> Result<usize, CaptureError> {
        self.push(Recorded::Replace(entries.to_vec()));
        Ok(entries.len())
    }

    fn update(&mut self, ops: &[Op]) -> Result<usize, CaptureError> {
        self.push(Recorded::Update(ops.to_vec()));
        Ok(ops.len())
    }

    fn cleanup(&mut self) -> Result<(), CaptureError> {
        self.push(Recorded::Cleanup);
        Ok(())
    }

    fn previous_redirects(&mut self) -> Vec<Entry> {
        self.previous.clone()
    }
}
