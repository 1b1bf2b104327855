//! Where a brain listens and where a client connects: `tcp://HOST:PORT` or `unix:///PATH`
//! (a bare `HOST:PORT` is TCP), with optional TLS.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

/// A listening or connecting address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiAddr {
    /// TCP `host:port` (a socket address to listen on, any resolvable host to connect to).
    Tcp(String),
    /// A Unix socket path (reachable across network namespaces, e.g. a shared emptyDir).
    Unix(PathBuf),
}

/// An address that cannot be used: what was given, and what to write instead when the
/// mistake is a common one (a scheme, an IPv6 address without brackets).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{given:?} is not tcp://HOST:PORT, unix:///PATH or HOST:PORT{}", hint_suffix(.hint))]
pub struct AddrError {
    /// The address as given.
    pub given: String,
    /// What to write instead, when known.
    pub hint: Option<String>,
}

impl AddrError {
    fn plain(given: &str) -> AddrError {
        AddrError {
            given: given.to_string(),
            hint: None,
        }
    }

    fn hinted(given: &str, hint: String) -> AddrError {
        AddrError {
            given: given.to_string(),
            hint: Some(hint),
        }
    }
}

fn hint_suffix(hint: &Option<String>) -> String {
    hint.as_ref().map(|h| format!(" ({h})")).unwrap_or_default()
}

/// The hint for an address that lists several: one is taken, and a DNS name spreads nodes.
const SEVERAL_BRAINS: &str = "one brain address only; for several brains use one DNS name with \
                              several addresses (each connection picks one; a node moves to \
                              another when its brain goes away)";

impl FromStr for ApiAddr {
    type Err = AddrError;

    fn from_str(s: &str) -> Result<ApiAddr, AddrError> {
        if let Some(path) = s.strip_prefix("unix://") {
            if path.is_empty() {
                return Err(AddrError::plain(s));
            }
            return Ok(ApiAddr::Unix(PathBuf::from(path)));
        }
        // `https://brain:9000` is what people type for a TLS brain: say where TLS is set.
        for scheme in ["https://", "http://", "grpcs://", "grpc://"] {
            if let Some(rest) = s.strip_prefix(scheme) {
                return Err(AddrError::hinted(
                    s,
                    format!(
                        "TLS is set by the --api-tls-* or --listen-tls-* flags, not by the \
                         scheme: write tcp://{rest}"
                    ),
                ));
            }
        }
        // `tcp://a:1,tcp://b:2` is an attempt at several brains: the IPv6 hint below would
        // mislead (until 2026-12-07 it was given), so say how several brains are reached.
        if s.contains(',') {
            return Err(AddrError::hinted(s, SEVERAL_BRAINS.into()));
        }
        let hostport = s.strip_prefix("tcp://").unwrap_or(s);
        match hostport.rsplit_once(':') {
            // `fd00::1:9000` splits into a host `fd00::1` and a port, but it is also the IPv6
            // address `fd00::1:9000` with no port: only brackets tell which was meant.
            Some((host, port))
                if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) =>
            {
                Err(AddrError::hinted(
                    s,
                    format!("an IPv6 address goes in brackets: tcp://[{host}]:{port}"),
                ))
            }
            Some((host, port))
                if !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok() =>
            {
                Ok(ApiAddr::Tcp(hostport.to_string()))
            }
            _ => Err(AddrError::plain(s)),
        }
    }
}

impl std::fmt::Display for ApiAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiAddr::Tcp(hp) => write!(f, "tcp://{hp}"),
            ApiAddr::Unix(p) => write!(f, "unix://{}", p.display()),
        }
    }
}

impl ApiAddr {
    /// The socket address to listen on (TCP only).
    pub fn socket_addr(&self) -> Result<Option<SocketAddr>, AddrError> {
        match self {
            ApiAddr::Tcp(hp) => hp.parse().map(Some).map_err(|_| {
                AddrError::hinted(
                    &self.to_string(),
                    "a brain listens on an IP address and port, not a host name".into(),
                )
            }),
            ApiAddr::Unix(_) => Ok(None),
        }
    }
}

/// PEM files for TLS: our certificate and key, and the CA that signs the peer's certificate
/// (server: client certificates are then required, mTLS; client: the server's CA).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// Our certificate (PEM); with `key`.
    pub cert: Option<PathBuf>,
    /// Our private key (PEM); with `cert`.
    pub key: Option<PathBuf>,
    /// The CA bundle (PEM) that verifies the peer.
    pub ca: Option<PathBuf>,
}

impl TlsFiles {
    /// Whether any TLS file is given (TLS is then on).
    pub fn enabled(&self) -> bool {
        self.cert.is_some() || self.key.is_some() || self.ca.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_addresses() {
        let cases: &[(&str, Option<ApiAddr>)] = &[
            (
                "tcp://127.0.0.1:12090",
                Some(ApiAddr::Tcp("127.0.0.1:12090".into())),
            ),
            (
                "127.0.0.1:12090",
                Some(ApiAddr::Tcp("127.0.0.1:12090".into())),
            ),
            (
                "tcp://[::1]:12090",
                Some(ApiAddr::Tcp("[::1]:12090".into())),
            ),
            (
                "brain.kube-system:12090",
                Some(ApiAddr::Tcp("brain.kube-system:12090".into())),
            ),
            (
                "unix:///run/kpng.sock",
                Some(ApiAddr::Unix("/run/kpng.sock".into())),
            ),
            ("unix://", None),
            ("tcp://127.0.0.1", None),
            (":12090", None),
            ("http://x:1", None),
            ("tcp://fd00:1::2:12390", None),
            ("fd00::1", None),
        ];
        for (input, want) in cases {
            assert_eq!(input.parse::<ApiAddr>().ok(), *want, "{input}");
        }
        let said = "https://brain:9000"
            .parse::<ApiAddr>()
            .expect_err("a scheme")
            .to_string();
        assert!(
            said.contains("not by the scheme: write tcp://brain:9000"),
            "{said}"
        );
        let said = "tcp://fd00:1::2:12390"
            .parse::<ApiAddr>()
            .expect_err("IPv6 without brackets")
            .to_string();
        assert_eq!(
            said,
            "\"tcp://fd00:1::2:12390\" is not tcp://HOST:PORT, unix:///PATH or HOST:PORT (an \
             IPv6 address goes in brackets: tcp://[fd00:1::2]:12390)"
        );
        // What each mistake is told (a table: the input, and the hint in its message).
        let hints = [
            ("tcp://a:1,tcp://b:2", SEVERAL_BRAINS),
            ("a:1,b:2", SEVERAL_BRAINS),
            ("tcp://[fd00::1]:1,tcp://[fd00::2]:2", SEVERAL_BRAINS),
            (
                "tcp://fd00::1:9000",
                "an IPv6 address goes in brackets: tcp://[fd00::1]:9000",
            ),
        ];
        for (input, hint) in hints {
            let said = input.parse::<ApiAddr>().expect_err(input).to_string();
            assert!(said.ends_with(&format!("({hint})")), "{input}: {said}");
        }
        let said = ApiAddr::Tcp("brain:9000".into())
            .socket_addr()
            .expect_err("a host name")
            .to_string();
        assert!(said.starts_with("\"tcp://brain:9000\" is not"), "{said}");
    }
}
