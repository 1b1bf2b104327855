//! Services, EndpointSlices and Nodes read without their `managedFields`.
//!
//! Every object the API server returns carries `metadata.managedFields`: the server-side apply
//! bookkeeping of which client set which field, a tree of nested maps that is often the largest
//! part of a Service or an EndpointSlice. k8s-openapi's `ObjectMeta` builds it into a
//! `serde_json::Value` (a map and a string per field), which the proxy never reads. At start-up
//! a large cluster's lists are tens of thousands of objects, so [`Slim`] reads these two kinds
//! with a metadata type that skips the field (serde still walks its bytes, without allocating),
//! and then hands the usual k8s-openapi object, `managed_fields: None`, to the conversion.
//!
//! The `kubectl.kubernetes.io/last-applied-configuration` annotation is skipped the same way:
//! it is the whole object as the user applied it (hundreds of bytes of escaped JSON per
//! Service), and nothing in the proxy reads it.
//!
//! Nothing else is dropped: every other metadata field the conversion or the watcher reads
//! (name, namespace, labels, other annotations, resourceVersion, uid, deletionTimestamp, …)
//! is kept.
//!
//! A Node is read the same way, and of its status only the addresses: its images, conditions
//! and capacity, often most of its bytes, are walked and never built (a brain lists every
//! Node of the cluster).
//!
//! The parts that describe the object (`spec`, `status`, and a slice's `addressType`,
//! `endpoints`, `ports`) are each read on their own from the text the API server sent. A
//! field of the wrong type in one of them (a port that is not a number) then rejects that one
//! object, naming the field, as the conversion rejects a port out of range: the model keeps
//! its last good version and `kpng status` lists it. Read as one piece, the object would make
//! the whole list fail, and the watcher would retry it without end while every other change
//! of that kind waited.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeStatus, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kpng_k8s::{Convert, Converted};
use kpng_model::records::ConversionError;
use kpng_model::{Kind, Object, ObjectRef};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// A Kubernetes object read without its `managedFields` (see the module documentation).
#[derive(Debug, Clone)]
pub struct Slim<K> {
    /// The object; a part that did not decode is left out (`None`, or empty).
    pub object: K,
    /// The part that did not decode, if any: the object is then rejected on its own (the
    /// model keeps its last good version) instead of failing the whole list or watch event.
    pub undecodable: Option<Box<Undecodable>>,
}

impl<K> Slim<K> {
    fn new(object: K, undecodable: Option<Undecodable>) -> Slim<K> {
        Slim {
            object,
            undecodable: undecodable.map(Box::new),
        }
    }
}

/// Which field of an object did not decode, and why: what `kpng status` and the log show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undecodable {
    /// The field's path in the object (`spec.ports[0].port`).
    pub field: String,
    /// The decoder's message, without its position in the (partial) text it read.
    pub message: String,
}

/// Reads one top-level part of an object (a Service's `spec`, an EndpointSlice's `ports`) on
/// its own. The part arrives as the raw JSON text the API server sent (borrowed, not copied),
/// so that a wrong type inside it leaves the rest of the object, and the rest of the list,
/// readable. Only a failed read is read again, to find the field's path.
fn part<T: DeserializeOwned>(
    raw: Option<&RawValue>,
    name: &str,
    undecodable: &mut Option<Undecodable>,
) -> Option<T> {
    let raw = raw?;
    match serde_json::from_str(raw.get()) {
        Ok(value) => Some(value),
        Err(first) => {
            let mut reader = serde_json::Deserializer::from_str(raw.get());
            let (path, error) = match serde_path_to_error::deserialize::<_, T>(&mut reader) {
                Err(e) => (e.path().to_string(), e.into_inner()),
                // Not expected (the same text, the same type): report the first reading.
                Ok(_) => (".".to_string(), first),
            };
            let field = if path == "." {
                name.to_string()
            } else if path.starts_with('[') {
                format!("{name}{path}")
            } else {
                format!("{name}.{path}")
            };
            if undecodable.is_none() {
                *undecodable = Some(Undecodable {
                    field,
                    message: without_position(&error),
                });
            }
            None
        }
    }
}

