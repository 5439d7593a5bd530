//! The lease manager (PROTOCOL.md, "Leases"): which client holds a read or write lease
//! on which inode, revocations in progress, the clients' upcall channels and the restart
//! gate.
//!
//! It has its own mutex and condition variable, separate from the core's. Lock order:
//! the core lock may be held while taking the lease lock, never the other way round;
//! and no thread waits for an upcall answer while holding the core lock: a requester
//! waits here (lease lock released while waiting), and whatever needs the shared area
//! (digesting a holder's log, expiring a holder) is done by the caller between waits,
//! with the core lock only.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Longest single wait before re-checking the state.
const POLL: Duration = Duration::from_millis(50);

/// An inode enters shared-write mode at its second lease conflict within this time.
pub(crate) const MEDIATE_WITHIN: Duration = Duration::from_millis(5);
/// It leaves the mode after this long with changes from one client only.
pub(crate) const LEAVE_AFTER: Duration = Duration::from_millis(100);

/// Shared-write mode of an inode (ARCHITECTURE.md, "Shared-write mode"): nobody holds
/// its write lease; its holders (recorded as readers) read it from the shared area and
/// change it through `Commit`, which the daemon applies at once.
#[derive(Debug, Clone)]
struct Mediated {
    /// Start of the current observation window, and the slots that committed in it.
    window: Instant,
    writers: BTreeSet<u32>,
}

/// The holders of one inode's leases.
#[derive(Debug, Default, Clone)]
struct Holders {
    writer: Option<u32>,
    readers: BTreeSet<u32>,
    mediated: Option<Mediated>,
    /// When the latest write lease on the inode was granted (its hold starts then).
    granted: Option<Instant>,
}

impl Holders {
    fn is_empty(&self) -> bool {
        self.writer.is_none() && self.readers.is_empty()
    }
    fn holds(&self, slot: u32) -> bool {
        self.writer == Some(slot) || self.readers.contains(&slot)
    }
    fn remove(&mut self, slot: u32) {
        if self.writer == Some(slot) {
            self.writer = None;
        }
        self.readers.remove(&slot);
    }
}

/// A revocation in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Revoking {
    /// `Revoke` sent (or to be sent once the holder's channel exists); the holder must
    /// answer before the deadline.
    Sent(Instant),
    /// Answered; the holder's log is being digested.
    Acked,
}

/// Why [`Leases::acquire`] returned without a grant: work for the caller (with the core
/// lock, without the lease lock), after which it calls `acquire` again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Holder `slot` did not answer a revocation in time: expire it.
    Expire(u32),
    /// The restart gate's deadline passed: close it.
    GateDue,
    /// The requesting slot is not a live client (any more).
    NotLive,
}

struct Gate {
    deadline: Instant,
    awaiting: HashSet<u32>,
}

/// What [`Leases::acquire`] granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Grant {
    /// The lease asked for.
    Lease,
    /// The inode is in shared-write mode.
    Mediated,
}

#[derive(Default)]
struct State {
    table: HashMap<u64, Holders>,
    /// Time of each inode's latest lease conflict (entries older than
    /// [`MEDIATE_WITHIN`] are pruned now and then).
    conflicted: HashMap<u64, Instant>,
    counters: cairn_proto::SharingStatus,
    /// Revocations in progress: (holder slot, ino).
    pending: HashMap<(u32, u64), Revoking>,
    /// Upcall channel per slot: (connection id, write half).
    channels: HashMap<u32, (u64, UnixStream)>,
    /// Slots whose clients may hold and get leases.
    live: HashSet<u32>,
    /// After a restart: no grants until the slots live at start re-attached, or the
    /// deadline passed.
    gate: Option<Gate>,
}

impl Holders {
    /// The holders standing in the way of `slot`'s lease (`write`: any other holder;
    /// read: another writer).
    fn conflicts(&self, slot: u32, write: bool) -> Vec<u32> {
        let mut c: Vec<u32> = self.writer.filter(|&w| w != slot).into_iter().collect();
        if write {
            c.extend(self.readers.iter().copied().filter(|&r| r != slot));
        }
        c
    }
}

