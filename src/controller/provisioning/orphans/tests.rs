use serde_json::json;

use super::*;
use crate::controller::testing::fixtures::{
    CLAIM_PATH, Cluster, CreateVolumeCall, GIB, SECRETS, SHARD, Scenario, bounded, claim_volume,
    claim_volume_path, create_volume, created, delete_volume, get, journal_replaced, patch,
    recorded_operation, secret_read, strings,
};
use crate::provision::PROVISIONING_FINALIZER;
use crate::provision::fixtures::{PVC_UID, PvBuilder, PvcBuilder};
use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, AzureFilePersistentVolumeSource,
};

fn replayed_create() -> CreateVolumeCall {
    CreateVolumeCall {
        name: claim_volume(),
        required_bytes: GIB,
        parameters: strings(&[("type", "fast")]),
        secrets: strings(SECRETS),
        accessibility: None,
        content_source: None,
        mutable_parameters: HashMap::new(),
    }
}

fn orphan_deleted() -> String {
    format!(
        "ProvisioningJournal/{SHARD} Normal OrphanedVolumeDeleted: Deleted volume vol-1 ({}) created for claim apps/data (uid {PVC_UID}), which no longer exists",
        claim_volume()
    )
}

/// The journal's operation, as the reaper finds it after a restart.
async fn reap_journaled(scenario: &Scenario) -> Result<Reaped, ReapError> {
    let ctx = scenario.ctx();
    let idle = ctx.journal.registry().idle();
    assert_eq!(
        idle,
        [recorded_operation()],
        "the journal restored the operation"
    );
    bounded(reap(&ctx, &idle[0])).await
}

fn in_flight(scenario: &Scenario) -> bool {
    scenario.ctx().journal.registry().contains(&claim_volume())
}

#[tokio::test(start_paused = true)]
async fn orphan_reaped() {
    let scenario = Cluster::new()
        .journaled(recorded_operation())
        .start([
            get(CLAIM_PATH).refuse(404, "NotFound"),
            get(claim_volume_path()).refuse(404, "NotFound"),
            secret_read(),
            create_volume(replayed_create(), created("vol-1", GIB)),
            delete_volume("vol-1", SECRETS, Ok(())),
            journal_replaced(json!([])),
        ])
        .await;
    assert!(matches!(reap_journaled(&scenario).await, Ok(Reaped::Done)));
    assert!(!in_flight(&scenario));
    assert_eq!(scenario.finish().await, [orphan_deleted()]);
}

#[tokio::test(start_paused = true)]
async fn the_orphan_of_a_claim_being_deleted_releases_its_consistency_finalizer() {
    let deleting = || {
        PvcBuilder::new()
            .finalizer(PROVISIONING_FINALIZER)
            .deleting()
    };
    let mut released = deleting().build();
    released.metadata.finalizers = None;
    let scenario = Cluster::new()
        .journaled(recorded_operation())
        .start([
            get(CLAIM_PATH).answer(200, deleting().build()),
            get(claim_volume_path()).refuse(404, "NotFound"),
            secret_read(),
            create_volume(replayed_create(), created("vol-1", GIB)),
            delete_volume("vol-1", SECRETS, Ok(())),
            patch(CLAIM_PATH)
                .body(json!([
                    { "op": "test", "path": "/metadata/uid", "value": PVC_UID },
                    { "op": "test", "path": "/metadata/finalizers/0", "value": PROVISIONING_FINALIZER },
                    { "op": "remove", "path": "/metadata/finalizers/0" },
                ]))
                .answer(200, released),
            journal_replaced(json!([])),
        ])
        .await;
    assert!(matches!(reap_journaled(&scenario).await, Ok(Reaped::Done)));
    assert_eq!(scenario.finish().await, [orphan_deleted()]);
}

