//! Table-driven tests of the seven plugins' translations, on objects written as the API
//! server returns them.

use serde_json::{Value, json};

use super::*;

fn class(parameters: Value, allowed: Value) -> StorageClass {
    let mut class =
        json!({"metadata": {"name": "c"}, "provisioner": "in-tree", "parameters": parameters});
    if !allowed.is_null() {
        class["allowedTopologies"] = allowed;
    }
    serde_json::from_value(class).expect("class")
}

fn terms(expressions: &[(&str, &[&str])]) -> Value {
    json!([{"matchLabelExpressions": expressions.iter().map(|(key, values)| json!({"key": key, "values": values})).collect::<Vec<_>>()}])
}

fn as_json<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).expect("serializable")
}

#[test]
fn every_plugin_is_found_by_its_csi_driver_and_names_match_the_library() {
    let expected = [
        ("pd.csi.storage.gke.io", "kubernetes.io/gce-pd"),
        ("ebs.csi.aws.com", "kubernetes.io/aws-ebs"),
        ("disk.csi.azure.com", "kubernetes.io/azure-disk"),
        ("file.csi.azure.com", "kubernetes.io/azure-file"),
        ("cinder.csi.openstack.org", "kubernetes.io/cinder"),
        ("csi.vsphere.vmware.com", "kubernetes.io/vsphere-volume"),
        ("pxd.portworx.com", "kubernetes.io/portworx-volume"),
    ];
    for (driver, in_tree) in expected {
        let plugin = InTreePlugin::for_csi_driver(driver).expect(driver);
        assert_eq!(plugin.in_tree_name(), in_tree);
        assert_eq!(plugin.csi_driver(), driver);
    }
    assert_eq!(InTreePlugin::for_csi_driver("hostpath.csi.k8s.io"), None);
}

#[test]
fn classes_are_translated_as_the_library_does() {
    use InTreePlugin::*;
    let gce = "topology.gke.io/zone";
    let ebs = "topology.ebs.csi.aws.com/zone";
    let azure = "topology.disk.csi.azure.com/zone";
    // (plugin, parameters, allowedTopologies, expected parameters, expected allowedTopologies)
    let cases = [
        (
            GcePd,
            json!({"FSType": "ext4", "zone": "us-central1-a", "type": "pd-ssd"}),
            Value::Null,
            json!({"csi.storage.k8s.io/fstype": "ext4", "type": "pd-ssd"}),
            terms(&[(gce, &["us-central1-a"])]),
        ),
        (
            GcePd,
            json!({"zones": "a-b-c,a-b-d"}),
            Value::Null,
            json!({}),
            terms(&[(gce, &["a-b-c", "a-b-d"])]),
        ),
        (
            GcePd,
            json!({}),
            terms(&[
                ("failure-domain.beta.kubernetes.io/zone", &["z1"]),
                ("other", &["x"]),
            ]),
            json!({}),
            terms(&[(gce, &["z1"]), ("other", &["x"])]),
        ),
        (
            AwsEbs,
            json!({"iopsPerGB": "10", "fstype": "xfs"}),
            terms(&[("topology.kubernetes.io/zone", &["z"])]),
            json!({"iopsPerGB": "10", "allowautoiopspergbincrease": "true", "csi.storage.k8s.io/fstype": "xfs"}),
            terms(&[(ebs, &["z"])]),
        ),
        (
            AzureDisk,
            json!({"fstype": "ext4", "zones": "1,eastus-2"}),
            Value::Null,
            json!({"fstype": "ext4"}),
            terms(&[(azure, &["", "eastus-2"])]),
        ),
        (
            AzureFile,
            json!({"skuName": "Standard_LRS"}),
            Value::Null,
            json!({"skuName": "Standard_LRS"}),
            Value::Null,
        ),
        (
            Cinder,
            json!({"fstype": "ext4", "availability": "nova"}),
            terms(&[("topology.kubernetes.io/zone", &["nova"])]),
            json!({"csi.storage.k8s.io/fstype": "ext4", "availability": "nova"}),
            terms(&[("topology.cinder.csi.openstack.org/zone", &["nova"])]),
        ),
        (
            VSphere,
            json!({"fstype": "ext4", "StoragePolicyName": "gold", "datastore": "ds1", "unknown": "x"}),
            Value::Null,
            json!({"csi.storage.k8s.io/fstype": "ext4", "storagepolicyname": "gold", "datastore-migrationparam": "ds1", "csimigration": "true"}),
            Value::Null,
        ),
        (
            Portworx,
            json!({"openstorage.io/auth-secret-name": "s", "repl": "2"}),
            Value::Null,
            json!({"repl": "2",
                "csi.storage.k8s.io/provisioner-secret-name": "s", "csi.storage.k8s.io/controller-publish-secret-name": "s",
                "csi.storage.k8s.io/node-publish-secret-name": "s", "csi.storage.k8s.io/node-stage-secret-name": "s",
                "csi.storage.k8s.io/controller-expand-secret-name": "s", "csi.storage.k8s.io/node-expand-secret-name": "s"}),
            Value::Null,
        ),
    ];
    for (plugin, parameters, allowed, want_parameters, want_allowed) in cases {
        let translated = plugin
            .translate_class(&class(parameters.clone(), allowed))
            .unwrap_or_else(|error| panic!("{plugin:?} {parameters}: {error}"));
        assert_eq!(
            as_json(&translated.parameters),
            want_parameters,
            "{plugin:?} {parameters}"
        );
        assert_eq!(
            as_json(&translated.allowed_topologies),
            want_allowed,
            "{plugin:?} {parameters}"
        );
        assert_eq!(
            translated.provisioner,
            plugin.csi_driver(),
            "A15: the CSI driver"
        );
    }
}

