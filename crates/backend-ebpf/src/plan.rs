//! What the maps must hold: the frontends of each Service port as a node-local socket reaches
//! them, the endpoint list each one uses, and the ordered map operations that take the maps
//! from one state to the next without a window in which a frontend points at a half-written
//! service. Pure: no kernel, so it is unit-tested with a map double.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};

use kpng_model::{PortKey, ServicePort};

use crate::layout;

/// Which endpoint list a frontend uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// The ClusterIP: `internal_endpoints()` (local ones under internalTrafficPolicy Local).
    Internal,
    /// Node ports, external IPs and load-balancer IPs reached from this node: the cluster
    /// endpoints, as kube-proxy sends node-local and pod traffic to them whatever the
    /// externalTrafficPolicy (its "short-circuit" of local traffic).
    External,
}

/// The frontends of one port that share an endpoint list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// Which list.
    pub scope: Scope,
    /// `(address, port)` pairs of the port's protocol.
    pub frontends: Vec<(IpAddr, u16)>,
    /// The endpoints, in the model's order.
    pub endpoints: Vec<SocketAddr>,
    /// ClientIP affinity timeout (0: none).
    pub affinity_seconds: u32,
    /// No endpoint anywhere: refuse connections (REJECT).
    pub refuse: bool,
}

/// The groups of one Service port. `node_port_ips` are the node's addresses node ports are
/// served on (`--nodeport-addresses`), of the port's family.
///
/// A list that is empty although endpoints exist elsewhere (internalTrafficPolicy Local
/// without a local endpoint) gets no group: the nftables rules beside the programs drop that
/// traffic as kube-proxy does. Load-balancer IPs with `loadBalancerSourceRanges` are left to
/// the nftables rules too, which check the source before the translation.
pub fn groups(port: &ServicePort, node_port_ips: &[IpAddr]) -> Vec<Group> {
    if layout::ip_proto(port.key.protocol).is_none() {
        return Vec::new();
    }
    let affinity_seconds = port
        .session_affinity
        .map_or(0, |a| a.timeout_seconds.max(1));
    let make = |scope, frontends: Vec<(IpAddr, u16)>, eps: &[kpng_model::Endpoint]| {
        if frontends.is_empty() || (eps.is_empty() && port.has_any_endpoints) {
            return None;
        }
        Some(Group {
            scope,
            frontends,
            endpoints: eps.iter().map(|e| e.addr()).collect(),
            affinity_seconds,
            refuse: eps.is_empty(),
        })
    };
    let mut out = Vec::new();
    out.extend(make(
        Scope::Internal,
        vec![(port.cluster_ip, port.port)],
        port.internal_endpoints(),
    ));
    let mut external: Vec<(IpAddr, u16)> = port
        .external_ips
        .iter()
        .map(|ip| (*ip, port.port))
        .collect();
    if port.source_ranges.is_empty() {
        external.extend(port.load_balancer_ips.iter().map(|ip| (*ip, port.port)));
    }
    if let Some(np) = port.node_port {
        external.extend(
            node_port_ips
                .iter()
                .filter(|ip| !ip.is_loopback())
                .map(|ip| (*ip, np)),
        );
    }
    external.sort();
    external.dedup();
    out.extend(make(Scope::External, external, &port.cluster_endpoints));
    out
}

/// One of the four maps userspace writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MapId {
    /// `kpng_frontends`.
    Frontends,
    /// `kpng_services`.
    Services,
    /// `kpng_slots`.
    Slots,
    /// `kpng_members`.
    Members,
}

impl MapId {
    /// Every map.
    pub const ALL: [MapId; 4] = [
        MapId::Frontends,
        MapId::Services,
        MapId::Slots,
        MapId::Members,
    ];

    /// The map's name in the object (and its pin).
    pub fn name(self) -> &'static str {
        match self {
            MapId::Frontends => "kpng_frontends",
            MapId::Services => "kpng_services",
            MapId::Slots => "kpng_slots",
            MapId::Members => "kpng_members",
        }
    }
}

