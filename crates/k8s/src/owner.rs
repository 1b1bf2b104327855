//! The Service an object concerns, as a rejection carries it
//! ([`kpng_model::records::ConversionError::service`]).
//!
//! Why: a rejected EndpointSlice used to be named only by its own kind, namespace and name, so
//! `kpng status NS/NAME` (one Service) left out the rejections of that Service's own slices,
//! the very thing an operator debugging it needs. The owner is read from the object's labels
//! where the rejection is made, as the converted slice would have carried it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kpng_model::{Kind, ServiceKey};

use crate::convert::LABEL_SERVICE_NAME;
use crate::validate;

/// The Service an object of `kind` in `namespace` named `name` concerns, when it names one
/// validly: a Service is its own (its names valid, as conversion requires them); an
/// EndpointSlice belongs to the Service its `kubernetes.io/service-name` label
/// (`service_label`) names, when set, not empty and a valid label value (as the converted
/// slice's [`kpng_model::records::SliceInfo::service`]); Nodes and ServiceCIDRs concern no
/// Service. `None` for a name no API server would accept: it cannot be a Service's, and must
/// not be shown as one.
pub fn owning_service(
    kind: Kind,
    namespace: &str,
    name: &str,
    service_label: Option<&str>,
) -> Option<ServiceKey> {
    validate::dns1123_label(namespace).ok()?;
    let service = match kind {
        Kind::Service => name,
        Kind::EndpointSlice => service_label.filter(|l| !l.is_empty())?,
        _ => return None,
    };
    let valid = match kind {
        Kind::Service => validate::service_name(service),
        _ => validate::label_value(service),
    };
    valid.ok()?;
    Some(ServiceKey::new(namespace, service))
}

/// [`owning_service`] of an object by its metadata.
pub fn owning_service_of(kind: Kind, meta: &ObjectMeta) -> Option<ServiceKey> {
    owning_service(
        kind,
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
        meta.labels
            .as_ref()
            .and_then(|l| l.get(LABEL_SERVICE_NAME))
            .map(String::as_str),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (case, kind, namespace, name, label, the owner expected as `ns/name`)
    #[test]
    fn owner_is_read_only_from_valid_names() {
        type Case<'a> = (
            &'a str,
            Kind,
            &'a str,
            &'a str,
            Option<&'a str>,
            Option<&'a str>,
        );
        let cases: &[Case] = &[
            (
                "slice with its label",
                Kind::EndpointSlice,
                "shop",
                "cart-abc",
                Some("cart"),
                Some("shop/cart"),
            ),
            (
                "slice label with a dot and upper case (a valid label value)",
                Kind::EndpointSlice,
                "shop",
                "s",
                Some("Cart.v2"),
                Some("shop/Cart.v2"),
            ),
            (
                "slice without label",
                Kind::EndpointSlice,
                "shop",
                "s",
                None,
                None,
            ),
            (
                "slice with empty label",
                Kind::EndpointSlice,
                "shop",
                "s",
                Some(""),
                None,
            ),
            (
                "slice label with a slash",
                Kind::EndpointSlice,
                "shop",
                "s",
                Some("a/b"),
                None,
            ),
            (
                "slice label with a newline",
                Kind::EndpointSlice,
                "shop",
                "s",
                Some("cart\nx"),
                None,
            ),
            (
                "slice label too long",
                Kind::EndpointSlice,
                "shop",
                "s",
                Some(&"a".repeat(64)),
                None,
            ),
            (
                "slice in no namespace",
                Kind::EndpointSlice,
                "",
                "s",
                Some("cart"),
                None,
            ),
            (
                "slice in an invalid namespace",
                Kind::EndpointSlice,
                "Shop",
                "s",
                Some("cart"),
                None,
            ),
            (
                "Service is its own",
                Kind::Service,
                "shop",
                "cart",
                None,
                Some("shop/cart"),
            ),
            (
                "Service ignores the label",
                Kind::Service,
                "shop",
                "cart",
                Some("other"),
                Some("shop/cart"),
            ),
            (
                "Service with an invalid name",
                Kind::Service,
                "shop",
                "Cart_1",
                None,
                None,
            ),
            (
                "Service without a name",
                Kind::Service,
                "shop",
                "",
                None,
                None,
            ),
            ("Node", Kind::Node, "", "node-1", Some("cart"), None),
            (
                "ServiceCIDR",
                Kind::ServiceCidr,
                "",
                "kubernetes",
                None,
                None,
            ),
        ];
        for (case, kind, namespace, name, label, want) in cases {
            let got = owning_service(*kind, namespace, name, *label).map(|k| k.to_string());
            assert_eq!(got.as_deref(), *want, "{case}");
        }
    }

    /// Every kind's rejection made by [`crate::Convert`] carries its owner, whichever check
    /// refused the object (a port, a protocol, the label itself, a name).
    #[test]
    fn a_conversions_rejection_carries_the_owner() {
        use k8s_openapi::api::core::v1::{Node, Service};
        use k8s_openapi::api::discovery::v1::EndpointSlice;
        use kpng_model::Object;
        let slice = |labels: serde_json::Value, ports: serde_json::Value| {
            serde_json::json!({"metadata": {"namespace": "shop", "name": "cart-abc",
                "labels": labels}, "addressType": "IPv4", "ports": ports, "endpoints": []})
        };
        let label = serde_json::json!({"kubernetes.io/service-name": "cart"});
        // (case, converted, the rejection's Service)
        let cases = [
            (
                "slice: port out of range",
                crate::from_json::<EndpointSlice>(slice(
                    label.clone(),
                    serde_json::json!([{"port": 70000}]),
                )),
                Some("shop/cart"),
            ),
            (
                "slice: unknown protocol",
                crate::from_json::<EndpointSlice>(slice(
                    label.clone(),
                    serde_json::json!([{"port": 80, "protocol": "TPC"}]),
                )),
                Some("shop/cart"),
            ),
            (
                "slice: its label refused",
                crate::from_json::<EndpointSlice>(slice(
                    serde_json::json!({"kubernetes.io/service-name": "a/b"}),
                    serde_json::json!([]),
                )),
                None,
            ),
            (
                "Service: port 0",
                crate::from_json::<Service>(serde_json::json!({"metadata": {"namespace": "shop",
                    "name": "cart"}, "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 0}]}})),
                Some("shop/cart"),
            ),
            (
                "Node: bad name",
                crate::from_json::<Node>(serde_json::json!({"metadata": {"name": "Node 1"}})),
                None,
            ),
        ];
        for (case, converted, want) in cases {
            let converted = converted.expect("decodes");
            let Object::Rejected(e) = converted.object else {
                panic!("{case}: not rejected: {:?}", converted.object);
            };
            assert_eq!(e.service.map(|k| k.to_string()).as_deref(), want, "{case}");
        }
    }

    #[test]
    fn owner_is_read_from_the_metadata_labels() {
        let meta = ObjectMeta {
            namespace: Some("shop".into()),
            name: Some("cart-abc".into()),
            labels: Some([(LABEL_SERVICE_NAME.to_string(), "cart".to_string())].into()),
            ..ObjectMeta::default()
        };
        let owner = owning_service_of(Kind::EndpointSlice, &meta).map(|k| k.to_string());
        assert_eq!(owner.as_deref(), Some("shop/cart"));
        let bare = ObjectMeta {
            labels: None,
            ..meta
        };
        assert_eq!(owning_service_of(Kind::EndpointSlice, &bare), None);
    }
}
