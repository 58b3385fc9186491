//! Child processes of one control plane, and the three layers that make sure none outlives it:
//!
//! 1. `Drop` of [`Supervisor`] sends SIGTERM to each child's process group (every child gets its
//!    own group, so a terminal's Ctrl-C does not hit them half-way and nothing they fork is
//!    missed), waits, then SIGKILLs what is left.
//! 2. A handle kept in a `static` (one control plane per test binary) is never dropped, so each
//!    child is started through `setpriv --pdeathsig KILL`: the kernel kills it when its parent
//!    dies. That "parent" is the *thread* that spawned it, hence all spawning happens on one
//!    dedicated thread that lives exactly as long as the supervisor.
//! 3. A tiny `sh` reaper, in its own process group, reads the children's group ids on a pipe; when
//!    this process exits for any reason the pipe closes, and the reaper kills those groups and
//!    removes the run's directory (the temp dir has no other chance to go in that case). A normal
//!    teardown kills the reaper first.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::error::{Component, Error};

/// How long children get to exit after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(10);
const EXIT_POLL: Duration = Duration::from_millis(50);

/// Kill every group it was told about once its stdin closes, wait (bounded) until they are gone
/// so nothing writes into the directory any more, then remove the directory unless kept.
/// Lines are `+<pgid>` (started) and `-<pgid>` (already stopped and reaped by us).
const REAPER_SCRIPT: &str = r#"
keep=$1 dir=$2 groups=' '
while read -r line; do
  case $line in
    +*) groups="$groups${line#+} " ;;
    -*) groups=$(printf '%s' "$groups" | sed "s/ ${line#-} / /") ;;
  esac
done
for g in $groups; do kill -KILL "-$g" 2>/dev/null; done
alive() { [ -r "/proc/$1/stat" ] && read -r _ _ state _ < "/proc/$1/stat" && [ "$state" != Z ]; }
for g in $groups; do
  i=0
  while alive "$g" && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
done
[ "$keep" = 1 ] || rm -rf -- "$dir"
"#;

struct Managed {
    component: Component,
    child: Child,
}

/// Owns the children of one control plane; dropping it stops them all.
pub struct Supervisor {
    children: Vec<Managed>,
    spawner: Option<Spawner>,
    reaper: Option<Reaper>,
    setpriv: Option<PathBuf>,
}

impl Supervisor {
    /// `dir` is the run's directory, which the reaper removes if this process dies unexpectedly
    /// (unless `keep_dir`).
    pub fn new(dir: &Path, keep_dir: bool) -> Result<Self, Error> {
        let setpriv = find_in_path("setpriv");
        if setpriv.is_none() {
            eprintln!(
                "[testbed] setpriv (util-linux) not found: children are not killed by the kernel if this process dies; only the reaper cleans up then"
            );
        }
        let reaper = Reaper::start(dir, keep_dir)
            .map_err(|e| Error::Supervisor(format!("cannot start the sh reaper: {e}")))?;
        let spawner = Spawner::start()
            .map_err(|e| Error::Supervisor(format!("cannot start the spawner thread: {e}")))?;
        Ok(Supervisor {
            children: Vec::new(),
            spawner: Some(spawner),
            reaper: Some(reaper),
            setpriv,
        })
    }

    /// Starts `program args...` in its own process group, stdout and stderr appended to `log`.
    pub fn spawn(
        &mut self,
        component: Component,
        program: &Path,
        args: &[String],
        log: &Path,
    ) -> Result<(), Error> {
        let spawn_err = |source| Error::Spawn { component, source };
        let out = File::create(log).map_err(spawn_err)?;
        let err = out.try_clone().map_err(spawn_err)?;
        let mut cmd = match &self.setpriv {
            Some(setpriv) => {
                let mut cmd = Command::new(setpriv);
                cmd.args(["--pdeathsig", "KILL", "--"]).arg(program);
                cmd
            }
            None => Command::new(program),
        };
        cmd.args(args)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let spawner = self
            .spawner
            .as_ref()
            .ok_or_else(|| spawn_err(std::io::Error::other("supervisor is shutting down")))?;
        let child = spawner.spawn(cmd).map_err(spawn_err)?;
        if let Some(reaper) = &mut self.reaper {
            reaper.announce('+', child.id());
        }
        self.children.push(Managed { component, child });
        Ok(())
    }

