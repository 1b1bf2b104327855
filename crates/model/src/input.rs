//! How a kpng's input is doing: what an operator checks first when `kpng status` says "last
//! sync never", or when an edit or a cluster change does not show up on the node.
//!
//! The source that reads the input (a manifest file or directory, the API server, a brain)
//! records its problems here as they begin and end, and the status answers read them. Until
//! now these were only log lines, gone from view once they scrolled away, while the status
//! showed an empty or stale table with no reason.
//!
//! The handle is shared (cloning it shares the record) and cheap to update: sources record a
//! problem when it begins or ends, and a good load at the end of a load, never per object.
//! Callers pass the time, so the model stays free of clocks.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

/// A shared record of one input's health (see the module documentation).
#[derive(Debug, Clone, Default)]
pub struct InputHealth(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<InputState>,
    /// How many problems the state holds: a directory's first load marks each of its (tens
    /// of thousands of) files good, and without a problem that costs one atomic read, not a
    /// lock taken by every loader thread.
    problems: AtomicUsize,
}

/// What the record holds at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InputState {
    /// What is read, in words: `file /etc/kpng/cluster.yaml`, `kube https://10.0.0.1:6443`.
    pub source: String,
    /// The problems now, by what they concern (a file, `API server`, `Service watch`…).
    /// Several can hold at once: a directory with two broken files, or a watch refused by
    /// RBAC while the others run.
    pub problems: BTreeMap<String, InputProblem>,
    /// When the input last loaded (a file) or a list last completed (the API server, a brain).
    pub last_good: Option<SystemTime>,
    /// What that load held, in words ("18 objects, 1 rejected").
    pub detail: Option<String>,
    /// What that load held as numbers and a path, beside `detail`'s words, for scripts
    /// (`kpng status -o json`'s `input.lastGoodObjects`, `lastGoodFiles`, `lastChangeFrom`).
    pub load: LoadFacts,
    /// On a node fed by a brain: what the brain last reported about its own input (`None`:
    /// it reported nothing, such as KPNG's brain or an older kpng). Shared, so reading the
    /// record copies none of it.
    pub brain_report: Option<Arc<BrainReport>>,
    /// Whether `brain_report` came on an earlier connection to the brain: the brain this node
    /// is connected to now (perhaps a restarted one, still listing its input) has sent no
    /// state yet, so the report may be out of date until it does.
    pub brain_report_from_earlier_connection: bool,
    /// On a node fed by a brain: the kpng version the brain sent at the last connection's
    /// headers (`None`: not connected yet, or a brain that sends none: KPNG's, a kpng before
    /// 2026-12-07).
    pub brain_version: Option<String>,
}

/// What a load held, as numbers and a path ([`InputState::load`]); empty where the source
/// does not say (a brain's state, the API server's lists).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadFacts {
    /// How many objects the whole load held.
    pub objects: Option<usize>,
    /// From how many files (a directory's manifests).
    pub files: Option<usize>,
    /// The file whose change was the last load (a directory's manifest re-read alone).
    pub changed_file: Option<String>,
}

/// What a brain reports to its nodes about its own input: a node never sees the Kubernetes
/// objects, so without this a Service the brain rejects, or a brain whose API server is out of
/// reach, only looks wrong on the node, whose own record says the brain is fine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BrainReport {
    /// What the brain reads (`kube https://10.0.0.1:6443/`).
    pub source: String,
    /// The brain's input problems now, by what they concern; empty: its source is healthy.
    pub problems: BTreeMap<String, InputProblem>,
    /// Objects whose latest version the brain rejects (the first of them: see
    /// `rejected_total`).
    pub rejected: Vec<ReportedRejection>,
    /// How many objects the brain rejects in all.
    pub rejected_total: u64,
    /// Values the brain's conversion dropped from objects it uses (the first of them: see
    /// `dropped_total`); empty from a brain older than this field.
    pub dropped: Vec<ReportedDropped>,
    /// How many values the brain dropped in all.
    pub dropped_total: u64,
}

