//! Group commit: puts made durable together ([`Batch`]), one fence for many records.
//!
//! A put alone writes its record, fences, and only then switches the index (a value is
//! visible only once durable). A batch encodes the records of several puts one after
//! the other in memory, taking each key's lock, a version and room in its log head
//! meanwhile; at [`Batch::commit`] it writes them all at once (non-temporal stores),
//! fences once and switches the index for all of them: each value is still durable
//! before anyone can see it, and a put's outcome is known only after the commit; a
//! crash in the middle of the commit keeps a prefix of the batch's puts (recovery stops
//! at the first torn record of a segment, and the records follow the puts' order). (The
//! records are written together because any locked instruction after non-temporal
//! stores waits for them to drain, as a fence does: written one by one between the
//! version counter's and the segment's atomics, each cost a fence anyway.) A put of the
//! key of the batch's last record, of the same size, takes that record's room (the
//! earlier value is never visible: it is superseded before the commit, as if the two
//! puts had followed each other at once).
//!
//! No deadlock: a batch that holds locks only tries further ones (and commits first
//! when one is taken); it waits for a lock only while it holds none, and it never
//! waits for compaction (a put that finds the pool full commits the batch first, then
//! runs as a lone put, which compacts). The head is held from the first append to the
//! fence, so that no other writer's record follows an unfenced one of the batch in a
//! segment (recovery stops at the first torn record of a segment).

use crate::epoch::Pin;
use crate::format::{
    encode_record_at, encode_record_onto, record_len, Kind, RECORD_HEADER, SEGMENT_BYTES,
};
use crate::head::Head;
use crate::index::Locked;
use crate::log::{seg_of, Change, Core};
use crate::pool::Pool;
use crate::store::{KvError, UpdatePolicy};
use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

/// A put written, not yet fenced nor visible.
struct Pending {
    hash: u64,
    /// The bucket lock (in [`Batch::locks`]) that covers the key.
    lock: usize,
    /// The new record (its location, and where it is in [`Batch::records`]), its
    /// length, and its key's and value's bytes.
    loc: u64,
    at: usize,
    len: u64,
    key_len: usize,
    data: u64,
    /// The record the index holds for the key now (the one the commit replaces).
    cur: Option<(u64, u64, u64)>,
    /// The outcome it reports ([`Batch::outcomes`]).
    outcome: usize,
}

/// Puts made durable together (see the module's documentation). Outcomes are reported
/// in the order of the puts by [`Batch::commit`]. A batch lives on one thread (its
/// epoch pin is that thread's), and that thread makes no other change to the store
/// while the batch has puts pending (it holds their keys' locks and a log head: a
/// `put` of one of those keys, or on that head, would wait for itself): commit first.
pub struct Batch<'c> {
    core: &'c Core,
    pin: Option<Pin>,
    head: Option<MutexGuard<'c, Head>>,
    locks: Vec<Locked<'c>>,
    pending: Vec<Pending>,
    /// The pending records, encoded one after the other: they follow each other in the
    /// head's segment from `start` on.
    records: Vec<u8>,
    start: u64,
    /// Every put's outcome since the last [`Batch::commit`], in order (`Ok` for a pending
    /// one until its commit says otherwise).
    outcomes: Vec<Result<(), KvError>>,
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        // Pending records are durable only after the fence: a batch dropped without
        // committing commits (nobody saw an outcome: the puts just happened).
        self.settle();
    }
}

