//! Secret references from StorageClass parameters: which keys name which secret, the
//! `${...}` templates in them, and the checks on what they resolve to.
//!
//! Templates expand like a shell (`$VAR` and `${VAR}`, Go's `os.Expand`), with one deliberate
//! difference: a malformed `${}` or an unterminated `${` is an error here, where upstream
//! silently drops the characters and goes on with whatever is left.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use k8s_openapi::api::core::v1::Secret;
use thiserror::Error;

use super::validation::{dns1123_label_problem, dns1123_subdomain_problem};

/// The secrets a StorageClass can reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SecretKind {
    /// Sent with CreateVolume and DeleteVolume; the only one whose content the sidecar reads.
    Provisioner,
    ControllerPublish,
    NodeStage,
    NodePublish,
    ControllerExpand,
    NodeExpand,
    /// Recorded in PV annotations for external-resizer.
    ControllerModify,
}

impl SecretKind {
    /// Every kind, in the order upstream resolves them.
    pub const ALL: [SecretKind; 7] = [
        SecretKind::Provisioner,
        SecretKind::ControllerPublish,
        SecretKind::NodeStage,
        SecretKind::NodePublish,
        SecretKind::ControllerExpand,
        SecretKind::NodeExpand,
        SecretKind::ControllerModify,
    ];

    fn keys(self) -> KeySet {
        let (label, name, namespace, deprecated) = match self {
            Self::Provisioner => (
                "Provisioner",
                "csi.storage.k8s.io/provisioner-secret-name",
                "csi.storage.k8s.io/provisioner-secret-namespace",
                Some(("csiProvisionerSecretName", "csiProvisionerSecretNamespace")),
            ),
            Self::ControllerPublish => (
                "ControllerPublish",
                "csi.storage.k8s.io/controller-publish-secret-name",
                "csi.storage.k8s.io/controller-publish-secret-namespace",
                Some((
                    "csiControllerPublishSecretName",
                    "csiControllerPublishSecretNamespace",
                )),
            ),
            Self::NodeStage => (
                "NodeStage",
                "csi.storage.k8s.io/node-stage-secret-name",
                "csi.storage.k8s.io/node-stage-secret-namespace",
                Some(("csiNodeStageSecretName", "csiNodeStageSecretNamespace")),
            ),
            Self::NodePublish => (
                "NodePublish",
                "csi.storage.k8s.io/node-publish-secret-name",
                "csi.storage.k8s.io/node-publish-secret-namespace",
                Some(("csiNodePublishSecretName", "csiNodePublishSecretNamespace")),
            ),
            Self::ControllerExpand => (
                "ControllerExpand",
                "csi.storage.k8s.io/controller-expand-secret-name",
                "csi.storage.k8s.io/controller-expand-secret-namespace",
                None,
            ),
            Self::NodeExpand => (
                "NodeExpand",
                "csi.storage.k8s.io/node-expand-secret-name",
                "csi.storage.k8s.io/node-expand-secret-namespace",
                None,
            ),
            Self::ControllerModify => (
                "ControllerModify",
                "csi.storage.k8s.io/controller-modify-secret-name",
                "csi.storage.k8s.io/controller-modify-secret-namespace",
                None,
            ),
        };
        KeySet {
            label,
            name,
            namespace,
            deprecated,
        }
    }
}

impl fmt::Display for SecretKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.keys().label)
    }
}

/// The parameter keys of one secret.
struct KeySet {
    /// The name upstream's error texts use.
    label: &'static str,
    name: &'static str,
    namespace: &'static str,
    /// Pre-`csi.storage.k8s.io/` spellings `(name, namespace)`, still honoured.
    deprecated: Option<(&'static str, &'static str)>,
}

/// Fallback for every kind whose own keys are absent.
const DEFAULT_KEYS: KeySet = KeySet {
    label: "Default",
    name: "csi.storage.k8s.io/secret-name",
    namespace: "csi.storage.k8s.io/secret-namespace",
    deprecated: None,
};

/// Every reserved-prefix secret key, for stripping them from the parameters.
pub(super) fn reserved_secret_keys() -> impl Iterator<Item = &'static str> {
    SecretKind::ALL
        .into_iter()
        .map(SecretKind::keys)
        .chain([DEFAULT_KEYS])
        .flat_map(|keys| [keys.name, keys.namespace])
}

/// The pre-`csi.storage.k8s.io/` secret keys, still honoured but deprecated.
pub(super) fn deprecated_secret_keys() -> impl Iterator<Item = &'static str> {
    SecretKind::ALL
        .into_iter()
        .filter_map(|kind| kind.keys().deprecated)
        .flat_map(|(name, namespace)| [name, namespace])
}

/// A resolved secret reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SecretRef {
    pub name: String,
    pub namespace: String,
}

