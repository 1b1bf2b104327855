//! The `kube` source: watches the API server the way kube-proxy does and feeds the model.
//!
//! - [`client`] builds the API client from `--kubeconfig` / `--master` (or the in-cluster
//!   service account), with `--kube-api-qps` / `--kube-api-burst` as a token bucket and API
//!   server outages logged once, not per retry.
//! - [`KubeSource::run`] runs one kube-runtime watcher per kind: Services and EndpointSlices
//!   (label selector as kube-proxy's, see [`label_selector`]), this node's Node (field selector
//!   on its name), and ServiceCIDRs when discovery says the API serves them. Lists become
//!   streamed `ListStart`/`ListItem`/`ListDone` events, watch events `Apply`/`Delete`.
//!
//! Recovery is kube-runtime's: a dropped watch resumes from its resourceVersion (bookmarks keep
//! it fresh), `410 Gone` relists, errors back off exponentially with jitter. While the API
//! server is unreachable nothing reaches the model, so the last programmed rules stay. A hang
//! is found by a probe while the client hears nothing, and a watch silent since the hang
//! began resumes from its resourceVersion once the server answers (`liveness`).

mod backoff;
mod client_metrics;
mod connect;
mod events;
mod liveness;
mod rate_limit;
mod reachability;
mod slim;
mod source_errors;
mod token_file;
mod watch;

pub use client_metrics::{ClientMetrics, ClientMetricsLayer};
pub use connect::{ClientOptions, ConnectError, Connection, client, connect, without_credentials};
pub use events::{EventError, NodeEvents};
pub use liveness::{PROBE_AFTER, ProbeUnanswered, Watched};
pub use rate_limit::{RateLimitLayer, TokenBucket};
pub use reachability::{
    Failure, NoAnswerDuringOutage, OUTAGE_HEADER_TIMEOUT, Reachability, ReachabilityLayer,
    Superseded,
};
pub use source_errors::{ListFailure, SourceErrors};
pub use token_file::{TokenFile, TokenFileError, TokenFileLayer};
pub use watch::{KubeSource, SourceConfig, label_selector};
