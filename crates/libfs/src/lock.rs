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
//! * **Delegation.** While no other client uses an inode's locks, the daemon hands them
//!   to this client, which then answers lock calls on it from its own table (the
//!   daemon's code, `cairn_proto::locktable`) without a round trip; another client's
//!   request makes the daemon recall them (an upcall answered with `ReturnLocks`), and a
//!   request here that must wait gives them back first (PROTOCOL.md, "Lock delegation").
//! * **Daemon restart.** Locks live in the daemon's memory: a daemon that restarts while
//!   this process runs has forgotten its locks (requests after that work normally).

use crate::fs::Inner;
use crate::File;
use cairn_area::{fs_err, StoreDir};
use cairn_proto::locktable::{range, ClientId, InodeLocks, LockTable, Owner, Refusal};
use cairn_proto::{LockOwner, Request, Response};
use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

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
    /// Per inode: the locks this client holds by delegation, and the requests in flight.
    local: Mutex<HashMap<u64, LocalEntry>>,
    local_cv: Condvar,
}

/// Where the locks of one inode are, for this client.
#[derive(Debug, Default)]
enum Place {
    /// In the daemon's table.
    #[default]
    Daemon,
    /// Asking the daemon for them (`Delegate`).
    Asking,
    /// Here: every request on the inode is answered locally.
    Held(LockTable),
    /// Giving them back (`ReturnLocks`).
    Returning,
}

#[derive(Debug, Default)]
struct LocalEntry {
    place: Place,
    /// Requests on the inode sent to the daemon and not answered yet (no delegation is
    /// asked for while there are any).
    inflight: u32,
    /// When a delegation was refused or taken back: none is asked for until
    /// `DELEGATION_BACKOFF` later.
    setback: Option<Instant>,
}

/// How long after a refusal or a recall no delegation is asked for.
const DELEGATION_BACKOFF: Duration = Duration::from_millis(100);

/// The owner id of this client's locks in its local tables.
const ME: ClientId = 0;

/// Where a lock request goes.
enum Route<'a, R> {
    /// Answered locally.
    Done(R),
    /// To the daemon; the guard counts it in flight.
    Daemon(Inflight<'a>),
}

/// A request on `ino` in flight to the daemon.
struct Inflight<'a> {
    locks: &'a ClientLocks,
    ino: u64,
}

impl Drop for Inflight<'_> {
    fn drop(&mut self) {
        let mut m = guard(&self.locks.local);
        if let Some(e) = m.get_mut(&self.ino) {
            e.inflight -= 1;
            if e.inflight == 0 && matches!(e.place, Place::Daemon) && e.setback.is_none() {
                m.remove(&self.ino);
            }
        }
        drop(m);
        self.locks.local_cv.notify_all();
    }
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
            local: Mutex::new(HashMap::new()),
            local_cv: Condvar::new(),
        }
    }

    /// Route a request on `ino`: `op` runs on the local table when this client holds the
    /// inode's locks (asking for them first when `ask` and nothing is in flight); it
    /// returns `None` when the request must wait for a conflict, which only the daemon
    /// does: the locks are then given back and the request goes to the daemon.
    fn route<R>(
        &self,
        fs: &Inner,
        ino: u64,
        ask: bool,
        mut op: impl FnMut(&mut LockTable) -> Option<R>,
    ) -> io::Result<Route<'_, R>> {
        let mut m = guard(&self.local);
        loop {
            let e = m.entry(ino).or_default();
            match &mut e.place {
                Place::Asking | Place::Returning => {
                    m = self.local_cv.wait(m).unwrap_or_else(|p| p.into_inner());
                }
                Place::Held(t) => {
                    if let Some(r) = op(t) {
                        return Ok(Route::Done(r));
                    }
                    drop(m);
                    self.give_back(fs, ino);
                    m = guard(&self.local);
                }
                Place::Daemon => {
                    let backed_off = e.setback.is_none_or(|t| t.elapsed() >= DELEGATION_BACKOFF);
                    if ask && e.inflight == 0 && backed_off {
                        e.place = Place::Asking;
                        drop(m);
                        let r = self.call(fs, &Request::Delegate { ino });
                        m = guard(&self.local);
                        let e = m.entry(ino).or_default();
                        match r {
                            Ok(Response::Delegated(held)) => {
                                let mut t = LockTable::default();
                                t.put_inode(ino, InodeLocks::of_client(&held, ME));
                                e.place = Place::Held(t);
                                e.setback = None;
                            }
                            _ => {
                                e.place = Place::Daemon;
                                e.setback = Some(Instant::now());
                            }
                        }
                        self.local_cv.notify_all();
                        continue;
                    }
                    e.inflight += 1;
                    return Ok(Route::Daemon(Inflight { locks: self, ino }));
                }
            }
        }
    }

    /// Give the locks of `ino` back to the daemon if this client holds them (a recall,
    /// or a request that must wait).
    pub(crate) fn give_back(&self, fs: &Inner, ino: u64) {
        let mut m = guard(&self.local);
        let t = loop {
            let Some(e) = m.get_mut(&ino) else { return };
            match &mut e.place {
                Place::Asking | Place::Returning => {
                    m = self.local_cv.wait(m).unwrap_or_else(|p| p.into_inner());
                }
                Place::Daemon => return,
                Place::Held(_) => {
                    e.setback = Some(Instant::now());
                    match std::mem::replace(&mut e.place, Place::Returning) {
                        Place::Held(t) => break t,
                        _ => unreachable!("held"),
                    }
                }
            }
        };
        drop(m);
        let mut t = t;
        let locks = t.take_inode(ino).held_by(ME);
        // If the daemon cannot be told (it is gone), its successor knows no locks anyway.
        let _ = self.call(fs, &Request::ReturnLocks { ino, locks });
        let mut m = guard(&self.local);
        if let Some(e) = m.get_mut(&ino) {
            e.place = Place::Daemon;
        }
        drop(m);
        self.local_cv.notify_all();
    }

    /// After re-attaching to a restarted daemon: locks held here are forgotten, as the
    /// new daemon forgot every lock (module docs, "Daemon restart").
    pub(crate) fn forget_delegations(&self) {
        let mut m = guard(&self.local);
        for e in m.values_mut() {
            if matches!(e.place, Place::Held(_)) {
                e.place = Place::Daemon;
            }
        }
        drop(m);
        self.local_cv.notify_all();
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
    let local = fs.locks.route(fs, ino, false, |t| {
        if let Some(f) = file {
            t.release_file(ME, f, ino);
        }
        if posix {
            t.release_posix(ME, ino);
        }
        Some(())
    });
    if let Ok(Route::Daemon(_inflight)) = local {
        let _ = fs
            .locks
            .call(fs, &Request::ReleaseLocks { ino, file, posix });
    }
}

