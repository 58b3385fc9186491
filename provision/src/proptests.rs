//! Property tests of the decision layer (issue 15): arbitrary claims, classes, settings, driver
//! answers and PVs give a value or a typed error, never a panic; the results keep the
//! invariants the executors rely on; and no secret value reaches the logged text of a
//! CreateVolume request or an error.
//!
//! Strategies mix plausible values (so the success paths run) with arbitrary text (so the
//! error paths do). Every property runs [`CASES`] cases.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PersistentVolumeSpec, PersistentVolumeStatus, Secret,
    TypedLocalObjectReference, TypedObjectReference, VolumeResourceRequirements,
};
use k8s_openapi::api::core::v1::{TopologySelectorLabelRequirement, TopologySelectorTerm};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use proptest::prelude::*;
use proptest::test_runner::Config;

use crate::csi;

use super::capabilities::FSTYPE_KEY;
use super::fixtures::{ClassBuilder, DRIVER, PvcBuilder, deletion_time};
use super::secrets::{deprecated_secret_keys, reserved_secret_keys};
use super::validation::dns1123_subdomain_problem;
use super::*;

/// The parameter prefix of the sidecar's own keys.
const RESERVED_PREFIX: &str = "csi.storage.k8s.io/";

/// Cases per property; the whole file stays well under a second per property in debug.
const CASES: u32 = 256;

fn config() -> Config {
    Config {
        cases: CASES,
        // A failure is fixed with a unit test naming the input, not a regressions file.
        failure_persistence: None,
        ..Config::default()
    }
}

// ---- text ----

/// A valid DNS-1123 subdomain (object and Secret names).
fn name() -> impl Strategy<Value = String> {
    "[a-z0-9]([a-z0-9-]{0,12}[a-z0-9])?(\\.[a-z0-9]{1,4})?"
}

/// Anything a user or the API server could put in a string field.
fn text() -> BoxedStrategy<String> {
    prop_oneof![
        4 => name(),
        1 => Just(String::new()),
        2 => "[ -~]{0,20}",
        2 => any::<String>(),
    ]
    .boxed()
}

/// Mostly UUIDs, sometimes anything.
fn uid() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        1 => text(),
    ]
}

/// Secret-name templates: the known `${...}` tokens, malformed ones and plain text, joined.
fn template() -> BoxedStrategy<String> {
    let piece = prop_oneof![
        Just("${pvc.name}".to_owned()),
        Just("${pvc.namespace}".to_owned()),
        Just("${pv.name}".to_owned()),
        "\\$\\{pvc\\.annotations\\['[a-z]{0,3}'\\]\\}",
        Just("$".to_owned()),
        Just("${".to_owned()),
        Just("${}".to_owned()),
        Just("}".to_owned()),
        "\\$[a-zA-Z0-9_*#@!?$-]{0,4}",
        name(),
        any::<String>(),
    ];
    prop::collection::vec(piece, 0..4)
        .prop_map(|pieces| pieces.concat())
        .boxed()
}

/// Storage requests: well-formed quantities of every shape, and arbitrary text.
fn quantity() -> BoxedStrategy<String> {
    prop_oneof![
        2 => "[0-9]{1,4}(Ki|Mi|Gi|k|M|G)?",
        2 => concat!(
            "[+-]?[0-9]{0,20}(\\.[0-9]{0,8})?",
            "(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]{1,22})?",
        ),
        1 => text(),
    ]
    .boxed()
}

fn string_map(
    key: impl Strategy<Value = String>,
    value: impl Strategy<Value = String>,
) -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(key, value, 0..4)
}

