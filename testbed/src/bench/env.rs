//! What the benchmark runs and on what: the three programs (ours, upstream's, the reference
//! driver), built or found before the first run, and a description of the machine for the
//! report.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::BenchError;

pub const UPSTREAM_VERSION: &str = "v6.3.0";

pub struct Programs {
    pub ours: PathBuf,
    pub upstream: PathBuf,
    pub driver: PathBuf,
    /// From the control-plane build: applies our CRDs (deploy/base/crd.yaml) to every cluster.
    pub kubectl: PathBuf,
}

/// Builds ours and the driver in release mode (unless `no_build`), and upstream's from the Go
/// module proxy through `hack/build-upstream-provisioner.sh` (cached after the first time).
pub fn prepare(no_build: bool) -> Result<Programs, BenchError> {
    let root = csi_testbed::workspace::root();
    let release = root.join("target").join("release");
    let (ours, driver) = if no_build {
        let ours = release.join("csi-provisioner");
        let driver = release.join("csi-reference-driver");
        for program in [&ours, &driver] {
            if !program.is_file() {
                return Err(BenchError::Step {
                    step: "finding our binaries".into(),
                    detail: format!(
                        "{} is missing; run `cargo build --release` (or drop --no-build)",
                        program.display()
                    ),
                });
            }
        }
        (ours, driver)
    } else {
        eprintln!("[bench] building csi-provisioner and csi-reference-driver (release) ...");
        let [ours, driver] =
            csi_testbed::workspace::build(["csi-provisioner", "csi-reference-driver"], true)?;
        (ours, driver)
    };
    let upstream = csi_testbed::workspace::upstream_provisioner()?;
    let control_plane = match std::env::var_os(csi_testbed::BIN_DIR_ENV) {
        Some(dir) => PathBuf::from(dir),
        None => csi_testbed::workspace::run_build_script("build-control-plane.sh")?,
    };
    Ok(Programs {
        ours,
        upstream,
        driver,
        kubectl: control_plane.join("kubectl"),
    })
}

/// Facts about the machine and the programs, as `(what, value)` lines for the report.
pub fn describe(programs: &Programs) -> Vec<(String, String)> {
    let mut facts = Vec::new();
    let mut add = |what: &str, value: String| facts.push((what.to_owned(), value));
    add(
        "CPU",
        format!(
            "{} × {}",
            std::thread::available_parallelism().map_or(0, usize::from),
            cpu_model().unwrap_or_else(|| "unknown".into())
        ),
    );
    add("memory", mem_total().unwrap_or_else(|| "unknown".into()));
    add(
        "kernel",
        first_line("uname", &["-r"]).unwrap_or_else(|| "unknown".into()),
    );
    add(
        "ours",
        format!(
            "csi-provisioner-rs {} (git {})",
            first_line(&programs.ours.to_string_lossy(), &["--version"])
                .and_then(|l| l.split_whitespace().last().map(str::to_owned))
                .unwrap_or_else(|| "?".into()),
            git_revision().unwrap_or_else(|| "unknown".into())
        ),
    );
    add(
        "upstream",
        format!(
            "external-provisioner {UPSTREAM_VERSION} built by hack/build-upstream-provisioner.sh with {}",
            first_line("go", &["env", "GOVERSION"]).unwrap_or_else(|| "go ?".into())
        ),
    );
    add(
        "rustc",
        first_line("rustc", &["--version"]).unwrap_or_else(|| "unknown".into()),
    );
    add(
        "control plane",
        "Kubernetes 1.36.3, etcd 3.6.16 (docs/control-plane.md)".into(),
    );
    facts
}

fn first_line(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    let text = if out.stdout.is_empty() {
        out.stderr
    } else {
        out.stdout
    };
    String::from_utf8_lossy(&text)
        .lines()
        .next()
        .map(|l| l.trim().to_owned())
}

fn git_revision() -> Option<String> {
    let root = csi_testbed::workspace::root();
    let rev = Command::new("git")
        .current_dir(&root)
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()?;
    let dirty = Command::new("git")
        .current_dir(&root)
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()?;
    let rev = String::from_utf8_lossy(&rev.stdout).trim().to_owned();
    Some(if dirty.stdout.is_empty() {
        rev
    } else {
        format!("{rev} + uncommitted changes")
    })
}

fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
}

fn mem_total() -> Option<String> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(format!("{:.1} GiB", kib / 1024.0 / 1024.0))
}

/// The 1-minute load average, to show how busy the machine was around a run.
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// A directory for the driver's state: tmpfs when there is one, so that the driver's fsync per
/// change costs both sidecars nothing and the disk never is what is measured.
pub fn scratch_parent() -> PathBuf {
    let shm = Path::new("/dev/shm");
    let writable = tempfile::tempdir_in(shm).is_ok();
    if writable {
        shm.to_owned()
    } else {
        std::env::temp_dir()
    }
}
