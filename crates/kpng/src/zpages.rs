//! kube-proxy's debug pages on the metrics address: `/configz` (the effective
//! KubeProxyConfiguration, JSON), `/flagz` (every flag's effective value) and `/statusz`
//! (start time, uptime, version). Why: an operator comparing kpng with the kube-proxy it
//! replaced asks these pages first, and tools scrape `/configz`.

use std::time::SystemTime;

use crate::cli::GlobalFlags;

/// The texts of the three pages: fixed at start, since flags and configuration do not change
/// while kpng runs.
#[derive(Debug, Clone)]
pub struct ZPages {
    /// `/configz`: `{"kubeproxy.config.k8s.io": <KubeProxyConfiguration>}`, as kube-proxy.
    pub configz: String,
    /// `/flagz`.
    pub flagz: String,
    /// When kpng started.
    pub started: SystemTime,
    /// What serves: `kpng` and the backend.
    pub component: String,
}

/// The warning kube's z-pages start with.
const NOT_PARSEABLE: &str = "Warning: This endpoint is not meant to be machine parseable, has no \
     formatting compatibility guarantees and is for debugging purposes only.";

impl ZPages {
    /// The pages of a kpng running with `flags` (`backend`: the backend's or sink's name).
    pub fn new(flags: &GlobalFlags, backend: &str) -> ZPages {
        let configz = match crate::config::effective(flags)
            .and_then(|c| serde_json::to_value(c).map_err(anyhow::Error::from))
        {
            Ok(config) => serde_json::json!({ "kubeproxy.config.k8s.io": config }).to_string(),
            Err(e) => serde_json::json!({ "error": format!("{e:#}") }).to_string(),
        };
        let mut flagz = format!("kpng flagz\n{NOT_PARSEABLE}\n\n");
        for line in &flags.effective_flags {
            flagz.push_str(line);
            flagz.push('\n');
        }
        ZPages {
            configz,
            flagz,
            started: SystemTime::now(),
            component: format!("kpng ({backend})"),
        }
    }

    /// `/statusz` now.
    pub fn statusz(&self) -> String {
        let info = crate::version::BuildInfo::current();
        let up = SystemTime::now()
            .duration_since(self.started)
            .unwrap_or_default();
        let up = std::time::Duration::from_secs(up.as_secs());
        format!(
            "{} statusz\n{NOT_PARSEABLE}\n\nStarted: {}\nUp: {}\nBinary version: {} (git {}, built {})\nKubernetes schema: {}\nPaths: /configz /flagz /healthz /metrics /proxyMode /statusz\n",
            self.component,
            humantime::format_rfc3339_seconds(self.started),
            humantime::format_duration(up),
            info.version,
            info.git_commit,
            info.build_date,
            info.kubernetes_schema,
        )
    }
}

/// Every flag clap knows with its effective value (`--name=value`), sorted, for `/flagz`:
/// the ones given and the defaults, so the page answers "what does this kpng run with".
pub fn effective_flags(command: &clap::Command, matches: &clap::ArgMatches) -> Vec<String> {
    let mut out = Vec::new();
    collect(command, matches, &mut out);
    out.sort();
    out.dedup();
    out
}

fn collect(command: &clap::Command, matches: &clap::ArgMatches, out: &mut Vec<String>) {
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        let Some(long) = arg.get_long() else {
            continue;
        };
        if let Ok(Some(values)) = matches.try_get_raw(id) {
            // A URL's user and password (`--master https://user:pass@…`) stay off the page.
            let values: Vec<String> = values
                .map(|v| kpng_source_kube::without_credentials(&v.to_string_lossy()))
                .collect();
            out.push(format!("--{long}={}", values.join(",")));
        } else if arg.get_action().takes_values() {
            // Unset and without a default (`--cluster-cidr`, `--node-ip`): listed empty, as
            // kube-proxy's page lists every flag, so its absence is visible too.
            out.push(format!("--{long}="));
        }
    }
    if let Some((name, sub)) = matches.subcommand()
        && let Some(sub_command) = command.find_subcommand(name)
    {
        collect(sub_command, sub, out);
    }
}
