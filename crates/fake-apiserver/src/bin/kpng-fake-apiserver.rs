//! `kpng-fake-apiserver`: the fake API server as a process, for tests that need it inside a
//! network namespace (where a test process's own loopback is out of reach).
//!
//! ```text
//! kpng-fake-apiserver [--manifest FILE] [--kubeconfig FILE] [--no-service-cidrs]
//! ```
//!
//! It listens on a free port of 127.0.0.1, applies the manifest, writes a kubeconfig for
//! itself, prints `listening URL`, then takes one command per line on standard input and
//! answers each with `ok [RESOURCEVERSION]` or `error MESSAGE`:
//!
//! - `apply FILE`: apply every object of a YAML manifest;
//! - `delete KIND NAMESPACE NAME` (`-` as the namespace of cluster-scoped kinds);
//! - `expire` (410 Gone to every watch), `drop` (cut every watch), `bookmark`;
//! - `stop` / `restart` (an outage and its end); `stall` / `unstall` (a hung server: open
//!   connections go silent, new requests get no answer; and its end, for new requests);
//! - `fail CODE N [RETRY-AFTER]` (the next N requests answered with status CODE, even while
//!   stalled, with `Retry-After: RETRY-AFTER` seconds when given, as API Priority and
//!   Fairness sends with its 429s; N 0 stops), `truncate BYTES` (list bodies cut after BYTES, then the connection aborted;
//!   `truncate off` to stop), `delay MS` (every request answered MS milliseconds late; 0 to
//!   stop);
//! - `events`: the Events posted so far, as a JSON array after `ok`;
//! - `forbid-events` / `allow-events`: Event posts refused with 403 (no RBAC rule), or not;
//! - `forbid RESOURCE` / `allow RESOURCE`: every request for one resource (`services`,
//!   `endpointslices`, `nodes`, `servicecidrs`, with or without its group, as `kubectl`
//!   names it) refused with 403 as the real server words it, or served again: a missing RBAC
//!   rule for that resource alone.
//!
//! It exits when standard input closes. `--help` prints this usage.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use kpng_fake_apiserver::{FakeApiServer, Resource};

/// What `--help` prints (the commands are the module's list).
const USAGE: &str = "\
usage: kpng-fake-apiserver [--manifest FILE] [--kubeconfig FILE] [--no-service-cidrs]

A fake Kubernetes API server for tests. Listens on a free port of 127.0.0.1, applies the
manifest, writes a kubeconfig for itself, prints `listening URL`, then reads one command per
line on standard input and answers `ok [RESOURCEVERSION]` or `error MESSAGE`:

  apply FILE                 apply every object of a YAML manifest
  delete KIND NAMESPACE NAME (`-` as the namespace of cluster-scoped kinds)
  expire | drop | bookmark   410 Gone to every watch | cut every watch | a bookmark now
  stop | restart             an outage (connections refused) and its end
  stall | unstall            a hung server (no answers) and its end, for new requests
  fail CODE N [RETRY-AFTER]  answer the next N requests with status CODE (N 0: stop),
                             with `Retry-After: RETRY-AFTER` (seconds) when given
  truncate BYTES|off         cut list bodies after BYTES and abort the connection
  delay MS                   answer every request MS milliseconds late (0: stop)
  events                     the Events posted so far, as a JSON array
  forbid-events | allow-events
  forbid RESOURCE | allow RESOURCE
                             refuse every request for RESOURCE with 403 (a missing RBAC
                             rule), or serve it again: services, endpointslices, nodes,
                             servicecidrs

It exits when standard input closes.
";

struct Args {
    manifest: Option<PathBuf>,
    kubeconfig: Option<PathBuf>,
    service_cidrs: bool,
}

