//! `kpng_input_problems` and `kpng_input_last_good_timestamp_seconds`, read from the source's
//! health record at each scrape.
//!
//! Why: `kpng status` shows an input problem to whoever asks; an alert needs it as a number.
//! `kpng_input_problems > 0` for some minutes means the node is not following the cluster (a
//! manifest that does not load, an API server or brain out of reach, a watch RBAC refuses),
//! whatever the source.

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
            !text.contains("kpng_input_last_good"),
            "never loaded: {text}"
        );

        let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        input.failing("/x.yaml", "not loaded", at);
        input.loaded(at, None);
        let text = scrape(&registry);
        assert!(text.contains("\nkpng_input_problems 1\n"), "{text}");
        assert!(
            text.contains("\nkpng_input_last_good_timestamp_seconds 1700000000.0\n"),
            "{text}"
        );
    }
}
