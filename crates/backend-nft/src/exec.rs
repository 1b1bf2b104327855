//! Running transactions. Each script is one atomic kernel commit, whether it goes through
//! libnftables in-process ([`libnftables::LibNftables`], the default) or one `nft -f -` process
//! ([`NftCommand`], the fallback). Behind a trait so tests and `--dry-run` need no kernel.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

/// Why a transaction did not commit.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// `nft` could not be started.
    #[error("cannot run {binary}: {source}")]
    Spawn {
        /// The binary.
        binary: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `nft` rejected the transaction; nothing of it was applied.
    #[error("nft rejected the transaction: {stderr}")]
    Rejected {
        /// What nft printed.
        stderr: String,
    },
}

/// Something that commits nft scripts.
pub trait NftExec: Send {
    /// Commits `script` atomically, or nothing of it.
    fn run(&mut self, script: &str) -> Result<(), ExecError>;

    /// Commits a full-sync script (the whole table). Executors may route these differently:
    /// see [`Auto`].
    fn run_full(&mut self, script: &str) -> Result<(), ExecError> {
        self.run(script)
    }
}

/// The default: small (partial) transactions through a warm libnftables context, full ones
/// through an `nft -f -` process. Parsing a whole table costs libnftables hundreds of MB at
/// 30k Services; in a child process that memory is returned when it exits instead of staying in
/// kpng. Without libnftables everything goes through the process.
pub struct Auto {
    library: Option<libnftables::LibNftables>,
    command: NftCommand,
}

impl Auto {
    /// Uses libnftables when it loads, `binary` otherwise and for full syncs.
    pub fn new(binary: &str) -> Auto {
        let library = match libnftables::LibNftables::open() {
            Ok(lib) => Some(lib),
            Err(e) => {
                tracing::info!("libnftables unavailable ({e}); running `{binary}` per transaction");
                None
            }
        };
        Auto {
            library,
            command: NftCommand::with_binary(binary),
        }
    }
}

impl NftExec for Auto {
    fn run(&mut self, script: &str) -> Result<(), ExecError> {
        match &mut self.library {
            Some(lib) => lib.run(script),
            None => self.command.run(script),
        }
    }

    fn run_full(&mut self, script: &str) -> Result<(), ExecError> {
        self.command.run(script)
    }
}

/// The real thing: `nft -f -`.
#[derive(Debug, Clone)]
pub struct NftCommand {
    binary: PathBuf,
}

impl Default for NftCommand {
    fn default() -> Self {
        NftCommand {
            binary: PathBuf::from("nft"),
        }
    }
}

impl NftCommand {
    /// Uses a specific `nft` binary.
    pub fn with_binary(binary: impl Into<PathBuf>) -> NftCommand {
        NftCommand {
            binary: binary.into(),
        }
    }
}

impl NftExec for NftCommand {
    fn run(&mut self, script: &str) -> Result<(), ExecError> {
        let spawn_err = |source| ExecError::Spawn {
            binary: self.binary.display().to_string(),
            source,
        };
        let mut child = Command::new(&self.binary)
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_err)?;
        if let Some(mut stdin) = child.stdin.take() {
            // A write error means nft exited early; its stderr below says why.
            let _ = stdin.write_all(script.as_bytes());
        }
        let output = child.wait_with_output().map_err(spawn_err)?;
        if output.status.success() {
            Ok(())
        } else {
            let stderr = String::from_utf8_lossy(&output.stderr);
            // nft can print the whole offending script back; keep the message readable.
            let mut message: String = stderr.lines().take(20).collect::<Vec<_>>().join("\n");
            if message.is_empty() {
                message = format!("nft exited with {}", output.status);
            }
            Err(ExecError::Rejected { stderr: message })
        }
    }
}

/// `--dry-run`: prints every transaction to standard output and applies nothing.
#[derive(Debug, Default)]
pub struct DryRun;

impl NftExec for DryRun {
    fn run(&mut self, script: &str) -> Result<(), ExecError> {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "# --- kpng nft transaction (dry run) ---\n{script}");
        let _ = out.flush();
        Ok(())
    }
}

/// A recorder for tests: keeps every script and can be told to fail.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    /// Every script run, in order.
    pub scripts: Arc<Mutex<Vec<String>>>,
    /// When set, the next runs fail with this message.
    pub fail_with: Arc<Mutex<Option<String>>>,
}

impl NftExec for Recorder {
    fn run(&mut self, script: &str) -> Result<(), ExecError> {
        self.scripts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(script.to_string());
        match self
            .fail_with
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            Some(stderr) => Err(ExecError::Rejected { stderr }),
            None => Ok(()),
        }
    }
}

pub mod libnftables;
