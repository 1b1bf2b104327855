//! A platform-free HCN: the observable rules of the Host Networking Service that the backend
//! must survive, so that the Windows proxy is tested on any OS (`--hcn-simulator FILE`, and
//! the tests of this crate).
//!
//! Rules kept (each was a bug upstream, see docs/windows.md):
//! - objects get GUIDs (deterministic here: the same calls give the same IDs, so a Linux and a
//!   Windows run compare equal);
//! - creating an endpoint whose IP exists on the network fails with 0xb7 ("already exists");
//! - creating a load balancer whose frontend (VIP, protocol, port) is taken fails with
//!   0x803b0013 ("port already exists");
//! - a load balancer without endpoints is refused, and so is one naming an unknown endpoint;
//! - deleting an unknown object fails with "not found";
//! - objects can vanish out of band ([`Simulator::delete_out_of_band`], or an edited state
//!   file), HNS can be unavailable, and a restart restores the same objects with the same IDs
//!   ([`Simulator::restart`]);
//! - faults can be injected per call kind, every call can be delayed, and calls are counted.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tracing::{info, warn};

use crate::hcn::{
    E_ALREADY_EXISTS, E_INVALID_ARG, E_NOT_FOUND, E_PORT_ALREADY_EXISTS, E_UNAVAILABLE, Hcn,
    HcnError,
};
use crate::schema::{Endpoint, LoadBalancer, Network, State};

/// One kind of HCN call, for counting and fault injection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Call {
    /// `HcnEnumerateNetworks`.
    EnumerateNetworks,
    /// `HcnEnumerateEndpoints`.
    EnumerateEndpoints,
    /// `HcnEnumerateLoadBalancers`.
    EnumerateLoadBalancers,
    /// `HcnCreateEndpoint`.
    CreateEndpoint,
    /// `HcnDeleteEndpoint`.
    DeleteEndpoint,
    /// `HcnCreateLoadBalancer`.
    CreateLoadBalancer,
    /// `HcnDeleteLoadBalancer`.
    DeleteLoadBalancer,
}

/// How many calls of each kind were made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Calls(pub BTreeMap<Call, u64>);

impl Calls {
    /// All calls.
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// Calls of one kind.
    pub fn of(&self, call: Call) -> u64 {
        self.0.get(&call).copied().unwrap_or(0)
    }
}

#[derive(Debug, Default)]
struct Inner {
    state: State,
    next_id: u64,
    calls: Calls,
    delay: Duration,
    unavailable: bool,
    faults: VecDeque<(Call, u32)>,
    file: Option<PathBuf>,
    /// The file's content as last written or adopted: anything else there was written by
    /// someone else and becomes HCN's state.
    file_bytes: Option<Vec<u8>>,
}

/// The simulator. Cloning gives another handle on the same HCN, so a test keeps one while the
/// backend owns the other.
#[derive(Debug, Clone, Default)]
pub struct Simulator {
    inner: Arc<Mutex<Inner>>,
}

/// Why the simulator's state file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// It exists but cannot be read.
    #[error("reading HCN simulator state {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// It is not an HCN state document.
    #[error(
        "HCN simulator state {path} is not {{\"Networks\": [...], \"Endpoints\": [...], \"LoadBalancers\": [...]}}: {source}"
    )]
    Parse {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
}

impl Simulator {
    /// An HCN holding `state`.
    pub fn new(state: State) -> Simulator {
        let sim = Simulator::default();
        sim.lock().state = state;
        sim
    }

