//! Finds the etcd / kube-apiserver / kube-controller-manager binaries: either a directory named
//! by `CSI_TESTBED_BIN_DIR`, or whatever `hack/build-control-plane.sh` built (it prints its cache
//! directory on its last stdout line and returns at once when the binaries are cached).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{Component, Error};

/// Environment variable naming a directory that already holds the binaries.
pub const BIN_DIR_ENV: &str = "CSI_TESTBED_BIN_DIR";

/// What every control plane runs; kube-scheduler is checked only when it was asked for, so a
/// `CSI_TESTBED_BIN_DIR` without it still serves every other test.
const ALWAYS: [Component; 3] = [
    Component::Etcd,
    Component::ApiServer,
    Component::ControllerManager,
];

/// Lines of the build script's stderr kept for the error message (the rest was already printed).
const SCRIPT_STDERR_TAIL: usize = 15;

/// A directory known to contain every binary the control plane needs.
#[derive(Clone, Debug)]
pub struct Binaries {
    dir: PathBuf,
}

impl Binaries {
    /// A directory the caller checked (the node's binaries, a test's fakes).
    pub fn at(dir: &Path) -> Self {
        Binaries {
            dir: dir.to_owned(),
        }
    }

    pub fn path(&self, component: Component) -> PathBuf {
        self.dir.join(component.binary())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Blocking: may run the build script, which takes minutes on a cold Go cache. `scheduler`
/// also requires kube-scheduler.
pub fn locate(scheduler: bool) -> Result<Binaries, Error> {
    let dir = match std::env::var_os(BIN_DIR_ENV) {
        Some(dir) => PathBuf::from(dir),
        None => run_build_script(&build_script())?,
    };
    let missing = missing_binaries(&dir, scheduler);
    if missing.is_empty() {
        Ok(Binaries { dir })
    } else {
        Err(Error::LocateBinaries(format!(
            "{} has no executable {}",
            dir.display(),
            missing.join(", ")
        )))
    }
}

fn build_script() -> PathBuf {
    crate::workspace::root()
        .join("hack")
        .join("build-control-plane.sh")
}

fn missing_binaries(dir: &Path, scheduler: bool) -> Vec<&'static str> {
    ALWAYS
        .iter()
        .chain(scheduler.then_some(&Component::Scheduler))
        .map(|c| c.binary())
        .filter(|name| !is_executable(&dir.join(name)))
        .collect()
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The script's stderr is forwarded line by line (a cold build is long and silent otherwise)
/// and its tail is kept for the error message.
fn run_build_script(script: &Path) -> Result<PathBuf, Error> {
    let fail = |what: String| Error::LocateBinaries(format!("{}: {what}", script.display()));
    if !script.is_file() {
        return Err(fail("build script not found".to_owned()));
    }
    eprintln!(
        "[testbed] locating binaries with {} (a cold build takes several minutes) ...",
        script.display()
    );
    let mut child = Command::new("bash")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| fail(format!("cannot run bash: {e}")))?;

    let stderr = child.stderr.take();
    let forwarder = std::thread::spawn(move || {
        let mut tail = VecDeque::with_capacity(SCRIPT_STDERR_TAIL);
        for line in stderr
            .map(BufReader::new)
            .into_iter()
            .flat_map(|r| r.lines())
        {
            let Ok(line) = line else { break };
            eprintln!("{line}");
            if tail.len() == SCRIPT_STDERR_TAIL {
                tail.pop_front();
            }
            tail.push_back(line);
        }
        Vec::from(tail).join("\n")
    });

    let mut stdout = String::new();
    let read = child
        .stdout
        .take()
        .map(|mut out| out.read_to_string(&mut stdout));
    let status = child
        .wait()
        .map_err(|e| fail(format!("waiting for it: {e}")))?;
    let stderr_tail = forwarder.join().unwrap_or_default();
    if let Some(Err(e)) = read {
        return Err(fail(format!("reading its output: {e}")));
    }
    if !status.success() {
        return Err(fail(format!("failed ({status}):\n{stderr_tail}")));
    }
    last_line(&stdout)
        .map(PathBuf::from)
        .ok_or_else(|| fail("printed no directory on its last stdout line".to_owned()))
}

/// The script's contract: the binaries' directory is the last non-empty stdout line.
fn last_line(stdout: &str) -> Option<&str> {
    stdout.lines().map(str::trim).rfind(|l| !l.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_line_skips_trailing_blank_lines() {
        assert_eq!(last_line("noise\n/a/b\n\n"), Some("/a/b"));
        assert_eq!(last_line("/only"), Some("/only"));
        assert_eq!(last_line("\n  \n"), None);
    }

    #[test]
    fn empty_directory_misses_every_binary() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(
            missing_binaries(dir.path(), false),
            vec!["etcd", "kube-apiserver", "kube-controller-manager"]
        );
        assert_eq!(
            missing_binaries(dir.path(), true),
            vec![
                "etcd",
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler"
            ]
        );
    }
}
