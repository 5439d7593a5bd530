//! The client's side of its operation log, as one owned type: where the next transaction
//! goes and with which sequence number, how far the daemon has digested, the digest
//! request outstanding, the space credits in hand and what the client page says of the
//! log's fill. The write path goes through it step by step: [`LogWriter::place`] (room
//! for a transaction, after a wrap if it would straddle the ring's end), encoding into
//! [`LogWriter::ring`], [`LogWriter::spend`] and [`LogWriter::appended`] once it is
//! durable. Round trips to the daemon (digests, credits) are the caller's
//! (`crate::fs::Inner`); this type only keeps their results.
//!
//! Invariants, checked after every change in checked builds: the published head never
//! passes the tail and the tail never runs more than the ring ahead of it (the client
//! never overwrites undigested bytes); both are 64-byte aligned; a pending digest request
//! covers a range that was logged (`head < upto <= tail`).

use crate::ring::Ring;
use cairn_format::log::TXN_ALIGN;
use std::io;

/// The client's log state (see the module documentation).
pub(crate) struct LogWriter {
    ring: Ring,
    /// LSN and sequence number of the next transaction.
    tail: u64,
    seq: u64,
    /// The published head last seen: everything before it is digested.
    head: u64,
    /// `upto` of the outstanding asynchronous digest request.
    pending: Option<u64>,
    /// Space credits in hand, in 4 KiB blocks.
    credits: u64,
    /// What the client page's pressure word says (more than half the log undigested).
    pressure: bool,
    /// Reused buffer for transactions built in memory first (metadata).
    buf: Vec<u8>,
}

impl LogWriter {
    /// The log of a client that registered with its head at `head` (sequence number
    /// `seq`) and `credits` granted: empty, the tail at the head.
    pub(crate) fn new(ring: Ring, head: u64, seq: u64, credits: u64) -> LogWriter {
        let w = LogWriter {
            ring,
            tail: head,
            seq,
            head,
            pending: None,
            credits,
            pressure: false,
            buf: Vec::new(),
        };
        w.check();
        w
    }

    fn check(&self) {
        debug_assert!(
            self.head <= self.tail && self.tail - self.head <= self.ring.bytes(),
            "the tail {} is not within a ring ({} bytes) past the head {}",
            self.tail,
            self.ring.bytes(),
            self.head
        );
        debug_assert!(
            self.tail.is_multiple_of(TXN_ALIGN) && self.head.is_multiple_of(TXN_ALIGN),
            "head {} or tail {} not {TXN_ALIGN}-byte aligned",
            self.head,
            self.tail
        );
        debug_assert!(
            self.pending.is_none_or(|p| p > self.head && p <= self.tail),
            "a digest request up to {:?} outside ({}, {}]",
            self.pending,
            self.head,
            self.tail
        );
    }

    /// The mapped ring (and client page).
    pub(crate) fn ring(&self) -> &Ring {
        &self.ring
    }

    /// LSN of the next transaction (every transaction logged ends at or before it).
    pub(crate) fn tail(&self) -> u64 {
        self.tail
    }

    /// Sequence number of the next transaction.
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    /// The published head last seen.
    pub(crate) fn head(&self) -> u64 {
        self.head
    }

    /// Whether everything logged is digested.
    pub(crate) fn digested(&self) -> bool {
        self.head == self.tail
    }

    /// Undigested bytes.
    pub(crate) fn used(&self) -> u64 {
        self.tail - self.head
    }

    /// The largest transaction: a quarter of the ring.
    pub(crate) fn max_txn(&self) -> u64 {
        self.ring.bytes() / 4
    }

    /// Where a transaction of `len` bytes would start: at the tail, or at the start of the
    /// next lap if it would straddle the ring's end. `None`: the ring has no room for it
    /// before the digest moves the head.
    pub(crate) fn place(&self, len: u64) -> Option<u64> {
        let ring = self.ring.bytes();
        let lap_left = ring - self.tail % ring;
        let start = if len > lap_left {
            self.tail + lap_left
        } else {
            self.tail
        };
        (start + len <= self.head + ring).then_some(start)
    }

