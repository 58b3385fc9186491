//! Durable storage of the driver [`State`] as one JSON file, `<state-dir>/state.json`, replaced
//! atomically (temp file, fsync, rename, fsync of the directory) so a crash at any instant leaves
//! either the old or the new state on disk, never a torn file.
//!
//! Several driver processes may share one state directory (two controller replicas and a node
//! plugin on one host). Every read or change therefore happens under [`Store::lock`]: an
//! exclusive `flock(2)` on `<state-dir>/state.json.lock`, held for the whole read-modify-write,
//! and `state.json` is re-read every time the lock is taken. The file is small; comparing its
//! metadata instead (inode, size, mtime) could miss a change, since a renamed-in file may reuse
//! an inode and mtimes can be coarse.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::state::State;

pub const STATE_FILE: &str = "state.json";
/// The lock file every process sharing the state directory flocks around each access.
pub const LOCK_FILE: &str = "state.json.lock";
const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("cannot create state directory {path}: {source}")]
    CreateDir { path: PathBuf, source: io::Error },
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{path} is not a valid state file: {source}")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path} has format version {found}; this driver understands version {FORMAT_VERSION}")]
    Version { path: PathBuf, found: u32 },
    #[error("cannot encode the state: {0}")]
    Encode(serde_json::Error),
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
    #[error("cannot lock {path}: {source}")]
    Lock { path: PathBuf, source: io::Error },
    #[error("cannot reconcile the volume data in {path} with the records: {source}")]
    Sweep { path: PathBuf, source: io::Error },
}

#[derive(Serialize)]
struct FileOut<'a> {
    version: u32,
    #[serde(flatten)]
    state: &'a State,
}

#[derive(Deserialize)]
struct FileIn {
    version: u32,
    #[serde(flatten)]
    state: State,
}

/// This process's copy of the state, as last read or written under the lock.
#[derive(Debug, Default)]
struct Cache {
    state: State,
}

/// Where the state lives, with this process's cached copy of it.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    cache: Mutex<Cache>,
}

/// The state while this process holds the lock: read it, replace it with [`Locked::save`].
/// Dropping it releases the lock (closing the lock file releases the flock).
pub struct Locked<'a> {
    store: &'a Store,
    cache: MutexGuard<'a, Cache>,
    _lock: File,
}

impl Store {
    /// Creates the state directory if needed and reads the state once, so a bad file stops the
    /// driver at start.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
        let store = Self {
            dir: dir.to_path_buf(),
            cache: Mutex::new(Cache::default()),
        };
        drop(store.lock()?);
        Ok(store)
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    /// Takes this process's lock, then the exclusive flock shared with the other processes, and
    /// re-reads `state.json` (another process may have replaced it since this one last saw it).
    pub fn lock(&self) -> Result<Locked<'_>, StoreError> {
        // Every update replaces the whole cached state in one assignment after a successful
        // save, so the value behind a poisoned lock is still consistent.
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        let lock_path = self.dir.join(LOCK_FILE);
        let lock_err = |source| StoreError::Lock {
            path: lock_path.clone(),
            source,
        };
        let lock = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(lock_err)?;
        loop {
            match rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive) {
                Ok(()) => break,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(lock_err(e.into())),
            }
        }
        // Re-read on every lock: the file is small, and comparing metadata (inode, size, mtime)
        // can miss a change (inode reuse after the rename, coarse timestamps).
        cache.state = load_state(&self.dir)?;
        Ok(Locked {
            store: self,
            cache,
            _lock: lock,
        })
    }

    fn write(&self, state: &State) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec_pretty(&FileOut {
            version: FORMAT_VERSION,
            state,
        })
        .map_err(StoreError::Encode)?;
        let path = self.path();
        let tmp = self.dir.join(format!(".{STATE_FILE}.tmp"));
        let write = || -> io::Result<()> {
            let mut file = File::create(&tmp)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
            fs::rename(&tmp, &path)?;
            // The rename itself is only durable once the directory entry is flushed.
            File::open(&self.dir)?.sync_all()
        };
        write().map_err(|source| StoreError::Write { path, source })
    }
}

impl Locked<'_> {
    pub fn state(&self) -> &State {
        &self.cache.state
    }

    /// Writes `next` durably, then makes it this process's current state. On failure the
    /// cached state is kept (the next lock re-reads the file anyway).
    pub fn save(&mut self, next: State) -> Result<(), StoreError> {
        self.store.write(&next)?;
        self.cache.state = next;
        Ok(())
    }
}

