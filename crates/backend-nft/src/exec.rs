//! Running transactions. Each script is one atomic kernel commit, whether it goes through
//! libnftables in-process ([`libnftables::LibNftables`], the default) or one `nft -f -` process
//! ([`NftCommand`], the fallback). Behind a trait so tests and `--dry-run` need no kernel.

pub use kpng_backend_kit::exec::{ExecError, Recorder, ScriptExec};

/// Something that commits nft scripts. Every [`ScriptExec`] of the backend kit is one (the
/// kit's dry run and recorder, [`libnftables::LibNftables`]); [`Auto`] routes full syncs
/// differently.
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
            Some(lib) => ScriptExec::run(lib, script),
            None => ScriptExec::run(&mut self.command, script),
        }
    }

    fn run_full(&mut self, script: &str) -> Result<(), ExecError> {
        ScriptExec::run(&mut self.command, script)
    }
}

impl<T: ScriptExec> NftExec for T {
    fn run(&mut self, script: &str) -> Result<(), ExecError> {
        ScriptExec::run(self, script)
    }
}

/// The real thing: `nft -f -` (the kit's tool runner).
#[derive(Debug, Clone)]
pub struct NftCommand(kpng_backend_kit::exec::Tool);

impl Default for NftCommand {
    fn default() -> Self {
        NftCommand::with_binary("nft")
    }
}

impl NftCommand {
    /// Uses a specific `nft` binary.
    pub fn with_binary(binary: impl Into<String>) -> NftCommand {
        NftCommand(kpng_backend_kit::exec::Tool::new(binary, &["-f", "-"]))
    }
}

impl ScriptExec for NftCommand {
    fn run(&mut self, script: &str) -> Result<(), ExecError> {
        ScriptExec::run(&mut self.0, script)
    }
}

/// `--dry-run`: prints every transaction to standard output and applies nothing.
pub fn dry_run() -> kpng_backend_kit::exec::DryRun {
    kpng_backend_kit::exec::DryRun::new("# --- kpng nft transaction (dry run) ---")
}

pub mod libnftables;
