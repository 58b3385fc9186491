//! Watches of claims, volumes and classes feeding in-memory stores.
//!
//! Claims and volumes are cached as [`CachedClaim`] and [`CachedVolume`]: only the fields the
//! sidecar reads, parsed straight from the API's JSON. The rest (`managedFields` above all,
//! often larger than the rest of a PVC or PV together, and the `last-applied-configuration`
//! annotation) is skipped while parsing, never allocated. A full k8s-openapi
//! `PersistentVolume` holds every in-tree volume source inline (3.4 KiB before any string);
//! with 10,000 claims and 10,000 volumes the full types took 80 MiB more than these.
//! The reconcilers turn a cached object back into the k8s-openapi type (`to_claim`,
//! `to_volume`) for the decision functions in `crate::provision`.
//!
//! The stores are for deciding *whether* to look at an object. Every decision that could
//! create or delete storage is re-checked against a fresh read from the API server by the
//! reconcilers (see docs/design.md, "Fresh state before acting").

use std::collections::BTreeMap;
use std::fmt::Debug;

use futures::Stream;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeSpec, PersistentVolumeStatus,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

use crate::provision::class_name_of;

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A claim as cached: its metadata (see [`read_metadata`]) and spec; the status is never read.
#[derive(Clone, Debug, Deserialize, Resource)]
#[resource(inherit = PersistentVolumeClaim)]
pub struct CachedClaim {
    #[serde(deserialize_with = "read_metadata")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<PersistentVolumeClaimSpec>,
}

impl CachedClaim {
    pub fn to_claim(&self) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: self.metadata.clone(),
            spec: self.spec.clone(),
            status: None,
        }
    }

    pub fn class_name(&self) -> &str {
        class_name_of(&self.metadata, self.spec.as_ref())
    }
}

/// A volume as cached: what tells whether the volume reconciler has work (the provisioner
/// annotation or CSI driver, finalizers, reclaim policy, phase) and the class for metrics.
/// Deletion itself reads the whole PV again from the API server.
#[derive(Clone, Debug, Deserialize, Resource)]
#[resource(inherit = PersistentVolume)]
pub struct CachedVolume {
    #[serde(deserialize_with = "read_metadata")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<CachedVolumeSpec>,
    #[serde(default)]
    status: Option<CachedVolumeStatus>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CachedVolumeSpec {
    #[serde(default)]
    csi: Option<CachedCsiSource>,
    #[serde(default)]
    persistent_volume_reclaim_policy: Option<String>,
    #[serde(default)]
    storage_class_name: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CachedCsiSource {
    #[serde(default)]
    driver: String,
    #[serde(default)]
    volume_handle: String,
}

#[derive(Clone, Debug, Deserialize)]
struct CachedVolumeStatus {
    #[serde(default)]
    phase: Option<String>,
}

impl CachedVolume {
    /// The PV with the cached fields only: enough for the triage, not for DeleteVolume.
    pub fn to_volume(&self) -> PersistentVolume {
        PersistentVolume {
            metadata: self.metadata.clone(),
            spec: self.spec.as_ref().map(|spec| PersistentVolumeSpec {
                csi: spec.csi.as_ref().map(|csi| CSIPersistentVolumeSource {
                    driver: csi.driver.clone(),
                    volume_handle: csi.volume_handle.clone(),
                    ..CSIPersistentVolumeSource::default()
                }),
                persistent_volume_reclaim_policy: spec.persistent_volume_reclaim_policy.clone(),
                storage_class_name: spec.storage_class_name.clone(),
                ..PersistentVolumeSpec::default()
            }),
            status: self.status.as_ref().map(|status| PersistentVolumeStatus {
                phase: status.phase.clone(),
                ..PersistentVolumeStatus::default()
            }),
        }
    }
}

/// The metadata fields the sidecar reads: identity, resource version (for patches and event
/// references), annotations, finalizers and the deletion timestamp.
fn read_metadata<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Read {
        name: Option<String>,
        namespace: Option<String>,
        uid: Option<String>,
        resource_version: Option<String>,
        annotations: Option<BTreeMap<String, String>>,
        finalizers: Option<Vec<String>>,
        deletion_timestamp: Option<Time>,
    }
    let mut read = Read::deserialize(deserializer)?;
    if let Some(annotations) = read.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
    Ok(ObjectMeta {
        name: read.name,
        namespace: read.namespace,
        uid: read.uid,
        resource_version: read.resource_version,
        annotations: read.annotations,
        finalizers: read.finalizers,
        deletion_timestamp: read.deletion_timestamp,
        ..ObjectMeta::default()
    })
}

/// A watched, cached resource: the store to read and the stream of changed objects
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
    let stream = watcher(api, list_from_watch_cache())
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    (reader, stream)
}

/// The initial list (and every re-list) asks for `resourceVersion=0` without a page size, as
/// client-go's informers do: the API server answers from its watch cache in one response.
/// kube-core drops `resourceVersion=0` from a request with a `limit` (the server ignores the
/// limit for it), and pages of 500 from etcd cost one `--kube-api-qps` token each: 40 requests
/// and 6.5 s at the default QPS to start with 10,000 claims and 10,000 PVs.
fn list_from_watch_cache() -> watcher::Config {
    watcher::Config {
        page_size: None,
        ..watcher::Config::default().any_semantic()
    }
}

/// The three watched kinds of the sidecar.
pub struct Watches<C, V, S> {
    pub claims: (Store<CachedClaim>, C),
    pub volumes: (Store<CachedVolume>, V),
    pub classes: (Store<StorageClass>, S),
}

