//! Loop devices for block volumes on a node. A block volume's data is a sparse file, but a
//! container runtime maps only device nodes into a pod (containerd refuses a regular file as a
//! device), so NodePublishVolume binds a loop device backed by that file onto the target.
//!
//! A device is matched to its file by the backing file's device and inode (LOOP_GET_STATUS64),
//! never by path: sysfs shows the path as seen from the reader's root, which differs between
//! the container that attached a device and the next one, and a path may be reused by a newer
//! file. One read-write and one read-only device per volume file at most: a second publication
//! in the same mode reuses the device already backed by the file, a read-only publication gets
//! a device attached from a read-only descriptor (so the kernel refuses writes through it), and
//! the last unpublication detaches them all. Detaching a device something still holds open (the
//! kubelet keeps its own loop device on top while a pod uses the volume) only marks it to go
//! away on its last close (the kernel's LOOP_CLR_FD sets autoclear then); a device so marked is
//! never reused.
//!
//! The device nodes are `/dev/loopN`: in a container this needs the host's /dev (a hostPath
//! mount, deploy/base/node-plugin.yaml), where devtmpfs shows a device as soon as it exists.

use std::ffi::c_void;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::io::Errno;
use rustix::ioctl::{Getter, Ioctl, IoctlOutput, Opcode};

/// From linux/loop.h.
const LOOP_SET_FD: Opcode = 0x4C00;
const LOOP_CLR_FD: Opcode = 0x4C01;
const LOOP_GET_STATUS64: Opcode = 0x4C05;
const LOOP_CTL_GET_FREE: Opcode = 0x4C82;
const LO_FLAGS_READ_ONLY: u32 = 1;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

const LOOP_CONTROL: &str = "/dev/loop-control";
const SYS_BLOCK: &str = "/sys/block";
/// Another process may take the free device between our two calls; then we ask again.
const ATTACH_ATTEMPTS: usize = 16;

/// `struct loop_info64` of linux/loop.h, as LOOP_GET_STATUS64 fills it (the whole layout; only
/// the backing file's identity and the flags are read).
#[repr(C)]
#[allow(dead_code)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

/// A bound loop device and what backs it.
struct Bound {
    number: u32,
    device: u64,
    inode: u64,
    flags: u32,
}

/// The loop device showing `file`, read-only if asked: the one already attached in that mode
/// (and not being detached), else a free one attached now.
pub fn attach(file: &Path, readonly: bool) -> io::Result<PathBuf> {
    let backing_file = OpenOptions::new().read(true).write(!readonly).open(file)?;
    let key = identity(&backing_file)?;
    let wanted_flags = if readonly { LO_FLAGS_READ_ONLY } else { 0 };
    if let Some(bound) = bound_devices()?.into_iter().find(|b| {
        (b.device, b.inode) == key
            && b.flags & LO_FLAGS_AUTOCLEAR == 0
            && b.flags & LO_FLAGS_READ_ONLY == wanted_flags
    }) {
        return Ok(device_path(bound.number));
    }
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .open(LOOP_CONTROL)
        .map_err(|e| annotate(e, LOOP_CONTROL))?;
    let fd = usize::try_from(backing_file.as_raw_fd()).map_err(|_| Errno::BADF)?;
    for _ in 0..ATTACH_ATTEMPTS {
        let n = loop_ioctl(&control, LOOP_CTL_GET_FREE, 0)?;
        let path = device_path(u32::try_from(n).map_err(|_| Errno::RANGE)?);
        let device = OpenOptions::new()
            .read(true)
            .write(!readonly)
            .open(&path)
            .map_err(|e| annotate(e, &path.display().to_string()))?;
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
/// still holds it open). A missing file, or one no device backs, is fine.
pub fn detach(file: &Path) -> io::Result<()> {
    for path in devices(file)? {
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
    let key = match File::open(file) {
        Ok(f) => identity(&f)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(bound_devices()?
        .into_iter()
        .filter(|b| (b.device, b.inode) == key)
        .map(|b| device_path(b.number))
        .collect())
}

fn device_path(n: u32) -> PathBuf {
    PathBuf::from(format!("/dev/loop{n}"))
}

/// N of `loopN`.
fn loop_number(name: &str) -> Option<u32> {
    name.strip_prefix("loop")?.parse().ok()
}

/// The backing file's device, in the kernel's `new_encode_dev` form LOOP_GET_STATUS64 reports
/// (`huge_encode_dev`), and its inode.
fn identity(file: &File) -> io::Result<(u64, u64)> {
    let meta = file.metadata()?;
    let dev = meta.dev();
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    let encoded =
        u64::from(minor & 0xff) | (u64::from(major) << 8) | (u64::from(minor & !0xff) << 12);
    Ok((encoded, meta.ino()))
}

/// Every bound loop device (those with `/sys/block/loopN/loop`), with what backs it.
fn bound_devices() -> io::Result<Vec<Bound>> {
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
        if !Path::new(SYS_BLOCK).join(&name).join("loop").exists() {
            continue;
        }
        let Ok(device) = File::open(device_path(n)) else {
            continue; // no node for it here
        };
        match status(&device) {
            Ok(info) => found.push(Bound {
                number: n,
                device: info.device,
                inode: info.inode,
                flags: info.flags,
            }),
            // Detached in between.
            Err(e) if e.raw_os_error() == Some(Errno::NXIO.raw_os_error()) => {}
            Err(e) => return Err(annotate(e, &device_path(n).display().to_string())),
        }
    }
    found.sort_unstable_by_key(|b| b.number);
    Ok(found)
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

// SAFETY: the loop ioctls used with it (LOOP_SET_FD, LOOP_CLR_FD, LOOP_CTL_GET_FREE) take an
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

/// LOOP_GET_STATUS64 of a loop device.
#[allow(unsafe_code)]
fn status(device: &File) -> io::Result<LoopInfo64> {
    // SAFETY: LOOP_GET_STATUS64 writes exactly one `struct loop_info64` (`LoopInfo64`, the same
    // layout, plain integers) through its pointer argument, which `Getter` provides and reads
    // back only after the call succeeded; `device` is an open loop device.
    unsafe { rustix::ioctl::ioctl(device, Getter::<LOOP_GET_STATUS64, LoopInfo64>::new()) }
        .map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loop_numbers_come_from_device_names() {
        assert_eq!(loop_number("loop3"), Some(3));
        assert_eq!(loop_number("loop12"), Some(12));
        assert_eq!(loop_number("loop-control"), None);
        assert_eq!(loop_number("sda1"), None);
    }

    #[test]
    fn loop_info64_has_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
        assert_eq!(std::mem::offset_of!(LoopInfo64, flags), 52);
        assert_eq!(std::mem::offset_of!(LoopInfo64, file_name), 56);
        assert_eq!(std::mem::offset_of!(LoopInfo64, init), 216);
    }
}
