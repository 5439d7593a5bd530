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

use cairn::{At, File, FlockOp, Fs, LockKind, LockType, Metadata, OpenOptions};
use cairn_proto::locktable::{LockTable, Owner, OFFSET_MAX};
use fuser::{
    FileAttr, FileType, Filesystem, KernelConfig, MountOption, ReplyAttr, ReplyCreate, ReplyData,
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

const BLOCK: u32 = 4096;
/// Init flag (FUSE 7.33): the file system clears setuid/setgid on writes the kernel marks.
const FUSE_HANDLE_KILLPRIV_V2: u32 = 1 << 28;
/// Write flag: this write must clear setuid/setgid (with `FUSE_HANDLE_KILLPRIV_V2`).
const FUSE_WRITE_KILL_SUIDGID: u32 = 1 << 2;

/// The errno of a Cairn error.
fn errno(e: &io::Error) -> i32 {
    match cairn_area::errno_of(e) {
        0 => libc::EIO,
        n => n,
    }
}

fn kind_of(t: cairn::FileType) -> FileType {
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

fn attr_of(m: &Metadata) -> FileAttr {
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
fn kill_suidgid(fs: &Fs, ino: u64, gid: u32) -> io::Result<()> {
    let m = fs.metadata(At::inode(ino))?;
    let mode = m.mode() & 0o7777;
    let kill = cairn_format::perm::privs_killed(mode, m.gid() == gid);
    if kill != 0 {
        fs.set_permissions(At::inode(ino), cairn::Permissions::from_mode(mode & !kill))?;
    }
    Ok(())
}

fn name_at(parent: u64, name: &OsStr) -> At<'_> {
    At {
        dir: parent,
        path: Path::new(name),
    }
}

fn time_of(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

/// The caller's uid and gid.
#[derive(Clone, Copy)]
struct Caller(u32, u32);

/// What a `setattr` changes.
struct Change {
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
    atime: Option<TimeOrNow>,
    mtime: Option<TimeOrNow>,
}

/// A directory listing taken at `opendir` (served by offset to `readdir`).
struct Listing {
    entries: Vec<(u64, FileType, Vec<u8>)>,
}

/// The state the request handlers share (the session thread, and the threads of lock
/// requests that wait).
struct Inner {
    fs: Fs,
    /// How long the kernel may cache names and attributes.
    caching: Caching,
    /// The kernel's lookup count of each inode it was given (entry replies add one,
    /// `forget` subtracts): the inodes whose cached attributes a lost lease may spoil.
    known: Arc<Mutex<HashMap<u64, u64>>>,
    /// The names the kernel may cache (positive and negative entries), per directory:
    /// dropped when the mount loses its lease on the directory.
    names: Arc<Names>,
    /// Leases lost so far (bumped before the kernel's copies are dropped). A reply built
    /// while one was lost may carry what the lost lease protected: it is sent with no
    /// caching ([`Inner::caching_since`]), so that the kernel does not keep it after the
    /// invalidation went by.
    lost: Arc<AtomicU64>,
    /// Whether new files go to the calling user (the mount runs as root).
    chown_new: bool,
    files: Mutex<HashMap<u64, Arc<File>>>,
    dirs: Mutex<HashMap<u64, Arc<Listing>>>,
    next_fh: AtomicU64,
    /// POSIX record locks: per (inode, FUSE lock owner) a handle whose OFD locks stand
    /// for that owner's locks; dropped (its locks released) when the owner closes a
    /// descriptor of the file (`flush`), as POSIX releases a process's locks then.
    locks: Mutex<HashMap<(u64, u64), Arc<File>>>,
    /// The record locks taken through the mount, per FUSE lock owner with the pid of the
    /// process that took them: the store's table reports them as OFD locks (no pid), so
    /// `F_GETLK` looks here first to name the holder.
    mirror: Mutex<LockTable>,
}

/// The FUSE file system over one Cairn client. Each request is handled and answered on
/// the session thread: handing each to another thread cost a wakeup (measured: `fstat`
/// through the mount 44 µs with a hand-off, 16 µs without). A lock request that waits
/// for another process is answered from a thread of its own ([`answer_lock`]); one that
/// waits for a lease another client holds holds up the mount meanwhile (at most the
/// store's lease timeout).
pub struct CairnFuse {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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
                mirror: Mutex::new(LockTable::default()),
            }),
        }
    }
}

impl Inner {
    /// The lock handle of `owner` on `ino`.
    fn lock_handle(&self, ino: u64, owner: u64) -> io::Result<Arc<File>> {
        if let Some(h) = lock(&self.locks).get(&(ino, owner)) {
            return Ok(h.clone());
        }
        let h = Arc::new(
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(&self.fs, At::inode(ino))?,
        );
        Ok(lock(&self.locks).entry((ino, owner)).or_insert(h).clone())
    }

