//! The fake's etcd: objects, a global resourceVersion, a bounded change history, compaction,
//! and the broadcast every open watch follows.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use crate::resource::Resource;

/// How many changes the history keeps (older ones are compacted away, as etcd does).
const HISTORY: usize = 10_000;
/// Capacity of the watch broadcast; a watch that falls this far behind is closed, as the
/// API server closes watchers that cannot keep up.
const BROADCAST: usize = 4_096;

/// The watch event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeType {
    /// `ADDED`.
    Added,
    /// `MODIFIED`.
    Modified,
    /// `DELETED`.
    Deleted,
}

impl ChangeType {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeType::Added => "ADDED",
            ChangeType::Modified => "MODIFIED",
            ChangeType::Deleted => "DELETED",
        }
    }
}

/// One committed change.
#[derive(Debug, Clone)]
pub struct Change {
    /// The resourceVersion it was committed at.
    pub rv: u64,
    /// Which collection.
    pub resource: Resource,
    /// What happened.
    pub change: ChangeType,
    /// The object after the change (for a delete: its last state, with the delete's RV).
    pub object: Value,
    /// The object before the change (`None` for a create).
    pub previous: Option<Value>,
}

/// What open watches are told.
#[derive(Debug, Clone)]
pub enum Notice {
    /// A change was committed.
    Change(Arc<Change>),
    /// End every watch with an `ERROR` event: `410 Gone`, reason `Expired`.
    Expire,
    /// Send a `BOOKMARK` now (to watches that allowed bookmarks).
    Bookmark,
    /// Abort every watch connection without a clean end (a dropped TCP connection).
    Drop,
    /// Every open watch goes silent for good, its connection left open: a hung server, or a
    /// connection a middlebox black-holed.
    Stall,
}

/// Why a store operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The object's `kind` is not served.
    #[error("kind {0:?} is not served by the fake API server")]
    UnknownKind(String),
    /// A required field is missing.
    #[error("{kind}: {field} must be set")]
    Missing {
        /// The object's kind.
        kind: String,
        /// The missing field.
        field: &'static str,
    },
    /// Delete of an object that does not exist.
    #[error("{kind} {name} not found")]
    NotFound {
        /// The kind.
        kind: String,
        /// `namespace/name` or `name`.
        name: String,
    },
}

/// Objects are stored by (resource, namespace, name).
type Key = (Resource, String, String);

/// The state behind the fake API server.
#[derive(Debug)]
pub struct Store {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    /// Each stored object's JSON, encoded once when it is stored: a list writes these bytes
    /// instead of serializing every object for every request. A real API server serves lists
    /// from its watch cache on machines of its own; encoding 135 MB of JSON per start-up on
    /// the benchmark machine's shared CPUs would measure the fake, not kpng.
    encoded: BTreeMap<Key, Box<[u8]>>,
    history: VecDeque<Arc<Change>>,
    /// Changes at or below this RV are gone: a watch from an older RV gets `410 Gone`.
    compacted: u64,
    notices: broadcast::Sender<Notice>,
}

impl Default for Store {
    fn default() -> Self {
        let (notices, _) = broadcast::channel(BROADCAST);
        Store {
            rv: 1000,
            objects: BTreeMap::new(),
            encoded: BTreeMap::new(),
            history: VecDeque::new(),
            compacted: 0,
            notices,
        }
    }
}

/// A consistent view handed to a new watch: what to replay and the live feed after it.
pub struct WatchStart {
    /// Changes after the requested RV (already committed).
    pub replay: Vec<Arc<Change>>,
    /// Every later notice.
    pub live: broadcast::Receiver<Notice>,
    /// The store's RV when the watch started.
    pub rv: u64,
}

