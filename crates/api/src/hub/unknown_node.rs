//! A brain does not serve a node its cluster does not have.
//!
//! Why: a brain pointed at the wrong cluster (another cluster's kubeconfig, a manifest
//! directory of another environment) computes every node's view from a cluster that is not
//! theirs, and its nodes would program it, deleting their own Services' rules. When the
//! brain's source has Nodes and none is named as a node asks, the node is refused with a
//! status that says why (`FAILED_PRECONDITION`): it keeps its rules, retries with backoff,
//! and is served once the Node appears (a Node not registered yet). A source without any
//! Node (manifests that list none) cannot tell, and its nodes are served as before (said once
//! when the brain has listed its input). A Node the brain saw and is deleted now is still
//! served: its kpng runs on (a scale-down), and the brain knows it is one of its cluster's.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a refused name stays in the brain's status after its last refusal: a node
/// retries every `--api-retry-max` (5 s by default), so a node still refused stays listed.
pub(crate) const SHOWN_FOR: Duration = Duration::from_secs(300);

/// Names remembered at most: a client sending many names cannot grow the brain.
const MAX_NAMES: usize = 1024;

/// What a node of another cluster is told.
pub(crate) fn refusal(name: &str, nodes: usize) -> String {
    format!(
        "this brain's cluster has no Node named {name:?} (it has {nodes} {}): a node of \
         another cluster (a wrong --api, or a brain given the wrong kubeconfig or manifests) or \
         a Node not registered yet; served once the brain has that Node",
        if nodes == 1 { "Node" } else { "Nodes" }
    )
}

/// The node names refused lately, for the brain's status and its log (a warning once per
/// name while it keeps being refused).
#[derive(Debug, Default)]
pub(crate) struct RefusedNames {
    last: HashMap<String, Instant>,
}

impl RefusedNames {
    /// Records that `name` was refused at `now`: whether it is new (not refused within
    /// [`SHOWN_FOR`]), to be logged.
    pub(crate) fn record(&mut self, name: &str, now: Instant) -> bool {
        self.forget_old(now);
        if let Some(at) = self.last.get_mut(name) {
            *at = now;
            return false;
        }
        if self.last.len() >= MAX_NAMES
            && let Some(oldest) = self
                .last
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(n, _)| n.clone())
        {
            self.last.remove(&oldest);
        }
        self.last.insert(name.to_string(), now);
        true
    }

    /// The names refused within [`SHOWN_FOR`] of `now`, unsorted.
    pub(crate) fn recent(&self, now: Instant) -> impl Iterator<Item = &str> {
        self.last
            .iter()
            .filter(move |(_, at)| now.saturating_duration_since(**at) < SHOWN_FOR)
            .map(|(n, _)| n.as_str())
    }

    /// `name` has a Node now: no longer refused.
    pub(crate) fn forget(&mut self, name: &str) {
        self.last.remove(name);
    }

    fn forget_old(&mut self, now: Instant) {
        self.last
            .retain(|_, at| now.saturating_duration_since(*at) < SHOWN_FOR);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_new_once_while_it_keeps_being_refused_and_is_forgotten_after() {
        let t0 = Instant::now();
        let mut names = RefusedNames::default();
        assert!(names.record("a", t0));
        assert!(!names.record("a", t0 + Duration::from_secs(5)));
        assert!(names.record("b", t0 + Duration::from_secs(6)));
        let mut recent: Vec<&str> = names.recent(t0 + Duration::from_secs(6)).collect();
        recent.sort_unstable();
        assert_eq!(recent, ["a", "b"]);
        // Not refused for SHOWN_FOR: no longer shown, and new again.
        let later = t0 + Duration::from_secs(5) + SHOWN_FOR;
        assert_eq!(names.recent(later).collect::<Vec<_>>(), ["b"]);
        assert!(names.record("a", later));
        names.forget("a");
        assert_eq!(names.recent(later).collect::<Vec<_>>(), ["b"]);
    }

    #[test]
    fn the_names_remembered_are_bounded() {
        let t0 = Instant::now();
        let mut names = RefusedNames::default();
        for i in 0..MAX_NAMES + 10 {
            names.record(&format!("n{i}"), t0 + Duration::from_millis(i as u64));
        }
        assert_eq!(names.last.len(), MAX_NAMES);
        assert!(!names.last.contains_key("n0"), "the oldest goes");
    }
}
