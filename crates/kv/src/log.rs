//! The log: the store's shared state ([`Core`]), its heads, and the write path (appends,
//! in-place updates through the journal, the index switch).

use crate::epoch::Epochs;
use crate::format::{
    decode_record_header, encode_journal, encode_record, encode_record_in, encode_segment_header,
    record_len, Kind, JOURNAL_MAX_RECORD, JOURNAL_SLOTS, JOURNAL_SLOT_BYTES, JOURNAL_START,
    MAX_KEY, MAX_VALUE, RECORD_HEADER, SEGMENT_BYTES,
};
use crate::head::{Head, Heads};
use crate::index::Index;
use crate::pool::Pool;
use crate::region::Region;
use crate::segment::Segments;
use crate::store::{KvError, UpdatePolicy};
use std::borrow::Cow;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};

/// What an update ([`Core::update`]) does with a key, decided from its current value.
pub enum Change<'v> {
    /// Leave it as it is.
    Keep,
    /// Set it to this value.
    Put(Cow<'v, [u8]>),
    /// Remove it.
    Delete,
}

/// Free segments only compaction may take (so that it can always make room).
pub(crate) const RESERVE: usize = 1;

/// How long a free segment keeps its memory (ms) before it is handed back.
pub(crate) const RELEASE_AFTER: u64 = 1000;

