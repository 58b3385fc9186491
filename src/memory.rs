//! Allocator tuning of the glibc build.
//!
//! glibc raises its mmap threshold each time a block above it is freed (up to 32 MiB), so
//! after the first list response is freed (18 MiB of JSON for 10,000 PVs) the next ones of
//! that size come from the heap, and most of what they leave behind when freed stays in the
//! process: 11 MiB of the steady RSS with 10,000 claims and 10,000 PVs (docs/benchmarks.md,
//! (d)). Pinning the threshold at glibc's starting value keeps every block above 128 KiB in
//! a mapping of its own, returned when freed. musl's allocator (the static build of the
//! image) already does so. An operator's own `MALLOC_MMAP_THRESHOLD_` is left in charge.

const OPERATOR_SETTING: &str = "MALLOC_MMAP_THRESHOLD_";
const MMAP_THRESHOLD: i32 = 128 * 1024;

/// Call before any other thread starts.
pub fn return_large_blocks_to_the_os() {
    if std::env::var_os(OPERATOR_SETTING).is_none() {
        pin_mmap_threshold(MMAP_THRESHOLD);
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn pin_mmap_threshold(bytes: i32) {
    // SAFETY: mallopt only sets a parameter of glibc's allocator; it takes no pointers, and
    // is called before any other thread exists, so no allocation runs concurrently.
    let accepted = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, bytes) };
    if accepted != 1 {
        eprintln!("csi-provisioner: glibc refused M_MMAP_THRESHOLD={bytes}; continuing");
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn pin_mmap_threshold(_bytes: i32) {}
