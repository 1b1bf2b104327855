//! Which API server, with which credentials: kube-proxy's `--kubeconfig` / `--master`, or the
//! in-cluster service account when neither is given.

use std::path::PathBuf;

use kpng_model::input::InputHealth;
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::client_metrics::{ClientMetrics, ClientMetricsLayer};
use crate::rate_limit::{RateLimitLayer, TokenBucket};
use crate::reachability::{Reachability, ReachabilityLayer};
use crate::token_file::{TokenFile, TokenFileError, TokenFileLayer};

/// How to reach the API server.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientOptions {
    /// `--kubeconfig`: a kubeconfig file (its current context).
    pub kubeconfig: Option<PathBuf>,
    /// `--master`: the API server's URL; overrides the kubeconfig's server.
    pub master: Option<String>,
    /// `--kube-api-qps`: sustained requests per second (not positive: no limit).
    pub qps: f32,
    /// `--kube-api-burst`: requests allowed at once above the sustained rate.
    pub burst: u32,
    /// `--kube-api-idle-timeout`: how long a connection may receive nothing before the
    /// request on it fails and is made again. Without it, kube's client waits for ever on a
    /// hung list and 295 s on a silent watch, and a node programs nothing new meanwhile while
    /// everything looks fine. The API server sends every watch that allows bookmarks (as
    /// kube's watcher asks) one a minute, so only a dead connection goes this long silent.
    pub idle_timeout: std::time::Duration,
}

impl Default for ClientOptions {
    /// kube-proxy's defaults: in-cluster, 5 requests per second, bursts of 10.
    fn default() -> Self {
        ClientOptions {
            kubeconfig: None,
            master: None,
            qps: 5.0,
            burst: 10,
            idle_timeout: std::time::Duration::from_secs(90),
        }
    }
}

