//! The store's state in memory, as one table of words ([`Region`]): the header (the
//! counters, the compaction lock), the epochs, the segments' state with the free list,
//! and the index. A store open in one process keeps it in the process's own memory; a
//! store several processes open at once ([`crate::Store::open_shared`]) keeps it in a
//! file on `/dev/shm` that each of them maps, rebuilt by recovery by the first to open
//! the pool (while no other has it open) and removed by the last to close it.
//!
//! The open protocol (`SharedOpen`): the region file's `flock` serializes openers and
//! closers; the pool file's `flock` says who uses the pool (shared by every process of
//! a shared store, exclusive for [`crate::Store::open`]). An opener that gets the
//! pool's lock exclusively is alone: it builds the region and turns its lock into a
//! shared one before it lets the next opener in; one that gets it shared attaches to
//! the region the first built. A process killed while it builds leaves a region
//! without its `READY` word, rebuilt by the next opener, who is alone again.

use crate::epoch;
use crate::index::Index;
use crate::segment::Segments;
use cairn_media::words::Words;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Words of the header.
const HEADER_WORDS: usize = 64;
/// The header's words.
const MAGIC: usize = 0;
const READY: usize = 1;
const UUID: usize = 2;
const SEGMENTS: usize = 4;
const BUCKETS: usize = 5;
const KEYS: usize = 6;
const BASE_MS: usize = 8;
const DEATHS: usize = 9;
const REPAIRED: usize = 10;
/// The counters (a cache line of their own, away from the locks).
const VERSION: usize = 16;
const NEXT_SEQ: usize = 17;
const KEY_COUNT: usize = 18;
const DATA: usize = 19;
const APPENDS: usize = 20;
const IN_PLACE: usize = 21;
const COMPACTED_BYTES: usize = 24;
const COMPACTED_SEGMENTS: usize = 25;
const COMPACTION_ROUNDS: usize = 26;
const COMPACTION_ERRORS: usize = 27;
const COMPACTION_ROLLS: usize = 28;
/// The lock that serializes compaction rounds (a [`cairn_media::owner::LockWord`]).
const COMPACTOR: usize = 32;

/// "cairnkvR" and the layout's version.
const MAGIC_WORD: u64 = u64::from_le_bytes(*b"cairnkvR") ^ 1;

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

use cairn_media::sys::monotonic_ms;

/// Where each table lies in the region (words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    segments: u64,
    buckets: usize,
}

impl Layout {
    fn epochs_at(&self) -> usize {
        HEADER_WORDS
    }

    fn segs_at(&self) -> usize {
        self.epochs_at() + epoch::WORDS
    }

    fn index_at(&self) -> usize {
        (self.segs_at() + Segments::words_for(self.segments)).next_multiple_of(8)
    }

    fn words(&self) -> usize {
        self.index_at() + Index::words_for(self.buckets)
    }
}

/// The store's state in memory: the header's words and the tables cut from the region.
pub(crate) struct Region {
    header: Words,
    pub epochs: Words,
    pub segs: Words,
    pub index: Words,
    /// Whether processes share it (a file on `/dev/shm`).
    pub shared: bool,
}

impl Region {
    /// The tables of `words`, laid out by `layout`.
    fn cut(words: Words, layout: Layout, shared: bool) -> io::Result<Region> {
        assert_eq!(words.len(), layout.words(), "a region of another layout");
        Ok(Region {
            header: words.slice(0, HEADER_WORDS)?,
            epochs: words.slice(layout.epochs_at(), epoch::WORDS)?,
            segs: words.slice(layout.segs_at(), Segments::words_for(layout.segments))?,
            index: words.slice(layout.index_at(), Index::words_for(layout.buckets))?,
            shared,
        })
    }