    /// `owner` closed a descriptor of `ino` (a process's record locks) or released its
    /// last one (an open file's `flock`): its locks on it go, even while a waiter of the
    /// same owner still holds the handle.
    fn drop_locks(&self, ino: u64, owner: u64) {
        lock(&self.mirror).release_posix(owner, ino);
        let h = lock(&self.locks).remove(&(ino, owner));
        if let Some(h) = h {
            let _ = h.unlock(LockKind::Ofd, 0, 0);
            let _ = h.flock(FlockOp::Unlock, true);
        }
    }

    fn fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    fn file(&self, fh: u64) -> Option<Arc<File>> {
        lock(&self.files).get(&fh).cloned()
    }

    /// Give a new inode to the caller: its uid, and its gid unless the directory is
    /// setgid (then the directory's group was inherited).
    fn own(&self, req: Caller, parent: u64, at: At<'_>, symlink: bool) -> io::Result<()> {
        let Caller(uid, gid) = req;
        if !self.chown_new || (uid == 0 && gid == 0) {
            return Ok(());
        }
        let setgid = self.fs.metadata(At::inode(parent))?.mode() & 0o2000 != 0;
        let gid = (!setgid).then_some(gid);
        if symlink {
            self.fs.set_symlink_owner(at, Some(uid), gid)
        } else {
            self.fs.set_owner(at, Some(uid), gid)
        }
    }

    fn entry(&self, at: At<'_>, reply: ReplyEntry) {
        self.entry_or_negative(at, reply, false)
    }

