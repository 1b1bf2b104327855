//! The real HCN: `computenetwork.dll` through the `windows` crate (Windows only, the default of
//! `to-local hns` there: `--hcn system`). Every call takes and returns the JSON documents of
//! [`crate::schema`].
//!
//! What one [`Hcn`] method costs in DLL calls: an enumerate is `HcnEnumerate*` (IDs) plus, per
//! object, `HcnOpen*` + `HcnQuery*Properties` + `HcnClose*` (as hcsshim does; these are reads);
//! a create is `HcnCreate*` + `HcnQuery*Properties` + `HcnClose*`; a delete is `HcnDelete*`.
//!
//! With `service`, the only modules of kpng allowed `unsafe`: FFI calls whose buffers HCN
//! allocates and the caller frees with `CoTaskMemFree`.
#![allow(unsafe_code)]

use serde::Serialize;
use serde::de::DeserializeOwned;
use windows::Win32::System::Com::CoTaskMemFree;
use windows::Win32::System::HostComputeNetwork as api;
use windows::core::{GUID, HSTRING, PWSTR};

use crate::hcn::{E_INVALID_ARG, Hcn, HcnError};
use crate::schema::{Endpoint, LoadBalancer, Network};

/// The query every properties call sends: schema 2.0.
const QUERY: &str = r#"{"SchemaVersion":{"Major":2,"Minor":0},"Flags":0}"#;

/// The system's HCN.
#[derive(Debug, Default)]
pub struct SystemHcn;

impl SystemHcn {
    /// The HCN of this Windows host.
    pub fn new() -> SystemHcn {
        SystemHcn
    }
}

/// Takes ownership of a string HCN allocated: copies it and frees it.
fn take(p: PWSTR) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: HCN returns a NUL-terminated UTF-16 string allocated with CoTaskMemAlloc; it is
    // read once and freed once, here.
    let s = unsafe { p.to_string() }.ok();
    unsafe { CoTaskMemFree(Some(p.0 as *const _)) };
    s
}

/// The error of a failed call: its HRESULT and HCN's error record.
fn error(e: windows::core::Error, record: PWSTR, what: &str) -> HcnError {
    let record = take(record).unwrap_or_default();
    HcnError::new(
        e.code().0 as u32,
        format!("{what}: {} {record}", e.message()),
    )
}

fn guid(id: &str) -> Result<GUID, HcnError> {
    GUID::try_from(id.trim_matches(|c| c == '{' || c == '}'))
        .map_err(|_| HcnError::new(E_INVALID_ARG, format!("{id:?} is not a GUID")))
}

fn json<T: Serialize>(value: &T) -> Result<HSTRING, HcnError> {
    serde_json::to_string(value)
        .map(|s| HSTRING::from(s.as_str()))
        .map_err(|e| HcnError::new(E_INVALID_ARG, e.to_string()))
}

fn parse<T: DeserializeOwned>(text: &str, what: &str) -> Result<T, HcnError> {
    serde_json::from_str(text)
        .map_err(|e| HcnError::new(E_INVALID_ARG, format!("{what}: unexpected JSON: {e}")))
}

/// The kinds of object, with their open/query/close functions.
#[derive(Clone, Copy)]
enum Kind {
    Network,
    Endpoint,
    LoadBalancer,
}

/// Opens an object by ID, reads its properties and closes it.
fn query(kind: Kind, id: &str) -> Result<String, HcnError> {
    let g = guid(id)?;
    let mut handle: *mut core::ffi::c_void = std::ptr::null_mut();
    let mut record = PWSTR::null();
    // SAFETY: `g`, `handle` and `record` outlive the call; HCN fills `handle` on success.
    let opened = unsafe {
        match kind {
            Kind::Network => api::HcnOpenNetwork(&g, &mut handle, Some(&mut record)),
            Kind::Endpoint => api::HcnOpenEndpoint(&g, &mut handle, Some(&mut record)),
            Kind::LoadBalancer => api::HcnOpenLoadBalancer(&g, &mut handle, Some(&mut record)),
        }
    };
    opened.map_err(|e| error(e, record, "open"))?;
    let result = properties(kind, handle);
    close(kind, handle);
    result
}

fn properties(kind: Kind, handle: *mut core::ffi::c_void) -> Result<String, HcnError> {
    let mut props = PWSTR::null();
    let mut record = PWSTR::null();
    let q = HSTRING::from(QUERY);
    // SAFETY: `handle` is an open handle of `kind`; the buffers outlive the call.
    let r = unsafe {
        match kind {
            Kind::Network => {
                api::HcnQueryNetworkProperties(handle, &q, &mut props, Some(&mut record))
            }
            Kind::Endpoint => {
                api::HcnQueryEndpointProperties(handle, &q, &mut props, Some(&mut record))
            }
            Kind::LoadBalancer => {
                api::HcnQueryLoadBalancerProperties(handle, &q, &mut props, Some(&mut record))
            }
        }
    };
    r.map_err(|e| error(e, record, "query properties"))?;
    take(props).ok_or_else(|| HcnError::new(E_INVALID_ARG, "no properties returned"))
}

