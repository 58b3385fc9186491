//! CPU profiles in pprof's format (`profile.proto`, gzip-compressed, as Go's
//! `/debug/pprof/profile` serves them), so `go tool pprof` and every pprof viewer read them.
//!
//! Sampling is pprof-rs's: a SIGPROF timer at [`FREQUENCY`] whose handler records the stack
//! of the interrupted thread. It runs only while a profile is being taken (the guard stops
//! the timer and ignores SIGPROF again when dropped), one profile at a time; the handler is
//! installed with SA_RESTART, so tokio's and std's system calls resume after a sample. Stacks
//! are not unwound through libc, libgcc, pthread and the vDSO, where unwinding from a signal
//! handler is not safe (pprof-rs' advice). The static musl build walks frame pointers instead
//! of unwind tables (musl's signal trampoline has none, so unwinding would stop there; see
//! Cargo.toml and hack/build-static.sh).

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use flate2::Compression;
use flate2::write::GzEncoder;
use prost::Message;

/// Samples per second, Go's rate.
pub const FREQUENCY: i32 = 100;

/// Libraries whose frames are not unwound from the signal handler.
const BLOCKLIST: [&str; 4] = ["libc", "libgcc", "pthread", "vdso"];

#[derive(Debug, thiserror::Error)]
pub enum CpuProfileError {
    #[error("could not enable CPU profiling (another profile may be in progress): {0}")]
    Start(#[source] pprof::Error),
    #[error("could not build the CPU profile: {0}")]
    Report(#[source] pprof::Error),
    #[error("could not compress the CPU profile: {0}")]
    Compress(#[source] std::io::Error),
}

/// Samples every thread for `duration` (blocking the calling thread) and returns the profile,
/// gzip-compressed.
pub fn profile(duration: Duration) -> Result<Vec<u8>, CpuProfileError> {
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(FREQUENCY)
        .blocklist(&BLOCKLIST)
        .build()
        .map_err(CpuProfileError::Start)?;
    std::thread::sleep(duration);
    let report = guard.report().build().map_err(CpuProfileError::Report)?;
    drop(guard);
    let stacks = report.data.iter().map(|(frames, count)| Stack {
        thread: frames.thread_name_or_id(),
        frames: frames
            .frames
            .iter()
            .flatten()
            .map(|symbol| Frame {
                name: symbol.name(),
                system_name: symbol.sys_name().into_owned(),
                file: symbol.filename().into_owned(),
                line: i64::from(symbol.lineno()),
            })
            .collect(),
        count: i64::try_from(*count).unwrap_or(i64::MAX),
    });
    let encoded = encode(
        stacks,
        report.timing.start_time,
        report.timing.duration,
        report.timing.frequency,
    );
    gzip(&encoded).map_err(CpuProfileError::Compress)
}

fn gzip(bytes: &[u8]) -> Result<Vec<u8>, std::io::Error> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(bytes)?;
    encoder.finish()
}

/// One sampled stack, innermost frame first, and how often it was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stack {
    pub thread: String,
    pub frames: Vec<Frame>,
    pub count: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Demangled.
    pub name: String,
    pub system_name: String,
    pub file: String,
    pub line: i64,
}

/// `profile.proto` (github.com/google/pprof), the fields written here.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
}

/// Builds the tables of a profile: strings, functions and locations each once.
#[derive(Default)]
struct Tables {
    profile: Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(String, String), u64>,
    locations: HashMap<(u64, i64), u64>,
}

impl Tables {
    fn string(&mut self, text: &str) -> i64 {
        if let Some(index) = self.strings.get(text) {
            return *index;
        }
        let index = i64::try_from(self.profile.string_table.len()).unwrap_or(i64::MAX);
        self.profile.string_table.push(text.to_owned());
        self.strings.insert(text.to_owned(), index);
        index
    }

    fn location(&mut self, frame: &Frame) -> u64 {
        let function_key = (frame.name.clone(), frame.file.clone());
        let function_id = match self.functions.get(&function_key) {
            Some(id) => *id,
            None => {
                let function = Function {
                    id: self.profile.function.len() as u64 + 1,
                    name: self.string(&frame.name),
                    system_name: self.string(&frame.system_name),
                    filename: self.string(&frame.file),
                };
                self.functions.insert(function_key, function.id);
                self.profile.function.push(function.clone());
                function.id
            }
        };
        *self
            .locations
            .entry((function_id, frame.line))
            .or_insert_with(|| {
                let id = self.profile.location.len() as u64 + 1;
                self.profile.location.push(Location {
                    id,
                    line: vec![Line {
                        function_id,
                        line: frame.line,
                    }],
                });
                id
            })
    }
}

