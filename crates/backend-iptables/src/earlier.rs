//! Whether the rules an earlier run left in one variant still route Service traffic, asked
//! once when kpng starts (never in the sync loop).
//!
//! Why: the backend keeps whatever its variant's `KUBE-*` chains hold until its first full sync
//! replaces them (`iptables-restore --noflush`, nothing flushed before), so a node that restarts
//! while its input is wrong (a brain serving an empty state) keeps routing through them only if
//! it holds that state back; and it can only do that when it knows there is something to keep.
//! kube-proxy's iptables mode writes the same chains under the same names (this backend is its
//! rules), so its rules count too: the backend adopts them the same way.
//!
//! What counts: in a family's nat table, `KUBE-SERVICES` sends at least one Service to its chain
//! and `PREROUTING` or `OUTPUT` jumps to `KUBE-SERVICES`. Read with three one-chain listings
//! (`iptables -t nat -S CHAIN`), and only when the nat table exists: listing a legacy table
//! creates it (and its hooks), and iptables-nft may create its base chains.

use kpng_model::Family;
use tracing::debug;

use crate::exec::{ExecError, Iptables, IptablesCommand, Mode, legacy_table_exists};
use crate::rules::{SERVICES, Table};
use crate::save::Saved;

/// The built-in chains that send traffic to `KUBE-SERVICES`.
const ENTRIES: [&str; 2] = ["PREROUTING", "OUTPUT"];

/// Whether any family's nat table of `mode` holds Service rules that route traffic now (see
/// the module's doc). Errors (a tool missing, IPv6 disabled) count as "no".
pub fn rules_route_services(mode: Mode) -> bool {
    let mut ipt = IptablesCommand::new(mode);
    Family::ALL.into_iter().any(|family| {
        nat_exists(mode, family)
            && family_routes_services(&mut ipt, family).unwrap_or_else(|e| {
                debug!("reading the nat table of {family} ({}): {e}", mode.name());
                false
            })
    })
}

/// Whether the nat table of `family` exists in `mode`, found without touching iptables.
fn nat_exists(mode: Mode, family: Family) -> bool {
    match mode {
        Mode::Legacy => legacy_table_exists(family, Table::Nat.name()),
        Mode::Nft => {
            let nf = match family {
                Family::V4 => "ip",
                Family::V6 => "ip6",
            };
            kpng_netfilter::tables::find_table(nf, Table::Nat.name()).is_ok_and(|t| t.is_some())
        }
    }
}

/// Whether `family`'s nat table, as `ipt` lists its chains, routes Services (the module's
/// doc).
pub fn family_routes_services(ipt: &mut dyn Iptables, family: Family) -> Result<bool, ExecError> {
    let mut listed = String::new();
    for chain in ENTRIES.into_iter().chain([SERVICES]) {
        if let Some(text) = ipt.list_chain(family, Table::Nat, chain)? {
            listed.push_str(&text);
            listed.push('\n');
        }
    }
    let nat = Saved::parse(&listed);
    Ok(ENTRIES.iter().any(|c| nat.has_jump(c, SERVICES, "")) && nat.sends_a_service())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::Recorder;

    const ENTERED: &str = "-P PREROUTING ACCEPT\n\
        -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n";
    const OUTPUT: &str = "-P OUTPUT ACCEPT\n\
        -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n";
    const A_SERVICE: &str = "-N KUBE-SERVICES\n\
        -A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment \"default/web:tcp cluster IP\" -m tcp --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O\n\
        -A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n";
    const NO_SERVICE: &str = "-N KUBE-SERVICES\n\
        -A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n";

    #[test]
    fn rules_route_services_only_when_entered_and_holding_a_service() {
        // (what, PREROUTING, OUTPUT, KUBE-SERVICES, routes); `None`: no such chain.
        type Case = (
            &'static str,
            Option<&'static str>,
            Option<&'static str>,
            Option<&'static str>,
            bool,
        );
        let cases: [Case; 7] = [
            (
                "a node kpng or kube-proxy programmed",
                Some(ENTERED),
                Some(OUTPUT),
                Some(A_SERVICE),
                true,
            ),
            (
                "entered from OUTPUT only",
                Some("-P PREROUTING ACCEPT\n"),
                Some(OUTPUT),
                Some(A_SERVICE),
                true,
            ),
            (
                "entered from PREROUTING only",
                Some(ENTERED),
                None,
                Some(A_SERVICE),
                true,
            ),
            (
                "the skeleton without a Service",
                Some(ENTERED),
                Some(OUTPUT),
                Some(NO_SERVICE),
                false,
            ),
            (
                "jumps gone (someone deleted them)",
                Some("-P PREROUTING ACCEPT\n"),
                Some("-P OUTPUT ACCEPT\n"),
                Some(A_SERVICE),
                false,
            ),
            (
                "no KUBE-SERVICES chain",
                Some(ENTERED),
                Some(OUTPUT),
                None,
                false,
            ),
            ("a node never programmed", None, None, None, false),
        ];
        for (what, prerouting, output, services, routes) in cases {
            let mut ipt = Recorder::default();
            for (chain, text) in [
                ("PREROUTING", prerouting),
                ("OUTPUT", output),
                (SERVICES, services),
            ] {
                if let Some(text) = text {
                    ipt.0.lock().expect("recorder").chains.push((
                        Family::V4,
                        Table::Nat,
                        chain.to_string(),
                        text.to_string(),
                    ));
                }
            }
            assert_eq!(
                family_routes_services(&mut ipt, Family::V4).expect("listed"),
                routes,
                "{what}"
            );
        }
    }
}
