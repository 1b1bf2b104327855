//! Golden test: `examples/cluster.yaml` as node1 sees it must render exactly as
//! `examples/cluster.node1.yaml`. Run with `UPDATE_GOLDEN=1` to accept a deliberate change.

use std::path::PathBuf;

use kpng_model::{Event, Kind, Model, ModelConfig};

fn repo_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(name)
}

#[test]
fn example_cluster_renders_as_the_golden_file() {
    let text = std::fs::read_to_string(repo_file("examples/cluster.yaml")).expect("read example");
    let loaded = kpng_source_file::parse_manifests(&text).expect("example parses");
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let mut model = Model::new(ModelConfig {
        node_name: "node1".into(),
        ..ModelConfig::default()
    });
    let out = model.apply(Event::Replace {
        kinds: vec![Kind::Service, Kind::EndpointSlice, Kind::Node],
        objects: loaded.objects,
    });
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    let rendered = kpng_sink_file::render(model.snapshot()).expect("render");
    let golden = repo_file("examples/cluster.node1.yaml");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden, &rendered).expect("write golden");
    }
    let want = std::fs::read_to_string(&golden)
        .expect("read golden (run with UPDATE_GOLDEN=1 to create it)");
    assert_eq!(
        rendered, want,
        "rendering changed; inspect and rerun with UPDATE_GOLDEN=1 if intended"
    );
}
