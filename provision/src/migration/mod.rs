//! In-tree migration: the seven in-tree volume plugins whose CSI driver Kubernetes 1.36
//! migrates to, and the translations between their objects and CSI's, with the facts of
//! k8s.io/csi-translation-lib v0.36 (key names, handle formats, error texts), written anew.
//!
//! Three translations, all pure:
//! - [`InTreePlugin::translate_class`]: an in-tree StorageClass as its CSI driver reads it
//!   (parameters, allowedTopologies), used to provision a migrated claim;
//! - [`InTreePlugin::to_in_tree`]: the CSI PV built for a migrated claim, back to the in-tree
//!   source kube-controller-manager and the nodes expect;
//! - [`InTreePlugin::csi_handle`]: the CSI volume handle of an in-tree PV, for DeleteVolume.
//!
//! One file per plugin; `topology` holds what the zonal plugins share.

mod aws_ebs;
mod azure_disk;
mod azure_file;
mod cinder;
mod gce_pd;
mod portworx;
mod topology;
mod vsphere;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use thiserror::Error;

/// The StorageClass parameter that carries the file system type for CSI drivers.
const CSI_FSTYPE_KEY: &str = "csi.storage.k8s.io/fstype";
/// The in-tree parameter of the file system type (compared case-insensitively).
const FSTYPE_KEY: &str = "fstype";

/// Why a translation failed. The texts are csi-translation-lib's where it has one.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MigrationError {
    #[error("cannot simultaneously set allowed topologies and zone/zones parameters")]
    ZonesWithAllowedTopologies,
    #[error("the PV has no CSI source")]
    NoCsiSource,
    #[error("the PV has no {0} source")]
    NoInTreeSource(&'static str),
    #[error("failed to get id components.Got: {got}, wanted {wanted} components or more. ")]
    HandleComponents { got: usize, wanted: usize },
    #[error("Failed to convert partition {0} to integer")]
    Partition(String),
    #[error("failed to get region from zones: {0}")]
    Region(String),
    #[error("failed to translate topology: {0}")]
    Topology(String),
    #[error("Invalid format for AWS volume ({0})")]
    AwsVolumeId(String),
    #[error("could not get disk name from {0}")]
    AzureDiskUri(String),
    #[error("kind({0}) is not supported in csi migration")]
    AzureDiskKind(String),
    #[error("error parsing volume id: {0:?}, should at least contain two #")]
    AzureFileHandle(String),
    #[error("the azureFile secret name names no storage account")]
    AzureFileAccount,
    #[error("could not find a secret namespace in PersistentVolumeSource or ClaimRef")]
    AzureFileNamespace,
}

/// An in-tree plugin Kubernetes migrates to a CSI driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InTreePlugin {
    GcePd,
    AwsEbs,
    AzureDisk,
    AzureFile,
    Cinder,
    VSphere,
    Portworx,
}

const PLUGINS: [InTreePlugin; 7] = [
    InTreePlugin::GcePd,
    InTreePlugin::AwsEbs,
    InTreePlugin::AzureDisk,
    InTreePlugin::AzureFile,
    InTreePlugin::Cinder,
    InTreePlugin::VSphere,
    InTreePlugin::Portworx,
];

impl InTreePlugin {
    /// The in-tree plugin migrated to the CSI driver `driver`, if any.
    pub fn for_csi_driver(driver: &str) -> Option<Self> {
        PLUGINS
            .into_iter()
            .find(|plugin| plugin.csi_driver() == driver)
    }