#[test]
fn zone_parameters_with_allowed_topologies_are_refused_by_the_zonal_plugins() {
    for plugin in [
        InTreePlugin::GcePd,
        InTreePlugin::AwsEbs,
        InTreePlugin::AzureDisk,
    ] {
        for key in ["zone", "Zones"] {
            let error = plugin
                .translate_class(&class(
                    json!({key: "z"}),
                    terms(&[("topology.kubernetes.io/zone", &["z"])]),
                ))
                .expect_err("refused");
            assert_eq!(
                error.to_string(),
                "cannot simultaneously set allowed topologies and zone/zones parameters"
            );
        }
    }
}

fn csi_pv(
    driver: &str,
    handle: &str,
    attributes: Value,
    affinity: &[(&str, &[&str])],
) -> PersistentVolume {
    let mut pv = json!({
        "metadata": {"name": "pvc-1"},
        "spec": {"csi": {"driver": driver, "volumeHandle": handle, "fsType": "ext4", "volumeAttributes": attributes},
                 "claimRef": {"namespace": "apps", "name": "data"}}
    });
    if !affinity.is_empty() {
        pv["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [{"matchExpressions":
            affinity.iter().map(|(key, values)| json!({"key": key, "operator": "In", "values": values})).collect::<Vec<_>>()}]}});
    }
    serde_json::from_value(pv).expect("pv")
}

