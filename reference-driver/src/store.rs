//! Durable storage of the driver [`State`] as one JSON file, `<state-dir>/state.json`, replaced
//! atomically (temp file, fsync, rename, fsync of the directory) so a crash at any instant leaves
//! either the old or the new state on disk, never a torn file.
//!
//! Several driver processes may share one state directory (two controller replicas and a node
//! plugin on one host). Every read or change therefore happens under [`Store::lock`]: an
//! exclusive `flock(2)` on `<state-dir>/state.json.lock`, held for the whole read-modify-write,
//! and `state.json` is re-read whenever its identity (device, inode, size, mtime) differs from
//! what this process last read or wrote. Writes rename a new file into place, so every write
//! gives the file a new inode and a change is never missed within one mtime tick.

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
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

/// What identifies one version of `state.json` on disk; `None` when there is no file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: i64,
    mtime_nsec: i64,
}

fn stamp_of(path: &Path) -> io::Result<Option<Stamp>> {
    match fs::metadata(path) {
        Ok(m) => Ok(Some(Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec(),
        })),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// This process's copy of the state and the version of the file it came from.
#[derive(Debug, Default)]
struct Cache {
    state: State,
    /// `None` before the first read, and after a failed one.
    stamp: Option<Option<Stamp>>,
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
    /// re-reads `state.json` if another process replaced it since this one last saw it.
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
        let path = self.path();
        let stamp = stamp_of(&path).map_err(|source| StoreError::Read {
            path: path.clone(),
            source,
        })?;
        if cache.stamp != Some(stamp) {
            cache.stamp = None;
            cache.state = load_state(&self.dir)?;
            // The file cannot change while we hold the flock, so the stamp taken before the
            // read is the one of what was read.
            cache.stamp = Some(stamp);
        }
        Ok(Locked {
            store: self,
            cache,
            _lock: lock,
        })
    }

    /// A copy of the current state (under the lock for the moment of the copy).
    #[cfg(test)]
    pub fn load(&self) -> Result<State, StoreError> {
        Ok(self.lock()?.state().clone())
    }

    fn write(&self, state: &State) -> Result<Option<Stamp>, StoreError> {
        let bytes = serde_json::to_vec_pretty(&FileOut {
            version: FORMAT_VERSION,
            state,
        })
        .map_err(StoreError::Encode)?;
        let path = self.path();
        let tmp = self.dir.join(format!(".{STATE_FILE}.tmp"));
        let write = || -> io::Result<Option<Stamp>> {
            let mut file = File::create(&tmp)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
            fs::rename(&tmp, &path)?;
            // The rename itself is only durable once the directory entry is flushed.
            File::open(&self.dir)?.sync_all()?;
            stamp_of(&path)
        };
        write().map_err(|source| StoreError::Write { path, source })
    }
}

impl Locked<'_> {
    pub fn state(&self) -> &State {
        &self.cache.state
    }

    /// Writes `next` durably, then makes it this process's current state. On failure the
    /// cached state is kept, but re-read at the next lock (the file may or may not have moved).
    pub fn save(&mut self, next: State) -> Result<(), StoreError> {
        match self.store.write(&next) {
            Ok(stamp) => {
                self.cache.state = next;
                self.cache.stamp = Some(stamp);
                Ok(())
            }
            Err(e) => {
                self.cache.stamp = None;
                Err(e)
            }
        }
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
            store.load().unwrap(),
            State::default(),
            "no file yet means empty"
        );
        let state = sample();
        store.lock().unwrap().save(state.clone()).unwrap();
        assert_eq!(store.load().unwrap(), state);
        assert_eq!(load_state(&dir.path().join("nested/state")).unwrap(), state);
        store.lock().unwrap().save(State::default()).unwrap();
        assert_eq!(store.load().unwrap(), State::default());
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
        assert_eq!(b.load().unwrap(), state, "b re-reads what a wrote");
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
}
