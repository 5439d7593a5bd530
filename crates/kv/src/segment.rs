//! The per-segment state of an open store ([`Segments`]) and its free list
//! ([`FreeList`]): every transition a segment goes through is a method here, which
//! checks the segment's invariants at the point they must hold.
//!
//! A segment's life: free (on the free list) → taken by a head ([`FreeList::take`]) →
//! opened under a new sequence number ([`Segments::open`]) → records appended while it is
//! a head ([`Segments::appended`]) → closed ([`Segments::close`]) → chosen by a
//! compaction round ([`FreeList::choose`], claimed) → walked ([`Segments::sweep_to`]),
//! given up ([`Segments::unclaim`]) or emptied, retired (`crate::epoch`) and freed once
//! no reader can be in it ([`FreeList::put`]); free segments beyond the warm ones hand
//! their memory back ([`FreeList::release_cold`]) and take it again when a head takes
//! them.
//!
//! The invariants (`assert!` at the rare transitions, `debug_assert!` on the per-record
//! paths; [`Segments::check`] checks them all for a quiescent store):
//! * a segment is on the free list at most once, and a free segment is not a head, not
//!   claimed, and has no live bytes. It does not always have sequence number 0: a
//!   segment recovery found emptied keeps its number until it is reused (tombstones may
//!   name its records), as does one whose header could not be erased;
//! * a segment whose memory was handed back is free, with its header erased (seq 0);
//! * a head's segment is neither free nor claimed; a claimed one is neither free nor a
//!   head, and at most one compaction claims a segment at a time;
//! * a segment is opened under a sequence number above any it had before;
//! * live bytes never exceed the bytes written into the segment's incarnation (nor,
//!   so, the segment), never go below 0; the bytes of its tombstones neither;
//! * compaction's walk (`swept`) only goes forward, and never past what was written.
//!
//! One table of [`SEG_WORDS`] words per segment (not an array per field): each
//! transition touches several fields of one segment, and each invariant relates fields
//! of one segment, so they sit together (a cache-line pair), and a field cannot be
//! added to one array and forgotten in another. The scans over all segments (choosing
//! candidates, the garbage estimate) read several fields of each segment too. The table
//! is [`Words`] (flags are words of 0 or 1), so that it can live in a mapping several
//! processes share.

use crate::epoch::Quiescent;
use crate::format::{SEGMENT_BYTES, SEGMENT_HEADER};
use cairn_media::owner::{owner_dead, process_word, LockWord, Taken};
use cairn_media::words::Words;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// The bytes of a segment that records can take.
const ROOM: u64 = SEGMENT_BYTES - SEGMENT_HEADER;

/// One segment's state (segment 0, the pool header and the journal, has one too, never
/// used): [`SEG_WORDS`] words of the segments' table, flags 0 or 1.
#[derive(Clone, Copy)]
struct Segment<'a>(&'a [AtomicU64]);

/// Words per segment (13 used; a segment's words are a cache-line pair).
pub(crate) const SEG_WORDS: usize = 16;

impl<'a> Segment<'a> {
    /// The sequence number it was opened under (0: none, its header is erased).
    fn seq(self) -> &'a AtomicU64 {
        &self.0[0]
    }

    /// The bytes of its records that are current (values and tombstones).
    fn live(self) -> &'a AtomicU64 {
        &self.0[1]
    }

    /// The end of what was written in this incarnation (from the segment's start; the
    /// end of the valid records for one recovery found).
    fn written(self) -> &'a AtomicU64 {
        &self.0[2]
    }

    /// How far compaction has processed its records in this incarnation (a round cut
    /// short by a full pool resumes there: a tombstone it already copied must not be
    /// copied, and counted out, twice).
    fn swept(self) -> &'a AtomicU64 {
        &self.0[3]
    }

    /// The version counter when it was opened (its age).
    fn born(self) -> &'a AtomicU64 {
        &self.0[4]
    }

    /// The bytes of tombstones written into it in this incarnation, and the newest of
    /// their horizons (once every segment opened before that is gone, none of them is
    /// needed: compaction drops them, so they count as garbage when choosing what to
    /// compact).
    fn tombs(self) -> &'a AtomicU64 {
        &self.0[5]
    }

    fn horizon(self) -> &'a AtomicU64 {
        &self.0[6]
    }

    /// When it was last freed (ms since the store was opened).
    fn freed_at(self) -> &'a AtomicU64 {
        &self.0[7]
    }

    /// A log head (a writer's or compaction's) now: the owner word of its process
    /// (`cairn_media::owner::process_word`; 0: not a head).
    fn head(self) -> &'a AtomicU64 {
        &self.0[8]
    }

    /// Chosen by a compaction round: the owner word of its process (0: not claimed).
    fn claimed(self) -> &'a AtomicU64 {
        &self.0[9]
    }

    /// On the free list.
    fn free(self) -> &'a AtomicU64 {
        &self.0[10]
    }

    /// Its memory is handed back to the system.
    fn released(self) -> &'a AtomicU64 {
        &self.0[11]
    }

    /// A head took it after its release (to be collapsed into a huge folio again).
    fn fresh(self) -> &'a AtomicU64 {
        &self.0[12]
    }
}

/// The state of every segment of the pool, and the free list.
pub(crate) struct Segments {
    /// [`SEG_WORDS`] per segment, then the free list's [`CTL`] words, then its entries
    /// (one word per segment: a stack, the most recently freed on top).
    words: Words,
    /// Segments of the pool (segment 0 included).
    n: usize,
}

