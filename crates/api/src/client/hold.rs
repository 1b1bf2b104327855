//! A node does not let a new brain session's first state empty it.
//!
//! Why: a brain whose input is empty or wrong (an empty manifest directory, a file source
//! whose volume did not mount, a kubeconfig for another cluster) serves that state as
//! complete, and every node connected to it would delete all its rules while both sides
//! report ok: one bad brain input would take down the whole cluster's Service traffic. A
//! real cluster always has Services (the API server's `default/kubernetes`), so the first
//! state of a session holding none, sent to a node that programs Services (from its earlier
//! session, or the rules an earlier kpng left that its backend adopted at start), is held:
//! the rules stay as they are, and the held state goes through, merged with the later ones as
//! one diff, once the brain's state holds a Service again. Within a session, once a state was
//! applied, the Services going down to none is the cluster emptying, and is applied.

use std::collections::BTreeMap;

use kpng_model::{ServiceKey, ServicePort};

use super::RemoteUpdate;

/// What the node programs before the first state of a session, as far as this client knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Programmed {
    /// Services the client gave the runner (they are programmed).
    Services(usize),
    /// The backend adopted rules an earlier kpng left in the kernel at start, and nothing was
    /// applied since: how many Services they hold is not known here.
    EarlierRules,
    /// Nothing.
    Nothing,
}

/// What to do with a complete change set ([`EmptyStateHold::decide`]).
#[derive(Debug, PartialEq)]
pub enum Verdict {
    /// Give it to the runner (a held state merged in when one was held).
    Apply(RemoteUpdate),
    /// Keep it: it would empty a node that programs Services. `first`: the hold begins now
    /// (warn); else it goes on (a later empty change set, another session's empty replay).
    Hold {
        /// The hold begins with this change set.
        first: bool,
        /// What the node keeps programmed.
        keeping: Programmed,
    },
}

/// The node's guard against a new session's empty first state (see the module's doc).
#[derive(Debug)]
pub struct EmptyStateHold {
    /// `--api-accept-empty-state`: apply such a state anyway.
    accept_empty: bool,
    /// What the runner programs as far as this client knows (while a state is held: what it
    /// programmed before).
    programmed: Programmed,
    /// The state held, with every later change set merged into it.
    held: Option<RemoteUpdate>,
}

impl EmptyStateHold {
    /// A guard for a node that programs `programmed` at start ([`Programmed::EarlierRules`]
    /// when its backend found an earlier kpng's rules); `accept_empty` turns it off.
    pub fn new(programmed: Programmed, accept_empty: bool) -> EmptyStateHold {
        EmptyStateHold {
            accept_empty,
            programmed,
            held: None,
        }
    }

    /// Whether a state is held now.
    pub fn holding(&self) -> bool {
        self.held.is_some()
    }

    /// What to do with `update`, a complete change set after which the brain's state for this
    /// node holds `services_now` Services.
    pub fn decide(&mut self, update: RemoteUpdate, services_now: usize) -> Verdict {
        if let Some(held) = self.held.take() {
            let merged = merge(held, update);
            if services_now == 0 {
                self.held = Some(merged);
                return Verdict::Hold {
                    first: false,
                    keeping: self.programmed,
                };
            }
            self.programmed = Programmed::Services(services_now);
            return Verdict::Apply(merged);
        }
        let keeps_something =
            self.programmed != Programmed::Nothing && self.programmed != Programmed::Services(0);
        if update.replay && services_now == 0 && keeps_something && !self.accept_empty {
            self.held = Some(update);
            return Verdict::Hold {
                first: true,
                keeping: self.programmed,
            };
        }
        self.programmed = Programmed::Services(services_now);
        Verdict::Apply(update)
    }
}

