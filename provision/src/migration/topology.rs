//! What the zonal plugins share: zone parameters and allowedTopologies of a class, and the
//! zone (and region) keys and labels of a PV.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    NodeSelectorRequirement, PersistentVolume, TopologySelectorLabelRequirement,
    TopologySelectorTerm,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::MigrationError;

pub const ZONE_GA: &str = "topology.kubernetes.io/zone";
pub const REGION_GA: &str = "topology.kubernetes.io/region";
pub const ZONE_BETA: &str = "failure-domain.beta.kubernetes.io/zone";
pub const REGION_BETA: &str = "failure-domain.beta.kubernetes.io/region";
/// Separates the zones of a multi-zone volume in its zone label.
pub const MULTI_ZONE_SEPARATOR: &str = "__";

/// Turns a region out of the zones of one node-selector term.
pub type RegionParser = fn(&[String]) -> Result<String, String>;

/// The class of a zonal plugin: `zone` / `zones` (comma list) parameters become
/// allowedTopologies on `csi_key` (an error with allowedTopologies of its own), the zone
/// keys of existing allowedTopologies are renamed to `csi_key`. `rename` translates the other
/// parameters. With both `zone` and `zones`, `zones` wins (the library's choice depends on Go's
/// map order).
pub fn zonal_class(
    class: &StorageClass,
    csi_key: &str,
    rename: impl Fn(&str, &str, &mut BTreeMap<String, String>),
) -> Result<StorageClass, MigrationError> {
    let mut parameters = BTreeMap::new();
    let mut zones: Option<Vec<String>> = None;
    for (key, value) in class.parameters.iter().flatten() {
        match key.to_ascii_lowercase().as_str() {
            "zone" => zones = Some(vec![value.clone()]),
            "zones" => zones = Some(value.split(',').map(str::to_owned).collect()),
            _ => rename(key, value, &mut parameters),
        }
    }
    let has_own = class
        .allowed_topologies
        .as_ref()
        .is_some_and(|terms| !terms.is_empty());
    let mut translated = class.clone();
    translated.allowed_topologies = match zones {
        Some(_) if has_own => return Err(MigrationError::ZonesWithAllowedTopologies),
        Some(values) => Some(vec![TopologySelectorTerm {
            match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
                key: csi_key.to_owned(),
                values,
            }]),
        }]),
        None => rename_allowed_zone_keys(class.allowed_topologies.as_deref(), csi_key),
    };
    translated.parameters = Some(parameters);
    Ok(translated)
}

/// A copy of `class` with `parameters`, and its allowedTopologies, if it has any, with the
/// zone keys renamed to `csi_key`: the class translation of the plugins without zone
/// parameters of their own to turn into topology.
pub fn with_parameters_and_zone_keys(
    class: &StorageClass,
    parameters: BTreeMap<String, String>,
    csi_key: &str,
) -> StorageClass {
    let mut translated = class.clone();
    translated.parameters = Some(parameters);
    if class
        .allowed_topologies
        .as_ref()
        .is_some_and(|terms| !terms.is_empty())
    {
        translated.allowed_topologies =
            rename_allowed_zone_keys(class.allowed_topologies.as_deref(), csi_key);
    }
    translated
}

/// allowedTopologies with the Kubernetes zone keys (GA and beta) renamed to `csi_key`.
pub fn rename_allowed_zone_keys(
    terms: Option<&[TopologySelectorTerm]>,
    csi_key: &str,
) -> Option<Vec<TopologySelectorTerm>> {
    let terms = terms?;
    Some(
        terms
            .iter()
            .map(|term| TopologySelectorTerm {
                match_label_expressions: term.match_label_expressions.as_ref().map(|expressions| {
                    expressions
                        .iter()
                        .map(|expression| TopologySelectorLabelRequirement {
                            key: if expression.key == ZONE_GA || expression.key == ZONE_BETA {
                                csi_key.to_owned()
                            } else {
                                expression.key.clone()
                            },
                            values: expression.values.clone(),
                        })
                        .collect()
                }),
            })
            .collect(),
    )
}

/// The PV's Kubernetes zone and region keys: GA unless the PV already uses beta ones (in its
/// node affinity first, then its labels).
pub fn kubernetes_keys(pv: &PersistentVolume) -> (&'static str, &'static str) {
    let labels = pv.metadata.labels.as_ref();
    let has_label = |key: &str| labels.is_some_and(|labels| labels.contains_key(key));
    if affinity_has_key(pv, ZONE_GA) {
        (ZONE_GA, REGION_GA)
    } else if affinity_has_key(pv, ZONE_BETA) {
        (ZONE_BETA, REGION_BETA)
    } else if has_label(ZONE_GA) {
        (ZONE_GA, REGION_GA)
    } else if has_label(ZONE_BETA) {
        (ZONE_BETA, REGION_BETA)
    } else {
        (ZONE_GA, REGION_GA)
    }
}

/// Renames `from` to `to` in every expression of the PV's required node affinity.
pub fn rename_affinity_key(pv: &mut PersistentVolume, from: &str, to: &str) {
    for expression in expressions_mut(pv) {
        if expression.key == from {
            to.clone_into(&mut expression.key);
        }
    }
}

