//! The control file: every segment's lock and publish journal, shared by all processes
//! that use the store's segments (docs/SPACEJMP.md, "Locks"; FORMAT.md, "The control
//! file").
//!
//! `/dev/shm/cairn-<uuid>.sj-ctl` (a host object of the store: `cairn rmfs` removes it)
//! is [`SLOTS`] slots of 4 KiB after a header page. A segment's slot is found by
//! probing from a hash of its inode number. A slot holds:
//!
//! * the **writer** word: 0, or the owner `tid << 32 | h`, `h` a hash of the owning
//!   thread's start time (so a recycled thread id is not taken for the owner);
//! * **reader** entries, one per process reading the segment: owner `pid << 32 | h` and
//!   a count (the process's threads that hold the reader lock);
//! * a futex word bumped at every release, and the number of waiters;
//! * the **journal** of a commit being published, and counters.
//!
//! A holder killed at any instruction never leaves a lock held: a process that finds a
//! lock taken looks the owner up in `/proc` (gone, a zombie, or another thread of that
//! number: dead) and takes the lock over; the new writer first repairs what the dead one
//! was publishing ([`Recovery`]).

use cairn_media::Mapping;
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::{
    AtomicU32, AtomicU64,
    Ordering::{Release, SeqCst},
};
use std::time::{Duration, Instant};

/// Segment slots in the control file (each segment of the store that is ever attached
/// takes one for as long as it exists).
pub const SLOTS: u64 = 1024;
const SLOT: u64 = 4096;
const HEADER: u64 = 4096;
const MAGIC: u64 = u64::from_le_bytes(*b"CAIRNSJC");

// Slot layout (offsets in a slot).
const KEY: u64 = 0;
const GEN: u64 = 8;
const WRITER: u64 = 16;
const SEQ: u64 = 24;
const WAITERS: u64 = 28;
const RECOVERIES: u64 = 32;
const COMMITS: u64 = 40;
const JOURNAL: u64 = 48;
const JOURNAL_N: u64 = 56;
const READERS: u64 = 64;
/// Reader entries of a slot: processes reading one segment at once.
pub const READER_SLOTS: u64 = 60;
const READER: u64 = 16;
const JOURNAL_PAGES: u64 = 1024;
/// Pages a publish journal lists; a larger commit journals the whole segment.
pub const JOURNAL_MAX: u64 = (SLOT - JOURNAL_PAGES) / 8;

/// A removed segment's slot: probing goes on past it; a new segment may take it.
const TOMBSTONE: u64 = u64::MAX;

/// What a slot's journal says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Journal {
    /// Nothing in flight.
    Clean,
    /// A commit is being published: the listed pages of the resident copy must be
    /// copied again from the segment's file.
    Pages,
    /// A commit too large to list is being published: the whole resident copy must be
    /// rebuilt from the file.
    Whole,
    /// An explicit-mode writer stores into the resident copy; its undo log holds the
    /// bytes to put back.
    Undo,
}

impl Journal {
    fn word(self) -> u64 {
        match self {
            Journal::Clean => 0,
            Journal::Pages => 1,
            Journal::Whole => 2,
            Journal::Undo => 3,
        }
    }

    fn of(w: u64) -> Journal {
        match w {
            1 => Journal::Pages,
            2 => Journal::Whole,
            3 => Journal::Undo,
            _ => Journal::Clean,
        }
    }
}

/// The control file of a store, mapped.
pub struct Control {
    map: Mapping,
    path: PathBuf,
}

pub use cairn_media::owner::{forked, owner_dead, process_word, thread_word};

/// How taking a lock went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// Taken.
    Yes,
    /// Taken over from a dead owner: the caller repairs the journal first.
    Recovered,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control").field("path", &self.path).finish()
    }
}

/// One segment's slot in the control file.
#[derive(Debug, Clone, Copy)]
pub struct Slot<'c> {
    ctl: &'c Control,
    off: usize,
}

