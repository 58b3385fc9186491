//! `csi_sidecar_operations_seconds`: every call to the driver, recorded by `csi_client`
//! (csi-lib-utils' metric, with its buckets and labels).

use std::time::Duration;

use prometheus_client::encoding::{EncodeLabel, EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::HistogramFamily;

/// `driver_name` of CSI calls made before GetPluginInfo told us the driver's name.
pub const UNKNOWN_DRIVER: &str = "unknown-driver";

/// `grpc_status_code` of a CSI call that failed without any gRPC status.
pub const NON_GRPC_STATUS: &str = "unknown-non-grpc";

/// Buckets of `csi_sidecar_operations_seconds` (csi-lib-utils' values).
const CSI_OPERATION_BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];

/// Labels of `csi_sidecar_operations_seconds`, in upstream's order; `migrated` ("true" or
/// "false") only for a driver that is a CSI migration target, as upstream's.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct CsiOperationLabels {
    driver_name: String,
    method_name: &'static str,
    grpc_status_code: &'static str,
    migrated: Option<bool>,
}

impl EncodeLabelSet for CsiOperationLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> Result<(), std::fmt::Error> {
        ("driver_name", self.driver_name.as_str()).encode(encoder.encode_label())?;
        ("method_name", self.method_name).encode(encoder.encode_label())?;
        ("grpc_status_code", self.grpc_status_code).encode(encoder.encode_label())?;
        match self.migrated {
            Some(migrated) => ("migrated", migrated).encode(encoder.encode_label()),
            None => Ok(()),
        }
    }
}

fn csi_operation_histogram() -> Histogram {
    Histogram::new(CSI_OPERATION_BUCKETS)
}

/// The CSI call metrics.
#[derive(Debug)]
pub(super) struct CsiMetrics {
    operations: HistogramFamily<CsiOperationLabels>,
}

impl CsiMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let operations: HistogramFamily<CsiOperationLabels> =
            Family::new_with_constructor(csi_operation_histogram);
        registry.register(
            "csi_sidecar_operations_seconds",
            "Duration of CSI calls from the sidecar to the driver, by gRPC status code",
            operations.clone(),
        );
        CsiMetrics { operations }
    }

    /// See [`super::Metrics::observe_csi_operation`].
    pub(super) fn observe(
        &self,
        driver_name: &str,
        method_name: &'static str,
        grpc_status_code: &'static str,
        migrated: Option<bool>,
        elapsed: Duration,
    ) {
        self.operations
            .get_or_create(&CsiOperationLabels {
                driver_name: driver_name.to_string(),
                method_name,
                grpc_status_code,
                migrated,
            })
            .observe(elapsed.as_secs_f64());
    }
}
