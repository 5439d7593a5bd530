//! [`RadosTier`]: a lower tier whose segments are objects of a pool.

use crate::pool::{Pool, Slice};
use crate::Spec;
use cairn_area::cache::BlockCache;
use cairn_area::{copy_err, errno_of, fs_err, SharedBuf, TierDevice};
use cairn_format::map::TIER_NAMES;
use cairn_format::superblock::TierGeom;
use cairn_format::{BLOCK_SIZE, BLOCK_SIZE_U64};
use std::collections::HashSet;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The most bytes of a segment one object holds.
pub const CHUNK: u64 = 16 << 20;

/// How long after a failed connection the next operation tries again (before that,
/// operations fail at once with the same error).
const RETRY: Duration = Duration::from_secs(2);

/// What the remote tier did since it was opened (`cairn status`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemoteStats {
    /// Whether the cluster is connected now.
    pub connected: bool,
    pub objects_written: u64,
    pub bytes_written: u64,
    pub objects_removed: u64,
    /// Reads of the cluster (cache misses) and their bytes.
    pub reads: u64,
    pub bytes_read: u64,
    /// Blocks found in and missing from the daemon's cache.
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Orphan objects (of no segment in use) removed.
    pub orphans_removed: u64,
    /// The last failure, and when it happened (ns since the Unix epoch).
    pub last_error: Option<(String, i64)>,
}

#[derive(Default)]
struct Counters {
    objects_written: AtomicU64,
    bytes_written: AtomicU64,
    objects_removed: AtomicU64,
    reads: AtomicU64,
    bytes_read: AtomicU64,
    orphans_removed: AtomicU64,
}

/// The connection, made when first needed.
enum Conn {
    Up(Arc<Pool>),
    /// Not connected; the last attempt's failure and when it was made.
    Down(Option<(io::Error, Instant)>),
}

struct Inner {
    spec: Spec,
    timeout: Duration,
    tier: u8,
    uuid: [u8; 16],
    geom: TierGeom,
    /// `cairn.<uuid>.<tier>`.
    prefix: String,
    conn: Mutex<Conn>,
    /// The daemon's cache of the tier's blocks, keyed by tier block and valid for the
    /// segment generation they were read under.
    cache: Option<BlockCache>,
    counters: Counters,
    last_error: Mutex<Option<(String, i64)>>,
    /// Segments (and generations) whose objects a backup names: never removed while it
    /// is the newest (`crate::backup`). `None` until the newest backup's manifest was
    /// read: until then no segment's objects are removed (the sweep does it later).
    keep: Mutex<Option<HashSet<(u64, u64)>>>,
}

/// A lower tier whose segments are objects of a pool ([`TierDevice`]). Cloning gives
/// another handle on the same tier (connection, cache, counters).
///
/// A segment written under generation `gen` is the objects
/// `cairn.<store uuid>.<tier>.<segment>.<gen>.<chunk>` (numbers in hex), each at most
/// [`CHUNK`] bytes, and the tier's header (`cairn_format::tier`) is the object
/// `cairn.<store uuid>.<tier>.header`.
#[derive(Clone)]
pub struct RadosTier {
    inner: Arc<Inner>,
}

impl RadosTier {
    /// The remote tier `tier` of store `uuid` with segments of `geom`, in the pool of
    /// `spec`, not connected yet: the first operation connects (and checks the tier's
    /// header); every operation gives up after `timeout`. `cache_bytes` of DRAM cache
    /// blocks read (0: none).
    pub fn open(
        spec: &Spec,
        timeout: Duration,
        uuid: &[u8; 16],
        tier: u8,
        geom: TierGeom,
        cache_bytes: u64,
    ) -> RadosTier {
        let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
        RadosTier {
            inner: Arc::new(Inner {
                spec: spec.clone(),
                timeout,
                tier,
                uuid: *uuid,
                geom,
                prefix: format!("cairn.{hex}.{tier}"),
                conn: Mutex::new(Conn::Down(None)),
                cache: BlockCache::new(cache_bytes),
                counters: Counters::default(),
                last_error: Mutex::new(None),
                keep: Mutex::new(None),
            }),
        }
    }