impl State {
    /// Grant `slot` its lease on `ino` (nobody stands in the way), or with `mediate` put
    /// the inode in shared-write mode with `slot` a member.
    fn grant(&mut self, slot: u32, ino: u64, write: bool, mediate: bool, now: Instant) -> Grant {
        if mediate {
            self.counters.mode_entries += 1;
            let e = self.table.entry(ino).or_default();
            e.writer = None;
            e.readers.insert(slot);
            e.mediated = Some(Mediated {
                window: now,
                writers: BTreeSet::new(),
            });
            return Grant::Mediated;
        }
        let e = self.table.entry(ino).or_default();
        // Only write leases are held (revoking a reader digests nothing).
        if write {
            e.granted = Some(now);
            e.readers.remove(&slot);
            e.writer = Some(slot);
        } else if e.writer != Some(slot) {
            e.readers.insert(slot);
        }
        Grant::Lease
    }
}

/// The lease manager.
pub(crate) struct Leases {
    st: Mutex<State>,
    cv: Condvar,
    /// `lease_timeout_ms`.
    pub timeout: Duration,
    /// `lease_hold_us`: a write lease is not revoked sooner than this after its grant.
    hold: Duration,
    /// `shared_write`: regular files may enter shared-write mode.
    shared_write: bool,
    /// [`MEDIATE_WITHIN`] (longer in tests that must not depend on the machine's speed).
    mediate_within: Duration,
}

fn send_revoke(ch: &mut UnixStream, ino: u64) -> bool {
    let mut buf = Vec::new();
    if cairn_proto::send(&mut buf, &cairn_proto::Upcall::Revoke { ino }).is_err() {
        return false;
    }
    ch.write_all(&buf).is_ok()
}

impl Leases {
    /// A lease manager whose restart gate waits for `awaiting` (slots live at start).
    pub(crate) fn new(timeout: Duration, awaiting: &[u32]) -> Leases {
        let st = State {
            live: awaiting.iter().copied().collect(),
            gate: (!awaiting.is_empty()).then(|| Gate {
                deadline: Instant::now() + timeout,
                awaiting: awaiting.iter().copied().collect(),
            }),
            ..State::default()
        };
        Leases {
            st: Mutex::new(st),
            cv: Condvar::new(),
            timeout,
            hold: Duration::ZERO,
            shared_write: true,
            mediate_within: MEDIATE_WITHIN,
        }
    }

    /// Whether regular files may enter shared-write mode (`shared_write`).
    pub(crate) fn shared_write(&self) -> bool {
        self.shared_write
    }

