//! Running under the Windows Service Control Manager (SCM), for kpng's `--windows-service`
//! (kube-proxy's `windowsRunAsService`), Windows only. It lives here because this crate is the
//! one allowed the FFI (`unsafe`) Windows needs; nothing in it is about HNS.
//!
//! [`start`] runs `StartServiceCtrlDispatcherW` on a thread of its own (it blocks until the
//! service stops), registers the control handler from `ServiceMain`, and reports
//! `SERVICE_RUNNING`; a Stop or Shutdown control reports `SERVICE_STOP_PENDING` and calls the
//! caller's `on_stop`; [`stopped`] reports `SERVICE_STOPPED` with the exit code.
#![allow(unsafe_code)]

/// Why the process could not run as a service.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// [`start`] was called twice.
    #[error("the service was started twice")]
    Twice,
    /// The dispatcher thread could not start.
    #[error("starting the dispatcher thread: {0}")]
    Thread(String),
    /// `StartServiceCtrlDispatcherW` failed: usually the process was not started by the SCM.
    #[error(
        "connecting to the Service Control Manager: {0} (was kpng started as a service, e.g. \
         by `sc.exe start`?)"
    )]
    Dispatcher(String),
    /// `RegisterServiceCtrlHandlerExW` failed.
    #[error("registering the service control handler: {0}")]
    Register(String),
    /// The SCM did not call the service's entry point within 30 s.
    #[error("the Service Control Manager did not start the service within 30 s")]
    NotStarted,
}

use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use windows::Win32::System::Services::{
    RegisterServiceCtrlHandlerExW, SERVICE_ACCEPT_SHUTDOWN, SERVICE_ACCEPT_STOP,
    SERVICE_CONTROL_INTERROGATE, SERVICE_CONTROL_SHUTDOWN, SERVICE_CONTROL_STOP, SERVICE_RUNNING,
    SERVICE_STATUS, SERVICE_STATUS_CURRENT_STATE, SERVICE_STATUS_HANDLE, SERVICE_STOP_PENDING,
    SERVICE_STOPPED, SERVICE_TABLE_ENTRYW, SERVICE_WIN32_OWN_PROCESS, SetServiceStatus,
    StartServiceCtrlDispatcherW,
};
use windows::core::{PCWSTR, PWSTR};

/// The service name given to the dispatcher: a service of its own process may be installed
/// under any name (`SERVICE_WIN32_OWN_PROCESS` ignores it).
const NAME: &str = "kpng";
/// `ERROR_CALL_NOT_IMPLEMENTED`: the answer to a control kpng does not handle.
const ERROR_CALL_NOT_IMPLEMENTED: u32 = 120;
/// How long the SCM should wait for a stop before it thinks kpng hung.
const STOP_WAIT_HINT: Duration = Duration::from_secs(30);

/// What the SCM's callbacks share with the rest of kpng. The callbacks get no context
/// pointer from the SCM (`ServiceMain` takes only its arguments), so this one process-wide
/// value is the only way to reach them: set once by [`start`], never replaced.
struct Shared {
    /// Tells [`start`] that `ServiceMain` registered (or why the dispatcher failed).
    started: Mutex<Option<mpsc::Sender<Result<(), ServiceError>>>>,
    /// The status handle (`SERVICE_STATUS_HANDLE` is a pointer: kept as an address).
    handle: Mutex<Option<usize>>,
    /// Called on a Stop or Shutdown control.
    on_stop: Box<dyn Fn() + Send + Sync>,
}

static SHARED: OnceLock<Shared> = OnceLock::new();

