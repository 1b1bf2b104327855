//! The eBPF backend's own metrics (`kpng_ebpf_*`): whether the programs are attached and
//! where, how full each map is and what it costs, the UDP sockets destroyed, and (through
//! [`crate::counters`], read at scrape) what the programs translate.
//!
//! Why: the nftables half of `to-local ebpf` has its rules to look at; the socket half is
//! invisible from the packets (a translated connection is a direct one), so without these a
//! node whose programs stopped translating, or whose frontends map is full, looks like any
//! other.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as MetricFamily;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::counters::KernelCounters;

/// The `map` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MapLabel {
    /// The map's name (`kpng_frontends`).
    pub map: String,
}

impl MapLabel {
    /// The label of map `name`.
    pub fn of(name: &str) -> MapLabel {
        MapLabel { map: name.into() }
    }
}

/// The labels of `kpng_ebpf_program_attached`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProgramLabel {
    /// The program's name (`kpng_connect4`).
    pub program: String,
    /// The cgroup v2 directory it is attached to.
    pub cgroup: String,
}

/// Every metric of the backend; clones share the series.
#[derive(Clone, Debug, Default)]
pub struct EbpfMetrics {
    /// `kpng_ebpf_program_attached{program, cgroup}`: 1 while the program is attached there, 0
    /// once kpng dropped it (a failed load or repair, retried at the next sync).
    pub attached: MetricFamily<ProgramLabel, Gauge>,
    /// `kpng_ebpf_map_entries{map}`: elements in each map.
    pub entries: MetricFamily<MapLabel, Gauge>,
    /// `kpng_ebpf_map_max_entries{map}`: each map's capacity.
    pub max_entries: MetricFamily<MapLabel, Gauge>,
    /// `kpng_ebpf_map_memory_bytes{map}`: kernel memory charged to each map.
    pub memory: MetricFamily<MapLabel, Gauge>,
    /// `kpng_ebpf_udp_sockets_destroyed_total`.
    pub sockets_destroyed: Counter,
    /// `kpng_ebpf_udp_socket_destroy_failures_total`.
    pub socket_destroy_failures: Counter,
    /// The programs' own counters, read at scrape.
    pub kernel: KernelCounters,
}

impl EbpfMetrics {
    /// Registers every metric into `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kpng_ebpf_program_attached",
            "Whether each eBPF socket program is attached (1) to the cgroup, as of the last sync",
            self.attached.clone(),
        );
        registry.register(
            "kpng_ebpf_map_entries",
            "Elements in each of the eBPF backend's maps (Service maps after every sync, the \
             programs' LRU maps at full and periodic syncs)",
            self.entries.clone(),
        );
        registry.register(
            "kpng_ebpf_map_max_entries",
            "Capacity of each of the eBPF backend's maps: a full hash map refuses new \
             elements, a full LRU map evicts",
            self.max_entries.clone(),
        );
        registry.register(
            "kpng_ebpf_map_memory_bytes",
            "Kernel memory charged to each of the eBPF backend's maps (memlock)",
            self.memory.clone(),
        );
        registry.register(
            "kpng_ebpf_udp_sockets_destroyed",
            "Connected UDP sockets destroyed (SOCK_DESTROY) because their endpoint left the \
             Service they were translated for",
            self.sockets_destroyed.clone(),
        );
        registry.register(
            "kpng_ebpf_udp_socket_destroy_failures",
            "UDP sockets to destroy that kpng could not (nsenter or ss failed in a network \
             namespace, a destroy was refused, or a socket still open was not found: kpng \
             without hostPID cannot see the pods' processes)",
            self.socket_destroy_failures.clone(),
        );
        registry.register_collector(Box::new(self.kernel.clone()));
    }

    /// Sets every program's attachment gauge to `attached` (the programs are attached and
    /// detached together).
    pub fn set_attached(&self, programs: &[&str], cgroup: &std::path::Path, attached: bool) {
        let cgroup = cgroup.display().to_string();
        for program in programs {
            self.attached
                .get_or_create(&ProgramLabel {
                    program: (*program).into(),
                    cgroup: cgroup.clone(),
                })
                .set(i64::from(attached));
        }
    }

    /// Sets one gauge of `family` for map `name`, saturating at `i64::MAX`.
    pub fn set_map(family: &MetricFamily<MapLabel, Gauge>, name: &str, value: u64) {
        family
            .get_or_create(&MapLabel::of(name))
            .set(i64::try_from(value).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(m: &EbpfMetrics) -> String {
        let mut registry = Registry::default();
        m.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        text
    }

    #[test]
    fn gauges_carry_their_map_and_program_labels() {
        let m = EbpfMetrics::default();
        m.set_attached(
            &["kpng_connect4", "kpng_sendmsg6"],
            std::path::Path::new("/sys/fs/cgroup/kubepods"),
            true,
        );
        EbpfMetrics::set_map(&m.entries, "kpng_frontends", 3);
        EbpfMetrics::set_map(&m.max_entries, "kpng_frontends", 262_144);
        EbpfMetrics::set_map(&m.memory, "kpng_reverse", u64::MAX);
        m.sockets_destroyed.inc_by(2);
        let text = scrape(&m);
        for line in [
            "kpng_ebpf_program_attached{program=\"kpng_connect4\",cgroup=\"/sys/fs/cgroup/kubepods\"} 1",
            "kpng_ebpf_program_attached{program=\"kpng_sendmsg6\",cgroup=\"/sys/fs/cgroup/kubepods\"} 1",
            "kpng_ebpf_map_entries{map=\"kpng_frontends\"} 3",
            "kpng_ebpf_map_max_entries{map=\"kpng_frontends\"} 262144",
            "kpng_ebpf_map_memory_bytes{map=\"kpng_reverse\"} 9223372036854775807",
            "kpng_ebpf_udp_sockets_destroyed_total 2",
            "kpng_ebpf_udp_socket_destroy_failures_total 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
        m.set_attached(
            &["kpng_connect4"],
            std::path::Path::new("/sys/fs/cgroup/kubepods"),
            false,
        );
        assert!(
            scrape(&m).contains(
                "kpng_ebpf_program_attached{program=\"kpng_connect4\",cgroup=\"/sys/fs/cgroup/kubepods\"} 0"
            ),
            "a dropped program reads 0"
        );
    }
}
