//! The desired set/map elements, owned by Service ports, diffed into minimal operations.
//!
//! Several Service ports may want the same element (every port of a Service puts its ClusterIP
//! in `cluster-ips`; two Services may hairpin the same pod). The store therefore keeps, per
//! element, which ports want it and with what value; the element's effective value is that of
//! its lowest-numbered owner. Changing one port's elements yields exactly the element additions,
//! deletions and value replacements that change the kernel's view, nothing more.

use std::collections::{BTreeMap, HashMap};

/// A set or map of our table, by name (`cluster-ips`, `service-ips`, …).
pub type SetName = &'static str;

/// One element as nft text: the key, and the value for maps.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Element {
    /// The set or map.
    pub set: SetName,
    /// The key, e.g. `10.96.0.10 . tcp . 80`.
    pub key: String,
    /// The value for maps (`goto cluster-n3`, `10.244.1.2 . 8080`), `None` for sets.
    pub value: Option<String>,
    /// A comment shown by `nft list` (which Service this is); not part of the identity.
    pub comment: Option<String>,
}

/// What an owner wants for an element: its value and comment.
type Payload = (Option<String>, Option<String>);

/// An element change to send to the kernel.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum ElementOp {
    /// Remove the element with this key.
    Delete {
        /// The set or map.
        set: SetName,
        /// The key.
        key: String,
        /// The value it had (to track references to chains).
        old_value: Option<String>,
    },
    /// Add this element (after any delete of the same key).
    Add(Element),
}

/// An owner of elements: an interned Service-port id.
pub type OwnerId = u32;

/// Owners of one element, sorted by owner id. Almost always exactly one, so a small vector
/// (not a map, whose first node alone would cost ~600 bytes per element at 300k elements).
#[derive(Debug, Default)]
struct Owners {
    /// (owner, the value it wants), sorted by owner.
    wants: Vec<(OwnerId, Payload)>,
}

impl Owners {
    fn effective(&self) -> Option<&Payload> {
        self.wants.first().map(|(_, p)| p)
    }

    fn set(&mut self, owner: OwnerId, payload: Option<Payload>) {
        match (
            self.wants.binary_search_by_key(&owner, |(o, _)| *o),
            payload,
        ) {
            (Ok(i), Some(p)) => self.wants[i].1 = p,
            (Ok(i), None) => {
                self.wants.remove(i);
            }
            (Err(i), Some(p)) => self.wants.insert(i, (owner, p)),
            (Err(_), None) => {}
        }
    }
}

/// Desired elements with their owners.
#[derive(Debug, Default)]
pub struct ElementStore {
    elements: HashMap<(SetName, String), Owners>,
}

impl ElementStore {
    /// An empty store.
    pub fn new() -> ElementStore {
        ElementStore::default()
    }

    /// Number of distinct elements.
    pub fn len(&self) -> usize {
        self.elements.len()
    }

    /// Whether the store holds no element.
    pub fn is_empty(&self) -> bool {
        self.elements.is_empty()
    }

    /// Moves `owner` from wanting `old` to wanting `new`, appending the resulting kernel
    /// operations to `ops`. `old` must be exactly what the owner was last given (the backend
    /// recomputes it from the previous state of the Service port, so the store need not keep a
    /// copy of every element per owner).
    pub fn change_owner(
        &mut self,
        owner: OwnerId,
        old: &[Element],
        new: &[Element],
        ops: &mut Vec<ElementOp>,
    ) {
        if old == new {
            return;
        }
        let payload = |e: &Element| (e.value.clone(), e.comment.clone());
        let old_keys: HashMap<(SetName, &str), Payload> = old
            .iter()
            .map(|e| ((e.set, e.key.as_str()), payload(e)))
            .collect();
        let new_keys: HashMap<(SetName, &str), Payload> = new
            .iter()
            .map(|e| ((e.set, e.key.as_str()), payload(e)))
            .collect();
        // Elements this owner no longer wants, or wants with another value.
        for e in old {
            if new_keys.get(&(e.set, e.key.as_str())) != Some(&payload(e)) {
                self.update((e.set, e.key.clone()), owner, None, ops);
            }
        }
        for e in new {
            if old_keys.get(&(e.set, e.key.as_str())) != Some(&payload(e)) {
                self.update((e.set, e.key.clone()), owner, Some(payload(e)), ops);
            }
        }
    }

    /// Sets (`Some`) or clears (`None`) one owner's wish for one element.
    fn update(
        &mut self,
        id: (SetName, String),
        owner: OwnerId,
        value: Option<Payload>,
        ops: &mut Vec<ElementOp>,
    ) {
        let entry = self.elements.entry(id.clone()).or_default();
        let before = entry.effective().cloned();
        entry.set(owner, value);
        let after = entry.effective().cloned();
        if entry.wants.is_empty() {
            self.elements.remove(&id);
        }
        if before == after {
            return;
        }
        let (set, key) = id;
        if let Some((old_value, _)) = before {
            ops.push(ElementOp::Delete {
                set,
                key: key.clone(),
                old_value,
            });
        }
        if let Some((value, comment)) = after {
            ops.push(ElementOp::Add(Element {
                set,
                key,
                value,
                comment,
            }));
        }
    }

    /// Adds everything a new owner wants, moving the elements in: the fast path of a full
    /// sync, where the store starts empty and no operations are needed.
    pub fn add_owned(&mut self, owner: OwnerId, elements: Vec<Element>) {
        for e in elements {
            let entry = self.elements.entry((e.set, e.key)).or_default();
            entry.set(owner, Some((e.value, e.comment)));
        }
    }

