//! The store's API: open (recovery), reads, writes, statistics; the compaction threads'
//! lifetime.

use crate::format::SEGMENT_BYTES;
use crate::index::Index;
use crate::log::{Change, Core, Setup};
use crate::pool::Pool;
use crate::region::{Region, SharedOpen};
use std::borrow::Cow;
use std::io;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

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

/// What an update of an existing key does (Nibble or Nibble-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UpdatePolicy {
    /// Append the new value and drop the old one (Nibble): the old copy is garbage
    /// until compaction.
    #[default]
    Append,
    /// Overwrite the current record in place when the new value fits its allocation
    /// (Nibble-2), through the journal; a value that grows is appended.
    InPlace,
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
    /// Updates in place or appended.
    pub policy: UpdatePolicy,
    /// Compaction in a background thread (off: compaction runs only when a write
    /// finds the pool full, or on [`Store::compact`]). One thread: on this machine's
    /// two cores more would only take turns (rounds are serialized).
    pub background_compaction: bool,
    /// Background compaction runs while fewer than this fraction of the segments are
    /// free.
    pub compact_below: f64,
    /// Background compaction also runs while more than this fraction of the bytes of
    /// the closed segments is dead, and free segments beyond a few give their memory
    /// back to the system after a second, so that the memory a store holds follows the
    /// segments in use: a bound on memory over live data, paid for in compaction
    /// traffic. `None`: compaction runs only when free segments run short, and they
    /// keep their memory (the pool's size is the bound).
    pub max_garbage: Option<f64>,
    /// Back the segments with huge folios where the kernel allows (collapsed in a
    /// thread after opening, and when a head takes a segment whose memory was handed
    /// back).
    pub huge_pages: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            size: 256 << 20,
            expected_keys: None,
            heads: None,
            policy: UpdatePolicy::Append,
            background_compaction: true,
            compact_below: 0.2,
            max_garbage: None,
            huge_pages: true,
        }
    }
}

/// Figures of a store ([`Store::stats`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Keys present, and the bytes of their keys and values (the live data).
    pub keys: u64,
    pub data_bytes: u64,
    /// Bytes of the records that are current (values and tombstones, with their
    /// headers and padding).
    pub live_bytes: u64,
    /// Bytes of segments holding records, of the index, and of the whole pool.
    pub used_bytes: u64,
    pub index_bytes: u64,
    pub pool_bytes: u64,
    /// Bytes of the pool the system holds in memory (free segments beyond a few are
    /// handed back), and the fraction of the closed segments' bytes that is dead.
    pub resident_bytes: u64,
    pub garbage: f64,
    /// Segments free, and retired (emptied, waiting for readers to leave).
    pub free_segments: u64,
    pub retired_segments: u64,
    /// Bytes compaction copied, segments it emptied, rounds it ran, segments it could
    /// not empty or errors it met.
    pub compacted_bytes: u64,
    pub compacted_segments: u64,
    pub compaction_rounds: u64,
    pub compaction_errors: u64,
    /// Records appended by writes, and updates made in place.
    pub appends: u64,
    pub in_place_updates: u64,
    /// Segments in use by the fraction of their bytes that is live: `[0]` under 10%,
    /// `[1]` 10–20%, …, `[9]` 90% and more.
    pub utilization: [u64; 10],
    /// Whether writes are fenced (not the volatile mode), and the update policy.
    pub durable: bool,
    pub policy: UpdatePolicy,
    /// Whether processes share the store ([`Store::open_shared`]); processes found gone
    /// with some of its state in their hands, and the repairs made for them (a free
    /// list rebuilt, a segment's live count dropped).
    pub shared: bool,
    pub processes_reaped: u64,
    pub repairs: u64,
}

impl Stats {
    /// Memory used (segments in use and the index) over the live data, minus one: the
    /// store's memory overhead (0.1 = 10%).
    pub fn overhead(&self) -> f64 {
        if self.data_bytes == 0 {
            return 0.0;
        }
        (self.used_bytes + self.index_bytes) as f64 / self.data_bytes as f64 - 1.0
    }
}

