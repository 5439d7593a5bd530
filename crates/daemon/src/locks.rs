//! Advisory file locks held by the daemon for its clients: POSIX record locks (owned by
//! a client process), OFD record locks (owned by one open file handle of a client) and
//! `flock` whole-file locks (owned by one handle), with Linux's semantics.
//!
//! * [`LockTable`] is the pure state: per inode the record locks (POSIX and OFD share one
//!   namespace and conflict with each other, as on Linux) and the `flock` locks (a
//!   separate namespace), plus the requests that are waiting (for deadlock detection).
//! * [`LockService`] wraps a table in its own mutex and a condition variable: blocking
//!   requests wait on the condition variable, never holding any other daemon lock, and
//!   every change wakes them to retry. It also knows which clients are alive: removing a
//!   client drops all of its locks and cancels its waiting requests at once.
//!
//! No I/O here; the socket side is `lock_server`.

use cairn_proto::{LockInfo, LockOwner, LockType, Response};
use std::collections::{HashMap, HashSet};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The largest file offset (Linux's `OFFSET_MAX`); a lock with `len` 0 ends here.
pub(crate) const OFFSET_MAX: u64 = i64::MAX as u64;

/// A client: the id of its registered connection (unique for the daemon's lifetime).
pub(crate) type ClientId = u64;

/// The owner of a record lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Owner {
    /// POSIX lock: the client process.
    Posix(ClientId),
    /// OFD lock: one handle (`file`) of the client.
    Ofd(ClientId, u64),
}

impl Owner {
    pub(crate) fn client(&self) -> ClientId {
        match *self {
            Owner::Posix(c) | Owner::Ofd(c, _) => c,
        }
    }
}

/// One record lock over the inclusive byte range `[start, end]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordLock {
    pub owner: Owner,
    pub typ: LockType,
    pub start: u64,
    pub end: u64,
    pub pid: u32,
}

impl RecordLock {
    /// As `F_GETLK` reports it.
    pub(crate) fn info(&self) -> LockInfo {
        LockInfo {
            typ: self.typ,
            start: self.start,
            len: if self.end == OFFSET_MAX {
                0
            } else {
                self.end - self.start + 1
            },
            pid: match self.owner {
                Owner::Posix(_) => self.pid as i32,
                Owner::Ofd(..) => -1,
            },
        }
    }
}

/// One `flock` lock (whole file) of handle `file` of `client`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FlockLock {
    pub client: ClientId,
    pub file: u64,
    pub typ: LockType,
    pub pid: u32,
}

#[derive(Debug, Default, Clone)]
struct InodeLocks {
    records: Vec<RecordLock>,
    flocks: Vec<FlockLock>,
}

impl InodeLocks {
    fn is_empty(&self) -> bool {
        self.records.is_empty() && self.flocks.is_empty()
    }
}

/// A record-lock request that waits (only these matter for deadlock detection).
#[derive(Debug, Clone, Copy)]
struct Waiter {
    owner: Owner,
    ino: u64,
    typ: LockType,
    start: u64,
    end: u64,
}

/// Why a lock was not granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Another owner holds a conflicting lock.
    Conflict,
}

/// `[start, start + len)` as an inclusive range (`len` 0: to `OFFSET_MAX`). Errors as
/// Linux: `EINVAL` for a start beyond `OFFSET_MAX`, `EOVERFLOW` when the end is.
pub(crate) fn range(start: u64, len: u64) -> Result<(u64, u64), i32> {
    if start > OFFSET_MAX {
        return Err(libc::EINVAL);
    }
    if len == 0 {
        return Ok((start, OFFSET_MAX));
    }
    if len - 1 > OFFSET_MAX - start {
        return Err(libc::EOVERFLOW);
    }
    Ok((start, start + (len - 1)))
}

fn conflicts(a: LockType, b: LockType) -> bool {
    a == LockType::Write || b == LockType::Write
}

/// All lock state of the daemon.
#[derive(Debug, Default)]
pub(crate) struct LockTable {
    inodes: HashMap<u64, InodeLocks>,
    waiters: HashMap<u64, Waiter>,
    next_waiter: u64,
}

impl LockTable {
    /// The record locks on `ino` (any order).
    pub(crate) fn records(&self, ino: u64) -> &[RecordLock] {
        self.inodes.get(&ino).map_or(&[], |i| &i.records)
    }

    /// The `flock` locks on `ino`.
    #[cfg(test)]
    pub(crate) fn flocks(&self, ino: u64) -> &[FlockLock] {
        self.inodes.get(&ino).map_or(&[], |i| &i.flocks)
    }