    /// `Some(status)` once the component's process has exited (it is then reaped).
    pub fn exit_status(&mut self, component: Component) -> Option<ExitStatus> {
        self.children
            .iter_mut()
            .find(|m| m.component == component)
            .and_then(|m| m.child.try_wait().ok().flatten())
    }

    #[cfg(test)]
    pub fn pid(&mut self, component: Component) -> Option<u32> {
        self.exit_status(component).is_none().then(|| {
            self.children
                .iter()
                .find(|m| m.component == component)
                .map(|m| m.child.id())
        })?
    }

    /// Stops one component (e.g. to retry it on fresh ports).
    pub fn stop(&mut self, component: Component) {
        let (stopping, rest) = std::mem::take(&mut self.children)
            .into_iter()
            .partition(|m| m.component == component);
        self.children = rest;
        self.stop_all_of(stopping);
    }

    fn stop_all_of(&mut self, mut children: Vec<Managed>) {
        for m in &mut children {
            if matches!(m.child.try_wait(), Ok(None)) {
                signal_group(&m.child, Signal::SIGTERM);
            }
        }
        let deadline = Instant::now() + TERM_GRACE;
        while Instant::now() < deadline
            && children
                .iter_mut()
                .any(|m| matches!(m.child.try_wait(), Ok(None)))
        {
            std::thread::sleep(EXIT_POLL);
        }
        for m in &mut children {
            if matches!(m.child.try_wait(), Ok(None)) {
                eprintln!(
                    "[testbed] {} ignored SIGTERM for {TERM_GRACE:?}; sending SIGKILL",
                    m.component
                );
                signal_group(&m.child, Signal::SIGKILL);
            }
            // Reaps the child; an error means it was already reaped.
            let _ = m.child.wait();
            // Sweeps up anything it forked that outlived it. The group id cannot have been
            // recycled yet: the kernel keeps it reserved while any member is left.
            signal_group(&m.child, Signal::SIGKILL);
            if let Some(reaper) = &mut self.reaper {
                reaper.announce('-', m.child.id());
            }
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        // The reaper goes first: it must not race the orderly shutdown below.
        if let Some(reaper) = self.reaper.take() {
            reaper.dismiss();
        }
        // One at a time, newest first (controller manager, apiserver, etcd): each exits
        // promptly only while what it depends on is still up.
        let children = std::mem::take(&mut self.children);
        for child in children.into_iter().rev() {
            self.stop_all_of(vec![child]);
        }
        if let Some(spawner) = self.spawner.take() {
            spawner.finish();
        }
    }
}

/// Children are group leaders (`process_group(0)`), so their pid is their group id.
fn signal_group(child: &Child, signal: Signal) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // ESRCH (already gone) is the only expected failure and needs no action.
        let _ = killpg(Pid::from_raw(pid), signal);
    }
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// The one thread that forks every child, so that `--pdeathsig` fires when the supervisor (and
/// with it this thread) goes away, not when whichever caller thread happened to start a child
/// exits (a test's thread, a runtime worker).
struct Spawner {
    requests: mpsc::Sender<SpawnRequest>,
    thread: JoinHandle<()>,
}

impl Spawner {
    fn start() -> std::io::Result<Self> {
        let (requests, incoming) = mpsc::channel::<SpawnRequest>();
        let thread = std::thread::Builder::new()
            .name("testbed-spawner".to_owned())
            .spawn(move || {
                for (mut cmd, reply) in incoming {
                    // The requester may have given up; the child is then killed by
                    // `--pdeathsig` and the reaper when this process exits.
                    let _ = reply.send(cmd.spawn());
                }
            })?;
        Ok(Spawner { requests, thread })
    }