/// A value a brain dropped from an object it uses, as it reported it: the node gets the rest
/// of the object, and would not know otherwise.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReportedDropped {
    /// `Service`, `EndpointSlice`, `Node`, `ServiceCIDR`.
    pub kind: String,
    /// Its namespace (empty for cluster-scoped kinds).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The Service it concerns (`namespace/name`), if any.
    pub service: Option<String>,
    /// The field of the dropped value.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

/// An object a brain rejects, as it reported it (plain words: a newer brain may name a kind
/// this node does not know).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReportedRejection {
    /// `Service`, `EndpointSlice`, `Node`, `ServiceCIDR`.
    pub kind: String,
    /// Its namespace (empty for cluster-scoped kinds).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The Service it concerns (`namespace/name`: a Service's own, an EndpointSlice's owner),
    /// if any; `None` also from a brain older than this field.
    pub service: Option<String>,
    /// The field at fault.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
    /// Where the brain's source found it (a manifest's file and line).
    pub location: Option<String>,
    /// Whether an earlier version of it is in use.
    pub kept: bool,
}

/// One problem with the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputProblem {
    /// What is wrong, on one line.
    pub message: String,
    /// When it began: the first failure of a run of them.
    pub since: SystemTime,
}

impl InputHealth {
    /// A record for the input described by `source` (see [`InputState::source`]).
    pub fn new(source: impl Into<String>) -> InputHealth {
        let health = InputHealth::default();
        health.set_source(source);
        health
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, InputState> {
        self.0.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps the problem count in step with `state` (called with the lock held).
    fn count(&self, state: &InputState) {
        self.0
            .problems
            .store(state.problems.len(), Ordering::Release);
    }

    /// Names the input, when the source learns it late (the API server's URL comes from the
    /// kubeconfig).
    pub fn set_source(&self, source: impl Into<String>) {
        self.lock().source = source.into();
    }

    /// `what` fails at `at` with `message`. A problem that already holds keeps the time it
    /// began; its message is the latest one's first line (the status shows one line each).
    pub fn failing(&self, what: &str, message: &str, at: SystemTime) {
        let message = message.lines().next().unwrap_or_default().trim_end();
        let mut state = self.lock();
        match state.problems.get_mut(what) {
            Some(problem) => {
                if problem.message != message {
                    problem.message = message.to_string();
                }
            }
            None => {
                state.problems.insert(
                    what.to_string(),
                    InputProblem {
                        message: message.to_string(),
                        since: at,
                    },
                );
                self.count(&state);
            }
        }
    }

    /// `what` works again (nothing happens when it had no problem). Returns when its problem
    /// began, if it had one: the source logs that the problem is over and how long it lasted
    /// (an error line with no end leaves an operator unable to tell when it was fixed).
    pub fn recovered(&self, what: &str) -> Option<SystemTime> {
        if self.0.problems.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut state = self.lock();
        let ended = state.problems.remove(what)?;
        self.count(&state);
        Some(ended.since)
    }

    /// Every problem is over (a single file loaded whole). Returns when the earliest of them
    /// began, if there was any (see [`InputHealth::recovered`]).
    pub fn recovered_all(&self) -> Option<SystemTime> {
        if self.0.problems.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut state = self.lock();
        let since = state.problems.values().map(|p| p.since).min();
        state.problems.clear();
        self.count(&state);
        since
    }

    /// The input loaded (or a list completed) at `at`; `detail` says what it held.
    pub fn loaded(&self, at: SystemTime, detail: Option<String>) {
        self.loaded_with(at, detail, LoadFacts::default());
    }

    /// [`InputHealth::loaded`], with what the load held as numbers and a path (`load`).
    pub fn loaded_with(&self, at: SystemTime, detail: Option<String>, load: LoadFacts) {
        let mut state = self.lock();
        state.last_good = Some(at);
        state.detail = detail;
        state.load = load;
    }

    /// The input is good again at `at` without a new load: a file back to the version in use
    /// after a broken edit (or readable again). What it holds is unchanged, so the detail
    /// stays; the time moves, so "last good input" (and
    /// `kpng_input_last_good_timestamp_seconds`) says when the problem ended, not when the
    /// version was first loaded.
    pub fn good_again(&self, at: SystemTime) {
        self.lock().last_good = Some(at);
    }

    /// The input is known current at `at` without a new load (a watch streaming from a
    /// reachable API server): moves "last good input" if it loaded before and has no problem
    /// now. Returns whether it moved.
    pub fn still_good(&self, at: SystemTime) -> bool {
        if self.0.problems.load(Ordering::Acquire) > 0 {
            return false;
        }
        let mut state = self.lock();
        if state.last_good.is_none() || !state.problems.is_empty() {
            return false;
        }
        state.last_good = Some(at);
        true
    }

    /// A node fed by a brain: what the brain now reports about its own input (`None`: it
    /// reports nothing).
    pub fn set_brain_report(&self, report: Option<BrainReport>) {
        let mut state = self.lock();
        state.brain_report = report.map(Arc::new);
        state.brain_report_from_earlier_connection = false;
    }

    /// A node fed by a brain connected to it (again): the report held, if any, is the earlier
    /// connection's until this one sends the brain's state ([`Self::set_brain_report`]).
    pub fn brain_connected(&self) {
        let mut state = self.lock();
        state.brain_report_from_earlier_connection = state.brain_report.is_some();
    }

    /// A node fed by a brain: the version the brain sent when this connection began (`None`:
    /// it sent none). Returns whether it differs from the one held (a first connection, or
    /// another brain behind the same address), for a warning once per change.
    pub fn set_brain_version(&self, version: Option<String>) -> bool {
        let mut state = self.lock();
        let changed = state.brain_version != version;
        state.brain_version = version;
        changed
    }

    /// The record now.
    pub fn state(&self) -> InputState {
        self.lock().clone()
    }
}

/// How long a problem lasted, in the words of the line that says it is over: `42s`, `3m 5s`,
/// `2h 7m` (whole seconds; a clock that went back reads as `0s`).
pub fn lasted(since: SystemTime, until: SystemTime) -> String {
    let secs = lasted_seconds(since, until);
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m {}s", secs / 60, secs % 60),
        _ => format!("{}h {}m", secs / 3600, secs % 3600 / 60),
    }
}

/// How long a problem that began at `since` lasted until `until`, in whole seconds (as
/// [`lasted`] words it): the `lasted_seconds` field of the lines that end a problem, a number a
/// log pipeline sums or alerts on without parsing `9m 2s` out of the message.
pub fn lasted_seconds(since: SystemTime, until: SystemTime) -> u64 {
    until.duration_since(since).unwrap_or_default().as_secs()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// "Last good input" moves on a still-current input only if it loaded before (a first
    /// list not yet done is not good) and nothing is wrong now.
    #[test]
    fn still_good_moves_the_last_good_time_only_after_a_load_and_without_a_problem() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let later = t0 + Duration::from_secs(60);
        // (case, loaded at t0?, a problem now?, moved?)
        let cases = [
            ("never loaded", false, false, false),
            ("loaded, a problem now", true, true, false),
            ("loaded, nothing wrong", true, false, true),
        ];
        for (case, loaded, problem, moved) in cases {
            let health = InputHealth::new("kube https://10.0.0.1:6443/");
            if loaded {
                health.loaded(t0, Some("3 objects".into()));
            }
            if problem {
                health.failing("Service watch", "refused", t0);
            }
            assert_eq!(health.still_good(later), moved, "{case}");
            let state = health.state();
            let want = match (loaded, moved) {
                (false, _) => None,
                (true, false) => Some(t0),
                (true, true) => Some(later),
            };
            assert_eq!(state.last_good, want, "{case}");
            if loaded {
                assert_eq!(state.detail.as_deref(), Some("3 objects"), "{case}: kept");
            }
        }
    }

