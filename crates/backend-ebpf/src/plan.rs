//! What the maps must hold: the frontends of each Service port as a node-local socket reaches
//! them, the endpoint list each one uses, and the ordered map operations that take the maps
//! from one state to the next without a window in which a frontend points at a half-written
//! service. Pure: no kernel, so it is unit-tested with a map double.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use kpng_model::{Change, Family, PortKey, Protocol, ServicePort};

use crate::layout;

pub mod contest;

pub use contest::Contest;

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
///
/// A UDP port without any endpoint gets no group either: refused at `connect()`/`sendto()`,
/// a client would fail where kube-proxy's lets it succeed and the error come at `recv()` (an
/// ICMP port unreachable from the REJECT rule), and a Go `net.Dial("udp")` made before the
/// endpoints come would fail for good. Left to the rules, it gets kube-proxy's REJECT, and a
/// socket connected meanwhile is DNATed by them once endpoints come. TCP stays refused at
/// `connect()`: the same `ECONNREFUSED` kube-proxy's reset gives, without a packet.
pub fn groups(port: &ServicePort, node_port_ips: &[IpAddr]) -> Vec<Group> {
    if layout::ip_proto(port.key.protocol).is_none() {
        return Vec::new();
    }
    let affinity_seconds = port
        .session_affinity
        .map_or(0, |a| a.timeout_seconds.max(1));
    let udp = port.key.protocol == Protocol::Udp;
    let make = |scope, frontends: Vec<(IpAddr, u16)>, eps: &[kpng_model::Endpoint]| {
        if frontends.is_empty() || (eps.is_empty() && (port.has_any_endpoints || udp)) {
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
    // With ClientIP affinity and one list for both, the external frontends join the
    // ClusterIP's group: one service id, so one affinity per client whichever address it
    // uses, as kube-proxy's external chain jumps to the Service's own chain and its affinity.
    let shared = affinity_seconds > 0
        && external_list_is_internal(port)
        && out.first().is_some_and(|g| g.scope == Scope::Internal);
    if shared {
        if let Some(internal) = out.first_mut() {
            internal.frontends.extend(external);
            internal.frontends.sort();
            internal.frontends.dedup();
        }
        return out;
    }
    out.extend(make(Scope::External, external, &port.cluster_endpoints));
    out
}

/// The groups of one Service port without the frontends another port owns ([`Contest`]): what
/// both the full sync and a change's sync program, so that they agree on every shared key.
/// `contest` holds the state the groups are for.
pub fn won_groups(port: &ServicePort, node_port_ips: &[IpAddr], contest: &Contest) -> Vec<Group> {
    let mut out = groups(port, node_port_ips);
    contest.keep_won(port, node_port_ips, &mut out);
    out
}

/// What a sync of changed ports writes: the maps' contents for every key the changes touch,
/// as the last sync left them (`old`) and as they must be (`new`), for [`steps`].
#[derive(Debug, Default)]
pub struct Replan {
    /// What the last sync wrote for the affected ports.
    pub old: Entries,
    /// What they must have now.
    pub new: Entries,
    /// The groups gone: release their ids ([`Ids::release`]) once the steps are applied.
    pub released: Vec<(PortKey, Scope)>,
}

/// Plans a change's sync: the changed ports and their rivals for a shared key ([`Contest`]),
/// each before and after, so that a loser takes a key over in the same sync as its winner
/// leaves, and a change of the loser leaves the winner's element alone. O(the changed ports'
/// frontends and their rivals'). `ports` is the new state (the snapshot); `contest` holds the
/// state the last sync programmed, and the new one on return; new groups get ids from `ids`.
///
/// What the last sync wrote is recomputed from the ports' old states rather than kept:
/// keeping it cost ~10 MB at 30k Services, and twice that during a full sync.
pub fn replan(
    changes: &BTreeMap<PortKey, Change>,
    ports: &BTreeMap<PortKey, Arc<ServicePort>>,
    node_port_ips: &HashMap<Family, Vec<IpAddr>>,
    ids: &mut Ids,
    contest: &mut Contest,
) -> Replan {
    let ips = |f: Family| node_port_ips.get(&f).map_or(&[][..], Vec::as_slice);
    // The rivals of a port before and after its change: every port whose share of a key may
    // move. (After the change, the rivals are the same ones, or changed ports.)
    let mut affected: BTreeSet<PortKey> = changes.keys().cloned().collect();
    for change in changes.values() {
        for p in change.old.iter().chain(&change.new) {
            contest.rivals(p, ips(p.key.family), &mut affected);
        }
    }
    let state = |key: &PortKey, new: bool| -> Option<Arc<ServicePort>> {
        match changes.get(key) {
            Some(c) if new => c.new.clone(),
            Some(c) => c.old.clone(),
            None => ports.get(key).cloned(),
        }
    };
    let mut plan = Replan::default();
    let mut before: Vec<(PortKey, Scope)> = Vec::new();
    for key in &affected {
        let Some(port) = state(key, false) else {
            continue;
        };
        let Some(proto) = layout::ip_proto(port.key.protocol) else {
            continue;
        };
        for g in won_groups(&port, ips(port.key.family), contest) {
            if let Some(id) = ids.get(key, g.scope) {
                plan.old.add_group(id, proto, &g);
                before.push((key.clone(), g.scope));
            }
        }
    }
    for change in changes.values() {
        if let Some(p) = &change.old {
            contest.withdraw(p);
        }
    }
    for change in changes.values() {
        if let Some(p) = &change.new {
            contest.declare(p, ips(p.key.family));
        }
    }
    let mut after: HashSet<(PortKey, Scope)> = HashSet::new();
    for key in &affected {
        let Some(port) = state(key, true) else {
            continue;
        };
        let Some(proto) = layout::ip_proto(port.key.protocol) else {
            continue;
        };
        for g in won_groups(&port, ips(port.key.family), contest) {
            let id = ids.assign(key, g.scope, None);
            plan.new.add_group(id, proto, &g);
            after.insert((key.clone(), g.scope));
        }
    }
    plan.released = before.into_iter().filter(|b| !after.contains(b)).collect();
    plan.old.seal();
    plan.new.seal();
    plan
}

/// Whether the external frontends' list (the cluster endpoints) is the ClusterIP's.
fn external_list_is_internal(port: &ServicePort) -> bool {
    let internal = port.internal_endpoints();
    internal.len() == port.cluster_endpoints.len()
        && internal
            .iter()
            .zip(&port.cluster_endpoints)
            .all(|(a, b)| a.addr() == b.addr())
}

/// One of the three maps userspace writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MapId {
    /// `kpng_frontends`: frontend → service with its first endpoints.
    Frontends,
    /// `kpng_slots`: the endpoints past the inline ones.
    Slots,
    /// `kpng_members`: membership for affinity Services with overflow slots.
    Members,
}

impl MapId {
    /// Every map.
    pub const ALL: [MapId; 3] = [MapId::Frontends, MapId::Slots, MapId::Members];

    /// The map's name in the object (and its pin).
    pub fn name(self) -> &'static str {
        match self {
            MapId::Frontends => "kpng_frontends",
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
            MapId::Frontends => (layout::FRONTEND_KEY, layout::SERVICE),
            MapId::Slots => (layout::SLOT_KEY, layout::ENDPOINT),
            MapId::Members => (layout::MEMBER_KEY, layout::MEMBER),
        }
    }
}

