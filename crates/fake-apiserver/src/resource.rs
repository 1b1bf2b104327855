//! The resources the fake serves, with the names the real API server uses for them.

use serde_json::{Value, json};

/// A resource (a collection of one kind) the fake API server serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    /// core/v1 `services`.
    Services,
    /// discovery.k8s.io/v1 `endpointslices`.
    EndpointSlices,
    /// core/v1 `nodes`.
    Nodes,
    /// networking.k8s.io/v1 `servicecidrs`.
    ServiceCidrs,
}

impl Resource {
    /// Every resource.
    pub const ALL: [Resource; 4] = [
        Resource::Services,
        Resource::EndpointSlices,
        Resource::Nodes,
        Resource::ServiceCidrs,
    ];

    /// The kind of its objects.
    pub fn kind(self) -> &'static str {
        match self {
            Resource::Services => "Service",
            Resource::EndpointSlices => "EndpointSlice",
            Resource::Nodes => "Node",
            Resource::ServiceCidrs => "ServiceCIDR",
        }
    }

    /// `apiVersion` of its objects.
    pub fn api_version(self) -> &'static str {
        match self {
            Resource::Services | Resource::Nodes => "v1",
            Resource::EndpointSlices => "discovery.k8s.io/v1",
            Resource::ServiceCidrs => "networking.k8s.io/v1",
        }
    }

    /// The URL segment naming the collection.
    pub fn plural(self) -> &'static str {
        match self {
            Resource::Services => "services",
            Resource::EndpointSlices => "endpointslices",
            Resource::Nodes => "nodes",
            Resource::ServiceCidrs => "servicecidrs",
        }
    }

    /// Its API group (`""` for the core group), as RBAC rules and 403 messages name it.
    pub fn group(self) -> &'static str {
        match self {
            Resource::Services | Resource::Nodes => "",
            Resource::EndpointSlices => "discovery.k8s.io",
            Resource::ServiceCidrs => "networking.k8s.io",
        }
    }

    /// The resource named `plural` (`endpointslices`), optionally with its group
    /// (`endpointslices.discovery.k8s.io`), as `kubectl` and RBAC rules name it: how the
    /// binary's `forbid` command takes it.
    pub fn of_plural(name: &str) -> Option<Resource> {
        Resource::ALL.into_iter().find(|r| {
            name == r.plural()
                || (!r.group().is_empty() && name == format!("{}.{}", r.plural(), r.group()))
        })
    }

    /// Whether objects live in namespaces.
    pub fn namespaced(self) -> bool {
        matches!(self, Resource::Services | Resource::EndpointSlices)
    }

    /// The URL prefix of its group version (`/api/v1`, `/apis/GROUP/VERSION`).
    pub fn prefix(self) -> &'static str {
        match self {
            Resource::Services | Resource::Nodes => "/api/v1",
            Resource::EndpointSlices => "/apis/discovery.k8s.io/v1",
            Resource::ServiceCidrs => "/apis/networking.k8s.io/v1",
        }
    }

    /// The resource holding objects of `kind`.
    pub fn of_kind(kind: &str) -> Option<Resource> {
        Resource::ALL.into_iter().find(|r| r.kind() == kind)
    }

    /// Its entry in the group version's `APIResourceList`.
    pub(crate) fn discovery_entry(self) -> Value {
        json!({
            "name": self.plural(),
            "singularName": self.kind().to_lowercase(),
            "namespaced": self.namespaced(),
            "kind": self.kind(),
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        })
    }
}
