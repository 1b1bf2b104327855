//! A ConfigMap volume as the kubelet writes and updates it.
//!
//! Why: kpng follows a `--config` file mounted from a ConfigMap, whose update is not a write
//! to the file but the kubelet's atomic swap of a `..data` link; the tests of that (the CLI's
//! and the node-settings end-to-end one) make the same layout, here once.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Makes `content` the current content of key `file` in the ConfigMap volume at `mount`, as
/// its version `n` (a new `n` for each call): it writes `..v{n}/file`, then swaps `..data`
/// to it (a new link renamed over it), and links `file -> ..data/file` if not linked yet.
/// The volume is then `file -> ..data/file`, `..data -> ..v{n}`, as the kubelet leaves it.
pub fn configmap_version(mount: &Path, n: u32, file: &str, content: &str) -> Result<()> {
    let data = mount.join(format!("..v{n}"));
    std::fs::create_dir(&data).map_err(|e| Error::io(format!("creating {}", data.display()), e))?;
    let path = data.join(file);
    std::fs::write(&path, content)
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
    // The kubelet's atomic swap: a new link renamed over `..data`.
    let tmp = mount.join("..data_tmp");
    symlink(format!("..v{n}"), &tmp)
        .map_err(|e| Error::io(format!("linking {}", tmp.display()), e))?;
    std::fs::rename(&tmp, mount.join("..data"))
        .map_err(|e| Error::io(format!("renaming {} to ..data", tmp.display()), e))?;
    let link = mount.join(file);
    if std::fs::symlink_metadata(&link).is_err() {
        symlink(format!("..data/{file}"), &link)
            .map_err(|e| Error::io(format!("linking {}", link.display()), e))?;
    }
    Ok(())
}

/// A kube-proxy configuration file (`config.conf`, as kubeadm names it) in a ConfigMap volume,
/// each version a `KubeProxyConfiguration` whose fields start with the same `header`: what
/// every test of a running kpng's `--config` writes again and again.
#[derive(Debug)]
pub struct ProxyConfigMount {
    mount: PathBuf,
    header: String,
}

impl ProxyConfigMount {
    /// An empty volume at `parent/mount`; each version's fields start with `header` (whole
    /// lines, or empty).
    pub fn new(parent: &Path, header: &str) -> Result<ProxyConfigMount> {
        let mount = parent.join("mount");
        std::fs::create_dir(&mount)
            .map_err(|e| Error::io(format!("creating {}", mount.display()), e))?;
        Ok(ProxyConfigMount {
            mount,
            header: header.to_string(),
        })
    }

    /// The file kpng is given (`--config`): the volume's link to the current version.
    pub fn file(&self) -> PathBuf {
        self.mount.join(CONFIG_FILE)
    }

    /// Makes version `n` (a new `n` for each call) current: the header, then `fields`.
    pub fn version(&self, n: u32, fields: &str) -> Result<()> {
        configmap_version(
            &self.mount,
            n,
            CONFIG_FILE,
            &format!(
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n{}{fields}",
                self.header
            ),
        )
    }
}

/// The key kubeadm's kube-proxy ConfigMap keeps the configuration under.
const CONFIG_FILE: &str = "config.conf";