/// Connects to the SCM and reports the service running; `on_stop` is called when the SCM
/// asks the service to stop (Stop or Shutdown). An error when the process was not started by
/// the SCM.
pub fn start(on_stop: Box<dyn Fn() + Send + Sync>) -> Result<(), ServiceError> {
    let (tx, rx) = mpsc::channel();
    let shared = Shared {
        started: Mutex::new(Some(tx.clone())),
        handle: Mutex::new(None),
        on_stop,
    };
    if SHARED.set(shared).is_err() {
        return Err(ServiceError::Twice);
    }
    std::thread::Builder::new()
        .name("scm-dispatcher".into())
        .spawn(move || {
            let mut name: Vec<u16> = NAME.encode_utf16().chain([0]).collect();
            let table = [
                SERVICE_TABLE_ENTRYW {
                    lpServiceName: PWSTR(name.as_mut_ptr()),
                    lpServiceProc: Some(service_main),
                },
                SERVICE_TABLE_ENTRYW::default(),
            ];
            // Blocks until the service reports SERVICE_STOPPED.
            // SAFETY: the table is terminated by a null entry and outlives the call.
            let result = unsafe { StartServiceCtrlDispatcherW(table.as_ptr()) };
            if let Err(e) = result {
                let _ = tx.send(Err(ServiceError::Dispatcher(e.to_string())));
            }
        })
        .map_err(|e| ServiceError::Thread(e.to_string()))?;
    rx.recv_timeout(Duration::from_secs(30))
        .map_err(|_| ServiceError::NotStarted)?
}

/// Reports the service stopped, with kpng's exit code (nothing when not a service).
pub fn stopped(exit_code: u32) {
    set_status(SERVICE_STOPPED, exit_code);
}

fn set_status(state: SERVICE_STATUS_CURRENT_STATE, exit_code: u32) {
    let Some(shared) = SHARED.get() else { return };
    let Some(handle) = *shared.handle.lock().unwrap_or_else(|e| e.into_inner()) else {
        return;
    };
    let accepted = if state == SERVICE_RUNNING {
        SERVICE_ACCEPT_STOP | SERVICE_ACCEPT_SHUTDOWN
    } else {
        0
    };
    let status = SERVICE_STATUS {
        dwServiceType: SERVICE_WIN32_OWN_PROCESS,
        dwCurrentState: state,
        dwControlsAccepted: accepted,
        dwWin32ExitCode: exit_code,
        dwServiceSpecificExitCode: 0,
        dwCheckPoint: 0,
        dwWaitHint: if state == SERVICE_STOP_PENDING {
            STOP_WAIT_HINT.as_millis() as u32
        } else {
            0
        },
    };
    // SAFETY: the handle came from RegisterServiceCtrlHandlerExW and is never closed.
    if let Err(e) = unsafe { SetServiceStatus(SERVICE_STATUS_HANDLE(handle as _), &status) } {
        // Nothing to report it to: the SCM also learns the state when the process ends.
        let _ = e;
    }
}

/// The service's entry point, called by the dispatcher thread.
unsafe extern "system" fn service_main(_argc: u32, _argv: *mut PWSTR) {
    let Some(shared) = SHARED.get() else { return };
    let name: Vec<u16> = NAME.encode_utf16().chain([0]).collect();
    // SAFETY: the name is NUL-terminated; the handler is a plain function.
    let registered =
        unsafe { RegisterServiceCtrlHandlerExW(PCWSTR(name.as_ptr()), Some(handler), None) };
    let sender = shared
        .started
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    match registered {
        Ok(handle) => {
            *shared.handle.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle.0 as usize);
            set_status(SERVICE_RUNNING, 0);
            if let Some(tx) = sender {
                let _ = tx.send(Ok(()));
            }
        }
        Err(e) => {
            if let Some(tx) = sender {
                let _ = tx.send(Err(ServiceError::Register(e.to_string())));
            }
        }
    }
}

/// The SCM's controls: Stop and Shutdown stop kpng; Interrogate is answered.
unsafe extern "system" fn handler(
    control: u32,
    _event_type: u32,
    _event_data: *mut core::ffi::c_void,
    _context: *mut core::ffi::c_void,
) -> u32 {
    match control {
        SERVICE_CONTROL_STOP | SERVICE_CONTROL_SHUTDOWN => {
            set_status(SERVICE_STOP_PENDING, 0);
            if let Some(shared) = SHARED.get() {
                (shared.on_stop)();
            }
            0
        }
        SERVICE_CONTROL_INTERROGATE => 0,
        _ => ERROR_CALL_NOT_IMPLEMENTED,
    }
}
