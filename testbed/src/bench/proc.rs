//! The benchmark's own child processes (the reference driver and the sidecars) and what
//! `/proc` says about them: resident memory (VmRSS, and its peak VmHWM) and CPU time.
//!
//! Children run under `setpriv --pdeathsig KILL` in their own process group, as the control
//! plane's do: a Ctrl-C reaches only the benchmark, which stops them, and if the benchmark dies
//! the kernel kills them.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use super::BenchError;

/// How often the sampler reads `/proc`.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// How long a child gets to exit after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(15);

/// What `/proc/<pid>` says at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcStat {
    pub rss_kib: u64,
    pub hwm_kib: u64,
    pub cpu_secs: f64,
}

impl ProcStat {
    pub fn rss_mib(&self) -> f64 {
        self.rss_kib as f64 / 1024.0
    }
    pub fn hwm_mib(&self) -> f64 {
        self.hwm_kib as f64 / 1024.0
    }
}

/// Pure: VmRSS and VmHWM (kB) from the text of `/proc/<pid>/status`.
pub fn parse_status(text: &str) -> (u64, u64) {
    let field = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Pure: utime + stime in clock ticks from the text of `/proc/<pid>/stat` (fields 14 and 15;
/// the command name in field 2 may contain spaces and parentheses, so count after the last ')').
pub fn parse_stat_ticks(text: &str) -> Option<u64> {
    let after = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on every Linux we know of).
pub fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

pub fn read_proc(pid: u32, ticks_per_sec: f64) -> Option<ProcStat> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (rss_kib, hwm_kib) = parse_status(&status);
    Some(ProcStat {
        rss_kib,
        hwm_kib,
        cpu_secs: parse_stat_ticks(&stat)? as f64 / ticks_per_sec,
    })
}

/// The process whose command line holds every one of `needles` (e.g. a control plane's
/// kube-apiserver by its `--secure-port=`), if exactly one does.
pub fn find_pid(needles: &[&str]) -> Option<u32> {
    let found: Vec<u32> = std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
                needles
                    .iter()
                    .all(|needle| args.iter().any(|arg| arg.ends_with(needle.as_bytes())))
            })
        })
        .collect();
    match found[..] {
        [pid] => Some(pid),
        _ => None,
    }
}

/// The share of a core a process used over the last `span`, from its cumulative CPU time read
/// now and then.
pub struct CpuWindow {
    span: Duration,
    history: VecDeque<(Instant, f64)>,
}

impl CpuWindow {
    pub fn new(span: Duration) -> CpuWindow {
        CpuWindow {
            span,
            history: VecDeque::new(),
        }
    }

    /// Records `cpu_secs` (cumulative) read at `now`; returns the share of a core used since the
    /// oldest reading within the span, or 1.0 (busy) while the readings cover less than 90 % of
    /// it, so a process that just started never counts as idle.
    pub fn push(&mut self, now: Instant, cpu_secs: f64) -> f64 {
        self.history.push_back((now, cpu_secs));
        while self
            .history
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) > self.span)
        {
            self.history.pop_front();
        }
        self.history.front().map_or(1.0, |(t, c)| {
            let covered = now.saturating_duration_since(*t).as_secs_f64();
            if covered < self.span.as_secs_f64() * 0.9 {
                1.0
            } else {
                (cpu_secs - c) / covered
            }
        })
    }
}

/// A child process of the benchmark, with its log file.
pub struct Proc {
    name: String,
    child: Child,
    pid: u32,
    log: PathBuf,
    samples: Arc<Mutex<Vec<(Instant, ProcStat)>>>,
    sampler: tokio::task::JoinHandle<()>,
}

/// What to start.
pub struct Spawn<'a> {
    pub name: &'a str,
    pub program: &'a Path,
    pub args: &'a [String],
    pub log: &'a Path,
    pub env: &'a [(&'a str, &'a str)],
    /// Run in a new UTS namespace with this hostname: two replicas of a sidecar on one machine
    /// then have different leader-election identities, as two pods would.
    pub hostname: Option<&'a str>,
}