/// Plugin, handle, attributes, affinity; expected source field and value, labels, affinity.
type BackTranslation = (
    InTreePlugin,
    &'static str,
    Value,
    Vec<(&'static str, &'static [&'static str])>,
    &'static str,
    Value,
    Value,
    Value,
);

#[test]
fn csi_pvs_go_back_to_their_in_tree_sources() {
    use InTreePlugin::*;
    let cases: Vec<BackTranslation> = vec![
        (
            GcePd,
            "projects/p/zones/us-central1-a/disks/pvc-1",
            json!({"partition": "2", "storage.kubernetes.io/csiProvisionerIdentity": "x"}),
            vec![("topology.gke.io/zone", &["us-central1-a"])],
            "gcePersistentDisk",
            json!({"pdName": "pvc-1", "fsType": "ext4", "partition": 2}),
            json!({"topology.kubernetes.io/zone": "us-central1-a", "topology.kubernetes.io/region": "us-central1"}),
            json!([{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-central1-a"]},
                {"key": "topology.kubernetes.io/region", "operator": "In", "values": ["us-central1"]}]),
        ),
        (
            GcePd,
            "projects/p/regions/us-central1/disks/d",
            json!({}),
            vec![("topology.gke.io/zone", &["us-central1-b", "us-central1-a"])],
            "gcePersistentDisk",
            json!({"pdName": "d", "fsType": "ext4"}),
            json!({"topology.kubernetes.io/zone": "us-central1-a__us-central1-b", "topology.kubernetes.io/region": "us-central1"}),
            json!([{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-central1-b", "us-central1-a"]},
                {"key": "topology.kubernetes.io/region", "operator": "In", "values": ["us-central1"]}]),
        ),
        (
            AwsEbs,
            "vol-1",
            json!({}),
            vec![("topology.ebs.csi.aws.com/zone", &["us-east-1a"])],
            "awsElasticBlockStore",
            json!({"volumeID": "vol-1", "fsType": "ext4"}),
            json!({"topology.kubernetes.io/zone": "us-east-1a", "topology.kubernetes.io/region": "us-east-1"}),
            json!([{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]},
                {"key": "topology.kubernetes.io/region", "operator": "In", "values": ["us-east-1"]}]),
        ),
        (
            AzureDisk,
            "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/disks/disk-1",
            json!({"cachingMode": "ReadOnly"}),
            vec![("topology.disk.csi.azure.com/zone", &["eastus-1"])],
            "azureDisk",
            json!({"diskName": "disk-1", "diskURI": "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/disks/disk-1",
                             "fsType": "ext4", "readOnly": false, "kind": "Managed", "cachingMode": "ReadOnly"}),
            Value::Null,
            json!([{"key": "topology.disk.csi.azure.com/zone", "operator": "In", "values": ["eastus-1"]}]),
        ),
        (
            AzureFile,
            "rg#account#share#pvc-1#apps",
            json!({}),
            vec![],
            "azureFile",
            json!({"shareName": "share", "secretName": "azure-storage-account-account-secret", "secretNamespace": "default"}),
            Value::Null,
            Value::Null,
        ),
        (
            Cinder,
            "c-1",
            json!({}),
            vec![("topology.cinder.csi.openstack.org/zone", &["nova"])],
            "cinder",
            json!({"volumeID": "c-1", "fsType": "ext4"}),
            json!({"topology.kubernetes.io/zone": "nova"}),
            json!([{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["nova"]}]),
        ),
        (
            VSphere,
            "id-1",
            json!({"initialvolumefilepath": "[ds] vol.vmdk"}),
            vec![
                ("topology.csi.vmware.com/zone", &["z1"]),
                ("topology.csi.vmware.com/region", &["r1"]),
            ],
            "vsphereVolume",
            json!({"volumePath": "[ds] vol.vmdk", "fsType": "ext4"}),
            json!({"topology.kubernetes.io/zone": "z1", "topology.kubernetes.io/region": "r1"}),
            json!([{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]},
                {"key": "topology.kubernetes.io/region", "operator": "In", "values": ["r1"]}]),
        ),
        (
            Portworx,
            "px-1",
            json!({}),
            vec![],
            "portworxVolume",
            json!({"volumeID": "px-1", "fsType": "ext4"}),
            Value::Null,
            Value::Null,
        ),
    ];
    for (plugin, handle, attributes, affinity, field, source, labels, expressions) in cases {
        let pv = plugin
            .to_in_tree(csi_pv(plugin.csi_driver(), handle, attributes, &affinity))
            .unwrap_or_else(|error| panic!("{plugin:?} {handle}: {error}"));
        let pv = as_json(&pv);
        assert_eq!(pv["spec"][field], source, "{plugin:?} {handle}");
        assert_eq!(pv["spec"]["csi"], Value::Null, "{plugin:?}");
        assert_eq!(pv["metadata"]["labels"], labels, "{plugin:?} {handle}");
        assert_eq!(
            pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"],
            expressions,
            "{plugin:?}"
        );
    }
}

#[test]
fn azure_file_keeps_the_resource_group_of_its_handle() {
    let pv = InTreePlugin::AzureFile
        .to_in_tree(csi_pv(
            "file.csi.azure.com",
            "rg#account#share",
            json!({}),
            &[],
        ))
        .expect("translated");
    assert_eq!(
        pv.metadata.annotations.expect("annotations")["kubernetes.io/azure-file-resource-group"],
        "rg"
    );
}

#[test]
fn back_translations_that_cannot_be_made_are_errors() {
    use InTreePlugin::*;
    let cases = [
        (
            GcePd,
            "vol-1",
            json!({}),
            vec![],
            "failed to get id components.Got: 1, wanted 6 components or more. ",
        ),
        (
            GcePd,
            "projects/p/zones/z/disks/d",
            json!({"partition": "x"}),
            vec![],
            "Failed to convert partition x to integer",
        ),
        (
            GcePd,
            "projects/p/zones/z/disks/d",
            json!({}),
            vec![("topology.gke.io/zone", &["bad"][..])],
            "failed to translate topology: zone in unexpected format, expected: {locale}-{region}-{zone}, got: bad",
        ),
        (
            GcePd,
            "projects/p/zones/z/disks/d",
            json!({}),
            vec![("other", &["x"][..])],
            "failed to translate topology: no zones specified",
        ),
        (
            AwsEbs,
            "vol-1",
            json!({}),
            vec![(
                "topology.ebs.csi.aws.com/zone",
                &["us-east-1a", "eu-west-1a"][..],
            )],
            "failed to translate topology: multiple or no regions gotten from zones, got: {\"eu-west-1\", \"us-east-1\"}",
        ),
        (
            AzureDisk,
            "not-a-uri",
            json!({}),
            vec![],
            "could not get disk name from not-a-uri",
        ),
        (
            AzureFile,
            "rg#account",
            json!({}),
            vec![],
            "error parsing volume id: \"rg#account\", should at least contain two #",
        ),
    ];
    for (plugin, handle, attributes, affinity, message) in cases {
        let error = plugin
            .to_in_tree(csi_pv(plugin.csi_driver(), handle, attributes, &affinity))
            .expect_err(handle);
        assert_eq!(error.to_string(), message, "{plugin:?} {handle}");
    }
    let no_csi = PersistentVolume::default();
    assert_eq!(
        InTreePlugin::Portworx.to_in_tree(no_csi),
        Err(MigrationError::NoCsiSource)
    );
}

fn in_tree_pv(source: Value, labels: Value) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": "pv-1", "labels": labels, "annotations": {"kubernetes.io/azure-file-resource-group": "rg"}},
        "spec": source,
    }))
    .expect("pv")
}