    /// Set the hold time and whether shared-write mode is used.
    pub(crate) fn with_policy(mut self, hold: Duration, shared_write: bool) -> Leases {
        self.hold = hold;
        self.shared_write = shared_write;
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A client registered (or re-attached) on `slot`.
    pub(crate) fn set_live(&self, slot: u32) {
        self.lock().live.insert(slot);
    }

    /// The slot's client is gone (its log was digested) or lost every lease (expiry):
    /// forget its leases and revocations; with `gone`, also its channel and liveness.
    pub(crate) fn drop_slot(&self, slot: u32, gone: bool) {
        let mut g = self.lock();
        g.table.retain(|_, h| {
            h.remove(slot);
            !h.is_empty()
        });
        g.pending.retain(|(s, _), _| *s != slot);
        if gone {
            g.live.remove(&slot);
            g.channels.remove(&slot);
            if let Some(gate) = g.gate.as_mut() {
                gate.awaiting.remove(&slot);
            }
        }
        drop(g);
        self.cv.notify_all();
    }

    /// A digest of `slot`'s log created `inos`: the creator holds their write leases
    /// (an inode number reused by a creation has no other holder).
    pub(crate) fn record_created(&self, slot: u32, inos: &[u64]) {
        if inos.is_empty() {
            return;
        }
        let mut g = self.lock();
        if !g.live.contains(&slot) {
            return;
        }
        for &ino in inos {
            g.table.insert(
                ino,
                Holders {
                    writer: Some(slot),
                    ..Holders::default()
                },
            );
            g.pending.retain(|(_, i), _| *i != ino);
        }
        drop(g);
        self.cv.notify_all();
    }

    /// `slot`'s upcall channel is `ch` (connection `conn`); revocations waiting for it
    /// are sent now.
    pub(crate) fn channel_open(&self, slot: u32, conn: u64, mut ch: UnixStream) {
        let _ = ch.set_write_timeout(Some(Duration::from_millis(200)));
        let mut g = self.lock();
        for (&(s, ino), r) in &g.pending {
            if s == slot && matches!(r, Revoking::Sent(_)) {
                send_revoke(&mut ch, ino);
            }
        }
        g.channels.insert(slot, (conn, ch));
    }

    /// Connection `conn` (an upcall channel of `slot`) closed.
    pub(crate) fn channel_closed(&self, slot: u32, conn: u64) {
        let mut g = self.lock();
        if g.channels.get(&slot).is_some_and(|(c, _)| *c == conn) {
            g.channels.remove(&slot);
        }
    }

    /// A client re-attached after a restart with `leases`. They are recorded unless one
    /// conflicts with a lease already granted; `false` then (none is recorded: the
    /// caller increments the slot's `lease_gen`, so the client drops them all).
    pub(crate) fn reattached(&self, slot: u32, leases: &[(u64, bool)]) -> bool {
        let mut g = self.lock();
        g.live.insert(slot);
        if let Some(gate) = g.gate.as_mut() {
            gate.awaiting.remove(&slot);
        }
        let conflict = leases.iter().any(|&(ino, write)| {
            g.table.get(&ino).is_some_and(|h| {
                h.writer.is_some_and(|w| w != slot)
                    || (write && h.readers.iter().any(|&r| r != slot))
            })
        });
        if !conflict {
            for &(ino, write) in leases {
                let h = g.table.entry(ino).or_default();
                if write {
                    h.readers.remove(&slot);
                    h.writer = Some(slot);
                } else if h.writer != Some(slot) {
                    h.readers.insert(slot);
                }
            }
        }
        drop(g);
        self.cv.notify_all();
        !conflict
    }

    /// If every slot live at start re-attached or the restart gate's deadline passed:
    /// close it and return the slots that never re-attached (the caller increments their
    /// `lease_gen`). `None`: no gate closed now.
    pub(crate) fn close_gate_if_due(&self) -> Option<Vec<u32>> {
        let mut g = self.lock();
        let due = match &g.gate {
            Some(gate) => gate.awaiting.is_empty() || Instant::now() >= gate.deadline,
            None => false,
        };
        if !due {
            return None;
        }
        let gate = g.gate.take().expect("gate");
        drop(g);
        self.cv.notify_all();
        let mut v: Vec<u32> = gate.awaiting.into_iter().collect();
        v.sort_unstable();
        Some(v)
    }

    /// Whether the restart gate is still open.
    pub(crate) fn gate_open(&self) -> bool {
        self.lock().gate.is_some()
    }

    /// Whether `slot` has a revocation whose deadline passed.
    pub(crate) fn overdue(&self, slot: u32) -> bool {
        let now = Instant::now();
        self.lock()
            .pending
            .iter()
            .any(|(&(s, _), r)| s == slot && matches!(r, Revoking::Sent(d) if *d <= now))
    }

    /// Wait until `slot` can be granted the lease on `ino`, revoking conflicting leases
    /// (upcalls) meanwhile. `Ok` once granted; `Err(step)` when the caller has work to do
    /// first. `mediable`: the inode may enter shared-write mode (a regular file, with
    /// `shared_write` on: [`Leases::shared_write`]). Never called with the core lock held.
    pub(crate) fn acquire(
        &self,
        slot: u32,
        ino: u64,
        write: bool,
        mediable: bool,
    ) -> Result<Grant, Step> {
        let mut g = self.lock();
        // Whether this acquisition met a conflict yet (counted once), and whether it
        // decided to put the inode in shared-write mode.
        let mut counted = false;
        let mut mediate = false;
        loop {
            if !g.live.contains(&slot) {
                return Err(Step::NotLive);
            }
            if let Some(gate) = &g.gate {
                let now = Instant::now();
                if gate.awaiting.is_empty() || now >= gate.deadline {
                    return Err(Step::GateDue);
                }
                let wait = (gate.deadline - now).min(POLL);
                g = self
                    .cv
                    .wait_timeout(g, wait)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                continue;
            }
            // Our own lease on it being revoked: let that finish first (our client
            // dropped its cached state; the shared area must have its records first).
            if g.pending.contains_key(&(slot, ino)) {
                g = self
                    .cv
                    .wait_timeout(g, POLL)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                continue;
            }
            let now = Instant::now();
            if let Some(e) = g.table.get_mut(&ino) {
                if e.mediated.is_some() {
                    e.readers.insert(slot);
                    return Ok(Grant::Mediated);
                }
            }
            let h = g.table.get(&ino).cloned().unwrap_or_default();
            let mut conflicts = h.conflicts(slot, write);
            if !conflicts.is_empty() && !counted && mediable && h.writer != Some(slot) {
                counted = true;
                // A second conflict soon after the first: shared-write mode. Only a
                // writer stands in its way (readers become its members).
                mediate = g
                    .conflicted
                    .insert(ino, now)
                    .is_some_and(|t| now.duration_since(t) < self.mediate_within);
                if g.conflicted.len() > 4096 {
                    g.conflicted
                        .retain(|_, t| now.duration_since(*t) < self.mediate_within);
                }
            }
            if mediate {
                conflicts.retain(|&c| h.writer == Some(c));
            }
            if conflicts.is_empty() {
                return Ok(g.grant(slot, ino, write, mediate, now));
            }
            let hold_until = h.writer.and(h.granted).map(|t| t + self.hold);
            let next = self.revoke(&mut g, &conflicts, ino, hold_until, now)?;
            let wait = next
                .saturating_duration_since(now)
                .max(Duration::from_micros(20));
            g = self
                .cv
                .wait_timeout(g, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Ask each holder in `conflicts` to give up its lease on `ino` (unless the writer's
    /// hold time has not passed, `hold_until`); `Err(Expire(h))` when `h` did not answer
    /// in time. Returns when to look again.
    fn revoke(
        &self,
        g: &mut State,
        conflicts: &[u32],
        ino: u64,
        hold_until: Option<Instant>,
        now: Instant,
    ) -> Result<Instant, Step> {
        let mut next = now + POLL;
        for &h in conflicts {
            match g.pending.get(&(h, ino)).copied() {
                None if hold_until.is_some_and(|t| t > now) => {
                    next = next.min(hold_until.expect("some"));
                }
                None => {
                    let deadline = now + self.timeout;
                    g.pending.insert((h, ino), Revoking::Sent(deadline));
                    g.counters.revocations += 1;
                    if let Some((_, ch)) = g.channels.get_mut(&h) {
                        send_revoke(ch, ino);
                    }
                    next = next.min(deadline);
                }
                Some(Revoking::Sent(d)) if d <= now => return Err(Step::Expire(h)),
                Some(Revoking::Sent(d)) => next = next.min(d),
                Some(Revoking::Acked) => {}
            }
        }
        Ok(next)
    }

    /// `slot` answered the revocation of `ino`. `Some(was_writer)` if a revocation was
    /// pending (or it held the lease): the caller digests its log up to the answered
    /// tail if it was the writer, then calls [`Leases::ack_done`]. `None`: nothing to do.
    pub(crate) fn ack_begin(&self, slot: u32, ino: u64) -> Option<bool> {
        let mut g = self.lock();
        let h = g.table.get(&ino).cloned().unwrap_or_default();
        if !h.holds(slot) && !g.pending.contains_key(&(slot, ino)) {
            return None;
        }
        g.pending.insert((slot, ino), Revoking::Acked);
        Some(h.writer == Some(slot))
    }

    /// The revocation of `slot`'s lease on `ino` is complete.
    pub(crate) fn ack_done(&self, slot: u32, ino: u64) {
        let mut g = self.lock();
        if g.pending.remove(&(slot, ino)).is_some() {
            if let Some(h) = g.table.get_mut(&ino) {
                h.remove(slot);
                if h.is_empty() {
                    g.table.remove(&ino);
                }
            }
        }
        drop(g);
        self.cv.notify_all();
    }

    /// Check a `Commit` of `slot` that writes the inodes of `current` (with their
    /// sequence words now), claiming the sequence words `claimed`: every written inode
    /// in shared-write mode must be claimed at its current word by a member of the mode,
    /// and every claimed inode must be in the mode. `Err`: the claimed inodes that are
    /// not in the mode (possibly none: then some claim is out of date). Called with the
    /// core lock held, which also serialises the commits' digests.
    pub(crate) fn check_commit(
        &self,
        slot: u32,
        claimed: &[(u64, u64)],
        current: &[(u64, u64)],
    ) -> Result<(), Vec<u64>> {
        let mut g = self.lock();
        let mut ended = Vec::new();
        let mut bad = false;
        for &(ino, word) in current {
            let claim = claimed.iter().find(|c| c.0 == ino).map(|c| c.1);
            match g.table.get(&ino) {
                Some(h) if h.mediated.is_some() => {
                    if !h.readers.contains(&slot) {
                        ended.push(ino);
                    }
                    bad |= claim != Some(word);
                }
                _ if claim.is_some() => ended.push(ino),
                _ => {}
            }
        }
        if bad || !ended.is_empty() {
            g.counters.stale_commits += 1;
            Err(ended)
        } else {
            Ok(())
        }
    }

    /// `slot`'s commit writing `written` was digested. Returns the inodes whose mode
    /// ended because only this client changed them for [`LEAVE_AFTER`] (it keeps a read
    /// lease on them).
    pub(crate) fn committed(&self, slot: u32, written: &[u64]) -> Vec<u64> {
        let now = Instant::now();
        let mut g = self.lock();
        g.counters.commits += 1;
        let mut ended = Vec::new();
        for &ino in written {
            let Some(h) = g.table.get_mut(&ino) else {
                continue;
            };
            let Some(m) = h.mediated.as_mut() else {
                continue;
            };
            if now.duration_since(m.window) < LEAVE_AFTER {
                m.writers.insert(slot);
            } else if m.writers.iter().all(|&w| w == slot) {
                h.mediated = None;
                ended.push(ino);
            } else {
                m.window = now;
                m.writers.clear();
                m.writers.insert(slot);
            }
        }
        ended
    }

    /// Shared-write and revocation counters.
    pub(crate) fn sharing_status(&self) -> cairn_proto::SharingStatus {
        let g = self.lock();
        let mut s = g.counters.clone();
        s.mediated_inodes = g.table.values().filter(|h| h.mediated.is_some()).count() as u64;
        s
    }

    /// Whether `slot` holds a lease (read or write) on `ino`.
    pub(crate) fn held_by(&self, ino: u64, slot: u32) -> bool {
        self.lock().table.get(&ino).is_some_and(|h| h.holds(slot))
    }

    /// Whether `slot` holds the write lease on `ino`.
    pub(crate) fn writes(&self, ino: u64, slot: u32) -> bool {
        self.lock()
            .table
            .get(&ino)
            .is_some_and(|h| h.writer == Some(slot))
    }

    /// Leases held, for tests and the log: (ino, writer, readers).
    #[cfg(test)]
    pub(crate) fn holders(&self, ino: u64) -> (Option<u32>, Vec<u32>) {
        let g = self.lock();
        let h = g.table.get(&ino).cloned().unwrap_or_default();
        (h.writer, h.readers.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_and_exclusive() {
        let l = Leases::new(Duration::from_millis(100), &[]);
        l.set_live(0);
        l.set_live(1);
        assert_eq!(l.acquire(0, 5, false, true), Ok(Grant::Lease));
        assert_eq!(l.acquire(1, 5, false, true), Ok(Grant::Lease));
        assert_eq!(l.holders(5), (None, vec![0, 1]));
        // A writer conflicts with the other reader: with no channel the revocation is
        // never answered and expires.
        let t = Instant::now();
        assert_eq!(l.acquire(0, 5, true, true), Err(Step::Expire(1)));
        assert!(t.elapsed() >= Duration::from_millis(90));
        assert!(l.overdue(1));
        l.drop_slot(1, false);
        assert_eq!(l.acquire(0, 5, true, true), Ok(Grant::Lease));
        assert_eq!(l.holders(5), (Some(0), vec![]));
        assert_eq!(l.acquire(2, 5, false, true), Err(Step::NotLive));
    }

    #[test]
    fn ack_releases_and_gate_blocks() {
        let l = std::sync::Arc::new(Leases::new(Duration::from_secs(5), &[]));
        l.set_live(0);
        l.set_live(1);
        assert_eq!(l.acquire(0, 9, true, true), Ok(Grant::Lease));
        let l2 = l.clone();
        let t = std::thread::spawn(move || l2.acquire(1, 9, false, true));
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(l.ack_begin(0, 9), Some(true));
        l.ack_done(0, 9);
        assert_eq!(t.join().unwrap(), Ok(Grant::Lease));
        assert_eq!(l.holders(9), (None, vec![1]));
        assert_eq!(l.ack_begin(0, 9), None);

        let g = Leases::new(Duration::from_millis(60), &[3]);
        g.set_live(4);
        assert_eq!(g.acquire(4, 1, false, true), Err(Step::GateDue));
        assert_eq!(g.close_gate_if_due(), Some(vec![3]));
        assert_eq!(g.acquire(4, 1, false, true), Ok(Grant::Lease));
        // Re-attaching with a conflicting lease is refused.
        assert!(!g.reattached(3, &[(1, true)]));
        assert!(g.reattached(3, &[(2, true)]));
    }

    fn wait_pending(l: &Leases, slot: u32, ino: u64) {
        while !l.lock().pending.contains_key(&(slot, ino)) {
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    #[test]
    fn second_quick_conflict_enters_shared_write_mode() {
        // "Quick" is generous here: a loaded machine takes more than the 5 ms between
        // the two conflicts' threads.
        let mut l = Leases::new(Duration::from_secs(5), &[]);
        l.mediate_within = Duration::from_secs(10);
        for s in 0..3 {
            l.set_live(s);
        }
        assert_eq!(l.acquire(0, 7, false, true), Ok(Grant::Lease));
        assert_eq!(l.acquire(1, 7, false, true), Ok(Grant::Lease));
        // First conflict (readers 0 and 1 against a writer): revoked as usual; the
        // revocation is answered by hand.
        let l = std::sync::Arc::new(l);
        let l2 = l.clone();
        let t = std::thread::spawn(move || l2.acquire(0, 7, true, true));
        wait_pending(&l, 1, 7);
        assert_eq!(l.ack_begin(1, 7), Some(false));
        l.ack_done(1, 7);
        assert_eq!(t.join().unwrap(), Ok(Grant::Lease));
        // Second conflict at once: the writer is revoked, then the mode starts.
        let l2 = l.clone();
        let t = std::thread::spawn(move || l2.acquire(1, 7, false, true));
        wait_pending(&l, 0, 7);
        assert_eq!(l.ack_begin(0, 7), Some(true));
        l.ack_done(0, 7);
        assert_eq!(t.join().unwrap(), Ok(Grant::Mediated));
        assert_eq!(l.acquire(0, 7, true, true), Ok(Grant::Mediated));
        assert_eq!(l.holders(7), (None, vec![0, 1]));
        assert_eq!(l.sharing_status().mediated_inodes, 1);
        // One upcall per conflict: reader 1, then writer 0.
        assert_eq!(l.sharing_status().revocations, 2);

        // Commits: the claimed sequence word must be current; a non-member is refused.
        assert_eq!(l.check_commit(0, &[(7, 4)], &[(7, 4), (99, 8)]), Ok(()));
        assert!(l.committed(0, &[7, 99]).is_empty());
        assert_eq!(l.check_commit(1, &[(7, 4)], &[(7, 6)]), Err(vec![]));
        assert_eq!(l.check_commit(1, &[], &[(7, 6)]), Err(vec![]));
        assert_eq!(l.check_commit(2, &[(7, 6)], &[(7, 6)]), Err(vec![7]));
        // Claiming an inode that is not in the mode.
        assert_eq!(l.check_commit(0, &[(99, 8)], &[(99, 8)]), Err(vec![99]));
        assert_eq!(l.check_commit(1, &[(7, 6)], &[(7, 6)]), Ok(()));
        l.committed(1, &[7]);
        assert_eq!(l.sharing_status().commits, 2);
        assert_eq!(l.sharing_status().stale_commits, 4);
    }

    #[test]
    fn shared_write_mode_ends_with_one_writer() {
        let l = Leases::new(Duration::from_secs(5), &[]);
        l.set_live(0);
        l.set_live(1);
        {
            let mut g = l.lock();
            g.table.insert(
                3,
                Holders {
                    readers: [0, 1].into_iter().collect(),
                    mediated: Some(Mediated {
                        window: Instant::now() - LEAVE_AFTER,
                        writers: [0, 1].into_iter().collect(),
                    }),
                    ..Holders::default()
                },
            );
        }
        // Two writers in the last window: a new window starts with slot 0 alone.
        assert!(l.committed(0, &[3]).is_empty());
        l.lock()
            .table
            .get_mut(&3)
            .unwrap()
            .mediated
            .as_mut()
            .unwrap()
            .window = Instant::now() - LEAVE_AFTER;
        assert_eq!(l.committed(0, &[3]), vec![3]);
        // Its holders keep read leases; a writer now revokes them as usual.
        assert_eq!(l.holders(3), (None, vec![0, 1]));
        assert_eq!(l.sharing_status().mediated_inodes, 0);
    }
}
