//! The programs' event counters (`kpng_counters` in `bpf/sock_lb.c`, whose indexes this module
//! mirrors), read at each scrape of `/metrics`.
//!
//! Why per CPU and summed here: a shared counter would cost every translated `connect()` an
//! atomic operation on one cache line that all CPUs write; a `BPF_MAP_TYPE_PERCPU_ARRAY`
//! element is one plain increment of the CPU's own copy, and the sum of a few dozen values at
//! each scrape is nothing. Read at scrape rather than at each sync: a sync may be half an
//! hour apart from the traffic it would report.

use std::sync::{Arc, Mutex};

use aya::maps::{MapData, PerCpuArray};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use tracing::debug;

/// The map's name in the object (and its pin).
pub const MAP: &str = "kpng_counters";

/// A translating hook (`HOOK_*` in the C source), in index order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// `connect()` of an IPv4 socket.
    Connect4,
    /// `connect()` of an IPv6 socket (an IPv4-mapped Service address included).
    Connect6,
    /// `sendmsg()` with an address, IPv4 socket.
    Sendmsg4,
    /// `sendmsg()` with an address, IPv6 socket.
    Sendmsg6,
}

impl Hook {
    /// Every hook, in the C source's index order.
    pub const ALL: [Hook; 4] = [
        Hook::Connect4,
        Hook::Connect6,
        Hook::Sendmsg4,
        Hook::Sendmsg6,
    ];

    /// The `hook` label: the program's hook name.
    pub fn label(self) -> &'static str {
        match self {
            Hook::Connect4 => "connect4",
            Hook::Connect6 => "connect6",
            Hook::Sendmsg4 => "sendmsg4",
            Hook::Sendmsg6 => "sendmsg6",
        }
    }
}

/// What a hook counts (`EV_*` in the C source), in index order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The address was rewritten to an endpoint.
    Translated,
    /// Refused with `ECONNREFUSED`: a TCP frontend with no endpoint anywhere.
    Refused,
    /// The endpoint came from a live ClientIP affinity entry (also counted as translated).
    AffinityHit,
}

impl Event {
    /// Every event, in the C source's index order (`EVENTS` is its length).
    pub const ALL: [Event; 3] = [Event::Translated, Event::Refused, Event::AffinityHit];

    /// The counter's name (the encoder appends `_total`) and help.
    pub fn metric(self) -> (&'static str, &'static str) {
        match self {
            Event::Translated => (
                "kpng_ebpf_translations",
                "Socket addresses the eBPF programs translated from a Service frontend to an \
                 endpoint, per hook",
            ),
            Event::Refused => (
                "kpng_ebpf_refused",
                "connect() calls the eBPF programs refused with ECONNREFUSED (a TCP Service \
                 without endpoints; UDP is left to the REJECT rule, as kube-proxy), per hook",
            ),
            Event::AffinityHit => (
                "kpng_ebpf_affinity_hits",
                "Translations that reused the client's ClientIP session-affinity endpoint, per \
                 hook",
            ),
        }
    }
}

/// `hook * EVENTS + event`: the counter's index in the map.
pub fn index(hook: Hook, event: Event) -> u32 {
    hook as u32 * Event::ALL.len() as u32 + event as u32
}

/// A counter's value: the sum of its per-CPU copies (wrapping, as the kernel's `__u64` does).
pub fn sum(per_cpu: &[u64]) -> u64 {
    per_cpu.iter().fold(0u64, |a, v| a.wrapping_add(*v))
}

/// Every counter's total, by event then hook, from `read` (one counter's per-CPU values by
/// index, `None` when it cannot be read: that series is left out of the scrape rather than
/// shown as 0, which would read as a reset).
pub fn totals(read: impl Fn(u32) -> Option<Vec<u64>>) -> Vec<(Event, Hook, u64)> {
    let mut out = Vec::new();
    for event in Event::ALL {
        for hook in Hook::ALL {
            if let Some(values) = read(index(hook, event)) {
                out.push((event, hook, sum(&values)));
            }
        }
    }
    out
}

/// The `hook` label of the kernel counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HookLabel {
    /// `connect4`, `connect6`, `sendmsg4` or `sendmsg6`.
    pub hook: String,
}

/// The scrape-time reader of `kpng_counters`: the backend hands it the map once loaded (and a
/// new handle after a reload); until then it exports no sample.
#[derive(Clone, Default)]
pub struct KernelCounters {
    map: Arc<Mutex<Option<PerCpuArray<MapData, u64>>>>,
}

impl std::fmt::Debug for KernelCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelCounters").finish_non_exhaustive()
    }
}

