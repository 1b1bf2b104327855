//! A `to-file` sink programs nothing, so by default it opens none of a node proxy's listeners:
//! no health server (`0.0.0.0:10256`), no metrics server (`127.0.0.1:10249`), no admin socket
//! (`/run/kpng/kpng.sock`). Those belong to the node's kube-proxy or kpng, and taking them made
//! README's first command, `kpng file … to-file --output -`, fail with "Address already in
//! use" on any node that runs one. A flag given explicitly keeps its value, and so does a
//! `--config` file's (kube-proxy's configuration describes a proxy).

use crate::cli::{Cli, Command, GlobalFlags, NodeSink, Sink};

/// One listener: its name, the clap ids of the flags that ask for it, the flag to name, and
/// how to turn it off.
type Listener = (
    &'static str,
    &'static [&'static str],
    &'static str,
    fn(&mut GlobalFlags),
);

/// The listeners [`turn_off_unasked`] turns off.
const LISTENERS: [Listener; 3] = [
    (
        "health server",
        &["healthz_bind_address", "healthz_port"],
        "--healthz-bind-address",
        |g| g.healthz_bind_address = None,
    ),
    (
        "metrics server",
        &["metrics_bind_address", "metrics_port"],
        "--metrics-bind-address",
        |g| g.metrics_bind_address.clear(),
    ),
    ("admin socket", &["admin_socket"], "--admin-socket", |g| {
        g.admin_socket.clear()
    }),
];

/// Whether the command runs the `to-file` sink.
fn writes_a_file(cli: &Cli) -> bool {
    match &cli.command {
        Some(Command::File(f)) => matches!(f.sink, Sink::ToFile(_)),
        Some(Command::Kube(k)) => matches!(k.sink, Sink::ToFile(_)),
        Some(Command::Api(a)) => matches!(a.sink, NodeSink::ToFile(_)),
        _ => false,
    }
}

/// For a `to-file` run without `--config`, turns off each listener whose flags `given` (the
/// command line's explicit flags, by clap id) does not name. Returns a log line saying what
/// was turned off and how to have it, or `None` when nothing was.
pub fn turn_off_unasked(cli: &mut Cli, given: impl Fn(&str) -> bool) -> Option<String> {
    if !writes_a_file(cli) || cli.global.config.is_some() {
        return None;
    }
    let mut off = Vec::new();
    let mut flags = Vec::new();
    for (name, ids, flag, turn_off) in LISTENERS {
        if ids.iter().any(|id| given(id)) {
            continue;
        }
        turn_off(&mut cli.global);
        off.push(name);
        flags.push(flag);
    }
    (!off.is_empty()).then(|| {
        format!(
            "to-file programs nothing: no {} (give {} to have {})",
            off.join(", no "),
            flags.join(", "),
            if off.len() == 1 { "it" } else { "them" }
        )
    })
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, FromArgMatches};

    use super::*;

    /// Extra flags, sink, health on, metrics on, admin socket on, what the note says.
    type Case<'a> = (
        &'a [&'a str],
        &'a [&'a str],
        bool,
        bool,
        bool,
        Option<&'a str>,
    );

    fn run(line: &[&str]) -> (Cli, Option<String>) {
        let matches = Cli::command()
            .try_get_matches_from(line)
            .expect("a valid line");
        let mut cli = Cli::from_arg_matches(&matches).expect("parsed");
        let note = turn_off_unasked(&mut cli, |id| {
            crate::config::given_on_command_line(&matches, id)
        });
        (cli, note)
    }

    #[test]
    fn to_file_opens_only_the_listeners_asked_for() {
        let file = ["kpng", "file", "--input", "x.yaml", "--node-name", "n1"];
        // (extra flags, sink, health on, metrics on, admin socket on, note has)
        let cases: &[Case] = &[
            (
                &[],
                &["to-file"],
                false,
                false,
                false,
                Some(
                    "to-file programs nothing: no health server, no metrics server, no admin \
                     socket (give --healthz-bind-address, --metrics-bind-address, \
                     --admin-socket to have them)",
                ),
            ),
            (
                &["--healthz-bind-address", "127.0.0.1:0"],
                &["to-file"],
                true,
                false,
                false,
                Some("no metrics server, no admin socket (give --metrics-bind-address, "),
            ),
            (
                &["--healthz-port", "10257"],
                &["to-file"],
                true,
                false,
                false,
                None,
            ),
            (
                &[
                    "--metrics-bind-address",
                    "127.0.0.1:0",
                    "--admin-socket",
                    "/tmp/a.sock",
                ],
                &["to-file"],
                false,
                true,
                true,
                Some("no health server (give --healthz-bind-address to have it)"),
            ),
            // A sink that programs the node keeps kube-proxy's defaults.
            (&[], &["to-local", "nft"], true, true, true, None),
        ];
        for (extra, sink, health, metrics, admin, note) in cases {
            let line: Vec<&str> = file.iter().chain(*extra).chain(*sink).copied().collect();
            let (cli, got) = run(&line);
            assert_eq!(
                cli.global.healthz_bind_address.is_some(),
                *health,
                "{line:?}"
            );
            assert_eq!(
                !cli.global.metrics_bind_address.is_empty(),
                *metrics,
                "{line:?}"
            );
            assert_eq!(!cli.global.admin_socket.is_empty(), *admin, "{line:?}");
            match note {
                Some(n) => assert!(
                    got.as_deref().is_some_and(|g| g.contains(n)),
                    "{line:?}: {got:?}"
                ),
                None if *health && *metrics && *admin => assert_eq!(got, None, "{line:?}"),
                None => {}
            }
        }
        // The kube and api sources' to-file too.
        let (cli, _) = run(&["kpng", "kube", "--node-name", "n1", "to-file"]);
        assert!(cli.global.healthz_bind_address.is_none());
        let (cli, _) = run(&["kpng", "api", "--node-name", "n1", "to-file"]);
        assert!(cli.global.admin_socket.is_empty());
    }
}
