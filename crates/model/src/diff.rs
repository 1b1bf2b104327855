//! What changed between two snapshots: the only thing a backend needs to do O(changes) work.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::key::{Family, PortKey, ServiceKey};
use crate::model::Snapshot;
use crate::service_port::ServicePort;

/// The before and after of one Service port. `old: None` is an addition, `new: None` a removal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The state the backend last received (or `None` if the port is new to it).
    pub old: Option<Arc<ServicePort>>,
    /// The state to program now (or `None` if the port is gone).
    pub new: Option<Arc<ServicePort>>,
}

/// A set of Service-port changes plus whether the node's own properties changed.
///
/// Diffs compose: [`Diff::merge`] folds a later diff into an earlier one so that a backend that
/// was busy (or rate limited) receives one diff covering everything since its last sync, with the
/// oldest `old` and the newest `new` of every port, and nothing for ports that changed back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff {
    /// Changed ports, ordered by key.
    pub changes: BTreeMap<PortKey, Change>,
    /// Node-level state the backends program changed: the node's IPs, zone or podCIDRs,
    /// whether NodePorts go to every local address ([`crate::NodeState::programs_as`]), or
    /// the cluster's Service CIDRs. Not the node's status alone (a deleted Node whose values
    /// are kept, a re-created one with the same values, eligibility): that is
    /// [`crate::ApplyOutcome::node_status_changed`], and no work for a backend.
    pub node_changed: bool,
    /// Which of those values changed, for the sync line (none named in a full diff, which
    /// describes everything as new).
    pub node_changes: crate::NodeChanges,
}

impl Diff {
    /// A diff that describes the whole snapshot as new: what a backend receives on its first
    /// sync and after a failure, so start-up and recovery take the same code path as any change.
    pub fn full(snapshot: &Snapshot) -> Diff {
        let changes = snapshot
            .ports
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    Change {
                        old: None,
                        new: Some(v.clone()),
                    },
                )
            })
            .collect();
        Diff {
            changes,
            node_changed: true,
            node_changes: crate::NodeChanges::default(),
        }
    }

    /// True when nothing changed.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty() && !self.node_changed
    }

    /// Records one port's transition, folding it into any earlier change of the same port.
    pub fn record(
        &mut self,
        key: PortKey,
        old: Option<Arc<ServicePort>>,
        new: Option<Arc<ServicePort>>,
    ) {
        use std::collections::btree_map::Entry;
        match self.changes.entry(key) {
            Entry::Vacant(e) => {
                if old != new {
                    e.insert(Change { old, new });
                }
            }
            Entry::Occupied(mut e) => {
                e.get_mut().new = new;
                if e.get().old == e.get().new {
                    e.remove();
                }
            }
        }
    }

    /// Folds a later diff into this one.
    pub fn merge(&mut self, later: Diff) {
        self.node_changed |= later.node_changed;
        self.node_changes.merge(later.node_changes);
        for (key, change) in later.changes {
            self.record(key, change.old, change.new);
        }
    }

    /// Ports that are new or changed, with their new state.
    pub fn upserted(&self) -> impl Iterator<Item = (&PortKey, &Arc<ServicePort>)> {
        self.changes
            .iter()
            .filter_map(|(k, c)| c.new.as_ref().map(|n| (k, n)))
    }

    /// Ports that are gone, with their last state.
    pub fn removed(&self) -> impl Iterator<Item = (&PortKey, &Arc<ServicePort>)> {
        self.changes
            .iter()
            .filter_map(|(k, c)| match (&c.old, &c.new) {
                (Some(old), None) => Some((k, old)),
                _ => None,
            })
    }
}

