//! `kpng status`'s line about `to-local iptables`: which iptables variant holds the rules
//! (legacy or nft, as detected or asked) and how many rules kpng keeps in each table.
//!
//! Why: the first surprise of iptables mode at 3 a.m. is `iptables-save` showing none of the
//! Service rules because they are in the other variant; the second is how big the ruleset is.

use std::sync::Arc;

use kpng_backend_iptables::SharedRuleCounts;
use kpng_backend_iptables::exec::Mode;
use kpng_runner::admin::{DataPlaneDetail, DataPlaneProbe};

/// The probe for a backend programming through `mode` (`detected`: by `--iptables-mode auto`).
pub fn probe(mode: Mode, detected: bool, counts: SharedRuleCounts) -> DataPlaneProbe {
    Arc::new(move || {
        let copy = counts.lock().map(|c| c.clone()).unwrap_or_default();
        vec![detail(mode, detected, &copy)]
    })
}

fn detail(
    mode: Mode,
    detected: bool,
    counts: &[kpng_backend_iptables::RuleCounts],
) -> DataPlaneDetail {
    let how = if detected {
        "detected from the node's rules"
    } else {
        "--iptables-mode"
    };
    let families: Vec<String> = counts
        .iter()
        .map(|c| {
            format!(
                "{}: {} rules in nat, {} in filter",
                c.family, c.nat, c.filter
            )
        })
        .collect();
    let tools: Vec<String> = counts.iter().map(|c| mode.save_binary(c.family)).collect();
    let state = if families.is_empty() {
        format!("iptables-{} ({how}); nothing committed yet", mode.name())
    } else {
        format!(
            "iptables-{} ({how}); {}; see them with {}",
            mode.name(),
            families.join("; "),
            tools.join(" and ")
        )
    };
    DataPlaneDetail {
        what: "iptables".into(),
        state,
        problem: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpng_backend_iptables::RuleCounts;
    use kpng_model::Family;

    #[test]
    fn the_line_names_the_variant_and_the_tool_that_shows_the_rules() {
        let counts = [
            RuleCounts {
                family: Family::V4,
                nat: 82,
                filter: 12,
            },
            RuleCounts {
                family: Family::V6,
                nat: 40,
                filter: 10,
            },
        ];
        assert_eq!(
            detail(Mode::Legacy, true, &counts).state,
            "iptables-legacy (detected from the node's rules); IPv4: 82 rules in nat, 12 in \
             filter; IPv6: 40 rules in nat, 10 in filter; see them with iptables-legacy-save \
             and ip6tables-legacy-save"
        );
        assert_eq!(
            detail(Mode::Nft, false, &[]).state,
            "iptables-nft (--iptables-mode); nothing committed yet"
        );
    }
}