impl Control {
    /// Open (creating it if needed) the control file of the store with `uuid`, with the
    /// owner, group and mode bits of the NVM file `nvm` (the store's trust domain).
    pub fn open(uuid: &[u8; 16], nvm: &std::path::Path) -> io::Result<Control> {
        let path = std::path::Path::new(cairn_area::host::HOST_OBJECT_DIR)
            .join(format!("{}sj-ctl", cairn_area::host::store_prefix(uuid)));
        let meta = std::fs::metadata(nvm)?;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(cairn_area::host::object_mode(meta.mode()))
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("the segment control file {}: {e}", path.display()),
                )
            })?;
        let len = HEADER + SLOTS * SLOT;
        // The store's trust domain, if this process made it (else it is the maker's,
        // which must be the store's).
        let _ = cairn_area::host::share_with_store(&f, nvm);
        cairn_area::host::check_object(&f, &path, nvm)?;
        let fm = f.metadata()?;
        if fm.len() < len {
            // Two processes may do this at once: both set the same length (zeros).
            f.set_len(len)?;
        }
        let map = Mapping::new(&f, 0, len as usize, true, false)?;
        let magic = map.atomic_u64(0)?;
        if magic.load(SeqCst) != MAGIC {
            // Zeros are a valid empty file: mark it (idempotent).
            let _ = magic.compare_exchange(0, MAGIC, SeqCst, SeqCst);
            if magic.load(SeqCst) != MAGIC {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} is not a segment control file", path.display()),
                ));
            }
            map.atomic_u64(8)?.store(SLOTS, SeqCst);
        }
        Ok(Control { map, path })
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    #[inline]
    fn word(&self, off: usize) -> &AtomicU64 {
        self.map.atomic_u64(off).expect("slot offsets are in range")
    }

    #[inline]
    fn word32(&self, off: usize) -> &AtomicU32 {
        self.map.atomic_u32(off).expect("slot offsets are in range")
    }

    /// The slot of segment `ino` of generation `gen`, claimed if it has none
    /// (`ENOSPC` when every slot is taken). A slot left by an older file of the same
    /// inode number is reset.
    pub fn slot(&self, ino: u64, gen: u64) -> io::Result<Slot<'_>> {
        debug_assert!(ino != 0 && ino != TOMBSTONE);
        let start = (ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % SLOTS;
        let mut free = None;
        for i in 0..SLOTS {
            let s = (start + i) % SLOTS;
            let off = (HEADER + s * SLOT) as usize;
            let key = self.word(off + KEY as usize).load(SeqCst);
            if key == ino {
                let slot = Slot { ctl: self, off };
                slot.adopt(gen);
                return Ok(slot);
            }
            if key == TOMBSTONE && free.is_none() {
                free = Some(off);
            }
            if key == 0 {
                // The end of the probe chain: claim the first reusable slot on it.
                let off = free.unwrap_or(off);
                let want = self.word(off + KEY as usize).load(SeqCst);
                if self
                    .word(off + KEY as usize)
                    .compare_exchange(want, ino, SeqCst, SeqCst)
                    .is_ok()
                {
                    let slot = Slot { ctl: self, off };
                    slot.adopt(gen);
                    return Ok(slot);
                }
                // Another process claimed it meanwhile: probe again.
                return self.slot(ino, gen);
            }
        }
        Err(cairn_area::fs_err(
            libc::ENOMEM,
            format!(
                "the segment lock table has no free slot ({SLOTS} segments in use); \
                 remove segments no longer needed"
            ),
        ))
    }

    /// The slot at byte `off` of the file ([`Slot::offset`] of a slot found before).
    #[inline]
    pub fn slot_at(&self, off: usize) -> Slot<'_> {
        debug_assert!(
            off >= HEADER as usize && (off - HEADER as usize).is_multiple_of(SLOT as usize)
        );
        Slot { ctl: self, off }
    }

    /// Every claimed slot (for `cairn sj locks`).
    pub fn slots(&self) -> Vec<Slot<'_>> {
        (0..SLOTS)
            .map(|s| Slot {
                ctl: self,
                off: (HEADER + s * SLOT) as usize,
            })
            .filter(|s| !matches!(s.key(), 0 | TOMBSTONE))
            .collect()
    }
}

