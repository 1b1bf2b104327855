//! kpng's node-local model: what *this node* must do for every Service port.
//!
//! Sources convert Kubernetes objects (Services, EndpointSlices, Nodes, ServiceCIDRs) into
//! small, Kubernetes-free [`records`] (crate `kpng-k8s`) and hand them to [`Model::apply`] as
//! [`Event`]s. The model selects the endpoints
//! each Service port may use from this node (upstream kube-proxy's `CategorizeEndpoints`), and
//! returns a [`Diff`] naming only the Service ports that changed. Backends consume the diff plus a
//! read-only [`Snapshot`]; they never see a Kubernetes type.
//!
//! The crate is pure: no I/O, no clock, no async ([`input`] is a shared record whose callers
//! pass the time). Newcomers should start with [`Model`].

mod addr_text;
mod build;
mod categorize;
mod cidr_warnings;
mod claims;
pub mod cluster;
mod diff;
mod event;
pub mod input;
pub mod inspect;
pub mod ip;
mod key;
pub mod log_limit;
mod model;
mod node;
mod port_range;
pub mod records;
mod service_port;
mod source_ranges;
pub mod trace;

pub use addr_text::AddrText;
pub use categorize::{
    CategorizedEndpoints, EndpointCandidate, categorize_endpoints, sort_endpoints,
};
pub use cluster::{
    ClusterConfig, ClusterModel, ClusterOutcome, ServiceSource, TriggerTime, node_state,
};
pub use diff::{Change, Diff, DiffSummary, EndpointChanges};
pub use event::{AppliedCounts, Event, Kind, Object, ObjectRef};
pub use key::{Family, Name, PortKey, Protocol, ServiceKey};
pub use model::{ApplyOutcome, Model, ModelConfig, Snapshot};
pub use node::{NodeChange, NodeChanges, NodeMemory, NodeState};
pub use port_range::{NodePortRange, PortRangeError};
pub use records::{ConversionError, Warning};
pub use service_port::{Endpoint, ServicePort, SessionAffinity, TargetPort};
