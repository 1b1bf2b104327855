//! The one error type of the harness.

use std::fmt;
use std::process::Output;

/// Why a harness operation failed.
///
/// Test code mostly `expect`s these, so every variant carries enough context (the
/// command line, its exit status and output) to understand a failure from the
/// panic message alone.
#[derive(Debug)]
pub enum Error {
    /// An I/O operation (spawning a program, reading a file, ...) failed.
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A program ran but exited unsuccessfully.
    Command {
        /// The command line, for the message.
        command: String,
        /// Exit status as printed by std (`exit status: 2`, `signal: 9`, ...).
        status: String,
        /// Captured standard output (lossy UTF-8).
        stdout: String,
        /// Captured standard error (lossy UTF-8).
        stderr: String,
    },
    /// Output of a program (e.g. `kpng-probe`) could not be understood.
    Parse(String),
    /// Anything else: bad arguments, a timeout waiting for a server, ...
    Other(String),
}

/// Result type of the harness.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn command(command: String, output: &Output) -> Self {
        Error::Command {
            command,
            status: output.status.to_string(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { context, source } => write!(f, "{context}: {source}"),
            Error::Command {
                command,
                status,
                stdout,
                stderr,
            } => {
                write!(f, "`{command}` failed ({status})")?;
                if !stdout.trim().is_empty() {
                    write!(f, "\n--- stdout ---\n{}", stdout.trim_end())?;
                }
                if !stderr.trim().is_empty() {
                    write!(f, "\n--- stderr ---\n{}", stderr.trim_end())?;
                }
                Ok(())
            }
            Error::Parse(msg) | Error::Other(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
