//! The log's account of rejected objects: each rejection when it happens, and its end when a
//! usable version replaces it.
//!
//! Why: a rejected object is logged once, and until 2026-12-07 its fix was not logged at all
//! (a good version equal to the one kept changes no rule, so not even a sync line followed).
//! Reconstructing an incident from the log, an operator saw `rejected Service shop/cart …` and
//! nothing after it, unable to tell whether or when it was fixed. Now the fix is one line,
//! `Service shop/cart: accepted again (rejected since 2026-12-07T07:40:01.120Z, for 40s)`.
//!
//! A rejection is logged at warn level, not error: it is a problem of a user's object, which
//! kpng refuses as kube-proxy ignores bad values in objects (`klog.Warning`, "ignoring invalid
//! endpoint port"), and which keeps the object's last good version in use. Error is for kpng's
//! own failures (a sync, the input as a whole), which an alert on error lines should page for.

use std::collections::{HashMap, HashSet};
use std::time::SystemTime;

use kpng_model::ObjectRef;
use kpng_model::input::{lasted, lasted_seconds};
use kpng_model::records::Rejection;

/// When each object still rejected was first rejected (in this run of rejections). One entry
/// per rejected object: as many as `kpng_rejected_objects` counts.
#[derive(Debug, Default)]
pub struct RejectionLog {
    since: HashMap<ObjectRef, SystemTime>,
}

impl RejectionLog {
    /// Logs `rejection`, which happened at `at`, and remembers when the object's run of
    /// rejections began (a second bad version keeps the first's time).
    pub fn rejected(&mut self, rejection: &Rejection, at: SystemTime) {
        // The object as fields too: a JSON log is searched by them, not by the message.
        let object = &rejection.error.object;
        tracing::warn!(
            kind = object.kind.as_str(),
            namespace = %object.namespace,
            name = %object.name,
            field = %rejection.error.field,
            kept = rejection.kept,
            "rejected {rejection}"
        );
        self.since
            .entry(rejection.error.object.clone())
            .or_insert(at);
    }

    /// Logs that `ended`'s object has a usable version again at `at`, and forgets it.
    pub fn accepted_again(&mut self, ended: &Rejection, at: SystemTime) {
        let since = self.since.remove(&ended.error.object);
        let object = &ended.error.object;
        let line = accepted_again_line(object, since, at);
        // The object as the rejection line had it, and how long it was rejected as a number.
        match since {
            Some(since) => tracing::info!(
                kind = object.kind.as_str(),
                namespace = %object.namespace,
                name = %object.name,
                lasted_seconds = lasted_seconds(since, at),
                "{line}"
            ),
            None => tracing::info!(
                kind = object.kind.as_str(),
                namespace = %object.namespace,
                name = %object.name,
                "{line}"
            ),
        }
    }

    /// How many objects it remembers.
    pub fn len(&self) -> usize {
        self.since.len()
    }

    /// Whether it remembers none.
    pub fn is_empty(&self) -> bool {
        self.since.is_empty()
    }

    /// Forgets the objects no longer rejected for another reason than a usable version (the
    /// object was deleted, or a list no longer has it): `still` are those rejected now.
    pub fn keep_only(&mut self, still: &HashSet<ObjectRef>) {
        self.since.retain(|object, _| still.contains(object));
    }
}

/// The line that ends `object`'s rejection, first rejected at `since` (`None`: not seen by
/// this log), accepted again at `at`.
pub fn accepted_again_line(
    object: &ObjectRef,
    since: Option<SystemTime>,
    at: SystemTime,
) -> String {
    match since {
        Some(since) => format!(
            "{object}: accepted again (rejected since {}, for {})",
            crate::admin::rfc3339(since),
            lasted(since, at)
        ),
        None => format!("{object}: accepted again (its earlier version was rejected)"),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kpng_model::Kind;
    use kpng_model::records::ConversionError;

    use super::*;

    fn rejection(name: &str) -> Rejection {
        Rejection {
            error: ConversionError {
                object: ObjectRef {
                    kind: Kind::Service,
                    namespace: "shop".into(),
                    name: name.into(),
                },
                field: "spec.ports[0].protocol".into(),
                message: "unknown protocol \"TPC\"".into(),
                location: None,
                service: None,
            },
            kept: true,
        }
    }

    /// (case, steps as (object, rejected or accepted, at second), the remembered count after)
    #[test]
    fn a_rejection_is_remembered_until_it_ends() {
        let t = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_600_000 + s);
        let mut log = RejectionLog::default();
        log.rejected(&rejection("cart"), t(0));
        // A second bad version keeps the first one's time.
        log.rejected(&rejection("cart"), t(10));
        log.rejected(&rejection("pay"), t(20));
        assert_eq!(log.len(), 2);
        let cart = rejection("cart").error.object;
        assert_eq!(log.since.get(&cart), Some(&t(0)));
        log.accepted_again(&rejection("cart"), t(40));
        assert_eq!(log.len(), 1);
        // The pay Service was deleted meanwhile: forgotten.
        log.keep_only(&HashSet::new());
        assert!(log.is_empty());
    }

    #[test]
    fn the_end_of_a_rejection_says_since_when_and_for_how_long() {
        let t = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_600_000 + s);
        let cart = rejection("cart").error.object;
        for (case, since, want) in [
            (
                "seen",
                Some(t(0)),
                "Service shop/cart: accepted again (rejected since 2026-12-06T23:33:20.000Z, \
                 for 40s)",
            ),
            (
                "not seen",
                None,
                "Service shop/cart: accepted again (its earlier version was rejected)",
            ),
        ] {
            assert_eq!(accepted_again_line(&cart, since, t(40)), want, "{case}");
        }
    }
}