#[test]
fn in_tree_pvs_get_the_handles_of_their_csi_drivers() {
    use InTreePlugin::*;
    let gce = json!({"gcePersistentDisk": {"pdName": "disk"}});
    let cases = [
        (
            GcePd,
            gce.clone(),
            json!({"topology.kubernetes.io/zone": "us-central1-a"}),
            "projects/UNSPECIFIED/zones/us-central1-a/disks/disk",
        ),
        (
            GcePd,
            gce.clone(),
            json!({"failure-domain.beta.kubernetes.io/zone": "us-central1-b", "topology.kubernetes.io/zone": "x"}),
            "projects/UNSPECIFIED/zones/us-central1-b/disks/disk",
        ),
        (
            GcePd,
            gce.clone(),
            json!({"topology.kubernetes.io/zone": "us-central1-a__us-central1-b"}),
            "projects/UNSPECIFIED/regions/us-central1/disks/disk",
        ),
        (
            GcePd,
            gce,
            json!({}),
            "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/disk",
        ),
        (
            AwsEbs,
            json!({"awsElasticBlockStore": {"volumeID": "aws://us-east-1a/vol-123"}}),
            json!({}),
            "vol-123",
        ),
        (
            AwsEbs,
            json!({"awsElasticBlockStore": {"volumeID": "vol-456"}}),
            json!({}),
            "vol-456",
        ),
        (
            AzureDisk,
            json!({"azureDisk": {"diskName": "d", "diskURI": "/subscriptions/s/x", "kind": "managed"}}),
            json!({}),
            "/subscriptions/s/x",
        ),
        (
            AzureFile,
            json!({"azureFile": {"shareName": "share", "secretName": "azure-storage-account-acct-secret"},
                           "claimRef": {"namespace": "apps"}}),
            json!({}),
            "rg#acct#share#pv-1#apps",
        ),
        (
            AzureFile,
            json!({"azureFile": {"shareName": "share", "secretName": "plain", "secretNamespace": "ns"}}),
            json!({}),
            "rg#plain#share#pv-1#ns",
        ),
        (
            Cinder,
            json!({"cinder": {"volumeID": "c-1"}}),
            json!({}),
            "c-1",
        ),
        (
            VSphere,
            json!({"vsphereVolume": {"volumePath": "[ds] v.vmdk"}}),
            json!({}),
            "[ds] v.vmdk",
        ),
        (
            Portworx,
            json!({"portworxVolume": {"volumeID": "px"}}),
            json!({}),
            "px",
        ),
    ];
    for (plugin, source, labels, handle) in cases {
        let pv = in_tree_pv(source.clone(), labels);
        assert!(plugin.has_source(&pv), "{plugin:?}");
        assert_eq!(
            plugin.csi_handle(&pv).as_deref(),
            Ok(handle),
            "{plugin:?} {source}"
        );
    }
}

