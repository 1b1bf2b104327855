//! Proxy health, kube-proxy's rules: `/livez` and `/healthz` fail when a queued change has not
//! been synced within the health timeout (2 × `--sync-period`); `/healthz` also needs the node to
//! be eligible (Node known, not being deleted, not tainted for deletion by the autoscaler).
//!
//! As kube-proxy's, both answer 200 before the first sync (nothing is pending yet), so neither
//! says that this node is programmed. `/readyz`, kpng's own, does: 503 until every family's
//! first sync of this run has been programmed, 200 from then on (the DaemonSet's startup probe).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use kpng_model::Family;

#[derive(Debug, Clone, Copy, Default)]
struct FamilyHealth {
    last_updated: Option<SystemTime>,
    oldest_pending: Option<SystemTime>,
    /// When this run first programmed the family (`/readyz`); `None` until then.
    first_programmed: Option<SystemTime>,
}

#[derive(Debug)]
struct Inner {
    families: BTreeMap<Family, FamilyHealth>,
    node_eligible: bool,
}

/// Shared health state: the runner writes it, the HTTP handlers read it.
#[derive(Debug)]
pub struct ProxyHealth {
    timeout: Duration,
    inner: Mutex<Inner>,
}

/// One health answer, ready to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthReport {
    /// 200 or 503.
    pub status: u16,
    /// kube-proxy's JSON body.
    pub body: String,
}