    /// Answer with the entry `at` names; a missing name is a negative entry the kernel
    /// may cache when `negative` (a lookup). Entries are cached only while their name is
    /// tracked for invalidation ([`Names`]).
    fn entry_or_negative(&self, at: At<'_>, reply: ReplyEntry, negative: bool) {
        let e0 = self.epoch();
        let r = self.fs.symlink_metadata(at);
        let c = &self.caching_since(e0);
        let entry_ttl = if at.is_inode() {
            Duration::ZERO
        } else {
            self.entry_ttl(c, at.dir, at.path)
        };
        let cached = !entry_ttl.is_zero();
        match r {
            Ok(m) => {
                self.looked_up(m.ino());
                reply.entry_ttls(&entry_ttl, &c.attr, &attr_of(&m), 0)
            }
            Err(e) if negative && cached && errno(&e) == libc::ENOENT => {
                let none = FileAttr {
                    ino: 0,
                    size: 0,
                    blocks: 0,
                    atime: SystemTime::UNIX_EPOCH,
                    mtime: SystemTime::UNIX_EPOCH,
                    ctime: SystemTime::UNIX_EPOCH,
                    crtime: SystemTime::UNIX_EPOCH,
                    kind: FileType::RegularFile,
                    perm: 0,
                    nlink: 0,
                    uid: 0,
                    gid: 0,
                    rdev: 0,
                    blksize: BLOCK,
                    flags: 0,
                };
                reply.entry_ttls(&entry_ttl, &Duration::ZERO, &none, 0)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// The count of lost leases, to pass to [`Inner::caching_since`] (read before the
    /// client is asked).
    fn epoch(&self) -> u64 {
        self.lost.load(Ordering::SeqCst)
    }

    /// The caching for a reply built since [`Inner::epoch`] answered `e0`: none if a
    /// lease was lost meanwhile.
    fn caching_since(&self, e0: u64) -> Caching {
        if self.epoch() == e0 {
            self.caching
        } else {
            Caching {
                entry: Duration::ZERO,
                attr: Duration::ZERO,
            }
        }
    }

    /// How long the kernel may cache the name `name` in `dir` under caching `c`: not at
    /// all unless it is tracked for invalidation ([`Names`]).
    fn entry_ttl(&self, c: &Caching, dir: u64, name: &Path) -> Duration {
        if !c.entry.is_zero() && self.names.track(dir, name) {
            c.entry
        } else {
            Duration::ZERO
        }
    }

    /// Answer a create (named: `name`, or unnamed) with the new handle of `f`.
    fn reply_created(
        &self,
        f: File,
        m: &Metadata,
        c: &Caching,
        entry_ttl: Duration,
        reply: ReplyCreate,
    ) {
        let fh = self.fh();
        lock(&self.files).insert(fh, Arc::new(f));
        self.looked_up(m.ino());
        reply.created_ttls(&entry_ttl, &c.attr, &attr_of(m), 0, fh, 0);
    }

    /// The kernel was given inode `ino` in an entry reply (its lookup count grows).
    fn looked_up(&self, ino: u64) {
        *lock(&self.known).entry(ino).or_insert(0) += 1;
    }

    fn setattr_inner(&self, ino: u64, c: Change, fh: Option<u64>) -> io::Result<Metadata> {
        let Change {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
        } = c;
        let me = At::inode(ino);
        if uid.is_some() || gid.is_some() {
            self.fs.set_symlink_owner(me, uid, gid)?;
        }
        if let Some(m) = mode {
            self.fs
                .set_permissions(me, cairn::Permissions::from_mode(m & 0o7777))?;
        }
        if let Some(sz) = size {
            match fh.and_then(|h| self.file(h)) {
                Some(f) => f.set_len(sz)?,
                None => OpenOptions::new()
                    .write(true)
                    .open(&self.fs, me)?
                    .set_len(sz)?,
            }
        }
        if atime.is_some() || mtime.is_some() {
            self.fs
                .set_times(me, atime.map(time_of), mtime.map(time_of))?;
        }
        self.fs.symlink_metadata(me)
    }
}

/// The effective uid of this process.
fn euid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    // /proc/self is owned by the process's effective uid.
    std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid())
}

/// A FUSE lock range (`end` inclusive, `OFFSET_MAX`: to the end) as start and length
/// (0: to the end).
fn lock_range(start: u64, end: u64) -> (u64, u64) {
    if end >= i64::MAX as u64 {
        (start, 0)
    } else {
        (start, end.saturating_sub(start) + 1)
    }
}

/// Answer a request that returns nothing: `Ok`, or the error's errno.
fn reply_empty(reply: ReplyEmpty, r: io::Result<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

/// A lock range `(start, len)` as the lock table's inclusive `[start, end]`.
fn mirror_range(start: u64, len: u64) -> (u64, u64) {
    cairn_proto::locktable::range(start, len).unwrap_or((start, OFFSET_MAX))
}

/// Answer a lock request with what `take` returns: at once, or (`wait`: it may block)
/// from a thread of its own, so that a waiter does not hold up the other requests.
fn answer_lock(
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
fn xattr_reply(v: &[u8], size: u32, reply: ReplyXattr) {
    if size == 0 {
        reply.size(v.len() as u32);
    } else if v.len() > size as usize {
        reply.error(libc::ERANGE);
    } else {
        reply.data(v);
    }
}

fn lock_type(typ: i32) -> Option<LockType> {
    match typ {
        libc::F_RDLCK => Some(LockType::Read),
        libc::F_WRLCK => Some(LockType::Write),
        _ => None,
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
        let (start, len) = lock_range(start, end);
        // A lock taken through the mount, with its holder's pid; else the store's
        // answer (other clients' locks).
        let (s0, e0) = mirror_range(start, len);
        let here = lock(&s.mirror)
            .test_record(ino, Owner::Posix(lock_owner), t, s0, e0)
            .map(|l| l.info());
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
            let (s0, e0) = mirror_range(start, len);
            let _ = lock(&s.mirror).set_record(ino, Owner::Posix(lock_owner), pid, t, s0, e0);
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

/// Names of directory entries the kernel may cache, per directory, so that they can be
/// dropped when the mount loses its lease on the directory (another client is about to
/// change it). Bounded: past [`Names::PER_DIR`] names in a directory or
/// [`Names::TOTAL`] in all, entries are answered without caching.
#[derive(Default)]
struct Names {
    /// Per directory its tracked names, and their total.
    dirs: Mutex<(HashMap<u64, NameSet>, usize)>,
}

type NameSet = std::collections::HashSet<Vec<u8>>;

impl Names {
    const PER_DIR: usize = 4096;
    const TOTAL: usize = 1 << 20;

    /// Track `name` in `dir`; whether it is (so the kernel may cache the entry).
    fn track(&self, dir: u64, name: &Path) -> bool {
        let mut g = lock(&self.dirs);
        let (dirs, total) = &mut *g;
        let set = dirs.entry(dir).or_default();
        let n = name.as_os_str().as_bytes();
        if set.contains(n) {
            return true;
        }
        if set.len() >= Self::PER_DIR || *total >= Self::TOTAL {
            return false;
        }
        set.insert(n.to_vec());
        *total += 1;
        true
    }

    /// Stop tracking the names of `dir` (`None`: of every directory) and return them.
    fn take(&self, dir: Option<u64>) -> Vec<(u64, Vec<Vec<u8>>)> {
        let mut g = lock(&self.dirs);
        let (dirs, total) = &mut *g;
        let taken: Vec<(u64, NameSet)> = match dir {
            Some(d) => dirs.remove(&d).map(|s| (d, s)).into_iter().collect(),
            None => dirs.drain().collect(),
        };
        taken
            .into_iter()
            .map(|(d, s)| {
                *total -= s.len();
                (d, s.into_iter().collect())
            })
            .collect()
    }
}

/// How long the kernel may cache what the mount tells it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Caching {
    /// Names, positive and negative: dropped when the mount loses its lease on the
    /// directory (on another thread: a name another client changes may be seen for the
    /// microseconds that takes).
    pub entry: Duration,
    /// Attributes: dropped at once when the mount loses its lease on the inode, so this
    /// bounds only what a missed invalidation could cost.
    pub attr: Duration,
}

impl Default for Caching {
    /// Names and attributes for 60 s (kept current by the leases).
    fn default() -> Caching {
        Caching {
            entry: Duration::from_secs(60),
            attr: Duration::from_secs(60),
        }
    }
}
