//! Fault-injection rules: parsing of `--delay`/`--fault` specs and control-file lines, and the
//! per-method pre/post hook decisions (see the module documentation of `driver` for the syntax).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use thiserror::Error;
use tonic::Code;

/// Every RPC name the driver serves or answers UNIMPLEMENTED for; rules naming anything else are
/// rejected so a typo cannot silently disable a test's fault.
pub const METHODS: &[&str] = &[
    "GetPluginInfo",
    "GetPluginCapabilities",
    "Probe",
    "CreateVolume",
    "DeleteVolume",
    "ControllerPublishVolume",
    "ControllerUnpublishVolume",
    "ValidateVolumeCapabilities",
    "ListVolumes",
    "GetCapacity",
    "ControllerGetCapabilities",
    "CreateSnapshot",
    "DeleteSnapshot",
    "ListSnapshots",
    "GetSnapshot",
    "ControllerExpandVolume",
    "ControllerGetVolume",
    "ControllerModifyVolume",
    "NodeStageVolume",
    "NodeUnstageVolume",
    "NodePublishVolume",
    "NodeUnpublishVolume",
    "NodeGetVolumeStats",
    "NodeExpandVolume",
    "NodeGetCapabilities",
    "NodeGetInfo",
];

/// Kinds of call a rule may single out within one method, written `METHOD/KIND`: a
/// CreateVolume that restores a snapshot or clones a volume. A rule for the plain method also
/// matches these calls; a rule for a kind matches only its own.
pub const CALL_KINDS: &[&str] = &["CreateVolume/snapshot", "CreateVolume/volume"];

/// gRPC codes a fault may return, by their canonical lower-case names.
const CODES: &[(&str, Code)] = &[
    ("cancelled", Code::Cancelled),
    ("unknown", Code::Unknown),
    ("invalid-argument", Code::InvalidArgument),
    ("deadline-exceeded", Code::DeadlineExceeded),
    ("not-found", Code::NotFound),
    ("already-exists", Code::AlreadyExists),
    ("permission-denied", Code::PermissionDenied),
    ("resource-exhausted", Code::ResourceExhausted),
    ("failed-precondition", Code::FailedPrecondition),
    ("aborted", Code::Aborted),
    ("out-of-range", Code::OutOfRange),
    ("unimplemented", Code::Unimplemented),
    ("internal", Code::Internal),
    ("unavailable", Code::Unavailable),
    ("data-loss", Code::DataLoss),
    ("unauthenticated", Code::Unauthenticated),
];

#[derive(Debug, Error, PartialEq, Eq)]
pub enum FaultParseError {
    #[error("expected METHOD=VALUE, got {0:?}")]
    MissingEquals(String),
    #[error("unknown RPC method {0:?} (use a CSI method name such as CreateVolume, or *)")]
    UnknownMethod(String),
    #[error("invalid duration {0:?} (use e.g. 50ms, 2s, 1m, 1h or 0)")]
    Duration(String),
    #[error("expected PHASE:ACTION[:COUNT], got {0:?}")]
    FaultShape(String),
    #[error("unknown phase {0:?} (use before or after)")]
    Phase(String),
    #[error(
        "unknown action {0:?} (use hang or a gRPC code such as deadline-exceeded or unavailable)"
    )]
    Action(String),
    #[error("invalid count {0:?} (use a positive number or always)")]
    Count(String),
    #[error("line {line}: expected `delay SPEC` or `fault SPEC`, got {text:?}")]
    ControlLine { line: usize, text: String },
    #[error("line {line}: {source}")]
    InLine {
        line: usize,
        #[source]
        source: Box<FaultParseError>,
    },
}

/// Which RPCs a rule applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MethodPattern {
    Any,
    /// A method of [`METHODS`] or a call kind of [`CALL_KINDS`].
    Exact(&'static str),
}

impl MethodPattern {
    /// How closely the pattern names `call` (a method, or `METHOD/KIND` for a call of that
    /// kind), or `None` when it does not match: `*` is 0, the method 1, the exact kind 2.
    fn rank(self, call: &str) -> Option<u8> {
        match self {
            Self::Any => Some(0),
            Self::Exact(name) if name == call => Some(if name.contains('/') { 2 } else { 1 }),
            Self::Exact(name) => call
                .split_once('/')
                .is_some_and(|(method, _)| method == name)
                .then_some(1),
        }
    }

