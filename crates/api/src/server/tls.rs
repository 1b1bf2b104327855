//! The brain's TLS, taken again from its files when they change.
//!
//! Why: certificates in a cluster rotate (cert-manager renews at 2/3 of their lifetime, a CA
//! bundle gains the new CA before the old one is dropped). A brain that read its files once
//! kept presenting the old certificate until it expired, and from then on every node that
//! reconnected failed its handshake, until someone restarted the brain. So each new
//! connection is handed the current rustls configuration: before its handshake, and every
//! [`RELOAD_INTERVAL`], the files are looked at (a `stat` each: modification time, size and
//! inode, which also sees a Kubernetes Secret volume swap its `..data` symlink) and, when they
//! changed, loaded and checked. Connections already established keep their session.
//!
//! A change that does not load (a file half written, a key from another pair during a copy,
//! a PEM that does not parse, a file missing for a moment) never replaces working material:
//! the previous certificate stays served, one warning names the file and the reason, the
//! failure counter goes up, and the files are tried again at their next change.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinSet;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_stream::Stream;
use tracing::{debug, info, warn};

use super::conn::PeerIp;
use super::refusal_log::{Refusal, RefusalLog};
use crate::addr::TlsFiles;
use crate::metrics::{ApiMetrics, TlsFileLabel, TlsStatus};

/// How often the files are looked at when no connection comes (new connections look before
/// their handshake): what bounds how long the expiry metric and `kpng status` lag a renewal.
pub(crate) const RELOAD_INTERVAL: Duration = Duration::from_secs(10);

/// Why TLS material cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file is missing or unreadable.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A file does not hold what it should.
    #[error("{path}: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The key is not the certificate's.
    #[error(
        "the key in {key} is not the key of the certificate in {cert} (files of different \
         pairs, such as a copy half done)"
    )]
    Mismatch {
        /// The certificate file.
        cert: String,
        /// The key file.
        key: String,
    },
}

fn invalid(path: &Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError::Invalid {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// The files of a TLS server: certificate (chain) and key, and with mTLS the client CA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Paths {
    cert: PathBuf,
    key: PathBuf,
    ca: Option<PathBuf>,
}

impl Paths {
    /// The paths of `files`; `Ok(None)` without TLS, an error when only half of a pair is
    /// given.
    pub(crate) fn of(files: &TlsFiles) -> Result<Option<Paths>, String> {
        if !files.enabled() {
            return Ok(None);
        }
        let (Some(cert), Some(key)) = (&files.cert, &files.key) else {
            return Err("--listen-tls-cert and --listen-tls-key go together".into());
        };
        Ok(Some(Paths {
            cert: cert.clone(),
            key: key.clone(),
            ca: files.ca.clone(),
        }))
    }

    fn all(&self) -> impl Iterator<Item = &Path> {
        [
            Some(self.cert.as_path()),
            Some(self.key.as_path()),
            self.ca.as_deref(),
        ]
        .into_iter()
        .flatten()
    }
}

/// What a `stat` says of a file: enough to see that it was written, replaced or swapped.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stamp {
    File {
        modified: Option<std::time::SystemTime>,
        len: u64,
        /// Device and inode (Unix): a file renamed over another, or a symlink swapped to a
        /// new directory, is a new inode even with the same time and size.
        id: (u64, u64),
    },
    Unreadable(io::ErrorKind),
}

impl Stamp {
    fn of(path: &Path) -> Stamp {
        match std::fs::metadata(path) {
            Ok(meta) => Stamp::File {
                modified: meta.modified().ok(),
                len: meta.len(),
                id: file_id(&meta),
            },
            Err(e) => Stamp::Unreadable(e.kind()),
        }
    }
}

#[cfg(unix)]
fn file_id(meta: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

#[cfg(not(unix))]
fn file_id(_: &std::fs::Metadata) -> (u64, u64) {
    (0, 0)
}

/// The stamps of every file, in [`Paths::all`]'s order.
fn stamps(paths: &Paths) -> Vec<Stamp> {
    paths.all().map(Stamp::of).collect()
}

/// The served certificate, as the log, the metric and `kpng status` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Leaf {
    subject: String,
    /// notAfter, Unix time.
    not_after: i64,
}

