//! The data of each volume on disk, under `<state-dir>/volumes/`: a directory `<id>/` for a
//! mount volume, a sparse file `<id>.block` of the volume's capacity for a block volume. Ids are
//! escaped ([`file_name`]) so that no id yields a `.`: a mount volume's name can never end in
//! `.block`, and two volumes never share a path.
//!
//! Ordering against the records in `state.json` (all of it happens under the state lock):
//! - CreateVolume makes the data (in a hidden temporary name, fsync-ed, renamed into place, the
//!   directory fsync-ed) *before* the record is saved, so a record never names missing data.
//! - DeleteVolume saves the record's removal *before* removing the data.
//!
//! A crash can therefore leave data without a record, never the reverse. [`VolumeData::sweep`]
//! runs at start-up and removes such data (and leftover temporary names), and makes empty data
//! for records that have none (state files of releases that kept no data).
//!
//! Snapshots keep a copy of their source's data under `<state-dir>/snapshots/` (same names), so
//! a restore starts with the data the source had when the snapshot was taken. Same order:
//! CreateSnapshot copies before it saves the record, DeleteSnapshot saves before it removes, the
//! sweep removes copies no record names. A snapshot of state files that kept no copy restores
//! empty. Block files are copied sparsely (their holes stay holes).

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::state::{AccessKind, State, VolumeRecord};

/// The directory under the state directory that holds the volumes' data.
pub const VOLUMES_DIR: &str = "volumes";
/// The directory under the state directory that holds the snapshots' copies.
pub const SNAPSHOTS_DIR: &str = "snapshots";
const BLOCK_SUFFIX: &str = ".block";

/// The data of every volume, under one directory.
#[derive(Clone, Debug)]
pub struct VolumeData {
    dir: PathBuf,
    snapshots: PathBuf,
}

/// A volume id as a file name: letters, digits, `-` and `_` are kept, as in `vol-<uuid>` ids;
/// every other byte, `.` included, is written `%XX` (ids from `--volume-id-prefix` may hold `/`
/// or `.`). The mapping is injective and never yields a `.`, so it cannot produce the
/// [`BLOCK_SUFFIX`] of a block volume's file, nor the `.`-prefixed temporary names.
pub fn file_name(id: &str) -> String {
    let plain = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_');
    let mut name = String::with_capacity(id.len());
    for b in id.bytes() {
        if plain(b) {
            name.push(char::from(b));
        } else {
            name.push_str(&format!("%{b:02X}"));
        }
    }
    name
}

impl VolumeData {
    pub fn new(state_dir: &Path) -> Self {
        Self {
            dir: state_dir.join(VOLUMES_DIR),
            snapshots: state_dir.join(SNAPSHOTS_DIR),
        }
    }

    /// Where the data of volume `id` with `access` lives.
    pub fn path(&self, id: &str, access: AccessKind) -> PathBuf {
        data_path(&self.dir, id, access)
    }

    /// Where the copy of snapshot `id` of a volume with `access` lives.
    fn snapshot_path(&self, id: &str, access: AccessKind) -> PathBuf {
        data_path(&self.snapshots, id, access)
    }

    /// The copy of snapshot `id` a volume with `access` restores from; None when the snapshot
    /// was of the other kind (the restore starts empty) or kept no copy.
    pub fn snapshot_source(&self, id: &str, access: AccessKind) -> Option<PathBuf> {
        let path = self.snapshot_path(id, access);
        let kind_matches = match (fs::symlink_metadata(&path), access) {
            (Ok(m), AccessKind::Mount) => m.is_dir(),
            (Ok(m), AccessKind::Block) => m.is_file(),
            (Err(_), _) => false,
        };
        kind_matches.then_some(path)
    }

    /// Copies the data of `volume` as snapshot `snapshot_id` (replacing a leftover copy no
    /// record names). Durable when this returns.
    pub fn create_snapshot(&self, snapshot_id: &str, volume: &VolumeRecord) -> io::Result<()> {
        fs::create_dir_all(&self.snapshots)?;
        let source = self.path(&volume.id, volume.access);
        make_in_place(
            &self.snapshot_path(snapshot_id, volume.access),
            volume,
            Some(&source),
        )
    }