    /// The simulator of `to-local hns --hcn-simulator FILE`: FILE, if it exists, is the initial
    /// state (the CNI's networks and local endpoints); otherwise HCN starts with
    /// `default_network` alone. The state is written back to FILE after every sync, and a FILE
    /// changed by someone else is adopted as HCN's state at the next sync.
    pub fn with_file(path: &Path, default_network: Network) -> Result<Simulator, FileError> {
        let (state, bytes) = match std::fs::read(path) {
            Ok(bytes) => {
                let state = parse(path, &bytes)?;
                (state, Some(bytes))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (
                State {
                    networks: vec![default_network],
                    ..State::default()
                },
                None,
            ),
            Err(source) => {
                return Err(FileError::Read {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        let sim = Simulator::new(state);
        {
            let mut inner = sim.lock();
            inner.file = Some(path.to_path_buf());
            inner.file_bytes = bytes;
        }
        Ok(sim)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves a consistent state (every mutation is one
        // statement), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of the whole state.
    pub fn state(&self) -> State {
        self.lock().state.clone()
    }

    /// Replaces the whole state (an out-of-band edit).
    pub fn set_state(&self, state: State) {
        self.lock().state = state;
    }

    /// The calls made so far.
    pub fn calls(&self) -> Calls {
        self.lock().calls.clone()
    }

    /// Forgets the calls made so far.
    pub fn reset_calls(&self) {
        self.lock().calls = Calls::default();
    }

    /// Makes every call take `delay` (HNS is slow: milliseconds per call on a busy node).
    pub fn set_delay(&self, delay: Duration) {
        self.lock().delay = delay;
    }

    /// HNS stops (every call fails with RPC_S_SERVER_UNAVAILABLE) or comes back.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.lock().unavailable = unavailable;
    }

    /// HNS restarts: unavailable until [`Simulator::set_unavailable`]`(false)`, then with the
    /// same objects and IDs it had (HNS restores its state).
    pub fn restart(&self) {
        self.set_unavailable(true);
    }

    /// The next call of kind `call` fails with `code` (faults queue up in order).
    pub fn fail_next(&self, call: Call, code: u32) {
        self.lock().faults.push_back((call, code));
    }

    /// Removes an object (load balancer or endpoint) behind the proxy's back, as
    /// `hnsdiag delete` or a CNI restart would. Returns whether it existed.
    pub fn delete_out_of_band(&self, id: &str) -> bool {
        let mut inner = self.lock();
        let before = inner.state.load_balancers.len() + inner.state.endpoints.len();
        inner.state.load_balancers.retain(|l| !same(&l.id, id));
        inner.state.endpoints.retain(|e| !same(&e.id, id));
        before != inner.state.load_balancers.len() + inner.state.endpoints.len()
    }
}

/// GUIDs compare without regard to case or braces, as HCN's.
fn same(a: &str, b: &str) -> bool {
    crate::schema::normalize_id(a) == crate::schema::normalize_id(b)
}

fn parse(path: &Path, bytes: &[u8]) -> Result<State, FileError> {
    serde_json::from_slice(bytes).map_err(|source| FileError::Parse {
        path: path.to_path_buf(),
        source,
    })
}

impl Inner {
    /// Counts the call, waits the per-call delay, and answers an injected fault or
    /// unavailability.
    fn call(&mut self, call: Call) -> Result<(), HcnError> {
        *self.calls.0.entry(call).or_default() += 1;
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        if self.unavailable {
            return Err(HcnError::new(
                E_UNAVAILABLE,
                "the HNS service is not available (simulated)",
            ));
        }
        if let Some(pos) = self.faults.iter().position(|(c, _)| *c == call)
            && let Some((_, code)) = self.faults.remove(pos)
        {
            return Err(HcnError::new(code, format!("injected fault on {call:?}")));
        }
        Ok(())
    }

    /// A GUID no object has: deterministic, so two runs of the same syncs agree.
    fn new_id(&mut self) -> String {
        loop {
            self.next_id += 1;
            let id = format!("00000000-0000-4000-8000-{:012x}", self.next_id);
            let taken = self.state.networks.iter().any(|n| same(&n.id, &id))
                || self.state.endpoints.iter().any(|e| same(&e.id, &id))
                || self.state.load_balancers.iter().any(|l| same(&l.id, &id));
            if !taken {
                return id;
            }
        }
    }
}

/// The frontends a load balancer claims: (VIP or "" for all node addresses, protocol, port,
/// IPv6): a node-port load balancer of each family has one.
fn frontends(lb: &LoadBalancer) -> Vec<(String, u32, u16, bool)> {
    let v6 = lb.flags & crate::schema::lb_flags::IPV6 != 0;
    let vips: Vec<String> = if lb.frontend_vips.is_empty() {
        vec![String::new()]
    } else {
        lb.frontend_vips.clone()
    };
    let mut out = Vec::new();
    for vip in vips {
        for pm in &lb.port_mappings {
            out.push((vip.clone(), pm.protocol, pm.external_port, v6));
        }
    }
    out
}

impl Hcn for Simulator {
    fn enumerate_networks(&mut self) -> Result<Vec<Network>, HcnError> {
        let mut inner = self.lock();
        inner.call(Call::EnumerateNetworks)?;
        Ok(inner.state.networks.clone())
    }

    fn enumerate_endpoints(&mut self) -> Result<Vec<Endpoint>, HcnError> {
        let mut inner = self.lock();
        inner.call(Call::EnumerateEndpoints)?;
        Ok(inner.state.endpoints.clone())
    }

    fn enumerate_load_balancers(&mut self) -> Result<Vec<LoadBalancer>, HcnError> {
        let mut inner = self.lock();
        inner.call(Call::EnumerateLoadBalancers)?;
        Ok(inner.state.load_balancers.clone())
    }

    fn create_endpoint(&mut self, endpoint: &Endpoint) -> Result<Endpoint, HcnError> {
        let mut inner = self.lock();
        inner.call(Call::CreateEndpoint)?;
        if !inner
            .state
            .networks
            .iter()
            .any(|n| same(&n.id, &endpoint.host_compute_network))
        {
            return Err(HcnError::new(
                E_NOT_FOUND,
                format!("network {} not found", endpoint.host_compute_network),
            ));
        }
        let ips: Vec<_> = endpoint.ips().collect();
        if ips.is_empty() {
            return Err(HcnError::new(E_INVALID_ARG, "endpoint without an IP"));
        }
        if let Some(other) = inner.state.endpoints.iter().find(|e| {
            same(&e.host_compute_network, &endpoint.host_compute_network)
                && e.ips().any(|ip| ips.contains(&ip))
        }) {
            return Err(HcnError::new(
                E_ALREADY_EXISTS,
                format!("an endpoint with this IP exists ({})", other.id),
            ));
        }
        let mut created = endpoint.clone();
        created.id = inner.new_id();
        inner.state.endpoints.push(created.clone());
        Ok(created)
    }

    fn delete_endpoint(&mut self, id: &str) -> Result<(), HcnError> {
        let mut inner = self.lock();
        inner.call(Call::DeleteEndpoint)?;
        let before = inner.state.endpoints.len();
        inner.state.endpoints.retain(|e| !same(&e.id, id));
        if inner.state.endpoints.len() == before {
            return Err(HcnError::new(
                E_NOT_FOUND,
                format!("endpoint {id} not found"),
            ));
        }
        Ok(())
    }

    fn create_load_balancer(&mut self, lb: &LoadBalancer) -> Result<LoadBalancer, HcnError> {
        let mut inner = self.lock();
        inner.call(Call::CreateLoadBalancer)?;
        if lb.host_compute_endpoints.is_empty() {
            return Err(HcnError::new(
                E_INVALID_ARG,
                "a load balancer needs at least one endpoint",
            ));
        }
        if let Some(missing) = lb
            .host_compute_endpoints
            .iter()
            .find(|id| !inner.state.endpoints.iter().any(|e| same(&e.id, id)))
        {
            return Err(HcnError::new(
                E_NOT_FOUND,
                format!("endpoint {missing} not found"),
            ));
        }
        let wanted = frontends(lb);
        if let Some(other) = inner
            .state
            .load_balancers
            .iter()
            .find(|o| frontends(o).iter().any(|f| wanted.contains(f)))
        {
            return Err(HcnError::new(
                E_PORT_ALREADY_EXISTS,
                format!("port already exists (load balancer {})", other.id),
            ));
        }
        let mut created = lb.clone();
        created.id = inner.new_id();
        inner.state.load_balancers.push(created.clone());
        Ok(created)
    }

    fn delete_load_balancer(&mut self, id: &str) -> Result<(), HcnError> {
        let mut inner = self.lock();
        inner.call(Call::DeleteLoadBalancer)?;
        let before = inner.state.load_balancers.len();
        inner.state.load_balancers.retain(|l| !same(&l.id, id));
        if inner.state.load_balancers.len() == before {
            return Err(HcnError::new(
                E_NOT_FOUND,
                format!("load balancer {id} not found"),
            ));
        }
        Ok(())
    }

    fn begin_sync(&mut self) {
        let mut inner = self.lock();
        let Some(path) = inner.file.clone() else {
            return;
        };
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => {
                warn!("reading HCN simulator state {}: {e}", path.display());
                return;
            }
        };
        if inner.file_bytes.as_deref() == Some(&bytes[..]) {
            return;
        }
        match parse(&path, &bytes) {
            Ok(state) => {
                info!(
                    "{} changed out of band: adopted as HCN's state",
                    path.display()
                );
                inner.state = state;
                inner.file_bytes = Some(bytes);
            }
            Err(e) => warn!("{e}; keeping the simulated HCN state"),
        }
    }

    fn end_sync(&mut self) -> Result<(), HcnError> {
        let mut inner = self.lock();
        let Some(path) = inner.file.clone() else {
            return Ok(());
        };
        let mut bytes = serde_json::to_vec_pretty(&inner.state)
            .map_err(|e| HcnError::new(E_INVALID_ARG, format!("serializing state: {e}")))?;
        bytes.push(b'\n');
        // Unchanged and still there: nothing to write (a removed file is written again).
        if inner.file_bytes.as_deref() == Some(&bytes[..]) && path.exists() {
            return Ok(());
        }
        write_atomically(&path, &bytes).map_err(|e| {
            HcnError::new(
                E_UNAVAILABLE,
                format!("writing HCN simulator state {}: {e}", path.display()),
            )
        })?;
        inner.file_bytes = Some(bytes);
        Ok(())
    }
}

/// Writes `bytes` to a temporary file beside `path` and renames it over `path`, so that a
/// reader never sees half a state.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}