fn one_of(values: &[&'static str]) -> impl Strategy<Value = String> + use<> {
    prop::sample::select(values.to_vec()).prop_map(str::to_owned)
}

fn known_or_text(values: &[&'static str]) -> BoxedStrategy<String> {
    prop_oneof![3 => one_of(values), 1 => text()].boxed()
}

// ---- claims ----

fn access_modes() -> impl Strategy<Value = Option<Vec<String>>> {
    let mode = known_or_text(&[
        "ReadWriteOnce",
        "ReadOnlyMany",
        "ReadWriteMany",
        "ReadWriteOncePod",
    ]);
    let modes = prop_oneof![
        1 => Just(Vec::new()),
        9 => prop::collection::vec(mode, 1..4),
    ];
    prop::option::weighted(0.95, modes)
}

fn data_source() -> impl Strategy<Value = Option<TypedLocalObjectReference>> {
    let source = (
        prop::option::of(known_or_text(&["snapshot.storage.k8s.io", ""])),
        known_or_text(&["VolumeSnapshot", "PersistentVolumeClaim"]),
        text(),
    )
        .prop_map(|(api_group, kind, name)| TypedLocalObjectReference {
            api_group,
            kind,
            name,
        });
    prop::option::weighted(0.1, source)
}

fn data_source_ref() -> impl Strategy<Value = Option<TypedObjectReference>> {
    let source = (
        data_source().prop_filter_map("a source", |source| source),
        prop::option::weighted(0.3, text()),
    )
        .prop_map(|(source, namespace)| TypedObjectReference {
            api_group: source.api_group,
            kind: source.kind,
            name: source.name,
            namespace,
        });
    prop::option::weighted(0.1, source)
}

fn claim_annotations() -> impl Strategy<Value = BTreeMap<String, String>> {
    let key = known_or_text(&[
        ANN_STORAGE_PROVISIONER,
        ANN_BETA_STORAGE_PROVISIONER,
        ANN_SELECTED_NODE,
        ANN_ALPHA_SELECTED_NODE,
        ANN_BETA_STORAGE_CLASS,
        ANN_MIGRATED_TO,
        ANN_PROVISIONING_CONSISTENCY,
        "a",
    ]);
    string_map(key, known_or_text(&[DRIVER, "enable", "disable", "node-1"]))
}

fn claim_spec() -> BoxedStrategy<PersistentVolumeClaimSpec> {
    (
        (access_modes(), data_source(), data_source_ref()),
        prop::option::weighted(0.9, quantity()),
        prop::option::weighted(0.05, string_map(text(), text())),
        prop::option::weighted(0.8, known_or_text(&["standard"])),
        prop::option::weighted(0.1, text()),
        prop::option::weighted(0.4, known_or_text(&["Filesystem", "Block"])),
        prop::option::weighted(0.1, text()),
    )
        .prop_map(
            |(
                (access_modes, data_source, data_source_ref),
                storage,
                selector,
                storage_class_name,
                volume_attributes_class_name,
                volume_mode,
                volume_name,
            )| PersistentVolumeClaimSpec {
                access_modes,
                data_source,
                data_source_ref,
                resources: Some(VolumeResourceRequirements {
                    requests: storage
                        .map(|q| BTreeMap::from([("storage".to_owned(), Quantity(q))])),
                    limits: None,
                }),
                selector: selector.map(|match_labels| LabelSelector {
                    match_labels: Some(match_labels),
                    match_expressions: None,
                }),
                storage_class_name,
                volume_attributes_class_name,
                volume_mode,
                volume_name,
            },
        )
        .boxed()
}

/// Any claim the API server could hand over, and some it would not.
fn claim() -> BoxedStrategy<PersistentVolumeClaim> {
    (
        prop::option::weighted(0.95, text()),
        prop::option::weighted(0.95, text()),
        prop::option::weighted(0.95, uid()),
        claim_annotations(),
        string_map(text(), text()),
        prop::option::weighted(0.3, known_or_text(&[PROVISIONING_FINALIZER])),
        any::<bool>(),
        prop::option::weighted(0.95, claim_spec()),
    )
        .prop_map(
            |(name, namespace, uid, annotations, labels, finalizer, deleting, spec)| {
                PersistentVolumeClaim {
                    metadata: ObjectMeta {
                        name,
                        namespace,
                        uid,
                        annotations: Some(annotations),
                        labels: Some(labels),
                        finalizers: finalizer.map(|f| vec![f]),
                        deletion_timestamp: deleting.then(deletion_time),
                        resource_version: Some("1".to_owned()),
                        ..ObjectMeta::default()
                    },
                    spec,
                    status: None,
                }
            },
        )
        .boxed()
}

// ---- classes ----

fn parameter_key() -> BoxedStrategy<String> {
    let reserved: Vec<&'static str> = reserved_secret_keys().chain([FSTYPE_KEY]).collect();
    let deprecated: Vec<&'static str> = deprecated_secret_keys()
        .chain(["fstype", "FSType"])
        .collect();
    prop_oneof![
        3 => prop::sample::select(reserved).prop_map(str::to_owned),
        1 => prop::sample::select(deprecated).prop_map(str::to_owned),
        1 => "csi\\.storage\\.k8s\\.io/[a-z/-]{0,12}",
        2 => text(),
    ]
    .boxed()
}

fn topology_terms() -> impl Strategy<Value = Vec<TopologySelectorTerm>> {
    let requirement = (text(), prop::collection::vec(text(), 0..3))
        .prop_map(|(key, values)| TopologySelectorLabelRequirement { key, values });
    let term = prop::option::of(prop::collection::vec(requirement, 0..3)).prop_map(
        |match_label_expressions| TopologySelectorTerm {
            match_label_expressions,
        },
    );
    prop::collection::vec(term, 0..3)
}

/// Any StorageClass: parameters with reserved, deprecated and arbitrary keys and template
/// values, mount options, reclaim policies, binding modes and allowed topologies.
fn class() -> BoxedStrategy<StorageClass> {
    (
        prop::option::weighted(0.9, known_or_text(&["standard"])),
        known_or_text(&[DRIVER]),
        prop::option::weighted(0.8, string_map(parameter_key(), template())),
        prop::option::of(prop::collection::vec(text(), 0..3)),
        prop::option::of(known_or_text(&["Delete", "Retain", "Recycle"])),
        prop::option::of(known_or_text(&["Immediate", "WaitForFirstConsumer"])),
        prop::option::of(topology_terms()),
        prop::option::of(any::<bool>()),
    )
        .prop_map(
            |(
                name,
                provisioner,
                parameters,
                mount_options,
                reclaim_policy,
                volume_binding_mode,
                allowed_topologies,
                allow_volume_expansion,
            )| StorageClass {
                metadata: ObjectMeta {
                    name,
                    ..ObjectMeta::default()
                },
                provisioner,
                parameters,
                mount_options,
                reclaim_policy,
                volume_binding_mode,
                allowed_topologies,
                allow_volume_expansion,
            },
        )
        .boxed()
}

// ---- settings ----

fn provisioner_config() -> BoxedStrategy<ProvisionerConfig> {
    (
        known_or_text(&["pvc", "vol"]),
        prop_oneof![4 => Just(-1), 4 => 1..=32i32, 1 => any::<i32>()],
        any::<bool>(),
        known_or_text(&["", "ext4", "xfs"]),
        any::<bool>(),
        text(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(
                volume_name_prefix,
                volume_name_uuid_length,
                extra_create_metadata,
                default_fstype,
                controller_publish_readonly,
                identity,
                cross_namespace_data_sources,
                volume_attributes_classes,
            )| ProvisionerConfig {
                driver_name: DRIVER.to_owned(),
                volume_name_prefix,
                volume_name_uuid_length,
                extra_create_metadata,
                metadata: MetadataAllowLists::default(),
                default_fstype,
                controller_publish_readonly,
                prevent_volume_mode_conversion: true,
                cross_namespace_data_sources,
                volume_attributes_classes,
                identity,
            },
        )
        .boxed()
}

fn driver_capabilities() -> impl Strategy<Value = DriverCapabilities> {
    let mostly = || prop::bool::weighted(0.97);
    (
        mostly(),
        mostly(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(
                controller_service,
                create_delete_volume,
                single_node_multi_writer,
                topology,
                clone,
                snapshot,
                publish_unpublish,
                modify_volume,
            )| DriverCapabilities {
                controller_service,
                create_delete_volume,
                single_node_multi_writer,
                topology,
                clone,
                snapshot,
                publish_unpublish,
                modify_volume,
            },
        )
}

/// The least a driver needs to provision and delete empty volumes.
fn provisioning_driver() -> DriverCapabilities {
    DriverCapabilities {
        controller_service: true,
        create_delete_volume: true,
        ..DriverCapabilities::default()
    }
}

// ---- driver answers ----

/// The capacity a driver reports, relative to the request when that matters.
#[derive(Debug, Clone, Copy)]
enum Capacity {
    /// 0: the driver does not say.
    Unknown,
    /// The requested bytes plus this (possibly negative) amount.
    Relative(i64),
    /// Any number at all.
    Absolute(i64),
}

impl Capacity {
    fn bytes(self, required: i64) -> i64 {
        match self {
            Self::Unknown => 0,
            Self::Relative(delta) => required.saturating_add(delta),
            Self::Absolute(bytes) => bytes,
        }
    }
}

fn capacity() -> impl Strategy<Value = Capacity> {
    prop_oneof![
        Just(Capacity::Unknown),
        (-4096..=0i64).prop_map(Capacity::Relative),
        (0..1i64 << 40).prop_map(Capacity::Relative),
        any::<i64>().prop_map(Capacity::Absolute),
    ]
}

fn hash_map(
    key: impl Strategy<Value = String>,
    value: impl Strategy<Value = String>,
) -> impl Strategy<Value = HashMap<String, String>> {
    prop::collection::hash_map(key, value, 0..4)
}

/// A CreateVolume answer; its capacity is filled in against the plan by [`response`].
fn driver_answer() -> BoxedStrategy<Option<(Capacity, csi::Volume)>> {
    let topology = hash_map(text(), text()).prop_map(|segments| csi::Topology { segments });
    let volume = (
        capacity(),
        prop_oneof![4 => name(), 1 => text()],
        hash_map(known_or_text(&[PROVISIONER_IDENTITY_KEY]), text()),
        prop::collection::vec(topology, 0..3),
    )
        .prop_map(
            |(capacity, volume_id, volume_context, accessible_topology)| {
                let volume = csi::Volume {
                    volume_id,
                    volume_context,
                    accessible_topology,
                    ..csi::Volume::default()
                };
                (capacity, volume)
            },
        );
    prop::option::weighted(0.95, volume).boxed()
}

fn response(answer: &Option<(Capacity, csi::Volume)>, required: i64) -> csi::CreateVolumeResponse {
    csi::CreateVolumeResponse {
        volume: answer.clone().map(|(capacity, volume)| csi::Volume {
            capacity_bytes: capacity.bytes(required),
            ..volume
        }),
    }
}

// ---- persistent volumes ----

/// Any PV: ours, another driver's, in-tree, half-deleted, with or without the annotations the
/// deletion path reads.
fn persistent_volume() -> BoxedStrategy<PersistentVolume> {
    let annotation_key = known_or_text(&[
        ANN_PROVISIONED_BY,
        ANN_MIGRATED_TO,
        ANN_DELETION_SECRET_NAME,
        ANN_DELETION_SECRET_NAMESPACE,
        ANN_BETA_STORAGE_CLASS,
    ]);
    let csi_source = (known_or_text(&[DRIVER]), text()).prop_map(|(driver, volume_handle)| {
        CSIPersistentVolumeSource {
            driver,
            volume_handle,
            ..CSIPersistentVolumeSource::default()
        }
    });
    let claim_ref = (
        prop::option::of(text()),
        prop::option::of(text()),
        prop::option::of(uid()),
    )
        .prop_map(|(name, namespace, uid)| ObjectReference {
            name,
            namespace,
            uid,
            ..ObjectReference::default()
        });
    (
        prop::option::of(text()),
        string_map(annotation_key, known_or_text(&[DRIVER, "ns", "secret"])),
        prop::option::weighted(0.6, known_or_text(&[PV_FINALIZER])),
        any::<bool>(),
        prop::option::weighted(0.8, csi_source),
        prop::option::weighted(0.8, claim_ref),
        prop::option::of(known_or_text(&["Delete", "Retain", "Recycle"])),
        prop::option::of(known_or_text(&["standard"])),
        prop::option::of(known_or_text(&["Bound", "Released", "Available", "Failed"])),
    )
        .prop_map(
            |(
                name,
                annotations,
                finalizer,
                deleting,
                csi,
                claim_ref,
                persistent_volume_reclaim_policy,
                storage_class_name,
                phase,
            )| PersistentVolume {
                metadata: ObjectMeta {
                    name,
                    annotations: Some(annotations),
                    finalizers: finalizer.map(|f| vec![f]),
                    deletion_timestamp: deleting.then(deletion_time),
                    ..ObjectMeta::default()
                },
                spec: Some(PersistentVolumeSpec {
                    csi,
                    claim_ref,
                    persistent_volume_reclaim_policy,
                    storage_class_name,
                    ..PersistentVolumeSpec::default()
                }),
                status: Some(PersistentVolumeStatus {
                    phase,
                    ..PersistentVolumeStatus::default()
                }),
            },
        )
        .boxed()
}

// ---- checks shared by the properties ----

/// The invariants of a volume name made from `prefix`, `uuid_length` and `uid`.
fn check_volume_name(
    name: &str,
    prefix: &str,
    uuid_length: i32,
    uid: &str,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(dns1123_subdomain_problem(name), None, "{}", name);
    prop_assert!(name.len() <= 253);
    let suffix = name.strip_prefix(prefix).and_then(|s| s.strip_prefix('-'));
    prop_assert!(suffix.is_some(), "{} lacks the prefix {}-", name, prefix);
    let suffix = suffix.unwrap_or_default();
    match usize::try_from(uuid_length) {
        Err(_) => prop_assert_eq!(suffix, uid),
        Ok(length) => {
            let without_dashes: String = uid.chars().filter(|c| *c != '-').collect();
            prop_assert_eq!(suffix.len(), length);
            prop_assert!(without_dashes.starts_with(suffix));
        }
    }
    Ok(())
}

/// The PV of a successful plan: right name, capacity at least the request, and everything the
/// deletion path later reads from it.
fn check_persistent_volume(
    pv: &PersistentVolume,
    plan: &ProvisionPlan,
    volume: &csi::Volume,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(pv.metadata.name.as_deref(), Some(plan.volume_name.as_str()));
    let spec = pv.spec.clone().unwrap_or_default();
    prop_assert_eq!(&spec.volume_attributes_class_name, &plan.attributes_class);
    let storage = spec
        .capacity
        .as_ref()
        .and_then(|capacity| capacity.get("storage"))
        .map(|quantity| quantity.0.clone())
        .unwrap_or_default();
    prop_assert_eq!(
        parse_quantity_bytes(&storage).map(|b| b >= plan.required_bytes),
        Ok(true)
    );
    if volume.capacity_bytes != 0 {
        prop_assert_eq!(parse_quantity_bytes(&storage), Ok(volume.capacity_bytes));
    }

    // The driver's maps come in any order; the PV must not depend on it.
    let copy = |map: &HashMap<String, String>| -> HashMap<String, String> {
        map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    };
    let reordered = csi::Volume {
        volume_context: copy(&volume.volume_context),
        accessible_topology: volume
            .accessible_topology
            .iter()
            .map(|topology| csi::Topology {
                segments: copy(&topology.segments),
            })
            .collect(),
        ..volume.clone()
    };
    let again = build_persistent_volume(
        plan,
        &csi::CreateVolumeResponse {
            volume: Some(reordered),
        },
    );
    prop_assert_eq!(again.as_ref(), Ok(pv));

    // What the deletion path reads back from the PV we made.
    let expected_secrets = plan
        .secrets
        .provisioner
        .clone()
        .map_or(DeletionSecrets::None, DeletionSecrets::Fetch);
    prop_assert_eq!(
        deletion_target(pv, &provisioning_driver(), DRIVER),
        Ok(DeletionTarget {
            volume_handle: volume.volume_id.clone(),
            migrated: false,
            secrets: expected_secrets,
        })
    );
    prop_assert!(is_provisioner_for_volume(pv, &plan.provisioned_by));
    prop_assert_eq!(existing_pv(pv, pv, None), ExistingPv::Ours);
    let mut other_volume = pv.clone();
    if let Some(csi) = other_volume.spec.as_mut().and_then(|s| s.csi.as_mut()) {
        csi.volume_handle.push('x');
    }
    prop_assert_eq!(existing_pv(&other_volume, pv, None), ExistingPv::Other);
    Ok(())
}

/// `true` when a secret value of 4 or more bytes shows in `logged` although it does not show
/// in `background` (the same text made without the values): shorter values, and values that
/// are part of the rest of the text anyway, say nothing about a leak.
fn leaks(secrets: &HashMap<String, String>, logged: &str, background: &str) -> bool {
    secrets.values().any(|value| {
        value.len() >= 4 && logged.contains(value.as_str()) && !background.contains(value.as_str())
    })
}

/// The value of a result the property requires to succeed.
fn ok<T, E: std::fmt::Display>(result: Result<T, E>) -> Result<T, TestCaseError> {
    result.map_err(|error| TestCaseError::fail(format!("unexpected error: {error}")))
}

fn without_values(secrets: &HashMap<String, String>) -> HashMap<String, String> {
    secrets
        .keys()
        .map(|key| (key.clone(), String::new()))
        .collect()
}

// ---- plausible inputs, for the success path ----

/// A claim and a class that must plan: valid names and UID, known modes, a well-formed size,
/// no data source, and class parameters the driver may have, with valid secret templates.
fn valid_claim_and_class() -> BoxedStrategy<(PersistentVolumeClaim, StorageClass)> {
    let label = "[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?";
    let secret = prop_oneof![
        Just(None),
        Just(Some(("${pvc.name}-creds", "${pvc.namespace}"))),
        Just(Some(("${pv.name}", "kube-system"))),
        Just(Some(("fixed.secret", "${pvc.namespace}"))),
    ];
    (
        (
            name(),
            label,
            "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        ),
        prop::collection::vec(
            one_of(&[
                "ReadWriteOnce",
                "ReadOnlyMany",
                "ReadWriteMany",
                "ReadWriteOncePod",
            ]),
            1..3,
        ),
        prop::option::of(one_of(&["Filesystem", "Block"])),
        prop::option::of("[0-9]{1,4}(Ki|Mi|Gi|k|M|G)?"),
        string_map("[a-eg-z][a-zA-Z0-9]{0,8}", any::<String>()),
        secret,
        prop::option::of(prop::collection::vec(text(), 0..3)),
        prop::option::of(known_or_text(&["Delete", "Retain"])),
    )
        .prop_map(
            |(
                (name, namespace, uid),
                modes,
                mode,
                storage,
                mut parameters,
                secret,
                mount_options,
                reclaim_policy,
            )| {
                let mut pvc = PvcBuilder::new()
                    .uid(&uid)
                    .access_modes(&modes.iter().map(String::as_str).collect::<Vec<_>>());
                pvc = match storage {
                    Some(quantity) => pvc.storage(&quantity),
                    None => pvc.no_storage(),
                };
                if let Some(mode) = mode {
                    pvc = pvc.volume_mode(&mode);
                }
                let mut pvc = pvc.build();
                pvc.metadata.name = Some(name);
                pvc.metadata.namespace = Some(namespace);
                if let Some((name, namespace)) = secret {
                    parameters.insert(
                        "csi.storage.k8s.io/provisioner-secret-name".to_owned(),
                        name.to_owned(),
                    );
                    parameters.insert(
                        "csi.storage.k8s.io/provisioner-secret-namespace".to_owned(),
                        namespace.to_owned(),
                    );
                }
                let class = StorageClass {
                    parameters: Some(parameters),
                    mount_options,
                    reclaim_policy,
                    ..ClassBuilder::new().build()
                };
                (pvc, class)
            },
        )
        .boxed()
}

fn valid_config() -> impl Strategy<Value = ProvisionerConfig> {
    (
        provisioner_config(),
        "[a-z]([a-z0-9-]{0,18}[a-z0-9])?",
        prop_oneof![Just(-1), 1..=32i32],
    )
        .prop_map(|(config, prefix, length)| ProvisionerConfig {
            volume_name_prefix: prefix,
            volume_name_uuid_length: length,
            ..config
        })
}

proptest! {
    #![proptest_config(config())]

    /// Anything in, a plan or a typed error out; a plan's parts are consistent.
    #[test]
    fn any_claim_and_class_plan_or_fail_with_a_typed_error(
        pvc in claim(),
        class in class(),
        config in provisioner_config(),
        caps in driver_capabilities(),
        answer in driver_answer(),
    ) {
        let Ok(plan) = plan_provision(&pvc, &class, &config, &caps, &[]) else {
            return Ok(());
        };
        check_volume_name(
            &plan.volume_name,
            &config.volume_name_prefix,
            config.volume_name_uuid_length,
            pvc.metadata.uid.as_deref().unwrap_or_default(),
        )?;
        prop_assert!(plan.required_bytes >= 0);
        prop_assert!(!plan.volume_capabilities.is_empty());
        prop_assert_eq!(
            plan.attributes_class.as_deref(),
            requested_attributes_class(&pvc, &config)
        );
        prop_assert!(plan.attributes_class.is_none() || caps.modify_volume);
        let reserved = plan.parameters.keys().filter(|key| key.starts_with(RESERVED_PREFIX));
        prop_assert_eq!(reserved.count(), if config.extra_create_metadata { 3 } else { 0 });

        let request = build_create_volume_request(&plan, HashMap::new(), None, None, HashMap::new());
        prop_assert_eq!(&request.name, &plan.volume_name);
        prop_assert_eq!(
            request.capacity_range.map(|range| range.required_bytes),
            Some(plan.required_bytes)
        );

        let response = response(&answer, plan.required_bytes);
        match build_persistent_volume(&plan, &response) {
            Ok(pv) => {
                let volume = response.volume.unwrap_or_default();
                check_persistent_volume(&pv, &plan, &volume)?;
            }
            Err(CreateResponseError::CapacityTooSmall { volume_id, capacity, requested }) => {
                prop_assert!(capacity < requested);
                prop_assert!(!volume_id.is_empty());
            }
            Err(_) => {}
        }
    }

    /// A well-formed claim of a well-formed class always plans, and the driver's answer gives
    /// a PV exactly when it names a volume at least as large as the request.
    #[test]
    fn valid_claims_plan_and_any_answer_gives_a_pv_or_a_typed_error(
        (pvc, class) in valid_claim_and_class(),
        config in valid_config(),
        topology in any::<bool>(),
        answer in driver_answer(),
    ) {
        let caps = DriverCapabilities {
            topology,
            ..provisioning_driver()
        };
        let plan = ok(plan_provision(&pvc, &class, &config, &caps, &[]))?;
        let response = response(&answer, plan.required_bytes);
        let result = build_persistent_volume(&plan, &response);
        let too_small = |capacity| capacity != 0 && capacity < plan.required_bytes;
        match &response.volume {
            None => prop_assert_eq!(result.err(), Some(CreateResponseError::MissingVolume)),
            Some(volume) if volume.volume_id.is_empty() => {
                prop_assert_eq!(result.err(), Some(CreateResponseError::EmptyVolumeId));
            }
            Some(volume) if too_small(volume.capacity_bytes) => {
                prop_assert_eq!(
                    result.err(),
                    Some(CreateResponseError::CapacityTooSmall {
                        volume_id: volume.volume_id.clone(),
                        capacity: volume.capacity_bytes,
                        requested: plan.required_bytes,
                    })
                );
            }
            Some(volume) => check_persistent_volume(&ok(result)?, &plan, volume)?,
        }
    }

    /// The volume name is a valid PV name of the configured shape, or a typed error.
    #[test]
    fn volume_names_are_valid_pv_names_or_errors(
        prefix in known_or_text(&["pvc", "a.b", "-x"]),
        uuid_length in prop_oneof![Just(-1), 0..=33i32, any::<i32>()],
        uid in uid(),
    ) {
        if let Ok(name) = volume_name(&prefix, uuid_length, &uid) {
            check_volume_name(&name, &prefix, uuid_length, &uid)?;
        }
    }

    /// Parameters never pass a reserved key to the driver except the claim metadata, and keep
    /// every other key with its value.
    #[test]
    fn parameters_strip_exactly_the_reserved_keys(
        parameters in string_map(parameter_key(), template()),
        extra in any::<bool>(),
    ) {
        let metadata = ExtraCreateMetadata {
            pvc_name: "c",
            pvc_namespace: "n",
            pv_name: "v",
        };
        let Ok(sent) = create_volume_parameters(&parameters, extra.then_some(&metadata)) else {
            prop_assert!(parameters.keys().any(|key| key.starts_with(RESERVED_PREFIX)));
            return Ok(());
        };
        for (key, value) in &parameters {
            if !key.starts_with(RESERVED_PREFIX) {
                prop_assert_eq!(sent.get(key), Some(value));
            }
        }
        let reserved_sent = sent.keys().filter(|key| key.starts_with(RESERVED_PREFIX)).count();
        prop_assert_eq!(reserved_sent, if extra { 3 } else { 0 });
    }

    /// Secret references resolve to a valid namespace and Secret name, or a typed error.
    #[test]
    fn secret_templates_resolve_to_valid_names_or_errors(
        parameters in string_map(parameter_key(), template()),
        annotations in string_map("[a-z]{0,3}", text()),
        (pv_name, pvc_name, pvc_namespace) in (text(), text(), text()),
    ) {
        let context = TemplateContext {
            pv_name: &pv_name,
            pvc_name: &pvc_name,
            pvc_namespace: &pvc_namespace,
            pvc_annotations: Some(&annotations),
        };
        for kind in SecretKind::ALL {
            if let Ok(Some(secret)) = resolve_secret_ref(kind, &parameters, &context) {
                prop_assert_eq!(dns1123_subdomain_problem(&secret.name), None);
                prop_assert_eq!(super::validation::dns1123_label_problem(&secret.namespace), None);
            }
        }
        let _ = resolve_secret_refs(&parameters, &context);
    }

    /// Any string parses to a non-negative byte count or a typed error.
    #[test]
    fn any_quantity_parses_or_fails(value in quantity()) {
        if let Ok(bytes) = parse_quantity_bytes(&value) {
            prop_assert!(bytes >= 0);
        }
    }

    /// Whole numbers with a suffix are exact, any fraction of a byte rounds up, and the PV's
    /// capacity text reads back as the same byte count.
    #[test]
    fn quantities_are_exact_and_round_trip(
        amount in 0..1i64 << 20,
        (suffix, multiplier) in prop::sample::select(vec![
            ("", 1i64), ("k", 1_000), ("M", 1_000_000), ("G", 1_000_000_000),
            ("Ki", 1 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30), ("Ti", 1 << 40),
        ]),
        fraction in "[0-9]{0,3}[1-9]",
        bytes in prop_oneof![0..i64::MAX, (0..1i64 << 23).prop_map(|k| k << 40)],
    ) {
        let whole = format!("{amount}{suffix}");
        prop_assert_eq!(parse_quantity_bytes(&whole), Ok(amount * multiplier));
        let fractional = format!("{amount}.{fraction}");
        prop_assert_eq!(parse_quantity_bytes(&fractional), Ok(amount + 1));
        prop_assert_eq!(parse_quantity_bytes(&format_binary_si(bytes)), Ok(bytes));
    }

    /// What a claim needs now is decided for any claim, class and journal state; only our own
    /// live claim of our own class is provisioned.
    #[test]
    fn claim_work_is_decided_for_any_claim(
        pvc in claim(),
        class in prop::option::of(class()),
        config in provisioner_config(),
        consistency_by_default in any::<bool>(),
        in_flight in any::<bool>(),
    ) {
        let work = claim_work(&pvc, class.as_ref(), &config, consistency_by_default, |_| in_flight);
        match work {
            ClaimWork::Provision(class) => {
                prop_assert_eq!(storage_provisioner(&pvc), Some(DRIVER));
                prop_assert_eq!(class.provisioner.as_str(), DRIVER);
                prop_assert!(pvc.metadata.deletion_timestamp.is_none());
            }
            ClaimWork::ReleaseFinalizer => prop_assert!(has_provisioning_finalizer(&pvc)),
            ClaimWork::Nothing(_) | ClaimWork::Refuse(_) => {}
            ClaimWork::BecomeOwner(_) => prop_assert!(false, "only node mode competes"),
        }
    }

    /// A drain decides for any claim too: it provisions only a live claim of ours whose
    /// operation is in flight, and always lets our finalizer go once nothing is.
    #[test]
    fn a_drain_provisions_only_what_is_in_flight(
        pvc in claim(),
        class in prop::option::of(class()),
        config in provisioner_config(),
        in_flight in any::<bool>(),
    ) {
        let work = drain_claim_work(&pvc, class.as_ref(), &config, |_| in_flight);
        match work {
            ClaimWork::Provision(class) => {
                prop_assert!(in_flight);
                prop_assert_eq!(storage_provisioner(&pvc), Some(DRIVER));
                prop_assert_eq!(class.provisioner.as_str(), DRIVER);
                prop_assert!(pvc.metadata.deletion_timestamp.is_none());
            }
            ClaimWork::ReleaseFinalizer => prop_assert!(has_provisioning_finalizer(&pvc)),
            ClaimWork::Nothing(_) | ClaimWork::Refuse(_) => {}
            ClaimWork::BecomeOwner(_) => prop_assert!(false, "only node mode competes"),
        }
        let nothing_in_flight = drain_claim_work(&pvc, class.as_ref(), &config, |_| false);
        let holds = holds_up_drain(&pvc, &config.driver_name);
        prop_assert_eq!(nothing_in_flight == ClaimWork::ReleaseFinalizer, holds);
    }

    /// The deletion path decides for any PV; a DeleteVolume target always has the PV's handle.
    #[test]
    fn any_pv_gets_a_deletion_decision(
        pv in persistent_volume(),
        wanted in persistent_volume(),
        caps in driver_capabilities(),
        class in prop::option::of(class()),
    ) {
        let _ = volume_has_work(&pv, DRIVER);
        if let Ok(target) = deletion_target(&pv, &caps, DRIVER) {
            let csi = pv.spec.as_ref().and_then(|spec| spec.csi.as_ref());
            let handle = csi.map(|csi| csi.volume_handle.as_str());
            prop_assert!(!target.volume_handle.is_empty());
            prop_assert_eq!(Some(target.volume_handle.as_str()), handle);
        }
        if let Ok(Some(secret)) = deletion_secret_from_class(&pv, class.as_ref(), DRIVER) {
            prop_assert_eq!(dns1123_subdomain_problem(&secret.name), None);
        }
        let _ = existing_pv(&pv, &wanted, None);
        let reflexive = existing_pv(&pv, &pv, None);
        let has_csi = pv.spec.as_ref().is_some_and(|s| s.csi.is_some());
        prop_assert_eq!(reflexive == ExistingPv::Other, !has_csi);
    }

    /// The CreateVolume request as the CSI client logs it (`Debug`, plain and pretty) is the
    /// same whatever the secret values are, so none of them can show.
    #[test]
    fn logged_create_volume_request_shows_no_secret(
        (pvc, class) in valid_claim_and_class(),
        secrets in hash_map(text(), prop_oneof![text(), "[A-Za-z0-9+/=]{4,40}"]),
    ) {
        let plan = ok(plan_provision(
            &pvc,
            &class,
            &super::fixtures::config(),
            &provisioning_driver(),
            &[],
        ))?;
        let request = build_create_volume_request(&plan, secrets.clone(), None, None, HashMap::new());
        let blank = build_create_volume_request(&plan, without_values(&secrets), None, None, HashMap::new());
        for (logged, background) in [
            (format!("{request:?}"), format!("{blank:?}")),
            (format!("{request:#?}"), format!("{blank:#?}")),
        ] {
            prop_assert_eq!(&logged, &background);
            prop_assert!(!leaks(&secrets, &logged, &background));
        }
    }

    /// The redaction itself: keys stay, values never show, whatever they are.
    #[test]
    fn redacted_secrets_show_keys_only(
        secrets in hash_map(text(), prop_oneof![text(), any::<String>()]),
    ) {
        let logged = format!("{:?}", csi::RedactedSecrets(&secrets));
        let blank = without_values(&secrets);
        let background = format!("{:?}", csi::RedactedSecrets(&blank));
        prop_assert_eq!(&logged, &background);
        prop_assert!(!leaks(&secrets, &logged, &background));
        for key in secrets.keys() {
            let shown = format!("{key:?}");
            prop_assert!(logged.contains(&shown), "key {} missing", shown);
        }
    }

    /// A fetched Secret becomes the request's secrets, or an error that names the Secret and
    /// the key but never shows a value.
    #[test]
    fn secret_data_errors_name_the_key_not_the_value(
        (name, namespace) in (name(), name()),
        data in prop::collection::btree_map(
            text(),
            prop_oneof![
                any::<String>().prop_map(String::into_bytes),
                prop::collection::vec(any::<u8>(), 0..12),
            ],
            0..4,
        ),
    ) {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            data: Some(data.iter().map(|(k, v)| (k.clone(), ByteString(v.clone()))).collect()),
            ..Secret::default()
        };
        let first_bad_key = data
            .iter()
            .find(|(_, value)| std::str::from_utf8(value).is_err())
            .map(|(key, _)| key);
        match (secret_data(&secret), first_bad_key) {
            (Ok(map), None) => {
                prop_assert_eq!(map.len(), data.len());
                for (key, value) in &data {
                    prop_assert_eq!(map.get(key).map(String::as_bytes), Some(value.as_slice()));
                }
            }
            (Err(error), Some(key)) => prop_assert_eq!(
                error.to_string(),
                format!("secret {namespace}/{name}: value of key {key:?} is not valid UTF-8")
            ),
            (result, key) => {
                let message = format!("{result:?} for first invalid key {key:?}");
                return Err(TestCaseError::fail(message));
            }
        }
    }
}

// ---- topology ----

/// Keys as drivers register them (lower case, so no two differ only in case), sometimes
/// anything.
fn topology_key(well_formed: bool) -> BoxedStrategy<String> {
    let valid = prop_oneof![
        Just("topology.example/zone".to_owned()),
        Just("topology.example/rack".to_owned()),
        Just("region".to_owned()),
    ];
    if well_formed {
        valid.boxed()
    } else {
        prop_oneof![4 => valid, 1 => text()].boxed()
    }
}

fn topology_value(well_formed: bool) -> BoxedStrategy<String> {
    if well_formed {
        "[a-c]".boxed()
    } else {
        prop_oneof![4 => "[a-c]", 1 => text()].boxed()
    }
}

/// Node names: a few, so selected nodes, Nodes and CSINodes often coincide.
fn node_name() -> impl Strategy<Value = String> {
    "n[0-5]"
}

/// Keys without repetition when well-formed (the API server refuses a repeated CSINode key
/// and a repeated key in one selector term).
fn topology_keys(well_formed: bool, sizes: std::ops::Range<usize>) -> BoxedStrategy<Vec<String>> {
    let keys = prop::collection::vec(topology_key(well_formed), sizes);
    if well_formed {
        keys.prop_map(|keys| {
            let mut seen = std::collections::BTreeSet::new();
            keys.into_iter()
                .filter(|key| seen.insert(key.clone()))
                .collect()
        })
        .boxed()
    } else {
        keys.boxed()
    }
}

/// Any Nodes and CSINodes, unrelated to each other.
fn any_cluster() -> impl Strategy<Value = super::fixtures::Cluster> {
    let labels = prop::collection::btree_map(topology_key(false), topology_value(false), 0..4);
    (
        prop::collection::btree_map(node_name(), topology_keys(false, 0..4), 0..6),
        prop::collection::btree_map(node_name(), labels, 0..6),
    )
        .prop_map(|(csinodes, nodes)| super::fixtures::Cluster { csinodes, nodes })
}

/// A cluster as the driver makes it: the same keys in every CSINode (most Nodes have one),
/// and Nodes labelled with most of those keys; and mostly one of its Nodes selected.
fn coherent_cluster() -> impl Strategy<Value = (super::fixtures::Cluster, Option<String>)> {
    let node = (
        prop::bool::weighted(0.9),
        prop::collection::vec(prop::option::weighted(0.9, topology_value(true)), 3),
    );
    (
        topology_keys(true, 1..4),
        prop::collection::btree_map(node_name(), node, 1..6),
    )
        .prop_map(|(keys, nodes)| {
            let mut cluster = super::fixtures::Cluster::new();
            for (name, (has_csinode, values)) in nodes {
                if has_csinode {
                    cluster.csinodes.insert(name.clone(), keys.clone());
                }
                let labels = keys
                    .iter()
                    .zip(values)
                    .filter_map(|(key, value)| Some((key.clone(), value?)))
                    .collect();
                cluster.nodes.insert(name, labels);
            }
            cluster
        })
        .prop_flat_map(|cluster| {
            let names: Vec<String> = cluster.nodes.keys().cloned().collect();
            let selected = prop_oneof![
                1 => Just(None),
                3 => prop::sample::select(names).prop_map(Some),
                1 => node_name().prop_map(Some),
            ];
            (Just(cluster), selected)
        })
}

fn allowed_topologies(well_formed: bool) -> impl Strategy<Value = Vec<TopologySelectorTerm>> {
    let values = prop::collection::vec(topology_value(well_formed), 0..3);
    let selector = (
        topology_keys(well_formed, 0..3),
        prop::collection::vec(values, 3),
    )
        .prop_map(|(keys, values)| TopologySelectorTerm {
            match_label_expressions: Some(
                keys.into_iter()
                    .zip(values)
                    .map(|(key, values)| TopologySelectorLabelRequirement { key, values })
                    .collect(),
            ),
        });
    prop::collection::vec(selector, 0..3)
}

fn claim_name() -> BoxedStrategy<String> {
    prop_oneof![2 => "[a-z]{1,4}-[a-z]{1,4}-[0-9]{1,3}", 1 => text()].boxed()
}

/// A CSI segment map as its sorted pairs.
fn segment_pairs(topology: &csi::Topology) -> Vec<(&str, &str)> {
    let mut pairs: Vec<(&str, &str)> = topology
        .segments
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    pairs.sort_unstable();
    pairs
}

/// Every pair of `small` is in `large`.
fn segments_within(small: &csi::Topology, large: &csi::Topology) -> bool {
    small
        .segments
        .iter()
        .all(|(k, v)| large.segments.get(k) == Some(v))
}

proptest! {
    #![proptest_config(config())]

    /// Anything in (unvalidated keys and values, repeated keys, missing Nodes and CSINodes):
    /// a requirement or a typed error, never a panic; only the missing CSINode reschedules.
    #[test]
    fn any_topology_input_gives_a_requirement_or_a_typed_error(
        cluster in any_cluster(),
        allowed in allowed_topologies(false),
        selected in prop::option::of(prop_oneof![4 => node_name().boxed(), 1 => text()]),
        name in claim_name(),
        (strict, immediate) in (any::<bool>(), any::<bool>()),
    ) {
        let inputs = TopologyInputs {
            claim_name: &name,
            selected_node: selected.as_deref(),
            allowed_topologies: &allowed,
            strict,
            immediate,
        };
        match accessibility_requirements(&inputs, &cluster) {
            Ok(Some(requirement)) => {
                prop_assert!(!requirement.requisite.is_empty());
                prop_assert_eq!(requirement.preferred.len(), requirement.requisite.len());
                for topology in &requirement.requisite {
                    prop_assert!(!topology.segments.is_empty());
                }
            }
            Ok(None) => {}
            Err(error) => {
                let no_csinode = selected
                    .as_deref()
                    .is_some_and(|node| !node.is_empty() && !cluster.csinodes.contains_key(node));
                prop_assert_eq!(error.reschedules(), no_csinode);
                let text = error.to_string();
                prop_assert_eq!(
                    text.starts_with("error generating accessibility requirements: "),
                    !error.reschedules(),
                    "{}", text
                );
            }
        }
    }

    /// With input the API server would accept: requisite sorted (fewer pairs first, then by
    /// pairs) without duplicates, preferred a rotation of it, led by the selected node's term
    /// (or the first requisite term within it); strict sends only the node's term.
    #[test]
    fn topology_requirements_keep_their_invariants(
        (cluster, selected) in coherent_cluster(),
        allowed in allowed_topologies(true),
        name in claim_name(),
        (strict, immediate) in (any::<bool>(), any::<bool>()),
    ) {
        let inputs = TopologyInputs {
            claim_name: &name,
            selected_node: selected.as_deref(),
            allowed_topologies: &allowed,
            strict,
            immediate,
        };
        let requirement = match accessibility_requirements(&inputs, &cluster) {
            Ok(Some(requirement)) => requirement,
            Ok(None) => {
                // A selector term gives nothing when its last expression has no values (an
                // earlier empty one only restarts the product).
                let flattens_to_nothing = allowed.iter().all(|selector| {
                    selector
                        .match_label_expressions
                        .as_deref()
                        .unwrap_or_default()
                        .last()
                        .is_none_or(|expression| expression.values.is_empty())
                });
                prop_assert!(
                    (selected.is_none() && allowed.is_empty() && !immediate)
                        || (!allowed.is_empty() && flattens_to_nothing && !(strict && selected.is_some()))
                );
                return Ok(());
            }
            Err(error) => {
                prop_assert!(
                    !matches!(
                        error,
                        TopologyError::InvalidKey { .. }
                            | TopologyError::InvalidValue { .. }
                            | TopologyError::KeysDifferOnlyInCase { .. }
                            | TopologyError::TermTooLarge { .. }
                    ),
                    "{}", error
                );
                return Ok(());
            }
        };
        let requisite = &requirement.requisite;
        let preferred = &requirement.preferred;
        for pair in requisite.windows(2) {
            let (a, b) = (segment_pairs(&pair[0]), segment_pairs(&pair[1]));
            prop_assert!((a.len(), &a) < (b.len(), &b), "{:?} before {:?}", a, b);
        }
        let start = requisite.iter().position(|topology| Some(topology) == preferred.first());
        prop_assert!(start.is_some());
        let mut rotated = requisite.clone();
        rotated.rotate_left(start.unwrap_or_default());
        prop_assert_eq!(&rotated, preferred);

        if let Some(node) = &selected {
            let keys = &cluster.csinodes[node];
            let labels = &cluster.nodes[node];
            let own = csi::Topology {
                segments: keys.iter().map(|key| (key.clone(), labels[key].clone())).collect(),
            };
            if strict {
                prop_assert_eq!(requisite, &vec![own.clone()]);
                prop_assert_eq!(preferred, &vec![own]);
            } else {
                let first = requisite.iter().position(|topology| segments_within(topology, &own));
                prop_assert_eq!(first, start);
                if requisite.contains(&own) && allowed.is_empty() {
                    prop_assert_eq!(&preferred[0], &own);
                }
            }
        }
    }
}
