//! kube-proxy's Events about its Node, through the `kube` source's client: `Starting` when
//! the proxy starts, and a warning when syncing keeps failing. Why: `kubectl describe node`
//! and event-based alerting are where an operator looks first; kube-proxy reports there.
//!
//! Events are best effort: a refused or failed post is logged (at debug level after the first)
//! and never stops the proxy.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// An Event the API server did not take (refused, or unreachable).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct EventError(#[from] kube::Error);

impl EventError {
    /// Whether the API server refused it for lack of permission (RBAC), rather than being
    /// unreachable or failing: only then is kpng's ClusterRole the thing to check.
    pub fn is_forbidden(&self) -> bool {
        matches!(&self.0, kube::Error::Api(s) if s.code == 403)
    }
}

/// Posts Events regarding one Node.
#[derive(Clone)]
pub struct NodeEvents {
    recorder: Recorder,
    node: ObjectReference,
}

impl std::fmt::Debug for NodeEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeEvents")
            .field("node", &self.node.name)
            .finish()
    }
}

impl NodeEvents {
    /// Events about Node `node_name`, reported by `kpng` on that node. As kube-proxy, the
    /// reference's UID is the node name (kube-proxy never reads its Node's UID for events), and
    /// the Events land in the `default` namespace (a Node has none).
    pub fn new(client: Client, node_name: &str) -> NodeEvents {
        let reporter = Reporter {
            controller: "kpng".into(),
            instance: Some(node_name.to_string()),
        };
        NodeEvents {
            recorder: Recorder::new(client, reporter),
            node: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node_name.to_string()),
                uid: Some(node_name.to_string()),
                ..ObjectReference::default()
            },
        }
    }

    /// `Normal Starting`: the proxy started (kube-proxy's `StartKubeProxy`).
    pub async fn starting(&self, backend: &str) -> Result<(), EventError> {
        self.publish(Event {
            type_: EventType::Normal,
            reason: "Starting".into(),
            note: Some(format!("Starting kpng ({backend}).")),
            action: "StartKubeProxy".into(),
            secondary: None,
        })
        .await
    }

    /// `Warning SyncProxyRulesFailed`: syncing failed `attempts` times in a row.
    pub async fn sync_failing(&self, attempts: u32, error: &str) -> Result<(), EventError> {
        self.publish(Event {
            type_: EventType::Warning,
            reason: "SyncProxyRulesFailed".into(),
            note: Some(truncate(&format!(
                "programming Services failed {attempts} times in a row; last error: {error}"
            ))),
            action: "SyncProxyRules".into(),
            secondary: None,
        })
        .await
    }

    /// `Warning FailedToStartProxierHealthcheck`: this node's health server could not bind
    /// (`error` says where and why). kube-proxy posts it for every failed bind, so an
    /// operator alerting on Events sees a node whose `/healthz` a load balancer or the kubelet
    /// cannot reach, whether the proxy then exits (`bindAddressHardFail`) or tries again.
    pub async fn proxier_health_check_failed(&self, error: &str) -> Result<(), EventError> {
        self.publish(Event {
            type_: EventType::Warning,
            reason: "FailedToStartProxierHealthcheck".into(),
            note: Some(truncate(error)),
            action: "StartKubeProxy".into(),
            secondary: None,
        })
        .await
    }

    /// `Warning FailedToStartServiceHealthcheck` on Service `namespace/name`: this node could
    /// not serve its `healthCheckNodePort`, so load balancers see the node as unhealthy for
    /// it (kube-proxy's Event, seen in `kubectl describe service`).
    pub async fn health_check_failed(
        &self,
        namespace: &str,
        name: &str,
        port: u16,
        error: &str,
    ) -> Result<(), EventError> {
        let node = self.node.name.as_deref().unwrap_or_default();
        let service = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Service".into()),
            namespace: Some(namespace.to_string()),
            name: Some(name.to_string()),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: "FailedToStartServiceHealthcheck".into(),
            note: Some(truncate(&format!(
                "node {node} failed to start healthcheck \"{namespace}/{name}\" on port {port}: \
                 {error}"
            ))),
            action: "Listen".into(),
            secondary: None,
        };
        Ok(self.recorder.publish(&event, &service).await?)
    }

    async fn publish(&self, event: Event) -> Result<(), EventError> {
        Ok(self.recorder.publish(&event, &self.node).await?)
    }
}

/// An Event's note is limited to 1 kB by the API server.
fn truncate(note: &str) -> String {
    const MAX: usize = 1000;
    if note.len() <= MAX {
        return note.to_string();
    }
    let mut end = MAX;
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &note[..end])
}

#[cfg(test)]
mod tests {
    #[test]
    fn long_notes_are_cut_on_a_character_boundary() {
        let long = "é".repeat(700);
        let cut = super::truncate(&long);
        assert!(cut.len() <= 1004 && cut.ends_with('…'), "{}", cut.len());
        assert_eq!(super::truncate("short"), "short");
    }
}
