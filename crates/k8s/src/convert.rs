//! Kubernetes objects → the model's small, Kubernetes-free records
//! ([`kpng_model::records`]).
//!
//! Two kinds of problems are distinguished, as kube-proxy does:
//! - a [`ConversionError`] makes the whole object unusable (no name, a port out of range, an
//!   unknown protocol, a name or port name the API server would refuse, Nodes' and
//!   ServiceCIDRs' too, an EndpointSlice over the API server's size limits: see
//!   [`crate::validate`]). The model then keeps the object's previous good version, so a
//!   broken update never tears down working rules.
//! - a [`Warning`] drops one bad value (an unparseable external IP, source range or endpoint
//!   address, an external IP or endpoint address the API server would refuse, such as
//!   127.0.0.1 or 169.254.169.254, a load-balancer ingress the API server would refuse: on a
//!   Service not of type LoadBalancer, or with an unknown `ipMode`) and keeps the rest, exactly
//!   as upstream ignores such values with a log line.
//!
//! Both name the object and the field, so an operator can find the problem in one look.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Node, Service, ServiceSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use kpng_model::ip::{parse_cidr_sloppy, parse_ip_sloppy};
use kpng_model::records::{
    ConversionError, Ignored, NodeInfo, PortInfo, ServiceCidrInfo, ServiceInfo, SliceEndpoint,
    SliceInfo, SlicePort, TopologyHints, Warning,
};
use kpng_model::{
    Family, Kind, Name, ObjectRef, Protocol, ServiceKey, SessionAffinity, TargetPort,
};

use crate::validate;

/// Label naming the proxy that owns a Service; others must ignore it.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// Label marking a Service headless for proxies.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// Label tying an EndpointSlice to its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// EndpointSlice annotation: when the change the slice reflects was triggered (network
/// programming latency is measured from it).
pub const ANNOTATION_LAST_CHANGE_TRIGGER_TIME: &str =
    "endpoints.kubernetes.io/last-change-trigger-time";
pub use kpng_model::records::ANNOTATION_PRESERVE_DESTINATION;
/// Node label holding the node's zone, used for zone hints.
pub const LABEL_TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
/// Taint the cluster autoscaler puts on nodes it is about to delete.
pub const TAINT_TO_BE_DELETED: &str = "ToBeDeletedByClusterAutoscaler";
/// Session affinity timeout when the Service does not set one (3 hours, the API default).
pub const DEFAULT_AFFINITY_TIMEOUT_SECONDS: u32 = 10_800;

/// The cluster IP of each family the Service serves, as kube-proxy's `GetClusterIPByFamily`:
/// with `spec.ipFamilies`, a family's cluster IP is `clusterIPs[i]` where `ipFamilies[i]` names
/// it, and a family it does not name has none (two `clusterIPs` with `ipFamilies: [IPv4]`
/// program no IPv6 frontend, as kube-proxy); without it, every one of `cluster_ips` (each of
/// its own family). An `ipFamilies` the API server would refuse (an unknown or repeated
/// family, more families than cluster IPs, a cluster IP of another family than its entry) is
/// an error naming the field: kube-proxy's lenient pick would program another family's
/// address, or silently none, and a refused update keeps the object's last good version.
/// Cluster IPs past `ipFamilies`' entries are left out with a warning.
fn by_ip_families(
    c: &mut Checker<'_>,
    families: Option<&[String]>,
    cluster_ips: &[IpAddr],
) -> Result<Vec<IpAddr>, ConversionError> {
    let Some(families) = families.filter(|f| !f.is_empty()) else {
        return Ok(cluster_ips.to_vec());
    };
    let mut seen: Vec<bool> = Vec::new();
    for (i, raw) in families.iter().enumerate() {
        let field = format!("spec.ipFamilies[{i}]");
        let v4 = match raw.as_str() {
            "IPv4" => true,
            "IPv6" => false,
            other => {
                return Err(c.error(field, format!("{other:?} is not IPv4 or IPv6")));
            }
        };
        if seen.contains(&v4) {
            return Err(c.error(field, format!("{raw} is named twice")));
        }
        seen.push(v4);
        let Some(ip) = cluster_ips.get(i) else {
            return Err(c.error(
                field,
                format!(
                    "{raw} has no cluster IP: spec.clusterIPs has {} entr{}",
                    cluster_ips.len(),
                    if cluster_ips.len() == 1 { "y" } else { "ies" }
                ),
            ));
        };
        if ip.is_ipv4() != v4 {
            return Err(c.error(
                format!("spec.clusterIPs[{i}]"),
                format!("{ip} is not an {raw} address, as spec.ipFamilies[{i}] says"),
            ));
        }
    }
    for (i, ip) in cluster_ips.iter().enumerate().skip(families.len()) {
        c.warn(
            format!("spec.clusterIPs[{i}]"),
            format!(
                "{ip} not used: spec.ipFamilies does not name its family (as kube-proxy, which \
                 picks a family's cluster IP by spec.ipFamilies)"
            ),
        );
    }
    Ok(cluster_ips[..families.len()].to_vec())
}

