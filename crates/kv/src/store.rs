//! The store: a log of records in the pool's segments, one log head per core, the
//! optimistic index over them, recovery by scanning the segments.

use crate::epoch::Epochs;
// A key's 64-bit hash: FNV-1a with the splitmix64 finaliser, as Cairn's directories hash
// their names.
use crate::format::{
    self, decode_record_header, encode_record, encode_segment_header, record_len, record_valid,
    Kind, MAX_KEY, MAX_VALUE, RECORD_HEADER, SEGMENT_BYTES, SEGMENT_HEADER,
};
use crate::index::Index;
use crate::pool::Pool;
use cairn_format::dir::hash;
use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// Why an operation failed.
#[derive(Debug)]
pub enum KvError {
    /// The pool has no free segment for a new record (Redis' `-OOM`).
    Full,
    /// The index has no room for another key.
    IndexFull,
    /// A key of 0 or more than [`MAX_KEY`] bytes, or a value over [`MAX_VALUE`].
    TooBig(String),
    /// The media failed or holds something that is not a record.
    Io(io::Error),
}

impl std::fmt::Display for KvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KvError::Full => write!(f, "the pool is full"),
            KvError::IndexFull => write!(f, "the index is full"),
            KvError::TooBig(m) => write!(f, "{m}"),
            KvError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for KvError {}

impl From<io::Error> for KvError {
    fn from(e: io::Error) -> KvError {
        KvError::Io(e)
    }
}

/// How to open a store.
#[derive(Debug, Clone)]
pub struct Options {
    /// Bytes of a new pool (rounded down to 2 MiB segments; ignored for an existing one).
    pub size: u64,
    /// Keys the index is sized for (default: one per KiB of pool).
    pub expected_keys: Option<u64>,
    /// Log heads (default: one per CPU).
    pub heads: Option<usize>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            size: 256 << 20,
            expected_keys: None,
            heads: None,
        }
    }
}

/// Figures of a store ([`Store::stats`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Keys present.
    pub keys: u64,
    /// Bytes of the records that are current (values and tombstones).
    pub live_bytes: u64,
    /// Bytes of segments holding records, and of the whole pool.
    pub used_bytes: u64,
    pub pool_bytes: u64,
    /// Segments free.
    pub free_segments: u64,
    /// Bytes compaction copied, and segments it emptied.
    pub compacted_bytes: u64,
    pub compacted_segments: u64,
}

/// A log head: the segment it appends to and where.
#[derive(Debug, Default)]
struct Head {
    seg: u64,
    seq: u64,
    off: u64,
}

/// A persistent key-value store in a pool file.
pub struct Store {
    pool: Pool,
    index: Index,
    heads: Vec<Mutex<Head>>,
    /// The next record version.
    version: AtomicU64,
    /// The next segment sequence number.
    next_seq: AtomicU64,
    free: Mutex<Vec<u64>>,
    /// Live bytes per segment.
    live: Vec<AtomicU64>,
    /// Per segment: the sequence number it was opened under (0: free), whether it is a
    /// log head now, and the version counter when it was opened (its age).
    seqs: Vec<AtomicU64>,
    is_head: Vec<AtomicBool>,
    born: Vec<AtomicU64>,
    keys: AtomicU64,
    epochs: Epochs,
    /// Segments emptied by compaction, by the epoch they were retired at.
    retired: Mutex<Vec<(u64, u64)>>,
    /// Compaction's own head (one compaction at a time: its lock).
    compactor: Mutex<Head>,
    compacted_bytes: AtomicU64,
    compacted_segments: AtomicU64,
}

/// Free segments only compaction may take (so that it can always make room).
const RESERVE: usize = 1;

/// The segment of a location (a byte offset in the pool).
fn seg_of(loc: u64) -> u64 {
    loc / SEGMENT_BYTES
}

/// What recovery found for a key: the newest record.
struct Found {
    version: u64,
    loc: u64,
    len: u64,
    kind: Kind,
}

