//! Connecting to the CSI driver and checking that it can serve this sidecar.

use std::sync::Arc;

use tracing::info;

use super::error::AppError;
use crate::config::DriverArgs;
use crate::csi_client::{ClientOptions, CsiClient, DriverInfo, parse_csi_address};
use crate::metrics::Metrics;

/// Connects to `--csi-address`, waits until the driver is ready and reads what it reports.
/// Refuses a driver that cannot provision.
pub(super) async fn connect(
    args: &DriverArgs,
    metrics: Arc<Metrics>,
) -> Result<(CsiClient, DriverInfo), AppError> {
    let socket = parse_csi_address(&args.csi_address).map_err(AppError::CsiAddress)?;
    let options = ClientOptions {
        call_timeout: args.timeout,
        ..ClientOptions::default()
    };
    let (driver, info) = CsiClient::start(&socket, options, metrics)
        .await
        .map_err(AppError::Driver)?;
    info!(
        driver = info.name,
        version = info.vendor_version,
        can_provision = info.can_provision(),
        "connected to the CSI driver"
    );
    if !info.supports_controller_service() {
        return Err(AppError::NoControllerService {
            driver: info.name.clone(),
        });
    }
    if !info.supports_create_delete() {
        return Err(AppError::NoCreateDelete {
            driver: info.name.clone(),
        });
    }
    Ok((driver, info))
}