/// The resolved reference of every kind; `None` where the class configures none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretRefs {
    /// The one Secret the executor GETs before CreateVolume.
    pub provisioner: Option<SecretRef>,
    pub controller_publish: Option<SecretRef>,
    pub node_stage: Option<SecretRef>,
    pub node_publish: Option<SecretRef>,
    pub controller_expand: Option<SecretRef>,
    pub node_expand: Option<SecretRef>,
    pub controller_modify: Option<SecretRef>,
}

/// The values templates can use.
#[derive(Debug, Clone, Copy)]
pub struct TemplateContext<'a> {
    pub pv_name: &'a str,
    pub pvc_name: &'a str,
    pub pvc_namespace: &'a str,
    /// `None` at deletion time, where only the claim's name and namespace are known.
    pub pvc_annotations: Option<&'a BTreeMap<String, String>>,
}

/// Why a secret reference cannot be resolved. `kind == None` means the default keys.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SecretError {
    #[error(
        "failed to get {}name and namespace template from params: {} secrets specified in parameters with both \"csi\" and \"csi.storage.k8s.io/\" keys",
        scope(.kind), label(.kind)
    )]
    DeprecatedAndNewKeys { kind: Option<SecretKind> },
    #[error(
        "failed to get {}name and namespace template from params: either name and namespace for {} secrets specified, Both must be specified",
        scope(.kind), label(.kind)
    )]
    NameOrNamespaceOnly { kind: Option<SecretKind> },
    #[error(
        "failed to get {}name and namespace template from params: {} secrets specified in parameters but value of either namespace or name is empty",
        scope(.kind), label(.kind)
    )]
    EmptyValue { kind: Option<SecretKind> },
    #[error("error resolving value {template:?}: invalid tokens: {}", quoted_list(.tokens))]
    InvalidTokens {
        template: String,
        tokens: Vec<String>,
    },
    #[error("error resolving value {template:?}: empty token \"${{}}\" at offset {offset}")]
    EmptyToken { template: String, offset: usize },
    #[error("error resolving value {template:?}: unterminated token \"${{\" at offset {offset}")]
    UnterminatedToken { template: String, offset: usize },
    #[error("{template:?} resolved to {resolved:?} which is not a valid namespace name")]
    ResolvedToInvalidNamespace { template: String, resolved: String },
    #[error("{template:?} is not a valid namespace name")]
    InvalidNamespace { template: String },
    #[error("{template:?} resolved to {resolved:?} which is not a valid secret name")]
    ResolvedToInvalidName { template: String, resolved: String },
    #[error("{template:?} is not a valid secret name")]
    InvalidName { template: String },
    /// CSI secrets are protobuf strings; upstream would forward the bytes unchecked.
    #[error("secret {namespace}/{name}: value of key {key:?} is not valid UTF-8")]
    NotUtf8 {
        namespace: String,
        name: String,
        key: String,
    },
}

fn scope(kind: &Option<SecretKind>) -> &'static str {
    if kind.is_some() { "" } else { "default " }
}

fn label(kind: &Option<SecretKind>) -> &'static str {
    kind.map_or(DEFAULT_KEYS.label, |kind| kind.keys().label)
}

/// Go's `%q` of a string list: `["a" "b"]`.
fn quoted_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|item| format!("{item:?}")).collect();
    format!("[{}]", quoted.join(" "))
}

/// All references of a class, in upstream's order (the first error wins).
pub fn resolve_secret_refs(
    parameters: &BTreeMap<String, String>,
    context: &TemplateContext<'_>,
) -> Result<SecretRefs, SecretError> {
    let resolve = |kind| resolve_secret_ref(kind, parameters, context);
    Ok(SecretRefs {
        provisioner: resolve(SecretKind::Provisioner)?,
        controller_publish: resolve(SecretKind::ControllerPublish)?,
        node_stage: resolve(SecretKind::NodeStage)?,
        node_publish: resolve(SecretKind::NodePublish)?,
        controller_expand: resolve(SecretKind::ControllerExpand)?,
        node_expand: resolve(SecretKind::NodeExpand)?,
        controller_modify: resolve(SecretKind::ControllerModify)?,
    })
}

/// The reference of one kind: its own keys, else the default keys, else `None`; templates
/// resolved and the results checked as namespace (DNS-1123 label) and Secret name (DNS-1123
/// subdomain).
pub fn resolve_secret_ref(
    kind: SecretKind,
    parameters: &BTreeMap<String, String>,
    context: &TemplateContext<'_>,
) -> Result<Option<SecretRef>, SecretError> {
    let templates = match templates(&kind.keys(), parameters, Some(kind))? {
        Some(found) => Some(found),
        None => templates(&DEFAULT_KEYS, parameters, None)?,
    };
    let Some((name_template, namespace_template)) = templates else {
        return Ok(None);
    };

    // The namespace may only depend on values the claim's author does not control.
    let namespace = expand(namespace_template, |token| match token {
        "pv.name" => Some(context.pv_name),
        "pvc.namespace" => Some(context.pvc_namespace),
        _ => None,
    })?;
    if dns1123_label_problem(&namespace).is_some() {
        return Err(if namespace == namespace_template {
            SecretError::InvalidNamespace {
                template: namespace_template.to_owned(),
            }
        } else {
            SecretError::ResolvedToInvalidNamespace {
                template: namespace_template.to_owned(),
                resolved: namespace,
            }
        });
    }

    let name = expand(name_template, |token| match token {
        "pv.name" => Some(context.pv_name),
        "pvc.name" => Some(context.pvc_name),
        "pvc.namespace" => Some(context.pvc_namespace),
        _ => {
            let key = token
                .strip_prefix("pvc.annotations['")?
                .strip_suffix("']")?;
            context.pvc_annotations?.get(key).map(String::as_str)
        }
    })?;
    if dns1123_subdomain_problem(&name).is_some() {
        return Err(if name == name_template {
            SecretError::InvalidName {
                template: name_template.to_owned(),
            }
        } else {
            SecretError::ResolvedToInvalidName {
                template: name_template.to_owned(),
                resolved: name,
            }
        });
    }
    Ok(Some(SecretRef { name, namespace }))
}

