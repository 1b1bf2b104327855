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

/// One map operation, borrowing its bytes from the states it was computed from (a cold sync
/// at 30k Services has ~400k of them: copies would double the peak memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op<'a> {
    /// Insert or replace.
    Upsert(MapId, &'a [u8], &'a [u8]),
    /// Delete (absent is fine).
    Delete(MapId, &'a [u8]),
}

/// Map contents: per map, key → value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entries(pub BTreeMap<MapId, BTreeMap<Vec<u8>, Vec<u8>>>);

impl Entries {
    fn put(&mut self, map: MapId, key: &[u8], value: &[u8]) {
        self.0
            .entry(map)
            .or_default()
            .insert(key.to_vec(), value.to_vec());
    }

    /// Adds the entries of `group` under service id `id` (`proto`: the IP protocol number).
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
            self.put(MapId::Members, &layout::member_key(id, *ep), &[1]);
        }
    }

    /// Number of entries over all maps.
    pub fn len(&self) -> usize {
        self.0.values().map(BTreeMap::len).sum()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The operations that take the maps from `old` to `new`, ordered so that readers never see a
/// frontend whose service is incomplete: services, slots and members are written first, then
/// frontends switch; stale frontends go before the services they pointed at. A service whose
/// endpoint count shrinks is written before its extra slots are deleted (they come last), and
/// one that grows has its new slots written before the count.
pub fn ops<'a>(old: &'a Entries, new: &'a Entries) -> Vec<Op<'a>> {
    static EMPTY: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    fn get(e: &Entries, m: MapId) -> &BTreeMap<Vec<u8>, Vec<u8>> {
        e.0.get(&m).unwrap_or(&EMPTY)
    }
    let mut out = Vec::new();
    let upserts = |m: MapId, out: &mut Vec<Op<'a>>| {
        let (o, n) = (get(old, m), get(new, m));
        for (k, v) in n {
            if o.get(k) != Some(v) {
                out.push(Op::Upsert(m, k, v));
            }
        }
    };
    let deletes = |m: MapId, out: &mut Vec<Op<'a>>| {
        let (o, n) = (get(old, m), get(new, m));
        for k in o.keys() {
            if !n.contains_key(k) {
                out.push(Op::Delete(m, k));
            }
        }
    };
    upserts(MapId::Members, &mut out);
    upserts(MapId::Slots, &mut out);
    upserts(MapId::Services, &mut out);
    upserts(MapId::Frontends, &mut out);
    deletes(MapId::Frontends, &mut out);
    deletes(MapId::Services, &mut out);
    deletes(MapId::Slots, &mut out);
    deletes(MapId::Members, &mut out);
    out
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
