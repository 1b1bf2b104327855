//! What `--write-config-to` cannot write from the command line: kpng's own flags (they have no
//! KubeProxyConfiguration field) and a source or sink other than kube-proxy's.
//!
//! The file is kube-proxy's format, decoded strictly by kube-proxy and, for unknown fields,
//! with a warning by kpng (`--strict-config` fails on it), so kpng's flags cannot ride along as
//! extra fields: a file that carried them would no longer load cleanly in either. Instead each
//! one given is named in a warning that says to keep it on kpng's command line beside
//! `--config` (until 2026-12-07 they were left out in silence, and a kpng started from the
//! written file ran without them).

use clap::ArgMatches;
use clap::parser::ValueSource;

use super::{FLAGS_OF_FIELDS, command_line_matches};

/// Flags that set a field besides [`FLAGS_OF_FIELDS`] (the ones kube-proxy honours beside
/// `--config`, and the file-only Windows ones): written, so not named.
const WRITTEN: [&str; 6] = [
    "node_name",
    "log_level",
    "verbosity",
    "logging_format",
    "network_name",
    "windows_service",
];

/// Flags that say what this command does rather than how kpng runs (`--config` itself, the
/// write, a dry run, a cleanup): nothing a written file should reproduce.
const ACTIONS: [&str; 6] = [
    "config",
    "write_config_to",
    "strict_config",
    "cleanup",
    "init_only",
    "dry_run",
];

/// Subcommands that run no proxy (`--write-config-to FILE version` is the pre-flight check):
/// their flags are not a setup.
const NOT_A_PROXY: [&str; 4] = ["version", "status", "trace", "cleanup"];

/// One line per flag given (on the command line or through its environment variable) that
/// the written file does not hold, naming it with its value and, for a subcommand's flag, the
/// subcommand; and one for a source or sink other than kube-proxy's (`kube … to-local`).
pub fn named(command: &clap::Command, matches: &ArgMatches) -> Vec<String> {
    let mut lines = Vec::new();
    let chain = subcommands(matches);
    if chain
        .first()
        .is_some_and(|first| NOT_A_PROXY.contains(first))
    {
        return lines;
    }
    // Global flags are propagated to every subcommand's matches: each is looked at once.
    let globals: Vec<&str> = command
        .get_arguments()
        .filter(|a| a.is_global_set())
        .map(|a| a.get_id().as_str())
        .collect();
    let mut level = Some((command, matches, Vec::<&str>::new()));
    while let Some((cmd, m, path)) = level.take() {
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            let global = globals.contains(&id);
            if (global && !path.is_empty()) || written(id) {
                continue;
            }
            let found = if global {
                command_line_matches(matches, id)
            } else {
                explicit(m, id).then_some(m)
            };
            if let Some(at) = found {
                lines.push(line(arg, at, &path));
            }
        }
        if let Some((name, sub)) = m.subcommand()
            && let Some(sub_command) = cmd.find_subcommand(name)
        {
            let mut path = path;
            path.push(sub_command.get_name());
            level = Some((sub_command, sub, path));
        }
    }
    let kube_proxys_line = matches!(chain.as_slice(), [] | ["kube", "to-local", _]);
    if !kube_proxys_line {
        lines.push(format!(
            "`{}`: the source and sink of this command line have no field: `kpng --config \
             FILE` alone runs kube-proxy's (the `kube` source into the `mode`'s backend), so \
             keep them on kpng's command line beside --config",
            chain.join(" ")
        ));
    }
    lines
}

/// Whether the written file holds the flag `id`, or it is no setting at all.
fn written(id: &str) -> bool {
    FLAGS_OF_FIELDS.iter().any(|(f, _, _)| *f == id)
        || WRITTEN.contains(&id)
        || ACTIONS.contains(&id)
}

/// Whether `id` was given on the command line or its environment at this level.
fn explicit(m: &ArgMatches, id: &str) -> bool {
    m.ids().any(|i| i.as_str() == id)
        && matches!(
            m.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
}

/// The names of the subcommands on the line, outermost first (`kube`, `to-local`, `ebpf`).
fn subcommands(matches: &ArgMatches) -> Vec<&str> {
    let mut out = Vec::new();
    let mut m = matches;
    while let Some((name, sub)) = m.subcommand() {
        out.push(name);
        m = sub;
    }
    out
}

/// The warning for one flag: as written (`--service-cidr=10.96.0.0/12`; a URL without its
/// credentials), where it was given, and what to do.
fn line(arg: &clap::Arg, at: &ArgMatches, path: &[&str]) -> String {
    let id = arg.get_id().as_str();
    let name = arg
        .get_long()
        .map_or_else(|| id.to_string(), |l| format!("--{l}"));
    let values: Vec<String> = at
        .try_get_raw(id)
        .ok()
        .flatten()
        .map(|v| {
            v.map(|v| kpng_source_kube::without_credentials(&v.to_string_lossy()))
                .collect()
        })
        .unwrap_or_default();
    let shown = if arg.get_action().takes_values() {
        format!("{name}={}", values.join(","))
    } else {
        name
    };
    let mut said = shown;
    if at.value_source(id) == Some(ValueSource::EnvVariable)
        && let Some(env) = arg.get_env()
    {
        said = format!("{said} (from ${})", env.to_string_lossy());
    }
    if !path.is_empty() {
        said = format!("{said} (of `{}`)", path.join(" "));
    }
    format!(
        "{said}: a kpng flag with no KubeProxyConfiguration field, not in the file: keep it on \
         kpng's command line beside --config"
    )
}