/// Collects problems found while converting one object.
struct Checker<'a> {
    object: &'a ObjectRef,
    warnings: &'a mut Vec<Warning>,
}

impl Checker<'_> {
    fn error(&self, field: impl Into<String>, message: impl Into<String>) -> ConversionError {
        ConversionError {
            object: self.object.clone(),
            field: field.into(),
            message: message.into(),
            location: None,
            service: None,
        }
    }

    fn warn(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.warnings.push(Warning {
            object: self.object.clone(),
            field: field.into(),
            message: message.into(),
        });
    }

    fn port(&self, field: String, value: i32) -> Result<u16, ConversionError> {
        match u16::try_from(value) {
            Ok(p) if p > 0 => Ok(p),
            _ => Err(self.error(field, format!("port {value} is not in 1-65535"))),
        }
    }

    /// A port where 0 means "none".
    fn optional_port(
        &self,
        field: String,
        value: Option<i32>,
    ) -> Result<Option<u16>, ConversionError> {
        match value {
            None | Some(0) => Ok(None),
            Some(v) => self.port(field, v).map(Some),
        }
    }

    fn protocol(&self, field: String, value: Option<&str>) -> Result<Protocol, ConversionError> {
        match value {
            None => Ok(Protocol::Tcp),
            Some(p) => Protocol::parse(p).ok_or_else(|| {
                self.error(
                    field,
                    format!("unknown protocol {p:?} (want TCP, UDP or SCTP)"),
                )
            }),
        }
    }

    /// The addresses of `values` that parse and pass `check`; a warning for each other one.
    fn ips(
        &mut self,
        field: &str,
        values: &[String],
        check: impl Fn(IpAddr) -> Result<(), String>,
    ) -> Vec<IpAddr> {
        let mut out = Vec::new();
        for (i, v) in values.iter().enumerate() {
            match parse_ip_sloppy(v) {
                Some(ip) => match check(ip) {
                    Ok(()) => out.push(ip),
                    Err(m) => self.warn(format!("{field}[{i}]"), m),
                },
                None => self.warn(
                    format!("{field}[{i}]"),
                    format!("{v:?} is not an IP address"),
                ),
            }
        }
        out
    }
}

fn object_ref(kind: Kind, meta: &ObjectMeta) -> ObjectRef {
    ObjectRef {
        kind,
        namespace: meta.namespace.clone().unwrap_or_default().into(),
        name: meta.name.clone().unwrap_or_default().into(),
    }
}

fn require_identity(object: &ObjectRef, namespaced: bool) -> Result<(), ConversionError> {
    let err = |field: &str| ConversionError {
        object: object.clone(),
        field: field.to_string(),
        message: "must be set".to_string(),
        location: None,
        service: None,
    };
    if object.name.is_empty() {
        return Err(err("metadata.name"));
    }
    if namespaced && object.namespace.is_empty() {
        return Err(err("metadata.namespace"));
    }
    // No API server lets a name hold a control character; one from a manifest would reach
    // logs, `kpng status` and terminals raw (a newline forges a log line, an escape sequence
    // rewrites the operator's screen). The object is named escaped in the error.
    let controls = |s: &str| s.chars().any(char::is_control);
    for (field, bad) in [
        ("metadata.name", controls(&object.name)),
        ("metadata.namespace", controls(&object.namespace)),
    ] {
        if bad {
            return Err(ConversionError {
                object: ObjectRef {
                    kind: object.kind,
                    namespace: object.namespace.escape_debug().to_string().into(),
                    name: object.name.escape_debug().to_string().into(),
                },
                field: field.to_string(),
                message: "must not contain control characters".to_string(),
                location: None,
                service: None,
            });
        }
    }
    Ok(())
}

