//! The actions more than one reconciler takes: reading a Secret, putting the consistency
//! finalizer on or off a claim, and the driver calls under the call limits. Each has a narrow
//! error type; the reconcilers wrap it into their own and decide what it means for them.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use kube::api::Api;
use kube::{Client, Resource, ResourceExt};
use thiserror::Error;

use kube::runtime::reflector::ObjectRef;
use tracing::warn;

use super::context::Context;
use crate::controller::runtime::events::EventType;
use crate::controller::runtime::finalizers::{add_finalizer, remove_finalizer};
use crate::csi;
use crate::csi_client::CallError;
use crate::provision::{
    PROVISIONING_FINALIZER, SecretError, SecretRef, class_call_rate, secret_data,
};

/// A StorageClass's `provisioner.csi-rs.dev/calls-per-second` cannot be read.
const INVALID_CALL_RATE: &str = "InvalidCallRate";

/// A Secret named by a class or a PV could not be turned into CSI secrets.
#[derive(Debug, Error)]
pub enum SecretReadError {
    #[error("error getting secret {name} in namespace {namespace}: {source}")]
    Get {
        name: String,
        namespace: String,
        source: kube::Error,
    },
    #[error(transparent)]
    Data(#[from] SecretError),
}

#[derive(Debug, Error)]
#[error("failed to update the finalizers of claim {claim}: {source}")]
pub struct ClaimFinalizerError {
    claim: String,
    source: kube::Error,
}

/// The secrets a reference names; no reference, no secrets.
pub async fn read_secret(
    client: &Client,
    reference: Option<&SecretRef>,
) -> Result<HashMap<String, String>, SecretReadError> {
    let Some(SecretRef { name, namespace }) = reference else {
        return Ok(HashMap::new());
    };
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .map_err(|source| SecretReadError::Get {
            name: name.clone(),
            namespace: namespace.clone(),
            source,
        })?;
    Ok(secret_data(&secret)?)
}

/// Adds (`present`) or removes the provisioning-consistency finalizer.
pub async fn set_claim_finalizer(
    client: &Client,
    pvc: &PersistentVolumeClaim,
    present: bool,
) -> Result<(), ClaimFinalizerError> {
    let api: Api<PersistentVolumeClaim> =
        Api::namespaced(client.clone(), &pvc.namespace().unwrap_or_default());
    if present {
        add_finalizer(&api, pvc, PROVISIONING_FINALIZER).await
    } else {
        remove_finalizer(&api, pvc, PROVISIONING_FINALIZER).await
    }
    .map_err(|source| ClaimFinalizerError {
        claim: claim_key(pvc),
        source,
    })
}

/// CreateVolume under the call limits of `class`, if this replica can prove it leads.
pub async fn create_volume(
    ctx: &Context,
    class: &str,
    request: csi::CreateVolumeRequest,
) -> Result<csi::CreateVolumeResponse, CallError> {
    let rate = class_rate(ctx, class);
    let placement_requested = request.accessibility_requirements.is_some();
    let permit = ctx.limits.acquire(class, rate).await;
    ctx.driver.fence.check()?;
    let result = ctx.driver.csi.create_volume(request).await;
    drop(permit);
    if let Err(error) = &result {
        ctx.limits
            .outcome(class, rate, error.signals_overload(placement_requested));
    }
    result
}

/// DeleteVolume under the call limits of `class`, if this replica can prove it leads.
pub async fn delete_volume(
    ctx: &Context,
    class: &str,
    volume_id: &str,
    secrets: HashMap<String, String>,
) -> Result<(), CallError> {
    let rate = class_rate(ctx, class);
    let permit = ctx.limits.acquire(class, rate).await;
    ctx.driver.fence.check()?;
    let result = ctx
        .driver
        .csi
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: volume_id.to_owned(),
            secrets,
        })
        .await
        .map(|_| ());
    drop(permit);
    if let Err(error) = &result {
        ctx.limits
            .outcome(class, rate, error.signals_overload(false));
    }
    result
}

/// The calls per second `class` sets for itself (`provision::class_call_rate`); a class that
/// is gone has none, and an unreadable value is a Warning event on the class and no limit
/// (the calls go on as before the annotation was set).
fn class_rate(ctx: &Context, class: &str) -> Option<f64> {
    let class = ctx.classes.get(&ObjectRef::new(class))?;
    class_call_rate(&class).unwrap_or_else(|error| {
        warn!(%error, "the class's call rate is ignored");
        ctx.events.publish(
            &class.object_ref(&()),
            EventType::Warning,
            INVALID_CALL_RATE,
            &error.to_string(),
        );
        None
    })
}

/// `<namespace>/<name>`, as claims are named in logs and messages.
pub fn claim_key(pvc: &PersistentVolumeClaim) -> String {
    format!("{}/{}", pvc.namespace().unwrap_or_default(), pvc.name_any())
}
