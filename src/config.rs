//! Command-line flags: every flag of upstream csi-provisioner v6.3 with the same name, type
//! and default, plus the few extra flags of ours (marked "Ours" in their doc comments).
//!
//! Upstream parses flags with Go's pflag, so the parsers here follow Go conventions:
//! durations like `1m30s`, bools as `--flag`, `--flag=true`, `--flag=false` (never
//! `--flag false`), the last occurrence of a scalar flag wins, map flags accumulate.
//! docs/flags.md documents every flag; `FLAGS` is the same table in machine-readable form.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgAction, CommandFactory, FromArgMatches, Parser, ValueEnum};

/// The version printed by `--version` (upstream prints `<argv0> <version>`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The line `--version` prints: `<argv0> <version>`, as upstream does.
pub fn version_line(argv0: &str) -> String {
    format!("{argv0} {VERSION}")
}

/// All flags of the sidecar.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "csi-provisioner",
    about = "CSI provisioner sidecar: a drop-in replacement for kubernetes-csi/external-provisioner",
    disable_version_flag = true,
    args_override_self = true
)]
pub struct Args {
    // ---- 1.1 connection / Kubernetes client ----
    /// The gRPC endpoint of the CSI driver; a path starting with `/` means `unix://<path>`.
    #[arg(long, default_value = "/run/csi/socket")]
    pub csi_address: String,

    /// Timeout of every CSI call issued by the sidecar.
    #[arg(long, default_value = "10s", value_parser = parse_go_duration)]
    pub timeout: Duration,

    /// Path to a kubeconfig file (out-of-cluster). Env KUBECONFIG, if set, overrides it.
    #[arg(long, default_value = "")]
    pub kubeconfig: String,

    /// API server URL (out-of-cluster).
    #[arg(long, default_value = "")]
    pub master: String,

    /// Client-side queries per second towards the API server (0 = 5, negative = unlimited).
    #[arg(long, default_value_t = 5.0)]
    pub kube_api_qps: f64,

    /// Client-side burst towards the API server (0 = 10).
    #[arg(long, default_value_t = 10)]
    pub kube_api_burst: i32,

    /// Print `<argv0> <version>` and exit 0.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub version: bool,

    /// Go-specific (sets GOMAXPROCS from the cgroup quota); accepted and ignored.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub automaxprocs: bool,

    // ---- 1.2 volume naming / CreateVolume content ----
    /// Prefix of PV and CreateVolume names: `<prefix>-<pvc-uid>`.
    #[arg(long, default_value = "pvc")]
    pub volume_name_prefix: String,

    /// -1 = full PVC UID; otherwise the first N characters of the UID without dashes (0..=32).
    #[arg(long, default_value_t = -1)]
    pub volume_name_uuid_length: i64,

    /// Add PVC name/namespace and PV name to the CreateVolume parameters.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub extra_create_metadata: bool,

    /// fsType used when the StorageClass has none.
    #[arg(long, default_value = "")]
    pub default_fstype: String,

    /// Set PV.spec.csi.readOnly for ReadOnlyMany-only claims.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub controller_publish_readonly: bool,

    /// Reject a volumeMode change when restoring from a snapshot.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "true", default_missing_value = "true", value_parser = parse_go_bool)]
    pub prevent_volume_mode_conversion: bool,

    // ---- 1.3 topology ----
    /// Late binding: only the selected node's topology is requisite/preferred.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub strict_topology: bool,

    /// Immediate binding without allowedTopologies: pass the aggregated cluster topology.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "true", default_missing_value = "true", value_parser = parse_go_bool)]
    pub immediate_topology: bool,

    // ---- 1.4 capacity ----
    /// Publish CSIStorageCapacity objects.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub enable_capacity: bool,

    /// Also publish capacity for Immediate-binding StorageClasses.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub capacity_for_immediate_binding: bool,

    /// Period of the capacity re-query.
    #[arg(long, default_value = "1m", value_parser = parse_go_duration)]
    pub capacity_poll_interval: Duration,

    /// Owner of CSIStorageCapacity objects: -1 none, 0 the pod, 1 its controller, ...
    #[arg(long, default_value_t = 1)]
    pub capacity_ownerref_level: i64,

    /// Capacity workers.
    #[arg(long, default_value_t = 1)]
    pub capacity_threads: u64,

    /// QPS of the capacity client.
    #[arg(long, default_value_t = 1.0)]
    pub kube_api_capacity_qps: f32,

    /// Burst of the capacity client.
    #[arg(long, default_value_t = 5)]
    pub kube_api_capacity_burst: i32,

    // ---- 1.5 distributed (per-node) deployment ----
    /// One provisioner per node (needs env NODE_NAME).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub node_deployment: bool,

    /// Node instances race to own Immediate-binding PVCs.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "true", default_missing_value = "true", value_parser = parse_go_bool)]
    pub node_deployment_immediate_binding: bool,

    /// Initial wait before trying to own an Immediate PVC.
    #[arg(long, default_value = "20s", value_parser = parse_go_duration)]
    pub node_deployment_base_delay: Duration,

    /// Cap of the per-PVC ownership backoff.
    #[arg(long, default_value = "60s", value_parser = parse_go_duration)]
    pub node_deployment_max_delay: Duration,

    // ---- 1.6 leader election ----
    /// Enable Lease-based leader election.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub leader_election: bool,

    /// Lease namespace (default: env POD_NAMESPACE, the service-account namespace, `default`).
    #[arg(long, default_value = "")]
    pub leader_election_namespace: String,

    /// How long a Lease is valid after its last renewal.
    #[arg(long, default_value = "15s", value_parser = parse_go_duration)]
    pub leader_election_lease_duration: Duration,

    /// How long the leader keeps retrying a renewal before giving up leadership.
    #[arg(long, default_value = "10s", value_parser = parse_go_duration)]
    pub leader_election_renew_deadline: Duration,

    /// Interval between acquire/renew attempts.
    #[arg(long, default_value = "5s", value_parser = parse_go_duration)]
    pub leader_election_retry_period: Duration,

    /// Labels put on the Lease while leading: `k:v,k2:v2` (repeatable; later keys win).
    #[arg(long, action = ArgAction::Append, value_parser = parse_label_list)]
    pub leader_election_labels: Vec<LabelList>,

