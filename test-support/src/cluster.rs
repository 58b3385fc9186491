//! A test's own part of the shared control plane: its namespace and the objects the peers act
//! on there (StorageClasses, claims, PVs, events, the journal and the Lease), with builders and
//! waits. Every end-to-end test starts with [`Cluster::new`], a `Driver` and a `Sidecar`
//! (support::peers).

use std::collections::BTreeMap;
use std::time::Duration;

use csi_provisioner::provision::{
    ANN_PROVISIONING_CONSISTENCY, PROVISIONING_FINALIZER, PV_FINALIZER,
};
use k8s_openapi::api::core::v1::{
    Event, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, Secret,
    VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttributesClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};

use super::peers::{CsiEndpoint, TIMEOUT};

/// Ours: a StorageClass's calls per second.
pub const CLASS_RATE_ANNOTATION: &str = "provisioner.csi-rs.dev/calls-per-second";
/// Ours: the calls of a class waiting for a slot of its rate.
pub const CLASS_QUEUED_METRIC: &str = "csi_provisioner_storage_class_queued_calls";
use super::{TestNamespace, eventually, test_namespace};

/// A fresh namespace with an admin client, its claims and the (cluster-wide) PVs.
pub struct Cluster {
    pub client: Client,
    pub ns: TestNamespace,
    pub claims: Api<PersistentVolumeClaim>,
    pub volumes: Api<PersistentVolume>,
}

impl Cluster {
    pub async fn new(prefix: &str) -> Cluster {
        let (client, ns) = test_namespace(prefix).await;
        Cluster {
            claims: Api::namespaced(client.clone(), ns.name()),
            volumes: Api::all(client.clone()),
            client,
            ns,
        }
    }

    pub fn ns(&self) -> &str {
        self.ns.name()
    }

    /// Creates an Immediate class `<ns>-<suffix>` of `driver` and returns its name.
    pub async fn class(
        &self,
        suffix: &str,
        driver: &impl CsiEndpoint,
        reclaim_policy: &str,
        parameters: &[(&str, &str)],
    ) -> String {
        let name = format!("{}-{suffix}", self.ns());
        create_class(
            &self.client,
            &storage_class(&name, driver, reclaim_policy, parameters),
        )
        .await;
        name
    }

    /// Creates a 1Gi claim.
    pub async fn claim(&self, name: &str, class: &str) -> PersistentVolumeClaim {
        create_claim(&self.claims, &claim(name, class, "1Gi", None)).await
    }

    /// Creates a 1Gi claim with the provisioning-consistency annotation set to `value`.
    pub async fn consistent_claim(
        &self,
        name: &str,
        class: &str,
        value: &str,
    ) -> PersistentVolumeClaim {
        create_claim(&self.claims, &consistent_claim(name, class, value)).await
    }

    /// Creates 1Gi claims `<prefix>-0` .. `<prefix>-<count - 1>` and returns their names.
    pub async fn claims_named(&self, prefix: &str, class: &str, count: usize) -> Vec<String> {
        let mut names = Vec::new();
        for i in 0..count {
            let name = format!("{prefix}-{i}");
            self.claim(&name, class).await;
            names.push(name);
        }
        names
    }

    pub async fn get_claim(&self, name: &str) -> Option<PersistentVolumeClaim> {
        self.claims
            .get_opt(name)
            .await
            .unwrap_or_else(|e| panic!("reading PVC {name}: {e}"))
    }