/// A persistent key-value store in a pool file.
pub struct Store {
    core: Arc<Core>,
    /// The compaction thread, and the one collapsing segments into huge folios.
    threads: Vec<JoinHandle<()>>,
    /// A shared store's hold on the pool (dropped after `core`: the last process to
    /// let go removes the region).
    _shared: Option<SharedOpen>,
}

impl Drop for Store {
    fn drop(&mut self) {
        self.core.compactor.stop();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if self.core.region.shared {
            // Others go on: what this process held goes back to them.
            self.core.leave();
        } else if cfg!(debug_assertions) && !std::thread::panicking() {
            // Quiescent now: the store's own threads are gone, and no call can be
            // running.
            self.core.check();
        }
    }
}

impl Store {
    /// Open the store in the pool file at `path`, creating it if it does not exist,
    /// and recover its index from the records (redoing the in-place updates a crash cut
    /// short). One process at a time: the pool is locked (`flock`) while open.
    pub fn open(path: &Path, opts: &Options) -> Result<Store, KvError> {
        Self::start(Pool::open(path, opts.size)?, opts, true)
    }

    /// A store in memory only (DRAM, no fences, nothing kept when it is dropped).
    pub fn open_volatile(opts: &Options) -> Result<Store, KvError> {
        Self::start(Pool::volatile(opts.size)?, opts, false)
    }

    /// Open the store in the pool file at `path` (created if it does not exist) in this
    /// process while other processes have it open too: every `get`, `put` and `delete`
    /// runs in the calling process, on the index, epochs and segments' state all of
    /// them map (a region file on `/dev/shm`, rebuilt by recovery by the first process
    /// to open the pool). A process killed at any point loses nothing the others
    /// acknowledged, nor anything it acknowledged itself; what it held (its log heads,
    /// a bucket lock, a compaction round) is taken back by the others. Updates are
    /// appended ([`UpdatePolicy::InPlace`] is refused: `Unsupported`). Fails with
    /// `WouldBlock` while a process has the pool open on its own ([`Store::open`]).
    pub fn open_shared(path: &Path, opts: &Options) -> Result<Store, KvError> {
        if opts.policy == UpdatePolicy::InPlace {
            return Err(KvError::Io(io::Error::new(
                io::ErrorKind::Unsupported,
                "a store shared by processes appends updates: in-place updates are not \
                 supported there",
            )));
        }
        let setup = Self::setup(opts, true)?;
        let buckets = |segments: u64| Self::buckets(opts, segments);
        let (pool, region, admission) = SharedOpen::open(path, opts.size, buckets)?;
        let core = Arc::new(Core::new(pool, region, &setup)?);
        if admission.first {
            core.recover()?;
            core.region.ready();
        }
        let first = admission.first;
        let hold = admission.admit()?;
        // What processes that all died left of other pools' regions goes now.
        crate::region::sweep();
        Self::run(core, opts, Some(hold), first)
    }

    /// The index's buckets for a pool of `segments` segments.
    fn buckets(opts: &Options, segments: u64) -> usize {
        Index::buckets_for(
            opts.expected_keys
                .unwrap_or(segments * SEGMENT_BYTES / 1024)
                .max(64),
        )
    }

    /// What `opts` says a store's state is built with.
    fn setup(opts: &Options, durable: bool) -> Result<Setup, KvError> {
        if !(0.0..=1.0).contains(&opts.compact_below) {
            return Err(KvError::TooBig(format!(
                "the compaction trigger is a fraction of the pool (0 to 1), not {}",
                opts.compact_below
            )));
        }
        if let Some(g) = opts.max_garbage.filter(|g| !(0.0..1.0).contains(g)) {
            return Err(KvError::TooBig(format!(
                "the garbage bound is a fraction of the segments' bytes (0 to 1), not {g}"
            )));
        }
        Ok(Setup {
            heads: opts
                .heads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
            policy: opts.policy,
            durable,
            trigger: opts.compact_below,
            max_garbage: opts.max_garbage,
            huge_pages: opts.huge_pages,
        })
    }

    fn start(pool: Pool, opts: &Options, durable: bool) -> Result<Store, KvError> {
        let setup = Self::setup(opts, durable)?;
        let region = Region::owned(
            &pool.header.uuid,
            pool.header.segments,
            Self::buckets(opts, pool.header.segments),
        )?;
        let core = Arc::new(Core::new(pool, region, &setup)?);
        core.recover()?;
        Self::run(core, opts, None, true)
    }

