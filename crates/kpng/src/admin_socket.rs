//! Where `kpng status` and `kpng trace` reach the running kpng: a Unix socket on Linux, a
//! named pipe on Windows. Both carry the same HTTP/1.1 and JSON (`crate::admin`), so the
//! Windows admin has the same commands as the Linux operator.
//!
//! - Unix: a socket file, mode 0600 (root only), replaced when a dead kpng left it and left
//!   alone when a live process answers on it; served again within seconds when someone
//!   removes it while kpng runs. A path holding anything but a socket is never removed.
//! - Windows: `\\.\pipe\kpng` by default, local clients only. The pipe keeps Windows' default
//!   security: full control for SYSTEM, Administrators and its creator, read-only for everyone
//!   else, and a read-only client cannot send a request, so only an administrator (or the
//!   account kpng runs as) gets an answer, as only root does on Linux. A second kpng asking for
//!   a pipe name already served is told so and serves none.

use std::path::Path;

#[cfg(unix)]
use anyhow::Context;

/// `--admin-socket`'s default.
#[cfg(unix)]
pub const DEFAULT_ADMIN_SOCKET: &str = "/run/kpng/kpng.sock";
/// `--admin-socket`'s default.
#[cfg(windows)]
pub const DEFAULT_ADMIN_SOCKET: &str = r"\\.\pipe\kpng";

/// The admin socket's file, removed when the kpng that created it stops (a later `kpng
/// status` then says no kpng runs instead of timing out on a dead socket). A named pipe goes
/// with its last handle: nothing to remove.
#[derive(Debug)]
pub struct SocketFile(#[cfg_attr(not(unix), allow(dead_code))] pub std::path::PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        // Only a socket: a file someone put at the path meanwhile is theirs.
        #[cfg(unix)]
        if std::fs::symlink_metadata(&self.0).is_ok_and(|m| is_socket(&m)) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// Whether `meta` (not following a symlink) is a Unix socket: the only kind of file kpng
/// removes at the admin socket's path.
#[cfg(unix)]
fn is_socket(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::FileTypeExt;
    meta.file_type().is_socket()
}

/// A future serving the admin questions until the process ends.
pub type Serving = std::pin::Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>>;

/// Serves `app` on the Unix socket `path`; `Ok(None)` (with a warning) when a live process
/// already answers on it: two proxies in different network namespaces of one host share the
/// file system.
#[cfg(unix)]
pub async fn serve(path: &Path, app: axum::Router) -> anyhow::Result<Option<Serving>> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating {} for --admin-socket", dir.display()))?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        // Only a socket a dead kpng left is replaced: connecting to any other file fails as a
        // dead socket does, and removing it would delete what `--admin-socket` named by
        // mistake (`/dev/null`, a config file).
        if !is_socket(&meta) {
            anyhow::bail!(
                "{} exists and is not a socket; kpng replaces only a socket a stopped kpng left                  (give --admin-socket another path, or --admin-socket= for none)",
                path.display()
            );
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            served_elsewhere(path);
            return Ok(None);
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing the stale admin socket {}", path.display()))?;
    }
    let listener = bind_private(path)?;
    serving(path);
    let path = path.to_owned();
    Ok(Some(Box::pin(async move {
        let mut current = tokio::spawn(axum::serve(listener, app.clone()).into_future());
        let mut bound = inode(&path);
        let mut every = tokio::time::interval(SOCKET_CHECK);
        loop {
            tokio::select! {
                done = &mut current => {
                    return done.unwrap_or_else(|e| Err(std::io::Error::other(e)));
                }
                _ = every.tick() => {}
            }
            let now = inode(&path);
            if now.is_some() && now == bound {
                continue;
            }
            // Removed (or replaced by someone else's file): serve a new socket at the path,
            // unless a live process answers there now or what is there now is not a socket
            // (someone's file, never removed).
            if now.is_some()
                && (std::os::unix::net::UnixStream::connect(&path).is_ok()
                    || !std::fs::symlink_metadata(&path).is_ok_and(|m| is_socket(&m)))
            {
                continue;
            }
            let _ = std::fs::remove_file(&path);
            match bind_private(&path) {
                Ok(listener) => {
                    tracing::warn!(
                        "the admin socket {} was removed by someone else; serving it again",
                        path.display()
                    );
                    current.abort();
                    current = tokio::spawn(axum::serve(listener, app.clone()).into_future());
                    bound = inode(&path);
                }
                Err(e) => tracing::debug!("serving the removed admin socket again: {e:#}"),
            }
        }
    })))
}

