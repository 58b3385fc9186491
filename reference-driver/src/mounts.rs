//! Bind mounts through the mount(2) syscall (rustix), and mount-point checks that read
//! `/proc/self/mountinfo` rather than guess. Public so tests can check and clean up mounts.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use rustix::fs::StatVfsMountFlags;
use rustix::mount::{MountFlags, UnmountFlags};

/// How many mounts stacked on one path [`unmount_all`] takes off before giving up.
const MAX_STACKED: usize = 16;

/// Undoes the octal escapes the kernel writes for space, tab, newline and backslash.
fn unescape(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let value = bytes[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
            out.push(u8::try_from(value).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    use std::os::unix::ffi::OsStringExt;
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// The mount points listed in a mountinfo text (the fifth field of each line).
pub fn parse_mount_points(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape)
        .collect()
}

/// Whether something is mounted on `path` in this process's mount namespace. The path is
/// compared as given (without a trailing `/`) and, if it exists, with its symlinks resolved.
pub fn is_mount_point(path: &Path) -> io::Result<bool> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")?;
    let points = parse_mount_points(&mountinfo);
    let given = path.components().collect::<PathBuf>();
    let resolved = fs::canonicalize(path).ok();
    Ok(points
        .iter()
        .any(|p| *p == given || resolved.as_ref() == Some(p)))
}

/// `mount --bind source target`.
pub fn bind(source: &Path, target: &Path) -> io::Result<()> {
    rustix::mount::mount_bind(source, target).map_err(io::Error::from)
}

/// Makes the bind mount at `target` read-only, keeping its nosuid/nodev/noexec/atime flags (a
/// bind remount replaces them all, and some may not be cleared).
pub fn remount_readonly(target: &Path) -> io::Result<()> {
    let current = rustix::fs::statvfs(target)?.f_flag;
    let mut flags = MountFlags::BIND | MountFlags::RDONLY;
    for (has, keep) in [
        (StatVfsMountFlags::NOSUID, MountFlags::NOSUID),
        (StatVfsMountFlags::NODEV, MountFlags::NODEV),
        (StatVfsMountFlags::NOEXEC, MountFlags::NOEXEC),
        (StatVfsMountFlags::NOATIME, MountFlags::NOATIME),
        (StatVfsMountFlags::NODIRATIME, MountFlags::NODIRATIME),
        (StatVfsMountFlags::RELATIME, MountFlags::RELATIME),
    ] {
        if current.contains(has) {
            flags |= keep;
        }
    }
    rustix::mount::mount_remount(target, flags, c"").map_err(io::Error::from)
}

/// Unmounts everything stacked on `path` (nothing mounted is fine).
pub fn unmount_all(path: &Path) -> io::Result<()> {
    for _ in 0..MAX_STACKED {
        if !is_mount_point(path)? {
            return Ok(());
        }
        rustix::mount::unmount(path, UnmountFlags::empty())?;
    }
    Err(io::Error::other(format!(
        "{} is still a mount point after {MAX_STACKED} unmounts",
        path.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo_with_escapes() {
        let text = "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 - ext3 /dev/root rw\n\
                    37 35 98:0 / / rw - ext4 /dev/vda rw\n\
                    38 35 0:5 /x /back\\134slash rw - tmpfs tmpfs rw\n";
        assert_eq!(
            parse_mount_points(text),
            [
                PathBuf::from("/mnt/with space"),
                PathBuf::from("/"),
                PathBuf::from("/back\\slash")
            ]
        );
    }

    #[test]
    fn the_root_is_a_mount_point_and_a_fresh_dir_is_not() {
        assert!(is_mount_point(Path::new("/")).unwrap());
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_mount_point(dir.path()).unwrap());
        assert!(!is_mount_point(&dir.path().join("missing")).unwrap());
    }
}