    fn matches(self, call: &str) -> bool {
        self.rank(call).is_some()
    }
}

impl FromStr for MethodPattern {
    type Err = FaultParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s == "*" {
            return Ok(Self::Any);
        }
        METHODS
            .iter()
            .chain(CALL_KINDS)
            .find(|m| **m == s)
            .map(|m| Self::Exact(m))
            .ok_or_else(|| FaultParseError::UnknownMethod(s.to_string()))
    }
}

impl fmt::Display for MethodPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => f.write_str("*"),
            Self::Exact(name) => f.write_str(name),
        }
    }
}

/// `METHOD=DURATION`: sleep that long in the matching RPCs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DelayRule {
    pub method: MethodPattern,
    pub delay: Duration,
}

impl FromStr for DelayRule {
    type Err = FaultParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (method, value) = split_spec(s)?;
        Ok(Self {
            method: method.parse()?,
            delay: parse_duration(value)?,
        })
    }
}

/// When a fault fires relative to the RPC's real work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Before argument validation and before anything is changed.
    Before,
    /// After the RPC succeeded (its effect is durable), replacing the successful reply.
    After,
}

/// What a firing fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Return this gRPC code with an "injected fault" message.
    Fail(Code),
    /// Never answer; the call ends only when the caller cancels or its deadline passes.
    Hang,
}

/// How many more calls a fault fires for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Times {
    Always,
    Next(u32),
}

/// `METHOD=PHASE:ACTION[:COUNT]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultRule {
    pub method: MethodPattern,
    pub phase: Phase,
    pub action: Action,
    pub times: Times,
}

impl FromStr for FaultRule {
    type Err = FaultParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (method, value) = split_spec(s)?;
        let parts: Vec<&str> = value.split(':').map(str::trim).collect();
        let (phase, action, count) = match parts.as_slice() {
            [phase, action] => (*phase, *action, None),
            [phase, action, count] => (*phase, *action, Some(*count)),
            _ => return Err(FaultParseError::FaultShape(value.to_string())),
        };
        let phase = match phase {
            "before" => Phase::Before,
            "after" => Phase::After,
            other => return Err(FaultParseError::Phase(other.to_string())),
        };
        let action = if action == "hang" {
            Action::Hang
        } else {
            Action::Fail(parse_code(action)?)
        };
        let times = match count {
            None | Some("always") => Times::Always,
            Some(n) => match n.parse::<u32>() {
                Ok(n) if n > 0 => Times::Next(n),
                _ => return Err(FaultParseError::Count(n.to_string())),
            },
        };
        Ok(Self {
            method: method.parse()?,
            phase,
            action,
            times,
        })
    }
}

/// The complete set of injection rules in force at one time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultRules {
    pub delays: Vec<DelayRule>,
    pub faults: Vec<FaultRule>,
}

impl FaultRules {
    /// Parses control-file content: one `delay SPEC` or `fault SPEC` per line; blank lines and
    /// lines starting with `#` are ignored.
    pub fn parse_control(text: &str) -> Result<Self, FaultParseError> {
        let mut rules = Self::default();
        for (index, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let in_line = |source| FaultParseError::InLine {
                line: index + 1,
                source: Box::new(source),
            };
            match line.split_once(char::is_whitespace) {
                Some(("delay", spec)) => rules.delays.push(spec.parse().map_err(in_line)?),
                Some(("fault", spec)) => rules.faults.push(spec.parse().map_err(in_line)?),
                _ => {
                    return Err(FaultParseError::ControlLine {
                        line: index + 1,
                        text: line.to_string(),
                    });
                }
            }
        }
        Ok(rules)
    }

    /// The delay for `call` (a method, or `METHOD/KIND`): the last of the rules that name it
    /// most closely (its kind, then its method, then `*`).
    pub fn delay_for(&self, call: &str) -> Duration {
        self.delays
            .iter()
            .filter_map(|d| d.method.rank(call).map(|rank| (rank, d.delay)))
            // max_by_key keeps the last of equal ranks.
            .max_by_key(|(rank, _)| *rank)
            .map_or(Duration::ZERO, |(_, delay)| delay)
    }

