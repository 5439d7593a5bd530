//! Translations between FUSE and Cairn: errors, file kinds and attributes, times, lock
//! ranges and types, and the replies built from them.

use crate::BLOCK;
use cairn::{At, Fs, LockType, Metadata};
use fuser::{FileAttr, FileType, ReplyEmpty, ReplyXattr, TimeOrNow};
use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::time::SystemTime;

/// The errno of a Cairn error.
pub(super) fn errno(e: &io::Error) -> i32 {
    match cairn_area::errno_of(e) {
        0 => libc::EIO,
        n => n,
    }
}

pub(super) fn kind_of(t: cairn::FileType) -> FileType {
    if t.is_dir() {
        FileType::Directory
    } else if t.is_symlink() {
        FileType::Symlink
    } else if t.is_fifo() {
        FileType::NamedPipe
    } else if t.is_socket() {
        FileType::Socket
    } else if t.is_char_device() {
        FileType::CharDevice
    } else if t.is_block_device() {
        FileType::BlockDevice
    } else {
        FileType::RegularFile
    }
}

pub(super) fn attr_of(m: &Metadata) -> FileAttr {
    FileAttr {
        ino: m.ino(),
        size: m.len(),
        blocks: m.blocks(),
        atime: m.accessed(),
        mtime: m.modified(),
        ctime: m.changed(),
        crtime: m.created(),
        kind: kind_of(m.file_type()),
        perm: (m.mode() & 0o7777) as u16,
        nlink: m.nlink().min(u32::MAX as u64) as u32,
        uid: m.uid(),
        gid: m.gid(),
        // Device numbers fit 32 bits (12-bit major, 20-bit minor), where the kernel's
        // encoding and glibc's agree.
        rdev: m.rdev() as u32,
        blksize: BLOCK,
        flags: 0,
    }
}

/// Clear what a write or truncate by an unprivileged process with group `gid` clears
/// (`cairn_format::perm::privs_killed`; the writer's supplementary groups are not known
/// here). The kernel leaves it to the file system.
pub(super) fn kill_suidgid(fs: &Fs, ino: u64, gid: u32) -> io::Result<()> {
    let m = fs.metadata(At::inode(ino))?;
    let mode = m.mode() & 0o7777;
    let kill = cairn_format::perm::privs_killed(mode, m.gid() == gid);
    if kill != 0 {
        fs.set_permissions(At::inode(ino), cairn::Permissions::from_mode(mode & !kill))?;
    }
    Ok(())
}

pub(super) fn name_at(parent: u64, name: &OsStr) -> At<'_> {
    At {
        dir: parent,
        path: Path::new(name),
    }
}

pub(super) fn time_of(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

/// The effective uid of this process.
pub(super) fn euid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    // /proc/self is owned by the process's effective uid.
    std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid())
}

/// A FUSE lock range (`end` inclusive, `OFFSET_MAX`: to the end) as start and length
/// (0: to the end).
pub(super) fn lock_range(start: u64, end: u64) -> (u64, u64) {
    if end >= i64::MAX as u64 {
        (start, 0)
    } else {
        (start, end.saturating_sub(start) + 1)
    }
}

/// Answer a request that returns nothing: `Ok`, or the error's errno.
pub(super) fn reply_empty(reply: ReplyEmpty, r: io::Result<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

/// Answer a lock request with what `take` returns: at once, or (`wait`: it may block)
/// from a thread of its own, so that a waiter does not hold up the other requests.
pub(super) fn answer_lock(
    wait: bool,
    reply: ReplyEmpty,
    take: impl FnOnce() -> io::Result<()> + Send + 'static,
) {
    let answer = move || reply_empty(reply, take());
    if wait {
        std::thread::spawn(answer);
    } else {
        answer();
    }
}

/// Answer `getxattr`/`listxattr`: the size for a size query (`size` 0), else the bytes,
/// or `ERANGE` if they do not fit.
pub(super) fn xattr_reply(v: &[u8], size: u32, reply: ReplyXattr) {
    if size == 0 {
        reply.size(v.len() as u32);
    } else if v.len() > size as usize {
        reply.error(libc::ERANGE);
    } else {
        reply.data(v);
    }
}

pub(super) fn lock_type(typ: i32) -> Option<LockType> {
    match typ {
        libc::F_RDLCK => Some(LockType::Read),
        libc::F_WRLCK => Some(LockType::Write),
        _ => None,
    }
}