    /// Whether the table holds nothing at all.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.inodes.is_empty() && self.waiters.is_empty()
    }

    fn conflicting<'a>(
        &'a self,
        ino: u64,
        owner: Owner,
        typ: LockType,
        start: u64,
        end: u64,
    ) -> impl Iterator<Item = &'a RecordLock> + 'a {
        self.records(ino).iter().filter(move |l| {
            l.owner != owner && l.start <= end && start <= l.end && conflicts(l.typ, typ)
        })
    }

    /// `F_GETLK`: the conflicting lock of another owner with the lowest start, if any.
    pub(crate) fn test_record(
        &self,
        ino: u64,
        owner: Owner,
        typ: LockType,
        start: u64,
        end: u64,
    ) -> Option<RecordLock> {
        self.conflicting(ino, owner, typ, start, end)
            .min_by_key(|l| (l.start, l.end))
            .copied()
    }

    /// `F_SETLK`: give `owner` a `typ` lock over `[start, end]` (`None`: unlock), replacing
    /// whatever it held there (upgrade, downgrade, split) and merging it with its adjacent
    /// or overlapping locks of the same type. A conflict changes nothing.
    pub(crate) fn set_record(
        &mut self,
        ino: u64,
        owner: Owner,
        pid: u32,
        typ: Option<LockType>,
        start: u64,
        end: u64,
    ) -> Result<(), Refusal> {
        debug_assert!(start <= end && end <= OFFSET_MAX);
        if let Some(t) = typ {
            if self.conflicting(ino, owner, t, start, end).next().is_some() {
                return Err(Refusal::Conflict);
            }
        }
        let il = self.inodes.entry(ino).or_default();
        let mut mine = Vec::new();
        il.records.retain(|l| {
            if l.owner == owner {
                mine.push(*l);
                false
            } else {
                true
            }
        });
        let mut kept = Vec::with_capacity(mine.len() + 2);
        for l in mine {
            if l.end < start || l.start > end {
                kept.push(l);
                continue;
            }
            if l.start < start {
                kept.push(RecordLock {
                    end: start - 1,
                    ..l
                });
            }
            if l.end > end {
                kept.push(RecordLock {
                    start: end + 1,
                    ..l
                });
            }
        }
        if let Some(t) = typ {
            kept.push(RecordLock {
                owner,
                typ: t,
                start,
                end,
                pid,
            });
        }
        kept.sort_by_key(|l| l.start);
        let mut merged: Vec<RecordLock> = Vec::with_capacity(kept.len());
        for l in kept {
            match merged.last_mut() {
                // The owner's locks are disjoint: only adjacency is left to merge.
                Some(m) if m.typ == l.typ && m.end.checked_add(1) == Some(l.start) => {
                    m.end = l.end;
                    m.pid = pid;
                }
                _ => merged.push(l),
            }
        }
        il.records.extend(merged);
        if il.is_empty() {
            self.inodes.remove(&ino);
        }
        Ok(())
    }

    /// `flock`: give handle `file` of `client` a `typ` lock on `ino` (`None`: unlock).
    /// As on Linux, a conversion first drops the handle's current lock, so a conversion
    /// that fails leaves the handle without a lock.
    pub(crate) fn set_flock(
        &mut self,
        ino: u64,
        client: ClientId,
        file: u64,
        pid: u32,
        typ: Option<LockType>,
    ) -> Result<(), Refusal> {
        let il = self.inodes.entry(ino).or_default();
        let r = (|| {
            if let Some(i) = il
                .flocks
                .iter()
                .position(|f| f.client == client && f.file == file)
            {
                if Some(il.flocks[i].typ) == typ {
                    return Ok(());
                }
                il.flocks.remove(i);
            }
            let Some(t) = typ else { return Ok(()) };
            if il.flocks.iter().any(|f| conflicts(f.typ, t)) {
                return Err(Refusal::Conflict);
            }
            il.flocks.push(FlockLock {
                client,
                file,
                typ: t,
                pid,
            });
            Ok(())
        })();
        if il.is_empty() {
            self.inodes.remove(&ino);
        }
        r
    }

    /// Whether `owner` (POSIX) waiting for `typ` over `[start, end]` of `ino` would close a
    /// cycle of POSIX owners waiting for each other. OFD owners are never part of a
    /// deadlock (as on Linux: they are not processes).
    pub(crate) fn would_deadlock(
        &self,
        ino: u64,
        owner: Owner,
        typ: LockType,
        start: u64,
        end: u64,
    ) -> bool {
        let Owner::Posix(me) = owner else {
            return false;
        };
        let posix_blockers = |ino, owner, typ, start, end| {
            self.conflicting(ino, owner, typ, start, end)
                .filter_map(|l| match l.owner {
                    Owner::Posix(c) => Some(c),
                    Owner::Ofd(..) => None,
                })
                .collect::<Vec<_>>()
        };
        let mut stack = posix_blockers(ino, owner, typ, start, end);
        let mut seen = HashSet::new();
        while let Some(c) = stack.pop() {
            if c == me {
                return true;
            }
            if !seen.insert(c) {
                continue;
            }
            for w in self.waiters.values() {
                if w.owner == Owner::Posix(c) {
                    stack.extend(posix_blockers(w.ino, w.owner, w.typ, w.start, w.end));
                }
            }
        }
        false
    }

    /// Record a waiting record-lock request; returns its id.
    fn add_waiter(&mut self, owner: Owner, ino: u64, typ: LockType, start: u64, end: u64) -> u64 {
        self.next_waiter += 1;
        let id = self.next_waiter;
        self.waiters.insert(
            id,
            Waiter {
                owner,
                ino,
                typ,
                start,
                end,
            },
        );
        id
    }

    fn remove_waiter(&mut self, id: u64) {
        self.waiters.remove(&id);
    }

    /// Drop every lock matching `pred` on `ino` (records) and `fpred` (flocks).
    fn release_where(
        &mut self,
        ino: Option<u64>,
        pred: impl Fn(&RecordLock) -> bool,
        fpred: impl Fn(&FlockLock) -> bool,
    ) {
        let mut drop_inos = Vec::new();
        for (&i, il) in self.inodes.iter_mut() {
            if ino.is_some_and(|x| x != i) {
                continue;
            }
            il.records.retain(|l| !pred(l));
            il.flocks.retain(|f| !fpred(f));
            if il.is_empty() {
                drop_inos.push(i);
            }
        }
        for i in drop_inos {
            self.inodes.remove(&i);
        }
    }

    /// The POSIX close rule: closing any handle of `ino` drops all of the client's POSIX
    /// locks on it.
    pub(crate) fn release_posix(&mut self, client: ClientId, ino: u64) {
        self.release_where(Some(ino), |l| l.owner == Owner::Posix(client), |_| false);
    }

    /// Handle `file` of `client` closed: drop its OFD and flock locks on `ino`.
    pub(crate) fn release_file(&mut self, client: ClientId, file: u64, ino: u64) {
        self.release_where(
            Some(ino),
            |l| l.owner == Owner::Ofd(client, file),
            |f| f.client == client && f.file == file,
        );
    }

    /// The client is gone: drop all of its locks and waiting requests.
    pub(crate) fn release_client(&mut self, client: ClientId) {
        self.release_where(None, |l| l.owner.client() == client, |f| f.client == client);
        self.waiters.retain(|_, w| w.owner.client() != client);
    }
}

