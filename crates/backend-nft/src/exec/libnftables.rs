//! libnftables in-process: the nft language without a process per transaction.
//!
//! Why: each `nft -f -` process costs ~1.5 ms to start, and closing its netlink socket makes
//! the kernel wait for an RCU grace period (10–20 ms here) whenever the transaction deleted
//! elements: nf_tables flushes its deferred-destroy work when a netlink socket is released.
//! One long-lived context keeps one socket open, so a transaction costs only its parse and
//! commit. The library (`libnftables.so.1`, package `libnftables1`, a dependency of `nftables`)
//! is loaded at run time, so building needs no `-dev` package.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_void};

use libloading::{Library, Symbol};

use super::{ExecError, ScriptExec};

type CtxNew = unsafe extern "C" fn(u32) -> *mut c_void;
type CtxFree = unsafe extern "C" fn(*mut c_void);
type CtxBuffer = unsafe extern "C" fn(*mut c_void) -> c_int;
type CtxGetBuffer = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type RunCmd = unsafe extern "C" fn(*mut c_void, *const c_char) -> c_int;

/// A libnftables context (`struct nft_ctx`) with the functions we call on it.
pub struct LibNftables {
    ctx: *mut c_void,
    run: RunCmd,
    error_buffer: CtxGetBuffer,
    free: CtxFree,
    // Keeps the library mapped while the function pointers above are in use.
    _lib: Library,
}

// SAFETY: a `nft_ctx` has no thread affinity; it is only ever used through `&mut self`, so
// never from two threads at once.
unsafe impl Send for LibNftables {}

impl LibNftables {
    /// Loads `libnftables.so.1` and opens a context (and its netlink socket) in the current
    /// network namespace.
    pub fn open() -> Result<LibNftables, ExecError> {
        let spawn = |e: String| ExecError::Spawn {
            tool: "libnftables.so.1".into(),
            source: std::io::Error::other(e),
        };
        // SAFETY: loading a system library whose initialisers are safe to run.
        let lib = unsafe { Library::new("libnftables.so.1") }.map_err(|e| spawn(e.to_string()))?;
        // SAFETY: the symbol types match libnftables' public header (nftables/libnftables.h).
        unsafe {
            let new: Symbol<CtxNew> = lib
                .get(b"nft_ctx_new\0")
                .map_err(|e| spawn(e.to_string()))?;
            let buffer_error: Symbol<CtxBuffer> = lib
                .get(b"nft_ctx_buffer_error\0")
                .map_err(|e| spawn(e.to_string()))?;
            let buffer_output: Symbol<CtxBuffer> = lib
                .get(b"nft_ctx_buffer_output\0")
                .map_err(|e| spawn(e.to_string()))?;
            let error_buffer: Symbol<CtxGetBuffer> = lib
                .get(b"nft_ctx_get_error_buffer\0")
                .map_err(|e| spawn(e.to_string()))?;
            let run: Symbol<RunCmd> = lib
                .get(b"nft_run_cmd_from_buffer\0")
                .map_err(|e| spawn(e.to_string()))?;
            let free: Symbol<CtxFree> = lib
                .get(b"nft_ctx_free\0")
                .map_err(|e| spawn(e.to_string()))?;
            let ctx = new(0); // NFT_CTX_DEFAULT
            if ctx.is_null() {
                return Err(spawn("nft_ctx_new failed".into()));
            }
            // Capture output and errors instead of printing them.
            buffer_output(ctx);
            buffer_error(ctx);
            let (run, error_buffer, free) = (*run, *error_buffer, *free);
            Ok(LibNftables {
                ctx,
                run,
                error_buffer,
                free,
                _lib: lib,
            })
        }
    }
}

impl ScriptExec for LibNftables {
    fn run(&mut self, script: &str) -> Result<(), ExecError> {
        let refused = |message: String| ExecError::Refused {
            tool: "libnftables".into(),
            status: "rejected".into(),
            message,
        };
        let script =
            CString::new(script).map_err(|_| refused("script contains a NUL byte".into()))?;
        // SAFETY: `ctx` is a live context and `script` a NUL-terminated string that outlives the call.
        let rc = unsafe { (self.run)(self.ctx, script.as_ptr()) };
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: the error buffer is a NUL-terminated string owned by the context, valid until
        // the next call on it; we copy it out at once.
        let stderr = unsafe {
            let p = (self.error_buffer)(self.ctx);
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        let stderr = summarize_errors(&stderr);
        Err(refused(if stderr.is_empty() {
            format!("libnftables returned {rc}")
        } else {
            stderr
        }))
    }
}

/// nft's error output for a refused transaction, shortened to its first error (the message,
/// the command, the carets) and how many more there were: a transaction on a table that has
/// gone fails every one of its commands the same way, and the log would repeat the same three
/// lines for each.
fn summarize_errors(stderr: &str) -> String {
    let mut blocks: Vec<Vec<&str>> = Vec::new();
    for line in stderr.lines() {
        match blocks.last_mut() {
            Some(block) if !line.contains("Error:") => block.push(line),
            _ => blocks.push(vec![line]),
        }
    }
    let Some(first) = blocks.first() else {
        return String::new();
    };
    let mut out: Vec<String> = first.iter().take(20).map(|l| l.to_string()).collect();
    let more = blocks.len() - 1;
    if more > 0 {
        let same = |b: &Vec<&str>| {
            let message = |l: &str| l.split_once("Error:").map(|(_, m)| m.trim().to_string());
            b.first().and_then(|l| message(l)) == first.first().and_then(|l| message(l))
        };
        let alike = blocks[1..].iter().filter(|b| same(b)).count();
        out.push(if alike == more {
            format!("(and {more} more commands refused the same way)")
        } else {
            format!("(and {more} more errors, {alike} of them the same)")
        });
    }
    out.join("\n")
}

impl Drop for LibNftables {
    fn drop(&mut self) {
        // SAFETY: `ctx` came from nft_ctx_new and is freed exactly once.
        unsafe { (self.free)(self.ctx) }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn repeated_errors_are_summarized_after_the_first() {
        let one = "/dev/stdin:5:1-28: Error: Could not process rule: No such file or directory\n\
                   add chain ip kpng cluster-n4\n\
                   ^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n";
        let three = format!("{one}{one}{one}");
        let said = super::summarize_errors(&three);
        assert_eq!(
            said,
            "/dev/stdin:5:1-28: Error: Could not process rule: No such file or directory\n\
             add chain ip kpng cluster-n4\n\
             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n\
             (and 2 more commands refused the same way)"
        );
        assert_eq!(super::summarize_errors(one), one.trim_end());
        let other = "/dev/stdin:9:1-3: Error: syntax error\nxyz\n^^^\n";
        assert!(
            super::summarize_errors(&format!("{one}{other}"))
                .ends_with("(and 1 more errors, 0 of them the same)")
        );
        assert_eq!(super::summarize_errors(""), "");
    }
}
