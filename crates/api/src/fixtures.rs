//! Test fixtures: the cluster of `tests/data/cluster.yaml` in a [`ClusterModel`].

use kpng_model::{ClusterConfig, ClusterModel, Event, Kind, NodeState, node_state};

/// The fixture's manifests.
pub const CLUSTER_YAML: &str = include_str!("../tests/data/cluster.yaml");

/// The fixture's objects as one complete list.
pub fn cluster_event() -> Event {
    let loaded = kpng_source_file::parse_manifests(CLUSTER_YAML).expect("fixture parses");
    Event::Replace {
        kinds: vec![Kind::Service, Kind::EndpointSlice, Kind::Node],
        objects: loaded.objects,
    }
}

/// A cluster model holding the fixture.
pub fn cluster() -> ClusterModel {
    let mut cluster = ClusterModel::new(ClusterConfig::default());
    let out = cluster.apply(cluster_event());
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    cluster
}

/// Node `name` as the fixture's cluster knows it.
pub fn node(cluster: &ClusterModel, name: &str) -> NodeState {
    node_state(name, cluster.node(name).map(|n| n.as_ref()), &[])
}

/// The log lines `tracing` writes while a test runs, as text: what a test of a log line's
/// wording reads.
#[derive(Clone, Default)]
pub struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Logs {
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("lock")).into_owned()
    }

    /// A subscriber writing plain lines (no colours) here.
    pub fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + use<> {
        let writer = self.clone();
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish()
    }

    /// Captures this thread's log lines until the guard is dropped.
    pub fn capture() -> (Logs, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let guard = tracing::subscriber::set_default(logs.subscriber());
        (logs, guard)
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