    /// Consumes one firing of the first rule that matches `call` (a method, or `METHOD/KIND`)
    /// and `phase` and still has calls left, in the order the rules were given.
    pub fn take(&mut self, call: &str, phase: Phase) -> Option<Action> {
        let rule = self
            .faults
            .iter_mut()
            .find(|r| r.phase == phase && r.method.matches(call) && r.times != Times::Next(0))?;
        if let Times::Next(n) = &mut rule.times {
            *n -= 1;
        }
        Some(rule.action)
    }
}

fn split_spec(s: &str) -> Result<(&str, &str), FaultParseError> {
    s.split_once('=')
        .map(|(m, v)| (m.trim(), v.trim()))
        .ok_or_else(|| FaultParseError::MissingEquals(s.to_string()))
}

/// Parses `0`, `<n>ms`, `<n>s`, `<n>m` or `<n>h` (whole numbers).
pub fn parse_duration(s: &str) -> Result<Duration, FaultParseError> {
    let s = s.trim();
    let err = || FaultParseError::Duration(s.to_string());
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let split = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?;
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits.parse().map_err(|_| err())?;
    let millis_per_unit = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(err()),
    };
    n.checked_mul(millis_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(err)
}

/// Accepts `deadline-exceeded`, `DEADLINE_EXCEEDED`, `DeadlineExceeded` and similar spellings.
fn parse_code(s: &str) -> Result<Code, FaultParseError> {
    let squash = |t: &str| -> String {
        t.chars()
            .filter(|c| *c != '-' && *c != '_')
            .flat_map(char::to_lowercase)
            .collect()
    };
    let wanted = squash(s);
    CODES
        .iter()
        .find(|(name, _)| squash(name) == wanted)
        .map(|(_, code)| *code)
        .ok_or_else(|| FaultParseError::Action(s.to_string()))
}

/// Identity of one version of the control file; a rename-into-place changes the inode even when
/// the modification time does not move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp_of(path: &Path) -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some(FileStamp {
        modified: meta.modified().ok(),
        len: meta.len(),
        inode: meta.ino(),
    })
}

struct Active {
    rules: FaultRules,
    seen: Option<FileStamp>,
}

/// The live rule set: the start-up rules until the control file is first seen, then whatever the
/// control file says (re-read whenever it changes, emptied when it disappears).
pub struct FaultInjector {
    control_file: PathBuf,
    active: Mutex<Active>,
}

impl FaultInjector {
    pub fn new(initial: FaultRules, control_file: PathBuf) -> Self {
        Self {
            control_file,
            active: Mutex::new(Active {
                rules: initial,
                seen: None,
            }),
        }
    }

    /// Re-reads the control file if it changed since the last call. Called at the start of every
    /// RPC, so a test that rewrote the file sees the new rules on its very next call.
    pub fn refresh(&self) {
        let stamp = stamp_of(&self.control_file);
        let mut active = self.lock();
        if stamp == active.seen {
            return;
        }
        let was_seen = active.seen.is_some();
        active.seen = stamp;
        if stamp.is_none() {
            if was_seen {
                tracing::info!(file = %self.control_file.display(), "fault control file removed; no faults active");
                active.rules = FaultRules::default();
            }
            return;
        }
        let parsed = std::fs::read_to_string(&self.control_file)
            .map_err(|e| e.to_string())
            .and_then(|text| FaultRules::parse_control(&text).map_err(|e| e.to_string()));
        match parsed {
            Ok(rules) => {
                tracing::info!(file = %self.control_file.display(), ?rules, "fault rules loaded from control file");
                active.rules = rules;
            }
            Err(error) => {
                tracing::warn!(file = %self.control_file.display(), %error, "ignoring unreadable fault control file; previous rules stay active");
            }
        }
    }

    pub fn delay_for(&self, call: &str) -> Duration {
        self.lock().rules.delay_for(call)
    }

