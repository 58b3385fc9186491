use super::*;
use crate::provision::fixtures::{PvBuilder, PvcBuilder};
use crate::provision::{
    ANN_MIGRATED_TO, ANN_STORAGE_PROVISIONER, PROVISIONING_FINALIZER, claim_class_name,
    has_deletable_source, is_provisioner_for_volume, pv_finalizer_action, should_delete,
    volume_finalizer_action,
};
use serde_json::json;

fn cached_claim(pvc: &PersistentVolumeClaim) -> CachedClaim {
    serde_json::from_value(serde_json::to_value(pvc).unwrap()).unwrap()
}

fn cached_volume(pv: &PersistentVolume) -> CachedVolume {
    serde_json::from_value(serde_json::to_value(pv).unwrap()).unwrap()
}

/// The comparison sees the object as cached before the event, not the event's own.
#[test]
fn a_watch_event_is_judged_against_the_object_cached_before_it() {
    let (reader, mut writer) = reflector::store::<StorageClass>();
    let class = |mode: &str| StorageClass {
        metadata: ObjectMeta {
            name: Some("c".to_owned()),
            ..ObjectMeta::default()
        },
        provisioner: "d".to_owned(),
        volume_binding_mode: Some(mode.to_owned()),
        ..StorageClass::default()
    };
    writer.apply_watcher_event(&watcher::Event::Apply(class("Immediate")));
    let mode_changed = |old: Option<&StorageClass>, new: Option<&StorageClass>| {
        old.map(|c| &c.volume_binding_mode) != new.map(|c| &c.volume_binding_mode)
    };
    let changes = |event| event_changes(&reader, &event, &mode_changed);
    assert!(!changes(watcher::Event::Apply(class("Immediate"))));
    assert!(changes(watcher::Event::Apply(class(
        "WaitForFirstConsumer"
    ))));
    assert!(changes(watcher::Event::InitApply(class(
        "WaitForFirstConsumer"
    ))));
    assert!(changes(watcher::Event::Delete(class("Immediate"))));
    assert!(!changes(watcher::Event::Init));
    assert!(changes(watcher::Event::InitDone));
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
        "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]},
    }))
    .unwrap();
    let identity = &cached.metadata;
    assert_eq!(identity.name.as_deref(), Some("data"));
    assert_eq!(identity.namespace.as_deref(), Some("apps"));
    assert_eq!(identity.uid.as_deref(), Some("u-1"));
    assert_eq!(identity.resource_version.as_deref(), Some("42"));
    assert!(identity.deletion_timestamp.is_some());
    assert!(identity.annotations.is_none() && identity.finalizers.is_none());
    assert!(!cached.rest.contains("huge") && !cached.rest.contains("kubectl"));

    let claim = cached.to_claim().unwrap();
    let meta = &claim.metadata;
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
    assert_eq!(meta.uid.as_deref(), Some("u-1"));
    assert!(meta.deletion_timestamp.is_some());
    assert!(meta.managed_fields.is_none() && meta.labels.is_none());
    assert_eq!(
        claim.status,
        Some(PersistentVolumeClaimStatus {
            phase: Some("Bound".to_owned()),
            ..PersistentVolumeClaimStatus::default()
        }),
        "of the status only the phase is kept"
    );
    assert_eq!(claim_class_name(&claim), "fast");
    assert_eq!(
        claim.spec.and_then(|spec| spec.volume_name),
        Some("pv-1".to_owned())
    );
}

#[test]
fn an_unreadable_cached_claim_is_an_error_naming_it() {
    let cached = CachedClaim {
        metadata: ObjectMeta {
            name: Some("data".into()),
            namespace: Some("apps".into()),
            ..ObjectMeta::default()
        },
        rest: "{".into(),
    };
    let error = cached.to_claim().unwrap_err().to_string();
    assert!(
        error.starts_with("cached PersistentVolumeClaim apps/data is unreadable"),
        "{error}"
    );
}

#[test]
fn a_cached_claim_gives_back_the_claim_with_its_phase() {
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
        PvcBuilder::new().phase("Pending").build(),
    ];
    for claim in claims {
        assert_eq!(cached_claim(&claim).to_claim().unwrap(), claim);
    }
}

