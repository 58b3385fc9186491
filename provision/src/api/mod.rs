//! The API types the sidecar reads that k8s-openapi does not define: external-snapshotter's
//! VolumeSnapshot and VolumeSnapshotContent (`snapshot.storage.k8s.io/v1`) and gateway-api's
//! ReferenceGrant (`gateway.networking.k8s.io/v1beta1`). Only the fields the sidecar decides on
//! are declared; objects are changed by patches, never by an update of these partial types,
//! so the fields left out are never lost.

mod gateway;
mod snapshot;

pub use gateway::{ReferenceGrant, ReferenceGrantFrom, ReferenceGrantSpec, ReferenceGrantTo};
pub use snapshot::{
    VolumeSnapshot, VolumeSnapshotContent, VolumeSnapshotContentSource, VolumeSnapshotContentSpec,
    VolumeSnapshotContentStatus, VolumeSnapshotSource, VolumeSnapshotSpec, VolumeSnapshotStatus,
};

/// Implements the k8s-openapi traits that make a type usable with `kube::Api`.
macro_rules! api_resource {
    ($type:ty, $group:literal, $version:literal, $kind:literal, $plural:literal, $scope:ty) => {
        impl k8s_openapi::Resource for $type {
            const API_VERSION: &'static str = concat!($group, "/", $version);
            const GROUP: &'static str = $group;
            const KIND: &'static str = $kind;
            const VERSION: &'static str = $version;
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = $scope;
        }

        impl k8s_openapi::Metadata for $type {
            type Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

            fn metadata(&self) -> &Self::Ty {
                &self.metadata
            }

            fn metadata_mut(&mut self) -> &mut Self::Ty {
                &mut self.metadata
            }
        }
    };
}
use api_resource;