    /// Removes the copy of snapshot `id` (of either kind; none is fine).
    pub fn remove_snapshot(&self, id: &str) -> io::Result<()> {
        remove_any(&self.snapshot_path(id, AccessKind::Mount))?;
        remove_any(&self.snapshot_path(id, AccessKind::Block))
    }

    /// Where releases before the `.` escape kept the data (ids with a `.` only): found by
    /// [`VolumeData::sweep`] and moved to [`VolumeData::path`].
    fn legacy_path(&self, id: &str, access: AccessKind) -> PathBuf {
        let mut name = file_name(id).replace("%2E", ".");
        if name.starts_with('.') {
            name.replace_range(..1, "%2E");
        }
        match access {
            AccessKind::Mount => self.dir.join(name),
            AccessKind::Block => self.dir.join(format!("{name}{BLOCK_SUFFIX}")),
        }
    }

    /// Makes fresh data for `volume`: empty, or a copy of `source` (the data of the volume it
    /// clones, with the same access). A leftover at the path (data no record in `state` names)
    /// is replaced; data another record of `state` uses is never touched: that is an error.
    /// Durable when this returns.
    pub fn create(
        &self,
        volume: &VolumeRecord,
        source: Option<&Path>,
        state: &State,
    ) -> io::Result<()> {
        fs::create_dir_all(&self.dir)?;
        let path = self.path(&volume.id, volume.access);
        if let Some(owner) = state
            .volumes
            .values()
            .find(|v| v.id != volume.id && self.path(&v.id, v.access) == path)
        {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} is the data of volume {}; not replacing it",
                    path.display(),
                    owner.id
                ),
            ));
        }
        make_in_place(&path, volume, source)
    }

    /// Removes the data of a volume; nothing there is fine.
    pub fn remove(&self, id: &str, access: AccessKind) -> io::Result<()> {
        remove_any(&self.path(id, access))
    }

    /// Start-up reconciliation with the records: removes every entry no record names (data of a
    /// volume whose CreateVolume or DeleteVolume was cut short, temporary names), and makes empty
    /// data for records without any. Returns (removed, created).
    pub fn sweep(&self, state: &State) -> io::Result<(Vec<PathBuf>, Vec<String>)> {
        fs::create_dir_all(&self.dir)?;
        let expected: BTreeSet<PathBuf> = state
            .volumes
            .values()
            .map(|v| self.path(&v.id, v.access))
            .collect();
        // Data kept under the names of earlier releases moves to its current name, when it is
        // of the record's kind (a directory for mount, a file for block).
        for volume in state.volumes.values() {
            let path = self.path(&volume.id, volume.access);
            let legacy = self.legacy_path(&volume.id, volume.access);
            if legacy == path || expected.contains(&legacy) || fs::symlink_metadata(&path).is_ok() {
                continue;
            }
            let kind_matches = match (fs::symlink_metadata(&legacy), volume.access) {
                (Ok(m), AccessKind::Mount) => m.is_dir(),
                (Ok(m), AccessKind::Block) => m.is_file(),
                (Err(_), _) => false,
            };
            if kind_matches {
                fs::rename(&legacy, &path)?;
                File::open(&self.dir)?.sync_all()?;
            }
        }
        let mut removed = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let path = entry?.path();
            if !expected.contains(&path) {
                remove_any(&path)?;
                removed.push(path);
            }
        }
        let mut created = Vec::new();
        for volume in state.volumes.values() {
            if fs::symlink_metadata(self.path(&volume.id, volume.access)).is_err() {
                self.create(volume, None, state)?;
                created.push(volume.id.clone());
            }
        }
        if fs::symlink_metadata(&self.snapshots).is_ok() {
            let kept: BTreeSet<PathBuf> = state
                .snapshots
                .keys()
                .flat_map(|id| {
                    [AccessKind::Mount, AccessKind::Block].map(|a| self.snapshot_path(id, a))
                })
                .collect();
            for entry in fs::read_dir(&self.snapshots)? {
                let path = entry?.path();
                if !kept.contains(&path) {
                    remove_any(&path)?;
                    removed.push(path);
                }
            }
        }
        Ok((removed, created))
    }
}

