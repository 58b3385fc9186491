use super::*;
use k8s_openapi::ByteString;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

const PROV_NAME: &str = "csi.storage.k8s.io/provisioner-secret-name";
const PROV_NS: &str = "csi.storage.k8s.io/provisioner-secret-namespace";

fn params(list: &[(&str, &str)]) -> BTreeMap<String, String> {
    list.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn annotations() -> BTreeMap<String, String> {
    params(&[("team", "blue"), ("bad", "Not_A_Name")])
}

fn resolve(kind: SecretKind, list: &[(&str, &str)]) -> Result<Option<SecretRef>, String> {
    let annotations = annotations();
    let context = TemplateContext {
        pv_name: "pvc-123",
        pvc_name: "data",
        pvc_namespace: "apps",
        pvc_annotations: Some(&annotations),
    };
    resolve_secret_ref(kind, &params(list), &context).map_err(|e| e.to_string())
}

fn provisioner(list: &[(&str, &str)]) -> Result<Option<SecretRef>, String> {
    resolve(SecretKind::Provisioner, list)
}

fn secret(name: &str, namespace: &str) -> Result<Option<SecretRef>, String> {
    Ok(Some(SecretRef {
        name: name.into(),
        namespace: namespace.into(),
    }))
}

#[test]
fn no_keys_means_no_secret() {
    assert_eq!(provisioner(&[]), Ok(None));
    assert_eq!(provisioner(&[("unrelated", "x")]), Ok(None));
}

#[test]
fn literal_name_and_namespace_are_used_as_is() {
    assert_eq!(
        provisioner(&[(PROV_NAME, "creds"), (PROV_NS, "kube-system")]),
        secret("creds", "kube-system")
    );
}

#[test]
fn deprecated_keys_still_name_the_secret() {
    assert_eq!(
        provisioner(&[
            ("csiProvisionerSecretName", "old"),
            ("csiProvisionerSecretNamespace", "ns")
        ]),
        secret("old", "ns")
    );
    assert_eq!(
        resolve(
            SecretKind::NodeStage,
            &[
                ("csiNodeStageSecretName", "stage"),
                ("csi.storage.k8s.io/node-stage-secret-namespace", "ns")
            ]
        ),
        secret("stage", "ns")
    );
}

#[test]
fn default_keys_are_the_fallback_for_every_kind() {
    let defaults = [
        ("csi.storage.k8s.io/secret-name", "shared"),
        ("csi.storage.k8s.io/secret-namespace", "ns"),
    ];
    for kind in SecretKind::ALL {
        assert_eq!(resolve(kind, &defaults), secret("shared", "ns"), "{kind}");
    }
    let mut specific = defaults.to_vec();
    specific.extend([(PROV_NAME, "mine"), (PROV_NS, "other")]);
    assert_eq!(provisioner(&specific), secret("mine", "other"));
}

#[test]
fn every_kind_reads_its_own_keys() {
    for (kind, stem) in [
        (SecretKind::ControllerPublish, "controller-publish"),
        (SecretKind::NodeStage, "node-stage"),
        (SecretKind::NodePublish, "node-publish"),
        (SecretKind::ControllerExpand, "controller-expand"),
        (SecretKind::NodeExpand, "node-expand"),
        (SecretKind::ControllerModify, "controller-modify"),
    ] {
        let name = format!("csi.storage.k8s.io/{stem}-secret-name");
        let namespace = format!("csi.storage.k8s.io/{stem}-secret-namespace");
        assert_eq!(
            resolve(kind, &[(&name, stem), (&namespace, "ns")]),
            secret(stem, "ns")
        );
        assert_eq!(provisioner(&[(&name, stem), (&namespace, "ns")]), Ok(None));
    }
}

#[test]
fn all_tokens_resolve_in_both_forms() {
    assert_eq!(
        provisioner(&[
            (PROV_NAME, "${pvc.name}-$pvc-${pvc.annotations['team']}-${pv.name}"),
            (PROV_NS, "${pvc.namespace}")
        ])
        .map_err(|e| e.to_string()),
        // `$pvc` stops at the dot and is not a token.
        Err("error resolving value \"${pvc.name}-$pvc-${pvc.annotations['team']}-${pv.name}\": invalid tokens: [\"pvc\"]".to_owned())
    );
    assert_eq!(
        provisioner(&[
            (
                PROV_NAME,
                "${pvc.name}-${pvc.annotations['team']}-${pv.name}"
            ),
            (PROV_NS, "${pvc.namespace}")
        ]),
        secret("data-blue-pvc-123", "apps")
    );
    assert_eq!(
        provisioner(&[
            (PROV_NAME, "s-${pvc.namespace}"),
            (PROV_NS, "ns-${pv.name}")
        ]),
        secret("s-apps", "ns-pvc-123")
    );
}

#[test]
fn lone_or_trailing_dollar_stays_literal_and_then_fails_validation() {
    assert_eq!(
        provisioner(&[(PROV_NAME, "creds$"), (PROV_NS, "ns")]),
        Err("\"creds$\" is not a valid secret name".to_owned())
    );
    assert_eq!(
        provisioner(&[(PROV_NAME, "a$.b"), (PROV_NS, "ns")]),
        Err("\"a$.b\" is not a valid secret name".to_owned())
    );
}

#[test]
fn deprecated_and_new_name_keys_together_are_rejected() {
    assert_eq!(
        provisioner(&[
            ("csiProvisionerSecretName", "a"),
            (PROV_NAME, "b"),
            (PROV_NS, "ns")
        ]),
        Err("failed to get name and namespace template from params: Provisioner secrets specified in parameters with both \"csi\" and \"csi.storage.k8s.io/\" keys".to_owned())
    );
}

#[test]
fn deprecated_and_new_namespace_keys_together_are_rejected() {
    assert_eq!(
        resolve(
            SecretKind::NodePublish,
            &[
                ("csi.storage.k8s.io/node-publish-secret-name", "a"),
                ("csiNodePublishSecretNamespace", "ns"),
                ("csi.storage.k8s.io/node-publish-secret-namespace", "ns")
            ]
        ),
        Err("failed to get name and namespace template from params: NodePublish secrets specified in parameters with both \"csi\" and \"csi.storage.k8s.io/\" keys".to_owned())
    );
}

#[test]
fn name_without_namespace_is_rejected() {
    assert_eq!(
        provisioner(&[(PROV_NAME, "creds")]),
        Err("failed to get name and namespace template from params: either name and namespace for Provisioner secrets specified, Both must be specified".to_owned())
    );
}

#[test]
fn namespace_without_name_is_rejected() {
    assert_eq!(
        resolve(
            SecretKind::ControllerExpand,
            &[("csi.storage.k8s.io/controller-expand-secret-namespace", "ns")]
        ),
        Err("failed to get name and namespace template from params: either name and namespace for ControllerExpand secrets specified, Both must be specified".to_owned())
    );
}

#[test]
fn empty_name_or_namespace_value_is_rejected() {
    let expected = Err("failed to get name and namespace template from params: Provisioner secrets specified in parameters but value of either namespace or name is empty".to_owned());
    assert_eq!(provisioner(&[(PROV_NAME, ""), (PROV_NS, "ns")]), expected);
    assert_eq!(
        provisioner(&[(PROV_NAME, "creds"), (PROV_NS, "")]),
        expected
    );
}

#[test]
fn bad_default_keys_are_reported_as_default() {
    assert_eq!(
        provisioner(&[("csi.storage.k8s.io/secret-name", "x")]),
        Err("failed to get default name and namespace template from params: either name and namespace for Default secrets specified, Both must be specified".to_owned())
    );
    assert_eq!(
        resolve(
            SecretKind::NodeExpand,
            &[
                ("csi.storage.k8s.io/secret-name", ""),
                ("csi.storage.k8s.io/secret-namespace", "ns")
            ]
        ),
        Err("failed to get default name and namespace template from params: Default secrets specified in parameters but value of either namespace or name is empty".to_owned())
    );
}

#[test]
fn unknown_tokens_are_listed_sorted_and_once() {
    assert_eq!(
        provisioner(&[(PROV_NAME, "${zeta}-${pv.uid}-${zeta}"), (PROV_NS, "ns")]),
        Err("error resolving value \"${zeta}-${pv.uid}-${zeta}\": invalid tokens: [\"pv.uid\" \"zeta\"]".to_owned())
    );
}

#[test]
fn shell_variables_and_special_parameters_are_unknown_tokens() {
    assert_eq!(
        provisioner(&[(PROV_NAME, "$HOME$1$$"), (PROV_NS, "ns")]),
        Err(
            "error resolving value \"$HOME$1$$\": invalid tokens: [\"$\" \"1\" \"HOME\"]"
                .to_owned()
        )
    );
}

#[test]
fn claim_controlled_tokens_are_refused_in_the_namespace() {
    assert_eq!(
        provisioner(&[(PROV_NAME, "creds"), (PROV_NS, "${pvc.name}")]),
        Err("error resolving value \"${pvc.name}\": invalid tokens: [\"pvc.name\"]".to_owned())
    );
    assert_eq!(
        provisioner(&[(PROV_NAME, "creds"), (PROV_NS, "${pvc.annotations['team']}")]),
        Err("error resolving value \"${pvc.annotations['team']}\": invalid tokens: [\"pvc.annotations['team']\"]".to_owned())
    );
}

#[test]
fn annotation_token_for_a_missing_annotation_is_unknown() {
    assert_eq!(
        provisioner(&[(PROV_NAME, "${pvc.annotations['absent']}"), (PROV_NS, "ns")]),
        Err("error resolving value \"${pvc.annotations['absent']}\": invalid tokens: [\"pvc.annotations['absent']\"]".to_owned())
    );
}

#[test]
fn empty_braces_are_rejected_instead_of_silently_dropped() {
    assert_eq!(
        provisioner(&[(PROV_NAME, "a${}b"), (PROV_NS, "ns")]),
        Err("error resolving value \"a${}b\": empty token \"${}\" at offset 1".to_owned())
    );
}

#[test]
fn unterminated_braces_are_rejected_instead_of_silently_dropped() {
    assert_eq!(
        provisioner(&[(PROV_NAME, "creds"), (PROV_NS, "ns-${pv.name")]),
        Err(
            "error resolving value \"ns-${pv.name\": unterminated token \"${\" at offset 3"
                .to_owned()
        )
    );
}

#[test]
fn namespace_resolving_to_an_invalid_label_is_rejected() {
    assert_eq!(
        provisioner(&[(PROV_NAME, "creds"), (PROV_NS, "${pv.name}.x")]),
        Err(
            "\"${pv.name}.x\" resolved to \"pvc-123.x\" which is not a valid namespace name"
                .to_owned()
        )
    );
    assert_eq!(
        provisioner(&[(PROV_NAME, "creds"), (PROV_NS, "Kube-System")]),
        Err("\"Kube-System\" is not a valid namespace name".to_owned())
    );
    let long = "n".repeat(64);
    assert_eq!(
        provisioner(&[(PROV_NAME, "creds"), (PROV_NS, &long)]),
        Err(format!("\"{long}\" is not a valid namespace name"))
    );
}

#[test]
fn name_resolving_to_an_invalid_subdomain_is_rejected() {
    assert_eq!(
        provisioner(&[(PROV_NAME, "${pvc.annotations['bad']}"), (PROV_NS, "ns")]),
        Err("\"${pvc.annotations['bad']}\" resolved to \"Not_A_Name\" which is not a valid secret name".to_owned())
    );
    assert_eq!(
        provisioner(&[(PROV_NAME, "my_secret"), (PROV_NS, "ns")]),
        Err("\"my_secret\" is not a valid secret name".to_owned())
    );
}

#[test]
fn deletion_time_context_without_annotations_cannot_use_annotation_tokens() {
    let context = TemplateContext {
        pv_name: "pvc-123",
        pvc_name: "data",
        pvc_namespace: "apps",
        pvc_annotations: None,
    };
    let parameters = params(&[(PROV_NAME, "${pvc.annotations['team']}"), (PROV_NS, "ns")]);
    assert_eq!(
        resolve_secret_ref(SecretKind::Provisioner, &parameters, &context)
            .map_err(|e| e.to_string()),
        Err("error resolving value \"${pvc.annotations['team']}\": invalid tokens: [\"pvc.annotations['team']\"]".to_owned())
    );
}

#[test]
fn all_kinds_resolve_together_and_the_first_error_wins() {
    let annotations = annotations();
    let context = TemplateContext {
        pv_name: "pv",
        pvc_name: "c",
        pvc_namespace: "ns",
        pvc_annotations: Some(&annotations),
    };
    let parameters = params(&[
        (PROV_NAME, "p"),
        (PROV_NS, "ns"),
        ("csi.storage.k8s.io/node-stage-secret-name", "s"),
        ("csi.storage.k8s.io/node-stage-secret-namespace", "ns"),
    ]);
    let refs = resolve_secret_refs(&parameters, &context);
    let some = |name: &str| {
        Some(SecretRef {
            name: name.into(),
            namespace: "ns".into(),
        })
    };
    assert_eq!(
        refs,
        Ok(SecretRefs {
            provisioner: some("p"),
            node_stage: some("s"),
            ..SecretRefs::default()
        })
    );
    let broken = params(&[
        (PROV_NAME, "p"),
        ("csi.storage.k8s.io/node-expand-secret-name", "x"),
    ]);
    assert_eq!(
        resolve_secret_refs(&broken, &context).map_err(|e| e.to_string()),
        Err("failed to get name and namespace template from params: either name and namespace for Provisioner secrets specified, Both must be specified".to_owned())
    );
}

#[test]
fn arbitrary_templates_never_panic() {
    let alphabet: Vec<char> = "${}'[]a.p-v_1* \u{e9}".chars().collect();
    let mut state: u64 = 3;
    let mut next = || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) as usize
    };
    for _ in 0..50_000 {
        let len = next() % 12;
        let template: String = (0..len)
            .map(|_| alphabet[next() % alphabet.len()])
            .collect();
        let _ = provisioner(&[(PROV_NAME, &template), (PROV_NS, &template)]);
    }
}