/// How often the admin socket's file is looked at: `kpng status` at 3 a.m. must not find it
/// gone because someone cleaned `/run/kpng`.
#[cfg(unix)]
const SOCKET_CHECK: std::time::Duration = std::time::Duration::from_secs(5);

/// The inode of the file at `path`, `None` when there is none.
#[cfg(unix)]
fn inode(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).ok().map(|m| m.ino())
}

/// A Unix socket at `path` only its owner (root) may connect to.
#[cfg(unix)]
fn bind_private(path: &Path) -> anyhow::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let listener = tokio::net::UnixListener::bind(path)
        .with_context(|| format!("binding the admin socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("restricting {} to its owner", path.display()))?;
    Ok(listener)
}

/// Serves `app` on the named pipe `path` (`\\.\pipe\NAME`); `Ok(None)` (with a warning) when
/// another process serves that name.
#[cfg(windows)]
pub async fn serve(path: &Path, app: axum::Router) -> anyhow::Result<Option<Serving>> {
    let name = path.as_os_str().to_owned();
    // Windows refuses a first instance of a name in use; Wine does not, so ask as a client
    // first, as on Unix.
    if pipe::answered(path) {
        served_elsewhere(path);
        return Ok(None);
    }
    let first = match pipe::first_instance(&name) {
        Ok(first) => first,
        // The name is taken: another kpng (or anything else) serves it.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            served_elsewhere(path);
            return Ok(None);
        }
        Err(e) => {
            return Err(anyhow::Error::new(e)
                .context(format!("creating the admin pipe {}", path.display())));
        }
    };
    serving(path);
    let listener = pipe::Listener { name, next: first };
    Ok(Some(Box::pin(
        async move { axum::serve(listener, app).await },
    )))
}

fn served_elsewhere(path: &Path) {
    tracing::warn!(
        "--admin-socket {}: another process serves it; `kpng status` reaches that one (give \
         each kpng its own --admin-socket)",
        path.display()
    );
}

fn serving(path: &Path) {
    tracing::info!(
        "serving `kpng status` and `kpng trace` on {}",
        path.display()
    );
}

/// Why the client could not reach a kpng, in words that say what to check.
fn not_reached(path: &Path) -> String {
    if cfg!(windows) {
        format!(
            "connecting to {} (is kpng running, and is this an administrator's shell? \
             --admin-socket names another pipe)",
            path.display()
        )
    } else {
        format!(
            "connecting to {} (is kpng running, and are you root? --admin-socket names another \
             socket)",
            path.display()
        )
    }
}

/// A connection to the kpng serving `path`, for one request.
#[cfg(unix)]
pub fn connect(path: &Path) -> anyhow::Result<std::os::unix::net::UnixStream> {
    std::os::unix::net::UnixStream::connect(path).with_context(|| not_reached(path))
}

/// The process at the other end of an admin socket connection, when the socket tells
/// (Linux's `SO_PEERCRED`): named when that kpng does not answer.
#[cfg(target_os = "linux")]
pub fn peer_pid(stream: &std::os::unix::net::UnixStream) -> Option<u32> {
    let cred = rustix::net::sockopt::socket_peercred(stream).ok()?;
    u32::try_from(cred.pid.as_raw_nonzero().get()).ok()
}

