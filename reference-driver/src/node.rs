//! The filesystem side of the node service: staging and publish targets, bind mounts of the
//! volumes' data onto them, and volume statistics. `service` decides, records and calls these.

use std::fs;
use std::io;
use std::path::Path;

use csi_spec as csi;
use csi_spec::volume_usage::Unit;

use super::state::AccessKind;
use super::{loopdev, mounts};

/// A directory at `path` (parents included); a non-directory in the way is an error.
pub fn ensure_dir(path: &Path) -> io::Result<()> {
    fs::create_dir_all(path)?;
    if fs::metadata(path)?.is_dir() {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "a non-directory is in the way",
        ))
    }
}

/// A file at `path` to bind a block volume's file onto (parents included); a directory in the
/// way is an error.
pub fn ensure_file(path: &Path) -> io::Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    if path.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "a directory is in the way",
        ));
    }
    fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map(drop)
}

/// Removes a publish target: an (empty) directory or a file; nothing there is fine.
pub fn remove_target(path: &Path) -> io::Result<()> {
    let removed = match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir(path),
        Ok(_) => fs::remove_file(path),
        Err(e) => Err(e),
    };
    match removed {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Makes `target` show `source`: a directory for mount access; for block access, the loop
/// device backed by the `.block` file (a container runtime maps only device nodes into a pod;
/// see `loopdev`). Read-only if asked. Already mounted is left as it is (made read-only again
/// if asked), so a retry after any partial attempt converges.
pub fn publish(source: &Path, target: &Path, access: AccessKind, readonly: bool) -> io::Result<()> {
    match access {
        AccessKind::Mount => ensure_dir(target)?,
        AccessKind::Block => ensure_file(target)?,
    }
    if !mounts::is_mount_point(target)? {
        match access {
            AccessKind::Mount => mounts::bind(source, target)?,
            AccessKind::Block => mounts::bind(&loopdev::attach(source, readonly)?, target)?,
        }
    }
    if readonly {
        mounts::remount_readonly(target)?;
    }
    Ok(())
}

/// Whether the mount on `target` shows the volume whose data is at `data`: bound from the
/// data (or a staging bind of it) for mount access, from a loop device backed by the data's
/// file for block access.
pub fn shows_volume(target: &Path, data: &Path, access: AccessKind) -> io::Result<bool> {
    if mounts::mounted_from(target, data)? {
        return Ok(true);
    }
    match access {
        AccessKind::Mount => Ok(false),
        AccessKind::Block => {
            for device in loopdev::devices(data)? {
                if mounts::mounted_from(target, &device)? {
                    return Ok(true);
                }
            }
            Ok(false)
        }
    }
}

/// Detaches the loop devices of a block volume's file, once no target of it is left (the last
/// unpublication, or a failed first publication); see `loopdev`.
pub fn release_block(data: &Path) -> io::Result<()> {
    loopdev::detach(data)
}

/// Usage of a mount volume at `path` (the filesystem holding the state directory: volumes
/// share it, so these are that filesystem's numbers), or of a block volume of `capacity` bytes.
pub fn stats(path: &Path, access: AccessKind, capacity: i64) -> io::Result<Vec<csi::VolumeUsage>> {
    match access {
        AccessKind::Block => Ok(vec![csi::VolumeUsage {
            available: 0,
            total: capacity,
            used: 0,
            unit: Unit::Bytes as i32,
        }]),
        AccessKind::Mount => {
            let vfs = rustix::fs::statvfs(path)?;
            let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            let total = vfs.f_blocks.saturating_mul(vfs.f_frsize);
            let free = vfs.f_bfree.saturating_mul(vfs.f_frsize);
            let available = vfs.f_bavail.saturating_mul(vfs.f_frsize);
            Ok(vec![
                csi::VolumeUsage {
                    available: n(available),
                    total: n(total),
                    used: n(total.saturating_sub(free)),
                    unit: Unit::Bytes as i32,
                },
                csi::VolumeUsage {
                    available: n(vfs.f_favail),
                    total: n(vfs.f_files),
                    used: n(vfs.f_files.saturating_sub(vfs.f_ffree)),
                    unit: Unit::Inodes as i32,
                },
            ])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_made_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("a/b/mount");
        ensure_dir(&target).unwrap();
        ensure_dir(&target).unwrap();
        assert!(target.is_dir());
        assert!(ensure_file(&target).is_err(), "a directory is in the way");
        remove_target(&target).unwrap();
        remove_target(&target).unwrap();
        assert!(!target.exists());

        let file = dir.path().join("p/dev");
        ensure_file(&file).unwrap();
        ensure_file(&file).unwrap();
        assert!(file.is_file());
        assert!(ensure_dir(&file).is_err());
        remove_target(&file).unwrap();
        assert!(!file.exists());
    }

    #[test]
    fn stats_of_a_directory_and_a_block_volume() {
        let dir = tempfile::tempdir().unwrap();
        let usage = stats(dir.path(), AccessKind::Mount, 1).unwrap();
        assert_eq!(usage.len(), 2);
        assert!(usage[0].total > 0 && usage[0].used <= usage[0].total);
        assert_eq!(usage[1].unit, Unit::Inodes as i32);
        let block = stats(dir.path(), AccessKind::Block, 4096).unwrap();
        assert_eq!(block[0].total, 4096);
        assert!(stats(&dir.path().join("missing"), AccessKind::Mount, 1).is_err());
    }
}