impl Proc {
    pub fn spawn(s: &Spawn<'_>, ticks_per_sec: f64) -> Result<Proc, BenchError> {
        let log_err = |source| BenchError::Io {
            what: format!("creating {}", s.log.display()),
            source,
        };
        let out = std::fs::File::create(s.log).map_err(log_err)?;
        let err = out.try_clone().map_err(log_err)?;
        let mut cmd = Command::new("setpriv");
        cmd.args(["--pdeathsig", "KILL", "--"]);
        if let Some(host) = s.hostname {
            cmd.args(["unshare", "--uts", "--", "sh", "-c"])
                .arg("hostname \"$0\" && exec \"$@\"")
                .arg(host);
        }
        cmd.arg(s.program)
            .args(s.args)
            .envs(s.env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .kill_on_drop(true);
        let child = cmd.spawn().map_err(|source| BenchError::Io {
            what: format!("starting {} ({})", s.name, s.program.display()),
            source,
        })?;
        let pid = child.id().ok_or_else(|| BenchError::Step {
            step: format!("starting {}", s.name),
            detail: "it exited at once".into(),
        })?;
        let samples: Arc<Mutex<Vec<(Instant, ProcStat)>>> = Arc::default();
        let sink = Arc::clone(&samples);
        let sampler = tokio::spawn(async move {
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            loop {
                tick.tick().await;
                let Some(stat) = read_proc(pid, ticks_per_sec) else {
                    return;
                };
                sink.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((Instant::now(), stat));
            }
        });
        Ok(Proc {
            name: s.name.to_owned(),
            child,
            pid,
            log: s.log.to_owned(),
            samples,
            sampler,
        })
    }

    /// The last sample, or a fresh read.
    pub fn now(&self, ticks_per_sec: f64) -> ProcStat {
        read_proc(self.pid, ticks_per_sec)
            .or_else(|| self.samples().last().map(|(_, s)| *s))
            .unwrap_or_default()
    }

    /// Every sample so far.
    pub fn samples(&self) -> Vec<(Instant, ProcStat)> {
        self.samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// `Some(status)` once the process has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Fails with the log's tail if the process is gone.
    pub fn check_alive(&mut self) -> Result<(), BenchError> {
        match self.exited() {
            None => Ok(()),
            Some(status) => Err(BenchError::Step {
                step: format!("running {}", self.name),
                detail: format!(
                    "it exited ({status}); last lines of {}:\n{}",
                    self.log.display(),
                    log_tail(&self.log, 20)
                ),
            }),
        }
    }

    pub fn signal(&self, signal: Signal) {
        // The pid is our own child's, not yet reaped (reaping happens in `stop`/`exited`), so
        // it cannot name another process.
        let _ = kill(Pid::from_raw(self.pid as i32), signal);
    }

    /// SIGTERM, then SIGKILL after the grace period; returns how long the exit took.
    pub async fn stop(mut self) -> Duration {
        let started = Instant::now();
        if self.exited().is_none() {
            self.signal(Signal::SIGTERM);
            if tokio::time::timeout(STOP_GRACE, self.child.wait())
                .await
                .is_err()
            {
                eprintln!(
                    "[bench] {} did not exit {}s after SIGTERM; killing it",
                    self.name,
                    STOP_GRACE.as_secs()
                );
                let _ = self.child.kill().await;
            }
        }
        self.sampler.abort();
        started.elapsed()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.sampler.abort();
    }
}

pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The reference driver's volumes: the length of `volumes` in its `state.json`
/// (docs/reference-driver.md); 0 before the first volume is written.
pub fn driver_volume_count(state_dir: &Path) -> Result<usize, BenchError> {
    Ok(driver_volume_ids(state_dir)?.len())
}

/// The ids of the volumes the reference driver holds (the keys of `volumes` in its state file).
pub fn driver_volume_ids(state_dir: &Path) -> Result<BTreeSet<String>, BenchError> {
    Ok(driver_volume_sources(state_dir)?.into_keys().collect())
}

/// Each volume the reference driver holds, by id, with the content source its durable record
/// names (`source` in docs/reference-driver.md's state layout: `{"snapshot": id}` or
/// `{"volume": id}`; `None` for an empty volume).
pub fn driver_volume_sources(
    state_dir: &Path,
) -> Result<BTreeMap<String, Option<serde_json::Value>>, BenchError> {
    let path = state_dir.join("state.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(source) => {
            return Err(BenchError::Io {
                what: format!("reading {}", path.display()),
                source,
            });
        }
    };
    let state: serde_json::Value = serde_json::from_str(&text).map_err(|e| BenchError::Step {
        step: "reading the driver's state".into(),
        detail: format!("{}: {e}", path.display()),
    })?;
    Ok(state
        .get("volumes")
        .and_then(serde_json::Value::as_object)
        .map(|volumes| {
            volumes
                .iter()
                .map(|(id, record)| {
                    let source = record.get("source").filter(|s| !s.is_null()).cloned();
                    (id.clone(), source)
                })
                .collect()
        })
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_in_kib() {
        let text =
            "Name:\tcsi-provisioner\nVmPeak:\t  900 kB\nVmHWM:\t   51200 kB\nVmRSS:\t   40960 kB\n";
        assert_eq!(parse_status(text), (40960, 51200));
        assert_eq!(parse_status(""), (0, 0));
    }

    #[test]
    fn stat_ticks_survive_odd_command_names() {
        let text = "4242 (csi (provisioner)) S 1 4242 4242 0 -1 4194560 500 0 0 0 123 45 0 0 20 0 9 0 100 1000 200";
        assert_eq!(parse_stat_ticks(text), Some(168));
        assert_eq!(parse_stat_ticks("garbage"), None);
    }

    #[test]
    fn cpu_window_is_busy_until_covered_then_gives_the_share() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut w = CpuWindow::new(Duration::from_secs(3));
        assert_eq!(w.push(at(0), 10.0), 1.0);
        assert_eq!(w.push(at(2000), 10.1), 1.0);
        // 3 s covered, 0.3 s of CPU: a tenth of a core.
        assert!((w.push(at(3000), 10.3) - 0.1).abs() < 1e-9);
        // The reading at 0 leaves the window; 2 → 4.5 s with 0.0 s more is idle.
        assert_eq!(w.push(at(4500), 10.3), 1.0);
        assert!((w.push(at(5000), 10.3) - (0.2 / 3.0)).abs() < 1e-9);
    }

    #[test]
    fn a_process_is_found_by_its_command_line_only_when_unique() {
        let exe = std::env::args().next().expect("argv[0]");
        assert_eq!(find_pid(&[exe.as_str()]), Some(std::process::id()));
        assert_eq!(find_pid(&[exe.as_str(), "--no-such-flag=1"]), None);
    }

    #[test]
    fn our_own_process_is_readable() {
        let stat = read_proc(std::process::id(), clock_ticks()).expect("read /proc/self");
        assert!(stat.rss_kib > 0 && stat.hwm_kib >= stat.rss_kib);
    }

    #[test]
    fn driver_state_counts_volumes() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(
            driver_volume_count(dir.path()).expect("missing is empty"),
            0
        );
        std::fs::write(
            dir.path().join("state.json"),
            r#"{"version":1,"volumes":{"vol-1":{},"vol-2":{"source":{"snapshot":"snap-1"}}},"snapshots":{}}"#,
        )
        .expect("write");
        assert_eq!(driver_volume_count(dir.path()).expect("count"), 2);
        assert_eq!(
            driver_volume_ids(dir.path()).expect("ids"),
            BTreeSet::from(["vol-1".to_owned(), "vol-2".to_owned()])
        );
        let sources = driver_volume_sources(dir.path()).expect("sources");
        assert_eq!(sources.get("vol-1"), Some(&None));
        assert_eq!(
            sources.get("vol-2"),
            Some(&Some(serde_json::json!({"snapshot": "snap-1"})))
        );
    }
}
