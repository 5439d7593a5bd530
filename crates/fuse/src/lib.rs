//! The FUSE mount of a Cairn store (`cairn mount`, ARCHITECTURE.md "FUSE mount"): one
//! Cairn client that serves the kernel's FUSE requests, so that every program can use
//! the store. FUSE inode numbers are Cairn's (the root is 1 in both); names resolve with
//! `cairn::At` relative to the parent's inode, and calls on an inode use `At::inode`.
//!
//! Permissions are checked by the kernel (`default_permissions`) against the attributes
//! returned here; the mount's own client runs with its credentials (normally root) and
//! gives new files to the calling user. The kernel caches attributes and names, and
//! drops them when the mount's client loses its lease on the inode or directory (another
//! client is about to change it): see [`serve`] and ARCHITECTURE.md, "FUSE mount".

#![forbid(unsafe_code)]

use cairn::{At, FlockOp, Fs, LockKind, LockType, OpenOptions};
use fuser::{
    FileType, Filesystem, KernelConfig, MountOption, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLock, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

mod convert;
mod mirror;
mod state;

use convert::{
    answer_lock, attr_of, errno, euid, kill_suidgid, kind_of, lock_range, lock_type, name_at,
    reply_empty, xattr_reply,
};
pub use state::Caching;
use state::{lock, Caller, Change, Inner, Listing, Names};

const BLOCK: u32 = 4096;

/// Init flag (FUSE 7.33): the file system clears setuid/setgid on writes the kernel marks.
const FUSE_HANDLE_KILLPRIV_V2: u32 = 1 << 28;

/// Write flag: this write must clear setuid/setgid (with `FUSE_HANDLE_KILLPRIV_V2`).
const FUSE_WRITE_KILL_SUIDGID: u32 = 1 << 2;

/// The FUSE file system over one Cairn client. Each request is handled and answered on
/// the session thread: handing each to another thread cost a wakeup (measured: `fstat`
/// through the mount 44 µs with a hand-off, 16 µs without). A lock request that waits
/// for another process is answered from a thread of its own ([`answer_lock`]); one that
/// waits for a lease another client holds holds up the mount meanwhile (at most the
/// store's lease timeout).
pub struct CairnFuse {
    inner: Arc<Inner>,
}

impl CairnFuse {
    /// Serve `fs` with this caching.
    pub fn new(fs: Fs, caching: Caching) -> CairnFuse {
        CairnFuse {
            inner: Arc::new(Inner {
                fs,
                caching,
                known: Arc::new(Mutex::new(HashMap::new())),
                names: Arc::new(Names::default()),
                lost: Arc::new(AtomicU64::new(0)),
                chown_new: euid() == 0,
                files: Mutex::new(HashMap::new()),
                dirs: Mutex::new(HashMap::new()),
                next_fh: AtomicU64::new(1),
                locks: Mutex::new(HashMap::new()),
                mirror: Mutex::new(mirror::Mirror::default()),
            }),
        }
    }
}

impl Filesystem for CairnFuse {
    fn forget(&mut self, _req: &Request<'_>, ino: u64, nlookup: u64) {
        let mut k = lock(&self.inner.known);
        if let Some(n) = k.get_mut(&ino) {
            *n = n.saturating_sub(nlookup);
            if *n == 0 {
                k.remove(&ino);
            }
        }
    }

    fn init(&mut self, _req: &Request<'_>, config: &mut KernelConfig) -> Result<(), i32> {
        // POSIX and BSD locks go to the daemon (shared with every client), not the kernel.
        // Listings carry each entry's attributes when the kernel finds it worth it.
        let _ = config.add_capabilities(
            fuser::consts::FUSE_POSIX_LOCKS
                | fuser::consts::FUSE_FLOCK_LOCKS
                | fuser::consts::FUSE_DO_READDIRPLUS
                | fuser::consts::FUSE_READDIRPLUS_AUTO,
        );
        // Setuid and setgid bits are cleared here on a write (`FUSE_WRITE_KILL_SUIDGID`),
        // so the kernel marks checked inodes and stops asking for `security.capability`
        // before every write (one round trip per write otherwise).
        let _ = config.add_capabilities(FUSE_HANDLE_KILLPRIV_V2);
        // A read checks the file's attributes first (free while they are cached) and
        // drops cached pages when its mtime or size changed: another client's writes
        // revoke the mount's lease, which drops the attributes.
        let _ = config.add_capabilities(fuser::consts::FUSE_AUTO_INVAL_DATA);
        Ok(())
    }

    fn getlk(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        lock_owner: u64,
        start: u64,
        end: u64,
        typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        let s = self.inner.clone();
        let Some(t) = lock_type(typ) else {
            return reply.error(libc::EINVAL);
        };
        // A lock taken through the mount, with its holder's pid; else the store's
        // answer (other clients' locks).
        let here = lock(&s.mirror).test(ino, lock_owner, t, start, end.min(mirror::OFFSET_MAX));
        let (start, len) = lock_range(start, end);
        let r = match here {
            Some(l) => Ok(Some(l)),
            None => s
                .lock_handle(ino, lock_owner)
                .and_then(|h| h.get_lock(LockKind::Ofd, t, start, len)),
        };
        match r {
            Ok(None) => reply.locked(0, 0, libc::F_UNLCK, 0),
            Ok(Some(l)) => {
                let end = if l.len == 0 {
                    i64::MAX as u64
                } else {
                    l.start + l.len - 1
                };
                let typ = match l.typ {
                    LockType::Read => libc::F_RDLCK,
                    LockType::Write => libc::F_WRLCK,
                };
                reply.locked(l.start, end, typ, l.pid.max(0) as u32);
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setlk(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        lock_owner: u64,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let s = self.inner.clone();
        let span = (start, end.min(mirror::OFFSET_MAX));
        let (start, len) = lock_range(start, end);
        let h = match s.lock_handle(ino, lock_owner) {
            Ok(h) => h,
            Err(e) => return reply.error(errno(&e)),
        };
        let t = lock_type(typ);
        let wait = sleep && t.is_some();
        answer_lock(wait, reply, move || {
            match t {
                None => h.unlock(LockKind::Ofd, start, len)?,
                Some(t) => h.lock(LockKind::Ofd, t, start, len, sleep)?,
            }
            // Granted by the store: recorded here too, with the holder's pid.
            lock(&s.mirror).set(ino, lock_owner, pid, t, span.0, span.1);
            Ok(())
        });
    }

    /// `flock(2)`: the lock of one open file (`lock_owner`), the same lock a shim or API
    /// client's `flock` takes, so BSD locks hold across every client of the store.
    fn flock(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        lock_owner: u64,
        typ: i32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let s = self.inner.clone();
        let op = match typ {
            libc::F_RDLCK => FlockOp::Shared,
            libc::F_WRLCK => FlockOp::Exclusive,
            libc::F_UNLCK => FlockOp::Unlock,
            _ => return reply.error(libc::EINVAL),
        };
        let h = match s.lock_handle(ino, lock_owner) {
            Ok(h) => h,
            Err(e) => return reply.error(errno(&e)),
        };
        answer_lock(sleep && op != FlockOp::Unlock, reply, move || {
            h.flock(op, !sleep)
        });
    }

    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let s = self.inner.clone();
        s.entry_or_negative(name_at(parent, name), reply, true);
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        let s = self.inner.clone();
        let e0 = s.epoch();
        match s.fs.symlink_metadata(At::inode(ino)) {
            Ok(m) => reply.attr(&s.caching_since(e0).attr, &attr_of(&m)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        let s = self.inner.clone();
        let c = Change {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
        };
        let e0 = s.epoch();
        // A truncate by an unprivileged process clears setuid/setgid as a write does
        // (fuser does not pass the kernel's `FATTR_KILL_SUIDGID`).
        let kill = size.is_some() && req.uid() != 0;
        let r = s.setattr_inner(ino, c, fh).and_then(|m| {
            if !kill {
                return Ok(m);
            }
            kill_suidgid(&s.fs, ino, req.gid())?;
            s.fs.symlink_metadata(At::inode(ino))
        });
        match r {
            Ok(m) => reply.attr(&s.caching_since(e0).attr, &attr_of(&m)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&mut self, _req: &Request<'_>, ino: u64, reply: ReplyData) {
        let s = self.inner.clone();
        match s.fs.read_link(At::inode(ino)) {
            Ok(t) => reply.data(t.as_os_str().as_bytes()),
            Err(e) => reply.error(errno(&e)),
        };
    }

    fn mknod(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let req = Caller(req.uid(), req.gid());
        let s = self.inner.clone();
        let at = name_at(parent, name);
        // The kernel checked CAP_MKNOD for device nodes.
        let r =
            s.fs.mknod(at, mode & (libc::S_IFMT | (0o7777 & !umask)), rdev as u64)
                .and_then(|_| s.own(req, parent, at, false));
        match r {
            Ok(()) => s.entry(at, reply),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mkdir(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let req = Caller(req.uid(), req.gid());
        let s = self.inner.clone();
        let at = name_at(parent, name);
        let r =
            s.fs.create_dir_mode(at, mode & !umask)
                .and_then(|()| s.own(req, parent, at, false));
        match r {
            Ok(()) => s.entry(at, reply),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn unlink(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let s = self.inner.clone();
        reply_empty(reply, s.fs.remove_file(name_at(parent, name)))
    }

    fn rmdir(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let s = self.inner.clone();
        reply_empty(reply, s.fs.remove_dir(name_at(parent, name)))
    }

    fn symlink(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let req = Caller(req.uid(), req.gid());
        let s = self.inner.clone();
        let at = name_at(parent, link_name);
        let r =
            s.fs.symlink(target, at)
                .and_then(|()| s.own(req, parent, at, true));
        match r {
            Ok(()) => s.entry(at, reply),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn rename(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: ReplyEmpty,
    ) {
        let s = self.inner.clone();
        let (from, to) = (name_at(parent, name), name_at(newparent, newname));
        let r = match flags {
            0 => s.fs.rename(from, to),
            libc::RENAME_NOREPLACE => s.fs.rename_noreplace(from, to),
            libc::RENAME_EXCHANGE => s.fs.rename_exchange(from, to),
            // RENAME_WHITEOUT (overlayfs) and unknown flags.
            _ => return reply.error(libc::EINVAL),
        };
        reply_empty(reply, r)
    }

    fn link(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        newparent: u64,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let s = self.inner.clone();
        let at = name_at(newparent, newname);
        match s.fs.hard_link(At::inode(ino), at) {
            Ok(()) => s.entry(at, reply),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        let s = self.inner.clone();
        let acc = flags & libc::O_ACCMODE;
        let r = OpenOptions::new()
            .read(acc != libc::O_WRONLY)
            .write(acc != libc::O_RDONLY && flags & libc::O_APPEND == 0)
            .append(flags & libc::O_APPEND != 0)
            .open(&s.fs, At::inode(ino));
        match r {
            Ok(f) => {
                let fh = s.fh();
                lock(&s.files).insert(fh, Arc::new(f));
                reply.opened(fh, 0);
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        let s = self.inner.clone();
        let Some(f) = s.file(fh) else {
            return reply.error(libc::EBADF);
        };
        let mut buf = vec![0u8; size as usize];
        let mut n = 0;
        while n < buf.len() {
            match f.read_at(&mut buf[n..], offset as u64 + n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) => return reply.error(errno(&e)),
            }
        }
        reply.data(&buf[..n]);
    }

    fn write(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        fh: u64,
        offset: i64,
        data: &[u8],
        write_flags: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        let s = self.inner.clone();
        let Some(f) = s.file(fh) else {
            return reply.error(libc::EBADF);
        };
        let gid = req.gid();
        let r = f.write_at(data, offset as u64).and_then(|n| {
            if write_flags & FUSE_WRITE_KILL_SUIDGID != 0 {
                kill_suidgid(&s.fs, ino, gid)?;
            }
            Ok(n)
        });
        match r {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, owner: u64, reply: ReplyEmpty) {
        let s = self.inner.clone();
        // Every write is durable when it returns; a close releases the owner's locks.
        s.drop_locks(ino, owner);
        reply.ok();
    }

    fn release(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        fh: u64,
        _flags: i32,
        lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let s = self.inner.clone();
        if let Some(o) = lock_owner {
            s.drop_locks(ino, o);
        }
        lock(&s.files).remove(&fh);
        reply.ok();
    }

    /// Every write the mount acknowledged is durable already (it was logged), and the
    /// kernel writes a file's dirty pages (a mapping's) as `write`s before it asks for
    /// `fsync`: answering `ENOSYS` once makes it stop asking, which saves SQLite three
    /// round trips per commit. (Stores other processes made through the `LD_PRELOAD`
    /// library into a map object of the file are written back by their own `msync`,
    /// `munmap`, `fsync` or exit, not by an `fsync` on the mount.)
    fn fsync(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _ds: bool, reply: ReplyEmpty) {
        reply.error(libc::ENOSYS);
    }

    fn opendir(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        let s = self.inner.clone();
        let listing = (|| -> io::Result<Listing> {
            let dotdot =
                s.fs.metadata(At {
                    dir: ino,
                    path: Path::new(".."),
                })?
                .ino();
            let mut entries = vec![
                (ino, FileType::Directory, b".".to_vec()),
                (dotdot, FileType::Directory, b"..".to_vec()),
            ];
            for e in s.fs.read_dir(At::inode(ino))? {
                let e = e?;
                let kind = kind_of(e.file_type()?);
                entries.push((e.ino(), kind, e.file_name().as_bytes().to_vec()));
            }
            Ok(Listing { entries })
        })();
        match listing {
            Ok(l) => {
                let fh = s.fh();
                lock(&s.dirs).insert(fh, Arc::new(l));
                reply.opened(fh, 0);
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        let s = self.inner.clone();
        let Some(l) = lock(&s.dirs).get(&fh).cloned() else {
            return reply.error(libc::EBADF);
        };
        for (i, (ino, kind, name)) in l.entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, i as i64 + 1, *kind, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok();
    }

    /// A listing with each entry's attributes (one lookup fewer per entry for `ls -l`
    /// when attributes may be cached, `--attr-timeout`). An entry removed since the
    /// listing was taken is left out.
    fn readdirplus(
        &mut self,
        _req: &Request<'_>,
        dir: u64,
        fh: u64,
        offset: i64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let s = self.inner.clone();
        let Some(l) = lock(&s.dirs).get(&fh).cloned() else {
            return reply.error(libc::EBADF);
        };
        let e0 = s.epoch();
        for (i, (ino, _, name)) in l.entries.iter().enumerate().skip(offset as usize) {
            let Ok(m) = s.fs.symlink_metadata(At::inode(*ino)) else {
                continue;
            };
            let name = OsStr::from_bytes(name);
            let c = &s.caching_since(e0);
            let attr = attr_of(&m);
            let dot = name == "." || name == "..";
            let entry_ttl = if dot {
                Duration::ZERO
            } else {
                s.entry_ttl(c, dir, Path::new(name))
            };
            if reply.add_ttls(*ino, i as i64 + 1, name, &entry_ttl, &c.attr, &attr, 0) {
                break;
            }
            // The kernel counts a lookup for every entry but `.` and `..`.
            if name != "." && name != ".." {
                s.looked_up(*ino);
            }
        }
        reply.ok();
    }

    fn releasedir(&mut self, _req: &Request<'_>, _ino: u64, fh: u64, _f: i32, reply: ReplyEmpty) {
        let s = self.inner.clone();
        lock(&s.dirs).remove(&fh);
        reply.ok();
    }

    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        let s = self.inner.clone();
        match s.fs.status() {
            Ok(s) => {
                let (cap, used) = s
                    .tiers
                    .iter()
                    .fold((0, 0), |a, t| (a.0 + t.capacity_bytes, a.1 + t.used_bytes));
                let blocks = cap / BLOCK as u64;
                let free = cap.saturating_sub(used) / BLOCK as u64;
                let files_free = s.inodes.capacity.saturating_sub(s.inodes.used);
                reply.statfs(
                    blocks,
                    free,
                    free,
                    s.inodes.capacity,
                    files_free,
                    BLOCK,
                    255,
                    BLOCK,
                );
            }
            Err(e) => reply.error(errno(&e)),
        };
    }

    fn getxattr(&mut self, _r: &Request<'_>, ino: u64, name: &OsStr, size: u32, reply: ReplyXattr) {
        let name = name.as_bytes();
        let s = self.inner.clone();
        match s.fs.get_xattr(At::inode(ino), name, true) {
            Ok(v) => xattr_reply(&v, size, reply),
            Err(e) => reply.error(errno(&e)),
        };
    }

    fn listxattr(&mut self, req: &Request<'_>, ino: u64, size: u32, reply: ReplyXattr) {
        // The mount's client is root: `trusted.` names are for root callers only.
        let root = req.uid() == 0;
        let s = self.inner.clone();
        match s.fs.list_xattr(At::inode(ino), true) {
            Ok(names) => {
                let mut v = Vec::new();
                for n in names.iter().filter(|n| root || !n.starts_with(b"trusted.")) {
                    v.extend_from_slice(n);
                    v.push(0);
                }
                xattr_reply(&v, size, reply)
            }
            Err(e) => reply.error(errno(&e)),
        };
    }

    fn setxattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let name = name.as_bytes();
        let s = self.inner.clone();
        reply_empty(
            reply,
            s.fs.set_xattr(At::inode(ino), name, value, flags, true),
        )
    }

    fn removexattr(&mut self, _req: &Request<'_>, ino: u64, name: &OsStr, reply: ReplyEmpty) {
        let name = name.as_bytes();
        let s = self.inner.clone();
        reply_empty(reply, s.fs.remove_xattr(At::inode(ino), name, true));
    }

    /// `SEEK_DATA` and `SEEK_HOLE` (the kernel moves the position itself for the others).
    fn lseek(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let s = self.inner.clone();
        let Some(f) = s.file(fh) else {
            return reply.error(libc::EBADF);
        };
        let Ok(off) = u64::try_from(offset) else {
            return reply.error(libc::ENXIO);
        };
        let r = match whence {
            libc::SEEK_DATA => f.next_data(off),
            libc::SEEK_HOLE => f.next_hole(off),
            _ => return reply.error(libc::EINVAL),
        };
        match r {
            Ok(o) => reply.offset(o as i64),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fallocate(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        fh: u64,
        offset: i64,
        length: i64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let s = self.inner.clone();
        let r = (|| -> io::Result<()> {
            let f = match s.file(fh) {
                Some(f) => f,
                None => Arc::new(OpenOptions::new().write(true).open(&s.fs, At::inode(ino))?),
            };
            f.fallocate(mode, offset, length)
        })();
        reply_empty(reply, r)
    }

    /// `O_TMPFILE`: an unnamed file ([`OpenOptions::tmpfile`]), given to the caller; the
    /// kernel names it later with `link` (which LibFS allows for a linkable unnamed
    /// file) unless it was opened `O_EXCL`.
    fn tmpfile(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let req = Caller(req.uid(), req.gid());
        let s = self.inner.clone();
        let e0 = s.epoch();
        let acc = flags & libc::O_ACCMODE;
        let r = OpenOptions::new()
            .read(acc == libc::O_RDWR)
            .write(true)
            .mode(mode & !umask & 0o7777)
            .tmpfile(&s.fs, At::inode(parent), flags & libc::O_EXCL == 0)
            .and_then(|f| {
                let at = At::inode(f.metadata()?.ino());
                s.own(req, parent, at, false)?;
                Ok((f, s.fs.symlink_metadata(at)?))
            });
        match r {
            // No name: nothing for the kernel to cache but the attributes.
            Ok((f, m)) => s.reply_created(f, &m, &s.caching_since(e0), Duration::ZERO, reply),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn create(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let req = Caller(req.uid(), req.gid());
        let s = self.inner.clone();
        let at = name_at(parent, name);
        let e0 = s.epoch();
        let acc = flags & libc::O_ACCMODE;
        let r = OpenOptions::new()
            .read(acc != libc::O_WRONLY)
            .write(flags & libc::O_APPEND == 0)
            .append(flags & libc::O_APPEND != 0)
            .create(true)
            .create_new(flags & libc::O_EXCL != 0)
            .truncate(flags & libc::O_TRUNC != 0 && flags & libc::O_APPEND == 0)
            .mode(mode & !umask & 0o7777)
            .open(&s.fs, at);
        let r = r.and_then(|f| {
            s.own(req, parent, at, false)?;
            Ok((f, s.fs.symlink_metadata(at)?))
        });
        match r {
            Ok((f, m)) => {
                let c = &s.caching_since(e0);
                let entry_ttl = s.entry_ttl(c, parent, Path::new(name));
                s.reply_created(f, &m, c, entry_ttl, reply);
            }
            Err(e) => reply.error(errno(&e)),
        }
    }
}

/// Mount options: the kernel checks permissions; other users may use the mount when it
/// runs as root.
pub fn mount_options(store: &Path) -> Vec<MountOption> {
    // The file-system name says which store this is (LibFS finds the mount of a store
    // by it: ARCHITECTURE.md, "Special files").
    let name = cairn::mount_fsname(store);
    let mut o = vec![
        MountOption::FSName(name),
        MountOption::Subtype("cairn".into()),
        MountOption::DefaultPermissions,
        MountOption::RW,
    ];
    if euid() == 0 {
        // Device nodes on the mount open their devices (only root may make them).
        o.push(MountOption::AllowOther);
        o.push(MountOption::Dev);
    }
    o
}

/// Serve `fs` at `mountpoint` until it is unmounted; the kernel may cache attributes
/// and entries as `caching` says. The modes requests carry already had the caller's
/// umask applied: `fs` must be opened by a process whose umask is 0 (`cairn mount` sets
/// it).
pub fn serve(fs: Fs, mountpoint: &Path, caching: Caching) -> io::Result<()> {
    let opts = mount_options(fs.store_dir());
    let cf = CairnFuse::new(fs, caching);
    let inner = cf.inner.clone();
    let mut session = fuser::Session::new(cf, mountpoint, &opts)?;
    // Attributes the kernel caches are those of inodes this client holds a lease on:
    // when it loses one (another client is about to change the inode), the kernel's copy
    // goes first. Attributes only (offset -1): no page or inode lock is taken, so this
    // may run while a request waits on this client.
    // Names go on another thread: dropping a cached name takes the directory's inode
    // lock, which a request waiting on this client may hold (then the revocation would
    // wait for the request and the request for the revocation).
    let notifier = session.notifier();
    let (tx, rx) = std::sync::mpsc::channel::<(u64, Vec<Vec<u8>>)>();
    let n2 = session.notifier();
    std::thread::Builder::new()
        .name("cairn-fuse-inval".into())
        .spawn(move || {
            for (dir, names) in rx {
                for n in names {
                    let _ = n2.inval_entry(dir, OsStr::from_bytes(&n));
                }
            }
        })?;
    let known = inner.known.clone();
    let names = inner.names.clone();
    let lost = inner.lost.clone();
    inner.fs.on_lease_lost(Some(Box::new(move |ino| {
        lost.fetch_add(1, Ordering::SeqCst);
        let inos: Vec<u64> = match ino {
            Some(i) => vec![i],
            None => lock(&known).keys().copied().collect(),
        };
        for i in inos {
            let _ = notifier.inval_inode(i, -1, 0);
        }
        for d in names.take(ino) {
            let _ = tx.send(d);
        }
    })));
    let r = session.run();
    inner.fs.on_lease_lost(None);
    r
}