/// A PV without a CSI source, with the in-tree source `source` sets, migrated to "d".
fn in_tree(
    source: impl FnOnce(&mut k8s_openapi::api::core::v1::PersistentVolumeSpec),
) -> PersistentVolume {
    PvBuilder::new()
        .no_csi()
        .annotation(ANN_MIGRATED_TO, "d")
        .map(|pv| {
            if let Some(spec) = pv.spec.as_mut() {
                source(spec);
            }
        })
        .build()
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
        in_tree(|spec| spec.gce_persistent_disk = Some(Default::default())),
        in_tree(|spec| spec.aws_elastic_block_store = Some(Default::default())),
        in_tree(|spec| spec.azure_disk = Some(Default::default())),
        in_tree(|spec| spec.azure_file = Some(Default::default())),
        in_tree(|spec| spec.cinder = Some(Default::default())),
        in_tree(|spec| spec.vsphere_volume = Some(Default::default())),
        in_tree(|spec| spec.portworx_volume = Some(Default::default())),
        in_tree(|spec| spec.nfs = Some(Default::default())),
    ];
    for pv in volumes {
        let cached = cached_volume(&pv).to_volume().unwrap();
        for driver in [
            crate::provision::fixtures::DRIVER,
            "d",
            "other",
            "pd.csi.storage.gke.io",
            "ebs.csi.aws.com",
            "disk.csi.azure.com",
            "file.csi.azure.com",
            "cinder.csi.openstack.org",
            "csi.vsphere.vmware.com",
            "pxd.portworx.com",
        ] {
            assert_eq!(
                is_provisioner_for_volume(&cached, driver),
                is_provisioner_for_volume(&pv, driver),
                "{pv:?}"
            );
            assert_eq!(
                volume_finalizer_action(&cached, driver),
                volume_finalizer_action(&pv, driver),
                "{pv:?}"
            );
            assert_eq!(
                has_deletable_source(&cached, driver),
                has_deletable_source(&pv, driver),
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

#[test]
fn a_cached_attachment_keeps_its_pv_and_node_only() {
    let cached: CachedAttachment = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "VolumeAttachment",
        "metadata": {"name": "csi-123", "resourceVersion": "9",
                     "managedFields": [{"manager": "kube-controller-manager"}]},
        "spec": {"attacher": "d", "nodeName": "node-1",
                 "source": {"persistentVolumeName": "pv-1"}},
        "status": {"attached": true},
    }))
    .unwrap();
    assert_eq!(cached.metadata.name.as_deref(), Some("csi-123"));
    assert_eq!(
        cached.attachment(),
        Attachment {
            name: "csi-123",
            persistent_volume_name: Some("pv-1"),
            node_name: "node-1"
        }
    );
    let inline: CachedAttachment = serde_json::from_value(json!({
        "metadata": {"name": "csi-456"},
        "spec": {"attacher": "d", "nodeName": "node-2",
                 "source": {"inlineVolumeSpec": {"csi": {"driver": "d", "volumeHandle": "v"}}}},
    }))
    .unwrap();
    assert_eq!(inline.attachment().persistent_volume_name, None);
}

fn probe_answer(json: serde_json::Value) -> Option<Result<WatchEvent<StorageClass>, ()>> {
    Some(Ok(serde_json::from_value(json).unwrap()))
}

#[test]
fn the_closing_bookmark_means_streamed_lists() {
    let answer = probe_answer(json!({"type": "BOOKMARK", "object": {
        "kind": "StorageClass", "apiVersion": "storage.k8s.io/v1",
        "metadata": {"resourceVersion": "70271",
                     "annotations": {"k8s.io/initial-events-end": "true"}},
        "provisioner": ""}}));
    assert_eq!(initial_list_from(answer.as_ref()), InitialList::Streamed);
}

#[test]
fn any_other_probe_answer_means_lists() {
    let periodic_bookmark = probe_answer(json!({"type": "BOOKMARK", "object": {
        "kind": "StorageClass", "apiVersion": "storage.k8s.io/v1",
        "metadata": {"resourceVersion": "70271"}, "provisioner": ""}}));
    let object = probe_answer(json!({"type": "ADDED", "object": {
        "kind": "StorageClass", "apiVersion": "storage.k8s.io/v1",
        "metadata": {"name": "fast", "resourceVersion": "1"}, "provisioner": "p"}}));
    let answers = [periodic_bookmark, object, Some(Err(())), None];
    for answer in answers {
        assert_eq!(
            initial_list_from(answer.as_ref()),
            InitialList::Listed,
            "{answer:?}"
        );
    }
}

/// Feeds `events` through [`FirstList`] into a store, as `watch_claims` does; the store's
/// names after each event, and whether the first list was said whole.
fn first_list_run(events: Vec<watcher::Event<CachedClaim>>) -> (Vec<Vec<String>>, bool) {
    let (reader, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    writer.apply_watcher_event(&watcher::Event::InitDone);
    let (whole, mut listed) = tokio::sync::oneshot::channel();
    let mut first = FirstList::new(whole);
    let mut seen = Vec::new();
    for event in events {
        if let Some(event) = first.route(event) {
            writer.apply_watcher_event(&event);
        }
        let mut names: Vec<String> = reader
            .state()
            .iter()
            .map(|claim| claim.metadata.name.clone().unwrap_or_default())
            .collect();
        names.sort();
        seen.push(names);
    }
    (seen, listed.try_recv().is_ok())
}

fn named(name: &str) -> CachedClaim {
    cached_claim(&PvcBuilder::new().name(name).build())
}

#[test]
fn the_first_list_enters_the_store_as_it_arrives_and_is_said_whole_at_its_end() {
    use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
    let (seen, whole) = first_list_run(vec![
        Init,
        InitApply(named("a")),
        InitApply(named("b")),
        InitDone,
        Apply(named("c")),
        Delete(named("a")),
    ]);
    let names = |list: &[&str]| list.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    assert_eq!(
        seen,
        [
            names(&[]),
            names(&["a"]),
            names(&["a", "b"]),
            names(&["a", "b"]),
            names(&["a", "b", "c"]),
            names(&["b", "c"]),
        ]
    );
    assert!(whole);

    let (_, whole) = first_list_run(vec![Init, InitApply(named("a"))]);
    assert!(!whole, "said whole before its end");
}

#[test]
fn a_restarted_first_list_and_every_later_one_are_swapped_in_whole() {
    use watcher::Event::{Init, InitApply, InitDone};
    // "gone" arrived in the broken first attempt and was deleted before the second.
    let (seen, whole) = first_list_run(vec![
        Init,
        InitApply(named("gone")),
        Init,
        InitApply(named("kept")),
        InitDone,
        Init,
        InitApply(named("new")),
        InitDone,
    ]);
    let names = |list: &[&str]| list.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    assert_eq!(
        seen,
        [
            names(&[]),
            names(&["gone"]),
            // Buffered: the store keeps what it had until the list is whole.
            names(&["gone"]),
            names(&["gone"]),
            names(&["kept"]),
            names(&["kept"]),
            names(&["kept"]),
            names(&["new"]),
        ]
    );
    assert!(whole);
}