    /// Make the tier in the pool (`cairn mkfs`): connect and write its header. A full
    /// cluster is `ENOSPC` at once.
    pub fn create(
        spec: &Spec,
        timeout: Duration,
        uuid: &[u8; 16],
        tier: u8,
        geom: TierGeom,
    ) -> io::Result<RadosTier> {
        let t = RadosTier::open(spec, timeout, uuid, tier, geom, 0);
        let pool = Pool::connect(spec, timeout)?;
        if let Some(e) = pool.full() {
            return Err(e);
        }
        let header = cairn_format::tier::encode_header(tier, uuid, &geom);
        pool.put(&t.header_object(), &header)?;
        *t.lock_keep() = Some(HashSet::new());
        *t.lock_conn() = Conn::Up(Arc::new(pool));
        Ok(t)
    }

    fn lock_conn(&self) -> std::sync::MutexGuard<'_, Conn> {
        self.inner.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_keep(&self) -> std::sync::MutexGuard<'_, Option<HashSet<(u64, u64)>>> {
        self.inner.keep.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The segments whose objects are kept whatever happens to the segments: those
    /// backups name (a backup in progress sets the union of the newest one's and its
    /// own, then its own once its manifest is written).
    pub fn set_keep(&self, keep: HashSet<(u64, u64)>) {
        *self.lock_keep() = Some(keep);
    }

    /// Merge the newest backup's remote segments into the kept ones.
    fn load_keep(&self, pool: &Pool) -> io::Result<()> {
        let m = crate::backup::read_manifest(pool, &crate::backup::uuid_hex(&self.inner.uuid))?;
        let mut k = self.lock_keep();
        let set = k.get_or_insert_with(HashSet::new);
        set.extend(m.into_iter().flat_map(|m| m.remote));
        Ok(())
    }

    /// The connection: the one made, else a new one (whose header must be this
    /// tier's), unless the last attempt failed less than [`RETRY`] ago.
    pub fn pool(&self) -> io::Result<Arc<Pool>> {
        let mut c = self.lock_conn();
        match &*c {
            Conn::Up(p) => return Ok(p.clone()),
            Conn::Down(Some((e, at))) if at.elapsed() < RETRY => return Err(copy_err(e)),
            Conn::Down(_) => {}
        }
        match self.connect() {
            Ok(p) => {
                // Without it, no segment's objects are removed (the sweep loads it).
                let _ = self.load_keep(&p);
                let p = Arc::new(p);
                *c = Conn::Up(p.clone());
                Ok(p)
            }
            Err(e) => {
                let copy = copy_err(&e);
                self.failed(&e);
                *c = Conn::Down(Some((e, Instant::now())));
                Err(copy)
            }
        }
    }

    fn connect(&self) -> io::Result<Pool> {
        let i = &self.inner;
        let pool = Pool::connect(&i.spec, i.timeout)?;
        let mut h = vec![0u8; BLOCK_SIZE];
        let name = self.header_object();
        let n = pool.read(&name, 0, &mut h).map_err(|e| {
            if errno_of(&e) == libc::ENOENT {
                fs_err(
                    libc::ENOENT,
                    format!(
                        "pool {} holds no remote tier of this store (no object {name}; \
                         `cairn mkfs --remote` makes it)",
                        i.spec.pool
                    ),
                )
            } else {
                e
            }
        })?;
        cairn_format::tier::check_header(&h[..n], i.tier, &i.uuid, &i.geom).map_err(|e| {
            fs_err(
                libc::EIO,
                format!("remote tier in pool {}: {}", i.spec.pool, e.0),
            )
        })?;
        Ok(pool)
    }