/// One map's contents as two flat byte arrays (keys back to back, values back to back), sorted
/// by key once [`Table::seal`]ed: elements cost their bytes, not a heap allocation per key and
/// value, and the arrays are what the kernel's batch commands read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    key_size: usize,
    value_size: usize,
    keys: Vec<u8>,
    values: Vec<u8>,
    sealed: bool,
    /// The values are [`digest`]s of the map's values ([`Table::digests`]).
    digested: bool,
}

/// The bytes of a [`digest`].
pub const DIGEST: usize = 16;

/// What a full sync keeps of a frontend value it reads back from the kernel (`struct service`,
/// [`layout::SERVICE`] = 176 bytes): its first 8 bytes as they are (the service id and the
/// endpoint count, which the sync reads: [`layout::service_id_of`]) and a 64-bit hash of the
/// whole value, enough to tell whether the value it wants differs. A restart at 30k Services
/// thus holds ~1.8 MB of old frontends instead of ~10 MB (and their copies while sorted),
/// beside the nftables half's own peak. Two different values with the same first 8 bytes and
/// the same hash (odds about 1 in 10^19 per frontend) would leave the old one in place until
/// the Service next changes.
pub fn digest(value: &[u8]) -> [u8; DIGEST] {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    let mut d = [0u8; DIGEST];
    let head = value.len().min(8);
    d[..head].copy_from_slice(&value[..head]);
    let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(value);
    d[8..].copy_from_slice(&hash.to_ne_bytes());
    d
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
            digested: false,
        }
    }

    /// An empty table of `map`'s keys whose values are [`digest`]s: what a full sync reads
    /// back of the frontends ([`Table::push_read`]), compared with [`Table::holds`].
    pub fn digests(map: MapId) -> Table {
        Table {
            value_size: DIGEST,
            digested: true,
            ..Table::new(map)
        }
    }

    /// An empty table for what a full sync reads back of `map` from the kernel
    /// ([`Table::push_read`]): the frontends' values as [`digest`]s, the other maps' as they
    /// are (a few bytes each; and the slots' endpoints are read for the UDP pairs that go).
    pub fn read_back(map: MapId) -> Table {
        match map {
            MapId::Frontends => Table::digests(map),
            MapId::Slots | MapId::Members => Table::new(map),
        }
    }

    /// Appends an element read from the kernel: its value as it is, or its [`digest`] in a
    /// [`Table::digests`] table.
    pub fn push_read(&mut self, key: &[u8], value: &[u8]) {
        if self.digested {
            self.push(key, &digest(value));
        } else {
            self.push(key, value);
        }
    }

    /// Whether row `i` holds `value` (a whole value of the map, compared by [`digest`] in a
    /// [`Table::digests`] table).
    pub fn holds(&self, i: usize, value: &[u8]) -> bool {
        if self.digested {
            self.value(i) == digest(value)
        } else {
            self.value(i) == value
        }
    }

    /// The bytes the table's elements take (keys and values): what a full sync holds of a map
    /// it read back.
    pub fn bytes(&self) -> usize {
        self.keys.len() + self.values.len()
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

    /// The row of `key` (sealed tables only), or where it would go.
    pub fn find(&self, key: &[u8]) -> Result<usize, usize> {
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
        for_group(id, proto, group, &mut |m, k, v| self.put(m, k, v));
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

/// Where [`for_group`] hands each (map, key, value).
pub type ElementSink<'a> = dyn FnMut(MapId, &[u8], &[u8]) + 'a;

/// Every element of `group` under service id `id` (`proto`: the IP protocol number), in
/// the order a writer must respect: the overflow slots and members (the elements a frontend
/// points at) before the frontends.
///
/// A frontend's value is the service itself with its first [`layout::INLINE`] endpoints: one
/// element per frontend, where the list used to cost a service element and one slot per
/// endpoint. Only longer lists write slots (from `INLINE` on), and only those whose choices
/// are kept write members (the program searches a short list inline): ClientIP affinity, and
/// UDP, whose unconnected sockets' flows keep their endpoint while it is a member.
pub fn for_group(id: u32, proto: u8, group: &Group, out: &mut ElementSink<'_>) {
    let count = u32::try_from(group.endpoints.len()).unwrap_or(u32::MAX);
    let overflow = group.endpoints.len() > layout::INLINE;
    let kept = group.affinity_seconds > 0 || Some(proto) == layout::ip_proto(Protocol::Udp);
    if overflow {
        for (slot, ep) in (0u32..).zip(&group.endpoints) {
            if slot as usize >= layout::INLINE {
                out(
                    MapId::Slots,
                    &layout::slot_key(id, slot),
                    &layout::endpoint(*ep),
                );
            }
            if kept {
                out(MapId::Members, &layout::member_key(id, *ep), &[1]);
            }
        }
    }
    let flags = if group.refuse { layout::FLAG_REFUSE } else { 0 };
    let value = layout::service(id, count, group.affinity_seconds, flags, &group.endpoints);
    for (ip, port) in &group.frontends {
        out(
            MapId::Frontends,
            &layout::frontend_key(*ip, *port, proto),
            &value,
        );
    }
}

/// A map converged element by element against what it holds (`old`, a sealed dump), without
/// a table of the wanted state: [`Converge::put`] skips what the map already holds, collects
/// the rest into a batch of [`CHUNK`](crate::batch::CHUNK) elements for the caller to write,
/// and marks the old rows still wanted, so that [`Converge::stale`] is what to delete
/// afterwards. A full sync at 30k Services thus holds the kernel's dump (frontend values as
/// [`digest`]s, [`Table::holds`]) and one batch, not a second image of every map: only the
/// keys it adds are remembered, to count the map's elements ([`Converge::wanted`]).
#[derive(Debug)]
pub struct Converge<'a> {
    old: &'a Table,
    seen: Vec<bool>,
    /// The old rows a [`Converge::put`] wanted (not [`Converge::keep`] or
    /// [`Converge::take_stale`], which mark `seen` too).
    put_old: Vec<bool>,
    /// The keys put that the map did not hold, by a 64-bit hash of each: a cold start puts
    /// every key (~60k at 30k Services), and 8 bytes a key keep the count off the peak RSS
    /// where the keys themselves would add megabytes. Two keys sharing a hash would count
    /// once (odds about 1 in 10^10 at that size): a gauge off by one, nothing programmed.
    put_new: HashSet<u64>,
    keys: Vec<u8>,
    values: Vec<u8>,
    written: usize,
}

/// A frontend, slot or member key's hash, for counting distinct keys ([`Converge::wanted`]).
fn key_hash(key: &[u8]) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one(key)
}

