//! Argument checks that run before any lookup, so a request that is both malformed and about an
//! unknown object is INVALID_ARGUMENT (csi-sanity sends such requests and expects exactly that).

use csi_spec as csi;
use csi_spec::volume_capability::AccessType;
use csi_spec::volume_capability::access_mode::Mode;

use super::state::{AccessKind, ContentSource, CreateVolumeArgs, CsiError, Features, Publication};
use super::topology::{Labels, Requirements};

pub fn required(field: &str, value: &str) -> Result<(), CsiError> {
    if value.is_empty() {
        Err(CsiError::InvalidArgument(format!("{field} is required")))
    } else {
        Ok(())
    }
}

/// Access modes this driver serves. The single-node single/multi-writer modes need the
/// SINGLE_NODE_MULTI_WRITER capability, which the driver does not advertise.
fn supported_mode(mode: i32) -> bool {
    matches!(
        Mode::try_from(mode),
        Ok(Mode::SingleNodeWriter
            | Mode::SingleNodeReaderOnly
            | Mode::MultiNodeReaderOnly
            | Mode::MultiNodeSingleWriter
            | Mode::MultiNodeMultiWriter)
    )
}

/// The access kind of a well-formed capability, and whether its mode is one we serve.
pub fn capability(cap: &csi::VolumeCapability) -> Result<(AccessKind, bool), CsiError> {
    let access = match cap.access_type {
        Some(AccessType::Mount(_)) => AccessKind::Mount,
        Some(AccessType::Block(_)) => AccessKind::Block,
        None => {
            return Err(CsiError::InvalidArgument(
                "volume capability needs an access type (mount or block)".into(),
            ));
        }
    };
    let mode = cap.access_mode.map(|m| m.mode).unwrap_or_default();
    if mode == Mode::Unknown as i32 {
        return Err(CsiError::InvalidArgument(
            "volume capability needs an access mode".into(),
        ));
    }
    Ok((access, supported_mode(mode)))
}

/// A capability this driver can serve, as its access kind.
fn served_capability(cap: &csi::VolumeCapability) -> Result<AccessKind, CsiError> {
    match capability(cap)? {
        (access, true) => Ok(access),
        (_, false) => Err(CsiError::InvalidArgument(format!(
            "unsupported access mode {:?}",
            cap.access_mode.map(|m| m.mode).unwrap_or_default()
        ))),
    }
}

pub fn create_volume(req: &csi::CreateVolumeRequest) -> Result<CreateVolumeArgs, CsiError> {
    required("name", &req.name)?;
    if req.name.chars().any(char::is_control) {
        return Err(CsiError::InvalidArgument(
            "name must not contain control characters".into(),
        ));
    }
    if req.volume_capabilities.is_empty() {
        return Err(CsiError::InvalidArgument(
            "volume_capabilities is required".into(),
        ));
    }
    let mut access = None;
    for cap in &req.volume_capabilities {
        let kind = served_capability(cap)?;
        if access.is_some_and(|a| a != kind) {
            return Err(CsiError::InvalidArgument(
                "volume_capabilities mix block and mount access".into(),
            ));
        }
        access = Some(kind);
    }
    let access = access.unwrap_or(AccessKind::Mount);
    let (required_bytes, limit_bytes) = req
        .capacity_range
        .map(|r| (r.required_bytes, r.limit_bytes))
        .unwrap_or_default();
    if required_bytes < 0 || limit_bytes < 0 {
        return Err(CsiError::InvalidArgument(
            "capacity_range must not be negative".into(),
        ));
    }
    if limit_bytes > 0 && required_bytes > limit_bytes {
        return Err(CsiError::InvalidArgument(format!(
            "required_bytes {required_bytes} exceeds limit_bytes {limit_bytes}"
        )));
    }
    let source = match &req.volume_content_source {
        None => None,
        Some(source) => Some(content_source(source)?),
    };
    let requirements = req
        .accessibility_requirements
        .as_ref()
        .map(|r| Requirements {
            requisite: r.requisite.iter().map(labels).collect(),
            preferred: r.preferred.iter().map(labels).collect(),
        })
        .unwrap_or_default();
    Ok(CreateVolumeArgs {
        name: req.name.clone(),
        required_bytes,
        limit_bytes,
        access,
        parameters: req
            .parameters
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        mutable_parameters: req
            .mutable_parameters
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        source,
        requirements,
    })
}

