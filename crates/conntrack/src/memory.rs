//! What the reconciler remembers across a restart: the frontends its passes have checked.
//!
//! Why: a pass reads a frontend's never-DNATed entries (a walk of the kernel's whole table,
//! ~0.3 s at a million entries, for each) only the first time it sees the frontend, and after
//! a restart every frontend is seen for the first time: on a busy node the first pass took one
//! walk per UDP frontend. Such entries can only come from a moment when the frontend had no
//! rule. A restart whose backend adopted the table the last run left, refilling it in one
//! transaction, leaves no such moment; so the frontends the last run had checked, and had not
//! taken out of the rules since, need the walk of DNATed entries alone, as in steady state.
//!
//! The runner writes the file whenever the set changes (forgetting, before a sync commits it,
//! whatever the sync takes out of the rules) and reads it at start-up. It is used only for
//! the families whose rules the backend kept in place, and only in the boot that wrote it
//! (`/proc/sys/kernel/random/boot_id` heads the file); one file per network namespace.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use kpng_model::Family;

use crate::stale::Frontend;

/// The frontends a pass has checked, per family.
pub type Checked = HashMap<Family, HashSet<Frontend>>;

/// Why the file could not be read or written. Never fatal: without it a start-up reads
/// every frontend whole, as it always did.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// Reading or writing the file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A line of the file is not a frontend.
    #[error("{path} line {line}: not a frontend: {text:?}")]
    Line {
        /// The file.
        path: PathBuf,
        /// Its number, from 1.
        line: usize,
        /// What it says.
        text: String,
    },
    /// The file does not start with the header kpng writes: it is damaged, or not kpng's.
    /// Said rather than ignored, so that after a crash the operator learns the previous
    /// run's record was there but unreadable.
    #[error("{path}: not kpng's conntrack memory: its first line is {first:?}")]
    Header {
        /// The file.
        path: PathBuf,
        /// Its first line (at most 80 characters of it).
        first: String,
    },
}

/// The first line of the file, before the boot id.
const HEADER: &str = "# kpng conntrack: UDP frontends checked while DNATed; boot ";

/// The file's text: the boot, then one frontend per line (`IPv4 ip 10.96.0.10:53`,
/// `IPv6 nodeport 30053`), sorted so that an unchanged set writes the same bytes.
pub fn encode(boot_id: &str, checked: &Checked) -> String {
    let mut lines: Vec<(Family, Frontend)> = checked
        .iter()
        .flat_map(|(family, frontends)| frontends.iter().map(|f| (*family, *f)))
        .collect();
    lines.sort();
    let mut text = format!("{HEADER}{boot_id}\n");
    for (family, frontend) in lines {
        let line = match frontend {
            Frontend::Ip(addr) => format!("{family} ip {addr}\n"),
            Frontend::NodePort(port) => format!("{family} nodeport {port}\n"),
        };
        text.push_str(&line);
    }
    text
}

/// Reads [`encode`]'s text back; `None` when it was written in another boot.
///
/// # Errors
/// The header is not kpng's, or a line is not a frontend (the file is then not used at all).
pub fn decode(path: &Path, text: &str, boot_id: &str) -> Result<Option<Checked>, MemoryError> {
    let mut lines = text.lines();
    let first = lines.next().unwrap_or_default();
    let Some(boot) = first.strip_prefix(HEADER) else {
        return Err(MemoryError::Header {
            path: path.to_path_buf(),
            first: first.chars().take(80).collect(),
        });
    };
    if boot != boot_id {
        return Ok(None);
    }
    let mut checked = Checked::new();
    for (i, line) in lines.enumerate() {
        let (family, frontend) = parse_line(line).ok_or_else(|| MemoryError::Line {
            path: path.to_path_buf(),
            line: i + 2,
            text: line.to_string(),
        })?;
        checked.entry(family).or_default().insert(frontend);
    }
    Ok(Some(checked))
}

fn parse_line(line: &str) -> Option<(Family, Frontend)> {
    let mut words = line.split(' ');
    let family = match words.next()? {
        "IPv4" => Family::V4,
        "IPv6" => Family::V6,
        _ => return None,
    };
    let frontend = match (words.next()?, words.next()?) {
        ("ip", addr) => Frontend::Ip(addr.parse::<SocketAddr>().ok()?),
        ("nodeport", port) => Frontend::NodePort(port.parse().ok()?),
        _ => return None,
    };
    let of_family = match frontend {
        Frontend::Ip(addr) => Family::of(&addr.ip()) == family,
        Frontend::NodePort(_) => true,
    };
    (words.next().is_none() && of_family).then_some((family, frontend))
}

/// This boot's id; `None` where the kernel does not say.
pub fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|id| id.trim().to_string())
        .filter(|id| !id.is_empty())
}

/// Where this network namespace's file lives: `/run/kpng/conntrack-checked.<netns inode>`,
/// as the iptables backend's `route_localnet.<netns inode>` (`/run` is emptied at boot, and
/// each namespace has its own table and its own kpng).
pub fn default_path() -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let netns = std::fs::metadata("/proc/self/ns/net").ok()?.ino();
    Some(PathBuf::from(format!(
        "/run/kpng/conntrack-checked.{netns}"
    )))
}

/// The file, read at start-up and written when the set changes.
#[derive(Debug)]
pub struct MemoryFile {
    path: PathBuf,
    boot_id: String,
    /// What the file holds now (not written again when unchanged).
    written: Option<String>,
}

impl MemoryFile {
    /// The file at `path`, for this boot.
    pub fn new(path: PathBuf, boot_id: String) -> MemoryFile {
        MemoryFile {
            path,
            boot_id,
            written: None,
        }
    }