    pub fn take(&self, call: &str, phase: Phase) -> Option<Action> {
        self.lock().rules.take(call, phase)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Active> {
        // A panic while holding this lock cannot leave the rules half-updated (every update is a
        // single assignment), so a poisoned lock is still safe to use.
        self.active
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_delays() {
        let d: DelayRule = "CreateVolume=2s".parse().unwrap();
        assert_eq!(d.method, MethodPattern::Exact("CreateVolume"));
        assert_eq!(d.delay, Duration::from_secs(2));
        let d: DelayRule = " * = 50ms ".parse().unwrap();
        assert_eq!(d.method, MethodPattern::Any);
        assert_eq!(d.delay, Duration::from_millis(50));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("3m"), Ok(Duration::from_secs(180)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
    }

    #[test]
    fn rejects_bad_delays() {
        for bad in [
            "CreateVolume",
            "CreateVolum=1s",
            "CreateVolume=1",
            "CreateVolume=s",
            "*=1.5s",
            "*=-1s",
            "*=99999999999999999999ms",
        ] {
            assert!(
                bad.parse::<DelayRule>().is_err(),
                "{bad} should be rejected"
            );
        }
    }

    #[test]
    fn parses_faults() {
        let f: FaultRule = "CreateVolume=after:deadline-exceeded:3".parse().unwrap();
        assert_eq!(
            f,
            FaultRule {
                method: MethodPattern::Exact("CreateVolume"),
                phase: Phase::After,
                action: Action::Fail(Code::DeadlineExceeded),
                times: Times::Next(3),
            }
        );
        let f: FaultRule = "*=before:UNAVAILABLE".parse().unwrap();
        assert_eq!(f.action, Action::Fail(Code::Unavailable));
        assert_eq!(f.times, Times::Always);
        let f: FaultRule = "DeleteVolume=before:hang:always".parse().unwrap();
        assert_eq!(f.action, Action::Hang);
        let f: FaultRule = "Probe=before:FailedPrecondition:1".parse().unwrap();
        assert_eq!(f.action, Action::Fail(Code::FailedPrecondition));
    }

    #[test]
    fn rejects_bad_faults() {
        for bad in [
            "CreateVolume",
            "CreateVolume=after",
            "CreateVolume=during:internal",
            "CreateVolume=after:ok",
            "CreateVolume=after:teapot",
            "CreateVolume=after:internal:0",
            "CreateVolume=after:internal:-2",
            "CreateVolume=after:internal:2:3",
            "Nope=after:internal",
        ] {
            assert!(
                bad.parse::<FaultRule>().is_err(),
                "{bad} should be rejected"
            );
        }
    }

    #[test]
    fn counted_faults_fire_exactly_n_times_in_order() {
        let mut rules = FaultRules {
            delays: vec![],
            faults: vec![
                "CreateVolume=before:unavailable:2".parse().unwrap(),
                "CreateVolume=after:deadline-exceeded:1".parse().unwrap(),
                "*=before:internal:1".parse().unwrap(),
            ],
        };
        let before = Action::Fail(Code::Unavailable);
        assert_eq!(rules.take("CreateVolume", Phase::Before), Some(before));
        assert_eq!(rules.take("CreateVolume", Phase::Before), Some(before));
        // The first rule is used up; the wildcard rule is next in line.
        assert_eq!(
            rules.take("CreateVolume", Phase::Before),
            Some(Action::Fail(Code::Internal))
        );
        assert_eq!(rules.take("CreateVolume", Phase::Before), None);
        assert_eq!(
            rules.take("CreateVolume", Phase::After),
            Some(Action::Fail(Code::DeadlineExceeded))
        );
        assert_eq!(rules.take("CreateVolume", Phase::After), None);
        assert_eq!(rules.take("DeleteVolume", Phase::Before), None);
    }

    #[test]
    fn exact_delay_beats_wildcard() {
        let rules = FaultRules {
            delays: vec![
                "CreateVolume=2s".parse().unwrap(),
                "*=50ms".parse().unwrap(),
                "CreateVolume=3s".parse().unwrap(),
            ],
            faults: vec![],
        };
        assert_eq!(rules.delay_for("CreateVolume"), Duration::from_secs(3));
        assert_eq!(rules.delay_for("Probe"), Duration::from_millis(50));
        assert_eq!(FaultRules::default().delay_for("Probe"), Duration::ZERO);
    }

    #[test]
    fn call_kinds_are_matched_by_their_method_and_by_themselves() {
        let mut rules = FaultRules {
            delays: vec![
                "CreateVolume/snapshot=3s".parse().unwrap(),
                "CreateVolume=2s".parse().unwrap(),
                "*=50ms".parse().unwrap(),
            ],
            faults: vec![
                "CreateVolume/volume=after:deadline-exceeded:1"
                    .parse()
                    .unwrap(),
                "CreateVolume=after:unavailable:1".parse().unwrap(),
            ],
        };
        assert_eq!(
            rules.delay_for("CreateVolume/snapshot"),
            Duration::from_secs(3),
            "the kind beats its method, whatever the order"
        );
        assert_eq!(
            rules.delay_for("CreateVolume/volume"),
            Duration::from_secs(2)
        );
        assert_eq!(rules.delay_for("CreateVolume"), Duration::from_secs(2));
        assert_eq!(rules.delay_for("DeleteVolume"), Duration::from_millis(50));

        assert_eq!(
            rules.take("CreateVolume", Phase::After),
            Some(Action::Fail(Code::Unavailable)),
            "a plain CreateVolume skips the clone's rule"
        );
        assert_eq!(rules.take("CreateVolume/snapshot", Phase::After), None);
        assert_eq!(
            rules.take("CreateVolume/volume", Phase::After),
            Some(Action::Fail(Code::DeadlineExceeded))
        );
        assert!(
            "CreateVolume/nothing=after:internal"
                .parse::<FaultRule>()
                .is_err()
        );
        assert!("DeleteVolume/volume=1s".parse::<DelayRule>().is_err());
    }

    #[test]
    fn parses_control_file() {
        let rules = FaultRules::parse_control(
            "# test setup\n\ndelay CreateVolume=1s\nfault CreateVolume=after:deadline-exceeded:3\n  delay *=5ms\n",
        )
        .unwrap();
        assert_eq!(rules.delays.len(), 2);
        assert_eq!(rules.faults.len(), 1);
        assert_eq!(
            FaultRules::parse_control("delay CreateVolume=1s\nslow CreateVolume"),
            Err(FaultParseError::ControlLine {
                line: 2,
                text: "slow CreateVolume".into()
            })
        );
        let err = FaultRules::parse_control("fault CreateVolume=after:nope").unwrap_err();
        assert!(
            err.to_string().starts_with("line 1: unknown action"),
            "{err}"
        );
    }

    #[test]
    fn injector_follows_control_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("faults");
        let initial = FaultRules {
            delays: vec!["*=1s".parse().unwrap()],
            faults: vec![],
        };
        let injector = FaultInjector::new(initial, file.clone());
        injector.refresh();
        assert_eq!(
            injector.delay_for("Probe"),
            Duration::from_secs(1),
            "flags rule until a file shows up"
        );

        std::fs::write(&file, "fault Probe=before:unavailable:1\n").unwrap();
        injector.refresh();
        assert_eq!(
            injector.delay_for("Probe"),
            Duration::ZERO,
            "file replaces the flag rules"
        );
        assert_eq!(
            injector.take("Probe", Phase::Before),
            Some(Action::Fail(Code::Unavailable))
        );
        injector.refresh();
        assert_eq!(
            injector.take("Probe", Phase::Before),
            None,
            "unchanged file is not re-armed"
        );

        std::fs::write(&file, "delay Probe=2s\n").unwrap();
        injector.refresh();
        std::fs::write(&file, "delay Probe=2s\nfault Probe=before:not-a-code\n").unwrap();
        injector.refresh();
        assert_eq!(
            injector.delay_for("Probe"),
            Duration::from_secs(2),
            "bad file keeps previous rules"
        );

        let tmp = dir.path().join("faults.tmp");
        std::fs::write(&tmp, "fault Probe=before:unavailable:1\n").unwrap();
        std::fs::rename(&tmp, &file).unwrap();
        injector.refresh();
        assert_eq!(
            injector.take("Probe", Phase::Before),
            Some(Action::Fail(Code::Unavailable))
        );

        std::fs::write(&file, "fault Probe=before:internal\n").unwrap();
        injector.refresh();
        std::fs::remove_file(&file).unwrap();
        injector.refresh();
        assert_eq!(
            injector.take("Probe", Phase::Before),
            None,
            "removing the file clears all rules"
        );
    }
}