fn close(kind: Kind, handle: *mut core::ffi::c_void) {
    if handle.is_null() {
        return;
    }
    // SAFETY: `handle` was opened by HcnOpen*/HcnCreate* of `kind` and is closed once.
    let _ = unsafe {
        match kind {
            Kind::Network => api::HcnCloseNetwork(handle),
            Kind::Endpoint => api::HcnCloseEndpoint(handle),
            Kind::LoadBalancer => api::HcnCloseLoadBalancer(handle),
        }
    };
}

/// Every object of a kind: the enumerate answers IDs (or, on some builds, whole objects).
fn enumerate<T: DeserializeOwned>(kind: Kind) -> Result<Vec<T>, HcnError> {
    let mut list = PWSTR::null();
    let mut record = PWSTR::null();
    let q = HSTRING::from(QUERY);
    // SAFETY: the buffers outlive the call; HCN allocates `list`.
    let r = unsafe {
        match kind {
            Kind::Network => api::HcnEnumerateNetworks(&q, &mut list, Some(&mut record)),
            Kind::Endpoint => api::HcnEnumerateEndpoints(&q, &mut list, Some(&mut record)),
            Kind::LoadBalancer => api::HcnEnumerateLoadBalancers(&q, &mut list, Some(&mut record)),
        }
    };
    r.map_err(|e| error(e, record, "enumerate"))?;
    let text = take(list).unwrap_or_else(|| "[]".into());
    let items: Vec<serde_json::Value> = parse(&text, "enumerate")?;
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        match item {
            serde_json::Value::String(id) => match query(kind, &id) {
                Ok(props) => out.push(parse(&props, "properties")?),
                // Deleted between the enumerate and the open: not there.
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            },
            other => out.push(
                serde_json::from_value(other)
                    .map_err(|e| HcnError::new(E_INVALID_ARG, e.to_string()))?,
            ),
        }
    }
    Ok(out)
}

impl Hcn for SystemHcn {
    fn enumerate_networks(&mut self) -> Result<Vec<Network>, HcnError> {
        enumerate(Kind::Network)
    }

    fn enumerate_endpoints(&mut self) -> Result<Vec<Endpoint>, HcnError> {
        enumerate(Kind::Endpoint)
    }

    fn enumerate_load_balancers(&mut self) -> Result<Vec<LoadBalancer>, HcnError> {
        enumerate(Kind::LoadBalancer)
    }

    fn create_endpoint(&mut self, endpoint: &Endpoint) -> Result<Endpoint, HcnError> {
        // Endpoints are created on an open network.
        let net = guid(&endpoint.host_compute_network)?;
        let mut network: *mut core::ffi::c_void = std::ptr::null_mut();
        let mut record = PWSTR::null();
        // SAFETY: buffers outlive the call.
        unsafe { api::HcnOpenNetwork(&net, &mut network, Some(&mut record)) }
            .map_err(|e| error(e, record, "open network"))?;
        let settings = json(endpoint);
        let result = settings.and_then(|settings| {
            let id = GUID::zeroed();
            let mut handle: *mut core::ffi::c_void = std::ptr::null_mut();
            let mut record = PWSTR::null();
            // SAFETY: `network` is open; buffers outlive the call.
            unsafe {
                api::HcnCreateEndpoint(network, &id, &settings, &mut handle, Some(&mut record))
            }
            .map_err(|e| error(e, record, "create endpoint"))?;
            let props = properties(Kind::Endpoint, handle);
            close(Kind::Endpoint, handle);
            parse(&props?, "created endpoint")
        });
        close(Kind::Network, network);
        result
    }

    fn delete_endpoint(&mut self, id: &str) -> Result<(), HcnError> {
        let g = guid(id)?;
        let mut record = PWSTR::null();
        // SAFETY: buffers outlive the call.
        unsafe { api::HcnDeleteEndpoint(&g, Some(&mut record)) }
            .map_err(|e| error(e, record, "delete endpoint"))
    }

    fn create_load_balancer(&mut self, lb: &LoadBalancer) -> Result<LoadBalancer, HcnError> {
        let settings = json(lb)?;
        let id = GUID::zeroed();
        let mut handle: *mut core::ffi::c_void = std::ptr::null_mut();
        let mut record = PWSTR::null();
        // SAFETY: buffers outlive the call.
        unsafe { api::HcnCreateLoadBalancer(&id, &settings, &mut handle, Some(&mut record)) }
            .map_err(|e| error(e, record, "create load balancer"))?;
        let props = properties(Kind::LoadBalancer, handle);
        close(Kind::LoadBalancer, handle);
        parse(&props?, "created load balancer")
    }

    fn delete_load_balancer(&mut self, id: &str) -> Result<(), HcnError> {
        let g = guid(id)?;
        let mut record = PWSTR::null();
        // SAFETY: buffers outlive the call.
        unsafe { api::HcnDeleteLoadBalancer(&g, Some(&mut record)) }
            .map_err(|e| error(e, record, "delete load balancer"))
    }
}

