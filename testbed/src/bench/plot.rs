//! PNG plots from the CSV files, drawn by matplotlib (no display needed) in a virtualenv that
//! the benchmark creates once in the cache directory, next to the Go builds. The script is
//! `plot.py` beside this file, compiled in.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::BenchError;

const SCRIPT: &str = include_str!("plot.py");
/// Pinned so that a regenerated report draws the same way.
const MATPLOTLIB: &str = "matplotlib==3.11.2";

fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("CSI_PROVISIONER_CACHE") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("csi-provisioner-rs")
}

fn step(step: &str, detail: String) -> BenchError {
    BenchError::Step {
        step: step.into(),
        detail,
    }
}

/// The venv's python with matplotlib importable; creates the venv on first use.
fn python() -> Result<PathBuf, BenchError> {
    let venv = cache_root().join(format!("bench-venv-{}", MATPLOTLIB.replace("==", "-")));
    let python = venv.join("bin").join("python");
    let has_matplotlib = |python: &Path| {
        Command::new(python)
            .args(["-c", "import matplotlib"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if has_matplotlib(&python) {
        return Ok(python);
    }
    eprintln!(
        "[bench] installing {MATPLOTLIB} into {} (once) ...",
        venv.display()
    );
    let run = |what: &str, cmd: &mut Command| -> Result<(), BenchError> {
        let out = cmd
            .output()
            .map_err(|e| step(what, format!("cannot run it: {e}")))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(step(
                what,
                format!(
                    "{}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                        .lines()
                        .last()
                        .unwrap_or("")
                ),
            ))
        }
    };
    run(
        "creating the plotting venv (python3 -m venv)",
        Command::new("python3").args(["-m", "venv"]).arg(&venv),
    )?;
    run(
        "installing matplotlib (pip)",
        Command::new(venv.join("bin").join("pip")).args(["install", "--quiet", MATPLOTLIB]),
    )?;
    if has_matplotlib(&python) {
        Ok(python)
    } else {
        Err(step(
            "importing matplotlib",
            format!("{} still cannot import it", python.display()),
        ))
    }
}

/// Draws every plot the data allows into `dir` (which holds the CSVs); returns
/// `(file, caption)` per PNG.
pub fn draw(dir: &Path) -> Result<Vec<(&'static str, &'static str)>, BenchError> {
    let python = python()?;
    let script = dir.join(".bench_plot.py");
    super::report::write(&script, SCRIPT)?;
    let out = Command::new(&python)
        .arg(&script)
        .arg(dir)
        .arg(dir)
        .output()
        .map_err(|e| step("drawing the plots", e.to_string()));
    let _ = std::fs::remove_file(&script);
    let out = out?;
    if !out.status.success() {
        return Err(step(
            "drawing the plots",
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    // Captions come back from the script; map them onto the static list it can print.
    let printed = String::from_utf8_lossy(&out.stdout);
    Ok(PLOTS
        .iter()
        .filter(|(file, _)| printed.lines().any(|l| l.split('\t').next() == Some(file)))
        .copied()
        .collect())
}

/// Every plot the script can draw, in report order, with its caption for the report.
const PLOTS: [(&str, &str); 10] = [
    (
        "a-time-to-bound.png",
        "(a) claims Bound over time, default QPS",
    ),
    (
        "b-time-to-bound.png",
        "(b) claims Bound over time, QPS 500 / burst 1000",
    ),
    (
        "c-deletion.png",
        "(c) PVs left after deleting every claim, default QPS",
    ),
    (
        "c-deletion-fast.png",
        "(c) PVs left after deleting every claim, QPS 500",
    ),
    (
        "d-rss.png",
        "(d) resident memory with the most claim + PV pairs present",
    ),
    (
        "d-rss-growth.png",
        "(d) steady RSS by claim + PV pairs present (dots: rounds, lines: medians)",
    ),
    (
        "a-rss.png",
        "(a) resident memory while provisioning and deleting, default QPS",
    ),
    (
        "b-rss.png",
        "(b) resident memory while provisioning and deleting, QPS 500",
    ),
    (
        "j-rss.png",
        "(j) node mode: resident memory of all sidecars together",
    ),
    (
        "j-time-to-bound.png",
        "(j) node mode: claims Bound over time",
    ),
];