/// What a registered client is, for lock requests.
#[derive(Debug, Clone, Copy)]
struct ClientEntry {
    pid: u32,
    slot: u32,
    slot_gen: u64,
}

#[derive(Debug, Default)]
struct ServiceState {
    table: LockTable,
    clients: HashMap<ClientId, ClientEntry>,
}

/// How often a waiting request checks whether its connection was closed.
const CANCEL_POLL: Duration = Duration::from_millis(100);

/// The lock table behind its own mutex, with a condition variable for waiting requests.
#[derive(Debug, Default)]
pub(crate) struct LockService {
    st: Mutex<ServiceState>,
    cv: Condvar,
}

fn error(errno: i32, message: impl Into<String>) -> Response {
    Response::Error {
        errno,
        message: message.into(),
    }
}

/// A lock request, as the service takes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LockRequest {
    pub ino: u64,
    pub owner: LockOwner,
    pub typ: LockType,
    pub start: u64,
    pub len: u64,
    pub wait: bool,
    pub timeout: Option<Duration>,
}

impl LockService {
    fn state(&self) -> MutexGuard<'_, ServiceState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A client registered (or re-attached) on connection `id`. A previous client of the
    /// same slot is gone: its locks are dropped.
    pub(crate) fn add_client(&self, id: ClientId, pid: u32, slot: u32, slot_gen: u64) {
        let mut st = self.state();
        let stale: Vec<ClientId> = st
            .clients
            .iter()
            .filter(|(&c, e)| c != id && e.slot == slot)
            .map(|(&c, _)| c)
            .collect();
        for c in stale {
            st.clients.remove(&c);
            st.table.release_client(c);
        }
        st.clients.insert(
            id,
            ClientEntry {
                pid,
                slot,
                slot_gen,
            },
        );
        drop(st);
        self.cv.notify_all();
    }

    /// The client's connection closed (it left or died): drop all of its locks and
    /// cancel its waiting requests, at once.
    pub(crate) fn remove_client(&self, id: ClientId) {
        let mut st = self.state();
        if st.clients.remove(&id).is_none() {
            return;
        }
        st.table.release_client(id);
        drop(st);
        self.cv.notify_all();
    }

    /// A lock channel for `slot`/`slot_gen` opened by process `pid`: the client it acts for.
    // The error is the ready-made answer to the client (a large enum, but returned once
    // per request, not in a loop).
    #[allow(clippy::result_large_err)]
    pub(crate) fn bind(&self, slot: u32, slot_gen: u64, pid: u32) -> Result<ClientId, Response> {
        let st = self.state();
        let found = st
            .clients
            .iter()
            .find(|(_, e)| e.slot == slot && e.slot_gen == slot_gen);
        match found {
            None => Err(error(
                libc::ESTALE,
                format!("lock channel: no live client on slot {slot} generation {slot_gen}"),
            )),
            Some((_, e)) if e.pid != pid => Err(error(
                libc::EPERM,
                format!(
                    "lock channel: slot {slot} belongs to pid {}, not to pid {pid}",
                    e.pid
                ),
            )),
            Some((&c, _)) => Ok(c),
        }
    }

    #[allow(clippy::result_large_err)]
    fn live(st: &ServiceState, client: ClientId) -> Result<u32, Response> {
        st.clients
            .get(&client)
            .map(|e| e.pid)
            .ok_or_else(|| error(libc::ESTALE, "the client of this lock channel is gone"))
    }