/// One map operation, borrowing its bytes from the states it was computed from (a view of a
/// [`Step`]'s rows, for tests and small diffs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op<'a> {
    /// Insert or replace.
    Upsert(MapId, &'a [u8], &'a [u8]),
    /// Delete (absent is fine).
    Delete(MapId, &'a [u8]),
}

impl MapId {
    /// The key and value sizes of the map's elements (`layout`).
    pub fn sizes(self) -> (usize, usize) {
        match self {
            MapId::Frontends => (layout::FRONTEND_KEY, layout::SERVICE_ID),
            MapId::Services => (layout::SERVICE_ID, layout::SERVICE),
            MapId::Slots => (layout::SLOT_KEY, layout::ENDPOINT),
            MapId::Members => (layout::MEMBER_KEY, layout::MEMBER),
        }
    }
}

/// One map's contents as two flat byte arrays (keys back to back, values back to back), sorted
/// by key once [`Table::seal`]ed: 400k elements cost their bytes (~10 MB at 30k Services ×
/// 4 endpoints), not a heap allocation per key and value, and the arrays are what the
/// kernel's batch commands read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    key_size: usize,
    value_size: usize,
    keys: Vec<u8>,
    values: Vec<u8>,
    sealed: bool,
}

impl Table {
    /// An empty table of `map`'s element sizes.
    pub fn new(map: MapId) -> Table {
        let (key_size, value_size) = map.sizes();
        Table {
            key_size,
            value_size,
            keys: Vec::new(),
            values: Vec::new(),
            sealed: true,
        }
    }

    /// A table of `map`'s elements from flat arrays (a kernel dump); `None` if the lengths do
    /// not fit the sizes.
    pub fn from_flat(map: MapId, keys: Vec<u8>, values: Vec<u8>) -> Option<Table> {
        let mut t = Table::new(map);
        if !keys.len().is_multiple_of(t.key_size)
            || keys.len() / t.key_size * t.value_size != values.len()
        {
            return None;
        }
        t.keys = keys;
        t.values = values;
        t.sealed = false;
        t.seal();
        Some(t)
    }

    /// Appends an element (a later one with the same key wins at [`Table::seal`]).
    pub fn push(&mut self, key: &[u8], value: &[u8]) {
        debug_assert_eq!(key.len(), self.key_size);
        debug_assert_eq!(value.len(), self.value_size);
        self.keys.extend_from_slice(key);
        self.values.extend_from_slice(value);
        self.sealed = false;
    }

    /// Sorts by key, keeping the last of equal keys.
    pub fn seal(&mut self) {
        if self.sealed {
            return;
        }
        let n = self.len();
        let mut order: Vec<u32> = (0..u32::try_from(n).unwrap_or(u32::MAX)).collect();
        order.sort_by(|a, b| self.key(*a as usize).cmp(self.key(*b as usize)));
        let mut keys = Vec::with_capacity(self.keys.len());
        let mut values = Vec::with_capacity(self.values.len());
        for (i, &row) in order.iter().enumerate() {
            let row = row as usize;
            // Equal keys are adjacent in insertion order (a stable sort): keep the last.
            if let Some(&next) = order.get(i + 1)
                && self.key(next as usize) == self.key(row)
            {
                continue;
            }
            keys.extend_from_slice(self.key(row));
            values.extend_from_slice(self.value(row));
        }
        self.keys = keys;
        self.values = values;
        self.sealed = true;
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.keys.len() / self.key_size.max(1)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key of row `i`.
    pub fn key(&self, i: usize) -> &[u8] {
        &self.keys[i * self.key_size..(i + 1) * self.key_size]
    }

    /// The value of row `i`.
    pub fn value(&self, i: usize) -> &[u8] {
        &self.values[i * self.value_size..(i + 1) * self.value_size]
    }

    /// Every (key, value), in key order once sealed.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        (0..self.len()).map(|i| (self.key(i), self.value(i)))
    }

    /// The value of `key` (sealed tables only).
    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.find(key).ok().map(|i| self.value(i))
    }

    fn find(&self, key: &[u8]) -> Result<usize, usize> {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.key(mid).cmp(key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(mid),
            }
        }
        Err(lo)
    }
}

/// Map contents: one [`Table`] per map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entries(pub BTreeMap<MapId, Table>);

