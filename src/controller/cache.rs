//! Watches of claims, volumes and classes feeding in-memory stores.
//!
//! Each object is trimmed before it is cached: `managedFields` and the
//! `kubectl.kubernetes.io/last-applied-configuration` annotation are often larger than the
//! rest of a PVC or PV together and the sidecar never reads them. Upstream's informers keep
//! them, which is most of the difference in memory with many claims.
//!
//! The stores are for deciding *whether* to look at an object. Every decision that could
//! create or delete storage is re-checked against a fresh read from the API server by the
//! reconcilers (see docs/design.md, "Fresh state before acting").

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::fmt::Debug;

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops the parts of an object the sidecar never reads.
pub fn trim<K: Resource>(object: &mut K) {
    object.managed_fields_mut().clear();
    object.annotations_mut().remove(LAST_APPLIED);
}

/// A watched, trimmed, cached resource: the store to read and the stream of changed objects
/// that drives a controller (the stream must be polled for the store to fill).
pub fn watch<K>(
    api: Api<K>,
) -> (
    Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, watcher::Config::default().any_semantic())
        .default_backoff()
        .modify(trim::<K>)
        .reflect(writer)
        .applied_objects();
    (reader, stream)
}

/// The three watched kinds of the sidecar.
pub struct Watches<C, V, S> {
    pub claims: (Store<PersistentVolumeClaim>, C),
    pub volumes: (Store<PersistentVolume>, V),
    pub classes: (Store<StorageClass>, S),
}

pub fn watch_all(
    client: &Client,
) -> Watches<
    impl Stream<Item = Result<PersistentVolumeClaim, watcher::Error>> + Send + 'static,
    impl Stream<Item = Result<PersistentVolume, watcher::Error>> + Send + 'static,
    impl Stream<Item = Result<StorageClass, watcher::Error>> + Send + 'static,
> {
    Watches {
        claims: watch(Api::<PersistentVolumeClaim>::all(client.clone())),
        volumes: watch(Api::<PersistentVolume>::all(client.clone())),
        classes: watch(Api::<StorageClass>::all(client.clone())),
    }
}

/// Drains a watch stream so its store keeps filling (for kinds that drive no controller).
pub async fn drive<K>(stream: impl Stream<Item = Result<K, watcher::Error>>) {
    stream.for_each(|_| std::future::ready(())).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};

    #[test]
    fn trim_drops_managed_fields_and_last_applied_but_keeps_the_rest() {
        let mut pvc = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("claim".into()),
                annotations: Some(
                    [
                        (LAST_APPLIED.to_string(), "{...}".to_string()),
                        (
                            "volume.kubernetes.io/storage-provisioner".to_string(),
                            "d".to_string(),
                        ),
                    ]
                    .into(),
                ),
                managed_fields: Some(vec![ManagedFieldsEntry::default()]),
                ..ObjectMeta::default()
            },
            ..PersistentVolumeClaim::default()
        };
        trim(&mut pvc);
        assert!(pvc.managed_fields().is_empty());
        assert_eq!(pvc.annotations().len(), 1);
        assert!(
            pvc.annotations()
                .contains_key("volume.kubernetes.io/storage-provisioner")
        );
        assert_eq!(pvc.name_any(), "claim");
    }
}