    // ---- 1.7 HTTP / metrics / profiling ----
    /// `host:port` of the HTTP server (metrics, /healthz/leader-election). Empty = no server.
    #[arg(long, default_value = "")]
    pub http_endpoint: String,

    /// Deprecated alias of --http-endpoint without the leader-election health path.
    #[arg(long, default_value = "")]
    pub metrics_address: String,

    /// HTTP path of the metrics.
    #[arg(long, default_value = "/metrics")]
    pub metrics_path: String,

    /// Serve /debug/pprof/* (Go profiler).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub enable_pprof: bool,

    // ---- 1.8 retries / workers / side controllers ----
    /// Base of the per-item exponential retry backoff.
    #[arg(long, default_value = "1s", value_parser = parse_go_duration)]
    pub retry_interval_start: Duration,

    /// Cap of the per-item exponential retry backoff.
    #[arg(long, default_value = "5m", value_parser = parse_go_duration)]
    pub retry_interval_max: Duration,

    /// Claim workers and volume workers (each).
    #[arg(long, default_value_t = 100)]
    pub worker_threads: u64,

    /// Workers removing the clone-source finalizer.
    #[arg(long, default_value_t = 1)]
    pub cloning_protection_threads: u64,

    /// Period of the orphaned snapshot-finalizer sweep; 0 disables it.
    #[arg(long, default_value = "5m", value_parser = parse_go_duration)]
    pub snapshot_orphan_sweep_interval: Duration,

    // ---- 1.9 feature gates and logging ----
    /// `Gate=bool,...` (repeatable). Gates: Topology, CrossNamespaceVolumeDataSource,
    /// VolumeAttributesClass, ReleaseLeaderElectionOnExit, AllAlpha, AllBeta.
    #[arg(long, action = ArgAction::Append, value_parser = parse_gate_list)]
    pub feature_gates: Vec<GateList>,

    /// Log format.
    #[arg(long, value_enum, default_value_t = LoggingFormat::Text)]
    pub logging_format: LoggingFormat,

    /// Go log flush period; accepted and ignored (our logs are not buffered).
    #[arg(long, default_value = "5s", value_parser = parse_go_duration)]
    pub log_flush_frequency: Duration,

    /// Log verbosity (see src/logging.rs for the mapping to log levels).
    #[arg(short = 'v', long = "v", default_value_t = 0, value_name = "LEVEL")]
    pub verbosity: i32,

    /// Per-file verbosity `pattern=N,...` (Go klog).
    #[arg(long, default_value = "", value_parser = parse_vmodule)]
    pub vmodule: String,

    /// Alpha: info messages to stdout, errors to stderr (text format).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub log_text_split_stream: bool,

    /// Alpha: buffer size of the info stream with split streams (text format).
    #[arg(long, default_value = "0")]
    pub log_text_info_buffer_size: String,

    /// Alpha: info messages to stdout, errors to stderr (json format).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub log_json_split_stream: bool,

    /// Alpha: buffer size of the info stream with split streams (json format).
    #[arg(long, default_value = "0")]
    pub log_json_info_buffer_size: String,

    // ---- ours ----
    /// Ours (not upstream): at most this many CreateVolume/DeleteVolume calls in flight per
    /// StorageClass, so one slow class cannot occupy every worker. 0 = unlimited.
    #[arg(long, default_value_t = 0)]
    pub max_concurrent_per_storage_class: u64,

    /// Ours (not upstream): whether a PVC without the annotation
    /// `volume.kubernetes.io/provisioning-consistency` gets the provisioning-protection
    /// finalizer before CreateVolume (guards against the volume leak of upstream issue #486).
    #[arg(long, value_enum, default_value_t = ConsistencyDefault::Disable)]
    pub provisioning_consistency_default: ConsistencyDefault,

    /// Long names of the flags given on the command line (filled by `parse_flags_from`).
    #[arg(skip)]
    pub explicit: BTreeSet<String>,
}

/// `--logging-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LoggingFormat {
    Text,
    Json,
}

/// `--provisioning-consistency-default` (ours).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ConsistencyDefault {
    Enable,
    Disable,
}

/// One occurrence of `--leader-election-labels`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelList(pub Vec<(String, String)>);

/// One occurrence of `--feature-gates`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateList(pub Vec<(GateKey, bool)>);

/// A name accepted by `--feature-gates`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateKey {
    Provisioner(Gate),
    AllAlpha,
    AllBeta,
    /// A generic Kubernetes gate upstream also accepts; it has no effect here.
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

    fn default_enabled(self) -> bool {
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
/// accepted so existing manifests keep working, without effect.
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
}

impl FeatureGates {
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
            GateKey::Generic(_) => {}
        }
    }
}

/// Whether a flag's behaviour matches upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagStatus {
    /// Same name, type, default and behaviour as upstream.
    Same,
    /// Accepted with the same default, but deliberately behaves differently (docs/flags.md).
    Different,
    /// Accepted and validated, behaviour not built yet (a warning is logged when given).
    NotBuiltYet,
    /// Accepted and ignored by design (Go-runtime specific or no-op for us).
    Ignored,
    /// One of our own flags, fully built (no upstream counterpart to compare with).
    Built,
}

impl FlagStatus {
    /// The label used in docs/flags.md.
    pub fn label(self) -> &'static str {
        match self {
            FlagStatus::Same => "same",
            FlagStatus::Different => "different",
            FlagStatus::NotBuiltYet => "not-built-yet",
            FlagStatus::Ignored => "ignored",
            FlagStatus::Built => "built",
        }
    }
}

/// One row of the flag table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlagInfo {
    /// Long name without dashes.
    pub name: &'static str,
    pub status: FlagStatus,
    /// Our own flag, not in upstream.
    pub ours: bool,
}

const fn up(name: &'static str, status: FlagStatus) -> FlagInfo {
    FlagInfo {
        name,
        status,
        ours: false,
    }
}

const fn ours(name: &'static str, status: FlagStatus) -> FlagInfo {
    FlagInfo {
        name,
        status,
        ours: true,
    }
}