impl<'a> Converge<'a> {
    /// Converging a map that holds `old`.
    pub fn new(old: &'a Table) -> Converge<'a> {
        Converge {
            old,
            seen: vec![false; old.len()],
            put_old: vec![false; old.len()],
            put_new: HashSet::new(),
            keys: Vec::new(),
            values: Vec::new(),
            written: 0,
        }
    }

    /// Wants `key` → `value`; true when a full batch is pending ([`Converge::take`] it).
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> bool {
        if let Ok(i) = self.old.find(key) {
            self.seen[i] = true;
            self.put_old[i] = true;
            if self.old.holds(i, value) {
                return false;
            }
        } else {
            self.put_new.insert(key_hash(key));
        }
        self.keys.extend_from_slice(key);
        self.values.extend_from_slice(value);
        self.written += 1;
        self.keys.len() / key.len().max(1) >= crate::batch::CHUNK
    }

    /// Wants `key`, whatever its value: marks the old row still wanted without writing
    /// anything (the first pass of a full sync, which learns what is stale before it writes).
    pub fn keep(&mut self, key: &[u8]) {
        if let Ok(i) = self.old.find(key) {
            self.seen[i] = true;
        }
    }

    /// The stale rows that `early` accepts (by key and old value), marked as handled: the
    /// caller deletes them now, before its writes, and [`Converge::stale`] no longer lists
    /// them.
    pub fn take_stale(&mut self, early: impl Fn(&[u8], &[u8]) -> bool) -> Vec<u8> {
        let mut keys = Vec::new();
        for (i, seen) in self.seen.iter_mut().enumerate() {
            if !*seen && early(self.old.key(i), self.old.value(i)) {
                *seen = true;
                keys.extend_from_slice(self.old.key(i));
            }
        }
        keys
    }

    /// The (key, old value) of the rows that stay wanted.
    pub fn kept(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + '_ {
        let old = self.old;
        self.seen
            .iter()
            .enumerate()
            .filter(|(_, seen)| **seen)
            .map(move |(i, _)| (old.key(i), old.value(i)))
    }

    /// The pending writes (keys and values back to back), emptied.
    pub fn take(&mut self) -> (Vec<u8>, Vec<u8>) {
        (
            std::mem::take(&mut self.keys),
            std::mem::take(&mut self.values),
        )
    }

    /// Elements written so far (changed or new).
    pub fn written(&self) -> usize {
        self.written
    }

    /// The distinct keys [`Converge::put`] wanted: what the map holds once the stale rows are
    /// deleted. Not the number of puts: an IP that is both a Service's external and
    /// load-balancer IP is one frontend key put twice, and the map holds it once.
    pub fn wanted(&self) -> usize {
        self.put_old.iter().filter(|put| **put).count() + self.put_new.len()
    }

    /// The keys the map holds that no [`Converge::put`] wanted.
    pub fn stale(&self) -> impl Iterator<Item = &'a [u8]> + '_ {
        let old = self.old;
        self.seen
            .iter()
            .enumerate()
            .filter(|(_, seen)| !**seen)
            .map(move |(i, _)| old.key(i))
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
/// that readers never see a frontend whose service is incomplete: overflow slots and members
/// are written first, then frontends switch; stale frontends go before the slots they pointed
/// at. A frontend whose endpoint count shrinks is written before its extra slots are deleted
/// (they come last), and one that grows has its new slots written before the count.
/// Steps without rows are left out.
pub fn steps<'a>(old: &'a Entries, new: &'a Entries) -> Vec<Step<'a>> {
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
    // A map missing from one side is empty there: nothing to write from it or delete in it.
    for m in [MapId::Members, MapId::Slots, MapId::Frontends] {
        if let Some(n) = new.0.get(&m) {
            push(
                m,
                Kind::Upsert,
                n,
                unmatched(n, old.0.get(&m), |a, b| a == b),
            );
        }
    }
    for m in [MapId::Frontends, MapId::Slots, MapId::Members] {
        if let Some(o) = old.0.get(&m) {
            push(m, Kind::Delete, o, unmatched(o, new.0.get(&m), |_, _| true));
        }
    }
    out
}

/// The rows of `from` with no counterpart in `other` (both sorted by key, one merge walk): a
/// row whose key `other` lacks, or whose value `same(from's, other's)` rejects.
fn unmatched(from: &Table, other: Option<&Table>, same: impl Fn(&[u8], &[u8]) -> bool) -> Vec<u32> {
    let mut rows = Vec::new();
    let mut j = 0;
    for i in 0..from.len() {
        let k = from.key(i);
        let matched = other.is_some_and(|o| {
            while j < o.len() && o.key(j) < k {
                j += 1;
            }
            j < o.len() && o.key(j) == k && same(from.value(i), o.value(j))
        });
        if !matched {
            rows.push(u32::try_from(i).unwrap_or(u32::MAX));
        }
    }
    rows
}

/// [`steps`] as single operations, in order (tests and logs).
pub fn ops<'a>(old: &'a Entries, new: &'a Entries) -> Vec<Op<'a>> {
    steps(old, new)
        .iter()
        .flat_map(|s| s.ops().collect::<Vec<_>>())
        .collect()
}

/// Service ids: one per (port, scope), kept while the group exists so that a change of
/// endpoints rewrites overflow slots in place and affinity entries stay valid.
#[derive(Debug, Default)]
pub struct Ids {
    /// Each group's id and the generation ([`Ids::begin`]) that last assigned it.
    by_group: HashMap<(PortKey, Scope), (u32, u64)>,
    used: HashSet<u32>,
    free: Vec<u32>,
    next: u32,
    generation: u64,
}

impl Ids {
    /// The id of a group, if it has one.
    pub fn get(&self, port: &PortKey, scope: Scope) -> Option<u32> {
        self.by_group.get(&(port.clone(), scope)).map(|(id, _)| *id)
    }

    /// The id of a group, allocated if new; `preferred` (the id the maps already hold for it,
    /// after a restart) is taken when no other group has it.
    pub fn assign(&mut self, port: &PortKey, scope: Scope, preferred: Option<u32>) -> u32 {
        let generation = self.generation;
        if let Some((id, seen)) = self.by_group.get_mut(&(port.clone(), scope)) {
            *seen = generation;
            return *id;
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
        self.by_group
            .insert((port.clone(), scope), (id, generation));
        self.used.insert(id);
        id
    }

    fn in_use(&self, id: u32) -> bool {
        self.used.contains(&id)
    }

    /// Starts a full sync: the groups it [`Ids::assign`]s keep their ids, [`Ids::sweep`]
    /// releases the others. (In place, rather than a second map of every id.)
    pub fn begin(&mut self) {
        self.generation = self.generation.wrapping_add(1);
    }

    /// Releases the ids of the groups not assigned since [`Ids::begin`].
    pub fn sweep(&mut self) {
        let generation = self.generation;
        let mut gone = Vec::new();
        self.by_group.retain(|_, (id, seen)| {
            let keep = *seen == generation;
            if !keep {
                gone.push(*id);
            }
            keep
        });
        for id in gone {
            self.used.remove(&id);
            self.free.push(id);
        }
    }

    /// Releases a group's id (reusable by later syncs).
    pub fn release(&mut self, port: &PortKey, scope: Scope) {
        if let Some((id, _)) = self.by_group.remove(&(port.clone(), scope)) {
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