impl ProxyHealth {
    /// Health for the given families with kube-proxy's timeout (2 × sync period).
    pub fn new(families: &[Family], timeout: Duration) -> ProxyHealth {
        let families = families
            .iter()
            .map(|f| (*f, FamilyHealth::default()))
            .collect();
        ProxyHealth {
            timeout,
            inner: Mutex::new(Inner {
                families,
                // As kube-proxy's: eligible while starting, until the Node says otherwise.
                // The health server answers before the sync loop has run its first
                // `set_node_eligible`, and answered 503 (`nodeEligible: false`) in between.
                node_eligible: true,
            }),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        // A poisoned lock only means a panic elsewhere; the data (timestamps) is still valid.
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }

    /// A change for `family` is waiting to be synced (kube-proxy `QueuedUpdate`).
    pub fn queued(&self, family: Family, now: SystemTime) {
        self.with(|i| {
            let h = i.families.entry(family).or_default();
            h.oldest_pending.get_or_insert(now);
        });
    }

    /// `family` was synced successfully (kube-proxy `Updated`).
    pub fn updated(&self, family: Family, now: SystemTime) {
        self.with(|i| {
            let h = i.families.entry(family).or_default();
            h.oldest_pending = None;
            h.last_updated = Some(now);
        });
    }

    /// A sync programmed `family`: [`ProxyHealth::updated`], and the first one makes `/readyz`
    /// answer 200 once every family has had one (the start's `updated` does not count: it only
    /// starts the health timeout, as kube-proxy's sync loop does).
    pub fn programmed(&self, family: Family, now: SystemTime) {
        self.with(|i| {
            let h = i.families.entry(family).or_default();
            h.oldest_pending = None;
            h.last_updated = Some(now);
            h.first_programmed.get_or_insert(now);
        });
    }

    /// The `/readyz` answer at `now`: 200 once every family's first sync of this run has been
    /// programmed, 503 before, with a JSON body saying which families still wait.
    pub fn readiness(&self, now: SystemTime) -> HealthReport {
        self.with(|i| {
            let waiting: Vec<&str> = i
                .families
                .iter()
                .filter(|(_, h)| h.first_programmed.is_none())
                .map(|(f, _)| f.label())
                .collect();
            let ready = waiting.is_empty();
            let first_sync = if ready {
                i.families.values().filter_map(|h| h.first_programmed).max()
            } else {
                None
            };
            let reason = if ready {
                "the first sync of this run has programmed the node".to_string()
            } else {
                format!(
                    "waiting for the first sync of this run to program {} (the rules of an \
                     earlier run, if any, stay in place meanwhile)",
                    waiting.join(" and ")
                )
            };
            let body = serde_json::json!({
                "ready": ready,
                "firstSync": serde_json::Value::String(go_time_text(first_sync)),
                "currentTime": serde_json::Value::String(go_time_text(Some(now))),
                "reason": reason,
            });
            HealthReport {
                status: if ready { 200 } else { 503 },
                body: body.to_string(),
            }
        })
    }

    /// Records whether the node may receive load-balancer traffic.
    pub fn set_node_eligible(&self, eligible: bool) {
        self.with(|i| i.node_eligible = eligible);
    }

    /// Whether every family is healthy (ignores node eligibility, like `/livez`).
    pub fn is_healthy(&self, now: SystemTime) -> bool {
        self.with(|i| i.families.values().all(|h| self.family_healthy(h, now)))
    }

    fn family_healthy(&self, h: &FamilyHealth, now: SystemTime) -> bool {
        match h.oldest_pending {
            None => true,
            Some(t) => now.duration_since(t).unwrap_or_default() < self.timeout,
        }
    }

    /// The `/healthz` (with `healthz: true`) or `/livez` answer at `now`.
    pub fn report(&self, now: SystemTime, healthz: bool) -> HealthReport {
        self.with(|i| {
            let healthy = i.families.values().all(|h| self.family_healthy(h, now));
            let ok = healthy && (!healthz || i.node_eligible);
            // As kube-proxy: a healthy answer reports "now" as lastUpdated (older clients
            // read it as "the sync loop is alive").
            let last_updated = if ok {
                Some(now)
            } else {
                i.families.values().filter_map(|h| h.last_updated).max()
            };
            let mut body = String::from("{");
            body.push_str(&format!("\"lastUpdated\":{},", go_time(last_updated)));
            body.push_str(&format!("\"currentTime\":{},", go_time(Some(now))));
            if healthz {
                body.push_str(&format!("\"nodeEligible\":{},", i.node_eligible));
            }
            body.push_str(&format!("\"healthy\":{healthy}"));
            if !i.families.is_empty() {
                let status: Vec<String> = i
                    .families
                    .iter()
                    .map(|(f, h)| {
                        format!(
                            "\"{}\":{{\"lastUpdated\":{},\"healthy\":{}}}",
                            f.label(),
                            go_time(h.last_updated),
                            self.family_healthy(h, now)
                        )
                    })
                    .collect();
                body.push_str(&format!(",\"status\":{{{}}}", status.join(",")));
            }
            body.push('}');
            HealthReport {
                status: if ok { 200 } else { 503 },
                body,
            }
        })
    }
}

/// A time as Go's `encoding/json` writes a `time.Time` (RFC 3339, nanoseconds without trailing
/// zeros, `Z` for UTC; the zero time for "never").
fn go_time(t: Option<SystemTime>) -> String {
    format!("\"{}\"", go_time_text(t))
}

/// [`go_time`] without the quotes.
fn go_time_text(t: Option<SystemTime>) -> String {
    let Some(t) = t else {
        return "0001-01-01T00:00:00Z".to_string();
    };
    let s = humantime::format_rfc3339_nanos(t).to_string();
    // "2026-11-30T08:31:46.123000000Z" → "2026-11-30T08:31:46.123Z"
    match s.strip_suffix('Z').and_then(|b| b.split_once('.')) {
        Some((secs, frac)) => {
            let frac = frac.trim_end_matches('0');
            if frac.is_empty() {
                format!("{secs}Z")
            } else {
                format!("{secs}.{frac}Z")
            }
        }
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    #[test]
    fn healthy_at_start_then_late_change_is_unhealthy_until_synced() {
        let h = ProxyHealth::new(&[Family::V4, Family::V6], Duration::from_secs(60));
        h.set_node_eligible(true);
        assert_eq!(h.report(at(0), true).status, 200);
        h.queued(Family::V4, at(1));
        assert_eq!(
            h.report(at(60), true).status,
            200,
            "59 s late is still within 60 s"
        );
        h.queued(Family::V4, at(30)); // the oldest pending change counts
        let late = h.report(at(61), true);
        assert_eq!(late.status, 503);
        assert!(
            late.body
                .contains("\"IPv4\":{\"lastUpdated\":\"0001-01-01T00:00:00Z\",\"healthy\":false}"),
            "{}",
            late.body
        );
        assert_eq!(h.report(at(61), false).status, 503, "/livez too");
        h.updated(Family::V4, at(62));
        assert_eq!(h.report(at(63), true).status, 200);
    }

    #[test]
    fn healthz_needs_an_eligible_node_livez_does_not() {
        let h = ProxyHealth::new(&[Family::V4], Duration::from_secs(60));
        assert_eq!(
            h.report(at(0), true).status,
            200,
            "eligible while starting, as kube-proxy's, before anyone said otherwise"
        );
        h.set_node_eligible(false);
        let healthz = h.report(at(0), true);
        assert_eq!(healthz.status, 503);
        assert!(healthz.body.contains("\"nodeEligible\":false"));
        assert_eq!(h.report(at(0), false).status, 200);
        assert!(!h.report(at(0), false).body.contains("nodeEligible"));
    }

    #[test]
    fn readyz_waits_for_every_family_first_programmed_healthz_does_not() {
        let h = ProxyHealth::new(&[Family::V4, Family::V6], Duration::from_secs(60));
        h.set_node_eligible(true);
        // As kube-proxy's sync loop at its start: `updated` starts the timeout only.
        h.updated(Family::V4, at(0));
        h.updated(Family::V6, at(0));
        assert_eq!(
            h.report(at(1), true).status,
            200,
            "/healthz as kube-proxy's"
        );
        let r = h.readiness(at(1));
        assert_eq!(r.status, 503, "{}", r.body);
        let v: serde_json::Value = serde_json::from_str(&r.body).expect("JSON");
        assert_eq!(v["ready"], false);
        assert_eq!(v["firstSync"], "0001-01-01T00:00:00Z");
        assert!(
            v["reason"]
                .as_str()
                .is_some_and(|r| r.contains("IPv4 and IPv6")),
            "{v}"
        );
        h.programmed(Family::V4, at(2));
        let r = h.readiness(at(3));
        assert_eq!(r.status, 503, "IPv6 still waits: {}", r.body);
        assert!(r.body.contains("to program IPv6 ("), "{}", r.body);
        h.programmed(Family::V6, at(4));
        let r = h.readiness(at(5));
        assert_eq!(r.status, 200, "{}", r.body);
        let v: serde_json::Value = serde_json::from_str(&r.body).expect("JSON");
        assert_eq!(v["firstSync"], "2027-01-15T08:00:04Z");
        // Later failures are /livez's business: /readyz stays 200.
        h.queued(Family::V4, at(6));
        assert_eq!(h.readiness(at(600)).status, 200);
        assert_eq!(h.report(at(600), false).status, 503);
    }

    #[test]
    fn body_shape() {
        let h = ProxyHealth::new(&[Family::V4], Duration::from_secs(60));
        h.set_node_eligible(true);
        h.updated(Family::V4, at(0));
        let r = h.report(at(5), true);
        assert_eq!(
            r.body,
            "{\"lastUpdated\":\"2027-01-15T08:00:05Z\",\"currentTime\":\"2027-01-15T08:00:05Z\",\"nodeEligible\":true,\"healthy\":true,\"status\":{\"IPv4\":{\"lastUpdated\":\"2027-01-15T08:00:00Z\",\"healthy\":true}}}"
        );
        let v: serde_json::Value = serde_json::from_str(&r.body).expect("valid JSON");
        assert_eq!(v["healthy"], true);
    }
}