/// What one diff does, in the words of a log line: Service ports added, removed, changed in
/// their frontends (IPs, ports, policies, affinity), and changed only in their endpoints.
/// Why: "synced, 210001 operations" does not tell an operator whether an edit reached the
/// proxy; "1 Service port changed (default/web:http)" does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiffSummary {
    /// Ports new to the backend.
    pub added: usize,
    /// Ports gone.
    pub removed: usize,
    /// Ports whose frontend changed (and maybe their endpoints).
    pub frontend_changed: usize,
    /// Ports whose endpoints alone changed.
    pub endpoints_changed: usize,
    /// Whether node-level state the backends program (the node's IPs, zone, pod CIDRs,
    /// Service CIDRs …) changed.
    pub node_changed: bool,
    /// Which of them, named in the line.
    pub node_changes: crate::NodeChanges,
    /// The first Services the changes belong to, in key order, at most
    /// [`DiffSummary::NAMED`]: an operator reads which Service an edit reached.
    pub services: Vec<ServiceKey>,
    /// On a node with both families ([`DiffSummary::of_node`]), the family of each of
    /// `services` when the changes to it are all of one family (`None`: both), so that the line
    /// reads `1 removed (default/aff IPv4)` and not as the whole Service gone during a
    /// migration. Empty on a single-stack node: its line names no family but IPv6 ports'
    /// (as [`EndpointChanges::port`]).
    pub service_families: Vec<Option<Family>>,
    /// How many Services the changes belong to in all.
    pub service_count: usize,
    /// The first ports whose endpoints alone changed, each with what changed, at most
    /// [`DiffSummary::DETAILED`]: "with new endpoints" alone does not say which endpoint, nor
    /// whether one went or came back (a flapping readiness probe reads as any other change).
    pub endpoint_changes: Vec<EndpointChanges>,
}

/// What changed in the endpoints of one port, in the words of the sync line:
/// `default/web:80/TCP endpoints 2→1 (-10.244.1.2:8080)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointChanges {
    /// The port: `namespace/name:port/protocol`, ` IPv6` added for that family (and ` IPv4`
    /// for that one on a node with both families).
    pub port: String,
    /// How many endpoints the port used before and after.
    pub before: usize,
    /// See `before`.
    pub after: usize,
    /// The first changes, at most [`EndpointChanges::LISTED`]: `+IP:port` (now used),
    /// `-IP:port` (no longer used: gone, or not ready; ` still serving` when its slice says it
    /// serves, as a terminating endpoint does, or one another zone's hints keep), `IP:port
    /// ready→terminating` (used in both, its state changed).
    pub listed: Vec<String>,
    /// How many more changes there are.
    pub more: usize,
}

impl EndpointChanges {
    /// How many endpoint changes a port's account lists.
    pub const LISTED: usize = 3;

    /// What changed from `old` to `new`, two states of the same port (O(endpoints of the
    /// port); the summary does it for [`DiffSummary::DETAILED`] ports at most).
    /// An IPv4 port is not labelled: [`DiffSummary::of_node`] labels it on a dual-stack node.
    pub fn of(old: &ServicePort, new: &ServicePort) -> EndpointChanges {
        let used = |p: &ServicePort| -> BTreeMap<SocketAddr, &'static str> {
            p.cluster_endpoints
                .iter()
                .chain(&p.local_endpoints)
                .map(|e| {
                    let state = crate::inspect::condition_word(e.ready, e.serving, e.terminating);
                    (e.addr(), state)
                })
                .collect()
        };
        let (was, now) = (used(old), used(new));
        let mut out = EndpointChanges {
            port: port_words(new),
            before: was.len(),
            after: now.len(),
            ..EndpointChanges::default()
        };
        let mut note = |change: String| {
            if out.listed.len() < Self::LISTED {
                out.listed.push(change);
            } else {
                out.more += 1;
            }
        };
        for (addr, state) in &was {
            match now.get(addr) {
                None if new.serving_endpoints.binary_search(addr).is_ok() => {
                    note(format!("-{addr} still serving"));
                }
                None => note(format!("-{addr}")),
                Some(later) if later != state => note(format!("{addr} {state}→{later}")),
                Some(_) => {}
            }
        }
        for (addr, state) in &now {
            if !was.contains_key(addr) {
                match *state {
                    "ready" => note(format!("+{addr}")),
                    other => note(format!("+{addr} {other}")),
                }
            }
        }
        out
    }
}

