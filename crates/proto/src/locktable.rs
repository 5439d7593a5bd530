//! The pure state of advisory file locks, with Linux's semantics: POSIX record locks
//! (owned by a client process), OFD record locks (owned by one open file handle) and
//! `flock` whole-file locks (owned by one handle). The daemon holds one table for every
//! client; a client holds one for the inodes whose locks the daemon delegated to it
//! (PROTOCOL.md, "Lock delegation"). No I/O.

use crate::{HeldLocks, LockInfo, LockOwner, LockType};
use std::collections::{HashMap, HashSet};

// Linux's errno values (this crate does not depend on libc).
const EINVAL: i32 = 22;
const EOVERFLOW: i32 = 75;

/// The largest file offset (Linux's `OFFSET_MAX`); a lock with `len` 0 ends here.
pub const OFFSET_MAX: u64 = i64::MAX as u64;

/// A client: the id of its registered connection (unique for the daemon's lifetime).
pub type ClientId = u64;

/// The owner of a record lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Owner {
    /// POSIX lock: the client process.
    Posix(ClientId),
    /// OFD lock: one handle (`file`) of the client.
    Ofd(ClientId, u64),
}

impl Owner {
    pub fn client(&self) -> ClientId {
        match *self {
            Owner::Posix(c) | Owner::Ofd(c, _) => c,
        }
    }
}

/// One record lock over the inclusive byte range `[start, end]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordLock {
    pub owner: Owner,
    pub typ: LockType,
    pub start: u64,
    pub end: u64,
    pub pid: u32,
}

impl RecordLock {
    /// As `F_GETLK` reports it.
    pub fn info(&self) -> LockInfo {
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
pub struct FlockLock {
    pub client: ClientId,
    pub file: u64,
    pub typ: LockType,
    pub pid: u32,
}

#[derive(Debug, Default, Clone)]
pub struct InodeLocks {
    pub records: Vec<RecordLock>,
    pub flocks: Vec<FlockLock>,
}

impl InodeLocks {
    pub fn is_empty(&self) -> bool {
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
pub enum Refusal {
    /// Another owner holds a conflicting lock.
    Conflict,
}

/// `[start, start + len)` as an inclusive range (`len` 0: to `OFFSET_MAX`). Errors as
/// Linux: `EINVAL` for a start beyond `OFFSET_MAX`, `EOVERFLOW` when the end is.
pub fn range(start: u64, len: u64) -> Result<(u64, u64), i32> {
    if start > OFFSET_MAX {
        return Err(EINVAL);
    }
    if len == 0 {
        return Ok((start, OFFSET_MAX));
    }
    if len - 1 > OFFSET_MAX - start {
        return Err(EOVERFLOW);
    }
    Ok((start, start + (len - 1)))
}

pub fn conflicts(a: LockType, b: LockType) -> bool {
    a == LockType::Write || b == LockType::Write
}

/// All lock state of the daemon.
#[derive(Debug, Default)]
pub struct LockTable {
    inodes: HashMap<u64, InodeLocks>,
    waiters: HashMap<u64, Waiter>,
    next_waiter: u64,
}

impl LockTable {
    /// The record locks on `ino` (any order).
    pub fn records(&self, ino: u64) -> &[RecordLock] {
        self.inodes.get(&ino).map_or(&[], |i| &i.records)
    }

    /// The `flock` locks on `ino`.
    pub fn flocks(&self, ino: u64) -> &[FlockLock] {
        self.inodes.get(&ino).map_or(&[], |i| &i.flocks)
    }

    /// Whether the table holds nothing at all.
    pub fn is_empty(&self) -> bool {
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
    pub fn test_record(
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
    pub fn set_record(
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
    pub fn set_flock(
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
    pub fn would_deadlock(
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
    pub fn add_waiter(
        &mut self,
        owner: Owner,
        ino: u64,
        typ: LockType,
        start: u64,
        end: u64,
    ) -> u64 {
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

    pub fn remove_waiter(&mut self, id: u64) {
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
    pub fn release_posix(&mut self, client: ClientId, ino: u64) {
        self.release_where(Some(ino), |l| l.owner == Owner::Posix(client), |_| false);
    }

    /// Handle `file` of `client` closed: drop its OFD and flock locks on `ino`.
    pub fn release_file(&mut self, client: ClientId, file: u64, ino: u64) {
        self.release_where(
            Some(ino),
            |l| l.owner == Owner::Ofd(client, file),
            |f| f.client == client && f.file == file,
        );
    }

    /// The client is gone: drop all of its locks and waiting requests.
    pub fn release_client(&mut self, client: ClientId) {
        self.release_where(None, |l| l.owner.client() == client, |f| f.client == client);
        self.waiters.retain(|_, w| w.owner.client() != client);
    }

    /// Whether anyone other than `client` holds or waits for a lock on `ino`.
    pub fn used_by_others(&self, ino: u64, client: ClientId) -> bool {
        self.inodes.get(&ino).is_some_and(|il| {
            il.records.iter().any(|l| l.owner.client() != client)
                || il.flocks.iter().any(|f| f.client != client)
        }) || self.waiters.values().any(|w| w.ino == ino)
    }

    /// Take every lock on `ino` out of the table.
    pub fn take_inode(&mut self, ino: u64) -> InodeLocks {
        self.inodes.remove(&ino).unwrap_or_default()
    }

    /// Put locks (taken out with [`LockTable::take_inode`], possibly changed) back on
    /// `ino`, next to what is there.
    pub fn put_inode(&mut self, ino: u64, locks: InodeLocks) {
        if locks.is_empty() {
            return;
        }
        let il = self.inodes.entry(ino).or_default();
        il.records.extend(locks.records);
        il.flocks.extend(locks.flocks);
    }
}

impl InodeLocks {
    /// The locks of `client` among these, as they travel (`HeldLocks`).
    pub fn held_by(&self, client: ClientId) -> HeldLocks {
        HeldLocks {
            records: self
                .records
                .iter()
                .filter(|l| l.owner.client() == client)
                .map(|l| {
                    let owner = match l.owner {
                        Owner::Posix(_) => LockOwner::Posix,
                        Owner::Ofd(_, file) => LockOwner::Ofd { file },
                    };
                    (owner, l.typ, l.start, l.end, l.pid)
                })
                .collect(),
            flocks: self
                .flocks
                .iter()
                .filter(|f| f.client == client)
                .map(|f| (f.file, f.typ, f.pid))
                .collect(),
        }
    }

    /// Travelling locks as `client`'s (a `Flock` owner among the records is dropped).
    pub fn of_client(h: &HeldLocks, client: ClientId) -> InodeLocks {
        InodeLocks {
            records: h
                .records
                .iter()
                .filter_map(|&(owner, typ, start, end, pid)| {
                    let owner = match owner {
                        LockOwner::Posix => Owner::Posix(client),
                        LockOwner::Ofd { file } => Owner::Ofd(client, file),
                        LockOwner::Flock { .. } => return None,
                    };
                    (start <= end && end <= OFFSET_MAX).then_some(RecordLock {
                        owner,
                        typ,
                        start,
                        end,
                        pid,
                    })
                })
                .collect(),
            flocks: h
                .flocks
                .iter()
                .map(|&(file, typ, pid)| FlockLock {
                    client,
                    file,
                    typ,
                    pid,
                })
                .collect(),
        }
    }
}