/// The distinct values of `key` in the PV's required node affinity, sorted.
pub fn affinity_values(pv: &PersistentVolume, key: &str) -> Vec<String> {
    terms(pv)
        .iter()
        .flat_map(|term| term.match_expressions.iter().flatten())
        .filter(|expression| expression.key == key)
        .flat_map(|expression| expression.values.iter().flatten().cloned())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// The CSI zone key of a PV's node affinity renamed to the Kubernetes one; with a region
/// parser, a region expression added to each term without one (from that term's zones) and
/// the region label set when all terms agree; the zone label set to the zones, `__`-joined.
/// Labels already present are kept.
pub fn affinity_to_in_tree(
    pv: &mut PersistentVolume,
    csi_key: &str,
    region: Option<RegionParser>,
) -> Result<(), MigrationError> {
    let (zone_key, region_key) = kubernetes_keys(pv);
    rename_affinity_key(pv, csi_key, zone_key);
    if let Some(parser) = region {
        add_regions(pv, zone_key, region_key, parser)?;
    }
    let zones = affinity_values(pv, zone_key);
    if !zones.is_empty() {
        set_label_if_absent(pv, zone_key, zones.join(MULTI_ZONE_SEPARATOR));
    }
    Ok(())
}

fn add_regions(
    pv: &mut PersistentVolume,
    zone_key: &str,
    region_key: &str,
    parser: RegionParser,
) -> Result<(), MigrationError> {
    let Some(terms) = terms_mut(pv) else {
        return Ok(());
    };
    for term in terms.iter_mut() {
        let expressions = term.match_expressions.get_or_insert_with(Vec::new);
        if expressions
            .iter()
            .any(|expression| expression.key == region_key)
        {
            continue;
        }
        let zones: Vec<String> = expressions
            .iter()
            .filter(|expression| expression.key == zone_key)
            .flat_map(|expression| expression.values.iter().flatten().cloned())
            .collect();
        let region = parser(&zones).map_err(MigrationError::Topology)?;
        expressions.push(NodeSelectorRequirement {
            key: region_key.to_owned(),
            operator: "In".to_owned(),
            values: Some(vec![region]),
        });
    }
    if let [region] = affinity_values(pv, region_key).as_slice() {
        set_label_if_absent(pv, region_key, region.clone());
    }
    Ok(())
}

pub fn set_label_if_absent(pv: &mut PersistentVolume, key: &str, value: String) {
    pv.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .entry(key.to_owned())
        .or_insert(value);
}

fn affinity_has_key(pv: &PersistentVolume, key: &str) -> bool {
    terms(pv)
        .iter()
        .flat_map(|term| term.match_expressions.iter().flatten())
        .any(|expression| expression.key == key)
}

fn terms(pv: &PersistentVolume) -> &[k8s_openapi::api::core::v1::NodeSelectorTerm] {
    pv.spec
        .as_ref()
        .and_then(|spec| spec.node_affinity.as_ref())
        .and_then(|affinity| affinity.required.as_ref())
        .map_or(&[], |required| required.node_selector_terms.as_slice())
}

fn terms_mut(
    pv: &mut PersistentVolume,
) -> Option<&mut Vec<k8s_openapi::api::core::v1::NodeSelectorTerm>> {
    pv.spec
        .as_mut()?
        .node_affinity
        .as_mut()?
        .required
        .as_mut()
        .map(|required| &mut required.node_selector_terms)
}

fn expressions_mut(
    pv: &mut PersistentVolume,
) -> impl Iterator<Item = &mut NodeSelectorRequirement> {
    terms_mut(pv)
        .into_iter()
        .flat_map(|terms| terms.iter_mut())
        .flat_map(|term| term.match_expressions.iter_mut().flatten())
}

/// The region of zones named `<locale>-<region>-<zone>` (GCE): all must agree.
pub fn gce_region(zones: &[String]) -> Result<String, String> {
    one_region(zones, |zone| {
        let parts: Vec<&str> = zone.split('-').collect();
        if parts.len() == 3 {
            Ok(parts[..2].join("-"))
        } else {
            Err(format!(
                "zone in unexpected format, expected: {{locale}}-{{region}}-{{zone}}, got: {zone}"
            ))
        }
    })
}

/// The region of AWS zones: `us-east-1a` → `us-east-1` (also `us-gov-west-1a`), local and
/// wavelength zones (5 or 7 parts) → their first three parts.
pub fn aws_region(zones: &[String]) -> Result<String, String> {
    one_region(zones, |zone| {
        let mut parts: Vec<&str> = zone.split('-').collect();
        let last = parts.last().copied().unwrap_or_default();
        match parts.len() {
            3 | 4 if last.len() == 2 && last.is_char_boundary(1) => {
                let trimmed = &last[..1];
                if let Some(end) = parts.last_mut() {
                    *end = trimmed;
                }
                Ok(parts.join("-"))
            }
            5 | 7 => Ok(parts[..3].join("-")),
            _ => Err(format!(
                "Unexpected zone format: {zone} is not a valid AWS zone"
            )),
        }
    })
}

fn one_region(
    zones: &[String],
    region_of: impl Fn(&str) -> Result<String, String>,
) -> Result<String, String> {
    if zones.is_empty() {
        return Err("no zones specified".to_owned());
    }
    let regions = zones
        .iter()
        .map(|zone| region_of(zone))
        .collect::<Result<BTreeSet<_>, _>>()?;
    match regions.len() {
        1 => Ok(regions.into_iter().next().unwrap_or_default()),
        _ => Err(format!(
            "multiple or no regions gotten from zones, got: {regions:?}"
        )),
    }
}
