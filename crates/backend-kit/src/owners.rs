//! Small, stable ids for the Service ports that own data-plane objects.
//!
//! Several Service ports may want one object (every port of a Service wants its ClusterIP in
//! a set; two Services may claim one external IP and port). Backends record who wants what by
//! owner id, and the lowest id wins, so a conflict resolves the same way on every sync and a
//! departing owner hands the object to the next one. An id is a `u32` (not the port key) to keep
//! a per-object record small at hundreds of thousands of objects.

use std::collections::BTreeMap;

use kpng_model::PortKey;

/// Who wants an object: a Service port (by id) or the node ([`NODE_OWNER`]).
pub type OwnerId = u32;

/// The owner of node-level objects (node-port addresses, Service CIDRs): lower than every
/// Service port, so the node's own objects win a conflict.
pub const NODE_OWNER: OwnerId = 0;

/// Reserved for a store's own use (e.g. marking an object with several owners); never handed
/// out.
pub const RESERVED: OwnerId = OwnerId::MAX;

/// Service port ↔ owner id. B-trees, not hash maps: at 30k ports a hash table at half load costs
/// more memory than the keys.
#[derive(Debug, Default)]
pub struct OwnerIds {
    by_key: BTreeMap<PortKey, OwnerId>,
    by_id: BTreeMap<OwnerId, PortKey>,
    next: OwnerId,
}

impl OwnerIds {
    /// No owners yet.
    pub fn new() -> OwnerIds {
        OwnerIds::default()
    }

    /// The id of `key`, allocated on first use. Ids are not reused while their port exists;
    /// after wrapping around (4 billion ports later), [`NODE_OWNER`] and [`RESERVED`] are
    /// skipped.
    pub fn id(&mut self, key: &PortKey) -> OwnerId {
        if let Some(id) = self.by_key.get(key) {
            return *id;
        }
        let mut id = self.next;
        while id == NODE_OWNER || id == RESERVED || self.by_id.contains_key(&id) {
            id = id.wrapping_add(1);
        }
        self.next = id.wrapping_add(1);
        self.by_key.insert(key.clone(), id);
        self.by_id.insert(id, key.clone());
        id
    }

    /// The id of `key`, if it has one.
    pub fn get(&self, key: &PortKey) -> Option<OwnerId> {
        self.by_key.get(key).copied()
    }

    /// The port an id belongs to.
    pub fn key(&self, id: OwnerId) -> Option<&PortKey> {
        self.by_id.get(&id)
    }

    /// Forgets a port that is gone; returns its id.
    pub fn forget(&mut self, key: &PortKey) -> Option<OwnerId> {
        let id = self.by_key.remove(key)?;
        self.by_id.remove(&id);
        Some(id)
    }

    /// Forgets every port (a backend rebuilt from nothing).
    pub fn clear(&mut self) {
        self.by_key.clear();
        self.by_id.clear();
    }

    /// How many ports hold an id.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether no port holds an id.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpng_model::{Family, Protocol, ServiceKey};

    fn key(name: &str) -> PortKey {
        PortKey {
            service: ServiceKey::new("ns", name),
            port_name: "p".into(),
            protocol: Protocol::Tcp,
            family: Family::V4,
        }
    }

    #[test]
    fn ids_are_stable_distinct_and_never_the_node_or_reserved() {
        let mut ids = OwnerIds::new();
        let a = ids.id(&key("a"));
        assert_ne!(a, NODE_OWNER);
        assert_eq!(ids.id(&key("a")), a);
        let b = ids.id(&key("b"));
        assert_ne!(a, b);
        assert_eq!(ids.key(b), Some(&key("b")));
        assert_eq!(ids.forget(&key("a")), Some(a));
        assert_eq!(ids.get(&key("a")), None);
        ids.next = RESERVED;
        let c = ids.id(&key("c"));
        assert!(c != RESERVED && c != NODE_OWNER && c != b, "{c}");
    }
}
