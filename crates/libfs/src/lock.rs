//! Advisory locks across processes, held by the kernel: POSIX record locks
//! (`fcntl(F_SETLK/F_SETLKW/F_GETLK)`), OFD record locks (`F_OFD_SETLK/..`) and `flock`.
//!
//! Every inode that is locked has a **lock file**: an empty file in the host's shared
//! memory, `/dev/shm/cairn-<uuid>.lock-<ino>-<gen>`, made at its first lock with the
//! store's trust domain as its permissions. A lock on the inode is the kernel's lock of
//! the same kind on that file, so every process of the store (through the API, the shim
//! or the mount) meets the same locks, at the cost of a system call:
//!
//! * **Owners.** POSIX locks are taken on one descriptor of the lock file per inode per
//!   client ([`ClientLocks`]): the kernel owns them by process, as on Linux (two `Fs` of
//!   one process are one owner). OFD and `flock` locks are taken on a descriptor of the
//!   [`File`]'s own, opened at its first such lock, so the `File` (an open file
//!   description: `File` has no `try_clone`) owns them. POSIX and OFD locks conflict
//!   with each other, also within one process; `flock` locks are independent of both.
//! * **Ranges.** `[start, start + len)`, `len` 0 meaning "to the end of any file". A start
//!   beyond `i64::MAX` is `EINVAL`, an end beyond it `EOVERFLOW` (as Linux).
//! * **Setting** a record lock replaces the owner's own locks in the range (upgrade,
//!   downgrade, split) and merges adjacent locks of the same type; a conflict changes
//!   nothing. Read locks need a handle opened for reading, write locks one opened for
//!   writing (`EBADF`); unlocking and testing need neither.
//! * **Closing** any `File` of an inode drops all POSIX locks of this process on that
//!   inode (the POSIX rule: the client closes its descriptor of the lock file, and the
//!   kernel drops them); closing a `File` closes its own descriptor, dropping its OFD and
//!   `flock` locks.
//! * **Death.** The kernel drops a process's locks when it exits or is killed, and
//!   waiters proceed. Locks do not involve the daemon: they survive its restart.
//! * **Waiting** is the kernel's: a blocked request holds no LibFS lock, a signal
//!   interrupts it (`EINTR`), and a POSIX wait that would close a cycle of waiting
//!   processes fails with `EDEADLK` (OFD and `flock` waits are not checked, as on
//!   Linux). The `*_timeout` calls bound a wait by retrying without waiting, with a
//!   growing pause (up to 5 ms), until the deadline (`ETIMEDOUT`).
//! * **Errors.** A conflict without waiting: `EAGAIN` (`ErrorKind::WouldBlock`; it is also
//!   `EWOULDBLOCK` for `flock`); a lock file that cannot be made or opened: `ENOLCK`.
//! * **Lock files** carry the inode's generation, so a reused inode number never meets
//!   an old file's locks; the daemon removes those of generations no longer live
//!   ([`host::stale_objects`]).

use crate::fs::Inner;
use crate::File;
use cairn_area::{fs_err, host};
use cairn_media::sys::{self, RecordOp, RecordOwner};
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A lock's type: shared (read) or exclusive (write).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockType {
    Read,
    Write,
}

/// A conflicting lock, as `F_GETLK` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockInfo {
    pub typ: LockType,
    pub start: u64,
    /// 0: to the end of any file.
    pub len: u64,
    /// The holder's pid; -1 for an OFD lock (as Linux reports).
    pub pid: i32,
}

/// Which record locks: process-owned POSIX locks or OFD locks owned by the [`File`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockKind {
    /// `F_SETLK`/`F_SETLKW`/`F_GETLK`: owned by the process.
    Posix,
    /// `F_OFD_SETLK`/`F_OFD_SETLKW`/`F_OFD_GETLK`: owned by the `File`.
    Ofd,
}

/// A `flock(2)` operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlockOp {
    /// `LOCK_SH`.
    Shared,
    /// `LOCK_EX`.
    Exclusive,
    /// `LOCK_UN`.
    Unlock,
}

/// The longest pause between two attempts of a bounded wait.
const MAX_PAUSE: Duration = Duration::from_millis(5);

/// This client's descriptors of lock files that hold its process's POSIX locks (one per
/// `Fs`).
pub(crate) struct ClientLocks {
    /// The descriptor holding this process's POSIX locks on each `(ino, gen)` it locked;
    /// closed (dropping them) when any `File` of the inode closes.
    posix: Mutex<HashMap<(u64, u64), Arc<std::fs::File>>>,
}

/// A `File`'s descriptor of its inode's lock file: the owner of its OFD and `flock`
/// locks, opened at the first one.
#[derive(Debug, Default)]
pub(crate) struct FileLocks {
    fd: OnceLock<std::fs::File>,
}

