//! Advisory locks across processes, held by the daemon: POSIX record locks
//! (`fcntl(F_SETLK/F_SETLKW/F_GETLK)`), OFD record locks (`F_OFD_SETLK/..`) and `flock`.
//!
//! * **Owners.** A POSIX lock is owned by the client (this `Fs`: one process normally
//!   opens one); OFD and `flock` locks are owned by one [`File`] (an open file
//!   description; `File` has no `try_clone`, so every handle is its own description).
//!   POSIX and OFD locks share one namespace and conflict with each other even within one
//!   process; `flock` locks are independent of both (as on Linux).
//! * **Ranges.** `[start, start + len)`, `len` 0 meaning "to the end of any file". A start
//!   beyond `i64::MAX` is `EINVAL`, an end beyond it `EOVERFLOW` (as Linux).
//! * **Setting** a record lock replaces the owner's own locks in the range (upgrade,
//!   downgrade, split) and merges adjacent locks of the same type; a conflict changes
//!   nothing. Read locks need a handle opened for reading, write locks one opened for
//!   writing (`EBADF`); unlocking and testing need neither.
//! * **Closing** any `File` of an inode drops all POSIX locks of this client on that inode
//!   (the POSIX rule); closing a `File` drops its own OFD and `flock` locks only.
//! * **Death.** All locks of a client are dropped when its connection to the daemon
//!   closes (the process exited or was killed), and its waiting requests are cancelled.
//! * **Waiting** requests do not hold any LibFS lock: other threads go on. A POSIX
//!   request whose wait would close a cycle of POSIX owners waiting for each other fails
//!   with `EDEADLK` (OFD and `flock` waits are not checked, as on Linux). A wait can be
//!   bounded with the `*_timeout` calls (`ETIMEDOUT`).
//! * **Errors.** A conflict without waiting: `EAGAIN` (`ErrorKind::WouldBlock`; it is also
//!   `EWOULDBLOCK` for `flock`).
//! * **Daemon restart.** Locks live in the daemon's memory: a daemon that restarts while
//!   this process runs has forgotten its locks (requests after that work normally).

use crate::fs::Inner;
use crate::File;
use cairn_area::{fs_err, StoreDir};
use cairn_proto::{LockOwner, Request, Response};
use std::collections::HashSet;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::conn::{response_error, Conn};
pub use cairn_proto::{LockInfo, LockType};

/// Which record locks: process-owned POSIX locks or OFD locks owned by the [`File`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockKind {
    /// `F_SETLK`/`F_SETLKW`/`F_GETLK`: owned by the process (this client).
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

/// Idle lock channels kept for reuse.
const MAX_IDLE: usize = 4;

/// The client's lock channels and bookkeeping (one per `Fs`).
pub(crate) struct ClientLocks {
    store: StoreDir,
    slot: u32,
    slot_gen: u64,
    idle: Mutex<Vec<Conn>>,
    /// Inodes on which this client has asked for POSIX locks: closing a handle of one of
    /// them tells the daemon (the POSIX close rule); other closes cost nothing.
    posix: Mutex<HashSet<u64>>,
    next_file: AtomicU64,
}

/// A `File`'s lock identity.
#[derive(Debug)]
pub(crate) struct FileLocks {
    id: u64,
    /// It asked for an OFD or `flock` lock: its close tells the daemon.
    used: AtomicBool,
}

impl FileLocks {
    pub(crate) fn new(c: &ClientLocks) -> FileLocks {
        FileLocks {
            id: c.next_file.fetch_add(1, Ordering::Relaxed),
            used: AtomicBool::new(false),
        }
    }
}

fn guard<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Transport errors: the daemon went away.
fn transport(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof
            | io::ErrorKind::NotFound
    )
}

impl ClientLocks {
    pub(crate) fn new(store: StoreDir, slot: u32, slot_gen: u64) -> ClientLocks {
        ClientLocks {
            store,
            slot,
            slot_gen,
            idle: Mutex::new(Vec::new()),
            posix: Mutex::new(HashSet::new()),
            next_file: AtomicU64::new(1),
        }
    }