#[test]
fn reserved_secret_keys_cover_every_kind_and_the_default() {
    let keys: Vec<&str> = reserved_secret_keys().collect();
    assert_eq!(keys.len(), 16);
    assert!(keys.contains(&"csi.storage.k8s.io/secret-namespace"));
    assert!(keys.contains(&"csi.storage.k8s.io/controller-modify-secret-name"));
    assert!(keys.iter().all(|k| k.starts_with("csi.storage.k8s.io/")));
}

#[test]
fn secret_data_becomes_strings_and_rejects_non_utf8() {
    let mut secret = Secret {
        metadata: ObjectMeta {
            name: Some("creds".into()),
            namespace: Some("ns".into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "password".to_owned(),
            ByteString(b"hunter2".to_vec()),
        )])),
        ..Secret::default()
    };
    assert_eq!(
        secret_data(&secret),
        Ok(HashMap::from([(
            "password".to_owned(),
            "hunter2".to_owned()
        )]))
    );
    secret.data = Some(BTreeMap::from([(
        "key".to_owned(),
        ByteString(vec![0xff, 0xfe]),
    )]));
    assert_eq!(
        secret_data(&secret).map_err(|e| e.to_string()),
        Err("secret ns/creds: value of key \"key\" is not valid UTF-8".to_owned())
    );
    assert_eq!(secret_data(&Secret::default()), Ok(HashMap::new()));
}
