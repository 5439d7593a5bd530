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

/// The holders of one inode's leases.
#[derive(Debug, Default, Clone)]
struct Holders {
    writer: Option<u32>,
    readers: BTreeSet<u32>,
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

#[derive(Default)]
struct State {
    table: HashMap<u64, Holders>,
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

/// The lease manager.
pub(crate) struct Leases {
    st: Mutex<State>,
    cv: Condvar,
    /// `lease_timeout_ms`.
    pub timeout: Duration,
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
        }
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
                    readers: BTreeSet::new(),
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

    /// If the restart gate's deadline passed: close it and return the slots that never
    /// re-attached (the caller increments their `lease_gen`).
    pub(crate) fn close_gate_if_due(&self) -> Vec<u32> {
        let mut g = self.lock();
        let due = match &g.gate {
            Some(gate) => gate.awaiting.is_empty() || Instant::now() >= gate.deadline,
            None => false,
        };
        if !due {
            return Vec::new();
        }
        let gate = g.gate.take().expect("gate");
        drop(g);
        self.cv.notify_all();
        let mut v: Vec<u32> = gate.awaiting.into_iter().collect();
        v.sort_unstable();
        v
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
    /// first. Never called with the core lock held.
    pub(crate) fn acquire(&self, slot: u32, ino: u64, write: bool) -> Result<(), Step> {
        let mut g = self.lock();
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
            let h = g.table.get(&ino).cloned().unwrap_or_default();
            let mut conflicts: Vec<u32> = Vec::new();
            if let Some(w) = h.writer.filter(|&w| w != slot) {
                conflicts.push(w);
            }
            if write {
                conflicts.extend(h.readers.iter().copied().filter(|&r| r != slot));
            }
            if conflicts.is_empty() {
                let e = g.table.entry(ino).or_default();
                if write {
                    e.readers.remove(&slot);
                    e.writer = Some(slot);
                } else if e.writer != Some(slot) {
                    e.readers.insert(slot);
                }
                return Ok(());
            }
            let now = Instant::now();
            let mut next = now + POLL;
            for h in conflicts {
                match g.pending.get(&(h, ino)).copied() {
                    None => {
                        let deadline = now + self.timeout;
                        g.pending.insert((h, ino), Revoking::Sent(deadline));
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
            let wait = next
                .saturating_duration_since(now)
                .max(Duration::from_millis(1));
            g = self
                .cv
                .wait_timeout(g, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
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
        assert_eq!(l.acquire(0, 5, false), Ok(()));
        assert_eq!(l.acquire(1, 5, false), Ok(()));
        assert_eq!(l.holders(5), (None, vec![0, 1]));
        // A writer conflicts with the other reader: with no channel the revocation is
        // never answered and expires.
        let t = Instant::now();
        assert_eq!(l.acquire(0, 5, true), Err(Step::Expire(1)));
        assert!(t.elapsed() >= Duration::from_millis(90));
        assert!(l.overdue(1));
        l.drop_slot(1, false);
        assert_eq!(l.acquire(0, 5, true), Ok(()));
        assert_eq!(l.holders(5), (Some(0), vec![]));
        assert_eq!(l.acquire(2, 5, false), Err(Step::NotLive));
    }

    #[test]
    fn ack_releases_and_gate_blocks() {
        let l = std::sync::Arc::new(Leases::new(Duration::from_secs(5), &[]));
        l.set_live(0);
        l.set_live(1);
        assert_eq!(l.acquire(0, 9, true), Ok(()));
        let l2 = l.clone();
        let t = std::thread::spawn(move || l2.acquire(1, 9, false));
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(l.ack_begin(0, 9), Some(true));
        l.ack_done(0, 9);
        assert_eq!(t.join().unwrap(), Ok(()));
        assert_eq!(l.holders(9), (None, vec![1]));
        assert_eq!(l.ack_begin(0, 9), None);

        let g = Leases::new(Duration::from_millis(60), &[3]);
        g.set_live(4);
        assert_eq!(g.acquire(4, 1, false), Err(Step::GateDue));
        assert_eq!(g.close_gate_if_due(), vec![3]);
        assert_eq!(g.acquire(4, 1, false), Ok(()));
        // Re-attaching with a conflicting lease is refused.
        assert!(!g.reattached(3, &[(1, true)]));
        assert!(g.reattached(3, &[(2, true)]));
    }
}
