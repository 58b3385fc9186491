//! Whether a PV's backend volume may be deleted while a VolumeAttachment names it (upstream's
//! attach check before DeleteVolume).
//!
//! A driver that reports PUBLISH_UNPUBLISH_VOLUME attaches volumes to nodes through
//! ControllerPublishVolume, driven by the attach-detach controller's VolumeAttachments. Deleting
//! a volume that is still published to a node would pull the storage out from under that node;
//! the VolumeAttachment goes only after ControllerUnpublishVolume succeeded, so while one names
//! the PV the volume is kept. Like upstream, the attacher, `status.attached` and a deletion in
//! progress do not matter: any attachment naming the PV blocks it.

use thiserror::Error;

use super::settings::DriverCapabilities;

/// What the check reads of one VolumeAttachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attachment<'a> {
    /// `metadata.name`, for the user told what the deletion waits for.
    pub name: &'a str,
    /// `spec.source.persistentVolumeName`; `None` for an inline (migrated) volume source.
    pub persistent_volume_name: Option<&'a str>,
    /// `spec.nodeName`.
    pub node_name: &'a str,
}

/// Why DeleteVolume is not sent yet because of attachments.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AttachmentError {
    /// Upstream's text, which admins search for.
    #[error("persistentvolume {volume} is still attached to node {node}")]
    StillAttached {
        volume: String,
        node: String,
        /// The VolumeAttachment's name.
        attachment: String,
    },
    /// The VolumeAttachment watch has not listed yet: an empty cache would say "detached" for
    /// a volume that is attached.
    #[error("failed to list volumeattachments: the watch has not listed them yet")]
    NotListed,
}

/// Whether the PV `pv_name`'s volume may be deleted now. Only a driver with
/// PUBLISH_UNPUBLISH_VOLUME attaches volumes, so only then are `attachments` looked at: `None`
/// means they are not known yet. The first attachment naming the PV blocks it.
pub fn check_detached<'a>(
    pv_name: &str,
    caps: &DriverCapabilities,
    attachments: Option<impl IntoIterator<Item = Attachment<'a>>>,
) -> Result<(), AttachmentError> {
    if !caps.publish_unpublish {
        return Ok(());
    }
    let attachments = attachments.ok_or(AttachmentError::NotListed)?;
    match attachments
        .into_iter()
        .find(|attachment| attachment.persistent_volume_name == Some(pv_name))
    {
        Some(attachment) => Err(AttachmentError::StillAttached {
            volume: pv_name.to_owned(),
            node: attachment.node_name.to_owned(),
            attachment: attachment.name.to_owned(),
        }),
        None => Ok(()),
    }
}

/// Whether a deletion refused by [`AttachmentError::StillAttached`] is news to the user: one
/// Normal `WaitingForDetach` event tells a wait (upstream #1574: a Warning on every retry reads
/// as a failure, when the deletion only waits for the attach-detach controller). `announced`:
/// the attachment the PV's current wait was announced for, `None` if it has not been (or the
/// PV was not waiting before). A wait on another attachment is a new wait.
pub fn announce_detach_wait(announced: Option<&str>, attachment: &str) -> bool {
    announced != Some(attachment)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::caps;

    fn attaching() -> DriverCapabilities {
        DriverCapabilities {
            publish_unpublish: true,
            ..caps()
        }
    }

    fn on(node: &'static str, pv: Option<&'static str>) -> Attachment<'static> {
        Attachment {
            name: "csi-attachment",
            persistent_volume_name: pv,
            node_name: node,
        }
    }

    #[test]
    fn an_attachment_naming_the_pv_blocks_its_deletion_with_upstreams_text() {
        let attachments = [on("node-2", Some("pv-2")), on("node-1", Some("pv-1"))];
        assert_eq!(
            check_detached("pv-1", &attaching(), Some(attachments)).map_err(|e| e.to_string()),
            Err("persistentvolume pv-1 is still attached to node node-1".to_owned())
        );
    }

    #[test]
    fn attachments_of_other_pvs_and_inline_volumes_do_not_block() {
        let attachments = [on("node-1", Some("pv-10")), on("node-1", None)];
        assert_eq!(
            check_detached("pv-1", &attaching(), Some(attachments)),
            Ok(())
        );
        assert_eq!(
            check_detached("pv-1", &attaching(), Some(Vec::new())),
            Ok(())
        );
    }

    #[test]
    fn attachments_not_listed_yet_block_every_deletion() {
        assert_eq!(
            check_detached("pv-1", &attaching(), None::<[Attachment; 0]>),
            Err(AttachmentError::NotListed)
        );
    }

    #[test]
    fn without_publish_unpublish_attachments_are_not_looked_at() {
        let attachments = [on("node-1", Some("pv-1"))];
        assert_eq!(check_detached("pv-1", &caps(), Some(attachments)), Ok(()));
        assert_eq!(
            check_detached("pv-1", &caps(), None::<[Attachment; 0]>),
            Ok(())
        );
    }

    #[test]
    fn the_refusal_names_the_attachment() {
        let attachments = [on("node-1", Some("pv-1"))];
        assert_eq!(
            check_detached("pv-1", &attaching(), Some(attachments)),
            Err(AttachmentError::StillAttached {
                volume: "pv-1".to_owned(),
                node: "node-1".to_owned(),
                attachment: "csi-attachment".to_owned(),
            })
        );
    }

    #[test]
    fn a_wait_is_announced_once_per_attachment() {
        assert!(announce_detach_wait(None, "csi-1"));
        assert!(!announce_detach_wait(Some("csi-1"), "csi-1"));
        assert!(announce_detach_wait(Some("csi-1"), "csi-2"));
    }
}