/// `url` without the user and password it may carry (`https://admin:secret@host/` →
/// `https://***@host/`), for logs and status: `--master` may hold them, and they must not
/// reach a log collector or a debug page.
pub fn without_credentials(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The kubeconfig file could not be read (kube's own message quotes the path twice and
    /// names no flag, so it is worded here).
    #[error(
        "the kubeconfig {path} (--kubeconfig, or clientConnection.kubeconfig of a --config file) \
         cannot be read: {source}"
    )]
    KubeconfigUnreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The kubeconfig could not be used.
    #[error("--kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What was wrong with it.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// `--master` is not a URL.
    #[error("--master {url:?} is not a URL: {source}")]
    Master {
        /// The value given.
        url: String,
        /// Why it does not parse.
        #[source]
        source: http::uri::InvalidUri,
    },
    /// The kubeconfig's (or the service account's) token file cannot be used.
    #[error(transparent)]
    TokenFile(#[from] TokenFileError),
    /// Neither flag was given and this is not a Pod with a service account.
    #[error(
        "no --kubeconfig or --master given, and no in-cluster configuration ({0}); \
         pass --kubeconfig PATH or run kpng in a Pod"
    )]
    InCluster(#[source] kube::config::InClusterError),
    /// kube refused the configuration (TLS material, auth plugin, …).
    #[error("building the API client: {0}")]
    Client(#[source] kube::Error),
}

/// A client for the configured API server, rate limited and with outages logged once.
/// Returns the client and the server's URL (for log lines). Nothing probes the server (see
/// [`connect`]): a stream silent since an outage began is still resumed when another request
/// ends the outage.
pub async fn client(options: &ClientOptions) -> Result<(kube::Client, String), ConnectError> {
    let c = connect(options, &ClientMetrics::default(), &InputHealth::default()).await?;
    Ok((c.client, c.server))
}

/// A client and what follows its API server's reachability.
#[derive(Clone)]
pub struct Connection {
    /// The client.
    pub client: kube::Client,
    /// The server's URL without credentials, for log lines.
    pub server: String,
    /// Its outages: [`Reachability::keep_alive`] probes the server while streams are silent
    /// (the source runs it, see `KubeSource::with_reachability`).
    pub reachability: Reachability,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

/// [`client`], its requests counted in `metrics` (client-go's `rest_client_*`) and API server
/// outages recorded in `health` (`kpng status`), with its [`Reachability`].
pub async fn connect(
    options: &ClientOptions,
    metrics: &ClientMetrics,
    health: &InputHealth,
) -> Result<Connection, ConnectError> {
    let master = options
        .master
        .as_ref()
        .map(|url| {
            url.parse::<http::Uri>()
                .map_err(|source| ConnectError::Master {
                    url: url.clone(),
                    source,
                })
        })
        .transpose()?;
    let mut config = match (&options.kubeconfig, &master) {
        (Some(path), _) => {
            let kubeconfig = |source| ConnectError::Kubeconfig {
                path: path.clone(),
                source,
            };
            let file = Kubeconfig::read_from(path).map_err(|e| match e {
                kube::config::KubeconfigError::ReadConfig(source, _) => {
                    ConnectError::KubeconfigUnreadable {
                        path: path.clone(),
                        source,
                    }
                }
                other => kubeconfig(other),
            })?;
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(kubeconfig)?
        }
        (None, Some(url)) => kube::Config::new(url.clone()),
        (None, None) => kube::Config::incluster().map_err(ConnectError::InCluster)?,
    };
    if let Some(url) = master {
        config.cluster_url = url;
    }
    // Read by kpng, trimmed as client-go does (kube would send a trailing newline); an inline
    // token takes precedence over the file, as in kube and client-go.
    let token_file = match config.auth_info.token_file.take() {
        Some(path) if config.auth_info.token.is_none() => {
            Some(TokenFile::open(PathBuf::from(path))?)
        }
        _ => None,
    };
    // Counted from each request sent, not from when its pooled connection went idle.
    config.read_timeout = Some(options.idle_timeout);
    config.reset_reader_on_write = true;
    // No retries inside kube's stack: its default (`RetryPolicy::server_retry`, up to 15
    // attempts with delays doubling to minutes on 429, 503 and 504) sits below kpng's layers,
    // so a sustained 503 stalled the node for minutes with no warning, no `kpng status`
    // problem and no `rest_client_requests_total{code="503"}`. Every attempt now passes
    // through the reachability and metrics layers; the watchers' backoff (which honours
    // `Retry-After`) makes them again.
    config.default_retry = false;
    // Named in logs, `kpng status` and metrics: never with a password from `--master`.
    let server = without_credentials(&config.cluster_url.to_string());
    // client-go's `host` label: the URL's host and port, not the whole URL.
    let host = config
        .cluster_url
        .authority()
        .map_or_else(|| server.clone(), |a| a.to_string());
    let reachability = Reachability::new(&server)
        .with_health(health.clone())
        .with_idle_timeout(options.idle_timeout);
    let client = ClientBuilder::try_from(config)
        .map_err(ConnectError::Client)?
        .with_layer(&ReachabilityLayer(reachability.clone()))
        .with_layer(&ClientMetricsLayer {
            metrics: metrics.clone(),
            host: host.as_str().into(),
        })
        .with_layer(&TokenFileLayer(token_file))
        .with_layer(&RateLimitLayer(TokenBucket::new(
            options.qps,
            options.burst,
        )))
        .build();
    Ok(Connection {
        client,
        server,
        reachability,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_left_out_of_a_url() {
        for (url, shown) in [
            (
                "https://admin:S3cret@10.0.0.1:6443/",
                "https://***@10.0.0.1:6443/",
            ),
            ("https://token@api.example/", "https://***@api.example/"),
            ("https://10.0.0.1:6443/", "https://10.0.0.1:6443/"),
            ("https://10.0.0.1/path@x", "https://10.0.0.1/path@x"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(without_credentials(url), shown, "{url}");
        }
    }

    /// A kubeconfig whose `client-certificate` and `client-key` name the same file, the
    /// certificate and its key in it (the kubelet's `kubelet-client-current.pem`, which a
    /// kube-proxy or kpng on the node often uses), gives a client whose TLS identity is that
    /// pair, in either order; a file without a key is refused when the client is built (so the
    /// identity is read then, not at the first request).
    #[tokio::test]
    async fn a_combined_certificate_and_key_file_is_a_client_identity() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut params =
            rcgen::CertificateParams::new(vec!["system:node:node1".to_string()]).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:node:node1");
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("cert").pem();
        let key = key.serialize_pem();
        let ca = dir.path().join("ca.crt");
        std::fs::write(&ca, &cert).expect("write the CA");
        /// (file name, contents)
        type Files = Vec<(&'static str, String)>;
        // (what the kubeconfig names, the files' contents, whether a client is built)
        let cases: [(&str, Files, bool); 5] = [
            (
                "separate files",
                vec![("client.crt", cert.clone()), ("client.key", key.clone())],
                true,
            ),
            (
                "one file, the certificate first (as the kubelet writes it)",
                vec![("both.pem", format!("{cert}{key}"))],
                true,
            ),
            (
                "one file, the key first",
                vec![("both.pem", format!("{key}{cert}"))],
                true,
            ),
            (
                "one file without a key",
                vec![("both.pem", cert.clone())],
                false,
            ),
            (
                "one file without a certificate",
                vec![("both.pem", key.clone())],
                false,
            ),
        ];
        for (what, files, builds) in cases {
            for (name, text) in &files {
                std::fs::write(dir.path().join(name), text).expect("write");
            }
            let first = dir.path().join(files[0].0);
            let last = dir.path().join(files[files.len() - 1].0);
            let kubeconfig = dir.path().join("kubeconfig");
            std::fs::write(
                &kubeconfig,
                format!(
                    "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  \
                     cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority: \
                     {}\nusers:\n- name: u\n  user:\n    client-certificate: {}\n    \
                     client-key: {}\ncontexts:\n- name: c\n  context:\n    cluster: k\n    \
                     user: u\n",
                    ca.display(),
                    first.display(),
                    last.display()
                ),
            )
            .expect("write the kubeconfig");
            let options = ClientOptions {
                kubeconfig: Some(kubeconfig),
                ..ClientOptions::default()
            };
            match (client(&options).await, builds) {
                (Ok(_), true) => {}
                (Err(e), false) => {
                    let text = e.to_string();
                    assert!(text.contains("building the API client"), "{what}: {text}");
                }
                (Ok(_), false) => panic!("{what}: a client without an identity"),
                (Err(e), true) => panic!("{what}: {e}"),
            }
        }
    }

    #[tokio::test]
    async fn an_unreadable_kubeconfig_is_named_once_with_where_it_came_from() {
        let options = ClientOptions {
            kubeconfig: Some(PathBuf::from("/nonexistent/kubeconfig.conf")),
            ..ClientOptions::default()
        };
        let Err(err) = client(&options).await else {
            panic!("a client from a kubeconfig that does not exist");
        };
        let err = err.to_string();
        assert_eq!(
            err,
            "the kubeconfig /nonexistent/kubeconfig.conf (--kubeconfig, or \
             clientConnection.kubeconfig of a --config file) cannot be read: No such file or \
             directory (os error 2)"
        );
    }
}
