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

pub(crate) use cairn_proto::locktable::{
    range, ClientId, InodeLocks, LockTable, Owner, Refusal, OFFSET_MAX,
};
use cairn_proto::{HeldLocks, LockOwner, LockType, Response};
use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

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
    delegated: HashMap<u64, Delegation>,
    counters: LockCounters,
}

/// What the lock service did since the daemon started (`cairn status`, "sharing").
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct LockCounters {
    /// Requests served from the daemon's table (lock, unlock, test, release).
    pub requests: u64,
    /// Inodes whose locks were handed to a client.
    pub delegations: u64,
    /// Recalls of delegated locks sent.
    pub recalls: u64,
}

/// How often a waiting request checks whether its connection was closed.
const CANCEL_POLL: Duration = Duration::from_millis(100);

/// Reaching a client to recall the locks it holds by delegation (its upcall channel).
pub(crate) trait Recall: Send + Sync {
    /// Whether a recall can be sent to `slot` (it has an upcall channel).
    fn reachable(&self, slot: u32) -> bool;
    /// Send `RecallLocks { ino }` to `slot`; false if it could not be sent.
    fn recall(&self, slot: u32, ino: u64) -> bool;
}

/// The lock table behind its own mutex, with a condition variable for waiting requests.
#[derive(Default)]
pub(crate) struct LockService {
    st: Mutex<ServiceState>,
    cv: Condvar,
    recaller: std::sync::OnceLock<std::sync::Arc<dyn Recall>>,
}

impl std::fmt::Debug for LockService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockService").finish_non_exhaustive()
    }
}

/// The locks of an inode are held by one client (PROTOCOL.md, "Lock delegation").
#[derive(Debug, Clone)]
struct Delegation {
    client: ClientId,
    /// When the recall was last sent (None: not recalled).
    recalled: Option<Instant>,
    /// The client's own locks that left the table with the grant: put back if the
    /// client turns out never to have received it.
    taken: HeldLocks,
}