    /// Write a new region's header: the pool's identity, the tables' sizes, the index's
    /// hash keys (random), the clock's base. `READY` stays 0 until recovery is done.
    fn init(&self, uuid: &[u8; 16], layout: Layout) -> io::Result<()> {
        let mut keys = [0u8; 16];
        getrandom::getrandom(&mut keys).map_err(|e| io::Error::other(e.to_string()))?;
        let h = self.header.get();
        let w = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap());
        h[UUID].store(w(&uuid[..8]), Ordering::Relaxed);
        h[UUID + 1].store(w(&uuid[8..]), Ordering::Relaxed);
        h[KEYS].store(w(&keys[..8]), Ordering::Relaxed);
        h[KEYS + 1].store(w(&keys[8..]), Ordering::Relaxed);
        h[SEGMENTS].store(layout.segments, Ordering::Relaxed);
        h[BUCKETS].store(layout.buckets as u64, Ordering::Relaxed);
        h[BASE_MS].store(monotonic_ms(), Ordering::Relaxed);
        h[VERSION].store(1, Ordering::Relaxed);
        h[NEXT_SEQ].store(1, Ordering::Relaxed);
        h[MAGIC].store(MAGIC_WORD, Ordering::Release);
        Ok(())
    }

    /// A region of the process's own, for a pool of `segments` segments and an index of
    /// `buckets` buckets.
    pub fn owned(uuid: &[u8; 16], segments: u64, buckets: usize) -> io::Result<Region> {
        let layout = Layout { segments, buckets };
        let r = Self::cut(
            Words::owned("cairn-kv-region", layout.words())?,
            layout,
            false,
        )?;
        r.init(uuid, layout)?;
        Ok(r)
    }

    /// Recovery is done: the region is one others may attach to.
    pub fn ready(&self) {
        self.header.get()[READY].store(1, Ordering::Release);
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        &self.header.get()[i]
    }

    /// The index's hash keys.
    pub fn index_keys(&self) -> [u64; 2] {
        [
            self.word(KEYS).load(Ordering::Relaxed),
            self.word(KEYS + 1).load(Ordering::Relaxed),
        ]
    }

    /// Milliseconds since the region was built.
    pub fn now_ms(&self) -> u64 {
        monotonic_ms().saturating_sub(self.word(BASE_MS).load(Ordering::Relaxed))
    }

    /// The next record version, and the next segment sequence number.
    pub fn version(&self) -> &AtomicU64 {
        self.word(VERSION)
    }
    pub fn next_seq(&self) -> &AtomicU64 {
        self.word(NEXT_SEQ)
    }
    /// Keys present, and the bytes of their keys and values.
    pub fn keys(&self) -> &AtomicU64 {
        self.word(KEY_COUNT)
    }
    pub fn data(&self) -> &AtomicU64 {
        self.word(DATA)
    }
    /// Records appended by writes, and updates made in place.
    pub fn appends(&self) -> &AtomicU64 {
        self.word(APPENDS)
    }
    pub fn in_place(&self) -> &AtomicU64 {
        self.word(IN_PLACE)
    }
    /// Bytes compaction copied, segments it emptied, rounds it ran, errors it met,
    /// segments its heads took.
    pub fn compacted_bytes(&self) -> &AtomicU64 {
        self.word(COMPACTED_BYTES)
    }
    pub fn compacted_segments(&self) -> &AtomicU64 {
        self.word(COMPACTED_SEGMENTS)
    }
    pub fn compaction_rounds(&self) -> &AtomicU64 {
        self.word(COMPACTION_ROUNDS)
    }
    pub fn compaction_errors(&self) -> &AtomicU64 {
        self.word(COMPACTION_ERRORS)
    }
    pub fn compaction_rolls(&self) -> &AtomicU64 {
        self.word(COMPACTION_ROLLS)
    }
    /// Processes found dead with some of the store's state (heads, segments claimed,
    /// locks) in their hands, and the repairs made for them.
    pub fn deaths(&self) -> &AtomicU64 {
        self.word(DEATHS)
    }
    pub fn repaired(&self) -> &AtomicU64 {
        self.word(REPAIRED)
    }
    /// The lock that serializes compaction rounds between processes.
    pub fn compactor(&self) -> cairn_media::owner::LockWord<'_> {
        cairn_media::owner::LockWord(self.word(COMPACTOR))
    }
}

/// Where region files are, and how their names begin and end.
const REGION_DIR: &str = "/dev/shm";
const REGION_PREFIX: &str = "cairn-kv-";
const REGION_SUFFIX: &str = ".region";

/// The region file of the pool whose file is `pool` (named for the pool's device and
/// inode: the same for every process that opens the pool by any path).
fn region_path(pool: &File) -> io::Result<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let m = pool.metadata()?;
    Ok(Path::new(REGION_DIR).join(format!(
        "{REGION_PREFIX}{:x}-{:x}{REGION_SUFFIX}",
        m.dev(),
        m.ino()
    )))
}

