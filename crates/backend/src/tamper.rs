//! Tampering: someone else changed what a backend programmed (`nft delete table ip kpng`,
//! `iptables -t nat -F`, `nft flush ruleset`).
//!
//! Why in the contract: only the backend can notice (it knows its tables and how to watch them:
//! netlink notifications, canary rules), but only the runner can repair (a full sync of the
//! current snapshot, promptly, whatever the sync period). The handshake is platform-free: the
//! runner hands the backend a [`TamperAlarm`] once ([`crate::Backend::watch_tampering`]); the
//! backend's watcher, on its own thread, calls [`TamperAlarm::raise`]; the runner then forces a
//! full sync after a short debounce.

use std::fmt;
use std::sync::Arc;

/// What a watcher saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tampering {
    /// What changed, for the log line (`ip kpng: table deleted`, `ipv4 nat: canary gone`).
    pub what: String,
}

/// The runner's side of the handshake: cheap to clone, callable from any thread, never blocks.
#[derive(Clone)]
pub struct TamperAlarm(Arc<dyn Fn(Tampering) + Send + Sync>);

impl TamperAlarm {
    /// An alarm that calls `on_raise` (the runner sends it down a channel).
    pub fn new(on_raise: impl Fn(Tampering) + Send + Sync + 'static) -> TamperAlarm {
        TamperAlarm(Arc::new(on_raise))
    }

    /// Tells the runner that the data plane no longer matches what was programmed.
    pub fn raise(&self, what: impl Into<String>) {
        (self.0)(Tampering { what: what.into() });
    }
}

impl fmt::Debug for TamperAlarm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TamperAlarm")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn raise_reaches_the_callback_from_any_clone() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let alarm = TamperAlarm::new(move |t| sink.lock().map(|mut v| v.push(t)).unwrap_or(()));
        let clone = alarm.clone();
        std::thread::spawn(move || clone.raise("ip kpng: table deleted"))
            .join()
            .expect("thread");
        alarm.raise("again");
        let seen = seen.lock().expect("lock");
        let what: Vec<&str> = seen.iter().map(|t| t.what.as_str()).collect();
        assert_eq!(what, ["ip kpng: table deleted", "again"]);
    }
}