impl Leaf {
    fn of(path: &Path, der: &[u8]) -> Result<Leaf, TlsError> {
        use x509_parser::prelude::{FromDer, X509Certificate};
        let (_, cert) = X509Certificate::from_der(der)
            .map_err(|e| invalid(path, format!("the certificate does not parse: {e}")))?;
        Ok(Leaf {
            subject: cert.subject().to_string(),
            not_after: cert.validity().not_after.timestamp(),
        })
    }

    /// notAfter as every time of `kpng status`'s JSON is written: RFC 3339 in UTC with
    /// milliseconds (`2030-01-01T00:00:00.000Z`; until 2026-12-07 this one had none).
    fn not_after_rfc3339(&self) -> String {
        u64::try_from(self.not_after)
            .ok()
            .map(|s| std::time::UNIX_EPOCH + Duration::from_secs(s))
            .map(|t| humantime::format_rfc3339_millis(t).to_string())
            .unwrap_or_else(|| self.not_after.to_string())
    }
}

/// What the files held when read, in [`Paths::all`]'s order: each file's bytes, or why it
/// could not be read. Compared with what was last tried, so that a change writing the same
/// bytes again (a `touch`, a Secret synced unchanged) is no reload, and a failure is not
/// tried (and warned about) again until the files hold something else.
type Contents = Vec<Result<Vec<u8>, io::ErrorKind>>;

fn read_all(paths: &Paths) -> Vec<io::Result<Vec<u8>>> {
    paths.all().map(std::fs::read).collect()
}

fn contents(read: &[io::Result<Vec<u8>>]) -> Contents {
    read.iter()
        .map(|r| match r {
            Ok(bytes) => Ok(bytes.clone()),
            Err(e) => Err(e.kind()),
        })
        .collect()
}

/// TLS material loaded from the files and checked: what new connections are handed.
struct Material {
    config: Arc<ServerConfig>,
    leaf: Leaf,
    /// The client CA's certificates' subjects (mTLS), as the log names them.
    client_ca: Vec<String>,
}

/// The subjects of the certificates in a CA bundle (those that parse), for the log.
fn subjects(certs: &[CertificateDer<'_>]) -> Vec<String> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    certs
        .iter()
        .filter_map(|der| X509Certificate::from_der(der).ok())
        .map(|(_, cert)| cert.subject().to_string())
        .collect()
}

fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(path, format!("not PEM: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(path, "no CERTIFICATE in the file"));
    }
    Ok(certs)
}

impl Material {
    /// Checks what [`read_all`] read of `paths`: certificates that parse, a key that is the
    /// leaf's, a client CA with at least one usable certificate.
    fn load(paths: &Paths, read: Vec<io::Result<Vec<u8>>>) -> Result<Material, TlsError> {
        let mut files = paths.all().zip(read).map(|(path, bytes)| {
            bytes.map_err(|source| TlsError::Read {
                path: path.display().to_string(),
                source,
            })
        });
        let mut next = || files.next().unwrap_or_else(|| Ok(Vec::new()));
        let (cert_pem, key_pem) = (next()?, next()?);
        let ca_pem = match paths.ca {
            Some(_) => Some(next()?),
            None => None,
        };
        let chain = certificates(&paths.cert, &cert_pem)?;
        let leaf = Leaf::of(&paths.cert, &chain[0])?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| invalid(&paths.key, format!("no private key: {e}")))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid(&paths.cert, e))?;
        let mut client_ca = Vec::new();
        let builder = match (&paths.ca, ca_pem) {
            (Some(path), Some(ca_pem)) => {
                let mut roots = RootCertStore::empty();
                let cas = certificates(path, &ca_pem)?;
                client_ca = subjects(&cas);
                // As tonic did: certificates webpki cannot use are skipped, not fatal.
                let (added, _) = roots.add_parsable_certificates(cas);
                if added == 0 {
                    return Err(invalid(path, "no usable CA certificate"));
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .map_err(|e| invalid(path, e))?;
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(chain, key).map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => TlsError::Mismatch {
                cert: paths.cert.display().to_string(),
                key: paths.key.display().to_string(),
            },
            other => invalid(&paths.key, other),
        })?;
        config.alpn_protocols.push(b"h2".to_vec());
        Ok(Material {
            config: Arc::new(config),
            leaf,
            client_ca,
        })
    }
}