/// The API server's rules for the names of a Service or an EndpointSlice (and their
/// namespace): they become iptables comments, chain-name hashes (`ns/name:port`) and log
/// fields, so a `/`, a quote or a space in one must never reach a backend (see
/// [`crate::validate`]). Nodes and ServiceCIDRs: [`require_valid_cluster_name`].
fn require_valid_names(object: &ObjectRef) -> Result<(), ConversionError> {
    let err = |field: &str, message: String| ConversionError {
        object: object.clone(),
        field: field.to_string(),
        message,
        location: None,
        service: None,
    };
    validate::dns1123_label(&object.namespace).map_err(|m| err("metadata.namespace", m))?;
    let name = match object.kind {
        Kind::Service => validate::service_name(&object.name),
        _ => validate::dns1123_subdomain(&object.name),
    };
    name.map_err(|m| err("metadata.name", m))
}

/// The API server's rule for the name of a Node (`ValidateNodeName`) or a ServiceCIDR
/// (`ValidateServiceCIDRName`): a DNS-1123 subdomain. A Node's name is matched against
/// endpoints' `nodeName` and `--hostname-override`, and shown with a ServiceCIDR's in logs and
/// `kpng status`; a name no API server accepts (`Node 1`, `a/b`, `CIDR"x`) comes only from a
/// manifest or a non-validating server, and is refused as for the other kinds.
fn require_valid_cluster_name(object: &ObjectRef) -> Result<(), ConversionError> {
    validate::dns1123_subdomain(&object.name).map_err(|message| ConversionError {
        object: object.clone(),
        field: "metadata.name".to_string(),
        message,
        location: None,
        service: None,
    })
}