/// `mutable_parameters` need MODIFY_VOLUME (`--modify-volume`): without it they are
/// INVALID_ARGUMENT, as the spec asks of a plugin that does not support them.
pub fn mutable_parameters_served(
    args: &CreateVolumeArgs,
    features: Features,
) -> Result<(), CsiError> {
    if args.mutable_parameters.is_empty() || features.modify_volume {
        return Ok(());
    }
    Err(CsiError::InvalidArgument(
        "mutable_parameters are not supported (no MODIFY_VOLUME capability)".into(),
    ))
}

fn content_source(source: &csi::VolumeContentSource) -> Result<ContentSource, CsiError> {
    use csi::volume_content_source::Type;
    match &source.r#type {
        Some(Type::Snapshot(s)) => {
            required("volume_content_source.snapshot.snapshot_id", &s.snapshot_id)?;
            Ok(ContentSource::Snapshot(s.snapshot_id.clone()))
        }
        Some(Type::Volume(v)) => {
            required("volume_content_source.volume.volume_id", &v.volume_id)?;
            Ok(ContentSource::Volume(v.volume_id.clone()))
        }
        None => Err(CsiError::InvalidArgument(
            "volume_content_source names neither a snapshot nor a volume".into(),
        )),
    }
}

/// A content source of a kind this driver does not serve (`--no-snapshots`, `--no-clone`) is
/// INVALID_ARGUMENT, the spec's code for an unsupported source, whether or not it exists.
pub fn source_served(source: Option<&ContentSource>, features: Features) -> Result<(), CsiError> {
    match source {
        Some(ContentSource::Snapshot(_)) if !features.snapshots => Err(CsiError::InvalidArgument(
            "this driver serves no snapshots, so no volume can be created from one".into(),
        )),
        Some(ContentSource::Volume(_)) if !features.clone => Err(CsiError::InvalidArgument(
            "this driver does not clone volumes".into(),
        )),
        _ => Ok(()),
    }
}

