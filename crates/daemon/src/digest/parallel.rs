//! Parallel digests (ARCHITECTURE.md, "Digest" and "Daemon threads").
//!
//! A client's asynchronous digest request runs on a worker of a pool sized to the cores,
//! in phases:
//!
//! 1. *No lock*: copy the batch out of the slot's ring, scan, check the crc32c, decode
//!    (`digest::read_batch`). Only the slot's ring is read; one digest per slot runs at a
//!    time (the pool's queue), and the head the copy started from is checked again in 2.
//! 2. *Core lock*: permission check, plan and validate (`digest::plan_batch`) while every
//!    inode read is recorded (`Shared::reads`); then the batch's *claim* — the inodes it
//!    read and the inodes it will publish — is compared with the claims of the digests in
//!    flight. A conflict (one's writes meet the other's reads or writes) makes it wait
//!    and plan again after the other published. Otherwise it allocates every new block
//!    and writes map nodes and directory buckets (`digest::apply_batch`), registers its
//!    claim and drops the lock.
//! 3. *No lock*: write the new data blocks (`digest::write_data`, non-temporal copies) —
//!    the bulk of the work. They are reachable from nothing published.
//! 4. *Core lock*: fence, publish the inodes, persist the slot head, retire, advance the
//!    epoch (`digest::publish_batch`), remove the claim.
//!
//! The claims make the digests in flight conflict-serializable whatever the clients log
//! (leases are not trusted here: an expired holder may log about an inode it lost):
//! nothing a digest read changes before it publishes. Everything else in the daemon
//! (synchronous digests, recovery, release, shutdown, status, the timer) takes
//! the core through [`CoreLock::serial`], which waits until no claim is left and keeps
//! new digests from registering one meanwhile, so it sees exactly the serial daemon.
//! Crash safety is the serial digest's: a batch's blocks are written and written back by
//! the thread that fences before publishing, and its log stays authoritative until its
//! head is persisted; batches in flight at a crash are disjoint, so their replays, in any
//! order, give the same state.

use crate::core::Core;
use crate::digest::{self, DigestError, Mode, Outcome};
use std::collections::{HashMap, HashSet};
use std::sync::{Condvar, Mutex, MutexGuard};

/// What a digest in flight read (its plan) and will publish.
#[derive(Debug, Default, Clone)]
pub(crate) struct Claim {
    pub reads: HashSet<u64>,
    pub writes: HashSet<u64>,
}

/// Parallel-digest state, under the core lock.
#[derive(Debug, Default)]
pub(crate) struct ParState {
    /// Digests between their plan and their publish, by slot.
    pub claims: HashMap<u32, Claim>,
    /// Threads waiting for `claims` to drain (see [`CoreLock::serial`]).
    pub serial_waiters: usize,
}

impl ParState {
    /// Whether `c` conflicts with a digest in flight.
    pub(crate) fn conflicts(&self, c: &Claim) -> bool {
        self.claims
            .values()
            .any(|d| !d.writes.is_disjoint(&c.reads) || !c.writes.is_disjoint(&d.reads))
    }
}

/// The daemon-wide core lock, with the condition variable of parallel digests.
pub(crate) struct CoreLock {
    mutex: Mutex<Core>,
    cv: Condvar,
    /// The core's credit float, reachable without the lock (`crate::credits`).
    float: std::sync::Arc<crate::credits::CreditFloat>,
}

impl CoreLock {
    pub(crate) fn new(core: Core) -> CoreLock {
        CoreLock {
            float: core.float.clone(),
            mutex: Mutex::new(core),
            cv: Condvar::new(),
        }
    }

    /// The credit float, without the core lock.
    pub(crate) fn float(&self) -> &crate::credits::CreditFloat {
        &self.float
    }

    /// The lock itself (a panic while serving one client must not stop the others).
    fn raw(&self) -> MutexGuard<'_, Core> {
        self.mutex.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, g: MutexGuard<'a, Core>) -> MutexGuard<'a, Core> {
        self.cv.wait(g).unwrap_or_else(|e| e.into_inner())
    }

    /// The core for anything but a parallel digest: no parallel digest is between its
    /// plan and its publish while the guard lives.
    pub(crate) fn serial(&self) -> MutexGuard<'_, Core> {
        let mut g = self.raw();
        if !g.par.claims.is_empty() {
            g.par.serial_waiters += 1;
            while !g.par.claims.is_empty() {
                g = self.wait(g);
            }
            g.par.serial_waiters -= 1;
            self.cv.notify_all();
        }
        g
    }
}