/// Converts a Service. Errors make the whole Service unusable; warnings drop single values.
/// (An error's [`ConversionError::service`] is filled in by [`crate::Convert`], for every kind.)
pub fn service(svc: &Service, warnings: &mut Vec<Warning>) -> Result<ServiceInfo, ConversionError> {
    let object = object_ref(Kind::Service, &svc.metadata);
    require_identity(&object, true)?;
    require_valid_names(&object)?;
    let mut c = Checker {
        object: &object,
        warnings,
    };
    let labels = svc.metadata.labels.as_ref();
    let proxy_name_label = labels
        .and_then(|l| l.get(LABEL_SERVICE_PROXY_NAME))
        .cloned();
    let headless_label = labels.is_some_and(|l| l.contains_key(LABEL_HEADLESS));
    let key = ServiceKey::new(object.namespace.clone(), object.name.clone());
    let empty_spec = Default::default();
    let spec = svc.spec.as_ref().unwrap_or(&empty_spec);
    let type_ = spec.type_.as_deref().unwrap_or("ClusterIP");

    let mut info = ServiceInfo {
        key,
        ignored: None,
        proxy_name_label,
        headless_label,
        cluster_ips: Vec::new(),
        ports: Vec::new(),
        external_ips: Vec::new(),
        load_balancer_ips: Vec::new(),
        source_ranges: Vec::new(),
        session_affinity: None,
        external_policy_local: false,
        internal_policy_local: false,
        health_check_node_port: None,
        preserve_destination: false,
        not_proxied_ips: None,
        created: svc
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(|t| system_time(t.0)),
        dropped: None,
    };
    if let Some(raw) = svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_PRESERVE_DESTINATION))
    {
        match raw.as_str() {
            "true" => info.preserve_destination = true,
            "false" => {}
            // Upstream enables it for "true" only and silently ignores anything else; say so.
            other => c.warn(
                format!("metadata.annotations[{ANNOTATION_PRESERVE_DESTINATION}]"),
                format!("{other:?} is not \"true\" or \"false\"; preserve-destination stays off"),
            ),
        }
    }
    if type_ == "ExternalName" {
        info.ignored = Some(Ignored::ExternalName);
        // No rule for them, as kube-proxy (ShouldSkipService skips an ExternalName Service
        // whatever its clusterIP); kept for `kpng trace` to name the Service.
        let stray: Vec<IpAddr> = spec
            .cluster_ips
            .iter()
            .flatten()
            .chain(&spec.cluster_ip)
            .filter_map(|raw| parse_ip_sloppy(raw))
            .collect();
        info.not_proxied_ips = not_proxied(stray);
        external_name_cluster_ip(&mut c, spec);
        return Ok(info);
    }
    if !matches!(type_, "ClusterIP" | "NodePort" | "LoadBalancer") {
        return Err(c.error("spec.type", format!("unknown Service type {type_:?}")));
    }
    let cluster_ip = spec.cluster_ip.as_deref().unwrap_or("");
    if cluster_ip.is_empty() || cluster_ip == "None" {
        info.ignored = Some(Ignored::Headless);
        return Ok(info);
    }

    // clusterIPs[0] equals clusterIP (checked below); fall back to clusterIP alone for old
    // objects.
    let raw_ips: Vec<String> = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ips.clone(),
        _ => vec![cluster_ip.to_string()],
    };
    for (i, raw) in raw_ips.iter().enumerate() {
        let field = if spec.cluster_ips.is_some() {
            format!("spec.clusterIPs[{i}]")
        } else {
            "spec.clusterIP".into()
        };
        let ip = parse_ip_sloppy(raw)
            .ok_or_else(|| c.error(field.clone(), format!("{raw:?} is not an IP address")))?;
        if info
            .cluster_ips
            .iter()
            .any(|have| have.is_ipv4() == ip.is_ipv4())
        {
            return Err(c.error(field, "two cluster IPs of the same family"));
        }
        info.cluster_ips.push(ip);
    }
    if spec.cluster_ips.as_ref().is_some_and(|ips| !ips.is_empty())
        && info.cluster_ips.first().copied() != parse_ip_sloppy(cluster_ip)
    {
        return Err(c.error(
            "spec.clusterIP",
            format!(
                "{cluster_ip:?} is not spec.clusterIPs[0] ({:?}); the API server keeps them \
                 equal",
                raw_ips[0]
            ),
        ));
    }
    info.cluster_ips = by_ip_families(&mut c, spec.ip_families.as_deref(), &info.cluster_ips)?;

    for (i, p) in spec.ports.iter().flatten().enumerate() {
        let port = c.port(format!("spec.ports[{i}].port"), p.port)?;
        let protocol = c.protocol(format!("spec.ports[{i}].protocol"), p.protocol.as_deref())?;
        let node_port = c.optional_port(format!("spec.ports[{i}].nodePort"), p.node_port)?;
        let raw_name = p.name.as_deref().unwrap_or_default();
        // Upstream's validateServicePort: a DNS-1123 label (the name reaches iptables
        // comments and chain hashes).
        if !raw_name.is_empty() {
            validate::dns1123_label(raw_name)
                .map_err(|m| c.error(format!("spec.ports[{i}].name"), m))?;
        }
        let name: Name = raw_name.into();
        if info
            .ports
            .iter()
            .any(|q| q.name == name && q.protocol == protocol)
        {
            return Err(c.error(
                format!("spec.ports[{i}].name"),
                format!("duplicate port {name:?}/{protocol}"),
            ));
        }
        info.ports.push(PortInfo {
            name,
            protocol,
            port,
            node_port,
            target_port: target_port(p.target_port.as_ref(), port),
        });
    }

    // Upstream's ValidateEndpointIP for external IPs: 127.0.0.1, 0.0.0.0, 169.254.169.254 or
    // 224.0.0.1 as a Service's external IP would capture the node's own or its metadata
    // service's traffic. The one value is dropped, as an unparseable one is.
    info.external_ips = c.ips(
        "spec.externalIPs",
        spec.external_ips.as_deref().unwrap_or_default(),
        validate::special_ip,
    );
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref());
    // Upstream's ValidateLoadBalancerStatus: only a LoadBalancer Service has a load-balancer
    // status (AllowServiceLBStatusOnNonLB is off, locked since 1.32); `ip` is an IP address
    // (checked as external IPs are, but without ValidateEndpointIP: upstream accepts any
    // address there, and kube-proxy programs it); `ipMode` is VIP or Proxy, and only beside an
    // `ip`. What it refuses is dropped here with a warning, the rest of the Service used.
    let mut proxy_mode_ips = Vec::new();
    for (i, ing) in ingress.into_iter().flatten().enumerate() {
        let mode = ing.ip_mode.as_deref();
        let Some(raw) = ing.ip.as_deref().filter(|s| !s.is_empty()) else {
            if let Some(mode) = mode {
                c.warn(
                    format!("status.loadBalancer.ingress[{i}].ipMode"),
                    format!("{mode:?} may not be specified when `ip` is not set"),
                );
            }
            continue;
        };
        if type_ != "LoadBalancer" {
            c.warn(
                format!("status.loadBalancer.ingress[{i}].ip"),
                format!(
                    "{raw:?}: a load-balancer status may only be used when `spec.type` is \
                     'LoadBalancer', not {type_:?}"
                ),
            );
            continue;
        }
        match mode {
            None | Some("VIP") => {}
            // ipMode Proxy: the load balancer delivers to the node itself, so no VIP rules.
            Some("Proxy") => {
                proxy_mode_ips.extend(parse_ip_sloppy(raw));
                continue;
            }
            Some(other) => {
                c.warn(
                    format!("status.loadBalancer.ingress[{i}].ipMode"),
                    format!(
                        "{other:?} is not a supported ipMode (\"Proxy\" or \"VIP\"); the \
                         load-balancer IP {raw:?} is not used"
                    ),
                );
                continue;
            }
        }
        match parse_ip_sloppy(raw) {
            Some(ip) => info.load_balancer_ips.push(ip),
            None => c.warn(
                format!("status.loadBalancer.ingress[{i}].ip"),
                format!("{raw:?} is not an IP address"),
            ),
        }
    }
    info.not_proxied_ips = not_proxied(proxy_mode_ips);
    for (i, raw) in spec
        .load_balancer_source_ranges
        .iter()
        .flatten()
        .enumerate()
    {
        // Not a warning dropping the one entry: with the others gone too, or with the entry
        // that allowed the only legitimate clients gone, fewer ranges would let more sources
        // in (no range at all lets every source in). A broken object keeps its last good
        // version instead.
        // Trimmed first, as kube-proxy does (`MapCIDRsByIPFamily`), and the API server's
        // validation before it: white space around a source range is no error there.
        let net = parse_cidr_sloppy(raw.trim()).map_err(|e| {
            c.error(
                format!("spec.loadBalancerSourceRanges[{i}]"),
                format!("{e}; an invalid source range never widens access, so the Service is not used as it is"),
            )
        })?;
        info.source_ranges.push(net);
    }

    if spec.session_affinity.as_deref() == Some("ClientIP") {
        let configured = spec
            .session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds);
        let timeout_seconds = match configured {
            None => DEFAULT_AFFINITY_TIMEOUT_SECONDS,
            Some(t) if (1..=86_400).contains(&t) => t as u32,
            Some(t) => {
                return Err(c.error(
                    "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                    format!("{t} is not in 1-86400"),
                ));
            }
        };
        info.session_affinity = Some(SessionAffinity { timeout_seconds });
    }

    let external_type = matches!(type_, "NodePort" | "LoadBalancer");
    info.external_policy_local =
        external_type && spec.external_traffic_policy.as_deref() == Some("Local");
    info.internal_policy_local = spec.internal_traffic_policy.as_deref() == Some("Local");
    if type_ == "LoadBalancer" && info.external_policy_local {
        info.health_check_node_port = c.optional_port(
            "spec.healthCheckNodePort".to_string(),
            spec.health_check_node_port,
        )?;
    }
    Ok(info)
}

