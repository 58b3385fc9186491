//! ReferenceGrant, `gateway.networking.k8s.io/v1beta1` (gateway-api): which namespaces may
//! use objects of this one as a claim's data source.

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::api_resource;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReferenceGrant {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ReferenceGrantSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReferenceGrantSpec {
    #[serde(default)]
    pub from: Vec<ReferenceGrantFrom>,
    #[serde(default)]
    pub to: Vec<ReferenceGrantTo>,
}

/// Who may refer: objects of `group`/`kind` in `namespace`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReferenceGrantFrom {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub namespace: String,
}

/// What may be referred to in the grant's namespace: `group`/`kind`, one `name` or all.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReferenceGrantTo {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

api_resource!(
    ReferenceGrant,
    "gateway.networking.k8s.io",
    "v1beta1",
    "ReferenceGrant",
    "referencegrants",
    NamespaceResourceScope
);