#[tokio::test(start_paused = true)]
async fn a_claim_that_still_wants_its_volume_keeps_it() {
    let scenario = Cluster::new()
        .journaled(recorded_operation())
        .claim(PvcBuilder::new().build())
        .start([])
        .await;
    assert!(matches!(
        reap_journaled(&scenario).await,
        Ok(Reaped::NotAnOrphan)
    ));
    assert!(in_flight(&scenario));
    assert_eq!(scenario.finish().await, Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn a_volume_held_by_its_pv_only_loses_the_record() {
    let mut pv = PvBuilder::new().build();
    pv.metadata.name = Some(claim_volume());
    let scenario = Cluster::new()
        .journaled(recorded_operation())
        .claim(PvcBuilder::new().build())
        .volume(pv.clone())
        // The cache keeps no claim reference: the PV is read to check it is the claim's.
        .start([
            get(claim_volume_path()).answer(200, pv),
            journal_replaced(json!([])),
        ])
        .await;
    assert!(matches!(reap_journaled(&scenario).await, Ok(Reaped::Done)));
    assert!(!in_flight(&scenario));
    assert_eq!(scenario.finish().await, Vec::<String>::new());
}

/// An in-tree PV of the plugin migrated to the driver whose source cannot be translated
/// may hold the orphan: the volume is not deleted and the record is not dropped.
#[tokio::test(start_paused = true)]
async fn an_orphan_that_an_untranslatable_in_tree_pv_may_hold_keeps_its_record() {
    let in_tree = PvBuilder::new()
        .name("static-ebs")
        .no_csi()
        .map(|pv| {
            if let Some(spec) = pv.spec.as_mut() {
                spec.aws_elastic_block_store = Some(AWSElasticBlockStoreVolumeSource {
                    // Not a form the translation knows, but its last part is the volume's.
                    volume_id: "aws://zone/extra/vol-1".to_owned(),
                    ..Default::default()
                });
            }
        })
        .build();
    let scenario = Cluster::new()
        .driver("ebs.csi.aws.com")
        .journaled(recorded_operation())
        .volume(in_tree)
        .start([
            get(CLAIM_PATH).refuse(404, "NotFound"),
            get(claim_volume_path()).refuse(404, "NotFound"),
            secret_read(),
            create_volume(replayed_create(), created("vol-1", GIB)),
        ])
        .await;
    let Err(error) = reap_journaled(&scenario).await else {
        panic!("the reap ended without knowing whether a PV holds the volume");
    };
    assert!(
        matches!(&error, ReapError::HolderUnknown { volume_id, pv, .. } if volume_id == "vol-1" && pv == "static-ebs"),
        "{error}"
    );
    assert!(in_flight(&scenario), "the record keeps the orphan");
    assert!(!error.waits_for_secret());
    assert_eq!(scenario.finish().await, Vec::<String>::new());
}

/// Issue #31, hole 3: an in-tree PV that cannot be translated (azureFile with
/// `secretName: azure-secret`, as Microsoft's docs write it: no account in it) but whose
/// share is another does not hold the orphan up.
#[tokio::test(start_paused = true)]
async fn an_untranslatable_in_tree_pv_of_another_share_does_not_block_the_orphan() {
    let in_tree = PvBuilder::new()
        .name("static-share")
        .no_csi()
        .map(|pv| {
            if let Some(spec) = pv.spec.as_mut() {
                spec.azure_file = Some(AzureFilePersistentVolumeSource {
                    share_name: "static".to_owned(),
                    secret_name: "azure-secret".to_owned(),
                    ..Default::default()
                });
            }
        })
        .build();
    let handle = format!("rg#account#{}#{}#apps", claim_volume(), claim_volume());
    let scenario = Cluster::new()
        .driver("file.csi.azure.com")
        .journaled(recorded_operation())
        .volume(in_tree)
        .start([
            get(CLAIM_PATH).refuse(404, "NotFound"),
            get(claim_volume_path()).refuse(404, "NotFound"),
            secret_read(),
            create_volume(replayed_create(), created(&handle, GIB)),
            delete_volume(&handle, SECRETS, Ok(())),
            journal_replaced(json!([])),
        ])
        .await;
    assert!(matches!(reap_journaled(&scenario).await, Ok(Reaped::Done)));
    assert!(!in_flight(&scenario));
    let events = scenario.finish().await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0].contains("OrphanedVolumeDeleted"), "{events:?}");
}

#[tokio::test(start_paused = true)]
async fn a_claim_missing_from_the_cache_but_still_there_keeps_its_claim_volume() {
    let scenario = Cluster::new()
        .journaled(recorded_operation())
        .start([get(CLAIM_PATH).answer(200, PvcBuilder::new().build())])
        .await;
    assert!(matches!(
        reap_journaled(&scenario).await,
        Ok(Reaped::NotAnOrphan)
    ));
    assert!(in_flight(&scenario));
    assert_eq!(scenario.finish().await, Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn a_failed_pv_read_is_reported_as_such() {
    let scenario = Cluster::new()
        .journaled(recorded_operation())
        .start([
            get(CLAIM_PATH).refuse(404, "NotFound"),
            get(claim_volume_path()).refuse(500, "InternalError"),
        ])
        .await;
    let Err(error) = reap_journaled(&scenario).await else {
        panic!("the reap went on without knowing whether a PV holds the volume");
    };
    assert!(
        error.to_string().starts_with(&format!(
            "failed to read PersistentVolume {}: ",
            claim_volume()
        )),
        "{error}"
    );
    assert!(in_flight(&scenario));
    assert!(!error.waits_for_secret());
    assert_eq!(secret_wait_message(&recorded_operation(), &error), None);
    assert_eq!(scenario.finish().await, Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn an_orphan_whose_secret_is_gone_waits_for_it_and_says_which() {
    let scenario = Cluster::new()
        .journaled(recorded_operation())
        .start([
            get(CLAIM_PATH).refuse(404, "NotFound"),
            get(claim_volume_path()).refuse(404, "NotFound"),
            get("/api/v1/namespaces/apps/secrets/creds").refuse(404, "NotFound"),
        ])
        .await;
    let Err(error) = reap_journaled(&scenario).await else {
        panic!("the orphan was reaped without its secret");
    };
    assert!(error.waits_for_secret(), "{error}");
    assert!(in_flight(&scenario), "the record keeps the orphan");
    let message = secret_wait_message(&recorded_operation(), &error).unwrap_or_default();
    let expected_start = format!(
        "Volume {} of claim apps/data (uid {PVC_UID}), which no longer exists, is not deleted: provisioner secret apps/creds cannot be read (error getting secret creds in namespace apps: ",
        claim_volume()
    );
    assert!(message.starts_with(&expected_start), "{message}");
    assert!(
        message.ends_with(
            "). It is deleted once the secret can be read again; see docs/journal.md to abandon it"
        ),
        "{message}"
    );
    assert_eq!(scenario.finish().await, Vec::<String>::new());
}
