//! Metric labels every backend shares, so that a backend's own metrics carry the same labels
//! as the runner's (kube-proxy's `ip_family`).

use prometheus_client::encoding::EncodeLabelSet;

use kpng_model::Family;

/// The `ip_family` label kube-proxy puts on per-proxier metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FamilyLabel {
    /// `IPv4` or `IPv6`.
    pub ip_family: String,
}

impl From<Family> for FamilyLabel {
    fn from(f: Family) -> Self {
        FamilyLabel {
            ip_family: f.label().to_string(),
        }
    }
}