/// Says once, naming the Service, that an ExternalName Service's cluster IP gets no rules:
/// kube-proxy skips the Service entirely (only at its debug verbosity), so a user who set one
/// (the API server refuses it; a manifest or an old object can carry it) would otherwise
/// expect it to work. One warning for the Service, naming every address, at `spec.clusterIP`
/// (`spec.clusterIPs` when only that is set).
fn external_name_cluster_ip(c: &mut Checker<'_>, spec: &ServiceSpec) {
    let set = |ip: &&String| !ip.is_empty() && ip.as_str() != "None";
    let mut ips: Vec<&String> = Vec::new();
    for ip in spec
        .cluster_ip
        .iter()
        .chain(spec.cluster_ips.iter().flatten())
    {
        if set(&ip) && !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    let field = if spec.cluster_ip.as_ref().is_some_and(|ip| set(&ip)) {
        "spec.clusterIP"
    } else {
        "spec.clusterIPs"
    };
    if ips.is_empty() {
        return;
    }
    let ips: Vec<String> = ips.iter().map(|ip| format!("{ip:?}")).collect();
    c.warn(
        field,
        format!(
            "cluster IP {} of an ExternalName Service gets no rules: as kube-proxy, kpng does \
             not proxy ExternalName Services (a DNS name only); make it a ClusterIP Service to \
             have it proxied, or remove the cluster IP",
            ips.join(", ")
        ),
    );
}

/// [`ServiceInfo::not_proxied_ips`] of `ips`: sorted, unique, `None` when empty.
fn not_proxied(mut ips: Vec<IpAddr>) -> Option<Box<[IpAddr]>> {
    ips.sort();
    ips.dedup();
    (!ips.is_empty()).then(|| ips.into_boxed_slice())
}

/// Converts an EndpointSlice.
/// (An error's [`ConversionError::service`], the label's Service, is filled in by
/// [`crate::Convert`].)
pub fn endpoint_slice(
    slice: &EndpointSlice,
    warnings: &mut Vec<Warning>,
) -> Result<SliceInfo, ConversionError> {
    let object = object_ref(Kind::EndpointSlice, &slice.metadata);
    require_identity(&object, true)?;
    require_valid_names(&object)?;
    let mut c = Checker {
        object: &object,
        warnings,
    };
    let label = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_SERVICE_NAME));
    // A label value, as the API server checks every label: `b/c` here would join the slice to
    // a Service of another namespace's chain name (`a` + `b/c` reads as `a/b` + `c`).
    if let Some(value) = label {
        validate::label_value(value)
            .map_err(|m| c.error(format!("metadata.labels[{LABEL_SERVICE_NAME}]"), m))?;
    }
    let service = label
        .filter(|s| !s.is_empty())
        .map(|svc| ServiceKey::new(object.namespace.clone(), svc.clone()));
    if service.is_none() {
        c.warn(
            format!("metadata.labels[{LABEL_SERVICE_NAME}]"),
            "not set: the slice belongs to no Service",
        );
    }
    let family = match slice.address_type.as_str() {
        "IPv4" => Some(Family::V4),
        "IPv6" => Some(Family::V6),
        _ => None,
    };
    let mut info = SliceInfo {
        namespace: object.namespace.clone(),
        name: object.name.clone(),
        family,
        service,
        ports: Vec::new(),
        endpoints: Vec::new(),
        dropped: None,
    };
    // Upstream's limits: an object the API server would refuse for its size is refused
    // before its endpoints are read (one slice of 50,000 endpoints delayed every other
    // Service's first sync by 15 s).
    let ports = slice.ports.as_deref().unwrap_or_default();
    if ports.len() > validate::MAX_SLICE_PORTS {
        return Err(c.error(
            "ports",
            format!(
                "{} ports: an EndpointSlice has at most {}",
                ports.len(),
                validate::MAX_SLICE_PORTS
            ),
        ));
    }
    if slice.endpoints.len() > validate::MAX_SLICE_ENDPOINTS {
        return Err(c.error(
            "endpoints",
            format!(
                "{} endpoints: an EndpointSlice has at most {}",
                slice.endpoints.len(),
                validate::MAX_SLICE_ENDPOINTS
            ),
        ));
    }
    if slice.address_type == "FQDN" {
        return Ok(info);
    }
    for (i, p) in ports.iter().enumerate() {
        // The API server defaults a nil name to "" (discovery/v1 SetDefaults_EndpointPort), so
        // kube-proxy never sees one; a hand-written slice gets the same default, where
        // dropping the port left the single unnamed Service port without endpoints.
        let name = p.name.clone().unwrap_or_default();
        // Upstream's validatePorts: empty or a DNS-1123 label. The whole slice is refused, as
        // for a bad protocol: without this port its endpoints would vanish from the Service.
        if !name.is_empty() {
            validate::dns1123_label(&name).map_err(|m| c.error(format!("ports[{i}].name"), m))?;
        }
        let port = match p.port {
            None | Some(0) => {
                c.warn(format!("ports[{i}].port"), "nil or zero port");
                continue;
            }
            Some(v) => c.port(format!("ports[{i}].port"), v)?,
        };
        let protocol = c.protocol(format!("ports[{i}].protocol"), p.protocol.as_deref())?;
        info.ports.push(SlicePort {
            name: name.into(),
            protocol,
            port,
        });
    }
    for (i, ep) in slice.endpoints.iter().enumerate() {
        let Some(raw) = ep.addresses.first() else {
            c.warn(format!("endpoints[{i}].addresses"), "no address");
            continue;
        };
        let Some(ip) = parse_ip_sloppy(raw) else {
            c.warn(
                format!("endpoints[{i}].addresses[0]"),
                format!("{raw:?} is not an IP address"),
            );
            continue;
        };
        // Upstream's ValidateEndpointIP: 127.0.0.1, 0.0.0.0 or 169.254.169.254 as a DNAT
        // target sends the Service's clients to the node itself or its metadata service.
        if let Err(m) = validate::special_ip(ip) {
            c.warn(format!("endpoints[{i}].addresses[0]"), m);
            continue;
        }
        // An IPv4-mapped address reads as IPv4 (as Go's net.ParseIP has it), which an IPv6
        // slice cannot hold (the API server refuses it): the address of the wrong family is
        // dropped, not served in the other family.
        if let Some(family) = family.filter(|f| *f != Family::of(&ip)) {
            let what = if raw.contains(':') && ip.is_ipv4() {
                format!("{raw:?} is an IPv4-mapped IPv6 address, which is IPv4 {ip}")
            } else {
                format!("{raw:?} is not an {family} address")
            };
            c.warn(
                format!("endpoints[{i}].addresses[0]"),
                format!("{what}; an addressType {family} slice holds {family} addresses only"),
            );
            continue;
        }
        let cond = ep.conditions.as_ref();
        let hints = ep.hints.as_ref();
        info.endpoints.push(SliceEndpoint {
            ip,
            node_name: ep.node_name.as_deref().map(Name::from),
            ready: cond.and_then(|c| c.ready).unwrap_or(true),
            serving: cond.and_then(|c| c.serving).unwrap_or(true),
            terminating: cond.and_then(|c| c.terminating).unwrap_or(false),
            hints: TopologyHints::boxed(
                hints
                    .and_then(|h| h.for_zones.as_ref())
                    .into_iter()
                    .flatten()
                    .map(|z| z.name.clone())
                    .collect(),
                hints
                    .and_then(|h| h.for_nodes.as_ref())
                    .into_iter()
                    .flatten()
                    .map(|n| n.name.clone())
                    .collect(),
            ),
        });
    }
    Ok(info)
}