    /// Record a failure for `cairn status`.
    fn failed(&self, e: &io::Error) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        *self
            .inner
            .last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some((e.to_string(), now));
    }

    /// `r`, its failure recorded.
    fn note<T>(&self, r: io::Result<T>) -> io::Result<T> {
        if let Err(e) = &r {
            self.failed(e);
        }
        r
    }

    /// The tier's header object.
    pub fn header_object(&self) -> String {
        format!("{}.header", self.inner.prefix)
    }

    /// The name of chunk `chunk` of segment `seg` written under `gen`.
    pub fn object(&self, seg: u64, gen: u64, chunk: u64) -> String {
        format!("{}.{seg:x}.{gen:x}.{chunk:x}", self.inner.prefix)
    }

    /// The segment and generation of a data object of this tier, if `name` is one.
    fn parse(&self, name: &str) -> Option<(u64, u64)> {
        let rest = name.strip_prefix(&self.inner.prefix)?.strip_prefix('.')?;
        let mut f = rest.split('.');
        let seg = u64::from_str_radix(f.next()?, 16).ok()?;
        let gen = u64::from_str_radix(f.next()?, 16).ok()?;
        u64::from_str_radix(f.next()?, 16).ok()?;
        f.next().is_none().then_some((seg, gen))
    }

    fn segment_bytes(&self) -> u64 {
        self.inner.geom.segment_bytes()
    }

    /// The objects a segment is cut into.
    fn chunks(&self) -> u64 {
        self.segment_bytes().div_ceil(CHUNK)
    }

    /// Byte `off` of the tier, inside segment `seg`: its chunk and offset there.
    fn locate(&self, seg: u64, off: u64) -> io::Result<(u64, u64)> {
        let start = seg * self.segment_bytes();
        if off < start || off >= start + self.segment_bytes() {
            return Err(fs_err(
                libc::EINVAL,
                format!(
                    "byte {off} of the {} tier is not in segment {seg}",
                    TIER_NAMES[self.inner.tier.min(3) as usize]
                ),
            ));
        }
        let rel = off - start;
        Ok((rel / CHUNK, rel % CHUNK))
    }

    /// Read from the cluster (no cache).
    fn read_objects(&self, seg: u64, gen: u64, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let pool = self.pool()?;
        let mut done = 0;
        while done < buf.len() {
            let (chunk, at) = self.locate(seg, off + done as u64)?;
            let n = ((CHUNK - at) as usize).min(buf.len() - done);
            let got =
                self.note(pool.read(&self.object(seg, gen, chunk), at, &mut buf[done..done + n]))?;
            // Past what the round wrote: nothing, as a file's unwritten space.
            buf[done + got..done + n].fill(0);
            done += n;
            let c = &self.inner.counters;
            c.reads.fetch_add(1, Relaxed);
            c.bytes_read.fetch_add(n as u64, Relaxed);
        }
        Ok(())
    }

    /// Remove the objects of every segment `keep(segment, generation)` rejects: those a
    /// round wrote but never switched to (the daemon crashed, or gave up on a slow
    /// cluster) and those of segments discarded while the cluster was unreachable.
    /// Returns how many were removed.
    /// The objects of the segments the newest backup names are kept too.
    pub fn sweep(&self, keep: impl Fn(u64, u64) -> bool) -> io::Result<u64> {
        let pool = self.pool()?;
        self.note(self.load_keep(&pool))?;
        let names = self.note(pool.list(&format!("{}.", self.inner.prefix)))?;
        let mut removed = 0;
        for name in names {
            let Some((seg, gen)) = self.parse(&name) else {
                continue;
            };
            let backed_up = self
                .lock_keep()
                .as_ref()
                .is_none_or(|k| k.contains(&(seg, gen)));
            if !backed_up && !keep(seg, gen) && self.note(pool.remove(&name))? {
                removed += 1;
                // Counted as each goes (a status between two removals is current).
                self.inner.counters.orphans_removed.fetch_add(1, Relaxed);
            }
        }
        Ok(removed)
    }

    /// What the tier did since it was opened.
    pub fn stats(&self) -> RemoteStats {
        let c = &self.inner.counters;
        let (hits, misses) = self.inner.cache.as_ref().map_or((0, 0), |k| {
            (k.stats.hits.load(Relaxed), k.stats.misses.load(Relaxed))
        });
        RemoteStats {
            connected: matches!(*self.lock_conn(), Conn::Up(_)),
            objects_written: c.objects_written.load(Relaxed),
            bytes_written: c.bytes_written.load(Relaxed),
            objects_removed: c.objects_removed.load(Relaxed),
            reads: c.reads.load(Relaxed),
            bytes_read: c.bytes_read.load(Relaxed),
            cache_hits: hits,
            cache_misses: misses,
            orphans_removed: c.orphans_removed.load(Relaxed),
            last_error: self
                .inner
                .last_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        }
    }
}