    /// Start the store's threads; `collapse`: the segments are to be collapsed into huge
    /// folios (a property of the pool file's pages, which the first process to open a
    /// shared store sees to: the others' mappings take the folios it made).
    fn run(
        core: Arc<Core>,
        opts: &Options,
        shared: Option<SharedOpen>,
        collapse: bool,
    ) -> Result<Store, KvError> {
        let mut threads = Vec::new();
        if opts.background_compaction {
            let c = core.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("kv-compact".into())
                    .spawn(move || crate::compact::run(c))?,
            );
        }
        // Huge folios for the segments, after recovery and off the opening's path.
        let c = core.clone();
        if c.huge && collapse {
            threads.push(
                std::thread::Builder::new()
                    .name("kv-collapse".into())
                    .spawn(move || {
                        // Worth having, but not at the expense of the requests served
                        // meanwhile: a fresh 1 GiB pool is half a second of a CPU.
                        let _ = cairn_media::sys::background_priority();
                        // Segment 0 holds the header and the journal's slots: a few pages.
                        let skip = |s: u64| s == 0 || c.segs.is_released(s);
                        c.pool.collapse_all(&skip, &|| c.compactor.stopping())
                    })?,
            );
        }
        Ok(Store {
            core,
            threads,
            _shared: shared,
        })
    }

    /// Set `key` to `value`, durably.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<(), KvError> {
        self.core
            .update(key, |_| Ok((Change::Put(Cow::Borrowed(value)), ())))
    }

    /// A batch of puts made durable together: one fence for all of them, each value
    /// visible only once durable, the outcomes known at [`Batch::commit`] (group
    /// commit; see [`crate::Batch`]). For a server that acknowledges the requests it
    /// read together once they are all durable.
    pub fn batch(&self) -> crate::Batch<'_> {
        crate::Batch::new(&self.core)
    }

    /// Remove `key`, durably: a tombstone record, which holds the segment sequence
    /// counter at the time (its horizon: every older record of the key is in a segment
    /// opened before it; compaction keeps the tombstone while such a segment may still be
    /// read at a recovery). Whether it was present.
    pub fn delete(&self, key: &[u8]) -> Result<bool, KvError> {
        self.core
            .update(key, |cur| Ok((Change::Delete, cur.is_some())))
    }

    /// Change `key` atomically: `decide` gets its current value (`None`: absent) and
    /// says what to do ([`Change`]) and what to return. Nothing else changes the key
    /// between the two; the change is durable on return. `decide` may be called again
    /// when the pool had to be compacted to make room.
    pub fn update<'v, R>(
        &self,
        key: &[u8],
        decide: impl FnMut(Option<&[u8]>) -> Result<(Change<'v>, R), KvError>,
    ) -> Result<R, KvError> {
        self.core.update(key, decide)
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &[u8]) -> Result<bool, KvError> {
        Core::check_key(key)?;
        let _pin = self.core.epochs.pin();
        Ok(self
            .core
            .index
            .get(self.core.index.key_hash(key), &|l| self.core.key_is(l, key))
            .is_some())
    }

    /// `key`'s value appended to `out` (its length), or `None`. Never a torn value: in
    /// the in-place mode the copy is validated against the key's bucket version after
    /// it is made (a seqlock), and made again if a writer came by.
    pub fn get(&self, key: &[u8], out: &mut Vec<u8>) -> Result<Option<usize>, KvError> {
        Core::check_key(key)?;
        let core = &*self.core;
        // The record stays where it is while the pin lives (compaction reuses a segment
        // only after every reader that could have found it is gone).
        let _pin = core.epochs.pin();
        let h = core.index.key_hash(key);
        let is_key = |l: u64| core.key_is(l, key);
        let at = out.len();
        let copy = |loc: u64, out: &mut Vec<u8>| -> io::Result<usize> {
            let rh = core.header_at(loc)?;
            let v = core.value_at(loc, &rh)?;
            out.truncate(at);
            out.extend_from_slice(v);
            Ok(v.len())
        };
        let r = match core.policy {
            // Records are never rewritten: the index's own validation is enough.
            crate::UpdatePolicy::Append => core.index.get(h, &is_key).map(|l| copy(l, out)),
            crate::UpdatePolicy::InPlace => core.index.read(h, &is_key, |l| copy(l, out)),
        };
        Ok(r.transpose()?)
    }

    /// Run `f` on `key`'s value in place (no copy), under an epoch: the bytes stay
    /// where they are while `f` runs. In the in-place mode `f` runs under the key's
    /// bucket lock (so that no update rewrites the bytes meanwhile): keep it short.
    pub fn get_with<R>(
        &self,
        key: &[u8],
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>, KvError> {
        Core::check_key(key)?;
        let core = &*self.core;
        let _pin = core.epochs.pin();
        let h = core.index.key_hash(key);
        let is_key = |l: u64| core.key_is(l, key);
        let _lock;
        let loc = match core.policy {
            crate::UpdatePolicy::Append => core.index.get(h, &is_key),
            crate::UpdatePolicy::InPlace => {
                _lock = core.index.lock_key(h);
                core.index.get_locked(&_lock, h, &is_key)
            }
        };
        let Some(loc) = loc else { return Ok(None) };
        let rh = core.header_at(loc)?;
        Ok(Some(f(core.value_at(loc, &rh)?)))
    }

    /// Keys from the index's buckets `cursor..`, about `count` of them (whole buckets):
    /// `f` gets each key; returns the cursor to continue from, 0 when the scan is
    /// complete. As Redis's `SCAN`: a key present for the whole scan is seen at least
    /// once (entries never move between buckets); one added or removed meanwhile may
    /// or may not be.
    pub fn scan(&self, cursor: u64, count: usize, mut f: impl FnMut(&[u8])) -> u64 {
        let core = &*self.core;
        let n = core.index.buckets() as u64;
        let mut i = cursor;
        let mut seen = 0;
        let _pin = core.epochs.pin();
        while i < n && seen < count.max(1) {
            for loc in core.index.bucket_locations(i as usize) {
                // Under the pin the record stays where it is; keys are never rewritten.
                if let Ok(h) = core.header_at(loc) {
                    if let Ok(k) = core
                        .pool
                        .map
                        .bytes((loc + crate::format::RECORD_HEADER) as usize, h.key_len)
                    {
                        f(k);
                        seen += 1;
                    }
                }
            }
            i += 1;
        }
        if i >= n {
            0
        } else {
            i
        }
    }

    /// Keys present.
    pub fn len(&self) -> u64 {
        self.core.region.keys().load(Ordering::Relaxed)
    }

    /// Whether no key is present.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Figures of the store.
    pub fn stats(&self) -> Stats {
        let c = &*self.core;
        let free = c.free_count() as u64;
        let retired = c.epochs.retired().len() as u64;
        let segments = c.pool.header.segments;
        let utilization = c.segs.utilization();
        let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            keys: self.len(),
            data_bytes: n(c.region.data()),
            live_bytes: c.segs.live_total(),
            used_bytes: (segments - 1 - free) * SEGMENT_BYTES,
            index_bytes: c.index.bytes(),
            pool_bytes: segments * SEGMENT_BYTES,
            resident_bytes: c.pool.resident_bytes(),
            garbage: c.garbage(),
            free_segments: free,
            retired_segments: retired,
            compacted_bytes: n(c.region.compacted_bytes()),
            compacted_segments: n(c.region.compacted_segments()),
            compaction_rounds: n(c.region.compaction_rounds()),
            compaction_errors: n(c.region.compaction_errors()),
            appends: n(c.region.appends()),
            in_place_updates: n(c.region.in_place()),
            utilization,
            durable: c.durable,
            policy: c.policy,
            shared: c.region.shared,
            processes_reaped: n(c.region.deaths()),
            repairs: n(c.region.repaired()) + c.segs.repairs(),
        }
    }

    /// One compaction round of at most `max` segments (see `Core::compact`); the
    /// segments emptied.
    pub fn compact(&self, max: usize) -> Result<usize, KvError> {
        self.core.compact(max)
    }

    /// Free the segments compaction emptied that no reader can still be in; whether any
    /// was.
    pub fn reclaim(&self) -> bool {
        self.core.reclaim()
    }
}
