//! The brain's Unix socket: private to its owner, and never taken from a live brain.
//!
//! Why: a brain's stream is every Service and endpoint of the cluster, so its socket is as
//! private as the admin socket (mode 0600, whatever the umask); and a second brain started on
//! the same path (a copied command line, two pods sharing a directory) must not delete the
//! live one's socket, which would cut every node off from it in silence.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

use tokio::net::UnixListener;
use tracing::info;

/// Listens on `path`, mode 0600. A socket left there by a brain that is gone is replaced; a
/// socket something answers on (or that cannot be tried), or a file that is not a socket, is
/// an error.
pub(super) fn bind(path: &Path) -> io::Result<UnixListener> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "the path exists and is not a socket; remove it or listen elsewhere",
            ));
        }
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    "another process (another brain?) answers on this socket; stop it or \
                     listen elsewhere",
                ));
            }
            // Nothing listens: left by a brain that is gone.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("the socket exists and cannot be tried ({e}); it is left in place"),
                ));
            }
        }
        info!(path = %path.display(), "removing a stale API socket");
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}
