//! `process_*`: what Go's process collector exposes on Linux, read from `/proc/self` at each
//! scrape, with its names, types and help texts (`process_start_time_seconds` is a gauge of
//! the registry, set once at start).
//!
//! Not exposed: Go's `process_network_{receive,transmit}_bytes_total` (newer client_golang
//! only; the pod's network figures are the kubelet's) and every `go_*` metric (the Go
//! runtime's: goroutines, GC, memstats), which have no Rust counterpart.

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

/// Clock ticks per second of `/proc/<pid>/stat`: the kernel's USER_HZ, 100 on every Linux
/// ABI (Go's procfs uses the same constant).
const USER_HZ: f64 = 100.0;

/// Go's value for an unlimited resource limit: the largest uint64.
const UNLIMITED: f64 = u64::MAX as f64;

/// The process figures, as Go's collector reads them.
#[derive(Debug, Clone, Default, PartialEq)]
struct ProcessFigures {
    cpu_seconds: Option<f64>,
    resident_bytes: Option<f64>,
    virtual_bytes: Option<f64>,
    open_fds: Option<f64>,
    max_fds: Option<f64>,
    virtual_max_bytes: Option<f64>,
}

impl ProcessFigures {
    /// Reads `/proc/self`; a figure that cannot be read is left out, as Go's collector does.
    fn read() -> Self {
        let proc = |file: &str| std::fs::read_to_string(format!("/proc/self/{file}")).ok();
        let status = proc("status");
        let limits = proc("limits");
        let kib = |key: &str| status.as_deref().and_then(|s| status_kib(s, key));
        let limit = |key: &str| limits.as_deref().and_then(|l| soft_limit(l, key));
        ProcessFigures {
            cpu_seconds: proc("stat").as_deref().and_then(cpu_seconds),
            resident_bytes: kib("VmRSS:"),
            virtual_bytes: kib("VmSize:"),
            open_fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|entries| entries.count() as f64),
            max_fds: limit("Max open files"),
            virtual_max_bytes: limit("Max address space"),
        }
    }
}

/// utime + stime (fields 14 and 15 of `stat`, counted after the command name, which may hold
/// spaces and parentheses) in seconds.
fn cpu_seconds(stat: &str) -> Option<f64> {
    let (_, after_command) = stat.rsplit_once(')')?;
    // Fields from the 3rd (state) on; utime is the 14th.
    let mut fields = after_command.split_whitespace().skip(11);
    let utime: f64 = fields.next()?.parse().ok()?;
    let stime: f64 = fields.next()?.parse().ok()?;
    Some((utime + stime) / USER_HZ)
}

/// A `status` line such as `VmRSS:     1234 kB`, in bytes.
fn status_kib(status: &str, key: &str) -> Option<f64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kib: f64 = line[key.len()..].split_whitespace().next()?.parse().ok()?;
    Some(kib * 1024.0)
}

/// The soft value of a `limits` row (`Max open files  1024  4096  files`).
fn soft_limit(limits: &str, key: &str) -> Option<f64> {
    let line = limits.lines().find(|l| l.starts_with(key))?;
    match line[key.len()..].split_whitespace().next()? {
        "unlimited" => Some(UNLIMITED),
        value => value.parse().ok(),
    }
}

/// Registers `process_start_time_seconds`, set to now (so call this once, early), and the
/// collector of the other `process_*`. Nothing to keep: the start time never changes and the
/// collector reads `/proc/self` by itself, so this returns no metrics struct.
pub(super) fn register(registry: &mut Registry) {
    let process_start_time = Gauge::<f64, AtomicU64>::default();
    process_start_time.set(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64(),
    );
    registry.register(
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds",
        process_start_time,
    );
    registry.register_collector(Box::new(ProcessCollector));
}

/// Registered with the registry; reads the figures at each scrape.
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let figures = ProcessFigures::read();
        if let Some(seconds) = figures.cpu_seconds {
            let counter = ConstCounter::new(seconds);
            counter.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                None,
                counter.metric_type(),
            )?)?;
        }
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                figures.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                figures.virtual_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                figures.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors.",
                figures.max_fds,
            ),
            (
                "process_virtual_memory_max_bytes",
                "Maximum amount of virtual memory available in bytes.",
                figures.virtual_max_bytes,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(value) = value {
                let gauge = ConstGauge::new(value);
                gauge.encode(encoder.encode_descriptor(
                    name,
                    help,
                    None,
                    gauge.metric_type(),
                )?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_past_a_command_with_spaces_and_parentheses() {
        let stat = "4242 (csi (prov) x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 130 0 0 20 0 9 0 12345 104857600 2560 18446744073709551615";
        assert_eq!(cpu_seconds(stat), Some(3.8));
        assert_eq!(cpu_seconds("garbage"), None);
    }

    #[test]
    fn status_and_limits_are_read_as_go_reads_them() {
        let status = "Name:\tcsi-provisioner\nVmSize:\t  204800 kB\nVmRSS:\t   10240 kB\n";
        assert_eq!(status_kib(status, "VmRSS:"), Some(10_485_760.0));
        assert_eq!(status_kib(status, "VmSize:"), Some(209_715_200.0));
        assert_eq!(status_kib(status, "VmSwap:"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max open files            1024                 524288               files     \n\
                      Max address space         unlimited            unlimited            bytes     \n";
        assert_eq!(soft_limit(limits, "Max open files"), Some(1024.0));
        assert_eq!(
            soft_limit(limits, "Max address space"),
            Some(18_446_744_073_709_551_615.0)
        );
    }

    #[test]
    fn this_process_has_every_figure() {
        let figures = ProcessFigures::read();
        assert!(figures.cpu_seconds.is_some_and(|s| s >= 0.0), "{figures:?}");
        assert!(
            figures.resident_bytes.is_some_and(|b| b > 0.0),
            "{figures:?}"
        );
        assert!(
            figures.virtual_bytes >= figures.resident_bytes,
            "{figures:?}"
        );
        assert!(figures.open_fds.is_some_and(|n| n >= 3.0), "{figures:?}");
        assert!(figures.max_fds >= figures.open_fds, "{figures:?}");
        assert!(figures.virtual_max_bytes.is_some(), "{figures:?}");
    }
}
