//! CreateVolume `parameters`: the class parameters without the sidecar's own
//! `csi.storage.k8s.io/` keys, plus the optional claim metadata.

use std::collections::{BTreeMap, HashMap};

use thiserror::Error;

use super::capabilities::{FSTYPE_KEY, LEGACY_FSTYPE_KEY};
use super::secrets::{deprecated_secret_keys, reserved_secret_keys};

/// Keys under this prefix are the sidecar's, not the driver's.
const RESERVED_PREFIX: &str = "csi.storage.k8s.io/";
const PVC_NAME_KEY: &str = "csi.storage.k8s.io/pvc/name";
const PVC_NAMESPACE_KEY: &str = "csi.storage.k8s.io/pvc/namespace";
const PV_NAME_KEY: &str = "csi.storage.k8s.io/pv/name";

/// A class parameter the sidecar cannot pass on.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ParameterError {
    #[error(
        "failed to strip CSI Parameters of prefixed keys: found unknown parameter key {0:?} with reserved namespace csi.storage.k8s.io/"
    )]
    UnknownReservedKey(String),
}

/// What `--extra-create-metadata` adds.
#[derive(Debug, Clone, Copy)]
pub struct ExtraCreateMetadata<'a> {
    pub pvc_name: &'a str,
    pub pvc_namespace: &'a str,
    pub pv_name: &'a str,
}

/// The class parameters without the known reserved keys (fstype and all secret keys). Any
/// other reserved key is an error (the first in key order is reported). Deprecated keys such as
/// `fstype` or `csiProvisionerSecretName` are passed on as upstream does. `extra`
/// is added afterwards, so it cannot be stripped or overridden by the class.
pub fn create_volume_parameters(
    class_parameters: &BTreeMap<String, String>,
    extra: Option<&ExtraCreateMetadata<'_>>,
) -> Result<HashMap<String, String>, ParameterError> {
    let mut parameters = HashMap::with_capacity(class_parameters.len() + 3);
    for (key, value) in class_parameters {
        if key.starts_with(RESERVED_PREFIX) {
            let known = key == FSTYPE_KEY || reserved_secret_keys().any(|k| k == key);
            if !known {
                return Err(ParameterError::UnknownReservedKey(key.clone()));
            }
            continue;
        }
        parameters.insert(key.clone(), value.clone());
    }
    if let Some(extra) = extra {
        parameters.insert(PVC_NAME_KEY.to_owned(), extra.pvc_name.to_owned());
        parameters.insert(PVC_NAMESPACE_KEY.to_owned(), extra.pvc_namespace.to_owned());
        parameters.insert(PV_NAME_KEY.to_owned(), extra.pv_name.to_owned());
    }
    Ok(parameters)
}

/// Class parameter keys that still work but are deprecated: `fstype` in any letter case and
/// the `csi*SecretName`/`csi*SecretNamespace` keys. Upstream logs a warning for each.
pub fn deprecated_parameter_keys(class_parameters: &BTreeMap<String, String>) -> Vec<String> {
    class_parameters
        .keys()
        .filter(|key| {
            key.eq_ignore_ascii_case(LEGACY_FSTYPE_KEY)
                || deprecated_secret_keys().any(|d| d == *key)
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(list: &[(&str, &str)]) -> BTreeMap<String, String> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn map(list: &[(&str, &str)]) -> HashMap<String, String> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn driver_parameters_pass_through_and_known_reserved_keys_are_stripped() {
        let class = params(&[
            ("type", "ssd"),
            ("csi.storage.k8s.io/fstype", "xfs"),
            ("csi.storage.k8s.io/provisioner-secret-name", "s"),
            ("csi.storage.k8s.io/provisioner-secret-namespace", "ns"),
            ("csi.storage.k8s.io/secret-name", "s"),
            (
                "csi.storage.k8s.io/controller-modify-secret-namespace",
                "ns",
            ),
            ("csi.storage.k8s.io/node-expand-secret-name", "s"),
        ]);
        assert_eq!(
            create_volume_parameters(&class, None),
            Ok(map(&[("type", "ssd")]))
        );
    }

    #[test]
    fn deprecated_keys_are_forwarded_to_the_driver() {
        let class = params(&[
            ("fstype", "ext4"),
            ("csiProvisionerSecretName", "s"),
            ("csiNodeStageSecretNamespace", "ns"),
        ]);
        assert_eq!(
            create_volume_parameters(&class, None),
            Ok(map(&[
                ("fstype", "ext4"),
                ("csiProvisionerSecretName", "s"),
                ("csiNodeStageSecretNamespace", "ns"),
            ]))
        );
    }

    #[test]
    fn unknown_reserved_key_is_rejected_with_upstreams_text() {
        let class = params(&[
            ("csi.storage.k8s.io/zone", "a"),
            ("csi.storage.k8s.io/foo", "b"),
        ]);
        assert_eq!(
            create_volume_parameters(&class, None).map_err(|e| e.to_string()),
            Err("failed to strip CSI Parameters of prefixed keys: found unknown parameter key \"csi.storage.k8s.io/foo\" with reserved namespace csi.storage.k8s.io/".to_owned())
        );
    }

    #[test]
    fn class_cannot_set_the_extra_metadata_keys_itself() {
        let class = params(&[("csi.storage.k8s.io/pvc/name", "spoofed")]);
        assert_eq!(
            create_volume_parameters(&class, None).map_err(|e| e.to_string()),
            Err("failed to strip CSI Parameters of prefixed keys: found unknown parameter key \"csi.storage.k8s.io/pvc/name\" with reserved namespace csi.storage.k8s.io/".to_owned())
        );
    }

    #[test]
    fn extra_create_metadata_is_added_after_stripping() {
        let class = params(&[("type", "ssd"), ("csi.storage.k8s.io/fstype", "xfs")]);
        let extra = ExtraCreateMetadata {
            pvc_name: "data",
            pvc_namespace: "apps",
            pv_name: "pvc-1",
        };
        assert_eq!(
            create_volume_parameters(&class, Some(&extra)),
            Ok(map(&[
                ("type", "ssd"),
                ("csi.storage.k8s.io/pvc/name", "data"),
                ("csi.storage.k8s.io/pvc/namespace", "apps"),
                ("csi.storage.k8s.io/pv/name", "pvc-1"),
            ]))
        );
    }

    #[test]
    fn deprecated_keys_are_listed_for_a_warning() {
        let class = params(&[
            ("FSType", "ext4"),
            ("csiNodePublishSecretName", "s"),
            ("csi.storage.k8s.io/fstype", "xfs"),
            ("type", "ssd"),
        ]);
        assert_eq!(
            deprecated_parameter_keys(&class),
            ["FSType", "csiNodePublishSecretName"]
        );
    }

    #[test]
    fn prefix_match_is_case_sensitive_like_upstream() {
        let class = params(&[("CSI.storage.k8s.io/foo", "x")]);
        assert_eq!(
            create_volume_parameters(&class, None),
            Ok(map(&[("CSI.storage.k8s.io/foo", "x")]))
        );
    }
}
