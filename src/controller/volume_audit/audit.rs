//! Ours (not upstream): the backend audit, `--audit-volumes-interval`. Every interval the
//! leader pages through the driver's ListVolumes, reads what references volumes (the PV store,
//! every node's journal, the VolumeSnapshotContents) and has `provision::audit` decide which
//! volumes nothing references. Those are reported: two gauges, a Warning event
//! `UnreferencedVolume` per volume, and the ConfigMap `<journal shards' base name>-audit` in the
//! journal's namespace listing them. With `--audit-delete-after`, a volume that may be deleted is recorded
//! in the journal by its id first (docs/journal.md, rule 19); the orphan reaper then deletes it
//! as it deletes orphans (`orphans::delete_unreferenced`).
//!
//! A pass whose ListVolumes pages fail, repeat a volume or loop, or whose references cannot all
//! be read, reports and deletes nothing.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::sync::Arc;

use futures::FutureExt;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, PersistentVolume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use thiserror::Error;
use tracing::{info, warn};

use crate::api::VolumeSnapshotContent;
use crate::controller::runtime::events::EventType;
use crate::controller::shared::context::Context;
use crate::csi;
use crate::csi_client::CallError;
use crate::journal::{JournalError, Operation};
use crate::provision::InTreePlugin;
use crate::provision::audit::{
    AuditMemory, AuditPolicy, Deletion, Finding, InFlight, ListedVolume, Listing, ListingError,
    References, audit_pass, holds_name,
};

/// Volumes asked for per ListVolumes page.
const PAGE_SIZE: i32 = 500;
/// At most this many deletions are recorded per pass: a mistake (a backend shared with
/// another cluster of the same naming) costs at most this many volumes before someone looks.
const MAX_DELETIONS_PER_PASS: usize = 10;
/// At most this many volumes are listed in the report ConfigMap (a ConfigMap holds 1 MiB).
const MAX_REPORT_ROWS: usize = 1000;
const UNREFERENCED_VOLUME: &str = "UnreferencedVolume";
const AUDIT_FAILED: &str = "AuditFailed";
const FIELD_MANAGER: &str = "csi-provisioner-audit";

/// Why a pass was not completed; it reports and deletes nothing.
#[derive(Debug, Error)]
pub(in crate::controller) enum AuditError {
    #[error("ListVolumes failed: {0}")]
    List(CallError),
    #[error(transparent)]
    Listing(#[from] ListingError),
    #[error("the operations in flight cannot be read: {0}")]
    Journal(JournalError),
    #[error("the VolumeSnapshotContents cannot be listed: {0}")]
    Contents(kube::Error),
    #[error(
        "cached PersistentVolume {0} cannot be read: whether it references a volume is unknown"
    )]
    Volume(String),
    #[error("the PersistentVolume named like the volume cannot be read: {0}")]
    Pv(kube::Error),
}

/// The audit: owns what it remembers of each volume between passes and which it reported.
pub(in crate::controller) struct Auditor {
    ctx: Arc<Context>,
    policy: AuditPolicy,
    memory: AuditMemory,
    reported: HashSet<String>,
    /// What the report ConfigMap holds (its data but the time), and its reference: it is
    /// written only when that changes, so a steady state costs the API server nothing.
    written: Option<(BTreeMap<String, String>, ObjectReference)>,
}

impl Auditor {
    /// `None` without `--audit-volumes-interval`.
    pub(in crate::controller) fn new(ctx: &Arc<Context>) -> Option<Self> {
        let settings = &ctx.settings;
        if settings.audit_volumes_interval.is_zero() {
            return None;
        }
        Some(Auditor {
            ctx: Arc::clone(ctx),
            policy: AuditPolicy {
                interval: settings.audit_volumes_interval,
                delete_after: settings.audit_delete_after,
                name_prefix: settings.config.volume_name_prefix.clone(),
                uuid_length: settings.config.volume_name_uuid_length,
            },
            memory: AuditMemory::new(),
            reported: HashSet::new(),
            written: None,
        })
    }

    /// Runs a pass at once (once the claim and PV stores have listed: their silence is read as
    /// "no claim", "no PV") and then every interval after the previous pass ended, until
    /// `drained` resolves.
    pub(in crate::controller) async fn run<D>(mut self, drained: impl Fn() -> D)
    where
        D: Future<Output = ()>,
    {
        let stop = drained().shared();
        let ctx = Arc::clone(&self.ctx);
        tokio::select! {
            () = stop.clone() => return,
            listed = async {
                ctx.claims_listed.clone().await && ctx.volumes_listed.clone().await
            } => if !listed { return },
        }
        loop {
            tokio::select! {
                () = stop.clone() => return,
                () = self.pass() => {}
            }
            tokio::select! {
                () = stop.clone() => return,
                () = tokio::time::sleep(self.policy.interval) => {}
            }
        }
    }

