//! `kpng_conntrack_entries` and `kpng_conntrack_entries_limit`: how full the node's conntrack
//! table is, read from `/proc/sys/net/netfilter/nf_conntrack_{count,max}` at each scrape.
//!
//! Why: every Service connection a proxy node terminates holds a conntrack entry, and a full
//! table drops new connections ("nf_conntrack: table full, dropping packet" in `dmesg`, no
//! kpng log line), which looks like a Service outage. kube-proxy exports no such gauge (its
//! conntrack metrics are the stale-UDP reconciler's); the names follow node_exporter's
//! `node_nf_conntrack_entries` and `node_nf_conntrack_entries_limit`, so a node without
//! node_exporter gets the same alert. Two small files of kpng's own network namespace (the
//! node's, with `hostNetwork`) read on demand: no conntrack dump, nothing between scrapes.
//! Without the files (nf_conntrack not loaded) nothing is exported.

use std::path::PathBuf;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

/// Registers the gauges on `registry`, read from the running network namespace's `/proc/sys`.
pub fn register(registry: &mut Registry) {
    registry.register_collector(Box::new(ConntrackCollector {
        dir: PathBuf::from("/proc/sys/net/netfilter"),
    }));
}

/// Reads the two sysctls under `dir` at each scrape.
#[derive(Debug)]
struct ConntrackCollector {
    dir: PathBuf,
}

impl ConntrackCollector {
    fn read(&self, name: &str) -> Option<i64> {
        std::fs::read_to_string(self.dir.join(name))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

impl Collector for ConntrackCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let gauges = [
            (
                "nf_conntrack_count",
                "kpng_conntrack_entries",
                "Entries in the node's conntrack table now (nf_conntrack_count); new connections are dropped when it reaches kpng_conntrack_entries_limit.",
            ),
            (
                "nf_conntrack_max",
                "kpng_conntrack_entries_limit",
                "The node's conntrack table size (nf_conntrack_max, set from --conntrack-max-per-core and --conntrack-min in the host namespace).",
            ),
        ];
        for (file, name, help) in gauges {
            if let Some(value) = self.read(file) {
                crate::process_metrics::encode_gauge(&mut encoder, name, help, value)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gauges follow the files, read again at each scrape; a missing file (no
    /// nf_conntrack) exports nothing rather than a 0 that reads as an empty table.
    #[test]
    fn the_gauges_follow_the_sysctls() {
        let dir = std::env::temp_dir().join(format!("kpng-ct-metrics-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ConntrackCollector { dir: dir.clone() }));
        let scrape = |registry: &Registry| {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, registry).expect("encode");
            text
        };
        assert!(!scrape(&registry).contains("kpng_conntrack"), "no files");
        std::fs::write(dir.join("nf_conntrack_count"), "1234\n").expect("count");
        std::fs::write(dir.join("nf_conntrack_max"), "262144\n").expect("max");
        let text = scrape(&registry);
        assert!(
            text.contains("\nkpng_conntrack_entries 1234\n")
                && text.contains("\nkpng_conntrack_entries_limit 262144\n"),
            "{text}"
        );
        std::fs::write(dir.join("nf_conntrack_count"), "262144\n").expect("count");
        assert!(scrape(&registry).contains("\nkpng_conntrack_entries 262144\n"));
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