/// Every flag with its status; docs/flags.md must agree (checked by a test).
pub const FLAGS: &[FlagInfo] = {
    use FlagStatus::*;
    &[
        up("csi-address", Same),
        up("timeout", Same),
        up("kubeconfig", Same),
        up("master", Same),
        up("kube-api-qps", Same),
        up("kube-api-burst", Same),
        up("version", Same),
        up("automaxprocs", Ignored),
        up("volume-name-prefix", Different),
        up("volume-name-uuid-length", Different),
        up("extra-create-metadata", Same),
        up("default-fstype", Same),
        up("controller-publish-readonly", Same),
        up("prevent-volume-mode-conversion", NotBuiltYet),
        up("strict-topology", NotBuiltYet),
        up("immediate-topology", NotBuiltYet),
        up("enable-capacity", NotBuiltYet),
        up("capacity-for-immediate-binding", NotBuiltYet),
        up("capacity-poll-interval", NotBuiltYet),
        up("capacity-ownerref-level", NotBuiltYet),
        up("capacity-threads", NotBuiltYet),
        up("kube-api-capacity-qps", NotBuiltYet),
        up("kube-api-capacity-burst", NotBuiltYet),
        up("node-deployment", NotBuiltYet),
        up("node-deployment-immediate-binding", NotBuiltYet),
        up("node-deployment-base-delay", NotBuiltYet),
        up("node-deployment-max-delay", NotBuiltYet),
        up("leader-election", Different),
        up("leader-election-namespace", Same),
        up("leader-election-lease-duration", Same),
        up("leader-election-renew-deadline", Same),
        up("leader-election-retry-period", Same),
        up("leader-election-labels", Same),
        up("http-endpoint", Same),
        up("metrics-address", Same),
        up("metrics-path", Same),
        up("enable-pprof", NotBuiltYet),
        up("retry-interval-start", Same),
        up("retry-interval-max", Same),
        up("worker-threads", Same),
        up("cloning-protection-threads", NotBuiltYet),
        up("snapshot-orphan-sweep-interval", NotBuiltYet),
        up("feature-gates", Different),
        up("logging-format", Different),
        up("log-flush-frequency", Ignored),
        up("v", Different),
        up("vmodule", NotBuiltYet),
        up("log-text-split-stream", NotBuiltYet),
        up("log-text-info-buffer-size", NotBuiltYet),
        up("log-json-split-stream", NotBuiltYet),
        up("log-json-info-buffer-size", NotBuiltYet),
        ours("max-concurrent-per-storage-class", Built),
        ours("provisioning-consistency-default", Built),
    ]
};

/// Long names of the flags whose behaviour is not built yet.
pub fn not_built_yet() -> Vec<&'static str> {
    FLAGS
        .iter()
        .filter(|f| f.status == FlagStatus::NotBuiltYet)
        .map(|f| f.name)
        .collect()
}

/// Feature gates that are accepted but whose behaviour is not built yet.
pub const GATES_NOT_BUILT_YET: &[Gate] = &[
    Gate::Topology,
    Gate::CrossNamespaceVolumeDataSource,
    Gate::VolumeAttributesClass,
];

/// A flag combination or value that is well-formed but not allowed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("only one of --metrics-address and --http-endpoint can be set")]
    EndpointConflict,
    #[error("--{flag}={value}: must be {expected}")]
    OutOfRange {
        flag: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("--{flag} ({value:?}) must be {relation} --{other} ({other_value:?})")]
    Ordering {
        flag: &'static str,
        value: Duration,
        relation: &'static str,
        other: &'static str,
        other_value: Duration,
    },
    #[error("--{flag}: {reason}")]
    Invalid { flag: &'static str, reason: String },
}

impl Args {
    /// Parses the process arguments; prints the error or help and exits like clap (exit 2
    /// for bad flags, as pflag does).
    pub fn parse_flags() -> Self {
        match Self::parse_flags_from(std::env::args_os()) {
            Ok(args) => args,
            Err(e) => e.exit(),
        }
    }