/// A directory every pod user may write to (the kubelet applies no fsGroup to these volumes).
fn make_dir(path: &Path, source: Option<&Path>) -> io::Result<()> {
    fs::create_dir(path)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o777))?;
    if let Some(source) = source {
        copy_tree(source, path)?;
    }
    File::open(path)?.sync_all()
}

/// Makes data of `volume`'s kind and size at `path` (empty, or a copy of `source`): under a
/// hidden temporary name next to it, then renamed over whatever is there, the directory
/// fsync-ed, so `path` holds either the old entry or the complete new one.
fn make_in_place(path: &Path, volume: &VolumeRecord, source: Option<&Path>) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.tmp",
        path.file_name().unwrap_or_default().to_string_lossy()
    ));
    remove_any(&tmp)?;
    let size = u64::try_from(volume.capacity_bytes).unwrap_or(0);
    let made = match volume.access {
        AccessKind::Mount => make_dir(&tmp, source),
        AccessKind::Block => make_block(&tmp, source, size),
    };
    if let Err(e) = made {
        let _ = remove_any(&tmp);
        return Err(e);
    }
    remove_any(path)?;
    fs::rename(&tmp, path)?;
    File::open(dir)?.sync_all()
}

fn data_path(dir: &Path, id: &str, access: AccessKind) -> PathBuf {
    match access {
        AccessKind::Mount => dir.join(file_name(id)),
        AccessKind::Block => dir.join(format!("{}{BLOCK_SUFFIX}", file_name(id))),
    }
}

/// A sparse file of `size` bytes (a sparse copy of `source` first, when cloning).
fn make_block(path: &Path, source: Option<&Path>, size: u64) -> io::Result<()> {
    let file = File::options()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    if let Some(source) = source {
        copy_sparse(&File::open(source)?, &file)?;
    }
    file.set_len(size)?;
    file.sync_all()
}

/// Copies the data extents of `from` into `to` at the same offsets, skipping its holes
/// (SEEK_DATA/SEEK_HOLE), so a mostly empty block volume of gigabytes copies in a moment and
/// takes no room. `to` gets the length of `from`.
fn copy_sparse(from: &File, to: &File) -> io::Result<()> {
    use rustix::fs::{SeekFrom, seek};
    use std::os::unix::fs::FileExt;
    let len = from.metadata()?.len();
    let mut offset = 0;
    let mut buf = vec![0u8; 1 << 20];
    while offset < len {
        let start = match seek(from, SeekFrom::Data(offset)) {
            Ok(start) => start,
            Err(rustix::io::Errno::NXIO) => break, // only a hole is left
            Err(e) => return Err(e.into()),
        };
        let end = seek(from, SeekFrom::Hole(start))?.min(len);
        let mut at = start;
        while at < end {
            let want = usize::try_from(end - at)
                .unwrap_or(usize::MAX)
                .min(buf.len());
            let n = from.read_at(&mut buf[..want], at)?;
            if n == 0 {
                break;
            }
            to.write_all_at(&buf[..n], at)?;
            at += n as u64;
        }
        offset = end;
    }
    to.set_len(len)
}

/// Copies directories, regular files and symlinks; other kinds (sockets, fifos) are skipped.
fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            fs::create_dir(&target)?;
            fs::set_permissions(&target, entry.metadata()?.permissions())?;
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_file() {
            fs::copy(entry.path(), &target)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(entry.path())?, &target)?;
        }
    }
    Ok(())
}