    /// `F_GETLK` / `F_OFD_GETLK`.
    pub(crate) fn get_lock(
        &self,
        client: ClientId,
        ino: u64,
        owner: LockOwner,
        typ: LockType,
        start: u64,
        len: u64,
    ) -> Response {
        let st = self.state();
        if let Err(r) = Self::live(&st, client) {
            return r;
        }
        let owner = match owner {
            LockOwner::Posix => Owner::Posix(client),
            LockOwner::Ofd { file } => Owner::Ofd(client, file),
            LockOwner::Flock { .. } => {
                return error(libc::EINVAL, "GetLock: flock locks cannot be tested")
            }
        };
        let (start, end) = match range(start, len) {
            Ok(r) => r,
            Err(e) => return error(e, "GetLock: bad range"),
        };
        Response::LockConflict(
            st.table
                .test_record(ino, owner, typ, start, end)
                .map(|l| l.info()),
        )
    }

    /// Unlock a range (record owners) or the handle's flock lock. Always succeeds for a
    /// valid request.
    pub(crate) fn unlock(
        &self,
        client: ClientId,
        ino: u64,
        owner: LockOwner,
        start: u64,
        len: u64,
    ) -> Response {
        let mut st = self.state();
        let pid = match Self::live(&st, client) {
            Ok(p) => p,
            Err(r) => return r,
        };
        match owner {
            LockOwner::Flock { file } => {
                let _ = st.table.set_flock(ino, client, file, pid, None);
            }
            LockOwner::Posix | LockOwner::Ofd { .. } => {
                let (start, end) = match range(start, len) {
                    Ok(r) => r,
                    Err(e) => return error(e, "Unlock: bad range"),
                };
                let o = match owner {
                    LockOwner::Ofd { file } => Owner::Ofd(client, file),
                    _ => Owner::Posix(client),
                };
                let _ = st.table.set_record(ino, o, pid, None, start, end);
            }
        }
        drop(st);
        self.cv.notify_all();
        Response::Ok
    }

    /// A handle of `ino` closed (see `Request::ReleaseLocks`).
    pub(crate) fn release(
        &self,
        client: ClientId,
        ino: u64,
        file: Option<u64>,
        posix: bool,
    ) -> Response {
        let mut st = self.state();
        if let Err(r) = Self::live(&st, client) {
            return r;
        }
        if let Some(f) = file {
            st.table.release_file(client, f, ino);
        }
        if posix {
            st.table.release_posix(client, ino);
        }
        drop(st);
        self.cv.notify_all();
        Response::Ok
    }

    /// Take a lock; with `wait`, block (on the condition variable only) until it is
    /// granted, the request would deadlock (`EDEADLK`), the timeout passes (`ETIMEDOUT`),
    /// the client is removed (`ESTALE`) or `cancelled()` says the requester went away
    /// (`None`: the connection is to be closed without an answer).
    pub(crate) fn lock(
        &self,
        client: ClientId,
        r: LockRequest,
        cancelled: &mut dyn FnMut() -> bool,
    ) -> Option<Response> {
        let (start, end) = match r.owner {
            LockOwner::Flock { .. } => (0, OFFSET_MAX),
            _ => match range(r.start, r.len) {
                Ok(x) => x,
                Err(e) => return Some(error(e, "Lock: bad range")),
            },
        };
        let deadline = r.timeout.map(|t| Instant::now() + t);
        let mut waiter = None;
        let mut st = self.state();
        let out = loop {
            let pid = match Self::live(&st, client) {
                Ok(p) => p,
                Err(resp) => break Some(resp),
            };
            let (res, owner) = match r.owner {
                LockOwner::Flock { file } => (
                    st.table.set_flock(r.ino, client, file, pid, Some(r.typ)),
                    None,
                ),
                LockOwner::Posix | LockOwner::Ofd { .. } => {
                    let o = match r.owner {
                        LockOwner::Ofd { file } => Owner::Ofd(client, file),
                        _ => Owner::Posix(client),
                    };
                    (
                        st.table.set_record(r.ino, o, pid, Some(r.typ), start, end),
                        Some(o),
                    )
                }
            };
            match res {
                Ok(()) => break Some(Response::Ok),
                Err(Refusal::Conflict) => {}
            }
            if !r.wait {
                let what = if owner.is_some() {
                    "conflicting lock held by another owner"
                } else {
                    "conflicting flock held by another handle"
                };
                break Some(error(libc::EAGAIN, what));
            }
            if let Some(o) = owner {
                if st.table.would_deadlock(r.ino, o, r.typ, start, end) {
                    break Some(error(libc::EDEADLK, "waiting for this lock would deadlock"));
                }
                if waiter.is_none() {
                    waiter = Some(st.table.add_waiter(o, r.ino, r.typ, start, end));
                }
            }
            let mut nap = CANCEL_POLL;
            if let Some(d) = deadline {
                let now = Instant::now();
                if now >= d {
                    break Some(error(libc::ETIMEDOUT, "timed out waiting for the lock"));
                }
                nap = nap.min(d - now);
            }
            st = match self.cv.wait_timeout(st, nap) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
            if cancelled() {
                break None;
            }
        };
        if let Some(w) = waiter {
            st.table.remove_waiter(w);
        }
        drop(st);
        // Granting may have released ranges (downgrade, flock conversion): wake waiters.
        self.cv.notify_all();
        out
    }

