//! A kubeconfig's `tokenFile` (and the in-cluster service account token), read as client-go
//! reads it: trimmed of surrounding whitespace, and again at least once a minute.
//!
//! Why not kube's own: kube sends the file's content as it is, so a token written with a
//! trailing newline (`kubectl create token … > token` writes one) is not a valid header value,
//! and every request fails with "invalid bearer token" while kube-proxy, whose client-go trims
//! the file, connects. Rotation (projected service account tokens) needs the re-read; a file
//! that cannot be read at a re-read keeps the last token, as client-go and kube do
//! (kubernetes#68164: some clients remove the file once read).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::HeaderValue;
use tracing::warn;

/// How long a token read from the file is used before the file is read again (client-go's
/// and kube's period).
pub const REREAD_AFTER: Duration = Duration::from_secs(60);

/// The token file could not be used when the client was built.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    /// The file cannot be read.
    #[error("the token file {path} (the kubeconfig's tokenFile) cannot be read: {source}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// What the file holds cannot be sent as a bearer token.
    #[error("the token file {path} (the kubeconfig's tokenFile) does not hold a token: {why}")]
    NotAToken {
        /// The file.
        path: PathBuf,
        /// What is wrong with its content.
        why: &'static str,
    },
}

/// The `Authorization` header for the token in `content`: the content trimmed of surrounding
/// whitespace, as client-go trims it.
fn bearer_header(content: &str) -> Result<HeaderValue, &'static str> {
    let token = content.trim();
    if token.is_empty() {
        return Err("the file is empty");
    }
    let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| "it holds characters a token cannot have (control characters)")?;
    value.set_sensitive(true);
    Ok(value)
}

fn read(path: &Path) -> Result<HeaderValue, TokenFileError> {
    let content = std::fs::read_to_string(path).map_err(|source| TokenFileError::Unreadable {
        path: path.to_path_buf(),
        source,
    })?;
    bearer_header(&content).map_err(|why| TokenFileError::NotAToken {
        path: path.to_path_buf(),
        why,
    })
}

#[derive(Debug)]
struct Cached {
    header: HeaderValue,
    read_at: Instant,
}

/// The token of one file, shared by every clone of the layer's service.
#[derive(Debug, Clone)]
pub struct TokenFile {
    path: Arc<PathBuf>,
    cached: Arc<Mutex<Cached>>,
}

impl TokenFile {
    /// Reads `path` now: a client whose token cannot be read is an error at start, naming the
    /// file, rather than a failure at every request.
    pub fn open(path: PathBuf) -> Result<TokenFile, TokenFileError> {
        let header = read(&path)?;
        Ok(TokenFile {
            path: Arc::new(path),
            cached: Arc::new(Mutex::new(Cached {
                header,
                read_at: Instant::now(),
            })),
        })
    }

    /// The header to send now, from the file read again if the last read is older than
    /// [`REREAD_AFTER`].
    fn header(&self, now: Instant) -> HeaderValue {
        let mut cached = self
            .cached
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if now.duration_since(cached.read_at) >= REREAD_AFTER {
            match read(&self.path) {
                Ok(header) => cached.header = header,
                Err(e) => warn!("keeping the last token: {e}"),
            }
            cached.read_at = now;
        }
        cached.header.clone()
    }
}

/// Adds the token file's `Authorization` header to every request (nothing without a file).
#[derive(Debug, Clone)]
pub struct TokenFileLayer(pub Option<TokenFile>);

impl<S> tower::Layer<S> for TokenFileLayer {
    type Service = WithToken<S>;

    fn layer(&self, inner: S) -> WithToken<S> {
        WithToken {
            inner,
            token: self.0.clone(),
        }
    }
}

/// A service whose requests carry the token.
#[derive(Debug, Clone)]
pub struct WithToken<S> {
    inner: S,
    token: Option<TokenFile>,
}

impl<S, B> tower::Service<http::Request<B>> for WithToken<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        if let Some(token) = &self.token {
            request
                .headers_mut()
                .insert(http::header::AUTHORIZATION, token.header(Instant::now()));
        }
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_read_as_client_go_reads_it() {
        for (content, header) in [
            ("tok123", Ok("Bearer tok123")),
            ("tok123\n", Ok("Bearer tok123")),
            ("  tok123\r\n\n", Ok("Bearer tok123")),
            ("", Err("the file is empty")),
            ("\n", Err("the file is empty")),
            (
                "tok\u{7}123",
                Err("it holds characters a token cannot have (control characters)"),
            ),
        ] {
            let got = bearer_header(content);
            let got = got.as_ref().map(|h| h.to_str().unwrap_or_default());
            assert_eq!(got, header.as_ref().map(|h| *h), "{content:?}");
        }
    }

    #[test]
    fn the_file_is_read_again_after_a_minute_and_a_failed_read_keeps_the_token() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        std::fs::write(&path, "first\n").expect("write");
        let token = TokenFile::open(path.clone()).expect("open");
        let start = Instant::now();
        std::fs::write(&path, "second\n").expect("write");
        assert_eq!(token.header(start), "Bearer first", "cached for a minute");
        let later = start + REREAD_AFTER;
        assert_eq!(token.header(later), "Bearer second");
        std::fs::remove_file(&path).expect("remove");
        let much_later = later + REREAD_AFTER;
        assert_eq!(token.header(much_later), "Bearer second", "kept");
    }

    #[test]
    fn a_missing_or_empty_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        let err = TokenFile::open(path.clone()).expect_err("missing");
        assert!(err.to_string().starts_with(&format!(
            "the token file {} (the kubeconfig's tokenFile) cannot be read: ",
            path.display()
        )));
        std::fs::write(&path, "\n").expect("write");
        let err = TokenFile::open(path.clone()).expect_err("empty");
        assert_eq!(
            err.to_string(),
            format!(
                "the token file {} (the kubeconfig's tokenFile) does not hold a token: the file \
                 is empty",
                path.display()
            )
        );
    }
}
