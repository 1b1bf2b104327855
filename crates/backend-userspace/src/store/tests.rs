#![allow(clippy::unwrap_used)]

use kpng_model::Protocol;

use super::*;
use crate::entries::{Action, EntryKey};

fn vip(last: u8, action: Action) -> Entry {
    Entry {
        key: EntryKey::Vip {
            ip: [10, 96, 0, last].into(),
            protocol: Protocol::Tcp,
            port: 80,
        },
        action,
    }
}

/// The store with what each owner last claimed, resolving other owners' entries from it as the
/// backend does from its ports.
#[derive(Default)]
struct Tracked {
    store: EntryStore,
    given: std::collections::HashMap<OwnerId, Vec<Entry>>,
}

impl Tracked {
    fn change(&mut self, owner: OwnerId, old: &[Entry], new: &[Entry]) -> Vec<Op> {
        self.given.remove(&owner);
        let others = self.given.clone();
        let resolve = move |o: OwnerId, e: &Entry| {
            others
                .get(&o)
                .and_then(|v| v.iter().find(|x| x.key == e.key).cloned())
        };
        let mut ops = Vec::new();
        super::change(&mut self.store, owner, old, new, &mut ops, &resolve);
        self.given.insert(owner, new.to_vec());
        ops
    }
}

#[test]
fn only_what_changed_becomes_an_operation() {
    let mut s = Tracked::default();
    let a = [vip(1, Action::Redirect(41000)), vip(2, Action::Refuse)];
    assert_eq!(
        s.change(1, &[], &a),
        vec![Op::Add(a[0].clone()), Op::Add(a[1].clone())]
    );
    assert_eq!(s.change(1, &a, &a), vec![], "no change, no operation");
    let b = [
        vip(1, Action::Redirect(41000)),
        vip(2, Action::Redirect(41001)),
    ];
    assert_eq!(
        s.change(1, &a, &b),
        vec![Op::Delete(a[1].clone()), Op::Add(b[1].clone())],
        "a new action is a delete then an add"
    );
    assert_eq!(
        s.change(1, &b, &[]),
        vec![Op::Delete(b[0].clone()), Op::Delete(b[1].clone())]
    );
    assert!(s.store.is_empty());
}

#[test]
fn deletes_come_before_adds() {
    let mut s = Tracked::default();
    let old = [vip(1, Action::Redirect(41000)), vip(3, Action::Drop)];
    s.change(1, &[], &old);
    let new = [vip(1, Action::Refuse), vip(2, Action::Redirect(41000))];
    let ops = s.change(1, &old, &new);
    let first_add = ops.iter().position(|o| matches!(o, Op::Add(_))).unwrap();
    assert!(
        ops[first_add..].iter().all(|o| matches!(o, Op::Add(_))),
        "{ops:?}"
    );
    assert_eq!(ops.len(), 4, "{ops:?}");
}

#[test]
fn a_key_claimed_twice_goes_to_the_lowest_owner_and_passes_on_without_a_hole() {
    let mut s = Tracked::default();
    let mine = [vip(1, Action::Redirect(41000))];
    let theirs = [vip(1, Action::Redirect(42000))];
    assert_eq!(s.change(2, &[], &theirs), vec![Op::Add(theirs[0].clone())]);
    assert_eq!(
        s.change(1, &[], &mine),
        vec![Op::Delete(theirs[0].clone()), Op::Add(mine[0].clone())],
        "the lower owner takes over"
    );
    assert_eq!(
        s.change(2, &theirs, &[]),
        vec![],
        "the loser leaving changes nothing"
    );
    assert_eq!(s.change(2, &[], &theirs), vec![]);
    assert_eq!(
        s.change(1, &mine, &[]),
        vec![Op::Delete(mine[0].clone()), Op::Add(theirs[0].clone())],
        "the other owner's entry takes over when the winner leaves"
    );
    assert_eq!(s.store.len(), 1, "one key, held for the other owner");
}