/// Converts a Node.
pub fn node(node: &Node, warnings: &mut Vec<Warning>) -> Result<NodeInfo, ConversionError> {
    let object = object_ref(Kind::Node, &node.metadata);
    require_identity(&object, false)?;
    require_valid_cluster_name(&object)?;
    let mut c = Checker {
        object: &object,
        warnings,
    };
    let mut info = NodeInfo {
        name: object.name.to_string(),
        zone: node
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_TOPOLOGY_ZONE))
            .cloned(),
        deleting: node.metadata.deletion_timestamp.is_some(),
        ..NodeInfo::default()
    };
    let addresses = node.status.as_ref().and_then(|s| s.addresses.as_ref());
    for (i, a) in addresses.into_iter().flatten().enumerate() {
        let target = match a.type_.as_str() {
            "InternalIP" => &mut info.internal_ips,
            "ExternalIP" => &mut info.external_ips,
            _ => continue,
        };
        match parse_ip_sloppy(&a.address) {
            Some(ip) => target.push(ip),
            None => c.warn(
                format!("status.addresses[{i}].address"),
                format!("{:?} is not an IP address", a.address),
            ),
        }
    }
    if let Some(spec) = &node.spec {
        let cidrs: Vec<String> = match (&spec.pod_cidrs, &spec.pod_cidr) {
            (Some(list), _) if !list.is_empty() => list.clone(),
            (_, Some(one)) if !one.is_empty() => vec![one.clone()],
            _ => Vec::new(),
        };
        for (i, raw) in cidrs.iter().enumerate() {
            match parse_cidr_sloppy(raw) {
                Ok(net) => info.pod_cidrs.push(net),
                Err(e) => c.warn(format!("spec.podCIDRs[{i}]"), e.to_string()),
            }
        }
        info.to_be_deleted = spec
            .taints
            .iter()
            .flatten()
            .any(|t| t.key == TAINT_TO_BE_DELETED);
    }
    Ok(info)
}