pub fn labels(topology: &csi::Topology) -> Labels {
    topology
        .segments
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// A node path must be absolute: a relative one would be resolved against the driver's working
/// directory, which is nobody's intent.
pub fn absolute(field: &str, value: &str) -> Result<(), CsiError> {
    if std::path::Path::new(value).is_absolute() {
        Ok(())
    } else {
        Err(CsiError::InvalidArgument(format!(
            "{field} must be an absolute path, got {value:?}"
        )))
    }
}

/// The checked part of NodePublishVolume: volume id, target path (and staging path, if given,
/// both absolute) and the publication wanted.
pub fn node_publish(req: &csi::NodePublishVolumeRequest) -> Result<Publication, CsiError> {
    required("volume_id", &req.volume_id)?;
    required("target_path", &req.target_path)?;
    absolute("target_path", &req.target_path)?;
    if !req.staging_target_path.is_empty() {
        absolute("staging_target_path", &req.staging_target_path)?;
    }
    let cap = req
        .volume_capability
        .as_ref()
        .ok_or_else(|| CsiError::InvalidArgument("volume_capability is required".into()))?;
    Ok(Publication {
        access: served_capability(cap)?,
        readonly: req.readonly,
    })
}

/// The checked part of NodeStageVolume: volume id, staging path (absolute) and the access kind
/// wanted.
pub fn node_stage(req: &csi::NodeStageVolumeRequest) -> Result<AccessKind, CsiError> {
    required("volume_id", &req.volume_id)?;
    required("staging_target_path", &req.staging_target_path)?;
    absolute("staging_target_path", &req.staging_target_path)?;
    let cap = req
        .volume_capability
        .as_ref()
        .ok_or_else(|| CsiError::InvalidArgument("volume_capability is required".into()))?;
    served_capability(cap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_spec::volume_capability::{AccessMode, BlockVolume, MountVolume};

    fn cap(block: bool, mode: Mode) -> csi::VolumeCapability {
        csi::VolumeCapability {
            access_type: Some(if block {
                AccessType::Block(BlockVolume {})
            } else {
                AccessType::Mount(MountVolume::default())
            }),
            access_mode: Some(AccessMode { mode: mode as i32 }),
        }
    }

    fn request() -> csi::CreateVolumeRequest {
        csi::CreateVolumeRequest {
            name: "pvc-1".into(),
            volume_capabilities: vec![cap(false, Mode::SingleNodeWriter)],
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 10,
                limit_bytes: 20,
            }),
            ..Default::default()
        }
    }

    fn invalid(req: csi::CreateVolumeRequest) -> bool {
        matches!(create_volume(&req), Err(CsiError::InvalidArgument(_)))
    }

    #[test]
    fn accepts_a_plain_request() {
        let args = create_volume(&request()).unwrap();
        assert_eq!((args.required_bytes, args.limit_bytes), (10, 20));
        assert_eq!(args.access, AccessKind::Mount);
        assert_eq!(args.source, None);
    }

    #[test]
    fn rejects_malformed_create_requests() {
        assert!(invalid(csi::CreateVolumeRequest::default()));
        assert!(invalid(csi::CreateVolumeRequest {
            volume_capabilities: vec![],
            ..request()
        }));
        assert!(invalid(csi::CreateVolumeRequest {
            name: "a\u{7}b".into(),
            ..request()
        }));
        assert!(invalid(csi::CreateVolumeRequest {
            volume_capabilities: vec![
                cap(false, Mode::SingleNodeWriter),
                cap(true, Mode::SingleNodeWriter)
            ],
            ..request()
        }));
        assert!(invalid(csi::CreateVolumeRequest {
            volume_capabilities: vec![cap(false, Mode::Unknown)],
            ..request()
        }));
        assert!(invalid(csi::CreateVolumeRequest {
            volume_capabilities: vec![cap(false, Mode::SingleNodeMultiWriter)],
            ..request()
        }));
        assert!(invalid(csi::CreateVolumeRequest {
            volume_capabilities: vec![csi::VolumeCapability::default()],
            ..request()
        }));
        assert!(invalid(csi::CreateVolumeRequest {
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 30,
                limit_bytes: 20
            }),
            ..request()
        }));
        assert!(invalid(csi::CreateVolumeRequest {
            capacity_range: Some(csi::CapacityRange {
                required_bytes: -1,
                limit_bytes: 0
            }),
            ..request()
        }));
        assert!(invalid(csi::CreateVolumeRequest {
            volume_content_source: Some(csi::VolumeContentSource { r#type: None }),
            ..request()
        }));
    }

    #[test]
    fn mutable_parameters_need_modify_volume() {
        let args = create_volume(&csi::CreateVolumeRequest {
            mutable_parameters: [("iops".to_string(), "3000".to_string())].into(),
            ..request()
        })
        .expect("valid request");
        assert_eq!(
            args.mutable_parameters,
            std::collections::BTreeMap::from([("iops".to_string(), "3000".to_string())])
        );
        let modifying = Features {
            modify_volume: true,
            ..Features::default()
        };
        assert_eq!(mutable_parameters_served(&args, modifying), Ok(()));
        assert!(matches!(
            mutable_parameters_served(&args, Features::default()),
            Err(CsiError::InvalidArgument(_))
        ));
        let plain = create_volume(&request()).expect("valid request");
        assert_eq!(
            mutable_parameters_served(&plain, Features::default()),
            Ok(())
        );
    }

    #[test]
    fn sources_need_their_feature() {
        let snapshot = ContentSource::Snapshot("snap-1".into());
        let volume = ContentSource::Volume("vol-1".into());
        let all = Features::default();
        let none = Features {
            snapshots: false,
            clone: false,
            get_capacity: true,
            modify_volume: false,
        };
        for source in [None, Some(&snapshot), Some(&volume)] {
            assert_eq!(source_served(source, all), Ok(()));
        }
        assert_eq!(source_served(None, none), Ok(()));
        for source in [&snapshot, &volume] {
            assert!(matches!(
                source_served(Some(source), none),
                Err(CsiError::InvalidArgument(_))
            ));
        }
        let clone_only = Features {
            snapshots: false,
            clone: true,
            get_capacity: true,
            modify_volume: false,
        };
        assert_eq!(source_served(Some(&volume), clone_only), Ok(()));
    }

    #[test]
    fn node_publish_checks_fields_in_order() {
        let base = csi::NodePublishVolumeRequest {
            volume_id: "fake-vol-id-1".into(),
            target_path: "/t".into(),
            volume_capability: Some(cap(true, Mode::SingleNodeWriter)),
            readonly: true,
            ..Default::default()
        };
        assert_eq!(
            node_publish(&base),
            Ok(Publication {
                access: AccessKind::Block,
                readonly: true
            })
        );
        for broken in [
            csi::NodePublishVolumeRequest {
                volume_id: String::new(),
                ..base.clone()
            },
            csi::NodePublishVolumeRequest {
                target_path: String::new(),
                ..base.clone()
            },
            csi::NodePublishVolumeRequest {
                volume_capability: None,
                ..base.clone()
            },
        ] {
            assert!(matches!(
                node_publish(&broken),
                Err(CsiError::InvalidArgument(_))
            ));
        }
    }

    #[test]
    fn node_requests_need_their_fields() {
        let staged = csi::NodeStageVolumeRequest {
            volume_id: "vol-1".into(),
            staging_target_path: "/staging".into(),
            volume_capability: Some(cap(true, Mode::SingleNodeWriter)),
            ..Default::default()
        };
        assert_eq!(node_stage(&staged), Ok(AccessKind::Block));
        for broken in [
            csi::NodeStageVolumeRequest {
                volume_id: String::new(),
                ..staged.clone()
            },
            csi::NodeStageVolumeRequest {
                staging_target_path: String::new(),
                ..staged.clone()
            },
            csi::NodeStageVolumeRequest {
                staging_target_path: "relative/staging".into(),
                ..staged.clone()
            },
            csi::NodeStageVolumeRequest {
                volume_capability: None,
                ..staged.clone()
            },
            csi::NodeStageVolumeRequest {
                volume_capability: Some(csi::VolumeCapability {
                    access_type: None,
                    ..cap(false, Mode::SingleNodeWriter)
                }),
                ..staged.clone()
            },
            csi::NodeStageVolumeRequest {
                volume_capability: Some(cap(false, Mode::SingleNodeSingleWriter)),
                ..staged.clone()
            },
        ] {
            assert!(
                matches!(node_stage(&broken), Err(CsiError::InvalidArgument(_))),
                "{broken:?}"
            );
        }
        let published = csi::NodePublishVolumeRequest {
            volume_id: "vol-1".into(),
            target_path: "/target".into(),
            volume_capability: Some(cap(false, Mode::SingleNodeWriter)),
            readonly: true,
            ..Default::default()
        };
        assert_eq!(
            node_publish(&published),
            Ok(Publication {
                access: AccessKind::Mount,
                readonly: true
            })
        );
        for broken in [
            csi::NodePublishVolumeRequest {
                volume_id: String::new(),
                ..published.clone()
            },
            csi::NodePublishVolumeRequest {
                target_path: String::new(),
                ..published.clone()
            },
            csi::NodePublishVolumeRequest {
                target_path: "target".into(),
                ..published.clone()
            },
            csi::NodePublishVolumeRequest {
                staging_target_path: "./staging".into(),
                ..published.clone()
            },
            csi::NodePublishVolumeRequest {
                volume_capability: None,
                ..published.clone()
            },
        ] {
            assert!(
                matches!(node_publish(&broken), Err(CsiError::InvalidArgument(_))),
                "{broken:?}"
            );
        }
    }
}
