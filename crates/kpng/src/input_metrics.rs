//! `kpng_input_problems`, `kpng_input_problems_by_input{input}` and
//! `kpng_input_last_good_timestamp_seconds`, read from the source's health record at each
//! scrape.
//!
//! Why: `kpng status` shows an input problem to whoever asks; an alert needs it as a number.
//! `kpng_input_problems > 0` for some minutes means the node is not following the cluster (a
//! manifest that does not load, an API server or brain out of reach, a watch RBAC refuses),
//! whatever the source. `kpng_input_problems_by_input` says which input has them (the API
//! server out of reach, a list or a watch failing, a manifest file, the brain), so an alert
//! can say where to look before anyone runs `kpng status`.

use kpng_model::input::InputHealth;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// Registers the input's gauges on `registry`.
pub fn register(registry: &mut Registry, input: InputHealth) {
    registry.register_collector(Box::new(InputCollector(input)));
}

#[derive(Debug)]
struct InputCollector(InputHealth);

impl Collector for InputCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let state = self.0.state();
        let problems = ConstGauge::new(i64::try_from(state.problems.len()).unwrap_or(i64::MAX));
        problems.encode(encoder.encode_descriptor(
            "kpng_input_problems",
            "Problems the source has with its input now (a file that does not load, the API server or brain unreachable, a refused watch); `kpng status` names them.",
            None,
            problems.metric_type(),
        )?)?;
        let mut by_input = encoder.encode_descriptor(
            "kpng_input_problems_by_input",
            "Problems the source has with its input now, by input: api_server (unreachable), list or watch (a kind's list or watch failing), file (a manifest), brain (a brain-fed node's brain).",
            None,
            problems.metric_type(),
        )?;
        for input in INPUTS {
            let count = state
                .problems
                .keys()
                .filter(|what| input_of(what) == input)
                .count();
            ConstGauge::new(i64::try_from(count).unwrap_or(i64::MAX))
                .encode(by_input.encode_family(&[("input", input)])?)?;
        }
        if let Some(at) = state.last_good {
            let seconds = at
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or_default();
            let last = ConstGauge::new(seconds);
            last.encode(encoder.encode_descriptor(
                "kpng_input_last_good_timestamp_seconds",
                "When the input last loaded (a file), a list last completed (the API server) or a change set last arrived (a brain).",
                None,
                last.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

/// The values of `kpng_input_problems_by_input`'s `input` label, each always exported (0
/// when fine), so that an alert on one does not depend on the series existing.
const INPUTS: [&str; 5] = ["api_server", "list", "watch", "file", "brain"];

/// Which input a problem concerns, from what the source records it under
/// ([`kpng_model::input::InputState::problems`]): the `kube` source's `API server`,
/// `<Kind> list` and `<Kind> watch`, a brain-fed node's `brain` and `brain state`, and
/// otherwise the file source's manifest path.
fn input_of(what: &str) -> &'static str {
    if what == "API server" {
        "api_server"
    } else if what.ends_with(" list") {
        "list"
    } else if what.ends_with(" watch") {
        "watch"
    } else if what == "brain" || what.starts_with("brain ") {
        "brain"
    } else {
        "file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gauges_follow_the_record() {
        let input = InputHealth::new("file /x.yaml");
        let mut registry = Registry::default();
        register(&mut registry, input.clone());
        let scrape = |registry: &Registry| {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, registry).expect("encode");
            text
        };
        let text = scrape(&registry);
        assert!(text.contains("\nkpng_input_problems 0\n"), "{text}");
        assert!(
            text.contains("\nkpng_input_problems_by_input{input=\"brain\"} 0\n"),
            "{text}"
        );
        assert!(
            !text.contains("kpng_input_last_good"),
            "never loaded: {text}"
        );

        let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        input.failing("/x.yaml", "not loaded", at);
        input.loaded(at, None);
        let text = scrape(&registry);
        assert!(text.contains("\nkpng_input_problems 1\n"), "{text}");
        assert!(
            text.contains("\nkpng_input_problems_by_input{input=\"file\"} 1\n")
                && text.contains("\nkpng_input_problems_by_input{input=\"api_server\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("\nkpng_input_last_good_timestamp_seconds 1700000000.0\n"),
            "{text}"
        );
    }

    /// Each input's problems count under its own label, as the sources record them.
    #[test]
    fn each_problem_counts_for_its_input() {
        let input = InputHealth::new("kube https://10.0.0.1:6443/");
        let mut registry = Registry::default();
        register(&mut registry, input.clone());
        let at = std::time::UNIX_EPOCH;
        for what in [
            "API server",
            "Service list",
            "EndpointSlice watch",
            "Node watch",
            "brain",
            "brain state",
            "/etc/kpng/cluster.yaml",
        ] {
            input.failing(what, "broken", at);
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        let counts: Vec<(&str, i64)> = INPUTS
            .iter()
            .map(|i| {
                let line = format!("kpng_input_problems_by_input{{input=\"{i}\"}} ");
                let value = text
                    .lines()
                    .find_map(|l| l.strip_prefix(line.as_str()))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(-1);
                (*i, value)
            })
            .collect();
        assert_eq!(
            counts,
            [
                ("api_server", 1),
                ("list", 1),
                ("watch", 2),
                ("file", 1),
                ("brain", 2)
            ],
            "{text}"
        );
    }
}
