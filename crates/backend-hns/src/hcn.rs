//! The HCN calls the backend makes, as a trait: the real `computenetwork.dll` on Windows
//! (`crate::system`, built on Windows only) and the [`crate::sim::Simulator`] everywhere implement it, so the
//! reconciliation logic is the same code in production and in tests.
//!
//! The trait is deliberately the *call* level (one method per HCN call kpng uses), not a
//! higher-level "apply": the number of calls is the cost that upstream's users suffered
//! (kubernetes#109162), and tests count them.

use crate::schema::{Endpoint, LoadBalancer, Network};

/// HRESULT of "Cannot create a file when that file already exists" (Win32 error 0xb7): HCN's
/// answer to creating an object that exists, e.g. after HNS restored its objects on restart.
pub const E_ALREADY_EXISTS: u32 = 0x8007_00b7;
/// HRESULT HNS returns when a load balancer's frontend (VIP, protocol, port) is taken.
pub const E_PORT_ALREADY_EXISTS: u32 = 0x803b_0013;
/// HRESULT of "Element not found": the object is gone (deleted out of band).
pub const E_NOT_FOUND: u32 = 0x8007_0490;
/// HRESULT of an invalid argument: HNS refuses a load balancer without endpoints this way.
pub const E_INVALID_ARG: u32 = 0x8007_0057;
/// HRESULT of RPC_S_SERVER_UNAVAILABLE: the HNS service is not running.
pub const E_UNAVAILABLE: u32 = 0x8007_06ba;

/// What an HCN call answered when it failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("HCN error 0x{code:08x}: {message}")]
pub struct HcnError {
    /// The HRESULT.
    pub code: u32,
    /// HCN's error record, or our description.
    pub message: String,
}

impl HcnError {
    /// An error with a code and a message.
    pub fn new(code: u32, message: impl Into<String>) -> HcnError {
        HcnError {
            code,
            message: message.into(),
        }
    }

    /// The object (or its frontend) exists already: adopt it rather than fail.
    pub fn is_conflict(&self) -> bool {
        self.code == E_ALREADY_EXISTS || self.code == E_PORT_ALREADY_EXISTS
    }

    /// The object is gone: a delete of it succeeded in effect.
    pub fn is_not_found(&self) -> bool {
        self.code == E_NOT_FOUND
    }

    /// HNS is not answering: the sync must fail and be retried, never read as "absent"
    /// (upstream #139519 reset its IDs that way).
    pub fn is_unavailable(&self) -> bool {
        // RPC server unavailable, RPC call failed, service not started (HNS stopped or
        // restarting).
        matches!(self.code, E_UNAVAILABLE | 0x8007_06be | 0x8007_0426)
    }
}

/// The HCN calls kpng makes. Every method is one call to HCN (one round trip, one unit of the
/// call budget in docs/backends.md).
pub trait Hcn: Send {
    /// `HcnEnumerateNetworks` + properties: every network.
    fn enumerate_networks(&mut self) -> Result<Vec<Network>, HcnError>;
    /// `HcnEnumerateEndpoints` + properties: every endpoint of every network.
    fn enumerate_endpoints(&mut self) -> Result<Vec<Endpoint>, HcnError>;
    /// `HcnEnumerateLoadBalancers` + properties: every load balancer.
    fn enumerate_load_balancers(&mut self) -> Result<Vec<LoadBalancer>, HcnError>;
    /// `HcnCreateEndpoint` on the endpoint's network; returns it with its new ID.
    fn create_endpoint(&mut self, endpoint: &Endpoint) -> Result<Endpoint, HcnError>;
    /// `HcnDeleteEndpoint`.
    fn delete_endpoint(&mut self, id: &str) -> Result<(), HcnError>;
    /// `HcnCreateLoadBalancer`; returns it with its new ID.
    fn create_load_balancer(&mut self, lb: &LoadBalancer) -> Result<LoadBalancer, HcnError>;
    /// `HcnDeleteLoadBalancer`.
    fn delete_load_balancer(&mut self, id: &str) -> Result<(), HcnError>;
    /// Called once when a sync begins (not an HCN call): the simulator adopts a state file
    /// changed by someone else here.
    fn begin_sync(&mut self) {}
    /// Called once when a sync ends, whatever its outcome (not an HCN call): the simulator
    /// writes its state file here.
    fn end_sync(&mut self) -> Result<(), HcnError> {
        Ok(())
    }
}