/// The local owner standing for `owner`.
fn local_owner(owner: LockOwner) -> Owner {
    match owner {
        LockOwner::Ofd { file } => Owner::Ofd(ME, file),
        _ => Owner::Posix(ME),
    }
}

fn conflict(what: &str) -> io::Error {
    fs_err(
        libc::EAGAIN,
        format!("{what}: conflicting lock held by another owner"),
    )
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
        let (s, e) = range(start, len).map_err(|n| fs_err(n, "lock: bad range"))?;
        let pid = fs.pid;
        let route = fs.locks.route(fs, ino, true, |t| {
            match t.set_record(ino, local_owner(owner), pid, Some(typ), s, e) {
                Ok(()) => Some(Ok(())),
                Err(Refusal::Conflict) if wait => None,
                Err(Refusal::Conflict) => Some(Err(conflict("lock"))),
            }
        })?;
        let _inflight = match route {
            Route::Done(r) => return r,
            Route::Daemon(g) => g,
        };
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
        let (s, e) = range(start, len).map_err(|n| fs_err(n, "unlock: bad range"))?;
        let pid = fs.pid;
        let route = fs.locks.route(fs, ino, false, |t| {
            let _ = t.set_record(ino, local_owner(owner), pid, None, s, e);
            Some(())
        })?;
        let _inflight = match route {
            Route::Done(()) => return Ok(()),
            Route::Daemon(g) => g,
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
        let (s, e) = range(start, len).map_err(|n| fs_err(n, "get_lock: bad range"))?;
        let route = fs.locks.route(fs, ino, true, |t| {
            Some(
                t.test_record(ino, local_owner(owner), typ, s, e)
                    .map(|l| l.info()),
            )
        })?;
        let _inflight = match route {
            Route::Done(c) => return Ok(c),
            Route::Daemon(g) => g,
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
                let pid = fs.pid;
                let route = fs.locks.route(fs, ino, false, |t| {
                    let _ = t.set_flock(ino, ME, fl.id, pid, None);
                    Some(())
                })?;
                let _inflight = match route {
                    Route::Done(()) => return Ok(()),
                    Route::Daemon(g) => g,
                };
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
        let pid = fs.pid;
        let route = fs.locks.route(fs, ino, true, |t| {
            match t.set_flock(ino, ME, fl.id, pid, Some(typ)) {
                Ok(()) => Some(Ok(())),
                Err(Refusal::Conflict) if wait => None,
                Err(Refusal::Conflict) => Some(Err(fs_err(
                    libc::EWOULDBLOCK,
                    "flock: conflicting flock held by another handle",
                ))),
            }
        })?;
        let _inflight = match route {
            Route::Done(r) => return r,
            Route::Daemon(g) => g,
        };
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
