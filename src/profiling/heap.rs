//! Heap statistics for `/debug/pprof/heap`, as text: the allocator's own figures (glibc's
//! `mallinfo2`, in the glibc build) and the kernel's (`/proc/self/status`). Go's heap profile
//! (allocation sites, sampled by its runtime) has no counterpart without an allocation-tracking
//! allocator, which would cost every allocation.

use std::fmt::Write;

/// The lines of `/proc/self/status` about memory.
const STATUS_KEYS: [&str; 8] = [
    "VmPeak:", "VmSize:", "VmHWM:", "VmRSS:", "RssAnon:", "RssFile:", "VmData:", "VmSwap:",
];

/// The statistics page.
pub fn statistics() -> String {
    let mut page = String::from("# heap statistics of csi-provisioner (not a pprof profile)\n");
    for (name, bytes) in allocator() {
        let _ = writeln!(page, "# malloc {name} = {bytes}");
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    for line in memory_lines(&status) {
        let _ = writeln!(page, "# {line}");
    }
    page
}

fn memory_lines(status: &str) -> impl Iterator<Item = String> + '_ {
    status
        .lines()
        .filter(|line| STATUS_KEYS.iter().any(|key| line.starts_with(key)))
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// glibc's figures, in bytes.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn allocator() -> Vec<(&'static str, usize)> {
    // SAFETY: mallinfo2 takes no arguments and returns a struct by value; it only reads the
    // allocator's statistics under the allocator's own locks (glibc ≥ 2.33).
    let info = unsafe { libc::mallinfo2() };
    vec![
        ("arena (heap bytes from brk)", info.arena),
        ("hblkhd (bytes in mmap'd blocks)", info.hblkhd),
        ("uordblks (bytes in use)", info.uordblks),
        ("fordblks (free bytes kept)", info.fordblks),
        ("keepcost (releasable top bytes)", info.keepcost),
    ]
}

/// musl (the static image) keeps no such statistics.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn allocator() -> Vec<(&'static str, usize)> {
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_memory_lines_of_status_are_kept() {
        let status =
            "Name:\tcsi\nVmPeak:\t  300 kB\nVmRSS:\t   20 kB\nThreads:\t9\nRssAnon:\t  12 kB\n";
        let lines: Vec<String> = memory_lines(status).collect();
        assert_eq!(lines, ["VmPeak: 300 kB", "VmRSS: 20 kB", "RssAnon: 12 kB"]);
    }

    #[test]
    fn the_page_has_the_kernels_and_the_allocators_figures() {
        let page = statistics();
        assert!(page.contains("# VmRSS: "), "{page}");
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            assert!(
                page.contains("# malloc uordblks (bytes in use) = "),
                "{page}"
            );
        }
    }
}