    /// A new lock channel. If the daemon does not know us (it restarted and this client
    /// has not re-attached yet, or it is down), make the client reconnect first.
    fn open_channel(&self, fs: &Inner) -> io::Result<Conn> {
        let req = Request::LockChannel {
            slot: self.slot,
            slot_gen: self.slot_gen,
        };
        let mut retried = false;
        loop {
            let r =
                Conn::connect_only(&self.store).and_then(|mut c| c.roundtrip(&req).map(|r| (c, r)));
            let stale = match &r {
                Ok((_, Response::Error { errno, .. })) => *errno == libc::ESTALE,
                Ok(_) => false,
                Err(e) => transport(e),
            };
            if stale && !retried {
                retried = true;
                // A request on the registered connection re-attaches (and starts a
                // daemon if none runs).
                fs.digest()?;
                continue;
            }
            return match r {
                Ok((c, Response::Ok)) => Ok(c),
                Ok((_, resp)) => Err(response_error("open a lock channel", resp)),
                Err(e) => Err(fs_err(
                    libc::ENOLCK,
                    format!("cannot open a lock channel to the daemon: {e}"),
                )),
            };
        }
    }

    /// One request on a lock channel (an idle one, else a new one). A reused channel that
    /// turns out dead (the daemon restarted) is replaced once.
    /// After `fork` in the child: close the idle channels (see `Inner::abandon`).
    pub(crate) fn abandon(&self) {
        if let Ok(mut idle) = self.idle.try_lock() {
            idle.clear();
        }
    }

