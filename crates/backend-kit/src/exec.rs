//! Text transactions through a tool: `nft -f -`, `iptables-restore`, and whatever comes next.
//!
//! Every text-based backend needs the same three executors: the real tool (one process per
//! transaction, the script on its standard input, atomic by the tool's own guarantee), a dry run
//! that prints each script (`--dry-run` must change nothing on the host), and a recorder for
//! tests that keeps every script and can be told to fail. They share one error type, which
//! names the tool and carries what it said.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};

/// Why a tool did not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The tool could not be started (not installed, no permission).
    #[error("cannot run {tool}: {source}")]
    Spawn {
        /// The tool.
        tool: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The tool ran and refused; for a transaction, nothing of it was applied.
    #[error("{tool} refused ({status}): {message}")]
    Refused {
        /// The tool.
        tool: String,
        /// Its exit status.
        status: String,
        /// What it printed on standard error (the first lines: tools may echo a whole script).
        message: String,
    },
    /// Another I/O error (writing a sysctl, a pipe).
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// How many lines of a tool's standard error an error keeps.
const MESSAGE_LINES: usize = 20;

/// Runs `tool args…` with `stdin` (if any) on its standard input and returns its standard
/// output; a non-zero exit is [`ExecError::Refused`] with the tool's standard error.
pub fn run_tool(tool: &str, args: &[&str], stdin: Option<&str>) -> Result<String, ExecError> {
    let spawn = |source| ExecError::Spawn {
        tool: tool.to_owned(),
        source,
    };
    let mut child = Command::new(tool)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn)?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A write error means the tool exited early; its standard error says why.
        let _ = pipe.write_all(text.as_bytes());
    }
    let output = child.wait_with_output().map_err(spawn)?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let mut message: String = stderr
        .lines()
        .take(MESSAGE_LINES)
        .collect::<Vec<_>>()
        .join("\n");
    if message.is_empty() {
        message = "no message".into();
    }
    Err(ExecError::Refused {
        tool: tool.to_owned(),
        status: output.status.to_string(),
        message,
    })
}

/// Something that commits text transactions, each atomically or not at all.
pub trait ScriptExec: Send {
    /// Commits `script`.
    fn run(&mut self, script: &str) -> Result<(), ExecError>;
}

/// A tool that reads a transaction on standard input: `nft -f -`, `iptables-restore …`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tool {
    /// The binary (a name looked up in `PATH`, or a path).
    pub binary: String,
    /// Its arguments.
    pub args: Vec<String>,
}

impl Tool {
    /// `binary args…`.
    pub fn new(binary: impl Into<String>, args: &[&str]) -> Tool {
        Tool {
            binary: binary.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
        }
    }
}

impl ScriptExec for Tool {
    fn run(&mut self, script: &str) -> Result<(), ExecError> {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        run_tool(&self.binary, &args, Some(script)).map(|_| ())
    }
}

/// `--dry-run`: prints every transaction to standard output under a header and applies
/// nothing.
#[derive(Debug, Clone)]
pub struct DryRun {
    /// What each transaction is printed under (`# --- kpng nft transaction (dry run) ---`).
    pub header: String,
}

impl DryRun {
    /// A dry run printing `header` before every script.
    pub fn new(header: impl Into<String>) -> DryRun {
        DryRun {
            header: header.into(),
        }
    }
}

impl ScriptExec for DryRun {
    fn run(&mut self, script: &str) -> Result<(), ExecError> {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}\n{script}", self.header);
        let _ = out.flush();
        Ok(())
    }
}

/// What a [`Recorder`] saw, and how it answers.
#[derive(Debug, Default)]
pub struct Recorded {
    /// Every script run, in order (failed ones too).
    pub scripts: Vec<String>,
    /// While set, every run fails with this message.
    pub fail_with: Option<String>,
    /// Fail this many of the next runs (before `fail_with` is looked at).
    pub fail_next: usize,
}

/// Records transactions for tests; its clones share what they record.
#[derive(Debug, Clone, Default)]
pub struct Recorder(pub Arc<Mutex<Recorded>>);

impl Recorder {
    /// A recorder that accepts everything.
    pub fn new() -> Recorder {
        Recorder::default()
    }

    /// The shared record (a poisoned lock is still read: a test that panicked elsewhere
    /// should not hide what was recorded).
    pub fn record(&self) -> MutexGuard<'_, Recorded> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every script so far.
    pub fn scripts(&self) -> Vec<String> {
        self.record().scripts.clone()
    }
}

impl ScriptExec for Recorder {
    fn run(&mut self, script: &str) -> Result<(), ExecError> {
        let mut record = self.record();
        record.scripts.push(script.to_owned());
        let refuse = |message: String| ExecError::Refused {
            tool: "recorder".into(),
            status: "exit status: 1".into(),
            message,
        };
        if record.fail_next > 0 {
            record.fail_next -= 1;
            return Err(refuse("injected failure".into()));
        }
        match record.fail_with.clone() {
            Some(message) => Err(refuse(message)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_gets_the_script_and_its_refusal_names_it() {
        let mut cat = Tool::new("sh", &["-c", "cat >/dev/null"]);
        assert!(cat.run("anything").is_ok());
        let mut fails = Tool::new("sh", &["-c", "echo 'line 2: bad' >&2; exit 3"]);
        let e = fails.run("x").expect_err("refused").to_string();
        assert!(e.contains("sh refused") && e.contains("line 2: bad"), "{e}");
        let missing = Tool::new("/nonexistent/tool", &[]).run("x");
        assert!(matches!(missing, Err(ExecError::Spawn { .. })));
    }

    #[test]
    fn the_recorder_keeps_scripts_and_fails_on_demand() {
        let mut r = Recorder::new();
        r.record().fail_next = 1;
        assert!(r.run("one").is_err());
        assert!(r.run("two").is_ok());
        r.record().fail_with = Some("full".into());
        assert!(r.run("three").is_err());
        assert_eq!(r.scripts(), ["one", "two", "three"]);
    }
}