/// The `(name, namespace)` templates of one key set, `None` when neither is given.
fn templates<'p>(
    keys: &KeySet,
    parameters: &'p BTreeMap<String, String>,
    kind: Option<SecretKind>,
) -> Result<Option<(&'p str, &'p str)>, SecretError> {
    let lookup = |new: &str, deprecated: Option<&str>| -> Vec<&'p str> {
        [deprecated, Some(new)]
            .into_iter()
            .flatten()
            .filter_map(|key| parameters.get(key).map(String::as_str))
            .collect()
    };
    let names = lookup(keys.name, keys.deprecated.map(|(name, _)| name));
    let namespaces = lookup(
        keys.namespace,
        keys.deprecated.map(|(_, namespace)| namespace),
    );
    match (names.as_slice(), namespaces.as_slice()) {
        ([], []) => Ok(None),
        ([name], [namespace]) if name.is_empty() || namespace.is_empty() => {
            Err(SecretError::EmptyValue { kind })
        }
        ([name], [namespace]) => Ok(Some((name, namespace))),
        _ if names.len() > 1 || namespaces.len() > 1 => {
            Err(SecretError::DeprecatedAndNewKeys { kind })
        }
        _ => Err(SecretError::NameOrNamespaceOnly { kind }),
    }
}

/// Shell-style expansion of `$NAME` (ASCII alphanumerics and `_`), `$c` for one special
/// character (`*#$@!?-` or a digit) and `${anything}`. A `$` followed by nothing expandable
/// stays literal. Every unknown token is reported, sorted and once each.
fn expand<'v>(
    template: &str,
    lookup: impl Fn(&str) -> Option<&'v str>,
) -> Result<String, SecretError> {
    let bytes = template.as_bytes();
    let mut out = String::with_capacity(template.len());
    let mut unknown = BTreeSet::new();
    let mut literal_start = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'$' || i + 1 == bytes.len() {
            i += 1;
            continue;
        }
        out.push_str(&template[literal_start..i]);
        // Token boundaries are ASCII, so every slice below is on a char boundary.
        let rest = &template[i + 1..];
        let (token, width) = if rest.starts_with('{') {
            match rest.find('}') {
                Some(1) => {
                    return Err(SecretError::EmptyToken {
                        template: template.to_owned(),
                        offset: i,
                    });
                }
                Some(close) => (&rest[1..close], close + 1),
                None => {
                    return Err(SecretError::UnterminatedToken {
                        template: template.to_owned(),
                        offset: i,
                    });
                }
            }
        } else if rest.starts_with(is_special) {
            (&rest[..1], 1)
        } else {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            (&rest[..end], end)
        };
        if token.is_empty() {
            out.push('$');
        } else if let Some(value) = lookup(token) {
            out.push_str(value);
        } else {
            unknown.insert(token.to_owned());
        }
        i += 1 + width;
        literal_start = i;
    }
    out.push_str(&template[literal_start..]);
    if unknown.is_empty() {
        Ok(out)
    } else {
        Err(SecretError::InvalidTokens {
            template: template.to_owned(),
            tokens: unknown.into_iter().collect(),
        })
    }
}

fn is_special(c: char) -> bool {
    matches!(c, '*' | '#' | '$' | '@' | '!' | '?' | '-') || c.is_ascii_digit()
}

/// The `data` of a fetched Secret as CreateVolume/DeleteVolume `secrets`.
pub fn secret_data(secret: &Secret) -> Result<HashMap<String, String>, SecretError> {
    let Some(data) = secret.data.as_ref() else {
        return Ok(HashMap::new());
    };
    data.iter()
        .map(|(key, value)| {
            let text = String::from_utf8(value.0.clone()).map_err(|_| SecretError::NotUtf8 {
                namespace: secret.metadata.namespace.clone().unwrap_or_default(),
                name: secret.metadata.name.clone().unwrap_or_default(),
                key: key.clone(),
            })?;
            Ok((key.clone(), text))
        })
        .collect()
}

#[cfg(test)]
mod tests {
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
}