/// Reads `<dir>/state.json` without opening a store; tests use it to count what survived.
pub fn load_state(dir: &Path) -> Result<State, StoreError> {
    let path = dir.join(STATE_FILE);
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(State::default()),
        Err(source) => return Err(StoreError::Read { path, source }),
    };
    let file: FileIn = serde_json::from_slice(&bytes).map_err(|source| StoreError::Parse {
        path: path.clone(),
        source,
    })?;
    if file.version != FORMAT_VERSION {
        return Err(StoreError::Version {
            path,
            found: file.version,
        });
    }
    Ok(file.state)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::state::{AccessKind, ContentSource, Publication, SnapshotRecord, VolumeRecord};

    fn sample() -> State {
        let mut state = State::default();
        state.volumes.insert(
            "vol-1".into(),
            VolumeRecord {
                id: "vol-1".into(),
                name: "pvc-1".into(),
                capacity_bytes: 42,
                access: AccessKind::Block,
                parameters: [("type".to_string(), "fast".to_string())].into(),
                mutable_parameters: [("iops".to_string(), "3000".to_string())].into(),
                source: Some(ContentSource::Snapshot("snap-1".into())),
                topology: [("zone".to_string(), "a".to_string())].into(),
                publications: [(
                    "/mnt/t".to_string(),
                    Publication {
                        access: AccessKind::Block,
                        readonly: true,
                    },
                )]
                .into(),
                stagings: [(
                    "/mnt/s".to_string(),
                    crate::state::Staging {
                        access: AccessKind::Block,
                    },
                )]
                .into(),
            },
        );
        state.snapshots.insert(
            "snap-1".into(),
            SnapshotRecord {
                id: "snap-1".into(),
                name: "s".into(),
                source_volume_id: "vol-0".into(),
                size_bytes: 42,
                created_secs: 1,
                created_nanos: 2,
                topology: [("zone".to_string(), "a".to_string())].into(),
            },
        );
        state
    }

    #[test]
    fn round_trips_and_replaces_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("nested/state")).unwrap();
        assert_eq!(
            store.lock().unwrap().state().clone(),
            State::default(),
            "no file yet means empty"
        );
        let state = sample();
        store.lock().unwrap().save(state.clone()).unwrap();
        assert_eq!(store.lock().unwrap().state().clone(), state);
        assert_eq!(load_state(&dir.path().join("nested/state")).unwrap(), state);
        store.lock().unwrap().save(State::default()).unwrap();
        assert_eq!(store.lock().unwrap().state().clone(), State::default());
        let mut names: Vec<_> = fs::read_dir(dir.path().join("nested/state"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(
            names,
            vec![STATE_FILE, LOCK_FILE],
            "no temp file left behind"
        );
    }

    /// A file as written before snapshots recorded their segment: it loads, the segment empty.
    #[test]
    fn loads_state_files_of_earlier_releases() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join(STATE_FILE),
            br#"{
              "version": 1,
              "volumes": {
                "vol-1": {"id": "vol-1", "name": "pvc-1", "capacity_bytes": 42, "access": "mount"},
                "vol-2": {"id": "vol-2", "name": "pvc-2", "capacity_bytes": 42, "access": "block",
                          "parameters": {}, "source": {"snapshot": "snap-1"}, "topology": {},
                          "publications": {}}
              },
              "snapshots": {
                "snap-1": {"id": "snap-1", "name": "s", "source_volume_id": "vol-1",
                           "size_bytes": 42, "created_secs": 1, "created_nanos": 0}
              }
            }"#,
        )
        .unwrap();
        let state = load_state(dir.path()).unwrap();
        assert_eq!(state.volumes["vol-1"].source, None);
        assert_eq!(
            state.volumes["vol-2"].source,
            Some(ContentSource::Snapshot("snap-1".into()))
        );
        assert!(state.snapshots["snap-1"].topology.is_empty());
        assert_eq!(state.snapshots["snap-1"].size_bytes, 42);
    }

    #[test]
    fn rejects_garbage_and_unknown_versions() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(STATE_FILE), b"{not json").unwrap();
        assert!(matches!(
            load_state(dir.path()),
            Err(StoreError::Parse { .. })
        ));
        fs::write(
            dir.path().join(STATE_FILE),
            br#"{"version": 9, "volumes": {}}"#,
        )
        .unwrap();
        assert!(matches!(
            load_state(dir.path()),
            Err(StoreError::Version { found: 9, .. })
        ));
        fs::write(dir.path().join(STATE_FILE), br#"{"version": 1}"#).unwrap();
        assert_eq!(load_state(dir.path()).unwrap().volumes, BTreeMap::new());
    }

    /// Two stores on one directory (two processes) see each other's writes, and a write made
    /// from a stale copy is impossible: the copy is refreshed under the lock first.
    #[test]
    fn two_stores_on_one_dir_see_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let a = Store::open(dir.path()).unwrap();
        let b = Store::open(dir.path()).unwrap();
        let state = sample();
        a.lock().unwrap().save(state.clone()).unwrap();
        assert_eq!(
            b.lock().unwrap().state().clone(),
            state,
            "b re-reads what a wrote"
        );
        {
            let mut locked = b.lock().unwrap();
            let mut next = locked.state().clone();
            next.volumes.remove("vol-1");
            locked.save(next).unwrap();
        }
        let seen = a.lock().unwrap().state().clone();
        assert!(seen.volumes.is_empty(), "a re-reads what b wrote");
        assert_eq!(seen.snapshots, state.snapshots);
    }

    /// A change that keeps the file's inode, size and modification time (an in-place rewrite,
    /// or a renamed-in file that reuses the inode on a filesystem with coarse timestamps) is
    /// still seen: the file is re-read at every lock.
    #[test]
    fn sees_a_change_that_keeps_inode_size_and_mtime() {
        let dir = tempfile::tempdir().unwrap();
        let a = Store::open(dir.path()).unwrap();
        let mut state = sample();
        a.lock().unwrap().save(state.clone()).unwrap();
        let path = a.path();
        let before = fs::metadata(&path).unwrap();
        // Same length: change one digit of the capacity.
        let bytes = fs::read_to_string(&path).unwrap();
        let changed = bytes.replacen("\"capacity_bytes\": 42", "\"capacity_bytes\": 43", 1);
        assert_ne!(bytes, changed);
        assert_eq!(bytes.len(), changed.len());
        let mut file = File::options().write(true).open(&path).unwrap();
        file.write_all(changed.as_bytes()).unwrap();
        file.set_modified(before.modified().unwrap()).unwrap();
        drop(file);
        let after = fs::metadata(&path).unwrap();
        assert_eq!(
            (after.len(), after.modified().unwrap()),
            (before.len(), before.modified().unwrap())
        );
        if let Some(v) = state.volumes.get_mut("vol-1") {
            v.capacity_bytes = 43;
        }
        assert_eq!(a.lock().unwrap().state(), &state);
    }
}