/// `later` applied on top of `held`: one update with the net effect of both.
fn merge(held: RemoteUpdate, later: RemoteUpdate) -> RemoteUpdate {
    let mut services: BTreeMap<ServiceKey, Vec<ServicePort>> = held.services.into_iter().collect();
    services.extend(later.services);
    let mut service_changes = held.service_changes;
    for key in later.service_changes {
        if !service_changes.contains(&key) {
            service_changes.push(key);
        }
    }
    RemoteUpdate {
        node: later.node.or(held.node),
        service_cidrs: later.service_cidrs.or(held.service_cidrs),
        services: services.into_iter().collect(),
        service_changes,
        endpoint_changes: held.endpoint_changes + later.endpoint_changes,
        replay: held.replay || later.replay,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpng_model::{Family, PortKey, Protocol};

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

    /// A change set: `replay` or not; Services set (`+name`) or gone (`-name`).
    fn update(replay: bool, services: &[&str]) -> RemoteUpdate {
        RemoteUpdate {
            replay,
            services: services
                .iter()
                .map(|s| {
                    let (sign, name) = s.split_at(1);
                    let ports = if sign == "+" {
                        vec![port(name)]
                    } else {
                        Vec::new()
                    };
                    (ServiceKey::new("ns", name), ports)
                })
                .collect(),
            ..RemoteUpdate::default()
        }
    }

    /// One step: the change set, the brain's Services after it, and what is expected:
    /// `None` held (`Some(first)`), or applied with these Services' keys set/gone.
    struct Step {
        update: RemoteUpdate,
        services_now: usize,
        /// `Err(first)`: held; `Ok(keys)`: applied with these keys (`+a`, `-b`).
        want: Result<&'static [&'static str], bool>,
    }

    fn step(
        replay: bool,
        services: &[&str],
        services_now: usize,
        want: Result<&'static [&'static str], bool>,
    ) -> Step {
        Step {
            update: update(replay, services),
            services_now,
            want,
        }
    }

    fn keys(update: &RemoteUpdate) -> Vec<String> {
        update
            .services
            .iter()
            .map(|(k, ports)| format!("{}{}", if ports.is_empty() { "-" } else { "+" }, k.name))
            .collect()
    }

    #[test]
    fn an_empty_first_state_is_held_until_a_service_comes() {
        use Programmed::*;
        let cases: Vec<(&str, Programmed, bool, Vec<Step>)> = vec![
            (
                "a node that programs Services keeps them at an empty replay, then takes the \
                 held state and the next one as one diff",
                Services(2),
                false,
                vec![
                    step(true, &["-a", "-b"], 0, Err(true)),
                    step(false, &["+c"], 1, Ok(&["-a", "-b", "+c"])),
                ],
            ),
            (
                "the adopted rules of an earlier kpng are kept the same way",
                EarlierRules,
                false,
                vec![
                    step(true, &[], 0, Err(true)),
                    step(false, &["+a"], 1, Ok(&["+a"])),
                ],
            ),
            (
                "a hold goes on through empty change sets and another session's empty replay, \
                 warned once",
                Services(1),
                false,
                vec![
                    step(true, &["-a"], 0, Err(true)),
                    step(false, &[], 0, Err(false)),
                    step(true, &[], 0, Err(false)),
                    step(true, &["+a"], 1, Ok(&["+a"])),
                ],
            ),
            (
                "within a session, once a state was applied, going down to none applies",
                Services(0),
                false,
                vec![
                    step(true, &["+a"], 1, Ok(&["+a"])),
                    step(false, &["-a"], 0, Ok(&["-a"])),
                ],
            ),
            (
                "a node that programs nothing applies an empty state",
                Nothing,
                false,
                vec![step(true, &[], 0, Ok(&[]))],
            ),
            (
                "--api-accept-empty-state applies it",
                Services(3),
                true,
                vec![step(true, &["-a", "-b", "-c"], 0, Ok(&["-a", "-b", "-c"]))],
            ),
            (
                "a replay holding a Service applies at once",
                EarlierRules,
                false,
                vec![step(true, &["+a"], 1, Ok(&["+a"]))],
            ),
            (
                "after a session emptied the node, the next empty replay applies",
                Services(1),
                false,
                vec![
                    step(true, &["+a"], 1, Ok(&["+a"])),
                    step(false, &["-a"], 0, Ok(&["-a"])),
                    step(true, &[], 0, Ok(&[])),
                ],
            ),
            (
                "a Service set then deleted while held ends deleted",
                Services(1),
                false,
                vec![
                    step(true, &["-a"], 0, Err(true)),
                    step(false, &["+b"], 1, Ok(&["-a", "+b"])),
                    step(true, &["-b"], 0, Err(true)),
                    step(false, &["+b", "+c"], 2, Ok(&["+b", "+c"])),
                ],
            ),
        ];
        for (what, programmed, accept, steps) in cases {
            let mut hold = EmptyStateHold::new(programmed, accept);
            for (i, s) in steps.into_iter().enumerate() {
                let got = hold.decide(s.update, s.services_now);
                match (s.want, got) {
                    (Err(first), Verdict::Hold { first: got, .. }) => {
                        assert_eq!(got, first, "{what}: step {i}: first");
                        assert!(hold.holding(), "{what}: step {i}");
                    }
                    (Ok(want), Verdict::Apply(update)) => {
                        assert_eq!(keys(&update), want, "{what}: step {i}");
                        assert!(!hold.holding(), "{what}: step {i}");
                    }
                    (want, got) => panic!("{what}: step {i}: want {want:?}, got {got:?}"),
                }
            }
        }
    }
}