impl TierDevice for RadosTier {
    /// Whole blocks go through the cache: blocks missing from it are read with one read
    /// per object they span, from the first missing block to the last.
    fn read(&self, seg: u64, gen: u64, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let cache = match &self.inner.cache {
            Some(c)
                if off.is_multiple_of(BLOCK_SIZE_U64) && buf.len().is_multiple_of(BLOCK_SIZE) =>
            {
                c
            }
            _ => return self.read_objects(seg, gen, off, buf),
        };
        let first = off / BLOCK_SIZE_U64;
        let blocks: Vec<bool> = buf
            .chunks_exact_mut(BLOCK_SIZE)
            .enumerate()
            .map(|(i, b)| cache.get(first + i as u64, gen, 0, b))
            .collect();
        let (Some(lo), Some(hi)) = (
            blocks.iter().position(|&h| !h),
            blocks.iter().rposition(|&h| !h),
        ) else {
            return Ok(());
        };
        let range = &mut buf[lo * BLOCK_SIZE..(hi + 1) * BLOCK_SIZE];
        self.read_objects(seg, gen, off + (lo * BLOCK_SIZE) as u64, range)?;
        for (i, b) in range.chunks_exact(BLOCK_SIZE).enumerate() {
            cache.put(first + (lo + i) as u64, gen, b);
        }
        Ok(())
    }

    /// Every chunk of the segment is an object (empty past the data), so a missing
    /// object is always a loss (an error), never space left unwritten. The chunks are
    /// written at once (up to the pool's I/O threads); returns once RADOS acknowledged
    /// every object (`rados_write_full`: every replica has it).
    fn write_segment(&self, seg: u64, gen: u64, off: u64, data: &[u8]) -> io::Result<()> {
        let s = Slice::copy_of(data);
        self.write_segment_shared(seg, gen, off, &s.buf, data.len())
    }

    /// [`RadosTier::write_segment`], the objects' data handed to the I/O threads as
    /// slices of `data` (no copy).
    fn write_segment_shared(
        &self,
        seg: u64,
        gen: u64,
        off: u64,
        data: &SharedBuf,
        len: usize,
    ) -> io::Result<()> {
        if off != seg * self.segment_bytes() || len as u64 > self.segment_bytes() {
            return Err(fs_err(
                libc::EINVAL,
                format!("segment {seg} is written whole, from its start ({len} bytes at {off})"),
            ));
        }
        let pool = self.pool()?;
        let objects: Vec<(String, Slice)> = (0..self.chunks())
            .map(|c| {
                let from = ((c * CHUNK) as usize).min(len);
                let to = (((c + 1) * CHUNK) as usize).min(len);
                let s = Slice {
                    buf: data.clone(),
                    range: from..to,
                };
                (self.object(seg, gen, c), s)
            })
            .collect();
        let n = objects.len() as u64;
        self.note(pool.put_many(objects))?;
        let k = &self.inner.counters;
        k.objects_written.fetch_add(n, Relaxed);
        k.bytes_written.fetch_add(len as u64, Relaxed);
        Ok(())
    }

    /// Removes the segment's objects in the background (an unreachable cluster leaves
    /// them to the next sweep), unless a backup names them.
    fn discard(&self, seg: u64, gen: u64, _off: u64, _len: u64) -> io::Result<()> {
        let pool = self.pool()?;
        if self
            .lock_keep()
            .as_ref()
            .is_none_or(|k| k.contains(&(seg, gen)))
        {
            return Ok(());
        }
        let names: Vec<String> = (0..self.chunks())
            .map(|c| self.object(seg, gen, c))
            .collect();
        let n = names.len() as u64;
        let me = self.clone();
        pool.remove_later(names, move |r| match r {
            Ok(()) => {
                me.inner.counters.objects_removed.fetch_add(n, Relaxed);
            }
            Err(e) => me.failed(&e),
        })
    }
}
