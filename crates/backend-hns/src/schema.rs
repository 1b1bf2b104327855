//! The HCN JSON schema v2, as far as Service proxying uses it: networks, endpoints and load
//! balancers, with HCN's own field names (`ID`, `HostComputeEndpoints`, `FrontendVIPs`, …).
//!
//! Why plain serde structs: every HCN call takes and returns these documents as strings, so the
//! same types serve the real API (Windows), the simulator and its state file (any OS), and are
//! unit-tested on Linux. Fields HCN has but kpng does not read are kept verbatim in `extra`, so
//! a network or CNI endpoint read from HCN and written back to the simulator's file loses
//! nothing.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// A list HCN may send as `null` (or leave out): empty.
fn list<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// An address as one spelling (`fd00::1`, not `FD00:0::1`), so that HCN's rendering and kpng's
/// compare equal; anything unparseable is kept as it is.
fn canonical_ip(s: &str) -> String {
    s.parse::<std::net::IpAddr>()
        .map(|ip| ip.to_string())
        .unwrap_or_else(|_| s.to_string())
}

/// Load-balancer `Flags` (hcsshim `LoadBalancerFlags`).
pub mod lb_flags {
    /// No flag.
    pub const NONE: u32 = 0;
    /// Direct server return: replies leave the endpoint without passing the load balancer.
    pub const DSR: u32 = 1;
    /// The frontend and endpoints are IPv6.
    pub const IPV6: u32 = 2;
}

/// Port-mapping `Flags` (hcsshim `LoadBalancerPortMappingFlags`).
pub mod port_flags {
    /// No flag.
    pub const NONE: u32 = 0;
    /// Internal load balancing.
    pub const ILB: u32 = 1;
    /// The VIP is reachable from the host itself (node ports).
    pub const LOCAL_ROUTED_VIP: u32 = 2;
    /// DSR for node-port access of a VIP.
    pub const USE_MUX: u32 = 4;
    /// Deliver with the VIP as destination.
    pub const PRESERVE_DIP: u32 = 8;
    /// The frontend is an address outside the cluster (node port, external and ingress IPs).
    pub const VIP_EXTERNAL_IP: u32 = 16;
}

/// Port-mapping `DistributionType` (hcsshim `LoadBalancerDistribution`).
pub mod distribution {
    /// Per connection (5-tuple).
    pub const NONE: u32 = 0;
    /// Per source IP and protocol.
    pub const SOURCE_IP_PROTOCOL: u32 = 1;
    /// Per source IP: ClientIP session affinity.
    pub const SOURCE_IP: u32 = 2;
}

/// Endpoint `Flags` (hcsshim `EndpointFlags`).
pub mod endpoint_flags {
    /// A local endpoint (a pod's NIC on this node, created by the CNI).
    pub const NONE: u32 = 0;
    /// A remote endpoint: a pod on another node, created by the proxy.
    pub const REMOTE: u32 = 1;
}

/// HCN's IP protocol numbers in port mappings.
pub mod protocol {
    /// TCP.
    pub const TCP: u32 = 6;
    /// UDP.
    pub const UDP: u32 = 17;
    /// SCTP.
    pub const SCTP: u32 = 132;
}

/// `SchemaVersion`: every object kpng creates says 2.0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SchemaVersion {
    /// 2.
    pub major: u32,
    /// 0.
    pub minor: u32,
}

impl Default for SchemaVersion {
    fn default() -> SchemaVersion {
        SchemaVersion { major: 2, minor: 0 }
    }
}

/// A GUID in one spelling (lower case, no braces): HCN answers in either case, and kpng keys
/// its maps by ID.
pub fn normalize_id(id: &str) -> String {
    id.trim_matches(|ch| ch == '{' || ch == '}')
        .to_ascii_lowercase()
}

/// A string HCN may send as `null`: empty.
fn string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

/// A policy of a network or an endpoint: a type and type-specific settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
pub struct Policy {
    /// `RemoteSubnetRoute`, `ProviderAddress`, `OutBoundNAT`, …
    #[serde(rename = "Type")]
    pub policy_type: String,
    /// The settings object of that type.
    #[serde(default)]
    pub settings: Value,
}