    fn call(&self, fs: &Inner, req: &Request) -> io::Result<Response> {
        let pooled = guard(&self.idle).pop();
        let (mut conn, reused) = match pooled {
            Some(c) => (c, true),
            None => (self.open_channel(fs)?, false),
        };
        let r = match conn.roundtrip(req) {
            Err(e) if reused && transport(&e) => {
                guard(&self.idle).clear();
                conn = self.open_channel(fs)?;
                conn.roundtrip(req)
            }
            r => r,
        };
        match r {
            Ok(resp) => {
                let mut idle = guard(&self.idle);
                if idle.len() < MAX_IDLE {
                    idle.push(conn);
                }
                Ok(resp)
            }
            Err(e) => Err(fs_err(
                libc::ENOLCK,
                format!("lost the lock channel to the daemon: {e}"),
            )),
        }
    }
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

fn ok(op: &str, r: Response) -> io::Result<()> {
    match r {
        Response::Ok => Ok(()),
        r => Err(response_error(op, r)),
    }
}

/// A `File` of `ino` is closing: apply the close rules (see the module docs).
pub(crate) fn on_close(fs: &Inner, ino: u64, fl: &FileLocks) {
    let file = fl.used.load(Ordering::Acquire).then_some(fl.id);
    let posix = guard(&fs.locks.posix).contains(&ino);
    if file.is_none() && !posix {
        return;
    }
    let _ = fs
        .locks
        .call(fs, &Request::ReleaseLocks { ino, file, posix });
}

impl File {
    fn record_owner(&self, kind: LockKind) -> LockOwner {
        let (fs, ino, _, _, fl) = self.lock_parts();
        match kind {
            LockKind::Posix => {
                // Before asking: a concurrent close must see it.
                guard(&fs.locks.posix).insert(ino);
                LockOwner::Posix
            }
            LockKind::Ofd => {
                fl.used.store(true, Ordering::Release);
                LockOwner::Ofd { file: fl.id }
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
        timeout: Option<Duration>,
    ) -> io::Result<()> {
        check_range(start, len)?;
        let (fs, ino, read, write, _) = self.lock_parts();
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
        let owner = self.record_owner(kind);
        let r = fs.locks.call(
            fs,
            &Request::Lock {
                ino,
                owner,
                typ,
                start,
                len,
                wait,
                timeout_ms: timeout.map(|t| t.as_millis().min(u64::MAX as u128) as u64),
            },
        )?;
        ok("lock", r)
    }

    /// Take a record lock of type `typ` over `[start, start + len)` (`len` 0: to the end
    /// of any file), like `fcntl(F_SETLK)` / `F_OFD_SETLK`, or with `wait` like
    /// `F_SETLKW` / `F_OFD_SETLKW` (blocks until granted).
    ///
    /// Errors: `EAGAIN` (conflict, not waiting), `EDEADLK` (POSIX wait would deadlock),
    /// `EBADF` (read lock on a handle not open for reading, write lock on one not open for
    /// writing), `EINVAL`/`EOVERFLOW` (range).
    pub fn lock(
        &self,
        kind: LockKind,
        typ: LockType,
        start: u64,
        len: u64,
        wait: bool,
    ) -> io::Result<()> {
        self.set_lock(kind, typ, start, len, wait, None)
    }

    /// Like [`File::lock`] with `wait`, giving up after `timeout` with `ETIMEDOUT` (the
    /// request is withdrawn; nothing changed).
    pub fn lock_timeout(
        &self,
        kind: LockKind,
        typ: LockType,
        start: u64,
        len: u64,
        timeout: Duration,
    ) -> io::Result<()> {
        self.set_lock(kind, typ, start, len, true, Some(timeout))
    }

    /// Remove the owner's record locks over `[start, start + len)` (`F_UNLCK`), splitting
    /// locks that extend beyond it. Unlocking what is not locked is fine.
    pub fn unlock(&self, kind: LockKind, start: u64, len: u64) -> io::Result<()> {
        check_range(start, len)?;
        let (fs, ino, _, _, fl) = self.lock_parts();
        let owner = match kind {
            LockKind::Posix => LockOwner::Posix,
            LockKind::Ofd => LockOwner::Ofd { file: fl.id },
        };
        let r = fs.locks.call(
            fs,
            &Request::Unlock {
                ino,
                owner,
                start,
                len,
            },
        )?;
        ok("unlock", r)
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
        let (fs, ino, _, _, fl) = self.lock_parts();
        let owner = match kind {
            LockKind::Posix => LockOwner::Posix,
            LockKind::Ofd => LockOwner::Ofd { file: fl.id },
        };
        match fs.locks.call(
            fs,
            &Request::GetLock {
                ino,
                owner,
                typ,
                start,
                len,
            },
        )? {
            Response::LockConflict(c) => Ok(c),
            r => Err(response_error("get_lock", r)),
        }
    }

    fn flock_impl(&self, op: FlockOp, wait: bool, timeout: Option<Duration>) -> io::Result<()> {
        let (fs, ino, _, _, fl) = self.lock_parts();
        let owner = LockOwner::Flock { file: fl.id };
        let typ = match op {
            FlockOp::Shared => LockType::Read,
            FlockOp::Exclusive => LockType::Write,
            FlockOp::Unlock => {
                if !fl.used.load(Ordering::Acquire) {
                    return Ok(()); // never locked: nothing to ask
                }
                let r = fs.locks.call(
                    fs,
                    &Request::Unlock {
                        ino,
                        owner,
                        start: 0,
                        len: 0,
                    },
                )?;
                return ok("flock", r);
            }
        };
        fl.used.store(true, Ordering::Release);
        let r = fs.locks.call(
            fs,
            &Request::Lock {
                ino,
                owner,
                typ,
                start: 0,
                len: 0,
                wait,
                timeout_ms: timeout.map(|t| t.as_millis().min(u64::MAX as u128) as u64),
            },
        )?;
        ok("flock", r)
    }

    /// `flock(2)`: a whole-file lock owned by this `File`, independent of record locks.
    /// Converting (shared ↔ exclusive) is allowed and, as on Linux, not atomic: the old
    /// lock is dropped first (a failed non-blocking conversion leaves none). Errors:
    /// `EWOULDBLOCK` (= `EAGAIN`) with `nonblocking`.
    pub fn flock(&self, op: FlockOp, nonblocking: bool) -> io::Result<()> {
        self.flock_impl(op, !nonblocking, None)
    }

    /// A blocking [`File::flock`] that gives up after `timeout` with `ETIMEDOUT`.
    pub fn flock_timeout(&self, op: FlockOp, timeout: Duration) -> io::Result<()> {
        self.flock_impl(op, true, Some(timeout))
    }
}
