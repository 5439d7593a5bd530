//! The mount's state: the client (`cairn::Fs`), open handles and their locks, the names
//! the kernel was told about and what it may cache (`Caching`).

use crate::convert::{attr_of, errno, time_of};
use crate::BLOCK;
use cairn::{At, File, FlockOp, Fs, LockKind, Metadata, OpenOptions};
use fuser::{FileAttr, FileType, ReplyCreate, ReplyEntry, TimeOrNow};
use std::collections::HashMap;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// The caller's uid and gid.
#[derive(Clone, Copy)]
pub(super) struct Caller(pub(super) u32, pub(super) u32);

/// What a `setattr` changes.
pub(super) struct Change {
    pub(super) mode: Option<u32>,
    pub(super) uid: Option<u32>,
    pub(super) gid: Option<u32>,
    pub(super) size: Option<u64>,
    pub(super) atime: Option<TimeOrNow>,
    pub(super) mtime: Option<TimeOrNow>,
}

/// A directory listing taken at `opendir` (served by offset to `readdir`).
pub(super) struct Listing {
    pub(super) entries: Vec<(u64, FileType, Vec<u8>)>,
}

/// The state the request handlers share (the session thread, and the threads of lock
/// requests that wait).
pub(super) struct Inner {
    pub(super) fs: Fs,
    /// How long the kernel may cache names and attributes.
    pub(super) caching: Caching,
    /// The kernel's lookup count of each inode it was given (entry replies add one,
    /// `forget` subtracts): the inodes whose cached attributes a lost lease may spoil.
    pub(super) known: Arc<Mutex<HashMap<u64, u64>>>,
    /// The names the kernel may cache (positive and negative entries), per directory:
    /// dropped when the mount loses its lease on the directory.
    pub(super) names: Arc<Names>,
    /// Leases lost so far (bumped before the kernel's copies are dropped). A reply built
    /// while one was lost may carry what the lost lease protected: it is sent with no
    /// caching ([`Inner::caching_since`]), so that the kernel does not keep it after the
    /// invalidation went by.
    pub(super) lost: Arc<AtomicU64>,
    /// Whether new files go to the calling user (the mount runs as root).
    pub(super) chown_new: bool,
    pub(super) files: Mutex<HashMap<u64, Arc<File>>>,
    pub(super) dirs: Mutex<HashMap<u64, Arc<Listing>>>,
    pub(super) next_fh: AtomicU64,
    /// POSIX record locks: per (inode, FUSE lock owner) a handle whose OFD locks stand
    /// for that owner's locks; dropped (its locks released) when the owner closes a
    /// descriptor of the file (`flush`), as POSIX releases a process's locks then.
    pub(super) locks: Mutex<HashMap<(u64, u64), Arc<File>>>,
    /// The record locks taken through the mount, per FUSE lock owner with the pid of the
    /// process that took them: the store's table reports them as OFD locks (no pid), so
    /// `F_GETLK` looks here first to name the holder.
    pub(super) mirror: Mutex<super::mirror::Mirror>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Inner {
    /// The lock handle of `owner` on `ino`.
    pub(super) fn lock_handle(&self, ino: u64, owner: u64) -> io::Result<Arc<File>> {
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
    pub(super) fn drop_locks(&self, ino: u64, owner: u64) {
        lock(&self.mirror).release(owner, ino);
        let h = lock(&self.locks).remove(&(ino, owner));
        if let Some(h) = h {
            let _ = h.unlock(LockKind::Ofd, 0, 0);
            let _ = h.flock(FlockOp::Unlock, true);
        }
    }

    pub(super) fn fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    pub(super) fn file(&self, fh: u64) -> Option<Arc<File>> {
        lock(&self.files).get(&fh).cloned()
    }

    /// Give a new inode to the caller: its uid, and its gid unless the directory is
    /// setgid (then the directory's group was inherited).
    pub(super) fn own(
        &self,
        req: Caller,
        parent: u64,
        at: At<'_>,
        symlink: bool,
    ) -> io::Result<()> {
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

    pub(super) fn entry(&self, at: At<'_>, reply: ReplyEntry) {
        self.entry_or_negative(at, reply, false)
    }

    /// Answer with the entry `at` names; a missing name is a negative entry the kernel
    /// may cache when `negative` (a lookup). Entries are cached only while their name is
    /// tracked for invalidation ([`Names`]).
    pub(super) fn entry_or_negative(&self, at: At<'_>, reply: ReplyEntry, negative: bool) {
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
    pub(super) fn epoch(&self) -> u64 {
        self.lost.load(Ordering::SeqCst)
    }

    /// The caching for a reply built since [`Inner::epoch`] answered `e0`: none if a
    /// lease was lost meanwhile.
    pub(super) fn caching_since(&self, e0: u64) -> Caching {
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
    pub(super) fn entry_ttl(&self, c: &Caching, dir: u64, name: &Path) -> Duration {
        if !c.entry.is_zero() && self.names.track(dir, name) {
            c.entry
        } else {
            Duration::ZERO
        }
    }

    /// Answer a create (named: `name`, or unnamed) with the new handle of `f`.
    pub(super) fn reply_created(
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
    pub(super) fn looked_up(&self, ino: u64) {
        *lock(&self.known).entry(ino).or_insert(0) += 1;
    }

    pub(super) fn setattr_inner(
        &self,
        ino: u64,
        c: Change,
        fh: Option<u64>,
    ) -> io::Result<Metadata> {
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

/// Names of directory entries the kernel may cache, per directory, so that they can be
/// dropped when the mount loses its lease on the directory (another client is about to
/// change it). Bounded: past [`Names::PER_DIR`] names in a directory or
/// [`Names::TOTAL`] in all, entries are answered without caching.
#[derive(Default)]
pub(super) struct Names {
    /// Per directory its tracked names, and their total.
    pub(super) dirs: Mutex<(HashMap<u64, NameSet>, usize)>,
}

pub(super) type NameSet = std::collections::HashSet<Vec<u8>>;

impl Names {
    const PER_DIR: usize = 4096;
    const TOTAL: usize = 1 << 20;

    /// Track `name` in `dir`; whether it is (so the kernel may cache the entry).
    pub(super) fn track(&self, dir: u64, name: &Path) -> bool {
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
    pub(super) fn take(&self, dir: Option<u64>) -> Vec<(u64, Vec<Vec<u8>>)> {
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