/// A `HostComputeNetwork`: the CNI's network kpng programs (`--network-name`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
pub struct Network {
    /// The network's GUID.
    #[serde(rename = "ID", default)]
    pub id: String,
    /// Its name (`vxlan0`, `cbr0`, …).
    #[serde(default)]
    pub name: String,
    /// `Overlay` (VXLAN), `L2Bridge`, `NAT`, …
    #[serde(rename = "Type", default)]
    pub network_type: String,
    /// Network policies; on overlay, the CNI's `RemoteSubnetRoute`s (pod subnet → node).
    #[serde(
        default,
        deserialize_with = "list",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub policies: Vec<Policy>,
    /// Everything else HCN says about the network, kept as it came.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One `IpConfigurations` entry of an endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
pub struct IpConfig {
    /// The address.
    pub ip_address: String,
    /// Its prefix length, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_length: Option<u8>,
}

/// A `HostComputeEndpoint`: a pod's address on the network.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
pub struct Endpoint {
    /// The endpoint's GUID (empty in a create request, which then omits it, as hcsshim's
    /// `json:"ID,omitempty"`: HCN picks the GUID).
    #[serde(rename = "ID", default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// Its name.
    #[serde(default)]
    pub name: String,
    /// The network's GUID.
    #[serde(default)]
    pub host_compute_network: String,
    /// Its addresses (one per family).
    #[serde(default, deserialize_with = "list")]
    pub ip_configurations: Vec<IpConfig>,
    /// The MAC address (`02-11-…` for remote endpoints, as kube-proxy conjures them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac_address: Option<String>,
    /// [`endpoint_flags`].
    #[serde(default)]
    pub flags: u32,
    /// Endpoint policies (`ProviderAddress` on an overlay remote endpoint).
    #[serde(default, deserialize_with = "list")]
    pub policies: Vec<Policy>,
    /// `2.0`.
    #[serde(default)]
    pub schema_version: SchemaVersion,
    /// Everything else HCN says about the endpoint.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Endpoint {
    /// Whether the proxy created it for a pod on another node.
    pub fn is_remote(&self) -> bool {
        self.flags & endpoint_flags::REMOTE != 0
    }

    /// Its addresses that parse.
    pub fn ips(&self) -> impl Iterator<Item = std::net::IpAddr> + '_ {
        self.ip_configurations
            .iter()
            .filter_map(|c| c.ip_address.parse().ok())
    }
}

/// One `PortMappings` entry of a load balancer.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "PascalCase")]
pub struct PortMapping {
    /// [`protocol`].
    pub protocol: u32,
    /// The endpoints' port.
    pub internal_port: u16,
    /// The frontend port (Service port, or the node port).
    pub external_port: u16,
    /// [`distribution`].
    #[serde(default)]
    pub distribution_type: u32,
    /// [`port_flags`].
    #[serde(default)]
    pub flags: u32,
}

/// A `HostComputeLoadBalancer`: one frontend (VIP or node port) over a set of endpoints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
pub struct LoadBalancer {
    /// The load balancer's GUID (empty in a create request, which then omits it, as
    /// hcsshim's `json:"ID,omitempty"`: HCN picks the GUID).
    #[serde(rename = "ID", default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// The endpoints' GUIDs.
    #[serde(default, deserialize_with = "list")]
    pub host_compute_endpoints: Vec<String>,
    /// The source address of traffic sent to endpoints (SNAT), `--source-vip` or the node IP.
    #[serde(rename = "SourceVIP", default, deserialize_with = "string")]
    pub source_vip: String,
    /// The frontend addresses; empty for a node-port load balancer, whose request then omits
    /// the field, as hcsshim's `json:",omitempty"` does.
    #[serde(
        rename = "FrontendVIPs",
        default,
        deserialize_with = "list",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub frontend_vips: Vec<String>,
    /// The port mappings (kpng writes one).
    #[serde(default, deserialize_with = "list")]
    pub port_mappings: Vec<PortMapping>,
    /// [`lb_flags`].
    #[serde(default)]
    pub flags: u32,
    /// `2.0`.
    #[serde(default)]
    pub schema_version: SchemaVersion,
}