    #[test]
    fn a_problem_keeps_its_start_until_it_is_over() {
        let t = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        let health = InputHealth::new("file /x.yaml");
        let clone = health.clone();
        // (step, problems afterwards as (what, message, since))
        type Step = fn(&InputHealth, &dyn Fn(u64) -> SystemTime);
        type Problems = &'static [(&'static str, &'static str, u64)];
        let steps: [(Step, Problems); 6] = [
            (
                |h, t| h.failing("a.yaml", "bad port\n  | snippet", t(1)),
                &[("a.yaml", "bad port", 1)],
            ),
            (
                |h, t| h.failing("a.yaml", "bad protocol", t(2)),
                &[("a.yaml", "bad protocol", 1)],
            ),
            (
                |h, t| h.failing("b.yaml", "not YAML", t(3)),
                &[("a.yaml", "bad protocol", 1), ("b.yaml", "not YAML", 3)],
            ),
            (
                |h, t| assert_eq!(h.recovered("a.yaml"), Some(t(1))),
                &[("b.yaml", "not YAML", 3)],
            ),
            (
                |h, _| assert_eq!(h.recovered("a.yaml"), None),
                &[("b.yaml", "not YAML", 3)],
            ),
            (|h, t| assert_eq!(h.recovered_all(), Some(t(3))), &[]),
        ];
        for (i, (step, want)) in steps.into_iter().enumerate() {
            step(&health, &t);
            let got: Vec<(String, String, SystemTime)> = clone
                .state()
                .problems
                .into_iter()
                .map(|(what, p)| (what, p.message, p.since))
                .collect();
            let want: Vec<(String, String, SystemTime)> = want
                .iter()
                .map(|(w, m, s)| (w.to_string(), m.to_string(), t(*s)))
                .collect();
            assert_eq!(got, want, "after step {i}");
        }
        health.loaded(t(9), Some("18 objects".into()));
        let state = clone.state();
        assert_eq!(state.source, "file /x.yaml");
        assert_eq!(state.last_good, Some(t(9)));
        assert_eq!(state.detail.as_deref(), Some("18 objects"));
        // Good again with no new load: the time moves, what it holds stays.
        assert_eq!(health.recovered_all(), None);
        health.good_again(t(12));
        let state = clone.state();
        assert_eq!(state.last_good, Some(t(12)));
        assert_eq!(state.detail.as_deref(), Some("18 objects"));
    }

