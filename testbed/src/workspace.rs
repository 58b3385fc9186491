//! The cargo workspace this crate belongs to: where its root is, and cargo run there. Everything
//! that builds or finds a binary of the workspace (the benchmark, the integration tests, the
//! control-plane build script) goes through here.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Variables cargo sets for the program it runs (`cargo run`, and the test binaries of
/// `cargo test`). Build scripts (ring's, for one) declare `rerun-if-env-changed` on some of them,
/// so a nested `cargo build` that inherited them would rebuild those crates and everything above
/// them, and the next plain build would do it again.
const CARGO_RUN_VARS: [&str; 7] = [
    "CARGO_MANIFEST_DIR",
    "CARGO_MANIFEST_PATH",
    "CARGO_CRATE_NAME",
    "CARGO_BIN_NAME",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "OUT_DIR",
];

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("running cargo build: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("cargo build of {binaries:?} failed ({status}); its messages are above")]
    Failed {
        binaries: Vec<String>,
        status: String,
    },
    #[error("cargo build reported no executable named {0}")]
    NoExecutable(String),
}

#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    #[error("running {script}: {source}")]
    Spawn {
        script: String,
        source: std::io::Error,
    },
    #[error("{script} failed ({status}); its messages are above")]
    Failed { script: String, status: String },
}

/// The workspace root, found at run time: the nearest directory holding a `[workspace]`
/// manifest above the package cargo runs us for (`CARGO_MANIFEST_DIR`, which `cargo test` and
/// `cargo run` set), else above this crate's directory at compile time. Run time first because
/// cargo does not rebuild when only the work tree's path changed: a clean clone that reuses a
/// shared target directory would otherwise build and read the files of the clone that compiled
/// first.
pub fn root() -> PathBuf {
    let start = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    let found = start.ancestors().find(|dir| is_workspace_root(dir));
    found.unwrap_or(&start).to_owned()
}

fn is_workspace_root(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("Cargo.toml"))
        .is_ok_and(|manifest| manifest.lines().any(|line| line.trim() == "[workspace]"))
}

/// `cargo` (the one running us, if any, else the one on PATH) in the workspace root, without the
/// variables cargo set for us.
pub fn cargo() -> Command {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    without_cargo_run_vars(&mut command);
    command.current_dir(root());
    command
}

/// Leaves out of `command`'s environment the variables cargo set for the program running us,
/// so that a build it runs (directly or in a script) sees what a build from a shell sees.
fn without_cargo_run_vars(command: &mut Command) {
    for (key, _) in std::env::vars_os() {
        let key_str = key.to_string_lossy();
        if key_str.starts_with("CARGO_PKG_") || CARGO_RUN_VARS.contains(&key_str.as_ref()) {
            command.env_remove(&key);
        }
    }
}

/// Builds `binaries` of the workspace (any of its packages) and returns their paths in the same
/// order. Compiler messages go to stderr as usual; cargo's JSON artifact messages on stdout name
/// the executables, wherever the target directory is.
pub fn build<const N: usize>(
    binaries: [&str; N],
    release: bool,
) -> Result<[PathBuf; N], BuildError> {
    let mut command = cargo();
    command.args(["build", "--message-format=json-render-diagnostics"]);
    if release {
        command.arg("--release");
    }
    for binary in binaries {
        command.args(["--bin", binary]);
    }
    let output = command
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(BuildError::Spawn)?;
    if !output.status.success() {
        return Err(BuildError::Failed {
            binaries: binaries.iter().map(|b| (*b).to_owned()).collect(),
            status: output.status.to_string(),
        });
    }
    let built: Vec<(String, PathBuf)> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(executable)
        .collect();
    let mut paths = binaries.map(|_| PathBuf::new());
    for (path, binary) in paths.iter_mut().zip(binaries) {
        *path = built
            .iter()
            .find(|(name, _)| name == binary)
            .map(|(_, built)| built.clone())
            .ok_or_else(|| BuildError::NoExecutable(binary.to_owned()))?;
    }
    Ok(paths)
}

/// Upstream's `csi-provisioner` (the Go program we replace), built from the Go module proxy by
/// `hack/build-upstream-provisioner.sh` and cached outside the work tree (minutes the first
/// time, at once afterwards). For the benchmarks and the downgrade and upgrade tests.
pub fn upstream_provisioner() -> Result<PathBuf, ScriptError> {
    run_build_script("build-upstream-provisioner.sh").map(|dir| dir.join("csi-provisioner"))
}

