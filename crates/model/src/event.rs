//! The one event vocabulary every source speaks.

use std::time::SystemTime;

use crate::key::Name;
use crate::records::{ConversionError, NodeInfo, ServiceCidrInfo, ServiceInfo, SliceInfo};

/// The kinds of objects the model understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// core/v1 Service.
    Service,
    /// discovery/v1 EndpointSlice.
    EndpointSlice,
    /// core/v1 Node (only this node's object matters).
    Node,
    /// networking/v1 ServiceCIDR: the ranges ClusterIPs are allocated from, so that traffic to
    /// an unallocated ClusterIP can be dropped.
    ServiceCidr,
}

impl Kind {
    /// Every kind, in the order sources list them: what a source that sees the whole cluster
    /// (a manifest file) is complete for.
    pub const ALL: [Kind; 4] = [
        Kind::Service,
        Kind::EndpointSlice,
        Kind::Node,
        Kind::ServiceCidr,
    ];

    /// This kind's place in [`Kind::ALL`].
    fn index(self) -> usize {
        match self {
            Kind::Service => 0,
            Kind::EndpointSlice => 1,
            Kind::Node => 2,
            Kind::ServiceCidr => 3,
        }
    }

    /// The Kubernetes `kind` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Node => "Node",
            Kind::ServiceCidr => "ServiceCIDR",
        }
    }
}

/// Objects accepted by one apply, per kind: a list (a file's snapshot, a relist) carries every
/// kind at once, and `kpng_objects_applied_total{kind}` counts each under its own.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AppliedCounts([usize; 4]);

impl AppliedCounts {
    /// Counts one accepted object of this kind.
    pub fn add(&mut self, kind: Kind) {
        self.0[kind.index()] += 1;
    }

    /// How many objects of this kind were accepted.
    pub fn of(&self, kind: Kind) -> usize {
        self.0[kind.index()]
    }

    /// How many objects were accepted, every kind together.
    pub fn total(&self) -> usize {
        self.0.iter().sum()
    }

    /// The kinds with at least one accepted object, and their counts.
    pub fn iter(&self) -> impl Iterator<Item = (Kind, usize)> + '_ {
        Kind::ALL
            .into_iter()
            .map(|k| (k, self.of(k)))
            .filter(|(_, n)| *n > 0)
    }
}

/// An object a source observed, already converted to the model's record (`kpng-k8s` does
/// that in the source), or the reason it could not be.
#[derive(Debug, Clone)]
pub enum Object {
    /// A Service.
    Service(Box<ServiceInfo>),
    /// An EndpointSlice, with its `endpoints.kubernetes.io/last-change-trigger-time`: network
    /// programming latency is measured from it once the change is programmed.
    EndpointSlice {
        /// The slice.
        slice: Box<SliceInfo>,
        /// When the change this version reflects was triggered (the API server's clock).
        trigger_time: Option<SystemTime>,
    },
    /// A Node.
    Node(Box<NodeInfo>),
    /// A ServiceCIDR.
    ServiceCidr(Box<ServiceCidrInfo>),
    /// An object the source could not convert. The model counts it, keeps the object's last
    /// good version, and (in a list) treats it as still present.
    Rejected(Box<ConversionError>),
}

impl Object {
    /// The object's kind.
    pub fn kind(&self) -> Kind {
        match self {
            Object::Service(_) => Kind::Service,
            Object::EndpointSlice { .. } => Kind::EndpointSlice,
            Object::Node(_) => Kind::Node,
            Object::ServiceCidr(_) => Kind::ServiceCidr,
            Object::Rejected(e) => e.object.kind,
        }
    }

    /// The Service this object concerns: a Service's own key, an EndpointSlice's owner, a
    /// rejected object's [`ConversionError::service`]. Lets a source that rejects an object
    /// it had converted (a duplicate, a cut-off end of a manifest) keep saying whose it is.
    pub fn service(&self) -> Option<crate::key::ServiceKey> {
        match self {
            Object::Service(s) => Some(s.key.clone()),
            Object::EndpointSlice { slice, .. } => slice.service.clone(),
            Object::Node(_) | Object::ServiceCidr(_) => None,
            Object::Rejected(e) => e.service.as_deref().cloned(),
        }
    }

    /// The reference (kind, namespace, name) naming this object in errors and deletes.
    pub fn reference(&self) -> ObjectRef {
        let (namespace, name): (Name, Name) = match self {
            Object::Service(s) => (s.key.namespace.clone(), s.key.name.clone()),
            Object::EndpointSlice { slice, .. } => (slice.namespace.clone(), slice.name.clone()),
            Object::Node(n) => (Name::default(), n.name.as_str().into()),
            Object::ServiceCidr(c) => (Name::default(), c.name.as_str().into()),
            Object::Rejected(e) => return e.object.clone(),
        };
        ObjectRef {
            kind: self.kind(),
            namespace,
            name,
        }
    }
}

/// Names an object: used for deletes and in every error message.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    /// The object's kind.
    pub kind: Kind,
    /// Its namespace (empty for cluster-scoped kinds such as Node).
    pub namespace: crate::key::Name,
    /// Its name.
    pub name: crate::key::Name,
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind.as_str(), self.name)
        } else {
            write!(f, "{} {}/{}", self.kind.as_str(), self.namespace, self.name)
        }
    }
}

/// What a source tells the model.
///
/// A relist (the file was edited, a watch restarted after `410 Gone`) is a [`Event::Replace`]:
/// the model swaps in the new set of objects at once and diffs it against the old, so a relist
/// never produces a transient teardown.
#[derive(Debug, Clone)]
pub enum Event {
    /// An object was created or updated.
    Apply(Object),
    /// An object was deleted.
    Delete(ObjectRef),
    /// Objects that changed together (one manifest file's): applied as one change, so that
    /// nothing downstream sees a moment between them (a Service without its EndpointSlice:
    /// a moment of REJECT on the nodes a brain feeds). The deleted and the applied objects
    /// are different ones.
    Changes {
        /// Objects deleted.
        deleted: Vec<ObjectRef>,
        /// Objects created or updated.
        applied: Vec<Object>,
    },
    /// The complete current set of objects of the given kinds; objects of these kinds that are
    /// not listed no longer exist.
    Replace {
        /// The kinds this list is complete for.
        kinds: Vec<Kind>,
        /// Every object of those kinds.
        objects: Vec<Object>,
    },
    /// The same as `Replace`, streamed: a complete list of these kinds begins, its objects
    /// follow as [`Event::ListItem`], and [`Event::ListDone`] with the same kinds ends it.
    /// Nothing changes in the snapshot until `ListDone`, so a relist never causes a transient
    /// teardown, and no event ever holds a whole cluster's objects at once.
    ///
    /// Lists of different kinds may be in progress at once and interleave (the `kube` source
    /// runs one watcher per kind, each relisting on its own); a `ListStart` for kinds whose list
    /// is still in progress abandons that list and starts over.
    ListStart {
        /// The kinds the list is complete for.
        kinds: Vec<Kind>,
    },
    /// One object of a list in progress (the one for its kind).
    ListItem(Object),
    /// The list of these kinds (as given to its `ListStart`) is complete.
    ListDone {
        /// The kinds of the list that is complete.
        kinds: Vec<Kind>,
    },
}
