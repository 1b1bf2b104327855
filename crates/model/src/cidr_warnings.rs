//! External IPs inside a Service CIDR: the API server allocates ClusterIPs there, so an external
//! IP in it names another Service's ClusterIP (or one it will hand out later). kpng programs it
//! as kube-proxy does, but never in place of a ClusterIP (`claims`); the warning tells the
//! operator that a tenant is writing addresses of the Service range, which
//! `DenyServiceExternalIPs` or an admission policy should refuse (docs/deploy.md).

use ipnet::IpNet;

use crate::event::{Kind, ObjectRef};
use crate::records::{ServiceInfo, Warning};

/// The warning for the external IPs of `info` inside `cidrs` but inside none of `already`
/// (the ranges it was checked against before: a Service is warned about once per range, not
/// at every ServiceCIDR change); `None` when there is none.
pub(crate) fn external_ips_in_service_cidrs(
    info: &ServiceInfo,
    cidrs: &[IpNet],
    already: &[IpNet],
) -> Option<Warning> {
    let inside: Vec<String> = info
        .external_ips
        .iter()
        .filter_map(|ip| {
            let range = cidrs.iter().find(|net| net.contains(ip))?;
            (!already.iter().any(|net| net.contains(ip))).then(|| format!("{ip} (in {range})"))
        })
        .collect();
    if inside.is_empty() {
        return None;
    }
    Some(Warning {
        object: ObjectRef {
            kind: Kind::Service,
            namespace: info.key.namespace.clone(),
            name: info.key.name.clone(),
        },
        field: "spec.externalIPs".to_string(),
        message: format!(
            "{} inside the Service CIDRs (--service-cidr and the ServiceCIDR objects), where \
             the API server allocates ClusterIPs: programmed as kube-proxy does, but never in \
             place of a Service's ClusterIP of the same port; refuse such external IPs with \
             DenyServiceExternalIPs or an admission policy (docs/deploy.md)",
            inside.join(", ")
        ),
    })
}