impl Default for Entries {
    fn default() -> Self {
        Entries(MapId::ALL.into_iter().map(|m| (m, Table::new(m))).collect())
    }
}

impl Entries {
    fn put(&mut self, map: MapId, key: &[u8], value: &[u8]) {
        self.0
            .entry(map)
            .or_insert_with(|| Table::new(map))
            .push(key, value);
    }

    /// The table of `map`.
    pub fn table(&self, map: MapId) -> Option<&Table> {
        self.0.get(&map)
    }

    /// Adds the entries of `group` under service id `id` (`proto`: the IP protocol number).
    /// [`Entries::seal`] before diffing.
    pub fn add_group(&mut self, id: u32, proto: u8, group: &Group) {
        for (ip, port) in &group.frontends {
            self.put(
                MapId::Frontends,
                &layout::frontend_key(*ip, *port, proto),
                &layout::service_id(id),
            );
        }
        let flags = if group.refuse { layout::FLAG_REFUSE } else { 0 };
        let count = u32::try_from(group.endpoints.len()).unwrap_or(u32::MAX);
        self.put(
            MapId::Services,
            &layout::service_id(id),
            &layout::service(count, group.affinity_seconds, flags),
        );
        for (slot, ep) in (0u32..).zip(&group.endpoints) {
            self.put(
                MapId::Slots,
                &layout::slot_key(id, slot),
                &layout::endpoint(*ep),
            );
            // Only affinity reads the members (is the remembered endpoint still in the
            // service?): without it they would be a third of a cold sync's elements and of
            // the maps' memory for nothing.
            if group.affinity_seconds > 0 {
                self.put(MapId::Members, &layout::member_key(id, *ep), &[1]);
            }
        }
    }

    /// Sorts every table (see [`Table::seal`]).
    pub fn seal(&mut self) {
        for t in self.0.values_mut() {
            t.seal();
        }
    }

    /// Number of entries over all maps.
    pub fn len(&self) -> usize {
        self.0.values().map(Table::len).sum()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether a step writes or deletes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Insert or replace the rows' (key, value).
    Upsert,
    /// Delete the rows' keys.
    Delete,
}

/// One batch of operations on one map: rows of `table` (the new state's for upserts, the old
/// state's for deletes). Row numbers, not copies, so that a cold sync's plan costs 4 bytes
/// per element; the kernel side gathers them into chunked batch buffers.
#[derive(Debug, Clone)]
pub struct Step<'a> {
    /// The map.
    pub map: MapId,
    /// Upsert or delete.
    pub kind: Kind,
    /// Where the rows' bytes are.
    pub table: &'a Table,
    /// The rows, in key order.
    pub rows: Vec<u32>,
}

impl<'a> Step<'a> {
    /// The step as single operations.
    pub fn ops(&self) -> impl Iterator<Item = Op<'a>> + '_ {
        let t = self.table;
        self.rows.iter().map(move |&r| {
            let r = r as usize;
            match self.kind {
                Kind::Upsert => Op::Upsert(self.map, t.key(r), t.value(r)),
                Kind::Delete => Op::Delete(self.map, t.key(r)),
            }
        })
    }
}