/// Converts a ServiceCIDR. Every range counts, whatever the object's status: kube-proxy too
/// drops traffic to every range of every ServiceCIDR it sees.
pub fn service_cidr(
    object: &ServiceCIDR,
    warnings: &mut Vec<Warning>,
) -> Result<ServiceCidrInfo, ConversionError> {
    let reference = object_ref(Kind::ServiceCidr, &object.metadata);
    require_identity(&reference, false)?;
    require_valid_cluster_name(&reference)?;
    let mut c = Checker {
        object: &reference,
        warnings,
    };
    let mut info = ServiceCidrInfo {
        name: reference.name.to_string(),
        cidrs: Vec::new(),
    };
    let cidrs = object.spec.as_ref().and_then(|s| s.cidrs.as_ref());
    for (i, raw) in cidrs.into_iter().flatten().enumerate() {
        match parse_cidr_sloppy(raw) {
            Ok(net) => info.cidrs.push(net),
            Err(e) => c.warn(format!("spec.cidrs[{i}]"), e.to_string()),
        }
    }
    Ok(info)
}

/// The `endpoints.kubernetes.io/last-change-trigger-time` annotation of an EndpointSlice: when
/// the change that this version of the slice reflects happened (a Pod became ready, …). `None`
/// when absent or not an RFC 3339 time, as upstream ignores such values.
pub fn last_change_trigger_time(slice: &EndpointSlice) -> Option<std::time::SystemTime> {
    let raw = slice
        .metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_LAST_CHANGE_TRIGGER_TIME)?;
    system_time(raw.parse().ok()?)
}

