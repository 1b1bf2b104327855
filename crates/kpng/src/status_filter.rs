//! `kpng status NS/NAME`, `NS/` and `-n NS` are about some Services: of the rejected objects
//! and dropped values the status lists (this kpng's own and, on a node, its brain's), keep
//! those that concern these Services, in the table and in `-o json|yaml` alike.
//!
//! Why: an operator debugging one Service was misled twice. A rejection of the Service's own
//! EndpointSlice was left out (it named only the slice; it now carries the Service its
//! `kubernetes.io/service-name` label names, [`RejectedStatus::service`]), and `-o json`
//! listed every other object's rejections and dropped values while the table, for the same
//! question, did not.

use kpng_runner::admin::{DroppedStatus, RejectedStatus, Status, StatusQuery};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The Services a `kpng status` filter (`ns/name`, `name`, `ns/name:port`, `ns/`) names,
/// whatever port it asks for: a rejection or dropped value concerns a Service, not a port.
struct ServiceFilter(StatusQuery);

impl ServiceFilter {
    fn new(filter: &str) -> ServiceFilter {
        ServiceFilter(StatusQuery {
            service: Some(filter.to_string()),
            ..StatusQuery::default()
        })
    }

    /// Whether `service` (`(namespace, name)`) is one of the Services asked for.
    fn names(&self, service: Option<(&str, &str)>) -> bool {
        service.is_some_and(|(namespace, name)| self.0.names_service(namespace, name))
    }

    /// The namespace when the filter asks for a whole one (`ns/`, `ns/*`, as `-n ns`): then
    /// every object of it is asked for, an EndpointSlice of no Service too (its label may be
    /// what is wrong with it).
    fn whole_namespace(&self) -> Option<&str> {
        let filter = self.0.service.as_deref()?;
        let (namespace, name) = filter.split_once('/')?;
        (name.is_empty() || name == "*").then_some(namespace)
    }

    /// Whether an object written `Kind namespace/name` is in the namespace asked for whole.
    fn in_namespace(&self, object: &str) -> bool {
        let namespace = object
            .split_once(' ')
            .and_then(|(_, o)| o.split_once('/'))
            .map(|(namespace, _)| namespace);
        self.whole_namespace()
            .is_some_and(|want| namespace == Some(want))
    }

    /// Whether the rejection concerns a Service asked for: the Service's own, or one of its
    /// EndpointSlices' ([`RejectedStatus::concerned_service`]); or is in the namespace asked
    /// for whole.
    fn wants_rejection(&self, r: &RejectedStatus) -> bool {
        self.names(r.concerned_service()) || self.in_namespace(&r.object)
    }

    /// Whether the dropped value is of a Service asked for, or of one of its EndpointSlices;
    /// or in the namespace asked for whole.
    fn wants_dropped(&self, d: &DroppedStatus) -> bool {
        self.names(d.service.as_deref().and_then(|s| s.split_once('/')))
            || self.in_namespace(&d.object)
    }
}

/// Keeps, of the rejections and dropped values of `status`, those of the Services `filter`
/// names; how many other rejections were left out (the table says so).
pub fn keep_rejections_of(status: &mut Status, filter: &str) -> usize {
    let filter = ServiceFilter::new(filter);
    status.dropped.retain(|d| filter.wants_dropped(d));
    let before = status.rejected.len();
    status.rejected.retain(|r| filter.wants_rejection(r));
    let mut not_shown = before - status.rejected.len();
    if let Some(report) = &mut status.brain_reports {
        report.dropped.retain(|d| filter.wants_dropped(d));
        report.dropped_total = report.dropped.len() as u64;
        let total = usize::try_from(report.rejected_total).unwrap_or(usize::MAX);
        report.rejected.retain(|r| filter.wants_rejection(r));
        not_shown += total.saturating_sub(report.rejected.len());
        report.rejected_total = report.rejected.len() as u64;
    }
    not_shown
}

