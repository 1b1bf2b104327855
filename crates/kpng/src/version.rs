//! `kpng version`: what this binary is, for the operator comparing nodes or filing a bug.

use serde::Serialize;

use crate::cli::{LogFormat, VersionArgs};

/// This build's identity; also the labels of `kpng_build_info`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BuildInfo {
    /// The crate version.
    pub version: &'static str,
    /// The git commit built (`-dirty` with uncommitted changes, `unknown` outside git).
    pub git_commit: &'static str,
    /// When it was built (RFC 3339, UTC; `SOURCE_DATE_EPOCH` when set).
    pub build_date: &'static str,
    /// The Kubernetes API schema compiled in.
    pub kubernetes_schema: &'static str,
    /// The API resources the `kube` source reads.
    pub api_resources: &'static [&'static str],
    /// `os/arch`, as Go's `GOOS/GOARCH` would print it.
    pub platform: String,
}

impl BuildInfo {
    /// This binary's.
    pub fn current() -> BuildInfo {
        BuildInfo {
            version: env!("CARGO_PKG_VERSION"),
            git_commit: env!("KPNG_GIT_COMMIT"),
            build_date: env!("KPNG_BUILD_DATE"),
            kubernetes_schema: kpng_k8s::KUBERNETES_SCHEMA,
            api_resources: &kpng_k8s::API_RESOURCES,
            platform: format!(
                "{}/{}",
                std::env::consts::OS,
                go_arch(std::env::consts::ARCH)
            ),
        }
    }
}

impl BuildInfo {
    /// What a brain and its nodes tell each other (`kpng-version`): the version and the git
    /// commit, [`kpng_api::version::build`], from the same source as `kpng_build_info`'s
    /// labels, so that `kpng status` and the brain's `kpng_api_connected_node_versions` tell
    /// two builds of one release apart.
    pub fn api_version(&self) -> String {
        kpng_api::version::build(self.git_commit)
    }

    /// The first line's version: the crate's and the Kubernetes API's as `vMAJOR.MINOR`
    /// (`0.1.0 (Kubernetes v1.33 API)`), the form kube-proxy's `Kubernetes v1.x.y` has and
    /// version-matching scripts look for.
    pub fn headline(&self) -> String {
        format!(
            "{} (Kubernetes v{} API)",
            self.version, self.kubernetes_schema
        )
    }
}

/// Prints the version as asked.
pub fn print(args: &VersionArgs) -> anyhow::Result<()> {
    let info = BuildInfo::current();
    match args.output {
        LogFormat::Json => println!("{}", serde_json::to_string_pretty(&info)?),
        LogFormat::Text => {
            println!("kpng {}", info.headline());
            println!("  git commit:         {}", info.git_commit);
            println!("  built:              {}", info.build_date);
            println!("  platform:           {}", info.platform);
            println!("  Kubernetes schema:  {}", info.kubernetes_schema);
            println!("  reads:              {}", info.api_resources.join(", "));
        }
    }
    Ok(())
}

/// Go's name of an architecture (`GOARCH`), as Kubernetes components print their platform:
/// `linux/amd64`, not Rust's `linux/x86_64`.
fn go_arch(rust: &str) -> &str {
    match rust {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::BuildInfo;

    #[test]
    fn the_headline_names_the_kubernetes_version_as_v_major_minor() {
        let info = BuildInfo::current();
        let line = info.headline();
        assert!(line.starts_with(env!("CARGO_PKG_VERSION")), "{line}");
        assert!(
            line.contains(&format!("Kubernetes v{} API", kpng_k8s::KUBERNETES_SCHEMA)),
            "{line}"
        );
    }
}
