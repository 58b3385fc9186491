//! `--feature-gates`: the provisioner's gates, their defaults and stages. Every gate's
//! behaviour is built.

use std::collections::BTreeMap;

use super::go::parse_go_bool;

/// One occurrence of `--feature-gates`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateList(pub Vec<(GateKey, bool)>);

/// A name accepted by `--feature-gates`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateKey {
    Provisioner(Gate),
    AllAlpha,
    AllBeta,
    /// A generic Kubernetes gate upstream also accepts (see `GENERIC_GATES`).
    Generic(&'static str),
}

/// The provisioner's own feature gates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Gate {
    Topology,
    CrossNamespaceVolumeDataSource,
    VolumeAttributesClass,
    ReleaseLeaderElectionOnExit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Alpha,
    Ga,
}

impl Gate {
    pub const ALL: [Gate; 4] = [
        Gate::Topology,
        Gate::CrossNamespaceVolumeDataSource,
        Gate::VolumeAttributesClass,
        Gate::ReleaseLeaderElectionOnExit,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Gate::Topology => "Topology",
            Gate::CrossNamespaceVolumeDataSource => "CrossNamespaceVolumeDataSource",
            Gate::VolumeAttributesClass => "VolumeAttributesClass",
            Gate::ReleaseLeaderElectionOnExit => "ReleaseLeaderElectionOnExit",
        }
    }

    pub(super) fn default_enabled(self) -> bool {
        matches!(self, Gate::Topology | Gate::VolumeAttributesClass)
    }

    fn stage(self) -> Stage {
        match self {
            Gate::Topology | Gate::VolumeAttributesClass => Stage::Ga,
            Gate::CrossNamespaceVolumeDataSource | Gate::ReleaseLeaderElectionOnExit => {
                Stage::Alpha
            }
        }
    }
}

/// Generic gates of the Kubernetes component libraries that upstream's gate set knows too;
/// accepted so existing manifests keep working. Only LoggingAlphaOptions has an effect (see
/// `FeatureGates::logging_alpha_options`).
const GENERIC_GATES: &[&str] = &[
    "LoggingAlphaOptions",
    "LoggingBetaOptions",
    "ContextualLogging",
];

/// The resolved `--feature-gates`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FeatureGates {
    explicit: BTreeMap<Gate, bool>,
    all_alpha: Option<bool>,
    all_beta: Option<bool>,
    /// The generic gates named on the command line, with their values.
    generic: BTreeMap<&'static str, bool>,
}

impl FeatureGates {
    /// Resolves every occurrence of `--feature-gates` (later occurrences win).
    pub fn resolve(lists: &[GateList]) -> Self {
        let mut gates = Self::default();
        for (key, value) in lists.iter().flat_map(|l| l.0.iter()) {
            gates.apply(*key, *value);
        }
        gates
    }

    pub fn enabled(&self, gate: Gate) -> bool {
        if let Some(v) = self.explicit.get(&gate) {
            return *v;
        }
        match gate.stage() {
            Stage::Alpha => self.all_alpha.unwrap_or(gate.default_enabled()),
            Stage::Ga => gate.default_enabled(),
        }
    }

    /// Whether the gate was named on the command line (upstream auto-disables
    /// VolumeAttributesClass only when it was not).
    pub fn is_explicit(&self, gate: Gate) -> bool {
        self.explicit.contains_key(&gate)
    }

    fn apply(&mut self, key: GateKey, value: bool) {
        match key {
            GateKey::Provisioner(g) => {
                self.explicit.insert(g, value);
            }
            GateKey::AllAlpha => self.all_alpha = Some(value),
            // No provisioner gate is beta; kept so that `AllBeta=...` is accepted like upstream.
            GateKey::AllBeta => self.all_beta = Some(value),
            GateKey::Generic(name) => {
                self.generic.insert(name, value);
            }
        }
    }

    /// Whether the alpha logging options (split streams, info buffers) may be used: the
    /// LoggingAlphaOptions gate, off by default and, being alpha, on with `AllAlpha=true`.
    pub fn logging_alpha_options(&self) -> bool {
        self.generic
            .get("LoggingAlphaOptions")
            .copied()
            .unwrap_or(self.all_alpha.unwrap_or(false))
    }
}

/// `Gate=bool,...` like Kubernetes' feature-gate flag; unknown gates are an error.
pub fn parse_gate_list(s: &str) -> Result<GateList, String> {
    let mut out = Vec::new();
    for item in s.split(',') {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let Some((name, value)) = item.split_once('=') else {
            return Err(format!("missing bool value for {item}"));
        };
        let (name, value) = (name.trim(), value.trim());
        let value = parse_go_bool(value).map_err(|e| format!("invalid value of {name}: {e}"))?;
        let key = match name {
            "AllAlpha" => GateKey::AllAlpha,
            "AllBeta" => GateKey::AllBeta,
            _ => {
                if let Some(g) = Gate::ALL.iter().find(|g| g.name() == name) {
                    GateKey::Provisioner(*g)
                } else if let Some(g) = GENERIC_GATES.iter().find(|g| **g == name) {
                    GateKey::Generic(g)
                } else {
                    let known: Vec<_> = Gate::ALL.iter().map(|g| g.name()).collect();
                    return Err(format!(
                        "unrecognized feature gate: {name} (known: {}, AllAlpha, AllBeta)",
                        known.join(", ")
                    ));
                }
            }
        };
        out.push((key, value));
    }
    Ok(GateList(out))
}