/// The process at the other end of an admin socket connection: not known here.
#[cfg(all(unix, not(target_os = "linux")))]
pub fn peer_pid(_stream: &std::os::unix::net::UnixStream) -> Option<u32> {
    None
}

/// The process at the other end of an admin pipe connection: not known here.
#[cfg(windows)]
pub fn peer_pid(_stream: &std::fs::File) -> Option<u32> {
    None
}

/// A connection to the kpng serving the named pipe `path`, for one request. Every instance
/// of the pipe may be busy for a moment (another client's request): retried for two seconds.
#[cfg(windows)]
pub fn connect(path: &Path) -> anyhow::Result<std::fs::File> {
    use pipe::PIPE_BUSY;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
        {
            Ok(file) => return Ok(file),
            Err(e)
                if e.raw_os_error() == Some(PIPE_BUSY) && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => return Err(anyhow::Error::new(e).context(not_reached(path))),
        }
    }
}

#[cfg(windows)]
mod pipe {
    use std::ffi::{OsStr, OsString};
    use std::time::Duration;

    use tokio::net::windows::named_pipe::{NamedPipeServer, ServerOptions};

    /// Windows' ERROR_PIPE_BUSY: every instance of the pipe is serving a client.
    pub const PIPE_BUSY: i32 = 231;

    /// Whether a process serves the pipe `path` now.
    pub fn answered(path: &std::path::Path) -> bool {
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
        {
            Ok(_) => true,
            Err(e) => e.raw_os_error() == Some(PIPE_BUSY),
        }
    }

    /// The first instance of the pipe `name`: fails (access denied) when the name is taken.
    pub fn first_instance(name: &OsStr) -> std::io::Result<NamedPipeServer> {
        ServerOptions::new()
            .first_pipe_instance(true)
            .reject_remote_clients(true)
            .create(name)
    }

    /// Accepts clients on a named pipe: one instance waits for the next client while the
    /// connected ones are served.
    pub struct Listener {
        pub name: OsString,
        pub next: NamedPipeServer,
    }

    impl axum::serve::Listener for Listener {
        type Io = NamedPipeServer;
        type Addr = String;

        async fn accept(&mut self) -> (NamedPipeServer, String) {
            loop {
                // A client that connected and left before this wait is an error here; the
                // instance is then replaced like a served one.
                let connected = self.next.connect().await;
                match ServerOptions::new()
                    .reject_remote_clients(true)
                    .create(&self.name)
                {
                    Ok(fresh) => {
                        let client = std::mem::replace(&mut self.next, fresh);
                        if connected.is_ok() {
                            return (client, self.name.to_string_lossy().into_owned());
                        }
                    }
                    Err(e) => {
                        tracing::warn!(
                            "admin pipe {}: cannot create the next instance: {e}",
                            self.name.to_string_lossy()
                        );
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        }

        fn local_addr(&self) -> std::io::Result<String> {
            Ok(self.name.to_string_lossy().into_owned())
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// `--admin-socket` naming a file that is not a socket (`/dev/null` by mistake, a config
    /// file) is refused and the file left as it was; a socket a stopped kpng left is replaced,
    /// and removed again when kpng stops.
    #[tokio::test]
    async fn only_a_socket_is_ever_removed_at_the_admin_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("not-a-socket");
        std::fs::write(&file, "keep me").expect("write");
        let refused = serve(&file, axum::Router::new()).await;
        let err = refused
            .err()
            .expect("a regular file is refused")
            .to_string();
        assert!(err.contains("is not a socket"), "{err}");
        assert_eq!(
            std::fs::read_to_string(&file).expect("still there"),
            "keep me"
        );
        // Dropping a SocketFile for it (as at exit) leaves it too.
        drop(SocketFile(file.clone()));
        assert!(file.exists());

        let stale = dir.path().join("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).expect("bind"));
        let served = serve(&stale, axum::Router::new()).await.expect("serve");
        assert!(served.is_some(), "a dead socket is replaced");
        drop(SocketFile(stale.clone()));
        assert!(!stale.exists());
    }
}