    /// Fill the rest of the lap with a wrap transaction, so that the next one starts at
    /// `start` (from [`LogWriter::place`]).
    pub(crate) fn wrap_to(&mut self, start: u64) -> io::Result<()> {
        if start != self.tail {
            self.ring.put_wrap(self.tail, self.seq)?;
            let tail = self.tail;
            self.appended(tail, start - tail);
        }
        Ok(())
    }

    /// A transaction of `len` bytes (a commit, a `WRITE` or a wrap) was just written at
    /// `lsn` with sequence number [`LogWriter::seq`]: the tail moves past it and the next
    /// one gets the next number. Returns the new tail (the transaction's tag).
    pub(crate) fn appended(&mut self, lsn: u64, len: u64) -> u64 {
        debug_assert!(
            lsn >= self.tail,
            "a transaction at {lsn}, behind the tail {}",
            self.tail
        );
        debug_assert!(
            lsn.is_multiple_of(TXN_ALIGN) && len.is_multiple_of(TXN_ALIGN) && len > 0,
            "a transaction at {lsn} of {len} bytes: not {TXN_ALIGN}-byte aligned"
        );
        debug_assert!(
            lsn / self.ring.bytes() == (lsn + len - 1) / self.ring.bytes(),
            "a transaction at {lsn} of {len} bytes crosses the end of the ring"
        );
        self.seq += 1;
        self.tail = lsn + len;
        self.check();
        self.tail
    }

    /// The published head is `head` now (read from the shared area). Returns whether it
    /// moved; a digest request it passed is no longer pending.
    pub(crate) fn head_moved(&mut self, head: u64) -> bool {
        if head <= self.head {
            return false;
        }
        debug_assert!(
            head <= self.tail,
            "the published head {head} is past the tail {}",
            self.tail
        );
        self.head = head.min(self.tail);
        if self.pending.is_some_and(|p| head >= p) {
            self.pending = None;
        }
        self.check();
        true
    }

    /// The asynchronous digest request outstanding: up to where.
    pub(crate) fn pending(&self) -> Option<u64> {
        self.pending
    }

    /// An asynchronous digest of everything logged was asked for.
    pub(crate) fn requested(&mut self) {
        self.pending = (!self.digested()).then_some(self.tail);
        self.check();
    }

    /// Space credits in hand.
    pub(crate) fn credits(&self) -> u64 {
        self.credits
    }

    /// The daemon granted `n` more credits.
    pub(crate) fn granted(&mut self, n: u64) {
        self.credits += n;
    }

    /// Spend `charge` credits on the transaction about to be logged (the caller made sure
    /// it had them, after its reservation: credits never go below zero). Checked builds
    /// stop on a violation; a release build never wraps around (the client, inside an
    /// application, is not stopped for an accounting error: it asks for credits again
    /// next time).
    pub(crate) fn spend(&mut self, charge: u64) {
        debug_assert!(
            self.credits >= charge,
            "spending {charge} credits with {} left",
            self.credits
        );
        self.credits = self.credits.saturating_sub(charge);
    }

    /// Re-attached to a restarted daemon, which granted `credits` (what it promised
    /// before is gone) and knows of no request of ours; it may have reset the client page.
    pub(crate) fn reattached(&mut self, credits: u64) {
        self.credits = credits;
        self.pending = None;
        self.pressure = false;
    }

    /// Tell the daemon (the client page) whether more than half the log is undigested,
    /// or, with `force`, that it is under pressure whatever the fill (a writer waits for
    /// room). Stores only on a change.
    pub(crate) fn update_pressure(&mut self, force: bool) {
        let on = force || self.used() > self.ring.bytes() / 2;
        if on != self.pressure && self.ring.set_pressure(on).is_ok() {
            self.pressure = on;
        }
    }

    /// The buffer for a transaction built in memory (give it back with
    /// [`LogWriter::put_buf`]).
    pub(crate) fn take_buf(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }

    pub(crate) fn put_buf(&mut self, buf: Vec<u8>) {
        self.buf = buf;
    }
}