/// The segment of a location (a byte offset in the pool).
pub(crate) fn seg_of(loc: u64) -> u64 {
    loc / SEGMENT_BYTES
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The state of an open store, shared with its compaction threads (and, for a shared
/// store, in its region with the other processes that have it open).
pub(crate) struct Core {
    pub pool: Pool,
    /// The counters, and the tables below (their memory).
    pub region: Region,
    pub index: Index,
    /// This process's log heads: its writers' and its compaction's.
    pub heads: Heads,
    /// Every segment's state, and the free list.
    pub segs: Segments,
    /// Readers' epochs, and the segments emptied by this process's compaction that wait
    /// for readers to leave.
    pub epochs: Epochs,
    /// The in-place journal's slots.
    journal: Vec<Mutex<()>>,
    pub policy: UpdatePolicy,
    /// Fenced writes (off: the volatile mode).
    pub durable: bool,
    /// When background compaction runs, what it keeps warm, and its thread's bell.
    /// With a garbage bound, the free segments beyond the warm ones most recently freed
    /// (which heads take first) hand their memory back to the system once they have
    /// been free for [`RELEASE_AFTER`]; a head that takes one marks it fresh, and the
    /// background thread collapses it into a huge folio again, off the writer's path.
    pub compactor: crate::compact::Compactor,
    /// Whether segments are backed by huge folios (asked for, and the kernel allows).
    pub huge: bool,
}

/// How a [`Core`] is built.
pub(crate) struct Setup {
    pub heads: usize,
    pub policy: UpdatePolicy,
    pub durable: bool,
    pub trigger: f64,
    pub max_garbage: Option<f64>,
    pub huge_pages: bool,
}

impl Core {
    /// The store of `pool` whose state is in `region` (a new one, for recovery to
    /// fill, or one other processes share).
    pub fn new(pool: Pool, region: Region, s: &Setup) -> io::Result<Core> {
        Ok(Core {
            index: Index::on(region.index.clone(), region.index_keys())?,
            segs: Segments::on(region.segs.clone())?,
            epochs: Epochs::on(region.epochs.clone())?,
            region,
            pool,
            heads: Heads::new(s.heads),
            journal: (0..JOURNAL_SLOTS).map(|_| Mutex::new(())).collect(),
            policy: s.policy,
            durable: s.durable,
            // Warm: the segments heads and compaction may take at once.
            compactor: crate::compact::Compactor::new(
                s.trigger,
                s.max_garbage,
                s.heads.max(1) + RESERVE,
            ),
            huge: s.huge_pages && cairn_media::huge::refusal().is_none(),
        })
    }

    /// Write `data` at `off` for the log: non-temporal stores (durable at the next
    /// [`Core::fence`]), or plain ones in the volatile mode.
    #[track_caller]
    pub fn put_bytes(&self, off: u64, data: &[u8]) -> io::Result<()> {
        if self.durable {
            self.pool.map.write_nt(off as usize, data)
        } else {
            self.pool.map.write(off as usize, data)
        }
    }

    /// Make the writes before it durable (nothing in the volatile mode).
    #[track_caller]
    pub fn fence(&self) {
        if self.durable {
            cairn_media::fence();
        }
    }

    /// Write back and fence `off..off+len` (nothing in the volatile mode).
    #[track_caller]
    pub fn persist(&self, off: u64, len: u64) -> io::Result<()> {
        if self.durable {
            self.pool.map.persist(off as usize, len as usize)?;
        }
        Ok(())
    }

    /// The header of the record at `loc`.
    pub fn header_at(&self, loc: u64) -> io::Result<crate::format::RecordHeader> {
        let h = self.pool.map.bytes(loc as usize, RECORD_HEADER as usize)?;
        let room = SEGMENT_BYTES - loc % SEGMENT_BYTES;
        decode_record_header(h, room)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "index: not a record"))
    }

    /// The value of the record at `loc` (with its header `h`), in place.
    pub fn value_at(&self, loc: u64, h: &crate::format::RecordHeader) -> io::Result<&[u8]> {
        self.pool
            .map
            .bytes((loc + RECORD_HEADER) as usize + h.key_len, h.value_len)
    }

    /// Whether the record at `loc` is `key`'s.
    pub fn key_is(&self, loc: u64, key: &[u8]) -> bool {
        match self.header_at(loc) {
            Ok(h) if h.key_len == key.len() => self
                .pool
                .map
                .bytes((loc + RECORD_HEADER) as usize, key.len())
                .is_ok_and(|k| k == key),
            _ => false,
        }
    }

    pub fn check_key(key: &[u8]) -> Result<(), KvError> {
        if key.is_empty() || key.len() > MAX_KEY {
            return Err(KvError::TooBig(format!(
                "a key has 1 to {MAX_KEY} bytes, not {}",
                key.len()
            )));
        }
        Ok(())
    }

    pub(crate) fn check_value(value: &[u8]) -> Result<(), KvError> {
        if value.len() > MAX_VALUE {
            return Err(KvError::TooBig(format!(
                "a value has at most {MAX_VALUE} bytes, not {}",
                value.len()
            )));
        }
        Ok(())
    }

    /// The log head of the calling CPU.
    pub(crate) fn head(&self) -> MutexGuard<'_, Head> {
        self.heads.for_cpu(cairn_media::sys::current_cpu())
    }

    pub fn free_count(&self) -> usize {
        self.segs.free_count()
    }

    /// Whether the free segments are below the compaction trigger, or the dead bytes of
    /// the closed segments above `max_garbage`.
    pub fn wants_compaction(&self) -> bool {
        let usable = self.pool.header.segments.saturating_sub(1);
        self.compactor
            .wanted(self.free_count(), usable, || self.garbage())
    }

    /// The fraction of the bytes of the closed segments (in use, not log heads) that
    /// holds no current value: dead records, and tombstones (needed or not: those still
    /// needed go once compaction has emptied the older segments that hold what they
    /// delete).
    pub fn garbage(&self) -> f64 {
        self.segs.garbage()
    }

    /// Check the invariants of the segments, the free list, the heads and the retired
    /// list (checked builds: after recovery, and when the store is dropped). Only for a
    /// quiescent store: no thread may change them meanwhile.
    pub fn check(&self) {
        self.segs.check();
        self.heads.check(&self.segs);
        let retired = self.epochs.retired();
        retired.check();
        // A retired segment was emptied by compaction, and is not free yet.
        for s in retired.items() {
            self.segs.check_emptied(s);
        }
    }

    /// Milliseconds since the store's region was built (the same clock in every
    /// process).
    pub fn now_ms(&self) -> u64 {
        self.region.now_ms()
    }

    /// Hand the memory of the free segments beyond the `warm` most recently freed (the
    /// end of `free`, which heads take first) back to the system, once they have been
    /// free for [`RELEASE_AFTER`] (a segment that a busy log takes again soon keeps its
    /// memory: taking back a released one costs a 2 MiB zeroing and a collapse). Called
    /// under the free list's lock (no head can take one meanwhile). Only segments whose
    /// header is durably erased: a recovery finds nothing in them either way. `after`:
    /// the time a segment must have been free (ms; recovery releases at once).
    pub fn release_cold(&self, free: &mut crate::segment::FreeList<'_>, after: u64) {
        if let Some(warm) = self.compactor.keeps_warm() {
            free.release_cold(warm, after, self.now_ms(), |s| self.pool.release(s));
        }
    }

    /// Collapse the segments heads took after their release into huge folios again (the
    /// background thread; best effort).
    pub fn collapse_fresh(&self) {
        if !self.huge {
            return;
        }
        for s in 1..self.segs.count() {
            if self.segs.take_fresh(s) && !self.compactor.stopping() {
                let _ = self.pool.collapse(s);
            }
        }
    }

    /// Take a free segment for a head (a client's: not the last [`RESERVE`] ones, which
    /// only compaction takes) and open it under a new sequence number.
    pub fn roll(&self, head: &mut Head, for_compaction: bool) -> Result<(), KvError> {
        let reserve = if for_compaction { 0 } else { RESERVE };
        // A head from now on (under the free list's lock: compaction chooses among
        // segments neither free nor heads under the same lock).
        let (s, released) = self.segs.free_list().take(reserve).ok_or(KvError::Full)?;
        if head.is_open() {
            // Closed at once (not when the new segment is open): a head that fails to
            // open the new one below does not append to a segment that compaction may
            // now choose.
            head.close(&self.segs);
        }
        if for_compaction {
            self.region
                .compaction_rolls()
                .fetch_add(1, Ordering::Relaxed);
        } else if self.wants_compaction() {
            // A writer's: wake compaction (its own rolls must not: a round that gains
            // nothing would wake the next one at once).
            self.compactor.ring();
        }
        let seq = self.region.next_seq().fetch_add(1, Ordering::Relaxed);
        let h = encode_segment_header(seq);
        let off = Pool::seg_off(s) as u64;
        self.pool.map.write(off as usize, &h)?;
        if released {
            self.segs.mark_fresh(s);
        }
        self.persist(off, h.len() as u64)?;
        self.segs
            .open(s, seq, self.region.version().load(Ordering::Relaxed));
        head.open(&self.segs, s, seq);
        Ok(())
    }

    /// With no free segment for this CPU's head: append to another writer's head that
    /// has the room (a deletion's small tombstone in a full pool, most often).
    fn append_anywhere(&self, len: u64, encode: &dyn Fn(u64) -> Vec<u8>) -> Result<u64, KvError> {
        for h in self.heads.writers() {
            let Ok(mut g) = h.try_lock() else { continue };
            if g.fits(len) {
                return self.append_to(&mut g, len, false, encode);
            }
        }
        Err(KvError::Full)
    }

    /// Append a record of `len` bytes (encoded for `head.seq` by `encode`) to `head`,
    /// durable when this returns; its location.
    pub fn append_to(
        &self,
        head: &mut Head,
        len: u64,
        for_compaction: bool,
        encode: &dyn Fn(u64) -> Vec<u8>,
    ) -> Result<u64, KvError> {
        if !head.fits(len) {
            self.roll(head, for_compaction)?;
        }
        let rec = encode(head.seq());
        let loc = Pool::seg_off(head.seg()) as u64 + head.off();
        self.put_bytes(loc, &rec)?;
        self.fence();
        head.advance(&self.segs, len);
        Ok(loc)
    }

    /// Rewrite the record at `loc` (an allocation of `len` bytes, the key's current
    /// record) in place with a new version of `key`'s value, under the key's lock.
    /// The whole new record goes to a journal slot first (durable), then in place
    /// (durable): a crash in the middle of the second write leaves the first, which
    /// recovery redoes; a crash in the first leaves the record as it was.
    fn overwrite(
        &self,
        loc: u64,
        len: u64,
        version: u64,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), KvError> {
        let seq = self.segs.seq(seg_of(loc));
        let rec = encode_record_in(len, seq, version, Kind::Value, key, value);
        if !self.durable {
            self.pool.map.write(loc as usize, &rec)?;
            return Ok(());
        }
        let slot = cairn_media::sys::current_cpu() as u64 % JOURNAL_SLOTS;
        let _slot = lock(&self.journal[slot as usize]);
        let entry = encode_journal(loc, seq, &rec);
        self.put_bytes(JOURNAL_START + slot * JOURNAL_SLOT_BYTES, &entry)?;
        self.fence();
        self.put_bytes(loc, &rec)?;
        self.fence();
        Ok(())
    }

    /// Change `key` as `decide` says from its current value (`None`: absent), durably
    /// when this returns, atomically with respect to every other change of the key:
    /// the key's lock is held from reading its value to switching the index, and a
    /// key's versions follow the order its changes take effect in (a deletion too,
    /// though it leaves no index entry: recovery orders a key's records by version).
    /// A full pool is compacted (on the caller's thread, with no lock held) while that
    /// makes room, and `decide` asked again. Returns what `decide` returned.
    pub fn update<'v, R>(
        &self,
        key: &[u8],
        mut decide: impl FnMut(Option<&[u8]>) -> Result<(Change<'v>, R), KvError>,
    ) -> Result<R, KvError> {
        Self::check_key(key)?;
        let h = self.index.key_hash(key);
        let mut fruitless = 0;
        for _ in 0..64 {
            {
                let _pin = self.epochs.pin();
                let g = self.index.lock_key(h);
                let is_key = |l: u64| self.key_is(l, key);
                let cur = match self.index.get_locked(&g, h, &is_key) {
                    Some(l) => Some((l, self.header_at(l)?)),
                    None => None,
                };
                let value = match &cur {
                    Some((l, rh)) => Some(self.value_at(*l, rh)?),
                    None => None,
                };
                let (change, r) = decide(value)?;
                // A tombstone's horizon, read under the key's lock: no record of the key
                // can be written into a segment opened from now on but by later calls.
                let horizon = self.region.next_seq().load(Ordering::Acquire).to_le_bytes();
                let (kind, value): (Kind, &[u8]) = match &change {
                    Change::Keep => return Ok(r),
                    Change::Delete if cur.is_none() => return Ok(r),
                    Change::Delete => (Kind::Tombstone, &horizon),
                    Change::Put(v) => {
                        Self::check_value(v)?;
                        (Kind::Value, v)
                    }
                };
                let version = self.region.version().fetch_add(1, Ordering::Relaxed);
                let data = (key.len() + value.len()) as u64;
                let len = record_len(key.len(), value.len());
                if let (Kind::Value, UpdatePolicy::InPlace, Some((l, rh))) =
                    (kind, self.policy, &cur)
                {
                    if rh.kind == Kind::Value && len <= rh.len && rh.len <= JOURNAL_MAX_RECORD {
                        self.overwrite(*l, rh.len, version, key, value)?;
                        self.region.data().fetch_add(data, Ordering::Relaxed);
                        self.region
                            .data()
                            .fetch_sub((rh.key_len + rh.value_len) as u64, Ordering::Relaxed);
                        self.region.in_place().fetch_add(1, Ordering::Relaxed);
                        return Ok(r);
                    }
                }
                let appended = {
                    let encode = |seq| encode_record(seq, version, kind, key, value);
                    let mut head = self.head();
                    match self.append_to(&mut head, len, false, &encode) {
                        Err(KvError::Full) => {
                            drop(head);
                            self.append_anywhere(len, &encode)
                        }
                        r => r,
                    }
                };
                match appended {
                    Ok(loc) => {
                        self.region.appends().fetch_add(1, Ordering::Relaxed);
                        let new = if kind == Kind::Value { loc } else { 0 };
                        self.index
                            .set(&g, h, &is_key, new)
                            .map_err(|()| KvError::IndexFull)?;
                        if let Some((l, rh)) = &cur {
                            self.segs.unlive(seg_of(*l), rh.len, "replaced");
                            self.region
                                .data()
                                .fetch_sub((rh.key_len + rh.value_len) as u64, Ordering::Relaxed);
                        }
                        match (cur.is_some(), kind) {
                            (false, Kind::Value) => {
                                self.region.keys().fetch_add(1, Ordering::Relaxed);
                            }
                            (true, Kind::Tombstone) => {
                                self.region.keys().fetch_sub(1, Ordering::Relaxed);
                                self.segs.note_tombstone(
                                    seg_of(loc),
                                    len,
                                    u64::from_le_bytes(horizon),
                                );
                            }
                            _ => {}
                        }
                        if kind == Kind::Value {
                            self.region.data().fetch_add(data, Ordering::Relaxed);
                        }
                        return Ok(r);
                    }
                    Err(KvError::Full) => {}
                    Err(e) => return Err(e),
                }
            }
            // Compact while that makes room (here or in another thread); full when four
            // rounds in a row gained no segment, none is free beyond the reserve, and no
            // other round is running now.
            let gained = self.compact(4)?;
            self.reclaim_waiting();
            if gained == 0 && self.free_count() <= RESERVE {
                // A round can gain nothing whole and still leave room in compaction's
                // head for the next one (at high utilization): a few in a row; then,
                // unless another round is running now, full.
                fruitless += 1;
                if fruitless >= 4 && self.compaction_idle() {
                    return Err(KvError::Full);
                }
                std::thread::yield_now();
            } else {
                fruitless = 0;
            }
        }
        Err(KvError::Full)
    }
}