    /// The in-tree provisioner name, as in a StorageClass's `provisioner`.
    pub const fn in_tree_name(self) -> &'static str {
        match self {
            Self::GcePd => "kubernetes.io/gce-pd",
            Self::AwsEbs => "kubernetes.io/aws-ebs",
            Self::AzureDisk => "kubernetes.io/azure-disk",
            Self::AzureFile => "kubernetes.io/azure-file",
            Self::Cinder => "kubernetes.io/cinder",
            Self::VSphere => "kubernetes.io/vsphere-volume",
            Self::Portworx => "kubernetes.io/portworx-volume",
        }
    }

    /// The CSI driver the plugin is migrated to.
    pub const fn csi_driver(self) -> &'static str {
        match self {
            Self::GcePd => "pd.csi.storage.gke.io",
            Self::AwsEbs => "ebs.csi.aws.com",
            Self::AzureDisk => "disk.csi.azure.com",
            Self::AzureFile => "file.csi.azure.com",
            Self::Cinder => "cinder.csi.openstack.org",
            Self::VSphere => "csi.vsphere.vmware.com",
            Self::Portworx => "pxd.portworx.com",
        }
    }

    /// The class as the CSI driver reads it: parameters and allowedTopologies translated as
    /// the translation library does. `provisioner` becomes the CSI driver for every plugin
    /// (the library does so only for Portworx): a clone or restore into a migrated class
    /// compares its source's driver with it (upstream's quirk A15, fixed).
    pub fn translate_class(self, class: &StorageClass) -> Result<StorageClass, MigrationError> {
        let mut translated = match self {
            Self::GcePd => gce_pd::translate_class(class),
            Self::AwsEbs => aws_ebs::translate_class(class),
            Self::AzureDisk => azure_disk::translate_class(class),
            Self::AzureFile => Ok(class.clone()),
            Self::Cinder => cinder::translate_class(class),
            Self::VSphere => vsphere::translate_class(class),
            Self::Portworx => Ok(portworx::translate_class(class)),
        }?;
        self.csi_driver().clone_into(&mut translated.provisioner);
        Ok(translated)
    }

    /// The CSI PV of a migrated claim with its CSI source replaced by the plugin's in-tree
    /// source, and its topology by the Kubernetes zone (and region) keys and labels where the
    /// plugin has them. What the in-tree source cannot hold (volume attributes, secret
    /// references) is lost, as upstream.
    pub fn to_in_tree(self, pv: PersistentVolume) -> Result<PersistentVolume, MigrationError> {
        let csi = pv
            .spec
            .as_ref()
            .and_then(|spec| spec.csi.clone())
            .ok_or(MigrationError::NoCsiSource)?;
        match self {
            Self::GcePd => gce_pd::to_in_tree(pv, csi),
            Self::AwsEbs => aws_ebs::to_in_tree(pv, csi),
            Self::AzureDisk => azure_disk::to_in_tree(pv, csi),
            Self::AzureFile => azure_file::to_in_tree(pv, csi),
            Self::Cinder => Ok(cinder::to_in_tree(pv, csi)),
            Self::VSphere => Ok(vsphere::to_in_tree(pv, csi)),
            Self::Portworx => Ok(portworx::to_in_tree(pv, csi)),
        }
    }

    /// Whether the PV has this plugin's in-tree source.
    pub fn has_source(self, pv: &PersistentVolume) -> bool {
        let Some(spec) = pv.spec.as_ref() else {
            return false;
        };
        match self {
            Self::GcePd => spec.gce_persistent_disk.is_some(),
            Self::AwsEbs => spec.aws_elastic_block_store.is_some(),
            Self::AzureDisk => spec.azure_disk.is_some(),
            Self::AzureFile => spec.azure_file.is_some(),
            Self::Cinder => spec.cinder.is_some(),
            Self::VSphere => spec.vsphere_volume.is_some(),
            Self::Portworx => spec.portworx_volume.is_some(),
        }
    }

    /// The CSI volume handle of a PV with this plugin's in-tree source (for DeleteVolume).
    pub fn csi_handle(self, pv: &PersistentVolume) -> Result<String, MigrationError> {
        let spec = pv.spec.as_ref();
        let missing = MigrationError::NoInTreeSource(self.source_field());
        match self {
            Self::GcePd => gce_pd::csi_handle(pv),
            Self::AwsEbs => spec
                .and_then(|spec| spec.aws_elastic_block_store.as_ref())
                .ok_or(missing)
                .and_then(|source| aws_ebs::ebs_volume_id(&source.volume_id)),
            Self::AzureDisk => azure_disk::csi_handle(pv),
            Self::AzureFile => azure_file::csi_handle(pv),
            Self::Cinder => spec
                .and_then(|spec| spec.cinder.as_ref())
                .map(|source| source.volume_id.clone())
                .ok_or(missing),
            Self::VSphere => spec
                .and_then(|spec| spec.vsphere_volume.as_ref())
                .map(|source| source.volume_path.clone())
                .ok_or(missing),
            Self::Portworx => spec
                .and_then(|spec| spec.portworx_volume.as_ref())
                .map(|source| source.volume_id.clone())
                .ok_or(missing),
        }
    }

    /// Whether the PV, with this plugin's in-tree source, references the CSI volume `handle`:
    /// the PV's source is translated forward to the handle it stands for ([`Self::csi_handle`])
    /// and compared with `handle`. `Unknown` when the source cannot be translated: it guards
    /// deletions and their records, where a wrong "no" destroys data and a wrong "yes" leaks.
    pub fn holds(self, pv: &PersistentVolume, handle: &str) -> Holding {
        if !self.has_source(pv) {
            return Holding::DoesNotHold;
        }
        let produced = match self {
            Self::AzureFile => azure_file::handle_prefix(pv),
            _ => self.csi_handle(pv),
        };
        match produced {
            Ok(produced) if self.same_handle(&produced, handle) => Holding::Holds,
            Ok(_) => Holding::DoesNotHold,
            // What the source does determine is compared first: one PV that cannot be fully
            // translated must not hold up every other volume of the driver.
            Err(_) if !self.may_hold(pv, handle) => Holding::DoesNotHold,
            Err(error) => Holding::Unknown(error),
        }
    }

    /// For a source that cannot be translated to a handle: whether the parts of it that are
    /// known still match `handle` (so the PV may reference it). `false` only when a part the
    /// source does determine differs: the disk or share name, or the whole id.
    fn may_hold(self, pv: &PersistentVolume, handle: &str) -> bool {
        let Some(spec) = pv.spec.as_ref() else {
            return false;
        };
        // The last `/`-separated part of a path-like id (a disk's name in its URI or handle).
        let last = |id: &str| id.rsplit('/').next().unwrap_or_default().to_owned();
        match self {
            Self::GcePd => spec
                .gce_persistent_disk
                .as_ref()
                .is_some_and(|source| source.pd_name == last(handle)),
            Self::AwsEbs => spec
                .aws_elastic_block_store
                .as_ref()
                .is_some_and(|source| last(&source.volume_id) == last(handle)),
            Self::AzureDisk => spec
                .azure_disk
                .as_ref()
                .is_some_and(|source| last(&source.disk_uri).eq_ignore_ascii_case(&last(handle))),
            Self::AzureFile => spec
                .azure_file
                .as_ref()
                .is_some_and(|source| azure_file::may_hold(pv, &source.share_name, handle)),
            // Their sources always translate.
            Self::Cinder | Self::VSphere | Self::Portworx => true,
        }
    }

    /// Whether the driver's `handle` may be the one `produced` from an in-tree source stands
    /// for. Only what the in-tree source determines is compared.
    fn same_handle(self, produced: &str, handle: &str) -> bool {
        match self {
            Self::GcePd => gce_pd::same_handle(produced, handle),
            // Azure resource ids are case-insensitive.
            Self::AzureDisk => produced.eq_ignore_ascii_case(handle),
            Self::AzureFile => azure_file::same_handle(produced, handle),
            Self::AwsEbs | Self::Cinder | Self::VSphere | Self::Portworx => produced == handle,
        }
    }

    /// The PV spec field of the plugin's in-tree source, for messages.
    const fn source_field(self) -> &'static str {
        match self {
            Self::GcePd => "gcePersistentDisk",
            Self::AwsEbs => "awsElasticBlockStore",
            Self::AzureDisk => "azureDisk",
            Self::AzureFile => "azureFile",
            Self::Cinder => "cinder",
            Self::VSphere => "vsphereVolume",
            Self::Portworx => "portworxVolume",
        }
    }
}

