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
mod tests;