fn guard<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Tells apart the temporary names of lock files being made by threads of one process.
static MAKING: AtomicU64 = AtomicU64::new(0);

impl ClientLocks {
    pub(crate) fn new() -> ClientLocks {
        ClientLocks {
            posix: Mutex::new(HashMap::new()),
        }
    }

    /// A new descriptor of the lock file of `(ino, gen)` in `fs`'s store, making the file
    /// if there is none: under a temporary name first, given the store's permissions,
    /// then linked into place, so nobody opens it before its permissions are set.
    fn open(fs: &Inner, ino: u64, gen: u64) -> io::Result<std::fs::File> {
        let path = host::lock_file_path(&fs.area.superblock().uuid, ino, gen);
        let failed = |e: io::Error, what: &Path| {
            fs_err(
                libc::ENOLCK,
                format!("lock: cannot open the lock file {}: {e}", what.display()),
            )
        };
        let open = |p: &Path| host::open_object(p, &fs.nvm_path);
        loop {
            match open(&path) {
                Ok(f) => return Ok(f),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(failed(e, &path)),
            }
            let tmp = PathBuf::from(format!(
                "{}.new-{}-{}",
                path.display(),
                std::process::id(),
                MAKING.fetch_add(1, Ordering::Relaxed)
            ));
            let f = host::create_object(&tmp, &fs.nvm_path).map_err(|e| failed(e, &tmp))?;
            let placed = std::fs::hard_link(&tmp, &path);
            let _ = std::fs::remove_file(&tmp);
            match placed {
                Ok(()) => return Ok(f),
                // Another process made it meanwhile: open theirs.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(failed(e, &path)),
            }
        }
    }

    /// This process's POSIX descriptor for `(ino, gen)`; with `make`, opened if there is
    /// none (else `None`).
    fn posix_fd(
        &self,
        fs: &Inner,
        ino: u64,
        gen: u64,
        make: bool,
    ) -> io::Result<Option<Arc<std::fs::File>>> {
        let mut m = guard(&self.posix);
        if let Some(f) = m.get(&(ino, gen)) {
            return Ok(Some(f.clone()));
        }
        if !make {
            return Ok(None);
        }
        let f = Arc::new(Self::open(fs, ino, gen)?);
        m.insert((ino, gen), f.clone());
        Ok(Some(f))
    }

    /// Whether one of the descriptors of this process's POSIX locks is a `hit` (`None`
    /// while another thread changes them).
    pub(crate) fn holds_descriptor(
        &self,
        hit: impl Fn(std::os::fd::RawFd) -> bool,
    ) -> Option<bool> {
        use std::os::fd::AsRawFd;
        let m = self.posix.try_lock().ok()?;
        Some(m.values().any(|f| hit(f.as_raw_fd())))
    }

    /// After `fork`, in the child: close the copies of the parent's POSIX descriptors.
    /// They hold none of the child's locks (the kernel does not pass POSIX locks on), and
    /// a process's close drops only its own.
    pub(crate) fn abandon(&self) {
        if let Ok(mut m) = self.posix.try_lock() {
            m.clear();
        }
    }
}

/// A `File` of `(ino, gen)` is closing: the POSIX rule (see the module docs). Its own
/// descriptor closes with it.
pub(crate) fn on_close(fs: &Inner, ino: u64, gen: u64) {
    // Dropping the descriptor (when no lock call is using it) makes the kernel drop the
    // process's POSIX locks on the lock file.
    let f = guard(&fs.locks.posix).remove(&(ino, gen));
    drop(f);
}

/// Linux's range checks (`EINVAL`, `EOVERFLOW`).
fn check_range(start: u64, len: u64) -> io::Result<()> {
    const OFFSET_MAX: u64 = i64::MAX as u64;
    if start > OFFSET_MAX {
        return Err(fs_err(
            libc::EINVAL,
            format!("lock: start {start} is beyond the largest file offset"),
        ));
    }
    if len > 0 && len - 1 > OFFSET_MAX - start {
        return Err(fs_err(
            libc::EOVERFLOW,
            format!("lock: range {start}+{len} ends beyond the largest file offset"),
        ));
    }
    Ok(())
}

/// A kernel answer as the errors the calls document.
fn kernel(what: &str, e: io::Error) -> io::Error {
    let errno = e.raw_os_error().unwrap_or(libc::EIO);
    let why = match errno {
        libc::EAGAIN | libc::EACCES => "conflicting lock held by another owner",
        libc::EDEADLK => "waiting would deadlock",
        libc::EINTR => "interrupted by a signal",
        _ => "",
    };
    let errno = if errno == libc::EACCES {
        libc::EAGAIN
    } else {
        errno
    };
    if why.is_empty() {
        fs_err(errno, format!("{what}: {e}"))
    } else {
        fs_err(errno, format!("{what}: {why}"))
    }
}