    async fn pass(&mut self) {
        let started = Timestamp::now();
        let findings = match self.find(started).await {
            Ok(findings) => findings,
            Err(error) => {
                warn!(%error, "the audit of the driver's volumes failed; nothing is reported or deleted from it");
                self.ctx.metrics.audit_failed();
                let report = self.publish_report(None, Some(&error.to_string())).await;
                if let Some(report) = report {
                    self.ctx.events.publish(
                        &report,
                        EventType::Warning,
                        AUDIT_FAILED,
                        &format!("The audit of the driver's volumes failed; nothing is reported or deleted from it: {error}"),
                    );
                }
                return;
            }
        };
        let bytes = findings
            .iter()
            .map(|finding| finding.volume.capacity_bytes.max(0))
            .fold(0_i64, i64::saturating_add);
        self.ctx.metrics.audit_complete(findings.len(), bytes);
        info!(
            unreferenced = findings.len(),
            bytes, "audited the driver's volumes"
        );
        let report = self.publish_report(Some(&findings), None).await;
        let mut reported = HashSet::new();
        let mut recorded = 0;
        for finding in &findings {
            let id = &finding.volume.id;
            if self.reported.contains(id) {
                reported.insert(id.clone());
            } else if let Some(report) = &report {
                // Told once; without the report to regard, told at the next pass.
                self.ctx.events.publish(
                    report,
                    EventType::Warning,
                    UNREFERENCED_VOLUME,
                    &finding_message(finding),
                );
                reported.insert(id.clone());
            }
            if let Deletion::Due {
                volume_name,
                claim_uid,
            } = &finding.deletion
            {
                if recorded == MAX_DELETIONS_PER_PASS {
                    continue;
                }
                if self.record_deletion(id, volume_name, claim_uid).await {
                    recorded += 1;
                }
            }
        }
        self.reported = reported;
    }

    /// Lists the volumes, reads the references and decides; remembers what it saw.
    async fn find(&mut self, started: Timestamp) -> Result<Vec<Finding>, AuditError> {
        let listed = list_volumes(&self.ctx).await?;
        // Read after the listing: a reference that ends meanwhile (a PV deleted with its
        // volume) only makes a volume that is gone look referenced.
        let in_flight: Vec<InFlight> = self
            .ctx
            .journal
            .operations_everywhere()
            .await
            .map_err(AuditError::Journal)?;
        let snapshot_sources = snapshot_sources(&self.ctx).await?;
        let (pv_handles, in_tree_pvs) = volume_references(&self.ctx)?;
        let claim_uids: HashSet<String> = self
            .ctx
            .claims
            .state()
            .iter()
            .filter_map(|claim| claim.metadata.uid.clone())
            .collect();
        let references = References {
            driver: &self.ctx.settings.config.driver_name,
            pv_handles: &pv_handles,
            in_tree_pvs: &in_tree_pvs,
            snapshot_sources: &snapshot_sources,
            in_flight: &in_flight,
            claim_uids: &claim_uids,
        };
        let outcome = audit_pass(&self.memory, &listed, &references, &self.policy, started);
        for (volume_id, pv, why) in &outcome.undecided {
            warn!(
                volume_id,
                pv,
                why,
                "whether an in-tree PV references this volume cannot be told; it is not reported"
            );
        }
        self.memory = outcome.memory;
        Ok(outcome.findings)
    }

    /// Records the deletion of `volume_id` in the journal, where the reaper takes it. Not
    /// under `--drain` (nothing new starts), not while an operation holds the name, and not if
    /// a PV of that name exists now (read from the API server, not the store).
    /// Whether the deletion was recorded now.
    async fn record_deletion(&self, volume_id: &str, volume_name: &str, claim_uid: &str) -> bool {
        let ctx = &self.ctx;
        if ctx.settings.draining || ctx.journal.registry().contains(volume_name) {
            return false;
        }
        let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
        match volumes.get_opt(volume_name).await {
            Ok(None) => {}
            Ok(Some(_)) => {
                info!(
                    volume_id,
                    pv = volume_name,
                    "a PV named like the unreferenced volume exists now: not deleted"
                );
                return false;
            }
            Err(error) => {
                warn!(volume_id, pv = volume_name, %error, "cannot tell whether a PV names the unreferenced volume: not deleted this time");
                return false;
            }
        }
        let operation = Operation {
            volume_name: volume_name.to_owned(),
            claim_namespace: String::new(),
            claim_name: String::new(),
            claim_uid: claim_uid.to_owned(),
            class_name: String::new(),
            request: csi::CreateVolumeRequest {
                name: volume_name.to_owned(),
                ..csi::CreateVolumeRequest::default()
            },
            provisioner_secret: None,
            attributes_class: None,
            known_volume_id: Some(volume_id.to_owned()),
        };
        // Durable before anything is sent; the busy mark is dropped at once and the reaper
        // takes the operation at its next scan.
        match ctx.journal.record(operation).await {
            Ok((_busy, recorded)) if recorded.known_volume_id.as_deref() == Some(volume_id) => {
                info!(
                    volume_id,
                    volume = volume_name,
                    "recorded the deletion of a volume nothing references"
                );
                true
            }
            Ok(_) => {
                warn!(
                    volume_id,
                    volume = volume_name,
                    "an operation of another kind holds the name: not deleted"
                );
                false
            }
            Err(error) => {
                warn!(volume_id, volume = volume_name, %error, "the deletion of an unreferenced volume was not recorded: not deleted this time");
                false
            }
        }
    }

