//! [`render`] in named steps: what a port's rules depend on is worked out once ([`Port`]), then
//! each step writes one kind of rule, in the order kube-proxy writes them (the golden tests
//! compare the restore input byte for byte).

use std::net::IpAddr;

use kpng_model::{Endpoint, ServicePort};

use super::{
    EXTERNAL_SERVICES, MARK_MASQ, NODEPORTS, OwnChain, PROXY_FIREWALL, PortRules, RenderContext,
    SERVICES, SharedRule, Table, comment, probability, reject_target,
};
use crate::names::{self, PortChains};

/// The rules of one Service port: its rules in the shared chains (ClusterIP, external IPs,
/// load-balancer IPs, node port, health-check port), then its own chains (external,
/// firewall, the policy chains, the endpoints').
pub fn render(port: &ServicePort, ctx: &RenderContext) -> PortRules {
    let p = Port::new(port, ctx);
    let mut shared = Vec::new();
    p.cluster_ip(&mut shared);
    p.external_ips(&mut shared);
    p.load_balancer_ips(&mut shared);
    p.node_port(&mut shared);
    p.health_check_node_port(&mut shared);
    let mut chains = Vec::new();
    chains.extend(p.external_chain());
    chains.extend(p.firewall_chain());
    chains.extend(p.policy_chains());
    chains.extend(p.endpoint_chains());
    PortRules { shared, chains }
}

/// One Service port with what its rules depend on, worked out once for every step.
struct Port<'a> {
    port: &'a ServicePort,
    ctx: &'a RenderContext,
    /// `ns/name:port` (the comments' and chain hashes' name).
    name: String,
    /// `tcp`, `udp`, `sctp`.
    proto: &'static str,
    chains: PortChains,
    /// `-m tcp -p tcp`.
    l4: String,
    /// Whether the Service has any endpoint (ready or not) anywhere.
    has_endpoints: bool,
    /// Whether ClusterIP traffic has endpoints under the internal traffic policy.
    has_internal: bool,
    /// Whether external traffic has endpoints under the external traffic policy.
    has_external: bool,
    /// Whether the load-balancer IPs go through `KUBE-FW-` (source ranges).
    uses_firewall: bool,
    /// What the filter table does with traffic that reaches no endpoint: DROP when there are
    /// endpoints (none local), else the protocol's REJECT…
    filter_target: &'static str,
    /// … and the comment saying why.
    filter_why: String,
}

