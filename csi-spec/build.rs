//! Compiles proto/csi.proto with protox (a pure-Rust protobuf compiler), so no system `protoc`
//! is needed, then generates the prost messages and tonic clients and servers.

/// Messages with a `secrets` field (every `csi_secret` field of CSI v1.12 is named so).
/// Their derived `Debug` is suppressed; src/lib.rs implements one that redacts the values,
/// so no code path can print a secret through `{:?}`.
const MESSAGES_WITH_SECRETS: &[&str] = &[
    "CreateVolumeRequest",
    "DeleteVolumeRequest",
    "ControllerPublishVolumeRequest",
    "ControllerUnpublishVolumeRequest",
    "ValidateVolumeCapabilitiesRequest",
    "ControllerModifyVolumeRequest",
    "CreateSnapshotRequest",
    "DeleteSnapshotRequest",
    "ListSnapshotsRequest",
    "GetSnapshotRequest",
    "ControllerExpandVolumeRequest",
    "NodeStageVolumeRequest",
    "NodePublishVolumeRequest",
    "NodeExpandVolumeRequest",
    "CreateVolumeGroupSnapshotRequest",
    "DeleteVolumeGroupSnapshotRequest",
    "GetVolumeGroupSnapshotRequest",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/csi.proto");
    let descriptors = protox::compile(["proto/csi.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .skip_debug(MESSAGES_WITH_SECRETS.iter().map(|m| format!(".csi.v1.{m}")))
        .compile_fds(descriptors)?;
    Ok(())
}