/// Whether `file` is the file at `path` (false when there is none).
pub(crate) fn is_at(file: &File, path: &Path) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let f = file.metadata()?;
    match std::fs::metadata(path) {
        Ok(p) => Ok((p.dev(), p.ino()) == (f.dev(), f.ino())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// The region file of a pool, locked exclusively (openers and closers one at a time):
/// the lock is released when this drops. The region is mapped through another
/// descriptor ([`RegionLock::unlocked`]): a mapping holds its file open, and with it a
/// `flock` taken through it.
struct RegionLock {
    file: File,
    path: PathBuf,
}

impl RegionLock {
    /// The region file, opened again (to be mapped).
    fn unlocked(&self) -> io::Result<File> {
        OpenOptions::new().read(true).write(true).open(&self.path)
    }

    /// Lock the region file of `pool`, created if `create` says so (else `NotFound`
    /// when there is none).
    fn take(pool: &File, create: bool) -> io::Result<RegionLock> {
        let path = region_path(pool)?;
        loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(create)
                .truncate(false)
                .open(&path)?;
            cairn_media::sys::flock_exclusive(&file, false)?;
            // A closer may have removed the file while this waited: lock the one at the
            // path instead.
            if is_at(&file, &path)? {
                return Ok(RegionLock { file, path });
            }
        }
    }
}

/// A process's hold on a shared store: its shared lock on the pool (a descriptor of
/// its own: `flock`s belong to open files), and a read lock on the region file's
/// first byte, which says to [`sweep`] that the region is in use (the pool's lock
/// cannot once the pool is deleted).
pub(crate) struct SharedOpen {
    users: File,
    _marker: File,
}

/// The region file's first byte, read-locked (an OFD lock: the descriptor's, let go
/// when it closes or its process dies) while a process uses the region.
fn mark_in_use(path: &Path) -> io::Result<File> {
    use cairn_media::sys::{record_lock, RecordOp, RecordOwner};
    let f = OpenOptions::new().read(true).open(path)?;
    let op = RecordOp::Set {
        write: Some(false),
        wait: false,
    };
    record_lock(&f, RecordOwner::Description, op, 0, 1)?;
    Ok(f)
}

/// Remove the region files no process uses (left by processes that all died): one of a
/// pool that still exists would be rebuilt by its next opener, and one of a pool
/// deleted since would stay in memory for good. Best effort: a region being opened or
/// closed (its `flock` held) or in use (its first byte read-locked: [`SharedOpen`]) is
/// left alone.
pub(crate) fn sweep() {
    use cairn_media::sys::{record_lock, RecordOp, RecordOwner};
    let Ok(dir) = std::fs::read_dir(REGION_DIR) else {
        return;
    };
    for e in dir.flatten() {
        let path = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with(REGION_PREFIX) && name.ends_with(REGION_SUFFIX)) {
            continue;
        }
        // Read-only is enough: `flock` and a lock test need no write access.
        let Ok(f) = File::open(&path) else {
            continue;
        };
        if cairn_media::sys::flock_exclusive(&f, true).is_err()
            || !is_at(&f, &path).unwrap_or(false)
        {
            continue;
        }
        let in_use = record_lock(
            &f,
            RecordOwner::Description,
            RecordOp::Test { write: true },
            0,
            1,
        );
        if matches!(in_use, Ok(None)) {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// A shared store being opened: whether the caller is the first (it must recover the
/// store into the region, then call [`Region::ready`]), and the locks it holds until it
/// is admitted ([`Admission::admit`]).
pub(crate) struct Admission {
    pub first: bool,
    /// Dropped before `hold` (whose drop takes it again).
    lock: Option<RegionLock>,
    hold: SharedOpen,
}

impl Admission {
    /// The opener is done building (the first) or attaching: let the next opener in.
    pub fn admit(mut self) -> io::Result<SharedOpen> {
        if self.first {
            // From exclusive to shared: every other opener of the store waits for the
            // region's lock (still held) before it looks at the pool's, so none can
            // slip in between (but a process opening the pool on its own, which fails
            // then).
            cairn_media::sys::flock_shared(&self.hold.users, true)?;
        }
        drop(self.lock.take());
        Ok(self.hold)
    }
}

impl SharedOpen {
    /// Open the shared store of the pool at `path`, creating the pool with `size` bytes
    /// if there is none; `buckets(segments)`: the index's buckets, for a region the
    /// caller builds. Fails with `WouldBlock` while a process has the pool open on its
    /// own ([`crate::Store::open`]).
    pub fn open(
        path: &Path,
        size: u64,
        buckets: impl FnOnce(u64) -> usize,
    ) -> io::Result<(crate::pool::Pool, Region, Admission)> {
        let file = crate::pool::Pool::open_file(path)?;
        let lock = RegionLock::take(&file, true)?;
        // The pool's lock on a descriptor of its own (`flock`s belong to open files).
        let users = OpenOptions::new().read(true).open(path)?;
        if !is_at(&users, path)? || !is_at(&file, path)? {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{}: the pool was replaced while it was opened",
                    path.display()
                ),
            ));
        }
        let hold = SharedOpen {
            users,
            _marker: mark_in_use(&lock.path)?,
        };
        match cairn_media::sys::flock_exclusive(&hold.users, true) {
            Ok(()) => {
                // Alone: a new region (an old one is what processes now gone left).
                let pool = crate::pool::Pool::on_file(file, size)?;
                let layout = Layout {
                    segments: pool.header.segments,
                    buckets: buckets(pool.header.segments),
                };
                let bytes = layout.words() * 8;
                lock.file.set_len(0)?;
                lock.file.set_len(bytes as u64)?;
                let map = cairn_media::Mapping::new(&lock.unlocked()?, 0, bytes, true, false)?;
                let region = Region::cut(Words::shared(map, 0, layout.words())?, layout, true)?;
                region.init(&pool.header.uuid, layout)?;
                let first = Admission {
                    first: true,
                    lock: Some(lock),
                    hold,
                };
                Ok((pool, region, first))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if let Err(e) = cairn_media::sys::flock_shared(&hold.users, true) {
                    if lock.file.metadata()?.len() == 0 {
                        // Made by this attempt (under its lock): not left behind.
                        let _ = std::fs::remove_file(&lock.path);
                    }
                    if e.kind() == io::ErrorKind::WouldBlock {
                        return Err(io::Error::new(
                            io::ErrorKind::WouldBlock,
                            format!(
                                "{}: the pool is open in another process (not shared)",
                                path.display()
                            ),
                        ));
                    }
                    return Err(e);
                }
                let pool = crate::pool::Pool::on_file(file, size)?;
                let region =
                    Self::attach(&lock.unlocked()?, &pool.header.uuid, pool.header.segments)?;
                let next = Admission {
                    first: false,
                    lock: Some(lock),
                    hold,
                };
                Ok((pool, region, next))
            }
            Err(e) => Err(e),
        }
    }

    /// The region others built for the pool `uuid` of `segments` segments.
    fn attach(file: &File, uuid: &[u8; 16], segments: u64) -> io::Result<Region> {
        let len = file.metadata()?.len() as usize;
        if len < HEADER_WORDS * 8 {
            return Err(invalid(format!("a store's region of {len} bytes")));
        }
        let head = Words::shared(
            cairn_media::Mapping::new(file, 0, HEADER_WORDS * 8, true, false)?,
            0,
            HEADER_WORDS,
        )?;
        let h = |i: usize| head.get()[i].load(Ordering::Acquire);
        let ours = [
            u64::from_le_bytes(uuid[..8].try_into().unwrap()),
            u64::from_le_bytes(uuid[8..].try_into().unwrap()),
        ];
        if h(MAGIC) != MAGIC_WORD || h(READY) != 1 || [h(UUID), h(UUID + 1)] != ours {
            return Err(invalid(
                "the store's region is not this pool's, or was not finished".into(),
            ));
        }
        let layout = Layout {
            segments: h(SEGMENTS),
            buckets: h(BUCKETS) as usize,
        };
        if layout.segments != segments || len != layout.words() * 8 {
            return Err(invalid(format!(
                "the store's region is laid out for {} segments in {len} bytes",
                layout.segments
            )));
        }
        let words = Words::shared(
            cairn_media::Mapping::new(file, 0, len, true, false)?,
            0,
            layout.words(),
        )?;
        Region::cut(words, layout, true)
    }
}

impl Drop for SharedOpen {
    /// Let go of the store (dropped after the store's tables); the last process removes
    /// the region file.
    fn drop(&mut self) {
        // No region file: none to remove (an opening that failed removed it).
        let Ok(lock) = RegionLock::take(&self.users, false) else {
            return;
        };
        let _ = cairn_media::sys::flock_unlock(&self.users);
        if cairn_media::sys::flock_exclusive(&self.users, true).is_ok() {
            let _ = std::fs::remove_file(&lock.path);
        }
    }
}
