//! A claim's VolumeAttributesClass at provisioning, by upstream's rules: which class counts
//! (only with the gate on), and what the class gives CreateVolume (`mutable_parameters`).
//! Modifying a volume later (ControllerModifyVolume) is the resizer's job, not ours.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::VolumeAttributesClass;
use thiserror::Error;

use super::settings::ProvisionerConfig;

/// The claim's class cannot be used for this driver; nothing was sent to it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AttributesClassError {
    #[error(
        "VAC {class} referenced in PVC is for driver {driver} which does not match driver name {ours}"
    )]
    OtherDriver {
        class: String,
        driver: String,
        ours: String,
    },
}

/// The VolumeAttributesClass the claim names, non-empty; `None` without one.
fn named_class(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.spec
        .as_ref()?
        .volume_attributes_class_name
        .as_deref()
        .filter(|name| !name.is_empty())
}

/// The class that decides the claim's `mutable_parameters` and its PV's
/// `volumeAttributesClassName`: the one it names, with the VolumeAttributesClass gate on.
pub fn requested_attributes_class<'a>(
    pvc: &'a PersistentVolumeClaim,
    config: &ProvisionerConfig,
) -> Option<&'a str> {
    named_class(pvc).filter(|_| config.volume_attributes_classes)
}

/// The class a claim names although the gate is off: upstream ignores it, so the PV lacks it
/// and kube-controller-manager never binds the claim to that PV (A7). The executor says so
/// on the claim.
pub fn ignored_attributes_class<'a>(
    pvc: &'a PersistentVolumeClaim,
    config: &ProvisionerConfig,
) -> Option<&'a str> {
    named_class(pvc).filter(|_| !config.volume_attributes_classes)
}

/// What the claim is told when its PV names another VolumeAttributesClass than the claim does
/// now: the claim's class changed (or the gate was switched) after its CreateVolume was
/// recorded, so the volume has the recorded class's parameters and its PV says so. `None`
/// when they agree.
pub fn recorded_class_moved(
    claim_class: Option<&str>,
    recorded_class: Option<&str>,
    volume_name: &str,
) -> Option<String> {
    if claim_class == recorded_class {
        return None;
    }
    let named = |class: Option<&str>| class.map_or("no class".to_owned(), |c| format!("\"{c}\""));
    Some(format!(
        "volume {volume_name} was created with VolumeAttributesClass {} before the claim named {}, so its PersistentVolume names {}; kube-controller-manager binds the claim to it once the claim names that class again, and the class can then be changed as for any bound claim",
        named(recorded_class),
        named(claim_class),
        named(recorded_class),
    ))
}

/// The CreateVolume `mutable_parameters` of the class `name` the claim names: the class's
/// parameters verbatim (no prefix is stripped, nothing is templated), if the class is for
/// `driver_name`.
pub fn mutable_parameters(
    name: &str,
    class: &VolumeAttributesClass,
    driver_name: &str,
) -> Result<HashMap<String, String>, AttributesClassError> {
    if class.driver_name != driver_name {
        return Err(AttributesClassError::OtherDriver {
            class: name.to_owned(),
            driver: class.driver_name.clone(),
            ours: driver_name.to_owned(),
        });
    }
    Ok(class
        .parameters
        .iter()
        .flatten()
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::fixtures::{DRIVER, PvcBuilder, config};

    fn class(driver: &str, parameters: &[(&str, &str)]) -> VolumeAttributesClass {
        VolumeAttributesClass {
            driver_name: driver.to_owned(),
            parameters: (!parameters.is_empty()).then(|| {
                parameters
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect::<BTreeMap<_, _>>()
            }),
            ..VolumeAttributesClass::default()
        }
    }

    fn gate(on: bool) -> ProvisionerConfig {
        ProvisionerConfig {
            volume_attributes_classes: on,
            ..config()
        }
    }

    #[test]
    fn the_claim_is_told_only_when_the_recorded_class_differs() {
        assert_eq!(
            recorded_class_moved(Some("gold"), Some("gold"), "pvc-1"),
            None
        );
        assert_eq!(recorded_class_moved(None, None, "pvc-1"), None);
        assert_eq!(
            recorded_class_moved(Some("silver"), Some("gold"), "pvc-1").as_deref(),
            Some(
                "volume pvc-1 was created with VolumeAttributesClass \"gold\" before the claim named \"silver\", so its PersistentVolume names \"gold\"; kube-controller-manager binds the claim to it once the claim names that class again, and the class can then be changed as for any bound claim"
            )
        );
        let message = recorded_class_moved(Some("gold"), None, "pvc-1").unwrap_or_default();
        assert!(
            message.contains("with VolumeAttributesClass no class before the claim named \"gold\""),
            "{message}"
        );
    }

    #[test]
    fn a_named_class_counts_only_with_the_gate_on() {
        let pvc = PvcBuilder::new().attributes_class("gold").build();
        assert_eq!(requested_attributes_class(&pvc, &gate(true)), Some("gold"));
        assert_eq!(ignored_attributes_class(&pvc, &gate(true)), None);
        assert_eq!(requested_attributes_class(&pvc, &gate(false)), None);
        assert_eq!(ignored_attributes_class(&pvc, &gate(false)), Some("gold"));
    }

    #[test]
    fn an_empty_or_absent_name_is_no_class() {
        for pvc in [
            PvcBuilder::new().attributes_class("").build(),
            PvcBuilder::new().build(),
        ] {
            for on in [true, false] {
                assert_eq!(requested_attributes_class(&pvc, &gate(on)), None);
                assert_eq!(ignored_attributes_class(&pvc, &gate(on)), None);
            }
        }
    }

    #[test]
    fn the_class_parameters_are_passed_verbatim() {
        let parameters = [
            ("iops", "3000"),
            ("csi.storage.k8s.io/fstype", "xfs"),
            ("throughput", "${pvc.name}"),
        ];
        let expected: HashMap<_, _> = parameters
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        assert_eq!(
            mutable_parameters("gold", &class(DRIVER, &parameters), DRIVER),
            Ok(expected)
        );
        assert_eq!(
            mutable_parameters("gold", &class(DRIVER, &[]), DRIVER),
            Ok(HashMap::new())
        );
    }

    #[test]
    fn a_class_of_another_driver_is_refused_with_upstreams_text() {
        let error = mutable_parameters("gold", &class("other.csi.k8s.io", &[]), DRIVER)
            .expect_err("another driver's class");
        assert_eq!(
            error.to_string(),
            format!(
                "VAC gold referenced in PVC is for driver other.csi.k8s.io which does not match driver name {DRIVER}"
            )
        );
    }
}
