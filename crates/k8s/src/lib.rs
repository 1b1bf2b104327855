//! Where Kubernetes types stop: Services, EndpointSlices, Nodes and ServiceCIDRs (k8s-openapi)
//! become the model's records ([`kpng_model::records`]) here, once, in the source that read
//! them. The model, the backend contract and every backend never see a Kubernetes type, so
//! they build without `k8s-openapi` (and for any platform).
//!
//! Sources call [`Convert::convert`] on every object they read and send the resulting
//! [`kpng_model::Object`] in their events; the values the conversion had to drop come back as
//! [`Warning`]s for the source to log. Start with [`Convert`].

pub mod convert;
pub mod owner;
pub mod validate;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kpng_model::records::Warning;
use kpng_model::{Kind, Object};

pub use convert::{
    LABEL_HEADLESS, LABEL_SERVICE_NAME, LABEL_SERVICE_PROXY_NAME, last_change_trigger_time,
};
pub use owner::{owning_service, owning_service_of};

/// The API resources kpng reads (group/version and kind), for `kpng version` and the docs:
/// an operator checking compatibility with their cluster asks exactly this.
pub const API_RESOURCES: [&str; 4] = [
    "v1 Service",
    "discovery.k8s.io/v1 EndpointSlice",
    "v1 Node",
    "networking.k8s.io/v1 ServiceCIDR",
];

/// [`KUBERNETES_SCHEMA`] as a string literal, for `concat!` in attributes (kpng's clap
/// `--version` line, which tools such as Calico's start.ps1 match for `vMAJOR.MINOR`, as they
/// match kube-proxy's `Kubernetes v1.x.y`). The one place the number is written.
#[macro_export]
macro_rules! kubernetes_schema {
    () => {
        "1.33"
    };
}

/// The Kubernetes API schema kpng is compiled against (k8s-openapi's `v1_33` feature, set in
/// the workspace's Cargo.toml): the oldest API server whose objects it reads completely.
/// ServiceCIDRs are read only when discovery says the server serves them.
pub const KUBERNETES_SCHEMA: &str = kubernetes_schema!();

/// An object as the model receives it, and the values its conversion ignored.
#[derive(Debug, Clone)]
pub struct Converted {
    /// The record, or [`Object::Rejected`] naming the field that made the object unusable.
    pub object: Object,
    /// Values that were dropped; the rest of the object was used. Sources log them.
    pub warnings: Vec<Warning>,
}

/// A Kubernetes kind kpng reads: converts one object into the model's record.
pub trait Convert {
    /// The model's kind for this type.
    const KIND: Kind;

    /// Converts the object. Never fails: an unusable object becomes [`Object::Rejected`], which
    /// the model counts and answers by keeping the object's last good version.
    fn convert(&self) -> Converted;
}

/// The object as the model receives it. A rejection carries the Service the object concerns
/// (`meta`'s, read as [`owning_service_of`]), whichever check made it: every error path of a
/// conversion ends here.
fn converted<T>(
    result: Result<T, kpng_model::records::ConversionError>,
    warnings: Vec<Warning>,
    (kind, meta): (Kind, &ObjectMeta),
    wrap: impl FnOnce(T) -> Object,
) -> Converted {
    let object = match result {
        Ok(record) => wrap(record),
        Err(mut e) => {
            e.service = owning_service_of(kind, meta).map(Box::new);
            Object::Rejected(Box::new(e))
        }
    };
    Converted { object, warnings }
}

impl Convert for Service {
    const KIND: Kind = Kind::Service;
    fn convert(&self) -> Converted {
        let mut warnings = Vec::new();
        let result = convert::service(self, &mut warnings).map(|mut r| {
            r.dropped = kpng_model::records::dropped(&warnings);
            r
        });
        converted(result, warnings, (Self::KIND, &self.metadata), |r| {
            Object::Service(Box::new(r))
        })
    }
}

impl Convert for EndpointSlice {
    const KIND: Kind = Kind::EndpointSlice;
    fn convert(&self) -> Converted {
        let mut warnings = Vec::new();
        let result = convert::endpoint_slice(self, &mut warnings).map(|mut r| {
            r.dropped = kpng_model::records::dropped(&warnings);
            r
        });
        let trigger_time = last_change_trigger_time(self);
        converted(result, warnings, (Self::KIND, &self.metadata), |slice| {
            Object::EndpointSlice {
                slice: Box::new(slice),
                trigger_time,
            }
        })
    }
}

impl Convert for Node {
    const KIND: Kind = Kind::Node;
    fn convert(&self) -> Converted {
        let mut warnings = Vec::new();
        let result = convert::node(self, &mut warnings);
        converted(result, warnings, (Self::KIND, &self.metadata), |r| {
            Object::Node(Box::new(r))
        })
    }
}

impl Convert for ServiceCIDR {
    const KIND: Kind = Kind::ServiceCidr;
    fn convert(&self) -> Converted {
        let mut warnings = Vec::new();
        let result = convert::service_cidr(self, &mut warnings);
        converted(result, warnings, (Self::KIND, &self.metadata), |r| {
            Object::ServiceCidr(Box::new(r))
        })
    }
}

/// Parses a JSON value of a kind into its record: for tests and tools that write objects as
/// JSON (`serde_json::json!`). Panics are the caller's choice; this returns the parse error.
pub fn from_json<K: Convert + k8s_openapi::serde::de::DeserializeOwned>(
    value: serde_json::Value,
) -> Result<Converted, serde_json::Error> {
    Ok(serde_json::from_value::<K>(value)?.convert())
}

#[cfg(test)]
mod schema_tests {
    /// The constant follows the k8s-openapi feature the workspace enables.
    #[test]
    fn schema_is_the_enabled_k8s_openapi_version() {
        let mut enabled = String::new();
        k8s_openapi::k8s_if_1_33! { enabled.push_str("1.33 "); }
        k8s_openapi::k8s_if_1_34! { enabled.push_str("1.34 "); }
        assert_eq!(enabled.trim(), super::KUBERNETES_SCHEMA);
    }
}