/// Try `attempt` (which must not wait) until it succeeds, fails with something other than
/// a conflict, or `timeout` passes (`ETIMEDOUT`).
fn retry_until(
    what: &str,
    timeout: Duration,
    mut attempt: impl FnMut() -> io::Result<()>,
) -> io::Result<()> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_micros(50);
    loop {
        match attempt() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            r => return r,
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(fs_err(
                libc::ETIMEDOUT,
                format!("{what}: still held by another owner after {timeout:?}"),
            ));
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

impl File {
    /// The descriptor owning `kind` locks of this handle; with `make`, opened if needed
    /// (else `None` when it has none yet, so it holds no locks).
    fn lock_fd(&self, kind: LockKind, make: bool) -> io::Result<Option<LockFd<'_>>> {
        let (fs, ino, gen, fl) = self.lock_parts();
        match kind {
            LockKind::Posix => Ok(fs.locks.posix_fd(fs, ino, gen, make)?.map(LockFd::Posix)),
            LockKind::Ofd => {
                if let Some(f) = fl.fd.get() {
                    return Ok(Some(LockFd::Own(f)));
                }
                if !make {
                    return Ok(None);
                }
                let f = ClientLocks::open(fs, ino, gen)?;
                // A concurrent first lock may have set it: theirs stays, ours closes.
                let _ = fl.fd.set(f);
                Ok(fl.fd.get().map(LockFd::Own))
            }
        }
    }

    fn set_lock(
        &self,
        kind: LockKind,
        typ: LockType,
        start: u64,
        len: u64,
        wait: bool,
    ) -> io::Result<()> {
        check_range(start, len)?;
        let (read, write) = self.access();
        match typ {
            LockType::Read if !read => {
                return Err(fs_err(
                    libc::EBADF,
                    "lock: a read lock needs a file open for reading",
                ))
            }
            LockType::Write if !write => {
                return Err(fs_err(
                    libc::EBADF,
                    "lock: a write lock needs a file open for writing",
                ))
            }
            _ => {}
        }
        let fd = self.lock_fd(kind, true)?.expect("made");
        let op = RecordOp::Set {
            write: Some(typ == LockType::Write),
            wait,
        };
        sys::record_lock(&fd, fd.owner(), op, start, len)
            .map(drop)
            .map_err(|e| kernel("lock", e))
    }

    /// Take a record lock of type `typ` over `[start, start + len)` (`len` 0: to the end
    /// of any file), like `fcntl(F_SETLK)` / `F_OFD_SETLK`, or with `wait` like
    /// `F_SETLKW` / `F_OFD_SETLKW` (blocks until granted).
    ///
    /// Errors: `EAGAIN` (conflict, not waiting), `EDEADLK` (POSIX wait would deadlock),
    /// `EINTR` (a signal interrupted the wait), `EBADF` (read lock on a handle not open
    /// for reading, write lock on one not open for writing), `EINVAL`/`EOVERFLOW`
    /// (range), `ENOLCK` (no lock file).
    pub fn lock(
        &self,
        kind: LockKind,
        typ: LockType,
        start: u64,
        len: u64,
        wait: bool,
    ) -> io::Result<()> {
        self.set_lock(kind, typ, start, len, wait)
    }

    /// Like [`File::lock`] with `wait`, giving up after `timeout` with `ETIMEDOUT`
    /// (nothing changed).
    pub fn lock_timeout(
        &self,
        kind: LockKind,
        typ: LockType,
        start: u64,
        len: u64,
        timeout: Duration,
    ) -> io::Result<()> {
        retry_until("lock", timeout, || {
            self.set_lock(kind, typ, start, len, false)
        })
    }

    /// Remove the owner's record locks over `[start, start + len)` (`F_UNLCK`), splitting
    /// locks that extend beyond it. Unlocking what is not locked is fine.
    pub fn unlock(&self, kind: LockKind, start: u64, len: u64) -> io::Result<()> {
        check_range(start, len)?;
        let Some(fd) = self.lock_fd(kind, false)? else {
            return Ok(()); // never locked: nothing to remove
        };
        let op = RecordOp::Set {
            write: None,
            wait: false,
        };
        sys::record_lock(&fd, fd.owner(), op, start, len)
            .map(drop)
            .map_err(|e| kernel("unlock", e))
    }

    /// `F_GETLK` / `F_OFD_GETLK`: `None` if a `typ` lock over the range could be placed
    /// now, else the conflicting lock (of another owner) with the lowest start: its type,
    /// range (`len` 0: to the end) and holder's pid (-1 for an OFD lock).
    pub fn get_lock(
        &self,
        kind: LockKind,
        typ: LockType,
        start: u64,
        len: u64,
    ) -> io::Result<Option<LockInfo>> {
        check_range(start, len)?;
        let fd = self.lock_fd(kind, true)?.expect("made");
        let op = RecordOp::Test {
            write: typ == LockType::Write,
        };
        let c =
            sys::record_lock(&fd, fd.owner(), op, start, len).map_err(|e| kernel("get_lock", e))?;
        Ok(c.map(|(write, start, len, pid)| LockInfo {
            typ: if write {
                LockType::Write
            } else {
                LockType::Read
            },
            start,
            len,
            pid,
        }))
    }

    /// `flock(2)`: a whole-file lock owned by this `File`, independent of record locks.
    /// Converting (shared ↔ exclusive) is allowed and, as on Linux, not atomic: the old
    /// lock is dropped first (a failed non-blocking conversion leaves none). Errors:
    /// `EWOULDBLOCK` (= `EAGAIN`) with `nonblocking`, `EINTR`, `ENOLCK` (no lock file).
    pub fn flock(&self, op: FlockOp, nonblocking: bool) -> io::Result<()> {
        let Some(fd) = self.lock_fd(LockKind::Ofd, op != FlockOp::Unlock)? else {
            return Ok(()); // never locked: nothing to unlock
        };
        let LockFd::Own(f) = fd else {
            unreachable!("flock locks are the File's")
        };
        match op {
            FlockOp::Shared => sys::flock_shared(f, nonblocking),
            FlockOp::Exclusive => sys::flock_exclusive(f, nonblocking),
            FlockOp::Unlock => sys::flock_unlock(f),
        }
        .map_err(|e| kernel("flock", e))
    }

    /// A blocking [`File::flock`] that gives up after `timeout` with `ETIMEDOUT`.
    pub fn flock_timeout(&self, op: FlockOp, timeout: Duration) -> io::Result<()> {
        retry_until("flock", timeout, || self.flock(op, true))
    }
}

