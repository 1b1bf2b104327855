//! Who can read a brain's API, said once at start-up: the brain streams every Service and
//! endpoint of the cluster, and which clients get them depends on where it listens and with
//! what TLS. Also a private key file any local user can read.
//!
//! Why: a brain with TLS but no client CA beyond loopback said nothing, yet any client that
//! reaches it reads any node's view by naming the node; the loopback default lets every local
//! user (and every host-network pod) read it; a key file of mode 0644 gives the brain's or a
//! node's identity to every local user.

use std::net::IpAddr;
use std::path::Path;

/// What a TCP listener of the API exposes, to whom, and what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exposure {
    /// A warning (a setting to fix) rather than an information line (the loopback default).
    pub warn: bool,
    /// The line to log.
    pub message: String,
}

/// What listening on `ip` exposes, given whether TLS is on (`tls`) and whether clients must
/// present a certificate a CA signed (`client_ca`, mTLS, which also ties a client to the node
/// its certificate names); `None` when only nodes with their own certificates get their views.
pub fn of_listener(ip: IpAddr, tls: bool, client_ca: bool) -> Option<Exposure> {
    let loopback = ip.to_canonical().is_loopback();
    match (loopback, tls, client_ca) {
        (false, false, _) => Some(Exposure {
            warn: true,
            message: "the API listens beyond loopback without TLS: anyone who reaches it reads \
                      every Service and endpoint; give --listen-tls-cert/--listen-tls-key (and \
                      --listen-tls-ca so that each node reads only its own view)"
                .into(),
        }),
        (false, true, false) => Some(Exposure {
            warn: true,
            message: "the API listens beyond loopback with TLS but without --listen-tls-ca: any \
                      client that reaches it reads any node's view (every Service and endpoint) \
                      by naming the node; give --listen-tls-ca so that each node must present a \
                      certificate naming itself"
                .into(),
        }),
        (true, false, _) => Some(Exposure {
            warn: false,
            message: "the API listens on loopback without TLS: every local user and every \
                      host-network pod can read every Service and endpoint; listen on \
                      unix:///PATH (mode 0600) to keep it to the brain's user"
                .into(),
        }),
        (true, true, _) | (false, true, true) => None,
    }
}

/// A warning when the private key file `path` (given with `flag`) can be read by every local
/// user, naming the file and its mode; `None` otherwise, when it cannot be read (its loading
/// says so) or off Unix.
pub fn of_key_file(flag: &str, path: &Path) -> Option<String> {
    let mode = mode_of(path)?;
    (mode & 0o004 != 0).then(|| {
        format!(
            "{flag} {}: the private key is readable by every user (mode {:04o}); make it 0600 \
             or 0400 (a Secret volume's defaultMode: 0400)",
            path.display(),
            mode & 0o7777
        )
    })
}

#[cfg(unix)]
fn mode_of(path: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).ok().map(|m| m.permissions().mode())
}

#[cfg(not(unix))]
fn mode_of(_path: &Path) -> Option<u32> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_listener_says_who_reads_it() {
        let lo: IpAddr = "127.0.0.1".parse().expect("ip");
        let lo6: IpAddr = "::1".parse().expect("ip");
        let any: IpAddr = "0.0.0.0".parse().expect("ip");
        let node: IpAddr = "10.0.0.5".parse().expect("ip");
        for (ip, tls, ca, want) in [
            (any, false, false, Some((true, "without TLS"))),
            (node, true, false, Some((true, "without --listen-tls-ca"))),
            (any, true, false, Some((true, "without --listen-tls-ca"))),
            (node, true, true, None),
            (lo, false, false, Some((false, "unix:///PATH (mode 0600)"))),
            (lo6, false, false, Some((false, "every local user"))),
            (lo, true, false, None),
            (lo, true, true, None),
        ] {
            let got = of_listener(ip, tls, ca);
            match (got, want) {
                (None, None) => {}
                (Some(e), Some((warn, says))) => {
                    assert_eq!(e.warn, warn, "{ip} tls={tls} ca={ca}");
                    assert!(e.message.contains(says), "{ip} tls={tls} ca={ca}: {e:?}");
                }
                (got, want) => panic!("{ip} tls={tls} ca={ca}: {got:?}, want {want:?}"),
            }
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_key_every_user_can_read_is_named_with_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let key = dir.path().join("tls.key");
        std::fs::write(&key, "key").expect("write");
        for (mode, warned) in [(0o644, true), (0o604, true), (0o640, false), (0o600, false)] {
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode)).expect("chmod");
            let got = of_key_file("--api-tls-key", &key);
            assert_eq!(got.is_some(), warned, "{mode:o}: {got:?}");
            if let Some(w) = got {
                assert!(
                    w.starts_with(&format!("--api-tls-key {}", key.display()))
                        && w.contains(&format!("(mode {mode:04o})")),
                    "{w}"
                );
            }
        }
        assert_eq!(of_key_file("--api-tls-key", &dir.path().join("none")), None);
    }
}
