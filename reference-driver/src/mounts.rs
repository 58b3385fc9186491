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

/// One line of mountinfo: the device (`major:minor`), the root of the mount within that device's
/// filesystem, and the mount point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    pub device: String,
    pub root: PathBuf,
    pub point: PathBuf,
}

/// The mounts listed in a mountinfo text, in order (a later one is mounted over an earlier one).
pub fn parse_mounts(mountinfo: &str) -> Vec<MountEntry> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ').skip(2);
            let device = fields.next()?.to_string();
            let root = unescape(fields.next()?);
            let point = unescape(fields.next()?);
            Some(MountEntry {
                device,
                root,
                point,
            })
        })
        .collect()
}

/// Whether the mount on top of `target` shows `source` (a file or directory): the same device
/// and the same path within it, as a bind mount of `source` (or of a bind mount of it) does.
/// False when nothing is mounted on `target` or `source` does not exist.
pub fn mounted_from(target: &Path, source: &Path) -> io::Result<bool> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")?;
    let Ok(source) = fs::canonicalize(source) else {
        return Ok(false);
    };
    Ok(shows(&parse_mounts(&mountinfo), target, &source))
}

/// [`mounted_from`] on a parsed table, `source` already canonical.
fn shows(mounts: &[MountEntry], target: &Path, source: &Path) -> bool {
    let given = target.components().collect::<PathBuf>();
    let resolved = fs::canonicalize(target).ok();
    let Some(top) = mounts
        .iter()
        .rev()
        .find(|m| m.point == given || resolved.as_ref() == Some(&m.point))
    else {
        return false;
    };
    // The mount holding `source`: the deepest mount point above it, the latest of equals.
    let Some((holder, rest)) = mounts
        .iter()
        .enumerate()
        .filter_map(|(i, m)| source.strip_prefix(&m.point).ok().map(|rest| (i, m, rest)))
        .max_by_key(|(i, m, _)| (m.point.components().count(), *i))
        .map(|(_, m, rest)| (m, rest))
    else {
        return false;
    };
    let source_root = holder.root.join(rest).components().collect::<PathBuf>();
    top.device == holder.device && top.root.components().collect::<PathBuf>() == source_root
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
    fn finds_the_source_of_a_bind_mount() {
        let text = "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n\
                    2 1 0:40 / /srv rw - tmpfs tmpfs rw\n\
                    3 1 0:40 /state/volumes/v1 /mnt/stage rw - tmpfs tmpfs rw\n\
                    4 1 0:40 /state/volumes/v1 /mnt/pod rw - tmpfs tmpfs rw\n\
                    5 1 8:1 /home/x /mnt/other rw - ext4 /dev/sda1 rw\n";
        let mounts = parse_mounts(text);
        assert_eq!(mounts.len(), 5);
        assert_eq!(mounts[2].root, PathBuf::from("/state/volumes/v1"));
        let v1 = Path::new("/srv/state/volumes/v1");
        let v2 = Path::new("/srv/state/volumes/v2");
        assert!(shows(&mounts, Path::new("/mnt/stage"), v1));
        assert!(shows(&mounts, Path::new("/mnt/pod/"), v1));
        assert!(!shows(&mounts, Path::new("/mnt/pod"), v2));
        assert!(!shows(&mounts, Path::new("/mnt/other"), v1));
        assert!(!shows(&mounts, Path::new("/mnt/none"), v1));
        assert!(shows(
            &mounts,
            Path::new("/mnt/other"),
            Path::new("/home/x")
        ));
    }

    #[test]
    fn the_root_is_a_mount_point_and_a_fresh_dir_is_not() {
        assert!(is_mount_point(Path::new("/")).unwrap());
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_mount_point(dir.path()).unwrap());
        assert!(!is_mount_point(&dir.path().join("missing")).unwrap());
    }
}