impl<'c> Slot<'c> {
    #[inline]
    fn w(&self, field: u64) -> &'c AtomicU64 {
        self.ctl.word(self.off + field as usize)
    }

    #[inline]
    fn reader(&self, i: u64) -> (&'c AtomicU64, &'c AtomicU32) {
        let at = self.off + (READERS + i * READER) as usize;
        (self.ctl.word(at), self.ctl.word32(at + 8))
    }

    #[inline]
    fn seq(&self) -> &'c AtomicU32 {
        self.ctl.word32(self.off + SEQ as usize)
    }

    #[inline]
    fn waiters(&self) -> &'c AtomicU32 {
        self.ctl.word32(self.off + WAITERS as usize)
    }

    /// Where the slot is in the file ([`Control::slot_at`]).
    pub fn offset(&self) -> usize {
        self.off
    }

    /// The segment's inode number and generation.
    pub fn key(&self) -> u64 {
        self.w(KEY).load(SeqCst)
    }

    pub fn generation(&self) -> u64 {
        self.w(GEN).load(SeqCst)
    }

    /// Make the slot this generation's: a slot of an older file of the same number is
    /// reset (its locks and journal belong to a segment that no longer exists).
    fn adopt(&self, gen: u64) {
        let old = self.w(GEN).load(SeqCst);
        if old == gen {
            return;
        }
        if self
            .w(GEN)
            .compare_exchange(old, gen, SeqCst, SeqCst)
            .is_ok()
        {
            for f in [WRITER, RECOVERIES, COMMITS, JOURNAL, JOURNAL_N] {
                self.w(f).store(0, SeqCst);
            }
            for i in 0..READER_SLOTS {
                let (o, c) = self.reader(i);
                o.store(0, SeqCst);
                c.store(0, SeqCst);
            }
        }
    }

    /// Free the slot (the segment is being removed; the caller holds its writer lock).
    pub fn retire(&self) {
        self.w(GEN).store(0, SeqCst);
        self.w(WRITER).store(0, SeqCst);
        self.w(KEY).store(TOMBSTONE, SeqCst);
        self.wake();
    }

    fn wake(&self) {
        self.seq().fetch_add(1, SeqCst);
        if self.waiters().load(SeqCst) > 0 {
            let _ = rustix::thread::futex::wake(
                self.seq(),
                rustix::thread::futex::Flags::empty(),
                u32::MAX,
            );
        }
    }

    /// Sleep until the slot's futex word moves past `seen`, or a short while passes (so
    /// that a dead holder is noticed).
    fn wait(&self, seen: u32) {
        self.waiters().fetch_add(1, SeqCst);
        let t = rustix::thread::futex::Timespec {
            tv_sec: 0,
            tv_nsec: 20_000_000,
        };
        let _ = rustix::thread::futex::wait(
            self.seq(),
            rustix::thread::futex::Flags::empty(),
            seen,
            Some(&t),
        );
        self.waiters().fetch_sub(1, SeqCst);
    }

    /// The writer word (0: free).
    pub fn writer(&self) -> u64 {
        self.w(WRITER).load(SeqCst)
    }

    /// Live reader entries: `(owner word, count)`.
    pub fn readers(&self) -> Vec<(u64, u32)> {
        (0..READER_SLOTS)
            .map(|i| self.reader(i))
            .map(|(o, c)| (o.load(SeqCst), c.load(SeqCst)))
            .filter(|&(o, c)| o != 0 && c > 0)
            .collect()
    }

    /// Owner words of the processes that have the segment attached (a reader entry,
    /// holding the lock or not), dead ones included.
    pub fn attached(&self) -> Vec<u64> {
        (0..READER_SLOTS)
            .map(|i| self.reader(i).0.load(SeqCst))
            .filter(|&o| o != 0 && o != u64::MAX)
            .collect()
    }

    /// This process detaches the segment: its reader entry is given up (when no thread
    /// of it holds the reader lock).
    pub fn leave(&self, entry: u64) {
        let (o, c) = self.reader(entry);
        if c.load(SeqCst) == 0 {
            let _ = o.compare_exchange(process_word(), 0, SeqCst, SeqCst);
        }
    }

    pub fn waiting(&self) -> u32 {
        self.waiters().load(SeqCst)
    }

    pub fn recoveries(&self) -> u64 {
        self.w(RECOVERIES).load(SeqCst)
    }

    pub fn commits(&self) -> u64 {
        self.w(COMMITS).load(SeqCst)
    }

    pub fn count_commit(&self) {
        self.w(COMMITS).fetch_add(1, SeqCst);
    }

    /// This process's reader entry (claimed if it has none; dead owners' entries are
    /// reaped first). `EAGAIN` when [`READER_SLOTS`] live processes read already.
    pub fn reader_entry(&self) -> io::Result<u64> {
        let me = process_word();
        for i in 0..READER_SLOTS {
            if self.reader(i).0.load(SeqCst) == me {
                return Ok(i);
            }
        }
        for pass in 0..2 {
            for i in 0..READER_SLOTS {
                let (o, c) = self.reader(i);
                let cur = o.load(SeqCst);
                if cur == 0 && o.compare_exchange(0, me, SeqCst, SeqCst).is_ok() {
                    c.store(0, SeqCst);
                    return Ok(i);
                }
                if pass == 1 && cur != 0 && owner_dead(cur) {
                    self.reap_reader(i, cur);
                    if o.compare_exchange(0, me, SeqCst, SeqCst).is_ok() {
                        c.store(0, SeqCst);
                        return Ok(i);
                    }
                }
            }
        }
        Err(io::Error::from_raw_os_error(libc::EAGAIN))
    }

    /// Clear reader entry `i` of a dead owner `cur`.
    fn reap_reader(&self, i: u64, cur: u64) {
        let (o, c) = self.reader(i);
        if o.compare_exchange(cur, u64::MAX, SeqCst, SeqCst).is_ok() {
            c.store(0, SeqCst);
            o.store(0, SeqCst);
            self.wake();
        }
    }

    /// Take the reader lock through entry `entry` of this process. `block`: wait while a
    /// writer holds the lock; else `EWOULDBLOCK`. A segment left with a journal (its
    /// writer died publishing) is repaired first: this thread takes the writer lock,
    /// runs `repair` as the dead writer's successor, and releases it.
    pub fn read_lock(
        &self,
        entry: u64,
        block: bool,
        repair: &mut dyn FnMut(&Slot<'c>) -> io::Result<()>,
    ) -> io::Result<()> {
        let (_, count) = self.reader(entry);
        loop {
            count.fetch_add(1, SeqCst);
            let w = self.w(WRITER).load(SeqCst);
            if w == 0 && self.w(JOURNAL).load(SeqCst) == 0 {
                return Ok(());
            }
            count.fetch_sub(1, SeqCst);
            self.wake();
            let seen = self.seq().load(SeqCst);
            if w == 0 || owner_dead(w) {
                // Repair as a writer, then read.
                match self.write_lock(block) {
                    Ok(Taken::Recovered) => {
                        let r = repair(self);
                        self.write_unlock();
                        r?;
                    }
                    Ok(Taken::Yes) => self.write_unlock(),
                    Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) && block => {}
                    Err(e) => return Err(e),
                }
                continue;
            }
            if !block {
                return Err(io::Error::from_raw_os_error(libc::EWOULDBLOCK));
            }
            self.wait(seen);
        }
    }

    /// Take the reader lock through `entry` if it is free now (no writer, nothing to
    /// repair): the fast path of a switch. `false`: nothing taken.
    #[inline]
    pub fn try_read(&self, entry: u64) -> bool {
        let (_, count) = self.reader(entry);
        count.fetch_add(1, SeqCst);
        if self.w(WRITER).load(SeqCst) == 0 && self.w(JOURNAL).load(SeqCst) == 0 {
            return true;
        }
        count.fetch_sub(1, SeqCst);
        if self.waiters().load(SeqCst) > 0 {
            self.wake();
        }
        false
    }

    /// Release the reader lock taken through `entry`.
    #[inline]
    pub fn read_unlock(&self, entry: u64) {
        let (_, count) = self.reader(entry);
        let before = count.fetch_sub(1, SeqCst);
        debug_assert!(before > 0, "reader lock released more often than taken");
        if self.waiters().load(SeqCst) > 0 {
            self.wake();
        }
    }

    /// Wait until no live reader holds the lock (the caller holds the writer word), dead
    /// readers reaped. With `block` false, give up (`EWOULDBLOCK`) at the first live one;
    /// `deadline` bounds the wait.
    fn drain_readers(&self, block: bool, deadline: Option<Instant>) -> io::Result<()> {
        loop {
            let seen = self.seq().load(SeqCst);
            let mut busy = false;
            for i in 0..READER_SLOTS {
                let (o, c) = self.reader(i);
                if c.load(SeqCst) == 0 {
                    continue;
                }
                let owner = o.load(SeqCst);
                if owner != 0 && owner != u64::MAX && owner_dead(owner) {
                    self.reap_reader(i, owner);
                    continue;
                }
                busy = true;
            }
            if !busy {
                return Ok(());
            }
            if !block || deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(io::Error::from_raw_os_error(libc::EWOULDBLOCK));
            }
            self.wait(seen);
        }
    }

    /// Take the writer lock. `Recovered`: the segment has a journal left by a writer
    /// that died (or one of its owner, dead, is taken over), and the caller must repair
    /// it ([`Slot::journal`]) before using the segment. `block` false: `EWOULDBLOCK` when
    /// another live thread holds it or reads. `EDEADLK` when the calling thread holds it.
    pub fn write_lock(&self, block: bool) -> io::Result<Taken> {
        let me = thread_word();
        loop {
            let w = self.w(WRITER).load(SeqCst);
            if w == me {
                return Err(io::Error::from_raw_os_error(libc::EDEADLK));
            }
            let seen = self.seq().load(SeqCst);
            let dead = w != 0 && owner_dead(w);
            if (w == 0 || dead)
                && self
                    .w(WRITER)
                    .compare_exchange(w, me, SeqCst, SeqCst)
                    .is_ok()
            {
                if let Err(e) = self.drain_readers(block, None) {
                    // Readers hold it. A journal stays for the next writer to repair.
                    self.write_unlock();
                    return Err(e);
                }
                if dead || self.w(JOURNAL).load(SeqCst) != 0 {
                    self.w(RECOVERIES).fetch_add(1, SeqCst);
                    return Ok(Taken::Recovered);
                }
                return Ok(Taken::Yes);
            }
            if !block {
                return Err(io::Error::from_raw_os_error(libc::EWOULDBLOCK));
            }
            self.wait(seen);
        }
    }

    /// Release the writer lock (held by the calling thread).
    pub fn write_unlock(&self) {
        debug_assert_eq!(self.w(WRITER).load(SeqCst), thread_word(), "not the writer");
        self.w(WRITER).store(0, SeqCst);
        self.wake();
    }

    /// Whether the calling thread holds the writer lock.
    pub fn held_by_me(&self) -> bool {
        self.w(WRITER).load(SeqCst) == thread_word()
    }

    /// Mark the whole segment for repair by the next holder of the writer lock (a
    /// staged commit whose copy into the file did not finish).
    pub fn journal_whole(&self) {
        self.w(JOURNAL).store(Journal::Whole.word(), Release);
    }

    /// What the journal says, without its pages.
    pub fn journal_kind(&self) -> Journal {
        Journal::of(self.w(JOURNAL).load(SeqCst))
    }

    /// The journal (the caller holds the writer lock).
    pub fn journal(&self) -> (Journal, Vec<u64>) {
        let j = Journal::of(self.w(JOURNAL).load(SeqCst));
        let n = self.w(JOURNAL_N).load(SeqCst).min(JOURNAL_MAX);
        let pages = if j == Journal::Pages {
            (0..n)
                .map(|i| {
                    self.ctl
                        .word(self.off + (JOURNAL_PAGES + i * 8) as usize)
                        .load(SeqCst)
                })
                .collect()
        } else {
            Vec::new()
        };
        (j, pages)
    }

    /// Record what is about to be published: `pages` (offsets in the segment), or the
    /// whole segment when there are more than [`JOURNAL_MAX`].
    ///
    /// The journal's words are stored with release order, not sequentially consistent
    /// (a locked exchange each): only the holder of the writer lock writes them and only
    /// a holder reads them, the lock's read-modify-writes order the two, and a process
    /// that dies leaves its stores in the order it made them.
    pub fn journal_publish(&self, pages: &[u64]) {
        if pages.len() as u64 > JOURNAL_MAX {
            self.w(JOURNAL).store(Journal::Whole.word(), Release);
            return;
        }
        for (i, p) in pages.iter().enumerate() {
            self.ctl
                .word(self.off + (JOURNAL_PAGES + i as u64 * 8) as usize)
                .store(*p, Release);
        }
        self.w(JOURNAL_N).store(pages.len() as u64, Release);
        self.w(JOURNAL).store(Journal::Pages.word(), Release);
    }

    /// An explicit-mode writer's undo log is live (or, with `false`, empty again).
    pub fn journal_undo(&self, on: bool) {
        self.w(JOURNAL).store(
            if on { Journal::Undo } else { Journal::Clean }.word(),
            Release,
        );
    }

    /// The journal is done with.
    pub fn journal_clear(&self) {
        self.w(JOURNAL).store(Journal::Clean.word(), Release);
        self.w(JOURNAL_N).store(0, Release);
    }

    /// Wait at most `timeout` for the writer lock (`ETIMEDOUT`), for callers that must
    /// not block forever (the CLI).
    pub fn write_lock_timeout(&self, timeout: Duration) -> io::Result<Taken> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.write_lock(false) {
                Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                    if Instant::now() >= deadline {
                        return Err(io::Error::from_raw_os_error(libc::ETIMEDOUT));
                    }
                    let seen = self.seq().load(SeqCst);
                    self.wait(seen);
                }
                r => return r,
            }
        }
    }
}