    fn spawn(&self, cmd: Command) -> std::io::Result<Child> {
        let (reply, answer) = mpsc::channel();
        self.requests
            .send((cmd, reply))
            .map_err(|_| std::io::Error::other("spawner thread is gone"))?;
        answer
            .recv()
            .map_err(|_| std::io::Error::other("spawner thread is gone"))?
    }

    fn finish(self) {
        drop(self.requests);
        // A panic there would already have been reported; nothing is left to clean.
        let _ = self.thread.join();
    }
}

struct Reaper {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Reaper {
    fn start(dir: &Path, keep_dir: bool) -> std::io::Result<Self> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(REAPER_SCRIPT)
            .arg("csi-testbed-reaper")
            .arg(if keep_dir { "1" } else { "0" })
            .arg(dir)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let stdin = child.stdin.take();
        Ok(Reaper { child, stdin })
    }

    fn announce(&mut self, sign: char, pid: u32) {
        let written = self
            .stdin
            .as_mut()
            .map(|s| writeln!(s, "{sign}{pid}").and_then(|()| s.flush()));
        if let Some(Err(e)) = written {
            eprintln!("[testbed] the reaper is gone ({e}); relying on --pdeathsig alone");
            self.stdin = None;
        }
    }

    fn dismiss(mut self) {
        // Killed before its stdin closes, so it never acts; errors mean it already exited.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find_in_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// The last `lines` lines of a log file (reading at most its last 256 KiB).
pub fn log_tail(path: &Path, lines: usize) -> String {
    const MAX_BYTES: u64 = 256 * 1024;
    let read = File::open(path).and_then(|mut f| {
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(MAX_BYTES)))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        Ok(buf)
    });
    match read {
        Ok(buf) => last_lines(&String::from_utf8_lossy(&buf), lines),
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

fn last_lines(text: &str, n: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_lines_keeps_the_end() {
        assert_eq!(last_lines("a\nb\nc\n", 2), "b\nc");
        assert_eq!(last_lines("a\n", 5), "a");
        assert_eq!(last_lines("", 3), "");
    }

    #[test]
    fn dropping_the_supervisor_kills_the_group_and_keeps_the_dir_for_its_owner() {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("sleep.log");
        let mut sup = Supervisor::new(dir.path(), false).expect("supervisor");
        sup.spawn(
            Component::Etcd,
            Path::new("/bin/sh"),
            // The leader exits on SIGTERM; the forked member ignores it.
            &[
                "-c".to_owned(),
                "(trap '' TERM; exec sleep 300) & exec sleep 301".to_owned(),
            ],
            &log,
        )
        .expect("spawn");
        let pid = sup.children[0].child.id();
        assert!(sup.exit_status(Component::Etcd).is_none());
        drop(sup);
        let group_alive =
            || i32::try_from(pid).is_ok_and(|p| killpg(Pid::from_raw(p), None::<Signal>).is_ok());
        // Killed members linger as zombies until init reaps them.
        let deadline = Instant::now() + Duration::from_secs(5);
        while group_alive() && Instant::now() < deadline {
            std::thread::sleep(EXIT_POLL);
        }
        assert!(!group_alive(), "process group {pid} survived");
        // An orderly teardown leaves the directory to its owner (the TempDir here).
        assert!(dir.path().exists());
    }

    #[test]
    fn reaper_cleans_up_when_its_pipe_closes() {
        let base = tempfile::tempdir().expect("temp dir");
        let run_dir = base.path().join("run");
        std::fs::create_dir(&run_dir).expect("mkdir");
        let mut victim = Command::new("sleep")
            .arg("300")
            .process_group(0)
            .spawn()
            .expect("spawn sleep");
        let mut reaper = Reaper::start(&run_dir, false).expect("reaper");
        reaper.announce('+', victim.id());
        // What happens when this process dies: the write end of the pipe closes.
        drop(reaper.stdin.take());
        let status = reaper.child.wait().expect("reaper exit");
        assert!(status.success());
        assert!(
            victim.wait().is_ok_and(|s| !s.success()),
            "victim was not killed"
        );
        assert!(!run_dir.exists(), "run directory not removed");
    }
}
