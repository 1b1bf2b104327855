//! Services and EndpointSlices read without their `managedFields`.
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

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServiceSpec, ServiceStatus};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kpng_k8s::{Convert, Converted};
use kpng_model::Kind;
use serde::{Deserialize, Deserializer};

/// A Kubernetes object read without its `managedFields` (see the module documentation).
#[derive(Debug, Clone)]
pub struct Slim<K>(pub K);

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
        struct Repr {
            #[serde(default)]
            metadata: Meta,
            spec: Option<ServiceSpec>,
            status: Option<ServiceStatus>,
        }
        let r = Repr::deserialize(deserializer)?;
        Ok(Slim(Service {
            metadata: r.metadata.into(),
            spec: r.spec,
            status: r.status,
        }))
    }
}

impl<'de> Deserialize<'de> for Slim<EndpointSlice> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Repr {
            #[serde(default)]
            metadata: Meta,
            address_type: String,
            #[serde(default)]
            endpoints: Vec<Endpoint>,
            ports: Option<Vec<EndpointPort>>,
        }
        let r = Repr::deserialize(deserializer)?;
        Ok(Slim(EndpointSlice {
            metadata: r.metadata.into(),
            address_type: r.address_type,
            endpoints: r.endpoints,
            ports: r.ports,
        }))
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
        self.0.metadata()
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        self.0.metadata_mut()
    }
}

impl<K: Convert> Convert for Slim<K> {
    const KIND: Kind = K::KIND;

    fn convert(&self) -> Converted {
        self.0.convert()
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
        let slim: Slim<Service> = serde_json::from_value(service).expect("slim");
        assert_eq!(slim.0, full);
        let mut full: EndpointSlice = serde_json::from_value(slice.clone()).expect("full");
        full.metadata.managed_fields = None;
        if let Some(annotations) = full.metadata.annotations.as_mut() {
            annotations.remove(LAST_APPLIED);
        }
        let slim: Slim<EndpointSlice> = serde_json::from_value(slice).expect("slim");
        assert_eq!(slim.0, full);
    }

    /// Annotations that are absent or null read as none, as in the full read.
    #[test]
    fn absent_or_null_annotations_are_none() {
        for meta in [
            json!({"name": "s"}),
            json!({"name": "s", "annotations": null}),
        ] {
            let service = json!({"metadata": meta, "spec": {}});
            let slim: Slim<Service> = serde_json::from_value(service).expect("slim");
            assert_eq!(slim.0.metadata.annotations, None);
        }
        let wrong = json!({"metadata": {"annotations": {"a": 1}}, "spec": {}});
        assert!(serde_json::from_value::<Slim<Service>>(wrong).is_err());
    }

    /// A field of the wrong type is still an error (the watcher reports the object).
    #[test]
    fn a_wrong_type_is_still_an_error() {
        let bad = json!({"metadata": {"name": 7}, "spec": {}});
        assert!(serde_json::from_value::<Slim<Service>>(bad).is_err());
    }
}
