use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::fixtures::{ClassBuilder, PvcBuilder, caps, config};
use crate::plan::plan_provision;
use crate::settings::ProvisionerConfig;

fn map(list: &[(&str, &str)]) -> BTreeMap<String, String> {
    list.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn allow(list: &str) -> KeyAllowList {
    KeyAllowList::parse(list).expect("a valid list")
}

#[test]
fn a_list_holds_exact_keys_and_prefixes() {
    let list = allow("team,example.com/cost-center,billing.example.com/*,env-*");
    assert!(list.allows("team"));
    assert!(list.allows("example.com/cost-center"));
    assert!(list.allows("billing.example.com/owner"));
    assert!(list.allows("env-stage"));
    assert!(!list.allows("teams"));
    assert!(!list.allows("example.com/cost"));
    assert!(!list.allows("other.example.com/owner"));
    assert!(!list.allows("env"));
    // Keys are case-sensitive, as in the API.
    assert!(!list.allows("Team"));
}

#[test]
fn the_empty_string_allows_nothing_and_lists_add_up() {
    let empty = allow("");
    assert!(empty.is_empty());
    assert!(!empty.allows(""));
    let both = allow("a").union(&allow("b*"));
    assert!(both.allows("a") && both.allows("bee") && !both.allows("c"));
}

#[test]
fn bad_entries_are_refused_with_the_reason() {
    assert_eq!(KeyAllowList::parse("*"), Err(KeyPatternError::Everything));
    assert_eq!(KeyAllowList::parse("a,,b"), Err(KeyPatternError::Empty));
    assert_eq!(KeyAllowList::parse("a,"), Err(KeyPatternError::Empty));
    assert_eq!(
        KeyAllowList::parse("team,a b").map_err(|e| e.to_string()),
        Err(
            "\"a b\" is not a Kubernetes label or annotation key: name part must consist of \
             alphanumeric characters, '-', '_' or '.', and must start and end with an \
             alphanumeric character"
                .to_owned()
        )
    );
    for bad in ["a/b/c", "-a", "/a", "a/", "ex_ample.com/a", "a*b"] {
        assert!(
            matches!(
                KeyAllowList::parse(bad),
                Err(KeyPatternError::NotAKey { .. })
            ),
            "{bad}"
        );
    }
    // A prefix must be the start of some key.
    for bad in [
        "-*",
        "a/b/*",
        "ex_ample.com/*",
        "**",
        &format!("{}*", "a".repeat(63)),
    ] {
        assert!(
            matches!(
                KeyAllowList::parse(bad),
                Err(KeyPatternError::NotAPrefix { .. })
            ),
            "{bad}"
        );
    }
}

fn lists(
    claim_labels: &str,
    claim_annotations: &str,
    namespace_labels: &str,
    namespace_annotations: &str,
) -> MetadataAllowLists {
    MetadataAllowLists {
        claim_labels: allow(claim_labels),
        claim_annotations: allow(claim_annotations),
        namespace_labels: allow(namespace_labels),
        namespace_annotations: allow(namespace_annotations),
    }
}

#[test]
fn only_listed_claim_annotations_that_are_present_become_parameters() {
    let pvc = PvcBuilder::new()
        .annotation("example.com/cost-center", "42")
        .annotation("example.com/secret-ish", "no")
        .annotation("team", "storage")
        .build();
    let parameters = claim_metadata_parameters(
        &pvc,
        &lists("", "example.com/cost-center,team,absent", "", ""),
    );
    assert_eq!(
        parameters,
        HashMap::from([
            (
                "csi.storage.k8s.io/pvc/annotations/example.com/cost-center".to_owned(),
                "42".to_owned()
            ),
            (
                "csi.storage.k8s.io/pvc/annotations/team".to_owned(),
                "storage".to_owned()
            ),
        ])
    );
    assert!(claim_metadata_parameters(&pvc, &MetadataAllowLists::default()).is_empty());
}

#[test]
fn namespace_labels_and_annotations_get_upstreams_parameter_names() {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some("apps".to_owned()),
            labels: Some(map(&[
                ("team", "storage"),
                ("kubernetes.io/metadata.name", "apps"),
                ("tier.example.com/level", "gold"),
            ])),
            annotations: Some(map(&[("owner", "ops"), ("note", "private")])),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    let lists = lists("", "", "team,tier.example.com/*", "owner");
    assert!(lists.needs_namespace());
    assert_eq!(
        namespace_metadata_parameters(&namespace, &lists),
        HashMap::from([
            (
                "csi.storage.k8s.io/namespace/labels/team".to_owned(),
                "storage".to_owned()
            ),
            (
                "csi.storage.k8s.io/namespace/labels/tier.example.com/level".to_owned(),
                "gold".to_owned()
            ),
            (
                "csi.storage.k8s.io/namespace/annotations/owner".to_owned(),
                "ops".to_owned()
            ),
        ])
    );
    assert!(!MetadataAllowLists::default().needs_namespace());
}

#[test]
fn listed_claim_labels_go_on_the_pv_without_overriding_its_own() {
    let mut pv = PersistentVolume {
        metadata: ObjectMeta {
            labels: Some(map(&[("topology.kubernetes.io/zone", "z1")])),
            ..ObjectMeta::default()
        },
        ..PersistentVolume::default()
    };
    let claim = map(&[
        ("team", "storage"),
        ("app", "db"),
        ("topology.kubernetes.io/zone", "claimed"),
        ("cost.example.com/center", "42"),
    ]);
    let lists = lists(
        "team,topology.kubernetes.io/zone,cost.example.com/*",
        "",
        "",
        "",
    );
    assert!(lists.needs_claim_labels());
    copy_claim_labels(&mut pv, Some(&claim), &lists);
    assert_eq!(
        pv.metadata.labels,
        Some(map(&[
            ("cost.example.com/center", "42"),
            ("team", "storage"),
            ("topology.kubernetes.io/zone", "z1"),
        ]))
    );
}

#[test]
fn without_a_listed_claim_label_the_pv_is_untouched() {
    let mut pv = PersistentVolume::default();
    let claim = map(&[("app", "db")]);
    copy_claim_labels(&mut pv, Some(&claim), &lists("team", "", "", ""));
    copy_claim_labels(&mut pv, None, &lists("team", "", "", ""));
    copy_claim_labels(&mut pv, Some(&claim), &MetadataAllowLists::default());
    assert_eq!(pv.metadata.labels, None);
}

#[test]
fn the_plan_carries_the_claim_annotations_beside_the_class_and_extra_metadata() {
    let pvc = PvcBuilder::new()
        .name("data")
        .namespace("apps")
        .annotation("team", "storage")
        .annotation("other", "x")
        .build();
    let class = ClassBuilder::new().parameter("type", "ssd").build();
    let config = ProvisionerConfig {
        extra_create_metadata: true,
        metadata: lists("", "team", "", ""),
        ..config()
    };
    let plan = plan_provision(&pvc, &class, &config, &caps(), &[]).expect("plan");
    let mut keys: Vec<_> = plan.parameters.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "csi.storage.k8s.io/pv/name",
            "csi.storage.k8s.io/pvc/annotations/team",
            "csi.storage.k8s.io/pvc/name",
            "csi.storage.k8s.io/pvc/namespace",
            "type",
        ]
    );
    // Without the flags the parameters are the class's alone.
    let plain =
        plan_provision(&pvc, &class, &crate::fixtures::config(), &caps(), &[]).expect("plan");
    assert_eq!(
        plain.parameters,
        HashMap::from([("type".to_owned(), "ssd".to_owned())])
    );
}

#[test]
fn a_class_cannot_spoof_a_metadata_parameter() {
    let pvc = PvcBuilder::new().annotation("team", "storage").build();
    let class = ClassBuilder::new()
        .parameter("csi.storage.k8s.io/pvc/annotations/team", "spoofed")
        .build();
    let config = ProvisionerConfig {
        metadata: lists("", "team", "", ""),
        ..config()
    };
    assert!(plan_provision(&pvc, &class, &config, &caps(), &[]).is_err());
}
