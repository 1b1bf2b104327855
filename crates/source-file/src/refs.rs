//! What the model has from one manifest, and deletions waiting for the manifest to be quiet.
//!
//! A writer that does not rename atomically (a shell loop, `helm template … > file`) leaves
//! the file readable part of the way: a version that lacks objects the last one had may be a
//! write in progress rather than an edit. Deleting them would tear down working Services until
//! the rest arrives, so the sources apply what such a version adds or changes at once and
//! delete what it lacks only once the file has been unchanged for [`DELETE_QUIET`]. Only a
//! version written in place (the same file, by inode, as the last good read) is held: a file
//! replaced atomically is whole.

use std::collections::BTreeSet;
use std::time::Duration;

use kpng_model::{Kind, ObjectRef};

use crate::watch::Fingerprint;

/// How long a version that lacks objects must stay unchanged before they are deleted. Longer
/// than the pauses of a writer that writes a file in parts (1.5 s was seen between two parts),
/// short beside a person's edit; a writer that renames atomically never waits.
pub const DELETE_QUIET: Duration = Duration::from_secs(2);

/// The objects of one file, packed into one allocation (`kind` `\0` `namespace` `\0` `name`
/// `\n` each): read only when the file changes, and at 30k files a list of [`ObjectRef`]s
/// (each two shared strings) would cost ~200 bytes per file more.
#[derive(Default)]
pub(crate) struct PackedRefs(Box<str>);

impl PackedRefs {
    pub(crate) fn pack(refs: &[ObjectRef]) -> PackedRefs {
        let mut text = String::new();
        for r in refs {
            let kind = Kind::ALL
                .iter()
                .position(|k| *k == r.kind)
                .unwrap_or_default();
            text.push_str(&format!("{kind}\0{}\0{}\n", r.namespace, r.name));
        }
        PackedRefs(text.into_boxed_str())
    }

    pub(crate) fn unpack(&self) -> Vec<ObjectRef> {
        self.lines().filter_map(PackedRefs::parse_line).collect()
    }

    /// One packed line per object: equal lines are the same object.
    pub(crate) fn lines(&self) -> std::str::Lines<'_> {
        self.0.lines()
    }

    /// The object of one of [`PackedRefs::lines`].
    pub(crate) fn parse_line(line: &str) -> Option<ObjectRef> {
        let mut parts = line.split('\0');
        let kind = *Kind::ALL.get(parts.next()?.parse::<usize>().ok()?)?;
        Some(ObjectRef {
            kind,
            namespace: parts.next()?.into(),
            name: parts.next()?.into(),
        })
    }

    /// These refs without `gone`.
    pub(crate) fn without(&self, gone: &[ObjectRef]) -> PackedRefs {
        let gone: BTreeSet<&ObjectRef> = gone.iter().collect();
        let kept: Vec<ObjectRef> = self
            .unpack()
            .into_iter()
            .filter(|r| !gone.contains(r))
            .collect();
        PackedRefs::pack(&kept)
    }

    /// Those of these refs that `now` does not have, in order.
    pub(crate) fn gone_from(&self, now: &[ObjectRef]) -> Vec<ObjectRef> {
        let now: BTreeSet<&ObjectRef> = now.iter().collect();
        self.unpack()
            .into_iter()
            .filter(|r| !now.contains(r))
            .collect()
    }
}

/// Objects a version of a manifest no longer has, deleted at `due` if the manifest is then
/// still that version.
#[derive(Debug)]
pub(crate) struct Held {
    /// The objects to delete.
    pub(crate) gone: Vec<ObjectRef>,
    /// The manifest's identity when that version was read.
    pub(crate) seen: Option<Fingerprint>,
    /// When they are deleted, unless the manifest changed.
    pub(crate) due: tokio::time::Instant,
}

impl Held {
    /// `gone`, due [`DELETE_QUIET`] from now.
    pub(crate) fn new(gone: Vec<ObjectRef>, seen: Option<Fingerprint>) -> Held {
        Held {
            gone,
            seen,
            due: tokio::time::Instant::now() + DELETE_QUIET,
        }
    }

    /// The manifest was written again with the same text: the quiet starts over.
    pub(crate) fn rewritten(&mut self, seen: Option<Fingerprint>) {
        if self.seen != seen {
            self.seen = seen;
            self.due = tokio::time::Instant::now() + DELETE_QUIET;
        }
    }
}

/// Waits until `due`, or forever without one (a `select!` branch that is off).
pub(crate) async fn until(due: Option<tokio::time::Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_refs_round_trip() {
        let refs: Vec<ObjectRef> = [
            (Kind::Service, "ns", "web"),
            (Kind::EndpointSlice, "ns", "web-abc12"),
            (Kind::Node, "", "node1"),
            (Kind::ServiceCidr, "", "kubernetes"),
        ]
        .into_iter()
        .map(|(kind, namespace, name)| ObjectRef {
            kind,
            namespace: namespace.into(),
            name: name.into(),
        })
        .collect();
        assert_eq!(PackedRefs::pack(&refs).unpack(), refs);
        assert!(PackedRefs::default().unpack().is_empty());
    }

    #[test]
    fn what_a_version_no_longer_has() {
        let r = |name: &str| ObjectRef {
            kind: Kind::Service,
            namespace: "ns".into(),
            name: name.into(),
        };
        let before = PackedRefs::pack(&[r("a"), r("b"), r("c")]);
        assert_eq!(before.gone_from(&[r("a"), r("d")]), [r("b"), r("c")]);
        assert_eq!(before.without(&[r("b")]).unpack(), [r("a"), r("c")]);
    }
}