    /// Parses `argv` (including argv[0]). Single-dash long forms of Go's `flag` package
    /// (`-csi-address=/x`, `-leader-election`) are accepted as their `--` form.
    pub fn parse_flags_from<I, T>(argv: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString>,
    {
        // pflag takes the next argument as a flag's value even if it starts with `-`.
        let mut cmd = Self::command().mut_args(|a| {
            if a.get_num_args().is_none_or(|n| n.min_values() > 0) {
                a.allow_hyphen_values(true)
            } else {
                a
            }
        });
        cmd.build();
        let argv = normalize_single_dash(&cmd, argv.into_iter().map(Into::into).collect());
        let matches = cmd.clone().try_get_matches_from(argv)?;
        let mut args = Self::from_arg_matches(&matches)?;
        args.explicit = cmd
            .get_arguments()
            .filter(|a| matches.value_source(a.get_id().as_str()) == Some(ValueSource::CommandLine))
            .filter_map(|a| a.get_long().map(str::to_owned))
            .collect();
        Ok(args)
    }

    /// Checks value ranges and combinations that a parser cannot; the error names the flag.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !self.http_endpoint.is_empty() && !self.metrics_address.is_empty() {
            return Err(ConfigError::EndpointConflict);
        }
        for (flag, value) in [
            ("http-endpoint", &self.http_endpoint),
            ("metrics-address", &self.metrics_address),
        ] {
            if !value.is_empty() && !has_port(value) {
                return Err(ConfigError::Invalid {
                    flag,
                    reason: format!("{value:?} is not of the form host:port or :port"),
                });
            }
        }
        if !self.metrics_path.starts_with('/') {
            return Err(ConfigError::OutOfRange {
                flag: "metrics-path",
                value: self.metrics_path.clone(),
                expected: "a path starting with '/'",
            });
        }
        if self.leader_election && self.metrics_path == crate::http::LEADER_HEALTH_PATH {
            return Err(ConfigError::Invalid {
                flag: "metrics-path",
                reason: format!("{} is the leader-election health path", self.metrics_path),
            });
        }
        if !(-1..=32).contains(&self.volume_name_uuid_length) {
            return Err(ConfigError::OutOfRange {
                flag: "volume-name-uuid-length",
                value: self.volume_name_uuid_length.to_string(),
                expected: "between -1 and 32",
            });
        }
        if self.volume_name_prefix.is_empty() {
            return Err(ConfigError::OutOfRange {
                flag: "volume-name-prefix",
                value: String::new(),
                expected: "non-empty",
            });
        }
        positive_count("worker-threads", self.worker_threads)?;
        positive_count(
            "cloning-protection-threads",
            self.cloning_protection_threads,
        )?;
        if self.enable_capacity {
            positive_count("capacity-threads", self.capacity_threads)?;
        }
        positive_duration("timeout", self.timeout)?;
        positive_duration("retry-interval-start", self.retry_interval_start)?;
        not_after(
            ("retry-interval-start", self.retry_interval_start),
            ("retry-interval-max", self.retry_interval_max),
        )?;
        not_after(
            (
                "node-deployment-base-delay",
                self.node_deployment_base_delay,
            ),
            ("node-deployment-max-delay", self.node_deployment_max_delay),
        )?;
        if !self.kube_api_qps.is_finite() {
            return Err(ConfigError::OutOfRange {
                flag: "kube-api-qps",
                value: self.kube_api_qps.to_string(),
                expected: "a finite number",
            });
        }
        if self.kube_api_burst < 0 {
            return Err(ConfigError::OutOfRange {
                flag: "kube-api-burst",
                value: self.kube_api_burst.to_string(),
                expected: "0 or more",
            });
        }
        if self.leader_election {
            self.validate_leader_election()?;
        }
        Ok(())
    }

    /// The same constraints client-go's leader elector enforces at start (fatal upstream).
    fn validate_leader_election(&self) -> Result<(), ConfigError> {
        let lease = self.leader_election_lease_duration;
        let renew = self.leader_election_renew_deadline;
        let retry = self.leader_election_retry_period;
        for (flag, d) in [
            ("leader-election-lease-duration", lease),
            ("leader-election-renew-deadline", renew),
            ("leader-election-retry-period", retry),
        ] {
            if d < Duration::from_secs(1) {
                return Err(ConfigError::OutOfRange {
                    flag,
                    value: format!("{d:?}"),
                    expected: "at least 1s",
                });
            }
        }
        if lease <= renew {
            return Err(ConfigError::Ordering {
                flag: "leader-election-lease-duration",
                value: lease,
                relation: "greater than",
                other: "leader-election-renew-deadline",
                other_value: renew,
            });
        }
        // client-go requires renewDeadline > 1.2 * retryPeriod (its jitter factor).
        if renew.as_secs_f64() <= 1.2 * retry.as_secs_f64() {
            return Err(ConfigError::Ordering {
                flag: "leader-election-renew-deadline",
                value: renew,
                relation: "greater than 1.2 times",
                other: "leader-election-retry-period",
                other_value: retry,
            });
        }
        Ok(())
    }

    /// The resolved `--feature-gates` (later occurrences win).
    pub fn feature_gates(&self) -> FeatureGates {
        let mut gates = FeatureGates::default();
        for (key, value) in self.feature_gates.iter().flat_map(|l| l.0.iter()) {
            gates.apply(*key, *value);
        }
        gates
    }

    /// The resolved `--leader-election-labels` (later keys win).
    pub fn leader_election_labels(&self) -> BTreeMap<String, String> {
        self.leader_election_labels
            .iter()
            .flat_map(|l| l.0.iter().cloned())
            .collect()
    }

    /// Flags given on the command line whose behaviour is not built yet, and gates set to
    /// enabled whose behaviour is not built yet; main logs a warning for each.
    pub fn not_built_yet_in_use(&self) -> Vec<String> {
        let gates = self.feature_gates();
        let flags = not_built_yet()
            .into_iter()
            .filter(|f| self.explicit.contains(*f))
            .map(|f| format!("--{f}"));
        let gates = GATES_NOT_BUILT_YET
            .iter()
            .filter(|g| gates.is_explicit(**g) && gates.enabled(**g))
            .map(|g| format!("--feature-gates={}=true", g.name()));
        flags.chain(gates).collect()
    }
}

fn has_port(addr: &str) -> bool {
    addr.rsplit_once(':')
        .is_some_and(|(_, port)| port.parse::<u16>().is_ok())
}

fn positive_count(flag: &'static str, value: u64) -> Result<(), ConfigError> {
    if value == 0 {
        return Err(ConfigError::OutOfRange {
            flag,
            value: "0".into(),
            expected: "at least 1",
        });
    }
    Ok(())
}

fn positive_duration(flag: &'static str, value: Duration) -> Result<(), ConfigError> {
    if value.is_zero() {
        return Err(ConfigError::OutOfRange {
            flag,
            value: "0s".into(),
            expected: "greater than 0",
        });
    }
    Ok(())
}

fn not_after(
    (flag, value): (&'static str, Duration),
    (other, other_value): (&'static str, Duration),
) -> Result<(), ConfigError> {
    if value > other_value {
        return Err(ConfigError::Ordering {
            flag,
            value,
            relation: "at most",
            other,
            other_value,
        });
    }
    Ok(())
}

/// Rewrites `-long-name[=v]` to `--long-name[=v]` for known long flags longer than one
/// character, leaving values of the previous flag and everything after `--` alone.
fn normalize_single_dash(cmd: &clap::Command, argv: Vec<OsString>) -> Vec<OsString> {
    // Flags whose value may be the next argument (bools need `=`, like pflag).
    let takes_separate_value = |name: &str| {
        cmd.get_arguments().any(|a| {
            (a.get_long() == Some(name)
                || (name.len() == 1 && a.get_short() == name.chars().next()))
                && a.get_num_args().is_some_and(|n| n.min_values() > 0)
        })
    };
    let is_long = |name: &str| cmd.get_arguments().any(|a| a.get_long() == Some(name));

    let mut out = Vec::with_capacity(argv.len());
    let mut value_expected = false;
    let mut rest_positional = false;
    for (i, arg) in argv.into_iter().enumerate() {
        let Some(s) = arg
            .to_str()
            .filter(|_| i > 0 && !rest_positional && !value_expected)
        else {
            value_expected = false;
            out.push(arg);
            continue;
        };
        if s == "--" {
            rest_positional = true;
            out.push(arg);
            continue;
        }
        let (dashes, body) = if let Some(b) = s.strip_prefix("--") {
            (2, b)
        } else if let Some(b) = s.strip_prefix('-') {
            (1, b)
        } else {
            out.push(arg);
            continue;
        };
        let (name, has_value) = match body.split_once('=') {
            Some((n, _)) => (n, true),
            None => (body, false),
        };
        value_expected = !has_value && takes_separate_value(name);
        if dashes == 1 && name.len() > 1 && is_long(name) {
            out.push(OsString::from(format!("-{s}")));
        } else {
            out.push(arg);
        }
    }
    out
}

/// Go's `strconv.ParseBool`.
pub fn parse_go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!("{s:?} is not a boolean (use true or false)")),
    }
}