    /// Whether the table is empty (tests).
    #[cfg(test)]
    pub(crate) fn table_is_empty(&self) -> bool {
        self.state().table.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;
    use LockType::{Read, Write};

    const A: Owner = Owner::Posix(1);
    const B: Owner = Owner::Posix(2);
    const C: Owner = Owner::Posix(3);

    fn set(t: &mut LockTable, o: Owner, typ: Option<LockType>, s: u64, len: u64) -> bool {
        let (s, e) = range(s, len).unwrap();
        t.set_record(7, o, o.client() as u32 * 100, typ, s, e)
            .is_ok()
    }

    /// The owner's locks as sorted (type, start, end).
    fn of(t: &LockTable, o: Owner) -> Vec<(LockType, u64, u64)> {
        let mut v: Vec<_> = t
            .records(7)
            .iter()
            .filter(|l| l.owner == o)
            .map(|l| (l.typ, l.start, l.end))
            .collect();
        v.sort_by_key(|x| x.1);
        v
    }

    #[test]
    fn ranges() {
        assert_eq!(range(0, 0), Ok((0, OFFSET_MAX)));
        assert_eq!(range(5, 1), Ok((5, 5)));
        assert_eq!(range(5, 10), Ok((5, 14)));
        assert_eq!(range(OFFSET_MAX, 1), Ok((OFFSET_MAX, OFFSET_MAX)));
        assert_eq!(range(OFFSET_MAX + 1, 0), Err(libc::EINVAL));
        assert_eq!(range(1, OFFSET_MAX + 1), Err(libc::EOVERFLOW));
        assert_eq!(range(0, OFFSET_MAX + 1), Ok((0, OFFSET_MAX)));
        assert_eq!(range(0, u64::MAX), Err(libc::EOVERFLOW));
    }

    #[test]
    fn split_merge_upgrade_downgrade() {
        let mut t = LockTable::default();
        assert!(set(&mut t, A, Some(Read), 0, 100));
        // Punch a write lock in the middle: split into three.
        assert!(set(&mut t, A, Some(Write), 40, 10));
        assert_eq!(
            of(&t, A),
            vec![(Read, 0, 39), (Write, 40, 49), (Read, 50, 99)]
        );
        // Downgrade the middle back: everything merges into one read lock.
        assert!(set(&mut t, A, Some(Read), 40, 10));
        assert_eq!(of(&t, A), vec![(Read, 0, 99)]);
        // Adjacent same-type locks merge; different types stay apart.
        assert!(set(&mut t, A, Some(Read), 100, 10));
        assert_eq!(of(&t, A), vec![(Read, 0, 109)]);
        assert!(set(&mut t, A, Some(Write), 110, 0));
        assert_eq!(of(&t, A), vec![(Read, 0, 109), (Write, 110, OFFSET_MAX)]);
        // Unlock a hole in the middle.
        assert!(set(&mut t, A, None, 10, 5));
        assert_eq!(
            of(&t, A),
            vec![(Read, 0, 9), (Read, 15, 109), (Write, 110, OFFSET_MAX)]
        );
        // Unlock everything.
        assert!(set(&mut t, A, None, 0, 0));
        assert!(t.is_empty());
    }

    #[test]
    fn conflicts_between_owners() {
        let mut t = LockTable::default();
        assert!(set(&mut t, A, Some(Read), 0, 10));
        assert!(set(&mut t, B, Some(Read), 5, 10));
        // Write over another owner's read lock: refused, nothing changes.
        assert!(!set(&mut t, A, Some(Write), 0, 10));
        assert_eq!(of(&t, A), vec![(Read, 0, 9)]);
        // Writes next to it are fine.
        assert!(set(&mut t, C, Some(Write), 15, 0));
        assert!(!set(&mut t, A, Some(Read), 20, 1));
        let c = t.test_record(7, A, Read, 0, OFFSET_MAX).unwrap();
        assert_eq!(
            c.info(),
            LockInfo {
                typ: Write,
                start: 15,
                len: 0,
                pid: 300
            }
        );
        // The first conflict is the one with the lowest start.
        let c = t.test_record(7, A, Write, 0, OFFSET_MAX).unwrap();
        assert_eq!(
            c.info(),
            LockInfo {
                typ: Read,
                start: 5,
                len: 10,
                pid: 200
            }
        );
        // An owner's own locks never conflict.
        assert_eq!(t.test_record(7, C, Write, 15, 100), None);
        // OFD locks conflict with POSIX locks of the same client.
        let ofd = Owner::Ofd(1, 9);
        assert!(!set(&mut t, ofd, Some(Write), 0, 1));
        let c = t.test_record(7, ofd, Write, 0, 1).unwrap();
        assert_eq!(c.info().pid, 100);
        assert!(set(&mut t, ofd, Some(Read), 0, 1));
        assert_eq!(t.test_record(7, A, Write, 0, 1).unwrap().info().pid, -1);
    }

    #[test]
    fn close_rules_and_client_death() {
        let mut t = LockTable::default();
        let a_ofd = Owner::Ofd(1, 5);
        assert!(set(&mut t, A, Some(Write), 0, 10));
        assert!(set(&mut t, a_ofd, Some(Write), 20, 10));
        t.set_flock(7, 1, 5, 100, Some(Write)).unwrap();
        t.set_flock(8, 1, 6, 100, Some(Read)).unwrap();
        // Closing handle 6 (of inode 8): POSIX locks on 7 stay; handle 5's locks stay.
        t.release_file(1, 6, 8);
        t.release_posix(1, 8);
        assert_eq!(t.records(7).len(), 2);
        assert_eq!(t.flocks(8), &[]);
        // Closing another handle of inode 7 drops the POSIX locks only.
        t.release_posix(1, 7);
        assert_eq!(of(&t, A), vec![]);
        assert_eq!(of(&t, a_ofd), vec![(Write, 20, 29)]);
        assert_eq!(t.flocks(7).len(), 1);
        t.release_client(1);
        assert!(t.is_empty());
    }

    #[test]
    fn flock_semantics() {
        let mut t = LockTable::default();
        assert!(t.set_flock(7, 1, 1, 10, Some(Read)).is_ok());
        assert!(t.set_flock(7, 2, 1, 20, Some(Read)).is_ok());
        // Two handles of the same client are different owners.
        assert_eq!(
            t.set_flock(7, 1, 2, 10, Some(Write)),
            Err(Refusal::Conflict)
        );
        // A failed conversion loses the old lock (as on Linux).
        assert_eq!(
            t.set_flock(7, 1, 1, 10, Some(Write)),
            Err(Refusal::Conflict)
        );
        assert_eq!(t.flocks(7).len(), 1);
        assert!(t.set_flock(7, 2, 1, 20, Some(Write)).is_ok());
        assert!(t.set_flock(7, 2, 1, 20, Some(Read)).is_ok());
        assert!(t.set_flock(7, 2, 1, 20, None).is_ok());
        assert!(t.set_flock(7, 2, 1, 20, None).is_ok());
        assert!(t.is_empty());
        // flock and record locks are independent.
        assert!(t.set_flock(7, 1, 1, 10, Some(Write)).is_ok());
        assert!(set(&mut t, B, Some(Write), 0, 0));
    }

    #[test]
    fn deadlock_detection() {
        let mut t = LockTable::default();
        assert!(set(&mut t, A, Some(Write), 0, 1));
        assert!(set(&mut t, B, Some(Write), 1, 1));
        assert!(set(&mut t, C, Some(Write), 2, 1));
        // A waits for B's byte.
        assert!(!t.would_deadlock(7, A, Write, 1, 1));
        let wa = t.add_waiter(A, 7, Write, 1, 1);
        // B waits for C's byte: no cycle.
        assert!(!t.would_deadlock(7, B, Write, 2, 2));
        let wb = t.add_waiter(B, 7, Write, 2, 2);
        // C wanting A's byte closes the cycle A -> B -> C -> A.
        assert!(t.would_deadlock(7, C, Write, 0, 0));
        // ... but a read lock on a byte nobody waits on does not.
        assert!(!t.would_deadlock(7, C, Read, 5, 5));
        // OFD owners do not take part.
        let ofd = Owner::Ofd(3, 1);
        assert!(!t.would_deadlock(7, ofd, Write, 0, 0));
        t.remove_waiter(wb);
        assert!(!t.would_deadlock(7, C, Write, 0, 0));
        t.remove_waiter(wa);
        // A chain through an OFD holder is not followed.
        let mut t = LockTable::default();
        let bo = Owner::Ofd(2, 1);
        assert!(set(&mut t, A, Some(Write), 0, 1));
        assert!(set(&mut t, bo, Some(Write), 1, 1));
        t.add_waiter(bo, 7, Write, 0, 0);
        assert!(!t.would_deadlock(7, A, Write, 1, 1));
    }

    // ------------------------------------------------------------------ service

    fn req(owner: LockOwner, typ: LockType, start: u64, len: u64, wait: bool) -> LockRequest {
        LockRequest {
            ino: 7,
            owner,
            typ,
            start,
            len,
            wait,
            timeout: None,
        }
    }

    fn never() -> impl FnMut() -> bool {
        || false
    }

    fn errno(r: Option<Response>) -> i32 {
        match r {
            Some(Response::Error { errno, .. }) => errno,
            Some(Response::Ok) => 0,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn service_nonblocking_and_errors() {
        let s = LockService::default();
        s.add_client(1, 100, 0, 1);
        s.add_client(2, 200, 1, 1);
        assert_eq!(s.bind(0, 1, 100), Ok(1));
        assert!(matches!(
            s.bind(0, 1, 999),
            Err(Response::Error {
                errno: libc::EPERM,
                ..
            })
        ));
        assert!(matches!(
            s.bind(0, 2, 100),
            Err(Response::Error {
                errno: libc::ESTALE,
                ..
            })
        ));
        assert_eq!(
            errno(s.lock(1, req(LockOwner::Posix, Write, 0, 10, false), &mut never())),
            0
        );
        assert_eq!(
            errno(s.lock(2, req(LockOwner::Posix, Read, 5, 1, false), &mut never())),
            libc::EAGAIN
        );
        assert_eq!(
            errno(s.lock(
                2,
                req(LockOwner::Posix, Read, OFFSET_MAX + 1, 1, false),
                &mut never()
            )),
            libc::EINVAL
        );
        assert_eq!(
            s.get_lock(2, 7, LockOwner::Ofd { file: 3 }, Read, 0, 0),
            Response::LockConflict(Some(LockInfo {
                typ: Write,
                start: 0,
                len: 10,
                pid: 100
            }))
        );
        assert_eq!(
            s.get_lock(1, 7, LockOwner::Posix, Write, 0, 0),
            Response::LockConflict(None)
        );
        // Unknown clients are refused.
        assert_eq!(
            errno(s.lock(3, req(LockOwner::Posix, Read, 0, 1, false), &mut never())),
            libc::ESTALE
        );
        s.remove_client(1);
        assert_eq!(
            s.get_lock(2, 7, LockOwner::Posix, Write, 0, 0),
            Response::LockConflict(None)
        );
        s.remove_client(2);
        assert!(s.table_is_empty());
    }

    #[test]
    fn service_waiter_granted_on_unlock_and_on_death() {
        let s = Arc::new(LockService::default());
        s.add_client(1, 100, 0, 1);
        s.add_client(2, 200, 1, 1);
        assert_eq!(
            errno(s.lock(1, req(LockOwner::Posix, Write, 0, 0, false), &mut never())),
            0
        );
        let s2 = s.clone();
        let h = std::thread::spawn(move || {
            let t0 = Instant::now();
            let r = s2.lock(2, req(LockOwner::Posix, Write, 3, 1, true), &mut never());
            (errno(r), t0.elapsed())
        });
        std::thread::sleep(Duration::from_millis(150));
        assert!(!h.is_finished());
        // Unlocking another range does not help; unlocking byte 3 does, at once.
        assert_eq!(s.unlock(1, 7, LockOwner::Posix, 10, 0), Response::Ok);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!h.is_finished());
        let t = Instant::now();
        assert_eq!(s.unlock(1, 7, LockOwner::Posix, 0, 5), Response::Ok);
        let (e, _) = h.join().unwrap();
        assert_eq!(e, 0);
        assert!(t.elapsed() < Duration::from_millis(50), "{:?}", t.elapsed());

        // Flock waiter granted when the holder dies.
        let fl = LockOwner::Flock { file: 1 };
        assert_eq!(
            errno(s.lock(1, req(fl, Write, 0, 0, false), &mut never())),
            0
        );
        assert_eq!(
            errno(s.lock(2, req(fl, Read, 0, 0, false), &mut never())),
            libc::EAGAIN
        );
        let s2 = s.clone();
        let h =
            std::thread::spawn(move || errno(s2.lock(2, req(fl, Read, 0, 0, true), &mut never())));
        std::thread::sleep(Duration::from_millis(100));
        assert!(!h.is_finished());
        let t = Instant::now();
        s.remove_client(1);
        assert_eq!(h.join().unwrap(), 0);
        assert!(t.elapsed() < Duration::from_millis(50));
    }

    #[test]
    fn service_deadlock_timeout_cancel_and_dead_waiter() {
        let s = Arc::new(LockService::default());
        s.add_client(1, 100, 0, 1);
        s.add_client(2, 200, 1, 1);
        assert_eq!(
            errno(s.lock(1, req(LockOwner::Posix, Write, 0, 1, false), &mut never())),
            0
        );
        assert_eq!(
            errno(s.lock(2, req(LockOwner::Posix, Write, 1, 1, false), &mut never())),
            0
        );
        let s2 = s.clone();
        let h = std::thread::spawn(move || {
            errno(s2.lock(1, req(LockOwner::Posix, Write, 1, 1, true), &mut never()))
        });
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            errno(s.lock(2, req(LockOwner::Posix, Write, 0, 1, true), &mut never())),
            libc::EDEADLK
        );
        // Client 2 dies: 1 gets the lock.
        s.remove_client(2);
        assert_eq!(h.join().unwrap(), 0);
        // Timeout.
        s.add_client(3, 300, 2, 1);
        let mut r = req(LockOwner::Ofd { file: 4 }, Read, 0, 1, true);
        r.timeout = Some(Duration::from_millis(120));
        let t = Instant::now();
        assert_eq!(errno(s.lock(3, r, &mut never())), libc::ETIMEDOUT);
        assert!(t.elapsed() >= Duration::from_millis(120));
        // Cancellation (the connection closed): no answer, waiter removed.
        let mut n = 0;
        let mut cancel = || {
            n += 1;
            n >= 2
        };
        assert_eq!(
            s.lock(3, req(LockOwner::Posix, Read, 0, 1, true), &mut cancel),
            None
        );
        // A waiting client that is removed gets ESTALE and leaves nothing behind.
        let s2 = s.clone();
        let h = std::thread::spawn(move || {
            errno(s2.lock(3, req(LockOwner::Posix, Write, 0, 0, true), &mut never()))
        });
        std::thread::sleep(Duration::from_millis(100));
        s.remove_client(3);
        assert_eq!(h.join().unwrap(), libc::ESTALE);
        s.remove_client(1);
        assert!(s.table_is_empty());
    }

    // ------------------------------------------------------------------ model

    /// Bytes 0..24 are exact; byte 24 stands for every offset from 24 on.
    const N: usize = 25;

    #[derive(Debug, Clone)]
    enum Op {
        Set {
            owner: u8,
            typ: Option<LockType>,
            start: u64,
            len: u64,
        },
        ReleasePosix {
            client: u8,
        },
        ReleaseClient {
            client: u8,
        },
    }

    fn owner_of(o: u8) -> Owner {
        // Owners 0..3 are POSIX owners of clients 0..3; 3..6 OFD handles of clients 0..3.
        if o < 3 {
            Owner::Posix(o as u64)
        } else {
            Owner::Ofd((o - 3) as u64, 1)
        }
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (0u8..6, prop_oneof![Just(None), Just(Some(Read)), Just(Some(Write))], 0u64..20, 0u64..5)
                .prop_map(|(owner, typ, start, len)| Op::Set { owner, typ, start, len }),
            1 => (0u8..3).prop_map(|client| Op::ReleasePosix { client }),
            1 => (0u8..3).prop_map(|client| Op::ReleaseClient { client }),
        ]
    }

