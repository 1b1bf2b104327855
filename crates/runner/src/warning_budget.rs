//! How many warnings about objects reach the log between two syncs (in a brain, in ten
//! seconds).
//!
//! A cluster-wide mistake (a `--service-node-port-range` that does not match the API server's,
//! a field every Service of a Helm chart gets wrong) makes one warning per object: tens of
//! thousands of lines at start-up that bury everything else. The first few of each interval
//! are logged as warnings, the rest at debug level, and the end of the interval says how many
//! were held back ([`held_back`]).

/// Warnings about objects logged at warn level in one interval.
pub const SHOWN_PER_SYNC: usize = 20;

/// Logs how many warnings an interval held back, if any.
pub fn held_back(held: usize) {
    if held > 0 {
        tracing::warn!(
            "{held} more warnings about objects were logged at debug level only, to keep the \
             log readable (`--log-level debug` shows every one)"
        );
    }
}

/// The warnings of the current interval.
#[derive(Debug, Default)]
pub struct WarningBudget {
    shown: usize,
    held: usize,
}

impl WarningBudget {
    /// Whether the next warning is logged at warn level; counts those that are not.
    pub fn admit(&mut self) -> bool {
        if self.shown < SHOWN_PER_SYNC {
            self.shown += 1;
            true
        } else {
            self.held += 1;
            false
        }
    }

    /// Starts the next interval; returns how many warnings the last one held back.
    pub fn next_interval(&mut self) -> usize {
        std::mem::take(self).held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_warnings_of_an_interval_are_shown_and_the_rest_counted() {
        // (warnings in the interval, shown, held back)
        let cases = [
            (0, 0, 0),
            (1, 1, 0),
            (SHOWN_PER_SYNC, SHOWN_PER_SYNC, 0),
            (SHOWN_PER_SYNC + 1, SHOWN_PER_SYNC, 1),
            (12_259, SHOWN_PER_SYNC, 12_259 - SHOWN_PER_SYNC),
        ];
        let mut budget = WarningBudget::default();
        for (warnings, shown, held) in cases {
            let admitted = (0..warnings).filter(|_| budget.admit()).count();
            assert_eq!(admitted, shown, "{warnings} warnings");
            assert_eq!(budget.next_interval(), held, "{warnings} warnings");
        }
    }

    #[test]
    fn a_new_interval_shows_warnings_again() {
        let mut budget = WarningBudget::default();
        for _ in 0..SHOWN_PER_SYNC * 2 {
            budget.admit();
        }
        assert_eq!(budget.next_interval(), SHOWN_PER_SYNC);
        assert!(budget.admit(), "the first warning after a sync is shown");
        assert_eq!(budget.next_interval(), 0);
    }
}