/// Go's `time.ParseDuration` restricted to non-negative values: `300ms`, `1.5h`, `2h45m`,
/// units ns, us, µs, ms, s, m, h; a bare `0` is allowed.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let invalid = || format!("invalid duration {s:?} (examples: 10s, 5m, 1m30s, 500ms)");
    let (negative, body) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if body == "0" {
        return Ok(Duration::ZERO);
    }
    if body.is_empty() {
        return Err(invalid());
    }
    let mut nanos: u128 = 0;
    let mut rest = body;
    while !rest.is_empty() {
        let int_len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (int_part, after_int) = rest.split_at(int_len);
        let (frac_part, after_num) = match after_int.strip_prefix('.') {
            Some(f) => {
                let len = f.find(|c: char| !c.is_ascii_digit()).unwrap_or(f.len());
                f.split_at(len)
            }
            None => ("", after_int),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(invalid());
        }
        let unit_len = after_num
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after_num.len());
        let (unit, after_unit) = after_num.split_at(unit_len);
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(format!("missing unit in duration {s:?}")),
            _ => return Err(format!("unknown unit {unit:?} in duration {s:?}")),
        };
        let int: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| invalid())?
        };
        // Digits beyond nanosecond resolution cannot change the result.
        let frac_digits = &frac_part[..frac_part.len().min(18)];
        let frac: u128 = if frac_digits.is_empty() {
            0
        } else {
            frac_digits.parse().map_err(|_| invalid())?
        };
        let scale = 10u128.pow(frac_digits.len() as u32);
        nanos = int
            .checked_mul(unit_nanos)
            .and_then(|n| n.checked_add(frac * unit_nanos / scale))
            .and_then(|n| n.checked_add(nanos))
            .filter(|n| *n <= i64::MAX as u128)
            .ok_or_else(|| format!("duration {s:?} is too large"))?;
        rest = after_unit;
    }
    if negative && nanos > 0 {
        return Err(format!("duration {s:?} must not be negative"));
    }
    Ok(Duration::from_nanos(nanos as u64))
}

