//! The store: a log of records in the pool's segments, one log head per core, the
//! optimistic index over them, recovery by scanning the segments.

use crate::format::{
    self, decode_record_header, encode_record, encode_segment_header, record_len, record_valid,
    Kind, MAX_KEY, MAX_VALUE, RECORD_HEADER, SEGMENT_BYTES, SEGMENT_HEADER,
};
use crate::index::Index;
use crate::pool::Pool;
use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
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
    keys: AtomicU64,
}

/// FNV-1a 64 with the splitmix64 finaliser (the same mix as Cairn's directories).
fn hash(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

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
            keys: AtomicU64::new(0),
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

    /// Open a free segment for `head`.
    fn roll(&self, head: &mut Head) -> Result<(), KvError> {
        let s = self
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .ok_or(KvError::Full)?;
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let h = encode_segment_header(seq);
        let off = Pool::seg_off(s);
        self.pool.map.write(off, &h)?;
        self.pool.map.persist(off, h.len())?;
        *head = Head {
            seg: s,
            seq,
            off: SEGMENT_HEADER,
        };
        Ok(())
    }

    /// Append a record, durable when this returns; its location.
    fn append(&self, version: u64, kind: Kind, key: &[u8], value: &[u8]) -> Result<u64, KvError> {
        let len = record_len(key.len(), value.len());
        let mut head = self.head();
        if head.seg == 0 || head.off + len > SEGMENT_BYTES {
            self.roll(&mut head)?;
        }
        let rec = encode_record(head.seq, version, kind, key, value);
        let loc = Pool::seg_off(head.seg) as u64 + head.off;
        self.pool.map.write_nt(loc as usize, &rec)?;
        cairn_media::fence();
        head.off += len;
        self.live[head.seg as usize].fetch_add(len, Ordering::Relaxed);
        Ok(loc)
    }

    /// Make the record at `loc` (version `version`, `len` bytes) the current one of
    /// `key`: a value (`present`) or a deletion.
    fn install(
        &self,
        key: &[u8],
        loc: u64,
        version: u64,
        len: u64,
        present: bool,
    ) -> Result<(), KvError> {
        let h = hash(key);
        let g = self.index.lock_key(h);
        let is_key = |l: u64| self.key_is(l, key);
        if let Some(cur) = self.index.get_locked(&g, h, &is_key) {
            if self.header_at(cur)?.version > version {
                // A newer record of the key won the race to the index.
                self.live[seg_of(loc) as usize].fetch_sub(len, Ordering::Relaxed);
                return Ok(());
            }
        }
        let prev = self
            .index
            .set(&g, h, &is_key, if present { loc } else { 0 })
            .map_err(|()| KvError::IndexFull)?;
        if prev != 0 {
            let old = self.header_at(prev)?;
            self.live[seg_of(prev) as usize].fetch_sub(old.len, Ordering::Relaxed);
        }
        match (prev != 0, present) {
            (false, true) => {
                self.keys.fetch_add(1, Ordering::Relaxed);
            }
            (true, false) => {
                self.keys.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
        Ok(())
    }

    /// Set `key` to `value`, durably.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<(), KvError> {
        Self::check(key, value)?;
        let version = self.version.fetch_add(1, Ordering::Relaxed);
        let loc = self.append(version, Kind::Value, key, value)?;
        self.install(key, loc, version, record_len(key.len(), value.len()), true)
    }

    /// Remove `key`, durably (a tombstone record). Whether it was present.
    pub fn delete(&self, key: &[u8]) -> Result<bool, KvError> {
        Self::check(key, b"")?;
        if !self.contains(key)? {
            return Ok(false);
        }
        let version = self.version.fetch_add(1, Ordering::Relaxed);
        let loc = self.append(version, Kind::Tombstone, key, b"")?;
        self.install(key, loc, version, record_len(key.len(), 0), false)?;
        Ok(true)
    }

    /// The location of `key`'s current record.
    fn find(&self, key: &[u8]) -> Option<u64> {
        self.index.get(hash(key), &|l| self.key_is(l, key))
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &[u8]) -> Result<bool, KvError> {
        Ok(self.find(key).is_some())
    }

    /// `key`'s value appended to `out` (its length), or `None`.
    pub fn get(&self, key: &[u8], out: &mut Vec<u8>) -> Result<Option<usize>, KvError> {
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
        let free = self.free.lock().unwrap_or_else(|e| e.into_inner()).len() as u64;
        let segments = self.pool.header.segments;
        Stats {
            keys: self.len(),
            live_bytes: self.live.iter().map(|l| l.load(Ordering::Relaxed)).sum(),
            used_bytes: (segments - 1 - free) * SEGMENT_BYTES,
            pool_bytes: segments * SEGMENT_BYTES,
            free_segments: free,
        }
    }
}