#[test]
fn in_tree_pvs_without_a_handle_are_errors() {
    use InTreePlugin::*;
    let cases = [
        (
            GcePd,
            json!({"gcePersistentDisk": {"pdName": "d"}}),
            json!({"topology.kubernetes.io/zone": "a__b"}),
            "failed to get region from zones: zone in unexpected format, expected: {locale}-{region}-{zone}, got: a",
        ),
        (
            AwsEbs,
            json!({"awsElasticBlockStore": {"volumeID": "aws://zone/bad"}}),
            json!({}),
            "Invalid format for AWS volume (aws://zone/bad)",
        ),
        (
            AzureDisk,
            json!({"azureDisk": {"diskName": "d", "diskURI": "u", "kind": "Shared"}}),
            json!({}),
            "kind(Shared) is not supported in csi migration",
        ),
        (
            AzureFile,
            json!({"azureFile": {"shareName": "s", "secretName": "x"}}),
            json!({}),
            "could not find a secret namespace in PersistentVolumeSource or ClaimRef",
        ),
        (
            Cinder,
            json!({"portworxVolume": {"volumeID": "px"}}),
            json!({}),
            "the PV has no cinder source",
        ),
    ];
    for (plugin, source, labels, message) in cases {
        let error = plugin
            .csi_handle(&in_tree_pv(source, labels))
            .expect_err("error");
        assert_eq!(error.to_string(), message, "{plugin:?}");
    }
}

fn holds(plugin: InTreePlugin, source: Value, labels: Value, handle: &str) -> Holding {
    plugin.holds(&in_tree_pv(source, labels), handle)
}

#[test]
fn an_in_tree_pv_holds_the_volume_its_source_translates_to() {
    use Holding::{DoesNotHold, Holds};
    use InTreePlugin::*;
    let gce = json!({"gcePersistentDisk": {"pdName": "disk"}});
    let zone = json!({"topology.kubernetes.io/zone": "z"});
    let regional = json!({"topology.kubernetes.io/zone": "us-east1-b__us-east1-c"});
    let ebs = json!({"awsElasticBlockStore": {"volumeID": "aws://z/vol-1"}});
    let azure_disk = json!({"azureDisk": {"diskName": "d", "diskURI": "/subscriptions/S/resourceGroups/G/providers/Microsoft.Compute/disks/d"}});
    let azure_file = json!({"azureFile": {"shareName": "share", "secretName": "azure-storage-account-acct-secret"}});
    let cases = [
        // Without labels (as in the cache) the project and the zone are any, even a region.
        (
            GcePd,
            &gce,
            json!({}),
            "projects/p/zones/z/disks/disk",
            Holds,
        ),
        (
            GcePd,
            &gce,
            json!({}),
            "projects/p/regions/r/disks/disk",
            Holds,
        ),
        (
            GcePd,
            &gce,
            json!({}),
            "projects/p/zones/z/disks/other",
            DoesNotHold,
        ),
        (
            GcePd,
            &gce,
            zone.clone(),
            "projects/p/zones/z/disks/disk",
            Holds,
        ),
        (
            GcePd,
            &gce,
            zone.clone(),
            "projects/p/zones/y/disks/disk",
            DoesNotHold,
        ),
        (
            GcePd,
            &gce,
            regional.clone(),
            "projects/p/regions/us-east1/disks/disk",
            Holds,
        ),
        (
            GcePd,
            &gce,
            regional,
            "projects/p/zones/us-east1-b/disks/disk",
            DoesNotHold,
        ),
        // A handle no in-tree source could come from.
        (GcePd, &gce, json!({}), "garbage", DoesNotHold),
        (GcePd, &gce, json!({}), "disk", DoesNotHold),
        (AwsEbs, &ebs, json!({}), "vol-1", Holds),
        (AwsEbs, &ebs, json!({}), "vol-2", DoesNotHold),
        (AwsEbs, &gce, json!({}), "disk", DoesNotHold),
        (
            AzureDisk,
            &azure_disk,
            json!({}),
            "/subscriptions/S/resourcegroups/g/providers/Microsoft.Compute/disks/d",
            Holds,
        ),
        (
            AzureDisk,
            &azure_disk,
            json!({}),
            "/subscriptions/S/resourceGroups/G/providers/Microsoft.Compute/disks/e",
            DoesNotHold,
        ),
        (
            AzureFile,
            &azure_file,
            json!({}),
            "rg#acct#share#pv#uuid#ns",
            Holds,
        ),
        (AzureFile, &azure_file, json!({}), "rg#ACCT#Share", Holds),
        (
            AzureFile,
            &azure_file,
            json!({}),
            "rg#acct#other#pv#ns",
            DoesNotHold,
        ),
        (
            AzureFile,
            &azure_file,
            json!({}),
            "rg#other#share#pv#ns",
            DoesNotHold,
        ),
        (AzureFile, &azure_file, json!({}), "rg#acct", DoesNotHold),
    ];
    for (plugin, source, labels, handle, expected) in cases {
        assert_eq!(
            holds(plugin, source.clone(), labels, handle),
            expected,
            "{plugin:?} {handle}"
        );
    }
}

