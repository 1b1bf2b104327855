//! `kpng status`'s line about the nftables table of `to-local nft` (and of `to-local ebpf`'s
//! rules half): which table to look at, and how big kpng keeps it.
//!
//! Why: the first thing an engineer debugging a Service on the node types is `nft list
//! ruleset`, which at thousands of Services prints every element of every map; the line names
//! the table (`kpng`, not kube-proxy's `kube-proxy`) and says how much is in it, from what
//! kpng committed (never a kernel listing, which takes seconds at 30k Services).

use std::sync::Arc;

use kpng_backend_nft::{Committed, SharedCommitted};
use kpng_model::Family;
use kpng_runner::admin::{DataPlaneDetail, DataPlaneProbe};

/// The probe for a backend committing `table` (its figures in `committed`).
pub fn probe(table: String, committed: SharedCommitted) -> DataPlaneProbe {
    Arc::new(move || {
        let copy = committed.lock().map(|c| c.clone()).unwrap_or_default();
        vec![detail(&table, &copy)]
    })
}

/// nft's name of a family's tables.
fn nft_family(family: Family) -> &'static str {
    match family {
        Family::V4 => "ip",
        Family::V6 => "ip6",
    }
}

fn detail(table: &str, committed: &[Committed]) -> DataPlaneDetail {
    let state = if committed.is_empty() {
        format!("table {table}: nothing committed yet")
    } else {
        let tables: Vec<String> = committed
            .iter()
            .map(|c| {
                format!(
                    "table {} {table}: {} set and map elements, {} dynamic chain{}",
                    nft_family(c.family),
                    c.elements,
                    c.chains,
                    if c.chains == 1 { "" } else { "s" }
                )
            })
            .collect();
        let commands: Vec<String> = committed
            .iter()
            .map(|c| format!("nft list table {} {table}", nft_family(c.family)))
            .collect();
        format!(
            "{}; see them with {} (every element), or `kpng trace` for one flow",
            tables.join("; "),
            commands.join(" and ")
        )
    };
    DataPlaneDetail {
        what: "nftables".into(),
        state,
        problem: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_each_table_and_the_command_that_shows_it() {
        let committed = [
            Committed {
                family: Family::V4,
                elements: 120_034,
                chains: 3,
            },
            Committed {
                family: Family::V6,
                elements: 40,
                chains: 1,
            },
        ];
        assert_eq!(
            detail("kpng", &committed).state,
            "table ip kpng: 120034 set and map elements, 3 dynamic chains; table ip6 kpng: 40 \
             set and map elements, 1 dynamic chain; see them with nft list table ip kpng and \
             nft list table ip6 kpng (every element), or `kpng trace` for one flow"
        );
        assert_eq!(
            detail("kpng", &[]).state,
            "table kpng: nothing committed yet"
        );
    }
}
