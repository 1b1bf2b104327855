//! A backend of one's own, fed by a kpng brain over gRPC: the smallest complete example of the
//! two things a backend writer in Rust needs (docs/backends.md "How to write a new backend",
//! docs/grpc-api.md "A Rust backend"):
//!
//! - a [`Backend`]: it receives the node-local model (no Kubernetes type), here as the diff of
//!   Service ports since its last sync, and keeps what it "programmed" in memory, printing
//!   each frontend with the endpoints the model chose for it;
//! - the loop that drives it: [`watch`] keeps a Watch stream to the brain (reconnecting with
//!   backoff), [`RemoteModel`] turns what it receives into the model, and the same
//!   [`Runner`] as kpng's own nodes batches the changes, calls `sync` (a full sync first and
//!   after any error) and serves nothing else unless asked.
//!
//! Run a brain and this example against it:
//!
//! ```sh
//! kpng file --input examples/cluster.yaml to-api --listen unix:///tmp/brain.sock &
//! cargo run -p kpng --example remote_backend -- unix:///tmp/brain.sock node1
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;

use kpng_api::client::{RemoteModel, WatchConfig, watch};
use kpng_backend::{Backend, BackendError, SyncRequest, SyncStats};
use kpng_model::{PortKey, ServicePort};
use kpng_runner::SyncTiming;
use kpng_runner::health::ProxyHealth;
use kpng_runner::metrics::ProxyMetrics;
use kpng_runner::runner::Runner;

/// What this backend "programmed": each Service port as last synced.
#[derive(Default)]
struct PrintingBackend {
    programmed: BTreeMap<PortKey, Arc<ServicePort>>,
}

impl Backend for PrintingBackend {
    fn name(&self) -> &'static str {
        "printing"
    }

    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncStats, BackendError> {
        // A full sync lists every port as new: what it does not list is gone.
        if request.full {
            self.programmed
                .retain(|key, _| request.diff.changes.contains_key(key));
        }
        let mut operations = 0;
        for (key, change) in &request.diff.changes {
            operations += 1;
            match &change.new {
                Some(port) => {
                    let endpoints: Vec<String> = port
                        .internal_endpoints()
                        .iter()
                        .map(|e| format!("{}:{}", e.ip, e.port))
                        .collect();
                    println!(
                        "program {key}: {}:{} ({:?}) -> [{}]",
                        port.cluster_ip,
                        port.port,
                        key.protocol,
                        endpoints.join(", ")
                    );
                    self.programmed.insert(key.clone(), port.clone());
                }
                None => {
                    println!("remove {key}");
                    self.programmed.remove(key);
                }
            }
        }
        Ok(SyncStats {
            operations,
            ..SyncStats::default()
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let addr = args
        .next()
        .unwrap_or_else(|| "unix:///tmp/brain.sock".into());
    let node = args.next().unwrap_or_else(|| "node1".into());

    let model = RemoteModel::new(&node, Vec::new());
    let config = WatchConfig::new(addr.parse()?, &node);
    let (updates, events) = tokio::sync::mpsc::channel(64);
    tokio::spawn(watch(config, updates));

    let backend: Box<dyn Backend> = Box::new(PrintingBackend::default());
    let timing = SyncTiming::default();
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = ProxyMetrics::new(&mut registry);
    let health = Arc::new(ProxyHealth::new(
        &backend.families(),
        timing.sync_period * 2,
    ));
    Runner::new(model, backend, timing, metrics, health)
        .run(events)
        .await;
    Ok(())
}