/// Issue #31, hole 3: an azureFile PV with `secretName: azure-secret` (the form Microsoft's
/// docs use) names no account, so it cannot be translated; but its share is known, and a
/// volume of another share is not its.
#[test]
fn an_untranslatable_in_tree_pv_does_not_hold_a_volume_its_known_parts_exclude() {
    let cases = [
        (
            InTreePlugin::AzureFile,
            json!({"azureFile": {"shareName": "share", "secretName": "azure-secret"}}),
            "rg#acct#other-share#pvc-1#ns",
            false,
        ),
        (
            InTreePlugin::AzureFile,
            json!({"azureFile": {"shareName": "share", "secretName": "azure-secret"}}),
            "rg#acct#SHARE#pvc-1#ns",
            true,
        ),
        (
            InTreePlugin::AwsEbs,
            json!({"awsElasticBlockStore": {"volumeID": "aws://z/not-a-volume"}}),
            "vol-1",
            false,
        ),
        (
            InTreePlugin::AwsEbs,
            json!({"awsElasticBlockStore": {"volumeID": "aws://z/x/vol-1"}}),
            "vol-1",
            true,
        ),
        (
            InTreePlugin::AzureDisk,
            json!({"azureDisk": {"diskName": "d", "diskURI": "/subscriptions/s/disks/d", "kind": "Shared"}}),
            "/subscriptions/s/disks/other",
            false,
        ),
        (
            InTreePlugin::AzureDisk,
            json!({"azureDisk": {"diskName": "d", "diskURI": "/subscriptions/s/disks/d", "kind": "Shared"}}),
            "/subscriptions/s/disks/D",
            true,
        ),
    ];
    for (plugin, source, handle, unknown) in cases {
        let holding = holds(plugin, source, json!({}), handle);
        if unknown {
            assert!(
                matches!(holding, Holding::Unknown(_)),
                "{plugin:?} {handle}"
            );
        } else {
            assert_eq!(holding, Holding::DoesNotHold, "{plugin:?} {handle}");
        }
    }
    let region = json!({"topology.kubernetes.io/zone": "a__b"});
    let disk = json!({"gcePersistentDisk": {"pdName": "disk"}});
    assert_eq!(
        holds(
            InTreePlugin::GcePd,
            disk.clone(),
            region.clone(),
            "projects/p/zones/z/disks/other"
        ),
        Holding::DoesNotHold
    );
    assert!(matches!(
        holds(
            InTreePlugin::GcePd,
            disk,
            region,
            "projects/p/zones/z/disks/disk"
        ),
        Holding::Unknown(_)
    ));
}

#[test]
fn two_pvs_without_a_volume_identity_are_not_the_same_volume() {
    let unparsable = in_tree_pv(
        json!({"awsElasticBlockStore": {"volumeID": "aws://z/not-a-volume"}}),
        json!({}),
    );
    assert!(!same_in_tree_volume(&unparsable, &unparsable.clone()));
    let ebs = in_tree_pv(
        json!({"awsElasticBlockStore": {"volumeID": "aws://z/vol-1"}}),
        json!({}),
    );
    assert!(same_in_tree_volume(&ebs, &ebs.clone()));
}

#[test]
fn an_azure_disk_handle_of_any_bytes_is_an_error_not_a_panic() {
    // Byte 4 falls inside a character in the first two.
    for handle in ["abcé/disks/d", "htté://x/vhds/d", "ééé"] {
        let pv = csi_pv("disk.csi.azure.com", handle, json!({}), &[]);
        let error = InTreePlugin::AzureDisk.to_in_tree(pv).expect_err(handle);
        assert_eq!(error, MigrationError::AzureDiskUri(handle.to_owned()));
    }
}