fn text(object: &Value, pointer: &str) -> String {
    object
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

impl Store {
    /// The current resourceVersion.
    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// The oldest RV a watch may start from.
    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    /// Objects of one resource, sorted by namespace and name, each with its RV.
    pub fn list(&self, resource: Resource) -> Vec<Value> {
        self.objects
            .range((resource, String::new(), String::new())..)
            .take_while(|((r, _, _), _)| *r == resource)
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// Up to `limit` objects of one resource that `select` accepts, in (namespace, name)
    /// order, strictly after `after` (the key of the last object of the previous page); and
    /// whether more follow. Walks the stored map from `after` on, so a list in pages of 500
    /// costs what one list costs, not one full walk per page. Each object comes with its JSON
    /// as encoded when it was stored.
    pub fn page(
        &self,
        resource: Resource,
        after: Option<(&str, &str)>,
        limit: Option<usize>,
        mut select: impl FnMut(&Value) -> bool,
    ) -> (Vec<(&Value, &[u8])>, bool) {
        use std::ops::Bound;
        let start = match after {
            Some((ns, name)) => Bound::Excluded((resource, ns.to_string(), name.to_string())),
            None => Bound::Included((resource, String::new(), String::new())),
        };
        let matching = self
            .objects
            .range((start, Bound::Unbounded))
            .take_while(|((r, _, _), _)| *r == resource)
            .filter(|(_, o)| select(o))
            .map(|(key, o)| (o, self.encoded.get(key).map_or(&[][..], |b| &b[..])));
        let mut items = Vec::new();
        for object in matching {
            if limit.is_some_and(|l| items.len() == l) {
                return (items, true);
            }
            items.push(object);
        }
        (items, false)
    }

    /// One object.
    pub fn get(&self, resource: Resource, namespace: &str, name: &str) -> Option<Value> {
        self.objects
            .get(&(resource, namespace.to_string(), name.to_string()))
            .cloned()
    }

    fn commit(
        &mut self,
        resource: Resource,
        change: ChangeType,
        object: Value,
        previous: Option<Value>,
    ) -> u64 {
        let change = Arc::new(Change {
            rv: self.rv,
            resource,
            change,
            object,
            previous,
        });
        self.history.push_back(change.clone());
        while self.history.len() > HISTORY {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rv;
            }
        }
        // No receiver is fine: nobody is watching.
        let _ = self.notices.send(Notice::Change(change));
        self.rv
    }

    /// Creates or replaces an object (by kind, namespace and name), filling in what the API
    /// server sets: `resourceVersion`, `uid`, `creationTimestamp`, a `managedFields` entry.
    /// `kind`/`apiVersion` are not stored (list items carry none); watch events add them.
    pub fn apply(&mut self, mut object: Value) -> Result<u64, StoreError> {
        let kind = text(&object, "/kind");
        let resource =
            Resource::of_kind(&kind).ok_or_else(|| StoreError::UnknownKind(kind.clone()))?;
        let name = text(&object, "/metadata/name");
        if name.is_empty() {
            return Err(StoreError::Missing {
                kind,
                field: "metadata.name",
            });
        }
        let namespace = if resource.namespaced() {
            let ns = text(&object, "/metadata/namespace");
            if ns.is_empty() {
                "default".to_string()
            } else {
                ns
            }
        } else {
            String::new()
        };
        let key = (resource, namespace.clone(), name.clone());
        let previous = self.objects.get(&key).cloned();
        self.rv += 1;
        let rv = self.rv;
        if let Some(map) = object.as_object_mut() {
            map.remove("kind");
            map.remove("apiVersion");
            let meta = map
                .entry("metadata")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(meta) = meta.as_object_mut() {
                if resource.namespaced() {
                    meta.insert("namespace".into(), namespace.into());
                }
                meta.insert("resourceVersion".into(), rv.to_string().into());
                let uid = previous
                    .as_ref()
                    .and_then(|p| p.pointer("/metadata/uid").cloned())
                    .unwrap_or_else(|| format!("00000000-0000-4000-8000-{rv:012}").into());
                meta.insert("uid".into(), uid);
                let created = previous
                    .as_ref()
                    .and_then(|p| p.pointer("/metadata/creationTimestamp").cloned())
                    .unwrap_or_else(|| "2026-01-01T00:00:00Z".into());
                meta.insert("creationTimestamp".into(), created);
                // Objects given with their own managedFields (the benchmark's, shaped as
                // kubectl returns them) keep them; others get one entry, as a write does.
                if !meta.contains_key("managedFields") {
                    meta.insert(
                        "managedFields".into(),
                        json!([{"manager": "kubectl", "operation": "Update",
                            "apiVersion": resource.api_version(), "time": "2026-01-01T00:00:00Z",
                            "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}}]),
                    );
                }
            }
        }
        // Encoding a `Value` into a Vec cannot fail.
        let encoded = serde_json::to_vec(&object).unwrap_or_default();
        self.encoded.insert(key.clone(), encoded.into_boxed_slice());
        self.objects.insert(key, object.clone());
        let change = if previous.is_some() {
            ChangeType::Modified
        } else {
            ChangeType::Added
        };
        Ok(self.commit(resource, change, object, previous))
    }

    /// Deletes an object; the `DELETED` event carries its last state with the delete's RV.
    pub fn delete(&mut self, kind: &str, namespace: &str, name: &str) -> Result<u64, StoreError> {
        let resource =
            Resource::of_kind(kind).ok_or_else(|| StoreError::UnknownKind(kind.to_string()))?;
        let namespace = if resource.namespaced() { namespace } else { "" };
        let key = (resource, namespace.to_string(), name.to_string());
        self.encoded.remove(&key);
        let Some(mut object) = self.objects.remove(&key) else {
            return Err(StoreError::NotFound {
                kind: kind.to_string(),
                name: if namespace.is_empty() {
                    name.to_string()
                } else {
                    format!("{namespace}/{name}")
                },
            });
        };
        let previous = object.clone();
        self.rv += 1;
        if let Some(meta) = object
            .pointer_mut("/metadata")
            .and_then(Value::as_object_mut)
        {
            meta.insert("resourceVersion".into(), self.rv.to_string().into());
        }
        Ok(self.commit(resource, ChangeType::Deleted, object, Some(previous)))
    }

    /// Forgets the whole history, as an etcd compaction after a write elsewhere in the cluster:
    /// the RV moves on, so a watch from any RV a client holds gets `410 Gone`, whether it is
    /// open now or starts later.
    pub fn compact(&mut self) {
        self.history.clear();
        self.rv += 1;
        self.compacted = self.rv;
    }

    /// Tells every open watch something.
    pub fn notify(&self, notice: Notice) {
        let _ = self.notices.send(notice);
    }

    /// Starts a watch of `resource` after `rv`: `None` when `rv` is compacted away.
    pub fn watch_from(&self, resource: Resource, rv: u64) -> Option<WatchStart> {
        if rv < self.compacted {
            return None;
        }
        let replay = self
            .history
            .iter()
            .filter(|c| c.rv > rv && c.resource == resource)
            .cloned()
            .collect();
        Some(WatchStart {
            replay,
            live: self.notices.subscribe(),
            rv: self.rv,
        })
    }

    /// Starts a watch that first sees every current object as `ADDED` (a watch without a
    /// resourceVersion, or `sendInitialEvents=true`).
    pub fn watch_current(&self, resource: Resource) -> WatchStart {
        let replay = self
            .list(resource)
            .into_iter()
            .map(|object| {
                let rv = text(&object, "/metadata/resourceVersion")
                    .parse()
                    .unwrap_or(0);
                Arc::new(Change {
                    rv,
                    resource,
                    change: ChangeType::Added,
                    object,
                    previous: None,
                })
            })
            .collect();
        WatchStart {
            replay,
            live: self.notices.subscribe(),
            rv: self.rv,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "ns", "name": name}, "spec": {"clusterIP": "10.96.0.1"}})
    }

    #[test]
    fn apply_sets_server_fields_and_history_replays_after_an_rv() {
        let mut s = Store::default();
        let rv1 = s.apply(svc("a")).expect("apply");
        let rv2 = s.apply(svc("b")).expect("apply");
        let rv3 = s.apply(svc("a")).expect("apply");
        assert!(rv1 < rv2 && rv2 < rv3);
        let a = s.get(Resource::Services, "ns", "a").expect("a");
        assert_eq!(a["metadata"]["resourceVersion"], rv3.to_string());
        assert!(
            a.get("kind").is_none(),
            "stored without kind, as list items"
        );
        assert_eq!(
            a["metadata"]["uid"], s.history[0].object["metadata"]["uid"],
            "uid kept on update"
        );
        let w = s
            .watch_from(Resource::Services, rv1)
            .expect("not compacted");
        let kinds: Vec<_> = w.replay.iter().map(|c| c.change).collect();
        assert_eq!(kinds, [ChangeType::Added, ChangeType::Modified]);
        let rv4 = s.delete("Service", "ns", "b").expect("delete");
        let gone = s.watch_from(Resource::Services, rv3).expect("watch");
        assert_eq!(gone.replay[0].change, ChangeType::Deleted);
        assert_eq!(
            gone.replay[0].object["metadata"]["resourceVersion"],
            rv4.to_string()
        );
        s.compact();
        assert!(
            s.watch_from(Resource::Services, rv4).is_none(),
            "410 after compaction"
        );
        assert!(s.watch_from(Resource::Services, s.rv()).is_some());
    }

    #[test]
    fn bad_objects_are_refused_by_the_store_only_for_identity() {
        let mut s = Store::default();
        assert_eq!(
            s.apply(json!({"kind": "Pod", "metadata": {"name": "p"}})),
            Err(StoreError::UnknownKind("Pod".into()))
        );
        assert!(s.apply(json!({"kind": "Node", "metadata": {}})).is_err());
        assert!(s.delete("Node", "", "missing").is_err());
        // Anything else is stored as given: tests feed kpng objects it must reject.
        assert!(
            s.apply(json!({"kind": "Node", "metadata": {"name": "n"}, "spec": {"podCIDRs": 7}}))
                .is_ok()
        );
    }
}