impl KernelCounters {
    /// Reads `map` from now on (`None`: the programs are not loaded, nothing to read).
    pub fn set(&self, map: Option<PerCpuArray<MapData, u64>>) {
        if let Ok(mut slot) = self.map.lock() {
            *slot = map;
        }
    }

    /// Every counter's total now; empty when the map is not loaded.
    pub fn read(&self) -> Vec<(Event, Hook, u64)> {
        let Ok(slot) = self.map.lock() else {
            return Vec::new();
        };
        let Some(map) = slot.as_ref() else {
            return Vec::new();
        };
        totals(|i| match map.get(&i, 0) {
            Ok(values) => Some(values.iter().copied().collect()),
            Err(e) => {
                debug!("reading {MAP}[{i}]: {e}");
                None
            }
        })
    }
}

impl Collector for KernelCounters {
    fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        encode_totals(&self.read(), encoder)
    }
}

/// Encodes `totals` as one counter family per event, labelled by hook.
fn encode_totals(
    totals: &[(Event, Hook, u64)],
    mut encoder: DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    for event in Event::ALL {
        let (name, help) = event.metric();
        let mut family = encoder.encode_descriptor(
            name,
            help,
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (_, hook, value) in totals.iter().filter(|(e, _, _)| *e == event) {
            let label = HookLabel {
                hook: hook.label().into(),
            };
            ConstCounter::new(*value).encode(family.encode_family(&label)?)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_follow_the_c_source() {
        // HOOK_* and EV_* of bpf/sock_lb.c: `hook * EVENTS + event`, EVENTS = 3, COUNTERS = 64.
        let cases = [
            (Hook::Connect4, Event::Translated, 0),
            (Hook::Connect4, Event::Refused, 1),
            (Hook::Connect4, Event::AffinityHit, 2),
            (Hook::Connect6, Event::Translated, 3),
            (Hook::Sendmsg4, Event::Refused, 7),
            (Hook::Sendmsg6, Event::AffinityHit, 11),
        ];
        for (hook, event, want) in cases {
            assert_eq!(index(hook, event), want, "{hook:?} {event:?}");
        }
        let last = index(Hook::Sendmsg6, Event::AffinityHit);
        assert!(last < 64, "within the map's COUNTERS entries");
    }

    #[test]
    fn each_counter_is_the_sum_of_its_cpus() {
        let cases: [(&[u64], u64); 4] = [
            (&[], 0),
            (&[5], 5),
            (&[1, 2, 3, 4], 10),
            (&[u64::MAX, 2], 1),
        ];
        for (values, want) in cases {
            assert_eq!(sum(values), want, "{values:?}");
        }
    }

    #[test]
    fn totals_label_each_counter_and_leave_out_unreadable_ones() {
        // Counter i holds [i, 10 * i] on two CPUs; counter 4 (connect6 refused) is unreadable.
        let got = totals(|i| (i != 4).then(|| vec![u64::from(i), 10 * u64::from(i)]));
        assert_eq!(got.len(), 11);
        assert!(got.contains(&(Event::Translated, Hook::Connect4, 0)));
        assert!(got.contains(&(Event::Translated, Hook::Sendmsg4, 66)));
        assert!(got.contains(&(Event::AffinityHit, Hook::Connect6, 55)));
        assert!(
            !got.iter()
                .any(|(e, h, _)| (*e, *h) == (Event::Refused, Hook::Connect6))
        );
    }

    /// Fixed totals, encoded as the collector encodes the map's.
    #[derive(Debug)]
    struct Fixed(Vec<(Event, Hook, u64)>);

    impl Collector for Fixed {
        fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            encode_totals(&self.0, encoder)
        }
    }

    fn scrape(collector: impl Collector) -> String {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(collector));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        text
    }

    #[test]
    fn totals_are_exported_as_counters_per_hook() {
        let text = scrape(Fixed(vec![
            (Event::Translated, Hook::Connect4, 7),
            (Event::Translated, Hook::Sendmsg6, 2),
            (Event::Refused, Hook::Connect6, 1),
            (Event::AffinityHit, Hook::Connect4, 3),
        ]));
        for line in [
            "# TYPE kpng_ebpf_translations counter",
            "kpng_ebpf_translations_total{hook=\"connect4\"} 7",
            "kpng_ebpf_translations_total{hook=\"sendmsg6\"} 2",
            "kpng_ebpf_refused_total{hook=\"connect6\"} 1",
            "kpng_ebpf_affinity_hits_total{hook=\"connect4\"} 3",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
    }

    #[test]
    fn an_unloaded_map_exports_help_and_no_sample() {
        let text = scrape(KernelCounters::default());
        assert!(
            text.contains("# TYPE kpng_ebpf_translations counter"),
            "{text}"
        );
        assert!(!text.contains("kpng_ebpf_translations_total{"), "{text}");
    }
}