/// A Kubernetes time as a `SystemTime` (`None` only outside what the platform can represent).
fn system_time(at: k8s_openapi::jiff::Timestamp) -> Option<std::time::SystemTime> {
    let nanos = at.as_nanosecond();
    let magnitude = std::time::Duration::from_nanos(u64::try_from(nanos.unsigned_abs()).ok()?);
    if nanos >= 0 {
        std::time::SystemTime::UNIX_EPOCH.checked_add(magnitude)
    } else {
        std::time::SystemTime::UNIX_EPOCH.checked_sub(magnitude)
    }
}

/// A Service port's `targetPort`: unset, empty or out of range, the Service port (what the API
/// server defaults it to, and no object it accepted has anything else there); it is never a
/// reason to reject the Service, as no backend of kpng uses it (see [`TargetPort`]).
fn target_port(value: Option<&IntOrString>, port: u16) -> TargetPort {
    match value {
        Some(IntOrString::Int(n)) => u16::try_from(*n)
            .ok()
            .filter(|n| *n > 0)
            .map_or(TargetPort::Number(port), TargetPort::Number),
        Some(IntOrString::String(name)) if !name.is_empty() => {
            TargetPort::Name(name.as_str().into())
        }
        _ => TargetPort::Number(port),
    }
}

#[cfg(test)]
mod tests;
