//! Loop devices for block volumes on a node. A block volume's data is a sparse file, but a
//! container runtime maps only device nodes into a pod (containerd refuses a regular file as a
//! device), so NodePublishVolume binds a loop device backed by that file onto the target.
//!
//! One loop device per volume file: a second publication of the same volume reuses the device
//! already backed by the file (found through `/sys/block/loop*/loop/backing_file`), and the
//! last unpublication detaches it. Detaching a device something still holds open (the kubelet
//! keeps its own loop device on top while a pod uses the volume) only marks it to go away on
//! its last close: the kernel's LOOP_CLR_FD sets autoclear then.
//!
//! The device nodes are `/dev/loopN`: in a container this needs the host's /dev (a hostPath
//! mount, deploy/base/node-plugin.yaml), where devtmpfs shows a device as soon as it exists.

use std::ffi::c_void;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use rustix::io::Errno;
use rustix::ioctl::{Ioctl, IoctlOutput, Opcode};

/// From linux/loop.h.
const LOOP_SET_FD: Opcode = 0x4C00;
const LOOP_CLR_FD: Opcode = 0x4C01;
const LOOP_CTL_GET_FREE: Opcode = 0x4C82;

const LOOP_CONTROL: &str = "/dev/loop-control";
const SYS_BLOCK: &str = "/sys/block";
/// Another process may take the free device between our two calls; then we ask again.
const ATTACH_ATTEMPTS: usize = 16;

/// The loop device backed by `file`: the one already attached, else a free one attached now.
pub fn attach(file: &Path) -> io::Result<PathBuf> {
    let file = fs::canonicalize(file)?;
    if let Some(n) = backing(&file)?.first() {
        return Ok(device_path(*n));
    }
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .open(LOOP_CONTROL)
        .map_err(|e| annotate(e, LOOP_CONTROL))?;
    let backing_file = OpenOptions::new().read(true).write(true).open(&file)?;
    for _ in 0..ATTACH_ATTEMPTS {
        let n = loop_ioctl(&control, LOOP_CTL_GET_FREE, 0)?;
        let path = device_path(u32::try_from(n).map_err(|_| Errno::RANGE)?);
        let device = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| annotate(e, &path.display().to_string()))?;
        let fd = usize::try_from(backing_file.as_raw_fd()).map_err(|_| Errno::BADF)?;
        match loop_ioctl(&device, LOOP_SET_FD, fd) {
            Ok(_) => return Ok(path),
            Err(e) if e.raw_os_error() == Some(Errno::BUSY.raw_os_error()) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other(format!(
        "no free loop device for {} after {ATTACH_ATTEMPTS} attempts",
        file.display()
    )))
}

/// Detaches every loop device backed by `file` (at once, or on its last close while something
/// still holds it open). A file no device backs is fine.
pub fn detach(file: &Path) -> io::Result<()> {
    let file = match fs::canonicalize(file) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for n in backing(&file)? {
        let path = device_path(n);
        let device = match File::open(&path) {
            Ok(device) => device,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(annotate(e, &path.display().to_string())),
        };
        match loop_ioctl(&device, LOOP_CLR_FD, 0) {
            // ENXIO: it was detached in between.
            Err(e) if e.raw_os_error() != Some(Errno::NXIO.raw_os_error()) => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// The loop devices backed by `file` (none when it does not exist).
pub fn devices(file: &Path) -> io::Result<Vec<PathBuf>> {
    match fs::canonicalize(file) {
        Ok(file) => Ok(backing(&file)?.into_iter().map(device_path).collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

fn device_path(n: u32) -> PathBuf {
    PathBuf::from(format!("/dev/loop{n}"))
}

/// N of `loopN` at the end of a name or path.
fn loop_number(name: &str) -> Option<u32> {
    name.rsplit('/').next()?.strip_prefix("loop")?.parse().ok()
}

/// The numbers of the loop devices whose backing file is `file` (canonical).
fn backing(file: &Path) -> io::Result<Vec<u32>> {
    let mut found = Vec::new();
    let entries = match fs::read_dir(SYS_BLOCK) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(found),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let name = entry?.file_name();
        let Some(n) = name.to_str().and_then(loop_number) else {
            continue;
        };
        // Only a bound device has loop/backing_file.
        let Ok(shown) =
            fs::read_to_string(Path::new(SYS_BLOCK).join(&name).join("loop/backing_file"))
        else {
            continue;
        };
        if same_file(&shown, file) {
            found.push(n);
        }
    }
    found.sort_unstable();
    Ok(found)
}

/// sysfs shows the path as the attaching process saw it, with " (deleted)" once it is removed.
fn same_file(shown: &str, file: &Path) -> bool {
    let shown = shown.trim_end_matches('\n');
    let shown = shown.strip_suffix(" (deleted)").unwrap_or(shown);
    Path::new(shown) == file
}

fn annotate(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// An ioctl of the loop driver whose argument is an integer (or none) and whose result is the
/// call's return value.
struct LoopIoctl {
    opcode: Opcode,
    arg: usize,
}

// SAFETY: the loop ioctls used here (LOOP_SET_FD, LOOP_CLR_FD, LOOP_CTL_GET_FREE) take an
// integer argument passed in place of a pointer, read and write no userspace memory, and return
// their result as the call's value; the opcode identifies each.
#[allow(unsafe_code)]
unsafe impl Ioctl for LoopIoctl {
    type Output = IoctlOutput;
    const IS_MUTATING: bool = false;

    fn opcode(&self) -> Opcode {
        self.opcode
    }

    fn as_ptr(&mut self) -> *mut c_void {
        std::ptr::without_provenance_mut(self.arg)
    }

    unsafe fn output_from_ptr(out: IoctlOutput, _: *mut c_void) -> rustix::io::Result<IoctlOutput> {
        Ok(out)
    }
}

/// Loop ioctls are not in rustix's safe API; `LoopIoctl` describes them for its generic ioctl.
#[allow(unsafe_code)]
fn loop_ioctl(fd: &File, opcode: Opcode, arg: usize) -> io::Result<IoctlOutput> {
    // SAFETY: `LoopIoctl` upholds `Ioctl`'s contract for these opcodes (see its impl), and `fd`
    // is an open loop device or /dev/loop-control.
    unsafe { rustix::ioctl::ioctl(fd, LoopIoctl { opcode, arg }) }.map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loop_numbers_come_from_names_and_paths() {
        assert_eq!(loop_number("loop3"), Some(3));
        assert_eq!(loop_number("/dev/loop12"), Some(12));
        assert_eq!(loop_number("/loop0"), Some(0));
        assert_eq!(loop_number("loop-control"), None);
        assert_eq!(loop_number("sda1"), None);
    }

    #[test]
    fn a_backing_file_matches_with_or_without_the_deleted_mark() {
        let file = Path::new("/var/lib/x/vol.block");
        assert!(same_file("/var/lib/x/vol.block\n", file));
        assert!(same_file("/var/lib/x/vol.block (deleted)\n", file));
        assert!(!same_file("/var/lib/x/vol2.block\n", file));
    }
}
