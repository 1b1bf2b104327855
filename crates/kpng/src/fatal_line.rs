//! The line kpng stops with (an error `main` returns), written where its operator looks.
//!
//! Why: a proxy's refusal to start (another kpng already runs, a flag the node cannot honour)
//! used to be a plain `kpng: …` line on standard error, without timestamp or level, even with
//! `--logging-format json`: a log pipeline parsing JSON dropped or mangled exactly the line
//! that said why the proxy is down, and an incident's timeline could not place it. Once the
//! logger exists, a proxy's fatal error is an ERROR log line in the chosen format. The
//! one-shot commands (`kpng status`, `trace`, `version`, `cleanup`) answer a person at a
//! terminal and keep the plain line; errors before the logger exists (command-line and
//! `--log-file` errors) are plain lines written elsewhere.

/// How the process's fatal error is to be written, decided once the logger is set up.
#[derive(Debug, Clone, Copy)]
pub struct Ending {
    /// `--log-file` takes the log lines: standard error gets none of them.
    pub to_file: bool,
    /// A command answering a person (`status`, `trace`, `version`, `cleanup`), not a proxy.
    pub one_shot: bool,
}

/// Where a fatal error goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Outputs {
    /// A plain `kpng: …` line on standard error.
    plain: bool,
    /// An ERROR log line (`stopping: …`) through the logger.
    logged: bool,
}

impl Ending {
    /// Writes `text`, the error kpng stops with.
    pub fn fatal(&self, text: &str) {
        // The target `kpng` (the crate's, not this module's): the line reads
        // `ERROR kpng: stopping: …` as it did when `main` logged it.
        let out = self.outputs(tracing::enabled!(target: "kpng", tracing::Level::ERROR));
        if out.plain {
            eprintln!("kpng: {text}");
        }
        if out.logged {
            tracing::error!(target: "kpng", "stopping: {text}");
        }
    }

    /// Where the error goes when the log filter lets ERROR lines through (`error_logged`):
    /// standard error always gets it once (a filter such as `--log-level off` must not hide
    /// why kpng stopped), as a log line when the logs go there, and a `--log-file` gets it
    /// too, where a Windows service's operator looks.
    fn outputs(&self, error_logged: bool) -> Outputs {
        if self.one_shot {
            return Outputs {
                plain: true,
                logged: self.to_file && error_logged,
            };
        }
        Outputs {
            plain: self.to_file || !error_logged,
            logged: error_logged,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proxys_fatal_error_is_a_log_line_once_the_logger_exists() {
        let both = Outputs {
            plain: true,
            logged: true,
        };
        let plain = Outputs {
            plain: true,
            logged: false,
        };
        let logged = Outputs {
            plain: false,
            logged: true,
        };
        // (to_file, one_shot, ERROR enabled) -> outputs
        let cases = [
            // A proxy logging to standard error: one log line, in the chosen format.
            ((false, false, true), logged),
            // `--log-level off`: the filter would hide it, so a plain line.
            ((false, false, false), plain),
            // `--log-file`: the file's line, and standard error's plain one.
            ((true, false, true), both),
            ((true, false, false), plain),
            // `kpng status` and the like answer a person: plain, and the file's line.
            ((false, true, true), plain),
            ((true, true, true), both),
            ((true, true, false), plain),
        ];
        for ((to_file, one_shot, enabled), want) in cases {
            let ending = Ending { to_file, one_shot };
            assert_eq!(
                ending.outputs(enabled),
                want,
                "{to_file} {one_shot} {enabled}"
            );
        }
    }
}