/// serde_json's message without " at line 1 column 57": a position in a part of the object
/// points nowhere the operator can look.
fn without_position(error: &serde_json::Error) -> String {
    let text = error.to_string();
    match text.rsplit_once(" at line ") {
        Some((message, position))
            if position
                .split(" column ")
                .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) =>
        {
            message.to_string()
        }
        _ => text,
    }
}

/// `ObjectMeta` as the API server sends it, minus `managedFields` (ignored while parsing).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct Meta {
    name: Option<String>,
    generate_name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    #[serde(deserialize_with = "annotations_but_last_applied")]
    annotations: Option<BTreeMap<String, String>>,
    owner_references: Option<Vec<OwnerReference>>,
    finalizers: Option<Vec<String>>,
}

/// The annotation `kubectl apply` keeps the applied object in (see the module documentation).
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Annotations without [`LAST_APPLIED`]: its value is walked, never built into a string.
fn annotations_but_last_applied<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    struct Visitor;
    impl<'de> serde::de::Visitor<'de> for Visitor {
        type Value = Option<BTreeMap<String, String>>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a map of strings")
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(key) = map.next_key::<String>()? {
                if key == LAST_APPLIED {
                    map.next_value::<serde::de::IgnoredAny>()?;
                } else {
                    out.insert(key, map.next_value()?);
                }
            }
            Ok(Some(out))
        }
    }
    deserializer.deserialize_option(Visitor)
}

impl From<Meta> for ObjectMeta {
    fn from(m: Meta) -> ObjectMeta {
        ObjectMeta {
            name: m.name,
            generate_name: m.generate_name,
            namespace: m.namespace,
            uid: m.uid,
            resource_version: m.resource_version,
            generation: m.generation,
            creation_timestamp: m.creation_timestamp,
            deletion_timestamp: m.deletion_timestamp,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            labels: m.labels,
            annotations: m.annotations,
            owner_references: m.owner_references,
            finalizers: m.finalizers,
            managed_fields: None,
            self_link: None,
        }
    }
}

impl<'de> Deserialize<'de> for Slim<Service> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Repr<'a> {
            #[serde(default)]
            metadata: Meta,
            #[serde(borrow)]
            spec: Option<&'a RawValue>,
            #[serde(borrow)]
            status: Option<&'a RawValue>,
        }
        let r = Repr::deserialize(deserializer)?;
        let mut undecodable = None;
        let service = Service {
            metadata: r.metadata.into(),
            spec: part(r.spec, "spec", &mut undecodable),
            status: part(r.status, "status", &mut undecodable),
        };
        Ok(Slim::new(service, undecodable))
    }
}

impl<'de> Deserialize<'de> for Slim<EndpointSlice> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Repr<'a> {
            #[serde(default)]
            metadata: Meta,
            #[serde(borrow)]
            address_type: Option<&'a RawValue>,
            #[serde(borrow)]
            endpoints: Option<&'a RawValue>,
            #[serde(borrow)]
            ports: Option<&'a RawValue>,
        }
        let r = Repr::deserialize(deserializer)?;
        let mut undecodable = None;
        let address_type = part(r.address_type, "addressType", &mut undecodable);
        if address_type.is_none() && undecodable.is_none() {
            undecodable = Some(Undecodable {
                field: "addressType".to_string(),
                message: "missing: every EndpointSlice has one".to_string(),
            });
        }
        let slice = EndpointSlice {
            metadata: r.metadata.into(),
            address_type: address_type.unwrap_or_default(),
            endpoints: part(r.endpoints, "endpoints", &mut undecodable).unwrap_or_default(),
            ports: part(r.ports, "ports", &mut undecodable),
        };
        Ok(Slim::new(slice, undecodable))
    }
}

impl<'de> Deserialize<'de> for Slim<Node> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Repr<'a> {
            #[serde(default)]
            metadata: Meta,
            #[serde(borrow)]
            spec: Option<&'a RawValue>,
            #[serde(borrow)]
            status: Option<&'a RawValue>,
        }
        /// What the proxy reads of a Node's status: its addresses. The rest (images,
        /// conditions, capacity, the node's info), most of a Node's bytes, is walked, never
        /// built.
        #[derive(Deserialize)]
        struct Status {
            addresses: Option<Vec<NodeAddress>>,
        }
        let r = Repr::deserialize(deserializer)?;
        let mut undecodable = None;
        let node = Node {
            metadata: r.metadata.into(),
            spec: part(r.spec, "spec", &mut undecodable),
            status: part::<Status>(r.status, "status", &mut undecodable).map(|s| NodeStatus {
                addresses: s.addresses,
                ..NodeStatus::default()
            }),
        };
        Ok(Slim::new(node, undecodable))
    }
}