    /// Writes the report ConfigMap (findings of a complete pass, or the error of a failed one,
    /// which keeps the last list) if what it says changed; its reference for events, `None` if
    /// it cannot be written.
    async fn publish_report(
        &mut self,
        findings: Option<&[Finding]>,
        error: Option<&str>,
    ) -> Option<ObjectReference> {
        let ctx = &self.ctx;
        let mut data = BTreeMap::from([
            ("driver".to_owned(), ctx.settings.config.driver_name.clone()),
            ("lastError".to_owned(), error.unwrap_or_default().to_owned()),
        ]);
        match (findings, &self.written) {
            (Some(findings), _) => {
                data.insert("unreferenced".to_owned(), findings.len().to_string());
                data.insert("volumes".to_owned(), report_table(findings));
            }
            (None, Some((written, _))) => {
                for key in ["unreferenced", "volumes"] {
                    if let Some(value) = written.get(key) {
                        data.insert(key.to_owned(), value.clone());
                    }
                }
            }
            (None, None) => {}
        }
        if let Some((written, reference)) = &self.written
            && *written == data
        {
            return Some(reference.clone());
        }
        let name = format!("{}-audit", ctx.journal.base_name());
        let mut stamped = data.clone();
        stamped.insert("since".to_owned(), Timestamp::now().to_string());
        let report = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(ctx.journal.namespace().to_owned()),
                ..ObjectMeta::default()
            },
            data: Some(stamped),
            ..ConfigMap::default()
        };
        let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ctx.journal.namespace());
        // Created the first time (a leader that has written none yet), applied after that; each
        // falls back to the other when the object is (not) there.
        let apply = PatchParams::apply(FIELD_MANAGER).force();
        let written = if self.written.is_none() {
            match api.create(&PostParams::default(), &report).await {
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    api.patch(&name, &apply, &Patch::Apply(&report)).await
                }
                other => other,
            }
        } else {
            match api.patch(&name, &apply, &Patch::Apply(&report)).await {
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    api.create(&PostParams::default(), &report).await
                }
                other => other,
            }
        };
        match written {
            Ok(written) => {
                let reference = written.object_ref(&());
                self.written = Some((data, reference.clone()));
                Some(reference)
            }
            Err(error) => {
                warn!(configmap = name, %error, "the audit report cannot be written");
                None
            }
        }
    }
}

/// Read again right before the reaper's DeleteVolume of a recorded audit deletion (the decision
/// may be old: retries back off, a new leader takes it over): whether a PV named like it, a
/// VolumeSnapshotContent taken from it, or another operation of its name or id references
/// `volume_id` now. PVs of other names are the reaper's cache check (`orphans::confirmed_holder`).
pub(in crate::controller) async fn referenced_now(
    ctx: &Context,
    volume_name: &str,
    volume_id: &str,
) -> Result<bool, AuditError> {
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    if volumes
        .get_opt(volume_name)
        .await
        .map_err(AuditError::Pv)?
        .is_some()
    {
        return Ok(true);
    }
    if snapshot_sources(ctx).await?.contains(volume_id) {
        return Ok(true);
    }
    let operations = ctx
        .journal
        .operations_everywhere()
        .await
        .map_err(AuditError::Journal)?;
    Ok(operations.iter().any(|operation| {
        operation.volume_name != volume_name
            && (operation.volume_id.as_deref() == Some(volume_id)
                || holds_name(volume_id, &operation.volume_name))
    }))
}