/// `k:v,k2:v2` like csi-lib-utils: every item must contain exactly one `:`.
pub fn parse_label_list(s: &str) -> Result<LabelList, String> {
    s.split(',')
        .map(
            |item| match item.split(':').collect::<Vec<_>>().as_slice() {
                [k, v] => Ok(((*k).to_owned(), (*v).to_owned())),
                _ => Err(format!(
                    "malformed item in list of labels: {item:?} (want key:value)"
                )),
            },
        )
        .collect::<Result<Vec<_>, _>>()
        .map(LabelList)
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

/// `pattern=N,...` like klog's `--vmodule`.
pub fn parse_vmodule(s: &str) -> Result<String, String> {
    for item in s.split(',').filter(|i| !i.is_empty()) {
        match item.split_once('=') {
            Some((pattern, level)) if !pattern.is_empty() && level.parse::<i32>().is_ok() => {}
            _ => return Err(format!("{item:?} is not of the form pattern=N")),
        }
    }
    Ok(s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(flags: &[&str]) -> Result<Args, clap::Error> {
        Args::parse_flags_from(std::iter::once("csi-provisioner").chain(flags.iter().copied()))
    }

    fn ok(flags: &[&str]) -> Args {
        match parse(flags) {
            Ok(a) => a,
            Err(e) => panic!("{flags:?}: {e}"),
        }
    }

    fn err(flags: &[&str]) -> String {
        match parse(flags) {
            Ok(a) => panic!("{flags:?} parsed: {a:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn defaults_equal_upstream() {
        let a = ok(&[]);
        assert_eq!(a.csi_address, "/run/csi/socket");
        assert_eq!(a.timeout, secs(10));
        assert_eq!(a.kubeconfig, "");
        assert_eq!(a.master, "");
        assert_eq!(a.kube_api_qps, 5.0);
        assert_eq!(a.kube_api_burst, 10);
        assert!(!a.version);
        assert!(!a.automaxprocs);
        assert_eq!(a.volume_name_prefix, "pvc");
        assert_eq!(a.volume_name_uuid_length, -1);
        assert!(!a.extra_create_metadata);
        assert_eq!(a.default_fstype, "");
        assert!(!a.controller_publish_readonly);
        assert!(a.prevent_volume_mode_conversion);
        assert!(!a.strict_topology);
        assert!(a.immediate_topology);
        assert!(!a.enable_capacity);
        assert!(!a.capacity_for_immediate_binding);
        assert_eq!(a.capacity_poll_interval, secs(60));
        assert_eq!(a.capacity_ownerref_level, 1);
        assert_eq!(a.capacity_threads, 1);
        assert_eq!(a.kube_api_capacity_qps, 1.0);
        assert_eq!(a.kube_api_capacity_burst, 5);
        assert!(!a.node_deployment);
        assert!(a.node_deployment_immediate_binding);
        assert_eq!(a.node_deployment_base_delay, secs(20));
        assert_eq!(a.node_deployment_max_delay, secs(60));
        assert!(!a.leader_election);
        assert_eq!(a.leader_election_namespace, "");
        assert_eq!(a.leader_election_lease_duration, secs(15));
        assert_eq!(a.leader_election_renew_deadline, secs(10));
        assert_eq!(a.leader_election_retry_period, secs(5));
        assert!(a.leader_election_labels().is_empty());
        assert_eq!(a.http_endpoint, "");
        assert_eq!(a.metrics_address, "");
        assert_eq!(a.metrics_path, "/metrics");
        assert!(!a.enable_pprof);
        assert_eq!(a.retry_interval_start, secs(1));
        assert_eq!(a.retry_interval_max, secs(300));
        assert_eq!(a.worker_threads, 100);
        assert_eq!(a.cloning_protection_threads, 1);
        assert_eq!(a.snapshot_orphan_sweep_interval, secs(300));
        assert_eq!(a.logging_format, LoggingFormat::Text);
        assert_eq!(a.log_flush_frequency, secs(5));
        assert_eq!(a.verbosity, 0);
        assert_eq!(a.vmodule, "");
        assert!(!a.log_text_split_stream);
        assert!(!a.log_json_split_stream);
        assert_eq!(a.max_concurrent_per_storage_class, 0);
        assert_eq!(
            a.provisioning_consistency_default,
            ConsistencyDefault::Disable
        );
        let g = a.feature_gates();
        assert!(g.enabled(Gate::Topology));
        assert!(!g.enabled(Gate::CrossNamespaceVolumeDataSource));
        assert!(g.enabled(Gate::VolumeAttributesClass));
        assert!(!g.enabled(Gate::ReleaseLeaderElectionOnExit));
        assert!(a.explicit.is_empty());
        assert_eq!(a.validate(), Ok(()));
        assert!(a.not_built_yet_in_use().is_empty());
    }

    #[test]
    fn every_flag_parses() {
        let a = ok(&[
            "--csi-address=unix:///csi/csi.sock",
            "--timeout=1m30s",
            "--kubeconfig=/k",
            "--master=https://h:6443",
            "--kube-api-qps=20.5",
            "--kube-api-burst=40",
            "--version=false",
            "--automaxprocs",
            "--volume-name-prefix=vol",
            "--volume-name-uuid-length=8",
            "--extra-create-metadata",
            "--default-fstype=ext4",
            "--controller-publish-readonly=true",
            "--prevent-volume-mode-conversion=false",
            "--strict-topology",
            "--immediate-topology=false",
            "--enable-capacity",
            "--capacity-for-immediate-binding",
            "--capacity-poll-interval=2m",
            "--capacity-ownerref-level=-1",
            "--capacity-threads=3",
            "--kube-api-capacity-qps=2.5",
            "--kube-api-capacity-burst=7",
            "--node-deployment",
            "--node-deployment-immediate-binding=false",
            "--node-deployment-base-delay=5s",
            "--node-deployment-max-delay=2m",
            "--leader-election",
            "--leader-election-namespace=kube-system",
            "--leader-election-lease-duration=30s",
            "--leader-election-renew-deadline=20s",
            "--leader-election-retry-period=2s",
            "--leader-election-labels=a:b,c:d",
            "--http-endpoint=:8080",
            "--metrics-path=/m",
            "--enable-pprof",
            "--retry-interval-start=500ms",
            "--retry-interval-max=10m",
            "--worker-threads=7",
            "--cloning-protection-threads=2",
            "--snapshot-orphan-sweep-interval=0",
            "--feature-gates=Topology=false,AllAlpha=true",
            "--logging-format=json",
            "--log-flush-frequency=1s",
            "-v=5",
            "--vmodule=foo=2,bar*=3",
            "--log-text-split-stream",
            "--log-text-info-buffer-size=1Mi",
            "--log-json-split-stream=true",
            "--log-json-info-buffer-size=2Mi",
            "--max-concurrent-per-storage-class=4",
            "--provisioning-consistency-default=enable",
        ]);
        assert_eq!(a.csi_address, "unix:///csi/csi.sock");
        assert_eq!(a.timeout, secs(90));
        assert_eq!(a.kubeconfig, "/k");
        assert_eq!(a.master, "https://h:6443");
        assert_eq!(a.kube_api_qps, 20.5);
        assert_eq!(a.kube_api_burst, 40);
        assert!(!a.version);
        assert!(a.automaxprocs);
        assert_eq!(a.volume_name_prefix, "vol");
        assert_eq!(a.volume_name_uuid_length, 8);
        assert!(a.extra_create_metadata);
        assert_eq!(a.default_fstype, "ext4");
        assert!(a.controller_publish_readonly);
        assert!(!a.prevent_volume_mode_conversion);
        assert!(a.strict_topology);
        assert!(!a.immediate_topology);
        assert!(a.enable_capacity);
        assert!(a.capacity_for_immediate_binding);
        assert_eq!(a.capacity_poll_interval, secs(120));
        assert_eq!(a.capacity_ownerref_level, -1);
        assert_eq!(a.capacity_threads, 3);
        assert_eq!(a.kube_api_capacity_qps, 2.5);
        assert_eq!(a.kube_api_capacity_burst, 7);
        assert!(a.node_deployment);
        assert!(!a.node_deployment_immediate_binding);
        assert_eq!(a.node_deployment_base_delay, secs(5));
        assert_eq!(a.node_deployment_max_delay, secs(120));
        assert!(a.leader_election);
        assert_eq!(a.leader_election_namespace, "kube-system");
        assert_eq!(a.leader_election_lease_duration, secs(30));
        assert_eq!(a.leader_election_renew_deadline, secs(20));
        assert_eq!(a.leader_election_retry_period, secs(2));
        assert_eq!(
            a.leader_election_labels(),
            BTreeMap::from([("a".into(), "b".into()), ("c".into(), "d".into())])
        );
        assert_eq!(a.http_endpoint, ":8080");
        assert_eq!(a.metrics_path, "/m");
        assert!(a.enable_pprof);
        assert_eq!(a.retry_interval_start, Duration::from_millis(500));
        assert_eq!(a.retry_interval_max, secs(600));
        assert_eq!(a.worker_threads, 7);
        assert_eq!(a.cloning_protection_threads, 2);
        assert_eq!(a.snapshot_orphan_sweep_interval, Duration::ZERO);
        let g = a.feature_gates();
        assert!(!g.enabled(Gate::Topology));
        assert!(g.enabled(Gate::CrossNamespaceVolumeDataSource));
        assert!(g.enabled(Gate::ReleaseLeaderElectionOnExit));
        assert!(g.enabled(Gate::VolumeAttributesClass));
        assert!(!g.is_explicit(Gate::VolumeAttributesClass));
        assert_eq!(a.logging_format, LoggingFormat::Json);
        assert_eq!(a.log_flush_frequency, secs(1));
        assert_eq!(a.verbosity, 5);
        assert_eq!(a.vmodule, "foo=2,bar*=3");
        assert!(a.log_text_split_stream);
        assert_eq!(a.log_text_info_buffer_size, "1Mi");
        assert!(a.log_json_split_stream);
        assert_eq!(a.log_json_info_buffer_size, "2Mi");
        assert_eq!(a.max_concurrent_per_storage_class, 4);
        assert_eq!(
            a.provisioning_consistency_default,
            ConsistencyDefault::Enable
        );
        assert_eq!(a.validate(), Ok(()));
        // Every flag of the table was given above, except the one excluding --http-endpoint.
        let mut given: BTreeSet<_> = FLAGS.iter().map(|f| f.name.to_owned()).collect();
        given.remove("metrics-address");
        assert_eq!(a.explicit, given);
        assert_eq!(ok(&["--metrics-address=:9090"]).metrics_address, ":9090");
    }

    #[test]
    fn command_is_consistent_and_documented() {
        Args::command().debug_assert();
        let help = Args::command().render_long_help().to_string();
        for f in FLAGS {
            assert!(
                help.contains(&format!("--{}", f.name)),
                "--{} missing from help",
                f.name
            );
        }
    }

    #[test]
    fn flag_table_matches_the_parser() {
        let cmd = Args::command();
        let parser: BTreeSet<_> = cmd
            .get_arguments()
            .filter_map(|a| a.get_long())
            .filter(|l| *l != "help")
            .collect();
        let table: BTreeSet<_> = FLAGS.iter().map(|f| f.name).collect();
        assert_eq!(parser, table);
        assert_eq!(table.len(), FLAGS.len(), "duplicate rows in FLAGS");
    }

    /// docs/flags.md has one row per flag whose status column equals `FLAGS`.
    #[test]
    fn docs_table_matches_flag_table() {
        let doc = include_str!("../docs/flags.md");
        for f in FLAGS {
            let prefix = format!("| `--{}` |", f.name);
            let row = doc
                .lines()
                .find(|l| l.starts_with(&prefix))
                .unwrap_or_else(|| panic!("docs/flags.md has no row for --{}", f.name));
            let cols: Vec<_> = row.split('|').map(str::trim).collect();
            assert_eq!(
                cols.get(4).copied(),
                Some(f.status.label()),
                "status of --{}",
                f.name
            );
        }
    }

    #[test]
    fn not_built_yet_list() {
        assert_eq!(
            not_built_yet(),
            vec![
                "prevent-volume-mode-conversion",
                "strict-topology",
                "immediate-topology",
                "enable-capacity",
                "capacity-for-immediate-binding",
                "capacity-poll-interval",
                "capacity-ownerref-level",
                "capacity-threads",
                "kube-api-capacity-qps",
                "kube-api-capacity-burst",
                "node-deployment",
                "node-deployment-immediate-binding",
                "node-deployment-base-delay",
                "node-deployment-max-delay",
                "enable-pprof",
                "cloning-protection-threads",
                "snapshot-orphan-sweep-interval",
                "vmodule",
                "log-text-split-stream",
                "log-text-info-buffer-size",
                "log-json-split-stream",
                "log-json-info-buffer-size",
            ]
        );
        let a = ok(&[
            "--enable-capacity",
            "--feature-gates=VolumeAttributesClass=true",
        ]);
        assert_eq!(
            a.not_built_yet_in_use(),
            vec![
                "--enable-capacity",
                "--feature-gates=VolumeAttributesClass=true"
            ]
        );
    }

    #[test]
    fn bools_follow_pflag() {
        assert!(ok(&["--leader-election"]).leader_election);
        assert!(ok(&["--leader-election=true"]).leader_election);
        assert!(ok(&["--leader-election=T"]).leader_election);
        assert!(!ok(&["--leader-election=false"]).leader_election);
        assert!(!ok(&["--leader-election=0"]).leader_election);
        assert!(!ok(&["--immediate-topology=false"]).immediate_topology);
        // Last occurrence wins, as in pflag.
        assert!(!ok(&["--leader-election", "--leader-election=false"]).leader_election);
        // The value of a bool must be attached with `=`.
        let e = err(&["--leader-election", "false"]);
        assert!(e.contains("false"), "{e}");
        let e = err(&["--leader-election=yes"]);
        assert!(e.contains("--leader-election"), "{e}");
    }

    #[test]
    fn go_single_dash_forms() {
        assert_eq!(ok(&["-v=5"]).verbosity, 5);
        assert_eq!(ok(&["-v", "3"]).verbosity, 3);
        assert_eq!(ok(&["-v4"]).verbosity, 4);
        assert_eq!(ok(&["--v=2"]).verbosity, 2);
        let a = ok(&[
            "-csi-address=/csi.sock",
            "-leader-election",
            "-timeout",
            "3s",
        ]);
        assert_eq!(a.csi_address, "/csi.sock");
        assert!(a.leader_election);
        assert_eq!(a.timeout, secs(3));
        // A value that looks like a flag stays a value.
        assert_eq!(
            ok(&["--volume-name-prefix", "-timeout"]).volume_name_prefix,
            "-timeout"
        );
        assert_eq!(
            ok(&["--volume-name-uuid-length", "-1"]).volume_name_uuid_length,
            -1
        );
    }

    #[test]
    fn unknown_flags_are_rejected() {
        let e = err(&["--no-such-flag"]);
        assert!(e.contains("--no-such-flag"), "{e}");
        // Legacy klog flags are gone upstream too.
        assert!(err(&["--logtostderr"]).contains("--logtostderr"));
        let e = Args::parse_flags_from(["csi-provisioner", "--bogus"]).map(|_| ());
        assert_eq!(e.map_err(|e| e.exit_code()), Err(2));
    }

    #[test]
    fn bad_values_name_the_flag() {
        for (flags, flag) in [
            (&["--timeout=10"][..], "--timeout"),
            (&["--timeout=-1s"], "--timeout"),
            (&["--retry-interval-max=5x"], "--retry-interval-max"),
            (&["--worker-threads=-1"], "--worker-threads"),
            (&["--kube-api-qps=fast"], "--kube-api-qps"),
            (
                &["--leader-election-labels=a=b"],
                "--leader-election-labels",
            ),
            (
                &["--leader-election-labels=a:b:c"],
                "--leader-election-labels",
            ),
            (&["--feature-gates=NoSuchGate=true"], "--feature-gates"),
            (&["--feature-gates=Topology"], "--feature-gates"),
            (&["--feature-gates=Topology=maybe"], "--feature-gates"),
            (&["--logging-format=xml"], "--logging-format"),
            (&["--vmodule=foo"], "--vmodule"),
            (&["-v=high"], "--v"),
            (
                &["--provisioning-consistency-default=yes"],
                "--provisioning-consistency-default",
            ),
        ] {
            let e = err(flags);
            assert!(e.contains(flag), "{flags:?}: {e}");
        }
        assert!(err(&["--feature-gates=NoSuchGate=true"]).contains("unrecognized feature gate"));
    }

    #[test]
    fn validation_errors_name_the_flag() {
        for (flags, flag) in [
            (
                &["--http-endpoint=:8080", "--metrics-address=:8081"][..],
                "--metrics-address",
            ),
            (
                &["--volume-name-uuid-length=33"],
                "--volume-name-uuid-length",
            ),
            (
                &["--volume-name-uuid-length=-2"],
                "--volume-name-uuid-length",
            ),
            (&["--volume-name-prefix="], "--volume-name-prefix"),
            (&["--worker-threads=0"], "--worker-threads"),
            (
                &["--cloning-protection-threads=0"],
                "--cloning-protection-threads",
            ),
            (
                &["--enable-capacity", "--capacity-threads=0"],
                "--capacity-threads",
            ),
            (&["--timeout=0"], "--timeout"),
            (&["--retry-interval-start=10m"], "--retry-interval-start"),
            (&["--retry-interval-start=0s"], "--retry-interval-start"),
            (
                &["--node-deployment-base-delay=2m"],
                "--node-deployment-base-delay",
            ),
            (&["--kube-api-qps=NaN"], "--kube-api-qps"),
            (&["--kube-api-burst=-1"], "--kube-api-burst"),
            (&["--metrics-path=metrics"], "--metrics-path"),
            (&["--http-endpoint=localhost"], "--http-endpoint"),
            (
                &[
                    "--leader-election",
                    "--metrics-path=/healthz/leader-election",
                ],
                "--metrics-path",
            ),
            (
                &["--leader-election", "--leader-election-lease-duration=10s"],
                "--leader-election-lease-duration",
            ),
            (
                &["--leader-election", "--leader-election-retry-period=9s"],
                "--leader-election-renew-deadline",
            ),
            (
                &["--leader-election", "--leader-election-retry-period=500ms"],
                "--leader-election-retry-period",
            ),
        ] {
            let a = ok(flags);
            match a.validate() {
                Ok(()) => panic!("{flags:?} validated"),
                Err(e) => assert!(e.to_string().contains(flag), "{flags:?}: {e}"),
            }
        }
        assert_eq!(
            ok(&["--http-endpoint=:8080", "--metrics-address=:8081"]).validate(),
            Err(ConfigError::EndpointConflict)
        );
        // Bounds are inclusive.
        assert_eq!(ok(&["--volume-name-uuid-length=32"]).validate(), Ok(()));
        assert_eq!(ok(&["--volume-name-uuid-length=0"]).validate(), Ok(()));
        // Leader-election timing is only checked when leader election is on.
        assert_eq!(
            ok(&["--leader-election-lease-duration=1s"]).validate(),
            Ok(())
        );
    }

    #[test]
    fn go_durations() {
        let ms = Duration::from_millis;
        for (s, d) in [
            ("0", Duration::ZERO),
            ("-0", Duration::ZERO),
            ("-0s", Duration::ZERO),
            ("+5s", secs(5)),
            ("10s", secs(10)),
            ("5m", secs(300)),
            ("1m30s", secs(90)),
            ("500ms", ms(500)),
            ("1.5h", secs(5400)),
            ("2h45m", secs(9900)),
            (".5s", ms(500)),
            ("1.s", secs(1)),
            ("3us", Duration::from_micros(3)),
            ("3µs", Duration::from_micros(3)),
            ("7ns", Duration::from_nanos(7)),
            ("1.0000000001s", Duration::from_nanos(1_000_000_000)),
        ] {
            assert_eq!(parse_go_duration(s), Ok(d), "{s}");
        }
        for s in [
            "",
            "s",
            "10",
            "1x",
            ".s",
            "1h-5m",
            "-1s",
            "1..5s",
            "9999999999h",
        ] {
            assert!(parse_go_duration(s).is_err(), "{s}");
        }
    }

    #[test]
    fn feature_gate_resolution() {
        let a = ok(&[
            "--feature-gates=Topology=false",
            "--feature-gates= ReleaseLeaderElectionOnExit = true ,LoggingBetaOptions=false",
            "--feature-gates=AllAlpha=true,CrossNamespaceVolumeDataSource=false",
        ]);
        let g = a.feature_gates();
        assert!(!g.enabled(Gate::Topology));
        assert!(g.enabled(Gate::ReleaseLeaderElectionOnExit));
        // Explicit beats AllAlpha regardless of order.
        assert!(!g.enabled(Gate::CrossNamespaceVolumeDataSource));
        assert!(g.is_explicit(Gate::Topology));
        assert!(!g.is_explicit(Gate::VolumeAttributesClass));
        assert!(ok(&["--feature-gates="]).feature_gates() == FeatureGates::default());
    }

    #[test]
    fn labels_accumulate_and_later_keys_win() {
        let a = ok(&[
            "--leader-election-labels=a:1,b:2",
            "--leader-election-labels=b:3",
        ]);
        assert_eq!(
            a.leader_election_labels(),
            BTreeMap::from([("a".into(), "1".into()), ("b".into(), "3".into())])
        );
        assert!(parse_label_list("").is_err());
    }

    #[test]
    fn version_line_is_argv0_and_version() {
        assert_eq!(
            version_line("/csi-provisioner"),
            format!("/csi-provisioner {VERSION}")
        );
        assert!(ok(&["--version"]).version);
    }
}