    /// Every desired element, in no particular order (cheaper than [`ElementStore::all`]).
    pub fn all_unsorted(&self) -> Vec<Element> {
        self.elements
            .iter()
            .filter_map(|((set, key), owners)| {
                owners.effective().map(|(value, comment)| Element {
                    set,
                    key: key.clone(),
                    value: value.clone(),
                    comment: comment.clone(),
                })
            })
            .collect()
    }

    /// Every desired element, sorted (for full syncs and golden tests).
    pub fn all(&self) -> Vec<Element> {
        let mut out: Vec<Element> = self
            .elements
            .iter()
            .filter_map(|((set, key), owners)| {
                owners.effective().map(|(value, comment)| Element {
                    set,
                    key: key.clone(),
                    value: value.clone(),
                    comment: comment.clone(),
                })
            })
            .collect();
        out.sort();
        out
    }
}

/// Orders a batch of operations the way a transaction needs them: all deletes, then all adds.
/// A delete and an add of the same key (a value change) thus become "replace" in one commit.
pub fn order_ops(ops: Vec<ElementOp>) -> (Vec<(SetName, String)>, Vec<Element>) {
    let mut deletes = Vec::new();
    let mut adds: BTreeMap<(SetName, String), Element> = BTreeMap::new();
    for op in ops {
        match op {
            ElementOp::Delete { set, key, .. } => {
                // A delete that cancels an add earlier in this batch: the kernel never saw it.
                if adds.remove(&(set, key.clone())).is_none() {
                    deletes.push((set, key));
                }
            }
            ElementOp::Add(e) => {
                adds.insert((e.set, e.key.clone()), e);
            }
        }
    }
    deletes.sort();
    deletes.dedup();
    (deletes, adds.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Test helper keeping what each owner was given, as the backend does through the diff.
    #[derive(Default)]
    struct Tracked {
        store: ElementStore,
        given: HashMap<OwnerId, Vec<Element>>,
    }

    impl Tracked {
        fn set_owner(&mut self, owner: OwnerId, new: Vec<Element>, ops: &mut Vec<ElementOp>) {
            let old = self.given.remove(&owner).unwrap_or_default();
            self.store.change_owner(owner, &old, &new, ops);
            self.given.insert(owner, new);
        }
        fn all(&self) -> Vec<Element> {
            self.store.all()
        }
        fn is_empty(&self) -> bool {
            self.store.is_empty()
        }
    }

    fn el(set: SetName, key: &str, value: Option<&str>) -> Element {
        Element {
            set,
            key: key.into(),
            value: value.map(str::to_string),
            comment: None,
        }
    }

    #[test]
    fn shared_elements_are_added_once_and_removed_with_their_last_owner() {
        let mut s = Tracked::default();
        let mut ops = Vec::new();
        s.set_owner(1, vec![el("cluster-ips", "10.96.0.1", None)], &mut ops);
        s.set_owner(2, vec![el("cluster-ips", "10.96.0.1", None)], &mut ops);
        assert_eq!(
            ops,
            vec![ElementOp::Add(el("cluster-ips", "10.96.0.1", None))]
        );
        ops.clear();
        s.set_owner(1, vec![], &mut ops);
        assert!(ops.is_empty(), "still owned by 2");
        s.set_owner(2, vec![], &mut ops);
        assert_eq!(
            ops,
            vec![ElementOp::Delete {
                set: "cluster-ips",
                key: "10.96.0.1".into(),
                old_value: None
            }]
        );
        assert!(s.is_empty());
    }

    #[test]
    fn value_change_is_delete_then_add_and_unchanged_is_nothing() {
        let mut s = Tracked::default();
        let mut ops = Vec::new();
        s.set_owner(
            1,
            vec![el("m", "k", Some("goto a")), el("m", "k2", Some("x"))],
            &mut ops,
        );
        ops.clear();
        s.set_owner(
            1,
            vec![el("m", "k", Some("goto b")), el("m", "k2", Some("x"))],
            &mut ops,
        );
        let (deletes, adds) = order_ops(ops);
        assert_eq!(deletes, vec![("m", "k".to_string())]);
        assert_eq!(adds, vec![el("m", "k", Some("goto b"))]);
        let mut ops = Vec::new();
        s.set_owner(
            1,
            vec![el("m", "k", Some("goto b")), el("m", "k2", Some("x"))],
            &mut ops,
        );
        assert!(ops.is_empty());
    }

    #[test]
    fn lowest_owner_wins_conflicts() {
        let mut s = Tracked::default();
        let mut ops = Vec::new();
        s.set_owner(5, vec![el("m", "k", Some("five"))], &mut ops);
        ops.clear(); // committed
        s.set_owner(3, vec![el("m", "k", Some("three"))], &mut ops);
        assert_eq!(s.all(), vec![el("m", "k", Some("three"))]);
        let (deletes, adds) = order_ops(ops);
        assert_eq!(deletes, vec![("m", "k".to_string())]);
        assert_eq!(adds, vec![el("m", "k", Some("three"))]);
    }

    #[test]
    fn add_then_delete_in_one_batch_cancels() {
        let mut s = Tracked::default();
        let mut ops = Vec::new();
        s.set_owner(1, vec![el("m", "k", Some("v"))], &mut ops);
        s.set_owner(1, vec![], &mut ops);
        let (deletes, adds) = order_ops(ops);
        assert!(deletes.is_empty() && adds.is_empty());
    }
}