/// The arguments, or `None` for `--help`.
fn parse_args() -> Result<Option<Args>, String> {
    let mut args = Args {
        manifest: None,
        kubeconfig: None,
        service_cidrs: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--manifest" => args.manifest = it.next().map(PathBuf::from),
            "--kubeconfig" => args.kubeconfig = it.next().map(PathBuf::from),
            "--no-service-cidrs" => args.service_cidrs = false,
            "--help" | "-h" => return Ok(None),
            other => return Err(format!("unknown argument {other:?} (see --help)")),
        }
    }
    Ok(Some(args))
}

/// Runs one command line; the answer's text after `ok`.
fn command(server: &mut FakeApiServer, line: &str) -> Result<String, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let rv = |r: Result<u64, kpng_fake_apiserver::Error>| {
        r.map(|v| v.to_string()).map_err(|e| e.to_string())
    };
    match words[..] {
        ["apply", file] => {
            let text = std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?;
            return rv(server.apply_manifest(&text));
        }
        ["delete", kind, namespace, name] => {
            let namespace = if namespace == "-" { "" } else { namespace };
            return rv(server.delete(kind, namespace, name));
        }
        // The Events posted so far, as one JSON array on the answer line.
        ["events"] => {
            return serde_json::to_string(&server.events()).map_err(|e| e.to_string());
        }
        // Event posts refused (403) from now on, or accepted again.
        ["forbid-events"] => server.forbid_events(true),
        ["allow-events"] => server.forbid_events(false),
        ["expire"] => server.expire_watches(),
        ["drop"] => server.drop_watches(),
        ["bookmark"] => server.bookmark(),
        ["stop"] => server.stop(),
        ["stall"] => server.stall(true),
        ["unstall"] => server.stall(false),
        ["restart"] => server.restart().map_err(|e| e.to_string())?,
        ["fail", code, count] | ["fail", code, count, _] => {
            let number = |w: &str| w.parse::<u64>().map_err(|e| format!("{w:?}: {e}"));
            let code = u16::try_from(number(code)?).map_err(|e| e.to_string())?;
            let retry_after = match words[..] {
                [_, _, _, seconds] => Some(number(seconds)?),
                _ => None,
            };
            server
                .fail_retry_after(code, number(count)?, retry_after)
                .map_err(|e| e.to_string())?;
        }
        ["forbid" | "allow", resource] => {
            let named = Resource::of_plural(resource).ok_or_else(|| {
                format!(
                    "unknown resource {resource:?} (one of services, endpointslices, nodes, \
                     servicecidrs)"
                )
            })?;
            server.forbid(named, words[0] == "forbid");
        }
        ["truncate", "off"] => server.truncate(None),
        ["truncate", bytes] => {
            server.truncate(Some(bytes.parse().map_err(|e| format!("{bytes:?}: {e}"))?));
        }
        ["delay", ms] => {
            let ms: u64 = ms.parse().map_err(|e| format!("{ms:?}: {e}"))?;
            server.delay((ms > 0).then(|| std::time::Duration::from_millis(ms)));
        }
        _ => return Err(format!("unknown command {line:?}")),
    }
    Ok(String::new())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(Some(a)) => a,
        Ok(None) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("kpng-fake-apiserver: {e}");
            return ExitCode::from(2);
        }
    };
    let started = FakeApiServer::builder()
        .service_cidrs(args.service_cidrs)
        .start();
    let mut server = match started {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kpng-fake-apiserver: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(path) = &args.manifest {
        let applied = std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|text| server.apply_manifest(&text).map_err(|e| e.to_string()));
        if let Err(e) = applied {
            eprintln!("kpng-fake-apiserver: {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if let Some(path) = &args.kubeconfig
        && let Err(e) = server.write_kubeconfig(path)
    {
        eprintln!("kpng-fake-apiserver: {e}");
        return ExitCode::FAILURE;
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "listening {}", server.url());
    let _ = out.flush();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let answer = match command(&mut server, &line) {
            Ok(text) if text.is_empty() => "ok".to_string(),
            Ok(text) => format!("ok {text}"),
            Err(e) => format!("error {e}"),
        };
        let _ = writeln!(out, "{answer}");
        let _ = out.flush();
    }
    ExitCode::SUCCESS
}