    pub async fn delete_claim(&self, name: &str) {
        self.claims
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("deleting PVC {name}: {e}"));
    }

    pub async fn patch_claim(&self, name: &str, patch: serde_json::Value) {
        self.claims
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| panic!("patching PVC {name} with {patch}: {e}"));
    }

    pub async fn wait_claim_gone(&self, name: &str) {
        eventually(&format!("PVC {name} to be gone"), TIMEOUT, || async {
            match self.claims.get_opt(name).await {
                Ok(None) => Ok(()),
                Ok(Some(pvc)) => Err(format!(
                    "still there: deletionTimestamp {:?}, finalizers {:?}",
                    pvc.metadata.deletion_timestamp, pvc.metadata.finalizers
                )),
                Err(e) => Err(e.to_string()),
            }
        })
        .await;
    }

    pub async fn pv(&self, name: &str) -> PersistentVolume {
        self.volumes
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("reading PV {name}: {e}"))
    }

    pub async fn pv_exists(&self, name: &str) -> bool {
        self.volumes
            .get_opt(name)
            .await
            .unwrap_or_else(|e| panic!("reading PV {name}: {e}"))
            .is_some()
    }

    /// Waits until the sidecar has taken its finalizer off PV `name` (it does so for a PV it
    /// will not delete, e.g. a Retain one). A test that kills the sidecar and then deletes
    /// such a PV waits for this first: with the sidecar dead, nobody else removes it.
    pub async fn wait_pv_finalizer_gone(&self, name: &str) {
        eventually(
            &format!("the provisioner's finalizer to leave PV {name}"),
            TIMEOUT,
            || async {
                let pv = self.volumes.get(name).await.map_err(|e| e.to_string())?;
                if has_pv_finalizer(&pv) {
                    Err(format!("finalizers {:?}", pv.metadata.finalizers))
                } else {
                    Ok(())
                }
            },
        )
        .await;
    }

    pub async fn wait_pv_gone(&self, name: &str) {
        eventually(&format!("PV {name} to be deleted"), TIMEOUT, || async {
            match self.volumes.get_opt(name).await {
                Ok(None) => Ok(()),
                Ok(Some(pv)) => Err(format!(
                    "phase {:?}, finalizers {:?}",
                    pv.status.and_then(|s| s.phase),
                    pv.metadata.finalizers
                )),
                Err(e) => Err(e.to_string()),
            }
        })
        .await;
    }

    /// Creates the (cluster-scoped) VolumeAttributesClass `<ns>-<suffix>` of `driver_name` and
    /// returns its name.
    pub async fn attributes_class(
        &self,
        suffix: &str,
        driver_name: &str,
        parameters: &[(&str, &str)],
    ) -> String {
        let name = format!("{}-{suffix}", self.ns());
        create_attributes_class(&self.client, &name, driver_name, parameters).await;
        name
    }

    pub async fn delete_attributes_class(&self, name: &str) {
        delete_attributes_class(&self.client, name).await;
    }

    /// Sets StorageClass `class`'s calls per second (ours: [`CLASS_RATE_ANNOTATION`]).
    pub async fn set_class_rate(&self, class: &str, rate: &str) {
        let patch = serde_json::json!({"metadata": {"annotations": {CLASS_RATE_ANNOTATION: rate}}});
        Api::<StorageClass>::all(self.client.clone())
            .patch(class, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| panic!("annotating StorageClass {class}: {e}"));
    }

    pub async fn create_secret(&self, name: &str, data: &[(&str, &str)]) {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            string_data: Some(
                data.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..Secret::default()
        };
        Api::<Secret>::namespaced(self.client.clone(), self.ns())
            .create(&PostParams::default(), &secret)
            .await
            .unwrap_or_else(|e| panic!("creating Secret {name}: {e}"));
    }
}

// ------------------------------------------------------------------------------ objects

/// An Immediate-binding class of `driver`; `parameters` as given.
pub fn storage_class(
    name: &str,
    driver: &impl CsiEndpoint,
    reclaim_policy: &str,
    parameters: &[(&str, &str)],
) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        provisioner: driver.name().to_owned(),
        reclaim_policy: Some(reclaim_policy.to_owned()),
        volume_binding_mode: Some("Immediate".to_owned()),
        parameters: (!parameters.is_empty()).then(|| {
            parameters
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        }),
        ..StorageClass::default()
    }
}

pub async fn create_class(client: &Client, class: &StorageClass) {
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), class)
        .await
        .unwrap_or_else(|e| panic!("creating StorageClass {:?}: {e}", class.metadata.name));
}