pub fn watch_all(
    client: &Client,
) -> Watches<
    impl Stream<Item = Result<CachedClaim, watcher::Error>> + Send + 'static,
    impl Stream<Item = Result<CachedVolume, watcher::Error>> + Send + 'static,
    impl Stream<Item = Result<StorageClass, watcher::Error>> + Send + 'static,
> {
    Watches {
        claims: watch(Api::<CachedClaim>::all(client.clone())),
        volumes: watch(Api::<CachedVolume>::all(client.clone())),
        classes: watch(Api::<StorageClass>::all(client.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::fixtures::{PvBuilder, PvcBuilder};
    use crate::provision::{
        ANN_MIGRATED_TO, ANN_STORAGE_PROVISIONER, PROVISIONING_FINALIZER,
        is_provisioner_for_volume, pv_finalizer_action, should_delete,
    };
    use serde_json::json;

    fn cached_claim(pvc: &PersistentVolumeClaim) -> CachedClaim {
        serde_json::from_value(serde_json::to_value(pvc).unwrap()).unwrap()
    }

    fn cached_volume(pv: &PersistentVolume) -> CachedVolume {
        serde_json::from_value(serde_json::to_value(pv).unwrap()).unwrap()
    }

    #[test]
    fn metadata_skips_managed_fields_and_last_applied_and_keeps_what_is_read() {
        let cached: CachedClaim = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": "data",
                "namespace": "apps",
                "uid": "u-1",
                "resourceVersion": "42",
                "labels": {"app": "db"},
                "annotations": {
                    LAST_APPLIED: "{\"huge\": true}",
                    ANN_STORAGE_PROVISIONER: "d",
                },
                "finalizers": [PROVISIONING_FINALIZER],
                "deletionTimestamp": "2026-12-03T06:00:00Z",
                "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
            },
            "spec": {"storageClassName": "fast", "volumeName": "pv-1"},
            "status": {"phase": "Bound"},
        }))
        .unwrap();
        let meta = &cached.metadata;
        assert_eq!(meta.name.as_deref(), Some("data"));
        assert_eq!(meta.namespace.as_deref(), Some("apps"));
        assert_eq!(meta.uid.as_deref(), Some("u-1"));
        assert_eq!(meta.resource_version.as_deref(), Some("42"));
        assert_eq!(
            meta.annotations,
            Some(BTreeMap::from([(
                ANN_STORAGE_PROVISIONER.to_owned(),
                "d".to_owned()
            )]))
        );
        assert_eq!(
            meta.finalizers.as_deref(),
            Some(&[PROVISIONING_FINALIZER.to_owned()][..])
        );
        assert!(meta.deletion_timestamp.is_some());
        assert!(meta.managed_fields.is_none() && meta.labels.is_none());
        assert_eq!(cached.class_name(), "fast");
        assert_eq!(
            cached.to_claim().spec.and_then(|spec| spec.volume_name),
            Some("pv-1".to_owned())
        );
    }

    #[test]
    fn a_cached_claim_gives_back_the_claim_without_its_status() {
        let claims = [
            PvcBuilder::new().build(),
            PvcBuilder::new()
                .annotation(ANN_STORAGE_PROVISIONER, "d")
                .resource_version("7")
                .volume_mode("Block")
                .access_modes(&["ReadWriteMany", "ReadOnlyMany"])
                .selector()
                .attributes_class("gold")
                .data_source(None, "PersistentVolumeClaim", "source")
                .data_source_ref(Some("snapshot.storage.k8s.io"), "VolumeSnapshot", "s", None)
                .build(),
            PvcBuilder::new()
                .no_class()
                .no_storage()
                .volume_name("pv-9")
                .build(),
        ];
        for claim in claims {
            assert_eq!(cached_claim(&claim).to_claim(), claim);
        }
    }

    #[test]
    fn a_cached_volume_keeps_every_field_the_volume_triage_reads() {
        let volumes = [
            PvBuilder::new().build(),
            PvBuilder::new().provisioned_by("d").build(),
            PvBuilder::new().provisioned_by("other").build(),
            PvBuilder::new().csi_driver("other").build(),
            PvBuilder::new().no_csi().build(),
            PvBuilder::new()
                .no_csi()
                .annotation(ANN_MIGRATED_TO, "d")
                .build(),
            PvBuilder::new().phase("Released").build(),
            PvBuilder::new().phase("Released").no_finalizer().build(),
            PvBuilder::new().phase("Released").deleting().build(),
            PvBuilder::new()
                .phase("Released")
                .deleting()
                .no_finalizer()
                .build(),
            PvBuilder::new().policy("Retain").build(),
            PvBuilder::new().policy("Retain").no_finalizer().build(),
            PvBuilder::new().no_policy().build(),
            PvBuilder::new().no_finalizer().build(),
            PvBuilder::new().class("fast").no_claim_ref().build(),
        ];
        for pv in volumes {
            let cached = cached_volume(&pv).to_volume();
            for driver in [crate::provision::fixtures::DRIVER, "d", "other"] {
                assert_eq!(
                    is_provisioner_for_volume(&cached, driver),
                    is_provisioner_for_volume(&pv, driver),
                    "{pv:?}"
                );
            }
            assert_eq!(pv_finalizer_action(&cached), pv_finalizer_action(&pv));
            assert_eq!(should_delete(&cached), should_delete(&pv));
            assert_eq!(cached.metadata, pv.metadata);
            let class = |pv: &PersistentVolume| pv.spec.as_ref()?.storage_class_name.clone();
            assert_eq!(class(&cached), class(&pv));
        }
    }
}
