#![allow(clippy::unwrap_used)]

use kpng_model::Protocol;

use super::*;

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

fn change(store: &mut EntryStore, owner: OwnerId, old: &[Entry], new: &[Entry]) -> Vec<Op> {
    let mut ops = Vec::new();
    store.change(owner, old, new, &mut ops);
    ops
}

#[test]
fn only_what_changed_becomes_an_operation() {
    let mut s = EntryStore::new();
    let a = [vip(1, Action::Redirect(41000)), vip(2, Action::Refuse)];
    assert_eq!(
        change(&mut s, 1, &[], &a),
        vec![Op::Add(a[0].clone()), Op::Add(a[1].clone())]
    );
    assert_eq!(change(&mut s, 1, &a, &a), vec![], "no change, no operation");
    let b = [
        vip(1, Action::Redirect(41000)),
        vip(2, Action::Redirect(41001)),
    ];
    assert_eq!(
        change(&mut s, 1, &a, &b),
        vec![Op::Delete(a[1].clone()), Op::Add(b[1].clone())],
        "a new action is a delete then an add"
    );
    assert_eq!(
        change(&mut s, 1, &b, &[]),
        vec![Op::Delete(b[0].clone()), Op::Delete(b[1].clone())]
    );
    assert!(s.is_empty());
}

#[test]
fn deletes_come_before_adds() {
    let mut s = EntryStore::new();
    let old = [vip(1, Action::Redirect(41000)), vip(3, Action::Drop)];
    change(&mut s, 1, &[], &old);
    let new = [vip(1, Action::Refuse), vip(2, Action::Redirect(41000))];
    let ops = change(&mut s, 1, &old, &new);
    let first_add = ops.iter().position(|o| matches!(o, Op::Add(_))).unwrap();
    assert!(
        ops[first_add..].iter().all(|o| matches!(o, Op::Add(_))),
        "{ops:?}"
    );
    assert_eq!(ops.len(), 4, "{ops:?}");
}

#[test]
fn a_key_claimed_twice_goes_to_the_lowest_owner_and_passes_on_without_a_hole() {
    let mut s = EntryStore::new();
    let mine = [vip(1, Action::Redirect(41000))];
    let theirs = [vip(1, Action::Redirect(42000))];
    assert_eq!(
        change(&mut s, 2, &[], &theirs),
        vec![Op::Add(theirs[0].clone())]
    );
    assert_eq!(
        change(&mut s, 1, &[], &mine),
        vec![Op::Delete(theirs[0].clone()), Op::Add(mine[0].clone())],
        "the lower owner takes over"
    );
    assert_eq!(
        change(&mut s, 2, &theirs, &[]),
        vec![],
        "the loser leaving changes nothing"
    );
    assert_eq!(change(&mut s, 2, &[], &theirs), vec![]);
    assert_eq!(
        change(&mut s, 1, &mine, &[]),
        vec![Op::Delete(mine[0].clone()), Op::Add(theirs[0].clone())],
        "the other owner's entry takes over when the winner leaves"
    );
    assert_eq!(s.entries(), theirs.to_vec());
}