/// Whether a PV references a CSI volume. A PV that cannot be told about is never taken for
/// one that does not (its volume may be deleted) nor for one that does (the volume's record
/// may be dropped, leaking it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holding {
    Holds,
    DoesNotHold,
    Unknown(MigrationError),
}

/// Whether two PVs hold the same in-tree volume (the same plugin's source naming one volume).
pub fn same_in_tree_volume(a: &PersistentVolume, b: &PersistentVolume) -> bool {
    PLUGINS.into_iter().any(|plugin| {
        plugin.has_source(a)
            && plugin.has_source(b)
            && volume_identity(plugin, a).is_some_and(|a| volume_identity(plugin, b) == Some(a))
    })
}

/// What names the backend volume in a PV's in-tree source.
fn volume_identity(plugin: InTreePlugin, pv: &PersistentVolume) -> Option<String> {
    let spec = pv.spec.as_ref()?;
    match plugin {
        InTreePlugin::GcePd => Some(spec.gce_persistent_disk.as_ref()?.pd_name.clone()),
        InTreePlugin::AwsEbs => {
            aws_ebs::ebs_volume_id(&spec.aws_elastic_block_store.as_ref()?.volume_id).ok()
        }
        InTreePlugin::AzureDisk => Some(spec.azure_disk.as_ref()?.disk_uri.clone()),
        InTreePlugin::AzureFile => Some(spec.azure_file.as_ref()?.share_name.clone()),
        InTreePlugin::Cinder => Some(spec.cinder.as_ref()?.volume_id.clone()),
        InTreePlugin::VSphere => Some(spec.vsphere_volume.as_ref()?.volume_path.clone()),
        InTreePlugin::Portworx => Some(spec.portworx_volume.as_ref()?.volume_id.clone()),
    }
}

/// Inserts a class parameter, with the in-tree `fstype` key (any case) renamed to CSI's.
fn insert_renamed(parameters: &mut BTreeMap<String, String>, key: &str, value: &str) {
    let key = if key.eq_ignore_ascii_case(FSTYPE_KEY) {
        CSI_FSTYPE_KEY
    } else {
        key
    };
    parameters.insert(key.to_owned(), value.to_owned());
}

/// The partition of a CSI PV's `partition` attribute: absent or empty is none.
fn partition(attributes: Option<&BTreeMap<String, String>>) -> Result<Option<i32>, MigrationError> {
    match attributes.and_then(|attributes| attributes.get("partition")) {
        None => Ok(None),
        Some(value) if value.is_empty() => Ok(None),
        Some(value) => value
            .parse()
            .map(Some)
            .map_err(|_| MigrationError::Partition(value.clone())),
    }
}

#[cfg(test)]
mod tests;
