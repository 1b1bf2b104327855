//! The HNS backend's own metrics: the HCN call budget as it is spent (`kpng_hns_calls_total`
//! by call and outcome), and what kpng holds in HNS now. Why: the cost upstream's users
//! suffered was the number of HCN calls (kubernetes#109162); an operator should see it.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::hcn::{Hcn, HcnError};
use crate::schema::{Endpoint, LoadBalancer, Network};

/// `call` and `outcome` labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabel {
    /// `create_load_balancer`, `enumerate_endpoints`, …
    pub call: &'static str,
    /// `ok`, `unavailable`, `conflict`, `not_found` or `error`.
    pub outcome: &'static str,
}

/// The backend's metrics (clones share the values).
#[derive(Debug, Clone, Default)]
pub struct HnsMetrics {
    /// HCN calls by call and outcome.
    pub calls: Family<CallLabel, Counter>,
    /// Load balancers kpng holds in HNS after the last sync.
    pub load_balancers: Gauge,
    /// Remote endpoints kpng holds in HNS after the last sync.
    pub remote_endpoints: Gauge,
}

impl HnsMetrics {
    /// Registers every metric under `kpng_hns_…`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kpng_hns_calls",
            "HCN calls made by the HNS backend, by call and outcome",
            self.calls.clone(),
        );
        registry.register(
            "kpng_hns_load_balancers",
            "HNS load balancers kpng holds after the last sync",
            self.load_balancers.clone(),
        );
        registry.register(
            "kpng_hns_remote_endpoints",
            "HNS remote endpoints kpng holds after the last sync",
            self.remote_endpoints.clone(),
        );
    }
}

/// An [`Hcn`] that counts its calls into [`HnsMetrics`].
pub struct Counted {
    inner: Box<dyn Hcn>,
    metrics: HnsMetrics,
}

impl Counted {
    /// Counts `inner`'s calls.
    pub fn new(inner: Box<dyn Hcn>, metrics: HnsMetrics) -> Counted {
        Counted { inner, metrics }
    }

    fn count<T>(&self, call: &'static str, result: Result<T, HcnError>) -> Result<T, HcnError> {
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) if e.is_unavailable() => "unavailable",
            Err(e) if e.is_conflict() => "conflict",
            Err(e) if e.is_not_found() => "not_found",
            Err(_) => "error",
        };
        self.metrics
            .calls
            .get_or_create(&CallLabel { call, outcome })
            .inc();
        result
    }
}

impl Hcn for Counted {
    fn enumerate_networks(&mut self) -> Result<Vec<Network>, HcnError> {
        let r = self.inner.enumerate_networks();
        self.count("enumerate_networks", r)
    }

    fn enumerate_endpoints(&mut self) -> Result<Vec<Endpoint>, HcnError> {
        let r = self.inner.enumerate_endpoints();
        self.count("enumerate_endpoints", r)
    }

    fn enumerate_load_balancers(&mut self) -> Result<Vec<LoadBalancer>, HcnError> {
        let r = self.inner.enumerate_load_balancers();
        self.count("enumerate_load_balancers", r)
    }

    fn create_endpoint(&mut self, endpoint: &Endpoint) -> Result<Endpoint, HcnError> {
        let r = self.inner.create_endpoint(endpoint);
        self.count("create_endpoint", r)
    }

    fn delete_endpoint(&mut self, id: &str) -> Result<(), HcnError> {
        let r = self.inner.delete_endpoint(id);
        self.count("delete_endpoint", r)
    }

    fn create_load_balancer(&mut self, lb: &LoadBalancer) -> Result<LoadBalancer, HcnError> {
        let r = self.inner.create_load_balancer(lb);
        self.count("create_load_balancer", r)
    }

    fn delete_load_balancer(&mut self, id: &str) -> Result<(), HcnError> {
        let r = self.inner.delete_load_balancer(id);
        self.count("delete_load_balancer", r)
    }

    fn begin_sync(&mut self) {
        self.inner.begin_sync();
    }

    fn end_sync(&mut self) -> Result<(), HcnError> {
        self.inner.end_sync()
    }
}
