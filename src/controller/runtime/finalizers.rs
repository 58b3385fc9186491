//! Adds and removes this sidecar's finalizers on PVs and PVCs (the decisions are in
//! `provision::finalizers`). A missing object is not an error: nothing is left to hold.

use std::fmt::Debug;

use kube::api::{Api, Patch, PatchParams};
use kube::core::Request;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::kube_client::protobuf;
use crate::provision::{finalizer_addition_patch, finalizer_removal_patch};

/// Patches `name` with `patch`; the patched object is not needed, so its answer is not read
/// (`protobuf::write_unread`).
async fn patch_unread<K: Resource + Clone, P: Serialize + Debug>(
    api: &Api<K>,
    name: &str,
    patch: &Patch<P>,
) -> kube::Result<()> {
    let request = Request::new(api.resource_url())
        .patch(name, &PatchParams::default(), patch)
        .map_err(kube::Error::BuildRequest)?;
    protobuf::write_unread(&api.clone().into_client(), request).await
}

/// How many times a removal re-reads the object after another writer moved its finalizers.
const REMOVAL_ATTEMPTS: usize = 5;

pub(in crate::controller) async fn add_finalizer<K>(
    api: &Api<K>,
    object: &K,
    finalizer: &str,
) -> kube::Result<()>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let Some(patch) = finalizer_addition_patch(object.meta(), finalizer) else {
        return Ok(());
    };
    ignore_not_found(patch_unread(api, &object.name_any(), &Patch::Merge(&patch)).await)
}

/// Removes `finalizer` from `object`, re-reading it when the protection controllers changed
/// the finalizer list in between. Stops quietly once the object is gone or was replaced by
/// another of the same name.
pub(in crate::controller) async fn remove_finalizer<K>(
    api: &Api<K>,
    object: &K,
    finalizer: &str,
) -> kube::Result<()>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let name = object.name_any();
    let mut current = object.clone();
    let mut attempt = 1;
    loop {
        if current.uid() != object.uid() {
            return Ok(());
        }
        let Some(patch) = finalizer_removal_patch(current.meta(), finalizer) else {
            return Ok(());
        };
        match patch_unread(api, &name, &Patch::<()>::Json(patch)).await {
            Ok(()) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
            // A failed `test` operation: the list moved under us.
            Err(kube::Error::Api(status))
                if (status.code == 422 || status.code == 409) && attempt < REMOVAL_ATTEMPTS =>
            {
                attempt += 1;
                match api.get_opt(&name).await? {
                    Some(fresh) => current = fresh,
                    None => return Ok(()),
                }
            }
            Err(error) => return Err(error),
        }
    }
}

/// Removes `finalizer` from `object` as it was read, once: a list changed since (422 from the
/// patch's `test`) is an error, for a caller whose decision rests on that very read.
pub(in crate::controller) async fn remove_finalizer_once<K>(
    api: &Api<K>,
    object: &K,
    finalizer: &str,
) -> kube::Result<()>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let Some(patch) = finalizer_removal_patch(object.meta(), finalizer) else {
        return Ok(());
    };
    ignore_not_found(patch_unread(api, &object.name_any(), &Patch::<()>::Json(patch)).await)
}

fn ignore_not_found<T>(result: kube::Result<T>) -> kube::Result<()> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(error),
    }
}
