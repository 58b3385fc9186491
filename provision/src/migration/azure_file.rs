//! Azure File (`kubernetes.io/azure-file` → `file.csi.azure.com`). Handles are
//! `<resource group>#<account>#<share>#<pv name>#<secret namespace>`. The class is not
//! translated.

use k8s_openapi::api::core::v1::{
    AzureFilePersistentVolumeSource, CSIPersistentVolumeSource, PersistentVolume,
};

use super::MigrationError;

const RESOURCE_GROUP_ANNOTATION: &str = "kubernetes.io/azure-file-resource-group";
const SECRET_PREFIX: &str = "azure-storage-account-";
const SECRET_SUFFIX: &str = "-secret";
const DEFAULT_SECRET_NAMESPACE: &str = "default";

/// Share and secret from the attributes, the node-stage secret reference, else the handle
/// (secret `azure-storage-account-<account>-secret`); the resource group as annotation.
pub fn to_in_tree(
    mut pv: PersistentVolume,
    csi: CSIPersistentVolumeSource,
) -> Result<PersistentVolume, MigrationError> {
    let mut source = AzureFilePersistentVolumeSource {
        read_only: csi.read_only,
        ..AzureFilePersistentVolumeSource::default()
    };
    for (key, value) in csi.volume_attributes.iter().flatten() {
        match key.to_ascii_lowercase().as_str() {
            "sharename" => source.share_name.clone_from(value),
            "secretname" => source.secret_name.clone_from(value),
            "secretnamespace" => source.secret_namespace = Some(value.clone()),
            _ => {}
        }
    }
    if let Some(stage) = csi.node_stage_secret_ref.as_ref()
        && stage.name.as_deref().is_some_and(|name| !name.is_empty())
    {
        source.secret_name = stage.name.clone().unwrap_or_default();
        source.secret_namespace = Some(stage.namespace.clone().unwrap_or_default());
    }
    let mut resource_group = String::new();
    if source.share_name.is_empty() || source.secret_name.is_empty() {
        let parts: Vec<&str> = csi.volume_handle.split('#').collect();
        let [group, account, share, ..] = parts.as_slice() else {
            return Err(MigrationError::AzureFileHandle(csi.volume_handle.clone()));
        };
        if source.share_name.is_empty() {
            (*share).clone_into(&mut source.share_name);
        }
        if source.secret_name.is_empty() {
            source.secret_name = format!("{SECRET_PREFIX}{account}{SECRET_SUFFIX}");
        }
        (*group).clone_into(&mut resource_group);
    }
    source
        .secret_namespace
        .get_or_insert_with(|| DEFAULT_SECRET_NAMESPACE.to_owned());
    if !resource_group.is_empty() {
        pv.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(RESOURCE_GROUP_ANNOTATION.to_owned(), resource_group);
    }
    if let Some(spec) = pv.spec.as_mut() {
        spec.csi = None;
        spec.azure_file = Some(source);
    }
    Ok(pv)
}

/// The handle of an in-tree PV; the account is the secret name's
/// `azure-storage-account-<account>-secret` part, or the secret name itself.
pub fn csi_handle(pv: &PersistentVolume) -> Result<String, MigrationError> {
    let spec = pv.spec.as_ref();
    let source = spec
        .and_then(|spec| spec.azure_file.as_ref())
        .ok_or(MigrationError::NoInTreeSource("azureFile"))?;
    let account = storage_account(&source.secret_name).unwrap_or(&source.secret_name);
    let resource_group = resource_group(pv);
    let namespace = source
        .secret_namespace
        .clone()
        .or_else(|| spec?.claim_ref.as_ref()?.namespace.clone())
        .unwrap_or_default();
    if namespace.is_empty() {
        return Err(MigrationError::AzureFileNamespace);
    }
    let pv_name = pv.metadata.name.as_deref().unwrap_or_default();
    Ok(format!(
        "{resource_group}#{account}#{}#{pv_name}#{namespace}",
        source.share_name
    ))
}

/// `<account>` of the first `azure-storage-account-<account>-secret` in `secret` (the account
/// runs to the last `-secret`).
/// What an azureFile PV determines of its volume's handle: `resource group#account#share`.
/// A secret name that names no account determines none (`csi_handle` then uses the secret
/// name, which need not be the account).
pub fn handle_prefix(pv: &PersistentVolume) -> Result<String, MigrationError> {
    let source = pv
        .spec
        .as_ref()
        .and_then(|spec| spec.azure_file.as_ref())
        .ok_or(MigrationError::NoInTreeSource("azureFile"))?;
    let account = storage_account(&source.secret_name).ok_or(MigrationError::AzureFileAccount)?;
    Ok(format!(
        "{}#{account}#{}",
        resource_group(pv),
        source.share_name
    ))
}

/// Whether the driver's `handle` may be the volume of `prefix` ([`handle_prefix`]): an absent
/// resource group is any; Azure names are case-insensitive; the driver's further parts are
/// its own.
pub fn same_handle(prefix: &str, handle: &str) -> bool {
    let (ours, theirs): (Vec<&str>, Vec<&str>) =
        (prefix.split('#').collect(), handle.split('#').collect());
    let (Some([group, account, share]), Some([their_group, their_account, their_share])) =
        (ours.get(..3), theirs.get(..3))
    else {
        return false;
    };
    (group.is_empty() || group.eq_ignore_ascii_case(their_group))
        && account.eq_ignore_ascii_case(their_account)
        && share.eq_ignore_ascii_case(their_share)
}

/// For a PV whose account is unknown (its secret names none): whether the parts it does
/// determine, the share and the resource group if annotated, match the driver's `handle`.
pub fn may_hold(pv: &PersistentVolume, share: &str, handle: &str) -> bool {
    let parts: Vec<&str> = handle.split('#').collect();
    let (Some(their_group), Some(their_share)) = (parts.first(), parts.get(2)) else {
        return false;
    };
    let group = resource_group(pv);
    (group.is_empty() || group.eq_ignore_ascii_case(their_group))
        && share.eq_ignore_ascii_case(their_share)
}

fn resource_group(pv: &PersistentVolume) -> &str {
    pv.metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(RESOURCE_GROUP_ANNOTATION))
        .map_or("", String::as_str)
}

fn storage_account(secret: &str) -> Option<&str> {
    let start = secret.find(SECRET_PREFIX)? + SECRET_PREFIX.len();
    let rest = &secret[start..];
    let end = rest.rfind(SECRET_SUFFIX)?;
    (end > 0).then(|| &rest[..end])
}