/// What looking at the files found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Checked {
    /// Nothing to do: the files did not change, hold what is served, or hold what failed
    /// last time.
    Unchanged,
    /// New material is served from now on.
    Reloaded(Reload),
    /// The files changed but cannot be used; the previous material stays served. Once per
    /// content of the files.
    Failed(String),
    /// The files hold what is served again after a failure (a bad copy undone).
    Recovered,
}

/// What a reload took: the certificate (with its key), the client CA, or both. Told apart
/// because the log names what changed: a client CA renewed alone was logged with the server
/// certificate's subject as if the certificate had changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reload {
    /// The new certificate, when the certificate or key file changed.
    pub(crate) certificate: Option<Leaf>,
    /// The new client CA's subjects, when its file changed.
    pub(crate) client_ca: Option<Vec<String>>,
}

/// How closely to look at the files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Look {
    /// A `stat` of each file; read only when one changed (before each handshake).
    Stat,
    /// Read them too (every [`RELOAD_INTERVAL`]): a file written in place twice within the
    /// clock's tick with the same size keeps its stamp, and is seen here.
    Read,
}

/// The served material and what the files looked like when last tried.
struct Reloader {
    paths: Paths,
    /// The files' stamps when they were last read.
    seen: Vec<Stamp>,
    /// What the files held when last tried (whether that worked or not).
    tried: Contents,
    /// What the files held when the served material was loaded.
    served_contents: Contents,
    served: Material,
    /// Why the last change of the files could not be used.
    failure: Option<String>,
}

impl Reloader {
    /// Loads the files at start: any problem is an error.
    fn start(paths: Paths) -> Result<Reloader, TlsError> {
        let seen = stamps(&paths);
        let read = read_all(&paths);
        let tried = contents(&read);
        let served = Material::load(&paths, read)?;
        Ok(Reloader {
            paths,
            seen,
            served_contents: tried.clone(),
            tried,
            served,
            failure: None,
        })
    }

    /// Looks at the files and takes them when they changed and load.
    fn check(&mut self, look: Look) -> Checked {
        let now = stamps(&self.paths);
        if look == Look::Stat && now == self.seen {
            return Checked::Unchanged;
        }
        self.seen = now;
        let read = read_all(&self.paths);
        let held = contents(&read);
        if held == self.tried {
            return Checked::Unchanged;
        }
        self.tried = held.clone();
        if held == self.served_contents {
            return match self.failure.take() {
                Some(_) => Checked::Recovered,
                None => Checked::Unchanged,
            };
        }
        match Material::load(&self.paths, read) {
            Ok(material) => {
                // Contents are in [`Paths::all`]'s order: certificate, key, client CA.
                let pair_changed = held[..2] != self.served_contents[..2];
                let ca_changed = held.get(2) != self.served_contents.get(2);
                let reload = Reload {
                    certificate: pair_changed.then(|| material.leaf.clone()),
                    client_ca: ca_changed.then(|| material.client_ca.clone()),
                };
                self.served = material;
                self.served_contents = held;
                self.failure = None;
                Checked::Reloaded(reload)
            }
            Err(e) => {
                let reason = e.to_string();
                self.failure = Some(reason.clone());
                Checked::Failed(reason)
            }
        }
    }
}

/// A TLS server's configuration, taken again from its files when they change.
pub(crate) struct ServerTls {
    reloader: Mutex<Reloader>,
    metrics: ApiMetrics,
}

