//! Reading `iptables-save` output: which chains exist and which rules the built-in chains hold.
//! Read at full syncs (to adopt or remove what a previous run left) and by `cleanup`, never on
//! the per-change path.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use crate::rules::{NODEPORTS, SERVICES};

/// One table as `iptables-save -t TABLE` prints it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Saved {
    /// Every chain, built-in or not.
    pub chains: BTreeSet<String>,
    /// Every rule as `(chain, rest of the line after "-A CHAIN ")`.
    pub rules: Vec<(String, String)>,
}

impl Saved {
    /// Parses the output (comments and `COMMIT` ignored).
    pub fn parse(text: &str) -> Saved {
        let mut saved = Saved::default();
        for line in text.lines() {
            if let Some(decl) = line.strip_prefix(':') {
                if let Some(name) = decl.split_whitespace().next() {
                    saved.chains.insert(name.to_owned());
                }
            } else if let Some(rule) = line.strip_prefix("-A ") {
                let (chain, spec) = rule.split_once(' ').unwrap_or((rule, ""));
                saved.rules.push((chain.to_owned(), spec.to_owned()));
            }
        }
        saved
    }

    /// Whether `chain` has a rule jumping to `target` with comment `comment` (any comment
    /// when empty): how a jump we ensure is recognised, whatever order iptables-save prints
    /// the matches in.
    pub fn has_jump(&self, chain: &str, target: &str, comment: &str) -> bool {
        let jump = format!("-j {target}");
        let tail = format!(" {jump}");
        self.rules.iter().any(|(c, spec)| {
            c == chain
                && (spec == &jump || spec.ends_with(&tail))
                && (comment.is_empty() || spec.contains(comment))
        })
    }
}

impl Saved {
    /// The UDP Service IP:ports (ClusterIPs, external and load-balancer IPs) that
    /// `KUBE-SERVICES` sends to a Service's chain: the rules kube-proxy's iptables mode and
    /// this backend write, `-A KUBE-SERVICES -d IP/32 -p udp … --dport PORT -j KUBE-SVC-…`.
    /// Node ports (`KUBE-NODEPORTS`) are not among them.
    pub fn udp_service_ips(&self) -> Vec<SocketAddr> {
        self.rules
            .iter()
            .filter(|(chain, _)| chain == SERVICES)
            .filter_map(|(_, spec)| udp_rule(spec))
            .filter_map(|(addr, port)| Some(SocketAddr::new(addr?, port)))
            .collect()
    }

    /// The UDP node ports that `KUBE-NODEPORTS` sends to a Service's chain
    /// (`-A KUBE-NODEPORTS -p udp … --dport PORT -j KUBE-EXT-…`).
    pub fn udp_node_ports(&self) -> Vec<u16> {
        self.rules
            .iter()
            .filter(|(chain, _)| chain == NODEPORTS)
            .filter_map(|(_, spec)| udp_rule(spec))
            .filter_map(|(addr, port)| addr.is_none().then_some(port))
            .collect()
    }
}

impl Saved {
    /// Whether `KUBE-SERVICES` sends at least one Service to its chain (`-j KUBE-SVC-…`,
    /// `KUBE-SVL-`, `KUBE-EXT-`, `KUBE-FW-`): the skeleton alone (its node-port rule, which a
    /// node with no Service has too) does not count.
    pub fn sends_a_service(&self) -> bool {
        self.rules
            .iter()
            .filter(|(chain, _)| chain == SERVICES)
            .any(|(_, spec)| {
                words(spec).windows(2).any(|w| {
                    matches!(w[0], "-j" | "--jump" | "-g" | "--goto") && to_service_chain(w[1])
                })
            })
    }
}

/// Whether a jump's target is a Service's chain (not an endpoint's).
fn to_service_chain(target: &str) -> bool {
    ["KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-"]
        .iter()
        .any(|p| target.starts_with(p))
}

/// The words of a rule outside double quotes: a comment never reads as a flag.
fn words(spec: &str) -> Vec<&str> {
    spec.split('"')
        .step_by(2)
        .flat_map(str::split_whitespace)
        .collect()
}