/// Number of operations over all steps.
pub fn count(steps: &[Step<'_>]) -> usize {
    steps.iter().map(|s| s.rows.len()).sum()
}

/// The operations that take the maps from `old` to `new` (both sealed), as batches ordered so
/// that readers never see a frontend whose service is incomplete: services, slots and members
/// are written first, then frontends switch; stale frontends go before the services they
/// pointed at. A service whose endpoint count shrinks is written before its extra slots are
/// deleted (they come last), and one that grows has its new slots written before the count.
/// Steps without rows are left out.
pub fn steps<'a>(old: &'a Entries, new: &'a Entries) -> Vec<Step<'a>> {
    static EMPTY: std::sync::OnceLock<Entries> = std::sync::OnceLock::new();
    let empty = EMPTY.get_or_init(Entries::default);
    let get = |e: &'a Entries, m: MapId| -> &'a Table {
        e.0.get(&m)
            .or_else(|| empty.0.get(&m))
            .unwrap_or_else(|| unreachable!("Entries::default has every map"))
    };
    let mut out = Vec::new();
    let mut push = |map, kind, table, rows: Vec<u32>| {
        if !rows.is_empty() {
            out.push(Step {
                map,
                kind,
                table,
                rows,
            });
        }
    };
    let upserts = |m: MapId| {
        let (o, n) = (get(old, m), get(new, m));
        let mut rows = Vec::new();
        let mut j = 0;
        for i in 0..n.len() {
            let k = n.key(i);
            while j < o.len() && o.key(j) < k {
                j += 1;
            }
            if !(j < o.len() && o.key(j) == k && o.value(j) == n.value(i)) {
                rows.push(u32::try_from(i).unwrap_or(u32::MAX));
            }
        }
        (n, rows)
    };
    let deletes = |m: MapId| {
        let (o, n) = (get(old, m), get(new, m));
        let mut rows = Vec::new();
        let mut j = 0;
        for i in 0..o.len() {
            let k = o.key(i);
            while j < n.len() && n.key(j) < k {
                j += 1;
            }
            if !(j < n.len() && n.key(j) == k) {
                rows.push(u32::try_from(i).unwrap_or(u32::MAX));
            }
        }
        (o, rows)
    };
    for m in [
        MapId::Members,
        MapId::Slots,
        MapId::Services,
        MapId::Frontends,
    ] {
        let (t, rows) = upserts(m);
        push(m, Kind::Upsert, t, rows);
    }
    for m in [
        MapId::Frontends,
        MapId::Services,
        MapId::Slots,
        MapId::Members,
    ] {
        let (t, rows) = deletes(m);
        push(m, Kind::Delete, t, rows);
    }
    out
}

/// [`steps`] as single operations, in order (tests and logs).
pub fn ops<'a>(old: &'a Entries, new: &'a Entries) -> Vec<Op<'a>> {
    steps(old, new)
        .iter()
        .flat_map(|s| s.ops().collect::<Vec<_>>())
        .collect()
}

/// Service ids: one per (port, scope), kept while the group exists so that a change of
/// endpoints rewrites slots in place.
#[derive(Debug, Default)]
pub struct Ids {
    by_group: HashMap<(PortKey, Scope), u32>,
    used: HashSet<u32>,
    free: Vec<u32>,
    next: u32,
}

impl Ids {
    /// The id of a group, if it has one.
    pub fn get(&self, port: &PortKey, scope: Scope) -> Option<u32> {
        self.by_group.get(&(port.clone(), scope)).copied()
    }

    /// The id of a group, allocated if new; `preferred` (the id the maps already hold for it,
    /// after a restart) is taken when no other group has it.
    pub fn assign(&mut self, port: &PortKey, scope: Scope, preferred: Option<u32>) -> u32 {
        if let Some(id) = self.get(port, scope) {
            return id;
        }
        let id = match preferred {
            Some(p) if !self.in_use(p) => {
                self.next = self.next.max(p.saturating_add(1));
                p
            }
            _ => loop {
                match self.free.pop() {
                    Some(f) if self.in_use(f) => continue,
                    Some(f) => break f,
                    None => {
                        let f = self.next;
                        self.next = self.next.saturating_add(1);
                        if !self.in_use(f) {
                            break f;
                        }
                    }
                }
            },
        };
        self.by_group.insert((port.clone(), scope), id);
        self.used.insert(id);
        id
    }

    fn in_use(&self, id: u32) -> bool {
        self.used.contains(&id)
    }

    /// Releases a group's id (reusable by later syncs).
    pub fn release(&mut self, port: &PortKey, scope: Scope) {
        if let Some(id) = self.by_group.remove(&(port.clone(), scope)) {
            self.used.remove(&id);
            self.free.push(id);
        }
    }

    /// Forgets every id.
    pub fn clear(&mut self) {
        *self = Ids::default();
    }

    /// How many groups have ids.
    pub fn len(&self) -> usize {
        self.by_group.len()
    }

    /// Whether none has.
    pub fn is_empty(&self) -> bool {
        self.by_group.is_empty()
    }
}

#[cfg(test)]
mod tests;