impl Store {
    /// Open the store in the pool file at `path`, creating it if it does not exist,
    /// and recover its index from the records.
    pub fn open(path: &Path, opts: &Options) -> Result<Store, KvError> {
        let pool = Pool::open(path, opts.size)?;
        let segments = pool.header.segments;
        let pool_bytes = segments * SEGMENT_BYTES;
        let nheads = opts
            .heads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1);
        let store = Store {
            index: Index::new(opts.expected_keys.unwrap_or(pool_bytes / 1024).max(64)),
            pool,
            heads: (0..nheads).map(|_| Mutex::new(Head::default())).collect(),
            version: AtomicU64::new(1),
            next_seq: AtomicU64::new(1),
            free: Mutex::new(Vec::new()),
            live: (0..segments).map(|_| AtomicU64::new(0)).collect(),
            seqs: (0..segments).map(|_| AtomicU64::new(0)).collect(),
            is_head: (0..segments).map(|_| AtomicBool::new(false)).collect(),
            born: (0..segments).map(|_| AtomicU64::new(0)).collect(),
            keys: AtomicU64::new(0),
            epochs: Epochs::new(),
            retired: Mutex::new(Vec::new()),
            compactor: Mutex::new(Head::default()),
            compacted_bytes: AtomicU64::new(0),
            compacted_segments: AtomicU64::new(0),
        };
        store.recover()?;
        Ok(store)
    }

    /// Scan every segment; the newest record of each key wins; install the values.
    fn recover(&self) -> Result<(), KvError> {
        let segments = self.pool.header.segments;
        let mut newest: HashMap<Vec<u8>, Found> = HashMap::new();
        let (mut max_seq, mut max_version) = (0u64, 0u64);
        let mut free = Vec::new();
        let mut buf = vec![0u8; SEGMENT_BYTES as usize];
        for s in (1..segments).rev() {
            let base = Pool::seg_off(s);
            let mut h = [0u8; SEGMENT_HEADER as usize];
            self.pool.map.read(base, &mut h)?;
            let Some(seq) = format::decode_segment_header(&h) else {
                free.push(s);
                continue;
            };
            max_seq = max_seq.max(seq);
            self.seqs[s as usize].store(seq, Ordering::Relaxed);
            self.pool.map.read(base, &mut buf)?;
            let mut off = SEGMENT_HEADER;
            while off + RECORD_HEADER <= SEGMENT_BYTES {
                let at = off as usize;
                let Some(rh) = decode_record_header(&buf[at..], SEGMENT_BYTES - off) else {
                    break;
                };
                if !record_valid(seq, &rh, &buf[at..at + rh.len as usize]) {
                    break;
                }
                max_version = max_version.max(rh.version);
                let k = at + RECORD_HEADER as usize;
                let key = &buf[k..k + rh.key_len];
                let f = Found {
                    version: rh.version,
                    loc: base as u64 + off,
                    len: rh.len,
                    kind: rh.kind,
                };
                match newest.get_mut(key) {
                    Some(old) if old.version >= f.version => {}
                    Some(old) => *old = f,
                    None => {
                        newest.insert(key.to_vec(), f);
                    }
                }
                off += rh.len;
            }
        }
        for (key, f) in &newest {
            self.live[seg_of(f.loc) as usize].fetch_add(f.len, Ordering::Relaxed);
            if f.kind == Kind::Value {
                let h = hash(key);
                let g = self.index.lock_key(h);
                self.index
                    .set(&g, h, &|l| self.key_is(l, key), f.loc)
                    .map_err(|()| KvError::IndexFull)?;
                self.keys.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.version.store(max_version + 1, Ordering::Relaxed);
        self.next_seq.store(max_seq + 1, Ordering::Relaxed);
        // Segments holding nothing current (emptied by a compaction the crash
        // interrupted before they were reused) are free; they keep their sequence number
        // until reused, for the tombstones that name their records.
        for s in 1..segments {
            if self.seqs[s as usize].load(Ordering::Relaxed) != 0
                && self.live[s as usize].load(Ordering::Relaxed) == 0
            {
                free.push(s);
            }
        }
        *self.free.lock().unwrap_or_else(|e| e.into_inner()) = free;
        Ok(())
    }

    /// The header of the record at `loc`.
    fn header_at(&self, loc: u64) -> io::Result<format::RecordHeader> {
        let mut h = [0u8; RECORD_HEADER as usize];
        self.pool.map.read(loc as usize, &mut h)?;
        let room = SEGMENT_BYTES - loc % SEGMENT_BYTES;
        decode_record_header(&h, room)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "index: not a record"))
    }

    /// Whether the record at `loc` is `key`'s.
    fn key_is(&self, loc: u64, key: &[u8]) -> bool {
        let Ok(h) = self.header_at(loc) else {
            return false;
        };
        if h.key_len != key.len() {
            return false;
        }
        let mut k = vec![0u8; key.len()];
        self.pool
            .map
            .read((loc + RECORD_HEADER) as usize, &mut k)
            .is_ok()
            && k == key
    }

    fn check(key: &[u8], value: &[u8]) -> Result<(), KvError> {
        if key.is_empty() || key.len() > MAX_KEY {
            return Err(KvError::TooBig(format!(
                "a key has 1 to {MAX_KEY} bytes, not {}",
                key.len()
            )));
        }
        if value.len() > MAX_VALUE {
            return Err(KvError::TooBig(format!(
                "a value has at most {MAX_VALUE} bytes, not {}",
                value.len()
            )));
        }
        Ok(())
    }

    /// The log head of the calling CPU (one per core: appends from different cores
    /// never contend; a thread that moved meanwhile only shares a head for a while).
    fn head(&self) -> std::sync::MutexGuard<'_, Head> {
        let i = cairn_media::sys::current_cpu() % self.heads.len();
        self.heads[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Take a free segment for a head (a client's: not the last [`RESERVE`] ones, which
    /// only compaction takes) and open it under a new sequence number.
    fn roll(&self, head: &mut Head, for_compaction: bool) -> Result<(), KvError> {
        let s = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            if free.len() <= RESERVE && !for_compaction {
                return Err(KvError::Full);
            }
            let s = free.pop().ok_or(KvError::Full)?;
            // A head from now on (under the free list's lock: compaction chooses among
            // segments neither free nor heads under the same lock).
            self.is_head[s as usize].store(true, Ordering::Release);
            s
        };
        if head.seg != 0 {
            self.is_head[head.seg as usize].store(false, Ordering::Release);
        }
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let h = encode_segment_header(seq);
        let off = Pool::seg_off(s);
        self.pool.map.write(off, &h)?;
        self.pool.map.persist(off, h.len())?;
        self.seqs[s as usize].store(seq, Ordering::Release);
        self.born[s as usize].store(self.version.load(Ordering::Relaxed), Ordering::Relaxed);
        *head = Head {
            seg: s,
            seq,
            off: SEGMENT_HEADER,
        };
        Ok(())
    }

    /// Append the record `rec` (`len` bytes, encoded for `head.seq` by `encode`) to
    /// `head`, durable when this returns; its location.
    fn append_to(
        &self,
        head: &mut Head,
        len: u64,
        for_compaction: bool,
        encode: &dyn Fn(u64) -> Vec<u8>,
    ) -> Result<u64, KvError> {
        if head.seg == 0 || head.off + len > SEGMENT_BYTES {
            self.roll(head, for_compaction)?;
        }
        let rec = encode(head.seq);
        let loc = Pool::seg_off(head.seg) as u64 + head.off;
        self.pool.map.write_nt(loc as usize, &rec)?;
        cairn_media::fence();
        head.off += len;
        self.live[head.seg as usize].fetch_add(len, Ordering::Relaxed);
        Ok(loc)
    }

    /// Write `key`'s record of `kind` (a value, or a tombstone holding `value`), durable
    /// when this returns, and make it current. The key's lock is held from the version
    /// to the index, so a key's versions follow the order its writes take effect in (a
    /// deletion, which leaves no index entry, is ordered too). A full pool is compacted
    /// (on the caller's thread, with no lock held) while that makes room. Returns the
    /// previous record's location, `None` for the deletion of an absent key.
    fn write(&self, key: &[u8], kind: Kind, value: &[u8]) -> Result<Option<u64>, KvError> {
        let h = hash(key);
        for _ in 0..16 {
            {
                let _pin = self.epochs.pin();
                let g = self.index.lock_key(h);
                let is_key = |l: u64| self.key_is(l, key);
                let cur = self.index.get_locked(&g, h, &is_key);
                if kind == Kind::Tombstone && cur.is_none() {
                    return Ok(None);
                }
                let version = self.version.fetch_add(1, Ordering::Relaxed);
                // A tombstone's horizon, read under the key's lock: no record of the key
                // can be written into a segment opened from now on but by later calls.
                let horizon = self.next_seq.load(Ordering::Acquire).to_le_bytes();
                let value = if kind == Kind::Tombstone {
                    &horizon[..]
                } else {
                    value
                };
                let r = {
                    let mut head = self.head();
                    self.append_to(
                        &mut head,
                        record_len(key.len(), value.len()),
                        false,
                        &|seq| encode_record(seq, version, kind, key, value),
                    )
                };
                match r {
                    Ok(loc) => {
                        let new = if kind == Kind::Value { loc } else { 0 };
                        let prev = self
                            .index
                            .set(&g, h, &is_key, new)
                            .map_err(|()| KvError::IndexFull)?;
                        if prev != 0 {
                            let old = self.header_at(prev)?;
                            self.unlive(seg_of(prev), old.len, "replaced");
                        }
                        match (prev != 0, kind) {
                            (false, Kind::Value) => {
                                self.keys.fetch_add(1, Ordering::Relaxed);
                            }
                            (true, Kind::Tombstone) => {
                                self.keys.fetch_sub(1, Ordering::Relaxed);
                            }
                            _ => {}
                        }
                        return Ok(Some(prev));
                    }
                    Err(KvError::Full) => {}
                    Err(e) => return Err(e),
                }
            }
            // Compact while that makes room (here or in another thread); full when not.
            let emptied = self.compact(4)?;
            let freed = self.reclaim_waiting();
            if emptied == 0 && !freed && self.free_count() <= RESERVE {
                return Err(KvError::Full);
            }
        }
        Err(KvError::Full)
    }

    /// Set `key` to `value`, durably.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<(), KvError> {
        Self::check(key, value)?;
        self.write(key, Kind::Value, value).map(|_| ())
    }

    /// Remove `key`, durably: a tombstone record, which holds the segment sequence
    /// counter at the time (its horizon: every older record of the key is in a segment
    /// opened before it; compaction keeps the tombstone while such a segment may still be
    /// read at a recovery). Whether it was present.
    pub fn delete(&self, key: &[u8]) -> Result<bool, KvError> {
        Self::check(key, b"")?;
        Ok(self.write(key, Kind::Tombstone, b"")?.is_some())
    }

    /// The location of `key`'s current record.
    fn find(&self, key: &[u8]) -> Option<u64> {
        self.index.get(hash(key), &|l| self.key_is(l, key))
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &[u8]) -> Result<bool, KvError> {
        let _pin = self.epochs.pin();
        Ok(self.find(key).is_some())
    }

    /// `key`'s value appended to `out` (its length), or `None`.
    pub fn get(&self, key: &[u8], out: &mut Vec<u8>) -> Result<Option<usize>, KvError> {
        // The record stays where it is while the pin lives (compaction reuses a segment
        // only after every reader that could have found it is gone).
        let _pin = self.epochs.pin();
        let Some(loc) = self.find(key) else {
            return Ok(None);
        };
        let h = self.header_at(loc)?;
        let at = out.len();
        out.resize(at + h.value_len, 0);
        self.pool
            .map
            .read((loc + RECORD_HEADER) as usize + h.key_len, &mut out[at..])?;
        Ok(Some(h.value_len))
    }

    /// Keys present.
    pub fn len(&self) -> u64 {
        self.keys.load(Ordering::Relaxed)
    }

    /// Whether no key is present.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Figures of the store.
    pub fn stats(&self) -> Stats {
        let free = self.free_count() as u64;
        let segments = self.pool.header.segments;
        Stats {
            keys: self.len(),
            live_bytes: self.live.iter().map(|l| l.load(Ordering::Relaxed)).sum(),
            used_bytes: (segments - 1 - free) * SEGMENT_BYTES,
            pool_bytes: segments * SEGMENT_BYTES,
            free_segments: free,
            compacted_bytes: self.compacted_bytes.load(Ordering::Relaxed),
            compacted_segments: self.compacted_segments.load(Ordering::Relaxed),
        }
    }

    /// [`Store::reclaim`], waiting up to 100 ms for readers to leave the epochs that
    /// hold retired segments back; whether any was freed.
    fn reclaim_waiting(&self) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(100);
        loop {
            if self.reclaim() {
                return true;
            }
            let waiting = !self
                .retired
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty();
            if !waiting || std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::yield_now();
        }
    }

    /// Free the segments compaction retired that no reader can still be in; whether any
    /// was.
    pub fn reclaim(&self) -> bool {
        let min = self.epochs.min_pinned();
        let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        let before = retired.len();
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let mut freed = Vec::new();
        retired.retain(|&(e, s)| {
            let keep = e >= min;
            if !keep {
                freed.push(s);
            }
            keep
        });
        for s in freed {
            // Its header erased (durably), its records are nothing to a recovery: no
            // tombstone has to stay for them.
            let off = Pool::seg_off(s);
            if self
                .pool
                .map
                .zero(off, SEGMENT_HEADER as usize)
                .and_then(|()| self.pool.map.persist(off, SEGMENT_HEADER as usize))
                .is_ok()
            {
                self.seqs[s as usize].store(0, Ordering::Release);
            }
            free.push(s);
        }
        retired.len() < before
    }

    /// One compaction round: the closed segments with the best cost-benefit
    /// (`(1 − u)·age / (1 + u)`, u = live bytes / segment), at most `max` of them, their
    /// current records copied to compaction's head (durable before anything else
    /// changes), the index switched key by key under each key's lock (a writer that got
    /// there first wins), the emptied segments retired until no reader can be in them.
    /// Returns the segments emptied.
    pub fn compact(&self, max: usize) -> Result<usize, KvError> {
        let mut head = self.compactor.lock().unwrap_or_else(|e| e.into_inner());
        // The segment the previous round copied into is closed: it can be a candidate
        // (what it holds may have died since).
        if head.seg != 0 {
            self.is_head[head.seg as usize].store(false, Ordering::Release);
            *head = Head::default();
        }
        self.reclaim();
        let now = self.version.load(Ordering::Relaxed);
        let closed: Vec<u64> = {
            let retired: Vec<u64> = self
                .retired
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|&(_, s)| s)
                .collect();
            let free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            (1..self.pool.header.segments)
                .filter(|&s| {
                    self.seqs[s as usize].load(Ordering::Acquire) != 0
                        && !self.is_head[s as usize].load(Ordering::Acquire)
                        && !retired.contains(&s)
                        && !free.contains(&s)
                })
                .collect()
        };
        let mut cands: Vec<(f64, u64)> = closed
            .into_iter()
            .filter_map(|s| {
                let u = self.live[s as usize].load(Ordering::Relaxed) as f64 / SEGMENT_BYTES as f64;
                let age =
                    now.saturating_sub(self.born[s as usize].load(Ordering::Relaxed)) as f64 + 1.0;
                // A segment over 98% live is not worth copying.
                (u < 0.98).then_some(((1.0 - u) * age / (1.0 + u), s))
            })
            .collect();
        cands.sort_by(|a, b| b.0.total_cmp(&a.0));
        let mut emptied = 0;
        for &(_, s) in cands.iter().take(max) {
            match self.compact_segment(&mut head, s) {
                Ok(()) => {}
                // No room left for the copies: the segment keeps what was not moved.
                Err(KvError::Full) => break,
                Err(e) => return Err(e),
            }
            let at = self.epochs.advance();
            self.retired
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((at, s));
            self.compacted_segments.fetch_add(1, Ordering::Relaxed);
            emptied += 1;
            // Free at once if no reader can be in it: the next copies can go there.
            self.reclaim();
        }
        Ok(emptied)
    }

    /// Take `n` live bytes from segment `s` (checked builds check the count).
    fn unlive(&self, s: u64, n: u64, why: &str) {
        let before = self.live[s as usize].fetch_sub(n, Ordering::Relaxed);
        debug_assert!(
            before >= n,
            "segment {s}: {before} live bytes, {n} taken ({why})"
        );
    }

    fn free_count(&self) -> usize {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Copy segment `s`'s current records to compaction's head.
    fn compact_segment(&self, head: &mut Head, s: u64) -> Result<(), KvError> {
        let seq = self.seqs[s as usize].load(Ordering::Acquire);
        // The oldest incarnation of any other segment that may hold records.
        let oldest = (1..self.seqs.len())
            .filter(|&o| o != s as usize)
            .map(|o| self.seqs[o].load(Ordering::Acquire))
            .filter(|&q| q != 0)
            .min()
            .unwrap_or(u64::MAX);
        let base = Pool::seg_off(s);
        let mut buf = vec![0u8; SEGMENT_BYTES as usize];
        self.pool.map.read(base, &mut buf)?;
        let mut off = SEGMENT_HEADER;
        while off + RECORD_HEADER <= SEGMENT_BYTES {
            let at = off as usize;
            let Some(rh) = decode_record_header(&buf[at..], SEGMENT_BYTES - off) else {
                break;
            };
            let rec = &buf[at..at + rh.len as usize];
            if !record_valid(seq, &rh, rec) {
                break;
            }
            let loc = base as u64 + off;
            off += rh.len;
            let k = RECORD_HEADER as usize;
            let key = &rec[k..k + rh.key_len];
            let value = &rec[k + rh.key_len..k + rh.key_len + rh.value_len];
            let live = match rh.kind {
                Kind::Value => {
                    let _pin = self.epochs.pin();
                    let h = hash(key);
                    let g = self.index.lock_key(h);
                    let is_key = |l: u64| self.key_is(l, key);
                    if self.index.get_locked(&g, h, &is_key) != Some(loc) {
                        continue;
                    }
                    let new = self.append_to(head, rh.len, true, &|sq| {
                        encode_record(sq, rh.version, Kind::Value, key, value)
                    })?;
                    self.index
                        .set(&g, h, &is_key, new)
                        .map_err(|()| KvError::IndexFull)?;
                    true
                }
                Kind::Tombstone => {
                    // Kept while a segment opened before it (other than this one) may
                    // still hold an older record of the key.
                    let horizon = u64::from_le_bytes(value.try_into().unwrap_or([0; 8]));
                    let needed = oldest < horizon;
                    if needed {
                        self.append_to(head, rh.len, true, &|sq| {
                            encode_record(sq, rh.version, Kind::Tombstone, key, value)
                        })?;
                    }
                    needed
                }
            };
            self.unlive(s, rh.len, if live { "moved" } else { "tombstone dropped" });
            if live {
                self.compacted_bytes.fetch_add(rh.len, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}