/// The destination of one rule that sends UDP to a Service's chain: its single address
/// (`-d IP/32` or `/128`; `None` without `-d`) and port; `None` for any other rule.
fn udp_rule(spec: &str) -> Option<(Option<IpAddr>, u16)> {
    let words = words(spec);
    let value = |flag: &str| {
        words
            .iter()
            .position(|w| *w == flag)
            .and_then(|i| words.get(i + 1).copied())
    };
    let target = value("-j")?;
    if !to_service_chain(target) || value("-p") != Some("udp") {
        return None;
    }
    let port: u16 = value("--dport")?.parse().ok()?;
    let Some(destination) = value("-d") else {
        return Some((None, port));
    };
    let (addr, prefix) = destination.split_once('/')?;
    let addr: IpAddr = addr.parse().ok()?;
    let whole = match addr {
        IpAddr::V4(_) => "32",
        IpAddr::V6(_) => "128",
    };
    (prefix == whole).then_some((Some(addr), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAVED: &str = "# Generated by iptables-save v1.8.9\n*nat\n\
        :PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n\
        :KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]\n\
        -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
        -A OUTPUT -j KUBE-SERVICES-OTHER\n\
        -A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment \"ns1/svc1:p80 cluster IP\" -m tcp --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O\n\
        COMMIT\n# Completed\n";

    #[test]
    fn parses_chains_and_rules() {
        let s = Saved::parse(SAVED);
        assert_eq!(
            s.chains.iter().map(String::as_str).collect::<Vec<_>>(),
            [
                "KUBE-SERVICES",
                "KUBE-SVC-XPGD46QRK7WJZT7O",
                "OUTPUT",
                "PREROUTING"
            ]
        );
        assert_eq!(s.rules.len(), 3);
        assert_eq!(s.rules[0].0, "PREROUTING");
    }

    #[test]
    fn udp_rules_to_service_chains_are_service_ips() {
        let text = "-N KUBE-SERVICES\n\
            -A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m comment --comment \"kube-system/kube-dns:dns cluster IP\" -m udp --dport 53 -j KUBE-SVC-TCOU7JCQXEZGVUNU\n\
            -A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment \"kube-system/kube-dns:dns-tcp cluster IP\" -m tcp --dport 53 -j KUBE-SVC-ERIFXISQEP7F7OF4\n\
            -A KUBE-SERVICES -d 192.0.2.7/32 -p udp -m comment --comment \"ns/lb:p loadbalancer IP\" -m udp --dport 700 -j KUBE-FW-AAAAAAAAAAAAAAAA\n\
            -A KUBE-SERVICES -d 198.51.100.0/24 -p udp -m udp --dport 9 -j KUBE-SVC-BBBBBBBBBBBBBBBB\n\
            -A KUBE-SERVICES -d 10.96.0.20/32 -p udp -m comment --comment \"-d 10.96.0.99/32 -j KUBE-SVC-X\" -m udp --dport 20 -j KUBE-MARK-MASQ\n\
            -A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n\
            -A KUBE-NODEPORTS -p udp -m udp --dport 30053 -j KUBE-EXT-CCCCCCCCCCCCCCCC\n\
            -A KUBE-SERVICES -d fd00:96::a/128 -p udp -m udp --dport 53 -j KUBE-SVL-CCCCCCCCCCCCCCCC\n";
        let want: Vec<SocketAddr> = ["10.96.0.10:53", "192.0.2.7:700", "[fd00:96::a]:53"]
            .iter()
            .map(|a| a.parse().expect("address"))
            .collect();
        let saved = Saved::parse(text);
        assert_eq!(saved.udp_service_ips(), want);
        assert_eq!(saved.udp_node_ports(), [30053]);
    }

    #[test]
    fn recognises_jumps_by_target_and_comment() {
        let s = Saved::parse(SAVED);
        assert!(s.has_jump("PREROUTING", "KUBE-SERVICES", "kubernetes service portals"));
        assert!(!s.has_jump("PREROUTING", "KUBE-SERVICES", "another comment"));
        // A jump to a chain whose name only starts like ours does not count.
        assert!(!s.has_jump("OUTPUT", "KUBE-SERVICES", ""));
        assert!(s.has_jump("OUTPUT", "KUBE-SERVICES-OTHER", ""));
    }
}