/// A port as the sync line names it: `default/web:80/TCP` (` IPv6` added for that family;
/// ` IPv4` is added by [`DiffSummary::of_node`] on a dual-stack node).
fn port_words(port: &ServicePort) -> String {
    let family = match port.key.family {
        Family::V4 => "",
        Family::V6 => " IPv6",
    };
    format!(
        "{}:{}/{}{family}",
        port.key.service, port.port, port.key.protocol
    )
}

impl std::fmt::Display for EndpointChanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} endpoints {}→{}", self.port, self.before, self.after)?;
        if !self.listed.is_empty() {
            write!(f, " ({}", self.listed.join(", "))?;
            if self.more > 0 {
                write!(f, ", +{} more", self.more)?;
            }
            f.write_str(")")?;
        }
        Ok(())
    }
}

impl DiffSummary {
    /// How many Services a summary names.
    pub const NAMED: usize = 3;
    /// How many ports' endpoint changes a summary details ([`DiffSummary::endpoint_changes`]).
    pub const DETAILED: usize = 2;

    /// Counts a diff's changes (one pass; the ports of a Service are adjacent in key order),
    /// for a single-stack node: only IPv6 ports are labelled with their family.
    pub fn of(diff: &Diff) -> DiffSummary {
        DiffSummary::of_node(diff, &[], &[])
    }

    /// [`DiffSummary::of`] on a node whose backend serves `families`, and which programmed
    /// ports of the families `programmed` before this diff. When the node serves both and has
    /// ports of both (before or in this diff: a migration under way), the line labels the
    /// family of each change (`default/aff IPv4`, `default/aff:80/TCP IPv4 endpoints 2→0`), as
    /// `kpng status` rows do; an IPv4 cluster's nodes (whose nftables or iptables backend
    /// serves both families too) keep their lines unlabelled.
    pub fn of_node(diff: &Diff, families: &[Family], programmed: &[Family]) -> DiffSummary {
        // The families this diff has ports of, and whether each detailed change is IPv4's.
        let (mut v4_in_diff, mut v6_in_diff) = (false, false);
        let mut v4_changes = Vec::new();
        let mut s = DiffSummary {
            node_changed: diff.node_changed,
            node_changes: diff.node_changes,
            ..DiffSummary::default()
        };
        let mut last: Option<&ServiceKey> = None;
        for (key, change) in &diff.changes {
            match key.family {
                Family::V4 => v4_in_diff = true,
                Family::V6 => v6_in_diff = true,
            }
            if last != Some(&key.service) {
                s.service_count += 1;
                if s.services.len() < Self::NAMED {
                    s.services.push(key.service.clone());
                    s.service_families.push(Some(key.family));
                }
                last = Some(&key.service);
            } else if s.services.last() == Some(&key.service)
                && let Some(named) = s.service_families.last_mut()
                && *named != Some(key.family)
            {
                // Both families of this Service changed.
                *named = None;
            }
            match (&change.old, &change.new) {
                (None, Some(_)) => s.added += 1,
                (Some(_), None) => s.removed += 1,
                (Some(old), Some(new)) if old.same_frontend(new) => {
                    s.endpoints_changed += 1;
                    if s.endpoint_changes.len() < Self::DETAILED {
                        s.endpoint_changes.push(EndpointChanges::of(old, new));
                        v4_changes.push(key.family == Family::V4);
                    }
                }
                (Some(_), Some(_)) => s.frontend_changed += 1,
                (None, None) => {}
            }
        }
        let has = |family: Family, in_diff: bool| {
            families.contains(&family) && (in_diff || programmed.contains(&family))
        };
        if has(Family::V4, v4_in_diff) && has(Family::V6, v6_in_diff) {
            for (change, v4) in s.endpoint_changes.iter_mut().zip(v4_changes) {
                if v4 {
                    change.port.push_str(" IPv4");
                }
            }
        } else {
            s.service_families.clear();
        }
        s
    }
}

