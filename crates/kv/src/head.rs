//! The log heads ([`Heads`]): one per CPU for the writers, and compaction's own. A head
//! ([`Head`]) is the segment it appends to, the sequence number that segment was opened
//! under, and where the next record goes.
//!
//! The invariants, checked at every transition ([`Head::check`]):
//! * a closed head (no segment) has no sequence number and no offset;
//! * an open head's segment is a head in [`Segments`], opened under the head's sequence
//!   number, written exactly up to the head's offset, which lies between the segment's
//!   header and its end;
//! * no two heads share a segment, and every segment that [`Segments`] marks as a head
//!   is some head's ([`Heads::check`], for a quiescent store).
//!
//! Lock order: compaction's head, then a writer's; writers never take compaction's head
//! while holding theirs.

use crate::format::{SEGMENT_BYTES, SEGMENT_HEADER};
use crate::segment::Segments;
use std::sync::{Mutex, MutexGuard};

/// A log head: the segment it appends to and where.
#[derive(Debug, Default)]
pub(crate) struct Head {
    seg: u64,
    seq: u64,
    off: u64,
}

impl Head {
    /// The segment it appends to (0: closed).
    pub fn seg(&self) -> u64 {
        self.seg
    }

    /// The sequence number its segment was opened under (0: closed).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Where the next record goes (from the segment's start).
    pub fn off(&self) -> u64 {
        self.off
    }

    pub fn is_open(&self) -> bool {
        self.seg != 0
    }

    /// Whether a record of `len` bytes fits in the open segment.
    pub fn fits(&self, len: u64) -> bool {
        self.is_open() && self.off + len <= SEGMENT_BYTES
    }

    /// The bytes left in its segment (0: closed).
    pub fn room(&self) -> u64 {
        if self.is_open() {
            SEGMENT_BYTES - self.off
        } else {
            0
        }
    }

    /// The bytes of records written into its segment (0: closed).
    pub fn used(&self) -> u64 {
        self.off.saturating_sub(SEGMENT_HEADER)
    }

    /// Open the head on segment `seg`, which [`Segments::open`] opened under `seq`.
    pub fn open(&mut self, segs: &Segments, seg: u64, seq: u64) {
        assert!(
            !self.is_open(),
            "head on segment {}: opened on segment {seg} without being closed",
            self.seg
        );
        *self = Head {
            seg,
            seq,
            off: SEGMENT_HEADER,
        };
        self.check(segs);
    }

    /// A record of `len` bytes was written at [`Head::off`]: the next goes after it.
    pub fn advance(&mut self, segs: &Segments, len: u64) {
        debug_assert!(
            self.fits(len),
            "head on segment {} at {}: a record of {len} bytes does not fit",
            self.seg,
            self.off
        );
        self.off += len;
        segs.appended(self.seg, self.off, len);
        if cfg!(debug_assertions) {
            self.check(segs);
        }
    }

    /// Close the head: its segment is a closed segment from now on.
    pub fn close(&mut self, segs: &Segments) {
        self.check(segs);
        assert!(self.is_open(), "a closed head closed");
        segs.close(self.seg);
        *self = Head::default();
    }

    /// Check the head's invariants (see the module's doc). The caller holds the head
    /// (its lock): only it changes the head's segment.
    pub fn check(&self, segs: &Segments) {
        if !self.is_open() {
            assert!(
                self.seq == 0 && self.off == 0,
                "closed head with sequence {} at {}",
                self.seq,
                self.off
            );
            return;
        }
        let (seg, seq, off) = (self.seg, self.seq, self.off);
        assert!(
            seg < segs.count() && (SEGMENT_HEADER..=SEGMENT_BYTES).contains(&off),
            "head on segment {seg} at {off}"
        );
        assert!(
            segs.is_head(seg),
            "head on segment {seg}, not marked a head"
        );
        assert_eq!(
            segs.seq(seg),
            seq,
            "head on segment {seg}: its sequence number"
        );
        assert_eq!(
            segs.written(seg),
            off,
            "head on segment {seg}: what was written"
        );
    }
}

/// The writers' heads (one per CPU) and compaction's.
pub(crate) struct Heads {
    writers: Vec<Mutex<Head>>,
    /// Compaction's head, and the lock that serializes rounds (a round checks that the
    /// room it has for copies covers a segment before it starts on it).
    compactor: Mutex<Head>,
}

