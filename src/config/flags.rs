//! The flag table: every flag with how it relates to upstream. docs/flags.md shows the same
//! table for people; a test holds the two together.

/// Whether a flag's behaviour matches upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagStatus {
    /// Same name, type, default and behaviour as upstream.
    Same,
    /// Accepted with the same default, but deliberately behaves differently (docs/flags.md).
    Different,
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
        up("prevent-volume-mode-conversion", Same),
        up("strict-topology", Same),
        up("immediate-topology", Same),
        up("enable-capacity", Same),
        up("capacity-for-immediate-binding", Same),
        up("capacity-poll-interval", Same),
        up("capacity-ownerref-level", Same),
        up("capacity-threads", Same),
        up("kube-api-capacity-qps", Same),
        up("kube-api-capacity-burst", Same),
        up("node-deployment", Different),
        up("node-deployment-immediate-binding", Different),
        up("node-deployment-base-delay", Same),
        up("node-deployment-max-delay", Same),
        up("leader-election", Different),
        up("leader-election-namespace", Same),
        up("leader-election-lease-duration", Same),
        up("leader-election-renew-deadline", Same),
        up("leader-election-retry-period", Same),
        up("leader-election-labels", Same),
        up("http-endpoint", Same),
        up("metrics-address", Same),
        up("metrics-path", Same),
        up("enable-pprof", Different),
        up("retry-interval-start", Same),
        up("retry-interval-max", Same),
        up("worker-threads", Different),
        up("cloning-protection-threads", Same),
        up("snapshot-orphan-sweep-interval", Same),
        up("feature-gates", Different),
        up("logging-format", Different),
        up("log-flush-frequency", Same),
        up("v", Different),
        up("vmodule", Different),
        up("log-text-split-stream", Different),
        up("log-text-info-buffer-size", Different),
        up("log-json-split-stream", Different),
        up("log-json-info-buffer-size", Different),
        ours("max-concurrent-per-storage-class", Built),
        ours("adaptive-call-rate", Built),
        ours("audit-volumes-interval", Built),
        ours("audit-delete-after", Built),
        ours("provisioning-consistency-default", Built),
        ours("drain", Built),
        ours("copy-claim-labels", Built),
        ours("extra-create-metadata-claim-annotations", Built),
        ours("extra-create-metadata-namespace-labels", Built),
        ours("extra-create-metadata-namespace-annotations", Built),
    ]
};
