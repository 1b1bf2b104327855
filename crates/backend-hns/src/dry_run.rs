//! `to-local hns --dry-run`: the HCN calls kpng would make, printed, none made.
//!
//! Why a wrapper and not a flag in the backend: the backend's plan depends on what HCN holds
//! (the CNI's endpoints of this node's pods, the load balancers already there), so a dry run
//! must read the real HCN (or the simulator's file) to plan what a real run would do, and must
//! then answer the backend's later reads with what the dry run would have built, as the
//! nftables dry run checks each transaction against the table it would have built. So the
//! state is read once from `source` (reads only: enumerates, never a change) into an in-memory
//! [`Simulator`], which then takes every change call; each change is printed, grouped per sync,
//! as the nftables and iptables dry runs print their transactions.
//!
//! A dry run that could not read HCN planned against nothing: the CNI's endpoints missing, it
//! warned about every local endpoint ("not created by the CNI yet") and, applying to an
//! invisible simulator, printed no plan at all.

use std::io::Write;

use crate::hcn::{Hcn, HcnError};
use crate::plan::Frontend;
use crate::schema::{Endpoint, LoadBalancer, Network, State};
use crate::sim::Simulator;

/// An [`Hcn`] that reads `source` once and then plans in memory, printing each change.
pub struct DryRunHcn {
    source: Box<dyn Hcn>,
    plan: Simulator,
    seeded: bool,
    /// The calls of the current sync, printed together when it ends.
    pending: Vec<String>,
    out: Box<dyn Write + Send>,
}

impl DryRunHcn {
    /// A dry run over `source` (the system's HCN, or a simulator), printing to `out`.
    pub fn new(source: Box<dyn Hcn>, out: Box<dyn Write + Send>) -> DryRunHcn {
        DryRunHcn {
            source,
            plan: Simulator::default(),
            seeded: false,
            pending: Vec::new(),
            out,
        }
    }

    /// Reads `source` once, before the first read of the plan: HCN's state as a real run
    /// would find it. A failure (HNS unavailable) is the read's failure, and the next read
    /// tries again.
    fn seed(&mut self) -> Result<(), HcnError> {
        if self.seeded {
            return Ok(());
        }
        let state = State {
            networks: self.source.enumerate_networks()?,
            endpoints: self.source.enumerate_endpoints()?,
            load_balancers: self.source.enumerate_load_balancers()?,
        };
        self.plan.set_state(state);
        self.seeded = true;
        Ok(())
    }

    /// The IPs of the plan's endpoints with these IDs, sorted, for a readable line.
    fn endpoint_ips(&self, ids: &[String]) -> String {
        let state = self.plan.state();
        let mut ips: Vec<String> = ids
            .iter()
            .map(|id| {
                state
                    .endpoints
                    .iter()
                    .find(|e| e.id.eq_ignore_ascii_case(id))
                    .and_then(|e| e.ips().next())
                    .map_or_else(|| id.clone(), |ip| ip.to_string())
            })
            .collect();
        ips.sort_by_key(|s| (s.parse::<std::net::IpAddr>().ok(), s.clone()));
        ips.join(", ")
    }

    fn print(&mut self, what: String, request: Option<String>) {
        self.pending.push(format!("# {what}"));
        if let Some(request) = request {
            self.pending.push(request);
        }
    }
}

/// An object as JSON, as HCN's create call receives it.
fn json(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| format!("(not serializable: {e})"))
}

fn describe_lb(lb: &LoadBalancer) -> String {
    Frontend::of(lb).map_or_else(|| "a load balancer".to_string(), |f| f.to_string())
}

impl Hcn for DryRunHcn {
    fn enumerate_networks(&mut self) -> Result<Vec<Network>, HcnError> {
        self.seed()?;
        self.plan.enumerate_networks()
    }

    fn enumerate_endpoints(&mut self) -> Result<Vec<Endpoint>, HcnError> {
        self.seed()?;
        self.plan.enumerate_endpoints()
    }

    fn enumerate_load_balancers(&mut self) -> Result<Vec<LoadBalancer>, HcnError> {
        self.seed()?;
        self.plan.enumerate_load_balancers()
    }

    fn create_endpoint(&mut self, endpoint: &Endpoint) -> Result<Endpoint, HcnError> {
        let created = self.plan.create_endpoint(endpoint)?;
        let ips: Vec<String> = endpoint.ips().map(|ip| ip.to_string()).collect();
        let kind = if endpoint.is_remote() {
            "remote endpoint"
        } else {
            "endpoint"
        };
        self.print(
            format!("HcnCreateEndpoint: {kind} {}", ips.join(", ")),
            Some(json(endpoint)),
        );
        Ok(created)
    }

    fn delete_endpoint(&mut self, id: &str) -> Result<(), HcnError> {
        let what = self.endpoint_ips(&[id.to_string()]);
        self.plan.delete_endpoint(id)?;
        self.print(format!("HcnDeleteEndpoint: {what} ({id})"), None);
        Ok(())
    }

    fn create_load_balancer(&mut self, lb: &LoadBalancer) -> Result<LoadBalancer, HcnError> {
        let created = self.plan.create_load_balancer(lb)?;
        let endpoints = self.endpoint_ips(&lb.host_compute_endpoints);
        self.print(
            format!("HcnCreateLoadBalancer: {} → {endpoints}", describe_lb(lb)),
            Some(json(lb)),
        );
        Ok(created)
    }

    fn delete_load_balancer(&mut self, id: &str) -> Result<(), HcnError> {
        let existing = self
            .plan
            .state()
            .load_balancers
            .into_iter()
            .find(|l| l.id.eq_ignore_ascii_case(id));
        self.plan.delete_load_balancer(id)?;
        let what = existing.map_or_else(|| "a load balancer".to_string(), |l| describe_lb(&l));
        self.print(format!("HcnDeleteLoadBalancer: {what} ({id})"), None);
        Ok(())
    }

    fn begin_sync(&mut self) {
        self.pending.clear();
    }

    /// Prints the sync's calls, if it would make any (a sync with nothing to change prints
    /// nothing, as the nftables dry run prints no empty transaction).
    fn end_sync(&mut self) -> Result<(), HcnError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let mut text = format!(
            "# kpng --dry-run: the HCN calls of this sync ({}), none made\n",
            self.pending
                .iter()
                .filter(|l| l.starts_with("# Hcn"))
                .count()
        );
        for line in self.pending.drain(..) {
            text.push_str(&line);
            text.push('\n');
        }
        // Printing is the dry run's whole output: a closed stdout is its failure.
        self.out
            .write_all(text.as_bytes())
            .and_then(|()| self.out.flush())
            .map_err(|e| {
                HcnError::new(
                    crate::hcn::E_INVALID_ARG,
                    format!("printing the dry run: {e}"),
                )
            })
    }
}