/// The source tree of the upstream release [`upstream_provisioner`] builds (from the Go module
/// cache, downloaded by `hack/upstream-source.sh` if missing): the upgrade test reads upstream's
/// own RBAC example from it.
pub fn upstream_source() -> Result<PathBuf, ScriptError> {
    run_build_script("upstream-source.sh")
}

/// The Kubernetes end-to-end mock CSI driver (`csi-mock-driver`), a second driver for the
/// integration tests, built by `hack/build-mock-driver.sh` from the Go module proxy and cached
/// outside the work tree (about a minute on a cold Go build cache, seconds once the control plane
/// is built, at once afterwards).
pub fn mock_driver() -> Result<PathBuf, ScriptError> {
    run_build_script("build-mock-driver.sh")
}

/// The Kubernetes volume snapshot machinery for the integration tests: the directory holding
/// `snapshot-controller` and `csi-snapshotter` (external-snapshotter) and `crds/` (their CRDs and
/// Gateway API's ReferenceGrant), built by `hack/build-snapshotter.sh` from the Go module proxy
/// and cached outside the work tree (minutes on a cold Go build cache, at once afterwards).
/// [`crate::snapshots`] installs and starts them.
pub fn snapshotter() -> Result<PathBuf, ScriptError> {
    run_build_script("build-snapshotter.sh")
}

/// The images a real node's pods use ([`crate::node`]), as `docker-archive` tarballs: the
/// sidecar's and the reference driver's images built from the Dockerfile, and the pause and
/// busybox images, all built here by `hack/build-images.sh` (no registry is reachable) and
/// cached outside the work tree. Its output directory lists them in `images.txt`
/// (`FILE NAME` a line).
pub fn images() -> Result<Vec<PathBuf>, ScriptError> {
    images_in(&run_build_script("build-images.sh")?)
}

/// The tarballs a directory's `images.txt` lists (see [`images`]).
pub fn images_in(dir: &Path) -> Result<Vec<PathBuf>, ScriptError> {
    let listing = dir.join("images.txt");
    let text = std::fs::read_to_string(&listing).map_err(|source| ScriptError::Spawn {
        script: listing.display().to_string(),
        source,
    })?;
    Ok(text
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(|file| dir.join(file))
        .collect())
}

/// Runs a build script of hack/, forwarding its progress (stderr); its last stdout line is what
/// it built: the directory holding the binaries, or the one binary (it returns at once when they
/// are cached).
pub fn run_build_script(name: &str) -> Result<PathBuf, ScriptError> {
    let script = root().join("hack").join(name);
    // The scripts build with cargo (hack/build-images.sh a release build): from a test, the
    // variables cargo set for it would make that build compile again what the same script run
    // from a shell compiled (ring and everything above it, minutes in release).
    let mut command = Command::new("bash");
    without_cargo_run_vars(&mut command);
    let output = command
        .arg(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|source| ScriptError::Spawn {
            script: script.display().to_string(),
            source,
        })?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    match stdout.lines().last() {
        Some(dir) if output.status.success() => Ok(PathBuf::from(dir.trim())),
        _ => Err(ScriptError::Failed {
            script: script.display().to_string(),
            status: output.status.to_string(),
        }),
    }
}

/// The target name and executable of a `compiler-artifact` message that has one.
fn executable(line: &str) -> Option<(String, PathBuf)> {
    let message: serde_json::Value = serde_json::from_str(line).ok()?;
    if message.get("reason")?.as_str()? != "compiler-artifact" {
        return None;
    }
    let path = message.get("executable")?.as_str()?;
    let name = message.get("target")?.get("name")?.as_str()?;
    Some((name.to_owned(), PathBuf::from(path)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_artifacts_with_an_executable_count() {
        let bin = r#"{"reason":"compiler-artifact","target":{"name":"csi-reference-driver"},"executable":"/t/debug/csi-reference-driver"}"#;
        let lib =
            r#"{"reason":"compiler-artifact","target":{"name":"csi_spec"},"executable":null}"#;
        let done = r#"{"reason":"build-finished","success":true}"#;
        assert_eq!(
            executable(bin),
            Some((
                "csi-reference-driver".to_owned(),
                PathBuf::from("/t/debug/csi-reference-driver")
            ))
        );
        assert_eq!(executable(lib), None);
        assert_eq!(executable(done), None);
        assert_eq!(executable("not json"), None);
    }

    #[test]
    fn the_root_holds_the_workspace_manifest() {
        assert!(root().join("Cargo.toml").is_file());
        assert!(root().join("testbed").join("Cargo.toml").is_file());
    }
}