impl<'a> Port<'a> {
    fn new(port: &'a ServicePort, ctx: &'a RenderContext) -> Port<'a> {
        let name = names::service_port_name(&port.key);
        let proto = port.key.protocol.lower();
        let chains = PortChains::new(&name, proto);
        let has_endpoints = port.has_any_endpoints;
        let has_local = has_endpoints && !port.local_endpoints.is_empty();
        let has_internal = if port.internal_policy_local {
            has_local
        } else {
            has_endpoints
        };
        let has_external = if port.external_policy_local {
            has_local
        } else {
            has_endpoints
        };
        let uses_firewall =
            has_endpoints && !port.load_balancer_ips.is_empty() && !port.source_ranges.is_empty();
        let (filter_target, filter_why) = if has_endpoints {
            ("DROP", comment(&format!("{name} has no local endpoints")))
        } else {
            (
                reject_target(port.key.protocol),
                comment(&format!("{name} has no endpoints")),
            )
        };
        Port {
            port,
            ctx,
            l4: format!("-m {proto} -p {proto}"),
            name,
            proto,
            chains,
            has_endpoints,
            has_internal,
            has_external,
            uses_firewall,
            filter_target,
            filter_why,
        }
    }

    /// The chain ClusterIP traffic jumps to: `KUBE-SVL-` under a Local internal policy.
    fn internal_chain(&self) -> &str {
        if self.port.internal_policy_local {
            &self.chains.local
        } else {
            &self.chains.cluster
        }
    }

    /// The chain `KUBE-EXT-` ends in: `KUBE-SVL-` under a Local external policy.
    fn external_policy_chain(&self) -> &str {
        if self.port.external_policy_local {
            &self.chains.local
        } else {
            &self.chains.cluster
        }
    }

    /// Where load-balancer traffic goes: through `KUBE-FW-` when source ranges filter it.
    fn lb_chain(&self) -> &str {
        if self.uses_firewall {
            &self.chains.firewall
        } else {
            &self.chains.external
        }
    }

    /// `-m tcp -p tcp -d IP --dport PORT`.
    fn to(&self, ip: &IpAddr, port: u16) -> String {
        format!("{} -d {ip} --dport {port}", self.l4)
    }

    /// The filter rule refusing (or dropping) traffic to `ip` that reaches no endpoint.
    fn unserved(&self, ip: &IpAddr) -> String {
        format!(
            "{} {} -j {}",
            self.filter_why,
            self.to(ip, self.port.port),
            self.filter_target
        )
    }

    /// ClusterIP: into the internal chain, or refused in the filter table.
    fn cluster_ip(&self, out: &mut Vec<SharedRule>) {
        let to = self.to(&self.port.cluster_ip, self.port.port);
        let (table, spec) = if self.has_internal {
            let cluster_ip = comment(&format!("{} cluster IP", self.name));
            let spec = format!("{cluster_ip} {to} -j {}", self.internal_chain());
            (Table::Nat, spec)
        } else {
            let spec = format!("{} {to} -j {}", self.filter_why, self.filter_target);
            (Table::Filter, spec)
        };
        out.push(shared(table, SERVICES, spec));
    }

    /// External IPs: into `KUBE-EXT-`, refused where external traffic has no endpoint.
    fn external_ips(&self, out: &mut Vec<SharedRule>) {
        for ip in &self.port.external_ips {
            if self.has_endpoints {
                let spec = format!(
                    "{} {} -j {}",
                    comment(&format!("{} external IP", self.name)),
                    self.to(ip, self.port.port),
                    self.chains.external
                );
                out.push(shared(Table::Nat, SERVICES, spec));
            }
            if !self.has_external {
                out.push(shared(Table::Filter, EXTERNAL_SERVICES, self.unserved(ip)));
            }
        }
    }

    /// Load-balancer IPs: into `KUBE-FW-` or `KUBE-EXT-`, with the firewall's DROP for what
    /// the source ranges refuse; then, where external traffic has no endpoint, the refusals.
    fn load_balancer_ips(&self, out: &mut Vec<SharedRule>) {
        for ip in &self.port.load_balancer_ips {
            if self.has_endpoints {
                let spec = format!(
                    "{} {} -j {}",
                    comment(&format!("{} loadbalancer IP", self.name)),
                    self.to(ip, self.port.port),
                    self.lb_chain()
                );
                out.push(shared(Table::Nat, SERVICES, spec));
            }
            if self.uses_firewall {
                let spec = format!(
                    "{} {} -j DROP",
                    comment(&format!(
                        "{} traffic not accepted by {}",
                        self.name, self.chains.firewall
                    )),
                    self.to(ip, self.port.port)
                );
                out.push(shared(Table::Filter, PROXY_FIREWALL, spec));
            }
        }
        if !self.has_external {
            for ip in &self.port.load_balancer_ips {
                out.push(shared(Table::Filter, EXTERNAL_SERVICES, self.unserved(ip)));
            }
        }
    }

    /// Node port: into `KUBE-EXT-`, refused on local addresses where external traffic has no
    /// endpoint. (Loopback node ports need no rule of their own: the KUBE-SERVICES tail rule
    /// lets 127.0.0.0/8 into KUBE-NODEPORTS when they are enabled.)
    fn node_port(&self, out: &mut Vec<SharedRule>) {
        let Some(node_port) = self.port.node_port else {
            return;
        };
        let l4 = &self.l4;
        if self.has_endpoints {
            let spec = format!(
                "{} {l4} --dport {node_port} -j {}",
                comment(&self.name),
                self.chains.external
            );
            out.push(shared(Table::Nat, NODEPORTS, spec));
        }
        if !self.has_external {
            let spec = format!(
                "{} -m addrtype --dst-type LOCAL {l4} --dport {node_port} -j {}",
                self.filter_why, self.filter_target
            );
            out.push(shared(Table::Filter, EXTERNAL_SERVICES, spec));
        }
    }

    /// Health-check node port: accepted whether or not there are local endpoints.
    fn health_check_node_port(&self, out: &mut Vec<SharedRule>) {
        if let Some(hc) = self.port.health_check_node_port {
            let spec = format!(
                "{} -m tcp -p tcp --dport {hc} -j ACCEPT",
                comment(&format!("{} health check node port", self.name))
            );
            out.push(shared(Table::Filter, NODEPORTS, spec));
        }
    }

    /// `KUBE-EXT-`: masquerade (all external traffic under a Cluster policy; under a Local
    /// one, pods' traffic goes to the cluster chain and the node's own is masqueraded and
    /// routed there too), then the external policy chain.
    fn external_chain(&self) -> Option<OwnChain> {
        if !(self.has_endpoints && self.port.externally_accessible()) {
            return None;
        }
        let name = &self.name;
        let mut rules = Vec::new();
        if !self.port.external_policy_local {
            rules.push(format!(
                "{} -j {MARK_MASQ}",
                comment(&format!(
                    "masquerade traffic for {name} external destinations"
                ))
            ));
        } else {
            if let Some(local) = &self.ctx.local {
                rules.push(format!(
                    "{} {} -j {}",
                    comment(&format!("pod traffic for {name} external destinations")),
                    local.if_local,
                    self.chains.cluster
                ));
            }
            rules.push(format!(
                "{} -m addrtype --src-type LOCAL -j {MARK_MASQ}",
                comment(&format!(
                    "masquerade LOCAL traffic for {name} external destinations"
                ))
            ));
            rules.push(format!(
                "{} -m addrtype --src-type LOCAL -j {}",
                comment(&format!(
                    "route LOCAL traffic for {name} external destinations"
                )),
                self.chains.cluster
            ));
        }
        if self.has_external {
            rules.push(format!("-j {}", self.external_policy_chain()));
        }
        Some(OwnChain {
            name: self.chains.external.clone(),
            rules,
        })
    }

    /// `KUBE-FW-`: the load-balancer source ranges (and the load-balancer IPs themselves when
    /// a range holds the node's IP) into `KUBE-EXT-`; the rest is dropped by
    /// KUBE-PROXY-FIREWALL.
    fn firewall_chain(&self) -> Option<OwnChain> {
        if !self.uses_firewall {
            return None;
        }
        let lb_comment = comment(&format!("{} loadbalancer IP", self.name));
        let external = &self.chains.external;
        let mut rules = Vec::new();
        let mut allow_from_node = false;
        for cidr in &self.port.source_ranges {
            rules.push(format!("{lb_comment} -s {cidr} -j {external}"));
            if self.ctx.node_ip.is_some_and(|ip| cidr.contains(&ip)) {
                allow_from_node = true;
            }
        }
        if allow_from_node {
            for ip in &self.port.load_balancer_ips {
                rules.push(format!("{lb_comment} -s {ip} -j {external}"));
            }
        }
        rules.push(comment(&format!(
            "other traffic to {} will be dropped by KUBE-PROXY-FIREWALL",
            self.name
        )));
        Some(OwnChain {
            name: self.chains.firewall.clone(),
            rules,
        })
    }

    /// The masquerade of off-cluster (or, with `--masquerade-all`, all) ClusterIP traffic:
    /// the first rule of the internal chain.
    fn internal_masquerade(&self) -> Vec<String> {
        if !self.has_internal {
            return Vec::new();
        }
        let matched = format!(
            "{} {}",
            comment(&format!("{} cluster IP", self.name)),
            self.to(&self.port.cluster_ip, self.port.port)
        );
        if self.ctx.masquerade_all {
            vec![format!("{matched} -j {MARK_MASQ}")]
        } else if let Some(local) = &self.ctx.local {
            vec![format!("{matched} {} -j {MARK_MASQ}", local.if_not_local)]
        } else {
            Vec::new()
        }
    }

    /// `KUBE-SVC-` and `KUBE-SVL-`, where used; the internal one starts with the masquerade.
    fn policy_chains(&self) -> Vec<OwnChain> {
        let port = self.port;
        let mut out = Vec::new();
        for (used, chain, endpoints) in [
            (
                port.uses_cluster_endpoints(),
                &self.chains.cluster,
                &port.cluster_endpoints,
            ),
            (
                port.uses_local_endpoints(),
                &self.chains.local,
                &port.local_endpoints,
            ),
        ] {
            if used && !endpoints.is_empty() {
                let prefix = if chain == self.internal_chain() {
                    self.internal_masquerade()
                } else {
                    Vec::new()
                };
                out.push(self.policy_chain(chain, endpoints, prefix));
            }
        }
        out
    }

    /// A policy chain: after `prefix`, the affinity checks, then a random choice among its
    /// endpoints (kube-proxy's probabilities).
    fn policy_chain(&self, chain: &str, endpoints: &[Endpoint], prefix: Vec<String>) -> OwnChain {
        let name = &self.name;
        let mut rules = prefix;
        if let Some(a) = self.port.session_affinity {
            for ep in endpoints {
                let sep = self.endpoint_chain(ep);
                rules.push(format!(
                    "{} -m recent --name {sep} --rcheck --seconds {} --reap -j {sep}",
                    comment(&format!("{name} -> {ep}")),
                    a.timeout_seconds
                ));
            }
        }
        let n = endpoints.len();
        for (i, ep) in endpoints.iter().enumerate() {
            let statistic = if i + 1 < n {
                format!(
                    " -m statistic --mode random --probability {}",
                    probability(n - i)
                )
            } else {
                String::new()
            };
            rules.push(format!(
                "{}{statistic} -j {}",
                comment(&format!("{name} -> {ep}")),
                self.endpoint_chain(ep)
            ));
        }
        OwnChain {
            name: chain.to_owned(),
            rules,
        }
    }

    /// `KUBE-SEP-…` of `ep`.
    fn endpoint_chain(&self, ep: &Endpoint) -> String {
        names::endpoint_chain(&self.name, self.proto, ep)
    }

    /// The endpoint chains: hairpin masquerade, affinity record, DNAT.
    fn endpoint_chains(&self) -> Vec<OwnChain> {
        let c = comment(&self.name);
        let recent = |chain: &str| {
            if self.port.session_affinity.is_some() {
                format!(" -m recent --name {chain} --set")
            } else {
                String::new()
            }
        };
        self.port
            .all_reachable_endpoints()
            .into_iter()
            .map(|ep| {
                let name = self.endpoint_chain(&ep);
                let rules = vec![
                    format!("{c} -s {} -j {MARK_MASQ}", ep.ip),
                    format!(
                        "{c}{} {} -j DNAT --to-destination {}",
                        recent(&name),
                        self.l4,
                        ep.addr()
                    ),
                ];
                OwnChain { name, rules }
            })
            .collect()
    }
}

/// A rule in the shared chain `chain` of `table`.
fn shared(table: Table, chain: &'static str, spec: String) -> SharedRule {
    SharedRule { table, chain, spec }
}