fn lock(m: &Mutex<Head>) -> MutexGuard<'_, Head> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Heads {
    /// `writers` writers' heads (at least one), all closed, and compaction's.
    pub fn new(writers: usize) -> Heads {
        Heads {
            writers: (0..writers.max(1))
                .map(|_| Mutex::new(Head::default()))
                .collect(),
            compactor: Mutex::new(Head::default()),
        }
    }

    /// The writers' heads.
    pub fn writers(&self) -> &[Mutex<Head>] {
        &self.writers
    }

    /// The head of CPU `cpu` (one per core: appends from different cores never contend;
    /// a thread that moved meanwhile only shares a head for a while).
    pub fn for_cpu(&self, cpu: usize) -> MutexGuard<'_, Head> {
        lock(&self.writers[cpu % self.writers.len()])
    }

    /// Compaction's head (held for a whole round).
    pub fn compactor(&self) -> MutexGuard<'_, Head> {
        lock(&self.compactor)
    }

    /// Whether no compaction round runs now.
    pub fn compactor_idle(&self) -> bool {
        self.compactor.try_lock().is_ok()
    }

    /// Check every head, that no two share a segment, and that every segment marked a
    /// head of this process is one's. Only for a quiescent store (it takes every head's lock in turn,
    /// compaction's first).
    pub fn check(&self, segs: &Segments) {
        let mut held = vec![false; segs.count() as usize];
        let comp = self.compactor();
        for h in std::iter::once(comp).chain(self.writers.iter().map(lock)) {
            h.check(segs);
            if h.is_open() {
                let s = h.seg() as usize;
                assert!(!held[s], "segment {s}: the segment of two heads");
                held[s] = true;
            }
        }
        let me = cairn_media::owner::process_word();
        for s in 1..segs.count() {
            assert_eq!(
                segs.head_owner(s) == me,
                held[s as usize],
                "segment {s}: marked a head of this process, and a head's segment"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Segments 1..n free.
    fn pool(n: u64) -> Segments {
        let segs = Segments::new(n).unwrap();
        segs.free_list().recovered((1..n).rev().collect());
        segs
    }

    /// Open `head` on a free segment under `seq` (as `Core::roll` does).
    fn roll(segs: &Segments, head: &mut Head, seq: u64) {
        let (s, _) = segs.free_list().take(0).unwrap();
        if head.is_open() {
            head.close(segs);
        }
        segs.open(s, seq, 0);
        head.open(segs, s, seq);
    }

    #[test]
    fn heads_open_advance_and_close() {
        let segs = pool(6);
        let heads = Heads::new(2);
        heads.check(&segs);
        let mut h = heads.for_cpu(3);
        assert!(!h.is_open() && !h.fits(1) && h.room() == 0 && h.used() == 0);
        roll(&segs, &mut h, 1);
        assert_eq!((h.seq(), h.off()), (1, SEGMENT_HEADER));
        assert!(h.fits(SEGMENT_BYTES - SEGMENT_HEADER));
        assert!(!h.fits(SEGMENT_BYTES - SEGMENT_HEADER + 1));
        h.advance(&segs, 100);
        assert_eq!(
            (h.used(), h.room()),
            (100, SEGMENT_BYTES - SEGMENT_HEADER - 100)
        );
        assert_eq!(segs.live(h.seg()), 100);
        let first = h.seg();
        roll(&segs, &mut h, 2);
        assert!(!segs.is_head(first), "the old segment is closed");
        drop(h);
        let mut c = heads.compactor();
        assert!(!heads.compactor_idle(), "a round runs");
        roll(&segs, &mut c, 3);
        drop(c);
        assert!(heads.compactor_idle());
        heads.check(&segs);
        heads.compactor().close(&segs);
        heads.check(&segs);
        assert_eq!(heads.writers().len(), 2);
        assert_eq!(Heads::new(0).writers().len(), 1, "at least one");
    }

    #[test]
    #[should_panic(expected = "without being closed")]
    fn opening_an_open_head_is_caught() {
        let segs = pool(4);
        let mut h = Head::default();
        roll(&segs, &mut h, 1);
        let (s, _) = segs.free_list().take(0).unwrap();
        segs.open(s, 2, 0);
        h.open(&segs, s, 2);
    }

    #[test]
    #[should_panic(expected = "its sequence number")]
    fn a_head_under_another_number_is_caught() {
        let segs = pool(4);
        let mut h = Head::default();
        let (s, _) = segs.free_list().take(0).unwrap();
        segs.open(s, 2, 0);
        h.open(&segs, s, 3);
    }

    #[test]
    #[should_panic(expected = "not marked a head")]
    fn a_head_on_a_closed_segment_is_caught() {
        let segs = pool(4);
        let mut h = Head::default();
        roll(&segs, &mut h, 1);
        segs.close(h.seg());
        h.check(&segs);
    }

    #[test]
    #[should_panic(expected = "the segment of two heads")]
    fn two_heads_on_one_segment_are_caught() {
        let segs = pool(4);
        let heads = Heads::new(2);
        roll(&segs, &mut heads.writers()[0].lock().unwrap(), 1);
        let (seg, seq) = {
            let h = heads.writers()[0].lock().unwrap();
            (h.seg(), h.seq())
        };
        *heads.writers()[1].lock().unwrap() = Head {
            seg,
            seq,
            off: SEGMENT_HEADER,
        };
        heads.check(&segs);
    }

    #[test]
    #[should_panic(expected = "marked a head of this process, and a head's segment")]
    fn a_head_segment_no_head_holds_is_caught() {
        let segs = pool(4);
        let heads = Heads::new(1);
        let (s, _) = segs.free_list().take(0).unwrap();
        segs.open(s, 1, 0);
        heads.check(&segs);
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "does not fit")]
    fn appending_past_the_segment_is_caught() {
        let segs = pool(4);
        let mut h = Head::default();
        roll(&segs, &mut h, 1);
        h.advance(&segs, SEGMENT_BYTES);
    }
}