/// The free list's control words: its lock (a [`LockWord`]), its length, the repairs
/// made after a holder of the lock died.
const CTL: usize = 8;
const LOCK: usize = 0;
const LEN: usize = 1;
const REPAIRS: usize = 2;

/// The free list, locked: the transitions that must happen under its lock (taking a
/// segment for a head, choosing segments to compact, freeing, handing memory back).
pub(crate) struct FreeList<'a> {
    segs: &'a Segments,
}

impl Drop for FreeList<'_> {
    fn drop(&mut self) {
        self.segs.lock().unlock();
    }
}

impl Segments {
    /// The words of the state of `n` segments and the free list.
    pub fn words_for(n: u64) -> usize {
        n as usize * (SEG_WORDS + 1) + CTL
    }

    /// `n` segments (segment 0 included) in memory of the process's own, none free yet:
    /// recovery fills the free list ([`FreeList::recovered`]).
    #[cfg(test)]
    pub fn new(n: u64) -> io::Result<Segments> {
        Segments::on(Words::owned("cairn-kv-segments", Self::words_for(n))?)
    }

    /// The segments whose state is `words` (zeroed, or others' segments, which the same
    /// protocol keeps).
    pub fn on(words: Words) -> io::Result<Segments> {
        let n = words.len().saturating_sub(CTL) / (SEG_WORDS + 1);
        if n < 2 || words.len() != Self::words_for(n as u64) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a segments' table of {} words", words.len()),
            ));
        }
        Ok(Segments { words, n })
    }

    fn ctl(&self, i: usize) -> &AtomicU64 {
        &self.words.get()[self.n * SEG_WORDS + i]
    }

    fn lock(&self) -> LockWord<'_> {
        LockWord(self.ctl(LOCK))
    }

    /// Entry `i` of the free list.
    fn entry(&self, i: usize) -> &AtomicU64 {
        &self.words.get()[self.n * SEG_WORDS + CTL + i]
    }

    /// Segment `s`'s words (segment 0's too).
    fn word_of(&self, s: u64) -> Segment<'_> {
        let i = s as usize * SEG_WORDS;
        Segment(&self.words.get()[i..i + SEG_WORDS])
    }

    fn at(&self, s: u64) -> Segment<'_> {
        debug_assert!(s != 0, "segment 0 holds the pool header, not records");
        self.word_of(s)
    }

    /// Segments 1.., with their state.
    fn all(&self) -> impl Iterator<Item = (u64, Segment<'_>)> {
        (1..self.count()).map(|s| (s, self.word_of(s)))
    }

    /// Segments of the pool, segment 0 included.
    pub fn count(&self) -> u64 {
        self.n as u64
    }

    /// Lock the free list. A holder that died with it (a process killed in the middle
    /// of a transition) may have left it half changed: it is rebuilt from the segments'
    /// flags first ([`FreeList::repair`]).
    pub fn free_list(&self) -> FreeList<'_> {
        let taken = self.lock().lock();
        let mut free = FreeList { segs: self };
        if let Taken::FromDead(_) = taken {
            free.repair();
        }
        free
    }

    /// Segments on the free list (read without its lock: a hint that may be stale).
    pub fn free_count(&self) -> usize {
        self.ctl(LEN).load(Ordering::Acquire) as usize
    }

    /// Repairs of the free list after a holder of its lock died.
    pub fn repairs(&self) -> u64 {
        self.ctl(REPAIRS).load(Ordering::Relaxed)
    }

    /// The sequence number segment `s` was opened under (0: its header is erased).
    pub fn seq(&self, s: u64) -> u64 {
        self.at(s).seq().load(Ordering::Acquire)
    }

    pub fn live(&self, s: u64) -> u64 {
        self.at(s).live().load(Ordering::Acquire)
    }

    pub fn is_head(&self, s: u64) -> bool {
        self.at(s).head().load(Ordering::Acquire) != 0
    }

    /// The process whose head segment `s` is (its owner word; 0: not a head).
    pub fn head_owner(&self, s: u64) -> u64 {
        self.at(s).head().load(Ordering::Acquire)
    }

    pub fn is_released(&self, s: u64) -> bool {
        self.at(s).released().load(Ordering::Relaxed) != 0
    }

    pub fn written(&self, s: u64) -> u64 {
        self.at(s).written().load(Ordering::Acquire)
    }

    pub fn born(&self, s: u64) -> u64 {
        self.at(s).born().load(Ordering::Relaxed)
    }

    /// Where compaction's walk of segment `s` resumes (0: not started).
    pub fn swept(&self, s: u64) -> u64 {
        self.at(s).swept().load(Ordering::Acquire)
    }

    /// Segment `s`, taken from the free list by a head ([`FreeList::take`]), is opened
    /// under `seq` (its header durable), at version `version`.
    pub fn open(&self, s: u64, seq: u64, version: u64) {
        let g = self.at(s);
        assert!(
            g.head().load(Ordering::Acquire) == process_word(),
            "segment {s}: opened without being taken for a head (by this process)"
        );
        assert!(
            g.claimed().load(Ordering::Acquire) == 0 && g.free().load(Ordering::Acquire) == 0,
            "segment {s}: opened while claimed or free"
        );
        let live = g.live().load(Ordering::Acquire);
        assert_eq!(live, 0, "segment {s}: opened with {live} live bytes");
        let old = g.seq().load(Ordering::Acquire);
        assert!(
            seq > old,
            "segment {s}: opened under sequence {seq}, not above its last ({old})"
        );
        g.seq().store(seq, Ordering::Release);
        g.written().store(SEGMENT_HEADER, Ordering::Release);
        g.swept().store(0, Ordering::Release);
        g.tombs().store(0, Ordering::Relaxed);
        g.horizon().store(0, Ordering::Relaxed);
        g.born().store(version, Ordering::Relaxed);
    }

    /// Segment `s`, taken after its memory was handed back, is to be collapsed into a
    /// huge folio again.
    pub fn mark_fresh(&self, s: u64) {
        self.at(s).fresh().store(1, Ordering::Relaxed);
    }

    /// Whether segment `s` was marked fresh ([`Segments::mark_fresh`]); unmarks it.
    pub fn take_fresh(&self, s: u64) -> bool {
        self.at(s).fresh().swap(0, Ordering::Relaxed) != 0
    }

    /// A record of `len` bytes was appended to segment `s`, a head's, ending at `end`.
    pub fn appended(&self, s: u64, end: u64, len: u64) {
        let g = self.at(s);
        debug_assert!(
            g.head().load(Ordering::Relaxed) != 0,
            "segment {s}: appended to, not a head"
        );
        debug_assert!(end <= SEGMENT_BYTES, "segment {s}: record ends at {end}");
        let before = g.written().swap(end, Ordering::Release);
        debug_assert_eq!(
            before + len,
            end,
            "segment {s}: a record of {len} bytes at {before} ends at {end}"
        );
        let live = g.live().fetch_add(len, Ordering::Relaxed) + len;
        debug_assert!(
            live <= end - SEGMENT_HEADER,
            "segment {s}: {live} live bytes, {end} written"
        );
    }

    /// Take `n` live bytes from segment `s` (a record that is not current any more).
    pub fn unlive(&self, s: u64, n: u64, why: &str) {
        let before = self.at(s).live().fetch_sub(n, Ordering::Relaxed);
        debug_assert!(
            before >= n,
            "segment {s}: {before} live bytes, {n} taken ({why})"
        );
    }

    /// A tombstone of `len` bytes with horizon `h` was written into segment `s`.
    pub fn note_tombstone(&self, s: u64, len: u64, h: u64) {
        let g = self.at(s);
        let tombs = g.tombs().fetch_add(len, Ordering::Relaxed) + len;
        g.horizon().fetch_max(h, Ordering::Relaxed);
        debug_assert!(
            tombs + SEGMENT_HEADER <= g.written().load(Ordering::Acquire),
            "segment {s}: {tombs} bytes of tombstones, more than written"
        );
    }

    /// Segment `s` is a head no more.
    pub fn close(&self, s: u64) {
        let was = self.at(s).head().swap(0, Ordering::Release) != 0;
        assert!(was, "segment {s}: closed, not a head");
    }

    /// Compaction gives segment `s` up (it stays, and can be chosen again).
    pub fn unclaim(&self, s: u64) {
        let g = self.at(s);
        let was = g.claimed().swap(0, Ordering::Release) != 0;
        assert!(was, "segment {s}: given up by compaction, not claimed");
    }

    /// Compaction's walk of segment `s` (claimed) has processed its records up to `off`.
    pub fn sweep_to(&self, s: u64, off: u64) {
        let g = self.at(s);
        debug_assert!(
            g.claimed().load(Ordering::Relaxed) != 0 && g.head().load(Ordering::Relaxed) == 0,
            "segment {s}: walked while not claimed, or a head"
        );
        let before = g.swept().swap(off, Ordering::Release);
        debug_assert!(
            off >= before,
            "segment {s}: the walk went back from {before} to {off}"
        );
        let written = g.written().load(Ordering::Acquire);
        debug_assert!(
            off <= written,
            "segment {s}: walked to {off}, past what was written ({written})"
        );
    }

    /// Compaction walked segment `s` (claimed) whole: no record in it is current, so
    /// its live count is 0 (the count of a writer killed before it took a replaced
    /// record's bytes off is dropped). The count dropped.
    pub fn clear_live(&self, s: u64) -> u64 {
        let g = self.at(s);
        assert!(
            g.claimed().load(Ordering::Acquire) != 0,
            "segment {s}: walked whole while not claimed"
        );
        g.live().swap(0, Ordering::AcqRel)
    }

    /// Segment `s` is emptied by compaction: claimed, not a head, no live bytes (it
    /// may be retired).
    pub fn check_emptied(&self, s: u64) {
        let g = self.at(s);
        assert!(
            g.claimed().load(Ordering::Acquire) != 0
                && g.head().load(Ordering::Acquire) == 0
                && g.free().load(Ordering::Acquire) == 0,
            "segment {s}: emptied while not claimed, or a head, or free"
        );
        let live = g.live().load(Ordering::Acquire);
        assert_eq!(live, 0, "segment {s}: retired with {live} live bytes");
    }

    /// Recovery found segment `s` opened under `seq`.
    pub fn recovered(&self, s: u64, seq: u64) {
        let g = self.at(s);
        debug_assert!(seq != 0);
        g.seq().store(seq, Ordering::Relaxed);
        g.written().store(SEGMENT_HEADER, Ordering::Relaxed);
    }

    /// Recovery found a valid record of `len` bytes in segment `s` ending at `end`;
    /// `tombstone`: a tombstone, with its horizon (every tombstone counts as live until
    /// compaction drops it, as at run time).
    pub fn recovered_record(&self, s: u64, end: u64, len: u64, tombstone: Option<u64>) {
        let g = self.at(s);
        let before = g.written().swap(end, Ordering::Relaxed);
        debug_assert_eq!(before + len, end, "segment {s}: records recovered apart");
        if let Some(h) = tombstone {
            self.recovered_live(s, len);
            self.note_tombstone(s, len, h);
        }
    }

    /// Recovery counts `len` live bytes in segment `s` (the newest record of a key).
    pub fn recovered_live(&self, s: u64, len: u64) {
        let g = self.at(s);
        let live = g.live().fetch_add(len, Ordering::Relaxed) + len;
        debug_assert!(
            live + SEGMENT_HEADER <= g.written().load(Ordering::Relaxed),
            "segment {s}: {live} live bytes recovered, more than its records"
        );
    }

    /// The two smallest sequence numbers of segments holding records (`u64::MAX`: none),
    /// and the segment of the first (0: none).
    pub fn oldest(&self) -> (u64, usize, u64) {
        let (mut a, mut at, mut b) = (u64::MAX, 0, u64::MAX);
        for (s, g) in self.all() {
            let q = g.seq().load(Ordering::Acquire);
            if q == 0 {
                continue;
            }
            if q < a {
                (b, a, at) = (a, q, s);
            } else if q < b {
                b = q;
            }
        }
        (a, at as usize, b)
    }

    /// The live bytes of segment `s` that are needed: its tombstones are not once no
    /// other segment is older than the newest of their horizons (`oldest`: from
    /// [`Segments::oldest`]). A hint for choosing segments to compact (the walk decides
    /// each record).
    pub fn needed(&self, s: u64, oldest: (u64, usize, u64)) -> u64 {
        let g = self.at(s);
        let live = g.live().load(Ordering::Relaxed);
        let other = if oldest.1 == s as usize {
            oldest.2
        } else {
            oldest.0
        };
        let h = g.horizon().load(Ordering::Relaxed);
        if h != 0 && other >= h {
            live.saturating_sub(g.tombs().load(Ordering::Relaxed))
        } else {
            live
        }
    }

    /// Whether tombstones wait for the segment opened under `seq` to go: some were
    /// written after it was opened.
    pub fn pins_tombstones(&self, seq: u64) -> bool {
        self.all().any(|(_, g)| {
            g.tombs().load(Ordering::Relaxed) > 0 && g.horizon().load(Ordering::Relaxed) > seq
        })
    }

    /// The fraction of the bytes of the closed segments (with a sequence number, not
    /// log heads) that holds no current value: dead records, and tombstones.
    pub fn garbage(&self) -> f64 {
        let (mut used, mut live) = (0u64, 0u64);
        for (_, g) in self.all() {
            if g.seq().load(Ordering::Relaxed) != 0 && g.head().load(Ordering::Relaxed) == 0 {
                used += ROOM;
                live += g
                    .live()
                    .load(Ordering::Relaxed)
                    .saturating_sub(g.tombs().load(Ordering::Relaxed));
            }
        }
        if used == 0 {
            return 0.0;
        }
        1.0 - live.min(used) as f64 / used as f64
    }

    /// The live bytes of all segments.
    pub fn live_total(&self) -> u64 {
        self.all()
            .map(|(_, g)| g.live().load(Ordering::Relaxed))
            .sum()
    }

    /// The segments with a sequence number by the fraction of their bytes that is live:
    /// `[0]` under 10%, …, `[9]` 90% and more.
    pub fn utilization(&self) -> [u64; 10] {
        let mut u = [0u64; 10];
        for (_, g) in self.all() {
            if g.seq().load(Ordering::Relaxed) != 0 {
                let decile = g.live().load(Ordering::Relaxed) * 10 / ROOM;
                u[decile.min(9) as usize] += 1;
            }
        }
        u
    }

    /// Check every invariant of every segment, and that the free list and the
    /// segments' flags agree. Only for a quiescent store (no thread changing segments:
    /// the fields are read one by one); panics on the first broken one.
    pub fn check(&self) {
        let free = self.free_list();
        let mut on_list = vec![false; self.count() as usize];
        for s in free.items() {
            assert!(s != 0 && s < self.count(), "free list: segment {s}");
            assert!(!on_list[s as usize], "segment {s}: twice on the free list");
            on_list[s as usize] = true;
        }
        for (s, g) in self.all() {
            let (seq, live, written) = (
                g.seq().load(Ordering::Acquire),
                g.live().load(Ordering::Acquire),
                g.written().load(Ordering::Acquire),
            );
            let (head, claimed, is_free, released) = (
                g.head().load(Ordering::Acquire) != 0,
                g.claimed().load(Ordering::Acquire) != 0,
                g.free().load(Ordering::Acquire) != 0,
                g.released().load(Ordering::Acquire) != 0,
            );
            assert_eq!(
                is_free, on_list[s as usize],
                "segment {s}: free flag and free list"
            );
            if is_free {
                assert!(
                    !head && !claimed && live == 0,
                    "segment {s}: free, yet head {head}, claimed {claimed}, live {live}"
                );
            }
            assert!(!(head && claimed), "segment {s}: a head and claimed");
            if released {
                assert!(
                    is_free && seq == 0,
                    "segment {s}: released, yet free {is_free}, seq {seq}"
                );
            }
            if seq != 0 || written != 0 {
                assert!(
                    (SEGMENT_HEADER..=SEGMENT_BYTES).contains(&written),
                    "segment {s}: written up to {written}"
                );
                assert!(
                    live + SEGMENT_HEADER <= written,
                    "segment {s}: {live} live bytes, written up to {written}"
                );
                let tombs = g.tombs().load(Ordering::Acquire);
                assert!(
                    tombs + SEGMENT_HEADER <= written,
                    "segment {s}: {tombs} bytes of tombstones, written up to {written}"
                );
            } else {
                assert_eq!(live, 0, "segment {s}: never opened, {live} live bytes");
            }
            let swept = g.swept().load(Ordering::Acquire);
            assert!(
                swept <= written.max(SEGMENT_HEADER),
                "segment {s}: swept to {swept}, written up to {written}"
            );
        }
    }
}