impl<K: k8s_openapi::Resource> k8s_openapi::Resource for Slim<K> {
    const API_VERSION: &'static str = K::API_VERSION;
    const GROUP: &'static str = K::GROUP;
    const KIND: &'static str = K::KIND;
    const VERSION: &'static str = K::VERSION;
    const URL_PATH_SEGMENT: &'static str = K::URL_PATH_SEGMENT;
    type Scope = K::Scope;
}

impl<K: k8s_openapi::Metadata<Ty = ObjectMeta>> k8s_openapi::Metadata for Slim<K> {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        self.object.metadata()
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        self.object.metadata_mut()
    }
}

impl<K: Convert + k8s_openapi::Metadata<Ty = ObjectMeta>> Convert for Slim<K> {
    const KIND: Kind = <K as Convert>::KIND;

    fn convert(&self) -> Converted {
        let Some(undecodable) = &self.undecodable else {
            return self.object.convert();
        };
        let meta = self.object.metadata();
        let error = ConversionError {
            object: ObjectRef {
                kind: <K as Convert>::KIND,
                namespace: meta.namespace.as_deref().unwrap_or_default().into(),
                name: meta.name.as_deref().unwrap_or_default().into(),
            },
            field: undecodable.field.clone(),
            message: undecodable.message.clone(),
            location: None,
            service: kpng_k8s::owning_service_of(<K as Convert>::KIND, meta).map(Box::new),
        };
        Converted {
            object: Object::Rejected(Box::new(error)),
            warnings: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The slim read gives the object the full read gives, without `managedFields` and the
    /// last-applied annotation.
    #[test]
    fn slim_objects_equal_full_ones_without_managed_fields() {
        let meta = json!({"name": "s", "namespace": "ns", "uid": "u", "resourceVersion": "7",
            "labels": {"a": "b"},
            "annotations": {"x": "y", LAST_APPLIED: "{\"apiVersion\":\"v1\"}"},
            "deletionTimestamp": "2026-01-01T00:00:00Z",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "s", "uid": "u"}],
            "managedFields": [{"manager": "kubectl", "operation": "Update",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {}}}}]});
        let service = json!({"metadata": meta, "spec": {"clusterIP": "10.96.0.1",
            "ports": [{"port": 80}]}, "status": {"loadBalancer": {}}});
        let slice = json!({"metadata": meta, "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true}}],
            "ports": [{"port": 8080}]});
        let mut full: Service = serde_json::from_value(service.clone()).expect("full");
        assert!(full.metadata.managed_fields.is_some());
        full.metadata.managed_fields = None;
        let annotations = full.metadata.annotations.as_mut().expect("annotations");
        assert!(annotations.remove(LAST_APPLIED).is_some());
        let slim: Slim<Service> = read(&service).expect("slim");
        assert_eq!(slim.object, full);
        let mut full: EndpointSlice = serde_json::from_value(slice.clone()).expect("full");
        full.metadata.managed_fields = None;
        if let Some(annotations) = full.metadata.annotations.as_mut() {
            annotations.remove(LAST_APPLIED);
        }
        let slim: Slim<EndpointSlice> = read(&slice).expect("slim");
        assert_eq!(slim.object, full);
    }

    /// A Node as kubelet reports it: the slim read keeps what the conversion reads (labels,
    /// deletion, pod CIDRs, taints, addresses) and converts to the same record as the full
    /// read; images, conditions, capacity and the node's info are not built.
    #[test]
    fn a_slim_node_converts_as_the_full_one_without_its_images() {
        let node = json!({"metadata": {"name": "node1",
                "labels": {"topology.kubernetes.io/zone": "zone-a", "kubernetes.io/os": "linux"},
                "managedFields": [{"manager": "kubelet", "operation": "Update",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:images": {}}}}]},
            "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24", "fd00:244:1::/64"],
                "taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]},
            "status": {
                "addresses": [{"type": "InternalIP", "address": "192.168.100.1"},
                    {"type": "ExternalIP", "address": "203.0.113.1"},
                    {"type": "Hostname", "address": "node1"}],
                "images": [{"names": ["registry.k8s.io/pause:3.10"], "sizeBytes": 320368}],
                "conditions": [{"type": "Ready", "status": "True",
                    "lastHeartbeatTime": "2026-12-05T00:00:00Z"}],
                "capacity": {"cpu": "2", "memory": "4Gi"},
                "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b",
                    "kernelVersion": "6.18", "osImage": "Debian", "containerRuntimeVersion": "c",
                    "kubeletVersion": "v1.34.0", "kubeProxyVersion": "", "operatingSystem": "linux",
                    "architecture": "amd64"}}});
        let slim: Slim<Node> = read(&node).expect("slim");
        assert!(slim.undecodable.is_none());
        let status = slim.object.status.as_ref().expect("status");
        assert_eq!(status.addresses.as_ref().map(Vec::len), Some(3));
        assert!(status.images.is_none() && status.conditions.is_none());
        assert!(slim.object.metadata.managed_fields.is_none());
        let full: Node = serde_json::from_value(node).expect("full");
        assert_eq!(
            format!("{:?}", slim.convert().object),
            format!("{:?}", full.convert().object)
        );
    }

    /// A Node whose part has a wrong type is rejected alone, naming the field.
    #[test]
    fn a_node_with_a_wrong_type_is_rejected_naming_the_field() {
        let node = json!({"metadata": {"name": "node1"},
            "status": {"addresses": [{"type": "InternalIP", "address": 7}]}});
        let Object::Rejected(error) = read::<Slim<Node>>(&node).expect("read").convert().object
        else {
            panic!("not rejected");
        };
        assert_eq!(error.object.to_string(), "Node node1");
        assert_eq!(error.field, "status.addresses[0].address");
    }

    /// Annotations that are absent or null read as none, as in the full read.
    #[test]
    fn absent_or_null_annotations_are_none() {
        for meta in [
            json!({"name": "s"}),
            json!({"name": "s", "annotations": null}),
        ] {
            let service = json!({"metadata": meta, "spec": {}});
            let slim: Slim<Service> = read(&service).expect("slim");
            assert_eq!(slim.object.metadata.annotations, None);
        }
        let wrong = json!({"metadata": {"annotations": {"a": 1}}, "spec": {}});
        assert!(read::<Slim<Service>>(&wrong).is_err());
    }

    /// Metadata of the wrong type still fails the read (there is no name to reject by; the
    /// watcher reports it).
    #[test]
    fn wrong_metadata_is_still_an_error() {
        let bad = json!({"metadata": {"name": 7}, "spec": {}});
        assert!(read::<Slim<Service>>(&bad).is_err());
    }

    /// Reads as kube-client does: from the response's text, which the parts borrow.
    fn read<T: serde::de::DeserializeOwned>(value: &serde_json::Value) -> serde_json::Result<T> {
        serde_json::from_str(&value.to_string())
    }

    /// A wrong type in a part rejects the object alone, naming the field; the rest of the
    /// object (its name, to keep the last good version by) is read.
    #[test]
    fn a_wrong_type_in_a_part_rejects_the_object_naming_the_field() {
        let meta = json!({"namespace": "ns", "name": "web",
            "labels": {"kubernetes.io/service-name": "owned"}});
        let cases: [(&str, serde_json::Value, &str, &str); 7] = [
            (
                "Service",
                json!({"spec": {"ports": [{"port": "http"}]}}),
                "spec.ports[0].port",
                "invalid type: string \"http\", expected i32",
            ),
            (
                "Service",
                json!({"spec": []}),
                "spec",
                "invalid type: sequence, expected ServiceSpec",
            ),
            (
                "Service",
                json!({"spec": {}, "status": {"loadBalancer": {"ingress": [{"ip": 1}]}}}),
                "status.loadBalancer.ingress[0].ip",
                "invalid type: integer `1`, expected a string",
            ),
            (
                "EndpointSlice",
                json!({"addressType": "IPv4", "ports": [{"port": "eighty"}]}),
                "ports[0].port",
                "invalid type: string \"eighty\", expected i32",
            ),
            (
                "EndpointSlice",
                json!({"addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.1"],
                    "conditions": {"ready": "yes"}}]}),
                "endpoints[0].conditions.ready",
                "invalid type: string \"yes\", expected a boolean",
            ),
            (
                "EndpointSlice",
                json!({"addressType": 4}),
                "addressType",
                "invalid type: integer `4`, expected a string",
            ),
            (
                "EndpointSlice",
                json!({"endpoints": []}),
                "addressType",
                "missing: every EndpointSlice has one",
            ),
        ];
        for (kind, body, field, message) in cases {
            let mut object = body.clone();
            object["metadata"] = meta.clone();
            let converted = if kind == "Service" {
                read::<Slim<Service>>(&object).expect("read").convert()
            } else {
                read::<Slim<EndpointSlice>>(&object)
                    .expect("read")
                    .convert()
            };
            let Object::Rejected(error) = converted.object else {
                panic!("{body}: not rejected: {:?}", converted.object);
            };
            assert_eq!(error.object.to_string(), format!("{kind} ns/web"), "{body}");
            // The Service it concerns: a Service's own, a slice's label's (`owned`).
            let owner = if kind == "Service" {
                "ns/web"
            } else {
                "ns/owned"
            };
            let service = error.service.as_ref().map(ToString::to_string);
            assert_eq!(service.as_deref(), Some(owner), "{body}");
            assert_eq!(
                (error.field.as_str(), error.message.as_str()),
                (field, message),
                "{body}"
            );
        }
    }

    /// The `kube` source converts through `kpng-k8s` as the `file` source does: an invalid
    /// source range rejects the Service (never a wider firewall), and an IPv4-mapped address
    /// is IPv4.
    #[test]
    fn an_invalid_source_range_rejects_the_service() {
        let object = json!({"metadata": {"namespace": "bad", "name": "zone"},
            "spec": {"type": "LoadBalancer", "clusterIP": "fd00:96::a1",
                     "loadBalancerSourceRanges": ["fd00:100::10%eth0/128"],
                     "ports": [{"port": 80, "nodePort": 30101}]}});
        let converted = read::<Slim<Service>>(&object).expect("read").convert();
        let Object::Rejected(error) = converted.object else {
            panic!("not rejected: {:?}", converted.object);
        };
        assert_eq!(error.field, "spec.loadBalancerSourceRanges[0]");
        assert!(
            error
                .message
                .starts_with("\"fd00:100::10%eth0/128\" is not a CIDR"),
            "{error}"
        );
        let object = json!({"metadata": {"namespace": "bad", "name": "mapped"},
            "spec": {"clusterIP": "::ffff:10.96.0.99", "ports": [{"port": 80}]}});
        let converted = read::<Slim<Service>>(&object).expect("read").convert();
        let Object::Service(info) = converted.object else {
            panic!("not a Service: {:?}", converted.object);
        };
        assert_eq!(info.cluster_ips, [std::net::IpAddr::from([10, 96, 0, 99])]);
    }

    /// A good object reads whole and converts as the full type does.
    #[test]
    fn a_good_object_is_not_rejected() {
        let service = json!({"metadata": {"namespace": "ns", "name": "web"},
            "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}});
        let slim: Slim<Service> = read(&service).expect("read");
        assert!(slim.undecodable.is_none());
        let full: Service = serde_json::from_value(service).expect("full");
        assert_eq!(
            format!("{:?}", slim.convert().object),
            format!("{:?}", full.convert().object)
        );
    }

    /// Only a position ("at line 1 column 9") is taken off a message.
    #[test]
    fn only_a_position_is_taken_off_the_message() {
        let error = serde_json::from_str::<i32>("\"x\"").expect_err("a string");
        assert_eq!(
            without_position(&error),
            "invalid type: string \"x\", expected i32"
        );
        let error = serde_json::from_str::<i32>("").expect_err("empty");
        assert_eq!(without_position(&error), "EOF while parsing a value");
    }
}