/// A control file that lives as long as the test (removed at drop).
#[cfg(test)]
pub(crate) struct TestControl {
    pub ctl: Control,
    _nvm: tempfile::NamedTempFile,
}

#[cfg(test)]
impl TestControl {
    pub fn new() -> TestControl {
        let nvm = tempfile::NamedTempFile::new().unwrap();
        let mut uuid = [0u8; 16];
        uuid[..8].copy_from_slice(&std::process::id().to_le_bytes().repeat(2));
        uuid[8..].copy_from_slice(
            &(std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64)
                .to_le_bytes(),
        );
        let ctl = Control::open(&uuid, nvm.path()).unwrap();
        TestControl { ctl, _nvm: nvm }
    }
}

#[cfg(test)]
impl Drop for TestControl {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.ctl.path());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reader entry held by a dead process: the next process gets one of them
    /// (reaped and claimed in the same call: the reaping loop used to leave the entry it
    /// freed for the next caller, so the first attach after 60 dead processes failed),
    /// and `EAGAIN` only when all are alive.
    #[test]
    fn dead_readers_entries_are_reaped_and_claimed() {
        let t = TestControl::new();
        let s = t.ctl.slot(78, 1).unwrap();
        let dead = (4_000_000u64 << 32) | 5;
        for i in 0..READER_SLOTS {
            s.reader(i).0.store(dead, SeqCst);
        }
        let e = s.reader_entry().unwrap();
        assert_eq!(s.reader(e).0.load(SeqCst), process_word());
        // All taken by live processes (this one's thread words stand for them).
        for i in 0..READER_SLOTS {
            s.reader(i).0.store(thread_word(), SeqCst);
        }
        assert_eq!(
            s.reader_entry().unwrap_err().raw_os_error(),
            Some(libc::EAGAIN)
        );
    }

    #[test]
    fn readers_and_writers_exclude_each_other() {
        let t = TestControl::new();
        let s = t.ctl.slot(77, 1).unwrap();
        let e = s.reader_entry().unwrap();
        s.read_lock(e, true, &mut |_| Ok(())).unwrap();
        s.read_lock(e, true, &mut |_| Ok(())).unwrap();
        // Another thread cannot write while we read.
        std::thread::scope(|sc| {
            sc.spawn(|| {
                let s2 = t.ctl.slot(77, 1).unwrap();
                assert_eq!(
                    s2.write_lock(false).unwrap_err().raw_os_error(),
                    Some(libc::EWOULDBLOCK)
                );
            });
        });
        s.read_unlock(e);
        s.read_unlock(e);
        assert_eq!(s.write_lock(false).unwrap(), Taken::Yes);
        assert_eq!(
            s.write_lock(false).unwrap_err().raw_os_error(),
            Some(libc::EDEADLK)
        );
        // A reader waits for the writer; another thread's writer lock blocks too.
        std::thread::scope(|sc| {
            let h = sc.spawn(|| {
                let s2 = t.ctl.slot(77, 1).unwrap();
                assert!(s2.read_lock(e, false, &mut |_| Ok(())).is_err());
                let t0 = Instant::now();
                s2.read_lock(e, true, &mut |_| Ok(())).unwrap();
                s2.read_unlock(e);
                t0.elapsed()
            });
            std::thread::sleep(Duration::from_millis(50));
            s.write_unlock();
            assert!(h.join().unwrap() >= Duration::from_millis(30));
        });
        // The same inode number with a new generation is a new, free slot.
        s.write_lock(false).unwrap();
        let n = t.ctl.slot(77, 2).unwrap();
        assert_eq!(n.writer(), 0);
        assert_eq!(n.write_lock(false).unwrap(), Taken::Yes);
        n.write_unlock();
        // Retired slots are reused.
        n.write_lock(false).unwrap();
        n.retire();
        assert!(t.ctl.slots().iter().all(|x| x.key() != 77));
        let again = t.ctl.slot(77, 3).unwrap();
        assert_eq!(again.write_lock(false).unwrap(), Taken::Yes);
        again.write_unlock();
    }

    #[test]
    fn a_dead_writer_is_taken_over_and_its_journal_repaired() {
        let t = TestControl::new();
        let s = t.ctl.slot(5, 1).unwrap();
        // Plant a writer that does not exist, with a journal in flight.
        s.w(WRITER).store((4_000_001u64 << 32) | 9, SeqCst);
        s.journal_publish(&[0, 8192]);
        let e = s.reader_entry().unwrap();
        let mut repaired = Vec::new();
        s.read_lock(e, true, &mut |sl| {
            repaired = sl.journal().1;
            sl.journal_clear();
            Ok(())
        })
        .unwrap();
        assert_eq!(repaired, vec![0, 8192]);
        assert_eq!(s.recoveries(), 1);
        assert_eq!(s.journal().0, Journal::Clean);
        s.read_unlock(e);
        // A dead writer found by a writer: `Recovered`.
        s.w(WRITER).store((4_000_001u64 << 32) | 9, SeqCst);
        assert_eq!(s.write_lock(false).unwrap(), Taken::Recovered);
        s.write_unlock();
        // A dead reader does not keep a writer out.
        let (o, c) = s.reader(3);
        o.store((4_000_002u64 << 32) | 1, SeqCst);
        c.store(2, SeqCst);
        assert_eq!(s.write_lock(false).unwrap(), Taken::Yes);
        s.write_unlock();
        assert!(s.readers().is_empty());
    }
}