impl FreeList<'_> {
    pub fn len(&self) -> usize {
        self.segs.free_count()
    }

    /// The free segments, bottom (freed longest ago) to top.
    fn items(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.len()).map(|i| self.segs.entry(i).load(Ordering::Acquire))
    }

    fn push(&mut self, s: u64) {
        let n = self.len();
        assert!(
            n + 1 < self.segs.n,
            "free list: more segments than the pool has"
        );
        self.segs.entry(n).store(s, Ordering::Release);
        self.segs.ctl(LEN).store(n as u64 + 1, Ordering::Release);
    }

    /// Take the most recently freed segment for a head, unless no more than `reserve`
    /// are free; the segment, and whether its memory had been handed back. A head of
    /// the calling process from now on (under the free list's lock: compaction chooses
    /// among segments neither free nor heads under the same lock), not opened yet
    /// (nothing written: [`Segments::open`] says it is).
    pub fn take(&mut self, reserve: usize) -> Option<(u64, bool)> {
        let n = self.len();
        if n <= reserve || n == 0 {
            return None;
        }
        let s = self.segs.entry(n - 1).load(Ordering::Acquire);
        let g = self.segs.at(s);
        assert!(
            g.head().load(Ordering::Acquire) == 0 && g.claimed().load(Ordering::Acquire) == 0,
            "segment {s}: free, yet a head or claimed"
        );
        // In this order, so that a holder killed at any point leaves what
        // [`FreeList::repair`] and [`FreeList::reap`] put right: a segment marked
        // neither free nor a head has nothing written (repair frees it again); one
        // marked a head but not opened is freed again when its process is found gone.
        g.written().store(0, Ordering::Release);
        let was_free = g.free().swap(0, Ordering::AcqRel) != 0;
        assert!(was_free, "segment {s}: on the free list, not marked free");
        g.head().store(process_word(), Ordering::Release);
        self.segs.ctl(LEN).store(n as u64 - 1, Ordering::Release);
        Some((s, (g.released().swap(0, Ordering::Relaxed) != 0)))
    }

    /// Free segment `s`: compaction emptied it and no reader can be in it any more
    /// (`crate::epoch::Retired::take_quiescent` said so); `erased`: its header is
    /// durably erased (it has no sequence number any more); `now`: the time (ms since
    /// the store was opened).
    pub fn put(&mut self, q: Quiescent, erased: bool, now: u64) {
        let s = q.item();
        let g = self.segs.at(s);
        assert!(
            g.claimed().load(Ordering::Acquire) != 0,
            "segment {s}: freed without compaction claiming it"
        );
        assert!(
            g.head().load(Ordering::Acquire) == 0,
            "segment {s}: freed while a head"
        );
        let live = g.live().load(Ordering::Acquire);
        assert_eq!(live, 0, "segment {s}: freed with {live} live bytes");
        if erased {
            g.seq().store(0, Ordering::Release);
        }
        g.freed_at().store(now, Ordering::Relaxed);
        let was_free = g.free().swap(1, Ordering::AcqRel) != 0;
        assert!(!was_free, "segment {s}: freed twice");
        g.claimed().store(0, Ordering::Release);
        self.push(s);
    }

    /// Recovery's free list (the list is empty until then).
    pub fn recovered(&mut self, free: Vec<u64>) {
        assert!(self.len() == 0, "recovery on a store in use");
        for &s in &free {
            let g = self.segs.at(s);
            let was_free = g.free().swap(1, Ordering::AcqRel) != 0;
            assert!(!was_free, "segment {s}: recovered free twice");
            let live = g.live().load(Ordering::Relaxed);
            assert_eq!(
                live, 0,
                "segment {s}: recovered free with {live} live bytes"
            );
            self.push(s);
        }
    }

    /// Rebuild the list after a holder of its lock died: the segments marked free,
    /// freed longest ago at the bottom, and those a [`FreeList::take`] cut short left
    /// neither free nor a head (nothing written) freed again; a free segment is claimed
    /// by no one.
    fn repair(&mut self) {
        let segs = self.segs;
        let mut free: Vec<(u64, u64)> = Vec::new();
        for (s, g) in segs.all() {
            let orphan = g.free().load(Ordering::Acquire) == 0
                && g.head().load(Ordering::Acquire) == 0
                && g.claimed().load(Ordering::Acquire) == 0
                && g.written().load(Ordering::Acquire) == 0;
            if orphan {
                g.free().store(1, Ordering::Release);
            }
            if g.free().load(Ordering::Acquire) != 0 {
                g.claimed().store(0, Ordering::Release);
                free.push((g.freed_at().load(Ordering::Relaxed), s));
            }
        }
        free.sort();
        segs.ctl(LEN).store(0, Ordering::Release);
        for (_, s) in free {
            self.push(s);
        }
        segs.ctl(REPAIRS).fetch_add(1, Ordering::Relaxed);
    }

    /// Put right what processes that are gone held: their heads closed (one never
    /// opened, with nothing written, freed again), their claims given up (the segment
    /// can be chosen again; compaction's walk resumes where it stopped). `now`: the
    /// time, for a segment freed. Returns the processes found gone.
    pub fn reap(&mut self, now: u64) -> usize {
        let me = process_word();
        let mut gone: Vec<u64> = Vec::new();
        let mut alive: Vec<u64> = Vec::new();
        let mut dead = |w: u64| {
            if w == 0 || w == me || alive.contains(&w) {
                return false;
            }
            if gone.contains(&w) {
                return true;
            }
            let d = owner_dead(w);
            if d { &mut gone } else { &mut alive }.push(w);
            d
        };
        let mut freed = Vec::new();
        for (s, g) in self.segs.all() {
            if dead(g.head().load(Ordering::Acquire)) {
                if g.written().load(Ordering::Acquire) == 0 {
                    freed.push(s);
                } else {
                    g.head().store(0, Ordering::Release);
                }
            }
            if dead(g.claimed().load(Ordering::Acquire)) {
                g.claimed().store(0, Ordering::Release);
            }
        }
        for s in freed {
            let g = self.segs.at(s);
            g.freed_at().store(now, Ordering::Relaxed);
            g.free().store(1, Ordering::Release);
            g.head().store(0, Ordering::Release);
            self.push(s);
        }
        gone.len()
    }

    /// Choose at most `max` segments to compact: among those neither free, nor heads,
    /// nor claimed, with a sequence number, those `rank` scores highest (`None`: not
    /// worth it); claimed for the caller's compaction.
    pub fn choose(&mut self, max: usize, rank: impl Fn(u64) -> Option<f64>) -> Vec<u64> {
        let mut cands: Vec<(f64, u64)> = (1..self.segs.count())
            .filter(|&s| {
                let g = self.segs.at(s);
                g.seq().load(Ordering::Acquire) != 0
                    && g.head().load(Ordering::Acquire) == 0
                    && g.claimed().load(Ordering::Acquire) == 0
                    && g.free().load(Ordering::Acquire) == 0
            })
            .filter_map(|s| rank(s).map(|r| (r, s)))
            .collect();
        cands.sort_by(|a, b| b.0.total_cmp(&a.0));
        cands.truncate(max);
        for &(_, s) in &cands {
            let was = self
                .segs
                .at(s)
                .claimed()
                .swap(process_word(), Ordering::AcqRel)
                != 0;
            assert!(!was, "segment {s}: claimed twice");
        }
        cands.into_iter().map(|(_, s)| s).collect()
    }

    /// Hand the memory of the free segments beyond the `warm` most recently freed (the
    /// end of the list, which heads take first) back to the system (`release`), once
    /// they have been free for `after` ms at `now`; only segments whose header is
    /// durably erased (sequence number 0): a recovery finds nothing in them either way.
    pub fn release_cold(
        &mut self,
        warm: usize,
        after: u64,
        now: u64,
        release: impl Fn(u64) -> io::Result<()>,
    ) {
        let cold = self.len().saturating_sub(warm);
        for i in 0..cold {
            let s = self.segs.entry(i).load(Ordering::Acquire);
            let g = self.segs.at(s);
            debug_assert!(
                g.free().load(Ordering::Relaxed) != 0
                    && g.head().load(Ordering::Relaxed) == 0
                    && g.claimed().load(Ordering::Relaxed) == 0,
                "segment {s}: on the free list, yet not free"
            );
            if g.seq().load(Ordering::Acquire) == 0
                && g.released().load(Ordering::Relaxed) == 0
                && now.saturating_sub(g.freed_at().load(Ordering::Relaxed)) >= after
                && release(s).is_ok()
            {
                g.released().store(1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Segments 1..n free (as recovery leaves a new pool: the highest taken first).
    fn pool(n: u64) -> Segments {
        let segs = Segments::new(n).unwrap();
        segs.free_list().recovered((1..n).rev().collect());
        segs
    }

    /// Take a segment for a head and open it under `seq`.
    fn opened(segs: &Segments, seq: u64) -> u64 {
        let (s, released) = segs.free_list().take(0).unwrap();
        assert!(!released);
        segs.open(s, seq, 7);
        s
    }

    #[test]
    fn a_segment_goes_round() {
        let segs = pool(4);
        assert_eq!(segs.free_count(), 3);
        let s = opened(&segs, 1);
        assert_eq!(s, 1, "the top of the free list first");
        assert!(segs.is_head(s));
        assert_eq!((segs.seq(s), segs.born(s)), (1, 7));
        segs.appended(s, SEGMENT_HEADER + 100, 100);
        segs.appended(s, SEGMENT_HEADER + 148, 48);
        segs.note_tombstone(s, 48, 5);
        assert_eq!(segs.live(s), 148);
        assert_eq!(segs.written(s), SEGMENT_HEADER + 148);
        segs.check();
        // A head is not a candidate; closed it is.
        assert!(segs.free_list().choose(8, |_| Some(1.0)).is_empty());
        segs.close(s);
        assert_eq!(segs.free_list().choose(8, |_| Some(1.0)), vec![s]);
        assert!(
            segs.free_list().choose(8, |_| Some(1.0)).is_empty(),
            "claimed once"
        );
        segs.check();
        segs.unlive(s, 100, "moved");
        segs.sweep_to(s, SEGMENT_HEADER + 100);
        segs.unlive(s, 48, "tombstone dropped");
        segs.sweep_to(s, SEGMENT_HEADER + 148);
        segs.check_emptied(s);
        segs.free_list().put(Quiescent::for_test(s), true, 0);
        assert_eq!(segs.seq(s), 0);
        assert_eq!(segs.free_count(), 3);
        segs.check();
        // Reopened under a later number: a new incarnation.
        assert_eq!(opened(&segs, 2), s);
        assert_eq!((segs.live(s), segs.swept(s)), (0, 0));
        assert!(!segs.pins_tombstones(1), "its tombstones were reset");
        segs.check();
    }

    /// An owner word no live process has (a pid above Linux's largest).
    const GONE: u64 = (4_194_305u64 << 32) | 7;

    /// A holder of the free list's lock killed in the middle of a `take` (after it
    /// cleared the free flag, before it marked the segment a head) and of a `put`
    /// (flag set, not pushed): the next holder rebuilds the list from the flags.
    #[test]
    fn a_free_list_a_dead_holder_left_half_changed_is_rebuilt() {
        let segs = pool(6);
        let s = opened(&segs, 1);
        segs.close(s);
        assert_eq!(segs.free_list().choose(1, |_| Some(1.0)), vec![s]);
        segs.check_emptied(s);
        {
            // The dead holder's `take` of the top segment, cut short...
            let free = segs.free_list();
            let top = segs.entry(free.len() - 1).load(Ordering::Relaxed);
            segs.at(top).written().store(0, Ordering::Relaxed);
            segs.at(top).free().store(0, Ordering::Relaxed);
            // ... and a `put` of `s` cut short after its flag.
            segs.at(s).free().store(1, Ordering::Relaxed);
            segs.at(s).freed_at().store(9, Ordering::Relaxed);
            std::mem::forget(free);
        }
        segs.ctl(LOCK).store(GONE, Ordering::Relaxed);
        assert_eq!(segs.free_list().len(), 5, "every segment free again");
        assert_eq!(segs.repairs(), 1);
        segs.check();
        assert_eq!(
            segs.free_list().items().last(),
            Some(s),
            "freed most recently: on top"
        );
    }

    /// Heads and claims of a process that is gone: a head never opened is freed, one
    /// opened is closed, a claim is given up; a live process's are left alone.
    #[test]
    fn what_a_dead_process_held_is_reaped() {
        let segs = pool(6);
        let mine = opened(&segs, 1);
        let opened_dead = opened(&segs, 2);
        segs.appended(opened_dead, SEGMENT_HEADER + 64, 64);
        let (never_opened, _) = segs.free_list().take(0).unwrap();
        let claimed = opened(&segs, 3);
        segs.close(claimed);
        assert_eq!(segs.free_list().choose(1, |_| Some(1.0)), vec![claimed]);
        for s in [opened_dead, never_opened] {
            segs.at(s).head().store(GONE, Ordering::Relaxed);
        }
        segs.at(claimed).claimed().store(GONE, Ordering::Relaxed);
        assert_eq!(segs.free_list().reap(5), 1, "one process gone");
        assert!(segs.is_head(mine) && !segs.is_head(opened_dead));
        assert_eq!(segs.live(opened_dead), 64, "closed with its records");
        assert!(segs.at(never_opened).free().load(Ordering::Relaxed) != 0);
        assert_eq!(segs.at(claimed).claimed().load(Ordering::Relaxed), 0);
        segs.close(mine);
        segs.check();
        assert_eq!(segs.free_list().reap(6), 0, "nothing more");
    }

    #[test]
    fn the_reserve_is_for_compaction() {
        let segs = pool(3);
        assert!(segs.free_list().take(1).is_some());
        assert!(segs.free_list().take(1).is_none(), "one left: the reserve");
        assert!(segs.free_list().take(0).is_some());
        assert!(segs.free_list().take(0).is_none());
    }

    #[test]
    fn given_up_segments_can_be_chosen_again() {
        let segs = pool(4);
        let s = opened(&segs, 1);
        segs.appended(s, SEGMENT_HEADER + 64, 64);
        segs.close(s);
        assert_eq!(segs.free_list().choose(1, |_| Some(0.5)), vec![s]);
        segs.unclaim(s);
        assert_eq!(segs.free_list().choose(1, |_| Some(0.5)), vec![s]);
        // `rank` says no: not chosen.
        segs.unclaim(s);
        assert!(segs.free_list().choose(1, |_| None).is_empty());
    }

    #[test]
    fn only_erased_cold_segments_hand_memory_back() {
        let segs = pool(6);
        // A segment freed without its header erased keeps its sequence number.
        let s = opened(&segs, 1);
        segs.close(s);
        segs.free_list().choose(1, |_| Some(1.0));
        segs.check_emptied(s);
        segs.free_list().put(Quiescent::for_test(s), false, 0);
        assert_eq!(segs.seq(s), 1);
        segs.check();
        let released = std::cell::RefCell::new(Vec::new());
        // Free now (bottom to top): 5 4 3 2 1; the top two warm.
        segs.free_list().release_cold(2, 10, 5, |s| {
            released.borrow_mut().push(s);
            Ok(())
        });
        assert!(released.borrow().is_empty(), "not free for long enough");
        segs.free_list().release_cold(2, 10, 10, |s| {
            released.borrow_mut().push(s);
            Ok(())
        });
        assert_eq!(*released.borrow(), vec![5, 4, 3]);
        assert!(segs.is_released(5) && !segs.is_released(s));
        segs.check();
        // Taken again, a released segment says so (to be collapsed again).
        let mut free = segs.free_list();
        while let Some((t, was)) = free.take(0) {
            assert_eq!(was, [5, 4, 3].contains(&t), "segment {t}");
            assert!(!segs.is_released(t));
        }
    }

    #[test]
    fn oldest_and_garbage() {
        let segs = pool(5);
        let (a, b, c) = (opened(&segs, 3), opened(&segs, 4), opened(&segs, 5));
        assert_eq!(segs.oldest(), (3, a as usize, 4));
        assert_eq!(segs.garbage(), 0.0, "heads do not count");
        segs.appended(a, SEGMENT_HEADER + ROOM / 2, ROOM / 2);
        segs.close(a);
        assert!((segs.garbage() - 0.5).abs() < 1e-9);
        // A tombstone whose horizon no other segment is older than is not needed.
        segs.appended(b, SEGMENT_HEADER + 48, 48);
        segs.note_tombstone(b, 48, 4);
        assert_eq!(segs.needed(b, segs.oldest()), 48, "segment 3 is older");
        assert!(segs.pins_tombstones(3));
        assert!(!segs.pins_tombstones(4));
        let u = segs.utilization();
        assert_eq!((u[0], u[5]), (2, 1));
        assert_eq!(segs.live_total(), ROOM / 2 + 48);
        // Once segment 3 is gone, no other segment is older than the horizon.
        segs.unlive(a, ROOM / 2, "moved");
        segs.free_list().choose(1, |s| (s == a).then_some(1.0));
        segs.check_emptied(a);
        segs.free_list().put(Quiescent::for_test(a), true, 0);
        assert_eq!(segs.oldest(), (4, b as usize, 5));
        assert_eq!(segs.needed(b, segs.oldest()), 0);
        assert_eq!(segs.needed(c, segs.oldest()), 0);
    }

    #[test]
    #[should_panic(expected = "opened without being taken for a head")]
    fn opening_a_free_segment_is_caught() {
        let segs = pool(4);
        segs.open(3, 1, 0);
    }

    #[test]
    #[should_panic(expected = "not above its last")]
    fn sequence_numbers_only_grow() {
        let segs = pool(4);
        let s = opened(&segs, 5);
        segs.close(s);
        segs.free_list().choose(1, |_| Some(1.0));
        segs.check_emptied(s);
        segs.free_list().put(Quiescent::for_test(s), false, 0);
        opened(&segs, 5);
    }

    #[test]
    #[should_panic(expected = "closed, not a head")]
    fn closing_twice_is_caught() {
        let segs = pool(4);
        let s = opened(&segs, 1);
        segs.close(s);
        segs.close(s);
    }

    #[test]
    #[should_panic(expected = "not claimed")]
    fn giving_up_an_unclaimed_segment_is_caught() {
        let segs = pool(4);
        let s = opened(&segs, 1);
        segs.close(s);
        segs.unclaim(s);
    }

    #[test]
    #[should_panic(expected = "freed without compaction claiming it")]
    fn freeing_an_unclaimed_segment_is_caught() {
        let segs = pool(4);
        let s = opened(&segs, 1);
        segs.close(s);
        segs.free_list().put(Quiescent::for_test(s), true, 0);
    }

    #[test]
    #[should_panic(expected = "retired with 64 live bytes")]
    fn retiring_live_records_is_caught() {
        let segs = pool(4);
        let s = opened(&segs, 1);
        segs.appended(s, SEGMENT_HEADER + 64, 64);
        segs.close(s);
        segs.free_list().choose(1, |_| Some(1.0));
        segs.check_emptied(s);
    }

    #[test]
    #[should_panic(expected = "freed while a head")]
    fn freeing_a_head_is_caught() {
        let segs = pool(4);
        let s = opened(&segs, 1);
        segs.close(s);
        segs.free_list().choose(1, |_| Some(1.0));
        segs.at(s).head().store(1, Ordering::Relaxed);
        segs.free_list().put(Quiescent::for_test(s), true, 0);
    }

    #[test]
    #[should_panic(expected = "recovered free with 1 live bytes")]
    fn a_free_segment_has_no_live_bytes() {
        let segs = Segments::new(4).unwrap();
        segs.recovered(2, 1);
        segs.recovered_record(2, SEGMENT_HEADER + 1, 1, Some(1));
        segs.free_list().recovered(vec![1, 2]);
    }

    #[test]
    #[should_panic(expected = "free, yet head true")]
    fn check_finds_a_free_head() {
        let segs = pool(4);
        segs.at(2).head().store(1, Ordering::Relaxed);
        segs.check();
    }

    #[test]
    #[should_panic(expected = "released, yet free true, seq 9")]
    fn check_finds_a_released_segment_with_records() {
        let segs = pool(4);
        segs.at(2).released().store(1, Ordering::Relaxed);
        segs.at(2).seq().store(9, Ordering::Relaxed);
        segs.at(2)
            .written()
            .store(SEGMENT_HEADER, Ordering::Relaxed);
        segs.check();
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "live bytes, 64 taken")]
    fn taking_more_live_bytes_than_there_are_is_caught() {
        let segs = pool(4);
        let s = opened(&segs, 1);
        segs.appended(s, SEGMENT_HEADER + 32, 32);
        segs.unlive(s, 64, "replaced");
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "past what was written")]
    fn sweeping_past_the_records_is_caught() {
        let segs = pool(4);
        let s = opened(&segs, 1);
        segs.appended(s, SEGMENT_HEADER + 32, 32);
        segs.close(s);
        segs.free_list().choose(1, |_| Some(1.0));
        segs.sweep_to(s, SEGMENT_HEADER + 64);
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "the walk went back")]
    fn sweeping_backwards_is_caught() {
        let segs = pool(4);
        let s = opened(&segs, 1);
        segs.appended(s, SEGMENT_HEADER + 64, 64);
        segs.close(s);
        segs.free_list().choose(1, |_| Some(1.0));
        segs.sweep_to(s, SEGMENT_HEADER + 64);
        segs.sweep_to(s, SEGMENT_HEADER + 32);
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "appended to, not a head")]
    fn appending_to_a_closed_segment_is_caught() {
        let segs = pool(4);
        let s = opened(&segs, 1);
        segs.close(s);
        segs.appended(s, SEGMENT_HEADER + 32, 32);
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "ends at")]
    fn a_record_that_is_not_next_is_caught() {
        let segs = pool(4);
        let s = opened(&segs, 1);
        segs.appended(s, SEGMENT_HEADER + 64, 32);
    }
}