impl<'c> Batch<'c> {
    pub(crate) fn new(core: &'c Core) -> Batch<'c> {
        Batch {
            core,
            pin: None,
            head: None,
            locks: Vec::new(),
            pending: Vec::new(),
            records: Vec::new(),
            start: 0,
            outcomes: Vec::new(),
        }
    }

    /// Puts since the last commit (their outcomes not reported yet).
    pub fn len(&self) -> usize {
        self.outcomes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.outcomes.is_empty()
    }

    /// Set `key` to `value` when the batch commits.
    pub fn put(&mut self, key: &[u8], value: &[u8]) {
        let outcome = self.outcomes.len();
        self.outcomes.push(Ok(()));
        if let Err(e) = self.try_put(key, value, outcome) {
            self.outcomes[outcome] = Err(e);
        }
    }

    fn try_put(&mut self, key: &[u8], value: &[u8], outcome: usize) -> Result<(), KvError> {
        Core::check_key(key)?;
        Core::check_value(value)?;
        let core = self.core;
        if core.policy == UpdatePolicy::InPlace {
            // Updates in place go through the journal one by one.
            self.settle();
            return core.update(key, |_| Ok((Change::Put(Cow::Borrowed(value)), ())));
        }
        let len = record_len(key.len(), value.len());
        // A head without room for the record: the batch commits before it takes the
        // key's lock (the head then rolls to a new segment with nothing pending).
        if self.head.as_ref().is_some_and(|hd| !hd.fits(len)) {
            self.commit_pending();
        }
        let h = core.index.key_hash(key);
        let lock = self.lock_for(h);
        let is_key = |l: u64| core.key_is(l, key);
        // The key pending in this batch already: its record is replaced.
        let earlier = self.pending.iter().position(|p| {
            let k = p.at + RECORD_HEADER as usize;
            p.hash == h && p.lock == lock && self.records.get(k..k + p.key_len) == Some(key)
        });
        let cur = match earlier {
            Some(i) => self.pending[i].cur,
            None => match core.index.get_locked(&self.locks[lock], h, &is_key) {
                Some(l) => {
                    let rh = core.header_at(l)?;
                    Some((l, rh.len, (rh.key_len + rh.value_len) as u64))
                }
                None => None,
            },
        };
        let version = core.region.version().fetch_add(1, Ordering::Relaxed);
        let data = (key.len() + value.len()) as u64;
        let end = self.records.len();
        if let Some(p) = earlier
            .map(|i| &mut self.pending[i])
            .filter(|p| p.len == len && p.at + len as usize == end)
        {
            // The last record, of the same size: the new value takes its room (it was
            // never written). A hot key rewritten through a pipeline takes one record
            // per batch, not one per put. Only the last: a crash in the middle of the
            // commit keeps a prefix of the records (recovery stops at the first torn
            // one), and so of the puts in their order. Its head is the batch's.
            let seq = self.head.as_ref().map_or(0, |hd| hd.seq());
            let b = &mut self.records[p.at..p.at + len as usize];
            encode_record_at(b, seq, version, Kind::Value, key, value);
            (p.data, p.outcome) = (data, outcome);
            return Ok(());
        }
        let at = self.records.len();
        let loc = match self.append(len, version, key, value) {
            Ok(loc) => loc,
            Err(KvError::Full) => {
                // Compaction makes room: a lone put, with nothing held.
                self.settle();
                return core.update(key, |_| Ok((Change::Put(Cow::Borrowed(value)), ())));
            }
            Err(e) => return Err(e),
        };
        core.region.appends().fetch_add(1, Ordering::Relaxed);
        match earlier {
            Some(i) => {
                let p = &mut self.pending[i];
                // The earlier value dies unseen.
                core.segs.unlive(seg_of(p.loc), p.len, "replaced");
                (p.loc, p.at, p.len, p.data, p.outcome) = (loc, at, len, data, outcome);
            }
            None => self.pending.push(Pending {
                hash: h,
                lock,
                loc,
                at,
                len,
                key_len: key.len(),
                data,
                cur,
                outcome,
            }),
        }
        Ok(())
    }

    /// The index of the lock on `hash`'s home bucket in [`Batch::locks`], taken if the
    /// batch does not hold it: tried while it holds others (committing first when that
    /// fails), waited for when it holds none.
    fn lock_for(&mut self, hash: u64) -> usize {
        let index = &self.core.index;
        if let Some(i) = self.locks.iter().position(|l| index.covers(l, hash)) {
            return i;
        }
        if self.pin.is_none() {
            self.pin = Some(self.core.epochs.pin());
        }
        if !self.locks.is_empty() {
            if let Some(l) = index.try_lock_key(hash) {
                self.locks.push(l);
                return self.locks.len() - 1;
            }
            self.commit_pending();
            // The pin stays: nothing read under it is kept across the commit.
        }
        self.locks.push(index.lock_key(hash));
        self.locks.len() - 1
    }

    /// Take room for a record of `len` bytes in the batch's head (taken at the first
    /// append) and encode it after the pending ones (written at the commit); its
    /// location. A head without room for it is rolled to a new segment only with
    /// nothing pending (the caller committed first): a closed segment never holds a
    /// record that is not durable.
    fn append(&mut self, len: u64, version: u64, key: &[u8], value: &[u8]) -> Result<u64, KvError> {
        let core = self.core;
        let head = self.head.get_or_insert_with(|| core.head());
        if !head.fits(len) {
            debug_assert!(self.pending.is_empty());
            core.roll(head, false)?;
        }
        let loc = Pool::seg_off(head.seg()) as u64 + head.off();
        debug_assert!(loc % SEGMENT_BYTES + len <= SEGMENT_BYTES);
        if self.records.is_empty() {
            self.start = loc;
        }
        debug_assert_eq!(self.start + self.records.len() as u64, loc);
        encode_record_onto(
            &mut self.records,
            len,
            head.seq(),
            version,
            Kind::Value,
            key,
            value,
        );
        head.advance(&core.segs, len);
        Ok(loc)
    }

    /// Fence the pending records, switch the index to them, let go of the head and the
    /// locks (the outcomes stay to be reported).
    fn commit_pending(&mut self) {
        let core = self.core;
        let written = if self.records.is_empty() {
            Ok(())
        } else {
            core.put_bytes(self.start, &self.records)
        };
        core.fence();
        // Durable: the head can take other writers' records after them.
        self.head = None;
        for p in self.pending.drain(..) {
            if let Err(e) = &written {
                // Not written: no recovery can find it (nothing follows it in its
                // segment: the head was held). The earlier value stays.
                self.outcomes[p.outcome] =
                    Err(KvError::Io(std::io::Error::new(e.kind(), e.to_string())));
                core.segs.unlive(seg_of(p.loc), p.len, "not written");
                continue;
            }
            let lock = &self.locks[p.lock];
            let k = p.at + RECORD_HEADER as usize;
            let key = &self.records[k..k + p.key_len];
            let is_key = |l: u64| core.key_is(l, key);
            if core.index.set(lock, p.hash, &is_key, p.loc).is_err() {
                // As a lone put: the record is durable, the index has no room.
                self.outcomes[p.outcome] = Err(KvError::IndexFull);
                continue;
            }
            match p.cur {
                Some((l, len, data)) => {
                    core.segs.unlive(seg_of(l), len, "replaced");
                    core.region.data().fetch_sub(data, Ordering::Relaxed);
                }
                None => {
                    core.region.keys().fetch_add(1, Ordering::Relaxed);
                }
            }
            core.region.data().fetch_add(p.data, Ordering::Relaxed);
        }
        self.records.clear();
        self.locks.clear();
    }

    /// Commit everything pending and let go of the pin too.
    fn settle(&mut self) {
        self.commit_pending();
        self.pin = None;
    }

    /// Make every put since the last commit durable and visible (one fence), and report
    /// their outcomes in order.
    pub fn commit(&mut self, mut report: impl FnMut(Result<(), KvError>)) {
        self.settle();
        for r in self.outcomes.drain(..) {
            report(r);
        }
    }
}
