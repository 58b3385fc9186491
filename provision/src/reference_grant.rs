//! Cross-namespace data sources: whether a ReferenceGrant in the source's namespace lets
//! claims of the claim's namespace use the source, by upstream's matching rules.

use crate::api::ReferenceGrantSpec;

use super::data_source::CLAIM_KIND;

/// The data source a claim in `claim_namespace` names in another namespace, as the grants
/// are matched against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct GrantedObject<'a> {
    /// The reference's `apiGroup`, empty when it has none (the core group).
    pub api_group: &'a str,
    pub kind: &'a str,
    pub name: &'a str,
}

/// Whether one of `grants` (those of the source's namespace) allows the claims of
/// `claim_namespace` to use `object`: the same grant must name claims of that namespace
/// among `from`, and the object's group and kind (and its name, or no name) among `to`.
pub(super) fn reference_granted(
    grants: &[ReferenceGrantSpec],
    claim_namespace: &str,
    object: GrantedObject<'_>,
) -> bool {
    grants.iter().any(|grant| {
        let from_claims = grant.from.iter().any(|from| {
            from.group.is_empty() && from.kind == CLAIM_KIND && from.namespace == claim_namespace
        });
        let to_object = grant.to.iter().any(|to| {
            to.group == object.api_group
                && to.kind == object.kind
                && to
                    .name
                    .as_deref()
                    .is_none_or(|name| name.is_empty() || name == object.name)
        });
        from_claims && to_object
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ReferenceGrantFrom, ReferenceGrantTo};

    const SNAPSHOTS: &str = "snapshot.storage.k8s.io";

    fn from(group: &str, kind: &str, namespace: &str) -> ReferenceGrantFrom {
        ReferenceGrantFrom {
            group: group.into(),
            kind: kind.into(),
            namespace: namespace.into(),
        }
    }

    fn to(group: &str, kind: &str, name: Option<&str>) -> ReferenceGrantTo {
        ReferenceGrantTo {
            group: group.into(),
            kind: kind.into(),
            name: name.map(str::to_owned),
        }
    }

    fn grant(from: Vec<ReferenceGrantFrom>, to: Vec<ReferenceGrantTo>) -> ReferenceGrantSpec {
        ReferenceGrantSpec { from, to }
    }

    fn claims_of_b() -> ReferenceGrantFrom {
        from("", CLAIM_KIND, "b")
    }

    fn snapshot(name: &str) -> GrantedObject<'_> {
        GrantedObject {
            api_group: SNAPSHOTS,
            kind: "VolumeSnapshot",
            name,
        }
    }

    fn granted(grants: &[ReferenceGrantSpec], object: GrantedObject<'_>) -> bool {
        reference_granted(grants, "b", object)
    }

    #[test]
    fn no_grant_allows_nothing() {
        assert!(!granted(&[], snapshot("snap")));
    }

    #[test]
    fn a_grant_to_every_object_of_the_kind_or_to_that_name_allows_it() {
        for name in [None, Some(""), Some("snap")] {
            let grants = [grant(
                vec![claims_of_b()],
                vec![to(SNAPSHOTS, "VolumeSnapshot", name)],
            )];
            assert!(granted(&grants, snapshot("snap")), "{name:?}");
        }
        let other_name = [grant(
            vec![claims_of_b()],
            vec![to(SNAPSHOTS, "VolumeSnapshot", Some("other"))],
        )];
        assert!(!granted(&other_name, snapshot("snap")));
    }

    #[test]
    fn from_must_be_core_claims_of_the_claims_namespace() {
        let to_snapshots = || vec![to(SNAPSHOTS, "VolumeSnapshot", None)];
        for wrong in [
            from("", CLAIM_KIND, "c"),
            from("core", CLAIM_KIND, "b"),
            from("", "Pod", "b"),
            from("", "persistentvolumeclaim", "b"),
        ] {
            let grants = [grant(vec![wrong.clone()], to_snapshots())];
            assert!(!granted(&grants, snapshot("snap")), "{wrong:?}");
        }
        // One matching entry among others is enough.
        let grants = [grant(
            vec![from("", CLAIM_KIND, "c"), claims_of_b()],
            to_snapshots(),
        )];
        assert!(granted(&grants, snapshot("snap")));
    }

    #[test]
    fn to_must_name_the_objects_group_and_kind() {
        for wrong in [
            to("", "VolumeSnapshot", None),
            to("snapshot.storage.k8s.io/v1", "VolumeSnapshot", None),
            to(SNAPSHOTS, "VolumeSnapshotContent", None),
            to(SNAPSHOTS, CLAIM_KIND, None),
        ] {
            let grants = [grant(vec![claims_of_b()], vec![wrong.clone()])];
            assert!(!granted(&grants, snapshot("snap")), "{wrong:?}");
        }
    }

    #[test]
    fn a_reference_without_api_group_needs_the_empty_group() {
        let claim = GrantedObject {
            api_group: "",
            kind: CLAIM_KIND,
            name: "src",
        };
        let core = [grant(vec![claims_of_b()], vec![to("", CLAIM_KIND, None)])];
        assert!(granted(&core, claim));
        let named = [grant(vec![claims_of_b()], vec![to("v1", CLAIM_KIND, None)])];
        assert!(!granted(&named, claim));
    }

    #[test]
    fn from_and_to_must_be_in_the_same_grant() {
        let grants = [
            grant(vec![claims_of_b()], vec![to("", CLAIM_KIND, None)]),
            grant(
                vec![from("", CLAIM_KIND, "c")],
                vec![to(SNAPSHOTS, "VolumeSnapshot", None)],
            ),
        ];
        assert!(!granted(&grants, snapshot("snap")));
        let grants = [
            grant(vec![], vec![to(SNAPSHOTS, "VolumeSnapshot", None)]),
            grant(vec![claims_of_b()], vec![]),
        ];
        assert!(!granted(&grants, snapshot("snap")));
    }
}