    /// What the last run of this boot remembered; `None` when there is nothing (no file,
    /// another boot).
    ///
    /// # Errors
    /// The file cannot be read, or a line of it is not a frontend.
    pub fn load(&mut self) -> Result<Option<Checked>, MemoryError> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(MemoryError::Io {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        let checked = decode(&self.path, &text, &self.boot_id)?;
        self.written = checked.is_some().then_some(text);
        Ok(checked)
    }

    /// Writes `checked` (atomically: a new file, mode 0600, renamed over the old; never through
    /// a link someone left at the temporary name) unless the file holds it
    /// already.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn save(&mut self, checked: &Checked) -> Result<(), MemoryError> {
        let text = encode(&self.boot_id, checked);
        if self.written.as_deref() == Some(text.as_str()) {
            return Ok(());
        }
        let io = |source| MemoryError::Io {
            path: self.path.clone(),
            source,
        };
        if let Some(dir) = self.path.parent() {
            private_dir(dir).map_err(io)?;
        }
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        write_new_private(&tmp, text.as_bytes()).map_err(io)?;
        std::fs::rename(&tmp, &self.path).map_err(io)?;
        self.written = Some(text);
        Ok(())
    }
}

/// Creates `dir` (and its parents) as root's own, `rwxr-xr-x` whatever the umask.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o755);
    builder.create(dir)
}

/// Writes `bytes` to `path` as a new file, mode 0600: whatever was there (a file, or a link a
/// local user planted to make root overwrite another file) is removed first, never followed,
/// and the file is created only if nothing took the name meanwhile (`O_EXCL`).
fn write_new_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)?.write_all(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked() -> Checked {
        let mut c = Checked::new();
        c.entry(Family::V4).or_default().extend([
            Frontend::Ip("10.96.0.10:53".parse().expect("addr")),
            Frontend::NodePort(30053),
        ]);
        c.entry(Family::V6)
            .or_default()
            .insert(Frontend::Ip("[fd00:96::a]:53".parse().expect("addr")));
        c
    }

    #[test]
    fn what_is_written_reads_back_in_the_same_boot_only() {
        let path = Path::new("/run/kpng/x.checked");
        let text = encode("boot-1", &checked());
        assert_eq!(
            text,
            "# kpng conntrack: UDP frontends checked while DNATed; boot boot-1\n\
             IPv4 ip 10.96.0.10:53\nIPv4 nodeport 30053\nIPv6 ip [fd00:96::a]:53\n"
        );
        assert_eq!(
            decode(path, &text, "boot-1").expect("reads"),
            Some(checked())
        );
        assert_eq!(decode(path, &text, "boot-2").expect("reads"), None);
    }

    /// A damaged file (one without kpng's header) was ignored silently, as if written in
    /// another boot; it is refused naming the file, which the start logs.
    #[test]
    fn a_file_without_the_header_is_refused_naming_it() {
        let path = Path::new("/run/kpng/conntrack-checked.1");
        for bad in ["\0\0garbage", "", "# kpng conntrack: UDP frontends checked"] {
            let err = decode(path, bad, "b").expect_err(bad).to_string();
            assert!(
                err.contains("/run/kpng/conntrack-checked.1") && err.contains("not kpng's"),
                "{err}"
            );
        }
        let other_boot = format!("{HEADER}a\nIPv4 nodeport 30053\n");
        assert_eq!(decode(path, &other_boot, "b").expect("another boot"), None);
    }

    #[test]
    fn a_line_that_is_not_a_frontend_refuses_the_file_naming_the_line() {
        let path = Path::new("/run/kpng/x.checked");
        for bad in [
            "IPv4 ip 10.96.0.10",
            "IPv4 ip [fd00::1]:53",
            "IPv5 nodeport 1",
            "IPv4 nodeport 70000",
            "IPv4 nodeport 1 2",
            "IPv4 port 53",
        ] {
            let text = format!("{HEADER}b\nIPv4 nodeport 30053\n{bad}\n");
            let err = decode(path, &text, "b").expect_err(bad).to_string();
            assert!(err.contains("line 3") && err.contains(bad), "{err}");
        }
    }

    /// A link a local user planted at the temporary name does not make root write its target;
    /// the memory is root's alone (0600) whatever the umask.
    #[test]
    fn a_link_at_the_temporary_name_is_not_followed_and_the_file_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").expect("victim");
        let path = dir.path().join("c.checked");
        std::os::unix::fs::symlink(&victim, dir.path().join("c.checked.tmp")).expect("link");
        let mut file = MemoryFile::new(path.clone(), "b".into());
        file.save(&checked()).expect("save");
        assert_eq!(
            std::fs::read_to_string(&victim).expect("victim"),
            "precious"
        );
        let meta = std::fs::symlink_metadata(&path).expect("written");
        assert!(meta.is_file(), "{meta:?}");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn the_file_is_written_when_it_changes_and_read_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub").join("c.checked");
        let mut file = MemoryFile::new(path.clone(), "b".into());
        assert!(file.load().expect("no file yet").is_none());
        file.save(&checked()).expect("save");
        let inode = || {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(&path).expect("written").ino()
        };
        let first = inode();
        file.save(&checked()).expect("unchanged");
        assert_eq!(inode(), first, "an unchanged set is not written again");
        let mut again = MemoryFile::new(path.clone(), "b".into());
        assert_eq!(again.load().expect("reads"), Some(checked()));
        let mut next_boot = MemoryFile::new(path, "c".into());
        assert_eq!(next_boot.load().expect("reads"), None);
    }
}