/// How often an unanswered recall is sent again.
const RECALL_AGAIN: Duration = Duration::from_secs(1);

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

    /// The state, for a lock request from a client (counted).
    fn request_state(&self) -> MutexGuard<'_, ServiceState> {
        let mut st = self.state();
        st.counters.requests += 1;
        st
    }

    /// Lock requests served, delegations granted and recalls sent since the start.
    pub(crate) fn counters(&self) -> LockCounters {
        self.state().counters
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
            st.delegated.retain(|_, d| d.client != c);
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
        // Its delegated locks die with it (the daemon never had them).
        st.delegated.retain(|_, d| d.client != id);
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

    /// Where recalls go (the daemon's lease manager); without one nothing is delegated.
    pub(crate) fn set_recaller(&self, r: std::sync::Arc<dyn Recall>) {
        let _ = self.recaller.set(r);
    }

    /// Before `client` acts on `ino`'s locks: if another client holds them by delegation,
    /// recall them and wait until they are back in the table (or that client is gone).
    /// A delegation to `client` itself that it no longer knows of (it only asks the
    /// daemon once it gave its locks back) ends. `Err(None)`: the requester went away.
    // The error is the ready-made answer (as `bind`'s), returned once per request.
    #[allow(clippy::result_large_err)]
    fn settle<'a>(
        &'a self,
        mut st: MutexGuard<'a, ServiceState>,
        client: ClientId,
        ino: u64,
        deadline: Option<Instant>,
        cancelled: &mut dyn FnMut() -> bool,
    ) -> Result<MutexGuard<'a, ServiceState>, Option<Response>> {
        loop {
            let Some(d) = st.delegated.get(&ino) else {
                return Ok(st);
            };
            let (holder, recalled) = (d.client, d.recalled);
            if holder == client {
                // The client never got the grant (it asks the daemon again only after
                // giving locks back): its locks go back in the table.
                Self::undelegate(&mut st, ino);
                return Ok(st);
            }
            if let Err(r) = Self::live(&st, client) {
                return Err(Some(r));
            }
            let now = Instant::now();
            if recalled.is_none_or(|t| now.duration_since(t) >= RECALL_AGAIN) {
                let slot = st.clients.get(&holder).map(|e| e.slot);
                let sent = match (slot, self.recaller.get()) {
                    (Some(slot), Some(r)) => r.recall(slot, ino),
                    _ => false,
                };
                st.counters.recalls += u64::from(sent);
                if let Some(e) = st.delegated.get_mut(&ino) {
                    // Not sent: try again at the next turn.
                    e.recalled = sent.then_some(now);
                }
            }
            if deadline.is_some_and(|t| now >= t) {
                return Err(Some(error(
                    libc::ETIMEDOUT,
                    "timed out waiting for the lock",
                )));
            }
            st = match self.cv.wait_timeout(st, Duration::from_millis(10)) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
            if cancelled() {
                return Err(None);
            }
        }
    }

    /// `Delegate`: hand `ino`'s locks to `client` if nobody else holds or waits for one
    /// (and `client` can be recalled).
    pub(crate) fn delegate(&self, client: ClientId, ino: u64) -> Response {
        let mut st = self.state();
        let slot = match st.clients.get(&client) {
            Some(e) => e.slot,
            None => return error(libc::ESTALE, "the client of this lock channel is gone"),
        };
        match st.delegated.get(&ino) {
            Some(d) if d.client != client => {
                return error(libc::EBUSY, "another client holds these locks")
            }
            // Granted before, but the answer never arrived: start again from the table.
            Some(_) => Self::undelegate(&mut st, ino),
            None => {}
        }
        if st.table.used_by_others(ino, client) {
            return error(libc::EBUSY, "another client holds or waits for a lock");
        }
        if !self.recaller.get().is_some_and(|r| r.reachable(slot)) {
            return error(libc::EBUSY, "no upcall channel to recall the locks through");
        }
        st.counters.delegations += 1;
        let held = st.table.take_inode(ino).held_by(client);
        st.delegated.insert(
            ino,
            Delegation {
                client,
                recalled: None,
                taken: held.clone(),
            },
        );
        Response::Delegated(held)
    }

    /// End the delegation of `ino`, putting back the holder's locks taken at the grant.
    fn undelegate(st: &mut ServiceState, ino: u64) {
        if let Some(d) = st.delegated.remove(&ino) {
            st.table
                .put_inode(ino, InodeLocks::of_client(&d.taken, d.client));
        }
    }

    /// `ReturnLocks`: the delegation of `ino` to `client` ends; its locks go back in the
    /// table. A return for a delegation that already ended changes nothing.
    pub(crate) fn return_locks(&self, client: ClientId, ino: u64, held: &HeldLocks) -> Response {
        let mut st = self.state();
        if st.delegated.get(&ino).is_some_and(|d| d.client == client) {
            st.delegated.remove(&ino);
            st.table.put_inode(ino, InodeLocks::of_client(held, client));
        }
        drop(st);
        self.cv.notify_all();
        Response::Ok
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
        let st = match self.settle(self.request_state(), client, ino, None, &mut || false) {
            Ok(st) => st,
            Err(r) => return r.unwrap_or_else(|| error(libc::ESTALE, "gone")),
        };
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
        let mut st = match self.settle(self.request_state(), client, ino, None, &mut || false) {
            Ok(st) => st,
            Err(r) => return r.unwrap_or_else(|| error(libc::ESTALE, "gone")),
        };
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
        let mut st = match self.settle(self.request_state(), client, ino, None, &mut || false) {
            Ok(st) => st,
            Err(r) => return r.unwrap_or_else(|| error(libc::ESTALE, "gone")),
        };
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
        let mut st = self.request_state();
        let out = loop {
            // At each turn: a delegation granted meanwhile is recalled first.
            st = match self.settle(st, client, r.ino, deadline, cancelled) {
                Ok(g) => g,
                Err(resp) => {
                    st = self.state();
                    break resp;
                }
            };
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
    use cairn_proto::locktable::conflicts;
    use cairn_proto::LockInfo;
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

    /// A recaller that plays the holder: on a recall it gives back what `held` says.
    struct FakeHolder {
        svc: std::sync::Weak<LockService>,
        client: ClientId,
        held: Mutex<HeldLocks>,
        recalls: std::sync::atomic::AtomicU32,
    }

    impl Recall for FakeHolder {
        fn reachable(&self, _slot: u32) -> bool {
            true
        }
        fn recall(&self, _slot: u32, ino: u64) -> bool {
            self.recalls
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let (svc, client) = (self.svc.clone(), self.client);
            let held = self.held.lock().unwrap().clone();
            // Answered later, from another thread, as a client's upcall thread does.
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                if let Some(s) = svc.upgrade() {
                    s.return_locks(client, ino, &held);
                }
            });
            true
        }
    }

    #[test]
    fn delegation_recall_and_return() {
        let s = Arc::new(LockService::default());
        s.add_client(1, 100, 0, 1);
        s.add_client(2, 200, 1, 1);
        // Client 1 holds a write lock through the daemon, then takes the inode's locks.
        assert_eq!(
            errno(s.lock(1, req(LockOwner::Posix, Write, 0, 10, false), &mut never())),
            0
        );
        // Without a way to recall, nothing is delegated.
        assert!(matches!(
            s.delegate(1, 7),
            Response::Error {
                errno: libc::EBUSY,
                ..
            }
        ));
        let fake = Arc::new(FakeHolder {
            svc: Arc::downgrade(&s),
            client: 1,
            held: Mutex::new(HeldLocks::default()),
            recalls: Default::default(),
        });
        s.set_recaller(fake.clone());
        let Response::Delegated(held) = s.delegate(1, 7) else {
            panic!("not delegated")
        };
        assert_eq!(held.records, vec![(LockOwner::Posix, Write, 0, 9, 100)]);
        assert!(s.table_is_empty(), "the locks left the daemon's table");
        // Another client cannot take the delegation; its lock request recalls it, and
        // the holder's returned lock conflicts.
        assert!(matches!(
            s.delegate(2, 7),
            Response::Error {
                errno: libc::EBUSY,
                ..
            }
        ));
        *fake.held.lock().unwrap() = held;
        assert_eq!(
            errno(s.lock(2, req(LockOwner::Posix, Read, 5, 1, false), &mut never())),
            libc::EAGAIN
        );
        assert_eq!(fake.recalls.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Back in the table; client 1 may take the inode again (only it holds a lock),
        // and client 2's test recalls it once more.
        let Response::Delegated(held) = s.delegate(1, 7) else {
            panic!("not delegated")
        };
        assert_eq!(held.records, vec![(LockOwner::Posix, Write, 0, 9, 100)]);
        *fake.held.lock().unwrap() = held;
        let Response::LockConflict(Some(c)) = s.get_lock(2, 7, LockOwner::Posix, Read, 0, 1) else {
            panic!("no conflict")
        };
        assert_eq!((c.typ, c.start, c.pid), (Write, 0, 100));
        // A grant whose answer never reached the client: its next request to the daemon
        // ends the delegation and its locks are in the table again.
        let Response::Delegated(_) = s.delegate(1, 7) else {
            panic!("not delegated")
        };
        assert_eq!(
            errno(s.lock(1, req(LockOwner::Posix, Write, 20, 1, false), &mut never())),
            0
        );
        let Response::LockConflict(Some(c)) = s.get_lock(2, 7, LockOwner::Posix, Read, 0, 1) else {
            panic!("the lock taken with the lost grant is gone")
        };
        assert_eq!((c.start, c.pid), (0, 100));
        s.unlock(1, 7, LockOwner::Posix, 20, 1);
        // A holder that dies takes its delegation and locks along.
        let Response::Delegated(_) = s.delegate(1, 7) else {
            panic!("not delegated")
        };
        s.remove_client(1);
        assert_eq!(
            errno(s.lock(2, req(LockOwner::Posix, Write, 0, 0, false), &mut never())),
            0
        );
        // Counted: the seven requests the table served, four grants, every recall.
        let c = s.counters();
        assert_eq!((c.requests, c.delegations), (7, 4));
        assert_eq!(
            c.recalls,
            u64::from(fake.recalls.load(std::sync::atomic::Ordering::SeqCst))
        );
        assert!(c.recalls >= 2);
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