impl ServerTls {
    /// Loads `paths` (any problem fails start-up, naming the file) and publishes the
    /// certificate's expiry in `metrics`.
    pub(crate) fn start(paths: Paths, metrics: &ApiMetrics) -> Result<Arc<ServerTls>, TlsError> {
        let reloader = Reloader::start(paths)?;
        let tls = ServerTls {
            metrics: metrics.clone(),
            reloader: Mutex::new(reloader),
        };
        {
            let reloader = tls.lock();
            info!(
                file = %reloader.paths.cert.display(),
                subject = %reloader.served.leaf.subject,
                not_after = %reloader.served.leaf.not_after_rfc3339(),
                "API serving TLS (its files are reloaded when they change)"
            );
            tls.publish(&reloader);
        }
        Ok(Arc::new(tls))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Reloader> {
        self.reloader
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The configuration for a new connection: the files' own when they changed and load,
    /// else what is served.
    pub(crate) fn current(&self) -> Arc<ServerConfig> {
        self.looked(Look::Stat)
    }

    fn looked(&self, look: Look) -> Arc<ServerConfig> {
        let mut reloader = self.lock();
        let checked = reloader.check(look);
        self.report(&reloader, checked);
        reloader.served.config.clone()
    }

    /// Looks at the files every [`RELOAD_INTERVAL`], so the metric and the status follow a
    /// renewal when no node connects. Never returns.
    pub(crate) async fn watch(self: Arc<ServerTls>) {
        let mut every = tokio::time::interval(RELOAD_INTERVAL);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            drop(self.looked(Look::Read));
        }
    }

    fn report(&self, reloader: &Reloader, checked: Checked) {
        let cert = reloader.paths.cert.display();
        match checked {
            Checked::Unchanged => return,
            Checked::Reloaded(reload) => log_reload(&reloader.paths, &reload),
            Checked::Recovered => info!(
                file = %cert,
                "API TLS files hold the served certificate again"
            ),
            Checked::Failed(reason) => {
                self.metrics.tls_reload_failures.inc();
                warn!(
                    "API TLS files changed but cannot be used, still serving the previous \
                     certificate (retried at their next change): {reason}"
                );
            }
        }
        self.publish(reloader);
    }

    /// The served certificate's expiry and the last failure, in the metrics and the status.
    fn publish(&self, reloader: &Reloader) {
        let leaf = &reloader.served.leaf;
        let file = reloader.paths.cert.display().to_string();
        self.metrics
            .tls_certificate_expiry
            .get_or_create(&TlsFileLabel { file: file.clone() })
            .set(leaf.not_after);
        self.metrics.tls.set(TlsStatus {
            file,
            subject: leaf.subject.clone(),
            not_after: leaf.not_after_rfc3339(),
            not_after_unix: leaf.not_after,
            reload_failure: reloader.failure.clone(),
        });
    }
}

/// The log line of a reload, naming what changed: the certificate (its file, subject and
/// expiry), the client CA (its file and subjects), or both.
fn log_reload(paths: &Paths, reload: &Reload) {
    let ca_file = paths
        .ca
        .as_deref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    match (&reload.certificate, &reload.client_ca) {
        (Some(leaf), None) => info!(
            file = %paths.cert.display(),
            subject = %leaf.subject,
            not_after = %leaf.not_after_rfc3339(),
            "API TLS files changed: new connections get the new certificate (connected \
             nodes keep theirs)"
        ),
        (None, Some(subjects)) => info!(
            ca_file = %ca_file,
            ca_subject = %subjects.join("; "),
            "API TLS client CA reloaded: new connections' client certificates are checked \
             against the new CA, the served certificate is unchanged (connected nodes keep \
             theirs)"
        ),
        (Some(leaf), Some(subjects)) => info!(
            file = %paths.cert.display(),
            subject = %leaf.subject,
            not_after = %leaf.not_after_rfc3339(),
            ca_file = %ca_file,
            ca_subject = %subjects.join("; "),
            "API TLS certificate and client CA reloaded: new connections get the new \
             certificate and their client certificates are checked against the new CA \
             (connected nodes keep theirs)"
        ),
        // Not reached: a reload changes the pair, the client CA or both.
        (None, None) => info!(
            file = %paths.cert.display(),
            "API TLS files changed: new connections get them (connected nodes keep theirs)"
        ),
    }
}

/// How long a TLS handshake may take: a client that connects and says nothing is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The accepted connections of `incoming` after their TLS handshake, each with the
/// configuration current when it started. Handshakes run side by side (one slow client holds
/// up no other), at most [`HANDSHAKE_TIMEOUT`] each. A failed one is counted
/// (`kpng_api_tls_handshake_failures_total`) and warned about naming its peer and the reason,
/// the first from each address in full and the rest summarised in `refusals` (until
/// 2026-12-07 it was a debug line, and a node refused for its certificate left no trace in
/// the brain's log). A connection closed before its handshake ended, with no reason of its
/// own (a TCP probe of the port), is a debug line only.
pub(crate) fn accept<S, IO>(
    incoming: S,
    tls: Arc<ServerTls>,
    refusals: Arc<RefusalLog>,
) -> TlsIncoming<S, IO>
where
    S: Stream<Item = io::Result<IO>>,
{
    TlsIncoming {
        incoming: Box::pin(incoming),
        incoming_done: false,
        tls,
        refusals,
        handshakes: JoinSet::new(),
    }
}

/// A failed handshake of `peer` (`None`: a Unix-socket client): counted, and warned about
/// when `refusals` says so.
fn handshake_failed(
    tls: &ServerTls,
    refusals: &RefusalLog,
    peer: Option<SocketAddr>,
    e: &io::Error,
) {
    let from = peer.map_or_else(|| "a Unix-socket client".to_string(), |a| a.to_string());
    if e.kind() == io::ErrorKind::UnexpectedEof {
        debug!("a connection from {from} closed before its TLS handshake ended: {e}");
        return;
    }
    tls.metrics.tls_handshake_failures.inc();
    if refusals.record(peer.map(|a| a.ip()), Refusal::TlsHandshake) {
        warn!(
            peer = %from,
            "TLS handshake with {from} failed: {e}; further failures from this address are \
             summarised once a minute"
        );
    } else {
        debug!(peer = %from, "TLS handshake failed: {e}");
    }
}

/// See [`accept`].
pub(crate) struct TlsIncoming<S, IO> {
    incoming: Pin<Box<S>>,
    incoming_done: bool,
    tls: Arc<ServerTls>,
    refusals: Arc<RefusalLog>,
    handshakes: JoinSet<Handshake<IO>>,
}

/// A handshake's outcome: the stream, or the peer's address (`None` over a Unix socket) and
/// why it failed.
type Handshake<IO> = Result<TlsStream<IO>, (Option<SocketAddr>, io::Error)>;

/// The handshake of `io`; its failure with the peer's address.
async fn handshake<IO>(tls: Arc<ServerTls>, io: IO) -> Handshake<IO>
where
    IO: AsyncRead + AsyncWrite + PeerIp + Unpin,
{
    let peer = io.peer_socket_addr();
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(io)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err((peer, e)),
        Err(_) => Err((
            peer,
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no TLS handshake within {HANDSHAKE_TIMEOUT:?}"),
            ),
        )),
    }
}

impl<S, IO> Stream for TlsIncoming<S, IO>
where
    S: Stream<Item = io::Result<IO>>,
    IO: AsyncRead + AsyncWrite + PeerIp + Unpin + Send + 'static,
{
    type Item = io::Result<TlsStream<IO>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        while !this.incoming_done {
            match this.incoming.as_mut().poll_next(cx) {
                Poll::Ready(Some(Ok(io))) => {
                    this.handshakes.spawn(handshake(this.tls.clone(), io));
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => this.incoming_done = true,
                Poll::Pending => break,
            }
        }
        loop {
            match this.handshakes.poll_join_next(cx) {
                Poll::Ready(Some(Ok(Ok(stream)))) => return Poll::Ready(Some(Ok(stream))),
                Poll::Ready(Some(Ok(Err((peer, e))))) => {
                    handshake_failed(&this.tls, &this.refusals, peer, &e);
                }
                Poll::Ready(Some(Err(e))) => debug!("TLS handshake task failed: {e}"),
                Poll::Ready(None) if this.incoming_done => return Poll::Ready(None),
                Poll::Ready(None) | Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests;