impl LoadBalancer {
    /// The load balancer without its ID, endpoint order and VIP order: two load balancers that
    /// do the same thing compare equal. A load balancer's identity is its whole content (never
    /// an endpoint *count*: upstream #113524 took a stale policy for valid that way).
    pub fn content(&self) -> LoadBalancer {
        let mut c = self.clone();
        c.id.clear();
        // GUIDs and addresses in one spelling: HCN's answers compare equal to kpng's requests.
        for id in &mut c.host_compute_endpoints {
            *id = normalize_id(id);
        }
        c.host_compute_endpoints.sort();
        c.host_compute_endpoints.dedup();
        c.frontend_vips = c.frontend_vips.iter().map(|v| canonical_ip(v)).collect();
        c.frontend_vips.sort();
        c.source_vip = canonical_ip(&c.source_vip);
        c.port_mappings.sort();
        c.schema_version = SchemaVersion::default();
        c
    }
}

/// The whole HCN state the simulator keeps and writes (`--hcn-simulator FILE`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
pub struct State {
    /// Networks.
    #[serde(default, deserialize_with = "list")]
    pub networks: Vec<Network>,
    /// Endpoints (the CNI's and the proxy's).
    #[serde(default, deserialize_with = "list")]
    pub endpoints: Vec<Endpoint>,
    /// Load balancers.
    #[serde(default, deserialize_with = "list")]
    pub load_balancers: Vec<LoadBalancer>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_balancers_use_hcn_field_names_and_round_trip() {
        let lb = LoadBalancer {
            id: "A".into(),
            host_compute_endpoints: vec!["E1".into()],
            source_vip: "10.0.0.1".into(),
            frontend_vips: vec!["10.96.0.10".into()],
            port_mappings: vec![PortMapping {
                protocol: protocol::TCP,
                internal_port: 8080,
                external_port: 80,
                distribution_type: distribution::SOURCE_IP,
                flags: port_flags::NONE,
            }],
            flags: lb_flags::DSR,
            schema_version: SchemaVersion::default(),
        };
        let json = serde_json::to_value(&lb).expect("serialize");
        for field in [
            "ID",
            "HostComputeEndpoints",
            "SourceVIP",
            "FrontendVIPs",
            "PortMappings",
            "Flags",
            "SchemaVersion",
        ] {
            assert!(json.get(field).is_some(), "{field} missing in {json}");
        }
        let pm = &json["PortMappings"][0];
        for field in [
            "Protocol",
            "InternalPort",
            "ExternalPort",
            "DistributionType",
            "Flags",
        ] {
            assert!(pm.get(field).is_some(), "{field} missing in {pm}");
        }
        assert_eq!(json["SchemaVersion"]["Major"], 2);
        let back: LoadBalancer = serde_json::from_value(json).expect("parse");
        assert_eq!(back, lb);
    }

    #[test]
    fn unknown_network_fields_survive_a_round_trip() {
        let text = r#"{"ID":"N","Name":"vxlan0","Type":"Overlay","Ipams":[{"Type":"Static"}],"Policies":[{"Type":"RemoteSubnetRoute","Settings":{"DestinationPrefix":"10.244.2.0/24","ProviderAddress":"192.168.1.12"}}]}"#;
        let n: Network = serde_json::from_str(text).expect("parse");
        assert_eq!(n.network_type, "Overlay");
        let again = serde_json::to_value(&n).expect("serialize");
        assert_eq!(again["Ipams"][0]["Type"], "Static");
    }

    #[test]
    fn content_ignores_id_and_order_but_not_endpoints() {
        let a = LoadBalancer {
            id: "1".into(),
            host_compute_endpoints: vec!["b".into(), "a".into()],
            ..LoadBalancer::default()
        };
        let b = LoadBalancer {
            id: "2".into(),
            host_compute_endpoints: vec!["a".into(), "b".into()],
            ..LoadBalancer::default()
        };
        let c = LoadBalancer {
            host_compute_endpoints: vec!["a".into(), "c".into()],
            ..b.clone()
        };
        assert_eq!(a.content(), b.content());
        assert_ne!(b.content(), c.content(), "same count, other endpoints");
    }
}