/// [`keep_rejections_of`] on the status as JSON, for `-o json|yaml`: the same entries are
/// kept, each as kpng sent it (fields this `kpng` does not know included), and the brain's
/// totals count what is kept. An entry that does not read as a rejection (or a dropped
/// value) names no Service, and is left out.
pub fn keep_rejections_of_json(status: &mut Value, filter: &str) -> usize {
    let filter = ServiceFilter::new(filter);
    retain(status, "dropped", |d| filter.wants_dropped(d));
    drop_if_empty(status, "dropped");
    let (before, kept) = retain(status, "rejected", |r| filter.wants_rejection(r));
    drop_if_empty(status, "rejected");
    let mut not_shown = before - kept;
    if let Some(report) = status.get_mut("brainReports").filter(|r| r.is_object()) {
        let (_, dropped) = retain(report, "dropped", |d| filter.wants_dropped(d));
        report["droppedTotal"] = Value::from(dropped);
        let total = report["rejectedTotal"]
            .as_u64()
            .and_then(|t| usize::try_from(t).ok());
        let (listed, rejected) = retain(report, "rejected", |r| filter.wants_rejection(r));
        not_shown += total.unwrap_or(listed).max(listed).saturating_sub(rejected);
        report["rejectedTotal"] = Value::from(rejected);
    }
    not_shown
}

/// Keeps the entries of the list `status[key]` that read as a `T` that `keep` accepts; how
/// many it had and has (0 and 0 without the list).
fn retain<T: DeserializeOwned>(
    status: &mut Value,
    key: &str,
    keep: impl Fn(&T) -> bool,
) -> (usize, usize) {
    let Some(list) = status.get_mut(key).and_then(Value::as_array_mut) else {
        return (0, 0);
    };
    let before = list.len();
    list.retain(|entry| T::deserialize(entry).is_ok_and(|t| keep(&t)));
    (before, list.len())
}

