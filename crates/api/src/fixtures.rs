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
