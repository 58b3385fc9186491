//! Durable storage of the driver [`State`] as one JSON file, `<state-dir>/state.json`, replaced
//! atomically (temp file, fsync, rename, fsync of the directory) so a crash at any instant leaves
//! either the old or the new state on disk, never a torn file.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::state::State;

pub const STATE_FILE: &str = "state.json";
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

/// Where the state lives.
#[derive(Clone, Debug)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// Creates the state directory if needed.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    /// The saved state, or an empty one when nothing was saved yet.
    pub fn load(&self) -> Result<State, StoreError> {
        load_state(&self.dir)
    }

    pub fn save(&self, state: &State) -> Result<(), StoreError> {
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
        store.save(&state).unwrap();
        assert_eq!(store.load().unwrap(), state);
        store.save(&State::default()).unwrap();
        assert_eq!(store.load().unwrap(), State::default());
        let names: Vec<_> = fs::read_dir(dir.path().join("nested/state"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![STATE_FILE], "no temp file left behind");
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
}