/// Every volume ListVolumes gives, page after page.
async fn list_volumes(ctx: &Context) -> Result<Vec<ListedVolume>, AuditError> {
    let mut listing = Listing::default();
    let mut token = String::new();
    loop {
        let page = ctx
            .driver
            .csi
            .list_volumes(csi::ListVolumesRequest {
                max_entries: PAGE_SIZE,
                starting_token: token.clone(),
            })
            .await
            .map_err(AuditError::List)?;
        let volumes = page.entries.into_iter().map(|entry| {
            let in_use = entry.status.is_some_and(|status| {
                !status.published_node_ids.is_empty()
                    || status
                        .volume_condition
                        .is_some_and(|condition| condition.abnormal)
            });
            entry.volume.map(|volume| ListedVolume {
                id: volume.volume_id,
                capacity_bytes: volume.capacity_bytes,
                in_use,
            })
        });
        match listing.add_page(volumes, &page.next_token)? {
            Some(next) => token = next,
            None => return Ok(listing.volumes().to_vec()),
        }
    }
}

/// The volume handles the driver's VolumeSnapshotContents were taken from; none if the
/// snapshot API is not served.
async fn snapshot_sources(ctx: &Context) -> Result<HashSet<String>, AuditError> {
    let api: Api<VolumeSnapshotContent> = Api::all(ctx.client.clone());
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(list
            .items
            .into_iter()
            .filter(|content| content.spec.driver == ctx.settings.config.driver_name)
            .filter_map(|content| content.spec.source.volume_handle)
            .collect()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(HashSet::new()),
        Err(error) => Err(AuditError::Contents(error)),
    }
}

/// The handles of the driver's CSI PVs (of every node: a handle another node's PV holds is
/// never reported here) and the in-tree PVs of the plugin migrated to it.
fn volume_references(
    ctx: &Context,
) -> Result<(HashSet<String>, Vec<PersistentVolume>), AuditError> {
    let driver = &ctx.settings.config.driver_name;
    let plugin = InTreePlugin::for_csi_driver(driver);
    let mut handles = HashSet::new();
    let mut in_tree = Vec::new();
    for cached in ctx.volumes.state() {
        let pv = cached
            .to_volume()
            .map_err(|_| AuditError::Volume(cached.name_any()))?;
        match pv.spec.as_ref().and_then(|spec| spec.csi.as_ref()) {
            Some(source) if &source.driver == driver => {
                handles.insert(source.volume_handle.clone());
            }
            Some(_) => {}
            None if plugin.is_some_and(|plugin| plugin.has_source(&pv)) => in_tree.push(pv),
            None => {}
        }
    }
    Ok((handles, in_tree))
}

fn finding_message(finding: &Finding) -> String {
    let volume = &finding.volume;
    let what = match &finding.deletion {
        Deletion::Off => "it is not deleted (--audit-delete-after is not set)".to_owned(),
        Deletion::NotOurName => {
            "it is not deleted: its id holds no volume name of this provisioner, so whose it is cannot be told".to_owned()
        }
        Deletion::InUse => {
            "it is not deleted: the driver says it is published to a node or abnormal".to_owned()
        }
        Deletion::WasReferenced => {
            "it is not deleted: it was referenced while this sidecar watched, so it was let go of on purpose (e.g. the PV of a Retain volume deleted)".to_owned()
        }
        Deletion::ClaimExists { claim_uid } => {
            format!("it is not deleted: claim uid {claim_uid}, whose name it holds, exists")
        }
        Deletion::NotBefore(at) => format!("it is deleted after {at} unless referenced by then"),
        Deletion::Due { .. } => {
            "it is deleted now (recorded in the journal first), unless a PV or an operation of its name appears".to_owned()
        }
    };
    format!(
        "Volume {} ({} bytes) is referenced by no PersistentVolume, VolumeSnapshotContent or operation in flight since {}; {what}",
        volume.id, volume.capacity_bytes, finding.unreferenced_since
    )
}

/// The report's `volumes`: one line per volume, tab-separated, with a header.
fn report_table(findings: &[Finding]) -> String {
    let mut table = String::from("VOLUME ID\tBYTES\tUNREFERENCED SINCE\tDELETION\n");
    for finding in findings.iter().take(MAX_REPORT_ROWS) {
        let deletion = match &finding.deletion {
            Deletion::Off => "off".to_owned(),
            Deletion::NotOurName => "never: not our name".to_owned(),
            Deletion::InUse => "never: in use".to_owned(),
            Deletion::WasReferenced => "never: was referenced".to_owned(),
            Deletion::ClaimExists { claim_uid } => format!("never: claim {claim_uid} exists"),
            Deletion::NotBefore(at) => format!("after {at}"),
            Deletion::Due { volume_name, .. } => format!("due, as {volume_name}"),
        };
        table.push_str(&format!(
            "{}\t{}\t{}\t{deletion}\n",
            finding.volume.id, finding.volume.capacity_bytes, finding.unreferenced_since
        ));
    }
    if findings.len() > MAX_REPORT_ROWS {
        table.push_str(&format!(
            "... and {} more (the gauge counts them all)\n",
            findings.len() - MAX_REPORT_ROWS
        ));
    }
    table
}