    /// (case, seconds, text)
    #[test]
    fn how_long_a_problem_lasted_reads_short() {
        let t = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        for (case, secs, want) in [
            ("under a second", 0, "0s"),
            ("seconds", 42, "42s"),
            ("minutes", 185, "3m 5s"),
            ("hours", 7_620, "2h 7m"),
        ] {
            assert_eq!(lasted(t(100), t(100 + secs)), want, "{case}");
        }
        assert_eq!(lasted(t(100), t(50)), "0s", "a clock that went back");
    }

    #[test]
    fn a_brain_report_is_the_earlier_connections_until_the_new_one_sends_state() {
        let health = InputHealth::new("brain tcp://b:1");
        // (step, whether a report is held, whether it is an earlier connection's)
        type Step = fn(&InputHealth);
        let steps: [(Step, bool, bool); 5] = [
            (|h| h.brain_connected(), false, false),
            (
                |h| h.set_brain_report(Some(BrainReport::default())),
                true,
                false,
            ),
            (|h| h.brain_connected(), true, true),
            (|h| h.brain_connected(), true, true),
            (
                |h| h.set_brain_report(Some(BrainReport::default())),
                true,
                false,
            ),
        ];
        for (i, (step, held, earlier)) in steps.into_iter().enumerate() {
            step(&health);
            let state = health.state();
            assert_eq!(state.brain_report.is_some(), held, "after step {i}");
            assert_eq!(
                state.brain_report_from_earlier_connection, earlier,
                "after step {i}"
            );
        }
    }
}