/// Whether `slot` is still served by connection `conn`.
fn owned(core: &Core, slot: u32, conn: u64) -> bool {
    matches!(core.clients.get(slot as usize), Some(Some(c)) if c.conn == Some(conn))
}

/// Digest `slot`'s log up to `upto` for its client on connection `conn`, in parallel with
/// other slots' digests (module documentation); the same effects as
/// `Core::digest_client`. `Ok(None)`: the slot is no longer that client's, or the daemon
/// stops (nothing done). `scratch` is the worker's batch buffer.
pub(crate) fn digest_client(
    cl: &CoreLock,
    slot: u32,
    conn: u64,
    upto: u64,
    scratch: &mut Vec<u8>,
) -> Result<Option<Outcome>, DigestError> {
    let mut done: Option<Outcome> = None;
    loop {
        let Some((o, from, end)) = digest_slice(cl, slot, conn, upto, scratch)? else {
            return Ok(done);
        };
        let last = end >= upto || o.head_lsn <= from;
        match &mut done {
            Some(d) => d.add(o),
            None => done = Some(o),
        }
        if last {
            return Ok(done);
        }
    }
}

/// One batch of [`digest_client`]: up to `upto`, or, while the client's log is under
/// pressure, up to the end of a slice (a `SLICES`th of the log, as serial digests
/// slice), so that a writer waiting for room goes on as soon as the first slice is
/// published. Returns the outcome, the head it started from and where it was to end.
fn digest_slice(
    cl: &CoreLock,
    slot: u32,
    conn: u64,
    upto: u64,
    scratch: &mut Vec<u8>,
) -> Result<Option<(Outcome, u64, u64)>, DigestError> {
    'again: loop {
        // 1. Copy, scan, decode (no lock).
        let (head, area, pressure, slice) = {
            let g = cl.raw();
            if g.stopped || !owned(&g, slot, conn) {
                return Ok(None);
            }
            let slice = g.sh.layout.ring_bytes() / digest::SLICES;
            (
                g.sh.slot_head(slot)?.0,
                g.sh.area.clone(),
                g.sh.log_pressure(slot),
                slice,
            )
        };
        let end = if pressure {
            digest::slice_end(&area, slot, head, upto, slice)?
        } else {
            upto
        };
        let read = match digest::read_batch(&area, slot, head, Mode::Upto(end), scratch) {
            Ok(r) => r,
            Err(e) => {
                // Malformed only if the copy was taken at the current head.
                let g = cl.raw();
                if g.sh.slot_head(slot)?.0 != head {
                    continue 'again;
                }
                return Err(e);
            }
        };
        // 2. Plan, check the claim, allocate, write metadata (core lock).
        let mut g = cl.raw();
        let (b, pl, a) = loop {
            while g.par.serial_waiters > 0 {
                g = cl.wait(g);
            }
            if g.stopped || !owned(&g, slot, conn) {
                return Ok(None);
            }
            if g.sh.slot_head(slot)?.0 != head {
                // A synchronous digest of this slot ran meanwhile: the copy is stale.
                drop(g);
                continue 'again;
            }
            let Some(b) = &read else {
                let o = Outcome {
                    head_lsn: head.head_lsn,
                    head_seq: head.head_seq,
                    ..Default::default()
                };
                return Ok(Some((o, head.head_lsn, end)));
            };
            *g.sh.reads.borrow_mut() = Some(HashSet::new());
            let planned = digest::plan_batch(&g.sh, slot, b);
            let mut reads = g.sh.reads.borrow_mut().take().unwrap_or_default();
            let pl = planned?;
            let writes: HashSet<u64> = pl.inodes().collect();
            reads.extend(writes.iter().copied());
            let claim = Claim { reads, writes };
            if g.par.conflicts(&claim) {
                g = cl.wait(g);
                continue;
            }
            let a = digest::apply_batch(&mut g.sh, &pl)?;
            g.par.claims.insert(slot, claim);
            break (b, pl, a);
        };
        drop(g);
        // 3. Data blocks (no lock).
        let written = digest::write_data(&area, &a.data);
        // 4. Publish (core lock).
        let mut g = cl.raw();
        let r = match written {
            Err(e) => {
                g.sh.rollback(&a.w);
                Err(DigestError::Failed(e))
            }
            Ok(()) => digest::publish_batch(&mut g.sh, slot, b.span, &pl, a),
        };
        g.par.claims.remove(&slot);
        if let Ok(o) = &r {
            g.digested(slot, o);
        }
        drop(g);
        cl.cv.notify_all();
        return r.map(|o| Some((o, head.head_lsn, end)));
    }
}