/// Removes a file or a whole directory tree; nothing there is fine.
fn remove_any(path: &Path) -> io::Result<()> {
    let removed = match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) => Err(e),
    };
    match removed {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::os::unix::fs::MetadataExt;

    use super::*;

    fn volume(id: &str, access: AccessKind, size: i64) -> VolumeRecord {
        VolumeRecord {
            id: id.into(),
            name: id.into(),
            capacity_bytes: size,
            access,
            parameters: BTreeMap::new(),
            mutable_parameters: BTreeMap::new(),
            source: None,
            topology: BTreeMap::new(),
            publications: BTreeMap::new(),
            stagings: BTreeMap::new(),
        }
    }

    #[test]
    fn ids_become_safe_file_names() {
        assert_eq!(file_name("vol-0a1b_c"), "vol-0a1b_c");
        assert_eq!(file_name("vol-0a1b_c.d"), "vol-0a1b_c%2Ed");
        assert_eq!(
            file_name("projects/p/disks/pvc-1"),
            "projects%2Fp%2Fdisks%2Fpvc-1"
        );
        assert_eq!(file_name(".."), "%2E%2E");
        assert_eq!(file_name("a%b"), "a%25b");
    }

    #[test]
    fn creates_clones_removes_and_sweeps() {
        let dir = tempfile::tempdir().unwrap();
        let data = VolumeData::new(dir.path());
        let mount = volume("vol-m", AccessKind::Mount, 1 << 20);
        let block = volume("vol-b", AccessKind::Block, 1 << 40);
        let none = State::default();
        data.create(&mount, None, &none).unwrap();
        data.create(&block, None, &none).unwrap();
        let block_path = data.path("vol-b", AccessKind::Block);
        assert_eq!(block_path, dir.path().join("volumes/vol-b.block"));
        let meta = fs::metadata(&block_path).unwrap();
        assert_eq!(meta.len(), 1 << 40);
        assert!(meta.blocks() < 1024, "the block file is sparse");
        let mount_path = data.path("vol-m", AccessKind::Mount);
        assert!(mount_path.is_dir());
        fs::create_dir(mount_path.join("sub")).unwrap();
        fs::write(mount_path.join("sub/f"), b"hello").unwrap();

        let clone = volume("vol-c", AccessKind::Mount, 1 << 20);
        data.create(&clone, Some(&mount_path), &none).unwrap();
        let clone_path = data.path("vol-c", AccessKind::Mount);
        assert_eq!(fs::read(clone_path.join("sub/f")).unwrap(), b"hello");

        // A record for vol-m and a new one without data; vol-b and vol-c have none.
        let mut state = State::default();
        state.volumes.insert("vol-m".into(), mount.clone());
        let old = volume("vol-old", AccessKind::Block, 4096);
        state.volumes.insert("vol-old".into(), old);
        fs::write(dir.path().join("volumes/.vol-x.tmp"), b"").unwrap();
        let (removed, created) = data.sweep(&state).unwrap();
        assert_eq!(removed.len(), 3, "{removed:?}");
        assert_eq!(created, ["vol-old"]);
        assert!(!block_path.exists() && !clone_path.exists());
        assert_eq!(fs::read(mount_path.join("sub/f")).unwrap(), b"hello");

        data.remove("vol-m", AccessKind::Mount).unwrap();
        data.remove("vol-m", AccessKind::Mount).unwrap();
        assert!(!mount_path.exists());
    }

    /// A mount volume `x.block` and a block volume `x` once shared `volumes/x.block`; now they
    /// have distinct paths, and creating one leaves the other's data alone.
    #[test]
    fn mount_and_block_names_never_collide() {
        let dir = tempfile::tempdir().unwrap();
        let data = VolumeData::new(dir.path());
        let mount = volume("x.block", AccessKind::Mount, 4096);
        let block = volume("x", AccessKind::Block, 4096);
        assert_ne!(
            data.path(&mount.id, mount.access),
            data.path(&block.id, block.access)
        );
        let mut state = State::default();
        data.create(&mount, None, &state).unwrap();
        fs::write(data.path(&mount.id, mount.access).join("f"), b"keep").unwrap();
        state.volumes.insert(mount.id.clone(), mount.clone());
        data.create(&block, None, &state).unwrap();
        assert_eq!(
            fs::read(data.path(&mount.id, mount.access).join("f")).unwrap(),
            b"keep"
        );
        assert!(data.path(&block.id, block.access).is_file());
    }

    #[test]
    fn a_snapshot_keeps_the_data_it_was_taken_with_and_restores_it() {
        let dir = tempfile::tempdir().unwrap();
        let data = VolumeData::new(dir.path());
        let mut state = State::default();
        let v = volume("vol-1", AccessKind::Mount, 4096);
        data.create(&v, None, &state).unwrap();
        state.volumes.insert(v.id.clone(), v.clone());
        fs::write(data.path(&v.id, v.access).join("f"), b"before").unwrap();
        data.create_snapshot("snap-1", &v).unwrap();
        fs::write(data.path(&v.id, v.access).join("f"), b"after").unwrap();

        let source = data.snapshot_source("snap-1", AccessKind::Mount).unwrap();
        assert_eq!(data.snapshot_source("snap-1", AccessKind::Block), None);
        let restored = volume("vol-2", AccessKind::Mount, 4096);
        data.create(&restored, Some(&source), &state).unwrap();
        state.volumes.insert(restored.id.clone(), restored.clone());
        assert_eq!(
            fs::read(data.path(&restored.id, restored.access).join("f")).unwrap(),
            b"before"
        );

        // A copy no record names goes at the next start; a recorded one stays.
        let (removed, _) = data.sweep(&state).unwrap();
        assert_eq!(removed, vec![source.clone()]);
        assert_eq!(data.snapshot_source("snap-1", AccessKind::Mount), None);
        data.create_snapshot("snap-1", &v).unwrap();
        data.remove_snapshot("snap-1").unwrap();
        assert_eq!(data.snapshot_source("snap-1", AccessKind::Mount), None);
    }

    #[test]
    fn block_copies_keep_their_holes() {
        let dir = tempfile::tempdir().unwrap();
        let data = VolumeData::new(dir.path());
        let state = State::default();
        let v = volume("vol-b", AccessKind::Block, 1 << 30);
        data.create(&v, None, &state).unwrap();
        let path = data.path(&v.id, v.access);
        let file = File::options().write(true).open(&path).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, b"head", 0).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, b"tail", (1 << 30) - 4).unwrap();
        drop(file);
        data.create_snapshot("snap-b", &v).unwrap();
        let copy = data.snapshot_source("snap-b", AccessKind::Block).unwrap();
        let meta = fs::metadata(&copy).unwrap();
        assert_eq!(meta.len(), 1 << 30);
        assert!(
            meta.blocks() * 512 < 1 << 20,
            "{} bytes allocated",
            meta.blocks() * 512
        );
        let bytes = fs::read(&copy).unwrap();
        assert_eq!(&bytes[..4], b"head");
        assert_eq!(&bytes[(1 << 30) - 4..], b"tail");
    }

    /// Data under an earlier release's name (`.` kept) moves to its escaped name at start-up.
    #[test]
    fn sweep_moves_data_from_legacy_names() {
        let dir = tempfile::tempdir().unwrap();
        let data = VolumeData::new(dir.path());
        fs::create_dir_all(dir.path().join("volumes/pvc.1")).unwrap();
        fs::write(dir.path().join("volumes/pvc.1/f"), b"old").unwrap();
        let mut state = State::default();
        let v = volume("pvc.1", AccessKind::Mount, 4096);
        state.volumes.insert(v.id.clone(), v.clone());
        let (removed, created) = data.sweep(&state).unwrap();
        assert!(
            removed.is_empty() && created.is_empty(),
            "{removed:?} {created:?}"
        );
        assert_eq!(
            fs::read(data.path(&v.id, v.access).join("f")).unwrap(),
            b"old"
        );
    }
}