/// A ReadWriteOnce claim of `size` in `class`; `volume_mode` None leaves the API default.
pub fn claim(
    name: &str,
    class: &str,
    size: &str,
    volume_mode: Option<&str>,
) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            storage_class_name: Some(class.to_owned()),
            volume_mode: volume_mode.map(str::to_owned),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity(size.to_owned()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    }
}

/// Creates the (cluster-scoped) VolumeAttributesClass `name` of `driver_name`.
pub async fn create_attributes_class(
    client: &Client,
    name: &str,
    driver_name: &str,
    parameters: &[(&str, &str)],
) {
    let class = VolumeAttributesClass {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        driver_name: driver_name.to_owned(),
        parameters: Some(
            parameters
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
    };
    Api::<VolumeAttributesClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
        .unwrap_or_else(|e| panic!("creating VolumeAttributesClass {name}: {e}"));
}

/// Deletes a VolumeAttributesClass; its protection finalizer keeps it until no claim or PV
/// names it.
pub async fn delete_attributes_class(client: &Client, name: &str) {
    Api::<VolumeAttributesClass>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting VolumeAttributesClass {name}: {e}"));
}

/// A 1Gi claim of `class` naming the VolumeAttributesClass `attributes_class`.
pub fn attributes_class_claim(
    name: &str,
    class: &str,
    attributes_class: &str,
) -> PersistentVolumeClaim {
    let mut pvc = claim(name, class, "1Gi", None);
    if let Some(spec) = pvc.spec.as_mut() {
        spec.volume_attributes_class_name = Some(attributes_class.to_owned());
    }
    pvc
}

/// A 1Gi claim with the provisioning-consistency annotation set to `value`.
pub fn consistent_claim(name: &str, class: &str, value: &str) -> PersistentVolumeClaim {
    let mut pvc = claim(name, class, "1Gi", None);
    pvc.metadata.annotations =
        Some([(ANN_PROVISIONING_CONSISTENCY.to_owned(), value.to_owned())].into());
    pvc
}

pub async fn create_claim(
    claims: &Api<PersistentVolumeClaim>,
    claim: &PersistentVolumeClaim,
) -> PersistentVolumeClaim {
    claims
        .create(&PostParams::default(), claim)
        .await
        .unwrap_or_else(|e| panic!("creating PVC {:?}: {e}", claim.metadata.name))
}

/// Waits until the claim is Bound and returns it.
pub async fn wait_bound(claims: &Api<PersistentVolumeClaim>, name: &str) -> PersistentVolumeClaim {
    eventually(&format!("PVC {name} to be Bound"), TIMEOUT, || async {
        let pvc = claims.get(name).await.map_err(|e| e.to_string())?;
        let phase = pvc.status.as_ref().and_then(|s| s.phase.clone());
        if phase.as_deref() == Some("Bound") {
            Ok(pvc)
        } else {
            Err(format!("phase {phase:?}"))
        }
    })
    .await
}

/// Events whose involved object is the named object in `namespace`, oldest first.
pub async fn events_of(client: &Client, namespace: &str, name: &str) -> Result<Vec<Event>, String> {
    let params = ListParams::default().fields(&format!("involvedObject.name={name}"));
    let mut events = Api::<Event>::namespaced(client.clone(), namespace)
        .list(&params)
        .await
        .map_err(|e| format!("listing events: {e}"))?
        .items;
    events.sort_by_key(|e| e.first_timestamp.as_ref().map(|t| t.0));
    Ok(events)
}

/// `reason: message (xN)` lines, for failure messages.
pub fn summarize(events: &[Event]) -> String {
    events
        .iter()
        .map(|e| {
            format!(
                "{} {}: {} (x{})",
                e.type_.as_deref().unwrap_or("?"),
                e.reason.as_deref().unwrap_or("?"),
                e.message.as_deref().unwrap_or(""),
                e.count.unwrap_or(1)
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Waits for an event on `name` with `reason` whose message satisfies `matches`.
pub async fn wait_event(
    client: &Client,
    namespace: &str,
    name: &str,
    reason: &str,
    matches: impl Fn(&str) -> bool,
) -> Event {
    wait_event_within(client, namespace, name, reason, matches, TIMEOUT).await
}

/// [`wait_event`] with a bound of its own, for an event that comes after a backoff the
/// sidecar does not shorten (a failing watch's, which grows to 30 s and more with jitter).
pub async fn wait_event_within(
    client: &Client,
    namespace: &str,
    name: &str,
    reason: &str,
    matches: impl Fn(&str) -> bool,
    timeout: Duration,
) -> Event {
    eventually(
        &format!("a {reason} event on {namespace}/{name}"),
        timeout,
        || async {
            let events = events_of(client, namespace, name).await?;
            events
                .iter()
                .find(|e| {
                    e.reason.as_deref() == Some(reason)
                        && matches(e.message.as_deref().unwrap_or(""))
                })
                .cloned()
                .ok_or_else(|| summarize(&events))
        },
    )
    .await
}

/// The PVs whose CSI driver is `driver` (every test has its own driver).
pub async fn driver_pvs(
    client: &Client,
    driver: &impl CsiEndpoint,
) -> Result<Vec<PersistentVolume>, String> {
    Ok(Api::<PersistentVolume>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing PVs: {e}"))?
        .items
        .into_iter()
        .filter(|pv| {
            pv.spec
                .as_ref()
                .and_then(|spec| spec.csi.as_ref())
                .is_some_and(|csi| csi.driver == driver.name())
        })
        .collect())
}

/// Whether the claim carries our provisioning-protection finalizer.
pub fn has_consistency_finalizer(pvc: &PersistentVolumeClaim) -> bool {
    pvc.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == PROVISIONING_FINALIZER))
}

/// Whether the PV carries the provisioner's finalizer (upstream's name).
pub fn has_pv_finalizer(pv: &PersistentVolume) -> bool {
    pv.metadata
        .finalizers
        .as_ref()
        .is_some_and(|finalizers| finalizers.iter().any(|f| f == PV_FINALIZER))
}

/// The name of the PV the sidecar creates for a claim: `pvc-<uid>`.
pub fn pv_name(pvc: &PersistentVolumeClaim) -> String {
    format!(
        "pvc-{}",
        pvc.metadata
            .uid
            .as_deref()
            .unwrap_or_else(|| panic!("PVC {:?} has no uid", pvc.metadata.name))
    )
}

// ------------------------------------------------------------------------------ journal

/// Every operation recorded in the journal shards of `driver` in `namespace` (the sidecar's
/// namespace: `--leader-election-namespace`), as `kubectl get provisioningjournals` shows them.
pub async fn journal_operations(
    client: &Client,
    namespace: &str,
    driver: &impl CsiEndpoint,
) -> Result<Vec<csi_provisioner::journal::OperationRecord>, String> {
    let selector = format!(
        "{}={}",
        csi_provisioner::journal::DRIVER_LABEL,
        csi_provisioner::leader::lease_name(driver.name())
    );
    Ok(
        Api::<csi_provisioner::journal::ProvisioningJournal>::namespaced(client.clone(), namespace)
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| format!("listing journal shards: {e}"))?
            .items
            .into_iter()
            .flat_map(|shard| shard.spec.operations)
            .collect(),
    )
}

/// The holder of `driver`'s leader-election Lease in `namespace` ("" when released or absent).
pub async fn lease_holder(
    client: &Client,
    namespace: &str,
    driver: &impl CsiEndpoint,
) -> Result<String, String> {
    let name = csi_provisioner::leader::lease_name(driver.name());
    Ok(
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), namespace)
            .get_opt(&name)
            .await
            .map_err(|e| format!("reading Lease {name}: {e}"))?
            .and_then(|lease| lease.spec?.holder_identity)
            .unwrap_or_default(),
    )
}