/// Where a worker reports that a client's log is malformed: the client's connection
/// thread refuses it (as `server::digest_failed` does for its own digests).
pub(crate) struct Refusal {
    found: Mutex<Option<(u32, String, u64)>>,
    sock: Option<std::os::unix::net::UnixStream>,
}

impl Refusal {
    /// For the connection `sock` (closed when a refusal is found, to wake its thread).
    pub(crate) fn new(sock: Option<std::os::unix::net::UnixStream>) -> Refusal {
        Refusal {
            found: Mutex::new(None),
            sock,
        }
    }

    /// The refusal found, if any: (slot, message, discard LSN).
    pub(crate) fn take(&self) -> Option<(u32, String, u64)> {
        self.found.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    fn set(&self, slot: u32, msg: String, discard: u64) {
        *self.found.lock().unwrap_or_else(|e| e.into_inner()) = Some((slot, msg, discard));
        if let Some(s) = &self.sock {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

struct Job {
    conn: u64,
    upto: u64,
    refusal: std::sync::Arc<Refusal>,
}

#[derive(Default)]
struct Queue {
    /// At most one job per slot: a newer request of the same connection extends it.
    pending: std::collections::BTreeMap<u32, Job>,
    running: HashSet<u32>,
    stop: bool,
}

/// The digest workers' queue. `threads == 0`: no pool, asynchronous digests run inline
/// on the connection's thread (the serial daemon).
pub(crate) struct Pool {
    q: Mutex<Queue>,
    cv: Condvar,
    pub threads: usize,
}

impl Pool {
    /// `CAIRN_DIGEST_THREADS`: a number of workers, `auto` (the number of cores), 0:
    /// off (serial: a client's asynchronous digest runs on its connection's thread, and
    /// its next request waits for the whole digest). Unset: one worker, so that a
    /// client's requests (space credits above all) are answered while its log is
    /// digested; more than one is not the default until measured on more than two
    /// cores (on two it gains ~10-15% digest throughput; ARCHITECTURE.md, "Limits").
    pub(crate) fn from_env() -> Pool {
        let cores = || {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        };
        let threads = match std::env::var("CAIRN_DIGEST_THREADS") {
            Ok(v) if v.trim() == "auto" => cores(),
            Ok(v) => v.trim().parse().unwrap_or(1),
            Err(_) => 1,
        };
        Pool {
            q: Mutex::new(Queue::default()),
            cv: Condvar::new(),
            threads,
        }
    }

    fn q(&self) -> MutexGuard<'_, Queue> {
        self.q.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue a digest of `slot` up to `upto` for connection `conn` (digests of one slot
    /// run one at a time, in order; queued requests of a slot merge).
    pub(crate) fn submit(
        &self,
        slot: u32,
        conn: u64,
        upto: u64,
        refusal: &std::sync::Arc<Refusal>,
    ) {
        let mut q = self.q();
        match q.pending.get_mut(&slot) {
            Some(j) if j.conn == conn => j.upto = j.upto.max(upto),
            _ => {
                q.pending.insert(
                    slot,
                    Job {
                        conn,
                        upto,
                        refusal: refusal.clone(),
                    },
                );
            }
        }
        drop(q);
        self.cv.notify_all();
    }

    /// Stop the workers (queued jobs are dropped: the clean stop digests every log).
    pub(crate) fn stop(&self) {
        self.q().stop = true;
        self.cv.notify_all();
    }

    /// A worker: run queued digests until [`Pool::stop`].
    pub(crate) fn work(&self, cl: &CoreLock) {
        let mut scratch = Vec::new();
        loop {
            let (slot, job) = {
                let mut q = self.q();
                loop {
                    if q.stop {
                        return;
                    }
                    let next = q.pending.keys().copied().find(|s| !q.running.contains(s));
                    if let Some(s) = next {
                        let j = q.pending.remove(&s).unwrap();
                        q.running.insert(s);
                        break (s, j);
                    }
                    q = self.cv.wait(q).unwrap_or_else(|e| e.into_inner());
                }
            };
            // A panic here stops the daemon (fail-stop, `util::install_fail_stop`).
            match digest_client(cl, slot, job.conn, job.upto, &mut scratch) {
                Ok(_) => {}
                Err(DigestError::Malformed { msg, discard_lsn }) => {
                    job.refusal.set(slot, msg, discard_lsn)
                }
                Err(DigestError::Failed(e)) => {
                    tracing::warn!("slot {slot}: digest failed: {e}; the log stays authoritative")
                }
            }
            self.q().running.remove(&slot);
            self.cv.notify_all();
        }
    }
}