    fn covers(start: u64, end: u64, b: usize) -> bool {
        if b == N - 1 {
            end == OFFSET_MAX
        } else {
            start <= b as u64 && b as u64 <= end
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        #[test]
        fn table_matches_byte_model(ops in proptest::collection::vec(op(), 1..60)) {
            let owners: Vec<Owner> = (0..6).map(owner_of).collect();
            // model[owner][byte]
            let mut model = [[None::<LockType>; N]; 6];
            let mut t = LockTable::default();
            for op in ops {
                match op {
                    Op::Set { owner, typ, start, len } => {
                        let (s, e) = range(start, len).unwrap();
                        let o = owners[owner as usize];
                        let conflict = typ.is_some_and(|ty| (0..N).any(|b| covers(s, e, b)
                            && (0..6).any(|x| x != owner as usize
                                && model[x][b].is_some_and(|h| conflicts(h, ty)))));
                        // F_GETLK agrees with the model, and names a real conflict.
                        if let Some(ty) = typ {
                            let got = t.test_record(7, o, ty, s, e);
                            prop_assert_eq!(got.is_some(), conflict);
                            if let Some(l) = got {
                                prop_assert!(l.owner != o && conflicts(l.typ, ty));
                                prop_assert!(l.start <= e && s <= l.end);
                                for m in t.records(7) {
                                    if m.owner != o && conflicts(m.typ, ty) && m.start <= e && s <= m.end {
                                        prop_assert!(l.start <= m.start);
                                    }
                                }
                            }
                        }
                        let r = t.set_record(7, o, 1, typ, s, e);
                        prop_assert_eq!(r.is_err(), conflict);
                        if !conflict {
                            for (b, slot) in model[owner as usize].iter_mut().enumerate() {
                                if covers(s, e, b) {
                                    *slot = typ;
                                }
                            }
                        }
                    }
                    Op::ReleasePosix { client } => {
                        t.release_posix(client as u64, 7);
                        model[client as usize] = [None; N];
                    }
                    Op::ReleaseClient { client } => {
                        t.release_client(client as u64);
                        model[client as usize] = [None; N];
                        model[client as usize + 3] = [None; N];
                    }
                }
                // The table's byte ownership equals the model's ...
                for (x, &o) in owners.iter().enumerate() {
                    let mut got = [None::<LockType>; N];
                    let mut mine: Vec<_> = t.records(7).iter().filter(|l| l.owner == o).copied().collect();
                    mine.sort_by_key(|l| l.start);
                    for w in mine.windows(2) {
                        // ... with disjoint, canonical (merged) locks per owner ...
                        prop_assert!(w[0].end < w[1].start);
                        prop_assert!(!(w[0].typ == w[1].typ && w[0].end + 1 == w[1].start));
                    }
                    for l in &mine {
                        prop_assert!(l.start <= l.end);
                        for (b, g) in got.iter_mut().enumerate() {
                            if covers(l.start, l.end, b) {
                                *g = Some(l.typ);
                            }
                        }
                    }
                    prop_assert_eq!(got, model[x]);
                }
                // ... and no two owners hold conflicting locks.
                let all = t.records(7);
                for a in all {
                    for b in all {
                        if a.owner != b.owner && a.start <= b.end && b.start <= a.end {
                            prop_assert!(a.typ == Read && b.typ == Read);
                        }
                    }
                }
            }
        }

        #[test]
        fn flock_matches_model(ops in proptest::collection::vec((0u8..4, 0u8..3, any::<bool>()), 1..40)) {
            // model[handle]: handles 0,1 of client 0; 2,3 of client 1.
            let mut model = [None::<LockType>; 4];
            let mut t = LockTable::default();
            for (h, op, _) in ops {
                let typ = match op { 0 => None, 1 => Some(Read), _ => Some(Write) };
                let (client, file) = ((h / 2) as u64, h as u64);
                let cur = model[h as usize];
                let r = t.set_flock(7, client, file, 1, typ);
                if cur == typ {
                    prop_assert!(r.is_ok());
                    continue;
                }
                model[h as usize] = None;
                if let Some(ty) = typ {
                    let conflict = (0..4).any(|x| model[x].is_some_and(|m| conflicts(m, ty)));
                    prop_assert_eq!(r.is_err(), conflict);
                    if !conflict {
                        model[h as usize] = Some(ty);
                    }
                }
                let mut got = [None::<LockType>; 4];
                for f in t.flocks(7) {
                    prop_assert!(got[f.file as usize].is_none());
                    got[f.file as usize] = Some(f.typ);
                }
                prop_assert_eq!(got, model);
            }
        }
    }
}