/// `--windows-priority-class`: sets this process's priority class (kubernetes#96935), one of
/// `IDLE`, `BELOW_NORMAL`, `NORMAL`, `ABOVE_NORMAL`, `HIGH`, `REALTIME` (case-insensitive, with
/// or without `_PRIORITY_CLASS`).
pub fn set_priority_class(name: &str) -> Result<(), String> {
    use windows::Win32::System::Threading as t;
    let upper = name.to_ascii_uppercase();
    let class = match upper.trim_end_matches("_PRIORITY_CLASS") {
        "IDLE" => t::IDLE_PRIORITY_CLASS,
        "BELOW_NORMAL" => t::BELOW_NORMAL_PRIORITY_CLASS,
        "NORMAL" => t::NORMAL_PRIORITY_CLASS,
        "ABOVE_NORMAL" => t::ABOVE_NORMAL_PRIORITY_CLASS,
        "HIGH" => t::HIGH_PRIORITY_CLASS,
        "REALTIME" => t::REALTIME_PRIORITY_CLASS,
        other => return Err(format!("unknown priority class {other:?}")),
    };
    // SAFETY: the pseudo-handle of the current process needs no closing.
    unsafe { t::SetPriorityClass(t::GetCurrentProcess(), class) }.map_err(|e| e.to_string())
}

/// A named mutex held for the life of the process: Windows' way to say "one of us per node",
/// as the abstract socket is on Linux. The system releases it when the process ends, however
/// it ends, so nothing stale is left behind.
#[derive(Debug)]
pub struct NamedMutex(windows::Win32::Foundation::HANDLE);

// SAFETY: a mutex handle may be used and closed from any thread.
unsafe impl Send for NamedMutex {}
// SAFETY: the handle is only closed in `drop`, which takes `&mut self`.
unsafe impl Sync for NamedMutex {}

impl NamedMutex {
    /// Creates the mutex `name` (`Global\kpng-hns`) if nobody holds it: `Ok(None)` when
    /// another process already does.
    pub fn acquire(name: &str) -> Result<Option<NamedMutex>, String> {
        use windows::Win32::Foundation::{CloseHandle, ERROR_ALREADY_EXISTS, GetLastError};
        use windows::Win32::System::Threading::CreateMutexW;
        let wide = HSTRING::from(name);
        // SAFETY: `wide` outlives the call; no security attributes (the default ACL).
        let handle = unsafe { CreateMutexW(None, false, &wide) }.map_err(|e| e.to_string())?;
        // SAFETY: reads this thread's last error, which CreateMutexW just set.
        if unsafe { GetLastError() } == ERROR_ALREADY_EXISTS {
            // SAFETY: the handle was just opened and is closed once.
            let _ = unsafe { CloseHandle(handle) };
            return Ok(None);
        }
        Ok(Some(NamedMutex(handle)))
    }
}

impl Drop for NamedMutex {
    fn drop(&mut self) {
        // SAFETY: the handle is ours and closed once.
        let _ = unsafe { windows::Win32::Foundation::CloseHandle(self.0) };
    }
}

/// Every running process of this host, as `(pid, executable file name)`, from a Toolhelp32
/// snapshot: kpng looks for a `kube-proxy.exe` that would fight it over HNS (here because
/// this is the module allowed FFI).
pub fn processes() -> Result<Vec<(u32, String)>, String> {
    use windows::Win32::Foundation::CloseHandle;
    use windows::Win32::System::Diagnostics::ToolHelp::{
        CreateToolhelp32Snapshot, PROCESSENTRY32W, Process32FirstW, Process32NextW,
        TH32CS_SNAPPROCESS,
    };
    // SAFETY: no pointer arguments; the handle is closed below.
    let snapshot =
        unsafe { CreateToolhelp32Snapshot(TH32CS_SNAPPROCESS, 0) }.map_err(|e| e.to_string())?;
    let mut entry = PROCESSENTRY32W {
        dwSize: std::mem::size_of::<PROCESSENTRY32W>() as u32,
        ..Default::default()
    };
    let mut out = Vec::new();
    // SAFETY: `entry` is a PROCESSENTRY32W with its dwSize set, valid for the calls.
    let mut more = unsafe { Process32FirstW(snapshot, &mut entry) }.is_ok();
    while more {
        let len = entry
            .szExeFile
            .iter()
            .position(|c| *c == 0)
            .unwrap_or(entry.szExeFile.len());
        out.push((
            entry.th32ProcessID,
            String::from_utf16_lossy(&entry.szExeFile[..len]),
        ));
        // SAFETY: as above.
        more = unsafe { Process32NextW(snapshot, &mut entry) }.is_ok();
    }
    // SAFETY: the snapshot handle is ours and closed once.
    let _ = unsafe { CloseHandle(snapshot) };
    Ok(out)
}