/// The descriptor a lock call uses.
enum LockFd<'a> {
    /// The process's descriptor of the inode's lock file (POSIX locks).
    Posix(Arc<std::fs::File>),
    /// The `File`'s own (OFD and `flock` locks).
    Own(&'a std::fs::File),
}

impl LockFd<'_> {
    fn owner(&self) -> RecordOwner {
        match self {
            LockFd::Posix(_) => RecordOwner::Process,
            LockFd::Own(_) => RecordOwner::Description,
        }
    }
}

impl std::os::fd::AsRawFd for LockFd<'_> {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            LockFd::Posix(f) => f.as_raw_fd(),
            LockFd::Own(f) => f.as_raw_fd(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_area::errno_of;

    fn errno(r: io::Result<()>) -> i32 {
        errno_of(&r.unwrap_err())
    }

    #[test]
    fn ranges_are_checked_as_linux() {
        let max = i64::MAX as u64;
        assert!(check_range(0, 0).is_ok());
        assert!(check_range(max, 0).is_ok());
        assert!(check_range(max, 1).is_ok());
        assert_eq!(errno(check_range(max + 1, 0)), libc::EINVAL);
        assert_eq!(errno(check_range(max, 2)), libc::EOVERFLOW);
        assert!(check_range(1, max).is_ok());
        assert_eq!(errno(check_range(2, max)), libc::EOVERFLOW);
    }

    #[test]
    fn kernel_errors_keep_their_meaning() {
        let e = |n| kernel("lock", io::Error::from_raw_os_error(n));
        assert_eq!(errno_of(&e(libc::EACCES)), libc::EAGAIN);
        assert_eq!(e(libc::EAGAIN).kind(), io::ErrorKind::WouldBlock);
        assert_eq!(errno_of(&e(libc::EDEADLK)), libc::EDEADLK);
        assert_eq!(errno_of(&e(libc::EINTR)), libc::EINTR);
    }

    #[test]
    fn a_bounded_wait_gives_up_and_a_success_ends_it() {
        let mut tries = 0;
        let t = Instant::now();
        let r = retry_until("lock", Duration::from_millis(30), || {
            tries += 1;
            Err(kernel("lock", io::Error::from_raw_os_error(libc::EAGAIN)))
        });
        assert_eq!(errno(r), libc::ETIMEDOUT);
        assert!(t.elapsed() >= Duration::from_millis(30));
        assert!(tries >= 3, "it tried {tries} times");
        let mut tries = 0;
        retry_until("lock", Duration::from_secs(5), || {
            tries += 1;
            if tries < 3 {
                Err(kernel("lock", io::Error::from_raw_os_error(libc::EAGAIN)))
            } else {
                Ok(())
            }
        })
        .unwrap();
        assert_eq!(tries, 3);
        let other = retry_until("lock", Duration::from_secs(5), || {
            Err(kernel("lock", io::Error::from_raw_os_error(libc::EDEADLK)))
        });
        assert_eq!(errno(other), libc::EDEADLK);
    }
}