/// The `profile.proto` bytes of `stacks`, sampled at `frequency` Hz: values "samples/count"
/// and "cpu/nanoseconds" (Go's), each sample labelled with its thread.
pub fn encode(
    stacks: impl IntoIterator<Item = Stack>,
    start: SystemTime,
    duration: Duration,
    frequency: i32,
) -> Vec<u8> {
    let mut tables = Tables::default();
    // The string table starts with "".
    tables.string("");
    let period = 1_000_000_000 / i64::from(frequency.max(1));
    let samples = ValueType {
        r#type: tables.string("samples"),
        unit: tables.string("count"),
    };
    let cpu = ValueType {
        r#type: tables.string("cpu"),
        unit: tables.string("nanoseconds"),
    };
    let thread = tables.string("thread");
    for stack in stacks {
        let location_id = stack.frames.iter().map(|f| tables.location(f)).collect();
        let label = vec![Label {
            key: thread,
            str: tables.string(&stack.thread),
        }];
        tables.profile.sample.push(Sample {
            location_id,
            value: vec![stack.count, stack.count.saturating_mul(period)],
            label,
        });
    }
    let mut profile = tables.profile;
    profile.sample_type = vec![samples, cpu.clone()];
    profile.period_type = Some(cpu);
    profile.period = period;
    profile.time_nanos = start
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    profile.duration_nanos = i64::try_from(duration.as_nanos()).unwrap_or(i64::MAX);
    profile.encode_to_vec()
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use flate2::read::GzDecoder;

    use super::*;

    fn frame(name: &str, line: i64) -> Frame {
        Frame {
            name: name.to_owned(),
            system_name: format!("_ZN{name}"),
            file: "src/main.rs".to_owned(),
            line,
        }
    }

    #[test]
    fn stacks_share_functions_locations_and_strings() {
        let stacks = [
            Stack {
                thread: "tokio-runtime-worker".into(),
                frames: vec![frame("encode", 10), frame("main", 3)],
                count: 4,
            },
            Stack {
                thread: "tokio-runtime-worker".into(),
                frames: vec![frame("encode", 12), frame("main", 3)],
                count: 1,
            },
        ];
        let start = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let bytes = encode(stacks, start, Duration::from_secs(2), 100);
        let profile = Profile::decode(bytes.as_slice()).expect("a profile");
        let text = |i: i64| profile.string_table[usize::try_from(i).expect("index")].as_str();
        assert_eq!(profile.string_table[0], "");
        let types: Vec<(&str, &str)> = profile
            .sample_type
            .iter()
            .map(|t| (text(t.r#type), text(t.unit)))
            .collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
        assert_eq!(profile.period, 10_000_000);
        assert_eq!(profile.duration_nanos, 2_000_000_000);
        assert_eq!(profile.time_nanos, 1_800_000_000_000_000_000);
        assert_eq!(profile.function.len(), 2, "encode and main");
        assert_eq!(profile.location.len(), 3, "encode:10, encode:12, main:3");
        let values: Vec<&[i64]> = profile.sample.iter().map(|s| s.value.as_slice()).collect();
        assert_eq!(values, [[4, 40_000_000], [1, 10_000_000]]);
        let first = &profile.sample[0];
        assert_eq!(first.location_id.len(), 2);
        let innermost = &profile.location[usize::try_from(first.location_id[0] - 1).unwrap()];
        let function =
            &profile.function[usize::try_from(innermost.line[0].function_id - 1).unwrap()];
        assert_eq!(text(function.name), "encode");
        assert_eq!(text(first.label[0].key), "thread");
        assert_eq!(text(first.label[0].str), "tokio-runtime-worker");
    }

    #[test]
    fn a_real_profile_is_gzipped_protobuf() {
        // Busy until the profile is taken (starting the profiler may take a while: it
        // resolves one backtrace first).
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let busy = std::thread::spawn({
            let stop = std::sync::Arc::clone(&stop);
            move || {
                let mut x = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                }
                x
            }
        });
        let gzipped = profile(Duration::from_millis(300));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        busy.join().expect("busy thread");
        let gzipped = gzipped.expect("profile");
        let mut bytes = Vec::new();
        GzDecoder::new(gzipped.as_slice())
            .read_to_end(&mut bytes)
            .expect("gzip");
        let profile = Profile::decode(bytes.as_slice()).expect("protobuf");
        assert_eq!(profile.period, 10_000_000);
        assert!(!profile.sample.is_empty(), "a busy thread was sampled");
        // Stacks reach past the signal handler into the sampled code.
        assert!(
            profile.sample.iter().any(|s| s.location_id.len() > 3),
            "{:?}",
            profile.sample
        );
    }
}