/// Removes the list `status[key]` when nothing of it is kept, as kpng leaves out an empty one.
fn drop_if_empty(status: &mut Value, key: &str) {
    if status[key].as_array().is_some_and(Vec::is_empty)
        && let Some(object) = status.as_object_mut()
    {
        object.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejected(object: &str, service: Option<&str>) -> Value {
        let (kind, rest) = object.split_once(' ').unwrap_or_default();
        let (namespace, name) = rest.split_once('/').unwrap_or_default();
        let mut r = serde_json::json!({"object": object, "kind": kind, "namespace": namespace,
            "name": name, "field": "f", "message": "m", "kept": false});
        if let Some(service) = service {
            r["service"] = service.into();
        }
        r
    }

    /// A status from a kpng older than `kind`: the object in words only.
    fn old_rejected(object: &str) -> Value {
        serde_json::json!({"object": object, "field": "f", "message": "m", "kept": false})
    }

    fn dropped(object: &str, service: Option<&str>) -> Value {
        serde_json::json!({"object": object, "service": service, "field": "f", "message": "m"})
    }

    /// Which entries of a status each filter keeps: a Service's own rejection (by its
    /// `service`, or its name from a kpng or brain without that field), its slices' (by
    /// `service`), a whole namespace's (an ownerless slice's too), never another Service's.
    #[test]
    fn a_filter_keeps_what_concerns_its_services() {
        let status = serde_json::json!({
            "node": "n1",
            "rejected": [
                rejected("Service ns/web", Some("ns/web")),
                rejected("EndpointSlice ns/web-abc", Some("ns/web")),
                rejected("EndpointSlice ns/orphan", None),
                rejected("Service ns/db", Some("ns/db")),
                rejected("Service other/web", Some("other/web")),
                rejected("Service ns/Bad_Name", None),
                old_rejected("Service ns/old"),
                rejected("Node n1", None),
            ],
            "dropped": [
                dropped("EndpointSlice ns/web-abc", Some("ns/web")),
                dropped("Service ns/db", Some("ns/db")),
                dropped("EndpointSlice ns/orphan", None),
            ],
            "brainReports": {"source": "file /c.yaml", "healthy": true, "rejectedTotal": 150,
                "rejected": [rejected("EndpointSlice ns/web-def", Some("ns/web")),
                             rejected("Service ns/web", None),
                             rejected("EndpointSlice ns/db-1", Some("ns/db"))],
                "dropped": [dropped("Service other/web", Some("other/web"))],
                "droppedTotal": 1},
        });
        let objects = |v: &Value, pointer: &str| -> Vec<String> {
            v.pointer(pointer)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|e| e["object"].as_str().unwrap_or_default().to_string())
                .collect()
        };
        // (filter, own rejections, own dropped, brain's rejections, brain's dropped, not shown)
        type Case<'a> = (
            &'a str,
            &'a [&'a str],
            &'a [&'a str],
            &'a [&'a str],
            &'a [&'a str],
            usize,
        );
        let cases: &[Case] = &[
            (
                "ns/web",
                &["Service ns/web", "EndpointSlice ns/web-abc"],
                &["EndpointSlice ns/web-abc"],
                &["EndpointSlice ns/web-def", "Service ns/web"],
                &[],
                6 + 148,
            ),
            (
                "ns/web:http",
                &["Service ns/web", "EndpointSlice ns/web-abc"],
                &["EndpointSlice ns/web-abc"],
                &["EndpointSlice ns/web-def", "Service ns/web"],
                &[],
                6 + 148,
            ),
            (
                "web",
                &[
                    "Service ns/web",
                    "EndpointSlice ns/web-abc",
                    "Service other/web",
                ],
                &["EndpointSlice ns/web-abc"],
                &["EndpointSlice ns/web-def", "Service ns/web"],
                &["Service other/web"],
                5 + 148,
            ),
            (
                "ns/",
                &[
                    "Service ns/web",
                    "EndpointSlice ns/web-abc",
                    "EndpointSlice ns/orphan",
                    "Service ns/db",
                    "Service ns/Bad_Name",
                    "Service ns/old",
                ],
                &[
                    "EndpointSlice ns/web-abc",
                    "Service ns/db",
                    "EndpointSlice ns/orphan",
                ],
                &[
                    "EndpointSlice ns/web-def",
                    "Service ns/web",
                    "EndpointSlice ns/db-1",
                ],
                &[],
                2 + 147,
            ),
            ("ns/old", &["Service ns/old"], &[], &[], &[], 7 + 150),
            ("ns/none", &[], &[], &[], &[], 8 + 150),
        ];
        for (filter, own, own_dropped, brains, brains_dropped, not_shown) in cases {
            let mut json = status.clone();
            let hidden = keep_rejections_of_json(&mut json, filter);
            assert_eq!(objects(&json, "/rejected"), *own, "{filter}: JSON");
            assert_eq!(objects(&json, "/dropped"), *own_dropped, "{filter}");
            assert_eq!(
                objects(&json, "/brainReports/rejected"),
                *brains,
                "{filter}"
            );
            assert_eq!(
                objects(&json, "/brainReports/dropped"),
                *brains_dropped,
                "{filter}"
            );
            assert_eq!(hidden, *not_shown, "{filter}: JSON");
            assert_eq!(
                json["brainReports"]["rejectedTotal"],
                brains.len(),
                "{filter}"
            );
            assert_eq!(
                json["brainReports"]["droppedTotal"],
                brains_dropped.len(),
                "{filter}"
            );
            assert_eq!(
                json.get("rejected").is_some(),
                !own.is_empty(),
                "{filter}: an empty list is left out, as kpng sends it"
            );
            assert_eq!(json["node"], "n1", "{filter}: the rest is untouched");

            // The table's typed status keeps the same entries.
            let mut typed = status.clone();
            typed["services"] = serde_json::json!([]);
            typed["backend"] = "file".into();
            typed["programmed"] = true.into();
            typed["pendingPortChanges"] = 0.into();
            let mut typed: Status = serde_json::from_value(typed).expect("a status");
            let hidden = keep_rejections_of(&mut typed, filter);
            let typed = serde_json::to_value(&typed).expect("JSON");
            assert_eq!(objects(&typed, "/rejected"), *own, "{filter}: table");
            assert_eq!(objects(&typed, "/dropped"), *own_dropped, "{filter}");
            assert_eq!(objects(&typed, "/brainReports/rejected"), *brains);
            assert_eq!(hidden, *not_shown, "{filter}: table");
        }
    }

    /// A status without any list, or with entries that do not read, is filtered without
    /// failing.
    #[test]
    fn missing_or_odd_lists_are_no_failure() {
        let mut bare = serde_json::json!({"node": "n1"});
        assert_eq!(keep_rejections_of_json(&mut bare, "ns/web"), 0);
        assert_eq!(bare, serde_json::json!({"node": "n1"}));
        let mut odd = serde_json::json!({"rejected": [1, {"object": "Service ns/web"}],
            "dropped": "x"});
        assert_eq!(keep_rejections_of_json(&mut odd, "ns/web"), 2);
        assert_eq!(odd, serde_json::json!({"dropped": "x"}));
    }
}