impl std::fmt::Display for DiffSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        for (n, what) in [
            (self.added, "added"),
            (self.removed, "removed"),
            (self.frontend_changed, "changed"),
            (self.endpoints_changed, "with new endpoints"),
        ] {
            if n > 0 {
                parts.push(format!("{n} {what}"));
            }
        }
        if parts.is_empty() {
            f.write_str("no Service port changed")?;
        } else {
            write!(f, "Service ports: {}", parts.join(", "))?;
            let names: Vec<String> = self
                .services
                .iter()
                .enumerate()
                .map(|(i, service)| match self.service_families.get(i) {
                    Some(Some(family)) => format!("{service} {}", family.label()),
                    _ => service.to_string(),
                })
                .collect();
            if !names.is_empty() {
                write!(f, " ({}", names.join(", "))?;
                match self.service_count.saturating_sub(names.len()) {
                    0 => {}
                    1 => f.write_str(" and 1 more Service")?,
                    more => write!(f, " and {more} more Services")?,
                }
                f.write_str(")")?;
            }
            for (i, change) in self.endpoint_changes.iter().enumerate() {
                f.write_str(if i == 0 { ": " } else { "; " })?;
                write!(f, "{change}")?;
            }
            match self
                .endpoints_changed
                .saturating_sub(self.endpoint_changes.len())
            {
                0 => {}
                _ if self.endpoint_changes.is_empty() => {}
                1 => f.write_str("; 1 more port with new endpoints")?,
                more => write!(f, "; {more} more ports with new endpoints")?,
            }
        }
        if self.node_changed {
            let named = self.node_changes.to_string();
            if named.is_empty() {
                f.write_str("; node or Service CIDRs changed")?;
            } else {
                write!(f, "; {named}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::key::{Family, Protocol, ServiceKey};
    use crate::service_port::Endpoint;

    fn port(name: &str) -> ServicePort {
        ServicePort::new(
            PortKey {
                service: ServiceKey::new("ns", name),
                port_name: "http".into(),
                protocol: Protocol::Tcp,
                family: Family::V4,
            },
            "10.96.0.1".parse().expect("ip"),
            80,
        )
    }

    #[test]
    fn a_summary_tells_endpoint_changes_from_frontend_changes() {
        let with_endpoint = |mut p: ServicePort| {
            p.cluster_endpoints = vec![Endpoint {
                ip: "10.244.0.5".parse().expect("ip"),
                port: 8080,
                is_local: false,
                ready: true,
                serving: true,
                terminating: false,
            }];
            p.has_any_endpoints = true;
            p
        };
        let with_node_port = |mut p: ServicePort| {
            p.node_port = Some(30080);
            p
        };
        let cases: [(&str, Option<ServicePort>, Option<ServicePort>, DiffSummary); 4] = [
            (
                "added",
                None,
                Some(port("a")),
                DiffSummary {
                    added: 1,
                    ..one_service("a")
                },
            ),
            (
                "removed",
                Some(port("a")),
                None,
                DiffSummary {
                    removed: 1,
                    ..one_service("a")
                },
            ),
            (
                "endpoints only",
                Some(port("a")),
                Some(with_endpoint(port("a"))),
                DiffSummary {
                    endpoints_changed: 1,
                    endpoint_changes: vec![EndpointChanges {
                        port: "ns/a:80/TCP".into(),
                        before: 0,
                        after: 1,
                        listed: vec!["+10.244.0.5:8080".into()],
                        more: 0,
                    }],
                    ..one_service("a")
                },
            ),
            (
                "a node port and endpoints",
                Some(port("a")),
                Some(with_node_port(with_endpoint(port("a")))),
                DiffSummary {
                    frontend_changed: 1,
                    ..one_service("a")
                },
            ),
        ];
        for (what, old, new, want) in cases {
            let mut diff = Diff::default();
            let key = old.as_ref().or(new.as_ref()).expect("a side").key.clone();
            diff.record(key, old.map(Arc::new), new.map(Arc::new));
            assert_eq!(DiffSummary::of(&diff), want, "{what}");
        }
        let text = DiffSummary {
            added: 2,
            endpoints_changed: 1,
            node_changed: true,
            ..DiffSummary::default()
        }
        .to_string();
        assert_eq!(
            text,
            "Service ports: 2 added, 1 with new endpoints; node or Service CIDRs changed"
        );
    }

    /// The sync line names which node-level values changed, not a catch-all: after a Node
    /// address change it said "node or Service CIDRs changed".
    #[test]
    fn the_summary_names_what_changed_on_the_node() {
        use crate::NodeChanges;
        let none = NodeChanges::default();
        for (what, changes, want) in [
            (
                "node IPs",
                NodeChanges { ips: true, ..none },
                "no Service port changed; node IPs changed",
            ),
            (
                "Service CIDRs",
                NodeChanges {
                    service_cidrs: true,
                    ..none
                },
                "no Service port changed; Service CIDRs changed",
            ),
            (
                "three",
                NodeChanges {
                    ips: true,
                    pod_cidrs: true,
                    zone: true,
                    ..none
                },
                "no Service port changed; node IPs, pod CIDRs and zone changed",
            ),
            (
                "the wait for node IPs given up",
                NodeChanges {
                    nodeports_on_all_local: Some(true),
                    ..none
                },
                "no Service port changed; NodePorts on every local address (no node IP)",
            ),
            (
                "an IP at last",
                NodeChanges {
                    ips: true,
                    nodeports_on_all_local: Some(false),
                    ..none
                },
                "no Service port changed; node IPs changed; NodePorts back on the node IPs",
            ),
        ] {
            let mut diff = Diff {
                node_changed: true,
                ..Diff::default()
            };
            // Two syncs' worth merged: named once.
            diff.merge(Diff {
                node_changed: true,
                node_changes: changes,
                ..Diff::default()
            });
            diff.merge(Diff {
                node_changed: true,
                node_changes: changes,
                ..Diff::default()
            });
            assert_eq!(DiffSummary::of(&diff).to_string(), want, "{what}");
        }
    }

    fn endpoint(ip: &str, ready: bool, terminating: bool) -> Endpoint {
        Endpoint {
            ip: ip.parse().expect("ip"),
            port: 8080,
            is_local: false,
            ready,
            serving: ready || terminating,
            terminating,
        }
    }

    /// `port("a")` using `used`, serving `serving` too (endpoints not used, still serving).
    fn using(used: &[Endpoint], serving: &[Endpoint]) -> ServicePort {
        let mut p = port("a");
        p.cluster_endpoints = used.to_vec();
        p.serving_endpoints = used.iter().chain(serving).map(Endpoint::addr).collect();
        p.serving_endpoints.sort();
        p.has_any_endpoints = !used.is_empty();
        p
    }

    /// The sync line names which endpoints changed and how, a few of them at most.
    /// (case, old state, new state, the line)
    #[test]
    fn a_summary_names_the_endpoints_that_changed() {
        let a = endpoint("10.244.1.1", true, false);
        let b = endpoint("10.244.1.2", true, false);
        let b_terminating = endpoint("10.244.1.2", false, true);
        let many: Vec<Endpoint> = (1..=5)
            .map(|i| endpoint(&format!("10.244.2.{i}"), true, false))
            .collect();
        let cases = [
            (
                "one became not ready",
                using(&[a.clone(), b.clone()], &[]),
                using(std::slice::from_ref(&a), &[]),
                "Service ports: 1 with new endpoints (ns/a): ns/a:80/TCP endpoints 2→1 \
                 (-10.244.1.2:8080)",
            ),
            (
                "one is terminating, still serving",
                using(&[a.clone(), b.clone()], &[]),
                using(
                    std::slice::from_ref(&a),
                    std::slice::from_ref(&b_terminating),
                ),
                "Service ports: 1 with new endpoints (ns/a): ns/a:80/TCP endpoints 2→1 \
                 (-10.244.1.2:8080 still serving)",
            ),
            (
                "one came back",
                using(std::slice::from_ref(&a), &[]),
                using(&[a.clone(), b.clone()], &[]),
                "Service ports: 1 with new endpoints (ns/a): ns/a:80/TCP endpoints 1→2 \
                 (+10.244.1.2:8080)",
            ),
            (
                "the last one used while terminating (fallback)",
                using(std::slice::from_ref(&b), &[]),
                using(std::slice::from_ref(&b_terminating), &[]),
                "Service ports: 1 with new endpoints (ns/a): ns/a:80/TCP endpoints 1→1 \
                 (10.244.1.2:8080 ready→terminating)",
            ),
            (
                "many: the first few",
                using(&[], &[]),
                using(&many, &[]),
                "Service ports: 1 with new endpoints (ns/a): ns/a:80/TCP endpoints 0→5 \
                 (+10.244.2.1:8080, +10.244.2.2:8080, +10.244.2.3:8080, +2 more)",
            ),
        ];
        for (case, old, new, want) in cases {
            let mut diff = Diff::default();
            diff.record(old.key.clone(), Some(Arc::new(old)), Some(Arc::new(new)));
            assert_eq!(DiffSummary::of(&diff).to_string(), want, "{case}");
        }
    }

    /// Thousands of Services whose endpoints changed still make one short line: two ports
    /// detailed, the rest counted.
    #[test]
    fn a_summary_of_many_endpoint_changes_stays_short() {
        let mut diff = Diff::default();
        for i in 0..5000 {
            let mut old = using(&[endpoint("10.244.1.1", true, false)], &[]);
            old.key.service = ServiceKey::new("ns", format!("s{i:04}"));
            let mut new = using(&[], &[]);
            new.key = old.key.clone();
            diff.record(old.key.clone(), Some(Arc::new(old)), Some(Arc::new(new)));
        }
        assert_eq!(
            DiffSummary::of(&diff).to_string(),
            "Service ports: 5000 with new endpoints (ns/s0000, ns/s0001, ns/s0002 and 4997 more \
             Services): ns/s0000:80/TCP endpoints 1→0 (-10.244.1.1:8080); ns/s0001:80/TCP \
             endpoints 1→0 (-10.244.1.1:8080); 4998 more ports with new endpoints"
        );
    }

    fn one_service(name: &str) -> DiffSummary {
        DiffSummary {
            services: vec![ServiceKey::new("ns", name)],
            service_count: 1,
            ..DiffSummary::default()
        }
    }

    /// The summary names the first Services the changes belong to, each once, and counts the
    /// rest.
    #[test]
    fn a_summary_names_the_first_services_and_counts_the_rest() {
        for (names, want) in [
            (&["a"][..], "Service ports: 1 added (ns/a)"),
            (
                &["a", "b", "c"][..],
                "Service ports: 3 added (ns/a, ns/b, ns/c)",
            ),
            (
                &["a", "b", "c", "d"][..],
                "Service ports: 4 added (ns/a, ns/b, ns/c and 1 more Service)",
            ),
            (
                &["e", "d", "c", "b", "a"][..],
                "Service ports: 5 added (ns/a, ns/b, ns/c and 2 more Services)",
            ),
        ] {
            let mut diff = Diff::default();
            for name in names {
                let p = port(name);
                diff.record(p.key.clone(), None, Some(Arc::new(p)));
            }
            assert_eq!(DiffSummary::of(&diff).to_string(), want);
        }
        // Two ports of one Service: one name.
        let mut diff = Diff::default();
        for p in [port("a"), {
            let mut other = port("a");
            other.key.port_name = "https".into();
            other
        }] {
            diff.record(p.key.clone(), None, Some(Arc::new(p)));
        }
        assert_eq!(
            DiffSummary::of(&diff).to_string(),
            "Service ports: 2 added (ns/a)"
        );
    }

    /// On a node with both families, the sync line labels the family of each change: an IPv4
    /// port removed or emptied during a migration to IPv6 read as the whole Service going
    /// down. A single-stack node's line (or an IPv4 cluster's, whose backend serves both
    /// families) stays as it was, IPv6 ports alone labelled.
    /// (case, the backend's families, the families programmed before, changes as (service,
    /// family, old endpoints, new endpoints; `None`: no port), the line)
    #[test]
    fn a_dual_stack_node_s_summary_names_the_family_of_each_change() {
        type Ips = Option<&'static [&'static str]>;
        type Case = (
            &'static str,
            &'static [Family],
            &'static [Family],
            Vec<(&'static str, Family, Ips, Ips)>,
            &'static str,
        );
        const BOTH: &[Family] = &[Family::V4, Family::V6];
        const V4: &[Family] = &[Family::V4];
        const TWO: &[&str] = &["10.244.1.2", "10.244.2.2"];
        const NONE: &[&str] = &[];
        const V6_TWO: &[&str] = &["fd00::1:2", "fd00::2:2"];
        let cases: Vec<Case> = vec![
            (
                "an IPv4 port removed",
                BOTH,
                BOTH,
                vec![("aff", Family::V4, Some(NONE), None)],
                "Service ports: 1 removed (ns/aff IPv4)",
            ),
            (
                "IPv4 endpoints gone",
                BOTH,
                BOTH,
                vec![("long", Family::V4, Some(TWO), Some(NONE))],
                "Service ports: 1 with new endpoints (ns/long IPv4): ns/long:80/TCP IPv4 \
                 endpoints 2→0 (-10.244.1.2:8080, -10.244.2.2:8080)",
            ),
            (
                "IPv6 endpoints came",
                BOTH,
                BOTH,
                vec![("aff", Family::V6, Some(NONE), Some(V6_TWO))],
                "Service ports: 1 with new endpoints (ns/aff IPv6): ns/aff:80/TCP IPv6 \
                 endpoints 0→2 (+[fd00::1:2]:8080, +[fd00::2:2]:8080)",
            ),
            (
                "both families of a Service removed: the whole Service, unlabelled",
                BOTH,
                BOTH,
                vec![
                    ("web", Family::V4, Some(NONE), None),
                    ("web", Family::V6, Some(NONE), None),
                ],
                "Service ports: 2 removed (ns/web)",
            ),
            (
                "one Service's IPv4, another's both",
                BOTH,
                BOTH,
                vec![
                    ("a", Family::V4, None, Some(NONE)),
                    ("b", Family::V4, None, Some(NONE)),
                    ("b", Family::V6, None, Some(NONE)),
                ],
                "Service ports: 3 added (ns/a IPv4, ns/b)",
            ),
            (
                "the first IPv6 port of an IPv4 cluster: labelled from this sync on",
                BOTH,
                V4,
                vec![
                    ("a", Family::V6, None, Some(NONE)),
                    ("long", Family::V4, Some(TWO), Some(NONE)),
                ],
                "Service ports: 1 added, 1 with new endpoints (ns/a IPv6, ns/long IPv4): \
                 ns/long:80/TCP IPv4 endpoints 2→0 (-10.244.1.2:8080, -10.244.2.2:8080)",
            ),
            (
                "an IPv4 cluster on a backend serving both families: unlabelled, as before",
                BOTH,
                V4,
                vec![("long", Family::V4, Some(TWO), Some(NONE))],
                "Service ports: 1 with new endpoints (ns/long): ns/long:80/TCP endpoints 2→0 \
                 (-10.244.1.2:8080, -10.244.2.2:8080)",
            ),
            (
                "a single-stack node: unlabelled, as before",
                V4,
                V4,
                vec![
                    ("long", Family::V4, Some(TWO), Some(NONE)),
                    ("v6", Family::V6, None, Some(NONE)),
                ],
                "Service ports: 1 added, 1 with new endpoints (ns/long, ns/v6): ns/long:80/TCP \
                 endpoints 2→0 (-10.244.1.2:8080, -10.244.2.2:8080)",
            ),
        ];
        let state = |name: &str, family: Family, ips: &[&str]| {
            let mut p = port(name);
            p.key.family = family;
            p.cluster_endpoints = ips.iter().map(|ip| endpoint(ip, true, false)).collect();
            p.has_any_endpoints = !ips.is_empty();
            Arc::new(p)
        };
        for (case, families, programmed, changes, want) in cases {
            let mut diff = Diff::default();
            for (name, family, old, new) in changes {
                let mut key = port(name).key;
                key.family = family;
                diff.record(
                    key,
                    old.map(|ips| state(name, family, ips)),
                    new.map(|ips| state(name, family, ips)),
                );
            }
            assert_eq!(
                DiffSummary::of_node(&diff, families, programmed).to_string(),
                want,
                "{case}"
            );
        }
    }
}
